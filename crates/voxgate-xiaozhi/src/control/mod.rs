//! JSON control messages (WebSocket text frames), both directions.
//!
//! [`DeviceMessage`] is what a device sends to a server; [`ServerMessage`] is what a server sends
//! to a device. Both parse defensively ([`DeviceMessage::from_slice`]): any key order or spacing,
//! escaped or unescaped Unicode, a missing `session_id`, loosely typed numbers, and strings with
//! broken escaping (raw control characters, invalid escapes, lone surrogates) are repaired and
//! retried rather than rejected. A `type` this crate does not know is kept as
//! [`UnknownMessage`], so nothing a newer peer sends is lost. The JSON-RPC payload of an
//! [`Mcp`] envelope is kept as raw JSON text, exactly as received.
//!
//! Serialization is exact and stable: `type` first, then `session_id` when set, then the fields
//! in the order the firmware documents them. Fields the firmware depends on are always written
//! (the server hello's `transport` and full `audio_params`, all three `alert` fields).
//!
//! ```
//! use voxgate_xiaozhi::control::{DeviceMessage, ListenMode, ListenState, ServerHello, ServerMessage};
//!
//! let msg = DeviceMessage::from_slice(br#"{"session_id": "s1", "type": "listen",
//!     "state": "start", "mode": "realtime"}"#)?;
//! let DeviceMessage::Listen(listen) = msg else { unreachable!() };
//! assert_eq!(listen.state, ListenState::Start);
//! assert_eq!(listen.mode, Some(ListenMode::Realtime));
//!
//! let hello = ServerMessage::from(ServerHello::new("s1"));
//! assert_eq!(
//!     hello.to_json(),
//!     r#"{"type":"hello","session_id":"s1","transport":"websocket","audio_params":{"format":"opus","sample_rate":24000,"channels":1,"frame_duration":60}}"#
//! );
//! # Ok::<(), voxgate_xiaozhi::control::ParseError>(())
//! ```

mod parse;
mod sanitize;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

pub use crate::emotion::Emotion;
use crate::lenient;
use crate::macros::string_enum;
pub use parse::ParseError;

string_enum! {
    /// The `transport` of a hello.
    Transport {
        /// `"websocket"`: the only transport this crate frames.
        WebSocket => "websocket",
        /// `"udp"`: the MQTT + UDP transport's hello.
        Udp => "udp",
    }
}

string_enum! {
    /// The `audio_params.format` of a hello.
    AudioFormat {
        /// `"opus"`: the only format the firmware speaks.
        Opus => "opus",
    }
}

string_enum! {
    /// The `state` of a `listen` message.
    ListenState {
        /// `"start"`: the device starts streaming microphone audio.
        Start => "start",
        /// `"stop"`: end of the utterance (manual mode).
        Stop => "stop",
        /// `"detect"`: a wake word, or a text turn from a headless client.
        Detect => "detect",
    }
}

string_enum! {
    /// The `mode` of a `listen start` message.
    ListenMode {
        /// `"auto"`: the server ends the turn on silence.
        Auto => "auto",
        /// `"manual"`: the device sends `listen stop` at the end of the utterance.
        Manual => "manual",
        /// `"realtime"`: the device keeps streaming while speaking and expects server-side
        /// barge-in (needs `features.aec`).
        Realtime => "realtime",
    }
}

string_enum! {
    /// The `reason` of an `abort` message.
    AbortReason {
        /// `"wake_word_detected"`: the wake word interrupted playback; the device has already
        /// switched to listening.
        WakeWordDetected => "wake_word_detected",
    }
}

string_enum! {
    /// The `state` of a `tts` message.
    TtsState {
        /// `"start"`: the device switches to speaking and accepts audio.
        Start => "start",
        /// `"stop"`: playback is over; also the answer to every `abort`.
        Stop => "stop",
        /// `"sentence_start"`: the subtitle for the sentence whose audio follows.
        SentenceStart => "sentence_start",
    }
}

string_enum! {
    /// The `command` of a `system` message.
    SystemCommand {
        /// `"reboot"`.
        Reboot => "reboot",
    }
}

/// The audio parameters of a hello.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct AudioParams {
    /// The codec (`"opus"`).
    pub format: AudioFormat,
    /// Samples per second.
    pub sample_rate: u32,
    /// Channel count (1).
    pub channels: u16,
    /// Milliseconds per frame: 60, or 20 for some desktop clients.
    pub frame_duration: u32,
}

impl AudioParams {
    /// The device's uplink: Opus, 16 kHz, mono, 60 ms frames.
    pub fn uplink() -> Self {
        Self {
            format: AudioFormat::Opus,
            sample_rate: 16_000,
            channels: 1,
            frame_duration: 60,
        }
    }

    /// The server's downlink: Opus, 24 kHz, mono, 60 ms frames.
    pub fn downlink() -> Self {
        Self {
            sample_rate: 24_000,
            ..Self::uplink()
        }
    }

    /// Samples per channel in one frame.
    pub fn samples_per_frame(&self) -> u64 {
        u64::from(self.sample_rate) * u64::from(self.frame_duration) / 1000
    }
}

/// `audio_params` as received: every field may be missing and is filled from a default.
#[derive(Deserialize)]
struct PartialAudioParams {
    #[serde(default)]
    format: Option<AudioFormat>,
    #[serde(default, deserialize_with = "lenient::opt_u32")]
    sample_rate: Option<u32>,
    #[serde(default, deserialize_with = "lenient::opt_u16")]
    channels: Option<u16>,
    #[serde(default, deserialize_with = "lenient::opt_u32")]
    frame_duration: Option<u32>,
}

impl PartialAudioParams {
    fn fill(self, defaults: AudioParams) -> AudioParams {
        AudioParams {
            format: self.format.unwrap_or(defaults.format),
            sample_rate: self.sample_rate.unwrap_or(defaults.sample_rate),
            channels: self.channels.unwrap_or(defaults.channels),
            frame_duration: self.frame_duration.unwrap_or(defaults.frame_duration),
        }
    }
}

fn uplink_params<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<AudioParams>, D::Error> {
    let partial = Option::<PartialAudioParams>::deserialize(d)?;
    Ok(partial.map(|p| p.fill(AudioParams::uplink())))
}

fn downlink_params<'de, D: serde::Deserializer<'de>>(d: D) -> Result<AudioParams, D::Error> {
    let partial = Option::<PartialAudioParams>::deserialize(d)?;
    Ok(partial.map_or_else(AudioParams::downlink, |p| p.fill(AudioParams::downlink())))
}

/// The `features` a device announces in its hello.
///
/// Known flags are typed; every other key is kept in [`Features::other`] with its value, as is a
/// known flag whose value is not a boolean.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Features {
    /// Acoustic echo cancellation on the device: enables `realtime` listening.
    pub aec: Option<bool>,
    /// The device is an MCP server: the backend should send `initialize`.
    pub mcp: Option<bool>,
    /// The device accepts pushed glyph bitmaps.
    pub glyph_push: Option<bool>,
    /// Features this crate does not know, by name.
    pub other: BTreeMap<String, Value>,
}

impl Features {
    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        self.aec.is_none()
            && self.mcp.is_none()
            && self.glyph_push.is_none()
            && self.other.is_empty()
    }

    fn known(&self) -> [(&'static str, Option<bool>); 3] {
        [
            ("aec", self.aec),
            ("mcp", self.mcp),
            ("glyph_push", self.glyph_push),
        ]
    }
}

impl Serialize for Features {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let known = self.known();
        let mut map = serializer.serialize_map(None)?;
        for (name, value) in known {
            if let Some(value) = value {
                map.serialize_entry(name, &value)?;
            }
        }
        for (name, value) in &self.other {
            // A typed flag wins over a same-named raw entry, so no key is written twice.
            if !known.iter().any(|(k, v)| k == name && v.is_some()) {
                map.serialize_entry(name, value)?;
            }
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Features {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Features;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object of features")
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<Features, E> {
                Ok(Features::default())
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Features, A::Error> {
                let mut features = Features::default();
                while let Some(key) = map.next_key::<String>()? {
                    let value: Value = map.next_value()?;
                    let slot = match key.as_str() {
                        "aec" => &mut features.aec,
                        "mcp" => &mut features.mcp,
                        "glyph_push" => &mut features.glyph_push,
                        _ => {
                            features.other.insert(key, value);
                            continue;
                        }
                    };
                    match value {
                        Value::Bool(flag) => *slot = Some(flag),
                        other => {
                            features.other.insert(key, other);
                        }
                    }
                }
                Ok(features)
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// The device's hello, the first message on every connection.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct DeviceHello {
    /// Rarely present on a device hello.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The binary protocol version; equals the `Protocol-Version` header.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient::opt_u32"
    )]
    pub version: Option<u32>,
    /// What the device supports.
    #[serde(default, skip_serializing_if = "Features::is_empty")]
    pub features: Features,
    /// `"websocket"`; browser test clients omit it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<Transport>,
    /// The uplink audio; browser test clients omit it (see
    /// [`uplink_audio`](Self::uplink_audio)). Missing fields are filled from
    /// [`AudioParams::uplink`].
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "uplink_params"
    )]
    pub audio_params: Option<AudioParams>,
}

impl DeviceHello {
    /// The announced uplink parameters, or the firmware default (16 kHz, mono, 60 ms Opus).
    pub fn uplink_audio(&self) -> AudioParams {
        self.audio_params
            .clone()
            .unwrap_or_else(AudioParams::uplink)
    }
}

/// The server's hello answer. The device waits 10 s for it.
///
/// Always serialized in full: the firmware needs `transport` (omitting it can crash it) and
/// third-party clients need `session_id` and every `audio_params` field. Received hellos with
/// missing fields get the defaults of [`ServerHello::new`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerHello {
    /// The session id the device echoes in later messages.
    #[serde(default)]
    pub session_id: String,
    /// `"websocket"`.
    #[serde(default = "websocket")]
    pub transport: Transport,
    /// The downlink audio.
    #[serde(
        default = "AudioParams::downlink",
        deserialize_with = "downlink_params"
    )]
    pub audio_params: AudioParams,
}

fn websocket() -> Transport {
    Transport::WebSocket
}

impl ServerHello {
    /// A hello for `session_id` announcing 24 kHz mono 60 ms Opus over WebSocket.
    pub fn new(session_id: impl Into<String>) -> Self {
        Self {
            session_id: session_id.into(),
            transport: Transport::WebSocket,
            audio_params: AudioParams::downlink(),
        }
    }
}

/// `listen`: the device's microphone state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listen {
    /// The session, when the device has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Start, stop or detect.
    pub state: ListenState,
    /// How the turn ends (with `start`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<ListenMode>,
    /// The wake word or text turn (with `detect`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

impl Listen {
    /// `listen start` in `mode`.
    pub fn start(mode: ListenMode) -> Self {
        Self {
            session_id: None,
            state: ListenState::Start,
            mode: Some(mode),
            text: None,
        }
    }

    /// `listen stop`.
    pub fn stop() -> Self {
        Self {
            session_id: None,
            state: ListenState::Stop,
            mode: None,
            text: None,
        }
    }

    /// `listen detect` with a wake word or text.
    pub fn detect(text: impl Into<String>) -> Self {
        Self {
            session_id: None,
            state: ListenState::Detect,
            mode: None,
            text: Some(text.into()),
        }
    }
}

/// `abort`: stop speaking. Answer every abort with an immediate `tts stop`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Abort {
    /// The session, when the device has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Why (absent for a button press).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<AbortReason>,
}

/// `mcp`: a JSON-RPC 2.0 message for or from the device's MCP server, kept opaque here.
///
/// The payload is kept as raw JSON text ([`RawValue`]), exactly as received: parsing the
/// envelope checks the payload's syntax but builds no tree, and serialization writes it back
/// verbatim. Hand [`payload_json`](Self::payload_json) to the JSON-RPC layer, which decodes it
/// straight into its own types; [`payload_value`](Self::payload_value) builds a
/// [`Value`] when one is really wanted.
///
/// Equality compares the session id and the payload *text*: the same message spelled with other
/// spacing or key order is not equal. Compare [`payload_value`](Self::payload_value)s for that.
///
/// ```
/// use serde_json::json;
/// use voxgate_xiaozhi::control::{DeviceMessage, Mcp, ServerMessage};
///
/// // Sending: wrap a `Value`, or anything `Serialize`, or JSON text you already have.
/// let call = Mcp::wrap(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}));
/// let json = ServerMessage::from(call.with_session_id("s1")).to_json();
/// assert_eq!(json, r#"{"type":"mcp","session_id":"s1","payload":{"id":1,"jsonrpc":"2.0","method":"tools/list"}}"#);
///
/// // Receiving: the payload text is kept as sent, spacing included.
/// let message = DeviceMessage::from_slice(br#"{"type":"mcp","payload": {"jsonrpc": "2.0", "id": 1, "result": {}}}"#)?;
/// let DeviceMessage::Mcp(reply) = message else { unreachable!() };
/// assert_eq!(reply.payload_json(), r#"{"jsonrpc": "2.0", "id": 1, "result": {}}"#);
/// assert_eq!(reply.payload_value()?["id"], 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Mcp {
    /// The session, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The JSON-RPC message, as JSON text.
    pub payload: Box<RawValue>,
}

impl Mcp {
    /// Wraps JSON-RPC text, without a session id. It is written out verbatim.
    ///
    /// A [`RawValue`] is valid JSON by construction: [`RawValue::from_string`] checks text you
    /// hold (such as an encoded JSON-RPC message); [`Mcp::try_wrap`] serializes a typed message.
    pub fn from_raw(payload: Box<RawValue>) -> Self {
        Self {
            session_id: None,
            payload,
        }
    }

    /// Wraps a JSON-RPC message held as a [`Value`], without a session id.
    // By value, as before the payload became text: callers hand over the `Value` they built.
    #[allow(clippy::needless_pass_by_value)]
    pub fn wrap(payload: Value) -> Self {
        // Cannot fail: a `Value` always serializes (its map keys are strings).
        Self::try_wrap(&payload).unwrap_or_else(|_| Self::from_raw(RawValue::NULL.to_owned()))
    }

    /// Wraps any serializable JSON-RPC message, without a session id and without building a
    /// [`Value`] first.
    ///
    /// # Errors
    ///
    /// When `payload` has no JSON form (a map key that is not a string, number or bool) or its
    /// `Serialize` impl fails.
    pub fn try_wrap<T: Serialize + ?Sized>(payload: &T) -> Result<Self, serde_json::Error> {
        serde_json::value::to_raw_value(payload).map(Self::from_raw)
    }

    /// Sets the session id.
    #[must_use]
    pub fn with_session_id(mut self, session_id: impl Into<String>) -> Self {
        self.session_id = Some(session_id.into());
        self
    }

    /// The JSON-RPC message as JSON text, exactly as received (or as serialized by
    /// [`wrap`](Self::wrap)).
    pub fn payload_json(&self) -> &str {
        self.payload.get()
    }

    /// The JSON-RPC message as a [`Value`] tree.
    ///
    /// # Errors
    ///
    /// The text is always valid JSON, but a [`Value`] cannot hold all of it: nesting deeper than
    /// serde_json's recursion limit (128) and numbers outside the range of `f64` are errors.
    pub fn payload_value(&self) -> Result<Value, serde_json::Error> {
        serde_json::from_str(self.payload.get())
    }

    /// The JSON-RPC message as raw JSON text.
    pub fn into_raw(self) -> Box<RawValue> {
        self.payload
    }
}

impl PartialEq for Mcp {
    fn eq(&self, other: &Self) -> bool {
        self.session_id == other.session_id && self.payload.get() == other.payload.get()
    }
}

impl Eq for Mcp {}

/// `iot`: a legacy message from old clients; accepted and kept, not interpreted.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Iot {
    /// The session, when the device has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Every other key (`descriptors`, `states`, `update`, ...).
    #[serde(flatten)]
    pub fields: Map<String, Value>,
}

/// `event`: a perception event from custom firmware (`face_detected`, `sound_event`, ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// The session, when the device has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The event name.
    pub name: String,
    /// Event-specific data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    /// The device's timestamp, as sent (seconds as a float, or milliseconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ts: Option<serde_json::Number>,
}

/// `stt`: what the user said.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stt {
    /// The session, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The transcript.
    pub text: String,
}

impl Stt {
    /// An `stt` message without a session id.
    pub fn new(text: impl Into<String>) -> Self {
        Self {
            session_id: None,
            text: text.into(),
        }
    }
}

/// `tts`: the device's speaking state and subtitles.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tts {
    /// The session, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Start, stop or sentence start.
    pub state: TtsState,
    /// The subtitle (with `sentence_start`), emoji already stripped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

impl Tts {
    /// `tts start`: send before the first audio frame of a reply.
    pub fn start() -> Self {
        Self {
            session_id: None,
            state: TtsState::Start,
            text: None,
        }
    }

    /// `tts stop`: send after the last frame has played, and at once after an `abort`.
    pub fn stop() -> Self {
        Self {
            session_id: None,
            state: TtsState::Stop,
            text: None,
        }
    }

    /// `tts sentence_start` with the sentence's subtitle (strip emoji first).
    pub fn sentence_start(text: impl Into<String>) -> Self {
        Self {
            session_id: None,
            state: TtsState::SentenceStart,
            text: Some(text.into()),
        }
    }
}

/// `llm`: the face to show. The device reads only `emotion`.
///
/// Build it with [`Llm::from_emotion`], or set `text` to the emoji the model chose (reading that
/// emoji out of model text is the caller's job, e.g. the engine's `emotion` module).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Llm {
    /// The session, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The emoji.
    #[serde(default)]
    pub text: String,
    /// The face name.
    pub emotion: Emotion,
}

impl Llm {
    /// The frame for a firmware face name, with its emoji as text.
    pub fn from_emotion(emotion: Emotion) -> Self {
        Self {
            session_id: None,
            text: emotion.emoji().unwrap_or_default().to_owned(),
            emotion,
        }
    }
}

/// `system`: a device command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct System {
    /// The session, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The command.
    pub command: SystemCommand,
}

/// `alert`: a notification shown on the device. All three fields are required by the firmware
/// and always serialized.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Alert {
    /// The session, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The title, e.g. `"Warning"`.
    pub status: String,
    /// The text.
    pub message: String,
    /// The face (or icon name) to show.
    pub emotion: Emotion,
}

/// A message whose `type` this crate does not know, kept whole.
#[derive(Debug, Clone, PartialEq)]
pub struct UnknownMessage {
    /// The `type` value.
    pub message_type: String,
    /// Every other key, as received.
    pub fields: Map<String, Value>,
}

impl UnknownMessage {
    /// The `session_id` field, if it is a string.
    pub fn session_id(&self) -> Option<&str> {
        self.fields.get("session_id").and_then(Value::as_str)
    }
}

impl Serialize for UnknownMessage {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.fields.len() + 1))?;
        map.serialize_entry("type", &self.message_type)?;
        for (key, value) in &self.fields {
            if key != "type" {
                map.serialize_entry(key, value)?;
            }
        }
        map.end()
    }
}

/// A message from a device to a server.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum DeviceMessage {
    /// `hello`.
    Hello(DeviceHello),
    /// `listen`.
    Listen(Listen),
    /// `abort`.
    Abort(Abort),
    /// `mcp`.
    Mcp(Mcp),
    /// `iot` (legacy).
    Iot(Iot),
    /// `event` (custom firmware).
    Event(Event),
    /// Any other `type`.
    #[serde(untagged)]
    Unknown(UnknownMessage),
}

/// A message from a server to a device. `session_id` is optional on all of them.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ServerMessage {
    /// `hello`.
    Hello(ServerHello),
    /// `stt`.
    Stt(Stt),
    /// `tts`.
    Tts(Tts),
    /// `llm`.
    Llm(Llm),
    /// `mcp`.
    Mcp(Mcp),
    /// `system`.
    System(System),
    /// `alert`.
    Alert(Alert),
    /// Any other `type` (the device ignores it).
    #[serde(untagged)]
    Unknown(UnknownMessage),
}

macro_rules! message_impls {
    ($enum:ident { $($variant:ident($ty:ty) => $wire:literal),+ $(,)? }) => {
        impl $enum {
            /// The wire `type`.
            pub fn message_type(&self) -> &str {
                match self {
                    $( Self::$variant(_) => $wire, )+
                    Self::Unknown(m) => &m.message_type,
                }
            }

            /// The compact JSON text to send.
            pub fn to_json(&self) -> String {
                // Cannot fail: every map key is a string and no Serialize impl here errors.
                serde_json::to_string(self).unwrap_or_default()
            }
        }

        $(
            impl From<$ty> for $enum {
                fn from(message: $ty) -> Self {
                    Self::$variant(message)
                }
            }
        )+

        impl From<UnknownMessage> for $enum {
            fn from(message: UnknownMessage) -> Self {
                Self::Unknown(message)
            }
        }

        impl std::str::FromStr for $enum {
            type Err = ParseError;

            fn from_str(json: &str) -> Result<Self, ParseError> {
                Self::from_slice(json.as_bytes())
            }
        }
    };
}

message_impls!(DeviceMessage {
    Hello(DeviceHello) => "hello",
    Listen(Listen) => "listen",
    Abort(Abort) => "abort",
    Mcp(Mcp) => "mcp",
    Iot(Iot) => "iot",
    Event(Event) => "event",
});

message_impls!(ServerMessage {
    Hello(ServerHello) => "hello",
    Stt(Stt) => "stt",
    Tts(Tts) => "tts",
    Llm(Llm) => "llm",
    Mcp(Mcp) => "mcp",
    System(System) => "system",
    Alert(Alert) => "alert",
});

impl DeviceMessage {
    /// Parses one text frame from a device.
    ///
    /// # Errors
    ///
    /// [`ParseError`] when the text is not a JSON object (even after repair), has no string
    /// `type`, or is a known type with missing or mistyped fields. Unknown types are not errors.
    pub fn from_slice(json: &[u8]) -> Result<Self, ParseError> {
        parse::parse(json, parse::device)
    }

    /// The `session_id`, when present.
    pub fn session_id(&self) -> Option<&str> {
        match self {
            Self::Hello(m) => m.session_id.as_deref(),
            Self::Listen(m) => m.session_id.as_deref(),
            Self::Abort(m) => m.session_id.as_deref(),
            Self::Mcp(m) => m.session_id.as_deref(),
            Self::Iot(m) => m.session_id.as_deref(),
            Self::Event(m) => m.session_id.as_deref(),
            Self::Unknown(m) => m.session_id(),
        }
    }
}

impl ServerMessage {
    /// Parses one text frame from a server.
    ///
    /// # Errors
    ///
    /// As [`DeviceMessage::from_slice`].
    pub fn from_slice(json: &[u8]) -> Result<Self, ParseError> {
        parse::parse(json, parse::server)
    }

    /// The `session_id`, when present (always for a hello).
    pub fn session_id(&self) -> Option<&str> {
        match self {
            Self::Hello(m) => Some(&m.session_id),
            Self::Stt(m) => m.session_id.as_deref(),
            Self::Tts(m) => m.session_id.as_deref(),
            Self::Llm(m) => m.session_id.as_deref(),
            Self::Mcp(m) => m.session_id.as_deref(),
            Self::System(m) => m.session_id.as_deref(),
            Self::Alert(m) => m.session_id.as_deref(),
            Self::Unknown(m) => m.session_id(),
        }
    }
}
