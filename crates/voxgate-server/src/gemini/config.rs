//! `[gemini]`: the Gemini bridge door's settings and their `VOXGATE_GEMINI_*` overrides.
//!
//! | key | env | default | |
//! |---|---|---|---|
//! | `enabled` | `VOXGATE_GEMINI_ENABLED` | `true` | serve the door at all |
//! | `own_listener` | `VOXGATE_GEMINI_LISTEN=off` | `true` | open the own listener |
//! | `listen` | `VOXGATE_GEMINI_LISTEN` | `127.0.0.1:3001` | its address (any path) |
//! | `mode` | `VOXGATE_GEMINI_MODE` | `engine` | `engine` or `passthrough` |
//! | `tokens` | `VOXGATE_GEMINI_TOKENS` (comma-separated) | none | bridge tokens; when set, every connection must present one (masked in `--print-config`) |
//! | `api_key` | `VOXGATE_GEMINI_API_KEY` | none | pass-through: the server's Gemini API key (masked) |
//! | `base_url` | `VOXGATE_GEMINI_BASE_URL` | `wss://generativelanguage.googleapis.com` | pass-through upstream |
//! | `model` | `VOXGATE_GEMINI_MODEL` | `models/gemini-2.0-flash-live-001` | pass-through model when the session names none |
//! | `audio_chunks` | `VOXGATE_GEMINI_AUDIO_CHUNKS` | `false` | also send `AUDIO_CHUNK` |
//! | `assistant_speaking` | `VOXGATE_GEMINI_ASSISTANT_SPEAKING` | `true` | send `ASSISTANT_SPEAKING` |
//! | `max_frame_bytes` | `VOXGATE_GEMINI_MAX_FRAME_BYTES` | `8388608` | largest client frame |
//! | `connect_timeout_ms` | `VOXGATE_GEMINI_CONNECT_TIMEOUT_MS` | the server's initialization timeout | close a connection without a session after this long |
//! | `mcp_tools` | `VOXGATE_GEMINI_MCP_TOOLS` | `true` | engine mode: offer the MCP endpoint's tools, run by the server |
//!
//! Access ([`super::access`]): with `tokens` set, a connection must present one as
//! `Authorization: Bearer <token>`, `?token=<token>` or the URL's last path segment, or it is
//! refused with HTTP 401 before the upgrade. Without tokens, pass-through with the server's
//! `api_key` is refused (HTTP 403) to every caller but a loopback peer that is not behind a
//! proxy, so the server's key is never spent for an unauthenticated caller from elsewhere;
//! engine mode stays open.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::config::ConfigError;
use crate::config::env::{EnvVars, Secret};

/// Who answers a bridge session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum GeminiMode {
    /// voxgate's own pipeline (the configured LLM, ASR and TTS): no Google account needed.
    #[default]
    Engine,
    /// Relay the session to the real Gemini Live API with [`GeminiConfig::api_key`].
    Passthrough,
}

impl GeminiMode {
    fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "engine" => Some(Self::Engine),
            "passthrough" | "pass-through" | "relay" => Some(Self::Passthrough),
            _ => None,
        }
    }
}

/// Default upstream of pass-through sessions.
const DEFAULT_GEMINI_BASE_URL: &str = "wss://generativelanguage.googleapis.com";
/// Default model of pass-through sessions whose config names none.
const DEFAULT_GEMINI_MODEL: &str = "models/gemini-2.0-flash-live-001";

/// Settings of the Gemini bridge door (`[gemini]` in the configuration file).
///
/// ```toml
/// [gemini]
/// enabled = true                 # serve /gemini and the own listener
/// own_listener = true            # the bridge's own port, any path
/// listen = "127.0.0.1:3001"
/// mode = "engine"                # or "passthrough"
/// tokens = ["..."]               # bridge tokens: required of every connection when set
/// api_key = "..."                # passthrough: the Gemini API key
/// base_url = "wss://generativelanguage.googleapis.com"
/// model = "models/gemini-2.0-flash-live-001"   # passthrough default model
/// audio_chunks = false           # also send model audio as AUDIO_CHUNK
/// assistant_speaking = true      # send ASSISTANT_SPEAKING around spoken replies
/// max_frame_bytes = 8388608      # a whole WAV file may come in one frame
/// connect_timeout_ms = 10000     # close a connection without CONNECT_GEMINI by then
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GeminiConfig {
    /// Serve the door at all (`/gemini` on the main listener and the own listener).
    pub enabled: bool,
    /// Open the door's own listener at [`Self::listen`] (accepting any path).
    pub own_listener: bool,
    /// Address of the own listener. Default `127.0.0.1:3001`.
    pub listen: SocketAddr,
    /// `engine` (default) or `passthrough`.
    pub mode: GeminiMode,
    /// Bridge tokens. When any is set, every connection must present one
    /// (`Authorization: Bearer`, a `token` query parameter or the URL's last path segment)
    /// or is refused with HTTP 401 before the upgrade. Empty: engine mode is open, and
    /// pass-through with the server's `api_key` is served to loopback callers only.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<String>,
    /// Gemini API key for pass-through sessions (sent as `?key=`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    /// Upstream WebSocket root (`wss://host` or `ws://host:port`); the Live API path is
    /// appended unless the URL already has a path.
    pub base_url: String,
    /// Model for pass-through sessions whose config names none.
    pub model: String,
    /// Also send each piece of model audio as `AUDIO_CHUNK {data}` after its `CONTENT_MESSAGE`
    /// (declared by the original bridge but never sent; some clients read it). Default off.
    pub audio_chunks: bool,
    /// Send `ASSISTANT_SPEAKING {speaking}` when spoken output starts and ends. Default on.
    pub assistant_speaking: bool,
    /// Largest client frame accepted, in bytes (a whole WAV file may arrive as one frame).
    /// Frames up to twice this are refused with a `GEMINI_ERROR`; larger ones end the
    /// connection.
    pub max_frame_bytes: usize,
    /// Close (1008, after a `GEMINI_ERROR`) a connection that has not set up a session with
    /// `CONNECT_GEMINI` within this many milliseconds; `0` never closes it. Unset: the
    /// server's initialization timeout.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connect_timeout_ms: Option<u64>,
    /// Offer the tools of the external MCP servers connected to `/mcp` to this door's
    /// conversations (run by the server, bounded by `[mcp] call_timeout_secs`). Default on:
    /// only the operator's `/mcp` endpoint supplies them.
    pub mcp_tools: bool,
    /// `[gemini.engine]`: engine settings for this door, over `[engine]`.
    #[serde(skip_serializing_if = "crate::config::EngineSettings::is_empty")]
    pub engine: crate::config::EngineSettings,
}

impl Default for GeminiConfig {
    fn default() -> Self {
        Self {
            mcp_tools: true,
            enabled: true,
            own_listener: true,
            listen: SocketAddr::from(([127, 0, 0, 1], 3001)),
            mode: GeminiMode::Engine,
            tokens: Vec::new(),
            api_key: None,
            base_url: DEFAULT_GEMINI_BASE_URL.to_owned(),
            model: DEFAULT_GEMINI_MODEL.to_owned(),
            audio_chunks: false,
            assistant_speaking: true,
            max_frame_bytes: voxgate_gemini::bridge::RECOMMENDED_MAX_FRAME_BYTES,
            connect_timeout_ms: None,
            engine: crate::config::EngineSettings::default(),
        }
    }
}

impl GeminiConfig {
    /// Applies the door's `VOXGATE_GEMINI_*` environment overrides: `ENABLED`, `LISTEN` (an
    /// address, or `off` for no own listener), `MODE`, `TOKENS` (comma-separated), `API_KEY`, `BASE_URL`, `MODEL`,
    /// `AUDIO_CHUNKS`, `ASSISTANT_SPEAKING`, `MAX_FRAME_BYTES`, `CONNECT_TIMEOUT_MS` (blank:
    /// the server's initialization timeout).
    pub(crate) fn apply_env(
        &mut self,
        var: &impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        let vars = EnvVars::new(var);
        vars.flag("VOXGATE_GEMINI_ENABLED", &mut self.enabled)?;
        vars.flag("VOXGATE_GEMINI_MCP_TOOLS", &mut self.mcp_tools)?;
        if let Some(v) = var("VOXGATE_GEMINI_LISTEN") {
            if v.trim().eq_ignore_ascii_case("off") || v.trim().is_empty() {
                self.own_listener = false;
            } else {
                self.listen = v.trim().parse().map_err(|e| ConfigError::Env {
                    name: "VOXGATE_GEMINI_LISTEN",
                    message: format!("{v:?} is not a socket address (or \"off\"): {e}"),
                })?;
                self.own_listener = true;
            }
        }
        if let Some(v) = var("VOXGATE_GEMINI_MODE") {
            self.mode = GeminiMode::parse(&v).ok_or_else(|| ConfigError::Env {
                name: "VOXGATE_GEMINI_MODE",
                message: format!("{v:?} is neither \"engine\" nor \"passthrough\""),
            })?;
        }
        vars.list("VOXGATE_GEMINI_TOKENS", &mut self.tokens);
        vars.non_blank("VOXGATE_GEMINI_API_KEY", &mut self.api_key);
        vars.trimmed("VOXGATE_GEMINI_BASE_URL", &mut self.base_url);
        vars.trimmed("VOXGATE_GEMINI_MODEL", &mut self.model);
        vars.flag("VOXGATE_GEMINI_AUDIO_CHUNKS", &mut self.audio_chunks)?;
        vars.flag(
            "VOXGATE_GEMINI_ASSISTANT_SPEAKING",
            &mut self.assistant_speaking,
        )?;
        vars.parsed("VOXGATE_GEMINI_MAX_FRAME_BYTES", &mut self.max_frame_bytes)?;
        vars.parsed_or_none(
            "VOXGATE_GEMINI_CONNECT_TIMEOUT_MS",
            &mut self.connect_timeout_ms,
        )?;
        Ok(())
    }

    /// Replaces secrets with `***` for `--print-config`.
    pub(crate) fn mask_secrets(&mut self) {
        self.api_key.mask();
        self.tokens.mask();
    }

    /// Moves the door's own listener (when enabled) to a free loopback port.
    pub(crate) fn ephemeral_ports(&mut self) {
        if self.own_listener {
            self.listen = SocketAddr::from(([127, 0, 0, 1], 0));
        }
    }

    /// Rejects values out of range. A missing API key in pass-through mode is not an error
    /// here (it may come from the environment later); sessions report it instead. A blank
    /// token is an error: it would match a request that presents none.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        if self.tokens.iter().any(|t| t.trim().is_empty()) {
            return Err(ConfigError::Invalid(
                "gemini.tokens has a blank entry: it would let in a caller without a token".into(),
            ));
        }
        if self.max_frame_bytes < 1024 {
            return Err(ConfigError::Invalid(format!(
                "gemini.max_frame_bytes = {} is below the minimum of 1024",
                self.max_frame_bytes
            )));
        }
        if !(self.base_url.starts_with("ws://") || self.base_url.starts_with("wss://")) {
            return Err(ConfigError::Invalid(format!(
                "gemini.base_url = {:?} must start with ws:// or wss://",
                self.base_url
            )));
        }
        Ok(())
    }

    /// The door's initialization timeout: its own override, else the server's `default`.
    pub(crate) fn connect_timeout(
        &self,
        default: Option<std::time::Duration>,
    ) -> Option<std::time::Duration> {
        match self.connect_timeout_ms {
            None => default,
            Some(0) => None,
            Some(ms) => Some(std::time::Duration::from_millis(ms)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_overrides_and_masking() {
        let mut c = GeminiConfig::default();
        let env = |k: &str| match k {
            "VOXGATE_GEMINI_LISTEN" => Some("off".to_owned()),
            "VOXGATE_GEMINI_MODE" => Some("PassThrough".to_owned()),
            "VOXGATE_GEMINI_API_KEY" => Some("k".to_owned()),
            "VOXGATE_GEMINI_AUDIO_CHUNKS" => Some("yes".to_owned()),
            "VOXGATE_GEMINI_CONNECT_TIMEOUT_MS" => Some("250".to_owned()),
            "VOXGATE_GEMINI_TOKENS" => Some(" t1, t2 ,".to_owned()),
            _ => None,
        };
        c.apply_env(&env).unwrap();
        assert!(!c.own_listener);
        assert_eq!(c.mode, GeminiMode::Passthrough);
        assert!(c.audio_chunks);
        assert_eq!(c.tokens, ["t1", "t2"]);
        assert!(c.check().is_ok());
        let server = Some(std::time::Duration::from_secs(10));
        assert_eq!(
            c.connect_timeout(server),
            Some(std::time::Duration::from_millis(250))
        );
        assert_eq!(GeminiConfig::default().connect_timeout(server), server);
        let never = GeminiConfig {
            connect_timeout_ms: Some(0),
            ..GeminiConfig::default()
        };
        assert_eq!(never.connect_timeout(server), None);
        c.mask_secrets();
        assert_eq!(c.api_key.as_deref(), Some("***"));
        assert_eq!(c.tokens, ["***", "***"]);
        let printed = toml::to_string(&c).unwrap();
        assert!(
            !printed.contains("t1") && !printed.contains("t2"),
            "{printed}"
        );
        let blank = GeminiConfig {
            tokens: vec!["ok".into(), " ".into()],
            ..GeminiConfig::default()
        };
        assert!(blank.check().is_err());
        let bad = GeminiConfig::default()
            .apply_env(&|k: &str| (k == "VOXGATE_GEMINI_MODE").then(|| "cloud".to_owned()));
        assert!(matches!(bad, Err(ConfigError::Env { .. })));
        let c = GeminiConfig {
            base_url: "https://x".into(),
            ..GeminiConfig::default()
        };
        assert!(c.check().is_err());
    }
}
