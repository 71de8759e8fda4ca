//! The Gemini bridge door end to end: a real server on loopback, a tokio-tungstenite client
//! playing the app, the embedded demo agent and TTS, a local fake of OpenAI's
//! `/audio/transcriptions` for spoken turns, and a local fake of the Gemini Live API for
//! pass-through mode.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
// The handshake callback's error type is tungstenite's, not ours to shrink.
#![allow(clippy::result_large_err)]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use support::{Running, Ws, next_message, send_json, try_connect};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use voxgate_server::Config;
use voxgate_server::config::{AsrConfig, GeminiMode};

/// Longer than the shared default: spoken turns go through the fake recognizer.
const WAIT: Duration = Duration::from_secs(15);
const SPEECH_WAV: &[u8] = include_bytes!("../../voxgate-audio/tests/fixtures/speech.wav");

async fn connect(url: String) -> Ws {
    try_connect(&url, &[], WAIT).await.unwrap()
}

async fn send(ws: &mut Ws, v: Value) {
    send_json(ws, &v).await;
}

async fn send_raw(ws: &mut Ws, m: Message) {
    ws.send(m).await.unwrap();
}

/// The next bridge message; panics on close or timeout.
async fn recv(ws: &mut Ws) -> Value {
    match next_message(ws, WAIT).await.expect("the socket stays open") {
        Message::Text(t) => serde_json::from_str(t.as_str()).unwrap(),
        other => panic!("unexpected frame {other:?}"),
    }
}

fn kind(v: &Value) -> &str {
    v["type"].as_str().unwrap_or_default()
}

/// Messages up to and including the first of type `last`.
async fn recv_until(ws: &mut Ws, last: &str) -> Vec<Value> {
    let mut out = Vec::new();
    loop {
        let m = recv(ws).await;
        let done = kind(&m) == last;
        out.push(m);
        if done {
            return out;
        }
    }
}

/// Nothing arrives for `d`.
async fn quiet_for(ws: &mut Ws, d: Duration) {
    if let Ok(Some(Ok(m))) = tokio::time::timeout(d, ws.next()).await {
        panic!("unexpected message {m:?}");
    }
}

/// An Android-style config: explicit nulls everywhere, modalities as given.
fn live_config(modalities: &Value) -> Value {
    json!({
        "model": "models/gemini-2.0-flash-live-001",
        "systemInstruction": {"role": null, "parts": [{"text": "You are helpful.", "inlineData": null}]},
        "generationConfig": {
            "temperature": null, "topK": null, "topP": null, "maxOutputTokens": null,
            "stopSequences": null, "responseModalities": modalities,
            "speechConfig": {"voiceConfig": {"prebuiltVoiceConfig": {"voiceName": "Aoede"}}}
        },
        "tools": null,
        "safetySettings": null,
        "realtimeInputConfig": null
    })
}

/// Connects and sets up a session: GEMINI_CONNECTED, then SETUP_COMPLETE.
async fn session(url: String, config: Value) -> Ws {
    let mut ws = connect(url).await;
    send(
        &mut ws,
        json!({"type": "CONNECT_GEMINI", "payload": {"initialConfig": config}}),
    )
    .await;
    let first = recv(&mut ws).await;
    assert_eq!(kind(&first), "GEMINI_CONNECTED", "{first}");
    let second = recv(&mut ws).await;
    assert_eq!(
        second,
        json!({"type": "SETUP_COMPLETE", "payload": {"setupComplete": {"success": true}}})
    );
    ws
}

fn model_text(messages: &[Value]) -> String {
    messages
        .iter()
        .filter(|m| kind(m) == "CONTENT_MESSAGE")
        .flat_map(|m| {
            m["payload"]["serverContent"]["modelTurn"]["parts"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|p| p["text"].as_str().map(str::to_owned))
        .collect()
}

fn audio_parts(messages: &[Value]) -> Vec<Value> {
    messages
        .iter()
        .filter(|m| kind(m) == "CONTENT_MESSAGE")
        .flat_map(|m| {
            m["payload"]["serverContent"]["modelTurn"]["parts"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter(|p| p.get("inlineData").is_some())
        .collect()
}

/// The flags of the last CONTENT_MESSAGE before a closing `TURN_COMPLETE`/`INTERRUPTED`.
fn assert_closed_by(messages: &[Value], flag: &str, closing: &str) {
    let n = messages.len();
    assert!(n >= 2, "{messages:?}");
    assert_eq!(kind(&messages[n - 1]), closing);
    assert_eq!(
        messages[n - 2],
        json!({"type": "CONTENT_MESSAGE", "payload": {"serverContent": {flag: true}}}),
        "{messages:#?}"
    );
}

fn b64_bytes(bytes: &[u8]) -> String {
    // Even-length byte strings encode exactly like their s16le samples.
    assert!(bytes.len().is_multiple_of(2));
    let samples: Vec<i16> = bytes
        .chunks_exact(2)
        .map(|c| i16::from_le_bytes([c[0], c[1]]))
        .collect();
    let mut out = String::new();
    voxgate_gemini::audio::encode_pcm_base64(&samples, &mut out);
    out
}

/// A fake OpenAI transcription endpoint answering every upload with `text`.
async fn fake_asr(text: &'static str) -> (String, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let h = Arc::clone(&hits);
    let router = axum::Router::new().route(
        "/v1/audio/transcriptions",
        axum::routing::post(move |body: axum::body::Bytes| {
            let h = Arc::clone(&h);
            async move {
                // A multipart upload with the model name and a WAV file.
                let has = |needle: &[u8]| body.windows(needle.len()).any(|w| w == needle);
                assert!(
                    has(b"whisper-1") && has(b"RIFF"),
                    "not a transcription upload"
                );
                h.fetch_add(1, Ordering::SeqCst);
                (
                    [("content-type", "application/json")],
                    json!({ "text": text }).to_string(),
                )
            }
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    });
    (format!("http://{addr}/v1"), hits)
}

fn with_asr(base_url: String) -> Config {
    Config {
        asr: Some(AsrConfig {
            base_url: Some(base_url),
            model: Some("whisper-1".into()),
            ..AsrConfig::default()
        }),
        ..Config::default()
    }
}

fn redact_audio(mut v: Value) -> Value {
    if let Some(parts) = v["payload"]["serverContent"]["modelTurn"]["parts"].as_array_mut() {
        for p in parts {
            if p.get("inlineData").is_some() {
                p["inlineData"]["data"] = json!("[base64 s16le]");
            }
        }
    }
    v
}

#[tokio::test]
async fn own_listener_any_path_and_main_route_connect_then_setup() {
    let server = Running::start(Config::default()).await;
    let own = server
        .listener("gemini")
        .expect("own listener on by default");
    assert_ne!(own, server.addr);
    for url in [
        format!("ws://{own}/"),
        format!("ws://{own}/any/path?x=1"),
        format!("ws://{}/gemini", server.addr),
    ] {
        let mut ws = session(url, live_config(&json!("TEXT"))).await;
        send(&mut ws, json!({"type": "DISCONNECT_GEMINI"})).await;
        assert_eq!(kind(&recv(&mut ws).await), "GEMINI_DISCONNECTED");
    }
    // Only the own listener accepts any path.
    let other = tokio_tungstenite::connect_async(format!("ws://{}/elsewhere", server.addr)).await;
    assert!(other.is_err());
    server.stop_within(WAIT).await;
}

#[tokio::test]
async fn disabled_door_and_no_own_listener() {
    let mut config = Config::default();
    config.gemini.own_listener = false;
    let server = Running::start(config).await;
    assert!(server.listener("gemini").is_none());
    drop(session(format!("ws://{}/gemini", server.addr), json!(null)).await);
    server.stop_within(WAIT).await;

    let mut config = Config::default();
    config.gemini.enabled = false;
    let server = Running::start(config).await;
    assert!(server.listener("gemini").is_none());
    assert!(
        tokio_tungstenite::connect_async(format!("ws://{}/gemini", server.addr))
            .await
            .is_err()
    );
    server.stop_within(WAIT).await;
}

#[tokio::test]
async fn text_turn_in_engine_mode() {
    let server = Running::start(Config::default()).await;
    let mut ws = session(
        format!("ws://{}/gemini", server.addr),
        live_config(&json!(["text"])),
    )
    .await;
    // turnComplete null: defaults to true.
    send(
        &mut ws,
        json!({"type": "SEND_MESSAGE", "payload": {
            "parts": [{"text": "hello there", "inlineData": null}], "turnComplete": null}}),
    )
    .await;
    let turn = recv_until(&mut ws, "TURN_COMPLETE").await;
    assert_eq!(model_text(&turn), "You said: hello there");
    assert_closed_by(&turn, "turnComplete", "TURN_COMPLETE");
    assert!(audio_parts(&turn).is_empty());
    assert!(
        turn.iter()
            .all(|m| kind(m) == "CONTENT_MESSAGE" || kind(m) == "TURN_COMPLETE")
    );
    insta::assert_json_snapshot!("content_message_text", turn[0]);
    insta::assert_json_snapshot!("content_message_turn_complete", turn[turn.len() - 2]);

    // Realtime text input is a user turn too.
    send(
        &mut ws,
        json!({"type": "SEND_REALTIME_INPUT", "payload": {"text": "again", "audio": null, "video": null}}),
    )
    .await;
    let turn = recv_until(&mut ws, "TURN_COMPLETE").await;
    assert_eq!(model_text(&turn), "You said: again");
    server.stop_within(WAIT).await;
}

#[tokio::test]
async fn audio_turn_with_a_wav_in_one_frame() {
    let (asr_url, hits) = fake_asr("what is the weather").await;
    let mut config = with_asr(asr_url);
    config.gemini.audio_chunks = true;
    let server = Running::start(config).await;
    let own = server.listener("gemini").unwrap();
    let mut ws = session(format!("ws://{own}/"), live_config(&json!("audio"))).await;
    send(
        &mut ws,
        json!({"type": "SEND_REALTIME_INPUT", "payload": {
            "text": null, "video": null, "mediaChunks": null, "chunks": null,
            "audio": {"mimeType": "audio/pcm;rate=16000", "data": b64_bytes(SPEECH_WAV)}}}),
    )
    .await;
    let turn = recv_until(&mut ws, "TURN_COMPLETE").await;
    // The VAD may cut the fixture's words into several utterances, each transcribed; they
    // make one user turn.
    let uploads = hits.load(Ordering::SeqCst);
    assert!(uploads >= 1);
    let heard = turn
        .iter()
        .find_map(|m| m["payload"]["serverContent"]["inputTranscription"]["text"].as_str())
        .expect("an input transcription");
    assert_eq!(heard, vec!["what is the weather"; uploads].join(" "));
    let said: String = turn
        .iter()
        .filter_map(|m| m["payload"]["serverContent"]["outputTranscription"]["text"].as_str())
        .collect();
    assert_eq!(said, format!("You said: {heard}"));
    let audio = audio_parts(&turn);
    assert!(!audio.is_empty());
    let mut samples = 0;
    for p in &audio {
        assert_eq!(p["inlineData"]["mimeType"], "audio/pcm;rate=24000");
        samples += p["inlineData"]["data"].as_str().unwrap().len() * 3 / 8;
    }
    // Some speech, at 24 kHz: at least half a second.
    assert!(samples > 12_000, "{samples} samples");
    // Each audio CONTENT_MESSAGE is followed by its AUDIO_CHUNK copy.
    for (i, m) in turn.iter().enumerate() {
        if let Some(data) =
            m["payload"]["serverContent"]["modelTurn"]["parts"][0]["inlineData"]["data"].as_str()
        {
            assert_eq!(
                turn[i + 1],
                json!({"type": "AUDIO_CHUNK", "payload": {"data": data}})
            );
        }
    }
    // The speaking overlay brackets the audio; the turn closes with TURN_COMPLETE.
    let speaking: Vec<&Value> = turn
        .iter()
        .filter(|m| kind(m) == "ASSISTANT_SPEAKING")
        .collect();
    assert_eq!(speaking.len(), 2, "{turn:#?}");
    assert_eq!(speaking[0]["payload"]["speaking"], true);
    assert_eq!(speaking[1]["payload"]["speaking"], false);
    assert_closed_by(&turn, "turnComplete", "TURN_COMPLETE");
    let first_audio = turn
        .iter()
        .find(|m| !audio_parts(std::slice::from_ref(m)).is_empty())
        .unwrap();
    insta::assert_json_snapshot!("content_message_audio", redact_audio(first_audio.clone()));
    // The text (one transcript per VAD segment) is checked above; the snapshot is the shape.
    let mut transcription = turn
        .iter()
        .find(|m| {
            m["payload"]["serverContent"]
                .get("inputTranscription")
                .is_some()
        })
        .unwrap()
        .clone();
    transcription["payload"]["serverContent"]["inputTranscription"]["text"] =
        json!("[the transcripts, joined]");
    insta::assert_json_snapshot!("content_message_input_transcription", transcription);
    insta::assert_json_snapshot!("assistant_speaking", speaking[0]);
    server.stop_within(WAIT).await;
}

#[tokio::test]
async fn user_speech_interrupts_a_spoken_reply() {
    let (asr_url, hits) = fake_asr("stop").await;
    let server = Running::start(with_asr(asr_url)).await;
    let mut ws = session(
        format!("ws://{}/gemini", server.addr),
        live_config(&json!(["AUDIO"])),
    )
    .await;
    send(
        &mut ws,
        json!({"type": "SEND_MESSAGE", "payload": {"parts": [{"text":
            "please tell me a rather long story about the sea and the wind and the stars"}],
            "turnComplete": true}}),
    )
    .await;
    // Wait for the reply's first audio.
    loop {
        let m = recv(&mut ws).await;
        assert_ne!(kind(&m), "TURN_COMPLETE");
        if !audio_parts(std::slice::from_ref(&m)).is_empty() {
            break;
        }
    }
    // Stream the speech fixture as raw 16 kHz PCM, 100 ms a frame, five times real time.
    let (mut ws_tx, mut ws_rx) = ws.split();
    let pcm = SPEECH_WAV[44..].to_vec();
    let streamer = tokio::spawn(async move {
        for chunk in pcm.chunks(3200) {
            let frame = json!({"type": "SEND_REALTIME_INPUT", "payload": {"audio": {
                "mimeType": "audio/pcm;rate=16000", "data": b64_bytes(chunk)}}});
            ws_tx
                .send(Message::Text(frame.to_string().into()))
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        ws_tx
    });
    let mut seen = Vec::new();
    loop {
        let m = tokio::time::timeout(WAIT, ws_rx.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let Message::Text(t) = m else { continue };
        let v: Value = serde_json::from_str(t.as_str()).unwrap();
        assert_ne!(
            kind(&v),
            "TURN_COMPLETE",
            "the reply finished uninterrupted"
        );
        let done = kind(&v) == "INTERRUPTED";
        seen.push(v);
        if done {
            break;
        }
    }
    assert_closed_by(&seen, "interrupted", "INTERRUPTED");
    insta::assert_json_snapshot!("interrupted", seen[seen.len() - 1]);
    // The user's words become the next turn.
    let ws_tx = streamer.await.unwrap();
    let mut ws = ws_tx.reunite(ws_rx).unwrap();
    let next = recv_until(&mut ws, "TURN_COMPLETE").await;
    assert!(
        next.iter().any(
            |m| m["payload"]["serverContent"]["inputTranscription"]["text"]
                .as_str()
                .is_some_and(|t| t.starts_with("stop"))
        ),
        "{next:#?}"
    );
    assert!(hits.load(Ordering::SeqCst) >= 1);
    server.stop_within(WAIT).await;
}

fn weather_tools() -> Value {
    let mut c = live_config(&json!("TEXT"));
    c["tools"] = json!([{"functionDeclarations": [{
        "name": "get_weather", "description": "Weather in a city.",
        "parameters": {"type": "OBJECT", "properties": {"city": {"type": "STRING"}},
            "required": ["city"]},
        "behavior": "NON_BLOCKING"}], "googleSearch": null}]);
    c
}

#[tokio::test]
async fn tool_calls_and_cancellation_on_interruption() {
    let server = Running::start(Config::default()).await;
    let mut ws = session(format!("ws://{}/gemini", server.addr), weather_tools()).await;
    send(
        &mut ws,
        json!({"type": "SEND_MESSAGE", "payload": {"parts": [{"text":
            "call get_weather {\"city\": \"Paris\"}"}]}}),
    )
    .await;
    let calls = recv_until(&mut ws, "TOOL_CALL").await;
    let call = calls.last().unwrap().clone();
    let fc = &call["payload"]["toolCall"]["functionCalls"][0];
    assert_eq!(fc["name"], "get_weather");
    assert_eq!(fc["args"], json!({"city": "Paris"}));
    let id = fc["id"].as_str().unwrap().to_owned();
    let mut shown = call.clone();
    shown["payload"]["toolCall"]["functionCalls"][0]["id"] = json!("[id]");
    insta::assert_json_snapshot!("tool_call", shown);
    // No TURN_COMPLETE while the call is pending.
    quiet_for(&mut ws, Duration::from_millis(300)).await;
    send(
        &mut ws,
        json!({"type": "SEND_TOOL_RESPONSE", "payload": {"toolResponse": {"functionResponses": [
            {"id": id, "name": "get_weather", "response": {"forecast": "sunny"}}]}}}),
    )
    .await;
    let turn = recv_until(&mut ws, "TURN_COMPLETE").await;
    assert!(
        model_text(&turn).contains("get_weather returned"),
        "{turn:#?}"
    );
    assert_closed_by(&turn, "turnComplete", "TURN_COMPLETE");

    // A second call, interrupted by new user content: cancelled.
    send(
        &mut ws,
        json!({"type": "SEND_MESSAGE", "payload": {"parts": [{"text":
            "call get_weather {\"city\": \"Oslo\"}"}], "turnComplete": true}}),
    )
    .await;
    let calls = recv_until(&mut ws, "TOOL_CALL").await;
    let id2 = calls.last().unwrap()["payload"]["toolCall"]["functionCalls"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(id, id2);
    send(
        &mut ws,
        json!({"type": "SEND_MESSAGE", "payload": {"parts": [{"text": "never mind"}]}}),
    )
    .await;
    let cut = recv_until(&mut ws, "TOOL_CALL_CANCELLATION").await;
    assert_eq!(
        cut,
        vec![
            json!({"type": "CONTENT_MESSAGE", "payload": {"serverContent": {"interrupted": true}}}),
            json!({"type": "INTERRUPTED"}),
            json!({"type": "TOOL_CALL_CANCELLATION", "payload": {"toolCallCancellation": {"ids": [id2]}}}),
        ]
    );
    let turn = recv_until(&mut ws, "TURN_COMPLETE").await;
    assert_eq!(model_text(&turn), "You said: never mind");
    // A late answer to the cancelled call is ignored quietly.
    send(
        &mut ws,
        json!({"type": "SEND_TOOL_RESPONSE", "payload": {"toolResponse": {"functionResponses": [
            {"id": id2, "name": "get_weather", "response": {"forecast": "rain"}}]}}}),
    )
    .await;
    quiet_for(&mut ws, Duration::from_millis(300)).await;
    // An answer to a call that never was is an error.
    send(
        &mut ws,
        json!({"type": "SEND_TOOL_RESPONSE", "payload": {"toolResponse": {"functionResponses": [
            {"id": "nope", "name": "get_weather", "response": {}}]}}}),
    )
    .await;
    let e = recv(&mut ws).await;
    assert_eq!(kind(&e), "GEMINI_ERROR");
    server.stop_within(WAIT).await;
}

/// The original Android app's nine tool declarations as its Kotlin serializer writes them:
/// every Gemini `Schema` field present, unused ones `null`.
const ANDROID_TOOLS: &str = include_str!("fixtures/gemini_android_tools.json");

#[tokio::test]
async fn android_tool_declarations_with_explicit_nulls_are_accepted_and_callable() {
    let tools: Value = serde_json::from_str(ANDROID_TOOLS).unwrap();
    let declared = tools[0]["functionDeclarations"].as_array().unwrap().len();
    assert_eq!(declared, 9);
    let mut config = live_config(&json!("TEXT"));
    config["tools"] = tools;
    let server = Running::start(Config::default()).await;
    // `session` asserts SETUP_COMPLETE right after GEMINI_CONNECTED: no GEMINI_ERROR.
    let mut ws = session(format!("ws://{}/gemini", server.addr), config).await;
    let calls = [
        ("get_current_time_tool", json!({})),
        ("take_photo_tool", json!({})),
        ("get_location_tool", json!({})),
        ("hide_canvas_tool", json!({})),
        (
            "create_canvas_tool",
            json!({"title": "Shopping", "content": "- milk",
                "elements": [{"kind": "button", "text": "Done"}]}),
        ),
        (
            "append_to_canvas_tool",
            json!({"content": "- eggs", "elements": [{"kind": "divider"}]}),
        ),
        ("find_contact_tool", json!({"name": "Ada", "maxResults": 3})),
        (
            "generate_image_tool",
            json!({"description": "a lighthouse at dusk", "style": "sketch", "aspectRatio": "16:9"}),
        ),
        (
            "send_message_tool",
            json!({"recipient": "Ada", "message": "On my way", "channel": "sms"}),
        ),
    ];
    for (name, args) in calls {
        send(
            &mut ws,
            json!({"type": "SEND_MESSAGE", "payload": {"parts": [{"text": format!("call {name} {args}")}],
                "turnComplete": true}}),
        )
        .await;
        let got = recv_until(&mut ws, "TOOL_CALL").await;
        assert!(
            got.iter().all(|m| kind(m) != "GEMINI_ERROR"),
            "{name}: {got:#?}"
        );
        let fc = &got.last().unwrap()["payload"]["toolCall"]["functionCalls"][0];
        assert_eq!(fc["name"], name);
        assert_eq!(fc["args"], args, "{name}");
        send(
            &mut ws,
            json!({"type": "SEND_TOOL_RESPONSE", "payload": {"toolResponse": {"functionResponses": [
                {"id": fc["id"], "name": name, "response": {"ok": true}}]}}}),
        )
        .await;
        let turn = recv_until(&mut ws, "TURN_COMPLETE").await;
        assert!(
            model_text(&turn).contains(&format!("{name} returned")),
            "{name}: {turn:#?}"
        );
    }
    server.stop_within(WAIT).await;
}

/// `config` with one declaration no JSON Schema compiler takes (an unknown type) next to a
/// good one.
fn with_a_bad_tool(mut config: Value) -> Value {
    config["tools"] = json!([{"functionDeclarations": [
        {"name": "broken_tool", "description": "Unusable.",
            "parameters": {"type": "OBJECT", "properties": {"x": {"type": "COLOUR"}}}},
        {"name": "get_weather", "description": "Weather in a city.",
            "parameters": {"type": "OBJECT", "properties": {"city": {"type": "STRING"}}}}
    ]}]);
    config
}

#[tokio::test]
async fn tool_rejections_come_before_setup_complete_on_connect_and_on_update_config() {
    let server = Running::start(Config::default()).await;
    let mut ws = connect(format!("ws://{}/gemini", server.addr)).await;
    let setup_ok =
        json!({"type": "SETUP_COMPLETE", "payload": {"setupComplete": {"success": true}}});
    send(
        &mut ws,
        json!({"type": "CONNECT_GEMINI", "payload": {"initialConfig": with_a_bad_tool(live_config(&json!("TEXT")))}}),
    )
    .await;
    let got = recv_until(&mut ws, "SETUP_COMPLETE").await;
    let kinds: Vec<&str> = got.iter().map(kind).collect();
    assert_eq!(
        kinds,
        ["GEMINI_CONNECTED", "GEMINI_ERROR", "SETUP_COMPLETE"],
        "{got:#?}"
    );
    assert!(
        got[1]["payload"]["message"]
            .as_str()
            .unwrap()
            .contains("broken_tool"),
        "{got:#?}"
    );
    assert_eq!(got[2], setup_ok);
    quiet_for(&mut ws, Duration::from_millis(300)).await;

    // The same order on UPDATE_CONFIG, in place (same modality) and as a new session.
    for modality in ["TEXT", "AUDIO"] {
        send(
            &mut ws,
            json!({"type": "UPDATE_CONFIG", "payload": with_a_bad_tool(live_config(&json!(modality)))}),
        )
        .await;
        let got = recv_until(&mut ws, "SETUP_COMPLETE").await;
        let kinds: Vec<&str> = got.iter().map(kind).collect();
        assert_eq!(
            kinds,
            ["GEMINI_ERROR", "SETUP_COMPLETE"],
            "{modality}: {got:#?}"
        );
        assert_eq!(got[1], setup_ok);
        quiet_for(&mut ws, Duration::from_millis(300)).await;
    }
    // The good declaration next to the bad one works.
    send(
        &mut ws,
        json!({"type": "SEND_MESSAGE", "payload": {"parts": [{"text":
            "call get_weather {\"city\": \"Lima\"}"}]}}),
    )
    .await;
    let got = recv_until(&mut ws, "TOOL_CALL").await;
    assert_eq!(
        got.last().unwrap()["payload"]["toolCall"]["functionCalls"][0]["name"],
        "get_weather"
    );
    server.stop_within(WAIT).await;
}

#[tokio::test]
async fn update_config_and_second_connect_replace_the_session() {
    let server = Running::start(Config::default()).await;
    let mut ws = session(
        format!("ws://{}/gemini", server.addr),
        live_config(&json!("TEXT")),
    )
    .await;
    // UPDATE_CONFIG's payload is the config itself; it ends with a new SETUP_COMPLETE only.
    send(
        &mut ws,
        json!({"type": "UPDATE_CONFIG", "payload": live_config(&json!(["AUDIO"]))}),
    )
    .await;
    assert_eq!(
        recv(&mut ws).await,
        json!({"type": "SETUP_COMPLETE", "payload": {"setupComplete": {"success": true}}})
    );
    send(
        &mut ws,
        json!({"type": "SEND_MESSAGE", "payload": {"parts": [{"text": "now speak a long sentence to me please"}]}}),
    )
    .await;
    loop {
        let m = recv(&mut ws).await;
        assert_ne!(kind(&m), "TURN_COMPLETE");
        if !audio_parts(std::slice::from_ref(&m)).is_empty() {
            break;
        }
    }
    // Mid-reply, a second CONNECT_GEMINI replaces the session: nothing of the old one follows.
    send(
        &mut ws,
        json!({"type": "CONNECT_GEMINI", "payload": {"initialConfig": live_config(&json!("text"))}}),
    )
    .await;
    loop {
        let m = recv(&mut ws).await;
        if kind(&m) == "GEMINI_CONNECTED" {
            break;
        }
        // Audio already queued before the switch may still drain.
        assert!(
            !audio_parts(std::slice::from_ref(&m)).is_empty() || kind(&m) == "ASSISTANT_SPEAKING",
            "{m}"
        );
    }
    assert_eq!(kind(&recv(&mut ws).await), "SETUP_COMPLETE");
    send(
        &mut ws,
        json!({"type": "SEND_MESSAGE", "payload": {"parts": [{"text": "second"}]}}),
    )
    .await;
    let turn = recv_until(&mut ws, "TURN_COMPLETE").await;
    assert_eq!(model_text(&turn), "You said: second");
    assert!(audio_parts(&turn).is_empty(), "{turn:#?}");
    quiet_for(&mut ws, Duration::from_millis(1500)).await;
    server.stop_within(WAIT).await;
}

#[tokio::test]
async fn disconnect_keeps_the_socket_and_allows_reconnect() {
    let server = Running::start(Config::default()).await;
    let url = format!("ws://{}/gemini", server.addr);
    let mut ws = session(url, live_config(&json!("TEXT"))).await;
    send(
        &mut ws,
        json!({"type": "DISCONNECT_GEMINI", "payload": null}),
    )
    .await;
    let bye = recv(&mut ws).await;
    insta::assert_json_snapshot!("gemini_disconnected", bye);
    send(
        &mut ws,
        json!({"type": "SEND_MESSAGE", "payload": {"parts": [{"text": "hi"}]}}),
    )
    .await;
    assert_eq!(
        recv(&mut ws).await,
        json!({"type": "GEMINI_ERROR", "payload": {"message": "Gemini not connected. Send CONNECT_GEMINI first."}})
    );
    send(
        &mut ws,
        json!({"type": "CONNECT_GEMINI", "payload": {"initialConfig": live_config(&json!("TEXT"))}}),
    )
    .await;
    assert_eq!(kind(&recv(&mut ws).await), "GEMINI_CONNECTED");
    assert_eq!(kind(&recv(&mut ws).await), "SETUP_COMPLETE");
    send(
        &mut ws,
        json!({"type": "SEND_MESSAGE", "payload": {"parts": [{"text": "hi"}]}}),
    )
    .await;
    let turn = recv_until(&mut ws, "TURN_COMPLETE").await;
    assert_eq!(model_text(&turn), "You said: hi");
    server.stop_within(WAIT).await;
}

#[tokio::test]
async fn webrtc_switched_off_is_refused_with_a_clear_error() {
    let mut config = Config::default();
    config.webrtc.enabled = false;
    let server = Running::start(config).await;
    let mut ws = connect(format!("ws://{}/gemini", server.addr)).await;
    for m in [
        json!({"type": "WEBRTC_OFFER", "payload": {"sdp": "v=0\r\n"}}),
        json!({"type": "WEBRTC_ICE_CANDIDATE", "payload": {"candidate":
            {"candidate": "candidate:1 1 UDP 1 10.0.0.1 9 typ host", "sdpMid": "0", "sdpMLineIndex": 0}}}),
        json!({"type": "WEBRTC_ICE_CANDIDATE", "payload": {
            "candidate": "candidate:1 1 UDP 1 10.0.0.1 9 typ host", "sdpMid": "0", "sdpMLineIndex": "0"}}),
    ] {
        send(&mut ws, m).await;
        let e = recv(&mut ws).await;
        assert_eq!(kind(&e), "GEMINI_ERROR");
        assert!(
            e["payload"]["message"]
                .as_str()
                .unwrap()
                .contains("WebRTC is not supported"),
            "{e}"
        );
    }
    insta::assert_json_snapshot!(
        "webrtc_error",
        recv_after(
            &mut ws,
            json!({"type": "WEBRTC_OFFER", "payload": {"sdp": ""}})
        )
        .await
    );
    server.stop_within(WAIT).await;
}

/// A Chrome (libwebrtc) audio-only offer, as the Android app sends.
const CHROME_OFFER: &str = include_str!("fixtures/chrome_audio_offer.sdp");

#[tokio::test]
async fn a_browser_offer_is_answered_with_audio_and_candidates() {
    let server = Running::start(Config::default()).await;
    let own = server.listener("gemini").unwrap();
    let mut ws = session(format!("ws://{own}/"), live_config(&json!(["AUDIO"]))).await;
    send(
        &mut ws,
        json!({"type": "WEBRTC_OFFER", "payload": {"sdp": CHROME_OFFER}}),
    )
    .await;
    let answer = recv(&mut ws).await;
    assert_eq!(kind(&answer), "WEBRTC_ANSWER", "{answer}");
    let sdp = answer["payload"]["sdp"].as_str().unwrap();
    assert!(sdp.contains("m=audio"), "{sdp}");
    assert!(sdp.contains("a=candidate"), "{sdp}");
    assert!(sdp.contains("a=mid:0"), "{sdp}");
    // The rate hints on Opus: the engine hears 16 kHz, so the app need not send fullband.
    let opus_pt = sdp
        .lines()
        .find_map(|l| l.strip_prefix("a=rtpmap:")?.strip_suffix(" opus/48000/2"))
        .unwrap_or_else(|| panic!("no Opus in {sdp}"));
    let fmtp = sdp
        .lines()
        .find_map(|l| l.strip_prefix(&format!("a=fmtp:{opus_pt} ")))
        .unwrap_or_else(|| panic!("no Opus fmtp in {sdp}"));
    assert!(fmtp.contains("maxplaybackrate=16000"), "{fmtp}");
    assert!(fmtp.contains("sprop-maxcapturerate=16000"), "{fmtp}");
    // The MID extension (BUNDLE), no transport-wide congestion control (no feedback traffic).
    assert!(sdp.contains("urn:ietf:params:rtp-hdrext:sdes:mid"), "{sdp}");
    assert!(!sdp.contains("transport-wide-cc"), "{sdp}");
    // The same candidates trickled, in the Android app's nested form.
    let candidate = recv(&mut ws).await;
    assert_eq!(kind(&candidate), "WEBRTC_ICE_CANDIDATE", "{candidate}");
    let inner = &candidate["payload"]["candidate"];
    assert_eq!(inner["sdpMid"], "0");
    assert_eq!(inner["sdpMLineIndex"], 0);
    let line = inner["candidate"].as_str().unwrap();
    assert!(line.starts_with("candidate:"), "{line}");
    assert!(sdp.contains(&format!("a={line}")), "{sdp}");
    // The app's own candidates are taken quietly, nested or flat; the session goes on.
    send(
        &mut ws,
        json!({"type": "WEBRTC_ICE_CANDIDATE", "payload": {"candidate":
        {"candidate": "candidate:1 1 udp 2130706431 127.0.0.1 9 typ host", "sdpMid": "0",
         "sdpMLineIndex": 0}}}),
    )
    .await;
    send(
        &mut ws,
        json!({"type": "WEBRTC_ICE_CANDIDATE", "payload":
        {"candidate": "", "sdpMid": "0", "sdpMLineIndex": 0}}),
    )
    .await;
    // Not SDP: refused with the reason, the socket and session stay.
    let refused = recv_after(
        &mut ws,
        json!({"type": "WEBRTC_OFFER", "payload": {"sdp": "v=0\r\n"}}),
    )
    .await;
    assert_eq!(kind(&refused), "GEMINI_ERROR");
    assert!(
        refused["payload"]["message"]
            .as_str()
            .unwrap()
            .starts_with("WebRTC offer refused: "),
        "{refused}"
    );
    send(
        &mut ws,
        json!({"type": "UPDATE_CONFIG", "payload": live_config(&json!("TEXT"))}),
    )
    .await;
    let setup = recv(&mut ws).await;
    assert_eq!(kind(&setup), "SETUP_COMPLETE", "{setup}");
    send(
        &mut ws,
        json!({"type": "SEND_MESSAGE", "payload": {"parts": [{"text": "hi"}]}}),
    )
    .await;
    let turn = recv_until(&mut ws, "TURN_COMPLETE").await;
    assert_eq!(model_text(&turn), "You said: hi");
    server.stop_within(WAIT).await;
}

/// A WebRTC peer on str0m playing the original bridge's WebRTC test client: a microphone
/// track and a data channel `test` in the offer, its candidate trickled flat.
struct DataChannelPeer {
    rtc: str0m::Rtc,
    socket: tokio::net::UdpSocket,
    local: std::net::SocketAddr,
    pending: Option<str0m::change::SdpPendingOffer>,
}

impl DataChannelPeer {
    /// The peer and its offer.
    async fn offer() -> (Self, String) {
        use str0m::media::{Direction, MediaKind};
        str0m::crypto::from_feature_flags().install_process_default();
        let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let local = socket.local_addr().unwrap();
        let mut rtc = str0m::RtcConfig::new()
            .clear_codecs()
            .enable_opus(true, false)
            .build(std::time::Instant::now());
        rtc.add_local_candidate(str0m::Candidate::host(local, "udp").unwrap());
        let mut api = rtc.sdp_api();
        api.add_media(MediaKind::Audio, Direction::SendRecv, None, None, None);
        api.add_channel("test".into());
        let (offer, pending) = api.apply().unwrap();
        let peer = Self {
            rtc,
            socket,
            local,
            pending: Some(pending),
        };
        (peer, offer.to_sdp_string())
    }

    fn answer(&mut self, sdp: &str) {
        let answer = str0m::change::SdpAnswer::from_sdp_string(sdp).unwrap();
        let pending = self.pending.take().unwrap();
        self.rtc.sdp_api().accept_answer(pending, answer).unwrap();
    }

    /// Runs the connection: once the channel opens, `sent` goes out on it in order (text,
    /// or binary when flagged); returns what comes back on it, up to and including the first
    /// text `pong`.
    async fn exchange(&mut self, sent: &[(bool, &str)]) -> Vec<(bool, String)> {
        use str0m::net::{Protocol, Receive};
        use str0m::{Event, Input, Output};
        let deadline = tokio::time::Instant::now() + WAIT;
        let mut received = Vec::new();
        let mut buf = vec![0_u8; 2048];
        loop {
            let timeout = match self.rtc.poll_output().unwrap() {
                Output::Transmit(t) => {
                    self.socket
                        .send_to(&t.contents, t.destination)
                        .await
                        .unwrap();
                    continue;
                }
                Output::Event(Event::ChannelOpen(id, label)) => {
                    assert_eq!(label, "test");
                    let mut channel = self.rtc.channel(id).unwrap();
                    for (binary, text) in sent {
                        assert!(channel.write(*binary, text.as_bytes()).unwrap());
                    }
                    continue;
                }
                Output::Event(Event::ChannelData(d)) => {
                    let text = String::from_utf8(d.data).unwrap();
                    let done = !d.binary && text == "pong";
                    received.push((d.binary, text));
                    if done {
                        return received;
                    }
                    continue;
                }
                Output::Event(_) => continue,
                Output::Timeout(t) => t,
            };
            assert!(
                tokio::time::Instant::now() < deadline,
                "no pong; got {received:?}"
            );
            let wake = tokio::time::Instant::from_std(timeout).min(deadline);
            let input = tokio::select! {
                r = self.socket.recv_from(&mut buf) => {
                    let (n, source) = r.unwrap();
                    let Ok(contents) = buf[..n].try_into() else { continue };
                    Input::Receive(std::time::Instant::now(), Receive {
                        proto: Protocol::Udp,
                        source,
                        destination: self.local,
                        contents,
                    })
                }
                () = tokio::time::sleep_until(wake) => Input::Timeout(std::time::Instant::now()),
            };
            self.rtc.handle_input(input).unwrap();
        }
    }
}

#[tokio::test]
async fn a_data_channel_ping_is_answered_pong_as_the_original_gateway_did() {
    let server = Running::start(Config::default()).await;
    let own = server.listener("gemini").unwrap();
    let mut ws = session(format!("ws://{own}/"), live_config(&json!(["audio"]))).await;
    let (mut peer, offer) = DataChannelPeer::offer().await;
    send(
        &mut ws,
        json!({"type": "WEBRTC_OFFER", "payload": {"sdp": offer}}),
    )
    .await;
    let answer = recv(&mut ws).await;
    assert_eq!(kind(&answer), "WEBRTC_ANSWER", "{answer}");
    let sdp = answer["payload"]["sdp"].as_str().unwrap();
    assert!(
        sdp.contains("m=application"),
        "the channel is negotiated: {sdp}"
    );
    peer.answer(sdp);
    // Only a text `ping` is answered: other text and a binary `ping` get nothing (the
    // channel is ordered, so an answer to them would come before the pong).
    let received = peer
        .exchange(&[(false, "hello"), (true, "ping"), (false, "ping")])
        .await;
    assert_eq!(received, [(false, "pong".to_owned())]);
    // The bridge goes on over the WebSocket.
    send(
        &mut ws,
        json!({"type": "UPDATE_CONFIG", "payload": live_config(&json!("TEXT"))}),
    )
    .await;
    let setup = recv_until(&mut ws, "SETUP_COMPLETE").await;
    assert_eq!(kind(setup.last().unwrap()), "SETUP_COMPLETE");
    send(
        &mut ws,
        json!({"type": "SEND_MESSAGE", "payload": {"parts": [{"text": "hi"}]}}),
    )
    .await;
    let turn = recv_until(&mut ws, "TURN_COMPLETE").await;
    assert_eq!(model_text(&turn), "You said: hi");
    server.stop_within(WAIT).await;
}

async fn recv_after(ws: &mut Ws, m: Value) -> Value {
    send(ws, m).await;
    recv(ws).await
}

#[tokio::test]
async fn malformed_frames_get_errors_and_the_session_goes_on() {
    let mut config = Config::default();
    config.gemini.max_frame_bytes = 4096;
    let server = Running::start(config).await;
    let mut ws = connect(format!("ws://{}/gemini", server.addr)).await;
    let msg = |v: &Value| v["payload"]["message"].as_str().unwrap().to_owned();

    let e = recv_after(
        &mut ws,
        json!({"type": "SEND_MESSAGE", "payload": {"parts": []}}),
    )
    .await;
    assert_eq!(msg(&e), "Gemini not connected. Send CONNECT_GEMINI first.");
    send_raw(&mut ws, Message::Text("{not json".into())).await;
    let e = recv(&mut ws).await;
    insta::assert_json_snapshot!("error_invalid_json", e);
    send_raw(&mut ws, Message::Text(r#"{"payload":{}}"#.into())).await;
    assert_eq!(msg(&recv(&mut ws).await), "Invalid JSON message received.");
    send_raw(&mut ws, Message::Binary(vec![0xff, 0x00, 0x12].into())).await;
    assert_eq!(msg(&recv(&mut ws).await), "Invalid JSON message received.");
    let e = recv_after(&mut ws, json!({"type": "FOO"})).await;
    insta::assert_json_snapshot!("error_unknown_type", e);
    let e = recv_after(
        &mut ws,
        json!({"type": "SEND_MESSAGE", "payload": {"parts": 5}}),
    )
    .await;
    assert_eq!(msg(&e), "Invalid payload for SEND_MESSAGE.");
    let big = json!({"type": "SEND_MESSAGE", "payload": {"parts": [{"text": "x".repeat(5000)}]}});
    let e = recv_after(&mut ws, big).await;
    assert!(msg(&e).contains("exceeds the limit of 4096 bytes"), "{e}");

    // JSON in a binary frame is accepted.
    let connect_frame = json!({"type": "CONNECT_GEMINI", "payload": {"initialConfig": live_config(&json!("TEXT"))}});
    send_raw(
        &mut ws,
        Message::Binary(connect_frame.to_string().into_bytes().into()),
    )
    .await;
    assert_eq!(kind(&recv(&mut ws).await), "GEMINI_CONNECTED");
    assert_eq!(kind(&recv(&mut ws).await), "SETUP_COMPLETE");
    let e = recv_after(
        &mut ws,
        json!({"type": "SEND_REALTIME_INPUT", "payload": {"audio": {"mimeType": "audio/pcm;rate=16000", "data": "!!!!"}}}),
    )
    .await;
    assert!(msg(&e).starts_with("Invalid audio"), "{e}");
    let e = recv_after(
        &mut ws,
        json!({"type": "GENERATE_IMAGE", "payload": {"text": "a cat", "imageData": null}}),
    )
    .await;
    assert_eq!(kind(&e), "IMAGE_GENERATION_RESULT");
    assert_eq!(e["payload"]["success"], false);
    // Still serving.
    send(
        &mut ws,
        json!({"type": "SEND_MESSAGE", "payload": {"parts": [{"text": "still there?"}]}}),
    )
    .await;
    let turn = recv_until(&mut ws, "TURN_COMPLETE").await;
    assert_eq!(model_text(&turn), "You said: still there?");
    server.stop_within(WAIT).await;
}

/// What the fake Live API saw.
#[derive(Debug, Default)]
struct Seen {
    uri: String,
    messages: Vec<Value>,
}

/// A fake Gemini Live API for one connection, speaking its wire format: it waits for `setup`,
/// answers `setupComplete`, answers a `clientContent` turn with text, audio, a tool call and
/// its cancellation and `turnComplete`, records `realtimeInput` and `toolResponse`, then
/// interrupts, announces its end (`goAway`) and closes with 1000.
async fn fake_live_api() -> (String, tokio::task::JoinHandle<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let uri = Arc::new(std::sync::Mutex::new(String::new()));
        let u2 = Arc::clone(&uri);
        let mut ws = tokio_tungstenite::accept_hdr_async(
            stream,
            move |req: &tokio_tungstenite::tungstenite::handshake::server::Request, resp| {
                *u2.lock().unwrap() = req.uri().to_string();
                Ok(resp)
            },
        )
        .await
        .unwrap();
        let mut seen = Seen {
            uri: uri.lock().unwrap().clone(),
            ..Seen::default()
        };
        let next = async |ws: &mut WebSocketStream<TcpStream>| loop {
            match ws.next().await.unwrap().unwrap() {
                Message::Text(t) => return serde_json::from_str::<Value>(t.as_str()).unwrap(),
                Message::Binary(b) => return serde_json::from_slice::<Value>(&b).unwrap(),
                _ => continue,
            }
        };
        let setup = next(&mut ws).await;
        seen.messages.push(setup);
        // The real service sends JSON in binary frames.
        ws.send(Message::Binary(br#"{"setupComplete":{}}"#.to_vec().into()))
            .await
            .unwrap();
        let turn = next(&mut ws).await;
        seen.messages.push(turn);
        for reply in [
            json!({"serverContent": {"modelTurn": {"role": "model", "parts": [{"text": "Bonjour"}]}}}),
            json!({"serverContent": {"modelTurn": {"parts": [{"inlineData": {
                "mimeType": "audio/pcm;rate=24000", "data": "AAABAAIA"}}]}},
                "usageMetadata": {"totalTokenCount": "12"}}),
            json!({"toolCall": {"functionCalls": [{"id": "fc-1", "name": "get_weather", "args": {"city": "Paris"}}]}}),
            json!({"toolCallCancellation": {"ids": ["fc-1"]}}),
            json!({"serverContent": {"outputTranscription": {"text": "Bonjour"}, "turnComplete": true}}),
        ] {
            ws.send(Message::Text(reply.to_string().into()))
                .await
                .unwrap();
        }
        let audio = next(&mut ws).await;
        seen.messages.push(audio);
        let tool = next(&mut ws).await;
        seen.messages.push(tool);
        for last in [
            json!({"serverContent": {"interrupted": true}}),
            json!({"goAway": {"timeLeft": "10s"}}),
        ] {
            ws.send(Message::Text(last.to_string().into()))
                .await
                .unwrap();
        }
        ws.close(Some(tokio_tungstenite::tungstenite::protocol::CloseFrame {
            code: 1000.into(),
            reason: "session over".into(),
        }))
        .await
        .unwrap();
        // Let the close handshake finish.
        while let Some(Ok(_)) = ws.next().await {}
        seen
    });
    (format!("ws://{addr}"), task)
}

/// `2024-06-01T12:34:56.789Z`, and not some other day than today.
fn assert_iso8601_utc(date: &str) {
    let b = date.as_bytes();
    assert_eq!(b.len(), 24, "{date}");
    for (i, c) in b.iter().enumerate() {
        let want = match i {
            4 | 7 => b'-',
            10 => b'T',
            13 | 16 => b':',
            19 => b'.',
            23 => b'Z',
            _ => {
                assert!(c.is_ascii_digit(), "{date}");
                continue;
            }
        };
        assert_eq!(*c, want, "{date}");
    }
    let today_secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let today = voxgate_gemini::bridge::iso8601_utc(today_secs * 1000);
    let yesterday = voxgate_gemini::bridge::iso8601_utc((today_secs - 86_400) * 1000);
    assert!(
        date[..10] == today[..10] || date[..10] == yesterday[..10],
        "{date} vs {today}"
    );
}

#[tokio::test]
async fn passthrough_relays_to_a_fake_live_api() {
    let (base_url, fake) = fake_live_api().await;
    let mut config = Config::default();
    config.gemini.mode = GeminiMode::Passthrough;
    config.gemini.api_key = Some("test-key".into());
    config.gemini.base_url = base_url;
    let server = Running::start(config).await;
    let mut c = live_config(&json!("text"));
    c["model"] = json!("gemini-live-test");
    c["tools"] = weather_tools()["tools"].clone();
    let mut ws = session(format!("ws://{}/", server.listener("gemini").unwrap()), c).await;
    send(
        &mut ws,
        json!({"type": "SEND_MESSAGE", "payload": {"parts": [{"text": "Salut"}], "turnComplete": null}}),
    )
    .await;
    let relayed = recv_until(&mut ws, "TURN_COMPLETE").await;
    let kinds: Vec<&str> = relayed.iter().map(kind).collect();
    assert_eq!(
        kinds,
        [
            "CONTENT_MESSAGE",
            "ASSISTANT_SPEAKING",
            "CONTENT_MESSAGE",
            "TOOL_CALL",
            "TOOL_CALL_CANCELLATION",
            "CONTENT_MESSAGE",
            "TURN_COMPLETE"
        ]
    );
    assert_eq!(model_text(&relayed), "Bonjour");
    assert_eq!(
        audio_parts(&relayed),
        vec![json!({"inlineData": {"mimeType": "audio/pcm;rate=24000", "data": "AAABAAIA"}})]
    );
    assert_eq!(
        relayed[3]["payload"]["toolCall"]["functionCalls"][0],
        json!({"id": "fc-1", "name": "get_weather", "args": {"city": "Paris"}})
    );
    assert_eq!(
        relayed[4],
        json!({"type": "TOOL_CALL_CANCELLATION", "payload": {"toolCallCancellation": {"ids": ["fc-1"]}}})
    );
    assert_eq!(
        relayed[5]["payload"]["serverContent"],
        json!({"outputTranscription": {"text": "Bonjour"}, "turnComplete": true})
    );
    // A whole WAV file goes upstream as raw PCM; tool responses in the flat form.
    send(
        &mut ws,
        json!({"type": "SEND_REALTIME_INPUT", "payload": {"text": null, "video": null,
            "audio": {"mimeType": "audio/pcm;rate=16000", "data": b64_bytes(SPEECH_WAV)}}}),
    )
    .await;
    send(
        &mut ws,
        json!({"type": "SEND_TOOL_RESPONSE", "payload": {"toolResponse": {"functionResponses": [
            {"id": "fc-1", "name": "get_weather", "response": {"forecast": "sunny"}}]}}}),
    )
    .await;
    let end = recv_until(&mut ws, "GEMINI_DISCONNECTED").await;
    assert_eq!(kind(&end[0]), "CONTENT_MESSAGE");
    assert_eq!(kind(&end[1]), "INTERRUPTED");
    // goAway becomes a LOG_MESSAGE dated like the original gateway's (`toISOString()`): the
    // Android app drops one without a date.
    let log = &end[2];
    assert_eq!(kind(log), "LOG_MESSAGE", "{end:#?}");
    assert_eq!(log["payload"]["type"], "warn");
    assert_eq!(
        log["payload"]["message"],
        "Gemini will close the session in 10s."
    );
    assert_iso8601_utc(log["payload"]["date"].as_str().unwrap());
    assert_eq!(end.len(), 4, "{end:#?}");
    insta::assert_json_snapshot!("passthrough_disconnected", end.last().unwrap());
    // The socket stays open: the app may connect again (the fake is gone: a clear failure).
    send(
        &mut ws,
        json!({"type": "SEND_MESSAGE", "payload": {"parts": [{"text": "hi"}]}}),
    )
    .await;
    assert_eq!(
        recv(&mut ws).await["payload"]["message"],
        "Gemini not connected. Send CONNECT_GEMINI first."
    );

    let seen = tokio::time::timeout(WAIT, fake).await.unwrap().unwrap();
    assert!(
        seen.uri.starts_with(
            "/ws/google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent?"
        ),
        "{}",
        seen.uri
    );
    assert!(seen.uri.ends_with("key=test-key"), "{}", seen.uri);
    let setup = &seen.messages[0]["setup"];
    assert_eq!(setup["model"], "models/gemini-live-test");
    assert_eq!(
        setup["generationConfig"]["responseModalities"],
        json!(["TEXT"])
    );
    assert_eq!(
        setup["systemInstruction"]["parts"][0]["text"],
        "You are helpful."
    );
    assert_eq!(
        setup["tools"][0]["functionDeclarations"][0]["behavior"],
        "NON_BLOCKING"
    );
    assert_eq!(
        seen.messages[1],
        json!({"clientContent": {"turns": [{"role": "user", "parts": [{"text": "Salut"}]}],
            "turnComplete": true}})
    );
    let audio = &seen.messages[2]["realtimeInput"]["audio"];
    assert_eq!(audio["mimeType"], "audio/pcm;rate=16000");
    let data = audio["data"].as_str().unwrap();
    assert!(!data.starts_with("UklGR"), "the RIFF header went upstream");
    assert_eq!(data, b64_bytes(&SPEECH_WAV[44..]));
    assert_eq!(
        seen.messages[3],
        json!({"toolResponse": {"functionResponses": [
            {"id": "fc-1", "name": "get_weather", "response": {"forecast": "sunny"}}]}})
    );
    server.stop_within(WAIT).await;
}

#[tokio::test]
async fn passthrough_failures_are_clear() {
    // No key.
    let mut config = Config::default();
    config.gemini.mode = GeminiMode::Passthrough;
    let server = Running::start(config.clone()).await;
    let mut ws = connect(format!("ws://{}/gemini", server.addr)).await;
    send(
        &mut ws,
        json!({"type": "CONNECT_GEMINI", "payload": {"initialConfig": null}}),
    )
    .await;
    let setup = recv(&mut ws).await;
    assert_eq!(setup["payload"]["setupComplete"]["success"], false);
    insta::assert_json_snapshot!("setup_failed_no_key", setup);
    let e = recv(&mut ws).await;
    assert!(
        e["payload"]["message"]
            .as_str()
            .unwrap()
            .contains("API key")
    );
    server.stop_within(WAIT).await;

    // Nobody listens upstream.
    let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead_addr = dead.local_addr().unwrap();
    drop(dead);
    config.gemini.api_key = Some("k".into());
    config.gemini.base_url = format!("ws://{dead_addr}");
    let server = Running::start(config.clone()).await;
    let mut ws = connect(format!("ws://{}/gemini", server.addr)).await;
    send(&mut ws, json!({"type": "CONNECT_GEMINI"})).await;
    let setup = recv(&mut ws).await;
    assert_eq!(setup["payload"]["setupComplete"]["success"], false);
    let e = recv(&mut ws).await;
    assert!(
        e["payload"]["message"]
            .as_str()
            .unwrap()
            .starts_with("Could not connect to Gemini"),
        "{e}"
    );
    assert!(!e.to_string().contains("key=k"), "the key leaked: {e}");
    server.stop_within(WAIT).await;

    // wss:// to something that is not TLS: the TLS client is set up and fails cleanly.
    let not_tls = TcpListener::bind("127.0.0.1:0").await.unwrap();
    config.gemini.base_url = format!("wss://{}", not_tls.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = not_tls.accept().await {
            use tokio::io::AsyncWriteExt;
            let _ = sock.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
        }
    });
    let server = Running::start(config).await;
    let mut ws = connect(format!("ws://{}/gemini", server.addr)).await;
    send(&mut ws, json!({"type": "CONNECT_GEMINI"})).await;
    assert_eq!(
        recv(&mut ws).await["payload"]["setupComplete"]["success"],
        false
    );
    let e = recv(&mut ws).await;
    assert!(
        e["payload"]["message"]
            .as_str()
            .unwrap()
            .starts_with("Could not connect to Gemini"),
        "{e}"
    );
    server.stop_within(WAIT).await;
}

#[tokio::test]
async fn shutdown_tells_the_app_and_closes() {
    let server = Running::start(Config::default()).await;
    let mut ws = session(
        format!("ws://{}/", server.listener("gemini").unwrap()),
        live_config(&json!("TEXT")),
    )
    .await;
    let stopping = tokio::spawn(server.stop_within(WAIT));
    assert_eq!(
        recv(&mut ws).await,
        json!({"type": "GEMINI_DISCONNECTED", "payload": {"reason": "server shutting down"}})
    );
    let end = tokio::time::timeout(WAIT, ws.next()).await.unwrap();
    assert!(matches!(end, None | Some(Ok(Message::Close(_)))), "{end:?}");
    tokio::time::timeout(WAIT, stopping).await.unwrap().unwrap();
}

/// The close frame that ends the connection (pings and pongs skipped), answered as a client
/// does (the server waits for the answer before it drops the socket); panics on data or a
/// connection dropped without one.
async fn close_frame(ws: &mut Ws) -> tokio_tungstenite::tungstenite::protocol::CloseFrame {
    loop {
        match tokio::time::timeout(WAIT, ws.next()).await.unwrap() {
            Some(Ok(Message::Close(Some(frame)))) => {
                // Reading on sends the queued answer; then the stream ends.
                let rest = tokio::time::timeout(WAIT, ws.next()).await.unwrap();
                assert!(rest.is_none(), "{rest:?}");
                return frame;
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
            other => panic!("expected a close frame, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_connection_without_connect_gemini_is_closed_after_the_init_timeout() {
    let mut config = Config::default();
    config.gemini.connect_timeout_ms = Some(300);
    let server = Running::start(config).await;
    let started = tokio::time::Instant::now();
    let mut ws = connect(format!("ws://{}/", server.listener("gemini").unwrap())).await;
    // Talking without connecting a session does not count.
    send(
        &mut ws,
        json!({"type": "SEND_MESSAGE", "payload": {"parts": [{"text": "hi"}]}}),
    )
    .await;
    assert_eq!(
        recv(&mut ws).await["payload"]["message"],
        "Gemini not connected. Send CONNECT_GEMINI first."
    );
    let e = recv(&mut ws).await;
    assert_eq!(kind(&e), "GEMINI_ERROR");
    assert!(
        e["payload"]["message"]
            .as_str()
            .unwrap()
            .contains("send CONNECT_GEMINI first"),
        "{e}"
    );
    let close = close_frame(&mut ws).await;
    assert_eq!(u16::from(close.code), 1008);
    assert!(started.elapsed() >= Duration::from_millis(300));
    server
        .sessions_drain(voxgate_server::metrics::Door::Gemini)
        .await;

    // A connected session is not closed by it.
    let mut ws = session(
        format!("ws://{}/gemini", server.addr),
        live_config(&json!("TEXT")),
    )
    .await;
    quiet_for(&mut ws, Duration::from_millis(600)).await;
    send(
        &mut ws,
        json!({"type": "SEND_MESSAGE", "payload": {"parts": [{"text": "still here"}]}}),
    )
    .await;
    let turn = recv_until(&mut ws, "TURN_COMPLETE").await;
    assert_eq!(model_text(&turn), "You said: still here");
    server.stop_within(WAIT).await;
}

#[tokio::test]
async fn a_client_close_is_answered_with_a_close_frame() {
    let server = Running::start(Config::default()).await;
    let mut ws = session(
        format!("ws://{}/gemini", server.addr),
        live_config(&json!("TEXT")),
    )
    .await;
    server
        .wait_sessions(voxgate_server::metrics::Door::Gemini, 1)
        .await;
    ws.send(Message::Close(Some(
        tokio_tungstenite::tungstenite::protocol::CloseFrame {
            code: 1000.into(),
            reason: "done".into(),
        },
    )))
    .await
    .unwrap();
    let close = close_frame(&mut ws).await;
    assert_eq!(u16::from(close.code), 1000);
    server
        .sessions_drain(voxgate_server::metrics::Door::Gemini)
        .await;
    server.stop_within(WAIT).await;
}

#[tokio::test]
async fn shutdown_sends_gemini_disconnected_then_closes_with_1001() {
    let server = Running::start(Config::default()).await;
    let mut ws = session(
        format!("ws://{}/", server.listener("gemini").unwrap()),
        live_config(&json!("TEXT")),
    )
    .await;
    // A message racing the shutdown (the session may never read it) neither holds the
    // shutdown up nor costs the app the close frame.
    send(
        &mut ws,
        json!({"type": "SEND_MESSAGE", "payload": {"parts": [{"text": "hello"}]}}),
    )
    .await;
    let stopping = tokio::spawn(server.stop_within(WAIT));
    loop {
        let m = recv(&mut ws).await;
        if kind(&m) == "GEMINI_DISCONNECTED" {
            assert_eq!(m["payload"]["reason"], "server shutting down");
            break;
        }
        assert_ne!(kind(&m), "GEMINI_ERROR", "{m}");
    }
    let close = close_frame(&mut ws).await;
    assert_eq!(u16::from(close.code), 1001);
    tokio::time::timeout(WAIT, stopping).await.unwrap().unwrap();
}

#[tokio::test]
async fn a_failing_model_still_completes_the_turn() {
    let server = Running::start_with(Config::default(), support::refusing_llm()).await;
    let mut ws = session(
        format!("ws://{}/gemini", server.addr),
        live_config(&json!(["text"])),
    )
    .await;
    send(
        &mut ws,
        json!({"type": "SEND_MESSAGE", "payload": {"parts": [{"text": "hello"}], "turnComplete": true}}),
    )
    .await;
    let turn = recv_until(&mut ws, "TURN_COMPLETE").await;
    assert!(
        turn.iter().any(|m| kind(m) == "GEMINI_ERROR"),
        "the failure is reported before TURN_COMPLETE: {turn:?}"
    );
    server.stop().await;
}

// ---- Audio in one large frame (issue 35) ----------------------------------------------------

/// "Hello." and a question, about 2.1 s of speech from the first sample to the last: 16 kHz
/// mono, a canonical 44-byte header.
const QUESTION_WAV: &[u8] = include_bytes!("../../voxgate-audio/tests/fixtures/question.wav");

fn question_pcm() -> Vec<i16> {
    samples_of(&QUESTION_WAV[44..])
}

fn samples_of(bytes: &[u8]) -> Vec<i16> {
    bytes
        .chunks_exact(2)
        .map(|c| i16::from_le_bytes([c[0], c[1]]))
        .collect()
}

fn bytes_of(samples: &[i16]) -> Vec<u8> {
    samples.iter().flat_map(|s| s.to_le_bytes()).collect()
}

/// Milliseconds of 16 kHz samples.
fn ms(samples: usize) -> u64 {
    u64::try_from(samples / 16).unwrap()
}

/// A fake OpenAI transcription endpoint that answers each upload with how much audio it
/// holds, `"<n> ms"`: the transcript then proves what reached the recognizer.
async fn measuring_asr() -> String {
    let router = axum::Router::new().route(
        "/v1/audio/transcriptions",
        axum::routing::post(|body: axum::body::Bytes| async move {
            let riff = body
                .windows(4)
                .position(|w| w == b"RIFF")
                .expect("a WAV upload");
            // The multipart boundary after the file is past the data chunk: ignored.
            let wav = voxgate_audio::wav::read_wav(&body[riff..]).unwrap();
            assert_eq!((wav.sample_rate, wav.channels), (16_000, 1));
            (
                [("content-type", "application/json")],
                json!({ "text": format!("{} ms", ms(wav.frames())) }).to_string(),
            )
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    });
    format!("http://{addr}/v1")
}

/// The bridge's input transcription of `turn` as the milliseconds of speech the recognizer
/// was given (one `"<n> ms"` per utterance, joined).
fn heard_ms(turn: &[Value]) -> u64 {
    let text = turn
        .iter()
        .find_map(|m| m["payload"]["serverContent"]["inputTranscription"]["text"].as_str())
        .unwrap_or_else(|| panic!("no input transcription in {turn:#?}"));
    let words: Vec<&str> = text.split_whitespace().collect();
    assert!(
        words.len().is_multiple_of(2) && words.chunks(2).all(|w| w[1] == "ms"),
        "{text:?}"
    );
    words.chunks(2).map(|w| w[0].parse::<u64>().unwrap()).sum()
}

/// A mono WAV file of 32-bit float samples (`data`, little-endian) at `rate`.
fn float_wav(rate: u32, data: &[u8]) -> Vec<u8> {
    let len = u32::try_from(data.len()).unwrap();
    let mut w = Vec::new();
    w.extend_from_slice(b"RIFF");
    w.extend_from_slice(&(36 + len).to_le_bytes());
    w.extend_from_slice(b"WAVEfmt ");
    w.extend_from_slice(&16_u32.to_le_bytes());
    w.extend_from_slice(&3_u16.to_le_bytes()); // IEEE float
    w.extend_from_slice(&1_u16.to_le_bytes());
    w.extend_from_slice(&rate.to_le_bytes());
    w.extend_from_slice(&(rate * 4).to_le_bytes());
    w.extend_from_slice(&4_u16.to_le_bytes());
    w.extend_from_slice(&32_u16.to_le_bytes());
    w.extend_from_slice(b"data");
    w.extend_from_slice(&len.to_le_bytes());
    w.extend_from_slice(data);
    w
}

fn realtime_audio(bytes: &[u8]) -> Value {
    json!({"type": "SEND_REALTIME_INPUT", "payload": {
        "audio": {"mimeType": "audio/pcm;rate=16000", "data": b64_bytes(bytes)}}})
}

/// A text-reply session on a server whose recognizer reports what it heard.
async fn measured_session() -> (Running, Ws) {
    let server = Running::start(with_asr(measuring_asr().await)).await;
    let own = server.listener("gemini").unwrap();
    let ws = session(format!("ws://{own}/"), live_config(&json!("TEXT"))).await;
    (server, ws)
}

#[tokio::test]
async fn a_whole_wav_in_one_frame_is_heard_whole() {
    let question = ms(question_pcm().len());
    // The question as the bridge's test client sends it, and at 24 kHz in stereo (the WAV's
    // own rate, channels and sample format win over the mime type's `rate=16000`).
    let stereo_24k = {
        let mut up = Vec::new();
        let mut c = voxgate_audio::resample::RateConverter::new(24_000).unwrap();
        c.process_i16_to_i16(&question_pcm(), 16_000, &mut up)
            .unwrap();
        c.flush_i16(&mut up);
        let interleaved: Vec<i16> = up.iter().flat_map(|&s| [s, s / 2]).collect();
        voxgate_audio::wav::wav_bytes_i16(24_000, 2, &interleaved).unwrap()
    };
    // And as 32-bit float at 48 kHz, the way audio editors save it.
    let float_48k = {
        let mut up = Vec::new();
        let mut c = voxgate_audio::resample::RateConverter::new(48_000).unwrap();
        c.process_i16_to_i16(&question_pcm(), 16_000, &mut up)
            .unwrap();
        c.flush_i16(&mut up);
        let data: Vec<u8> = up
            .iter()
            .flat_map(|&s| (f32::from(s) / 32_768.0).to_le_bytes())
            .collect();
        float_wav(48_000, &data)
    };
    for wav in [QUESTION_WAV.to_vec(), stereo_24k, float_48k] {
        let (server, mut ws) = measured_session().await;
        send(&mut ws, realtime_audio(&wav)).await;
        let turn = recv_until(&mut ws, "TURN_COMPLETE").await;
        let heard = heard_ms(&turn);
        // All of it, header not heard as audio: within the resampler's edges.
        assert!(
            heard + 20 >= question && heard <= question + 20,
            "heard {heard} ms of a {question} ms question"
        );
        assert_eq!(model_text(&turn), format!("You said: {heard} ms"));
        server.stop_within(WAIT).await;
    }
}

#[tokio::test]
async fn a_wav_starting_with_silence_in_one_frame_is_heard_whole() {
    let (server, mut ws) = measured_session().await;
    let mut pcm = vec![0_i16; 16_000];
    pcm.extend(question_pcm());
    let wav = voxgate_audio::wav::wav_bytes_i16(16_000, 1, &pcm).unwrap();
    send(&mut ws, realtime_audio(&wav)).await;
    let turn = recv_until(&mut ws, "TURN_COMPLETE").await;
    let heard = heard_ms(&turn);
    let question = ms(question_pcm().len());
    // The question and at most the VAD's backbuffer (500 ms) of the silence before it.
    assert!(
        heard >= question && heard <= question + 500,
        "heard {heard} ms of a {question} ms question"
    );
    server.stop_within(WAIT).await;
}

/// The question followed by a second of silence as raw 16 kHz PCM, `chunk` bytes a frame,
/// frames sent at real time (as a microphone does: a burst of them would overrun the door's
/// queue, which drops audio rather than fall behind).
async fn question_then_silence(chunk: usize) -> u64 {
    let (server, mut ws) = measured_session().await;
    let mut pcm = question_pcm();
    pcm.extend(vec![0_i16; 16_000]);
    let mut pace = tokio::time::interval(Duration::from_millis(20));
    for frame in bytes_of(&pcm).chunks(chunk) {
        pace.tick().await;
        send(&mut ws, realtime_audio(frame)).await;
    }
    // The VAD ends the utterance inside the audio: answered with nothing more sent.
    let turn = recv_until(&mut ws, "TURN_COMPLETE").await;
    let heard = heard_ms(&turn);
    let question = ms(question_pcm().len());
    assert!(
        heard >= question && heard < question + 1000,
        "heard {heard} ms of a {question} ms question"
    );
    server.stop_within(WAIT).await;
    heard
}

#[tokio::test]
async fn raw_pcm_with_trailing_silence_in_one_frame_is_answered_like_20_ms_chunks() {
    let whole = question_then_silence(usize::MAX).await;
    let chunked = question_then_silence(640).await;
    assert_eq!(whole, chunked, "the same utterance either way");
}
