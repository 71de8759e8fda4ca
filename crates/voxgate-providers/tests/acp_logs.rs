//! The ACP brain's log lines name the server session they belong to: the agent's task runs in
//! the span that was current when the conversation was made, though its turns run elsewhere.
//!
//! A binary of its own: the log subscriber is set for this thread only, and callsites first
//! reached by tests running on other threads of the same binary could miss it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "acp/rust_agent.rs"]
mod rust_agent;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use voxgate_providers::{AcpAgent, AcpConfig, ChatMessage, Llm as _, LlmEvent, LlmRequest};

const WAIT: Duration = Duration::from_secs(20);

/// The Rust test agent's entry point, when this binary is started as an agent (see acp.rs).
#[test]
fn acp_test_agent_main() {
    rust_agent::main_if_started_as_agent();
}

/// A log sink the test reads back.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn lines_name_the_session_they_belong_to() {
    let lines = Lines::default();
    let sink = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    // This thread only: the test's single-threaded runtime runs the agent's tasks here too.
    let _default = tracing::subscriber::set_default(subscriber);
    let mut config = AcpConfig::new(
        std::env::current_exe().unwrap().display().to_string(),
        ["--exact", "acp_test_agent_main", "--nocapture"]
            .map(String::from)
            .to_vec(),
    );
    config.env = vec![("VOXGATE_ACP_TEST_AGENT".into(), "1".into())];
    let agent = AcpAgent::new(config).unwrap();
    // Made inside the server session's span, as a door's runner makes it; the turn runs
    // outside it, as the provider tasks do.
    let conversation = tracing::info_span!("session", door = "test", session = "s-42")
        .in_scope(|| agent.for_conversation().unwrap());
    let mut stream = conversation.generate(LlmRequest {
        messages: vec![ChatMessage::user("hello")],
        ..LlmRequest::default()
    });
    let mut last = None;
    while let Some(ev) = tokio::time::timeout(WAIT, stream.next()).await.unwrap() {
        last = Some(ev);
    }
    assert!(matches!(last, Some(LlmEvent::Done { .. })), "{last:?}");
    drop(conversation);

    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    for what in ["ACP agent started", "ACP session opened"] {
        let line = text
            .lines()
            .find(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no {what:?} line in:\n{text}"));
        assert!(
            line.contains(r#"session{door="test" session="s-42"}"#),
            "{line}"
        );
    }
    let opened = text
        .lines()
        .find(|l| l.contains("ACP session opened"))
        .unwrap();
    assert!(opened.contains("acp_session="), "{opened}");
    assert!(!text.contains("Some("), "values in Display form:\n{text}");
}
