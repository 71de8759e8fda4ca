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

// ---- Bridge conversations and agent processes (issue 36) -------------------------------------
//
// Every new `session_id` on `POST /api/message` is a conversation, and with `[acp]` each
// conversation's brain is a process: the processes are capped (`[acp] max_processes`), counted
// as Bridge sessions by admission, stopped when idle (`[acp] process_idle_secs`), released when
// they crash, and killed with the server. Each check runs against the Rust test agent and,
// with `VOXGATE_ACP_PYTHON`, the Python SDK echo agent; processes are counted from outside
// (`/proc` children of this test process tagged through their environment).

/// The `[acp]` section for the Rust test agent (`python: false`) or the Python SDK agent,
/// its processes tagged `tag`, with `extra` lines; `None` when the Python agent is asked for
/// and `VOXGATE_ACP_PYTHON` is not set.
fn acp_section(python: bool, tag: &str, extra: &str) -> Option<String> {
    let (command, args, env) = if python {
        let Ok(python) = std::env::var("VOXGATE_ACP_PYTHON") else {
            eprintln!("VOXGATE_ACP_PYTHON is not set: Python SDK agent test skipped");
            return None;
        };
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../voxgate-providers/tests/acp/echo_agent.py"
        );
        (python, format!("[{script:?}]"), String::new())
    } else {
        let exe = std::env::current_exe().unwrap().display().to_string();
        (
            exe,
            "[\"--exact\", \"acp_test_agent_main\", \"--nocapture\", \"--test-threads=1\"]"
                .to_owned(),
            "VOXGATE_ACP_TEST_AGENT = \"1\", ".to_owned(),
        )
    };
    Some(format!(
        "[acp]\ncommand = {command:?}\nargs = {args}\n\
         env = {{ {env}VOXGATE_ACP_TEST_TAG = {tag:?} }}\n{extra}"
    ))
}

/// The agent processes of this test process tagged `tag`: /proc children that are not
/// zombies and have `VOXGATE_ACP_TEST_TAG=<tag>` in their environment.
fn agents_tagged(tag: &str) -> Vec<u32> {
    let me = std::process::id();
    let wanted = format!("VOXGATE_ACP_TEST_TAG={tag}");
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let mut rest = stat
            .rsplit_once(')')
            .map_or("", |(_, r)| r)
            .split_whitespace();
        let (state, ppid) = (rest.next(), rest.next().and_then(|p| p.parse::<u32>().ok()));
        if ppid != Some(me) || state == Some("Z") {
            continue;
        }
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        if environ.split(|b| *b == 0).any(|kv| kv == wanted.as_bytes()) {
            pids.push(pid);
        }
    }
    pids
}

async fn wait_agents(tag: &str, n: usize) {
    let t0 = std::time::Instant::now();
    loop {
        let now = agents_tagged(tag);
        if now.len() == n {
            return;
        }
        assert!(
            t0.elapsed() < WAIT,
            "{tag}: {} agent processes ({now:?}), expected {n}",
            now.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `POST /api/message` with `content` in conversation `session`.
async fn message(addr: SocketAddr, session: &str, content: &str) -> support::HttpResponse {
    let body = serde_json::json!({"content": content, "channel": "test", "session_id": session});
    support::post_json(addr, "/api/message", &body).await
}

fn retry_after(r: &support::HttpResponse) -> Option<u32> {
    r.head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("retry-after")
            .then(|| v.trim().parse().ok())
            .flatten()
    })
}

/// How many conversations the flood opens (`VOXGATE_ACP_FLOOD` to measure with more).
fn flood_size() -> usize {
    std::env::var("VOXGATE_ACP_FLOOD")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12)
}

async fn a_session_id_flood_gets_at_most_max_processes(python: bool, tag: &str) {
    let Some(toml) = acp_section(python, tag, "max_processes = 3\n") else {
        return;
    };
    let server = Running::start(Config::from_toml(&toml).unwrap()).await;
    let before = agents_tagged(tag).len();
    let n = flood_size();
    let mut answered = 0;
    let mut refused = 0;
    for i in 0..n {
        let r = message(server.addr, &format!("flood-{i}"), "hello").await;
        match r.status {
            200 => {
                assert_eq!(r.json()["response"], "You said: hello");
                answered += 1;
            }
            503 => {
                assert_eq!(r.json()["error"], "busy", "{}", r.body);
                assert!(r.body.contains("max_processes"), "{}", r.body);
                assert_eq!(retry_after(&r), Some(5), "{}", r.head);
                refused += 1;
            }
            other => panic!("unexpected {other}: {}", r.body),
        }
    }
    let during = agents_tagged(tag).len();
    eprintln!("{tag}: {n} new conversations: agent processes {before} before, {during} after");
    assert_eq!((answered, refused), (3, n - 3));
    assert_eq!(during, 3);
    // The conversations that have a process keep it: their next turns are answered.
    let r = message(server.addr, "flood-0", "again").await;
    assert_eq!(r.json()["response"], "You said: again", "{}", r.body);
    // Forgetting conversations (the operator's clear) ends their processes and frees places.
    let r = support::http(server.addr, "POST", "/admin/conversations/clear", &[], b"").await;
    assert_eq!(r.status, 200, "{}", r.body);
    wait_agents(tag, 0).await;
    let r = message(server.addr, "flood-new", "hello").await;
    assert_eq!(r.status, 200, "{}", r.body);
    server.stop_within(WAIT).await;
    // Stopping the server ends the agent processes it started.
    wait_agents(tag, 0).await;
}

async fn idle_agents_stop_free_their_session_and_keep_the_history(python: bool, tag: &str) {
    // One session per address: the first conversation's agent holds it.
    let extra = "process_idle_secs = 1\n[limits]\nmax_sessions_per_ip = 1\n";
    let Some(toml) = acp_section(python, tag, extra) else {
        return;
    };
    let server = Running::start(Config::from_toml(&toml).unwrap()).await;
    let r = message(server.addr, "a", "hello agent").await;
    assert_eq!(r.json()["response"], "You said: hello agent", "{}", r.body);
    // Its agent process is a session of this address: another conversation is refused.
    let r = message(server.addr, "b", "hello").await;
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(retry_after(&r), Some(5), "{}", r.head);
    assert!(
        r.body.contains("too many sessions from this address"),
        "{}",
        r.body
    );
    wait_agents(tag, 1).await;
    // A second without a turn: the process is stopped and its session given back.
    wait_agents(tag, 0).await;
    let r = message(server.addr, "b", "hello").await;
    assert_eq!(r.json()["response"], "You said: hello", "{}", r.body);
    wait_agents(tag, 0).await;
    // Conversation a's history outlived its process: the new one is told it first.
    let r = message(server.addr, "a", "recall").await;
    let recalled = r.json()["response"].as_str().unwrap_or_default().to_owned();
    assert!(
        recalled.contains("user: hello agent | assistant: You said: hello agent"),
        "{}",
        r.body
    );
    server.stop_within(WAIT).await;
    wait_agents(tag, 0).await;
}

async fn a_crashed_agent_gives_its_place_back(python: bool, tag: &str) {
    let Some(toml) = acp_section(python, tag, "max_processes = 1\n") else {
        return;
    };
    let server = Running::start(Config::from_toml(&toml).unwrap()).await;
    let r = message(server.addr, "a", "whoami").await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(message(server.addr, "b", "hello").await.status, 503);
    let r = message(server.addr, "a", "crash").await;
    assert_eq!(r.status, 500, "{}", r.body);
    wait_agents(tag, 0).await;
    let r = message(server.addr, "b", "hello").await;
    assert_eq!(r.json()["response"], "You said: hello", "{}", r.body);
    server.stop_within(WAIT).await;
    wait_agents(tag, 0).await;
}

#[tokio::test]
async fn bridge_session_id_flood_gets_at_most_max_processes() {
    a_session_id_flood_gets_at_most_max_processes(false, "srv-flood").await;
}

#[tokio::test]
async fn bridge_idle_agents_stop_free_their_session_and_keep_the_history() {
    idle_agents_stop_free_their_session_and_keep_the_history(false, "srv-idle").await;
}

#[tokio::test]
async fn bridge_crashed_agent_gives_its_place_back() {
    a_crashed_agent_gives_its_place_back(false, "srv-crash").await;
}

#[tokio::test]
async fn python_bridge_session_id_flood_gets_at_most_max_processes() {
    a_session_id_flood_gets_at_most_max_processes(true, "py-srv-flood").await;
}

#[tokio::test]
async fn python_bridge_idle_agents_stop_free_their_session_and_keep_the_history() {
    idle_agents_stop_free_their_session_and_keep_the_history(true, "py-srv-idle").await;
}

#[tokio::test]
async fn python_bridge_crashed_agent_gives_its_place_back() {
    a_crashed_agent_gives_its_place_back(true, "py-srv-crash").await;
}
