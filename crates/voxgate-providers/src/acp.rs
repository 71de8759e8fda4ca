//! The `acp` brain: the agent is an [Agent Client Protocol](https://agentclientprotocol.com)
//! agent process (protocol version 1), driven as an [`Llm`].
//!
//! # Wire
//! Newline-delimited JSON-RPC 2.0 over the child's stdin and stdout; each side numbers its own
//! requests. voxgate is the ACP *client*:
//!
//! 1. `initialize {protocolVersion: 1, clientCapabilities, clientInfo}`; the agent must answer
//!    with protocol version 1. voxgate advertises no file system and no terminal capability, so
//!    the agent must not call `fs/*` or `terminal/*` (if it does, the call gets a JSON-RPC
//!    "method not found" error).
//! 2. `session/new {cwd: <absolute path>, mcpServers: []}` gives the session id.
//! 3. Per user turn, `session/prompt {sessionId, prompt: [{type: "text", text}]}`. While it
//!    runs, `session/update` notifications stream in: `agent_message_chunk` text becomes
//!    [`LlmEvent::TextDelta`] (which the engine speaks); `tool_call`, `tool_call_update` and
//!    `plan` are logged (target `voxgate_providers::acp`), since the agent runs its own tools and
//!    voxgate has nothing to execute; thoughts and other updates are ignored. The prompt's
//!    `stopReason` ends the stream with [`LlmEvent::Done`] (`end_turn` →
//!    [`FinishReason::Stop`], `max_tokens` → [`FinishReason::Length`], `refusal` →
//!    [`FinishReason::ContentFilter`], others kept as [`FinishReason::Other`]).
//! 4. `session/request_permission` from the agent is answered at once from
//!    [`AcpPermissions`] (`{outcome: {outcome: "selected", optionId}}`), so no request is ever
//!    left open while voxgate waits for something else.
//!
//! Lines that are not JSON, or JSON that is not JSON-RPC, are logged and skipped; lines over
//! 16 MiB are dropped. Nothing the agent writes can panic the server.
//!
//! # History and requests
//! ACP sessions are stateful: the agent keeps the conversation's history itself. So only the
//! new user text is sent per turn (the user messages at the end of [`LlmRequest::messages`],
//! joined by newlines); the rest of the history, the system prompt, the tools offered by
//! voxgate clients and devices, temperature and token limits are not forwarded (the agent
//! has its own prompt and tools; a future version may offer voxgate's tools to it as an MCP
//! server). [`Intent::Greet`] sends [`AcpConfig::greeting_prompt`] when set and otherwise ends
//! at once with no text. [`Intent::ConversationQuery`] is answered in a fresh ACP session of
//! the same process, prompted with a transcript of the history and the question, so the
//! conversation's own session never sees it.
//!
//! # Barge-in
//! The engine cancels a generation by dropping its stream. The conversation then sends the
//! `session/cancel` notification, answers any permission request that arrives afterwards with
//! `{outcome: {outcome: "cancelled"}}`, discards further updates of that turn, and waits for
//! the prompt to return (`stopReason: "cancelled"`). The session stays usable: the next turn's
//! prompt is queued until then. An agent that does not finish the cancelled prompt within
//! [`AcpConfig::cancel_timeout`] is killed and restarted for the next turn.
//!
//! # Process lifetime
//! One agent process per voxgate conversation ([`Llm::for_conversation`] gives each server
//! session its own [`AcpConversation`]). Choice: conversations are isolated (a crashed, stuck or
//! confused agent only affects its own call, and its working state and environment are its
//! own); ACP 1 has no stable way to close a session, so a shared process would accumulate every
//! call's sessions; and ending the call frees everything by killing the process. The cost is
//! the agent's start-up time on a conversation's first turn. The process is started on the
//! first turn, restarted on the next turn after a crash (the turn in flight ends with
//! [`ProviderError::Command`]), stopped after [`AcpConfig::process_idle_timeout`] without a
//! turn, and killed when the conversation is dropped.
//!
//! # Process places
//! Processes are what a client can make the server spend, so they are bounded: all
//! conversations of one [`AcpAgent`] share [`AcpConfig::max_processes`] places, one per
//! running process. A turn that would start a process when every place is taken fails at
//! once with [`ProviderError::Busy`]; a caller that wants to refuse such a request before
//! it starts (an HTTP API answering 503) reserves the place first with
//! [`Llm::reserve_process`], which can also hold the caller's own accounting (an admission
//! permit) for as long as the process runs. A place is given back when its process ends,
//! whatever ends it: idle stop, exit or crash, a kill after a cancel timeout, the
//! conversation being dropped; a reservation no turn used is given back after the idle
//! timeout too.
//!
//! # Restarts keep the conversation
//! A new process has a new ACP session that knows nothing of the call. When a conversation's
//! process is replaced (idle stop, crash, kill), the first prompt of the new session carries
//! the conversation so far (the request's history: voxgate keeps it for every door) as a
//! transcript in a first text block, before the user's new words in their own block, so the
//! agent answers with the context it had. Agents that keep sessions on disk could instead be
//! asked `session/load`; that needs the agent's `loadSession` capability and its own storage,
//! so the transcript, which works with every agent, is what is sent.
//!
//! # Why no `agent-client-protocol` crate
//! The `agent-client-protocol` crate (5.0.0, with `agent-client-protocol-schema` 1.15.1) was
//! evaluated and not used: both it and its schema crate turn on `serde_json`'s
//! `preserve_order` feature, which Cargo unifies across the workspace and which would change
//! the key order of every `serde_json::Value` object voxgate emits (device and webhook JSON,
//! snapshot tests of every codec); they also bring `anyhow` into a library layer, and the SDK's
//! connection abstraction runs its own task model that does not fit a `'static` stream whose
//! drop means "cancel". The handful of messages voxgate needs are small, so this module writes
//! them by hand with voxgate-mcp's tolerant JSON-RPC types, following the v1 schema (field
//! names, option kinds and stop reasons were checked against the schema crate). Tests run the
//! module against an agent built with the official Python SDK.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::stream;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tracing::Instrument as _;
use voxgate_mcp::jsonrpc::{self, ErrorObject, Id, Message, Payload};

use crate::error::{ProviderError, TimeoutPhase};
use crate::types::{ChatMessage, FinishReason, Intent, LlmEvent, LlmRequest, Role};
use crate::{Llm, LlmStream, ProcessHold};

/// The ACP protocol version spoken.
pub const ACP_PROTOCOL_VERSION: u64 = 1;

/// Longest line accepted from the agent; longer ones are dropped (and logged).
const MAX_LINE: usize = 16 << 20;
/// Limit on writing one message to the agent's stdin (an agent that stops reading is dead).
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Default [`AcpConfig::process_idle_timeout`]: a minute, far shorter than a conversation's
/// own life, long enough that a caller thinking between two questions keeps the agent.
pub const DEFAULT_PROCESS_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Default [`AcpConfig::max_processes`]: two per core, at least four. An agent process is
/// a whole program (an interpreter, a model client) per conversation: tens of megabytes
/// and its own CPU, so a handful per core is what a server can keep answering with.
#[must_use]
pub fn default_max_agent_processes() -> usize {
    std::thread::available_parallelism()
        .map_or(2, std::num::NonZeroUsize::get)
        .saturating_mul(2)
        .max(4)
}

/// How to start and treat an ACP agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcpConfig {
    /// The program, by path or by name looked up on `PATH`.
    pub command: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment variables (the server's environment is inherited).
    pub env: Vec<(String, String)>,
    /// The working directory of the process and the `cwd` of its sessions; relative paths are
    /// resolved against the server's current directory, `None` is that directory.
    pub cwd: Option<PathBuf>,
    /// How permission requests are answered.
    pub permissions: AcpPermissions,
    /// Prompt sent for [`Intent::Greet`]; `None` greets with silence.
    pub greeting_prompt: Option<String>,
    /// Limit on starting the process and getting a session (`initialize` and `session/new`).
    pub startup_timeout: Duration,
    /// Limit on the agent's silence during a turn (no message at all); the turn then fails
    /// with a timeout and is cancelled.
    pub idle_timeout: Duration,
    /// How long a cancelled prompt may take to return `cancelled` before the agent is killed.
    pub cancel_timeout: Duration,
    /// Agent processes running at once over all conversations of one [`AcpAgent`] (see the
    /// module docs, "Process places"); 0: no cap.
    pub max_processes: usize,
    /// A process that has had no turn for this long is stopped and gives its place back;
    /// the conversation's next turn starts a new one with the conversation so far. `None`:
    /// kept until the conversation ends.
    pub process_idle_timeout: Option<Duration>,
}

impl AcpConfig {
    /// A configuration running `command` with `args`, defaults for the rest (deny every
    /// permission, 30 s start-up, 120 s idle, 5 s cancel, [`default_max_agent_processes`]
    /// processes, each stopped after [`DEFAULT_PROCESS_IDLE_TIMEOUT`] without a turn).
    pub fn new(command: impl Into<String>, args: Vec<String>) -> Self {
        Self {
            command: command.into(),
            args,
            env: Vec::new(),
            cwd: None,
            permissions: AcpPermissions::default(),
            greeting_prompt: None,
            startup_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(120),
            cancel_timeout: Duration::from_secs(5),
            max_processes: default_max_agent_processes(),
            process_idle_timeout: Some(DEFAULT_PROCESS_IDLE_TIMEOUT),
        }
    }
}

/// What a tool call is, as far as the agent told: the input of permission decisions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AcpToolInfo {
    /// The tool kind (`read`, `edit`, `delete`, `move`, `search`, `execute`, `think`, `fetch`,
    /// `switch_mode`, `other`); `None` when the agent did not say.
    pub kind: Option<String>,
    /// The human-readable title.
    pub title: Option<String>,
}

/// Allow and deny rules for `session/request_permission`.
///
/// A rule is one of:
/// * `*`: every tool call;
/// * `kind:<kind>`: the tool kind (`execute`, `read`...; a call without a kind is `other`);
/// * `title:<pattern>`: the title, where `*` matches any run of characters (`title:git *`);
/// * anything else: the kind *or* the title pattern.
///
/// Matching ignores ASCII case. Deny rules win over allow rules; a call no rule allows is
/// denied (the default, with both lists empty, denies everything). An allowed call gets the
/// agent's `allow_once` option (`allow_always` when [`AcpPermissions::prefer_always`], or when
/// it is the only allowing option); a denied one gets `reject_once` (likewise). When the agent
/// offers no option of the wanted sort, the answer is the `cancelled` outcome.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AcpPermissions {
    /// Rules that allow.
    pub allow: Vec<String>,
    /// Rules that deny, checked first.
    pub deny: Vec<String>,
    /// Pick the `*_always` options over the `*_once` ones, so the agent remembers the answer.
    pub prefer_always: bool,
}

/// The answer to one permission request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PermissionAnswer {
    /// Select this option.
    Selected {
        /// The `optionId` chosen.
        option_id: String,
        /// Whether it allows the call.
        allowed: bool,
    },
    /// The `cancelled` outcome.
    Cancelled,
}

impl PermissionAnswer {
    /// The JSON-RPC result for `session/request_permission`.
    #[must_use]
    pub fn to_result(&self) -> Value {
        match self {
            Self::Selected { option_id, .. } => {
                json!({"outcome": {"outcome": "selected", "optionId": option_id}})
            }
            Self::Cancelled => json!({"outcome": {"outcome": "cancelled"}}),
        }
    }
}

impl AcpPermissions {
    /// Whether the rules allow `tool`.
    #[must_use]
    pub fn allows(&self, tool: &AcpToolInfo) -> bool {
        let hit = |rules: &[String]| rules.iter().any(|r| rule_matches(r, tool));
        !hit(&self.deny) && hit(&self.allow)
    }

    /// The answer to a request about `tool` offering `options` (the request's `options` array:
    /// objects with `optionId`, `name` and `kind`; malformed entries are ignored).
    #[must_use]
    pub fn answer(&self, tool: &AcpToolInfo, options: &[Value]) -> PermissionAnswer {
        let allowed = self.allows(tool);
        let (once, always) = if allowed {
            ("allow_once", "allow_always")
        } else {
            ("reject_once", "reject_always")
        };
        let order = if self.prefer_always {
            [always, once]
        } else {
            [once, always]
        };
        let find = |kind: &str| {
            options.iter().find_map(|o| {
                (o.get("kind").and_then(Value::as_str) == Some(kind))
                    .then(|| o.get("optionId").and_then(Value::as_str))
                    .flatten()
            })
        };
        match order.iter().find_map(|k| find(k)) {
            Some(id) => PermissionAnswer::Selected {
                option_id: id.to_owned(),
                allowed,
            },
            None => PermissionAnswer::Cancelled,
        }
    }
}

fn rule_matches(rule: &str, tool: &AcpToolInfo) -> bool {
    let rule = rule.trim();
    let kind = tool.kind.as_deref().unwrap_or("other");
    let title = tool.title.as_deref().unwrap_or("");
    if rule == "*" {
        return true;
    }
    if let Some(k) = rule.strip_prefix("kind:") {
        return k.trim().eq_ignore_ascii_case(kind);
    }
    if let Some(p) = rule.strip_prefix("title:") {
        return glob_match(p.trim(), title);
    }
    rule.eq_ignore_ascii_case(kind) || glob_match(rule, title)
}

/// `*` matches any run of characters; everything else matches itself, ignoring ASCII case.
fn glob_match(pattern: &str, text: &str) -> bool {
    let pattern = pattern.to_ascii_lowercase();
    let text = text.to_ascii_lowercase();
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

/// An ACP agent as the server's language model. Sessions of the server each get their own
/// [`AcpConversation`] (one agent process each) through [`Llm::for_conversation`]; calling
/// [`Llm::generate`] on the agent itself uses one conversation shared by all such callers.
#[derive(Debug)]
pub struct AcpAgent {
    config: Arc<AcpConfig>,
    places: Places,
    shared: AcpConversation,
}

impl AcpAgent {
    /// Checks the configuration. Nothing is started until a conversation's first turn.
    ///
    /// # Errors
    /// [`ProviderError::Config`] for an empty command or an unusable working directory.
    pub fn new(mut config: AcpConfig) -> Result<Self, ProviderError> {
        if config.command.trim().is_empty() {
            return Err(ProviderError::Config(
                "the ACP agent command is empty".into(),
            ));
        }
        let base = std::env::current_dir()
            .map_err(|e| ProviderError::Config(format!("no current directory: {e}")))?;
        config.cwd = Some(match config.cwd.take() {
            Some(p) if p.is_absolute() => p,
            Some(p) => base.join(p),
            None => base,
        });
        let places = Places::new(config.max_processes);
        let config = Arc::new(config);
        Ok(Self {
            shared: AcpConversation::with_config(Arc::clone(&config), places.clone()),
            places,
            config,
        })
    }

    /// A new conversation: its own agent process and ACP session.
    #[must_use]
    pub fn conversation(&self) -> AcpConversation {
        AcpConversation::with_config(Arc::clone(&self.config), self.places.clone())
    }

    /// Places taken now: agent processes running, and places reserved for a turn about to
    /// start one. Never more than [`AcpConfig::max_processes`] (when not 0).
    #[must_use]
    pub fn places_taken(&self) -> usize {
        self.places.taken()
    }
}

/// The places of one agent's processes: a permit per running (or reserved) process.
#[derive(Debug, Clone)]
struct Places {
    permits: Arc<Semaphore>,
    /// The configured cap; 0: none.
    max: usize,
    /// Permits the semaphore started with.
    total: usize,
}

impl Places {
    fn new(max: usize) -> Self {
        let total = match max {
            0 => Semaphore::MAX_PERMITS,
            n => n.min(Semaphore::MAX_PERMITS),
        };
        Self {
            permits: Arc::new(Semaphore::new(total)),
            max,
            total,
        }
    }

    /// A place now, or [`ProviderError::Busy`]: a request is refused at once rather than
    /// left waiting for a conversation somewhere to end.
    fn take(&self) -> Result<OwnedSemaphorePermit, ProviderError> {
        Arc::clone(&self.permits).try_acquire_owned().map_err(|_| {
            ProviderError::Busy(format!(
                "all {} ACP agent process places are taken (max_processes); try again when \
                 a conversation ends or its agent idles out",
                self.max
            ))
        })
    }

    fn taken(&self) -> usize {
        self.total - self.permits.available_permits()
    }
}

/// One process's place: its permit and what the caller keeps with it, both given back when
/// this is dropped.
struct Place {
    _permit: OwnedSemaphorePermit,
    _hold: Option<ProcessHold>,
}

impl std::fmt::Debug for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Place").finish_non_exhaustive()
    }
}

/// What a conversation's handle and its actor share about the process: whether one runs, a
/// place reserved for the next one, and when the conversation was last used.
#[derive(Debug)]
struct Seat {
    state: Mutex<SeatState>,
}

#[derive(Debug)]
struct SeatState {
    /// Taken by [`Llm::reserve_process`] for the next start; the start moves it into the
    /// process.
    reserved: Option<Place>,
    /// A process runs (it owns its place).
    running: bool,
    /// The last turn, or reservation: the idle stop counts from here.
    touched: Instant,
}

impl Seat {
    fn new() -> Self {
        Self {
            state: Mutex::new(SeatState {
                reserved: None,
                running: false,
                touched: Instant::now(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, SeatState> {
        // Every update is a single assignment, so the state is whole after a panic elsewhere.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn touch(&self) {
        self.lock().touched = Instant::now();
    }
}

impl Llm for AcpAgent {
    fn generate(&self, request: LlmRequest) -> LlmStream {
        self.shared.generate(request)
    }

    fn for_conversation(&self) -> Option<Arc<dyn Llm>> {
        Some(Arc::new(self.conversation()))
    }
}

/// One conversation with an ACP agent: one process, one ACP session, turns one at a time.
/// Dropping it kills the process.
#[derive(Debug)]
pub struct AcpConversation {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: Arc<AcpConfig>,
    places: Places,
    seat: Arc<Seat>,
    actor: Mutex<Option<(mpsc::Sender<Job>, AbortHandle)>>,
    /// The span current when the conversation was made (a server session's), which the
    /// agent's task runs in: its log lines name the session they belong to, though the
    /// agent outlives any one turn.
    span: tracing::Span,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let slot = self.actor.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, task)) = slot.take() {
            task.abort();
        }
    }
}

impl AcpConversation {
    fn with_config(config: Arc<AcpConfig>, places: Places) -> Self {
        Self {
            inner: Arc::new(Inner {
                config,
                places,
                seat: Arc::new(Seat::new()),
                actor: Mutex::new(None),
                span: tracing::Span::current(),
            }),
        }
    }

    /// The process id of the running agent, if one runs (for logs and tests).
    pub async fn agent_pid(&self) -> Option<u32> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.inner.submit(Job::Pid(tx)).await.ok()?;
        rx.await.ok().flatten()
    }
}

impl Inner {
    async fn submit(&self, job: Job) -> Result<(), ProviderError> {
        self.actor()?
            .send(job)
            .await
            .map_err(|_| ProviderError::StreamCut("the ACP conversation stopped".into()))
    }

    /// The actor's job queue, started when there is none (or it ended).
    fn actor(&self) -> Result<mpsc::Sender<Job>, ProviderError> {
        let mut slot = self.actor.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((tx, _)) = slot.as_ref()
            && !tx.is_closed()
        {
            return Ok(tx.clone());
        }
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| ProviderError::Config("the ACP brain needs a tokio runtime".into()))?;
        let (tx, rx) = mpsc::channel(8);
        let actor = Actor {
            config: Arc::clone(&self.config),
            places: self.places.clone(),
            seat: Arc::clone(&self.seat),
            jobs: rx,
            agent: None,
            had_process: false,
        };
        let task = runtime.spawn(actor.run().instrument(self.span.clone()));
        *slot = Some((tx.clone(), task.abort_handle()));
        Ok(tx)
    }

    fn reserve(
        &self,
        hold: &mut dyn FnMut() -> Result<ProcessHold, ProviderError>,
    ) -> Result<(), ProviderError> {
        // The actor runs the idle timer that gives an unused reservation back.
        let actor = self.actor()?;
        let mut seat = self.seat.lock();
        seat.touched = Instant::now();
        if seat.running || seat.reserved.is_some() {
            return Ok(());
        }
        let permit = self.places.take()?;
        seat.reserved = Some(Place {
            _permit: permit,
            _hold: Some(hold()?),
        });
        drop(seat);
        // So it arms that timer; a full queue means it has jobs to wake it anyway.
        let _ = actor.try_send(Job::Wake);
        Ok(())
    }
}

impl Llm for AcpConversation {
    fn generate(&self, request: LlmRequest) -> LlmStream {
        let Some(prompt) = prompt_for(&self.inner.config, &request) else {
            return Box::pin(stream::iter([LlmEvent::Done {
                finish_reason: FinishReason::Stop,
                usage: None,
            }]));
        };
        let state = Generation::Start(Arc::clone(&self.inner), prompt);
        Box::pin(stream::unfold(state, Generation::next))
    }

    fn reserve_process(
        &self,
        hold: &mut dyn FnMut() -> Result<ProcessHold, ProviderError>,
    ) -> Result<(), ProviderError> {
        self.inner.reserve(hold)
    }
}

/// What one generation asks of the agent.
#[derive(Debug)]
struct Prompt {
    text: String,
    /// Run in a fresh session instead of the conversation's own.
    fresh_session: bool,
    /// The conversation before `text` as a transcript (`None`: nothing before it), sent to a
    /// process that replaces an earlier one of the conversation.
    history: Option<String>,
}

fn prompt_for(config: &AcpConfig, request: &LlmRequest) -> Option<Prompt> {
    match &request.intent {
        Intent::Greet => config.greeting_prompt.clone().map(|text| Prompt {
            text,
            fresh_session: false,
            history: None,
        }),
        Intent::ConversationQuery { query } => Some(Prompt {
            text: query_text(&request.messages, query),
            fresh_session: true,
            history: None,
        }),
        _ => {
            let messages = &request.messages;
            let user_tail = messages
                .iter()
                .rev()
                .take_while(|m| m.role == Role::User)
                .count();
            let (before, tail) = messages.split_at(messages.len() - user_tail);
            let trailing: Vec<&str> = tail
                .iter()
                .map(|m| m.content.trim())
                .filter(|t| !t.is_empty())
                .collect();
            let history = transcript(before);
            (!trailing.is_empty()).then(|| Prompt {
                text: trailing.join("\n"),
                fresh_session: false,
                history: (!history.is_empty()).then(|| {
                    format!(
                        "This agent was restarted and has lost the conversation so far. \
                         Here it is, for context only (do not answer it):\n\n{history}"
                    )
                }),
            })
        }
    }
}

/// `who: text` lines of the user, assistant and tool messages of `history`.
fn transcript(history: &[ChatMessage]) -> String {
    let mut text = String::new();
    for m in history {
        let who = match m.role {
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
            _ => continue,
        };
        text.push_str(&format!("{who}: {}\n", m.content.trim()));
    }
    text
}

fn query_text(history: &[ChatMessage], query: &str) -> String {
    format!(
        "Here is the transcript of a conversation:\n\n{}\nAnswer this about the \
         conversation, without taking any action: {query}",
        transcript(history)
    )
}

enum Generation {
    Start(Arc<Inner>, Prompt),
    Receiving(mpsc::Receiver<LlmEvent>),
    Finished,
}

impl Generation {
    async fn next(self) -> Option<(LlmEvent, Self)> {
        let mut rx = match self {
            Self::Finished => return None,
            Self::Receiving(rx) => rx,
            Self::Start(inner, prompt) => {
                let (tx, rx) = mpsc::channel(64);
                if let Err(e) = inner.submit(Job::Turn { prompt, events: tx }).await {
                    return Some((LlmEvent::Error(e), Self::Finished));
                }
                rx
            }
        };
        match rx.recv().await {
            Some(ev @ (LlmEvent::Done { .. } | LlmEvent::Error(_))) => Some((ev, Self::Finished)),
            Some(ev) => Some((ev, Self::Receiving(rx))),
            None => Some((
                LlmEvent::Error(ProviderError::StreamCut(
                    "the ACP conversation stopped mid-turn".into(),
                )),
                Self::Finished,
            )),
        }
    }
}

enum Job {
    Turn {
        prompt: Prompt,
        events: mpsc::Sender<LlmEvent>,
    },
    Pid(tokio::sync::oneshot::Sender<Option<u32>>),
    /// Nothing to do but look at the seat again (a reservation arrived).
    Wake,
}

/// Owns the agent process of one conversation; runs turns one at a time.
struct Actor {
    config: Arc<AcpConfig>,
    places: Places,
    seat: Arc<Seat>,
    jobs: mpsc::Receiver<Job>,
    agent: Option<AgentProcess>,
    /// A process ran before: the next one replaces it and gets the conversation so far.
    had_process: bool,
}

/// How a turn left the agent.
enum AgentState {
    Alive,
    /// Exited, broke the protocol past repair or had to be killed: start a new one next turn.
    Gone,
}

/// The next line of `agent`'s output; never ready without an agent.
async fn next_line(agent: &mut Option<AgentProcess>) -> Option<Vec<u8>> {
    match agent {
        Some(a) => a.lines.recv().await,
        None => std::future::pending().await,
    }
}

/// Sleeps until `at`; forever without one.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl Actor {
    async fn run(mut self) {
        loop {
            let idle_at = self.idle_deadline();
            let job = tokio::select! {
                job = self.jobs.recv() => job,
                line = next_line(&mut self.agent) => {
                    let Some(agent) = self.agent.as_mut() else { continue };
                    match line {
                        Some(line) => {
                            for msg in decode_line(&line) {
                                if matches!(agent.handle_idle(msg).await, AgentState::Gone) {
                                    self.agent = None;
                                    break;
                                }
                            }
                        }
                        None => {
                            let status = agent.exit_status().await;
                            tracing::warn!(
                                %status,
                                acp_session = %agent.session_id,
                                "ACP agent exited between turns; a new one starts on \
                                 the next turn"
                            );
                            self.agent = None;
                        }
                    }
                    continue;
                }
                () = sleep_until_some(idle_at) => {
                    self.stop_if_idle();
                    continue;
                }
            };
            let Some(job) = job else { return };
            match job {
                Job::Pid(reply) => {
                    let _ = reply.send(self.agent.as_ref().and_then(|a| a.child.id()));
                }
                Job::Wake => {}
                Job::Turn { prompt, events } => {
                    if events.is_closed() {
                        continue;
                    }
                    self.seat.touch();
                    self.turn(prompt, events).await;
                    self.seat.touch();
                }
            }
        }
    }

    /// When the process (or a reservation) goes unused long enough to be stopped.
    fn idle_deadline(&self) -> Option<Instant> {
        let idle = self.config.process_idle_timeout?;
        let seat = self.seat.lock();
        (self.agent.is_some() || seat.reserved.is_some()).then(|| seat.touched + idle)
    }

    /// Stops the process and gives back a reservation when nothing used them for the idle
    /// timeout (a reservation counts as use, so a turn about to start keeps its process).
    fn stop_if_idle(&mut self) {
        let Some(idle) = self.config.process_idle_timeout else {
            return;
        };
        let reserved = {
            let mut seat = self.seat.lock();
            if seat.touched.elapsed() < idle {
                return;
            }
            seat.reserved.take()
        };
        // Dropped outside the lock: a process's drop takes it.
        drop(reserved);
        if let Some(agent) = self.agent.take() {
            tracing::info!(
                pid = agent.child.id(),
                acp_session = %agent.session_id,
                "ACP agent stopped after {idle:?} without a turn; the next turn starts a new \
                 one with the conversation so far"
            );
            drop(agent);
        }
    }

    /// The place for a new process: the one reserved for it, else a free one.
    fn place(&self) -> Result<Place, ProviderError> {
        let reserved = self.seat.lock().reserved.take();
        match reserved {
            Some(place) => Ok(place),
            None => Ok(Place {
                _permit: self.places.take()?,
                _hold: None,
            }),
        }
    }

    async fn turn(&mut self, prompt: Prompt, events: mpsc::Sender<LlmEvent>) {
        let (agent, replaced) = match self.agent.take() {
            Some(agent) => (self.agent.insert(agent), false),
            None => {
                let started = match self.place() {
                    Ok(place) => AgentProcess::start(&self.config, place, &self.seat).await,
                    Err(e) => Err(e),
                };
                match started {
                    Ok(agent) => {
                        let replaced = std::mem::replace(&mut self.had_process, true);
                        (self.agent.insert(agent), replaced)
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "ACP agent could not be started");
                        let _ = events.send(LlmEvent::Error(e)).await;
                        return;
                    }
                }
            }
        };
        let session_id = if prompt.fresh_session {
            let deadline = Instant::now() + self.config.startup_timeout;
            match agent.new_session(&self.config, deadline).await {
                Ok(id) => id,
                Err((e, state)) => {
                    if matches!(state, AgentState::Gone) {
                        self.agent = None;
                    }
                    let _ = events.send(LlmEvent::Error(e)).await;
                    return;
                }
            }
        } else {
            agent.session_id.clone()
        };
        let context = if replaced && !prompt.fresh_session {
            prompt.history.as_deref()
        } else {
            None
        };
        if context.is_some() {
            tracing::info!(
                acp_session = %session_id,
                "a new ACP agent process gets the conversation so far with its first prompt"
            );
        }
        if matches!(
            agent
                .prompt(&self.config, &session_id, context, &prompt.text, &events)
                .await,
            AgentState::Gone
        ) {
            self.agent = None;
        }
    }
}

/// A running agent process with an open session.
struct AgentProcess {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<Vec<u8>>,
    io_tasks: [AbortHandle; 2],
    next_id: i64,
    session_id: String,
    /// What the agent said about each tool call, so permission requests that only carry the
    /// id can still be judged by kind and title.
    tools: HashMap<String, AcpToolInfo>,
    /// The conversation's seat, told when the process ends.
    seat: Arc<Seat>,
    /// This process's place, given back when it is dropped (after the kill below).
    _place: Place,
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        for t in &self.io_tasks {
            t.abort();
        }
        // kill_on_drop ends the process; start_kill makes it immediate.
        let _ = self.child.start_kill();
        self.seat.lock().running = false;
    }
}

impl AgentProcess {
    /// Starts the agent in `place` and opens its session.
    async fn start(
        config: &AcpConfig,
        place: Place,
        seat: &Arc<Seat>,
    ) -> Result<Self, ProviderError> {
        let mut cmd = Command::new(&config.command);
        cmd.args(&config.args)
            .envs(config.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(dir) = &config.cwd {
            cmd.current_dir(dir);
        }
        let mut child = cmd.spawn().map_err(|e| {
            ProviderError::Command(format!(
                "cannot start the ACP agent {:?}: {e}",
                config.command
            ))
        })?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(ProviderError::Command(
                "the ACP agent's standard streams are not available".into(),
            ));
        };
        let (tx, lines) = mpsc::channel(64);
        // In the conversation's span, as the actor is.
        let reader = tokio::spawn(read_lines(stdout, tx).in_current_span());
        let logger = tokio::spawn(log_stderr(stderr, child.id()).in_current_span());
        let mut agent = Self {
            child,
            stdin,
            lines,
            io_tasks: [reader.abort_handle(), logger.abort_handle()],
            next_id: 0,
            session_id: String::new(),
            tools: HashMap::new(),
            seat: Arc::clone(seat),
            _place: place,
        };
        seat.lock().running = true;
        tracing::info!(pid = agent.child.id(), command = %config.command, "ACP agent started");
        let deadline = Instant::now() + config.startup_timeout;
        let init = agent
            .call(
                "initialize",
                json!({
                    "protocolVersion": ACP_PROTOCOL_VERSION,
                    "clientCapabilities": {
                        "fs": {"readTextFile": false, "writeTextFile": false},
                        "terminal": false,
                    },
                    "clientInfo": {
                        "name": "voxgate",
                        "title": "voxgate",
                        "version": env!("CARGO_PKG_VERSION"),
                    },
                }),
                deadline,
                config.startup_timeout,
            )
            .await
            .map_err(|(e, _)| e)?;
        let version = init.get("protocolVersion").and_then(Value::as_u64);
        if version != Some(ACP_PROTOCOL_VERSION) {
            return Err(ProviderError::Protocol(format!(
                "the ACP agent answered initialize with protocol version {}, voxgate speaks {}",
                init.get("protocolVersion").unwrap_or(&Value::Null),
                ACP_PROTOCOL_VERSION
            )));
        }
        if let Some(info) = init.get("agentInfo") {
            tracing::info!(agent = %info, "ACP agent initialized");
        }
        agent.session_id = agent
            .new_session(config, deadline)
            .await
            .map_err(|(e, _)| e)?;
        Ok(agent)
    }

    async fn new_session(
        &mut self,
        config: &AcpConfig,
        deadline: Instant,
    ) -> Result<String, (ProviderError, AgentState)> {
        let cwd = config
            .cwd
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let result = self
            .call(
                "session/new",
                json!({"cwd": cwd, "mcpServers": []}),
                deadline,
                config.startup_timeout,
            )
            .await?;
        match result.get("sessionId").and_then(Value::as_str) {
            Some(id) if !id.is_empty() => {
                tracing::info!(
                    acp_session = id,
                    pid = self.child.id(),
                    "ACP session opened"
                );
                Ok(id.to_owned())
            }
            _ => Err((
                ProviderError::Protocol(format!("session/new returned no sessionId: {result}")),
                AgentState::Alive,
            )),
        }
    }

    async fn exit_status(&mut self) -> String {
        match tokio::time::timeout(Duration::from_secs(1), self.child.wait()).await {
            Ok(Ok(status)) => status.to_string(),
            Ok(Err(e)) => format!("unknown exit status: {e}"),
            Err(_) => "closed its stdout but is still running; killed".into(),
        }
    }

    async fn write(&mut self, msg: &Message) -> Result<(), ProviderError> {
        let mut line = msg.to_vec();
        line.push(b'\n');
        let write = async {
            self.stdin.write_all(&line).await?;
            self.stdin.flush().await
        };
        match tokio::time::timeout(WRITE_TIMEOUT, write).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(ProviderError::Command(format!(
                "cannot write to the ACP agent: {e}"
            ))),
            Err(_) => Err(ProviderError::Command(
                "the ACP agent stopped reading its input".into(),
            )),
        }
    }

    async fn send_request(&mut self, method: &str, params: Value) -> Result<i64, ProviderError> {
        self.next_id += 1;
        let id = self.next_id;
        self.write(&Message::request(id, method, Some(params)))
            .await
            .map(|()| id)
    }

    /// A request whose reply is awaited before anything else happens (start-up steps).
    async fn call(
        &mut self,
        method: &str,
        params: Value,
        deadline: Instant,
        limit: Duration,
    ) -> Result<Value, (ProviderError, AgentState)> {
        let id = match self.send_request(method, params).await {
            Ok(id) => id,
            Err(e) => {
                // Usually a broken pipe because the agent already exited: say so.
                let e = match tokio::time::timeout(Duration::from_secs(1), self.child.wait()).await
                {
                    Ok(Ok(status)) => ProviderError::Command(format!(
                        "the ACP agent exited during {method} ({status})"
                    )),
                    _ => e,
                };
                return Err((e, AgentState::Gone));
            }
        };
        loop {
            let line = match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Err(_) => {
                    return Err((
                        ProviderError::Timeout {
                            phase: TimeoutPhase::Connect,
                            after: limit,
                        },
                        AgentState::Gone,
                    ));
                }
                Ok(None) => {
                    let status = self.exit_status().await;
                    return Err((
                        ProviderError::Command(format!(
                            "the ACP agent exited during {method} ({status})"
                        )),
                        AgentState::Gone,
                    ));
                }
                Ok(Some(line)) => line,
            };
            for msg in decode_line(&line) {
                match msg {
                    Message::Response(r) if r.id.as_number() == Some(id) => {
                        return r.outcome.map_err(|e| {
                            (
                                ProviderError::Command(format!(
                                    "the ACP agent refused {method}: {e}"
                                )),
                                AgentState::Alive,
                            )
                        });
                    }
                    other => {
                        if matches!(self.handle_idle(other).await, AgentState::Gone) {
                            return Err((
                                ProviderError::Command(format!(
                                    "cannot write to the ACP agent during {method}"
                                )),
                                AgentState::Gone,
                            ));
                        }
                    }
                }
            }
        }
    }

    /// A message outside any turn: requests are refused, the rest is noted.
    async fn handle_idle(&mut self, msg: Message) -> AgentState {
        match msg {
            Message::Request(r) => {
                let reply = if r.method == "session/request_permission" {
                    // No turn is running, so nothing can be allowed.
                    Message::result(r.id, PermissionAnswer::Cancelled.to_result())
                } else {
                    method_not_found(r.id, &r.method)
                };
                match self.write(&reply).await {
                    Ok(()) => AgentState::Alive,
                    Err(_) => AgentState::Gone,
                }
            }
            Message::Notification(n) => {
                if n.method == "session/update"
                    && let Some(params) = &n.params
                    && let Some(update) = params.get("update")
                {
                    let session = params.get("sessionId").and_then(Value::as_str);
                    self.note_update(session.unwrap_or_default(), update);
                }
                AgentState::Alive
            }
            _ => AgentState::Alive,
        }
    }

    /// Records and logs tool calls and plans of the ACP session `acp_session`; returns the
    /// text of a message chunk.
    fn note_update(&mut self, acp_session: &str, update: &Value) -> Option<String> {
        let kind = update.get("sessionUpdate").and_then(Value::as_str)?;
        match kind {
            "agent_message_chunk" => {
                let content = update.get("content")?;
                if content.get("type").and_then(Value::as_str) == Some("text") {
                    return content
                        .get("text")
                        .and_then(Value::as_str)
                        .map(str::to_owned);
                }
                tracing::debug!(acp_session, %content, "non-text ACP message chunk skipped");
            }
            "tool_call" | "tool_call_update" => {
                let id = update.get("toolCallId").and_then(Value::as_str)?;
                let entry = self.tools.entry(id.to_owned()).or_default();
                merge_tool_info(entry, update);
                let status = update.get("status").and_then(Value::as_str).unwrap_or("");
                tracing::info!(
                    acp_session,
                    tool_call = id,
                    title = entry.title.as_deref().unwrap_or(""),
                    kind = entry.kind.as_deref().unwrap_or("other"),
                    status,
                    "ACP agent {kind}"
                );
            }
            "plan" => {
                let steps: Vec<&str> = update
                    .get("entries")
                    .and_then(Value::as_array)
                    .map(|e| {
                        e.iter()
                            .filter_map(|x| x.get("content").and_then(Value::as_str))
                            .collect()
                    })
                    .unwrap_or_default();
                tracing::info!(acp_session, steps = %steps.join(" | "), "ACP agent plan");
            }
            other => tracing::debug!(acp_session, update = other, "ACP session update ignored"),
        }
        None
    }

    /// Runs one `session/prompt` to its end, streaming text into `events`. `context` (the
    /// conversation so far, for a process that replaces another) goes in a text block of its
    /// own before `text`.
    async fn prompt(
        &mut self,
        config: &AcpConfig,
        session_id: &str,
        context: Option<&str>,
        text: &str,
        events: &mpsc::Sender<LlmEvent>,
    ) -> AgentState {
        let mut blocks: Vec<Value> = context
            .map(|c| json!({"type": "text", "text": c}))
            .into_iter()
            .collect();
        blocks.push(json!({"type": "text", "text": text}));
        let params = json!({
            "sessionId": session_id,
            "prompt": blocks,
        });
        let prompt_id = match self.send_request("session/prompt", params).await {
            Ok(id) => id,
            Err(e) => {
                let _ = events.send(LlmEvent::Error(e)).await;
                return AgentState::Gone;
            }
        };
        // Set once the turn is cancelled (the stream was dropped, or it failed by timeout):
        // from then on nothing more is sent to `events`.
        let mut cancelled_at: Option<Instant> = None;
        let mut idle_deadline = Instant::now() + config.idle_timeout;
        loop {
            let deadline = match cancelled_at {
                Some(at) => at + config.cancel_timeout,
                None => idle_deadline,
            };
            let line = tokio::select! {
                () = events.closed(), if cancelled_at.is_none() => {
                    tracing::debug!(acp_session = session_id, "turn cancelled: session/cancel");
                    if self.cancel(session_id).await.is_err() {
                        return AgentState::Gone;
                    }
                    cancelled_at = Some(Instant::now());
                    continue;
                }
                () = tokio::time::sleep_until(deadline) => {
                    if cancelled_at.is_some() {
                        tracing::warn!(
                            acp_session = session_id,
                            "the ACP agent did not end a cancelled prompt within {:?}; killed",
                            config.cancel_timeout
                        );
                        return AgentState::Gone;
                    }
                    let _ = events
                        .send(LlmEvent::Error(ProviderError::Timeout {
                            phase: TimeoutPhase::Idle,
                            after: config.idle_timeout,
                        }))
                        .await;
                    if self.cancel(session_id).await.is_err() {
                        return AgentState::Gone;
                    }
                    cancelled_at = Some(Instant::now());
                    continue;
                }
                line = self.lines.recv() => line,
            };
            let Some(line) = line else {
                let status = self.exit_status().await;
                tracing::warn!(%status, acp_session = session_id, "ACP agent exited during a turn");
                if cancelled_at.is_none() {
                    let _ = events
                        .send(LlmEvent::Error(ProviderError::Command(format!(
                            "the ACP agent exited during the turn ({status}); it is restarted \
                             for the next turn"
                        ))))
                        .await;
                }
                return AgentState::Gone;
            };
            idle_deadline = Instant::now() + config.idle_timeout;
            for msg in decode_line(&line) {
                match msg {
                    Message::Response(r) if r.id.as_number() == Some(prompt_id) => {
                        if cancelled_at.is_none() {
                            let event = match r.outcome {
                                Ok(result) => LlmEvent::Done {
                                    finish_reason: stop_reason(&result),
                                    usage: None,
                                },
                                Err(e) => LlmEvent::Error(ProviderError::Upstream(format!(
                                    "session/prompt failed: {e}"
                                ))),
                            };
                            let _ = events.send(event).await;
                        } else {
                            tracing::debug!(
                                acp_session = session_id,
                                outcome = ?r.outcome,
                                "cancelled prompt ended"
                            );
                        }
                        return AgentState::Alive;
                    }
                    Message::Response(r) => {
                        tracing::debug!(id = %r.id, "reply to no pending ACP request ignored");
                    }
                    Message::Notification(n) if n.method == "session/update" => {
                        let Some(params) = n.params else { continue };
                        if params.get("sessionId").and_then(Value::as_str) != Some(session_id) {
                            continue;
                        }
                        let Some(update) = params.get("update") else {
                            continue;
                        };
                        if let Some(text) = self.note_update(session_id, update)
                            && cancelled_at.is_none()
                            && !text.is_empty()
                        {
                            // A closed receiver is noticed by the `closed()` branch next.
                            let _ = events.send(LlmEvent::TextDelta(text)).await;
                        }
                    }
                    Message::Notification(n) => {
                        tracing::debug!(method = %n.method, "ACP notification ignored");
                    }
                    Message::Request(r) if r.method == "session/request_permission" => {
                        let answer = if cancelled_at.is_some() {
                            PermissionAnswer::Cancelled
                        } else {
                            self.decide(config, r.params.as_ref())
                        };
                        if self
                            .write(&Message::result(r.id, answer.to_result()))
                            .await
                            .is_err()
                        {
                            return AgentState::Gone;
                        }
                    }
                    Message::Request(r) => {
                        let written = self.write(&method_not_found(r.id, &r.method)).await;
                        if written.is_err() {
                            return AgentState::Gone;
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    async fn cancel(&mut self, session_id: &str) -> Result<(), ProviderError> {
        self.write(&Message::notification(
            "session/cancel",
            Some(json!({"sessionId": session_id})),
        ))
        .await
    }

    fn decide(&mut self, config: &AcpConfig, params: Option<&Value>) -> PermissionAnswer {
        let call = params.and_then(|p| p.get("toolCall"));
        let mut tool = call
            .and_then(|c| c.get("toolCallId"))
            .and_then(Value::as_str)
            .and_then(|id| self.tools.get(id))
            .cloned()
            .unwrap_or_default();
        if let Some(call) = call {
            merge_tool_info(&mut tool, call);
        }
        let options = params
            .and_then(|p| p.get("options"))
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let answer = config.permissions.answer(&tool, options);
        let acp_session = params
            .and_then(|p| p.get("sessionId"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        tracing::info!(
            acp_session,
            title = tool.title.as_deref().unwrap_or(""),
            kind = tool.kind.as_deref().unwrap_or("other"),
            ?answer,
            "ACP permission request answered"
        );
        answer
    }
}

fn merge_tool_info(info: &mut AcpToolInfo, update: &Value) {
    if let Some(t) = update.get("title").and_then(Value::as_str) {
        info.title = Some(t.to_owned());
    }
    if let Some(k) = update.get("kind").and_then(Value::as_str) {
        info.kind = Some(k.to_owned());
    }
}

fn stop_reason(result: &Value) -> FinishReason {
    match result.get("stopReason").and_then(Value::as_str) {
        Some("end_turn") => FinishReason::Stop,
        Some("max_tokens") => FinishReason::Length,
        Some("refusal") => FinishReason::ContentFilter,
        Some(other) => FinishReason::Other(other.to_owned()),
        None => FinishReason::Other("missing stopReason".into()),
    }
}

fn method_not_found(id: Id, method: &str) -> Message {
    Message::error(
        id,
        ErrorObject::new(
            ErrorObject::METHOD_NOT_FOUND,
            format!("voxgate does not offer {method}"),
        ),
    )
}

/// The JSON-RPC messages of one line; anything else is logged and skipped.
fn decode_line(line: &[u8]) -> Vec<Message> {
    let trimmed = line.trim_ascii();
    if trimmed.is_empty() {
        return Vec::new();
    }
    match jsonrpc::decode(trimmed) {
        Ok(decoded) => match decoded.payload {
            Payload::Single(m) => vec![m],
            Payload::Batch(items) => items
                .into_iter()
                .filter_map(|m| {
                    m.map_err(|e| tracing::warn!(error = %e, "bad JSON-RPC in an ACP batch"))
                        .ok()
                })
                .collect(),
            _ => Vec::new(),
        },
        Err(e) => {
            let shown = String::from_utf8_lossy(&trimmed[..trimmed.len().min(200)]);
            tracing::warn!(error = %e, line = %shown, "line from the ACP agent skipped");
            Vec::new()
        }
    }
}

/// Forwards the agent's stdout lines (without size limit abuse) until it closes.
async fn read_lines(stdout: impl AsyncRead + Unpin, tx: mpsc::Sender<Vec<u8>>) {
    let mut reader = BufReader::new(stdout);
    loop {
        let mut buf = Vec::new();
        let limit = u64::try_from(MAX_LINE).unwrap_or(u64::MAX);
        match (&mut reader).take(limit).read_until(b'\n', &mut buf).await {
            Ok(0) => return,
            Ok(_) if buf.last() != Some(&b'\n') && buf.len() >= MAX_LINE => {
                tracing::warn!("a line over {MAX_LINE} bytes from the ACP agent was dropped");
                if !skip_line(&mut reader).await {
                    return;
                }
            }
            Ok(_) => {
                if tx.send(buf).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "reading the ACP agent's output failed");
                return;
            }
        }
    }
}

/// Consumes the rest of an over-long line; false at end of input.
async fn skip_line(reader: &mut (impl tokio::io::AsyncBufRead + Unpin)) -> bool {
    loop {
        let (consumed, found) = match reader.fill_buf().await {
            Ok([]) | Err(_) => return false,
            Ok(buf) => match buf.iter().position(|&b| b == b'\n') {
                Some(at) => (at + 1, true),
                None => (buf.len(), false),
            },
        };
        reader.consume(consumed);
        if found {
            return true;
        }
    }
}

/// Logs the agent's stderr, so a failing agent can be diagnosed from the server's log.
async fn log_stderr(stderr: impl AsyncRead + Unpin, pid: Option<u32>) {
    let mut reader = BufReader::new(stderr);
    loop {
        let mut buf = Vec::new();
        match (&mut reader)
            .take(64 * 1024)
            .read_until(b'\n', &mut buf)
            .await
        {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let text = String::from_utf8_lossy(&buf);
                tracing::debug!(pid, "ACP agent stderr: {}", text.trim_end());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(kind: Option<&str>, title: Option<&str>) -> AcpToolInfo {
        AcpToolInfo {
            kind: kind.map(str::to_owned),
            title: title.map(str::to_owned),
        }
    }

    #[test]
    fn glob() {
        assert!(glob_match("git *", "Git status"));
        assert!(glob_match("*", ""));
        assert!(glob_match("*read*file", "please read the file"));
        assert!(!glob_match("read", "read more"));
        assert!(glob_match("a*b*c", "abc"));
        assert!(!glob_match("a*b*c", "acb"));
    }

    #[test]
    fn rules_deny_wins_and_default_denies() {
        let p = AcpPermissions {
            allow: vec!["kind:read".into(), "title:git *".into(), "search".into()],
            deny: vec!["title:*push*".into()],
            prefer_always: false,
        };
        assert!(p.allows(&tool(Some("read"), Some("Read file"))));
        assert!(p.allows(&tool(Some("execute"), Some("git status"))));
        assert!(!p.allows(&tool(Some("execute"), Some("git push"))));
        assert!(p.allows(&tool(Some("search"), None)));
        assert!(!p.allows(&tool(Some("edit"), Some("Edit main.rs"))));
        assert!(!p.allows(&tool(None, None)));
        assert!(!AcpPermissions::default().allows(&tool(Some("read"), None)));
        let all = AcpPermissions {
            allow: vec!["*".into()],
            ..AcpPermissions::default()
        };
        assert!(all.allows(&tool(None, None)));
    }

    #[test]
    fn answers_pick_options_by_kind() {
        let options = vec![
            json!({"optionId": "a1", "name": "Allow", "kind": "allow_once"}),
            json!({"optionId": "aa", "name": "Always", "kind": "allow_always"}),
            json!({"optionId": "r1", "name": "Reject", "kind": "reject_once"}),
            json!({"bad": true}),
        ];
        let mut p = AcpPermissions {
            allow: vec!["read".into()],
            ..AcpPermissions::default()
        };
        let read = tool(Some("read"), None);
        let edit = tool(Some("edit"), None);
        assert_eq!(
            p.answer(&read, &options).to_result(),
            json!({"outcome": {"outcome": "selected", "optionId": "a1"}})
        );
        assert_eq!(
            p.answer(&edit, &options),
            PermissionAnswer::Selected {
                option_id: "r1".into(),
                allowed: false
            }
        );
        p.prefer_always = true;
        assert_eq!(
            p.answer(&read, &options),
            PermissionAnswer::Selected {
                option_id: "aa".into(),
                allowed: true
            }
        );
        // No reject_always offered: falls back to reject_once.
        assert_eq!(
            p.answer(&edit, &options),
            PermissionAnswer::Selected {
                option_id: "r1".into(),
                allowed: false
            }
        );
        assert_eq!(
            p.answer(&edit, &options[..2]).to_result(),
            json!({"outcome": {"outcome": "cancelled"}})
        );
    }

    #[test]
    fn prompt_text_is_the_trailing_user_messages() {
        let config = AcpConfig::new("x", Vec::new());
        let request = LlmRequest {
            messages: vec![
                ChatMessage::system("sys"),
                ChatMessage::user("old"),
                ChatMessage::assistant("reply"),
                ChatMessage::user("one"),
                ChatMessage::user(" two "),
            ],
            ..LlmRequest::default()
        };
        let p = prompt_for(&config, &request).unwrap();
        assert_eq!(p.text, "one\ntwo");
        assert!(!p.fresh_session);
        // What a replacement process is told first: the conversation before the new words.
        let history = p.history.unwrap();
        assert!(
            history.ends_with("\n\nuser: old\nassistant: reply\n"),
            "{history}"
        );
        assert!(!history.contains("sys"), "{history}");
        let first = LlmRequest {
            messages: vec![ChatMessage::system("sys"), ChatMessage::user("hi")],
            ..LlmRequest::default()
        };
        assert_eq!(prompt_for(&config, &first).unwrap().history, None);
        let request = LlmRequest {
            messages: vec![ChatMessage::user("a"), ChatMessage::assistant("b")],
            ..LlmRequest::default()
        };
        assert!(prompt_for(&config, &request).is_none());
        let greet = LlmRequest {
            intent: Intent::Greet,
            ..LlmRequest::default()
        };
        assert!(prompt_for(&config, &greet).is_none());
        let query = LlmRequest {
            messages: vec![ChatMessage::user("hi"), ChatMessage::assistant("hello")],
            intent: Intent::ConversationQuery {
                query: "what did I say?".into(),
            },
            ..LlmRequest::default()
        };
        let p = prompt_for(&config, &query).unwrap();
        assert!(p.fresh_session);
        assert!(
            p.text.contains("user: hi\nassistant: hello\n"),
            "{}",
            p.text
        );
        assert!(p.text.ends_with("what did I say?"));
    }

    #[test]
    fn stop_reasons_and_bad_lines() {
        assert_eq!(
            stop_reason(&json!({"stopReason": "end_turn"})),
            FinishReason::Stop
        );
        assert_eq!(
            stop_reason(&json!({"stopReason": "max_tokens"})),
            FinishReason::Length
        );
        assert_eq!(
            stop_reason(&json!({"stopReason": "cancelled"})),
            FinishReason::Other("cancelled".into())
        );
        assert!(decode_line(b"hello, not json\n").is_empty());
        assert!(decode_line(b"   \n").is_empty());
        assert!(decode_line(b"{\"foo\": 1}\n").is_empty());
        assert_eq!(
            decode_line(b"{\"jsonrpc\":\"2.0\",\"method\":\"x\"}\n").len(),
            1
        );
    }
}
