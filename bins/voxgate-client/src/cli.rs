//! The command-line grammar, and its translation into each door's options.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use voxgate_xiaozhi::control::ListenMode;

use crate::chaos::ChaosOptions;
use crate::chaos::attacks::{
    AttackKind, AttackOptions, MAX_ATTACK_BYTES, MAX_ATTACK_PEERS, MAX_CANDIDATES,
    MAX_IDLE_CONNECTIONS, MAX_PERCEPTION_FANOUT,
};
use crate::events::Events;
use crate::gemini::GeminiOptions;
use crate::load::LoadOptions;
use crate::realtime::RealtimeOptions;
use crate::retell::RetellOptions;
use crate::webrtc::WebrtcOptions;
use crate::webrtc::load::WebrtcLoadOptions;
use crate::xiaozhi::XiaozhiOptions;

/// Speak a voxgate door's protocol; every server event is printed as one JSON line.
#[derive(Debug, Parser)]
#[command(name = "voxgate-client", version, about)]
pub struct Cli {
    /// The door to speak to.
    #[command(subcommand)]
    pub command: Command,
}

/// One subcommand per door, plus load generation.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// The realtime protobuf protocol (`ws://HOST:8080/realtime`).
    Realtime(RealtimeArgs),
    /// An ESP32 Xiaozhi device (`ws://HOST:8080/xiaozhi/v1/`).
    Xiaozhi(XiaozhiArgs),
    /// Retell's side of a custom-LLM WebSocket (`ws://HOST:8080/llm-websocket/CALL_ID`).
    Retell(RetellArgs),
    /// The Gemini bridge JSON protocol (`ws://HOST:3001/` or `ws://HOST:8080/gemini`).
    Gemini(GeminiArgs),
    /// WebRTC: the VIP browser door (`http://HOST:8080`, `POST /webrtc/offer`, data channel
    /// `vip`) or, with --gemini, the Gemini bridge's WebRTC signalling (`ws://HOST:8080/gemini`).
    Webrtc(WebrtcArgs),
    /// Generate load.
    #[command(subcommand)]
    Load(LoadCommand),
    /// Admission control and timeouts under abuse (floods, slowloris, dead peers) against a
    /// loopback server; prints a JSON report.
    Chaos(ChaosArgs),
}

/// What to load.
#[derive(Debug, Subcommand)]
pub enum LoadCommand {
    /// N concurrent Xiaozhi devices streaming Opus at real time; prints a JSON summary.
    Xiaozhi(LoadArgs),
    /// N concurrent WebRTC (VIP door) sessions, each streaming the WAV and receiving the
    /// reply; prints a JSON summary.
    Webrtc(LoadWebrtcArgs),
    /// N concurrent realtime sessions (WebSocket, or gRPC with --grpc) streaming 16 kHz PCM at
    /// real time with spoken replies; prints a JSON summary.
    Realtime(LoadRealtimeArgs),
}

/// Options every door shares.
#[derive(Debug, Args)]
pub struct Common {
    /// A text turn (repeatable; sent in order, each after the previous reply).
    #[arg(long = "text", value_name = "T")]
    pub texts: Vec<String>,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 30.0, value_name = "SECS")]
    pub timeout: f64,
}

impl Common {
    fn timeout(&self) -> Duration {
        Duration::try_from_secs_f64(self.timeout).unwrap_or(Duration::from_secs(30))
    }
}

/// `voxgate-client realtime`.
#[derive(Debug, Args)]
pub struct RealtimeArgs {
    /// WebSocket URL, e.g. ws://127.0.0.1:8080/realtime; with --grpc, the server's
    /// http://HOST:PORT.
    pub url: String,
    /// Speak gRPC (voxgate.realtime.v1.RealtimeService, plaintext HTTP/2) instead of WebSocket.
    #[arg(long)]
    pub grpc: bool,
    /// Declare a client tool NAME (a {"city": string} object schema) and answer each of its
    /// calls with RESULT (repeatable).
    #[arg(long = "tool-result", value_name = "NAME=RESULT", value_parser = parse_tool_result)]
    pub tool_results: Vec<(String, String)>,
    /// Write the oneof names of every server message, in order, as a JSON array to FILE; the
    /// session ends with a history export (for comparing clients' event sequences).
    #[arg(long, value_name = "FILE")]
    pub kinds_out: Option<PathBuf>,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: Common,
    /// A WAV file streamed at real time (resampled to --input-rate) after the text turns.
    #[arg(long, value_name = "FILE")]
    pub wav: Option<PathBuf>,
    /// Save the reply audio as WAV (asks for spoken replies).
    #[arg(long, value_name = "FILE")]
    pub save_reply: Option<PathBuf>,
    /// Bearer API key.
    #[arg(long, value_name = "K")]
    pub api_key: Option<String>,
    /// Ask for spoken replies even without --save-reply.
    #[arg(long)]
    pub tts: bool,
    /// The declared input line (16-bit mono) rate.
    #[arg(long, default_value_t = 16_000)]
    pub input_rate: u32,
    /// The requested output line (16-bit mono) rate.
    #[arg(long, default_value_t = 24_000)]
    pub output_rate: u32,
    /// System prompt.
    #[arg(long)]
    pub system_prompt: Option<String>,
}

/// How a Xiaozhi audio turn ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// The device sends `listen stop` after the audio.
    Manual,
    /// The server's VAD ends the turn (silence is streamed after the audio).
    Auto,
}

/// `voxgate-client xiaozhi`.
#[derive(Debug, Args)]
pub struct XiaozhiArgs {
    /// WebSocket URL, e.g. ws://127.0.0.1:8080/xiaozhi/v1/ (optional with --ota).
    pub url: Option<String>,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: Common,
    /// A WAV file streamed as 60 ms Opus frames at real time after the text turns.
    #[arg(long, value_name = "FILE")]
    pub wav: Option<PathBuf>,
    /// Save the decoded reply audio as WAV.
    #[arg(long, value_name = "FILE")]
    pub save_reply: Option<PathBuf>,
    /// Device-Id (MAC address).
    #[arg(long, default_value = "02:00:00:00:00:01")]
    pub device_id: String,
    /// Client-Id (UUID).
    #[arg(long, default_value = "0b0c0d0e-0000-4000-8000-000000000001")]
    pub client_id: String,
    /// Bearer token (default: the OTA's).
    #[arg(long)]
    pub token: Option<String>,
    /// Binary protocol version (default: the OTA's, else 1).
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=3))]
    pub protocol_version: Option<u8>,
    /// POST to this OTA URL first and use its WebSocket URL, token and version.
    #[arg(long, value_name = "URL")]
    pub ota: Option<String>,
    /// How the audio turn ends.
    #[arg(long, value_enum, default_value_t = Mode::Manual)]
    pub mode: Mode,
    /// Do not announce MCP (no device tools).
    #[arg(long)]
    pub no_mcp: bool,
}

/// `voxgate-client retell`.
#[derive(Debug, Args)]
pub struct RetellArgs {
    /// WebSocket URL, e.g. ws://127.0.0.1:8080/llm-websocket/call_123.
    pub url: String,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: Common,
    /// The agent id sent in call_details.
    #[arg(long, default_value = "agent_voxgate_client")]
    pub agent_id: String,
}

/// `voxgate-client gemini`.
#[derive(Debug, Args)]
pub struct GeminiArgs {
    /// WebSocket URL, e.g. ws://127.0.0.1:3001/ or ws://127.0.0.1:8080/gemini.
    pub url: String,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: Common,
    /// A WAV file streamed at real time as 16 kHz PCM after the text turns.
    #[arg(long, value_name = "FILE")]
    pub wav: Option<PathBuf>,
    /// Save the reply audio as WAV (asks for AUDIO replies).
    #[arg(long, value_name = "FILE")]
    pub save_reply: Option<PathBuf>,
    /// Ask for AUDIO replies even without --save-reply.
    #[arg(long)]
    pub audio: bool,
    /// The model named in the setup.
    #[arg(long, default_value = "models/gemini-2.0-flash-live-001")]
    pub model: String,
}

/// `voxgate-client webrtc`.
#[derive(Debug, Args)]
pub struct WebrtcArgs {
    /// The server's base URL, e.g. http://127.0.0.1:8080 (with --gemini: the bridge's
    /// WebSocket URL, e.g. ws://127.0.0.1:8080/gemini).
    pub url: String,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: Common,
    /// A WAV file streamed at real time over the audio track (20 ms Opus frames at 48 kHz,
    /// then 1.5 s of silence) after the text turns.
    #[arg(long, value_name = "FILE")]
    pub wav: Option<PathBuf>,
    /// Save the decoded reply audio (48 kHz mono WAV).
    #[arg(long, value_name = "FILE")]
    pub save_reply: Option<PathBuf>,
    /// Signal over the Gemini bridge's WebSocket (WEBRTC_OFFER) instead of the VIP door.
    #[arg(long)]
    pub gemini: bool,
    /// Declare a `set_theme` action (VIP) and answer its invocations with success.
    #[arg(long)]
    pub declare_theme: bool,
    /// The local address the UDP socket binds and advertises.
    #[arg(long, default_value = "127.0.0.1")]
    pub bind: std::net::IpAddr,
    /// The model named in the Gemini setup.
    #[arg(long, default_value = "models/gemini-2.0-flash-live-001")]
    pub model: String,
    /// A token for the VIP door (`[vip] tokens`), sent as `Authorization: Bearer`.
    #[arg(long, value_name = "T")]
    pub token: Option<String>,
}

/// `voxgate-client load webrtc`.
#[derive(Debug, Args)]
pub struct LoadWebrtcArgs {
    /// The server's base URL, e.g. http://127.0.0.1:8080.
    pub url: String,
    /// Concurrent sessions.
    #[arg(long, default_value_t = 10)]
    pub sessions: usize,
    /// Spoken turns per session.
    #[arg(long, default_value_t = 1)]
    pub turns: usize,
    /// Speech each turn streams.
    #[arg(long, value_name = "FILE")]
    pub wav: PathBuf,
    /// Seconds over which the sessions start.
    #[arg(long, default_value_t = 5.0)]
    pub ramp: f64,
    /// Seconds after which a session gives up.
    #[arg(long, default_value_t = 60.0)]
    pub timeout: f64,
    /// The local address the sessions' UDP sockets bind.
    #[arg(long, default_value = "127.0.0.1")]
    pub bind: std::net::IpAddr,
    /// The server's process id, to report its CPU and memory (Linux `/proc`).
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// A token for the VIP door (`[vip] tokens`), sent as `Authorization: Bearer`.
    #[arg(long, value_name = "T")]
    pub token: Option<String>,
}

/// `voxgate-client load xiaozhi`.
#[derive(Debug, Args)]
pub struct LoadArgs {
    /// WebSocket URL, e.g. ws://127.0.0.1:8080/xiaozhi/v1/.
    pub url: String,
    /// Concurrent sessions.
    #[arg(long, default_value_t = 10)]
    pub sessions: usize,
    /// Seconds during which sessions start bursts (the bursts in flight then finish).
    #[arg(long, default_value_t = 30)]
    pub seconds: u64,
    /// The speech of a burst (default: the built-in 2.09 s question).
    #[arg(long, value_name = "FILE")]
    pub wav: Option<PathBuf>,
    /// Seconds of silence streamed after the speech.
    #[arg(long, default_value_t = 2.0)]
    pub silence: f64,
    /// Seconds after a burst without `tts start` (or after an answer's last message without
    /// `tts stop`) before it counts as unanswered (unfinished) and the next burst starts.
    #[arg(long, default_value_t = 10.0)]
    pub answer_timeout: f64,
    /// Seconds over which the sessions start.
    #[arg(long, default_value_t = 5.0)]
    pub ramp: f64,
    /// Binary protocol version.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=3))]
    pub protocol_version: u8,
    /// Threads running the sessions (each a poll loop over its share of them; 1 is the
    /// cheapest).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub threads: u16,
}

/// `voxgate-client load realtime`.
#[derive(Debug, Args)]
pub struct LoadRealtimeArgs {
    /// ws://HOST:PORT/realtime, or with --grpc http://HOST:PORT.
    pub url: String,
    /// gRPC (voxgate.realtime.v1.RealtimeService) instead of WebSocket.
    #[arg(long)]
    pub grpc: bool,
    /// Concurrent sessions.
    #[arg(long, default_value_t = 10)]
    pub sessions: usize,
    /// Seconds during which sessions start bursts (the bursts in flight then finish).
    #[arg(long, default_value_t = 30)]
    pub seconds: u64,
    /// Seconds over which the sessions start.
    #[arg(long, default_value_t = 5.0)]
    pub ramp: f64,
    /// The speech of a burst (default: the built-in 2.09 s question).
    #[arg(long, value_name = "FILE")]
    pub wav: Option<PathBuf>,
    /// Seconds after a burst without a complete reply before it counts as unanswered.
    #[arg(long, default_value_t = 10.0)]
    pub answer_timeout: f64,
}

impl From<&LoadRealtimeArgs> for crate::load_realtime::RealtimeLoadOptions {
    fn from(a: &LoadRealtimeArgs) -> Self {
        Self {
            url: a.url.clone(),
            grpc: a.grpc,
            sessions: a.sessions,
            seconds: a.seconds,
            ramp: a.ramp,
            wav: a.wav.clone(),
            answer_timeout: a.answer_timeout,
        }
    }
}

/// `voxgate-client chaos` (run by `cargo xtask chaos`, which starts the server with limits).
#[derive(Debug, Args)]
pub struct ChaosArgs {
    /// The server's address, on 127.0.0.0/8, e.g. 127.0.0.1:8080.
    pub addr: std::net::SocketAddr,
    /// Admitted streaming Xiaozhi sessions.
    #[arg(long, default_value_t = 100)]
    pub sessions: usize,
    /// Admitted realtime sessions measuring ping round trips.
    #[arg(long, default_value_t = 4)]
    pub probes: usize,
    /// Speech the sessions stream (looped).
    #[arg(long, value_name = "FILE")]
    pub wav: PathBuf,
    /// Seconds over which the sessions start.
    #[arg(long, default_value_t = 5.0)]
    pub ramp: f64,
    /// Seconds of baseline before the flood.
    #[arg(long, default_value_t = 15.0)]
    pub before: f64,
    /// Upgrade attempts in the flood.
    #[arg(long, default_value_t = 5000)]
    pub attempts: usize,
    /// Flood attempts in flight at once.
    #[arg(long, default_value_t = 256)]
    pub concurrency: usize,
    /// Seconds the flood's attempts are spread over (0: as fast as possible).
    #[arg(long, default_value_t = 15.0)]
    pub flood_seconds: f64,
    /// Loopback source addresses for the flood (127.0.0.2 onwards; 0: 127.0.0.1 only).
    #[arg(long, default_value_t = 4)]
    pub sources: u8,
    /// Slowloris connections (half drip the upgrade request, half send nothing).
    #[arg(long, default_value_t = 200)]
    pub slow: usize,
    /// Seconds the slowloris connections are held.
    #[arg(long, default_value_t = 10.0)]
    pub slow_seconds: f64,
    /// Seconds between the dripped bytes.
    #[arg(long, default_value_t = 0.5)]
    pub drip: f64,
    /// The longest any timeout check waits for the server to close, in seconds.
    #[arg(long, default_value_t = 12.0)]
    pub check_limit: f64,
    /// The server's process id, to sample its open files, memory, children and CPU time.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// The attack phases to run after the timeout checks (comma-separated; `none` for none).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "long-reply,perception,idle-connections,candidates,parked-calls"
    )]
    pub attacks: Vec<AttackChoice>,
    /// Bytes of the long reply's `DirectSpeech` text.
    #[arg(long, default_value_t = 60_000)]
    pub long_reply_bytes: usize,
    /// Seconds the long reply is read.
    #[arg(long, default_value_t = 5.0)]
    pub long_reply_seconds: f64,
    /// Perception devices posting at once.
    #[arg(long, default_value_t = 16)]
    pub perception_devices: usize,
    /// Perception event names per device.
    #[arg(long, default_value_t = 64)]
    pub perception_names: usize,
    /// Bytes of `data` in each event of the first perception batch.
    #[arg(long, default_value_t = 60_000)]
    pub perception_big_bytes: usize,
    /// Bytes of `data` in each event of the second perception batch.
    #[arg(long, default_value_t = 4_000)]
    pub perception_small_bytes: usize,
    /// Idle keep-alive connections from one address.
    #[arg(long, default_value_t = 1_000)]
    pub idle_connections: usize,
    /// Connections dripping a second request head (and as many dripping a body).
    #[arg(long, default_value_t = 4)]
    pub idle_drips: usize,
    /// Seconds the idle connections are held once open.
    #[arg(long, default_value_t = 12.0)]
    pub idle_seconds: f64,
    /// Gemini bridge sockets flooding WebRTC candidates.
    #[arg(long, default_value_t = 4)]
    pub gemini_sockets: usize,
    /// `WEBRTC_ICE_CANDIDATE` messages per socket.
    #[arg(long, default_value_t = 25_000)]
    pub candidates: usize,
    /// Retell calls parked with a large `call_details`.
    #[arg(long, default_value_t = 10)]
    pub parked_calls: usize,
    /// Bytes of each parked call's `metadata`.
    #[arg(long, default_value_t = 8 << 20)]
    pub parked_bytes: usize,
}

/// One value of `chaos --attacks`: an attack, or `none`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AttackChoice {
    /// No attack phase.
    None,
    /// A realtime session's long `DirectSpeech`.
    LongReply,
    /// Perception events with large and then small data.
    Perception,
    /// Idle keep-alive connections and dripped heads and bodies from one address.
    IdleConnections,
    /// `WEBRTC_ICE_CANDIDATE` floods on Gemini bridge sockets.
    Candidates,
    /// Closed Retell calls with a large `call_details`.
    ParkedCalls,
}

impl AttackChoice {
    fn kind(self) -> Option<AttackKind> {
        match self {
            Self::None => None,
            Self::LongReply => Some(AttackKind::LongReply),
            Self::Perception => Some(AttackKind::Perception),
            Self::IdleConnections => Some(AttackKind::IdleConnections),
            Self::Candidates => Some(AttackKind::Candidates),
            Self::ParkedCalls => Some(AttackKind::ParkedCalls),
        }
    }
}

fn secs(s: f64, default: u64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(Duration::from_secs(default))
}

impl From<&ChaosArgs> for ChaosOptions {
    fn from(a: &ChaosArgs) -> Self {
        Self {
            addr: a.addr,
            sessions: a.sessions,
            probes: a.probes,
            wav: a.wav.clone(),
            ramp: secs(a.ramp, 5),
            before: secs(a.before, 15),
            attempts: a.attempts,
            concurrency: a.concurrency,
            flood: secs(a.flood_seconds, 15),
            sources: a.sources,
            slow: a.slow,
            slow_for: secs(a.slow_seconds, 10),
            drip: secs(a.drip, 1),
            check_limit: secs(a.check_limit, 12),
            server_pid: a.server_pid,
            attacks: AttackOptions {
                run: a.attacks.iter().filter_map(|c| c.kind()).collect(),
                long_reply_bytes: a.long_reply_bytes.min(MAX_ATTACK_BYTES),
                long_reply_for: secs(a.long_reply_seconds, 5),
                perception_devices: a.perception_devices.min(MAX_PERCEPTION_FANOUT),
                perception_names: a.perception_names.min(MAX_PERCEPTION_FANOUT),
                perception_big: a.perception_big_bytes.min(MAX_ATTACK_BYTES),
                perception_small: a.perception_small_bytes.min(MAX_ATTACK_BYTES),
                idle_connections: a.idle_connections.min(MAX_IDLE_CONNECTIONS),
                idle_drips: a.idle_drips.min(MAX_ATTACK_PEERS),
                idle_for: secs(a.idle_seconds, 12),
                gemini_sockets: a.gemini_sockets.min(MAX_ATTACK_PEERS),
                candidates: a.candidates.min(MAX_CANDIDATES),
                parked_calls: a.parked_calls.min(MAX_ATTACK_PEERS),
                parked_bytes: a.parked_bytes.min(MAX_ATTACK_BYTES),
            },
        }
    }
}

/// `NAME=RESULT` of `--tool-result`.
fn parse_tool_result(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((name, result)) if !name.is_empty() => Ok((name.to_owned(), result.to_owned())),
        _ => Err(format!("{s:?} is not NAME=RESULT")),
    }
}

impl From<&RealtimeArgs> for RealtimeOptions {
    fn from(a: &RealtimeArgs) -> Self {
        Self {
            url: a.url.clone(),
            grpc: a.grpc,
            tool_results: a.tool_results.clone(),
            kinds_out: a.kinds_out.clone(),
            texts: a.common.texts.clone(),
            wav: a.wav.clone(),
            save_reply: a.save_reply.clone(),
            api_key: a.api_key.clone(),
            input_rate: a.input_rate,
            output_rate: a.output_rate,
            tts: a.tts,
            system_prompt: a.system_prompt.clone(),
            timeout: a.common.timeout(),
        }
    }
}

impl From<&XiaozhiArgs> for XiaozhiOptions {
    fn from(a: &XiaozhiArgs) -> Self {
        Self {
            url: a.url.clone(),
            ota: a.ota.clone(),
            texts: a.common.texts.clone(),
            wav: a.wav.clone(),
            save_reply: a.save_reply.clone(),
            device_id: a.device_id.clone(),
            client_id: a.client_id.clone(),
            token: a.token.clone(),
            protocol_version: a.protocol_version,
            mode: match a.mode {
                Mode::Manual => ListenMode::Manual,
                Mode::Auto => ListenMode::Auto,
            },
            mcp: !a.no_mcp,
            timeout: a.common.timeout(),
        }
    }
}

impl From<&RetellArgs> for RetellOptions {
    fn from(a: &RetellArgs) -> Self {
        Self {
            url: a.url.clone(),
            texts: a.common.texts.clone(),
            agent_id: a.agent_id.clone(),
            timeout: a.common.timeout(),
        }
    }
}

impl From<&GeminiArgs> for GeminiOptions {
    fn from(a: &GeminiArgs) -> Self {
        Self {
            url: a.url.clone(),
            texts: a.common.texts.clone(),
            wav: a.wav.clone(),
            save_reply: a.save_reply.clone(),
            model: a.model.clone(),
            audio: a.audio,
            timeout: a.common.timeout(),
        }
    }
}

impl From<&WebrtcArgs> for WebrtcOptions {
    fn from(a: &WebrtcArgs) -> Self {
        Self {
            url: a.url.clone(),
            gemini: a.gemini,
            texts: a.common.texts.clone(),
            wav: a.wav.clone(),
            save_reply: a.save_reply.clone(),
            declare_theme: a.declare_theme,
            bind: a.bind,
            model: a.model.clone(),
            token: a.token.clone(),
            timeout: a.common.timeout(),
        }
    }
}

impl From<&LoadWebrtcArgs> for WebrtcLoadOptions {
    fn from(a: &LoadWebrtcArgs) -> Self {
        Self {
            url: a.url.clone(),
            sessions: a.sessions,
            turns: a.turns,
            wav: a.wav.clone(),
            ramp: secs(a.ramp, 5),
            timeout: secs(a.timeout, 60),
            bind: a.bind,
            server_pid: a.server_pid,
            token: a.token.clone(),
        }
    }
}

impl From<&LoadArgs> for LoadOptions {
    fn from(a: &LoadArgs) -> Self {
        Self {
            url: a.url.clone(),
            sessions: a.sessions,
            seconds: a.seconds,
            wav: a.wav.clone(),
            silence: secs(a.silence, 2),
            answer_timeout: secs(a.answer_timeout, 10),
            ramp: secs(a.ramp, 5),
            protocol_version: a.protocol_version,
            threads: usize::from(a.threads),
        }
    }
}

impl Cli {
    /// The runtime the command runs on: for the Xiaozhi load a single-threaded one (it only
    /// connects the sessions; `--threads` driver threads run them), everything else
    /// multi-threaded.
    ///
    /// # Errors
    /// When the runtime cannot start.
    pub fn runtime(&self) -> std::io::Result<tokio::runtime::Runtime> {
        match &self.command {
            // Sockets and timers only: no signal or process driver to poll at every turn.
            // The sessions run on the load's own driver threads; the runtime only connects
            // them.
            Command::Load(LoadCommand::Xiaozhi(_)) => tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .enable_time()
                .build(),
            _ => tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build(),
        }
    }

    /// Runs the command, printing events on stdout.
    ///
    /// # Errors
    /// The session's error.
    pub async fn run(&self) -> anyhow::Result<()> {
        let mut events = Events::stdout();
        match &self.command {
            Command::Realtime(a) => crate::realtime::run(&a.into(), &mut events).await.map(drop),
            Command::Xiaozhi(a) => crate::xiaozhi::run(&a.into(), &mut events).await.map(drop),
            Command::Retell(a) => crate::retell::run(&a.into(), &mut events).await.map(drop),
            Command::Gemini(a) => crate::gemini::run(&a.into(), &mut events).await.map(drop),
            Command::Webrtc(a) => crate::webrtc::run(&a.into(), &mut events).await.map(drop),
            Command::Load(LoadCommand::Webrtc(a)) => {
                let summary = crate::webrtc::load::run(&a.into()).await?;
                println!("{}", serde_json::to_string(&summary)?);
                Ok(())
            }
            Command::Load(LoadCommand::Realtime(a)) => {
                let summary = crate::load_realtime::run(&a.into()).await?;
                println!("{}", serde_json::to_string(&summary)?);
                Ok(())
            }
            Command::Load(LoadCommand::Xiaozhi(a)) => {
                let summary = crate::load::run(&a.into()).await?;
                println!("{}", serde_json::to_string(&summary)?);
                Ok(())
            }
            Command::Chaos(a) => {
                let report = crate::chaos::run(&a.into()).await?;
                println!("{}", serde_json::to_string(&report)?);
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("voxgate-client").chain(args.iter().copied()))
    }

    #[test]
    fn grammar_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn realtime_arguments_become_options() {
        let cli = parse(&[
            "realtime",
            "ws://h/realtime",
            "--text",
            "a",
            "--text",
            "b",
            "--save-reply",
            "r.wav",
            "--api-key",
            "k",
            "--timeout",
            "2.5",
        ])
        .unwrap();
        let Command::Realtime(a) = &cli.command else {
            panic!()
        };
        let o = RealtimeOptions::from(a);
        assert_eq!(o.texts, ["a", "b"]);
        assert_eq!(o.api_key.as_deref(), Some("k"));
        assert_eq!(o.timeout, Duration::from_millis(2500));
        assert_eq!((o.input_rate, o.output_rate), (16_000, 24_000));
        assert!(o.save_reply.is_some());
    }

    #[test]
    fn xiaozhi_url_is_optional_and_versions_are_checked() {
        let cli = parse(&[
            "xiaozhi",
            "--ota",
            "http://h/xiaozhi/ota/",
            "--mode",
            "auto",
            "--no-mcp",
        ])
        .unwrap();
        let Command::Xiaozhi(a) = &cli.command else {
            panic!()
        };
        let o = XiaozhiOptions::from(a);
        assert_eq!(o.url, None);
        assert_eq!(o.mode, ListenMode::Auto);
        assert!(!o.mcp);
        assert!(parse(&["xiaozhi", "ws://h/", "--protocol-version", "4"]).is_err());
        assert!(parse(&["xiaozhi", "ws://h/", "--protocol-version", "3"]).is_ok());
    }

    #[test]
    fn load_defaults_to_the_built_in_question_on_one_thread() {
        let cli = parse(&["load", "xiaozhi", "ws://h/"]).unwrap();
        let Command::Load(LoadCommand::Xiaozhi(a)) = &cli.command else {
            panic!()
        };
        let o = LoadOptions::from(a);
        assert_eq!(o.wav, None);
        assert_eq!(o.silence, Duration::from_secs(2));
        assert_eq!(o.answer_timeout, Duration::from_secs(10));
        assert_eq!(a.threads, 1);
        assert!(parse(&["load", "xiaozhi", "ws://h/", "--threads", "0"]).is_err());
        let cli = parse(&[
            "load",
            "xiaozhi",
            "ws://h/",
            "--answer-timeout",
            "2.5",
            "--silence",
            "1",
            "--threads",
            "2",
        ])
        .unwrap();
        let Command::Load(LoadCommand::Xiaozhi(a)) = &cli.command else {
            panic!()
        };
        let o = LoadOptions::from(a);
        assert_eq!(o.answer_timeout, Duration::from_millis(2500));
        assert_eq!(o.silence, Duration::from_secs(1));
        let cli = parse(&[
            "load",
            "xiaozhi",
            "ws://h/",
            "--sessions",
            "200",
            "--seconds",
            "30",
            "--wav",
            "s.wav",
        ])
        .unwrap();
        let Command::Load(LoadCommand::Xiaozhi(a)) = &cli.command else {
            panic!()
        };
        let o = LoadOptions::from(a);
        assert_eq!((o.sessions, o.seconds), (200, 30));
    }

    #[test]
    fn webrtc_arguments_become_options() {
        let cli = parse(&[
            "webrtc",
            "http://h:8080",
            "--wav",
            "s.wav",
            "--save-reply",
            "r.wav",
            "--text",
            "hi",
            "--declare-theme",
            "--timeout",
            "5",
        ])
        .unwrap();
        let Command::Webrtc(a) = &cli.command else {
            panic!()
        };
        let o = WebrtcOptions::from(a);
        assert!(!o.gemini && o.declare_theme);
        assert_eq!(o.texts, ["hi"]);
        assert_eq!(o.timeout, Duration::from_secs(5));
        assert_eq!(o.bind, std::net::IpAddr::from([127, 0, 0, 1]));
        let cli = parse(&[
            "webrtc",
            "ws://h:8080/gemini",
            "--gemini",
            "--bind",
            "10.0.0.2",
        ])
        .unwrap();
        let Command::Webrtc(a) = &cli.command else {
            panic!()
        };
        let o = WebrtcOptions::from(a);
        assert!(o.gemini);
        assert_eq!(o.bind, std::net::IpAddr::from([10, 0, 0, 2]));
        assert!(parse(&["webrtc", "http://h", "--bind", "nope"]).is_err());
        assert!(parse(&["load", "webrtc", "http://h"]).is_err());
        let cli = parse(&[
            "load",
            "webrtc",
            "http://h:8080",
            "--sessions",
            "200",
            "--wav",
            "s.wav",
            "--server-pid",
            "7",
        ])
        .unwrap();
        let Command::Load(LoadCommand::Webrtc(a)) = &cli.command else {
            panic!()
        };
        let o = WebrtcLoadOptions::from(a);
        assert_eq!((o.sessions, o.turns, o.server_pid), (200, 1, Some(7)));
    }

    #[test]
    fn chaos_takes_an_address_and_durations() {
        assert!(parse(&["chaos", "not-an-address", "--wav", "s.wav"]).is_err());
        let cli = parse(&[
            "chaos",
            "127.0.0.1:8080",
            "--wav",
            "s.wav",
            "--attempts",
            "500",
            "--flood-seconds",
            "2.5",
            "--server-pid",
            "42",
        ])
        .unwrap();
        let Command::Chaos(a) = &cli.command else {
            panic!()
        };
        let o = ChaosOptions::from(a);
        assert_eq!((o.attempts, o.sessions, o.server_pid), (500, 100, Some(42)));
        assert_eq!(o.flood, Duration::from_millis(2500));
        assert_eq!(o.drip, Duration::from_millis(500));
        // Every attack by default, in their order; sizes as the defaults say.
        assert_eq!(o.attacks.run, AttackKind::ALL);
        assert_eq!(o.attacks.parked_bytes, 8 << 20);
        assert_eq!(o.attacks.idle_for, Duration::from_secs(12));
    }

    #[test]
    fn chaos_attacks_are_chosen_and_bounded() {
        let cli = parse(&[
            "chaos",
            "127.0.0.1:8080",
            "--wav",
            "s.wav",
            "--attacks",
            "parked-calls,long-reply",
            "--idle-connections",
            "1000000",
            "--parked-bytes",
            "99999999999",
        ])
        .unwrap();
        let Command::Chaos(a) = &cli.command else {
            panic!()
        };
        let o = ChaosOptions::from(a);
        assert_eq!(
            o.attacks.run,
            [AttackKind::ParkedCalls, AttackKind::LongReply]
        );
        assert_eq!(o.attacks.idle_connections, MAX_IDLE_CONNECTIONS);
        assert_eq!(o.attacks.parked_bytes, MAX_ATTACK_BYTES);
        let cli = parse(&["chaos", "127.0.0.1:1", "--wav", "s", "--attacks", "none"]).unwrap();
        let Command::Chaos(a) = &cli.command else {
            panic!()
        };
        assert!(ChaosOptions::from(a).attacks.run.is_empty());
        assert!(parse(&["chaos", "127.0.0.1:1", "--wav", "s", "--attacks", "bogus"]).is_err());
    }

    #[test]
    fn retell_and_gemini_take_repeated_texts() {
        let cli = parse(&[
            "retell",
            "ws://h/llm-websocket/c1",
            "--text",
            "hi",
            "--text",
            "bye",
        ])
        .unwrap();
        let Command::Retell(a) = &cli.command else {
            panic!()
        };
        assert_eq!(RetellOptions::from(a).texts.len(), 2);
        let cli = parse(&["gemini", "ws://h:3001/", "--text", "hi", "--audio"]).unwrap();
        let Command::Gemini(a) = &cli.command else {
            panic!()
        };
        assert!(GeminiOptions::from(a).audio);
    }
}
