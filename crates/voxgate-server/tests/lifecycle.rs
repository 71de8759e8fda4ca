//! The session lifecycle every door shares (the door driver), end to end on the realtime door:
//! a real server on 127.0.0.1, a real WebSocket client. Initialization and idle timeouts,
//! keepalive with dead-peer detection, the write timeout for a peer that stops reading, close
//! handshakes and codes, and shutdown with 1001.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use support::{Running, WAIT, Ws, connect};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use voxgate_realtime::proto::client_bound_message::Payload as Down;
use voxgate_realtime::proto::{InferenceTriggerMode, SessionErrorCategory};
use voxgate_realtime::{AudioFormat, ClientBoundMessage, ServiceBoundMessage, SessionConfig};
use voxgate_server::Config;
use voxgate_server::metrics::Door;

async fn send(ws: &mut Ws, m: &ServiceBoundMessage) {
    ws.send(Message::Binary(m.to_frame())).await.unwrap();
}

/// Reads until the server's close frame; the protocol messages before it, and the close.
async fn until_close(ws: &mut Ws, wait: Duration) -> (Vec<Down>, Option<CloseFrame>) {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let msg = tokio::time::timeout_at(deadline, ws.next())
            .await
            .expect("the server closes in time");
        match msg {
            Some(Ok(Message::Binary(b))) => {
                seen.push(
                    ClientBoundMessage::decode_frame(b)
                        .unwrap()
                        .payload
                        .unwrap(),
                );
            }
            Some(Ok(Message::Close(frame))) => return (seen, frame),
            Some(Ok(_)) => {}
            None | Some(Err(_)) => panic!("connection dropped without a close frame: {seen:?}"),
        }
    }
}

fn config(f: impl FnOnce(&mut Config)) -> Config {
    let mut c = Config::default();
    f(&mut c);
    c
}

async fn initialized(addr: SocketAddr) -> Ws {
    let mut ws = connect(addr, "/realtime").await;
    let c = SessionConfig::new(AudioFormat::SPEECH_16K, AudioFormat::SPEECH_16K);
    send(&mut ws, &ServiceBoundMessage::initialize(&c).unwrap()).await;
    loop {
        let m = ws.next().await.unwrap().unwrap();
        if let Message::Binary(b) = m {
            let p = ClientBoundMessage::decode_frame(b)
                .unwrap()
                .payload
                .unwrap();
            assert!(matches!(p, Down::SessionReady(_)), "{p:?}");
            return ws;
        }
    }
}

#[tokio::test]
async fn a_connection_that_never_initializes_is_told_and_closed_with_1008() {
    let server = Running::start(config(|c| c.limits.init_timeout_secs = 1)).await;
    let t0 = Instant::now();
    let mut ws = connect(server.addr, "/realtime").await;
    let (seen, close) = until_close(&mut ws, WAIT).await;
    let elapsed = t0.elapsed();
    assert!(
        elapsed >= Duration::from_millis(900) && elapsed < Duration::from_secs(4),
        "{elapsed:?}"
    );
    assert!(
        matches!(&seen[..], [Down::Error(e)] if e.category == SessionErrorCategory::ErrorSession as i32),
        "{seen:?}"
    );
    assert_eq!(close.unwrap().code, CloseCode::Policy);
    server.sessions_drain(Door::Realtime).await;
    server.stop().await;
}

#[tokio::test]
async fn an_initialized_session_outlives_the_init_timeout_and_idles_out_with_1000() {
    let server = Running::start(config(|c| {
        c.limits.init_timeout_secs = 1;
        c.limits.idle_timeout_secs = 2;
    }))
    .await;
    let mut ws = initialized(server.addr).await;
    let t0 = Instant::now();
    // Talking keeps it open past both timeouts.
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        send(&mut ws, &ServiceBoundMessage::ping()).await;
    }
    assert_eq!(server.metrics.active_sessions(Door::Realtime), 1);
    let (_, close) = until_close(&mut ws, WAIT).await;
    let close = close.unwrap();
    assert_eq!(close.code, CloseCode::Normal);
    assert!(close.reason.contains("idle"), "{close:?}");
    assert!(
        t0.elapsed() >= Duration::from_millis(4_400),
        "{:?}",
        t0.elapsed()
    );
    server.stop().await;
}

#[tokio::test]
async fn a_client_close_is_answered_with_a_close_frame() {
    let server = Running::start(Config::default()).await;
    let mut ws = initialized(server.addr).await;
    ws.send(Message::Close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: "bye".into(),
    })))
    .await
    .unwrap();
    let (_, close) = until_close(&mut ws, WAIT).await;
    assert_eq!(close.unwrap().code, CloseCode::Normal);
    server.sessions_drain(Door::Realtime).await;
    server.stop().await;
}

#[tokio::test]
async fn shutdown_closes_open_sessions_with_1001() {
    let server = Running::start(config(|c| c.limits.shutdown_grace_secs = 1)).await;
    let mut ws = initialized(server.addr).await;
    let reader = tokio::spawn(async move { until_close(&mut ws, WAIT).await });
    server.stop_within(Duration::from_secs(5)).await;
    let (_, close) = reader.await.unwrap();
    assert_eq!(close.unwrap().code, CloseCode::Away);
}

#[tokio::test]
async fn a_message_over_the_hard_limit_closes_with_1009() {
    let server = Running::start(config(|c| c.max_frame_bytes = 1024)).await;
    let mut ws = initialized(server.addr).await;
    // Over the configured limit: the protocol's error, the session goes on.
    ws.send(Message::Binary(vec![0u8; 2_000].into()))
        .await
        .unwrap();
    let m = ws.next().await.unwrap().unwrap();
    let Message::Binary(b) = m else {
        panic!("{m:?}")
    };
    assert!(matches!(
        ClientBoundMessage::decode_frame(b)
            .unwrap()
            .payload
            .unwrap(),
        Down::Error(_)
    ));
    // Over four times it: the connection cannot go on.
    ws.send(Message::Binary(vec![0u8; 64 * 1024].into()))
        .await
        .unwrap();
    let (_, close) = until_close(&mut ws, WAIT).await;
    assert_eq!(close.unwrap().code, CloseCode::Size);
    server.stop().await;
}

#[tokio::test]
async fn keepalive_pings_a_live_peer_and_closes_a_dead_one() {
    let server = Running::start(config(|c| {
        c.limits.ping_interval_secs = 1;
        c.limits.idle_timeout_secs = 0;
    }))
    .await;
    let mut ws = initialized(server.addr).await;
    // A live peer answers pings (tungstenite does while it reads).
    let mut pings = 0;
    let until = tokio::time::Instant::now() + Duration::from_millis(3_500);
    while let Ok(m) = tokio::time::timeout_at(until, ws.next()).await {
        if let Some(Ok(Message::Ping(_))) = m {
            pings += 1;
        }
    }
    assert!(pings >= 2, "{pings} pings");
    assert_eq!(server.metrics.active_sessions(Door::Realtime), 1);
    // A peer that answers nothing for two intervals is dead.
    let t0 = Instant::now();
    server.sessions_drain(Door::Realtime).await;
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    drop(ws);
    server.stop().await;
}

/// A client whose socket takes little and that never reads.
async fn small_window_client(addr: SocketAddr) -> Ws {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let stream = socket.connect(addr).await.unwrap();
    let stream = tokio_tungstenite::MaybeTlsStream::Plain(stream);
    let (ws, _) = tokio_tungstenite::client_async(format!("ws://{addr}/realtime"), stream)
        .await
        .unwrap();
    ws
}

#[tokio::test]
async fn a_peer_that_stops_reading_is_closed_within_the_write_timeout() {
    let server = Running::start(config(|c| {
        c.limits.write_timeout_secs = 1;
        c.limits.ping_interval_secs = 0;
        c.limits.idle_timeout_secs = 0;
    }))
    .await;
    // A healthy session beside it keeps being answered.
    let mut healthy = initialized(server.addr).await;

    let mut slow = small_window_client(server.addr).await;
    let c = SessionConfig::new(AudioFormat::SPEECH_16K, AudioFormat::SPEECH_16K);
    send(&mut slow, &ServiceBoundMessage::initialize(&c).unwrap()).await;
    // A long turn, then history exports of it until the server can write no more.
    let words = "lorem ipsum dolor sit amet ".repeat(1_000);
    send(
        &mut slow,
        &ServiceBoundMessage::user_text(1, InferenceTriggerMode::Immediate, words),
    )
    .await;
    let export = ServiceBoundMessage::from(voxgate_realtime::proto::ExportChatHistoryRequest {
        await_pending: false,
        exclude_audio: true,
    });
    let t0 = Instant::now();
    let mut sent = 0;
    // Sending stops mattering once the server has closed (a send then fails).
    while sent < 2_000 && slow.send(Message::Binary(export.to_frame())).await.is_ok() {
        sent += 1;
        if server.metrics.active_sessions(Door::Realtime) == 1 {
            break;
        }
    }
    server.wait_sessions(Door::Realtime, 1).await;
    assert!(t0.elapsed() < Duration::from_secs(8), "{:?}", t0.elapsed());
    // The healthy one never noticed.
    send(&mut healthy, &ServiceBoundMessage::ping()).await;
    let m = healthy.next().await.unwrap().unwrap();
    let Message::Binary(b) = m else {
        panic!("{m:?}")
    };
    assert!(matches!(
        ClientBoundMessage::decode_frame(b)
            .unwrap()
            .payload
            .unwrap(),
        Down::Pong(_)
    ));
    drop(slow);
    server.stop().await;
}

#[tokio::test]
async fn a_slow_drip_upgrade_is_dropped_at_the_header_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = Running::start(config(|c| c.limits.header_timeout_secs = 1)).await;
    let mut tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let t0 = Instant::now();
    let head = format!(
        "GET /realtime HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n",
        server.addr
    );
    // One byte every 100 ms: the whole head would take several seconds.
    let mut closed = None;
    for b in head.bytes() {
        if tcp.write_all(&[b]).await.is_err() {
            closed = Some(t0.elapsed());
            break;
        }
        let mut buf = [0u8; 256];
        match tokio::time::timeout(Duration::from_millis(100), tcp.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => {
                closed = Some(t0.elapsed());
                break;
            }
            Ok(Ok(n)) => panic!("unexpected answer {:?}", String::from_utf8_lossy(&buf[..n])),
            Err(_) => {}
        }
    }
    let closed = closed.expect("the server dropped the connection");
    assert!(
        closed >= Duration::from_millis(900) && closed < Duration::from_secs(3),
        "{closed:?}"
    );
    // A prompt client on the same server is served as usual.
    let ws = initialized(server.addr).await;
    drop(ws);
    server.stop().await;
}
