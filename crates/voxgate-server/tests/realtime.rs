//! The realtime door end to end: a real server on 127.0.0.1:0, a real WebSocket client
//! (tokio-tungstenite) speaking the voxgate-realtime codec, the embedded demo agent.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use futures::SinkExt;
use support::{Running, WAIT, Ws, connect, http, next_message, try_connect};
use tokio_tungstenite::tungstenite::Message;
use voxgate_realtime::proto::client_bound_message::Payload as Down;
use voxgate_realtime::proto::{InferenceTriggerMode, SessionErrorCategory, ToolDefinition};
use voxgate_realtime::{AudioFormat, ClientBoundMessage, ServiceBoundMessage, SessionConfig};
use voxgate_server::Config;

async fn send(ws: &mut Ws, m: &ServiceBoundMessage) {
    ws.send(Message::Binary(m.to_frame())).await.unwrap();
}

/// The next protocol message; `None` when the server closed.
async fn recv(ws: &mut Ws) -> Option<ClientBoundMessage> {
    loop {
        if let Message::Binary(b) = next_message(ws, WAIT).await? {
            return Some(ClientBoundMessage::decode_frame(b).unwrap());
        }
    }
}

async fn recv_payload(ws: &mut Ws) -> Down {
    recv(ws).await.expect("server still open").payload.unwrap()
}

fn text_only() -> SessionConfig {
    SessionConfig::new(AudioFormat::SPEECH_24K, AudioFormat::SPEECH_24K)
}

async fn initialized(addr: SocketAddr, path: &str) -> Ws {
    let mut ws = connect(addr, path).await;
    send(
        &mut ws,
        &ServiceBoundMessage::initialize(&text_only()).unwrap(),
    )
    .await;
    assert!(matches!(recv_payload(&mut ws).await, Down::SessionReady(_)));
    ws
}

/// Collects one response: its turn id and the text of its fragments, checking the framing.
async fn response_text(ws: &mut Ws) -> (u32, String) {
    let turn = match recv_payload(ws).await {
        Down::ResponseBegin(b) => b.turn_id,
        other => panic!("expected ResponseBegin, got {other:?}"),
    };
    let mut text = String::new();
    loop {
        match recv_payload(ws).await {
            Down::ModelTextFragment(f) => {
                assert_eq!(f.turn_id, Some(turn));
                text.push_str(&f.text);
            }
            Down::InferenceComplete(c) => assert_eq!(c.turn_id, turn),
            Down::ResponseEnd(e) => {
                assert_eq!(e.turn_id, turn);
                break;
            }
            other => panic!("unexpected {other:?} inside a response"),
        }
    }
    // Then the turn's final record, matching what was sent.
    match recv_payload(ws).await {
        Down::TurnSnapshot(s) => {
            assert!(s.is_final);
            let m = s.message.unwrap();
            assert_eq!(m.turn_id, Some(turn));
            let shown: String = m
                .content
                .iter()
                .filter_map(|c| match &c.content {
                    Some(voxgate_realtime::proto::chat_message_content::Content::TextContent(
                        t,
                    )) => Some(t.text.clone()),
                    _ => None,
                })
                .collect();
            assert_eq!(shown, text);
        }
        other => panic!("expected TurnSnapshot after ResponseEnd, got {other:?}"),
    }
    (turn, text)
}

#[tokio::test]
async fn handshake_text_turn_and_ping_on_both_paths() {
    let server = Running::start(Config::default()).await;
    for path in [
        "/realtime",
        "/api/v1/vendors/v1/organizations/o1/realtime",
        "/api/v1/vendors/v1/organizations/o1/realtime/some-model",
    ] {
        let mut ws = initialized(server.addr, path).await;
        send(&mut ws, &ServiceBoundMessage::ping()).await;
        assert!(matches!(recv_payload(&mut ws).await, Down::Pong(_)));
        send(
            &mut ws,
            &ServiceBoundMessage::user_text(1, InferenceTriggerMode::Queue, "hello there"),
        )
        .await;
        let (_, text) = response_text(&mut ws).await;
        assert_eq!(text, "You said: hello there");
        ws.close(None).await.unwrap();
    }
    server.stop().await;
}

#[tokio::test]
async fn client_tool_call_and_continuation() {
    let server = Running::start(Config::default()).await;
    let mut ws = initialized(server.addr, "/realtime").await;
    let tool = ToolDefinition::from_json(
        "get_weather",
        Some("The weather in a city".into()),
        &serde_json::json!({"type": "object", "properties": {"city": {"type": "string"}}}),
    )
    .unwrap();
    send(&mut ws, &ServiceBoundMessage::update_tools(vec![tool])).await;
    send(
        &mut ws,
        &ServiceBoundMessage::user_text(
            1,
            InferenceTriggerMode::Queue,
            r#"call get_weather {"city": "Paris"}"#,
        ),
    )
    .await;
    // The reply announces the call, then the client gets the request.
    let mut call = None;
    let mut first_turn = None;
    while call.is_none() {
        match recv_payload(&mut ws).await {
            Down::ResponseBegin(b) => first_turn = Some(b.turn_id),
            Down::ToolCallRequest(r) => call = Some(r),
            Down::ModelTextFragment(_)
            | Down::ResponseEnd(_)
            | Down::InferenceComplete(_)
            | Down::TurnSnapshot(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    let call = call.unwrap();
    assert_eq!(call.name, "get_weather");
    assert_eq!(call.turn_id, first_turn);
    let args = voxgate_realtime::json::struct_to_json(call.parameters.as_ref().unwrap()).unwrap();
    assert_eq!(args["city"], "Paris");
    send(
        &mut ws,
        &ServiceBoundMessage::tool_call_response(call.id.clone(), "sunny, 21 C"),
    )
    .await;
    // The model continues with the result.
    let mut continued = String::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while !continued.contains("sunny, 21 C") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no continuation: {continued}"
        );
        if let Down::ModelTextFragment(f) = recv_payload(&mut ws).await {
            continued.push_str(&f.text);
        }
    }
    assert!(continued.contains("get_weather"), "{continued}");
    // A response for an unknown call id is the client's error; the session goes on.
    send(
        &mut ws,
        &ServiceBoundMessage::tool_call_response("nope", "x"),
    )
    .await;
    loop {
        match recv_payload(&mut ws).await {
            Down::Error(e) => {
                assert_eq!(e.category, SessionErrorCategory::ErrorProtocol as i32);
                break;
            }
            Down::ModelTextFragment(_)
            | Down::ResponseEnd(_)
            | Down::InferenceComplete(_)
            | Down::TurnSnapshot(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    send(&mut ws, &ServiceBoundMessage::ping()).await;
    assert!(matches!(recv_payload(&mut ws).await, Down::Pong(_)));
    server.stop().await;
}

#[tokio::test]
async fn lifecycle_errors_and_malformed_frames_keep_the_session() {
    let server = Running::start(Config::default()).await;
    let mut ws = connect(server.addr, "/realtime").await;
    // Before initialization.
    send(&mut ws, &ServiceBoundMessage::ping()).await;
    match recv_payload(&mut ws).await {
        Down::Error(e) => assert_eq!(e.category, SessionErrorCategory::ErrorSession as i32),
        other => panic!("expected an error, got {other:?}"),
    }
    // Garbage bytes and a text frame: protocol errors, still serving.
    ws.send(Message::Binary(vec![0xff, 0xff, 0xff, 0x0f, 0x01].into()))
        .await
        .unwrap();
    match recv_payload(&mut ws).await {
        Down::Error(e) => assert_eq!(e.category, SessionErrorCategory::ErrorProtocol as i32),
        other => panic!("expected an error, got {other:?}"),
    }
    ws.send(Message::Text("{}".into())).await.unwrap();
    match recv_payload(&mut ws).await {
        Down::Error(e) => assert_eq!(e.category, SessionErrorCategory::ErrorProtocol as i32),
        other => panic!("expected an error, got {other:?}"),
    }
    send(
        &mut ws,
        &ServiceBoundMessage::initialize(&text_only()).unwrap(),
    )
    .await;
    assert!(matches!(recv_payload(&mut ws).await, Down::SessionReady(_)));
    // A second initialization.
    send(
        &mut ws,
        &ServiceBoundMessage::initialize(&text_only()).unwrap(),
    )
    .await;
    match recv_payload(&mut ws).await {
        Down::Error(e) => assert_eq!(e.category, SessionErrorCategory::ErrorSession as i32),
        other => panic!("expected an error, got {other:?}"),
    }
    // An empty conversation query.
    // (The client-side helper refuses to build one; a broken client could still send it.)
    let empty = ServiceBoundMessage {
        payload: Some(
            voxgate_realtime::proto::service_bound_message::Payload::ConversationQuery(
                voxgate_realtime::proto::ConversationQuery::default(),
            ),
        ),
    };
    send(&mut ws, &empty).await;
    match recv_payload(&mut ws).await {
        Down::Error(e) => assert_eq!(e.category, SessionErrorCategory::ErrorProtocol as i32),
        other => panic!("expected an error, got {other:?}"),
    }
    send(&mut ws, &ServiceBoundMessage::ping()).await;
    assert!(matches!(recv_payload(&mut ws).await, Down::Pong(_)));
    server.stop().await;
}

#[tokio::test]
async fn bad_initialization_is_fatal_with_a_configuration_error() {
    let server = Running::start(Config::default()).await;
    let mut ws = connect(server.addr, "/realtime").await;
    let mut init = text_only().to_wire().unwrap();
    init.input_audio_line.as_mut().unwrap().sample_rate = 7;
    send(&mut ws, &init.into()).await;
    match recv_payload(&mut ws).await {
        Down::Error(e) => {
            assert_eq!(e.category, SessionErrorCategory::ErrorConfiguration as i32);
            assert!(e.message.contains("sample_rate"), "{}", e.message);
        }
        other => panic!("expected an error, got {other:?}"),
    }
    assert!(
        recv(&mut ws).await.is_none(),
        "the server closes after a fatal error"
    );
    server.stop().await;
}

#[tokio::test]
async fn history_export_and_conversation_query() {
    let server = Running::start(Config::default()).await;
    let mut ws = initialized(server.addr, "/realtime").await;
    send(
        &mut ws,
        &ServiceBoundMessage::user_text(1, InferenceTriggerMode::Queue, "first words"),
    )
    .await;
    let (turn, _) = response_text(&mut ws).await;
    send(
        &mut ws,
        &ServiceBoundMessage::export_chat_history(true, true),
    )
    .await;
    let history = match recv_payload(&mut ws).await {
        Down::ChatHistory(h) => h,
        other => panic!("expected ChatHistory, got {other:?}"),
    };
    let texts: Vec<(i32, String)> = history
        .messages
        .iter()
        .map(|m| {
            let text = m
                .content
                .iter()
                .filter_map(|c| match &c.content {
                    Some(voxgate_realtime::proto::chat_message_content::Content::TextContent(
                        t,
                    )) => Some(t.text.clone()),
                    _ => None,
                })
                .collect::<String>();
            (m.role, text)
        })
        .collect();
    use voxgate_realtime::proto::ChatMessageRole as R;
    assert_eq!(
        texts,
        [
            (R::User as i32, "first words".to_owned()),
            (R::Assistant as i32, "You said: first words".to_owned()),
        ]
    );
    assert_eq!(history.messages[1].turn_id, Some(turn));
    assert!(history.messages.iter().all(|m| m.created_at.is_some()));
    send(
        &mut ws,
        &ServiceBoundMessage::conversation_query(Some("What happened?".into()), None).unwrap(),
    )
    .await;
    match recv_payload(&mut ws).await {
        Down::ConversationQueryResult(r) => {
            assert!(r.text.contains("first words"), "{}", r.text);
        }
        other => panic!("expected ConversationQueryResult, got {other:?}"),
    }
    server.stop().await;
}

#[tokio::test]
async fn history_in_memory_is_bounded_and_an_export_says_how_much_was_dropped() {
    let mut config = Config::default();
    config.limits.max_history_messages = 3;
    let server = Running::start(config).await;
    let mut ws = initialized(server.addr, "/realtime").await;
    for (i, words) in ["one", "two", "three"].into_iter().enumerate() {
        send(
            &mut ws,
            &ServiceBoundMessage::user_text(i as u64, InferenceTriggerMode::Queue, words),
        )
        .await;
        response_text(&mut ws).await;
    }
    send(
        &mut ws,
        &ServiceBoundMessage::export_chat_history(true, true),
    )
    .await;
    let history = match recv_payload(&mut ws).await {
        Down::ChatHistory(h) => h,
        other => panic!("expected ChatHistory, got {other:?}"),
    };
    use voxgate_realtime::proto::ChatMessageRole as R;
    use voxgate_realtime::proto::chat_message_content::Content as C;
    let text = |m: &voxgate_realtime::proto::ChatMessage| -> String {
        m.content
            .iter()
            .filter_map(|c| match &c.content {
                Some(C::TextContent(t)) => Some(t.text.clone()),
                _ => None,
            })
            .collect()
    };
    // Six messages were said, three are kept: a note says the other three are gone.
    assert_eq!(history.messages.len(), 4, "{history:?}");
    let note = &history.messages[0];
    assert_eq!(note.role, R::System as i32);
    assert!(note.ephemeral);
    assert!(
        text(note).starts_with("3 earlier messages"),
        "{}",
        text(note)
    );
    assert_eq!(text(&history.messages[3]), "You said: three");
    server.stop().await;
}

#[tokio::test]
async fn a_small_context_budget_truncates_old_turns_and_reports_them() {
    let mut config = Config::default();
    // Each exchange is 20 + 30 characters ("You said: " + the 20): three fit with a new
    // 20-character question, four do not.
    config.realtime.max_context_chars = 120;
    let server = Running::start(config).await;
    let mut ws = initialized(server.addr, "/realtime").await;
    let mut truncations = Vec::new();
    let mut responses = Vec::new();
    for i in 1..=5u64 {
        let question = format!("{:-<20}", format!("question {i}"));
        send(
            &mut ws,
            &ServiceBoundMessage::user_text(i, InferenceTriggerMode::Queue, &question),
        )
        .await;
        if i >= 4 {
            match recv_payload(&mut ws).await {
                Down::ContextTruncated(t) => truncations.push(t),
                other => panic!("expected ContextTruncated before reply {i}, got {other:?}"),
            }
        }
        let (turn, text) = response_text(&mut ws).await;
        assert_eq!(text, format!("You said: {question}"));
        responses.push(turn);
    }
    send(
        &mut ws,
        &ServiceBoundMessage::export_chat_history(true, true),
    )
    .await;
    let history = match recv_payload(&mut ws).await {
        Down::ChatHistory(h) => h,
        other => panic!("expected ChatHistory, got {other:?}"),
    };
    // Every message is still exported; the dropped ones name the response that dropped them.
    assert_eq!(history.messages.len(), 10);
    let turns: Vec<u32> = history
        .messages
        .iter()
        .map(|m| m.turn_id.unwrap())
        .collect();
    assert_eq!(
        truncations[0].truncated_turn_ids,
        [turns[0], turns[1]],
        "the first exchange, when the fourth question came"
    );
    assert_eq!(truncations[0].response_turn_id, responses[3]);
    assert_eq!(
        truncations[1].truncated_turn_ids,
        [turns[2], turns[3]],
        "only the newly dropped second exchange"
    );
    assert_eq!(truncations[1].response_turn_id, responses[4]);
    let marks: Vec<Option<u32>> = history
        .messages
        .iter()
        .map(|m| m.truncated_at_response_turn_id)
        .collect();
    let (r4, r5) = (Some(responses[3]), Some(responses[4]));
    assert_eq!(marks, [r4, r4, r5, r5, None, None, None, None, None, None]);
    server.stop().await;
}

#[tokio::test]
async fn greeting_trigger_and_no_trigger_mode() {
    let server = Running::start(Config::default()).await;
    let mut ws = initialized(server.addr, "/realtime").await;
    send(
        &mut ws,
        &ServiceBoundMessage::user_text(1, InferenceTriggerMode::NoTrigger, "just noting"),
    )
    .await;
    send(&mut ws, &ServiceBoundMessage::ping()).await;
    // NO_TRIGGER starts no reply: the pong comes first. (The engine strips the demo
    // agent's leading emoji from text replies.)
    assert!(matches!(recv_payload(&mut ws).await, Down::Pong(_)));
    send(
        &mut ws,
        &ServiceBoundMessage::trigger_inference(None, false),
    )
    .await;
    let (_, text) = response_text(&mut ws).await;
    assert_eq!(text, "You said: just noting");
    server.stop().await;
}

#[tokio::test]
async fn spoken_replies_arrive_as_audio_in_the_output_format() {
    let server = Running::start(Config::default()).await;
    let mut ws = connect(server.addr, "/realtime").await;
    let mut config = SessionConfig::new(AudioFormat::SPEECH_16K, AudioFormat::SPEECH_16K);
    // Hosted TTS: the server's own synthesizer (ElevenLabs is tested in realtime_audio.rs).
    config.tts = Some(voxgate_realtime::TtsSettings::Hosted(
        voxgate_realtime::HostedTtsSettings {
            voice: voxgate_realtime::HostedVoice::Ref {
                voice_id: "default".into(),
            },
            mode: voxgate_realtime::proto::HostedTtsMode::LowLatency,
        },
    ));
    send(&mut ws, &ServiceBoundMessage::initialize(&config).unwrap()).await;
    assert!(matches!(recv_payload(&mut ws).await, Down::SessionReady(_)));
    send(
        &mut ws,
        &ServiceBoundMessage::user_text(1, InferenceTriggerMode::Queue, "speak"),
    )
    .await;
    let turn = match recv_payload(&mut ws).await {
        Down::ResponseBegin(b) => b.turn_id,
        other => panic!("expected ResponseBegin, got {other:?}"),
    };
    let mut bytes = 0;
    loop {
        match recv_payload(&mut ws).await {
            Down::ModelAudioChunk(c) => {
                assert_eq!(c.turn_id, Some(turn));
                bytes += c.audio.unwrap().data.len();
            }
            Down::ResponseEnd(e) => {
                assert_eq!(e.turn_id, turn);
                break;
            }
            Down::ModelSpeechProgress(p) => assert_eq!(p.turn_id, turn),
            Down::InferenceComplete(c) => assert_eq!(c.turn_id, turn),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(bytes > 0 && bytes % 2 == 0, "{bytes} bytes of s16 audio");
    server.stop().await;
}

#[tokio::test]
async fn bearer_keys_guard_the_door() {
    let mut config = Config::default();
    config.realtime.api_keys = vec!["s3cret".into()];
    let server = Running::start(config).await;
    let url = format!("ws://{}/realtime", server.addr);
    assert!(try_connect(&url, &[], WAIT).await.is_err());
    let mut ws = try_connect(&url, &[("Authorization", "Bearer s3cret")], WAIT)
        .await
        .unwrap();
    send(
        &mut ws,
        &ServiceBoundMessage::initialize(&text_only()).unwrap(),
    )
    .await;
    assert!(matches!(recv_payload(&mut ws).await, Down::SessionReady(_)));
    server.stop().await;
}

#[tokio::test]
async fn health_and_metrics() {
    let server = Running::start(Config::default()).await;
    let mut ws = initialized(server.addr, "/realtime").await;
    send(
        &mut ws,
        &ServiceBoundMessage::user_text(1, InferenceTriggerMode::Queue, "count me"),
    )
    .await;
    response_text(&mut ws).await;
    let health = http(server.addr, "GET", "/health", &[], b"").await;
    assert_eq!(health.status, 200, "{health:?}");
    let json = health.json();
    assert_eq!(json["status"], "ok");
    assert_eq!(json["sessions"]["realtime"], 1);
    // ResponseFinished (the turn count) may follow ResponseEnd by a moment.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let response = http(server.addr, "GET", "/metrics", &[], b"").await;
        assert_eq!(response.status, 200, "{response:?}");
        let metrics = response.body;
        assert!(metrics.contains("voxgate_sessions_total{door=\"realtime\"} 1"));
        assert!(metrics.contains(
            "voxgate_provider_latency_seconds_count{door=\"realtime\",provider=\"llm\"} 1"
        ));
        if metrics.contains("voxgate_turns_total{door=\"realtime\"} 1") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{metrics}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.stop().await;
}

#[tokio::test]
async fn a_failing_model_still_ends_the_response() {
    let server = Running::start_with(Config::default(), support::refusing_llm()).await;
    let mut ws = initialized(server.addr, "/realtime").await;
    send(
        &mut ws,
        &ServiceBoundMessage::user_text(1, InferenceTriggerMode::Queue, "hello"),
    )
    .await;
    let mut seen = Vec::new();
    loop {
        let p = recv_payload(&mut ws).await;
        let end = matches!(p, Down::ResponseEnd(_));
        seen.push(p);
        if end {
            break;
        }
    }
    let error = seen
        .iter()
        .find_map(|p| match p {
            Down::Error(e) => Some(e.clone()),
            _ => None,
        })
        .expect("the failure is reported before the response ends");
    assert_eq!(error.category, SessionErrorCategory::ErrorInference as i32);
    assert!(error.message.contains("error id"), "{}", error.message);
    // The session goes on.
    send(&mut ws, &ServiceBoundMessage::ping()).await;
    loop {
        if matches!(recv_payload(&mut ws).await, Down::Pong(_)) {
            break;
        }
    }
    server.stop().await;
}
