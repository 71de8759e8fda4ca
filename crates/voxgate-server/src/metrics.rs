//! A small Prometheus registry of atomics, rendered in the text exposition format at
//! `GET /metrics`.
//!
//! Hand-rolled because the set is small and fixed: counters and gauges per door, and latency
//! summaries (`_sum` and `_count`) per provider kind. Updates are single relaxed atomic adds,
//! cheap enough for the audio path.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Which protocol a session speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Door {
    /// The realtime protobuf protocol.
    Realtime,
    /// The Xiaozhi device protocol (WebSocket JSON + Opus).
    Xiaozhi,
    /// The Gemini bridge JSON protocol.
    Gemini,
    /// Retell's custom-LLM WebSocket.
    Retell,
    /// The MCP endpoint where external tool servers connect in.
    Mcp,
    /// The VIP browser door (WebRTC, `POST /webrtc/offer`).
    Vip,
}

/// Which way a dropped audio frame was travelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Client to server: the session could not keep up with what the client sent.
    Uplink,
    /// Server to client: the client (or its network) did not take the audio fast enough.
    Downlink,
}

impl Direction {
    /// The `direction` label value in `/metrics`.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Uplink => "uplink",
            Self::Downlink => "downlink",
        }
    }

    const fn index(self) -> usize {
        match self {
            Self::Uplink => 0,
            Self::Downlink => 1,
        }
    }
}

/// How many doors there are (the length of the per-door counter arrays).
pub(crate) const DOORS: usize = 6;

impl Door {
    /// Every door, in the order they are rendered.
    pub const ALL: [Self; DOORS] = [
        Self::Realtime,
        Self::Xiaozhi,
        Self::Gemini,
        Self::Retell,
        Self::Mcp,
        Self::Vip,
    ];

    /// The `door` label value in `/metrics` and `/health`.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Realtime => "realtime",
            Self::Xiaozhi => "xiaozhi",
            Self::Gemini => "gemini",
            Self::Retell => "retell",
            Self::Mcp => "mcp",
            Self::Vip => "vip",
        }
    }

    pub(crate) fn index(self) -> usize {
        match self {
            Self::Realtime => 0,
            Self::Xiaozhi => 1,
            Self::Gemini => 2,
            Self::Retell => 3,
            Self::Mcp => 4,
            Self::Vip => 5,
        }
    }
}

/// Why a session was refused before its WebSocket handshake (see `crate::admission`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RefusalReason {
    /// The whole server holds `max_sessions`.
    CapacityServer,
    /// The door holds `max_sessions_per_door`.
    CapacityDoor,
    /// The peer's address holds `max_sessions_per_ip`.
    PerIp,
    /// The peer's address attempts handshakes faster than `max_handshakes_per_sec_per_ip`.
    HandshakeRate,
    /// The runtime is late (scheduling delay over `max_scheduling_delay_ms`), or too many
    /// addresses are being tracked at once.
    Overload,
}

/// How many refusal reasons there are.
const REASONS: usize = 5;

impl RefusalReason {
    /// Every reason, in the order they are rendered.
    pub const ALL: [Self; REASONS] = [
        Self::CapacityServer,
        Self::CapacityDoor,
        Self::PerIp,
        Self::HandshakeRate,
        Self::Overload,
    ];

    /// The `reason` label value in `/metrics`.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::CapacityServer => "capacity_server",
            Self::CapacityDoor => "capacity_door",
            Self::PerIp => "per_ip",
            Self::HandshakeRate => "handshake_rate",
            Self::Overload => "overload",
        }
    }

    const fn index(self) -> usize {
        match self {
            Self::CapacityServer => 0,
            Self::CapacityDoor => 1,
            Self::PerIp => 2,
            Self::HandshakeRate => 3,
            Self::Overload => 4,
        }
    }
}

/// Which provider a latency belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProviderKind {
    /// Time from request to the first LLM event.
    Llm,
    /// Time to a transcript.
    Asr,
    /// Time from request to the first synthesized audio.
    Tts,
}

impl ProviderKind {
    const ALL: [Self; 3] = [Self::Llm, Self::Asr, Self::Tts];

    fn label(self) -> &'static str {
        match self {
            Self::Llm => "llm",
            Self::Asr => "asr",
            Self::Tts => "tts",
        }
    }

    fn index(self) -> usize {
        match self {
            Self::Llm => 0,
            Self::Asr => 1,
            Self::Tts => 2,
        }
    }
}

#[derive(Debug, Default)]
struct Latency {
    micros: AtomicU64,
    count: AtomicU64,
    failures: AtomicU64,
    /// Requests whose deadline (first output or idle) ran out.
    timeouts: AtomicU64,
    /// Requests handed to the fallback provider.
    fallbacks: AtomicU64,
}

/// Process-wide counters; shared by every session through an `Arc`.
#[derive(Debug, Default)]
pub struct Metrics {
    sessions_total: [AtomicU64; DOORS],
    sessions_active: [AtomicU64; DOORS],
    turns: [AtomicU64; DOORS],
    errors: [AtomicU64; DOORS],
    /// Indexed by [`Direction::index`], then door.
    dropped_frames: [[AtomicU64; DOORS]; 2],
    /// Indexed by [`RefusalReason::index`], then door.
    refused: [[AtomicU64; DOORS]; REASONS],
    /// The overload guard's current figure, in microseconds.
    scheduling_delay_micros: AtomicU64,
    latency: [Latency; 3],
    /// WebRTC reply frames sent more than a frame late.
    webrtc_late_frames: AtomicU64,
    /// WebRTC datagrams dropped because their connection was behind.
    webrtc_dropped_datagrams: AtomicU64,
    /// Per door: the server's own time from a turn's decision to its first reply audio
    /// frame written, provider waits excluded.
    server_added: [Histogram; DOORS],
    /// Speculations by outcome ([`SPECULATION_OUTCOMES`]), then door.
    speculations: [[AtomicU64; DOORS]; 3],
    /// Speculative provider requests by outcome ([`SPECULATIVE_REQUEST_OUTCOMES`]), then door.
    speculative_requests: [[AtomicU64; DOORS]; 3],
}

/// Upper bounds of the server-added latency buckets, in microseconds: fine below 10 ms,
/// where the server's share should be, and coarse above to see an overloaded one.
const SERVER_ADDED_BUCKETS_MICROS: [u64; 14] = [
    250, 500, 1_000, 2_000, 3_000, 5_000, 7_500, 10_000, 20_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000,
];

/// A Prometheus histogram of durations over [`SERVER_ADDED_BUCKETS_MICROS`]: one relaxed
/// add per observation into its bucket (not cumulative; summed when rendered).
#[derive(Debug, Default)]
struct Histogram {
    buckets: [AtomicU64; SERVER_ADDED_BUCKETS_MICROS.len()],
    /// Observations above the last bound.
    over: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    fn observe(&self, d: Duration) {
        let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        match SERVER_ADDED_BUCKETS_MICROS
            .iter()
            .position(|&b| micros <= b)
        {
            Some(i) => self.buckets[i].fetch_add(1, Ordering::Relaxed),
            None => self.over.fetch_add(1, Ordering::Relaxed),
        };
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// Renders the `_bucket`, `_sum` and `_count` lines with `labels` (`door="x"`).
    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (bound, bucket) in SERVER_ADDED_BUCKETS_MICROS.iter().zip(&self.buckets) {
            cumulative += bucket.load(Ordering::Relaxed);
            #[allow(clippy::cast_precision_loss, reason = "bucket bounds are small")]
            let le = *bound as f64 / 1e6;
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
        }
        cumulative += self.over.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {cumulative}");
        #[allow(clippy::cast_precision_loss, reason = "seconds for display")]
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(
            out,
            "{name}_sum{{{labels}}} {sum}\n{name}_count{{{labels}}} {cumulative}"
        );
    }
}

/// The `outcome` labels of `voxgate_speculations_total`: pauses speculated at, speculations
/// the real pipeline took work from, speculations none of whose work was used.
pub const SPECULATION_OUTCOMES: [&str; 3] = ["started", "adopted", "discarded"];

/// The `outcome` labels of `voxgate_speculative_requests_total`: speculative provider
/// requests sent, adopted by the real pipeline, cancelled at the provider.
pub const SPECULATIVE_REQUEST_OUTCOMES: [&str; 3] = ["sent", "adopted", "cancelled"];

/// Keeps a session counted as active until dropped.
#[derive(Debug)]
pub struct SessionGuard<'a> {
    metrics: &'a Metrics,
    door: Door,
}

impl Drop for SessionGuard<'_> {
    fn drop(&mut self) {
        self.metrics.sessions_active[self.door.index()].fetch_sub(1, Ordering::Relaxed);
    }
}

impl Metrics {
    /// An empty registry.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts WebRTC reply frames that went out more than a frame late.
    pub fn webrtc_late_frames(&self, frames: u64) {
        self.webrtc_late_frames.fetch_add(frames, Ordering::Relaxed);
    }

    /// Counts a WebRTC datagram dropped because its connection's queue was full.
    pub fn webrtc_dropped_datagram(&self) {
        self.webrtc_dropped_datagrams
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a new session; it stays active until the guard is dropped.
    pub fn session(&self, door: Door) -> SessionGuard<'_> {
        self.sessions_total[door.index()].fetch_add(1, Ordering::Relaxed);
        self.sessions_active[door.index()].fetch_add(1, Ordering::Relaxed);
        SessionGuard {
            metrics: self,
            door,
        }
    }

    /// Records the server's own share of a turn's latency: decision to first reply audio
    /// frame written, provider waits excluded.
    pub fn server_added(&self, door: Door, d: Duration) {
        self.server_added[door.index()].observe(d);
    }

    /// Adds a session's new speculation counts (the difference since its last report).
    pub fn speculation(&self, door: Door, new: &voxgate_engine::SpeculationStats) {
        let d = door.index();
        for (i, n) in [new.started, new.adopted, new.discarded]
            .into_iter()
            .enumerate()
        {
            if n > 0 {
                self.speculations[i][d].fetch_add(n, Ordering::Relaxed);
            }
        }
        let requests = [new.requests, new.requests_adopted, new.requests_cancelled];
        for (i, n) in requests.into_iter().enumerate() {
            if n > 0 {
                self.speculative_requests[i][d].fetch_add(n, Ordering::Relaxed);
            }
        }
    }

    /// Speculations at one door with one outcome (an index into [`SPECULATION_OUTCOMES`]).
    #[must_use]
    pub fn speculations(&self, door: Door, outcome: usize) -> u64 {
        self.speculations
            .get(outcome)
            .map_or(0, |v| v[door.index()].load(Ordering::Relaxed))
    }

    /// Counts a finished response.
    pub fn turn(&self, door: Door) {
        self.turns[door.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an error reported to a client.
    pub fn error(&self, door: Door) {
        self.errors[door.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts audio frames dropped under back-pressure; the direction tells whether the server
    /// (uplink) or the client side (downlink) fell behind.
    pub fn dropped(&self, door: Door, direction: Direction, frames: u64) {
        self.dropped_frames[direction.index()][door.index()].fetch_add(frames, Ordering::Relaxed);
    }

    /// Audio frames dropped so far at one door in one direction.
    #[must_use]
    pub fn dropped_frames(&self, door: Door, direction: Direction) -> u64 {
        self.dropped_frames[direction.index()][door.index()].load(Ordering::Relaxed)
    }

    /// Counts a session refused before its handshake.
    pub fn refused(&self, door: Door, reason: RefusalReason) {
        self.refused[reason.index()][door.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Sessions refused so far at one door for one reason.
    #[must_use]
    pub fn refused_sessions(&self, door: Door, reason: RefusalReason) -> u64 {
        self.refused[reason.index()][door.index()].load(Ordering::Relaxed)
    }

    /// Sets the runtime's scheduling delay as the overload guard measures it.
    pub fn set_scheduling_delay(&self, delay: Duration) {
        let micros = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.scheduling_delay_micros
            .store(micros, Ordering::Relaxed);
    }

    /// The runtime's scheduling delay as last measured.
    #[must_use]
    pub fn scheduling_delay(&self) -> Duration {
        Duration::from_micros(self.scheduling_delay_micros.load(Ordering::Relaxed))
    }

    /// Records one provider latency.
    pub fn latency(&self, kind: ProviderKind, elapsed: Duration) {
        let l = &self.latency[kind.index()];
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        l.micros.fetch_add(micros, Ordering::Relaxed);
        l.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a failed provider request.
    pub fn provider_failure(&self, kind: ProviderKind) {
        self.latency[kind.index()]
            .failures
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a provider request whose deadline ran out (`[llm] timeout_secs`...).
    pub fn provider_timeout(&self, kind: ProviderKind) {
        self.latency[kind.index()]
            .timeouts
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request handed to the fallback provider after the primary failed before
    /// any output.
    pub fn provider_fallback(&self, kind: ProviderKind) {
        self.latency[kind.index()]
            .fallbacks
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Provider deadlines that ran out so far.
    #[must_use]
    pub fn provider_timeouts(&self, kind: ProviderKind) -> u64 {
        self.latency[kind.index()].timeouts.load(Ordering::Relaxed)
    }

    /// Requests handed to a fallback provider so far.
    #[must_use]
    pub fn provider_fallbacks(&self, kind: ProviderKind) -> u64 {
        self.latency[kind.index()].fallbacks.load(Ordering::Relaxed)
    }

    /// Sessions currently open on `door`.
    #[must_use]
    pub fn active_sessions(&self, door: Door) -> u64 {
        self.sessions_active[door.index()].load(Ordering::Relaxed)
    }

    /// The registry in the Prometheus text exposition format (version 0.0.4).
    #[must_use]
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(2048);
        let per_door =
            |out: &mut String, name: &str, kind: &str, help: &str, v: &[AtomicU64; DOORS]| {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
                for door in Door::ALL {
                    let _ = writeln!(
                        out,
                        "{name}{{door=\"{}\"}} {}",
                        door.label(),
                        v[door.index()].load(Ordering::Relaxed)
                    );
                }
            };
        per_door(
            &mut out,
            "voxgate_sessions_total",
            "counter",
            "Sessions opened, by door.",
            &self.sessions_total,
        );
        per_door(
            &mut out,
            "voxgate_sessions_active",
            "gauge",
            "Sessions open now, by door.",
            &self.sessions_active,
        );
        per_door(
            &mut out,
            "voxgate_turns_total",
            "counter",
            "Responses finished (complete or interrupted), by door.",
            &self.turns,
        );
        per_door(
            &mut out,
            "voxgate_errors_total",
            "counter",
            "Errors reported to clients, by door.",
            &self.errors,
        );
        let _ = writeln!(
            out,
            "# HELP voxgate_dropped_frames_total Audio frames dropped under back-pressure, by door \
             and direction.\n# TYPE voxgate_dropped_frames_total counter"
        );
        for door in Door::ALL {
            for direction in [Direction::Uplink, Direction::Downlink] {
                let _ = writeln!(
                    out,
                    "voxgate_dropped_frames_total{{door=\"{}\",direction=\"{}\"}} {}",
                    door.label(),
                    direction.label(),
                    self.dropped_frames(door, direction)
                );
            }
        }
        for (name, help, outcomes, values) in [
            (
                "voxgate_speculations_total",
                "Speculative generation at pauses in speech, by door and outcome: started, \
                 adopted (the real pipeline used its work), discarded (none of it was used: \
                 the user went on).",
                SPECULATION_OUTCOMES,
                &self.speculations,
            ),
            (
                "voxgate_speculative_requests_total",
                "Provider requests made by speculation, by door and outcome: sent, adopted \
                 by the real pipeline, cancelled at the provider.",
                SPECULATIVE_REQUEST_OUTCOMES,
                &self.speculative_requests,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for door in Door::ALL {
                for (i, outcome) in outcomes.iter().enumerate() {
                    let _ = writeln!(
                        out,
                        "{name}{{door=\"{}\",outcome=\"{outcome}\"}} {}",
                        door.label(),
                        values[i][door.index()].load(Ordering::Relaxed)
                    );
                }
            }
        }
        let _ = writeln!(
            out,
            "# HELP voxgate_sessions_refused_total Sessions refused before the WebSocket \
             handshake, by door and reason.\n# TYPE voxgate_sessions_refused_total counter"
        );
        for door in Door::ALL {
            for reason in RefusalReason::ALL {
                let _ = writeln!(
                    out,
                    "voxgate_sessions_refused_total{{door=\"{}\",reason=\"{}\"}} {}",
                    door.label(),
                    reason.label(),
                    self.refused_sessions(door, reason)
                );
            }
        }
        #[allow(clippy::cast_precision_loss, reason = "seconds for display")]
        let delay = self.scheduling_delay_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(
            out,
            "# HELP voxgate_scheduling_delay_seconds How late the runtime wakes a timer \
             (smoothed), the overload guard's figure.\n\
             # TYPE voxgate_scheduling_delay_seconds gauge\n\
             voxgate_scheduling_delay_seconds {delay}"
        );
        let _ = writeln!(
            out,
            "# HELP voxgate_turn_server_added_seconds The server's own time from a turn's end \
             decision to its first reply audio frame written, provider waits excluded.\n\
             # TYPE voxgate_turn_server_added_seconds histogram"
        );
        for door in Door::ALL {
            self.server_added[door.index()].render(
                &mut out,
                "voxgate_turn_server_added_seconds",
                &format!("door=\"{}\"", door.label()),
            );
        }
        let _ = writeln!(
            out,
            "# HELP voxgate_provider_latency_seconds Time to the first answer of a provider request.\n\
             # TYPE voxgate_provider_latency_seconds summary"
        );
        for kind in ProviderKind::ALL {
            let l = &self.latency[kind.index()];
            #[allow(clippy::cast_precision_loss, reason = "seconds for display")]
            let sum = l.micros.load(Ordering::Relaxed) as f64 / 1e6;
            let _ = writeln!(
                out,
                "voxgate_provider_latency_seconds_sum{{provider=\"{0}\"}} {sum}\n\
                 voxgate_provider_latency_seconds_count{{provider=\"{0}\"}} {1}",
                kind.label(),
                l.count.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP voxgate_provider_failures_total Provider requests that failed.\n\
             # TYPE voxgate_provider_failures_total counter"
        );
        for kind in ProviderKind::ALL {
            let _ = writeln!(
                out,
                "voxgate_provider_failures_total{{provider=\"{}\"}} {}",
                kind.label(),
                self.latency[kind.index()].failures.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP voxgate_provider_timeouts_total Provider requests whose deadline ran out \
             (first output or idle).\n# TYPE voxgate_provider_timeouts_total counter"
        );
        for kind in ProviderKind::ALL {
            let _ = writeln!(
                out,
                "voxgate_provider_timeouts_total{{provider=\"{}\"}} {}",
                kind.label(),
                self.provider_timeouts(kind)
            );
        }
        let _ = writeln!(
            out,
            "# HELP voxgate_provider_fallbacks_total Provider requests handed to the fallback \
             after the primary failed before any output.\n\
             # TYPE voxgate_provider_fallbacks_total counter"
        );
        for kind in ProviderKind::ALL {
            let _ = writeln!(
                out,
                "voxgate_provider_fallbacks_total{{provider=\"{}\"}} {}",
                kind.label(),
                self.provider_fallbacks(kind)
            );
        }
        let _ = writeln!(
            out,
            "# HELP voxgate_webrtc_late_frames_total WebRTC reply audio frames sent more than \
             20 ms after their time.\n\
             # TYPE voxgate_webrtc_late_frames_total counter\n\
             voxgate_webrtc_late_frames_total {}\n\
             # HELP voxgate_webrtc_dropped_datagrams_total WebRTC datagrams dropped because \
             their session was behind.\n\
             # TYPE voxgate_webrtc_dropped_datagrams_total counter\n\
             voxgate_webrtc_dropped_datagrams_total {}",
            self.webrtc_late_frames.load(Ordering::Relaxed),
            self.webrtc_dropped_datagrams.load(Ordering::Relaxed)
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_render_as_prometheus_text() {
        let m = Metrics::new();
        {
            let _g = m.session(Door::Realtime);
            assert_eq!(m.active_sessions(Door::Realtime), 1);
            m.turn(Door::Realtime);
            m.dropped(Door::Realtime, Direction::Downlink, 3);
            m.latency(ProviderKind::Tts, Duration::from_millis(250));
            let mut s = voxgate_engine::SpeculationStats::default();
            s.started = 2;
            s.discarded = 1;
            s.requests = 3;
            s.requests_cancelled = 2;
            m.speculation(Door::Xiaozhi, &s);
        }
        assert_eq!(m.active_sessions(Door::Realtime), 0);
        let text = m.render();
        for line in [
            "voxgate_sessions_total{door=\"realtime\"} 1",
            "voxgate_sessions_active{door=\"realtime\"} 0",
            "voxgate_turns_total{door=\"realtime\"} 1",
            "voxgate_dropped_frames_total{door=\"realtime\",direction=\"downlink\"} 3",
            "voxgate_dropped_frames_total{door=\"realtime\",direction=\"uplink\"} 0",
            "voxgate_provider_latency_seconds_sum{provider=\"tts\"} 0.25",
            "voxgate_provider_latency_seconds_count{provider=\"tts\"} 1",
            "voxgate_speculations_total{door=\"xiaozhi\",outcome=\"started\"} 2",
            "voxgate_speculations_total{door=\"xiaozhi\",outcome=\"adopted\"} 0",
            "voxgate_speculative_requests_total{door=\"xiaozhi\",outcome=\"cancelled\"} 2",
            "voxgate_speculative_requests_total{door=\"realtime\",outcome=\"cancelled\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
    }

    #[test]
    fn refusals_and_scheduling_delay_render() {
        let m = Metrics::new();
        m.refused(Door::Xiaozhi, RefusalReason::CapacityDoor);
        m.refused(Door::Xiaozhi, RefusalReason::CapacityDoor);
        m.refused(Door::Mcp, RefusalReason::HandshakeRate);
        m.set_scheduling_delay(Duration::from_micros(12_500));
        assert_eq!(
            m.refused_sessions(Door::Xiaozhi, RefusalReason::CapacityDoor),
            2
        );
        assert_eq!(m.scheduling_delay(), Duration::from_micros(12_500));
        let text = m.render();
        for line in [
            "# TYPE voxgate_sessions_refused_total counter",
            "voxgate_sessions_refused_total{door=\"xiaozhi\",reason=\"capacity_door\"} 2",
            "voxgate_sessions_refused_total{door=\"mcp\",reason=\"handshake_rate\"} 1",
            "voxgate_sessions_refused_total{door=\"realtime\",reason=\"overload\"} 0",
            "voxgate_sessions_refused_total{door=\"gemini\",reason=\"per_ip\"} 0",
            "voxgate_sessions_refused_total{door=\"retell\",reason=\"capacity_server\"} 0",
            "# TYPE voxgate_scheduling_delay_seconds gauge",
            "voxgate_scheduling_delay_seconds 0.0125",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
        let series = text
            .lines()
            .filter(|l| l.starts_with("voxgate_sessions_refused_total{"))
            .count();
        assert_eq!(series, Door::ALL.len() * RefusalReason::ALL.len());
    }
}
