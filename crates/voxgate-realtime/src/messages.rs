//! Constructors for every message a server or client sends.
//!
//! Each payload type also converts into its envelope with `From`, so
//! `ClientBoundMessage::from(ResponseBegin { turn_id: 3 })` and
//! `ClientBoundMessage::response_begin(3)` are the same message.

use std::time::Duration;

use bytes::Bytes;

use crate::config::{AudioFormat, SessionConfig, SessionUpdate};
use crate::error::UsageError;
use crate::json;
use crate::proto::{
    AudioData, ChatAudioData, ChatHistory, ChatMessage, ChatMessageContent, ChatTextContent,
    ClientBoundMessage, ContextTruncated, ConversationQuery, ConversationQueryResult, DirectSpeech,
    ExportChatHistoryRequest, InferenceComplete, InferenceTriggerMode, InitializeSessionRequest,
    ModelAudioChunk, ModelSpeechProgress, ModelTextFragment, Ping, PlaybackClearBuffer,
    PlaybackPositionReport, Pong, ReconfigureSessionRequest, ResponseBegin, ResponseEnd,
    ServiceBoundMessage, SessionErrorCategory, SessionErrorNotification, SessionReady, TextData,
    ToolCallRequest, ToolCallResponse, ToolDefinition, TriggerInference, TurnSnapshot,
    UpdateToolDefinitionsRequest, UserInput, UserTranscriptionResult, VadAnalysisFrame, VadState,
    VadStateEvent, chat_message_content, client_bound_message, service_bound_message, user_input,
};

/// `impl From<Payload> for Envelope` for every oneof variant.
macro_rules! into_envelope {
    ($envelope:ident, $payload:path { $($variant:ident),+ $(,)? }) => {$(
        impl From<$variant> for $envelope {
            fn from(payload: $variant) -> Self {
                use $payload as P;
                Self {
                    payload: Some(P::$variant(payload)),
                }
            }
        }
    )+};
}

into_envelope!(
    ServiceBoundMessage,
    service_bound_message::Payload {
        InitializeSessionRequest,
        ReconfigureSessionRequest,
        UserInput,
        UpdateToolDefinitionsRequest,
        ToolCallResponse,
        TriggerInference,
        ExportChatHistoryRequest,
        PlaybackPositionReport,
        DirectSpeech,
        ConversationQuery,
        Ping,
    }
);

into_envelope!(
    ClientBoundMessage,
    client_bound_message::Payload {
        ToolCallRequest,
        ModelTextFragment,
        ModelAudioChunk,
        PlaybackClearBuffer,
        ResponseBegin,
        ResponseEnd,
        ChatHistory,
        UserTranscriptionResult,
        ConversationQueryResult,
        SessionReady,
        VadAnalysisFrame,
        VadStateEvent,
        ContextTruncated,
        Pong,
        ModelSpeechProgress,
        TurnSnapshot,
        InferenceComplete,
    }
);

// The oneof variant is called `Error`, not `SessionErrorNotification`.
impl From<SessionErrorNotification> for ClientBoundMessage {
    fn from(payload: SessionErrorNotification) -> Self {
        Self {
            payload: Some(client_bound_message::Payload::Error(payload)),
        }
    }
}

/// Messages a client sends.
impl ServiceBoundMessage {
    /// `InitializeSessionRequest` from a checked configuration.
    ///
    /// # Errors
    ///
    /// As [`SessionConfig::to_wire`].
    pub fn initialize(config: &SessionConfig) -> Result<Self, UsageError> {
        Ok(config.to_wire()?.into())
    }

    /// `ReconfigureSessionRequest` from a checked update.
    #[must_use]
    pub fn reconfigure(update: &SessionUpdate) -> Self {
        update.to_wire().into()
    }

    /// Audio `UserInput`: raw PCM in the session's input format. The audio is shared, not copied.
    #[must_use]
    pub fn user_audio(packet_id: u64, mode: InferenceTriggerMode, audio: Bytes) -> Self {
        UserInput {
            packet_id,
            mode: mode.into(),
            input: Some(user_input::Input::AudioData(AudioData { data: audio })),
        }
        .into()
    }

    /// Text `UserInput`.
    #[must_use]
    pub fn user_text(packet_id: u64, mode: InferenceTriggerMode, text: impl Into<String>) -> Self {
        UserInput {
            packet_id,
            mode: mode.into(),
            input: Some(user_input::Input::TextData(TextData { data: text.into() })),
        }
        .into()
    }

    /// `UpdateToolDefinitionsRequest`, replacing every tool; see [`ToolDefinition::from_json`].
    #[must_use]
    pub fn update_tools(tools: Vec<ToolDefinition>) -> Self {
        UpdateToolDefinitionsRequest {
            tool_definitions: tools,
        }
        .into()
    }

    /// `ToolCallResponse` answering the call with `id`.
    #[must_use]
    pub fn tool_call_response(id: impl Into<String>, result: impl Into<String>) -> Self {
        ToolCallResponse {
            id: id.into(),
            result: result.into(),
        }
        .into()
    }

    /// `TriggerInference`: start a reply now, optionally ending the user's utterance first.
    #[must_use]
    pub fn trigger_inference(extra_instructions: Option<String>, flush_vad: bool) -> Self {
        TriggerInference {
            extra_instructions,
            flush_vad,
        }
        .into()
    }

    /// `ExportChatHistoryRequest`.
    #[must_use]
    pub fn export_chat_history(await_pending: bool, exclude_audio: bool) -> Self {
        ExportChatHistoryRequest {
            await_pending,
            exclude_audio,
        }
        .into()
    }

    /// `PlaybackPositionReport`: cumulative output bytes played.
    #[must_use]
    pub fn playback_report(bytes_played: u64, turn_id: Option<u32>) -> Self {
        PlaybackPositionReport {
            bytes_played,
            turn_id,
        }
        .into()
    }

    /// `DirectSpeech`: speak `text` now, bypassing the model.
    #[must_use]
    pub fn direct_speech(
        text: impl Into<String>,
        include_in_history: bool,
        uninterruptable: bool,
    ) -> Self {
        DirectSpeech {
            text: text.into(),
            include_in_history,
            uninterruptable,
        }
        .into()
    }

    /// `ConversationQuery`.
    ///
    /// # Errors
    ///
    /// [`UsageError::EmptyConversationQuery`] when both are `None`; the server would reject it.
    pub fn conversation_query(
        prompt: Option<String>,
        instructions: Option<String>,
    ) -> Result<Self, UsageError> {
        if prompt.is_none() && instructions.is_none() {
            return Err(UsageError::EmptyConversationQuery);
        }
        Ok(ConversationQuery {
            prompt,
            instructions,
        }
        .into())
    }

    /// `Ping`.
    #[must_use]
    pub fn ping() -> Self {
        Ping {}.into()
    }
}

/// Messages a server sends.
impl ClientBoundMessage {
    /// `ToolCallRequest`; see [`ToolCallRequest::from_json`] to build one from JSON arguments.
    #[must_use]
    pub fn tool_call_request(request: ToolCallRequest) -> Self {
        request.into()
    }

    /// `ModelTextFragment`: the next piece of reply text.
    #[must_use]
    pub fn model_text_fragment(text: impl Into<String>, turn_id: Option<u32>) -> Self {
        ModelTextFragment {
            text: text.into(),
            turn_id,
        }
        .into()
    }

    /// `ModelAudioChunk`: reply audio in the session's output format, shared, not copied.
    #[must_use]
    pub fn model_audio_chunk(audio: Bytes, turn_id: Option<u32>) -> Self {
        ModelAudioChunk {
            audio: Some(AudioData { data: audio }),
            turn_id,
        }
        .into()
    }

    /// `PlaybackClearBuffer`: the user started speaking; drop unplayed audio.
    #[must_use]
    pub fn playback_clear_buffer() -> Self {
        PlaybackClearBuffer {}.into()
    }

    /// `ResponseBegin`.
    #[must_use]
    pub fn response_begin(turn_id: u32) -> Self {
        ResponseBegin { turn_id }.into()
    }

    /// `ResponseEnd`.
    #[must_use]
    pub fn response_end(turn_id: u32) -> Self {
        ResponseEnd { turn_id }.into()
    }

    /// `ChatHistory`, oldest message first.
    #[must_use]
    pub fn chat_history(messages: Vec<ChatMessage>) -> Self {
        ChatHistory { messages }.into()
    }

    /// `SessionErrorNotification`; [`Error::to_client_message`](crate::Error::to_client_message)
    /// builds one from this crate's errors.
    #[must_use]
    pub fn error(
        category: SessionErrorCategory,
        message: impl Into<String>,
        trace_id: Option<String>,
    ) -> Self {
        SessionErrorNotification {
            category: category.into(),
            message: message.into(),
            trace_id,
        }
        .into()
    }

    /// `UserTranscriptionResult`; `language` is an ISO 639-1 code.
    #[must_use]
    pub fn user_transcription_result(
        turn_id: u32,
        text: impl Into<String>,
        language: impl Into<String>,
    ) -> Self {
        UserTranscriptionResult {
            turn_id,
            text: text.into(),
            language: language.into(),
        }
        .into()
    }

    /// `ConversationQueryResult`.
    #[must_use]
    pub fn conversation_query_result(text: impl Into<String>) -> Self {
        ConversationQueryResult { text: text.into() }.into()
    }

    /// `SessionReady`: the client may start sending.
    #[must_use]
    pub fn session_ready() -> Self {
        SessionReady {}.into()
    }

    /// `VadAnalysisFrame` telemetry.
    #[must_use]
    pub fn vad_analysis_frame(
        frame_index: u64,
        session_time: Duration,
        confidence: f32,
        volume: f32,
        state: VadState,
        source_packet_ids: Vec<u64>,
    ) -> Self {
        VadAnalysisFrame {
            frame_index,
            session_time: Some(session_time.into()),
            confidence,
            volume,
            state: state.into(),
            source_packet_ids,
        }
        .into()
    }

    /// `VadStateEvent`.
    #[must_use]
    pub fn vad_state_event(
        session_time: Duration,
        from_state: VadState,
        to_state: VadState,
        packet_id: u64,
    ) -> Self {
        VadStateEvent {
            session_time: Some(session_time.into()),
            from_state: from_state.into(),
            to_state: to_state.into(),
            packet_id,
        }
        .into()
    }

    /// `ContextTruncated`.
    #[must_use]
    pub fn context_truncated(truncated_turn_ids: Vec<u32>, response_turn_id: u32) -> Self {
        ContextTruncated {
            truncated_turn_ids,
            response_turn_id,
        }
        .into()
    }

    /// `Pong`.
    #[must_use]
    pub fn pong() -> Self {
        Pong {}.into()
    }

    /// `ModelSpeechProgress`; `exact` when based on client playback reports.
    #[must_use]
    pub fn model_speech_progress(
        turn_id: u32,
        text: impl Into<String>,
        audio_bytes_played: u64,
        exact: bool,
    ) -> Self {
        ModelSpeechProgress {
            turn_id,
            text: text.into(),
            audio_bytes_played,
            exact,
        }
        .into()
    }

    /// `TurnSnapshot`.
    #[must_use]
    pub fn turn_snapshot(message: ChatMessage, is_final: bool) -> Self {
        TurnSnapshot {
            message: Some(message),
            is_final,
        }
        .into()
    }

    /// `InferenceComplete`.
    #[must_use]
    pub fn inference_complete(turn_id: u32) -> Self {
        InferenceComplete { turn_id }.into()
    }
}

impl ToolDefinition {
    /// A tool whose parameters are the JSON Schema `schema` (an object).
    ///
    /// # Errors
    ///
    /// [`UsageError::Json`] when `schema` is not a JSON object or nests too deeply.
    pub fn from_json(
        name: impl Into<String>,
        description: Option<String>,
        schema: &serde_json::Value,
    ) -> Result<Self, UsageError> {
        Ok(Self {
            name: name.into(),
            description,
            parameters: Some(json::json_to_struct(schema).map_err(UsageError::Json)?),
        })
    }
}

impl ToolCallRequest {
    /// A tool call whose arguments are the JSON object `arguments`.
    ///
    /// # Errors
    ///
    /// [`UsageError::Json`] when `arguments` is not a JSON object or nests too deeply.
    pub fn from_json(
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: &serde_json::Value,
        turn_id: Option<u32>,
    ) -> Result<Self, UsageError> {
        Ok(Self {
            id: id.into(),
            name: name.into(),
            parameters: Some(json::json_to_struct(arguments).map_err(UsageError::Json)?),
            turn_id,
        })
    }
}

impl ChatAudioData {
    /// Audio with its format and transcription; the audio is shared, not copied.
    #[must_use]
    pub fn new(audio: Bytes, format: AudioFormat, transcription: impl Into<String>) -> Self {
        Self {
            audio: Some(AudioData { data: audio }),
            format: Some(format.to_wire()),
            transcription: transcription.into(),
        }
    }
}

impl ChatMessageContent {
    fn of(content: chat_message_content::Content) -> Self {
        Self {
            content: Some(content),
        }
    }

    /// Text, with its synthesized speech when there is some.
    #[must_use]
    pub fn text(text: impl Into<String>, tts_audio: Option<ChatAudioData>) -> Self {
        Self::of(chat_message_content::Content::TextContent(
            ChatTextContent {
                text: text.into(),
                tts_audio,
            },
        ))
    }

    /// User input audio, or model audio not synthesized from text.
    #[must_use]
    pub fn input_audio(audio: ChatAudioData) -> Self {
        Self::of(chat_message_content::Content::InputAudio(audio))
    }

    /// The model's reasoning.
    #[must_use]
    pub fn thoughts(thoughts: impl Into<String>) -> Self {
        Self::of(chat_message_content::Content::Thoughts(thoughts.into()))
    }

    /// A tool call made by the model.
    #[must_use]
    pub fn tool_call(call: ToolCallRequest) -> Self {
        Self::of(chat_message_content::Content::ToolCall(call))
    }

    /// A tool's result.
    #[must_use]
    pub fn tool_result(result: ToolCallResponse) -> Self {
        Self::of(chat_message_content::Content::ToolResult(result))
    }

    /// Instructions given to the model.
    #[must_use]
    pub fn instructions(instructions: impl Into<String>) -> Self {
        Self::of(chat_message_content::Content::Instructions(
            instructions.into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::proto::client_bound_message::Payload as C;
    use crate::proto::service_bound_message::Payload as S;

    #[test]
    fn service_constructors_fill_the_right_variant() {
        let audio = Bytes::from_static(&[1, 2, 3, 4]);
        let msg =
            ServiceBoundMessage::user_audio(7, InferenceTriggerMode::Immediate, audio.clone());
        let Some(S::UserInput(input)) = &msg.payload else {
            panic!("{msg:?}");
        };
        assert_eq!(input.packet_id, 7);
        assert_eq!(input.mode, 2);
        assert_eq!(
            input.input,
            Some(user_input::Input::AudioData(AudioData { data: audio }))
        );
        assert!(matches!(
            ServiceBoundMessage::trigger_inference(Some("hi".into()), true).payload,
            Some(S::TriggerInference(TriggerInference {
                flush_vad: true,
                ..
            }))
        ));
        assert!(matches!(
            ServiceBoundMessage::playback_report(960, Some(2)).payload,
            Some(S::PlaybackPositionReport(PlaybackPositionReport {
                bytes_played: 960,
                turn_id: Some(2)
            }))
        ));
        assert_eq!(
            ServiceBoundMessage::conversation_query(None, None),
            Err(UsageError::EmptyConversationQuery)
        );
        assert!(ServiceBoundMessage::conversation_query(None, Some("x".into())).is_ok());
    }

    #[test]
    fn tool_definition_from_schema() {
        let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
        let tool = ToolDefinition::from_json("count", Some("Counts".into()), &schema).unwrap();
        let back = json::struct_to_json(tool.parameters.as_ref().unwrap()).unwrap();
        assert_eq!(serde_json::Value::Object(back), schema);
        assert!(matches!(
            ToolDefinition::from_json("bad", None, &json!([1])),
            Err(UsageError::Json(crate::StructError::NotAnObject {
                found: "an array"
            }))
        ));
    }

    #[test]
    fn client_constructors_fill_the_right_variant() {
        let cases: Vec<(ClientBoundMessage, &str)> = vec![
            (
                ClientBoundMessage::playback_clear_buffer(),
                "playback_clear_buffer",
            ),
            (ClientBoundMessage::response_begin(1), "response_begin"),
            (ClientBoundMessage::response_end(1), "response_end"),
            (ClientBoundMessage::session_ready(), "session_ready"),
            (ClientBoundMessage::pong(), "pong"),
            (
                ClientBoundMessage::inference_complete(1),
                "inference_complete",
            ),
            (ClientBoundMessage::chat_history(vec![]), "chat_history"),
            (
                ClientBoundMessage::context_truncated(vec![1], 2),
                "context_truncated",
            ),
            (
                ClientBoundMessage::error(SessionErrorCategory::ErrorTts, "tts down", None),
                "error",
            ),
        ];
        for (msg, kind) in cases {
            assert_eq!(msg.kind().map(crate::ClientBoundKind::as_str), Some(kind));
        }
        let msg = ClientBoundMessage::vad_state_event(
            Duration::from_millis(1500),
            VadState::Silence,
            VadState::SpeechStarting,
            9,
        );
        let Some(C::VadStateEvent(event)) = msg.payload else {
            panic!();
        };
        assert_eq!(
            event.session_time,
            Some(crate::proto::Duration {
                seconds: 1,
                nanos: 500_000_000
            })
        );
        assert_eq!(event.to_state, 1);
    }
}
