//! What the server says during a session, as typed events.

use bytes::Bytes;
use voxgate_realtime::Open;
use voxgate_realtime::proto::client_bound_message::Payload;
use voxgate_realtime::proto::{
    ChatMessage, ModelSpeechProgress, SessionErrorCategory, VadAnalysisFrame, VadStateEvent,
};

/// One event of the session, in the order the server sent it.
///
/// Answers to [`query`](crate::Handle::query),
/// [`export_history`](crate::Handle::export_history) and
/// [`ping`](crate::Handle::ping) go to their callers, not here.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Event {
    /// A reply starts.
    ResponseBegin {
        /// The reply's turn.
        turn_id: u32,
    },
    /// Reply text (sessions without speech synthesis).
    TextFragment {
        /// The reply's turn, when the server names it.
        turn_id: Option<u32>,
        /// The text.
        text: String,
    },
    /// Reply audio in the session's output format.
    AudioChunk {
        /// The reply's turn, when the server names it.
        turn_id: Option<u32>,
        /// The samples.
        audio: Bytes,
    },
    /// How much of a spoken reply has been played, with the text heard so far.
    SpeechProgress(ModelSpeechProgress),
    /// The model finished generating a reply (its audio may still be playing).
    InferenceComplete {
        /// The reply's turn.
        turn_id: u32,
    },
    /// A reply ends.
    ResponseEnd {
        /// The reply's turn.
        turn_id: u32,
    },
    /// A snapshot of the turn's history entry; `is_final` once it will not change.
    TurnSnapshot {
        /// The entry.
        message: ChatMessage,
        /// Whether this is the entry's last snapshot.
        is_final: bool,
    },
    /// What the server recognized of the user's speech.
    UserTranscription {
        /// The user's turn.
        turn_id: u32,
        /// The text.
        text: String,
        /// Its language, when known.
        language: String,
    },
    /// The user started speaking: drop reply audio not yet played.
    PlaybackClear,
    /// The model calls one of the client's tools; answer with
    /// [`tool_result`](crate::Handle::tool_result).
    ToolCall(ToolCall),
    /// The voice activity detector changed state.
    VadState(VadStateEvent),
    /// One analysed audio frame (with `enable_vad_frame_telemetry`).
    VadFrame(VadAnalysisFrame),
    /// Turns left the model's context to keep it within the server's limit.
    ContextTruncated {
        /// The turns dropped.
        truncated_turn_ids: Vec<u32>,
        /// The reply whose generation dropped them.
        response_turn_id: u32,
    },
    /// The server reported an error (it may close the session after it).
    Error(SessionError),
    /// The connection was lost and the client is about to reconnect.
    Reconnecting {
        /// Which attempt this is (1-based).
        attempt: u32,
        /// Why the connection was lost, or why the previous attempt failed.
        reason: String,
    },
    /// A new connection is ready. It is a new server session: the conversation starts over,
    /// with the same configuration and tools.
    Reconnected {
        /// The attempt that succeeded.
        attempt: u32,
    },
    /// A message this client does not know (a newer server); kept rather than dropped.
    Other(Box<voxgate_realtime::ClientBoundMessage>),
}

impl Event {
    /// The protocol message this event came from (its oneof field name through
    /// [`ClientBoundKind::as_str`](voxgate_realtime::ClientBoundKind::as_str)); `None` for the
    /// client's own reconnection events.
    #[must_use]
    pub fn kind(&self) -> Option<voxgate_realtime::ClientBoundKind> {
        use voxgate_realtime::ClientBoundKind as K;
        Some(match self {
            Self::ResponseBegin { .. } => K::ResponseBegin,
            Self::TextFragment { .. } => K::ModelTextFragment,
            Self::AudioChunk { .. } => K::ModelAudioChunk,
            Self::SpeechProgress(_) => K::ModelSpeechProgress,
            Self::InferenceComplete { .. } => K::InferenceComplete,
            Self::ResponseEnd { .. } => K::ResponseEnd,
            Self::TurnSnapshot { .. } => K::TurnSnapshot,
            Self::UserTranscription { .. } => K::UserTranscriptionResult,
            Self::PlaybackClear => K::PlaybackClearBuffer,
            Self::ToolCall(_) => K::ToolCallRequest,
            Self::VadState(_) => K::VadStateEvent,
            Self::VadFrame(_) => K::VadAnalysisFrame,
            Self::ContextTruncated { .. } => K::ContextTruncated,
            Self::Error(_) => K::Error,
            Self::Other(m) => return m.kind(),
            Self::Reconnecting { .. } | Self::Reconnected { .. } => return None,
        })
    }
}

/// A tool call from the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The call's id, to name in the result.
    pub id: String,
    /// The tool.
    pub name: String,
    /// The arguments, a JSON object (`Null` when the server sent none or they do not convert).
    pub arguments: serde_json::Value,
    /// The reply's turn.
    pub turn_id: Option<u32>,
}

/// A `SessionErrorNotification`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionError {
    /// What kind of error (unknown values kept).
    pub category: Open<SessionErrorCategory>,
    /// What happened.
    pub message: String,
    /// The server's trace id, when it gives one.
    pub trace_id: Option<String>,
}

impl std::fmt::Display for SessionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.category {
            Open::Known(c) => write!(f, "{}: {}", c.as_str_name(), self.message),
            Open::Unknown(v) => write!(f, "error category {v}: {}", self.message),
        }
    }
}

/// Turns a server message into an event; answers that go to their callers and `SessionReady`
/// (the connection's own business) come back as they are.
pub(crate) fn event_of(payload: Payload) -> Result<Event, Payload> {
    Ok(match payload {
        Payload::ResponseBegin(m) => Event::ResponseBegin { turn_id: m.turn_id },
        Payload::ModelTextFragment(m) => Event::TextFragment {
            turn_id: m.turn_id,
            text: m.text,
        },
        Payload::ModelAudioChunk(m) => Event::AudioChunk {
            turn_id: m.turn_id,
            audio: m.audio.map(|a| a.data).unwrap_or_default(),
        },
        Payload::ModelSpeechProgress(m) => Event::SpeechProgress(m),
        Payload::InferenceComplete(m) => Event::InferenceComplete { turn_id: m.turn_id },
        Payload::ResponseEnd(m) => Event::ResponseEnd { turn_id: m.turn_id },
        Payload::TurnSnapshot(m) => Event::TurnSnapshot {
            message: m.message.unwrap_or_default(),
            is_final: m.is_final,
        },
        Payload::UserTranscriptionResult(m) => Event::UserTranscription {
            turn_id: m.turn_id,
            text: m.text,
            language: m.language,
        },
        Payload::PlaybackClearBuffer(_) => Event::PlaybackClear,
        Payload::ToolCallRequest(m) => Event::ToolCall(ToolCall {
            arguments: m
                .parameters
                .as_ref()
                .and_then(|p| voxgate_realtime::json::struct_to_json(p).ok())
                .map_or(serde_json::Value::Null, serde_json::Value::Object),
            id: m.id,
            name: m.name,
            turn_id: m.turn_id,
        }),
        Payload::VadStateEvent(m) => Event::VadState(m),
        Payload::VadAnalysisFrame(m) => Event::VadFrame(m),
        Payload::ContextTruncated(m) => Event::ContextTruncated {
            truncated_turn_ids: m.truncated_turn_ids,
            response_turn_id: m.response_turn_id,
        },
        Payload::Error(m) => Event::Error(SessionError {
            category: m.category_open(),
            message: m.message,
            trace_id: m.trace_id,
        }),
        p @ (Payload::SessionReady(_)
        | Payload::Pong(_)
        | Payload::ChatHistory(_)
        | Payload::ConversationQueryResult(_)) => return Err(p),
    })
}
