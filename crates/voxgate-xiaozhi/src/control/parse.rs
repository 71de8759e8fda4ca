//! Two-pass parsing: find `type` without building a DOM, then deserialize the one struct it names.
//!
//! A serde internally tagged enum buffers the whole object into an intermediate tree before it
//! can pick a variant; peeking at `type` with a borrowed probe and then deserializing straight
//! into the variant's struct is several times faster and keeps control messages well under a
//! microsecond. The `mcp` payload is only syntax-checked and copied as raw text, never built into
//! a tree: the JSON-RPC layer decodes it into its own types.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::{DeviceMessage, ServerMessage, UnknownMessage, sanitize};

/// Why a text frame is not a control message. Blame: always the peer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ParseError {
    /// Not valid JSON, even after repairing broken string escapes.
    #[error("malformed JSON: {0}")]
    Malformed(#[source] serde_json::Error),
    /// Valid JSON, but not an object.
    #[error("control message is not a JSON object")]
    NotAnObject,
    /// An object without a string `type`.
    #[error("control message has no string `type` field")]
    MissingType,
    /// A known `type` whose fields are missing or of the wrong type.
    #[error("invalid `{message_type}` message: {source}")]
    InvalidMessage {
        /// The message type.
        message_type: &'static str,
        /// What serde found wrong.
        #[source]
        source: serde_json::Error,
    },
}

impl ParseError {
    /// Whether repairing the text's string escapes might help.
    fn is_syntax(&self) -> bool {
        match self {
            Self::Malformed(e) => e.is_syntax(),
            Self::InvalidMessage { source, .. } => source.is_syntax(),
            Self::NotAnObject | Self::MissingType => false,
        }
    }
}

/// Finds `type` and nothing else; every other value is skipped, not built.
#[derive(Deserialize)]
struct Probe<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<&'a RawValue>,
}

/// Parses `json`, repairing broken string escapes and retrying once on a syntax error.
pub(super) fn parse<T>(
    json: &[u8],
    dispatch: fn(&str, &[u8]) -> Result<T, ParseError>,
) -> Result<T, ParseError> {
    match parse_once(json, dispatch) {
        Err(error) if error.is_syntax() => match sanitize::repair(json) {
            // The firmware builds JSON by concatenation and does not always escape what it
            // embeds (MCP error messages in particular): repair and retry, but report the
            // original error if the repair does not help.
            Some(repaired) => parse_once(repaired.as_bytes(), dispatch).map_err(|_| error),
            None => Err(error),
        },
        result => result,
    }
}

fn parse_once<T>(
    json: &[u8],
    dispatch: fn(&str, &[u8]) -> Result<T, ParseError>,
) -> Result<T, ParseError> {
    if json.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        // Distinguish "not JSON" from "JSON, but not an object".
        return match serde_json::from_slice::<serde::de::IgnoredAny>(json) {
            Ok(_) => Err(ParseError::NotAnObject),
            Err(e) => Err(ParseError::Malformed(e)),
        };
    }
    let probe: Probe<'_> = serde_json::from_slice(json).map_err(ParseError::Malformed)?;
    let raw = probe.kind.ok_or(ParseError::MissingType)?.get();
    match raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
        // The common case: a plain ASCII tag needs no unescaping.
        Some(kind) if !kind.contains('\\') => dispatch(kind, json),
        _ => {
            let kind: String = serde_json::from_str(raw).map_err(|_| ParseError::MissingType)?;
            dispatch(&kind, json)
        }
    }
}

fn body<T: DeserializeOwned>(json: &[u8], message_type: &'static str) -> Result<T, ParseError> {
    serde_json::from_slice(json).map_err(|source| ParseError::InvalidMessage {
        message_type,
        source,
    })
}

/// An `mcp` envelope, its payload kept as raw text.
///
/// A raw value is only checked for syntax, and serde_json's syntax check accepts lone UTF-16
/// surrogate escapes that it rejects when decoding a string, so they would surface later in the
/// JSON-RPC layer. Repair them here, as the whole-message repair does for every other string.
fn mcp(json: &[u8]) -> Result<super::Mcp, ParseError> {
    let mut mcp: super::Mcp = body(json, "mcp")?;
    if sanitize::has_lone_surrogate(mcp.payload.get())
        && let Some(repaired) = sanitize::repair(mcp.payload.get().as_bytes())
    {
        mcp.payload =
            RawValue::from_string(repaired).map_err(|source| ParseError::InvalidMessage {
                message_type: "mcp",
                source,
            })?;
    }
    Ok(mcp)
}

fn unknown(kind: &str, json: &[u8]) -> Result<UnknownMessage, ParseError> {
    let mut fields: Map<String, Value> =
        serde_json::from_slice(json).map_err(ParseError::Malformed)?;
    fields.remove("type");
    Ok(UnknownMessage {
        message_type: kind.to_owned(),
        fields,
    })
}

pub(super) fn device(kind: &str, json: &[u8]) -> Result<DeviceMessage, ParseError> {
    Ok(match kind {
        "hello" => DeviceMessage::Hello(body(json, "hello")?),
        "listen" => DeviceMessage::Listen(body(json, "listen")?),
        "abort" => DeviceMessage::Abort(body(json, "abort")?),
        "mcp" => DeviceMessage::Mcp(mcp(json)?),
        "iot" => {
            let mut iot: super::Iot = body(json, "iot")?;
            iot.fields.remove("type");
            DeviceMessage::Iot(iot)
        }
        "event" => DeviceMessage::Event(body(json, "event")?),
        other => DeviceMessage::Unknown(unknown(other, json)?),
    })
}

pub(super) fn server(kind: &str, json: &[u8]) -> Result<ServerMessage, ParseError> {
    Ok(match kind {
        "hello" => ServerMessage::Hello(body(json, "hello")?),
        "stt" => ServerMessage::Stt(body(json, "stt")?),
        "tts" => ServerMessage::Tts(body(json, "tts")?),
        "llm" => ServerMessage::Llm(body(json, "llm")?),
        "mcp" => ServerMessage::Mcp(mcp(json)?),
        "system" => ServerMessage::System(body(json, "system")?),
        "alert" => ServerMessage::Alert(body(json, "alert")?),
        other => ServerMessage::Unknown(unknown(other, json)?),
    })
}
