//! What the machines accept from the transport, and how a peer can be at fault.

use serde_json::Value;

use crate::jsonrpc::{self, DecodeError, Id, InvalidMessage, Message, Payload};

/// Something from the transport, for `handle_input`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Input<'a> {
    /// One frame or line of JSON text (trimmed, repaired if needed).
    Bytes(&'a [u8]),
    /// An already-parsed JSON value (e.g. a Xiaozhi envelope's `payload`).
    Value(Value),
    /// An already-decoded message.
    Message(Message),
    /// The transport closed: everything in flight fails.
    Closed,
}

impl<'a> From<&'a [u8]> for Input<'a> {
    fn from(b: &'a [u8]) -> Self {
        Input::Bytes(b)
    }
}

impl From<Value> for Input<'_> {
    fn from(v: Value) -> Self {
        Input::Value(v)
    }
}

impl From<Message> for Input<'_> {
    fn from(m: Message) -> Self {
        Input::Message(m)
    }
}

/// The peer broke the protocol. The machine reports it and keeps going: nothing a peer sends
/// ends the session by itself.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PeerFault {
    /// Bytes that are not a JSON-RPC message.
    #[error("malformed message: {0}")]
    Malformed(#[from] DecodeError),
    /// A reply to a request we never sent, or whose deadline already passed.
    #[error("reply to unknown request {0}")]
    UnknownResponse(Id),
    /// A reply whose result does not have the shape its method needs.
    #[error("bad {method} result: {detail}")]
    BadResult {
        /// The request's method.
        method: &'static str,
        /// Why it does not fit.
        detail: String,
    },
    /// `tools/list` paging handed back a cursor it gave before, or never ended.
    #[error("tools/list paging does not terminate (cursor {0:?})")]
    PagingLoop(String),
    /// A request that needs `initialize` first.
    #[error("{0} before initialize")]
    NotInitialized(String),
}

/// Turns an input into messages (or per-element decode failures). `None` for `Closed`.
pub(crate) fn messages(
    input: Input<'_>,
) -> Option<Result<Vec<Result<Message, InvalidMessage>>, DecodeError>> {
    let payload = match input {
        Input::Bytes(b) => jsonrpc::decode(b).map(|d| d.payload),
        Input::Value(v) => jsonrpc::decode_value(v),
        Input::Message(m) => Ok(Payload::Single(m)),
        Input::Closed => return None,
    };
    Some(payload.map(|p| match p {
        Payload::Single(m) => vec![Ok(m)],
        Payload::Batch(items) => items,
    }))
}
