//! Logs and traces: the process-wide `tracing` subscriber the `voxgate-server` binary installs
//! from `[telemetry]` ([`TelemetryConfig`]).
//!
//! - **Logs** go to stderr, as text or one JSON object per line ([`LogFormat`]), filtered by
//!   `RUST_LOG` (default `info`). Text is coloured only when stderr is a terminal, so colour
//!   codes never reach a log file or a pipe; JSON never is.
//! - **Traces**: with `otlp_endpoint` set, every span at `INFO` or above (whatever `RUST_LOG`
//!   says: it only governs log lines) is exported as OpenTelemetry over OTLP/HTTP with protobuf
//!   bodies, batched, with the resource attribute `service.name`. A span's `tracing` fields
//!   become its attributes and its `tracing` parent its parent. Spans of the export machinery
//!   itself (HTTP client, OpenTelemetry SDK) are never exported, so exporting cannot feed on
//!   itself.
//!
//! The batch processor runs on a thread of its own with a blocking HTTP client, not on the
//! tokio runtime: export goes on whatever the runtime is doing, and the last batch can still
//! be sent after the runtime has stopped. [`install`] returns a [`Telemetry`] guard; dropping
//! it (or [`Telemetry::shutdown`]) sends what is queued and stops the exporter, so spans are
//! not lost at exit. Both block for up to a few seconds while a collector answers: from async
//! code, call them through `tokio::task::spawn_blocking` (a collector served by the same
//! single-threaded runtime could not answer otherwise).
//!
//! Export failures (collector unreachable, refusing) are logged by the OpenTelemetry SDK as
//! warnings under the `opentelemetry*` targets; spans are then dropped, never queued beyond
//! the SDK's bounded queue (2048 spans).

use std::io::IsTerminal as _;
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing::level_filters::LevelFilter;
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{Layer, Registry};

use crate::config::{LogFormat, TelemetryConfig};

/// The instrumentation scope of the server's spans.
const TRACER_NAME: &str = "voxgate-server";

/// How long [`Telemetry::shutdown`] waits for the last batch to be accepted.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Targets whose spans are never exported: the exporter's own HTTP stack and the SDK. Their
/// spans would be created while a batch is sent and themselves be exported, for ever.
const EXPORT_MACHINERY: [&str; 8] = [
    "opentelemetry",
    "hyper",
    "reqwest",
    "h2",
    "tower",
    "rustls",
    "tokio_util",
    "tracing_opentelemetry",
];

/// Why telemetry could not be set up, flushed or shut down.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TelemetryError {
    /// The OTLP exporter could not be built (a bad endpoint, an HTTP client that would not
    /// start).
    #[error("cannot set up OTLP export to {url}: {message}")]
    Exporter {
        /// Where spans were to go.
        url: String,
        /// What failed.
        message: String,
    },
    /// A global `tracing` subscriber is already installed (one per process).
    #[error("a tracing subscriber is already installed in this process: {0}")]
    AlreadyInstalled(String),
    /// Queued spans could not all be sent (collector unreachable, timed out, already shut down).
    #[error("flushing traces to {url}: {message}")]
    Export {
        /// Where spans were going.
        url: String,
        /// What failed.
        message: String,
    },
}

/// Keeps trace export running; dropping it sends the spans still queued and stops the
/// exporter (see [`Telemetry::shutdown`]). Without `otlp_endpoint` it holds nothing.
#[derive(Debug)]
#[must_use = "dropping the guard stops trace export"]
pub struct Telemetry {
    export: Option<Export>,
}

/// The tracer provider and where it sends.
#[derive(Debug)]
struct Export {
    provider: SdkTracerProvider,
    url: String,
}

impl Telemetry {
    /// Where spans are posted (`<otlp_endpoint>/v1/traces`), `None` when export is off.
    #[must_use]
    pub fn traces_url(&self) -> Option<&str> {
        self.export.as_ref().map(|e| e.url.as_str())
    }

    /// Sends every span that has ended so far and waits for the collector to accept them;
    /// export goes on afterwards. Blocks (see the [module docs](self)).
    ///
    /// # Errors
    /// [`TelemetryError::Export`] when the spans could not all be sent.
    pub fn flush(&self) -> Result<(), TelemetryError> {
        let Some(e) = &self.export else {
            return Ok(());
        };
        e.provider
            .force_flush()
            .map_err(|err| TelemetryError::Export {
                url: e.url.clone(),
                message: err.to_string(),
            })
    }

    /// Sends the spans still queued and stops the exporter; spans ending later are dropped.
    /// Blocks for up to five seconds (see the [module docs](self)). Dropping the guard does the
    /// same, reporting a failure on stderr.
    ///
    /// # Errors
    /// [`TelemetryError::Export`] when the last spans could not all be sent.
    pub fn shutdown(mut self) -> Result<(), TelemetryError> {
        self.stop()
    }

    fn stop(&mut self) -> Result<(), TelemetryError> {
        let Some(e) = self.export.take() else {
            return Ok(());
        };
        e.provider
            .shutdown_with_timeout(SHUTDOWN_TIMEOUT)
            .map_err(|err| TelemetryError::Export {
                url: e.url,
                message: err.to_string(),
            })
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            // The subscriber may already be gone at exit; stderr is not.
            eprintln!("warning: {e}");
        }
    }
}

/// Installs the process-wide `tracing` subscriber `config` describes: log lines on stderr in
/// `config.log_format`, filtered by `RUST_LOG` (default `info`), and, with
/// `config.otlp_endpoint` set, OTLP export of spans. Call once, early, from inside the tokio
/// runtime or outside it (the exporter needs neither). Keep the returned guard alive until
/// exit.
///
/// # Errors
/// [`TelemetryError::Exporter`] when the exporter cannot be built,
/// [`TelemetryError::AlreadyInstalled`] on a second call (or after another subscriber).
pub fn install(config: &TelemetryConfig) -> Result<Telemetry, TelemetryError> {
    let export = match config.traces_url() {
        Some(url) => Some(Export {
            provider: tracer_provider(config, &url)?,
            url,
        }),
        None => None,
    };
    let mut layers: Vec<Box<dyn Layer<Registry> + Send + Sync>> = vec![log_layer(config)];
    if let Some(e) = &export {
        let tracer = e.provider.tracer(TRACER_NAME);
        layers.push(
            tracing_opentelemetry::layer()
                .with_tracer(tracer)
                // A session's span moves between worker threads; the one it began on says
                // nothing.
                .with_threads(false)
                .with_filter(export_filter())
                .boxed(),
        );
    }
    let installed = tracing_subscriber::registry().with(layers).try_init();
    if let Err(err) = installed {
        // Nothing exported through this provider: stop its thread quietly.
        if let Some(e) = export {
            let _ = e.provider.shutdown_with_timeout(Duration::ZERO);
        }
        return Err(TelemetryError::AlreadyInstalled(err.to_string()));
    }
    Ok(Telemetry { export })
}

/// The stderr log layer: text or JSON, `RUST_LOG` (default `info`), colours only on a
/// terminal.
fn log_layer(config: &TelemetryConfig) -> Box<dyn Layer<Registry> + Send + Sync> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    match config.log_format {
        LogFormat::Text => layer
            .with_ansi(std::io::stderr().is_terminal())
            .with_filter(filter)
            .boxed(),
        LogFormat::Json => layer
            .json()
            // `"session":"s-1"` beside `"message"`, not under `"fields"`: what log shippers
            // index.
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(true)
            .with_filter(filter)
            .boxed(),
    }
}

/// What is exported: `INFO` and above, except the export machinery's own spans.
fn export_filter() -> Targets {
    EXPORT_MACHINERY.iter().fold(
        Targets::new().with_default(LevelFilter::INFO),
        |t, target| t.with_target(*target, LevelFilter::OFF),
    )
}

/// A tracer provider batching spans to `url` over OTLP/HTTP (protobuf), sampled by
/// `config.otlp_sample_ratio`, as `config.service_name`.
fn tracer_provider(
    config: &TelemetryConfig,
    url: &str,
) -> Result<SdkTracerProvider, TelemetryError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(url)
        .build()
        .map_err(|e| TelemetryError::Exporter {
            url: url.to_owned(),
            message: e.to_string(),
        })?;
    let root = if config.otlp_sample_ratio >= 1.0 {
        Sampler::AlwaysOn
    } else {
        Sampler::TraceIdRatioBased(config.otlp_sample_ratio)
    };
    let resource = Resource::builder()
        .with_service_name(config.service_name.trim().to_owned())
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(Sampler::ParentBased(Box::new(root)))
        .with_resource(resource)
        .build())
}

#[cfg(test)]
mod tests {
    use tracing::Level;

    use super::*;

    fn exported(target: &str, level: Level) -> bool {
        export_filter().would_enable(target, &level)
    }

    #[test]
    fn the_export_machinery_is_never_exported() {
        assert!(exported("voxgate_server::door", Level::INFO));
        assert!(!exported("voxgate_server::door", Level::DEBUG));
        for t in [
            "opentelemetry_sdk::trace",
            "opentelemetry_otlp",
            "hyper_util::client",
            "reqwest::blocking",
            "h2::proto",
        ] {
            assert!(!exported(t, Level::ERROR), "{t}");
        }
    }

    #[test]
    fn without_an_endpoint_the_guard_holds_nothing() {
        let t = Telemetry { export: None };
        assert_eq!(t.traces_url(), None);
        t.flush().unwrap();
        t.shutdown().unwrap();
    }

    #[test]
    fn a_provider_is_built_without_a_runtime() {
        let config = TelemetryConfig {
            otlp_endpoint: Some("http://127.0.0.1:9".into()),
            otlp_sample_ratio: 0.5,
            ..TelemetryConfig::default()
        };
        let url = config.traces_url().unwrap();
        let provider = tracer_provider(&config, &url).unwrap();
        // Nothing queued: shutting down sends nothing and needs no collector.
        provider
            .shutdown_with_timeout(Duration::from_secs(1))
            .unwrap();
    }
}
