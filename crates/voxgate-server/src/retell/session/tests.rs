//! The Retell translator's decisions on a virtual clock: hand-made Retell events and provider
//! events in, frames, provider requests and closes out.

use std::time::{Duration, UNIX_EPOCH};

use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::*;
use crate::retell::InterruptRequest;
use crate::retell::registry::Registry;

const CALL: &str = "call_t";

/// A registry for the sessions (sockets) of one test's call.
fn call_state(_cfg: &RetellConfig) -> Arc<Registry> {
    Arc::new(Registry::default())
}

/// A session that claimed the test's call from `registry` (resuming it when a dropped session
/// left it), with a fixed wall clock (2023-11-14T22:13:20Z).
fn session(
    cfg: &RetellConfig,
    registry: &Arc<Registry>,
    metrics: &Arc<Metrics>,
) -> (RetellSession, mpsc::Sender<Control>) {
    let window = Duration::from_secs(cfg.resume_window_secs);
    let lease = registry
        .claim(CALL, window, || CallState::new(cfg))
        .unwrap();
    let tx = registry.control(CALL).unwrap();
    let mut s = RetellSession::new(cfg.clone(), Arc::clone(metrics), lease);
    s.wall_clock = || UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    (s, tx)
}

/// A started session on a fresh call, its control sender, the metrics and the start time.
fn started(cfg: &RetellConfig) -> (RetellSession, mpsc::Sender<Control>, Arc<Metrics>, Instant) {
    let metrics = Arc::new(Metrics::new());
    let (mut s, tx) = session(cfg, &call_state(cfg), &metrics);
    let t0 = Instant::now();
    let mut out = Out::new();
    s.on_start(t0, &mut out);
    (s, tx, metrics, t0)
}

fn json_frames(out: &mut Out) -> Vec<Value> {
    out.take_frames()
        .into_iter()
        .map(|f| match f {
            ServerFrame::Text(t) => serde_json::from_str(&t).unwrap(),
            ServerFrame::Binary(b) => panic!("binary frame {b:?}"),
        })
        .collect()
}

fn kinds(frames: &[Value]) -> Vec<&str> {
    frames
        .iter()
        .map(|f| f["response_type"].as_str().unwrap())
        .collect()
}

/// Feeds one Retell event (as JSON) to the session.
fn client(s: &mut RetellSession, now: Instant, v: &Value) -> Out {
    raw(s, now, &v.to_string())
}

fn raw(s: &mut RetellSession, now: Instant, text: &str) -> Out {
    let mut out = Out::new();
    let Inbound::Keep(msg) = RetellSession::decode(ClientFrame::Text(text.into()), 1 << 20) else {
        panic!("Retell frames are always kept");
    };
    s.on_client(now, msg, &mut out);
    out
}

fn provider(s: &mut RetellSession, now: Instant, event: ProviderEvent) -> Out {
    let mut out = Out::new();
    s.on_provider(now, event, &mut out);
    out
}

fn request(id: u64, said: &[&str]) -> Value {
    let transcript: Vec<Value> = said
        .iter()
        .enumerate()
        .map(|(i, c)| json!({"role": if i % 2 == 0 { "user" } else { "agent" }, "content": c}))
        .collect();
    json!({"interaction_type": "response_required", "response_id": id, "transcript": transcript})
}

/// The one LLM request `out` asks for: its id and context.
fn generate(out: &mut Out) -> (RequestId, Vec<ContextMessage>) {
    let mut gens: Vec<_> = out
        .take_requests()
        .into_iter()
        .filter_map(|r| match r {
            ProviderRequest::Generate { id, messages, .. } => Some((id, messages)),
            _ => None,
        })
        .collect();
    assert_eq!(gens.len(), 1, "one LLM request");
    gens.remove(0)
}

fn cancels(out: &mut Out) -> Vec<RequestId> {
    out.take_requests()
        .into_iter()
        .filter_map(|r| match r {
            ProviderRequest::Cancel { id } => Some(id),
            _ => None,
        })
        .collect()
}

fn delta(id: RequestId, text: &str) -> ProviderEvent {
    ProviderEvent::TextDelta {
        id,
        delta: text.into(),
    }
}

fn counter(metrics: &Metrics, name: &str) -> u64 {
    let key = format!("{name}{{door=\"retell\"}} ");
    metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(&key).map(|v| v.parse().unwrap()))
        .unwrap()
}

#[test]
fn the_server_speaks_first_and_a_reconnect_resumes() {
    let cfg = RetellConfig {
        begin_message: "Hello.".into(),
        agent: crate::retell::RetellAgentSettings {
            responsiveness: Some(0.5),
            ..Default::default()
        },
        ..RetellConfig::default()
    };
    let metrics = Arc::new(Metrics::new());
    let state = call_state(&cfg);
    let t0 = Instant::now();
    let (mut first, _tx) = session(&cfg, &state, &metrics);
    // Retell sends nothing before the server: the session counts as initialized at once.
    assert!(first.initialized());
    let mut out = Out::new();
    first.on_start(t0, &mut out);
    let frames = json_frames(&mut out);
    assert_eq!(kinds(&frames), ["config", "response", "update_agent"]);
    assert_eq!(frames[0]["config"]["auto_reconnect"], true);
    assert_eq!(frames[1]["response_id"], 0);
    assert_eq!(frames[1]["content"], "Hello.");
    assert_eq!(frames[1]["content_complete"], true);

    // A request is being answered when the socket drops: its LLM work is cancelled.
    let mut out = client(&mut first, t0, &request(1, &["hi"]));
    let (r1, _) = generate(&mut out);
    let mut out = Out::new();
    first.on_close(t0, &mut out);
    assert_eq!(cancels(&mut out), [r1]);
    drop(first);

    // Retell reconnects: config again, no second begin message, no second update_agent.
    let t1 = t0 + Duration::from_secs(2);
    let (mut second, _tx) = session(&cfg, &state, &metrics);
    let mut out = Out::new();
    second.on_start(t1, &mut out);
    assert_eq!(kinds(&json_frames(&mut out)), ["config"]);
    // The request the first socket never finished is answered again at once, from the start,
    // with the same context: Retell still waits for it.
    let (r, messages) = generate(&mut out);
    assert_eq!(messages.last().unwrap().content, "hi");
    // Retell asking again on the new socket is a repeat: no second LLM request.
    let mut again = client(&mut second, t1, &request(1, &["hi"]));
    assert!(again.take_requests().is_empty());
    let mut out = provider(&mut second, t1, delta(r, "Hi!"));
    let frames = json_frames(&mut out);
    assert_eq!(frames[0]["response_id"], 1);
    assert_eq!(frames[0]["content"], "Hi!");
    let mut out = provider(&mut second, t1, ProviderEvent::Done { id: r });
    let frames = json_frames(&mut out);
    assert_eq!(
        (&frames[0]["response_id"], &frames[0]["content_complete"]),
        (&json!(1), &json!(true))
    );
}

#[test]
fn model_emoji_are_not_spoken() {
    let (mut s, _tx, _m, t0) = started(&RetellConfig::default());
    let (r, _) = generate(&mut client(&mut s, t0, &request(1, &["hi"])));
    let mut spoken = String::new();
    for d in ["😊 ", "Hi ", "there ", "👋", " friend!"] {
        for f in json_frames(&mut provider(&mut s, t0, delta(r, d))) {
            spoken.push_str(f["content"].as_str().unwrap());
        }
    }
    assert_eq!(spoken, "Hi there friend!");
}

#[test]
fn begin_waits_for_call_details_when_configured() {
    let cfg = RetellConfig {
        begin_message: "Thanks for calling.".into(),
        begin_after_call_details: true,
        ..RetellConfig::default()
    };
    let (mut s, _tx, _m, t0) = started(&cfg);
    let details = json!({"interaction_type": "call_details", "call": {
        "call_id": CALL, "agent_id": "a", "call_status": "ongoing", "call_type": "web_call",
        "retell_llm_dynamic_variables": {"name": "Ada"}
    }});
    let frames = json_frames(&mut client(&mut s, t0, &details));
    assert_eq!(kinds(&frames), ["response"]);
    assert_eq!(frames[0]["response_id"], 0);
    // The call's dynamic variables fill the system prompt from now on.
    s.cfg.system_prompt = "Talking to {{name}}.".into();
    let (_, messages) = generate(&mut client(&mut s, t0, &request(1, &["hi"])));
    assert_eq!(messages[0].content, "Talking to Ada.");
}

#[test]
fn only_the_newest_request_gets_an_answer() {
    let (mut s, _tx, metrics, t0) = started(&RetellConfig::default());
    assert!(s.is_idle());
    let (r1, context) = generate(&mut client(&mut s, t0, &request(1, &["first"])));
    assert_eq!(context.last().unwrap().content, "first");
    assert!(!s.is_idle(), "a response is being streamed");
    let frames = json_frames(&mut provider(&mut s, t0, delta(r1, "Well ")));
    assert_eq!(frames[0]["response_id"], 1);
    assert_eq!(frames[0]["content_complete"], false);

    // update_only is news, not a request: response 1 goes on.
    let update = json!({"interaction_type": "update_only", "transcript": []});
    let mut out = client(&mut s, t0, &update);
    assert!(out.take_requests().is_empty());
    assert_eq!(
        json_frames(&mut provider(&mut s, t0, delta(r1, "then "))).len(),
        1
    );

    // A newer request stops response 1 at once: its LLM call is cancelled.
    let mut out = client(&mut s, t0, &request(2, &["first", "Well then", "second"]));
    assert_eq!(cancels(&mut out), [r1]);
    let mut out = client(&mut s, t0, &request(2, &["first", "Well then", "second"]));
    assert!(
        out.take_requests().is_empty(),
        "a repeated request is answered once"
    );
    let mut out = client(&mut s, t0, &request(3, &["first", "Well then", "third"]));
    let requests = out.take_requests();
    assert_eq!(
        requests.len(),
        2,
        "cancel of 2, generate of 3: {requests:?}"
    );
    let r3 = match &requests[1] {
        ProviderRequest::Generate { id, .. } => *id,
        other => panic!("{other:?}"),
    };
    // Late events of cancelled rounds say nothing.
    assert!(json_frames(&mut provider(&mut s, t0, delta(r1, "stale"))).is_empty());
    assert!(json_frames(&mut provider(&mut s, t0, ProviderEvent::Done { id: r1 })).is_empty());

    let frames = json_frames(&mut provider(&mut s, t0, delta(r3, "Third.")));
    assert_eq!(
        (
            frames[0]["response_id"].as_u64(),
            frames[0]["content"].as_str()
        ),
        (Some(3), Some("Third."))
    );
    let frames = json_frames(&mut provider(&mut s, t0, ProviderEvent::Done { id: r3 }));
    assert_eq!(kinds(&frames), ["response", "metadata"]);
    assert_eq!(frames[0]["content_complete"], true);
    assert_eq!(
        frames[1]["metadata"]["voxgate"],
        json!({"response_id": 3, "tools": []})
    );
    assert!(s.is_idle());
    assert_eq!(counter(&metrics, "voxgate_turns_total"), 1);
}

#[test]
fn tool_results_continue_the_same_response() {
    let (mut s, _tx, _m, t0) = started(&RetellConfig::default());
    let (r1, _) = generate(&mut client(&mut s, t0, &request(1, &["what time is it?"])));
    assert_eq!(
        json_frames(&mut provider(&mut s, t0, delta(r1, "Let me check."))).len(),
        1
    );
    let call = ProviderEvent::ToolCall {
        id: r1,
        call_id: "c1".into(),
        name: tools::GET_CURRENT_TIME.into(),
        arguments: json!("{}"),
    };
    let frames = json_frames(&mut provider(&mut s, t0, call));
    assert_eq!(kinds(&frames), ["tool_call_invocation", "tool_call_result"]);
    assert_eq!(frames[0]["tool_call_id"], "c1");
    assert_eq!(frames[0]["arguments"], "{}");
    let result: Value = serde_json::from_str(frames[1]["content"].as_str().unwrap()).unwrap();
    assert_eq!(result["utc"], "2023-11-14T22:13:20Z");

    // The round ends: a second round of the same response, with the call and its result.
    let mut out = provider(&mut s, t0, ProviderEvent::Done { id: r1 });
    assert!(
        json_frames(&mut out).is_empty(),
        "response 1 is not finished"
    );
    let (r2, messages) = generate(&mut out);
    let n = messages.len();
    assert_eq!(messages[n - 2].role, ChatRole::Assistant);
    assert_eq!(messages[n - 2].content, "Let me check.");
    assert_eq!(messages[n - 2].tool_calls[0].name, tools::GET_CURRENT_TIME);
    assert_eq!(messages[n - 1].role, ChatRole::Tool);
    assert_eq!(messages[n - 1].tool_call_id.as_deref(), Some("c1"));

    // The continuation is spaced from the first round's text and keeps the response id.
    let frames = json_frames(&mut provider(&mut s, t0, delta(r2, "It is late.")));
    assert_eq!(frames[0]["response_id"], 1);
    assert_eq!(frames[0]["content"], " It is late.");
    let frames = json_frames(&mut provider(&mut s, t0, ProviderEvent::Done { id: r2 }));
    assert_eq!(frames[0]["content_complete"], true);
    assert_eq!(
        frames[1]["metadata"]["voxgate"]["tools"],
        json!(["get_current_time"])
    );
}

#[test]
fn tool_rounds_and_calls_per_round_are_bounded() {
    let cfg = RetellConfig {
        max_tool_rounds: 2,
        ..RetellConfig::default()
    };
    let (mut s, _tx, _m, t0) = started(&cfg);
    let (mut r, _) = generate(&mut client(&mut s, t0, &request(1, &["loop"])));
    for round in 1..=2 {
        for i in 0..20 {
            let call = ProviderEvent::ToolCall {
                id: r,
                call_id: format!("c{round}-{i}"),
                name: tools::GET_CALL_DETAILS.into(),
                arguments: json!({}),
            };
            provider(&mut s, t0, call);
        }
        let mut out = provider(&mut s, t0, ProviderEvent::Done { id: r });
        if round == 1 {
            let (next, messages) = generate(&mut out);
            let n = messages.len();
            assert_eq!(
                messages[n - 1 - MAX_TOOL_CALLS_PER_ROUND].tool_calls.len(),
                MAX_TOOL_CALLS_PER_ROUND
            );
            r = next;
        } else {
            // The second round was the last one allowed: the response ends.
            assert!(out.take_requests().is_empty());
            let frames = json_frames(&mut out);
            assert_eq!(frames[0]["content_complete"], true);
            let used = frames[1]["metadata"]["voxgate"]["tools"]
                .as_array()
                .unwrap()
                .len();
            assert_eq!(used, 2 * MAX_TOOL_CALLS_PER_ROUND);
        }
    }
}

#[test]
fn end_call_and_transfer_finish_the_response_with_the_action() {
    let (mut s, _tx, _m, t0) = started(&RetellConfig::default());
    let (r1, _) = generate(&mut client(&mut s, t0, &request(1, &["bye"])));
    provider(&mut s, t0, delta(r1, "Thanks for calling."));
    let call = ProviderEvent::ToolCall {
        id: r1,
        call_id: "c1".into(),
        name: tools::END_CALL.into(),
        arguments: json!(r#"{"message": "Goodbye!"}"#),
    };
    assert!(
        json_frames(&mut provider(&mut s, t0, call)).is_empty(),
        "actions are not reported as tools"
    );
    // After end_call only the closing message is said.
    assert!(json_frames(&mut provider(&mut s, t0, delta(r1, "more"))).is_empty());
    let frames = json_frames(&mut provider(&mut s, t0, ProviderEvent::Done { id: r1 }));
    assert_eq!(frames[0]["content"], " Goodbye!");
    assert_eq!(frames[0]["end_call"], true);
    assert_eq!(frames[0]["content_complete"], true);
    assert_eq!(frames[1]["metadata"]["voxgate"]["end_call"], true);

    s.cfg.transfer_number = "+15550100".into();
    let (r2, _) = generate(&mut client(
        &mut s,
        t0,
        &request(2, &["bye", "x", "a human please"]),
    ));
    let call = ProviderEvent::ToolCall {
        id: r2,
        call_id: "c2".into(),
        name: tools::TRANSFER_CALL.into(),
        arguments: json!({}),
    };
    provider(&mut s, t0, call);
    let frames = json_frames(&mut provider(&mut s, t0, ProviderEvent::Done { id: r2 }));
    assert_eq!(frames[0]["transfer_number"], "+15550100");
    assert_eq!(frames[0]["content"], "");
}

#[test]
fn failures_and_unreadable_requests_get_the_apology() {
    let (mut s, _tx, metrics, t0) = started(&RetellConfig::default());
    let apology = RetellConfig::default().apology;
    let (r1, _) = generate(&mut client(&mut s, t0, &request(1, &["hi"])));
    provider(&mut s, t0, delta(r1, "Let me"));
    let failed = ProviderEvent::Failed {
        id: r1,
        message: "model unreachable".into(),
    };
    let frames = json_frames(&mut provider(&mut s, t0, failed));
    assert_eq!(frames[0]["content"], format!(" {apology}"));
    assert_eq!(frames[0]["content_complete"], true);
    assert_eq!(counter(&metrics, "voxgate_errors_total"), 1);

    // A request the codec cannot read still names its id: it gets the apology, not the LLM.
    let broken = r#"{"interaction_type":"response_required","response_id":7,"transcript":"oops"}"#;
    let mut out = raw(&mut s, t0, broken);
    assert!(out.take_requests().is_empty());
    let frames = json_frames(&mut out);
    assert_eq!(frames[0]["response_id"], 7);
    assert_eq!(frames[0]["content"], apology);
    assert_eq!(frames[0]["content_complete"], true);
    // A repeat is answered once; nothing is left owed (the apology set cannot grow).
    assert!(json_frames(&mut raw(&mut s, t0, broken)).is_empty());
    assert_eq!(s.apologize, None);
    // Unreadable frames that name no request are counted and answered with nothing.
    assert!(json_frames(&mut raw(&mut s, t0, "not json")).is_empty());
    assert!(
        json_frames(&mut raw(
            &mut s,
            t0,
            r#"{"interaction_type":"from_the_future"}"#
        ))
        .is_empty()
    );
    assert_eq!(counter(&metrics, "voxgate_errors_total"), 4);
    // The next readable request is answered by the model.
    generate(&mut client(&mut s, t0, &request(8, &["again"])));
}

#[test]
fn pings_are_echoed_and_retell_silence_closes_with_1000() {
    let (mut s, _tx, _m, t0) = started(&RetellConfig::default());
    // Before Retell's first ping no timer runs.
    assert_eq!(s.poll_timeout(), None);
    let ping = json!({"interaction_type": "ping_pong", "timestamp": 1_000});
    let frames = json_frames(&mut client(&mut s, t0, &ping));
    assert_eq!(
        frames,
        [json!({"response_type": "ping_pong", "timestamp": 1_000})]
    );
    // 3 s without a ping from Retell: a keep-alive of our own, its timestamp extrapolated.
    let keepalive = t0 + voxgate_retell::KEEPALIVE_INTERVAL;
    assert_eq!(s.poll_timeout(), Some(keepalive));
    let mut out = Out::new();
    s.on_timeout(keepalive, &mut out);
    assert_eq!(json_frames(&mut out)[0]["timestamp"], 4_000);
    // 5 s: Retell is gone; close with 1000 so it reconnects and the call resumes.
    let silent = t0 + voxgate_retell::SILENCE_TIMEOUT;
    assert_eq!(s.poll_timeout(), Some(silent));
    let mut out = Out::new();
    s.on_timeout(silent, &mut out);
    let close = out.closing().unwrap();
    assert_eq!(
        (close.code, close.reason.as_ref()),
        (close_code::NORMAL, "no ping from Retell")
    );
}

#[test]
fn control_requests_come_in_as_events() {
    let cfg = RetellConfig::default();
    let metrics = Arc::new(Metrics::new());
    let (mut s, _tx) = session(&cfg, &call_state(&cfg), &metrics);
    let t0 = Instant::now();
    let interrupt = |content: &str, interrupt_id| {
        let (reply, answer) = oneshot::channel();
        let body = InterruptRequest {
            content: content.into(),
            interrupt_id,
            ..InterruptRequest::default()
        };
        (Control::Interrupt { body, reply }, answer)
    };
    // Before the socket is attached to the call nothing can be said.
    let (c, mut answer) = interrupt("early", None);
    s.on_event(t0, Some(c), &mut Out::new());
    assert!(answer.try_recv().unwrap().is_err());

    s.on_start(t0, &mut Out::new());
    let (c, mut answer) = interrupt("Sorry to cut in.", None);
    let mut out = Out::new();
    s.on_event(t0, Some(c), &mut out);
    assert_eq!(answer.try_recv().unwrap(), Ok(1));
    let frames = json_frames(&mut out);
    assert_eq!(frames[0]["response_type"], "agent_interrupt");
    assert_eq!(frames[0]["interrupt_id"], 1);
    assert_eq!(frames[0]["no_interruption_allowed"], true);
    // Reusing an id appends to that interrupt; the next new one goes on from the highest.
    let (c, mut answer) = interrupt("More.", Some(1));
    s.on_event(t0, Some(c), &mut Out::new());
    assert_eq!(answer.try_recv().unwrap(), Ok(1));
    let (c, mut answer) = interrupt("Again.", None);
    s.on_event(t0, Some(c), &mut Out::new());
    assert_eq!(answer.try_recv().unwrap(), Ok(2));

    let (reply, mut answer) = oneshot::channel();
    let mut out = Out::new();
    let metadata = Control::Metadata {
        metadata: json!({"step": "checkout"}),
        reply,
    };
    s.on_event(t0, Some(metadata), &mut out);
    assert_eq!(answer.try_recv().unwrap(), Ok(()));
    assert_eq!(
        json_frames(&mut out)[0]["metadata"],
        json!({"step": "checkout"})
    );

    // The control channel closing (it cannot while the registry holds the call) only stops
    // the listening: the socket stays.
    let mut out = Out::new();
    s.on_event(t0, None, &mut out);
    assert!(out.closing().is_none());
    assert!(s.events().is_none());
}

#[test]
fn the_context_sent_to_the_model_is_bounded() {
    let cfg = RetellConfig {
        context_max_utterances: 5,
        ..RetellConfig::default()
    };
    let (mut s, _tx, _m, t0) = started(&cfg);
    let said: Vec<String> = (0..40).map(|i| format!("utterance {i}")).collect();
    let said: Vec<&str> = said.iter().map(String::as_str).collect();
    let (_, messages) = generate(&mut client(&mut s, t0, &request(1, &said)));
    assert_eq!(messages.len(), 6, "the system prompt and the newest five");
    assert_eq!(messages[0].role, ChatRole::System);
    assert_eq!(messages[1].content, "utterance 35");
    assert_eq!(messages[5].content, "utterance 39");
}

#[test]
fn shutdown_closes_with_1000_and_close_cancels_the_llm() {
    assert_eq!(RetellSession::SHUTDOWN_CLOSE_CODE, close_code::NORMAL);
    let (mut s, _tx, _m, t0) = started(&RetellConfig::default());
    let (r1, _) = generate(&mut client(&mut s, t0, &request(1, &["hi"])));
    // The driver waits for a response being streamed before it closes at shutdown.
    assert!(!s.is_idle());
    let mut out = Out::new();
    s.on_close(t0, &mut out);
    assert_eq!(cancels(&mut out), [r1]);
    assert!(s.is_idle());
    assert!(!s.state.tracker.is_connected());
}

#[test]
fn decode_reads_text_and_binary_json_and_refuses_oversized_frames() {
    let ping = r#"{"interaction_type":"ping_pong","timestamp":1}"#;
    let decoded = |f| match RetellSession::decode(f, 64) {
        Inbound::Keep(m) => m,
        other => panic!("{other:?}"),
    };
    assert!(matches!(
        decoded(ClientFrame::Text(ping.into())),
        Incoming::Event(_)
    ));
    let binary = ClientFrame::Binary(bytes::Bytes::from_static(ping.as_bytes()));
    assert!(matches!(decoded(binary), Incoming::Event(_)));
    let garbage = ClientFrame::Binary(bytes::Bytes::from_static(&[0xff, 0x00]));
    assert!(matches!(
        decoded(garbage),
        Incoming::Bad { request: None, .. }
    ));
    let big = ClientFrame::Text("x".repeat(65).into());
    assert!(matches!(decoded(big), Incoming::Bad { request: None, .. }));
}

#[test]
fn salvage_finds_requests_in_malformed_frames() {
    assert_eq!(
        salvage(r#"{"interaction_type":"response_required","response_id":4,"transcript":"x"}"#),
        Some((RequestKind::Response, 4))
    );
    assert_eq!(
        salvage(r#"{"interaction_type":"reminder_required","response_id":5,"transcript":7}"#),
        Some((RequestKind::Reminder, 5))
    );
    assert_eq!(salvage(r#"{"interaction_type":"response_required"}"#), None);
    assert_eq!(salvage(r#"{"interaction_type":"update_only"}"#), None);
    assert_eq!(salvage("not json"), None);
    assert!(matches!(
        decode("[1,2]"),
        Incoming::Bad { request: None, .. }
    ));
}
