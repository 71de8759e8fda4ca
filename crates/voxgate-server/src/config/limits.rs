//! The `[limits]` section: how many sessions the server admits, how fast one address may open
//! them, and the lifecycle timeouts every session runs under. See `docs/limits.md`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ConfigError;
use super::env::EnvVars;

/// Streaming sessions one core is sized for by default.
///
/// Measured with the Xiaozhi load test (`cargo xtask load`, streaming devices, Opus both ways):
/// one core carried 500 sessions at a p99 of 644 ms from end of speech to first audio and
/// degraded at 600 (p99 2,012 ms). 400 keeps a fifth of a core free for provider calls, the
/// other doors and bursts, so an admitted session stays in the fast regime.
pub const SESSIONS_PER_CORE: usize = 400;

/// Admission limits and session lifecycle timeouts, shared by every door.
///
/// Every field takes 0 to mean "off": no limit, no timeout, no guard. The defaults are sized
/// from measurement rather than guessed:
///
/// - [`max_sessions`](Self::max_sessions): [`SESSIONS_PER_CORE`] (400) times the cores
///   [`std::thread::available_parallelism`] reports. One core carried 500 streaming Xiaozhi
///   sessions at p99 644 ms end-of-speech-to-first-audio and fell over at 600 (2,012 ms), so a
///   fifth of headroom below the knee.
/// - [`max_sessions_per_door`](Self::max_sessions_per_door): the same figure, so by default
///   only the whole-server limit binds; set it lower to keep one door from starving the others.
/// - [`max_sessions_per_ip`](Self::max_sessions_per_ip): 50, a building full of devices
///   behind one NAT, but a small share of a server (one address cannot take it all).
/// - [`max_handshakes_per_sec_per_ip`](Self::max_handshakes_per_sec_per_ip): 20 a second with
///   a burst of the same, far above what a reconnecting device needs, far below a flood.
/// - [`max_scheduling_delay_ms`](Self::max_scheduling_delay_ms): 50 ms. Audio is paced in
///   60 ms frames; when the runtime wakes a 20 ms timer more than 50 ms late (smoothed), every
///   admitted session is already close to missing frames, so new ones wait.
/// - timeouts: init 10 s (a device's `hello` arrives in milliseconds), idle 300 s (a device
///   in standby keeps its socket), ping every 20 s (a peer is dead after two missed pongs,
///   within a NAT's usual 60 s mapping lifetime), write 10 s (a peer not reading for that long
///   is gone), shutdown grace 5 s (most replies finish within it).
/// - [`max_history_messages`](Self::max_history_messages): 100 messages (about 50 exchanges):
///   a full history of long messages (400-character questions, 1,200-character answers with a
///   tool call) measured about 163 KB, well under 256 KB a session; the LLM context keeps its
///   own character budget, smaller than that.
/// - [`max_idle_provider_connections`](Self::max_idle_provider_connections): 32 per HTTP
///   provider, enough to ride out the second-to-second swing of a few hundred requests in
///   flight; without a cap the pool grew under steady load to hundreds of idle connections
///   (`docs/performance.md`, "Long-lived sessions").
/// - [`max_synth_processes`](Self::max_synth_processes): two per core, at least four. A
///   synthesizer process (espeak-ng, a `command` voice) is mostly CPU: more at once only
///   makes each slower, and one long reply once started over a thousand at the same time.
///
/// Behind a reverse proxy every session comes from the proxy's address: set
/// `max_sessions_per_ip` and `max_handshakes_per_sec_per_ip` to 0 there (the proxy should do
/// per-client limiting; forwarded headers are not trusted).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Sessions open at once over the whole server, every door together; 0: unlimited.
    pub max_sessions: usize,
    /// Sessions open at once on any one door; 0: unlimited.
    pub max_sessions_per_door: usize,
    /// Sessions open at once from one IP address (every door together); 0: unlimited.
    pub max_sessions_per_ip: usize,
    /// WebSocket handshakes one IP address may attempt per second (a token bucket holding one
    /// second's worth, so bursts up to this many pass); 0: unlimited.
    pub max_handshakes_per_sec_per_ip: u32,
    /// The overload guard: while the runtime's smoothed scheduling delay is above this many
    /// milliseconds, new sessions are refused (`overload`); 0: never refuse for it.
    pub max_scheduling_delay_ms: u64,
    /// Seconds a connection has to send each HTTP request head, from the moment the server
    /// waits for it (the connection's first bytes, or the end of the previous response on a
    /// keep-alive HTTP/1.1 connection) before it is dropped: slow-drip ("slowloris") and
    /// silent connections hold no descriptor longer than this. 0: no limit.
    pub header_timeout_secs: u64,
    /// Seconds an HTTP connection may have no request in flight before it is closed: an
    /// HTTP/2 (h2c) connection with no open stream, an HTTP/1.1 keep-alive connection between
    /// requests (which [`header_timeout_secs`](Self::header_timeout_secs) bounds as well).
    /// Upgraded WebSocket sessions are not HTTP requests any more and keep their own timeouts.
    /// 0: no limit.
    pub http_idle_timeout_secs: u64,
    /// Seconds a request has to deliver its whole body, from its head; a body not complete by
    /// then fails and the request is answered `408`. Not applied to the realtime gRPC
    /// service, whose request body is a whole session. 0: no limit.
    pub body_timeout_secs: u64,
    /// TCP connections open at once from one IP address, on every listener together, upgraded
    /// WebSocket sessions included (each holds a descriptor); one more is answered `429` and
    /// closed at once. Keep it above
    /// [`max_sessions_per_ip`](Self::max_sessions_per_ip). 0: unlimited.
    pub max_connections_per_ip: usize,
    /// Seconds a session has to initialize (a `hello`, a config message) before it is closed;
    /// 0: no limit.
    pub init_timeout_secs: u64,
    /// Seconds a client may send nothing before its session is closed; 0: no limit.
    pub idle_timeout_secs: u64,
    /// Seconds between WebSocket pings; a peer that misses two pongs is dead. 0: no pings.
    pub ping_interval_secs: u64,
    /// Seconds a peer may take to accept one frame before it is closed; 0: no limit.
    pub write_timeout_secs: u64,
    /// At shutdown, seconds a session may take to finish its reply before it is closed; 0:
    /// close at once.
    pub shutdown_grace_secs: u64,
    /// Conversation history kept per session, in messages; older ones are dropped. 0: no limit.
    pub max_history_messages: usize,
    /// Idle connections each HTTP provider (LLM, recognizer, synthesizer, each fallback) keeps
    /// open to its host for later requests; one coming free beyond them is closed. Requests in
    /// flight are never limited. 0: no cap.
    pub max_idle_provider_connections: usize,
    /// Synthesizer processes (`espeak-ng`, `[tts] provider = "command"`) the whole server
    /// runs at once; sentences beyond them wait for one to end. 0: no cap.
    pub max_synth_processes: usize,
}

/// Default [`LimitsConfig::max_sessions_per_ip`].
pub const DEFAULT_MAX_SESSIONS_PER_IP: usize = 50;
/// Default [`LimitsConfig::max_connections_per_ip`].
pub const DEFAULT_MAX_CONNECTIONS_PER_IP: usize = 128;
/// Default [`LimitsConfig::header_timeout_secs`].
pub const DEFAULT_HEADER_TIMEOUT_SECS: u64 = 10;
/// Default [`LimitsConfig::http_idle_timeout_secs`].
pub const DEFAULT_HTTP_IDLE_TIMEOUT_SECS: u64 = 60;
/// Default [`LimitsConfig::body_timeout_secs`].
pub const DEFAULT_BODY_TIMEOUT_SECS: u64 = 30;
/// Default [`LimitsConfig::max_handshakes_per_sec_per_ip`].
pub const DEFAULT_MAX_HANDSHAKES_PER_SEC_PER_IP: u32 = 20;
/// Default [`LimitsConfig::max_scheduling_delay_ms`].
pub const DEFAULT_MAX_SCHEDULING_DELAY_MS: u64 = 50;
/// Default [`LimitsConfig::max_history_messages`].
pub const DEFAULT_MAX_HISTORY_MESSAGES: usize = voxgate_engine::DEFAULT_MAX_HISTORY_MESSAGES;
/// Default [`LimitsConfig::max_idle_provider_connections`].
pub const DEFAULT_MAX_IDLE_PROVIDER_CONNECTIONS: usize =
    voxgate_providers::DEFAULT_MAX_IDLE_CONNECTIONS;

/// [`SESSIONS_PER_CORE`] times the cores this process may use (1 when unknown).
#[must_use]
pub fn default_max_sessions() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    SESSIONS_PER_CORE.saturating_mul(cores)
}

impl Default for LimitsConfig {
    fn default() -> Self {
        let max_sessions = default_max_sessions();
        Self {
            max_sessions,
            max_sessions_per_door: max_sessions,
            max_sessions_per_ip: DEFAULT_MAX_SESSIONS_PER_IP,
            max_handshakes_per_sec_per_ip: DEFAULT_MAX_HANDSHAKES_PER_SEC_PER_IP,
            max_scheduling_delay_ms: DEFAULT_MAX_SCHEDULING_DELAY_MS,
            header_timeout_secs: DEFAULT_HEADER_TIMEOUT_SECS,
            http_idle_timeout_secs: DEFAULT_HTTP_IDLE_TIMEOUT_SECS,
            body_timeout_secs: DEFAULT_BODY_TIMEOUT_SECS,
            max_connections_per_ip: DEFAULT_MAX_CONNECTIONS_PER_IP,
            init_timeout_secs: 10,
            idle_timeout_secs: 300,
            ping_interval_secs: 20,
            write_timeout_secs: 10,
            shutdown_grace_secs: 5,
            max_history_messages: DEFAULT_MAX_HISTORY_MESSAGES,
            max_idle_provider_connections: DEFAULT_MAX_IDLE_PROVIDER_CONNECTIONS,
            max_synth_processes: voxgate_providers::default_max_processes(),
        }
    }
}

/// `secs` as a duration, `None` for 0 (off).
fn optional_secs(secs: u64) -> Option<Duration> {
    (secs > 0).then(|| Duration::from_secs(secs))
}

impl LimitsConfig {
    /// Every limit and timeout off: what embedders and load tests use to measure the server
    /// itself.
    #[must_use]
    pub fn unlimited() -> Self {
        Self {
            max_sessions: 0,
            max_sessions_per_door: 0,
            max_sessions_per_ip: 0,
            max_handshakes_per_sec_per_ip: 0,
            max_scheduling_delay_ms: 0,
            header_timeout_secs: 0,
            http_idle_timeout_secs: 0,
            body_timeout_secs: 0,
            max_connections_per_ip: 0,
            init_timeout_secs: 0,
            idle_timeout_secs: 0,
            ping_interval_secs: 0,
            write_timeout_secs: 0,
            shutdown_grace_secs: 0,
            max_history_messages: 0,
            max_idle_provider_connections: 0,
            max_synth_processes: 0,
        }
    }

    /// [`Self::header_timeout_secs`] as a duration; `None` when off.
    #[must_use]
    pub fn header_timeout(&self) -> Option<Duration> {
        optional_secs(self.header_timeout_secs)
    }

    /// [`Self::http_idle_timeout_secs`] as a duration; `None` when off.
    #[must_use]
    pub fn http_idle_timeout(&self) -> Option<Duration> {
        optional_secs(self.http_idle_timeout_secs)
    }

    /// [`Self::body_timeout_secs`] as a duration; `None` when off.
    #[must_use]
    pub fn body_timeout(&self) -> Option<Duration> {
        optional_secs(self.body_timeout_secs)
    }

    /// [`Self::init_timeout_secs`] as a duration; `None` when off.
    #[must_use]
    pub fn init_timeout(&self) -> Option<Duration> {
        optional_secs(self.init_timeout_secs)
    }

    /// [`Self::idle_timeout_secs`] as a duration; `None` when off.
    #[must_use]
    pub fn idle_timeout(&self) -> Option<Duration> {
        optional_secs(self.idle_timeout_secs)
    }

    /// [`Self::ping_interval_secs`] as a duration; `None` when off.
    #[must_use]
    pub fn ping_interval(&self) -> Option<Duration> {
        optional_secs(self.ping_interval_secs)
    }

    /// [`Self::write_timeout_secs`] as a duration; `None` when off.
    #[must_use]
    pub fn write_timeout(&self) -> Option<Duration> {
        optional_secs(self.write_timeout_secs)
    }

    /// [`Self::shutdown_grace_secs`] as a duration (zero: close at once).
    #[must_use]
    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(self.shutdown_grace_secs)
    }

    /// [`Self::max_scheduling_delay_ms`] as a duration; `None` when the guard is off.
    #[must_use]
    pub fn max_scheduling_delay(&self) -> Option<Duration> {
        (self.max_scheduling_delay_ms > 0)
            .then(|| Duration::from_millis(self.max_scheduling_delay_ms))
    }

    /// [`Self::max_history_messages`]; `None` when unlimited.
    #[must_use]
    pub fn history_limit(&self) -> Option<usize> {
        (self.max_history_messages > 0).then_some(self.max_history_messages)
    }

    /// [`Self::max_idle_provider_connections`] as the HTTP client's cap (0: none).
    #[must_use]
    pub fn provider_idle_connection_cap(&self) -> usize {
        match self.max_idle_provider_connections {
            0 => usize::MAX,
            n => n,
        }
    }

    /// [`Self::max_synth_processes`] as a pool size (0: as many as the OS allows).
    #[must_use]
    pub fn synth_process_cap(&self) -> usize {
        match self.max_synth_processes {
            0 => usize::MAX,
            n => n,
        }
    }

    /// Applies the `VOXGATE_MAX_SESSIONS`, `VOXGATE_MAX_SESSIONS_PER_DOOR`,
    /// `VOXGATE_MAX_SESSIONS_PER_IP`, `VOXGATE_MAX_HANDSHAKES_PER_SEC_PER_IP`,
    /// `VOXGATE_MAX_SCHEDULING_DELAY_MS`, `VOXGATE_HEADER_TIMEOUT_SECS`,
    /// `VOXGATE_HTTP_IDLE_TIMEOUT_SECS`, `VOXGATE_BODY_TIMEOUT_SECS`,
    /// `VOXGATE_MAX_CONNECTIONS_PER_IP`, `VOXGATE_INIT_TIMEOUT_SECS`,
    /// `VOXGATE_IDLE_TIMEOUT_SECS`, `VOXGATE_PING_INTERVAL_SECS`, `VOXGATE_WRITE_TIMEOUT_SECS`,
    /// `VOXGATE_SHUTDOWN_GRACE_SECS`, `VOXGATE_MAX_HISTORY_MESSAGES`,
    /// `VOXGATE_MAX_IDLE_PROVIDER_CONNECTIONS` and `VOXGATE_MAX_SYNTH_PROCESSES` overrides.
    pub(crate) fn apply_env(
        &mut self,
        var: &impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        let vars = EnvVars::new(var);
        vars.parsed("VOXGATE_MAX_SESSIONS", &mut self.max_sessions)?;
        vars.parsed(
            "VOXGATE_MAX_SESSIONS_PER_DOOR",
            &mut self.max_sessions_per_door,
        )?;
        vars.parsed("VOXGATE_MAX_SESSIONS_PER_IP", &mut self.max_sessions_per_ip)?;
        vars.parsed(
            "VOXGATE_MAX_HANDSHAKES_PER_SEC_PER_IP",
            &mut self.max_handshakes_per_sec_per_ip,
        )?;
        vars.parsed(
            "VOXGATE_MAX_SCHEDULING_DELAY_MS",
            &mut self.max_scheduling_delay_ms,
        )?;
        vars.parsed("VOXGATE_HEADER_TIMEOUT_SECS", &mut self.header_timeout_secs)?;
        vars.parsed(
            "VOXGATE_HTTP_IDLE_TIMEOUT_SECS",
            &mut self.http_idle_timeout_secs,
        )?;
        vars.parsed("VOXGATE_BODY_TIMEOUT_SECS", &mut self.body_timeout_secs)?;
        vars.parsed(
            "VOXGATE_MAX_CONNECTIONS_PER_IP",
            &mut self.max_connections_per_ip,
        )?;
        vars.parsed("VOXGATE_INIT_TIMEOUT_SECS", &mut self.init_timeout_secs)?;
        vars.parsed("VOXGATE_IDLE_TIMEOUT_SECS", &mut self.idle_timeout_secs)?;
        vars.parsed("VOXGATE_PING_INTERVAL_SECS", &mut self.ping_interval_secs)?;
        vars.parsed("VOXGATE_WRITE_TIMEOUT_SECS", &mut self.write_timeout_secs)?;
        vars.parsed("VOXGATE_SHUTDOWN_GRACE_SECS", &mut self.shutdown_grace_secs)?;
        vars.parsed(
            "VOXGATE_MAX_HISTORY_MESSAGES",
            &mut self.max_history_messages,
        )?;
        vars.parsed(
            "VOXGATE_MAX_IDLE_PROVIDER_CONNECTIONS",
            &mut self.max_idle_provider_connections,
        )?;
        vars.parsed("VOXGATE_MAX_SYNTH_PROCESSES", &mut self.max_synth_processes)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn defaults_are_sized_from_the_cores() {
        let l = LimitsConfig::default();
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        assert_eq!(l.max_sessions, 400 * cores);
        assert!(l.max_sessions / cores < 500, "below the measured knee");
        assert_eq!(l.max_sessions_per_door, l.max_sessions);
        assert_eq!(l.max_sessions_per_ip, 50);
        assert_eq!(l.max_handshakes_per_sec_per_ip, 20);
        assert_eq!(l.max_scheduling_delay(), Some(Duration::from_millis(50)));
        assert_eq!(l.header_timeout(), Some(Duration::from_secs(10)));
        assert_eq!(l.http_idle_timeout(), Some(Duration::from_secs(60)));
        assert_eq!(l.body_timeout(), Some(Duration::from_secs(30)));
        assert_eq!(l.max_connections_per_ip, 128);
        assert!(l.max_connections_per_ip > l.max_sessions_per_ip);
        assert_eq!(l.init_timeout(), Some(Duration::from_secs(10)));
        assert_eq!(l.idle_timeout(), Some(Duration::from_secs(300)));
        assert_eq!(l.ping_interval(), Some(Duration::from_secs(20)));
        assert_eq!(l.write_timeout(), Some(Duration::from_secs(10)));
        assert_eq!(l.shutdown_grace(), Duration::from_secs(5));
        assert_eq!(l.history_limit(), Some(100));
    }

    #[test]
    fn zero_turns_each_off() {
        let l = LimitsConfig::unlimited();
        assert_eq!(l.header_timeout(), None);
        assert_eq!(l.http_idle_timeout(), None);
        assert_eq!(l.body_timeout(), None);
        assert_eq!(l.init_timeout(), None);
        assert_eq!(l.idle_timeout(), None);
        assert_eq!(l.ping_interval(), None);
        assert_eq!(l.write_timeout(), None);
        assert_eq!(l.max_scheduling_delay(), None);
        assert_eq!(l.history_limit(), None);
        assert_eq!(l.shutdown_grace(), Duration::ZERO);
    }

    #[test]
    fn file_section_parses_over_defaults_and_round_trips() {
        let c = Config::from_toml(
            "[limits]\nmax_sessions = 8\nmax_sessions_per_ip = 0\n\
             max_handshakes_per_sec_per_ip = 3\nidle_timeout_secs = 60\n",
        )
        .unwrap();
        assert_eq!(c.limits.max_sessions, 8);
        assert_eq!(c.limits.max_sessions_per_ip, 0);
        assert_eq!(c.limits.max_handshakes_per_sec_per_ip, 3);
        assert_eq!(c.limits.idle_timeout_secs, 60);
        assert_eq!(
            c.limits.max_sessions_per_door,
            default_max_sessions(),
            "unset fields keep their defaults"
        );
        assert_eq!(c.limits.write_timeout_secs, 10);
        assert_eq!(Config::from_toml(&c.to_toml()).unwrap(), c);
        assert!(matches!(
            Config::from_toml("[limits]\nmax_session = 8\n"),
            Err(ConfigError::Parse(_))
        ));
        assert!(matches!(
            Config::from_toml("[limits]\nmax_sessions = -1\n"),
            Err(ConfigError::Parse(_))
        ));
    }

    #[test]
    fn every_variable_overrides_its_field() {
        let mut c = Config::default();
        c.apply_env(|k| {
            let v = match k {
                "VOXGATE_MAX_SESSIONS" => "1",
                "VOXGATE_MAX_SESSIONS_PER_DOOR" => "2",
                "VOXGATE_MAX_SESSIONS_PER_IP" => "3",
                "VOXGATE_MAX_HANDSHAKES_PER_SEC_PER_IP" => "4",
                "VOXGATE_MAX_SCHEDULING_DELAY_MS" => "5",
                "VOXGATE_HEADER_TIMEOUT_SECS" => "11",
                "VOXGATE_HTTP_IDLE_TIMEOUT_SECS" => "14",
                "VOXGATE_BODY_TIMEOUT_SECS" => "15",
                "VOXGATE_MAX_CONNECTIONS_PER_IP" => "16",
                "VOXGATE_INIT_TIMEOUT_SECS" => "6",
                "VOXGATE_IDLE_TIMEOUT_SECS" => "7",
                "VOXGATE_PING_INTERVAL_SECS" => "8",
                "VOXGATE_WRITE_TIMEOUT_SECS" => "9",
                "VOXGATE_SHUTDOWN_GRACE_SECS" => " 10 ",
                "VOXGATE_MAX_HISTORY_MESSAGES" => "0",
                "VOXGATE_MAX_IDLE_PROVIDER_CONNECTIONS" => "12",
                "VOXGATE_MAX_SYNTH_PROCESSES" => "13",
                _ => return None,
            };
            Some(v.to_owned())
        })
        .unwrap();
        assert_eq!(
            c.limits,
            LimitsConfig {
                max_sessions: 1,
                max_sessions_per_door: 2,
                max_sessions_per_ip: 3,
                max_handshakes_per_sec_per_ip: 4,
                max_scheduling_delay_ms: 5,
                header_timeout_secs: 11,
                http_idle_timeout_secs: 14,
                body_timeout_secs: 15,
                max_connections_per_ip: 16,
                init_timeout_secs: 6,
                idle_timeout_secs: 7,
                ping_interval_secs: 8,
                write_timeout_secs: 9,
                shutdown_grace_secs: 10,
                max_history_messages: 0,
                max_idle_provider_connections: 12,
                max_synth_processes: 13,
            }
        );
        let bad =
            Config::default().apply_env(|k| (k == "VOXGATE_MAX_SESSIONS").then(|| "many".into()));
        assert!(matches!(
            bad,
            Err(ConfigError::Env {
                name: "VOXGATE_MAX_SESSIONS",
                ..
            })
        ));
        let bad = Config::default()
            .apply_env(|k| (k == "VOXGATE_MAX_HANDSHAKES_PER_SEC_PER_IP").then(|| "-1".into()));
        assert!(matches!(bad, Err(ConfigError::Env { .. })));
    }
}
