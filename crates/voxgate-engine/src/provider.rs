//! Requests to providers (LLM, ASR, TTS) and their answers, in vendor-neutral terms.
//!
//! The engine never talks to a provider itself: it emits a [`ProviderRequest`] tagged with a
//! fresh [`RequestId`] and the host runs it, feeding every result back as a [`ProviderEvent`]
//! with the same id. Events for ids the engine no longer waits for (cancelled, superseded) are
//! dropped, so the host never has to race a cancel against a stream.

use serde_json::Value;

use crate::types::{RequestId, TurnId};

/// Role of a message in an LLM context (OpenAI-style chat roles).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ChatRole {
    /// Instructions.
    System,
    /// The user.
    User,
    /// The assistant.
    Assistant,
    /// A tool's result, answering [`ContextMessage::tool_calls`] by `tool_call_id`.
    Tool,
}

/// A tool call the model made, as it appears in the context of later requests.
#[derive(Debug, Clone, PartialEq)]
pub struct ContextToolCall {
    /// Correlation id.
    pub id: String,
    /// The name the model used (see [`ToolSpec::name`]).
    pub name: String,
    /// Arguments object.
    pub arguments: Value,
}

/// One message of an LLM context.
#[derive(Debug, Clone, PartialEq)]
pub struct ContextMessage {
    /// Who says it.
    pub role: ChatRole,
    /// Its text (may be empty for an assistant message that only calls tools).
    pub content: String,
    /// Tool calls of an assistant message.
    pub tool_calls: Vec<ContextToolCall>,
    /// For [`ChatRole::Tool`]: the call it answers.
    pub tool_call_id: Option<String>,
}

impl ContextMessage {
    /// A plain message.
    #[must_use]
    pub fn new(role: ChatRole, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }
}

/// A tool offered to the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// The name the model sees: `[a-zA-Z0-9_-]{1,64}`, mapped back by the engine.
    pub name: String,
    /// What it does.
    pub description: String,
    /// JSON Schema of the arguments object.
    pub parameters: Value,
}

/// Work for a provider.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ProviderRequest {
    /// Transcribe one user utterance (ASR). Answer: [`ProviderEvent::Transcript`] or
    /// [`ProviderEvent::Failed`].
    Transcribe {
        /// Tag for the answer.
        id: RequestId,
        /// Mono 16-bit PCM, VAD backbuffer included.
        audio: Vec<i16>,
        /// Always 16 000.
        sample_rate: u32,
    },
    /// Stream a reply (LLM). Answers: [`ProviderEvent::TextDelta`]s and
    /// [`ProviderEvent::ToolCall`]s, then [`ProviderEvent::Done`] (or [`ProviderEvent::Failed`]).
    Generate {
        /// Tag for the answers.
        id: RequestId,
        /// The response this generates ([`crate::SPECULATIVE_TURN`] for speculative work,
        /// which has no response yet).
        turn: TurnId,
        /// The context, system prompt first.
        messages: Vec<ContextMessage>,
        /// Tools the model may call.
        tools: Vec<ToolSpec>,
        /// Sampling temperature, if configured.
        temperature: Option<f64>,
    },
    /// Answer a question about the conversation without tools (`ConversationQuery`). Answers as
    /// for [`ProviderRequest::Generate`]; tool calls are ignored.
    Query {
        /// Tag for the answers.
        id: RequestId,
        /// The conversation, system prompt and the question last.
        messages: Vec<ContextMessage>,
    },
    /// Synthesize one sentence (TTS). Answers: [`ProviderEvent::Audio`] chunks, then
    /// [`ProviderEvent::Done`] (or [`ProviderEvent::Failed`]).
    Synthesize {
        /// Tag for the answers.
        id: RequestId,
        /// The response it belongs to ([`crate::SPECULATIVE_TURN`] for speculative work).
        turn: TurnId,
        /// The sentence, emoji stripped.
        text: String,
    },
    /// Run a tool the server offers (one of [`crate::Input::ServerTools`], e.g. from an
    /// external MCP server) for the model's call. Answer: one [`ProviderEvent::ToolOutput`]
    /// (or [`ProviderEvent::Failed`], which the model gets as an error result). The host must
    /// bound the call's time (an MCP server that never answers); a `Cancel` for `id` means the
    /// turn machine gave up on the call.
    CallTool {
        /// Tag for the answer.
        id: RequestId,
        /// The response whose generation made the call.
        turn: TurnId,
        /// The model's correlation id for the call (for logs).
        call_id: String,
        /// The definition's [`crate::ServerToolDefinition::source`]: where the call goes.
        source: String,
        /// The tool's own name at its source (not the model-facing name).
        name: String,
        /// Arguments, validated against the tool's schema.
        arguments: Value,
    },
    /// Stop work on `id`; later events for it are ignored anyway.
    Cancel {
        /// The request to stop.
        id: RequestId,
    },
}

/// A provider's answer to a [`ProviderRequest`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ProviderEvent {
    /// ASR result.
    Transcript {
        /// The request answered.
        id: RequestId,
        /// What was said (may be empty: noise).
        text: String,
        /// Detected language, if known.
        language: String,
    },
    /// A piece of LLM text.
    TextDelta {
        /// The request answered.
        id: RequestId,
        /// The text.
        delta: String,
    },
    /// The model called a tool.
    ToolCall {
        /// The request answered.
        id: RequestId,
        /// Correlation id the model gave the call.
        call_id: String,
        /// The name from [`ToolSpec::name`].
        name: String,
        /// Arguments: an object, or a string of JSON as chat APIs deliver it.
        arguments: Value,
    },
    /// Synthesized audio of a sentence, mono.
    Audio {
        /// The request answered.
        id: RequestId,
        /// Samples.
        samples: Vec<i16>,
        /// Their rate in Hz.
        sample_rate: u32,
    },
    /// The result of a [`ProviderRequest::CallTool`]; nothing more comes for it.
    ToolOutput {
        /// The request answered.
        id: RequestId,
        /// The result text handed to the model (an error description when `ok` is false).
        text: String,
        /// Whether the tool succeeded.
        ok: bool,
    },
    /// The request finished successfully.
    Done {
        /// The request answered.
        id: RequestId,
    },
    /// The request failed; nothing more will come for it.
    Failed {
        /// The request answered.
        id: RequestId,
        /// What went wrong.
        message: String,
    },
}

impl ProviderEvent {
    /// The same event for request `id` (speculative work adopted under the real request's id).
    pub(crate) fn with_id(mut self, new: RequestId) -> Self {
        match &mut self {
            Self::Transcript { id, .. }
            | Self::TextDelta { id, .. }
            | Self::ToolCall { id, .. }
            | Self::Audio { id, .. }
            | Self::ToolOutput { id, .. }
            | Self::Done { id }
            | Self::Failed { id, .. } => *id = new,
        }
        self
    }

    /// Nothing more comes for the request after this event.
    pub(crate) fn is_last(&self) -> bool {
        matches!(
            self,
            Self::Transcript { .. }
                | Self::ToolOutput { .. }
                | Self::Done { .. }
                | Self::Failed { .. }
        )
    }

    /// The request this event answers.
    #[must_use]
    pub fn id(&self) -> RequestId {
        match self {
            Self::Transcript { id, .. }
            | Self::TextDelta { id, .. }
            | Self::ToolCall { id, .. }
            | Self::Audio { id, .. }
            | Self::ToolOutput { id, .. }
            | Self::Done { id }
            | Self::Failed { id, .. } => *id,
        }
    }
}
