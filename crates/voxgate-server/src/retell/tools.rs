//! What the model sees (the context built from Retell's transcript) and the tools it may call.
//!
//! Built-in tools: `end_call` and `transfer_call` are Retell actions, not lookups: they finish
//! the response with `end_call: true` / `transfer_number` (Retell acts once the words are
//! spoken, and drops the action if the user interrupts). `get_call_details` and
//! `get_current_time` run here; their invocation and result are reported to Retell
//! (`tool_call_invocation` / `tool_call_result`) and the model continues the same response.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use voxgate_engine::ServerToolDefinition;
use voxgate_engine::provider::{ChatRole, ContextMessage, ContextToolCall, ToolSpec};
use voxgate_mcp::model::Tool;
use voxgate_mcp::registry::{ToolRegistry, ToolSource};
use voxgate_retell::{Call, Generate, Role, TranscriptItem};

use super::RetellConfig;

/// Name of the built-in end-the-call tool.
pub(crate) const END_CALL: &str = "end_call";
/// Name of the built-in transfer tool.
pub(crate) const TRANSFER_CALL: &str = "transfer_call";
/// Name of the built-in call-details lookup.
pub(crate) const GET_CALL_DETAILS: &str = "get_call_details";
/// Name of the built-in clock.
pub(crate) const GET_CURRENT_TIME: &str = "get_current_time";

/// The tools offered to the model.
pub(crate) fn specs(cfg: &RetellConfig) -> Vec<ToolSpec> {
    let mut tools = Vec::new();
    if cfg.end_call_tool {
        tools.push(ToolSpec {
            name: END_CALL.into(),
            description: "End the call, after saying goodbye. Use when the caller says goodbye \
                          or the conversation is over."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "message": {"type": "string", "description": "What to say before hanging up."}
                }
            }),
        });
    }
    if cfg.transfer_tool {
        tools.push(ToolSpec {
            name: TRANSFER_CALL.into(),
            description: "Transfer the caller to another phone number (a human agent), after \
                          telling them so."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "number": {"type": "string", "description": "E.164 number; omit for the default desk."},
                    "message": {"type": "string", "description": "What to say before transferring."}
                }
            }),
        });
    }
    tools.push(ToolSpec {
        name: GET_CALL_DETAILS.into(),
        description: "Look up the details of this call: caller and callee numbers, direction, \
                      metadata and dynamic variables."
            .into(),
        parameters: json!({"type": "object", "properties": {}}),
    });
    tools.push(ToolSpec {
        name: GET_CURRENT_TIME.into(),
        description: "The current date and time (UTC).".into(),
        parameters: json!({"type": "object", "properties": {}}),
    });
    tools
}

/// The tools offered to the model: the built-ins and the MCP endpoint's tools (when
/// `mcp_tools` is on), named through one [`ToolRegistry`] so an MCP tool whose name clashes
/// with a built-in (or with another MCP server's tool) gets a distinct, deterministic name
/// (`_2`, `_3`...; the built-ins keep theirs), and its call is routed back to its connection.
#[derive(Debug)]
pub(crate) struct Offered {
    registry: ToolRegistry,
    specs: Vec<ToolSpec>,
}

/// Where a model's tool call goes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Route {
    /// A built-in (or an unknown name, which [`run`] answers with an error).
    BuiltIn,
    /// An MCP endpoint tool: run by the provider runner as `ProviderRequest::CallTool`.
    Server {
        /// The connection's key.
        source: String,
        /// The tool's own name there.
        name: String,
        /// Arguments checked against its schema.
        arguments: Value,
    },
    /// An MCP endpoint tool called with arguments its schema refuses: this is the result.
    Refused(String),
}

impl Offered {
    /// The built-ins of `cfg` and `server`'s tools.
    pub(crate) fn new(cfg: &RetellConfig, server: Vec<ServerToolDefinition>) -> Self {
        let mut registry = ToolRegistry::new();
        let builtins = specs(cfg)
            .into_iter()
            .map(|t| Tool::new(t.name, t.description, t.parameters))
            .collect();
        let _ = registry.set_source_tools(ToolSource::Server, builtins);
        let mut by_source: BTreeMap<String, Vec<Tool>> = BTreeMap::new();
        for t in server {
            by_source.entry(t.source).or_default().push(Tool::new(
                t.name,
                t.description,
                t.parameters,
            ));
        }
        for (key, tools) in by_source {
            for r in registry.set_source_tools(ToolSource::Mcp(key), tools) {
                tracing::warn!(%r, "Retell: MCP tools left out");
            }
        }
        let specs = registry
            .llm_tools()
            .map(|t| ToolSpec {
                name: t.llm_name().to_owned(),
                description: t.tool().description.clone(),
                parameters: t.tool().input_schema.clone(),
            })
            .collect();
        Self { registry, specs }
    }

    /// What the model is offered.
    pub(crate) fn specs(&self) -> &[ToolSpec] {
        &self.specs
    }

    /// Where the model's call of `llm_name` goes.
    pub(crate) fn route(&self, llm_name: &str, args: &Value) -> Route {
        match self.registry.by_llm_name(llm_name).map(|t| t.source()) {
            Some(ToolSource::Mcp(_)) => match self.registry.prepare_call(llm_name, args.clone()) {
                Ok(p) => match p.source {
                    ToolSource::Mcp(source) => Route::Server {
                        source,
                        name: p.name,
                        arguments: p.arguments,
                    },
                    _ => Route::BuiltIn,
                },
                Err(e) => Route::Refused(
                    serde_json::to_string(&e.payload().to_value())
                        .unwrap_or_else(|_| e.to_string()),
                ),
            },
            _ => Route::BuiltIn,
        }
    }
}

/// What a tool call does.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ToolOutcome {
    /// A result for the model; the response continues.
    Result(String),
    /// Finish the response with `end_call: true`, saying `message` first.
    EndCall { message: String },
    /// Finish the response with `transfer_number`, saying `message` first.
    Transfer { number: String, message: String },
}

fn str_arg(args: &Value, key: &str) -> String {
    args.get(key)
        .and_then(Value::as_str)
        .map(str::trim)
        .unwrap_or_default()
        .to_owned()
}

/// Runs one tool call; `unix_now` is the wall time in seconds since the Unix epoch (the
/// caller reads the clock, so this stays testable).
pub(crate) fn run(
    cfg: &RetellConfig,
    call: Option<&Call>,
    name: &str,
    args: &Value,
    unix_now: u64,
) -> ToolOutcome {
    if !args.is_object() {
        return ToolOutcome::Result(
            json!({"error": "the arguments must be a JSON object"}).to_string(),
        );
    }
    match name {
        END_CALL if cfg.end_call_tool => ToolOutcome::EndCall {
            message: str_arg(args, "message"),
        },
        TRANSFER_CALL if cfg.transfer_tool => {
            let mut number = str_arg(args, "number");
            if number.is_empty() {
                number.clone_from(&cfg.transfer_number);
            }
            if number.is_empty() {
                return ToolOutcome::Result(
                    json!({"error": "no number given and no default transfer number is configured"})
                        .to_string(),
                );
            }
            ToolOutcome::Transfer {
                number,
                message: str_arg(args, "message"),
            }
        }
        GET_CALL_DETAILS => ToolOutcome::Result(call_details(call).to_string()),
        GET_CURRENT_TIME => {
            ToolOutcome::Result(json!({"utc": rfc3339(unix_now), "unix": unix_now}).to_string())
        }
        other => {
            ToolOutcome::Result(json!({"error": format!("unknown tool {other:?}")}).to_string())
        }
    }
}

fn call_details(call: Option<&Call>) -> Value {
    let Some(c) = call else {
        return json!({"error": "Retell has not sent the call details"});
    };
    let mut v = json!({
        "call_id": c.call_id,
        "agent_id": c.agent_id,
        "call_type": c.call_type.as_str(),
        "call_status": c.call_status,
    });
    if let Some(map) = v.as_object_mut() {
        for (k, val) in [
            ("direction", &c.direction),
            ("from_number", &c.from_number),
            ("to_number", &c.to_number),
        ] {
            if let Some(val) = val {
                map.insert(k.into(), Value::String(val.clone()));
            }
        }
        if let Some(m) = &c.metadata {
            map.insert("metadata".into(), m.clone());
        }
        if let Some(vars) = &c.retell_llm_dynamic_variables {
            map.insert("dynamic_variables".into(), json!(vars));
        }
    }
    v
}

/// `secs` since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ` (proleptic Gregorian, UTC).
fn rfc3339(secs: u64) -> String {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    // Civil-from-days (Howard Hinnant's algorithm), in unsigned arithmetic since days >= 0.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The system prompt with `{{name}}` replaced by the call's dynamic variables.
pub(crate) fn system_prompt(template: &str, call: Option<&Call>) -> String {
    let mut prompt = template.to_owned();
    if let Some(vars) = call.and_then(|c| c.retell_llm_dynamic_variables.as_ref()) {
        for (k, v) in vars {
            prompt = prompt.replace(&format!("{{{{{k}}}}}"), v);
        }
    }
    prompt
}

/// How much of Retell's transcript the model sees (`context_max_utterances`,
/// `context_max_chars`): the newest entries that fit both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ContextBound {
    /// Transcript entries (utterances, tool results) at most.
    pub(crate) max_entries: usize,
    /// Characters of content and tool call arguments at most.
    pub(crate) max_chars: usize,
}

impl ContextBound {
    /// The bound configured for the door.
    pub(crate) fn from_config(cfg: &RetellConfig) -> Self {
        Self {
            max_entries: cfg.context_max_utterances.max(1),
            max_chars: cfg.context_max_chars.max(1),
        }
    }
}

/// The model's context for a request: the system prompt, then the newest part of Retell's
/// transcript that fits `bound` (woven with earlier tool calls when Retell sent them), plus the
/// reminder turn for reminders.
///
/// Retell's transcript is the truth about what was said (it reflects interruptions), so the
/// context is rebuilt from it for every request instead of keeping a history here. It arrives
/// whole with every request and grows with the call, hence the bound.
pub(crate) fn context(system: &str, g: &Generate, bound: ContextBound) -> Vec<ContextMessage> {
    let mut body = Vec::new();
    match &g.transcript_with_tool_calls {
        Some(items) if !items.is_empty() => woven(items, &mut body),
        _ => {
            for u in &g.transcript {
                push_utterance(&mut body, &u.role, &u.content);
            }
        }
    }
    keep_newest(&mut body, bound);
    let mut out = Vec::with_capacity(body.len() + 2);
    out.push(ContextMessage::new(ChatRole::System, system));
    out.append(&mut body);
    if g.kind == voxgate_retell::RequestKind::Reminder {
        out.push(ContextMessage::new(
            ChatRole::User,
            voxgate_retell::REMINDER_PROMPT,
        ));
    }
    out
}

/// Characters one message costs against [`ContextBound::max_chars`].
fn message_chars(m: &ContextMessage) -> usize {
    let calls: usize = m
        .tool_calls
        .iter()
        .map(|c| c.name.chars().count() + c.arguments.to_string().chars().count())
        .sum();
    m.content.chars().count() + calls
}

/// Drops the oldest messages until the rest fit `bound`. The newest message always stays (cut
/// to its last `max_chars` characters if it alone is too long), and a tool result whose call
/// was dropped goes too: chat APIs reject an answer to a call they did not see.
fn keep_newest(body: &mut Vec<ContextMessage>, bound: ContextBound) {
    let mut start = body.len();
    let mut chars = 0usize;
    while let Some(m) = start.checked_sub(1).and_then(|i| body.get(i)) {
        let cost = message_chars(m);
        let kept = body.len() - start;
        if kept == bound.max_entries || (kept > 0 && chars + cost > bound.max_chars) {
            break;
        }
        chars += cost;
        start -= 1;
    }
    body.drain(..start);
    let orphans = body.iter().take_while(|m| m.role == ChatRole::Tool).count();
    body.drain(..orphans);
    if let [only] = body.as_mut_slice()
        && chars > bound.max_chars
    {
        let len = only.content.chars().count();
        let skip = len.saturating_sub(bound.max_chars);
        if let Some((at, _)) = only.content.char_indices().nth(skip) {
            only.content.drain(..at);
        }
    }
}

fn push_utterance(out: &mut Vec<ContextMessage>, role: &Role, content: &str) {
    let role = match role {
        Role::Agent => ChatRole::Assistant,
        Role::User => ChatRole::User,
        // Other speakers (transfer targets, system notices): still something the model
        // should know about, and never instructions.
        _ => ChatRole::User,
    };
    if content.is_empty() {
        return;
    }
    out.push(ContextMessage::new(role, content));
}

/// Speech and tool calls in order. Invocations attach to the assistant message before them;
/// only calls with a result are kept (chat APIs reject an unanswered tool call).
fn woven(items: &[TranscriptItem], out: &mut Vec<ContextMessage>) {
    let answered: std::collections::HashSet<&str> = items
        .iter()
        .filter_map(|i| match i {
            TranscriptItem::ToolCallResult { tool_call_id, .. } => Some(tool_call_id.as_str()),
            _ => None,
        })
        .collect();
    let mut invoked = std::collections::HashSet::new();
    for item in items {
        match item {
            TranscriptItem::Utterance(u) => push_utterance(out, &u.role, &u.content),
            TranscriptItem::ToolCallInvocation {
                tool_call_id,
                name,
                arguments,
            } if answered.contains(tool_call_id.as_str()) => {
                invoked.insert(tool_call_id.clone());
                let call = ContextToolCall {
                    id: tool_call_id.clone(),
                    name: name.clone(),
                    arguments: serde_json::from_str(arguments)
                        .unwrap_or_else(|_| Value::String(arguments.clone())),
                };
                match out.last_mut() {
                    Some(m) if m.role == ChatRole::Assistant => m.tool_calls.push(call),
                    _ => {
                        let mut m = ContextMessage::new(ChatRole::Assistant, "");
                        m.tool_calls.push(call);
                        out.push(m);
                    }
                }
            }
            TranscriptItem::ToolCallResult {
                tool_call_id,
                content,
            } if invoked.contains(tool_call_id) => {
                let mut m = ContextMessage::new(ChatRole::Tool, content.clone());
                m.tool_call_id = Some(tool_call_id.clone());
                out.push(m);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use voxgate_retell::{RequestKind, Utterance};

    #[test]
    fn mcp_tools_clashing_with_built_ins_get_distinct_names_and_route_to_their_source() {
        let cfg = RetellConfig::default();
        let server = |source: &str, name: &str| ServerToolDefinition {
            source: source.into(),
            name: name.into(),
            description: String::new(),
            parameters: json!({"type":"object","properties":{"x":{"type":"integer"}},"required":["x"]}),
        };
        let offered = Offered::new(
            &cfg,
            vec![server("b", "weather.get"), server("a", GET_CURRENT_TIME)],
        );
        let names: Vec<&str> = offered.specs().iter().map(|t| t.name.as_str()).collect();
        let builtins = specs(&cfg);
        assert_eq!(
            &names[..builtins.len()],
            builtins.iter().map(|t| t.name.as_str()).collect::<Vec<_>>()
        );
        assert_eq!(
            &names[builtins.len()..],
            ["get_current_time_2", "weather_get"]
        );
        assert_eq!(offered.route(GET_CURRENT_TIME, &json!({})), Route::BuiltIn);
        assert_eq!(offered.route("no_such_tool", &json!({})), Route::BuiltIn);
        assert_eq!(
            offered.route("get_current_time_2", &json!({"x": 1})),
            Route::Server {
                source: "a".into(),
                name: GET_CURRENT_TIME.into(),
                arguments: json!({"x": 1}),
            }
        );
        assert!(matches!(
            offered.route("weather_get", &json!({"x": "one"})),
            Route::Refused(_)
        ));
    }

    const WIDE: ContextBound = ContextBound {
        max_entries: 1000,
        max_chars: 1_000_000,
    };

    fn plain(n: usize, len: usize) -> Generate {
        Generate {
            response_id: 1,
            kind: RequestKind::Response,
            transcript: (0..n)
                .map(|i| {
                    let role = if i % 2 == 0 { Role::User } else { Role::Agent };
                    Utterance::new(role, format!("{i:0len$}"))
                })
                .collect(),
            transcript_with_tool_calls: None,
        }
    }

    #[test]
    fn the_context_keeps_the_newest_utterances_that_fit() {
        let bound = ContextBound {
            max_entries: 50,
            max_chars: 16_000,
        };
        // 200 utterances of 10 chars: the entry count binds.
        let c = context("sys", &plain(200, 10), bound);
        assert_eq!(c.len(), 51);
        assert_eq!(c[0].role, ChatRole::System);
        assert_eq!(c[1].content, format!("{:010}", 150));
        assert_eq!(c[50].content, format!("{:010}", 199));
        // 100 utterances of 1,000 chars: the character budget binds (16 fit).
        let c = context("sys", &plain(100, 1000), bound);
        assert_eq!(c.len(), 17);
        assert_eq!(c[16].content, format!("{:01000}", 99));
        let chars: usize = c[1..].iter().map(|m| m.content.len()).sum();
        assert!(chars <= 16_000);
        // The reminder turn comes after the bound, so it is never cut.
        let mut g = plain(100, 10);
        g.kind = RequestKind::Reminder;
        let c = context("sys", &g, bound);
        assert_eq!(c.len(), 52);
        assert_eq!(c[51].content, voxgate_retell::REMINDER_PROMPT);
        // A short call is untouched.
        assert_eq!(context("sys", &plain(3, 5), bound).len(), 4);
    }

    #[test]
    fn one_huge_utterance_keeps_its_end() {
        let bound = ContextBound {
            max_entries: 50,
            max_chars: 10,
        };
        let mut g = plain(2, 1);
        g.transcript.push(Utterance::new(
            Role::User,
            format!("{}é-the end", "x".repeat(100)),
        ));
        let c = context("sys", &g, bound);
        assert_eq!(c.len(), 2);
        assert_eq!(c[1].content, "xé-the end");
    }

    #[test]
    fn a_tool_result_whose_call_was_cut_off_is_dropped() {
        let items = vec![
            TranscriptItem::Utterance(Utterance::new(Role::User, "time?")),
            TranscriptItem::Utterance(Utterance::new(Role::Agent, "Let me check.")),
            TranscriptItem::ToolCallInvocation {
                tool_call_id: "t1".into(),
                name: "get_current_time".into(),
                arguments: "{}".into(),
            },
            TranscriptItem::ToolCallResult {
                tool_call_id: "t1".into(),
                content: "noon".into(),
            },
            TranscriptItem::Utterance(Utterance::new(Role::Agent, "It is noon.")),
        ];
        let g = generate(RequestKind::Response, Some(items));
        // Three entries: the assistant message with the call, its result, the answer.
        let three = ContextBound {
            max_entries: 3,
            max_chars: 1000,
        };
        let c = context("sys", &g, three);
        assert_eq!(c.len(), 4);
        assert_eq!(c[1].tool_calls.len(), 1);
        assert_eq!(c[2].tool_call_id.as_deref(), Some("t1"));
        // Two entries would start with the result of a call the model cannot see: it goes.
        let two = ContextBound {
            max_entries: 2,
            max_chars: 1000,
        };
        let c = context("sys", &g, two);
        assert_eq!(c.len(), 2);
        assert_eq!(c[1].content, "It is noon.");
    }

    fn generate(kind: RequestKind, items: Option<Vec<TranscriptItem>>) -> Generate {
        Generate {
            response_id: 3,
            kind,
            transcript: vec![
                Utterance::new(Role::User, "hello"),
                Utterance::new(Role::Agent, "hi"),
            ],
            transcript_with_tool_calls: items,
        }
    }

    #[test]
    fn context_from_plain_and_woven_transcripts() {
        let c = context("sys", &generate(RequestKind::Reminder, None), WIDE);
        let roles: Vec<_> = c.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [
                ChatRole::System,
                ChatRole::User,
                ChatRole::Assistant,
                ChatRole::User
            ]
        );
        assert_eq!(c[3].content, voxgate_retell::REMINDER_PROMPT);

        let items = vec![
            TranscriptItem::Utterance(Utterance::new(Role::User, "time?")),
            TranscriptItem::Utterance(Utterance::new(Role::Agent, "Let me check.")),
            TranscriptItem::ToolCallInvocation {
                tool_call_id: "t1".into(),
                name: "get_current_time".into(),
                arguments: "{}".into(),
            },
            TranscriptItem::ToolCallResult {
                tool_call_id: "t1".into(),
                content: "noon".into(),
            },
            // Never answered: dropped, or the chat API would refuse the context.
            TranscriptItem::ToolCallInvocation {
                tool_call_id: "t2".into(),
                name: "x".into(),
                arguments: "{".into(),
            },
            TranscriptItem::ToolCallResult {
                tool_call_id: "stray".into(),
                content: "?".into(),
            },
        ];
        let c = context("sys", &generate(RequestKind::Response, Some(items)), WIDE);
        assert_eq!(c.len(), 4);
        assert_eq!(c[2].tool_calls.len(), 1);
        assert_eq!(c[2].tool_calls[0].arguments, json!({}));
        assert_eq!(c[3].tool_call_id.as_deref(), Some("t1"));
    }

    #[test]
    fn tools_and_their_outcomes() {
        let mut cfg = RetellConfig::default();
        let names: Vec<_> = specs(&cfg).into_iter().map(|t| t.name).collect();
        assert_eq!(
            names,
            [END_CALL, TRANSFER_CALL, GET_CALL_DETAILS, GET_CURRENT_TIME]
        );
        assert_eq!(
            run(&cfg, None, END_CALL, &json!({"message": "Bye!"}), 0),
            ToolOutcome::EndCall {
                message: "Bye!".into()
            }
        );
        assert!(matches!(
            run(&cfg, None, TRANSFER_CALL, &json!({}), 0),
            ToolOutcome::Result(r) if r.contains("no number")
        ));
        cfg.transfer_number = "+15550100".into();
        assert_eq!(
            run(&cfg, None, TRANSFER_CALL, &json!({}), 0),
            ToolOutcome::Transfer {
                number: "+15550100".into(),
                message: String::new()
            }
        );
        assert!(matches!(
            run(&cfg, None, "nope", &json!({}), 0),
            ToolOutcome::Result(r) if r.contains("unknown tool")
        ));
        assert!(matches!(
            run(&cfg, None, END_CALL, &json!("{"), 0),
            ToolOutcome::Result(r) if r.contains("JSON object")
        ));
        cfg.end_call_tool = false;
        assert!(matches!(
            run(&cfg, None, END_CALL, &json!({}), 0),
            ToolOutcome::Result(_)
        ));
    }

    #[test]
    fn dates_and_prompt_variables() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        let call = Call {
            retell_llm_dynamic_variables: Some([("name".to_owned(), "Ada".to_owned())].into()),
            ..Call::default()
        };
        assert_eq!(
            system_prompt("Hi {{name}}, {{other}}", Some(&call)),
            "Hi Ada, {{other}}"
        );
    }
}
