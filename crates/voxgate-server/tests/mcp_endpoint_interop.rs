//! Interop with the published MCP bridges (`mcp2xiaozhi`, `xiaozhi-mcp` on PyPI): each connects
//! a stdio MCP server written with the official Python SDK (`tests/interop/echo_server.py`) to
//! our `/mcp` endpoint; `tests/interop/mcp_bridge.py` checks that the tools appear, a call
//! works, an `/api/message` turn uses the tool, and the tools go when the bridge stops.
//!
//! Runs only when `VOXGATE_INTEROP_VENV` names a Python virtual environment holding
//! `mcp<2`, `mcp2xiaozhi` and `xiaozhi-mcp` (see docs/doors/mcp.md); otherwise it says so and
//! passes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use support::Running;
use voxgate_server::Config;

fn venv_python() -> Option<PathBuf> {
    let venv = std::env::var_os("VOXGATE_INTEROP_VENV")?;
    let python = PathBuf::from(venv).join("bin").join("python");
    assert!(
        python.exists(),
        "VOXGATE_INTEROP_VENV is set but {} does not exist",
        python.display()
    );
    Some(python)
}

async fn run_bridge(bridge: &'static str) {
    let Some(python) = venv_python() else {
        eprintln!("skipped: set VOXGATE_INTEROP_VENV to run the {bridge} interop test");
        return;
    };
    let mut config = Config::default();
    config.mcp.tokens = vec!["interop-token".into()];
    let server = Running::start(config).await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop/mcp_bridge.py");
    let base = format!("http://{}", server.addr);
    let run = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(script)
            .args([
                "--base",
                &base,
                "--token",
                "interop-token",
                "--bridge",
                bridge,
            ])
            .args(["--timeout", "60"])
            .output()
    });
    let output = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the interop script finishes in time")
        .unwrap()
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{bridge} interop failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    assert!(stdout.contains(&format!("OK: {bridge}")), "{stdout}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp2xiaozhi_connects_a_stdio_server() {
    run_bridge("mcp2xiaozhi").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xiaozhi_mcp_connects_a_stdio_server() {
    run_bridge("xiaozhi-mcp").await;
}
