//! The `[telemetry]` section: how log lines are written and where traces are exported, with
//! its `VOXGATE_*` overrides. The subscriber it configures is [`crate::telemetry`]; the
//! operator's guide is `docs/operations.md`.
//!
//! | key | env | default | |
//! |---|---|---|---|
//! | `log_format` | `VOXGATE_LOG_FORMAT` | `text` | `text` (for people) or `json` (one object a line, for log shippers); the binary's `--log-format` goes over both |
//! | `otlp_endpoint` | `VOXGATE_OTLP_ENDPOINT` (blank: unset); when neither it nor the file sets one, the standard `OTEL_EXPORTER_OTLP_ENDPOINT` | none: no export | base URL of an OTLP/HTTP collector (`http://localhost:4318`); spans are sent to `<url>/v1/traces` as protobuf |
//! | `service_name` | `VOXGATE_SERVICE_NAME` | `voxgate-server` | the `service.name` of the exported spans |
//! | `otlp_sample_ratio` | `VOXGATE_OTLP_SAMPLE_RATIO` | `1.0` | share of traces exported, `0` to `1`; a child span follows its parent's decision |
//!
//! Only OTLP over HTTP with protobuf bodies is built in (the collector's port 4318), not gRPC
//! (4317). The exporter still reads the standard `OTEL_EXPORTER_OTLP_HEADERS` and
//! `OTEL_EXPORTER_OTLP_TIMEOUT` for what this section does not set.

use std::fmt;
use std::str::FromStr;

use axum::http::Uri;
use serde::{Deserialize, Serialize};

use super::ConfigError;
use super::env::EnvVars;

/// The standard OpenTelemetry variable read when `VOXGATE_OTLP_ENDPOINT` and the file leave
/// `otlp_endpoint` unset.
pub const OTEL_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

/// Default [`TelemetryConfig::service_name`].
pub const DEFAULT_SERVICE_NAME: &str = "voxgate-server";

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One human-readable line per event, `key=value` fields (colours only on a terminal).
    #[default]
    Text,
    /// One JSON object per line (timestamp, level, target, fields, the spans it is in), for
    /// log shippers; never coloured.
    Json,
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            // The callers (the environment, `--log-format`) quote the value themselves.
            _ => Err("not a log format: expected text or json".to_owned()),
        }
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Text => "text",
            Self::Json => "json",
        })
    }
}

/// Logs and trace export (`[telemetry]` in the configuration file).
///
/// ```toml
/// [telemetry]
/// log_format = "json"                       # text | json
/// otlp_endpoint = "http://localhost:4318"   # OTLP/HTTP collector; absent: no export
/// service_name = "voxgate-server"
/// otlp_sample_ratio = 0.1                   # export one trace in ten
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// How log lines are written.
    pub log_format: LogFormat,
    /// Base URL of an OTLP/HTTP collector (`http://host:4318`, `https://...`); spans go to
    /// `<url>/v1/traces` (an URL already ending in `/v1/traces` is used as it is). `None`: no
    /// export.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub otlp_endpoint: Option<String>,
    /// The `service.name` resource attribute of exported spans.
    pub service_name: String,
    /// Share of traces exported, `0.0..=1.0` (by trace id, so a trace is exported whole or
    /// not at all).
    pub otlp_sample_ratio: f64,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            log_format: LogFormat::Text,
            otlp_endpoint: None,
            service_name: DEFAULT_SERVICE_NAME.to_owned(),
            otlp_sample_ratio: 1.0,
        }
    }
}

impl TelemetryConfig {
    /// Applies `VOXGATE_LOG_FORMAT`, `VOXGATE_OTLP_ENDPOINT` (or, when that and the file leave
    /// the endpoint unset, `OTEL_EXPORTER_OTLP_ENDPOINT`), `VOXGATE_SERVICE_NAME` and
    /// `VOXGATE_OTLP_SAMPLE_RATIO`.
    pub(crate) fn apply_env(
        &mut self,
        var: &impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        let vars = EnvVars::new(var);
        vars.parsed("VOXGATE_LOG_FORMAT", &mut self.log_format)?;
        if let Some(v) = vars.raw("VOXGATE_OTLP_ENDPOINT") {
            self.otlp_endpoint = endpoint_from_env("VOXGATE_OTLP_ENDPOINT", &v)?;
        } else if self.otlp_endpoint.is_none()
            && let Some(v) = vars.raw(OTEL_ENDPOINT_ENV)
        {
            self.otlp_endpoint = endpoint_from_env(OTEL_ENDPOINT_ENV, &v)?;
        }
        vars.trimmed("VOXGATE_SERVICE_NAME", &mut self.service_name);
        vars.parsed("VOXGATE_OTLP_SAMPLE_RATIO", &mut self.otlp_sample_ratio)?;
        Ok(())
    }

    /// Replaces a password in the endpoint's URL (`https://user:secret@host`) with `***` for
    /// `--print-config`.
    pub(crate) fn mask_secrets(&mut self) {
        if let Some(url) = &mut self.otlp_endpoint
            && let Some((before, after)) = url.split_once('@')
            && let Some((scheme, user_info)) = before.split_once("://")
            && !after.contains('@')
        {
            let user = user_info.split_once(':').map_or(user_info, |(u, _)| u);
            *url = format!("{scheme}://{user}:***@{after}");
        }
    }

    /// Refuses an endpoint that is not an `http(s)://` URL, a blank service name and a sample
    /// ratio outside `0..=1`.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        if let Some(url) = &self.otlp_endpoint {
            check_endpoint(url)
                .map_err(|why| ConfigError::Invalid(format!("[telemetry] otlp_endpoint {why}")))?;
        }
        if self.service_name.trim().is_empty() {
            return Err(ConfigError::Invalid(
                "[telemetry] service_name must not be blank".into(),
            ));
        }
        if !(0.0..=1.0).contains(&self.otlp_sample_ratio) {
            return Err(ConfigError::Invalid(format!(
                "[telemetry] otlp_sample_ratio = {} is outside 0..=1 (1: every trace, 0.1: one \
                 in ten)",
                self.otlp_sample_ratio
            )));
        }
        Ok(())
    }

    /// Where spans are posted: the endpoint with `/v1/traces` appended, as the standard
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` is read; `None` when export is off.
    #[must_use]
    pub fn traces_url(&self) -> Option<String> {
        let base = self.otlp_endpoint.as_deref()?.trim();
        if base.trim_end_matches('/').ends_with("/v1/traces") {
            return Some(base.to_owned());
        }
        Some(format!("{}/v1/traces", base.trim_end_matches('/')))
    }
}

/// An endpoint variable's value: blank unsets, anything else must be an `http(s)://` URL.
fn endpoint_from_env(name: &'static str, v: &str) -> Result<Option<String>, ConfigError> {
    let v = v.trim();
    if v.is_empty() {
        return Ok(None);
    }
    check_endpoint(v).map_err(|message| ConfigError::Env { name, message })?;
    Ok(Some(v.to_owned()))
}

/// `Ok` for an absolute `http://` or `https://` URL with a host and no query; otherwise what
/// is wrong, starting with the value.
fn check_endpoint(url: &str) -> Result<(), String> {
    let fail = |why: &str| {
        Err(format!(
            "{url:?} {why} (an OTLP/HTTP collector's base URL, like http://localhost:4318)"
        ))
    };
    let Ok(uri) = url.trim().parse::<Uri>() else {
        return fail("is not a URL");
    };
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return fail("is not an http:// or https:// URL");
    }
    if uri.host().is_none_or(str::is_empty) {
        return fail("has no host");
    }
    if uri.query().is_some() {
        return fail("must not have a query");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn defaults_print_and_round_trip() {
        let c = Config::default();
        assert_eq!(c.telemetry.log_format, LogFormat::Text);
        assert_eq!(c.telemetry.otlp_endpoint, None);
        assert_eq!(c.telemetry.traces_url(), None);
        let printed = c.to_toml();
        assert!(printed.contains("[telemetry]"), "{printed}");
        assert!(printed.contains("log_format = \"text\""), "{printed}");
        assert!(
            printed.contains("service_name = \"voxgate-server\""),
            "{printed}"
        );
        assert!(printed.contains("otlp_sample_ratio = 1.0"), "{printed}");
        assert_eq!(Config::from_toml(&printed).unwrap(), c);
    }

    #[test]
    fn file_values_and_the_traces_url() {
        let c = Config::from_toml(
            "[telemetry]\nlog_format = \"json\"\notlp_endpoint = \"http://127.0.0.1:4318/\"\n\
             service_name = \"edge-1\"\notlp_sample_ratio = 0.25\n",
        )
        .unwrap();
        let t = &c.telemetry;
        assert_eq!(t.log_format, LogFormat::Json);
        assert_eq!(t.service_name, "edge-1");
        assert!((t.otlp_sample_ratio - 0.25).abs() < f64::EPSILON);
        assert_eq!(
            t.traces_url().as_deref(),
            Some("http://127.0.0.1:4318/v1/traces")
        );
        let printed = c.to_toml();
        assert!(printed.contains("otlp_endpoint"), "{printed}");
        assert_eq!(Config::from_toml(&printed).unwrap(), c);

        let mut t = TelemetryConfig {
            otlp_endpoint: Some("https://otel.example/prefix/v1/traces".into()),
            ..TelemetryConfig::default()
        };
        assert_eq!(
            t.traces_url().as_deref(),
            Some("https://otel.example/prefix/v1/traces")
        );
        t.otlp_endpoint = Some("https://otel.example/prefix".into());
        assert_eq!(
            t.traces_url().as_deref(),
            Some("https://otel.example/prefix/v1/traces")
        );
    }

    #[test]
    fn bad_values_say_what_is_wrong() {
        for (toml, says) in [
            (
                "log_format = \"xml\"",
                "unknown variant `xml`, expected `text` or `json`",
            ),
            (
                "otlp_endpoint = \"localhost:4318\"",
                "is not an http:// or https:// URL",
            ),
            (
                "otlp_endpoint = \"grpc://collector:4317\"",
                "is not an http:// or https:// URL",
            ),
            ("otlp_endpoint = \"http://\"", "is not a URL"),
            (
                "otlp_endpoint = \"http://c:4318/?x=1\"",
                "must not have a query",
            ),
            (
                "otlp_sample_ratio = 1.5",
                "otlp_sample_ratio = 1.5 is outside 0..=1",
            ),
            ("otlp_sample_ratio = -0.1", "is outside 0..=1"),
            ("otlp_sample_ratio = nan", "is outside 0..=1"),
            (
                "service_name = \" \"",
                "[telemetry] service_name must not be blank",
            ),
            ("otlp_protocol = \"grpc\"", "unknown field `otlp_protocol`"),
        ] {
            let e = Config::from_toml(&format!("[telemetry]\n{toml}\n"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(says), "{toml}: {e}");
        }
    }

    #[test]
    fn env_overrides_and_the_standard_variable() {
        let mut c = Config::default();
        c.apply_env(env(&[
            ("VOXGATE_LOG_FORMAT", " JSON "),
            ("VOXGATE_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://ignored:4318"),
            ("VOXGATE_SERVICE_NAME", " edge "),
            ("VOXGATE_OTLP_SAMPLE_RATIO", "0.5"),
        ]))
        .unwrap();
        let t = &c.telemetry;
        assert_eq!(t.log_format, LogFormat::Json);
        assert_eq!(t.otlp_endpoint.as_deref(), Some("http://127.0.0.1:4318"));
        assert_eq!(t.service_name, "edge");
        assert!((t.otlp_sample_ratio - 0.5).abs() < f64::EPSILON);

        // The standard variable fills in only when ours and the file leave it unset.
        let mut c = Config::default();
        c.apply_env(env(&[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://collector:4318",
        )]))
        .unwrap();
        assert_eq!(
            c.telemetry.otlp_endpoint.as_deref(),
            Some("http://collector:4318")
        );
        let mut c =
            Config::from_toml("[telemetry]\notlp_endpoint = \"http://from-file:4318\"\n").unwrap();
        c.apply_env(env(&[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://collector:4318",
        )]))
        .unwrap();
        assert_eq!(
            c.telemetry.otlp_endpoint.as_deref(),
            Some("http://from-file:4318")
        );
        // A blank VOXGATE_OTLP_ENDPOINT turns export off, whatever the others say.
        c.apply_env(env(&[
            ("VOXGATE_OTLP_ENDPOINT", " "),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
        ]))
        .unwrap();
        assert_eq!(c.telemetry.otlp_endpoint, None);

        for (vars, name, says) in [
            (
                &[("VOXGATE_LOG_FORMAT", "yaml")][..],
                "VOXGATE_LOG_FORMAT",
                "\"yaml\": not a log format: expected text or json",
            ),
            (
                &[("VOXGATE_OTLP_ENDPOINT", "collector:4318")][..],
                "VOXGATE_OTLP_ENDPOINT",
                "is not an http:// or https:// URL",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://c")][..],
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "is not an http:// or https:// URL",
            ),
            (
                &[("VOXGATE_OTLP_SAMPLE_RATIO", "half")][..],
                "VOXGATE_OTLP_SAMPLE_RATIO",
                "\"half\"",
            ),
        ] {
            let vars: &'static [(&'static str, &'static str)] = vars;
            match Config::default().apply_env(env(vars)) {
                Err(ConfigError::Env { name: n, message }) => {
                    assert_eq!(n, name);
                    assert!(message.contains(says), "{name}: {message}");
                }
                other => panic!("{name}: {other:?}"),
            }
        }
        let e = Config::default()
            .apply_env(env(&[("VOXGATE_OTLP_SAMPLE_RATIO", "2")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("otlp_sample_ratio = 2 is outside 0..=1"), "{e}");
    }

    #[test]
    fn a_password_in_the_endpoint_is_masked() {
        let c = Config::from_toml(
            "[telemetry]\notlp_endpoint = \"https://user:s3cret@otel.example:4318\"\n",
        )
        .unwrap();
        let printed = c.to_toml();
        assert!(!printed.contains("s3cret"), "{printed}");
        assert!(
            printed.contains("https://user:***@otel.example:4318"),
            "{printed}"
        );
        let mut t = TelemetryConfig {
            otlp_endpoint: Some("http://127.0.0.1:4318".into()),
            ..TelemetryConfig::default()
        };
        t.mask_secrets();
        assert_eq!(t.otlp_endpoint.as_deref(), Some("http://127.0.0.1:4318"));
    }

    #[test]
    fn log_format_text_forms() {
        assert_eq!("Text".parse::<LogFormat>(), Ok(LogFormat::Text));
        assert_eq!(LogFormat::Json.to_string(), "json");
        assert!("".parse::<LogFormat>().is_err());
    }
}
