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
mod cluster;
pub mod config;
mod connection;
mod door;
pub mod exposure;
mod fallback;
mod gemini;
mod incident;
mod local_speech;
pub use local_speech::{SpeechSwitch, Switched, default_models_dir};
mod mcp_endpoint;
pub mod metrics;
mod providers;
mod realtime;
mod retell;
mod secret;
mod server;
pub mod telemetry;
mod vip;
mod webrtc;
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
pub use server::{OpenFileLimit, Server, ServerError, raise_open_file_limit, shutdown_signal};
pub use telemetry::Telemetry;

/// Pure validation otherwise private, for the fuzz targets in `fuzz/`; not a stable API.
#[doc(hidden)]
pub mod fuzzing {
    use crate::bridge::perception::{EventOrigin, PerceptionBus, PerceptionEvent};

    /// A perception bus fed the way `POST /api/perception/event` and the Xiaozhi door feed it.
    #[derive(Debug, Default)]
    pub struct Perception {
        bus: PerceptionBus,
    }

    impl Perception {
        /// An empty bus.
        #[must_use]
        pub fn new() -> Self {
            Self::default()
        }

        /// What `POST /api/perception/event` does with a body it has read: parse, validate,
        /// publish. Returns the event as subscribers get it (JSON), or the 400 text.
        ///
        /// # Errors
        /// The refusal text for a body that is not JSON or not a valid event.
        pub fn post(&self, body: &[u8]) -> Result<String, String> {
            let value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
            self.publish(PerceptionEvent::from_value(
                value,
                None,
                None,
                EventOrigin::Http,
            ))
        }

        /// A device's `event` frame, the connection supplying the ids the frame leaves out.
        ///
        /// # Errors
        /// As [`post`](Self::post).
        pub fn device_frame(
            &self,
            frame: &[u8],
            device_id: &str,
            session_id: &str,
        ) -> Result<String, String> {
            let value = serde_json::from_slice(frame).map_err(|e| e.to_string())?;
            self.publish(PerceptionEvent::from_value(
                value,
                Some(device_id),
                Some(session_id),
                EventOrigin::Device,
            ))
        }

        fn publish(
            &self,
            event: Result<PerceptionEvent, crate::bridge::perception::InvalidEvent>,
        ) -> Result<String, String> {
            let event = event.map_err(|e| e.0)?;
            let json = serde_json::to_string(&event).map_err(|e| e.to_string())?;
            self.bus.publish(event);
            Ok(json)
        }

        /// Every device's state as `GET /admin/perception` renders it.
        #[must_use]
        pub fn devices_json(&self) -> String {
            serde_json::to_string(&self.bus.devices()).unwrap_or_default()
        }
    }

    /// What instances read from each other through Redis (`[cluster]`): a routing message, a
    /// saved Retell call, an instance's MCP tool list, a perception stream entry, and the
    /// admin push body they carry. Each returns what was read, written out again.
    pub mod cluster {
        /// A routing channel message: parsed (bounded), then serialized again.
        ///
        /// # Errors
        /// Why it was refused.
        pub fn routing_message(bytes: &[u8]) -> Result<String, String> {
            let envelope = crate::cluster::wire::Envelope::parse(bytes)?;
            serde_json::to_string(&envelope).map_err(|e| e.to_string())
        }

        /// A saved Retell call of `call_id`, restored and saved again.
        #[must_use]
        pub fn saved_retell_call(call_id: &str, json: &str) -> Option<String> {
            crate::retell::resave(call_id, json)
        }

        /// An instance's MCP connections and tools; how many tools a hub mirrors from them.
        ///
        /// # Errors
        /// Why the list was refused.
        pub fn mcp_tools(json: &str) -> Result<usize, String> {
            let conns: Vec<crate::mcp_endpoint::hub::ExportedConnection> =
                serde_json::from_str(json).map_err(|e| e.to_string())?;
            let hub = crate::mcp_endpoint::hub::McpHub::new();
            for c in &conns {
                let (tx, _rx) = tokio::sync::mpsc::channel(1);
                hub.register_remote("other", c, tx);
            }
            Ok(hub.tools(&crate::mcp_endpoint::hub::Scope::All).len())
        }

        /// A perception stream entry, published on a bus as another instance's event.
        ///
        /// # Errors
        /// Why it was refused.
        pub fn perception_entry(json: &str) -> Result<String, String> {
            let event = crate::cluster::perception::read_entry(json)?;
            let out = serde_json::to_string(&event).map_err(|e| e.to_string())?;
            crate::bridge::perception::PerceptionBus::new().publish(event);
            Ok(out)
        }

        /// An admin push body, as the device's instance reads it.
        ///
        /// # Errors
        /// Why it was refused.
        pub fn device_push(bytes: &[u8]) -> Result<String, String> {
            let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
            crate::xiaozhi::devices::parse_push(&v).map(|p| format!("{p:?}"))
        }
    }
}
