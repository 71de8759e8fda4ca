//! `/api/message` conversations: one text-only [`Engine`] per conversation key, kept between
//! requests so the model sees the history, and the turn loop that drives it with the configured
//! LLM and the MCP hub's tools.
//!
//! A brain that runs a process per conversation (an ACP agent) is what one anonymous client
//! could otherwise multiply by inventing `session_id`s, so before a turn the conversation
//! reserves its process ([`voxgate_providers::Llm::reserve_process`]): a place among the
//! agent's `max_processes`, and an admission permit of the Bridge door for the request's peer
//! (the process is a session in `[limits]` terms: `max_sessions`, `max_sessions_per_ip`, the
//! per-address handshake rate). Both are held while the process runs and given back when it
//! ends (idle stop, exit, the conversation forgotten); a request that cannot have them is
//! refused before the turn, with `Retry-After`. The history stays here either way.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use voxgate_engine::emotion::EmojiPolicy;
use voxgate_engine::{ClientEvent, Engine, EngineConfig, Input, Output, State, TriggerMode};
use voxgate_providers::{ProcessHold, ProviderError};

use crate::admission::{Admission, Refusal};
use crate::mcp_endpoint::hub::{McpHub, Scope};
use crate::metrics::{Door, Metrics};
use crate::providers::{Providers, Runner};

/// How a conversation's replies are shaped.
#[derive(Debug, Clone)]
pub(crate) struct Persona {
    /// The system prompt.
    pub(crate) system_prompt: String,
    /// For emoji channels: the faces allowed and the default; the reply always starts with one.
    pub(crate) emoji: Option<EmojiPolicy>,
    /// Messages the conversation's history keeps in memory (`[limits]`; 0: unlimited).
    pub(crate) max_history_messages: usize,
    /// `[bridge.engine]` (over `[engine]` once the server resolved it).
    pub(crate) engine: crate::config::EngineSettings,
}

/// One conversation.
pub(crate) struct Conversation {
    engine: Engine,
    emoji: Option<EmojiPolicy>,
    turns: u64,
    /// Made on the first turn and kept, so a stateful brain lives as long as the conversation.
    providers: Option<Providers>,
    /// With `[cluster]`: this instance's directory entry for the conversation, so messages
    /// that reach other instances are routed here; released when the conversation is dropped.
    pub(crate) directory: Option<crate::cluster::DirectoryEntry>,
}

impl std::fmt::Debug for Conversation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conversation")
            .field("turns", &self.turns)
            .finish_non_exhaustive()
    }
}

/// Why a turn produced no reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TurnError {
    /// The LLM failed.
    #[error("the language model failed: {0}")]
    Provider(String),
    /// The turn took longer than allowed.
    #[error("the agent did not answer within {0:?}")]
    Timeout(Duration),
    /// The engine refused the input.
    #[error("{0}")]
    Refused(String),
    /// The conversation table is full of conversations in use.
    #[error("too many conversations in progress")]
    Busy,
    /// Admission refused the conversation's agent process (a session of the Bridge door).
    #[error("{}", .0.message())]
    Admission(Refusal),
    /// Every agent process place is taken (what the brain said).
    #[error("{0}")]
    AgentsBusy(String),
}

/// `Retry-After` for [`TurnError::AgentsBusy`]: places come back as conversations end or
/// their agents idle out, which takes seconds, not milliseconds.
pub(crate) const AGENTS_BUSY_RETRY_SECS: u32 = 5;

/// What a turn needs from the server.
#[derive(Debug, Clone)]
pub(crate) struct TurnContext<'a> {
    pub(crate) providers: &'a Providers,
    pub(crate) metrics: &'a Arc<Metrics>,
    pub(crate) hub: &'a Arc<McpHub>,
    /// Which MCP endpoint tools to offer; `None` offers none.
    pub(crate) tools: Option<Scope>,
    pub(crate) tool_timeout: Duration,
    pub(crate) timeout: Duration,
    /// Admits the conversation's agent process as a Bridge session.
    pub(crate) admission: &'a Admission,
    /// Whom that session is counted against (the request's socket peer, as for every door).
    pub(crate) peer: IpAddr,
}

/// A finished turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reply {
    /// The reply text, emoji prefix enforced for emoji channels.
    pub(crate) text: String,
    /// Tools the model called, by name.
    pub(crate) tools_called: Vec<String>,
}

impl Conversation {
    pub(crate) fn new(persona: Persona, now: Instant) -> Result<Self, String> {
        let mut config = EngineConfig {
            output_audio: None,
            system_prompt: persona.system_prompt,
            // The engine reads the leading emoji as the face; for other channels any emoji
            // is read off so it can be put back in front unchanged.
            emotion: Some(
                persona
                    .emoji
                    .clone()
                    .unwrap_or_else(|| EmojiPolicy::any(String::new())),
            ),
            keep_user_audio: false,
            max_history_messages: persona.max_history_messages,
            ..EngineConfig::default()
        };
        persona.engine.apply(&mut config);
        let engine = Engine::new(config, now).map_err(|e| e.to_string())?;
        Ok(Self {
            engine,
            emoji: persona.emoji,
            turns: 0,
            providers: None,
            directory: None,
        })
    }

    /// Messages in the history.
    pub(crate) fn history_len(&self) -> usize {
        self.engine.history().len()
    }

    /// Runs one text turn to the end of the reply (tool calls and their follow-ups included).
    pub(crate) async fn turn(
        &mut self,
        ctx: &TurnContext<'_>,
        text: String,
    ) -> Result<Reply, TurnError> {
        let now = Instant::now();
        if self.engine.state() != State::Idle {
            // A previous request was dropped mid-turn (its client went away): end that reply.
            let _ = self.engine.handle_input(now, Input::Abort);
            while self.engine.poll_output().is_some() {}
        }
        // One brain per conversation across requests: an ACP agent keeps its own history.
        let providers = self
            .providers
            .get_or_insert_with(|| ctx.providers.for_conversation())
            .clone();
        // Before the engine sees the text: a refused request leaves no trace in the history.
        reserve_process(&providers, ctx)?;
        let tools = ctx
            .tools
            .as_ref()
            .map(|scope| ctx.hub.tool_definitions(scope))
            .unwrap_or_default();
        self.engine
            .handle_input(now, Input::SetTools(tools))
            .map_err(|e| TurnError::Refused(e.to_string()))?;
        self.engine
            .handle_input(
                now,
                Input::Text {
                    text,
                    mode: TriggerMode::Immediate,
                },
            )
            .map_err(|e| TurnError::Refused(e.to_string()))?;
        self.turns += 1;
        let (runner, provider_rx) =
            Runner::for_conversation(providers, Arc::clone(ctx.metrics), Door::Bridge);
        let mut run = TurnRun {
            runner,
            tool_calls: JoinSet::new(),
            emoji: None,
            text: String::new(),
            error: None,
            tools_called: Vec::new(),
            text_response_changed: false,
        };
        let outcome =
            tokio::time::timeout(ctx.timeout, run.drive(&mut self.engine, ctx, provider_rx)).await;
        if outcome.is_err() {
            let _ = self.engine.handle_input(Instant::now(), Input::Abort);
            while let Some(out) = self.engine.poll_output() {
                if let Output::Provider(r) = out {
                    run.runner.start(r);
                }
            }
            return Err(TurnError::Timeout(ctx.timeout));
        }
        if let Some(e) = run.error {
            return Err(TurnError::Provider(e));
        }
        let body = run.text.trim();
        let text = match (&self.emoji, run.emoji) {
            (Some(policy), face) => {
                let face = face.unwrap_or_else(|| policy.default_emoji().to_owned());
                policy.ensure_prefix(&join_face(&face, body))
            }
            (None, Some(face)) if !face.is_empty() => join_face(&face, body),
            (None, _) => body.to_owned(),
        };
        Ok(Reply {
            text,
            tools_called: run.tools_called,
        })
    }
}

/// Makes sure the conversation's brain has its process for the turn (a no-op for brains
/// without one): its place among the agent's processes and the Bridge admission permit it
/// is counted with.
fn reserve_process(providers: &Providers, ctx: &TurnContext<'_>) -> Result<(), TurnError> {
    let mut refused = None;
    let reserved = providers.llm.reserve_process(&mut || match ctx
        .admission
        .try_admit(Door::Bridge, ctx.peer)
    {
        Ok(permit) => Ok(Box::new(permit) as ProcessHold),
        Err(refusal) => {
            refused = Some(refusal);
            Err(ProviderError::Busy(refusal.message().to_owned()))
        }
    });
    reserved.map_err(|e| match refused {
        Some(refusal) => TurnError::Admission(refusal),
        None => {
            tracing::info!(error = %e, "bridge request refused: no agent process place");
            TurnError::AgentsBusy(match e {
                ProviderError::Busy(why) => why,
                other => other.to_string(),
            })
        }
    })
}

fn join_face(face: &str, body: &str) -> String {
    if body.is_empty() {
        face.to_owned()
    } else {
        format!("{face} {body}")
    }
}

struct TurnRun {
    runner: Runner,
    tool_calls: JoinSet<(String, String)>,
    /// The face of the first response of the turn.
    emoji: Option<String>,
    text: String,
    error: Option<String>,
    tools_called: Vec<String>,
    /// A response ended since the last text: the next text starts a follow-up response.
    text_response_changed: bool,
}

impl TurnRun {
    async fn drive(
        &mut self,
        engine: &mut Engine,
        ctx: &TurnContext<'_>,
        mut provider_rx: mpsc::Receiver<crate::providers::Arrived>,
    ) {
        loop {
            while let Some(out) = engine.poll_output() {
                match out {
                    Output::Provider(r) => self.runner.start(r),
                    Output::Client(event) => self.client_event(event, ctx),
                    _ => {}
                }
            }
            if engine.state() == State::Idle && self.tool_calls.is_empty() {
                return;
            }
            let deadline = engine.poll_timeout();
            let sleep_until = deadline
                .map(tokio::time::Instant::from_std)
                .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                Some(crate::providers::Arrived { event, .. }) = provider_rx.recv() => {
                    self.runner.finished(&event);
                    let _ = engine.handle_input(Instant::now(), Input::Provider(event));
                }
                Some(done) = self.tool_calls.join_next(), if !self.tool_calls.is_empty() => {
                    if let Ok((id, result)) = done
                        && let Err(e) =
                            engine.handle_input(Instant::now(), Input::ToolResult { id, result })
                    {
                        tracing::debug!(error = %e, "tool result refused");
                    }
                }
                () = tokio::time::sleep_until(sleep_until), if deadline.is_some() => {
                    engine.handle_timeout(Instant::now());
                }
            }
        }
    }

    fn client_event(&mut self, event: ClientEvent, ctx: &TurnContext<'_>) {
        match event {
            ClientEvent::Emotion { emoji, .. } => {
                self.emoji.get_or_insert(emoji);
            }
            ClientEvent::TextFragment { text, .. } => {
                // A follow-up response after a tool call continues the same reply.
                if !self.text.is_empty()
                    && !self.text.ends_with(char::is_whitespace)
                    && !text.starts_with(char::is_whitespace)
                    && self.text_response_changed
                {
                    self.text.push(' ');
                }
                self.text_response_changed = false;
                self.text.push_str(&text);
            }
            ClientEvent::ResponseEnd { .. } => self.text_response_changed = true,
            ClientEvent::ToolCallRequest {
                id,
                name,
                arguments,
                ..
            } => {
                self.tools_called.push(name.clone());
                let scope = ctx
                    .tools
                    .as_ref()
                    .filter(|scope| ctx.hub.has_tool(scope, &name))
                    .cloned();
                match scope {
                    Some(scope) => {
                        let hub = Arc::clone(ctx.hub);
                        let timeout = ctx.tool_timeout;
                        // The JoinSet belongs to the turn: dropping it aborts calls in flight.
                        self.tool_calls.spawn(async move {
                            let outcome = hub.call_tool(&scope, &name, arguments, timeout).await;
                            (id, McpHub::result_text(&outcome))
                        });
                    }
                    None => {
                        self.tool_calls.spawn(async move {
                            (id, format!("Error: no runner for tool {name:?}"))
                        });
                    }
                }
            }
            ClientEvent::Error { message, .. } => {
                tracing::warn!(%message, "bridge turn error");
                self.error.get_or_insert(message);
            }
            _ => {}
        }
    }
}

/// A conversation's listing entry (`GET /admin/conversations`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct ConversationInfo {
    /// The key (`channel:session_id`).
    pub(crate) key: String,
    /// Turns taken.
    pub(crate) turns: u64,
    /// History messages (`None` while a turn is running).
    pub(crate) messages: Option<usize>,
    /// Seconds since the last request.
    pub(crate) idle_secs: u64,
}

struct Entry {
    conversation: Arc<tokio::sync::Mutex<Conversation>>,
    last_used: Instant,
}

/// Every conversation, bounded: beyond `max` the least recently used idle conversation is
/// forgotten, and conversations idle longer than `idle` are dropped on the next lookup.
#[derive(Debug)]
pub(crate) struct Conversations {
    map: Mutex<HashMap<String, Entry>>,
    max: usize,
    idle: Duration,
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry").finish_non_exhaustive()
    }
}

impl Conversations {
    pub(crate) fn new(max: usize, idle: Duration) -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
            max: max.max(1),
            idle,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.map
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The conversation for `key`, created with `persona` when new.
    /// The conversation `key`, if this instance has it (and it has not idled out).
    pub(crate) fn get(&self, key: &str) -> Option<Arc<tokio::sync::Mutex<Conversation>>> {
        let map = self.lock();
        map.get(key)
            .filter(|e| e.last_used.elapsed() < self.idle || Arc::strong_count(&e.conversation) > 1)
            .map(|e| Arc::clone(&e.conversation))
    }

    pub(crate) fn get_or_create(
        &self,
        key: &str,
        persona: impl FnOnce() -> Persona,
    ) -> Result<Arc<tokio::sync::Mutex<Conversation>>, TurnError> {
        let now = Instant::now();
        let mut map = self.lock();
        map.retain(|_, e| {
            now.duration_since(e.last_used) < self.idle || Arc::strong_count(&e.conversation) > 1
        });
        if let Some(e) = map.get_mut(key) {
            e.last_used = now;
            return Ok(Arc::clone(&e.conversation));
        }
        if map.len() >= self.max {
            // Only conversations nobody is using can go.
            let victim = map
                .iter()
                .filter(|(_, e)| Arc::strong_count(&e.conversation) == 1)
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, _)| k.clone())
                .ok_or(TurnError::Busy)?;
            map.remove(&victim);
        }
        let conversation = Conversation::new(persona(), now).map_err(TurnError::Refused)?;
        let conversation = Arc::new(tokio::sync::Mutex::new(conversation));
        map.insert(
            key.to_owned(),
            Entry {
                conversation: Arc::clone(&conversation),
                last_used: now,
            },
        );
        Ok(conversation)
    }

    /// Forgets one conversation (or all with `None`); returns how many were dropped.
    pub(crate) fn clear(&self, key: Option<&str>) -> usize {
        let mut map = self.lock();
        match key {
            Some(k) => usize::from(map.remove(k).is_some()),
            None => {
                let n = map.len();
                map.clear();
                n
            }
        }
    }

    /// Every conversation, by key.
    pub(crate) fn list(&self) -> Vec<ConversationInfo> {
        let now = Instant::now();
        let map = self.lock();
        let mut all: Vec<ConversationInfo> = map
            .iter()
            .map(|(k, e)| {
                let (turns, messages) = match e.conversation.try_lock() {
                    Ok(c) => (c.turns, Some(c.history_len())),
                    Err(_) => (0, None),
                };
                ConversationInfo {
                    key: k.clone(),
                    turns,
                    messages,
                    idle_secs: now.duration_since(e.last_used).as_secs(),
                }
            })
            .collect();
        all.sort_by(|a, b| a.key.cmp(&b.key));
        all
    }
}
