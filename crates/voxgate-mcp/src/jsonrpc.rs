//! JSON-RPC 2.0 messages, decoded tolerantly and encoded strictly.
//!
//! Peers in the voice world bend the spec: the Xiaozhi firmware omits `code` in error objects and
//! builds JSON by string concatenation (so escaping can be broken), bridges forward whitespace and
//! non-JSON lines. [`decode`] accepts all of that; what we send is always compact, valid
//! JSON-RPC 2.0 with `"jsonrpc":"2.0"`.

use std::fmt;

use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::repair::repair_json;

/// A request id. MCP forbids `null` in requests, but JSON-RPC error replies to unparseable
/// requests carry `"id": null`, so it is representable.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Id {
    /// A numeric id: the only kind the Xiaozhi firmware answers.
    Number(i64),
    /// A string id.
    String(String),
    /// `null`: only in replies to messages whose id could not be read.
    Null,
}

impl Id {
    /// The numeric value, also for a string id that holds a decimal number (some relays turn
    /// numeric ids into strings; matching them keeps replies from being lost).
    pub fn as_number(&self) -> Option<i64> {
        match self {
            Id::Number(n) => Some(*n),
            Id::String(s) => s.parse().ok(),
            Id::Null => None,
        }
    }

    fn from_value(v: Value) -> Option<Id> {
        match v {
            Value::Null => Some(Id::Null),
            Value::String(s) => Some(Id::String(s)),
            Value::Number(n) => n.as_i64().map(Id::Number),
            _ => None,
        }
    }
}

impl From<i64> for Id {
    fn from(n: i64) -> Self {
        Id::Number(n)
    }
}

impl From<&str> for Id {
    fn from(s: &str) -> Self {
        Id::String(s.to_owned())
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Id::Number(n) => write!(f, "{n}"),
            Id::String(s) => write!(f, "{s:?}"),
            Id::Null => f.write_str("null"),
        }
    }
}

impl Serialize for Id {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Id::Number(n) => s.serialize_i64(*n),
            Id::String(v) => s.serialize_str(v),
            Id::Null => s.serialize_unit(),
        }
    }
}

/// A JSON-RPC error object. `code` is optional because the Xiaozhi firmware never sends it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorObject {
    /// The error code; `None` when the peer left it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<i64>,
    /// Human-readable message (empty when the peer sent none).
    #[serde(default)]
    pub message: String,
    /// Optional structured detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl ErrorObject {
    /// Invalid JSON was received.
    pub const PARSE_ERROR: i64 = -32700;
    /// The JSON sent is not a valid request object.
    pub const INVALID_REQUEST: i64 = -32600;
    /// The method does not exist or is not available.
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// Invalid method parameters.
    pub const INVALID_PARAMS: i64 = -32602;
    /// Internal JSON-RPC error.
    pub const INTERNAL_ERROR: i64 = -32603;

    /// An error with a code and message and no data.
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        ErrorObject {
            code: Some(code),
            message: message.into(),
            data: None,
        }
    }

    fn from_value(v: Value) -> ErrorObject {
        match v {
            Value::Object(mut m) => {
                let code = m.remove("code").and_then(|c| match c {
                    Value::Number(n) => n.as_i64(),
                    // Some peers quote the code; keep it rather than dropping the error.
                    Value::String(s) => s.trim().parse().ok(),
                    _ => None,
                });
                let message = match m.remove("message") {
                    Some(Value::String(s)) => s,
                    Some(Value::Null) | None => String::new(),
                    Some(other) => other.to_string(),
                };
                ErrorObject {
                    code,
                    message,
                    data: m.remove("data"),
                }
            }
            // A bare string as the error is seen from hand-written servers.
            Value::String(message) => ErrorObject {
                code: None,
                message,
                data: None,
            },
            other => ErrorObject {
                code: None,
                message: other.to_string(),
                data: None,
            },
        }
    }
}

impl fmt::Display for ErrorObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.code {
            Some(code) => write!(f, "{} (code {code})", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// A call that expects a reply.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Correlates the reply.
    pub id: Id,
    /// The method name, e.g. `tools/call`.
    pub method: String,
    /// The parameters, if any.
    pub params: Option<Value>,
}

/// A one-way message.
#[derive(Debug, Clone, PartialEq)]
pub struct Notification {
    /// The method name, e.g. `notifications/initialized`.
    pub method: String,
    /// The parameters, if any.
    pub params: Option<Value>,
}

/// A reply to a [`Request`].
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    /// The id of the request answered.
    pub id: Id,
    /// `Ok(result)` or `Err(error)`.
    pub outcome: Result<Value, ErrorObject>,
}

/// One JSON-RPC message.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Message {
    /// A request.
    Request(Request),
    /// A notification.
    Notification(Notification),
    /// A response (success or error).
    Response(Response),
}

/// A JSON value that is JSON but not a JSON-RPC message; `id` is kept when it could be read so
/// a server can still answer with an `Invalid Request` error for that id.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid JSON-RPC message: {reason}")]
pub struct InvalidMessage {
    /// The id, when one could be read.
    pub id: Option<Id>,
    /// What is wrong.
    pub reason: &'static str,
}

/// Why bytes could not be decoded into JSON-RPC messages. The peer is to blame in every case.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Not JSON, even after repairing the escaping.
    #[error("not JSON: {0}")]
    NotJson(String),
    /// A batch with no elements (JSON-RPC says to answer it with one Invalid Request error).
    #[error("empty batch")]
    EmptyBatch,
    /// JSON, but not a JSON-RPC message.
    #[error(transparent)]
    Invalid(#[from] InvalidMessage),
}

impl DecodeError {
    /// The JSON-RPC error a server answers this with (`id` null unless the message had one).
    pub fn to_response(&self) -> Response {
        let (id, code, message) = match self {
            DecodeError::NotJson(_) => (Id::Null, ErrorObject::PARSE_ERROR, "Parse error"),
            DecodeError::EmptyBatch => (Id::Null, ErrorObject::INVALID_REQUEST, "Invalid Request"),
            DecodeError::Invalid(inv) => (
                inv.id.clone().unwrap_or(Id::Null),
                ErrorObject::INVALID_REQUEST,
                inv.reason,
            ),
        };
        Response {
            id,
            outcome: Err(ErrorObject::new(code, message)),
        }
    }
}

/// What one frame held: a single message or a batch.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Payload {
    /// One message.
    Single(Message),
    /// A batch; each element decoded on its own so one bad element spoils nothing else.
    Batch(Vec<Result<Message, InvalidMessage>>),
}

/// A decoded frame.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    /// The message(s).
    pub payload: Payload,
    /// True when the frame was only readable after repairing its JSON escaping: worth a metric,
    /// since it means the peer's JSON writer is broken.
    pub repaired: bool,
}

/// Decodes one frame of bytes: surrounding whitespace is ignored, broken string escaping (raw
/// quotes, control characters, stray backslashes inside strings) is repaired when the strict
/// parse fails. Never panics.
pub fn decode(bytes: &[u8]) -> Result<Decoded, DecodeError> {
    let trimmed = bytes.trim_ascii();
    match serde_json::from_slice::<Value>(trimmed) {
        Ok(v) => Ok(Decoded {
            payload: decode_value(v)?,
            repaired: false,
        }),
        Err(strict) => {
            let repaired =
                repair_json(trimmed).ok_or_else(|| DecodeError::NotJson(strict.to_string()))?;
            let v = serde_json::from_slice::<Value>(&repaired)
                .map_err(|_| DecodeError::NotJson(strict.to_string()))?;
            Ok(Decoded {
                payload: decode_value(v)?,
                repaired: true,
            })
        }
    }
}

/// Interprets an already-parsed JSON value (e.g. the `payload` of a Xiaozhi `mcp` envelope).
pub fn decode_value(v: Value) -> Result<Payload, DecodeError> {
    match v {
        Value::Array(items) if items.is_empty() => Err(DecodeError::EmptyBatch),
        Value::Array(items) => Ok(Payload::Batch(
            items.into_iter().map(Message::from_value).collect(),
        )),
        other => Ok(Payload::Single(Message::from_value(other)?)),
    }
}

impl Message {
    /// Interprets one JSON value as a message. The `jsonrpc` member is not required (peers
    /// that drop it still mean JSON-RPC 2.0).
    pub fn from_value(v: Value) -> Result<Message, InvalidMessage> {
        let Value::Object(mut m) = v else {
            return Err(InvalidMessage {
                id: None,
                reason: "not a JSON object",
            });
        };
        let id = match m.remove("id") {
            None => None,
            Some(raw) => match Id::from_value(raw) {
                Some(id) => Some(id),
                None => {
                    return Err(InvalidMessage {
                        id: Some(Id::Null),
                        reason: "id must be an integer, a string or null",
                    });
                }
            },
        };
        let params = m.remove("params");
        match m.remove("method") {
            Some(Value::String(method)) => Ok(match id {
                Some(id) => Message::Request(Request { id, method, params }),
                None => Message::Notification(Notification { method, params }),
            }),
            Some(_) => Err(InvalidMessage {
                id,
                reason: "method must be a string",
            }),
            None => {
                let id = id.ok_or(InvalidMessage {
                    id: None,
                    reason: "neither method nor id",
                })?;
                // Some servers send `"result": null` next to an error; the error wins.
                let outcome = match (m.remove("error"), m.remove("result")) {
                    (Some(e), _) if !e.is_null() => Err(ErrorObject::from_value(e)),
                    (_, Some(r)) => Ok(r),
                    _ => {
                        return Err(InvalidMessage {
                            id: Some(id),
                            reason: "response without result or error",
                        });
                    }
                };
                Ok(Message::Response(Response { id, outcome }))
            }
        }
    }

    /// A request.
    pub fn request(id: impl Into<Id>, method: impl Into<String>, params: Option<Value>) -> Self {
        Message::Request(Request {
            id: id.into(),
            method: method.into(),
            params,
        })
    }

    /// A notification.
    pub fn notification(method: impl Into<String>, params: Option<Value>) -> Self {
        Message::Notification(Notification {
            method: method.into(),
            params,
        })
    }

    /// A success response.
    pub fn result(id: Id, result: Value) -> Self {
        Message::Response(Response {
            id,
            outcome: Ok(result),
        })
    }

    /// An error response.
    pub fn error(id: Id, error: ErrorObject) -> Self {
        Message::Response(Response {
            id,
            outcome: Err(error),
        })
    }

    /// The method, for requests and notifications.
    pub fn method(&self) -> Option<&str> {
        match self {
            Message::Request(r) => Some(&r.method),
            Message::Notification(n) => Some(&n.method),
            Message::Response(_) => None,
        }
    }

    /// Compact JSON bytes, ready for a text frame or a stdio line (without the newline).
    pub fn to_vec(&self) -> Vec<u8> {
        // Serializing a message made of Values and strings into memory cannot fail; the empty
        // fallback only exists so this path has no panic.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The message as a JSON value, for embedding in an envelope such as Xiaozhi's
    /// `{"type":"mcp","payload":...}`.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

impl Serialize for Message {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("jsonrpc", "2.0")?;
        match self {
            Message::Request(r) => {
                map.serialize_entry("id", &r.id)?;
                map.serialize_entry("method", &r.method)?;
                if let Some(p) = &r.params {
                    map.serialize_entry("params", p)?;
                }
            }
            Message::Notification(n) => {
                map.serialize_entry("method", &n.method)?;
                if let Some(p) = &n.params {
                    map.serialize_entry("params", p)?;
                }
            }
            Message::Response(r) => {
                map.serialize_entry("id", &r.id)?;
                match &r.outcome {
                    Ok(v) => map.serialize_entry("result", v)?,
                    Err(e) => map.serialize_entry("error", e)?,
                }
            }
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn single(bytes: &[u8]) -> Message {
        match decode(bytes).unwrap().payload {
            Payload::Single(m) => m,
            Payload::Batch(_) => panic!("expected a single message"),
        }
    }

    #[test]
    fn classifies_requests_notifications_and_responses() {
        let m =
            single(br#" {"jsonrpc":"2.0","id":7,"method":"tools/list","params":{"cursor":""}} "#);
        assert_eq!(
            m,
            Message::request(7, "tools/list", Some(json!({"cursor": ""})))
        );
        let m = single(br#"{"jsonrpc":"2.0","method":"notifications/state_changed"}"#);
        assert_eq!(
            m,
            Message::notification("notifications/state_changed", None)
        );
        let m = single(br#"{"jsonrpc":"2.0","id":"a","result":{}}"#);
        assert_eq!(m, Message::result(Id::from("a"), json!({})));
    }

    #[test]
    fn error_without_code_is_kept() {
        let m = single(br#"{"jsonrpc":"2.0","id":3,"error":{"message":"Unknown tool: x"}}"#);
        let Message::Response(Response {
            id,
            outcome: Err(e),
        }) = m
        else {
            panic!("expected an error response");
        };
        assert_eq!(id, Id::Number(3));
        assert_eq!(e.code, None);
        assert_eq!(e.message, "Unknown tool: x");
        // Re-encoding does not invent a code.
        assert_eq!(
            Message::error(id, e).to_value(),
            json!({"jsonrpc":"2.0","id":3,"error":{"message":"Unknown tool: x"}})
        );
    }

    #[test]
    fn quoted_code_and_string_error_are_tolerated() {
        let m = single(br#"{"id":1,"error":{"code":"-32601","message":"nope"}}"#);
        let Message::Response(Response {
            outcome: Err(e), ..
        }) = m
        else {
            panic!()
        };
        assert_eq!(e.code, Some(-32601));
        let m = single(br#"{"id":1,"error":"plain"}"#);
        let Message::Response(Response {
            outcome: Err(e), ..
        }) = m
        else {
            panic!()
        };
        assert_eq!(e.message, "plain");
    }

    #[test]
    fn invalid_messages_keep_their_id() {
        let err = decode(br#"{"jsonrpc":"2.0","id":5,"method":3}"#).unwrap_err();
        assert_eq!(
            err,
            DecodeError::Invalid(InvalidMessage {
                id: Some(Id::Number(5)),
                reason: "method must be a string"
            })
        );
        assert_eq!(err.to_response().id, Id::Number(5));
        assert!(matches!(decode(b"[]"), Err(DecodeError::EmptyBatch)));
        assert!(matches!(decode(b"hello"), Err(DecodeError::NotJson(_))));
        assert!(matches!(decode(b""), Err(DecodeError::NotJson(_))));
        assert!(matches!(
            decode(br#"{"id":1.5,"result":1}"#),
            Err(DecodeError::Invalid(_))
        ));
    }

    #[test]
    fn batch_elements_decode_independently() {
        let d = decode(br#"[{"id":1,"result":1}, 42, {"method":"x"}]"#).unwrap();
        let Payload::Batch(items) = d.payload else {
            panic!()
        };
        assert_eq!(items.len(), 3);
        assert!(items[0].is_ok() && items[1].is_err() && items[2].is_ok());
    }

    #[test]
    fn string_ids_holding_numbers_match_numbers() {
        assert_eq!(Id::from("12").as_number(), Some(12));
        assert_eq!(Id::Number(12).as_number(), Some(12));
        assert_eq!(Id::from("x").as_number(), None);
    }

    #[test]
    fn encoding_is_compact_and_ordered() {
        let m = Message::request(1, "ping", None);
        assert_eq!(
            m.to_vec(),
            br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#.to_vec()
        );
    }

    fn arb_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            "[ -~\u{e9}\u{1F600}\n\"\\\\]{0,12}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                proptest::collection::btree_map("[a-z]{1,6}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn arb_id() -> impl Strategy<Value = Id> {
        prop_oneof![
            any::<i64>().prop_map(Id::Number),
            "[a-z0-9-]{0,8}".prop_map(Id::String)
        ]
    }

    fn arb_message() -> impl Strategy<Value = Message> {
        let error = (
            proptest::option::of(any::<i64>()),
            "[ -~]{0,20}",
            proptest::option::of(arb_value()),
        )
            .prop_map(|(code, message, data)| ErrorObject {
                code,
                message,
                data,
            });
        prop_oneof![
            (arb_id(), "[a-z/_]{1,16}", proptest::option::of(arb_value()))
                .prop_map(|(id, m, p)| Message::request(id, m, p)),
            ("[a-z/_]{1,16}", proptest::option::of(arb_value()))
                .prop_map(|(m, p)| Message::notification(m, p)),
            (arb_id(), arb_value()).prop_map(|(id, v)| Message::result(id, v)),
            (arb_id(), error).prop_map(|(id, e)| Message::error(id, e)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn encode_decode_round_trip(m in arb_message()) {
            let d = decode(&m.to_vec()).unwrap();
            prop_assert!(!d.repaired);
            prop_assert_eq!(d.payload, Payload::Single(m.clone()));
            prop_assert_eq!(decode_value(m.to_value()).unwrap(), Payload::Single(m));
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode(&bytes);
        }
    }
}
