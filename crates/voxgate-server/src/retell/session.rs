//! One Retell socket: [`serve`] hands the socket and the call it claimed (a [`Lease`] from the
//! registry) to the shared door driver with a [`RetellSession`], the translator between
//! Retell's events, the call's [`ResponseTracker`] and the LLM.
//!
//! The translator does no I/O and never reads the clock: every decision (which request gets an
//! answer, what a reconnect resumes, what a tool call reports) is unit-tested below on a
//! virtual clock with hand-made provider events.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use axum::extract::ws::WebSocket;
use tokio::sync::mpsc;
use voxgate_engine::emotion::{self, FragmentStripper};
use voxgate_engine::provider::{ChatRole, ContextMessage, ContextToolCall};
use voxgate_engine::{
    ProviderEvent, ProviderRequest, RequestId, ToolKind, ToolOutcome as CallOutcome, TurnEvent,
    TurnId,
};
use voxgate_retell::{
    AgentInterrupt, BeginMessage, Call, ConfigBody, Generate, Metadata, RequestKind,
    ResponseRequest, ResponseTracker, RetellEvent, ServerEvent, ToolCallInvocation, ToolCallResult,
    TrackerConfig, TrackerInput, TrackerOutput, TrackerSnapshot,
};

use super::registry::Lease;
use super::tools::{self, ContextBound, Offered, Route, ToolOutcome};
use super::{Control, RetellConfig};
use crate::door::{self, ClientFrame, Inbound, Out, ServerFrame, Translator, close_code};
use crate::metrics::{Door, Metrics};
use crate::server::App;

/// What survives a socket: everything Retell expects to continue after a reconnect.
#[derive(Debug)]
pub(crate) struct CallState {
    pub(super) tracker: ResponseTracker,
    call: Option<Call>,
    agent_updated: bool,
}

/// A call's conversation as saved in the cluster store at turn boundaries, for a reconnect
/// that lands on another instance (`crate::cluster`).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Saved {
    tracker: TrackerSnapshot,
    call: Option<Call>,
    agent_updated: bool,
}

impl CallState {
    pub(crate) fn new(cfg: &RetellConfig) -> Self {
        Self {
            tracker: ResponseTracker::new(tracker_config(cfg)),
            call: None,
            agent_updated: false,
        }
    }

    /// The call's conversation as JSON, for the cluster store.
    pub(crate) fn to_saved(&self) -> String {
        serde_json::to_string(&Saved {
            tracker: self.tracker.snapshot(),
            call: self.call.clone(),
            agent_updated: self.agent_updated,
        })
        .unwrap_or_default()
    }

    /// A call continuing what [`Self::to_saved`] wrote for `call_id` (another call's state, or
    /// unreadable JSON, gives `None`).
    pub(crate) fn from_saved(cfg: &RetellConfig, call_id: &str, json: &str) -> Option<Self> {
        let saved: Saved = serde_json::from_str(json)
            .inspect_err(|e| tracing::warn!(%call_id, error = %e, "saved Retell call unreadable"))
            .ok()?;
        if saved.tracker.call_id().is_some_and(|id| id != call_id) {
            return None;
        }
        Some(Self {
            tracker: ResponseTracker::restore(tracker_config(cfg), saved.tracker),
            call: saved.call,
            agent_updated: saved.agent_updated,
        })
    }
}

/// The tracker settings of the door's configuration.
fn tracker_config(cfg: &RetellConfig) -> TrackerConfig {
    let begin = cfg.begin_message.clone();
    TrackerConfig {
        config: Some(ConfigBody {
            auto_reconnect: Some(cfg.auto_reconnect),
            call_details: Some(cfg.call_details),
            transcript_with_tool_calls: Some(cfg.transcript_with_tool_calls),
            ..ConfigBody::default()
        }),
        begin: if cfg.begin_after_call_details {
            BeginMessage::AfterCallDetails(begin)
        } else {
            BeginMessage::Immediately(begin)
        },
        ..TrackerConfig::default()
    }
}

/// A call with the default settings; stands in for a lease's state while it is handed back.
impl Default for CallState {
    fn default() -> Self {
        Self::new(&RetellConfig::default())
    }
}

/// A decoded frame, or what could be salvaged from an unreadable one.
#[derive(Debug)]
pub(crate) enum Incoming {
    Event(RetellEvent),
    /// Unreadable; `request` is set when it still named a request we owe an answer.
    Bad {
        error: String,
        request: Option<(RequestKind, u64)>,
    },
}

/// Tool calls one LLM round may make; a model that asks for more has the rest ignored (each
/// one becomes two frames to Retell and a message in the next round's context).
const MAX_TOOL_CALLS_PER_ROUND: usize = 8;

/// Serves one upgraded Retell socket for the call in `lease`; the call is released (parked
/// for a reconnect) when the session ends, with the lease.
pub(crate) async fn serve(
    socket: WebSocket,
    app: Arc<App>,
    lease: Lease,
    peer: std::net::SocketAddr,
    entry: Option<crate::cluster::DirectoryEntry>,
) {
    let cfg = &app.config.retell.with_engine(&app.config.engine);
    tracing::info!(
        call_id = %lease.call_id(),
        resumed = lease.resumed(),
        "Retell call socket"
    );
    let call_id = lease.call_id().to_owned();
    let mut session = RetellSession::new(cfg.clone(), Arc::clone(&app.metrics), lease);
    let saver = app.cluster.as_ref().map(|cluster| {
        let (tx, rx) = tokio::sync::watch::channel(None);
        session.saver = Some(tx);
        let window = std::time::Duration::from_secs(cfg.resume_window_secs);
        tokio::spawn(super::cluster::save(
            Arc::clone(cluster),
            call_id.clone(),
            window,
            rx,
        ))
    });
    let mut cx = app.driver(Door::Retell);
    cx.identity.peer = Some(peer);
    cx.identity.device = Some(call_id);
    cx.mcp = app.mcp_tools(cfg.mcp_tools);
    // Retell sends the whole transcript in every event: the door's own frame limit.
    cx.max_frame_bytes = cfg.max_frame_bytes;
    door::run(socket, session, cx).await;
    // The session (and its saver sender) is gone: the saver writes its last state, starts the
    // resume window on it and ends; then the directory entry is released.
    if let Some(saver) = saver {
        let _ = saver.await;
    }
    drop(entry);
}

fn decode(text: &str) -> Incoming {
    match RetellEvent::from_json(text) {
        Ok(ev) => Incoming::Event(ev),
        Err(e) => Incoming::Bad {
            error: e.to_string(),
            request: salvage(text),
        },
    }
}

/// The request a malformed frame still names (a readable `interaction_type` and `response_id`),
/// so that Retell, which waits for an answer to it, gets one.
fn salvage(text: &str) -> Option<(RequestKind, u64)> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let kind = match v.get("interaction_type")?.as_str()? {
        "response_required" => RequestKind::Response,
        "reminder_required" => RequestKind::Reminder,
        _ => return None,
    };
    Some((kind, v.get("response_id")?.as_u64()?))
}

/// The response being generated.
struct Active {
    response_id: u64,
    request: RequestId,
    /// The context of the next round (grows with tool calls and results).
    messages: Vec<ContextMessage>,
    round_text: String,
    round_calls: Vec<ContextToolCall>,
    round_results: Vec<ContextMessage>,
    rounds: u32,
    /// `end_call` / `transfer_call` asked for: the response ends with it.
    action: Option<ToolOutcome>,
    tools_used: Vec<String>,
    /// The previous round's text ended without a space: the next round's text needs one, or
    /// Retell would speak the two glued together.
    space_before_next: bool,
    /// Retell speaks `content` and has no emotion channel: the model's emoji (the demo agent
    /// starts every reply with one) are removed across the whole response, not read aloud.
    stripper: FragmentStripper,
    /// MCP endpoint calls of this round still running.
    server_calls: Vec<ServerCall>,
    /// The round's generation is done; it continues once `server_calls` are answered.
    round_over: bool,
}

/// An MCP endpoint call of the round still running.
struct ServerCall {
    /// The request carrying it.
    id: RequestId,
    /// The model's call id.
    call_id: String,
    /// The tool's name at its MCP server, for the tool call's turn event.
    tool: String,
    /// When it was sent: its round trip (`voxgate_tool_call_seconds`) counts from here.
    sent: Instant,
}

impl ServerCall {
    /// The call's turn event, ended at `now` with `outcome`.
    fn ended(&self, response_id: u64, outcome: CallOutcome, now: Instant) -> TurnEvent {
        TurnEvent::ToolCall {
            turn: turn_id(response_id),
            kind: ToolKind::Mcp,
            name: self.tool.clone(),
            elapsed: now.saturating_duration_since(self.sent),
            outcome,
            at: now,
        }
    }
}

impl Active {
    /// Cancels every request of the response: the LLM round and its MCP calls.
    fn cancel(&self, now: Instant, out: &mut Out, telemetry: &mut Vec<TurnEvent>) {
        out.provider(ProviderRequest::Cancel { id: self.request });
        self.cancel_calls(now, out, telemetry);
    }

    /// Cancels the MCP calls still running, reported as cancelled tool calls.
    fn cancel_calls(&self, now: Instant, out: &mut Out, telemetry: &mut Vec<TurnEvent>) {
        for call in &self.server_calls {
            out.provider(ProviderRequest::Cancel { id: call.id });
            telemetry.push(call.ended(self.response_id, CallOutcome::Cancelled, now));
        }
    }
}

/// What a finished response asks Retell to do once it is spoken.
enum Action {
    EndCall,
    Transfer(String),
}

/// The Retell door's translator: one socket of one call, holding the call's state for as long
/// as the socket lives.
pub(crate) struct RetellSession {
    cfg: RetellConfig,
    /// The built-ins and the MCP endpoint's tools, with the names the model sees.
    tools: Offered,
    bound: ContextBound,
    metrics: Arc<Metrics>,
    call_id: String,
    /// The call's state, held for as long as this socket lives (given back when dropped).
    state: Lease,
    /// Control API requests for the call.
    control: Option<mpsc::Receiver<Control>>,
    /// Wall time for `get_current_time` (the `now` the driver passes is monotonic).
    wall_clock: fn() -> SystemTime,
    next_request: u64,
    active: Option<Active>,
    /// The latest request whose frame was unreadable: it gets the apology instead of the LLM.
    /// One is enough: the tracker turns it into a `Generate` at once.
    apologize: Option<u64>,
    /// Turn events for the driver's metrics and traces (Retell has no engine: the door tells
    /// when a response is asked for, superseded or done).
    telemetry: Vec<TurnEvent>,
    /// With `[cluster]`: where the call's conversation goes at each turn boundary (the newest
    /// one wins; a task writes it to the cluster store).
    saver: Option<tokio::sync::watch::Sender<Option<String>>>,
}

impl RetellSession {
    pub(crate) fn new(cfg: RetellConfig, metrics: Arc<Metrics>, mut state: Lease) -> Self {
        Self {
            tools: Offered::new(&cfg, Vec::new()),
            bound: ContextBound::from_config(&cfg),
            cfg,
            metrics,
            call_id: state.call_id().to_owned(),
            control: state.take_control(),
            state,
            wall_clock: SystemTime::now,
            next_request: 0,
            active: None,
            apologize: None,
            telemetry: Vec::new(),
            saver: None,
        }
    }

    /// Feeds the tracker; its errors are this module's bugs, never the peer's.
    fn feed(&mut self, now: Instant, input: TrackerInput) {
        if let Err(e) = self.state.tracker.handle_input(now, input) {
            tracing::warn!(%e, "Retell tracker refused an input");
        }
    }

    fn send(&mut self, now: Instant, ev: ServerEvent) {
        self.feed(now, TrackerInput::Send(ev));
    }

    /// Sends everything the tracker wants sent and acts on the rest; at a turn boundary (a
    /// request, a response done or stopped, a tool call, the call's details) the conversation
    /// is saved for other instances.
    fn drain(&mut self, now: Instant, out: &mut Out) {
        let mut boundary = false;
        while let Some(o) = self.state.tracker.poll_output() {
            boundary |= match &o {
                TrackerOutput::Generate(_)
                | TrackerOutput::Stop { .. }
                | TrackerOutput::CallDetails(_) => true,
                TrackerOutput::Send(ev) => match ev {
                    ServerEvent::Response(r) => r.content_complete,
                    ServerEvent::ToolCallInvocation(_) | ServerEvent::ToolCallResult(_) => true,
                    _ => false,
                },
                _ => false,
            };
            match o {
                TrackerOutput::Send(ev) => match ev.to_json() {
                    Ok(text) => out.send(ServerFrame::Text(text)),
                    Err(e) => tracing::warn!(%e, "cannot encode a Retell event"),
                },
                TrackerOutput::Generate(g) => self.start(now, &g, out),
                TrackerOutput::Stop { response_id } => self.stop(now, response_id, out),
                TrackerOutput::CallDetails(mut call) => {
                    // Kept for the call's life and its resume window: bounded.
                    let dropped = call.cap(&voxgate_retell::CallBounds::default());
                    if !dropped.is_empty() {
                        tracing::warn!(
                            dropped = %dropped.join(", "),
                            "Retell call_details over their bounds: not kept"
                        );
                    }
                    self.state.call = Some(call);
                }
                TrackerOutput::Update(_) => {}
                TrackerOutput::Unknown(u) => {
                    tracing::debug!(tag = %u.tag, "unknown Retell event ignored");
                }
                TrackerOutput::RetellSilent => {
                    // Retell reconnects to the same URL; the call resumes then.
                    out.close(close_code::NORMAL, "no ping from Retell");
                }
                other => tracing::debug!(?other, "tracker output ignored"),
            }
        }
        if boundary && let Some(saver) = &self.saver {
            let _ = saver.send(Some(self.state.to_saved()));
        }
    }

    fn bad_frame(&mut self, now: Instant, error: &str, request: Option<(RequestKind, u64)>) {
        self.metrics.error(Door::Retell);
        tracing::info!(%error, "unreadable Retell frame");
        if let Some((kind, response_id)) = request {
            // Retell waits for an answer to this id: let the tracker make it current (and
            // stop whatever it supersedes), then answer it with the apology.
            self.apologize = Some(response_id);
            let body = ResponseRequest {
                response_id,
                ..ResponseRequest::default()
            };
            self.feed(
                now,
                TrackerInput::Received(match kind {
                    RequestKind::Reminder => RetellEvent::ReminderRequired(body),
                    _ => RetellEvent::ResponseRequired(body),
                }),
            );
        }
    }

    fn start(&mut self, now: Instant, g: &Generate, out: &mut Out) {
        if let Some(old) = self.active.take() {
            old.cancel(now, out, &mut self.telemetry);
            self.cut(now, old.response_id);
        }
        if g.kind == RequestKind::Begin {
            return;
        }
        self.telemetry.push(TurnEvent::UserTurn {
            turn: turn_id(g.response_id),
            speech: true,
            at: now,
        });
        if self.apologize.take_if(|id| *id == g.response_id).is_some() {
            let apology = self.cfg.apology.clone();
            self.finish_response(now, g.response_id, apology, None, &[]);
            return;
        }
        let system = tools::system_prompt(&self.cfg.system_prompt, self.state.call.as_ref());
        let messages = tools::context(&system, g, self.bound);
        let mut active = Active {
            response_id: g.response_id,
            request: RequestId(0),
            messages,
            round_text: String::new(),
            round_calls: Vec::new(),
            round_results: Vec::new(),
            rounds: 0,
            action: None,
            tools_used: Vec::new(),
            space_before_next: false,
            stripper: FragmentStripper::new(),
            server_calls: Vec::new(),
            round_over: false,
        };
        self.generate(&mut active, out);
        self.active = Some(active);
    }

    /// Starts one LLM round for `active`.
    fn generate(&mut self, active: &mut Active, out: &mut Out) {
        self.next_request += 1;
        active.request = RequestId(self.next_request);
        active.rounds += 1;
        out.provider(ProviderRequest::Generate {
            id: active.request,
            turn: turn_id(active.response_id),
            messages: active.messages.clone(),
            tools: self.tools.specs().to_vec(),
            temperature: None,
        });
    }

    fn stop(&mut self, now: Instant, response_id: u64, out: &mut Out) {
        if self
            .active
            .as_ref()
            .is_some_and(|a| a.response_id == response_id)
            && let Some(a) = self.active.take()
        {
            a.cancel(now, out, &mut self.telemetry);
            self.cut(now, response_id);
        }
    }

    /// A response still generating was superseded or stopped: Retell interrupted it.
    fn cut(&mut self, now: Instant, response_id: u64) {
        let turn = turn_id(response_id);
        self.telemetry.push(TurnEvent::Interrupted {
            turn,
            barge_in: None,
            at: now,
        });
        self.telemetry.push(TurnEvent::ResponseEnded {
            turn,
            interrupted: true,
            at: now,
        });
    }

    fn provider_event(&mut self, now: Instant, event: ProviderEvent, out: &mut Out) {
        let Some(mut active) = self.active.take() else {
            return;
        };
        if let Some(i) = active.server_calls.iter().position(|c| c.id == event.id()) {
            self.server_result(now, active, i, event, out);
            return;
        }
        if event.id() != active.request {
            // A late event of a cancelled round.
            self.active = Some(active);
            return;
        }
        match event {
            ProviderEvent::TextDelta { delta, .. } => {
                // After end_call / transfer_call only the closing message is said.
                let delta = if active.action.is_none() {
                    active.stripper.push(&delta)
                } else {
                    String::new()
                };
                if !delta.is_empty() {
                    let delta = if std::mem::take(&mut active.space_before_next)
                        && !delta.starts_with(char::is_whitespace)
                    {
                        format!(" {delta}")
                    } else {
                        delta
                    };
                    active.round_text.push_str(&delta);
                    let chunk = voxgate_retell::Response::chunk(active.response_id, delta, false);
                    self.send(now, ServerEvent::Response(chunk));
                }
                self.active = Some(active);
            }
            ProviderEvent::ToolCall {
                call_id,
                name,
                arguments,
                ..
            } => {
                self.tool_call(now, &mut active, call_id, name, arguments, out);
                self.active = Some(active);
            }
            ProviderEvent::Done { .. } if !active.server_calls.is_empty() => {
                // The round goes on once the MCP calls are answered.
                active.round_over = true;
                self.active = Some(active);
            }
            ProviderEvent::Done { .. } => self.round_done(now, active, out),
            ProviderEvent::Failed { message, .. } => {
                tracing::warn!(%message, response_id = active.response_id, "LLM failed");
                self.metrics.error(Door::Retell);
                let apology = self.cfg.apology.clone();
                // Whatever was already streamed stays said; the apology completes it.
                let content = if active.round_text.is_empty() {
                    apology
                } else {
                    format!(" {apology}")
                };
                active.cancel_calls(now, out, &mut self.telemetry);
                self.finish_response(now, active.response_id, content, None, &active.tools_used);
            }
            _ => self.active = Some(active),
        }
    }

    fn tool_call(
        &mut self,
        now: Instant,
        active: &mut Active,
        call_id: String,
        name: String,
        arguments: serde_json::Value,
        out: &mut Out,
    ) {
        if active.round_calls.len() + usize::from(active.action.is_some())
            >= MAX_TOOL_CALLS_PER_ROUND
        {
            tracing::debug!(%name, "tool call over the per-round limit ignored");
            return;
        }
        active.tools_used.push(name.clone());
        // Chat APIs deliver arguments as JSON text; unparsable text arrives as a string.
        let (args_text, args) = match arguments {
            serde_json::Value::String(raw) => {
                let parsed = serde_json::from_str(&raw).unwrap_or(serde_json::Value::Null);
                (raw, parsed)
            }
            v => (v.to_string(), v),
        };
        let unix = (self.wall_clock)()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        let outcome = match self.tools.route(&name, &args) {
            Route::BuiltIn => tools::run(&self.cfg, self.state.call.as_ref(), &name, &args, unix),
            Route::Refused(content) => ToolOutcome::Result(content),
            Route::Server {
                source,
                name: tool,
                arguments,
            } => {
                // Reported now; the result follows when the MCP server answers.
                self.send(
                    now,
                    ServerEvent::ToolCallInvocation(ToolCallInvocation {
                        tool_call_id: call_id.clone(),
                        name: name.clone(),
                        arguments: args_text,
                    }),
                );
                self.next_request += 1;
                let id = RequestId(self.next_request);
                out.provider(ProviderRequest::CallTool {
                    id,
                    turn: turn_id(active.response_id),
                    call_id: call_id.clone(),
                    source,
                    name: tool.clone(),
                    arguments,
                });
                active.round_calls.push(ContextToolCall {
                    id: call_id.clone(),
                    name,
                    arguments: args,
                });
                active.server_calls.push(ServerCall {
                    id,
                    call_id,
                    tool,
                    sent: now,
                });
                return;
            }
        };
        match outcome {
            ToolOutcome::Result(content) => {
                self.send(
                    now,
                    ServerEvent::ToolCallInvocation(ToolCallInvocation {
                        tool_call_id: call_id.clone(),
                        name: name.clone(),
                        arguments: args_text,
                    }),
                );
                self.send(
                    now,
                    ServerEvent::ToolCallResult(ToolCallResult {
                        tool_call_id: call_id.clone(),
                        content: content.clone(),
                    }),
                );
                active.round_calls.push(ContextToolCall {
                    id: call_id.clone(),
                    name,
                    arguments: args,
                });
                let mut result = ContextMessage::new(ChatRole::Tool, content);
                result.tool_call_id = Some(call_id);
                active.round_results.push(result);
            }
            action => {
                if active.action.is_none() {
                    active.action = Some(action);
                }
            }
        }
    }

    /// The answer to the MCP call `active.server_calls[i]`: reported to Retell and put in the
    /// next round's context; the last one of a finished round continues the response.
    fn server_result(
        &mut self,
        now: Instant,
        mut active: Active,
        i: usize,
        event: ProviderEvent,
        out: &mut Out,
    ) {
        let (content, outcome) = match event {
            ProviderEvent::ToolOutput { text, ok, .. } => (
                text,
                if ok {
                    CallOutcome::Ok
                } else {
                    CallOutcome::Error
                },
            ),
            ProviderEvent::Failed { message, .. } => {
                (format!("Error: {message}"), CallOutcome::Error)
            }
            _ => {
                self.active = Some(active);
                return;
            }
        };
        let call = active.server_calls.remove(i);
        self.telemetry
            .push(call.ended(active.response_id, outcome, now));
        let call_id = call.call_id;
        self.send(
            now,
            ServerEvent::ToolCallResult(ToolCallResult {
                tool_call_id: call_id.clone(),
                content: content.clone(),
            }),
        );
        let mut result = ContextMessage::new(ChatRole::Tool, content);
        result.tool_call_id = Some(call_id);
        active.round_results.push(result);
        if active.round_over && active.server_calls.is_empty() {
            active.round_over = false;
            self.round_done(now, active, out);
        } else {
            self.active = Some(active);
        }
    }

    fn round_done(&mut self, now: Instant, mut active: Active, out: &mut Out) {
        if let Some(action) = active.action.take() {
            let (message, action) = match action {
                ToolOutcome::EndCall { message } => (message, Some(Action::EndCall)),
                ToolOutcome::Transfer { number, message } => {
                    (message, Some(Action::Transfer(number)))
                }
                ToolOutcome::Result(_) => (String::new(), None),
            };
            let message = emotion::strip_emoji(&message).into_owned();
            let message = if !message.is_empty() && !active.round_text.is_empty() {
                format!(" {message}")
            } else {
                message
            };
            self.finish_response(now, active.response_id, message, action, &active.tools_used);
            return;
        }
        if !active.round_calls.is_empty() && active.rounds < self.cfg.max_tool_rounds {
            // Continue the same response with the tool results in context.
            active.space_before_next = active
                .round_text
                .chars()
                .last()
                .is_some_and(|c| !c.is_whitespace());
            let mut assistant =
                ContextMessage::new(ChatRole::Assistant, std::mem::take(&mut active.round_text));
            assistant.tool_calls = std::mem::take(&mut active.round_calls);
            active.messages.push(assistant);
            active.messages.append(&mut active.round_results);
            self.generate(&mut active, out);
            self.active = Some(active);
            return;
        }
        let (id, tools_used) = (active.response_id, active.tools_used);
        self.finish_response(now, id, String::new(), None, &tools_used);
    }

    /// The last chunk of a response, then its metadata.
    fn finish_response(
        &mut self,
        now: Instant,
        response_id: u64,
        content: String,
        action: Option<Action>,
        tools_used: &[String],
    ) {
        let mut r = voxgate_retell::Response::chunk(response_id, content, true);
        match &action {
            Some(Action::EndCall) => r.end_call = Some(true),
            Some(Action::Transfer(n)) => r.transfer_number = Some(n.clone()),
            None => {}
        }
        let current = self.state.tracker.is_current(response_id);
        self.send(now, ServerEvent::Response(r));
        if !current {
            return;
        }
        self.metrics.turn(Door::Retell);
        self.telemetry.push(TurnEvent::ResponseEnded {
            turn: turn_id(response_id),
            interrupted: false,
            at: now,
        });
        if self.cfg.metadata {
            let mut m = serde_json::json!({
                "voxgate": {
                    "response_id": response_id,
                    "tools": tools_used,
                }
            });
            match action {
                Some(Action::EndCall) => m["voxgate"]["end_call"] = true.into(),
                Some(Action::Transfer(n)) => m["voxgate"]["transfer_number"] = n.into(),
                None => {}
            }
            self.send(now, ServerEvent::Metadata(Metadata { metadata: Some(m) }));
        }
    }

    fn control(&mut self, now: Instant, c: Control) {
        if !self.state.tracker.is_connected() {
            let message = "the call is not connected".to_owned();
            match c {
                Control::Interrupt { reply, .. } => {
                    let _ = reply.send(Err(message));
                }
                Control::Metadata { reply, .. } => {
                    let _ = reply.send(Err(message));
                }
            }
            return;
        }
        match c {
            Control::Interrupt { body, reply } => {
                let id = match body.interrupt_id {
                    Some(id) => id,
                    None => self.state.tracker.next_interrupt_id(),
                };
                let interrupt = AgentInterrupt {
                    interrupt_id: id,
                    content: body.content,
                    content_complete: body.content_complete.unwrap_or(true),
                    no_interruption_allowed: Some(body.no_interruption_allowed.unwrap_or(true)),
                    end_call: body.end_call,
                    transfer_number: body.transfer_number.filter(|n| !n.is_empty()),
                    ..AgentInterrupt::default()
                };
                self.send(now, ServerEvent::AgentInterrupt(interrupt));
                let _ = reply.send(Ok(id));
            }
            Control::Metadata { metadata, reply } => {
                let metadata = Metadata {
                    metadata: Some(metadata),
                };
                self.send(now, ServerEvent::Metadata(metadata));
                let _ = reply.send(Ok(()));
            }
        }
    }
}

/// The turn id a Retell response id stands for in the engine's terms.
fn turn_id(response_id: u64) -> TurnId {
    TurnId(u32::try_from(response_id).unwrap_or(u32::MAX))
}

impl Translator for RetellSession {
    type In = Incoming;
    type Event = Control;

    /// Retell takes every close code but 1000 as the call failing.
    const SHUTDOWN_CLOSE_CODE: u16 = close_code::NORMAL;

    fn decode(frame: ClientFrame, max_frame_bytes: usize) -> Inbound<Incoming> {
        let len = match &frame {
            ClientFrame::Text(t) => t.len(),
            ClientFrame::Binary(b) => b.len(),
        };
        if len > max_frame_bytes {
            return Inbound::Keep(Incoming::Bad {
                error: format!("frame of {len} bytes over the limit"),
                request: None,
            });
        }
        Inbound::Keep(match frame {
            ClientFrame::Text(t) => decode(t.as_str()),
            // Not Retell's framing, but JSON in a binary frame is still readable.
            ClientFrame::Binary(b) => match std::str::from_utf8(&b) {
                Ok(t) => decode(t),
                Err(_) => Incoming::Bad {
                    error: "binary frame that is not UTF-8 JSON".into(),
                    request: None,
                },
            },
        })
    }

    /// The server speaks first: config, the begin message (first socket of the call only) and
    /// `update_agent` (once per call).
    fn on_start(&mut self, now: Instant, out: &mut Out) {
        let connected = TrackerInput::Connected {
            call_id: self.call_id.clone(),
        };
        self.feed(now, connected);
        if !self.state.agent_updated
            && let Some(agent) = self.cfg.agent.to_agent_config()
        {
            self.state.agent_updated = true;
            self.send(now, ServerEvent::UpdateAgent(agent));
        }
        self.drain(now, out);
    }

    fn on_client(&mut self, now: Instant, msg: Incoming, out: &mut Out) {
        match msg {
            Incoming::Event(ev) => self.feed(now, TrackerInput::Received(ev)),
            Incoming::Bad { error, request } => self.bad_frame(now, &error, request),
        }
        self.drain(now, out);
        // A salvaged request is answered in the drain above, or was a repeat the tracker
        // ignored: either way nothing is owed any more.
        self.apologize = None;
    }

    fn on_provider(&mut self, now: Instant, event: ProviderEvent, out: &mut Out) {
        self.provider_event(now, event, out);
        self.drain(now, out);
    }

    fn on_timeout(&mut self, now: Instant, out: &mut Out) {
        self.state.tracker.handle_timeout(now);
        self.drain(now, out);
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.state.tracker.poll_timeout()
    }

    /// Retell sends no initialization message (the server speaks first): a socket that got
    /// the call's state is a session.
    fn initialized(&self) -> bool {
        true
    }

    /// A response being streamed is let finish; the close (1000) follows it.
    fn is_idle(&self) -> bool {
        self.active.is_none()
    }

    fn on_server_tools(
        &mut self,
        _now: Instant,
        tools: Vec<voxgate_engine::ServerToolDefinition>,
        _out: &mut Out,
    ) {
        // Offered from the next round on (calls already sent finish as they were sent).
        self.tools = Offered::new(&self.cfg, tools);
    }

    fn take_telemetry(&mut self, sink: &mut Vec<TurnEvent>) {
        sink.append(&mut self.telemetry);
    }

    fn on_close(&mut self, now: Instant, out: &mut Out) {
        if let Some(a) = self.active.take() {
            a.cancel(now, out, &mut self.telemetry);
        }
        self.feed(now, TrackerInput::Disconnected);
        // Only stops of the response just cancelled remain; the socket is gone.
        while self.state.tracker.poll_output().is_some() {}
    }

    fn events(&mut self) -> Option<&mut mpsc::Receiver<Control>> {
        self.control.as_mut()
    }

    fn on_event(&mut self, now: Instant, event: Option<Control>, out: &mut Out) {
        match event {
            Some(c) => self.control(now, c),
            // The registry holds the sender while this socket has the call, so this does not
            // happen; if it did, there is nothing left to listen to.
            None => self.control = None,
        }
        self.drain(now, out);
    }
}

#[cfg(test)]
mod tests;
