//! What one peer can make the server spend: each test starts work a client may start
//! (anonymously, on the defaults) and checks that its cost stays within a bound, counted on
//! the real server over real sockets on 127.0.0.1.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use support::{Running, connect, http, rt_recv, rt_send};
use voxgate_realtime::proto::client_bound_message::Payload;
use voxgate_realtime::{
    AudioFormat, HostedTtsSettings, HostedVoice, ServiceBoundMessage, SessionConfig, TtsSettings,
};
use voxgate_server::Config;
use voxgate_server::config::TtsConfig;

/// A fresh directory for one test's files.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("voxgate-cost-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A synthesizer script that marks itself running while it works, writes how many runs it
/// saw at its start to `seen`, and answers with `ms` of silence.
fn counting_synthesizer(dir: &Path, ms: usize) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(
        dir.join("out.wav"),
        voxgate_audio::wav::wav_bytes_i16(16_000, 1, &vec![0; ms * 16]).unwrap(),
    )
    .unwrap();
    let d = dir.display();
    let path = dir.join("tts.sh");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\ncat > /dev/null\ntouch {d}/run.$$\nls {d} | grep -c '^run' >> {d}/seen\n\
             sleep 0.05\nrm -f {d}/run.$$\ncat {d}/out.wav\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn seen(dir: &Path) -> Vec<usize> {
    std::fs::read_to_string(dir.join("seen"))
        .unwrap_or_default()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect()
}

/// One long `DirectSpeech` on an anonymous session used to start a synthesizer per sentence
/// at once (about 1,200 processes for 60 KB). Now the reply is synthesized a few sentences
/// ahead of playback, whatever its length, and the server stays responsive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_direct_speech_runs_a_few_synthesizers_at_a_time() {
    let dir = scratch("direct");
    let program = counting_synthesizer(&dir, 200);
    let server = Running::start(Config {
        tts: Some(TtsConfig {
            provider: Some("command".into()),
            command: Some(program.display().to_string()),
            ..TtsConfig::default()
        }),
        ..Config::default()
    })
    .await;
    let mut ws = connect(server.addr, "/realtime").await;
    let mut config = SessionConfig::new(AudioFormat::SPEECH_16K, AudioFormat::SPEECH_16K);
    config.tts = Some(TtsSettings::Hosted(HostedTtsSettings {
        voice: HostedVoice::Ref {
            voice_id: "default".into(),
        },
        mode: voxgate_realtime::proto::HostedTtsMode::LowLatency,
    }));
    rt_send(&mut ws, &ServiceBoundMessage::initialize(&config).unwrap()).await;
    assert!(matches!(rt_recv(&mut ws).await, Payload::SessionReady(_)));
    // About 60 KB (the most one message may carry is 64 KiB): 3,900 sentences.
    let text: String = (1..=3_900).map(|i| format!("Line {i:04} here. ")).collect();
    assert!(text.len() > 60_000);
    rt_send(
        &mut ws,
        &ServiceBoundMessage::direct_speech(text, true, false),
    )
    .await;
    // Two seconds of it: ten 200 ms sentences play; the health check answers at once.
    let start = Instant::now();
    let mut audio = 0;
    let mut slowest = Duration::ZERO;
    while start.elapsed() < Duration::from_secs(2) {
        let asked = Instant::now();
        let h = http(server.addr, "GET", "/health", &[], b"").await;
        assert_eq!(h.status, 200);
        slowest = slowest.max(asked.elapsed());
        if let Ok(Some(Ok(tokio_tungstenite::tungstenite::Message::Binary(_)))) =
            tokio::time::timeout(
                Duration::from_millis(100),
                futures::StreamExt::next(&mut ws),
            )
            .await
        {
            audio += 1;
        }
    }
    let runs = seen(&dir);
    assert!(audio > 0, "the reply is spoken");
    assert!(
        runs.iter().all(|n| *n <= 3),
        "at most the sentence playing and two ahead: {runs:?}"
    );
    // Paced by playback: two seconds of 200 ms sentences, not the whole reply.
    assert!(runs.len() <= 20, "{} runs in 2 s", runs.len());
    assert!(slowest < Duration::from_secs(1), "/health took {slowest:?}");
    server.stop_within(Duration::from_secs(15)).await;
}

/// The outside probe's flood: 16 devices × 64 event names with 60 KB of `data` each grew the
/// server by 718 MiB for good. Such events are refused with 413 now, and what the bus keeps
/// of events it takes stays within its byte budget, whatever is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn perception_events_keep_a_bounded_number_of_bytes() {
    let server = Running::start(Config::default()).await;
    let big = "x".repeat(60_000);
    let r = support::post_json(
        server.addr,
        "/api/perception/event",
        &serde_json::json!({"name": "n", "device_id": "d", "data": {"v": big}}),
    )
    .await;
    assert_eq!(r.status, 413, "{}", r.body);
    assert!(r.body.contains("4096"), "{}", r.body);
    // At the limit: accepted, and 16 devices × 64 names of it are kept within the budget.
    let fits = "y".repeat(4_000);
    for d in 0..16 {
        for n in 0..64 {
            let r = support::post_json(
                server.addr,
                "/api/perception/event",
                &serde_json::json!({"name": format!("n{n}"), "device_id": format!("d{d}"),
                    "data": {"v": fits}}),
            )
            .await;
            assert_eq!(r.status, 200, "{}", r.body);
        }
    }
    let state = http(server.addr, "GET", "/admin/perception", &[], b"").await;
    assert_eq!(state.status, 200);
    let devices = state.json()["devices"].as_array().unwrap().clone();
    assert_eq!(devices.len(), 16);
    for d in &devices {
        let kept: usize = d["latest"]
            .as_object()
            .unwrap()
            .values()
            .map(|l| l["data"].to_string().len())
            .sum();
        // A device's newest names, within 32 KiB; the rest forgotten.
        assert!(kept <= 32 * 1024, "{kept}");
        assert_eq!(d["events"], 64);
    }
    server.stop_within(Duration::from_secs(15)).await;
}

// ---- WebRTC -----------------------------------------------------------------------------------

/// A Chrome (libwebrtc) audio-only offer.
const CHROME_OFFER: &str = include_str!("fixtures/chrome_audio_offer.sdp");

/// A Gemini bridge session on the main listener, set up (`GEMINI_CONNECTED`, `SETUP_COMPLETE`).
async fn gemini_session(addr: std::net::SocketAddr) -> support::Ws {
    let mut ws = connect(addr, "/gemini").await;
    support::send_json(
        &mut ws,
        &serde_json::json!({"type": "CONNECT_GEMINI", "payload": {"initialConfig":
            {"model": "m", "generationConfig": {"responseModalities": ["AUDIO"]}}}}),
    )
    .await;
    for expected in ["GEMINI_CONNECTED", "SETUP_COMPLETE"] {
        let m = gemini_recv(&mut ws).await;
        assert_eq!(m["type"], expected, "{m}");
    }
    ws
}

async fn gemini_recv(ws: &mut support::Ws) -> serde_json::Value {
    match support::next_message(ws, Duration::from_secs(10)).await {
        Some(tokio_tungstenite::tungstenite::Message::Text(t)) => {
            serde_json::from_str(t.as_str()).unwrap()
        }
        other => panic!("expected a bridge message, got {other:?}"),
    }
}

/// The outside probe: one 8 KB offer naming 100 addresses made the server send 297 STUN
/// packets to them. The server is ICE-lite now: it answers checks and sends none, so what an
/// offer or a trickle names receives nothing from it. Counted on real sockets the offer names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webrtc_sends_nothing_to_the_addresses_an_offer_names() {
    let server = Running::start(Config::default()).await;
    let mut targets = Vec::new();
    for _ in 0..20 {
        targets.push(tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap());
    }
    let ports: Vec<u16> = targets
        .iter()
        .map(|s| s.local_addr().unwrap().port())
        .collect();
    let mut offer = CHROME_OFFER.replace("\r\n", "\n");
    for (i, port) in ports[..10].iter().enumerate() {
        offer.push_str(&format!(
            "a=candidate:{i} 1 udp 2130706431 127.0.0.1 {port} typ host\n"
        ));
    }
    let offer = offer.replace('\n', "\r\n");
    let mut ws = gemini_session(server.addr).await;
    support::send_json(
        &mut ws,
        &serde_json::json!({"type": "WEBRTC_OFFER", "payload": {"sdp": offer}}),
    )
    .await;
    let answer = gemini_recv(&mut ws).await;
    assert_eq!(answer["type"], "WEBRTC_ANSWER", "{answer}");
    let sdp = answer["payload"]["sdp"].as_str().unwrap();
    assert!(sdp.contains("a=ice-lite"), "{sdp}");
    for (i, port) in ports[10..].iter().enumerate() {
        support::send_json(
            &mut ws,
            &serde_json::json!({"type": "WEBRTC_ICE_CANDIDATE", "payload": {
                "candidate": format!("candidate:{} 1 udp 2130706431 127.0.0.1 {port} typ host", i + 10),
                "sdpMid": "0", "sdpMLineIndex": 0}}),
        )
        .await;
    }
    // Full ICE sends its first checks within tens of milliseconds and retries for seconds.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut received = 0;
    let mut buf = [0u8; 2048];
    for s in &targets {
        while s.try_recv_from(&mut buf).is_ok() {
            received += 1;
        }
    }
    assert_eq!(received, 0, "datagrams sent to addresses the client named");
    server.stop_within(Duration::from_secs(15)).await;
}

/// A socket may trickle any number of candidates; a connection takes 32 and ignores the rest
/// (25,000 cost 6.9 s of CPU before the cap), and the session goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webrtc_takes_a_bounded_number_of_remote_candidates() {
    let server = Running::start(Config::default()).await;
    let mut ws = gemini_session(server.addr).await;
    support::send_json(
        &mut ws,
        &serde_json::json!({"type": "WEBRTC_OFFER", "payload": {"sdp": CHROME_OFFER}}),
    )
    .await;
    let answer = gemini_recv(&mut ws).await;
    assert_eq!(answer["type"], "WEBRTC_ANSWER", "{answer}");
    let candidate = |i: u32| {
        let (a, b) = (i / 250, i % 250);
        serde_json::json!({"type": "WEBRTC_ICE_CANDIDATE", "payload": {
            "candidate": format!("candidate:{i} 1 udp 2130706431 10.9.{a}.{b} 9 typ host"),
            "sdpMid": "0", "sdpMLineIndex": 0}})
    };
    let ignored = |s: &prometheus_parse::Scrape| {
        support::scalar(s, "voxgate_webrtc_candidates_ignored_total", &[])
    };
    // Forty at a pace the connection keeps up with: it takes 32.
    for i in 0..40 {
        support::send_json(&mut ws, &candidate(i)).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let scrape = support::scrape_until(&server, "8 ignored", |s| ignored(s) >= 8.0).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(ignored(&support::scrape(&server).await.1), 8.0);
    drop(scrape);
    // A flood: each is ignored at once (or dropped when the connection's queue is full).
    for i in 40..5_000 {
        support::send_json(&mut ws, &candidate(i)).await;
    }
    support::scrape_until(&server, "the flood ignored", |s| ignored(s) > 8.0).await;
    // The session still answers.
    support::send_json(
        &mut ws,
        &serde_json::json!({"type": "SEND_MESSAGE", "payload": {"parts": [{"text": "hi"}]}}),
    )
    .await;
    loop {
        let m = gemini_recv(&mut ws).await;
        if m["type"] == "TURN_COMPLETE" {
            break;
        }
    }
    server.stop_within(Duration::from_secs(15)).await;
}

/// An SDP parse error used to echo the parser's state, a heap address among it, to the
/// client (`Parse error at PointerOffset(0x7f…)`): the answer is a fixed message now.
#[tokio::test]
async fn an_sdp_parse_error_says_nothing_of_the_server() {
    let server = Running::start(Config::default()).await;
    // Audio and Opus named (past the quick checks), then not SDP.
    let bad = "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=rtpmap:111 opus/48000/2\r\n\x01garbage";
    let r = http(
        server.addr,
        "POST",
        "/webrtc/offer",
        &[("Content-Type", "application/sdp")],
        bad.as_bytes(),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("the offer is not valid SDP"), "{}", r.body);
    assert!(
        !r.body.contains("0x") && !r.body.contains("Pointer"),
        "{}",
        r.body
    );
    let mut ws = gemini_session(server.addr).await;
    support::send_json(
        &mut ws,
        &serde_json::json!({"type": "WEBRTC_OFFER", "payload": {"sdp": bad}}),
    )
    .await;
    let e = gemini_recv(&mut ws).await;
    let message = e["payload"]["message"].as_str().unwrap();
    assert_eq!(
        message, "WebRTC offer refused: bad offer: the offer is not valid SDP",
        "{e}"
    );
    server.stop_within(Duration::from_secs(15)).await;
}
