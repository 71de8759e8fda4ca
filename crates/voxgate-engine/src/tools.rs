//! The tools machine: which tools the model is offered (client, device and server-side), the
//! device's MCP client, and the tool calls in flight with where each was sent.
//!
//! Server-side tools (external MCP servers' tools, [`crate::ServerToolDefinition`]) share the
//! one registry, each source as [`ToolSource::Mcp`] with its key, so a name clash with a
//! client or device tool, or between two sources, gets a distinct deterministic model-facing
//! name (the client's and device's tools keep theirs). A call to one goes out as a
//! [`crate::ProviderRequest::CallTool`] to the source it came from; this machine decides that,
//! the host only runs it.
//!
//! Bounded: calls come from the model (one per `ToolCall` event of a generation), never from
//! the client, and each leaves the table when it is answered, cancelled by the turn machine or
//! the session closes; a client answering an id not in the table is refused. The device's tool
//! list is replaced, not appended, on each `tools/list`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Instant;

use serde_json::Value;
use voxgate_mcp::client::{CallError, CallId, ClientConfig, ClientOutput, McpClient};
use voxgate_mcp::jsonrpc::ErrorObject;
use voxgate_mcp::model::Tool;
use voxgate_mcp::registry::{PreparedCall, RejectedTool, ToolRegistry, ToolSource};

use crate::provider::ToolSpec;
use crate::telemetry::{ToolKind, ToolOutcome};
use crate::types::{
    ClientEvent, ErrorCategory, InputError, RequestId, ServerToolDefinition, ToolDefinition, TurnId,
};

/// One call in flight.
#[derive(Debug, Clone)]
struct Call {
    source: ToolSource,
    device_call: Option<CallId>,
    /// What telemetry reports when it ends.
    info: CallInfo,
}

/// What telemetry needs of a call in flight ([`crate::TurnEvent::ToolCall`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CallInfo {
    /// The response that called it.
    pub(crate) turn: TurnId,
    /// Who runs it; `None` for a call refused before it ran (no round trip to report).
    pub(crate) kind: Option<ToolKind>,
    /// The tool's own name.
    pub(crate) name: String,
    /// When it was sent.
    pub(crate) started: Instant,
}

/// A model's tool call checked against the registry.
#[derive(Debug)]
pub(crate) struct Prepared {
    /// The tool's own name (the model's name when the tool is unknown), for history.
    pub(crate) name: String,
    /// The arguments as validated (as the model sent them when refused), for history.
    pub(crate) arguments: Value,
    /// The call, or the JSON error payload the model gets as its result.
    outcome: Result<PreparedCall, String>,
}

/// Where a call went.
#[derive(Debug, PartialEq)]
pub(crate) enum Dispatch {
    /// Send this to the client; its answer comes as `Input::ToolResult`.
    Client(ClientEvent),
    /// Sent to the device over MCP; its answer comes from [`Tools::poll`].
    Device,
    /// A declared action: invoke it through [`crate::actions::Actions`].
    Action {
        /// The action's id.
        name: String,
        /// Validated parameters.
        arguments: Value,
    },
    /// A server-side tool: the engine sends it as `ProviderRequest::CallTool` and reports the
    /// request with [`Tools::server_call_sent`].
    Server {
        /// The source key (which connection runs it).
        source: String,
        /// The tool's own name there.
        name: String,
        /// Validated arguments.
        arguments: Value,
    },
    /// Not run: this error text is its result, given to the model once generation ends.
    Refused(String),
}

/// What the tools machine reports.
#[derive(Debug, PartialEq)]
pub(crate) enum ToolsEvent {
    /// Send to the client (device MCP traffic, errors).
    Client(ClientEvent),
    /// A device call answered (or timed out).
    Finished {
        /// The model's call id.
        call_id: String,
        /// Its result text for history.
        text: String,
        /// How it ended.
        outcome: ToolOutcome,
    },
}

/// The tool registry, the device MCP client and the calls in flight.
#[derive(Debug)]
pub(crate) struct Tools {
    registry: ToolRegistry,
    mcp: Option<McpClient>,
    calls: BTreeMap<String, Call>,
    device_calls: BTreeMap<CallId, String>,
    /// Events of one device output waiting for [`Tools::poll`] (errors of a tool listing).
    queued: VecDeque<ToolsEvent>,
    /// Until when a first reply waits for the device's first tool listing: set when the device
    /// MCP client starts, cleared when the listing (or its failure) arrives.
    first_listing: Option<Instant>,
    /// Keys of the server-side sources now in the registry.
    server_sources: BTreeSet<String>,
    /// Server-side calls in flight: the model's call id to its provider request, and back.
    server_calls: BTreeMap<String, RequestId>,
    server_requests: BTreeMap<RequestId, String>,
}

/// How long a reply waits for a just-connected device's tools. A device answers `tools/list`
/// within tens of milliseconds of its hello; a text turn sent right after the hello would
/// otherwise be answered without the device's tools.
pub(crate) const FIRST_LISTING_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

impl Tools {
    /// No tools, no device.
    pub(crate) fn new() -> Self {
        Self {
            registry: ToolRegistry::new(),
            mcp: None,
            calls: BTreeMap::new(),
            device_calls: BTreeMap::new(),
            queued: VecDeque::new(),
            first_listing: None,
            server_sources: BTreeSet::new(),
            server_calls: BTreeMap::new(),
            server_requests: BTreeMap::new(),
        }
    }

    /// While a just-started device has not listed its tools yet: the deadline a reply may wait
    /// for them until.
    pub(crate) fn awaiting_first_listing(&self, now: Instant) -> Option<Instant> {
        self.first_listing.filter(|deadline| now < *deadline)
    }

    /// The deadline of [`Self::awaiting_first_listing`], for `poll_timeout`.
    pub(crate) fn first_listing_deadline(&self) -> Option<Instant> {
        self.first_listing
    }

    /// The tools offered to the model, with the names it sees.
    pub(crate) fn llm_tools(&self) -> Vec<ToolSpec> {
        self.registry
            .llm_tools()
            .map(|t| ToolSpec {
                name: t.llm_name().to_owned(),
                description: t.tool().description.clone(),
                parameters: t.tool().input_schema.clone(),
            })
            .collect()
    }

    /// Replaces the client's tools; the errors report definitions the registry refused.
    pub(crate) fn set_client_tools(&mut self, tools: Vec<ToolDefinition>) -> Vec<ClientEvent> {
        let tools = tools
            .into_iter()
            .map(|t| Tool::new(t.name, t.description, t.parameters))
            .collect();
        self.registry
            .set_source_tools(ToolSource::Client, tools)
            .into_iter()
            .map(|rejected| ClientEvent::Error {
                category: ErrorCategory::Configuration,
                message: rejected.to_string(),
            })
            .collect()
    }

    /// Replaces the declared actions offered as tools (source [`ToolSource::Action`]). A list
    /// the registry refuses whole (too many tools over all sources) removes the previous
    /// actions too, so the model is never offered actions the client no longer declares.
    pub(crate) fn set_action_tools(&mut self, tools: Vec<Tool>) -> Vec<RejectedTool> {
        let rejected = self.registry.set_source_tools(ToolSource::Action, tools);
        if rejected.iter().any(|r| r.name.is_empty()) {
            self.registry.remove_source(&ToolSource::Action);
        }
        rejected
    }

    /// Replaces every server-side tool. Sources no longer listed are removed first, then each
    /// source's tools are set (in key order, so naming is deterministic). The server checked
    /// these tools when its MCP server listed them; what this registry refuses still (a source
    /// that would take it over [`voxgate_mcp::registry::MAX_TOOLS`] with the client's and
    /// device's tools) is left out and returned for the host's log.
    pub(crate) fn set_server_tools(&mut self, tools: Vec<ServerToolDefinition>) -> Vec<String> {
        let mut by_source: BTreeMap<String, Vec<Tool>> = BTreeMap::new();
        for t in tools {
            by_source.entry(t.source).or_default().push(Tool::new(
                t.name,
                t.description,
                t.parameters,
            ));
        }
        for gone in self
            .server_sources
            .iter()
            .filter(|k| !by_source.contains_key(*k))
        {
            self.registry.remove_source(&ToolSource::Mcp(gone.clone()));
        }
        self.server_sources = by_source.keys().cloned().collect();
        let mut rejected = Vec::new();
        for (key, tools) in by_source {
            rejected.extend(
                self.registry
                    .set_source_tools(ToolSource::Mcp(key), tools)
                    .into_iter()
                    .map(|r| r.to_string()),
            );
        }
        rejected
    }

    /// The provider request now running the server-side call `call_id`.
    pub(crate) fn server_call_sent(&mut self, call_id: &str, request: RequestId) {
        if self.calls.contains_key(call_id) {
            self.server_calls.insert(call_id.to_owned(), request);
            self.server_requests.insert(request, call_id.to_owned());
        }
    }

    /// The call a server-side tool's provider request runs, while it is in flight.
    pub(crate) fn server_call_of(&self, request: RequestId) -> Option<&str> {
        self.server_requests.get(&request).map(String::as_str)
    }

    /// The provider request running the call `call_id`, if it is a server-side call in flight
    /// (to cancel it).
    pub(crate) fn server_request(&self, call_id: &str) -> Option<RequestId> {
        self.server_calls.get(call_id).copied()
    }

    /// Every server-side call's provider request in flight (the session closes).
    pub(crate) fn server_requests(&self) -> Vec<RequestId> {
        self.server_requests.keys().copied().collect()
    }

    fn forget_server_call(&mut self, call_id: &str) {
        if let Some(r) = self.server_calls.remove(call_id) {
            self.server_requests.remove(&r);
        }
    }

    /// Starts a fresh device MCP client (`initialize`, then `tools/list`).
    pub(crate) fn start_device(&mut self, now: Instant) {
        let mut client = McpClient::new(ClientConfig::default());
        // A fresh client cannot be started twice.
        let _ = client.start(now);
        self.mcp = Some(client);
        self.first_listing = Some(now + FIRST_LISTING_WAIT);
    }

    /// A JSON-RPC payload from the device.
    pub(crate) fn device_input(&mut self, now: Instant, payload: Value) -> Result<(), InputError> {
        let Some(m) = &mut self.mcp else {
            return Err(InputError::DeviceMcpNotStarted);
        };
        m.handle_input(now, voxgate_mcp::Input::Value(payload));
        Ok(())
    }

    /// The device MCP client's next deadline.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.mcp.as_ref().and_then(McpClient::poll_timeout)
    }

    /// Runs the device MCP client's timers.
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        if let Some(m) = &mut self.mcp {
            m.handle_timeout(now);
        }
    }

    /// Whether `call_id` is in flight (a model repeating an id is ignored).
    pub(crate) fn contains(&self, call_id: &str) -> bool {
        self.calls.contains_key(call_id)
    }

    /// Whether any call is in flight.
    pub(crate) fn pending(&self) -> bool {
        !self.calls.is_empty()
    }

    /// Whether a prepared call is a declared action's (cancelled on barge-in, unlike tools).
    pub(crate) fn is_action(prepared: &Prepared) -> bool {
        prepared
            .outcome
            .as_ref()
            .is_ok_and(|p| p.source == ToolSource::Action)
    }

    /// Checks a model's call against the registry.
    pub(crate) fn prepare(&self, llm_name: &str, arguments: Value) -> Prepared {
        match self.registry.prepare_call(llm_name, arguments.clone()) {
            Ok(p) => Prepared {
                name: p.name.clone(),
                arguments: p.arguments.clone(),
                outcome: Ok(p),
            },
            Err(e) => Prepared {
                name: llm_name.to_owned(),
                arguments,
                outcome: Err(serde_json::to_string(&e.payload().to_value())
                    .unwrap_or_else(|_| e.to_string())),
            },
        }
    }

    /// Sends a prepared call to its runner and tracks it until it is answered.
    pub(crate) fn dispatch(
        &mut self,
        now: Instant,
        call_id: &str,
        prepared: Prepared,
        turn: TurnId,
    ) -> Dispatch {
        let mut info = CallInfo {
            turn,
            kind: None,
            name: prepared.name,
            started: now,
        };
        let p = match prepared.outcome {
            Ok(p) => p,
            Err(payload) => {
                self.track(call_id, ToolSource::Server, None, info);
                return Dispatch::Refused(payload);
            }
        };
        let source = p.source.clone();
        info.kind = match &p.source {
            ToolSource::Client => Some(ToolKind::Client),
            ToolSource::Device => Some(ToolKind::Device),
            ToolSource::Action => Some(ToolKind::Action),
            ToolSource::Mcp(_) => Some(ToolKind::Mcp),
            _ => None,
        };
        let dispatch = match p.source {
            ToolSource::Client => Dispatch::Client(ClientEvent::ToolCallRequest {
                id: call_id.to_owned(),
                name: p.name,
                arguments: p.arguments,
                turn,
            }),
            ToolSource::Device => {
                let started = self
                    .mcp
                    .as_mut()
                    .map(|m| m.call_tool(now, &p.name, p.arguments));
                match started {
                    Some(Ok(n)) => {
                        self.device_calls.insert(n, call_id.to_owned());
                        self.track(call_id, source, Some(n), info);
                        return Dispatch::Device;
                    }
                    _ => {
                        info.kind = None;
                        Dispatch::Refused("the device is not connected".to_owned())
                    }
                }
            }
            ToolSource::Action => Dispatch::Action {
                name: p.name,
                arguments: p.arguments,
            },
            ToolSource::Mcp(key) => Dispatch::Server {
                source: key,
                name: p.name,
                arguments: p.arguments,
            },
            _ => Dispatch::Refused("no runner for this tool".to_owned()),
        };
        self.track(call_id, source, None, info);
        dispatch
    }

    fn track(
        &mut self,
        call_id: &str,
        source: ToolSource,
        device_call: Option<CallId>,
        info: CallInfo,
    ) {
        self.calls.insert(
            call_id.to_owned(),
            Call {
                source,
                device_call,
                info,
            },
        );
    }

    /// The call never ran after all (the action registry refused it): no round trip to
    /// report when it ends.
    pub(crate) fn not_run(&mut self, call_id: &str) {
        if let Some(c) = self.calls.get_mut(call_id) {
            c.info.kind = None;
        }
    }

    /// Whether `id` is a client call awaiting the client's answer.
    pub(crate) fn awaits_client(&self, id: &str) -> bool {
        self.calls
            .get(id)
            .is_some_and(|c| c.source == ToolSource::Client)
    }

    /// Removes an answered call; `None` when it was not in flight.
    pub(crate) fn finish(&mut self, call_id: &str) -> Option<CallInfo> {
        self.forget_server_call(call_id);
        self.calls.remove(call_id).map(|c| c.info)
    }

    /// Cancels a call the turn machine gave up on; `None` when it was not in flight.
    pub(crate) fn cancel(&mut self, call_id: &str) -> Option<CallInfo> {
        self.forget_server_call(call_id);
        let call = self.calls.remove(call_id)?;
        if let (Some(m), Some(n)) = (&mut self.mcp, call.device_call) {
            self.device_calls.remove(&n);
            m.cancel(n, "the reply was cut off");
        }
        Some(call.info)
    }

    /// The session is over: forgets the device and returns the calls still in flight.
    pub(crate) fn close(&mut self) -> Vec<(String, CallInfo)> {
        self.device_calls.clear();
        self.server_calls.clear();
        self.server_requests.clear();
        // The device is gone: its MCP client (and any cancel notices it queued) with it.
        self.mcp = None;
        std::mem::take(&mut self.calls)
            .into_iter()
            .map(|(id, c)| (id, c.info))
            .collect()
    }

    /// The next thing the device MCP client has to report.
    ///
    /// The tool list is replaced whenever the device lists it: at start, and again after each
    /// `notifications/tools/list_changed` (the client re-lists on its own); a failed re-list
    /// keeps the previous tools. Every other notification (Xiaozhi's `state_changed`,
    /// progress, logging) is ignored: nothing in a conversation depends on it. Requests from
    /// the device (sampling, roots, elicitation) are answered "method not found", since the
    /// engine offers none of them and the device must not wait for an answer. Protocol faults
    /// and failed handshakes are reported as errors; the session goes on.
    pub(crate) fn poll(&mut self) -> Option<ToolsEvent> {
        let protocol = |message: String| {
            Some(ToolsEvent::Client(ClientEvent::Error {
                category: ErrorCategory::Protocol,
                message,
            }))
        };
        loop {
            if let Some(event) = self.queued.pop_front() {
                return Some(event);
            }
            let out = self.mcp.as_mut().and_then(McpClient::poll_output)?;
            match out {
                ClientOutput::Transmit(m) => {
                    return Some(ToolsEvent::Client(ClientEvent::DeviceMcp(m)));
                }
                ClientOutput::ToolsListed(tools) => {
                    self.first_listing = None;
                    // One error per refused tool; the rest of the list is in effect.
                    let rejected = self.registry.set_source_tools(ToolSource::Device, tools);
                    self.queued.extend(rejected.into_iter().map(|r| {
                        ToolsEvent::Client(ClientEvent::Error {
                            category: ErrorCategory::Protocol,
                            message: r.to_string(),
                        })
                    }));
                }
                ClientOutput::ToolCallFinished { call, outcome, .. } => {
                    let Some(call_id) = self.device_calls.remove(&call) else {
                        continue;
                    };
                    let (text, outcome) = match outcome {
                        Ok(r) if r.is_error => (r.joined_text(), ToolOutcome::Error),
                        Ok(r) => (r.joined_text(), ToolOutcome::Ok),
                        Err(e) => (
                            format!("the device tool failed: {e}"),
                            if e == CallError::Timeout {
                                ToolOutcome::Timeout
                            } else {
                                ToolOutcome::Error
                            },
                        ),
                    };
                    return Some(ToolsEvent::Finished {
                        call_id,
                        text,
                        outcome,
                    });
                }
                ClientOutput::Request(r) => {
                    if let Some(m) = &mut self.mcp {
                        m.respond(
                            r.id,
                            Err(ErrorObject::new(
                                ErrorObject::METHOD_NOT_FOUND,
                                format!("{} is not supported", r.method),
                            )),
                        );
                    }
                }
                ClientOutput::InitializeFailed(e) => {
                    self.first_listing = None;
                    return protocol(format!("device MCP initialize failed: {e}"));
                }
                ClientOutput::ListToolsFailed(e) => {
                    self.first_listing = None;
                    return protocol(format!(
                        "device MCP tools/list failed, keeping the old tools: {e}"
                    ));
                }
                ClientOutput::PeerFault(f) => {
                    self.first_listing = None;
                    return protocol(format!("device MCP: {f}"));
                }
                // See above: notifications are ignored, and `Ready` / `Pong` need no action
                // (the client lists tools on ready by itself; the engine sends no pings).
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lamp() -> ToolDefinition {
        ToolDefinition {
            name: "home.lamp".into(),
            description: "Switch the lamp".into(),
            parameters: json!({"type": "object", "properties": {"on": {"type": "boolean"}}}),
        }
    }

    #[test]
    fn client_calls_go_to_the_client_and_wait_for_its_answer() {
        let now = Instant::now();
        let mut tools = Tools::new();
        assert!(tools.set_client_tools(vec![lamp()]).is_empty());
        let llm_name = tools.llm_tools()[0].name.clone();
        assert_ne!(llm_name, "home.lamp");
        let p = tools.prepare(&llm_name, json!({"on": true}));
        assert_eq!(p.name, "home.lamp");
        let d = tools.dispatch(now, "c1", p, TurnId(2));
        assert!(
            matches!(d, Dispatch::Client(ClientEvent::ToolCallRequest { ref name, .. }) if name == "home.lamp")
        );
        assert!(tools.contains("c1") && tools.awaits_client("c1") && tools.pending());
        let info = tools.finish("c1").unwrap();
        assert_eq!(
            (info.kind, info.name.as_str(), info.turn, info.started),
            (Some(ToolKind::Client), "home.lamp", TurnId(2), now)
        );
        assert!(tools.finish("c1").is_none());
        assert!(!tools.pending());
    }

    #[test]
    fn actions_are_their_own_source_and_a_refused_list_removes_the_old_one() {
        let now = Instant::now();
        let mut tools = Tools::new();
        let action = |name: String| Tool::new(name, "", json!({"type": "object"}));
        assert!(tools.set_client_tools(vec![lamp()]).is_empty());
        assert!(
            tools
                .set_action_tools(vec![action("open_settings".into())])
                .is_empty()
        );
        assert_eq!(tools.llm_tools().len(), 2);
        let p = tools.prepare("open_settings", json!(null));
        assert!(Tools::is_action(&p));
        assert!(matches!(
            tools.dispatch(now, "c1", p, TurnId(2)),
            Dispatch::Action { ref name, .. } if name == "open_settings"
        ));
        // Not a client tool call: `Input::ToolResult` cannot answer it.
        assert!(tools.contains("c1") && !tools.awaits_client("c1"));

        let too_many = (0..=voxgate_mcp::registry::MAX_TOOLS)
            .map(|i| action(format!("a{i}")))
            .collect();
        assert_eq!(tools.set_action_tools(too_many).len(), 1);
        let names: Vec<String> = tools.llm_tools().into_iter().map(|t| t.name).collect();
        assert_eq!(names, ["home_lamp"]);
    }

    #[test]
    fn unknown_and_unreachable_calls_are_refused_but_tracked() {
        let now = Instant::now();
        let mut tools = Tools::new();
        let p = tools.prepare("no_such_tool", json!({}));
        assert_eq!(p.name, "no_such_tool");
        assert!(matches!(
            tools.dispatch(now, "c1", p, TurnId(2)),
            Dispatch::Refused(_)
        ));
        // Refused calls stay until generation ends, but never wait for the client.
        assert!(tools.contains("c1") && !tools.awaits_client("c1"));
        // Refused before it ran: nothing to report as a round trip.
        assert_eq!(tools.cancel("c1").map(|i| i.kind), Some(None));
        assert!(tools.cancel("c1").is_none());
        assert_eq!(
            tools.device_input(now, json!({})),
            Err(InputError::DeviceMcpNotStarted)
        );
    }

    #[test]
    fn server_tools_clash_naming_and_routing() {
        let now = Instant::now();
        let mut tools = Tools::new();
        assert!(tools.set_client_tools(vec![lamp()]).is_empty());
        let server = |source: &str| ServerToolDefinition {
            source: source.into(),
            name: "home.lamp".into(),
            description: format!("lamp at {source}"),
            parameters: lamp().parameters,
        };
        assert!(
            tools
                .set_server_tools(vec![server("b"), server("a")])
                .is_empty()
        );
        let names: Vec<String> = tools.llm_tools().into_iter().map(|t| t.name).collect();
        assert_eq!(names, ["home_lamp", "home_lamp_2", "home_lamp_3"]);
        let p = tools.prepare("home_lamp_3", json!({"on": true}));
        let d = tools.dispatch(now, "c1", p, TurnId(1));
        assert_eq!(
            d,
            Dispatch::Server {
                source: "b".into(),
                name: "home.lamp".into(),
                arguments: json!({"on": true}),
            }
        );
        tools.server_call_sent("c1", RequestId(9));
        assert_eq!(tools.server_call_of(RequestId(9)), Some("c1"));
        assert_eq!(tools.server_request("c1"), Some(RequestId(9)));
        assert!(!tools.awaits_client("c1"));
        assert_eq!(tools.finish("c1").and_then(|i| i.kind), Some(ToolKind::Mcp));
        assert_eq!(tools.server_call_of(RequestId(9)), None);
        // Source `a` leaves: `b` keeps a distinct name, the client's stays plain.
        tools.set_server_tools(vec![server("b")]);
        let names: Vec<String> = tools.llm_tools().into_iter().map(|t| t.name).collect();
        assert_eq!(names, ["home_lamp", "home_lamp_2"]);
        tools.set_server_tools(Vec::new());
        assert_eq!(tools.llm_tools().len(), 1);
    }

    #[test]
    fn close_returns_every_call_in_flight_and_forgets_the_device() {
        let now = Instant::now();
        let mut tools = Tools::new();
        tools.start_device(now);
        assert!(matches!(
            tools.poll(),
            Some(ToolsEvent::Client(ClientEvent::DeviceMcp(_)))
        ));
        for id in ["a", "b"] {
            let p = tools.prepare("x", json!({}));
            tools.dispatch(now, id, p, TurnId(1));
        }
        let closed: Vec<String> = tools.close().into_iter().map(|(id, _)| id).collect();
        assert_eq!(closed, ["a", "b"]);
        assert!(!tools.pending());
        assert_eq!(tools.poll(), None);
        assert_eq!(tools.poll_timeout(), None);
    }
}
