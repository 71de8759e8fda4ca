//! Settings of the Xiaozhi door (`[xiaozhi]`).
//!
//! ```toml
//! [xiaozhi]
//! listen = "0.0.0.0:8000"          # own WebSocket listener, any path (off when absent)
//! ota_listen = "0.0.0.0:8003"      # own OTA listener (off when absent)
//! websocket_url = ""               # OTA `websocket.url`; empty: ws://<Host header>/xiaozhi/v1/
//! protocol_version = 1             # OTA `websocket.version`: the device's binary framing
//! auth = false                     # tokens only for allowed/activated devices; checked on upgrade
//! token_secret = ""                # HMAC key for tokens; empty: random per process
//! allowed_devices = []             # device ids (MACs) issued a token at OTA without activation
//! activation_timeout_secs = 600    # a pending activation code expires after this long
//! max_pending_activations = 256    # pending codes kept in all
//! max_pending_activations_per_address = 8  # pending codes one address (IPv6: /64) holds; 0: no limit
//! ota_rate_per_sec = 5             # OTA and /activate requests a second per address; 0: no limit
//! ota_rate_burst = 10              # ... after a burst of this many
//! activated_devices_file = ""      # JSON list of activated devices; empty: memory only
//! hello_timeout_ms = 10000         # close (1008) a connection without a valid hello by then
//! idle_timeout_secs = 120          # close (1000) a connection silent for this long (0: never)
//! output_sample_rate = 24000       # downlink Opus rate (8000/12000/16000/24000/48000)
//! output_frame_ms = 60             # downlink frame length (20, 40 or 60)
//! lead_frames = 5                  # frames sent at once before real-time pacing
//! opus_backend = "auto"            # "auto" (libopus when built in, else pure), "pure", "libopus"
//! opus_application = "audio"       # downlink encoder mode: "audio" (like the reference server) or "voip"
//! opus_bitrate = 24000             # downlink bits per second
//! opus_complexity = 5              # downlink encoder complexity (0-10)
//! emotions = ["🙂", "😆", ...]     # faces allowed (emoji or firmware names); default: all 21
//! default_emotion = "🙂"           # face for replies without an allowed leading emoji
//! wake_words = ["你好小智", ...]    # `listen detect` texts that are wake words, not turns
//! greet_on_wake = true             # answer a wake word with a greeting turn
//! vision_url = ""                  # MCP `vision.url`; empty: http://<Host>/xiaozhi/vision/explain
//! timezone_offset_minutes = 0      # OTA `server_time.timezone_offset`
//! system_prompt = "..."            # the model's instructions for device sessions
//! ```

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};
use voxgate_audio::opus::{OpusApplication, OpusBackend};
use voxgate_engine::emotion::EmojiPolicy;
use voxgate_xiaozhi::emotion::{Emotion, FIRMWARE_EMOJI};

use crate::config::ConfigError;
use crate::config::env::{EnvVars, Secret};

/// The largest `max_pending_activations`: each pending code is looked through on OTA.
const MAX_PENDING_ACTIVATIONS: usize = 4096;

const DEFAULT_WAKE_WORDS: [&str; 8] = [
    "你好小智",
    "你好小志",
    "小爱同学",
    "你好小鑫",
    "小美同学",
    "嗨，乐鑫",
    "hi esp",
    "hey esp",
];

/// The default instructions: short spoken answers that start with one face emoji, which the
/// door turns into the device's `llm` emotion frame.
const DEFAULT_SYSTEM_PROMPT: &str = "You are a friendly voice assistant running on a small \
device with a speaker and a screen. Start every reply with exactly one emoji that shows your \
mood, then answer in one to three short spoken sentences without markdown. Use the device's \
tools when the user asks you to change something on the device.";

/// Which Opus implementation the door's encoder and decoder use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpusBackendChoice {
    /// libopus when the server was built with the `libopus` feature, else the pure-Rust codec.
    #[default]
    Auto,
    /// The pure-Rust `opus-rs` codec (always available).
    Pure,
    /// libopus (a build with the `libopus` feature, the default): about a tenth of the pure
    /// codec's memory per codec and faster.
    Libopus,
}

impl OpusBackendChoice {
    /// The backend this choice resolves to in this build.
    #[must_use]
    pub fn resolve(self) -> OpusBackend {
        match self {
            Self::Pure => OpusBackend::Pure,
            Self::Libopus => OpusBackend::Libopus,
            Self::Auto if OpusBackend::Libopus.is_available() => OpusBackend::Libopus,
            Self::Auto => OpusBackend::Pure,
        }
    }
}

impl std::str::FromStr for OpusBackendChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => Ok(Self::Auto),
            "pure" => Ok(Self::Pure),
            "libopus" => Ok(Self::Libopus),
            other => Err(format!("{other:?} is not one of auto, pure, libopus")),
        }
    }
}

/// The downlink encoder's mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DownlinkApplication {
    /// Opus `APPLICATION_AUDIO`, what the Xiaozhi reference servers encode replies with: at
    /// 24 kbit/s the encoder picks CELT, which costs a quarter of the CPU of `voip`.
    #[default]
    Audio,
    /// Opus `APPLICATION_VOIP` (SILK/hybrid): favours intelligibility at low bitrates.
    Voip,
}

impl DownlinkApplication {
    /// The audio crate's application.
    #[must_use]
    pub fn to_opus(self) -> OpusApplication {
        match self {
            Self::Audio => OpusApplication::Audio,
            Self::Voip => OpusApplication::Voip,
        }
    }
}

impl std::str::FromStr for DownlinkApplication {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "audio" => Ok(Self::Audio),
            "voip" => Ok(Self::Voip),
            other => Err(format!("{other:?} is not one of audio, voip")),
        }
    }
}

/// Settings of the Xiaozhi door (`[xiaozhi]` in the configuration file). See the
/// Xiaozhi door page (`docs/doors/xiaozhi.md`) for every key with its default.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct XiaozhiConfig {
    /// The door's own WebSocket listener (any path accepted, like the reference server's
    /// port 8000). `None`: only `/xiaozhi/v1/` on the main listener.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// The door's own OTA listener (like the reference server's port 8003). `None`: only
    /// `/xiaozhi/ota/` on the main listener.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ota_listen: Option<SocketAddr>,
    /// The `websocket.url` OTA hands out; empty: built from the request's `Host` header.
    pub websocket_url: String,
    /// The `websocket.version` OTA hands out (1, 2 or 3): the binary framing the device will
    /// use. Connections follow whatever `Protocol-Version` the device sends.
    pub protocol_version: u8,
    /// Token authentication. On: OTA issues a token only to a device on `allowed_devices` or
    /// activated by an operator (others get an activation code), and the upgrade needs a valid
    /// token (`Authorization: Bearer`, or the `authorization` query parameter) bound to the
    /// `Device-Id` and `Client-Id` it presents; refused upgrades get `401`. Off (the default,
    /// for a trusted LAN): OTA hands every device its URL and a token, which nobody checks.
    pub auth: bool,
    /// HMAC-SHA256 key for device tokens; empty: a random key per process (tokens then stop
    /// working when the server restarts, and devices fetch new ones at their next boot).
    pub token_secret: String,
    /// Device ids that OTA issues a token to without activation when `auth` is on. The list
    /// decides who gets a token, never who may connect without one.
    pub allowed_devices: Vec<String>,
    /// Seconds a pending activation code stays valid.
    pub activation_timeout_secs: u64,
    /// Pending activations kept at once. When full, a new one replaces the oldest code of
    /// the address holding the most.
    pub max_pending_activations: usize,
    /// Pending activations one address (an IPv6 /64) holds at once; its next one replaces its
    /// own oldest, so an address flooding OTA only evicts its own codes. 0: no limit but
    /// `max_pending_activations`.
    pub max_pending_activations_per_address: usize,
    /// `POST` OTA and `/activate` requests one address (an IPv6 /64) may make a second, each
    /// endpoint counted apart; beyond them `429` with `Retry-After`. 0: no limit.
    pub ota_rate_per_sec: u32,
    /// The burst those requests may come in (the bucket's size), at least 1.
    pub ota_rate_burst: u32,
    /// Where activated devices are kept across restarts (a JSON list, rewritten atomically on
    /// each activation); empty: in memory only.
    pub activated_devices_file: String,
    /// A connection that has not sent a valid `hello` after this many milliseconds is closed
    /// with 1008. This is the door's own initialization timeout: it replaces the server-wide
    /// one of the shared door driver for device sessions.
    pub hello_timeout_ms: u64,
    /// A connection with no frame from the device for this many seconds is closed with 1000
    /// (0: never). This is the door's own idle timeout: it replaces the server-wide one of the
    /// shared door driver for device sessions (WebSocket keepalive pings still run).
    pub idle_timeout_secs: u64,
    /// The downlink Opus sample rate announced in the server hello.
    pub output_sample_rate: u32,
    /// The downlink frame length in milliseconds announced in the server hello.
    pub output_frame_ms: u32,
    /// Reply frames sent at once before pacing at real time (the device buffers 40).
    pub lead_frames: u32,
    /// The Opus implementation for the device's audio in both directions.
    pub opus_backend: OpusBackendChoice,
    /// The downlink encoder's mode.
    pub opus_application: DownlinkApplication,
    /// The downlink encoder's bitrate in bits per second.
    pub opus_bitrate: u32,
    /// The downlink encoder's complexity, 0 (cheapest) to 10.
    pub opus_complexity: u8,
    /// Faces the device may show: emoji or firmware names (`happy`). A reply whose leading
    /// emoji is not listed shows `default_emotion` instead.
    pub emotions: Vec<String>,
    /// The face for replies without an allowed leading emoji.
    pub default_emotion: String,
    /// `listen detect` texts treated as wake words (compared ignoring case, spaces and
    /// punctuation); any other text is a user turn.
    pub wake_words: Vec<String>,
    /// Answer a wake word with a greeting (`true`) or only acknowledge it (`stt` + `tts stop`).
    pub greet_on_wake: bool,
    /// The `vision.url` sent in MCP `initialize`; empty: built from the `Host` header.
    pub vision_url: String,
    /// `server_time.timezone_offset` in OTA answers, minutes east of UTC.
    pub timezone_offset_minutes: i32,
    /// The model's instructions for device sessions.
    pub system_prompt: String,
    /// Offer the tools of the external MCP servers connected to `/mcp` to this door's
    /// conversations (run by the server, bounded by `[mcp] call_timeout_secs`). Default on:
    /// only the operator's `/mcp` endpoint supplies them.
    pub mcp_tools: bool,
    /// `[xiaozhi.engine]`: engine settings for this door, over `[engine]` (`greeting` is said on a wake word).
    #[serde(skip_serializing_if = "crate::config::EngineSettings::is_empty")]
    pub engine: crate::config::EngineSettings,
}

impl Default for XiaozhiConfig {
    fn default() -> Self {
        Self {
            mcp_tools: true,
            listen: None,
            ota_listen: None,
            websocket_url: String::new(),
            protocol_version: 1,
            auth: false,
            token_secret: String::new(),
            allowed_devices: Vec::new(),
            activation_timeout_secs: 600,
            max_pending_activations: 256,
            max_pending_activations_per_address: 8,
            ota_rate_per_sec: 5,
            ota_rate_burst: 10,
            activated_devices_file: String::new(),
            hello_timeout_ms: 10_000,
            idle_timeout_secs: 120,
            output_sample_rate: 24_000,
            output_frame_ms: 60,
            lead_frames: 5,
            opus_backend: OpusBackendChoice::Auto,
            opus_application: DownlinkApplication::Audio,
            opus_bitrate: 24_000,
            opus_complexity: 5,
            // The firmware's 21 faces.
            emotions: FIRMWARE_EMOJI
                .iter()
                .map(|(e, _)| (*e).to_owned())
                .collect(),
            default_emotion: "🙂".to_owned(),
            wake_words: DEFAULT_WAKE_WORDS.iter().map(|s| (*s).to_owned()).collect(),
            greet_on_wake: true,
            vision_url: String::new(),
            timezone_offset_minutes: 0,
            system_prompt: DEFAULT_SYSTEM_PROMPT.to_owned(),
            engine: crate::config::EngineSettings::default(),
        }
    }
}

/// An emoji for a configured face: the entry itself, or the emoji of a firmware name.
fn face(entry: &str) -> String {
    let entry = entry.trim();
    Emotion::from(entry.to_ascii_lowercase().as_str())
        .emoji()
        .map_or_else(|| entry.to_owned(), str::to_owned)
}

impl XiaozhiConfig {
    /// Applies the door's `VOXGATE_XIAOZHI_*` environment overrides.
    pub(crate) fn apply_env(
        &mut self,
        var: &impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        let vars = EnvVars::new(var);
        vars.parsed_or_none("VOXGATE_XIAOZHI_LISTEN", &mut self.listen)?;
        vars.parsed_or_none("VOXGATE_XIAOZHI_OTA_LISTEN", &mut self.ota_listen)?;
        vars.trimmed("VOXGATE_XIAOZHI_WEBSOCKET_URL", &mut self.websocket_url);
        vars.parsed(
            "VOXGATE_XIAOZHI_PROTOCOL_VERSION",
            &mut self.protocol_version,
        )?;
        vars.flag_blank_false("VOXGATE_XIAOZHI_AUTH", &mut self.auth)?;
        vars.string("VOXGATE_XIAOZHI_TOKEN_SECRET", &mut self.token_secret);
        vars.list("VOXGATE_XIAOZHI_ALLOWED_DEVICES", &mut self.allowed_devices);
        vars.parsed(
            "VOXGATE_XIAOZHI_ACTIVATION_TIMEOUT_SECS",
            &mut self.activation_timeout_secs,
        )?;
        vars.parsed(
            "VOXGATE_XIAOZHI_MAX_PENDING_ACTIVATIONS",
            &mut self.max_pending_activations,
        )?;
        vars.parsed(
            "VOXGATE_XIAOZHI_MAX_PENDING_ACTIVATIONS_PER_ADDRESS",
            &mut self.max_pending_activations_per_address,
        )?;
        vars.parsed(
            "VOXGATE_XIAOZHI_OTA_RATE_PER_SEC",
            &mut self.ota_rate_per_sec,
        )?;
        vars.parsed("VOXGATE_XIAOZHI_OTA_RATE_BURST", &mut self.ota_rate_burst)?;
        vars.trimmed(
            "VOXGATE_XIAOZHI_ACTIVATED_DEVICES_FILE",
            &mut self.activated_devices_file,
        );
        vars.parsed(
            "VOXGATE_XIAOZHI_HELLO_TIMEOUT_MS",
            &mut self.hello_timeout_ms,
        )?;
        vars.parsed(
            "VOXGATE_XIAOZHI_IDLE_TIMEOUT_SECS",
            &mut self.idle_timeout_secs,
        )?;
        vars.parsed(
            "VOXGATE_XIAOZHI_OUTPUT_SAMPLE_RATE",
            &mut self.output_sample_rate,
        )?;
        vars.parsed("VOXGATE_XIAOZHI_OUTPUT_FRAME_MS", &mut self.output_frame_ms)?;
        vars.parsed("VOXGATE_XIAOZHI_LEAD_FRAMES", &mut self.lead_frames)?;
        vars.parsed("VOXGATE_XIAOZHI_OPUS_BACKEND", &mut self.opus_backend)?;
        vars.parsed(
            "VOXGATE_XIAOZHI_OPUS_APPLICATION",
            &mut self.opus_application,
        )?;
        vars.parsed("VOXGATE_XIAOZHI_OPUS_BITRATE", &mut self.opus_bitrate)?;
        vars.parsed("VOXGATE_XIAOZHI_OPUS_COMPLEXITY", &mut self.opus_complexity)?;
        vars.list("VOXGATE_XIAOZHI_EMOTIONS", &mut self.emotions);
        vars.trimmed("VOXGATE_XIAOZHI_DEFAULT_EMOTION", &mut self.default_emotion);
        vars.list("VOXGATE_XIAOZHI_WAKE_WORDS", &mut self.wake_words);
        vars.flag_blank_false("VOXGATE_XIAOZHI_GREET_ON_WAKE", &mut self.greet_on_wake)?;
        vars.flag("VOXGATE_XIAOZHI_MCP_TOOLS", &mut self.mcp_tools)?;
        vars.trimmed("VOXGATE_XIAOZHI_VISION_URL", &mut self.vision_url);
        let offset = &mut self.timezone_offset_minutes;
        vars.parsed("VOXGATE_XIAOZHI_TIMEZONE_OFFSET_MINUTES", offset)?;
        vars.string("VOXGATE_XIAOZHI_SYSTEM_PROMPT", &mut self.system_prompt);
        Ok(())
    }

    /// Replaces secrets with `***` for `--print-config`.
    pub(crate) fn mask_secrets(&mut self) {
        self.token_secret.mask();
    }

    /// Moves the door's own listeners (those enabled) to free loopback ports.
    pub(crate) fn ephemeral_ports(&mut self) {
        let free = SocketAddr::from(([127, 0, 0, 1], 0));
        if self.listen.is_some() {
            self.listen = Some(free);
        }
        if self.ota_listen.is_some() {
            self.ota_listen = Some(free);
        }
    }

    /// Rejects values out of range.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(format!("[xiaozhi] {m}")));
        if !(1..=3).contains(&self.protocol_version) {
            return bad(format!(
                "protocol_version = {} (must be 1, 2 or 3)",
                self.protocol_version
            ));
        }
        if ![8_000, 12_000, 16_000, 24_000, 48_000].contains(&self.output_sample_rate) {
            return bad(format!(
                "output_sample_rate = {} (must be an Opus rate: 8000, 12000, 16000, 24000 or 48000)",
                self.output_sample_rate
            ));
        }
        if ![20, 40, 60].contains(&self.output_frame_ms) {
            return bad(format!(
                "output_frame_ms = {} (must be 20, 40 or 60)",
                self.output_frame_ms
            ));
        }
        if self.lead_frames > 40 {
            return bad(format!(
                "lead_frames = {} exceeds the device's 40-frame buffer",
                self.lead_frames
            ));
        }
        if !self.opus_backend.resolve().is_available() {
            return bad(
                "opus_backend = \"libopus\" needs a server built with the `libopus` feature \
                 (the default; this one was built with --no-default-features)"
                    .into(),
            );
        }
        if !(6_000..=510_000).contains(&self.opus_bitrate) {
            return bad(format!(
                "opus_bitrate = {} (must be 6000 to 510000)",
                self.opus_bitrate
            ));
        }
        if self.opus_complexity > 10 {
            return bad(format!(
                "opus_complexity = {} (must be 0 to 10)",
                self.opus_complexity
            ));
        }
        if self.hello_timeout_ms == 0 {
            return bad("hello_timeout_ms must be positive".into());
        }
        if self.activation_timeout_secs == 0 {
            return bad("activation_timeout_secs must be positive".into());
        }
        if !(1..=MAX_PENDING_ACTIVATIONS).contains(&self.max_pending_activations) {
            return bad(format!(
                "max_pending_activations = {} (must be 1 to {MAX_PENDING_ACTIVATIONS})",
                self.max_pending_activations
            ));
        }
        if self.ota_rate_per_sec > 0 && self.ota_rate_burst == 0 {
            return bad(
                "ota_rate_burst must be at least 1 (or ota_rate_per_sec 0: no limit)".into(),
            );
        }
        if self.default_emotion.trim().is_empty() {
            return bad("default_emotion must not be empty".into());
        }
        Ok(())
    }

    /// The emotion allowlist and default as the engine's policy.
    pub(crate) fn emoji_policy(&self) -> EmojiPolicy {
        let default = face(&self.default_emotion);
        if self.emotions.is_empty() {
            return EmojiPolicy::any(default);
        }
        EmojiPolicy::new(self.emotions.iter().map(|e| face(e)), default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_overrides_and_checks() {
        let mut c = XiaozhiConfig::default();
        let env = |k: &str| match k {
            "VOXGATE_XIAOZHI_LISTEN" => Some("0.0.0.0:8000".to_owned()),
            "VOXGATE_XIAOZHI_AUTH" => Some("true".to_owned()),
            "VOXGATE_XIAOZHI_ALLOWED_DEVICES" => Some("AA:bb:cc:dd:ee:ff, x".to_owned()),
            "VOXGATE_XIAOZHI_EMOTIONS" => Some("happy,😠".to_owned()),
            "VOXGATE_XIAOZHI_TOKEN_SECRET" => Some("s".to_owned()),
            "VOXGATE_XIAOZHI_ACTIVATION_TIMEOUT_SECS" => Some("90".to_owned()),
            "VOXGATE_XIAOZHI_MAX_PENDING_ACTIVATIONS" => Some("8".to_owned()),
            "VOXGATE_XIAOZHI_MAX_PENDING_ACTIVATIONS_PER_ADDRESS" => Some("2".to_owned()),
            "VOXGATE_XIAOZHI_OTA_RATE_PER_SEC" => Some("0".to_owned()),
            "VOXGATE_XIAOZHI_OTA_RATE_BURST" => Some("3".to_owned()),
            "VOXGATE_XIAOZHI_ACTIVATED_DEVICES_FILE" => Some(" /var/lib/v/a.json ".to_owned()),
            _ => None,
        };
        c.apply_env(&env).unwrap();
        assert_eq!(c.listen.unwrap().port(), 8000);
        assert!(c.auth);
        assert_eq!(c.activation_timeout_secs, 90);
        assert_eq!(c.max_pending_activations, 8);
        assert_eq!(c.max_pending_activations_per_address, 2);
        assert_eq!((c.ota_rate_per_sec, c.ota_rate_burst), (0, 3));
        assert_eq!(c.activated_devices_file, "/var/lib/v/a.json");
        assert_eq!(c.allowed_devices.len(), 2);
        let policy = c.emoji_policy();
        assert!(policy.is_allowed("🙂"));
        assert!(policy.is_allowed("😠"));
        assert!(!policy.is_allowed("😭"));
        c.mask_secrets();
        assert_eq!(c.token_secret, "***");
        c.check().unwrap();
        c.output_frame_ms = 30;
        assert!(c.check().is_err());
        for bad in [
            XiaozhiConfig {
                activation_timeout_secs: 0,
                ..XiaozhiConfig::default()
            },
            XiaozhiConfig {
                max_pending_activations: 0,
                ..XiaozhiConfig::default()
            },
            XiaozhiConfig {
                max_pending_activations: MAX_PENDING_ACTIVATIONS + 1,
                ..XiaozhiConfig::default()
            },
            XiaozhiConfig {
                ota_rate_burst: 0,
                ..XiaozhiConfig::default()
            },
        ] {
            assert!(bad.check().is_err());
        }
        let bad = XiaozhiConfig::default()
            .apply_env(&|k: &str| (k == "VOXGATE_XIAOZHI_AUTH").then(|| "maybe".to_owned()));
        assert!(bad.is_err());
    }

    #[test]
    fn opus_settings_from_env_and_checks() {
        let mut c = XiaozhiConfig::default();
        assert_eq!(c.opus_application, DownlinkApplication::Audio);
        let env = |k: &str| match k {
            "VOXGATE_XIAOZHI_OPUS_BACKEND" => Some("Pure".to_owned()),
            "VOXGATE_XIAOZHI_OPUS_APPLICATION" => Some("voip".to_owned()),
            "VOXGATE_XIAOZHI_OPUS_BITRATE" => Some("32000".to_owned()),
            "VOXGATE_XIAOZHI_OPUS_COMPLEXITY" => Some("9".to_owned()),
            _ => None,
        };
        c.apply_env(&env).unwrap();
        assert_eq!(c.opus_backend.resolve(), OpusBackend::Pure);
        assert_eq!(c.opus_application.to_opus(), OpusApplication::Voip);
        assert_eq!((c.opus_bitrate, c.opus_complexity), (32_000, 9));
        c.check().unwrap();
        c.opus_complexity = 11;
        assert!(c.check().is_err());
        c.opus_complexity = 5;
        c.opus_bitrate = 1_000;
        assert!(c.check().is_err());
        let bad = XiaozhiConfig::default().apply_env(&|k: &str| {
            (k == "VOXGATE_XIAOZHI_OPUS_BACKEND").then(|| "ffmpeg".to_owned())
        });
        assert!(bad.is_err());
        // `auto` takes libopus exactly when it is compiled in; asking for it without the
        // feature is a configuration error, not a surprise at the first connection.
        let libopus = XiaozhiConfig {
            opus_backend: OpusBackendChoice::Libopus,
            ..XiaozhiConfig::default()
        };
        assert_eq!(libopus.check().is_ok(), OpusBackend::Libopus.is_available());
        assert_eq!(
            OpusBackendChoice::Auto.resolve() == OpusBackend::Libopus,
            OpusBackend::Libopus.is_available()
        );
    }

    #[test]
    fn default_policy_is_the_firmware_faces() {
        let p = XiaozhiConfig::default().emoji_policy();
        assert_eq!(p.default_emoji(), "🙂");
        assert_eq!(p.allowed().unwrap().len(), 21);
        assert!(!p.is_allowed("🎉"));
    }
}
