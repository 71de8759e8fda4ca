//! The MCP tool hub: every tool offered by the external MCP servers connected to `/mcp`, merged
//! into one [`ToolRegistry`], and the way sessions call them.
//!
//! Each WebSocket connection registers itself ([`McpHub::register`]), publishes its tool list
//! after every `tools/list` ([`McpHub::set_tools`]) and is removed with all its tools when it
//! closes (the [`Registration`] guard). Tools get names an LLM API accepts (dots become `_`,
//! clashes between connections get `_2`, `_3`...), and calls are validated against the tool's
//! schema before they are sent.
//!
//! # Using the hub from a door
//! ```text
//! let tools = app.shared.mcp.tool_definitions(scope);      // Vec<voxgate_engine::ToolDefinition>
//! engine.handle_input(now, Input::SetTools(door_tools ++ tools))
//! ...
//! ClientEvent::ToolCallRequest { id, name, arguments, .. } if app.shared.mcp.has_tool(scope, &name) =>
//!     spawn: app.shared.mcp.call_tool(scope, &name, arguments, timeout).await
//!            -> McpHub::result_text(..) -> engine Input::ToolResult { id, result }
//! ```
//! The definitions carry the hub's LLM names, which the engine keeps as they are, so the
//! `name` of the engine's `ToolCallRequest` is the name to pass back to [`McpHub::call_tool`].
//! [`McpHub::subscribe`] tells when the set of tools changed (to call `SetTools` again).
//!
//! The engine doors (Xiaozhi, realtime, Gemini engine mode, Retell) use the server-side path
//! instead: [`McpHub::server_tools`] gives the tools with their connection's key and own name
//! (`Input::ServerTools`), the conversation names them next to its client's tools, and a call
//! comes back as `ProviderRequest::CallTool { source, name, .. }`, which the provider runner
//! runs with [`McpHub::call_source_tool`].

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch};
use voxgate_mcp::client::CallError;
use voxgate_mcp::model::{CallToolResult, Tool};
use voxgate_mcp::registry::{RejectedTool, ToolCallError, ToolRegistry, ToolSource};

/// Which connections' tools a session sees: one token's, or every connection's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Scope {
    /// Every connected tool.
    All,
    /// Only tools of connections that authenticated with this token.
    Token(String),
}

impl Scope {
    /// `Token` for `Some`, `All` for `None`.
    pub(crate) fn from_option(token: Option<&str>) -> Self {
        token.map_or(Scope::All, |t| Scope::Token(t.to_owned()))
    }

    fn admits(&self, token_hash: &str) -> bool {
        match self {
            Scope::All => true,
            Scope::Token(t) => token_digest(t) == token_hash,
        }
    }
}

/// What a connection's token is kept as: its SHA-256 (hex), so the cluster store can say which
/// token's scope a tool is in without holding the token itself.
pub(crate) fn token_digest(token: &str) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A connection's tools as the cluster shares them with other instances
/// (`crate::cluster::mcp`).
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub(crate) struct ExportedConnection {
    /// The connection number on its instance.
    pub(crate) id: u64,
    /// SHA-256 of its token ([`token_digest`]).
    pub(crate) token_digest: String,
    /// Its server's name, once known.
    pub(crate) server: Option<String>,
    /// Its tools, as its `tools/list` gave them.
    pub(crate) tools: Vec<Tool>,
}

/// What a connection task is asked to do.
#[derive(Debug)]
pub(crate) enum Command {
    /// Send `tools/call` and answer on `reply`.
    Call {
        /// The tool's own name on its server.
        name: String,
        /// Validated arguments.
        arguments: Value,
        /// Deadline for the reply.
        timeout: Duration,
        /// Where the outcome goes.
        reply: oneshot::Sender<Result<CallToolResult, CallError>>,
    },
}

/// A tool as sessions and `/admin/mcp/tools` see it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct HubTool {
    /// The name the model sees and [`McpHub::call_tool`] takes.
    pub(crate) name: String,
    /// The tool's own name on its MCP server.
    pub(crate) tool_name: String,
    /// What it does.
    pub(crate) description: String,
    /// JSON Schema of its arguments.
    pub(crate) input_schema: Value,
    /// The connection offering it.
    pub(crate) connection: u64,
}

/// A connected MCP server, for `/admin/mcp/connections`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct ConnectionInfo {
    /// Connection number.
    pub(crate) id: u64,
    /// The server's name and version from `initialize`, once known.
    pub(crate) server: Option<String>,
    /// How many tools it offers.
    pub(crate) tools: usize,
    /// With `[cluster]`: the instance it is connected to, when that is another one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) instance: Option<String>,
}

/// Why a hub call produced no result.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum HubError {
    /// The name is unknown, or the arguments do not match the schema.
    #[error(transparent)]
    Refused(#[from] ToolCallError),
    /// The connection offering the tool closed.
    #[error("the MCP server offering this tool disconnected")]
    Gone,
    /// No reply before the deadline.
    #[error("the MCP server did not answer in time")]
    Timeout,
    /// The MCP server answered with an error, or garbage.
    #[error("the MCP server failed: {0}")]
    Failed(String),
}

struct Conn {
    /// [`token_digest`] of its token.
    token: String,
    commands: mpsc::Sender<Command>,
    server: Option<String>,
    /// For a connection mirrored from another instance: that instance's id.
    remote: Option<String>,
}

#[derive(Default)]
struct Inner {
    registry: ToolRegistry,
    conns: HashMap<u64, Conn>,
}

/// The hub. Cheap to share behind an `Arc`; every method takes `&self`.
pub(crate) struct McpHub {
    inner: Mutex<Inner>,
    next: AtomicU64,
    changes: watch::Sender<u64>,
}

impl std::fmt::Debug for McpHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpHub").finish_non_exhaustive()
    }
}

impl Default for McpHub {
    fn default() -> Self {
        Self::new()
    }
}

/// Removes its connection (and the connection's tools) from the hub when dropped.
#[derive(Debug)]
pub(crate) struct Registration<'a> {
    hub: &'a McpHub,
    id: u64,
}

impl Registration<'_> {
    /// The connection number.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.hub.remove(self.id);
    }
}

fn source(id: u64) -> ToolSource {
    // Zero-padded so the registry's ordering (and with it the naming precedence on clashes) is
    // connection order: the older connection keeps the plain name.
    ToolSource::Mcp(connection_key(id))
}

/// The key of connection `id` in [`ToolSource::Mcp`].
fn connection_key(id: u64) -> String {
    format!("{id:016x}")
}

fn connection_of(source: &ToolSource) -> Option<u64> {
    match source {
        ToolSource::Mcp(key) => u64::from_str_radix(key, 16).ok(),
        _ => None,
    }
}

impl McpHub {
    /// An empty hub.
    pub(crate) fn new() -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            next: AtomicU64::new(1),
            changes: watch::channel(0).0,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the maps half-updated in a way that
        // matters more than losing every tool, so a poisoned lock is used as is.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn changed(&self) {
        self.changes.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Adds a connection that authenticated with `token`; its commands arrive on `commands`.
    pub(crate) fn register(
        &self,
        token: &str,
        commands: mpsc::Sender<Command>,
    ) -> Registration<'_> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().conns.insert(
            id,
            Conn {
                token: token_digest(token),
                commands,
                server: None,
                remote: None,
            },
        );
        Registration { hub: self, id }
    }

    /// Adds a connection of another instance (`crate::cluster::mcp`): its tools are offered
    /// here, and its calls go to `commands`, which forwards them. Removed with
    /// [`McpHub::remove_remote`].
    pub(crate) fn register_remote(
        &self,
        instance: &str,
        conn: &ExportedConnection,
        commands: mpsc::Sender<Command>,
    ) -> (u64, Vec<RejectedTool>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().conns.insert(
            id,
            Conn {
                token: conn.token_digest.clone(),
                commands,
                server: conn.server.clone(),
                remote: Some(instance.to_owned()),
            },
        );
        let rejected = self.set_tools(id, conn.tools.clone());
        (id, rejected)
    }

    /// Removes a mirrored connection and its tools.
    pub(crate) fn remove_remote(&self, id: u64) {
        self.remove(id);
    }

    /// This instance's own connections and their tools, for the other instances.
    pub(crate) fn export(&self) -> Vec<ExportedConnection> {
        let inner = self.lock();
        let mut all: Vec<ExportedConnection> = inner
            .conns
            .iter()
            .filter(|(_, c)| c.remote.is_none())
            .map(|(id, c)| ExportedConnection {
                id: *id,
                token_digest: c.token.clone(),
                server: c.server.clone(),
                tools: inner
                    .registry
                    .all_tools()
                    .filter(|t| connection_of(t.source()) == Some(*id))
                    .map(|t| t.tool().clone())
                    .collect(),
            })
            .collect();
        all.sort_by_key(|c| c.id);
        all
    }

    /// The command queue of this instance's own connection `id` (a call routed here).
    pub(crate) fn local_commands(&self, id: u64) -> Option<mpsc::Sender<Command>> {
        self.lock()
            .conns
            .get(&id)
            .filter(|c| c.remote.is_none())
            .map(|c| c.commands.clone())
    }

    /// Records what the connection's server said about itself.
    pub(crate) fn set_server(&self, id: u64, server: String) {
        if let Some(c) = self.lock().conns.get_mut(&id) {
            c.server = Some(server);
        }
    }

    /// Replaces the connection's tools with a fresh `tools/list`; returns the tools left out
    /// because their schema does not compile.
    pub(crate) fn set_tools(&self, id: u64, tools: Vec<Tool>) -> Vec<RejectedTool> {
        let rejected = {
            let mut inner = self.lock();
            if !inner.conns.contains_key(&id) {
                return Vec::new();
            }
            inner.registry.set_source_tools(source(id), tools)
        };
        self.changed();
        rejected
    }

    fn remove(&self, id: u64) {
        {
            let mut inner = self.lock();
            inner.conns.remove(&id);
            inner.registry.remove_source(&source(id));
        }
        self.changed();
    }

    /// Bumped whenever tools appear or disappear.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// The tools in `scope` the model may call (user-only tools are left out).
    pub(crate) fn tools(&self, scope: &Scope) -> Vec<HubTool> {
        let inner = self.lock();
        inner
            .registry
            .llm_tools()
            .filter_map(|t| {
                let id = connection_of(t.source())?;
                let conn = inner.conns.get(&id)?;
                scope.admits(&conn.token).then(|| HubTool {
                    name: t.llm_name().to_owned(),
                    tool_name: t.tool().name.clone(),
                    description: t.tool().description.clone(),
                    input_schema: t.tool().input_schema.clone(),
                    connection: id,
                })
            })
            .collect()
    }

    /// The tools in `scope` as engine tool definitions (`Input::SetTools`).
    pub(crate) fn tool_definitions(&self, scope: &Scope) -> Vec<voxgate_engine::ToolDefinition> {
        self.tools(scope)
            .into_iter()
            .map(|t| voxgate_engine::ToolDefinition {
                name: t.name,
                description: t.description,
                parameters: t.input_schema,
            })
            .collect()
    }

    /// The tools in `scope` as server-side tools of an engine (`Input::ServerTools`): each
    /// with its connection's key as the source and its own name, so the conversation gives
    /// model-facing names itself (next to its client's tools) and calls come back to
    /// [`McpHub::call_source_tool`].
    pub(crate) fn server_tools(&self, scope: &Scope) -> Vec<voxgate_engine::ServerToolDefinition> {
        self.tools(scope)
            .into_iter()
            .map(|t| voxgate_engine::ServerToolDefinition {
                source: connection_key(t.connection),
                name: t.tool_name,
                description: t.description,
                parameters: t.input_schema,
            })
            .collect()
    }

    /// Calls the tool `name` (its own name) of the connection with key `source` (from
    /// [`McpHub::server_tools`]), like [`McpHub::call_tool`]. A connection that left since is
    /// [`HubError::Gone`].
    pub(crate) async fn call_source_tool(
        &self,
        scope: &Scope,
        source: &str,
        name: &str,
        arguments: Value,
        timeout: Duration,
    ) -> Result<CallToolResult, HubError> {
        let llm_name = {
            let inner = self.lock();
            let source = ToolSource::Mcp(source.to_owned());
            match inner.registry.get(&source, name) {
                Some(t) => t.llm_name().to_owned(),
                None => return Err(HubError::Gone),
            }
        };
        self.call_tool(scope, &llm_name, arguments, timeout).await
    }

    /// Whether `name` is a hub tool in `scope`.
    pub(crate) fn has_tool(&self, scope: &Scope, name: &str) -> bool {
        let inner = self.lock();
        inner
            .registry
            .by_llm_name(name)
            .and_then(|t| connection_of(t.source()))
            .and_then(|id| inner.conns.get(&id))
            .is_some_and(|c| scope.admits(&c.token))
    }

    /// The connected servers.
    pub(crate) fn connections(&self) -> Vec<ConnectionInfo> {
        let inner = self.lock();
        let mut all: Vec<ConnectionInfo> = inner
            .conns
            .iter()
            .map(|(id, c)| ConnectionInfo {
                id: *id,
                server: c.server.clone(),
                tools: inner
                    .registry
                    .all_tools()
                    .filter(|t| connection_of(t.source()) == Some(*id))
                    .count(),
                instance: c.remote.clone(),
            })
            .collect();
        all.sort_by_key(|c| c.id);
        all
    }

    /// Calls the tool the model knows as `name` with `arguments` (an object, `null`, or a
    /// string of JSON), waiting at most `timeout` for the MCP server.
    pub(crate) async fn call_tool(
        &self,
        scope: &Scope,
        name: &str,
        arguments: Value,
        timeout: Duration,
    ) -> Result<CallToolResult, HubError> {
        let (prepared, commands) = {
            let inner = self.lock();
            let prepared = inner.registry.prepare_call(name, arguments)?;
            let conn = connection_of(&prepared.source)
                .and_then(|id| inner.conns.get(&id))
                .filter(|c| scope.admits(&c.token))
                .ok_or_else(|| ToolCallError::UnknownTool(name.to_owned()))?;
            (prepared, conn.commands.clone())
        };
        let (reply, answer) = oneshot::channel();
        commands
            .send(Command::Call {
                name: prepared.name,
                arguments: prepared.arguments,
                timeout,
                reply,
            })
            .await
            .map_err(|_| HubError::Gone)?;
        // The connection enforces the deadline itself; the margin covers a connection task
        // that is stuck writing to a peer that stopped reading.
        match tokio::time::timeout(timeout + Duration::from_secs(1), answer).await {
            Err(_) | Ok(Ok(Err(CallError::Timeout))) => Err(HubError::Timeout),
            Ok(Err(_)) | Ok(Ok(Err(CallError::Closed))) => Err(HubError::Gone),
            Ok(Ok(Err(e))) => Err(HubError::Failed(e.to_string())),
            Ok(Ok(Ok(result))) => Ok(result),
        }
    }

    /// What the model is given back for a call: the tool's text, or why it failed.
    pub(crate) fn result_text(outcome: &Result<CallToolResult, HubError>) -> String {
        match outcome {
            Ok(r) if r.is_error => format!("Error: {}", r.joined_text()),
            Ok(r) => r.joined_text(),
            Err(HubError::Refused(e)) => {
                serde_json::to_string(&e.payload().to_value()).unwrap_or_else(|_| e.to_string())
            }
            Err(e) => format!("Error: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn tool(name: &str) -> Tool {
        Tool::new(
            name,
            "test tool",
            json!({"type":"object","properties":{"x":{"type":"integer"}},"required":["x"]}),
        )
    }

    #[tokio::test]
    async fn merge_rename_scope_and_removal() {
        let hub = McpHub::new();
        let mut changes = hub.subscribe();
        let (tx1, mut rx1) = mpsc::channel(4);
        let (tx2, _rx2) = mpsc::channel(4);
        let a = hub.register("t1", tx1);
        let b = hub.register("t2", tx2);
        hub.set_tools(a.id(), vec![tool("light.on"), tool("echo")]);
        hub.set_tools(b.id(), vec![tool("echo")]);
        assert!(changes.has_changed().unwrap());
        changes.borrow_and_update();
        let names: Vec<String> = hub.tools(&Scope::All).into_iter().map(|t| t.name).collect();
        assert_eq!(names, ["light_on", "echo", "echo_2"]);
        let t2: Vec<String> = hub
            .tools(&Scope::Token("t2".into()))
            .into_iter()
            .map(|t| t.tool_name)
            .collect();
        assert_eq!(t2, ["echo"]);
        assert!(hub.has_tool(&Scope::Token("t1".into()), "light_on"));
        assert!(!hub.has_tool(&Scope::Token("t2".into()), "light_on"));

        // Bad arguments never reach the connection.
        let err = hub
            .call_tool(
                &Scope::All,
                "light_on",
                json!({"x":"no"}),
                Duration::from_secs(1),
            )
            .await
            .unwrap_err();
        assert!(matches!(err, HubError::Refused(_)), "{err:?}");
        assert!(rx1.try_recv().is_err());

        let call = hub.call_tool(
            &Scope::All,
            "light_on",
            json!({"x": 1}),
            Duration::from_secs(1),
        );
        let serve = async {
            let Some(Command::Call {
                name,
                arguments,
                reply,
                ..
            }) = rx1.recv().await
            else {
                panic!("no call")
            };
            assert_eq!((name.as_str(), arguments), ("light.on", json!({"x": 1})));
            reply.send(Ok(CallToolResult::text("on"))).unwrap();
        };
        let (outcome, ()) = tokio::join!(call, serve);
        assert_eq!(McpHub::result_text(&outcome), "on");

        drop(a);
        assert!(changes.has_changed().unwrap());
        let names: Vec<String> = hub.tools(&Scope::All).into_iter().map(|t| t.name).collect();
        assert_eq!(names, ["echo"]);
        let err = hub
            .call_tool(
                &Scope::All,
                "light_on",
                json!({"x": 1}),
                Duration::from_secs(1),
            )
            .await
            .unwrap_err();
        assert!(matches!(
            err,
            HubError::Refused(ToolCallError::UnknownTool(_))
        ));
        assert_eq!(hub.connections().len(), 1);
        drop(b);
        assert!(hub.tools(&Scope::All).is_empty());
    }

    #[tokio::test]
    async fn server_tools_carry_the_connection_key_and_calls_route_back_to_it() {
        let hub = McpHub::new();
        let (tx1, _rx1) = mpsc::channel(4);
        let (tx2, mut rx2) = mpsc::channel(4);
        let a = hub.register("", tx1);
        let b = hub.register("", tx2);
        hub.set_tools(a.id(), vec![tool("echo")]);
        hub.set_tools(b.id(), vec![tool("echo")]);
        let defs = hub.server_tools(&Scope::All);
        assert_eq!(defs.len(), 2);
        assert!(defs.iter().all(|d| d.name == "echo"));
        assert_ne!(defs[0].source, defs[1].source);
        let second = defs[1].source.clone();
        let call = hub.call_source_tool(
            &Scope::All,
            &second,
            "echo",
            json!({"x": 2}),
            Duration::from_secs(1),
        );
        let serve = async {
            let Some(Command::Call { reply, .. }) = rx2.recv().await else {
                panic!("no call on the second connection")
            };
            reply.send(Ok(CallToolResult::text("two"))).unwrap();
        };
        let (outcome, ()) = tokio::join!(call, serve);
        assert_eq!(McpHub::result_text(&outcome), "two");
        drop(b);
        let err = hub
            .call_source_tool(
                &Scope::All,
                &second,
                "echo",
                json!({"x": 2}),
                Duration::from_secs(1),
            )
            .await
            .unwrap_err();
        assert_eq!(err, HubError::Gone);
    }

    #[tokio::test]
    async fn a_closed_connection_fails_the_call() {
        let hub = McpHub::new();
        let (tx, rx) = mpsc::channel(4);
        let reg = hub.register("", tx);
        hub.set_tools(reg.id(), vec![tool("echo")]);
        drop(rx);
        let err = hub
            .call_tool(&Scope::All, "echo", json!({"x": 1}), Duration::from_secs(1))
            .await
            .unwrap_err();
        assert_eq!(err, HubError::Gone);
    }
}
