//! The voxgate reference server as a library: configuration, the runtime with health and
//! metrics endpoints, and the protocol doors.
//!
//! | route | what |
//! |---|---|
//! | `GET /health` | `200` with JSON: status, version, open sessions |
//! | `GET /metrics` | Prometheus text: sessions by door, turns, errors, provider latencies, dropped frames |
//! | `/realtime`, `/api/v1/vendors/{vendor}/organizations/{org}/realtime[/{model}]` | the realtime protobuf protocol over WebSocket (Deepslate-compatible), optional bearer keys |
//! | `/llm-websocket/{call_id}` | Retell's custom-LLM WebSocket: we answer as the LLM (`[retell]`, docs/doors/retell.md) |
//! | `/retell/calls`, `/retell/calls/{call_id}/interrupt`, `/retell/calls/{call_id}/metadata` | Retell door control API: list calls, `agent_interrupt`, `metadata` |
//! | `/xiaozhi/v1/`, `/xiaozhi/ota/` (and optional own listeners) | Xiaozhi devices: WebSocket JSON + Opus, OTA (`[xiaozhi]`, docs/doors/xiaozhi.md) |
//! | `/gemini` (and its own listener, default `127.0.0.1:3001`, any path) | the Gemini bridge JSON protocol (`[gemini]`, docs/doors/gemini.md) |
//! | `POST /api/message`, `POST /api/perception/event`, `GET /api/perception/events`, `/admin/*` | the Bridge HTTP API and perception events (`[bridge]`, docs/doors/bridge.md) |
//! | `/mcp?token=...` | external MCP servers connect in and offer tools (`[mcp]`, docs/doors/mcp.md) |
//!
//! Each connection is one tokio task driving one sans-IO [`voxgate_engine::Engine`]; provider
//! requests (LLM, ASR, TTS) run as tasks whose events come back tagged with the engine's request
//! id and are aborted when the engine cancels them or the client leaves. Queues are bounded:
//! under back-pressure audio is dropped and counted (`voxgate_dropped_frames_total`), control
//! messages never are.
//!
//! # Example
//! ```no_run
//! use voxgate_server::{Config, Server};
//!
//! # async fn run() -> Result<(), voxgate_server::ServerError> {
//! let mut config = Config::default();
//! config.listen = "127.0.0.1:0".parse().unwrap();
//! let server = Server::bind(config).await?;
//! println!("listening on {}", server.local_addr());
//! server.run(voxgate_server::shutdown_signal()).await
//! # }
//! ```

mod access;
mod admission;
mod bridge;
pub mod config;
mod door;
pub mod exposure;
mod gemini;
mod head_timeout;
mod incident;
mod mcp_endpoint;
pub mod metrics;
mod providers;
mod realtime;
mod retell;
mod secret;
mod server;
mod xiaozhi;

pub use config::AcpBrainConfig;
pub use config::{AdminConfig, TrustedProxy};
pub use config::{
    BridgeConfig, Config, ConfigError, DownlinkApplication, GeminiConfig, LimitsConfig,
    McpEndpointConfig, OpusBackendChoice, RetellAgentSettings, RetellConfig, XiaozhiConfig,
};
pub use exposure::exposure_warnings;
pub use metrics::Metrics;
pub use providers::Providers;
pub use server::{Server, ServerError, shutdown_signal};
