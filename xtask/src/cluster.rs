//! `cargo xtask cluster`: the scale-out tests (`bins/voxgate-server/tests/cluster.rs`) against a
//! real `redis-server` (Debian's package, installed when missing): several instances of the
//! server binary on loopback ports sharing it, `deploy/nginx.conf` in a real nginx (Debian's
//! package) in front of two of them, then the figure of Redis operations per turn.
//!
//! The tests are `#[ignore]`d in `cargo test --workspace` (which must pass on a machine with
//! only the Rust toolchain); this command is how they run, in CI too.

use std::process::Command;
use std::time::Instant;

use crate::util;

/// Options for `cargo xtask cluster`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Turns per door in the figure (`figures_redis_operations_per_turn`).
    #[arg(long, default_value_t = 200)]
    pub(crate) turns: u32,
    /// Build unoptimised (quicker when only the behaviour matters; the figure's times are then
    /// a debug build's).
    #[arg(long)]
    pub(crate) debug: bool,
}

/// Where Debian's package puts the server.
const REDIS_SERVER: &str = "/usr/bin/redis-server";
/// The test that measures rather than checks.
const FIGURES: &str = "figures_redis_operations_per_turn";
/// Where Debian's package puts nginx (the sample load balancer configuration's test).
const NGINX: &str = "/usr/sbin/nginx";

pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let started = Instant::now();
    util::ensure_tool(REDIS_SERVER, "redis-server")?;
    util::ensure_tool(NGINX, "nginx")?;
    // The behaviour tests two at a time, then the figure alone: its times must not share the
    // machine with other tests' instances.
    for (filter, threads) in [("--skip", "2"), ("--exact", "1")] {
        let mut cmd = util::cargo();
        cmd.arg("test");
        if !args.debug {
            cmd.arg("--release");
        }
        // `--workspace` with the one test target: the features `cargo test --workspace`
        // resolved, so CI reuses its build instead of building the server again.
        cmd.args(["--workspace", "--test", "cluster", "--"])
            .args(["--ignored", "--nocapture", "--test-threads", threads])
            .args([filter, FIGURES])
            .env("VOXGATE_TEST_REDIS_SERVER", REDIS_SERVER)
            .env("VOXGATE_TEST_NGINX", NGINX)
            .env("VOXGATE_CLUSTER_FIGURE_TURNS", args.turns.to_string());
        util::run(&mut cmd)?;
    }
    eprintln!(
        "== cargo xtask cluster: passed in {:.0?} (redis-server {})",
        started.elapsed(),
        redis_version().unwrap_or_else(|| "?".into())
    );
    Ok(())
}

fn redis_version() -> Option<String> {
    let out = util::output(Command::new(REDIS_SERVER).arg("--version")).ok()?;
    out.split_whitespace()
        .find_map(|w| w.strip_prefix("v="))
        .map(str::to_owned)
}
