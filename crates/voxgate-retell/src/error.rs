//! Errors, typed by who is to blame.

use std::fmt;

/// Who caused an error: decides whether a door answers the peer, logs, or fixes its own code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Blame {
    /// The bytes were not a JSON object at all.
    MalformedInput,
    /// Well-formed JSON that breaks the protocol (wrong field types, missing ids, bad order).
    Peer,
    /// The local program used the API wrongly (e.g. streamed a response nobody asked for).
    Caller,
}

impl fmt::Display for Blame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Blame::MalformedInput => "malformed input",
            Blame::Peer => "peer broke the protocol",
            Blame::Caller => "caller bug",
        })
    }
}

/// A text frame could not be decoded into an event.
///
/// Unknown event types are *not* errors (they decode to an `Unknown` variant); this is only for
/// frames that are not JSON objects or whose known event has fields of the wrong type.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The frame is not valid JSON.
    #[error("frame is not valid JSON: {0}")]
    Syntax(#[source] serde_json::Error),
    /// The frame is JSON but not an object.
    #[error("frame is not a JSON object")]
    NotAnObject,
    /// The object has no (or a null) tag field, so its event type is unknowable.
    #[error("event has no `{0}` field")]
    MissingTag(&'static str),
    /// A known event whose fields do not match the protocol (wrong types, missing id).
    #[error("invalid `{event}` event: {source}")]
    Schema {
        /// The event type, as on the wire.
        event: &'static str,
        /// What serde found wrong.
        #[source]
        source: serde_json::Error,
    },
}

impl DecodeError {
    /// Who is to blame for this error.
    pub fn blame(&self) -> Blame {
        match self {
            DecodeError::Syntax(_) | DecodeError::NotAnObject => Blame::MalformedInput,
            DecodeError::MissingTag(_) | DecodeError::Schema { .. } => Blame::Peer,
        }
    }
}

/// An event could not be encoded as JSON.
///
/// The event types in this crate always encode; this exists so encoding never needs a panic.
#[derive(Debug, thiserror::Error)]
#[error("event could not be encoded as JSON: {0}")]
pub struct EncodeError(#[from] serde_json::Error);

impl EncodeError {
    /// Who is to blame for this error (always the caller).
    pub fn blame(&self) -> Blame {
        Blame::Caller
    }
}
