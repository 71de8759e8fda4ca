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
    Asr, ChatMessage, DemoAgent, Intent, Llm, LlmEvent, LlmRequest, NoAsr, OpenAiChat,
    OpenAiChatConfig, OpenAiSpeech, OpenAiSpeechConfig, OpenAiTranscription,
    OpenAiTranscriptionConfig, ProviderError, Role, ToolCall, ToolDefinition, Tts, TtsRequest,
    Utterance,
};

use crate::config::Config;
use crate::mcp_endpoint::hub::{McpHub, Scope};
use crate::metrics::{Metrics, ProviderKind};

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

    /// The providers `config` names, embedded defaults for the sections it leaves out.
    ///
    /// # Errors
    /// The provider's [`ProviderError::Config`] for an unusable base URL.
    pub fn from_config(config: &Config) -> Result<Self, ProviderError> {
        let mut p = Self::embedded();
        if let Some(c) = &config.llm {
            let mut oc = OpenAiChatConfig::new(&c.base_url, &c.model);
            oc.api_key.clone_from(&c.api_key);
            p.llm = Arc::new(OpenAiChat::new(oc)?);
        }
        if let Some(c) = &config.acp {
            p.llm = Arc::new(voxgate_providers::AcpAgent::new(c.to_provider())?);
        }
        if let Some(c) = &config.asr {
            let mut oc = OpenAiTranscriptionConfig::new(&c.base_url, &c.model);
            oc.api_key.clone_from(&c.api_key);
            p.asr = Arc::new(OpenAiTranscription::new(oc)?);
        }
        if let Some(c) = &config.tts {
            let mut oc = OpenAiSpeechConfig::new(&c.base_url, &c.model, &c.voice);
            oc.api_key.clone_from(&c.api_key);
            p.tts = Arc::new(OpenAiSpeech::new(oc)?);
        }
        Ok(p)
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

/// Runs the engine's provider requests as tasks and cancels them on request. Every event goes
/// back through one bounded channel; dropping the runner aborts all work in flight, so a
/// disconnect frees everything.
#[derive(Debug)]
pub(crate) struct Runner {
    providers: Providers,
    metrics: Arc<Metrics>,
    tx: mpsc::Sender<ProviderEvent>,
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
    ) -> (Self, mpsc::Receiver<ProviderEvent>) {
        // A runner serves one conversation: stateful brains (an ACP agent) get their own handle.
        Self::for_conversation(providers.for_conversation(), metrics)
    }

    /// A runner over providers already made for one conversation with
    /// [`Providers::for_conversation`], for doors that run several runners over one
    /// conversation (one per HTTP request) and must keep a stateful brain across them.
    pub(crate) fn for_conversation(
        providers: Providers,
        metrics: Arc<Metrics>,
    ) -> (Self, mpsc::Receiver<ProviderEvent>) {
        let (tx, rx) = mpsc::channel(256);
        (
            Self {
                providers,
                metrics,
                tx,
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
        let tx = self.tx.clone();
        let metrics = Arc::clone(&self.metrics);
        let (id, task) = match request {
            ProviderRequest::Cancel { id } => {
                if let Some(t) = self.tasks.remove(&id) {
                    t.abort();
                }
                return;
            }
            ProviderRequest::Transcribe { id, audio, .. } => {
                let asr = Arc::clone(&self.providers.asr);
                let task = tokio::spawn(async move {
                    let t0 = Instant::now();
                    let utterance = Utterance {
                        pcm: audio,
                        language: None,
                    };
                    let event = match asr.transcribe(utterance).await {
                        Ok(t) => {
                            metrics.latency(ProviderKind::Asr, t0.elapsed());
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
                });
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
                (id, self.spawn_llm(id, request))
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
                (id, self.spawn_llm(id, request))
            }
            ProviderRequest::Synthesize { id, text, .. } => {
                let mut stream = self.providers.tts.synthesize(TtsRequest {
                    text,
                    voice: None,
                    language: None,
                });
                let task = tokio::spawn(async move {
                    let t0 = Instant::now();
                    let mut first = true;
                    while let Some(item) = stream.next().await {
                        let event = match item {
                            Ok(chunk) => {
                                if first {
                                    first = false;
                                    metrics.latency(ProviderKind::Tts, t0.elapsed());
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
                                        message: crate::incident::report("speech synthesis", &e),
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
                });
                (id, task)
            }
            ProviderRequest::CallTool {
                id,
                call_id,
                source,
                name,
                arguments,
                ..
            } => (id, self.spawn_tool(id, call_id, source, name, arguments)),
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
    ) -> tokio::task::JoinHandle<()> {
        let tx = self.tx.clone();
        let mcp = self.mcp.clone();
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
        })
    }

    fn spawn_llm(&self, id: RequestId, request: LlmRequest) -> tokio::task::JoinHandle<()> {
        let mut stream = self.providers.llm.generate(request);
        let tx = self.tx.clone();
        let metrics = Arc::clone(&self.metrics);
        tokio::spawn(async move {
            let t0 = Instant::now();
            let mut first = true;
            while let Some(event) = stream.next().await {
                if first {
                    first = false;
                    metrics.latency(ProviderKind::Llm, t0.elapsed());
                }
                let (event, last) = match event {
                    LlmEvent::TextDelta(delta) => (ProviderEvent::TextDelta { id, delta }, false),
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
        })
    }
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

    #[tokio::test]
    async fn generate_streams_the_demo_reply_and_cancel_aborts() {
        let (mut runner, mut rx) = Runner::new(Providers::embedded(), Arc::new(Metrics::new()));
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
                .unwrap();
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
        let (mut runner, mut rx) = Runner::new(Providers::embedded(), Arc::new(Metrics::new()));
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
            .unwrap();
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
