//! The MCP client machine: drives a device's (or any) MCP server.
//!
//! Lifecycle: [`McpClient::start`] sends `initialize`; on its result the client sends
//! `notifications/initialized`, reports [`ClientOutput::Ready`] and (by default) lists the
//! tools, following `nextCursor` page by page until it is absent, then reports
//! [`ClientOutput::ToolsListed`] once with the whole list. Calls go out with
//! [`McpClient::call_tool`] and come back as [`ClientOutput::ToolCallFinished`], with a timeout
//! per call. Ids are always JSON numbers (the Xiaozhi firmware drops string ids).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::correlation::Correlation;
use crate::input::{self, Input, PeerFault};
use crate::jsonrpc::{ErrorObject, Id, Message, Notification, Request, Response};
use crate::model::{
    CallToolParams, CallToolResult, Implementation, InitializeParams, InitializeResult,
    ListToolsParams, ListToolsResult, PROTOCOL_VERSION_2024_11_05, Tool, Vision, method,
};

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Who we are, sent in `initialize`.
    pub client_info: Implementation,
    /// The protocol version asked for (Xiaozhi and the bridges speak `2024-11-05`).
    pub protocol_version: String,
    /// Client capabilities sent in `initialize`.
    pub capabilities: Map<String, Value>,
    /// Deadline for `initialize`, each `tools/list` page and `ping`.
    pub request_timeout: Duration,
    /// Default deadline for `tools/call` (taking a photo and asking a vision model is slow).
    pub call_timeout: Duration,
    /// Xiaozhi: also list user-only tools (they are still hidden from the model by the registry).
    pub with_user_tools: bool,
    /// List the tools as soon as the server is initialized.
    pub list_tools_on_ready: bool,
    /// List again when the server sends `notifications/tools/list_changed`.
    pub relist_on_change: bool,
    /// Stop paging after this many pages (a misbehaving server could page forever).
    pub max_pages: usize,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            client_info: Implementation::new("voxgate", env!("CARGO_PKG_VERSION")),
            protocol_version: PROTOCOL_VERSION_2024_11_05.to_owned(),
            capabilities: Map::new(),
            request_timeout: Duration::from_secs(10),
            call_timeout: Duration::from_secs(30),
            with_user_tools: false,
            list_tools_on_ready: true,
            relist_on_change: true,
            max_pages: 64,
        }
    }
}

impl ClientConfig {
    /// Adds Xiaozhi's `vision` capability (where the device POSTs photos). Some clients fail
    /// without it, so a Xiaozhi deployment should always set it.
    #[must_use]
    pub fn with_vision(mut self, vision: Vision) -> Self {
        let value = serde_json::to_value(vision).unwrap_or(Value::Null);
        self.capabilities.insert("vision".to_owned(), value);
        self
    }
}

/// Handle of an outgoing request: its JSON-RPC id, which is always a number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CallId(i64);

impl CallId {
    /// The id as sent on the wire.
    pub fn id(self) -> Id {
        Id::Number(self.0)
    }

    /// The numeric value.
    pub fn get(self) -> i64 {
        self.0
    }
}

/// Why a request produced no result.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// No reply before the deadline.
    #[error("timed out")]
    Timeout,
    /// The server answered with a JSON-RPC error (maybe without a code).
    #[error("server error: {0}")]
    Rpc(ErrorObject),
    /// The server answered with a result of the wrong shape.
    #[error("malformed result: {0}")]
    BadResult(String),
    /// The transport closed first.
    #[error("connection closed")]
    Closed,
}

/// Misuse of the client by its owner.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// `start` was called twice.
    #[error("already started")]
    AlreadyStarted,
    /// The server is not initialized yet.
    #[error("not initialized yet")]
    NotReady,
    /// The transport closed.
    #[error("connection closed")]
    Closed,
}

/// What the client wants done or wants known.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ClientOutput {
    /// Send this message to the server.
    Transmit(Message),
    /// `initialize` succeeded.
    Ready(InitializeResult),
    /// `initialize` failed; [`McpClient::start`] may be called again.
    InitializeFailed(CallError),
    /// The complete tool list, all pages joined.
    ToolsListed(Vec<Tool>),
    /// Listing failed; the previous list (if any) still stands.
    ListToolsFailed(CallError),
    /// A `tools/call` finished. A tool that ran and failed is `Ok` with `is_error` set.
    ToolCallFinished {
        /// Which call.
        call: CallId,
        /// The tool's name.
        name: String,
        /// The result.
        outcome: Result<CallToolResult, CallError>,
    },
    /// A `ping` finished.
    Pong {
        /// Which ping.
        call: CallId,
        /// `Ok` when the server answered.
        outcome: Result<(), CallError>,
    },
    /// A notification from the server (e.g. Xiaozhi's `notifications/state_changed`).
    Notification(Notification),
    /// A request from the server other than `ping`; answer it with [`McpClient::respond`].
    Request(Request),
    /// The server broke the protocol; the session goes on.
    PeerFault(PeerFault),
}

#[derive(Debug, Clone, PartialEq)]
enum Phase {
    Idle,
    Initializing,
    Ready,
    Closed,
}

#[derive(Debug, Clone)]
enum Pending {
    Initialize,
    ListPage,
    Call { call: CallId, name: String },
    Ping(CallId),
}

#[derive(Debug, Clone)]
struct Listing {
    request: Id,
    tools: Vec<Tool>,
    pages: usize,
    cursors: Vec<String>,
}

/// The sans-IO MCP client. See the crate docs for the drive loop.
#[derive(Debug, Clone)]
pub struct McpClient {
    config: ClientConfig,
    phase: Phase,
    next_id: i64,
    pending: Correlation<Pending>,
    listing: Option<Listing>,
    server: Option<InitializeResult>,
    tools: Vec<Tool>,
    outputs: VecDeque<ClientOutput>,
}

impl McpClient {
    /// A client that has sent nothing yet.
    pub fn new(config: ClientConfig) -> Self {
        McpClient {
            config,
            phase: Phase::Idle,
            next_id: 1,
            pending: Correlation::new(),
            listing: None,
            server: None,
            tools: Vec::new(),
            outputs: VecDeque::new(),
        }
    }

    /// Sends `initialize`. The device never speaks first, so this starts everything.
    pub fn start(&mut self, now: Instant) -> Result<(), ClientError> {
        match self.phase {
            Phase::Idle => {}
            Phase::Closed => return Err(ClientError::Closed),
            Phase::Initializing | Phase::Ready => return Err(ClientError::AlreadyStarted),
        }
        let params = InitializeParams {
            protocol_version: self.config.protocol_version.clone(),
            capabilities: self.config.capabilities.clone(),
            client_info: self.config.client_info.clone(),
        };
        self.phase = Phase::Initializing;
        let deadline = now + self.config.request_timeout;
        self.send_request(
            method::INITIALIZE,
            to_value(&params),
            deadline,
            Pending::Initialize,
        );
        Ok(())
    }

    /// Lists the tools again (a listing in progress is abandoned).
    pub fn list_tools(&mut self, now: Instant) -> Result<(), ClientError> {
        self.ensure_ready()?;
        self.request_page(now, String::new(), Vec::new(), 0, Vec::new());
        Ok(())
    }

    /// Calls a tool with the default deadline.
    pub fn call_tool(
        &mut self,
        now: Instant,
        name: &str,
        arguments: Value,
    ) -> Result<CallId, ClientError> {
        let timeout = self.config.call_timeout;
        self.call_tool_with_timeout(now, name, arguments, timeout)
    }

    /// Calls a tool with its own deadline.
    pub fn call_tool_with_timeout(
        &mut self,
        now: Instant,
        name: &str,
        arguments: Value,
        timeout: Duration,
    ) -> Result<CallId, ClientError> {
        self.ensure_ready()?;
        let params = CallToolParams {
            name: name.to_owned(),
            arguments,
        };
        let call = CallId(self.next_id);
        self.send_request(
            method::TOOLS_CALL,
            to_value(&params),
            now + timeout,
            Pending::Call {
                call,
                name: params.name,
            },
        );
        Ok(call)
    }

    /// Sends a `ping` (liveness check through every relay on the way).
    pub fn ping(&mut self, now: Instant) -> Result<CallId, ClientError> {
        self.ensure_ready()?;
        let call = CallId(self.next_id);
        let deadline = now + self.config.request_timeout;
        self.send_request(method::PING, None, deadline, Pending::Ping(call));
        Ok(call)
    }

    /// Gives up on a call (barge-in): no result will be reported for it, and the server is told
    /// with `notifications/cancelled` (the Xiaozhi firmware ignores it; MCP servers stop work).
    /// Returns false when the call was not in flight.
    pub fn cancel(&mut self, call: CallId, reason: &str) -> bool {
        if self.pending.remove(&call.id()).is_none() {
            return false;
        }
        let params = Value::Object(Map::from_iter([
            ("requestId".to_owned(), Value::from(call.0)),
            ("reason".to_owned(), Value::from(reason)),
        ]));
        self.transmit(Message::notification(method::CANCELLED, Some(params)));
        true
    }

    /// Answers a request the server sent ([`ClientOutput::Request`]).
    pub fn respond(&mut self, id: Id, outcome: Result<Value, ErrorObject>) {
        self.transmit(Message::Response(Response { id, outcome }));
    }

    /// Sends a notification.
    pub fn notify(&mut self, method: &str, params: Option<Value>) {
        self.transmit(Message::notification(method, params));
    }

    /// Feeds what the transport delivered.
    pub fn handle_input(&mut self, now: Instant, input: Input<'_>) {
        match input::messages(input) {
            None => self.close(),
            Some(Err(e)) => self.fault(PeerFault::Malformed(e)),
            Some(Ok(items)) => {
                for item in items {
                    match item {
                        Ok(m) => self.handle_message(now, m),
                        Err(e) => self.fault(PeerFault::Malformed(e.into())),
                    }
                }
            }
        }
    }

    /// Fails every request whose deadline is at or before `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        for (id, p) in self.pending.expire(now) {
            self.fail(&id, p, CallError::Timeout);
        }
    }

    /// The next thing to do or know.
    pub fn poll_output(&mut self) -> Option<ClientOutput> {
        self.outputs.pop_front()
    }

    /// When [`McpClient::handle_timeout`] must be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.pending.next_deadline()
    }

    /// Whether `initialize` has succeeded.
    pub fn is_ready(&self) -> bool {
        self.phase == Phase::Ready
    }

    /// What the server said about itself in `initialize`.
    pub fn server(&self) -> Option<&InitializeResult> {
        self.server.as_ref()
    }

    /// The last complete tool list.
    pub fn tools(&self) -> &[Tool] {
        &self.tools
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    fn ensure_ready(&self) -> Result<(), ClientError> {
        match self.phase {
            Phase::Ready => Ok(()),
            Phase::Closed => Err(ClientError::Closed),
            Phase::Idle | Phase::Initializing => Err(ClientError::NotReady),
        }
    }

    fn transmit(&mut self, m: Message) {
        self.outputs.push_back(ClientOutput::Transmit(m));
    }

    fn fault(&mut self, f: PeerFault) {
        self.outputs.push_back(ClientOutput::PeerFault(f));
    }

    fn send_request(
        &mut self,
        method: &str,
        params: Option<Value>,
        deadline: Instant,
        p: Pending,
    ) -> Id {
        // Skip ids still in flight: after 2^63 requests the counter wraps, and a long-lived
        // request must never be answered by a reply meant for a newer one.
        let mut id = Id::Number(self.next_id);
        while self.pending.contains(&id) {
            self.next_id = self.next_id.wrapping_add(1).max(1);
            id = Id::Number(self.next_id);
        }
        self.next_id = self.next_id.wrapping_add(1).max(1);
        // The loop above guarantees the id is free, so insertion cannot fail.
        let _ = self.pending.insert(id.clone(), Some(deadline), p);
        self.transmit(Message::request(id.clone(), method, params));
        id
    }

    fn request_page(
        &mut self,
        now: Instant,
        cursor: String,
        tools: Vec<Tool>,
        pages: usize,
        cursors: Vec<String>,
    ) {
        let params = ListToolsParams {
            cursor,
            with_user_tools: Some(self.config.with_user_tools),
        };
        let deadline = now + self.config.request_timeout;
        let request = self.send_request(
            method::TOOLS_LIST,
            to_value(&params),
            deadline,
            Pending::ListPage,
        );
        // A page of an abandoned listing may still be in flight; its reply or timeout is
        // dropped because it no longer matches `listing.request`.
        self.listing = Some(Listing {
            request,
            tools,
            pages,
            cursors,
        });
    }

    fn close(&mut self) {
        self.phase = Phase::Closed;
        for (id, p) in self.pending.drain() {
            self.fail(&id, p, CallError::Closed);
        }
        self.listing = None;
    }

    fn fail(&mut self, id: &Id, p: Pending, error: CallError) {
        let out = match p {
            Pending::Initialize => {
                if self.phase == Phase::Initializing {
                    self.phase = Phase::Idle;
                }
                ClientOutput::InitializeFailed(error)
            }
            Pending::ListPage => {
                if self.listing.take_if(|l| &l.request == id).is_none() {
                    return;
                }
                ClientOutput::ListToolsFailed(error)
            }
            Pending::Call { call, name } => ClientOutput::ToolCallFinished {
                call,
                name,
                outcome: Err(error),
            },
            Pending::Ping(call) => ClientOutput::Pong {
                call,
                outcome: Err(error),
            },
        };
        self.outputs.push_back(out);
    }

    fn handle_message(&mut self, now: Instant, m: Message) {
        match m {
            Message::Response(r) => self.handle_response(now, r),
            Message::Request(r) if r.method == method::PING => {
                self.respond(r.id, Ok(Value::Object(Map::new())));
            }
            Message::Request(r) => self.outputs.push_back(ClientOutput::Request(r)),
            Message::Notification(n) => {
                if n.method == method::TOOLS_LIST_CHANGED
                    && self.config.relist_on_change
                    && self.phase == Phase::Ready
                {
                    self.request_page(now, String::new(), Vec::new(), 0, Vec::new());
                }
                self.outputs.push_back(ClientOutput::Notification(n));
            }
        }
    }

    fn handle_response(&mut self, now: Instant, r: Response) {
        let Some(p) = self.pending.remove(&r.id) else {
            self.fault(PeerFault::UnknownResponse(r.id));
            return;
        };
        let result = match r.outcome {
            Ok(v) => v,
            Err(e) => return self.fail(&r.id, p, CallError::Rpc(e)),
        };
        match p {
            Pending::Initialize => match parse::<InitializeResult>(method::INITIALIZE, result) {
                Ok(init) => {
                    self.phase = Phase::Ready;
                    self.server = Some(init.clone());
                    self.outputs.push_back(ClientOutput::Ready(init));
                    self.notify(method::INITIALIZED, None);
                    if self.config.list_tools_on_ready {
                        self.request_page(now, String::new(), Vec::new(), 0, Vec::new());
                    }
                }
                Err((fault, error)) => {
                    self.fault(fault);
                    self.fail(&r.id, p, error);
                }
            },
            Pending::ListPage => self.handle_page(now, &r.id, result),
            Pending::Call { call, name } => {
                let outcome = parse::<CallToolResult>(method::TOOLS_CALL, result).map_err(
                    |(fault, error)| {
                        self.fault(fault);
                        error
                    },
                );
                self.outputs.push_back(ClientOutput::ToolCallFinished {
                    call,
                    name,
                    outcome,
                });
            }
            Pending::Ping(call) => self.outputs.push_back(ClientOutput::Pong {
                call,
                outcome: Ok(()),
            }),
        }
    }

    fn handle_page(&mut self, now: Instant, id: &Id, result: Value) {
        let Some(mut listing) = self.listing.take_if(|l| &l.request == id) else {
            // A page of a listing that was restarted since: nothing to do.
            return;
        };
        let page = match parse::<ListToolsResult>(method::TOOLS_LIST, result) {
            Ok(page) => page,
            Err((fault, error)) => {
                self.fault(fault);
                self.outputs.push_back(ClientOutput::ListToolsFailed(error));
                return;
            }
        };
        listing.tools.extend(page.tools);
        listing.pages += 1;
        match page.next_cursor.filter(|c| !c.is_empty()) {
            Some(cursor)
                if listing.cursors.contains(&cursor) || listing.pages >= self.config.max_pages =>
            {
                // Report the loop and keep what arrived: a partial list beats none.
                self.fault(PeerFault::PagingLoop(cursor));
                self.finish_listing(listing.tools);
            }
            Some(cursor) => {
                listing.cursors.push(cursor.clone());
                self.request_page(now, cursor, listing.tools, listing.pages, listing.cursors);
            }
            None => self.finish_listing(listing.tools),
        }
    }

    fn finish_listing(&mut self, tools: Vec<Tool>) {
        self.tools.clone_from(&tools);
        self.outputs.push_back(ClientOutput::ToolsListed(tools));
    }
}

fn to_value<T: serde::Serialize>(v: &T) -> Option<Value> {
    serde_json::to_value(v).ok()
}

fn parse<T: DeserializeOwned>(method: &'static str, v: Value) -> Result<T, (PeerFault, CallError)> {
    serde_json::from_value(v).map_err(|e| {
        let detail = e.to_string();
        (
            PeerFault::BadResult {
                method,
                detail: detail.clone(),
            },
            CallError::BadResult(detail),
        )
    })
}
