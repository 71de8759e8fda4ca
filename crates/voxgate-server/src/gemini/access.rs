//! Who may open a bridge connection, decided before the WebSocket upgrade: a refused caller
//! costs no handshake and never reaches the Gemini Live API.
//!
//! The rule ([`decide`]):
//!
//! 1. With `[gemini] tokens` set, every connection (either mode, loopback included) must
//!    present one of them: `Authorization: Bearer <token>`, a `token` query parameter, or the
//!    last path segment (`ws://host:3001/<token>`, `ws://host:8080/gemini/<token>`). The URL
//!    forms exist because the original Android app only lets its user type a URL. Otherwise
//!    HTTP 401.
//! 2. Without tokens, pass-through with the server's API key would spend that key for anyone
//!    who can reach the door, so it is served to this machine only: the socket peer must be a
//!    loopback address and the request must not carry proxy headers (a reverse proxy on the
//!    same machine makes every caller look local). Otherwise HTTP 403 telling the operator to
//!    set `[gemini] tokens`.
//! 3. Without tokens, engine mode (and pass-through without a server key, whose sessions fail
//!    with a clear error and spend nothing) stays open like the other doors; the startup
//!    exposure warning ([`exposure`]) says when that is reachable beyond loopback.
//!
//! The bridge protocol has no field for a client's own Gemini API key (the original bridge
//! always used its own), so there is no "bring your own key" exemption.

use std::net::{IpAddr, SocketAddr};

use axum::http::HeaderMap;

use super::{GeminiConfig, GeminiMode};

/// The door's answer to one upgrade request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Access {
    /// Serve the connection.
    Allow,
    /// Tokens are configured and the request presented none of them: HTTP 401.
    Unauthorized,
    /// Pass-through would spend the server's Gemini API key, no tokens are configured, and
    /// the caller is not this machine: HTTP 403.
    LocalOnly,
}

impl Access {
    /// The body of a refusal: what is wrong and what to do about it.
    pub(super) fn message(self) -> &'static str {
        match self {
            Self::Allow => "",
            Self::Unauthorized => {
                "missing or unknown Gemini bridge token: send Authorization: Bearer <token>, \
                 or put it in the URL (?token=<token>, or as the last path segment)"
            }
            Self::LocalOnly => {
                "the Gemini door relays to Gemini with this server's API key and has no \
                 tokens: set [gemini] tokens (VOXGATE_GEMINI_TOKENS) and connect with one, \
                 or connect from the server's own machine"
            }
        }
    }
}

/// Whether a session would spend the server's own Gemini API key.
pub(super) fn spends_server_key(config: &GeminiConfig) -> bool {
    config.mode == GeminiMode::Passthrough
        && config
            .api_key
            .as_deref()
            .is_some_and(|k| !k.trim().is_empty())
}

/// Whether the request came through a proxy (which would make every caller look local).
pub(super) fn proxied(headers: &HeaderMap) -> bool {
    ["forwarded", "x-forwarded-for", "x-real-ip"]
        .iter()
        .any(|h| headers.contains_key(*h))
}

/// The door's decision for a request from `peer` (the socket's address, never a header),
/// `proxied` when it carries proxy headers, presenting the candidate tokens `presented`.
pub(super) fn decide(
    config: &GeminiConfig,
    peer: IpAddr,
    proxied: bool,
    presented: &[String],
) -> Access {
    if !config.tokens.is_empty() {
        // Every candidate is compared (constant time each); any one may match.
        let matched = presented
            .iter()
            .filter(|t| !t.is_empty())
            .fold(false, |found, t| {
                crate::secret::matches_any(&config.tokens, t) | found
            });
        return if matched {
            Access::Allow
        } else {
            Access::Unauthorized
        };
    }
    if spends_server_key(config) && (proxied || !peer.to_canonical().is_loopback()) {
        return Access::LocalOnly;
    }
    Access::Allow
}

/// The candidate tokens of a request: the `Authorization: Bearer` value, the first `token`
/// query parameter and `path_token` (a path segment, percent-encoded), each decoded. At most
/// three, so a request cannot make the door compare without bound.
pub(super) fn presented(
    headers: &HeaderMap,
    query: Option<&str>,
    path_token: Option<&str>,
) -> Vec<String> {
    use crate::access::{bearer, percent_decode, query_param};
    let mut out = Vec::with_capacity(3);
    if let Some(t) = bearer(headers) {
        out.push(t.to_owned());
    }
    if let Some(t) = query.and_then(|q| query_param(q, "token")) {
        out.push(t);
    }
    if let Some(t) = path_token
        .filter(|s| !s.is_empty())
        .and_then(|s| percent_decode(s, false))
    {
        out.push(t);
    }
    out
}

/// The last non-empty segment of a path (`/a/b/` → `b`): where the own listener, which
/// serves any path, takes a token from (`ws://host:3001/<token>`).
pub(super) fn last_segment(path: &str) -> Option<&str> {
    path.split('/').rev().find(|s| !s.is_empty())
}

/// Why the door, as configured, is reachable from other machines without a token, for the
/// startup warning; `None` when it is not (disabled, tokens set, or loopback listeners only).
/// `main_listen` is the server's main listener, which serves `/gemini`.
pub(crate) fn exposure(config: &GeminiConfig, main_listen: SocketAddr) -> Option<String> {
    if !config.enabled || !config.tokens.is_empty() {
        return None;
    }
    let mut exposed = Vec::new();
    if !main_listen.ip().to_canonical().is_loopback() {
        exposed.push(format!("{main_listen}/gemini"));
    }
    if config.own_listener && !config.listen.ip().to_canonical().is_loopback() {
        exposed.push(config.listen.to_string());
    }
    if exposed.is_empty() {
        return None;
    }
    let at = exposed.join(" and ");
    Some(if spends_server_key(config) {
        format!(
            "the Gemini door at {at} has no [gemini] tokens: pass-through (this server's API \
             key) is refused to every caller but this machine; set gemini.tokens to serve others"
        )
    } else {
        format!(
            "the Gemini door at {at} has no [gemini] tokens: anyone who can reach it can use \
             the engine's providers; set gemini.tokens"
        )
    })
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use axum::http::header;

    use super::*;

    fn passthrough(tokens: &[&str]) -> GeminiConfig {
        GeminiConfig {
            mode: GeminiMode::Passthrough,
            api_key: Some("server-key".into()),
            tokens: tokens.iter().map(|t| (*t).to_owned()).collect(),
            ..GeminiConfig::default()
        }
    }

    fn given(tokens: &[&str]) -> Vec<String> {
        tokens.iter().map(|t| (*t).to_owned()).collect()
    }

    const LAN: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 168, 1, 20));
    const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    #[test]
    fn passthrough_with_the_server_key_and_no_tokens_is_for_this_machine_only() {
        let c = passthrough(&[]);
        assert_eq!(decide(&c, LAN, false, &[]), Access::LocalOnly);
        // A presented token does not help when none are configured.
        assert_eq!(decide(&c, LAN, false, &given(&["x"])), Access::LocalOnly);
        assert_eq!(
            decide(
                &c,
                IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)),
                false,
                &[]
            ),
            Access::LocalOnly
        );
        assert_eq!(decide(&c, LOCAL, false, &[]), Access::Allow);
        assert_eq!(
            decide(&c, IpAddr::V6(Ipv6Addr::LOCALHOST), false, &[]),
            Access::Allow
        );
        // IPv4-mapped loopback (a dual-stack listener) is loopback.
        let mapped = IpAddr::V6(Ipv4Addr::LOCALHOST.to_ipv6_mapped());
        assert_eq!(decide(&c, mapped, false, &[]), Access::Allow);
        // Behind a proxy on this machine every caller looks local.
        assert_eq!(decide(&c, LOCAL, true, &[]), Access::LocalOnly);
    }

    #[test]
    fn configured_tokens_are_required_everywhere_and_match_exactly() {
        let c = passthrough(&["tok-one", "tok-two"]);
        for peer in [LAN, LOCAL] {
            assert_eq!(decide(&c, peer, false, &[]), Access::Unauthorized);
            assert_eq!(
                decide(&c, peer, false, &given(&["tok"])),
                Access::Unauthorized
            );
            assert_eq!(
                decide(&c, peer, false, &given(&["tok-one-"])),
                Access::Unauthorized
            );
            assert_eq!(
                decide(&c, peer, false, &given(&["TOK-ONE"])),
                Access::Unauthorized
            );
            assert_eq!(decide(&c, peer, false, &given(&[""])), Access::Unauthorized);
            assert_eq!(decide(&c, peer, false, &given(&["tok-two"])), Access::Allow);
            // Any one candidate may carry it (e.g. a wrong header and a right query).
            assert_eq!(
                decide(&c, peer, true, &given(&["nope", "tok-one"])),
                Access::Allow
            );
        }
        let engine = GeminiConfig {
            tokens: given(&["tok-one"]),
            ..GeminiConfig::default()
        };
        assert_eq!(decide(&engine, LOCAL, false, &[]), Access::Unauthorized);
        assert_eq!(
            decide(&engine, LAN, false, &given(&["tok-one"])),
            Access::Allow
        );
    }

    #[test]
    fn without_tokens_engine_mode_and_keyless_passthrough_stay_open() {
        let engine = GeminiConfig::default();
        assert_eq!(decide(&engine, LAN, false, &[]), Access::Allow);
        assert_eq!(decide(&engine, LAN, true, &[]), Access::Allow);
        for key in [None, Some(String::new()), Some("  ".to_owned())] {
            let keyless = GeminiConfig {
                api_key: key,
                ..passthrough(&[])
            };
            assert!(!spends_server_key(&keyless));
            assert_eq!(decide(&keyless, LAN, false, &[]), Access::Allow);
        }
    }

    #[test]
    fn tokens_come_from_the_header_the_query_and_the_path() {
        let mut h = HeaderMap::new();
        assert!(presented(&h, None, None).is_empty());
        h.insert(header::AUTHORIZATION, "bearer  a b ".parse().unwrap());
        assert_eq!(presented(&h, None, None), ["a b"]);
        h.insert(header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert!(presented(&h, None, None).is_empty());
        h.insert(header::AUTHORIZATION, "Bearer ".parse().unwrap());
        assert!(presented(&h, None, None).is_empty());
        h.insert(header::AUTHORIZATION, "Bearer hdr".parse().unwrap());
        assert_eq!(
            presented(&h, Some("x=1&token=q%2Bv+w&token=second"), Some("p%41th")),
            ["hdr", "q+v w", "pAth"]
        );
        let none = HeaderMap::new();
        assert_eq!(presented(&none, Some("tok%65n=e"), None), ["e"]);
        assert!(presented(&none, Some("tokens=a&x"), None).is_empty());
        assert!(presented(&none, Some("token=%zz"), Some("%4")).is_empty());
        assert_eq!(presented(&none, Some("token"), Some("")), [""]);
        assert_eq!(last_segment("/a/tok/"), Some("tok"));
        assert_eq!(last_segment("/"), None);
        assert_eq!(last_segment(""), None);
    }

    #[test]
    fn proxy_headers() {
        let mut h = HeaderMap::new();
        assert!(!proxied(&h));
        h.insert("x-real-ip", "10.0.0.1".parse().unwrap());
        assert!(proxied(&h));
    }

    #[test]
    fn exposure_is_reported_for_non_loopback_listeners_without_tokens() {
        let local = SocketAddr::from(([127, 0, 0, 1], 8080));
        let any = SocketAddr::from(([0, 0, 0, 0], 8080));
        assert_eq!(exposure(&GeminiConfig::default(), local), None);
        let engine = exposure(&GeminiConfig::default(), any).unwrap();
        assert!(engine.contains("0.0.0.0:8080/gemini"), "{engine}");
        assert!(engine.contains("engine"), "{engine}");
        let lan = GeminiConfig {
            listen: SocketAddr::from(([0, 0, 0, 0], 3001)),
            ..passthrough(&[])
        };
        let pass = exposure(&lan, local).unwrap();
        assert!(pass.contains("0.0.0.0:3001"), "{pass}");
        assert!(pass.contains("refused"), "{pass}");
        let closed = GeminiConfig {
            own_listener: false,
            ..lan.clone()
        };
        assert_eq!(exposure(&closed, local), None);
        let with_tokens = GeminiConfig {
            tokens: given(&["t"]),
            ..lan.clone()
        };
        assert_eq!(exposure(&with_tokens, any), None);
        let disabled = GeminiConfig {
            enabled: false,
            ..lan
        };
        assert_eq!(exposure(&disabled, any), None);
    }
}
