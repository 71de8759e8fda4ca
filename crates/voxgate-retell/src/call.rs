//! The call object of `call_details`.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::de::{null_as_none_value, null_default};

/// The kind of call. Kinds this crate does not know are kept as [`CallType::Other`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum CallType {
    /// A telephone call (then `direction`, `from_number` and `to_number` are set).
    PhoneCall,
    /// A browser call through Retell's web SDK.
    WebCall,
    /// A kind this crate does not know (or an empty/missing one), verbatim.
    Other(String),
    /// The field was missing or null.
    #[default]
    Unspecified,
}

impl CallType {
    /// The value as on the wire.
    pub fn as_str(&self) -> &str {
        match self {
            CallType::PhoneCall => "phone_call",
            CallType::WebCall => "web_call",
            CallType::Other(s) => s,
            CallType::Unspecified => "",
        }
    }

    /// Whether the field was missing or null.
    pub fn is_unspecified(&self) -> bool {
        matches!(self, CallType::Unspecified)
    }
}

impl Serialize for CallType {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for CallType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = Option::<String>::deserialize(d)?;
        Ok(match s.as_deref() {
            None | Some("") => CallType::Unspecified,
            Some("phone_call") => CallType::PhoneCall,
            Some("web_call") => CallType::WebCall,
            Some(_) => CallType::Other(s.unwrap_or_default()),
        })
    }
}

/// The call object Retell sends in `call_details` (the Register Call API response).
///
/// Retell adds fields often, so every key this crate does not model is kept in
/// [`Call::extra`] and written back out on encode.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Call {
    /// The call id; also the last path segment of the WebSocket URL.
    #[serde(default, deserialize_with = "null_default")]
    pub call_id: String,
    /// The Retell agent handling the call.
    #[serde(default, deserialize_with = "null_default")]
    pub agent_id: String,
    /// E.g. `registered`, `ongoing`, `ended` (kept as text: Retell adds states).
    #[serde(default, deserialize_with = "null_default")]
    pub call_status: String,
    /// Phone or web call.
    #[serde(default, skip_serializing_if = "CallType::is_unspecified")]
    pub call_type: CallType,
    /// `inbound` or `outbound` for phone calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direction: Option<String>,
    /// Caller number (E.164) for phone calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_number: Option<String>,
    /// Callee number (E.164) for phone calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_number: Option<String>,
    /// Arbitrary metadata attached when the call was created.
    #[serde(
        default,
        deserialize_with = "null_as_none_value",
        skip_serializing_if = "Option::is_none"
    )]
    pub metadata: Option<serde_json::Value>,
    /// Variables for prompt templating, all strings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retell_llm_dynamic_variables: Option<BTreeMap<String, String>>,
    /// Every other key, kept verbatim.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}
