//! The MCP server machine: exposes voxgate's tools to an MCP client.
//!
//! It answers `initialize`, `ping` and `tools/list` by itself (paging the way the Xiaozhi
//! firmware does: pages capped in bytes, `nextCursor` = the name of the first tool that did not
//! fit, absent on the last page; user-only tools only with `withUserTools`). A `tools/call` for
//! a known tool whose arguments pass the tool's schema becomes [`ServerOutput::CallTool`]; the
//! owner runs the tool and answers with [`McpServer::respond_call`]. Calls not answered within
//! their deadline are answered with a timeout error by the machine.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use crate::correlation::Correlation;
use crate::input::{self, Input, PeerFault};
use crate::jsonrpc::{ErrorObject, Id, Message, Notification, Request, Response};
use crate::model::{
    CallToolParams, CallToolResult, Implementation, InitializeParams, InitializeResult,
    ListToolsParams, ListToolsResult, PROTOCOL_VERSION_2024_11_05, SUPPORTED_PROTOCOL_VERSIONS,
    Tool, method,
};
use crate::registry::RejectedTool;
use crate::schema::{CompiledSchema, ErrorCode, ErrorPayload};

/// Server settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Who we are, sent in the `initialize` result.
    pub server_info: Implementation,
    /// Usage hints for the client's model.
    pub instructions: Option<String>,
    /// The version answered when the client asks for one we do not know.
    pub protocol_version: String,
    /// Soft cap on the bytes of tool JSON in one `tools/list` page (the firmware uses ~8000).
    /// A page always holds at least one tool.
    pub page_bytes: usize,
    /// Deadline for the owner to answer a `tools/call`; `None` waits forever.
    pub call_timeout: Option<Duration>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            server_info: Implementation::new("voxgate", env!("CARGO_PKG_VERSION")),
            instructions: None,
            protocol_version: PROTOCOL_VERSION_2024_11_05.to_owned(),
            page_bytes: 8000,
            call_timeout: Some(Duration::from_secs(30)),
        }
    }
}

/// Misuse of the server by its owner.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// No call with this id is waiting (already answered, cancelled or timed out).
    #[error("no pending call with id {0}")]
    UnknownCall(Id),
}

/// What the server wants done or wants known.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ServerOutput {
    /// Send this message to the client.
    Transmit(Message),
    /// The client initialized (its parameters, for logs and capability checks).
    Initialized(InitializeParams),
    /// Run this tool, then call [`McpServer::respond_call`] with `request`.
    CallTool {
        /// The request to answer.
        request: Id,
        /// The tool's name.
        name: String,
        /// Arguments, already validated against the tool's schema.
        arguments: Value,
    },
    /// The client cancelled a call: stop it; it must not be answered.
    CallCancelled {
        /// The cancelled request.
        request: Id,
    },
    /// A call was not answered in time; the client has been sent a timeout error.
    CallTimedOut {
        /// The request.
        request: Id,
        /// The tool's name.
        name: String,
    },
    /// A notification from the client other than the lifecycle and cancellation ones.
    Notification(Notification),
    /// The client broke the protocol (it has been answered with an error where it expected a
    /// reply); the session goes on.
    PeerFault(PeerFault),
}

#[derive(Debug, Clone)]
struct ServedTool {
    tool: Tool,
    schema: CompiledSchema,
    encoded_len: usize,
}

/// The sans-IO MCP server. See the crate docs for the drive loop.
#[derive(Debug, Clone)]
pub struct McpServer {
    config: ServerConfig,
    tools: Vec<ServedTool>,
    client: Option<InitializeParams>,
    pending: Correlation<String>,
    outputs: VecDeque<ServerOutput>,
}

impl McpServer {
    /// A server with no tools yet.
    pub fn new(config: ServerConfig) -> Self {
        McpServer {
            config,
            tools: Vec::new(),
            client: None,
            pending: Correlation::new(),
            outputs: VecDeque::new(),
        }
    }

    /// Replaces the tools served; those whose schema does not compile are left out and returned.
    /// An initialized client is told with `notifications/tools/list_changed`.
    pub fn set_tools(&mut self, tools: Vec<Tool>) -> Vec<RejectedTool> {
        let mut rejected = Vec::new();
        self.tools.clear();
        let mut seen = std::collections::HashSet::with_capacity(tools.len());
        for tool in tools {
            // A set, not a scan of the tools kept so far: linear in the number of tools.
            if !seen.insert(tool.name.clone()) {
                continue;
            }
            match CompiledSchema::compile(&tool.input_schema) {
                Ok(schema) => {
                    let encoded_len = serde_json::to_vec(&tool).map_or(0, |v| v.len());
                    self.tools.push(ServedTool {
                        tool,
                        schema,
                        encoded_len,
                    });
                }
                Err(error) => rejected.push(RejectedTool {
                    name: tool.name,
                    error: error.into(),
                }),
            }
        }
        if self.client.is_some() {
            self.transmit(Message::notification(method::TOOLS_LIST_CHANGED, None));
        }
        rejected
    }

    /// Answers a call announced by [`ServerOutput::CallTool`].
    pub fn respond_call(
        &mut self,
        request: &Id,
        result: &CallToolResult,
    ) -> Result<(), ServerError> {
        self.answer_call(request, Ok(to_value(result)))
    }

    /// Answers a call with a JSON-RPC error instead of a result.
    pub fn fail_call(&mut self, request: &Id, error: ErrorObject) -> Result<(), ServerError> {
        self.answer_call(request, Err(error))
    }

    /// Sends a notification (e.g. a progress or logging message).
    pub fn notify(&mut self, method: &str, params: Option<Value>) {
        self.transmit(Message::notification(method, params));
    }

    /// Feeds what the transport delivered.
    pub fn handle_input(&mut self, now: Instant, input: Input<'_>) {
        match input::messages(input) {
            None => {
                // Nobody is left to answer; forget the calls (the owner sees no more outputs
                // for them and may stop them).
                for (request, _) in self.pending.drain() {
                    self.outputs
                        .push_back(ServerOutput::CallCancelled { request });
                }
            }
            Some(Err(e)) => {
                self.transmit(Message::Response(e.to_response()));
                self.fault(PeerFault::Malformed(e));
            }
            Some(Ok(items)) => {
                // Batches are answered element by element: MCP dropped batching, and every
                // client matches replies by id.
                for item in items {
                    match item {
                        Ok(m) => self.handle_message(now, m),
                        Err(e) => {
                            let e = crate::jsonrpc::DecodeError::from(e);
                            self.transmit(Message::Response(e.to_response()));
                            self.fault(PeerFault::Malformed(e));
                        }
                    }
                }
            }
        }
    }

    /// Answers with a timeout error every call whose deadline is at or before `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        for (request, name) in self.pending.expire(now) {
            let payload = ErrorPayload::new(
                ErrorCode::Timeout,
                format!("tool {name} did not finish in time"),
            );
            self.transmit(Message::result(
                request.clone(),
                to_value(&payload.to_call_result()),
            ));
            self.outputs
                .push_back(ServerOutput::CallTimedOut { request, name });
        }
    }

    /// The next thing to do or know.
    pub fn poll_output(&mut self) -> Option<ServerOutput> {
        self.outputs.pop_front()
    }

    /// When [`McpServer::handle_timeout`] must be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.pending.next_deadline()
    }

    /// The client's `initialize` parameters, once received.
    pub fn client(&self) -> Option<&InitializeParams> {
        self.client.as_ref()
    }

    /// Calls waiting for the owner.
    pub fn pending_calls(&self) -> usize {
        self.pending.len()
    }

    fn answer_call(
        &mut self,
        request: &Id,
        outcome: Result<Value, ErrorObject>,
    ) -> Result<(), ServerError> {
        if self.pending.remove(request).is_none() {
            return Err(ServerError::UnknownCall(request.clone()));
        }
        self.transmit(Message::Response(Response {
            id: request.clone(),
            outcome,
        }));
        Ok(())
    }

    fn transmit(&mut self, m: Message) {
        self.outputs.push_back(ServerOutput::Transmit(m));
    }

    fn fault(&mut self, f: PeerFault) {
        self.outputs.push_back(ServerOutput::PeerFault(f));
    }

    fn reply_error(&mut self, id: Id, code: i64, message: impl Into<String>) {
        self.transmit(Message::error(id, ErrorObject::new(code, message)));
    }

    fn handle_message(&mut self, now: Instant, m: Message) {
        match m {
            Message::Request(r) => self.handle_request(now, r),
            Message::Notification(n) => match n.method.as_str() {
                method::INITIALIZED => {}
                method::CANCELLED => {
                    let id =
                        n.params
                            .as_ref()
                            .and_then(|p| p.get("requestId"))
                            .and_then(|v| match v {
                                Value::Number(n) => n.as_i64().map(Id::Number),
                                Value::String(s) => Some(Id::String(s.clone())),
                                _ => None,
                            });
                    // Cancelling something already answered is normal (the race is inherent).
                    if let Some(id) = id
                        && self.pending.remove(&id).is_some()
                    {
                        self.outputs
                            .push_back(ServerOutput::CallCancelled { request: id });
                    }
                }
                _ => self.outputs.push_back(ServerOutput::Notification(n)),
            },
            // We never send requests, so no reply can be expected.
            Message::Response(r) => self.fault(PeerFault::UnknownResponse(r.id)),
        }
    }

    fn handle_request(&mut self, now: Instant, r: Request) {
        match r.method.as_str() {
            method::INITIALIZE => self.handle_initialize(r),
            method::PING => self.transmit(Message::result(r.id, Value::Object(Map::new()))),
            method::TOOLS_LIST | method::TOOLS_CALL if self.client.is_none() => {
                self.reply_error(r.id, ErrorObject::INVALID_REQUEST, "initialize first");
                self.fault(PeerFault::NotInitialized(r.method));
            }
            method::TOOLS_LIST => self.handle_list(r),
            method::TOOLS_CALL => self.handle_call(now, r),
            _ => self.reply_error(
                r.id,
                ErrorObject::METHOD_NOT_FOUND,
                format!("Method not found: {}", r.method),
            ),
        }
    }

    fn handle_initialize(&mut self, r: Request) {
        let params: InitializeParams = match serde_json::from_value(r.params.unwrap_or(Value::Null))
        {
            Ok(p) => p,
            Err(e) => return self.reply_error(r.id, ErrorObject::INVALID_PARAMS, e.to_string()),
        };
        let protocol_version =
            if SUPPORTED_PROTOCOL_VERSIONS.contains(&params.protocol_version.as_str()) {
                params.protocol_version.clone()
            } else {
                self.config.protocol_version.clone()
            };
        let result = InitializeResult {
            protocol_version,
            capabilities: Map::from_iter([(
                "tools".to_owned(),
                Value::Object(Map::from_iter([(
                    "listChanged".to_owned(),
                    Value::Bool(true),
                )])),
            )]),
            server_info: self.config.server_info.clone(),
            instructions: self.config.instructions.clone(),
        };
        self.transmit(Message::result(r.id, to_value(&result)));
        self.client = Some(params.clone());
        self.outputs.push_back(ServerOutput::Initialized(params));
    }

    fn handle_list(&mut self, r: Request) {
        let params: ListToolsParams = match r.params {
            None | Some(Value::Null) => ListToolsParams::default(),
            Some(p) => match serde_json::from_value(p) {
                Ok(p) => p,
                Err(e) => {
                    return self.reply_error(r.id, ErrorObject::INVALID_PARAMS, e.to_string());
                }
            },
        };
        let with_user = params.with_user_tools.unwrap_or(false);
        let visible: Vec<&ServedTool> = self
            .tools
            .iter()
            .filter(|t| with_user || !t.tool.is_user_only())
            .collect();
        let start = if params.cursor.is_empty() {
            0
        } else {
            match visible.iter().position(|t| t.tool.name == params.cursor) {
                Some(i) => i,
                None => {
                    let message = format!("Unknown cursor: {}", params.cursor);
                    return self.reply_error(r.id, ErrorObject::INVALID_PARAMS, message);
                }
            }
        };
        let mut page = Vec::new();
        let mut used = 0usize;
        let mut next_cursor = None;
        for t in visible.iter().skip(start) {
            if !page.is_empty() && used + t.encoded_len > self.config.page_bytes {
                next_cursor = Some(t.tool.name.clone());
                break;
            }
            used += t.encoded_len + 1;
            page.push(t.tool.clone());
        }
        let result = ListToolsResult {
            tools: page,
            next_cursor,
        };
        self.transmit(Message::result(r.id, to_value(&result)));
    }

    fn handle_call(&mut self, now: Instant, r: Request) {
        let params: CallToolParams = match serde_json::from_value(r.params.unwrap_or(Value::Null)) {
            Ok(p) => p,
            Err(e) => return self.reply_error(r.id, ErrorObject::INVALID_PARAMS, e.to_string()),
        };
        let Some(t) = self.tools.iter().find(|t| t.tool.name == params.name) else {
            return self.reply_error(
                r.id,
                ErrorObject::INVALID_PARAMS,
                format!("Unknown tool: {}", params.name),
            );
        };
        // A model can fix its arguments when told what is wrong, so schema failures are tool
        // results with isError (what MCP prescribes), not protocol errors.
        if let Err(details) = t.schema.validate(&params.arguments) {
            let payload = ErrorPayload {
                code: ErrorCode::InvalidArguments,
                message: format!("arguments for {} do not match its schema", params.name),
                details,
            };
            return self.transmit(Message::result(r.id, to_value(&payload.to_call_result())));
        }
        let deadline = self.config.call_timeout.map(|d| now + d);
        if self
            .pending
            .insert(r.id.clone(), deadline, params.name.clone())
            .is_err()
        {
            self.reply_error(
                r.id.clone(),
                ErrorObject::INVALID_REQUEST,
                "request id already in use",
            );
            return self.fault(PeerFault::Malformed(
                crate::jsonrpc::InvalidMessage {
                    id: Some(r.id),
                    reason: "request id already in use",
                }
                .into(),
            ));
        }
        self.outputs.push_back(ServerOutput::CallTool {
            request: r.id,
            name: params.name,
            arguments: params.arguments,
        });
    }
}

fn to_value<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}
