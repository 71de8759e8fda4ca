//! The MCP messages this crate speaks: lifecycle and tools.
//!
//! Written here rather than taken from `rmcp` because `rmcp` (3.x) depends on tokio
//! unconditionally, which a `pure` crate may not reach, and needs a newer compiler than the
//! workspace's MSRV. The shapes follow the MCP specification; deserialization is lenient
//! (missing or `null` descriptions, missing schemas, empty cursors) and unknown members are kept
//! in `extra` so nothing a newer peer sends is lost on re-encoding.

use serde::de::{Deserializer, Error as _};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Method and notification names.
pub mod method {
    /// Lifecycle: the client's first request.
    pub const INITIALIZE: &str = "initialize";
    /// Lifecycle: the client confirms initialization.
    pub const INITIALIZED: &str = "notifications/initialized";
    /// Liveness check; answered with `{}`.
    pub const PING: &str = "ping";
    /// Paged tool listing.
    pub const TOOLS_LIST: &str = "tools/list";
    /// Tool invocation.
    pub const TOOLS_CALL: &str = "tools/call";
    /// The server's tool list changed.
    pub const TOOLS_LIST_CHANGED: &str = "notifications/tools/list_changed";
    /// A request was cancelled by its sender.
    pub const CANCELLED: &str = "notifications/cancelled";
}

/// The protocol version the Xiaozhi firmware and the MCP bridges speak.
pub const PROTOCOL_VERSION_2024_11_05: &str = "2024-11-05";
/// Versions our server accepts from a client (it answers with the client's if listed).
pub const SUPPORTED_PROTOCOL_VERSIONS: &[&str] = &["2024-11-05", "2025-03-26", "2025-06-18"];

fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

fn default_input_schema() -> Value {
    Value::Object(Map::from_iter([("type".to_owned(), Value::from("object"))]))
}

/// Name and version of a client or server implementation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Implementation {
    /// Program name.
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    /// Program version.
    #[serde(default, deserialize_with = "null_as_default")]
    pub version: String,
    /// Other members (e.g. `title`).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Implementation {
    /// An implementation description.
    pub fn new(name: impl Into<String>, version: impl Into<String>) -> Self {
        Implementation {
            name: name.into(),
            version: version.into(),
            extra: Map::new(),
        }
    }
}

/// Xiaozhi's client capability telling the device where to POST camera photos.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Vision {
    /// HTTP URL the device posts photos to.
    pub url: String,
    /// Bearer token for that URL.
    pub token: String,
}

/// `initialize` parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeParams {
    /// The protocol version the client wants.
    #[serde(default, deserialize_with = "null_as_default")]
    pub protocol_version: String,
    /// Client capabilities (free-form: `roots`, `sampling`, Xiaozhi's `vision`...).
    #[serde(default, deserialize_with = "null_as_default")]
    pub capabilities: Map<String, Value>,
    /// Who the client is.
    #[serde(default, deserialize_with = "null_as_default")]
    pub client_info: Implementation,
}

/// `initialize` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeResult {
    /// The version the server chose.
    #[serde(default, deserialize_with = "null_as_default")]
    pub protocol_version: String,
    /// Server capabilities (`tools`, `resources`...).
    #[serde(default, deserialize_with = "null_as_default")]
    pub capabilities: Map<String, Value>,
    /// Who the server is.
    #[serde(default, deserialize_with = "null_as_default")]
    pub server_info: Implementation,
    /// Optional usage hints for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
}

/// Tool annotations. Xiaozhi marks user-only tools with `audience: ["user"]`; the MCP hints
/// (`readOnlyHint`...) are kept in `extra`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct ToolAnnotations {
    /// Who the tool is for: `"user"`, `"assistant"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<Vec<String>>,
    /// Other annotations.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A tool as MCP describes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Tool {
    /// Unique name within its server; may contain dots (`self.audio_speaker.set_volume`).
    pub name: String,
    /// What the tool does, for the model.
    #[serde(default, deserialize_with = "null_as_default")]
    pub description: String,
    /// JSON Schema of the arguments object (`{"type":"object"}` when the peer sent none).
    #[serde(
        default = "default_input_schema",
        deserialize_with = "schema_or_default"
    )]
    pub input_schema: Value,
    /// Annotations (audience, hints).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<ToolAnnotations>,
    /// Other members (`title`, `outputSchema`...).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

fn schema_or_default<'de, D: Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
    match Value::deserialize(d)? {
        Value::Null => Ok(default_input_schema()),
        v @ (Value::Object(_) | Value::Bool(_)) => Ok(v),
        _ => Err(D::Error::custom("inputSchema must be an object")),
    }
}

impl Tool {
    /// A tool with a description and an argument schema.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        input_schema: Value,
    ) -> Self {
        Tool {
            name: name.into(),
            description: description.into(),
            input_schema,
            annotations: None,
            extra: Map::new(),
        }
    }

    /// Marks the tool as meant for the user only (Xiaozhi's `audience: ["user"]`).
    #[must_use]
    pub fn user_only(mut self) -> Self {
        self.annotations
            .get_or_insert_with(ToolAnnotations::default)
            .audience = Some(vec!["user".to_owned()]);
        self
    }

    /// True when the audience names the user but not the assistant: such tools (reboot,
    /// firmware upgrade) must never be offered to the model.
    pub fn is_user_only(&self) -> bool {
        self.annotations
            .as_ref()
            .and_then(|a| a.audience.as_ref())
            .is_some_and(|aud| {
                aud.iter().any(|r| r == "user") && !aud.iter().any(|r| r == "assistant")
            })
    }
}

/// `tools/list` parameters. The firmware wants `cursor` present (`""` for the first page).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ListToolsParams {
    /// Where to continue; `""` or absent for the first page.
    #[serde(default, deserialize_with = "null_as_default")]
    pub cursor: String,
    /// Xiaozhi: also list user-only tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub with_user_tools: Option<bool>,
}

/// `tools/list` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListToolsResult {
    /// This page's tools.
    #[serde(default, deserialize_with = "null_as_default")]
    pub tools: Vec<Tool>,
    /// The next page's cursor (Xiaozhi: the name of the first tool that did not fit); absent,
    /// `null` or `""` on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// `tools/call` parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallToolParams {
    /// The tool's name as its server knows it.
    pub name: String,
    /// The arguments object (`{}` when the caller sent none).
    #[serde(default = "empty_object", deserialize_with = "args_or_empty")]
    pub arguments: Value,
}

fn empty_object() -> Value {
    Value::Object(Map::new())
}

fn args_or_empty<'de, D: Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::Null => empty_object(),
        v => v,
    })
}

/// One piece of tool output.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Content {
    /// `{"type":"text","text":...}`
    Text(String),
    /// `{"type":"image","data":<base64>,"mimeType":...}`
    Image {
        /// Base64 data.
        data: String,
        /// MIME type.
        mime_type: String,
    },
    /// Any other content (audio, resource links...), kept as sent.
    Other(Value),
}

impl Serialize for Content {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        match self {
            Content::Text(text) => {
                let mut m = s.serialize_map(Some(2))?;
                m.serialize_entry("type", "text")?;
                m.serialize_entry("text", text)?;
                m.end()
            }
            Content::Image { data, mime_type } => {
                let mut m = s.serialize_map(Some(3))?;
                m.serialize_entry("type", "image")?;
                m.serialize_entry("data", data)?;
                m.serialize_entry("mimeType", mime_type)?;
                m.end()
            }
            Content::Other(v) => v.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        let kind = v.get("type").and_then(Value::as_str);
        Ok(
            match (kind, v.get("text"), v.get("data"), v.get("mimeType")) {
                (Some("text"), Some(Value::String(t)), _, _) => Content::Text(t.clone()),
                (Some("image"), _, Some(Value::String(data)), Some(Value::String(mime))) => {
                    Content::Image {
                        data: data.clone(),
                        mime_type: mime.clone(),
                    }
                }
                _ => Content::Other(v),
            },
        )
    }
}

/// `tools/call` result. A tool that ran and failed reports `is_error: true` here; a call that
/// could not be made at all is a JSON-RPC error instead.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CallToolResult {
    /// The output.
    #[serde(default, deserialize_with = "null_as_default")]
    pub content: Vec<Content>,
    /// Whether the tool failed.
    #[serde(default, deserialize_with = "null_as_default")]
    pub is_error: bool,
    /// Other members (`structuredContent`...).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl CallToolResult {
    /// A successful result holding one text item.
    pub fn text(text: impl Into<String>) -> Self {
        CallToolResult {
            content: vec![Content::Text(text.into())],
            is_error: false,
            extra: Map::new(),
        }
    }

    /// A failed result holding one text item.
    pub fn error_text(text: impl Into<String>) -> Self {
        CallToolResult {
            is_error: true,
            ..Self::text(text)
        }
    }

    /// All text items joined with newlines: what a voice model is usually given back.
    pub fn joined_text(&self) -> String {
        let mut out = String::new();
        for c in &self.content {
            if let Content::Text(t) = c {
                if !out.is_empty() {
                    out.push('\n');
                }
                out.push_str(t);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn lenient_tool_parsing() {
        let t: Tool = serde_json::from_value(json!({"name":"a.b","description":null})).unwrap();
        assert_eq!(t.description, "");
        assert_eq!(t.input_schema, json!({"type":"object"}));
        assert!(!t.is_user_only());
        let t: Tool = serde_json::from_value(json!({
            "name":"self.reboot","description":"Reboot","inputSchema":{"type":"object","properties":{}},
            "annotations":{"audience":["user"]},"title":"Reboot"
        }))
        .unwrap();
        assert!(t.is_user_only());
        assert_eq!(t.extra["title"], "Reboot");
        let both: Tool = serde_json::from_value(
            json!({"name":"x","annotations":{"audience":["user","assistant"]}}),
        )
        .unwrap();
        assert!(!both.is_user_only());
    }

    #[test]
    fn content_kinds() {
        let r: CallToolResult = serde_json::from_value(json!({
            "content":[{"type":"text","text":"true"},{"type":"image","data":"AA==","mimeType":"image/jpeg"},{"type":"audio","data":"x"}],
            "isError":false
        }))
        .unwrap();
        assert_eq!(r.content.len(), 3);
        assert!(matches!(r.content[2], Content::Other(_)));
        assert_eq!(r.joined_text(), "true");
        assert_eq!(
            serde_json::to_value(&r).unwrap()["content"][1]["mimeType"],
            "image/jpeg"
        );
    }

    #[test]
    fn list_params_always_carry_cursor() {
        let p = ListToolsParams {
            cursor: String::new(),
            with_user_tools: Some(true),
        };
        assert_eq!(
            serde_json::to_value(&p).unwrap(),
            json!({"cursor":"","withUserTools":true})
        );
    }
}
