//! The MCP endpoint: external MCP servers connect in over WebSocket (`/mcp?token=...`) through
//! bridges such as `mcp2xiaozhi`, and their tools are offered to the agent.
//!
//! Roles are inverted compared with a usual WebSocket API: the bridge is the WebSocket client
//! but the MCP *server*; voxgate accepts the connection and speaks first as the MCP *client*
//! (`initialize` with protocol version `2024-11-05`, `notifications/initialized`, paged
//! `tools/list`, then `tools/call` whenever the model uses a tool). Every frame is one bare
//! JSON-RPC message in a text frame, sent as compact JSON; incoming frames are trimmed, and
//! frames that are not JSON-RPC (a bridge relays its MCP server's stdout, log lines included)
//! are ignored. A JSON-RPC `ping` from the bridge is answered with `{"result":{}}`, WebSocket
//! pings with pongs.
//!
//! Every connection's tools go into the [`hub::McpHub`] (several connections per token are
//! merged; a closed connection takes its tools with it). Doors offer the hub's tools to their
//! engine and route the calls back: see [`hub`] for the recipe. The Bridge HTTP API's
//! `/api/message` turns use it, and so do the engine doors (Xiaozhi, realtime, Gemini engine
//! mode, Retell), each with its `mcp_tools` switch: the door driver hands the tools to the
//! session and its provider runner runs their calls.
//!
//! The token travels as `Authorization: Bearer <token>` or, for bridges that only take a URL
//! (`mcp2xiaozhi` and the Xiaozhi console's endpoint URLs), in `?token=`; the header wins when
//! both are present. Query strings end up in proxy access logs, so prefer the header where the
//! bridge allows it. With `[mcp] tokens` empty any token (or none) is accepted; otherwise an
//! unknown or missing token is refused with HTTP 401 before the upgrade (the bridges retry with
//! back-off). Tokens are compared in constant time.

pub(crate) mod hub;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::ws::{Message, WebSocket};
use axum::extract::{ConnectInfo, Query, State, WebSocketUpgrade};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};
use voxgate_mcp::Input;
use voxgate_mcp::client::{CallError, CallId, ClientConfig, ClientOutput, McpClient};
use voxgate_mcp::jsonrpc::ErrorObject;
use voxgate_mcp::model::CallToolResult;

use crate::config::ConfigError;
use crate::config::env::{EnvVars, Secret};
use crate::metrics::Door;
use crate::server::App;
use hub::Command;

/// Settings of this door (`[mcp]` in the configuration file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpEndpointConfig {
    /// Tokens accepted in `?token=`; empty accepts any connection.
    pub tokens: Vec<String>,
    /// Seconds to wait for `initialize`, each `tools/list` page and `ping`.
    pub request_timeout_secs: u64,
    /// Seconds a `tools/call` may take.
    pub call_timeout_secs: u64,
    /// Largest WebSocket message accepted, in bytes (the bridges need at least 1 MiB).
    pub max_message_bytes: usize,
}

impl Default for McpEndpointConfig {
    fn default() -> Self {
        Self {
            tokens: Vec::new(),
            request_timeout_secs: 10,
            call_timeout_secs: 30,
            max_message_bytes: 4 << 20,
        }
    }
}

impl McpEndpointConfig {
    /// Applies the door's `VOXGATE_MCP_*` environment overrides: `VOXGATE_MCP_TOKENS`
    /// (comma-separated), `VOXGATE_MCP_REQUEST_TIMEOUT_SECS`, `VOXGATE_MCP_CALL_TIMEOUT_SECS`,
    /// `VOXGATE_MCP_MAX_MESSAGE_BYTES`.
    pub(crate) fn apply_env(
        &mut self,
        var: &impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        let vars = EnvVars::new(var);
        vars.list("VOXGATE_MCP_TOKENS", &mut self.tokens);
        vars.parsed(
            "VOXGATE_MCP_REQUEST_TIMEOUT_SECS",
            &mut self.request_timeout_secs,
        )?;
        vars.parsed("VOXGATE_MCP_CALL_TIMEOUT_SECS", &mut self.call_timeout_secs)?;
        vars.parsed("VOXGATE_MCP_MAX_MESSAGE_BYTES", &mut self.max_message_bytes)?;
        Ok(())
    }

    /// Replaces secrets with `***` for `--print-config`.
    pub(crate) fn mask_secrets(&mut self) {
        self.tokens.mask();
    }

    /// Rejects values out of range.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        if self.request_timeout_secs == 0 || self.call_timeout_secs == 0 {
            return Err(ConfigError::Invalid(
                "[mcp] timeouts must be at least 1 second".into(),
            ));
        }
        if self.max_message_bytes < 1 << 20 {
            return Err(ConfigError::Invalid(format!(
                "[mcp] max_message_bytes = {} is below 1 MiB, which the bridges need",
                self.max_message_bytes
            )));
        }
        Ok(())
    }

    /// The `tools/call` deadline.
    pub(crate) fn call_timeout(&self) -> Duration {
        Duration::from_secs(self.call_timeout_secs)
    }
}

/// The door's routes on the main listener.
pub(crate) fn routes() -> Router<Arc<App>> {
    Router::new()
        .route("/mcp", get(upgrade))
        .route("/mcp/", get(upgrade))
}

#[derive(Debug, Deserialize)]
struct TokenQuery {
    token: Option<String>,
}

async fn upgrade(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<std::net::SocketAddr>,
    Query(q): Query<TokenQuery>,
    headers: axum::http::HeaderMap,
    ws: WebSocketUpgrade,
) -> Response {
    let permit = match app.admit(Door::Mcp, peer.ip()).await {
        Ok(p) => p,
        Err(refused) => return refused.into_response(),
    };
    let token = crate::access::bearer(&headers)
        .map(str::to_owned)
        .or(q.token)
        .unwrap_or_default();
    let tokens = &app.config.mcp.tokens;
    if !tokens.is_empty() && !crate::secret::matches_any(tokens, &token) {
        app.metrics.error(Door::Mcp);
        return (StatusCode::UNAUTHORIZED, "missing or unknown MCP token").into_response();
    }
    let limit = app.config.mcp.max_message_bytes;
    ws.max_message_size(limit)
        .max_frame_size(limit)
        .on_upgrade(move |socket| async move {
            let _permit = permit;
            serve(socket, app, token).await;
        })
}

/// Serves one bridge connection until it closes or the server shuts down.
async fn serve(socket: WebSocket, app: Arc<App>, token: String) {
    let _active = app.metrics.session(Door::Mcp);
    let (commands_tx, commands) = mpsc::channel(64);
    let registration = app.shared.mcp.register(&token, commands_tx);
    let config = &app.config.mcp;
    let client = McpClient::new(ClientConfig {
        request_timeout: Duration::from_secs(config.request_timeout_secs),
        call_timeout: config.call_timeout(),
        ..ClientConfig::default()
    });
    let mut conn = Connection {
        app: &app,
        id: registration.id(),
        client,
        socket,
        calls: HashMap::new(),
        closing: false,
        init_attempts: 1,
    };
    tracing::info!(connection = conn.id, "MCP server connected");
    conn.run(commands).await;
    tracing::info!(connection = conn.id, "MCP server disconnected");
    // Dropping the registration removes the connection's tools.
    drop(registration);
}

struct Connection<'a> {
    app: &'a App,
    id: u64,
    client: McpClient,
    socket: WebSocket,
    calls: HashMap<CallId, oneshot::Sender<Result<CallToolResult, CallError>>>,
    closing: bool,
    /// `initialize` requests sent so far.
    init_attempts: u32,
}

/// How many times `initialize` is sent before a silent server is dropped.
const INIT_ATTEMPTS: u32 = 3;

impl Connection<'_> {
    async fn run(&mut self, mut commands: mpsc::Receiver<Command>) {
        let mut shutdown = self.app.shutdown.clone();
        if *shutdown.borrow() || self.client.start(Instant::now()).is_err() {
            return;
        }
        loop {
            if !self.flush().await {
                break;
            }
            if self.closing {
                let _ = self.socket.send(Message::Close(None)).await;
                break;
            }
            let deadline = self.client.poll_timeout();
            let sleep_until = deadline
                .map(tokio::time::Instant::from_std)
                .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                frame = self.socket.recv() => match frame {
                    Some(Ok(Message::Text(t))) => self.frame(t.as_bytes()),
                    Some(Ok(Message::Binary(b))) => self.frame(&b),
                    // Pongs to pings are queued by the WebSocket layer itself.
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                    Some(Ok(Message::Close(_)) | Err(_)) | None => break,
                },
                Some(command) = commands.recv() => self.command(command),
                () = tokio::time::sleep_until(sleep_until), if deadline.is_some() => {
                    self.client.handle_timeout(Instant::now());
                }
                _ = shutdown.changed() => {
                    let _ = self.socket.send(Message::Close(None)).await;
                    break;
                }
            }
        }
        // Everything in flight fails with `Closed`.
        self.client.handle_input(Instant::now(), Input::Closed);
        while let Some(out) = self.client.poll_output() {
            self.output_locally(out);
        }
        for (_, reply) in self.calls.drain() {
            let _ = reply.send(Err(CallError::Closed));
        }
    }

    fn frame(&mut self, bytes: &[u8]) {
        if bytes.trim_ascii().is_empty() {
            return;
        }
        self.client
            .handle_input(Instant::now(), Input::Bytes(bytes));
    }

    fn command(&mut self, command: Command) {
        match command {
            Command::Call {
                name,
                arguments,
                timeout,
                reply,
            } => match self
                .client
                .call_tool_with_timeout(Instant::now(), &name, arguments, timeout)
            {
                Ok(call) => {
                    self.calls.insert(call, reply);
                }
                Err(_) => {
                    let _ = reply.send(Err(CallError::Closed));
                }
            },
        }
    }

    /// Sends what the client wants sent and acts on what it reports; false when the socket is
    /// gone.
    async fn flush(&mut self) -> bool {
        while let Some(out) = self.client.poll_output() {
            if let ClientOutput::Transmit(m) = out {
                // `to_vec` is compact JSON; the bridges want one message per frame.
                let text = String::from_utf8_lossy(&m.to_vec()).into_owned();
                if self.socket.send(Message::Text(text.into())).await.is_err() {
                    return false;
                }
            } else {
                self.output_locally(out);
            }
        }
        true
    }

    fn output_locally(&mut self, out: ClientOutput) {
        let hub = &self.app.shared.mcp;
        match out {
            ClientOutput::Ready(init) => {
                let info = &init.server_info;
                tracing::info!(
                    connection = self.id,
                    server = %info.name,
                    version = %info.version,
                    protocol = %init.protocol_version,
                    "MCP server initialized"
                );
                hub.set_server(self.id, format!("{} {}", info.name, info.version));
            }
            ClientOutput::InitializeFailed(CallError::Timeout)
                if self.init_attempts < INIT_ATTEMPTS =>
            {
                // The bridges connect first and start their MCP server process afterwards; a
                // Python server can take seconds to come up on a busy machine. Ask again (a
                // late answer to the first request is ignored as an unknown reply).
                self.init_attempts += 1;
                tracing::info!(
                    connection = self.id,
                    "MCP initialize timed out; asking again"
                );
                if self.client.start(Instant::now()).is_err() {
                    self.closing = true;
                }
            }
            ClientOutput::InitializeFailed(e) => {
                tracing::warn!(connection = self.id, error = %e, "MCP initialize failed; closing");
                self.app.metrics.error(Door::Mcp);
                self.closing = true;
            }
            ClientOutput::ToolsListed(tools) => {
                let count = tools.len();
                for rejected in hub.set_tools(self.id, tools) {
                    tracing::warn!(connection = self.id, %rejected, "MCP tool left out");
                }
                tracing::info!(connection = self.id, tools = count, "MCP tools listed");
            }
            ClientOutput::ListToolsFailed(e) => {
                self.app.metrics.error(Door::Mcp);
                tracing::warn!(connection = self.id, error = %e, "MCP tools/list failed");
            }
            ClientOutput::ToolCallFinished { call, outcome, .. } => {
                if let Some(reply) = self.calls.remove(&call) {
                    let _ = reply.send(outcome);
                }
            }
            ClientOutput::Request(r) => {
                // Sampling, roots and elicitation are not offered (no capabilities declared).
                self.client.respond(
                    r.id,
                    Err(ErrorObject::new(
                        ErrorObject::METHOD_NOT_FOUND,
                        format!("method not supported: {}", r.method),
                    )),
                );
            }
            ClientOutput::PeerFault(f) => {
                // Non-JSON frames (relayed log lines) land here: ignored by design.
                tracing::debug!(connection = self.id, fault = %f, "MCP frame ignored");
            }
            other => tracing::trace!(connection = self.id, ?other, "MCP output"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_env_and_checks() {
        let mut c = McpEndpointConfig::default();
        let env = |k: &str| match k {
            "VOXGATE_MCP_TOKENS" => Some("a, b,".to_owned()),
            "VOXGATE_MCP_CALL_TIMEOUT_SECS" => Some("5".to_owned()),
            _ => None,
        };
        c.apply_env(&env).unwrap();
        assert_eq!(c.tokens, ["a", "b"]);
        assert_eq!(c.call_timeout(), Duration::from_secs(5));
        c.check().unwrap();
        c.mask_secrets();
        assert_eq!(c.tokens, ["***", "***"]);
        c.max_message_bytes = 1000;
        assert!(c.check().is_err());
        let bad = |k: &str| (k == "VOXGATE_MCP_CALL_TIMEOUT_SECS").then(|| "x".to_owned());
        assert!(McpEndpointConfig::default().apply_env(&bad).is_err());
    }
}
