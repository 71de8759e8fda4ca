//! Devices connected to this instance, by `Device-Id`, and pushes to them from the operator:
//! an alert on the screen, a reboot, or a sentence spoken by the device's session.
//!
//! | route | what |
//! |---|---|
//! | `GET /admin/xiaozhi/devices` | devices connected to this instance (`/admin` guard) |
//! | `POST /admin/xiaozhi/devices/{device_id}/push` | `{"type":"alert","status","message","emotion"}`, `{"type":"system","command":"reboot"}` or `{"type":"speak","text"}` to that device (`/admin` guard) |
//!
//! With `[cluster]`, a push for a device connected to another instance goes there through the
//! cluster's routing (the directory names the instance) and its answer comes back; a push
//! that arrived routed is never routed again. Answers: 200 `{"ok":true,"device","instance",
//! "session_id"}`; 400 a bad push; 404 no such device connected; 409 the device has not said
//! hello yet; 502/503/504 the cluster could not reach the holder (`docs/scale-out.md`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::Path;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use voxgate_xiaozhi::control::Alert;

use crate::bridge::Admin;
use crate::cluster::{DirectoryEntry, Kind, Reply};
use crate::server::App;

/// Largest push body read.
const MAX_BODY: usize = 16 * 1024;
/// Longest `speak` text, in characters.
const MAX_SPEAK_CHARS: usize = 2000;
/// Longest alert field, in characters.
const MAX_ALERT_CHARS: usize = 500;
/// Pushes waiting for one device's session at once.
const QUEUE: usize = 8;
/// How long a session may take to take a push in.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(5);

/// What is pushed to a device.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PushKind {
    /// An `alert` message (shown on the screen).
    Alert(Alert),
    /// `system` `reboot`.
    Reboot,
    /// A sentence the session speaks (through TTS, into the conversation's history).
    Speak(String),
}

/// Why a session did not take a push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refused {
    /// No hello yet: the device cannot be spoken to.
    NotReady,
    /// The engine refused it (the reason).
    Engine(String),
}

/// One push on its way to a session; the session answers with its session id.
#[derive(Debug)]
pub(crate) struct Push {
    /// What to do.
    pub(crate) kind: PushKind,
    /// Where the session answers.
    pub(crate) done: oneshot::Sender<Result<String, Refused>>,
}

/// The devices connected here.
#[derive(Debug, Default)]
pub(crate) struct Devices {
    by_id: Mutex<HashMap<String, (u64, mpsc::Sender<Push>)>>,
    next: AtomicU64,
}

impl Devices {
    /// Registers a connection of `device` (the newest connection of a device gets its pushes)
    /// and, in a cluster, claims it in the directory.
    pub(crate) async fn register(
        self: &Arc<Self>,
        app: &App,
        device: &str,
    ) -> (Registration, mpsc::Receiver<Push>) {
        let device = device.to_ascii_lowercase();
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(QUEUE);
        self.lock().insert(device.clone(), (seq, tx));
        let entry = match &app.cluster {
            Some(c) => Some(c.claim(Kind::Xiaozhi, &device).await),
            None => None,
        };
        (
            Registration {
                devices: Arc::clone(self),
                device,
                seq,
                _entry: entry,
            },
            rx,
        )
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (u64, mpsc::Sender<Push>)>> {
        self.by_id.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The connected device ids, sorted.
    pub(crate) fn list(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.lock().keys().cloned().collect();
        ids.sort();
        ids
    }

    fn sender(&self, device: &str) -> Option<mpsc::Sender<Push>> {
        self.lock().get(device).map(|(_, tx)| tx.clone())
    }
}

/// A device's registration: removed (if still the newest) when dropped with its session.
#[derive(Debug)]
pub(crate) struct Registration {
    devices: Arc<Devices>,
    device: String,
    seq: u64,
    _entry: Option<DirectoryEntry>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut by_id = self.devices.lock();
        if by_id.get(&self.device).is_some_and(|(s, _)| *s == self.seq) {
            by_id.remove(&self.device);
        }
    }
}

/// Reads a push body.
pub(crate) fn parse_push(body: &Value) -> Result<PushKind, String> {
    let field = |name: &str, max: usize| -> Result<String, String> {
        let v = body
            .get(name)
            .and_then(Value::as_str)
            .ok_or_else(|| format!("`{name}` (a string) is required"))?;
        if v.chars().count() > max {
            return Err(format!("`{name}` is longer than {max} characters"));
        }
        Ok(v.to_owned())
    };
    match body.get("type").and_then(Value::as_str) {
        Some("alert") => {
            let alert = json!({
                "status": field("status", MAX_ALERT_CHARS)?,
                "message": field("message", MAX_ALERT_CHARS)?,
                "emotion": field("emotion", MAX_ALERT_CHARS)?,
            });
            serde_json::from_value(alert)
                .map(PushKind::Alert)
                .map_err(|e| e.to_string())
        }
        Some("system") => match body.get("command").and_then(Value::as_str) {
            Some("reboot") => Ok(PushKind::Reboot),
            _ => Err("`command` must be \"reboot\"".into()),
        },
        Some("speak") => {
            let text = field("text", MAX_SPEAK_CHARS)?;
            if text.trim().is_empty() {
                return Err("`text` must not be blank".into());
            }
            Ok(PushKind::Speak(text))
        }
        _ => Err("`type` must be \"alert\", \"system\" or \"speak\"".into()),
    }
}

fn error(status: u16, code: &str, detail: &str) -> Reply {
    Reply::new(
        status,
        json!({"ok": false, "error": code, "detail": detail}),
    )
}

/// Pushes `body` to `device`: here if it is connected here, else (unless the push was
/// already `routed` here) through the cluster to the instance holding it.
pub(crate) async fn push(app: &App, device: &str, body: Value, routed: bool) -> Reply {
    let device = device.to_ascii_lowercase();
    let kind = match parse_push(&body) {
        Ok(k) => k,
        Err(e) => return error(400, "bad_request", &e),
    };
    let instance = app.cluster.as_ref().map(|c| c.instance().to_owned());
    if let Some(tx) = app.shared.xiaozhi_devices.sender(&device) {
        let (done, answer) = oneshot::channel();
        if tx.try_send(Push { kind, done }).is_err() {
            return error(503, "busy", "the device's push queue is full");
        }
        return match tokio::time::timeout(DELIVERY_TIMEOUT, answer).await {
            Ok(Ok(Ok(session_id))) => Reply::new(
                200,
                json!({"ok": true, "device": device, "instance": instance, "session_id": session_id}),
            ),
            Ok(Ok(Err(Refused::NotReady))) => error(
                409,
                "not_ready",
                "the device is connected but has not said hello yet",
            ),
            Ok(Ok(Err(Refused::Engine(e)))) => error(409, "refused", &e),
            Ok(Err(_)) => error(404, "not_found", "the device disconnected"),
            Err(_) => error(504, "timeout", "the device's session did not take the push"),
        };
    }
    let not_here = || error(404, "not_found", "no such device is connected");
    let Some(cluster) = app.cluster.as_ref().filter(|_| !routed) else {
        return not_here();
    };
    // A holder that died is not listening: its device is connected nowhere until it
    // reconnects (its entry expires with the lease).
    match crate::cluster::live_holder(cluster, Kind::Xiaozhi, &device).await {
        Ok(Some(holder)) => match cluster.call(&holder, "xiaozhi.push", &device, body).await {
            Ok(reply) => reply,
            Err(e) => error(e.status(), e.code(), &e.to_string()),
        },
        Ok(None) => not_here(),
        Err(e) => error(e.status(), e.code(), &e.to_string()),
    }
}

/// `POST /admin/xiaozhi/devices/{device_id}/push`.
pub(super) async fn admin_push(
    Admin(app): Admin,
    Path(device): Path<String>,
    body: Bytes,
) -> Response {
    if body.len() > MAX_BODY {
        return error(413, "too_large", "body too large").into_response();
    }
    let body: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return error(400, "bad_json", &e.to_string()).into_response(),
    };
    push(&app, &device, body, false).await.into_response()
}

/// `GET /admin/xiaozhi/devices`.
pub(super) async fn admin_devices(Admin(app): Admin) -> Response {
    let instance = app.cluster.as_ref().map(|c| c.instance().to_owned());
    axum::Json(json!({
        "instance": instance,
        "devices": app.shared.xiaozhi_devices.list(),
    }))
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pushes_are_read_and_bounded() {
        assert_eq!(
            parse_push(&json!({"type": "system", "command": "reboot"})),
            Ok(PushKind::Reboot)
        );
        assert_eq!(
            parse_push(&json!({"type": "speak", "text": "Dinner is ready"})),
            Ok(PushKind::Speak("Dinner is ready".into()))
        );
        let PushKind::Alert(a) = parse_push(
            &json!({"type": "alert", "status": "Warning", "message": "Battery low", "emotion": "sad"}),
        )
        .unwrap() else {
            panic!("an alert")
        };
        assert_eq!(
            (a.status.as_str(), a.message.as_str()),
            ("Warning", "Battery low")
        );
        for bad in [
            json!({"type": "alert", "status": "x", "message": "y"}),
            json!({"type": "system", "command": "format"}),
            json!({"type": "speak", "text": "  "}),
            json!({"type": "speak", "text": "a".repeat(MAX_SPEAK_CHARS + 1)}),
            json!({"type": "dance"}),
            json!([1, 2]),
        ] {
            assert!(parse_push(&bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn the_newest_connection_of_a_device_gets_its_pushes() {
        let (stop, shutdown) = tokio::sync::watch::channel(false);
        let app = App::for_test(crate::config::Config::default(), shutdown);
        let devices = Arc::new(Devices::default());
        let (first, _rx1) = devices.register(&app, "AA:BB").await;
        let (second, mut rx2) = devices.register(&app, "aa:bb").await;
        assert_eq!(devices.list(), vec!["aa:bb".to_owned()]);
        drop(first);
        assert_eq!(devices.list(), vec!["aa:bb".to_owned()]);
        let (done, _answer) = oneshot::channel();
        devices
            .sender("aa:bb")
            .unwrap()
            .try_send(Push {
                kind: PushKind::Reboot,
                done,
            })
            .unwrap();
        assert_eq!(rx2.recv().await.unwrap().kind, PushKind::Reboot);
        drop(second);
        assert!(devices.list().is_empty());
        drop(stop);
    }
}
