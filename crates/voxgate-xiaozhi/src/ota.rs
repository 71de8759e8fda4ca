//! OTA / provisioning: the device's `POST <ota_url>` and the answer that points it at the server.
//!
//! The device posts its system info as hand-built JSON; [`OtaRequest`] accepts it leniently
//! (every field optional, numbers as strings, unknown keys kept). The answer, [`OtaResponse`],
//! tells it the WebSocket URL, token and binary protocol version, the server time, and optionally
//! an activation code. It never carries an `mqtt` section: that would switch the device to the
//! MQTT + UDP transport.
//!
//! Activation: a device that is not yet bound gets an [`Activation`] (a 6-digit code it shows
//! and speaks, and a challenge) instead of a usable token, and polls `POST <ota_url>activate`
//! with an [`ActivateRequest`] until the server answers 200 (202: keep waiting). Which devices
//! are issued a token without activation is a [`DeviceAllowlist`].
//!
//! ```
//! use voxgate_xiaozhi::frame::ProtocolVersion;
//! use voxgate_xiaozhi::ota::{OtaHeaders, OtaRequest, OtaResponse, ServerTime, WebSocketConfig};
//!
//! let headers = OtaHeaders::from_pairs([("device-id", "AA:BB:CC:DD:EE:FF"), ("Client-Id", "c1")]);
//! assert_eq!(headers.device_id.as_deref(), Some("aa:bb:cc:dd:ee:ff"));
//!
//! let request = OtaRequest::from_slice(br#"{"application":{"version":"1.6.0"},
//!     "minimum_free_heap_size":"123"}"#)?;
//! assert_eq!(request.minimum_free_heap_size, Some(123));
//!
//! let response = OtaResponse {
//!     websocket: Some(WebSocketConfig::new("ws://10.0.0.2:8000/xiaozhi/v1/", ProtocolVersion::V3)),
//!     server_time: Some(ServerTime { timestamp: 1_700_000_000_000, timezone_offset: 480 }),
//!     firmware: request.firmware_echo(),
//!     activation: None,
//! };
//! assert_eq!(
//!     response.to_json(),
//!     r#"{"websocket":{"url":"ws://10.0.0.2:8000/xiaozhi/v1/","token":"","version":3},"server_time":{"timestamp":1700000000000,"timezone_offset":480},"firmware":{"version":"1.6.0","url":""}}"#
//! );
//! # Ok::<(), serde_json::Error>(())
//! ```

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::frame::ProtocolVersion;
use crate::lenient;

/// The OTA request headers, read case-insensitively from (name, value) pairs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OtaHeaders {
    /// `Device-Id`: the device's MAC, lowercased.
    pub device_id: Option<String>,
    /// `Client-Id`: a UUID the device generated once.
    pub client_id: Option<String>,
    /// `Activation-Version`: `1` (no serial number) or `2` (the device has a serial number and
    /// signs the activation challenge).
    pub activation_version: Option<String>,
    /// `Serial-Number`: sent with activation version 2.
    pub serial_number: Option<String>,
    /// `User-Agent`: `<board>/<firmware version>`.
    pub user_agent: Option<String>,
    /// `Accept-Language`: e.g. `zh-CN`.
    pub accept_language: Option<String>,
}

impl OtaHeaders {
    /// Collects the known headers from `pairs`; others are ignored, non-UTF-8 values dropped,
    /// values trimmed. The first occurrence of a repeated header wins.
    pub fn from_pairs<I, K, V>(pairs: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<[u8]>,
    {
        let mut headers = Self::default();
        for (name, value) in pairs {
            let name = name.as_ref();
            let slot = if name.eq_ignore_ascii_case("device-id") {
                &mut headers.device_id
            } else if name.eq_ignore_ascii_case("client-id") {
                &mut headers.client_id
            } else if name.eq_ignore_ascii_case("activation-version") {
                &mut headers.activation_version
            } else if name.eq_ignore_ascii_case("serial-number") {
                &mut headers.serial_number
            } else if name.eq_ignore_ascii_case("user-agent") {
                &mut headers.user_agent
            } else if name.eq_ignore_ascii_case("accept-language") {
                &mut headers.accept_language
            } else {
                continue;
            };
            if slot.is_none() {
                *slot = header_text(value.as_ref());
            }
        }
        if let Some(id) = &mut headers.device_id {
            // MACs are compared as strings (allowlists, token binding): one spelling.
            id.make_ascii_lowercase();
        }
        headers
    }
}

/// A trimmed, non-empty UTF-8 header value.
pub(crate) fn header_text(value: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(value).ok()?.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

/// The `application` object of an OTA request.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Application {
    /// The firmware name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The firmware version, e.g. `"1.6.0"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The build time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compile_time: Option<String>,
    /// The ESP-IDF version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idf_version: Option<String>,
    /// The firmware image hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elf_sha256: Option<String>,
    /// Keys this crate does not know.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// The `board` object of an OTA request.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Board {
    /// The board type, e.g. `"bread-compact-wifi"`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub board_type: Option<String>,
    /// The board's display name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The Wi-Fi network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssid: Option<String>,
    /// Signal strength in dBm.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient::opt_i64"
    )]
    pub rssi: Option<i64>,
    /// The device's IP address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// The MAC address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// Keys this crate does not know (`channel`, cellular fields, ...).
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// The body of the device's OTA request.
///
/// Every field is optional; numbers may arrive as strings; unknown keys are kept in
/// [`OtaRequest::other`].
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct OtaRequest {
    /// The request format version.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient::opt_u32"
    )]
    pub version: Option<u32>,
    /// The UI language, e.g. `"zh-CN"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// Flash size in bytes.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient::opt_u64"
    )]
    pub flash_size: Option<u64>,
    /// Lowest free heap seen, in bytes (sent as a string by the firmware).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient::opt_u64"
    )]
    pub minimum_free_heap_size: Option<u64>,
    /// The MAC address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac_address: Option<String>,
    /// The device's client UUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// The chip, e.g. `"esp32s3"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chip_model_name: Option<String>,
    /// The running firmware.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub application: Option<Application>,
    /// The board and network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub board: Option<Board>,
    /// Every other key (`chip_info`, `partition_table`, `ota`, ...), as received.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

impl OtaRequest {
    /// Parses a request body.
    ///
    /// # Errors
    ///
    /// When the body is not a JSON object or a known field has an impossible value (a number
    /// field holding text that is not a number). Blame: the peer.
    pub fn from_slice(body: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(body)
    }

    /// The firmware version the device reports, if any.
    pub fn firmware_version(&self) -> Option<&str> {
        self.application.as_ref()?.version.as_deref()
    }

    /// A `firmware` section that offers no upgrade: the device's own version and an empty URL.
    pub fn firmware_echo(&self) -> Option<Firmware> {
        Some(Firmware {
            version: self.firmware_version()?.to_owned(),
            url: String::new(),
        })
    }
}

/// Where and how the device connects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebSocketConfig {
    /// The WebSocket URL, e.g. `ws://host:8000/xiaozhi/v1/`.
    pub url: String,
    /// The bearer token; always serialized (empty for none) because a third-party client
    /// fails without the key.
    #[serde(default)]
    pub token: String,
    /// The binary protocol version; always serialized because the device keeps a stored value
    /// when the key is absent.
    pub version: ProtocolVersion,
}

impl WebSocketConfig {
    /// A config without a token.
    pub fn new(url: impl Into<String>, version: ProtocolVersion) -> Self {
        Self {
            url: url.into(),
            token: String::new(),
            version,
        }
    }

    /// Sets the bearer token.
    #[must_use]
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = token.into();
        self
    }
}

/// The server's clock, which the device adopts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ServerTime {
    /// Milliseconds since the Unix epoch.
    #[serde(deserialize_with = "lenient::deserialize_u64")]
    pub timestamp: u64,
    /// The local time zone's offset from UTC, in minutes.
    #[serde(default, deserialize_with = "i32_or_zero")]
    pub timezone_offset: i32,
}

fn i32_or_zero<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
    Ok(lenient::opt_i32(d)?.unwrap_or_default())
}

/// The firmware offer.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Firmware {
    /// The version on offer; the device's own version offers nothing.
    #[serde(default)]
    pub version: String,
    /// Where to download it; empty for none.
    #[serde(default)]
    pub url: String,
}

/// An activation request: the device shows `code` and polls `POST <ota_url>activate`
/// (202 = keep waiting, 200 = done).
///
/// The firmware polls only when `challenge` is present, so a server that wants the device to
/// wait for activation always sends one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Activation {
    /// The code to show and speak, e.g. `"123456"`.
    pub code: String,
    /// The text shown with it.
    #[serde(default)]
    pub message: String,
    /// A challenge the device echoes in its activation poll, signed with its eFuse key when it
    /// has a serial number (activation version 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub challenge: Option<String>,
    /// How long the code stays valid, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// The body of the device's `POST <ota_url>activate` poll.
///
/// A device without a serial number sends `{}`; one with a serial number sends
/// `{"algorithm":"hmac-sha256","serial_number":..,"challenge":..,"hmac":..}`, `hmac` being the
/// challenge signed with a key in the chip's eFuses. Every field is optional.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ActivateRequest {
    /// `"hmac-sha256"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<String>,
    /// The device's serial number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial_number: Option<String>,
    /// The challenge from the OTA answer's `activation`, echoed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub challenge: Option<String>,
    /// The challenge's HMAC-SHA256 under the device's key, hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hmac: Option<String>,
}

impl ActivateRequest {
    /// Parses a poll body; an empty body is an empty request.
    ///
    /// # Errors
    ///
    /// When the body is not a JSON object or a field is not a string. Blame: the peer.
    pub fn from_slice(body: &[u8]) -> Result<Self, serde_json::Error> {
        if body.trim_ascii().is_empty() {
            return Ok(Self::default());
        }
        serde_json::from_slice(body)
    }
}

/// Device ids that are issued a token at OTA time without activation (known devices on a LAN,
/// test benches). Compared case-insensitively.
///
/// This list decides who *gets* a token, never who may connect without one: a device id is a
/// header the client chooses (and a MAC is no secret), so the upgrade always checks the token,
/// which binds the device id it was issued for.
///
/// ```
/// use voxgate_xiaozhi::ota::DeviceAllowlist;
///
/// let list = DeviceAllowlist::new(["AA:BB:CC:DD:EE:FF"]);
/// assert!(list.contains("aa:bb:cc:dd:ee:ff"));
/// assert!(!list.contains("11:22:33:44:55:66"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceAllowlist {
    device_ids: std::collections::BTreeSet<String>,
}

impl DeviceAllowlist {
    /// A list of device ids (trimmed, compared case-insensitively).
    pub fn new<I, S>(device_ids: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self {
            device_ids: device_ids
                .into_iter()
                .map(|id| id.as_ref().trim().to_ascii_lowercase())
                .filter(|id| !id.is_empty())
                .collect(),
        }
    }

    /// Whether `device_id` is on the list.
    pub fn contains(&self, device_id: &str) -> bool {
        self.device_ids
            .contains(device_id.trim().to_ascii_lowercase().as_str())
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.device_ids.is_empty()
    }
}

/// The OTA answer. Absent sections are not sent; no `mqtt` section exists.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct OtaResponse {
    /// Where to connect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub websocket: Option<WebSocketConfig>,
    /// The server's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_time: Option<ServerTime>,
    /// The firmware offer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware: Option<Firmware>,
    /// An activation request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activation: Option<Activation>,
}

impl OtaResponse {
    /// The compact JSON body.
    pub fn to_json(&self) -> String {
        // Cannot fail: plain structs with string keys.
        serde_json::to_string(self).unwrap_or_default()
    }
}
