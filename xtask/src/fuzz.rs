//! `cargo xtask fuzz`: run fuzz targets with cargo-fuzz, from committed seeds.
//!
//! Each target runs in two phases. *Depth*: the committed seeds (`fuzz/seeds/<target>/`, never
//! written to), inputs up to 64 KiB, most of the budget. *Size*, for targets where input size
//! matters: large seeds generated here deterministically (512 KiB to 1 MiB, into
//! `fuzz/target/generated-seeds/<target>/` instead of being committed), inputs up to 1 MiB, in
//! a corpus of their own so big inputs do not slow the depth phase down.
//!
//! A smoke run (the default, `--seconds` per target, half that for the size phase) grows
//! scratch corpora under `fuzz/target/corpus/`, cleared first, so it leaves the work tree
//! clean. A campaign (`--campaign`, `--runs` executions per target, a 500th of that for the
//! size phase) keeps its corpora in `fuzz/corpus/<target>/` and `<target>.large/` (git-ignored)
//! and resumes from them next time. Targets run side by side, one per core, their output
//! lines prefixed with the target's name.
//!
//! Targets are built optimised with debug assertions and AddressSanitizer (`cargo fuzz build
//! -O -a`), with this xtask as rustc wrapper so the Opus codec crate is built without
//! comparison tracing ([`UNTRACED_CRATES`]). The `opus_libopus` target needs the fuzz crate's
//! `libopus` feature (libopus compiled from C by voxgate-opus-sys: a C compiler, no cmake).
//! docs/fuzzing.md has the figures.

use std::fmt::Write as _;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, bail};

use crate::util;

/// Largest input of the size phase: big enough for the few-MiB-class frames the doors accept
/// to be exercised at the sizes where length bugs live (a WAV header limit, a line limit).
const MAX_LEN: usize = 1 << 20;

/// Largest input of the depth phase, where most executions go: past the size of any
/// structured message the targets take apart, small enough to stay fast.
const DEPTH_MAX_LEN: usize = 64 << 10;

/// The target that needs the `libopus` feature (the C libopus).
const LIBOPUS_TARGET: &str = "opus_libopus";

/// Options for `cargo xtask fuzz`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// The target to run (all targets when absent); `cargo fuzz list` names them.
    pub(crate) target: Option<String>,
    /// The target to run, as an option (same as the positional argument).
    #[arg(long = "target", value_name = "TARGET", conflicts_with = "target")]
    pub(crate) target_opt: Option<String>,
    /// Seconds each target's depth phase runs in a smoke run (the size phase gets half; 0 only
    /// builds).
    #[arg(long, default_value_t = 60)]
    pub(crate) seconds: u64,
    /// A campaign: run each target for `--runs` executions (a 500th of that with large inputs),
    /// keeping the grown corpus.
    #[arg(long)]
    pub(crate) campaign: bool,
    /// Executions per target in a campaign.
    #[arg(long, default_value_t = 10_000_000)]
    pub(crate) runs: u64,
    /// Where a campaign keeps its corpus, one directory per target (default `fuzz/corpus`).
    #[arg(long, value_name = "DIR")]
    pub(crate) corpus_dir: Option<PathBuf>,
    /// Build unoptimised (`cargo fuzz build --dev -a`): about a third of the optimised build's
    /// compile time, and about a third of its speed. CI's smoke run uses it: it proves every
    /// target builds and passes its seeds and large inputs, not depth.
    #[arg(long)]
    pub(crate) dev: bool,
}

impl Args {
    /// A smoke run of every target for `seconds` each (what CI runs).
    pub(crate) fn smoke(seconds: u64) -> Self {
        Self {
            target: None,
            target_opt: None,
            seconds,
            campaign: false,
            runs: 0,
            corpus_dir: None,
            dev: true,
        }
    }
}

/// What libFuzzer reported for one target.
struct Outcome {
    target: String,
    phase: &'static str,
    runs: u64,
    exec_per_sec: u64,
    corpus: String,
    peak_rss_mb: u64,
    elapsed_secs: f64,
}

/// The command that builds every target as CI's smoke run does (`--dev`, the `libopus`
/// feature), at the lowest CPU priority (`nice -n 19`): CI starts it beside the steps that
/// mostly wait on sockets and audio, whose processes keep the processor first.
pub(crate) fn niced_build_all() -> anyhow::Result<Command> {
    ensure_cargo_fuzz()?;
    let mut build = fuzz_cmd();
    build.arg("build").args(build_flags(true, true));
    let mut niced = Command::new("nice");
    niced
        .args(["-n", "19"])
        .arg(build.get_program())
        .args(build.get_args());
    for (key, value) in build.get_envs() {
        match value {
            Some(v) => niced.env(key, v),
            None => niced.env_remove(key),
        };
    }
    if let Some(dir) = build.get_current_dir() {
        niced.current_dir(dir);
    }
    Ok(niced)
}

pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    ensure_cargo_fuzz()?;
    let root = util::root();
    let fuzz_dir = root.join("fuzz");
    let listed = util::output(fuzz_cmd().args(["list"]))?;
    let all: Vec<String> = listed
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    let requested = args.target.as_ref().or(args.target_opt.as_ref());
    let targets = match requested {
        Some(t) if all.contains(t) => vec![t.clone()],
        Some(t) => bail!(
            "unknown fuzz target `{t}`; known targets: {}",
            all.join(", ")
        ),
        None => all,
    };
    let features = targets.iter().any(|t| t == LIBOPUS_TARGET);

    let mut build = fuzz_cmd();
    let flags = build_flags(features, args.dev);
    build.arg("build").args(&flags);
    if let [one] = targets.as_slice() {
        build.arg(one);
    }
    util::run(&mut build)?;
    if !args.campaign && args.seconds == 0 {
        return Ok(());
    }

    // One target per core at a time: each libFuzzer run is one process on one core, and the
    // smoke run's wall time is otherwise the sum of every target's budget.
    let jobs = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(targets.len());
    let next = std::sync::Mutex::new(targets.iter().enumerate());
    let results = std::sync::Mutex::new(Vec::new());
    let failed = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            scope.spawn(|| {
                while !failed.load(std::sync::atomic::Ordering::Relaxed) {
                    let Some((i, target)) = next.lock().unwrap_or_else(|e| e.into_inner()).next()
                    else {
                        break;
                    };
                    let result = run_target_phases(args, &fuzz_dir, target, &flags);
                    if result.is_err() {
                        failed.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    results
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((i, result));
                }
            });
        }
    });
    let mut results = results.into_inner().unwrap_or_else(|e| e.into_inner());
    results.sort_by_key(|(i, _)| *i);
    let mut outcomes = Vec::new();
    for (_, result) in results {
        outcomes.extend(result?);
    }
    eprintln!("{}", summary(&outcomes, args.campaign));
    Ok(())
}

/// Both phases of one target (the size phase only where it has generated seeds).
fn run_target_phases(
    args: &Args,
    fuzz_dir: &Path,
    target: &str,
    flags: &[String],
) -> anyhow::Result<Vec<Outcome>> {
    let mut outcomes = Vec::new();
    let seeds = fuzz_dir.join("seeds").join(target);
    if !has_files(&seeds) {
        eprintln!("warning: no committed seeds in {}", seeds.display());
    }
    // Depth: the committed seeds, inputs up to 64 KiB, most of the budget.
    let corpus = corpus_dir(args, fuzz_dir, target)?;
    let budget = if args.campaign {
        Budget::Runs(args.runs)
    } else {
        Budget::Seconds(args.seconds)
    };
    let phase = Phase {
        name: "depth",
        max_len: DEPTH_MAX_LEN,
        budget,
    };
    outcomes.push(run_phase(
        fuzz_dir,
        target,
        flags,
        &corpus,
        &[&seeds],
        &phase,
    )?);

    // Size: the generated large seeds, inputs up to 1 MiB, in a corpus of their own (big
    // inputs would otherwise crowd the depth corpus and slow it down a hundredfold).
    if let Some(generated) = write_generated_seeds(fuzz_dir, target)? {
        let large = corpus_dir(args, fuzz_dir, &format!("{target}.large"))?;
        let budget = if args.campaign {
            Budget::Runs((args.runs / 500).max(1000))
        } else {
            Budget::Seconds(args.seconds.div_ceil(2))
        };
        let phase = Phase {
            name: "large",
            max_len: MAX_LEN,
            budget,
        };
        outcomes.push(run_phase(
            fuzz_dir,
            target,
            flags,
            &large,
            &[&seeds, &generated],
            &phase,
        )?);
    }
    Ok(outcomes)
}

/// How long a phase runs.
enum Budget {
    Seconds(u64),
    Runs(u64),
}

/// One libFuzzer run of a target: its name in the summary, input size limit and budget.
struct Phase {
    name: &'static str,
    max_len: usize,
    budget: Budget,
}

/// The corpus a run grows: `fuzz/target/corpus/<name>` cleared first for a smoke run, the
/// persistent `<corpus dir>/<name>` for a campaign.
fn corpus_dir(args: &Args, fuzz_dir: &Path, name: &str) -> anyhow::Result<PathBuf> {
    let dir = if args.campaign {
        args.corpus_dir
            .clone()
            .unwrap_or_else(|| fuzz_dir.join("corpus"))
            .join(name)
    } else {
        let scratch = fuzz_dir.join("target").join("corpus").join(name);
        if scratch.exists() {
            fs::remove_dir_all(&scratch)
                .with_context(|| format!("clearing {}", scratch.display()))?;
        }
        scratch
    };
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

fn run_phase(
    fuzz_dir: &Path,
    target: &str,
    flags: &[String],
    corpus: &Path,
    seeds: &[&Path],
    phase: &Phase,
) -> anyhow::Result<Outcome> {
    let mut cmd = fuzz_cmd();
    cmd.arg("run").args(flags).arg(target).arg(corpus);
    for dir in seeds.iter().filter(|d| has_files(d)) {
        cmd.arg(dir);
    }
    cmd.args([
        "--",
        &format!("-max_len={}", phase.max_len),
        "-rss_limit_mb=2048",
        "-print_final_stats=1",
    ]);
    if phase.max_len > DEPTH_MAX_LEN {
        // Mutations may reach the full size at once, not only by slow growth from the seeds
        // (a large seed that adds no coverage of its own is not kept in the corpus).
        cmd.arg("-len_control=0");
    }
    match phase.budget {
        Budget::Seconds(s) => cmd.arg(format!("-max_total_time={s}")),
        Budget::Runs(n) => cmd.arg(format!("-runs={n}")),
    };
    let mut outcome = run_target(target, &mut cmd).with_context(|| {
        format!(
            "fuzz target `{target}` found a failure (input saved under {})",
            fuzz_dir.join("artifacts").join(target).display()
        )
    })?;
    outcome.phase = phase.name;
    Ok(outcome)
}

/// Optimised (unless `dev`), with debug assertions and overflow checks (AddressSanitizer is
/// cargo-fuzz's default). The build always goes to `fuzz/target`, whatever `CARGO_TARGET_DIR` says: its
/// sanitizer flags would otherwise rebuild a shared target directory's artifacts.
fn build_flags(libopus: bool, dev: bool) -> Vec<String> {
    let target_dir = util::root().join("fuzz").join("target");
    let mut flags: Vec<String> = vec![if dev { "--dev" } else { "-O" }.into(), "-a".into()];
    flags.push("--target-dir".into());
    flags.push(target_dir.to_string_lossy().into_owned());
    if libopus {
        flags.extend(["--features".into(), "libopus".into()]);
    }
    flags
}

/// Runs one target, passing libFuzzer's output through (without the one line per new or
/// reduced corpus entry, thousands in a run) and reading its final statistics.
fn run_target(target: &str, cmd: &mut Command) -> anyhow::Result<Outcome> {
    eprintln!("$ {}", util::describe(cmd));
    let started = Instant::now();
    let mut child = cmd
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("could not start `{}`", util::describe(cmd)))?;
    let stderr = child.stderr.take().context("no stderr pipe")?;
    let mut outcome = Outcome {
        target: target.to_owned(),
        phase: "",
        runs: 0,
        exec_per_sec: 0,
        corpus: String::from("?"),
        peak_rss_mb: 0,
        elapsed_secs: 0.0,
    };
    // libFuzzer's closing list of dictionary entries is left out too.
    let mut in_dictionary = false;
    for line in BufReader::new(stderr).lines() {
        let line = line.context("reading libFuzzer output")?;
        let stat = |name: &str| {
            line.strip_prefix(name)
                .and_then(|v| v.trim_start_matches(':').trim().parse::<u64>().ok())
        };
        if let Some(v) = stat("stat::number_of_executed_units") {
            outcome.runs = v;
        } else if let Some(v) = stat("stat::average_exec_per_sec") {
            outcome.exec_per_sec = v;
        } else if let Some(v) = stat("stat::peak_rss_mb") {
            outcome.peak_rss_mb = v;
        }
        if let Some(corp) = line.split("corp: ").nth(1) {
            // `corp: <units>/<bytes>` on libFuzzer's status lines; the last one is final.
            outcome.corpus = corp.split_whitespace().next().unwrap_or("?").to_owned();
        }
        if line.starts_with("###### Recommended dictionary") {
            in_dictionary = true;
        }
        let noisy = in_dictionary
            || line.starts_with('#') && (line.contains("\tNEW ") || line.contains("\tREDUCE "));
        if !noisy {
            // Targets run side by side: each line says whose it is.
            eprintln!("[{target}] {line}");
        }
        if line.starts_with("###### End of recommended dictionary") {
            in_dictionary = false;
        }
    }
    let status = child.wait().context("waiting for the fuzz target")?;
    outcome.elapsed_secs = started.elapsed().as_secs_f64();
    if !status.success() {
        bail!("`{}` failed with {status}", util::describe(cmd));
    }
    Ok(outcome)
}

fn summary(outcomes: &[Outcome], campaign: bool) -> String {
    let mut out = format!(
        "== fuzz {}: executions, executions per second and corpus (units/bytes) per target\n",
        if campaign { "campaign" } else { "smoke run" }
    );
    let _ = writeln!(
        out,
        "{:<24} {:<6} {:>12} {:>9} {:>16} {:>8} {:>8}",
        "target", "phase", "executions", "exec/s", "corpus", "rss MB", "seconds"
    );
    for o in outcomes {
        let _ = writeln!(
            out,
            "{:<24} {:<6} {:>12} {:>9} {:>16} {:>8} {:>8.0}",
            o.target, o.phase, o.runs, o.exec_per_sec, o.corpus, o.peak_rss_mb, o.elapsed_secs
        );
    }
    out
}

/// `cargo fuzz` on the stable toolchain: the sanitizer flags it passes are nightly-only, and
/// `RUSTC_BOOTSTRAP=1` lets the stable compiler accept them (the only toolchain we can rely on).
fn fuzz_cmd() -> Command {
    let mut cmd = util::cargo();
    // Incremental compilation only costs disk in an optimised build that is rebuilt rarely
    // (and a different setting would rebuild every workspace crate).
    cmd.arg("fuzz")
        .env("RUSTC_BOOTSTRAP", "1")
        .env("CARGO_INCREMENTAL", "0")
        .current_dir(util::root());
    // This xtask wraps rustc to leave comparison tracing out of the codecs (see
    // `UNTRACED_CRATES`), chaining to a wrapper the caller set (sccache...).
    if let Ok(exe) = std::env::current_exe() {
        if let Some(inner) = std::env::var_os("RUSTC_WRAPPER").filter(|w| !w.is_empty()) {
            cmd.env(INNER_WRAPPER_ENV, inner);
        }
        cmd.env("RUSTC_WRAPPER", exe).env(WRAPPER_ENV, "1");
    }
    cmd
}

/// Set in the environment of the fuzz build: this xtask, started by cargo as `RUSTC_WRAPPER`,
/// runs rustc instead of parsing a command line ([`rustc_wrapper`]).
const WRAPPER_ENV: &str = "VOXGATE_XTASK_RUSTC_WRAPPER";

/// A `RUSTC_WRAPPER` the caller had set, which [`rustc_wrapper`] runs rustc through.
const INNER_WRAPPER_ENV: &str = "VOXGATE_XTASK_INNER_RUSTC_WRAPPER";

/// Crates built without libFuzzer's comparison hooks (`-sanitizer-coverage-trace-compares`),
/// keeping their edge coverage and AddressSanitizer. Measured (docs/fuzzing.md): in opus-rs
/// the hooks on its DSP loops took over 40% of `audio_decode`'s time, and what they trace
/// there is sample arithmetic, not input structure; the packet structure voxgate parses
/// itself (`validate_packet`) keeps them.
const UNTRACED_CRATES: &[&str] = &["opus_rs"];

/// When this xtask runs as cargo's `RUSTC_WRAPPER` for the fuzz build: runs rustc (argument 1)
/// with the remaining arguments, turning comparison tracing off for [`UNTRACED_CRATES`], and
/// returns its exit code. `None` when this is a normal xtask run.
pub(crate) fn rustc_wrapper() -> Option<i32> {
    std::env::var_os(WRAPPER_ENV)?;
    let mut args = std::env::args_os().skip(1);
    let rustc = args.next()?;
    let args = untraced(args.collect());
    let mut cmd = match std::env::var_os(INNER_WRAPPER_ENV) {
        Some(inner) => {
            let mut c = Command::new(inner);
            c.arg(rustc);
            c
        }
        None => Command::new(rustc),
    };
    match cmd.args(&args).status() {
        Ok(status) => Some(status.code().unwrap_or(1)),
        Err(e) => {
            eprintln!("xtask (rustc wrapper): could not run rustc: {e}");
            Some(1)
        }
    }
}

/// rustc's arguments with comparison tracing turned off when they build one of
/// [`UNTRACED_CRATES`] with it on; otherwise unchanged.
fn untraced(mut args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let crate_name = args
        .iter()
        .position(|a| a == "--crate-name")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.to_str());
    let traced = args.iter().any(|a| {
        a.to_string_lossy()
            .contains("sanitizer-coverage-trace-compares")
    });
    if traced && crate_name.is_some_and(|n| UNTRACED_CRATES.contains(&n)) {
        // LLVM takes the last value given, so this overrides cargo-fuzz's flag.
        args.push("-Cllvm-args=-sanitizer-coverage-trace-compares=false".into());
    }
    args
}

fn has_files(dir: &Path) -> bool {
    fs::read_dir(dir)
        .map(|mut d| d.next().is_some())
        .unwrap_or(false)
}

fn ensure_cargo_fuzz() -> anyhow::Result<()> {
    let present = util::cargo()
        .args(["fuzz", "--version"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if present {
        return Ok(());
    }
    eprintln!("cargo-fuzz is not installed; installing it from crates.io");
    util::run(util::cargo().args(["install", "cargo-fuzz", "--locked"]))
}

// ---- generated seeds --------------------------------------------------------------------------

/// Writes `target`'s large generated seeds; returns their directory, or `None` for a target
/// whose input size does not matter.
fn write_generated_seeds(fuzz_dir: &Path, target: &str) -> anyhow::Result<Option<PathBuf>> {
    let seeds = large_seeds(target);
    if seeds.is_empty() {
        return Ok(None);
    }
    let dir = fuzz_dir.join("target").join("generated-seeds").join(target);
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    fs::create_dir_all(&dir)?;
    for (name, bytes) in seeds {
        debug_assert!(
            bytes.len() <= MAX_LEN,
            "{target}/{name} is over the input limit"
        );
        fs::write(dir.join(name), bytes)?;
    }
    Ok(Some(dir))
}

/// Large realistic inputs (512 KiB to 1 MiB) for the targets where size matters: long audio,
/// long event streams, big frames. Deterministic, so a failure reproduces.
pub(crate) fn large_seeds(target: &str) -> Vec<(&'static str, Vec<u8>)> {
    const KIB: usize = 1024;
    match target {
        // Selector byte, then a 16 kHz mono WAV: the WAV reader and PCM converters see it all.
        "audio_decode" => vec![("large_wav_16k", prefixed(2, &wav(16_000, 1, 700 * KIB)))],
        "wav_stream" => {
            let mut placeholder = wav(24_000, 2, 700 * KIB);
            placeholder[40..44].copy_from_slice(&u32::MAX.to_le_bytes());
            vec![
                // 16 KiB pieces, and 1-byte pieces.
                (
                    "large_wav_24k_mono",
                    prefixed(143, &wav(24_000, 1, 700 * KIB)),
                ),
                ("large_wav_placeholder_stereo", prefixed(0, &placeholder)),
            ]
        }
        "sse" => vec![("large_event_stream", prefixed(131, &sse_body(640 * KIB)))],
        "openai_chat_chunks" => vec![("large_completion", prefixed(7, &chat_stream(640 * KIB)))],
        "realtime_client_bound" => vec![(
            "large_model_audio_chunk",
            // ClientBoundMessage.model_audio_chunk(3).audio(1).data(1).
            proto_with_bytes(&[3, 1, 1], pcm_bytes(720 * KIB)),
        )],
        "realtime_service_bound" => vec![(
            "large_user_input_audio",
            // ServiceBoundMessage.user_input(3) { packet_id(1), mode(2), audio(3).data(1) }.
            proto_service_audio(pcm_bytes(720 * KIB)),
        )],
        "gemini_bridge" => vec![
            ("large_realtime_audio.json", gemini_bridge_audio(700 * KIB)),
            ("large_content_audio.json", gemini_bridge_content(700 * KIB)),
        ],
        "gemini_live" => vec![("large_realtime_audio.json", gemini_live_audio(700 * KIB))],
        "perception_event" => vec![("large_event.json", perception_event(600 * KIB))],
        _ => Vec::new(),
    }
}

fn prefixed(selector: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 1);
    out.push(selector);
    out.extend_from_slice(body);
    out
}

/// `len` bytes of speech-like 16-bit PCM: two tones and a little noise, from a fixed seed.
fn pcm_bytes(len: usize) -> Vec<u8> {
    let mut state: u32 = 0x9E37_79B9;
    let mut out = Vec::with_capacity(len);
    let mut i: i32 = 0;
    while out.len() + 2 <= len {
        state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        // Triangle waves of period 80 and 27 samples, ±8000 and ±3000, plus noise under ±256.
        let a = (i % 80 - 40).abs() * 400 - 8000;
        let b = (i % 27 - 13).abs() * 230 - 1500;
        let noise = i32::from(state.to_le_bytes()[2]) - 128;
        let sample = i16::try_from(a + b + noise * 2).unwrap_or_default();
        out.extend_from_slice(&sample.to_le_bytes());
        i += 1;
    }
    out
}

/// A canonical 44-byte-header 16-bit WAV holding `data_len` bytes of PCM.
fn wav(rate: u32, channels: u16, data_len: usize) -> Vec<u8> {
    let data = pcm_bytes(data_len - data_len % (2 * usize::from(channels)));
    let data_len = u32::try_from(data.len()).unwrap_or(u32::MAX);
    let mut out = Vec::with_capacity(data.len() + 44);
    out.extend_from_slice(b"RIFF");
    out.extend_from_slice(&(36 + data_len).to_le_bytes());
    out.extend_from_slice(b"WAVEfmt ");
    out.extend_from_slice(&16u32.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&channels.to_le_bytes());
    out.extend_from_slice(&rate.to_le_bytes());
    out.extend_from_slice(&(rate * 2 * u32::from(channels)).to_le_bytes());
    out.extend_from_slice(&(2 * channels).to_le_bytes());
    out.extend_from_slice(&16u16.to_le_bytes());
    out.extend_from_slice(b"data");
    out.extend_from_slice(&data_len.to_le_bytes());
    out.extend_from_slice(&data);
    out
}

/// An event stream: comments, multi-line events, CRLF and LF, one long line, `[DONE]`.
fn sse_body(len: usize) -> Vec<u8> {
    let mut out = String::from(": keep-alive\r\n\r\nevent: message\nid: 1\nretry: 1000\n");
    out.push_str("data: ");
    out.push_str(&"x".repeat(64 * 1024));
    out.push_str("\n\n");
    let mut i = 0;
    while out.len() < len {
        if i % 3 == 0 {
            let _ = write!(out, "data: {{\"n\":{i},\n data: \"é\"}}\r\n\r\n");
        } else {
            let _ = write!(
                out,
                "data:{{\"choices\":[{{\"delta\":{{\"content\":\"w{i} \"}}}}]}}\n\n"
            );
        }
        i += 1;
    }
    out.push_str("data: [DONE]\n\n");
    out.into_bytes()
}

/// A chat-completions stream: text deltas, a tool call whose arguments arrive in many pieces,
/// usage, a finish reason and `[DONE]`.
fn chat_stream(len: usize) -> Vec<u8> {
    let mut out = String::from(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
    );
    out.push_str(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\
         \"type\":\"function\",\"function\":{\"name\":\"self_audio_speaker_set_volume\",\
         \"arguments\":\"\"}}]}}]}\n\n",
    );
    let mut i = 0;
    while out.len() < len {
        if i % 2 == 0 {
            let _ = write!(
                out,
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"word{i} \"}}}}]}}\n\n"
            );
        } else {
            let _ = write!(
                out,
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"tool_calls\":[{{\"index\":0,\
                 \"function\":{{\"arguments\":\"{{\\\"k{i}\\\":{i},\"}}}}]}}}}]}}\n\n"
            );
        }
        i += 1;
    }
    out.push_str(
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}],\
         \"usage\":{\"prompt_tokens\":12,\"completion_tokens\":34}}\n\ndata: [DONE]\n\n",
    );
    out.into_bytes()
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push(u8::try_from(v & 0x7f).unwrap_or_default() | 0x80);
        v >>= 7;
    }
    out.push(u8::try_from(v).unwrap_or_default());
}

fn len_field(field: u32, body: &[u8], out: &mut Vec<u8>) {
    varint(u64::from(field) << 3 | 2, out);
    varint(body.len() as u64, out);
    out.extend_from_slice(body);
}

/// Nested length-delimited fields `path[0] { path[1] { ... bytes } }`.
fn proto_with_bytes(path: &[u32], bytes: Vec<u8>) -> Vec<u8> {
    path.iter().rev().fold(bytes, |inner, &field| {
        let mut out = Vec::with_capacity(inner.len() + 8);
        len_field(field, &inner, &mut out);
        out
    })
}

fn proto_service_audio(pcm: Vec<u8>) -> Vec<u8> {
    let mut user_input = Vec::with_capacity(pcm.len() + 16);
    user_input.extend_from_slice(&[0x08, 42, 0x10, 2]);
    len_field(3, &proto_with_bytes(&[1], pcm), &mut user_input);
    proto_with_bytes(&[3], user_input)
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Base64 of PCM sized so the text is about `len` bytes.
fn audio_base64(len: usize) -> String {
    base64(&pcm_bytes(len / 4 * 3))
}

fn gemini_bridge_audio(len: usize) -> Vec<u8> {
    format!(
        "{{\"type\":\"SEND_REALTIME_INPUT\",\"payload\":{{\"audio\":{{\"mimeType\":\
         \"audio/pcm;rate=16000\",\"data\":\"{}\"}}}}}}",
        audio_base64(len)
    )
    .into_bytes()
}

fn gemini_bridge_content(len: usize) -> Vec<u8> {
    format!(
        "{{\"type\":\"CONTENT_MESSAGE\",\"payload\":{{\"serverContent\":{{\"modelTurn\":\
         {{\"parts\":[{{\"inlineData\":{{\"mimeType\":\"audio/pcm;rate=24000\",\"data\":\"{}\"}}}}]}}}}}}}}",
        audio_base64(len)
    )
    .into_bytes()
}

fn gemini_live_audio(len: usize) -> Vec<u8> {
    format!(
        "{{\"realtimeInput\":{{\"audio\":{{\"mimeType\":\"audio/pcm;rate=16000\",\"data\":\"{}\"}}}}}}",
        audio_base64(len)
    )
    .into_bytes()
}

/// One perception event whose `data` holds many detections.
fn perception_event(len: usize) -> Vec<u8> {
    let mut out = String::from(
        "{\"name\":\"face_detected\",\"device_id\":\"aa:bb:cc:dd:ee:ff\",\"ts\":1700000000.5,\
         \"data\":{\"name\":\"Ana\",\"boxes\":[",
    );
    let mut i = 0;
    while out.len() < len {
        let _ = write!(
            out,
            "{{\"x\":{i},\"y\":{},\"w\":64,\"h\":64,\"score\":0.{i}}},",
            i * 7
        );
        i += 1;
    }
    out.push_str("{}]}}");
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<std::ffi::OsString> {
        list.iter().map(Into::into).collect()
    }

    #[test]
    fn only_the_codec_loses_comparison_tracing_and_only_in_a_traced_build() {
        let traced = "-Cllvm-args=-sanitizer-coverage-trace-compares";
        let off = "-Cllvm-args=-sanitizer-coverage-trace-compares=false";
        let codec = args(&["--crate-name", "opus_rs", "src/lib.rs", traced]);
        assert_eq!(untraced(codec).last(), Some(&off.into()));
        let ours = args(&["--crate-name", "voxgate_audio", "src/lib.rs", traced]);
        assert_eq!(untraced(ours.clone()), ours);
        // A plain build (no fuzzing flags) and rustc's probes pass through untouched.
        let plain = args(&["--crate-name", "opus_rs", "src/lib.rs"]);
        assert_eq!(untraced(plain.clone()), plain);
        let probe = args(&["-vV"]);
        assert_eq!(untraced(probe.clone()), probe);
    }

    #[test]
    fn large_seeds_are_large_and_fit_the_input_limit() {
        for target in [
            "audio_decode",
            "wav_stream",
            "sse",
            "openai_chat_chunks",
            "realtime_client_bound",
            "realtime_service_bound",
            "gemini_bridge",
            "gemini_live",
            "perception_event",
        ] {
            let seeds = large_seeds(target);
            assert!(!seeds.is_empty(), "{target}");
            for (name, bytes) in seeds {
                assert!(
                    (512 * 1024..=MAX_LEN).contains(&bytes.len()),
                    "{target}/{name}: {} bytes",
                    bytes.len()
                );
            }
        }
    }

    #[test]
    fn base64_matches_the_standard_alphabet() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(&[0xff, 0xfe]), "//4=");
    }

    #[test]
    fn proto_lengths_nest() {
        assert_eq!(
            proto_with_bytes(&[3, 1], vec![7; 200]),
            [&[0x1a, 0xcb, 0x01, 0x0a, 0xc8, 0x01][..], &[7; 200]].concat()
        );
    }
}
