//! One Xiaozhi device connection: a [`Translator`] between the device protocol and one
//! [`Engine`], run by the shared door driver ([`crate::door`]), which owns the socket, the
//! queues, the providers and the init/idle/keepalive timers.
//!
//! The mapping, with the decisions in their own modules:
//!
//! - `hello` → the server hello and a session (engine, [`Uplink`], [`Reply`], [`Speech`]);
//!   a repeated hello is answered again; `goodbye` closes with 1000;
//! - binary frames → [`Uplink`] → engine audio, unless [`Speech`] says the half-duplex device
//!   is speaking; `listen` / `abort` / `mcp` → engine inputs;
//! - `ResponseBegin` → `tts start`; `Emotion` → `llm`; `UserTranscription` → `stt` (without
//!   NoAsr's markers, [`text`](super::text));
//! - `SentenceStart` + `AudioChunk`s → [`Reply`] (encoded, paced, framed on release; the
//!   subtitle rides with the first frame of its audio);
//! - `ResponseFinished` → `tts stop` once the paced audio has played out; `ClearPlayback`
//!   (barge-in, abort, manual listen) → queued audio dropped and `tts stop` at once;
//! - `DeviceMcp` → an `mcp` envelope (`initialize` gains the `vision` capability).
//!
//! The Xiaozhi protocol has no error message: malformed, unknown, out-of-order and oversized
//! frames are logged, counted in `voxgate_errors_total{door="xiaozhi"}` and ignored, and the
//! session goes on (a frame over the hard limit, four times `max_frame_bytes`, closes with
//! 1009). `[xiaozhi] hello_timeout_ms` and `idle_timeout_secs` are this door's initialization
//! and idle timeouts ([`limits`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ws::WebSocket;
use bytes::Bytes;
use serde_json::Value;
use tokio::sync::mpsc;
use voxgate_audio::opus::{FrameDuration, OpusEncoderConfig};
use voxgate_engine::{
    ClientEvent, Engine, EngineConfig, Input, Output, ProviderEvent, State, TriggerMode,
};
use voxgate_xiaozhi::control::{
    AudioParams, DeviceHello, DeviceMessage, Listen, ListenMode, ListenState, Llm, Mcp,
    ServerHello, ServerMessage, Stt, System, SystemCommand, Tts,
};
use voxgate_xiaozhi::frame::ProtocolVersion;

use crate::config::engine::{EngineSettings, Greeting};
use crate::door::{self, ClientFrame, Inbound, Out, ServerFrame, SessionLimits, Translator};
use crate::metrics::{Direction, Door, Metrics};
use crate::server::App;

use super::XiaozhiConfig;
use super::devices::{Push, PushKind, Refused, Registration};
use super::reply::{Reply, ReplySettings};
use super::speech::Speech;
use super::text::{is_wake_word, without_no_asr_markers};
use super::uplink::{INPUT_RATE, Uplink};

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

/// Serves one upgraded connection until the device leaves, a timeout, or shutdown.
pub(crate) async fn serve(
    socket: WebSocket,
    app: Arc<App>,
    info: ConnInfo,
    peer: std::net::SocketAddr,
) {
    let mut cx = app.driver(Door::Xiaozhi);
    cx.identity.peer = Some(peer);
    cx.identity.device.clone_from(&info.device_id);
    cx.limits = limits(&app.config.xiaozhi, &cx.limits);
    cx.mcp = app.mcp_tools(app.config.xiaozhi.mcp_tools);
    let mut door = XiaozhiDoor::new(Arc::clone(&app), info);
    if let Some(device) = &door.info.device_id {
        let devices = Arc::clone(&app.shared.xiaozhi_devices);
        let (registration, pushes) = devices.register(&app, device).await;
        door.registration = Some(registration);
        door.pushes = Some(pushes);
    }
    door::run(socket, door, cx).await;
}

/// The door's overrides of the server-wide lifecycle limits: `hello_timeout_ms` is the
/// initialization timeout, `idle_timeout_secs` the idle timeout (0: none).
fn limits(config: &XiaozhiConfig, server: &SessionLimits) -> SessionLimits {
    SessionLimits {
        init_timeout: Some(Duration::from_millis(config.hello_timeout_ms)),
        idle_timeout: (config.idle_timeout_secs > 0)
            .then(|| Duration::from_secs(config.idle_timeout_secs)),
        ..server.clone()
    }
}

/// A device frame, decoded in the driver's reader task.
#[derive(Debug)]
pub(crate) enum In {
    /// A JSON control message (boxed: the reader's queue holds 32 slots of this type per
    /// session from the start, and audio frames are the common case).
    Message(Box<DeviceMessage>),
    /// A binary (audio) frame, still in the connection's framing.
    Audio(Bytes),
    /// A text frame that is not a device message.
    Unparsable(String),
    /// A frame over `max_frame_bytes`.
    Oversized {
        /// Its length.
        len: usize,
        /// Binary or text.
        binary: bool,
        /// The limit.
        limit: usize,
    },
}

/// One device connection.
pub(crate) struct XiaozhiDoor {
    app: Arc<App>,
    info: ConnInfo,
    /// Present after the hello. Boxed: a session is several kilobytes (the engine's VAD frames,
    /// the reply's framing state), and the door driver's futures hold the translator by value
    /// in more than one of their states, so an inline session would be paid for several times
    /// over in every connection's task.
    session: Option<Box<Session>>,
    /// The MCP endpoint's tools, for the engine made at the hello.
    server_tools: Vec<voxgate_engine::ServerToolDefinition>,
    /// Operator pushes to this device ([`devices`](super::devices)), when it sent a `Device-Id`.
    pushes: Option<mpsc::Receiver<Push>>,
    /// This connection's place in the device registry (and the cluster directory).
    registration: Option<Registration>,
}

/// A session after the hello.
struct Session {
    id: String,
    engine: Engine,
    uplink: Uplink,
    reply: Reply,
    speech: Speech,
    /// The last `listen start` mode: manual is push to talk.
    mode: ListenMode,
    out_rate: u32,
    frame_ms: u32,
}

impl Translator for XiaozhiDoor {
    type In = In;
    type Event = Push;

    fn decode(frame: ClientFrame, max: usize) -> Inbound<In> {
        let oversized = |len, binary| {
            Inbound::Keep(In::Oversized {
                len,
                binary,
                limit: max,
            })
        };
        match frame {
            ClientFrame::Binary(b) if b.len() > max => oversized(b.len(), true),
            ClientFrame::Text(t) if t.len() > max => oversized(t.len(), false),
            ClientFrame::Binary(b) => Inbound::Droppable(In::Audio(b)),
            ClientFrame::Text(t) => match DeviceMessage::from_slice(t.as_bytes()) {
                Ok(m) => Inbound::Keep(In::Message(Box::new(m))),
                Err(e) => Inbound::Keep(In::Unparsable(e.to_string())),
            },
        }
    }

    fn on_client(&mut self, now: Instant, msg: In, out: &mut Out) {
        match msg {
            In::Oversized { len, binary, limit } => {
                let kind = if binary { "binary" } else { "text" };
                self.bad(&format!(
                    "{kind} frame of {len} bytes over the limit of {limit} bytes ignored"
                ));
            }
            In::Unparsable(e) => self.bad(&format!("unparsable JSON ignored: {e}")),
            In::Audio(b) => self.audio(now, &b),
            In::Message(m) => self.message(now, *m, out),
        }
        self.settle(now, out);
    }

    fn on_provider(&mut self, now: Instant, event: ProviderEvent, out: &mut Out) {
        if let Some(s) = &mut self.session {
            let _ = s.engine.handle_input(now, Input::Provider(event));
        }
        self.settle(now, out);
    }

    fn on_timeout(&mut self, now: Instant, out: &mut Out) {
        if let Some(s) = &mut self.session
            && s.engine.poll_timeout().is_some_and(|t| t <= now)
        {
            s.engine.handle_timeout(now);
        }
        self.settle(now, out);
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let s = self.session.as_ref()?;
        [
            s.engine.poll_timeout(),
            s.reply.poll_timeout(),
            s.speech.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn initialized(&self) -> bool {
        self.session.is_some()
    }

    fn on_init_timeout(&mut self, _now: Instant, _out: &mut Out) {
        // The protocol has no error message: the driver closes with 1008.
        tracing::info!("no hello in time, closing");
    }

    fn is_idle(&self) -> bool {
        self.session.as_ref().is_none_or(|s| {
            !s.speech.speaking()
                && !matches!(
                    s.engine.state(),
                    State::Processing | State::Speaking | State::Action
                )
        })
    }

    fn events(&mut self) -> Option<&mut mpsc::Receiver<Push>> {
        self.pushes.as_mut()
    }

    fn on_event(&mut self, now: Instant, event: Option<Push>, out: &mut Out) {
        let Some(Push { kind, done }) = event else {
            // The registry dropped this connection's sender: a newer connection of the same
            // device took its pushes.
            self.pushes = None;
            return;
        };
        let Some(s) = &mut self.session else {
            let _ = done.send(Err(Refused::NotReady));
            return;
        };
        let sid = s.id.clone();
        let result = match kind {
            PushKind::Alert(mut alert) => {
                alert.session_id = Some(sid.clone());
                send(out, alert);
                Ok(sid)
            }
            PushKind::Reboot => {
                send(
                    out,
                    System {
                        session_id: Some(sid.clone()),
                        command: SystemCommand::Reboot,
                    },
                );
                Ok(sid)
            }
            PushKind::Speak(text) => s
                .engine
                .handle_input(
                    now,
                    Input::DirectSpeech {
                        text,
                        include_in_history: true,
                        uninterruptible: false,
                    },
                )
                .map(|()| sid)
                .map_err(|e| Refused::Engine(e.to_string())),
        };
        let _ = done.send(result);
        self.settle(now, out);
    }

    fn on_server_tools(
        &mut self,
        now: Instant,
        tools: Vec<voxgate_engine::ServerToolDefinition>,
        out: &mut Out,
    ) {
        if let Some(s) = &mut self.session {
            let _ = s
                .engine
                .handle_input(now, Input::ServerTools(tools.clone()));
        }
        self.server_tools = tools;
        self.settle(now, out);
    }

    fn speculation_stats(&self) -> Option<voxgate_engine::SpeculationStats> {
        self.session.as_ref().map(|s| s.engine.speculation_stats())
    }

    fn take_telemetry(&mut self, sink: &mut Vec<voxgate_engine::TurnEvent>) {
        if let Some(s) = &mut self.session {
            sink.extend(s.engine.take_telemetry());
        }
    }

    fn on_close(&mut self, now: Instant, out: &mut Out) {
        let Some(s) = &mut self.session else { return };
        let _ = s.engine.handle_input(now, Input::Close);
        while let Some(o) = s.engine.poll_output() {
            if let Output::Provider(r) = o {
                out.provider(r);
            }
        }
    }
}

impl XiaozhiDoor {
    /// A connection waiting for its hello.
    pub(crate) fn new(app: Arc<App>, info: ConnInfo) -> Self {
        Self {
            app,
            info,
            session: None,
            server_tools: Vec::new(),
            pushes: None,
            registration: None,
        }
    }

    fn xcfg(&self) -> &XiaozhiConfig {
        &self.app.config.xiaozhi
    }

    /// `[xiaozhi.engine]` over `[engine]`.
    fn engine_settings(&self) -> EngineSettings {
        self.xcfg().engine.over(&self.app.config.engine)
    }

    fn metrics(&self) -> &Metrics {
        &self.app.metrics
    }

    /// Counts and logs a device frame that is ignored (the protocol has no error message).
    fn bad(&self, what: &str) {
        self.metrics().error(Door::Xiaozhi);
        tracing::debug!("xiaozhi: {what}");
    }

    fn audio(&mut self, now: Instant, frame: &[u8]) {
        let Some(s) = &mut self.session else {
            self.bad("binary frame before hello ignored");
            return;
        };
        if !s.speech.hears_uplink() {
            // Half duplex: the device's own reply would come back as user speech.
            return;
        }
        match s.uplink.decode(frame) {
            Ok(Some(pcm)) => s.engine.handle_audio(now, pcm),
            Ok(None) => {}
            Err(e) => {
                self.metrics().error(Door::Xiaozhi);
                tracing::debug!("xiaozhi: {e}");
            }
        }
    }

    fn message(&mut self, now: Instant, m: DeviceMessage, out: &mut Out) {
        if let DeviceMessage::Hello(h) = m {
            self.hello(now, &h, out);
            return;
        }
        let Some(s) = &mut self.session else {
            self.bad(&format!("{} before hello ignored", m.message_type()));
            return;
        };
        match m {
            DeviceMessage::Listen(l) => self.listen(now, l, out),
            DeviceMessage::Abort(_) => self.abort(now, out),
            DeviceMessage::Mcp(env) => match env.payload_value() {
                Ok(v) => {
                    if let Err(e) = s.engine.handle_input(now, Input::DeviceMcp(v)) {
                        self.bad(&format!("mcp message refused: {e}"));
                    }
                }
                Err(e) => self.bad(&format!("mcp payload: {e}")),
            },
            // Legacy IoT descriptors and perception events carry nothing a turn needs.
            DeviceMessage::Event(e) => self.perception(&e),
            DeviceMessage::Iot(_) => {}
            DeviceMessage::Unknown(u) if u.message_type == "goodbye" => {
                out.close(door::close_code::NORMAL, "goodbye");
            }
            other => self.bad(&format!(
                "unknown message type {:?} ignored",
                other.message_type()
            )),
        }
    }

    fn hello(&mut self, now: Instant, h: &DeviceHello, out: &mut Out) {
        if let Some(s) = &self.session {
            // A repeated hello is answered again; the session goes on.
            send(out, s.server_hello());
            return;
        }
        if h.transport
            .as_ref()
            .is_some_and(|t| t.as_str() != "websocket")
        {
            self.bad("hello for another transport ignored");
            return;
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
        let mut session = match Session::new(
            self.xcfg(),
            &self.engine_settings(),
            self.app.config.limits.max_history_messages,
            version,
            now,
        ) {
            Ok(s) => Box::new(s),
            Err(e) => {
                tracing::warn!(error = %e, "xiaozhi session setup failed");
                self.metrics().error(Door::Xiaozhi);
                out.close(door::close_code::INTERNAL, "session setup failed");
                return;
            }
        };
        // The session span names the device and our session id; this is the device's own.
        tracing::info!(
            xiaozhi_session = %session.id,
            version = version.number(),
            mcp = h.features.mcp.unwrap_or(false),
            "xiaozhi hello"
        );
        send(out, session.server_hello());
        let _ = session
            .engine
            .handle_input(now, Input::ServerTools(self.server_tools.clone()));
        if h.features.mcp == Some(true) {
            let _ = session.engine.handle_input(now, Input::DeviceMcpStart);
        }
        self.session = Some(session);
    }

    /// A device's perception `event` goes on the server's perception bus, with the device and
    /// session ids this connection knows; a malformed one is logged and dropped (the firmware
    /// expects no answer).
    fn perception(&self, event: &voxgate_xiaozhi::control::Event) {
        let value = match serde_json::to_value(event) {
            Ok(v) => v,
            Err(e) => return self.bad(&format!("event not representable: {e}")),
        };
        let session_id = self.session.as_ref().map(|s| s.id.as_str());
        match crate::bridge::perception::PerceptionEvent::from_value(
            value,
            self.info.device_id.as_deref(),
            session_id,
            crate::bridge::perception::EventOrigin::Device,
        ) {
            Ok(event) => {
                self.app.shared.perception.publish(event);
            }
            Err(e) => self.bad(&format!("perception event refused: {e}")),
        }
    }

    fn listen(&mut self, now: Instant, l: Listen, out: &mut Out) {
        let Some(s) = &mut self.session else { return };
        match l.state {
            ListenState::Start => {
                let mode = l.mode.unwrap_or(ListenMode::Auto);
                s.speech.listen(&mode);
                s.mode = mode;
                if s.mode == ListenMode::Manual
                    && let Err(e) = s.engine.handle_input(now, Input::StartCapture)
                {
                    self.bad(&format!("listen start refused: {e}"));
                }
            }
            ListenState::Stop => {
                if s.mode == ListenMode::Manual {
                    // The device stops streaming at once, mid-utterance: cut the utterance
                    // now and end the push-to-talk turn as soon as its transcripts are in
                    // (no endpointing wait, and late words cannot count as a barge-in).
                    let input = if s.engine.state() == State::Listening {
                        Input::TriggerInference {
                            instructions: None,
                            flush_vad: true,
                        }
                    } else {
                        Input::StopCapture
                    };
                    if let Err(e) = s.engine.handle_input(now, input) {
                        self.bad(&format!("listen stop refused: {e}"));
                    }
                }
            }
            ListenState::Detect => {
                let text = l.text.unwrap_or_default();
                self.detect(now, text.trim(), out);
            }
            _ => self.bad("unknown listen state ignored"),
        }
    }

    /// `listen detect`: a wake word, or a text turn.
    fn detect(&mut self, now: Instant, text: &str, out: &mut Out) {
        let wake = text.is_empty() || is_wake_word(text, &self.xcfg().wake_words);
        let settings = self.engine_settings();
        // `greet_on_wake` decides whether to greet; a configured `greeting` what is said
        // (verbatim rather than the model's own words), `greeting = ""` not to greet.
        let greeting = settings.greeting();
        let greet = self.xcfg().greet_on_wake && greeting != Greeting::Off;
        let Some(s) = &mut self.session else { return };
        let result = if !wake {
            s.engine.handle_input(
                now,
                Input::Text {
                    text: text.to_owned(),
                    mode: TriggerMode::Immediate,
                },
            )
        } else if let (true, Greeting::Say(words)) = (greet, greeting) {
            s.engine.handle_input(
                now,
                Input::DirectSpeech {
                    text: words.to_owned(),
                    include_in_history: true,
                    uninterruptible: false,
                },
            )
        } else if greet {
            s.engine.handle_input(
                now,
                Input::TriggerInference {
                    instructions: Some(
                        "The user just woke the device with its wake word: greet them in one \
                         short sentence."
                            .to_owned(),
                    ),
                    flush_vad: false,
                },
            )
        } else {
            // Acknowledged: the device goes back to listening.
            send(out, with_sid(Stt::new(text), &s.id));
            send(out, with_sid(Tts::stop(), &s.id));
            return;
        };
        match result {
            Ok(()) if !wake => send(out, with_sid(Stt::new(text), &s.id)),
            Ok(()) => {}
            Err(e) if wake => self.bad(&format!("wake word refused: {e}")),
            Err(e) => self.bad(&format!("text turn refused: {e}")),
        }
    }

    /// `abort`: stop the reply and answer with `tts stop` at once, whatever the state.
    fn abort(&mut self, now: Instant, out: &mut Out) {
        let Some(s) = &mut self.session else { return };
        if let Err(e) = s.engine.handle_input(now, Input::Abort) {
            tracing::debug!("xiaozhi abort: {e}");
        }
        // The engine's ClearPlayback (if a reply was in progress) stops the audio; the device
        // waits for `tts stop` either way.
        let mark = s.speech.abort();
        self.drain(now, out);
        let Some(s) = &mut self.session else { return };
        s.reply.clear();
        if s.speech.aborted(mark) {
            send(out, with_sid(Tts::stop(), &s.id));
        }
    }

    /// After every step: the engine's outputs, then the reply frames that are due.
    fn settle(&mut self, now: Instant, out: &mut Out) {
        self.drain(now, out);
        self.pace(now, out);
    }

    /// Maps every pending engine output.
    fn drain(&mut self, now: Instant, out: &mut Out) {
        loop {
            let Some(s) = &mut self.session else { return };
            match s.engine.poll_output() {
                None => return,
                Some(Output::Provider(r)) => out.provider(r),
                Some(Output::Client(event)) => self.client_event(now, event, out),
                Some(_) => {}
            }
        }
    }

    fn client_event(&mut self, now: Instant, event: ClientEvent, out: &mut Out) {
        let metrics = Arc::clone(&self.app.metrics);
        let Some(s) = &mut self.session else { return };
        let sid = s.id.clone();
        match event {
            ClientEvent::ResponseBegin { .. } => {
                let starts = s.speech.begin();
                if starts {
                    s.reply.restart_pacing();
                    if !s.speech.hears_uplink() {
                        // Half duplex: no uplink audio until the reply is over.
                        s.uplink.end_stream();
                    }
                    send(out, with_sid(Tts::start(), &sid));
                }
            }
            ClientEvent::Emotion { emoji, emotion, .. } => {
                let llm = Llm {
                    session_id: Some(sid),
                    text: emoji,
                    emotion: super::emotion::to_wire(emotion),
                };
                send(out, llm);
            }
            ClientEvent::SentenceStart { text, .. } if !s.speech.muted() => {
                let msg = ServerMessage::from(with_sid(Tts::sentence_start(text), &sid));
                s.reply.sentence(msg.to_json());
            }
            ClientEvent::AudioChunk {
                samples,
                sample_rate,
                ..
            } if !s.speech.muted() => {
                let dropped = s.reply.push_audio(now, &samples, sample_rate);
                metrics.dropped(Door::Xiaozhi, Direction::Downlink, dropped);
            }
            ClientEvent::ResponseEnd { .. } if !s.speech.muted() => {
                let dropped = s.reply.flush(now);
                metrics.dropped(Door::Xiaozhi, Direction::Downlink, dropped);
            }
            ClientEvent::ResponseFinished { interrupted, .. } => {
                metrics.turn(Door::Xiaozhi);
                if s.speech.finished(interrupted) {
                    s.reply.clear();
                    send(out, with_sid(Tts::stop(), &sid));
                }
            }
            ClientEvent::ClearPlayback => {
                s.reply.clear();
                if s.speech.clear() {
                    send(out, with_sid(Tts::stop(), &sid));
                }
            }
            ClientEvent::UserTranscription { text, .. } => {
                out.turn_decided();
                // With no recognizer configured the transcript is NoAsr's marker: the model
                // is told, the device's screen is not.
                let shown = without_no_asr_markers(&text);
                if !shown.is_empty() {
                    send(out, with_sid(Stt::new(shown), &sid));
                }
            }
            ClientEvent::DeviceMcp(m) => {
                let mut v = m.to_value();
                if v.get("method").and_then(Value::as_str) == Some("initialize") {
                    add_vision(&mut v, &self.info.vision_url, &self.info.vision_token);
                }
                send(out, Mcp::wrap(v).with_session_id(sid));
            }
            ClientEvent::Error { category, message } => {
                metrics.error(Door::Xiaozhi);
                tracing::info!(?category, %message, xiaozhi_session = %sid, "xiaozhi session error");
            }
            // Text fragments (the door always speaks), VAD telemetry, history and queries
            // have no Xiaozhi message.
            _ => {}
        }
    }

    /// Releases due reply frames and sends `tts stop` once playback is over.
    fn pace(&mut self, now: Instant, out: &mut Out) {
        let Some(s) = &mut self.session else { return };
        let dropped = s.reply.handle_timeout(now);
        if dropped > 0 {
            self.app
                .metrics
                .dropped(Door::Xiaozhi, Direction::Downlink, dropped);
        }
        while let Some(r) = s.reply.poll_output() {
            if let Some(subtitle) = r.subtitle {
                out.send(ServerFrame::Text(subtitle));
            }
            if let Some(frame) = r.frame {
                out.send_droppable(ServerFrame::Binary(frame));
            }
        }
        if s.speech.played(now, s.reply.queued(), s.reply.drained_at()) {
            s.reply.restart_pacing();
            send(out, with_sid(Tts::stop(), &s.id));
        }
    }
}

impl Session {
    fn new(
        config: &XiaozhiConfig,
        settings: &EngineSettings,
        max_history_messages: usize,
        version: ProtocolVersion,
        now: Instant,
    ) -> Result<Self, String> {
        let mut engine_config = EngineConfig {
            system_prompt: config.system_prompt.clone(),
            emotion: Some(config.emoji_policy()),
            input_rate: INPUT_RATE,
            // Devices never ask for history: no user or reply audio is kept, so a session's
            // memory does not grow with the length of its replies or of the conversation.
            keep_user_audio: false,
            max_history_audio: Duration::ZERO,
            max_history_messages,
            ..EngineConfig::default()
        };
        settings.apply(&mut engine_config);
        let engine = Engine::new(engine_config, now).map_err(|e| e.to_string())?;
        let frame_duration = FrameDuration::from_millis(config.output_frame_ms)
            .ok_or_else(|| format!("frame length {} ms", config.output_frame_ms))?;
        let backend = config.opus_backend.resolve();
        let encoder = OpusEncoderConfig {
            frame_duration,
            bitrate: config.opus_bitrate,
            complexity: config.opus_complexity,
            application: config.opus_application.to_opus(),
            backend,
            ..OpusEncoderConfig::voice(config.output_sample_rate)
        };
        let reply = Reply::new(ReplySettings {
            encoder,
            lead_frames: config.lead_frames,
            version,
        })
        .map_err(|e| e.to_string())?;
        let uplink = Uplink::new(version, backend).map_err(|e| e.to_string())?;
        Ok(Self {
            id: super::new_session_id(),
            engine,
            uplink,
            reply,
            speech: Speech::new(),
            mode: ListenMode::Auto,
            out_rate: config.output_sample_rate,
            frame_ms: config.output_frame_ms,
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
}

/// Queues a control message.
fn send(out: &mut Out, msg: impl Into<ServerMessage>) {
    out.send(ServerFrame::Text(msg.into().to_json()));
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

#[cfg(test)]
mod tests {
    use serde_json::json;
    use tokio::sync::watch;
    use voxgate_engine::{ProviderRequest, RequestId, TurnId};

    use super::*;
    use crate::config::Config;

    const MS: Duration = Duration::from_millis(1);
    /// 60 ms at 24 kHz, the default downlink frame.
    const FRAME: usize = 1440;

    fn app(config: Config) -> Arc<App> {
        let (_stop, shutdown) = watch::channel(false);
        Arc::new(App::for_test(config, shutdown))
    }

    fn errors(app: &App) -> u64 {
        app.metrics
            .render()
            .lines()
            .find_map(|l| l.strip_prefix("voxgate_errors_total{door=\"xiaozhi\"} "))
            .map_or(0, |n| n.parse().unwrap())
    }

    #[derive(Debug, Clone)]
    enum Ev {
        Json(Value),
        Audio(Bytes),
    }

    impl Ev {
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

    fn labels(evs: &[Ev]) -> Vec<String> {
        evs.iter().map(Ev::label).collect()
    }

    /// A connection driven by hand on a virtual clock.
    struct Dev {
        app: Arc<App>,
        conn: XiaozhiDoor,
        t0: Instant,
        now: Instant,
        requests: Vec<ProviderRequest>,
        closed: Option<u16>,
    }

    impl Dev {
        fn new(config: Config) -> Self {
            let app = app(config);
            let info = ConnInfo {
                framing: Some(ProtocolVersion::V1),
                device_id: Some("aa:bb:cc:dd:ee:ff".into()),
                vision_url: "http://h/xiaozhi/vision/explain".into(),
                vision_token: "tok".into(),
            };
            let t0 = Instant::now();
            Self {
                conn: XiaozhiDoor::new(Arc::clone(&app), info),
                app,
                t0,
                now: t0,
                requests: Vec::new(),
                closed: None,
            }
        }

        fn at(&self) -> Duration {
            self.now - self.t0
        }

        fn step(&mut self, f: impl FnOnce(&mut XiaozhiDoor, Instant, &mut Out)) -> Vec<Ev> {
            let mut out = Out::new();
            f(&mut self.conn, self.now, &mut out);
            if let Some(c) = out.closing() {
                self.closed = Some(c.code);
            }
            self.requests.extend(out.take_requests());
            out.take_frames()
                .into_iter()
                .map(|f| match f {
                    ServerFrame::Text(t) => Ev::Json(serde_json::from_str(&t).unwrap()),
                    ServerFrame::Binary(b) => Ev::Audio(b),
                })
                .collect()
        }

        fn frame(&mut self, frame: ClientFrame) -> Vec<Ev> {
            match XiaozhiDoor::decode(frame, 4096) {
                Inbound::Keep(m) | Inbound::Droppable(m) => {
                    self.step(|c, now, out| c.on_client(now, m, out))
                }
            }
        }

        fn send(&mut self, v: &Value) -> Vec<Ev> {
            self.frame(ClientFrame::Text(v.to_string().into()))
        }

        fn hello(&mut self, mcp: bool) -> Value {
            let evs = self.send(&json!({"type":"hello","version":1,"transport":"websocket",
                "features":{"mcp":mcp},"audio_params":{"format":"opus","sample_rate":16000,
                "channels":1,"frame_duration":60}}));
            match &evs[0] {
                Ev::Json(v) => v.clone(),
                Ev::Audio(_) => panic!("no hello: {evs:?}"),
            }
        }

        fn provider(&mut self, event: ProviderEvent) -> Vec<Ev> {
            self.step(|c, now, out| c.on_provider(now, event, out))
        }

        /// Advances the clock to the translator's next deadline and runs it.
        fn tick(&mut self) -> Option<Vec<Ev>> {
            let due = self.conn.poll_timeout()?;
            self.now = self.now.max(due);
            Some(self.step(|c, now, out| c.on_timeout(now, out)))
        }

        fn take_request(&mut self) -> ProviderRequest {
            assert!(!self.requests.is_empty(), "a provider request");
            self.requests.remove(0)
        }

        /// Answers the latest LLM request with `reply` and returns the synthesis request's id.
        fn generate(&mut self, reply: &str) -> (Vec<Ev>, RequestId) {
            let id = self
                .requests
                .drain(..)
                .filter_map(|r| match r {
                    ProviderRequest::Generate { id, .. } => Some(id),
                    _ => None,
                })
                .next_back()
                .expect("a generate request");
            let mut evs = self.provider(ProviderEvent::TextDelta {
                id,
                delta: reply.into(),
            });
            evs.extend(self.provider(ProviderEvent::Done { id }));
            let tts = self
                .requests
                .drain(..)
                .find_map(|r| match r {
                    ProviderRequest::Synthesize { id, .. } => Some(id),
                    _ => None,
                })
                .expect("a synthesize request");
            (evs, tts)
        }

        fn synthesized(&mut self, id: RequestId, samples: usize) -> Vec<Ev> {
            let mut evs = self.provider(ProviderEvent::Audio {
                id,
                samples: vec![1000; samples],
                sample_rate: 24_000,
            });
            evs.extend(self.provider(ProviderEvent::Done { id }));
            evs.extend(self.due_now());
            evs
        }

        /// Runs the steps due at the current time, as the driver does at once (reply audio
        /// is encoded a frame per step).
        fn due_now(&mut self) -> Vec<Ev> {
            let mut evs = Vec::new();
            while self.conn.poll_timeout().is_some_and(|t| t <= self.now) {
                evs.extend(self.step(|c, now, out| c.on_timeout(now, out)));
            }
            evs
        }
    }

    #[test]
    fn frames_are_decoded_in_the_reader() {
        let text = |s: &str| ClientFrame::Text(s.to_owned().into());
        assert!(matches!(
            XiaozhiDoor::decode(text(r#"{"type":"abort"}"#), 100),
            Inbound::Keep(In::Message(m)) if matches!(*m, DeviceMessage::Abort(_))
        ));
        assert!(matches!(
            XiaozhiDoor::decode(text("{nope"), 100),
            Inbound::Keep(In::Unparsable(_))
        ));
        assert!(matches!(
            XiaozhiDoor::decode(ClientFrame::Binary(Bytes::from_static(&[1, 2])), 100),
            Inbound::Droppable(In::Audio(_))
        ));
        assert!(matches!(
            XiaozhiDoor::decode(ClientFrame::Binary(Bytes::from(vec![0; 101])), 100),
            Inbound::Keep(In::Oversized {
                len: 101,
                binary: true,
                limit: 100
            })
        ));
        assert!(matches!(
            XiaozhiDoor::decode(text(&"x".repeat(101)), 100),
            Inbound::Keep(In::Oversized { binary: false, .. })
        ));
    }

    #[test]
    fn the_door_overrides_init_and_idle_timeouts() {
        let mut c = XiaozhiConfig {
            hello_timeout_ms: 300,
            idle_timeout_secs: 7,
            ..XiaozhiConfig::default()
        };
        let base = SessionLimits::default();
        let l = limits(&c, &base);
        assert_eq!(l.init_timeout, Some(300 * MS));
        assert_eq!(l.idle_timeout, Some(Duration::from_secs(7)));
        assert_eq!(l.ping_interval, base.ping_interval);
        assert_eq!(l.write_timeout, base.write_timeout);
        c.idle_timeout_secs = 0;
        assert_eq!(limits(&c, &base).idle_timeout, None);
    }

    #[test]
    fn before_the_hello_everything_is_counted_and_ignored() {
        let mut d = Dev::new(Config::default());
        assert!(!d.conn.initialized());
        assert!(
            d.frame(ClientFrame::Binary(Bytes::from_static(&[0xf8, 0xff])))
                .is_empty()
        );
        assert!(
            d.send(&json!({"type":"listen","state":"start","mode":"auto"}))
                .is_empty()
        );
        assert!(d.frame(ClientFrame::Text("{not json".into())).is_empty());
        assert!(d.send(&json!({"type":"abort"})).is_empty());
        assert_eq!(errors(&d.app), 4);
        assert!(!d.conn.initialized());
        assert_eq!(d.conn.poll_timeout(), None);
        assert!(d.conn.is_idle());
        assert_eq!(d.closed, None);
        // A hello for another transport does not count.
        assert!(
            d.send(&json!({"type":"hello","transport":"udp"}))
                .is_empty()
        );
        assert!(!d.conn.initialized());
        let hello = d.hello(false);
        assert!(d.conn.initialized());
        assert_eq!(hello["type"], "hello");
        assert_eq!(hello["session_id"].as_str().unwrap().len(), 36);
        assert_eq!(hello["audio_params"]["sample_rate"], 24_000);
        assert_eq!(
            d.hello(false)["session_id"],
            hello["session_id"],
            "answered again"
        );
    }

    #[test]
    fn goodbye_closes_normally() {
        let mut d = Dev::new(Config::default());
        d.hello(false);
        assert!(
            d.send(&json!({"type":"goodbye","session_id":"x"}))
                .is_empty()
        );
        assert_eq!(d.closed, Some(door::close_code::NORMAL));
    }

    #[test]
    fn bad_frames_after_the_hello_are_counted_and_the_session_goes_on() {
        let mut d = Dev::new(Config::default());
        d.hello(false);
        let before = errors(&d.app);
        assert!(d.send(&json!({"type":"frobnicate"})).is_empty());
        assert!(
            d.send(&json!({"type":"listen","state":"sideways"}))
                .is_empty()
        );
        assert!(d.send(&json!({"type":"iot","descriptors":[]})).is_empty());
        assert!(
            d.frame(ClientFrame::Binary(Bytes::from(vec![0; 5000])))
                .is_empty()
        );
        assert!(
            d.frame(ClientFrame::Binary(Bytes::from_static(&[0xff; 40])))
                .is_empty()
        );
        assert_eq!(errors(&d.app), before + 4, "iot is accepted");
        assert_eq!(d.closed, None);
    }

    #[test]
    fn a_text_turn_is_paced_and_stopped_after_playout() {
        let mut d = Dev::new(Config::default());
        let hello = d.hello(false);
        let sid = hello["session_id"].clone();
        let evs = d.send(&json!({"type":"listen","state":"detect","text":"hello there"}));
        assert_eq!(labels(&evs), ["stt"]);
        let (evs, tts) = d.generate("🙂 Hello there.");
        assert_eq!(labels(&evs), ["tts start", "llm"]);
        let Ev::Json(llm) = &evs[1] else { panic!() };
        assert_eq!(
            llm,
            &json!({"type":"llm","session_id":sid,"text":"🙂","emotion":"happy"})
        );
        assert!(!d.conn.is_idle(), "a reply is under way");
        // 480 ms of audio: 8 frames; five at once, then one per 60 ms.
        let t_audio = d.at();
        let mut log: Vec<(Duration, Ev)> = d
            .synthesized(tts, FRAME * 8)
            .into_iter()
            .map(|e| (t_audio, e))
            .collect();
        while !log.iter().any(|(_, e)| e.label() == "tts stop") {
            assert!(d.at() < Duration::from_secs(10), "{log:?}");
            let evs = d.tick().expect("a deadline while speaking");
            let at = d.at();
            log.extend(evs.into_iter().map(|e| (at, e)));
        }
        let l: Vec<String> = log.iter().map(|(_, e)| e.label()).collect();
        let mut expected = vec!["tts sentence_start".to_owned()];
        expected.extend(std::iter::repeat_n("audio".to_owned(), 8));
        expected.push("tts stop".into());
        assert_eq!(l, expected);
        let audio_at: Vec<Duration> = log
            .iter()
            .filter(|(_, e)| matches!(e, Ev::Audio(_)))
            .map(|(t, _)| *t - t_audio)
            .collect();
        assert_eq!(
            audio_at,
            [0, 0, 0, 0, 0, 60, 120, 180].map(|ms| ms * MS),
            "a lead of five, then real time"
        );
        let (stop_at, _) = log.last().unwrap();
        assert!(
            *stop_at - t_audio >= 480 * MS,
            "stop after playout: {stop_at:?}"
        );
        assert!(*stop_at - t_audio < 600 * MS, "{stop_at:?}");
        assert!(d.conn.is_idle());
        // Every frame is one 60 ms packet (v1 framing: the bare packet).
        let mut dec =
            voxgate_audio::opus::OpusDecoder::new(24_000, voxgate_audio::opus::OpusBackend::Pure)
                .unwrap();
        for (_, e) in &log {
            if let Ev::Audio(packet) = e {
                assert_eq!(dec.decode(packet).unwrap().len(), FRAME);
            }
        }
        // Nothing else comes: no second stop.
        while let Some(evs) = d.tick() {
            assert!(evs.is_empty(), "{evs:?}");
            if d.at() > Duration::from_secs(5) {
                break;
            }
        }
    }

    #[test]
    fn half_duplex_ignores_uplink_while_speaking_unless_realtime() {
        for (mode, heard) in [("auto", false), ("manual", false), ("realtime", true)] {
            let mut d = Dev::new(Config::default());
            d.hello(false);
            d.send(&json!({"type":"listen","state":"start","mode":mode}));
            // Push to talk: the button is released before the text turn.
            d.send(&json!({"type":"listen","state":"stop"}));
            d.send(&json!({"type":"listen","state":"detect","text":"hi"}));
            d.generate("Sure.");
            let before = errors(&d.app);
            // An undecodable packet is only noticed (and counted) when it is listened to.
            d.frame(ClientFrame::Binary(Bytes::from_static(&[0xff; 40])));
            assert_eq!(errors(&d.app) - before, u64::from(heard), "{mode}");
        }
    }

    #[test]
    fn abort_is_answered_once_whether_speaking_or_not() {
        let mut d = Dev::new(Config::default());
        d.hello(false);
        d.send(&json!({"type":"listen","state":"detect","text":"read me something long"}));
        let (_, tts) = d.generate("Once upon a time.");
        let evs = d.synthesized(tts, FRAME * 30);
        assert_eq!(evs.iter().filter(|e| matches!(e, Ev::Audio(_))).count(), 5);
        d.tick();
        let evs = d.send(&json!({"type":"abort"}));
        assert_eq!(labels(&evs), ["tts stop"]);
        assert!(d.conn.is_idle());
        // The rest of the reply is gone: no frame and no second stop later.
        while let Some(evs) = d.tick() {
            assert!(evs.is_empty(), "{:?}", labels(&evs));
            if d.at() > Duration::from_secs(5) {
                break;
            }
        }
        // Idle: answered anyway.
        let evs = d.send(&json!({"type":"abort","reason":"wake_word_detected"}));
        assert_eq!(labels(&evs), ["tts stop"]);
        // And the next turn is spoken again, from a fresh lead.
        d.send(&json!({"type":"listen","state":"detect","text":"still there"}));
        let (evs, tts) = d.generate("Yes.");
        assert_eq!(labels(&evs), ["tts start", "llm"]);
        let evs = d.synthesized(tts, FRAME * 6);
        assert_eq!(evs.iter().filter(|e| matches!(e, Ev::Audio(_))).count(), 5);
    }

    #[test]
    fn wake_words_greet_or_are_acknowledged() {
        let mut d = Dev::new(Config::default());
        d.hello(false);
        assert!(
            d.send(&json!({"type":"listen","state":"detect","text":"你好，小智"}))
                .is_empty()
        );
        assert!(matches!(d.take_request(), ProviderRequest::Generate { .. }));
        let mut config = Config::default();
        config.xiaozhi.greet_on_wake = false;
        let mut d = Dev::new(config);
        d.hello(false);
        let evs = d.send(&json!({"type":"listen","state":"detect","text":"Hi ESP"}));
        assert_eq!(labels(&evs), ["stt", "tts stop"]);
        assert!(d.requests.is_empty());
    }

    #[test]
    fn no_asr_markers_never_reach_the_screen() {
        let mut d = Dev::new(Config::default());
        d.hello(false);
        let marker = voxgate_providers::no_asr_marker(2.4);
        let evs = d.step(|c, now, out| {
            let text = marker.clone();
            c.client_event(
                now,
                ClientEvent::UserTranscription {
                    turn: TurnId(1),
                    text,
                    language: String::new(),
                },
                out,
            );
        });
        assert!(evs.is_empty(), "{evs:?}");
        let evs = d.step(|c, now, out| {
            let text = format!("lights {marker} on");
            c.client_event(
                now,
                ClientEvent::UserTranscription {
                    turn: TurnId(2),
                    text,
                    language: String::new(),
                },
                out,
            );
        });
        let Ev::Json(stt) = &evs[0] else { panic!() };
        assert_eq!(stt["type"], "stt");
        assert_eq!(stt["text"], "lights on");
    }

    #[test]
    fn device_mcp_initialize_carries_vision() {
        let mut d = Dev::new(Config::default());
        let mut out = Out::new();
        d.conn.on_client(
            d.now,
            In::Message(Box::new(
                DeviceMessage::from_slice(
                    br#"{"type":"hello","version":1,"transport":"websocket","features":{"mcp":true}}"#,
                )
                .unwrap(),
            )),
            &mut out,
        );
        let frames = out.take_frames();
        assert_eq!(frames.len(), 2, "{frames:?}");
        let ServerFrame::Text(t) = &frames[1] else {
            panic!()
        };
        let v: Value = serde_json::from_str(t).unwrap();
        assert_eq!(v["type"], "mcp");
        assert_eq!(v["payload"]["method"], "initialize");
        assert_eq!(
            v["payload"]["params"]["capabilities"]["vision"],
            json!({"url":"http://h/xiaozhi/vision/explain","token":"tok"})
        );
    }

    #[test]
    fn closing_cancels_provider_work() {
        let mut d = Dev::new(Config::default());
        d.hello(false);
        d.send(&json!({"type":"listen","state":"detect","text":"hello"}));
        let ProviderRequest::Generate { id, .. } = d.take_request() else {
            panic!()
        };
        d.step(|c, now, out| c.on_close(now, out));
        assert!(
            d.requests
                .iter()
                .any(|r| matches!(r, ProviderRequest::Cancel { id: c } if *c == id)),
            "{:?}",
            d.requests
        );
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
