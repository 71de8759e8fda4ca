//! `[webrtc]`: the WebRTC media layer shared by the Gemini bridge's `WEBRTC_OFFER` and the VIP
//! browser door, and its `VOXGATE_WEBRTC_*` overrides.
//!
//! | key | env | default | |
//! |---|---|---|---|
//! | `enabled` | `VOXGATE_WEBRTC_ENABLED` | `true` | answer WebRTC offers at all |
//! | `udp_listen` | `VOXGATE_WEBRTC_UDP_LISTEN` | `127.0.0.1:0` | the one UDP socket every session shares (port 0: any free port) |
//! | `candidate_ips` | `VOXGATE_WEBRTC_CANDIDATE_IPS` (comma-separated) | the bound IP | host candidates to advertise (needed when `udp_listen` is `0.0.0.0`) |
//! | `public_ip` | `VOXGATE_WEBRTC_PUBLIC_IP` | none | 1:1 NAT: also advertised, as a server-reflexive candidate on the same port |
//! | `max_sessions` | `VOXGATE_WEBRTC_MAX_SESSIONS` | `500` | peer connections open at once; more offers are refused |
//! | `connect_timeout_secs` | `VOXGATE_WEBRTC_CONNECT_TIMEOUT_SECS` | `15` | ICE and DTLS must complete within this after the answer |
//! | `max_playout_ms` | `VOXGATE_WEBRTC_MAX_PLAYOUT_MS` | `30000` | reply audio queued for real-time sending per session; more is dropped and counted |
//!
//! TURN is not built in: clients behind a symmetric NAT need a TURN server (coturn) that they
//! are configured to use; see `docs/webrtc.md`.

use std::net::{IpAddr, SocketAddr};

use serde::{Deserialize, Serialize};

use crate::config::ConfigError;
use crate::config::env::EnvVars;

/// Settings of the WebRTC media layer (`[webrtc]` in the configuration file).
///
/// ```toml
/// [webrtc]
/// enabled = true
/// udp_listen = "0.0.0.0:3478"       # one UDP port for every session
/// candidate_ips = ["192.0.2.10"]    # what clients are told to send to
/// public_ip = "203.0.113.7"         # behind a 1:1 NAT (a cloud VM's public address)
/// max_sessions = 500
/// connect_timeout_secs = 15
/// max_playout_ms = 30000
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebRtcConfig {
    /// Answer offers at all (Gemini `WEBRTC_OFFER`, `POST /webrtc/offer`).
    pub enabled: bool,
    /// The UDP socket all sessions share; str0m tells sessions apart by their ICE credentials
    /// and then by the peer's address.
    pub udp_listen: SocketAddr,
    /// Host candidates to advertise. Empty: the bound address, which must then be a specific
    /// IP (not `0.0.0.0`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub candidate_ips: Vec<IpAddr>,
    /// The public address of a 1:1 NAT in front of the server, advertised as a
    /// server-reflexive candidate on the bound port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub public_ip: Option<IpAddr>,
    /// Peer connections open at once; further offers are refused (503).
    pub max_sessions: usize,
    /// ICE and DTLS must complete within this many seconds of the answer.
    pub connect_timeout_secs: u64,
    /// Reply audio held for real-time sending per session, in milliseconds.
    pub max_playout_ms: u64,
}

impl Default for WebRtcConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            udp_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            candidate_ips: Vec::new(),
            public_ip: None,
            max_sessions: 500,
            connect_timeout_secs: 15,
            max_playout_ms: 30_000,
        }
    }
}

impl WebRtcConfig {
    /// Applies the `VOXGATE_WEBRTC_*` overrides.
    pub(crate) fn apply_env(
        &mut self,
        var: &impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        let vars = EnvVars::new(var);
        vars.flag("VOXGATE_WEBRTC_ENABLED", &mut self.enabled)?;
        vars.parsed("VOXGATE_WEBRTC_UDP_LISTEN", &mut self.udp_listen)?;
        if let Some(v) = var("VOXGATE_WEBRTC_CANDIDATE_IPS") {
            self.candidate_ips = v
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| {
                    s.parse().map_err(|e| ConfigError::Env {
                        name: "VOXGATE_WEBRTC_CANDIDATE_IPS",
                        message: format!("{s:?} is not an IP address: {e}"),
                    })
                })
                .collect::<Result<_, _>>()?;
        }
        vars.parsed_some("VOXGATE_WEBRTC_PUBLIC_IP", &mut self.public_ip)?;
        vars.parsed("VOXGATE_WEBRTC_MAX_SESSIONS", &mut self.max_sessions)?;
        vars.parsed(
            "VOXGATE_WEBRTC_CONNECT_TIMEOUT_SECS",
            &mut self.connect_timeout_secs,
        )?;
        vars.parsed("VOXGATE_WEBRTC_MAX_PLAYOUT_MS", &mut self.max_playout_ms)?;
        Ok(())
    }

    /// Refuses settings that cannot work.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        if !self.enabled {
            return Ok(());
        }
        if self.udp_listen.ip().is_unspecified() && self.candidate_ips.is_empty() {
            return Err(ConfigError::Invalid(format!(
                "[webrtc] udp_listen = \"{}\" is not one address: list the addresses clients \
                 reach the server at in candidate_ips",
                self.udp_listen
            )));
        }
        if self.connect_timeout_secs == 0 {
            return Err(ConfigError::Invalid(
                "[webrtc] connect_timeout_secs must be at least 1".into(),
            ));
        }
        if !(200..=600_000).contains(&self.max_playout_ms) {
            return Err(ConfigError::Invalid(format!(
                "[webrtc] max_playout_ms = {} is outside 200..=600000",
                self.max_playout_ms
            )));
        }
        Ok(())
    }

    /// Moves the UDP socket to a free loopback port (tests, several servers in one process).
    pub(crate) fn ephemeral_ports(&mut self) {
        self.udp_listen = SocketAddr::from(([127, 0, 0, 1], 0));
        self.candidate_ips.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_pass_and_wildcards_need_candidates() {
        let mut c = WebRtcConfig::default();
        c.check().unwrap();
        c.udp_listen = "0.0.0.0:3478".parse().unwrap();
        assert!(c.check().is_err());
        c.candidate_ips = vec!["192.0.2.10".parse().unwrap()];
        c.check().unwrap();
    }

    #[test]
    fn env_overrides() {
        let mut c = WebRtcConfig::default();
        c.apply_env(&|k: &str| match k {
            "VOXGATE_WEBRTC_UDP_LISTEN" => Some("0.0.0.0:40000".into()),
            "VOXGATE_WEBRTC_CANDIDATE_IPS" => Some("192.0.2.1, 192.0.2.2".into()),
            "VOXGATE_WEBRTC_PUBLIC_IP" => Some("203.0.113.7".into()),
            "VOXGATE_WEBRTC_MAX_SESSIONS" => Some("20".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(c.udp_listen.port(), 40000);
        assert_eq!(c.candidate_ips.len(), 2);
        assert_eq!(c.public_ip, Some("203.0.113.7".parse().unwrap()));
        assert_eq!(c.max_sessions, 20);
        let bad = WebRtcConfig::default()
            .apply_env(&|k: &str| (k == "VOXGATE_WEBRTC_CANDIDATE_IPS").then(|| "nope".into()));
        assert!(bad.is_err());
    }
}
