//! The server's Prometheus metrics, served at `GET /metrics`.
//!
//! Each [`Metrics`] owns its own `prometheus_client` [`Registry`] (several servers share one
//! test process, so there is no global recorder) and renders it in the Prometheus text
//! exposition format, version 0.0.4 ([`CONTENT_TYPE`]).
//!
//! Every label set is bounded: labels are enums (door, provider kind, direction, reason,
//! stage, tool kind, outcome), never session ids. Every child of every family is created
//! when the registry is built and kept in arrays indexed by those enums, so an update is a
//! relaxed atomic add with no lookup, lock or allocation: cheap enough for the audio path.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::{
    EncodeLabelSet, EncodeLabelValue, EncodeMetric, LabelValueEncoder, MetricEncoder, NoLabelSet,
    prometheus_text,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

/// The `Content-Type` of [`Metrics::render`]'s output: the Prometheus text format 0.0.4.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// Which protocol a session speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
    /// The Bridge HTTP API (`POST /api/message`): text turns, one request each.
    Bridge,
}

/// Which way a dropped audio frame was travelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Client to server: the session could not keep up with what the client sent.
    Uplink,
    /// Server to client: the client (or its network) did not take the audio fast enough.
    Downlink,
}

impl Direction {
    /// Both directions, in index order.
    pub const ALL: [Self; 2] = [Self::Uplink, Self::Downlink];

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

/// How many doors there are (the length of the per-door arrays).
pub(crate) const DOORS: usize = 7;

impl Door {
    /// Every door, in index order.
    pub const ALL: [Self; DOORS] = [
        Self::Realtime,
        Self::Xiaozhi,
        Self::Gemini,
        Self::Retell,
        Self::Mcp,
        Self::Vip,
        Self::Bridge,
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
            Self::Bridge => "bridge",
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
            Self::Bridge => 6,
        }
    }
}

/// Why a session was refused before its WebSocket handshake (see `crate::admission`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
    /// Every instance of the cluster together holds `[cluster] max_sessions`.
    CapacityCluster,
}

/// How many refusal reasons there are.
const REASONS: usize = 6;

impl RefusalReason {
    /// Every reason, in index order.
    pub const ALL: [Self; REASONS] = [
        Self::CapacityServer,
        Self::CapacityDoor,
        Self::PerIp,
        Self::HandshakeRate,
        Self::Overload,
        Self::CapacityCluster,
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
            Self::CapacityCluster => "capacity_cluster",
        }
    }

    const fn index(self) -> usize {
        match self {
            Self::CapacityServer => 0,
            Self::CapacityDoor => 1,
            Self::PerIp => 2,
            Self::HandshakeRate => 3,
            Self::Overload => 4,
            Self::CapacityCluster => 5,
        }
    }
}

/// Which provider a latency belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProviderKind {
    /// Time from request to the first LLM event.
    Llm,
    /// Time to a transcript.
    Asr,
    /// Time from request to the first synthesized audio.
    Tts,
}

/// How many provider kinds there are.
const PROVIDERS: usize = 3;

impl ProviderKind {
    /// Every kind, in index order.
    pub const ALL: [Self; PROVIDERS] = [Self::Llm, Self::Asr, Self::Tts];

    /// The `provider` label value in `/metrics`.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Llm => "llm",
            Self::Asr => "asr",
            Self::Tts => "tts",
        }
    }

    const fn index(self) -> usize {
        match self {
            Self::Llm => 0,
            Self::Asr => 1,
            Self::Tts => 2,
        }
    }
}

/// A stage of a turn measured per door.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// The end-of-speech decision delay: audio time from the last voiced frame to the
    /// decision that the user finished (`voxgate_turn_endpointing_seconds`).
    Endpointing,
    /// From the user stopping to the first reply audio (`voxgate_turn_first_audio_seconds`).
    FirstAudio,
    /// From the onset of speech over a reply to playback cleared or `tts stop` sent
    /// (`voxgate_barge_in_seconds`).
    BargeIn,
}

/// How many stages there are.
const STAGES: usize = 3;

impl Stage {
    /// Every stage, in index order.
    pub const ALL: [Self; STAGES] = [Self::Endpointing, Self::FirstAudio, Self::BargeIn];

    /// The histogram this stage is recorded in.
    #[must_use]
    pub fn metric_name(self) -> &'static str {
        match self {
            Self::Endpointing => "voxgate_turn_endpointing_seconds",
            Self::FirstAudio => "voxgate_turn_first_audio_seconds",
            Self::BargeIn => "voxgate_barge_in_seconds",
        }
    }

    fn help(self) -> &'static str {
        match self {
            Self::Endpointing => {
                "End-of-speech decision delay, by door: audio time from the last voiced frame \
                 to the decision that the user finished"
            }
            Self::FirstAudio => {
                "Time from the user stopping to the first reply audio, by door: what the user \
                 waits"
            }
            Self::BargeIn => {
                "Time from the onset of speech over a reply to its playback cleared (or tts \
                 stop sent), by door"
            }
        }
    }

    const fn index(self) -> usize {
        match self {
            Self::Endpointing => 0,
            Self::FirstAudio => 1,
            Self::BargeIn => 2,
        }
    }
}

/// Who ran a tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ToolCallKind {
    /// The client ran it (a realtime client tool, a Retell function...).
    Client,
    /// An external MCP server connected to the MCP endpoint ran it.
    Mcp,
    /// The device ran it (Xiaozhi's device MCP tools).
    Device,
    /// The server ran it as an action of its own.
    Action,
}

/// How many tool call kinds there are.
const TOOL_KINDS: usize = 4;

impl ToolCallKind {
    /// Every kind, in index order.
    pub const ALL: [Self; TOOL_KINDS] = [Self::Client, Self::Mcp, Self::Device, Self::Action];

    /// The `kind` label value in `/metrics`.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Client => "client",
            Self::Mcp => "mcp",
            Self::Device => "device",
            Self::Action => "action",
        }
    }

    const fn index(self) -> usize {
        match self {
            Self::Client => 0,
            Self::Mcp => 1,
            Self::Device => 2,
            Self::Action => 3,
        }
    }
}

/// How a tool call ended, as counted in `voxgate_tool_calls_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ToolOutcomeLabel {
    /// It returned a result.
    Ok,
    /// It returned an error (or could not be run).
    Error,
    /// The turn was interrupted or the session closed while it ran.
    Cancelled,
    /// Its deadline ran out.
    Timeout,
}

/// How many tool call outcomes there are.
const TOOL_OUTCOMES: usize = 4;

impl ToolOutcomeLabel {
    /// Every outcome, in index order.
    pub const ALL: [Self; TOOL_OUTCOMES] = [Self::Ok, Self::Error, Self::Cancelled, Self::Timeout];

    /// The `outcome` label value in `/metrics`.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Error => "error",
            Self::Cancelled => "cancelled",
            Self::Timeout => "timeout",
        }
    }

    const fn index(self) -> usize {
        match self {
            Self::Ok => 0,
            Self::Error => 1,
            Self::Cancelled => 2,
            Self::Timeout => 3,
        }
    }
}

/// Label values are the enums' `label()` strings.
macro_rules! label_values {
    ($($t:ty),*) => {$(
        impl EncodeLabelValue for $t {
            fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), fmt::Error> {
                EncodeLabelValue::encode(&self.label(), encoder)
            }
        }
    )*};
}
label_values!(
    Door,
    Direction,
    RefusalReason,
    ProviderKind,
    ToolCallKind,
    ToolOutcomeLabel
);

/// `{door}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DoorLabels {
    door: Door,
}

/// `{door, direction}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DirectionLabels {
    door: Door,
    direction: Direction,
}

/// `{door, reason}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RefusalLabels {
    door: Door,
    reason: RefusalReason,
}

/// `{door, outcome}` for the speculation counters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct SpeculationLabels {
    door: Door,
    outcome: &'static str,
}

/// `{provider}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ProviderLabels {
    provider: ProviderKind,
}

/// `{door, provider}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DoorProviderLabels {
    door: Door,
    provider: ProviderKind,
}

/// `{door, kind}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ToolLabels {
    door: Door,
    kind: ToolCallKind,
}

/// `{door, kind, outcome}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ToolOutcomeLabels {
    door: Door,
    kind: ToolCallKind,
    outcome: ToolOutcomeLabel,
}

/// Upper bounds of the server-added latency buckets, in microseconds: fine below 10 ms,
/// where the server's share should be, and coarse above to see an overloaded one.
const SERVER_ADDED_BUCKETS_MICROS: [u64; 14] = [
    250, 500, 1_000, 2_000, 3_000, 5_000, 7_500, 10_000, 20_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000,
];

/// Upper bounds of the turn, provider and tool latency buckets, in microseconds: 5 ms to
/// 30 s, dense around the few hundred milliseconds a conversational turn lives in.
const LATENCY_BUCKETS_MICROS: [u64; 16] = [
    5_000, 10_000, 25_000, 50_000, 100_000, 200_000, 300_000, 500_000, 750_000, 1_000_000,
    1_500_000, 2_000_000, 3_000_000, 5_000_000, 10_000_000, 30_000_000,
];

/// The `outcome` labels of `voxgate_speculations_total`: pauses speculated at, speculations
/// the real pipeline took work from, speculations none of whose work was used.
pub const SPECULATION_OUTCOMES: [&str; 3] = ["started", "adopted", "discarded"];

/// The `outcome` labels of `voxgate_speculative_requests_total`: speculative provider
/// requests sent, adopted by the real pipeline, cancelled at the provider.
pub const SPECULATIVE_REQUEST_OUTCOMES: [&str; 3] = ["sent", "adopted", "cancelled"];

/// What a histogram holds so far (for tests and `/health`-like readers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HistogramSnapshot {
    /// Observations.
    pub count: u64,
    /// Their sum.
    pub sum: Duration,
}

/// A histogram of durations whose observation is two relaxed atomic adds, no lock: the
/// crate's own `Histogram` takes a mutex per observation and shows its sum and count to
/// tests only. It is encoded by `prometheus_client`'s encoder like the crate's own.
#[derive(Debug, Clone)]
struct DurationHistogram(Arc<HistogramCells>);

#[derive(Debug)]
struct HistogramCells {
    /// Upper bounds in microseconds, ascending.
    bounds: &'static [u64],
    /// Observations per bucket (not cumulative): one per bound, then one over the last.
    buckets: Box<[AtomicU64]>,
    /// Sum of the observations in microseconds (exact, unlike an `f64` sum).
    sum_micros: AtomicU64,
}

impl DurationHistogram {
    fn new(bounds: &'static [u64]) -> Self {
        Self(Arc::new(HistogramCells {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
        }))
    }

    fn observe(&self, d: Duration) {
        let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let cells = &self.0;
        // The first bound at or above the value; past the last bound, the overflow bucket.
        let i = cells.bounds.partition_point(|&b| b < micros);
        if let Some(bucket) = cells.buckets.get(i) {
            bucket.fetch_add(1, Ordering::Relaxed);
        }
        cells.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            count: self
                .0
                .buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .sum(),
            sum: Duration::from_micros(self.0.sum_micros.load(Ordering::Relaxed)),
        }
    }
}

#[allow(
    clippy::cast_precision_loss,
    reason = "bounds and sums in seconds for the exposition"
)]
fn seconds(micros: u64) -> f64 {
    micros as f64 / 1e6
}

impl TypedMetric for DurationHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for DurationHistogram {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), fmt::Error> {
        let cells = &self.0;
        let buckets: Vec<(f64, u64)> = cells
            .bounds
            .iter()
            .map(|&b| seconds(b))
            .chain(std::iter::once(f64::INFINITY))
            .zip(cells.buckets.iter().map(|b| b.load(Ordering::Relaxed)))
            .collect();
        // The count is the buckets' total, so `_count` always equals the `+Inf` bucket even
        // while observations land during the encoding.
        let count = buckets.iter().map(|b| b.1).sum();
        let sum = seconds(cells.sum_micros.load(Ordering::Relaxed));
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// Keeps a session counted as active until dropped.
#[derive(Debug)]
pub struct SessionGuard<'a> {
    metrics: &'a Metrics,
    door: Door,
}

impl Drop for SessionGuard<'_> {
    fn drop(&mut self) {
        self.metrics.sessions_active[self.door.index()].dec();
    }
}

/// The server's metrics; shared by every session through an `Arc`.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    sessions_total: [Counter; DOORS],
    sessions_active: [Gauge; DOORS],
    turns: [Counter; DOORS],
    errors: [Counter; DOORS],
    /// Indexed by [`Direction::index`], then door.
    dropped_frames: [[Counter; DOORS]; 2],
    /// Indexed by [`RefusalReason::index`], then door.
    refused: [[Counter; DOORS]; REASONS],
    /// The overload guard's current figure, in seconds.
    scheduling_delay: Gauge<f64, AtomicU64>,
    /// By door, then provider kind.
    provider_latency: [[DurationHistogram; PROVIDERS]; DOORS],
    provider_failures: [Counter; PROVIDERS],
    /// Requests whose deadline (first output or idle) ran out.
    provider_timeouts: [Counter; PROVIDERS],
    /// Requests handed to the fallback provider.
    provider_fallbacks: [Counter; PROVIDERS],
    /// WebRTC reply frames sent more than a frame late.
    webrtc_late_frames: Counter,
    /// WebRTC datagrams dropped because their connection was behind.
    webrtc_dropped_datagrams: Counter,
    /// Remote ICE candidates ignored (past the per-connection cap, or after connecting).
    webrtc_candidates_ignored: Counter,
    /// With `[cluster]`: 1 while the last heartbeat reached Redis.
    cluster_redis_up: Gauge,
    /// With `[cluster]`: Redis operations that failed or timed out.
    cluster_redis_errors: Counter,
    /// With `[cluster]`: requests sent to another instance (pushes, interrupts, messages,
    /// tool calls).
    cluster_routed: Counter,
    /// Per door: the server's own time from a turn's decision to its first reply audio
    /// frame written, provider waits excluded.
    server_added: [DurationHistogram; DOORS],
    /// Speculations by outcome ([`SPECULATION_OUTCOMES`]), then door.
    speculations: [[Counter; DOORS]; 3],
    /// Speculative provider requests by outcome ([`SPECULATIVE_REQUEST_OUTCOMES`]), then door.
    speculative_requests: [[Counter; DOORS]; 3],
    /// By [`Stage::index`], then door.
    stages: [[DurationHistogram; DOORS]; STAGES],
    /// By door, then tool call kind.
    tool_call_latency: [[DurationHistogram; TOOL_KINDS]; DOORS],
    /// By door, then tool call kind, then outcome.
    tool_calls: [[[Counter; TOOL_OUTCOMES]; TOOL_KINDS]; DOORS],
    interruptions: [Counter; DOORS],
    false_interruptions: [Counter; DOORS],
    replies_cut: [Counter; DOORS],
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Registers `family` under `name` and returns it, to create its children from.
fn family<S, M, C>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    family: Family<S, M, C>,
) -> Family<S, M, C>
where
    Family<S, M, C>: EncodeMetric + Clone + Send + Sync + fmt::Debug + 'static,
{
    registry.register(name, help, family.clone());
    family
}

/// A counter family with one child per door, registered under `name` (without `_total`: the
/// encoder adds it).
fn per_door_counters(registry: &mut Registry, name: &str, help: &str) -> [Counter; DOORS] {
    let f = family(
        registry,
        name,
        help,
        Family::<DoorLabels, Counter>::default(),
    );
    Door::ALL.map(|door| f.get_or_create_owned(&DoorLabels { door }))
}

/// A histogram family over `bounds` with one child per door.
fn per_door_histograms(
    registry: &mut Registry,
    name: &str,
    help: &str,
    bounds: &'static [u64],
) -> [DurationHistogram; DOORS] {
    let f = family(
        registry,
        name,
        help,
        Family::<DoorLabels, _, _>::new_with_constructor(move || DurationHistogram::new(bounds)),
    );
    Door::ALL.map(|door| f.get_or_create_owned(&DoorLabels { door }))
}

impl Metrics {
    /// A registry with every metric at zero, each series present from the start.
    #[must_use]
    pub fn new() -> Self {
        let mut r = Registry::default();
        let sessions_total =
            per_door_counters(&mut r, "voxgate_sessions", "Sessions opened, by door");
        let f = family(
            &mut r,
            "voxgate_sessions_active",
            "Sessions open now, by door",
            Family::<DoorLabels, Gauge>::default(),
        );
        let sessions_active = Door::ALL.map(|door| f.get_or_create_owned(&DoorLabels { door }));
        let turns = per_door_counters(
            &mut r,
            "voxgate_turns",
            "Responses finished (complete or interrupted), by door",
        );
        let errors = per_door_counters(
            &mut r,
            "voxgate_errors",
            "Errors reported to clients, by door",
        );
        let f = family(
            &mut r,
            "voxgate_dropped_frames",
            "Audio frames dropped under back-pressure, by door and direction (uplink: the \
             server fell behind the client; downlink: the client side fell behind)",
            Family::<DirectionLabels, Counter>::default(),
        );
        let dropped_frames = Direction::ALL.map(|direction| {
            Door::ALL.map(|door| f.get_or_create_owned(&DirectionLabels { door, direction }))
        });
        let speculation_family = |r: &mut Registry, name: &str, help: &str, outcomes: [_; 3]| {
            let f = family(
                r,
                name,
                help,
                Family::<SpeculationLabels, Counter>::default(),
            );
            outcomes.map(|outcome| {
                Door::ALL.map(|door| f.get_or_create_owned(&SpeculationLabels { door, outcome }))
            })
        };
        let speculations = speculation_family(
            &mut r,
            "voxgate_speculations",
            "Speculative generation at pauses in speech, by door and outcome: started, \
             adopted (the real pipeline used its work), discarded (none of it was used: the \
             user went on)",
            SPECULATION_OUTCOMES,
        );
        let speculative_requests = speculation_family(
            &mut r,
            "voxgate_speculative_requests",
            "Provider requests made by speculation, by door and outcome: sent, adopted by the \
             real pipeline, cancelled at the provider",
            SPECULATIVE_REQUEST_OUTCOMES,
        );
        let f = family(
            &mut r,
            "voxgate_sessions_refused",
            "Sessions refused before the WebSocket handshake, by door and reason",
            Family::<RefusalLabels, Counter>::default(),
        );
        let refused = RefusalReason::ALL.map(|reason| {
            Door::ALL.map(|door| f.get_or_create_owned(&RefusalLabels { door, reason }))
        });
        let scheduling_delay = Gauge::<f64, AtomicU64>::default();
        r.register(
            "voxgate_scheduling_delay_seconds",
            "How late the runtime wakes a timer (smoothed), the overload guard's figure",
            scheduling_delay.clone(),
        );
        let server_added = per_door_histograms(
            &mut r,
            "voxgate_turn_server_added_seconds",
            "The server's own time from a turn's end decision to its first reply audio frame \
             written, provider waits excluded, by door",
            &SERVER_ADDED_BUCKETS_MICROS,
        );
        let stages = Stage::ALL.map(|stage| {
            per_door_histograms(
                &mut r,
                stage.metric_name(),
                stage.help(),
                &LATENCY_BUCKETS_MICROS,
            )
        });
        let f = family(
            &mut r,
            "voxgate_provider_latency_seconds",
            "Time to the first answer of a provider request (LLM: first event; ASR: the \
             transcript; TTS: first audio), by door and provider",
            Family::<DoorProviderLabels, _, _>::new_with_constructor(|| {
                DurationHistogram::new(&LATENCY_BUCKETS_MICROS)
            }),
        );
        let provider_latency = Door::ALL.map(|door| {
            ProviderKind::ALL
                .map(|provider| f.get_or_create_owned(&DoorProviderLabels { door, provider }))
        });
        let per_provider = |r: &mut Registry, name: &str, help: &str| {
            let f = family(r, name, help, Family::<ProviderLabels, Counter>::default());
            ProviderKind::ALL.map(|provider| f.get_or_create_owned(&ProviderLabels { provider }))
        };
        let provider_failures = per_provider(
            &mut r,
            "voxgate_provider_failures",
            "Provider requests that failed (after any fallback), by provider",
        );
        let provider_timeouts = per_provider(
            &mut r,
            "voxgate_provider_timeouts",
            "Provider requests whose deadline ran out (first output or idle), by provider",
        );
        let provider_fallbacks = per_provider(
            &mut r,
            "voxgate_provider_fallbacks",
            "Provider requests handed to the fallback after the primary failed before any \
             output, by provider",
        );
        let f = family(
            &mut r,
            "voxgate_tool_call_seconds",
            "Tool call round trips, from the model's call to its result, by door and who ran \
             it (client, mcp, device, action)",
            Family::<ToolLabels, _, _>::new_with_constructor(|| {
                DurationHistogram::new(&LATENCY_BUCKETS_MICROS)
            }),
        );
        let tool_call_latency = Door::ALL.map(|door| {
            ToolCallKind::ALL.map(|kind| f.get_or_create_owned(&ToolLabels { door, kind }))
        });
        let f = family(
            &mut r,
            "voxgate_tool_calls",
            "Tool calls, by door, who ran them and outcome (ok, error, cancelled, timeout)",
            Family::<ToolOutcomeLabels, Counter>::default(),
        );
        let tool_calls = Door::ALL.map(|door| {
            ToolCallKind::ALL.map(|kind| {
                ToolOutcomeLabel::ALL.map(|outcome| {
                    f.get_or_create_owned(&ToolOutcomeLabels {
                        door,
                        kind,
                        outcome,
                    })
                })
            })
        });
        let interruptions = per_door_counters(
            &mut r,
            "voxgate_interruptions",
            "Replies the user interrupted (by speech or text), by door, including ones later \
             resumed",
        );
        let false_interruptions = per_door_counters(
            &mut r,
            "voxgate_false_interruptions",
            "Interruptions that proved false, so the interrupted reply resumed, by door",
        );
        let replies_cut = per_door_counters(
            &mut r,
            "voxgate_replies_cut",
            "Replies that ended cut off rather than complete, by door",
        );
        let webrtc_late_frames = Counter::default();
        r.register(
            "voxgate_webrtc_late_frames",
            "WebRTC reply audio frames sent more than 20 ms after their time",
            webrtc_late_frames.clone(),
        );
        let webrtc_dropped_datagrams = Counter::default();
        r.register(
            "voxgate_webrtc_dropped_datagrams",
            "WebRTC datagrams dropped because their session was behind",
            webrtc_dropped_datagrams.clone(),
        );
        let webrtc_candidates_ignored = Counter::default();
        r.register(
            "voxgate_webrtc_candidates_ignored",
            "Remote ICE candidates ignored: past the 32 a connection takes, or after it connected",
            webrtc_candidates_ignored.clone(),
        );
        let cluster_redis_up = Gauge::default();
        r.register(
            "voxgate_cluster_redis_up",
            "With [cluster]: 1 while this instance reaches Redis, 0 otherwise (and without a cluster)",
            cluster_redis_up.clone(),
        );
        let cluster_redis_errors = Counter::default();
        r.register(
            "voxgate_cluster_redis_errors",
            "With [cluster]: Redis operations that failed or timed out",
            cluster_redis_errors.clone(),
        );
        let cluster_routed = Counter::default();
        r.register(
            "voxgate_cluster_routed_requests",
            "With [cluster]: requests sent to the instance holding a session or tool",
            cluster_routed.clone(),
        );
        Self {
            registry: r,
            sessions_total,
            sessions_active,
            turns,
            errors,
            dropped_frames,
            refused,
            scheduling_delay,
            provider_latency,
            provider_failures,
            provider_timeouts,
            provider_fallbacks,
            webrtc_late_frames,
            webrtc_dropped_datagrams,
            webrtc_candidates_ignored,
            cluster_redis_up,
            cluster_redis_errors,
            cluster_routed,
            server_added,
            speculations,
            speculative_requests,
            stages,
            tool_call_latency,
            tool_calls,
            interruptions,
            false_interruptions,
            replies_cut,
        }
    }

    /// Counts WebRTC reply frames that went out more than a frame late.
    pub fn webrtc_late_frames(&self, frames: u64) {
        self.webrtc_late_frames.inc_by(frames);
    }

    /// Counts a WebRTC datagram dropped because its connection's queue was full.
    pub fn webrtc_dropped_datagram(&self) {
        self.webrtc_dropped_datagrams.inc();
    }

    /// Counts a remote ICE candidate a connection did not take.
    pub fn webrtc_candidate_ignored(&self) {
        self.webrtc_candidates_ignored.inc();
    }

    /// Whether the cluster's last heartbeat reached Redis.
    pub fn set_cluster_redis_up(&self, up: bool) {
        self.cluster_redis_up.set(i64::from(up));
    }

    /// Counts a failed cluster Redis operation.
    pub fn cluster_redis_error(&self) {
        self.cluster_redis_errors.inc();
    }

    /// Counts a request routed to another instance.
    pub fn cluster_routed(&self) {
        self.cluster_routed.inc();
    }

    /// Counts a new session; it stays active until the guard is dropped.
    pub fn session(&self, door: Door) -> SessionGuard<'_> {
        self.sessions_total[door.index()].inc();
        self.sessions_active[door.index()].inc();
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

    /// `voxgate_turn_server_added_seconds` at one door so far.
    #[must_use]
    pub fn server_added_observed(&self, door: Door) -> HistogramSnapshot {
        self.server_added[door.index()].snapshot()
    }

    /// Records one stage of a turn at `door` (see [`Stage`] for what each measures).
    pub fn stage(&self, door: Door, stage: Stage, d: Duration) {
        self.stages[stage.index()][door.index()].observe(d);
    }

    /// One stage's histogram at one door so far.
    #[must_use]
    pub fn stage_observed(&self, door: Door, stage: Stage) -> HistogramSnapshot {
        self.stages[stage.index()][door.index()].snapshot()
    }

    /// Records a finished tool call: its round trip and how it ended.
    pub fn tool_call(
        &self,
        door: Door,
        kind: ToolCallKind,
        outcome: ToolOutcomeLabel,
        d: Duration,
    ) {
        let (door, kind) = (door.index(), kind.index());
        self.tool_call_latency[door][kind].observe(d);
        self.tool_calls[door][kind][outcome.index()].inc();
    }

    /// `voxgate_tool_call_seconds` for one door and kind so far.
    #[must_use]
    pub fn tool_call_observed(&self, door: Door, kind: ToolCallKind) -> HistogramSnapshot {
        self.tool_call_latency[door.index()][kind.index()].snapshot()
    }

    /// Tool calls so far at one door, of one kind, with one outcome.
    #[must_use]
    pub fn tool_calls(&self, door: Door, kind: ToolCallKind, outcome: ToolOutcomeLabel) -> u64 {
        self.tool_calls[door.index()][kind.index()][outcome.index()].get()
    }

    /// Counts a reply the user interrupted (by speech or text), even one later resumed.
    pub fn interruption(&self, door: Door) {
        self.interruptions[door.index()].inc();
    }

    /// Interruptions counted so far at `door`.
    #[must_use]
    pub fn interruptions(&self, door: Door) -> u64 {
        self.interruptions[door.index()].get()
    }

    /// Counts an interruption that proved false: the interrupted reply resumed.
    pub fn false_interruption(&self, door: Door) {
        self.false_interruptions[door.index()].inc();
    }

    /// False interruptions counted so far at `door`.
    #[must_use]
    pub fn false_interruptions(&self, door: Door) -> u64 {
        self.false_interruptions[door.index()].get()
    }

    /// Counts a reply that ended cut off.
    pub fn reply_cut(&self, door: Door) {
        self.replies_cut[door.index()].inc();
    }

    /// Cut replies counted so far at `door`.
    #[must_use]
    pub fn replies_cut(&self, door: Door) -> u64 {
        self.replies_cut[door.index()].get()
    }

    /// Adds a session's new speculation counts (the difference since its last report).
    pub fn speculation(&self, door: Door, new: &voxgate_engine::SpeculationStats) {
        let d = door.index();
        for (counters, n) in self
            .speculations
            .iter()
            .zip([new.started, new.adopted, new.discarded])
        {
            if n > 0 {
                counters[d].inc_by(n);
            }
        }
        let requests = [new.requests, new.requests_adopted, new.requests_cancelled];
        for (counters, n) in self.speculative_requests.iter().zip(requests) {
            if n > 0 {
                counters[d].inc_by(n);
            }
        }
    }

    /// Speculations at one door with one outcome (an index into [`SPECULATION_OUTCOMES`]).
    #[must_use]
    pub fn speculations(&self, door: Door, outcome: usize) -> u64 {
        self.speculations
            .get(outcome)
            .map_or(0, |v| v[door.index()].get())
    }

    /// Counts a finished response.
    pub fn turn(&self, door: Door) {
        self.turns[door.index()].inc();
    }

    /// Responses finished so far at `door`.
    #[must_use]
    pub fn turns(&self, door: Door) -> u64 {
        self.turns[door.index()].get()
    }

    /// Counts an error reported to a client.
    pub fn error(&self, door: Door) {
        self.errors[door.index()].inc();
    }

    /// Errors reported so far at `door`.
    #[must_use]
    pub fn errors(&self, door: Door) -> u64 {
        self.errors[door.index()].get()
    }

    /// Counts audio frames dropped under back-pressure; the direction tells whether the server
    /// (uplink) or the client side (downlink) fell behind.
    pub fn dropped(&self, door: Door, direction: Direction, frames: u64) {
        self.dropped_frames[direction.index()][door.index()].inc_by(frames);
    }

    /// Audio frames dropped so far at one door in one direction.
    #[must_use]
    pub fn dropped_frames(&self, door: Door, direction: Direction) -> u64 {
        self.dropped_frames[direction.index()][door.index()].get()
    }

    /// Counts a session refused before its handshake.
    pub fn refused(&self, door: Door, reason: RefusalReason) {
        self.refused[reason.index()][door.index()].inc();
    }

    /// Sessions refused so far at one door for one reason.
    #[must_use]
    pub fn refused_sessions(&self, door: Door, reason: RefusalReason) -> u64 {
        self.refused[reason.index()][door.index()].get()
    }

    /// Sets the runtime's scheduling delay as the overload guard measures it.
    pub fn set_scheduling_delay(&self, delay: Duration) {
        self.scheduling_delay.set(delay.as_secs_f64());
    }

    /// The runtime's scheduling delay as last measured (to the microsecond).
    #[must_use]
    pub fn scheduling_delay(&self) -> Duration {
        let micros = (self.scheduling_delay.get() * 1e6).round();
        #[allow(
            clippy::cast_possible_truncation,
            reason = "a delay set from a Duration; the cast saturates"
        )]
        Duration::from_micros(micros as u64)
    }

    /// Records the time to a provider's first answer in a session at `door`.
    pub fn latency(&self, door: Door, kind: ProviderKind, elapsed: Duration) {
        self.provider_latency[door.index()][kind.index()].observe(elapsed);
    }

    /// `voxgate_provider_latency_seconds` for one door and provider so far.
    #[must_use]
    pub fn latency_observed(&self, door: Door, kind: ProviderKind) -> HistogramSnapshot {
        self.provider_latency[door.index()][kind.index()].snapshot()
    }

    /// Counts a failed provider request.
    pub fn provider_failure(&self, kind: ProviderKind) {
        self.provider_failures[kind.index()].inc();
    }

    /// Failed provider requests so far.
    #[must_use]
    pub fn provider_failures(&self, kind: ProviderKind) -> u64 {
        self.provider_failures[kind.index()].get()
    }

    /// Counts a provider request whose deadline ran out (`[llm] timeout_secs`...).
    pub fn provider_timeout(&self, kind: ProviderKind) {
        self.provider_timeouts[kind.index()].inc();
    }

    /// Counts a request handed to the fallback provider after the primary failed before
    /// any output.
    pub fn provider_fallback(&self, kind: ProviderKind) {
        self.provider_fallbacks[kind.index()].inc();
    }

    /// Provider deadlines that ran out so far.
    #[must_use]
    pub fn provider_timeouts(&self, kind: ProviderKind) -> u64 {
        self.provider_timeouts[kind.index()].get()
    }

    /// Requests handed to a fallback provider so far.
    #[must_use]
    pub fn provider_fallbacks(&self, kind: ProviderKind) -> u64 {
        self.provider_fallbacks[kind.index()].get()
    }

    /// Sessions currently open on `door`.
    #[must_use]
    pub fn active_sessions(&self, door: Door) -> u64 {
        u64::try_from(self.sessions_active[door.index()].get()).unwrap_or(0)
    }

    /// The registry in the Prometheus text exposition format, version 0.0.4
    /// ([`CONTENT_TYPE`]).
    #[must_use]
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(128 * 1024);
        // Writing into a String cannot fail.
        let _ = prometheus_text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests;
