//! `cargo xtask interop`: the published third-party clients against the real server.
//!
//! Installs the pinned Python clients (`xtask/interop/requirements.txt`: `deepslate-core`
//! 0.1.23 for the realtime door, `xiaozhi-sdk` 0.5.1 for the Xiaozhi door) into a venv under
//! `target/interop-venv`, builds `voxgate-server` (unless `--server-bin` names one), starts the
//! fake recognizer `xtask/interop/fake_asr.py` and the server on free loopback ports, waits for
//! `GET /health`, then runs each scenario script with a time limit. The server and the fake
//! are killed at the end, also when a step fails. Logs go to `target/interop/`; a failing
//! scenario fails the command with its output and the end of the server log.
//!
//! See `docs/interop.md` for what each scenario covers.

use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::util;

/// Options of `cargo xtask interop`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Run only this scenario.
    #[arg(long, value_enum)]
    pub(crate) only: Option<Scenario>,
    /// Test this server binary instead of building `voxgate-server-bin` (debug).
    #[arg(long, value_name = "PATH")]
    pub(crate) server_bin: Option<PathBuf>,
    /// Seconds each scenario may take before it is killed and fails.
    #[arg(long, default_value_t = 120)]
    pub(crate) timeout: u64,
}

/// One client/door pair.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub(crate) enum Scenario {
    /// `deepslate-core` against the realtime door.
    Realtime,
    /// `xiaozhi-sdk` against the Xiaozhi door (OTA and WebSocket).
    Xiaozhi,
    /// The MCP bridges `mcp2xiaozhi` and `xiaozhi-mcp` connecting a stdio MCP server to the MCP
    /// endpoint (the `mcp_endpoint_interop` tests of voxgate-server, which start their own server).
    Mcp,
    /// An agent written with the official ACP Python SDK driving the `acp` brain (the `python_`
    /// tests of voxgate-providers and voxgate-server).
    Acp,
}

impl Scenario {
    const ALL: [Scenario; 4] = [
        Scenario::Realtime,
        Scenario::Xiaozhi,
        Scenario::Mcp,
        Scenario::Acp,
    ];

    fn name(self) -> &'static str {
        match self {
            Scenario::Realtime => "realtime",
            Scenario::Xiaozhi => "xiaozhi",
            Scenario::Mcp => "mcp",
            Scenario::Acp => "acp",
        }
    }

    fn script(self) -> &'static str {
        match self {
            Scenario::Realtime => "realtime_scenario.py",
            Scenario::Xiaozhi => "xiaozhi_scenario.py",
            Scenario::Mcp | Scenario::Acp => "",
        }
    }

    /// Scenarios run as cargo tests (they start their own server) with a venv named by an
    /// environment variable: (venv dir under target/, requirements file, variable, whether the
    /// variable names the venv or its python, cargo test arguments).
    fn cargo_tests(self) -> Option<CargoScenario> {
        match self {
            Scenario::Realtime | Scenario::Xiaozhi => None,
            Scenario::Mcp => Some(CargoScenario {
                venv: "mcp-interop-venv",
                requirements: "requirements-mcp.txt",
                var: "VOXGATE_INTEROP_VENV",
                var_is_python: false,
                runs: &[&["-p", "voxgate-server", "--test", "mcp_endpoint_interop"]],
            }),
            Scenario::Acp => Some(CargoScenario {
                venv: "acp-venv",
                requirements: "requirements-acp.txt",
                var: "VOXGATE_ACP_PYTHON",
                var_is_python: true,
                runs: &[
                    &["-p", "voxgate-providers", "--test", "acp", "python_"],
                    &["-p", "voxgate-server", "--test", "acp", "python_"],
                ],
            }),
        }
    }
}

/// A scenario run through `cargo test` with a Python venv handed over in an environment variable.
struct CargoScenario {
    venv: &'static str,
    requirements: &'static str,
    var: &'static str,
    var_is_python: bool,
    runs: &'static [&'static [&'static str]],
}

/// Runs a [`CargoScenario`]: makes its venv, then each cargo test run with the variable set.
fn run_cargo_scenario(root: &Path, c: &CargoScenario) -> anyhow::Result<()> {
    let python = ensure_venv_at(root, c.venv, c.requirements)?;
    let value = if c.var_is_python {
        python
    } else {
        util::target_dir().join(c.venv)
    };
    for args in c.runs {
        let mut cmd = util::cargo();
        cmd.arg("test").args(args.iter()).env(c.var, &value);
        // The tests print "skipped" and pass without the variable; with it they must run.
        util::run(&mut cmd)?;
    }
    Ok(())
}

/// The bearer key the server is started with; the realtime scenario also tries a wrong one.
const API_KEY: &str = "interop-key";
/// Speech the audio turns send (16 kHz mono).
const WAV: &str = "crates/voxgate-audio/tests/fixtures/speech.wav";
const SCRIPTS: &str = "xtask/interop";

pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let root = util::root();
    let logs = util::target_dir().join("interop");
    fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let chosen: Vec<Scenario> = match args.only {
        Some(s) => vec![s],
        None => Scenario::ALL.to_vec(),
    };
    let (cargo_scenarios, scenarios): (Vec<Scenario>, Vec<Scenario>) =
        chosen.into_iter().partition(|s| s.cargo_tests().is_some());

    let mut failed = Vec::new();
    let mut server_log = None;
    if !scenarios.is_empty() {
        let python = ensure_venv(&root)?;
        let server_bin = match &args.server_bin {
            Some(path) => path
                .canonicalize()
                .with_context(|| format!("--server-bin {}", path.display()))?,
            None => build_server()?,
        };
        let (_asr, asr_url) = start_fake_asr(&python, &root, &logs)?;
        let log = logs.join("server.log");
        let (server, addr) = start_server(&server_bin, &asr_url, &log)?;
        eprintln!(
            "interop: {} on {addr} (ASR: fake at {asr_url})",
            server_bin.display()
        );
        for scenario in scenarios {
            let started = Instant::now();
            let result = run_scenario(&python, &root, &logs, scenario, addr, args.timeout);
            match result {
                Ok(()) => eprintln!(
                    "== interop {}: passed ({:.1?})",
                    scenario.name(),
                    started.elapsed()
                ),
                Err(e) => {
                    eprintln!("== interop {}: FAILED: {e:#}", scenario.name());
                    failed.push(scenario.name());
                }
            }
        }
        drop(server);
        server_log = Some(log);
    }
    for scenario in cargo_scenarios {
        let started = Instant::now();
        let Some(c) = scenario.cargo_tests() else {
            continue;
        };
        match run_cargo_scenario(&root, &c) {
            Ok(()) => eprintln!(
                "== interop {}: passed ({:.1?})",
                scenario.name(),
                started.elapsed()
            ),
            Err(e) => {
                eprintln!("== interop {}: FAILED: {e:#}", scenario.name());
                failed.push(scenario.name());
            }
        }
    }
    if !failed.is_empty() {
        let log = server_log.map_or_else(String::new, |l| {
            format!(
                " (server log: {}, last lines:\n{})",
                l.display(),
                tail(&l, 40)
            )
        });
        bail!("interop scenarios failed: {}{log}", failed.join(", "));
    }
    Ok(())
}

/// A child process that is killed when dropped, so no exit path leaves it running.
pub(crate) struct Guard(pub(crate) Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Creates the clients' venv (`target/interop-venv`) with `xtask/interop/requirements.txt`.
fn ensure_venv(root: &Path) -> anyhow::Result<PathBuf> {
    ensure_venv_at(root, "interop-venv", "requirements.txt")
}

/// Creates `target/<name>` and installs the pinned `xtask/interop/<requirements>` unless it
/// already has exactly them; returns its python.
fn ensure_venv_at(root: &Path, name: &str, requirements: &str) -> anyhow::Result<PathBuf> {
    let venv = util::target_dir().join(name);
    let python = venv.join("bin").join("python");
    let requirements = root.join(SCRIPTS).join(requirements);
    let wanted = fs::read_to_string(&requirements)
        .with_context(|| format!("reading {}", requirements.display()))?;
    let marker = venv.join("voxgate-requirements.txt");
    if python.exists() && fs::read_to_string(&marker).ok().as_deref() == Some(wanted.as_str()) {
        return Ok(python);
    }
    if !python.exists() {
        util::run(Command::new("python3").args(["-m", "venv"]).arg(&venv)).context(
            "creating the interop venv (on Debian/Ubuntu: apt-get install python3-venv)",
        )?;
    }
    util::run(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "-r",
            ])
            .arg(&requirements),
    )?;
    fs::write(&marker, wanted).with_context(|| format!("writing {}", marker.display()))?;
    Ok(python)
}

/// Builds the server binary (dev profile) and returns its path, as cargo reports it.
pub(crate) fn build_server() -> anyhow::Result<PathBuf> {
    let mut cmd = util::cargo();
    cmd.args([
        "build",
        "-p",
        "voxgate-server-bin",
        "--bin",
        "voxgate-server",
        "--message-format=json-render-diagnostics",
    ]);
    let stdout = util::output(cmd.stderr(Stdio::inherit()))?;
    for line in stdout.lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] == "compiler-artifact"
            && msg["target"]["name"] == "voxgate-server"
            && let Some(exe) = msg["executable"].as_str()
        {
            return Ok(PathBuf::from(exe));
        }
    }
    bail!("cargo built voxgate-server-bin but reported no voxgate-server executable")
}

/// Starts `fake_asr.py` on a free port; returns it and its API base URL.
fn start_fake_asr(python: &Path, root: &Path, logs: &Path) -> anyhow::Result<(Guard, String)> {
    let log = File::create(logs.join("fake_asr.log"))?;
    let mut child = Command::new(python)
        .arg("-u")
        .arg(root.join(SCRIPTS).join("fake_asr.py"))
        .args(["--port", "0"])
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .context("starting fake_asr.py")?;
    let stdout = child.stdout.take().context("fake_asr.py stdout")?;
    let guard = Guard(child);
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            let _ = tx.send(line);
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(20))
        .context("fake_asr.py did not report its address within 20 s")?;
    let url = line
        .strip_prefix("listening on ")
        .with_context(|| format!("unexpected first line from fake_asr.py: {line:?}"))?;
    Ok((guard, url.to_owned()))
}

/// A port that was free a moment ago (the server binds it right after).
pub(crate) fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

/// Starts the server on a free port with the demo agent, the fake recognizer, the interop
/// bearer key and Xiaozhi token authentication, and waits until `GET /health` answers 200.
fn start_server(bin: &Path, asr_url: &str, log_path: &Path) -> anyhow::Result<(Guard, SocketAddr)> {
    // A port can be taken between probing and binding; try a few.
    let mut last_error = None;
    for _ in 0..3 {
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let log = File::create(log_path)?;
        let mut cmd = Command::new(bin);
        // Only this run's settings: an inherited VOXGATE_LLM_BASE_URL would replace the demo
        // agent the scenarios script against.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("VOXGATE_") {
                cmd.env_remove(key);
            }
        }
        cmd.arg("--listen")
            .arg(addr.to_string())
            .env("VOXGATE_ASR_BASE_URL", asr_url)
            .env("VOXGATE_API_KEYS", API_KEY)
            // The Xiaozhi scenario checks that OTA tokens are issued and enforced.
            .env("VOXGATE_XIAOZHI_AUTH", "true")
            .env("VOXGATE_XIAOZHI_TOKEN_SECRET", "interop-secret")
            // With auth on, OTA issues tokens only to allowed or activated devices: the
            // scenario's MAC (xiaozhi_scenario.py `MAC`) is allowed.
            .env("VOXGATE_XIAOZHI_ALLOWED_DEVICES", "02:00:00:1a:7e:01")
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut guard = Guard(child);
        match wait_healthy(&mut guard, addr, Duration::from_secs(30)) {
            Ok(()) => return Ok((guard, addr)),
            Err(e) => last_error = Some(e),
        }
    }
    let e = last_error.unwrap_or_else(|| anyhow::anyhow!("no attempt made"));
    Err(e.context(format!(
        "the server did not come up; its log ({}):\n{}",
        log_path.display(),
        tail(log_path, 40)
    )))
}

pub(crate) fn wait_healthy(
    server: &mut Guard,
    addr: SocketAddr,
    limit: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = server.0.try_wait()? {
            bail!("the server exited with {status} before answering /health");
        }
        if health(addr).unwrap_or(false) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("GET http://{addr}/health did not answer 200 within {limit:?}");
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// Whether `GET /health` answers 200 (plain HTTP/1.1, so xtask needs no HTTP client).
fn health(addr: SocketAddr) -> anyhow::Result<bool> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(
        stream,
        "GET /health HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response.starts_with("HTTP/1.1 200"))
}

/// Runs one scenario script with a time limit; its output goes to the terminal and to a log.
fn run_scenario(
    python: &Path,
    root: &Path,
    logs: &Path,
    scenario: Scenario,
    addr: SocketAddr,
    timeout: u64,
) -> anyhow::Result<()> {
    let log_path = logs.join(format!("{}.log", scenario.name()));
    let log = File::create(&log_path)?;
    let mut cmd = Command::new(python);
    cmd.arg("-u")
        .arg(root.join(SCRIPTS).join(scenario.script()))
        .arg("--server")
        .arg(addr.to_string())
        .arg("--wav")
        .arg(root.join(WAV))
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    if scenario == Scenario::Realtime {
        cmd.args(["--api-key", API_KEY]);
    }
    eprintln!("== interop {}: $ {}", scenario.name(), util::describe(&cmd));
    let mut child = Guard(cmd.spawn().context("starting the scenario")?);
    let deadline = Instant::now() + Duration::from_secs(timeout);
    let status = loop {
        if let Some(status) = child.0.try_wait()? {
            break Some(status);
        }
        if Instant::now() > deadline {
            break None;
        }
        thread::sleep(Duration::from_millis(50));
    };
    drop(child);
    let output = fs::read_to_string(&log_path).unwrap_or_default();
    match status {
        Some(s) if s.success() => {
            eprint!("{output}");
            Ok(())
        }
        Some(s) => bail!("the scenario exited with {s}; its output:\n{output}"),
        None => bail!("the scenario did not finish within {timeout} s; its output:\n{output}"),
    }
}

/// The last `lines` lines of a log file.
pub(crate) fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
