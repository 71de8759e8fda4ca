//! The `[admin]` section (who may use `/admin/*`) and the top-level `trusted_proxies` list
//! (whose forwarding headers are believed). The rule they feed is in `crate::access` and
//! `docs/security.md`.
//!
//! ```toml
//! trusted_proxies = ["127.0.0.1", "10.0.0.0/8"]   # top level: applies to the whole server
//!
//! [admin]
//! tokens = ["..."]     # Authorization: Bearer <token> on /admin/*, from anywhere
//!                      # empty: /admin/* only for local requests
//! ```
//!
//! `trusted_proxies` is a top-level key rather than part of `[admin]` because it describes the
//! network in front of the server, not one surface: every place that asks "who is the client"
//! (today `/admin/*` and the Retell control API) uses the same list.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::ConfigError;
use super::env::{EnvVars, Secret};

/// Settings of the operator surface `/admin/*` (`[admin]` in the configuration file).
///
/// With `tokens` set, `/admin/*` wants one of them (`Authorization: Bearer <token>`) from every
/// client, local or not, and `[bridge] tokens` no longer open it. With `tokens` empty it is
/// served only to local requests (see `crate::access`), which must also carry a `[bridge]`
/// token when those are set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// Bearer tokens accepted on `/admin/*`; empty: local requests only.
    pub tokens: Vec<String>,
}

impl AdminConfig {
    /// Applies `VOXGATE_ADMIN_TOKENS` (comma-separated; empty: none).
    pub(crate) fn apply_env(&mut self, var: &impl Fn(&str) -> Option<String>) {
        EnvVars::new(var).list("VOXGATE_ADMIN_TOKENS", &mut self.tokens);
    }

    /// Replaces secrets with `***` for `--print-config`.
    pub(crate) fn mask_secrets(&mut self) {
        self.tokens.mask();
    }

    /// Rejects blank tokens: an empty bearer would match one.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        if self.tokens.iter().any(|t| t.trim().is_empty()) {
            return Err(ConfigError::Invalid(
                "[admin] tokens must not be blank".into(),
            ));
        }
        Ok(())
    }
}

/// One entry of `trusted_proxies`: an IP address (`127.0.0.1`, `::1`) or a CIDR range
/// (`10.0.0.0/8`, `fd00::/8`) of reverse proxies whose `Forwarded` / `X-Forwarded-For`
/// headers are believed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TrustedProxy(IpNet);

impl TrustedProxy {
    /// Whether `ip` (an IPv4-mapped IPv6 address counts as its IPv4 address) is in this entry.
    #[must_use]
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.contains(&ip.to_canonical())
    }

    /// The range (a single address is a `/32` or `/128`).
    #[must_use]
    pub fn net(&self) -> IpNet {
        self.0
    }
}

/// A `trusted_proxies` entry that is not an IP address or CIDR range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not an IP address or CIDR range (like 10.0.0.0/8): {reason}")]
pub struct TrustedProxyError {
    value: String,
    reason: String,
}

impl FromStr for TrustedProxy {
    type Err = TrustedProxyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let value = s.trim();
        let fail = |reason: String| TrustedProxyError {
            value: s.to_owned(),
            reason,
        };
        if value.contains('/') {
            let net: IpNet = value.parse().map_err(|e| fail(format!("{e}")))?;
            // `10.0.0.1/8` is ambiguous: the operator meant the range or the one address.
            if net.addr() != net.network() {
                return Err(fail(format!(
                    "host bits are set; write {} for the range or {} for the one address",
                    net.trunc(),
                    IpNet::from(net.addr())
                )));
            }
            return Ok(Self(net));
        }
        let ip: IpAddr = value.parse().map_err(|e| fail(format!("{e}")))?;
        Ok(Self(IpNet::from(ip.to_canonical())))
    }
}

impl fmt::Display for TrustedProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.prefix_len() == self.0.max_prefix_len() {
            write!(f, "{}", self.0.addr())
        } else {
            write!(f, "{}", self.0)
        }
    }
}

impl Serialize for TrustedProxy {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TrustedProxy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Applies `VOXGATE_TRUSTED_PROXIES` (comma-separated addresses and ranges; empty: none).
pub(crate) fn apply_trusted_proxies_env(
    into: &mut Vec<TrustedProxy>,
    var: &impl Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    const NAME: &str = "VOXGATE_TRUSTED_PROXIES";
    let Some(v) = var(NAME) else {
        return Ok(());
    };
    *into = super::env::list(&v)
        .iter()
        .map(|entry| {
            entry
                .parse()
                .map_err(|e: TrustedProxyError| ConfigError::Env {
                    name: NAME,
                    message: e.to_string(),
                })
        })
        .collect::<Result<_, _>>()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn addresses_and_ranges_parse_and_match() {
        let one: TrustedProxy = " 127.0.0.1 ".parse().unwrap();
        assert!(one.contains(ip("127.0.0.1")));
        assert!(one.contains(ip("::ffff:127.0.0.1")), "mapped IPv4 counts");
        assert!(!one.contains(ip("127.0.0.2")));
        assert_eq!(one.to_string(), "127.0.0.1");
        let range: TrustedProxy = "10.0.0.0/8".parse().unwrap();
        assert!(range.contains(ip("10.200.3.4")));
        assert!(!range.contains(ip("11.0.0.1")));
        assert_eq!(range.to_string(), "10.0.0.0/8");
        let v6: TrustedProxy = "fd00::/8".parse().unwrap();
        assert!(v6.contains(ip("fd12::1")));
        assert!(!v6.contains(ip("10.0.0.1")));
        let mapped: TrustedProxy = "::ffff:192.0.2.1".parse().unwrap();
        assert_eq!(mapped.to_string(), "192.0.2.1");
        assert!(mapped.contains(ip("192.0.2.1")));
    }

    #[test]
    fn bad_entries_say_what_is_wrong() {
        for (bad, says) in [
            ("localhost", "invalid IP address syntax"),
            ("10.0.0.0/33", "invalid IP address syntax"),
            (
                "10.0.0.1/8",
                "write 10.0.0.0/8 for the range or 10.0.0.1/32",
            ),
            ("", "invalid IP address syntax"),
        ] {
            let e = bad.parse::<TrustedProxy>().unwrap_err().to_string();
            assert!(e.contains(says), "{bad:?}: {e}");
            assert!(e.contains("is not an IP address or CIDR range"), "{e}");
        }
    }

    #[test]
    fn file_env_print_and_checks() {
        let c = Config::from_toml(
            "trusted_proxies = [\"127.0.0.1\", \"10.0.0.0/8\"]\n[admin]\ntokens = [\"adm\"]\n",
        )
        .unwrap();
        assert_eq!(c.trusted_proxies.len(), 2);
        assert_eq!(c.admin.tokens, ["adm"]);
        let printed = c.to_toml();
        assert!(!printed.contains("\"adm\""), "{printed}");
        assert!(printed.contains("10.0.0.0/8"), "{printed}");
        let back = Config::from_toml(&printed).unwrap();
        assert_eq!(back.trusted_proxies, c.trusted_proxies);
        assert_eq!(back.admin.tokens, ["***"]);

        let e = Config::from_toml("trusted_proxies = [\"proxy.local\"]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"proxy.local\" is not an IP address"), "{e}");
        let e = Config::from_toml("[admin]\ntokens = [\" \"]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("[admin] tokens must not be blank"), "{e}");

        let mut c = Config::default();
        c.apply_env(|k| match k {
            "VOXGATE_ADMIN_TOKENS" => Some("a, b".into()),
            "VOXGATE_TRUSTED_PROXIES" => Some(" ::1, 192.168.0.0/16 ,".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(c.admin.tokens, ["a", "b"]);
        assert_eq!(
            c.trusted_proxies
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            ["::1", "192.168.0.0/16"]
        );
        let bad = Config::default()
            .apply_env(|k| (k == "VOXGATE_TRUSTED_PROXIES").then(|| "10.0.0.1/8".into()));
        match bad {
            Err(ConfigError::Env { name, message }) => {
                assert_eq!(name, "VOXGATE_TRUSTED_PROXIES");
                assert!(message.contains("host bits are set"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        c.apply_env(|k| (k == "VOXGATE_TRUSTED_PROXIES").then(String::new))
            .unwrap();
        assert!(c.trusted_proxies.is_empty());
    }
}
