//! The ACP brain against real agent processes.
//!
//! Every check runs against two agents:
//! * `rust_*` tests: `tests/acp/rust_agent.rs`, a small agent written from the spec. It runs as
//!   this very test binary re-executed with `VOXGATE_ACP_TEST_AGENT=1` (the `acp_test_agent_main`
//!   "test" then serves ACP on stdio), so these tests need nothing installed and always run.
//!   libtest's own "running 1 test" line on stdout also exercises the skipping of non-JSON lines.
//! * `python_*` tests: `tests/acp/echo_agent.py`, built with the official Python SDK
//!   (`pip install agent-client-protocol`); they run when `VOXGATE_ACP_PYTHON` names a Python
//!   that has the SDK, and are skipped (with a message) otherwise.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "acp/rust_agent.rs"]
mod rust_agent;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use voxgate_providers::{
    AcpAgent, AcpConfig, AcpPermissions, ChatMessage, FinishReason, Intent, Llm, LlmEvent,
    LlmRequest, LlmStream, ProviderError,
};

const WAIT: Duration = Duration::from_secs(20);

/// The Rust test agent's entry point, when this binary is started as an agent.
#[test]
fn acp_test_agent_main() {
    rust_agent::main_if_started_as_agent();
}

fn rust_config() -> AcpConfig {
    let mut c = AcpConfig::new(
        std::env::current_exe().unwrap().display().to_string(),
        [
            "--exact",
            "acp_test_agent_main",
            "--nocapture",
            "--test-threads=1",
        ]
        .map(String::from)
        .to_vec(),
    );
    c.env = vec![
        ("VOXGATE_ACP_TEST_AGENT".into(), "1".into()),
        ("VOXGATE_ACP_TEST_ENV".into(), "hello-env".into()),
    ];
    c
}

fn python_config() -> Option<AcpConfig> {
    let Ok(python) = std::env::var("VOXGATE_ACP_PYTHON") else {
        eprintln!("VOXGATE_ACP_PYTHON is not set: Python SDK agent test skipped");
        return None;
    };
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/acp/echo_agent.py");
    let mut c = AcpConfig::new(python, vec![script.to_owned()]);
    c.env = vec![("VOXGATE_ACP_TEST_ENV".into(), "hello-env".into())];
    Some(c)
}

fn user(text: &str) -> LlmRequest {
    LlmRequest {
        messages: vec![ChatMessage::system("ignored"), ChatMessage::user(text)],
        ..LlmRequest::default()
    }
}

async fn next(stream: &mut LlmStream) -> Option<LlmEvent> {
    tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("the ACP stream stalled")
}

/// One whole turn: the text and the last event.
async fn turn(llm: &dyn Llm, text: &str) -> (String, Vec<LlmEvent>) {
    let mut stream = llm.generate(user(text));
    let mut events = Vec::new();
    while let Some(ev) = next(&mut stream).await {
        events.push(ev);
    }
    let text = events
        .iter()
        .filter_map(|e| match e {
            LlmEvent::TextDelta(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    (text, events)
}

async fn ok_turn(llm: &dyn Llm, text: &str) -> String {
    let (reply, events) = turn(llm, text).await;
    assert!(
        matches!(
            events.last(),
            Some(LlmEvent::Done {
                finish_reason: FinishReason::Stop,
                ..
            })
        ),
        "turn {text:?} ended with {:?}",
        events.last()
    );
    reply
}

fn field<'a>(reply: &'a str, key: &str) -> &'a str {
    reply
        .split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {key}= in {reply:?}"))
}

async fn streams_text_and_keeps_the_session(mut config: AcpConfig) {
    config.cwd = Some("tests".into());
    let agent = AcpAgent::new(config).unwrap();
    let llm = agent.for_conversation().unwrap();
    let (reply, events) = turn(&*llm, "hello there voxgate").await;
    assert_eq!(reply, "You said: hello there voxgate");
    let deltas = events
        .iter()
        .filter(|e| matches!(e, LlmEvent::TextDelta(_)))
        .count();
    assert!(deltas >= 4, "streamed in chunks: {events:?}");
    let who = ok_turn(&*llm, "whoami").await;
    let expected_cwd = format!("{}/tests", env!("CARGO_MANIFEST_DIR"));
    assert_eq!(field(&who, "cwd"), expected_cwd);
    assert_eq!(field(&who, "env"), "hello-env");
    assert_eq!(field(&who, "turn"), "2");
    let again = ok_turn(&*llm, "whoami").await;
    // Same process, same session: the agent keeps the conversation.
    assert_eq!(field(&again, "turn"), "3");
    assert_eq!(field(&again, "pid"), field(&who, "pid"));
    assert_eq!(field(&again, "session"), field(&who, "session"));
    // Another conversation is another process.
    let other = agent.for_conversation().unwrap();
    let theirs = ok_turn(&*other, "whoami").await;
    assert_ne!(field(&theirs, "pid"), field(&who, "pid"));
    assert_eq!(field(&theirs, "turn"), "1");
    // Nothing new from the user: no prompt at all.
    let (text, events) = turn(
        &*llm, "", // an empty user message is not sent
    )
    .await;
    assert!(text.is_empty());
    assert_eq!(events.len(), 1);
    let after = ok_turn(&*llm, "whoami").await;
    assert_eq!(field(&after, "turn"), "4");
}

async fn answers_permissions_from_the_lists(mut config: AcpConfig) {
    config.permissions = AcpPermissions {
        allow: vec!["kind:read".into(), "title:git *".into()],
        deny: vec!["title:*push*".into()],
        prefer_always: false,
    };
    let agent = AcpAgent::new(config.clone()).unwrap();
    let llm = agent.for_conversation().unwrap();
    for (prompt, outcome) in [
        ("perm read Read the file", "allow"),
        ("perm execute git status", "allow"),
        ("perm execute git push origin", "reject"),
        ("perm edit Edit main.rs", "reject"),
        ("perm delete rm -rf /", "reject"),
    ] {
        let reply = ok_turn(&*llm, prompt).await;
        assert_eq!(reply, format!("outcome={outcome}"), "{prompt}");
    }
    config.permissions.prefer_always = true;
    let llm = AcpAgent::new(config).unwrap().for_conversation().unwrap();
    assert_eq!(ok_turn(&*llm, "perm read x").await, "outcome=always");
    // Default: everything denied.
    let mut deny_all = rust_config();
    deny_all.permissions = AcpPermissions::default();
    let llm = AcpAgent::new(deny_all).unwrap().for_conversation().unwrap();
    assert_eq!(ok_turn(&*llm, "perm read x").await, "outcome=reject");
}

async fn cancel_then_next_turn(config: AcpConfig) {
    let llm = AcpAgent::new(config).unwrap().for_conversation().unwrap();
    let mut stream = llm.generate(user("slow 300"));
    for _ in 0..3 {
        assert!(matches!(
            next(&mut stream).await,
            Some(LlmEvent::TextDelta(_))
        ));
    }
    // Barge-in: the engine drops the stream.
    drop(stream);
    let t0 = std::time::Instant::now();
    let reply = ok_turn(&*llm, "last").await;
    assert_eq!(field(&reply, "cancels"), "1");
    // The slow turn would run 9 s; the next one came right after the cancellation.
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    // A permission request that arrives after the cancellation is answered `cancelled`.
    let mut stream = llm.generate(user("lateperm"));
    assert!(matches!(
        next(&mut stream).await,
        Some(LlmEvent::TextDelta(_))
    ));
    drop(stream);
    let reply = ok_turn(&*llm, "last").await;
    assert_eq!(reply, "last=cancelled cancels=2");
    assert_eq!(ok_turn(&*llm, "still here").await, "You said: still here");
}

async fn crash_fails_the_turn_then_restarts(config: AcpConfig) {
    let llm = AcpAgent::new(config).unwrap().for_conversation().unwrap();
    let before = ok_turn(&*llm, "whoami").await;
    let (text, events) = turn(&*llm, "crash").await;
    assert_eq!(text, "dying");
    match events.last() {
        Some(LlmEvent::Error(ProviderError::Command(msg))) => {
            assert!(msg.contains("exited during the turn"), "{msg}");
        }
        other => panic!("expected a command error, got {other:?}"),
    }
    let after = ok_turn(&*llm, "whoami").await;
    assert_ne!(field(&after, "pid"), field(&before, "pid"));
    assert_eq!(field(&after, "turn"), "1", "a new process starts over");
}

async fn skips_garbage_and_refuses_client_methods(config: AcpConfig) {
    let llm = AcpAgent::new(config).unwrap().for_conversation().unwrap();
    assert_eq!(ok_turn(&*llm, "garbage").await, "fs=-32601");
    assert_eq!(ok_turn(&*llm, "fine").await, "You said: fine");
}

async fn query_uses_a_fresh_session(config: AcpConfig) {
    let llm = AcpAgent::new(config).unwrap().for_conversation().unwrap();
    let who = ok_turn(&*llm, "whoami").await;
    let request = LlmRequest {
        messages: vec![ChatMessage::user("whoami"), ChatMessage::assistant(&who)],
        intent: Intent::ConversationQuery {
            query: "what did I ask?".into(),
        },
        ..LlmRequest::default()
    };
    let mut stream = llm.generate(request);
    let mut text = String::new();
    while let Some(ev) = next(&mut stream).await {
        if let LlmEvent::TextDelta(t) = ev {
            text.push_str(&t);
        }
    }
    assert!(
        text.starts_with("You said: Here is the transcript"),
        "{text}"
    );
    assert!(text.contains("user: whoami"), "{text}");
    assert!(text.ends_with("what did I ask?"), "{text}");
    let again = ok_turn(&*llm, "whoami").await;
    assert_eq!(field(&again, "session"), field(&who, "session"));
}

#[tokio::test]
async fn rust_streams_text_and_keeps_the_session() {
    streams_text_and_keeps_the_session(rust_config()).await;
}

#[tokio::test]
async fn rust_answers_permissions_from_the_lists() {
    answers_permissions_from_the_lists(rust_config()).await;
}

#[tokio::test]
async fn rust_cancel_then_next_turn() {
    cancel_then_next_turn(rust_config()).await;
}

#[tokio::test]
async fn rust_crash_fails_the_turn_then_restarts() {
    crash_fails_the_turn_then_restarts(rust_config()).await;
}

#[tokio::test]
async fn rust_skips_garbage_and_refuses_client_methods() {
    skips_garbage_and_refuses_client_methods(rust_config()).await;
}

#[tokio::test]
async fn rust_query_uses_a_fresh_session() {
    query_uses_a_fresh_session(rust_config()).await;
}

#[tokio::test]
async fn python_streams_text_and_keeps_the_session() {
    if let Some(c) = python_config() {
        streams_text_and_keeps_the_session(c).await;
    }
}

#[tokio::test]
async fn python_answers_permissions_from_the_lists() {
    if let Some(c) = python_config() {
        answers_permissions_from_the_lists(c).await;
    }
}

#[tokio::test]
async fn python_cancel_then_next_turn() {
    if let Some(c) = python_config() {
        cancel_then_next_turn(c).await;
    }
}

#[tokio::test]
async fn python_crash_fails_the_turn_then_restarts() {
    if let Some(c) = python_config() {
        crash_fails_the_turn_then_restarts(c).await;
    }
}

#[tokio::test]
async fn python_skips_garbage_and_refuses_client_methods() {
    if let Some(c) = python_config() {
        skips_garbage_and_refuses_client_methods(c).await;
    }
}

#[tokio::test]
async fn python_query_uses_a_fresh_session() {
    if let Some(c) = python_config() {
        query_uses_a_fresh_session(c).await;
    }
}

#[tokio::test]
async fn dropping_the_conversation_kills_the_agent() {
    let agent = AcpAgent::new(rust_config()).unwrap();
    let conversation = agent.conversation();
    assert_eq!(conversation.agent_pid().await, None, "started lazily");
    ok_turn(&conversation, "hello").await;
    let pid = conversation.agent_pid().await.unwrap();
    let proc_dir = format!("/proc/{pid}");
    assert!(std::path::Path::new(&proc_dir).exists());
    drop(conversation);
    let t0 = std::time::Instant::now();
    // Gone, or a zombie until the runtime reaps it: either way no longer running.
    while std::fs::read_to_string(format!("{proc_dir}/stat"))
        .is_ok_and(|s| s.split_whitespace().nth(2) != Some("Z"))
    {
        assert!(t0.elapsed() < WAIT, "agent {pid} still running");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn start_failures_are_clear_errors() {
    assert!(matches!(
        AcpAgent::new(AcpConfig::new(" ", Vec::new())),
        Err(ProviderError::Config(_))
    ));
    let llm = AcpAgent::new(AcpConfig::new("/nonexistent/acp-agent", Vec::new()))
        .unwrap()
        .for_conversation()
        .unwrap();
    let (_, events) = turn(&*llm, "hi").await;
    assert!(
        matches!(&events[..], [LlmEvent::Error(ProviderError::Command(m))] if m.contains("cannot start")),
        "{events:?}"
    );
    // An agent that is not an ACP agent at all: exits at once.
    let llm = AcpAgent::new(AcpConfig::new("true", Vec::new()))
        .unwrap()
        .for_conversation()
        .unwrap();
    let (_, events) = turn(&*llm, "hi").await;
    assert!(
        matches!(&events[..], [LlmEvent::Error(ProviderError::Command(m))] if m.contains("exited during initialize")),
        "{events:?}"
    );
    // One that never answers: the start-up timeout.
    let mut silent = AcpConfig::new("sleep", vec!["30".into()]);
    silent.startup_timeout = Duration::from_millis(300);
    let llm = AcpAgent::new(silent).unwrap().for_conversation().unwrap();
    let (_, events) = turn(&*llm, "hi").await;
    assert!(
        matches!(
            &events[..],
            [LlmEvent::Error(ProviderError::Timeout { .. })]
        ),
        "{events:?}"
    );
}

#[tokio::test]
async fn shared_agent_generate_works_without_for_conversation() {
    let agent: Arc<dyn Llm> = Arc::new(AcpAgent::new(rust_config()).unwrap());
    assert_eq!(ok_turn(&*agent, "one").await, "You said: one");
    let who = ok_turn(&*agent, "whoami").await;
    assert_eq!(field(&who, "turn"), "2");
}

// ---- process places and idle stops (issue 36: what one client can make the server spend) ----

/// The agent processes of this test process tagged `tag` (their environment has
/// `VOXGATE_ACP_TEST_TAG=<tag>`), counted from outside: /proc children that are not zombies.
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
        // After the `(comm)`: state, ppid.
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

/// Waits until `tag`'s agent processes number `n`.
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

fn tagged(mut config: AcpConfig, tag: &str) -> AcpConfig {
    config
        .env
        .push(("VOXGATE_ACP_TEST_TAG".into(), tag.to_owned()));
    config
}

async fn places_bound_the_processes(config: AcpConfig, tag: &str) {
    let mut config = tagged(config, tag);
    config.max_processes = 2;
    let agent = AcpAgent::new(config).unwrap();
    // A flood of conversations: each wants its own process.
    let conversations: Vec<_> = (0..6).map(|_| agent.for_conversation().unwrap()).collect();
    let mut ok = 0;
    let mut busy = 0;
    for c in &conversations {
        let (text, events) = turn(&**c, "hello").await;
        match events.last() {
            Some(LlmEvent::Done { .. }) => {
                assert_eq!(text, "You said: hello");
                ok += 1;
            }
            Some(LlmEvent::Error(ProviderError::Busy(m))) => {
                assert!(m.contains("max_processes"), "{m}");
                busy += 1;
            }
            other => panic!("unexpected end {other:?}"),
        }
    }
    assert_eq!((ok, busy), (2, 4));
    assert_eq!(agent.places_taken(), 2);
    wait_agents(tag, 2).await;
    // Ending a conversation gives its place back: the next one gets a process.
    drop(conversations);
    wait_agents(tag, 0).await;
    assert_eq!(agent.places_taken(), 0);
    let again = agent.for_conversation().unwrap();
    assert_eq!(ok_turn(&*again, "back").await, "You said: back");
    wait_agents(tag, 1).await;
}

async fn idle_agents_stop_and_restart_with_the_conversation(config: AcpConfig, tag: &str) {
    let mut config = tagged(config, tag);
    config.process_idle_timeout = Some(Duration::from_millis(400));
    let agent = AcpAgent::new(config).unwrap();
    let llm = agent.for_conversation().unwrap();
    assert_eq!(ok_turn(&*llm, "hello agent").await, "You said: hello agent");
    let first = ok_turn(&*llm, "whoami").await;
    assert_eq!(agent.places_taken(), 1);
    wait_agents(tag, 1).await;
    // Nothing for longer than the idle timeout: the process is stopped, its place free.
    wait_agents(tag, 0).await;
    assert_eq!(agent.places_taken(), 0);
    // The next turn starts a new process, which gets the conversation so far first.
    let history = LlmRequest {
        messages: vec![
            ChatMessage::system("ignored"),
            ChatMessage::user("hello agent"),
            ChatMessage::assistant("You said: hello agent"),
            ChatMessage::user("whoami"),
            ChatMessage::assistant(&first),
            ChatMessage::user("recall"),
        ],
        ..LlmRequest::default()
    };
    let mut stream = llm.generate(history);
    let mut recalled = String::new();
    while let Some(ev) = next(&mut stream).await {
        if let LlmEvent::TextDelta(t) = ev {
            recalled.push_str(&t);
        }
    }
    assert!(
        recalled.contains("user: hello agent | assistant: You said: hello agent | user: whoami"),
        "{recalled}"
    );
    assert!(
        !recalled.contains("ignored"),
        "no system prompt: {recalled}"
    );
    let second = ok_turn(&*llm, "whoami").await;
    assert_ne!(field(&second, "pid"), field(&first, "pid"));
    // Only the first prompt of the new process carries the context.
    assert_eq!(field(&second, "turn"), "2");
    assert_eq!(ok_turn(&*llm, "recall").await, recalled);
    wait_agents(tag, 1).await;
}

async fn a_crash_gives_the_place_back(config: AcpConfig, tag: &str) {
    let mut config = tagged(config, tag);
    config.max_processes = 1;
    let agent = AcpAgent::new(config).unwrap();
    let crashing = agent.for_conversation().unwrap();
    let other = agent.for_conversation().unwrap();
    ok_turn(&*crashing, "hello").await;
    let (_, events) = turn(&*other, "hello").await;
    assert!(
        matches!(events.last(), Some(LlmEvent::Error(ProviderError::Busy(_)))),
        "{events:?}"
    );
    let (_, events) = turn(&*crashing, "crash").await;
    assert!(matches!(events.last(), Some(LlmEvent::Error(_))));
    wait_agents(tag, 0).await;
    assert_eq!(agent.places_taken(), 0);
    assert_eq!(ok_turn(&*other, "mine now").await, "You said: mine now");
}

/// A caller's own count (an admission permit in the server), kept while the process runs.
#[derive(Clone, Default)]
struct Holds(Arc<std::sync::atomic::AtomicUsize>);

struct Held(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Holds {
    fn now(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn reserve(&self, llm: &dyn Llm) -> Result<(), ProviderError> {
        llm.reserve_process(&mut || {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(Box::new(Held(Arc::clone(&self.0))))
        })
    }
}

async fn reservations_hold_the_place_and_the_callers_count(config: AcpConfig, tag: &str) {
    let mut config = tagged(config, tag);
    config.max_processes = 1;
    config.process_idle_timeout = Some(Duration::from_millis(400));
    let agent = AcpAgent::new(config).unwrap();
    let holds = Holds::default();
    let a = agent.for_conversation().unwrap();
    let b = agent.for_conversation().unwrap();
    holds.reserve(&*a).unwrap();
    assert_eq!((agent.places_taken(), holds.now()), (1, 1));
    // Reserving again is free while the place is held; another conversation is refused.
    holds.reserve(&*a).unwrap();
    assert_eq!(holds.now(), 1);
    assert!(matches!(holds.reserve(&*b), Err(ProviderError::Busy(_))));
    // The reserved place is the process's: the turn starts it, the count stays with it.
    ok_turn(&*a, "hello").await;
    assert_eq!((agent.places_taken(), holds.now()), (1, 1));
    wait_agents(tag, 1).await;
    // A caller's refusal leaves nothing taken.
    let refused = b.reserve_process(&mut || Err(ProviderError::Busy("admission".into())));
    assert!(matches!(refused, Err(ProviderError::Busy(_))));
    // Idle: the process stops and both counts come back.
    wait_agents(tag, 0).await;
    assert_eq!((agent.places_taken(), holds.now()), (0, 0));
    // A reservation no turn uses is given back after the idle timeout too.
    holds.reserve(&*b).unwrap();
    assert_eq!((agent.places_taken(), holds.now()), (1, 1));
    let t0 = std::time::Instant::now();
    while agent.places_taken() > 0 || holds.now() > 0 {
        assert!(t0.elapsed() < WAIT, "the reservation was never given back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn rust_places_bound_the_processes() {
    places_bound_the_processes(rust_config(), "rust-places").await;
}

#[tokio::test]
async fn rust_idle_agents_stop_and_restart_with_the_conversation() {
    idle_agents_stop_and_restart_with_the_conversation(rust_config(), "rust-idle").await;
}

#[tokio::test]
async fn rust_a_crash_gives_the_place_back() {
    a_crash_gives_the_place_back(rust_config(), "rust-crash-place").await;
}

#[tokio::test]
async fn rust_reservations_hold_the_place_and_the_callers_count() {
    reservations_hold_the_place_and_the_callers_count(rust_config(), "rust-reserve").await;
}

#[tokio::test]
async fn python_places_bound_the_processes() {
    if let Some(c) = python_config() {
        places_bound_the_processes(c, "py-places").await;
    }
}

#[tokio::test]
async fn python_idle_agents_stop_and_restart_with_the_conversation() {
    if let Some(c) = python_config() {
        idle_agents_stop_and_restart_with_the_conversation(c, "py-idle").await;
    }
}

#[tokio::test]
async fn python_a_crash_gives_the_place_back() {
    if let Some(c) = python_config() {
        a_crash_gives_the_place_back(c, "py-crash-place").await;
    }
}

#[tokio::test]
async fn python_reservations_hold_the_place_and_the_callers_count() {
    if let Some(c) = python_config() {
        reservations_hold_the_place_and_the_callers_count(c, "py-reserve").await;
    }
}
