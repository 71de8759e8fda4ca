//! Access to the operator surfaces over real sockets: `/admin/*` and the Retell control API
//! under `trusted_proxies`, forwarding headers and tokens (`docs/security.md`).
//!
//! Every test connects from 127.0.0.1, so "a same-host proxy" is a request from 127.0.0.1
//! with 127.0.0.1 listed in `trusted_proxies`, and "a direct local client" is the same request
//! with it not listed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::SocketAddr;

use support::{Running, WAIT, http};
use voxgate_server::Config;

const ADMIN: &str = "/admin/sessions";
const CALLS: &str = "/retell/calls";
const TOKEN: &str = "adm-s3cret-token";
const XFF: (&str, &str) = ("X-Forwarded-For", "203.0.113.5");

fn config(f: impl FnOnce(&mut Config)) -> Config {
    let mut c = Config::default();
    f(&mut c);
    c
}

/// `127.0.0.1` is a trusted proxy.
fn behind_local_proxy(c: &mut Config) {
    c.trusted_proxies = vec!["127.0.0.1".parse().unwrap()];
}

/// The status of `GET path` with `headers` and, when given, `Authorization: Bearer <token>`.
async fn status(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    token: Option<&str>,
) -> u16 {
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut all = headers.to_vec();
    if let Some(auth) = &auth {
        all.push(("Authorization", auth));
    }
    http(addr, "GET", path, &all, b"").await.status
}

async fn bounded(test: impl Future<Output = ()>) {
    tokio::time::timeout(WAIT * 3, test).await.unwrap();
}

#[tokio::test]
async fn direct_loopback_clients_keep_admin_without_tokens() {
    bounded(async {
        let server = Running::start(Config::default()).await;
        assert_eq!(status(server.addr, ADMIN, &[], None).await, 200);
        // A loopback peer that forwards is a proxy nobody vouched for: refused, as before.
        let r = http(server.addr, "GET", ADMIN, &[XFF], b"").await;
        assert_eq!(r.status, 403, "{}", r.body);
        assert_eq!(r.json()["error"], "forbidden");
        for h in [
            ("Forwarded", "for=127.0.0.1"),
            ("X-Forwarded-For", "127.0.0.1"),
            ("X-Real-IP", "127.0.0.1"),
        ] {
            assert_eq!(status(server.addr, ADMIN, &[h], None).await, 403, "{h:?}");
        }
        server.stop().await;

        // A trusted proxy elsewhere does not change how a direct local client is treated.
        let server = Running::start(config(|c| {
            c.trusted_proxies = vec!["10.0.0.0/8".parse().unwrap()];
        }))
        .await;
        assert_eq!(status(server.addr, ADMIN, &[], None).await, 200);
        assert_eq!(status(server.addr, ADMIN, &[XFF], None).await, 403);
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn a_trusted_proxy_never_makes_a_request_local() {
    bounded(async {
        let server = Running::start(config(behind_local_proxy)).await;
        // Its own request without forwarding headers: not local.
        let r = http(server.addr, "GET", ADMIN, &[], b"").await;
        assert_eq!(r.status, 403, "{}", r.body);
        assert!(
            r.json()["detail"]
                .as_str()
                .unwrap()
                .contains("[admin] tokens"),
            "{}",
            r.body
        );
        // Forwarding a remote client, or one on the proxy's loopback: not local either.
        assert_eq!(status(server.addr, ADMIN, &[XFF], None).await, 403);
        let fwd_loop = ("X-Forwarded-For", "127.0.0.1");
        assert_eq!(status(server.addr, ADMIN, &[fwd_loop], None).await, 403);
        let std_fwd = ("Forwarded", "for=\"[::1]\"");
        assert_eq!(status(server.addr, ADMIN, &[std_fwd], None).await, 403);
        // Without admin tokens no token opens it, not even a made-up one.
        assert_eq!(status(server.addr, ADMIN, &[], Some(TOKEN)).await, 403);
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn admin_tokens_open_admin_through_a_trusted_proxy() {
    bounded(async {
        let server = Running::start(config(|c| {
            behind_local_proxy(c);
            c.admin.tokens = vec![TOKEN.into()];
        }))
        .await;
        let a = server.addr;
        // The proxy's own request.
        assert_eq!(status(a, ADMIN, &[], None).await, 401);
        assert_eq!(status(a, ADMIN, &[], Some(TOKEN)).await, 200);
        // A remote client forwarded by it.
        let r = http(a, "GET", ADMIN, &[XFF], b"").await;
        assert_eq!(r.status, 401, "{}", r.body);
        assert!(
            r.head
                .to_ascii_lowercase()
                .contains("www-authenticate: bearer"),
            "{}",
            r.head
        );
        assert_eq!(status(a, ADMIN, &[XFF], Some(TOKEN)).await, 200);
        assert_eq!(status(a, ADMIN, &[XFF], Some("wrong")).await, 401);
        assert_eq!(
            status(a, ADMIN, &[XFF], Some(&TOKEN[..TOKEN.len() - 1])).await,
            401
        );
        assert_eq!(
            status(a, ADMIN, &[XFF], Some(&format!("{TOKEN}x"))).await,
            401
        );
        assert_eq!(status(a, ADMIN, &[XFF], Some("")).await, 401);
        // The token without the Bearer scheme is no token.
        let raw = ("Authorization", TOKEN);
        assert_eq!(status(a, ADMIN, &[XFF, raw], None).await, 401);
        // A refused POST does not run its handler; an admitted one does.
        let clear = "/admin/conversations/clear";
        let r = http(a, "POST", clear, &[XFF], b"").await;
        assert_eq!(r.status, 401);
        let auth = format!("Bearer {TOKEN}");
        let r = http(a, "POST", clear, &[XFF, ("Authorization", &auth)], b"").await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.json()["ok"], true);
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn admin_tokens_are_required_of_local_clients_too_and_replace_bridge_tokens() {
    bounded(async {
        let server = Running::start(config(|c| {
            c.admin.tokens = vec![TOKEN.into()];
            c.bridge.tokens = vec!["bridge-tok".into()];
        }))
        .await;
        let a = server.addr;
        assert_eq!(status(a, ADMIN, &[], None).await, 401);
        assert_eq!(status(a, ADMIN, &[], Some("bridge-tok")).await, 401);
        assert_eq!(status(a, ADMIN, &[], Some(TOKEN)).await, 200);
        // An untrusted forwarding peer with the token is let in: the token is the credential.
        assert_eq!(status(a, ADMIN, &[XFF], Some(TOKEN)).await, 200);
        // /api keeps the bridge tokens.
        let r = http(
            a,
            "POST",
            "/api/perception/event",
            &[("Authorization", "Bearer bridge-tok")],
            br#"{"name":"face_lost","device_id":"d"}"#,
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
        server.stop().await;

        // Without admin tokens, bridge tokens still guard /admin on top of locality.
        let server = Running::start(config(|c| c.bridge.tokens = vec!["bridge-tok".into()])).await;
        assert_eq!(status(server.addr, ADMIN, &[], None).await, 401);
        assert_eq!(
            status(server.addr, ADMIN, &[], Some("bridge-tok")).await,
            200
        );
        assert_eq!(
            status(server.addr, ADMIN, &[XFF], Some("bridge-tok")).await,
            403
        );
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn retell_control_api_follows_the_same_rule() {
    bounded(async {
        // No token, no proxies: a direct loopback client is local.
        let server = Running::start(Config::default()).await;
        assert_eq!(status(server.addr, CALLS, &[], None).await, 200);
        assert_eq!(status(server.addr, CALLS, &[XFF], None).await, 403);
        server.stop().await;

        // No token, behind a trusted same-host proxy: nobody is local.
        let server = Running::start(config(behind_local_proxy)).await;
        let r = http(server.addr, "GET", CALLS, &[], b"").await;
        assert_eq!(r.status, 403, "{}", r.body);
        assert!(r.body.contains("control_token"), "{}", r.body);
        assert_eq!(status(server.addr, CALLS, &[XFF], None).await, 403);
        let path = "/retell/calls/c1/interrupt";
        let r = http(
            server.addr,
            "POST",
            path,
            &[XFF, ("Content-Type", "application/json")],
            br#"{"content":"hi"}"#,
        )
        .await;
        assert_eq!(r.status, 403, "{}", r.body);
        server.stop().await;

        // A control token: required from everyone, enough for anyone.
        let server = Running::start(config(|c| {
            behind_local_proxy(c);
            c.retell.control_token = TOKEN.into();
        }))
        .await;
        let a = server.addr;
        assert_eq!(status(a, CALLS, &[], None).await, 401);
        assert_eq!(status(a, CALLS, &[], Some(TOKEN)).await, 200);
        assert_eq!(status(a, CALLS, &[XFF], None).await, 401);
        assert_eq!(status(a, CALLS, &[XFF], Some(TOKEN)).await, 200);
        assert_eq!(status(a, CALLS, &[XFF], Some("wrong")).await, 401);
        assert_eq!(status(a, CALLS, &[XFF], Some(&TOKEN[..4])).await, 401);
        // Admin tokens are not control tokens.
        server.stop().await;
        let server = Running::start(config(|c| {
            behind_local_proxy(c);
            c.admin.tokens = vec![TOKEN.into()];
        }))
        .await;
        assert_eq!(status(server.addr, CALLS, &[], Some(TOKEN)).await, 403);
        server.stop().await;
    })
    .await;
}

/// The VIP door reads a token the way every door does: the `Bearer` scheme in any case, and
/// `?token=` percent-decoded (a token holding `/`, `+` or `=` must be escaped in a URL).
#[tokio::test]
async fn the_vip_door_takes_tokens_as_every_door_does() {
    let server = Running::start(config(|c| c.vip.tokens = vec!["a/b+c=".into()])).await;
    let offer = |path: String, auth: Option<&'static str>| {
        let addr = server.addr;
        async move {
            let mut headers = vec![("Content-Type", "application/sdp")];
            if let Some(a) = auth {
                headers.push(("Authorization", a));
            }
            // Not an offer: a 400 past the token check, a 401 before it.
            http(addr, "POST", &path, &headers, b"v=0\r\n").await.status
        }
    };
    assert_eq!(offer("/webrtc/offer".into(), None).await, 401);
    assert_eq!(offer("/webrtc/offer?token=a/b+c=".into(), None).await, 401);
    assert_eq!(
        offer("/webrtc/offer?token=a%2Fb%2Bc%3D".into(), None).await,
        400
    );
    assert_eq!(
        offer("/webrtc/offer".into(), Some("bearer a/b+c=")).await,
        400
    );
    assert_eq!(
        offer("/webrtc/offer".into(), Some("Bearer wrong")).await,
        401
    );
    server.stop_within(WAIT).await;
}
