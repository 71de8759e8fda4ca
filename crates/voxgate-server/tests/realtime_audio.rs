//! The realtime door's audio paths end to end: a real server on 127.0.0.1:0, a real WebSocket
//! client, speech from the voxgate-audio fixtures, and local fakes of the cloud services the
//! server calls (OpenAI `/audio/transcriptions` via `[asr] base_url`, ElevenLabs streaming TTS
//! via `[realtime] elevenlabs_base_url`), each speaking the service's wire format.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_precision_loss,
    clippy::cast_sign_loss
)]

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::HeaderMap;
use futures::stream::SplitStream;
use futures::{SinkExt, StreamExt};
use support::{Running, Ws, next_message, try_connect};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use voxgate_audio::format::{PcmEncoder, PcmFormat, SampleFormat};
use voxgate_audio::resample::Resampler;
use voxgate_providers::ToneTts;
use voxgate_realtime::proto::chat_message_content::Content;
use voxgate_realtime::proto::client_bound_message::Payload as Down;
use voxgate_realtime::proto::{
    self, ChatDeliveryStatus, ChatMessageRole, InferenceTriggerMode, SessionErrorCategory, VadState,
};
use voxgate_realtime::{
    AudioFormat, ClientBoundMessage, ElevenLabsSettings, HostedTtsSettings, HostedVoice,
    ServiceBoundMessage, SessionConfig, SessionUpdate, TtsSettings, VoiceSettings,
};
use voxgate_server::config::AsrConfig;
use voxgate_server::{Config, Providers};

/// Longer than the shared default: audio turns stream speech at real time.
const WAIT: Duration = Duration::from_secs(15);

// ---- server -------------------------------------------------------------------------------

/// The server `config` describes, with the placeholder tone synthesizer as its own TTS so
/// reply audio lengths are known (220 ms per word).
async fn start(config: Config) -> Running {
    let mut providers = Providers::from_config(&config).unwrap();
    providers.tts = Arc::new(ToneTts);
    Running::start_with(config, providers).await
}

/// A server whose recognizer is a fresh fake (see [`fake_asr`]), and the uploads it gets.
async fn start_with_fake_asr() -> (Running, Arc<Mutex<Vec<Upload>>>) {
    let (asr, uploads) = fake_asr().await;
    (start(with_asr(&asr)).await, uploads)
}

/// A session config with spoken replies from `tts`.
fn speaking(input: AudioFormat, output: AudioFormat, tts: TtsSettings) -> SessionConfig {
    let mut config = SessionConfig::new(input, output);
    config.tts = Some(tts);
    config
}

/// A configuration whose recognizer is the fake at `asr`.
fn with_asr(asr: &str) -> Config {
    Config {
        asr: Some(AsrConfig {
            base_url: Some(format!("{asr}/v1")),
            model: Some("whisper-1".into()),
            api_key: Some("sk-test".into()),
            ..AsrConfig::default()
        }),
        ..Config::default()
    }
}

// ---- client -------------------------------------------------------------------------------

/// A realtime client: one writer task (so audio can stream while the test reads), one reader.
struct Client {
    tx: mpsc::UnboundedSender<Message>,
    rx: SplitStream<Ws>,
    next_packet: u64,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Self {
        let ws = try_connect(&format!("ws://{addr}/realtime"), &[], WAIT)
            .await
            .unwrap();
        let (mut sink, rx) = ws.split();
        let (tx, mut out) = mpsc::unbounded_channel::<Message>();
        tokio::spawn(async move {
            while let Some(m) = out.recv().await {
                if sink.send(m).await.is_err() {
                    return;
                }
            }
        });
        Self {
            tx,
            rx,
            next_packet: 1,
        }
    }

    /// Connects and initializes; waits for `SessionReady`.
    async fn initialized(addr: SocketAddr, config: &SessionConfig) -> Self {
        let mut c = Self::connect(addr).await;
        c.send(&ServiceBoundMessage::initialize(config).unwrap());
        assert!(matches!(c.next().await, Down::SessionReady(_)));
        c
    }

    fn send(&self, m: &ServiceBoundMessage) {
        self.tx.send(Message::Binary(m.to_frame())).unwrap();
    }

    /// Streams `audio` in packets of `packet_bytes`, one every `pace` (zero: all at once),
    /// from a task of its own; the returned handle ends when the last packet is queued.
    fn stream_audio(
        &mut self,
        audio: &[u8],
        packet_bytes: usize,
        pace: Duration,
    ) -> tokio::task::JoinHandle<()> {
        self.stream_audio_as(audio, packet_bytes, pace, InferenceTriggerMode::Immediate)
    }

    /// [`Client::stream_audio`] with every packet's trigger `mode`.
    fn stream_audio_as(
        &mut self,
        audio: &[u8],
        packet_bytes: usize,
        pace: Duration,
        mode: InferenceTriggerMode,
    ) -> tokio::task::JoinHandle<()> {
        let packets: Vec<(u64, Vec<u8>)> = audio
            .chunks(packet_bytes)
            .map(|p| {
                let id = self.next_packet;
                self.next_packet += 1;
                (id, p.to_vec())
            })
            .collect();
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(pace.max(Duration::from_micros(1)));
            for (id, p) in packets {
                if !pace.is_zero() {
                    tick.tick().await;
                }
                let m = ServiceBoundMessage::user_audio(id, mode, p.into());
                if tx.send(Message::Binary(m.to_frame())).is_err() {
                    return;
                }
            }
        })
    }

    /// The next protocol message; `None` when the server closed.
    async fn recv(&mut self) -> Option<ClientBoundMessage> {
        loop {
            if let Message::Binary(b) = next_message(&mut self.rx, WAIT).await? {
                return Some(ClientBoundMessage::decode_frame(b).unwrap());
            }
        }
    }

    async fn next(&mut self) -> Down {
        self.recv()
            .await
            .expect("server still open")
            .payload
            .unwrap()
    }

    /// Every message up to and including the first that `stop` accepts.
    async fn until(&mut self, stop: impl Fn(&Down) -> bool) -> Vec<Down> {
        let mut out = Vec::new();
        loop {
            let m = self.next().await;
            let done = stop(&m);
            out.push(m);
            if done {
                return out;
            }
        }
    }

    /// Every message that arrives within `span`.
    async fn during(&mut self, span: Duration) -> Vec<Down> {
        let deadline = tokio::time::Instant::now() + span;
        let mut out = Vec::new();
        while let Ok(m) = tokio::time::timeout_at(deadline, self.rx.next()).await {
            match m {
                Some(Ok(Message::Binary(b))) => {
                    out.push(
                        ClientBoundMessage::decode_frame(b)
                            .unwrap()
                            .payload
                            .unwrap(),
                    );
                }
                Some(Ok(_)) => {}
                _ => panic!("the server closed"),
            }
        }
        out
    }

    async fn history(&mut self, exclude_audio: bool) -> Vec<proto::ChatMessage> {
        self.send(&ServiceBoundMessage::export_chat_history(
            true,
            exclude_audio,
        ));
        let all = self.until(|m| matches!(m, Down::ChatHistory(_))).await;
        match all.into_iter().last() {
            Some(Down::ChatHistory(h)) => h.messages,
            _ => unreachable!(),
        }
    }
}

fn text_of(m: &proto::ChatMessage) -> String {
    m.content
        .iter()
        .filter_map(|c| match &c.content {
            Some(Content::TextContent(t)) => Some(t.text.clone()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn snapshot_of(msgs: &[Down], turn: u32) -> Option<proto::ChatMessage> {
    msgs.iter().find_map(|m| match m {
        Down::TurnSnapshot(s) if s.message.as_ref().and_then(|m| m.turn_id) == Some(turn) => {
            assert!(s.is_final);
            s.message.clone()
        }
        _ => None,
    })
}

fn fragments(msgs: &[Down], turn: u32) -> String {
    msgs.iter()
        .filter_map(|m| match m {
            Down::ModelTextFragment(f) if f.turn_id == Some(turn) => Some(f.text.as_str()),
            _ => None,
        })
        .collect()
}

fn response_begin(msgs: &[Down]) -> Option<u32> {
    msgs.iter().find_map(|m| match m {
        Down::ResponseBegin(b) => Some(b.turn_id),
        _ => None,
    })
}

fn has_emoji(s: &str) -> bool {
    s.chars().any(|c| u32::from(c) >= 0x2600)
}

// ---- audio --------------------------------------------------------------------------------

/// The speech fixture (16 kHz mono): 0.8 s silence, "Hello there. Could you turn on the
/// kitchen lights, please?", 0.8 s silence.
fn speech() -> Vec<f32> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../voxgate-audio/tests/fixtures/speech.wav"
    );
    let wav = voxgate_audio::wav::read_wav(&std::fs::read(path).unwrap()).unwrap();
    assert_eq!(wav.sample_rate, 16_000);
    wav.to_mono()
}

/// Speech start and end in the fixture, in seconds (fixtures.txt).
const SPEECH_START: f64 = 12_800.0 / 16_000.0;
const SPEECH_END: f64 = 69_730.0 / 16_000.0;

/// 16 kHz mono samples as raw PCM in `format`.
fn encode(samples: &[f32], format: AudioFormat) -> Vec<u8> {
    let mut audio = samples.to_vec();
    if format.sample_rate() != 16_000 {
        let mut r = Resampler::new(16_000, format.sample_rate()).unwrap();
        audio.clear();
        r.process(samples, &mut audio);
        r.flush(&mut audio);
    }
    let sample_format = match format.sample_format() {
        proto::SampleFormat::Unsigned8Bit => SampleFormat::Unsigned8,
        proto::SampleFormat::Signed16Bit => SampleFormat::Signed16,
        proto::SampleFormat::Signed32Bit => SampleFormat::Signed32,
        proto::SampleFormat::Float32Bit => SampleFormat::Float32,
        proto::SampleFormat::Float64Bit => SampleFormat::Float64,
    };
    let pcm = PcmFormat::new(format.sample_rate(), format.channels(), sample_format).unwrap();
    let mut out = Vec::new();
    PcmEncoder::new(pcm).encode_f32(&audio, &mut out);
    out
}

/// Bytes of `seconds` of audio in `format`.
fn bytes_for(format: AudioFormat, seconds: f64) -> usize {
    let frame = format.channels() as usize * format.sample_format_bytes();
    (seconds * f64::from(format.sample_rate())) as usize * frame
}

trait FormatBytes {
    fn sample_format_bytes(&self) -> usize;
}

impl FormatBytes for AudioFormat {
    fn sample_format_bytes(&self) -> usize {
        match self.sample_format() {
            proto::SampleFormat::Unsigned8Bit => 1,
            proto::SampleFormat::Signed16Bit => 2,
            proto::SampleFormat::Signed32Bit | proto::SampleFormat::Float32Bit => 4,
            proto::SampleFormat::Float64Bit => 8,
        }
    }
}

fn hosted_tts() -> TtsSettings {
    TtsSettings::Hosted(HostedTtsSettings {
        voice: HostedVoice::Ref {
            voice_id: "default".into(),
        },
        mode: proto::HostedTtsMode::LowLatency,
    })
}

// ---- fake OpenAI /audio/transcriptions ---------------------------------------------------

/// One upload the fake recognizer received.
#[derive(Debug, Clone)]
struct Upload {
    auth: Option<String>,
    model: String,
    sample_rate: u32,
    channels: u16,
    samples: usize,
}

/// `needle`'s first position in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The parts of a `multipart/form-data` body: (name, content).
fn multipart(content_type: &str, body: &[u8]) -> Vec<(String, Vec<u8>)> {
    let boundary = content_type
        .split("boundary=")
        .nth(1)
        .unwrap()
        .trim_matches('"');
    let delim = format!("--{boundary}");
    let mut parts = Vec::new();
    let mut rest = body;
    while let Some(start) = find(rest, delim.as_bytes()) {
        rest = &rest[start + delim.len()..];
        if rest.starts_with(b"--") {
            break;
        }
        let end = find(rest, delim.as_bytes()).unwrap_or(rest.len());
        let part = &rest[..end];
        let split = find(part, b"\r\n\r\n").unwrap();
        let head = String::from_utf8_lossy(&part[..split]).to_string();
        let mut content = &part[split + 4..];
        if content.ends_with(b"\r\n") {
            content = &content[..content.len() - 2];
        }
        let name = head
            .split("name=\"")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .unwrap()
            .to_owned();
        parts.push((name, content.to_vec()));
    }
    parts
}

/// A local stand-in for OpenAI's `POST /v1/audio/transcriptions` (multipart upload of a WAV,
/// `response_format=json`). It answers with what it can honestly tell about the audio: its
/// length, as `{"text": "I heard <n> milliseconds"}`.
async fn fake_asr() -> (String, Arc<Mutex<Vec<Upload>>>) {
    let seen: Arc<Mutex<Vec<Upload>>> = Arc::default();
    let s2 = Arc::clone(&seen);
    let router = axum::Router::new().route(
        "/v1/audio/transcriptions",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let seen = Arc::clone(&s2);
            async move {
                let ct = headers["content-type"].to_str().unwrap().to_owned();
                let parts = multipart(&ct, &body);
                let field = |n: &str| parts.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
                let wav = voxgate_audio::wav::read_wav(&field("file").unwrap()).unwrap();
                assert_eq!(field("response_format").unwrap(), b"json");
                let up = Upload {
                    auth: headers
                        .get("authorization")
                        .map(|v| v.to_str().unwrap().to_owned()),
                    model: String::from_utf8(field("model").unwrap()).unwrap(),
                    sample_rate: wav.sample_rate,
                    channels: wav.channels,
                    samples: wav.frames(),
                };
                let ms = up.samples as u64 * 1000 / u64::from(up.sample_rate);
                seen.lock().unwrap().push(up);
                (
                    [("content-type", "application/json")],
                    serde_json::json!({ "text": format!("I heard {ms} milliseconds") }).to_string(),
                )
            }
        }),
    );
    (serve(router).await, seen)
}

async fn serve(router: axum::Router) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    });
    format!("http://{addr}")
}

/// The milliseconds in a fake transcript.
fn heard_ms(text: &str) -> u64 {
    text.strip_prefix("I heard ")
        .and_then(|t| t.strip_suffix(" milliseconds"))
        .unwrap_or_else(|| panic!("not a fake transcript: {text:?}"))
        .parse()
        .unwrap()
}

/// Checks one audio turn's messages: a well-formed VAD event chain whose speech starts where
/// the fixture's does, the transcription, then the reply echoing it. Returns the transcript.
fn check_audio_turn(msgs: &[Down], input_rate: u32) -> String {
    let vad: Vec<&proto::VadStateEvent> = msgs
        .iter()
        .filter_map(|m| match m {
            Down::VadStateEvent(e) => Some(e),
            _ => None,
        })
        .collect();
    assert!(vad.len() >= 4, "VAD events: {vad:?}");
    assert_eq!(vad[0].from_state, VadState::Silence as i32);
    assert_eq!(vad[0].to_state, VadState::SpeechStarting as i32);
    assert!(vad.iter().any(|e| e.to_state == VadState::Speech as i32));
    assert_eq!(vad.last().unwrap().to_state, VadState::Silence as i32);
    for w in vad.windows(2) {
        assert_eq!(w[0].to_state, w[1].from_state, "{vad:?}");
        assert!(w[0].packet_id <= w[1].packet_id);
        let t = |e: &proto::VadStateEvent| e.session_time.as_ref().map(|d| (d.seconds, d.nanos));
        assert!(t(w[0]) <= t(w[1]));
    }
    assert!(vad[0].packet_id >= 1);
    let start = vad[0].session_time.as_ref().unwrap();
    let start = start.seconds as f64 + f64::from(start.nanos) / 1e9;
    assert!(
        (start - SPEECH_START).abs() < 0.35,
        "speech detected at {start} s at {input_rate} Hz, fixture says {SPEECH_START}"
    );
    let transcription = msgs
        .iter()
        .position(|m| matches!(m, Down::UserTranscriptionResult(_)))
        .expect("a user transcription");
    let begin = msgs
        .iter()
        .position(|m| matches!(m, Down::ResponseBegin(_)))
        .expect("a reply");
    assert!(transcription < begin, "transcription before the reply");
    let Down::UserTranscriptionResult(t) = &msgs[transcription] else {
        unreachable!()
    };
    let turn = response_begin(msgs).unwrap();
    assert_eq!(fragments(msgs, turn), format!("You said: {}", t.text));
    t.text.clone()
}

#[tokio::test]
async fn audio_turns_in_every_sample_format_are_transcribed_and_answered() {
    let (server, uploads) = start_with_fake_asr().await;
    let speech = speech();
    let formats = [
        AudioFormat::new(16_000, 1, proto::SampleFormat::Signed16Bit).unwrap(),
        AudioFormat::new(24_000, 1, proto::SampleFormat::Float32Bit).unwrap(),
        AudioFormat::new(8_000, 1, proto::SampleFormat::Unsigned8Bit).unwrap(),
        AudioFormat::new(48_000, 2, proto::SampleFormat::Signed32Bit).unwrap(),
        AudioFormat::new(44_100, 1, proto::SampleFormat::Float64Bit).unwrap(),
    ];
    let runs = formats.iter().enumerate().map(|(i, &format)| {
        let speech = speech.clone();
        let addr = server.addr;
        async move {
            let mut config = SessionConfig::new(format, AudioFormat::SPEECH_24K);
            // One session also asks for per-frame VAD telemetry.
            config.enable_vad_frame_telemetry = i == 0;
            let mut c = Client::initialized(addr, &config).await;
            // 100 ms packets at five times real time.
            let audio = encode(&speech, format);
            c.stream_audio(&audio, bytes_for(format, 0.1), Duration::from_millis(20));
            let msgs = c.until(|m| matches!(m, Down::TurnSnapshot(_))).await;
            let text = check_audio_turn(&msgs, format.sample_rate());
            let ms = heard_ms(&text) as f64 / 1000.0;
            // The utterance: the speech plus at most the VAD's backbuffer and stop time.
            assert!(
                ms > SPEECH_END - SPEECH_START - 0.2 && ms < SPEECH_END - SPEECH_START + 1.6,
                "utterance of {ms} s"
            );
            let frames = msgs
                .iter()
                .filter(|m| matches!(m, Down::VadAnalysisFrame(_)))
                .count();
            if i == 0 {
                // One per 16 ms frame of the audio sent so far.
                assert!(frames > 200, "{frames} VAD frames");
            } else {
                assert_eq!(frames, 0);
            }
            // History: the spoken user turn with its audio and transcription, then the reply.
            let h = c.history(false).await;
            assert_eq!(h.len(), 2, "{h:?}");
            assert_eq!(h[0].role, ChatMessageRole::User as i32);
            let audio = h[0]
                .content
                .iter()
                .find_map(|c| match &c.content {
                    Some(Content::InputAudio(a)) => Some(a),
                    _ => None,
                })
                .expect("the user's audio in history");
            assert_eq!(audio.transcription, text);
            let fmt = audio.format.as_ref().unwrap();
            let secs = audio.audio.as_ref().unwrap().data.len() as f64
                / f64::from(fmt.sample_rate * 2 * fmt.channel_count);
            assert!(
                (secs - ms).abs() < 0.1,
                "{secs} s of audio for {ms} s heard"
            );
            assert_eq!(h[1].role, ChatMessageRole::Assistant as i32);
            assert_eq!(text_of(&h[1]), format!("You said: {text}"));
            assert_eq!(
                h[1].delivery_status,
                ChatDeliveryStatus::DeliveryComplete as i32
            );
        }
    });
    tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(runs))
        .await
        .unwrap();
    let uploads = uploads.lock().unwrap().clone();
    assert_eq!(uploads.len(), formats.len());
    for u in uploads {
        assert_eq!(u.model, "whisper-1");
        assert_eq!(u.auth.as_deref(), Some("Bearer sk-test"));
        assert_eq!((u.sample_rate, u.channels), (16_000, 1));
    }
    server.stop_within(WAIT).await;
}

#[tokio::test]
async fn trigger_inference_with_flush_vad_ends_the_utterance_at_once() {
    let (server, _) = start_with_fake_asr().await;
    let mut c = Client::initialized(
        server.addr,
        &SessionConfig::new(AudioFormat::SPEECH_16K, AudioFormat::SPEECH_16K),
    )
    .await;
    // The first two seconds: the user is still speaking when the client flushes.
    let speech = speech();
    let cut = 32_000;
    let sent = c.stream_audio(
        &encode(&speech[..cut], AudioFormat::SPEECH_16K),
        3_200,
        Duration::ZERO,
    );
    sent.await.unwrap();
    let msgs = c
        .until(|m| matches!(m, Down::VadStateEvent(e) if e.to_state == VadState::Speech as i32))
        .await;
    assert!(
        !msgs
            .iter()
            .any(|m| matches!(m, Down::UserTranscriptionResult(_)))
    );
    c.send(&ServiceBoundMessage::trigger_inference(None, true));
    let msgs = c.until(|m| matches!(m, Down::TurnSnapshot(_))).await;
    // The VAD reports the cut as a return to silence, then the cut utterance is transcribed
    // and answered: no trailing silence was needed.
    assert!(
        msgs.iter()
            .any(|m| matches!(m, Down::VadStateEvent(e) if e.to_state == VadState::Silence as i32))
    );
    let t = msgs
        .iter()
        .find_map(|m| match m {
            Down::UserTranscriptionResult(t) => Some(t.text.clone()),
            _ => None,
        })
        .expect("the flushed utterance is transcribed");
    let ms = heard_ms(&t) as f64 / 1000.0;
    let sent_speech = cut as f64 / 16_000.0 - SPEECH_START;
    assert!(
        ms > sent_speech - 0.2 && ms < sent_speech + 1.1,
        "{ms} s of {sent_speech} s"
    );
    let turn = response_begin(&msgs).unwrap();
    assert_eq!(fragments(&msgs, turn), format!("You said: {t}"));
    server.stop_within(WAIT).await;
}

/// A reply of `words` words: "You said: w1 w2 ...", about 220 ms of tone audio per word.
fn long_text(words: usize) -> String {
    (1..=words)
        .map(|i| format!("word{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Waits for one full spoken response and returns its turn id and the messages.
async fn spoken_response(c: &mut Client) -> (u32, Vec<Down>) {
    let msgs = c.until(|m| matches!(m, Down::ResponseEnd(_))).await;
    let turn = response_begin(&msgs).expect("ResponseBegin");
    assert!(msgs.iter().any(|m| matches!(m, Down::ModelAudioChunk(_))));
    (turn, msgs)
}

#[tokio::test]
async fn user_speech_during_a_reply_clears_playback_and_truncates_the_reply() {
    let (server, _) = start_with_fake_asr().await;
    let config = speaking(
        AudioFormat::SPEECH_16K,
        AudioFormat::SPEECH_16K,
        hosted_tts(),
    );
    let mut c = Client::initialized(server.addr, &config).await;
    let said = long_text(30);
    c.send(&ServiceBoundMessage::user_text(
        100,
        InferenceTriggerMode::Queue,
        said.clone(),
    ));
    // About 7 s of reply audio arrives at once; the server estimates playback from time.
    let (turn, _) = spoken_response(&mut c).await;
    // The user talks over it, in real time, from 0.2 s before their speech starts.
    let speech = speech();
    let from = (SPEECH_START * 16_000.0) as usize - 3_200;
    let sender = c.stream_audio(
        &encode(&speech[from..], AudioFormat::SPEECH_16K),
        640,
        Duration::from_millis(20),
    );
    let msgs = c.until(|m| matches!(m, Down::PlaybackClearBuffer(_))).await;
    assert!(
        msgs.iter()
            .any(|m| matches!(m, Down::VadStateEvent(e) if e.to_state == VadState::Speech as i32)),
        "the barge-in follows the user's speech: {msgs:?}"
    );
    // The cut reply's final record: what was heard of it, marked interrupted.
    let msgs = c.until(|m| matches!(m, Down::TurnSnapshot(_))).await;
    let cut = snapshot_of(&msgs, turn).expect("snapshot of the interrupted reply");
    assert_eq!(
        cut.delivery_status,
        ChatDeliveryStatus::DeliveryInterrupted as i32
    );
    // Interruption is not context truncation: the cut reply stays in the model's context.
    assert_eq!(cut.truncated_at_response_turn_id, None);
    let full = format!("You said: {said}");
    let heard = text_of(&cut);
    assert!(
        !heard.is_empty() && heard.len() < full.len() / 2 && full.starts_with(&heard),
        "heard {heard:?} of {full:?}"
    );
    // The user's utterance then becomes the next turn.
    sender.await.unwrap();
    let msgs = c.until(|m| matches!(m, Down::ResponseEnd(_))).await;
    let t = msgs
        .iter()
        .find_map(|m| match m {
            Down::UserTranscriptionResult(t) => Some(t.text.clone()),
            _ => None,
        })
        .expect("the barge-in utterance is transcribed");
    heard_ms(&t);
    let h = c.history(true).await;
    let roles: Vec<i32> = h.iter().map(|m| m.role).collect();
    use ChatMessageRole as R;
    assert_eq!(
        roles,
        [
            R::User as i32,
            R::Assistant as i32,
            R::User as i32,
            R::Assistant as i32
        ]
    );
    assert_eq!(text_of(&h[1]), heard);
    assert_eq!(
        h[1].delivery_status,
        ChatDeliveryStatus::DeliveryInterrupted as i32
    );
    server.stop_within(WAIT).await;
}

#[tokio::test]
async fn playback_reports_decide_what_an_interrupted_reply_kept() {
    let server = start(Config::default()).await;
    let out = AudioFormat::SPEECH_16K;
    let mut config = speaking(AudioFormat::SPEECH_16K, out, hosted_tts());
    config.supports_playback_reporting = true;
    let mut c = Client::initialized(server.addr, &config).await;
    let said = long_text(18);
    c.send(&ServiceBoundMessage::user_text(
        1,
        InferenceTriggerMode::Queue,
        said.clone(),
    ));
    let (turn, msgs) = spoken_response(&mut c).await;
    let total: usize = msgs
        .iter()
        .filter_map(|m| match m {
            Down::ModelAudioChunk(a) => Some(a.audio.as_ref().unwrap().data.len()),
            _ => None,
        })
        .sum();
    // 20 words of 220 ms at 16 kHz s16.
    assert_eq!(total, 20 * 3_520 * 2);
    // The client played a quarter, then the user interrupts by text.
    c.send(&ServiceBoundMessage::playback_report(
        (total / 4) as u64,
        Some(turn),
    ));
    c.send(&ServiceBoundMessage::user_text(
        2,
        InferenceTriggerMode::Immediate,
        "stop",
    ));
    let msgs = c
        .until(|m| matches!(m, Down::TurnSnapshot(s) if s.message.as_ref().unwrap().turn_id == Some(turn)))
        .await;
    assert!(
        msgs.iter()
            .any(|m| matches!(m, Down::PlaybackClearBuffer(_)))
    );
    let cut = snapshot_of(&msgs, turn).unwrap();
    let full = format!("You said: {said}");
    let heard = text_of(&cut);
    // A quarter of the audio: about a quarter of the words.
    let words = heard.split_whitespace().count();
    assert!(
        full.starts_with(&heard) && (4..=6).contains(&words),
        "heard {heard:?} of {full:?}"
    );
    assert_eq!(
        cut.delivery_status,
        ChatDeliveryStatus::DeliveryInterrupted as i32
    );
    // Interruption is not context truncation: the cut reply stays in the model's context.
    assert_eq!(cut.truncated_at_response_turn_id, None);
    // The interruption's own reply.
    let (next, msgs) = spoken_response(&mut c).await;
    assert_ne!(next, turn);
    // Nothing was announced as heard: reports drive progress, and none reached a sentence end.
    assert!(
        !msgs
            .iter()
            .any(|m| matches!(m, Down::ModelSpeechProgress(_))),
        "{msgs:?}"
    );
    // Report the end of playback: the sentence is heard (exactly), and the reply completes.
    // "You said: stop": three words of 220 ms at 16 kHz s16.
    c.send(&ServiceBoundMessage::playback_report(
        3 * 3_520 * 2,
        Some(next),
    ));
    let msgs = c.until(|m| matches!(m, Down::TurnSnapshot(_))).await;
    let progress: Vec<&proto::ModelSpeechProgress> = msgs
        .iter()
        .filter_map(|m| match m {
            Down::ModelSpeechProgress(p) => Some(p),
            _ => None,
        })
        .collect();
    assert_eq!(progress.len(), 1, "{msgs:?}");
    assert_eq!(
        (
            progress[0].turn_id,
            progress[0].text.as_str(),
            progress[0].audio_bytes_played,
            progress[0].exact
        ),
        (next, "You said: stop", 3 * 3_520 * 2, true)
    );
    let done = snapshot_of(&msgs, next).unwrap();
    assert_eq!(
        done.delivery_status,
        ChatDeliveryStatus::DeliveryComplete as i32
    );
    assert_eq!(text_of(&done), "You said: stop");
    let h = c.history(true).await;
    assert_eq!(text_of(&h[1]), heard);
    assert_eq!(
        h[1].delivery_status,
        ChatDeliveryStatus::DeliveryInterrupted as i32
    );
    server.stop_within(WAIT).await;
}

#[tokio::test]
async fn direct_speech_cancels_the_reply_and_speaks_verbatim() {
    let server = start(Config::default()).await;
    let config = speaking(
        AudioFormat::SPEECH_16K,
        AudioFormat::SPEECH_24K,
        hosted_tts(),
    );
    let mut c = Client::initialized(server.addr, &config).await;
    c.send(&ServiceBoundMessage::user_text(
        1,
        InferenceTriggerMode::Queue,
        long_text(20),
    ));
    let (first, _) = spoken_response(&mut c).await;
    // Speak over it, kept out of the model's context.
    c.send(&ServiceBoundMessage::direct_speech(
        "Please hold the line.",
        false,
        false,
    ));
    let msgs = c
        .until(|m| matches!(m, Down::ResponseEnd(e) if e.turn_id != first))
        .await;
    let clear = msgs
        .iter()
        .position(|m| matches!(m, Down::PlaybackClearBuffer(_)))
        .expect("the buffer is cleared first");
    let begin = msgs
        .iter()
        .position(|m| matches!(m, Down::ResponseBegin(_)))
        .unwrap();
    assert!(clear < begin);
    let Down::ResponseBegin(b) = &msgs[begin] else {
        unreachable!()
    };
    let spoken = b.turn_id;
    let bytes: usize = msgs[begin..]
        .iter()
        .filter_map(|m| match m {
            Down::ModelAudioChunk(a) => Some(a.audio.as_ref().unwrap().data.len()),
            _ => None,
        })
        .sum();
    // Four words of tone at 24 kHz s16 (resampled from 16 kHz), give or take the filter.
    let expected = 4 * 5_280 * 2;
    assert!(bytes.abs_diff(expected) < 400, "{bytes} bytes");
    // Announced once played (0.9 s), before the reply's final snapshot.
    let msgs = c
        .until(|m| matches!(m, Down::TurnSnapshot(s) if s.message.as_ref().unwrap().turn_id == Some(spoken)))
        .await;
    let progress: Vec<String> = msgs
        .iter()
        .filter_map(|m| match m {
            Down::ModelSpeechProgress(p) if p.turn_id == spoken => Some(p.text.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(progress, ["Please hold the line."]);
    let h = c.history(true).await;
    let direct = h
        .iter()
        .find(|m| m.turn_id == Some(spoken))
        .expect("direct speech in history");
    assert!(direct.ephemeral);
    assert_eq!(text_of(direct), "Please hold the line.");
    let cut = h.iter().find(|m| m.turn_id == Some(first)).unwrap();
    assert_eq!(
        cut.delivery_status,
        ChatDeliveryStatus::DeliveryInterrupted as i32
    );
    server.stop_within(WAIT).await;
}

#[tokio::test]
async fn reconfigure_switches_the_input_format_mid_session() {
    let (server, _) = start_with_fake_asr().await;
    let mut c = Client::initialized(
        server.addr,
        &SessionConfig::new(AudioFormat::SPEECH_16K, AudioFormat::SPEECH_24K),
    )
    .await;
    let speech = speech();
    // First turn at 16 kHz s16.
    c.stream_audio(
        &encode(&speech, AudioFormat::SPEECH_16K),
        3_200,
        Duration::from_millis(20),
    );
    let msgs = c.until(|m| matches!(m, Down::TurnSnapshot(_))).await;
    let first = check_audio_turn(&msgs, 16_000);
    // An unusable update is refused; the session keeps its format.
    let bad = proto::ReconfigureSessionRequest {
        input_audio_line: Some(proto::AudioLineConfiguration {
            sample_rate: 7,
            channel_count: 1,
            sample_format: proto::SampleFormat::Signed16Bit as i32,
        }),
        ..Default::default()
    };
    c.send(&ServiceBoundMessage {
        payload: Some(proto::service_bound_message::Payload::ReconfigureSessionRequest(bad)),
    });
    match c.next().await {
        Down::Error(e) => {
            assert_eq!(e.category, SessionErrorCategory::ErrorConfiguration as i32);
        }
        other => panic!("expected an error, got {other:?}"),
    }
    // The client switches to 48 kHz stereo float (and a new prompt).
    let format = AudioFormat::new(48_000, 2, proto::SampleFormat::Float32Bit).unwrap();
    c.send(&ServiceBoundMessage::reconfigure(&SessionUpdate {
        input: Some(format),
        inference: Some(voxgate_realtime::InferenceSettings::new("Be brief.", 0.5).unwrap()),
    }));
    c.stream_audio(
        &encode(&speech, format),
        bytes_for(format, 0.1),
        Duration::from_millis(20),
    );
    let msgs = c.until(|m| matches!(m, Down::TurnSnapshot(_))).await;
    let second = check_audio_turn(&msgs, 48_000);
    // Both utterances were the same speech: the same length heard, give or take a frame.
    assert!(
        heard_ms(&first).abs_diff(heard_ms(&second)) < 100,
        "{first} / {second}"
    );
    c.send(&ServiceBoundMessage::ping());
    assert!(matches!(c.next().await, Down::Pong(_)));
    server.stop_within(WAIT).await;
}

// ---- fake ElevenLabs ------------------------------------------------------------------------

/// One synthesis request the fake ElevenLabs received.
#[derive(Debug, Clone)]
struct TtsCall {
    voice: String,
    query: String,
    key: Option<String>,
    body: serde_json::Value,
}

/// Samples the fake speaks for `text` at `rate`: 40 ms per character.
fn fake_speech_len(text: &str, rate: u32) -> usize {
    text.chars().count() * rate as usize / 25
}

/// A local stand-in for ElevenLabs' `POST /v1/text-to-speech/{voice_id}/stream
/// ?output_format=pcm_<rate>` (key in `xi-api-key`, JSON body, headerless 16-bit little-endian
/// PCM streamed back in chunks). Only the key `xi-good` is accepted; others get the 401
/// ElevenLabs sends for an invalid key.
async fn fake_elevenlabs() -> (String, Arc<Mutex<Vec<TtsCall>>>) {
    use axum::extract::{Path, RawQuery};
    use axum::response::IntoResponse;
    let seen: Arc<Mutex<Vec<TtsCall>>> = Arc::default();
    let s2 = Arc::clone(&seen);
    let router = axum::Router::new().route(
        "/v1/text-to-speech/{voice}/stream",
        axum::routing::post(
            move |Path(voice): Path<String>,
                  RawQuery(query): RawQuery,
                  headers: HeaderMap,
                  body: Bytes| {
                let seen = Arc::clone(&s2);
                async move {
                    let call = TtsCall {
                        voice,
                        query: query.unwrap_or_default(),
                        key: headers
                            .get("xi-api-key")
                            .map(|v| v.to_str().unwrap().to_owned()),
                        body: serde_json::from_slice(&body).unwrap(),
                    };
                    seen.lock().unwrap().push(call.clone());
                    if call.key.as_deref() != Some("xi-good") {
                        let detail = serde_json::json!({"detail": {
                            "status": "invalid_api_key", "message": "Invalid API key"}});
                        return (
                            axum::http::StatusCode::UNAUTHORIZED,
                            [("content-type", "application/json")],
                            detail.to_string(),
                        )
                            .into_response();
                    }
                    let rate: u32 = call
                        .query
                        .split('&')
                        .find_map(|kv| kv.strip_prefix("output_format=pcm_"))
                        .unwrap()
                        .parse()
                        .unwrap();
                    let text = call.body["text"].as_str().unwrap().to_owned();
                    let pcm: Vec<u8> = (0..fake_speech_len(&text, rate))
                        .flat_map(|i| {
                            let t = i as f64 / f64::from(rate);
                            let v = (t * 440.0 * std::f64::consts::TAU).sin() * 8_000.0;
                            (v as i16).to_le_bytes()
                        })
                        .collect();
                    // Streamed in odd-sized pieces, as a network would split it.
                    let pieces: Vec<Vec<u8>> = pcm.chunks(3_001).map(<[u8]>::to_vec).collect();
                    let stream = futures::stream::iter(pieces).then(|p| async move {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        Ok::<_, std::io::Error>(p)
                    });
                    ([("content-type", "audio/pcm")], Body::from_stream(stream)).into_response()
                }
            },
        ),
    );
    (serve(router).await, seen)
}

/// A server whose ElevenLabs API is a fresh fake (see [`fake_elevenlabs`]), and the calls it
/// gets.
async fn start_with_fake_elevenlabs() -> (Running, Arc<Mutex<Vec<TtsCall>>>) {
    let (eleven, calls) = fake_elevenlabs().await;
    let mut config = Config::default();
    config.realtime.elevenlabs_base_url = Some(eleven);
    (start(config).await, calls)
}

fn elevenlabs(key: &str) -> TtsSettings {
    TtsSettings::ElevenLabs(
        ElevenLabsSettings::new(key, "voice_123")
            .unwrap()
            .with_model_id("eleven_flash_v2_5")
            .unwrap()
            .with_voice_settings(VoiceSettings::new(0.5, 0.75, 0.1, true, 1.1).unwrap())
            .with_location(proto::ElevenLabsLocation::Eu),
    )
}

#[tokio::test]
async fn elevenlabs_tts_chosen_by_the_client_speaks_in_the_output_format() {
    let (server, calls) = start_with_fake_elevenlabs().await;
    let out = AudioFormat::new(24_000, 1, proto::SampleFormat::Float32Bit).unwrap();
    let config = speaking(AudioFormat::SPEECH_16K, out, elevenlabs("xi-good"));
    let mut c = Client::initialized(server.addr, &config).await;
    c.send(&ServiceBoundMessage::user_text(
        1,
        InferenceTriggerMode::Queue,
        "Hello there. How are you today?",
    ));
    let t0 = tokio::time::Instant::now();
    let msgs = c.until(|m| matches!(m, Down::TurnSnapshot(_))).await;
    let turn = response_begin(&msgs).unwrap();
    let calls = calls.lock().unwrap().clone();
    assert!(!calls.is_empty());
    // Every request carries the client's own settings, at the client's output rate.
    for call in &calls {
        assert_eq!(call.voice, "voice_123");
        assert_eq!(call.query, "output_format=pcm_24000");
        assert_eq!(call.key.as_deref(), Some("xi-good"));
        assert_eq!(call.body["model_id"], "eleven_flash_v2_5");
        let vs = &call.body["voice_settings"];
        assert_eq!(
            (
                vs["stability"].as_f64(),
                vs["speed"].as_f64(),
                vs["use_speaker_boost"].as_bool()
            ),
            (Some(0.5), Some(1.1), Some(true))
        );
    }
    let spoken: Vec<String> = calls
        .iter()
        .map(|c| c.body["text"].as_str().unwrap().to_owned())
        .collect();
    // The demo agent's leading emoji is never spoken.
    assert_eq!(
        spoken.join(" "),
        "You said: Hello there. How are you today?"
    );
    let bytes: usize = msgs
        .iter()
        .filter_map(|m| match m {
            Down::ModelAudioChunk(a) => Some(a.audio.as_ref().unwrap().data.len()),
            _ => None,
        })
        .sum();
    // 24 kHz in and out: every sample the fake sent, as f32.
    let samples: usize = spoken.iter().map(|t| fake_speech_len(t, 24_000)).sum();
    assert_eq!(bytes, samples * 4);
    // Progress (after the fact, read by the message order above): one per sentence once its
    // audio has played, with the playback position where it ends; the texts concatenate to
    // what was spoken.
    let progress: Vec<&proto::ModelSpeechProgress> = msgs
        .iter()
        .filter_map(|m| match m {
            Down::ModelSpeechProgress(p) => Some(p),
            _ => None,
        })
        .collect();
    let mut end = 0u64;
    for (p, text) in progress.iter().zip(&spoken) {
        end += fake_speech_len(text, 24_000) as u64 * 4;
        assert_eq!(
            (p.turn_id, p.audio_bytes_played, p.exact),
            (turn, end, false)
        );
    }
    let shown: String = progress.iter().map(|p| p.text.as_str()).collect();
    assert_eq!(shown, spoken.join(" "));
    // Paced: the last announcement waited for the estimated end of playback.
    let played = Duration::from_secs_f64(samples as f64 / 24_000.0);
    assert!(
        t0.elapsed() + Duration::from_millis(50) >= played,
        "{:?}",
        t0.elapsed()
    );
    server.stop_within(WAIT).await;
}

#[tokio::test]
async fn a_rejected_elevenlabs_key_is_a_tts_error_and_the_session_goes_on() {
    let (server, calls) = start_with_fake_elevenlabs().await;
    let config = speaking(
        AudioFormat::SPEECH_16K,
        AudioFormat::SPEECH_16K,
        elevenlabs("xi-bad"),
    );
    let mut c = Client::initialized(server.addr, &config).await;
    c.send(&ServiceBoundMessage::user_text(
        1,
        InferenceTriggerMode::Queue,
        "Say something.",
    ));
    let msgs = c.until(|m| matches!(m, Down::Error(_))).await;
    let Some(Down::Error(e)) = msgs.last() else {
        unreachable!()
    };
    assert_eq!(e.category, SessionErrorCategory::ErrorTts as i32);
    // The provider's answer (status, body) stays in the server log under the id: the message
    // is the generic sentence and a 16-digit hex id, nothing else. (Not "does not contain
    // 401": a random id contains it one time in a few hundred.)
    let id = e
        .message
        .strip_prefix("speech synthesis failed (error id ")
        .and_then(|rest| rest.strip_suffix(')'));
    assert!(
        id.is_some_and(|id| id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit())),
        "{}",
        e.message
    );
    assert!(!calls.lock().unwrap().is_empty());
    c.send(&ServiceBoundMessage::ping());
    c.until(|m| matches!(m, Down::Pong(_))).await;
    server.stop_within(WAIT).await;
}

#[tokio::test]
async fn realtime_clients_never_see_the_reply_emoji() {
    let server = start(Config::default()).await;
    let mut c = Client::initialized(
        server.addr,
        &SessionConfig::new(AudioFormat::SPEECH_24K, AudioFormat::SPEECH_24K),
    )
    .await;
    // The demo agent answers "😊 You said: ..."; a text client gets the words only, and the
    // history records exactly what it got.
    c.send(&ServiceBoundMessage::user_text(
        1,
        InferenceTriggerMode::Queue,
        "good morning",
    ));
    let msgs = c.until(|m| matches!(m, Down::TurnSnapshot(_))).await;
    let turn = response_begin(&msgs).unwrap();
    let shown = fragments(&msgs, turn);
    assert_eq!(shown, "You said: good morning");
    assert!(!has_emoji(&shown));
    assert_eq!(text_of(&snapshot_of(&msgs, turn).unwrap()), shown);
    let h = c.history(true).await;
    assert_eq!(text_of(&h[1]), shown);
    server.stop_within(WAIT).await;
}

// ---- fake OpenAI chat completions ----------------------------------------------------------

/// A local stand-in for OpenAI's streaming `POST /v1/chat/completions` (server-sent events of
/// `chat.completion.chunk`s, then `[DONE]`). It records each request and answers with the
/// number of the request: "Reply 1.", "Reply 2."...
async fn fake_llm() -> (String, Arc<Mutex<Vec<serde_json::Value>>>) {
    fake_llm_saying(|n| format!("{n}.")).await
}

/// [`fake_llm`] whose reply to the `n`th request is "Reply " and `rest(n)`.
async fn fake_llm_saying(
    rest: fn(usize) -> String,
) -> (String, Arc<Mutex<Vec<serde_json::Value>>>) {
    let seen: Arc<Mutex<Vec<serde_json::Value>>> = Arc::default();
    let s2 = Arc::clone(&seen);
    let router = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move |body: Bytes| {
            let seen = Arc::clone(&s2);
            async move {
                let request: serde_json::Value = serde_json::from_slice(&body).unwrap();
                assert_eq!(request["stream"], true);
                let n = {
                    let mut seen = seen.lock().unwrap();
                    seen.push(request);
                    seen.len()
                };
                let chunk = |delta: serde_json::Value, finish: Option<&str>| {
                    let c = serde_json::json!({"id": "c", "object": "chat.completion.chunk",
                        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
                    format!("data: {c}\n\n")
                };
                let sse = [
                    chunk(
                        serde_json::json!({"role": "assistant", "content": ""}),
                        None,
                    ),
                    chunk(serde_json::json!({"content": "Reply "}), None),
                    chunk(serde_json::json!({"content": rest(n)}), None),
                    chunk(serde_json::json!({}), Some("stop")),
                    "data: [DONE]\n\n".to_owned(),
                ]
                .concat();
                ([("content-type", "text/event-stream")], sse)
            }
        }),
    );
    (serve(router).await, seen)
}

fn system_prompt(request: &serde_json::Value) -> &str {
    let first = &request["messages"][0];
    assert_eq!(first["role"], "system");
    first["content"].as_str().unwrap()
}

#[tokio::test]
async fn reconfigured_prompt_and_instructions_reach_the_model() {
    let (llm, requests) = fake_llm().await;
    let server_config = Config {
        llm: Some(voxgate_server::config::LlmConfig {
            base_url: Some(format!("{llm}/v1")),
            model: Some("gpt-test".into()),
            ..voxgate_server::config::LlmConfig::default()
        }),
        ..Config::default()
    };
    let server = start(server_config).await;
    let mut config = SessionConfig::new(AudioFormat::SPEECH_24K, AudioFormat::SPEECH_24K);
    config.inference = voxgate_realtime::InferenceSettings::new("You are Ada.", 0.3).unwrap();
    let mut c = Client::initialized(server.addr, &config).await;
    c.send(&ServiceBoundMessage::user_text(
        1,
        InferenceTriggerMode::Queue,
        "hi",
    ));
    let msgs = c.until(|m| matches!(m, Down::TurnSnapshot(_))).await;
    assert_eq!(fragments(&msgs, response_begin(&msgs).unwrap()), "Reply 1.");
    // New prompt and temperature from the next request on; history is kept.
    c.send(&ServiceBoundMessage::reconfigure(&SessionUpdate {
        input: None,
        inference: Some(voxgate_realtime::InferenceSettings::new("You are Bob.", 0.9).unwrap()),
    }));
    c.send(&ServiceBoundMessage::user_text(
        2,
        InferenceTriggerMode::Queue,
        "again",
    ));
    let msgs = c.until(|m| matches!(m, Down::TurnSnapshot(_))).await;
    assert_eq!(fragments(&msgs, response_begin(&msgs).unwrap()), "Reply 2.");
    // A greeting-style trigger with extra instructions.
    c.send(&ServiceBoundMessage::trigger_inference(
        Some("Say goodbye.".into()),
        false,
    ));
    let msgs = c.until(|m| matches!(m, Down::TurnSnapshot(_))).await;
    assert_eq!(fragments(&msgs, response_begin(&msgs).unwrap()), "Reply 3.");
    // A query with instructions only.
    c.send(&ServiceBoundMessage::conversation_query(None, Some("One word.".into())).unwrap());
    match c.next().await {
        Down::ConversationQueryResult(r) => assert_eq!(r.text, "Reply 4."),
        other => panic!("expected ConversationQueryResult, got {other:?}"),
    }
    let requests = requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 4);
    assert_eq!(requests[0]["model"], "gpt-test");
    assert_eq!(system_prompt(&requests[0]), "You are Ada.");
    assert!((requests[0]["temperature"].as_f64().unwrap() - 0.3).abs() < 1e-6);
    assert_eq!(system_prompt(&requests[1]), "You are Bob.");
    assert!((requests[1]["temperature"].as_f64().unwrap() - 0.9).abs() < 1e-6);
    let texts = |r: &serde_json::Value| -> Vec<String> {
        r["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["content"].as_str().map(str::to_owned))
            .collect()
    };
    // The conversation so far reaches the model, with the instructions in the third request.
    assert!(
        texts(&requests[1]).contains(&"Reply 1.".to_owned()),
        "{:?}",
        requests[1]
    );
    assert!(
        texts(&requests[2])
            .iter()
            .any(|t| t.contains("Say goodbye.")),
        "{:?}",
        requests[2]
    );
    assert!(
        texts(&requests[3]).iter().any(|t| t.contains("One word.")),
        "{:?}",
        requests[3]
    );
    // History records the instructions.
    let h = c.history(true).await;
    assert!(h.iter().any(|m| {
        m.content
            .iter()
            .any(|c| matches!(&c.content, Some(Content::Instructions(i)) if i == "Say goodbye."))
    }));
    server.stop_within(WAIT).await;
}

#[tokio::test]
async fn an_unusable_elevenlabs_voice_is_a_fatal_configuration_error() {
    let server = start(Config::default()).await;
    let mut c = Client::connect(server.addr).await;
    let config = speaking(
        AudioFormat::SPEECH_16K,
        AudioFormat::SPEECH_16K,
        TtsSettings::ElevenLabs(ElevenLabsSettings::new("xi-good", "../../v1/user").unwrap()),
    );
    c.send(&ServiceBoundMessage::initialize(&config).unwrap());
    match c.next().await {
        Down::Error(e) => {
            assert_eq!(e.category, SessionErrorCategory::ErrorConfiguration as i32);
            assert!(e.message.contains("eleven_labs"), "{}", e.message);
            assert!(!e.message.contains("xi-good"), "the key stays secret");
        }
        other => panic!("expected an error, got {other:?}"),
    }
    assert!(
        c.recv().await.is_none(),
        "the server closes after a fatal error"
    );
    server.stop_within(WAIT).await;
}

// ---- trigger modes of audio input -----------------------------------------------------------

fn transcription(msgs: &[Down]) -> Option<String> {
    msgs.iter().find_map(|m| match m {
        Down::UserTranscriptionResult(t) => Some(t.text.clone()),
        _ => None,
    })
}

#[tokio::test]
async fn no_trigger_speech_is_transcribed_and_answered_only_after_trigger_inference() {
    let (server, uploads) = start_with_fake_asr().await;
    let mut c = Client::initialized(
        server.addr,
        &SessionConfig::new(AudioFormat::SPEECH_16K, AudioFormat::SPEECH_16K),
    )
    .await;
    // 100 ms packets at five times real time, every one NO_TRIGGER.
    c.stream_audio_as(
        &encode(&speech(), AudioFormat::SPEECH_16K),
        3_200,
        Duration::from_millis(20),
        InferenceTriggerMode::NoTrigger,
    );
    let msgs = c
        .until(|m| matches!(m, Down::UserTranscriptionResult(_)))
        .await;
    let said = transcription(&msgs).unwrap();
    heard_ms(&said);
    assert_eq!(uploads.lock().unwrap().len(), 1);
    // Committed, but nothing answers it by itself.
    let quiet = c.during(Duration::from_millis(1500)).await;
    assert!(
        !msgs.iter().chain(&quiet).any(|m| matches!(
            m,
            Down::ResponseBegin(_) | Down::ModelTextFragment(_) | Down::PlaybackClearBuffer(_)
        )),
        "{msgs:?} {quiet:?}"
    );
    let h = c.history(true).await;
    assert_eq!(h.len(), 1, "{h:?}");
    assert_eq!(h[0].role, ChatMessageRole::User as i32);
    let user_turn = h[0].turn_id.unwrap();
    // TriggerInference answers the spoken turn.
    c.send(&ServiceBoundMessage::trigger_inference(None, false));
    let msgs = c.until(|m| matches!(m, Down::TurnSnapshot(_))).await;
    let turn = response_begin(&msgs).expect("a reply after TriggerInference");
    assert!(turn > user_turn);
    assert_eq!(fragments(&msgs, turn), format!("You said: {said}"));
    assert!(transcription(&msgs).is_none(), "transcribed once: {msgs:?}");
    let h = c.history(true).await;
    let roles: Vec<i32> = h.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [
            ChatMessageRole::User as i32,
            ChatMessageRole::Assistant as i32
        ]
    );
    server.stop_within(WAIT).await;
}

#[tokio::test]
async fn queued_speech_during_a_reply_keeps_it_playing_and_is_answered_after_it() {
    let (server, _) = start_with_fake_asr().await;
    let config = speaking(
        AudioFormat::SPEECH_16K,
        AudioFormat::SPEECH_16K,
        hosted_tts(),
    );
    let mut c = Client::initialized(server.addr, &config).await;
    let said = long_text(14);
    c.send(&ServiceBoundMessage::user_text(
        100,
        InferenceTriggerMode::Queue,
        said.clone(),
    ));
    // About 3.5 s of reply audio arrives at once; the server estimates playback from time.
    let (first, _) = spoken_response(&mut c).await;
    let sent_at = tokio::time::Instant::now();
    // The user talks over it with QUEUE audio, at five times real time (about a second).
    let from = (SPEECH_START * 16_000.0) as usize - 3_200;
    let sender = c.stream_audio_as(
        &encode(&speech()[from..], AudioFormat::SPEECH_16K),
        3_200,
        Duration::from_millis(20),
        InferenceTriggerMode::Queue,
    );
    let msgs = c
        .until(|m| matches!(m, Down::ResponseBegin(b) if b.turn_id != first))
        .await;
    sender.await.unwrap();
    assert!(
        msgs.iter()
            .any(|m| matches!(m, Down::VadStateEvent(e) if e.to_state == VadState::Speech as i32)),
        "the speech was heard: {msgs:?}"
    );
    assert!(
        !msgs
            .iter()
            .any(|m| matches!(m, Down::PlaybackClearBuffer(_))),
        "QUEUE speech never clears playback: {msgs:?}"
    );
    // The first reply played to its end, then the speech was committed and answered.
    let done = msgs
        .iter()
        .position(|m| matches!(m, Down::TurnSnapshot(s) if s.message.as_ref().unwrap().turn_id == Some(first)))
        .expect("the first reply's final snapshot");
    let Down::TurnSnapshot(s) = &msgs[done] else {
        unreachable!()
    };
    let s = s.message.as_ref().unwrap();
    assert_eq!(
        s.delivery_status,
        ChatDeliveryStatus::DeliveryComplete as i32
    );
    assert_eq!(text_of(s), format!("You said: {said}"));
    let heard = msgs
        .iter()
        .position(|m| matches!(m, Down::UserTranscriptionResult(_)))
        .expect("the queued speech is transcribed");
    assert!(done < heard, "committed after the reply finished");
    assert!(
        sent_at.elapsed() >= Duration::from_secs(3),
        "answered only after the reply's ~3.5 s of playback ({:?})",
        sent_at.elapsed()
    );
    let Some(Down::ResponseBegin(b)) = msgs.last() else {
        unreachable!()
    };
    let second = b.turn_id;
    let rest = c.until(|m| matches!(m, Down::ResponseEnd(_))).await;
    assert!(rest.iter().any(|m| matches!(m, Down::ModelAudioChunk(_))));
    assert!(
        !rest
            .iter()
            .any(|m| matches!(m, Down::PlaybackClearBuffer(_)))
    );
    let h = c.history(true).await;
    let roles: Vec<i32> = h.iter().map(|m| m.role).collect();
    use ChatMessageRole as R;
    assert_eq!(
        roles,
        [
            R::User as i32,
            R::Assistant as i32,
            R::User as i32,
            R::Assistant as i32
        ]
    );
    assert_eq!(
        h[1].delivery_status,
        ChatDeliveryStatus::DeliveryComplete as i32
    );
    let said = transcription(&msgs).unwrap();
    heard_ms(&said);
    assert_eq!(h[3].turn_id, Some(second));
    server.stop_within(WAIT).await;
}

#[tokio::test]
async fn no_trigger_speech_during_a_reply_neither_cuts_it_nor_gets_a_reply() {
    let (server, _) = start_with_fake_asr().await;
    let config = speaking(
        AudioFormat::SPEECH_16K,
        AudioFormat::SPEECH_16K,
        hosted_tts(),
    );
    let mut c = Client::initialized(server.addr, &config).await;
    c.send(&ServiceBoundMessage::user_text(
        100,
        InferenceTriggerMode::Queue,
        long_text(14),
    ));
    let (first, _) = spoken_response(&mut c).await;
    let from = (SPEECH_START * 16_000.0) as usize - 3_200;
    let sender = c.stream_audio_as(
        &encode(&speech()[from..], AudioFormat::SPEECH_16K),
        3_200,
        Duration::from_millis(20),
        InferenceTriggerMode::NoTrigger,
    );
    let msgs = c
        .until(|m| matches!(m, Down::UserTranscriptionResult(_)))
        .await;
    sender.await.unwrap();
    let done = snapshot_of(&msgs, first).expect("the reply finished before the commit");
    assert_eq!(
        done.delivery_status,
        ChatDeliveryStatus::DeliveryComplete as i32
    );
    let quiet = c.during(Duration::from_millis(1500)).await;
    assert!(
        !msgs
            .iter()
            .chain(&quiet)
            .any(|m| matches!(m, Down::PlaybackClearBuffer(_) | Down::ResponseBegin(_))),
        "{msgs:?} {quiet:?}"
    );
    let h = c.history(true).await;
    let roles: Vec<i32> = h.iter().map(|m| m.role).collect();
    use ChatMessageRole as R;
    assert_eq!(roles, [R::User as i32, R::Assistant as i32, R::User as i32]);
    // A QUEUE text answers with the spoken turn in context.
    c.send(&ServiceBoundMessage::user_text(
        101,
        InferenceTriggerMode::Queue,
        "so?",
    ));
    let (next, _) = spoken_response(&mut c).await;
    assert!(next > first);
    server.stop_within(WAIT).await;
}

/// Streams silence in 20 ms packets at real time until the returned sender is dropped, as a
/// client with an open microphone does (the Deepslate plugins stream it throughout).
fn open_microphone(c: &mut Client) -> tokio::sync::oneshot::Sender<()> {
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let tx = c.tx.clone();
    let first = c.next_packet;
    c.next_packet += 1_000_000;
    let silence = encode(&[0.0; 320], AudioFormat::SPEECH_16K);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        for id in first.. {
            tokio::select! {
                _ = tick.tick() => {}
                _ = &mut stopped => return,
            }
            let m = ServiceBoundMessage::user_audio(
                id,
                InferenceTriggerMode::Immediate,
                silence.clone().into(),
            );
            if tx.send(Message::Binary(m.to_frame())).is_err() {
                return;
            }
        }
    });
    stop
}

/// What the Deepslate Pipecat and LiveKit plugins hit: after a spoken turn in a TTS session
/// whose reply asks a question, a reply request sent once the reply has played (its progress
/// and final snapshot are in) is answered, with and without a NO_TRIGGER text before it,
/// while the microphone stays open. (It used to wait for the user's answer, up to the
/// turn machine's listen timeout, and was then dropped.)
#[tokio::test]
async fn a_reply_request_after_a_played_spoken_reply_is_answered() {
    let (asr, _) = fake_asr().await;
    let (llm, _) = fake_llm_saying(|n| format!("{n}. Anything else?")).await;
    let mut server_config = with_asr(&asr);
    server_config.llm = Some(voxgate_server::config::LlmConfig {
        base_url: Some(format!("{llm}/v1")),
        model: Some("test-model".into()),
        ..voxgate_server::config::LlmConfig::default()
    });
    for (pause, with_text) in [(1_000, false), (4_000, true)] {
        let server = start(server_config.clone()).await;
        let config = speaking(
            AudioFormat::SPEECH_16K,
            AudioFormat::SPEECH_16K,
            hosted_tts(),
        );
        let mut c = Client::initialized(server.addr, &config).await;
        // The spoken question at real time, then the open microphone's silence.
        let sender = c.stream_audio(
            &encode(&speech(), AudioFormat::SPEECH_16K),
            640,
            Duration::from_millis(20),
        );
        let msgs = c.until(|m| matches!(m, Down::ResponseBegin(_))).await;
        assert!(transcription(&msgs).is_some(), "{msgs:?}");
        let turn = response_begin(&msgs).unwrap();
        sender.await.unwrap();
        let _mic = open_microphone(&mut c);
        // Played: every sentence announced and the final snapshot in.
        let msgs = c
            .until(|m| matches!(m, Down::TurnSnapshot(s) if s.is_final))
            .await;
        let done = snapshot_of(&msgs, turn).expect("the reply's final snapshot");
        assert_eq!(
            done.delivery_status,
            ChatDeliveryStatus::DeliveryComplete as i32
        );
        let quiet = c.during(Duration::from_millis(pause)).await;
        assert!(
            !quiet.iter().any(|m| matches!(m, Down::ResponseBegin(_))),
            "{quiet:?}"
        );
        if with_text {
            c.send(&ServiceBoundMessage::user_text(
                200,
                InferenceTriggerMode::NoTrigger,
                "tell me more",
            ));
        }
        c.send(&ServiceBoundMessage::trigger_inference(
            Some("Answer briefly.".into()),
            false,
        ));
        let answer = tokio::time::timeout(
            Duration::from_secs(5),
            c.until(|m| matches!(m, Down::ResponseBegin(_))),
        )
        .await;
        let msgs = answer.unwrap_or_else(|_| {
            panic!("no reply within 5 s to a trigger {pause} ms after the played reply")
        });
        let next = response_begin(&msgs).unwrap();
        assert!(next > turn);
        server.stop_within(WAIT).await;
    }
}
