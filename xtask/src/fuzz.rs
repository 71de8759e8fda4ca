//! `cargo xtask fuzz`: run fuzz targets with cargo-fuzz, from committed seeds.
//!
//! Seeds live in `fuzz/seeds/<target>/` and are never written to: each run copies them into a
//! scratch corpus under `fuzz/target/`, so a fuzz run leaves the work tree clean.

use std::fs;
use std::path::Path;

use anyhow::{Context, bail};

use crate::util;

/// Options for `cargo xtask fuzz`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// The target to run (all targets when absent); `cargo fuzz list` names them.
    pub(crate) target: Option<String>,
    /// Seconds to run each target (0 only builds).
    #[arg(long, default_value_t = 60)]
    pub(crate) seconds: u64,
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
    let targets = match &args.target {
        Some(t) if all.contains(t) => vec![t.clone()],
        Some(t) => bail!(
            "unknown fuzz target `{t}`; known targets: {}",
            all.join(", ")
        ),
        None => all,
    };
    util::run(fuzz_cmd().args(["build", "--dev"]))?;
    if args.seconds == 0 {
        return Ok(());
    }
    for target in &targets {
        let corpus = fuzz_dir.join("target").join("corpus").join(target);
        if corpus.exists() {
            fs::remove_dir_all(&corpus)
                .with_context(|| format!("clearing {}", corpus.display()))?;
        }
        fs::create_dir_all(&corpus)?;
        let seeds = fuzz_dir.join("seeds").join(target);
        let mut cmd = fuzz_cmd();
        cmd.args(["run", "--dev", target.as_str()]).arg(&corpus);
        if has_files(&seeds) {
            cmd.arg(&seeds);
        } else {
            eprintln!("warning: no committed seeds in {}", seeds.display());
        }
        cmd.args([
            "--",
            &format!("-max_total_time={}", args.seconds),
            "-rss_limit_mb=2048",
            "-max_len=70000",
            "-print_final_stats=1",
        ]);
        util::run(&mut cmd).with_context(|| format!("fuzz target `{target}` found a failure"))?;
    }
    Ok(())
}

/// `cargo fuzz` on the stable toolchain: the sanitizer flags it passes are nightly-only, and
/// `RUSTC_BOOTSTRAP=1` lets the stable compiler accept them (the only toolchain we can rely on).
fn fuzz_cmd() -> std::process::Command {
    let mut cmd = util::cargo();
    cmd.arg("fuzz")
        .env("RUSTC_BOOTSTRAP", "1")
        .current_dir(util::root());
    cmd
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
