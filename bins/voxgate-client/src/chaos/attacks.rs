//! The attack phases of `chaos`: work one anonymous peer can make the server do, each measured
//! while the admitted sessions keep running.
//!
//! 1. **long reply**: a realtime session with hosted TTS sends one long `DirectSpeech` (about
//!    60 KB, near the 64 KiB message limit) and reads the reply: how many synthesizer
//!    processes (the server's children) run at once, and how fast the server still answers.
//! 2. **perception flood**: `devices` × `names` anonymous `POST /api/perception/event` with
//!    60 KB of `data` each, then the same with 4 KB: the statuses, and the server's resident
//!    memory before, right after each batch and a few seconds later (memory kept is the
//!    finding).
//! 3. **idle connections**: one address (127.0.1.1) opens `idle_connections` HTTP/1.1
//!    keep-alive connections, a `GET /health` each, then idles; a few more drip a second
//!    request head, and a few a request body, a byte a second. How many the server keeps, for
//!    how long, and whether `/health` from a fresh connection (from 127.0.0.1 and from the
//!    attacking address) still answers.
//! 4. **candidate flood**: `gemini_sockets` Gemini bridge sockets each send a real Chrome offer
//!    (`WEBRTC_OFFER`) and then `candidates` `WEBRTC_ICE_CANDIDATE` messages as fast as the
//!    socket takes them: the server's CPU time over the phase, and whether the overload guard
//!    refused sessions meanwhile. The candidates name 127.9.x.y addresses: loopback only.
//! 5. **parked calls**: `parked_calls` Retell calls each send a `call_details` with
//!    `parked_bytes` of `metadata` and close; the server keeps a closed call's state for a
//!    resume (60 s by default): its resident memory before and right after.
//!
//! Every phase also records the server's child processes, resident memory and open descriptors
//! before, at the peak (sampled every 50 ms) and after (Linux `/proc`), its CPU time, `GET
//! /health` from a fresh connection every 100 ms, and `voxgate_sessions_refused_total` over the
//! phase. The admitted sessions' latencies over each phase are filled in by [`super::run`],
//! which holds their samples. Every loop is bounded in count and time.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail};
use futures::{SinkExt, StreamExt};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::{Instant, sleep, sleep_until, timeout, timeout_at};
use tokio_tungstenite::tungstenite::Message;
use voxgate_realtime::proto::client_bound_message::Payload as Down;
use voxgate_realtime::{ClientBoundMessage, ServiceBoundMessage};

use super::{
    ATTEMPT_TIMEOUT, ChaosOptions, MAX_HEAD, PhaseReport, REALTIME_PATH, Stats, connect_from,
    head_end, metric_by_label, metric_sum, parse_head, realtime_init, scrape, server_resources,
    source,
};
use crate::ws;

/// `GET /health` is sampled this often during an attack.
const HEALTH_EVERY: Duration = Duration::from_millis(100);
/// A `/health` request that takes longer than this failed.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(2);
/// The server's processes, memory and descriptors are sampled this often during an attack
/// (a synthesizer runs for tens of milliseconds).
const SAMPLE_EVERY: Duration = Duration::from_millis(50);
/// The monitor stops by itself after this long, whatever happens to the phase.
const MONITOR_LIMIT: Duration = Duration::from_secs(300);
/// Wait this long after an attack before the "after" sample.
const SETTLE: Duration = Duration::from_secs(1);
/// After the perception flood, "a few seconds later" (memory not returned is the finding).
const PERCEPTION_SETTLE: Duration = Duration::from_secs(3);
/// One HTTP request of an attack (connect, send, response head).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// A batch of perception events takes at most this long.
const BATCH_LIMIT: Duration = Duration::from_secs(60);
/// The longest wait for the sessions of an earlier phase to end.
const DRAIN_LIMIT: Duration = Duration::from_secs(10);
/// The address the idle connections come from (one address, none of the others').
const IDLE_SOURCE: Ipv4Addr = Ipv4Addr::new(127, 0, 1, 1);
/// Idle connections opening at once.
const IDLE_OPENING: usize = 100;
/// The idle connections have this long to open and get their first answer.
const IDLE_OPEN_LIMIT: Duration = Duration::from_secs(20);
/// `/health` from the attacking address, this often during the idle phase.
const SAME_ADDRESS_EVERY: Duration = Duration::from_millis(500);
/// Drip connections send one byte this often.
const DRIP_EVERY: Duration = Duration::from_secs(1);
/// A candidate flood's sending takes at most this long.
const FLOOD_LIMIT: Duration = Duration::from_secs(60);
/// Candidates written before each flush.
const CANDIDATE_BATCH: usize = 256;
/// After its flood, a bridge socket's turn must complete within this long.
const TURN_LIMIT: Duration = Duration::from_secs(30);
/// The realtime output rate the long reply asks for (48 kHz, 16-bit mono).
const LONG_REPLY_BYTES_PER_SEC: f64 = 48_000.0 * 2.0;

/// The most an option may ask for (the client's own bounds, so a typo cannot exhaust the
/// machine): idle connections.
pub const MAX_IDLE_CONNECTIONS: usize = 10_000;
/// As [`MAX_IDLE_CONNECTIONS`]: perception devices and names (each).
pub const MAX_PERCEPTION_FANOUT: usize = 256;
/// As [`MAX_IDLE_CONNECTIONS`]: bytes of one perception event's `data`, of the long reply's
/// text, of one parked call's metadata.
pub const MAX_ATTACK_BYTES: usize = 15 << 20;
/// As [`MAX_IDLE_CONNECTIONS`]: candidates per socket.
pub const MAX_CANDIDATES: usize = 100_000;
/// As [`MAX_IDLE_CONNECTIONS`]: bridge sockets, drip connections of each kind, parked calls.
pub const MAX_ATTACK_PEERS: usize = 64;

/// One attack phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AttackKind {
    /// A realtime session's 60 KB `DirectSpeech`.
    LongReply,
    /// Perception events with 60 KB and then 4 KB of data.
    Perception,
    /// Idle keep-alive connections and dripped heads and bodies from one address.
    IdleConnections,
    /// `WEBRTC_ICE_CANDIDATE` floods on Gemini bridge sockets.
    Candidates,
    /// Closed Retell calls with megabytes of `call_details`.
    ParkedCalls,
}

impl AttackKind {
    /// Every attack, in the order they run.
    pub const ALL: [Self; 5] = [
        Self::LongReply,
        Self::Perception,
        Self::IdleConnections,
        Self::Candidates,
        Self::ParkedCalls,
    ];
}

/// How big each attack is.
#[derive(Debug, Clone)]
pub struct AttackOptions {
    /// The attacks to run (in [`AttackKind::ALL`]'s order, whatever the order here).
    pub run: Vec<AttackKind>,
    /// Bytes of the long reply's text.
    pub long_reply_bytes: usize,
    /// How long the long reply is read.
    pub long_reply_for: Duration,
    /// Perception devices (each posting from its own loopback address in turn).
    pub perception_devices: usize,
    /// Event names per device.
    pub perception_names: usize,
    /// Bytes of `data` in the first (refused) batch.
    pub perception_big: usize,
    /// Bytes of `data` in the second (accepted) batch.
    pub perception_small: usize,
    /// Idle keep-alive connections from one address.
    pub idle_connections: usize,
    /// Connections dripping a second request head, and as many dripping a body.
    pub idle_drips: usize,
    /// How long the idle connections are held once open.
    pub idle_for: Duration,
    /// Gemini bridge sockets flooding candidates.
    pub gemini_sockets: usize,
    /// Candidates per socket.
    pub candidates: usize,
    /// Retell calls parked.
    pub parked_calls: usize,
    /// Bytes of each parked call's `metadata`.
    pub parked_bytes: usize,
}

impl Default for AttackOptions {
    fn default() -> Self {
        Self {
            run: AttackKind::ALL.to_vec(),
            long_reply_bytes: 60_000,
            long_reply_for: Duration::from_secs(5),
            perception_devices: 16,
            perception_names: 64,
            perception_big: 60_000,
            perception_small: 4_000,
            idle_connections: 1_000,
            idle_drips: 4,
            idle_for: Duration::from_secs(12),
            gemini_sockets: 4,
            candidates: 25_000,
            parked_calls: 10,
            parked_bytes: 8 << 20,
        }
    }
}

// ---- what every attack records ----

/// The server process at one moment, from Linux `/proc` (`None`: could not be read).
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct ProcSample {
    /// Resident memory, KB (`VmRSS`).
    pub rss_kb: Option<u64>,
    /// Open file descriptors.
    pub fds: Option<u64>,
    /// Processes whose parent is the server (synthesizers are its children).
    pub children: Option<u64>,
}

impl ProcSample {
    /// Each field the larger of the two.
    fn max(self, other: Self) -> Self {
        Self {
            rss_kb: max_opt(self.rss_kb, other.rss_kb),
            fds: max_opt(self.fds, other.fds),
            children: max_opt(self.children, other.children),
        }
    }
}

fn max_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// What the server spent during one attack.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ServerUsage {
    /// Just before the attack.
    pub before: ProcSample,
    /// The largest of each figure while it ran.
    pub peak: ProcSample,
    /// A moment after it ended (one second; three for the perception flood).
    pub after: ProcSample,
    /// CPU time (user + system), seconds, from the attack's start to its end.
    pub cpu_secs: Option<f64>,
    /// The most child processes of each name seen at once (`espeak-ng`, a `command` voice).
    pub children_peak_by_name: BTreeMap<String, u64>,
    /// Samples taken.
    pub samples: u64,
}

/// What every attack measures besides its own figures.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AttackCommon {
    /// The attack's length.
    pub seconds: f64,
    /// The server's processes, memory, descriptors and CPU.
    pub server: ServerUsage,
    /// `GET /health` from a fresh connection every 100 ms: connect to the response head, of
    /// the requests answered 200.
    pub health_ms: Stats,
    /// `/health` requests that failed (not 200, no answer, or over 2 s).
    pub health_failed: u64,
    /// The failures by what happened (a status, or the error).
    pub health_failures: BTreeMap<String, u64>,
    /// What the admitted sessions saw meanwhile.
    pub admitted: PhaseReport,
    /// `voxgate_sessions_refused_total` over the attack, by `reason` (`overload` is the
    /// scheduling-delay guard).
    pub refused_by_reason: BTreeMap<String, f64>,
}

/// An attack's time span and the `/metrics` text at its ends, so the admitted sessions'
/// samples can be cut to it once they are collected.
pub(super) struct Window {
    pub(super) from: Instant,
    pub(super) to: Instant,
    pub(super) m0: String,
    pub(super) m1: String,
    /// The server's CPU time at the ends, seconds.
    pub(super) cpu0: Option<f64>,
    pub(super) cpu1: Option<f64>,
}

// ---- each attack's own figures ----

/// The long reply.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LongReplyReport {
    /// Measured as every attack is.
    #[serde(flatten)]
    pub common: AttackCommon,
    /// The `DirectSpeech` text's length.
    pub text_bytes: usize,
    /// Whether `espeak-ng` is on `PATH` (the embedded synthesizer runs it when it is, and
    /// plays tones in-process when not).
    pub espeak_ng_on_path: bool,
    /// The most `espeak-ng` processes the server ran at once.
    pub espeak_ng_peak: u64,
    /// How long the reply was read.
    pub read_secs: f64,
    /// `ModelAudioChunk`s received.
    pub audio_chunks: u64,
    /// Seconds of audio they carried.
    pub audio_secs: f64,
    /// Milliseconds from sending the text to the first audio.
    pub first_audio_ms: Option<f64>,
    /// Session error notifications the server sent (the first few).
    pub server_errors: Vec<String>,
    /// Why the session could not be run, or how it ended early.
    pub error: Option<String>,
}

/// One batch of perception events.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PostBatch {
    /// Requests made.
    pub requests: u64,
    /// Bytes of `data` in each.
    pub data_bytes: usize,
    /// Bytes the client wrote (heads and bodies; a refused body may be cut short).
    pub bytes_sent: u64,
    /// How long the batch took.
    pub seconds: f64,
    /// Responses by status.
    pub by_status: BTreeMap<u16, u64>,
    /// Requests without a response, by what happened.
    pub errors: BTreeMap<String, u64>,
    /// The server's resident memory (KB) right after the batch.
    pub rss_kb_after: Option<u64>,
}

/// The perception flood.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PerceptionReport {
    /// Measured as every attack is (`server.after` is a few seconds after the last batch).
    #[serde(flatten)]
    pub common: AttackCommon,
    /// Devices posting.
    pub devices: usize,
    /// Event names per device.
    pub names: usize,
    /// The large events.
    pub big: PostBatch,
    /// The small events.
    pub small: PostBatch,
}

/// The drip connections of one kind.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DripReport {
    /// Connections.
    pub connections: usize,
    /// Of them, the ones that could not be opened (or got no first answer).
    pub failed: usize,
    /// Of them, the ones the server closed.
    pub closed: usize,
    /// Seconds from the first dripped byte to the server's close: the earliest.
    pub first_close_secs: Option<f64>,
    /// As `first_close_secs`, the latest.
    pub last_close_secs: Option<f64>,
    /// Bytes dripped, all connections.
    pub bytes_dripped: u64,
    /// Responses the server sent while they dripped, by status.
    pub statuses: BTreeMap<u16, u64>,
}

/// The idle connections.
#[derive(Debug, Clone, Default, Serialize)]
pub struct IdleReport {
    /// Measured as every attack is.
    #[serde(flatten)]
    pub common: AttackCommon,
    /// The address they came from.
    pub source: String,
    /// Keep-alive connections tried.
    pub connections: usize,
    /// Of them, TCP connections made.
    pub opened: usize,
    /// The `GET /health` each sent first, by response status.
    pub answered: BTreeMap<u16, u64>,
    /// The first requests with no response, by what happened.
    pub no_answer: BTreeMap<String, u64>,
    /// Seconds the connections took to open and be answered.
    pub open_secs: f64,
    /// Connections answered 200 and not yet closed by the server, each second after they were
    /// open (the first entry: at once). Those answered otherwise are dropped at once.
    pub kept_by_second: Vec<u64>,
    /// Connections answered 200 that the server closed while they were held.
    pub closed_by_server: usize,
    /// Seconds from a connection's 200 to the server's close: the earliest.
    pub first_close_secs: Option<f64>,
    /// As `first_close_secs`, the median.
    pub median_close_secs: Option<f64>,
    /// As `first_close_secs`, the latest.
    pub last_close_secs: Option<f64>,
    /// Connections dripping a second request head.
    pub head_drips: DripReport,
    /// Connections dripping a request body.
    pub body_drips: DripReport,
    /// `GET /health` from a fresh connection from the attacking address every 0.5 s, by
    /// status or error.
    pub same_address_health: BTreeMap<String, u64>,
}

/// The candidate flood.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CandidateReport {
    /// Measured as every attack is (`server.cpu_secs` is the figure).
    #[serde(flatten)]
    pub common: AttackCommon,
    /// Bridge sockets.
    pub sockets: usize,
    /// Of them, the ones set up (`GEMINI_CONNECTED`, `SETUP_COMPLETE`).
    pub set_up: usize,
    /// Of them, the ones whose offer was answered (`WEBRTC_ANSWER`).
    pub answered: usize,
    /// Candidates sent, all sockets.
    pub candidates_sent: u64,
    /// Seconds the sending took (the slowest socket).
    pub send_secs: f64,
    /// After its flood each socket asks for a turn (`SEND_MESSAGE`): seconds to its
    /// `TURN_COMPLETE`, which comes after the server has worked through every candidate
    /// before it. One entry per socket that completed it, sorted.
    pub turn_after_flood_secs: Vec<f64>,
    /// Messages the server sent during the flood, by `type`.
    pub replies: BTreeMap<String, u64>,
    /// Sockets the server closed, with the close code.
    pub closed_by_server: Vec<String>,
    /// Why sockets failed (the first few).
    pub errors: Vec<String>,
    /// `voxgate_webrtc_candidates_ignored_total` over the phase.
    pub candidates_ignored: f64,
}

/// The parked calls.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ParkedReport {
    /// Measured as every attack is.
    #[serde(flatten)]
    pub common: AttackCommon,
    /// Calls made.
    pub calls: usize,
    /// Bytes of `metadata` in each `call_details`.
    pub metadata_bytes: usize,
    /// How each call ended, counted.
    pub outcomes: BTreeMap<String, u64>,
    /// Upgrades refused with 503 (capacity or overload) and tried again a second later.
    pub refused_503: u64,
    /// The server's resident memory (KB) right after the last call closed.
    pub rss_kb_right_after: Option<u64>,
    /// Of the calls, the ones `GET /retell/calls` lists as closed (kept for a resume).
    pub parked: Option<u64>,
}

/// Every attack that ran.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Attacks {
    /// The long reply.
    pub long_reply: Option<LongReplyReport>,
    /// The perception flood.
    pub perception: Option<PerceptionReport>,
    /// The idle connections.
    pub idle_connections: Option<IdleReport>,
    /// The candidate flood.
    pub candidates: Option<CandidateReport>,
    /// The parked calls.
    pub parked_calls: Option<ParkedReport>,
}

impl Attacks {
    /// The common figures of `kind`, if it ran.
    pub(super) fn common_mut(&mut self, kind: AttackKind) -> Option<&mut AttackCommon> {
        match kind {
            AttackKind::LongReply => self.long_reply.as_mut().map(|r| &mut r.common),
            AttackKind::Perception => self.perception.as_mut().map(|r| &mut r.common),
            AttackKind::IdleConnections => self.idle_connections.as_mut().map(|r| &mut r.common),
            AttackKind::Candidates => self.candidates.as_mut().map(|r| &mut r.common),
            AttackKind::ParkedCalls => self.parked_calls.as_mut().map(|r| &mut r.common),
        }
    }
}

/// Runs the attacks `opts.attacks.run` names, one after another, a second apart, each once
/// the sessions open are back to `admitted` (the sessions the earlier phases opened have
/// ended), so the free slots are free.
pub(super) async fn run_all(
    opts: &ChaosOptions,
    admitted: f64,
) -> (Attacks, Vec<(AttackKind, Window)>) {
    let ticks = crate::procstat::clock_ticks();
    let mut attacks = Attacks::default();
    let mut windows = Vec::new();
    for kind in AttackKind::ALL {
        if !opts.attacks.run.contains(&kind) {
            continue;
        }
        sleep(SETTLE).await;
        drained(opts.addr, admitted, DRAIN_LIMIT).await;
        eprintln!("chaos: attack {kind:?}");
        let w = match kind {
            AttackKind::LongReply => {
                let (r, w) = long_reply(opts, ticks).await;
                attacks.long_reply = Some(r);
                w
            }
            AttackKind::Perception => {
                let (r, w) = perception(opts, ticks).await;
                attacks.perception = Some(r);
                w
            }
            AttackKind::IdleConnections => {
                let (r, w) = idle_connections(opts, ticks).await;
                attacks.idle_connections = Some(r);
                w
            }
            AttackKind::Candidates => {
                let (r, w) = candidates(opts, ticks).await;
                attacks.candidates = Some(r);
                w
            }
            AttackKind::ParkedCalls => {
                let (r, w) = parked_calls(opts, ticks, admitted).await;
                attacks.parked_calls = Some(r);
                w
            }
        };
        windows.push((kind, w));
    }
    (attacks, windows)
}

/// Waits (at most `limit`) until the server's `voxgate_sessions_active` is at most `admitted`.
async fn drained(addr: SocketAddr, admitted: f64, limit: Duration) {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        let m = scrape(addr).await;
        if metric_sum(&m, "voxgate_sessions_active", "") <= admitted {
            return;
        }
        sleep(Duration::from_millis(200)).await;
    }
}

// ---- /proc ----

/// The fields of a `/proc/PID/stat` line this needs.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stat {
    /// The command name (at most 15 bytes, as the kernel keeps it).
    comm: String,
    ppid: u32,
    /// utime + stime, in clock ticks.
    cpu_ticks: u64,
}

/// Parses a `/proc/PID/stat` line. The command name is in parentheses and may itself hold
/// spaces and parentheses, so the fields are counted from the last `)`.
fn parse_stat(text: &str) -> Option<Stat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_owned();
    let fields: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    // `fields[0]` is field 3 (the state); ppid is field 4, utime 14, stime 15.
    let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
    Some(Stat {
        comm,
        ppid: u32::try_from(field(4)?).ok()?,
        cpu_ticks: field(14)?.checked_add(field(15)?)?,
    })
}

/// The processes whose parent is `pid`, counted by command name (`None`: `/proc` unreadable).
fn children(pid: u32) -> Option<BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        // A process may end between the listing and the read.
        let Ok(text) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        if let Some(stat) = parse_stat(&text)
            && stat.ppid == pid
        {
            *out.entry(stat.comm).or_insert(0) += 1;
        }
    }
    Some(out)
}

/// The server's memory, descriptors and children now.
fn sample(pid: Option<u32>) -> (ProcSample, BTreeMap<String, u64>) {
    let (fds, rss_kb) = server_resources(pid);
    let by_name = pid.and_then(children);
    let count = by_name.as_ref().map(|m| m.values().sum());
    (
        ProcSample {
            rss_kb,
            fds,
            children: count,
        },
        by_name.unwrap_or_default(),
    )
}

/// The server's CPU time so far, seconds.
pub(super) fn cpu_secs(pid: Option<u32>, ticks: u64) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{}/stat", pid?)).ok()?;
    let stat = parse_stat(&text)?;
    Some(stat.cpu_ticks as f64 / ticks.max(1) as f64)
}

/// The peaks a [`Monitor`] saw.
#[derive(Debug, Default)]
struct Peak {
    sample: ProcSample,
    by_name: BTreeMap<String, u64>,
    samples: u64,
}

impl Peak {
    fn absorb(&mut self, s: ProcSample, by_name: &BTreeMap<String, u64>) {
        self.sample = self.sample.max(s);
        for (name, n) in by_name {
            let e = self.by_name.entry(name.clone()).or_insert(0);
            *e = (*e).max(*n);
        }
        self.samples += 1;
    }
}

/// Samples the server every [`SAMPLE_EVERY`] on a blocking thread (reading `/proc` is file
/// I/O) until stopped or [`MONITOR_LIMIT`].
struct Monitor {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Peak>,
}

impl Monitor {
    fn start(pid: Option<u32>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let task = tokio::task::spawn_blocking(move || {
            let mut peak = Peak::default();
            let until = std::time::Instant::now() + MONITOR_LIMIT;
            while pid.is_some()
                && !stopped.load(Ordering::Relaxed)
                && std::time::Instant::now() < until
            {
                let (s, by_name) = sample(pid);
                peak.absorb(s, &by_name);
                std::thread::sleep(SAMPLE_EVERY);
            }
            peak
        });
        Self { stop, task }
    }

    async fn finish(self) -> Peak {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap_or_default()
    }
}

// ---- /health ----

/// One `GET /health` on a fresh connection from `src`: how long to the response head, and
/// its status or what went wrong.
async fn health_once(addr: SocketAddr, src: Ipv4Addr) -> (Duration, Result<u16, &'static str>) {
    let t0 = Instant::now();
    let ask = async {
        let mut s = connect_from(addr, src, None)
            .await
            .map_err(|_| "connect failed")?;
        s.write_all(
            format!("GET /health HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .map_err(|_| "reset")?;
        read_head(&mut s).await.map(|(status, _)| status)
    };
    let r = timeout(HEALTH_TIMEOUT, ask)
        .await
        .unwrap_or(Err("no answer within 2 s"));
    (t0.elapsed(), r)
}

/// Reads a response head: its status and its text (up to the blank line) plus any bytes
/// read past it.
async fn read_head(s: &mut TcpStream) -> Result<(u16, Vec<u8>), &'static str> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 2048];
    loop {
        let n = s.read(&mut chunk).await.map_err(|_| "reset")?;
        if n == 0 {
            return Err("closed without a response");
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = head_end(&buf) {
            let head = parse_head(&buf[..end]).ok_or("bad response")?;
            return Ok((head.status, buf));
        }
        if buf.len() > MAX_HEAD {
            return Err("bad response");
        }
    }
}

/// `GET /health` from `src` every `every` until stopped.
struct HealthProbe {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<(Vec<f64>, BTreeMap<String, u64>)>,
}

impl HealthProbe {
    fn start(addr: SocketAddr, src: Ipv4Addr, every: Duration) -> Self {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut ok_ms = Vec::new();
            let mut failures = BTreeMap::new();
            let until = Instant::now() + MONITOR_LIMIT;
            let mut next = Instant::now();
            loop {
                tokio::select! {
                    _ = stopped.changed() => break,
                    () = sleep_until(next) => {}
                }
                if Instant::now() > until {
                    break;
                }
                let (took, r) = health_once(addr, src).await;
                match r {
                    Ok(200) => ok_ms.push(took.as_secs_f64() * 1000.0),
                    Ok(status) => *failures.entry(status.to_string()).or_insert(0) += 1,
                    Err(e) => *failures.entry(e.to_owned()).or_insert(0) += 1,
                }
                next = (next + every).max(Instant::now());
            }
            (ok_ms, failures)
        });
        Self { stop, task }
    }

    async fn finish(self) -> (Vec<f64>, BTreeMap<String, u64>) {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}

/// `/health` answers as a map for the report: statuses and errors, and successes as "200".
fn statuses(ok: &[f64], failures: BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    let mut out = failures;
    if !ok.is_empty() {
        *out.entry("200".into()).or_insert(0) += u64::try_from(ok.len()).unwrap_or(u64::MAX);
    }
    out
}

// ---- one attack's measurement ----

/// The measurement around one attack: started before it, finished after it.
struct Measuring {
    addr: SocketAddr,
    pid: Option<u32>,
    ticks: u64,
    began: Instant,
    m0: String,
    before: ProcSample,
    cpu0: Option<f64>,
    monitor: Monitor,
    health: HealthProbe,
}

impl Measuring {
    async fn start(opts: &ChaosOptions, ticks: u64) -> Self {
        let m0 = scrape(opts.addr).await;
        let before = sample(opts.server_pid).0;
        let cpu0 = cpu_secs(opts.server_pid, ticks);
        Self {
            addr: opts.addr,
            pid: opts.server_pid,
            ticks,
            began: Instant::now(),
            m0,
            before,
            cpu0,
            monitor: Monitor::start(opts.server_pid),
            health: HealthProbe::start(opts.addr, Ipv4Addr::LOCALHOST, HEALTH_EVERY),
        }
    }

    /// Ends the measurement now; the "after" sample is taken `settle` later.
    async fn finish(self, settle: Duration) -> (AttackCommon, Window) {
        let ended = Instant::now();
        let cpu1 = cpu_secs(self.pid, self.ticks);
        let peak = self.monitor.finish().await;
        let (ok_ms, failures) = self.health.finish().await;
        let m1 = scrape(self.addr).await;
        sleep(settle).await;
        let after = sample(self.pid).0;
        let refused0 = metric_by_label(&self.m0, "voxgate_sessions_refused_total", "reason");
        let mut refused = metric_by_label(&m1, "voxgate_sessions_refused_total", "reason");
        for (reason, n) in &mut refused {
            *n -= refused0.get(reason).copied().unwrap_or(0.0);
        }
        let common = AttackCommon {
            seconds: ended.duration_since(self.began).as_secs_f64(),
            server: ServerUsage {
                before: self.before,
                peak: peak.sample.max(self.before),
                after,
                cpu_secs: self.cpu0.zip(cpu1).map(|(a, b)| b - a),
                children_peak_by_name: peak.by_name,
                samples: peak.samples,
            },
            health_ms: Stats::of(ok_ms),
            health_failed: failures.values().sum(),
            health_failures: failures,
            admitted: PhaseReport::default(),
            refused_by_reason: refused,
        };
        let window = Window {
            from: self.began,
            to: ended,
            m0: self.m0,
            m1,
            cpu0: self.cpu0,
            cpu1,
        };
        (common, window)
    }
}

// ---- 1. the long reply ----

/// About `bytes` of short sentences ("Line 0001 here. ...").
fn long_text(bytes: usize) -> String {
    let mut text = String::with_capacity(bytes + 32);
    let mut i = 0u32;
    while text.len() < bytes {
        i += 1;
        text.push_str(&format!("Line {i:04} here. "));
    }
    text
}

/// Whether an executable file `name` is in one of `PATH`'s directories.
fn on_path(name: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|dir| {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::metadata(dir.join(name))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

async fn long_reply(opts: &ChaosOptions, ticks: u64) -> (LongReplyReport, Window) {
    let a = &opts.attacks;
    let text = long_text(a.long_reply_bytes);
    let mut report = LongReplyReport {
        text_bytes: text.len(),
        espeak_ng_on_path: on_path("espeak-ng"),
        ..LongReplyReport::default()
    };
    let m = Measuring::start(opts, ticks).await;
    if let Err(e) = speak_long(opts.addr, text, a.long_reply_for, &mut report).await {
        report.error = Some(format!("{e:#}"));
    }
    let (common, w) = m.finish(SETTLE).await;
    report.espeak_ng_peak = common
        .server
        .children_peak_by_name
        .get("espeak-ng")
        .copied()
        .unwrap_or(0);
    report.common = common;
    (report, w)
}

/// The next realtime message within `until`, skipping control frames; `None` at the deadline.
async fn next_binary(ws: &mut ws::Ws, until: Instant) -> anyhow::Result<Option<Down>> {
    loop {
        let Ok(msg) = timeout_at(until, ws.next()).await else {
            return Ok(None);
        };
        match msg {
            Some(Ok(Message::Binary(b))) => {
                if let Ok(Some(p)) = ClientBoundMessage::decode_frame(b).map(|m| m.payload) {
                    return Ok(Some(p));
                }
            }
            Some(Ok(Message::Close(f))) => bail!(
                "the server closed the session ({})",
                f.map_or_else(|| "no code".to_owned(), |f| u16::from(f.code).to_string())
            ),
            None => bail!("connection lost"),
            Some(Err(e)) => return Err(e).context("receiving"),
            Some(Ok(_)) => {}
        }
    }
}

async fn speak_long(
    addr: SocketAddr,
    text: String,
    read_for: Duration,
    report: &mut LongReplyReport,
) -> anyhow::Result<()> {
    let url = format!("ws://{addr}{REALTIME_PATH}");
    let mut ws = ws::connect(&url, &[], ATTEMPT_TIMEOUT).await?;
    ws.send(Message::Binary(realtime_init(true)?)).await?;
    let ready_by = Instant::now() + ATTEMPT_TIMEOUT;
    loop {
        match next_binary(&mut ws, ready_by).await? {
            Some(Down::SessionReady(_)) => break,
            Some(_) => {}
            None => bail!("not ready within {ATTEMPT_TIMEOUT:?}"),
        }
    }
    ws.send(Message::Binary(
        ServiceBoundMessage::direct_speech(text, true, false).to_frame(),
    ))
    .await
    .context("sending the text")?;
    let sent = Instant::now();
    let until = sent + read_for;
    let mut audio_bytes = 0usize;
    let outcome = loop {
        match next_binary(&mut ws, until).await {
            Ok(Some(Down::ModelAudioChunk(c))) => {
                report.audio_chunks += 1;
                audio_bytes += c.audio.map_or(0, |a| a.data.len());
                report
                    .first_audio_ms
                    .get_or_insert(sent.elapsed().as_secs_f64() * 1000.0);
            }
            Ok(Some(Down::Error(e))) => {
                if report.server_errors.len() < 5 {
                    report.server_errors.push(e.message);
                }
            }
            Ok(Some(_)) => {}
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    report.read_secs = sent.elapsed().as_secs_f64();
    report.audio_secs = audio_bytes as f64 / LONG_REPLY_BYTES_PER_SEC;
    let _ = timeout(Duration::from_secs(2), ws.close(None)).await;
    outcome
}

// ---- 2. the perception flood ----

async fn perception(opts: &ChaosOptions, ticks: u64) -> (PerceptionReport, Window) {
    let a = &opts.attacks;
    let m = Measuring::start(opts, ticks).await;
    let big = post_batch(opts, a.perception_big).await;
    let small = post_batch(opts, a.perception_small).await;
    let (common, w) = m.finish(PERCEPTION_SETTLE).await;
    let report = PerceptionReport {
        common,
        devices: a.perception_devices,
        names: a.perception_names,
        big,
        small,
    };
    (report, w)
}

/// Every device posts its events one after another, the devices at once, each from its own
/// loopback address in turn (as the flood's sources).
async fn post_batch(opts: &ChaosOptions, data_bytes: usize) -> PostBatch {
    let a = &opts.attacks;
    let t0 = Instant::now();
    let deadline = t0 + BATCH_LIMIT;
    let filler: Arc<str> = "x".repeat(data_bytes).into();
    let mut tasks = Vec::with_capacity(a.perception_devices);
    for d in 0..a.perception_devices {
        let (addr, src, names) = (opts.addr, source(d, opts.sources), a.perception_names);
        let filler = Arc::clone(&filler);
        tasks.push(tokio::spawn(async move {
            let mut results = Vec::with_capacity(names);
            for n in 0..names {
                if Instant::now() > deadline {
                    break;
                }
                let body = json!({
                    "name": format!("chaos_{n:03}"),
                    "device_id": format!("chaos-{d:03}"),
                    "data": {"v": &*filler},
                })
                .to_string();
                results.push(post(addr, src, "/api/perception/event", body.as_bytes()).await);
            }
            results
        }));
    }
    let mut batch = PostBatch {
        data_bytes,
        ..PostBatch::default()
    };
    for t in tasks {
        for (sent, r) in t.await.unwrap_or_default() {
            batch.requests += 1;
            batch.bytes_sent += sent;
            match r {
                Ok(status) => *batch.by_status.entry(status).or_insert(0) += 1,
                Err(e) => *batch.errors.entry(e.to_owned()).or_insert(0) += 1,
            }
        }
    }
    batch.seconds = t0.elapsed().as_secs_f64();
    batch.rss_kb_after = server_resources(opts.server_pid).1;
    batch
}

/// `POST path` with a JSON `body` on a fresh connection from `src`: the bytes written and the
/// status. A server that refuses the body may answer and close before it is all sent, so a
/// failed write still reads for the answer.
async fn post(
    addr: SocketAddr,
    src: Ipv4Addr,
    path: &str,
    body: &[u8],
) -> (u64, Result<u16, &'static str>) {
    let mut sent = 0u64;
    let r = timeout(REQUEST_TIMEOUT, async {
        let mut s = connect_from(addr, src, None)
            .await
            .map_err(|_| "connect failed")?;
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).await.map_err(|_| "reset")?;
        sent += head.len() as u64;
        for piece in body.chunks(16 * 1024) {
            if s.write_all(piece).await.is_err() {
                break;
            }
            sent += piece.len() as u64;
        }
        read_head(&mut s).await.map(|(status, _)| status)
    })
    .await
    .unwrap_or(Err("timed out"));
    (sent, r)
}

// ---- 3. idle connections ----

/// What one idle keep-alive connection saw.
#[derive(Debug, Default)]
struct IdleConn {
    opened: bool,
    answer: Option<Result<u16, &'static str>>,
    closed_after: Option<Duration>,
}

/// The `Content-Length` of a response head, if it has one.
fn content_length(head: &[u8]) -> Option<usize> {
    let text = std::str::from_utf8(head).ok()?;
    text.split("\r\n").skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse().ok())
            .flatten()
    })
}

/// Reads one whole response (head and a `Content-Length` body) off a keep-alive connection.
async fn read_response(s: &mut TcpStream) -> Result<u16, &'static str> {
    let (status, mut buf) = read_head(s).await?;
    let end = head_end(&buf).unwrap_or(buf.len());
    let want = content_length(&buf[..end]).unwrap_or(0);
    let mut chunk = [0u8; 2048];
    while buf.len() - end < want {
        let n = s.read(&mut chunk).await.map_err(|_| "reset")?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(status)
}

/// Waits for the server to close `s` (a read of 0 bytes or an error; any data is read and
/// dropped) or for `stop`; returns how long that took if the server closed.
async fn until_closed(s: &mut TcpStream, stop: &mut watch::Receiver<bool>) -> Option<Duration> {
    let t0 = Instant::now();
    let mut chunk = [0u8; 1024];
    loop {
        tokio::select! {
            _ = stop.changed() => return None,
            r = s.read(&mut chunk) => if !matches!(r, Ok(n) if n > 0) {
                return Some(t0.elapsed());
            }
        }
    }
}

async fn idle_conn(
    addr: SocketAddr,
    permit: OwnedSemaphorePermit,
    kept: Arc<AtomicU64>,
    answered: Arc<AtomicU64>,
    mut stop: watch::Receiver<bool>,
) -> IdleConn {
    let mut c = IdleConn::default();
    let first = async {
        let mut s = connect_from(addr, IDLE_SOURCE, None)
            .await
            .map_err(|_| "connect failed")?;
        c.opened = true;
        s.write_all(format!("GET /health HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await
            .map_err(|_| "reset")?;
        let status = read_response(&mut s).await?;
        Ok::<_, &'static str>((s, status))
    };
    let first = timeout(REQUEST_TIMEOUT, first)
        .await
        .unwrap_or(Err("timed out"));
    drop(permit);
    answered.fetch_add(1, Ordering::Relaxed);
    match first {
        // Served: kept open as long as the server lets it.
        Ok((mut s, 200)) => {
            c.answer = Some(Ok(200));
            kept.fetch_add(1, Ordering::Relaxed);
            c.closed_after = until_closed(&mut s, &mut stop).await;
            kept.fetch_sub(1, Ordering::Relaxed);
        }
        // Refused (a 429 over the per-address cap): dropped, as a client would.
        Ok((_, status)) => c.answer = Some(Ok(status)),
        Err(e) => c.answer = Some(Err(e)),
    }
    c
}

/// What one drip connection saw.
#[derive(Debug, Default)]
struct Drip {
    failed: bool,
    closed_after: Option<Duration>,
    sent: u64,
    statuses: Vec<u16>,
}

/// A keep-alive connection that, after one `GET /health`, sends a second request head one
/// byte per [`DRIP_EVERY`] (`body` false), or one that sends a whole `POST` head and then its
/// body a byte at a time (`body` true), until the server closes it or `stop`.
async fn drip(addr: SocketAddr, body: bool, mut stop: watch::Receiver<bool>) -> Drip {
    let mut d = Drip::default();
    let opened = timeout(REQUEST_TIMEOUT, async {
        let mut s = connect_from(addr, IDLE_SOURCE, None).await.ok()?;
        if body {
            let json = format!(
                "{{\"name\":\"chaos_drip\",\"device_id\":\"chaos-drip\",\"data\":{{\"v\":\"{}\"}}}}",
                "d".repeat(100)
            );
            let head = format!(
                "POST /api/perception/event HTTP/1.1\r\nHost: {addr}\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                json.len()
            );
            s.write_all(head.as_bytes()).await.ok()?;
            Some((s, json.into_bytes()))
        } else {
            s.write_all(format!("GET /health HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
                .await
                .ok()?;
            read_response(&mut s).await.ok()?;
            Some((
                s,
                format!("GET /health HTTP/1.1\r\nHost: {addr}\r\n\r\n").into_bytes(),
            ))
        }
    })
    .await
    .ok()
    .flatten();
    let Some((s, bytes)) = opened else {
        d.failed = true;
        return d;
    };
    let (mut rd, mut wr) = s.into_split();
    let t0 = Instant::now();
    let mut next = t0;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        let more = usize::try_from(d.sent).unwrap_or(usize::MAX) < bytes.len();
        tokio::select! {
            _ = stop.changed() => break,
            r = rd.read(&mut chunk) => match r {
                Ok(n) if n > 0 => {
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(end) = head_end(&buf) {
                        if let Some(h) = parse_head(&buf[..end]) {
                            d.statuses.push(h.status);
                        }
                        buf.drain(..end);
                    }
                    if buf.len() > MAX_HEAD {
                        buf.clear();
                    }
                }
                _ => {
                    d.closed_after = Some(t0.elapsed());
                    break;
                }
            },
            () = sleep_until(next), if more => {
                let i = usize::try_from(d.sent).unwrap_or(0);
                if wr.write_all(&bytes[i..=i]).await.is_err() {
                    d.closed_after = Some(t0.elapsed());
                    break;
                }
                d.sent += 1;
                next += DRIP_EVERY;
            }
        }
    }
    d
}

async fn collect_drips(tasks: Vec<tokio::task::JoinHandle<Drip>>) -> DripReport {
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.unwrap_or_default());
    }
    drip_report(out)
}

fn drip_report(drips: Vec<Drip>) -> DripReport {
    let mut r = DripReport {
        connections: drips.len(),
        ..DripReport::default()
    };
    let mut closes = Vec::new();
    for d in drips {
        r.failed += usize::from(d.failed);
        r.bytes_dripped += d.sent;
        for s in d.statuses {
            *r.statuses.entry(s).or_insert(0) += 1;
        }
        if let Some(c) = d.closed_after {
            r.closed += 1;
            closes.push(c.as_secs_f64());
        }
    }
    closes.sort_by(f64::total_cmp);
    r.first_close_secs = closes.first().copied();
    r.last_close_secs = closes.last().copied();
    r
}

async fn idle_connections(opts: &ChaosOptions, ticks: u64) -> (IdleReport, Window) {
    let a = &opts.attacks;
    let addr = opts.addr;
    let m = Measuring::start(opts, ticks).await;
    let (stop_tx, stop) = watch::channel(false);
    // The drippers first, so a per-address cap that the idle connections reach does not
    // leave them out.
    let heads: Vec<_> = (0..a.idle_drips)
        .map(|_| tokio::spawn(drip(addr, false, stop.clone())))
        .collect();
    let bodies: Vec<_> = (0..a.idle_drips)
        .map(|_| tokio::spawn(drip(addr, true, stop.clone())))
        .collect();
    let same = HealthProbe::start(addr, IDLE_SOURCE, SAME_ADDRESS_EVERY);
    let kept = Arc::new(AtomicU64::new(0));
    let answered = Arc::new(AtomicU64::new(0));
    let opening = Arc::new(Semaphore::new(IDLE_OPENING));
    let t_open = Instant::now();
    let open_by = t_open + IDLE_OPEN_LIMIT;
    let mut tasks = Vec::with_capacity(a.idle_connections);
    for _ in 0..a.idle_connections {
        let Ok(Ok(permit)) = timeout_at(open_by, Arc::clone(&opening).acquire_owned()).await else {
            break;
        };
        tasks.push(tokio::spawn(idle_conn(
            addr,
            permit,
            Arc::clone(&kept),
            Arc::clone(&answered),
            stop.clone(),
        )));
    }
    let tried = u64::try_from(tasks.len()).unwrap_or(u64::MAX);
    while answered.load(Ordering::Relaxed) < tried && Instant::now() < open_by {
        sleep(Duration::from_millis(20)).await;
    }
    let open_secs = t_open.elapsed().as_secs_f64();
    // Then hold them: how many the server keeps, each second.
    let held = Instant::now();
    let mut kept_by_second = vec![kept.load(Ordering::Relaxed)];
    let whole = a.idle_for.as_secs().max(1);
    for s in 1..=whole {
        sleep_until(held + Duration::from_secs(s)).await;
        kept_by_second.push(kept.load(Ordering::Relaxed));
    }
    let _ = stop_tx.send(true);
    let mut report = IdleReport {
        source: IDLE_SOURCE.to_string(),
        connections: a.idle_connections,
        open_secs,
        kept_by_second,
        ..IdleReport::default()
    };
    let mut closes = Vec::new();
    for t in tasks {
        let c = t.await.unwrap_or_default();
        report.opened += usize::from(c.opened);
        match c.answer {
            Some(Ok(status)) => *report.answered.entry(status).or_insert(0) += 1,
            Some(Err(e)) => *report.no_answer.entry(e.to_owned()).or_insert(0) += 1,
            None => *report.no_answer.entry("task failed".into()).or_insert(0) += 1,
        }
        if let Some(d) = c.closed_after {
            closes.push(d.as_secs_f64());
        }
    }
    closes.sort_by(f64::total_cmp);
    report.closed_by_server = closes.len();
    report.first_close_secs = closes.first().copied();
    report.median_close_secs = closes.get(closes.len() / 2).copied();
    report.last_close_secs = closes.last().copied();
    report.head_drips = collect_drips(heads).await;
    report.body_drips = collect_drips(bodies).await;
    let (ok, failures) = same.finish().await;
    report.same_address_health = statuses(&ok, failures);
    let (common, w) = m.finish(SETTLE).await;
    report.common = common;
    (report, w)
}

// ---- 4. the candidate flood ----

/// A Chrome (libwebrtc) audio-only offer, as the server's tests use.
const CHROME_OFFER: &str =
    include_str!("../../../../crates/voxgate-server/tests/fixtures/chrome_audio_offer.sdp");

/// The `i`th candidate: a host candidate on a 127.9.x.y address (loopback, so a server that
/// did send checks to what it is told would still only reach this machine).
fn candidate(i: usize) -> String {
    let (a, b) = ((i / 250) % 250, i % 250);
    json!({"type": "WEBRTC_ICE_CANDIDATE", "payload": {
        "candidate": format!("candidate:{i} 1 udp 2130706431 127.9.{a}.{b} 9 typ host"),
        "sdpMid": "0", "sdpMLineIndex": 0}})
    .to_string()
}

/// What one bridge socket saw.
#[derive(Debug, Default)]
struct GeminiFlood {
    set_up: bool,
    answered: bool,
    sent: u64,
    send_secs: f64,
    /// Seconds from asking for a turn after the flood to its `TURN_COMPLETE`.
    turn_secs: Option<f64>,
    replies: BTreeMap<String, u64>,
    closed_by_server: Option<String>,
    error: Option<String>,
}

/// The next bridge message's `type` (and the message) within `until`.
async fn next_json(ws: &mut ws::Ws, until: Instant) -> anyhow::Result<Value> {
    loop {
        let msg = timeout_at(until, ws.next())
            .await
            .context("no message in time")?;
        match msg {
            Some(Ok(Message::Text(t))) => {
                return serde_json::from_str(t.as_str()).context("not JSON");
            }
            Some(Ok(Message::Close(f))) => bail!(
                "the server closed the socket ({})",
                f.map_or_else(|| "no code".to_owned(), |f| u16::from(f.code).to_string())
            ),
            None => bail!("connection lost"),
            Some(Err(e)) => return Err(e).context("receiving"),
            Some(Ok(_)) => {}
        }
    }
}

async fn gemini_flood(addr: SocketAddr, n: usize, g: &mut GeminiFlood) -> anyhow::Result<()> {
    let url = format!("ws://{addr}/gemini");
    let mut ws = ws::connect(&url, &[], ATTEMPT_TIMEOUT).await?;
    let connect = json!({"type": "CONNECT_GEMINI", "payload": {"initialConfig":
        {"model": "chaos", "generationConfig": {"responseModalities": ["AUDIO"]}}}});
    ws.send(Message::Text(connect.to_string().into())).await?;
    let by = Instant::now() + ATTEMPT_TIMEOUT;
    let mut seen = (false, false);
    while !(seen.0 && seen.1) {
        let m = next_json(&mut ws, by).await.context("setting up")?;
        match m["type"].as_str() {
            Some("GEMINI_CONNECTED") => seen.0 = true,
            Some("SETUP_COMPLETE") => seen.1 = true,
            Some("ERROR") => bail!("setting up: {m}"),
            _ => {}
        }
    }
    g.set_up = true;
    let offer = json!({"type": "WEBRTC_OFFER", "payload": {"sdp": CHROME_OFFER}});
    ws.send(Message::Text(offer.to_string().into())).await?;
    let by = Instant::now() + ATTEMPT_TIMEOUT;
    loop {
        let m = next_json(&mut ws, by).await.context("the offer")?;
        match m["type"].as_str() {
            Some("WEBRTC_ANSWER") => break,
            Some("ERROR") => bail!("the offer: {m}"),
            _ => {}
        }
    }
    g.answered = true;
    let (mut sink, mut stream) = ws.split();
    let (done_tx, mut done) = watch::channel(false);
    // Read whatever the server says meanwhile, so it never blocks on writing to us, until
    // the turn asked for after the flood completes.
    let reader = tokio::spawn(async move {
        let mut replies = BTreeMap::new();
        let mut closed = None;
        let mut turn_done = None;
        let until = Instant::now() + FLOOD_LIMIT + TURN_LIMIT;
        loop {
            tokio::select! {
                _ = done.changed() => break,
                () = sleep_until(until) => break,
                msg = stream.next() => match msg {
                    Some(Ok(Message::Text(t))) => {
                        let kind = serde_json::from_str::<Value>(t.as_str())
                            .ok()
                            .and_then(|v| v["type"].as_str().map(str::to_owned))
                            .unwrap_or_else(|| "?".into());
                        let complete = kind == "TURN_COMPLETE";
                        *replies.entry(kind).or_insert(0u64) += 1;
                        if complete {
                            turn_done = Some(Instant::now());
                            break;
                        }
                    }
                    Some(Ok(Message::Close(f))) => {
                        closed = Some(f.map_or_else(|| "no code".to_owned(), |f| u16::from(f.code).to_string()));
                        break;
                    }
                    None | Some(Err(_)) => {
                        closed = Some("connection lost".to_owned());
                        break;
                    }
                    Some(Ok(_)) => {}
                }
            }
        }
        (replies, closed, turn_done)
    });
    let t0 = Instant::now();
    let until = t0 + FLOOD_LIMIT;
    let mut failed = None;
    for i in 0..n {
        if Instant::now() > until {
            failed = Some(format!("sending took over {FLOOD_LIMIT:?}"));
            break;
        }
        if let Err(e) = sink.feed(Message::Text(candidate(i).into())).await {
            failed = Some(format!("sending: {e}"));
            break;
        }
        g.sent += 1;
        if (i + 1) % CANDIDATE_BATCH == 0
            && let Err(e) = sink.flush().await
        {
            failed = Some(format!("sending: {e}"));
            break;
        }
    }
    if failed.is_none()
        && let Err(e) = sink.flush().await
    {
        failed = Some(format!("sending: {e}"));
    }
    g.send_secs = t0.elapsed().as_secs_f64();
    // Then a turn: it completes once the server has worked through what came before it.
    let asked = Instant::now();
    if failed.is_none() {
        let turn =
            json!({"type": "SEND_MESSAGE", "payload": {"parts": [{"text": "Still there?"}]}});
        if let Err(e) = sink.send(Message::Text(turn.to_string().into())).await {
            failed = Some(format!("asking for a turn: {e}"));
        }
    }
    let mut reader = reader;
    let read = match timeout(TURN_LIMIT, &mut reader).await {
        Ok(r) => r,
        Err(_) => {
            let _ = done_tx.send(true);
            reader.await
        }
    };
    let (replies, closed, turn_done) = read.unwrap_or_default();
    g.turn_secs = turn_done.map(|t| t.duration_since(asked).as_secs_f64());
    g.replies = replies;
    g.closed_by_server = closed;
    let _ = timeout(Duration::from_secs(2), sink.close()).await;
    match failed {
        Some(e) => bail!(e),
        None => Ok(()),
    }
}

async fn candidates(opts: &ChaosOptions, ticks: u64) -> (CandidateReport, Window) {
    let a = &opts.attacks;
    let m = Measuring::start(opts, ticks).await;
    let tasks: Vec<_> = (0..a.gemini_sockets)
        .map(|_| {
            let (addr, n) = (opts.addr, a.candidates);
            tokio::spawn(async move {
                let mut g = GeminiFlood::default();
                if let Err(e) = gemini_flood(addr, n, &mut g).await {
                    g.error = Some(format!("{e:#}"));
                }
                g
            })
        })
        .collect();
    let mut report = CandidateReport {
        sockets: a.gemini_sockets,
        ..CandidateReport::default()
    };
    for t in tasks {
        let g = t.await.unwrap_or_default();
        report.set_up += usize::from(g.set_up);
        report.answered += usize::from(g.answered);
        report.candidates_sent += g.sent;
        report.send_secs = report.send_secs.max(g.send_secs);
        report.turn_after_flood_secs.extend(g.turn_secs);
        for (k, n) in g.replies {
            *report.replies.entry(k).or_insert(0) += n;
        }
        if let Some(c) = g.closed_by_server {
            report.closed_by_server.push(c);
        }
        if let Some(e) = g.error
            && report.errors.len() < 5
        {
            report.errors.push(e);
        }
    }
    report.turn_after_flood_secs.sort_by(f64::total_cmp);
    let (common, w) = m.finish(SETTLE).await;
    let ignored = "voxgate_webrtc_candidates_ignored_total";
    report.candidates_ignored = metric_sum(&w.m1, ignored, "") - metric_sum(&w.m0, ignored, "");
    report.common = common;
    (report, w)
}

// ---- 5. parked calls ----

/// A parked call refused with 503 is tried again this many times, a second apart.
const PARK_TRIES: u32 = 3;
/// The prefix of the parked calls' ids.
const PARKED_PREFIX: &str = "chaos-parked-";

/// One Retell call: `call_details` with `metadata`, then a close. Returns how it ended.
async fn park_one(addr: SocketAddr, i: usize, metadata: &str, refusals: &mut u64) -> String {
    let call_id = format!("{PARKED_PREFIX}{i:03}");
    let url = format!("ws://{addr}/llm-websocket/{call_id}");
    let mut tries = 0;
    let mut ws = loop {
        match ws::connect(&url, &[], ATTEMPT_TIMEOUT).await {
            Ok(ws) => break ws,
            Err(e) => {
                let e = format!("{e:#}");
                // Refused for capacity or overload (Retry-After): counted, then tried again.
                if e.contains("503") && tries < PARK_TRIES {
                    tries += 1;
                    *refusals += 1;
                    sleep(Duration::from_secs(1)).await;
                    continue;
                }
                return format!("not connected ({})", last_part(&e));
            }
        }
    };
    let details = json!({"interaction_type": "call_details", "call": {
        "call_id": call_id, "agent_id": "chaos", "call_status": "ongoing",
        "call_type": "web_call", "metadata": {"note": metadata}}});
    if ws
        .send(Message::Text(details.to_string().into()))
        .await
        .is_err()
    {
        return "the send failed".into();
    }
    // A moment for the server to take it (or refuse it), then the close.
    let until = Instant::now() + Duration::from_millis(300);
    loop {
        match timeout_at(until, ws.next()).await {
            Err(_) => break,
            Ok(Some(Ok(Message::Close(f)))) => {
                return format!(
                    "closed by the server ({})",
                    f.map_or_else(|| "no code".to_owned(), |f| u16::from(f.code).to_string())
                );
            }
            Ok(None | Some(Err(_))) => return "connection lost".into(),
            Ok(Some(Ok(_))) => {}
        }
    }
    if timeout(Duration::from_secs(2), ws.close(None))
        .await
        .is_err()
    {
        return "our close timed out".into();
    }
    // Wait for the server's side of the close.
    let until = Instant::now() + Duration::from_secs(2);
    while let Ok(Some(Ok(_))) = timeout_at(until, ws.next()).await {}
    "closed by us".into()
}

/// The last `: `-separated part of an error chain (the cause, without the URL).
fn last_part(s: &str) -> &str {
    s.rsplit(": ").next().unwrap_or(s)
}

/// The server's `GET /retell/calls` (a local request needs no token by default): how many of
/// the calls named with `prefix` it lists as not connected.
async fn parked_count(addr: SocketAddr, prefix: &str) -> Option<u64> {
    let fetch = async {
        let mut s = TcpStream::connect(addr).await.ok()?;
        s.write_all(
            format!("GET /retell/calls HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .ok()?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.ok()?;
        Some(raw)
    };
    let raw = timeout(REQUEST_TIMEOUT, fetch).await.ok().flatten()?;
    let end = head_end(&raw)?;
    if parse_head(&raw[..end])?.status != 200 {
        return None;
    }
    count_parked(&raw[end..], prefix)
}

/// Of the calls in a `/retell/calls` body whose id starts with `prefix`, those not connected.
fn count_parked(body: &[u8], prefix: &str) -> Option<u64> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let n = v["calls"]
        .as_array()?
        .iter()
        .filter(|c| {
            c["call_id"]
                .as_str()
                .is_some_and(|id| id.starts_with(prefix))
                && c["connected"] == Value::Bool(false)
        })
        .count();
    u64::try_from(n).ok()
}

async fn parked_calls(opts: &ChaosOptions, ticks: u64, admitted: f64) -> (ParkedReport, Window) {
    let a = &opts.attacks;
    let metadata = "m".repeat(a.parked_bytes);
    let m = Measuring::start(opts, ticks).await;
    let mut report = ParkedReport {
        calls: a.parked_calls,
        metadata_bytes: a.parked_bytes,
        ..ParkedReport::default()
    };
    // One after another: each call is a session, and only a few slots are free.
    for i in 0..a.parked_calls {
        let outcome = park_one(opts.addr, i, &metadata, &mut report.refused_503).await;
        *report.outcomes.entry(outcome).or_insert(0) += 1;
        // The call's session ends as its socket closes; its slot is the next call's.
        drained(opts.addr, admitted, Duration::from_secs(5)).await;
    }
    drop(metadata);
    sleep(Duration::from_millis(300)).await;
    report.rss_kb_right_after = server_resources(opts.server_pid).1;
    report.parked = parked_count(opts.addr, PARKED_PREFIX).await;
    let (common, w) = m.finish(SETTLE).await;
    report.common = common;
    (report, w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_are_parsed_from_the_last_parenthesis() {
        let line = "4242 (espeak-ng) S 4100 4242 4100 0 -1 4194560 310 0 0 0 7 3 0 0 20 0 1 0 \
                    123 10 20 30";
        let s = parse_stat(line).unwrap();
        assert_eq!(
            s,
            Stat {
                comm: "espeak-ng".into(),
                ppid: 4100,
                cpu_ticks: 10
            }
        );
        // A command name with spaces and a parenthesis in it.
        let odd = "7 (a) b (c) R 1 7 7 0 -1 0 0 0 0 0 250 50 0 0";
        let s = parse_stat(odd).unwrap();
        assert_eq!((s.comm.as_str(), s.ppid, s.cpu_ticks), ("a) b (c", 1, 300));
        assert_eq!(parse_stat("12 (short) S 1 2"), None);
        assert_eq!(parse_stat("no parentheses"), None);
    }

    #[test]
    fn this_process_is_its_childs_parent() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let me = std::process::id();
        let kids = children(me).unwrap();
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(kids.get("sleep"), Some(&1), "{kids:?}");
        let (s, by_name) = sample(Some(me));
        assert!(s.rss_kb.unwrap() > 0 && s.fds.unwrap() > 0);
        assert_eq!(s.children, Some(by_name.values().sum()));
        assert!(cpu_secs(Some(me), 100).is_some());
        assert_eq!(sample(None).0, ProcSample::default());
    }

    #[test]
    fn peaks_keep_the_largest_of_each() {
        let mut p = Peak::default();
        let a = ProcSample {
            rss_kb: Some(10),
            fds: Some(5),
            children: Some(3),
        };
        let b = ProcSample {
            rss_kb: Some(12),
            fds: None,
            children: Some(1),
        };
        p.absorb(a, &BTreeMap::from([("espeak-ng".to_owned(), 3)]));
        p.absorb(
            b,
            &BTreeMap::from([("espeak-ng".to_owned(), 1), ("sh".to_owned(), 2)]),
        );
        assert_eq!(
            p.sample,
            ProcSample {
                rss_kb: Some(12),
                fds: Some(5),
                children: Some(3)
            }
        );
        assert_eq!(p.by_name.get("espeak-ng"), Some(&3));
        assert_eq!(p.by_name.get("sh"), Some(&2));
        assert_eq!(p.samples, 2);
    }

    #[test]
    fn the_long_text_is_sentences_of_the_asked_length() {
        let t = long_text(60_000);
        assert!((60_000..60_016).contains(&t.len()), "{}", t.len());
        assert!(t.starts_with("Line 0001 here. Line 0002 here. "));
        assert_eq!(t.matches(". ").count(), 3_750);
        assert!(long_text(0).is_empty());
    }

    #[test]
    fn content_length_is_read_from_the_head() {
        let head = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nContent-Length: 12\r\n\r\n";
        assert_eq!(content_length(head), Some(12));
        assert_eq!(content_length(b"HTTP/1.1 204 No Content\r\n\r\n"), None);
        assert_eq!(
            content_length(b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n"),
            None
        );
    }

    #[test]
    fn candidates_name_loopback_addresses_only() {
        for i in [0, 249, 250, 24_999, 99_999] {
            let c: Value = serde_json::from_str(&candidate(i)).unwrap();
            assert_eq!(c["type"], "WEBRTC_ICE_CANDIDATE");
            let line = c["payload"]["candidate"].as_str().unwrap();
            let ip: Ipv4Addr = line.split(' ').nth(4).unwrap().parse().unwrap();
            assert!(ip.is_loopback(), "{line}");
            assert!(line.starts_with(&format!("candidate:{i} ")), "{line}");
        }
        assert!(CHROME_OFFER.starts_with("v=0") && CHROME_OFFER.contains("opus/48000"));
    }

    #[test]
    fn parked_calls_are_counted_from_the_listing() {
        let body = br#"{"calls":[{"call_id":"chaos-parked-000","connected":false},
            {"call_id":"chaos-parked-001","connected":true},
            {"call_id":"other","connected":false},
            {"call_id":"chaos-parked-002","connected":false}]}"#;
        assert_eq!(count_parked(body, PARKED_PREFIX), Some(2));
        assert_eq!(count_parked(b"{}", PARKED_PREFIX), None);
        assert_eq!(count_parked(b"not json", PARKED_PREFIX), None);
    }

    #[test]
    fn drips_are_summed() {
        let r = drip_report(vec![
            Drip {
                closed_after: Some(Duration::from_secs(3)),
                sent: 3,
                statuses: vec![408],
                ..Drip::default()
            },
            Drip {
                sent: 12,
                ..Drip::default()
            },
            Drip {
                failed: true,
                ..Drip::default()
            },
            Drip {
                closed_after: Some(Duration::from_secs(2)),
                sent: 2,
                ..Drip::default()
            },
        ]);
        assert_eq!((r.connections, r.failed, r.closed), (4, 1, 2));
        assert_eq!(
            (r.first_close_secs, r.last_close_secs),
            (Some(2.0), Some(3.0))
        );
        assert_eq!(r.bytes_dripped, 17);
        assert_eq!(r.statuses, BTreeMap::from([(408, 1)]));
        let s = statuses(&[1.0, 2.0], BTreeMap::from([("429".to_owned(), 3)]));
        assert_eq!(s.get("200"), Some(&2));
        assert_eq!(s.get("429"), Some(&3));
    }
}
