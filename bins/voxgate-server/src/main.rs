//! `voxgate-server`: the voxgate reference voice-agent server.
//!
//! ```text
//! voxgate-server [--config FILE] [--listen ADDR] [--print-config]
//! ```
//!
//! Runs on the embedded defaults when given nothing: `127.0.0.1:8080`, the offline demo agent,
//! no speech recognizer and the embedded synthesizer (espeak-ng when installed). A TOML file
//! (`--config`) and `VOXGATE_*` environment variables override them, `--listen` last (see the
//! `voxgate_server::config` docs for the schema and every variable). `--print-config` prints
//! the effective configuration (secrets masked) and exits.
//!
//! Doors reachable beyond loopback without access control (`voxgate_server::exposure`) are
//! logged as warnings at start and printed as `# WARNING: ...` comments above the
//! `--print-config` output, which stays valid TOML.
//!
//! Serves `GET /health`, Prometheus `GET /metrics`, and the realtime protobuf protocol over
//! WebSocket at `/realtime` and `/api/v1/vendors/{vendor}/organizations/{org}/realtime[/{model}]`.
//! Logs go to stderr, filtered by `RUST_LOG` (default `info`). Ctrl-C or SIGTERM shuts down
//! gracefully.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Parser;
use voxgate_server::{Config, Server};

/// The voxgate reference voice-agent server.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// TOML configuration file (defaults are embedded; see --print-config).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Listen address, overriding the file and VOXGATE_LISTEN.
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    print_config: bool,
}

fn config(args: &Args) -> anyhow::Result<Config> {
    let mut config = match &args.config {
        Some(path) => Config::from_file(path)?,
        None => Config::default(),
    };
    config.apply_env(|k| std::env::var(k).ok())?;
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    Ok(config)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let config = config(&args)?;
    let warnings = voxgate_server::exposure_warnings(&config);
    if args.print_config {
        print!(
            "{}{}",
            voxgate_server::exposure::as_toml_comments(&warnings),
            config.to_toml()
        );
        return Ok(());
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    for warning in &warnings {
        tracing::warn!("{warning}");
    }
    let server = Server::bind(config).await.context("starting the server")?;
    eprintln!("voxgate-server listening on http://{}", server.local_addr());
    server.run(voxgate_server::shutdown_signal()).await?;
    Ok(())
}
