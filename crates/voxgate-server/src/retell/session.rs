//! One Retell socket: a reader and a writer task around a loop that feeds the call's
//! [`ResponseTracker`] and runs the LLM for each request.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use futures::{SinkExt, StreamExt};
use tokio::sync::{OwnedMutexGuard, mpsc, watch};
use voxgate_engine::provider::{ChatRole, ContextMessage, ContextToolCall, ToolSpec};
use voxgate_engine::{ProviderEvent, ProviderRequest, RequestId, TurnId};
use voxgate_retell::{
    AgentInterrupt, BeginMessage, Call, ConfigBody, Generate, Metadata, RequestKind,
    ResponseRequest, ResponseTracker, RetellEvent, ServerEvent, ToolCallInvocation, ToolCallResult,
    TrackerConfig, TrackerInput, TrackerOutput,
};

use super::tools::{self, ToolOutcome};
use super::{Control, Registry, RetellConfig};
use crate::metrics::{Door, Metrics};
use crate::providers::Runner;
use crate::server::App;

/// What survives a socket: everything Retell expects to continue after a reconnect.
#[derive(Debug)]
pub(crate) struct CallState {
    tracker: ResponseTracker,
    call: Option<Call>,
    agent_updated: bool,
}

impl CallState {
    fn new(cfg: &RetellConfig) -> Self {
        let begin = cfg.begin_message.clone();
        let tracker = ResponseTracker::new(TrackerConfig {
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
        });
        Self {
            tracker,
            call: None,
            agent_updated: false,
        }
    }
}

/// A decoded frame, or what could be salvaged from an unreadable one.
enum Incoming {
    Event(RetellEvent),
    /// Unreadable; `request` is set when it still named a request we owe an answer.
    Bad {
        error: String,
        request: Option<(RequestKind, u64)>,
    },
}

enum Outgoing {
    Text(String),
    /// Close with 1000 (the only code Retell takes as a normal end) and this reason.
    Close(&'static str),
}

const IN_QUEUE: usize = 64;
const OUT_QUEUE: usize = 256;
/// How long a new socket waits for the previous socket of the same call to let go.
const TAKEOVER_WAIT: Duration = Duration::from_secs(5);

/// Serves one upgraded Retell socket for `call_id`.
pub(crate) async fn serve(
    socket: WebSocket,
    app: Arc<App>,
    registry: Arc<Registry>,
    call_id: String,
) {
    let metrics = Arc::clone(&app.metrics);
    let _active = metrics.session(Door::Retell);
    let cfg = &app.config.retell;
    let window = Duration::from_secs(cfg.resume_window_secs);
    let attached = registry.attach(&call_id, window, || CallState::new(cfg));
    let generation = attached.generation;

    let (mut sink, mut stream) = socket.split();
    let (in_tx, in_rx) = mpsc::channel::<Incoming>(IN_QUEUE);
    let (out_tx, mut out_rx) = mpsc::channel::<Outgoing>(OUT_QUEUE);
    let reader = tokio::spawn(async move {
        while let Some(Ok(msg)) = stream.next().await {
            let incoming = match msg {
                Message::Text(t) => decode(t.as_str()),
                // Not Retell's framing, but JSON in a binary frame is still readable.
                Message::Binary(b) => match std::str::from_utf8(&b) {
                    Ok(t) => decode(t),
                    Err(_) => Incoming::Bad {
                        error: "binary frame that is not UTF-8 JSON".into(),
                        request: None,
                    },
                },
                Message::Close(_) => break,
                Message::Ping(_) | Message::Pong(_) => continue,
            };
            if in_tx.send(incoming).await.is_err() {
                break;
            }
        }
    });
    let writer = tokio::spawn(async move {
        while let Some(out) = out_rx.recv().await {
            match out {
                Outgoing::Text(t) => {
                    if sink.send(Message::Text(t.into())).await.is_err() {
                        return;
                    }
                }
                Outgoing::Close(reason) => {
                    let frame = CloseFrame {
                        code: 1000,
                        reason: reason.into(),
                    };
                    let _ = sink.send(Message::Close(Some(frame))).await;
                    return;
                }
            }
        }
    });

    // Wait for an older socket of this call (told to leave by `attach`) to release the state.
    match tokio::time::timeout(TAKEOVER_WAIT, Arc::clone(&attached.state).lock_owned()).await {
        Ok(state) => {
            let (runner, provider_rx) = Runner::new(app.providers.clone(), Arc::clone(&metrics));
            let mut session = Session {
                cfg: cfg.clone(),
                tools: tools::specs(cfg),
                metrics: Arc::clone(&metrics),
                state,
                out: out_tx,
                runner,
                next_request: 0,
                active: None,
                apologize: HashSet::new(),
            };
            session
                .run(
                    &call_id,
                    generation,
                    in_rx,
                    provider_rx,
                    attached.kick,
                    attached.control,
                    app.shutdown.clone(),
                )
                .await;
            // Dropping the session aborts provider work, releases the call state and closes
            // the writer's queue.
            drop(session);
        }
        Err(_) => {
            tracing::warn!(%call_id, "previous socket of this call did not let go");
            let _ = out_tx.send(Outgoing::Close("call busy")).await;
            drop(out_tx);
        }
    }
    reader.abort();
    let _ = writer.await;
    registry.detach(&call_id, generation, window);
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

#[derive(Debug, PartialEq, Eq)]
enum Flow {
    Continue,
    Close(&'static str),
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
}

struct Session {
    cfg: RetellConfig,
    tools: Vec<ToolSpec>,
    metrics: Arc<Metrics>,
    state: OwnedMutexGuard<CallState>,
    out: mpsc::Sender<Outgoing>,
    runner: Runner,
    next_request: u64,
    active: Option<Active>,
    /// Requests whose frame was unreadable: they get the apology instead of the LLM.
    apologize: HashSet<u64>,
}

impl Session {
    #[allow(clippy::too_many_arguments)]
    async fn run(
        &mut self,
        call_id: &str,
        generation: u64,
        mut in_rx: mpsc::Receiver<Incoming>,
        mut provider_rx: mpsc::Receiver<ProviderEvent>,
        mut kick: watch::Receiver<u64>,
        mut control: mpsc::Receiver<Control>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut flow = if *shutdown.borrow() {
            Flow::Close("server shutting down")
        } else if *kick.borrow() != generation {
            Flow::Close("replaced by a newer connection")
        } else {
            let now = Instant::now();
            let connected = TrackerInput::Connected {
                call_id: call_id.to_owned(),
            };
            if let Err(e) = self.state.tracker.handle_input(now, connected) {
                tracing::warn!(%e, "tracker refused the connection");
            }
            if !self.state.agent_updated
                && let Some(agent) = self.cfg.agent.to_agent_config()
            {
                self.state.agent_updated = true;
                self.send(ServerEvent::UpdateAgent(agent));
            }
            self.drain().await
        };
        while flow == Flow::Continue {
            let deadline = self.state.tracker.poll_timeout();
            let sleep_until = deadline
                .map(tokio::time::Instant::from_std)
                .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
            flow = tokio::select! {
                incoming = in_rx.recv() => match incoming {
                    None => break,
                    Some(Incoming::Event(ev)) => {
                        self.feed(TrackerInput::Received(ev));
                        Flow::Continue
                    }
                    Some(Incoming::Bad { error, request }) => {
                        self.bad_frame(&error, request);
                        Flow::Continue
                    }
                },
                Some(event) = provider_rx.recv() => {
                    self.runner.finished(&event);
                    self.provider_event(event);
                    Flow::Continue
                }
                Some(c) = control.recv() => {
                    self.control(c);
                    Flow::Continue
                }
                () = tokio::time::sleep_until(sleep_until), if deadline.is_some() => {
                    self.state.tracker.handle_timeout(Instant::now());
                    Flow::Continue
                }
                _ = kick.changed() => Flow::Close("replaced by a newer connection"),
                _ = shutdown.changed() => Flow::Close("server shutting down"),
            };
            if flow == Flow::Continue {
                flow = self.drain().await;
            }
        }
        if let Flow::Close(reason) = flow {
            let _ = self.out.send(Outgoing::Close(reason)).await;
        }
        let _ = self
            .state
            .tracker
            .handle_input(Instant::now(), TrackerInput::Disconnected);
        // Only stops remain (the socket is gone); the runner is dropped with the session.
        while self.state.tracker.poll_output().is_some() {}
    }

    /// Feeds the tracker; its errors are this module's bugs, never the peer's.
    fn feed(&mut self, input: TrackerInput) {
        if let Err(e) = self.state.tracker.handle_input(Instant::now(), input) {
            tracing::warn!(%e, "Retell tracker refused an input");
        }
    }

    fn send(&mut self, ev: ServerEvent) {
        self.feed(TrackerInput::Send(ev));
    }

    fn bad_frame(&mut self, error: &str, request: Option<(RequestKind, u64)>) {
        self.metrics.error(Door::Retell);
        tracing::info!(%error, "unreadable Retell frame");
        if let Some((kind, response_id)) = request {
            // Retell waits for an answer to this id: let the tracker make it current (and
            // stop whatever it supersedes), then answer it with the apology.
            self.apologize.insert(response_id);
            let body = ResponseRequest {
                response_id,
                ..ResponseRequest::default()
            };
            self.feed(TrackerInput::Received(match kind {
                RequestKind::Reminder => RetellEvent::ReminderRequired(body),
                _ => RetellEvent::ResponseRequired(body),
            }));
        }
    }

    /// Sends everything the tracker wants sent and acts on the rest.
    async fn drain(&mut self) -> Flow {
        while let Some(out) = self.state.tracker.poll_output() {
            match out {
                TrackerOutput::Send(ev) => match ev.to_json() {
                    Ok(text) => {
                        if self.out.send(Outgoing::Text(text)).await.is_err() {
                            return Flow::Close("socket gone");
                        }
                    }
                    Err(e) => tracing::warn!(%e, "cannot encode a Retell event"),
                },
                TrackerOutput::Generate(g) => self.start(&g),
                TrackerOutput::Stop { response_id } => self.stop(response_id),
                TrackerOutput::CallDetails(call) => self.state.call = Some(call),
                TrackerOutput::Update(_) => {}
                TrackerOutput::Unknown(u) => {
                    tracing::debug!(tag = %u.tag, "unknown Retell event ignored");
                }
                TrackerOutput::RetellSilent => {
                    // Retell reconnects to the same URL; the call resumes then.
                    return Flow::Close("no ping from Retell");
                }
                other => tracing::debug!(?other, "tracker output ignored"),
            }
        }
        Flow::Continue
    }

    fn start(&mut self, g: &Generate) {
        if let Some(old) = self.active.take() {
            self.runner
                .start(ProviderRequest::Cancel { id: old.request });
        }
        if g.kind == RequestKind::Begin {
            return;
        }
        if self.apologize.remove(&g.response_id) {
            let apology = self.cfg.apology.clone();
            self.finish_response(g.response_id, apology, None, &[]);
            return;
        }
        let system = tools::system_prompt(&self.cfg.system_prompt, self.state.call.as_ref());
        let messages = tools::context(&system, g);
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
        };
        self.generate(&mut active);
        self.active = Some(active);
    }

    /// Starts one LLM round for `active`.
    fn generate(&mut self, active: &mut Active) {
        self.next_request += 1;
        active.request = RequestId(self.next_request);
        active.rounds += 1;
        self.runner.start(ProviderRequest::Generate {
            id: active.request,
            turn: TurnId(u32::try_from(active.response_id).unwrap_or(u32::MAX)),
            messages: active.messages.clone(),
            tools: self.tools.clone(),
            temperature: None,
        });
    }

    fn stop(&mut self, response_id: u64) {
        if self
            .active
            .as_ref()
            .is_some_and(|a| a.response_id == response_id)
            && let Some(a) = self.active.take()
        {
            self.runner.start(ProviderRequest::Cancel { id: a.request });
        }
    }

    fn provider_event(&mut self, event: ProviderEvent) {
        let Some(mut active) = self.active.take() else {
            return;
        };
        if event.id() != active.request {
            // A late event of a cancelled round.
            self.active = Some(active);
            return;
        }
        match event {
            ProviderEvent::TextDelta { delta, .. } => {
                // After end_call / transfer_call only the closing message is said.
                if active.action.is_none() && !delta.is_empty() {
                    let delta = if std::mem::take(&mut active.space_before_next)
                        && !delta.starts_with(char::is_whitespace)
                    {
                        format!(" {delta}")
                    } else {
                        delta
                    };
                    active.round_text.push_str(&delta);
                    self.send(ServerEvent::Response(voxgate_retell::Response::chunk(
                        active.response_id,
                        delta,
                        false,
                    )));
                }
                self.active = Some(active);
            }
            ProviderEvent::ToolCall {
                call_id,
                name,
                arguments,
                ..
            } => {
                self.tool_call(&mut active, call_id, name, arguments);
                self.active = Some(active);
            }
            ProviderEvent::Done { .. } => self.round_done(active),
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
                self.finish_response(active.response_id, content, None, &active.tools_used);
            }
            _ => self.active = Some(active),
        }
    }

    fn tool_call(
        &mut self,
        active: &mut Active,
        call_id: String,
        name: String,
        arguments: serde_json::Value,
    ) {
        active.tools_used.push(name.clone());
        // Chat APIs deliver arguments as JSON text; unparsable text arrives as a string.
        let (args_text, args) = match arguments {
            serde_json::Value::String(raw) => {
                let parsed = serde_json::from_str(&raw).unwrap_or(serde_json::Value::Null);
                (raw, parsed)
            }
            v => (v.to_string(), v),
        };
        let outcome = tools::run(&self.cfg, self.state.call.as_ref(), &name, &args);
        match outcome {
            ToolOutcome::Result(content) => {
                self.send(ServerEvent::ToolCallInvocation(ToolCallInvocation {
                    tool_call_id: call_id.clone(),
                    name: name.clone(),
                    arguments: args_text,
                }));
                self.send(ServerEvent::ToolCallResult(ToolCallResult {
                    tool_call_id: call_id.clone(),
                    content: content.clone(),
                }));
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

    fn round_done(&mut self, mut active: Active) {
        if let Some(action) = active.action.take() {
            let (message, action) = match action {
                ToolOutcome::EndCall { message } => (message, Some(Action::EndCall)),
                ToolOutcome::Transfer { number, message } => {
                    (message, Some(Action::Transfer(number)))
                }
                ToolOutcome::Result(_) => (String::new(), None),
            };
            let message = if !message.is_empty() && !active.round_text.is_empty() {
                format!(" {message}")
            } else {
                message
            };
            self.finish_response(active.response_id, message, action, &active.tools_used);
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
            self.generate(&mut active);
            self.active = Some(active);
            return;
        }
        self.finish_response(active.response_id, String::new(), None, &active.tools_used);
    }

    /// The last chunk of a response, then its metadata.
    fn finish_response(
        &mut self,
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
        self.send(ServerEvent::Response(r));
        if !current {
            return;
        }
        self.metrics.turn(Door::Retell);
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
            self.send(ServerEvent::Metadata(Metadata { metadata: Some(m) }));
        }
    }

    fn control(&mut self, c: Control) {
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
                self.send(ServerEvent::AgentInterrupt(AgentInterrupt {
                    interrupt_id: id,
                    content: body.content,
                    content_complete: body.content_complete.unwrap_or(true),
                    no_interruption_allowed: Some(body.no_interruption_allowed.unwrap_or(true)),
                    end_call: body.end_call,
                    transfer_number: body.transfer_number.filter(|n| !n.is_empty()),
                    ..AgentInterrupt::default()
                }));
                let _ = reply.send(Ok(id));
            }
            Control::Metadata { metadata, reply } => {
                self.send(ServerEvent::Metadata(Metadata {
                    metadata: Some(metadata),
                }));
                let _ = reply.send(Ok(()));
            }
        }
    }
}

/// What a finished response asks Retell to do once it is spoken.
enum Action {
    EndCall,
    Transfer(String),
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
