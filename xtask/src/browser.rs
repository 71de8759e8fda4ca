//! `cargo xtask browser`: the playground page (`GET /`) in a real headless Chromium.
//!
//! Makes sure Debian's `chromium` (and `espeak-ng`, for the spoken question) are installed,
//! installs the pinned `playwright-core` with npm under `target/browser/` (never into the
//! repository), then either
//! - (default) builds `voxgate-server` (unless `--server-bin` names one), starts it on a free
//!   loopback port with its embedded defaults (the demo agent), waits for `GET /health`, and runs
//!   `xtask/browser/playground.mjs`: connect over WebRTC, a spoken turn from a fake microphone
//!   playing a WAV, a typed turn, a typed request that runs the page's `set_theme` action,
//!   screenshots, hang up; or
//! - (`--selftest`) runs `xtask/browser/page_selftest.mjs`, which needs no voxgate server: it
//!   serves the page file itself and drives it by injecting server messages.
//!
//! Screenshots and logs go to `target/browser/artifacts/`. The node script has a time limit;
//! the server is killed at the end, also when a step fails.

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::interop::{Guard, build_server, tail};
use crate::util;

/// The `playwright-core` release the scripts are written against (it needs Node 20 or later
/// and drives the system Chromium: no browser download).
const PLAYWRIGHT_VERSION: &str = "1.65.1";
/// Debian's Chromium, which the scripts launch.
const CHROMIUM: &str = "/usr/bin/chromium";
/// The page under test, as the server embeds it.
const PAGE: &str = "crates/voxgate-server/src/playground/index.html";
const SCRIPTS: &str = "xtask/browser";
/// Spoken by espeak-ng into the fake microphone. The comma makes espeak pause about 140 ms
/// after "Hello", which one turn holds; after "Hello!" it pauses over 300 ms, which by default
/// ends the turn (docs/engine.md#endpointing).
const QUESTION: &str = "Hello, what can you do for me today?";
/// The fallback question when espeak-ng cannot be had (16 kHz mono speech).
const FIXTURE_WAV: &str = "crates/voxgate-audio/tests/fixtures/speech.wav";

/// Options of `cargo xtask browser`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Test the page alone (no voxgate server): `xtask/browser/page_selftest.mjs`.
    #[arg(long)]
    pub(crate) selftest: bool,
    /// Test this server binary instead of building `voxgate-server` (debug).
    #[arg(long, value_name = "PATH")]
    pub(crate) server_bin: Option<PathBuf>,
    /// Play this WAV (16-bit PCM) into the fake microphone instead of a spoken question.
    #[arg(long, value_name = "PATH")]
    pub(crate) wav: Option<PathBuf>,
    /// Extra server environment, `KEY=VALUE` (repeatable), e.g. to turn a door on.
    #[arg(long = "server-env", value_name = "KEY=VALUE")]
    pub(crate) server_env: Vec<String>,
    /// Seconds the browser script may take before it is killed and fails.
    #[arg(long, default_value_t = 120)]
    pub(crate) timeout: u64,
}

pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let root = util::root();
    let dir = util::target_dir().join("browser");
    let artifacts = dir.join("artifacts");
    fs::create_dir_all(&artifacts).with_context(|| format!("creating {}", artifacts.display()))?;
    util::ensure_tool(CHROMIUM, "chromium")?;
    ensure_node()?;
    let playwright = ensure_playwright(&dir)?;

    let mut env: Vec<(&str, PathBuf)> = vec![
        ("VOXGATE_PLAYWRIGHT", playwright),
        ("VOXGATE_CHROMIUM", PathBuf::from(CHROMIUM)),
        ("VOXGATE_ARTIFACTS", artifacts.clone()),
    ];
    if args.selftest {
        env.push(("VOXGATE_PAGE", root.join(PAGE)));
        let started = Instant::now();
        run_script(
            &root.join(SCRIPTS).join("page_selftest.mjs"),
            &env,
            args.timeout,
        )?;
        eprintln!("== browser selftest: passed ({:.1?})", started.elapsed());
        return Ok(());
    }

    let wav = match &args.wav {
        Some(path) => path
            .canonicalize()
            .with_context(|| format!("--wav {}", path.display()))?,
        None => question_wav(&root, &dir)?,
    };
    let server_bin = match &args.server_bin {
        Some(path) => path
            .canonicalize()
            .with_context(|| format!("--server-bin {}", path.display()))?,
        None => build_server()?,
    };
    let log = dir.join("server.log");
    let (server, addr) = start_server(&server_bin, &args.server_env, &log)?;
    eprintln!("browser: {} on {addr}", server_bin.display());
    env.push(("VOXGATE_URL", PathBuf::from(format!("http://{addr}"))));
    env.push(("VOXGATE_WAV", wav));
    let started = Instant::now();
    let result = run_script(
        &root.join(SCRIPTS).join("playground.mjs"),
        &env,
        args.timeout,
    );
    drop(server);
    match result {
        Ok(()) => {
            eprintln!(
                "== browser playground: passed ({:.1?}); screenshots in {}",
                started.elapsed(),
                artifacts.display()
            );
            Ok(())
        }
        Err(e) => bail!(
            "browser playground: FAILED: {e:#}\nserver log ({}), last lines:\n{}",
            log.display(),
            tail(&log, 40)
        ),
    }
}

/// Node 20 or later (playwright-core's floor); Debian's `nodejs` and `npm` when there is none.
fn ensure_node() -> anyhow::Result<()> {
    let version = || util::output(Command::new("node").arg("--version"));
    let v = match version() {
        Ok(v) => v,
        Err(_) => {
            util::ensure_tool("/usr/bin/npm", "npm")?;
            util::ensure_tool("/usr/bin/node", "nodejs")?;
            version()?
        }
    };
    let major: u32 = v
        .trim()
        .trim_start_matches('v')
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .with_context(|| format!("unexpected `node --version`: {v:?}"))?;
    if major < 20 {
        bail!(
            "node {} is too old: playwright-core {PLAYWRIGHT_VERSION} needs 20 or later",
            v.trim()
        );
    }
    Ok(())
}

/// Installs the pinned playwright-core into `<dir>/node_modules` unless it is there already;
/// returns the package directory (what the scripts `require`).
fn ensure_playwright(dir: &Path) -> anyhow::Result<PathBuf> {
    let package = dir.join("node_modules").join("playwright-core");
    let installed = fs::read_to_string(package.join("package.json"))
        .ok()
        .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        .is_some_and(|json| json["version"] == PLAYWRIGHT_VERSION);
    if installed {
        return Ok(package);
    }
    let manifest = dir.join("package.json");
    if !manifest.exists() {
        fs::write(&manifest, "{\"private\": true}\n")
            .with_context(|| format!("writing {}", manifest.display()))?;
    }
    util::run(
        Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--save-exact"])
            .arg(format!("playwright-core@{PLAYWRIGHT_VERSION}"))
            .current_dir(dir),
    )?;
    Ok(package)
}

/// A WAV of a spoken question from espeak-ng, or the repository's speech fixture when
/// espeak-ng cannot be installed.
fn question_wav(root: &Path, dir: &Path) -> anyhow::Result<PathBuf> {
    let wav = dir.join("question.wav");
    let spoken = util::ensure_tool("/usr/bin/espeak-ng", "espeak-ng")
        .and_then(|()| util::run(Command::new("espeak-ng").arg("-w").arg(&wav).arg(QUESTION)));
    match spoken {
        Ok(()) if fs::metadata(&wav).is_ok_and(|m| m.len() > 1000) => Ok(wav),
        outcome => {
            let why = outcome
                .err()
                .map_or_else(|| "empty output".to_owned(), |e| format!("{e:#}"));
            eprintln!("browser: espeak-ng unavailable ({why}); using {FIXTURE_WAV}");
            Ok(root.join(FIXTURE_WAV))
        }
    }
}

/// Starts the server on a free loopback port with its embedded defaults (plus `extra`
/// settings) and waits until `GET /health` answers 200.
fn start_server(
    bin: &Path,
    extra: &[String],
    log_path: &Path,
) -> anyhow::Result<(Guard, SocketAddr)> {
    let mut settings = Vec::new();
    for kv in extra {
        let (key, value) = kv
            .split_once('=')
            .with_context(|| format!("--server-env {kv:?} is not KEY=VALUE"))?;
        settings.push((key.to_owned(), value.to_owned()));
    }
    crate::interop::start_server_with(bin, &settings, log_path)
}

/// Runs a node script with a time limit; its output goes to the terminal.
fn run_script(script: &Path, env: &[(&str, PathBuf)], timeout: u64) -> anyhow::Result<()> {
    let mut cmd = Command::new("node");
    cmd.arg(script)
        .current_dir(util::root())
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null());
    eprintln!("$ {}", util::describe(&cmd));
    let mut child = Guard(cmd.spawn().context("starting node")?);
    let deadline = Instant::now() + Duration::from_secs(timeout);
    loop {
        if let Some(status) = child.0.try_wait()? {
            if status.success() {
                return Ok(());
            }
            bail!("{} exited with {status}", script.display());
        }
        if Instant::now() > deadline {
            // SIGTERM first: Playwright then closes the browser it launched, which a SIGKILL
            // (the guard's drop) would leave running.
            let _ = Command::new("kill")
                .args(["-TERM", &child.0.id().to_string()])
                .status();
            let grace = Instant::now() + Duration::from_secs(3);
            while Instant::now() < grace && child.0.try_wait()?.is_none() {
                thread::sleep(Duration::from_millis(50));
            }
            bail!("{} did not finish within {timeout} s", script.display());
        }
        thread::sleep(Duration::from_millis(50));
    }
}
