//! Repository automation for voxgate, run as `cargo xtask <command>`.
//!
//! Everything CI does is a command here, so a contributor can run exactly what CI runs.

mod ci;
mod codegen;
mod deps;
mod fuzz;
mod golden;
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
    /// Run one fuzz target, or all of them, for a number of seconds each.
    Fuzz(fuzz::Args),
    /// Check the layering rules of ARCHITECTURE.md against `cargo metadata`.
    Deps,
    /// Regenerate the prost code for `proto/` (or check that the committed code is current).
    Codegen(codegen::Args),
    /// Regenerate golden vectors with the published third-party clients (Python venv under target/).
    Golden(golden::Args),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Ci(args) => ci::run(&args),
        Command::Fuzz(args) => fuzz::run(&args),
        Command::Deps => deps::run(),
        Command::Codegen(args) => codegen::run(&args),
        Command::Golden(args) => golden::run(&args),
    }
}
