//! Exposure warnings: doors that listen beyond loopback with no access control configured.
//!
//! `voxgate-server` logs each as a `WARN` line when it starts and prints each as a
//! `# WARNING: ...` comment at the top of `--print-config` (so the output stays valid TOML).
//! A warning is one line: the door, what is open, where, and the setting that closes it.
//!
//! A listener "beyond loopback" is any address that is not a loopback address, the wildcard
//! `0.0.0.0` / `::` included. Surfaces that are local-only without tokens (`/admin/*`, the
//! Retell control API) cannot be exposed by configuration and are not listed; `/health` and
//! `/metrics` are open by design (`docs/security.md`).

use std::net::SocketAddr;

use crate::config::Config;

/// One line per door reachable beyond loopback without access control, in a fixed order
/// (realtime, Xiaozhi, Retell, Gemini, Bridge, MCP, VIP); empty when there is none.
#[must_use]
pub fn exposure_warnings(config: &Config) -> Vec<String> {
    [realtime, xiaozhi, retell, gemini, bridge, mcp, vip]
        .iter()
        .filter_map(|door| door(config))
        .collect()
}

/// `warnings` as TOML comment lines (`# WARNING: ...`, each ending in a newline), to print
/// above the configuration.
#[must_use]
pub fn as_toml_comments(warnings: &[String]) -> String {
    warnings
        .iter()
        .map(|w| format!("# WARNING: {}\n", w.replace(['\r', '\n'], " ")))
        .collect()
}

fn beyond_loopback(addr: SocketAddr) -> bool {
    !addr.ip().to_canonical().is_loopback()
}

/// The main listener, when it is reachable from other hosts.
fn main_listener(config: &Config) -> Option<SocketAddr> {
    beyond_loopback(config.listen).then_some(config.listen)
}

/// `addrs` for a message: `0.0.0.0:8080 and 0.0.0.0:8000`.
fn listed(addrs: &[SocketAddr]) -> String {
    addrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" and ")
}

fn realtime(config: &Config) -> Option<String> {
    if !config.realtime.api_keys.is_empty() {
        return None;
    }
    let mut open = Vec::new();
    if let Some(addr) = main_listener(config) {
        open.push(if config.realtime.grpc_listen.is_none() {
            format!("/realtime and gRPC on {addr}")
        } else {
            format!("/realtime on {addr}")
        });
    }
    if let Some(addr) = config.realtime.grpc_listen.filter(|a| beyond_loopback(*a)) {
        open.push(format!("gRPC on {addr}"));
    }
    (!open.is_empty()).then(|| {
        format!(
            "realtime: {} accepts any client (no API keys); set [realtime] api_keys \
             (VOXGATE_API_KEYS)",
            open.join(" and ")
        )
    })
}

fn xiaozhi(config: &Config) -> Option<String> {
    if config.xiaozhi.auth {
        return None;
    }
    let addrs: Vec<SocketAddr> = main_listener(config)
        .into_iter()
        .chain(config.xiaozhi.listen.filter(|a| beyond_loopback(*a)))
        .collect();
    (!addrs.is_empty()).then(|| {
        format!(
            "xiaozhi: the device WebSocket on {} accepts any device (auth is off); set \
             [xiaozhi] auth = true (VOXGATE_XIAOZHI_AUTH)",
            listed(&addrs)
        )
    })
}

fn retell(config: &Config) -> Option<String> {
    if !config.retell.enabled || !config.retell.secret.is_empty() {
        return None;
    }
    let addr = main_listener(config)?;
    Some(format!(
        "retell: /llm-websocket/{{call_id}} on {addr} answers any caller with the configured \
         LLM (no socket secret); set [retell] secret (VOXGATE_RETELL_SECRET), or [retell] \
         enabled = false if it is unused"
    ))
}

fn gemini(config: &Config) -> Option<String> {
    crate::gemini::access::exposure(&config.gemini, config.listen).map(|w| format!("gemini: {w}"))
}

fn bridge(config: &Config) -> Option<String> {
    let addr = main_listener(config)?;
    config.bridge.tokens.is_empty().then(|| {
        format!(
            "bridge: /api/message and /api/perception/* on {addr} accept any client (no \
             tokens); set [bridge] tokens (VOXGATE_BRIDGE_TOKENS)"
        )
    })
}

fn mcp(config: &Config) -> Option<String> {
    let addr = main_listener(config)?;
    config.mcp.tokens.is_empty().then(|| {
        format!(
            "mcp: /mcp on {addr} accepts any MCP server, whose tools the agent then calls (no \
             tokens); set [mcp] tokens (VOXGATE_MCP_TOKENS)"
        )
    })
}

fn vip(config: &Config) -> Option<String> {
    if !config.vip.enabled || !config.webrtc.enabled || !config.vip.tokens.is_empty() {
        return None;
    }
    let addr = main_listener(config)?;
    Some(format!(
        "vip: /webrtc/offer on {addr} answers any browser with the configured LLM and speech \
         (no tokens); set [vip] tokens (VOXGATE_VIP_TOKENS), or [vip] enabled = false if it is \
         unused"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(config: &Config) -> Vec<&'static str> {
        exposure_warnings(config)
            .iter()
            .map(|w| {
                let door = w.split(':').next().unwrap_or_default();
                [
                    "realtime", "xiaozhi", "retell", "gemini", "bridge", "mcp", "vip",
                ]
                .into_iter()
                .find(|d| *d == door)
                .unwrap_or("?")
            })
            .collect()
    }

    fn wide() -> Config {
        Config {
            listen: "0.0.0.0:8080".parse().unwrap(),
            ..Config::default()
        }
    }

    #[test]
    fn loopback_defaults_warn_about_nothing() {
        assert!(exposure_warnings(&Config::default()).is_empty());
        let mut c = Config {
            listen: "[::1]:8080".parse().unwrap(),
            ..Config::default()
        };
        c.xiaozhi.listen = Some("127.0.0.1:8000".parse().unwrap());
        assert!(exposure_warnings(&c).is_empty());
    }

    #[test]
    fn a_wide_listener_without_auth_warns_per_door() {
        let c = wide();
        assert_eq!(
            open(&c),
            [
                "realtime", "xiaozhi", "retell", "gemini", "bridge", "mcp", "vip"
            ]
        );
        for w in exposure_warnings(&c) {
            assert!(w.contains("0.0.0.0:8080"), "{w}");
            assert!(!w.contains('\n'), "{w}");
        }
    }

    #[test]
    fn configured_auth_silences_its_door() {
        let mut c = wide();
        c.realtime.api_keys = vec!["k".into()];
        c.xiaozhi.auth = true;
        c.retell.secret = "s".into();
        c.gemini.tokens = vec!["g".into()];
        c.bridge.tokens = vec!["t".into()];
        c.mcp.tokens = vec!["m".into()];
        c.vip.tokens = vec!["v".into()];
        assert!(
            exposure_warnings(&c).is_empty(),
            "{:?}",
            exposure_warnings(&c)
        );
        c.mcp.tokens.clear();
        assert_eq!(open(&c), ["mcp"]);
    }

    #[test]
    fn a_door_own_listener_counts() {
        let mut c = Config::default();
        c.realtime.grpc_listen = Some("127.0.0.1:50051".parse().unwrap());
        c.xiaozhi.listen = Some("0.0.0.0:8000".parse().unwrap());
        c.gemini.listen = "0.0.0.0:3001".parse().unwrap();
        assert_eq!(open(&c), ["xiaozhi", "gemini"]);
        c.realtime.grpc_listen = Some("0.0.0.0:50051".parse().unwrap());
        assert_eq!(open(&c), ["realtime", "xiaozhi", "gemini"]);
        assert_eq!(
            exposure_warnings(&c)[0],
            "realtime: gRPC on 0.0.0.0:50051 accepts any client (no API keys); set \
             [realtime] api_keys (VOXGATE_API_KEYS)"
        );
        c.realtime.grpc_listen = None;
        let w = exposure_warnings(&c);
        assert!(w[0].contains("on 0.0.0.0:8000 accepts"), "{}", w[0]);
        c.gemini.own_listener = false;
        assert_eq!(open(&c), ["xiaozhi"]);
        c.gemini.own_listener = true;
        c.gemini.mode = crate::config::GeminiMode::Passthrough;
        c.gemini.api_key = Some("key".into());
        let w = exposure_warnings(&c);
        assert!(w[1].contains("this server's API key"), "{}", w[1]);
        let mut c = wide();
        c.xiaozhi.listen = Some("0.0.0.0:8000".parse().unwrap());
        assert!(
            exposure_warnings(&c)[1].contains("on 0.0.0.0:8080 and 0.0.0.0:8000"),
            "{:?}",
            exposure_warnings(&c)
        );
    }

    #[test]
    fn comments_keep_print_config_parseable() {
        let c = wide();
        let mut warnings = exposure_warnings(&c);
        warnings.push("two\nlines".into());
        let text = format!("{}{}", as_toml_comments(&warnings), c.to_toml());
        assert!(text.starts_with("# WARNING: realtime: "), "{text}");
        assert!(text.contains("# WARNING: two lines\n"), "{text}");
        assert_eq!(Config::from_toml(&text).unwrap().listen, c.listen);
    }
}
