//! Framing: one protobuf message per WebSocket binary frame.
//!
//! Decoding takes the frame as [`Bytes`], so every `bytes` field of the result (audio above all)
//! is a reference-counted slice of the frame rather than a copy. Encoding writes into any
//! [`BufMut`] the caller owns, so a sender can reuse one buffer for every frame.

use bytes::{BufMut, Bytes};
use prost::Message;

use crate::error::{Error, MalformedFrame, ProtocolError, UsageError};
use crate::proto::{
    ClientBoundMessage, ServiceBoundMessage, client_bound_message, service_bound_message,
};

/// Implements the framing methods for one envelope type.
macro_rules! framing {
    ($envelope:ident, $name:literal) => {
        impl $envelope {
            #[doc = concat!(
                "Decodes one binary frame into a `", $name, "`.\n\n",
                "`bytes` fields of the result share the frame's memory; nothing is copied.\n\n",
                "# Errors\n\n",
                "[`Error::Malformed`] when the bytes are not a valid `", $name, "`, and ",
                "[`Error::Protocol`] ([`ProtocolError::MissingPayload`]) when they are valid but ",
                "carry no payload, as an empty frame does. Unknown fields and enum values are ",
                "not errors (forward compatibility); see [`Open`](crate::Open). Field values are ",
                "not checked: call [`validate`](Self::validate) or parse the configuration."
            )]
            pub fn decode_frame(frame: impl Into<Bytes>) -> Result<Self, Error> {
                let message = <Self as Message>::decode(frame.into())
                    .map_err(|e| MalformedFrame::new($name, e))?;
                if message.payload.is_none() {
                    return Err(ProtocolError::MissingPayload { message: $name }.into());
                }
                Ok(message)
            }

            /// Appends the encoded message to `buf`.
            ///
            /// # Errors
            ///
            /// [`UsageError::BufferTooSmall`] when `buf` cannot grow to hold the message (a
            /// fixed-size buffer; `BytesMut` and `Vec` always grow). Nothing is written then.
            pub fn encode_frame(&self, buf: &mut impl BufMut) -> Result<(), UsageError> {
                let remaining = buf.remaining_mut();
                self.encode(buf).map_err(|e| UsageError::BufferTooSmall {
                    required: e.required_capacity(),
                    remaining,
                })
            }

            /// Encodes the message into a new frame.
            #[must_use]
            pub fn to_frame(&self) -> Bytes {
                // Sized exactly, so converting to `Bytes` neither copies nor reallocates.
                Bytes::from(self.encode_to_vec())
            }
        }
    };
}

framing!(ServiceBoundMessage, "ServiceBoundMessage");
framing!(ClientBoundMessage, "ClientBoundMessage");

/// Defines a fieldless mirror of a payload oneof, for logging, metrics and dispatch tables.
macro_rules! kinds {
    (
        $(#[$meta:meta])*
        $kind:ident for $envelope:ident ($payload:path) {
            $($variant:ident => $str:literal,)+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[non_exhaustive]
        pub enum $kind {
            $(
                #[doc = concat!("`", $str, "`")]
                $variant,
            )+
        }

        impl $kind {
            /// The oneof field name, as in `realtime.proto`.
            #[must_use]
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $str,)+
                }
            }
        }

        impl std::fmt::Display for $kind {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl $envelope {
            /// Which payload the message carries, or `None` when it carries none.
            #[must_use]
            pub fn kind(&self) -> Option<$kind> {
                use $payload as P;
                Some(match self.payload.as_ref()? {
                    $(P::$variant(_) => $kind::$variant,)+
                })
            }
        }
    };
}

kinds! {
    /// The payload kinds of a [`ServiceBoundMessage`].
    ServiceBoundKind for ServiceBoundMessage (service_bound_message::Payload) {
        InitializeSessionRequest => "initialize_session_request",
        ReconfigureSessionRequest => "reconfigure_session_request",
        UserInput => "user_input",
        UpdateToolDefinitionsRequest => "update_tool_definitions_request",
        ToolCallResponse => "tool_call_response",
        TriggerInference => "trigger_inference",
        ExportChatHistoryRequest => "export_chat_history_request",
        PlaybackPositionReport => "playback_position_report",
        DirectSpeech => "direct_speech",
        ConversationQuery => "conversation_query",
        Ping => "ping",
    }
}

kinds! {
    /// The payload kinds of a [`ClientBoundMessage`].
    ClientBoundKind for ClientBoundMessage (client_bound_message::Payload) {
        ToolCallRequest => "tool_call_request",
        ModelTextFragment => "model_text_fragment",
        ModelAudioChunk => "model_audio_chunk",
        PlaybackClearBuffer => "playback_clear_buffer",
        ResponseBegin => "response_begin",
        ResponseEnd => "response_end",
        ChatHistory => "chat_history",
        Error => "error",
        UserTranscriptionResult => "user_transcription_result",
        ConversationQueryResult => "conversation_query_result",
        SessionReady => "session_ready",
        VadAnalysisFrame => "vad_analysis_frame",
        VadStateEvent => "vad_state_event",
        ContextTruncated => "context_truncated",
        Pong => "pong",
        ModelSpeechProgress => "model_speech_progress",
        TurnSnapshot => "turn_snapshot",
        InferenceComplete => "inference_complete",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::SessionErrorCategory;

    #[test]
    fn empty_frame_is_a_protocol_error() {
        let err = ServiceBoundMessage::decode_frame(Bytes::new()).unwrap_err();
        assert_eq!(
            err,
            Error::Protocol(ProtocolError::MissingPayload {
                message: "ServiceBoundMessage"
            })
        );
        assert_eq!(err.category(), SessionErrorCategory::ErrorProtocol);
        let err = ClientBoundMessage::decode_frame(Bytes::new()).unwrap_err();
        assert_eq!(err.category(), SessionErrorCategory::ErrorProtocol);
    }

    #[test]
    fn unknown_fields_only_is_missing_payload() {
        // Field 99, varint 1: a newer peer's field; skipped, leaving no payload.
        let err =
            ServiceBoundMessage::decode_frame(Bytes::from_static(&[0x98, 0x06, 0x01])).unwrap_err();
        assert!(matches!(
            err,
            Error::Protocol(ProtocolError::MissingPayload { .. })
        ));
    }

    #[test]
    fn malformed_bytes_are_typed() {
        for bad in [
            &[0xff][..],               // truncated varint key
            &[0x1a, 0x05, 0x00],       // length beyond the end
            &[0x0b],                   // deprecated group start
            &[0x1a, 0x02, 0x1a, 0x7f], // nested length beyond the end
            &[0x08; 11],               // wrong wire type for a message field
        ] {
            let err = ServiceBoundMessage::decode_frame(Bytes::copy_from_slice(bad)).unwrap_err();
            let Error::Malformed(m) = &err else {
                panic!("{bad:?} gave {err:?}");
            };
            assert_eq!(m.message(), "ServiceBoundMessage");
            assert_eq!(err.category(), SessionErrorCategory::ErrorProtocol);
            assert!(err.to_string().starts_with("malformed ServiceBoundMessage"));
        }
    }

    #[test]
    fn encode_reports_a_full_buffer() {
        let msg =
            ServiceBoundMessage::user_text(1, crate::proto::InferenceTriggerMode::Queue, "hi");
        let mut storage = [0u8; 4];
        let mut buf = &mut storage[..];
        let err = msg.encode_frame(&mut buf).unwrap_err();
        assert_eq!(
            err,
            UsageError::BufferTooSmall {
                required: msg.to_frame().len(),
                remaining: 4
            }
        );
        let mut vec = Vec::new();
        msg.encode_frame(&mut vec).unwrap();
        assert_eq!(vec, msg.to_frame());
    }

    #[test]
    fn kinds_name_the_oneof_fields() {
        assert_eq!(
            ServiceBoundMessage::ping().kind(),
            Some(ServiceBoundKind::Ping)
        );
        assert_eq!(ServiceBoundMessage::default().kind(), None);
        assert_eq!(ServiceBoundKind::UserInput.to_string(), "user_input");
        assert_eq!(
            ClientBoundMessage::session_ready()
                .kind()
                .map(ClientBoundKind::as_str),
            Some("session_ready")
        );
    }
}
