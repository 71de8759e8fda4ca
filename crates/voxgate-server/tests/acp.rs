//! The `acp` brain end to end: a real server configured from TOML with `[acp]`, the realtime
//! door over a real WebSocket, and an ACP agent process (the Rust test agent of
//! voxgate-providers, run as this test binary re-executed with `VOXGATE_ACP_TEST_AGENT=1`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../voxgate-providers/tests/acp/rust_agent.rs"]
mod rust_agent;
mod support;

use std::net::SocketAddr;
use std::time::Duration;

use futures::SinkExt;
use support::{Running, Ws, next_message, try_connect};
use tokio_tungstenite::tungstenite::Message;
use voxgate_realtime::proto::InferenceTriggerMode;
use voxgate_realtime::proto::client_bound_message::Payload as Down;
use voxgate_realtime::{AudioFormat, ClientBoundMessage, ServiceBoundMessage, SessionConfig};
use voxgate_server::Config;

/// Longer than the shared default: each session starts an agent process.
const WAIT: Duration = Duration::from_secs(20);

/// The Rust test agent's entry point, when this binary is started as an agent.
#[test]
fn acp_test_agent_main() {
    rust_agent::main_if_started_as_agent();
}

async fn recv_payload(ws: &mut Ws) -> Down {
    loop {
        if let Message::Binary(b) = next_message(ws, WAIT).await.expect("server closed") {
            return ClientBoundMessage::decode_frame(b)
                .unwrap()
                .payload
                .unwrap();
        }
    }
}

async fn session(addr: SocketAddr) -> Ws {
    let mut ws = try_connect(&format!("ws://{addr}/realtime"), &[], WAIT)
        .await
        .unwrap();
    let config = SessionConfig::new(AudioFormat::SPEECH_24K, AudioFormat::SPEECH_24K);
    let init = ServiceBoundMessage::initialize(&config).unwrap();
    ws.send(Message::Binary(init.to_frame())).await.unwrap();
    assert!(matches!(recv_payload(&mut ws).await, Down::SessionReady(_)));
    ws
}

/// Sends user text and returns the text of the response it gets.
async fn say(ws: &mut Ws, packet: u64, text: &str) -> String {
    let m = ServiceBoundMessage::user_text(packet, InferenceTriggerMode::Queue, text);
    ws.send(Message::Binary(m.to_frame())).await.unwrap();
    let mut reply = String::new();
    loop {
        match recv_payload(ws).await {
            Down::ModelTextFragment(f) => reply.push_str(&f.text),
            Down::ResponseEnd(_) => return reply,
            Down::ResponseBegin(_) | Down::InferenceComplete(_) | Down::TurnSnapshot(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
}

fn field<'a>(reply: &'a str, key: &str) -> &'a str {
    reply
        .split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {key}= in {reply:?}"))
}

fn running(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.split_whitespace().nth(2) != Some("Z"))
}

#[tokio::test]
async fn realtime_text_turns_through_the_acp_brain() {
    let exe = std::env::current_exe().unwrap();
    let toml = format!(
        "[acp]\ncommand = {exe:?}\n\
         args = [\"--exact\", \"acp_test_agent_main\", \"--nocapture\", \"--test-threads=1\"]\n\
         env = {{ VOXGATE_ACP_TEST_AGENT = \"1\", VOXGATE_ACP_TEST_ENV = \"from-config\" }}\n\
         allow = [\"kind:read\"]\n",
        exe = exe.display().to_string()
    );
    text_turns(&toml).await;
}

/// The same with the Python SDK echo agent, when `VOXGATE_ACP_PYTHON` names a Python that has
/// `agent-client-protocol` installed.
#[tokio::test]
async fn python_realtime_text_turns_through_the_acp_brain() {
    let Ok(python) = std::env::var("VOXGATE_ACP_PYTHON") else {
        eprintln!("VOXGATE_ACP_PYTHON is not set: Python SDK agent test skipped");
        return;
    };
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../voxgate-providers/tests/acp/echo_agent.py"
    );
    let toml = format!(
        "[acp]\ncommand = {python:?}\nargs = [{script:?}]\n\
         env = {{ VOXGATE_ACP_TEST_ENV = \"from-config\" }}\n\
         allow = [\"kind:read\"]\n"
    );
    text_turns(&toml).await;
}

async fn text_turns(toml: &str) {
    let server = Running::start(Config::from_toml(toml).unwrap()).await;
    let addr = server.addr;

    let mut ws = session(addr).await;
    assert_eq!(
        say(&mut ws, 1, "hello agent").await,
        "You said: hello agent"
    );
    let who = say(&mut ws, 2, "whoami").await;
    assert_eq!(field(&who, "turn"), "2", "the agent kept the conversation");
    assert_eq!(field(&who, "env"), "from-config");
    assert_eq!(
        say(&mut ws, 3, "perm read Read notes").await,
        "outcome=allow"
    );
    assert_eq!(say(&mut ws, 4, "perm execute ls").await, "outcome=reject");

    // A second session gets its own agent process.
    let mut other = session(addr).await;
    let theirs = say(&mut other, 1, "whoami").await;
    assert_eq!(field(&theirs, "turn"), "1");
    assert_ne!(field(&theirs, "pid"), field(&who, "pid"));

    // Hanging up frees the agent process.
    let pid = field(&who, "pid").to_owned();
    assert!(running(&pid));
    ws.close(None).await.unwrap();
    let t0 = std::time::Instant::now();
    while running(&pid) {
        assert!(t0.elapsed() < WAIT, "agent {pid} outlived its session");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    other.close(None).await.unwrap();
    server.stop_within(WAIT).await;
}
