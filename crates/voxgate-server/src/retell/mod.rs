//! The Retell custom-LLM door: Retell calls us at `/llm-websocket/{call_id}` and we answer as
//! the LLM.
//!
//! Retell does speech recognition and synthesis on its side, so this door is text in, text
//! out: every `response_required` / `reminder_required` carries the complete transcript, the
//! door turns it into a chat context and streams the configured LLM's answer back as
//! `response` chunks. The protocol bookkeeping (config on connect, the begin message, which
//! `response_id` is current, ping/pong, resuming after a reconnect) is the sans-IO
//! [`voxgate_retell::ResponseTracker`]; this module adds the LLM, tools and the call registry,
//! and the shared door driver ([`crate::door`]) runs the socket: the session is a translator
//! without I/O (`session::RetellSession`), unit-tested on a virtual clock.
//!
//! # Why not the engine
//! [`voxgate_engine::Engine`] owns a conversation: its own history, turn-taking, VAD,
//! barge-in truncation, TTS sentence splitting and tools routed to the client or a device. Here
//! Retell owns all of that: it decides when a turn ends, tells us what the user heard (its
//! transcript already reflects interruptions), and may restart a request with a new id at any
//! time. Driving an engine would mean keeping a second history and reconciling it with
//! Retell's on every event. So the door rebuilds the context from Retell's transcript for each
//! request and asks the driver to run the LLM (the provider runner the engine-driven doors use:
//! provider tasks are aborted when a request goes stale or the socket closes, and LLM latency
//! lands in the metrics).
//!
//! # Tools
//! See [`tools`]: `end_call` and `transfer_call` become the response's `end_call` /
//! `transfer_number`; lookups run here, are reported with `tool_call_invocation` /
//! `tool_call_result`, and the model continues the same `response_id`.
//!
//! # Calls, sockets and resuming
//! Per-call state (the tracker, the call details, whether `update_agent` went out) lives in the
//! [`registry`], keyed by `call_id`, and outlives the socket for `resume_window_secs`: Retell
//! reconnects to the same URL after 5 s of silence, and the call resumes (config again, no new
//! begin message). A call belongs to one socket at a time: while it is live, another upgrade
//! for the same `call_id` is refused with 409 and the live socket is left alone (it waits up
//! to [`RECONNECT_GRACE`] first, for a reconnect that overtook its own socket's close). The
//! door closes with 1000 (any other code ends the call as an error on Retell's side), also at
//! shutdown, once the response being streamed finished; only a frame over `max_frame_bytes`
//! (1009) or a dead peer end otherwise. Frames that cannot be read are counted and logged;
//! when an unreadable frame is recognisably a request, the request gets the configured
//! apology.
//!
//! # The secret
//! With `secret` set, the socket's URL must carry it: `/llm-websocket/{secret}/{call_id}` (the
//! URL pasted into Retell is `wss://host/llm-websocket/{secret}` and Retell appends the call
//! id) or `/llm-websocket/{call_id}?secret=...`. It is checked in constant time before the
//! upgrade, and neither it nor the path that carries it is logged.
//!
//! # Control API
//! `POST /retell/calls/{call_id}/interrupt` (server-initiated speech, `agent_interrupt`),
//! `POST /retell/calls/{call_id}/metadata` (a `metadata` event for the web frontend) and
//! `GET /retell/calls`. Bearer `control_token` when configured (from any client); without one
//! only for local requests ([`crate::access`]: a loopback peer that is not a trusted proxy,
//! without forwarding headers).

mod cluster;
mod config;
pub(crate) mod registry;
mod session;
pub(crate) mod tools;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{ConnectInfo, Json, Path, Query, State, WebSocketUpgrade};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use tokio::sync::oneshot;

pub use config::{RetellAgentSettings, RetellConfig};

use crate::server::App;
use registry::Refused;
use session::CallState;

/// A request from the control API to the session serving a call.
#[derive(Debug)]
pub(crate) enum Control {
    /// Send an `agent_interrupt`; answers with its `interrupt_id`.
    Interrupt {
        body: InterruptRequest,
        reply: oneshot::Sender<Result<u64, String>>,
    },
    /// Send a `metadata` event.
    Metadata {
        metadata: serde_json::Value,
        reply: oneshot::Sender<Result<(), String>>,
    },
}

/// Body of `POST /retell/calls/{call_id}/interrupt` (also what a routed interrupt carries).
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct InterruptRequest {
    /// What the agent says.
    pub(crate) content: String,
    /// Reuse an id to append to that interrupt; omitted: a new id.
    #[serde(default)]
    pub(crate) interrupt_id: Option<u64>,
    /// Default true: the last chunk of this interrupt.
    #[serde(default)]
    pub(crate) content_complete: Option<bool>,
    /// Default true: the user cannot talk over it.
    #[serde(default)]
    pub(crate) no_interruption_allowed: Option<bool>,
    /// End the call once spoken.
    #[serde(default)]
    pub(crate) end_call: Option<bool>,
    /// Transfer the call once spoken.
    #[serde(default)]
    pub(crate) transfer_number: Option<String>,
}

/// How long an upgrade for a call whose socket is still live waits for that socket to close
/// before it is refused (409). Retell reconnects as soon as it gives up on a socket; its close
/// frame, or our noticing the silence, may reach the old session a moment after the new
/// upgrade arrives. A few seconds covers that and keeps a refused hijack attempt cheap.
pub(crate) const RECONNECT_GRACE: Duration = Duration::from_secs(3);

/// Longest `call_id` accepted.
const MAX_CALL_ID_BYTES: usize = 256;

/// The door's routes on the main listener.
pub(crate) fn routes() -> Router<Arc<App>> {
    Router::new()
        .route("/llm-websocket/{call_id}", get(upgrade))
        .route(
            "/llm-websocket/{secret}/{call_id}",
            get(upgrade_with_secret),
        )
        .route("/retell/calls", get(list_calls))
        .route("/retell/calls/{call_id}/interrupt", post(interrupt))
        .route("/retell/calls/{call_id}/metadata", post(metadata))
}

fn json_error(status: StatusCode, message: impl Into<String>) -> Response {
    let body = serde_json::json!({"error": message.into()}).to_string();
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// The query of the socket URL: only `secret` is looked at.
#[derive(Debug, Default, Deserialize)]
struct SocketQuery {
    secret: Option<String>,
}

/// Where the upgrade request carried a secret, if anywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Presented<'a> {
    Nowhere,
    /// `/llm-websocket/{secret}/{call_id}`.
    Path(&'a str),
    /// `/llm-websocket/{call_id}?secret=...`.
    Query(&'a str),
}

impl Presented<'_> {
    /// For logs: where the secret was, never what it was.
    fn form(self) -> &'static str {
        match self {
            Presented::Nowhere => "none",
            Presented::Path(_) => "path",
            Presented::Query(_) => "query",
        }
    }
}

/// Why a socket's secret was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SecretRefusal {
    /// A secret is configured and the URL carries none (401).
    Missing,
    /// The URL carries a secret that is not the configured one (403).
    Wrong,
    /// The URL carries a secret but none is configured (404): refused so that an operator
    /// who pasted a URL with a secret is not silently running unprotected.
    NotConfigured,
}

impl SecretRefusal {
    fn into_response(self) -> Response {
        match self {
            SecretRefusal::Missing => {
                json_error(StatusCode::UNAUTHORIZED, "missing Retell socket secret")
            }
            SecretRefusal::Wrong => json_error(StatusCode::FORBIDDEN, "wrong Retell socket secret"),
            SecretRefusal::NotConfigured => json_error(
                StatusCode::NOT_FOUND,
                "this server has no retell.secret; remove the secret from the URL",
            ),
        }
    }
}

/// Whether the secret `presented` lets a socket in when `configured` is the door's secret
/// (empty: none). Compared in constant time.
fn check_secret(configured: &str, presented: Presented<'_>) -> Result<(), SecretRefusal> {
    match (configured.is_empty(), presented) {
        (true, Presented::Nowhere) => Ok(()),
        (true, _) => Err(SecretRefusal::NotConfigured),
        (false, Presented::Nowhere) => Err(SecretRefusal::Missing),
        (false, Presented::Path(given) | Presented::Query(given)) => {
            if crate::secret::secret_eq(configured, given) {
                Ok(())
            } else {
                Err(SecretRefusal::Wrong)
            }
        }
    }
}

/// `/llm-websocket/{call_id}`, with the secret (if any) in the query.
async fn upgrade(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<std::net::SocketAddr>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<SocketQuery>, QueryRejection>,
    ws: WebSocketUpgrade,
) -> Response {
    // A rejection's text could quote the URL, secret included: fixed answers instead.
    let (Ok(Path(call_id)), Ok(Query(query))) = (path, query) else {
        return json_error(StatusCode::BAD_REQUEST, "unreadable socket URL");
    };
    let presented = query
        .secret
        .as_deref()
        .map_or(Presented::Nowhere, Presented::Query);
    serve_upgrade(app, peer, presented, call_id, ws).await
}

/// `/llm-websocket/{secret}/{call_id}`: the URL pasted into Retell carries the secret, and
/// Retell appends the call id.
async fn upgrade_with_secret(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<std::net::SocketAddr>,
    path: Result<Path<(String, String)>, PathRejection>,
    ws: WebSocketUpgrade,
) -> Response {
    let Ok(Path((secret, call_id))) = path else {
        return json_error(StatusCode::BAD_REQUEST, "unreadable socket URL");
    };
    let presented = Presented::Path(&secret);
    serve_upgrade(app, peer, presented, call_id, ws).await
}

async fn serve_upgrade(
    app: Arc<App>,
    peer: std::net::SocketAddr,
    presented: Presented<'_>,
    call_id: String,
    ws: WebSocketUpgrade,
) -> Response {
    if !app.config.retell.enabled {
        return json_error(StatusCode::NOT_FOUND, "the Retell door is disabled");
    }
    let permit = match app.admit(crate::metrics::Door::Retell, peer.ip()).await {
        Ok(p) => p,
        Err(refused) => return refused.into_response(),
    };
    if let Err(refusal) = check_secret(&app.config.retell.secret, presented) {
        app.metrics.error(crate::metrics::Door::Retell);
        // No call id either: a URL missing its call id puts the secret where the id goes.
        tracing::info!(
            peer = %peer.ip(),
            secret_in = presented.form(),
            ?refusal,
            "Retell upgrade refused"
        );
        return refusal.into_response();
    }
    if call_id.is_empty() || call_id.len() > MAX_CALL_ID_BYTES {
        return json_error(StatusCode::BAD_REQUEST, "call_id must be 1 to 256 bytes");
    }
    let cfg = &app.config.retell.with_engine(&app.config.engine);
    let window = Duration::from_secs(cfg.resume_window_secs);
    let registry = Arc::clone(&app.shared.retell_calls);
    let entry = match &app.cluster {
        Some(cluster) => {
            match cluster::take_over(cluster, &registry, cfg, &call_id, window).await {
                Ok(entry) => Some(entry),
                Err(r) => return r,
            }
        }
        None => None,
    };
    let claimed = registry
        .claim_within(&call_id, window, RECONNECT_GRACE, || CallState::new(cfg))
        .await;
    let lease = match claimed {
        Ok(lease) => lease,
        Err(Refused::Busy) => {
            // Never the call id: refusals are not logged with what was guessed.
            tracing::info!(peer = %peer.ip(), "Retell upgrade refused: the call has a live socket");
            return json_error(
                StatusCode::CONFLICT,
                "this call already has a live socket; a reconnect is accepted once it closes",
            );
        }
        Err(Refused::Full) => {
            return json_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "too many Retell calls on this server",
            );
        }
    };
    let max = cfg.max_frame_bytes;
    // A failed upgrade drops the closure and with it the lease: the call is released.
    ws.max_message_size(max)
        .max_frame_size(max)
        .on_upgrade(move |socket| async move {
            let _permit = permit;
            session::serve(socket, app, lease, peer, entry).await;
        })
}

/// Whether a control request from `peer` may proceed: the operator-surface rule of
/// [`crate::access`] with `control_token` as the one token.
fn control_allowed(
    app: &App,
    peer: std::net::SocketAddr,
    headers: &HeaderMap,
) -> Result<(), Box<Response>> {
    if !app.config.retell.enabled {
        return Err(Box::new(json_error(
            StatusCode::NOT_FOUND,
            "the Retell door is disabled",
        )));
    }
    let token = &app.config.retell.control_token;
    let origin = crate::access::Origin::resolve(&app.config.trusted_proxies, peer.ip(), headers);
    crate::access::check_one(&origin, token, headers).map_err(|refusal| {
        let message = match refusal {
            crate::access::Refusal::NotLocal => {
                "the control API is only served to localhost; set retell.control_token to use \
                 it otherwise"
            }
            _ => "missing or wrong bearer control token",
        };
        Box::new(json_error(refusal.status(), message))
    })
}

async fn list_calls(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<std::net::SocketAddr>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = control_allowed(&app, peer, &headers) {
        return *r;
    }
    let body = serde_json::json!({"calls": app.shared.retell_calls.list()}).to_string();
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// A saved call's state read back and saved again (the fuzz target's path through
/// [`CallState::from_saved`]); `None` when it is not one.
#[doc(hidden)]
pub(crate) fn resave(call_id: &str, json: &str) -> Option<String> {
    CallState::from_saved(&RetellConfig::default(), call_id, json).map(|s| s.to_saved())
}

/// A control API request for one call.
#[derive(Debug)]
pub(crate) enum ControlOp {
    /// `POST /retell/calls/{call_id}/interrupt`.
    Interrupt(InterruptRequest),
    /// `POST /retell/calls/{call_id}/metadata`.
    Metadata(serde_json::Value),
}

impl ControlOp {
    /// The routed operation's name and body.
    fn routed(&self) -> (&'static str, serde_json::Value) {
        match self {
            Self::Interrupt(b) => (
                "retell.interrupt",
                serde_json::to_value(b).unwrap_or_default(),
            ),
            Self::Metadata(m) => ("retell.metadata", m.clone()),
        }
    }

    /// The operation a routed request names, from its body.
    pub(crate) fn from_routed(op: &str, body: serde_json::Value) -> Option<Self> {
        match op {
            "retell.interrupt" => serde_json::from_value(body).ok().map(Self::Interrupt),
            "retell.metadata" => Some(Self::Metadata(body)),
            _ => None,
        }
    }
}

fn reply_error(status: u16, message: impl Into<String>) -> crate::cluster::Reply {
    crate::cluster::Reply::new(status, serde_json::json!({"error": message.into()}))
}

/// Runs `op` on `call_id`'s session: here when its socket is here, else (unless the request
/// was already `routed` here) on the instance the cluster directory names.
pub(crate) async fn control(
    app: &App,
    call_id: &str,
    op: ControlOp,
    routed: bool,
) -> crate::cluster::Reply {
    if let Some(tx) = app.shared.retell_calls.control(call_id) {
        return match op {
            ControlOp::Interrupt(body) => {
                let (reply, answer) = oneshot::channel();
                let sent = tx.try_send(Control::Interrupt { body, reply }).is_ok();
                finish(sent, answer, |id| {
                    (202, serde_json::json!({"interrupt_id": id}))
                })
                .await
            }
            ControlOp::Metadata(metadata) => {
                let (reply, answer) = oneshot::channel();
                let sent = tx.try_send(Control::Metadata { metadata, reply }).is_ok();
                finish(sent, answer, |()| (202, serde_json::Value::Null)).await
            }
        };
    }
    let not_here = || reply_error(404, format!("no connected Retell call {call_id:?}"));
    let Some(cluster) = app.cluster.as_ref().filter(|_| !routed) else {
        return not_here();
    };
    match crate::cluster::live_holder(cluster, crate::cluster::Kind::Retell, call_id).await {
        Ok(Some(holder)) => {
            let (name, body) = op.routed();
            match cluster.call(&holder, name, call_id, body).await {
                Ok(reply) => reply,
                Err(e) => reply_error(e.status(), e.to_string()),
            }
        }
        Ok(None) => not_here(),
        Err(e) => reply_error(e.status(), e.to_string()),
    }
}

/// Waits (bounded) for a session's answer to a control request.
async fn finish<T>(
    sent: bool,
    answer: oneshot::Receiver<Result<T, String>>,
    ok: impl FnOnce(T) -> (u16, serde_json::Value),
) -> crate::cluster::Reply {
    if !sent {
        return reply_error(503, "the call is busy or gone; try again");
    }
    match tokio::time::timeout(Duration::from_secs(5), answer).await {
        Ok(Ok(Ok(v))) => {
            let (status, body) = ok(v);
            crate::cluster::Reply::new(status, body)
        }
        Ok(Ok(Err(message))) => reply_error(409, message),
        _ => reply_error(503, "the call ended before it could act"),
    }
}

async fn interrupt(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<std::net::SocketAddr>,
    Path(call_id): Path<String>,
    headers: HeaderMap,
    body: Result<Json<InterruptRequest>, axum::extract::rejection::JsonRejection>,
) -> Response {
    if let Err(r) = control_allowed(&app, peer, &headers) {
        return *r;
    }
    let body = match body {
        Ok(Json(b)) => b,
        Err(e) => return json_error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    control(&app, &call_id, ControlOp::Interrupt(body), false)
        .await
        .into_response()
}

async fn metadata(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<std::net::SocketAddr>,
    Path(call_id): Path<String>,
    headers: HeaderMap,
    body: Result<Json<serde_json::Value>, axum::extract::rejection::JsonRejection>,
) -> Response {
    if let Err(r) = control_allowed(&app, peer, &headers) {
        return *r;
    }
    let metadata = match body {
        Ok(Json(b)) => b,
        Err(e) => return json_error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    control(&app, &call_id, ControlOp::Metadata(metadata), false)
        .await
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_call_reads_back_and_is_stable_after_one_round() {
        use voxgate_retell::{ResponseRequest, RetellEvent, TrackerInput, Utterance};
        let mut state = CallState::new(&RetellConfig::default());
        let now = std::time::Instant::now();
        for input in [
            TrackerInput::Connected {
                call_id: "call-1".into(),
            },
            TrackerInput::Received(RetellEvent::ResponseRequired(ResponseRequest {
                response_id: 1,
                transcript: vec![Utterance {
                    content: "hello".into(),
                    ..Utterance::default()
                }],
                ..ResponseRequest::default()
            })),
        ] {
            state.tracker.handle_input(now, input).unwrap();
        }
        let saved = state.to_saved();
        // Restoring cuts the open answer off (its socket is gone); from then on it is stable.
        let once = resave("call-1", &saved).unwrap();
        assert_ne!(once, saved);
        assert_eq!(resave("call-1", &once).as_deref(), Some(once.as_str()));
        assert!(once.contains("hello"));
        // Another call's state, or garbage, is not taken.
        assert_eq!(resave("call-2", &saved), None);
        assert_eq!(resave("call-1", "{"), None);
    }

    #[test]
    fn the_secret_decides_before_the_upgrade() {
        // No secret configured: today's URLs work, a URL with a secret is refused.
        assert_eq!(check_secret("", Presented::Nowhere), Ok(()));
        for p in [
            Presented::Path("s"),
            Presented::Query("s"),
            Presented::Query(""),
        ] {
            assert_eq!(check_secret("", p), Err(SecretRefusal::NotConfigured));
        }
        // A secret configured: only that exact one.
        let s = "k3y-0123456789";
        assert_eq!(
            check_secret(s, Presented::Nowhere),
            Err(SecretRefusal::Missing)
        );
        for given in [
            "",
            "k3y",
            "k3y-012345678",
            "k3y-01234567890",
            "K3Y-0123456789",
        ] {
            assert_eq!(
                check_secret(s, Presented::Path(given)),
                Err(SecretRefusal::Wrong)
            );
            assert_eq!(
                check_secret(s, Presented::Query(given)),
                Err(SecretRefusal::Wrong)
            );
        }
        assert_eq!(check_secret(s, Presented::Path(s)), Ok(()));
        assert_eq!(check_secret(s, Presented::Query(s)), Ok(()));
        assert_eq!(Presented::Path(s).form(), "path");
    }
}
