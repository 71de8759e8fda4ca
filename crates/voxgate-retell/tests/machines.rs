//! Machine against machine: the driver plays Retell, the tracker plays the server, frames go
//! through real JSON encoding, and time is a virtual clock.

// The harness (outside #[test] fns) fails loudly too: any surprise is a failed test.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::time::{Duration, Instant};

use voxgate_retell::{
    AgentConfig, AgentInterrupt, BeginMessage, ConfigBody, DriverConfig, DriverInput, DriverOutput,
    EndReason, Generate, REMINDER_PROMPT, RequestKind, Response, ResponseTracker, RetellDriver,
    RetellEvent, Role, ServerEvent, ToolCallInvocation, ToolCallResult, TrackerConfig,
    TrackerError, TrackerInput, TrackerOutput, TranscriptItem, Violation,
};

const CALL_ID: &str = "call_test";

/// Both machines, the wire between them and everything they reported.
struct World {
    now: Instant,
    retell: RetellDriver,
    server: ResponseTracker,
    /// Frames from the server stop arriving (a stalled server or network).
    server_stalled: bool,
    /// Frames from Retell stop arriving.
    retell_stalled: bool,
    /// Answer every request at once with this text (None: the test answers by hand).
    auto_reply: Option<&'static str>,
    generates: Vec<Generate>,
    stops: Vec<u64>,
    spoken: Vec<(u64, String)>,
    interrupts: Vec<(u64, String)>,
    violations: Vec<Violation>,
    closes: Vec<u16>,
    ended: Option<EndReason>,
    retell_silent: usize,
    call_details: usize,
    to_server: Vec<RetellEvent>,
    to_retell: Vec<ServerEvent>,
}

impl World {
    fn new(tracker: TrackerConfig, driver: DriverConfig) -> World {
        let mut w = World {
            now: Instant::now(),
            retell: RetellDriver::new(driver),
            server: ResponseTracker::new(tracker),
            server_stalled: false,
            retell_stalled: false,
            auto_reply: None,
            generates: Vec::new(),
            stops: Vec::new(),
            spoken: Vec::new(),
            interrupts: Vec::new(),
            violations: Vec::new(),
            closes: Vec::new(),
            ended: None,
            retell_silent: 0,
            call_details: 0,
            to_server: Vec::new(),
            to_retell: Vec::new(),
        };
        w.connect();
        w
    }

    fn connect(&mut self) {
        self.retell.handle_input(self.now, DriverInput::Connected);
        self.server
            .handle_input(
                self.now,
                TrackerInput::Connected {
                    call_id: CALL_ID.into(),
                },
            )
            .unwrap();
        self.pump();
    }

    fn retell(&mut self, input: DriverInput) {
        self.retell.handle_input(self.now, input);
        self.pump();
    }

    fn app_send(&mut self, ev: ServerEvent) {
        self.server
            .handle_input(self.now, TrackerInput::Send(ev))
            .unwrap();
        self.pump();
    }

    fn reply(&mut self, id: u64, text: &str, complete: bool) {
        self.app_send(ServerEvent::Response(Response::chunk(id, text, complete)));
    }

    fn last_generate(&self) -> &Generate {
        self.generates.last().unwrap()
    }

    /// Runs both machines until neither has anything to say.
    fn pump(&mut self) {
        loop {
            let mut idle = true;
            while let Some(out) = self.retell.poll_output() {
                idle = false;
                match out {
                    DriverOutput::Send(ev) => {
                        let wire = ev.to_json().unwrap();
                        let decoded = RetellEvent::from_json(&wire).unwrap();
                        assert_eq!(decoded, ev);
                        self.to_server.push(decoded.clone());
                        if !self.retell_stalled {
                            let input = TrackerInput::Received(decoded);
                            self.server.handle_input(self.now, input).unwrap();
                        }
                    }
                    DriverOutput::AgentSpoke {
                        response_id,
                        content,
                    } => {
                        self.spoken.push((response_id, content));
                    }
                    DriverOutput::InterruptSpoken {
                        interrupt_id,
                        content,
                    } => {
                        self.interrupts.push((interrupt_id, content));
                    }
                    DriverOutput::Violation(v) => self.violations.push(v),
                    DriverOutput::Close { code } => {
                        self.closes.push(code);
                        self.server
                            .handle_input(self.now, TrackerInput::Disconnected)
                            .unwrap();
                    }
                    DriverOutput::Reconnect { .. } => {
                        // Retell dials the same URL again at once.
                        self.retell.handle_input(self.now, DriverInput::Connected);
                        let input = TrackerInput::Connected {
                            call_id: CALL_ID.into(),
                        };
                        self.server.handle_input(self.now, input).unwrap();
                    }
                    DriverOutput::CallEnded(r) => {
                        self.ended = Some(r);
                        self.server
                            .handle_input(self.now, TrackerInput::Disconnected)
                            .unwrap();
                    }
                    other => panic!("unexpected driver output {other:?}"),
                }
            }
            while let Some(out) = self.server.poll_output() {
                idle = false;
                match out {
                    TrackerOutput::Send(ev) => {
                        let wire = ev.to_json().unwrap();
                        let decoded = ServerEvent::from_json(&wire).unwrap();
                        assert_eq!(decoded, ev);
                        self.to_retell.push(decoded.clone());
                        if !self.server_stalled {
                            self.retell
                                .handle_input(self.now, DriverInput::Received(decoded));
                        }
                    }
                    TrackerOutput::Generate(g) => {
                        let id = g.response_id;
                        self.generates.push(g);
                        if let Some(text) = self.auto_reply {
                            let ev = ServerEvent::Response(Response::chunk(id, text, true));
                            self.server
                                .handle_input(self.now, TrackerInput::Send(ev))
                                .unwrap();
                        }
                    }
                    TrackerOutput::Stop { response_id } => self.stops.push(response_id),
                    TrackerOutput::CallDetails(call) => {
                        assert_eq!(call.call_id, CALL_ID);
                        self.call_details += 1;
                    }
                    TrackerOutput::Update(_) => {}
                    TrackerOutput::RetellSilent => self.retell_silent += 1,
                    other => panic!("unexpected tracker output {other:?}"),
                }
            }
            if idle {
                return;
            }
        }
    }

    /// Moves the virtual clock forward, firing every timer on the way in order.
    fn advance(&mut self, by: Duration) {
        let until = self.now + by;
        loop {
            let next = [self.retell.poll_timeout(), self.server.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            match next {
                Some(t) if t <= until => {
                    self.now = self.now.max(t);
                    self.retell.handle_timeout(self.now);
                    self.server.handle_timeout(self.now);
                    self.pump();
                }
                _ => break,
            }
        }
        self.now = until;
    }

    fn pings_from_retell(&self) -> usize {
        self.to_server
            .iter()
            .filter(|e| matches!(e, RetellEvent::PingPong(_)))
            .count()
    }
}

fn greeting() -> TrackerConfig {
    TrackerConfig {
        begin: BeginMessage::Immediately("Hi, this is Ava. How can I help?".into()),
        ..TrackerConfig::default()
    }
}

#[test]
fn config_call_details_begin_and_one_turn() {
    let mut w = World::new(greeting(), DriverConfig::default());
    assert_eq!(w.call_details, 1);
    assert_eq!(
        w.spoken,
        vec![(0, "Hi, this is Ava. How can I help?".to_string())]
    );
    assert_eq!(w.retell.server_config().auto_reconnect, Some(true));

    w.retell(DriverInput::UserSaid("I'd like a table for two".into()));
    let g = w.last_generate().clone();
    assert_eq!((g.response_id, g.kind), (1, RequestKind::Response));
    assert_eq!(g.transcript.len(), 2);
    assert_eq!(g.transcript[1].role, Role::User);
    assert_eq!(g.transcript[1].words.as_ref().unwrap().len(), 6);

    w.reply(1, "Sure, ", false);
    assert!(w.server.is_current(1));
    w.reply(1, "for what time?", true);
    assert_eq!(w.server.current_response_id(), None);
    assert_eq!(
        w.spoken.last().unwrap(),
        &(1, "Sure, for what time?".to_string())
    );
    assert_eq!(w.retell.transcript().len(), 3);
    assert!(w.violations.is_empty(), "{:?}", w.violations);
}

#[test]
fn overlapping_requests_stop_the_stale_stream() {
    let mut w = World::new(greeting(), DriverConfig::default());
    w.retell(DriverInput::UserSaid("I need a taxi".into()));
    w.reply(1, "Where would you ", false);

    // The user keeps talking: update_only alone must not make response 1 stale.
    w.retell(DriverInput::UserSpeaking("to the airport".into()));
    assert!(w.stops.is_empty());
    assert!(w.server.is_current(1));

    // A new request does.
    w.retell(DriverInput::RequestResponse);
    assert_eq!(w.stops, vec![1]);
    assert_eq!(w.last_generate().response_id, 2);
    assert_eq!(
        w.last_generate().transcript[1].content,
        "I need a taxi to the airport"
    );

    // The application raced the Stop: its late chunk is dropped, not sent, not an error.
    w.reply(1, "like to go?", true);
    assert_eq!(w.server.stats().stale_chunks_dropped, 1);
    w.reply(2, "A taxi to the airport, got it.", true);

    assert_eq!(w.spoken.iter().map(|s| s.0).collect::<Vec<_>>(), vec![0, 2]);
    assert_eq!(w.retell.stale_chunks(), 0);
    assert!(w.violations.is_empty(), "{:?}", w.violations);
    assert_eq!(w.server.stats().responses_stopped, 1);
}

#[test]
fn reminders_follow_silence_and_update_agent_changes_them() {
    use RequestKind::{Reminder, Response as Resp};
    let mut w = World::new(greeting(), DriverConfig::default());
    w.auto_reply = Some("Are you still there?");
    w.retell(DriverInput::UserSaid("hold on".into()));
    assert_eq!(w.spoken.len(), 2);

    w.advance(Duration::from_millis(9_900));
    assert_eq!(w.generates.len(), 1);
    w.advance(Duration::from_millis(200));
    let g = w.last_generate();
    assert_eq!((g.response_id, g.kind), (2, Reminder));
    assert_eq!(g.llm_transcript().last().unwrap().content, REMINDER_PROMPT);
    assert_eq!(g.transcript.len(), g.llm_transcript().len() - 1);
    assert_eq!(w.spoken.len(), 3);

    // reminder_max_count defaults to 1: silence now brings nothing more.
    w.advance(Duration::from_secs(30));
    assert_eq!(w.generates.len(), 2);

    // The server asks for up to three reminders, 5 s apart.
    w.app_send(ServerEvent::UpdateAgent(AgentConfig {
        reminder_trigger_ms: Some(5000.0),
        reminder_max_count: Some(3),
        ..AgentConfig::default()
    }));
    w.retell(DriverInput::UserSaid("sorry, I'm back".into()));
    w.advance(Duration::from_secs(60));
    let kinds: Vec<_> = w.generates.iter().map(|g| g.kind).collect();

    assert_eq!(
        kinds,
        vec![Resp, Reminder, Resp, Reminder, Reminder, Reminder]
    );
    assert!(w.violations.is_empty(), "{:?}", w.violations);
    assert!(w.closes.is_empty());
}

#[test]
fn ping_pong_keeps_a_long_call_alive() {
    let mut w = World::new(greeting(), DriverConfig::default());
    w.advance(Duration::from_secs(60));
    assert_eq!(w.pings_from_retell(), 30);
    assert_eq!(w.server.stats().pings_answered, 30);
    assert!(w.closes.is_empty());
    assert_eq!(w.retell_silent, 0);
    assert_eq!(w.retell.reconnects(), 0);
    // Every answer echoes Retell's timestamp.
    let sent: Vec<u64> = w
        .to_server
        .iter()
        .filter_map(|e| match e {
            RetellEvent::PingPong(p) => Some(p.timestamp),
            _ => None,
        })
        .collect();
    let echoed: Vec<u64> = w
        .to_retell
        .iter()
        .filter_map(|e| match e {
            ServerEvent::PingPong(p) => Some(p.timestamp),
            _ => None,
        })
        .collect();
    assert_eq!(sent, echoed);
    assert_eq!(sent[1] - sent[0], 2000);
}

#[test]
fn stalled_server_makes_retell_reconnect_and_the_call_resumes() {
    let mut w = World::new(greeting(), DriverConfig::default());
    w.retell(DriverInput::UserSaid("what are your hours".into()));
    w.reply(1, "We open at nine.", true);
    w.retell(DriverInput::UserSaid("and on weekends".into()));
    w.reply(2, "On weekends we ", false);

    // The server's frames stop reaching Retell.
    w.server_stalled = true;
    w.advance(Duration::from_millis(4_900));
    assert!(w.closes.is_empty());
    w.advance(Duration::from_millis(200));
    assert_eq!(w.closes, vec![1000]);
    assert_eq!(w.retell.reconnects(), 1);
    // The socket that asked for response 2 is gone: stop generating it.
    assert_eq!(w.stops, vec![2]);
    assert_eq!(w.server.stats().connections, 2);

    // The network heals; the same call_id resumes rather than restarts, and response 2, cut
    // off with the old socket, is generated again from its start under the same id.
    w.server_stalled = false;
    let g = w.last_generate().clone();
    assert_eq!(g.response_id, 2);
    assert_eq!(g.transcript.len(), 4, "history survives the reconnect");
    assert_eq!(w.server.stats().responses_restarted, 1);
    w.reply(2, "On weekends we open at ten.", true);
    assert_eq!(
        w.spoken.last().unwrap(),
        &(2, "On weekends we open at ten.".to_owned())
    );
    w.retell(DriverInput::RequestResponse);
    let g = w.last_generate().clone();
    assert_eq!(g.response_id, 3);
    assert_eq!(g.transcript.len(), 5);
    w.reply(3, "Anything else?", true);
    assert_eq!(w.spoken.last().unwrap().0, 3);
    // No second greeting, config sent again on the new socket.
    let begins = w
        .to_retell
        .iter()
        .filter(|e| matches!(e, ServerEvent::Response(r) if r.response_id == 0))
        .count();
    assert_eq!(begins, 1);
    let configs = w
        .to_retell
        .iter()
        .filter(|e| matches!(e, ServerEvent::Config(_)))
        .count();
    assert_eq!(configs, 2);
    assert!(w.violations.is_empty(), "{:?}", w.violations);

    // And the resumed socket stays up.
    w.advance(Duration::from_secs(20));
    assert_eq!(w.closes.len(), 1);
}

#[test]
fn retell_gives_up_after_two_reconnects() {
    let mut w = World::new(greeting(), DriverConfig::default());
    w.server_stalled = true;
    w.advance(Duration::from_secs(5));
    w.advance(Duration::from_secs(5));
    assert_eq!(w.retell.reconnects(), 2);
    assert_eq!(w.ended, None);
    w.advance(Duration::from_secs(5));
    assert_eq!(w.closes, vec![1000, 1000, 1000]);
    assert_eq!(w.ended, Some(EndReason::ServerUnresponsive));
    assert!(w.retell.is_ended());
    assert!(!w.server.is_connected());
    assert_eq!(w.retell.poll_timeout(), None);
    assert_eq!(w.server.poll_timeout(), None);
}

#[test]
fn server_notices_silent_retell_and_keeps_pinging_meanwhile() {
    let mut w = World::new(greeting(), DriverConfig::default());
    w.advance(Duration::from_secs(2)); // one ping gives the tracker Retell's clock
    let first_ts = match w
        .to_server
        .iter()
        .find(|e| matches!(e, RetellEvent::PingPong(_)))
    {
        Some(RetellEvent::PingPong(p)) => p.timestamp,
        _ => panic!("no ping"),
    };
    w.retell_stalled = true;
    w.advance(Duration::from_millis(4_999));
    assert_eq!(w.retell_silent, 0);
    assert_eq!(w.server.stats().keepalives_sent, 1);
    // Keep-alives extrapolate Retell's clock: 3 s after its ping, 3000 ms later.
    let keepalive_ts: Vec<u64> = w
        .to_retell
        .iter()
        .filter_map(|e| match e {
            ServerEvent::PingPong(p) => Some(p.timestamp),
            _ => None,
        })
        .collect();
    assert_eq!(keepalive_ts, [first_ts, first_ts + 3000]);
    w.advance(Duration::from_millis(1));
    assert_eq!(w.retell_silent, 1);
    let gives_up = w.server.retell_gives_up_at().unwrap();
    assert!(gives_up > w.now && gives_up <= w.now + Duration::from_secs(5));
}

#[test]
fn tool_calls_continue_the_same_response_and_weave_the_transcript() {
    let tracker = TrackerConfig {
        config: Some(ConfigBody {
            auto_reconnect: Some(true),
            call_details: Some(true),
            transcript_with_tool_calls: Some(true),
            ..ConfigBody::default()
        }),
        ..greeting()
    };
    let mut w = World::new(tracker, DriverConfig::default());
    w.retell(DriverInput::UserSaid("book Monday at ten".into()));
    w.reply(1, "One moment. ", false);
    w.app_send(ServerEvent::ToolCallInvocation(ToolCallInvocation {
        tool_call_id: "tc_1".into(),
        name: "book".into(),
        arguments: r#"{"day":"monday","time":"10:00"}"#.into(),
    }));
    w.app_send(ServerEvent::ToolCallResult(ToolCallResult {
        tool_call_id: "tc_1".into(),
        content: "booked".into(),
    }));
    w.reply(1, "You're booked.", true);
    assert_eq!(
        w.spoken.last().unwrap(),
        &(1, "One moment. You're booked.".to_string())
    );

    w.retell(DriverInput::UserSaid("thanks".into()));
    let items = w
        .last_generate()
        .transcript_with_tool_calls
        .clone()
        .unwrap();
    let roles: Vec<&str> = items
        .iter()
        .map(|i| match i {
            TranscriptItem::Utterance(u) => u.role.as_str(),
            TranscriptItem::ToolCallInvocation { .. } => "invocation",
            TranscriptItem::ToolCallResult { .. } => "result",
            _ => "other",
        })
        .collect();
    assert_eq!(
        roles,
        ["agent", "user", "invocation", "result", "agent", "user"]
    );
    assert!(w.violations.is_empty(), "{:?}", w.violations);
}

#[test]
fn interrupts_append_by_id_and_a_new_id_discards() {
    let mut w = World::new(greeting(), DriverConfig::default());
    let a = w.server.next_interrupt_id();
    let chunk = |id, content: &str, done| {
        ServerEvent::AgentInterrupt(AgentInterrupt {
            interrupt_id: id,
            content: content.into(),
            content_complete: done,
            no_interruption_allowed: Some(true),
            ..AgentInterrupt::default()
        })
    };
    w.app_send(chunk(a, "Please stop, ", false));
    w.app_send(chunk(a, "do not click yet!", true));
    let b = w.server.next_interrupt_id();
    w.app_send(chunk(b, "This is dropped", false));
    let c = w.server.next_interrupt_id();
    w.app_send(chunk(c, "Sorry, one more thing.", true));
    assert_eq!(
        w.interrupts,
        vec![
            (1, "Please stop, do not click yet!".to_string()),
            (3, "Sorry, one more thing.".to_string())
        ]
    );
}

#[test]
fn end_call_ends_after_the_response_is_spoken() {
    let mut w = World::new(greeting(), DriverConfig::default());
    w.retell(DriverInput::UserSaid("that's all, bye".into()));
    let mut bye = Response::chunk(1, "Goodbye!", true);
    bye.end_call = Some(true);
    w.app_send(ServerEvent::Response(bye));
    assert_eq!(w.spoken.last().unwrap().1, "Goodbye!");
    assert_eq!(w.ended, Some(EndReason::EndCallRequested));
}

#[test]
fn begin_after_call_details_like_the_node_example() {
    let tracker = TrackerConfig {
        begin: BeginMessage::AfterCallDetails("Hello from Node.".into()),
        ..TrackerConfig::default()
    };
    let w = World::new(tracker, DriverConfig::default());
    let order: Vec<&str> = w.to_retell.iter().map(ServerEvent::tag).collect();
    assert_eq!(order, ["config", "response"]);
    assert_eq!(w.call_details, 1);
    assert_eq!(w.spoken, vec![(0, "Hello from Node.".to_string())]);
}

#[test]
fn manual_begin_is_streamed_by_the_application() {
    let tracker = TrackerConfig {
        begin: BeginMessage::Manual,
        ..TrackerConfig::default()
    };
    let mut w = World::new(tracker, DriverConfig::default());
    assert_eq!(w.last_generate().kind, RequestKind::Begin);
    w.reply(0, "Good ", false);
    w.reply(0, "morning!", true);
    assert_eq!(w.spoken, vec![(0, "Good morning!".to_string())]);
}

#[test]
fn driver_reports_a_server_that_greets_again_after_resume() {
    let mut w = World::new(greeting(), DriverConfig::default());
    // A naive server that restarts the conversation on every socket.
    w.server_stalled = true;
    w.advance(Duration::from_secs(5));
    w.server_stalled = false;
    let again = ServerEvent::Response(Response::chunk(0, "Hi again!", true));
    // The tracker refuses to send it...
    let refused = w
        .server
        .handle_input(w.now, TrackerInput::Send(again.clone()));
    assert_eq!(refused, Err(TrackerError::ResponseAlreadyComplete(0)));
    // ...and a server without one is caught by the driver.
    w.retell.handle_input(w.now, DriverInput::Received(again));
    w.pump();
    assert_eq!(w.violations, vec![Violation::BeginRepeated]);
}
