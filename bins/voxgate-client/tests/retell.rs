//! The Retell client (Retell's side, via the codec's driver) against the server's custom-LLM
//! door, in-process with the demo agent.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::Running;
use voxgate_client::events::Events;
use voxgate_client::retell::{RetellOptions, run};
use voxgate_server::Config;

fn position(events: &Events, pred: impl Fn(&serde_json::Value) -> bool) -> Option<usize> {
    events.recorded().iter().position(pred)
}

#[tokio::test]
async fn utterances_get_complete_responses_with_call_details_sent() {
    let server = Running::start(Config::default()).await;
    let mut opts = RetellOptions::new(format!("ws://{}/llm-websocket/call_e2e_1", server.addr));
    opts.texts = vec!["hello there".into(), "and a second thing".into()];
    opts.timeout = Duration::from_secs(15);
    let mut events = Events::recording();
    let out = run(&opts, &mut events).await.unwrap();
    assert!(out.configured);
    assert_eq!(
        out.begin.as_deref(),
        Some(""),
        "the default begin message lets the user speak"
    );
    assert!(out.violations.is_empty(), "{:?}", out.violations);
    assert_eq!(out.responses.len(), 2, "{:?}", events.recorded());
    assert_eq!(out.responses[0].0, 1);
    assert_eq!(out.responses[1].0, 2);
    assert!(
        out.responses[0].1.contains("You said: hello there"),
        "{:?}",
        out.responses
    );
    assert!(out.responses[1].1.contains("You said: and a second thing"));
    // Retell answered the server's config with call_details (the server asks for them).
    let details = position(&events, |e| {
        e["event"] == "sent" && e["message"]["interaction_type"] == "call_details"
    })
    .expect("call_details sent");
    let request = position(&events, |e| {
        e["event"] == "sent" && e["message"]["interaction_type"] == "response_required"
    })
    .unwrap();
    assert!(details < request);
    server.stop().await;
}

#[tokio::test]
async fn a_begin_message_after_call_details_is_waited_for() {
    let mut config = Config::default();
    config.retell.begin_message = "Hi, this is voxgate.".into();
    config.retell.begin_after_call_details = true;
    let server = Running::start(config).await;
    let mut opts = RetellOptions::new(format!("ws://{}/llm-websocket/call_e2e_2", server.addr));
    opts.texts = vec!["ok".into()];
    opts.timeout = Duration::from_secs(15);
    let mut events = Events::recording();
    let out = run(&opts, &mut events).await.unwrap();
    assert_eq!(out.begin.as_deref(), Some("Hi, this is voxgate."));
    let details = position(&events, |e| {
        e["event"] == "sent" && e["message"]["interaction_type"] == "call_details"
    })
    .unwrap();
    let begin = position(&events, |e| {
        e["event"] == "agent_spoke" && e["response_id"] == 0
    })
    .unwrap();
    let asked = position(&events, |e| {
        e["event"] == "sent" && e["message"]["interaction_type"] == "response_required"
    })
    .unwrap();
    assert!(
        details < begin && begin < asked,
        "call_details, then begin, then the user"
    );
    assert_eq!(out.responses.len(), 1);
    server.stop().await;
}
