//! One registry for every tool a conversation can use, whatever its source.
//!
//! Tools arrive from the client (declared in the session), from the device's MCP server, from
//! external MCP servers connected through the endpoint, and from voxgate itself. The registry
//! gives each an LLM-safe name (`^[a-zA-Z0-9_-]{1,64}$`, what the OpenAI, Anthropic and Gemini
//! APIs all accept), maps it back on a call, hides user-only tools from the model and validates
//! every call's arguments against the tool's compiled schema before it runs.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

use crate::model::Tool;
use crate::schema::{CompiledSchema, ErrorCode, ErrorPayload, SchemaError, Violation};

/// The longest tool name the LLM APIs accept.
pub const MAX_LLM_NAME_LEN: usize = 64;

/// Where a tool comes from. The order of the variants is the naming precedence: when two tools
/// map to the same LLM name, the earlier source keeps the plain name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum ToolSource {
    /// Run by voxgate itself.
    Server,
    /// Declared by the client in the session (e.g. the action registry).
    Client,
    /// The device's own MCP server (Xiaozhi `mcp` messages).
    Device,
    /// An external MCP server, one per connection (the key tells connections apart).
    Mcp(String),
}

/// A tool in the registry.
#[derive(Debug, Clone)]
pub struct RegisteredTool {
    source: ToolSource,
    tool: Tool,
    llm_name: String,
    schema: CompiledSchema,
}

impl RegisteredTool {
    /// Where the tool comes from.
    pub fn source(&self) -> &ToolSource {
        &self.source
    }

    /// The tool as its source described it (original name).
    pub fn tool(&self) -> &Tool {
        &self.tool
    }

    /// The name the model sees and calls.
    pub fn llm_name(&self) -> &str {
        &self.llm_name
    }

    /// Whether the tool is hidden from the model.
    pub fn is_user_only(&self) -> bool {
        self.tool.is_user_only()
    }

    /// The compiled argument schema.
    pub fn schema(&self) -> &CompiledSchema {
        &self.schema
    }
}

/// A tool left out of the registry because its schema does not compile. Calls to it could not
/// be validated, so it is never offered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tool {name:?} rejected: {error}")]
pub struct RejectedTool {
    /// The tool's name.
    pub name: String,
    /// Why.
    pub error: SchemaError,
}

/// A call that passed every check, ready to be routed to its source.
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedCall {
    /// Where to send it.
    pub source: ToolSource,
    /// The tool's own name (dots and all), as its source expects it.
    pub name: String,
    /// The name the model used.
    pub llm_name: String,
    /// Validated arguments (always an object or whatever the schema allows).
    pub arguments: Value,
}

/// Why a call was refused before running. [`ToolCallError::payload`] is what the model gets.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ToolCallError {
    /// No tool has this name.
    #[error("unknown tool {0:?}")]
    UnknownTool(String),
    /// The tool is user-only and the model may not call it.
    #[error("tool {0:?} is not available to the assistant")]
    NotAllowed(String),
    /// The arguments string is not JSON.
    #[error("arguments for {tool:?} are not JSON: {detail}")]
    ArgumentsNotJson {
        /// The tool (LLM name).
        tool: String,
        /// Parser message.
        detail: String,
    },
    /// The arguments break the schema.
    #[error("arguments for {tool:?} do not match its schema")]
    InvalidArguments {
        /// The tool (LLM name).
        tool: String,
        /// What is wrong.
        violations: Vec<Violation>,
    },
}

impl ToolCallError {
    /// The standard error payload for the model.
    pub fn payload(&self) -> ErrorPayload {
        let message = self.to_string();
        match self {
            ToolCallError::UnknownTool(_) => ErrorPayload::new(ErrorCode::UnknownTool, message),
            ToolCallError::NotAllowed(_) => ErrorPayload::new(ErrorCode::NotAllowed, message),
            ToolCallError::ArgumentsNotJson { .. } => {
                ErrorPayload::new(ErrorCode::InvalidArguments, message)
            }
            ToolCallError::InvalidArguments { violations, .. } => ErrorPayload {
                code: ErrorCode::InvalidArguments,
                message,
                details: violations.clone(),
            },
        }
    }
}

/// The merged tool registry.
#[derive(Debug, Clone, Default)]
pub struct ToolRegistry {
    sources: BTreeMap<ToolSource, Vec<RegisteredTool>>,
    by_llm_name: HashMap<String, (ToolSource, usize)>,
}

impl ToolRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces every tool of `source` (a fresh `tools/list`, a new session declaration).
    /// Tools whose schema does not compile are left out and returned; a duplicate name within
    /// one source keeps the first. LLM names are recomputed deterministically, so an unchanged
    /// set of tools keeps its names across reconnects.
    pub fn set_source_tools(&mut self, source: ToolSource, tools: Vec<Tool>) -> Vec<RejectedTool> {
        let mut rejected = Vec::new();
        let mut kept: Vec<RegisteredTool> = Vec::with_capacity(tools.len());
        for tool in tools {
            if kept.iter().any(|k| k.tool.name == tool.name) {
                continue;
            }
            match CompiledSchema::compile(&tool.input_schema) {
                Ok(schema) => kept.push(RegisteredTool {
                    source: source.clone(),
                    tool,
                    llm_name: String::new(),
                    schema,
                }),
                Err(error) => rejected.push(RejectedTool {
                    name: tool.name,
                    error,
                }),
            }
        }
        self.sources.insert(source, kept);
        self.rename();
        rejected
    }

    /// Removes every tool of `source` (its connection closed).
    pub fn remove_source(&mut self, source: &ToolSource) {
        if self.sources.remove(source).is_some() {
            self.rename();
        }
    }

    fn rename(&mut self) {
        self.by_llm_name.clear();
        for (source, tools) in &mut self.sources {
            for (i, t) in tools.iter_mut().enumerate() {
                let base = sanitize(&t.tool.name);
                let mut name = base.clone();
                let mut n = 2u32;
                while self.by_llm_name.contains_key(&name) {
                    let suffix = format!("_{n}");
                    name = format!(
                        "{}{suffix}",
                        truncate(&base, MAX_LLM_NAME_LEN - suffix.len())
                    );
                    n += 1;
                }
                self.by_llm_name.insert(name.clone(), (source.clone(), i));
                t.llm_name = name;
            }
        }
    }

    /// Every tool, user-only ones included (e.g. for a settings screen).
    pub fn all_tools(&self) -> impl Iterator<Item = &RegisteredTool> {
        self.sources.values().flatten()
    }

    /// The tools offered to the model: everything except user-only tools.
    pub fn llm_tools(&self) -> impl Iterator<Item = &RegisteredTool> {
        self.all_tools().filter(|t| !t.is_user_only())
    }

    /// Looks a tool up by the name the model used.
    pub fn by_llm_name(&self, llm_name: &str) -> Option<&RegisteredTool> {
        let (source, i) = self.by_llm_name.get(llm_name)?;
        self.sources.get(source)?.get(*i)
    }

    /// Looks a tool up by its source and own name.
    pub fn get(&self, source: &ToolSource, name: &str) -> Option<&RegisteredTool> {
        self.sources
            .get(source)?
            .iter()
            .find(|t| t.tool.name == name)
    }

    /// Number of tools (user-only included).
    pub fn len(&self) -> usize {
        self.sources.values().map(Vec::len).sum()
    }

    /// Whether the registry is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checks a call the model made: the tool must exist and be offered, and the arguments must
    /// match its schema. `arguments` may be an object, `null` (read as `{}`) or a string holding
    /// JSON (what chat APIs hand over).
    pub fn prepare_call(
        &self,
        llm_name: &str,
        arguments: Value,
    ) -> Result<PreparedCall, ToolCallError> {
        let t = self
            .by_llm_name(llm_name)
            .ok_or_else(|| ToolCallError::UnknownTool(llm_name.to_owned()))?;
        if t.is_user_only() {
            return Err(ToolCallError::NotAllowed(llm_name.to_owned()));
        }
        check(t, arguments)
    }

    /// Checks a call the user made directly (user-only tools allowed), by source and own name.
    pub fn prepare_user_call(
        &self,
        source: &ToolSource,
        name: &str,
        arguments: Value,
    ) -> Result<PreparedCall, ToolCallError> {
        let t = self
            .get(source, name)
            .ok_or_else(|| ToolCallError::UnknownTool(name.to_owned()))?;
        check(t, arguments)
    }
}

fn check(t: &RegisteredTool, arguments: Value) -> Result<PreparedCall, ToolCallError> {
    let arguments = match arguments {
        Value::Null => Value::Object(serde_json::Map::new()),
        Value::String(s) if s.trim().is_empty() => Value::Object(serde_json::Map::new()),
        Value::String(s) => {
            serde_json::from_str(&s).map_err(|e| ToolCallError::ArgumentsNotJson {
                tool: t.llm_name.clone(),
                detail: e.to_string(),
            })?
        }
        v => v,
    };
    t.schema
        .validate(&arguments)
        .map_err(|violations| ToolCallError::InvalidArguments {
            tool: t.llm_name.clone(),
            violations,
        })?;
    Ok(PreparedCall {
        source: t.source.clone(),
        name: t.tool.name.clone(),
        llm_name: t.llm_name.clone(),
        arguments,
    })
}

/// Maps a tool name onto `[a-zA-Z0-9_-]{1,64}`: other characters (dots first of all) become
/// `_`; an over-long name is cut and given a hash of the full name so distinct long names stay
/// distinct. Collisions left after this are resolved by the registry with `_2`, `_3`...
pub fn sanitize(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.is_empty() {
        out.push_str("tool");
    }
    if out.len() > MAX_LLM_NAME_LEN {
        let hash = format!("_{:08x}", fnv1a32(name.as_bytes()));
        out = format!("{}{hash}", truncate(&out, MAX_LLM_NAME_LEN - hash.len()));
    }
    out
}

/// `s` cut to at most `max` bytes (ASCII here, so bytes are characters).
fn truncate(s: &str, max: usize) -> &str {
    s.get(..max.min(s.len())).unwrap_or(s)
}

fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn volume_tool() -> Tool {
        Tool::new(
            "self.audio_speaker.set_volume",
            "Set the volume",
            json!({"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":100}},"required":["volume"]}),
        )
    }

    #[test]
    fn dotted_names_map_both_ways_and_user_tools_are_hidden() {
        let mut r = ToolRegistry::new();
        let rejected = r.set_source_tools(
            ToolSource::Device,
            vec![
                volume_tool(),
                Tool::new("self.reboot", "Reboot", json!({"type":"object"})).user_only(),
            ],
        );
        assert!(rejected.is_empty());
        let names: Vec<&str> = r.llm_tools().map(RegisteredTool::llm_name).collect();
        assert_eq!(names, ["self_audio_speaker_set_volume"]);
        assert_eq!(r.all_tools().count(), 2);
        let call = r
            .prepare_call("self_audio_speaker_set_volume", json!("{\"volume\": 30}"))
            .unwrap();
        assert_eq!(call.name, "self.audio_speaker.set_volume");
        assert_eq!(call.source, ToolSource::Device);
        assert_eq!(call.arguments, json!({"volume": 30}));
        assert_eq!(
            r.prepare_call("self_reboot", Value::Null),
            Err(ToolCallError::NotAllowed("self_reboot".into()))
        );
        assert!(
            r.prepare_user_call(&ToolSource::Device, "self.reboot", Value::Null)
                .is_ok()
        );
    }

    #[test]
    fn invalid_arguments_yield_the_standard_payload() {
        let mut r = ToolRegistry::new();
        r.set_source_tools(ToolSource::Device, vec![volume_tool()]);
        let err = r
            .prepare_call("self_audio_speaker_set_volume", json!({"volume": "loud"}))
            .unwrap_err();
        let p = err.payload().to_value();
        assert_eq!(p["error"]["code"], "invalid_arguments");
        assert_eq!(p["error"]["details"][0]["path"], "/volume");
        let err = r
            .prepare_call("self_audio_speaker_set_volume", json!("{volume"))
            .unwrap_err();
        assert!(matches!(err, ToolCallError::ArgumentsNotJson { .. }));
        let err = r.prepare_call("nope", json!({})).unwrap_err();
        assert_eq!(err.payload().code, ErrorCode::UnknownTool);
    }

    #[test]
    fn collisions_across_sources_get_suffixes_and_sources_can_leave() {
        let mut r = ToolRegistry::new();
        r.set_source_tools(
            ToolSource::Mcp("a".into()),
            vec![Tool::new("get.time", "", json!({}))],
        );
        r.set_source_tools(
            ToolSource::Server,
            vec![Tool::new("get_time", "", json!({}))],
        );
        assert_eq!(
            r.by_llm_name("get_time").unwrap().source(),
            &ToolSource::Server
        );
        assert_eq!(r.by_llm_name("get_time_2").unwrap().tool().name, "get.time");
        r.remove_source(&ToolSource::Server);
        assert_eq!(r.by_llm_name("get_time").unwrap().tool().name, "get.time");
        assert!(r.by_llm_name("get_time_2").is_none());
    }

    #[test]
    fn uncompilable_schemas_are_rejected() {
        let mut r = ToolRegistry::new();
        let rejected = r.set_source_tools(
            ToolSource::Client,
            vec![
                Tool::new("bad", "", json!({"type": 5})),
                Tool::new("good", "", json!({})),
            ],
        );
        assert_eq!(rejected.len(), 1);
        assert_eq!(rejected[0].name, "bad");
        assert_eq!(r.len(), 1);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Whatever the names, LLM names are valid, unique and map back to their tool.
        #[test]
        fn llm_names_are_valid_unique_and_reversible(
            names in proptest::collection::vec("[a-z._ -]{0,80}", 1..12),
        ) {
            let mut r = ToolRegistry::new();
            let half = names.len() / 2;
            r.set_source_tools(ToolSource::Device, names[..half].iter().map(|n| Tool::new(n.clone(), "", json!({}))).collect());
            r.set_source_tools(ToolSource::Server, names[half..].iter().map(|n| Tool::new(n.clone(), "", json!({}))).collect());
            let mut seen = std::collections::HashSet::new();
            for t in r.all_tools() {
                let n = t.llm_name();
                prop_assert!(!n.is_empty() && n.len() <= MAX_LLM_NAME_LEN, "{n}");
                prop_assert!(n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'));
                prop_assert!(seen.insert(n.to_owned()));
                let back = r.by_llm_name(n).unwrap();
                prop_assert_eq!(&back.tool().name, &t.tool().name);
                prop_assert_eq!(back.source(), t.source());
            }
        }
    }
}
