//! Vendor-neutral request and result types shared by every provider.

use serde::{Deserialize, Serialize};

use crate::error::ProviderError;

/// Who said a chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Role {
    /// Instructions to the model (the system prompt).
    System,
    /// The person talking to the agent.
    User,
    /// The agent.
    Assistant,
    /// The result of a tool call, answering an assistant's [`ToolCall`].
    Tool,
}

/// A tool call made by the model, kept in history so the result can be matched to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Identifier chosen by the model; the tool result carries it back.
    pub id: String,
    /// The tool's name exactly as declared by the client or device (dots included).
    pub name: String,
    /// The arguments as raw JSON text, as the model produced them. Models sometimes produce
    /// invalid JSON; keeping the text lets the caller report that back to the model instead of
    /// losing the call. See [`ToolCall::parse_arguments`].
    pub arguments: String,
}

impl ToolCall {
    /// Parses [`ToolCall::arguments`]; empty text counts as an empty object.
    ///
    /// # Errors
    /// The JSON parser's error when the model produced invalid JSON.
    pub fn parse_arguments(&self) -> Result<serde_json::Value, serde_json::Error> {
        if self.arguments.trim().is_empty() {
            return Ok(serde_json::Value::Object(serde_json::Map::new()));
        }
        serde_json::from_str(&self.arguments)
    }
}

/// One message of the conversation as the model sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// Who said it.
    pub role: Role,
    /// The text (for [`Role::Tool`], the tool's result as text, usually JSON).
    pub content: String,
    /// For [`Role::Assistant`]: the tool calls this turn made.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For [`Role::Tool`]: the [`ToolCall::id`] this result answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    fn plain(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }

    /// A system instruction.
    pub fn system(content: impl Into<String>) -> Self {
        Self::plain(Role::System, content)
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::plain(Role::User, content)
    }

    /// An assistant message without tool calls.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::plain(Role::Assistant, content)
    }

    /// An assistant turn that called tools (and may also have said something).
    pub fn assistant_tool_calls(content: impl Into<String>, calls: Vec<ToolCall>) -> Self {
        Self {
            tool_calls: calls,
            ..Self::plain(Role::Assistant, content)
        }
    }

    /// The result of the tool call `call_id`.
    pub fn tool_result(call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            tool_call_id: Some(call_id.into()),
            ..Self::plain(Role::Tool, content)
        }
    }
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDefinition {
    /// The name as declared by the client or device (may contain dots; providers whose wire
    /// format forbids them map the name and map it back).
    pub name: String,
    /// What the tool does, for the model.
    pub description: String,
    /// JSON Schema of the arguments object.
    pub parameters: serde_json::Value,
}

/// What the caller wants from this generation.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Intent {
    /// Continue the conversation: answer the last user message or tool result.
    #[default]
    Reply,
    /// Speak first without new user input (a greeting trigger).
    Greet,
    /// Answer a question about the conversation, outside it (the answer is not part of the
    /// dialogue). The history is the conversation to describe.
    ConversationQuery {
        /// The question asked.
        query: String,
    },
}

/// One generation request: the context, the tools and the sampling settings.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LlmRequest {
    /// The conversation so far, system prompt first.
    pub messages: Vec<ChatMessage>,
    /// Tools the model may call.
    pub tools: Vec<ToolDefinition>,
    /// What to generate.
    pub intent: Intent,
    /// Sampling temperature; the provider's configured value when `None`.
    pub temperature: Option<f32>,
    /// Upper bound on generated tokens; the service default when `None`.
    pub max_tokens: Option<u32>,
}

/// Why a generation stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FinishReason {
    /// The model finished its answer.
    Stop,
    /// The token limit cut the answer.
    Length,
    /// The model wants the tool calls it emitted to be run.
    ToolCalls,
    /// The service filtered the content.
    ContentFilter,
    /// A reason this crate does not know, kept verbatim.
    Other(String),
}

impl FinishReason {
    /// Maps the OpenAI wire string (`stop`, `length`, `tool_calls`, `function_call`,
    /// `content_filter`); anything else is kept as [`FinishReason::Other`].
    #[must_use]
    pub fn from_wire(s: &str) -> Self {
        match s {
            "stop" | "eos" => Self::Stop,
            "length" => Self::Length,
            "tool_calls" | "function_call" => Self::ToolCalls,
            "content_filter" => Self::ContentFilter,
            other => Self::Other(other.to_owned()),
        }
    }
}

/// Token accounting reported by the service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Tokens in the prompt.
    pub prompt_tokens: u32,
    /// Tokens generated.
    pub completion_tokens: u32,
}

/// One item of a generation stream.
///
/// A stream yields any number of [`LlmEvent::TextDelta`] and [`LlmEvent::ToolCall`] and ends
/// with exactly one [`LlmEvent::Done`] or [`LlmEvent::Error`]; nothing follows those. Dropping
/// the stream cancels the generation.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum LlmEvent {
    /// More of the answer's text.
    TextDelta(String),
    /// A complete tool call (streamed argument fragments already assembled).
    ToolCall(ToolCall),
    /// The generation finished.
    Done {
        /// Why it stopped.
        finish_reason: FinishReason,
        /// Token usage, when the service reported it.
        usage: Option<Usage>,
    },
    /// The generation failed; text already streamed may be incomplete.
    Error(ProviderError),
}

/// One user utterance to transcribe.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Utterance {
    /// 16 kHz mono signed 16-bit PCM.
    pub pcm: Vec<i16>,
    /// Expected language (ISO 639-1 such as `en`), when known.
    pub language: Option<String>,
}

impl Utterance {
    /// The sample rate of [`Utterance::pcm`].
    pub const SAMPLE_RATE: u32 = 16_000;

    /// Length of the speech in seconds.
    #[must_use]
    pub fn seconds(&self) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let n = self.pcm.len() as f64;
        n / f64::from(Self::SAMPLE_RATE)
    }
}

/// What a recognizer heard.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Transcript {
    /// The recognized text.
    pub text: String,
    /// The language spoken, when the recognizer reported it (or the caller's hint).
    pub language: Option<String>,
}

/// Text to speak.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TtsRequest {
    /// The text, usually one sentence.
    pub text: String,
    /// Provider-specific voice name or id; the provider's configured voice when `None`.
    pub voice: Option<String>,
    /// Language of the text (ISO 639-1), when known.
    pub language: Option<String>,
}

/// A piece of synthesized speech: mono signed 16-bit PCM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PcmChunk {
    /// Samples per second.
    pub sample_rate: u32,
    /// Mono samples.
    pub samples: Vec<i16>,
}

/// Result type of streamed synthesis items.
pub type TtsResult = Result<PcmChunk, ProviderError>;
