//! The Retell side: a sans-IO driver that plays Retell against any custom-LLM server, for test
//! tools and interop checks.

use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use crate::call::Call;
use crate::retell_event::{
    CallDetails, PingPong, ResponseRequest, RetellEvent, UnknownEvent, UpdateOnly,
};
use crate::server_event::{ConfigBody, Response, ServerEvent};
use crate::tracker::{PING_INTERVAL, SILENCE_TIMEOUT};
use crate::transcript::{Role, TranscriptItem, TurnTaking, Utterance, Word};

/// How the simulated Retell behaves.
#[derive(Debug, Clone, PartialEq)]
pub struct DriverConfig {
    /// The call object sent when the server's config asks for call details.
    pub call: Call,
    /// Wall-clock milliseconds since the Unix epoch at the first `Connected`; ping timestamps
    /// count on from it (the driver never reads a clock).
    pub epoch_ms: u64,
    /// Ping cadence once `auto_reconnect` is on.
    pub ping_interval: Duration,
    /// Silence from the server after which the socket is closed.
    pub silence_timeout: Duration,
    /// Reconnects allowed after a close (Retell: 2).
    pub max_reconnects: u32,
    /// User silence after agent speech before a reminder is asked for; `None` disables.
    pub reminder_trigger: Option<Duration>,
    /// Reminders in a row at most.
    pub reminder_max_count: u32,
    /// Seconds each generated word lasts in the synthetic word timings.
    pub seconds_per_word: f64,
}

impl Default for DriverConfig {
    fn default() -> Self {
        DriverConfig {
            call: Call {
                call_id: "call_test".into(),
                agent_id: "agent_test".into(),
                call_status: "registered".into(),
                call_type: crate::CallType::WebCall,
                ..Call::default()
            },
            epoch_ms: 1_700_000_000_000,
            ping_interval: PING_INTERVAL,
            silence_timeout: SILENCE_TIMEOUT,
            max_reconnects: 2,
            reminder_trigger: Some(Duration::from_secs(10)),
            reminder_max_count: 1,
            seconds_per_word: 0.3,
        }
    }
}

/// What the driver is fed.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum DriverInput {
    /// The socket to the server is open (first time or after a [`DriverOutput::Reconnect`]).
    Connected,
    /// The socket closed, from either side.
    Disconnected,
    /// An event decoded from the server (see [`ServerEvent::from_json`], which also accepts
    /// the pre-2024 untagged form).
    Received(ServerEvent),
    /// The user says more: appended to the current user utterance (or a new one), announced
    /// with `update_only`. No response is requested yet.
    UserSpeaking(String),
    /// Ask for a response to the transcript so far (`response_required` with a new id).
    RequestResponse,
    /// Shorthand for [`DriverInput::UserSpeaking`] then [`DriverInput::RequestResponse`].
    UserSaid(String),
}

/// Why the simulated call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EndReason {
    /// A response with `end_call` was fully spoken.
    EndCallRequested,
    /// The server stayed silent or dropped the socket more often than reconnects allow.
    ServerUnresponsive,
    /// The server closed the socket and `auto_reconnect` is off.
    ServerClosed,
}

/// A way the server broke the protocol, as seen by Retell.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// A response for an id that was never requested.
    UnknownResponseId(u64),
    /// Content after `content_complete: true` for the same id.
    ContentAfterComplete(u64),
    /// The begin message (`response_id` 0) again, e.g. after a reconnect that should resume.
    BeginRepeated,
    /// A `tool_call_result` without a matching `tool_call_invocation`.
    ToolResultWithoutInvocation(String),
}

/// Everything the driver may hand to its caller.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum DriverOutput {
    /// Send this event to the server as a text frame.
    Send(RetellEvent),
    /// A response finished and would be spoken (stale responses never get here).
    AgentSpoke {
        /// The response id (0 for the begin message).
        response_id: u64,
        /// The whole text.
        content: String,
    },
    /// An agent interrupt finished and would be spoken.
    InterruptSpoken {
        /// The server's interrupt id.
        interrupt_id: u64,
        /// The whole text.
        content: String,
    },
    /// Transfer the call, after the response that asked for it.
    Transfer {
        /// The number.
        number: String,
    },
    /// Press DTMF digits, after the response that asked for it.
    PressDigits {
        /// The digits.
        digits: String,
    },
    /// The server sent `metadata` for the frontend.
    Metadata(Option<serde_json::Value>),
    /// The server sent an event type this crate does not know.
    Unknown(UnknownEvent),
    /// The server broke the protocol.
    Violation(Violation),
    /// Close the socket with this code (Retell closes with 1000 after ping silence).
    Close {
        /// WebSocket close code.
        code: u16,
    },
    /// Open a new socket to the same URL, then feed [`DriverInput::Connected`].
    Reconnect {
        /// 1 for the first reconnect.
        attempt: u32,
    },
    /// The call is over; the driver ignores further input.
    CallEnded(EndReason),
}

#[derive(Debug, Clone, Default)]
struct Streaming {
    id: u64,
    text: String,
    transfer_number: Option<String>,
    digit_to_press: Option<String>,
    end_call: bool,
}

/// Retell's half of one call.
#[derive(Debug)]
pub struct RetellDriver {
    cfg: DriverConfig,
    start: Option<Instant>,
    connected: bool,
    ended: bool,
    reconnects: u32,
    server_config: ConfigBody,
    items: Vec<TranscriptItem>,
    /// Ids requested so far; the highest is the only one whose answer is used.
    last_requested: Option<u64>,
    /// What the latest request asked for, to ask again after a reconnect.
    last_kind: RequestKindWire,
    streaming: Option<Streaming>,
    completed: BTreeSet<u64>,
    begin_done: bool,
    details_sent: bool,
    interrupt: Option<(u64, String)>,
    tool_calls: BTreeSet<String>,
    last_ping_sent: Option<Instant>,
    last_heard: Option<Instant>,
    reminder_at: Option<Instant>,
    reminders_in_a_row: u32,
    user_speaking: bool,
    stale_chunks: u64,
    out: VecDeque<DriverOutput>,
}

impl RetellDriver {
    /// A driver before its first connection.
    pub fn new(cfg: DriverConfig) -> Self {
        RetellDriver {
            cfg,
            start: None,
            connected: false,
            ended: false,
            reconnects: 0,
            server_config: ConfigBody::default(),
            items: Vec::new(),
            last_requested: None,
            last_kind: RequestKindWire::Response,
            streaming: None,
            completed: BTreeSet::new(),
            begin_done: false,
            details_sent: false,
            interrupt: None,
            tool_calls: BTreeSet::new(),
            last_ping_sent: None,
            last_heard: None,
            reminder_at: None,
            reminders_in_a_row: 0,
            user_speaking: false,
            stale_chunks: 0,
            out: VecDeque::new(),
        }
    }

    /// Feeds one input at time `now`.
    pub fn handle_input(&mut self, now: Instant, input: DriverInput) {
        if self.ended {
            return;
        }
        match input {
            DriverInput::Connected => self.on_connected(now),
            DriverInput::Disconnected => self.on_disconnected(),
            DriverInput::Received(ev) => self.on_received(now, ev),
            DriverInput::UserSpeaking(text) => self.user_speaking(now, &text),
            DriverInput::RequestResponse => self.request(RequestKindWire::Response),
            DriverInput::UserSaid(text) => {
                self.user_speaking(now, &text);
                self.request(RequestKindWire::Response);
            }
        }
    }

    /// Fires the timers due at `now`: pings, the silence check and reminders.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.ended || !self.connected {
            return;
        }
        if self.pinging() {
            if let Some(heard) = self.last_heard
                && now >= heard + self.cfg.silence_timeout
            {
                self.out.push_back(DriverOutput::Close { code: 1000 });
                self.lost_connection();
                return;
            }
            if let Some(sent) = self.last_ping_sent
                && now >= sent + self.cfg.ping_interval
            {
                self.send_ping(now);
            }
        }
        if let Some(at) = self.reminder_at
            && now >= at
        {
            self.reminder_at = None;
            self.reminders_in_a_row += 1;
            self.request(RequestKindWire::Reminder);
        }
    }

    /// The next thing to do, if any.
    pub fn poll_output(&mut self) -> Option<DriverOutput> {
        self.out.pop_front()
    }

    /// When [`Self::handle_timeout`] must next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.ended || !self.connected {
            return None;
        }
        let mut next = self.reminder_at;
        if self.pinging() {
            for t in [
                self.last_ping_sent.map(|t| t + self.cfg.ping_interval),
                self.last_heard.map(|t| t + self.cfg.silence_timeout),
            ]
            .into_iter()
            .flatten()
            {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        }
        next
    }

    /// The transcript as Retell would send it now.
    pub fn transcript(&self) -> Vec<Utterance> {
        self.items
            .iter()
            .filter_map(|i| match i {
                TranscriptItem::Utterance(u) => Some(u.clone()),
                _ => None,
            })
            .collect()
    }

    /// The transcript woven with the server's tool calls.
    pub fn transcript_with_tool_calls(&self) -> &[TranscriptItem] {
        &self.items
    }

    /// The config the server sent last (all `None` before one arrives).
    pub fn server_config(&self) -> &ConfigBody {
        &self.server_config
    }

    /// The newest `response_id` requested, if any.
    pub fn last_requested(&self) -> Option<u64> {
        self.last_requested
    }

    /// Reconnects so far.
    pub fn reconnects(&self) -> u32 {
        self.reconnects
    }

    /// Chunks that arrived for responses already superseded (harmless, but a sign the server
    /// does not stop stale streams).
    pub fn stale_chunks(&self) -> u64 {
        self.stale_chunks
    }

    /// Whether the call is over.
    pub fn is_ended(&self) -> bool {
        self.ended
    }

    fn pinging(&self) -> bool {
        self.server_config.auto_reconnect == Some(true)
    }

    fn elapsed_secs(&self, now: Instant) -> f64 {
        self.start
            .map_or(0.0, |s| now.saturating_duration_since(s).as_secs_f64())
    }

    fn send(&mut self, ev: RetellEvent) {
        self.out.push_back(DriverOutput::Send(ev));
    }

    fn send_ping(&mut self, now: Instant) {
        self.last_ping_sent = Some(now);
        let ms = self.start.map_or(0, |s| {
            u64::try_from(now.saturating_duration_since(s).as_millis()).unwrap_or(0)
        });
        self.send(RetellEvent::PingPong(PingPong {
            timestamp: self.cfg.epoch_ms.saturating_add(ms),
        }));
    }

    fn on_connected(&mut self, now: Instant) {
        let reconnect = self.start.is_some();
        self.start.get_or_insert(now);
        self.connected = true;
        // The call keeps its config across reconnects (so pinging resumes at once); the
        // server may still send a new one, and call details go out once per socket.
        self.details_sent = false;
        self.last_ping_sent = self.pinging().then_some(now);
        self.last_heard = Some(now);
        if reconnect
            && let Some(id) = self.last_requested
            && !self.completed.contains(&id)
        {
            // The answer was cut off with the old socket and is still wanted: ask again
            // under the same id (a server that resumes the call may already be answering it
            // again; one that does not starts now). Its chunks count from the start.
            self.send_request(id, self.last_kind);
        }
    }

    fn on_disconnected(&mut self) {
        if !self.connected {
            return;
        }
        self.lost_connection();
    }

    fn lost_connection(&mut self) {
        let auto = self.pinging();
        self.connected = false;
        // Whatever was streaming on the old socket is lost; a new request follows on the next.
        self.streaming = None;
        self.reminder_at = None;
        if auto && self.reconnects < self.cfg.max_reconnects {
            self.reconnects += 1;
            self.out.push_back(DriverOutput::Reconnect {
                attempt: self.reconnects,
            });
        } else {
            self.end(if auto {
                EndReason::ServerUnresponsive
            } else {
                EndReason::ServerClosed
            });
        }
    }

    fn end(&mut self, reason: EndReason) {
        self.ended = true;
        self.connected = false;
        self.out.push_back(DriverOutput::CallEnded(reason));
    }

    fn twtc(&self) -> Option<Vec<TranscriptItem>> {
        (self.server_config.transcript_with_tool_calls == Some(true)).then(|| self.items.clone())
    }

    fn user_speaking(&mut self, now: Instant, text: &str) {
        self.reminder_at = None;
        self.reminders_in_a_row = 0;
        let mut t = self.elapsed_secs(now);
        let words: Vec<Word> = text
            .split_whitespace()
            .map(|w| {
                // Millisecond precision, like Retell's own timings (and exact through JSON).
                let start = (t * 1000.0).round() / 1000.0;
                t += self.cfg.seconds_per_word;
                Word {
                    word: w.into(),
                    start,
                    end: (t * 1000.0).round() / 1000.0,
                }
            })
            .collect();
        let turn_starts = !self.user_speaking;
        match self.items.last_mut() {
            Some(TranscriptItem::Utterance(u)) if u.role == Role::User && self.user_speaking => {
                if !u.content.is_empty() {
                    u.content.push(' ');
                }
                u.content.push_str(text);
                u.words.get_or_insert_with(Vec::new).extend(words);
            }
            _ => self.items.push(TranscriptItem::Utterance(Utterance {
                role: Role::User,
                content: text.to_owned(),
                words: Some(words),
            })),
        }
        self.user_speaking = true;
        if self.connected {
            let ev = RetellEvent::UpdateOnly(UpdateOnly {
                transcript: self.transcript(),
                transcript_with_tool_calls: self.twtc(),
                turntaking: turn_starts.then_some(TurnTaking::UserTurn),
            });
            self.send(ev);
        }
    }

    fn request(&mut self, kind: RequestKindWire) {
        if !self.connected {
            return;
        }
        let id = self.last_requested.map_or(1, |i| i + 1);
        self.last_requested = Some(id);
        self.last_kind = kind;
        self.send_request(id, kind);
    }

    fn send_request(&mut self, id: u64, kind: RequestKindWire) {
        self.streaming = None;
        let body = ResponseRequest {
            response_id: id,
            transcript: self.transcript(),
            transcript_with_tool_calls: self.twtc(),
        };
        self.send(match kind {
            RequestKindWire::Response => RetellEvent::ResponseRequired(body),
            RequestKindWire::Reminder => RetellEvent::ReminderRequired(body),
        });
    }

    fn on_received(&mut self, now: Instant, ev: ServerEvent) {
        if !self.connected {
            return;
        }
        self.last_heard = Some(now);
        match ev {
            ServerEvent::Config(c) => {
                let was_pinging = self.pinging();
                let details = c.call_details == Some(true) && !self.details_sent;
                self.server_config = c;
                if details {
                    self.details_sent = true;
                    self.send(RetellEvent::CallDetails(Box::new(CallDetails {
                        call: self.cfg.call.clone(),
                    })));
                }
                if self.pinging() && !was_pinging {
                    self.last_ping_sent = Some(now);
                }
            }
            ServerEvent::UpdateAgent(a) => {
                if let Some(ms) = a.reminder_trigger_ms {
                    self.cfg.reminder_trigger =
                        Duration::try_from_secs_f64(ms.max(0.0) / 1000.0).ok();
                }
                if let Some(n) = a.reminder_max_count {
                    self.cfg.reminder_max_count = u32::try_from(n).unwrap_or(u32::MAX);
                }
            }
            ServerEvent::PingPong(_) => {}
            ServerEvent::Response(r) => self.on_response(now, r),
            ServerEvent::AgentInterrupt(a) => {
                let text = match self.interrupt.take() {
                    Some((id, mut text)) if id == a.interrupt_id => {
                        text.push_str(&a.content);
                        text
                    }
                    _ => a.content,
                };
                if a.content_complete {
                    self.user_speaking = false;
                    self.items.push(TranscriptItem::Utterance(Utterance::new(
                        Role::Agent,
                        text.clone(),
                    )));
                    self.out.push_back(DriverOutput::InterruptSpoken {
                        interrupt_id: a.interrupt_id,
                        content: text,
                    });
                } else {
                    self.interrupt = Some((a.interrupt_id, text));
                }
            }
            ServerEvent::ToolCallInvocation(t) => {
                self.tool_calls.insert(t.tool_call_id.clone());
                self.items.push(TranscriptItem::ToolCallInvocation {
                    tool_call_id: t.tool_call_id,
                    name: t.name,
                    arguments: t.arguments,
                });
            }
            ServerEvent::ToolCallResult(t) => {
                if !self.tool_calls.contains(&t.tool_call_id) {
                    self.violation(Violation::ToolResultWithoutInvocation(
                        t.tool_call_id.clone(),
                    ));
                }
                self.items.push(TranscriptItem::ToolCallResult {
                    tool_call_id: t.tool_call_id,
                    content: t.content,
                });
            }
            ServerEvent::Metadata(m) => self.out.push_back(DriverOutput::Metadata(m.metadata)),
            ServerEvent::Unknown(u) => self.out.push_back(DriverOutput::Unknown(u)),
        }
    }

    fn violation(&mut self, v: Violation) {
        self.out.push_back(DriverOutput::Violation(v));
    }

    fn on_response(&mut self, now: Instant, r: Response) {
        let id = r.response_id;
        if id == 0 {
            if self.begin_done {
                self.violation(Violation::BeginRepeated);
                return;
            }
        } else if self.last_requested.is_none_or(|last| id > last) {
            self.violation(Violation::UnknownResponseId(id));
            return;
        } else if self.completed.contains(&id) {
            self.violation(Violation::ContentAfterComplete(id));
            return;
        } else if Some(id) != self.last_requested {
            self.stale_chunks += 1;
            return;
        }
        let s = match self.streaming.take() {
            Some(s) if s.id == id => s,
            _ => Streaming {
                id,
                ..Streaming::default()
            },
        };
        let mut s = s;
        s.text.push_str(&r.content);
        s.end_call |= r.end_call == Some(true);
        if r.transfer_number.is_some() {
            s.transfer_number = r.transfer_number;
        }
        if r.digit_to_press.is_some() {
            s.digit_to_press = r.digit_to_press;
        }
        if !r.content_complete {
            self.streaming = Some(s);
            return;
        }
        self.completed.insert(id);
        if id == 0 {
            self.begin_done = true;
        }
        self.finish(now, s);
    }

    fn finish(&mut self, now: Instant, s: Streaming) {
        if !s.text.is_empty() {
            self.user_speaking = false;
            self.items.push(TranscriptItem::Utterance(Utterance::new(
                Role::Agent,
                s.text.clone(),
            )));
            let ev = RetellEvent::UpdateOnly(UpdateOnly {
                transcript: self.transcript(),
                transcript_with_tool_calls: self.twtc(),
                turntaking: Some(TurnTaking::AgentTurn),
            });
            self.send(ev);
            self.out.push_back(DriverOutput::AgentSpoke {
                response_id: s.id,
                content: s.text,
            });
            if let Some(trigger) = self.cfg.reminder_trigger
                && self.reminders_in_a_row < self.cfg.reminder_max_count
            {
                self.reminder_at = Some(now + trigger);
            }
        }
        if let Some(number) = s.transfer_number {
            self.out.push_back(DriverOutput::Transfer { number });
        }
        if let Some(digits) = s.digit_to_press {
            self.out.push_back(DriverOutput::PressDigits { digits });
        }
        if s.end_call {
            self.end(EndReason::EndCallRequested);
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum RequestKindWire {
    Response,
    Reminder,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server_event::ToolCallResult;

    fn drain(d: &mut RetellDriver) -> Vec<DriverOutput> {
        std::iter::from_fn(|| d.poll_output()).collect()
    }

    fn recv(d: &mut RetellDriver, now: Instant, json: &str) -> Vec<DriverOutput> {
        d.handle_input(
            now,
            DriverInput::Received(ServerEvent::from_json(json).unwrap()),
        );
        drain(d)
    }

    fn violations(out: &[DriverOutput]) -> Vec<Violation> {
        out.iter()
            .filter_map(|o| match o {
                DriverOutput::Violation(v) => Some(v.clone()),
                _ => None,
            })
            .collect()
    }

    fn asked(now: Instant) -> RetellDriver {
        let mut d = RetellDriver::new(DriverConfig::default());
        d.handle_input(now, DriverInput::Connected);
        d.handle_input(now, DriverInput::UserSaid("hello there".into()));
        drain(&mut d);
        d
    }

    #[test]
    fn server_protocol_violations_are_reported() {
        let now = Instant::now();
        let mut d = asked(now);
        let out = recv(
            &mut d,
            now,
            r#"{"response_type":"response","response_id":9,"content":"?","content_complete":true}"#,
        );
        assert_eq!(violations(&out), [Violation::UnknownResponseId(9)]);
        // The pre-2024 untagged form is still a response.
        let out = recv(
            &mut d,
            now,
            r#"{"response_id":1,"content":"Hi!","content_complete":true}"#,
        );
        assert!(out.contains(&DriverOutput::AgentSpoke {
            response_id: 1,
            content: "Hi!".into()
        }));
        let out = recv(
            &mut d,
            now,
            r#"{"response_type":"response","response_id":1,"content":"more","content_complete":false}"#,
        );
        assert_eq!(violations(&out), [Violation::ContentAfterComplete(1)]);
        d.handle_input(
            now,
            DriverInput::Received(ServerEvent::ToolCallResult(ToolCallResult {
                tool_call_id: "nope".into(),
                content: String::new(),
            })),
        );
        assert_eq!(
            violations(&drain(&mut d)),
            [Violation::ToolResultWithoutInvocation("nope".into())]
        );
    }

    #[test]
    fn stale_chunks_are_counted_not_spoken() {
        let now = Instant::now();
        let mut d = asked(now);
        d.handle_input(now, DriverInput::RequestResponse);
        drain(&mut d);
        let out = recv(
            &mut d,
            now,
            r#"{"response_type":"response","response_id":1,"content":"old","content_complete":true}"#,
        );
        assert!(out.is_empty());
        assert_eq!(d.stale_chunks(), 1);
        assert_eq!(d.last_requested(), Some(2));
    }

    #[test]
    fn transfer_and_digits_follow_the_spoken_response() {
        let now = Instant::now();
        let mut d = asked(now);
        let out = recv(
            &mut d,
            now,
            r#"{"response_type":"response","response_id":1,"content":"Connecting you.","content_complete":true,"transfer_number":"+15550100","digit_to_press":"12"}"#,
        );
        assert!(
            matches!(&out[..], [DriverOutput::Send(_), DriverOutput::AgentSpoke { .. }, DriverOutput::Transfer { number }, DriverOutput::PressDigits { digits }] if number == "+15550100" && digits == "12")
        );
    }

    #[test]
    fn without_auto_reconnect_there_are_no_pings_and_a_close_ends_the_call() {
        let now = Instant::now();
        let mut d = RetellDriver::new(DriverConfig {
            reminder_trigger: None,
            ..DriverConfig::default()
        });
        d.handle_input(now, DriverInput::Connected);
        recv(
            &mut d,
            now,
            r#"{"response_type":"config","config":{"call_details":true}}"#,
        );
        assert_eq!(d.poll_timeout(), None);
        d.handle_input(now, DriverInput::Disconnected);
        assert_eq!(
            drain(&mut d),
            [DriverOutput::CallEnded(EndReason::ServerClosed)]
        );
        assert!(d.is_ended());
    }

    #[test]
    fn a_response_cut_off_by_a_reconnect_is_asked_again_and_read_from_its_start() {
        let now = Instant::now();
        let mut d = asked(now);
        recv(
            &mut d,
            now,
            r#"{"response_type":"config","config":{"auto_reconnect":true}}"#,
        );
        recv(
            &mut d,
            now,
            r#"{"response_type":"response","response_id":1,"content":"Once upon","content_complete":false}"#,
        );
        d.handle_input(now, DriverInput::Disconnected);
        assert_eq!(drain(&mut d), [DriverOutput::Reconnect { attempt: 1 }]);
        d.handle_input(now, DriverInput::Connected);
        let out = drain(&mut d);
        assert!(
            matches!(&out[..], [DriverOutput::Send(RetellEvent::ResponseRequired(r))] if r.response_id == 1 && r.transcript.len() == 1),
            "{out:?}"
        );
        // The answer starts over on the new socket: only its chunks make the spoken text.
        recv(
            &mut d,
            now,
            r#"{"response_type":"response","response_id":1,"content":"Once upon ","content_complete":false}"#,
        );
        let out = recv(
            &mut d,
            now,
            r#"{"response_type":"response","response_id":1,"content":"a time.","content_complete":true}"#,
        );
        assert!(out.contains(&DriverOutput::AgentSpoke {
            response_id: 1,
            content: "Once upon a time.".into()
        }));
        // Answered: the next reconnect asks nothing again.
        d.handle_input(now, DriverInput::Disconnected);
        d.handle_input(now, DriverInput::Connected);
        assert!(
            !drain(&mut d)
                .iter()
                .any(|o| matches!(o, DriverOutput::Send(RetellEvent::ResponseRequired(_))))
        );
    }

    #[test]
    fn call_details_go_out_once_per_socket_when_asked() {
        let now = Instant::now();
        let mut d = RetellDriver::new(DriverConfig::default());
        d.handle_input(now, DriverInput::Connected);
        let cfg =
            r#"{"response_type":"config","config":{"call_details":true,"auto_reconnect":true}}"#;
        let out = recv(&mut d, now, cfg);
        assert!(
            matches!(&out[..], [DriverOutput::Send(RetellEvent::CallDetails(c))] if c.call.call_id == "call_test")
        );
        assert!(recv(&mut d, now, cfg).is_empty());
        assert_eq!(d.poll_timeout(), Some(now + PING_INTERVAL));
    }
}
