//! Sans-IO JSON-RPC 2.0 and MCP plumbing for voice agents: client and server machines, a tool
//! registry with JSON Schema validation, and the VIP action registry.
//!
//! - [`jsonrpc`]: messages with ids as numbers or strings, batches, and error objects with or
//!   without `code`. [`jsonrpc::decode`] tolerates what the Xiaozhi firmware sends (missing
//!   codes, broken string escaping, surrounding whitespace).
//! - [`correlation`]: requests in flight with per-request deadlines.
//! - [`model`]: the MCP lifecycle and tool messages.
//! - [`client::McpClient`]: drives a device or any MCP server (`initialize` with e.g. Xiaozhi's
//!   `vision` capability, paged `tools/list`, `tools/call` with timeouts). Numeric ids only.
//! - [`server::McpServer`]: exposes voxgate's tools to MCP clients.
//! - [`registry::ToolRegistry`]: merges tools from every source, maps dotted names to names LLM
//!   APIs accept, hides user-only tools and validates arguments before a call runs.
//!   Registration is linear in the number of tools and bounded: at most
//!   [`registry::MAX_TOOLS`] (128) tools per registry, and per tool
//!   [`registry::MAX_TOOL_NAME_BYTES`] (128) of name, [`registry::MAX_TOOL_DESCRIPTION_BYTES`]
//!   (16 KiB) of description and [`registry::MAX_TOOL_SCHEMA_BYTES`] (64 KiB) of schema JSON;
//!   beyond them a tool, or a whole over-long list, is refused as a
//!   [`registry::RejectedTool`].
//! - [`action::ActionRegistry`]: client-declared actions (VIP §5.3) with `action.invoke` /
//!   `action.result` and a deterministic fallback. Bounded like the tool registry: at most
//!   [`action::MAX_ACTIONS`] (64) actions with the per-tool maxima, a narrated state of
//!   [`action::MAX_NARRATED_STATE_BYTES`] (8 KiB) and results of
//!   [`action::MAX_ACTION_RESULT_BYTES`] (16 KiB).
//!
//! The MCP types are written here, not taken from `rmcp`: `rmcp` depends on tokio
//! unconditionally (even for its model types), and this crate must compile without any async
//! runtime. JSON Schema validation uses `jsonschema` without default features, so schemas are
//! never fetched from the network or the file system.
//!
//! # The drive loop
//!
//! Every machine is sans-IO: time comes in as `now`, nothing is sent or slept on. The owner
//! feeds what arrives, runs timers and drains outputs:
//!
//! ```text
//! loop {
//!     while let Some(out) = machine.poll_output() { act on it (send Transmit, report events) }
//!     wait for: a frame from the transport, a command, or machine.poll_timeout()
//!     frame    => machine.handle_input(now, Input::Bytes(&frame))
//!     deadline => machine.handle_timeout(now)
//!     closed   => machine.handle_input(now, Input::Closed)
//! }
//! ```
//!
//! # Example: our client against our server
//!
//! ```
//! use std::time::Instant;
//! use serde_json::json;
//! use voxgate_mcp::client::{ClientConfig, ClientOutput, McpClient};
//! use voxgate_mcp::server::{McpServer, ServerConfig, ServerOutput};
//! use voxgate_mcp::model::{CallToolResult, Tool};
//! use voxgate_mcp::Input;
//!
//! let now = Instant::now();
//! let mut server = McpServer::new(ServerConfig::default());
//! server.set_tools(vec![Tool::new(
//!     "self.audio_speaker.set_volume",
//!     "Set the speaker volume",
//!     json!({"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":100}},
//!            "required":["volume"]}),
//! )]);
//! let mut client = McpClient::new(ClientConfig::default());
//! client.start(now).unwrap();
//!
//! let mut call = None;
//! let mut answer = None;
//! // Shuttle bytes between the two machines until both are quiet.
//! loop {
//!     let mut progressed = false;
//!     while let Some(out) = client.poll_output() {
//!         progressed = true;
//!         match out {
//!             ClientOutput::Transmit(m) => server.handle_input(now, Input::Bytes(&m.to_vec())),
//!             ClientOutput::ToolsListed(tools) => {
//!                 assert_eq!(tools.len(), 1);
//!                 call = Some(client.call_tool(now, &tools[0].name, json!({"volume": 30})).unwrap());
//!             }
//!             ClientOutput::ToolCallFinished { outcome, .. } => answer = Some(outcome.unwrap()),
//!             _ => {}
//!         }
//!     }
//!     while let Some(out) = server.poll_output() {
//!         progressed = true;
//!         match out {
//!             ServerOutput::Transmit(m) => client.handle_input(now, Input::Bytes(&m.to_vec())),
//!             ServerOutput::CallTool { request, arguments, .. } => {
//!                 assert_eq!(arguments["volume"], 30);
//!                 server.respond_call(&request, &CallToolResult::text("true")).unwrap();
//!             }
//!             _ => {}
//!         }
//!     }
//!     if !progressed { break; }
//! }
//! assert!(call.is_some());
//! assert_eq!(answer.unwrap().joined_text(), "true");
//! ```

pub mod action;
pub mod client;
pub mod correlation;
mod input;
pub mod jsonrpc;
pub mod model;
pub mod registry;
mod repair;
pub mod schema;
pub mod server;

pub use input::{Input, PeerFault};
pub use repair::repair_json;
/// The JSON library of this crate's API (`Value` everywhere), re-exported so users name the
/// same version.
pub use serde_json;
