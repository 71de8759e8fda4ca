//! `[engine]` and the per-door `[<door>.engine]` sections take effect: a real server on
//! 127.0.0.1, real WebSocket clients, speech from the voxgate-audio fixtures and a local fake
//! recognizer. Assertions are about order and presence, never about how fast.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::SocketAddr;
use std::sync::Arc;

use futures::SinkExt;
use serde_json::{Value, json};
use support::{Running, WAIT, Ws, connect, next_message, send_json, xiaozhi_device};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;
use voxgate_audio::format::{PcmEncoder, PcmFormat, SampleFormat};
use voxgate_providers::{DemoAgent, NoAsr, ToneTts};
use voxgate_realtime::proto::client_bound_message::Payload as Down;
use voxgate_realtime::proto::service_bound_message::Payload as Up;
use voxgate_realtime::proto::{InferenceTriggerMode, VadState};
use voxgate_realtime::{AudioFormat, ClientBoundMessage, ServiceBoundMessage, SessionConfig};
use voxgate_server::{Config, Providers};

// ---- realtime client ----------------------------------------------------------------------

async fn send(ws: &mut Ws, m: &ServiceBoundMessage) {
    ws.send(Message::Binary(m.to_frame())).await.unwrap();
}

async fn next(ws: &mut Ws) -> Down {
    loop {
        match next_message(ws, WAIT).await.expect("server still open") {
            Message::Binary(b) => {
                return ClientBoundMessage::decode_frame(b)
                    .unwrap()
                    .payload
                    .unwrap();
            }
            _ => continue,
        }
    }
}

/// Every message up to and including the first that `stop` accepts.
async fn until(ws: &mut Ws, stop: impl Fn(&Down) -> bool) -> Vec<Down> {
    let mut out = Vec::new();
    loop {
        let m = next(ws).await;
        let done = stop(&m);
        out.push(m);
        if done {
            return out;
        }
    }
}

/// Every message the server sends before answering a ping sent now (the door handles a
/// connection's messages in order, so whatever audio went before has been processed).
async fn before_pong(ws: &mut Ws) -> Vec<Down> {
    send(ws, &ServiceBoundMessage::ping()).await;
    let mut msgs = until(ws, |m| matches!(m, Down::Pong(_))).await;
    msgs.pop();
    msgs
}

/// A realtime session with 16 kHz 16-bit input and text replies. `client_vad: false` sends
/// no `vad_configuration` (the server's settings apply); `true` sends the protocol's
/// defaults explicitly, as `SessionConfig` does.
async fn realtime(addr: SocketAddr, client_vad: bool) -> Ws {
    let mut ws = connect(addr, "/realtime").await;
    let mut init = ServiceBoundMessage::initialize(&SessionConfig::new(
        AudioFormat::SPEECH_16K,
        AudioFormat::SPEECH_16K,
    ))
    .unwrap();
    if !client_vad {
        match &mut init.payload {
            Some(Up::InitializeSessionRequest(r)) => r.vad_configuration = None,
            other => panic!("not an initialization: {other:?}"),
        }
    }
    send(&mut ws, &init).await;
    assert!(matches!(next(&mut ws).await, Down::SessionReady(_)));
    ws
}

/// Sends 16 kHz mono samples as 16-bit PCM, one second a packet (few packets: audio waits in
/// a bounded queue and is dropped when it is full).
async fn send_audio(ws: &mut Ws, first_id: u64, samples: &[f32]) -> u64 {
    let pcm = PcmFormat::new(16_000, 1, SampleFormat::Signed16).unwrap();
    let mut id = first_id;
    for chunk in samples.chunks(16_000) {
        let mut bytes = Vec::new();
        PcmEncoder::new(pcm).encode_f32(chunk, &mut bytes);
        let m = ServiceBoundMessage::user_audio(id, InferenceTriggerMode::Immediate, bytes.into());
        send(ws, &m).await;
        id += 1;
    }
    id
}

/// The speech fixture (16 kHz mono): 0.8 s silence, a sentence, 0.8 s silence.
fn speech() -> Vec<f32> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../voxgate-audio/tests/fixtures/speech.wav"
    );
    let wav = voxgate_audio::wav::read_wav(&std::fs::read(path).unwrap()).unwrap();
    assert_eq!(wav.sample_rate, 16_000);
    wav.to_mono()
}

fn vad_to(msgs: &[Down], state: VadState) -> bool {
    msgs.iter()
        .any(|m| matches!(m, Down::VadStateEvent(e) if e.to_state == state as i32))
}

/// A recognizer that hears "turn on the lights" in every upload.
async fn fake_asr() -> String {
    let router = axum::Router::new().route(
        "/v1/audio/transcriptions",
        axum::routing::post(|| async {
            (
                [("content-type", "application/json")],
                json!({ "text": "turn on the lights" }).to_string(),
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

/// The configuration `toml` describes (`Running` turns the overload guard off).
fn config(toml: &str) -> Config {
    Config::from_toml(toml).unwrap()
}

// ---- realtime -----------------------------------------------------------------------------

#[tokio::test]
async fn realtime_vad_settings_apply_unless_the_client_set_its_own() {
    // The user counts as done only after 10 s of silence: the fixture's trailing 0.8 s does
    // not end its speech.
    let server = Running::start(config("[realtime.engine]\nvad_stop_ms = 10000\n")).await;
    let audio = speech();

    let mut ws = realtime(server.addr, false).await;
    let id = send_audio(&mut ws, 1, &audio).await;
    let msgs = before_pong(&mut ws).await;
    assert!(vad_to(&msgs, VadState::Speech), "{msgs:?}");
    assert!(
        !vad_to(&msgs, VadState::Silence),
        "0.8 s of silence ended speech: {msgs:?}"
    );
    // Ten more seconds of silence do.
    send_audio(&mut ws, id, &vec![0.0; 10 * 16_000 + 8_000]).await;
    let msgs = before_pong(&mut ws).await;
    assert!(vad_to(&msgs, VadState::Silence), "{msgs:?}");

    // A client that chose its own VAD settings keeps them: its stop duration ends the speech.
    let mut ws = realtime(server.addr, true).await;
    send_audio(&mut ws, 1, &audio).await;
    let msgs = before_pong(&mut ws).await;
    assert!(vad_to(&msgs, VadState::Speech), "{msgs:?}");
    assert!(vad_to(&msgs, VadState::Silence), "{msgs:?}");
    server.stop().await;
}

#[tokio::test]
async fn realtime_endpointing_delay_holds_the_turn_open() {
    let asr = fake_asr().await;
    let base = format!("[asr]\nbase_url = \"{asr}\"\n");
    // A long endpointing delay: the final transcript is in, yet the turn is not over.
    let server = Running::start(config(&format!(
        "{base}[engine]\nendpoint_delay_ms = 5000\n[realtime.engine]\nendpoint_max_delay_ms = 6000\n"
    )))
    .await;
    let mut ws = realtime(server.addr, true).await;
    send_audio(&mut ws, 1, &speech()).await;
    // The user stopped speaking; the turn (its transcript, then the reply) is still open.
    until(
        &mut ws,
        |m| matches!(m, Down::VadStateEvent(e) if e.to_state == VadState::Silence as i32),
    )
    .await;
    let msgs = before_pong(&mut ws).await;
    assert!(
        !msgs
            .iter()
            .any(|m| matches!(m, Down::UserTranscriptionResult(_) | Down::ResponseBegin(_))),
        "the turn ended before the endpointing delay: {msgs:?}"
    );
    // It does end, and is answered.
    let msgs = until(&mut ws, |m| matches!(m, Down::ResponseEnd(_))).await;
    assert!(
        msgs.iter()
            .any(|m| matches!(m, Down::UserTranscriptionResult(_)))
    );
    assert!(msgs.iter().any(|m| matches!(m, Down::ResponseBegin(_))));
    server.stop().await;

    // With the code default the same turn is answered without anything else from the client.
    let server = Running::start(config(&base)).await;
    let mut ws = realtime(server.addr, true).await;
    send_audio(&mut ws, 1, &speech()).await;
    let msgs = until(&mut ws, |m| matches!(m, Down::ResponseEnd(_))).await;
    assert!(
        msgs.iter()
            .any(|m| matches!(m, Down::UserTranscriptionResult(_)))
    );
    server.stop().await;
}

/// Sends five 20-character questions and returns how many `ContextTruncated` came back.
async fn truncations(addr: SocketAddr) -> usize {
    let mut ws = realtime(addr, true).await;
    let mut n = 0;
    for i in 1..=5u64 {
        let question = format!("{:-<20}", format!("question {i}"));
        send(
            &mut ws,
            &ServiceBoundMessage::user_text(i, InferenceTriggerMode::Queue, &question),
        )
        .await;
        let msgs = until(&mut ws, |m| matches!(m, Down::ResponseEnd(_))).await;
        n += msgs
            .iter()
            .filter(|m| matches!(m, Down::ContextTruncated(_)))
            .count();
    }
    n
}

#[tokio::test]
async fn context_budget_from_engine_sections() {
    // Each exchange is 20 + 30 characters: with 120 the fourth and fifth questions drop one
    // exchange each.
    let server = Running::start(config("[engine]\nmax_context_chars = 120\n")).await;
    assert_eq!(truncations(server.addr).await, 2);
    server.stop().await;
    // The door's section wins over the server's: 0 is unlimited.
    let server = Running::start(config(
        "[engine]\nmax_context_chars = 120\n[realtime.engine]\nmax_context_chars = 0\n",
    ))
    .await;
    assert_eq!(truncations(server.addr).await, 0);
    server.stop().await;
}

#[tokio::test]
async fn realtime_greeting_is_said_at_session_start_unless_turned_off() {
    let server = Running::start(config(
        "[engine]\ngreeting = \"Welcome! Ask me anything.\"\n",
    ))
    .await;
    let mut ws = realtime(server.addr, true).await;
    let msgs = until(&mut ws, |m| matches!(m, Down::ResponseEnd(_))).await;
    let text: String = msgs
        .iter()
        .filter_map(|m| match m {
            Down::ModelTextFragment(f) => Some(f.text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(text, "Welcome! Ask me anything.");
    server.stop().await;

    // `greeting = ""` in the door's section turns the server's greeting off.
    let server = Running::start(config(
        "[engine]\ngreeting = \"Welcome!\"\n[realtime.engine]\ngreeting = \"\"\n",
    ))
    .await;
    let mut ws = realtime(server.addr, true).await;
    let msgs = before_pong(&mut ws).await;
    assert!(msgs.is_empty(), "{msgs:?}");
    server.stop().await;
}

// ---- xiaozhi ------------------------------------------------------------------------------

/// The demo agent and the tone synthesizer, no recognizer.
fn tone_providers() -> Providers {
    Providers {
        llm: Arc::new(DemoAgent::new()),
        asr: Arc::new(NoAsr),
        tts: Arc::new(ToneTts),
    }
}

/// A Xiaozhi device (protocol version 1) that said hello and then its wake word; returns the
/// JSON messages up to `tts stop`.
async fn wake(addr: SocketAddr) -> Vec<Value> {
    let mut ws = xiaozhi_device(addr).await;
    send_json(
        &mut ws,
        &json!({
            "type": "hello", "version": 1, "transport": "websocket",
            "audio_params": {"format": "opus", "sample_rate": 16000, "channels": 1, "frame_duration": 60}
        }),
    )
    .await;
    send_json(
        &mut ws,
        &json!({"session_id": "s", "type": "listen", "state": "detect", "text": "你好小智"}),
    )
    .await;
    let mut seen = Vec::new();
    loop {
        match next_message(&mut ws, WAIT)
            .await
            .expect("server still open")
        {
            Message::Text(t) => {
                let v: Value = serde_json::from_str(&t).unwrap();
                let stop = v["type"] == "tts" && v["state"] == "stop";
                seen.push(v);
                if stop {
                    return seen;
                }
            }
            _ => continue,
        }
    }
}

fn sentences(msgs: &[Value]) -> Vec<String> {
    msgs.iter()
        .filter(|v| v["type"] == "tts" && v["state"] == "sentence_start")
        .map(|v| v["text"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xiaozhi_greeting_on_wake_from_door_section_over_server_section() {
    let c = config(
        "[engine]\ngreeting = \"Server hello.\"\n[xiaozhi.engine]\ngreeting = \"Hi, I'm listening.\"\n",
    );
    let server = Running::start_with(c, tone_providers()).await;
    let msgs = wake(server.addr).await;
    assert_eq!(sentences(&msgs), ["Hi, I'm listening."], "{msgs:?}");
    server.stop().await;

    // Off: the wake word is only acknowledged.
    let c = config("[engine]\ngreeting = \"Server hello.\"\n[xiaozhi.engine]\ngreeting = \"\"\n");
    let server = Running::start_with(c, tone_providers()).await;
    let msgs = wake(server.addr).await;
    assert!(sentences(&msgs).is_empty(), "{msgs:?}");
    assert!(msgs.iter().any(|v| v["type"] == "stt"), "{msgs:?}");
    server.stop().await;

    // Unset: the door's own behaviour, the model's greeting.
    let server = Running::start_with(config(""), tone_providers()).await;
    let msgs = wake(server.addr).await;
    let said = sentences(&msgs);
    assert!(!said.is_empty(), "{msgs:?}");
    assert!(!said.iter().any(|s| s.contains("hello.")), "{said:?}");
    server.stop().await;
}

#[tokio::test]
async fn a_bad_engine_section_is_refused_with_its_key() {
    let err = Config::from_toml("[gemini.engine]\nendpoint_delay_ms = 60000\n").unwrap_err();
    assert!(
        err.to_string()
            .contains("[gemini.engine] endpoint_delay_ms"),
        "{err}"
    );
}

// ---- gemini -------------------------------------------------------------------------------

/// The next Gemini bridge message.
async fn gemini_recv(ws: &mut Ws) -> Value {
    match next_message(ws, WAIT).await.expect("the socket stays open") {
        Message::Text(t) => serde_json::from_str(t.as_str()).unwrap(),
        other => panic!("unexpected frame {other:?}"),
    }
}

#[tokio::test]
async fn gemini_greeting_follows_setup_complete() {
    let server = Running::start(config(
        "[engine]\ngreeting = \"Server hello.\"\n[gemini.engine]\ngreeting = \"Hello from Gemini's door.\"\n",
    ))
    .await;
    let mut ws = connect(server.addr, "/gemini").await;
    let live = json!({
        "model": "models/gemini-2.0-flash-live-001",
        "generationConfig": {"responseModalities": ["text"]}
    });
    send_json(
        &mut ws,
        &json!({"type": "CONNECT_GEMINI", "payload": {"initialConfig": live}}),
    )
    .await;
    let mut kinds = Vec::new();
    let mut text = String::new();
    loop {
        let m = gemini_recv(&mut ws).await;
        let kind = m["type"].as_str().unwrap_or_default().to_owned();
        if kind == "CONTENT_MESSAGE" {
            for p in m["payload"]["serverContent"]["modelTurn"]["parts"]
                .as_array()
                .cloned()
                .unwrap_or_default()
            {
                text.push_str(p["text"].as_str().unwrap_or_default());
            }
        }
        let done = kind == "TURN_COMPLETE";
        kinds.push(kind);
        if done {
            break;
        }
    }
    assert_eq!(
        kinds[..2],
        ["GEMINI_CONNECTED", "SETUP_COMPLETE"],
        "{kinds:?}"
    );
    assert_eq!(text, "Hello from Gemini's door.");
    server.stop().await;
}

// ---- retell -------------------------------------------------------------------------------

/// The begin message (`response_id` 0) a Retell call gets; `""` lets the caller speak first.
async fn retell_begin(addr: SocketAddr) -> String {
    let mut ws = connect(addr, "/llm-websocket/call_engine").await;
    let mut content = String::new();
    loop {
        let m = match next_message(&mut ws, WAIT)
            .await
            .expect("the socket stays open")
        {
            Message::Text(t) => serde_json::from_str::<Value>(t.as_str()).unwrap(),
            _ => continue,
        };
        if m["response_type"] == "response" && m["response_id"] == 0 {
            content.push_str(m["content"].as_str().unwrap_or_default());
            if m["content_complete"] == true {
                return content;
            }
        }
    }
}

#[tokio::test]
async fn retell_greeting_is_the_begin_message() {
    let server = Running::start(config("[engine]\ngreeting = \"Thanks for calling.\"\n")).await;
    assert_eq!(retell_begin(server.addr).await, "Thanks for calling.");
    server.stop().await;
    // The door's own begin message wins over the server's greeting, its section over both.
    let server = Running::start(config(
        "[engine]\ngreeting = \"Server.\"\n[retell]\nbegin_message = \"Retell.\"\n",
    ))
    .await;
    assert_eq!(retell_begin(server.addr).await, "Retell.");
    server.stop().await;
    let server = Running::start(config(
        "[engine]\ngreeting = \"Server.\"\n[retell]\nbegin_message = \"Retell.\"\n\
         [retell.engine]\ngreeting = \"\"\n",
    ))
    .await;
    assert_eq!(retell_begin(server.addr).await, "");
    server.stop().await;
}
