//! Admission control end to end: a real server on loopback, clients on several loopback
//! addresses (127.0.0.2, 127.0.0.3, ... are all this host on Linux), sessions that stream while
//! others are refused before their handshake.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use support::{Running, WAIT, Ws, http};
use tokio::net::TcpSocket;
use tokio::sync::watch;
use tokio_tungstenite::MaybeTlsStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use voxgate_audio::opus::{OpusEncoder, OpusEncoderConfig};
use voxgate_providers::{DemoAgent, NoAsr, ToneTts};
use voxgate_server::metrics::{Direction, Door, RefusalReason};
use voxgate_server::{Config, LimitsConfig, Providers};
use voxgate_xiaozhi::frame::{Frame, FrameCodec, ProtocolVersion};

const XIAOZHI: &str = "/xiaozhi/v1/";
const DEVICE_HEADERS: [(&str, &str); 3] = [
    ("Protocol-Version", "1"),
    ("Device-Id", "aa:bb:cc:dd:ee:ff"),
    ("Client-Id", "3b5c1f2e-0000-4000-8000-000000000001"),
];

fn providers() -> Providers {
    Providers {
        llm: Arc::new(DemoAgent::new()),
        asr: Arc::new(NoAsr),
        tts: Arc::new(ToneTts),
    }
}

/// A configuration with `limits` and nothing else limited.
fn config(limits: LimitsConfig) -> Config {
    Config {
        limits,
        ..Config::default()
    }
}

fn loopback(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

/// Opens `ws://{server}{path}` from the local address `from`.
async fn connect_from(
    from: IpAddr,
    server: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<Ws, WsError> {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    let stream = socket.connect(server).await.unwrap();
    let mut req = format!("ws://{server}{path}")
        .into_client_request()
        .unwrap();
    for (k, v) in headers {
        let name: tokio_tungstenite::tungstenite::http::HeaderName = k.parse().unwrap();
        req.headers_mut().insert(name, v.parse().unwrap());
    }
    tokio::time::timeout(
        WAIT,
        tokio_tungstenite::client_async(req, MaybeTlsStream::Plain(stream)),
    )
    .await
    .expect("an answer in time")
    .map(|(ws, _)| ws)
}

/// A refused upgrade: status, `Retry-After` and the plain-text reason.
#[derive(Debug)]
struct Refused {
    status: u16,
    retry_after: String,
    body: String,
}

fn refused(r: Result<Ws, WsError>) -> Refused {
    match r {
        Err(WsError::Http(resp)) => Refused {
            status: resp.status().as_u16(),
            retry_after: resp
                .headers()
                .get("retry-after")
                .expect("a Retry-After header")
                .to_str()
                .unwrap()
                .to_owned(),
            body: String::from_utf8_lossy(resp.body().as_deref().unwrap_or_default()).into_owned(),
        },
        Err(e) => panic!("expected an HTTP refusal, got {e}"),
        Ok(_) => panic!("expected a refusal, the upgrade was accepted"),
    }
}

/// Connects, retrying for a moment while the refusal is the one given: a permit is given back
/// just after the session's metrics count it closed, so a test that waited for the count may
/// be a hair early.
async fn connect_soon(from: IpAddr, server: SocketAddr, path: &str, h: &[(&str, &str)]) -> Ws {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        match connect_from(from, server, path, h).await {
            Ok(ws) => return ws,
            Err(e) if Instant::now() < deadline => {
                let r = refused(Err(e));
                assert!(r.status == 503 || r.status == 429, "{r:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("still refused: {:?}", refused(Err(e))),
        }
    }
}

async fn metrics_text(addr: SocketAddr) -> String {
    let r = http(addr, "GET", "/metrics", &[], b"").await;
    assert_eq!(r.status, 200);
    r.body
}

/// One streaming Xiaozhi device: says hello, streams silent 60 ms Opus frames (in real time)
/// until `flood_over`, asks a text turn while still streaming, and returns the reply's
/// sentences and the frames it sent once the reply has played.
async fn streaming_device(
    addr: SocketAddr,
    n: usize,
    mut ws: Ws,
    flood_over: watch::Receiver<bool>,
) -> (Vec<String>, usize) {
    let mut enc = OpusEncoder::new(OpusEncoderConfig::voice(16_000)).unwrap();
    let silence = vec![0_i16; enc.frame_samples()];
    let codec = FrameCodec::new(ProtocolVersion::V1);
    let hello = json!({
        "type": "hello", "version": 1, "transport": "websocket",
        "audio_params": {"format": "opus", "sample_rate": 16000, "channels": 1, "frame_duration": 60}
    });
    ws.send(Message::Text(hello.to_string().into()))
        .await
        .unwrap();
    let Some(Ok(Message::Text(t))) = ws.next().await else {
        panic!("device {n} ({addr}): no server hello")
    };
    let v: Value = serde_json::from_str(&t).unwrap();
    assert_eq!(v["type"], "hello");
    let listen = json!({"session_id": "s", "type": "listen", "state": "start", "mode": "auto"});
    ws.send(Message::Text(listen.to_string().into()))
        .await
        .unwrap();
    let mut tick = tokio::time::interval(Duration::from_millis(60));
    let mut sent = 0;
    let mut asked = false;
    let mut sentences = Vec::new();
    let deadline = tokio::time::sleep(WAIT * 2);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let packet = enc.encode(&silence).unwrap().to_vec();
                let mut out = Vec::new();
                codec.encode(&Frame::opus(&packet), &mut out).unwrap();
                ws.send(Message::Binary(out.into())).await.unwrap();
                sent += 1;
                if !asked && sent >= 10 && *flood_over.borrow() {
                    let ask = json!({"session_id": "s", "type": "listen", "state": "detect",
                                     "text": format!("hello number {n}")});
                    ws.send(Message::Text(ask.to_string().into())).await.unwrap();
                    asked = true;
                }
            }
            msg = ws.next() => match msg {
                Some(Ok(Message::Text(t))) => {
                    let v: Value = serde_json::from_str(&t).unwrap();
                    if v["type"] == "tts" && v["state"] == "sentence_start" {
                        sentences.push(v["text"].as_str().unwrap_or_default().to_owned());
                    }
                    if asked && v["type"] == "tts" && v["state"] == "stop" {
                        break;
                    }
                }
                Some(Ok(_)) => {}
                other => panic!("device {n}: the session ended: {other:?}"),
            },
            () = &mut deadline => panic!("device {n}: no reply in time"),
        }
    }
    let _ = ws.close(None).await;
    (sentences, sent)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_door_refuses_fast_while_its_sessions_keep_streaming_and_frees_places_on_close() {
    const CAPACITY: usize = 8;
    let server = Running::start_with(
        config(LimitsConfig {
            max_sessions_per_door: CAPACITY,
            ..LimitsConfig::unlimited()
        }),
        providers(),
    )
    .await;
    let me = loopback(1);
    let (flood_over_tx, flood_over) = watch::channel(false);
    let mut devices = Vec::new();
    for n in 0..CAPACITY {
        let ws = connect_from(me, server.addr, XIAOZHI, &DEVICE_HEADERS)
            .await
            .unwrap();
        devices.push(tokio::spawn(streaming_device(
            server.addr,
            n,
            ws,
            flood_over.clone(),
        )));
    }
    server.wait_sessions(Door::Xiaozhi, 8).await;
    // Let every device get its hello and start streaming.
    tokio::time::sleep(Duration::from_millis(300)).await;

    // The door is full: each extra attempt is answered at once, before any handshake.
    for attempt in 0..50 {
        let t0 = Instant::now();
        let r = refused(connect_from(me, server.addr, XIAOZHI, &DEVICE_HEADERS).await);
        let took = t0.elapsed();
        assert_eq!(r.status, 503, "attempt {attempt}: {r:?}");
        assert_eq!(r.retry_after, "5");
        assert!(r.body.contains("capacity"), "{r:?}");
        assert!(
            took < Duration::from_millis(100),
            "attempt {attempt} took {took:?}"
        );
    }
    assert_eq!(server.metrics.active_sessions(Door::Xiaozhi), 8);
    flood_over_tx.send(true).unwrap();

    // Every admitted device still streams and gets its answer, and nothing was dropped.
    for (n, device) in devices.into_iter().enumerate() {
        let (sentences, sent) = device.await.unwrap();
        assert_eq!(sentences, [format!("You said: hello number {n}")]);
        assert!(sent >= 10);
    }
    for direction in [Direction::Uplink, Direction::Downlink] {
        assert_eq!(server.metrics.dropped_frames(Door::Xiaozhi, direction), 0);
    }
    assert_eq!(
        server
            .metrics
            .refused_sessions(Door::Xiaozhi, RefusalReason::CapacityDoor),
        50
    );
    let text = metrics_text(server.addr).await;
    assert!(
        text.lines()
            .any(|l| l
                == "voxgate_sessions_refused_total{door=\"xiaozhi\",reason=\"capacity_door\"} 50"),
        "{text}"
    );
    assert!(text.contains("# TYPE voxgate_scheduling_delay_seconds gauge"));

    // Closed sessions give their places back: the door takes a full set again.
    server.sessions_drain(Door::Xiaozhi).await;
    let mut again = Vec::new();
    for _ in 0..CAPACITY {
        again.push(connect_soon(me, server.addr, XIAOZHI, &DEVICE_HEADERS).await);
    }
    let r = refused(connect_from(me, server.addr, XIAOZHI, &DEVICE_HEADERS).await);
    assert_eq!(r.status, 503);
    // Other doors are not full.
    let other = connect_from(me, server.addr, "/realtime", &[])
        .await
        .unwrap();
    drop((again, other));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_server_limit_spans_doors() {
    let server = Running::start_with(
        config(LimitsConfig {
            max_sessions: 2,
            ..LimitsConfig::unlimited()
        }),
        providers(),
    )
    .await;
    let me = loopback(1);
    let a = connect_from(me, server.addr, XIAOZHI, &DEVICE_HEADERS)
        .await
        .unwrap();
    let b = connect_from(me, server.addr, "/realtime", &[])
        .await
        .unwrap();
    let r = refused(connect_from(me, server.addr, "/gemini", &[]).await);
    assert_eq!((r.status, r.retry_after.as_str()), (503, "5"));
    assert!(r.body.contains("server at capacity"), "{r:?}");
    assert_eq!(
        server
            .metrics
            .refused_sessions(Door::Gemini, RefusalReason::CapacityServer),
        1
    );
    drop(a);
    server.sessions_drain(Door::Xiaozhi).await;
    let c = connect_soon(me, server.addr, "/gemini", &[]).await;
    drop((b, c));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_per_address_are_limited_with_429_across_doors() {
    let server = Running::start_with(
        config(LimitsConfig {
            max_sessions_per_ip: 2,
            ..LimitsConfig::unlimited()
        }),
        providers(),
    )
    .await;
    let (two, three) = (loopback(2), loopback(3));
    let first = connect_from(two, server.addr, XIAOZHI, &DEVICE_HEADERS)
        .await
        .unwrap();
    let _second = connect_from(two, server.addr, "/realtime", &[])
        .await
        .unwrap();
    for path in [XIAOZHI, "/realtime", "/gemini", "/mcp"] {
        let r = refused(connect_from(two, server.addr, path, &DEVICE_HEADERS).await);
        assert_eq!((r.status, r.retry_after.as_str()), (429, "5"), "{path}");
        assert_eq!(r.body, "too many sessions from this address");
    }
    // Another address has its own share.
    let _other = connect_from(three, server.addr, XIAOZHI, &DEVICE_HEADERS)
        .await
        .unwrap();
    assert_eq!(
        server
            .metrics
            .refused_sessions(Door::Mcp, RefusalReason::PerIp),
        1
    );
    // A closed session gives its place back to its address.
    drop(first);
    server.wait_sessions(Door::Xiaozhi, 1).await;
    let _again = connect_soon(two, server.addr, XIAOZHI, &DEVICE_HEADERS).await;
    let text = metrics_text(server.addr).await;
    assert!(
        text.lines()
            .any(|l| l == "voxgate_sessions_refused_total{door=\"realtime\",reason=\"per_ip\"} 1"),
        "{text}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshakes_per_address_are_rate_limited_with_retry_after() {
    let server = Running::start_with(
        config(LimitsConfig {
            max_handshakes_per_sec_per_ip: 3,
            ..LimitsConfig::unlimited()
        }),
        providers(),
    )
    .await;
    let (four, five) = (loopback(4), loopback(5));
    // A burst of one second's allowance passes, even for sessions that end at once.
    for _ in 0..3 {
        let ws = connect_from(four, server.addr, "/realtime", &[])
            .await
            .unwrap();
        drop(ws);
    }
    let t0 = Instant::now();
    let r = refused(connect_from(four, server.addr, "/realtime", &[]).await);
    assert_eq!((r.status, r.retry_after.as_str()), (429, "1"), "{r:?}");
    assert_eq!(r.body, "too many connection attempts from this address");
    // Other addresses are not slowed down.
    drop(
        connect_from(five, server.addr, "/realtime", &[])
            .await
            .unwrap(),
    );
    // One token comes back every third of a second.
    tokio::time::sleep(Duration::from_millis(400).saturating_sub(t0.elapsed())).await;
    drop(
        connect_from(four, server.addr, "/realtime", &[])
            .await
            .unwrap(),
    );
    assert_eq!(
        server
            .metrics
            .refused_sessions(Door::Realtime, RefusalReason::HandshakeRate),
        1
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_runtime_refuses_new_sessions_as_overload_until_it_recovers() {
    let server = Running::start_with_overload_guard(
        config(LimitsConfig {
            max_scheduling_delay_ms: 50,
            ..LimitsConfig::unlimited()
        }),
        providers(),
    )
    .await;
    let addr = server.addr;
    // Block both runtime workers in 100 ms slices for a while: timers wake ~100 ms late.
    let hogs: Vec<_> = (0..2)
        .map(|_| {
            tokio::spawn(async {
                let until = Instant::now() + Duration::from_millis(1500);
                while Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(100));
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    // The client runs on its own thread and runtime, so it is not stalled itself.
    let client = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let me = loopback(6);
            let deadline = Instant::now() + Duration::from_secs(5);
            let mut overloaded = None;
            while Instant::now() < deadline {
                match connect_from(me, addr, "/realtime", &[]).await {
                    Ok(ws) => drop(ws),
                    Err(e) => {
                        overloaded = Some(refused(Err(e)));
                        break;
                    }
                }
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
            overloaded
        })
    });
    let r = tokio::task::spawn_blocking(move || client.join().unwrap())
        .await
        .unwrap()
        .expect("refused as overload while stalled");
    assert_eq!((r.status, r.retry_after.as_str()), (503, "5"), "{r:?}");
    assert_eq!(r.body, "server overloaded");
    assert!(
        server
            .metrics
            .refused_sessions(Door::Realtime, RefusalReason::Overload)
            >= 1
    );
    for h in hogs {
        h.await.unwrap();
    }
    // Recovered: admitted again once the figure comes down.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match connect_from(loopback(6), addr, "/realtime", &[]).await {
            Ok(_) => break,
            Err(e) => {
                let r = refused(Err(e));
                assert_eq!(r.body, "server overloaded");
                assert!(Instant::now() < deadline, "never admitted again");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    server.stop().await;
}

/// One admitted session of `door` that keeps its door busy (audio or keep-alives) until the
/// flood is over, then must still be answered: returns the answer's text.
async fn busy_session(
    door: Door,
    server: SocketAddr,
    n: usize,
    mut ws: Ws,
    flood_over: watch::Receiver<bool>,
) -> String {
    use voxgate_realtime::proto::InferenceTriggerMode;
    use voxgate_realtime::proto::client_bound_message::Payload as Down;
    use voxgate_realtime::{AudioFormat, ClientBoundMessage, ServiceBoundMessage, SessionConfig};
    let _ = server;
    let words = format!("hello number {n}");
    let next_json = |m: Message| match m {
        Message::Text(t) => serde_json::from_str::<Value>(t.as_str()).ok(),
        _ => None,
    };
    match door {
        Door::Realtime => {
            let c = SessionConfig::new(AudioFormat::SPEECH_16K, AudioFormat::SPEECH_16K);
            let init = ServiceBoundMessage::initialize(&c).unwrap();
            ws.send(Message::Binary(init.to_frame())).await.unwrap();
            let mut packet = 0;
            while !*flood_over.borrow() {
                packet += 1;
                let audio = ServiceBoundMessage::user_audio(
                    packet,
                    InferenceTriggerMode::Immediate,
                    vec![0u8; 640].into(),
                );
                ws.send(Message::Binary(audio.to_frame())).await.unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let ask = ServiceBoundMessage::user_text(0, InferenceTriggerMode::Immediate, &words);
            ws.send(Message::Binary(ask.to_frame())).await.unwrap();
            let mut text = String::new();
            loop {
                let m = tokio::time::timeout(WAIT, ws.next())
                    .await
                    .unwrap()
                    .unwrap();
                if let Message::Binary(b) = m.unwrap() {
                    match ClientBoundMessage::decode_frame(b)
                        .unwrap()
                        .payload
                        .unwrap()
                    {
                        Down::ModelTextFragment(f) => text.push_str(&f.text),
                        Down::ResponseEnd(_) => return text,
                        _ => {}
                    }
                }
            }
        }
        Door::Gemini => {
            let connect = json!({"type": "CONNECT_GEMINI", "payload": {"initialConfig": {
                "model": "models/test",
                "generationConfig": {"responseModalities": ["TEXT"]}}}});
            ws.send(Message::Text(connect.to_string().into()))
                .await
                .unwrap();
            while !*flood_over.borrow() {
                let audio = json!({"type": "SEND_REALTIME_INPUT", "payload": {"audio": {
                    "mimeType": "audio/pcm;rate=16000",
                    "data": "A".repeat(64)}}});
                ws.send(Message::Text(audio.to_string().into()))
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let ask = json!({"type": "SEND_MESSAGE", "payload": {
                "parts": [{"text": words}], "turnComplete": true}});
            ws.send(Message::Text(ask.to_string().into()))
                .await
                .unwrap();
            let mut text = String::new();
            loop {
                let m = tokio::time::timeout(WAIT, ws.next())
                    .await
                    .unwrap()
                    .unwrap();
                let Some(v) = next_json(m.unwrap()) else {
                    continue;
                };
                if v["type"] == "TURN_COMPLETE" {
                    return text;
                }
                if let Some(parts) = v["payload"]["serverContent"]["modelTurn"]["parts"].as_array()
                {
                    text.extend(parts.iter().filter_map(|p| p["text"].as_str()));
                }
            }
        }
        _ => {
            // Retell: the server speaks first; the call keeps pinging like Retell does.
            let mut stamp = 0u64;
            while !*flood_over.borrow() {
                stamp += 1;
                let ping = json!({"interaction_type": "ping_pong", "timestamp": stamp});
                ws.send(Message::Text(ping.to_string().into()))
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let ask = json!({"interaction_type": "response_required", "response_id": 1,
                "transcript": [{"role": "user", "content": words}]});
            ws.send(Message::Text(ask.to_string().into()))
                .await
                .unwrap();
            let mut text = String::new();
            loop {
                let m = tokio::time::timeout(WAIT, ws.next())
                    .await
                    .unwrap()
                    .unwrap();
                let Some(v) = next_json(m.unwrap()) else {
                    continue;
                };
                if v["response_type"] == "response" && v["response_id"] == 1 {
                    text.push_str(v["content"].as_str().unwrap_or_default());
                    if v["content_complete"] == true {
                        return text;
                    }
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_door_refuses_past_capacity_while_its_sessions_keep_working() {
    const CAPACITY: usize = 4;
    let server = Running::start_with(
        config(LimitsConfig {
            max_sessions_per_door: CAPACITY,
            ..LimitsConfig::unlimited()
        }),
        providers(),
    )
    .await;
    let me = loopback(1);
    for (door, path) in [
        (Door::Realtime, "/realtime".to_owned()),
        (Door::Gemini, "/gemini".to_owned()),
        (Door::Retell, "/llm-websocket/call-{n}".to_owned()),
    ] {
        let path_of = |n: usize| path.replace("{n}", &n.to_string());
        let (flood_over_tx, flood_over) = watch::channel(false);
        let mut sessions = Vec::new();
        for n in 0..CAPACITY {
            let ws = connect_from(me, server.addr, &path_of(n), &[])
                .await
                .unwrap();
            sessions.push(tokio::spawn(busy_session(
                door,
                server.addr,
                n,
                ws,
                flood_over.clone(),
            )));
        }
        server.wait_sessions(door, CAPACITY as u64).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        for attempt in 0..50 {
            let t0 = Instant::now();
            let r = refused(connect_from(me, server.addr, &path_of(100 + attempt), &[]).await);
            let took = t0.elapsed();
            assert_eq!(r.status, 503, "{}: attempt {attempt}: {r:?}", door.label());
            assert_eq!(r.retry_after, "5");
            assert!(
                took < Duration::from_millis(100),
                "{}: attempt {attempt} took {took:?}",
                door.label()
            );
        }
        flood_over_tx.send(true).unwrap();
        for (n, s) in sessions.into_iter().enumerate() {
            let text = s.await.unwrap();
            assert!(
                text.contains(&format!("hello number {n}")),
                "{}: {text:?}",
                door.label()
            );
        }
        for direction in [Direction::Uplink, Direction::Downlink] {
            assert_eq!(server.metrics.dropped_frames(door, direction), 0);
        }
        assert_eq!(
            server
                .metrics
                .refused_sessions(door, RefusalReason::CapacityDoor),
            50
        );
        server.sessions_drain(door).await;
    }
    server.stop().await;
}
