//! The door's protocol logic on top of the shared door driver ([`crate::door`]): one
//! connection holds at most one bridge session (`CONNECT_GEMINI` to `DISCONNECT_GEMINI`), by
//! mode an [`EngineSession`] or a [`PassSession`]. Replacing or ending a session drops it
//! whole: its provider work is cancelled (and its late events no longer match its ids), its
//! upstream connection is aborted, so nothing from an old session reaches the client after
//! the new `SETUP_COMPLETE`.
//!
//! Voice over WebRTC (the original Android app's only voice path): `WEBRTC_OFFER` becomes a
//! [`MediaCommand::Accept`], the driver's answer a `WEBRTC_ANSWER` plus the server's
//! candidates as `WEBRTC_ICE_CANDIDATE`, the app's candidates [`MediaCommand::Candidate`]s.
//! The WebRTC connection belongs to the WebSocket connection, not to a bridge session: it may
//! be offered before `CONNECT_GEMINI`, outlives a session replaced by `CONNECT_GEMINI` or
//! `UPDATE_CONFIG`, and is hung up by `DISCONNECT_GEMINI`, a new offer (which replaces it) or
//! the socket's end. From its answer the session speaks on the track (the connection holds the
//! audio until ICE and DTLS are up: the app that offered plays nothing else), and while it is
//! connected the session hears the track.

use std::sync::Arc;
use std::time::{Duration, Instant};

use voxgate_engine::ProviderEvent;
use voxgate_gemini::bridge::{IceCandidate, IceMessage};
use voxgate_gemini::live::INPUT_SAMPLE_RATE;
use voxgate_gemini::{ClientMessage, LiveConfig, ServerMessage};

use super::engine::{EngineSession, Flags, Ids};
use super::passthrough::{Connector, PassSession, UpEvent};
use super::{GeminiConfig, GeminiMode, emit};
use crate::door::{ClientFrame, Inbound, MediaCommand, Out, Translator};
use crate::metrics::{Door, Metrics};
use crate::webrtc::{DataChannel, MediaEvent, OfferError, PeerOptions};

/// Longest ICE candidate line taken from the app (real ones are under 200 bytes).
const MAX_CANDIDATE_BYTES: usize = 1024;
/// Longest `a=mid:` echoed back in the server's candidates.
const MAX_MID_BYTES: usize = 32;

/// A decoded client frame, or the error to answer it with.
// One crosses the reader's queue per frame; boxing client messages would cost an allocation each.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(super) enum Incoming {
    Message(ClientMessage),
    Bad(ServerMessage),
}

/// The session behind a connection, by mode.
enum Backend {
    Engine(Box<EngineSession>),
    Pass(PassSession),
}

/// One bridge connection's state.
pub(super) struct GeminiDoor {
    config: GeminiConfig,
    metrics: Arc<Metrics>,
    connect: Connector,
    backend: Option<Backend>,
    /// Engine sessions opened on this connection: each tags its provider requests with it.
    generation: u32,
    /// A session was set up once: the initialization timeout no longer applies.
    initialized: bool,
    /// The initialization timeout, for the error that tells the client about it.
    init_timeout: Option<Duration>,
    /// `[limits] max_history_messages` for the engine sessions (0: unlimited).
    max_history_messages: usize,
    /// The MCP endpoint's tools, for every engine session this connection opens.
    server_tools: Vec<voxgate_engine::ServerToolDefinition>,
    /// The server answers WebRTC offers (`[webrtc] enabled`).
    webrtc: bool,
    /// The connection's WebRTC side.
    media: Media,
}

/// The WebRTC side of a bridge connection.
#[derive(Debug)]
struct Media {
    /// Send the server's candidates nested (`{"candidate":{...}}`, the Android app's form)
    /// rather than flat: nested until the app shows its own form.
    nested: bool,
    /// The audio m-line of the offer being answered: `(mid, index)`.
    offered: Option<(String, u32)>,
    /// The answered connection's audio m-line, for the server's candidates.
    line: (String, u32),
    /// An answered connection exists (until it closes or is hung up).
    open: bool,
    /// Reply audio goes on the track: from the answer (the connection queues it until ICE and
    /// DTLS are up, as the app that offered plays nothing else) until the connection closes.
    track: bool,
}

impl Default for Media {
    fn default() -> Self {
        Self {
            nested: true,
            offered: None,
            line: ("0".into(), 0),
            open: false,
            track: false,
        }
    }
}

/// The audio section of an SDP offer: its `a=mid:` and its index among the m-lines, which
/// the server's trickled candidates name (`"0"`/`0` when the offer does not say).
fn audio_line(sdp: &str) -> (String, u32) {
    let mut index: Option<u32> = None;
    let mut lines_seen = 0u32;
    for line in sdp.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("m=") {
            if index.is_some() {
                // The audio section ended without a mid.
                break;
            }
            if rest.starts_with("audio") {
                index = Some(lines_seen);
            }
            lines_seen = lines_seen.saturating_add(1);
        } else if let (Some(i), Some(mid)) = (index, line.strip_prefix("a=mid:")) {
            let mid = mid.trim();
            if !mid.is_empty() && mid.len() <= MAX_MID_BYTES {
                return (mid.to_owned(), i);
            }
        }
    }
    let i = index.unwrap_or(0);
    (i.to_string(), i)
}

fn too_big(len: usize, max: usize) -> ServerMessage {
    ServerMessage::error(format!(
        "Message of {len} bytes exceeds the limit of {max} bytes."
    ))
}

/// Microphone audio only: the one client message that may be dropped when the session is
/// behind (anything with text or an end-of-input mark must arrive).
fn is_audio_only(m: &ClientMessage) -> bool {
    matches!(m, ClientMessage::SendRealtimeInput(r)
        if r.audio.is_some() && r.text.is_none() && !r.activity_end && !r.audio_stream_end)
}

impl GeminiDoor {
    /// A connection served by `config`'s mode; pass-through sessions open their upstream
    /// through `connect`. `init_timeout` is what the driver enforces (for the error text).
    pub(super) fn new(
        config: GeminiConfig,
        metrics: Arc<Metrics>,
        connect: Connector,
        init_timeout: Option<Duration>,
    ) -> Self {
        Self {
            config,
            metrics,
            connect,
            backend: None,
            generation: 0,
            initialized: false,
            init_timeout,
            max_history_messages: crate::config::limits::DEFAULT_MAX_HISTORY_MESSAGES,
            server_tools: Vec::new(),
            webrtc: false,
            media: Media::default(),
        }
    }

    /// Answers WebRTC offers (the server has a WebRTC endpoint); without, WebRTC signalling is
    /// answered with a `GEMINI_ERROR` saying it is not supported.
    pub(super) fn with_webrtc(mut self, enabled: bool) -> Self {
        self.webrtc = enabled;
        self
    }

    /// Bounds the history of the engine sessions this connection opens.
    pub(super) fn with_history_limit(mut self, max_history_messages: usize) -> Self {
        self.max_history_messages = max_history_messages;
        self
    }

    /// Ends the current session, if any: its provider work is cancelled, its upstream
    /// connection closed.
    fn end_session(&mut self, now: Instant, out: &mut Out) {
        if let Some(Backend::Engine(mut e)) = self.backend.take() {
            e.close(now, out);
        }
    }

    /// Hangs up the WebRTC connection, if there is one.
    fn hang_up(&mut self, out: &mut Out) {
        if self.media.open {
            out.media(MediaCommand::Hangup);
        }
        self.media.open = false;
        self.set_track(false);
    }

    /// Whether reply audio goes on the track, for the session now and those opened later.
    fn set_track(&mut self, up: bool) {
        self.media.track = up;
        match &mut self.backend {
            Some(Backend::Engine(e)) => e.set_media(up),
            Some(Backend::Pass(p)) => p.set_media(up),
            None => {}
        }
    }

    /// `WEBRTC_OFFER`: the driver answers it and calls [`Translator::on_media`] at once.
    fn offer(&mut self, sdp: String, out: &mut Out) {
        if !self.webrtc {
            self.error(out, &ServerMessage::webrtc_unsupported());
            return;
        }
        self.media.offered = Some(audio_line(&sdp));
        out.media(MediaCommand::Accept {
            offer: sdp,
            options: PeerOptions {
                input_rate: INPUT_SAMPLE_RATE,
                data_channel: DataChannel::PingPong,
            },
        });
    }

    /// `WEBRTC_ICE_CANDIDATE` from the app, flat or nested; an empty candidate marks the end
    /// of its candidates and needs nothing.
    fn remote_candidate(&mut self, ice: IceMessage, out: &mut Out) {
        if !self.webrtc {
            self.error(out, &ServerMessage::webrtc_unsupported());
            return;
        }
        // Our candidates go out in the form the app uses for its own.
        self.media.nested = ice.nested;
        let Some(line) = ice.candidate.candidate else {
            return;
        };
        let line = line.trim();
        let line = line.strip_prefix("a=").unwrap_or(line);
        if line.is_empty() {
            return;
        }
        if line.len() > MAX_CANDIDATE_BYTES {
            self.error(
                out,
                &ServerMessage::error(format!(
                    "ICE candidate of {} bytes exceeds the limit of {MAX_CANDIDATE_BYTES} bytes.",
                    line.len()
                )),
            );
            return;
        }
        out.media(MediaCommand::Candidate(line.to_owned()));
    }

    /// The server's candidate for the answered connection's audio m-line, in the app's form.
    fn local_candidate(&self, line: String) -> ServerMessage {
        let (mid, index) = &self.media.line;
        ServerMessage::WebrtcIceCandidate(IceMessage {
            candidate: IceCandidate {
                candidate: Some(line),
                sdp_mid: Some(mid.clone()),
                sdp_m_line_index: Some(*index),
                username_fragment: None,
            },
            nested: self.media.nested,
        })
    }

    /// Microphone audio from the track goes to the session like `SEND_REALTIME_INPUT` audio;
    /// without a session it is dropped.
    fn media_audio(&mut self, now: Instant, samples: &[i16], out: &mut Out) {
        let stuck = match &mut self.backend {
            Some(Backend::Engine(e)) => {
                e.media_audio(now, samples, out);
                false
            }
            Some(Backend::Pass(p)) => !p.media_audio(samples),
            None => false,
        };
        if stuck {
            self.upstream_stuck(out);
        }
    }

    /// The upstream stopped reading: the pass-through session is ended.
    fn upstream_stuck(&mut self, out: &mut Out) {
        self.backend = None;
        self.error(
            out,
            &ServerMessage::error("Gemini is not reading the session's messages: it was ended."),
        );
        emit(
            out,
            &ServerMessage::GeminiDisconnected {
                reason: Some("Gemini stopped reading.".into()),
            },
        );
    }

    fn error(&self, out: &mut Out, m: &ServerMessage) {
        self.metrics.error(Door::Gemini);
        emit(out, m);
    }

    fn handle(&mut self, now: Instant, m: ClientMessage, out: &mut Out) {
        match m {
            ClientMessage::ConnectGemini { initial_config } => {
                self.end_session(now, out);
                self.start_session(now, initial_config.unwrap_or_default(), true, out);
            }
            ClientMessage::DisconnectGemini => {
                let had = self.backend.is_some();
                self.end_session(now, out);
                self.hang_up(out);
                // The socket stays open: the app may connect again.
                emit(
                    out,
                    &ServerMessage::GeminiDisconnected {
                        reason: Some(if had {
                            "Disconnected by client request.".into()
                        } else {
                            "No Gemini session was open.".into()
                        }),
                    },
                );
            }
            // Signalling is allowed before CONNECT_GEMINI: the connection is the socket's.
            ClientMessage::WebrtcOffer { sdp } => self.offer(sdp, out),
            ClientMessage::WebrtcIceCandidate(ice) => self.remote_candidate(ice, out),
            ClientMessage::Unknown { kind, .. } => {
                self.error(out, &ServerMessage::unknown_type(&kind));
            }
            m if m.needs_session() && self.backend.is_none() => {
                self.error(out, &ServerMessage::not_connected());
            }
            ClientMessage::GenerateImage { .. } => emit(
                out,
                &ServerMessage::ImageGenerationResult(
                    voxgate_gemini::bridge::ImageGenerationResult {
                        success: false,
                        error: Some("Image generation is not available on this server.".into()),
                        ..Default::default()
                    },
                ),
            ),
            ClientMessage::UpdateConfig(config) => match &mut self.backend {
                Some(Backend::Engine(e)) if e.can_reconfigure(&config) => {
                    e.reconfigure(now, &config, out);
                    emit(out, &ServerMessage::setup_ok());
                }
                _ => {
                    // A new session with the new config, replacing the old one whole (the
                    // upstream takes `setup` once per connection): nothing of the old one
                    // can arrive after the new SETUP_COMPLETE.
                    self.end_session(now, out);
                    self.start_session(now, config, false, out);
                }
            },
            other => {
                let going_on = match &mut self.backend {
                    Some(Backend::Engine(e)) => {
                        e.handle(now, other, out);
                        true
                    }
                    Some(Backend::Pass(p)) => p.forward(&other, out),
                    None => true,
                };
                if !going_on {
                    self.upstream_stuck(out);
                }
            }
        }
    }

    /// Opens a session with `config`; `connect` sends `GEMINI_CONNECTED` first (a new
    /// `CONNECT_GEMINI`, not an `UPDATE_CONFIG`).
    fn start_session(&mut self, now: Instant, config: LiveConfig, connect: bool, out: &mut Out) {
        match self.config.mode {
            GeminiMode::Passthrough => {
                match PassSession::start(
                    config,
                    &self.config,
                    Arc::clone(&self.metrics),
                    connect,
                    &self.connect,
                ) {
                    // Initialized once the upstream opens (`on_event`).
                    Ok(mut p) => {
                        p.set_media(self.media.track);
                        self.backend = Some(Backend::Pass(p));
                    }
                    Err(message) => {
                        self.error(
                            out,
                            &ServerMessage::setup_failed(Some(503), message.clone()),
                        );
                        emit(out, &ServerMessage::error(message));
                    }
                }
            }
            // Engine mode and any mode added later.
            _ => {
                let flags = Flags {
                    audio_chunks: self.config.audio_chunks,
                    assistant_speaking: self.config.assistant_speaking,
                    max_history_messages: self.max_history_messages,
                };
                self.generation = self.generation.wrapping_add(1);
                let ids = Ids::new(self.generation);
                if connect {
                    emit(out, &ServerMessage::GeminiConnected);
                }
                let metrics = Arc::clone(&self.metrics);
                let settings = &self.config.engine;
                match EngineSession::new(&config, settings, metrics, flags, ids, now) {
                    Ok(mut session) => {
                        session.set_media(self.media.track);
                        // Tool declarations refused (`GEMINI_ERROR`s) come before
                        // SETUP_COMPLETE, as on UPDATE_CONFIG: an app reading up to
                        // SETUP_COMPLETE has seen every complaint about its config.
                        session.start(now, &config, out);
                        session.server_tools(now, self.server_tools.clone(), out);
                        emit(out, &ServerMessage::setup_ok());
                        // A new conversation is greeted; one replaced by UPDATE_CONFIG is not.
                        if connect {
                            session.greet(now, settings, out);
                        }
                        self.backend = Some(Backend::Engine(Box::new(session)));
                        self.initialized = true;
                    }
                    Err(message) => {
                        self.error(
                            out,
                            &ServerMessage::setup_failed(Some(400), message.clone()),
                        );
                        emit(out, &ServerMessage::error(message));
                    }
                }
            }
        }
    }
}

impl Translator for GeminiDoor {
    type In = Incoming;
    type Event = UpEvent;

    fn decode(frame: ClientFrame, max_frame_bytes: usize) -> Inbound<Incoming> {
        let len = match &frame {
            ClientFrame::Text(t) => t.len(),
            ClientFrame::Binary(b) => b.len(),
        };
        if len > max_frame_bytes {
            return Inbound::Keep(Incoming::Bad(too_big(len, max_frame_bytes)));
        }
        let decoded = match &frame {
            ClientFrame::Text(t) => ClientMessage::decode(t.as_str()),
            // The bridge speaks text frames; JSON in a binary frame is accepted too.
            ClientFrame::Binary(b) => ClientMessage::decode_slice(b),
        };
        match decoded {
            Ok(m) if is_audio_only(&m) => Inbound::Droppable(Incoming::Message(m)),
            Ok(m) => Inbound::Keep(Incoming::Message(m)),
            Err(e) => Inbound::Keep(Incoming::Bad(e.reply())),
        }
    }

    fn on_client(&mut self, now: Instant, msg: Incoming, out: &mut Out) {
        match msg {
            Incoming::Bad(reply) => self.error(out, &reply),
            Incoming::Message(m) => self.handle(now, m, out),
        }
    }

    fn on_provider(&mut self, now: Instant, event: ProviderEvent, out: &mut Out) {
        if let Some(Backend::Engine(e)) = &mut self.backend {
            e.provider_event(now, event, out);
        }
    }

    fn on_timeout(&mut self, now: Instant, out: &mut Out) {
        if let Some(Backend::Engine(e)) = &mut self.backend {
            e.timeout(now, out);
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        match &self.backend {
            Some(Backend::Engine(e)) => e.deadline(),
            _ => None,
        }
    }

    fn initialized(&self) -> bool {
        self.initialized
    }

    fn on_init_timeout(&mut self, _now: Instant, out: &mut Out) {
        // The driver counts the error and closes with 1008 after this.
        let within = self
            .init_timeout
            .map(|t| format!(" within {} s", t.as_secs_f64().ceil()))
            .unwrap_or_default();
        emit(
            out,
            &ServerMessage::error(format!(
                "No Gemini session was connected{within}: send CONNECT_GEMINI first. Closing."
            )),
        );
    }

    fn on_shutdown(&mut self, now: Instant, out: &mut Out) {
        self.end_session(now, out);
        self.hang_up(out);
        emit(
            out,
            &ServerMessage::GeminiDisconnected {
                reason: Some("server shutting down".into()),
            },
        );
    }

    fn speculation_stats(&self) -> Option<voxgate_engine::SpeculationStats> {
        match &self.backend {
            Some(Backend::Engine(s)) => Some(s.speculation_stats()),
            _ => None,
        }
    }

    fn take_telemetry(&mut self, sink: &mut Vec<voxgate_engine::TurnEvent>) {
        if let Some(Backend::Engine(s)) = &mut self.backend {
            s.take_telemetry(sink);
        }
    }

    fn on_close(&mut self, now: Instant, out: &mut Out) {
        self.end_session(now, out);
        self.hang_up(out);
    }

    fn on_media(&mut self, now: Instant, event: MediaEvent, out: &mut Out) {
        match event {
            MediaEvent::Answer { sdp, candidates } => {
                // A new connection (replacing any earlier one). Reply audio goes to it from
                // now: the app that offered plays only the track, and the connection holds
                // what comes before ICE and DTLS are up and sends it then.
                self.media.open = true;
                self.set_track(true);
                self.media.line = self.media.offered.take().unwrap_or_else(|| ("0".into(), 0));
                emit(out, &ServerMessage::WebrtcAnswer { sdp });
                for c in candidates {
                    emit(out, &self.local_candidate(c));
                }
            }
            MediaEvent::Refused(reason) => {
                // The driver keeps an earlier connection when a new offer is refused.
                self.media.offered = None;
                if reason == OfferError::Disabled.to_string() {
                    self.error(out, &ServerMessage::webrtc_unsupported());
                } else {
                    self.error(
                        out,
                        &ServerMessage::error(format!("WebRTC offer refused: {reason}")),
                    );
                }
            }
            MediaEvent::Connected => {
                tracing::debug!("gemini door: WebRTC connected");
            }
            MediaEvent::Audio(samples) => self.media_audio(now, &samples, out),
            MediaEvent::Closed(reason) => {
                // The bridge has no message for it: the session goes on over the WebSocket.
                tracing::info!(%reason, "gemini door: WebRTC connection closed");
                self.media.open = false;
                self.set_track(false);
            }
            // The bridge asks for no data channel.
            MediaEvent::DataOpen | MediaEvent::Data(_) => {}
        }
    }

    fn on_server_tools(
        &mut self,
        now: Instant,
        tools: Vec<voxgate_engine::ServerToolDefinition>,
        out: &mut Out,
    ) {
        if let Some(Backend::Engine(e)) = &mut self.backend {
            e.server_tools(now, tools.clone(), out);
        }
        self.server_tools = tools;
    }

    fn events(&mut self) -> Option<&mut tokio::sync::mpsc::Receiver<UpEvent>> {
        match &mut self.backend {
            Some(Backend::Pass(p)) => Some(p.events()),
            _ => None,
        }
    }

    fn on_event(&mut self, _now: Instant, event: Option<UpEvent>, out: &mut Out) {
        let Some(Backend::Pass(p)) = &mut self.backend else {
            return;
        };
        let Some(event) = event else {
            // The relay task always reports how it ended; it can only vanish by failing.
            self.backend = None;
            self.error(
                out,
                &ServerMessage::GeminiDisconnected {
                    reason: Some("The Gemini connection ended.".into()),
                },
            );
            return;
        };
        if matches!(event, UpEvent::Open) {
            self.initialized = true;
        }
        if !p.upstream_event(event, out) {
            self.backend = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use serde_json::{Value, json};
    use tokio::sync::mpsc;
    use voxgate_engine::{ProviderRequest, RequestId};
    use voxgate_gemini::LiveServerMessage;

    use super::*;
    use crate::door::ServerFrame;
    use crate::gemini::passthrough::{self, Link};
    use crate::metrics::Direction;

    /// The far ends of the upstream connections a door opened: URL, `setup` frame, what the
    /// door sends up, and where the test plays the upstream.
    type Upstreams = Arc<
        Mutex<
            Vec<(
                String,
                String,
                mpsc::Receiver<String>,
                mpsc::Sender<UpEvent>,
            )>,
        >,
    >;

    struct Harness {
        door: GeminiDoor,
        metrics: Arc<Metrics>,
        upstreams: Upstreams,
        now: Instant,
        out: Out,
    }

    impl Harness {
        fn new(config: GeminiConfig) -> Self {
            let upstreams: Upstreams = Arc::default();
            let seen = Arc::clone(&upstreams);
            let connect: Connector = Arc::new(move |url, setup| {
                let (link, up_rx, ev_tx): (Link, _, _) = passthrough::test_link();
                seen.lock().unwrap().push((url, setup, up_rx, ev_tx));
                link
            });
            let metrics = Arc::new(Metrics::new());
            let door = GeminiDoor::new(
                config,
                Arc::clone(&metrics),
                connect,
                Some(Duration::from_secs(10)),
            );
            Self {
                door,
                metrics,
                upstreams,
                now: Instant::now(),
                out: Out::new(),
            }
        }

        fn engine() -> Self {
            Self::new(GeminiConfig::default())
        }

        fn passthrough() -> Self {
            Self::new(GeminiConfig {
                mode: GeminiMode::Passthrough,
                api_key: Some("secret".into()),
                base_url: "ws://127.0.0.1:9".into(),
                ..GeminiConfig::default()
            })
        }

        #[allow(
            clippy::needless_pass_by_value,
            reason = "call sites pass json! literals"
        )]
        fn client(&mut self, msg: Value) {
            let frame = ClientFrame::Text(msg.to_string().into());
            match GeminiDoor::decode(frame, 1 << 20) {
                Inbound::Keep(m) | Inbound::Droppable(m) => {
                    self.door.on_client(self.now, m, &mut self.out);
                }
            }
        }

        #[allow(
            clippy::needless_pass_by_value,
            reason = "call sites pass json! literals"
        )]
        fn connect(&mut self, config: Value) {
            self.client(json!({"type": "CONNECT_GEMINI", "payload": {"initialConfig": config}}));
        }

        fn say(&mut self, text: &str) {
            self.client(json!({"type": "SEND_MESSAGE", "payload": {"parts": [{"text": text}]}}));
        }

        fn upstream(&mut self, event: UpEvent) {
            self.door.on_event(self.now, Some(event), &mut self.out);
        }

        #[allow(
            clippy::needless_pass_by_value,
            reason = "call sites pass json! literals"
        )]
        fn upstream_json(&mut self, v: Value) {
            let m = LiveServerMessage::decode(&v.to_string()).unwrap();
            self.upstream(UpEvent::Message(Box::new(m)));
        }

        fn messages(&mut self) -> Vec<Value> {
            self.out
                .take_frames()
                .into_iter()
                .map(|f| match f {
                    ServerFrame::Text(t) => serde_json::from_str(&t).unwrap(),
                    ServerFrame::Binary(_) => panic!("the bridge sends text"),
                })
                .collect()
        }

        fn requests(&mut self) -> Vec<ProviderRequest> {
            self.out.take_requests()
        }

        /// The same door, answering WebRTC offers.
        fn webrtc(mut self) -> Self {
            self.door.webrtc = true;
            self
        }

        fn media(&mut self) -> Vec<MediaCommand> {
            self.out.take_media()
        }

        fn media_event(&mut self, event: MediaEvent) {
            self.door.on_media(self.now, event, &mut self.out);
        }

        /// Offers `sdp`, has the driver answer it with one candidate and the connection come
        /// up; returns the signalling the app got.
        fn webrtc_up(&mut self, sdp: &str) -> Vec<Value> {
            self.client(json!({"type": "WEBRTC_OFFER", "payload": {"sdp": sdp}}));
            assert!(matches!(self.media()[..], [MediaCommand::Accept { .. }]));
            self.media_event(MediaEvent::Answer {
                sdp: "v=0\r\n".into(),
                candidates: vec![CANDIDATE.into()],
            });
            self.media_event(MediaEvent::Connected);
            self.messages()
        }

        /// Moves the clock by `by`, firing the door's deadlines on the way.
        fn advance(&mut self, by: Duration) {
            let target = self.now + by;
            while let Some(d) = self.door.poll_timeout().filter(|d| *d <= target) {
                self.now = self.now.max(d);
                self.door.on_timeout(self.now, &mut self.out);
            }
            self.now = target;
        }

        /// What the door sent to the upstream of connection `n`.
        fn sent_up(&self, n: usize) -> Vec<Value> {
            let mut ups = self.upstreams.lock().unwrap();
            let mut out = Vec::new();
            while let Ok(f) = ups[n].2.try_recv() {
                out.push(serde_json::from_str(&f).unwrap());
            }
            out
        }
    }

    /// A Chrome (libwebrtc) audio-only offer, as the Android app sends.
    const CHROME_OFFER: &str = include_str!("../../tests/fixtures/chrome_audio_offer.sdp");
    const CANDIDATE: &str = "candidate:1 1 udp 2130706431 127.0.0.1 40000 typ host";

    fn kinds(messages: &[Value]) -> Vec<&str> {
        messages
            .iter()
            .map(|m| m["type"].as_str().unwrap())
            .collect()
    }

    fn text_config() -> Value {
        json!({"generationConfig": {"responseModalities": "TEXT"}})
    }

    fn generates(requests: &[ProviderRequest]) -> Vec<RequestId> {
        requests
            .iter()
            .filter_map(|r| match r {
                ProviderRequest::Generate { id, .. } => Some(*id),
                _ => None,
            })
            .collect()
    }

    fn decoded(text: &str, max: usize) -> &'static str {
        match GeminiDoor::decode(ClientFrame::Text(text.to_owned().into()), max) {
            Inbound::Keep(Incoming::Message(_)) => "keep",
            Inbound::Droppable(Incoming::Message(_)) => "droppable",
            Inbound::Keep(Incoming::Bad(_)) => "bad",
            _ => "other",
        }
    }

    #[test]
    fn decode_marks_only_bare_microphone_audio_droppable() {
        let audio = json!({"mimeType": "audio/pcm;rate=16000", "data": "AAAA"});
        let msg =
            |payload: Value| json!({"type": "SEND_REALTIME_INPUT", "payload": payload}).to_string();
        assert_eq!(decoded(&msg(json!({"audio": audio})), 4096), "droppable");
        assert_eq!(
            decoded(&msg(json!({"audio": audio, "audioStreamEnd": true})), 4096),
            "keep"
        );
        assert_eq!(
            decoded(&msg(json!({"audio": audio, "text": "hi"})), 4096),
            "keep"
        );
        assert_eq!(decoded(r#"{"type":"DISCONNECT_GEMINI"}"#, 4096), "keep");
        assert_eq!(decoded("{not json", 4096), "bad");
        let big = msg(json!({"text": "x".repeat(100)}));
        assert_eq!(decoded(&big, 64), "bad");
        let Inbound::Keep(Incoming::Bad(reply)) =
            GeminiDoor::decode(ClientFrame::Binary(big.into_bytes().into()), 64)
        else {
            panic!("an oversized frame is answered");
        };
        assert!(reply.encode().contains("exceeds the limit of 64 bytes"));
    }

    #[test]
    fn the_session_is_initialized_by_a_successful_connect_only() {
        let mut h = Harness::engine();
        assert!(!h.door.initialized());
        h.say("hello?");
        let m = h.messages();
        assert_eq!(
            m[0]["payload"]["message"],
            "Gemini not connected. Send CONNECT_GEMINI first."
        );
        h.client(json!({"type": "DISCONNECT_GEMINI"}));
        assert_eq!(
            h.messages()[0]["payload"]["reason"],
            "No Gemini session was open."
        );
        assert!(!h.door.initialized());
        assert_eq!(h.door.poll_timeout(), None);
        h.connect(text_config());
        assert_eq!(kinds(&h.messages()), ["GEMINI_CONNECTED", "SETUP_COMPLETE"]);
        assert!(h.door.initialized());
        // Disconnecting does not make the connection new again.
        h.client(json!({"type": "DISCONNECT_GEMINI"}));
        assert_eq!(
            h.messages()[0]["payload"]["reason"],
            "Disconnected by client request."
        );
        assert!(h.door.initialized());
    }

    #[test]
    fn the_init_timeout_is_explained_before_the_driver_closes() {
        let mut h = Harness::engine();
        h.door.on_init_timeout(h.now, &mut h.out);
        let m = h.messages();
        assert_eq!(kinds(&m), ["GEMINI_ERROR"]);
        assert_eq!(
            m[0]["payload"]["message"],
            "No Gemini session was connected within 10 s: send CONNECT_GEMINI first. Closing."
        );
        // The driver closes; the translator asks for nothing itself.
        assert!(h.out.closing().is_none());
    }

    #[test]
    fn a_second_connect_replaces_the_session_and_drops_its_late_events() {
        let mut h = Harness::engine();
        h.connect(text_config());
        h.messages();
        h.say("first");
        let old = generates(&h.requests());
        assert_eq!(old.len(), 1);
        h.connect(text_config());
        // The old reply is cancelled before anything of the new session.
        assert_eq!(h.requests(), [ProviderRequest::Cancel { id: old[0] }]);
        assert_eq!(kinds(&h.messages()), ["GEMINI_CONNECTED", "SETUP_COMPLETE"]);
        // Its text, already on the way, never reaches the client.
        h.door.on_provider(
            h.now,
            ProviderEvent::TextDelta {
                id: old[0],
                delta: "late".into(),
            },
            &mut h.out,
        );
        h.door
            .on_provider(h.now, ProviderEvent::Done { id: old[0] }, &mut h.out);
        assert!(h.messages().is_empty());
        // The new session counts its ids from 1 too, in its own space.
        h.say("second");
        let new = generates(&h.requests());
        assert_eq!(new.len(), 1);
        assert_ne!(new[0], old[0]);
        assert_eq!(new[0].0 & 0xffff_ffff, old[0].0 & 0xffff_ffff);
        h.door.on_provider(
            h.now,
            ProviderEvent::TextDelta {
                id: new[0],
                delta: "fresh".into(),
            },
            &mut h.out,
        );
        h.door
            .on_provider(h.now, ProviderEvent::Done { id: new[0] }, &mut h.out);
        let m = h.messages();
        assert_eq!(
            kinds(&m),
            ["CONTENT_MESSAGE", "CONTENT_MESSAGE", "TURN_COMPLETE"]
        );
        assert_eq!(
            m[0]["payload"]["serverContent"]["modelTurn"]["parts"][0]["text"],
            "fresh"
        );
    }

    #[test]
    fn refused_tools_are_reported_before_setup_complete_on_every_path() {
        let config = |modality: &str| {
            json!({"generationConfig": {"responseModalities": modality},
            "tools": [{"functionDeclarations": [
                {"name": "bad", "parameters": {"type": "OBJECT", "properties": {"x": {"type": "COLOUR"}}}},
                // The Android app's nulls are no reason to refuse a declaration.
                {"name": "good", "parameters": {"type": "OBJECT", "description": null,
                    "properties": {"x": {"type": "STRING", "enum": null, "items": null}}}}
            ]}]})
        };
        let mut h = Harness::engine();
        h.connect(config("TEXT"));
        let m = h.messages();
        assert_eq!(
            kinds(&m),
            ["GEMINI_CONNECTED", "GEMINI_ERROR", "SETUP_COMPLETE"],
            "{m:#?}"
        );
        assert!(m[1]["payload"]["message"].as_str().unwrap().contains("bad"));
        // In place (same modality), then as a new session (another modality).
        for modality in ["TEXT", "AUDIO"] {
            h.client(json!({"type": "UPDATE_CONFIG", "payload": config(modality)}));
            let m = h.messages();
            assert_eq!(kinds(&m), ["GEMINI_ERROR", "SETUP_COMPLETE"], "{m:#?}");
        }
    }

    #[test]
    fn update_config_keeps_the_conversation_unless_the_modality_changes() {
        let mut h = Harness::engine();
        h.connect(text_config());
        h.messages();
        h.say("first");
        let first = generates(&h.requests());
        let system = json!({"systemInstruction": {"parts": [{"text": "Be brief."}]},
            "generationConfig": {"responseModalities": ["text"]}});
        h.client(json!({"type": "UPDATE_CONFIG", "payload": system}));
        // In place: the reply in flight goes on, and no GEMINI_CONNECTED.
        assert!(h.requests().is_empty());
        assert_eq!(kinds(&h.messages()), ["SETUP_COMPLETE"]);
        h.client(json!({"type": "UPDATE_CONFIG", "payload": {}}));
        // Spoken replies now: a new session, the old one's work cancelled.
        assert_eq!(h.requests(), [ProviderRequest::Cancel { id: first[0] }]);
        assert_eq!(kinds(&h.messages()), ["SETUP_COMPLETE"]);
        h.say("again");
        let next = generates(&h.requests());
        assert_eq!(next[0].0 >> 32, 2, "the second session's generation");
    }

    #[test]
    fn shutdown_and_close_end_the_session() {
        let mut h = Harness::engine();
        h.connect(text_config());
        h.messages();
        h.say("hi");
        let id = generates(&h.requests())[0];
        h.door.on_shutdown(h.now, &mut h.out);
        assert_eq!(h.requests(), [ProviderRequest::Cancel { id }]);
        assert_eq!(
            h.messages(),
            [json!({"type": "GEMINI_DISCONNECTED", "payload": {"reason": "server shutting down"}})]
        );
        assert!(h.door.is_idle());
        assert_eq!(h.door.poll_timeout(), None);
        // Closing afterwards has nothing left to cancel.
        h.door.on_close(h.now, &mut h.out);
        assert!(h.requests().is_empty());

        let mut h = Harness::engine();
        h.connect(text_config());
        h.say("hi");
        let id = generates(&h.requests())[0];
        h.door.on_close(h.now, &mut h.out);
        assert_eq!(h.requests(), [ProviderRequest::Cancel { id }]);
    }

    #[test]
    fn refused_and_unsupported_messages_are_answered_and_counted() {
        let mut h = Harness::engine();
        h.client(json!({"type": "WEBRTC_OFFER", "payload": {"sdp": "v=0"}}));
        h.client(json!({"type": "FOO"}));
        let m = h.messages();
        assert_eq!(kinds(&m), ["GEMINI_ERROR", "GEMINI_ERROR"]);
        assert_eq!(m[1]["payload"]["message"], "Unknown message type: FOO");
        h.connect(text_config());
        h.messages();
        h.client(json!({"type": "GENERATE_IMAGE", "payload": {"text": "a cat"}}));
        let m = h.messages();
        assert_eq!(kinds(&m), ["IMAGE_GENERATION_RESULT"]);
        assert_eq!(m[0]["payload"]["success"], false);
        assert!(
            h.metrics
                .render()
                .contains("voxgate_errors_total{door=\"gemini\"} 2")
        );
    }

    #[test]
    fn passthrough_is_initialized_when_the_upstream_opens() {
        let mut h = Harness::passthrough();
        h.connect(json!({"model": "gemini-live"}));
        assert!(
            h.messages().is_empty(),
            "nothing until the upstream answers"
        );
        assert!(!h.door.initialized());
        assert!(h.door.events().is_some());
        {
            let ups = h.upstreams.lock().unwrap();
            assert_eq!(ups.len(), 1);
            assert!(ups[0].0.starts_with("ws://127.0.0.1:9/ws/"), "{}", ups[0].0);
            assert!(ups[0].0.ends_with("?key=secret"));
            let setup: Value = serde_json::from_str(&ups[0].1).unwrap();
            assert_eq!(setup["setup"]["model"], "models/gemini-live");
        }
        h.upstream(UpEvent::Open);
        assert_eq!(kinds(&h.messages()), ["GEMINI_CONNECTED"]);
        assert!(h.door.initialized());
        h.upstream_json(json!({"setupComplete": {}}));
        assert_eq!(kinds(&h.messages()), ["SETUP_COMPLETE"]);
        h.say("hi");
        let up = h.sent_up(0);
        assert_eq!(up.len(), 1);
        assert_eq!(up[0]["clientContent"]["turnComplete"], true);
        h.upstream_json(
            json!({"serverContent": {"modelTurn": {"parts": [{"text": "Hello"}]},
            "turnComplete": true}}),
        );
        let m = h.messages();
        assert!(kinds(&m).contains(&"TURN_COMPLETE"), "{m:?}");
        // Upstream goes away: the app is told, the session is gone, the socket stays.
        h.upstream(UpEvent::Closed {
            code: Some(1000),
            reason: "bye".into(),
        });
        assert_eq!(
            h.messages()[0]["payload"]["reason"],
            "Gemini closed the session (1000): bye"
        );
        assert!(h.door.events().is_none());
        h.say("still there?");
        assert_eq!(
            h.messages()[0]["payload"]["message"],
            "Gemini not connected. Send CONNECT_GEMINI first."
        );
        assert!(h.door.initialized());
    }

    #[test]
    fn passthrough_failures_leave_the_connection_uninitialized() {
        let mut h = Harness::passthrough();
        h.connect(json!({}));
        h.upstream(UpEvent::Failed("refused".into()));
        let m = h.messages();
        assert_eq!(kinds(&m), ["SETUP_COMPLETE", "GEMINI_ERROR"]);
        assert_eq!(m[0]["payload"]["setupComplete"]["success"], false);
        assert!(!h.door.initialized());
        assert!(h.door.events().is_none());

        // Without a key nothing is opened at all.
        let mut h = Harness::new(GeminiConfig {
            mode: GeminiMode::Passthrough,
            ..GeminiConfig::default()
        });
        h.connect(json!({}));
        let m = h.messages();
        assert_eq!(kinds(&m), ["SETUP_COMPLETE", "GEMINI_ERROR"]);
        assert_eq!(m[0]["payload"]["setupComplete"]["error"]["code"], 503);
        assert!(h.upstreams.lock().unwrap().is_empty());

        // A relay that vanishes without a word is reported too.
        let mut h = Harness::passthrough();
        h.connect(json!({}));
        h.door.on_event(h.now, None, &mut h.out);
        assert_eq!(kinds(&h.messages()), ["GEMINI_DISCONNECTED"]);
        assert!(h.door.events().is_none());
    }

    #[test]
    fn passthrough_drops_audio_before_control_and_ends_a_session_upstream_stopped_reading() {
        let mut h = Harness::passthrough();
        h.connect(json!({}));
        h.upstream(UpEvent::Open);
        h.messages();
        let audio = json!({"type": "SEND_REALTIME_INPUT", "payload": {"audio":
            {"mimeType": "audio/pcm;rate=16000", "data": "AAAA"}}});
        for _ in 0..300 {
            h.client(audio.clone());
        }
        // Audio fills a quarter of the queue, then is dropped and counted.
        assert_eq!(
            h.metrics.dropped_frames(Door::Gemini, Direction::Uplink),
            300 - 256
        );
        // Control messages still find room behind it, in order.
        for i in 0..(1024 - 256) {
            h.say(&format!("message {i}"));
        }
        assert!(h.messages().is_empty());
        assert!(h.door.events().is_some());
        // One more: the upstream has not read a thing, and the session is ended.
        h.say("one too many");
        let m = h.messages();
        assert_eq!(kinds(&m), ["GEMINI_ERROR", "GEMINI_DISCONNECTED"]);
        assert!(h.door.events().is_none());
        let up = h.sent_up(0);
        assert_eq!(up.len(), 1024);
        assert!(
            up[..256]
                .iter()
                .all(|f| f["realtimeInput"]["audio"].is_object())
        );
        assert_eq!(
            up[256]["clientContent"]["turns"][0]["parts"][0]["text"],
            "message 0"
        );
    }

    fn plays(media: &[MediaCommand]) -> Vec<u32> {
        media
            .iter()
            .filter_map(|m| match m {
                MediaCommand::Play { rate, .. } => Some(*rate),
                _ => None,
            })
            .collect()
    }

    fn has_inline_audio(messages: &[Value]) -> bool {
        messages.iter().any(|m| {
            m["payload"]["serverContent"]["modelTurn"]["parts"]
                .as_array()
                .is_some_and(|p| p.iter().any(|p| p.get("inlineData").is_some()))
        })
    }

    #[test]
    fn the_audio_line_of_an_offer_names_the_candidates() {
        assert_eq!(audio_line(CHROME_OFFER), ("0".to_owned(), 0));
        let video_first = "v=0\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\na=mid:v\r\n\
            m=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=sendrecv\r\na=mid:audio\r\n";
        assert_eq!(audio_line(video_first), ("audio".to_owned(), 1));
        // No mid: the index stands in; no audio at all: the first line.
        assert_eq!(
            audio_line("v=0\nm=video 9 X 96\nm=audio 9 X 111\nm=application 9 X\na=mid:2\n"),
            ("1".to_owned(), 1)
        );
        assert_eq!(audio_line("v=0"), ("0".to_owned(), 0));
        let long = format!("m=audio 9 X 111\na=mid:{}\n", "x".repeat(100));
        assert_eq!(audio_line(&long), ("0".to_owned(), 0));
    }

    #[test]
    fn an_offer_is_accepted_and_answered_with_candidates_in_the_apps_form() {
        let mut h = Harness::engine().webrtc();
        // Allowed before CONNECT_GEMINI: the connection belongs to the socket.
        h.client(json!({"type": "WEBRTC_OFFER", "payload": {"sdp": CHROME_OFFER}}));
        assert!(h.messages().is_empty());
        assert_eq!(
            h.media(),
            [MediaCommand::Accept {
                offer: CHROME_OFFER.into(),
                options: PeerOptions {
                    input_rate: 16_000,
                    data_channel: DataChannel::PingPong,
                },
            }]
        );
        h.media_event(MediaEvent::Answer {
            sdp: "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n".into(),
            candidates: vec![
                CANDIDATE.into(),
                "candidate:2 1 udp 1 10.0.0.2 40000 typ host".into(),
            ],
        });
        let m = h.messages();
        assert_eq!(
            kinds(&m),
            [
                "WEBRTC_ANSWER",
                "WEBRTC_ICE_CANDIDATE",
                "WEBRTC_ICE_CANDIDATE"
            ]
        );
        assert_eq!(
            m[0]["payload"]["sdp"],
            "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n"
        );
        // Nested by default: what the Android app parses.
        assert_eq!(
            m[1]["payload"],
            json!({"candidate": {"candidate": CANDIDATE, "sdpMid": "0", "sdpMLineIndex": 0}})
        );
        // The app trickles its candidates flat: a new offer's answer follows that form, and
        // names the new offer's audio line.
        h.client(json!({"type": "WEBRTC_ICE_CANDIDATE", "payload": {
            "candidate": CANDIDATE, "sdpMid": "0", "sdpMLineIndex": 0}}));
        assert_eq!(h.media(), [MediaCommand::Candidate(CANDIDATE.into())]);
        let video_first = "v=0\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\na=mid:v\r\n\
            m=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=mid:a\r\n";
        h.client(json!({"type": "WEBRTC_OFFER", "payload": {"sdp": video_first}}));
        assert_eq!(h.media().len(), 1);
        h.media_event(MediaEvent::Answer {
            sdp: "v=0\r\n".into(),
            candidates: vec![CANDIDATE.into()],
        });
        let m = h.messages();
        assert_eq!(
            m[1],
            json!({"type": "WEBRTC_ICE_CANDIDATE", "payload":
                {"candidate": CANDIDATE, "sdpMid": "a", "sdpMLineIndex": 1}})
        );
        assert!(
            !h.metrics
                .render()
                .contains("voxgate_errors_total{door=\"gemini\"} 1")
        );
    }

    #[test]
    fn app_candidates_are_forwarded_flat_or_nested_and_end_of_candidates_is_ignored() {
        let mut h = Harness::engine().webrtc();
        h.client(
            json!({"type": "WEBRTC_ICE_CANDIDATE", "payload": {"candidate":
            {"candidate": CANDIDATE, "sdpMid": "0", "sdpMLineIndex": 0}}}),
        );
        h.client(json!({"type": "WEBRTC_ICE_CANDIDATE", "payload": {
            "candidate": format!("a={CANDIDATE}"), "sdpMid": "0", "sdpMLineIndex": "0"}}));
        for end in [
            json!({"candidate": "", "sdpMid": "0", "sdpMLineIndex": 0}),
            json!({"candidate": null, "sdpMid": null, "sdpMLineIndex": null}),
            json!({"candidate": {"candidate": "", "sdpMid": "0", "sdpMLineIndex": 0}}),
        ] {
            h.client(json!({"type": "WEBRTC_ICE_CANDIDATE", "payload": end}));
        }
        assert_eq!(
            h.media(),
            [
                MediaCommand::Candidate(CANDIDATE.into()),
                MediaCommand::Candidate(CANDIDATE.into())
            ]
        );
        assert!(h.messages().is_empty());
        let long = format!("candidate:{}", "1".repeat(2000));
        h.client(json!({"type": "WEBRTC_ICE_CANDIDATE", "payload": {"candidate": long}}));
        assert!(h.media().is_empty());
        assert!(
            h.messages()[0]["payload"]["message"]
                .as_str()
                .unwrap()
                .contains("exceeds the limit of 1024 bytes")
        );
    }

    #[test]
    fn refused_offers_and_a_server_without_webrtc_get_gemini_errors() {
        let mut h = Harness::engine().webrtc();
        h.client(json!({"type": "WEBRTC_OFFER", "payload": {"sdp": "v=0"}}));
        assert_eq!(h.media().len(), 1);
        h.media_event(MediaEvent::Refused(
            "bad offer: the offer has no audio m-line".into(),
        ));
        let m = h.messages();
        assert_eq!(kinds(&m), ["GEMINI_ERROR"]);
        assert_eq!(
            m[0]["payload"]["message"],
            "WebRTC offer refused: bad offer: the offer has no audio m-line"
        );
        // The driver refuses for a server with WebRTC switched off: the usual answer.
        h.client(json!({"type": "WEBRTC_OFFER", "payload": {"sdp": CHROME_OFFER}}));
        h.media();
        h.media_event(MediaEvent::Refused(OfferError::Disabled.to_string()));
        assert_eq!(
            h.messages(),
            [json!({"type": "GEMINI_ERROR", "payload":
                {"message": voxgate_gemini::bridge::WEBRTC_UNSUPPORTED_TEXT}})]
        );
        // A door told there is no endpoint never asks the driver.
        let mut h = Harness::engine();
        h.client(json!({"type": "WEBRTC_OFFER", "payload": {"sdp": CHROME_OFFER}}));
        h.client(json!({"type": "WEBRTC_ICE_CANDIDATE", "payload": {"candidate": CANDIDATE}}));
        assert!(h.media().is_empty());
        let m = h.messages();
        assert_eq!(kinds(&m), ["GEMINI_ERROR", "GEMINI_ERROR"]);
        assert_eq!(
            m[1]["payload"]["message"],
            voxgate_gemini::bridge::WEBRTC_UNSUPPORTED_TEXT
        );
    }

    /// The speech fixture's samples (16 kHz mono) and silence after it, in 20 ms frames.
    fn speech_frames() -> Vec<Vec<i16>> {
        const WAV: &[u8] = include_bytes!("../../../voxgate-audio/tests/fixtures/speech.wav");
        let data = WAV.windows(4).position(|w| w == b"data").unwrap() + 8;
        let mut samples: Vec<i16> = WAV[data..]
            .chunks_exact(2)
            .map(|c| i16::from_le_bytes([c[0], c[1]]))
            .collect();
        samples.extend(std::iter::repeat_n(0, 16_000 * 2));
        samples.chunks(320).map(<[i16]>::to_vec).collect()
    }

    fn request_kinds(requests: &[ProviderRequest]) -> Vec<&'static str> {
        requests
            .iter()
            .map(|r| match r {
                ProviderRequest::Transcribe { .. } => "transcribe",
                ProviderRequest::Generate { .. } => "generate",
                ProviderRequest::Synthesize { .. } => "synthesize",
                ProviderRequest::Cancel { .. } => "cancel",
                _ => "other",
            })
            .collect()
    }

    #[test]
    fn track_audio_is_heard_like_realtime_input_audio() {
        let frames = speech_frames();
        // Over the track.
        let mut h = Harness::engine().webrtc();
        h.connect(json!({}));
        h.webrtc_up(CHROME_OFFER);
        h.messages();
        for f in &frames {
            h.media_event(MediaEvent::Audio(f.clone()));
            h.advance(Duration::from_millis(20));
        }
        let over_track = h.requests();
        // Over the WebSocket, the same frames.
        let mut w = Harness::engine();
        w.connect(json!({}));
        w.messages();
        for f in &frames {
            let mut data = String::new();
            voxgate_gemini::audio::encode_pcm_base64(f, &mut data);
            w.client(json!({"type": "SEND_REALTIME_INPUT", "payload": {"audio":
                {"mimeType": "audio/pcm;rate=16000", "data": data}}}));
            w.advance(Duration::from_millis(20));
        }
        let over_ws = w.requests();
        assert!(
            request_kinds(&over_track).contains(&"transcribe"),
            "{over_track:?}"
        );
        assert_eq!(request_kinds(&over_track), request_kinds(&over_ws));
        // Without a session the track's audio goes nowhere.
        let mut h = Harness::engine().webrtc();
        h.webrtc_up(CHROME_OFFER);
        for f in &frames[..100] {
            h.media_event(MediaEvent::Audio(f.clone()));
        }
        assert!(h.messages().is_empty());
        assert!(h.requests().is_empty());
    }

    /// Has the engine speak `text` as the reply to "hi": the synthesized sentence comes back
    /// as one second of audio at 16 kHz.
    fn spoken_reply(h: &mut Harness, text: &str) -> RequestId {
        h.say("hi");
        let id = generates(&h.requests())[0];
        h.door.on_provider(
            h.now,
            ProviderEvent::TextDelta {
                id,
                delta: text.into(),
            },
            &mut h.out,
        );
        h.door
            .on_provider(h.now, ProviderEvent::Done { id }, &mut h.out);
        let synth = h
            .requests()
            .into_iter()
            .find_map(|r| match r {
                ProviderRequest::Synthesize { id, .. } => Some(id),
                _ => None,
            })
            .unwrap();
        h.door.on_provider(
            h.now,
            ProviderEvent::Audio {
                id: synth,
                samples: vec![1000; 16_000],
                sample_rate: 16_000,
            },
            &mut h.out,
        );
        synth
    }

    #[test]
    fn a_spoken_turn_plays_on_the_track_and_keeps_the_rest_on_the_websocket() {
        let mut h = Harness::engine().webrtc();
        h.connect(json!({}));
        h.messages();
        let signalling = h.webrtc_up(CHROME_OFFER);
        assert_eq!(
            kinds(&signalling),
            ["WEBRTC_ANSWER", "WEBRTC_ICE_CANDIDATE"]
        );
        let synth = spoken_reply(&mut h, "Hello there.");
        h.door
            .on_provider(h.now, ProviderEvent::Done { id: synth }, &mut h.out);
        h.advance(Duration::from_secs(3));
        let media = h.media();
        let rates = plays(&media);
        assert!(!rates.is_empty(), "{media:?}");
        // The engine's rate as it is: the media layer resamples.
        assert!(rates.iter().all(|r| *r == 16_000), "{rates:?}");
        let played: usize = media
            .iter()
            .map(|m| match m {
                MediaCommand::Play { samples, .. } => samples.len(),
                _ => 0,
            })
            .sum();
        assert_eq!(played, 16_000);
        let m = h.messages();
        assert!(!has_inline_audio(&m), "{m:#?}");
        let k = kinds(&m);
        assert!(!k.contains(&"AUDIO_CHUNK"));
        assert_eq!(
            k,
            [
                "CONTENT_MESSAGE",
                "ASSISTANT_SPEAKING",
                "ASSISTANT_SPEAKING",
                "CONTENT_MESSAGE",
                "TURN_COMPLETE"
            ],
            "{m:#?}"
        );
        assert_eq!(
            m[0]["payload"]["serverContent"]["outputTranscription"]["text"],
            "Hello there."
        );
        // The connection closes: the session goes on, its audio back on the WebSocket.
        h.media_event(MediaEvent::Closed("ICE timed out".into()));
        assert!(h.messages().is_empty());
        let synth = spoken_reply(&mut h, "Again.");
        h.door
            .on_provider(h.now, ProviderEvent::Done { id: synth }, &mut h.out);
        h.advance(Duration::from_secs(3));
        assert!(h.media().is_empty());
        assert!(has_inline_audio(&h.messages()));
    }

    #[test]
    fn barge_in_clears_the_track_and_disconnect_hangs_up() {
        let mut h = Harness::engine().webrtc();
        h.connect(json!({}));
        h.webrtc_up(CHROME_OFFER);
        h.messages();
        spoken_reply(&mut h, "A long answer.");
        h.advance(Duration::from_millis(300));
        assert!(!plays(&h.media()).is_empty());
        h.messages();
        // New content over the reply interrupts it: the track's queued audio goes at once.
        h.say("stop");
        let media = h.media();
        assert_eq!(
            media.iter().filter(|m| **m == MediaCommand::Clear).count(),
            1,
            "{media:?}"
        );
        let m = h.messages();
        assert!(kinds(&m).contains(&"INTERRUPTED"), "{m:#?}");
        h.client(json!({"type": "DISCONNECT_GEMINI"}));
        assert_eq!(h.media(), [MediaCommand::Hangup]);
        // Nothing is left to hang up after that.
        h.door.on_close(h.now, &mut h.out);
        assert!(h.media().is_empty());
    }

    #[test]
    fn a_session_opened_on_a_live_connection_speaks_on_the_track() {
        // The offer first, then CONNECT_GEMINI (or a session replaced by another).
        let mut h = Harness::engine().webrtc();
        h.webrtc_up(CHROME_OFFER);
        h.connect(json!({}));
        assert_eq!(kinds(&h.messages()), ["GEMINI_CONNECTED", "SETUP_COMPLETE"]);
        let synth = spoken_reply(&mut h, "Hi.");
        h.door
            .on_provider(h.now, ProviderEvent::Done { id: synth }, &mut h.out);
        h.advance(Duration::from_secs(3));
        assert!(!plays(&h.media()).is_empty());
        assert!(!has_inline_audio(&h.messages()));
        // Answered but not connected yet: the reply goes to the track all the same (the
        // connection holds it until it is up), never to the WebSocket the app does not play.
        h.client(json!({"type": "WEBRTC_OFFER", "payload": {"sdp": CHROME_OFFER}}));
        h.media_event(MediaEvent::Answer {
            sdp: "v=0\r\n".into(),
            candidates: Vec::new(),
        });
        h.media();
        h.messages();
        let synth = spoken_reply(&mut h, "Hi.");
        h.door
            .on_provider(h.now, ProviderEvent::Done { id: synth }, &mut h.out);
        h.advance(Duration::from_secs(3));
        assert!(!plays(&h.media()).is_empty());
        assert!(!has_inline_audio(&h.messages()));
        // The connection failed: later replies go back to the WebSocket.
        h.media_event(MediaEvent::Closed(
            "ICE/DTLS did not complete in time".into(),
        ));
        let synth = spoken_reply(&mut h, "Hi.");
        h.door
            .on_provider(h.now, ProviderEvent::Done { id: synth }, &mut h.out);
        h.advance(Duration::from_secs(3));
        assert!(plays(&h.media()).is_empty());
        assert!(has_inline_audio(&h.messages()));
    }

    #[test]
    fn passthrough_sends_track_audio_up_and_plays_the_reply_on_the_track() {
        let mut h = Harness::passthrough().webrtc();
        h.connect(json!({}));
        h.upstream(UpEvent::Open);
        h.upstream_json(json!({"setupComplete": {}}));
        h.messages();
        h.webrtc_up(CHROME_OFFER);
        h.media_event(MediaEvent::Audio(vec![256; 320]));
        let up = h.sent_up(0);
        assert_eq!(up.len(), 1);
        let audio = &up[0]["realtimeInput"]["audio"];
        assert_eq!(audio["mimeType"], "audio/pcm;rate=16000");
        let blob: voxgate_gemini::Blob = serde_json::from_value(audio.clone()).unwrap();
        let mut samples = Vec::new();
        blob.decode_pcm(&mut samples).unwrap();
        assert_eq!(samples, vec![256; 320]);
        // Text and audio in one content: the text is relayed, the audio played.
        let reply = voxgate_gemini::Blob::pcm(&[7; 480], 24_000);
        h.upstream_json(json!({"serverContent": {"modelTurn": {"parts": [
            {"text": "Hi"}, {"inlineData": reply}]},
            "outputTranscription": {"text": "Hi"}}}));
        let m = h.messages();
        assert_eq!(
            kinds(&m),
            ["ASSISTANT_SPEAKING", "CONTENT_MESSAGE"],
            "{m:#?}"
        );
        assert_eq!(
            m[1]["payload"]["serverContent"],
            json!({"modelTurn": {"parts": [{"text": "Hi"}]}, "outputTranscription": {"text": "Hi"}})
        );
        assert_eq!(
            h.media(),
            [MediaCommand::Play {
                samples: vec![7; 480],
                rate: 24_000
            }]
        );
        // Audio alone: nothing on the WebSocket.
        h.upstream_json(
            json!({"serverContent": {"modelTurn": {"parts": [{"inlineData": reply}]}}}),
        );
        assert!(h.messages().is_empty());
        assert_eq!(plays(&h.media()), [24_000]);
        // Interrupted: the track is cleared, the app told as before.
        h.upstream_json(json!({"serverContent": {"interrupted": true}}));
        assert_eq!(h.media(), [MediaCommand::Clear]);
        assert_eq!(kinds(&h.messages()), ["CONTENT_MESSAGE", "INTERRUPTED"]);
        // The connection closes: reply audio is relayed in CONTENT_MESSAGE again.
        h.media_event(MediaEvent::Closed("gone".into()));
        h.upstream_json(
            json!({"serverContent": {"modelTurn": {"parts": [{"inlineData": reply}]}}}),
        );
        assert!(h.media().is_empty());
        assert!(has_inline_audio(&h.messages()));
    }
}
