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

/// How much of a [`Call`] a server keeps: Retell's real `call_details` are a few KiB, but a
/// socket can send any `metadata`, any number of dynamic variables and any extra keys, and a
/// server keeps the call for its whole life and its resume window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallBounds {
    /// Largest `metadata`, as compact JSON.
    pub max_metadata_bytes: usize,
    /// Most dynamic variables.
    pub max_variables: usize,
    /// Largest dynamic variable, name and value together.
    pub max_variable_bytes: usize,
    /// Largest set of unmodelled keys ([`Call::extra`]) together, as compact JSON.
    pub max_extra_bytes: usize,
}

impl Default for CallBounds {
    /// 16 KiB of metadata, 64 variables of at most 4 KiB, 16 KiB of other keys: about
    /// 300 KiB at most per call.
    fn default() -> Self {
        Self {
            max_metadata_bytes: 16 * 1024,
            max_variables: 64,
            max_variable_bytes: 4 * 1024,
            max_extra_bytes: 16 * 1024,
        }
    }
}

impl Call {
    /// Drops what exceeds `bounds`: `metadata` and the unmodelled keys whole when too large,
    /// dynamic variables that are too large or beyond the count (in name order). Returns
    /// what was dropped, for a log line; empty when the call was within bounds.
    pub fn cap(&mut self, bounds: &CallBounds) -> Vec<String> {
        let mut dropped = Vec::new();
        if let Some(m) = &self.metadata {
            let n = json_len(m);
            if n > bounds.max_metadata_bytes {
                dropped.push(format!("metadata ({n} bytes)"));
                self.metadata = None;
            }
        }
        if let Some(vars) = &mut self.retell_llm_dynamic_variables {
            let before = vars.len();
            vars.retain(|k, v| k.len() + v.len() <= bounds.max_variable_bytes);
            let large = before - vars.len();
            if large > 0 {
                dropped.push(format!(
                    "{large} dynamic variables over {} bytes",
                    bounds.max_variable_bytes
                ));
            }
            if vars.len() > bounds.max_variables {
                let extra: Vec<String> = vars.keys().skip(bounds.max_variables).cloned().collect();
                for k in &extra {
                    vars.remove(k);
                }
                dropped.push(format!(
                    "{} dynamic variables beyond {}",
                    extra.len(),
                    bounds.max_variables
                ));
            }
        }
        if !self.extra.is_empty() {
            let n = json_len(&self.extra);
            if n > bounds.max_extra_bytes {
                dropped.push(format!("{} other keys ({n} bytes)", self.extra.len()));
                self.extra.clear();
            }
        }
        dropped
    }
}

/// Compact JSON length of a value, counted without building the text.
fn json_len<T: Serialize>(value: &T) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Counter(0);
    // Writing a JSON value or map to a counter cannot fail.
    let _ = serde_json::to_writer(&mut c, value);
    c.0
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn cap_drops_only_what_exceeds_the_bounds() {
        let small = CallBounds {
            max_metadata_bytes: 20,
            max_variables: 2,
            max_variable_bytes: 10,
            max_extra_bytes: 30,
        };
        let mut call: Call = serde_json::from_value(serde_json::json!({
            "call_id": "c1",
            "metadata": {"k": "v"},
            "retell_llm_dynamic_variables": {"a": "1", "b": "2", "c": "3", "long": "x".repeat(20)},
            "custom": "y".repeat(40),
        }))
        .unwrap();
        let within = call.clone();
        assert!(within.clone().cap(&CallBounds::default()).is_empty());
        let dropped = call.cap(&small);
        assert_eq!(dropped.len(), 3, "{dropped:?}");
        assert_eq!(call.metadata, within.metadata, "small metadata kept");
        let vars = call.retell_llm_dynamic_variables.as_ref().unwrap();
        assert_eq!(vars.keys().collect::<Vec<_>>(), ["a", "b"]);
        assert!(call.extra.is_empty());
        assert_eq!(call.call_id, "c1");
        let mut big: Call = serde_json::from_value(serde_json::json!({
            "metadata": {"k": "v".repeat(100)}
        }))
        .unwrap();
        assert_eq!(big.cap(&small), ["metadata (108 bytes)"]);
        assert_eq!(big.metadata, None);
    }
}
