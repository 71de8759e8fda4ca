//! The realtime door: the protobuf session protocol (Deepslate-compatible) over WebSocket.
//!
//! Each connection is a [`RealtimeDoor`] translator run by the shared door driver
//! ([`crate::door`]): the driver owns the socket, the queues, the provider tasks, the
//! lifecycle timers and close; the translator turns protocol messages into engine inputs and
//! engine events into protocol messages.
//!
//! Per session: a client whose `TtsConfiguration` names ElevenLabs gets its own synthesizer
//! (its key, voice, model, settings and location; `[realtime] elevenlabs_base_url` overrides
//! the host); hosted TTS uses the server's. `ModelSpeechProgress` is paced to playback
//! ([`progress`]); `InferenceComplete` precedes each `ResponseEnd`; a final `TurnSnapshot`
//! follows each finished reply. The engine's `Emotion` events have no counterpart in this
//! protocol and are dropped, so replies reach realtime clients without emoji (the engine never
//! shows or speaks them). `ContextTruncated` reports the turns the engine drops from the model's
//! context to keep it within `[realtime] max_context_chars`; exported messages carry the
//! response turn that dropped them in `truncated_at_response_turn_id`. A connection that does
//! not initialize within the init timeout gets an `ErrorSession` notification and a 1008 close;
//! an unusable `InitializeSessionRequest` is answered with its error and a 1008 close. The user
//! guide is `docs/doors/realtime.md`.
//!
//! The same sessions are served over gRPC ([`grpc`]): the translator is this one, only the
//! transport differs.

pub(crate) mod grpc;
mod progress;
mod session;

use session::{RealtimeDoor, RealtimeSettings};

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::ws::WebSocket;
use axum::extract::{ConnectInfo, State, WebSocketUpgrade};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::metrics::Door;
use crate::server::App;

/// The door's routes on the main listener: `/realtime` and the Deepslate-style vendor paths,
/// and the gRPC service unless `[realtime] grpc_listen` gives it a listener of its own.
pub(crate) fn routes(config: &crate::config::Config) -> Router<Arc<App>> {
    let router = if config.realtime.grpc_listen.is_none() {
        grpc::routes()
    } else {
        Router::new()
    };
    router
        .route("/realtime", get(realtime_upgrade))
        .route(
            "/api/v1/vendors/{vendor}/organizations/{org}/realtime",
            get(realtime_upgrade),
        )
        .route(
            "/api/v1/vendors/{vendor}/organizations/{org}/realtime/{model}",
            get(realtime_upgrade),
        )
}

/// Serves one upgraded connection until the client leaves, a fatal error, a timeout or
/// shutdown.
pub(crate) async fn serve(socket: WebSocket, app: Arc<App>, peer: SocketAddr) {
    let (door, cx) = session(&app, peer);
    crate::door::run(socket, door, cx).await;
}

/// A new session's translator and driver context, whatever its transport.
fn session(app: &App, peer: SocketAddr) -> (RealtimeDoor, crate::door::DriverContext) {
    let settings = RealtimeSettings {
        elevenlabs_base_url: app.config.realtime.elevenlabs_base_url.clone(),
        max_context_chars: app.config.realtime.max_context_chars,
        max_history_messages: app.config.limits.max_history_messages,
        engine: engine_settings(&app.config),
    };
    let door = RealtimeDoor::new(Arc::clone(&app.metrics), settings);
    let mut cx = app.driver(Door::Realtime);
    cx.identity.peer = Some(peer);
    cx.mcp = app.mcp_tools(app.config.realtime.mcp_tools);
    (door, cx)
}

/// `[realtime.engine]` over `[realtime] max_context_chars` (when changed from its default: the
/// door's older spelling of the same setting) over `[engine]`.
pub(crate) fn engine_settings(config: &crate::config::Config) -> crate::config::EngineSettings {
    let rt = &config.realtime;
    let own = crate::config::EngineSettings {
        max_context_chars: (rt.max_context_chars != voxgate_engine::DEFAULT_MAX_CONTEXT_CHARS)
            .then_some(rt.max_context_chars),
        ..crate::config::EngineSettings::default()
    };
    rt.engine.over(&own.over(&config.engine))
}

/// Whether the request carries one of the configured bearer keys (always, when none are
/// configured).
fn authorized(keys: &[String], headers: &HeaderMap) -> bool {
    bearer_accepted(
        keys,
        headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok()),
    )
}

/// Whether an `Authorization` value (`Bearer <key>`) names one of `keys`, compared in constant
/// time; any value passes when no keys are configured.
fn bearer_accepted(keys: &[String], authorization: Option<&str>) -> bool {
    if keys.is_empty() {
        return true;
    }
    authorization
        .and_then(crate::access::bearer_value)
        .is_some_and(|token| crate::secret::matches_any(keys, token))
}

async fn realtime_upgrade(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Response {
    let permit = match app.admit(Door::Realtime, peer.ip()).await {
        Ok(p) => p,
        Err(refused) => return refused.into_response(),
    };
    if !authorized(&app.config.realtime.api_keys, &headers) {
        return (
            StatusCode::UNAUTHORIZED,
            "missing or unknown bearer API key",
        )
            .into_response();
    }
    let hard_limit = app.config.max_frame_bytes.saturating_mul(4);
    ws.max_message_size(hard_limit)
        .max_frame_size(hard_limit)
        .on_upgrade(move |socket| async move {
            let _permit = permit;
            serve(socket, app, peer).await;
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_keys() {
        let mut h = HeaderMap::new();
        assert!(authorized(&[], &h));
        let keys = vec!["k1".to_owned()];
        assert!(!authorized(&keys, &h));
        h.insert(header::AUTHORIZATION, "Bearer k2".parse().unwrap());
        assert!(!authorized(&keys, &h));
        h.insert(header::AUTHORIZATION, "Bearer k1".parse().unwrap());
        assert!(authorized(&keys, &h));
        // RFC 7235: the scheme in any letter case (docs/security.md says so).
        for scheme in ["bearer", "BEARER", "BeArEr"] {
            h.insert(
                header::AUTHORIZATION,
                format!("{scheme} k1").parse().unwrap(),
            );
            assert!(authorized(&keys, &h), "{scheme}");
        }
        h.insert(header::AUTHORIZATION, "Basic k1".parse().unwrap());
        assert!(!authorized(&keys, &h));
    }
}
