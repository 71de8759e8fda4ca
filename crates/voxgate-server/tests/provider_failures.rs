//! Provider failures end to end: a real server on loopback whose `[llm]` is a local fake
//! OpenAI-compatible chat endpoint that misbehaves in one of four ways (refuses connections,
//! accepts and never answers, answers 500, cuts the SSE stream mid-reply). Every door must close
//! the failed turn in its own protocol within the configured deadline (`timeout_secs = 1`):
//! realtime `Error` then `ResponseEnd`, Gemini `TURN_COMPLETE`, Xiaozhi `tts stop`, Retell the
//! apology with `content_complete`, Bridge an error answer. And a fallback: a refusing primary
//! with a working `[llm.fallback]` answers the turn and counts one fallback.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use futures::SinkExt;
use serde_json::{Value, json};
use support::{Running, Ws, next_message, post_json, send_json, try_connect, xiaozhi_device};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;
use voxgate_realtime::proto::InferenceTriggerMode;
use voxgate_realtime::proto::client_bound_message::Payload as Down;
use voxgate_realtime::{AudioFormat, ClientBoundMessage, ServiceBoundMessage, SessionConfig};
use voxgate_server::Config;
use voxgate_server::metrics::ProviderKind;

/// How long any one wait may take; generous, since the deadline under test is 1 s.
const WAIT: Duration = Duration::from_secs(15);
/// The bound on a whole failed turn: the 1 s deadline plus slack for a loaded machine.
const TURN: Duration = Duration::from_secs(20);

/// How the fake chat endpoint misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Nothing listens on the port.
    Refuse,
    /// Accepts and reads the request, never answers.
    Hang,
    /// Answers HTTP 500.
    Error500,
    /// Starts a streamed reply, then drops the connection.
    Cut,
    /// Answers "Fallback answer." properly.
    Ok,
}

const MODES: [Mode; 4] = [Mode::Refuse, Mode::Hang, Mode::Error500, Mode::Cut];

/// One `chat.completion.chunk` event.
fn chunk(delta: &Value, finish: Option<&str>) -> String {
    let c = json!({"id": "c", "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    format!("data: {c}\n\n")
}

/// Reads one HTTP request (head and `content-length` body).
async fn read_request(s: &mut TcpStream) {
    let mut buf = Vec::new();
    let mut tmp = [0_u8; 4096];
    loop {
        let Ok(n) = s.read(&mut tmp).await else {
            return;
        };
        if n == 0 {
            return;
        }
        buf.extend_from_slice(&tmp[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                return;
            }
        }
    }
}

/// Serves one connection in `mode`.
async fn serve(mut s: TcpStream, mode: Mode) {
    read_request(&mut s).await;
    match mode {
        Mode::Refuse => {}
        Mode::Hang => {
            // Keep the connection open, silent, until the client gives up.
            let mut sink = [0_u8; 64];
            while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
        }
        Mode::Error500 => {
            let body = r#"{"error":{"message":"overloaded"}}"#;
            let r = format!(
                "HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = s.write_all(r.as_bytes()).await;
        }
        Mode::Cut => {
            let first = [
                chunk(&json!({"role": "assistant", "content": ""}), None),
                chunk(&json!({"content": "Half a "}), None),
            ]
            .concat();
            let r = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                 transfer-encoding: chunked\r\n\r\n{:x}\r\n{first}\r\n",
                first.len()
            );
            let _ = s.write_all(r.as_bytes()).await;
            let _ = s.flush().await;
            tokio::time::sleep(Duration::from_millis(100)).await;
            // Dropping the socket without the last chunk cuts the stream.
        }
        Mode::Ok => {
            let body = [
                chunk(&json!({"role": "assistant", "content": ""}), None),
                chunk(&json!({"content": "Fallback answer."}), None),
                chunk(&json!({}), Some("stop")),
                "data: [DONE]\n\n".to_owned(),
            ]
            .concat();
            let r = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\
                 connection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = s.write_all(r.as_bytes()).await;
        }
    }
}

/// A fake chat endpoint in `mode`; its API root (`http://127.0.0.1:port/v1`).
async fn fake_llm(mode: Mode) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    if mode == Mode::Refuse {
        // A port that was just free and now has no listener: connections are refused.
        drop(listener);
    } else {
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                tokio::spawn(serve(s, mode));
            }
        });
    }
    format!("http://{addr}/v1")
}

/// A server whose `[llm]` is the fake in `mode`, with 1 s deadlines.
async fn server(mode: Mode) -> Running {
    let url = fake_llm(mode).await;
    let config = Config::from_toml(&format!(
        "[llm]\nbase_url = \"{url}\"\nmodel = \"m\"\ntimeout_secs = 1\nidle_timeout_secs = 1\n"
    ))
    .unwrap();
    Running::start(config).await
}

async fn bounded<F: Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(TURN, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: the failed turn did not end in time"))
}

// ---- realtime ----------------------------------------------------------------------------

async fn rt_send(ws: &mut Ws, m: &ServiceBoundMessage) {
    ws.send(Message::Binary(m.to_frame())).await.unwrap();
}

async fn rt_recv(ws: &mut Ws) -> Down {
    loop {
        if let Message::Binary(b) = next_message(ws, WAIT).await.expect("server still open") {
            return ClientBoundMessage::decode_frame(b)
                .unwrap()
                .payload
                .unwrap();
        }
    }
}

/// One realtime text turn: every payload up to `ResponseEnd`.
async fn realtime_turn(addr: SocketAddr) -> Vec<Down> {
    let mut ws = support::connect(addr, "/realtime").await;
    let config = SessionConfig::new(AudioFormat::SPEECH_24K, AudioFormat::SPEECH_24K);
    rt_send(&mut ws, &ServiceBoundMessage::initialize(&config).unwrap()).await;
    assert!(matches!(rt_recv(&mut ws).await, Down::SessionReady(_)));
    rt_send(
        &mut ws,
        &ServiceBoundMessage::user_text(1, InferenceTriggerMode::Queue, "hello"),
    )
    .await;
    let mut seen = Vec::new();
    loop {
        let p = rt_recv(&mut ws).await;
        let end = matches!(p, Down::ResponseEnd(_));
        seen.push(p);
        if end {
            return seen;
        }
    }
}

#[tokio::test]
async fn realtime_ends_the_failed_response() {
    for mode in MODES {
        let server = server(mode).await;
        let seen = bounded("realtime", realtime_turn(server.addr)).await;
        let error = seen.iter().position(|p| matches!(p, Down::Error(_)));
        assert!(
            error.is_some(),
            "{mode:?}: an error before ResponseEnd: {seen:?}"
        );
        server.stop().await;
    }
}

#[tokio::test]
async fn a_refusing_primary_falls_back_and_counts() {
    let primary = fake_llm(Mode::Refuse).await;
    let fallback = fake_llm(Mode::Ok).await;
    let config = Config::from_toml(&format!(
        "[llm]\nbase_url = \"{primary}\"\ntimeout_secs = 1\n\
         [llm.fallback]\nbase_url = \"{fallback}\"\ntimeout_secs = 5\n"
    ))
    .unwrap();
    let server = Running::start(config).await;
    let seen = bounded("fallback", realtime_turn(server.addr)).await;
    assert!(
        !seen.iter().any(|p| matches!(p, Down::Error(_))),
        "the fallback answers: {seen:?}"
    );
    let text: String = seen
        .iter()
        .filter_map(|p| match p {
            Down::ModelTextFragment(f) => Some(f.text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(text, "Fallback answer.");
    assert_eq!(server.metrics.provider_fallbacks(ProviderKind::Llm), 1);
    let metrics = support::http(server.addr, "GET", "/metrics", &[], b"").await;
    assert!(
        metrics
            .body
            .contains("voxgate_provider_fallbacks_total{provider=\"llm\"} 1"),
        "{}",
        metrics.body
    );
    server.stop().await;
}

#[tokio::test]
async fn a_hanging_model_times_out_and_is_counted() {
    let server = server(Mode::Hang).await;
    bounded("realtime", realtime_turn(server.addr)).await;
    assert_eq!(server.metrics.provider_timeouts(ProviderKind::Llm), 1);
    server.stop().await;
}

// ---- Gemini (engine mode) ----------------------------------------------------------------

async fn json_recv(ws: &mut Ws) -> Value {
    loop {
        match next_message(ws, WAIT).await.expect("the socket stays open") {
            Message::Text(t) => return serde_json::from_str(t.as_str()).unwrap(),
            Message::Binary(_) => {}
            other => panic!("unexpected frame {other:?}"),
        }
    }
}

async fn gemini_turn(addr: SocketAddr) -> Vec<Value> {
    let mut ws = try_connect(&format!("ws://{addr}/gemini"), &[], WAIT)
        .await
        .unwrap();
    send_json(
        &mut ws,
        &json!({"type": "CONNECT_GEMINI", "payload": {"initialConfig": {
            "model": "models/gemini-2.0-flash-live-001",
            "generationConfig": {"responseModalities": ["text"]}
        }}}),
    )
    .await;
    loop {
        if json_recv(&mut ws).await["type"] == "SETUP_COMPLETE" {
            break;
        }
    }
    send_json(
        &mut ws,
        &json!({"type": "SEND_MESSAGE", "payload": {"parts": [{"text": "hello"}], "turnComplete": true}}),
    )
    .await;
    let mut seen = Vec::new();
    loop {
        let m = json_recv(&mut ws).await;
        let end = m["type"] == "TURN_COMPLETE";
        seen.push(m);
        if end {
            return seen;
        }
    }
}

#[tokio::test]
async fn gemini_completes_the_failed_turn() {
    for mode in MODES {
        let server = server(mode).await;
        let seen = bounded("gemini", gemini_turn(server.addr)).await;
        assert!(
            seen.iter().any(|m| m["type"] == "GEMINI_ERROR"),
            "{mode:?}: the failure is reported before TURN_COMPLETE: {seen:?}"
        );
        server.stop().await;
    }
}

// ---- Xiaozhi -----------------------------------------------------------------------------

async fn xiaozhi_turn(addr: SocketAddr) -> Vec<Value> {
    let mut ws = xiaozhi_device(addr).await;
    send_json(
        &mut ws,
        &json!({
            "type": "hello", "version": 1, "features": {"aec": true, "mcp": false},
            "transport": "websocket",
            "audio_params": {"format": "opus", "sample_rate": 16000, "channels": 1, "frame_duration": 60}
        }),
    )
    .await;
    assert_eq!(json_recv(&mut ws).await["type"], "hello");
    send_json(
        &mut ws,
        &json!({"session_id": "s", "type": "listen", "state": "detect", "text": "hello"}),
    )
    .await;
    let mut seen = Vec::new();
    loop {
        let m = json_recv(&mut ws).await;
        let end = m["type"] == "tts" && m["state"] == "stop";
        seen.push(m);
        if end {
            return seen;
        }
    }
}

#[tokio::test]
async fn xiaozhi_stops_the_failed_turn_with_an_error_face() {
    for mode in MODES {
        let server = server(mode).await;
        let seen = bounded("xiaozhi", xiaozhi_turn(server.addr)).await;
        let faces: Vec<&Value> = seen
            .iter()
            .filter(|m| m["type"] == "llm")
            .map(|m| &m["emotion"])
            .collect();
        if mode != Mode::Cut {
            // Nothing was said yet: the device shows the error face, never a happy one.
            assert!(
                faces.iter().all(|e| *e != "happy"),
                "{mode:?}: no happy face for a failure: {seen:?}"
            );
            assert!(
                faces.iter().any(|e| *e == "confused"),
                "{mode:?}: an error face: {seen:?}"
            );
        }
        // A cut mid-reply: the part already said stays, and `tts stop` closes the turn.
        server.stop().await;
    }
}

// ---- Retell ------------------------------------------------------------------------------

async fn retell_turn(addr: SocketAddr) -> Vec<Value> {
    let mut ws = support::connect(addr, "/llm-websocket/call_fail").await;
    send_json(
        &mut ws,
        &json!({"interaction_type": "response_required", "response_id": 1,
            "transcript": [{"role": "user", "content": "hello"}]}),
    )
    .await;
    let mut seen = Vec::new();
    loop {
        let m = json_recv(&mut ws).await;
        let end = m["response_id"] == 1 && m["content_complete"] == true;
        seen.push(m);
        if end {
            return seen;
        }
    }
}

#[tokio::test]
async fn retell_answers_the_failed_turn_with_the_apology() {
    let apology = voxgate_server::RetellConfig::default().apology;
    for mode in MODES {
        let server = server(mode).await;
        let seen = bounded("retell", retell_turn(server.addr)).await;
        let said: String = seen
            .iter()
            .filter(|m| m["response_id"] == 1)
            .filter_map(|m| m["content"].as_str())
            .collect();
        assert!(said.ends_with(&apology), "{mode:?}: {said:?} in {seen:?}");
        server.stop().await;
    }
}

// ---- Bridge ------------------------------------------------------------------------------

#[tokio::test]
async fn bridge_answers_the_failed_turn_with_an_error() {
    for mode in MODES {
        let server = server(mode).await;
        let r = bounded(
            "bridge",
            post_json(server.addr, "/api/message", &json!({"content": "hi"})),
        )
        .await;
        assert_eq!(r.status, 500, "{mode:?}: {}", r.body);
        assert_eq!(r.json()["error"], "provider_failed", "{mode:?}");
        server.stop().await;
    }
}

// ---- per-door overrides ------------------------------------------------------------------

#[tokio::test]
async fn a_door_override_replaces_the_servers_model_for_that_door_only() {
    let refusing = fake_llm(Mode::Refuse).await;
    let config = Config::from_toml(&format!(
        "[llm]\nbase_url = \"{refusing}\"\ntimeout_secs = 1\n[bridge.llm]\nprovider = \"demo\"\n"
    ))
    .unwrap();
    let server = Running::start(config).await;
    // The Bridge API has its own model: the demo agent answers.
    let r = bounded(
        "bridge",
        post_json(server.addr, "/api/message", &json!({"content": "hi"})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("You said: hi"), "{}", r.body);
    // The realtime door has none: the server's refusing model fails the turn.
    let seen = bounded("realtime", realtime_turn(server.addr)).await;
    assert!(seen.iter().any(|p| matches!(p, Down::Error(_))), "{seen:?}");
    server.stop().await;
}
