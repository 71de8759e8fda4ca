//! Access to the Gemini bridge door over real sockets: bridge tokens (header, query and path
//! forms), the pass-through rule that never spends the server's Gemini API key for an
//! unauthenticated caller, and proof that a refused caller causes no upstream connection (a
//! local fake of the Gemini Live API counts every connection attempt).
//!
//! Tests can only connect from 127.0.0.1; the refusal of a non-loopback peer is unit-tested
//! on the decision itself (`gemini::access`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use support::{Running, WAIT, Ws, next_message, send_json, try_connect};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::{Error, Message};
use voxgate_server::Config;
use voxgate_server::config::GeminiMode;

const TOKEN: &str = "bridge-token-4f9c2a";

/// A fake Gemini Live API that counts connection attempts (TCP accepts, before any
/// handshake) and serves each connection: `setupComplete` after `setup`, then every
/// `clientContent` turn answered with the text `Bonjour` and `turnComplete`.
async fn counting_live_api() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let attempts = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&attempts);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
                    return;
                };
                while let Some(Ok(frame)) = ws.next().await {
                    let Message::Text(t) = frame else { continue };
                    let m: Value = serde_json::from_str(t.as_str()).unwrap();
                    let replies = if m.get("setup").is_some() {
                        vec![json!({"setupComplete": {}})]
                    } else if m.get("clientContent").is_some() {
                        vec![
                            json!({"serverContent": {"modelTurn": {"parts": [{"text": "Bonjour"}]}}}),
                            json!({"serverContent": {"turnComplete": true}}),
                        ]
                    } else {
                        Vec::new()
                    };
                    for r in replies {
                        if ws.send(Message::Text(r.to_string().into())).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    (format!("ws://{addr}"), attempts)
}

fn passthrough(base_url: String, tokens: &[&str]) -> Config {
    let mut config = Config::default();
    config.gemini.mode = GeminiMode::Passthrough;
    config.gemini.api_key = Some("server-key".into());
    config.gemini.base_url = base_url;
    config.gemini.tokens = tokens.iter().map(|t| (*t).to_owned()).collect();
    config
}

/// The Gemini door's value of a per-door counter in `/metrics`.
fn counter(server: &Running, name: &str) -> u64 {
    let prefix = format!("{name}{{door=\"gemini\"}} ");
    server
        .metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .unwrap()
        .parse()
        .unwrap()
}

/// The HTTP status and body of an upgrade the server must refuse.
async fn refused(url: &str, headers: &[(&str, &str)]) -> (u16, String) {
    match try_connect(url, headers, WAIT).await {
        Err(Error::Http(resp)) => (
            resp.status().as_u16(),
            String::from_utf8_lossy(resp.body().as_deref().unwrap_or_default()).into_owned(),
        ),
        Ok(_) => panic!("{url} {headers:?}: the upgrade was accepted"),
        Err(e) => panic!("{url} {headers:?}: {e}"),
    }
}

async fn recv(ws: &mut Ws) -> Value {
    match next_message(ws, WAIT).await.expect("the socket stays open") {
        Message::Text(t) => serde_json::from_str(t.as_str()).unwrap(),
        other => panic!("unexpected frame {other:?}"),
    }
}

/// Connects with `headers`, sets up a text session and runs one turn; returns the reply text.
async fn text_turn(url: &str, headers: &[(&str, &str)]) -> String {
    let mut ws = try_connect(url, headers, WAIT).await.unwrap();
    send_json(
        &mut ws,
        &json!({"type": "CONNECT_GEMINI", "payload": {"initialConfig": {
            "generationConfig": {"responseModalities": "TEXT"}}}}),
    )
    .await;
    assert_eq!(recv(&mut ws).await["type"], "GEMINI_CONNECTED");
    assert_eq!(
        recv(&mut ws).await,
        json!({"type": "SETUP_COMPLETE", "payload": {"setupComplete": {"success": true}}})
    );
    send_json(
        &mut ws,
        &json!({"type": "SEND_MESSAGE", "payload": {"parts": [{"text": "hello"}]}}),
    )
    .await;
    let mut text = String::new();
    loop {
        let m = recv(&mut ws).await;
        match m["type"].as_str().unwrap_or_default() {
            "TURN_COMPLETE" => break,
            "GEMINI_ERROR" => panic!("{m}"),
            _ => {}
        }
        for part in m["payload"]["serverContent"]["modelTurn"]["parts"]
            .as_array()
            .into_iter()
            .flatten()
        {
            text.push_str(part["text"].as_str().unwrap_or_default());
        }
    }
    ws.close(None).await.unwrap();
    text
}

/// Every wrong way of presenting (or not presenting) the token, on both listeners.
fn wrong_attempts(own: &str, main: &str) -> Vec<(String, Vec<(&'static str, String)>)> {
    let prefix = &TOKEN[..TOKEN.len() - 1];
    let mut out = Vec::new();
    for base in [own.to_owned(), main.to_owned()] {
        out.push((base.clone(), vec![]));
        out.push((
            base.clone(),
            vec![("Authorization", "Bearer wrong-token".to_owned())],
        ));
        out.push((
            base.clone(),
            vec![("Authorization", format!("Bearer {prefix}"))],
        ));
        out.push((
            base.clone(),
            vec![("Authorization", format!("Bearer {TOKEN}x"))],
        ));
        // The right token under another scheme is not a bearer token.
        out.push((
            base.clone(),
            vec![("Authorization", format!("Basic {TOKEN}"))],
        ));
        out.push((format!("{base}?token={prefix}"), vec![]));
        out.push((format!("{base}?token="), vec![]));
        out.push((format!("{base}?tokens={TOKEN}"), vec![]));
    }
    out.push((format!("{own}{prefix}"), vec![]));
    out.push((format!("{own}x/{TOKEN}x"), vec![]));
    out.push((format!("{main}/{prefix}"), vec![]));
    out
}

#[tokio::test]
async fn passthrough_with_tokens_refuses_wrong_callers_before_any_upstream_connection() {
    let (base_url, attempts) = counting_live_api().await;
    let server = Running::start(passthrough(base_url, &[TOKEN])).await;
    let own = format!("ws://{}/", server.listener("gemini").unwrap());
    let main = format!("ws://{}/gemini", server.addr);
    let wrong = wrong_attempts(&own, &main);
    for (url, headers) in &wrong {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (status, body) = refused(url, &headers).await;
        assert_eq!(status, 401, "{url} {headers:?}: {body}");
        assert!(body.contains("token"), "{body}");
    }
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        0,
        "a refused caller reached upstream"
    );
    // Each refusal is counted; none became a session.
    assert_eq!(
        counter(&server, "voxgate_errors_total"),
        u64::try_from(wrong.len()).unwrap()
    );
    assert_eq!(counter(&server, "voxgate_sessions_total"), 0);

    // The right token in the header is served end to end.
    let bearer = format!("Bearer {TOKEN}");
    assert_eq!(
        text_turn(&own, &[("Authorization", &bearer)]).await,
        "Bonjour"
    );
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
    assert_eq!(counter(&server, "voxgate_sessions_total"), 1);
    server.stop().await;
}

#[tokio::test]
async fn the_right_token_in_the_url_reaches_the_fake_upstream() {
    let (base_url, attempts) = counting_live_api().await;
    let server = Running::start(passthrough(base_url, &["other-token", TOKEN])).await;
    let own = server.listener("gemini").unwrap();
    let main = server.addr;
    let urls = [
        // What an app that only takes a URL can be given.
        format!("ws://{own}/?token={TOKEN}"),
        format!("ws://{own}/{TOKEN}"),
        format!("ws://{main}/gemini?token={TOKEN}"),
        format!("ws://{main}/gemini/{TOKEN}"),
    ];
    for (i, url) in urls.iter().enumerate() {
        assert_eq!(text_turn(url, &[]).await, "Bonjour", "{url}");
        assert_eq!(attempts.load(Ordering::SeqCst), i + 1);
    }
    // A wrong header does not spoil a right URL token.
    assert_eq!(
        text_turn(&urls[0], &[("Authorization", "Bearer nope")]).await,
        "Bonjour"
    );
    server.stop().await;
}

#[tokio::test]
async fn engine_mode_with_tokens_requires_them() {
    let mut config = Config::default();
    config.gemini.tokens = vec![TOKEN.to_owned()];
    let server = Running::start(config).await;
    let own = format!("ws://{}/", server.listener("gemini").unwrap());
    let (status, _) = refused(&own, &[]).await;
    assert_eq!(status, 401);
    let (status, _) = refused(&format!("{own}?token=wrong"), &[]).await;
    assert_eq!(status, 401);
    let bearer = format!("Bearer {TOKEN}");
    assert_eq!(
        text_turn(&own, &[("Authorization", &bearer)]).await,
        "You said: hello"
    );
    assert_eq!(
        text_turn(&format!("ws://{}/gemini/{TOKEN}", server.addr), &[]).await,
        "You said: hello"
    );
    server.stop().await;
}

#[tokio::test]
async fn passthrough_without_tokens_serves_this_machine_but_not_a_proxied_caller() {
    let (base_url, attempts) = counting_live_api().await;
    let server = Running::start(passthrough(base_url, &[])).await;
    let own = format!("ws://{}/", server.listener("gemini").unwrap());
    let main = format!("ws://{}/gemini", server.addr);
    // A reverse proxy on this machine makes every caller look local: refused.
    for (url, header) in [
        (&own, ("X-Forwarded-For", "203.0.113.7")),
        (&main, ("Forwarded", "for=203.0.113.7")),
        (&own, ("X-Real-IP", "203.0.113.7")),
    ] {
        let (status, body) = refused(url, &[header]).await;
        assert_eq!(status, 403, "{body}");
        assert!(body.contains("[gemini] tokens"), "{body}");
    }
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        0,
        "a refused caller reached upstream"
    );
    assert_eq!(counter(&server, "voxgate_sessions_total"), 0);
    // A loopback peer is the machine itself.
    assert_eq!(text_turn(&own, &[]).await, "Bonjour");
    assert_eq!(text_turn(&main, &[]).await, "Bonjour");
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
    server.stop().await;
}
