//! Zero-delay (or delayed) stand-ins for the OpenAI-compatible endpoints the server's
//! providers call, so a load test or an end-to-end test can run a real ASR → LLM → TTS turn
//! without a model, a network or Python.
//!
//! One HTTP server on `127.0.0.1` answers, under `/v1` (the server's `base_url` is
//! [`FakeProviders::base_url`] for all three of `[asr]`, `[llm]` and `[tts]`):
//!
//! | endpoint | request (what voxgate-providers sends) | answer |
//! |---|---|---|
//! | `POST /v1/audio/transcriptions` | multipart form: `file` (a WAV), `model`, `response_format=json`, optional `language` | `{"text": TRANSCRIPT}` after the ASR delay |
//! | `POST /v1/chat/completions` | JSON with `"stream": true` and `messages` | server-sent events: the LLM delay, then [`REPLY_CHUNKS`] as eight `chat.completion.chunk` deltas, a `finish_reason: "stop"` chunk, `data: [DONE]` |
//! | `POST /v1/audio/speech` | JSON with `input`, `voice`, `model`, `response_format: "pcm"` | the TTS delay, then one second of speech-like 24 kHz 16-bit mono PCM, streamed in 100 ms chunks |
//!
//! A request of the wrong shape gets `400` with an OpenAI-style error body and is counted in
//! [`FakeCounts::bad_requests`], so a test sees when the server's wire format drifts. A
//! request whose client hangs up before the whole answer went out (the server cancelled it)
//! is counted in [`FakeCounts::asr_cancelled`], [`FakeCounts::llm_cancelled`] or
//! [`FakeCounts::tts_cancelled`].
//!
//! With [`FakeOptions::short_below`], what the recognizer hears depends on the audio's length
//! (a short utterance is [`SHORT_TRANSCRIPT`]) and the model answers that transcript with
//! [`SHORT_REPLY`], so a test can tell a reply to part of an utterance (a speculative one, at
//! a pause) from the reply to the whole.
//!
//! Everything the fakes send is built once; a request costs a few small writes. The delays
//! are sleeps, so many requests wait at once without threads.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// What the fake recognizer hears, whatever the audio.
pub const TRANSCRIPT: &str = "What will the weather be like tomorrow?";

/// The fake model's reply, one sentence in eight streamed deltas.
pub const REPLY_CHUNKS: [&str; 8] = [
    "It",
    " will",
    " be",
    " sunny",
    " tomorrow",
    " with",
    " a light",
    " breeze.",
];

/// What the fake recognizer hears in audio shorter than [`FakeOptions::short_below`].
pub const SHORT_TRANSCRIPT: &str = "Hello.";

/// The fake model's reply to [`SHORT_TRANSCRIPT`] (with [`FakeOptions::short_below`]).
pub const SHORT_REPLY: &str = "Hi there, how can I help?";

/// The fake synthesizer's rate (OpenAI's `pcm` format).
pub const SPEECH_RATE: u32 = 24_000;

/// Samples of reply speech per request: one second.
pub const SPEECH_SAMPLES: usize = SPEECH_RATE as usize;

/// Samples per streamed chunk of speech: 100 ms.
const CHUNK_SAMPLES: usize = SPEECH_SAMPLES / 10;

/// Largest request body read (a transcription upload of a 60 s utterance is about 2 MB).
const MAX_BODY: usize = 8 << 20;

/// How long each fake waits before its first output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FakeDelays {
    /// Before the transcription answer.
    pub asr: Duration,
    /// Before the first token (the response headers go out at once, as a real service's do).
    pub llm_first_token: Duration,
    /// Before the first audio byte (headers at once).
    pub tts_first_byte: Duration,
}

/// Everything the fakes can be asked to do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FakeOptions {
    /// How long each fake waits before its first output.
    pub delays: FakeDelays,
    /// Audio shorter than this is heard as [`SHORT_TRANSCRIPT`], which the model answers with
    /// [`SHORT_REPLY`]; longer audio is [`TRANSCRIPT`]. `None`: everything is [`TRANSCRIPT`].
    pub short_below: Option<Duration>,
}

/// Requests served so far, per endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FakeCounts {
    /// `/audio/transcriptions` answered.
    pub asr: u64,
    /// `/chat/completions` answered.
    pub llm: u64,
    /// `/audio/speech` answered.
    pub tts: u64,
    /// Requests refused for their shape (a `400`).
    pub bad_requests: u64,
    /// `/audio/transcriptions` requests whose client hung up before the answer.
    pub asr_cancelled: u64,
    /// `/chat/completions` requests whose client hung up before the whole stream.
    pub llm_cancelled: u64,
    /// `/audio/speech` requests whose client hung up before the whole stream.
    pub tts_cancelled: u64,
}

#[derive(Default)]
struct Counters {
    asr: AtomicU64,
    llm: AtomicU64,
    tts: AtomicU64,
    bad: AtomicU64,
    /// Per endpoint, [`Endpoint`] order.
    cancelled: [AtomicU64; 3],
}

/// Which fake a request is for.
#[derive(Debug, Clone, Copy)]
enum Endpoint {
    Asr = 0,
    Llm = 1,
    Tts = 2,
}

/// Counts its request as cancelled when dropped before [`Answered::done`]: the handler (or
/// the response stream) was dropped because the client went away.
struct Answered {
    shared: Arc<Shared>,
    endpoint: Endpoint,
    done: bool,
}

impl Answered {
    fn new(shared: &Arc<Shared>, endpoint: Endpoint) -> Self {
        Self {
            shared: Arc::clone(shared),
            endpoint,
            done: false,
        }
    }

    fn done(&mut self) {
        self.done = true;
    }
}

impl Drop for Answered {
    fn drop(&mut self) {
        if !self.done {
            self.shared.counters.cancelled[self.endpoint as usize].fetch_add(1, Ordering::Relaxed);
        }
    }
}

struct Shared {
    delays: FakeDelays,
    short_below: Option<Duration>,
    /// The event stream answering [`SHORT_TRANSCRIPT`].
    short_sse: Vec<Bytes>,
    short_transcript: Bytes,
    counters: Counters,
    /// The `messages` of the latest chat completion request, for tests that check what a
    /// server sent its model.
    last_messages: std::sync::Mutex<Option<serde_json::Value>>,
    /// The whole event stream of a completion, one element per event.
    sse: Vec<Bytes>,
    /// The reply speech, one element per 100 ms chunk.
    speech: Vec<Bytes>,
    transcript: Bytes,
}

/// The fakes, serving on a loopback port until dropped (or [`FakeProviders::stop`]).
pub struct FakeProviders {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    /// The runtime thread when started with [`FakeProviders::spawn`].
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for FakeProviders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeProviders")
            .field("addr", &self.addr)
            .field("delays", &self.shared.delays)
            .finish_non_exhaustive()
    }
}

impl FakeProviders {
    /// Serves on a free `127.0.0.1` port from the current tokio runtime.
    ///
    /// # Errors
    /// When no port can be bound.
    pub async fn start(delays: FakeDelays) -> io::Result<Self> {
        Self::start_with(FakeOptions {
            delays,
            ..FakeOptions::default()
        })
        .await
    }

    /// Like [`FakeProviders::start`], with every option.
    ///
    /// # Errors
    /// When no port can be bound.
    pub async fn start_with(options: FakeOptions) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::new(options));
        let (stop, stopped) = oneshot::channel();
        let app = router(Arc::clone(&shared));
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(Self {
            addr,
            shared,
            stop: Some(stop),
            thread: None,
        })
    }

    /// Serves from a thread of its own (a single-threaded runtime), for callers without a
    /// runtime, such as `cargo xtask load`.
    ///
    /// # Errors
    /// When the runtime or the thread cannot start, or no port can be bound.
    pub fn spawn(delays: FakeDelays) -> io::Result<Self> {
        Self::spawn_with(FakeOptions {
            delays,
            ..FakeOptions::default()
        })
    }

    /// Like [`FakeProviders::spawn`], with every option.
    ///
    /// # Errors
    /// As [`FakeProviders::spawn`].
    pub fn spawn_with(options: FakeOptions) -> io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("fake-providers".into())
            .spawn(move || {
                runtime.block_on(async move {
                    match Self::start_with(options).await {
                        Ok(mut fakes) => {
                            let stop = fakes.stop.take();
                            let (stop_tx, stop_rx) = oneshot::channel::<()>();
                            let _ =
                                ready_tx.send(Ok((fakes.addr, Arc::clone(&fakes.shared), stop_tx)));
                            let _ = stop_rx.await;
                            if let Some(stop) = stop {
                                let _ = stop.send(());
                            }
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                        }
                    }
                });
            })?;
        let (addr, shared, stop) = ready_rx
            .recv()
            .map_err(|_| io::Error::other("the fake providers' thread ended at start"))??;
        Ok(Self {
            addr,
            shared,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The address served.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The API root to configure as `base_url` of `[asr]`, `[llm]` and `[tts]`:
    /// `http://127.0.0.1:PORT/v1`.
    #[must_use]
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The delays in use.
    #[must_use]
    pub fn delays(&self) -> FakeDelays {
        self.shared.delays
    }

    /// The `messages` array of the latest chat completion request, if any came.
    #[must_use]
    pub fn last_llm_messages(&self) -> Option<serde_json::Value> {
        self.shared
            .last_messages
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Requests served so far.
    #[must_use]
    pub fn counts(&self) -> FakeCounts {
        let c = &self.shared.counters;
        FakeCounts {
            asr: c.asr.load(Ordering::Relaxed),
            llm: c.llm.load(Ordering::Relaxed),
            tts: c.tts.load(Ordering::Relaxed),
            bad_requests: c.bad.load(Ordering::Relaxed),
            asr_cancelled: c.cancelled[Endpoint::Asr as usize].load(Ordering::Relaxed),
            llm_cancelled: c.cancelled[Endpoint::Llm as usize].load(Ordering::Relaxed),
            tts_cancelled: c.cancelled[Endpoint::Tts as usize].load(Ordering::Relaxed),
        }
    }

    /// Stops serving (connections in progress finish) and, when it has one, joins the thread.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for FakeProviders {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Shared {
    fn new(options: FakeOptions) -> Self {
        let delays = options.delays;
        let chunk = |delta: serde_json::Value, finish: Option<&str>| {
            let c = serde_json::json!({
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "fake",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            });
            Bytes::from(format!("data: {c}\n\n"))
        };
        let stream = |deltas: &[&str]| {
            let mut sse = vec![chunk(
                serde_json::json!({"role": "assistant", "content": ""}),
                None,
            )];
            sse.extend(
                deltas
                    .iter()
                    .map(|t| chunk(serde_json::json!({"content": t}), None)),
            );
            sse.push(chunk(serde_json::json!({}), Some("stop")));
            sse.push(Bytes::from_static(b"data: [DONE]\n\n"));
            sse
        };
        let sse = stream(&REPLY_CHUNKS);
        let short_sse = stream(&[SHORT_REPLY]);
        let pcm: Vec<u8> = speech_like(SPEECH_SAMPLES)
            .iter()
            .flat_map(|s| s.to_le_bytes())
            .collect();
        let speech = pcm
            .chunks(CHUNK_SAMPLES * 2)
            .map(Bytes::copy_from_slice)
            .collect();
        Self {
            delays,
            short_below: options.short_below,
            short_sse,
            short_transcript: Bytes::from(
                serde_json::json!({ "text": SHORT_TRANSCRIPT }).to_string(),
            ),
            counters: Counters::default(),
            last_messages: std::sync::Mutex::new(None),
            sse,
            speech,
            transcript: Bytes::from(serde_json::json!({ "text": TRANSCRIPT }).to_string()),
        }
    }
}

/// `n` samples of a voice-like sound at 24 kHz: a 140 Hz buzz with falling harmonics, shaped
/// into four syllables a second, so an Opus encoder works on it as on speech (silence or a
/// pure tone would be cheaper than the real thing).
#[must_use]
pub fn speech_like(n: usize) -> Vec<i16> {
    let rate = f64::from(SPEECH_RATE);
    (0..n)
        .map(|i| {
            let t = i as f64 / rate;
            let f0 = 140.0 + 20.0 * (2.0 * std::f64::consts::PI * 1.5 * t).sin();
            let voice: f64 = (1..=12)
                .map(|h| {
                    let h = f64::from(h);
                    (2.0 * std::f64::consts::PI * f0 * h * t).sin() / h
                })
                .sum();
            // Syllables: a raised sine at 4 Hz, never quite silent.
            let envelope = 0.15 + 0.85 * (0.5 - 0.5 * (2.0 * std::f64::consts::PI * 4.0 * t).cos());
            let s = 0.25 * voice * envelope * f64::from(i16::MAX);
            // In range by construction (|voice| < 3.1), and clamped besides.
            #[allow(clippy::cast_possible_truncation, reason = "clamped to the i16 range")]
            let sample = s.clamp(f64::from(i16::MIN), f64::from(i16::MAX)) as i16;
            sample
        })
        .collect()
}

fn router(shared: Arc<Shared>) -> Router {
    let asr = Arc::clone(&shared);
    let llm = Arc::clone(&shared);
    let tts = shared;
    Router::new()
        .route(
            "/v1/audio/transcriptions",
            post(move |headers: HeaderMap, body: Bytes| {
                transcribe(Arc::clone(&asr), headers, body)
            }),
        )
        .route(
            "/v1/chat/completions",
            post(move |body: Bytes| complete(Arc::clone(&llm), body)),
        )
        .route(
            "/v1/audio/speech",
            post(move |body: Bytes| speak(Arc::clone(&tts), body)),
        )
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
}

fn bad(shared: &Shared, why: &str) -> Response {
    shared.counters.bad.fetch_add(1, Ordering::Relaxed);
    let body = serde_json::json!({"error": {"message": why, "type": "invalid_request_error"}});
    (
        StatusCode::BAD_REQUEST,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn transcribe(shared: Arc<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let Some(boundary) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(multipart_boundary)
    else {
        return bad(&shared, "expected multipart/form-data with a boundary");
    };
    let parts = multipart_parts(&body, boundary);
    let field = |name: &str| parts.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
    match (field("file"), field("model"), field("response_format")) {
        (Some(file), Some(model), format)
            if file.starts_with(b"RIFF")
                && !model.is_empty()
                && format.is_none_or(|f| f == b"json") => {}
        _ => {
            return bad(
                &shared,
                "expected the parts file (a WAV), model and response_format=json",
            );
        }
    }
    let short = shared
        .short_below
        .zip(field("file").and_then(wav_duration))
        .is_some_and(|(below, heard)| heard < below);
    let mut answered = Answered::new(&shared, Endpoint::Asr);
    tokio::time::sleep(shared.delays.asr).await;
    answered.done();
    shared.counters.asr.fetch_add(1, Ordering::Relaxed);
    let text = if short {
        shared.short_transcript.clone()
    } else {
        shared.transcript.clone()
    };
    ([(header::CONTENT_TYPE, "application/json")], text).into_response()
}

/// The length of a 16-bit PCM WAV file's audio.
fn wav_duration(wav: &[u8]) -> Option<Duration> {
    let u16_at = |i: usize| Some(u16::from_le_bytes(wav.get(i..i + 2)?.try_into().ok()?));
    let u32_at = |i: usize| Some(u32::from_le_bytes(wav.get(i..i + 4)?.try_into().ok()?));
    let channels = u64::from(u16_at(22)?.max(1));
    let rate = u64::from(u32_at(24)?.max(1));
    let data = find(wav.get(12..)?, b"data")? + 12;
    let bytes = u64::from(u32_at(data + 4)?);
    Some(Duration::from_micros(
        bytes / 2 / channels * 1_000_000 / rate,
    ))
}

async fn complete(shared: Arc<Shared>, body: Bytes) -> Response {
    let Ok(request) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return bad(&shared, "the body is not JSON");
    };
    if request["stream"] != true || !request["messages"].is_array() {
        return bad(&shared, "expected \"stream\": true and a messages array");
    }
    shared.counters.llm.fetch_add(1, Ordering::Relaxed);
    *shared
        .last_messages
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(request["messages"].clone());
    let delay = shared.delays.llm_first_token;
    let last_user = request["messages"].as_array().and_then(|m| {
        m.iter()
            .rev()
            .find(|m| m["role"] == "user")
            .and_then(|m| m["content"].as_str())
    });
    let events = if shared.short_below.is_some() && last_user == Some(SHORT_TRANSCRIPT) {
        shared.short_sse.clone()
    } else {
        shared.sse.clone()
    };
    let answered = Answered::new(&shared, Endpoint::Llm);
    streamed(delay, events, "text/event-stream", answered)
}

async fn speak(shared: Arc<Shared>, body: Bytes) -> Response {
    let Ok(request) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return bad(&shared, "the body is not JSON");
    };
    if !request["input"].is_string() || request["response_format"] != "pcm" {
        return bad(&shared, "expected input and \"response_format\": \"pcm\"");
    }
    shared.counters.tts.fetch_add(1, Ordering::Relaxed);
    let delay = shared.delays.tts_first_byte;
    let answered = Answered::new(&shared, Endpoint::Tts);
    streamed(delay, shared.speech.clone(), "audio/pcm", answered)
}

/// A response whose headers go out at once and whose body chunks follow `delay` later, each
/// its own write; `answered` counts it as cancelled if the body is dropped before its end.
fn streamed(
    delay: Duration,
    chunks: Vec<Bytes>,
    content_type: &'static str,
    answered: Answered,
) -> Response {
    let stream = futures::stream::unfold(
        (delay, chunks.into_iter(), answered),
        |(delay, mut rest, mut answered)| async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let Some(chunk) = rest.next() else {
                answered.done();
                return None;
            };
            Some((Ok::<_, io::Error>(chunk), (Duration::ZERO, rest, answered)))
        },
    );
    let mut response = Body::from_stream(stream).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// The boundary of a `multipart/form-data` content type.
fn multipart_boundary(content_type: &str) -> Option<&str> {
    let (kind, params) = content_type.split_once(';')?;
    if !kind.trim().eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params.split(';').find_map(|p| {
        let (k, v) = p.trim().split_once('=')?;
        k.eq_ignore_ascii_case("boundary")
            .then(|| v.trim_matches('"'))
            .filter(|b| !b.is_empty())
    })
}

/// The named parts of a multipart body: `(name, content)`. Malformed parts are skipped.
fn multipart_parts<'a>(body: &'a [u8], boundary: &str) -> Vec<(String, &'a [u8])> {
    let delimiter = format!("--{boundary}");
    let mut parts = Vec::new();
    let mut rest = body;
    while let Some(at) = find(rest, delimiter.as_bytes()) {
        rest = &rest[at + delimiter.len()..];
        if rest.starts_with(b"--") {
            break;
        }
        let Some(head_end) = find(rest, b"\r\n\r\n") else {
            break;
        };
        let head = String::from_utf8_lossy(&rest[..head_end]);
        let content_start = head_end + 4;
        let Some(len) = find(
            &rest[content_start..],
            format!("\r\n{delimiter}").as_bytes(),
        ) else {
            break;
        };
        let content = &rest[content_start..content_start + len];
        let name = head.lines().find_map(|l| {
            let l = l.trim();
            let disposition = l
                .get(..20)
                .filter(|p| p.eq_ignore_ascii_case("content-disposition:"))
                .map(|_| &l[20..])?;
            disposition.split(';').find_map(|p| {
                let (k, v) = p.trim().split_once('=')?;
                (k == "name").then(|| v.trim_matches('"').to_owned())
            })
        });
        if let Some(name) = name {
            parts.push((name, content));
        }
        rest = &rest[content_start + len + 2..];
    }
    parts
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return Some(0);
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multipart_bodies_are_split_into_named_parts() {
        let body =
            b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"u.wav\"\r\n\
            Content-Type: audio/wav\r\n\r\nRIFF\r\n--x\r\n--XyZ\r\ncontent-disposition: form-data; \
            name=\"model\"\r\n\r\nwhisper-1\r\n--XyZ--\r\n";
        let parts = multipart_parts(body, "XyZ");
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0], ("file".to_owned(), &b"RIFF\r\n--x"[..]));
        assert_eq!(parts[1], ("model".to_owned(), &b"whisper-1"[..]));
        assert_eq!(
            multipart_boundary("multipart/form-data; boundary=\"XyZ\""),
            Some("XyZ")
        );
        assert_eq!(multipart_boundary("application/json"), None);
        assert!(multipart_parts(b"garbage", "XyZ").is_empty());
    }

    #[test]
    fn the_speech_is_loud_and_in_range() {
        let s = speech_like(SPEECH_SAMPLES);
        let peak = s.iter().map(|v| v.unsigned_abs()).max().unwrap_or(0);
        assert!(peak > 8_000 && peak < i16::MAX.unsigned_abs(), "{peak}");
    }
}
