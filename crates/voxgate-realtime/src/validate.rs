//! Semantic checks of decoded messages, beyond what decoding guarantees.
//!
//! Decoding accepts anything protobuf accepts. `validate` adds the protocol's rules: a payload
//! is present, required sub-messages and identifiers are there, configurations parse, Structs
//! have a JSON form, and every client-chosen size is within its maximum in
//! [`limits`](crate::limits). It deliberately accepts unknown enum values outside configurations (they
//! are data, see [`Open`](crate::Open)), so newer peers keep working.

use std::borrow::Cow;
use std::collections::BTreeSet;

use crate::config::{SessionConfig, SessionUpdate};
use crate::error::{Error, ProtocolError};
use crate::json;
use crate::limits;
use crate::proto::{
    ChatAudioData, ChatMessage, ClientBoundMessage, ServiceBoundMessage, ToolCallRequest,
    chat_message_content, client_bound_message, service_bound_message, user_input,
};

/// Refuses a string or list larger than its documented maximum.
fn check_size(
    field: impl Into<Cow<'static, str>>,
    len: usize,
    max: usize,
    unit: &'static str,
) -> Result<(), ProtocolError> {
    if len > max {
        return Err(ProtocolError::TooLarge {
            field: field.into(),
            len,
            max,
            unit,
        });
    }
    Ok(())
}

/// Counts the bytes a serializer writes, so a schema's size is known without keeping its text.
struct ByteCount(usize);

impl std::io::Write for ByteCount {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 = self.0.saturating_add(buf.len());
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Checks a tool list: the count before any per-tool work, then each tool's name, description
/// and parameter schema (which must have a JSON form within [`limits::MAX_TOOL_SCHEMA_BYTES`]).
fn check_tool_definitions(tools: &[crate::proto::ToolDefinition]) -> Result<(), ProtocolError> {
    const PATH: &str = "update_tool_definitions_request.tool_definitions";
    check_size(PATH, tools.len(), limits::MAX_TOOLS, "tools")?;
    let mut names = BTreeSet::new();
    for (i, tool) in tools.iter().enumerate() {
        if tool.name.is_empty() {
            return Err(ProtocolError::EmptyField {
                field: format!("{PATH}[{i}].name").into(),
            });
        }
        check_size(
            format!("{PATH}[{i}].name"),
            tool.name.len(),
            limits::MAX_TOOL_NAME_BYTES,
            "bytes",
        )?;
        if let Some(description) = &tool.description {
            check_size(
                format!("{PATH}[{i}].description"),
                description.len(),
                limits::MAX_TOOL_DESCRIPTION_BYTES,
                "bytes",
            )?;
        }
        if !names.insert(tool.name.as_str()) {
            return Err(ProtocolError::DuplicateTool {
                name: tool.name.clone(),
            });
        }
        if let Some(parameters) = &tool.parameters {
            let field = || format!("{PATH}[{i}].parameters");
            let schema =
                json::struct_to_json(parameters).map_err(|error| ProtocolError::InvalidStruct {
                    field: field().into(),
                    error,
                })?;
            let mut size = ByteCount(0);
            // Writing to `ByteCount` cannot fail, nor can serializing a JSON map.
            let _ = serde_json::to_writer(&mut size, &schema);
            check_size(field(), size.0, limits::MAX_TOOL_SCHEMA_BYTES, "bytes")?;
        }
    }
    Ok(())
}

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
            P::UserInput(input) => match &input.input {
                None => return Err(missing("user_input.input").into()),
                Some(user_input::Input::TextData(text)) => check_size(
                    "user_input.text_data.data",
                    text.data.len(),
                    limits::MAX_TEXT_BYTES,
                    "bytes",
                )?,
                Some(user_input::Input::AudioData(_)) => {}
            },
            P::UpdateToolDefinitionsRequest(update) => {
                check_tool_definitions(&update.tool_definitions)?;
            }
            P::ToolCallResponse(r) => non_empty("tool_call_response.id", &r.id)?,
            P::ConversationQuery(q) => {
                if q.prompt.is_none() && q.instructions.is_none() {
                    return Err(ProtocolError::EmptyConversationQuery.into());
                }
                for (field, text) in [
                    ("conversation_query.prompt", &q.prompt),
                    ("conversation_query.instructions", &q.instructions),
                ] {
                    let len = text.as_ref().map_or(0, String::len);
                    check_size(field, len, limits::MAX_INSTRUCTIONS_BYTES, "bytes")?;
                }
            }
            P::TriggerInference(t) => check_size(
                "trigger_inference.extra_instructions",
                t.extra_instructions.as_ref().map_or(0, String::len),
                limits::MAX_INSTRUCTIONS_BYTES,
                "bytes",
            )?,
            P::DirectSpeech(d) => check_size(
                "direct_speech.text",
                d.text.len(),
                limits::MAX_TEXT_BYTES,
                "bytes",
            )?,
            P::ExportChatHistoryRequest(_) | P::PlaybackPositionReport(_) | P::Ping(_) => {}
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

    /// The count is refused before any tool is looked at, so a huge list costs nothing: the
    /// first tool here is invalid, yet the error is about the count.
    #[test]
    fn tool_lists_are_bounded() {
        let tool = |i: usize| ToolDefinition {
            name: format!("t{i}"),
            description: Some("does things".into()),
            parameters: None,
        };
        let ok: Vec<_> = (0..limits::MAX_TOOLS).map(tool).collect();
        ServiceBoundMessage::update_tools(ok).validate().unwrap();
        let mut many: Vec<_> = (0..10_000).map(tool).collect();
        many[0].name.clear();
        let err = ServiceBoundMessage::update_tools(many)
            .validate()
            .unwrap_err();
        assert_eq!(
            err.category(),
            crate::proto::SessionErrorCategory::ErrorProtocol
        );
        assert_eq!(
            err.to_string(),
            "update_tool_definitions_request.tool_definitions: 10000 tools is more than the \
             maximum of 128 tools"
        );
    }

    #[test]
    fn tool_sizes_are_bounded() {
        let update = |t: ToolDefinition| ServiceBoundMessage::update_tools(vec![t]).validate();
        let base = ToolDefinition {
            name: "a".into(),
            description: None,
            parameters: None,
        };
        let name = |n: usize| ToolDefinition {
            name: "n".repeat(n),
            ..base.clone()
        };
        update(name(limits::MAX_TOOL_NAME_BYTES)).unwrap();
        assert!(matches!(
            protocol(update(name(limits::MAX_TOOL_NAME_BYTES + 1))),
            ProtocolError::TooLarge { field, len: 129, max: 128, unit: "bytes" }
                if field == "update_tool_definitions_request.tool_definitions[0].name"
        ));
        let description = |n: usize| ToolDefinition {
            description: Some("d".repeat(n)),
            ..base.clone()
        };
        update(description(limits::MAX_TOOL_DESCRIPTION_BYTES)).unwrap();
        assert!(matches!(
            protocol(update(description(limits::MAX_TOOL_DESCRIPTION_BYTES + 1))),
            ProtocolError::TooLarge { field, .. }
                if field == "update_tool_definitions_request.tool_definitions[0].description"
        ));
        // A schema whose compact JSON is `{"d":"xxx..."}`: 8 bytes of syntax plus the string.
        let schema = |n: usize| {
            let mut s = Struct::default();
            s.fields.insert(
                "d".into(),
                Value {
                    kind: Some(Kind::StringValue("x".repeat(n))),
                },
            );
            ToolDefinition {
                parameters: Some(s),
                ..base.clone()
            }
        };
        update(schema(limits::MAX_TOOL_SCHEMA_BYTES - 8)).unwrap();
        assert!(matches!(
            protocol(update(schema(limits::MAX_TOOL_SCHEMA_BYTES - 7))),
            ProtocolError::TooLarge { field, len, max, unit: "bytes" }
                if field == "update_tool_definitions_request.tool_definitions[0].parameters"
                    && len == max + 1
        ));
    }

    #[test]
    fn texts_are_bounded() {
        use crate::proto::InferenceTriggerMode as M;
        let big = |n: usize| "y".repeat(n);
        let cases: [(ServiceBoundMessage, ServiceBoundMessage, &str); 5] = [
            (
                ServiceBoundMessage::user_text(1, M::Immediate, big(limits::MAX_TEXT_BYTES)),
                ServiceBoundMessage::user_text(1, M::Immediate, big(limits::MAX_TEXT_BYTES + 1)),
                "user_input.text_data.data",
            ),
            (
                ServiceBoundMessage::direct_speech(big(limits::MAX_TEXT_BYTES), true, false),
                ServiceBoundMessage::direct_speech(big(limits::MAX_TEXT_BYTES + 1), true, false),
                "direct_speech.text",
            ),
            (
                ServiceBoundMessage::trigger_inference(
                    Some(big(limits::MAX_INSTRUCTIONS_BYTES)),
                    false,
                ),
                ServiceBoundMessage::trigger_inference(
                    Some(big(limits::MAX_INSTRUCTIONS_BYTES + 1)),
                    false,
                ),
                "trigger_inference.extra_instructions",
            ),
            (
                ServiceBoundMessage::conversation_query(
                    Some(big(limits::MAX_INSTRUCTIONS_BYTES)),
                    None,
                )
                .unwrap(),
                ServiceBoundMessage::conversation_query(
                    Some(big(limits::MAX_INSTRUCTIONS_BYTES + 1)),
                    None,
                )
                .unwrap(),
                "conversation_query.prompt",
            ),
            (
                ServiceBoundMessage::conversation_query(
                    None,
                    Some(big(limits::MAX_INSTRUCTIONS_BYTES)),
                )
                .unwrap(),
                ServiceBoundMessage::conversation_query(
                    Some(String::new()),
                    Some(big(limits::MAX_INSTRUCTIONS_BYTES + 1)),
                )
                .unwrap(),
                "conversation_query.instructions",
            ),
        ];
        for (ok, over, path) in cases {
            ok.validate().unwrap();
            assert!(
                matches!(protocol(over.validate()), ProtocolError::TooLarge { field, .. } if field == path),
                "{path}"
            );
        }
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
