//! The I/O side of `[xiaozhi] auth`: the door's activation state per server, its file, and the
//! HTTP handlers of the activation flow. The decisions live in [`super::activation`].
//!
//! | route | who | what |
//! |---|---|---|
//! | `POST /xiaozhi/ota/activate` | the device | its poll: 200 activated, 202 waiting, 403 wrong challenge, 404 nothing pending |
//! | `POST /admin/xiaozhi/activate` | the operator (`/admin` guard) | `{"code":"123456"}`: activates the device that shows it |
//! | `GET /admin/xiaozhi/activations` | the operator (`/admin` guard) | pending activations (no codes) and activated devices |
//!
//! OTA and `/activate` are open to anyone who can reach the port, so each is rate-limited per
//! client address (`[xiaozhi] ota_rate_per_sec`, `ota_rate_burst`; [`super::rate`]): beyond
//! it `429` with `Retry-After`. The client address is the socket peer, or behind one of
//! `trusted_proxies` the client its forwarding header names ([`crate::access::Origin`]).

use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use voxgate_xiaozhi::ota::{ActivateRequest, DeviceAllowlist, OtaHeaders};

use super::activation::{ActivatedDevice, Activations, ConfirmError, Identity, OtaDecision, Poll};
use super::rate::{Limited, RateLimiter, retry_after_secs};
use super::{XiaozhiConfig, header_pairs, json_response};
use crate::access::Origin;
use crate::bridge::Admin;
use crate::server::App;

/// Largest `/activate` or `/admin/xiaozhi/activate` body read, in bytes.
const MAX_BODY_BYTES: usize = 4 * 1024;

/// Largest activated-devices file read, in bytes (4096 devices fit in well under 1 MiB).
const MAX_FILE_BYTES: u64 = 4 << 20;

/// The door's activation state for one server.
#[derive(Debug)]
pub(crate) struct DoorState {
    activations: Mutex<Activations>,
    /// Where activated devices are persisted, when configured and readable at start.
    store: Option<PathBuf>,
    /// `POST` OTA requests per client address.
    ota_rate: Mutex<RateLimiter>,
    /// `/activate` polls per client address.
    activate_rate: Mutex<RateLimiter>,
}

/// The endpoints rate-limited per address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Endpoint {
    /// `POST` OTA.
    Ota,
    /// The activation poll.
    Activate,
}

impl DoorState {
    /// State for `config`, with the devices in its `activated_devices_file` restored. A file
    /// that exists but cannot be read or parsed is left alone: activations then stay in
    /// memory, so a typo never wipes the list.
    pub(crate) fn load(config: &XiaozhiConfig) -> Self {
        let mut activations = Activations::new(
            DeviceAllowlist::new(&config.allowed_devices),
            Duration::from_secs(config.activation_timeout_secs),
            config.max_pending_activations,
            config.max_pending_activations_per_address,
        );
        let path = config.activated_devices_file.trim();
        let store = if path.is_empty() {
            None
        } else {
            let path = PathBuf::from(path);
            match read_devices(&path) {
                Ok(devices) => {
                    let total = devices.len();
                    let taken = activations.restore(devices);
                    tracing::info!(
                        file = %path.display(), restored = taken, skipped = total - taken,
                        "xiaozhi activated devices restored"
                    );
                    Some(path)
                }
                Err(e) => {
                    tracing::error!(
                        file = %path.display(), error = %e,
                        "xiaozhi activated devices file unusable: activations stay in memory \
                         and the file is not touched"
                    );
                    None
                }
            }
        };
        let rate = || RateLimiter::new(config.ota_rate_per_sec, config.ota_rate_burst);
        Self {
            activations: Mutex::new(activations),
            store,
            ota_rate: Mutex::new(rate()),
            activate_rate: Mutex::new(rate()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Activations> {
        // The state stays consistent across a panic elsewhere: every method leaves it whole.
        self.activations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// The activation state of the server `app` belongs to.
pub(super) fn state(app: &Arc<App>) -> Arc<DoorState> {
    Arc::clone(&app.shared.xiaozhi)
}

/// The client address of a request from `peer`: the peer, or behind one of `trusted_proxies`
/// the client its forwarding header names (the proxy itself when that cannot be read).
pub(super) fn client_address(app: &App, peer: SocketAddr, headers: &HeaderMap) -> IpAddr {
    let origin = Origin::resolve(&app.config.trusted_proxies, peer.ip(), headers);
    origin.client.unwrap_or(origin.peer)
}

/// The answer to a request of `address` that is over `endpoint`'s rate, if it is: `429`
/// (`503` when too many addresses are tracked to track it), with `Retry-After`.
pub(super) fn over_rate(app: &Arc<App>, endpoint: Endpoint, address: IpAddr) -> Option<Response> {
    let state = state(app);
    let limiter = match endpoint {
        Endpoint::Ota => &state.ota_rate,
        Endpoint::Activate => &state.activate_rate,
    };
    let checked = limiter
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .check(Instant::now(), address);
    let (status, wait, message) = match checked.err()? {
        Limited::Rate(wait) => (
            StatusCode::TOO_MANY_REQUESTS,
            wait,
            "too many requests from this address",
        ),
        Limited::Full => (
            StatusCode::SERVICE_UNAVAILABLE,
            Duration::from_secs(1),
            "too many addresses at once",
        ),
    };
    tracing::debug!(%address, ?endpoint, %status, "xiaozhi request over its rate");
    let mut r = json_response(
        status,
        json!({"success": false, "message": message}).to_string(),
    );
    r.headers_mut().insert(
        header::RETRY_AFTER,
        header::HeaderValue::from(retry_after_secs(wait)),
    );
    Some(r)
}

fn read_devices(path: &Path) -> Result<Vec<ActivatedDevice>, String> {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e.to_string()),
        Ok(m) if m.len() > MAX_FILE_BYTES => {
            return Err(format!("larger than {MAX_FILE_BYTES} bytes"));
        }
        Ok(_) => {}
    }
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    serde_json::from_slice(&bytes).map_err(|e| format!("not a JSON list of devices: {e}"))
}

/// Writes `devices` to `path` atomically: a temporary file beside it, synced, then renamed
/// over it, so a crash leaves the old list or the new one, never half of one.
fn write_devices(path: &Path, devices: &[ActivatedDevice]) -> std::io::Result<()> {
    let mut json = serde_json::to_vec_pretty(devices).map_err(std::io::Error::other)?;
    json.push(b'\n');
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "activated".to_owned());
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        // Client ids are what a token is bound to: not for every local user to read.
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    let mut file = options.open(&tmp)?;
    file.write_all(&json)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, path)
}

/// What OTA hands a device when auth is on.
pub(super) enum OtaAuth {
    /// Allowed or activated: issue a token.
    Token,
    /// Not yet activated: this activation block, and no token.
    Activation(voxgate_xiaozhi::ota::Activation),
    /// Refused before deciding (bad ids, no randomness).
    Refused(Response),
}

/// Decides the OTA answer for (`device_id`, `client_id`) asking from `source` with auth on.
pub(super) fn ota(
    app: &Arc<App>,
    h: &OtaHeaders,
    device_id: &str,
    client_id: &str,
    source: IpAddr,
) -> OtaAuth {
    let bad = |message: &str| {
        OtaAuth::Refused(json_response(
            StatusCode::BAD_REQUEST,
            json!({"success": false, "message": message}).to_string(),
        ))
    };
    if !super::activation::valid_id(device_id) {
        return bad("Device-Id is not usable");
    }
    if client_id.is_empty() {
        return bad("Client-Id header missing");
    }
    if !super::activation::valid_id(client_id) {
        return bad("Client-Id is not usable");
    }
    let who = Identity {
        source,
        device_id,
        client_id,
        signs_challenge: h.activation_version.as_deref() == Some("2"),
        serial_number: h.serial_number.as_deref(),
    };
    let state = state(app);
    let decision = state.lock().ota(Instant::now(), who, &mut |n| {
        crate::secret::random_bytes(n)
            .inspect_err(|e| tracing::error!(error = %e, "no OS randomness for an activation"))
            .ok()
    });
    match decision {
        OtaDecision::Allowed | OtaDecision::Activated => OtaAuth::Token,
        OtaDecision::Pending(c) => {
            tracing::info!(device = %device_id, client = %client_id, "xiaozhi activation pending");
            OtaAuth::Activation(voxgate_xiaozhi::ota::Activation {
                message: format!("voxgate activation\n{}", c.code),
                code: c.code,
                challenge: Some(c.challenge),
                timeout_ms: Some(u64::try_from(c.remaining.as_millis()).unwrap_or(u64::MAX)),
            })
        }
        OtaDecision::Unavailable => OtaAuth::Refused(json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"success": false, "message": "no activation code available"}).to_string(),
        )),
    }
}

/// `POST /xiaozhi/ota/activate`: the device's poll. With auth off there is nothing to wait
/// for: `200 success`, as before.
pub(super) async fn activate(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let address = client_address(&app, peer, &headers);
    if let Some(refused) = over_rate(&app, Endpoint::Activate, address) {
        return refused;
    }
    if !app.config.xiaozhi.auth {
        return (StatusCode::OK, "success").into_response();
    }
    let device = |status: StatusCode, message: &str| {
        json_response(
            status,
            json!({"success": false, "message": message}).to_string(),
        )
    };
    let Ok(bytes) = axum::body::to_bytes(body, MAX_BODY_BYTES).await else {
        return device(StatusCode::PAYLOAD_TOO_LARGE, "body too large");
    };
    let h = OtaHeaders::from_pairs(header_pairs(&headers));
    let (Some(device_id), Some(client_id)) = (h.device_id.as_deref(), h.client_id.as_deref())
    else {
        return device(
            StatusCode::BAD_REQUEST,
            "Device-Id and Client-Id headers needed",
        );
    };
    let Ok(request) = ActivateRequest::from_slice(&bytes) else {
        return device(StatusCode::BAD_REQUEST, "body is not an activation request");
    };
    // The HMAC over the challenge (activation version 2) is not verified: that needs the key
    // burnt into the device's eFuses, which only the vendor knows. The echoed challenge still
    // ties the poll to the OTA answer that carried it.
    let poll = state(&app).lock().poll(
        Instant::now(),
        device_id,
        client_id,
        request.challenge.as_deref(),
    );
    match poll {
        Poll::Done => (StatusCode::OK, "success").into_response(),
        Poll::Waiting => device(
            StatusCode::ACCEPTED,
            "waiting for the operator to confirm the activation code",
        ),
        Poll::ChallengeMismatch => {
            app.metrics.error(crate::metrics::Door::Xiaozhi);
            device(StatusCode::FORBIDDEN, "challenge does not match")
        }
        Poll::Unknown => device(
            StatusCode::NOT_FOUND,
            "no pending activation for this device: ask OTA again",
        ),
    }
}

fn admin_error(status: StatusCode, code: &str, detail: &str) -> Response {
    (
        status,
        axum::Json(json!({"ok": false, "error": code, "detail": detail})),
    )
        .into_response()
}

/// `POST /admin/xiaozhi/activate` with `{"code":"123456"}`: activates the device showing it.
pub(super) async fn admin_activate(Admin(app): Admin, body: Body) -> Response {
    let Ok(bytes) = axum::body::to_bytes(body, MAX_BODY_BYTES).await else {
        return admin_error(StatusCode::PAYLOAD_TOO_LARGE, "too_large", "body too large");
    };
    let code = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|v| v.get("code").and_then(Value::as_str).map(str::to_owned));
    let Some(code) = code else {
        return admin_error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "expected a JSON body {\"code\":\"123456\"}",
        );
    };
    let state = state(&app);
    let mut activations = state.lock();
    let unix = super::unix_now().0;
    let device = match activations.confirm(Instant::now(), &code, unix) {
        Ok(d) => d,
        Err(ConfirmError::NotFound) => {
            return admin_error(
                StatusCode::NOT_FOUND,
                "not_found",
                "no pending activation has this code (wrong, expired or replaced by a newer one)",
            );
        }
        Err(ConfirmError::Full) => {
            return admin_error(
                StatusCode::CONFLICT,
                "too_many_devices",
                "the activated-device list is full",
            );
        }
    };
    // Written under the lock, so files are written in the order activations happen; an
    // activation is a rare, operator-driven event.
    let persisted = state.store.as_deref().map(|path| {
        write_devices(path, &activations.activated())
            .inspect_err(|e| {
                tracing::error!(
                    file = %path.display(), error = %e,
                    "xiaozhi activated devices not saved"
                );
            })
            .is_ok()
    });
    drop(activations);
    tracing::info!(device = %device.device_id, client = %device.client_id, "xiaozhi device activated");
    axum::Json(json!({
        "ok": true,
        "device_id": device.device_id,
        "client_id": device.client_id,
        "persisted": persisted.unwrap_or(false),
    }))
    .into_response()
}

/// `GET /admin/xiaozhi/activations`: pending activations (never their codes) and activated
/// devices.
pub(super) async fn admin_activations(Admin(app): Admin) -> Response {
    let state = state(&app);
    let mut activations = state.lock();
    let pending = activations.pending(Instant::now());
    let activated = activations.activated();
    drop(activations);
    axum::Json(json!({
        "auth": app.config.xiaozhi.auth,
        "pending": pending,
        "activated": activated,
    }))
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_round_trips_and_a_bad_one_is_reported() {
        let dir = std::env::temp_dir().join(format!(
            "voxgate-xiaozhi-auth-{}",
            super::super::new_session_id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("activated.json");
        assert_eq!(read_devices(&path).unwrap(), []);
        let devices = vec![ActivatedDevice {
            device_id: "aa:bb:cc:dd:ee:ff".into(),
            client_id: "c1".into(),
            activated_at: 7,
        }];
        write_devices(&path, &devices).unwrap();
        assert_eq!(read_devices(&path).unwrap(), devices);
        assert!(!dir.join(".activated.json.tmp").exists());
        std::fs::write(&path, "{not json").unwrap();
        assert!(read_devices(&path).is_err());
        let config = XiaozhiConfig {
            activated_devices_file: path.display().to_string(),
            ..XiaozhiConfig::default()
        };
        // An unreadable file is never overwritten.
        assert!(DoorState::load(&config).store.is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
