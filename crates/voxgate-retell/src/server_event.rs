//! Events the custom-LLM server sends to Retell, tagged by `response_type`.

use std::borrow::Cow;

use serde::ser::Serializer;
use serde::{Deserialize, Serialize};

use crate::de::{null_as_none_value, null_default, starts_object};
use crate::error::{DecodeError, EncodeError};
use crate::retell_event::{UnknownEvent, classify, serialize_unknown};

/// The field that tags server → Retell events.
pub const RESPONSE_TYPE: &str = "response_type";

/// The `config` event's body: sent once at connection open.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ConfigBody {
    /// Ask Retell to ping every 2 s, expect pings back, and reconnect (twice at most) after 5 s
    /// of silence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_reconnect: Option<bool>,
    /// Ask Retell to send a `call_details` event right away.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_details: Option<bool>,
    /// Ask Retell to add `transcript_with_tool_calls` to transcript-bearing events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transcript_with_tool_calls: Option<bool>,
    /// Keys this crate does not know, kept verbatim.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// The `update_agent` event's body: agent settings changed mid-call. All optional.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct AgentConfig {
    /// 0..=1; lower waits longer before answering.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub responsiveness: Option<f64>,
    /// 0..=1; higher lets the user interrupt the agent more easily.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interruption_sensitivity: Option<f64>,
    /// Silence after agent speech (ms) before Retell asks for a reminder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reminder_trigger_ms: Option<f64>,
    /// How many reminders in a row at most; 0 disables reminders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reminder_max_count: Option<u64>,
    /// Keys this crate does not know (Retell says more will come), kept verbatim.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// One chunk of an answer to `response_required` / `reminder_required` (or the begin message,
/// `response_id` 0).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Response {
    /// The request this answers.
    pub response_id: u64,
    /// This chunk's text; empty content with `content_complete` on the begin message means
    /// "wait for the user".
    #[serde(default, deserialize_with = "null_default")]
    pub content: String,
    /// True on the last chunk only.
    #[serde(default, deserialize_with = "null_default")]
    pub content_complete: bool,
    /// The user cannot interrupt this content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_interruption_allowed: Option<bool>,
    /// End the call once this response is fully spoken (dropped if the user interrupts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_call: Option<bool>,
    /// Transfer the call to this number once spoken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfer_number: Option<String>,
    /// Show the original caller's number to the transferee.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub show_transferee_as_caller: Option<bool>,
    /// Press these DTMF digits once spoken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digit_to_press: Option<String>,
}

impl Response {
    /// A plain text chunk for `response_id`.
    pub fn chunk(response_id: u64, content: impl Into<String>, content_complete: bool) -> Self {
        Response {
            response_id,
            content: content.into(),
            content_complete,
            ..Response::default()
        }
    }
}

/// Speech the server pushes in unasked, interrupting whoever is talking.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct AgentInterrupt {
    /// Chosen by the server: the same id appends, a new id discards the previous one.
    pub interrupt_id: u64,
    /// This chunk's text.
    #[serde(default, deserialize_with = "null_default")]
    pub content: String,
    /// True on the last chunk only.
    #[serde(default, deserialize_with = "null_default")]
    pub content_complete: bool,
    /// The user cannot interrupt this content (recommended for interrupts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_interruption_allowed: Option<bool>,
    /// End the call once spoken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_call: Option<bool>,
    /// Transfer the call once spoken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfer_number: Option<String>,
    /// Press these DTMF digits once spoken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digit_to_press: Option<String>,
}

/// Bookkeeping: the server is calling a tool (lets Retell weave it into the transcript).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ToolCallInvocation {
    /// Globally unique id of this call.
    #[serde(default, deserialize_with = "null_default")]
    pub tool_call_id: String,
    /// Function name.
    #[serde(default, deserialize_with = "null_default")]
    pub name: String,
    /// A string holding a JSON object (not an object: the seed's "boolean" is a doc bug).
    #[serde(default, deserialize_with = "null_default")]
    pub arguments: String,
}

/// Bookkeeping: the result of a tool call announced earlier.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ToolCallResult {
    /// The invocation this answers.
    #[serde(default, deserialize_with = "null_default")]
    pub tool_call_id: String,
    /// The result text (often stringified JSON).
    #[serde(default, deserialize_with = "null_default")]
    pub content: String,
}

/// Data Retell forwards to the web-call frontend.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Metadata {
    /// Anything JSON; a null arrives as `None`.
    #[serde(
        default,
        deserialize_with = "null_as_none_value",
        skip_serializing_if = "Option::is_none"
    )]
    pub metadata: Option<serde_json::Value>,
}

/// One event sent by the custom-LLM server to Retell.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ServerEvent {
    /// `config`: reconnection, call details, tool-call transcript.
    Config(ConfigBody),
    /// `update_agent`: change agent settings mid-call.
    UpdateAgent(AgentConfig),
    /// `ping_pong`: keep-alive, usually echoing Retell's timestamp.
    PingPong(crate::PingPong),
    /// `response`: a chunk of an answer (also the legacy form without `response_type`).
    Response(Response),
    /// `agent_interrupt`: speak now.
    AgentInterrupt(AgentInterrupt),
    /// `tool_call_invocation`: transcript bookkeeping.
    ToolCallInvocation(ToolCallInvocation),
    /// `tool_call_result`: transcript bookkeeping.
    ToolCallResult(ToolCallResult),
    /// `metadata`: forwarded to the frontend.
    Metadata(Metadata),
    /// Any other `response_type`.
    Unknown(UnknownEvent),
}

impl ServerEvent {
    /// The event's `response_type` as on the wire.
    pub fn tag(&self) -> &str {
        match self {
            ServerEvent::Config(_) => "config",
            ServerEvent::UpdateAgent(_) => "update_agent",
            ServerEvent::PingPong(_) => "ping_pong",
            ServerEvent::Response(_) => "response",
            ServerEvent::AgentInterrupt(_) => "agent_interrupt",
            ServerEvent::ToolCallInvocation(_) => "tool_call_invocation",
            ServerEvent::ToolCallResult(_) => "tool_call_result",
            ServerEvent::Metadata(_) => "metadata",
            ServerEvent::Unknown(u) => &u.tag,
        }
    }

    /// Decodes one text frame the way a tolerant Retell would.
    ///
    /// Besides the rules of [`crate::RetellEvent::from_json`], an object without
    /// `response_type` but with `response_id` is the pre-2024 form of a `response`.
    pub fn from_json(text: &str) -> Result<Self, DecodeError> {
        Self::from_slice(text.as_bytes())
    }

    /// Decodes one frame from bytes (UTF-8 JSON).
    pub fn from_slice(bytes: &[u8]) -> Result<Self, DecodeError> {
        #[derive(Deserialize)]
        struct Peek<'a> {
            #[serde(borrow, default)]
            response_type: Option<Cow<'a, str>>,
            #[serde(default)]
            response_id: Option<serde::de::IgnoredAny>,
        }
        if !starts_object(bytes) {
            return match serde_json::from_slice::<serde::de::IgnoredAny>(bytes) {
                Err(e) => Err(DecodeError::Syntax(e)),
                Ok(_) => Err(DecodeError::NotAnObject),
            };
        }
        let peek: Peek<'_> =
            serde_json::from_slice(bytes).map_err(|e| classify(e, RESPONSE_TYPE))?;
        let tag = match (peek.response_type, peek.response_id) {
            (Some(tag), _) => tag,
            // Servers written before `response_type` existed send bare responses.
            (None, Some(_)) => Cow::Borrowed("response"),
            (None, None) => return Err(DecodeError::MissingTag(RESPONSE_TYPE)),
        };
        fn typed<'a, T: Deserialize<'a>>(
            b: &'a [u8],
            event: &'static str,
        ) -> Result<T, DecodeError> {
            serde_json::from_slice(b).map_err(|source| DecodeError::Schema { event, source })
        }
        #[derive(Deserialize)]
        struct ConfigEvent {
            #[serde(default, deserialize_with = "null_default")]
            config: ConfigBody,
        }
        #[derive(Deserialize)]
        struct UpdateAgentEvent {
            #[serde(default, deserialize_with = "null_default")]
            agent_config: AgentConfig,
        }
        Ok(match tag.as_ref() {
            "config" => ServerEvent::Config(typed::<ConfigEvent>(bytes, "config")?.config),
            "update_agent" => ServerEvent::UpdateAgent(
                typed::<UpdateAgentEvent>(bytes, "update_agent")?.agent_config,
            ),
            "ping_pong" => ServerEvent::PingPong(typed(bytes, "ping_pong")?),
            "response" => ServerEvent::Response(typed(bytes, "response")?),
            "agent_interrupt" => ServerEvent::AgentInterrupt(typed(bytes, "agent_interrupt")?),
            "tool_call_invocation" => {
                ServerEvent::ToolCallInvocation(typed(bytes, "tool_call_invocation")?)
            }
            "tool_call_result" => ServerEvent::ToolCallResult(typed(bytes, "tool_call_result")?),
            "metadata" => ServerEvent::Metadata(typed(bytes, "metadata")?),
            _ => {
                let mut fields: serde_json::Map<String, serde_json::Value> =
                    serde_json::from_slice(bytes).map_err(|e| classify(e, "unknown"))?;
                fields.remove(RESPONSE_TYPE);
                ServerEvent::Unknown(UnknownEvent {
                    tag: tag.into_owned(),
                    fields,
                })
            }
        })
    }

    /// Encodes the event as one text frame (always the modern, tagged form).
    pub fn to_json(&self) -> Result<String, EncodeError> {
        Ok(serde_json::to_string(self)?)
    }
}

impl Serialize for ServerEvent {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct ConfigEvent<'a> {
            config: &'a ConfigBody,
        }
        #[derive(Serialize)]
        struct UpdateAgentEvent<'a> {
            agent_config: &'a AgentConfig,
        }
        #[derive(Serialize)]
        #[serde(tag = "response_type", rename_all = "snake_case")]
        enum Tagged<'a> {
            Config(ConfigEvent<'a>),
            UpdateAgent(UpdateAgentEvent<'a>),
            PingPong(&'a crate::PingPong),
            Response(&'a Response),
            AgentInterrupt(&'a AgentInterrupt),
            ToolCallInvocation(&'a ToolCallInvocation),
            ToolCallResult(&'a ToolCallResult),
            Metadata(&'a Metadata),
        }
        match self {
            ServerEvent::Config(config) => Tagged::Config(ConfigEvent { config }).serialize(s),
            ServerEvent::UpdateAgent(agent_config) => {
                Tagged::UpdateAgent(UpdateAgentEvent { agent_config }).serialize(s)
            }
            ServerEvent::PingPong(b) => Tagged::PingPong(b).serialize(s),
            ServerEvent::Response(b) => Tagged::Response(b).serialize(s),
            ServerEvent::AgentInterrupt(b) => Tagged::AgentInterrupt(b).serialize(s),
            ServerEvent::ToolCallInvocation(b) => Tagged::ToolCallInvocation(b).serialize(s),
            ServerEvent::ToolCallResult(b) => Tagged::ToolCallResult(b).serialize(s),
            ServerEvent::Metadata(b) => Tagged::Metadata(b).serialize(s),
            ServerEvent::Unknown(u) => serialize_unknown(s, RESPONSE_TYPE, u),
        }
    }
}
