//! Heap held per Xiaozhi device session, measured exactly with a counting allocator.
//!
//! `cargo bench -p voxgate-server --bench session_memory` (add `--features libopus` to compare
//! the libopus backend). The real server runs in-process on its own tokio runtime whose threads
//! are tagged, so the counting allocator attributes every byte to the server or to the simulated
//! devices (which share the process). Each device connects and says hello (idle), starts
//! listening in auto mode and streams a second of speech (listening: uplink decoder, engine, VAD),
//! then the silence that ends its utterance, and waits for the reply (mid-reply: queued reply
//! audio, and the encoder while the reply is still being synthesized). The figures are the
//! server's live heap divided by the number of sessions at each of those moments. After every device has left,
//! the server's heap must be back at its baseline: anything left is reported as a leak.
//!
//! RSS per session (what `cargo xtask load` reports) adds the allocator's own overhead and
//! fragmentation on top of these figures.
//!
//! `-- long` measures a long-lived session instead: [`LONG_SESSIONS`] devices talk to the
//! server for [`LONG_TURNS`] whole turns each (question, silence, the reply played to its
//! `tts stop`) against the OpenAI-compatible fake providers, so every history fills to the
//! default cap (`[limits] max_history_messages`, 100 messages); the heap per session is
//! printed as the histories grow and once they are full (about a minute and a half).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use voxgate_audio::opus::{OpusBackend, OpusEncoder, OpusEncoderConfig};
use voxgate_audio::wav::read_wav;
use voxgate_server::metrics::Door;
use voxgate_server::{Config, LimitsConfig, OpusBackendChoice, Server};
use voxgate_test_support::{CountingAllocator, live_bytes_tagged, set_thread_tag};
use voxgate_xiaozhi::frame::{Frame, FrameCodec, ProtocolVersion};

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// Tag of the server runtime's threads.
const SERVER: usize = 1;
const SESSIONS: usize = 100;
const WAIT: Duration = Duration::from_secs(30);
/// 60 ms packets of speech before the silence that ends the utterance.
const SPEECH_PACKETS: usize = 17;

/// Devices of the `long` measurement.
const LONG_SESSIONS: usize = 50;
/// Turns each `long` device takes: two history messages a turn, so 55 turns fill the default
/// cap of 100 messages and then replace ten of them.
const LONG_TURNS: usize = 55;

fn main() {
    if std::env::args().skip(1).any(|a| a == "long") {
        measure_long();
        return;
    }
    let backends: Vec<OpusBackendChoice> = [OpusBackendChoice::Pure, OpusBackendChoice::Libopus]
        .into_iter()
        .filter(|b| b.resolve().is_available())
        .filter(|b| {
            // `cargo bench ... -- libopus` measures one backend (e.g. under a heap profiler).
            let name = format!("{b:?}").to_lowercase();
            let only: Vec<String> = std::env::args()
                .skip(1)
                .filter(|a| a == "pure" || a == "libopus")
                .collect();
            only.is_empty() || only.contains(&name)
        })
        .collect();
    println!("session_memory: {SESSIONS} concurrent Xiaozhi sessions, live heap of the server");
    for backend in backends {
        let r = measure(backend);
        println!(
            "  opus_backend = {:<8} KB per session: {:>6.1} after hello, {:>6.1} listening, \
             {:>6.1} mid-reply; {:+.1} left after all closed (baseline {:.0} KB)",
            format!("{backend:?}").to_lowercase(),
            r.after_hello_kb,
            r.listening_kb,
            r.mid_reply_kb,
            r.leak_kb,
            r.baseline_kb,
        );
    }
}

struct Figures {
    baseline_kb: f64,
    after_hello_kb: f64,
    listening_kb: f64,
    mid_reply_kb: f64,
    leak_kb: f64,
}

fn server_heap() -> f64 {
    #[allow(clippy::cast_precision_loss, reason = "kilobytes for display")]
    let kb = live_bytes_tagged(SERVER) as f64 / 1024.0;
    kb
}

fn measure(backend: OpusBackendChoice) -> Figures {
    let server_rt = server_runtime();
    let mut config = Config::default().with_ephemeral_ports();
    config.xiaozhi.opus_backend = backend;
    config.xiaozhi.idle_timeout_secs = 0;
    // Every device comes from one address at once: admission control would refuse most.
    config.limits = LimitsConfig::unlimited();
    let (addr, metrics, stop_tx, server_task) = start_server(&server_rt, config);
    let packets = speech_packets();

    let client_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let figures = client_rt.block_on(async {
        // Warm-up: one whole session, so lazily built shared state (the embedded voice, the
        // runtime's pools) is not charged to the measured sessions.
        let mut warm = Device::connect(addr).await;
        warm.hello().await;
        warm.listen(&packets).await;
        warm.reply_started(&[]).await;
        warm.close().await;
        let baseline = settled_heap(&metrics).await;
        let mut devices = Device::connect_all(addr, SESSIONS).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let after_hello = server_heap();
        // Speech only (no trailing silence yet): every session is listening, mid-utterance.
        let (speech, silence) = packets.split_at(SPEECH_PACKETS);
        let listening: Vec<_> = devices.iter_mut().map(|d| d.listen(speech)).collect();
        futures::future::join_all(listening).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let listening = server_heap();
        let started: Vec<_> = devices
            .iter_mut()
            .map(|d| d.reply_started(silence))
            .collect();
        futures::future::join_all(started).await;
        // A moment into the replies: every session is speaking, its reply queued.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mid_reply = server_heap();
        for d in devices {
            d.close().await;
        }
        wait_for(|| metrics.active_sessions(Door::Xiaozhi) == 0).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let after = server_heap();
        #[allow(clippy::cast_precision_loss, reason = "a small count")]
        let n = SESSIONS as f64;
        Figures {
            baseline_kb: baseline,
            after_hello_kb: (after_hello - baseline) / n,
            listening_kb: (listening - baseline) / n,
            mid_reply_kb: (mid_reply - baseline) / n,
            leak_kb: (after - baseline) / n,
        }
    });
    let _ = stop_tx.send(());
    server_rt.block_on(async {
        tokio::time::timeout(WAIT, server_task)
            .await
            .unwrap()
            .unwrap();
    });
    figures
}

/// The `long` measurement: heap per session as the histories fill to their cap.
fn measure_long() {
    let fakes = voxgate_test_support::fake_providers::FakeProviders::spawn(
        voxgate_test_support::fake_providers::FakeDelays::default(),
    )
    .unwrap();
    let server_rt = server_runtime();
    let base = fakes.base_url();
    let mut config = Config {
        asr: Some(voxgate_server::config::AsrConfig {
            base_url: Some(base.clone()),
            ..Default::default()
        }),
        llm: Some(voxgate_server::config::LlmConfig {
            base_url: Some(base.clone()),
            ..Default::default()
        }),
        tts: Some(voxgate_server::config::TtsConfig {
            base_url: Some(base),
            ..Default::default()
        }),
        ..Config::default()
    }
    .with_ephemeral_ports();
    config.xiaozhi.idle_timeout_secs = 0;
    config.limits = LimitsConfig {
        max_history_messages: LimitsConfig::default().max_history_messages,
        ..LimitsConfig::unlimited()
    };
    let cap = config.limits.max_history_messages;
    let (addr, metrics, stop_tx, server_task) = start_server(&server_rt, config);
    let packets = speech_packets();
    let client_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    println!(
        "session_memory long: {LONG_SESSIONS} Xiaozhi sessions, {LONG_TURNS} turns each \
         (history cap {cap} messages), live heap of the server"
    );
    client_rt.block_on(async {
        let mut warm = Device::connect(addr).await;
        warm.hello().await;
        warm.turn(&packets).await;
        warm.close().await;
        let baseline = settled_heap(&metrics).await;
        let mut devices = Device::connect_all(addr, LONG_SESSIONS).await;
        #[allow(clippy::cast_precision_loss, reason = "a small count")]
        let n = LONG_SESSIONS as f64;
        let t0 = Instant::now();
        for turn in 1..=LONG_TURNS {
            let turns: Vec<_> = devices.iter_mut().map(|d| d.turn(&packets)).collect();
            futures::future::join_all(turns).await;
            if turn == 1 || turn % 5 == 0 {
                // Between turns: every session idle, listening again, its history `2 * turn`
                // messages long (at most the cap).
                tokio::time::sleep(Duration::from_millis(100)).await;
                println!(
                    "  after {turn:>2} turns ({:>3} messages kept): {:>6.1} KB per session ({:.0} s)",
                    (2 * turn).min(cap),
                    (server_heap() - baseline) / n,
                    t0.elapsed().as_secs_f64(),
                );
            }
        }
        for d in devices {
            d.close().await;
        }
        wait_for(|| metrics.active_sessions(Door::Xiaozhi) == 0).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        println!(
            "  {:+.1} KB per session left after all closed (baseline {baseline:.0} KB)",
            (server_heap() - baseline) / n
        );
    });
    let _ = stop_tx.send(());
    server_rt.block_on(async {
        tokio::time::timeout(WAIT, server_task)
            .await
            .unwrap()
            .unwrap();
    });
    fakes.stop();
}

fn server_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .on_thread_start(|| set_thread_tag(SERVER))
        .enable_all()
        .build()
        .unwrap()
}

/// Starts the server on `rt`: its address, metrics, the stop signal and its task.
fn start_server(
    rt: &tokio::runtime::Runtime,
    config: Config,
) -> (
    SocketAddr,
    std::sync::Arc<voxgate_server::metrics::Metrics>,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = rt.spawn(async move {
        let server = Server::bind(config).await.unwrap();
        addr_tx
            .send((server.local_addr(), server.metrics()))
            .unwrap();
        server
            .run(async move {
                let _ = stop_rx.await;
            })
            .await
            .unwrap();
    });
    let (addr, metrics) = addr_rx.recv_timeout(WAIT).unwrap();
    (addr, metrics, stop_tx, task)
}

/// The server's heap once every session has closed and the server has settled.
async fn settled_heap(metrics: &voxgate_server::metrics::Metrics) -> f64 {
    wait_for(|| metrics.active_sessions(Door::Xiaozhi) == 0).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    server_heap()
}

async fn wait_for(mut done: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !done() {
        assert!(t0.elapsed() < WAIT, "timed out");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One second of the speech fixture and one of silence (so the server's VAD ends the utterance)
/// as 60 ms Opus packets at 16 kHz, the device's uplink.
fn speech_packets() -> Vec<Vec<u8>> {
    let wav = read_wav(include_bytes!(
        "../../voxgate-audio/tests/fixtures/speech.wav"
    ))
    .unwrap();
    let pcm = wav.to_mono_i16();
    let mut enc = OpusEncoder::new(OpusEncoderConfig {
        backend: OpusBackend::Pure,
        ..OpusEncoderConfig::voice(16_000)
    })
    .unwrap();
    let silence = vec![0i16; 960 * 17];
    pcm.chunks_exact(960)
        .take(SPEECH_PACKETS)
        .chain(silence.chunks_exact(960))
        .map(|c| enc.encode(c).unwrap().to_vec())
        .collect()
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

struct Device {
    ws: Ws,
    codec: FrameCodec,
}

impl Device {
    async fn connect(addr: SocketAddr) -> Self {
        let mut req = format!("ws://{addr}/xiaozhi/v1/")
            .into_client_request()
            .unwrap();
        req.headers_mut()
            .insert("Protocol-Version", "1".parse().unwrap());
        req.headers_mut()
            .insert("Device-Id", "aa:bb:cc:dd:ee:ff".parse().unwrap());
        let (ws, _) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(req))
            .await
            .unwrap()
            .unwrap();
        Self {
            ws,
            codec: FrameCodec::new(ProtocolVersion::V1),
        }
    }

    /// `n` devices, each connected and past its hello.
    async fn connect_all(addr: SocketAddr, n: usize) -> Vec<Self> {
        let mut devices = Vec::with_capacity(n);
        for _ in 0..n {
            let mut d = Self::connect(addr).await;
            d.hello().await;
            devices.push(d);
        }
        devices
    }

    async fn send(&mut self, v: Value) {
        self.ws
            .send(Message::Text(v.to_string().into()))
            .await
            .unwrap();
    }

    async fn next_json(&mut self) -> Value {
        loop {
            if let Message::Text(t) = self.next_message().await {
                return serde_json::from_str(&t).unwrap();
            }
        }
    }

    async fn hello(&mut self) {
        self.send(json!({
            "type": "hello", "version": 1, "transport": "websocket",
            "features": {"mcp": false},
            "audio_params": {"format": "opus", "sample_rate": 16000, "channels": 1, "frame_duration": 60}
        }))
        .await;
        let hello = self.next_json().await;
        assert_eq!(hello["type"], "hello");
    }

    /// Starts listening in auto mode and streams `packets`.
    async fn listen(&mut self, packets: &[Vec<u8>]) {
        self.send(json!({"type": "listen", "state": "start", "mode": "auto"}))
            .await;
        self.stream(packets).await;
    }

    /// Streams the rest of an utterance and waits for the reply's first frames.
    async fn reply_started(&mut self, packets: &[Vec<u8>]) {
        self.stream(packets).await;
        loop {
            if matches!(self.next_message().await, Message::Binary(_)) {
                return;
            }
        }
    }

    /// The server's next frame, within [`WAIT`].
    async fn next_message(&mut self) -> Message {
        tokio::time::timeout(WAIT, self.ws.next())
            .await
            .expect("a message in time")
            .expect("the server keeps the session open")
            .unwrap()
    }

    /// One whole turn: listens, streams the question and its silence, and reads the reply to
    /// its `tts stop`.
    async fn turn(&mut self, packets: &[Vec<u8>]) {
        self.listen(packets).await;
        loop {
            let v = self.next_json().await;
            if v["type"] == "tts" && v["state"] == "stop" {
                return;
            }
        }
    }

    async fn stream(&mut self, packets: &[Vec<u8>]) {
        let mut out = Vec::new();
        for p in packets {
            out.clear();
            self.codec.encode(&Frame::opus(p), &mut out).unwrap();
            self.ws
                .send(Message::Binary(out.clone().into()))
                .await
                .unwrap();
        }
    }

    async fn close(mut self) {
        let _ = self.ws.close(None).await;
        // Drain until the server closes its side.
        while let Ok(Some(Ok(_))) = tokio::time::timeout(WAIT, self.ws.next()).await {}
    }
}
