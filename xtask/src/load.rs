//! Load test of the Xiaozhi door: N concurrent streaming device sessions against the real
//! server (release builds), reporting CPU per session, memory per session and dropped frames.
//! With `--webrtc`, N concurrent WebRTC sessions on the VIP door instead (docs/webrtc.md#load),
//! reporting late RTP packets and how busy the whole machine was at its busiest.
//!
//! The server runs on `127.0.0.1` with a free port and the embedded defaults (demo agent, no
//! ASR, embedded TTS); `voxgate-client load xiaozhi` opens the sessions from one process, each
//! streaming real Opus at real time. The server's CPU time (`/proc/PID/stat` utime+stime) and
//! RSS (`/proc/PID/status` VmRSS) are sampled every second; the figures are taken over the
//! window in which every session is up (after the ramp, before the first session ends).

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::util;

/// Options of `cargo xtask load`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Concurrent device sessions.
    #[arg(long, default_value_t = 200)]
    sessions: usize,
    /// Seconds each session streams.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Seconds over which the sessions start.
    #[arg(long, default_value_t = 10.0)]
    ramp: f64,
    /// Speech to stream (default: the audio crate's speech fixture).
    #[arg(long)]
    wav: Option<PathBuf>,
    /// Use the release binaries already built (skip `cargo build --release`).
    #[arg(long)]
    no_build: bool,
    /// Measure this server binary instead of the workspace's release build (implies nothing is
    /// built for it).
    #[arg(long)]
    server_bin: Option<PathBuf>,
    /// Use this client binary instead of the workspace's release build.
    #[arg(long)]
    client_bin: Option<PathBuf>,
    /// Build the server with the `libopus` feature (bundled libopus, needs cmake) so the
    /// door's codecs run on libopus instead of the pure-Rust backend.
    #[arg(long)]
    libopus: bool,
    /// WebRTC sessions on the VIP door (`voxgate-client load webrtc`) instead of Xiaozhi
    /// devices: each streams the WAV once and hears the reply (`--seconds` is not used).
    #[arg(long)]
    webrtc: bool,
}

/// Goals from the issue.
const CPU_GOAL_PERCENT: f64 = 1.0;
const MEMORY_GOAL_KB: f64 = 200.0;

struct Sample {
    at: Instant,
    cpu_ticks: u64,
    rss_kb: u64,
}

pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    if !args.webrtc && args.seconds as f64 <= args.ramp + 2.0 {
        bail!("--seconds must exceed --ramp by more than 2 s, so all sessions overlap");
    }
    if !args.no_build {
        let mut build = util::cargo();
        build.args([
            "build",
            "--release",
            "-p",
            "voxgate-server-bin",
            "-p",
            "voxgate-client",
        ]);
        if args.libopus {
            build.args(["--features", "voxgate-server-bin/libopus"]);
        }
        util::run(&mut build)?;
    }
    let (server_bin, client_bin, wav) = util::release_inputs(
        args.server_bin.as_ref(),
        args.client_bin.as_ref(),
        args.wav.as_ref(),
    );
    let ticks_per_second = clock_ticks()?;

    let backend = if args.libopus { "libopus" } else { "pure" };
    let (mut server, addr) = start_server(&server_bin, backend, args.webrtc)?;
    let result = if args.webrtc {
        measure_webrtc(args, &client_bin, &wav, &server, addr, ticks_per_second)
    } else {
        measure(args, &client_bin, &wav, &server, addr, ticks_per_second)
    };
    // Our own child, by handle.
    let _ = server.kill();
    let _ = server.wait();
    result
}

fn measure(
    args: &Args,
    client_bin: &Path,
    wav: &Path,
    server: &Child,
    addr: SocketAddr,
    ticks_per_second: u64,
) -> anyhow::Result<()> {
    let pid = server.id();
    std::thread::sleep(Duration::from_millis(500));
    let baseline = sample(pid)?;
    let url = format!("ws://{addr}/xiaozhi/v1/");
    let mut client_cmd = Command::new(client_bin);
    client_cmd.args([
        "load",
        "xiaozhi",
        &url,
        "--sessions",
        &args.sessions.to_string(),
        "--seconds",
        &args.seconds.to_string(),
        "--ramp",
        &args.ramp.to_string(),
        "--wav",
    ]);
    client_cmd.arg(wav);
    eprintln!("$ {}", util::describe(&client_cmd));
    let started = Instant::now();
    let mut client = client_cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting voxgate-client")?;

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

    // CPU over the window where every session is up.
    let in_window: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.at >= window_start && s.at <= window_end)
        .collect();
    let (Some(first), Some(last)) = (in_window.first(), in_window.last()) else {
        bail!("no samples in the steady window (is --seconds long enough?)");
    };
    let n = args.sessions.max(1) as f64;
    let wall = last.at.duration_since(first.at).as_secs_f64().max(0.001);
    let cpu_seconds = (last.cpu_ticks - first.cpu_ticks) as f64 / ticks_per_second as f64;
    let cpu_total_percent = cpu_seconds / wall * 100.0;
    let cpu_per_session = cpu_total_percent / n;
    let peak_rss = in_window.iter().map(|s| s.rss_kb).max().unwrap_or(0);
    let mean_rss = in_window.iter().map(|s| s.rss_kb).sum::<u64>() as f64 / in_window.len() as f64;
    let kb_per_session = (mean_rss - baseline.rss_kb as f64) / n;
    let peak_kb_per_session = (peak_rss as f64 - baseline.rss_kb as f64) / n;
    let whole_cpu = (after.cpu_ticks - baseline.cpu_ticks) as f64 / ticks_per_second as f64;

    let client_late = summary["late_frames"].as_u64().unwrap_or(0);
    let report = serde_json::json!({
        "sessions": args.sessions,
        "seconds": args.seconds,
        "ramp_seconds": args.ramp,
        "steady_window_seconds": wall,
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
            "sessions_active_mid_window": active_during,
            "sessions_active_after": active_after,
            "dropped_frames_total": dropped,
            "dropped_frames_uplink": dropped_up,
            "dropped_frames_downlink": dropped_down,
            "opus_backend": if args.libopus { "libopus" } else { "pure" },
        },
        "client": summary,
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    let verdict = |ok: bool| if ok { "ok" } else { "MISSED" };
    eprintln!(
        "== load: {} sessions x {} s (steady window {wall:.1} s)",
        args.sessions, args.seconds
    );
    eprintln!(
        "   server CPU per session: {cpu_per_session:.3} % of one core (total {cpu_total_percent:.1} %) [goal < {CPU_GOAL_PERCENT} %: {}]",
        verdict(cpu_per_session < CPU_GOAL_PERCENT)
    );
    eprintln!(
        "   server memory per session: {kb_per_session:.0} KB mean, {peak_kb_per_session:.0} KB peak (RSS {} -> {peak_rss} KB) [goal < {MEMORY_GOAL_KB} KB: {}]",
        baseline.rss_kb,
        verdict(peak_kb_per_session < MEMORY_GOAL_KB)
    );
    eprintln!(
        "   dropped frames: server {dropped} (uplink {dropped_up}, downlink {dropped_down}), client late {client_late}, client late sends {} [goal 0: {}]",
        summary["late_sends"],
        verdict(dropped == 0.0 && client_late == 0)
    );
    eprintln!(
        "   turns {} (min per session {}), frames sent {}, reply frames {}, sessions with errors {}",
        summary["turns"],
        summary["min_turns"],
        summary["frames_sent"],
        summary["reply_frames"],
        summary["sessions_with_errors"]
    );
    Ok(())
}

/// The WebRTC run: the client's own summary (it samples the server's CPU and memory), the
/// server's late frames, and the whole machine's busiest second (client and server share it).
fn measure_webrtc(
    args: &Args,
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
        .args(["--sessions", &args.sessions.to_string()])
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
        "sessions": args.sessions,
        "ramp_seconds": args.ramp,
        "opus_backend": if args.libopus { "libopus" } else { "pure" },
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
        args.sessions,
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
        verdict(n("late_packets") == 0 && n("sessions_ok") == args.sessions as u64)
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
fn client_summary(client: &mut Child) -> anyhow::Result<serde_json::Value> {
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
struct MachineTicks {
    /// Not idle (steal included: the VM wanted the CPU).
    busy: u64,
    total: u64,
    /// Taken by the hypervisor for other guests.
    steal: u64,
}

fn machine_ticks() -> anyhow::Result<MachineTicks> {
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

/// Starts the release server on a free loopback port; returns it and the address it logged.
/// For WebRTC the synthesizer is the `tone` provider: the embedded one runs an `espeak-ng`
/// process per sentence, whose CPU is not the server's and would crowd the machine.
fn start_server(
    bin: &Path,
    opus_backend: &str,
    webrtc: bool,
) -> anyhow::Result<(Child, SocketAddr)> {
    let mut cmd = Command::new(bin);
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
        .env("VOXGATE_MAX_HANDSHAKES_PER_SEC_PER_IP", "0")
        .env("VOXGATE_MAX_SCHEDULING_DELAY_MS", "0")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    eprintln!("$ {}", util::describe(&cmd));
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
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

fn clock_ticks() -> anyhow::Result<u64> {
    let out = util::output(Command::new("getconf").arg("CLK_TCK"))?;
    out.trim().parse().context("CLK_TCK")
}

fn sample(pid: u32) -> anyhow::Result<Sample> {
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
    let rss_kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Ok(Sample {
        at,
        cpu_ticks,
        rss_kb,
    })
}

/// The sum of a Prometheus metric's samples (all label sets) from `/metrics`.
fn metric(addr: SocketAddr, name: &str) -> anyhow::Result<f64> {
    Ok(sum_metric(&metrics(addr)?, name, ""))
}

/// The server's `/metrics` text.
fn metrics(addr: SocketAddr) -> anyhow::Result<String> {
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
fn sum_metric(text: &str, name: &str, labels: &str) -> f64 {
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
