//! HTTP connections outside the WebSocket sessions, end to end: a real server on loopback and
//! raw TCP (or a real HTTP/2 client) that holds connections the way a slow or idle peer does.
//! Each connection must be closed within its bound (`[limits] header_timeout_secs`,
//! `http_idle_timeout_secs`, `body_timeout_secs`), one address may hold at most
//! `max_connections_per_ip` of them, and shutdown does not wait for a peer that never
//! finishes its request. The timeouts are set to a second or so to keep the tests short.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use axum::http::{Method, Request, StatusCode};
use bytes::Bytes;
use support::{Running, WAIT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use voxgate_server::{Config, LimitsConfig};

/// The default configuration with `limits` changed by `f`.
fn config(f: impl FnOnce(&mut LimitsConfig)) -> Config {
    let mut c = Config::default();
    f(&mut c.limits);
    c
}

/// A TCP connection to `server` from the loopback address `127.0.0.{last}`.
async fn tcp_from(last: u8, server: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::new(
            IpAddr::V4(Ipv4Addr::new(127, 0, 0, last)),
            0,
        ))
        .unwrap();
    socket.connect(server).await.unwrap()
}

const HEALTH: &[u8] = b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n";

/// Reads one HTTP/1.1 response whose body has a `Content-Length` from a connection that stays
/// open; returns the status and the body, or `None` when the connection ended first.
async fn try_read_response(s: &mut TcpStream) -> Option<(u16, String)> {
    let mut raw = Vec::new();
    let mut buf = [0_u8; 4096];
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            if raw.len() >= end + 4 + length {
                let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
                let body = String::from_utf8_lossy(&raw[end + 4..end + 4 + length]).into_owned();
                return Some((status, body));
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf))
            .await
            .expect("a response in time")
        {
            Ok(0) | Err(_) => return None,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
        }
    }
}

/// [`try_read_response`], which must find a whole response.
async fn read_response(s: &mut TcpStream) -> (u16, String) {
    try_read_response(s).await.expect("a whole response")
}

/// A keep-alive connection that has been answered one `GET /health`.
async fn served_once(server: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(server).await.unwrap();
    s.write_all(HEALTH).await.unwrap();
    assert_eq!(read_response(&mut s).await.0, 200);
    s
}

/// Reads until the server closes the connection (end of stream or reset), at most `limit`;
/// returns what it sent meanwhile.
async fn until_closed(s: &mut TcpStream, limit: Duration) -> Vec<u8> {
    let mut seen = Vec::new();
    let mut buf = [0_u8; 1024];
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return seen,
            Ok(Ok(n)) => seen.extend_from_slice(&buf[..n]),
            Err(_) => panic!(
                "still open after {limit:?}; received {:?}",
                String::from_utf8_lossy(&seen)
            ),
        }
    }
}

/// Writes `bytes` one at a time, `every` apart, until the server closes the connection (a
/// write fails or a read sees the end). Returns what the server sent and when it closed,
/// measured from `since`; panics if it never did.
async fn drip(
    s: &mut TcpStream,
    bytes: &[u8],
    every: Duration,
    since: Instant,
) -> (Vec<u8>, Duration) {
    let mut seen = Vec::new();
    let mut buf = [0_u8; 1024];
    for b in bytes {
        if s.write_all(&[*b]).await.is_err() {
            return (seen, since.elapsed());
        }
        let wait = tokio::time::sleep(every);
        tokio::pin!(wait);
        loop {
            tokio::select! {
                () = &mut wait => break,
                r = s.read(&mut buf) => match r {
                    Ok(0) | Err(_) => return (seen, since.elapsed()),
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                },
            }
        }
    }
    panic!(
        "the whole drip was taken; received {:?}",
        String::from_utf8_lossy(&seen)
    );
}

fn assert_around(closed: Duration, bound: Duration) {
    assert!(
        closed >= bound.saturating_sub(Duration::from_millis(100))
            && closed < bound + Duration::from_secs(2),
        "closed after {closed:?}, the bound is {bound:?}"
    );
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let server = Running::start(config(|l| {
        l.header_timeout_secs = 30;
        l.http_idle_timeout_secs = 1;
    }))
    .await;
    let mut s = served_once(server.addr).await;
    let t0 = Instant::now();
    let after = until_closed(&mut s, Duration::from_secs(5)).await;
    assert!(after.is_empty(), "{:?}", String::from_utf8_lossy(&after));
    assert_around(t0.elapsed(), Duration::from_secs(1));
    server.stop().await;
}

#[tokio::test]
async fn a_second_request_head_dripped_is_dropped_at_the_header_timeout() {
    let server = Running::start(config(|l| {
        l.header_timeout_secs = 1;
        l.http_idle_timeout_secs = 30;
    }))
    .await;
    let mut s = served_once(server.addr).await;
    // The next head, one byte every 100 ms: the whole of it would take several seconds.
    let (seen, closed) = drip(&mut s, HEALTH, Duration::from_millis(100), Instant::now()).await;
    assert!(seen.is_empty(), "{:?}", String::from_utf8_lossy(&seen));
    assert_around(closed, Duration::from_secs(1));
    server.stop().await;
}

#[tokio::test]
async fn a_silent_connection_and_a_bare_h2_preface_are_dropped_at_the_header_timeout() {
    let server = Running::start(config(|l| {
        l.header_timeout_secs = 1;
        l.http_idle_timeout_secs = 30;
    }))
    .await;
    let mut silent = TcpStream::connect(server.addr).await.unwrap();
    let mut h2 = TcpStream::connect(server.addr).await.unwrap();
    h2.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    let t0 = Instant::now();
    until_closed(&mut silent, Duration::from_secs(5)).await;
    until_closed(&mut h2, Duration::from_secs(5)).await;
    assert_around(t0.elapsed(), Duration::from_secs(1));
    server.stop().await;
}

/// The head of a `POST /api/message` announcing a 100-byte body.
fn message_head() -> Vec<u8> {
    b"POST /api/message HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
      Content-Length: 100\r\n\r\n"
        .to_vec()
}

#[tokio::test]
async fn a_dripped_body_is_answered_408_and_closed_at_the_body_timeout() {
    let server = Running::start(config(|l| {
        l.header_timeout_secs = 30;
        l.http_idle_timeout_secs = 30;
        l.body_timeout_secs = 1;
    }))
    .await;
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    s.write_all(&message_head()).await.unwrap();
    let t0 = Instant::now();
    let (seen, closed) = drip(&mut s, &[b' '; 100], Duration::from_millis(100), t0).await;
    let seen = String::from_utf8_lossy(&seen);
    assert!(seen.starts_with("HTTP/1.1 408 "), "{seen}");
    assert_around(closed, Duration::from_secs(1));
    // A body sent at once is not affected.
    let r = support::post_json(
        server.addr,
        "/api/message",
        &serde_json::json!({"content": "hello"}),
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");
    server.stop().await;
}

/// An HTTP/2 (h2c, prior knowledge) client connection to `server`, driven by its own task
/// (which answers the server's pings) that ends when the connection does.
async fn h2_client(
    server: SocketAddr,
) -> (
    h2::client::SendRequest<Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    let tcp = TcpStream::connect(server).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    (client, tokio::spawn(connection))
}

/// Sends a `GET /health` over HTTP/2 and reads the whole answer.
async fn h2_health(client: &mut h2::client::SendRequest<Bytes>, server: SocketAddr) {
    let req = Request::get(format!("http://{server}/health"))
        .body(())
        .unwrap();
    let (resp, _) = client.send_request(req, true).unwrap();
    let resp = tokio::time::timeout(WAIT, resp).await.unwrap().unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
    }
}

#[tokio::test]
async fn an_idle_h2c_connection_is_closed_after_the_idle_timeout() {
    let server = Running::start(config(|l| {
        l.header_timeout_secs = 30;
        l.http_idle_timeout_secs = 1;
    }))
    .await;
    let (mut client, connection) = h2_client(server.addr).await;
    h2_health(&mut client, server.addr).await;
    let t0 = Instant::now();
    // The client stays alive (it answers pings and keeps its handle): only the server can end it.
    let ended = tokio::time::timeout(Duration::from_secs(5), connection).await;
    assert!(ended.is_ok(), "the h2c connection is still open");
    assert_around(t0.elapsed(), Duration::from_secs(1));
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn a_dripped_h2_body_is_answered_408_at_the_body_timeout() {
    let server = Running::start(config(|l| {
        l.header_timeout_secs = 30;
        l.http_idle_timeout_secs = 30;
        l.body_timeout_secs = 1;
    }))
    .await;
    let (mut client, _connection) = h2_client(server.addr).await;
    let req = Request::builder()
        .method(Method::POST)
        .uri(format!("http://{}/api/message", server.addr))
        .header("content-type", "application/json")
        .header("content-length", "100")
        .body(())
        .unwrap();
    let (resp, mut body) = client.send_request(req, false).unwrap();
    let t0 = Instant::now();
    let dripping = tokio::spawn(async move {
        for _ in 0..100 {
            if body.send_data(Bytes::from_static(b" "), false).is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let resp = tokio::time::timeout(Duration::from_secs(5), resp)
        .await
        .expect("an answer before the body ends")
        .unwrap();
    assert_eq!(resp.status(), StatusCode::REQUEST_TIMEOUT);
    assert_around(t0.elapsed(), Duration::from_secs(1));
    dripping.abort();
    server.stop().await;
}

/// Connects from `127.0.0.{last}` and expects the per-address refusal: a `429` and the end of
/// the connection, at once.
async fn refused_from(last: u8, server: SocketAddr) {
    let mut s = tcp_from(last, server).await;
    let seen = until_closed(&mut s, Duration::from_secs(2)).await;
    let seen = String::from_utf8_lossy(&seen);
    assert!(seen.starts_with("HTTP/1.1 429 "), "{seen:?}");
    assert!(
        seen.to_ascii_lowercase().contains("retry-after: "),
        "{seen}"
    );
}

/// A `GET /health` answered on a keep-alive connection from `127.0.0.{last}`, retried for a
/// moment while refused (a closed connection gives its place back once its task has ended).
async fn served_from(last: u8, server: SocketAddr) -> TcpStream {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let mut s = tcp_from(last, server).await;
        if s.write_all(HEALTH).await.is_ok() {
            match try_read_response(&mut s).await {
                Some((200, _)) => return s,
                Some((429, _)) | None => {}
                Some(other) => panic!("unexpected answer {other:?}"),
            }
        }
        assert!(Instant::now() < deadline, "127.0.0.{last} still refused");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn one_address_holds_at_most_its_connections_while_others_are_served() {
    let server = Running::start(config(|l| {
        l.header_timeout_secs = 30;
        l.http_idle_timeout_secs = 30;
        l.max_connections_per_ip = 3;
    }))
    .await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(served_from(1, server.addr).await);
    }
    refused_from(1, server.addr).await;
    // Another address is served meanwhile, and so are the connections already held.
    let mut other = tcp_from(2, server.addr).await;
    other.write_all(HEALTH).await.unwrap();
    assert_eq!(read_response(&mut other).await.0, 200);
    held[0].write_all(HEALTH).await.unwrap();
    assert_eq!(read_response(&mut held[0]).await.0, 200);
    // A closed connection gives its place back; an upgraded WebSocket session keeps its own.
    held.pop();
    let ws = loop {
        match support::try_connect(&format!("ws://{}/realtime", server.addr), &[], WAIT).await {
            Ok(ws) => break ws,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    refused_from(1, server.addr).await;
    drop(ws);
    held.push(served_from(1, server.addr).await);
    refused_from(1, server.addr).await;
    drop(held);
    server.stop().await;
}

#[tokio::test]
async fn shutdown_does_not_wait_for_unfinished_bodies_or_idle_connections() {
    let server = Running::start(config(|l| {
        l.header_timeout_secs = 60;
        l.http_idle_timeout_secs = 60;
        l.body_timeout_secs = 60;
        l.shutdown_grace_secs = 1;
    }))
    .await;
    // A request whose body never ends, an idle HTTP/1.1 keep-alive and an idle h2c connection.
    let mut body = TcpStream::connect(server.addr).await.unwrap();
    body.write_all(&message_head()).await.unwrap();
    body.write_all(b"{\"content\":").await.unwrap();
    let mut idle = served_once(server.addr).await;
    let (mut client, h2_connection) = h2_client(server.addr).await;
    h2_health(&mut client, server.addr).await;
    // Let the server start reading the body.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t0 = Instant::now();
    server.stop_within(Duration::from_secs(4)).await;
    assert!(t0.elapsed() < Duration::from_secs(4));
    until_closed(&mut body, Duration::from_secs(1)).await;
    until_closed(&mut idle, Duration::from_secs(1)).await;
    tokio::time::timeout(Duration::from_secs(1), h2_connection)
        .await
        .expect("the h2c connection closed")
        .unwrap()
        .ok();
    drop(client);
}
