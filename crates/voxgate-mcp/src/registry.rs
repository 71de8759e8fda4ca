//! One registry for every tool a conversation can use, whatever its source.
//!
//! Tools arrive from the client (declared in the session), from the device's MCP server, from
//! external MCP servers connected through the endpoint, and from voxgate itself. The registry
//! gives each an LLM-safe name (`^[a-zA-Z0-9_-]{1,64}$`, what the OpenAI, Anthropic and Gemini
//! APIs all accept), maps it back on a call, hides user-only tools from the model and validates
//! every call's arguments against the tool's compiled schema before it runs.
//!
//! Tool lists come from peers (a client's session, a device's `tools/list`, an external MCP
//! server), so registration is bounded and linear in the number of tools: at most
//! [`MAX_TOOLS`] tools in one registry, and per tool at most [`MAX_TOOL_NAME_BYTES`] of name,
//! [`MAX_TOOL_DESCRIPTION_BYTES`] of description and [`MAX_TOOL_SCHEMA_BYTES`] of schema. A list
//! that would take the registry over [`MAX_TOOLS`] is refused whole, before any per-tool work,
//! and leaves the registry as it was; a tool over a per-tool maximum is left out (like one whose
//! schema does not compile) and reported as a [`RejectedTool`].

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::Value;

use crate::model::Tool;
use crate::schema::{CompiledSchema, ErrorCode, ErrorPayload, SchemaError, Violation};

/// The longest tool name the LLM APIs accept.
pub const MAX_LLM_NAME_LEN: usize = 64;

/// Most tools one registry holds, over all sources: what the OpenAI API accepts in one request,
/// and more than a model chooses from well.
pub const MAX_TOOLS: usize = 128;

/// Longest tool name accepted, in UTF-8 bytes (before it is mapped to an LLM name).
pub const MAX_TOOL_NAME_BYTES: usize = 128;

/// Longest tool description accepted, in UTF-8 bytes.
pub const MAX_TOOL_DESCRIPTION_BYTES: usize = 16 * 1024;

/// Largest schema accepted, in bytes of compact JSON: the `inputSchema` plus the tool's other
/// members (`outputSchema`, `title`, annotations). Compiling and keeping a schema costs memory
/// in proportion to its size, for the whole session.
pub const MAX_TOOL_SCHEMA_BYTES: usize = 64 * 1024;

/// Where a tool comes from. The order of the variants is the naming precedence: when two tools
/// map to the same LLM name, the earlier source keeps the plain name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum ToolSource {
    /// Run by voxgate itself.
    Server,
    /// Declared by the client in the session (realtime tool definitions).
    Client,
    /// The device's own MCP server (Xiaozhi `mcp` messages).
    Device,
    /// Actions the client declared in its VIP action registry
    /// ([`ActionRegistry`](crate::action::ActionRegistry)): invoked with `action.invoke`, kept
    /// apart from [`ToolSource::Client`] so declaring one kind never replaces the other.
    Action,
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

/// A tool left out of the registry (or, for [`RejectReason::TooManyTools`], a whole list
/// refused). A tool whose schema does not compile could not have its calls validated, so it is
/// never offered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectedTool {
    /// The tool's name; empty when the whole list was refused.
    pub name: String,
    /// Why.
    pub error: RejectReason,
}

impl std::fmt::Display for RejectedTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.name.is_empty() {
            write!(f, "tools rejected: {}", self.error)
        } else {
            // Names can be long and arbitrary: quote a bounded prefix.
            let name: String = self.name.chars().take(MAX_TOOL_NAME_BYTES).collect();
            write!(f, "tool {name:?} rejected: {}", self.error)
        }
    }
}

impl std::error::Error for RejectedTool {}

/// Why a tool (or a tool list) was not registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RejectReason {
    /// The schema does not compile.
    #[error(transparent)]
    Schema(#[from] SchemaError),
    /// The list would take the registry over [`MAX_TOOLS`]; nothing of it was registered.
    #[error("{count} tools would be registered, more than the maximum of {max}")]
    TooManyTools {
        /// Tools the registry would hold with this list.
        count: usize,
        /// [`MAX_TOOLS`].
        max: usize,
    },
    /// A name, description or schema over its maximum.
    #[error("its {what} is {len} bytes, more than the maximum of {max} bytes")]
    TooLarge {
        /// `name`, `description` or `schema`.
        what: &'static str,
        /// Its size in bytes.
        len: usize,
        /// The maximum.
        max: usize,
    },
}

/// Counts the bytes a serializer writes, so a schema's size is known without keeping its text.
struct ByteCount(usize);

impl std::io::Write for ByteCount {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 = self.0.saturating_add(buf.len());
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Compact JSON size of the tool's schemas: `inputSchema` plus annotations and other members.
fn schema_bytes(tool: &Tool) -> usize {
    let mut n = ByteCount(0);
    // Writing JSON values into a counter cannot fail.
    let _ = serde_json::to_writer(&mut n, &tool.input_schema);
    if let Some(a) = &tool.annotations {
        let _ = serde_json::to_writer(&mut n, a);
    }
    if !tool.extra.is_empty() {
        let _ = serde_json::to_writer(&mut n, &tool.extra);
    }
    n.0
}

/// The per-tool maxima, cheapest first.
fn check_sizes(tool: &Tool) -> Result<(), RejectReason> {
    let too_large = |what, len, max| RejectReason::TooLarge { what, len, max };
    if tool.name.len() > MAX_TOOL_NAME_BYTES {
        return Err(too_large("name", tool.name.len(), MAX_TOOL_NAME_BYTES));
    }
    if tool.description.len() > MAX_TOOL_DESCRIPTION_BYTES {
        return Err(too_large(
            "description",
            tool.description.len(),
            MAX_TOOL_DESCRIPTION_BYTES,
        ));
    }
    let schema = schema_bytes(tool);
    if schema > MAX_TOOL_SCHEMA_BYTES {
        return Err(too_large("schema", schema, MAX_TOOL_SCHEMA_BYTES));
    }
    Ok(())
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
    /// Name lookups the last renaming made (the tests prove it linear).
    #[cfg(test)]
    rename_probes: usize,
}

impl ToolRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces every tool of `source` (a fresh `tools/list`, a new session declaration).
    /// Tools whose schema does not compile or that exceed a per-tool maximum are left out and
    /// returned; a duplicate name within one source keeps the first. LLM names are recomputed
    /// deterministically, so an unchanged set of tools keeps its names across reconnects.
    ///
    /// A list that would take the registry over [`MAX_TOOLS`] is refused whole before any tool
    /// is looked at: the registry is left unchanged and one [`RejectedTool`] with an empty name
    /// and [`RejectReason::TooManyTools`] is returned. Work is linear in the number of tools.
    pub fn set_source_tools(&mut self, source: ToolSource, tools: Vec<Tool>) -> Vec<RejectedTool> {
        let others: usize = self
            .sources
            .iter()
            .filter(|(s, _)| **s != source)
            .map(|(_, t)| t.len())
            .sum();
        let count = others.saturating_add(tools.len());
        if count > MAX_TOOLS {
            return vec![RejectedTool {
                name: String::new(),
                error: RejectReason::TooManyTools {
                    count,
                    max: MAX_TOOLS,
                },
            }];
        }
        let mut rejected = Vec::new();
        let mut kept: Vec<RegisteredTool> = Vec::with_capacity(tools.len());
        let mut seen: HashSet<String> = HashSet::with_capacity(tools.len());
        for tool in tools {
            if let Err(error) = check_sizes(&tool) {
                rejected.push(RejectedTool {
                    name: tool.name,
                    error,
                });
                continue;
            }
            if !seen.insert(tool.name.clone()) {
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
                    error: error.into(),
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

    /// Gives every tool its LLM name, in source order. Each base name remembers the next
    /// suffix to try, so many tools mapping to one base cost one lookup each rather than one
    /// per earlier namesake; a lookup fails only on a name already taken, at most once per
    /// taken name and base, so the whole pass is linear.
    fn rename(&mut self) {
        self.by_llm_name.clear();
        let mut next_suffix: HashMap<String, u32> = HashMap::new();
        #[cfg(test)]
        let mut probes = 0usize;
        for (source, tools) in &mut self.sources {
            for (i, t) in tools.iter_mut().enumerate() {
                let base = sanitize(&t.tool.name);
                let n = next_suffix.entry(base.clone()).or_insert(1);
                let mut name = if *n == 1 {
                    base.clone()
                } else {
                    suffixed(&base, *n)
                };
                loop {
                    #[cfg(test)]
                    {
                        probes += 1;
                    }
                    if !self.by_llm_name.contains_key(&name) {
                        break;
                    }
                    *n += 1;
                    name = suffixed(&base, *n);
                }
                *n += 1;
                self.by_llm_name.insert(name.clone(), (source.clone(), i));
                t.llm_name = name;
            }
        }
        #[cfg(test)]
        {
            self.rename_probes = probes;
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

/// `base` with the collision suffix `_n`, cut to fit [`MAX_LLM_NAME_LEN`].
fn suffixed(base: &str, n: u32) -> String {
    let suffix = format!("_{n}");
    format!(
        "{}{suffix}",
        truncate(base, MAX_LLM_NAME_LEN.saturating_sub(suffix.len()))
    )
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

    fn numbered(prefix: &str, n: usize) -> Vec<Tool> {
        (0..n)
            .map(|i| Tool::new(format!("{prefix}{i}"), "", json!({"type": "object"})))
            .collect()
    }

    /// 10,000 tools whose schemas would all fail to compile: the count is refused before any
    /// of them is looked at (one rejection, not 10,000), and the registry keeps what it had.
    #[test]
    fn too_many_tools_are_refused_before_any_per_tool_work() {
        let mut r = ToolRegistry::new();
        assert!(
            r.set_source_tools(ToolSource::Client, numbered("ok", 3))
                .is_empty()
        );
        let bad: Vec<Tool> = (0..10_000)
            .map(|i| Tool::new(format!("t{i}"), "", json!({"type": 5})))
            .collect();
        let rejected = r.set_source_tools(ToolSource::Client, bad);
        assert_eq!(
            rejected,
            vec![RejectedTool {
                name: String::new(),
                error: RejectReason::TooManyTools {
                    count: 10_000,
                    max: MAX_TOOLS
                },
            }]
        );
        assert_eq!(
            rejected[0].to_string(),
            "tools rejected: 10000 tools would be registered, more than the maximum of 128"
        );
        assert_eq!(r.len(), 3);
        assert!(r.by_llm_name("ok0").is_some());
    }

    /// The maximum counts every source; replacing a source's own tools does not count them twice.
    #[test]
    fn the_count_spans_sources() {
        let mut r = ToolRegistry::new();
        assert!(
            r.set_source_tools(ToolSource::Server, numbered("s", 100))
                .is_empty()
        );
        assert!(
            r.set_source_tools(ToolSource::Client, numbered("c", 28))
                .is_empty()
        );
        assert!(
            r.set_source_tools(ToolSource::Client, numbered("d", 28))
                .is_empty()
        );
        assert_eq!(r.len(), MAX_TOOLS);
        let rejected = r.set_source_tools(ToolSource::Device, numbered("x", 1));
        assert!(matches!(
            rejected[0].error,
            RejectReason::TooManyTools { count: 129, .. }
        ));
        assert!(r.get(&ToolSource::Device, "x0").is_none());
        r.remove_source(&ToolSource::Client);
        assert!(
            r.set_source_tools(ToolSource::Device, numbered("x", 28))
                .is_empty()
        );
    }

    #[test]
    fn oversized_tools_are_left_out() {
        let mut r = ToolRegistry::new();
        let name_at_max = "n".repeat(MAX_TOOL_NAME_BYTES);
        let long_name = "n".repeat(MAX_TOOL_NAME_BYTES + 1);
        let big_text = |n: usize| "d".repeat(n);
        let schema = |n: usize| json!({"type": "object", "description": big_text(n)});
        // The bytes of JSON syntax around the description.
        let overhead = serde_json::to_vec(&schema(0)).unwrap().len();
        let rejected = r.set_source_tools(
            ToolSource::Client,
            vec![
                Tool::new(
                    name_at_max.clone(),
                    big_text(MAX_TOOL_DESCRIPTION_BYTES),
                    json!({}),
                ),
                Tool::new(long_name.clone(), "", json!({})),
                Tool::new(
                    "long_description",
                    big_text(MAX_TOOL_DESCRIPTION_BYTES + 1),
                    json!({}),
                ),
                Tool::new(
                    "schema_at_max",
                    "",
                    schema(MAX_TOOL_SCHEMA_BYTES - overhead),
                ),
                Tool::new(
                    "big_schema",
                    "",
                    schema(MAX_TOOL_SCHEMA_BYTES - overhead + 1),
                ),
            ],
        );
        let reasons: Vec<(&str, &RejectReason)> = rejected
            .iter()
            .map(|t| (t.name.as_str(), &t.error))
            .collect();
        assert_eq!(
            reasons,
            [
                (
                    long_name.as_str(),
                    &RejectReason::TooLarge {
                        what: "name",
                        len: MAX_TOOL_NAME_BYTES + 1,
                        max: MAX_TOOL_NAME_BYTES
                    }
                ),
                (
                    "long_description",
                    &RejectReason::TooLarge {
                        what: "description",
                        len: MAX_TOOL_DESCRIPTION_BYTES + 1,
                        max: MAX_TOOL_DESCRIPTION_BYTES
                    }
                ),
                (
                    "big_schema",
                    &RejectReason::TooLarge {
                        what: "schema",
                        len: MAX_TOOL_SCHEMA_BYTES + 1,
                        max: MAX_TOOL_SCHEMA_BYTES
                    }
                ),
            ]
        );
        assert_eq!(
            rejected[2].to_string(),
            "tool \"big_schema\" rejected: its schema is 65537 bytes, more than the maximum of 65536 bytes"
        );
        assert_eq!(r.len(), 2);
        assert!(r.get(&ToolSource::Client, &name_at_max).is_some());
        assert!(r.get(&ToolSource::Client, "schema_at_max").is_some());
    }

    /// Many tools sharing one LLM base name (every non-ASCII letter maps to `_`) get distinct
    /// suffixes with one lookup each: the naming pass is linear, where trying `_2`, `_3`...
    /// from the start for each tool made it quadratic.
    #[test]
    fn colliding_names_are_named_in_linear_work() {
        let mut r = ToolRegistry::new();
        let tools: Vec<Tool> = (0..u32::try_from(MAX_TOOLS).unwrap())
            .map(|i| {
                let c = char::from_u32(0x100 + i).unwrap();
                Tool::new(format!("t{c}"), "", json!({}))
            })
            .collect();
        assert!(r.set_source_tools(ToolSource::Client, tools).is_empty());
        assert_eq!(r.rename_probes, MAX_TOOLS);
        assert!(r.by_llm_name("t_").is_some());
        assert!(r.by_llm_name(&format!("t__{MAX_TOOLS}")).is_some());
        // A literal name taken by another source costs one extra lookup, not one per tool.
        let mut r2 = ToolRegistry::new();
        r2.set_source_tools(ToolSource::Server, vec![Tool::new("t__2", "", json!({}))]);
        let tools: Vec<Tool> = (0..100u32)
            .map(|i| {
                Tool::new(
                    format!("t{}", char::from_u32(0x100 + i).unwrap()),
                    "",
                    json!({}),
                )
            })
            .collect();
        r2.set_source_tools(ToolSource::Client, tools);
        assert_eq!(r2.rename_probes, 1 + 100 + 1);
        assert_eq!(
            r2.by_llm_name("t__2").unwrap().source(),
            &ToolSource::Server
        );
        assert_eq!(r2.by_llm_name("t__3").unwrap().tool().name, "t\u{101}");
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
            let mut seen = HashSet::new();
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
