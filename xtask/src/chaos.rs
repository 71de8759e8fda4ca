//! Chaos test of admission control, lifecycle timeouts and peer cost against the real server
//! (release builds): admitted streaming sessions, a flood of upgrades over capacity, slowloris,
//! peers that never initialize, stop reading or die, and five attacks on what one anonymous
//! peer can make the server spend (a long spoken reply, a perception-event flood, idle
//! keep-alive connections, a WebRTC candidate flood, parked Retell calls). Prints one table.
//!
//! The server runs on `127.0.0.1` with a free port, the embedded defaults and limits set from
//! the flags through its environment (`VOXGATE_MAX_SESSIONS` just above the admitted sessions,
//! short init/ping/write timeouts so the checks finish quickly). `voxgate-client chaos` does
//! all the socket work and prints a JSON report, which this turns into the table. Every phase
//! is bounded; the default run takes about two minutes after the build, `--quick` about 50 s.

use std::io::{BufRead as _, BufReader, Read as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::util;

/// Options of `cargo xtask chaos`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// A short run for CI: 20 sessions, 500 attempts, 50 slow connections, smaller attacks,
    /// about 50 s.
    #[arg(long)]
    quick: bool,
    /// Admitted streaming Xiaozhi sessions [default: 100, quick 20].
    #[arg(long)]
    sessions: Option<usize>,
    /// Admitted realtime sessions measuring ping round trips.
    #[arg(long, default_value_t = 4)]
    probes: usize,
    /// Upgrade attempts in the flood [default: 5000, quick 500].
    #[arg(long)]
    attempts: Option<usize>,
    /// Flood attempts in flight at once.
    #[arg(long, default_value_t = 256)]
    concurrency: usize,
    /// Loopback source addresses for the flood and slowloris (127.0.0.2 onwards).
    #[arg(long, default_value_t = 4)]
    sources: u8,
    /// Slowloris connections [default: 200, quick 50].
    #[arg(long)]
    slow: Option<usize>,
    /// Free session slots above the admitted sessions: the flood may take them (and holds
    /// them until it ends); afterwards the five timeout checks need them.
    #[arg(long, default_value_t = 5)]
    headroom: usize,
    /// The server's `max_sessions` [default: sessions + probes + headroom].
    #[arg(long)]
    max_sessions: Option<usize>,
    /// The server's `max_sessions_per_ip` (0: off, so the capacity limit is what is measured).
    #[arg(long, default_value_t = 0)]
    max_sessions_per_ip: usize,
    /// The server's `max_handshakes_per_sec_per_ip` (0: off, likewise; set it to see 429s).
    #[arg(long, default_value_t = 0)]
    max_handshakes_per_sec_per_ip: usize,
    /// The server's `max_scheduling_delay_ms` overload guard [default: the server's].
    #[arg(long)]
    max_scheduling_delay_ms: Option<u64>,
    /// The server's init timeout, seconds.
    #[arg(long, default_value_t = 2)]
    init_timeout: u64,
    /// The server's header timeout (first request head of a connection), seconds: slowloris
    /// connections are dropped after it.
    #[arg(long, default_value_t = 2)]
    header_timeout: u64,
    /// The server's idle timeout for HTTP connections with no request in flight, seconds.
    #[arg(long, default_value_t = 5)]
    http_idle_timeout: u64,
    /// The server's request body timeout, seconds (dripped bodies are answered 408 after it).
    #[arg(long, default_value_t = 5)]
    body_timeout: u64,
    /// The server's `max_connections_per_ip` [default: its own, 128, or sessions + probes +
    /// 16 if that is larger: every admitted session holds a socket from 127.0.0.1].
    #[arg(long)]
    max_connections_per_ip: Option<usize>,
    /// The server's ping interval, seconds.
    #[arg(long, default_value_t = 1)]
    ping_interval: u64,
    /// The server's write timeout, seconds.
    #[arg(long, default_value_t = 2)]
    write_timeout: u64,
    /// The server's idle timeout, seconds (long: the dead peer must be found by pings).
    #[arg(long, default_value_t = 60)]
    idle_timeout: u64,
    /// Seconds over which the sessions start [default: 5, quick 2].
    #[arg(long)]
    ramp: Option<f64>,
    /// Seconds of baseline before the flood [default: 15, quick 4].
    #[arg(long)]
    before: Option<f64>,
    /// Seconds the flood is spread over [default: 15, quick 4].
    #[arg(long)]
    flood_seconds: Option<f64>,
    /// Seconds slowloris lasts [default: 10, quick 4].
    #[arg(long)]
    slow_seconds: Option<f64>,
    /// The longest each timeout check waits, seconds [default: 12, quick 8].
    #[arg(long)]
    check_limit: Option<f64>,
    /// The attack phases (comma-separated: long-reply, perception, idle-connections,
    /// candidates, parked-calls; `none` for none) [default: all].
    #[arg(long)]
    attacks: Option<String>,
    /// Idle keep-alive connections from one address [default: 1000, quick 200].
    #[arg(long)]
    idle_connections: Option<usize>,
    /// `WEBRTC_ICE_CANDIDATE` messages per bridge socket (4 sockets) [default: 25000, quick
    /// 5000].
    #[arg(long)]
    candidates: Option<usize>,
    /// Retell calls parked with 8 MiB of `call_details` metadata [default: 10, quick 3].
    #[arg(long)]
    parked_calls: Option<usize>,
    /// Speech the sessions stream (default: the audio crate's speech fixture).
    #[arg(long)]
    wav: Option<PathBuf>,
    /// Also write the client's JSON report here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Use the release binaries already built (skip `cargo build --release`).
    #[arg(long)]
    no_build: bool,
    /// Test this server binary instead of the workspace's release build.
    #[arg(long)]
    server_bin: Option<PathBuf>,
    /// Use this client binary instead of the workspace's release build.
    #[arg(long)]
    client_bin: Option<PathBuf>,
}

/// The run's settings after `--quick` and the defaults are applied.
struct Plan {
    sessions: usize,
    attempts: usize,
    slow: usize,
    max_sessions: usize,
    max_connections_per_ip: usize,
    ramp: f64,
    before: f64,
    flood_seconds: f64,
    slow_seconds: f64,
    check_limit: f64,
    long_reply_seconds: f64,
    perception_devices: usize,
    perception_names: usize,
    idle_connections: usize,
    idle_seconds: f64,
    candidates: usize,
    parked_calls: usize,
}

/// The server's default `max_connections_per_ip`.
const SERVER_CONNECTIONS_PER_IP: usize = 128;
/// Sockets 127.0.0.1 holds besides the admitted sessions at any moment: the timeout checks
/// and the slowloris phase's fresh device (6), an attack's sessions (at most 4 bridge
/// sockets), `/health` and `/metrics` requests.
const LOCAL_EXTRA: usize = 16;
/// Bytes of the long reply's text: near the realtime door's 64 KiB message limit.
const LONG_REPLY_BYTES: usize = 60_000;
/// Bytes of `data` in the refused and the accepted perception events.
const PERCEPTION_BIG: usize = 60_000;
/// As [`PERCEPTION_BIG`], the accepted ones.
const PERCEPTION_SMALL: usize = 4_000;
/// Connections dripping a second head, and as many dripping a body, in the idle phase.
const IDLE_DRIPS: usize = 4;
/// Gemini bridge sockets in the candidate flood.
const GEMINI_SOCKETS: usize = 4;
/// Bytes of each parked call's metadata (the Retell door's frames may be 16 MiB).
const PARKED_BYTES: usize = 8 << 20;

impl Plan {
    fn new(a: &Args) -> Self {
        let q = |quick: f64, full: f64| if a.quick { quick } else { full };
        let sessions = a.sessions.unwrap_or(if a.quick { 20 } else { 100 });
        Self {
            sessions,
            attempts: a.attempts.unwrap_or(if a.quick { 500 } else { 5000 }),
            slow: a.slow.unwrap_or(if a.quick { 50 } else { 200 }),
            max_sessions: a.max_sessions.unwrap_or(sessions + a.probes + a.headroom),
            max_connections_per_ip: a
                .max_connections_per_ip
                .unwrap_or((sessions + a.probes + LOCAL_EXTRA).max(SERVER_CONNECTIONS_PER_IP)),
            ramp: a.ramp.unwrap_or(q(2.0, 5.0)),
            before: a.before.unwrap_or(q(4.0, 15.0)),
            flood_seconds: a.flood_seconds.unwrap_or(q(4.0, 15.0)),
            slow_seconds: a.slow_seconds.unwrap_or(q(4.0, 10.0)),
            check_limit: a.check_limit.unwrap_or(q(8.0, 12.0)),
            long_reply_seconds: q(3.0, 5.0),
            perception_devices: if a.quick { 4 } else { 16 },
            perception_names: if a.quick { 16 } else { 64 },
            idle_connections: a
                .idle_connections
                .unwrap_or(if a.quick { 200 } else { 1000 }),
            idle_seconds: q(6.0, 12.0),
            candidates: a.candidates.unwrap_or(if a.quick { 5000 } else { 25_000 }),
            parked_calls: a.parked_calls.unwrap_or(if a.quick { 3 } else { 10 }),
        }
    }
}

pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let plan = Plan::new(args);
    if !args.no_build && (args.server_bin.is_none() || args.client_bin.is_none()) {
        util::run(util::cargo().args([
            "build",
            "--release",
            "-p",
            "voxgate-server-bin",
            "-p",
            "voxgate-client",
        ]))?;
    }
    let (server_bin, client_bin, wav) = util::release_inputs(
        args.server_bin.as_ref(),
        args.client_bin.as_ref(),
        args.wav.as_ref(),
    );

    let env = server_env(args, &plan);
    let (mut server, addr, warnings) = start_server(&server_bin, &env)?;
    let result = chaos(args, &plan, &client_bin, &wav, &server, addr);
    // Our own child, by handle.
    let _ = server.kill();
    let _ = server.wait();
    let report = result?;
    let warned = warnings.load(Ordering::Relaxed);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    println!("{}", table(args, &plan, &env, &report, warned));
    Ok(())
}

/// The server's environment: limits from the flags, plus the Xiaozhi door's own hello and
/// idle timeouts (which it honours until the shared lifecycle limits replace them).
fn server_env(a: &Args, p: &Plan) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("VOXGATE_MAX_SESSIONS", p.max_sessions.to_string()),
        ("VOXGATE_MAX_SESSIONS_PER_DOOR", p.max_sessions.to_string()),
        (
            "VOXGATE_MAX_SESSIONS_PER_IP",
            a.max_sessions_per_ip.to_string(),
        ),
        (
            "VOXGATE_MAX_HANDSHAKES_PER_SEC_PER_IP",
            a.max_handshakes_per_sec_per_ip.to_string(),
        ),
        // Sessions, probes and checks all come from 127.0.0.1, so the cap is at least what
        // they hold; the idle-connections attack comes from another address and meets it.
        (
            "VOXGATE_MAX_CONNECTIONS_PER_IP",
            p.max_connections_per_ip.to_string(),
        ),
        ("VOXGATE_HEADER_TIMEOUT_SECS", a.header_timeout.to_string()),
        (
            "VOXGATE_HTTP_IDLE_TIMEOUT_SECS",
            a.http_idle_timeout.to_string(),
        ),
        ("VOXGATE_BODY_TIMEOUT_SECS", a.body_timeout.to_string()),
        ("VOXGATE_INIT_TIMEOUT_SECS", a.init_timeout.to_string()),
        ("VOXGATE_IDLE_TIMEOUT_SECS", a.idle_timeout.to_string()),
        ("VOXGATE_PING_INTERVAL_SECS", a.ping_interval.to_string()),
        ("VOXGATE_WRITE_TIMEOUT_SECS", a.write_timeout.to_string()),
        ("VOXGATE_SHUTDOWN_GRACE_SECS", "1".to_owned()),
        // The candidate flood uses `/gemini` on the main listener; the Gemini door's own
        // listener (port 3001) stays closed, so the run goes on beside another server.
        ("VOXGATE_GEMINI_LISTEN", "off".to_owned()),
        (
            "VOXGATE_XIAOZHI_HELLO_TIMEOUT_MS",
            (a.init_timeout * 1000).to_string(),
        ),
        (
            "VOXGATE_XIAOZHI_IDLE_TIMEOUT_SECS",
            a.idle_timeout.to_string(),
        ),
    ];
    if let Some(ms) = a.max_scheduling_delay_ms {
        env.push(("VOXGATE_MAX_SCHEDULING_DELAY_MS", ms.to_string()));
    }
    env
}

fn chaos(
    a: &Args,
    p: &Plan,
    client_bin: &Path,
    wav: &Path,
    server: &Child,
    addr: SocketAddr,
) -> anyhow::Result<Value> {
    let mut cmd = Command::new(client_bin);
    cmd.arg("chaos")
        .arg(addr.to_string())
        .arg("--wav")
        .arg(wav)
        .args(["--sessions", &p.sessions.to_string()])
        .args(["--probes", &a.probes.to_string()])
        .args(["--ramp", &p.ramp.to_string()])
        .args(["--before", &p.before.to_string()])
        .args(["--attempts", &p.attempts.to_string()])
        .args(["--concurrency", &a.concurrency.to_string()])
        .args(["--flood-seconds", &p.flood_seconds.to_string()])
        .args(["--sources", &a.sources.to_string()])
        .args(["--slow", &p.slow.to_string()])
        .args(["--slow-seconds", &p.slow_seconds.to_string()])
        .args(["--check-limit", &p.check_limit.to_string()])
        .args(["--server-pid", &server.id().to_string()])
        .args(["--long-reply-bytes", &LONG_REPLY_BYTES.to_string()])
        .args(["--long-reply-seconds", &p.long_reply_seconds.to_string()])
        .args(["--perception-devices", &p.perception_devices.to_string()])
        .args(["--perception-names", &p.perception_names.to_string()])
        .args(["--perception-big-bytes", &PERCEPTION_BIG.to_string()])
        .args(["--perception-small-bytes", &PERCEPTION_SMALL.to_string()])
        .args(["--idle-connections", &p.idle_connections.to_string()])
        .args(["--idle-drips", &IDLE_DRIPS.to_string()])
        .args(["--idle-seconds", &p.idle_seconds.to_string()])
        .args(["--gemini-sockets", &GEMINI_SOCKETS.to_string()])
        .args(["--candidates", &p.candidates.to_string()])
        .args(["--parked-calls", &p.parked_calls.to_string()])
        .args(["--parked-bytes", &PARKED_BYTES.to_string()]);
    if let Some(attacks) = &a.attacks {
        cmd.args(["--attacks", attacks]);
    }
    eprintln!("$ {}", util::describe(&cmd));
    let mut client = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting voxgate-client")?;
    let mut out = String::new();
    client
        .stdout
        .take()
        .context("client stdout")?
        .read_to_string(&mut out)?;
    let status = client.wait()?;
    if !status.success() {
        bail!("voxgate-client chaos failed with {status}");
    }
    out.lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .context("the client printed no report")
}

/// Starts the release server on a free loopback port with `env`; returns it, its address and
/// a count of the warnings it logged (the first few are echoed).
fn start_server(
    bin: &Path,
    env: &[(&'static str, String)],
) -> anyhow::Result<(Child, SocketAddr, Arc<AtomicU64>)> {
    let mut cmd = Command::new(bin);
    cmd.args(["--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "warn")
        // The embedded defaults as they are: no model download or voice switch mid-run.
        .env("VOXGATE_MODELS_AUTO_INSTALL", "false")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    eprintln!("$ {}", util::describe(&cmd));
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let stderr = child.stderr.take().context("server stderr")?;
    let (tx, rx) = mpsc::channel();
    let warnings = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&warnings);
    // Keep draining the server's log so it never blocks on a full pipe; a flood may make it
    // warn thousands of times, so only the first few lines are shown.
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if !sent && let Some(addr) = line.split("listening on http://").nth(1) {
                let _ = tx.send(addr.trim().to_owned());
                sent = true;
            } else if (line.contains("ERROR") || line.contains("WARN"))
                && counted.fetch_add(1, Ordering::Relaxed) < 10
            {
                eprintln!("server: {line}");
            }
        }
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(addr) => Ok((
            child,
            addr.parse()
                .with_context(|| format!("server address {addr}"))?,
            warnings,
        )),
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            bail!("the server did not report its address within 20 s")
        }
    }
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

/// `p50 / p99 ms (n)` of a latency object.
fn lat(v: &Value) -> String {
    if v["n"].as_u64().unwrap_or(0) == 0 {
        return "no samples".into();
    }
    format!(
        "{:.1} / {:.1} ms (n={})",
        num(&v["p50"]),
        num(&v["p99"]),
        v["n"]
    )
}

fn secs_or(v: &Value) -> String {
    v.as_f64()
        .map_or_else(|| "-".to_owned(), |s| format!("{s:.1} s"))
}

/// The report as one Markdown table: measured against what the configuration promises.
fn table(
    a: &Args,
    p: &Plan,
    env: &[(&'static str, String)],
    r: &Value,
    server_warnings: u64,
) -> String {
    let f = &r["flood"];
    let s = &r["slowloris"];
    let status = |code: &str| f["by_status"][code].as_u64().unwrap_or(0);
    let (s503, s429, s101) = (status("503"), status("429"), status("101"));
    let others: Vec<String> = f["by_status"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| !matches!(k.as_str(), "503" | "429" | "101"))
        .map(|(k, v)| format!("{k}: {v}"))
        .collect();
    let errors: Vec<String> = f["errors"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}: {v}"))
        .collect();
    let refused = s503 + s429;
    let free = (p.max_sessions as f64 - num(&f["sessions_open_before"])).max(0.0);
    let reasons: Vec<String> = r["refused_by_reason"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k} {}", num(v)))
        .collect();
    let phase = |name: &str, key: &str| -> String {
        ["before", "during_flood", "during_slowloris"]
            .iter()
            .map(|ph| lat(&r[*ph][key]))
            .collect::<Vec<_>>()
            .join(" → ")
            + &format!(" ({name})")
    };
    let sum = |key: &str| -> f64 {
        ["before", "during_flood", "during_slowloris"]
            .iter()
            .map(|ph| num(&r[*ph][key]))
            .sum()
    };
    let per_phase = |key: &str| -> String {
        ["before", "during_flood", "during_slowloris"]
            .iter()
            .map(|ph| num(&r[*ph][key]).to_string())
            .collect::<Vec<_>>()
            .join(" / ")
    };
    let opt = |v: &Value| v.as_u64().map_or_else(|| "-".to_owned(), |n| n.to_string());
    let fresh = s["fresh_session_ms"].as_f64().map_or_else(
        || {
            format!(
                "REFUSED ({})",
                s["fresh_session_error"].as_str().unwrap_or("?")
            )
        },
        |ms| format!("admitted, greeted in {ms:.0} ms"),
    );
    let mut rows: Vec<[String; 3]> = vec![
        [
            "admitted sessions (Xiaozhi streaming + realtime ping)".into(),
            format!(
                "{}/{} + {}/{}",
                r["connected"], r["sessions"], r["probes_connected"], r["probes"]
            ),
            "all".into(),
        ],
        [
            "server limits".into(),
            format!(
                "max_sessions {}, per IP {}, handshakes/s/IP {}, connections/IP {} (0: off); \
                 header {} s, HTTP idle {} s, body {} s",
                p.max_sessions,
                a.max_sessions_per_ip,
                a.max_handshakes_per_sec_per_ip,
                p.max_connections_per_ip,
                a.header_timeout,
                a.http_idle_timeout,
                a.body_timeout
            ),
            String::new(),
        ],
        [
            "flood attempts".into(),
            format!(
                "{} in {:.1} s ({} in flight, {} source addresses, {} started late)",
                f["attempts"],
                num(&f["seconds"]),
                a.concurrency,
                a.sources.max(1),
                f["late_starts"]
            ),
            format!("{} (0 late)", p.attempts),
        ],
        [
            "refused 503 / 429".into(),
            format!("{s503} / {s429} ({refused} total)"),
            format!(
                "{} (all but the free slots)",
                (p.attempts as f64 - free).max(0.0)
            ),
        ],
        [
            "admitted over capacity (101)".into(),
            format!("{s101} ({free} slots were free)"),
            format!("≤ {free}"),
        ],
        [
            "refusals with Retry-After".into(),
            format!("{}/{refused}", f["retry_after"]),
            "all".into(),
        ],
        [
            "other statuses / no response".into(),
            format!(
                "{} / {}",
                if others.is_empty() {
                    "none".into()
                } else {
                    others.join(", ")
                },
                if errors.is_empty() {
                    "none".into()
                } else {
                    errors.join(", ")
                }
            ),
            "none / none".into(),
        ],
        [
            "refusal latency p50 / p99 / max".into(),
            if f["refusal_ms"]["n"].as_u64().unwrap_or(0) == 0 {
                "no refusals".into()
            } else {
                format!(
                    "{:.1} / {:.1} / {:.1} ms",
                    num(&f["refusal_ms"]["p50"]),
                    num(&f["refusal_ms"]["p99"]),
                    num(&f["refusal_ms"]["max"])
                )
            },
            "fast".into(),
        ],
        [
            "server refusals by reason (/metrics)".into(),
            if reasons.is_empty() {
                "none".into()
            } else {
                reasons.join(", ")
            },
            format!("{refused} in all"),
        ],
        [
            "turn latency p50 / p99: before → flood → slowloris".into(),
            phase("end of speech to first reply frame", "turn_ms"),
            "unchanged".into(),
        ],
        [
            "ping round trip p50 / p99: before → flood → slowloris".into(),
            phase("realtime Ping to Pong", "ping_ms"),
            "unchanged".into(),
        ],
        [
            "server dropped frames up + down: before / flood / slowloris".into(),
            format!(
                "{} + {} / {} + {} / {} + {} (whole run, timeout checks included: {})",
                num(&r["before"]["server_dropped_uplink"]),
                num(&r["before"]["server_dropped_downlink"]),
                num(&r["during_flood"]["server_dropped_uplink"]),
                num(&r["during_flood"]["server_dropped_downlink"]),
                num(&r["during_slowloris"]["server_dropped_uplink"]),
                num(&r["during_slowloris"]["server_dropped_downlink"]),
                num(&r["server_dropped_total"])
            ),
            "0".into(),
        ],
        [
            "client late frames / late sends: before / flood / slowloris".into(),
            format!(
                "{} ; {} (total {} ; {})",
                per_phase("late_frames"),
                per_phase("late_sends"),
                sum("late_frames"),
                sum("late_sends")
            ),
            "0".into(),
        ],
        [
            "server CPU: before / flood / slowloris".into(),
            ["before", "during_flood", "during_slowloris"]
                .iter()
                .map(|ph| cpu_share(&r[*ph]["server_cpu_secs"], &r[*ph]["seconds"]))
                .collect::<Vec<_>>()
                .join(" / "),
            "the flood and slowloris add little over before".into(),
        ],
        [
            "admitted sessions with errors".into(),
            format!(
                "{}{}",
                r["session_errors"],
                r["errors"]
                    .as_array()
                    .filter(|e| !e.is_empty())
                    .map(|e| format!(
                        " ({})",
                        e.iter()
                            .filter_map(Value::as_str)
                            .collect::<Vec<_>>()
                            .join("; ")
                    ))
                    .unwrap_or_default()
            ),
            "0".into(),
        ],
        [
            "slowloris: drip / silent connections, closed by server".into(),
            format!(
                "{} / {}, {} closed (first {}, last {}), {} failed to open, {} bytes dripped",
                s["drip"],
                s["silent"],
                s["closed_by_server"],
                secs_or(&s["first_close_secs"]),
                secs_or(&s["last_close_secs"]),
                s["open_failed"],
                s["bytes_dripped"]
            ),
            format!(
                "all closed ≈ {} s (header timeout), none holding a session slot",
                a.header_timeout
            ),
        ],
        [
            "slowloris: a fresh device meanwhile".into(),
            fresh,
            "admitted".into(),
        ],
        [
            "slowloris: server open files / RSS".into(),
            format!(
                "fds {} → {} → {} ; RSS {} → {} KB",
                opt(&s["server_fds_before"]),
                opt(&s["server_fds_during"]),
                opt(&s["server_fds_after"]),
                opt(&s["server_rss_kb_before"]),
                opt(&s["server_rss_kb_during"])
            ),
            "back to the baseline after".into(),
        ],
    ];
    let init = format!("≈ {} s (init timeout), 1008", a.init_timeout);
    for c in r["checks"].as_array().into_iter().flatten() {
        let name = c["name"].as_str().unwrap_or("?");
        let measured = match (c["closed_after_secs"].as_f64(), c["error"].as_str()) {
            (_, Some(e)) => format!("could not run: {e}"),
            (Some(t), None) => format!(
                "closed after {t:.2} s, code {}{} — {}",
                opt(&c["close_code"]),
                if c["pings"].as_u64().unwrap_or(0) > 0 {
                    format!(", after {} pings", c["pings"])
                } else {
                    String::new()
                },
                c["detail"].as_str().unwrap_or("")
            ),
            (None, None) => format!("NOT closed: {}", c["detail"].as_str().unwrap_or("")),
        };
        let goal = if name.starts_with("never initializes") {
            init.clone()
        } else if name.starts_with("stops reading") {
            format!("write timeout {} s after its buffers fill", a.write_timeout)
        } else if name.starts_with("dead peer") {
            format!(
                "≤ {} s (two missed pongs at {} s)",
                3 * a.ping_interval,
                a.ping_interval
            )
        } else {
            String::new()
        };
        rows.push([format!("timeout: {name}"), measured, goal]);
    }
    rows.extend(attack_rows(a, p, &r["attacks"]));
    rows.push([
        "server warnings logged".into(),
        server_warnings.to_string(),
        String::new(),
    ]);
    rows.push([
        "run length".into(),
        format!("{:.1} s", num(&r["seconds"])),
        if a.quick { "< 90 s" } else { "< 180 s" }.into(),
    ]);
    let mut out = format!(
        "== chaos{}: {}\n\n| | measured | expected |\n|---|---|---|\n",
        if a.quick { " --quick" } else { "" },
        env.iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    for [k, m, e] in rows {
        out.push_str(&format!("| {k} | {m} | {e} |\n"));
    }
    out
}

/// `p50 / p99 / max ms (n=…)` of a latency object.
fn lat3(v: &Value) -> String {
    if v["n"].as_u64().unwrap_or(0) == 0 {
        return "no samples".into();
    }
    format!(
        "{:.1} / {:.1} / {:.1} ms (n={})",
        num(&v["p50"]),
        num(&v["p99"]),
        num(&v["max"]),
        v["n"]
    )
}

/// `a → b → c` of one figure of a phase's before, peak and after samples, `-` where unread.
fn arrow(server: &Value, key: &str, scale: impl Fn(u64) -> String) -> String {
    ["before", "peak", "after"]
        .iter()
        .map(|at| server[*at][key].as_u64().map_or_else(|| "-".into(), &scale))
        .collect::<Vec<_>>()
        .join(" → ")
}

fn mb(kb: u64) -> String {
    format!("{:.1}", kb as f64 / 1024.0)
}

/// `k ×n, …` of a map of counts (`none` when empty).
fn counts(v: &Value) -> String {
    let parts: Vec<String> = v
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, n)| format!("{k} ×{n}"))
        .collect();
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

/// `c s in t s (p% of a core)` of CPU seconds over a phase's seconds, `-` where unread.
fn cpu_share(cpu: &Value, seconds: &Value) -> String {
    cpu.as_f64().map_or_else(
        || "-".to_owned(),
        |cpu| {
            let secs = num(seconds).max(0.001);
            format!(
                "{cpu:.2} s in {secs:.1} s ({:.0}% of a core)",
                100.0 * cpu / secs
            )
        },
    )
}

/// The row every attack has: the server's children, memory, descriptors and CPU.
fn usage_row(name: &str, c: &Value, expected: &str) -> [String; 3] {
    let sv = &c["server"];
    let cpu = cpu_share(&sv["cpu_secs"], &c["seconds"]);
    [
        format!("{name}: server children / RSS MB / fds (before → peak → after); CPU"),
        format!(
            "{} ; {} ; {} ; {cpu}",
            arrow(sv, "children", |n| n.to_string()),
            arrow(sv, "rss_kb", mb),
            arrow(sv, "fds", |n| n.to_string()),
        ),
        expected.into(),
    ]
}

/// The row every attack has: `/health` from a fresh connection and the admitted sessions.
fn latency_row(name: &str, c: &Value) -> [String; 3] {
    let failed = c["health_failed"].as_u64().unwrap_or(0);
    let refused: Vec<String> = c["refused_by_reason"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, n)| num(n) > 0.0)
        .map(|(k, n)| format!("{k} {}", num(n)))
        .collect();
    [
        format!("{name}: /health p50 / p99 / max; admitted turn, ping p50 / p99"),
        format!(
            "{} {}; turn {}; ping {}{}",
            lat3(&c["health_ms"]),
            if failed == 0 {
                "0 failed".to_owned()
            } else {
                format!("{failed} FAILED ({})", counts(&c["health_failures"]))
            },
            lat(&c["admitted"]["turn_ms"]),
            lat(&c["admitted"]["ping_ms"]),
            if refused.is_empty() {
                String::new()
            } else {
                format!("; sessions refused meanwhile: {}", refused.join(", "))
            }
        ),
        "/health fast, 0 failed; turn and ping as before".into(),
    ]
}

/// The attack phases' rows (those that ran).
fn attack_rows(a: &Args, p: &Plan, at: &Value) -> Vec<[String; 3]> {
    let mut rows = Vec::new();
    let l = &at["long_reply"];
    if l.is_object() {
        let spoken = format!(
            "{} audio chunks ({:.1} s of audio) in {:.1} s, first after {}{}{}",
            l["audio_chunks"],
            num(&l["audio_secs"]),
            num(&l["read_secs"]),
            l["first_audio_ms"]
                .as_f64()
                .map_or_else(|| "-".to_owned(), |ms| format!("{ms:.0} ms")),
            l["error"]
                .as_str()
                .map(|e| format!("; ERROR: {e}"))
                .unwrap_or_default(),
            l["server_errors"]
                .as_array()
                .filter(|e| !e.is_empty())
                .map(|e| format!("; server errors: {}", Value::Array(e.clone())))
                .unwrap_or_default()
        );
        rows.push([
            format!(
                "long reply: one {}-byte DirectSpeech, hosted TTS",
                l["text_bytes"]
            ),
            spoken,
            "spoken, paced by playback".into(),
        ]);
        let procs = if l["espeak_ng_on_path"].as_bool().unwrap_or(false) {
            format!("at most {} espeak-ng at once", l["espeak_ng_peak"])
        } else {
            format!(
                "espeak-ng is not on PATH: the embedded voice plays tones in-process \
                 ({} espeak-ng)",
                l["espeak_ng_peak"]
            )
        };
        rows.push([
            "long reply: synthesizer processes".into(),
            format!(
                "{procs}; children by name at most {}",
                counts(&l["server"]["children_peak_by_name"])
            ),
            "≤ max_synth_processes (server-wide: 2 per core, at least 4), none after".into(),
        ]);
        rows.push(usage_row("long reply", l, "children back to 0 after"));
        rows.push(latency_row("long reply", l));
    }
    let pe = &at["perception"];
    if pe.is_object() {
        let batch = |b: &Value| {
            format!(
                "{} requests, {:.1} MB sent in {:.1} s: {}{}",
                b["requests"],
                num(&b["bytes_sent"]) / 1e6,
                num(&b["seconds"]),
                counts(&b["by_status"]),
                if b["errors"].as_object().is_some_and(|e| !e.is_empty()) {
                    format!("; no response: {}", counts(&b["errors"]))
                } else {
                    String::new()
                }
            )
        };
        rows.push([
            format!(
                "perception flood: {} devices × {} names, {} B of data each",
                pe["devices"], pe["names"], pe["big"]["data_bytes"]
            ),
            batch(&pe["big"]),
            "413 for all".into(),
        ]);
        rows.push([
            format!(
                "perception: the same with {} B of data",
                pe["small"]["data_bytes"]
            ),
            batch(&pe["small"]),
            "200 for all".into(),
        ]);
        let rss = |v: &Value| v.as_u64().map_or_else(|| "-".into(), mb);
        rows.push([
            "perception: server RSS MB before → after the large → after the small → 3 s later"
                .into(),
            format!(
                "{} → {} → {} → {}",
                rss(&pe["server"]["before"]["rss_kb"]),
                rss(&pe["big"]["rss_kb_after"]),
                rss(&pe["small"]["rss_kb_after"]),
                rss(&pe["server"]["after"]["rss_kb"])
            ),
            "a few MB over before, at most (the bus keeps a bounded number of bytes)".into(),
        ]);
        rows.push(usage_row("perception", pe, "back near before"));
        rows.push(latency_row("perception", pe));
    }
    let id = &at["idle_connections"];
    if id.is_object() {
        let no_answer = if id["no_answer"].as_object().is_some_and(|e| !e.is_empty()) {
            format!("; no answer: {}", counts(&id["no_answer"]))
        } else {
            String::new()
        };
        rows.push([
            format!(
                "idle: {} keep-alive connections from {} (GET /health each, then idle)",
                id["connections"],
                id["source"].as_str().unwrap_or("?")
            ),
            format!(
                "{} opened in {:.1} s; answered {}{no_answer}",
                id["opened"],
                num(&id["open_secs"]),
                counts(&id["answered"])
            ),
            format!(
                "{} answered (connections/IP, the drips included), the rest 429",
                p.max_connections_per_ip
            ),
        ]);
        let kept: Vec<String> = id["kept_by_second"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|n| n.to_string())
            .collect();
        rows.push([
            format!(
                "idle: answered 200 and kept open by the server, each second for {:.0} s",
                p.idle_seconds
            ),
            format!(
                "{} ; {} closed by the server (after {} / {} / {}: first / median / last)",
                kept.join(" "),
                id["closed_by_server"],
                secs_or(&id["first_close_secs"]),
                secs_or(&id["median_close_secs"]),
                secs_or(&id["last_close_secs"])
            ),
            format!(
                "all closed ≈ {} s after their answer (header timeout: the wait for the next head)",
                a.header_timeout.min(a.http_idle_timeout)
            ),
        ]);
        let drips = |d: &Value| {
            format!(
                "{} closed of {} (after {} – {}), {} failed, {} bytes dripped, answers: {}",
                d["closed"],
                d["connections"],
                secs_or(&d["first_close_secs"]),
                secs_or(&d["last_close_secs"]),
                d["failed"],
                d["bytes_dripped"],
                counts(&d["statuses"])
            )
        };
        rows.push([
            "idle: dripping a second head, a byte a second".into(),
            drips(&id["head_drips"]),
            format!("closed ≈ {} s (header timeout)", a.header_timeout),
        ]);
        rows.push([
            "idle: dripping a body, a byte a second".into(),
            drips(&id["body_drips"]),
            format!("408 and closed ≈ {} s (body timeout)", a.body_timeout),
        ]);
        rows.push([
            "idle: /health from the attacking address, every 0.5 s".into(),
            counts(&id["same_address_health"]),
            "429 while the address holds its cap, 200 once its connections are closed".into(),
        ]);
        rows.push(usage_row("idle", id, "fds back to before"));
        rows.push(latency_row("idle", id));
    }
    let ca = &at["candidates"];
    if ca.is_object() {
        let closed = ca["closed_by_server"]
            .as_array()
            .filter(|c| !c.is_empty())
            .map(|c| format!("; closed by the server: {}", Value::Array(c.clone())))
            .unwrap_or_default();
        let errors = ca["errors"]
            .as_array()
            .filter(|e| !e.is_empty())
            .map(|e| format!("; ERRORS: {}", Value::Array(e.clone())))
            .unwrap_or_default();
        rows.push([
            format!(
                "candidate flood: {} Gemini bridge sockets × {} WEBRTC_ICE_CANDIDATE",
                ca["sockets"], p.candidates
            ),
            format!(
                "{} set up, {} offers answered; {} sent in {:.1} s; {} ignored by the server; \
                 replies: {}{closed}{errors}",
                ca["set_up"],
                ca["answered"],
                ca["candidates_sent"],
                num(&ca["send_secs"]),
                num(&ca["candidates_ignored"]),
                counts(&ca["replies"])
            ),
            "all sent; all but 32 a connection ignored, or dropped uncounted while the \
             connection's command queue is full"
                .into(),
        ]);
        let turns: Vec<String> = ca["turn_after_flood_secs"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| format!("{:.2} s", num(t)))
            .collect();
        rows.push([
            "candidate flood: a turn after it (SEND_MESSAGE → TURN_COMPLETE), each socket".into(),
            format!(
                "{} of {}{}",
                turns.len(),
                ca["sockets"],
                if turns.is_empty() {
                    String::new()
                } else {
                    format!(": {}", turns.join(", "))
                }
            ),
            "all, no slower than with `--candidates 0` (the candidates cost nothing later)".into(),
        ]);
        rows.push([
            "candidate flood: sessions refused for overload meanwhile".into(),
            num(&ca["refused_by_reason"]["overload"]).to_string(),
            "0".into(),
        ]);
        rows.push(usage_row("candidate flood", ca, "well under a core of CPU"));
        rows.push(latency_row("candidate flood", ca));
    }
    let pa = &at["parked_calls"];
    if pa.is_object() {
        let bytes = num(&pa["metadata_bytes"]);
        let calls = num(&pa["calls"]);
        rows.push([
            format!(
                "parked calls: {} Retell calls, call_details with {:.0} MiB of metadata, closed",
                pa["calls"],
                bytes / 1_048_576.0
            ),
            format!(
                "{}{}; {} listed as parked",
                counts(&pa["outcomes"]),
                match pa["refused_503"].as_u64().unwrap_or(0) {
                    0 => String::new(),
                    n => format!(" ({n} upgrades refused with 503 first, tried again)"),
                },
                pa["parked"]
                    .as_u64()
                    .map_or_else(|| "-".into(), |n| n.to_string())
            ),
            "parked for the resume window, each within its byte bound".into(),
        ]);
        let before = pa["server"]["before"]["rss_kb"].as_u64();
        let right_after = pa["rss_kb_right_after"].as_u64();
        rows.push([
            "parked calls: server RSS MB before → right after (within the resume window)".into(),
            match (before, right_after) {
                (Some(b), Some(a)) => format!(
                    "{} → {} ({:+.1} MB)",
                    mb(b),
                    mb(a),
                    (a as f64 - b as f64) / 1024.0
                ),
                _ => "-".into(),
            },
            format!(
                "≤ {calls:.0} MiB parked (1 MiB a call), plus one call's freed frame buffers the \
                 allocator keeps for reuse: about the same for 3 calls as for 10, not {:.0} MB",
                calls * bytes / 1_048_576.0
            ),
        ]);
        rows.push(usage_row(
            "parked calls",
            pa,
            "fds back to before; children only the admitted sessions' synthesizers; RSS as above",
        ));
        rows.push(latency_row("parked calls", pa));
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn args(extra: &[&str]) -> Args {
        Cli::parse_from(std::iter::once("chaos").chain(extra.iter().copied())).args
    }

    #[test]
    fn quick_shrinks_the_run_and_flags_still_win() {
        let full = Plan::new(&args(&[]));
        assert_eq!((full.sessions, full.attempts, full.slow), (100, 5000, 200));
        assert_eq!(full.max_sessions, 109);
        let quick = Plan::new(&args(&["--quick", "--attempts", "700"]));
        assert_eq!(
            (quick.sessions, quick.attempts, quick.max_sessions),
            (20, 700, 29)
        );
        // The whole quick run stays short: phases plus the longest check, then the attacks.
        let total = quick.ramp + 1.0 + quick.before + quick.flood_seconds + quick.slow_seconds;
        assert!(total + quick.check_limit < 35.0, "{total}");
        assert!(quick.long_reply_seconds + quick.idle_seconds < 10.0);
        assert_eq!(
            (quick.idle_connections, quick.candidates, quick.parked_calls),
            (200, 5000, 3)
        );
        assert_eq!(
            (full.idle_connections, full.candidates, full.parked_calls),
            (1000, 25_000, 10)
        );
        assert_eq!((full.perception_devices, full.perception_names), (16, 64));
    }

    #[test]
    fn the_attack_rows_read_the_report() {
        let a = args(&[]);
        let p = Plan::new(&a);
        let common = |cpu: f64| {
            serde_json::json!({
                "seconds": 4.0,
                "server": {"before": {"rss_kb": 40960, "fds": 117, "children": 0},
                           "peak": {"rss_kb": 51200, "fds": 1120, "children": 3},
                           "after": {"rss_kb": 41984, "fds": 118, "children": 0},
                           "cpu_secs": cpu, "children_peak_by_name": {"espeak-ng": 3}},
                "health_ms": {"n": 40, "p50": 0.4, "p99": 2.5, "max": 3.0},
                "health_failed": 2, "health_failures": {"no answer within 2 s": 2},
                "admitted": {"turn_ms": {"n": 5, "p50": 585.0, "p99": 600.0, "max": 600.0},
                             "ping_ms": {"n": 0}},
                "refused_by_reason": {"overload": 7.0},
            })
        };
        let with = |extra: Value, cpu: f64| {
            let mut v = common(cpu);
            v.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            v
        };
        let attacks = serde_json::json!({
            "long_reply": with(serde_json::json!({"text_bytes": 60000, "espeak_ng_on_path": true,
                "espeak_ng_peak": 3, "read_secs": 5.0, "audio_chunks": 40, "audio_secs": 4.2,
                "first_audio_ms": 85.0, "server_errors": [], "error": null}), 0.5),
            "perception": with(serde_json::json!({"devices": 16, "names": 64,
                "big": {"requests": 1024, "data_bytes": 60000, "bytes_sent": 61_500_000,
                        "seconds": 2.0, "by_status": {"413": 1024}, "errors": {},
                        "rss_kb_after": 43008},
                "small": {"requests": 1024, "data_bytes": 4000, "bytes_sent": 4_200_000,
                          "seconds": 1.0, "by_status": {"200": 1024}, "errors": {},
                          "rss_kb_after": 44032}}), 1.0),
            "idle_connections": with(serde_json::json!({"source": "127.0.1.1",
                "connections": 1000, "opened": 1000, "answered": {"200": 120, "429": 880},
                "no_answer": {}, "open_secs": 1.5, "kept_by_second": [120, 120, 0],
                "closed_by_server": 120, "first_close_secs": 2.0, "median_close_secs": 2.0,
                "last_close_secs": 2.1,
                "head_drips": {"connections": 4, "failed": 0, "closed": 4,
                               "first_close_secs": 2.0, "last_close_secs": 2.0,
                               "bytes_dripped": 8, "statuses": {}},
                "body_drips": {"connections": 4, "failed": 0, "closed": 4,
                               "first_close_secs": 5.0, "last_close_secs": 5.0,
                               "bytes_dripped": 20, "statuses": {"408": 4}},
                "same_address_health": {"200": 3, "429": 20}}), 0.2),
            "candidates": with(serde_json::json!({"sockets": 4, "set_up": 4, "answered": 4,
                "candidates_sent": 100000, "send_secs": 3.0, "replies": {},
                "turn_after_flood_secs": [0.25, 0.5, 1.0],
                "closed_by_server": [], "errors": [], "candidates_ignored": 99872.0}), 2.0),
            "parked_calls": with(serde_json::json!({"calls": 10, "metadata_bytes": 8388608,
                "outcomes": {"closed by us": 10}, "rss_kb_right_after": 46080,
                "parked": 10}), 0.3),
        });
        let rows = attack_rows(&a, &p, &attacks);
        let t: Vec<String> = rows.iter().map(|r| r.join(" | ")).collect();
        let t = t.join("\n");
        assert!(t.contains("at most 3 espeak-ng at once"), "{t}");
        assert!(
            t.contains("40 audio chunks (4.2 s of audio) in 5.0 s, first after 85 ms"),
            "{t}"
        );
        assert!(
            t.contains("0 → 3 → 0 ; 40.0 → 50.0 → 41.0 ; 117 → 1120 → 118"),
            "{t}"
        );
        assert!(t.contains("0.50 s in 4.0 s (12% of a core)"), "{t}");
        assert!(t.contains("2 FAILED (no answer within 2 s ×2)"), "{t}");
        assert!(
            t.contains("turn 585.0 / 600.0 ms (n=5); ping no samples"),
            "{t}"
        );
        assert!(
            t.contains("1024 requests, 61.5 MB sent in 2.0 s: 413 ×1024 | 413 for all"),
            "{t}"
        );
        assert!(t.contains("40.0 → 42.0 → 43.0 → 41.0"), "{t}");
        assert!(t.contains("answered 200 ×120, 429 ×880"), "{t}");
        assert!(t.contains("120 120 0 ; 120 closed by the server"), "{t}");
        assert!(
            t.contains(
                "4 closed of 4 (after 5.0 s – 5.0 s), 0 failed, 20 bytes dripped, answers: 408 ×4"
            ),
            "{t}"
        );
        assert!(t.contains("200 ×3, 429 ×20"), "{t}");
        assert!(t.contains("| 128 answered (connections/IP"), "{t}");
        assert!(
            t.contains("answers: 408 ×4 | 408 and closed ≈ 5 s (body timeout)"),
            "{t}"
        );
        assert!(t.contains("100000 sent in 3.0 s; 99872 ignored"), "{t}");
        assert!(t.contains("| 3 of 4: 0.25 s, 0.50 s, 1.00 s |"), "{t}");
        assert!(
            t.contains("sessions refused for overload meanwhile | 7 | 0"),
            "{t}"
        );
        assert!(
            t.contains("; sessions refused meanwhile: overload 7"),
            "{t}"
        );
        assert!(t.contains("closed by us ×10; 10 listed as parked"), "{t}");
        assert!(t.contains("40.0 → 45.0 (+5.0 MB)"), "{t}");
        assert!(t.contains("| ≤ 10 MiB parked (1 MiB a call)"), "{t}");
        assert!(
            t.contains("about the same for 3 calls as for 10, not 80 MB"),
            "{t}"
        );
        // A phase that did not run has no rows; espeak-ng missing is said.
        let only = serde_json::json!({"long_reply": with(serde_json::json!({
            "text_bytes": 60000, "espeak_ng_on_path": false, "espeak_ng_peak": 0,
            "error": "the server closed the session (1008)"}), 0.1)});
        let rows = attack_rows(&a, &p, &only);
        assert_eq!(rows.len(), 4);
        assert!(rows[0][1].contains("ERROR: the server closed the session (1008)"));
        assert!(
            rows[1][1].contains("espeak-ng is not on PATH"),
            "{:?}",
            rows[1]
        );
    }

    #[test]
    fn the_table_reads_the_report() {
        let a = args(&["--quick"]);
        let p = Plan::new(&a);
        let report = serde_json::json!({
            "sessions": 20, "connected": 20, "probes": 4, "probes_connected": 4,
            "session_errors": 0, "errors": [], "seconds": 21.5,
            "before": {"turn_ms": {"n": 3, "p50": 900.0, "p99": 1200.0, "max": 1200.0},
                       "ping_ms": {"n": 0}, "server_dropped_uplink": 0.0,
                       "seconds": 4.0, "server_cpu_secs": 1.0},
            "flood": {"attempts": 500, "seconds": 4.1, "sessions_open_before": 25.0,
                      "by_status": {"503": 496, "101": 4}, "retry_after": 496,
                      "errors": {}, "refusal_ms": {"n": 496, "p50": 0.5, "p99": 3.0, "max": 9.0}},
            "slowloris": {"drip": 25, "silent": 25, "closed_by_server": 0},
            "checks": [{"name": "never initializes (xiaozhi)", "closed_after_secs": 2.01,
                        "close_code": 1008, "pings": 0, "detail": "close frame, then TCP close"},
                       {"name": "dead peer, no pongs (xiaozhi)", "detail": "still open after 8s"}],
            "refused_by_reason": {"capacity": 496.0},
        });
        let t = table(&a, &p, &server_env(&a, &p), &report, 0);
        assert!(
            t.contains("| refused 503 / 429 | 496 / 0 (496 total) |"),
            "{t}"
        );
        assert!(t.contains("| 4 (4 slots were free) | ≤ 4 |"), "{t}");
        assert!(t.contains("900.0 / 1200.0 ms (n=3) → no samples"), "{t}");
        assert!(t.contains("closed after 2.01 s, code 1008"), "{t}");
        assert!(t.contains("NOT closed: still open after 8s"), "{t}");
        assert!(t.contains("capacity 496"), "{t}");
        assert!(
            t.contains("| 1.00 s in 4.0 s (25% of a core) / - / - |"),
            "{t}"
        );
        assert!(t.contains("VOXGATE_MAX_SESSIONS=29 "), "{t}");
        assert!(t.contains("VOXGATE_MAX_SESSIONS_PER_IP=0 "), "{t}");
        assert!(t.contains("VOXGATE_MAX_CONNECTIONS_PER_IP=128 "), "{t}");
        assert!(t.contains("VOXGATE_BODY_TIMEOUT_SECS=5 "), "{t}");
        assert!(t.contains("VOXGATE_GEMINI_LISTEN=off "), "{t}");
    }

    #[test]
    fn the_connection_cap_leaves_room_for_the_admitted_sessions() {
        // The server's default when the sessions fit under it ...
        assert_eq!(Plan::new(&args(&[])).max_connections_per_ip, 128);
        assert_eq!(Plan::new(&args(&["--quick"])).max_connections_per_ip, 128);
        // ... raised when they do not, and a flag wins.
        assert_eq!(
            Plan::new(&args(&["--sessions", "200"])).max_connections_per_ip,
            220
        );
        assert_eq!(
            Plan::new(&args(&["--max-connections-per-ip", "0"])).max_connections_per_ip,
            0
        );
    }
}
