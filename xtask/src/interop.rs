//! `cargo xtask interop`: the published third-party clients against the real server.
//!
//! Installs the pinned Python clients (`xtask/interop/requirements.txt`: `deepslate-core`
//! 0.1.23 for the realtime door, `xiaozhi-sdk` 0.5.1 for the Xiaozhi door) into a venv under
//! `target/interop-venv` (aiortc for the WebRTC doors in `target/webrtc-venv`, grpcio for the
//! realtime gRPC service in `target/grpc-venv`, the Deepslate Pipecat plugin with Pipecat
//! 0.0.108 in `target/pipecat-venv` and the Deepslate LiveKit plugin with livekit-agents 1.8.9
//! in `target/livekit-venv`: the two plugins' pins conflict on `openai`), builds
//! `voxgate-server` (unless `--server-bin` names one), starts the fake recognizer
//! `xtask/interop/fake_asr.py` and the server on free loopback ports, waits for
//! `GET /health`, then runs each scenario script with a time limit. The plugin scenarios get a
//! second server of the same binary whose recognizer answers with questions (see
//! [`Scenario::asks_questions`]). The servers and the fake are killed at the end, also when a
//! step fails. Logs go to `target/interop/`; a failing scenario fails the command with its
//! output and the end of the server logs.
//!
//! See `docs/interop.md` for what each scenario covers.

use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::util;

mod sequence;

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
    /// Run the webrtc scenario against `xtask/interop/webrtc_fake_answerer.py` (an aiortc
    /// stand-in for both WebRTC doors) instead of the server: checks the peer script alone.
    #[arg(long)]
    pub(crate) webrtc_fake: bool,
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
    /// An aiortc peer (`webrtc_peer.py`) against the VIP door (`POST /webrtc/offer`) and the
    /// Gemini bridge's WebRTC signalling (`/gemini`).
    Webrtc,
    /// Python's `grpcio` with stubs generated from `proto/` by `grpcio-tools` against the
    /// realtime gRPC service (`grpc_scenario.py`).
    Grpc,
    /// `deepslate-core`'s event sequence of a scripted session (`realtime_sequence.py`) as the
    /// reference for `voxgate-client realtime` over WebSocket and gRPC.
    Sequence,
    /// The Deepslate Pipecat plugin (`deepslate-pipecat`'s DeepslateRealtimeLLMService in a
    /// Pipecat pipeline, `pipecat_scenario.py`) against the realtime door.
    Pipecat,
    /// The Deepslate LiveKit plugin's realtime session (`deepslate-livekit`'s
    /// `RealtimeModel().session()`, no LiveKit server, `livekit_scenario.py`) against the
    /// realtime door.
    Livekit,
}

impl Scenario {
    const ALL: [Scenario; 9] = [
        Scenario::Realtime,
        Scenario::Grpc,
        Scenario::Sequence,
        Scenario::Pipecat,
        Scenario::Livekit,
        Scenario::Xiaozhi,
        Scenario::Webrtc,
        Scenario::Mcp,
        Scenario::Acp,
    ];

    fn name(self) -> &'static str {
        match self {
            Scenario::Realtime => "realtime",
            Scenario::Xiaozhi => "xiaozhi",
            Scenario::Mcp => "mcp",
            Scenario::Acp => "acp",
            Scenario::Webrtc => "webrtc",
            Scenario::Grpc => "grpc",
            Scenario::Sequence => "sequence",
            Scenario::Pipecat => "pipecat",
            Scenario::Livekit => "livekit",
        }
    }

    fn script(self) -> &'static str {
        match self {
            Scenario::Realtime => "realtime_scenario.py",
            Scenario::Xiaozhi => "xiaozhi_scenario.py",
            Scenario::Webrtc => "webrtc_peer.py",
            Scenario::Grpc => "grpc_scenario.py",
            Scenario::Sequence => "realtime_sequence.py",
            Scenario::Pipecat => "pipecat_scenario.py",
            Scenario::Livekit => "livekit_scenario.py",
            Scenario::Mcp | Scenario::Acp => "",
        }
    }

    /// Whether the scenario runs against the second server, whose recognizer turns every
    /// utterance into a question (`fake_asr.py` under `/question/v1`), so that each spoken
    /// turn's reply ends with one. After such a reply a server with TTS waits for the user's
    /// answer, which is when the plugins send their reply requests in real conversations.
    fn asks_questions(self) -> bool {
        matches!(self, Scenario::Pipecat | Scenario::Livekit)
    }

    /// The venv (under target/) and requirements file of a scenario run against the server.
    fn venv(self) -> (&'static str, &'static str) {
        match self {
            Scenario::Webrtc => ("webrtc-venv", "requirements-webrtc.txt"),
            Scenario::Grpc => ("grpc-venv", "requirements-grpc.txt"),
            Scenario::Pipecat => ("pipecat-venv", "requirements-pipecat.txt"),
            Scenario::Livekit => ("livekit-venv", "requirements-livekit.txt"),
            _ => ("interop-venv", "requirements.txt"),
        }
    }

    /// Scenarios run as cargo tests (they start their own server) with a venv named by an
    /// environment variable: (venv dir under target/, requirements file, variable, whether the
    /// variable names the venv or its python, cargo test arguments).
    fn cargo_tests(self) -> Option<CargoScenario> {
        match self {
            Scenario::Realtime
            | Scenario::Xiaozhi
            | Scenario::Webrtc
            | Scenario::Grpc
            | Scenario::Sequence
            | Scenario::Pipecat
            | Scenario::Livekit => None,
            Scenario::Mcp => Some(CargoScenario {
                venv: "mcp-interop-venv",
                requirements: "requirements-mcp.txt",
                var: "VOXGATE_INTEROP_VENV",
                var_is_python: false,
                runs: &[&["--workspace", "--test", "mcp_endpoint_interop"]],
            }),
            Scenario::Acp => Some(CargoScenario {
                venv: "acp-venv",
                requirements: "requirements-acp.txt",
                var: "VOXGATE_ACP_PYTHON",
                var_is_python: true,
                // voxgate-providers' and voxgate-server's `acp` tests.
                runs: &[&["--workspace", "--test", "acp", "python_"]],
            }),
        }
    }
}

/// A scenario run through `cargo test` with a Python venv handed over in an environment variable.
/// Its runs select test targets with `--workspace` (not `-p`), so they resolve the features
/// `cargo test --workspace` did and reuse its build instead of compiling the server again.
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
/// A spoken question whose one pause (about 140 ms after "Hello") stays inside one turn. The
/// longer `speech.wav` pauses 416 ms mid-utterance, which by default ends a turn.
const WAV: &str = "crates/voxgate-audio/tests/fixtures/question.wav";
const SCRIPTS: &str = "xtask/interop";

pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let root = util::root();
    let logs = util::target_dir().join("interop");
    fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let chosen: Vec<Scenario> = match args.only {
        Some(s) => vec![s],
        None => Scenario::ALL.to_vec(),
    };
    let (cargo_scenarios, mut scenarios): (Vec<Scenario>, Vec<Scenario>) =
        chosen.into_iter().partition(|s| s.cargo_tests().is_some());

    prepare_venvs(&root, cargo_scenarios.iter().chain(&scenarios).copied());

    let mut failed = Vec::new();
    let mut server_logs = Vec::new();
    if args.webrtc_fake && scenarios.contains(&Scenario::Webrtc) {
        scenarios.retain(|s| *s != Scenario::Webrtc);
        let started = Instant::now();
        let result = run_webrtc_against_fake(&root, &logs, args.timeout);
        record(Scenario::Webrtc, started, result, &mut failed);
    }
    if let Some(first) = scenarios.first() {
        let (venv, requirements) = first.venv();
        // fake_asr.py needs only the standard library: any of the scenarios' pythons runs it.
        let asr_python = ensure_venv_at(&root, venv, requirements)?;
        let server_bin = match &args.server_bin {
            Some(path) => path
                .canonicalize()
                .with_context(|| format!("--server-bin {}", path.display()))?,
            None => build_server()?,
        };
        let (_asr, asr_url) = start_listener_script(&asr_python, &root, &logs, "fake_asr.py")?;
        let log = logs.join("server.log");
        let (server, main_addr) = start_server(&server_bin, &asr_url, &log)?;
        server_logs.push(log);
        eprintln!(
            "interop: {} on {main_addr} (ASR: fake at {asr_url})",
            server_bin.display()
        );
        // Started when the first scenario that needs it comes (it takes a fraction of a second).
        let mut questions_server: Option<(Guard, SocketAddr)> = None;
        for scenario in scenarios {
            let addr = if scenario.asks_questions() {
                match &questions_server {
                    Some((_, addr)) => *addr,
                    None => {
                        let url = questions_url(&asr_url)?;
                        let log = logs.join("server-questions.log");
                        let (guard, addr) = start_server(&server_bin, &url, &log)?;
                        eprintln!("interop: a second server on {addr} (ASR: fake at {url})");
                        server_logs.push(log);
                        questions_server = Some((guard, addr));
                        addr
                    }
                }
            } else {
                main_addr
            };
            let started = Instant::now();
            let (venv, requirements) = scenario.venv();
            let result =
                ensure_venv_at(&root, venv, requirements).and_then(|python| match scenario {
                    Scenario::Webrtc => {
                        let urls = WebrtcUrls {
                            vip: format!("http://{addr}"),
                            gemini: format!("ws://{addr}/gemini"),
                        };
                        run_webrtc(&python, &root, &logs, &urls, args.timeout)
                    }
                    Scenario::Sequence => sequence::run(&python, &root, &logs, addr, args.timeout),
                    _ => run_scenario(&python, &root, &logs, scenario, addr, args.timeout),
                });
            record(scenario, started, result, &mut failed);
        }
        drop(questions_server);
        drop(server);
    }
    for scenario in cargo_scenarios {
        let started = Instant::now();
        let Some(c) = scenario.cargo_tests() else {
            continue;
        };
        record(
            scenario,
            started,
            run_cargo_scenario(&root, &c),
            &mut failed,
        );
    }
    if !failed.is_empty() {
        let logs: String = server_logs
            .iter()
            .map(|l| {
                format!(
                    "\n(server log: {}, last lines:\n{})",
                    l.display(),
                    tail(l, 40)
                )
            })
            .collect();
        bail!("interop scenarios failed: {}{logs}", failed.join(", "));
    }
    Ok(())
}

/// Reports a scenario's outcome and remembers a failure.
fn record(
    scenario: Scenario,
    started: Instant,
    result: anyhow::Result<()>,
    failed: &mut Vec<&'static str>,
) {
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

/// A child process that is killed when dropped, so no exit path leaves it running.
pub(crate) struct Guard(pub(crate) Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Creates `target/<name>` and installs the pinned `xtask/interop/<requirements>` unless it
/// already has exactly them; returns its python.
/// Venvs installed at once, at most: pip's downloads wait on the network and its unpacking on
/// the disk, so a few side by side take about the time of the largest on two cores.
const VENV_JOBS: usize = 3;

/// Makes every venv the scenarios need, [`VENV_JOBS`] at a time, before the first scenario
/// runs. A failure here is only reported: the scenario that needs the venv tries again and
/// fails with it.
fn prepare_venvs(root: &Path, scenarios: impl Iterator<Item = Scenario>) {
    let mut venvs: Vec<(&'static str, &'static str)> = scenarios
        .map(|s| {
            s.cargo_tests()
                .map_or_else(|| s.venv(), |c| (c.venv, c.requirements))
        })
        .collect();
    venvs.sort_unstable();
    venvs.dedup();
    let next = std::sync::Mutex::new(venvs.into_iter());
    thread::scope(|scope| {
        for _ in 0..VENV_JOBS {
            scope.spawn(|| {
                loop {
                    let Some((venv, requirements)) =
                        next.lock().unwrap_or_else(|e| e.into_inner()).next()
                    else {
                        break;
                    };
                    if let Err(e) = ensure_venv_at(root, venv, requirements) {
                        eprintln!("interop: preparing {venv} failed: {e:#}");
                    }
                }
            });
        }
    });
}

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
    let started = Instant::now();
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
    // What a first run (and CI, from a fresh clone) pays for each venv.
    eprintln!(
        "interop: {} installed from {} in {:.1?}",
        venv.display(),
        requirements.display(),
        started.elapsed()
    );
    Ok(python)
}

/// Builds the server binary (dev profile) and returns its path, as cargo reports it.
pub(crate) fn build_server() -> anyhow::Result<PathBuf> {
    build_bin("voxgate-server-bin", "voxgate-server")
}

/// Builds one binary of a workspace package (dev profile) and returns its path, as cargo
/// reports it.
fn build_bin(package: &str, bin: &str) -> anyhow::Result<PathBuf> {
    let mut cmd = util::cargo();
    cmd.args([
        "build",
        "-p",
        package,
        "--bin",
        bin,
        "--message-format=json-render-diagnostics",
    ]);
    let stdout = util::output(cmd.stderr(Stdio::inherit()))?;
    for line in stdout.lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] == "compiler-artifact"
            && msg["target"]["name"] == bin
            && let Some(exe) = msg["executable"].as_str()
        {
            return Ok(PathBuf::from(exe));
        }
    }
    bail!("cargo built {package} but reported no {bin} executable")
}

/// Starts a local stand-in (`fake_asr.py`, `webrtc_fake_answerer.py`) on a free port; returns
/// it and the base URL from its first line (`listening on <url>`). Its stderr goes to
/// `<logs>/<script stem>.log`.
fn start_listener_script(
    python: &Path,
    root: &Path,
    logs: &Path,
    script: &str,
) -> anyhow::Result<(Guard, String)> {
    let stem = script.trim_end_matches(".py");
    let log = File::create(logs.join(format!("{stem}.log")))?;
    let mut child = Command::new(python)
        .arg("-u")
        .arg(root.join(SCRIPTS).join(script))
        .args(["--port", "0"])
        .current_dir(root.join(SCRIPTS))
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {script}"))?;
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
        .with_context(|| format!("{script} did not report its address within 20 s"))?;
    let url = line
        .strip_prefix("listening on ")
        .with_context(|| format!("unexpected first line from {script}: {line:?}"))?;
    Ok((guard, url.to_owned()))
}

/// The fake recognizer's URL whose transcripts are questions (`fake_asr.py`: `/question/v1`
/// on the same port) from its usual `http://HOST:PORT/v1`.
fn questions_url(asr_url: &str) -> anyhow::Result<String> {
    match asr_url.strip_suffix("/v1") {
        Some(base) => Ok(format!("{base}/question/v1")),
        None => bail!("fake_asr.py reported {asr_url:?}, not a URL ending in /v1"),
    }
}

/// A port that was free a moment ago (the server binds it right after).
pub(crate) fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

/// Starts the server on a free port with the demo agent, the fake recognizer, the interop
/// bearer key and Xiaozhi token authentication, and waits until `GET /health` answers 200.
fn start_server(bin: &Path, asr_url: &str, log_path: &Path) -> anyhow::Result<(Guard, SocketAddr)> {
    let settings = [
        ("VOXGATE_ASR_BASE_URL", asr_url),
        ("VOXGATE_API_KEYS", API_KEY),
        // The Xiaozhi scenario checks that OTA tokens are issued and enforced.
        ("VOXGATE_XIAOZHI_AUTH", "true"),
        ("VOXGATE_XIAOZHI_TOKEN_SECRET", "interop-secret"),
        // With auth on, OTA issues tokens only to allowed or activated devices: the
        // scenario's MAC (xiaozhi_scenario.py `MAC`) is allowed.
        ("VOXGATE_XIAOZHI_ALLOWED_DEVICES", "02:00:00:1a:7e:01"),
        // The Gemini door is reached on the main listener (`/gemini`); its own fixed port
        // (3001) could clash with another server on this machine.
        ("VOXGATE_GEMINI_LISTEN", "off"),
    ]
    .map(|(k, v)| (k.to_owned(), v.to_owned()));
    start_server_with(bin, &settings, log_path)
}

/// Starts `bin` on a free loopback port with only `settings` of the `VOXGATE_*` environment
/// (an inherited `VOXGATE_LLM_BASE_URL` would replace the demo agent the scripts talk to),
/// logging to `log_path`, and waits for `/health`.
pub(crate) fn start_server_with(
    bin: &Path,
    settings: &[(String, String)],
    log_path: &Path,
) -> anyhow::Result<(Guard, SocketAddr)> {
    // A port can be taken between probing and binding; try a few.
    let mut last_error = None;
    for _ in 0..3 {
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let log = File::create(log_path)?;
        let mut cmd = Command::new(bin);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("VOXGATE_") {
                cmd.env_remove(key);
            }
        }
        cmd.arg("--listen")
            .arg(addr.to_string())
            // Never a download from PyPI mid-run (the models are `cargo xtask offline`'s).
            .env("VOXGATE_MODELS_AUTO_INSTALL", "false")
            .envs(settings.iter().map(|(k, v)| (k, v)))
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
    match scenario {
        Scenario::Realtime | Scenario::Pipecat | Scenario::Livekit => {
            cmd.args(["--api-key", API_KEY]);
        }
        Scenario::Grpc => {
            let stubs = generate_grpc_stubs(python, root, logs)?;
            cmd.args(["--api-key", API_KEY]).arg("--stubs").arg(stubs);
        }
        _ => {}
    }
    eprintln!("== interop {}: $ {}", scenario.name(), util::describe(&cmd));
    let status = run_with_limit(&mut cmd, timeout)?;
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

/// Generates the Python protobuf and gRPC modules of `proto/realtime.proto` and
/// `proto/realtime_service.proto` with grpcio-tools' protoc (`python -m grpc_tools.protoc`,
/// which adds the well-known types' include path itself) into `<logs>/grpc-stubs`, emptied
/// first so no stale module survives a change of the protos; returns that directory.
fn generate_grpc_stubs(python: &Path, root: &Path, logs: &Path) -> anyhow::Result<PathBuf> {
    let out = logs.join("grpc-stubs");
    if out.exists() {
        fs::remove_dir_all(&out).with_context(|| format!("removing {}", out.display()))?;
    }
    fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let proto = root.join("proto");
    let mut cmd = Command::new(python);
    cmd.args(["-m", "grpc_tools.protoc"])
        .arg(format!("--proto_path={}", proto.display()))
        .arg(format!("--python_out={}", out.display()))
        .arg(format!("--grpc_python_out={}", out.display()))
        .arg(proto.join("realtime.proto"))
        .arg(proto.join("realtime_service.proto"))
        .current_dir(root);
    util::run(&mut cmd).context("generating the gRPC stubs with grpc_tools.protoc")?;
    Ok(out)
}

/// Runs a command to its end or kills it after `timeout` seconds (then `None`).
pub(crate) fn run_with_limit(
    cmd: &mut Command,
    timeout: u64,
) -> anyhow::Result<Option<ExitStatus>> {
    let mut child = Guard(cmd.spawn().context("starting the scenario")?);
    let deadline = Instant::now() + Duration::from_secs(timeout);
    loop {
        if let Some(status) = child.0.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() > deadline {
            return Ok(None);
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// Where the WebRTC peer finds the two doors.
struct WebrtcUrls {
    /// Base URL of the VIP door (`POST <vip>/webrtc/offer`).
    vip: String,
    /// WebSocket URL of the Gemini bridge.
    gemini: String,
}

/// The typed turn of the VIP run (after the spoken one); a client that declared `set_theme`
/// may see it invoked.
const VIP_TEXT: &str = "switch to dark mode";

/// The webrtc scenario: `webrtc_peer.py` in both modes, each summary checked.
fn run_webrtc(
    python: &Path,
    root: &Path,
    logs: &Path,
    urls: &WebrtcUrls,
    timeout: u64,
) -> anyhow::Result<()> {
    for (mode, url) in [("vip", &urls.vip), ("gemini", &urls.gemini)] {
        let summary = run_peer(python, root, logs, mode, url, timeout)
            .with_context(|| format!("webrtc_peer.py {mode}"))?;
        check_summary(mode, &summary).with_context(|| {
            format!(
                "webrtc_peer.py {mode}: summary in {}",
                logs.join(format!("webrtc-{mode}.json")).display()
            )
        })?;
        eprintln!(
            "== interop webrtc {mode}: {:.2} s of reply audio ({:.2} s not silent), {} frames",
            summary["reply_seconds"].as_f64().unwrap_or_default(),
            summary["reply_nonsilent_seconds"]
                .as_f64()
                .unwrap_or_default(),
            summary["frames_received"]
        );
    }
    Ok(())
}

/// The webrtc scenario against `webrtc_fake_answerer.py` (no server): checks the peer script.
fn run_webrtc_against_fake(root: &Path, logs: &Path, timeout: u64) -> anyhow::Result<()> {
    let (venv, requirements) = Scenario::Webrtc.venv();
    let python = ensure_venv_at(root, venv, requirements)?;
    let (_fake, url) = start_listener_script(&python, root, logs, "webrtc_fake_answerer.py")?;
    let gemini = match url.strip_prefix("http://") {
        Some(rest) => format!("ws://{rest}/gemini"),
        None => bail!("webrtc_fake_answerer.py reported {url:?}, not an http:// URL"),
    };
    eprintln!("interop: webrtc against the aiortc fake answerer at {url}");
    run_webrtc(
        &python,
        root,
        logs,
        &WebrtcUrls { vip: url, gemini },
        timeout,
    )
}

/// Runs `webrtc_peer.py <mode>` with the speech fixture and returns its JSON summary. Progress
/// goes to `<logs>/webrtc-<mode>.log`, the summary to `webrtc-<mode>.json`, the received audio
/// to `webrtc-<mode>-reply.wav`.
fn run_peer(
    python: &Path,
    root: &Path,
    logs: &Path,
    mode: &str,
    url: &str,
    timeout: u64,
) -> anyhow::Result<serde_json::Value> {
    let log_path = logs.join(format!("webrtc-{mode}.log"));
    let json_path = logs.join(format!("webrtc-{mode}.json"));
    let mut cmd = Command::new(python);
    cmd.arg("-u")
        .arg(root.join(SCRIPTS).join(Scenario::Webrtc.script()))
        .arg(mode)
        .arg("--url")
        .arg(url)
        .arg("--wav")
        .arg(root.join(WAV))
        .arg("--save-reply")
        .arg(logs.join(format!("webrtc-{mode}-reply.wav")))
        // The script's own limit comes first, so a slow run still prints its summary.
        .arg("--timeout")
        .arg(timeout.saturating_sub(10).max(10).to_string())
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(File::create(&json_path)?)
        .stderr(File::create(&log_path)?);
    if mode == "vip" {
        cmd.args(["--text", VIP_TEXT, "--api-key", API_KEY]);
    }
    eprintln!("== interop webrtc: $ {}", util::describe(&cmd));
    let status = run_with_limit(&mut cmd, timeout)?;
    let output = fs::read_to_string(&log_path).unwrap_or_default();
    let summary = fs::read_to_string(&json_path).unwrap_or_default();
    match status {
        Some(s) if s.success() => {}
        Some(s) => bail!("exited with {s}; its log:\n{output}\nits summary:\n{summary}"),
        None => bail!("did not finish within {timeout} s; its log:\n{output}"),
    }
    serde_json::from_str(&summary)
        .with_context(|| format!("its summary is not JSON:\n{summary}\nits log:\n{output}"))
}

/// Checks a `webrtc_peer.py` summary: reply audio that is heard, and the mode's signalling.
fn check_summary(mode: &str, summary: &serde_json::Value) -> anyhow::Result<()> {
    if summary["ok"] != true {
        bail!("the peer reported a failure: {}", summary["failure"]);
    }
    let heard = summary["reply_nonsilent_seconds"]
        .as_f64()
        .unwrap_or_default();
    if heard <= 0.3 {
        bail!("the reply audio is silent or too short: {heard} s above the silence level");
    }
    let events: Vec<&str> = summary["events"]
        .as_array()
        .map(|a| a.iter().filter_map(|e| e.as_str()).collect())
        .unwrap_or_default();
    let wanted: &[&str] = match mode {
        "vip" => &["session.connected", "state", "reply.text", "reply.done"],
        _ => &["WEBRTC_ANSWER"],
    };
    let missing: Vec<&str> = wanted
        .iter()
        .copied()
        .filter(|w| !events.contains(w))
        .collect();
    if !missing.is_empty() {
        bail!("events {missing:?} never arrived; events: {events:?}");
    }
    // The bridge's data channel answers the peer's `ping` as the original gateway did.
    if mode == "gemini" && summary["data_channel_replies"] != serde_json::json!(["pong"]) {
        bail!(
            "the data channel's `ping` got {} instead of [\"pong\"]",
            summary["data_channel_replies"]
        );
    }
    Ok(())
}

/// The last `lines` lines of a log file.
pub(crate) fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::{check_summary, questions_url};
    use serde_json::json;

    fn summary(events: &[&str], heard: f64) -> serde_json::Value {
        json!({"ok": true, "failure": null, "reply_nonsilent_seconds": heard, "events": events,
            "data_channel_replies": ["pong"]})
    }

    #[test]
    fn questions_url_is_the_fakes_question_path() {
        assert_eq!(
            questions_url("http://127.0.0.1:4000/v1").unwrap(),
            "http://127.0.0.1:4000/question/v1"
        );
        assert!(questions_url("http://127.0.0.1:4000/other").is_err());
    }

    #[test]
    fn vip_summary_needs_its_events_and_audible_reply() {
        let events = [
            "session.connected",
            "state",
            "reply.text",
            "reply.done",
            "state",
        ];
        assert!(check_summary("vip", &summary(&events, 1.2)).is_ok());
        assert!(check_summary("vip", &summary(&events, 0.1)).is_err());
        assert!(check_summary("vip", &summary(&events[..3], 1.2)).is_err());
    }

    #[test]
    fn gemini_summary_needs_the_answer_and_a_successful_run() {
        assert!(
            check_summary(
                "gemini",
                &summary(&["SETUP_COMPLETE", "WEBRTC_ANSWER"], 1.0)
            )
            .is_ok()
        );
        assert!(check_summary("gemini", &summary(&["SETUP_COMPLETE"], 1.0)).is_err());
        let mut failed = summary(&["WEBRTC_ANSWER"], 1.0);
        failed["ok"] = json!(false);
        assert!(check_summary("gemini", &failed).is_err());
        // The data channel's `ping` must get exactly one `pong`.
        for replies in [json!([]), json!(["pong", "pong"]), json!(null)] {
            let mut unanswered = summary(&["WEBRTC_ANSWER"], 1.0);
            unanswered["data_channel_replies"] = replies;
            assert!(check_summary("gemini", &unanswered).is_err());
        }
    }
}
