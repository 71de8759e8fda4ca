//! Chaos: admission control and lifecycle timeouts under abuse, measured from outside.
//!
//! One run against a server on a loopback address, in phases:
//!
//! 1. **admitted**: `sessions` Xiaozhi devices stream real Opus at real time in auto mode (as
//!    [`load`](crate::load) does), each turn's latency from the end of the speech to the first
//!    reply frame recorded; `probes` realtime sessions send a protobuf `Ping` every 100 ms and
//!    record the `Pong` round trip (an exact measure of how promptly a session is served).
//!    These run until the end; the other phases are measured against them.
//! 2. **before**: nothing else happens for `before`: the baseline latencies.
//! 3. **flood**: `attempts` WebSocket upgrades over capacity, spread over `flood`, at most
//!    `concurrency` in flight, from `sources` loopback addresses (127.0.0.2, ...): each one's
//!    status (503, 429, 101, or an error), `Retry-After`, and latency to the response.
//!    A few upgrades that are admitted (the server's free slots) are kept open as live devices
//!    until the flood ends, so the free slots stay taken.
//! 4. **slowloris**: `slow` connections, half sending the upgrade request one byte per `drip`,
//!    half sending nothing, held for `slow_for`: when (if) the server closes them, the server's
//!    open files and memory, and whether a fresh session is still admitted.
//! 5. **timeouts**, concurrently: an upgraded connection that never initializes (Xiaozhi and
//!    realtime), a peer that initializes and then stops reading while the server writes to it,
//!    and a dead peer (initialized, then silent: no frames, no pongs; Xiaozhi and realtime):
//!    when the server closed each, and with which close code, each bounded by `check_limit`.
//!
//! 6. **attacks**, one after another ([`attacks`]): a long spoken reply, a perception-event
//!    flood, idle keep-alive connections, a WebRTC candidate flood and parked Retell calls, each
//!    with the server's child processes, memory, descriptors, CPU and `/health` latency
//!    measured around it.
//!
//! The server's `/metrics` is read between phases (dropped frames, refusals by reason).
//! Every loop is bounded in count and time, and only 127.0.0.0/8 addresses are used.

pub mod attacks;

use std::collections::{BTreeMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use serde::Serialize;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::time::{Instant, sleep, sleep_until, timeout};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;
use voxgate_realtime::proto::client_bound_message::Payload as Down;
use voxgate_realtime::proto::{HostedTtsMode, InferenceTriggerMode, SampleFormat};
use voxgate_realtime::{
    AudioFormat, ClientBoundMessage, HostedTtsSettings, HostedVoice, ServiceBoundMessage,
    SessionConfig, TtsSettings,
};
use voxgate_xiaozhi::control::{DeviceMessage, Listen, ListenMode, ServerMessage, TtsState};
use voxgate_xiaozhi::frame::{Frame, FrameCodec, ProtocolVersion};

use crate::audio::{self, Pacing, Playback};
use crate::ws;
use crate::xiaozhi::{self, UPLINK_FRAME, UPLINK_RATE};

/// The Xiaozhi door's path on the main listener.
const XIAOZHI_PATH: &str = "/xiaozhi/v1/";
/// The realtime door's path.
const REALTIME_PATH: &str = "/realtime";
/// How long one flood attempt may take (connect plus response head).
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// Flood upgrades admitted beyond this many are closed at once instead of held (a server
/// without admission control would otherwise get thousands of live sessions).
const MAX_HELD: usize = 64;
/// A flood attempt starting this much after its slot means the client, not the server, was
/// the bottleneck.
const START_SLACK: Duration = Duration::from_millis(100);
/// The realtime probes' ping period.
const PING_EVERY: Duration = Duration::from_millis(100);
/// Slack for client-side lateness of sent and played frames, as in `load`.
const SLACK: Duration = Duration::from_millis(30);
/// The receive buffer of the peer that stops reading, so the server's writes back up soon.
const SMALL_RCVBUF: u32 = 4096;
/// The longest HTTP response head read.
const MAX_HEAD: usize = 16 * 1024;
/// A valid `Sec-WebSocket-Key` (any 16 bytes, base64); the server does not care which.
const WS_KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

/// What chaos to make.
#[derive(Debug, Clone)]
pub struct ChaosOptions {
    /// The server's address; must be on 127.0.0.0/8.
    pub addr: SocketAddr,
    /// Admitted streaming Xiaozhi sessions.
    pub sessions: usize,
    /// Admitted realtime ping sessions.
    pub probes: usize,
    /// The speech the sessions stream (looped).
    pub wav: PathBuf,
    /// Sessions start spread over this long.
    pub ramp: Duration,
    /// The baseline phase.
    pub before: Duration,
    /// Upgrade attempts in the flood.
    pub attempts: usize,
    /// Flood attempts in flight at once.
    pub concurrency: usize,
    /// The flood's attempts are spread over this long (zero: as fast as possible).
    pub flood: Duration,
    /// Loopback source addresses for the flood and slowloris (127.0.0.2 onwards; 0: the
    /// system's choice, 127.0.0.1).
    pub sources: u8,
    /// Slowloris connections (half drip, half silent).
    pub slow: usize,
    /// How long the slowloris connections are held.
    pub slow_for: Duration,
    /// One byte of the upgrade request per this long.
    pub drip: Duration,
    /// The longest any timeout check waits for the server to close.
    pub check_limit: Duration,
    /// The server's process id, to sample its open files and memory (Linux `/proc`).
    pub server_pid: Option<u32>,
    /// The attack phases to run after the timeout checks, and their sizes.
    pub attacks: attacks::AttackOptions,
}

/// Latency figures, in milliseconds.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Stats {
    /// Samples.
    pub n: usize,
    /// Median.
    pub p50: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

impl Stats {
    /// Nearest-rank percentiles of `ms`.
    #[must_use]
    pub fn of(mut ms: Vec<f64>) -> Self {
        if ms.is_empty() {
            return Self::default();
        }
        ms.sort_by(f64::total_cmp);
        let rank = |p: f64| {
            let r = (p * ms.len() as f64).ceil().max(1.0);
            // `r` is at least 1 and at most the length, so this is an index.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let i = r as usize - 1;
            ms.get(i).copied().unwrap_or(0.0)
        };
        Self {
            n: ms.len(),
            p50: rank(0.5),
            p99: rank(0.99),
            max: ms.last().copied().unwrap_or(0.0),
        }
    }
}

/// What the admitted sessions saw during one phase.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PhaseReport {
    /// The phase's length.
    pub seconds: f64,
    /// Xiaozhi turns: end of speech to the first reply frame.
    pub turn_ms: Stats,
    /// Realtime `Ping` to `Pong`.
    pub ping_ms: Stats,
    /// Reply frames that arrived after their playback slot (client-side drops).
    pub late_frames: u64,
    /// Uplink frames the client sent late (client overload).
    pub late_sends: u64,
    /// Server `voxgate_dropped_frames_total{direction="uplink"}` over the phase.
    pub server_dropped_uplink: f64,
    /// Server `voxgate_dropped_frames_total{direction="downlink"}` over the phase.
    pub server_dropped_downlink: f64,
    /// The server's CPU time (user + system) over the phase, seconds (Linux `/proc`): the
    /// admitted sessions' own cost, plus whatever the phase adds.
    pub server_cpu_secs: Option<f64>,
}

/// The flood's outcome.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FloodReport {
    /// Attempts made.
    pub attempts: usize,
    /// How long the flood took.
    pub seconds: f64,
    /// Session slots free when the flood began (`max_sessions` minus the sessions open), if
    /// the caller said `max_sessions`; otherwise the sessions open.
    pub sessions_open_before: f64,
    /// Responses by HTTP status.
    pub by_status: BTreeMap<u16, u64>,
    /// Refusals (any status but 101) that carried `Retry-After`.
    pub retry_after: u64,
    /// Upgrades admitted (101).
    pub admitted: u64,
    /// Attempts with no response, by what happened.
    pub errors: BTreeMap<String, u64>,
    /// Latency of refusals, connect to response head.
    pub refusal_ms: Stats,
    /// Latency of admitted upgrades.
    pub admitted_ms: Stats,
    /// Attempts that started more than 100 ms after their slot (the client was the limit).
    pub late_starts: u64,
}

/// The slowloris phase's outcome.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SlowReport {
    /// Connections sending the upgrade request one byte at a time.
    pub drip: usize,
    /// Connections sending nothing.
    pub silent: usize,
    /// Connections that could not be opened.
    pub open_failed: usize,
    /// Connections the server closed while they were held.
    pub closed_by_server: usize,
    /// Seconds from opening to the server's close: the earliest and the latest.
    pub first_close_secs: Option<f64>,
    /// As `first_close_secs`, the latest.
    pub last_close_secs: Option<f64>,
    /// Bytes the drip connections had sent when the phase ended (or they were closed).
    pub bytes_dripped: u64,
    /// A fresh Xiaozhi session opened mid-phase: milliseconds to the server's hello.
    pub fresh_session_ms: Option<f64>,
    /// Why the fresh session failed, if it did.
    pub fresh_session_error: Option<String>,
    /// The server's open files before the phase and while every slow connection was open.
    pub server_fds_before: Option<u64>,
    /// As `server_fds_before`, mid-phase.
    pub server_fds_during: Option<u64>,
    /// As `server_fds_before`, after the slow connections were dropped.
    pub server_fds_after: Option<u64>,
    /// The server's resident memory (KB) before the phase.
    pub server_rss_kb_before: Option<u64>,
    /// As `server_rss_kb_before`, mid-phase.
    pub server_rss_kb_during: Option<u64>,
}

/// One timeout check.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CheckReport {
    /// What was tested.
    pub name: String,
    /// Seconds from the moment the peer began misbehaving to the server's close; `None`: not
    /// closed within the limit.
    pub closed_after_secs: Option<f64>,
    /// The close frame's code, if the server sent one and it could be read.
    pub close_code: Option<u16>,
    /// WebSocket pings the server sent first (dead-peer check).
    pub pings: u64,
    /// How the close was seen.
    pub detail: String,
    /// Why the check could not run.
    pub error: Option<String>,
}

/// Everything a chaos run measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChaosReport {
    /// Streaming Xiaozhi sessions asked for.
    pub sessions: usize,
    /// Of those, the ones the server admitted and greeted.
    pub connected: usize,
    /// Realtime ping sessions asked for.
    pub probes: usize,
    /// Of those, the ones that became ready.
    pub probes_connected: usize,
    /// Admitted sessions (of both kinds) that ended with an error.
    pub session_errors: usize,
    /// Up to ten distinct session errors.
    pub errors: Vec<String>,
    /// Xiaozhi turns completed, all sessions, all phases.
    pub turns: u64,
    /// The baseline phase.
    pub before: PhaseReport,
    /// The admitted sessions during the flood.
    pub during_flood: PhaseReport,
    /// The admitted sessions during slowloris.
    pub during_slowloris: PhaseReport,
    /// The flood.
    pub flood: FloodReport,
    /// Slowloris.
    pub slowloris: SlowReport,
    /// The timeout checks.
    pub checks: Vec<CheckReport>,
    /// `voxgate_sessions_refused_total` over the run, by `reason`.
    pub refused_by_reason: BTreeMap<String, f64>,
    /// `voxgate_dropped_frames_total` over the whole run.
    pub server_dropped_total: f64,
    /// The attack phases, each with what the admitted sessions saw during it.
    pub attacks: attacks::Attacks,
    /// The run's length.
    pub seconds: f64,
}

/// What one admitted session recorded, each sample with its time so phases can be split.
#[derive(Debug, Default)]
struct Recorded {
    connected: bool,
    turns: u64,
    turn_latency: Vec<(Instant, Duration)>,
    pings: Vec<(Instant, Duration)>,
    late_frames: Vec<Instant>,
    late_sends: Vec<Instant>,
    error: Option<String>,
}

/// Runs every phase and returns what was measured.
///
/// # Errors
/// A non-loopback address, or a WAV that cannot be read or encoded; what the server does
/// wrong is measured, not returned.
pub async fn run(opts: &ChaosOptions) -> anyhow::Result<ChaosReport> {
    if !is_loopback_v4(opts.addr) {
        bail!("chaos only targets 127.0.0.0/8; {} is not there", opts.addr);
    }
    let began = Instant::now();
    let frames = Arc::new(speech_frames(&opts.wav)?);
    let m_start = scrape(opts.addr).await;
    let (stop_tx, stop) = watch::channel(false);
    let mut devices = Vec::with_capacity(opts.sessions);
    let step = opts.ramp / u32::try_from(opts.sessions.max(1)).unwrap_or(u32::MAX);
    for i in 0..opts.sessions {
        let (frames, stop, addr) = (Arc::clone(&frames), stop.clone(), opts.addr);
        let begin = began + step * u32::try_from(i).unwrap_or(u32::MAX);
        let offset = u64::try_from(i * frames.frames.len() / opts.sessions.max(1)).unwrap_or(0);
        devices.push(tokio::spawn(async move {
            sleep_until(begin).await;
            let mut rec = Recorded::default();
            if let Err(e) = device(i, offset, addr, &frames, stop, &mut rec).await {
                rec.error = Some(format!("xiaozhi: {e:#}"));
            }
            rec
        }));
    }
    let mut probes = Vec::with_capacity(opts.probes);
    for _ in 0..opts.probes {
        let (stop, addr) = (stop.clone(), opts.addr);
        probes.push(tokio::spawn(async move {
            let mut rec = Recorded::default();
            if let Err(e) = probe(addr, stop, &mut rec).await {
                rec.error = Some(format!("realtime probe: {e:#}"));
            }
            rec
        }));
    }
    sleep(opts.ramp + Duration::from_secs(1)).await;

    eprintln!("chaos: baseline for {:?}", opts.before);
    let t_before = Instant::now();
    let m_before = scrape(opts.addr).await;
    let ticks = crate::procstat::clock_ticks();
    let cpu = || attacks::cpu_secs(opts.server_pid, ticks);
    let c_before = cpu();
    sleep(opts.before).await;

    eprintln!(
        "chaos: flood of {} upgrades over {:?}",
        opts.attempts, opts.flood
    );
    let t_flood = Instant::now();
    let m_flood = scrape(opts.addr).await;
    let c_flood = cpu();
    let mut flood = flood(opts).await;
    flood.sessions_open_before = metric_sum(&m_flood, "voxgate_sessions_active", "");

    eprintln!(
        "chaos: slowloris, {} connections for {:?}",
        opts.slow, opts.slow_for
    );
    let t_slow = Instant::now();
    let m_slow = scrape(opts.addr).await;
    let c_slow = cpu();
    let slowloris = slowloris(opts).await;

    eprintln!("chaos: timeout checks (at most {:?})", opts.check_limit);
    let t_checks = Instant::now();
    let m_checks = scrape(opts.addr).await;
    let c_checks = cpu();
    let (a, b, c, d, e) = tokio::join!(
        check_never_initializes(opts.addr, XIAOZHI_PATH, opts.check_limit),
        check_never_initializes(opts.addr, REALTIME_PATH, opts.check_limit),
        check_stops_reading(opts.addr, opts.check_limit),
        check_dead_peer(opts.addr, XIAOZHI_PATH, opts.check_limit),
        check_dead_peer(opts.addr, REALTIME_PATH, opts.check_limit),
    );
    let (mut attacks, windows) = attacks::run_all(opts, flood.sessions_open_before).await;
    let _ = stop_tx.send(true);

    let mut recs = Vec::new();
    let mut connected = 0;
    for t in devices {
        let rec = t.await.unwrap_or_else(|e| failed_task(&e));
        connected += usize::from(rec.connected);
        recs.push(rec);
    }
    let mut probes_connected = 0;
    for t in probes {
        let rec = t.await.unwrap_or_else(|e| failed_task(&e));
        probes_connected += usize::from(rec.connected);
        recs.push(rec);
    }
    let m_end = scrape(opts.addr).await;

    let phase =
        |from: Instant, to: Instant, m0: &str, m1: &str, cpu: (Option<f64>, Option<f64>)| {
            PhaseReport {
                seconds: to.duration_since(from).as_secs_f64(),
                turn_ms: window(&recs, from, to, |r| &r.turn_latency),
                ping_ms: window(&recs, from, to, |r| &r.pings),
                late_frames: count(&recs, from, to, |r| &r.late_frames),
                late_sends: count(&recs, from, to, |r| &r.late_sends),
                server_dropped_uplink: dropped(m1, "uplink") - dropped(m0, "uplink"),
                server_dropped_downlink: dropped(m1, "downlink") - dropped(m0, "downlink"),
                server_cpu_secs: cpu.0.zip(cpu.1).map(|(a, b)| b - a),
            }
        };
    let mut errors = Vec::new();
    let mut session_errors = 0;
    for e in recs.iter().filter_map(|r| r.error.as_ref()) {
        session_errors += 1;
        if errors.len() < 10 && !errors.contains(e) {
            errors.push(e.clone());
        }
    }
    for (kind, w) in &windows {
        if let Some(common) = attacks.common_mut(*kind) {
            common.admitted = phase(w.from, w.to, &w.m0, &w.m1, (w.cpu0, w.cpu1));
        }
    }
    let refused_start = metric_by_label(&m_start, "voxgate_sessions_refused_total", "reason");
    let mut refused_by_reason = metric_by_label(&m_end, "voxgate_sessions_refused_total", "reason");
    for (reason, n) in &mut refused_by_reason {
        *n -= refused_start.get(reason).copied().unwrap_or(0.0);
    }
    Ok(ChaosReport {
        sessions: opts.sessions,
        connected,
        probes: opts.probes,
        probes_connected,
        session_errors,
        errors,
        turns: recs.iter().map(|r| r.turns).sum(),
        before: phase(t_before, t_flood, &m_before, &m_flood, (c_before, c_flood)),
        during_flood: phase(t_flood, t_slow, &m_flood, &m_slow, (c_flood, c_slow)),
        during_slowloris: phase(t_slow, t_checks, &m_slow, &m_checks, (c_slow, c_checks)),
        attacks,
        flood,
        slowloris,
        checks: vec![a, b, c, d, e],
        refused_by_reason,
        server_dropped_total: metric_sum(&m_end, "voxgate_dropped_frames_total", "")
            - metric_sum(&m_start, "voxgate_dropped_frames_total", ""),
        seconds: began.elapsed().as_secs_f64(),
    })
}

fn failed_task(e: &tokio::task::JoinError) -> Recorded {
    Recorded {
        error: Some(format!("task failed: {e}")),
        ..Recorded::default()
    }
}

fn is_loopback_v4(addr: SocketAddr) -> bool {
    matches!(addr, SocketAddr::V4(a) if a.ip().octets()[0] == 127)
}

/// The `i`th loopback source address: 127.0.0.2, 127.0.0.3, ... cycling over `sources`
/// (127.0.0.1 when `sources` is 0).
fn source(i: usize, sources: u8) -> Ipv4Addr {
    if sources == 0 {
        return Ipv4Addr::LOCALHOST;
    }
    let k = u8::try_from(i % usize::from(sources)).unwrap_or(0);
    Ipv4Addr::new(127, 0, 0, 2u8.saturating_add(k))
}

/// The latency samples of `field` taken in `[from, to)`.
fn window(
    recs: &[Recorded],
    from: Instant,
    to: Instant,
    field: impl Fn(&Recorded) -> &Vec<(Instant, Duration)>,
) -> Stats {
    Stats::of(
        recs.iter()
            .flat_map(|r| field(r).iter())
            .filter(|(at, _)| *at >= from && *at < to)
            .map(|(_, d)| d.as_secs_f64() * 1000.0)
            .collect(),
    )
}

/// How many events of `field` happened in `[from, to)`.
fn count(
    recs: &[Recorded],
    from: Instant,
    to: Instant,
    field: impl Fn(&Recorded) -> &Vec<Instant>,
) -> u64 {
    let n = recs
        .iter()
        .flat_map(|r| field(r).iter())
        .filter(|at| **at >= from && **at < to)
        .count();
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// The WAV as framed Opus packets, a second of silence after it so the server's VAD ends the
/// utterance, and which frames are voiced (the server's VAD may end a turn at any pause, so
/// the end of speech is the last voiced frame sent before the reply).
struct Speech {
    frames: Vec<Bytes>,
    voiced: Vec<bool>,
}

/// Which frames carry speech: RMS above a tenth of the loudest frame's.
pub(crate) fn voiced_frames(samples: &[f32], frame_len: usize) -> Vec<bool> {
    let rms: Vec<f32> = audio::frames(samples, frame_len)
        .iter()
        .map(|f| (f.iter().map(|s| s * s).sum::<f32>() / f.len().max(1) as f32).sqrt())
        .collect();
    let loudest = rms.iter().copied().fold(0.0f32, f32::max);
    rms.iter()
        .map(|r| loudest > 0.0 && *r > loudest / 10.0)
        .collect()
}

fn speech_frames(wav: &std::path::Path) -> anyhow::Result<Speech> {
    let codec = FrameCodec::new(ProtocolVersion::V1);
    let mut samples = audio::load_wav(wav, UPLINK_RATE)?;
    samples.extend(std::iter::repeat_n(0.0, UPLINK_RATE as usize));
    let voiced = voiced_frames(&samples, audio::frame_samples(UPLINK_RATE, UPLINK_FRAME));
    let mut frames = Vec::new();
    for packet in xiaozhi::encode_opus(&samples)? {
        let mut buf = Vec::new();
        codec
            .encode(&Frame::opus(&packet), &mut buf)
            .context("framing")?;
        frames.push(Bytes::from(buf));
    }
    if frames.len() != voiced.len() {
        bail!("{} Opus frames but {} analysed", frames.len(), voiced.len());
    }
    Ok(Speech { frames, voiced })
}

/// One admitted device: auto-mode turns until stopped, recording each turn's latency from the
/// end of its speech (the end of the last voiced frame's slot) to the first reply frame. The
/// first turn starts `offset` frames into the speech, so the devices' turns are spread over
/// time and every phase gets samples, however short.
async fn device(
    index: usize,
    offset: u64,
    addr: SocketAddr,
    speech: &Speech,
    mut stop: watch::Receiver<bool>,
    rec: &mut Recorded,
) -> anyhow::Result<()> {
    let version = ProtocolVersion::V1;
    let device_id = format!(
        "02:00:00:{:02x}:{:02x}:{:02x}",
        (index >> 16) & 0xff,
        (index >> 8) & 0xff,
        index & 0xff
    );
    let client_id = format!("0b0c0d0e-0000-4000-8000-{index:012}");
    let headers = xiaozhi::upgrade_headers(&device_id, &client_id, None, version);
    let url = format!("ws://{addr}{XIAOZHI_PATH}");
    let mut ws = ws::connect(&url, &headers, Duration::from_secs(10)).await?;
    ws.send(Message::Text(xiaozhi::hello(version, false).into()))
        .await?;
    let codec = FrameCodec::new(version);
    let mut session_id = String::new();
    let mut playback = Playback::new(Duration::from_millis(60), SLACK);
    let mut streaming: Option<(Pacing, u64)> = None;
    // When the current turn's speech ended, until its first reply frame.
    let mut speech_end: Option<Instant> = None;
    let hello_by = Instant::now() + Duration::from_secs(10);
    let len = u64::try_from(speech.frames.len()).unwrap_or(1).max(1);
    let mut first = offset;
    loop {
        let next = streaming.map(|(p, i)| p.due(i));
        tokio::select! {
            _ = stop.changed() => break,
            () = sleep_until(hello_by), if !rec.connected => bail!("no hello within 10 s"),
            () = sleep_until(next.unwrap_or(hello_by)), if next.is_some() => {
                let Some((pacing, i)) = streaming.as_mut() else { continue };
                let k = usize::try_from((*i + first) % len).unwrap_or(0);
                let frame = speech.frames[k].clone();
                let now = Instant::now();
                if pacing.lateness(*i, now) > SLACK {
                    rec.late_sends.push(now);
                }
                if speech.voiced[k] {
                    speech_end = Some(pacing.due(*i + 1));
                }
                ws.send(Message::Binary(frame)).await.context("sending audio")?;
                *i += 1;
            }
            msg = ws.next() => match msg {
                Some(Ok(Message::Binary(b))) => {
                    if codec.decode(&b).is_ok() {
                        let now = Instant::now();
                        // A reply that starts while the device is still speaking (the VAD
                        // ended the turn at a pause) has no end of speech to measure from.
                        if let Some(end) = speech_end.take()
                            && now > end
                        {
                            rec.turn_latency.push((now, now - end));
                        }
                        let late = playback.late;
                        playback.frame(now);
                        if playback.late > late {
                            rec.late_frames.push(now);
                        }
                    }
                }
                Some(Ok(Message::Text(t))) => match ServerMessage::from_slice(t.as_bytes()) {
                    Ok(ServerMessage::Hello(h)) => {
                        session_id = h.session_id;
                        let ms = u64::from(h.audio_params.frame_duration.max(1));
                        playback = Playback::new(Duration::from_millis(ms), SLACK);
                        rec.connected = true;
                        listen(&mut ws, &session_id).await?;
                        streaming = Some((Pacing::new(Instant::now(), UPLINK_FRAME), 0));
                    }
                    Ok(ServerMessage::Tts(tts)) => match tts.state {
                        TtsState::Start => streaming = None,
                        TtsState::Stop => {
                            playback.stop();
                            rec.turns += 1;
                            speech_end = None;
                            first = 0;
                            listen(&mut ws, &session_id).await?;
                            streaming = Some((Pacing::new(Instant::now(), UPLINK_FRAME), 0));
                        }
                        _ => {}
                    },
                    _ => {}
                },
                Some(Ok(Message::Close(f))) => bail!(
                    "server closed the session ({})",
                    f.map_or_else(|| "no code".to_owned(), |f| u16::from(f.code).to_string())
                ),
                None => bail!("connection lost"),
                Some(Err(e)) => return Err(e).context("receiving"),
                Some(Ok(_)) => {}
            }
        }
    }
    let _ = timeout(Duration::from_secs(2), ws.close(None)).await;
    Ok(())
}

async fn listen(ws: &mut ws::Ws, session_id: &str) -> anyhow::Result<()> {
    let mut msg = Listen::start(ListenMode::Auto);
    msg.session_id = Some(session_id.to_owned());
    ws.send(Message::Text(DeviceMessage::from(msg).to_json().into()))
        .await
        .context("sending listen")
}

/// The realtime initialization: 16 kHz in; `tts` asks for spoken replies at 48 kHz.
fn realtime_init(tts: bool) -> anyhow::Result<Bytes> {
    let input = AudioFormat::new(16_000, 1, SampleFormat::Signed16Bit).context("input format")?;
    let rate = if tts { 48_000 } else { 24_000 };
    let output = AudioFormat::new(rate, 1, SampleFormat::Signed16Bit).context("output format")?;
    let mut config = SessionConfig::new(input, output);
    if tts {
        config.tts = Some(TtsSettings::Hosted(HostedTtsSettings {
            voice: HostedVoice::Ref {
                voice_id: "default".into(),
            },
            mode: HostedTtsMode::LowLatency,
        }));
    }
    Ok(ServiceBoundMessage::initialize(&config)
        .context("initialize")?
        .to_frame())
}

/// One realtime session that pings every 100 ms until stopped, recording each round trip.
async fn probe(
    addr: SocketAddr,
    mut stop: watch::Receiver<bool>,
    rec: &mut Recorded,
) -> anyhow::Result<()> {
    let url = format!("ws://{addr}{REALTIME_PATH}");
    let mut ws = ws::connect(&url, &[], Duration::from_secs(10)).await?;
    ws.send(Message::Binary(realtime_init(false)?)).await?;
    let ping = ServiceBoundMessage::ping().to_frame();
    let ready_by = Instant::now() + Duration::from_secs(10);
    let mut next_ping = ready_by;
    let mut sent: VecDeque<Instant> = VecDeque::new();
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            () = sleep_until(ready_by), if !rec.connected => bail!("not ready within 10 s"),
            () = sleep_until(next_ping), if rec.connected => {
                next_ping += PING_EVERY;
                // A server that stops answering must not grow this without bound.
                if sent.len() < 100 {
                    sent.push_back(Instant::now());
                    ws.send(Message::Binary(ping.clone())).await.context("sending ping")?;
                }
            }
            msg = ws.next() => match msg {
                Some(Ok(Message::Binary(b))) => match ClientBoundMessage::decode_frame(b).map(|m| m.payload) {
                    Ok(Some(Down::SessionReady(_))) => {
                        rec.connected = true;
                        next_ping = Instant::now();
                    }
                    Ok(Some(Down::Pong(_))) => {
                        let now = Instant::now();
                        if let Some(at) = sent.pop_front() {
                            rec.pings.push((now, now.duration_since(at)));
                        }
                    }
                    _ => {}
                },
                Some(Ok(Message::Close(f))) => bail!(
                    "server closed the session ({})",
                    f.map_or_else(|| "no code".to_owned(), |f| u16::from(f.code).to_string())
                ),
                None => bail!("connection lost"),
                Some(Err(e)) => return Err(e).context("receiving"),
                Some(Ok(_)) => {}
            }
        }
    }
    let _ = timeout(Duration::from_secs(2), ws.close(None)).await;
    Ok(())
}

// ---- raw HTTP and WebSocket framing, so misbehaving peers can be played exactly ----

/// The upgrade request a flood or slowloris connection sends.
fn upgrade_request(addr: SocketAddr, path: &str, index: usize) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {WS_KEY}\r\nSec-WebSocket-Version: 13\r\nProtocol-Version: 1\r\n\
         Device-Id: 02:01:00:{:02x}:{:02x}:{:02x}\r\n\
         Client-Id: 0b0c0d0e-0000-4000-8001-{index:012}\r\n\r\n",
        (index >> 16) & 0xff,
        (index >> 8) & 0xff,
        index & 0xff
    )
}

/// A parsed response head: the status and whether `Retry-After` was present.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Head {
    status: u16,
    retry_after: bool,
}

/// Parses an HTTP/1.x response head (up to the blank line).
fn parse_head(head: &[u8]) -> Option<Head> {
    let text = std::str::from_utf8(head).ok()?;
    let mut lines = text.split("\r\n");
    let status = lines
        .next()?
        .strip_prefix("HTTP/1.")?
        .get(2..)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let retry_after = lines.any(|l| {
        l.split_once(':')
            .is_some_and(|(k, _)| k.trim().eq_ignore_ascii_case("retry-after"))
    });
    Some(Head {
        status,
        retry_after,
    })
}

/// Where the response head ends (just past `\r\n\r\n`), if it has.
fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// A TCP connection to `addr` from `src` (port chosen by the system), with an optional small
/// receive buffer.
async fn connect_from(
    addr: SocketAddr,
    src: Ipv4Addr,
    rcvbuf: Option<u32>,
) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    if let Some(size) = rcvbuf {
        socket.set_recv_buffer_size(size)?;
    }
    socket.bind(SocketAddr::V4(SocketAddrV4::new(src, 0)))?;
    socket.connect(addr).await
}

/// An upgrade sent and its response head read.
struct Upgraded {
    stream: TcpStream,
    head: Head,
    /// Bytes read past the head (the first WebSocket frames).
    rest: Vec<u8>,
}

/// Why an attempt got no response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AttemptError {
    Connect,
    Reset,
    Closed,
    Timeout,
    BadResponse,
}

impl AttemptError {
    fn name(self) -> &'static str {
        match self {
            Self::Connect => "connect failed",
            Self::Reset => "reset",
            Self::Closed => "closed without a response",
            Self::Timeout => "timed out",
            Self::BadResponse => "bad response",
        }
    }
}

/// Opens a connection, sends an upgrade for `path` and reads the response head.
async fn upgrade(
    addr: SocketAddr,
    src: Ipv4Addr,
    path: &str,
    index: usize,
    rcvbuf: Option<u32>,
) -> Result<Upgraded, AttemptError> {
    let mut stream = connect_from(addr, src, rcvbuf)
        .await
        .map_err(|_| AttemptError::Connect)?;
    stream
        .write_all(upgrade_request(addr, path, index).as_bytes())
        .await
        .map_err(|_| AttemptError::Reset)?;
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 2048];
    loop {
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|_| AttemptError::Reset)?;
        if n == 0 {
            return Err(AttemptError::Closed);
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = head_end(&buf) {
            let head = parse_head(&buf[..end]).ok_or(AttemptError::BadResponse)?;
            return Ok(Upgraded {
                stream,
                head,
                rest: buf.split_off(end),
            });
        }
        if buf.len() > MAX_HEAD {
            return Err(AttemptError::BadResponse);
        }
    }
}

/// A masked client frame (FIN set) with `opcode` (1 text, 2 binary, 8 close, 10 pong).
fn client_frame(opcode: u8, payload: &[u8], mask: [u8; 4]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 14);
    out.push(0x80 | (opcode & 0x0f));
    let len = payload.len();
    if len < 126 {
        out.push(0x80 | u8::try_from(len).unwrap_or(0));
    } else if let Ok(len) = u16::try_from(len) {
        out.push(0x80 | 126);
        out.extend_from_slice(&len.to_be_bytes());
    } else {
        out.push(0x80 | 127);
        out.extend_from_slice(&u64::try_from(len).unwrap_or(u64::MAX).to_be_bytes());
    }
    out.extend_from_slice(&mask);
    out.extend(payload.iter().zip(mask.iter().cycle()).map(|(b, m)| b ^ m));
    out
}

/// One WebSocket frame as read: its opcode and unmasked payload.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RawFrame {
    opcode: u8,
    payload: Vec<u8>,
}

impl RawFrame {
    /// A close frame's code, if it is one and has a code.
    fn close_code(&self) -> Option<u16> {
        (self.opcode == 8)
            .then(|| self.payload.get(..2))
            .flatten()
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
}

/// Takes every complete frame off the front of `buf` (masked or not), leaving a partial one.
fn take_frames(buf: &mut Vec<u8>) -> Vec<RawFrame> {
    let mut frames = Vec::new();
    let mut at = 0;
    while let Some(&[b0, b1]) = buf.get(at..at + 2) {
        let masked = b1 & 0x80 != 0;
        let (len, mut pos) = match b1 & 0x7f {
            126 => match buf.get(at + 2..at + 4) {
                Some(b) => (u64::from(u16::from_be_bytes([b[0], b[1]])), at + 4),
                None => break,
            },
            127 => match buf
                .get(at + 2..at + 10)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
            {
                Some(b) => (u64::from_be_bytes(b), at + 10),
                None => break,
            },
            n => (u64::from(n), at + 2),
        };
        let mask = if masked {
            let Some(m) = buf.get(pos..pos + 4) else {
                break;
            };
            pos += 4;
            Some([m[0], m[1], m[2], m[3]])
        } else {
            None
        };
        let Some(end) = usize::try_from(len).ok().and_then(|l| pos.checked_add(l)) else {
            break;
        };
        let Some(payload) = buf.get(pos..end) else {
            break;
        };
        let payload = match mask {
            Some(m) => payload
                .iter()
                .zip(m.iter().cycle())
                .map(|(b, k)| b ^ k)
                .collect(),
            None => payload.to_vec(),
        };
        frames.push(RawFrame {
            opcode: b0 & 0x0f,
            payload,
        });
        at = end;
    }
    buf.drain(..at);
    frames
}

// ---- the flood ----

/// What one flood attempt saw.
struct Attempt {
    result: Result<Head, AttemptError>,
    latency: Duration,
    late_start: bool,
}

async fn flood(opts: &ChaosOptions) -> FloodReport {
    let start = Instant::now();
    let limit = Arc::new(Semaphore::new(opts.concurrency.max(1)));
    let (done_tx, done) = watch::channel(false);
    let held = Arc::new(Semaphore::new(MAX_HELD));
    let interval = opts.flood / u32::try_from(opts.attempts.max(1)).unwrap_or(u32::MAX);
    let mut tasks = Vec::with_capacity(opts.attempts);
    // The whole flood is bounded: its spread, plus one attempt's timeout.
    let deadline = start + opts.flood + ATTEMPT_TIMEOUT + Duration::from_secs(5);
    for i in 0..opts.attempts {
        let due = start + interval * u32::try_from(i).unwrap_or(u32::MAX);
        sleep_until(due).await;
        let Ok(Ok(permit)) = timeout(
            deadline.saturating_duration_since(Instant::now()),
            Arc::clone(&limit).acquire_owned(),
        )
        .await
        else {
            break;
        };
        let late_start = Instant::now().saturating_duration_since(due) > START_SLACK;
        let (addr, src) = (opts.addr, source(i, opts.sources));
        let (done, held) = (done.clone(), Arc::clone(&held));
        tasks.push(tokio::spawn(async move {
            let t0 = Instant::now();
            let result = timeout(ATTEMPT_TIMEOUT, upgrade(addr, src, XIAOZHI_PATH, i, None))
                .await
                .unwrap_or(Err(AttemptError::Timeout));
            let latency = t0.elapsed();
            drop(permit);
            let result = match result {
                Ok(up) => {
                    let head = up.head;
                    if head.status == 101
                        && let Ok(slot) = held.try_acquire_owned()
                    {
                        tokio::spawn(async move {
                            hold(up, done).await;
                            drop(slot);
                        });
                    }
                    Ok(head)
                }
                Err(e) => Err(e),
            };
            Attempt {
                result,
                latency,
                late_start,
            }
        }));
    }
    let mut report = FloodReport::default();
    let mut refusals = Vec::new();
    let mut admitted = Vec::new();
    for t in tasks {
        let Ok(a) = t.await else {
            *report.errors.entry("task failed".into()).or_default() += 1;
            continue;
        };
        report.attempts += 1;
        report.late_starts += u64::from(a.late_start);
        let ms = a.latency.as_secs_f64() * 1000.0;
        match a.result {
            Ok(head) => {
                *report.by_status.entry(head.status).or_default() += 1;
                if head.status == 101 {
                    report.admitted += 1;
                    admitted.push(ms);
                } else {
                    refusals.push(ms);
                    report.retry_after += u64::from(head.retry_after);
                }
            }
            Err(e) => *report.errors.entry(e.name().into()).or_default() += 1,
        }
    }
    report.seconds = start.elapsed().as_secs_f64();
    report.refusal_ms = Stats::of(refusals);
    report.admitted_ms = Stats::of(admitted);
    // The held sessions end with the flood, freeing their slots.
    let _ = done_tx.send(true);
    sleep(Duration::from_millis(500)).await;
    report
}

/// Keeps an admitted flood connection alive as a device (hello sent, pings answered) until
/// the flood ends, so its session slot stays taken.
async fn hold(up: Upgraded, mut done: watch::Receiver<bool>) {
    let mut ws = WebSocketStream::from_partially_read(up.stream, up.rest, Role::Client, None).await;
    let hello = xiaozhi::hello(ProtocolVersion::V1, false);
    if ws.send(Message::Text(hello.into())).await.is_err() {
        return;
    }
    let until = Instant::now() + ATTEMPT_TIMEOUT * 6;
    loop {
        tokio::select! {
            _ = done.changed() => break,
            () = sleep_until(until) => break,
            msg = ws.next() => if !matches!(msg, Some(Ok(_))) { return },
        }
    }
    let _ = timeout(Duration::from_secs(1), ws.close(None)).await;
}

// ---- slowloris ----

/// What one slow connection saw: whether it opened, when the server closed it, bytes sent.
#[derive(Debug, Clone, Copy, Default)]
struct Slow {
    opened: bool,
    closed_after: Option<Duration>,
    sent: u64,
}

async fn slowloris(opts: &ChaosOptions) -> SlowReport {
    let mut report = SlowReport {
        drip: opts.slow / 2,
        silent: opts.slow - opts.slow / 2,
        ..SlowReport::default()
    };
    let (fds, rss) = server_resources(opts.server_pid);
    report.server_fds_before = fds;
    report.server_rss_kb_before = rss;
    let (stop_tx, stop) = watch::channel(false);
    let mut tasks = Vec::with_capacity(opts.slow);
    for i in 0..opts.slow {
        let (addr, src, stop) = (opts.addr, source(i, opts.sources), stop.clone());
        let request = (i < report.drip).then(|| upgrade_request(addr, XIAOZHI_PATH, 100_000 + i));
        let drip = opts.drip;
        tasks.push(tokio::spawn(async move {
            slow_connection(addr, src, request, drip, stop).await
        }));
    }
    // Let every connection open, then see whether a real device still gets in.
    sleep(Duration::from_secs(1).min(opts.slow_for / 2)).await;
    let t0 = Instant::now();
    match timeout(Duration::from_secs(10), fresh_session(opts.addr)).await {
        Ok(Ok(())) => report.fresh_session_ms = Some(t0.elapsed().as_secs_f64() * 1000.0),
        Ok(Err(e)) => report.fresh_session_error = Some(format!("{e:#}")),
        Err(_) => report.fresh_session_error = Some("no hello within 10 s".into()),
    }
    let (fds, rss) = server_resources(opts.server_pid);
    report.server_fds_during = fds;
    report.server_rss_kb_during = rss;
    let rest = opts
        .slow_for
        .saturating_sub(t0.elapsed() + Duration::from_secs(1));
    sleep(rest).await;
    let _ = stop_tx.send(true);
    let mut closes = Vec::new();
    for t in tasks {
        let s = t.await.unwrap_or_default();
        report.bytes_dripped += s.sent;
        if !s.opened {
            report.open_failed += 1;
        }
        if let Some(d) = s.closed_after {
            report.closed_by_server += 1;
            closes.push(d.as_secs_f64());
        }
    }
    closes.sort_by(f64::total_cmp);
    report.first_close_secs = closes.first().copied();
    report.last_close_secs = closes.last().copied();
    sleep(Duration::from_millis(500)).await;
    report.server_fds_after = server_resources(opts.server_pid).0;
    report
}

/// A connection that sends `request` one byte per `drip` (or nothing), until the server
/// closes it or `stop`.
async fn slow_connection(
    addr: SocketAddr,
    src: Ipv4Addr,
    request: Option<String>,
    drip: Duration,
    mut stop: watch::Receiver<bool>,
) -> Slow {
    let mut slow = Slow::default();
    let Ok(Ok(stream)) = timeout(Duration::from_secs(5), connect_from(addr, src, None)).await
    else {
        return slow;
    };
    slow.opened = true;
    let opened = Instant::now();
    let (mut rd, mut wr) = stream.into_split();
    let bytes = request.unwrap_or_default().into_bytes();
    let mut next = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        let more = usize::try_from(slow.sent).unwrap_or(usize::MAX) < bytes.len();
        tokio::select! {
            _ = stop.changed() => break,
            r = rd.read(&mut buf) => {
                // Anything but data (a 408, say, is data) ends it: the server closed.
                if !matches!(r, Ok(n) if n > 0) {
                    slow.closed_after = Some(opened.elapsed());
                    break;
                }
            }
            () = sleep_until(next), if more => {
                let i = usize::try_from(slow.sent).unwrap_or(0);
                if wr.write_all(&bytes[i..=i]).await.is_err() {
                    slow.closed_after = Some(opened.elapsed());
                    break;
                }
                slow.sent += 1;
                next += drip;
            }
        }
    }
    slow
}

/// A real device connects and is greeted.
async fn fresh_session(addr: SocketAddr) -> anyhow::Result<()> {
    let version = ProtocolVersion::V1;
    let headers = xiaozhi::upgrade_headers(
        "02:02:00:00:00:01",
        "0b0c0d0e-0000-4000-8002-000000000001",
        None,
        version,
    );
    let url = format!("ws://{addr}{XIAOZHI_PATH}");
    let mut ws = ws::connect(&url, &headers, Duration::from_secs(10)).await?;
    ws.send(Message::Text(xiaozhi::hello(version, false).into()))
        .await?;
    while let Some(msg) = ws.next().await {
        if let Message::Text(t) = msg?
            && let Ok(ServerMessage::Hello(_)) = ServerMessage::from_slice(t.as_bytes())
        {
            let _ = ws.close(None).await;
            return Ok(());
        }
    }
    bail!("closed before the hello")
}

/// The server's open files and resident memory (KB), from Linux `/proc`.
fn server_resources(pid: Option<u32>) -> (Option<u64>, Option<u64>) {
    let Some(pid) = pid else {
        return (None, None);
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()
        .map(|d| u64::try_from(d.count()).unwrap_or(u64::MAX));
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
        });
    (fds, rss)
}

// ---- timeout checks ----

/// Reads raw frames until the server closes or `limit` passes from `since`; never answers a
/// ping. Fills in when it closed (relative to `since`), the close code and pings seen.
async fn watch_close(
    stream: &mut TcpStream,
    mut buf: Vec<u8>,
    since: Instant,
    limit: Duration,
    check: &mut CheckReport,
) {
    let mut chunk = [0u8; 4096];
    let until = since + limit;
    loop {
        for f in take_frames(&mut buf) {
            match f.opcode {
                9 => check.pings += 1,
                8 => check.close_code = f.close_code().or(check.close_code),
                _ => {}
            }
        }
        match timeout(
            until.saturating_duration_since(Instant::now()),
            stream.read(&mut chunk),
        )
        .await
        {
            Err(_) => {
                check.detail = format!("still open after {limit:?}");
                return;
            }
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            Ok(r) => {
                check.closed_after_secs = Some(since.elapsed().as_secs_f64());
                check.detail = match (r, check.close_code) {
                    (Err(e), _) => format!("connection error: {e}"),
                    (Ok(_), Some(_)) => "close frame, then TCP close".into(),
                    (Ok(_), None) => "TCP close without a close frame".into(),
                };
                return;
            }
        }
    }
}

/// An upgraded connection that never initializes: when does the server close it?
async fn check_never_initializes(addr: SocketAddr, path: &str, limit: Duration) -> CheckReport {
    let door = if path == XIAOZHI_PATH {
        "xiaozhi"
    } else {
        "realtime"
    };
    let mut check = CheckReport {
        name: format!("never initializes ({door})"),
        ..CheckReport::default()
    };
    match timeout(
        ATTEMPT_TIMEOUT,
        upgrade(addr, Ipv4Addr::LOCALHOST, path, 200_001, None),
    )
    .await
    {
        Ok(Ok(mut up)) if up.head.status == 101 => {
            let since = Instant::now();
            watch_close(&mut up.stream, up.rest, since, limit, &mut check).await;
        }
        Ok(Ok(up)) => check.error = Some(format!("upgrade answered {}", up.head.status)),
        Ok(Err(e)) => check.error = Some(e.name().into()),
        Err(_) => check.error = Some("upgrade timed out".into()),
    }
    check
}

/// A peer that initializes (a Xiaozhi hello, or a realtime initialization) and then goes
/// silent: no frames, no pongs.
async fn check_dead_peer(addr: SocketAddr, path: &str, limit: Duration) -> CheckReport {
    let door = if path == XIAOZHI_PATH {
        "xiaozhi"
    } else {
        "realtime"
    };
    let mut check = CheckReport {
        name: format!("dead peer, no pongs ({door})"),
        ..CheckReport::default()
    };
    let init = if path == XIAOZHI_PATH {
        client_frame(
            1,
            xiaozhi::hello(ProtocolVersion::V1, false).as_bytes(),
            [7, 1, 3, 9],
        )
    } else {
        match realtime_init(false) {
            Ok(frame) => client_frame(2, &frame, [7, 1, 3, 9]),
            Err(e) => {
                check.error = Some(format!("{e:#}"));
                return check;
            }
        }
    };
    match timeout(
        ATTEMPT_TIMEOUT,
        upgrade(addr, Ipv4Addr::LOCALHOST, path, 200_002, None),
    )
    .await
    {
        Ok(Ok(mut up)) if up.head.status == 101 => {
            if let Err(e) = up.stream.write_all(&init).await {
                check.error = Some(format!("initializing: {e}"));
                return check;
            }
            let since = Instant::now();
            watch_close(&mut up.stream, up.rest, since, limit, &mut check).await;
        }
        Ok(Ok(up)) => check.error = Some(format!("upgrade answered {}", up.head.status)),
        Ok(Err(e)) => check.error = Some(e.name().into()),
        Err(_) => check.error = Some("upgrade timed out".into()),
    }
    check
}

/// A realtime session that asks for spoken replies and then never reads again, while it keeps
/// asking for more (a text turn every 250 ms): when does the server give up on it? The close
/// is seen as the first write that fails.
async fn check_stops_reading(addr: SocketAddr, limit: Duration) -> CheckReport {
    let mut check = CheckReport {
        name: "stops reading (realtime)".into(),
        ..CheckReport::default()
    };
    if let Err(e) = stops_reading(addr, limit, &mut check).await {
        check.error = Some(format!("{e:#}"));
    }
    check
}

async fn stops_reading(
    addr: SocketAddr,
    limit: Duration,
    check: &mut CheckReport,
) -> anyhow::Result<()> {
    let mut up = match timeout(
        ATTEMPT_TIMEOUT,
        upgrade(
            addr,
            Ipv4Addr::LOCALHOST,
            REALTIME_PATH,
            200_003,
            Some(SMALL_RCVBUF),
        ),
    )
    .await
    {
        Ok(Ok(up)) if up.head.status == 101 => up,
        Ok(Ok(up)) => bail!("upgrade answered {}", up.head.status),
        Ok(Err(e)) => bail!("{}", e.name()),
        Err(_) => bail!("upgrade timed out"),
    };
    let mask = [3, 5, 7, 11];
    up.stream
        .write_all(&client_frame(2, &realtime_init(true)?, mask))
        .await?;
    // Wait for SessionReady (the first binary frame), reading for the last time.
    let mut buf = up.rest;
    let mut chunk = [0u8; 4096];
    let ready_by = Instant::now() + ATTEMPT_TIMEOUT;
    'ready: loop {
        for f in take_frames(&mut buf) {
            if f.opcode == 2 {
                break 'ready;
            }
            if f.opcode == 8 {
                bail!("closed before session ready");
            }
        }
        let n = timeout(
            ready_by.saturating_duration_since(Instant::now()),
            up.stream.read(&mut chunk),
        )
        .await
        .context("session ready")??;
        if n == 0 {
            bail!("closed before session ready");
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let since = Instant::now();
    let until = since + limit;
    let mut packet = 0u64;
    while Instant::now() < until {
        packet += 1;
        let turn = ServiceBoundMessage::user_text(
            packet,
            InferenceTriggerMode::Immediate,
            "Please tell me a long story about the sea, the wind and the lighthouse keeper.",
        )
        .to_frame();
        match timeout(
            Duration::from_secs(1),
            up.stream.write_all(&client_frame(2, &turn, mask)),
        )
        .await
        {
            // The server stopped reading us too (or our buffer is full): try again later.
            Err(_) => {}
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                check.closed_after_secs = Some(since.elapsed().as_secs_f64());
                check.detail = format!("a write failed ({})", e.kind());
                return Ok(());
            }
        }
        sleep(Duration::from_millis(250)).await;
    }
    check.detail = format!("still open after {limit:?}");
    Ok(())
}

// ---- /metrics ----

/// The server's `/metrics` text (empty when it cannot be read).
async fn scrape(addr: SocketAddr) -> String {
    let fetch = async {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(
            format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
        let mut body = Vec::new();
        s.read_to_end(&mut body).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&body).into_owned())
    };
    timeout(Duration::from_secs(5), fetch)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default()
}

/// The samples of `name` whose line contains `labels` (empty: all), summed.
fn metric_sum(text: &str, name: &str, labels: &str) -> f64 {
    samples(text, name)
        .filter(|(l, _)| l.contains(labels))
        .map(|(_, v)| v)
        .sum()
}

fn dropped(text: &str, direction: &str) -> f64 {
    metric_sum(
        text,
        "voxgate_dropped_frames_total",
        &format!("direction=\"{direction}\""),
    )
}

/// The samples of `name` summed by the value of `label`.
fn metric_by_label(text: &str, name: &str, label: &str) -> BTreeMap<String, f64> {
    let key = format!("{label}=\"");
    let mut out = BTreeMap::new();
    for (labels, v) in samples(text, name) {
        let value = labels
            .split_once(&key)
            .and_then(|(_, r)| r.split_once('"'))
            .map_or("", |(v, _)| v);
        *out.entry(value.to_owned()).or_insert(0.0) += v;
    }
    out
}

/// Every sample of `name`: its label text (`{...}` or empty) and value.
fn samples<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = (&'a str, f64)> + 'a {
    text.lines().filter_map(move |l| {
        if l.starts_with('#') {
            return None;
        }
        let rest = l.strip_prefix(name)?;
        let (labels, value) = if rest.starts_with('{') {
            let close = rest.find('}')?;
            (&rest[..=close], &rest[close + 1..])
        } else if rest.starts_with(' ') {
            ("", rest)
        } else {
            return None;
        };
        Some((labels, value.split_whitespace().next()?.parse().ok()?))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let s = Stats::of((1..=100).map(f64::from).rev().collect());
        assert_eq!((s.n, s.p50, s.p99, s.max), (100, 50.0, 99.0, 100.0));
        let one = Stats::of(vec![7.0]);
        assert_eq!((one.p50, one.p99, one.max), (7.0, 7.0, 7.0));
        assert_eq!(Stats::of(Vec::new()), Stats::default());
    }

    #[test]
    fn response_heads_are_parsed() {
        let raw =
            b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\ncontent-length: 0\r\n\r\nxx";
        let end = head_end(raw).unwrap();
        assert_eq!(&raw[end..], b"xx");
        assert_eq!(
            parse_head(&raw[..end]),
            Some(Head {
                status: 503,
                retry_after: true
            })
        );
        let ok = b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\r\n";
        assert_eq!(
            parse_head(ok),
            Some(Head {
                status: 101,
                retry_after: false
            })
        );
        assert_eq!(parse_head(b"SSH-2.0-x\r\n\r\n"), None);
        assert_eq!(head_end(b"HTTP/1.1 200 OK\r\n"), None);
    }

    #[test]
    fn the_upgrade_request_is_complete() {
        let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let r = upgrade_request(addr, XIAOZHI_PATH, 0x01_02_03);
        assert!(r.starts_with("GET /xiaozhi/v1/ HTTP/1.1\r\nHost: 127.0.0.1:9\r\n"));
        assert!(r.contains("Device-Id: 02:01:00:01:02:03\r\n"));
        assert!(r.contains("Sec-WebSocket-Version: 13\r\n"));
        assert!(r.ends_with("\r\n\r\n"));
        assert_eq!(head_end(r.as_bytes()), Some(r.len()));
    }

    #[test]
    fn frames_round_trip_masked_and_in_pieces() {
        let big = vec![0xabu8; 70_000];
        let mut buf = client_frame(1, b"hello", [1, 2, 3, 4]);
        buf.extend(client_frame(2, &[5u8; 300], [9, 9, 9, 9]));
        buf.extend(client_frame(2, &big, [0, 1, 0, 1]));
        // An unmasked server close frame, code 1008, split across reads.
        let close = [0x88, 0x04, 0x03, 0xf0, b'n', b'o'];
        buf.extend_from_slice(&close[..3]);
        let frames = take_frames(&mut buf);
        assert_eq!(frames.len(), 3);
        assert_eq!(frames[0].payload, b"hello");
        assert_eq!((frames[1].opcode, frames[1].payload.len()), (2, 300));
        assert_eq!(frames[2].payload, big);
        assert_eq!(buf, close[..3]);
        buf.extend_from_slice(&close[3..]);
        let frames = take_frames(&mut buf);
        assert_eq!(frames[0].close_code(), Some(1008));
        assert!(buf.is_empty());
        let ping = RawFrame {
            opcode: 9,
            payload: vec![1, 2],
        };
        assert_eq!(ping.close_code(), None);
    }

    #[test]
    fn voiced_frames_follow_the_energy() {
        let mut samples = vec![0.0f32; 10];
        samples.extend(std::iter::repeat_n(0.5, 10));
        samples.extend(std::iter::repeat_n(0.01, 10));
        samples.extend(std::iter::repeat_n(-0.3, 5));
        assert_eq!(voiced_frames(&samples, 10), [false, true, false, true]);
        assert_eq!(voiced_frames(&[0.0; 20], 10), [false, false]);
    }

    #[test]
    fn sources_stay_on_loopback() {
        assert_eq!(source(0, 0), Ipv4Addr::LOCALHOST);
        assert_eq!(source(0, 4), Ipv4Addr::new(127, 0, 0, 2));
        assert_eq!(source(5, 4), Ipv4Addr::new(127, 0, 0, 3));
        assert_eq!(source(254, 255), Ipv4Addr::new(127, 0, 0, 255));
        assert!(is_loopback_v4("127.3.2.1:80".parse().unwrap()));
        assert!(!is_loopback_v4("10.0.0.1:80".parse().unwrap()));
        assert!(!is_loopback_v4("[::1]:80".parse().unwrap()));
    }

    #[test]
    fn metrics_are_read_by_label() {
        let text = "# TYPE voxgate_sessions_refused_total counter\n\
            voxgate_sessions_refused_total{door=\"xiaozhi\",reason=\"capacity\"} 40\n\
            voxgate_sessions_refused_total{door=\"realtime\",reason=\"capacity\"} 2\n\
            voxgate_sessions_refused_total{door=\"xiaozhi\",reason=\"per_ip\"} 3\n\
            voxgate_sessions_refused_total_other 9\n\
            voxgate_dropped_frames_total{door=\"xiaozhi\",direction=\"uplink\"} 5\n\
            voxgate_sessions_active 7\n";
        let by = metric_by_label(text, "voxgate_sessions_refused_total", "reason");
        assert_eq!(by.get("capacity"), Some(&42.0));
        assert_eq!(by.get("per_ip"), Some(&3.0));
        assert_eq!(by.len(), 2);
        assert_eq!(dropped(text, "uplink"), 5.0);
        assert_eq!(dropped(text, "downlink"), 0.0);
        assert_eq!(metric_sum(text, "voxgate_sessions_active", ""), 7.0);
    }

    #[test]
    fn phases_take_only_their_samples() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let rec = Recorded {
            pings: vec![
                (at(0), Duration::from_millis(1)),
                (at(10), Duration::from_millis(2)),
                (at(20), Duration::from_millis(30)),
            ],
            late_frames: vec![at(5), at(25)],
            ..Recorded::default()
        };
        let recs = [rec];
        let s = window(&recs, at(0), at(20), |r| &r.pings);
        assert_eq!((s.n, s.max), (2, 2.0));
        assert_eq!(count(&recs, at(20), at(30), |r| &r.late_frames), 1);
    }
}
