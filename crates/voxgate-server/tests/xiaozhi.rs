//! The Xiaozhi door end to end: a real server on 127.0.0.1:0, a tokio-tungstenite client playing
//! the device (JSON control frames, Opus in v1/v2/v3 framing), the demo agent, the tone
//! synthesizer, and a fake OpenAI `/audio/transcriptions` endpoint for audio turns.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use support::{
    Running, WAIT, Ws, next_message, opus_packets, opus_packets_of, send_json, try_connect,
};
use tokio_tungstenite::tungstenite::Message;
use voxgate_audio::opus::{FrameDuration, OpusBackend, OpusDecoder};
use voxgate_providers::{DemoAgent, NoAsr, ToneTts};
use voxgate_server::metrics::Door;
use voxgate_server::{Config, Providers};
use voxgate_xiaozhi::frame::{Frame, FrameCodec, ProtocolVersion};
use voxgate_xiaozhi::token::{self, TokenSecret};

const DEVICE: &str = "aa:bb:cc:dd:ee:ff";
const CLIENT: &str = "3b5c1f2e-0000-4000-8000-000000000001";

fn providers() -> Providers {
    Providers {
        llm: Arc::new(DemoAgent::new()),
        asr: Arc::new(NoAsr),
        tts: Arc::new(ToneTts),
    }
}

async fn device_connect(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<Ws, tokio_tungstenite::tungstenite::Error> {
    try_connect(&format!("ws://{addr}{path}"), headers, WAIT).await
}

/// What the device receives.
#[derive(Debug, Clone)]
enum Ev {
    Json(Value),
    /// An Opus payload, unframed.
    Audio(Vec<u8>),
}

impl Ev {
    fn json(&self) -> Option<&Value> {
        match self {
            Ev::Json(v) => Some(v),
            Ev::Audio(_) => None,
        }
    }

    /// `tts start`, `tts stop`, `stt`... for order checks; audio is `audio`.
    fn label(&self) -> String {
        match self {
            Ev::Audio(_) => "audio".into(),
            Ev::Json(v) => match (v["type"].as_str(), v["state"].as_str()) {
                (Some(t), Some(s)) => format!("{t} {s}"),
                (Some(t), None) => t.to_owned(),
                _ => "?".into(),
            },
        }
    }
}

struct Device {
    ws: Ws,
    codec: FrameCodec,
}

impl Device {
    async fn connect(addr: SocketAddr, version: ProtocolVersion) -> Self {
        let v = version.number().to_string();
        let ws = device_connect(
            addr,
            "/xiaozhi/v1/",
            &[
                ("Protocol-Version", v.as_str()),
                ("Device-Id", DEVICE),
                ("Client-Id", CLIENT),
            ],
        )
        .await
        .unwrap();
        Self {
            ws,
            codec: FrameCodec::new(version),
        }
    }

    async fn send(&mut self, v: Value) {
        send_json(&mut self.ws, &v).await;
    }

    async fn send_raw(&mut self, m: Message) {
        self.ws.send(m).await.unwrap();
    }

    async fn send_opus(&mut self, packet: &[u8]) {
        let mut out = Vec::new();
        self.codec.encode(&Frame::opus(packet), &mut out).unwrap();
        self.ws.send(Message::Binary(out.into())).await.unwrap();
    }

    /// The next event; `None` when the server closed.
    async fn next(&mut self) -> Option<Ev> {
        let ev = self.next_inner().await;
        if std::env::var("XZ_DEBUG").is_ok() {
            eprintln!("{:?} {:?}", Instant::now(), ev.as_ref().map(Ev::label));
        }
        ev
    }

    async fn next_inner(&mut self) -> Option<Ev> {
        match next_message(&mut self.ws, WAIT).await? {
            Message::Text(t) => Some(Ev::Json(serde_json::from_str(&t).unwrap())),
            Message::Binary(b) => {
                let frame = self.codec.decode(&b).expect("a well-framed downlink frame");
                assert!(frame.frame_type.is_opus());
                Some(Ev::Audio(frame.payload.to_vec()))
            }
            other => unreachable!("not a data message: {other:?}"),
        }
    }

    /// Events up to and including the first JSON message matching `pred`.
    async fn until(&mut self, pred: impl Fn(&Value) -> bool) -> Vec<Ev> {
        let mut seen = Vec::new();
        loop {
            let ev = self.next().await.expect("server still open");
            let done = ev.json().is_some_and(&pred);
            seen.push(ev);
            if done {
                return seen;
            }
        }
    }

    async fn until_tts_stop(&mut self) -> Vec<Ev> {
        self.until(|v| v["type"] == "tts" && v["state"] == "stop")
            .await
    }

    async fn hello(&mut self, version: ProtocolVersion, mcp: bool) -> Value {
        self.send(json!({
            "type": "hello", "version": version.number(),
            "features": {"aec": true, "mcp": mcp},
            "transport": "websocket",
            "audio_params": {"format": "opus", "sample_rate": 16000, "channels": 1, "frame_duration": 60}
        }))
        .await;
        let ev = self.next().await.expect("server hello");
        ev.json().cloned().expect("a JSON hello")
    }

    async fn detect(&mut self, text: &str) {
        self.send(json!({"session_id": "s", "type": "listen", "state": "detect", "text": text}))
            .await;
    }

    async fn listen_start(&mut self, mode: &str) {
        self.send(json!({"session_id": "s", "type": "listen", "state": "start", "mode": mode}))
            .await;
    }
}

fn labels(evs: &[Ev]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for e in evs {
        let l = e.label();
        // Collapse runs of audio frames.
        if l == "audio" && out.last().is_some_and(|p| p == "audio") {
            continue;
        }
        out.push(l);
    }
    out
}

fn sentences(evs: &[Ev]) -> Vec<String> {
    evs.iter()
        .filter_map(Ev::json)
        .filter(|v| v["type"] == "tts" && v["state"] == "sentence_start")
        .map(|v| v["text"].as_str().unwrap().to_owned())
        .collect()
}

fn audio_frames(evs: &[Ev]) -> Vec<Vec<u8>> {
    evs.iter()
        .filter_map(|e| match e {
            Ev::Audio(a) => Some(a.clone()),
            Ev::Json(_) => None,
        })
        .collect()
}

/// Decodes every frame at 24 kHz: each must be one 60 ms packet.
fn decode_all(frames: &[Vec<u8>]) -> usize {
    let mut dec = OpusDecoder::new(24_000, OpusBackend::Pure).unwrap();
    let mut total = 0;
    for f in frames {
        let pcm = dec.decode(f).expect("a decodable Opus packet");
        assert_eq!(pcm.len(), 1440, "a 60 ms frame at 24 kHz");
        total += pcm.len();
    }
    total
}

/// A speech recording from the audio crate's fixtures, 16 kHz mono.
fn speech() -> Vec<i16> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../voxgate-audio/tests/fixtures/speech.wav"
    );
    let wav = voxgate_audio::wav::read_wav(&std::fs::read(path).unwrap()).unwrap();
    assert_eq!(wav.sample_rate, 16_000);
    wav.to_mono_i16()
}

/// A fake OpenAI transcription endpoint answering `text`; records the uploaded body sizes.
async fn fake_asr(text: &'static str) -> (String, Arc<Mutex<Vec<usize>>>) {
    let seen: Arc<Mutex<Vec<usize>>> = Arc::default();
    let s2 = Arc::clone(&seen);
    let router = axum::Router::new().route(
        "/v1/audio/transcriptions",
        axum::routing::post(move |body: axum::body::Bytes| {
            let seen = Arc::clone(&s2);
            async move {
                // A multipart upload that carries a WAV file.
                assert!(body.windows(4).any(|w| w == b"RIFF"));
                seen.lock().unwrap().push(body.len());
                (
                    [("content-type", "application/json")],
                    json!({"text": text}).to_string(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    });
    (format!("http://{addr}/v1"), seen)
}

/// A raw HTTP exchange (status, body), so the Host header is exactly what the test says.
async fn http(addr: SocketAddr, request: String) -> (u16, String) {
    let r = support::exchange(addr, request.as_bytes(), b"").await;
    (r.status, r.body)
}

fn ota_request(host: &str, path: &str, headers: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\n{headers}Content-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

const OTA_BODY: &str = r#"{"version": 2, "language": "zh-CN", "flash_size": 16777216,
  "minimum_free_heap_size": "8318916", "mac_address": "aa:bb:cc:dd:ee:ff",
  "uuid": "3b5c1f2e-0000-4000-8000-000000000001", "chip_model_name": "esp32s3",
  "application": {"name": "xiaozhi", "version": "1.6.2", "idf_version": "v5.3.2"},
  "board": {"type": "bread-compact-wifi", "ssid": "lab", "rssi": -58, "ip": "192.168.1.20"}}"#;

// ---- tests -------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_and_text_turn_in_every_framing() {
    let server = Running::start_with(Config::default(), providers()).await;
    for version in ProtocolVersion::ALL {
        let mut dev = Device::connect(server.addr, version).await;
        let hello = dev.hello(version, false).await;
        assert_eq!(hello["type"], "hello");
        assert_eq!(hello["transport"], "websocket");
        assert_eq!(hello["session_id"].as_str().unwrap().len(), 36);
        assert_eq!(
            hello["audio_params"],
            json!({"format":"opus","sample_rate":24000,"channels":1,"frame_duration":60})
        );
        dev.detect("hello there").await;
        let t0 = Instant::now();
        let evs = dev.until_tts_stop().await;
        let elapsed = t0.elapsed();
        assert_eq!(
            labels(&evs),
            [
                "stt",
                "tts start",
                "llm",
                "tts sentence_start",
                "audio",
                "tts stop"
            ],
            "version {version:?}"
        );
        assert_eq!(evs[0].json().unwrap()["text"], "hello there");
        assert_eq!(
            evs[2].json().unwrap(),
            &json!({"type":"llm","session_id":hello["session_id"],"text":"🙂","emotion":"happy"})
        );
        assert_eq!(sentences(&evs), ["You said: hello there"]);
        let frames = audio_frames(&evs);
        // Four tone words of 220 ms each: 880 ms, 15 frames of 60 ms.
        assert_eq!(frames.len(), 15);
        decode_all(&frames);
        // Paced: 5 frames at once, then one per 60 ms, and `tts stop` after playback.
        assert!(elapsed >= Duration::from_millis(800), "{elapsed:?}");
    }
    server.sessions_drain(Door::Xiaozhi).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headerless_client_framing_from_hello_and_own_listener_any_path() {
    let mut config = Config::default();
    config.xiaozhi.listen = Some("127.0.0.1:0".parse().unwrap());
    let server = Running::start_with(config, providers()).await;
    let ws_addr = server.listener("xiaozhi").expect("own listener");
    // A browser-style client: no headers, ids in the query, version only in the hello.
    let ws = device_connect(
        ws_addr,
        "/any/path?device-id=aa%3Abb%3Acc%3Add%3Aee%3Aff&client-id=web",
        &[],
    )
    .await
    .unwrap();
    let mut dev = Device {
        ws,
        codec: FrameCodec::new(ProtocolVersion::V3),
    };
    let hello = dev.hello(ProtocolVersion::V3, false).await;
    assert_eq!(hello["type"], "hello");
    dev.detect("one two").await;
    let evs = dev.until_tts_stop().await;
    decode_all(&audio_frames(&evs));
    assert_eq!(sentences(&evs), ["You said: one two"]);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ota_reply_shape_host_url_and_token() {
    let mut config = Config::default();
    config.xiaozhi.token_secret = "ota secret".into();
    config.xiaozhi.protocol_version = 3;
    config.xiaozhi.timezone_offset_minutes = 480;
    config.xiaozhi.ota_listen = Some("127.0.0.1:0".parse().unwrap());
    let server = Running::start_with(config, providers()).await;
    let headers = format!("Device-Id: AA:BB:CC:DD:EE:FF\r\nClient-Id: {CLIENT}\r\n");
    let (status, body) = http(
        server.addr,
        ota_request("192.168.1.2:8080", "/xiaozhi/ota/", &headers, OTA_BODY),
    )
    .await;
    assert_eq!(status, 200);
    let mut v: Value = serde_json::from_str(&body).unwrap();
    assert!(v.get("mqtt").is_none());
    let tok = v["websocket"]["token"].as_str().unwrap().to_owned();
    let secret = TokenSecret::new("ota secret").unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    token::verify(&secret, &tok, CLIENT, DEVICE, now).expect("a valid token for the device");
    let ts = v["server_time"]["timestamp"].as_u64().unwrap();
    assert!(ts.abs_diff(now * 1000) < 60_000);
    v["websocket"]["token"] = json!("[token]");
    v["server_time"]["timestamp"] = json!("[ms]");
    insta::assert_json_snapshot!("ota_reply", v);

    // Configured URL wins over the Host header.
    let (status, body) = http(
        server.listener("xiaozhi-ota").unwrap(),
        ota_request("example.org", "/any/path/", &headers, "{broken json"),
    )
    .await;
    assert_eq!(
        status, 200,
        "a body the server cannot read still gets its URL"
    );
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["websocket"]["url"], "ws://example.org/xiaozhi/v1/");
    assert!(v.get("firmware").is_none());

    let (status, body) = http(
        server.addr,
        "GET /xiaozhi/ota/ HTTP/1.1\r\nHost: 10.0.0.9:8080\r\nConnection: close\r\n\r\n".into(),
    )
    .await;
    assert_eq!(status, 200);
    assert!(body.contains("ws://10.0.0.9:8080/xiaozhi/v1/"), "{body}");

    let (status, body) = http(server.addr, ota_request("h", "/xiaozhi/ota/", "", "{}")).await;
    assert_eq!(status, 400);
    assert!(body.contains("Device-Id"));
    server.stop().await;

    let mut config = Config::default();
    config.xiaozhi.websocket_url = "wss://voice.example.org/xiaozhi/v1/".into();
    let server = Running::start_with(config, providers()).await;
    let (_, body) = http(
        server.addr,
        ota_request("192.168.1.2:8080", "/xiaozhi/ota/", &headers, OTA_BODY),
    )
    .await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["websocket"]["url"], "wss://voice.example.org/xiaozhi/v1/");
    assert_eq!(v["websocket"]["version"], 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_accepts_issued_tokens_and_rejects_the_rest() {
    // Activation, and the allowlist deciding only who OTA issues a token to, are tested in
    // tests/xiaozhi_auth.rs.
    let mut config = Config::default();
    config.xiaozhi.auth = true;
    config.xiaozhi.token_secret = "auth secret".into();
    config.xiaozhi.allowed_devices = vec![DEVICE.into(), "11:22:33:44:55:66".into()];
    let server = Running::start_with(config, providers()).await;
    let refused = |r: Result<Ws, tokio_tungstenite::tungstenite::Error>| match r {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => resp.status().as_u16(),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("upgrade accepted"),
    };
    let base = [("Device-Id", DEVICE), ("Client-Id", CLIENT)];
    assert_eq!(
        refused(device_connect(server.addr, "/xiaozhi/v1/", &base).await),
        401
    );
    let bad = [
        ("Authorization", "Bearer not-a-token.1700000000"),
        ("Device-Id", DEVICE),
        ("Client-Id", CLIENT),
    ];
    assert_eq!(
        refused(device_connect(server.addr, "/xiaozhi/v1/", &bad).await),
        401
    );
    assert_eq!(
        refused(
            device_connect(
                server.addr,
                "/xiaozhi/v1/",
                &[
                    ("Protocol-Version", "9"),
                    ("Device-Id", "11:22:33:44:55:66")
                ]
            )
            .await
        ),
        400
    );

    // The token OTA issues opens the door, as a header and as a query parameter.
    let headers = format!("Device-Id: {DEVICE}\r\nClient-Id: {CLIENT}\r\n");
    let (_, body) = http(
        server.addr,
        ota_request("h:1", "/xiaozhi/ota/", &headers, OTA_BODY),
    )
    .await;
    let v: Value = serde_json::from_str(&body).unwrap();
    let tok = v["websocket"]["token"].as_str().unwrap().to_owned();
    let bearer = format!("Bearer {tok}");
    let ok = [
        ("Authorization", bearer.as_str()),
        ("Device-Id", DEVICE),
        ("Client-Id", CLIENT),
    ];
    let ws = device_connect(server.addr, "/xiaozhi/v1/", &ok)
        .await
        .unwrap();
    let mut dev = Device {
        ws,
        codec: FrameCodec::new(ProtocolVersion::V1),
    };
    assert_eq!(dev.hello(ProtocolVersion::V1, false).await["type"], "hello");
    // Bound to the device: another device id with the same token is refused.
    let other = [
        ("Authorization", bearer.as_str()),
        ("Device-Id", "aa:aa:aa:aa:aa:aa"),
        ("Client-Id", CLIENT),
    ];
    assert_eq!(
        refused(device_connect(server.addr, "/xiaozhi/v1/", &other).await),
        401
    );
    let query = format!(
        "/xiaozhi/v1/?device-id={}&client-id={CLIENT}&authorization=Bearer%20{tok}",
        DEVICE.replace(':', "%3A")
    );
    device_connect(server.addr, &query, &[]).await.unwrap();
    // Being on the allowlist is no way in without the token.
    let listed = [("Device-Id", "11:22:33:44:55:66"), ("Client-Id", CLIENT)];
    assert_eq!(
        refused(device_connect(server.addr, "/xiaozhi/v1/", &listed).await),
        401
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audio_turn_from_a_wav_with_a_recognizer() {
    let (base_url, uploads) = fake_asr("turn on the light").await;
    // The fixture pauses 416 ms mid-utterance, longer than the default endpointing waits (a
    // turn ends after 300 ms of silence): this test is about one turn through a recognizer.
    let mut config = Config::from_toml("[xiaozhi.engine]\nendpoint_delay_ms = 600\n").unwrap();
    config.asr = Some(voxgate_server::config::AsrConfig {
        base_url: Some(base_url),
        model: Some("whisper-1".into()),
        ..voxgate_server::config::AsrConfig::default()
    });
    let mut p = Providers::from_config(&config).unwrap();
    p.tts = Arc::new(ToneTts);
    let server = Running::start_with(config, p).await;
    let mut dev = Device::connect(server.addr, ProtocolVersion::V2).await;
    dev.hello(ProtocolVersion::V2, false).await;
    dev.listen_start("auto").await;
    // Real-time-ish: 60 ms packets every 20 ms (the VAD counts samples, not wall time).
    for p in opus_packets(&speech(), 1200) {
        dev.send_opus(&p).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let evs = dev.until_tts_stop().await;
    let l = labels(&evs);
    assert_eq!(
        l,
        [
            "stt",
            "tts start",
            "llm",
            "tts sentence_start",
            "audio",
            "tts stop"
        ]
    );
    // The VAD may cut the recording at its pauses: one upload per part, one user turn.
    let uploads = uploads.lock().unwrap().clone();
    assert!(!uploads.is_empty());
    let heard = vec!["turn on the light"; uploads.len()].join(" ");
    assert_eq!(evs[0].json().unwrap()["text"], heard.as_str());
    assert_eq!(sentences(&evs), [format!("You said: {heard}")]);
    decode_all(&audio_frames(&evs));
    // About 3.6 s of speech as 16-bit 16 kHz WAV went to the recognizer.
    assert!(uploads.iter().sum::<usize>() > 100_000, "{uploads:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audio_turns_without_a_recognizer_skip_stt_and_say_so() {
    let server = Running::start_with(Config::default(), providers()).await;
    let mut dev = Device::connect(server.addr, ProtocolVersion::V1).await;
    dev.hello(ProtocolVersion::V1, false).await;
    // Two turns: the door builds its uplink decoder and reply encoder per stretch of use (they
    // are dropped while not needed), so the second turn runs on fresh ones.
    let mut frames = Vec::new();
    for _ in 0..2 {
        dev.listen_start("auto").await;
        for p in opus_packets(&speech(), 1200) {
            dev.send_opus(&p).await;
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
        let evs = dev.until_tts_stop().await;
        assert_eq!(labels(&evs)[0], "tts start", "no stt without a recognizer");
        let said = sentences(&evs).join(" ");
        assert!(
            said.contains("no speech recognizer is configured"),
            "{said}"
        );
        let audio = audio_frames(&evs);
        assert!(!audio.is_empty());
        frames.extend(audio);
    }
    // Both replies play as one stream on the device's single decoder.
    decode_all(&frames);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_listen_stop_ends_the_utterance() {
    let server = Running::start_with(Config::default(), providers()).await;
    let mut dev = Device::connect(server.addr, ProtocolVersion::V1).await;
    dev.hello(ProtocolVersion::V1, false).await;
    dev.listen_start("manual").await;
    // Speech only, no trailing silence: the device stops streaming at `listen stop`. 20 ms
    // packets, as one desktop client sends.
    let pcm = speech();
    // At real time, as a device streams (a backlog of queued audio under CPU load can let a
    // transcript arrive after the turn ended, which the engine counts as a barge-in).
    for p in opus_packets_of(&pcm[..60_000], 0, FrameDuration::Ms20) {
        dev.send_opus(&p).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    dev.send(json!({"session_id":"s","type":"listen","state":"stop"}))
        .await;
    let evs = dev.until_tts_stop().await;
    assert_eq!(labels(&evs)[0], "tts start", "no stt without a recognizer");
    // One NoAsr marker per VAD segment reaches the model; the demo agent explains either way.
    let said = sentences(&evs).join(" ");
    assert!(
        said.contains("no speech recognizer is configured"),
        "{said:?} in {:?}",
        labels(&evs)
    );
    server.stop().await;
}

const LONG: &str = "please read this long sentence back to me slowly so that the reply \
    takes many seconds of audio to play on the little speaker of the device";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_mid_reply_stops_audio_at_once() {
    let server = Running::start_with(Config::default(), providers()).await;
    let mut dev = Device::connect(server.addr, ProtocolVersion::V3).await;
    dev.hello(ProtocolVersion::V3, false).await;
    let long = format!("{LONG} {LONG}");
    dev.detect(&long).await;
    // Wait for some audio, then press the button.
    let mut frames = 0;
    while frames < 8 {
        if matches!(dev.next().await.unwrap(), Ev::Audio(_)) {
            frames += 1;
        }
    }
    let t0 = Instant::now();
    dev.send(json!({"session_id":"s","type":"abort"})).await;
    let evs = dev.until_tts_stop().await;
    assert!(t0.elapsed() < Duration::from_secs(2), "tts stop at once");
    // Frames released before the abort arrived may still be in flight (more under CPU load,
    // when the pacer catches up); the reply, about 14 s long, is cut far before its end.
    let total = frames + audio_frames(&evs).len();
    assert!(total < 120, "{total} frames of about 230");
    let quiet = tokio::time::timeout(Duration::from_millis(600), dev.ws.next()).await;
    assert!(quiet.is_err(), "no frame after tts stop: {quiet:?}");
    // An abort while idle is still answered.
    dev.send(json!({"type":"abort","reason":"wake_word_detected"}))
        .await;
    let evs = dev.until_tts_stop().await;
    assert_eq!(labels(&evs), ["tts stop"]);
    // And the session goes on.
    dev.detect("still there").await;
    let evs = dev.until_tts_stop().await;
    assert_eq!(sentences(&evs), ["You said: still there"]);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn barge_in_in_realtime_mode() {
    let server = Running::start_with(Config::default(), providers()).await;
    let mut dev = Device::connect(server.addr, ProtocolVersion::V1).await;
    dev.hello(ProtocolVersion::V1, false).await;
    dev.listen_start("realtime").await;
    dev.detect(LONG).await;
    let mut frames = 0;
    while frames < 6 {
        if matches!(dev.next().await.unwrap(), Ev::Audio(_)) {
            frames += 1;
        }
    }
    // The user talks over the reply, streaming at real time from just before the speech.
    let pcm = speech();
    let packets = opus_packets(&pcm[11_520..], 1200);
    let t0 = Instant::now();
    let (mut sink, mut stream) = dev.ws.split();
    let sender = tokio::spawn(async move {
        for p in packets {
            sink.send(Message::Binary(p.into())).await.unwrap();
            tokio::time::sleep(Duration::from_millis(60)).await;
        }
        sink
    });
    let mut stopped_after = None;
    let mut next_reply = false;
    while let Ok(Some(Ok(m))) = tokio::time::timeout(WAIT, stream.next()).await {
        if let Message::Text(t) = m {
            let v: Value = serde_json::from_str(&t).unwrap();
            if v["type"] == "tts" && v["state"] == "stop" && stopped_after.is_none() {
                stopped_after = Some(t0.elapsed());
            }
            if stopped_after.is_some() && v["type"] == "tts" && v["state"] == "sentence_start" {
                // The interruption became the next user turn (no recognizer: NoAsr's reply).
                assert!(v["text"].as_str().unwrap().contains("speech"), "{v}");
                next_reply = true;
                break;
            }
        }
    }
    let stopped_after = stopped_after.expect("the reply was cut off by tts stop");
    // The reply alone would last over 6 s; the cut comes soon after the speech starts.
    assert!(stopped_after < Duration::from_secs(2), "{stopped_after:?}");
    assert!(next_reply);
    sender.abort();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_tools_over_mcp_reach_the_model_and_back() {
    let server = Running::start_with(Config::default(), providers()).await;
    let mut dev = Device::connect(server.addr, ProtocolVersion::V1).await;
    dev.hello(ProtocolVersion::V1, true).await;
    let mcp = |v: &Value| v["type"] == "mcp";
    let init = dev.until(mcp).await.pop().unwrap();
    let init = init.json().unwrap()["payload"].clone();
    assert_eq!(init["method"], "initialize");
    assert!(init["id"].is_u64(), "numeric ids: {init}");
    let vision = &init["params"]["capabilities"]["vision"];
    assert!(
        vision["url"]
            .as_str()
            .unwrap()
            .ends_with("/xiaozhi/vision/explain"),
        "{init}"
    );
    assert!(!vision["token"].as_str().unwrap().is_empty());
    dev.send(
        json!({"session_id":"s","type":"mcp","payload":{"jsonrpc":"2.0","id":init["id"],
        "result":{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},
        "serverInfo":{"name":"bread-compact-wifi","version":"1.6.2"}}}}),
    )
    .await;
    let mut pages = 0;
    let call = loop {
        let ev = dev.until(mcp).await.pop().unwrap();
        let p = ev.json().unwrap()["payload"].clone();
        match p["method"].as_str() {
            Some("tools/list") => {
                pages += 1;
                let cursor = p["params"]["cursor"].as_str().unwrap_or("");
                let result = if cursor.is_empty() {
                    json!({"tools":[{"name":"self.get_device_status","description":"Status",
                        "inputSchema":{"type":"object","properties":{}}}],
                        "nextCursor":"self.audio_speaker.set_volume"})
                } else {
                    assert_eq!(cursor, "self.audio_speaker.set_volume");
                    json!({"tools":[{"name":"self.audio_speaker.set_volume",
                        "description":"Set the volume",
                        "inputSchema":{"type":"object","properties":{"volume":{"type":"integer",
                        "minimum":0,"maximum":100}},"required":["volume"]}},
                        {"name":"self.reboot","description":"Reboot",
                        "inputSchema":{"type":"object","properties":{}},
                        "annotations":{"audience":["user"]}}]})
                };
                dev.send(
                    json!({"type":"mcp","payload":{"jsonrpc":"2.0","id":p["id"],"result":result}}),
                )
                .await;
                if !cursor.is_empty() {
                    // All tools are in: ask the model to use one.
                    dev.detect(r#"call self_audio_speaker_set_volume {"volume": 50}"#)
                        .await;
                }
            }
            Some("tools/call") => break p,
            _ => {} // notifications/initialized
        }
    };
    assert_eq!(pages, 2);
    assert!(call["id"].is_u64());
    assert_eq!(call["params"]["name"], "self.audio_speaker.set_volume");
    assert_eq!(call["params"]["arguments"], json!({"volume": 50}));
    // Device errors come without `code`; answer success here.
    dev.send(
        json!({"type":"mcp","payload":{"jsonrpc":"2.0","id":call["id"],
        "result":{"content":[{"type":"text","text":"true"}],"isError":false}}}),
    )
    .await;
    // The demo agent says it is calling the tool, then reports the result.
    let evs = dev
        .until(|v| {
            v["state"] == "sentence_start" && v["text"].as_str().unwrap().contains("returned")
        })
        .await;
    let said = sentences(&evs).join(" ");
    assert!(
        said.starts_with("Calling self_audio_speaker_set_volume."),
        "{said}"
    );
    assert!(
        said.contains("self_audio_speaker_set_volume returned: true"),
        "{said}"
    );
    dev.until_tts_stop().await;

    // User-only tools are never offered to the model.
    dev.detect("call self_reboot {}").await;
    let evs = dev.until_tts_stop().await;
    assert!(evs.iter().filter_map(Ev::json).all(|v| v["type"] != "mcp"));
    let said = sentences(&evs).join(" ");
    assert!(!said.contains("returned"), "{said}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emotion_allowlist_maps_other_faces_to_the_default() {
    let mut config = Config::default();
    config.xiaozhi.emotions = vec!["😠".into(), "sad".into()];
    config.xiaozhi.default_emotion = "neutral".into();
    let server = Running::start_with(config, providers()).await;
    let mut dev = Device::connect(server.addr, ProtocolVersion::V1).await;
    dev.hello(ProtocolVersion::V1, false).await;
    dev.detect("how are you").await;
    let evs = dev.until_tts_stop().await;
    let llm: Vec<&Value> = evs
        .iter()
        .filter_map(Ev::json)
        .filter(|v| v["type"] == "llm")
        .collect();
    // The demo agent's 😊 is not allowed: the default face, once.
    assert_eq!(llm.len(), 1);
    assert_eq!(llm[0]["text"], "😶");
    assert_eq!(llm[0]["emotion"], "neutral");
    for s in sentences(&evs) {
        assert!(!s.contains('😊'), "{s}");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_frames_are_ignored_and_the_session_goes_on() {
    let config = Config {
        max_frame_bytes: 4096,
        ..Config::default()
    };
    let server = Running::start_with(config, providers()).await;
    let mut dev = Device::connect(server.addr, ProtocolVersion::V3).await;
    // Before the hello: audio, a listen, garbage.
    dev.send_opus(&[0xf8, 0xff, 0xfe]).await;
    dev.listen_start("auto").await;
    dev.send_raw(Message::Text("{not json".into())).await;
    let hello = dev.hello(ProtocolVersion::V3, false).await;
    assert_eq!(hello["type"], "hello");
    // After: malformed JSON, unknown types, legacy iot, a lying v3 header, an undecodable
    // packet, an oversized frame of each kind, a second hello.
    dev.send_raw(Message::Text("{\"type\": \"listen\", \"state\": ".into()))
        .await;
    dev.send(json!({"type":"frobnicate","x":1})).await;
    dev.send(json!({"type":"iot","descriptors":[]})).await;
    dev.send(json!({"type":"listen","state":"sideways"})).await;
    dev.send_raw(Message::Binary(vec![0, 0, 0x10, 0, 1, 2].into()))
        .await;
    dev.send_raw(Message::Binary(vec![0, 0, 0, 2].into())).await;
    dev.send_opus(&[0xff; 40]).await;
    dev.send_raw(Message::Binary(vec![0u8; 5000].into())).await;
    dev.send_raw(Message::Text("x".repeat(5000).into())).await;
    let again = dev.hello(ProtocolVersion::V3, false).await;
    assert_eq!(again["session_id"], hello["session_id"]);
    dev.detect("still fine").await;
    let evs = dev.until_tts_stop().await;
    assert_eq!(sentences(&evs), ["You said: still fine"]);
    let metrics = server.metrics.render();
    let errors: u64 = metrics
        .lines()
        .find(|l| l.starts_with("voxgate_errors_total{door=\"xiaozhi\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .unwrap()
        .parse()
        .unwrap();
    assert!(errors >= 8, "{errors}");
    // A frame over four times the limit closes the connection; the server stays up.
    dev.send_raw(Message::Binary(vec![0u8; 20_000].into()))
        .await;
    while dev.next().await.is_some() {}
    let mut other = Device::connect(server.addr, ProtocolVersion::V1).await;
    assert_eq!(
        other.hello(ProtocolVersion::V1, false).await["type"],
        "hello"
    );
    drop(other);
    server.sessions_drain(Door::Xiaozhi).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_hello_in_time_closes_and_sessions_return_to_zero() {
    let mut config = Config::default();
    config.xiaozhi.hello_timeout_ms = 300;
    let server = Running::start_with(config, providers()).await;
    let mut silent = Device::connect(server.addr, ProtocolVersion::V1).await;
    let t0 = Instant::now();
    assert!(silent.next().await.is_none(), "closed without a hello");
    assert!(t0.elapsed() < Duration::from_secs(3));

    // Several sessions, one dropped mid-reply without a close frame.
    let mut a = Device::connect(server.addr, ProtocolVersion::V2).await;
    let mut b = Device::connect(server.addr, ProtocolVersion::V3).await;
    a.hello(ProtocolVersion::V2, false).await;
    b.hello(ProtocolVersion::V3, false).await;
    // The silent one is gone once its close handshake is over.
    server.wait_sessions(Door::Xiaozhi, 2).await;
    a.detect(LONG).await;
    while !matches!(a.next().await.unwrap(), Ev::Audio(_)) {}
    drop(a);
    b.detect("bye").await;
    b.until_tts_stop().await;
    b.send(json!({"type":"goodbye"})).await;
    assert!(b.next().await.is_none(), "goodbye closes");
    server.sessions_drain(Door::Xiaozhi).await;
    let text = server.metrics.render();
    assert!(
        text.lines()
            .any(|l| l == "voxgate_sessions_active{door=\"xiaozhi\"} 0"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l == "voxgate_sessions_total{door=\"xiaozhi\"} 3"),
        "{text}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_device_is_closed_after_the_idle_timeout() {
    let mut config = Config::default();
    config.xiaozhi.idle_timeout_secs = 1;
    let server = Running::start_with(config, providers()).await;
    let mut dev = Device::connect(server.addr, ProtocolVersion::V1).await;
    dev.hello(ProtocolVersion::V1, false).await;
    let t0 = Instant::now();
    assert!(dev.next().await.is_none(), "closed when idle");
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(800) && waited < Duration::from_secs(4),
        "{waited:?}"
    );
    server.sessions_drain(Door::Xiaozhi).await;
    server.stop().await;
}

/// Reads until the server's close frame and returns its code; `None` when the connection
/// ended without one (a dropped TCP connection, 1006).
async fn close_code(ws: &mut Ws) -> Option<u16> {
    loop {
        match tokio::time::timeout(WAIT, ws.next())
            .await
            .expect("the server closes in time")
        {
            Some(Ok(Message::Close(frame))) => return frame.map(|f| u16::from(f.code)),
            Some(Ok(_)) => {}
            None | Some(Err(_)) => return None,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_hello_closes_with_a_close_frame_after_the_hello_timeout() {
    let mut config = Config::default();
    config.xiaozhi.hello_timeout_ms = 400;
    let server = Running::start_with(config, providers()).await;
    let mut silent = Device::connect(server.addr, ProtocolVersion::V1).await;
    let t0 = Instant::now();
    // Policy violation: no initialization in time.
    assert_eq!(close_code(&mut silent.ws).await, Some(1008));
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    // Frames that are not a hello do not count as one.
    let mut chatty = Device::connect(server.addr, ProtocolVersion::V1).await;
    chatty.listen_start("auto").await;
    chatty.send_opus(&[0xf8, 0xff, 0xfe]).await;
    assert_eq!(close_code(&mut chatty.ws).await, Some(1008));
    server.sessions_drain(Door::Xiaozhi).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goodbye_and_a_device_close_end_with_a_normal_close_frame() {
    let server = Running::start_with(Config::default(), providers()).await;
    // `goodbye` mid-session: the server closes with 1000.
    let mut dev = Device::connect(server.addr, ProtocolVersion::V2).await;
    dev.hello(ProtocolVersion::V2, false).await;
    dev.detect("hello").await;
    dev.until_tts_stop().await;
    dev.send(json!({"session_id":"s","type":"goodbye"})).await;
    assert_eq!(close_code(&mut dev.ws).await, Some(1000));

    // The device closes (mid-reply): the server answers its close frame with 1000.
    let mut dev = Device::connect(server.addr, ProtocolVersion::V1).await;
    dev.hello(ProtocolVersion::V1, false).await;
    dev.detect(LONG).await;
    while !matches!(dev.next().await.unwrap(), Ev::Audio(_)) {}
    dev.ws
        .send(Message::Close(Some(
            tokio_tungstenite::tungstenite::protocol::CloseFrame {
                code: 1000.into(),
                reason: "bye".into(),
            },
        )))
        .await
        .unwrap();
    assert_eq!(close_code(&mut dev.ws).await, Some(1000));
    server.sessions_drain(Door::Xiaozhi).await;
    assert_eq!(server.metrics.active_sessions(Door::Xiaozhi), 0);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_over_the_hard_limit_closes_with_1009() {
    let config = Config {
        max_frame_bytes: 4096,
        ..Config::default()
    };
    let server = Running::start_with(config, providers()).await;
    let mut dev = Device::connect(server.addr, ProtocolVersion::V1).await;
    dev.hello(ProtocolVersion::V1, false).await;
    // Over the limit: ignored. Over four times the limit: the connection cannot go on.
    dev.send_raw(Message::Binary(vec![0u8; 5000].into())).await;
    dev.send_raw(Message::Binary(vec![0u8; 20_000].into()))
        .await;
    assert_eq!(close_code(&mut dev.ws).await, Some(1009));
    server.sessions_drain(Door::Xiaozhi).await;
    server.stop().await;
}

#[tokio::test]
async fn device_events_reach_the_perception_bus() {
    let server = Running::start_with(Config::default(), providers()).await;
    let mut dev = Device::connect(server.addr, ProtocolVersion::V1).await;
    let hello = dev.hello(ProtocolVersion::V1, false).await;
    let sid = hello["session_id"].as_str().unwrap().to_owned();
    dev.send(json!({"type":"event","name":"face_detected","data":{"identity":"Ana"},"ts":1.5}))
        .await;
    // Malformed (no name): dropped, the session goes on.
    dev.send(json!({"type":"event","data":{}})).await;
    dev.send(json!({"type":"event","name":"state_changed","data":{"state":"listening"}}))
        .await;
    let path = format!("/admin/perception/{DEVICE}");
    let state = tokio::time::timeout(WAIT, async {
        loop {
            let r = support::http(server.addr, "GET", &path, &[], b"").await;
            if r.status == 200 && r.json()["events"] == 2 {
                return r.json();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("both events published");
    assert_eq!(state["face_present"], true);
    assert_eq!(state["identity"], "Ana");
    assert_eq!(state["state"], "listening");
    assert_eq!(state["session_id"], sid.as_str());
    assert_eq!(state["last_event"], "state_changed");
    dev.detect("still here").await;
    assert!(!dev.until_tts_stop().await.is_empty());
    server.stop().await;
}

#[tokio::test]
async fn the_first_turn_after_the_hello_sees_the_device_tools() {
    let server = Running::start_with(Config::default(), providers()).await;
    let mut dev = Device::connect(server.addr, ProtocolVersion::V1).await;
    dev.hello(ProtocolVersion::V1, true).await;
    // The text turn comes before the device has answered a single MCP message.
    dev.detect("call self_get_device_status {}").await;
    let mcp = |v: &Value| v["type"] == "mcp";
    let init = dev.until(mcp).await.pop().unwrap();
    let init = init.json().unwrap()["payload"].clone();
    assert_eq!(init["method"], "initialize");
    dev.send(
        json!({"type":"mcp","payload":{"jsonrpc":"2.0","id":init["id"],
        "result":{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},
        "serverInfo":{"name":"bread-compact-wifi","version":"1.6.2"}}}}),
    )
    .await;
    let call = loop {
        let ev = dev.until(mcp).await.pop().unwrap();
        let p = ev.json().unwrap()["payload"].clone();
        match p["method"].as_str() {
            Some("tools/list") => {
                dev.send(json!({"type":"mcp","payload":{"jsonrpc":"2.0","id":p["id"],
                    "result":{"tools":[{"name":"self.get_device_status","description":"Status",
                    "inputSchema":{"type":"object","properties":{}}}]}}}))
                    .await;
            }
            Some("tools/call") => break p,
            _ => {}
        }
    };
    assert_eq!(call["params"]["name"], "self.get_device_status");
    server.stop().await;
}

#[tokio::test]
async fn a_failing_model_shows_an_error_face_and_stops() {
    let server = Running::start_with(Config::default(), support::refusing_llm()).await;
    let mut dev = Device::connect(server.addr, ProtocolVersion::V1).await;
    dev.hello(ProtocolVersion::V1, false).await;
    dev.detect("hello").await;
    let evs = dev.until_tts_stop().await;
    let llm: Vec<&Value> = evs
        .iter()
        .filter_map(Ev::json)
        .filter(|v| v["type"] == "llm")
        .collect();
    assert!(
        llm.iter().all(|v| v["emotion"] != "happy"),
        "no happy face for a failure: {llm:?}"
    );
    assert!(
        llm.iter().any(|v| v["emotion"] == "confused"),
        "an error face: {evs:?}"
    );
    // The device can go on.
    dev.detect("again").await;
    dev.until_tts_stop().await;
    server.stop().await;
}

/// The server-added latency histogram: a spoken turn through delayed fake providers (LLM
/// first token 150 ms, TTS first byte 200 ms) is timed from its decision to its first reply
/// audio frame written, and the provider waits are not in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_added_latency_leaves_the_providers_out() {
    use voxgate_test_support::fake_providers::{FakeDelays, FakeProviders};
    let fakes = FakeProviders::start(FakeDelays {
        asr: Duration::ZERO,
        llm_first_token: Duration::from_millis(150),
        tts_first_byte: Duration::from_millis(200),
    })
    .await
    .unwrap();
    let base = fakes.base_url();
    let config = Config::from_toml(&format!(
        "[asr]\nbase_url = \"{base}\"\n[llm]\nbase_url = \"{base}\"\n[tts]\nbase_url = \"{base}\"\n"
    ))
    .unwrap();
    let server =
        Running::start_with(config.clone(), Providers::from_config(&config).unwrap()).await;
    let mut dev = Device::connect(server.addr, ProtocolVersion::V1).await;
    dev.hello(ProtocolVersion::V1, false).await;
    dev.listen_start("auto").await;
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../voxgate-audio/tests/fixtures/question.wav"
    );
    let question = voxgate_audio::wav::read_wav(&std::fs::read(path).unwrap())
        .unwrap()
        .to_mono_i16();
    for p in opus_packets(&question, 1200) {
        dev.send_opus(&p).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let evs = dev.until_tts_stop().await;
    assert_eq!(labels(&evs)[0], "stt");
    assert!(!audio_frames(&evs).is_empty());
    let text = server.metrics.render();
    let value = |name: &str, labels: &str| -> f64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{name}{{{labels}}} ")))
            .unwrap_or_else(|| panic!("{name} in {text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    // After the decision the turn waited for both providers (their own latency figures)...
    let llm = value(
        "voxgate_provider_latency_seconds_sum",
        "door=\"xiaozhi\",provider=\"llm\"",
    );
    let tts = value(
        "voxgate_provider_latency_seconds_sum",
        "door=\"xiaozhi\",provider=\"tts\"",
    );
    assert!(llm >= 0.15 && tts >= 0.2, "llm {llm} s, tts {tts} s");
    // ...but the server's own share, one turn timed, holds none of it.
    let door = "door=\"xiaozhi\"";
    assert_eq!(value("voxgate_turn_server_added_seconds_count", door), 1.0);
    let added = value("voxgate_turn_server_added_seconds_sum", door);
    assert!(added < 0.1, "server-added {added} s");
    assert!(
        text.contains("voxgate_turn_server_added_seconds_bucket{door=\"xiaozhi\",le=\"+Inf\"} 1"),
        "{text}"
    );
    server.stop().await;
    fakes.stop();
}
