//! The server side: a sans-IO tracker of which response is current, when to stop streaming,
//! the begin message, reminders, resume after reconnect and the ping/pong deadlines.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::call::Call;
use crate::error::Blame;
use crate::retell_event::{PingPong, ResponseRequest, RetellEvent, UnknownEvent, UpdateOnly};
use crate::server_event::{ConfigBody, Response, ServerEvent};
use crate::transcript::{Role, TranscriptItem, Utterance};

/// The synthetic user turn Retell's own examples append before generating a reminder.
pub const REMINDER_PROMPT: &str = "(Now the user has not responded in a while, you would say:)";

/// Retell pings every 2 s once `auto_reconnect` is on, and expects the same from us.
pub const PING_INTERVAL: Duration = Duration::from_secs(2);

/// How long after our last `ping_pong` the tracker sends one unprompted: longer than Retell's
/// 2 s cadence so keep-alives only fill gaps in Retell's pings (never double the answers),
/// shorter than its 5 s give-up.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(3);

/// Retell closes the socket after 5 s without a `ping_pong` (and reconnects at most twice).
pub const SILENCE_TIMEOUT: Duration = Duration::from_secs(5);

/// Tool call ids the tracker remembers so a `tool_call_result` can be checked against its
/// invocation. A result follows its invocation within one response, so the newest few are
/// enough; a long call must not grow the set without bound.
pub const MAX_REMEMBERED_TOOL_CALLS: usize = 256;

/// When the begin message (`response` with `response_id` 0) is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BeginMessage {
    /// Right after the config, on the first connection (Retell's Python example). An empty
    /// string means "wait for the user to speak first".
    Immediately(String),
    /// Once `call_details` arrives (Retell's Node example); needs `call_details: true` in the
    /// config, or it is never sent.
    AfterCallDetails(String),
    /// The application streams `response_id` 0 itself through [`TrackerInput::Send`].
    Manual,
}

/// How a [`ResponseTracker`] behaves.
#[derive(Debug, Clone, PartialEq)]
pub struct TrackerConfig {
    /// Sent on every connection (first and resumed); `None` sends no config, so Retell neither
    /// pings nor reconnects.
    pub config: Option<ConfigBody>,
    /// The begin message policy.
    pub begin: BeginMessage,
    /// Silence on our side after which we send a keep-alive that no ping prompted.
    pub keepalive_interval: Duration,
    /// Silence after which each side considers the other gone.
    pub silence_timeout: Duration,
}

impl Default for TrackerConfig {
    /// Config with `auto_reconnect` and `call_details`, empty begin message (wait for the user).
    fn default() -> Self {
        TrackerConfig {
            config: Some(ConfigBody {
                auto_reconnect: Some(true),
                call_details: Some(true),
                ..ConfigBody::default()
            }),
            begin: BeginMessage::Immediately(String::new()),
            keepalive_interval: KEEPALIVE_INTERVAL,
            silence_timeout: SILENCE_TIMEOUT,
        }
    }
}

/// Why content is being asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RequestKind {
    /// The begin message (`response_id` 0), only with [`BeginMessage::Manual`].
    Begin,
    /// `response_required`.
    Response,
    /// `reminder_required`: the user has been silent.
    Reminder,
}

/// Work for the application: generate content for `response_id` and send it back through
/// [`TrackerInput::Send`] as [`ServerEvent::Response`] chunks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Generate {
    /// The id every chunk must carry.
    pub response_id: u64,
    /// Why Retell asked.
    pub kind: RequestKind,
    /// The complete transcript so far.
    pub transcript: Vec<Utterance>,
    /// The tool-call-woven transcript, when configured.
    pub transcript_with_tool_calls: Option<Vec<TranscriptItem>>,
}

impl Generate {
    /// The transcript to give an LLM: for reminders, with the synthetic user turn
    /// [`REMINDER_PROMPT`] appended (what Retell's examples do).
    pub fn llm_transcript(&self) -> Vec<Utterance> {
        let mut t = self.transcript.clone();
        if self.kind == RequestKind::Reminder {
            t.push(Utterance::new(Role::User, REMINDER_PROMPT));
        }
        t
    }
}

/// Everything a [`ResponseTracker`] may hand to its driver.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum TrackerOutput {
    /// Send this event to Retell as a text frame.
    Send(ServerEvent),
    /// Start generating content for a request.
    Generate(Generate),
    /// Stop streaming this response: a newer request made it stale, or the socket dropped.
    /// It needs no `content_complete`; further chunks for it are dropped.
    Stop {
        /// The response that no longer matters.
        response_id: u64,
    },
    /// The call object arrived.
    CallDetails(Call),
    /// Transcript or turn-taking news (does not stop the current response).
    Update(UpdateOnly),
    /// An event type this crate does not know; log it, the socket stays up.
    Unknown(UnknownEvent),
    /// Retell has not pinged for the silence timeout: the socket is dead. Close it with 1000
    /// and expect Retell to reconnect to the same `call_id`.
    RetellSilent,
}

/// A misuse of the tracker by the application (peer input never produces one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TrackerError {
    /// An event was sent while no socket is open.
    #[error("no Retell connection is open")]
    NotConnected,
    /// A response chunk for an id Retell never asked for.
    #[error("response {0} was never requested")]
    UnknownResponseId(u64),
    /// A chunk after the one with `content_complete: true`.
    #[error("response {0} is already complete")]
    ResponseAlreadyComplete(u64),
    /// A tool result for an invocation that was never announced.
    #[error("tool call {0:?} was never invoked")]
    UnknownToolCall(String),
    /// A reconnect for another call was handed to this call's tracker.
    #[error("tracker belongs to call {expected:?}, not {got:?}")]
    CallIdMismatch {
        /// The call this tracker serves.
        expected: String,
        /// The call id of the new connection.
        got: String,
    },
}

impl TrackerError {
    /// Who is to blame (always the caller).
    pub fn blame(&self) -> Blame {
        Blame::Caller
    }
}

/// What the tracker is fed.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum TrackerInput {
    /// A Retell socket for `call_id` opened: the first one, or a reconnect (which resumes).
    Connected {
        /// The last path segment of the WebSocket URL.
        call_id: String,
    },
    /// The socket closed or failed.
    Disconnected,
    /// An event decoded from Retell.
    Received(RetellEvent),
    /// The application wants to send this event (response chunks, interrupts, tool
    /// bookkeeping, metadata, agent updates).
    Send(ServerEvent),
}

/// Counters for monitoring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct TrackerStats {
    /// Connections opened, the first included.
    pub connections: u32,
    /// Pings answered.
    pub pings_answered: u64,
    /// Keep-alives sent unprompted.
    pub keepalives_sent: u64,
    /// Chunks for stale responses that were dropped.
    pub stale_chunks_dropped: u64,
    /// Responses stopped because a newer request arrived or the socket dropped.
    pub responses_stopped: u64,
    /// Responses cut off by a dropped socket and generated again from the start after the
    /// reconnect.
    pub responses_restarted: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Current {
    id: u64,
    complete: bool,
    stopped: bool,
    /// Stopped because its socket dropped, not because a newer request superseded it: the
    /// next connection generates it again.
    cut_off: bool,
    /// The connection (counted from 1) it was asked or restarted on.
    connection: u32,
}

impl Current {
    fn open(id: u64, connection: u32) -> Self {
        Current {
            id,
            complete: false,
            stopped: false,
            cut_off: false,
            connection,
        }
    }
}

/// What a [`ResponseTracker`] must keep for its call to go on from another server: the call
/// id, whether the begin message went out, the current response and the request it answers
/// (so a response cut off with its socket is generated again), the invoked tool calls, the
/// last interrupt id and the counters. Timers are not kept: they start again with the next
/// connection. Serialize it (JSON) at turn boundaries; [`ResponseTracker::restore`] takes it
/// back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrackerSnapshot {
    call_id: Option<String>,
    begin_sent: bool,
    current: Option<Current>,
    pending: Option<Generate>,
    tool_calls: Vec<String>,
    last_interrupt_id: u64,
    stats: TrackerStats,
}

impl TrackerSnapshot {
    /// The call it belongs to, once a socket connected.
    pub fn call_id(&self) -> Option<&str> {
        self.call_id.as_deref()
    }
}

/// The server side of one Retell call, across reconnects.
///
/// Keep one tracker per `call_id` for the call's lifetime (not per socket) so a reconnect
/// resumes: the config is sent again, the begin message is not.
#[derive(Debug)]
pub struct ResponseTracker {
    cfg: TrackerConfig,
    call_id: Option<String>,
    connected: bool,
    begin_sent: bool,
    current: Option<Current>,
    /// The request `current` answers, kept until its response completes or is superseded, so
    /// a response cut off by a dropped socket can be generated again after the reconnect.
    pending: Option<Generate>,
    keepalive: bool,
    /// Retell's last ping: when it arrived and its timestamp (our only wall clock).
    last_ping: Option<(Instant, u64)>,
    last_sent_ping: Option<Instant>,
    silent_reported: bool,
    /// Invoked tool calls, oldest first, at most [`MAX_REMEMBERED_TOOL_CALLS`].
    tool_calls: VecDeque<String>,
    last_interrupt_id: u64,
    out: VecDeque<TrackerOutput>,
    stats: TrackerStats,
}

impl ResponseTracker {
    /// A tracker that has not seen a connection yet.
    pub fn new(cfg: TrackerConfig) -> Self {
        let keepalive = cfg
            .config
            .as_ref()
            .and_then(|c| c.auto_reconnect)
            .unwrap_or(false);
        ResponseTracker {
            cfg,
            call_id: None,
            connected: false,
            begin_sent: false,
            current: None,
            pending: None,
            keepalive,
            last_ping: None,
            last_sent_ping: None,
            silent_reported: false,
            tool_calls: VecDeque::new(),
            last_interrupt_id: 0,
            out: VecDeque::new(),
            stats: TrackerStats::default(),
        }
    }

    /// Feeds one input at time `now`.
    pub fn handle_input(&mut self, now: Instant, input: TrackerInput) -> Result<(), TrackerError> {
        match input {
            TrackerInput::Connected { call_id } => self.on_connected(now, call_id),
            TrackerInput::Disconnected => {
                self.on_disconnected();
                Ok(())
            }
            TrackerInput::Received(ev) => {
                self.on_received(now, ev);
                Ok(())
            }
            TrackerInput::Send(ev) => self.on_send(now, ev),
        }
    }

    /// What must survive this server for the call to go on elsewhere ([`TrackerSnapshot`]).
    pub fn snapshot(&self) -> TrackerSnapshot {
        TrackerSnapshot {
            call_id: self.call_id.clone(),
            begin_sent: self.begin_sent,
            current: self.current,
            pending: self.pending.clone(),
            tool_calls: self.tool_calls.iter().cloned().collect(),
            last_interrupt_id: self.last_interrupt_id,
            stats: self.stats,
        }
    }

    /// A tracker continuing the call `snapshot` describes, as if its socket had just closed:
    /// a response that was streaming is owed again, and the next [`TrackerInput::Connected`]
    /// resumes (config again, no begin message, the cut-off response generated again). The
    /// snapshot may come from a server that died mid-response.
    pub fn restore(cfg: TrackerConfig, snapshot: TrackerSnapshot) -> Self {
        let mut t = Self::new(cfg);
        t.call_id = snapshot.call_id;
        t.begin_sent = snapshot.begin_sent;
        t.current = snapshot.current;
        t.pending = snapshot.pending;
        t.tool_calls = snapshot
            .tool_calls
            .into_iter()
            .rev()
            .take(MAX_REMEMBERED_TOOL_CALLS)
            .rev()
            .collect();
        t.last_interrupt_id = snapshot.last_interrupt_id;
        t.stats = snapshot.stats;
        // Its socket is gone (no one to tell to stop).
        let _ = t.cut_off_open_response();
        t
    }

    /// Fires the timers due at `now`: keep-alives and the silence check.
    pub fn handle_timeout(&mut self, now: Instant) {
        if !self.connected || !self.keepalive {
            return;
        }
        let Some((ping_at, ts)) = self.last_ping else {
            return;
        };
        if !self.silent_reported && now >= ping_at + self.cfg.silence_timeout {
            self.silent_reported = true;
            self.out.push_back(TrackerOutput::RetellSilent);
        }
        if let Some(sent) = self.last_sent_ping
            && now >= sent + self.cfg.keepalive_interval
        {
            // No wall clock here: extrapolate Retell's last timestamp.
            let elapsed = u64::try_from(now.saturating_duration_since(ping_at).as_millis())
                .unwrap_or(u64::MAX);
            self.send_ping(now, ts.saturating_add(elapsed));
            self.stats.keepalives_sent += 1;
        }
    }

    /// The next thing to do, if any. Call until `None` after every input or timeout.
    pub fn poll_output(&mut self) -> Option<TrackerOutput> {
        self.out.pop_front()
    }

    /// When [`Self::handle_timeout`] must next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if !self.connected || !self.keepalive {
            return None;
        }
        let (ping_at, _) = self.last_ping?;
        let keepalive = self.last_sent_ping.map(|t| t + self.cfg.keepalive_interval);
        let silence = (!self.silent_reported).then(|| ping_at + self.cfg.silence_timeout);
        match (keepalive, silence) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The response id chunks should carry now, if a request is open.
    pub fn current_response_id(&self) -> Option<u64> {
        self.current
            .filter(|c| !c.complete && !c.stopped)
            .map(|c| c.id)
    }

    /// Whether chunks for `response_id` are still wanted.
    pub fn is_current(&self, response_id: u64) -> bool {
        self.current_response_id() == Some(response_id)
    }

    /// When Retell will give up on us if nothing more reaches it: 5 s after our last
    /// `ping_pong` (only meaningful with `auto_reconnect`).
    pub fn retell_gives_up_at(&self) -> Option<Instant> {
        if !self.connected || !self.keepalive {
            return None;
        }
        self.last_sent_ping.map(|t| t + self.cfg.silence_timeout)
    }

    /// Allocates an `interrupt_id` for a new [`crate::AgentInterrupt`] (reuse the previous id
    /// to append to it).
    pub fn next_interrupt_id(&mut self) -> u64 {
        self.last_interrupt_id += 1;
        self.last_interrupt_id
    }

    /// The call this tracker serves, once connected.
    pub fn call_id(&self) -> Option<&str> {
        self.call_id.as_deref()
    }

    /// Whether a socket is open.
    pub fn is_connected(&self) -> bool {
        self.connected
    }

    /// Counters.
    pub fn stats(&self) -> TrackerStats {
        self.stats
    }

    fn on_connected(&mut self, now: Instant, call_id: String) -> Result<(), TrackerError> {
        match &self.call_id {
            Some(expected) if *expected != call_id => {
                return Err(TrackerError::CallIdMismatch {
                    expected: expected.clone(),
                    got: call_id,
                });
            }
            _ => {}
        }
        if self.connected {
            // Retell opened a new socket before we saw the old one close.
            self.on_disconnected();
        }
        let first = self.call_id.is_none();
        self.call_id = Some(call_id);
        self.connected = true;
        self.stats.connections += 1;
        self.last_ping = None;
        self.last_sent_ping = Some(now);
        self.silent_reported = false;
        if let Some(c) = &self.cfg.config {
            self.out
                .push_back(TrackerOutput::Send(ServerEvent::Config(c.clone())));
        }
        if !first
            && let Some(c) = self.current.as_mut()
            && c.cut_off
            && let Some(g) = self.pending.clone()
            && g.response_id == c.id
        {
            // The response was cut off with the old socket and Retell still waits for it
            // (it only ever wants the latest id): generate it again, from the start, under the
            // same id. A repeat of the request on this socket is then one we are answering.
            *c = Current::open(c.id, self.stats.connections);
            self.stats.responses_restarted += 1;
            self.out.push_back(TrackerOutput::Generate(g));
        }
        if first {
            match &self.cfg.begin {
                BeginMessage::Immediately(text) => {
                    let text = text.clone();
                    self.send_begin(text);
                }
                BeginMessage::AfterCallDetails(_) => {}
                BeginMessage::Manual => {
                    self.current = Some(Current::open(0, self.stats.connections));
                    let g = Generate {
                        response_id: 0,
                        kind: RequestKind::Begin,
                        transcript: Vec::new(),
                        transcript_with_tool_calls: None,
                    };
                    self.pending = Some(g.clone());
                    self.out.push_back(TrackerOutput::Generate(g));
                }
            }
        }
        Ok(())
    }

    fn on_disconnected(&mut self) {
        if !self.connected {
            return;
        }
        self.connected = false;
        // The socket that asked is gone: stop streaming into it. The request stays owed: the
        // next connection (a resume) generates it again from the start.
        if let Some(response_id) = self.cut_off_open_response() {
            self.out.push_back(TrackerOutput::Stop { response_id });
        }
    }

    /// Marks a response still streaming as stopped with its socket (owed again on the next
    /// connection); its id, if there was one.
    fn cut_off_open_response(&mut self) -> Option<u64> {
        let c = self
            .current
            .as_mut()
            .filter(|c| !c.complete && !c.stopped)?;
        c.stopped = true;
        c.cut_off = true;
        self.stats.responses_stopped += 1;
        Some(c.id)
    }

    fn send_begin(&mut self, text: String) {
        self.begin_sent = true;
        self.current = Some(Current {
            complete: true,
            ..Current::open(0, self.stats.connections)
        });
        self.pending = None;
        self.out
            .push_back(TrackerOutput::Send(ServerEvent::Response(Response::chunk(
                0, text, true,
            ))));
    }

    fn send_ping(&mut self, now: Instant, timestamp: u64) {
        self.last_sent_ping = Some(now);
        self.out
            .push_back(TrackerOutput::Send(ServerEvent::PingPong(PingPong {
                timestamp,
            })));
    }

    fn on_received(&mut self, now: Instant, ev: RetellEvent) {
        match ev {
            RetellEvent::PingPong(p) => {
                self.last_ping = Some((now, p.timestamp));
                self.silent_reported = false;
                // Retell pings even when our config did not ask; answering is always right.
                self.send_ping(now, p.timestamp);
                self.stats.pings_answered += 1;
            }
            RetellEvent::CallDetails(d) => {
                if !self.begin_sent
                    && let BeginMessage::AfterCallDetails(text) = &self.cfg.begin
                    && self.current.is_none()
                {
                    let text = text.clone();
                    self.send_begin(text);
                }
                self.out.push_back(TrackerOutput::CallDetails(d.call));
            }
            RetellEvent::UpdateOnly(u) => self.out.push_back(TrackerOutput::Update(u)),
            RetellEvent::ResponseRequired(r) => self.on_request(r, RequestKind::Response),
            RetellEvent::ReminderRequired(r) => self.on_request(r, RequestKind::Reminder),
            RetellEvent::Unknown(u) => self.out.push_back(TrackerOutput::Unknown(u)),
        }
    }

    fn on_request(&mut self, r: ResponseRequest, kind: RequestKind) {
        if let Some(c) = self.current.as_mut() {
            // A repeat of a request we are answering (or answered, or restarted after a
            // reconnect): one answer is enough. Except an answer completed on an earlier
            // socket: asked again after a reconnect, it was lost with that socket (sent, but
            // never read), so it is generated again.
            let lost = c.complete && c.connection != self.stats.connections;
            if c.id == r.response_id && !c.stopped && !lost {
                return;
            }
            if c.id != r.response_id && !c.complete && !c.stopped {
                c.stopped = true;
                self.stats.responses_stopped += 1;
                self.out
                    .push_back(TrackerOutput::Stop { response_id: c.id });
            }
        }
        // A request means the conversation is under way: a pending begin is moot.
        self.begin_sent = true;
        // The latest request wins, even with a lower id (Retell restarting its counter).
        self.current = Some(Current::open(r.response_id, self.stats.connections));
        let g = Generate {
            response_id: r.response_id,
            kind,
            transcript: r.transcript,
            transcript_with_tool_calls: r.transcript_with_tool_calls,
        };
        self.pending = Some(g.clone());
        self.out.push_back(TrackerOutput::Generate(g));
    }

    fn on_send(&mut self, now: Instant, ev: ServerEvent) -> Result<(), TrackerError> {
        if let ServerEvent::Response(r) = &ev {
            let Some(c) = self.current.as_mut() else {
                return Err(TrackerError::UnknownResponseId(r.response_id));
            };
            if r.response_id == c.id {
                if c.stopped {
                    self.stats.stale_chunks_dropped += 1;
                    return Ok(());
                }
                if c.complete {
                    return Err(TrackerError::ResponseAlreadyComplete(r.response_id));
                }
                if !self.connected {
                    return Err(TrackerError::NotConnected);
                }
                c.complete = r.content_complete;
                if c.complete {
                    // Answered: nothing to generate again after a reconnect.
                    self.pending = None;
                }
                if c.id == 0 {
                    self.begin_sent = true;
                }
            } else if r.response_id < c.id {
                // The application raced the Stop output; that is expected, not a bug.
                self.stats.stale_chunks_dropped += 1;
                return Ok(());
            } else {
                return Err(TrackerError::UnknownResponseId(r.response_id));
            }
        } else if !self.connected {
            return Err(TrackerError::NotConnected);
        }
        match &ev {
            ServerEvent::ToolCallInvocation(t) if !self.tool_calls.contains(&t.tool_call_id) => {
                if self.tool_calls.len() == MAX_REMEMBERED_TOOL_CALLS {
                    self.tool_calls.pop_front();
                }
                self.tool_calls.push_back(t.tool_call_id.clone());
            }
            ServerEvent::ToolCallResult(t) if !self.tool_calls.contains(&t.tool_call_id) => {
                return Err(TrackerError::UnknownToolCall(t.tool_call_id.clone()));
            }
            ServerEvent::AgentInterrupt(a) => {
                self.last_interrupt_id = self.last_interrupt_id.max(a.interrupt_id);
            }
            ServerEvent::PingPong(_) => self.last_sent_ping = Some(now),
            ServerEvent::Config(c) => {
                self.keepalive = c.auto_reconnect.unwrap_or(self.keepalive);
            }
            _ => {}
        }
        self.out.push_back(TrackerOutput::Send(ev));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server_event::{ToolCallInvocation, ToolCallResult};

    fn request(id: u64) -> TrackerInput {
        TrackerInput::Received(RetellEvent::ResponseRequired(ResponseRequest {
            response_id: id,
            ..ResponseRequest::default()
        }))
    }

    fn chunk(id: u64, done: bool) -> TrackerInput {
        TrackerInput::Send(ServerEvent::Response(Response::chunk(id, "x", done)))
    }

    fn drain(t: &mut ResponseTracker) -> Vec<TrackerOutput> {
        std::iter::from_fn(|| t.poll_output()).collect()
    }

    fn connected(cfg: TrackerConfig) -> (ResponseTracker, Instant) {
        let now = Instant::now();
        let mut t = ResponseTracker::new(cfg);
        t.handle_input(
            now,
            TrackerInput::Connected {
                call_id: "c1".into(),
            },
        )
        .unwrap();
        drain(&mut t);
        (t, now)
    }

    fn generated(out: &[TrackerOutput]) -> Vec<u64> {
        out.iter()
            .filter_map(|o| match o {
                TrackerOutput::Generate(g) => Some(g.response_id),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn config_then_begin_on_first_connection_only() {
        let now = Instant::now();
        let mut t = ResponseTracker::new(TrackerConfig::default());
        t.handle_input(
            now,
            TrackerInput::Connected {
                call_id: "c1".into(),
            },
        )
        .unwrap();
        let tags: Vec<_> = drain(&mut t)
            .into_iter()
            .map(|o| match o {
                TrackerOutput::Send(ev) => ev.tag().to_owned(),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(tags, ["config", "response"]);
        t.handle_input(now, TrackerInput::Disconnected).unwrap();
        t.handle_input(
            now,
            TrackerInput::Connected {
                call_id: "c1".into(),
            },
        )
        .unwrap();
        let out = drain(&mut t);
        assert!(matches!(
            out.as_slice(),
            [TrackerOutput::Send(ServerEvent::Config(_))]
        ));
        assert_eq!(t.stats().connections, 2);
    }

    #[test]
    fn a_restored_snapshot_resumes_like_a_reconnect_to_the_same_tracker() {
        // Mid-answer to request 3 (two answered before, a tool call invoked): one tracker
        // loses its socket and gets it back; another server restores a snapshot taken before
        // the drop (its server died without seeing the close) and gets the reconnect.
        let (mut t, now) = connected(TrackerConfig::default());
        for id in 1..=2 {
            t.handle_input(now, request(id)).unwrap();
            t.handle_input(now, chunk(id, true)).unwrap();
        }
        t.handle_input(
            now,
            TrackerInput::Send(ServerEvent::ToolCallInvocation(ToolCallInvocation {
                tool_call_id: "t1".into(),
                name: "weather".into(),
                arguments: "{}".into(),
            })),
        )
        .unwrap();
        t.handle_input(now, request(3)).unwrap();
        t.handle_input(now, chunk(3, false)).unwrap();
        drain(&mut t);
        let json = serde_json::to_string(&t.snapshot()).unwrap();
        let snapshot: TrackerSnapshot = serde_json::from_str(&json).unwrap();
        assert_eq!(snapshot.call_id(), Some("c1"));

        let reconnect = TrackerInput::Connected {
            call_id: "c1".into(),
        };
        t.handle_input(now, TrackerInput::Disconnected).unwrap();
        drain(&mut t);
        t.handle_input(now, reconnect.clone()).unwrap();
        let same = drain(&mut t);

        let mut moved = ResponseTracker::restore(TrackerConfig::default(), snapshot);
        moved.handle_input(now, reconnect).unwrap();
        let elsewhere = drain(&mut moved);
        assert_eq!(elsewhere, same);
        assert_eq!(
            generated(&elsewhere),
            [3],
            "the cut-off answer again, no begin"
        );
        assert_eq!(moved.stats(), t.stats());
        // The tool call is still known there: its result is accepted.
        moved
            .handle_input(
                now,
                TrackerInput::Send(ServerEvent::ToolCallResult(ToolCallResult {
                    tool_call_id: "t1".into(),
                    content: "sunny".into(),
                })),
            )
            .unwrap();
        assert!(matches!(
            drain(&mut moved).as_slice(),
            [TrackerOutput::Send(ServerEvent::ToolCallResult(_))]
        ));
        // A stale chunk of request 2 is dropped there as here.
        moved.handle_input(now, chunk(2, false)).unwrap();
        assert!(drain(&mut moved).is_empty());
    }

    #[test]
    fn a_repeated_request_is_answered_once() {
        let (mut t, now) = connected(TrackerConfig::default());
        t.handle_input(now, request(1)).unwrap();
        t.handle_input(now, request(1)).unwrap();
        assert_eq!(generated(&drain(&mut t)), [1]);
        // The socket drops mid-answer; the reconnect generates it again at once, and Retell
        // asking again with the same id on the new socket gets no second answer.
        t.handle_input(now, TrackerInput::Disconnected).unwrap();
        assert_eq!(drain(&mut t), [TrackerOutput::Stop { response_id: 1 }]);
        t.handle_input(
            now,
            TrackerInput::Connected {
                call_id: "c1".into(),
            },
        )
        .unwrap();
        t.handle_input(now, request(1)).unwrap();
        assert_eq!(generated(&drain(&mut t)), [1]);
        assert!(t.is_current(1));
    }

    /// Drops the socket and opens a new one; what the new connection put out.
    fn reconnect(t: &mut ResponseTracker, now: Instant) -> Vec<TrackerOutput> {
        drain(t);
        t.handle_input(now, TrackerInput::Disconnected).unwrap();
        drain(t);
        t.handle_input(
            now,
            TrackerInput::Connected {
                call_id: "c1".into(),
            },
        )
        .unwrap();
        drain(t)
    }

    #[test]
    fn a_response_cut_off_by_a_dropped_socket_is_generated_again_after_the_reconnect() {
        let (mut t, now) = connected(TrackerConfig::default());
        let words = vec![Utterance::new(Role::User, "tell me a story")];
        let asked = TrackerInput::Received(RetellEvent::ResponseRequired(ResponseRequest {
            response_id: 3,
            transcript: words.clone(),
            ..ResponseRequest::default()
        }));
        t.handle_input(now, asked).unwrap();
        t.handle_input(now, chunk(3, false)).unwrap();
        drain(&mut t);
        let out = reconnect(&mut t, now);
        // Config first, then the same request again (same id, same transcript).
        assert!(matches!(
            out[0],
            TrackerOutput::Send(ServerEvent::Config(_))
        ));
        let again: Vec<_> = out
            .iter()
            .filter_map(|o| match o {
                TrackerOutput::Generate(g) => Some(g),
                _ => None,
            })
            .collect();
        assert_eq!(again.len(), 1);
        assert_eq!((again[0].response_id, &again[0].transcript), (3, &words));
        assert!(t.is_current(3));
        assert_eq!(t.stats().responses_restarted, 1);
        // The restarted response streams from its start and completes normally.
        t.handle_input(now, chunk(3, false)).unwrap();
        t.handle_input(now, chunk(3, true)).unwrap();
        // Complete: a later reconnect has nothing to generate again.
        assert_eq!(generated(&reconnect(&mut t, now)), Vec::<u64>::new());
        // Unless Retell asks for it again: the answer was lost with the old socket.
        t.handle_input(now, request(3)).unwrap();
        assert_eq!(generated(&drain(&mut t)), [3]);
        // On the socket that answered it, a repeat is still just a repeat.
        t.handle_input(now, chunk(3, true)).unwrap();
        t.handle_input(now, request(3)).unwrap();
        assert_eq!(generated(&drain(&mut t)), Vec::<u64>::new());
    }

    #[test]
    fn superseded_and_completed_responses_are_not_generated_again() {
        let (mut t, now) = connected(TrackerConfig::default());
        t.handle_input(now, request(1)).unwrap();
        t.handle_input(now, chunk(1, true)).unwrap();
        assert_eq!(generated(&reconnect(&mut t, now)), Vec::<u64>::new());
        // Superseded by a newer request, which is then cut off: only the newer one returns.
        t.handle_input(now, request(2)).unwrap();
        t.handle_input(now, request(3)).unwrap();
        drain(&mut t);
        assert_eq!(generated(&reconnect(&mut t, now)), [3]);
        assert_eq!(t.stats().responses_restarted, 1);
    }

    #[test]
    fn the_latest_request_wins_even_with_a_lower_id() {
        let (mut t, now) = connected(TrackerConfig::default());
        t.handle_input(now, request(5)).unwrap();
        t.handle_input(now, request(2)).unwrap();
        let out = drain(&mut t);
        assert!(out.contains(&TrackerOutput::Stop { response_id: 5 }));
        assert_eq!(t.current_response_id(), Some(2));
    }

    #[test]
    fn completed_responses_are_not_stopped_by_newer_requests() {
        let (mut t, now) = connected(TrackerConfig::default());
        t.handle_input(now, request(1)).unwrap();
        t.handle_input(now, chunk(1, true)).unwrap();
        t.handle_input(now, request(2)).unwrap();
        let out = drain(&mut t);
        assert!(!out.iter().any(|o| matches!(o, TrackerOutput::Stop { .. })));
    }

    #[test]
    fn remembered_tool_calls_are_bounded() {
        let (mut t, now) = connected(TrackerConfig::default());
        t.handle_input(now, request(1)).unwrap();
        let invoke = |id: String| {
            TrackerInput::Send(ServerEvent::ToolCallInvocation(ToolCallInvocation {
                tool_call_id: id,
                ..ToolCallInvocation::default()
            }))
        };
        let result = |id: &str| {
            TrackerInput::Send(ServerEvent::ToolCallResult(ToolCallResult {
                tool_call_id: id.into(),
                content: String::new(),
            }))
        };
        for i in 0..MAX_REMEMBERED_TOOL_CALLS + 10 {
            t.handle_input(now, invoke(format!("t{i}"))).unwrap();
            // A repeated invocation does not take a second place.
            t.handle_input(now, invoke(format!("t{i}"))).unwrap();
        }
        assert_eq!(t.tool_calls.len(), MAX_REMEMBERED_TOOL_CALLS);
        // The newest are still answerable; the oldest were forgotten.
        let newest = format!("t{}", MAX_REMEMBERED_TOOL_CALLS + 9);
        t.handle_input(now, result(&newest)).unwrap();
        t.handle_input(now, result("t10")).unwrap();
        assert_eq!(
            t.handle_input(now, result("t9")),
            Err(TrackerError::UnknownToolCall("t9".into()))
        );
    }

    #[test]
    fn caller_bugs_are_typed_errors() {
        let (mut t, now) = connected(TrackerConfig::default());
        assert_eq!(
            t.handle_input(now, chunk(3, false)),
            Err(TrackerError::UnknownResponseId(3))
        );
        t.handle_input(now, request(3)).unwrap();
        t.handle_input(now, chunk(3, true)).unwrap();
        let again = t.handle_input(now, chunk(3, false));
        assert_eq!(again, Err(TrackerError::ResponseAlreadyComplete(3)));
        assert_eq!(again.unwrap_err().blame(), Blame::Caller);
        let result = ServerEvent::ToolCallResult(ToolCallResult {
            tool_call_id: "t9".into(),
            content: String::new(),
        });
        assert_eq!(
            t.handle_input(now, TrackerInput::Send(result)),
            Err(TrackerError::UnknownToolCall("t9".into()))
        );
        let other = TrackerInput::Connected {
            call_id: "c2".into(),
        };
        assert!(matches!(
            t.handle_input(now, other),
            Err(TrackerError::CallIdMismatch { .. })
        ));
        t.handle_input(now, TrackerInput::Disconnected).unwrap();
        let invocation = ServerEvent::ToolCallInvocation(ToolCallInvocation::default());
        assert_eq!(
            t.handle_input(now, TrackerInput::Send(invocation)),
            Err(TrackerError::NotConnected)
        );
    }

    #[test]
    fn keepalive_needs_auto_reconnect_and_a_first_ping() {
        let (mut t, now) = connected(TrackerConfig {
            config: None,
            ..TrackerConfig::default()
        });
        assert_eq!(t.poll_timeout(), None);
        // Pings are answered even when our config did not ask for them.
        let ping = RetellEvent::PingPong(PingPong { timestamp: 7 });
        t.handle_input(now, TrackerInput::Received(ping.clone()))
            .unwrap();
        assert_eq!(
            drain(&mut t),
            [TrackerOutput::Send(ServerEvent::PingPong(PingPong {
                timestamp: 7
            }))]
        );
        assert_eq!(t.poll_timeout(), None);

        let (mut t, now) = connected(TrackerConfig::default());
        assert_eq!(
            t.poll_timeout(),
            None,
            "no clock reference before Retell's first ping"
        );
        t.handle_input(now, TrackerInput::Received(ping)).unwrap();
        assert_eq!(t.poll_timeout(), Some(now + KEEPALIVE_INTERVAL));
        assert_eq!(t.retell_gives_up_at(), Some(now + SILENCE_TIMEOUT));
    }

    #[test]
    fn unknown_events_and_updates_pass_through_without_touching_the_request() {
        let (mut t, now) = connected(TrackerConfig::default());
        t.handle_input(now, request(1)).unwrap();
        drain(&mut t);
        let unknown = RetellEvent::Unknown(UnknownEvent {
            tag: "new".into(),
            ..UnknownEvent::default()
        });
        t.handle_input(now, TrackerInput::Received(unknown))
            .unwrap();
        t.handle_input(
            now,
            TrackerInput::Received(RetellEvent::UpdateOnly(UpdateOnly::default())),
        )
        .unwrap();
        let out = drain(&mut t);
        assert!(matches!(
            out.as_slice(),
            [TrackerOutput::Unknown(_), TrackerOutput::Update(_)]
        ));
        assert!(t.is_current(1));
    }

    #[test]
    fn reminder_transcripts_get_the_synthetic_turn() {
        let g = Generate {
            response_id: 4,
            kind: RequestKind::Reminder,
            transcript: vec![Utterance::new(Role::Agent, "Anything else?")],
            transcript_with_tool_calls: None,
        };
        let t = g.llm_transcript();
        assert_eq!(t.len(), 2);
        assert_eq!(
            (t[1].role.clone(), t[1].content.as_str()),
            (Role::User, REMINDER_PROMPT)
        );
        let plain = Generate {
            kind: RequestKind::Response,
            ..g
        };
        assert_eq!(plain.llm_transcript().len(), 1);
    }
}
