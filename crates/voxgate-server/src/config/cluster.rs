//! The `[cluster]` section: several server instances coordinated through Redis (or Valkey).
//!
//! ```toml
//! [cluster]
//! redis_url = "redis://127.0.0.1:6379/0"   # absent: one process, no Redis (the default)
//! instance_id = "voxgate-a"                # absent: a random id per start
//! lease_ms = 10000                         # directory and admission leases
//! max_sessions = 2000                      # sessions across every instance; 0: no cluster limit
//! ```
//!
//! Without `redis_url` nothing here is used and the server runs exactly as a single process.
//! `docs/scale-out.md` says what is shared and what is not.

use serde::{Deserialize, Serialize};

use super::ConfigError;
use super::env::EnvVars;

/// Default [`ClusterConfig::lease_ms`]: an instance that dies leaves the directory within 10 s.
pub const DEFAULT_LEASE_MS: u64 = 10_000;
/// Default [`ClusterConfig::request_timeout_ms`].
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 2_000;
/// Default [`ClusterConfig::perception_stream_len`].
pub const DEFAULT_PERCEPTION_STREAM_LEN: usize = 10_000;
/// Default [`ClusterConfig::key_prefix`].
pub const DEFAULT_KEY_PREFIX: &str = "voxgate";

/// Settings of the scale-out layer (`[cluster]` in the configuration file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// Where Redis is (`redis://[user:password@]host:port[/db]`); `None`: no cluster.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_url: Option<String>,
    /// This instance's name in the directory and on its routing channel; empty: a random id
    /// made at start (so a restarted instance never answers for its predecessor's sessions).
    pub instance_id: String,
    /// How long a directory entry or cluster admission slot lives unless its holder renews it
    /// (every third of this): how long a dead instance's sessions stay listed.
    pub lease_ms: u64,
    /// Sessions across every instance sharing this Redis and key prefix; 0: no cluster-wide
    /// limit (each instance's `[limits]` still apply).
    pub max_sessions: usize,
    /// Prefix of every key and channel, so several clusters can share one Redis.
    pub key_prefix: String,
    /// How long a request routed to another instance may take (a push, an interrupt, a tool
    /// call is bounded by its own timeout on top).
    pub request_timeout_ms: u64,
    /// Approximate length the perception stream is trimmed to (`XADD MAXLEN ~`).
    pub perception_stream_len: usize,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            redis_url: None,
            instance_id: String::new(),
            lease_ms: DEFAULT_LEASE_MS,
            max_sessions: 0,
            key_prefix: DEFAULT_KEY_PREFIX.to_owned(),
            request_timeout_ms: DEFAULT_REQUEST_TIMEOUT_MS,
            perception_stream_len: DEFAULT_PERCEPTION_STREAM_LEN,
        }
    }
}

/// Longest accepted `instance_id` and `key_prefix`: they are parts of every key.
const MAX_NAME: usize = 64;

impl ClusterConfig {
    /// Whether a Redis URL is configured.
    #[must_use]
    pub fn enabled(&self) -> bool {
        self.redis_url.is_some()
    }

    /// Applies `VOXGATE_REDIS_URL` (empty: none), `VOXGATE_INSTANCE_ID`,
    /// `VOXGATE_CLUSTER_MAX_SESSIONS` and `VOXGATE_CLUSTER_LEASE_MS`.
    pub(crate) fn apply_env(&mut self, vars: &EnvVars<'_>) -> Result<(), ConfigError> {
        vars.non_blank("VOXGATE_REDIS_URL", &mut self.redis_url);
        vars.trimmed("VOXGATE_INSTANCE_ID", &mut self.instance_id);
        vars.parsed("VOXGATE_CLUSTER_MAX_SESSIONS", &mut self.max_sessions)?;
        vars.parsed("VOXGATE_CLUSTER_LEASE_MS", &mut self.lease_ms)
    }

    /// Hides a password in the URL for `--print-config`.
    pub(crate) fn mask_secrets(&mut self) {
        if let Some(url) = &mut self.redis_url
            && let Some((scheme, rest)) = url.split_once("://")
            && let Some((_, host)) = rest.rsplit_once('@')
        {
            *url = format!("{scheme}://***@{host}");
        }
    }

    /// Checks names (printable, no key separators), the URL's scheme and the lease.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        let invalid = |m: String| Err(ConfigError::Invalid(format!("[cluster] {m}")));
        let name_ok = |s: &str| {
            s.len() <= MAX_NAME
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        };
        if !name_ok(&self.instance_id) {
            return invalid(format!(
                "instance_id must be at most {MAX_NAME} letters, digits, '-', '_' or '.'"
            ));
        }
        if self.key_prefix.is_empty() || !name_ok(&self.key_prefix) {
            return invalid(format!(
                "key_prefix must be 1 to {MAX_NAME} letters, digits, '-', '_' or '.'"
            ));
        }
        if let Some(url) = &self.redis_url
            && !(url.starts_with("redis://") || url.starts_with("valkey://"))
        {
            return invalid(format!(
                "redis_url must start with redis:// (TLS is not built in), got {:?}",
                url.split("://").next().unwrap_or("")
            ));
        }
        if self.lease_ms < 1_000 {
            return invalid(format!(
                "lease_ms must be at least 1000 (renewed every third of it), got {}",
                self.lease_ms
            ));
        }
        if self.request_timeout_ms == 0 {
            return invalid("request_timeout_ms must be above 0".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_is_masked_and_the_host_kept() {
        let mut c = ClusterConfig {
            redis_url: Some("redis://user:hunter2@10.0.0.5:6379/0".into()),
            ..ClusterConfig::default()
        };
        c.mask_secrets();
        assert_eq!(c.redis_url.as_deref(), Some("redis://***@10.0.0.5:6379/0"));
        let mut plain = ClusterConfig {
            redis_url: Some("redis://127.0.0.1:6379".into()),
            ..ClusterConfig::default()
        };
        plain.mask_secrets();
        assert_eq!(plain.redis_url.as_deref(), Some("redis://127.0.0.1:6379"));
    }

    #[test]
    fn bad_names_urls_and_leases_are_refused() {
        let ok = ClusterConfig {
            redis_url: Some("redis://127.0.0.1:6379".into()),
            instance_id: "voxgate-a.1".into(),
            ..ClusterConfig::default()
        };
        assert!(ok.check().is_ok());
        for bad in [
            ClusterConfig {
                instance_id: "a:b".into(),
                ..ok.clone()
            },
            ClusterConfig {
                key_prefix: String::new(),
                ..ok.clone()
            },
            ClusterConfig {
                redis_url: Some("rediss://host".into()),
                ..ok.clone()
            },
            ClusterConfig { lease_ms: 10, ..ok },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }
}
