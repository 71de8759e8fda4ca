//! Events Retell sends to the custom-LLM server, tagged by `interaction_type`.

use std::borrow::Cow;

use serde::ser::{SerializeMap, Serializer};

use serde::{Deserialize, Serialize};

use crate::call::Call;
use crate::de::{null_default, starts_object};
use crate::error::{DecodeError, EncodeError};
use crate::transcript::{TranscriptItem, TurnTaking, Utterance};

/// The field that tags Retell → server events.
pub const INTERACTION_TYPE: &str = "interaction_type";

/// A keep-alive ping; answer it with a [`crate::ServerEvent::PingPong`] echoing `timestamp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PingPong {
    /// Milliseconds since the Unix epoch on the sender's clock.
    #[serde(default, deserialize_with = "null_default")]
    pub timestamp: u64,
}

/// Details of the call, sent once when the server's config asked for them.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct CallDetails {
    /// The call object, unknown keys kept.
    #[serde(default, deserialize_with = "null_default")]
    pub call: Call,
}

/// Live transcript or turn-taking news; no answer expected, and it does not make a pending
/// request stale.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct UpdateOnly {
    /// The complete transcript so far (not a delta).
    #[serde(default, deserialize_with = "null_default")]
    pub transcript: Vec<Utterance>,
    /// The transcript woven with tool calls, when the server's config asked for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transcript_with_tool_calls: Option<Vec<TranscriptItem>>,
    /// Present when the speaker changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turntaking: Option<TurnTaking>,
}

/// A request for content: the body of both `response_required` and `reminder_required`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ResponseRequest {
    /// Increases with every request; answers carry it back. A higher id makes older ones stale.
    pub response_id: u64,
    /// The complete transcript so far.
    #[serde(default, deserialize_with = "null_default")]
    pub transcript: Vec<Utterance>,
    /// The transcript woven with tool calls, when the server's config asked for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transcript_with_tool_calls: Option<Vec<TranscriptItem>>,
}

/// An event type this crate does not know, kept whole so nothing is lost.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UnknownEvent {
    /// The tag value as on the wire.
    pub tag: String,
    /// Every field except the tag.
    pub fields: serde_json::Map<String, serde_json::Value>,
}

/// One event sent by Retell to the custom-LLM server.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum RetellEvent {
    /// `ping_pong`: keep-alive (only with `auto_reconnect`).
    PingPong(PingPong),
    /// `call_details`: the call object (only with `call_details` in the config). Boxed: the
    /// call object is large and arrives once per call.
    CallDetails(Box<CallDetails>),
    /// `update_only`: transcript and turn-taking news.
    UpdateOnly(UpdateOnly),
    /// `response_required`: the agent should answer now.
    ResponseRequired(ResponseRequest),
    /// `reminder_required`: the user has been silent; say something.
    ReminderRequired(ResponseRequest),
    /// Any other `interaction_type`.
    Unknown(UnknownEvent),
}

impl RetellEvent {
    /// The event's `interaction_type` as on the wire.
    pub fn tag(&self) -> &str {
        match self {
            RetellEvent::PingPong(_) => "ping_pong",
            RetellEvent::CallDetails(_) => "call_details",
            RetellEvent::UpdateOnly(_) => "update_only",
            RetellEvent::ResponseRequired(_) => "response_required",
            RetellEvent::ReminderRequired(_) => "reminder_required",
            RetellEvent::Unknown(u) => &u.tag,
        }
    }

    /// Decodes one text frame.
    ///
    /// Explicit `null`s count as absent, unknown fields are ignored and unknown event types
    /// become [`RetellEvent::Unknown`]. Never panics.
    ///
    /// Transcript events in the shape Retell writes them take a single-pass reader; anything
    /// else (and anything unusual in them) takes serde, with the same result.
    pub fn from_json(text: &str) -> Result<Self, DecodeError> {
        match crate::fast::decode(text) {
            Some(ev) => Ok(ev),
            None => Self::by_serde(text),
        }
    }

    /// Decodes one frame from bytes (UTF-8 JSON).
    ///
    /// As fast as [`Self::from_json`]: the whole frame is checked for UTF-8 once (cheaper than
    /// serde_json's string-by-string check while it reads bytes), and then read as text.
    pub fn from_slice(bytes: &[u8]) -> Result<Self, DecodeError> {
        match std::str::from_utf8(bytes) {
            Ok(text) => Self::from_json(text),
            // Not UTF-8, so not JSON either: serde says where it breaks.
            Err(_) => Self::two_pass(bytes),
        }
    }

    /// [`Self::from_json`] without the single-pass reader, for the fuzz target to compare.
    #[cfg(fuzzing)]
    #[doc(hidden)]
    pub fn from_json_by_serde(text: &str) -> Result<Self, DecodeError> {
        Self::by_serde(text)
    }

    /// The serde decoder: one pass when the tag comes first (Retell writes it first), two
    /// otherwise, which also produces the precise errors.
    pub(crate) fn by_serde(text: &str) -> Result<Self, DecodeError> {
        if let Ok(TagFirst(Some(ev))) = serde_json::from_str::<TagFirst>(text) {
            return Ok(ev);
        }
        Self::two_pass(text.as_bytes())
    }

    fn two_pass(bytes: &[u8]) -> Result<Self, DecodeError> {
        #[derive(Deserialize)]
        struct Peek<'a> {
            #[serde(borrow, default)]
            interaction_type: Option<Cow<'a, str>>,
        }
        if !starts_object(bytes) {
            // Let serde say what is wrong with non-JSON; valid non-objects get their own error.
            return match serde_json::from_slice::<serde::de::IgnoredAny>(bytes) {
                Err(e) => Err(DecodeError::Syntax(e)),
                Ok(_) => Err(DecodeError::NotAnObject),
            };
        }
        let peek: Peek<'_> =
            serde_json::from_slice(bytes).map_err(|e| classify(e, INTERACTION_TYPE))?;
        let Some(tag) = peek.interaction_type else {
            return Err(DecodeError::MissingTag(INTERACTION_TYPE));
        };
        fn typed<'a, T: Deserialize<'a>>(
            b: &'a [u8],
            event: &'static str,
        ) -> Result<T, DecodeError> {
            serde_json::from_slice(b).map_err(|source| DecodeError::Schema { event, source })
        }
        Ok(match tag.as_ref() {
            "ping_pong" => RetellEvent::PingPong(typed(bytes, "ping_pong")?),
            "call_details" => RetellEvent::CallDetails(Box::new(typed(bytes, "call_details")?)),
            "update_only" => RetellEvent::UpdateOnly(typed(bytes, "update_only")?),
            "response_required" => {
                RetellEvent::ResponseRequired(typed(bytes, "response_required")?)
            }
            "reminder_required" => {
                RetellEvent::ReminderRequired(typed(bytes, "reminder_required")?)
            }
            _ => {
                let mut fields: serde_json::Map<String, serde_json::Value> =
                    serde_json::from_slice(bytes).map_err(|e| classify(e, "unknown"))?;
                fields.remove(INTERACTION_TYPE);
                RetellEvent::Unknown(UnknownEvent {
                    tag: tag.into_owned(),
                    fields,
                })
            }
        })
    }

    /// Encodes the event as one text frame.
    pub fn to_json(&self) -> Result<String, EncodeError> {
        Ok(serde_json::to_string(self)?)
    }
}

/// Splits serde errors into "not JSON" and "JSON of the wrong shape".
pub(crate) fn classify(e: serde_json::Error, event: &'static str) -> DecodeError {
    match e.classify() {
        serde_json::error::Category::Data => DecodeError::Schema { event, source: e },
        _ => DecodeError::Syntax(e),
    }
}

/// Writes `{tag_key: tag, ...fields}` for an event type this crate does not know.
pub(crate) fn serialize_unknown<S: Serializer>(
    s: S,
    tag_key: &str,
    u: &UnknownEvent,
) -> Result<S::Ok, S::Error> {
    let mut m = s.serialize_map(None)?;
    m.serialize_entry(tag_key, &u.tag)?;
    for (k, v) in u.fields.iter().filter(|(k, _)| k.as_str() != tag_key) {
        m.serialize_entry(k, v)?;
    }
    m.end()
}

impl Serialize for RetellEvent {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        #[serde(tag = "interaction_type", rename_all = "snake_case")]
        enum Tagged<'a> {
            PingPong(&'a PingPong),
            CallDetails(&'a CallDetails),
            UpdateOnly(&'a UpdateOnly),
            ResponseRequired(&'a ResponseRequest),
            ReminderRequired(&'a ResponseRequest),
        }
        match self {
            RetellEvent::PingPong(b) => Tagged::PingPong(b).serialize(s),
            RetellEvent::CallDetails(b) => Tagged::CallDetails(b).serialize(s),
            RetellEvent::UpdateOnly(b) => Tagged::UpdateOnly(b).serialize(s),
            RetellEvent::ResponseRequired(b) => Tagged::ResponseRequired(b).serialize(s),
            RetellEvent::ReminderRequired(b) => Tagged::ReminderRequired(b).serialize(s),
            RetellEvent::Unknown(u) => serialize_unknown(s, INTERACTION_TYPE, u),
        }
    }
}

/// One-pass decode of a frame whose first key is `interaction_type`; `None` when it is not
/// (the caller then takes the two-pass path, which also produces the precise errors).
struct TagFirst(Option<RetellEvent>);

/// Which event a tag names, read without allocating for the known ones.
enum Kind {
    PingPong,
    CallDetails,
    UpdateOnly,
    ResponseRequired,
    ReminderRequired,
    Other(String),
}

impl<'de> Deserialize<'de> for Kind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Kind;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an event type")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Kind, E> {
                Ok(match v {
                    "ping_pong" => Kind::PingPong,
                    "call_details" => Kind::CallDetails,
                    "update_only" => Kind::UpdateOnly,
                    "response_required" => Kind::ResponseRequired,
                    "reminder_required" => Kind::ReminderRequired,
                    other => Kind::Other(other.to_owned()),
                })
            }
        }
        d.deserialize_str(V)
    }
}

/// A map key compared with `interaction_type` without allocating.
struct IsTag(bool);

impl<'de> Deserialize<'de> for IsTag {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = IsTag;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<IsTag, E> {
                Ok(IsTag(v == INTERACTION_TYPE))
            }
        }
        d.deserialize_str(V)
    }
}

impl<'de> Deserialize<'de> for TagFirst {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = TagFirst;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an event object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<TagFirst, A::Error> {
                use serde::de::IgnoredAny;
                use serde::de::value::MapAccessDeserializer as Rest;
                let tag_first = matches!(map.next_key::<IsTag>()?, Some(IsTag(true)));
                let kind = if tag_first {
                    map.next_value::<Option<Kind>>()?
                } else {
                    None
                };
                let Some(kind) = kind else {
                    // Not our shape: finish the object so serde_json stays happy, then fall back.
                    if !tag_first {
                        map.next_value::<IgnoredAny>().ok();
                    }
                    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                    return Ok(TagFirst(None));
                };
                let rest = Rest::new(map);
                Ok(TagFirst(Some(match kind {
                    Kind::PingPong => RetellEvent::PingPong(PingPong::deserialize(rest)?),
                    Kind::CallDetails => {
                        RetellEvent::CallDetails(Box::new(CallDetails::deserialize(rest)?))
                    }
                    Kind::UpdateOnly => RetellEvent::UpdateOnly(UpdateOnly::deserialize(rest)?),
                    Kind::ResponseRequired => {
                        RetellEvent::ResponseRequired(ResponseRequest::deserialize(rest)?)
                    }
                    Kind::ReminderRequired => {
                        RetellEvent::ReminderRequired(ResponseRequest::deserialize(rest)?)
                    }
                    Kind::Other(tag) => {
                        let mut fields = serde_json::Map::deserialize(rest)?;
                        fields.remove(INTERACTION_TYPE);
                        RetellEvent::Unknown(UnknownEvent { tag, fields })
                    }
                })))
            }
        }
        d.deserialize_map(V)
    }
}
