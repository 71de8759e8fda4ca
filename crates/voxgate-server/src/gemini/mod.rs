//! The Gemini bridge door: apps speak the bridge's JSON protocol to us as they would to a Gemini
//! Live bridge; `engine` mode answers with voxgate's own pipeline, `passthrough` relays to the
//! real Gemini Live API.
//!
//! Served at `/gemini` on the main listener and on the door's own listener (default
//! `127.0.0.1:3001`, any path, like the original bridge). One task per connection: a reader
//! decodes frames into a bounded queue (audio input is dropped and counted when it is full,
//! control messages wait), a writer sends frames from another bounded queue (model audio is
//! dropped and counted when the client does not keep up), and the connection loop owns at most
//! one bridge session (`CONNECT_GEMINI` to `DISCONNECT_GEMINI`). Replacing or ending a session
//! drops it whole: its provider tasks or its upstream connection are aborted with it, so
//! nothing from an old session reaches the client after the new `SETUP_COMPLETE`.

mod config;
mod engine;
mod passthrough;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::ws::{Message, WebSocket};
use axum::extract::{ConnectInfo, State, WebSocketUpgrade};
use axum::response::Response;
use axum::routing::get;
use futures::{SinkExt, StreamExt};
use tokio::sync::{mpsc, watch};
use voxgate_gemini::{ClientMessage, LiveConfig, ServerMessage};

pub use config::{GeminiConfig, GeminiMode};

use crate::metrics::{Direction, Door, Metrics};
use crate::providers::Providers;
use crate::server::{App, DoorListener};

/// The door's routes on the main listener.
pub(crate) fn routes() -> Router<Arc<App>> {
    Router::new().route("/gemini", get(upgrade))
}

/// The door's own listener (any path), when configured.
pub(crate) fn listeners(config: &crate::Config) -> Vec<DoorListener> {
    if !config.gemini.enabled || !config.gemini.own_listener {
        return Vec::new();
    }
    vec![DoorListener {
        name: "gemini",
        addr: config.gemini.listen,
        routes: Router::new().fallback(upgrade),
    }]
}

async fn upgrade(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<std::net::SocketAddr>,
    ws: WebSocketUpgrade,
) -> Response {
    use axum::response::IntoResponse;
    if !app.config.gemini.enabled {
        return (
            axum::http::StatusCode::NOT_FOUND,
            "the Gemini door is disabled",
        )
            .into_response();
    }
    let permit = match app.admission.try_admit(Door::Gemini, peer.ip()) {
        Ok(p) => p,
        Err(refused) => return refused.into_response(),
    };
    let config = app.config.gemini.clone();
    let hard_limit = config.max_frame_bytes.saturating_mul(2);
    let ctx = Ctx {
        providers: app.providers.clone(),
        metrics: Arc::clone(&app.metrics),
        config,
        shutdown: app.shutdown.clone(),
    };
    ws.max_message_size(hard_limit)
        .max_frame_size(hard_limit)
        .on_upgrade(move |socket| async move {
            let _permit = permit;
            serve(socket, ctx).await;
        })
}

/// What a connection needs from the server.
#[derive(Debug, Clone)]
struct Ctx {
    providers: Providers,
    metrics: Arc<Metrics>,
    config: GeminiConfig,
    shutdown: watch::Receiver<bool>,
}

/// A decoded frame, or the error to answer it with.
enum Incoming {
    Message(ClientMessage),
    Bad(ServerMessage),
}

/// A frame for the writer; `close` ends the connection after it.
struct Outgoing {
    text: String,
    close: bool,
}

const IN_QUEUE: usize = 64;
const OUT_QUEUE: usize = 256;

/// Serves one upgraded connection until the client leaves or the server shuts down.
async fn serve(socket: WebSocket, ctx: Ctx) {
    let metrics = Arc::clone(&ctx.metrics);
    let _active = metrics.session(Door::Gemini);
    let (mut sink, mut stream) = socket.split();
    let (in_tx, in_rx) = mpsc::channel::<Incoming>(IN_QUEUE);
    let (out_tx, mut out_rx) = mpsc::channel::<Outgoing>(OUT_QUEUE);

    let reader_metrics = Arc::clone(&ctx.metrics);
    let max = ctx.config.max_frame_bytes;
    let reader = tokio::spawn(async move {
        while let Some(Ok(msg)) = stream.next().await {
            let decoded = match &msg {
                Message::Text(t) if t.len() > max => Err(too_big(t.len(), max)),
                Message::Binary(b) if b.len() > max => Err(too_big(b.len(), max)),
                // The bridge speaks text frames; JSON in a binary frame is accepted too.
                Message::Text(t) => ClientMessage::decode(t.as_str()).map_err(|e| e.reply()),
                Message::Binary(b) => ClientMessage::decode_slice(b).map_err(|e| e.reply()),
                Message::Close(_) => break,
                Message::Ping(_) | Message::Pong(_) => continue,
            };
            let incoming = match decoded {
                Ok(m) => Incoming::Message(m),
                Err(reply) => Incoming::Bad(reply),
            };
            let is_audio = matches!(
                &incoming,
                Incoming::Message(ClientMessage::SendRealtimeInput(r))
                    if r.audio.is_some() && r.text.is_none() && !r.activity_end
                        && !r.audio_stream_end
            );
            if is_audio {
                match in_tx.try_send(incoming) {
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        reader_metrics.dropped(Door::Gemini, Direction::Uplink, 1);
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => break,
                    Ok(()) => {}
                }
            } else if in_tx.send(incoming).await.is_err() {
                break;
            }
        }
    });
    let writer = tokio::spawn(async move {
        while let Some(out) = out_rx.recv().await {
            if sink.send(Message::Text(out.text.into())).await.is_err() {
                return;
            }
            if out.close {
                break;
            }
        }
        let _ = sink.close().await;
    });

    let mut conn = Connection {
        out: out_tx,
        metrics: Arc::clone(&ctx.metrics),
        ctx: ctx.clone(),
        backend: None,
        batch: Vec::new(),
    };
    conn.run(in_rx, ctx.shutdown).await;
    // Dropping the connection drops the session: provider tasks and upstream sockets end.
    drop(conn);
    reader.abort();
    let _ = writer.await;
}

fn too_big(len: usize, max: usize) -> ServerMessage {
    ServerMessage::error(format!(
        "Message of {len} bytes exceeds the limit of {max} bytes."
    ))
}

/// The session behind a connection, by mode.
enum Backend {
    Engine(Box<engine::EngineSession>),
    Pass(passthrough::PassSession),
}

/// What woke the connection loop.
// One lives on the stack per loop turn; boxing client messages would cost an allocation each.
#[allow(clippy::large_enum_variant)]
enum Event {
    Client(Option<Incoming>),
    Provider(voxgate_engine::ProviderEvent),
    Upstream(passthrough::UpEvent),
    Timeout,
    Shutdown,
}

struct Connection {
    out: mpsc::Sender<Outgoing>,
    metrics: Arc<Metrics>,
    ctx: Ctx,
    backend: Option<Backend>,
    /// Messages produced by the last step, sent in order after it.
    batch: Vec<ServerMessage>,
}

async fn recv_opt<T>(rx: Option<&mut mpsc::Receiver<T>>) -> Option<T> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

impl Connection {
    async fn run(
        &mut self,
        mut in_rx: mpsc::Receiver<Incoming>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        if *shutdown.borrow() {
            return;
        }
        loop {
            let deadline = match &self.backend {
                Some(Backend::Engine(e)) => e.deadline(),
                _ => None,
            };
            let sleep_until = deadline
                .map(tokio::time::Instant::from_std)
                .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
            let event = {
                let (prov, up) = match &mut self.backend {
                    Some(Backend::Engine(e)) => (Some(e.provider_rx()), None),
                    Some(Backend::Pass(p)) => (None, Some(p.events())),
                    None => (None, None),
                };
                tokio::select! {
                    m = in_rx.recv() => Event::Client(m),
                    Some(p) = recv_opt(prov) => Event::Provider(p),
                    Some(u) = recv_opt(up) => Event::Upstream(u),
                    () = tokio::time::sleep_until(sleep_until), if deadline.is_some() => Event::Timeout,
                    _ = shutdown.changed() => Event::Shutdown,
                }
            };
            let mut done = false;
            match event {
                Event::Client(None) => done = true,
                Event::Client(Some(Incoming::Bad(reply))) => {
                    self.metrics.error(Door::Gemini);
                    self.batch.push(reply);
                }
                Event::Client(Some(Incoming::Message(m))) => self.handle(m).await,
                Event::Provider(p) => {
                    if let Some(Backend::Engine(e)) = &mut self.backend {
                        e.provider_event(p, &mut self.batch);
                    }
                }
                Event::Upstream(u) => {
                    if let Some(Backend::Pass(p)) = &mut self.backend
                        && !p.upstream_event(u, &mut self.batch)
                    {
                        self.backend = None;
                    }
                }
                Event::Timeout => {
                    if let Some(Backend::Engine(e)) = &mut self.backend {
                        e.timeout(&mut self.batch);
                    }
                }
                Event::Shutdown => {
                    self.end_session();
                    self.batch.push(ServerMessage::GeminiDisconnected {
                        reason: Some("server shutting down".into()),
                    });
                    done = true;
                }
            }
            self.flush(done).await;
            if done {
                break;
            }
        }
        self.end_session();
    }

    /// Sends the batch in order; model audio is dropped (and counted) when the writer is full.
    async fn flush(&mut self, close_after: bool) {
        let batch = std::mem::take(&mut self.batch);
        let last = batch.len().saturating_sub(1);
        for (i, m) in batch.into_iter().enumerate() {
            if matches!(m, ServerMessage::GeminiError { .. }) {
                tracing::debug!(error = %m.encode(), "gemini door error");
            }
            let out = Outgoing {
                text: m.encode(),
                close: close_after && i == last,
            };
            if m.is_droppable() && !out.close {
                if self.out.try_send(out).is_err() {
                    self.metrics.dropped(Door::Gemini, Direction::Downlink, 1);
                }
            } else {
                let _ = self.out.send(out).await;
            }
        }
    }

    /// Ends the current session, if any, freeing everything it holds.
    fn end_session(&mut self) {
        if let Some(Backend::Engine(mut e)) = self.backend.take() {
            e.close();
        }
    }

    async fn handle(&mut self, m: ClientMessage) {
        match m {
            ClientMessage::ConnectGemini { initial_config } => {
                self.end_session();
                self.start_session(initial_config.unwrap_or_default(), true);
            }
            ClientMessage::DisconnectGemini => {
                let had = self.backend.is_some();
                self.end_session();
                // The socket stays open: the app may connect again.
                self.batch.push(ServerMessage::GeminiDisconnected {
                    reason: Some(if had {
                        "Disconnected by client request.".into()
                    } else {
                        "No Gemini session was open.".into()
                    }),
                });
            }
            ClientMessage::WebrtcOffer { .. } | ClientMessage::WebrtcIceCandidate(_) => {
                self.metrics.error(Door::Gemini);
                self.batch.push(ServerMessage::webrtc_unsupported());
            }
            ClientMessage::Unknown { kind, .. } => {
                self.metrics.error(Door::Gemini);
                self.batch.push(ServerMessage::unknown_type(&kind));
            }
            m if m.needs_session() && self.backend.is_none() => {
                self.metrics.error(Door::Gemini);
                self.batch.push(ServerMessage::not_connected());
            }
            ClientMessage::GenerateImage { .. } => {
                self.batch.push(ServerMessage::ImageGenerationResult(
                    voxgate_gemini::bridge::ImageGenerationResult {
                        success: false,
                        error: Some("Image generation is not available on this server.".into()),
                        ..Default::default()
                    },
                ));
            }
            ClientMessage::UpdateConfig(config) => match &mut self.backend {
                Some(Backend::Engine(e)) if e.can_reconfigure(&config) => {
                    e.reconfigure(&config, &mut self.batch);
                    self.batch.push(ServerMessage::setup_ok());
                }
                _ => {
                    // A new session with the new config, replacing the old one whole (the
                    // upstream takes `setup` once per connection): nothing of the old one
                    // can arrive after the new SETUP_COMPLETE.
                    self.end_session();
                    self.start_session(config, false);
                }
            },
            other => match &mut self.backend {
                Some(Backend::Engine(e)) => e.handle(other, &mut self.batch),
                Some(Backend::Pass(p)) => p.forward(&other, &mut self.batch).await,
                None => {}
            },
        }
    }

    /// Opens a session with `config`; `connect` sends `GEMINI_CONNECTED` first (a new
    /// `CONNECT_GEMINI`, not an `UPDATE_CONFIG`).
    fn start_session(&mut self, config: LiveConfig, connect: bool) {
        match self.ctx.config.mode {
            GeminiMode::Passthrough => {
                match passthrough::PassSession::start(
                    config,
                    &self.ctx.config,
                    Arc::clone(&self.metrics),
                    connect,
                ) {
                    Ok(p) => self.backend = Some(Backend::Pass(p)),
                    Err(message) => {
                        self.metrics.error(Door::Gemini);
                        self.batch
                            .push(ServerMessage::setup_failed(Some(503), message.clone()));
                        self.batch.push(ServerMessage::error(message));
                    }
                }
            }
            // Engine mode and any mode added later.
            _ => {
                let flags = engine::Flags {
                    audio_chunks: self.ctx.config.audio_chunks,
                    assistant_speaking: self.ctx.config.assistant_speaking,
                };
                match engine::EngineSession::new(
                    &config,
                    &self.ctx.providers,
                    Arc::clone(&self.metrics),
                    flags,
                    Instant::now(),
                ) {
                    Ok((session, setup_messages)) => {
                        if connect {
                            self.batch.push(ServerMessage::GeminiConnected);
                        }
                        self.batch.push(ServerMessage::setup_ok());
                        self.batch.extend(setup_messages);
                        self.backend = Some(Backend::Engine(Box::new(session)));
                    }
                    Err(message) => {
                        if connect {
                            self.batch.push(ServerMessage::GeminiConnected);
                        }
                        self.metrics.error(Door::Gemini);
                        self.batch
                            .push(ServerMessage::setup_failed(Some(400), message.clone()));
                        self.batch.push(ServerMessage::error(message));
                    }
                }
            }
        }
    }
}
