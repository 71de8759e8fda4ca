//! OpenTelemetry export end to end: the telemetry subscriber the binary installs
//! (`voxgate_server::telemetry::install`), pointed at a real OTLP/HTTP receiver started by the
//! test (`support/otlp.rs`, decoding with the official `opentelemetry-proto` messages), sends
//! spans with their parents, trace id, attributes and service name.
//!
//! The subscriber is process-global, so this file holds one test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/otlp.rs"]
mod otlp;
mod support;

use std::collections::BTreeSet;

use std::time::Duration;

use otlp::OtlpReceiver;
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;
use tracing::Instrument as _;
use voxgate_server::config::TelemetryConfig;
use voxgate_server::metrics::Door;

/// Spans shaped like a door's session: a `session` root (its `device` known only later, as
/// after a `hello`), a `turn` inside it, and an `llm` stage run as a task of its own, as
/// providers run.
async fn a_session(session_id: &str) {
    let session = tracing::info_span!(
        "session",
        door = "xiaozhi",
        session = session_id,
        peer = "127.0.0.1:5000",
        device = tracing::field::Empty,
    );
    async {
        tracing::Span::current().record("device", "aa:bb:cc:dd:ee:ff");
        let turn = tracing::info_span!("turn", turn = 1_u64, speech = true);
        async {
            let llm = tracing::info_span!("llm", provider = "demo");
            tokio::spawn(async { tokio::task::yield_now().await }.instrument(llm))
                .await
                .unwrap();
        }
        .instrument(turn)
        .await;
    }
    .instrument(session)
    .await;
}

/// Runs one text turn on a real server's Xiaozhi door, flushes, and checks its span tree.
async fn a_real_turn(
    receiver: &OtlpReceiver,
    telemetry: voxgate_server::Telemetry,
) -> voxgate_server::Telemetry {
    let server = support::Running::start(voxgate_server::Config::default()).await;
    let mut ws = support::xiaozhi_device(server.addr).await;
    support::send_json(
        &mut ws,
        &json!({
            "type": "hello", "version": 1, "transport": "websocket",
            "audio_params": {"format": "opus", "sample_rate": 16000, "channels": 1, "frame_duration": 60}
        }),
    )
    .await;
    support::send_json(
        &mut ws,
        &json!({"session_id": "s", "type": "listen", "state": "detect", "text": "hello there"}),
    )
    .await;
    loop {
        match support::next_message(&mut ws, support::WAIT).await {
            Some(Message::Text(t)) if t.contains("\"stop\"") && t.contains("\"tts\"") => break,
            Some(_) => {}
            None => panic!("the server closed before the reply ended"),
        }
    }
    ws.close(None).await.unwrap();
    // The session span ends when the session does.
    for _ in 0..200 {
        if server.metrics.active_sessions(Door::Xiaozhi) == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.stop().await;
    let telemetry = tokio::task::spawn_blocking(move || {
        telemetry.flush().unwrap();
        telemetry
    })
    .await
    .unwrap();
    let tree = receiver
        .wait_for(|t| {
            t.named("session")
                .iter()
                .any(|s| s.attr("door") == "xiaozhi" && s.attr("session").len() == 16)
        })
        .await;
    let session = tree
        .named("session")
        .into_iter()
        .find(|s| s.attr("session").len() == 16)
        .unwrap();
    assert_eq!(session.attr("door"), "xiaozhi");
    assert_eq!(session.attr("device"), "aa:bb:cc:dd:ee:ff");
    assert!(
        session.attr("peer").starts_with("127.0.0.1:"),
        "{}",
        tree.render()
    );
    let turns: Vec<_> = tree
        .children(session)
        .into_iter()
        .filter(|c| c.name == "turn")
        .collect();
    assert_eq!(turns.len(), 1, "{}", tree.render());
    let turn = turns[0];
    assert_eq!(turn.attr("outcome"), "completed", "{}", tree.render());
    assert_eq!(turn.attr("speech"), "false");
    let stages: Vec<&str> = tree
        .children(turn)
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert!(
        stages.contains(&"llm") && stages.contains(&"tts"),
        "{stages:?}\n{}",
        tree.render()
    );
    for stage in tree.children(turn) {
        assert_eq!(stage.trace_id, session.trace_id);
        assert!(
            turn.start_unix_nanos <= stage.start_unix_nanos,
            "{} starts before its turn",
            stage.name
        );
        assert!(
            !stage.attr("first_ms").is_empty(),
            "{} has no first_ms",
            stage.name
        );
    }
    // The session's lines are events of its span.
    assert!(
        session.events.iter().any(|e| e.contains("session opened")),
        "{:?}",
        session.events
    );
    assert!(
        session.events.iter().any(|e| e.contains("session closed")),
        "{:?}",
        session.events
    );
    telemetry
}

#[tokio::test]
async fn spans_reach_an_otlp_receiver_with_parents_and_attributes() {
    let receiver = OtlpReceiver::start().await;
    let config = TelemetryConfig {
        otlp_endpoint: Some(receiver.endpoint()),
        service_name: "voxgate-test".into(),
        ..TelemetryConfig::default()
    };
    let telemetry = voxgate_server::telemetry::install(&config).unwrap();
    assert_eq!(
        telemetry.traces_url(),
        Some(format!("{}/v1/traces", receiver.endpoint()).as_str())
    );

    a_session("s-1").await;
    // Not exported: below INFO, and the export machinery's own targets.
    tracing::debug_span!("noise").in_scope(|| {});
    tracing::info_span!(target: "hyper_util::client", "connect").in_scope(|| {});

    // Flushing blocks until the receiver answers, and the receiver runs on this runtime.
    let telemetry = tokio::task::spawn_blocking(move || {
        telemetry.flush().unwrap();
        telemetry
    })
    .await
    .unwrap();
    let tree = receiver.wait_for_spans(3).await;
    assert_eq!(
        tree.shape(),
        "session\n  turn\n    llm\n",
        "{}",
        tree.render()
    );
    assert_eq!(tree.child_names("session"), ["turn"]);
    assert_eq!(tree.child_names("turn"), ["llm"]);

    let session = tree.one("session");
    let turn = tree.path(&["session", "turn"]);
    let llm = tree.path(&["session", "turn", "llm"]);
    assert_eq!(session.parent_span_id, None);
    assert_eq!(tree.parent_of(turn), Some(session));
    assert_eq!(tree.parent_of(llm), Some(turn));
    let traces: BTreeSet<&str> = tree.spans().iter().map(|s| s.trace_id.as_str()).collect();
    assert_eq!(traces.len(), 1, "one trace: {traces:?}");
    assert_eq!(session.trace_id.len(), 32);
    assert_ne!(session.trace_id, "0".repeat(32));

    assert_eq!(session.attr("door"), "xiaozhi");
    assert_eq!(session.attr("session"), "s-1");
    assert_eq!(session.attr("peer"), "127.0.0.1:5000");
    assert_eq!(
        session.attr("device"),
        "aa:bb:cc:dd:ee:ff",
        "a field recorded after the span began"
    );
    assert_eq!(turn.attr("turn"), "1");
    assert_eq!(turn.attr("speech"), "true");
    assert_eq!(llm.attr("provider"), "demo");
    for span in tree.spans() {
        assert_eq!(span.service_name.as_deref(), Some("voxgate-test"));
        assert_eq!(span.scope, "voxgate-server");
        assert!(span.start_unix_nanos > 0 && span.start_unix_nanos <= span.end_unix_nanos);
        assert!(!span.error);
    }
    // A child lies within its parent.
    for (child, parent) in [(turn, session), (llm, turn)] {
        assert!(
            parent.start_unix_nanos <= child.start_unix_nanos
                && child.end_unix_nanos <= parent.end_unix_nanos,
            "{} outside {}",
            child.name,
            parent.name
        );
    }

    // The real thing: a Xiaozhi device's text turn on a server (demo agent, embedded
    // synthesizer) makes a session span with the device, a turn and its llm and tts stages.
    let telemetry = a_real_turn(&receiver, telemetry).await;

    // A second session is a trace of its own; shutting down sends it without a flush.
    a_session("s-2").await;
    tokio::task::spawn_blocking(move || telemetry.shutdown())
        .await
        .unwrap()
        .unwrap();
    let tree = receiver.wait_for(|t| t.named("session").len() >= 3).await;
    let sessions: Vec<_> = tree
        .named("session")
        .into_iter()
        .filter(|s| s.attr("session").starts_with("s-"))
        .collect();
    assert_eq!(sessions.len(), 2, "{}", tree.render());
    assert_ne!(sessions[0].trace_id, sessions[1].trace_id);
    assert_eq!(sessions[1].attr("session"), "s-2");
    for s in sessions {
        let turns = tree.children(s);
        assert_eq!(turns.len(), 1);
        let stages: Vec<&str> = tree
            .children(turns[0])
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(stages, ["llm"]);
    }
    assert!(tree.named("noise").is_empty() && tree.named("connect").is_empty());
    assert_eq!(receiver.requests().1, 0, "no export was refused");
    receiver.stop().await;
}
