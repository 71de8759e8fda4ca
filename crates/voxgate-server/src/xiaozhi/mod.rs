//! The Xiaozhi door: ESP32 devices over WebSocket (JSON control frames, binary Opus audio) and
//! the OTA endpoint that tells them where to connect.
//!
//! | route | what |
//! |---|---|
//! | `GET /xiaozhi/v1/` (WebSocket) | a device session; the door's own listener accepts any path |
//! | `POST /xiaozhi/ota/` | OTA: `websocket` (url, token, version), `server_time`, `firmware`; with `auth` on, `activation` instead of a token for devices not yet allowed |
//! | `GET /xiaozhi/ota/` | a plain-text health line with the WebSocket URL handed out |
//! | `POST /xiaozhi/ota/activate` | the device's activation poll (`200` at once with `auth` off) |
//! | `POST /xiaozhi/vision/explain` | the MCP `vision.url`: answers that no vision model is configured |
//! | `POST /admin/xiaozhi/activate` | the operator confirms a code shown by a device (`/admin` guard) |
//! | `GET /admin/xiaozhi/activations` | pending activations and activated devices (`/admin` guard) |
//! | `GET /admin/xiaozhi/devices` | devices connected to this instance (`/admin` guard) |
//! | `POST /admin/xiaozhi/devices/{device_id}/push` | an alert, a reboot or a spoken sentence to a device, on any instance of a cluster (`/admin` guard, [`devices`]) |
//!
//! Access control (`[xiaozhi] auth`, off by default for a trusted LAN): with it on, OTA issues
//! a token only to a device on `allowed_devices` or activated by an operator ([`activation`],
//! [`auth`]), and the upgrade admits only a valid token bound to the `Device-Id` and
//! `Client-Id` presented. With it off, OTA hands every device its URL and a token nobody checks.
//! `POST` OTA and the activation poll are rate-limited per client address (`429` with
//! `Retry-After` beyond `ota_rate_per_sec` after a burst of `ota_rate_burst`; [`rate`]), and a
//! pending activation code counts against the address that asked for it, so one address can
//! only evict its own ([`activation`]).
//!
//! The session itself lives in [`session`], a translator run by the shared door driver, with its
//! decisions in [`speech`] (`tts` state, half duplex), [`reply`] (encoding and pacing of reply
//! audio), [`uplink`] and [`text`]; user documentation in `docs/doors/xiaozhi.md`.

mod activation;
mod auth;
pub(crate) use auth::DoorState;
mod config;
pub(crate) mod devices;
mod emotion;
mod rate;
mod reply;
mod session;
mod speech;
mod text;
mod uplink;

use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, State, WebSocketUpgrade};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use voxgate_xiaozhi::connect::ConnectParams;
use voxgate_xiaozhi::frame::ProtocolVersion;
use voxgate_xiaozhi::ota::{OtaHeaders, OtaRequest, OtaResponse, ServerTime, WebSocketConfig};
use voxgate_xiaozhi::token::{self, TokenSecret};

pub use config::{DownlinkApplication, OpusBackendChoice, XiaozhiConfig};

use crate::server::{App, DoorListener};

/// The WebSocket path devices are configured with.
const WS_PATH: &str = "/xiaozhi/v1/";

/// The door's routes on the main listener.
pub(crate) fn routes() -> Router<Arc<App>> {
    Router::new()
        .route(WS_PATH, get(upgrade))
        .route("/xiaozhi/v1", get(upgrade))
        .route("/xiaozhi/ota/", get(ota_get).post(ota_post))
        .route("/xiaozhi/ota", get(ota_get).post(ota_post))
        .route("/xiaozhi/ota/activate", post(auth::activate))
        .route("/xiaozhi/vision/explain", post(vision))
        .route("/admin/xiaozhi/activate", post(auth::admin_activate))
        .route("/admin/xiaozhi/activations", get(auth::admin_activations))
        .route("/admin/xiaozhi/devices", get(devices::admin_devices))
        .route(
            "/admin/xiaozhi/devices/{device_id}/push",
            post(devices::admin_push),
        )
}

/// The door's own listeners (WebSocket on any path, OTA), when configured.
pub(crate) fn listeners(config: &crate::Config) -> Vec<DoorListener> {
    let mut out = Vec::new();
    if let Some(addr) = config.xiaozhi.listen {
        out.push(DoorListener {
            name: "xiaozhi",
            addr,
            // Like the reference server's port 8000: every path is the device WebSocket.
            routes: Router::new().fallback(upgrade),
        });
    }
    if let Some(addr) = config.xiaozhi.ota_listen {
        out.push(DoorListener {
            name: "xiaozhi-ota",
            addr,
            // Like port 8003: OTA on any path. The WebSocket path is served here too, so a
            // URL derived from this request's Host header always works.
            routes: Router::new()
                .route(WS_PATH, get(upgrade))
                .route("/xiaozhi/vision/explain", post(vision))
                .route("/xiaozhi/ota/activate", post(auth::activate))
                .fallback(ota_any),
        });
    }
    out
}

fn unix_now() -> (u64, u64) {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    (
        d.as_secs(),
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
    )
}

/// A fresh session id in UUID v4 text form.
pub(crate) fn new_session_id() -> String {
    // Ids are not secrets; should the OS source ever fail, a unique id still beats none.
    let mut b = crate::secret::random_bytes(16).unwrap_or_else(|e| {
        tracing::error!(error = %e, "no OS randomness for a session id");
        let n = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        n.to_le_bytes().to_vec()
    });
    if let (Some(six), Some(eight)) = (b.get(6).copied(), b.get(8).copied()) {
        b[6] = (six & 0x0f) | 0x40;
        b[8] = (eight & 0x3f) | 0x80;
    }
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The token key: the configured secret, or one random key for the life of the process.
fn token_secret(config: &XiaozhiConfig) -> Option<TokenSecret> {
    static RANDOM: OnceLock<Option<TokenSecret>> = OnceLock::new();
    if config.token_secret.is_empty() {
        RANDOM
            .get_or_init(|| {
                // No key without OS randomness: tokens then cannot be issued or verified.
                let key = crate::secret::random_bytes(32)
                    .inspect_err(
                        |e| tracing::error!(error = %e, "no OS randomness for the token key"),
                    )
                    .ok()?;
                TokenSecret::new(key).ok()
            })
            .clone()
    } else {
        TokenSecret::new(&config.token_secret).ok()
    }
}

/// The `Host` the request was sent to, if it is usable in a URL.
fn host(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|h| !h.is_empty() && !h.contains(['/', ' ', '@']))
}

/// The WebSocket URL handed out by OTA: configured, or the request's host. When the door has its
/// own WebSocket listener on a fixed port, the URL points at that port.
fn websocket_url(config: &XiaozhiConfig, headers: &HeaderMap) -> String {
    if !config.websocket_url.is_empty() {
        return config.websocket_url.clone();
    }
    let host = host(headers).unwrap_or("127.0.0.1:8080");
    match config.listen.map(|a| a.port()).filter(|p| *p != 0) {
        Some(port) => {
            let name = match host.rsplit_once(':') {
                Some((name, p)) if p.chars().all(|c| c.is_ascii_digit()) => name,
                _ => host,
            };
            format!("ws://{name}:{port}{WS_PATH}")
        }
        None => format!("ws://{host}{WS_PATH}"),
    }
}

/// The `vision.url` sent to the device in MCP `initialize`.
fn vision_url(config: &XiaozhiConfig, headers: &HeaderMap) -> String {
    if !config.vision_url.is_empty() {
        return config.vision_url.clone();
    }
    let host = host(headers).unwrap_or("127.0.0.1:8080");
    format!("http://{host}/xiaozhi/vision/explain")
}

fn json_response(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn header_pairs(headers: &HeaderMap) -> impl Iterator<Item = (&str, &[u8])> {
    headers.iter().map(|(k, v)| (k.as_str(), v.as_bytes()))
}

/// Initial WebSocket read buffer per device connection.
const READ_BUFFER_BYTES: usize = 4 * 1024;

async fn upgrade(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<std::net::SocketAddr>,
    headers: HeaderMap,
    uri: Uri,
    ws: WebSocketUpgrade,
) -> Response {
    let permit = match app.admit(crate::metrics::Door::Xiaozhi, peer.ip()).await {
        Ok(p) => p,
        Err(refused) => return refused.into_response(),
    };
    let config = &app.config.xiaozhi;
    let params = ConnectParams::from_headers(header_pairs(&headers))
        .or(ConnectParams::from_query(uri.query().unwrap_or("")));
    let framing = match &params.protocol_version {
        None => None,
        Some(_) => match params.framing() {
            Ok(v) => Some(v),
            Err(e) => {
                app.metrics.error(crate::metrics::Door::Xiaozhi);
                return (StatusCode::BAD_REQUEST, e.to_string()).into_response();
            }
        },
    };
    if config.auth {
        let Some(secret) = token_secret(config) else {
            return (StatusCode::INTERNAL_SERVER_ERROR, "no usable token secret").into_response();
        };
        // No device is let in on its `Device-Id` alone (a header the client chooses):
        // `allowed_devices` and activation only decide who OTA issues a token to.
        if let Err(e) = params.authenticate(&secret, unix_now().0) {
            app.metrics.error(crate::metrics::Door::Xiaozhi);
            tracing::info!(device = params.device_id.as_deref(), error = %e, "xiaozhi upgrade refused");
            return (StatusCode::UNAUTHORIZED, e.to_string()).into_response();
        }
    }
    let vision_token = params.token.clone().unwrap_or_else(|| {
        issue_token(
            config,
            params.client_id.as_deref().unwrap_or(""),
            params.device_id.as_deref().unwrap_or(""),
        )
    });
    let info = session::ConnInfo {
        framing,
        device_id: params.device_id,
        vision_url: vision_url(config, &headers),
        vision_token,
    };
    let hard_limit = app.config.max_frame_bytes.saturating_mul(4);
    // Device frames are a few hundred bytes; tungstenite's 128 KiB default read buffer would be
    // most of a session's memory. Larger frames still arrive: the buffer grows to fit them.
    ws.max_message_size(hard_limit)
        .max_frame_size(hard_limit)
        .read_buffer_size(READ_BUFFER_BYTES)
        .on_upgrade(move |socket| async move {
            let _permit = permit;
            session::serve(socket, app, info, peer).await;
        })
}

fn issue_token(config: &XiaozhiConfig, client_id: &str, device_id: &str) -> String {
    token_secret(config)
        .and_then(|s| token::issue(&s, client_id, device_id, unix_now().0).ok())
        .unwrap_or_default()
}

async fn ota_get(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    let url = websocket_url(&app.config.xiaozhi, &headers);
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("OTA interface is running; the websocket address sent to devices is: {url}"),
    )
        .into_response()
}

async fn ota_post(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<std::net::SocketAddr>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let address = auth::client_address(&app, peer, &headers);
    if let Some(refused) = auth::over_rate(&app, auth::Endpoint::Ota, address) {
        return refused;
    }
    let config = &app.config.xiaozhi;
    let h = OtaHeaders::from_pairs(header_pairs(&headers));
    let request = match OtaRequest::from_slice(&body) {
        Ok(r) => Some(r),
        Err(e) => {
            // Hand-built firmware JSON: answer anyway, the device still needs its URL.
            tracing::info!(error = %e, "xiaozhi OTA body not understood");
            None
        }
    };
    let device_id = h
        .device_id
        .clone()
        .or_else(|| request.as_ref().and_then(|r| r.mac_address.clone()))
        .map(|d| d.to_ascii_lowercase());
    let Some(device_id) = device_id else {
        app.metrics.error(crate::metrics::Door::Xiaozhi);
        return json_response(
            StatusCode::BAD_REQUEST,
            serde_json::json!({"success": false, "message": "Device-Id header missing"})
                .to_string(),
        );
    };
    let client_id = h
        .client_id
        .clone()
        .or_else(|| request.as_ref().and_then(|r| r.uuid.clone()))
        .unwrap_or_default();
    let version = ProtocolVersion::from_number(u64::from(config.protocol_version))
        .unwrap_or(ProtocolVersion::V1);
    // Auth off: every device gets a token (nobody checks it). Auth on: only an allowed or
    // activated device; any other gets an activation code and an empty token. The `websocket`
    // block is still sent then: the device keeps keys that are absent, so an empty `token`
    // is what clears one it stored earlier, and some clients fail without the key.
    let (token, activation) = if config.auth {
        match auth::ota(&app, &h, &device_id, &client_id, address) {
            auth::OtaAuth::Token => {
                let token = issue_token(config, &client_id, &device_id);
                if token.is_empty() {
                    return json_response(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        serde_json::json!({"success": false, "message": "no token available"})
                            .to_string(),
                    );
                }
                (token, None)
            }
            auth::OtaAuth::Activation(a) => (String::new(), Some(a)),
            auth::OtaAuth::Refused(r) => {
                app.metrics.error(crate::metrics::Door::Xiaozhi);
                return r;
            }
        }
    } else {
        (issue_token(config, &client_id, &device_id), None)
    };
    let (_, millis) = unix_now();
    let response = OtaResponse {
        websocket: Some(
            WebSocketConfig::new(websocket_url(config, &headers), version).with_token(token),
        ),
        server_time: Some(ServerTime {
            timestamp: millis,
            timezone_offset: config.timezone_offset_minutes,
        }),
        firmware: request.as_ref().and_then(OtaRequest::firmware_echo),
        activation,
    };
    tracing::info!(device = %device_id, client = %client_id, "xiaozhi OTA");
    json_response(StatusCode::OK, response.to_json())
}

/// The OTA listener's catch-all: GET is the health line, POST the OTA answer, and POST to a
/// path ending in `/activate` the activation poll (the firmware appends `activate` to
/// whatever OTA URL it was given).
async fn ota_any(
    State(app): State<Arc<App>>,
    peer: ConnectInfo<std::net::SocketAddr>,
    method: axum::http::Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if method != axum::http::Method::POST {
        ota_get(State(app), headers).await
    } else if uri.path().ends_with("/activate") {
        auth::activate(State(app), peer, headers, axum::body::Body::from(body)).await
    } else {
        ota_post(State(app), peer, headers, body).await
    }
}

async fn vision() -> Response {
    json_response(
        StatusCode::OK,
        serde_json::json!({
            "success": false,
            "message": "no vision model is configured on this server",
        })
        .to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_from_host_and_config() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, "192.168.1.5:8080".parse().unwrap());
        let mut c = XiaozhiConfig::default();
        assert_eq!(websocket_url(&c, &h), "ws://192.168.1.5:8080/xiaozhi/v1/");
        c.listen = Some("0.0.0.0:8000".parse().unwrap());
        assert_eq!(websocket_url(&c, &h), "ws://192.168.1.5:8000/xiaozhi/v1/");
        c.websocket_url = "wss://example.org/ws".into();
        assert_eq!(websocket_url(&c, &h), "wss://example.org/ws");
        assert_eq!(
            vision_url(&c, &h),
            "http://192.168.1.5:8080/xiaozhi/vision/explain"
        );
    }

    #[test]
    fn session_ids_are_uuid_shaped_and_distinct() {
        let a = new_session_id();
        let b = new_session_id();
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(a.as_bytes()[14], b'4');
    }
}
