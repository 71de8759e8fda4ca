//! Semantic checks of decoded messages, beyond what decoding guarantees.
//!
//! Decoding accepts anything protobuf accepts. `validate` adds the protocol's rules: a payload
//! is present, required sub-messages and identifiers are there, configurations parse, Structs
//! have a JSON form. It deliberately accepts unknown enum values outside configurations (they
//! are data, see [`Open`](crate::Open)), so newer peers keep working.

use std::borrow::Cow;
use std::collections::BTreeSet;

use crate::config::{SessionConfig, SessionUpdate};
use crate::error::{Error, ProtocolError};
use crate::json;
use crate::proto::{
    ChatAudioData, ChatMessage, ClientBoundMessage, ServiceBoundMessage, ToolCallRequest,
    chat_message_content, client_bound_message, service_bound_message,
};

fn missing(field: impl Into<Cow<'static, str>>) -> ProtocolError {
    ProtocolError::MissingField {
        field: field.into(),
    }
}

fn non_empty(field: &'static str, value: &str) -> Result<(), ProtocolError> {
    if value.is_empty() {
        return Err(ProtocolError::EmptyField {
            field: field.into(),
        });
    }
    Ok(())
}

fn struct_has_json(
    field: impl Into<Cow<'static, str>>,
    s: Option<&prost_types::Struct>,
) -> Result<(), ProtocolError> {
    if let Some(s) = s {
        json::struct_to_json(s).map_err(|error| ProtocolError::InvalidStruct {
            field: field.into(),
            error,
        })?;
    }
    Ok(())
}

impl ServiceBoundMessage {
    /// Checks the protocol's rules for a message from a client.
    ///
    /// Initialization and reconfiguration are fully parsed (servers usually call
    /// [`SessionConfig::from_wire`] directly to keep the result). Session lifecycle rules
    /// (initialize first, exactly once) need state and are left to the server.
    ///
    /// # Errors
    ///
    /// [`Error::Protocol`] or [`Error::Config`] naming the offending field.
    pub fn validate(&self) -> Result<(), Error> {
        use service_bound_message::Payload as P;
        let Some(payload) = &self.payload else {
            return Err(ProtocolError::MissingPayload {
                message: "ServiceBoundMessage",
            }
            .into());
        };
        match payload {
            P::InitializeSessionRequest(r) => {
                SessionConfig::from_wire(r).map_err(|e| e.within("initialize_session_request"))?;
            }
            P::ReconfigureSessionRequest(r) => {
                SessionUpdate::from_wire(r).map_err(|e| e.within("reconfigure_session_request"))?;
            }
            P::UserInput(input) => {
                if input.input.is_none() {
                    return Err(missing("user_input.input").into());
                }
            }
            P::UpdateToolDefinitionsRequest(update) => {
                let mut names = BTreeSet::new();
                for (i, tool) in update.tool_definitions.iter().enumerate() {
                    if tool.name.is_empty() {
                        return Err(ProtocolError::EmptyField {
                            field: format!(
                                "update_tool_definitions_request.tool_definitions[{i}].name"
                            )
                            .into(),
                        }
                        .into());
                    }
                    if !names.insert(tool.name.as_str()) {
                        return Err(ProtocolError::DuplicateTool {
                            name: tool.name.clone(),
                        }
                        .into());
                    }
                    struct_has_json(
                        format!("update_tool_definitions_request.tool_definitions[{i}].parameters"),
                        tool.parameters.as_ref(),
                    )?;
                }
            }
            P::ToolCallResponse(r) => non_empty("tool_call_response.id", &r.id)?,
            P::ConversationQuery(q) => {
                if q.prompt.is_none() && q.instructions.is_none() {
                    return Err(ProtocolError::EmptyConversationQuery.into());
                }
            }
            P::TriggerInference(_)
            | P::ExportChatHistoryRequest(_)
            | P::PlaybackPositionReport(_)
            | P::DirectSpeech(_)
            | P::Ping(_) => {}
        }
        Ok(())
    }
}

impl ClientBoundMessage {
    /// Checks the protocol's rules for a message from a server.
    ///
    /// # Errors
    ///
    /// [`Error::Protocol`] naming the offending field.
    pub fn validate(&self) -> Result<(), Error> {
        use client_bound_message::Payload as P;
        let Some(payload) = &self.payload else {
            return Err(ProtocolError::MissingPayload {
                message: "ClientBoundMessage",
            }
            .into());
        };
        match payload {
            P::ToolCallRequest(call) => tool_call("tool_call_request", call)?,
            P::ModelAudioChunk(chunk) => {
                if chunk.audio.is_none() {
                    return Err(missing("model_audio_chunk.audio").into());
                }
            }
            P::ChatHistory(history) => {
                for (i, message) in history.messages.iter().enumerate() {
                    chat_message(&format!("chat_history.messages[{i}]"), message)?;
                }
            }
            P::TurnSnapshot(snapshot) => match &snapshot.message {
                None => return Err(missing("turn_snapshot.message").into()),
                Some(message) => chat_message("turn_snapshot.message", message)?,
            },
            P::VadAnalysisFrame(frame) => {
                if let Some(t) = frame.session_time {
                    t.to_std().map_err(|_| ProtocolError::InvalidDuration {
                        field: "vad_analysis_frame.session_time".into(),
                        nanos: t.nanos,
                    })?;
                }
            }
            P::VadStateEvent(event) => {
                if let Some(t) = event.session_time {
                    t.to_std().map_err(|_| ProtocolError::InvalidDuration {
                        field: "vad_state_event.session_time".into(),
                        nanos: t.nanos,
                    })?;
                }
            }
            P::ModelTextFragment(_)
            | P::PlaybackClearBuffer(_)
            | P::ResponseBegin(_)
            | P::ResponseEnd(_)
            | P::Error(_)
            | P::UserTranscriptionResult(_)
            | P::ConversationQueryResult(_)
            | P::SessionReady(_)
            | P::ContextTruncated(_)
            | P::Pong(_)
            | P::ModelSpeechProgress(_)
            | P::InferenceComplete(_) => {}
        }
        Ok(())
    }
}

fn tool_call(path: &str, call: &ToolCallRequest) -> Result<(), ProtocolError> {
    if call.id.is_empty() {
        return Err(ProtocolError::EmptyField {
            field: format!("{path}.id").into(),
        });
    }
    if call.name.is_empty() {
        return Err(ProtocolError::EmptyField {
            field: format!("{path}.name").into(),
        });
    }
    struct_has_json(format!("{path}.parameters"), call.parameters.as_ref())
}

fn chat_audio(path: &str, audio: &ChatAudioData) -> Result<(), ProtocolError> {
    if audio.audio.is_none() {
        return Err(missing(format!("{path}.audio")));
    }
    if audio.format.is_none() {
        return Err(missing(format!("{path}.format")));
    }
    Ok(())
}

fn chat_message(path: &str, message: &ChatMessage) -> Result<(), ProtocolError> {
    use chat_message_content::Content as C;
    if let Some(t) = &message.created_at {
        // Timestamps are valid from year 1 to 9999 with nanos in 0..1e9 (timestamp.proto).
        const MIN: i64 = -62_135_596_800;
        const MAX: i64 = 253_402_300_799;
        if !(MIN..=MAX).contains(&t.seconds) || !(0..1_000_000_000).contains(&t.nanos) {
            return Err(ProtocolError::InvalidTimestamp {
                field: format!("{path}.created_at").into(),
                seconds: t.seconds,
                nanos: t.nanos,
            });
        }
    }
    for (i, content) in message.content.iter().enumerate() {
        let path = format!("{path}.content[{i}]");
        match &content.content {
            None => return Err(missing(format!("{path}.content"))),
            Some(C::TextContent(text)) => {
                if let Some(audio) = &text.tts_audio {
                    chat_audio(&format!("{path}.text_content.tts_audio"), audio)?;
                }
            }
            Some(C::InputAudio(audio)) => chat_audio(&format!("{path}.input_audio"), audio)?,
            Some(C::ToolCall(call)) => tool_call(&format!("{path}.tool_call"), call)?,
            Some(C::ToolResult(result)) => {
                if result.id.is_empty() {
                    return Err(ProtocolError::EmptyField {
                        field: format!("{path}.tool_result.id").into(),
                    });
                }
            }
            Some(C::Thoughts(_) | C::Instructions(_)) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use prost_types::value::Kind;
    use prost_types::{Struct, Timestamp, Value};

    use super::*;
    use crate::error::ConfigProblem;
    use crate::proto::{
        ChatMessageContent, ConversationQuery, InferenceTriggerMode, ToolCallResponse,
        ToolDefinition, TurnSnapshot, UpdateToolDefinitionsRequest, UserInput, VadAnalysisFrame,
    };

    fn nan_struct() -> Struct {
        let mut s = Struct::default();
        s.fields.insert(
            "x".into(),
            Value {
                kind: Some(Kind::NumberValue(f64::NAN)),
            },
        );
        s
    }

    fn protocol(result: Result<(), Error>) -> ProtocolError {
        match result {
            Err(Error::Protocol(p)) => p,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn service_bound_rules() {
        assert_eq!(
            protocol(ServiceBoundMessage::default().validate()),
            ProtocolError::MissingPayload {
                message: "ServiceBoundMessage"
            }
        );
        let no_input = ServiceBoundMessage::from(UserInput {
            packet_id: 1,
            mode: 99,
            input: None,
        });
        assert_eq!(
            protocol(no_input.validate()),
            ProtocolError::MissingField {
                field: "user_input.input".into()
            }
        );
        // Unknown trigger modes are data, not errors.
        let mut future = ServiceBoundMessage::user_text(1, InferenceTriggerMode::Queue, "hi");
        if let Some(service_bound_message::Payload::UserInput(u)) = &mut future.payload {
            u.mode = 99;
        }
        future.validate().unwrap();

        assert_eq!(
            protocol(ServiceBoundMessage::from(ConversationQuery::default()).validate()),
            ProtocolError::EmptyConversationQuery
        );
        ServiceBoundMessage::from(ConversationQuery {
            prompt: Some(String::new()),
            instructions: None,
        })
        .validate()
        .unwrap();
        assert_eq!(
            protocol(ServiceBoundMessage::from(ToolCallResponse::default()).validate()),
            ProtocolError::EmptyField {
                field: "tool_call_response.id".into()
            }
        );
    }

    #[test]
    fn tool_definitions() {
        let tool = |name: &str, parameters| ToolDefinition {
            name: name.into(),
            description: None,
            parameters,
        };
        let update = |tools| {
            ServiceBoundMessage::from(UpdateToolDefinitionsRequest {
                tool_definitions: tools,
            })
            .validate()
        };
        update(vec![tool("a", None), tool("b", Some(Struct::default()))]).unwrap();
        assert_eq!(
            protocol(update(vec![tool("a", None), tool("a", None)])),
            ProtocolError::DuplicateTool { name: "a".into() }
        );
        assert_eq!(
            protocol(update(vec![tool("a", None), tool("", None)])),
            ProtocolError::EmptyField {
                field: "update_tool_definitions_request.tool_definitions[1].name".into()
            }
        );
        assert!(matches!(
            protocol(update(vec![tool("a", Some(nan_struct()))])),
            ProtocolError::InvalidStruct { field, .. }
                if field == "update_tool_definitions_request.tool_definitions[0].parameters"
        ));
    }

    #[test]
    fn configurations_are_parsed() {
        let msg = ServiceBoundMessage::from(crate::proto::InitializeSessionRequest::default());
        match msg.validate() {
            Err(Error::Config(e)) => {
                assert_eq!(e.field(), "initialize_session_request.input_audio_line");
                assert_eq!(e.problem(), &ConfigProblem::Missing);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn client_bound_rules() {
        assert!(matches!(
            protocol(ClientBoundMessage::default().validate()),
            ProtocolError::MissingPayload { .. }
        ));
        let call = ToolCallRequest {
            id: "1".into(),
            name: String::new(),
            parameters: None,
            turn_id: None,
        };
        assert_eq!(
            protocol(ClientBoundMessage::tool_call_request(call).validate()),
            ProtocolError::EmptyField {
                field: "tool_call_request.name".into()
            }
        );
        assert_eq!(
            protocol(ClientBoundMessage::from(crate::proto::ModelAudioChunk::default()).validate()),
            ProtocolError::MissingField {
                field: "model_audio_chunk.audio".into()
            }
        );
        assert_eq!(
            protocol(ClientBoundMessage::from(TurnSnapshot::default()).validate()),
            ProtocolError::MissingField {
                field: "turn_snapshot.message".into()
            }
        );
        let frame = VadAnalysisFrame {
            session_time: Some(crate::proto::Duration {
                seconds: 0,
                nanos: 1_000_000_000,
            }),
            ..Default::default()
        };
        assert!(matches!(
            protocol(ClientBoundMessage::from(frame).validate()),
            ProtocolError::InvalidDuration {
                nanos: 1_000_000_000,
                ..
            }
        ));
        ClientBoundMessage::model_audio_chunk(Bytes::new(), None)
            .validate()
            .unwrap();
    }

    #[test]
    fn chat_history_rules() {
        let history = |message: ChatMessage| {
            ClientBoundMessage::chat_history(vec![ChatMessage::default(), message]).validate()
        };
        let with = |content: Vec<ChatMessageContent>| ChatMessage {
            content,
            ..Default::default()
        };
        history(with(vec![ChatMessageContent::thoughts("hm")])).unwrap();
        assert_eq!(
            protocol(history(with(vec![
                ChatMessageContent::thoughts("hm"),
                ChatMessageContent::default()
            ]))),
            ProtocolError::MissingField {
                field: "chat_history.messages[1].content[1].content".into()
            }
        );
        let audio_without_format = ChatAudioData {
            audio: Some(crate::proto::AudioData::default()),
            format: None,
            transcription: String::new(),
        };
        assert_eq!(
            protocol(history(with(vec![ChatMessageContent::text(
                "t",
                Some(audio_without_format)
            )]))),
            ProtocolError::MissingField {
                field: "chat_history.messages[1].content[0].text_content.tts_audio.format".into()
            }
        );
        assert_eq!(
            protocol(history(with(vec![ChatMessageContent::tool_result(
                ToolCallResponse::default()
            )]))),
            ProtocolError::EmptyField {
                field: "chat_history.messages[1].content[0].tool_result.id".into()
            }
        );
        let mut bad_time = with(vec![]);
        bad_time.created_at = Some(Timestamp {
            seconds: 0,
            nanos: -1,
        });
        assert!(matches!(
            protocol(history(bad_time)),
            ProtocolError::InvalidTimestamp { nanos: -1, .. }
        ));
    }
}
