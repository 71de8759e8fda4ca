//! What instances say to each other on their routing channels (`<prefix>:rpc:<instance>`):
//! one JSON object per Redis pub/sub message, a request or the reply to one.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Largest routing message read (a tool call's result is the big case); larger ones are
/// dropped unread, so a bad publisher cannot make an instance buffer without bound.
pub(crate) const MAX_MESSAGE_BYTES: usize = 256 * 1024;

/// One message on a routing channel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum Envelope {
    /// Asks the instance whose channel it is to act on a session it holds.
    Request {
        /// Correlation id, unique per sender.
        id: u64,
        /// The sender's instance id: where the reply goes.
        from: String,
        /// What to do (`xiaozhi.push`, `retell.interrupt`, `mcp.call`, ...).
        op: String,
        /// Which session or resource (a device id, a call id, a tool name).
        target: String,
        /// The operation's arguments.
        body: Value,
    },
    /// The answer to a request.
    Reply {
        /// The request's correlation id.
        id: u64,
        /// An HTTP status: what the caller's own HTTP answer will be.
        status: u16,
        /// The answer's JSON body.
        body: Value,
    },
}

impl Envelope {
    /// Parses a routing message, refusing oversized ones.
    pub(crate) fn parse(bytes: &[u8]) -> Result<Self, String> {
        if bytes.len() > MAX_MESSAGE_BYTES {
            return Err(format!(
                "routing message of {} bytes over the limit of {MAX_MESSAGE_BYTES}",
                bytes.len()
            ));
        }
        let envelope: Self = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if let Self::Request {
            from, op, target, ..
        } = &envelope
        {
            // `from` names the channel the reply goes to: an instance id, nothing else.
            let name_ok = |s: &str| {
                !s.is_empty()
                    && s.len() <= 64
                    && s.chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            };
            if !name_ok(from) || !name_ok(op) || target.len() > 1024 {
                return Err("a request with an unusable sender, operation or target".into());
            }
        }
        Ok(envelope)
    }
}

/// An answer to a routed request: an HTTP status and a JSON body, as the handling instance
/// would have answered the request itself.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Reply {
    /// The HTTP status.
    pub(crate) status: u16,
    /// The JSON body.
    pub(crate) body: Value,
}

impl Reply {
    /// A reply with `status` and `body`.
    pub(crate) fn new(status: u16, body: Value) -> Self {
        Self { status, body }
    }
}

/// The answer as HTTP: its status and JSON body (no body when it is `null`), as the handling
/// instance would have answered.
impl axum::response::IntoResponse for Reply {
    fn into_response(self) -> axum::response::Response {
        let status = axum::http::StatusCode::from_u16(self.status)
            .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
        if self.body.is_null() {
            return status.into_response();
        }
        (status, axum::Json(self.body)).into_response()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn envelopes_have_a_stable_json_shape() {
        let req = Envelope::Request {
            id: 7,
            from: "a".into(),
            op: "xiaozhi.push".into(),
            target: "aa:bb".into(),
            body: json!({"type": "alert"}),
        };
        insta::assert_snapshot!(serde_json::to_string(&req).unwrap(), @r#"{"kind":"request","id":7,"from":"a","op":"xiaozhi.push","target":"aa:bb","body":{"type":"alert"}}"#);
        let rep = Envelope::Reply {
            id: 7,
            status: 200,
            body: json!({"ok": true}),
        };
        insta::assert_snapshot!(serde_json::to_string(&rep).unwrap(), @r#"{"kind":"reply","id":7,"status":200,"body":{"ok":true}}"#);
        assert_eq!(
            Envelope::parse(serde_json::to_string(&req).unwrap().as_bytes()).unwrap(),
            req
        );
    }

    #[test]
    fn oversized_and_malformed_messages_are_refused() {
        assert!(Envelope::parse(&vec![b' '; MAX_MESSAGE_BYTES + 1]).is_err());
        assert!(Envelope::parse(b"{\"kind\":\"nope\"}").is_err());
        assert!(Envelope::parse(b"\xff").is_err());
        for (from, op) in [("a:b", "x"), ("", "x"), ("a", "x y")] {
            let bad = json!({"kind": "request", "id": 1, "from": from, "op": op, "target": "t", "body": null});
            assert!(
                Envelope::parse(bad.to_string().as_bytes()).is_err(),
                "{bad}"
            );
        }
    }
}
