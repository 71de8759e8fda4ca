//! The provider set of a server, and the runner that executes the engine's provider requests
//! as tokio tasks.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use voxgate_engine::provider::{ChatRole, ContextMessage, ToolSpec};
use voxgate_engine::{ProviderEvent, ProviderRequest, RequestId};
use voxgate_providers::{
    Asr, ChatMessage, CommandTts, CommandTtsConfig, DemoAgent, ElevenLabsConfig, ElevenLabsTts,
    HttpSettings, Intent, Llm, LlmEvent, LlmRequest, NoAsr, OpenAiChat, OpenAiChatConfig,
    OpenAiSpeech, OpenAiSpeechConfig, OpenAiTranscription, OpenAiTranscriptionConfig, ProcessPool,
    ProviderError, Role, ToneTts, ToolCall, ToolDefinition, Tts, TtsRequest, Utterance,
};

use crate::config::providers::OVERRIDE_DOORS;
use crate::config::{AsrSpec, Config, LlmSpec, Plan, TtsSpec};
use crate::fallback::{Deadline, Fallback};
use crate::mcp_endpoint::hub::{McpHub, Scope};
use crate::metrics::{Door, Metrics, ProviderKind};
use tracing::Instrument as _;

/// The back ends every session of a server shares.
#[derive(Clone)]
pub struct Providers {
    /// The language model.
    pub llm: Arc<dyn Llm>,
    /// The speech recognizer.
    pub asr: Arc<dyn Asr>,
    /// The speech synthesizer.
    pub tts: Arc<dyn Tts>,
}

impl std::fmt::Debug for Providers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Providers").finish_non_exhaustive()
    }
}

impl Providers {
    /// The embedded defaults: [`DemoAgent`], [`NoAsr`] and
    /// [`embedded_tts`](voxgate_providers::embedded_tts).
    #[must_use]
    pub fn embedded() -> Self {
        Self {
            llm: Arc::new(DemoAgent::new()),
            asr: Arc::new(NoAsr),
            tts: voxgate_providers::embedded_tts(),
        }
    }

    /// The providers `config` names (`[llm]`/`[acp]`, `[asr]`, `[tts]`), embedded defaults for
    /// the sections it leaves out. These are the bare providers: the deadlines and fallbacks
    /// of the sections are added when the server binds ([`crate::Server::bind_with`]), so
    /// providers given to it directly get them too.
    ///
    /// # Errors
    /// [`ProviderError::Config`] for a section that does not resolve (unknown provider...) or
    /// an unusable option (a bad base URL).
    pub fn from_config(config: &Config) -> Result<Self, ProviderError> {
        let cfg = |e: crate::config::ConfigError| ProviderError::Config(e.to_string());
        let shared = Shared::of(config);
        Ok(Self {
            llm: build_llm(&config.llm_plan().map_err(cfg)?.spec, &shared.http)?,
            asr: build_asr(&config.asr_plan().map_err(cfg)?.spec, &shared.http)?,
            tts: build_tts(&config.tts_plan().map_err(cfg)?.spec, &shared)?,
        })
    }
}

/// The HTTP providers' settings: the library's, with the connection pool's cap from `[limits]`.
fn http_settings(config: &Config) -> HttpSettings {
    HttpSettings {
        max_idle_connections: config.limits.provider_idle_connection_cap(),
        ..HttpSettings::default()
    }
}

/// What the providers of one server share: HTTP settings and the synthesizer process pool.
struct Shared {
    http: HttpSettings,
    processes: ProcessPool,
}

impl Shared {
    fn of(config: &Config) -> Self {
        Self {
            http: http_settings(config),
            processes: process_pool(config.limits.synth_process_cap()),
        }
    }
}

/// The synthesizer process pool of size `max`: one for the whole process (processes are the
/// OS process's to spend, whichever door or server asks), replaced only when a server is
/// configured with another size.
fn process_pool(max: usize) -> ProcessPool {
    static POOL: std::sync::Mutex<Option<ProcessPool>> = std::sync::Mutex::new(None);
    let mut pool = POOL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match &*pool {
        Some(p) if p.max() == max.clamp(1, tokio::sync::Semaphore::MAX_PERMITS) => p.clone(),
        _ => pool.insert(ProcessPool::new(max)).clone(),
    }
}

/// The bare language model `spec` names.
fn build_llm(spec: &LlmSpec, http: &HttpSettings) -> Result<Arc<dyn Llm>, ProviderError> {
    Ok(match spec {
        LlmSpec::OpenAi {
            base_url,
            model,
            api_key,
        } => {
            let mut oc = OpenAiChatConfig::new(base_url, model);
            oc.api_key.clone_from(api_key);
            oc.http = http.clone();
            Arc::new(OpenAiChat::new(oc)?)
        }
        LlmSpec::Acp(c) => Arc::new(voxgate_providers::AcpAgent::new(c.to_provider())?),
        LlmSpec::Demo => Arc::new(DemoAgent::new()),
    })
}

/// The bare recognizer `spec` names.
fn build_asr(spec: &AsrSpec, http: &HttpSettings) -> Result<Arc<dyn Asr>, ProviderError> {
    Ok(match spec {
        AsrSpec::OpenAi {
            base_url,
            model,
            api_key,
        } => {
            let mut oc = OpenAiTranscriptionConfig::new(base_url, model);
            oc.api_key.clone_from(api_key);
            oc.http = http.clone();
            Arc::new(OpenAiTranscription::new(oc)?)
        }
        AsrSpec::Local {
            model,
            workers,
            queue,
            language,
        } => crate::local_speech::whisper(model, *workers, *queue, language)?,
        AsrSpec::None => Arc::new(NoAsr),
    })
}

/// The bare synthesizer `spec` names.
fn build_tts(spec: &TtsSpec, shared: &Shared) -> Result<Arc<dyn Tts>, ProviderError> {
    let http = &shared.http;
    Ok(match spec {
        TtsSpec::OpenAi {
            base_url,
            model,
            voice,
            api_key,
        } => {
            let mut oc = OpenAiSpeechConfig::new(base_url, model, voice);
            oc.api_key.clone_from(api_key);
            oc.http = http.clone();
            Arc::new(OpenAiSpeech::new(oc)?)
        }
        TtsSpec::ElevenLabs {
            api_key,
            voice_id,
            model_id,
            base_url,
            sample_rate,
        } => {
            let mut c = ElevenLabsConfig::new(api_key, voice_id);
            c.model_id.clone_from(model_id);
            c.base_url.clone_from(base_url);
            c.sample_rate = *sample_rate;
            c.http = http.clone();
            Arc::new(ElevenLabsTts::new(c)?)
        }
        TtsSpec::Local {
            model,
            onnxruntime,
            phonemizer,
            speaker,
            workers,
            queue,
        } => {
            crate::local_speech::piper(model, onnxruntime, phonemizer, *speaker, *workers, *queue)?
        }
        TtsSpec::Command { program, args } => Arc::new(CommandTts::with_pool(
            CommandTtsConfig {
                program: program.into(),
                args: args.clone(),
                voice_flag: None,
                ..CommandTtsConfig::espeak_ng()
            },
            shared.processes.clone(),
        )),
        TtsSpec::Espeak => Arc::new(CommandTts::with_pool(
            CommandTtsConfig::espeak_ng(),
            shared.processes.clone(),
        )),
        TtsSpec::Tone => Arc::new(ToneTts),
        TtsSpec::Embedded => voxgate_providers::embedded_tts_in(shared.processes.clone()),
    })
}

/// `primary` under `plan`'s deadlines, behind a fallback when the plan has one.
fn guard<P: ?Sized, S>(
    primary: Arc<P>,
    plan: &Plan<S>,
    build: &dyn Fn(&S) -> Result<Arc<P>, ProviderError>,
    metrics: &Arc<Metrics>,
) -> Result<Arc<P>, ProviderError>
where
    Deadline<P>: Into<Arc<P>>,
    Fallback<P>: Into<Arc<P>>,
{
    let primary: Arc<P> = if plan.first.is_some() || plan.idle.is_some() {
        Deadline::new(primary, plan.first, plan.idle, Arc::clone(metrics)).into()
    } else {
        primary
    };
    let Some(fb) = &plan.fallback else {
        return Ok(primary);
    };
    let fallback = guard(build(&fb.spec)?, fb, build, metrics)?;
    Ok(Fallback::new(primary, fallback, Arc::clone(metrics)).into())
}

macro_rules! into_arc {
    ($($t:ident),*) => {$(
        impl From<Deadline<dyn $t>> for Arc<dyn $t> {
            fn from(d: Deadline<dyn $t>) -> Self {
                Arc::new(d)
            }
        }
        impl From<Fallback<dyn $t>> for Arc<dyn $t> {
            fn from(f: Fallback<dyn $t>) -> Self {
                Arc::new(f)
            }
        }
    )*};
}
into_arc!(Llm, Asr, Tts);

/// What each door uses: the server's providers under the deadlines and fallbacks of `[llm]`,
/// `[asr]` and `[tts]`, and per door the providers of its own sections (`[xiaozhi.tts]`...)
/// where it has them. Built once when the server binds.
#[derive(Debug, Clone)]
pub(crate) struct DoorProviderSet {
    server: Providers,
    /// By [`OVERRIDE_DOORS`] order: realtime, xiaozhi, gemini, retell, bridge, vip.
    doors: [Providers; 6],
}

impl DoorProviderSet {
    /// `base` (the server's bare providers) guarded per `config`, and each door's overrides.
    ///
    /// # Errors
    /// [`ProviderError::Config`] for a section that does not resolve or build.
    pub(crate) fn new(
        config: &Config,
        base: Providers,
        metrics: &Arc<Metrics>,
    ) -> Result<Self, ProviderError> {
        let cfg = |e: crate::config::ConfigError| ProviderError::Config(e.to_string());
        let shared = Shared::of(config);
        let llm = |s: &LlmSpec| build_llm(s, &shared.http);
        let asr = |s: &AsrSpec| build_asr(s, &shared.http);
        let tts = |s: &TtsSpec| build_tts(s, &shared);
        let server = Providers {
            llm: guard(base.llm, &config.llm_plan().map_err(cfg)?, &llm, metrics)?,
            asr: guard(base.asr, &config.asr_plan().map_err(cfg)?, &asr, metrics)?,
            tts: guard(base.tts, &config.tts_plan().map_err(cfg)?, &tts, metrics)?,
        };
        let door = |name: &str| -> Result<Providers, ProviderError> {
            let mut p = server.clone();
            let Some(d) = config.door_providers.get(name) else {
                return Ok(p);
            };
            if let Some(l) = &d.llm {
                let plan = l.resolve(&format!("{name}.llm")).map_err(cfg)?;
                p.llm = guard(llm(&plan.spec)?, &plan, &llm, metrics)?;
            }
            if let Some(a) = &d.asr {
                let plan = a.resolve(&format!("{name}.asr")).map_err(cfg)?;
                p.asr = guard(asr(&plan.spec)?, &plan, &asr, metrics)?;
            }
            if let Some(t) = &d.tts {
                let plan = t.resolve(&format!("{name}.tts")).map_err(cfg)?;
                p.tts = guard(tts(&plan.spec)?, &plan, &tts, metrics)?;
            }
            Ok(p)
        };
        let [r, x, g, t, b, v] = OVERRIDE_DOORS;
        Ok(Self {
            doors: [door(r)?, door(x)?, door(g)?, door(t)?, door(b)?, door(v)?],
            server,
        })
    }

    /// The same providers for every door (unit tests).
    #[cfg(test)]
    pub(crate) fn uniform(p: Providers) -> Self {
        Self {
            doors: std::array::from_fn(|_| p.clone()),
            server: p,
        }
    }

    /// The providers of a WebSocket door (the server's for doors without providers).
    pub(crate) fn for_door(&self, door: Door) -> &Providers {
        match door {
            Door::Realtime => &self.doors[0],
            Door::Xiaozhi => &self.doors[1],
            Door::Gemini => &self.doors[2],
            Door::Retell => &self.doors[3],
            Door::Vip => &self.doors[5],
            Door::Bridge => &self.doors[4],
            Door::Mcp => &self.server,
        }
    }

    /// The providers of the Bridge HTTP API.
    pub(crate) fn for_bridge(&self) -> &Providers {
        &self.doors[4]
    }
}

impl Providers {
    /// These providers for one conversation: a stateful brain (an ACP agent, which keeps the
    /// history itself) gets its own handle, the rest is shared. Session runners call this
    /// themselves; a door that creates a runner per turn should call it once per conversation
    /// and pass the result, so the conversation keeps its agent (calling it again on the
    /// result returns the same handle).
    #[must_use]
    pub fn for_conversation(&self) -> Self {
        let mut p = self.clone();
        if let Some(llm) = self.llm.for_conversation() {
            p.llm = llm;
        }
        p
    }
}

/// The MCP endpoint's tools for one session: the hub that runs the engine's
/// [`ProviderRequest::CallTool`]s, and how long one call may take.
#[derive(Debug, Clone)]
pub(crate) struct McpTools {
    /// The hub of external MCP servers connected to `/mcp`.
    pub(crate) hub: Arc<McpHub>,
    /// Which connections' tools the session sees.
    pub(crate) scope: Scope,
    /// Longest a call may take (`[mcp] call_timeout_secs`); the model gets an error after it.
    pub(crate) timeout: Duration,
}

/// A provider event and when its task received it from the provider: the session loop may
/// take it later, and that wait is the server's, not the provider's.
#[derive(Debug)]
pub(crate) struct Arrived {
    /// The event.
    pub(crate) event: ProviderEvent,
    /// When the provider task had it.
    pub(crate) at: Instant,
}

/// The sending half of a runner's event channel: stamps each event as it is sent.
#[derive(Debug, Clone)]
struct EventTx(mpsc::Sender<Arrived>);

impl EventTx {
    async fn send(&self, event: ProviderEvent) -> Result<(), ()> {
        let at = Instant::now();
        self.0.send(Arrived { event, at }).await.map_err(|_| ())
    }
}

/// Runs the engine's provider requests as tasks and cancels them on request. Every event goes
/// back through one bounded channel; dropping the runner aborts all work in flight, so a
/// disconnect frees everything.
#[derive(Debug)]
pub(crate) struct Runner {
    providers: Providers,
    metrics: Arc<Metrics>,
    /// The door whose session this runner serves (the `door` label of provider latencies).
    door: Door,
    tx: EventTx,
    tasks: HashMap<RequestId, AbortHandle>,
    /// Runs `CallTool` requests; without it they fail at once.
    mcp: Option<McpTools>,
}

impl Drop for Runner {
    fn drop(&mut self) {
        for (_, task) in self.tasks.drain() {
            task.abort();
        }
    }
}

impl Runner {
    #[allow(
        clippy::needless_pass_by_value,
        reason = "every door passes an owned clone; keeping the signature spares them all"
    )]
    pub(crate) fn new(
        providers: Providers,
        metrics: Arc<Metrics>,
        door: Door,
    ) -> (Self, mpsc::Receiver<Arrived>) {
        // A runner serves one conversation: stateful brains (an ACP agent) get their own handle.
        Self::for_conversation(providers.for_conversation(), metrics, door)
    }

    /// A runner over providers already made for one conversation with
    /// [`Providers::for_conversation`], for doors that run several runners over one
    /// conversation (one per HTTP request) and must keep a stateful brain across them.
    pub(crate) fn for_conversation(
        providers: Providers,
        metrics: Arc<Metrics>,
        door: Door,
    ) -> (Self, mpsc::Receiver<Arrived>) {
        let (tx, rx) = mpsc::channel(256);
        (
            Self {
                providers,
                metrics,
                door,
                tx: EventTx(tx),
                tasks: HashMap::new(),
                mcp: None,
            },
            rx,
        )
    }

    /// Replaces the synthesizer for this runner's session only (a realtime client that brings
    /// its own ElevenLabs voice); requests already running keep the old one.
    pub(crate) fn set_tts(&mut self, tts: Arc<dyn Tts>) {
        self.providers.tts = tts;
    }

    /// Runs this session's `CallTool` requests against the MCP endpoint's hub.
    pub(crate) fn set_mcp(&mut self, mcp: Option<McpTools>) {
        self.mcp = mcp;
    }

    /// Requests in flight.
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        self.tasks.len()
    }

    /// Forgets a request whose last event arrived.
    pub(crate) fn finished(&mut self, event: &ProviderEvent) {
        if matches!(
            event,
            ProviderEvent::Done { .. }
                | ProviderEvent::Failed { .. }
                | ProviderEvent::Transcript { .. }
                | ProviderEvent::ToolOutput { .. }
        ) {
            self.tasks.remove(&event.id());
        }
    }

    /// Starts (or, for `Cancel`, stops) one request.
    pub(crate) fn start(&mut self, request: ProviderRequest) {
        self.start_in(request, tracing::Span::none());
    }

    /// Starts (or stops) one request; its task runs in `span` (the driver's `asr`, `llm`,
    /// `tts` or `tool` span, a child of the turn), which records when its first output came
    /// (`first_ms`) and closes when the task ends.
    pub(crate) fn start_in(&mut self, request: ProviderRequest, span: tracing::Span) {
        let tx = self.tx.clone();
        let metrics = Arc::clone(&self.metrics);
        let door = self.door;
        let (id, task) = match request {
            ProviderRequest::Cancel { id } => {
                if let Some(t) = self.tasks.remove(&id) {
                    t.abort();
                }
                return;
            }
            ProviderRequest::Transcribe { id, audio, .. } => {
                let asr = Arc::clone(&self.providers.asr);
                let task = tokio::spawn(
                    async move {
                        let t0 = Instant::now();
                        let utterance = Utterance {
                            pcm: audio,
                            language: None,
                        };
                        let event = match asr.transcribe(utterance).await {
                            Ok(t) => {
                                metrics.latency(door, ProviderKind::Asr, t0.elapsed());
                                record_first(t0);
                                ProviderEvent::Transcript {
                                    id,
                                    text: t.text,
                                    language: t.language.unwrap_or_default(),
                                }
                            }
                            Err(e) => {
                                metrics.provider_failure(ProviderKind::Asr);
                                ProviderEvent::Failed {
                                    id,
                                    message: crate::incident::report("speech recognition", &e),
                                }
                            }
                        };
                        let _ = tx.send(event).await;
                    }
                    .instrument(span),
                );
                (id, task)
            }
            ProviderRequest::Generate {
                id,
                messages,
                tools,
                temperature,
                ..
            } => {
                let request = LlmRequest {
                    messages: messages.iter().map(context_message).collect(),
                    tools: tools.into_iter().map(tool_definition).collect(),
                    intent: Intent::Reply,
                    #[allow(clippy::cast_possible_truncation, reason = "temperature 0..=2")]
                    temperature: temperature.map(|t| t as f32),
                    max_tokens: None,
                };
                (id, self.spawn_llm(id, request, span))
            }
            ProviderRequest::Query { id, mut messages } => {
                // The engine appends the question (or the instructions) last; the providers
                // take it as the intent.
                let query = messages.pop().map(|m| m.content).unwrap_or_default();
                let request = LlmRequest {
                    messages: messages.iter().map(context_message).collect(),
                    intent: Intent::ConversationQuery { query },
                    ..LlmRequest::default()
                };
                (id, self.spawn_llm(id, request, span))
            }
            ProviderRequest::Synthesize { id, text, .. } => {
                let mut stream = self.providers.tts.synthesize(TtsRequest {
                    text,
                    voice: None,
                    language: None,
                });
                let task = tokio::spawn(
                    async move {
                        let t0 = Instant::now();
                        let mut first = true;
                        while let Some(item) = stream.next().await {
                            let event = match item {
                                Ok(chunk) => {
                                    if first {
                                        first = false;
                                        metrics.latency(door, ProviderKind::Tts, t0.elapsed());
                                        record_first(t0);
                                    }
                                    ProviderEvent::Audio {
                                        id,
                                        samples: chunk.samples,
                                        sample_rate: chunk.sample_rate,
                                    }
                                }
                                Err(e) => {
                                    metrics.provider_failure(ProviderKind::Tts);
                                    let _ = tx
                                        .send(ProviderEvent::Failed {
                                            id,
                                            message: crate::incident::report(
                                                "speech synthesis",
                                                &e,
                                            ),
                                        })
                                        .await;
                                    return;
                                }
                            };
                            if tx.send(event).await.is_err() {
                                return;
                            }
                        }
                        let _ = tx.send(ProviderEvent::Done { id }).await;
                    }
                    .instrument(span),
                );
                (id, task)
            }
            ProviderRequest::CallTool {
                id,
                call_id,
                source,
                name,
                arguments,
                ..
            } => (
                id,
                self.spawn_tool(id, call_id, source, name, arguments, span),
            ),
            other => {
                tracing::warn!(
                    ?other,
                    "provider request of a kind this server does not run"
                );
                return;
            }
        };
        self.tasks.insert(id, task.abort_handle());
    }

    /// One `CallTool` against the hub, bounded by the call timeout: every way it ends (a
    /// result, an error, a timeout, a connection gone, no hub) is one `ToolOutput`.
    fn spawn_tool(
        &self,
        id: RequestId,
        call_id: String,
        source: String,
        name: String,
        arguments: serde_json::Value,
        span: tracing::Span,
    ) -> tokio::task::JoinHandle<()> {
        let tx = self.tx.clone();
        let mcp = self.mcp.clone();
        span.record("tool", name.as_str());
        tokio::spawn(async move {
            let (text, ok) = match mcp {
                Some(m) => {
                    let outcome = m
                        .hub
                        .call_source_tool(&m.scope, &source, &name, arguments, m.timeout)
                        .await;
                    if let Err(e) = &outcome {
                        tracing::info!(%call_id, tool = %name, error = %e, "MCP tool call failed");
                    }
                    let ok = matches!(&outcome, Ok(r) if !r.is_error);
                    (McpHub::result_text(&outcome), ok)
                }
                None => ("Error: MCP tools are not available here".to_owned(), false),
            };
            let _ = tx.send(ProviderEvent::ToolOutput { id, text, ok }).await;
        }.instrument(span))
    }

    fn spawn_llm(
        &self,
        id: RequestId,
        request: LlmRequest,
        span: tracing::Span,
    ) -> tokio::task::JoinHandle<()> {
        let mut stream = self.providers.llm.generate(request);
        let tx = self.tx.clone();
        let metrics = Arc::clone(&self.metrics);
        let door = self.door;
        tokio::spawn(
            async move {
                let t0 = Instant::now();
                let mut first = true;
                while let Some(event) = stream.next().await {
                    if first {
                        first = false;
                        metrics.latency(door, ProviderKind::Llm, t0.elapsed());
                        record_first(t0);
                    }
                    let (event, last) = match event {
                        LlmEvent::TextDelta(delta) => {
                            (ProviderEvent::TextDelta { id, delta }, false)
                        }
                        LlmEvent::ToolCall(call) => {
                            let arguments = call
                                .parse_arguments()
                                .unwrap_or(serde_json::Value::String(call.arguments.clone()));
                            (
                                ProviderEvent::ToolCall {
                                    id,
                                    call_id: call.id,
                                    name: call.name,
                                    arguments,
                                },
                                false,
                            )
                        }
                        LlmEvent::Done { .. } => (ProviderEvent::Done { id }, true),
                        LlmEvent::Error(e) => {
                            metrics.provider_failure(ProviderKind::Llm);
                            (
                                ProviderEvent::Failed {
                                    id,
                                    message: crate::incident::report("the language model", &e),
                                },
                                true,
                            )
                        }
                        other => {
                            tracing::debug!(?other, "LLM event ignored");
                            continue;
                        }
                    };
                    if tx.send(event).await.is_err() || last {
                        return;
                    }
                }
                // A stream that ends without Done/Error still ends the request.
                let _ = tx.send(ProviderEvent::Done { id }).await;
            }
            .instrument(span),
        )
    }
}

/// Records on the current provider span how long its first output took.
fn record_first(t0: Instant) {
    let ms = u64::try_from(t0.elapsed().as_millis()).unwrap_or(u64::MAX);
    tracing::Span::current().record("first_ms", ms);
}

fn context_message(m: &ContextMessage) -> ChatMessage {
    let role = match m.role {
        ChatRole::System => Role::System,
        ChatRole::Assistant => Role::Assistant,
        ChatRole::Tool => Role::Tool,
        _ => Role::User,
    };
    ChatMessage {
        role,
        content: m.content.clone(),
        tool_calls: m
            .tool_calls
            .iter()
            .map(|c| ToolCall {
                id: c.id.clone(),
                name: c.name.clone(),
                arguments: c.arguments.to_string(),
            })
            .collect(),
        tool_call_id: m.tool_call_id.clone(),
    }
}

fn tool_definition(t: ToolSpec) -> ToolDefinition {
    ToolDefinition {
        name: t.name,
        description: t.description,
        parameters: t.parameters,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_providers_pool_cap_comes_from_the_limits() {
        let mut config = Config::default();
        assert_eq!(
            http_settings(&config).max_idle_connections,
            crate::config::limits::DEFAULT_MAX_IDLE_PROVIDER_CONNECTIONS
        );
        assert_eq!(
            crate::config::limits::DEFAULT_MAX_IDLE_PROVIDER_CONNECTIONS,
            HttpSettings::default().max_idle_connections,
            "the server's default is the library's"
        );
        config.limits.max_idle_provider_connections = 5;
        assert_eq!(http_settings(&config).max_idle_connections, 5);
        config.limits.max_idle_provider_connections = 0;
        assert_eq!(http_settings(&config).max_idle_connections, usize::MAX);
        // The other HTTP settings stay the library's.
        assert_eq!(
            http_settings(&config).first_byte_timeout,
            HttpSettings::default().first_byte_timeout
        );
    }

    #[tokio::test]
    async fn generate_streams_the_demo_reply_and_cancel_aborts() {
        let (mut runner, mut rx) = Runner::new(
            Providers::embedded(),
            Arc::new(Metrics::new()),
            Door::Realtime,
        );
        runner.start(ProviderRequest::Generate {
            id: RequestId(7),
            turn: voxgate_engine::TurnId(1),
            messages: vec![ContextMessage::new(ChatRole::User, "hi")],
            tools: Vec::new(),
            temperature: None,
        });
        let mut text = String::new();
        loop {
            let ev = tokio::time::timeout(Duration::from_secs(5), rx.recv())
                .await
                .unwrap()
                .unwrap()
                .event;
            assert_eq!(ev.id(), RequestId(7));
            runner.finished(&ev);
            match ev {
                ProviderEvent::TextDelta { delta, .. } => text.push_str(&delta),
                ProviderEvent::Done { .. } => break,
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(text, "😊 You said: hi");
        assert_eq!(runner.in_flight(), 0);
        runner.start(ProviderRequest::Transcribe {
            id: RequestId(8),
            audio: vec![0; 16_000],
            sample_rate: 16_000,
        });
        runner.start(ProviderRequest::Cancel { id: RequestId(8) });
        assert_eq!(runner.in_flight(), 0);
    }

    #[tokio::test]
    async fn a_tool_call_without_the_hub_is_an_error_result() {
        let (mut runner, mut rx) = Runner::new(
            Providers::embedded(),
            Arc::new(Metrics::new()),
            Door::Realtime,
        );
        runner.start(ProviderRequest::CallTool {
            id: RequestId(3),
            turn: voxgate_engine::TurnId(1),
            call_id: "c".into(),
            source: "0000000000000001".into(),
            name: "echo".into(),
            arguments: serde_json::json!({}),
        });
        let ev = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .unwrap()
            .event;
        assert!(
            matches!(
                &ev,
                ProviderEvent::ToolOutput {
                    id: RequestId(3),
                    ok: false,
                    ..
                }
            ),
            "{ev:?}"
        );
        runner.finished(&ev);
        assert_eq!(runner.in_flight(), 0);
    }
}
