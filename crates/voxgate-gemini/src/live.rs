//! The upstream Gemini Live API messages (`BidiGenerateContent` over WebSocket), so a server can
//! pass a bridge session through to the real service.
//!
//! Endpoint: `wss://generativelanguage.googleapis.com/ws/google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent`
//! with the API key as `?key=` or the `x-goog-api-key` header ([`LIVE_WS_PATH`]).
//! Each frame is a JSON object with exactly one message key (`setup`, `serverContent`...);
//! server frames may carry `usageMetadata` beside it. Keys are accepted in camelCase and
//! snake_case, integers also as strings (proto3 JSON writes int64 that way).

use std::fmt;
use std::time::Duration;

use serde::de::{self, IgnoredAny, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use crate::config::LiveConfig;
use crate::content::{
    Content, RealtimeInput, ServerContent, ToolCall, ToolCallCancellation, ToolResponse,
    UsageMetadata,
};
use crate::de as lenient;
use crate::error::DecodeError;

/// The WebSocket path of the Live API (v1beta), after the host.
pub const LIVE_WS_PATH: &str =
    "/ws/google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent";

/// Input audio the Live API expects: 16 kHz s16le mono.
pub const INPUT_SAMPLE_RATE: u32 = 16_000;
/// Output audio the Live API produces: 24 kHz s16le mono.
pub const OUTPUT_SAMPLE_RATE: u32 = 24_000;

/// Turns of conversation (`clientContent`), appended to the history.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientContent {
    /// The turns, oldest first.
    #[serde(
        default,
        deserialize_with = "lenient::vec_skip_nulls",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub turns: Vec<Content>,
    /// The model should answer now (upstream default false).
    #[serde(
        alias = "turn_complete",
        default,
        deserialize_with = "lenient::null_default",
        skip_serializing_if = "lenient::is_false"
    )]
    pub turn_complete: bool,
}

/// A message from a client to the Live API.
// Messages are decoded, handled and dropped one at a time: boxing the large variant would cost
// an allocation per message to save a few hundred bytes of stack.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum LiveClientMessage {
    /// `setup`: the first message, once per connection.
    Setup(LiveConfig),
    /// `clientContent`: conversation turns.
    ClientContent(ClientContent),
    /// `realtimeInput`: streamed audio, video, text or activity markers.
    RealtimeInput(RealtimeInput),
    /// `toolResponse`: function results.
    ToolResponse(ToolResponse),
    /// A message key this version does not know, kept as data.
    Unknown {
        /// The key.
        key: String,
        /// Its value.
        value: Value,
    },
}

/// The body of `goAway`: the server will close the connection soon.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GoAway {
    /// Time left before the connection is closed, as a proto3 JSON duration (`"10s"`).
    #[serde(
        alias = "time_left",
        default,
        deserialize_with = "lenient::opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub time_left: Option<String>,
}

impl GoAway {
    /// [`Self::time_left`] as a [`Duration`], if it parses (`"12s"`, `"0.5s"`, `"3"`).
    pub fn time_left_duration(&self) -> Option<Duration> {
        let t = self.time_left.as_deref()?.trim();
        let secs = t.strip_suffix('s').unwrap_or(t).trim();
        let f: f64 = secs.parse().ok()?;
        Duration::try_from_secs_f64(f).ok()
    }
}

/// The body of `sessionResumptionUpdate`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionResumptionUpdate {
    /// Handle to resume with; empty when not resumable.
    #[serde(alias = "new_handle", default, skip_serializing_if = "Option::is_none")]
    pub new_handle: Option<String>,
    /// The session can be resumed at this point.
    #[serde(
        default,
        deserialize_with = "lenient::null_default",
        skip_serializing_if = "lenient::is_false"
    )]
    pub resumable: bool,
    /// Index of the last client message included in the state (int64, a string on the wire).
    #[serde(
        alias = "last_consumed_client_message_index",
        default,
        deserialize_with = "lenient::opt_u64",
        serialize_with = "lenient::ser_opt_u64_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub last_consumed_client_message_index: Option<u64>,
}

/// What a server message is about.
// Messages are decoded, handled and dropped one at a time: boxing the large variant would cost
// an allocation per message to save a few hundred bytes of stack.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum LiveServerEvent {
    /// `setupComplete`: the session is ready.
    SetupComplete,
    /// `serverContent`: model output.
    ServerContent(ServerContent),
    /// `toolCall`: functions to run.
    ToolCall(ToolCall),
    /// `toolCallCancellation`: pending calls no longer wanted.
    ToolCallCancellation(ToolCallCancellation),
    /// `goAway`: the connection will close soon; reconnect (with resumption).
    GoAway(GoAway),
    /// `sessionResumptionUpdate`: a new resumption handle.
    SessionResumptionUpdate(SessionResumptionUpdate),
    /// A message carrying only `usageMetadata`.
    UsageOnly,
    /// A message key this version does not know, kept as data.
    Unknown {
        /// The key.
        key: String,
        /// Its value.
        value: Value,
    },
}

/// A message from the Live API.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveServerMessage {
    /// What it is about.
    pub event: LiveServerEvent,
    /// Token usage, which may ride along with any message.
    pub usage_metadata: Option<UsageMetadata>,
}

impl LiveServerMessage {
    /// A message with no usage metadata.
    pub fn new(event: LiveServerEvent) -> Self {
        Self {
            event,
            usage_metadata: None,
        }
    }
}

fn classify(e: serde_json::Error, kind: &str) -> DecodeError {
    match e.classify() {
        serde_json::error::Category::Data => DecodeError::Payload {
            kind: kind.to_owned(),
            source: e,
        },
        _ => DecodeError::Json(e),
    }
}

impl LiveClientMessage {
    /// Decodes one text frame.
    pub fn decode(text: &str) -> Result<Self, DecodeError> {
        serde_json::from_str(text).map_err(|e| classify(e, "live client message"))
    }

    /// Decodes one frame given as bytes.
    pub fn decode_slice(bytes: &[u8]) -> Result<Self, DecodeError> {
        serde_json::from_slice(bytes).map_err(|e| classify(e, "live client message"))
    }

    /// Encodes as one text frame.
    pub fn encode(&self) -> String {
        // Serializing these types cannot fail: every map key is a string.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The message key (`setup`, `realtimeInput`...).
    pub fn key(&self) -> &str {
        match self {
            Self::Setup(_) => "setup",
            Self::ClientContent(_) => "clientContent",
            Self::RealtimeInput(_) => "realtimeInput",
            Self::ToolResponse(_) => "toolResponse",
            Self::Unknown { key, .. } => key,
        }
    }
}

impl LiveServerMessage {
    /// Decodes one text frame (the service sends JSON in binary frames too: pass their bytes
    /// to [`Self::decode_slice`]).
    pub fn decode(text: &str) -> Result<Self, DecodeError> {
        serde_json::from_str(text).map_err(|e| classify(e, "live server message"))
    }

    /// Decodes one frame given as bytes.
    pub fn decode_slice(bytes: &[u8]) -> Result<Self, DecodeError> {
        serde_json::from_slice(bytes).map_err(|e| classify(e, "live server message"))
    }

    /// Encodes as one text frame.
    pub fn encode(&self) -> String {
        // Serializing these types cannot fail: every map key is a string.
        serde_json::to_string(self).unwrap_or_default()
    }
}

impl Serialize for LiveClientMessage {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(1))?;
        match self {
            Self::Setup(c) => m.serialize_entry("setup", c)?,
            Self::ClientContent(c) => m.serialize_entry("clientContent", c)?,
            Self::RealtimeInput(r) => m.serialize_entry("realtimeInput", r)?,
            Self::ToolResponse(t) => m.serialize_entry("toolResponse", t)?,
            Self::Unknown { key, value } => m.serialize_entry(key, value)?,
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for LiveClientMessage {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = LiveClientMessage;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a Live API client message object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut found: Option<LiveClientMessage> = None;
                let mut unknown: Option<(String, Value)> = None;
                while let Some(key) = map.next_key::<String>()? {
                    let msg = match key.as_str() {
                        "setup" => map
                            .next_value::<Option<LiveConfig>>()?
                            .map(LiveClientMessage::Setup),
                        "clientContent" | "client_content" => map
                            .next_value::<Option<ClientContent>>()?
                            .map(LiveClientMessage::ClientContent),
                        "realtimeInput" | "realtime_input" => map
                            .next_value::<Option<RealtimeInput>>()?
                            .map(LiveClientMessage::RealtimeInput),
                        "toolResponse" | "tool_response" => map
                            .next_value::<Option<ToolResponse>>()?
                            .map(LiveClientMessage::ToolResponse),
                        _ => {
                            let value: Value = map.next_value()?;
                            if unknown.is_none() && !value.is_null() {
                                unknown = Some((key, value));
                            }
                            None
                        }
                    };
                    if found.is_none() {
                        found = msg;
                    }
                }
                match (found, unknown) {
                    (Some(m), _) => Ok(m),
                    (None, Some((key, value))) => Ok(LiveClientMessage::Unknown { key, value }),
                    (None, None) => Err(de::Error::custom("no message key in the object")),
                }
            }
        }
        d.deserialize_map(V)
    }
}

impl Serialize for LiveServerMessage {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        match &self.event {
            LiveServerEvent::SetupComplete => {
                m.serialize_entry("setupComplete", &serde_json::Map::new())?;
            }
            LiveServerEvent::ServerContent(c) => m.serialize_entry("serverContent", c)?,
            LiveServerEvent::ToolCall(c) => m.serialize_entry("toolCall", c)?,
            LiveServerEvent::ToolCallCancellation(c) => {
                m.serialize_entry("toolCallCancellation", c)?;
            }
            LiveServerEvent::GoAway(g) => m.serialize_entry("goAway", g)?,
            LiveServerEvent::SessionResumptionUpdate(u) => {
                m.serialize_entry("sessionResumptionUpdate", u)?;
            }
            LiveServerEvent::UsageOnly => {}
            LiveServerEvent::Unknown { key, value } => m.serialize_entry(key, value)?,
        }
        if let Some(u) = &self.usage_metadata {
            m.serialize_entry("usageMetadata", u)?;
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for LiveServerMessage {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = LiveServerMessage;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a Live API server message object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut found: Option<LiveServerEvent> = None;
                let mut unknown: Option<(String, Value)> = None;
                let mut usage: Option<UsageMetadata> = None;
                while let Some(key) = map.next_key::<String>()? {
                    let event = match key.as_str() {
                        "setupComplete" | "setup_complete" => map
                            .next_value::<Option<IgnoredAny>>()?
                            .map(|_| LiveServerEvent::SetupComplete),
                        "serverContent" | "server_content" => map
                            .next_value::<Option<ServerContent>>()?
                            .map(LiveServerEvent::ServerContent),
                        "toolCall" | "tool_call" => map
                            .next_value::<Option<ToolCall>>()?
                            .map(LiveServerEvent::ToolCall),
                        "toolCallCancellation" | "tool_call_cancellation" => map
                            .next_value::<Option<ToolCallCancellation>>()?
                            .map(LiveServerEvent::ToolCallCancellation),
                        "goAway" | "go_away" => map
                            .next_value::<Option<GoAway>>()?
                            .map(LiveServerEvent::GoAway),
                        "sessionResumptionUpdate" | "session_resumption_update" => map
                            .next_value::<Option<SessionResumptionUpdate>>()?
                            .map(LiveServerEvent::SessionResumptionUpdate),
                        "usageMetadata" | "usage_metadata" => {
                            usage = map.next_value()?;
                            None
                        }
                        _ => {
                            let value: Value = map.next_value()?;
                            if unknown.is_none() && !value.is_null() {
                                unknown = Some((key, value));
                            }
                            None
                        }
                    };
                    if found.is_none() {
                        found = event;
                    }
                }
                let event = match (found, unknown, &usage) {
                    (Some(e), _, _) => e,
                    (None, Some((key, value)), _) => LiveServerEvent::Unknown { key, value },
                    (None, None, Some(_)) => LiveServerEvent::UsageOnly,
                    (None, None, None) => {
                        return Err(de::Error::custom("no message key in the object"));
                    }
                };
                Ok(LiveServerMessage {
                    event,
                    usage_metadata: usage,
                })
            }
        }
        d.deserialize_map(V)
    }
}
