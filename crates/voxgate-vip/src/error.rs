//! The standard error payload (VIP §5.5.2), its codes, and why a message did not decode.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Machine-readable reason in an [`ErrorPayload`].
///
/// The first six are VIP §5.5.2's action codes (`action.result`, `action.cancelled`); the next
/// four are the door's own, for the `error` reply to a message it refused. Any other string is
/// kept as sent in [`ErrorCode::Other`], so a newer peer's codes survive.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// The parameters do not match the action's schema (violations in `details`).
    InvalidParameters,
    /// The action is not (or no longer) in the client's registry.
    UnknownAction,
    /// The action ran and failed.
    ExecutionFailed,
    /// No result before the deadline.
    Timeout,
    /// The invocation was withdrawn (the reply that asked for it was cut off).
    Cancelled,
    /// The service or element needed is not available right now.
    Unavailable,
    /// Door: the message's `type` is not one this server knows; it was ignored.
    UnknownType,
    /// Door: the message is over [`MAX_MESSAGE_BYTES`](crate::MAX_MESSAGE_BYTES).
    TooLarge,
    /// Door: the message is not a JSON object with a string `type`.
    Malformed,
    /// Door: a known `type` with a missing, mistyped or oversized field (the field in
    /// `details`).
    InvalidMessage,
    /// Any other code, kept as sent.
    Other(String),
}

impl ErrorCode {
    /// The wire string (`snake_case`).
    pub fn as_str(&self) -> &str {
        match self {
            ErrorCode::InvalidParameters => "invalid_parameters",
            ErrorCode::UnknownAction => "unknown_action",
            ErrorCode::ExecutionFailed => "execution_failed",
            ErrorCode::Timeout => "timeout",
            ErrorCode::Cancelled => "cancelled",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::UnknownType => "unknown_type",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::Malformed => "malformed",
            ErrorCode::InvalidMessage => "invalid_message",
            ErrorCode::Other(s) => s,
        }
    }

    /// Reads a wire string; unknown strings become [`ErrorCode::Other`].
    pub fn parse(s: &str) -> Self {
        match s {
            "invalid_parameters" => ErrorCode::InvalidParameters,
            "unknown_action" => ErrorCode::UnknownAction,
            "execution_failed" => ErrorCode::ExecutionFailed,
            "timeout" => ErrorCode::Timeout,
            "cancelled" => ErrorCode::Cancelled,
            "unavailable" => ErrorCode::Unavailable,
            "unknown_type" => ErrorCode::UnknownType,
            "too_large" => ErrorCode::TooLarge,
            "malformed" => ErrorCode::Malformed,
            "invalid_message" => ErrorCode::InvalidMessage,
            other => ErrorCode::Other(other.to_owned()),
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ErrorCode {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ErrorCode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        Ok(ErrorCode::parse(&s))
    }
}

/// One schema violation (or one refused field) in an [`ErrorPayload`]'s `details`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// JSON Pointer to the offending value (`""` for the whole value).
    pub path: String,
    /// What is wrong, in words.
    pub message: String,
}

impl Violation {
    /// A violation at `path`.
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Violation {
            path: path.into(),
            message: message.into(),
        }
    }
}

/// The standard error payload of VIP §5.5.2: `{"code", "message", "details"?}`.
///
/// Used by `action.result` (the client's failure), `action.cancelled`, and flattened into the
/// server's `error` message. `details` is omitted on the wire when empty.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ErrorPayload {
    /// Machine-readable reason.
    pub code: ErrorCode,
    /// Human-readable reason.
    pub message: String,
    /// Schema violations or refused fields, when that is the reason.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<Violation>,
}

impl ErrorPayload {
    /// A payload without details.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ErrorPayload {
            code,
            message: message.into(),
            details: Vec::new(),
        }
    }

    /// The same payload with `details`.
    #[must_use]
    pub fn with_details(mut self, details: Vec<Violation>) -> Self {
        self.details = details;
        self
    }

    /// The door's answer to a message whose `type` it does not know (the message is ignored).
    /// The name is quoted as the decoder kept it (at most
    /// [`MAX_TYPE_NAME_BYTES`](crate::MAX_TYPE_NAME_BYTES)).
    pub fn unknown_type(type_name: &str) -> Self {
        ErrorPayload::new(
            ErrorCode::UnknownType,
            format!("unknown message type `{type_name}`; it was ignored"),
        )
    }
}

/// Why a message was not decoded. Every variant maps to the `error` reply the door sends
/// ([`DecodeError::payload`]); the session goes on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The message is over the size limit; it was not parsed.
    #[error("message is {len} bytes, more than the maximum of {max}")]
    TooLarge {
        /// Its size in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A binary message that is not UTF-8.
    #[error("message is not UTF-8 text")]
    NotUtf8,
    /// Not JSON at all.
    #[error("message is not JSON: {0}")]
    NotJson(String),
    /// JSON, but not an object with a string `type`.
    #[error("message is not a JSON object with a string `type`")]
    NoType,
    /// A known `type` with a field that is missing, of the wrong type, or over its bound.
    #[error("invalid `{type_name}`: {}: {}", display_path(path), message)]
    Invalid {
        /// The message's `type`.
        type_name: String,
        /// JSON Pointer to the refused field (`""` for the whole message).
        path: String,
        /// What is wrong with it.
        message: String,
        /// For an `action.result`, its `invocation_id` when that much was readable: the door
        /// can end that invocation as failed at once instead of waiting for its timeout.
        invocation_id: Option<String>,
    },
}

fn display_path(path: &str) -> &str {
    if path.is_empty() { "(message)" } else { path }
}

impl DecodeError {
    /// The [`ErrorPayload`] of the `error` reply: `too_large`, `malformed` (not UTF-8, not
    /// JSON, no `type`) or `invalid_message` (the refused field in `details`).
    pub fn payload(&self) -> ErrorPayload {
        let message = self.to_string();
        match self {
            DecodeError::TooLarge { .. } => ErrorPayload::new(ErrorCode::TooLarge, message),
            DecodeError::NotUtf8 | DecodeError::NotJson(_) | DecodeError::NoType => {
                ErrorPayload::new(ErrorCode::Malformed, message)
            }
            DecodeError::Invalid {
                path, message: m, ..
            } => ErrorPayload::new(ErrorCode::InvalidMessage, message)
                .with_details(vec![Violation::new(path.clone(), m.clone())]),
        }
    }

    /// The `invocation_id` of a refused `action.result`, when it was readable.
    pub fn invocation_id(&self) -> Option<&str> {
        match self {
            DecodeError::Invalid { invocation_id, .. } => invocation_id.as_deref(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_unknown_ones_are_kept() {
        for code in [
            ErrorCode::InvalidParameters,
            ErrorCode::UnknownAction,
            ErrorCode::ExecutionFailed,
            ErrorCode::Timeout,
            ErrorCode::Cancelled,
            ErrorCode::Unavailable,
            ErrorCode::UnknownType,
            ErrorCode::TooLarge,
            ErrorCode::Malformed,
            ErrorCode::InvalidMessage,
            ErrorCode::Other("permission_denied".into()),
        ] {
            assert_eq!(ErrorCode::parse(code.as_str()), code);
        }
    }

    #[test]
    fn payload_omits_empty_details() {
        let p = ErrorPayload::new(ErrorCode::Timeout, "too slow");
        assert_eq!(
            serde_json::to_string(&p).unwrap(),
            r#"{"code":"timeout","message":"too slow"}"#
        );
    }

    #[test]
    fn decode_errors_map_to_door_codes() {
        let big = DecodeError::TooLarge {
            len: 70_000,
            max: 65_536,
        };
        assert_eq!(big.payload().code, ErrorCode::TooLarge);
        assert_eq!(DecodeError::NoType.payload().code, ErrorCode::Malformed);
        let invalid = DecodeError::Invalid {
            type_name: "input.text".into(),
            path: "/text".into(),
            message: "required".into(),
            invocation_id: None,
        };
        let p = invalid.payload();
        assert_eq!(p.code, ErrorCode::InvalidMessage);
        assert_eq!(p.message, "invalid `input.text`: /text: required");
        assert_eq!(p.details, vec![Violation::new("/text", "required")]);
    }
}
