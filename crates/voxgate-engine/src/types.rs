//! The values that go in and out of the engine.

use std::fmt;

use serde_json::Value;
use voxgate_audio::vad::VadState;
use voxgate_mcp::action::{Action, ActionOutcome, InvocationId};
use voxgate_mcp::jsonrpc::Message;
use voxgate_mcp::schema::ErrorPayload;
use voxgate_turn::TriggerMode;

use crate::emotion::Emotion;
use crate::history::ChatMessage;
use crate::provider::{ProviderEvent, ProviderRequest};

pub use voxgate_turn::TurnId;

/// A tool the client declared (realtime `ToolDefinition`): run by the client when the model calls
/// it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDefinition {
    /// The client's name for it (may contain dots; the model sees a sanitized name).
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON Schema of its arguments object.
    pub parameters: Value,
}

/// A tool the server runs for the model (one offered by an external MCP server connected to the
/// server), listed next to the client's and the device's tools. A call to it goes out as
/// [`ProviderRequest::CallTool`] with this `source` and `name`.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerToolDefinition {
    /// Which runner offers it (an MCP connection's key). Sources order naming: when two tools
    /// map to one model-facing name, the client's and device's tools keep it, then the source
    /// that sorts first; the others get `_2`, `_3`...
    pub source: String,
    /// The tool's own name at its source.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON Schema of its arguments object.
    pub parameters: Value,
}

/// Everything the engine reacts to. Feed with [`crate::Engine::handle_input`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Input {
    /// Mono PCM from the user's microphone at [`crate::EngineConfig::input_rate`], `-1.0..=1.0`.
    Audio(Vec<f32>),
    /// Mono 16-bit PCM at [`crate::EngineConfig::input_rate`].
    AudioI16(Vec<i16>),
    /// Typed user text with the realtime protocol's trigger mode.
    Text {
        /// The text.
        text: String,
        /// Whether and when it starts a reply.
        mode: TriggerMode,
    },
    /// The trigger mode of the audio being sent (realtime `UserInput.mode` on audio); see
    /// [`crate::Engine::set_audio_trigger`], which doors call per packet instead.
    AudioTrigger(TriggerMode),
    /// `TriggerInference`: reply now (a greeting), or once the user's turn ends. With
    /// `flush_vad` the utterance being captured is cut at once and transcribed, and the turn
    /// ends as soon as its transcript is in (no endpointing delay). Instructions are recorded
    /// in history as a system message with [`crate::history::Content::Instructions`].
    TriggerInference {
        /// Extra instructions for this reply.
        instructions: Option<String>,
        /// End the current user utterance instead of waiting for it.
        flush_vad: bool,
    },
    /// Push-to-talk press / Xiaozhi manual `listen start`: the user takes the floor.
    StartCapture,
    /// Push-to-talk release / Xiaozhi `listen stop`: the user's utterance is over.
    StopCapture,
    /// Replaces the client's tool definitions (`UpdateToolDefinitionsRequest`).
    SetTools(Vec<ToolDefinition>),
    /// Replaces every server-side tool ([`ServerToolDefinition`]); an empty list removes them.
    /// Sent whenever the server's set of tools changes; the next generation offers the new set
    /// and calls in flight finish as they were sent.
    ServerTools(Vec<ServerToolDefinition>),
    /// The client's answer to a [`ClientEvent::ToolCallRequest`] (`ToolCallResponse`).
    ToolResult {
        /// The id from the request.
        id: String,
        /// The result text (JSON or prose) handed to the model.
        result: String,
    },
    /// Replaces the client's declared actions (VIP §5.3.1 action registry, the `actions`
    /// map); an empty list removes them all. Each is offered to the model as a tool, and a
    /// model's call of one goes to the client as [`ClientEvent::ActionInvoke`]. At most
    /// [`voxgate_mcp::action::MAX_ACTIONS`] (a longer list is refused with
    /// [`ClientEvent::ActionError`] and the previous actions stay); an action whose schema does
    /// not compile or that is over a size maximum is left out and reported the same way.
    /// Invocations in flight finish as they were sent.
    SetActions(Vec<Action>),
    /// The client's narrated state (VIP §5.3.2): a textual description of its current view,
    /// sent at session start and on every significant UI change. The newest one goes into
    /// every later reply's context, as a system message right before the newest user turn;
    /// an empty text removes it. At most [`voxgate_mcp::action::MAX_NARRATED_STATE_BYTES`] (a
    /// longer one is refused with [`ClientEvent::ActionError`] and the previous one stays).
    NarratedState(String),
    /// The client's `action.result` for a [`ClientEvent::ActionInvoke`]. A result for an
    /// invocation no longer awaited (timed out, cancelled, never issued) is refused with
    /// [`ClientEvent::ActionError`].
    ActionResult {
        /// The invocation answered.
        invocation: InvocationId,
        /// Success data for the model, or the standard error payload.
        outcome: ActionOutcome,
    },
    /// The device speaks MCP (Xiaozhi `features.mcp`): start the MCP client (`initialize`, then
    /// `tools/list`).
    DeviceMcpStart,
    /// A JSON-RPC payload from the device (the Xiaozhi `mcp` envelope's `payload`).
    DeviceMcp(Value),
    /// The client's cumulative playback position of response `turn` in output-format bytes
    /// (`PlaybackPositionReport`).
    PlaybackReport {
        /// The response being played.
        turn: TurnId,
        /// Bytes played so far, counted as [`crate::OutputAudio::bytes_per_second`] describes.
        bytes_played: u64,
    },
    /// Speak this text verbatim, cancelling any inference (`DirectSpeech`).
    DirectSpeech {
        /// The text.
        text: String,
        /// Keep it in history (else the entry is `ephemeral`).
        include_in_history: bool,
        /// User speech cannot interrupt it.
        uninterruptible: bool,
    },
    /// A one-off question about the conversation, answered with [`ClientEvent::QueryResult`].
    ConversationQuery {
        /// The question.
        prompt: Option<String>,
        /// Instructions for answering it.
        instructions: Option<String>,
    },
    /// `ExportChatHistoryRequest`: answered with [`ClientEvent::History`].
    ExportHistory {
        /// Wait until the response in progress (and its tools) has finished.
        await_pending: bool,
        /// Leave recorded audio out.
        exclude_audio: bool,
    },
    /// The client aborted the agent (Xiaozhi `abort`, a stop button).
    Abort,
    /// `ReconfigureSessionRequest`: the client's input audio format and/or the inference
    /// settings changed. History, tools and the response in progress are kept.
    ///
    /// A new input rate swaps the VAD and resampler: an utterance in progress ends at the
    /// switch (it is transcribed as usual and the VAD reports a return to silence), and VAD
    /// positions ([`ClientEvent::VadState`]) count from 0 again in the new rate. The new
    /// system prompt and temperature apply from the next LLM request.
    Reconfigure {
        /// The new sample rate of [`Input::Audio`] in Hz (`input_audio_line`), if it changed.
        input_rate: Option<u32>,
        /// A new system prompt (`inference_configuration.system_prompt`).
        system_prompt: Option<String>,
        /// A new sampling temperature (`inference_configuration.temperature`).
        temperature: Option<f64>,
    },
    /// The client or device disconnected: the session is over. The response in progress is
    /// cut off (its history entry truncated to what was heard and marked interrupted; a begun
    /// response still gets its [`ClientEvent::ResponseEnd`] and
    /// [`ClientEvent::ResponseFinished`] so the record is complete), every provider request in
    /// flight is cancelled, and tool calls still running get a "cancelled" result in history
    /// so every call there has its answer. Afterwards every input but [`Input::Provider`]
    /// (counted as stale) and another `Close` is refused with [`InputError::Closed`], and
    /// audio is ignored.
    Close,
    /// A provider answered one of the engine's [`ProviderRequest`]s.
    Provider(ProviderEvent),
}

/// What the engine asks of its host. Drain with [`crate::Engine::poll_output`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Output {
    /// Send this to the client (the door translates it to its protocol).
    Client(ClientEvent),
    /// Hand this to a provider; its answers come back as [`Input::Provider`].
    Provider(ProviderRequest),
}

/// Why something failed, in the realtime protocol's `SessionErrorCategory` terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCategory {
    /// The session state does not allow the request.
    Session,
    /// Bad configuration.
    Configuration,
    /// The client broke the protocol.
    Protocol,
    /// The LLM failed.
    Inference,
    /// Audio input or the recognizer failed.
    Audio,
    /// Speech synthesis failed.
    Tts,
    /// A bug on our side.
    Internal,
}

/// Events for the client, in the order they must reach it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ClientEvent {
    /// A response began (realtime `ResponseBegin`, Xiaozhi `tts start`).
    ResponseBegin {
        /// The response.
        turn: TurnId,
    },
    /// Generation of the response finished (realtime `ResponseEnd`); audio already sent may
    /// still be playing. Also sent when a begun response is cut off.
    ResponseEnd {
        /// The response.
        turn: TurnId,
    },
    /// The response is over and its history entry final: playback finished or it was cut off
    /// (Xiaozhi `tts stop` after the last frame).
    ResponseFinished {
        /// The response.
        turn: TurnId,
        /// Whether it was cut off.
        interrupted: bool,
    },
    /// Reply text for text-only sessions (realtime `ModelTextFragment`).
    TextFragment {
        /// The response.
        turn: TurnId,
        /// The text.
        text: String,
    },
    /// A sentence is about to be spoken (Xiaozhi `tts sentence_start`, subtitles); its audio
    /// follows.
    SentenceStart {
        /// The response.
        turn: TurnId,
        /// The sentence, emoji stripped.
        text: String,
    },
    /// Synthesized reply audio (realtime `ModelAudioChunk`), mono at `sample_rate`.
    AudioChunk {
        /// The response.
        turn: TurnId,
        /// Samples.
        samples: Vec<i16>,
        /// Their rate in Hz (convert to the client's output format).
        sample_rate: u32,
        /// The sentence this audio starts, on its first chunk.
        transcript: Option<String>,
    },
    /// Halt playback at once and drop buffered audio (`PlaybackClearBuffer`, Xiaozhi `tts stop`).
    ClearPlayback,
    /// The VAD changed state (realtime `VadStateEvent`).
    VadState {
        /// Previous state.
        from: VadState,
        /// New state.
        to: VadState,
        /// Input-rate sample position of the change since the start of the audio stream.
        position: u64,
    },
    /// Per-frame VAD telemetry (realtime `VadAnalysisFrame`), when enabled.
    VadFrame {
        /// Frame number.
        index: u64,
        /// Model confidence.
        confidence: f32,
        /// Volume 0..=1.
        volume: f32,
        /// State after the frame.
        state: VadState,
    },
    /// What the user said in a spoken turn (realtime `UserTranscriptionResult`, Xiaozhi `stt`).
    UserTranscription {
        /// The committed user turn.
        turn: TurnId,
        /// The transcript.
        text: String,
        /// Language reported by the recognizer (may be empty).
        language: String,
    },
    /// Run a client tool and answer with [`Input::ToolResult`] (realtime `ToolCallRequest`).
    ToolCallRequest {
        /// Correlation id.
        id: String,
        /// The client's own name for the tool.
        name: String,
        /// Validated arguments.
        arguments: Value,
        /// The response that called it.
        turn: TurnId,
    },
    /// The face for this reply, read from its leading emoji (Xiaozhi `llm` frame with
    /// `emotion`).
    Emotion {
        /// The response.
        turn: TurnId,
        /// The emoji.
        emoji: String,
        /// Its name ([`Emotion::nearest`]); doors map it to their wire value.
        emotion: Emotion,
    },
    /// Send this JSON-RPC message to the device (Xiaozhi `mcp` envelope).
    DeviceMcp(Message),
    /// VIP `action.invoke`: run a declared action ([`Input::SetActions`]) and answer with
    /// [`Input::ActionResult`] before the action timeout.
    ActionInvoke {
        /// Correlates the result.
        invocation: InvocationId,
        /// The declared action's id.
        action_id: String,
        /// Parameters, validated against the action's schema.
        parameters: Value,
        /// The response that invoked it.
        turn: TurnId,
    },
    /// The engine no longer waits for this invocation's result: it timed out, or the reply
    /// that invoked it was cut off (barge-in, abort). A later result is refused.
    ActionCancelled {
        /// The invocation.
        invocation: InvocationId,
        /// Why (code `timeout` or `cancelled`).
        reason: ErrorPayload,
    },
    /// Something the client sent on the action channel was refused (an action left out of a
    /// declaration, a declaration or narrated state over its maximum, a result for an
    /// invocation not awaited). The session goes on.
    ActionError {
        /// The invocation concerned, if any.
        invocation: Option<InvocationId>,
        /// The action concerned, if any.
        action: Option<String>,
        /// What was refused, in the standard error payload shape.
        error: ErrorPayload,
    },
    /// The conversation so far (realtime `ChatHistory`): the messages still in memory.
    History {
        /// The messages, oldest first.
        messages: Vec<ChatMessage>,
        /// Messages dropped from memory since the session started to stay within
        /// [`crate::EngineConfig::max_history_messages`]; they came before `messages`.
        dropped: u64,
    },
    /// The answer to a [`Input::ConversationQuery`], in query order.
    QueryResult {
        /// The answer.
        text: String,
    },
    /// Something failed; the session goes on (realtime `SessionErrorNotification`).
    Error {
        /// Who failed.
        category: ErrorCategory,
        /// What happened.
        message: String,
    },
    /// Older turns left the model's context to keep it within
    /// [`crate::EngineConfig::max_context_chars`] (realtime `ContextTruncated`). Sent once per
    /// cycle, before the response's [`ClientEvent::ResponseBegin`], with only the turns newly
    /// dropped; they stay out of every later context.
    ContextTruncated {
        /// The turns dropped in this cycle (user turns and response turns), oldest first.
        truncated: Vec<TurnId>,
        /// The response generated without them.
        response: TurnId,
    },
}

/// Identifies one provider request the engine issued. Events carry it back, so events of
/// cancelled or superseded work are recognised and dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "req#{}", self.0)
    }
}

/// Inputs refused because the client broke the protocol. The engine is unchanged; the door
/// reports it ([`InputError::category`]) and keeps serving.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InputError {
    /// A tool result for a call that is not pending.
    #[error("no pending tool call with id {0:?}")]
    UnknownToolCall(String),
    /// `ConversationQuery` with neither prompt nor instructions.
    #[error("a conversation query needs a prompt or instructions")]
    EmptyQuery,
    /// A device MCP message while the device MCP client is not started.
    #[error("device MCP traffic before DeviceMcpStart")]
    DeviceMcpNotStarted,
    /// [`Input::Reconfigure`] asked for an input rate the VAD cannot use; nothing changed.
    #[error("unusable input rate {rate} Hz: {source}")]
    InputRate {
        /// The rate asked for.
        rate: u32,
        /// Why it cannot be used.
        source: voxgate_audio::vad::VadError,
    },
    /// The session was closed ([`Input::Close`]).
    #[error("the session is closed")]
    Closed,
    /// The turn machine refused the input in this state.
    #[error(transparent)]
    Turn(#[from] voxgate_turn::InputError),
}

impl InputError {
    /// The realtime error category to report it under.
    #[must_use]
    pub fn category(&self) -> ErrorCategory {
        match self {
            Self::Turn(voxgate_turn::InputError::NotConnected) | Self::Closed => {
                ErrorCategory::Session
            }
            Self::InputRate { .. } => ErrorCategory::Configuration,
            _ => ErrorCategory::Protocol,
        }
    }
}

/// A configuration the engine cannot run with (a caller bug).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The VAD refused its settings or the input rate.
    #[error("VAD: {0}")]
    Vad(#[from] voxgate_audio::vad::VadError),
    /// An output rate or byte rate of zero.
    #[error("output audio needs a non-zero sample rate and byte rate")]
    OutputAudio,
}
