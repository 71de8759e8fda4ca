//! Errors, typed by who is to blame.
//!
//! Every failure in this crate is one of four kinds, and the kind decides what a server or client
//! does next:
//!
//! | Kind | Blame | Typical reaction | Category |
//! |---|---|---|---|
//! | [`MalformedFrame`] | the peer sent bytes that are not a message | report and close | `ERROR_PROTOCOL` |
//! | [`ProtocolError`] | the peer sent a well-formed message that breaks the protocol | report and close | `ERROR_PROTOCOL` / `ERROR_SESSION` |
//! | [`ConfigError`] | the peer asked for a configuration we refuse | report and close | `ERROR_CONFIGURATION` |
//! | [`UsageError`] | the code calling this crate made a mistake | fix the caller | `ERROR_INTERNAL` |
//!
//! [`Error`] wraps all four, and [`Error::to_client_message`] turns any of them into the
//! `SessionErrorNotification` the protocol expects before a server closes the connection.

use std::borrow::Cow;
use std::fmt;

use crate::proto::{ClientBoundMessage, SessionErrorCategory, SessionErrorNotification};

/// Any error of this crate.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The peer sent bytes that do not decode as the expected message.
    #[error(transparent)]
    Malformed(#[from] MalformedFrame),
    /// The peer sent a well-formed message that breaks the protocol.
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    /// The peer asked for a configuration that is invalid or unsupported.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The caller of this crate misused it; nothing the peer did.
    #[error(transparent)]
    Usage(#[from] UsageError),
}

impl Error {
    /// The protocol's category for this error, as sent in `SessionErrorNotification.category`.
    #[must_use]
    pub fn category(&self) -> SessionErrorCategory {
        match self {
            Self::Malformed(e) => e.category(),
            Self::Protocol(e) => e.category(),
            Self::Config(e) => e.category(),
            Self::Usage(e) => e.category(),
        }
    }

    /// Whether the peer (rather than the local caller) is to blame.
    #[must_use]
    pub fn is_peer_fault(&self) -> bool {
        !matches!(self, Self::Usage(_))
    }

    /// The notification that reports this error to the peer.
    ///
    /// The message is this error's `Display` text. For [`UsageError`]s it is a generic text
    /// instead, because a local bug's details are of no use to the peer and may leak internals.
    #[must_use]
    pub fn to_notification(&self) -> SessionErrorNotification {
        let message = match self {
            Self::Usage(_) => "internal error".to_owned(),
            other => other.to_string(),
        };
        SessionErrorNotification {
            category: self.category().into(),
            message,
            trace_id: None,
        }
    }

    /// [`to_notification`](Self::to_notification) wrapped in a [`ClientBoundMessage`], ready to
    /// send before closing.
    #[must_use]
    pub fn to_client_message(&self) -> ClientBoundMessage {
        ClientBoundMessage::from(self.to_notification())
    }
}

/// Bytes that could not be decoded as the expected protobuf message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed {message}: {cause}")]
pub struct MalformedFrame {
    message: &'static str,
    cause: prost::DecodeError,
}

impl MalformedFrame {
    pub(crate) fn new(message: &'static str, cause: prost::DecodeError) -> Self {
        Self { message, cause }
    }

    /// The name of the message type that was expected.
    #[must_use]
    pub fn message(&self) -> &'static str {
        self.message
    }

    /// prost's description of what was wrong with the bytes.
    #[must_use]
    pub fn decode_error(&self) -> &prost::DecodeError {
        &self.cause
    }

    /// Always `ERROR_PROTOCOL`: malformed packets are protocol errors.
    #[must_use]
    pub fn category(&self) -> SessionErrorCategory {
        SessionErrorCategory::ErrorProtocol
    }
}

/// A well-formed message that the peer should not have sent.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// The envelope's `payload` oneof is not set (an empty frame decodes to this).
    #[error("{message} has no payload")]
    MissingPayload {
        /// `ServiceBoundMessage` or `ClientBoundMessage`.
        message: &'static str,
    },
    /// A field the protocol requires is absent.
    #[error("{field} is missing")]
    MissingField {
        /// Dotted path of the field, such as `user_input.input`.
        field: Cow<'static, str>,
    },
    /// A string the protocol requires to be non-empty is empty.
    #[error("{field} is empty")]
    EmptyField {
        /// Dotted path of the field, such as `tool_call_response.id`.
        field: Cow<'static, str>,
    },
    /// A `ConversationQuery` with neither `prompt` nor `instructions`.
    #[error("conversation_query needs a prompt or instructions")]
    EmptyConversationQuery,
    /// Two tool definitions share a name.
    #[error("tool {name:?} is defined twice")]
    DuplicateTool {
        /// The repeated name.
        name: String,
    },
    /// A `google.protobuf.Struct` that has no JSON equivalent.
    #[error("{field}: {error}")]
    InvalidStruct {
        /// Dotted path of the Struct field.
        field: Cow<'static, str>,
        /// What is wrong with it.
        error: StructError,
    },
    /// A `google.protobuf.Timestamp` outside the range the protocol allows.
    #[error("{field}: invalid timestamp ({seconds} s, {nanos} ns)")]
    InvalidTimestamp {
        /// Dotted path of the timestamp field.
        field: Cow<'static, str>,
        /// The `seconds` part.
        seconds: i64,
        /// The `nanos` part.
        nanos: i32,
    },
    /// A `Duration` whose `nanos` is 1,000,000,000 or more.
    #[error("{field}: nanos must be below 1000000000, got {nanos}")]
    InvalidDuration {
        /// Dotted path of the duration field.
        field: Cow<'static, str>,
        /// The `nanos` part.
        nanos: u32,
    },
    /// A string or list larger than its documented maximum (see [`limits`](crate::limits)).
    #[error("{field}: {len} {unit} is more than the maximum of {max} {unit}")]
    TooLarge {
        /// Dotted path of the field, such as `user_input.text_data.data`.
        field: Cow<'static, str>,
        /// Its size.
        len: usize,
        /// The maximum.
        max: usize,
        /// What `len` and `max` count, such as `bytes` or `tools`.
        unit: &'static str,
    },
    /// A message other than `InitializeSessionRequest` arrived before the session was
    /// initialized. For servers that track session state.
    #[error("{message} sent before initialize_session_request")]
    NotInitialized {
        /// The payload that arrived too early, as named by `ServiceBoundKind::as_str`.
        message: &'static str,
    },
    /// A second `InitializeSessionRequest`. For servers that track session state.
    #[error("the session is already initialized")]
    AlreadyInitialized,
}

impl ProtocolError {
    /// `ERROR_SESSION` for lifecycle violations, `ERROR_PROTOCOL` for everything else.
    #[must_use]
    pub fn category(&self) -> SessionErrorCategory {
        match self {
            Self::NotInitialized { .. } | Self::AlreadyInitialized => {
                SessionErrorCategory::ErrorSession
            }
            _ => SessionErrorCategory::ErrorProtocol,
        }
    }
}

/// A configuration value the peer sent that is invalid or unsupported.
///
/// The [`field`](Self::field) is a dotted path from the message being parsed, such as
/// `input_audio_line.sample_rate`, so the peer can tell exactly what to fix.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct ConfigError {
    field: Cow<'static, str>,
    problem: ConfigProblem,
}

impl ConfigError {
    pub(crate) fn new(field: impl Into<Cow<'static, str>>, problem: ConfigProblem) -> Self {
        Self {
            field: field.into(),
            problem,
        }
    }

    /// Prefixes the field path with the enclosing field, as errors bubble out of nested
    /// messages.
    #[must_use]
    pub(crate) fn within(mut self, parent: &str) -> Self {
        self.field = Cow::Owned(format!("{parent}.{}", self.field));
        self
    }

    /// Dotted path of the offending field.
    #[must_use]
    pub fn field(&self) -> &str {
        &self.field
    }

    /// What is wrong with it.
    #[must_use]
    pub fn problem(&self) -> &ConfigProblem {
        &self.problem
    }

    /// Always `ERROR_CONFIGURATION`.
    #[must_use]
    pub fn category(&self) -> SessionErrorCategory {
        SessionErrorCategory::ErrorConfiguration
    }
}

/// What is wrong with a configuration field; see [`ConfigError`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ConfigProblem {
    /// A required field is absent.
    Missing,
    /// A required string is empty.
    Empty,
    /// A number outside the accepted range.
    OutOfRange {
        /// The value received, rendered for the message.
        value: String,
        /// The accepted range, rendered for the message.
        accepted: &'static str,
    },
    /// A float that is NaN or infinite.
    NotFinite,
    /// An enum value this implementation does not know.
    UnknownEnumValue(i32),
    /// A `Duration` whose `nanos` is 1,000,000,000 or more.
    NanosOutOfRange(u32),
    /// A `google.protobuf.Value` with no JSON equivalent.
    Json(StructError),
    /// A string or list larger than its documented maximum (see [`limits`](crate::limits)).
    TooLarge {
        /// Its size.
        len: usize,
        /// The maximum.
        max: usize,
        /// What `len` and `max` count, such as `bytes` or `entries`.
        unit: &'static str,
    },
    /// The audio does not fit its declared format.
    AudioLength {
        /// Length of the audio in bytes.
        len: usize,
        /// The format's bytes per frame, which `len` must be a non-zero multiple of.
        frame: usize,
    },
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing => f.write_str("missing"),
            Self::Empty => f.write_str("must not be empty"),
            Self::OutOfRange { value, accepted } => {
                write!(f, "{value} is outside the accepted range {accepted}")
            }
            Self::NotFinite => f.write_str("must be a finite number"),
            Self::UnknownEnumValue(v) => write!(f, "unknown enum value {v}"),
            Self::NanosOutOfRange(n) => {
                write!(f, "nanos must be below 1000000000, got {n}")
            }
            Self::Json(e) => write!(f, "{e}"),
            Self::TooLarge { len, max, unit } => {
                write!(f, "{len} {unit} is more than the maximum of {max} {unit}")
            }
            Self::AudioLength { len, frame } => write!(
                f,
                "{len} bytes of audio is not a non-zero multiple of the {frame}-byte frame"
            ),
        }
    }
}

/// The code using this crate made a mistake; nothing a peer sent can cause these.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum UsageError {
    /// The buffer passed to an encode function has too little space left.
    #[error("buffer too small: {required} bytes required, {remaining} remaining")]
    BufferTooSmall {
        /// Bytes the message needs.
        required: usize,
        /// Bytes the buffer had left.
        remaining: usize,
    },
    /// JSON that cannot become a `google.protobuf.Struct` or `Value`.
    #[error("{0}")]
    Json(StructError),
    /// A conversation query needs a prompt, instructions, or both.
    #[error("a conversation query needs a prompt or instructions")]
    EmptyConversationQuery,
}

impl UsageError {
    /// Always `ERROR_INTERNAL`: the fault is on this side of the connection.
    #[must_use]
    pub fn category(&self) -> SessionErrorCategory {
        SessionErrorCategory::ErrorInternal
    }
}

/// Why a `google.protobuf.Struct`/`Value` and JSON could not be converted.
///
/// The `pointer` is an RFC 6901 JSON pointer to the offending value (empty for the root).
/// Whose fault it is depends on the direction, so it is wrapped in [`ProtocolError`],
/// [`ConfigError`] or [`UsageError`] by the function that knows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StructError {
    /// JSON has no NaN or infinity (protobuf's own JSON mapping refuses them too).
    #[error("non-finite number at {pointer:?}")]
    NonFiniteNumber {
        /// Where the number is.
        pointer: String,
    },
    /// A `Value` with no kind set, which has no JSON equivalent.
    #[error("value without a kind at {pointer:?}")]
    MissingKind {
        /// Where the value is.
        pointer: String,
    },
    /// Nesting deeper than [`MAX_DEPTH`](crate::json::MAX_DEPTH).
    #[error("nested deeper than {limit} levels at {pointer:?}")]
    TooDeep {
        /// Where the limit was hit.
        pointer: String,
        /// The limit.
        limit: usize,
    },
    /// A `Struct` must be a JSON object.
    #[error("expected a JSON object, found {found}")]
    NotAnObject {
        /// The JSON type found instead.
        found: &'static str,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::client_bound_message::Payload;

    #[test]
    fn each_blame_maps_to_its_category() {
        let cause =
            <crate::ServiceBoundMessage as prost::Message>::decode(&[0xff][..]).unwrap_err();
        let malformed: Error = MalformedFrame::new("ServiceBoundMessage", cause).into();
        let config: Error = ConfigError::new(
            "input_audio_line.sample_rate",
            ConfigProblem::OutOfRange {
                value: "0".into(),
                accepted: "8000..=192000",
            },
        )
        .into();
        let cases = [
            (malformed, SessionErrorCategory::ErrorProtocol, true),
            (
                ProtocolError::EmptyConversationQuery.into(),
                SessionErrorCategory::ErrorProtocol,
                true,
            ),
            (
                ProtocolError::AlreadyInitialized.into(),
                SessionErrorCategory::ErrorSession,
                true,
            ),
            (
                ProtocolError::NotInitialized {
                    message: "user_input",
                }
                .into(),
                SessionErrorCategory::ErrorSession,
                true,
            ),
            (config, SessionErrorCategory::ErrorConfiguration, true),
            (
                UsageError::EmptyConversationQuery.into(),
                SessionErrorCategory::ErrorInternal,
                false,
            ),
        ];
        for (error, category, peer) in cases {
            assert_eq!(error.category(), category, "{error}");
            assert_eq!(error.is_peer_fault(), peer, "{error}");
            let n = error.to_notification();
            assert_eq!(n.category_open(), crate::Open::Known(category));
            assert_eq!(n.trace_id, None);
        }
    }

    #[test]
    fn notifications_carry_the_message() {
        let err = Error::from(ConfigError::new(
            "vad_configuration.min_volume",
            ConfigProblem::NotFinite,
        ));
        let msg = err.to_client_message();
        let Some(Payload::Error(n)) = msg.payload else {
            panic!("{msg:?}");
        };
        assert_eq!(
            n.message,
            "vad_configuration.min_volume: must be a finite number"
        );
        assert_eq!(n.category, SessionErrorCategory::ErrorConfiguration as i32);
        // A local bug's details stay local.
        let err = Error::from(UsageError::BufferTooSmall {
            required: 10,
            remaining: 2,
        });
        assert_eq!(err.to_notification().message, "internal error");
        assert_eq!(
            err.to_string(),
            "buffer too small: 10 bytes required, 2 remaining"
        );
    }

    #[test]
    fn config_paths_nest() {
        let err = ConfigError::new("sample_rate", ConfigProblem::Missing)
            .within("input_audio_line")
            .within("reconfigure_session_request");
        assert_eq!(
            err.field(),
            "reconfigure_session_request.input_audio_line.sample_rate"
        );
        assert_eq!(
            err.to_string(),
            "reconfigure_session_request.input_audio_line.sample_rate: missing"
        );
    }
}
