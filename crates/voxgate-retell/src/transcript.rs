//! Transcript utterances, words and the tool-call-weaved transcript items.

use std::fmt;

use compact_str::CompactString;
use serde::de::{self, Deserializer, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};

use crate::de::null_default;

/// Who spoke an utterance. Roles Retell adds later are kept as [`Role::Other`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Role {
    /// The voice agent (our server's words, as spoken).
    Agent,
    /// The caller.
    User,
    /// A role this crate does not know yet, kept verbatim.
    Other(String),
}

impl Role {
    /// The role as it appears on the wire.
    pub fn as_str(&self) -> &str {
        match self {
            Role::Agent => "agent",
            Role::User => "user",
            Role::Other(s) => s,
        }
    }

    /// Reads a role from its wire spelling; unknown spellings become [`Role::Other`].
    pub fn from_wire(s: &str) -> Self {
        match s {
            "agent" => Role::Agent,
            "user" => Role::User,
            other => Role::Other(other.to_owned()),
        }
    }
}

impl Default for Role {
    /// A missing or null role is unknown, not silently the agent's.
    fn default() -> Self {
        Role::Other(String::new())
    }
}

impl Serialize for Role {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Role {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Role;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a role string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Role, E> {
                Ok(Role::from_wire(v))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Role, E> {
                Ok(Role::Other(String::new()))
            }
        }
        d.deserialize_any(V)
    }
}

/// One recognised word with its timing in seconds since the call started.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Word {
    /// The word as transcribed (may carry punctuation).
    ///
    /// A [`CompactString`]: words of up to 24 bytes (all but freak ones) are stored inline, so
    /// a transcript's hundreds of words cost no allocation each. It derefs to `&str`, compares
    /// with `&str` and `String`, and converts from both (`"hi".into()`).
    #[serde(default, deserialize_with = "null_default")]
    pub word: CompactString,
    /// Start time in seconds.
    #[serde(default, deserialize_with = "null_default")]
    pub start: f64,
    /// End time in seconds.
    #[serde(default, deserialize_with = "null_default")]
    pub end: f64,
}

/// One turn of speech in Retell's transcript. Every event carries the full transcript so far.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Utterance {
    /// Who spoke.
    #[serde(default)]
    pub role: Role,
    /// What was said.
    #[serde(default, deserialize_with = "null_default")]
    pub content: String,
    /// Word timings, when Retell includes them.
    #[serde(
        default,
        deserialize_with = "words",
        skip_serializing_if = "Option::is_none"
    )]
    pub words: Option<Vec<Word>>,
}

/// Reads word lists with room for a typical utterance up front: JSON gives no length, and
/// growing from empty costs several reallocations per utterance on the hottest path.
fn words<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<Word>>, D::Error> {
    struct Seq;
    impl<'de> Visitor<'de> for Seq {
        type Value = Vec<Word>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list of words")
        }
        fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Word>, A::Error> {
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(16).min(1024));
            while let Some(w) = seq.next_element()? {
                out.push(w);
            }
            Ok(out)
        }
    }
    struct Opt;
    impl<'de> Visitor<'de> for Opt {
        type Value = Option<Vec<Word>>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list of words or null")
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_seq(Seq).map(Some)
        }
    }
    d.deserialize_option(Opt)
}

impl Word {
    /// A word with its start and end in seconds.
    pub fn new(word: impl Into<CompactString>, start: f64, end: f64) -> Self {
        Word {
            word: word.into(),
            start,
            end,
        }
    }
}

impl Utterance {
    /// An utterance without word timings.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Utterance {
            role,
            content: content.into(),
            words: None,
        }
    }
}

/// One entry of `transcript_with_tool_calls`: speech woven with the tool calls the server
/// reported. Unknown roles (Retell adds e.g. DTMF or node transitions) keep all their fields.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum TranscriptItem {
    /// Speech by the agent or the user.
    Utterance(Utterance),
    /// A tool call the server announced with a `tool_call_invocation` event.
    ToolCallInvocation {
        /// The id the server chose.
        tool_call_id: String,
        /// The function name.
        name: String,
        /// The arguments: a string holding a JSON object.
        arguments: String,
    },
    /// The result the server reported with a `tool_call_result` event.
    ToolCallResult {
        /// The id of the invocation this answers.
        tool_call_id: String,
        /// The result text.
        content: String,
    },
    /// A role this crate does not know, with every other field kept.
    Other {
        /// The role as on the wire.
        role: String,
        /// The item's other fields.
        fields: serde_json::Map<String, serde_json::Value>,
    },
}

const TOOL_INVOCATION: &str = "tool_call_invocation";
const TOOL_RESULT: &str = "tool_call_result";

impl Serialize for TranscriptItem {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            TranscriptItem::Utterance(u) => u.serialize(s),
            TranscriptItem::ToolCallInvocation {
                tool_call_id,
                name,
                arguments,
            } => {
                let mut m = s.serialize_map(Some(4))?;
                m.serialize_entry("role", TOOL_INVOCATION)?;
                m.serialize_entry("tool_call_id", tool_call_id)?;
                m.serialize_entry("name", name)?;
                m.serialize_entry("arguments", arguments)?;
                m.end()
            }
            TranscriptItem::ToolCallResult {
                tool_call_id,
                content,
            } => {
                let mut m = s.serialize_map(Some(3))?;
                m.serialize_entry("role", TOOL_RESULT)?;
                m.serialize_entry("tool_call_id", tool_call_id)?;
                m.serialize_entry("content", content)?;
                m.end()
            }
            TranscriptItem::Other { role, fields } => {
                let mut m = s.serialize_map(Some(fields.len() + 1))?;
                m.serialize_entry("role", role)?;
                for (k, v) in fields.iter().filter(|(k, _)| k.as_str() != "role") {
                    m.serialize_entry(k, v)?;
                }
                m.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for TranscriptItem {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Not a hot path (only sent when the server opts in), so a detour through a map buys
        // simple code that keeps every field of roles we do not know.
        let mut fields = serde_json::Map::<String, serde_json::Value>::deserialize(d)?;
        let role = match fields.get("role") {
            Some(serde_json::Value::String(r)) => r.clone(),
            _ => String::new(),
        };
        let mut take = |key: &str| -> String {
            match fields.remove(key) {
                Some(serde_json::Value::String(s)) => s,
                Some(serde_json::Value::Null) | None => String::new(),
                // A non-string in a string slot: keep it readable rather than lose it.
                Some(other) => other.to_string(),
            }
        };
        match role.as_str() {
            TOOL_INVOCATION => Ok(TranscriptItem::ToolCallInvocation {
                tool_call_id: take("tool_call_id"),
                name: take("name"),
                arguments: take("arguments"),
            }),
            TOOL_RESULT => Ok(TranscriptItem::ToolCallResult {
                tool_call_id: take("tool_call_id"),
                content: take("content"),
            }),
            "agent" | "user" => serde_json::from_value(serde_json::Value::Object(fields))
                .map(TranscriptItem::Utterance)
                .map_err(de::Error::custom),
            _ => {
                fields.remove("role");
                Ok(TranscriptItem::Other { role, fields })
            }
        }
    }
}

/// Which side's turn begins, sent in `update_only` when the speaker changes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TurnTaking {
    /// The agent is about to speak.
    AgentTurn,
    /// The user has started to speak.
    UserTurn,
    /// A value this crate does not know, kept verbatim.
    Other(String),
}

impl TurnTaking {
    /// The value as on the wire.
    pub fn as_str(&self) -> &str {
        match self {
            TurnTaking::AgentTurn => "agent_turn",
            TurnTaking::UserTurn => "user_turn",
            TurnTaking::Other(s) => s,
        }
    }

    /// Reads a value from its wire spelling; unknown spellings become [`TurnTaking::Other`].
    pub fn from_wire(s: &str) -> Self {
        match s {
            "agent_turn" => TurnTaking::AgentTurn,
            "user_turn" => TurnTaking::UserTurn,
            other => TurnTaking::Other(other.to_owned()),
        }
    }
}

impl Serialize for TurnTaking {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for TurnTaking {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = TurnTaking;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a turn-taking string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<TurnTaking, E> {
                Ok(TurnTaking::from_wire(v))
            }
        }
        d.deserialize_str(V)
    }
}
