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
        }
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
            other => match &mut self.backend {
                Some(Backend::Engine(e)) => e.handle(now, other, out),
                Some(Backend::Pass(p)) => {
                    if !p.forward(&other, out) {
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
                None => {}
            },
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
                };
                self.generation = self.generation.wrapping_add(1);
                let ids = Ids::new(self.generation);
                if connect {
                    emit(out, &ServerMessage::GeminiConnected);
                }
                match EngineSession::new(&config, Arc::clone(&self.metrics), flags, ids, now) {
                    Ok(mut session) => {
                        emit(out, &ServerMessage::setup_ok());
                        session.start(now, &config, out);
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
