//! The bridge protocol: `{"type": "...", "payload": {...}}` text frames between client apps and
//! a Gemini bridge server, in both directions.
//!
//! Decoding is tolerant in the ways real clients need (explicit `null`s everywhere, flat or
//! nested ICE candidates and `SETUP_COMPLETE`, the deprecated `chunks`/`mediaChunks`, unknown
//! types kept as data); encoding produces the shapes the reference clients expect (nested
//! `SETUP_COMPLETE`, flat tool responses, camelCase keys).

use serde::de::DeserializeOwned;
use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::config::LiveConfig;
use crate::content::{
    Part, RealtimeInput, ServerContent, ToolCall, ToolCallCancellation, ToolResponse,
};
use crate::de;
use crate::error::DecodeError;

/// `GEMINI_ERROR` text for a frame that is not JSON (clients match on it).
pub const INVALID_JSON_TEXT: &str = "Invalid JSON message received.";
/// `GEMINI_ERROR` text for a message that needs a session before `CONNECT_GEMINI`.
pub const NOT_CONNECTED_TEXT: &str = "Gemini not connected. Send CONNECT_GEMINI first.";
/// `GEMINI_ERROR` text for WebRTC signalling when the server does not serve WebRTC.
pub const WEBRTC_UNSUPPORTED_TEXT: &str =
    "WebRTC is not supported by this server; stream audio with SEND_REALTIME_INPUT.";

/// The `GEMINI_ERROR` text for an unknown message type.
pub fn unknown_type_text(kind: &str) -> String {
    format!("Unknown message type: {kind}")
}

/// Largest frame a server should accept: one test client sends a whole WAV file (~370 KB of
/// base64) as a single audio frame, so the usual 64 KiB limits are too small.
pub const RECOMMENDED_MAX_FRAME_BYTES: usize = 8 << 20;

/// A WebRTC ICE candidate (`RTCIceCandidateJson`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IceCandidate {
    /// The `candidate:` line; `None` (or empty) signals end of candidates.
    #[serde(default)]
    pub candidate: Option<String>,
    /// Media stream id.
    #[serde(alias = "sdp_mid", default)]
    pub sdp_mid: Option<String>,
    /// Media line index.
    #[serde(alias = "sdp_m_line_index", default, deserialize_with = "de::opt_u32")]
    pub sdp_m_line_index: Option<u32>,
    /// ICE username fragment.
    #[serde(
        alias = "username_fragment",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub username_fragment: Option<String>,
}

/// An ICE candidate message body, remembering which of the two wire forms it came in.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IceMessage {
    /// The candidate.
    pub candidate: IceCandidate,
    /// The Android client's form `{"candidate": {candidate, sdpMid, sdpMLineIndex}}`; false for
    /// the flat form the seed and a test client use. Answers should use the peer's form.
    pub nested: bool,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum CandidateField {
    Line(String),
    Nested(IceCandidate),
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawIce {
    #[serde(default)]
    candidate: Option<CandidateField>,
    #[serde(alias = "sdp_mid", default)]
    sdp_mid: Option<String>,
    #[serde(alias = "sdp_m_line_index", default, deserialize_with = "de::opt_u32")]
    sdp_m_line_index: Option<u32>,
    #[serde(alias = "username_fragment", default)]
    username_fragment: Option<String>,
}

impl From<RawIce> for IceMessage {
    fn from(raw: RawIce) -> Self {
        match raw.candidate {
            Some(CandidateField::Nested(candidate)) => Self {
                candidate,
                nested: true,
            },
            Some(CandidateField::Line(line)) => Self {
                candidate: IceCandidate {
                    candidate: Some(line),
                    sdp_mid: raw.sdp_mid,
                    sdp_m_line_index: raw.sdp_m_line_index,
                    username_fragment: raw.username_fragment,
                },
                nested: false,
            },
            None => Self {
                candidate: IceCandidate {
                    candidate: None,
                    sdp_mid: raw.sdp_mid,
                    sdp_m_line_index: raw.sdp_m_line_index,
                    username_fragment: raw.username_fragment,
                },
                nested: false,
            },
        }
    }
}

impl Serialize for IceMessage {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.nested {
            let mut m = s.serialize_map(Some(1))?;
            m.serialize_entry("candidate", &self.candidate)?;
            m.end()
        } else {
            self.candidate.serialize(s)
        }
    }
}

/// The outcome of session setup (`SETUP_COMPLETE`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SetupComplete {
    /// The session with Gemini is ready.
    #[serde(default = "de::default_true", deserialize_with = "de::null_true")]
    pub success: bool,
    /// Why setup failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<SetupError>,
}

impl Default for SetupComplete {
    fn default() -> Self {
        Self {
            success: true,
            error: None,
        }
    }
}

/// Why setup failed.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SetupError {
    /// Numeric code (HTTP-like or the upstream close code).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<i64>,
    /// Human-readable reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Anything else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
}

/// A server log line for the client's debug view (`LOG_MESSAGE`).
///
/// `date` is always sent: the original Android app's decoder requires it and drops a
/// `LOG_MESSAGE` without one. The codec has no clock: the door fills it, e.g. with
/// [`iso8601_utc`] of the wall clock.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct LogMessage {
    /// When, as ISO 8601 UTC (`2024-06-01T12:34:56.789Z`, what the original gateway's
    /// `new Date().toISOString()` wrote). A missing or null `date` reads as empty.
    #[serde(default, deserialize_with = "de::null_default")]
    pub date: String,
    /// `info`, `warn`, `error`...
    #[serde(rename = "type", default, deserialize_with = "de::null_default")]
    pub level: String,
    /// The line.
    #[serde(default, deserialize_with = "de::null_default")]
    pub message: String,
    /// Anything else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
}

impl LogMessage {
    /// A log line at `date` (see [`iso8601_utc`]).
    pub fn new(date: String, level: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            date,
            level: level.into(),
            message: message.into(),
            details: None,
        }
    }
}

/// Milliseconds since the Unix epoch as ISO 8601 UTC with milliseconds
/// (`2024-06-01T12:34:56.789Z`), the form JavaScript's `Date.toISOString()` writes. Pure: the
/// caller reads the clock. Years past 9999 are written with more digits.
pub fn iso8601_utc(unix_millis: u64) -> String {
    let millis = unix_millis % 1000;
    let secs = unix_millis / 1000;
    let (days, day_secs) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's `civil_from_days`, for
    // non-negative day counts): eras of 400 years, days shifted to start on 0000-03-01.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        day_secs / 3600,
        day_secs / 60 % 60,
        day_secs % 60
    )
}

/// The answer to `GENERATE_IMAGE` (`IMAGE_GENERATION_RESULT`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageGenerationResult {
    /// An image was produced.
    #[serde(default, deserialize_with = "de::null_default")]
    pub success: bool,
    /// Where the image is, if stored.
    #[serde(alias = "image_url", default, skip_serializing_if = "Option::is_none")]
    pub image_url: Option<String>,
    /// Base64 image, if inline.
    #[serde(alias = "image_data", default, skip_serializing_if = "Option::is_none")]
    pub image_data: Option<String>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A message from a client app to the bridge.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ClientMessage {
    /// `CONNECT_GEMINI {initialConfig}`: must come first; a second one replaces the session.
    ConnectGemini {
        /// The session configuration.
        initial_config: Option<LiveConfig>,
    },
    /// `SEND_MESSAGE {parts, turnComplete}`: a user turn.
    SendMessage {
        /// The content.
        parts: Vec<Part>,
        /// The turn is complete and the model should answer (defaults to true).
        turn_complete: bool,
    },
    /// `SEND_REALTIME_INPUT {text?, audio?, video?}`: streamed input.
    SendRealtimeInput(RealtimeInput),
    /// `SEND_TOOL_RESPONSE {toolResponse}`: results for a `TOOL_CALL`.
    SendToolResponse(ToolResponse),
    /// `UPDATE_CONFIG`: the payload is the new config itself; answered by a new `SETUP_COMPLETE`.
    UpdateConfig(LiveConfig),
    /// `DISCONNECT_GEMINI`: end the session (the socket may stay open).
    DisconnectGemini,
    /// `WEBRTC_OFFER {sdp}`.
    WebrtcOffer {
        /// The SDP offer.
        sdp: String,
    },
    /// `WEBRTC_ICE_CANDIDATE`, flat or nested.
    WebrtcIceCandidate(IceMessage),
    /// `GENERATE_IMAGE {text, imageData?}` (undocumented in the seed, used by the original).
    GenerateImage {
        /// The prompt.
        text: String,
        /// A base64 image to edit.
        image_data: Option<String>,
    },
    /// A type this version does not know, kept as data (the server answers
    /// [`ServerMessage::unknown_type`]).
    Unknown {
        /// The `type` string.
        kind: String,
        /// The payload, if any.
        payload: Option<Value>,
    },
}

/// A message from the bridge to a client app.
// Messages are decoded, handled and dropped one at a time: boxing the large variant would cost
// an allocation per message to save a few hundred bytes of stack.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ServerMessage {
    /// `GEMINI_CONNECTED`: the client's request is accepted, setup is under way.
    GeminiConnected,
    /// `GEMINI_DISCONNECTED {reason?}`.
    GeminiDisconnected {
        /// Why.
        reason: Option<String>,
    },
    /// `GEMINI_ERROR {message, details?}`; see the constructors for the texts clients know.
    GeminiError {
        /// What went wrong.
        message: String,
        /// Anything else.
        details: Option<Value>,
    },
    /// `CONTENT_MESSAGE {serverContent}`: model output in the upstream shape.
    ContentMessage(ServerContent),
    /// `TOOL_CALL {toolCall}`.
    ToolCall(ToolCall),
    /// `TOOL_CALL_CANCELLATION {toolCallCancellation}`.
    ToolCallCancellation(ToolCallCancellation),
    /// `SETUP_COMPLETE {setupComplete: {success, error?}}`.
    SetupComplete(SetupComplete),
    /// `INTERRUPTED`: follows a `CONTENT_MESSAGE` with `interrupted: true`.
    Interrupted,
    /// `TURN_COMPLETE`: follows a `CONTENT_MESSAGE` with `turnComplete: true`.
    TurnComplete,
    /// `AUDIO_CHUNK {data}`: model audio as base64 PCM (opt-in per connection).
    AudioChunk {
        /// Base64 s16le PCM at 24 kHz.
        data: String,
    },
    /// `ASSISTANT_SPEAKING {speaking}`: for the client's status overlay.
    AssistantSpeaking {
        /// Speech is playing.
        speaking: bool,
    },
    /// `WEBRTC_ANSWER {sdp}`.
    WebrtcAnswer {
        /// The SDP answer.
        sdp: String,
    },
    /// `WEBRTC_ICE_CANDIDATE`, in the form the client used.
    WebrtcIceCandidate(IceMessage),
    /// `LOG_MESSAGE {date, type, message}`: real server log lines only, never echoed input.
    LogMessage(LogMessage),
    /// `IMAGE_GENERATION_RESULT {success, imageUrl?, imageData?, error?}`.
    ImageGenerationResult(ImageGenerationResult),
    /// A type this version does not know, kept as data.
    Unknown {
        /// The `type` string.
        kind: String,
        /// The payload, if any.
        payload: Option<Value>,
    },
}

impl ServerMessage {
    /// A `GEMINI_ERROR` with `message`.
    pub fn error(message: impl Into<String>) -> Self {
        Self::GeminiError {
            message: message.into(),
            details: None,
        }
    }

    /// `GEMINI_ERROR` "Invalid JSON message received."
    pub fn invalid_json() -> Self {
        Self::error(INVALID_JSON_TEXT)
    }

    /// `GEMINI_ERROR` "Unknown message type: X".
    pub fn unknown_type(kind: &str) -> Self {
        Self::error(unknown_type_text(kind))
    }

    /// `GEMINI_ERROR` "Gemini not connected. Send CONNECT_GEMINI first."
    pub fn not_connected() -> Self {
        Self::error(NOT_CONNECTED_TEXT)
    }

    /// `GEMINI_ERROR` saying WebRTC signalling is not served (better than silence).
    pub fn webrtc_unsupported() -> Self {
        Self::error(WEBRTC_UNSUPPORTED_TEXT)
    }

    /// A successful `SETUP_COMPLETE`.
    pub fn setup_ok() -> Self {
        Self::SetupComplete(SetupComplete::default())
    }

    /// A failed `SETUP_COMPLETE` (the original never sent one; clients accept it).
    pub fn setup_failed(code: Option<i64>, message: impl Into<String>) -> Self {
        Self::SetupComplete(SetupComplete {
            success: false,
            error: Some(SetupError {
                code,
                message: Some(message.into()),
                details: None,
            }),
        })
    }
}

impl DecodeError {
    /// The `GEMINI_ERROR` a bridge answers this error with (keeping the socket open).
    pub fn reply(&self) -> ServerMessage {
        match self {
            Self::Json(_) | Self::MissingType => ServerMessage::invalid_json(),
            Self::Payload { kind, source } => ServerMessage::GeminiError {
                message: format!("Invalid payload for {kind}."),
                details: Some(Value::String(source.to_string())),
            },
        }
    }
}

/// The envelope, split without parsing the payload.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(rename = "type", default, borrow)]
    kind: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    payload: Option<&'a RawValue>,
}

fn split(text: &str) -> Result<(String, Option<&RawValue>), DecodeError> {
    let env: Envelope<'_> = serde_json::from_str(text).map_err(DecodeError::Json)?;
    let kind = env.kind.ok_or(DecodeError::MissingType)?;
    Ok((kind.into_owned(), env.payload))
}

fn utf8(bytes: &[u8]) -> Result<&str, DecodeError> {
    std::str::from_utf8(bytes).map_err(|e| {
        DecodeError::Json(serde::de::Error::custom(format_args!("invalid UTF-8: {e}")))
    })
}

/// Parses a payload; an absent or `null` payload reads as `{}` so all-default types decode.
fn payload<T: DeserializeOwned>(kind: &str, raw: Option<&RawValue>) -> Result<T, DecodeError> {
    let text = raw.map_or("{}", |r| match r.get() {
        "null" => "{}",
        t => t,
    });
    serde_json::from_str(text).map_err(|source| DecodeError::Payload {
        kind: kind.to_owned(),
        source,
    })
}

fn raw_value(raw: Option<&RawValue>) -> Option<Value> {
    raw.and_then(|r| serde_json::from_str::<Value>(r.get()).ok())
        .filter(|v| !v.is_null())
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ConnectIn {
    #[serde(alias = "initial_config", default)]
    initial_config: Option<LiveConfig>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SendMessageIn {
    #[serde(default, deserialize_with = "de::vec_skip_nulls")]
    parts: Vec<Part>,
    #[serde(
        alias = "turn_complete",
        default = "de::default_true",
        deserialize_with = "de::null_true"
    )]
    turn_complete: bool,
}

/// The flat form, plus two older spellings: `functionResponses` without the wrapper and the
/// deprecated Content/Part form.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ToolResponseIn {
    #[serde(alias = "tool_response", default)]
    tool_response: Option<ToolResponse>,
    #[serde(alias = "function_responses", default)]
    function_responses: Option<Vec<Option<crate::content::FunctionResponse>>>,
    #[serde(default)]
    parts: Option<Vec<Option<Part>>>,
}

impl From<ToolResponseIn> for ToolResponse {
    fn from(raw: ToolResponseIn) -> Self {
        if let Some(t) = raw.tool_response {
            return t;
        }
        if let Some(list) = raw.function_responses {
            return Self {
                function_responses: list.into_iter().flatten().collect(),
            };
        }
        Self {
            function_responses: raw
                .parts
                .unwrap_or_default()
                .into_iter()
                .flatten()
                .filter_map(|p| p.function_response)
                .collect(),
        }
    }
}

#[derive(Deserialize)]
struct SdpIn {
    #[serde(default, deserialize_with = "de::null_default")]
    sdp: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct GenerateImageIn {
    #[serde(default, deserialize_with = "de::null_default")]
    text: String,
    #[serde(alias = "image_data", default)]
    image_data: Option<String>,
}

impl ClientMessage {
    /// Decodes one text frame.
    pub fn decode(text: &str) -> Result<Self, DecodeError> {
        let (kind, raw) = split(text)?;
        let k = kind.as_str();
        Ok(match k {
            "CONNECT_GEMINI" => Self::ConnectGemini {
                initial_config: payload::<ConnectIn>(k, raw)?.initial_config,
            },
            "SEND_MESSAGE" => {
                let p: SendMessageIn = payload(k, raw)?;
                Self::SendMessage {
                    parts: p.parts,
                    turn_complete: p.turn_complete,
                }
            }
            "SEND_REALTIME_INPUT" => Self::SendRealtimeInput(payload(k, raw)?),
            "SEND_TOOL_RESPONSE" => {
                Self::SendToolResponse(payload::<ToolResponseIn>(k, raw)?.into())
            }
            "UPDATE_CONFIG" => Self::UpdateConfig(payload(k, raw)?),
            "DISCONNECT_GEMINI" => Self::DisconnectGemini,
            "WEBRTC_OFFER" => Self::WebrtcOffer {
                sdp: payload::<SdpIn>(k, raw)?.sdp,
            },
            "WEBRTC_ICE_CANDIDATE" => Self::WebrtcIceCandidate(payload::<RawIce>(k, raw)?.into()),
            "GENERATE_IMAGE" => {
                let p: GenerateImageIn = payload(k, raw)?;
                Self::GenerateImage {
                    text: p.text,
                    image_data: p.image_data,
                }
            }
            _ => Self::Unknown {
                payload: raw_value(raw),
                kind,
            },
        })
    }

    /// Decodes one frame given as bytes (fails on invalid UTF-8 like any bad JSON).
    pub fn decode_slice(bytes: &[u8]) -> Result<Self, DecodeError> {
        Self::decode(utf8(bytes)?)
    }

    /// The wire `type` string.
    pub fn kind(&self) -> &str {
        match self {
            Self::ConnectGemini { .. } => "CONNECT_GEMINI",
            Self::SendMessage { .. } => "SEND_MESSAGE",
            Self::SendRealtimeInput(_) => "SEND_REALTIME_INPUT",
            Self::SendToolResponse(_) => "SEND_TOOL_RESPONSE",
            Self::UpdateConfig(_) => "UPDATE_CONFIG",
            Self::DisconnectGemini => "DISCONNECT_GEMINI",
            Self::WebrtcOffer { .. } => "WEBRTC_OFFER",
            Self::WebrtcIceCandidate(_) => "WEBRTC_ICE_CANDIDATE",
            Self::GenerateImage { .. } => "GENERATE_IMAGE",
            Self::Unknown { kind, .. } => kind,
        }
    }

    /// True for messages that need a session (everything but `CONNECT_GEMINI`,
    /// `DISCONNECT_GEMINI`, WebRTC signalling and unknown types).
    pub fn needs_session(&self) -> bool {
        matches!(
            self,
            Self::SendMessage { .. }
                | Self::SendRealtimeInput(_)
                | Self::SendToolResponse(_)
                | Self::UpdateConfig(_)
                | Self::GenerateImage { .. }
        )
    }

    /// Encodes as one text frame.
    pub fn encode(&self) -> String {
        // Serializing these types cannot fail: every map key is a string.
        serde_json::to_string(self).unwrap_or_default()
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ConnectOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    initial_config: Option<&'a LiveConfig>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SendMessageOut<'a> {
    parts: &'a [Part],
    turn_complete: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ToolResponseOut<'a> {
    tool_response: &'a ToolResponse,
}

#[derive(Serialize)]
struct SdpOut<'a> {
    sdp: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GenerateImageOut<'a> {
    text: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    image_data: Option<&'a str>,
}

impl Serialize for ClientMessage {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("type", self.kind())?;
        match self {
            Self::ConnectGemini { initial_config } => m.serialize_entry(
                "payload",
                &ConnectOut {
                    initial_config: initial_config.as_ref(),
                },
            )?,
            Self::SendMessage {
                parts,
                turn_complete,
            } => m.serialize_entry(
                "payload",
                &SendMessageOut {
                    parts,
                    turn_complete: *turn_complete,
                },
            )?,
            Self::SendRealtimeInput(input) => m.serialize_entry("payload", input)?,
            Self::SendToolResponse(tool_response) => {
                m.serialize_entry("payload", &ToolResponseOut { tool_response })?;
            }
            Self::UpdateConfig(config) => m.serialize_entry("payload", config)?,
            Self::DisconnectGemini => {}
            Self::WebrtcOffer { sdp } => m.serialize_entry("payload", &SdpOut { sdp })?,
            Self::WebrtcIceCandidate(ice) => m.serialize_entry("payload", ice)?,
            Self::GenerateImage { text, image_data } => m.serialize_entry(
                "payload",
                &GenerateImageOut {
                    text,
                    image_data: image_data.as_deref(),
                },
            )?,
            Self::Unknown { payload, .. } => {
                if let Some(p) = payload {
                    m.serialize_entry("payload", p)?;
                }
            }
        }
        m.end()
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DisconnectedIn {
    #[serde(default)]
    reason: Option<String>,
}

#[derive(Deserialize)]
struct ErrorIn {
    #[serde(default, deserialize_with = "de::null_default")]
    message: String,
    #[serde(default)]
    details: Option<Value>,
}

/// `{serverContent}`, tolerating `groundingMetadata` beside it and a bare ServerContent.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ContentIn {
    #[serde(alias = "server_content", default)]
    server_content: Option<ServerContent>,
    #[serde(alias = "grounding_metadata", default)]
    grounding_metadata: Option<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ToolCallIn {
    #[serde(alias = "tool_call", default)]
    tool_call: Option<ToolCall>,
    #[serde(alias = "function_calls", default)]
    function_calls: Option<Vec<Option<crate::content::FunctionCall>>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CancellationIn {
    #[serde(alias = "tool_call_cancellation", default)]
    tool_call_cancellation: Option<ToolCallCancellation>,
    #[serde(default)]
    ids: Option<Vec<Option<String>>>,
}

/// Nested as the original sends it, or flat as the seed describes it.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SetupCompleteIn {
    #[serde(alias = "setup_complete", default)]
    setup_complete: Option<SetupComplete>,
    #[serde(default)]
    success: Option<bool>,
    #[serde(default)]
    error: Option<SetupError>,
}

#[derive(Deserialize)]
struct AudioChunkIn {
    #[serde(default, deserialize_with = "de::null_default")]
    data: String,
}

#[derive(Deserialize)]
struct SpeakingIn {
    #[serde(default = "de::default_true", deserialize_with = "de::null_true")]
    speaking: bool,
}

impl ServerMessage {
    /// Decodes one text frame.
    pub fn decode(text: &str) -> Result<Self, DecodeError> {
        let (kind, raw) = split(text)?;
        let k = kind.as_str();
        Ok(match k {
            "GEMINI_CONNECTED" => Self::GeminiConnected,
            "GEMINI_DISCONNECTED" => Self::GeminiDisconnected {
                reason: payload::<DisconnectedIn>(k, raw)?.reason,
            },
            "GEMINI_ERROR" => {
                let p: ErrorIn = payload(k, raw)?;
                Self::GeminiError {
                    message: p.message,
                    details: p.details,
                }
            }
            "CONTENT_MESSAGE" => {
                let p: ContentIn = payload(k, raw)?;
                let mut content = match p.server_content {
                    Some(c) => c,
                    None => payload(k, raw)?,
                };
                if content.grounding_metadata.is_none() {
                    content.grounding_metadata = p.grounding_metadata;
                }
                Self::ContentMessage(content)
            }
            "TOOL_CALL" => {
                let p: ToolCallIn = payload(k, raw)?;
                Self::ToolCall(p.tool_call.unwrap_or_else(|| ToolCall {
                    function_calls: p.function_calls.into_iter().flatten().flatten().collect(),
                }))
            }
            "TOOL_CALL_CANCELLATION" => {
                let p: CancellationIn = payload(k, raw)?;
                Self::ToolCallCancellation(p.tool_call_cancellation.unwrap_or_else(|| {
                    ToolCallCancellation {
                        ids: p.ids.into_iter().flatten().flatten().collect(),
                    }
                }))
            }
            "SETUP_COMPLETE" => {
                let p: SetupCompleteIn = payload(k, raw)?;
                Self::SetupComplete(p.setup_complete.unwrap_or(SetupComplete {
                    success: p.success.unwrap_or(true),
                    error: p.error,
                }))
            }
            "INTERRUPTED" => Self::Interrupted,
            "TURN_COMPLETE" => Self::TurnComplete,
            "AUDIO_CHUNK" => Self::AudioChunk {
                data: payload::<AudioChunkIn>(k, raw)?.data,
            },
            "ASSISTANT_SPEAKING" => Self::AssistantSpeaking {
                speaking: payload::<SpeakingIn>(k, raw)?.speaking,
            },
            "WEBRTC_ANSWER" => Self::WebrtcAnswer {
                sdp: payload::<SdpIn>(k, raw)?.sdp,
            },
            "WEBRTC_ICE_CANDIDATE" => Self::WebrtcIceCandidate(payload::<RawIce>(k, raw)?.into()),
            "LOG_MESSAGE" => Self::LogMessage(payload(k, raw)?),
            "IMAGE_GENERATION_RESULT" => Self::ImageGenerationResult(payload(k, raw)?),
            _ => Self::Unknown {
                payload: raw_value(raw),
                kind,
            },
        })
    }

    /// Decodes one frame given as bytes (fails on invalid UTF-8 like any bad JSON).
    pub fn decode_slice(bytes: &[u8]) -> Result<Self, DecodeError> {
        Self::decode(utf8(bytes)?)
    }

    /// The wire `type` string.
    pub fn kind(&self) -> &str {
        match self {
            Self::GeminiConnected => "GEMINI_CONNECTED",
            Self::GeminiDisconnected { .. } => "GEMINI_DISCONNECTED",
            Self::GeminiError { .. } => "GEMINI_ERROR",
            Self::ContentMessage(_) => "CONTENT_MESSAGE",
            Self::ToolCall(_) => "TOOL_CALL",
            Self::ToolCallCancellation(_) => "TOOL_CALL_CANCELLATION",
            Self::SetupComplete(_) => "SETUP_COMPLETE",
            Self::Interrupted => "INTERRUPTED",
            Self::TurnComplete => "TURN_COMPLETE",
            Self::AudioChunk { .. } => "AUDIO_CHUNK",
            Self::AssistantSpeaking { .. } => "ASSISTANT_SPEAKING",
            Self::WebrtcAnswer { .. } => "WEBRTC_ANSWER",
            Self::WebrtcIceCandidate(_) => "WEBRTC_ICE_CANDIDATE",
            Self::LogMessage(_) => "LOG_MESSAGE",
            Self::ImageGenerationResult(_) => "IMAGE_GENERATION_RESULT",
            Self::Unknown { kind, .. } => kind,
        }
    }

    /// True for messages a server may drop under back-pressure (audio), never for control.
    pub fn is_droppable(&self) -> bool {
        match self {
            Self::AudioChunk { .. } => true,
            Self::ContentMessage(c) => {
                !c.turn_complete
                    && !c.interrupted
                    && !c.generation_complete
                    && c.model_turn
                        .as_ref()
                        .is_some_and(|t| !t.parts.is_empty() && t.parts.iter().all(is_audio_part))
            }
            _ => false,
        }
    }

    /// Encodes as one text frame.
    pub fn encode(&self) -> String {
        // Serializing these types cannot fail: every map key is a string.
        serde_json::to_string(self).unwrap_or_default()
    }
}

fn is_audio_part(p: &Part) -> bool {
    p.text.is_none()
        && p.function_call.is_none()
        && p.inline_data.as_ref().is_some_and(|b| b.is_audio())
}

#[derive(Serialize)]
struct ReasonOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
}

#[derive(Serialize)]
struct ErrorOut<'a> {
    message: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<&'a Value>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ContentOut<'a> {
    server_content: &'a ServerContent,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ToolCallOut<'a> {
    tool_call: &'a ToolCall,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CancellationOut<'a> {
    tool_call_cancellation: &'a ToolCallCancellation,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SetupCompleteOut<'a> {
    setup_complete: &'a SetupComplete,
}

#[derive(Serialize)]
struct AudioChunkOut<'a> {
    data: &'a str,
}

#[derive(Serialize)]
struct SpeakingOut {
    speaking: bool,
}

impl Serialize for ServerMessage {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("type", self.kind())?;
        match self {
            Self::GeminiConnected | Self::Interrupted | Self::TurnComplete => {}
            Self::GeminiDisconnected { reason } => m.serialize_entry(
                "payload",
                &ReasonOut {
                    reason: reason.as_deref(),
                },
            )?,
            Self::GeminiError { message, details } => m.serialize_entry(
                "payload",
                &ErrorOut {
                    message,
                    details: details.as_ref(),
                },
            )?,
            Self::ContentMessage(server_content) => {
                m.serialize_entry("payload", &ContentOut { server_content })?;
            }
            Self::ToolCall(tool_call) => {
                m.serialize_entry("payload", &ToolCallOut { tool_call })?;
            }
            Self::ToolCallCancellation(tool_call_cancellation) => m.serialize_entry(
                "payload",
                &CancellationOut {
                    tool_call_cancellation,
                },
            )?,
            Self::SetupComplete(setup_complete) => {
                m.serialize_entry("payload", &SetupCompleteOut { setup_complete })?;
            }
            Self::AudioChunk { data } => m.serialize_entry("payload", &AudioChunkOut { data })?,
            Self::AssistantSpeaking { speaking } => m.serialize_entry(
                "payload",
                &SpeakingOut {
                    speaking: *speaking,
                },
            )?,
            Self::WebrtcAnswer { sdp } => m.serialize_entry("payload", &SdpOut { sdp })?,
            Self::WebrtcIceCandidate(ice) => m.serialize_entry("payload", ice)?,
            Self::LogMessage(log) => m.serialize_entry("payload", log)?,
            Self::ImageGenerationResult(r) => m.serialize_entry("payload", r)?,
            Self::Unknown { payload, .. } => {
                if let Some(p) = payload {
                    m.serialize_entry("payload", p)?;
                }
            }
        }
        m.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso8601_utc_matches_javascript_to_iso_string() {
        assert_eq!(iso8601_utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601_utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(iso8601_utc(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(iso8601_utc(1_717_245_296_789), "2024-06-01T12:34:56.789Z");
        assert_eq!(iso8601_utc(4_102_444_799_999), "2099-12-31T23:59:59.999Z");
        // No panic at the end of the range.
        assert!(iso8601_utc(u64::MAX).ends_with('Z'));
    }

    #[test]
    fn log_message_always_carries_a_date() {
        let m = ServerMessage::LogMessage(LogMessage::new(String::new(), "warn", "x"));
        let v: Value = serde_json::from_str(&m.encode()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"type": "LOG_MESSAGE", "payload": {"date": "", "type": "warn", "message": "x"}})
        );
    }
}
