//! The VIP browser door: `POST /webrtc/offer` answers a WebRTC offer (SDP in, SDP out, like
//! WHIP) and the session speaks the Voice Interaction Protocol on the connection's data
//! channel while audio flows on its track; `DELETE /webrtc/sessions/<id>` hangs up. Also the
//! playground page at `/`, a client of this door served from the binary.
//!
//! The session runs on the shared door driver with the connection as its transport
//! ([`crate::door::run_peer`]); [`translator::VipDoor`] is the protocol, without I/O. The wire
//! shapes are written down in `docs/doors/vip.md` and typed in the `voxgate-vip` crate.
//!
//! Access: open by default (like the other doors on the loopback listener); with
//! `[vip] tokens` set, an offer without one (`Authorization: Bearer` or `?token=`) is refused
//! with 401 before any WebRTC work. Admission (server, door and per-address limits, the
//! handshake rate, the overload guard) and `[webrtc] max_sessions` apply before the answer.

mod config;
mod translator;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{delete, get, post};
use serde_json::json;

pub use config::VipConfig;

use crate::metrics::Door;
use crate::server::App;
use crate::webrtc::{MAX_OFFER_BYTES, OfferError, PeerOptions};

/// The playground page: one file, no build step, nothing fetched from elsewhere.
const PLAYGROUND: &str = include_str!("../playground/index.html");

/// Open sessions by id, so `DELETE /webrtc/sessions/<id>` can hang one up.
#[derive(Debug, Default)]
pub(crate) struct Sessions(Mutex<HashMap<String, tokio::sync::oneshot::Sender<()>>>);

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, tokio::sync::oneshot::Sender<()>>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The door's routes on the main listener.
pub(crate) fn routes() -> Router<Arc<App>> {
    Router::new()
        .route("/", get(playground))
        .route(
            "/webrtc/offer",
            post(offer).layer(DefaultBodyLimit::max(MAX_OFFER_BYTES)),
        )
        .route("/webrtc/sessions/{id}", delete(hang_up))
}

async fn playground(State(app): State<Arc<App>>) -> Response {
    if !app.config.vip.playground {
        return StatusCode::NOT_FOUND.into_response();
    }
    (
        [
            // The page talks only to this origin; nothing else may frame or feed it.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                 img-src 'self' data:; media-src 'self' blob:; connect-src 'self'; \
                 frame-ancestors 'none'",
            ),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Html(PLAYGROUND),
    )
        .into_response()
}

fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let body = json!({"error": {"code": code, "message": message.into()}});
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// The token an offer carries: `Authorization: Bearer <t>` or `?token=<t>` (percent-decoded).
fn presented(headers: &HeaderMap, uri: &Uri) -> Option<String> {
    crate::access::bearer(headers)
        .map(str::to_owned)
        .or_else(|| crate::access::query_param(uri.query()?, "token"))
}

/// The offer's SDP and whether the answer goes back as JSON.
fn parse_body(headers: &HeaderMap, body: &[u8]) -> Result<(String, bool), Box<Response>> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let text = std::str::from_utf8(body).map_err(|_| {
        error(
            StatusCode::BAD_REQUEST,
            "bad_offer",
            "the body is not UTF-8",
        )
    })?;
    match content_type.as_str() {
        "application/json" => {
            #[derive(serde::Deserialize)]
            struct Offer {
                sdp: String,
                #[serde(rename = "type")]
                kind: Option<String>,
            }
            let o: Offer = serde_json::from_str(text).map_err(|e| {
                Box::new(error(
                    StatusCode::BAD_REQUEST,
                    "bad_offer",
                    format!("expected {{\"sdp\": ..., \"type\": \"offer\"}}: {e}"),
                ))
            })?;
            if o.kind.as_deref().is_some_and(|k| k != "offer") {
                return Err(Box::new(error(
                    StatusCode::BAD_REQUEST,
                    "bad_offer",
                    "the description's type must be \"offer\"",
                )));
            }
            Ok((o.sdp, true))
        }
        "application/sdp" => Ok((text.to_owned(), false)),
        other => Err(Box::new(error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!("send application/json or application/sdp, not {other:?}"),
        ))),
    }
}

async fn offer(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    uri: Uri,
    body: Bytes,
) -> Response {
    let config = &app.config.vip;
    if !config.enabled {
        return error(
            StatusCode::NOT_FOUND,
            "disabled",
            "the VIP door is disabled",
        );
    }
    if !config.tokens.is_empty()
        && !presented(&headers, &uri)
            .is_some_and(|t| crate::secret::matches_any(&config.tokens, &t))
    {
        app.metrics.error(Door::Vip);
        return (
            [(header::WWW_AUTHENTICATE, "Bearer")],
            error(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "missing or unknown token",
            ),
        )
            .into_response();
    }
    let (sdp, as_json) = match parse_body(&headers, &body) {
        Ok(v) => v,
        Err(r) => {
            app.metrics.error(Door::Vip);
            return *r;
        }
    };
    let permit = match app.admit(Door::Vip, peer.ip()).await {
        Ok(p) => p,
        Err(refused) => return refused.into_response(),
    };
    let Some(endpoint) = app.webrtc.clone() else {
        return error(
            StatusCode::NOT_FOUND,
            "disabled",
            "WebRTC is not enabled on this server ([webrtc] enabled)",
        );
    };
    let options = PeerOptions {
        input_rate: translator::INPUT_RATE,
        data_channel: crate::webrtc::DataChannel::Door,
    };
    let accepted = match endpoint.accept(&sdp, options) {
        Ok(a) => a,
        Err(e @ OfferError::BadOffer(_)) => {
            app.metrics.error(Door::Vip);
            return error(StatusCode::BAD_REQUEST, "bad_offer", e.to_string());
        }
        Err(e @ OfferError::Full) => {
            return (
                [(header::RETRY_AFTER, "5")],
                error(StatusCode::SERVICE_UNAVAILABLE, "full", e.to_string()),
            )
                .into_response();
        }
        Err(e @ OfferError::Disabled) => {
            return error(StatusCode::NOT_FOUND, "disabled", e.to_string());
        }
    };
    // Not the ICE ufrag (in the SDP, and short): hanging up by id needs a real capability.
    let session_id = crate::webrtc::random_token(22);
    let mut engine_config = voxgate_engine::EngineConfig {
        max_history_messages: app.config.limits.max_history_messages,
        ..voxgate_engine::EngineConfig::default()
    };
    config
        .engine
        .over(&app.config.engine)
        .apply(&mut engine_config);
    let door = match translator::VipDoor::new(
        engine_config,
        session_id.clone(),
        Arc::clone(&app.metrics),
        Instant::now(),
    ) {
        Ok(d) => d,
        Err(e) => {
            tracing::error!(error = %e, "vip: engine configuration");
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "engine configuration",
            );
        }
    };
    let mut cx = app.driver(Door::Vip);
    cx.identity.peer = Some(peer);
    cx.mcp = app.mcp_tools(config.mcp_tools);
    // ICE consent checks tell a dead peer; WebSocket pings mean nothing here.
    cx.limits.ping_interval = None;
    cx.limits.init_timeout = Some(std::time::Duration::from_secs(
        app.config.webrtc.connect_timeout_secs,
    ));
    let (hangup_tx, hangup_rx) = tokio::sync::oneshot::channel();
    app.vip_sessions
        .lock()
        .insert(session_id.clone(), hangup_tx);
    // Not the session id: it hangs the session up (`DELETE /webrtc/sessions/{id}`).
    tracing::info!(%peer, "vip: offer answered");
    let registry = Arc::clone(&app);
    let id = session_id.clone();
    let peer_handle = accepted.peer;
    tokio::spawn(async move {
        let _permit = permit;
        tokio::select! {
            () = crate::door::run_peer(peer_handle, door, cx) => {}
            _ = hangup_rx => {}
        }
        registry.vip_sessions.lock().remove(&id);
    });
    if as_json {
        (
            [(header::CONTENT_TYPE, "application/json")],
            json!({"sdp": accepted.answer, "type": "answer", "session_id": session_id}).to_string(),
        )
            .into_response()
    } else {
        (
            StatusCode::CREATED,
            [
                (header::CONTENT_TYPE, "application/sdp".to_owned()),
                (header::LOCATION, format!("/webrtc/sessions/{session_id}")),
            ],
            accepted.answer,
        )
            .into_response()
    }
}

/// WHIP's hang-up: the session id is the capability (random, unguessable, and only in the
/// answer to its own offer).
async fn hang_up(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    match app.vip_sessions.lock().remove(&id) {
        Some(tx) => {
            let _ = tx.send(());
            StatusCode::OK.into_response()
        }
        None => error(StatusCode::NOT_FOUND, "not_found", "no such session"),
    }
}
