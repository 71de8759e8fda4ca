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
//! Per-call state (the tracker, the call details, whether `update_agent` went out) lives in a
//! registry keyed by `call_id` and outlives the socket for `resume_window_secs`: Retell
//! reconnects to the same URL after 5 s of silence, and the call resumes (config again, no new
//! begin message). A second socket for a call that is still connected takes over: the old one
//! is told to leave through its control channel and closed with 1000, and the new one waits
//! (at most 5 s) for it to release the call's state before the driver runs. The door closes
//! with 1000 (any other code ends the call as an error on Retell's side), also at shutdown,
//! once the response being streamed finished; only a frame over `max_frame_bytes` (1009) or a
//! dead peer end otherwise. Frames that cannot be read are counted and logged; when an
//! unreadable frame is recognisably a request, the request gets the configured apology.
//!
//! # Control API
//! `POST /retell/calls/{call_id}/interrupt` (server-initiated speech, `agent_interrupt`),
//! `POST /retell/calls/{call_id}/metadata` (a `metadata` event for the web frontend) and
//! `GET /retell/calls`. Bearer `control_token` when configured (from any client); without one
//! only for local requests ([`crate::access`]: a loopback peer that is not a trusted proxy,
//! without forwarding headers).

mod config;
mod session;
pub(crate) mod tools;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Json, Path, State, WebSocketUpgrade};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use serde::Deserialize;
use tokio::sync::{mpsc, oneshot};

pub use config::{RetellAgentSettings, RetellConfig};

use crate::server::App;
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
    /// A newer socket of the same call took over: close this one (1000).
    Leave,
}

/// Body of `POST /retell/calls/{call_id}/interrupt`.
#[derive(Debug, Clone, Default, Deserialize)]
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

/// Queue of control requests per connected call.
const CONTROL_QUEUE: usize = 16;

/// Calls (connected or parked for resuming) one server keeps at most; new call ids beyond it
/// are refused with 503 so a flood of connections cannot grow the registry without bound.
const MAX_CALLS: usize = 10_000;

/// The calls this server knows: connected ones and, for a while, disconnected ones.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    calls: Mutex<HashMap<String, Entry>>,
}

#[derive(Debug)]
struct Entry {
    state: Arc<tokio::sync::Mutex<CallState>>,
    /// Bumped by every connection; a session whose generation is no longer current leaves.
    generation: u64,
    /// The connected session's control channel. Replacing it tells the old session to leave
    /// ([`Control::Leave`], and the channel closes once no request holds a sender).
    control: Option<mpsc::Sender<Control>>,
    parked_at: Option<Instant>,
}

/// What a new connection gets from the registry.
pub(crate) struct Attached {
    pub(crate) state: Arc<tokio::sync::Mutex<CallState>>,
    pub(crate) generation: u64,
    pub(crate) control: mpsc::Receiver<Control>,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        // A panic elsewhere cannot leave the map inconsistent: every update is one statement.
        self.calls.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a connection for `call_id`, creating the call's state on first sight.
    pub(crate) fn attach(
        &self,
        call_id: &str,
        window: Duration,
        new_state: impl FnOnce() -> CallState,
    ) -> Attached {
        let (control_tx, control) = mpsc::channel(CONTROL_QUEUE);
        let mut calls = self.lock();
        let now = Instant::now();
        calls.retain(|_, e| e.parked_at.is_none_or(|at| now < at + window));
        let entry = calls.entry(call_id.to_owned()).or_insert_with(|| Entry {
            state: Arc::new(tokio::sync::Mutex::new(new_state())),
            generation: 0,
            control: None,
            parked_at: None,
        });
        entry.generation += 1;
        entry.parked_at = None;
        if let Some(old) = entry.control.replace(control_tx) {
            // Tells an older session of this call to leave. Its queue may be full; then the
            // channel closing (this sender dropped) tells it the same.
            let _ = old.try_send(Control::Leave);
        }
        Attached {
            state: Arc::clone(&entry.state),
            generation: entry.generation,
            control,
        }
    }

    /// Whether `generation` is still the newest connection of `call_id`.
    pub(crate) fn is_current(&self, call_id: &str, generation: u64) -> bool {
        self.lock()
            .get(call_id)
            .is_some_and(|e| e.generation == generation)
    }

    /// A connection ended: keep the call's state for `window`, then forget it.
    pub(crate) fn detach(self: &Arc<Self>, call_id: &str, generation: u64, window: Duration) {
        {
            let mut calls = self.lock();
            let Some(e) = calls.get_mut(call_id) else {
                return;
            };
            if e.generation != generation {
                return;
            }
            if window.is_zero() {
                calls.remove(call_id);
                return;
            }
            e.parked_at = Some(Instant::now());
            e.control = None;
        }
        let registry = Arc::clone(self);
        let call_id = call_id.to_owned();
        tokio::spawn(async move {
            tokio::time::sleep(window).await;
            let mut calls = registry.lock();
            if calls
                .get(&call_id)
                .is_some_and(|e| e.generation == generation && e.parked_at.is_some())
            {
                calls.remove(&call_id);
            }
        });
    }

    /// Whether a connection for `call_id` would fit (known calls always do).
    fn has_room_for(&self, call_id: &str) -> bool {
        let calls = self.lock();
        calls.len() < MAX_CALLS || calls.contains_key(call_id)
    }

    fn control(&self, call_id: &str) -> Option<mpsc::Sender<Control>> {
        self.lock().get(call_id).and_then(|e| e.control.clone())
    }

    fn list(&self) -> Vec<serde_json::Value> {
        let mut calls: Vec<_> = self
            .lock()
            .iter()
            .map(|(id, e)| serde_json::json!({"call_id": id, "connected": e.control.is_some()}))
            .collect();
        calls.sort_by(|a, b| a["call_id"].as_str().cmp(&b["call_id"].as_str()));
        calls
    }
}

/// The door's routes on the main listener.
pub(crate) fn routes() -> Router<Arc<App>> {
    // One registry per router, so several servers in one process keep their calls apart.
    let registry = Arc::new(Registry::default());
    Router::new()
        .route("/llm-websocket/{call_id}", get(upgrade))
        .route("/retell/calls", get(list_calls))
        .route("/retell/calls/{call_id}/interrupt", post(interrupt))
        .route("/retell/calls/{call_id}/metadata", post(metadata))
        .layer(Extension(registry))
}

fn json_error(status: StatusCode, message: impl Into<String>) -> Response {
    let body = serde_json::json!({"error": message.into()}).to_string();
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn upgrade(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<std::net::SocketAddr>,
    Extension(registry): Extension<Arc<Registry>>,
    Path(call_id): Path<String>,
    ws: WebSocketUpgrade,
) -> Response {
    if !app.config.retell.enabled {
        return json_error(StatusCode::NOT_FOUND, "the Retell door is disabled");
    }
    let permit = match app
        .admission
        .try_admit(crate::metrics::Door::Retell, peer.ip())
    {
        Ok(p) => p,
        Err(refused) => return refused.into_response(),
    };
    if call_id.is_empty() || call_id.len() > 256 {
        return json_error(StatusCode::BAD_REQUEST, "call_id must be 1 to 256 bytes");
    }
    if !registry.has_room_for(&call_id) {
        return json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many Retell calls on this server",
        );
    }
    let max = app.config.retell.max_frame_bytes;
    ws.max_message_size(max)
        .max_frame_size(max)
        .on_upgrade(move |socket| async move {
            let _permit = permit;
            session::serve(socket, app, registry, call_id).await;
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
    Extension(registry): Extension<Arc<Registry>>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = control_allowed(&app, peer, &headers) {
        return *r;
    }
    let body = serde_json::json!({"calls": registry.list()}).to_string();
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Hands a control request to the call's session and waits (bounded) for its answer.
async fn ask<T>(
    registry: &Registry,
    call_id: &str,
    make: impl FnOnce(oneshot::Sender<Result<T, String>>) -> Control,
) -> Result<T, Response> {
    let Some(tx) = registry.control(call_id) else {
        return Err(json_error(
            StatusCode::NOT_FOUND,
            format!("no connected Retell call {call_id:?}"),
        ));
    };
    let (reply, answer) = oneshot::channel();
    if tx.try_send(make(reply)).is_err() {
        return Err(json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the call is busy or gone; try again",
        ));
    }
    match tokio::time::timeout(Duration::from_secs(5), answer).await {
        Ok(Ok(Ok(v))) => Ok(v),
        Ok(Ok(Err(message))) => Err(json_error(StatusCode::CONFLICT, message)),
        _ => Err(json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the call ended before it could act",
        )),
    }
}

async fn interrupt(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<std::net::SocketAddr>,
    Extension(registry): Extension<Arc<Registry>>,
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
    match ask(&registry, &call_id, |reply| Control::Interrupt {
        body,
        reply,
    })
    .await
    {
        Ok(id) => (
            StatusCode::ACCEPTED,
            [(header::CONTENT_TYPE, "application/json")],
            serde_json::json!({"interrupt_id": id}).to_string(),
        )
            .into_response(),
        Err(r) => r,
    }
}

async fn metadata(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<std::net::SocketAddr>,
    Extension(registry): Extension<Arc<Registry>>,
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
    match ask(&registry, &call_id, |reply| Control::Metadata {
        metadata,
        reply,
    })
    .await
    {
        Ok(()) => StatusCode::ACCEPTED.into_response(),
        Err(r) => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_socket_of_a_call_tells_the_first_to_leave() {
        let registry = Registry::default();
        let window = Duration::from_secs(60);
        let cfg = RetellConfig::default();
        let mut first = registry.attach("c", window, || CallState::new(&cfg));
        assert!(registry.is_current("c", first.generation));
        let second = registry.attach("c", window, || CallState::new(&cfg));
        assert!(
            Arc::ptr_eq(&first.state, &second.state),
            "the call's state is shared"
        );
        assert!(!registry.is_current("c", first.generation));
        assert!(registry.is_current("c", second.generation));
        assert!(matches!(first.control.try_recv(), Ok(Control::Leave)));
        // The registry no longer holds the first socket's sender: its channel is closed.
        assert!(matches!(
            first.control.try_recv(),
            Err(mpsc::error::TryRecvError::Disconnected)
        ));
        assert!(registry.control("c").is_some());
        assert!(!registry.is_current("other", 1));
    }
}
