//! Load test of the Xiaozhi door: N concurrent device sessions against the real server
//! (release builds), each turn a real ASR → LLM → TTS round trip through zero-delay (or
//! delayed) OpenAI-compatible fakes served from this process; one run per size in
//! `--sessions 35,75,500`, each on a fresh server, then one table: server CPU, RSS and threads,
//! turns done, end of speech → `tts start` and → first audio, cut and unanswered bursts, and
//! what the load generator itself cost (docs/performance.md#xiaozhi-load). With `--realtime`,
//! N realtime sessions (16 kHz PCM at real time, spoken replies) over WebSocket and then over
//! gRPC, each on a fresh server (docs/performance.md#realtime-over-grpc). With `--webrtc`, N
//! concurrent WebRTC sessions on the VIP door instead (docs/webrtc.md#load), reporting late RTP
//! packets and how busy the whole machine was at its busiest.
//!
//! The server runs on `127.0.0.1` with a free port, its `[asr]`, `[llm]` and `[tts]` pointed
//! at the fakes (`voxgate_test_support::fake_providers`: a fixed transcript, a fixed 8-chunk
//! sentence, 1.0 s of 24 kHz speech); `voxgate-client load xiaozhi` opens the sessions from one
//! process, each streaming a spoken question and 2 s of silence as real Opus at real time and
//! listening again after each answer. The server's CPU time (`/proc/PID/stat` utime+stime),
//! RSS (`/proc/PID/status` VmRSS) and threads are sampled every 250 ms; the figures are taken
//! over the window in which every session is up (after the ramp, before the first session
//! stops starting bursts).

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;
use voxgate_test_support::fake_providers::{FakeDelays, FakeProviders};

use crate::util;

/// Options of `cargo xtask load`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Concurrent device sessions; a comma-separated list runs once per size, each on a fresh
    /// server, and prints one table.
    #[arg(long, value_delimiter = ',', default_value = "200")]
    sessions: Vec<usize>,
    /// Seconds during which the sessions start bursts (the bursts in flight then finish).
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Seconds over which the sessions start.
    #[arg(long, default_value_t = 10.0)]
    ramp: f64,
    /// Speculative generation at pauses on the Xiaozhi door (its `speculate` key, through
    /// `VOXGATE_XIAOZHI_ENGINE_SPECULATE`); off unless given.
    #[arg(long)]
    speculate: bool,
    /// The Xiaozhi door's endpoint delay, ms (its `endpoint_delay_ms`, through
    /// `VOXGATE_XIAOZHI_ENGINE_ENDPOINT_DELAY_MS`); default: the door's own (100).
    #[arg(long, value_name = "MS")]
    endpoint_delay_ms: Option<u64>,
    /// The load generator's runtime threads.
    #[arg(long, default_value_t = 1)]
    client_threads: u16,
    /// WebRTC sessions on the VIP door (`voxgate-client load webrtc`) instead of Xiaozhi
    /// devices: each streams the WAV once and hears the reply (`--seconds` is not used).
    #[arg(long)]
    webrtc: bool,
    /// Realtime sessions (`voxgate-client load realtime`: 16 kHz PCM at real time, spoken
    /// replies) instead of Xiaozhi devices, each size run twice on fresh servers: over
    /// WebSocket, then over gRPC.
    #[arg(long, conflicts_with = "webrtc")]
    realtime: bool,
    /// What `cargo xtask soak` shares.
    #[command(flatten)]
    pub(crate) run: RunArgs,
}

/// The options `cargo xtask load` and `cargo xtask soak` share: the fakes, the binaries, the
/// pinning and the client's patience.
#[derive(clap::Args)]
pub(crate) struct RunArgs {
    /// Speech to stream (default: the client's built-in question for Xiaozhi, the audio
    /// crate's speech fixture for WebRTC).
    #[arg(long)]
    pub(crate) wav: Option<PathBuf>,
    /// The fake recognizer's delay before it answers, ms.
    #[arg(long, default_value_t = 0)]
    pub(crate) asr_delay_ms: u64,
    /// The fake model's delay before its first token, ms.
    #[arg(long, default_value_t = 0)]
    pub(crate) llm_delay_ms: u64,
    /// The fake synthesizer's delay before its first audio byte, ms.
    #[arg(long, default_value_t = 0)]
    pub(crate) tts_delay_ms: u64,
    /// Seconds after a burst without an answer before the client counts it unanswered.
    #[arg(long, default_value_t = 10.0)]
    pub(crate) answer_timeout: f64,
    /// Pin the server to these CPUs (`taskset -c` syntax: `0`, `0,1`, `2-3`).
    #[arg(long, value_name = "CPUS")]
    pub(crate) server_cpus: Option<String>,
    /// Pin the load generator to these CPUs.
    #[arg(long, value_name = "CPUS")]
    pub(crate) client_cpus: Option<String>,
    /// Use the release binaries already built (skip `cargo build --release`).
    #[arg(long)]
    pub(crate) no_build: bool,
    /// Measure this server binary instead of the workspace's release build (implies nothing is
    /// built for it).
    #[arg(long)]
    pub(crate) server_bin: Option<PathBuf>,
    /// Use this client binary instead of the workspace's release build.
    #[arg(long)]
    pub(crate) client_bin: Option<PathBuf>,
    /// The server's Opus backend: `libopus` (the default build's, compiled with the `cc`
    /// crate) or `pure` (opus-rs). Chosen at run time, so one build measures both.
    #[arg(long, value_parser = ["libopus", "pure"], default_value = "libopus")]
    pub(crate) opus: String,
}

/// Goals from the issue.
const CPU_GOAL_PERCENT: f64 = 1.0;
const MEMORY_GOAL_KB: f64 = 200.0;
/// The server's own share of a turn, p99 (issue goal): decision to first audio frame.
const SERVER_ADDED_GOAL_MS: f64 = 5.0;
/// The load generator's own budget: a tenth of a core per 1,000 sessions.
const CLIENT_GOAL_PERCENT_PER_1000: f64 = 10.0;

pub(crate) struct Sample {
    pub(crate) at: Instant,
    pub(crate) cpu_ticks: u64,
    pub(crate) rss_kb: u64,
    pub(crate) threads: u64,
    /// The whole machine's ticks then, to tell what else ran meanwhile.
    pub(crate) machine: Option<MachineTicks>,
}

pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    if args.sessions.is_empty() {
        bail!("--sessions needs at least one size");
    }
    if !args.webrtc && args.seconds as f64 <= args.ramp + 2.0 {
        bail!("--seconds must exceed --ramp by more than 2 s, so all sessions overlap");
    }
    if !args.run.no_build {
        let mut build = util::cargo();
        build.args([
            "build",
            "--release",
            "-p",
            "voxgate-server-bin",
            "-p",
            "voxgate-client",
        ]);
        util::run(&mut build)?;
    }
    let (server_bin, client_bin, wav) = util::release_inputs(
        args.run.server_bin.as_ref(),
        args.run.client_bin.as_ref(),
        args.run.wav.as_ref(),
    );
    let ticks_per_second = clock_ticks()?;
    let backend = args.run.opus.as_str();

    if args.webrtc {
        for &sessions in &args.sessions {
            let (mut server, addr) = start_server(&server_bin, backend, true, &[], None)?;
            let result = measure_webrtc(
                args,
                sessions,
                &client_bin,
                &wav,
                &server,
                addr,
                ticks_per_second,
            );
            // Our own child, by handle.
            let _ = server.kill();
            let _ = server.wait();
            result?;
        }
        return Ok(());
    }

    let delays = FakeDelays {
        asr: Duration::from_millis(args.run.asr_delay_ms),
        llm_first_token: Duration::from_millis(args.run.llm_delay_ms),
        tts_first_byte: Duration::from_millis(args.run.tts_delay_ms),
    };
    let fakes = FakeProviders::spawn(delays).context("starting the fake providers")?;
    let base = fakes.base_url();
    eprintln!(
        "fake providers at {base} (delays: ASR {} ms, LLM first token {} ms, TTS first byte {} ms)",
        args.run.asr_delay_ms, args.run.llm_delay_ms, args.run.tts_delay_ms
    );
    let mut env = vec![
        ("VOXGATE_ASR_BASE_URL", base.clone()),
        ("VOXGATE_LLM_BASE_URL", base.clone()),
        ("VOXGATE_TTS_BASE_URL", base),
        (
            "VOXGATE_XIAOZHI_ENGINE_SPECULATE",
            args.speculate.to_string(),
        ),
    ];
    if let Some(ms) = args.endpoint_delay_ms {
        env.push(("VOXGATE_XIAOZHI_ENGINE_ENDPOINT_DELAY_MS", ms.to_string()));
    }
    eprintln!(
        "Xiaozhi door: speculation {}, endpoint delay {}",
        if args.speculate { "on" } else { "off" },
        args.endpoint_delay_ms
            .map_or_else(|| "default".to_owned(), |ms| format!("{ms} ms"))
    );
    let targets: &[Target] = if args.realtime {
        &[
            Target::Realtime { grpc: false },
            Target::Realtime { grpc: true },
        ]
    } else {
        &[Target::Xiaozhi]
    };
    let mut rows = Vec::new();
    for (&sessions, &target) in args
        .sessions
        .iter()
        .flat_map(|s| targets.iter().map(move |t| (s, t)))
    {
        let before = fakes.counts();
        let (mut server, addr) = start_server(
            &server_bin,
            backend,
            false,
            &env,
            args.run.server_cpus.as_deref(),
        )?;
        let result = measure(
            args,
            target,
            sessions,
            &client_bin,
            &server,
            addr,
            ticks_per_second,
        );
        let _ = server.kill();
        let _ = server.wait();
        let after = fakes.counts();
        eprintln!(
            "   fake providers: {} transcriptions, {} completions, {} syntheses answered; \
             cancelled by the server: {} transcriptions, {} completions, {} syntheses; {} bad \
             requests",
            after.asr - before.asr,
            after.llm - before.llm,
            after.tts - before.tts,
            after.asr_cancelled - before.asr_cancelled,
            after.llm_cancelled - before.llm_cancelled,
            after.tts_cancelled - before.tts_cancelled,
            after.bad_requests - before.bad_requests
        );
        match result {
            Ok(row) => rows.push(row),
            Err(e) => {
                eprintln!("== load: {sessions} sessions failed: {e:#}");
                rows.push(Row::failed(sessions, target));
            }
        }
    }
    fakes.stop();
    println!("{}", table(&rows));
    if rows.iter().any(|r| r.failed) {
        bail!("some runs failed (see above)");
    }
    Ok(())
}

/// What `cargo xtask load` loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Target {
    /// Xiaozhi devices streaming Opus.
    #[default]
    Xiaozhi,
    /// Realtime sessions streaming PCM, over WebSocket or gRPC.
    Realtime { grpc: bool },
}

impl Target {
    /// The `door` label of the server's metrics.
    fn door(self) -> &'static str {
        match self {
            Self::Xiaozhi => "xiaozhi",
            Self::Realtime { .. } => "realtime",
        }
    }

    /// The report file's name stem, and the table's transport note.
    fn label(self) -> &'static str {
        match self {
            Self::Xiaozhi => "xiaozhi",
            Self::Realtime { grpc: false } => "realtime-websocket",
            Self::Realtime { grpc: true } => "realtime-grpc",
        }
    }

    /// `voxgate-client load ...` for this target against `addr`.
    fn client_args(self, addr: SocketAddr) -> Vec<String> {
        match self {
            Self::Xiaozhi => vec![
                "load".into(),
                "xiaozhi".into(),
                format!("ws://{addr}/xiaozhi/v1/"),
            ],
            Self::Realtime { grpc: false } => {
                vec![
                    "load".into(),
                    "realtime".into(),
                    format!("ws://{addr}/realtime"),
                ]
            }
            Self::Realtime { grpc: true } => vec![
                "load".into(),
                "realtime".into(),
                "--grpc".into(),
                format!("http://{addr}"),
            ],
        }
    }
}

/// One line of the table.
#[derive(Debug, Clone, Default, PartialEq)]
struct Row {
    sessions: usize,
    target: Target,
    failed: bool,
    server_cpu_percent: f64,
    rss_kb_peak: u64,
    threads: u64,
    turns_done_percent: Option<f64>,
    tts_start_p50: Option<f64>,
    tts_start_p99: Option<f64>,
    first_audio_p50: Option<f64>,
    first_audio_p99: Option<f64>,
    cut: u64,
    unanswered: u64,
    client_cpu_percent: Option<f64>,
    server_added_p99: Option<f64>,
}

impl Row {
    fn failed(sessions: usize, target: Target) -> Self {
        Self {
            sessions,
            target,
            failed: true,
            ..Self::default()
        }
    }

    /// The row of one run: the server's figures and the client's summary.
    fn new(
        sessions: usize,
        target: Target,
        server: &ServerFigures,
        client: &serde_json::Value,
    ) -> Self {
        let f = |k: &str| client[k].as_f64();
        let n = |k: &str| client[k].as_u64().unwrap_or(0);
        Self {
            sessions,
            target,
            failed: false,
            server_cpu_percent: server.cpu_percent,
            rss_kb_peak: server.rss_kb_peak,
            threads: server.threads,
            turns_done_percent: f("turns_done_percent"),
            tts_start_p50: f("tts_start_latency_ms_p50"),
            tts_start_p99: f("tts_start_latency_ms_p99"),
            first_audio_p50: f("first_audio_latency_ms_p50"),
            first_audio_p99: f("first_audio_latency_ms_p99"),
            // An unfinished answer counts as unanswered here: the device heard no end of it.
            cut: n("cut"),
            unanswered: n("unanswered") + n("unfinished") + n("lost"),
            client_cpu_percent: f("client_cpu_percent_of_one_core"),
            server_added_p99: server.server_added_p99,
        }
    }
}

/// The table of `rows`, as Markdown.
fn table(rows: &[Row]) -> String {
    let ms = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.0}"));
    let pair = |a: Option<f64>, b: Option<f64>| format!("{} / {} ms", ms(a), ms(b));
    let mut out = String::from(
        "| sessions | server CPU (% of one core) | RSS | threads | turns done | end of speech → `tts start` p50 / p99 | → first audio p50 / p99 | server-added p99 | cut | unanswered | client CPU (% of one core) |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let sessions = match r.target {
            Target::Xiaozhi => r.sessions.to_string(),
            Target::Realtime { .. } => format!("{} ({})", r.sessions, r.target.label()),
        };
        if r.failed {
            out.push_str(&format!("| {sessions} | failed | | | | | | | | | |\n"));
            continue;
        }
        out.push_str(&format!(
            "| {} | {:.1} % | {:.0} MB | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            sessions,
            r.server_cpu_percent,
            r.rss_kb_peak as f64 / 1024.0,
            r.threads,
            r.turns_done_percent
                .map_or_else(|| "-".to_owned(), |v| format!("{v:.1} %")),
            pair(r.tts_start_p50, r.tts_start_p99),
            pair(r.first_audio_p50, r.first_audio_p99),
            r.server_added_p99
                .map_or_else(|| "-".to_owned(), |v| format!("{v:.1} ms")),
            r.cut,
            r.unanswered,
            r.client_cpu_percent
                .map_or_else(|| "-".to_owned(), |v| format!("{v:.1} %")),
        ));
    }
    out
}

/// The server's figures over the steady window.
struct ServerFigures {
    cpu_percent: f64,
    rss_kb_peak: u64,
    threads: u64,
    /// The server's own share of a turn (`voxgate_turn_server_added_seconds`), p99 in ms.
    server_added_p99: Option<f64>,
}

/// A command for `program`, pinned to `cpus` (`taskset -c` syntax) when given: through
/// `taskset` when it is installed (it execs the program, so the pid is the program's), else
/// the returned CPU set is applied by [`spawn`] (the child inherits the spawning thread's
/// affinity).
pub(crate) fn pinned(
    program: &Path,
    cpus: Option<&str>,
) -> anyhow::Result<(Command, Option<CpuSet>)> {
    let Some(cpus) = cpus else {
        return Ok((Command::new(program), None));
    };
    if util::output(Command::new("taskset").arg("--version")).is_ok() {
        let mut cmd = Command::new("taskset");
        cmd.args(["-c", cpus]).arg(program);
        return Ok((cmd, None));
    }
    Ok((Command::new(program), Some(cpu_set(cpus)?)))
}

/// The CPUs of a `taskset -c` list: `0`, `0,2`, `1-3`.
fn cpu_set(list: &str) -> anyhow::Result<CpuSet> {
    let mut set = CpuSet::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let lo: usize = lo
            .trim()
            .parse()
            .with_context(|| format!("CPU list {list}"))?;
        let hi: usize = hi
            .trim()
            .parse()
            .with_context(|| format!("CPU list {list}"))?;
        for cpu in lo..=hi {
            set.set(cpu).with_context(|| format!("CPU {cpu}"))?;
        }
    }
    Ok(set)
}

/// Spawns `cmd`, with this thread pinned to `affinity` meanwhile so the child starts pinned.
pub(crate) fn spawn(cmd: &mut Command, affinity: Option<CpuSet>) -> anyhow::Result<Child> {
    let Some(set) = affinity else {
        return cmd.spawn().context("spawning");
    };
    let me = Pid::from_raw(0);
    let before = sched_getaffinity(me).context("sched_getaffinity")?;
    sched_setaffinity(me, &set).context("sched_setaffinity")?;
    let child = cmd.spawn().context("spawning");
    sched_setaffinity(me, &before).context("sched_setaffinity")?;
    child
}

/// One Xiaozhi run of `sessions` devices against `server`: prints its verdicts, writes its full
/// report to `target/load/xiaozhi-N.json` and returns its table row.
fn measure(
    args: &Args,
    target: Target,
    sessions: usize,
    client_bin: &Path,
    server: &Child,
    addr: SocketAddr,
    ticks_per_second: u64,
) -> anyhow::Result<Row> {
    let pid = server.id();
    std::thread::sleep(Duration::from_millis(500));
    let baseline = sample(pid)?;
    let (mut client_cmd, affinity) = pinned(client_bin, args.run.client_cpus.as_deref())?;
    client_cmd
        .args(target.client_args(addr))
        .args(["--sessions", &sessions.to_string()])
        .args(["--seconds", &args.seconds.to_string()])
        .args(["--ramp", &args.ramp.to_string()])
        .args(["--answer-timeout", &args.run.answer_timeout.to_string()]);
    if target == Target::Xiaozhi {
        client_cmd.args(["--threads", &args.client_threads.to_string()]);
    }
    if let Some(wav) = &args.run.wav {
        client_cmd.arg("--wav").arg(wav);
    }
    eprintln!("$ {}", util::describe(&client_cmd));
    let started = Instant::now();
    client_cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
    let mut client = spawn(&mut client_cmd, affinity).context("starting voxgate-client")?;

    let window_start = started + Duration::from_secs_f64(args.ramp + 1.0);
    let window_end = started + Duration::from_secs(args.seconds) - Duration::from_millis(500);
    let mut samples = Vec::new();
    let mut active_during = None;
    loop {
        if let Some(status) = client.try_wait()? {
            if !status.success() {
                bail!("voxgate-client failed with {status}");
            }
            break;
        }
        let now = Instant::now();
        let s = sample(pid)?;
        samples.push(s);
        if active_during.is_none() && now >= window_start + (window_end - window_start) / 2 {
            active_during = Some(metric(addr, "voxgate_sessions_active").unwrap_or(-1.0));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let summary = client_summary(&mut client)?;
    std::thread::sleep(Duration::from_millis(500));
    let after = sample(pid)?;
    let metrics_text = metrics(addr).unwrap_or_default();
    let dropped_up = sum_metric(
        &metrics_text,
        "voxgate_dropped_frames_total",
        "direction=\"uplink\"",
    );
    let dropped_down = sum_metric(
        &metrics_text,
        "voxgate_dropped_frames_total",
        "direction=\"downlink\"",
    );
    let dropped = dropped_up + dropped_down;
    let active_after = metric(addr, "voxgate_sessions_active").unwrap_or(-1.0);
    let speculation = |name: &str, outcome: &str| {
        sum_metric(&metrics_text, name, &format!("outcome=\"{outcome}\""))
    };
    let speculations = serde_json::json!({
        "started": speculation("voxgate_speculations_total", "started"),
        "adopted": speculation("voxgate_speculations_total", "adopted"),
        "discarded": speculation("voxgate_speculations_total", "discarded"),
        "requests_sent": speculation("voxgate_speculative_requests_total", "sent"),
        "requests_adopted": speculation("voxgate_speculative_requests_total", "adopted"),
        "requests_cancelled": speculation("voxgate_speculative_requests_total", "cancelled"),
    });
    let server_latencies = mean_latencies(&metrics_text);
    let added = histogram(
        &metrics_text,
        "voxgate_turn_server_added_seconds",
        &format!("door=\"{}\"", target.door()),
    );
    let added_ms = |q: f64| histogram_quantile(&added, q).map(|s| s * 1000.0);
    let added_p99 = added_ms(0.99);

    // CPU over the window where every session is up.
    let in_window: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.at >= window_start && s.at <= window_end)
        .collect();
    let (Some(first), Some(last)) = (in_window.first(), in_window.last()) else {
        bail!("no samples in the steady window (is --seconds long enough?)");
    };
    let n = sessions.max(1) as f64;
    let wall = last.at.duration_since(first.at).as_secs_f64().max(0.001);
    let cpu_seconds = (last.cpu_ticks - first.cpu_ticks) as f64 / ticks_per_second as f64;
    let cpu_total_percent = cpu_seconds / wall * 100.0;
    let cpu_per_session = cpu_total_percent / n;
    let peak_rss = in_window.iter().map(|s| s.rss_kb).max().unwrap_or(0);
    let mean_rss = in_window.iter().map(|s| s.rss_kb).sum::<u64>() as f64 / in_window.len() as f64;
    let threads = in_window.iter().map(|s| s.threads).max().unwrap_or(0);
    let kb_per_session = (mean_rss - baseline.rss_kb as f64) / n;
    let peak_kb_per_session = (peak_rss as f64 - baseline.rss_kb as f64) / n;
    let whole_cpu = (after.cpu_ticks - baseline.cpu_ticks) as f64 / ticks_per_second as f64;
    // The whole machine over the window: how busy all its cores were, and how much the
    // hypervisor gave to other guests (other processes and steal make runs differ).
    let (machine_busy, steal) = match (first.machine, last.machine) {
        (Some(a), Some(b)) => {
            let total = (b.total - a.total).max(1) as f64;
            (
                100.0 * (b.busy - a.busy) as f64 / total,
                100.0 * (b.steal - a.steal) as f64 / total,
            )
        }
        _ => (0.0, 0.0),
    };
    let cores = std::thread::available_parallelism().map_or(1, usize::from);

    let client_late = summary["late_frames"].as_u64().unwrap_or(0);
    let report = serde_json::json!({
        "target": target.label(),
        "sessions": sessions,
        "seconds": args.seconds,
        "ramp_seconds": args.ramp,
        "steady_window_seconds": wall,
        "machine_busy_percent_of_all_cores": machine_busy,
        "machine_steal_percent": steal,
        "cores": cores,
        "provider_delays_ms": {
            "asr": args.run.asr_delay_ms,
            "llm_first_token": args.run.llm_delay_ms,
            "tts_first_byte": args.run.tts_delay_ms,
        },
        "speculate": args.speculate,
        "endpoint_delay_ms": args.endpoint_delay_ms,
        "speculations": speculations,
        "server": {
            "cpu_percent_of_one_core_total": cpu_total_percent,
            "cpu_percent_of_one_core_per_session": cpu_per_session,
            "cpu_seconds_whole_run": whole_cpu,
            "rss_kb_baseline": baseline.rss_kb,
            "rss_kb_mean_steady": mean_rss,
            "rss_kb_peak": peak_rss,
            "rss_kb_after": after.rss_kb,
            "kb_per_session_mean": kb_per_session,
            "kb_per_session_peak": peak_kb_per_session,
            "threads_peak": threads,
            "sessions_active_mid_window": active_during,
            "sessions_active_after": active_after,
            "dropped_frames_total": dropped,
            "dropped_frames_uplink": dropped_up,
            "dropped_frames_downlink": dropped_down,
            "mean_latency_ms": server_latencies.iter().cloned().collect::<serde_json::Map<_, _>>(),
            "server_added_ms_p50": added_ms(0.5),
            "server_added_ms_p99": added_p99,
            "opus_backend": args.run.opus,
            "cpus": args.run.server_cpus,
        },
        "client": summary,
    });
    let dir = util::target_dir().join("load");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(format!("{}-{sessions}.json", target.label()));
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", path.display()))?;
    let verdict = |ok: bool| if ok { "ok" } else { "MISSED" };
    let num = |k: &str| summary[k].as_u64().unwrap_or(0);
    let ms = |k: &str| {
        summary[k]
            .as_f64()
            .map_or_else(|| "-".to_owned(), |v| format!("{v:.0}"))
    };
    eprintln!(
        "== load: {sessions} {} sessions x {} s (steady window {wall:.1} s); report in {}",
        target.label(),
        args.seconds,
        path.display()
    );
    eprintln!(
        "   server CPU per session: {cpu_per_session:.3} % of one core (total {cpu_total_percent:.1} %) [goal < {CPU_GOAL_PERCENT} %: {}]",
        verdict(cpu_per_session < CPU_GOAL_PERCENT)
    );
    eprintln!(
        "   server memory per session: {kb_per_session:.0} KB mean, {peak_kb_per_session:.0} KB peak (RSS {} -> {peak_rss} KB), {threads} threads [goal < {MEMORY_GOAL_KB} KB: {}]",
        baseline.rss_kb,
        verdict(peak_kb_per_session < MEMORY_GOAL_KB)
    );
    eprintln!(
        "   dropped frames: server {dropped} (uplink {dropped_up}, downlink {dropped_down}), client late {client_late}, client late sends {} [goal 0: {}]",
        summary["late_sends"],
        verdict(dropped == 0.0 && client_late == 0)
    );
    eprintln!(
        "   bursts {}: answered {} ({} %), cut {}, unanswered {}, unfinished {}, lost {}; turns {} (min per session {}), sessions with errors {}",
        num("bursts"),
        num("answered"),
        summary["turns_done_percent"],
        num("cut"),
        num("unanswered"),
        num("unfinished"),
        num("lost"),
        num("turns"),
        num("min_turns"),
        num("sessions_with_errors")
    );
    eprintln!(
        "   end of speech -> tts start p50 {} / p99 {} / max {} ms; -> first audio p50 {} / p99 {} / max {} ms",
        ms("tts_start_latency_ms_p50"),
        ms("tts_start_latency_ms_p99"),
        ms("tts_start_latency_ms_max"),
        ms("first_audio_latency_ms_p50"),
        ms("first_audio_latency_ms_p99"),
        ms("first_audio_latency_ms_max"),
    );
    let client_cpu = summary["client_cpu_percent_of_one_core"]
        .as_f64()
        .unwrap_or(0.0);
    let per_1000 = summary["client_cpu_percent_per_1000_sessions"]
        .as_f64()
        .unwrap_or(0.0);
    let seconds = |k: &str| summary[k].as_f64().unwrap_or(0.0);
    // The Xiaozhi generator splits its CPU into its own code and the kernel's; the realtime
    // one (on the client crate) reports the total only.
    let split = summary
        .get("client_cpu_user_seconds")
        .map_or_else(String::new, |_| {
            let user_share =
                seconds("client_cpu_user_seconds") / seconds("client_cpu_seconds").max(0.01);
            format!(
                " ({:.0} % of it in its own code, the rest in the kernel's TCP)",
                user_share * 100.0
            )
        });
    eprintln!(
        "   load generator: {client_cpu:.1} % of one core, {per_1000:.1} % per 1,000 sessions{split} [goal <= {CLIENT_GOAL_PERCENT_PER_1000} %: {}]",
        verdict(per_1000 <= CLIENT_GOAL_PERCENT_PER_1000)
    );
    eprintln!(
        "   speculation: {} started, {} adopted, {} discarded; speculative requests {} sent, {} adopted, {} cancelled",
        speculations["started"],
        speculations["adopted"],
        speculations["discarded"],
        speculations["requests_sent"],
        speculations["requests_adopted"],
        speculations["requests_cancelled"],
    );
    eprintln!(
        "   machine over the window: {machine_busy:.0} % of {cores} cores busy (everything: server, client, fakes, other processes), {steal:.1} % stolen by the hypervisor"
    );
    if !server_latencies.is_empty() {
        let list: Vec<String> = server_latencies
            .iter()
            .map(|(k, v)| format!("{k} {:.0} ms", v.as_f64().unwrap_or(0.0)))
            .collect();
        eprintln!("   server's own mean latencies: {}", list.join(", "));
    }
    if let Some(p99) = added_p99 {
        let within = share_within(&added, SERVER_ADDED_GOAL_MS / 1000.0).unwrap_or(0.0);
        eprintln!(
            "   server-added (turn decision -> first reply audio frame written, provider waits excluded): p50 {:.1} / p99 {p99:.1} ms, {:.2} % of {} turns within {SERVER_ADDED_GOAL_MS} ms [goal p99 < {SERVER_ADDED_GOAL_MS} ms: {}]",
            added_ms(0.5).unwrap_or(0.0),
            within * 100.0,
            added.last().map_or(0.0, |b| b.1),
            verdict(within >= 0.99)
        );
    }
    let server_figures = ServerFigures {
        cpu_percent: cpu_total_percent,
        rss_kb_peak: peak_rss,
        threads,
        server_added_p99: added_p99,
    };
    Ok(Row::new(sessions, target, &server_figures, &summary))
}

/// A histogram's cumulative buckets in `/metrics` for one label set: `(le, count)` in
/// order, `+Inf` last as `f64::INFINITY`.
fn histogram(text: &str, name: &str, labels: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{name}_bucket{{{labels},le=\"");
    let mut out: Vec<(f64, f64)> = text
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(&prefix)?;
            let (le, count) = rest.split_once("\"} ")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, count.trim().parse().ok()?))
        })
        .collect();
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// The `q` quantile of cumulative buckets, interpolated linearly inside its bucket (as
/// Prometheus' `histogram_quantile`); the last finite bound when it falls in `+Inf`. `None`
/// without observations.
fn histogram_quantile(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut below = (0.0, 0.0);
    for &(le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return Some(below.0);
            }
            let inside = count - below.1;
            let frac = if inside > 0.0 {
                (rank - below.1) / inside
            } else {
                1.0
            };
            return Some(below.0 + (le - below.0) * frac);
        }
        below = (le, count);
    }
    Some(below.0)
}

/// The share of observations at or below `bound` (a bucket bound), exact.
fn share_within(buckets: &[(f64, f64)], bound: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    let at = buckets.iter().find(|b| (b.0 - bound).abs() < 1e-12)?.1;
    (total > 0.0).then(|| at / total)
}

/// Mean latencies the server's `/metrics` has, in ms: every `*latency*_seconds` histogram's
/// `_sum` / `_count` per label set, e.g.
/// `voxgate_provider_latency_seconds{door="xiaozhi",provider="llm"}`.
fn mean_latencies(text: &str) -> Vec<(String, serde_json::Value)> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (name, labels) = series
            .split_once('{')
            .map_or((series, ""), |(n, l)| (n, l.trim_end_matches('}')));
        let Some(base) = name.strip_suffix("_seconds_sum") else {
            continue;
        };
        if !base.contains("latency") {
            continue;
        }
        let count_series = if labels.is_empty() {
            format!("{base}_seconds_count")
        } else {
            format!("{base}_seconds_count{{{labels}}}")
        };
        let count = text
            .lines()
            .find_map(|l| l.strip_prefix(&count_series)?.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        let Ok(sum) = value.parse::<f64>() else {
            continue;
        };
        if count > 0.0 {
            let key = if labels.is_empty() {
                base.to_owned()
            } else {
                format!("{base}{{{labels}}}")
            };
            out.push((key, serde_json::json!(sum / count * 1000.0)));
        }
    }
    out
}

/// The WebRTC run: the client's own summary (it samples the server's CPU and memory), the
/// server's late frames, and the whole machine's busiest second (client and server share it).
fn measure_webrtc(
    args: &Args,
    sessions: usize,
    client_bin: &Path,
    wav: &Path,
    server: &Child,
    addr: SocketAddr,
    ticks_per_second: u64,
) -> anyhow::Result<()> {
    std::thread::sleep(Duration::from_millis(500));
    let mut client_cmd = Command::new(client_bin);
    client_cmd
        .args(["load", "webrtc", &format!("http://{addr}")])
        .args(["--sessions", &sessions.to_string()])
        .args(["--ramp", &args.ramp.to_string()])
        .args(["--server-pid", &server.id().to_string()])
        .arg("--wav")
        .arg(wav);
    eprintln!("$ {}", util::describe(&client_cmd));
    let mut client = client_cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting voxgate-client")?;
    let mut busy = Vec::new();
    let first = machine_ticks()?;
    let mut last = first;
    let mut worst_steal = 0.0f64;
    loop {
        if let Some(status) = client.try_wait()? {
            if !status.success() {
                bail!("voxgate-client failed with {status}");
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
        let now = machine_ticks()?;
        let total = (now.total - last.total).max(1) as f64;
        busy.push(100.0 * (now.busy - last.busy) as f64 / total);
        worst_steal = worst_steal.max(100.0 * (now.steal - last.steal) as f64 / total);
        last = now;
    }
    // CPU time the hypervisor gave to other guests while this VM had work: a stall no server
    // can avoid, so runs are compared with it in view.
    let steal_seconds = (last.steal - first.steal) as f64 / ticks_per_second as f64;
    let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
    // The busiest second: two half-second samples side by side.
    let busiest = busy
        .windows(2)
        .map(|w| (w[0] + w[1]) / 2.0)
        .fold(busy.first().copied().unwrap_or(0.0), f64::max);
    let summary = client_summary(&mut client)?;
    let metrics_text = metrics(addr).unwrap_or_default();
    let server_late = sum_metric(&metrics_text, "voxgate_webrtc_late_frames_total", "");
    let dropped = sum_metric(&metrics_text, "voxgate_webrtc_dropped_datagrams_total", "");
    let report = serde_json::json!({
        "sessions": sessions,
        "ramp_seconds": args.ramp,
        "opus_backend": args.run.opus,
        "machine_busiest_second_percent_of_all_cores": busiest,
        "cores": cores,
        "server_late_frames": server_late,
        "server_dropped_datagrams": dropped,
        "steal_seconds": steal_seconds,
        "steal_worst_half_second_percent": worst_steal,
        "client": summary,
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    let verdict = |ok: bool| if ok { "ok" } else { "MISSED" };
    let n = |k: &str| summary[k].as_u64().unwrap_or(0);
    let server_cpu = &summary["server"];
    eprintln!(
        "== load --webrtc: {} sessions, {} ok, {} lost packets",
        sessions,
        n("sessions_ok"),
        n("lost_packets")
    );
    eprintln!(
        "   late packets (40 ms jitter buffer) {} of {} (max delay {} ms; gaps over 40 ms {}, max gap {} ms), server late frames {server_late}, dropped datagrams {dropped} [goal 0: {}]",
        n("late_packets"),
        n("packets_received"),
        n("max_delay_ms"),
        n("long_gaps"),
        n("max_gap_ms"),
        verdict(n("late_packets") == 0 && n("sessions_ok") == sessions as u64)
    );
    eprintln!(
        "   server CPU {:.1} s over the run ({:.0} % of one core), peak {:.0} KB per session; machine at its busiest {busiest:.0} % of {cores:.0} cores",
        server_cpu["cpu_seconds"].as_f64().unwrap_or(0.0),
        server_cpu["cpu_percent_of_one_core"]
            .as_f64()
            .unwrap_or(0.0),
        server_cpu["peak_kb_per_session"].as_f64().unwrap_or(0.0),
    );
    eprintln!(
        "   first audio p50 {} ms, p99 {} ms",
        n("first_audio_latency_ms_p50"),
        n("first_audio_latency_ms_p99")
    );
    eprintln!(
        "   CPU stolen by the hypervisor (steal): {steal_seconds:.1} s over the run, {worst_steal:.0} % of the machine in the worst half second"
    );
    Ok(())
}

/// The last JSON line the (finished) client printed: its summary.
pub(crate) fn client_summary(client: &mut Child) -> anyhow::Result<serde_json::Value> {
    let mut out = String::new();
    client
        .stdout
        .take()
        .context("client stdout")?
        .read_to_string(&mut out)?;
    out.lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .context("the client printed no summary")
}

/// The whole machine's clock ticks from `/proc/stat`'s `cpu` line.
#[derive(Clone, Copy)]
pub(crate) struct MachineTicks {
    /// Not idle (steal included: the VM wanted the CPU).
    pub(crate) busy: u64,
    pub(crate) total: u64,
    /// Taken by the hypervisor for other guests.
    pub(crate) steal: u64,
}

pub(crate) fn machine_ticks() -> anyhow::Result<MachineTicks> {
    let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    let line = stat.lines().next().context("empty /proc/stat")?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal
    let get = |i: usize| v.get(i).copied().unwrap_or(0);
    let idle = get(3) + get(4);
    let total: u64 = v.iter().take(8).sum();
    Ok(MachineTicks {
        busy: total - idle,
        total,
        steal: get(7),
    })
}

/// Starts the release server on a free loopback port, with `env` set and pinned to `cpus`;
/// returns it and the address it logged. For WebRTC the synthesizer is the `tone` provider:
/// the embedded one runs an `espeak-ng` process per sentence, whose CPU is not the server's
/// and would crowd the machine.
pub(crate) fn start_server(
    bin: &Path,
    opus_backend: &str,
    webrtc: bool,
    env: &[(&str, String)],
    cpus: Option<&str>,
) -> anyhow::Result<(Child, SocketAddr)> {
    let (mut cmd, affinity) = pinned(bin, cpus)?;
    // The providers the run names, never a model download or voice switch mid-run.
    cmd.env("VOXGATE_MODELS_AUTO_INSTALL", "false");
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    if webrtc {
        cmd.env("VOXGATE_TTS_PROVIDER", "tone");
    }
    cmd.args(["--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "warn")
        .env("VOXGATE_XIAOZHI_OPUS_BACKEND", opus_backend)
        // Every session comes from one address and the point is to measure what the server
        // carries: admission control stays out of the way (`cargo xtask chaos` tests it).
        .env("VOXGATE_MAX_SESSIONS", "0")
        .env("VOXGATE_MAX_SESSIONS_PER_DOOR", "0")
        .env("VOXGATE_MAX_SESSIONS_PER_IP", "0")
        .env("VOXGATE_MAX_CONNECTIONS_PER_IP", "0")
        .env("VOXGATE_MAX_HANDSHAKES_PER_SEC_PER_IP", "0")
        .env("VOXGATE_MAX_SCHEDULING_DELAY_MS", "0")
        // The Gemini door's own listener (port 3001 by default) is not measured, and a
        // second server on the machine would make this one fail to start.
        .env("VOXGATE_GEMINI_LISTEN", "off")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    eprintln!("$ {}", util::describe(&cmd));
    let mut child =
        spawn(&mut cmd, affinity).with_context(|| format!("starting {}", bin.display()))?;
    let stderr = child.stderr.take().context("server stderr")?;
    let (tx, rx) = mpsc::channel();
    // Keep draining the server's log so it never blocks on a full pipe.
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if !sent && let Some(addr) = line.split("listening on http://").nth(1) {
                let _ = tx.send(addr.trim().to_owned());
                sent = true;
            } else if line.contains("ERROR") || line.contains("WARN") {
                eprintln!("server: {line}");
            }
        }
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(addr) => Ok((
            child,
            addr.parse()
                .with_context(|| format!("server address {addr}"))?,
        )),
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            bail!("the server did not report its address within 20 s")
        }
    }
}

pub(crate) fn clock_ticks() -> anyhow::Result<u64> {
    let out = util::output(Command::new("getconf").arg("CLK_TCK"))?;
    out.trim().parse().context("CLK_TCK")
}

pub(crate) fn sample(pid: u32) -> anyhow::Result<Sample> {
    let at = Instant::now();
    let stat =
        std::fs::read_to_string(format!("/proc/{pid}/stat")).context("reading /proc/PID/stat")?;
    // Fields after the parenthesised command name: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| -> u64 { fields.get(n - 3).and_then(|f| f.parse().ok()).unwrap_or(0) };
    let cpu_ticks = field(14) + field(15);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .context("reading /proc/PID/status")?;
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Ok(Sample {
        at,
        cpu_ticks,
        rss_kb: field("VmRSS:"),
        threads: field("Threads:"),
        machine: machine_ticks().ok(),
    })
}

/// The sum of a Prometheus metric's samples (all label sets) from `/metrics`.
fn metric(addr: SocketAddr, name: &str) -> anyhow::Result<f64> {
    Ok(sum_metric(&metrics(addr)?, name, ""))
}

/// The server's `/metrics` text.
pub(crate) fn metrics(addr: SocketAddr) -> anyhow::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "GET /metrics HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut body = String::new();
    stream.read_to_string(&mut body)?;
    Ok(body)
}

/// The sum of the samples of `name` whose line contains `labels` (empty: every sample).
pub(crate) fn sum_metric(text: &str, name: &str, labels: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#') && l.contains(labels))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            if !(rest.starts_with('{') || rest.starts_with(' ')) {
                return None;
            }
            l.rsplit(' ').next()?.parse::<f64>().ok()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_interpolate_inside_buckets() {
        let text = "# TYPE x histogram\n\
            x_bucket{door=\"xiaozhi\",le=\"0.001\"} 50\n\
            x_bucket{door=\"xiaozhi\",le=\"0.005\"} 99\n\
            x_bucket{door=\"xiaozhi\",le=\"+Inf\"} 100\n\
            x_bucket{door=\"vip\",le=\"+Inf\"} 7\n\
            x_sum{door=\"xiaozhi\"} 0.2\n";
        let b = histogram(text, "x", "door=\"xiaozhi\"");
        assert_eq!(b, [(0.001, 50.0), (0.005, 99.0), (f64::INFINITY, 100.0)]);
        assert_eq!(histogram_quantile(&b, 0.5), Some(0.001));
        assert!((histogram_quantile(&b, 0.25).unwrap() - 0.0005).abs() < 1e-12);
        assert!((histogram_quantile(&b, 0.99).unwrap() - 0.005).abs() < 1e-12);
        // Past the last finite bound: that bound.
        assert_eq!(histogram_quantile(&b, 1.0), Some(0.005));
        assert_eq!(share_within(&b, 0.005), Some(0.99));
        assert_eq!(histogram_quantile(&[(f64::INFINITY, 0.0)], 0.5), None);
    }

    #[test]
    fn cpu_lists_follow_taskset() {
        let set = cpu_set("0, 2-3").unwrap();
        assert!(set.is_set(0).unwrap() && set.is_set(2).unwrap() && set.is_set(3).unwrap());
        assert!(!set.is_set(1).unwrap());
        assert!(cpu_set("one").is_err());
    }

    #[test]
    fn latency_summaries_become_means() {
        let text = "# TYPE voxgate_provider_latency_seconds summary\n\
                    voxgate_provider_latency_seconds_sum{provider=\"llm\"} 0.5\n\
                    voxgate_provider_latency_seconds_count{provider=\"llm\"} 4\n\
                    voxgate_provider_latency_seconds_sum{provider=\"asr\"} 0\n\
                    voxgate_provider_latency_seconds_count{provider=\"asr\"} 0\n\
                    voxgate_turn_latency_seconds_sum 3\nvoxgate_turn_latency_seconds_count 6\n\
                    voxgate_other_seconds_sum 1\nvoxgate_other_seconds_count 1\n";
        let means = mean_latencies(text);
        assert_eq!(
            means,
            [
                (
                    "voxgate_provider_latency{provider=\"llm\"}".to_owned(),
                    serde_json::json!(125.0)
                ),
                ("voxgate_turn_latency".to_owned(), serde_json::json!(500.0)),
            ]
        );
    }

    #[test]
    fn the_table_has_a_row_per_size() {
        let client = serde_json::json!({
            "turns_done_percent": 100.0,
            "tts_start_latency_ms_p50": 584.2, "tts_start_latency_ms_p99": 588.0,
            "first_audio_latency_ms_p50": 600.0, "first_audio_latency_ms_p99": 640.4,
            "cut": 1, "unanswered": 2, "unfinished": 1, "lost": 0,
            "client_cpu_percent_of_one_core": 0.35,
        });
        let server = ServerFigures {
            cpu_percent: 8.94,
            rss_kb_peak: 25 * 1024,
            threads: 2,
            server_added_p99: Some(1.23),
        };
        let grpc = Target::Realtime { grpc: true };
        let t = table(&[
            Row::new(35, Target::Xiaozhi, &server, &client),
            Row::failed(600, Target::Xiaozhi),
            Row::new(35, grpc, &server, &client),
        ]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 5, "{t}");
        assert!(
            lines[4].starts_with("| 35 (realtime-grpc) | 8.9 % |"),
            "{t}"
        );
        assert_eq!(
            lines[2],
            "| 35 | 8.9 % | 25 MB | 2 | 100.0 % | 584 / 588 ms | 600 / 640 ms | 1.2 ms | 1 | 3 | 0.3 % |"
        );
        assert!(lines[3].starts_with("| 600 | failed |"));
    }

    #[test]
    fn metrics_are_summed_over_labels() {
        let text = "# HELP x\nvoxgate_dropped_frames_total{door=\"realtime\"} 3\n\
                    voxgate_dropped_frames_total{door=\"xiaozhi\"} 4\n\
                    voxgate_dropped_frames_total_extra 100\nvoxgate_sessions_active 2\n";
        assert_eq!(sum_metric(text, "voxgate_dropped_frames_total", ""), 7.0);
        assert_eq!(
            sum_metric(text, "voxgate_dropped_frames_total", "door=\"xiaozhi\""),
            4.0
        );
        assert_eq!(sum_metric(text, "voxgate_sessions_active", ""), 2.0);
        assert_eq!(sum_metric(text, "missing", ""), 0.0);
    }
}
