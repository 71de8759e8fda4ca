//! The Gemini bridge door: apps speak the bridge's JSON protocol to us as they would to a Gemini
//! Live bridge; `engine` mode answers with voxgate's own pipeline, `passthrough` relays to the
//! real Gemini Live API.
//!
//! Served at `/gemini` on the main listener and on the door's own listener (default
//! `127.0.0.1:3001`, any path, like the original bridge). Each connection runs on the shared
//! door driver ([`crate::door`]), which owns the socket, the queues (microphone audio and model
//! audio are dropped and counted under back-pressure, control messages never), the provider
//! tasks and the lifecycle timers; [`translator::GeminiDoor`] is the protocol, without I/O.
//! A connection that sets up no session within the initialization timeout
//! (`gemini.connect_timeout_ms`, else the server's) gets a `GEMINI_ERROR` and a 1008 close; at
//! shutdown the app is told `GEMINI_DISCONNECTED` before the 1001 close.
//!
//! Voice may also travel over WebRTC, as the original Android app sends it: `WEBRTC_OFFER` is
//! answered through the server's WebRTC endpoint (`[webrtc]`), the app's microphone track
//! feeds the session and the reply's audio is played on the server's track instead of sent
//! in `CONTENT_MESSAGE`s (see [`translator`]).
//!
//! Access is decided before the upgrade ([`access`]): with `[gemini] tokens` set every
//! connection presents one (`Authorization: Bearer`, `?token=`, or the URL's last path
//! segment: `/gemini/<token>` here, `/<token>` on the own listener) or gets HTTP 401; without
//! tokens, pass-through with the server's API key is refused (HTTP 403) to anyone but this
//! machine. A refused caller never causes an upstream connection.

pub(crate) mod access;
mod config;
mod engine;
mod passthrough;
mod translator;

use std::sync::Arc;

use axum::Router;
use axum::extract::ws::WebSocket;
use axum::extract::{ConnectInfo, State, WebSocketUpgrade};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use voxgate_gemini::ServerMessage;

pub use config::{GeminiConfig, GeminiMode};

use crate::door::{Out, ServerFrame};
use crate::metrics::Door;
use crate::server::{App, DoorListener};

/// The door's routes on the main listener: `/gemini`, and `/gemini/<token>` for apps that can
/// only be given a URL.
pub(crate) fn routes() -> Router<Arc<App>> {
    Router::new()
        .route("/gemini", get(upgrade_main))
        .route("/gemini/{token}", get(upgrade_main))
}

/// The door's own listener (any path), when configured.
pub(crate) fn listeners(config: &crate::Config) -> Vec<DoorListener> {
    if !config.gemini.enabled || !config.gemini.own_listener {
        return Vec::new();
    }
    vec![DoorListener {
        name: "gemini",
        addr: config.gemini.listen,
        routes: Router::new().fallback(upgrade_own),
    }]
}

/// `/gemini` and `/gemini/<token>` on the main listener.
async fn upgrade_main(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<std::net::SocketAddr>,
    headers: HeaderMap,
    uri: Uri,
    ws: WebSocketUpgrade,
) -> Response {
    let path_token = uri.path().strip_prefix("/gemini/");
    upgrade(app, peer, &headers, &uri, path_token, ws).await
}

/// Any path on the own listener; its last segment may carry the token.
async fn upgrade_own(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<std::net::SocketAddr>,
    headers: HeaderMap,
    uri: Uri,
    ws: WebSocketUpgrade,
) -> Response {
    let path_token = access::last_segment(uri.path());
    upgrade(app, peer, &headers, &uri, path_token, ws).await
}

/// Admission, then access ([`access::decide`]), then the upgrade: a refused caller gets an
/// HTTP answer and no session, so no upstream connection can be made for it.
async fn upgrade(
    app: Arc<App>,
    peer: std::net::SocketAddr,
    headers: &HeaderMap,
    uri: &Uri,
    path_token: Option<&str>,
    ws: WebSocketUpgrade,
) -> Response {
    if !app.config.gemini.enabled {
        return (StatusCode::NOT_FOUND, "the Gemini door is disabled").into_response();
    }
    let permit = match app.admit(Door::Gemini, peer.ip()).await {
        Ok(p) => p,
        Err(refused) => return refused.into_response(),
    };
    let presented = access::presented(headers, uri.query(), path_token);
    let decision = access::decide(
        &app.config.gemini,
        peer.ip(),
        access::proxied(headers),
        &presented,
    );
    match decision {
        access::Access::Allow => {}
        refused @ access::Access::Unauthorized => {
            app.metrics.error(Door::Gemini);
            tracing::debug!(%peer, "gemini door: missing or unknown token");
            return (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                refused.message(),
            )
                .into_response();
        }
        refused @ access::Access::LocalOnly => {
            app.metrics.error(Door::Gemini);
            tracing::info!(%peer, "gemini door: pass-through refused (no [gemini] tokens)");
            return (StatusCode::FORBIDDEN, refused.message()).into_response();
        }
    }
    let config = app.config.gemini.clone();
    let hard_limit = config.max_frame_bytes.saturating_mul(2);
    ws.max_message_size(hard_limit)
        .max_frame_size(hard_limit)
        .on_upgrade(move |socket| async move {
            let _permit = permit;
            serve(socket, app, peer).await;
        })
}

/// Serves one upgraded connection on the door driver until the client leaves, the session is
/// closed or the server shuts down.
async fn serve(socket: WebSocket, app: Arc<App>, peer: std::net::SocketAddr) {
    let mut config = app.config.gemini.clone();
    // The sessions see `[gemini.engine]` over `[engine]`.
    config.engine = config.engine.over(&app.config.engine);
    let mut cx = app.driver(Door::Gemini);
    cx.identity.peer = Some(peer);
    cx.max_frame_bytes = config.max_frame_bytes;
    cx.limits.init_timeout = config.connect_timeout(cx.limits.init_timeout);
    // Pass-through sessions have no engine; their translator ignores the tools.
    cx.mcp = app.mcp_tools(config.mcp_tools);
    let door = translator::GeminiDoor::new(
        config,
        Arc::clone(&app.metrics),
        passthrough::connector(),
        cx.limits.init_timeout,
    )
    .with_history_limit(app.config.limits.max_history_messages)
    .with_webrtc(cx.webrtc.is_some());
    crate::door::run(socket, door, cx).await;
}

/// Queues a bridge message for the client: model audio may be dropped under back-pressure,
/// everything else is sent.
fn emit(out: &mut Out, m: &ServerMessage) {
    if matches!(m, ServerMessage::GeminiError { .. }) {
        tracing::debug!(error = %m.encode(), "gemini door error");
    }
    let frame = ServerFrame::Text(m.encode());
    if m.is_droppable() {
        out.send_droppable(frame);
    } else {
        out.send(frame);
    }
}

/// A `LOG_MESSAGE` stamped with the wall clock now (the app drops one without a `date`).
fn log_message(level: &str, message: String) -> ServerMessage {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    ServerMessage::LogMessage(voxgate_gemini::bridge::LogMessage::new(
        voxgate_gemini::bridge::iso8601_utc(millis),
        level,
        message,
    ))
}
