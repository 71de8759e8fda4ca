//! The examples in `docs/doors/vip.md` decode, each to a message that encodes back to the same
//! JSON value; the bounds the doc states are the crate's.
// Test helpers may unwrap and panic: a failure there is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::Value;
use voxgate_vip::{ClientMessage, ServerMessage};

fn doc() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/doors/vip.md");
    std::fs::read_to_string(path).expect("docs/doors/vip.md")
}

/// The lines of the ```json block after the paragraph `heading`.
fn block(doc: &str, heading: &str) -> Vec<String> {
    let start = doc
        .find(heading)
        .unwrap_or_else(|| panic!("no `{heading}`"));
    let rest = &doc[start..];
    let open = rest.find("```json\n").unwrap() + "```json\n".len();
    let close = rest[open..].find("```").unwrap();
    rest[open..open + close]
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_owned)
        .collect()
}

/// `text` as a value with explicit nulls dropped (the codec reads them as absent).
fn without_nulls(text: &str) -> Value {
    fn strip(v: Value) -> Value {
        match v {
            Value::Object(m) => Value::Object(
                m.into_iter()
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, v)| (k, strip(v)))
                    .collect(),
            ),
            other => other,
        }
    }
    strip(serde_json::from_str(text).unwrap())
}

#[test]
fn client_examples_decode_and_re_encode() {
    let lines = block(&doc(), "Client to server:\n");
    assert!(lines.len() >= 7);
    let mut types = Vec::new();
    for line in lines {
        let msg = ClientMessage::decode(&line).unwrap_or_else(|e| panic!("{line}: {e}"));
        assert!(!matches!(msg, ClientMessage::Unknown { .. }), "{line}");
        assert_eq!(without_nulls(&msg.encode()), without_nulls(&line), "{line}");
        types.push(msg.type_name().to_owned());
    }
    for t in [
        "actions.declare",
        "state.narrate",
        "action.result",
        "input.detected",
        "input.text",
        "session.end",
        "error.fatal",
    ] {
        assert!(types.iter().any(|x| x == t), "no example of {t}");
    }
}

#[test]
fn server_examples_decode_and_re_encode() {
    let lines = block(&doc(), "Server to client:\n");
    let mut types = Vec::new();
    for line in lines {
        let msg = ServerMessage::decode(&line).unwrap_or_else(|e| panic!("{line}: {e}"));
        assert!(!matches!(msg, ServerMessage::Unknown { .. }), "{line}");
        // Server encodings keep their nulls: the text is exactly what the server sends.
        assert_eq!(msg.encode(), line);
        types.push(msg.type_name().to_owned());
    }
    for t in [
        "session.connected",
        "state",
        "input.detected",
        "transcript.user",
        "reply.text",
        "reply.done",
        "action.invoke",
        "action.cancelled",
        "turn.latency",
        "error",
        "error.fatal",
    ] {
        assert!(types.iter().any(|x| x == t), "no example of {t}");
    }
}

#[test]
fn documented_errors_are_the_codecs() {
    let lines = block(&doc(), "Server to client:\n");
    let unknown = voxgate_vip::ErrorPayload::unknown_type("ping");
    assert!(lines.contains(&ServerMessage::from(unknown).encode()));
    let refused = ClientMessage::decode(r#"{"type":"input.text"}"#).unwrap_err();
    assert!(lines.contains(&ServerMessage::from(refused.payload()).encode()));
}

#[test]
fn documented_bounds_are_the_codecs() {
    let doc = doc();
    let kib = |n: usize| format!("{} KiB", n / 1024);
    for needle in [
        format!("| one message | {} ", kib(voxgate_vip::MAX_MESSAGE_BYTES)),
        format!(
            "| actions in one `actions.declare` | {} ",
            voxgate_vip::MAX_ACTIONS
        ),
        format!(
            "| `state.narrate` `text` | {} ",
            kib(voxgate_vip::MAX_NARRATED_STATE_BYTES)
        ),
        format!(
            "its `error` payload | {} ",
            kib(voxgate_vip::MAX_ACTION_RESULT_BYTES)
        ),
        format!(
            "| action id, `invocation_id` | 1 to {} bytes",
            voxgate_vip::MAX_ACTION_ID_BYTES.min(voxgate_vip::MAX_INVOCATION_ID_BYTES)
        ),
        format!(
            "| action `description` | {} |",
            kib(voxgate_vip::MAX_ACTION_DESCRIPTION_BYTES)
        ),
        format!(
            "| `input.text` `text` | {} |",
            kib(voxgate_vip::MAX_INPUT_TEXT_BYTES)
        ),
    ] {
        assert!(doc.contains(&needle), "docs/doors/vip.md lacks `{needle}`");
    }
}
