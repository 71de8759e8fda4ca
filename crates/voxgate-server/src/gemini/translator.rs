//! The door's protocol logic on top of the shared door driver ([`crate::door`]): one
//! connection holds at most one bridge session (`CONNECT_GEMINI` to `DISCONNECT_GEMINI`), by
//! mode an [`EngineSession`] or a [`PassSession`]. Replacing or ending a session drops it
//! whole: its provider work is cancelled (and its late events no longer match its ids), its
//! upstream connection is aborted, so nothing from an old session reaches the client after
//! the new `SETUP_COMPLETE`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use voxgate_engine::ProviderEvent;
use voxgate_gemini::{ClientMessage, LiveConfig, ServerMessage};

use super::engine::{EngineSession, Flags, Ids};
use super::passthrough::{Connector, PassSession, UpEvent};
use super::{GeminiConfig, GeminiMode, emit};
use crate::door::{ClientFrame, Inbound, Out, Translator};
use crate::metrics::{Door, Metrics};

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
        }
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
            ClientMessage::WebrtcOffer { .. } | ClientMessage::WebrtcIceCandidate(_) => {
                self.error(out, &ServerMessage::webrtc_unsupported());
            }
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
                    self.backend = None;
                    self.error(
                        out,
                        &ServerMessage::error(
                            "Gemini is not reading the session's messages: it was ended.",
                        ),
                    );
                    emit(
                        out,
                        &ServerMessage::GeminiDisconnected {
                            reason: Some("Gemini stopped reading.".into()),
                        },
                    );
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
                    Ok(p) => self.backend = Some(Backend::Pass(p)),
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
        emit(
            out,
            &ServerMessage::GeminiDisconnected {
                reason: Some("server shutting down".into()),
            },
        );
    }

    fn on_close(&mut self, now: Instant, out: &mut Out) {
        self.end_session(now, out);
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
}
