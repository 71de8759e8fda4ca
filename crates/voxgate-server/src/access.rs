//! Who is asking, for the operator surfaces (`/admin/*` and the Retell control API): the
//! client address behind trusted proxies, whether a request is local, and the bearer check.
//!
//! # The rule (`docs/security.md`)
//! - The client is the socket peer. Forwarding headers (`Forwarded: for=`,
//!   `X-Forwarded-For`) are believed only when the peer is in `trusted_proxies`; then the
//!   client is the right-most hop that is not itself a trusted proxy (proxies append, so
//!   everything left of that hop was written by the client and proves nothing).
//! - A request is **local** only when its socket peer is a loopback address that is not a
//!   trusted proxy and it carries no forwarding header (`Forwarded`, `X-Forwarded-For`,
//!   `X-Real-IP`). So:
//!   - a trusted proxy's own address never makes a request local, with or without headers,
//!     and neither does a loopback address it forwards (that is the proxy host's loopback,
//!     and on this host it is still a request that came through a proxy);
//!   - an untrusted peer's forwarding headers are not believed for the client address, but
//!     their presence still makes the request not local: a loopback peer that forwards is a
//!     same-host proxy, and everything behind it would otherwise look local.
//! - An operator surface with tokens configured wants one of them
//!   (`Authorization: Bearer <token>`, compared in constant time) from every client, local or
//!   not; with none configured it is served to local requests only.
//!
//! The hole this cannot close alone: a same-host proxy that adds no forwarding header and is
//! not listed in `trusted_proxies` makes every request it forwards look local. Behind such a
//! proxy, list it in `trusted_proxies` or set tokens.

use std::net::IpAddr;

use axum::http::{HeaderMap, StatusCode, header};

use crate::config::TrustedProxy;

/// Forwarding hops examined at most, from the right; a longer chain of trusted proxies leaves
/// the client unknown. The header itself is bounded by the HTTP server's header limit.
const MAX_HOPS: usize = 32;

/// Headers whose presence says a proxy handled the request.
const FORWARDING_HEADERS: [&str; 3] = ["forwarded", "x-forwarded-for", "x-real-ip"];

/// Where a request came from, as far as this server can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Origin {
    /// The socket peer (IPv4-mapped IPv6 shown as IPv4).
    pub(crate) peer: IpAddr,
    /// The client: the peer, or behind a trusted proxy the right-most untrusted hop of its
    /// forwarding header (the proxy itself when it sent none). `None` when a trusted proxy's
    /// header could not be read, or `Forwarded` and `X-Forwarded-For` disagree.
    pub(crate) client: Option<IpAddr>,
    /// The peer is a trusted proxy.
    pub(crate) via_proxy: bool,
    /// The request carries a forwarding header.
    pub(crate) forwarded: bool,
}

impl Origin {
    /// Resolves a request from `peer` with `headers` under `trusted` proxies.
    pub(crate) fn resolve(trusted: &[TrustedProxy], peer: IpAddr, headers: &HeaderMap) -> Self {
        let peer = peer.to_canonical();
        let forwarded = FORWARDING_HEADERS.iter().any(|h| headers.contains_key(*h));
        let via_proxy = is_trusted(trusted, peer);
        let client = if via_proxy {
            match forwarded_client(trusted, headers) {
                Chain::Empty => Some(peer),
                Chain::Client(ip) => Some(ip),
                Chain::Unknown => None,
            }
        } else {
            Some(peer)
        };
        Self {
            peer,
            client,
            via_proxy,
            forwarded,
        }
    }

    /// Whether the request comes from this host without a proxy in between.
    pub(crate) fn is_local(&self) -> bool {
        !self.via_proxy && !self.forwarded && self.client.is_some_and(|ip| ip.is_loopback())
    }
}

fn is_trusted(trusted: &[TrustedProxy], ip: IpAddr) -> bool {
    trusted.iter().any(|t| t.contains(ip))
}

/// What a trusted proxy's forwarding headers say about the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chain {
    /// No forwarding header with a hop in it.
    Empty,
    /// The right-most untrusted hop (or the left-most when all are trusted).
    Client(IpAddr),
    /// A hop that is not an address (`unknown`, an obfuscated name, garbage), too many hops,
    /// or two headers that disagree.
    Unknown,
}

/// Reads `Forwarded` and `X-Forwarded-For`. A proxy may set either and pass the other through
/// from the client, so when both name a client they must agree.
fn forwarded_client(trusted: &[TrustedProxy], headers: &HeaderMap) -> Chain {
    let standard = walk(trusted, hops(headers, header::FORWARDED, forwarded_for));
    let legacy = walk(trusted, hops(headers, "x-forwarded-for", node));
    match (standard, legacy) {
        (Chain::Empty, other) | (other, Chain::Empty) => other,
        (a, b) if a == b => a,
        _ => Chain::Unknown,
    }
}

/// The hops of every `name` header line, right-most first, at most one more than
/// [`MAX_HOPS`]; an unreadable line is one unknown hop.
fn hops(
    headers: &HeaderMap,
    name: impl header::AsHeaderName,
    parse: fn(&str) -> Option<IpAddr>,
) -> Vec<Option<IpAddr>> {
    let mut out = Vec::new();
    for line in headers.get_all(name).iter().rev() {
        match line.to_str() {
            Ok(text) => out.extend(
                text.rsplit(',')
                    .map(str::trim)
                    .filter(|hop| !hop.is_empty())
                    .take(MAX_HOPS + 1)
                    .map(parse),
            ),
            Err(_) => out.push(None),
        }
        if out.len() > MAX_HOPS {
            out.truncate(MAX_HOPS + 1);
            break;
        }
    }
    out
}

/// Walks hops right to left past trusted proxies.
fn walk(trusted: &[TrustedProxy], hops: Vec<Option<IpAddr>>) -> Chain {
    let mut leftmost = None;
    for (i, hop) in hops.into_iter().enumerate() {
        if i == MAX_HOPS {
            return Chain::Unknown;
        }
        let Some(ip) = hop.map(|ip| ip.to_canonical()) else {
            return Chain::Unknown;
        };
        if !is_trusted(trusted, ip) {
            return Chain::Client(ip);
        }
        leftmost = Some(ip);
    }
    leftmost.map_or(Chain::Empty, Chain::Client)
}

/// The `for=` node of one `Forwarded` element (RFC 7239 §4), `None` without one.
fn forwarded_for(element: &str) -> Option<IpAddr> {
    element.split(';').find_map(|pair| {
        let (name, value) = pair.split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("for")
            .then(|| node(value.trim().trim_matches('"')))
            .flatten()
    })
}

/// An address with an optional port: `192.0.2.1`, `192.0.2.1:80`, `2001:db8::1`,
/// `[2001:db8::1]`, `[2001:db8::1]:80`. `unknown` and obfuscated names are `None`.
fn node(s: &str) -> Option<IpAddr> {
    let s = s.trim();
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(sa) = s.parse::<std::net::SocketAddr>() {
        return Some(sa.ip());
    }
    s.strip_prefix('[')?.strip_suffix(']')?.parse().ok()
}

/// The token of `Authorization: Bearer <token>` (scheme in any case), if there is one: the
/// one reading of a bearer token every door and operator surface uses.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    bearer_value(headers.get(header::AUTHORIZATION)?.to_str().ok()?)
}

/// The token of an `Authorization` value `Bearer <token>` (RFC 7235: the scheme in any
/// letter case); `None` for another scheme or an empty token.
pub(crate) fn bearer_value(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// The first `name` parameter of a query string, percent-decoded (`+` as a space), as the
/// doors that take a token in the URL read it; `None` when absent or badly escaped.
pub(crate) fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (percent_decode(key, true)? == name).then(|| percent_decode(value, true))?
    })
}

/// `%XX` decoding (and `+` as a space in a query); `None` for a bad escape or non-UTF-8.
pub(crate) fn percent_decode(s: &str, plus_is_space: bool) -> Option<String> {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'%' => {
                let hi = char::from(bytes.next()?).to_digit(16)?;
                let lo = char::from(bytes.next()?).to_digit(16)?;
                out.push(u8::try_from(hi * 16 + lo).ok()?);
            }
            b'+' if plus_is_space => out.push(b' '),
            b => out.push(b),
        }
    }
    String::from_utf8(out).ok()
}

/// Why an operator surface refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No tokens are configured and the request is not local.
    NotLocal,
    /// Tokens are configured and the request has no bearer token.
    MissingToken,
    /// Tokens are configured and the bearer token is none of them.
    WrongToken,
}

impl Refusal {
    /// 403 for a request that no token could let in, 401 otherwise.
    pub(crate) fn status(self) -> StatusCode {
        match self {
            Self::NotLocal => StatusCode::FORBIDDEN,
            Self::MissingToken | Self::WrongToken => StatusCode::UNAUTHORIZED,
        }
    }
}

/// The operator-surface rule: with `tokens`, one of them from anyone; without, local only.
pub(crate) fn check(
    origin: &Origin,
    tokens: &[String],
    headers: &HeaderMap,
) -> Result<(), Refusal> {
    decide(origin, !tokens.is_empty(), headers, |t| {
        crate::secret::matches_any(tokens, t)
    })
}

/// [`check`] for a surface with one optional token (empty: none), such as the Retell
/// `control_token`.
pub(crate) fn check_one(origin: &Origin, token: &str, headers: &HeaderMap) -> Result<(), Refusal> {
    decide(origin, !token.is_empty(), headers, |t| {
        crate::secret::secret_eq(token, t)
    })
}

fn decide(
    origin: &Origin,
    tokens_configured: bool,
    headers: &HeaderMap,
    valid: impl FnOnce(&str) -> bool,
) -> Result<(), Refusal> {
    if !tokens_configured {
        return if origin.is_local() {
            Ok(())
        } else {
            Err(Refusal::NotLocal)
        };
    }
    match bearer(headers) {
        None => Err(Refusal::MissingToken),
        Some(t) if valid(t) => Ok(()),
        Some(_) => Err(Refusal::WrongToken),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn proxies(list: &[&str]) -> Vec<TrustedProxy> {
        list.iter().map(|p| p.parse().unwrap()).collect()
    }

    fn headers(list: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in list {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    const LOOP: &str = "127.0.0.1";
    const LAN: &str = "192.168.1.20";
    const XFF: &str = "x-forwarded-for";

    /// Header name and value pairs.
    type Headers<'a> = &'a [(&'static str, &'a str)];
    /// peer, headers, trusted proxies, expected client, expected locality.
    type ResolverCase<'a> = (&'a str, Headers<'a>, &'a [&'a str], Option<&'a str>, bool);
    /// peer, trusted proxies, headers, tokens, expected decision.
    type DecisionCase<'a> = (
        &'a str,
        &'a [&'a str],
        Headers<'a>,
        &'a [String],
        Result<(), Refusal>,
    );

    /// peer × headers × trusted proxies → client and locality.
    #[test]
    fn resolver_table() {
        #[rustfmt::skip]
        let table: &[ResolverCase<'_>] = &[
            // peer, headers, trusted_proxies, client, local
            (LOOP, &[], &[], Some(LOOP), true),
            ("::1", &[], &[], Some("::1"), true),
            ("::ffff:127.0.0.1", &[], &[], Some(LOOP), true),
            (LAN, &[], &[], Some(LAN), false),
            // Untrusted peer: headers ignored for the address, but not local.
            (LOOP, &[(XFF, "203.0.113.5")], &[], Some(LOOP), false),
            (LOOP, &[(XFF, "127.0.0.1")], &[], Some(LOOP), false),
            (LOOP, &[("forwarded", "for=127.0.0.1")], &[], Some(LOOP), false),
            (LOOP, &[("x-real-ip", "127.0.0.1")], &[], Some(LOOP), false),
            (LAN, &[(XFF, "127.0.0.1")], &[], Some(LAN), false),
            (LOOP, &[], &["10.0.0.0/8"], Some(LOOP), true),
            // Trusted proxy: its own address never makes a request local.
            (LOOP, &[], &[LOOP], Some(LOOP), false),
            (LOOP, &[(XFF, "203.0.113.5")], &[LOOP], Some("203.0.113.5"), false),
            (LOOP, &[(XFF, "127.0.0.1")], &[LOOP], Some(LOOP), false),
            (LOOP, &[(XFF, "::1")], &[LOOP], Some("::1"), false),
            // Right-most untrusted hop: the client's own entries are ignored.
            (LOOP, &[(XFF, "127.0.0.1, 203.0.113.5")], &[LOOP], Some("203.0.113.5"), false),
            (LOOP, &[(XFF, "198.51.100.1, 203.0.113.5, 10.1.2.3")], &[LOOP, "10.0.0.0/8"], Some("203.0.113.5"), false),
            (LOOP, &[(XFF, "198.51.100.1"), (XFF, "203.0.113.5")], &[LOOP], Some("203.0.113.5"), false),
            (LOOP, &[(XFF, "10.0.0.1, 10.0.0.2")], &[LOOP, "10.0.0.0/8"], Some("10.0.0.1"), false),
            (LOOP, &[(XFF, "203.0.113.5:4711")], &[LOOP], Some("203.0.113.5"), false),
            (LOOP, &[(XFF, "[2001:db8::1]:4711")], &[LOOP], Some("2001:db8::1"), false),
            (LOOP, &[(XFF, "unknown")], &[LOOP], None, false),
            (LOOP, &[(XFF, "203.0.113.5, garbage")], &[LOOP], None, false),
            (LOOP, &[(XFF, "")], &[LOOP], Some(LOOP), false),
            // Forwarded (RFC 7239).
            (LOOP, &[("forwarded", "for=203.0.113.5;proto=https")], &[LOOP], Some("203.0.113.5"), false),
            (LOOP, &[("forwarded", "for=198.51.100.1, For=\"[2001:db8:cafe::17]:4711\"")], &[LOOP], Some("2001:db8:cafe::17"), false),
            (LOOP, &[("forwarded", "for=_hidden")], &[LOOP], None, false),
            (LOOP, &[("forwarded", "proto=https")], &[LOOP], None, false),
            // Both headers: they must agree.
            (LOOP, &[("forwarded", "for=203.0.113.5"), (XFF, "203.0.113.5")], &[LOOP], Some("203.0.113.5"), false),
            (LOOP, &[("forwarded", "for=127.0.0.1"), (XFF, "203.0.113.5")], &[LOOP], None, false),
            // A remote trusted proxy.
            ("10.0.0.9", &[(XFF, "127.0.0.1")], &["10.0.0.0/8"], Some(LOOP), false),
            ("10.0.0.9", &[], &["10.0.0.0/8"], Some("10.0.0.9"), false),
        ];
        for (peer, hs, trusted, client, local) in table {
            let o = Origin::resolve(&proxies(trusted), ip(peer), &headers(hs));
            let case = format!("peer {peer}, headers {hs:?}, trusted {trusted:?}: {o:?}");
            assert_eq!(o.client, client.map(ip), "{case}");
            assert_eq!(o.is_local(), *local, "{case}");
        }
    }

    #[test]
    fn long_chains_leave_the_client_unknown() {
        let chain = vec!["10.0.0.1"; MAX_HOPS + 1].join(", ");
        let o = Origin::resolve(
            &proxies(&[LOOP, "10.0.0.0/8"]),
            ip(LOOP),
            &headers(&[(XFF, &chain)]),
        );
        assert_eq!(o.client, None);
        let chain = vec!["10.0.0.1"; MAX_HOPS].join(", ");
        let o = Origin::resolve(
            &proxies(&[LOOP, "10.0.0.0/8"]),
            ip(LOOP),
            &headers(&[(XFF, &chain)]),
        );
        assert_eq!(o.client, Some(ip("10.0.0.1")));
        let mut h = HeaderMap::new();
        h.insert(
            XFF,
            axum::http::HeaderValue::from_bytes(b"203.0.113.5, \xff").unwrap(),
        );
        assert_eq!(
            Origin::resolve(&proxies(&[LOOP]), ip(LOOP), &h).client,
            None
        );
    }

    #[test]
    fn bearer_tokens() {
        assert_eq!(
            bearer(&headers(&[("authorization", "Bearer abc")])),
            Some("abc")
        );
        assert_eq!(
            bearer(&headers(&[("authorization", "bearer  abc ")])),
            Some("abc")
        );
        assert_eq!(bearer(&headers(&[("authorization", "Basic abc")])), None);
        assert_eq!(bearer(&headers(&[("authorization", "abc")])), None);
        assert_eq!(bearer(&HeaderMap::new()), None);
    }

    /// peer × headers × trusted proxies × tokens → the operator-surface decision.
    #[test]
    fn decision_table() {
        use Refusal::{MissingToken, NotLocal, WrongToken};
        let tok = ["adm-s3cret".to_owned()];
        let none: &[String] = &[];
        let good = ("authorization", "Bearer adm-s3cret");
        let wrong = ("authorization", "Bearer nope");
        let partial = ("authorization", "Bearer adm-s3c");
        let fwd = (XFF, "203.0.113.5");
        #[rustfmt::skip]
        let table: &[DecisionCase<'_>] = &[
            // No tokens: local only.
            (LOOP, &[], &[], none, Ok(())),
            (LAN, &[], &[], none, Err(NotLocal)),
            (LOOP, &[], &[fwd], none, Err(NotLocal)),
            (LOOP, &[LOOP], &[], none, Err(NotLocal)),
            (LOOP, &[LOOP], &[fwd], none, Err(NotLocal)),
            (LOOP, &[LOOP], &[good], none, Err(NotLocal)),
            // Tokens: required from everyone, enough for anyone.
            (LOOP, &[], &[], &tok, Err(MissingToken)),
            (LOOP, &[], &[good], &tok, Ok(())),
            (LAN, &[], &[good], &tok, Ok(())),
            (LOOP, &[LOOP], &[], &tok, Err(MissingToken)),
            (LOOP, &[LOOP], &[good], &tok, Ok(())),
            (LOOP, &[LOOP], &[fwd], &tok, Err(MissingToken)),
            (LOOP, &[LOOP], &[fwd, good], &tok, Ok(())),
            (LOOP, &[LOOP], &[fwd, wrong], &tok, Err(WrongToken)),
            (LOOP, &[LOOP], &[fwd, partial], &tok, Err(WrongToken)),
            (LOOP, &[], &[fwd, good], &tok, Ok(())),
            (LAN, &[], &[wrong], &tok, Err(WrongToken)),
        ];
        for (peer, trusted, hs, tokens, want) in table {
            let h = headers(hs);
            let o = Origin::resolve(&proxies(trusted), ip(peer), &h);
            let case =
                format!("peer {peer}, trusted {trusted:?}, headers {hs:?}, tokens {tokens:?}");
            assert_eq!(check(&o, tokens, &h), *want, "{case}");
            let one = tokens.first().map_or("", String::as_str);
            assert_eq!(check_one(&o, one, &h), *want, "{case}");
        }
        assert_eq!(NotLocal.status(), StatusCode::FORBIDDEN);
        assert_eq!(WrongToken.status(), StatusCode::UNAUTHORIZED);
    }

    #[test]
    fn bearer_schemes_in_any_case_and_query_tokens_percent_decoded() {
        for value in ["Bearer t0k", "bearer t0k", "BEARER  t0k ", " BeArEr t0k"] {
            assert_eq!(bearer_value(value), Some("t0k"), "{value:?}");
        }
        for value in ["Basic t0k", "Bearer", "Bearer   ", "t0k", "Bearert0k"] {
            assert_eq!(bearer_value(value), None, "{value:?}");
        }
        assert_eq!(
            query_param("a=1&token=s%2Fk%3D%3D+x&token=second", "token").as_deref(),
            Some("s/k== x")
        );
        assert_eq!(query_param("to%6Ben=v", "token").as_deref(), Some("v"));
        assert_eq!(query_param("token", "token").as_deref(), Some(""));
        assert_eq!(query_param("other=1", "token"), None);
        // A bad escape is no token (never a token with the escape left in).
        assert_eq!(query_param("token=%zz", "token"), None);
        assert_eq!(query_param("token=%e2%82", "token"), None);
    }
}
