//! One Xiaozhi device connection.
//!
//! Like the realtime door, one task owns one [`Engine`]: a reader task turns WebSocket messages
//! into a bounded queue (uplink audio is dropped and counted when it is full, JSON waits), a
//! writer task sends from another bounded queue (reply audio is dropped and counted when the
//! device does not keep up, JSON waits). The session loop feeds device messages, provider
//! events and deadlines into the engine and turns its outputs into the device protocol:
//!
//! - `ResponseBegin` → `tts start`; `Emotion` → `llm`; `UserTranscription` → `stt`;
//! - `SentenceStart` + `AudioChunk`s → the sentence's `tts sentence_start` followed by its Opus
//!   frames (resampled to the announced rate, cut into announced-length frames and encoded as
//!   they arrive), released by a [`Pacer`] (a lead burst, then real time) and framed by the
//!   device's protocol version on release. The subtitle rides with the first frame of its audio
//!   so it shows when the sentence plays;
//! - `ResponseFinished` → `tts stop` once the paced audio has played out; `ClearPlayback`
//!   (barge-in, abort, manual listen) → queued audio dropped and `tts stop` at once;
//! - `DeviceMcp` → an `mcp` envelope (`initialize` gains the `vision` capability).
//!
//! The Xiaozhi protocol has no error message: malformed, unknown, out-of-order and oversized
//! frames are logged, counted in `voxgate_errors_total{door="xiaozhi"}` and ignored, and the
//! session goes on. A connection without a valid `hello` within `hello_timeout_ms`, or silent
//! for `idle_timeout_secs`, is closed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ws::{Message, WebSocket};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use voxgate_audio::format::{f32_to_i16, i16_to_f32};
use voxgate_audio::opus::{
    FrameDuration, OpusBackend, OpusDecoder, OpusEncoder, OpusEncoderConfig, OpusError,
};
use voxgate_audio::pacer::{Pacer, PacerConfig};
use voxgate_audio::resample::Resampler;
use voxgate_engine::{
    ClientEvent, Engine, EngineConfig, Input, Output, ProviderEvent, TriggerMode,
};
use voxgate_xiaozhi::control::{
    AudioParams, DeviceHello, DeviceMessage, Listen, ListenMode, ListenState, Llm, Mcp,
    ServerHello, ServerMessage, Stt, Tts,
};
use voxgate_xiaozhi::frame::{Frame, FrameCodec, ProtocolVersion};

use crate::metrics::{Direction, Door, Metrics};
use crate::providers::Runner;
use crate::server::App;

use super::XiaozhiConfig;

/// What the upgrade request told us about the device.
#[derive(Debug, Clone)]
pub(crate) struct ConnInfo {
    /// The framing from `Protocol-Version`, when the device sent one.
    pub(crate) framing: Option<ProtocolVersion>,
    /// `Device-Id`, for logs.
    pub(crate) device_id: Option<String>,
    /// MCP `vision.url`.
    pub(crate) vision_url: String,
    /// MCP `vision.token`.
    pub(crate) vision_token: String,
}

enum Incoming {
    Text(String),
    Binary(Bytes),
    Oversized { len: usize, binary: bool },
}

const IN_QUEUE: usize = 64;
const OUT_QUEUE: usize = 256;
/// Reply frames held by the pacer: 2 minutes of 60 ms frames.
const PACER_CAPACITY: usize = 2_000;
/// Reply audio is converted and resampled this many samples at a time.
const PUSH_SLICE: usize = 1024;
/// Uplink Opus is always decoded at the VAD's rate (Opus decodes to any rate).
const INPUT_RATE: u32 = 16_000;

/// Serves one upgraded connection until the device leaves, a timeout, or shutdown.
pub(crate) async fn serve(socket: WebSocket, app: Arc<App>, info: ConnInfo) {
    let metrics = Arc::clone(&app.metrics);
    let _active = metrics.session(Door::Xiaozhi);
    let (mut sink, mut stream) = socket.split();
    let (in_tx, in_rx) = mpsc::channel::<Incoming>(IN_QUEUE);
    let (out_tx, mut out_rx) = mpsc::channel::<Message>(OUT_QUEUE);

    let reader_metrics = Arc::clone(&metrics);
    let max = app.config.max_frame_bytes;
    let reader = tokio::spawn(async move {
        // Errors (a dropped TCP connection, code 1006) end the session like a close.
        while let Some(Ok(msg)) = stream.next().await {
            let incoming = match msg {
                Message::Binary(b) if b.len() > max => Incoming::Oversized {
                    len: b.len(),
                    binary: true,
                },
                Message::Text(t) if t.len() > max => Incoming::Oversized {
                    len: t.len(),
                    binary: false,
                },
                Message::Binary(b) => {
                    match in_tx.try_send(Incoming::Binary(b)) {
                        Err(mpsc::error::TrySendError::Full(_)) => {
                            reader_metrics.dropped(Door::Xiaozhi, Direction::Uplink, 1);
                        }
                        Err(mpsc::error::TrySendError::Closed(_)) => break,
                        Ok(()) => {}
                    }
                    continue;
                }
                Message::Text(t) => Incoming::Text(t.as_str().to_owned()),
                Message::Close(_) => break,
                Message::Ping(_) | Message::Pong(_) => continue,
            };
            if in_tx.send(incoming).await.is_err() {
                break;
            }
        }
    });
    let writer = tokio::spawn(async move {
        while let Some(msg) = out_rx.recv().await {
            if sink.send(msg).await.is_err() {
                return;
            }
        }
        let _ = sink.close().await;
    });

    let (runner, provider_rx) = Runner::new(app.providers.clone(), Arc::clone(&metrics));
    let now = Instant::now();
    let mut conn = Conn {
        config: Arc::clone(&app),
        out: out_tx,
        metrics: Arc::clone(&metrics),
        runner,
        info,
        session: None,
        hello_deadline: now + Duration::from_millis(app.config.xiaozhi.hello_timeout_ms),
        last_rx: now,
        stops: 0,
    };
    conn.run(in_rx, provider_rx, app.shutdown.clone()).await;
    // Dropping the connection aborts provider work and closes the writer's queue, which
    // closes the socket.
    drop(conn);
    reader.abort();
    let _ = writer.await;
}

#[derive(Debug, PartialEq, Eq)]
enum Flow {
    Continue,
    Close,
}

struct Conn {
    config: Arc<App>,
    out: mpsc::Sender<Message>,
    metrics: Arc<Metrics>,
    runner: Runner,
    info: ConnInfo,
    session: Option<Session>,
    hello_deadline: Instant,
    last_rx: Instant,
    /// `tts stop` messages sent, so an abort answered by the engine's stop is not answered twice.
    stops: u64,
}

/// A paced downlink item: a frame, and the subtitle to show when it starts playing.
///
/// Frames are queued encoded: a reply synthesized faster than real time waits in the pacer as
/// Opus packets (about 180 bytes per 60 ms at 24 kbit/s) rather than PCM (2.9 KB), which keeps a
/// long reply from costing hundreds of kilobytes per session. The framing (and the v2 timestamp)
/// is added on release, so audio dropped by a barge-in leaves no gap in the timestamps.
struct Paced {
    subtitle: Option<String>,
    /// One Opus packet of the announced frame length; `None` for a subtitle without audio.
    packet: Option<Bytes>,
}

/// What turns reply audio into Opus packets: it exists only from a response's first audio to
/// its end. The pure-Rust encoder alone holds about 310 KB of fixed buffers, and replies are
/// encoded as fast as the TTS delivers them (the pacer then holds packets), so keeping it only
/// for that stretch is most of the difference between an idle and a speaking session's memory.
struct Downlink {
    encoder: OpusEncoder,
    resampler: Option<(u32, Resampler)>,
    /// Reply audio at the announced rate not yet a whole frame.
    pcm: Vec<f32>,
    scratch: Vec<f32>,
    /// One frame converted to 16-bit for the encoder.
    frame_pcm: Vec<i16>,
}

impl Downlink {
    fn new(config: OpusEncoderConfig) -> Result<Self, OpusError> {
        let encoder = OpusEncoder::new(config)?;
        let n = encoder.frame_samples();
        Ok(Self {
            encoder,
            resampler: None,
            pcm: Vec::with_capacity(n * 2),
            scratch: Vec::new(),
            frame_pcm: Vec::with_capacity(n),
        })
    }
}

/// A session after the hello.
struct Session {
    id: String,
    engine: Engine,
    codec: FrameCodec,
    backend: OpusBackend,
    /// The uplink decoder, built at the first audio frame and dropped while a half-duplex
    /// device speaks (it sends no audio then).
    decoder: Option<OpusDecoder>,
    encoder_config: OpusEncoderConfig,
    /// Reply encoding state, present only while reply audio is arriving.
    downlink: Option<Downlink>,
    out_rate: u32,
    frame_ms: u32,
    frame_samples: usize,
    frame_buf: Vec<u8>,
    pacer: Pacer<Paced>,
    /// A `sentence_start` waiting for the first frame of its audio.
    subtitle: Option<String>,
    mode: ListenMode,
    /// `tts start` was sent and `tts stop` not yet.
    speaking: bool,
    /// The response finished; `tts stop` goes out once the paced audio has played.
    stop_pending: bool,
    /// Audio of a cleared response is dropped until the next response begins.
    muted: bool,
    /// v2 downlink timestamp, milliseconds of audio sent.
    timestamp: u32,
}

impl Conn {
    fn xcfg(&self) -> &XiaozhiConfig {
        &self.config.config.xiaozhi
    }

    async fn run(
        &mut self,
        mut in_rx: mpsc::Receiver<Incoming>,
        mut provider_rx: mpsc::Receiver<ProviderEvent>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        if *shutdown.borrow() {
            return;
        }
        loop {
            let deadline = self.deadline();
            let flow = tokio::select! {
                incoming = in_rx.recv() => match incoming {
                    None => break,
                    Some(i) => {
                        self.last_rx = Instant::now();
                        self.incoming(i).await
                    }
                },
                Some(event) = provider_rx.recv() => {
                    self.runner.finished(&event);
                    if let Some(s) = &mut self.session {
                        let _ = s.engine.handle_input(Instant::now(), Input::Provider(event));
                    }
                    Flow::Continue
                }
                () = tokio::time::sleep_until(tokio::time::Instant::from_std(deadline)) => {
                    self.tick(Instant::now())
                }
                _ = shutdown.changed() => Flow::Close,
            };
            self.drain().await;
            self.pace().await;
            if flow == Flow::Close {
                break;
            }
        }
        if let Some(s) = &mut self.session {
            let _ = s.engine.handle_input(Instant::now(), Input::Close);
            while let Some(out) = s.engine.poll_output() {
                if let Output::Provider(r) = out {
                    self.runner.start(r);
                }
            }
        }
    }

    /// The earliest instant something is due.
    fn deadline(&self) -> Instant {
        let now = Instant::now();
        let far = now + Duration::from_secs(3600);
        let mut d = far;
        let idle = self.xcfg().idle_timeout_secs;
        if idle > 0 {
            d = d.min(self.last_rx + Duration::from_secs(idle));
        }
        match &self.session {
            None => d.min(self.hello_deadline),
            Some(s) => {
                for t in [
                    s.engine.poll_timeout(),
                    s.pacer.poll_timeout(),
                    s.stop_at(now),
                ]
                .into_iter()
                .flatten()
                {
                    d = d.min(t);
                }
                d
            }
        }
    }

    fn tick(&mut self, now: Instant) -> Flow {
        let idle = self.xcfg().idle_timeout_secs;
        if idle > 0 && now >= self.last_rx + Duration::from_secs(idle) {
            tracing::info!(device = ?self.info.device_id, "xiaozhi session idle, closing");
            return Flow::Close;
        }
        match &mut self.session {
            None => {
                if now >= self.hello_deadline {
                    tracing::info!(device = ?self.info.device_id, "no hello in time, closing");
                    self.metrics.error(Door::Xiaozhi);
                    return Flow::Close;
                }
            }
            Some(s) => {
                if s.engine.poll_timeout().is_some_and(|t| t <= now) {
                    s.engine.handle_timeout(now);
                }
            }
        }
        Flow::Continue
    }

    async fn incoming(&mut self, incoming: Incoming) -> Flow {
        match incoming {
            Incoming::Oversized { len, binary } => {
                let kind = if binary { "binary" } else { "text" };
                bad(
                    &self.metrics,
                    &format!(
                        "{kind} frame of {len} bytes over the limit of {} bytes ignored",
                        self.config.config.max_frame_bytes
                    ),
                );
                Flow::Continue
            }
            Incoming::Binary(b) => {
                self.audio(&b);
                Flow::Continue
            }
            Incoming::Text(t) => match DeviceMessage::from_slice(t.as_bytes()) {
                Ok(m) => self.message(m).await,
                Err(e) => {
                    bad(&self.metrics, &format!("unparsable JSON ignored: {e}"));
                    Flow::Continue
                }
            },
        }
    }

    fn audio(&mut self, frame: &[u8]) {
        let Some(s) = &mut self.session else {
            bad(&self.metrics, "binary frame before hello ignored");
            return;
        };
        if s.speaking && s.mode != ListenMode::Realtime {
            // Half duplex: the device's own reply would come back as user speech.
            return;
        }
        let payload = match s.codec.decode(frame) {
            Ok(f) => f.payload,
            Err(e) => {
                self.metrics.error(Door::Xiaozhi);
                tracing::debug!("xiaozhi: bad binary frame: {e}");
                return;
            }
        };
        if payload.is_empty() {
            return;
        }
        if s.decoder.is_none() {
            match OpusDecoder::new(INPUT_RATE, s.backend) {
                Ok(d) => s.decoder = Some(d),
                Err(e) => {
                    self.metrics.error(Door::Xiaozhi);
                    tracing::warn!(%e, "cannot build the uplink decoder");
                    return;
                }
            }
        }
        let Some(decoder) = &mut s.decoder else {
            return;
        };
        match decoder.decode_f32(payload) {
            Ok(pcm) => s.engine.handle_audio(Instant::now(), pcm),
            Err(e) => {
                self.metrics.error(Door::Xiaozhi);
                tracing::debug!("xiaozhi: undecodable Opus packet: {e}");
            }
        }
    }

    async fn message(&mut self, m: DeviceMessage) -> Flow {
        let now = Instant::now();
        if let DeviceMessage::Hello(h) = m {
            return self.hello(h, now).await;
        }
        if self.session.is_none() {
            bad(
                &self.metrics,
                &format!("{} before hello ignored", m.message_type()),
            );
            return Flow::Continue;
        }
        match m {
            DeviceMessage::Listen(l) => self.listen(l, now).await,
            DeviceMessage::Abort(_) => {
                self.abort(now).await;
                Flow::Continue
            }
            DeviceMessage::Mcp(env) => {
                match env.payload_value() {
                    Ok(v) => {
                        if let Some(s) = &mut self.session
                            && let Err(e) = s.engine.handle_input(now, Input::DeviceMcp(v))
                        {
                            bad(&self.metrics, &format!("mcp message refused: {e}"));
                        }
                    }
                    Err(e) => bad(&self.metrics, &format!("mcp payload: {e}")),
                }
                Flow::Continue
            }
            // Legacy IoT descriptors and perception events carry nothing a turn needs.
            DeviceMessage::Iot(_) | DeviceMessage::Event(_) => Flow::Continue,
            DeviceMessage::Unknown(u) if u.message_type == "goodbye" => Flow::Close,
            other => {
                bad(
                    &self.metrics,
                    &format!("unknown message type {:?} ignored", other.message_type()),
                );
                Flow::Continue
            }
        }
    }

    async fn hello(&mut self, h: DeviceHello, now: Instant) -> Flow {
        if let Some(s) = &self.session {
            // A repeated hello is answered again; the session goes on.
            let hello = s.server_hello();
            send(&self.out, hello).await;
            return Flow::Continue;
        }
        if h.transport
            .as_ref()
            .is_some_and(|t| t.as_str() != "websocket")
        {
            bad(&self.metrics, "hello for another transport ignored");
            return Flow::Continue;
        }
        // The upgrade header fixes the framing; a browser client without headers may say it in
        // the hello; otherwise version 1.
        let version = self
            .info
            .framing
            .or_else(|| {
                h.version
                    .and_then(|v| ProtocolVersion::from_number(u64::from(v)).ok())
            })
            .unwrap_or(ProtocolVersion::V1);
        let session = match Session::new(self.xcfg(), version, now) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "xiaozhi session setup failed");
                self.metrics.error(Door::Xiaozhi);
                return Flow::Close;
            }
        };
        tracing::info!(
            device = ?self.info.device_id,
            session = %session.id,
            version = version.number(),
            mcp = ?h.features.mcp,
            "xiaozhi hello"
        );
        let hello = session.server_hello();
        self.session = Some(session);
        send(&self.out, hello).await;
        if h.features.mcp == Some(true)
            && let Some(s) = &mut self.session
        {
            let _ = s.engine.handle_input(now, Input::DeviceMcpStart);
        }
        Flow::Continue
    }

    async fn listen(&mut self, l: Listen, now: Instant) -> Flow {
        let Some(s) = &mut self.session else {
            return Flow::Continue;
        };
        match l.state {
            ListenState::Start => {
                let mode = l.mode.unwrap_or(ListenMode::Auto);
                s.mode = mode.clone();
                if mode == ListenMode::Manual
                    && let Err(e) = s.engine.handle_input(now, Input::StartCapture)
                {
                    bad(&self.metrics, &format!("listen start refused: {e}"));
                }
            }
            ListenState::Stop => {
                if s.mode == ListenMode::Manual {
                    // The device stops streaming at once, mid-utterance: cut the utterance
                    // now and end the push-to-talk turn as soon as its transcripts are in
                    // (no endpointing wait, and late words cannot count as a barge-in).
                    let input = if s.engine.state() == voxgate_engine::State::Listening {
                        Input::TriggerInference {
                            instructions: None,
                            flush_vad: true,
                        }
                    } else {
                        Input::StopCapture
                    };
                    if let Err(e) = s.engine.handle_input(now, input) {
                        bad(&self.metrics, &format!("listen stop refused: {e}"));
                    }
                }
            }
            ListenState::Detect => {
                let text = l.text.unwrap_or_default();
                self.detect(text.trim(), now).await;
            }
            _ => bad(&self.metrics, "unknown listen state ignored"),
        }
        Flow::Continue
    }

    /// `listen detect`: a wake word, or a text turn.
    async fn detect(&mut self, text: &str, now: Instant) {
        let wake = is_wake_word(text, &self.xcfg().wake_words) || text.is_empty();
        let greet = self.xcfg().greet_on_wake;
        let Some(s) = &mut self.session else { return };
        let sid = s.id.clone();
        if wake {
            if greet {
                let r = s.engine.handle_input(
                    now,
                    Input::TriggerInference {
                        instructions: Some(
                            "The user just woke the device with its wake word: greet them \
                             in one short sentence."
                                .to_owned(),
                        ),
                        flush_vad: false,
                    },
                );
                if let Err(e) = r {
                    bad(&self.metrics, &format!("wake word refused: {e}"));
                }
            } else {
                send(&self.out, with_sid(Stt::new(text), &sid)).await;
                send(&self.out, {
                    self.stops += 1;
                    with_sid(Tts::stop(), &sid)
                })
                .await;
            }
            return;
        }
        let r = s.engine.handle_input(
            now,
            Input::Text {
                text: text.to_owned(),
                mode: TriggerMode::Immediate,
            },
        );
        match r {
            Ok(()) => send(&self.out, with_sid(Stt::new(text), &sid)).await,
            Err(e) => bad(&self.metrics, &format!("text turn refused: {e}")),
        }
    }

    /// `abort`: stop the reply and answer with `tts stop` at once, whatever the state.
    async fn abort(&mut self, now: Instant) {
        let Some(s) = &mut self.session else { return };
        if let Err(e) = s.engine.handle_input(now, Input::Abort) {
            tracing::debug!("xiaozhi abort: {e}");
        }
        // The engine's ClearPlayback (if a reply was in progress) stops the audio; the device
        // waits for `tts stop` either way.
        let stops = self.stops;
        self.drain().await;
        if let Some(s) = &mut self.session {
            s.clear();
            s.speaking = false;
            s.stop_pending = false;
            let sid = s.id.clone();
            if self.stops == stops {
                self.stops += 1;
                send(&self.out, with_sid(Tts::stop(), &sid)).await;
            }
        }
    }

    /// Sends every pending engine output.
    async fn drain(&mut self) {
        loop {
            let Some(s) = &mut self.session else { return };
            let Some(out) = s.engine.poll_output() else {
                return;
            };
            match out {
                Output::Provider(r) => self.runner.start(r),
                Output::Client(event) => self.client_event(event).await,
                _ => {}
            }
        }
    }

    async fn client_event(&mut self, event: ClientEvent) {
        let now = Instant::now();
        let metrics = Arc::clone(&self.metrics);
        let Some(s) = &mut self.session else { return };
        let sid = s.id.clone();
        match event {
            ClientEvent::ResponseBegin { .. } => {
                s.muted = false;
                s.stop_pending = false;
                if !s.speaking {
                    s.speaking = true;
                    s.pacer.clear();
                    if s.mode != ListenMode::Realtime {
                        // Half duplex: no uplink audio until the reply is over, and the next
                        // utterance starts a fresh stream.
                        s.decoder = None;
                    }
                    send(&self.out, with_sid(Tts::start(), &sid)).await;
                }
            }
            ClientEvent::Emotion { emoji, emotion, .. } => {
                let llm = Llm {
                    session_id: Some(sid),
                    text: emoji,
                    emotion: super::emotion::to_wire(emotion),
                };
                send(&self.out, llm).await;
            }
            ClientEvent::SentenceStart { text, .. } if !s.muted => {
                let msg = ServerMessage::from(with_sid(Tts::sentence_start(text), &sid));
                s.subtitle = Some(msg.to_json());
            }
            ClientEvent::AudioChunk {
                samples,
                sample_rate,
                ..
            } if !s.muted => s.push_audio(now, &samples, sample_rate, &metrics),
            ClientEvent::ResponseEnd { .. } if !s.muted => s.flush_audio(now, &metrics),
            ClientEvent::ResponseFinished { interrupted, .. } => {
                metrics.turn(Door::Xiaozhi);
                if interrupted {
                    if s.speaking {
                        s.clear();
                        s.speaking = false;
                        send(&self.out, {
                            self.stops += 1;
                            with_sid(Tts::stop(), &sid)
                        })
                        .await;
                    }
                } else if s.speaking {
                    s.stop_pending = true;
                }
            }
            ClientEvent::ClearPlayback => {
                s.clear();
                s.muted = true;
                if s.speaking {
                    s.speaking = false;
                    s.stop_pending = false;
                    send(&self.out, {
                        self.stops += 1;
                        with_sid(Tts::stop(), &sid)
                    })
                    .await;
                }
            }
            ClientEvent::UserTranscription { text, .. } => {
                // With no recognizer configured the transcript is NoAsr's marker: the model
                // is told, the device's screen is not.
                let shown = without_no_asr_markers(&text);
                if !shown.is_empty() {
                    send(&self.out, with_sid(Stt::new(shown), &sid)).await;
                }
            }
            ClientEvent::DeviceMcp(m) => {
                let mut v = m.to_value();
                if v.get("method").and_then(Value::as_str) == Some("initialize") {
                    add_vision(&mut v, &self.info.vision_url, &self.info.vision_token);
                }
                send(&self.out, Mcp::wrap(v).with_session_id(sid)).await;
            }
            ClientEvent::Error { category, message } => {
                metrics.error(Door::Xiaozhi);
                tracing::info!(?category, %message, session = %sid, "xiaozhi session error");
            }
            // Text fragments (the door always speaks), VAD telemetry, history and queries
            // have no Xiaozhi message.
            _ => {}
        }
    }

    /// Releases due frames to the writer and sends `tts stop` once playback is over.
    async fn pace(&mut self) {
        let now = Instant::now();
        let Some(s) = &mut self.session else { return };
        s.pacer.handle_timeout(now);
        let mut due = Vec::new();
        while let Some(p) = s.pacer.poll_output() {
            due.push(p);
        }
        let due: Vec<(Option<String>, Option<Bytes>)> = due
            .into_iter()
            .map(|p| (p.subtitle, p.packet.and_then(|packet| s.frame(&packet))))
            .collect();
        let sid = s.id.clone();
        let stop = s.stop_at(now).is_some_and(|t| t <= now);
        if stop {
            s.stop_pending = false;
            s.speaking = false;
            s.pacer.clear();
        }
        for (subtitle, frame) in due {
            if let Some(subtitle) = subtitle {
                let _ = self.out.send(Message::Text(subtitle.into())).await;
            }
            if let Some(frame) = frame
                && self.out.try_send(Message::Binary(frame)).is_err()
            {
                self.metrics.dropped(Door::Xiaozhi, Direction::Downlink, 1);
            }
        }
        if stop {
            send(&self.out, {
                self.stops += 1;
                with_sid(Tts::stop(), &sid)
            })
            .await;
        }
    }
}

impl Session {
    fn new(config: &XiaozhiConfig, version: ProtocolVersion, now: Instant) -> Result<Self, String> {
        let engine_config = EngineConfig {
            system_prompt: config.system_prompt.clone(),
            emotion: Some(config.emoji_policy()),
            input_rate: INPUT_RATE,
            // Devices never ask for history: no user or reply audio is kept, so a session's
            // memory does not grow with the length of its replies or of the conversation.
            keep_user_audio: false,
            max_history_audio: Duration::ZERO,
            ..EngineConfig::default()
        };
        let engine = Engine::new(engine_config, now).map_err(|e| e.to_string())?;
        let frame_duration = FrameDuration::from_millis(config.output_frame_ms)
            .ok_or_else(|| format!("frame length {} ms", config.output_frame_ms))?;
        let backend = config.opus_backend.resolve();
        let encoder_config = OpusEncoderConfig {
            frame_duration,
            bitrate: config.opus_bitrate,
            complexity: config.opus_complexity,
            application: config.opus_application.to_opus(),
            backend,
            ..OpusEncoderConfig::voice(config.output_sample_rate)
        };
        // Built once here so a setting the codec refuses fails the hello, not the first reply;
        // the codecs themselves are built when they are needed.
        let frame_samples = OpusEncoder::new(encoder_config)
            .map_err(|e| e.to_string())?
            .frame_samples();
        OpusDecoder::new(INPUT_RATE, backend).map_err(|e| e.to_string())?;
        Ok(Self {
            id: super::new_session_id(),
            engine,
            codec: FrameCodec::new(version),
            backend,
            decoder: None,
            encoder_config,
            downlink: None,
            out_rate: config.output_sample_rate,
            frame_ms: config.output_frame_ms,
            frame_samples,
            frame_buf: Vec::new(),
            pacer: Pacer::new(PacerConfig::new(
                Duration::from_millis(u64::from(config.output_frame_ms)),
                config.lead_frames,
                PACER_CAPACITY,
            )),
            subtitle: None,
            mode: ListenMode::Auto,
            speaking: false,
            stop_pending: false,
            muted: false,
            timestamp: 0,
        })
    }

    fn server_hello(&self) -> ServerHello {
        ServerHello {
            audio_params: AudioParams {
                sample_rate: self.out_rate,
                frame_duration: self.frame_ms,
                ..AudioParams::downlink()
            },
            ..ServerHello::new(self.id.clone())
        }
    }

    /// When `tts stop` is due: after the finished response's paced audio has played out.
    fn stop_at(&self, now: Instant) -> Option<Instant> {
        if !self.stop_pending || self.pacer.queued() > 0 {
            return None;
        }
        Some(
            self.pacer
                .drained_at()
                .unwrap_or(now)
                .min(now + Duration::from_secs(60)),
        )
    }

    /// Drops every queued and partial reply frame.
    fn clear(&mut self) {
        self.pacer.clear();
        self.downlink = None;
        self.subtitle = None;
    }

    /// Reply audio in: resample to the announced rate and cut into frames.
    fn push_audio(&mut self, now: Instant, samples: &[i16], rate: u32, metrics: &Metrics) {
        if rate == 0 {
            return;
        }
        // A TTS chunk can be a whole sentence (seconds of audio). Taking it a slice at a time
        // keeps the conversion and resampling buffers at a few kilobytes for the session's
        // life instead of growing to the longest sentence ever spoken.
        for slice in samples.chunks(PUSH_SLICE) {
            self.push_slice(now, slice, rate, metrics);
        }
    }

    fn push_slice(&mut self, now: Instant, samples: &[i16], rate: u32, metrics: &Metrics) {
        if self.downlink.is_none() {
            match Downlink::new(self.encoder_config) {
                Ok(d) => self.downlink = Some(d),
                Err(e) => {
                    tracing::warn!(%e, "cannot build the reply encoder");
                    return;
                }
            }
        }
        let out_rate = self.out_rate;
        let Some(d) = &mut self.downlink else { return };
        d.scratch.clear();
        d.scratch.extend(samples.iter().map(|&s| i16_to_f32(s)));
        if rate == out_rate {
            d.pcm.extend_from_slice(&d.scratch);
        } else {
            if d.resampler.as_ref().is_none_or(|(from, _)| *from != rate) {
                match Resampler::new(rate, out_rate) {
                    Ok(r) => d.resampler = Some((rate, r)),
                    Err(e) => {
                        tracing::warn!(%e, rate, "cannot resample reply audio");
                        return;
                    }
                }
            }
            if let Some((_, r)) = &mut d.resampler {
                r.process(&d.scratch, &mut d.pcm);
            }
        }
        self.encode_frames(now, metrics);
    }

    /// The end of a response's audio: the resampler's tail and a last, zero-padded frame.
    /// The encoder goes with it; what is left of the reply waits in the pacer as packets.
    fn flush_audio(&mut self, now: Instant, metrics: &Metrics) {
        let n = self.frame_samples;
        if let Some(d) = &mut self.downlink {
            if let Some((_, r)) = &mut d.resampler {
                r.flush(&mut d.pcm);
            }
            if !d.pcm.is_empty() {
                let pad = n - d.pcm.len() % n;
                if pad < n {
                    d.pcm.extend(std::iter::repeat_n(0.0, pad));
                }
            }
        }
        self.encode_frames(now, metrics);
        self.downlink = None;
        if let Some(subtitle) = self.subtitle.take() {
            // A sentence with no audio at all still gets its subtitle, in order.
            let _ = self.pacer.handle_input(
                now,
                Paced {
                    subtitle: Some(subtitle),
                    packet: None,
                },
            );
        }
    }

    /// Encodes every whole frame of reply audio and queues it with the pacer.
    fn encode_frames(&mut self, now: Instant, metrics: &Metrics) {
        let n = self.frame_samples;
        let Some(d) = &mut self.downlink else { return };
        let mut start = 0;
        while d.pcm.len() - start >= n {
            let Some(chunk) = d.pcm.get(start..start + n) else {
                break;
            };
            start += n;
            d.frame_pcm.clear();
            d.frame_pcm.extend(chunk.iter().map(|&x| f32_to_i16(x)));
            let packet = match d.encoder.encode(&d.frame_pcm) {
                Ok(p) => Bytes::copy_from_slice(p),
                Err(e) => {
                    tracing::warn!(%e, "opus encode failed");
                    continue;
                }
            };
            let paced = Paced {
                subtitle: self.subtitle.take(),
                packet: Some(packet),
            };
            if self.pacer.handle_input(now, paced).is_err() {
                metrics.dropped(Door::Xiaozhi, Direction::Downlink, 1);
            }
        }
        d.pcm.drain(..start);
    }

    /// One Opus packet in the device's framing, stamped with the audio time sent so far.
    fn frame(&mut self, packet: &[u8]) -> Option<Bytes> {
        self.frame_buf.clear();
        let frame = if self.codec.version().has_timestamp() {
            Frame::opus_at(self.timestamp, packet)
        } else {
            Frame::opus(packet)
        };
        if let Err(e) = self.codec.encode(&frame, &mut self.frame_buf) {
            tracing::warn!(%e, "frame encode failed");
            return None;
        }
        self.timestamp = self.timestamp.wrapping_add(self.frame_ms);
        Some(Bytes::copy_from_slice(&self.frame_buf))
    }
}

async fn send(out: &mpsc::Sender<Message>, msg: impl Into<ServerMessage>) {
    let json = msg.into().to_json();
    let _ = out.send(Message::Text(json.into())).await;
}

/// Counts and logs a device frame that is ignored (the protocol has no error message).
fn bad(metrics: &Metrics, what: &str) {
    metrics.error(Door::Xiaozhi);
    tracing::debug!("xiaozhi: {what}");
}

fn with_sid<T: HasSessionId>(mut msg: T, sid: &str) -> T {
    msg.set_session_id(sid);
    msg
}

trait HasSessionId {
    fn set_session_id(&mut self, sid: &str);
}

impl HasSessionId for Tts {
    fn set_session_id(&mut self, sid: &str) {
        self.session_id = Some(sid.to_owned());
    }
}

impl HasSessionId for Stt {
    fn set_session_id(&mut self, sid: &str) {
        self.session_id = Some(sid.to_owned());
    }
}

/// Adds `capabilities.vision` to an `initialize` request: one third-party client fails without
/// it, and it tells the device where to post photos.
fn add_vision(request: &mut Value, url: &str, token: &str) {
    let Some(obj) = request.as_object_mut() else {
        return;
    };
    let params = obj
        .entry("params")
        .or_insert_with(|| Value::Object(serde_json::Map::new()));
    let Some(params) = params.as_object_mut() else {
        return;
    };
    let caps = params
        .entry("capabilities")
        .or_insert_with(|| Value::Object(serde_json::Map::new()));
    if let Some(caps) = caps.as_object_mut() {
        caps.insert(
            "vision".to_owned(),
            serde_json::json!({"url": url, "token": token}),
        );
    }
}

/// `text` without NoAsr's markers (an utterance the VAD split in parts has one per part).
fn without_no_asr_markers(text: &str) -> String {
    let marker = voxgate_providers::no_asr_marker(0.0);
    let Some((prefix, suffix)) = marker.split_once("0.0") else {
        return text.trim().to_owned();
    };
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find(prefix) {
        out.push_str(&rest[..i]);
        let after = &rest[i + prefix.len()..];
        match after.find(suffix) {
            Some(j) => rest = &after[j + suffix.len()..],
            None => {
                rest = &rest[i..];
                break;
            }
        }
        if !rest.starts_with(prefix) && out.is_empty() {
            rest = rest.trim_start();
        }
    }
    out.push_str(rest);
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether `text` is one of the wake words, ignoring case, spaces and punctuation.
fn is_wake_word(text: &str, words: &[String]) -> bool {
    let norm = |s: &str| -> String {
        s.chars()
            .filter(|c| c.is_alphanumeric())
            .flat_map(char::to_lowercase)
            .collect()
    };
    let t = norm(text);
    !t.is_empty() && words.iter().any(|w| norm(w) == t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_asr_markers_are_not_shown() {
        let m = voxgate_providers::no_asr_marker(1.5);
        assert_eq!(without_no_asr_markers(&m), "");
        assert_eq!(without_no_asr_markers(&format!("{m} {m}")), "");
        assert_eq!(without_no_asr_markers(&format!("hi {m} there")), "hi there");
        assert_eq!(without_no_asr_markers("plain words"), "plain words");
    }

    #[test]
    fn wake_words_match_loosely() {
        let words = vec!["你好小智".to_owned(), "Hi ESP".to_owned()];
        assert!(is_wake_word("你好，小智！", &words));
        assert!(is_wake_word("hi esp", &words));
        assert!(!is_wake_word("what time is it", &words));
        assert!(!is_wake_word("", &words));
    }

    #[test]
    fn vision_is_added_to_initialize() {
        let mut v = serde_json::json!({"jsonrpc":"2.0","id":1,"method":"initialize",
            "params":{"capabilities":{}}});
        add_vision(&mut v, "http://h/x", "t");
        assert_eq!(v["params"]["capabilities"]["vision"]["url"], "http://h/x");
        let mut bare = serde_json::json!({"jsonrpc":"2.0","id":1,"method":"initialize"});
        add_vision(&mut bare, "u", "t");
        assert_eq!(bare["params"]["capabilities"]["vision"]["token"], "t");
    }
}
