//! `cargo xtask soak`: the Xiaozhi load of `cargo xtask load` held for a long time (an hour by
//! default) below capacity, to catch what a 30-second run cannot: memory that grows, a queue
//! that fills, errors that start after a while (issue 17, goal 5).
//!
//! The same fake providers in-process and the same server start as `cargo xtask load`; one
//! `voxgate-client load xiaozhi` run of `--sessions` devices (320 by default: 80 % of the 400
//! sessions this 2-core machine carries within the latency goals, docs/performance.md) for
//! `--minutes`. Every `--interval` seconds (10) it samples the
//! server's RSS, CPU and threads (`/proc/PID/...`), its `/metrics` (sessions active, turns,
//! dropped frames, errors, provider failures and timeouts, refusals, and every gauge; the queue-
//! like ones, named `*queue*`, `*pending*`, `*backlog*`, `*depth*`, `*lag*` or `*delay*`, are
//! checked for growth: today that is `voxgate_scheduling_delay_seconds`, how late the runtime
//! wakes a timer), the load generator's CPU and the machine's busy and stolen CPU, and prints
//! a table row per sample. At the end [`verdict`] judges the samples and the client's
//! summary, the report goes to `target/load/soak.json`, and the command fails when a check
//! does.

use std::io::Write as _;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use voxgate_test_support::fake_providers::{FakeDelays, FakeProviders};

use crate::load;
use crate::util;

/// Options of `cargo xtask soak`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// How long the sessions keep starting bursts, minutes (fractions allowed).
    #[arg(long, default_value_t = 60.0)]
    minutes: f64,
    /// Concurrent device sessions (default: 80 % of the measured capacity of the 2-core
    /// reference machine, 400 sessions within the latency goals; scale it to yours).
    #[arg(long, default_value_t = 320)]
    sessions: usize,
    /// Seconds over which the sessions start.
    #[arg(long, default_value_t = 20.0)]
    ramp: f64,
    /// Seconds between samples (default 10; 1 with `--fast`).
    #[arg(long)]
    interval: Option<f64>,
    /// A short smoke run: the warm-up is the first 10 % of the run with no 2-minute minimum
    /// (still at least the ramp and 10 s) and samples come every second, so a run of a minute
    /// or two gets a verdict.
    #[arg(long)]
    fast: bool,
    /// The fakes, the binaries, the pinning, as for `cargo xtask load`.
    #[command(flatten)]
    run: load::RunArgs,
}

/// One sample of the server (and the machine) during the soak.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct SoakSample {
    /// Seconds since the load generator started.
    pub(crate) t: f64,
    /// The server's resident memory.
    pub(crate) rss_kb: u64,
    /// The server's CPU since the previous sample, percent of one core.
    pub(crate) cpu_percent: f64,
    pub(crate) threads: u64,
    /// The load generator's CPU since the previous sample, percent of one core.
    pub(crate) client_cpu_percent: f64,
    /// Both cores, everything on the machine, since the previous sample.
    pub(crate) machine_busy_percent: f64,
    pub(crate) steal_percent: f64,
    /// `voxgate_sessions_active{door="xiaozhi"}`.
    pub(crate) active: f64,
    /// Totals since the server started: `voxgate_turns_total`, `voxgate_dropped_frames_total`,
    /// errors (`voxgate_errors_total`, `voxgate_provider_failures_total`,
    /// `voxgate_provider_timeouts_total`) and `voxgate_sessions_refused_total`.
    pub(crate) turns: f64,
    pub(crate) dropped: f64,
    pub(crate) errors: f64,
    pub(crate) refused: f64,
    /// Every gauge series of `/metrics` (`name{labels}`, value).
    pub(crate) gauges: Vec<(String, f64)>,
}

/// What the client's summary says about the bursts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ClientTotals {
    pub(crate) sessions: u64,
    pub(crate) connected: u64,
    pub(crate) bursts: u64,
    pub(crate) answered: u64,
    pub(crate) cut: u64,
    pub(crate) unanswered: u64,
    pub(crate) unfinished: u64,
    pub(crate) lost: u64,
    pub(crate) sessions_with_errors: u64,
}

impl ClientTotals {
    fn from_summary(s: &serde_json::Value) -> Self {
        let n = |k: &str| s[k].as_u64().unwrap_or(0);
        Self {
            sessions: n("sessions"),
            connected: n("connected"),
            bursts: n("bursts"),
            answered: n("answered"),
            cut: n("cut"),
            unanswered: n("unanswered"),
            unfinished: n("unfinished"),
            lost: n("lost"),
            sessions_with_errors: n("sessions_with_errors"),
        }
    }
}

/// How the samples are judged.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Rules {
    /// The warm-up is this share of the run...
    pub(crate) warmup_fraction: f64,
    /// ...and at least this long, seconds.
    pub(crate) warmup_min_seconds: f64,
    /// RSS after the warm-up: the median of the last quarter within this share of the first
    /// quarter's.
    pub(crate) rss_tolerance: f64,
    /// Fewer samples after the warm-up than this cannot say anything.
    pub(crate) min_samples: usize,
}

impl Rules {
    /// The soak's rules: a warm-up of 10 % of the run, at least 2 minutes; RSS within 5 %.
    /// (`run` raises the minimum to the ramp and 10 s when that is longer.)
    pub(crate) const STANDARD: Self = Self {
        warmup_fraction: 0.1,
        warmup_min_seconds: 120.0,
        rss_tolerance: 0.05,
        min_samples: 8,
    };
    /// `--fast`: the same without the 2-minute minimum.
    pub(crate) const FAST: Self = Self {
        warmup_min_seconds: 0.0,
        ..Self::STANDARD
    };

    /// Seconds of warm-up in a run of `run_seconds`.
    pub(crate) fn warmup(&self, run_seconds: f64) -> f64 {
        (run_seconds * self.warmup_fraction).max(self.warmup_min_seconds)
    }
}

/// One check of the verdict.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Check {
    pub(crate) name: &'static str,
    pub(crate) ok: bool,
    pub(crate) detail: String,
}

/// The median of `v` (0 for none).
fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        f64::midpoint(v[mid - 1], v[mid])
    }
}

/// The medians of the first and the last quarter of `v` (at least one value each).
fn quarters(v: &[f64]) -> (f64, f64) {
    let q = (v.len() / 4).max(1);
    (
        median(&v[..q.min(v.len())]),
        median(&v[v.len().saturating_sub(q)..]),
    )
}

/// Whether a gauge measures a queue (something that grows when the server falls behind).
fn queue_like(series: &str) -> bool {
    let name = series.split('{').next().unwrap_or(series);
    ["queue", "pending", "backlog", "depth", "lag", "delay"]
        .iter()
        .any(|w| name.contains(w))
}

/// A queue grows when the last quarter's median is more than half as large again as the first
/// quarter's and larger by more than the noise floor (5 ms for `*_seconds` gauges, one item
/// otherwise).
fn growing(series: &str, first: f64, last: f64) -> bool {
    let floor = if series
        .split('{')
        .next()
        .unwrap_or(series)
        .ends_with("_seconds")
    {
        0.005
    } else {
        1.0
    };
    last > first * 1.5 && last - first > floor
}

/// The soak's verdict over `samples` of a run whose sessions started bursts for `run_seconds`
/// (samples after that, as the sessions wind down, are not judged), with the client's totals
/// (`None`: it printed no summary). Pure, so it is tested with made-up series.
pub(crate) fn verdict(
    samples: &[SoakSample],
    run_seconds: f64,
    sessions: usize,
    client: Option<&ClientTotals>,
    rules: &Rules,
) -> Vec<Check> {
    let warmup = rules.warmup(run_seconds);
    let steady: Vec<&SoakSample> = samples
        .iter()
        .filter(|s| s.t >= warmup && s.t <= run_seconds)
        .collect();
    let mut checks = Vec::new();
    let enough = steady.len() >= rules.min_samples;

    // Memory.
    let rss: Vec<f64> = steady.iter().map(|s| s.rss_kb as f64).collect();
    let (first, last) = quarters(&rss);
    let change = if first > 0.0 { last / first - 1.0 } else { 0.0 };
    checks.push(Check {
        name: "rss flat",
        ok: enough && first > 0.0 && change.abs() <= rules.rss_tolerance,
        detail: if enough {
            format!(
                "median RSS {:.1} MB in the first quarter after the warm-up ({warmup:.0} s), {:.1} MB in the last: {:+.1} % (limit ±{:.0} %)",
                first / 1024.0,
                last / 1024.0,
                change * 100.0,
                rules.rss_tolerance * 100.0
            )
        } else {
            format!(
                "{} samples after the warm-up ({warmup:.0} s), {} needed: run longer",
                steady.len(),
                rules.min_samples
            )
        },
    });

    // Queues: every queue-like gauge present in the steady samples.
    let mut names: Vec<&str> = steady
        .iter()
        .flat_map(|s| s.gauges.iter().map(|(n, _)| n.as_str()))
        .filter(|n| queue_like(n))
        .collect();
    names.sort_unstable();
    names.dedup();
    let mut grown = Vec::new();
    let mut seen = Vec::new();
    for name in &names {
        let series: Vec<f64> = steady
            .iter()
            .filter_map(|s| s.gauges.iter().find(|(n, _)| n == name).map(|(_, v)| *v))
            .collect();
        let (first, last) = quarters(&series);
        seen.push(format!("{name} {first} -> {last}"));
        if growing(name, first, last) {
            grown.push(format!("{name} {first} -> {last}"));
        }
    }
    let dropped = samples.last().map_or(0.0, |s| s.dropped);
    checks.push(Check {
        name: "no growing queue",
        ok: enough && grown.is_empty() && dropped == 0.0,
        detail: format!(
            "{}; dropped frames {dropped}{}",
            if names.is_empty() {
                "no queue gauge in /metrics".to_owned()
            } else {
                format!("first -> last quarter: {}", seen.join(", "))
            },
            if grown.is_empty() {
                String::new()
            } else {
                format!("; growing: {}", grown.join(", "))
            }
        ),
    });

    // Sessions held.
    let fewest = steady
        .iter()
        .map(|s| s.active)
        .fold(f64::INFINITY, f64::min);
    checks.push(Check {
        name: "sessions held",
        ok: enough && fewest >= sessions as f64,
        detail: format!(
            "fewest active after the warm-up: {} of {sessions}",
            if fewest.is_finite() { fewest } else { 0.0 }
        ),
    });

    // Errors, all run long.
    let (errors, refused) = samples.last().map_or((0.0, 0.0), |s| (s.errors, s.refused));
    let client_errors = client.map_or(0, |c| c.sessions_with_errors);
    checks.push(Check {
        name: "zero errors",
        ok: errors == 0.0 && refused == 0.0 && client_errors == 0 && client.is_some(),
        detail: format!(
            "server errors, provider failures and timeouts {errors}, refused sessions {refused}, client sessions with errors {client_errors}"
        ),
    });

    // Bursts.
    checks.push(match client {
        Some(c) => Check {
            name: "every burst answered",
            ok: c.bursts > 0 && c.answered == c.bursts && c.connected == c.sessions,
            detail: format!(
                "{} of {} bursts answered (cut {}, unanswered {}, unfinished {}, lost {}); {} of {} sessions connected",
                c.answered,
                c.bursts,
                c.cut,
                c.unanswered,
                c.unfinished,
                c.lost,
                c.connected,
                c.sessions
            ),
        },
        None => Check {
            name: "every burst answered",
            ok: false,
            detail: "the load generator printed no summary".to_owned(),
        },
    });
    checks
}

/// The gauge series of a `/metrics` text (`name{labels}`, value).
fn gauges(text: &str) -> Vec<(String, f64)> {
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" gauge"))
        .collect();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let name = series.split('{').next()?;
            names
                .contains(&name)
                .then(|| Some((series.to_owned(), value.parse().ok()?)))?
        })
        .collect()
}

/// The soak's sample of the server (and machine, and client) now, against the previous one.
struct Probe {
    server: load::Sample,
    client: Option<load::Sample>,
}

fn cpu_percent(a: &load::Sample, b: &load::Sample, ticks_per_second: u64) -> f64 {
    let dt = b.at.duration_since(a.at).as_secs_f64().max(0.001);
    (b.cpu_ticks.saturating_sub(a.cpu_ticks)) as f64 / ticks_per_second as f64 / dt * 100.0
}

fn table_header() -> &'static str {
    "| time | server CPU (% of one core) | RSS | threads | sessions active | turns in the interval | dropped frames | errors | scheduling delay | client CPU | machine busy / stolen |\n\
     |---|---|---|---|---|---|---|---|---|---|---|"
}

fn table_row(s: &SoakSample, turns_before: f64) -> String {
    let delay = s
        .gauges
        .iter()
        .find(|(n, _)| n == "voxgate_scheduling_delay_seconds")
        .map_or_else(|| "-".to_owned(), |(_, v)| format!("{:.1} ms", v * 1000.0));
    let t = Duration::from_secs_f64(s.t.clamp(0.0, 1e9)).as_secs();
    format!(
        "| {}:{:02} | {:.1} % | {:.1} MB | {} | {} | {} | {} | {} | {delay} | {:.1} % | {:.0} % / {:.1} % |",
        t / 60,
        t % 60,
        s.cpu_percent,
        s.rss_kb as f64 / 1024.0,
        s.threads,
        s.active,
        s.turns - turns_before,
        s.dropped,
        s.errors,
        s.client_cpu_percent,
        s.machine_busy_percent,
        s.steal_percent,
    )
}

pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    if args.sessions == 0 {
        bail!("--sessions must be at least 1");
    }
    if !(args.minutes.is_finite() && args.minutes > 0.0 && args.minutes <= 10_000.0) {
        bail!("--minutes must be above 0 (and at most 10,000)");
    }
    if !(args.ramp.is_finite() && args.ramp >= 0.0) {
        bail!("--ramp must be 0 or more seconds");
    }
    let seconds = Duration::from_secs_f64(args.minutes * 60.0).as_secs();
    if seconds as f64 <= args.ramp + 2.0 {
        bail!("the run must exceed --ramp by more than 2 s, so all sessions overlap");
    }
    let every = args.interval.unwrap_or(if args.fast { 1.0 } else { 10.0 });
    if !(0.25..=3600.0).contains(&every) {
        bail!("--interval must be between 0.25 and 3,600 seconds");
    }
    let interval = Duration::from_secs_f64(every);
    let preset = if args.fast {
        Rules::FAST
    } else {
        Rules::STANDARD
    };
    // The warm-up covers the ramp and the last sessions' first turn, whatever the run's length.
    let rules = Rules {
        warmup_min_seconds: preset.warmup_min_seconds.max(args.ramp + 10.0),
        ..preset
    };
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
    let (server_bin, client_bin, _) = util::release_inputs(
        args.run.server_bin.as_ref(),
        args.run.client_bin.as_ref(),
        None,
    );
    let ticks_per_second = load::clock_ticks()?;

    let delays = FakeDelays {
        asr: Duration::from_millis(args.run.asr_delay_ms),
        llm_first_token: Duration::from_millis(args.run.llm_delay_ms),
        tts_first_byte: Duration::from_millis(args.run.tts_delay_ms),
    };
    let fakes = FakeProviders::spawn(delays).context("starting the fake providers")?;
    let base = fakes.base_url();
    let env = [
        ("VOXGATE_ASR_BASE_URL", base.clone()),
        ("VOXGATE_LLM_BASE_URL", base.clone()),
        ("VOXGATE_TTS_BASE_URL", base),
        // Only the Xiaozhi door is soaked: the Gemini door's own listener (port 3001) stays
        // closed, so the soak runs beside another server.
        ("VOXGATE_GEMINI_LISTEN", "off".to_owned()),
    ];
    let (mut server, addr) = load::start_server(
        &server_bin,
        &args.run.opus,
        false,
        &env,
        args.run.server_cpus.as_deref(),
    )?;
    let result = soak(
        args,
        seconds,
        interval,
        &rules,
        &client_bin,
        &server,
        addr,
        ticks_per_second,
    );
    // Our own child, by handle.
    let _ = server.kill();
    let _ = server.wait();
    fakes.stop();
    result
}

#[allow(
    clippy::too_many_arguments,
    reason = "one call site, all of it the run's setup"
)]
fn soak(
    args: &Args,
    seconds: u64,
    interval: Duration,
    rules: &Rules,
    client_bin: &std::path::Path,
    server: &std::process::Child,
    addr: std::net::SocketAddr,
    ticks_per_second: u64,
) -> anyhow::Result<()> {
    let pid = server.id();
    std::thread::sleep(Duration::from_millis(500));
    let baseline = load::sample(pid)?;
    eprintln!(
        "soak: {} sessions for {} min ({} s), ramp {} s, a sample every {:.0} s, warm-up {:.0} s{}; server idle RSS {:.1} MB",
        args.sessions,
        args.minutes,
        seconds,
        args.ramp,
        interval.as_secs_f64(),
        rules.warmup(seconds as f64),
        if args.fast { " (--fast)" } else { "" },
        baseline.rss_kb as f64 / 1024.0
    );
    let url = format!("ws://{addr}/xiaozhi/v1/");
    let (mut client_cmd, affinity) = load::pinned(client_bin, args.run.client_cpus.as_deref())?;
    client_cmd
        .args(["load", "xiaozhi", &url])
        .args(["--sessions", &args.sessions.to_string()])
        .args(["--seconds", &seconds.to_string()])
        .args(["--ramp", &args.ramp.to_string()])
        .args(["--answer-timeout", &args.run.answer_timeout.to_string()]);
    if let Some(wav) = &args.run.wav {
        client_cmd.arg("--wav").arg(wav);
    }
    eprintln!("$ {}", util::describe(&client_cmd));
    client_cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
    let started = Instant::now();
    let mut client = load::spawn(&mut client_cmd, affinity).context("starting voxgate-client")?;
    let client_pid = client.id();

    println!("{}", table_header());
    let mut samples: Vec<SoakSample> = Vec::new();
    let mut last = Probe {
        server: load::sample(pid)?,
        client: load::sample(client_pid).ok(),
    };
    let mut next = started + interval;
    let status = loop {
        if let Some(status) = client.try_wait()? {
            break status;
        }
        if Instant::now() < next {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        next += interval;
        let now = Probe {
            server: load::sample(pid)?,
            client: load::sample(client_pid).ok(),
        };
        let text = load::metrics(addr).unwrap_or_default();
        let sum = |name: &str, labels: &str| load::sum_metric(&text, name, labels);
        let (busy, steal) = match (last.server.machine, now.server.machine) {
            (Some(a), Some(b)) => {
                let total = (b.total - a.total).max(1) as f64;
                (
                    100.0 * (b.busy - a.busy) as f64 / total,
                    100.0 * (b.steal - a.steal) as f64 / total,
                )
            }
            _ => (0.0, 0.0),
        };
        let s = SoakSample {
            t: now.server.at.duration_since(started).as_secs_f64(),
            rss_kb: now.server.rss_kb,
            cpu_percent: cpu_percent(&last.server, &now.server, ticks_per_second),
            threads: now.server.threads,
            client_cpu_percent: match (&last.client, &now.client) {
                (Some(a), Some(b)) => cpu_percent(a, b, ticks_per_second),
                _ => 0.0,
            },
            machine_busy_percent: busy,
            steal_percent: steal,
            active: sum("voxgate_sessions_active", "door=\"xiaozhi\""),
            turns: sum("voxgate_turns_total", ""),
            dropped: sum("voxgate_dropped_frames_total", ""),
            errors: sum("voxgate_errors_total", "")
                + sum("voxgate_provider_failures_total", "")
                + sum("voxgate_provider_timeouts_total", ""),
            refused: sum("voxgate_sessions_refused_total", ""),
            gauges: gauges(&text),
        };
        let before = samples.last().map_or(0.0, |p| p.turns);
        println!("{}", table_row(&s, before));
        let _ = std::io::stdout().flush();
        samples.push(s);
        last = now;
    };
    let summary = if status.success() {
        load::client_summary(&mut client).ok()
    } else {
        eprintln!("soak: voxgate-client failed with {status}");
        None
    };
    let totals = summary.as_ref().map(ClientTotals::from_summary);
    let checks = verdict(
        &samples,
        seconds as f64,
        args.sessions,
        totals.as_ref(),
        rules,
    );
    println!();
    println!("| check | verdict | detail |\n|---|---|---|");
    for c in &checks {
        println!(
            "| {} | {} | {} |",
            c.name,
            if c.ok { "ok" } else { "FAILED" },
            c.detail
        );
    }
    if let Some(s) = &summary {
        eprintln!(
            "soak: client: end of speech -> tts start p50 {} / p99 {} ms, -> first audio p50 {} / p99 {} ms, late reply frames {}, load generator {} % of one core ({} % per 1,000 sessions, {} us per message)",
            s["tts_start_latency_ms_p50"],
            s["tts_start_latency_ms_p99"],
            s["first_audio_latency_ms_p50"],
            s["first_audio_latency_ms_p99"],
            s["late_frames"],
            s["client_cpu_percent_of_one_core"],
            s["client_cpu_percent_per_1000_sessions"],
            s["client_cpu_us_per_message"],
        );
    }
    let report = serde_json::json!({
        "sessions": args.sessions,
        "minutes": args.minutes,
        "seconds": seconds,
        "ramp_seconds": args.ramp,
        "interval_seconds": interval.as_secs_f64(),
        "fast": args.fast,
        "warmup_seconds": rules.warmup(seconds as f64),
        "opus_backend": args.run.opus,
        "provider_delays_ms": {
            "asr": args.run.asr_delay_ms,
            "llm_first_token": args.run.llm_delay_ms,
            "tts_first_byte": args.run.tts_delay_ms,
        },
        "server_rss_kb_idle": baseline.rss_kb,
        "checks": checks.iter().map(|c| serde_json::json!({
            "name": c.name, "ok": c.ok, "detail": c.detail,
        })).collect::<Vec<_>>(),
        "passed": checks.iter().all(|c| c.ok),
        "samples": samples.iter().map(|s| serde_json::json!({
            "t": s.t,
            "rss_kb": s.rss_kb,
            "cpu_percent": s.cpu_percent,
            "threads": s.threads,
            "client_cpu_percent": s.client_cpu_percent,
            "machine_busy_percent": s.machine_busy_percent,
            "steal_percent": s.steal_percent,
            "sessions_active": s.active,
            "turns_total": s.turns,
            "dropped_frames_total": s.dropped,
            "errors_total": s.errors,
            "refused_total": s.refused,
            "gauges": s.gauges.iter().map(|(k, v)| (k.clone(), serde_json::json!(v))).collect::<serde_json::Map<_, _>>(),
        })).collect::<Vec<_>>(),
        "client": summary,
    });
    let dir = util::target_dir().join("load");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join("soak.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!("soak: report in {}", path.display());
    let failed: Vec<&str> = checks.iter().filter(|c| !c.ok).map(|c| c.name).collect();
    if !failed.is_empty() {
        bail!("soak failed: {}", failed.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DELAY: &str = "voxgate_scheduling_delay_seconds";

    /// A 10-minute run sampled every 10 s: RSS and the scheduling delay from `rss(t)` and
    /// `delay(t)`, 800 sessions active, no errors.
    fn run(rss: impl Fn(u32) -> u64, delay: impl Fn(f64) -> f64) -> Vec<SoakSample> {
        (1..=60)
            .map(|i| {
                let t = f64::from(i) * 10.0;
                SoakSample {
                    t,
                    rss_kb: rss(i * 10),
                    active: 800.0,
                    turns: t * 100.0,
                    gauges: vec![
                        (DELAY.to_owned(), delay(t)),
                        (
                            "voxgate_sessions_active{door=\"xiaozhi\"}".to_owned(),
                            800.0,
                        ),
                    ],
                    ..SoakSample::default()
                }
            })
            .collect()
    }

    fn all_answered() -> ClientTotals {
        ClientTotals {
            sessions: 800,
            connected: 800,
            bursts: 100_000,
            answered: 100_000,
            ..ClientTotals::default()
        }
    }

    fn failed(checks: &[Check]) -> Vec<&'static str> {
        checks.iter().filter(|c| !c.ok).map(|c| c.name).collect()
    }

    /// Warm-up growth then a plateau with ±2 % noise (`t` in seconds).
    fn flat(t: u32) -> u64 {
        let t = u64::from(t);
        if t < 60 {
            100_000 + t * 2_000
        } else if (t / 10).is_multiple_of(2) {
            204_000
        } else {
            196_000
        }
    }

    #[test]
    fn a_flat_run_passes() {
        let samples = run(flat, |_| 0.0004);
        let checks = verdict(
            &samples,
            600.0,
            800,
            Some(&all_answered()),
            &Rules::STANDARD,
        );
        assert!(failed(&checks).is_empty(), "{checks:#?}");
        // The 2-minute minimum warm-up: samples before it do not count, so the ramp's growth
        // (up to 60 s here) is never judged.
        assert_eq!(Rules::STANDARD.warmup(600.0), 120.0);
        assert_eq!(Rules::STANDARD.warmup(3600.0), 360.0);
        assert_eq!(Rules::FAST.warmup(120.0), 12.0);
    }

    #[test]
    fn memory_that_keeps_growing_fails() {
        // 0.1 % a sample: about 45 % between the first and last quarter after the warm-up.
        let samples = run(|t| 200_000 + u64::from(t) * 200, |_| 0.0004);
        let checks = verdict(
            &samples,
            600.0,
            800,
            Some(&all_answered()),
            &Rules::STANDARD,
        );
        assert_eq!(failed(&checks), ["rss flat"], "{checks:#?}");
        // A slow growth under 5 % passes.
        let samples = run(|t| 200_000 + u64::from(t) * 10, |_| 0.0004);
        let checks = verdict(
            &samples,
            600.0,
            800,
            Some(&all_answered()),
            &Rules::STANDARD,
        );
        assert!(failed(&checks).is_empty(), "{checks:#?}");
    }

    #[test]
    fn a_growing_queue_fails_and_noise_does_not() {
        let samples = run(flat, |t| t / 10_000.0);
        let checks = verdict(
            &samples,
            600.0,
            800,
            Some(&all_answered()),
            &Rules::STANDARD,
        );
        assert_eq!(failed(&checks), ["no growing queue"], "{checks:#?}");
        // Doubling from 0.4 to 0.8 ms is below the 5 ms noise floor.
        let samples = run(flat, |t| if t < 400.0 { 0.0004 } else { 0.0008 });
        let checks = verdict(
            &samples,
            600.0,
            800,
            Some(&all_answered()),
            &Rules::STANDARD,
        );
        assert!(failed(&checks).is_empty(), "{checks:#?}");
        // Dropped frames fail it too.
        let mut samples = run(flat, |_| 0.0004);
        samples.last_mut().unwrap().dropped = 3.0;
        let checks = verdict(
            &samples,
            600.0,
            800,
            Some(&all_answered()),
            &Rules::STANDARD,
        );
        assert_eq!(failed(&checks), ["no growing queue"], "{checks:#?}");
    }

    #[test]
    fn errors_lost_sessions_and_unanswered_bursts_fail() {
        let mut samples = run(flat, |_| 0.0004);
        samples.last_mut().unwrap().errors = 1.0;
        samples[30].active = 799.0;
        let mut client = all_answered();
        client.answered -= 2;
        client.unanswered = 2;
        let checks = verdict(&samples, 600.0, 800, Some(&client), &Rules::STANDARD);
        assert_eq!(
            failed(&checks),
            ["sessions held", "zero errors", "every burst answered"],
            "{checks:#?}"
        );
        let checks = verdict(&run(flat, |_| 0.0), 600.0, 800, None, &Rules::STANDARD);
        assert_eq!(failed(&checks), ["zero errors", "every burst answered"]);
    }

    #[test]
    fn samples_after_the_run_and_too_short_runs() {
        // The wind-down after the run (sessions closing) is not judged...
        let mut samples = run(flat, |_| 0.0004);
        for s in samples.iter_mut().filter(|s| s.t > 500.0) {
            s.active = 10.0;
            s.rss_kb = 50_000;
        }
        let checks = verdict(
            &samples,
            500.0,
            800,
            Some(&all_answered()),
            &Rules::STANDARD,
        );
        assert!(failed(&checks).is_empty(), "{checks:#?}");
        // ...and a run with too few samples after its warm-up cannot pass.
        let checks = verdict(
            &samples[..14],
            140.0,
            800,
            Some(&all_answered()),
            &Rules::STANDARD,
        );
        assert!(failed(&checks).contains(&"rss flat"), "{checks:#?}");
        // The fast rules (a warm-up of 10 % of the run) judge a short run.
        let samples = run(|_| 200_000, |_| 0.0004);
        let checks = verdict(
            &samples[..14],
            140.0,
            800,
            Some(&all_answered()),
            &Rules::FAST,
        );
        assert!(failed(&checks).is_empty(), "{checks:#?}");
    }

    #[test]
    fn gauges_are_read_from_their_type_lines() {
        let text = "# TYPE voxgate_sessions_active gauge\n\
                    voxgate_sessions_active{door=\"xiaozhi\"} 800\n\
                    # TYPE voxgate_turns_total counter\nvoxgate_turns_total{door=\"xiaozhi\"} 5\n\
                    # TYPE voxgate_scheduling_delay_seconds gauge\n\
                    voxgate_scheduling_delay_seconds 0.0012\n";
        assert_eq!(
            gauges(text),
            [
                (
                    "voxgate_sessions_active{door=\"xiaozhi\"}".to_owned(),
                    800.0
                ),
                ("voxgate_scheduling_delay_seconds".to_owned(), 0.0012),
            ]
        );
        assert!(queue_like("voxgate_scheduling_delay_seconds"));
        assert!(!queue_like("voxgate_sessions_active{door=\"xiaozhi\"}"));
    }
}
