//! Reading fields out of a decoded JSON object, and writing objects with `type` first.
//!
//! Decoding goes through [`serde_json::Value`] (the message is at most 64 KiB, and
//! `serde_json` stops nesting at 128 levels) so every refusal can name the field it refers to.

use serde::Serialize;
use serde_json::{Map, Value};

use crate::error::{ErrorCode, ErrorPayload, Violation};

/// A refused field: JSON Pointer and what is wrong.
#[derive(Debug)]
pub(crate) struct Bad {
    pub(crate) path: String,
    pub(crate) message: String,
}

impl Bad {
    pub(crate) fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Bad {
            path: path.into(),
            message: message.into(),
        }
    }
}

/// `/key` as a JSON Pointer segment (RFC 6901 escapes).
pub(crate) fn pointer(base: &str, key: &str) -> String {
    let key = key.replace('~', "~0").replace('/', "~1");
    format!("{base}/{key}")
}

/// The JSON type of a value, for messages.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// One JSON object's fields, with the path it sits at. Explicit `null` reads as absent.
pub(crate) struct Fields<'a> {
    pub(crate) map: &'a Map<String, Value>,
    pub(crate) base: String,
}

impl<'a> Fields<'a> {
    pub(crate) fn new(map: &'a Map<String, Value>, base: impl Into<String>) -> Self {
        Fields {
            map,
            base: base.into(),
        }
    }

    pub(crate) fn path(&self, key: &str) -> String {
        pointer(&self.base, key)
    }

    /// The value, `None` when absent or `null`.
    pub(crate) fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn missing(&self, key: &str) -> Bad {
        Bad::new(self.path(key), "required")
    }

    fn wrong(&self, key: &str, want: &str, got: &Value) -> Bad {
        Bad::new(self.path(key), format!("must be {want}, not {}", kind(got)))
    }

    /// A string of at most `max` bytes, or absent.
    pub(crate) fn str_opt(&self, key: &str, max: usize) -> Result<Option<&'a str>, Bad> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) if s.len() > max => Err(Bad::new(
                self.path(key),
                format!("is {} bytes, more than the maximum of {max}", s.len()),
            )),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(self.wrong(key, "a string", other)),
        }
    }

    /// A required string of at most `max` bytes.
    pub(crate) fn str_req(&self, key: &str, max: usize) -> Result<&'a str, Bad> {
        self.str_opt(key, max)?.ok_or_else(|| self.missing(key))
    }

    /// A required string that is an id: 1 to `max` bytes, no control characters.
    pub(crate) fn id_req(&self, key: &str, max: usize) -> Result<&'a str, Bad> {
        let s = self.str_req(key, max)?;
        check_id(s, max).map_err(|m| Bad::new(self.path(key), m))?;
        Ok(s)
    }

    /// A string cut to `max` bytes (at a character boundary), or absent.
    pub(crate) fn str_cut(&self, key: &str, max: usize) -> Result<Option<&'a str>, Bad> {
        self.str_opt(key, usize::MAX)
            .map(|s| s.map(|s| truncate(s, max)))
    }

    /// A required unsigned integer.
    pub(crate) fn u64_req(&self, key: &str) -> Result<u64, Bad> {
        self.u64_opt(key)?.ok_or_else(|| self.missing(key))
    }

    /// An unsigned integer, or absent.
    pub(crate) fn u64_opt(&self, key: &str) -> Result<Option<u64>, Bad> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.wrong(key, "an unsigned integer", v)),
        }
    }

    /// A required boolean.
    pub(crate) fn bool_req(&self, key: &str) -> Result<bool, Bad> {
        match self.get(key) {
            None => Err(self.missing(key)),
            Some(Value::Bool(b)) => Ok(*b),
            Some(other) => Err(self.wrong(key, "a boolean", other)),
        }
    }

    /// An object, or absent.
    pub(crate) fn obj_opt(&self, key: &str) -> Result<Option<Fields<'a>>, Bad> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(map)) => Ok(Some(Fields::new(map, self.path(key)))),
            Some(other) => Err(self.wrong(key, "an object", other)),
        }
    }

    /// A required object.
    pub(crate) fn obj_req(&self, key: &str) -> Result<Fields<'a>, Bad> {
        self.obj_opt(key)?.ok_or_else(|| self.missing(key))
    }

    /// An [`ErrorPayload`] spread over this object's own fields (`code`, `message`,
    /// `details`): `code` required, `message` empty when absent.
    pub(crate) fn error_payload(&self) -> Result<ErrorPayload, Bad> {
        let code = self.str_req("code", usize::MAX)?;
        let message = self.str_opt("message", usize::MAX)?.unwrap_or_default();
        let mut details = Vec::new();
        match self.get("details") {
            None => {}
            Some(Value::Array(items)) => {
                let base = self.path("details");
                for (i, item) in items.iter().enumerate() {
                    let at = format!("{base}/{i}");
                    let Value::Object(map) = item else {
                        return Err(Bad::new(
                            at,
                            format!("must be an object, not {}", kind(item)),
                        ));
                    };
                    let f = Fields::new(map, at);
                    details.push(Violation::new(
                        f.str_opt("path", usize::MAX)?.unwrap_or_default(),
                        f.str_opt("message", usize::MAX)?.unwrap_or_default(),
                    ));
                }
            }
            Some(other) => return Err(self.wrong("details", "an array", other)),
        }
        Ok(ErrorPayload {
            code: ErrorCode::parse(code),
            message: message.to_owned(),
            details,
        })
    }
}

/// Ids are 1 to `max` bytes without control characters (they end up in logs and prompts).
pub(crate) fn check_id(s: &str, max: usize) -> Result<(), String> {
    if s.is_empty() {
        Err("must not be empty".to_owned())
    } else if s.len() > max {
        Err(format!(
            "is {} bytes, more than the maximum of {max}",
            s.len()
        ))
    } else if s.chars().any(char::is_control) {
        Err("must not contain control characters".to_owned())
    } else {
        Ok(())
    }
}

/// `s` cut to at most `max` bytes at a character boundary.
pub(crate) fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Compact JSON of `v`. Serializing a `Value`, a string or a derived struct cannot fail; the
/// fallback keeps the output valid JSON if that ever changes.
pub(crate) fn json<T: Serialize + ?Sized>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "null".to_owned())
}

/// Writes one message object with `type` first and fields in a fixed order, so the wire text
/// is stable (snapshots, logs) without serde_json's `preserve_order`.
pub(crate) struct Writer {
    out: String,
    first: bool,
}

impl Writer {
    /// An object whose first field is `type`.
    pub(crate) fn new(type_name: &str) -> Self {
        Writer::object().field("type", type_name)
    }

    /// An empty object (a nested one).
    pub(crate) fn object() -> Self {
        let mut out = String::with_capacity(64);
        out.push('{');
        Writer { out, first: true }
    }

    /// Appends `"name":<json>`; `name` is a fixed ASCII field name, never escaped.
    pub(crate) fn field<T: Serialize + ?Sized>(mut self, name: &str, v: &T) -> Self {
        self.raw(name, &json(v));
        self
    }

    /// Appends `"name":<raw>` where `raw` is already JSON.
    pub(crate) fn raw(&mut self, name: &str, raw: &str) {
        if !self.first {
            self.out.push(',');
        }
        self.first = false;
        self.out.push('"');
        self.out.push_str(name);
        self.out.push_str("\":");
        self.out.push_str(raw);
    }

    /// Appends a nested object already written.
    pub(crate) fn raw_obj(mut self, name: &str, raw: &str) -> Self {
        self.raw(name, raw);
        self
    }

    /// Appends an error payload's fields flat (`code`, `message`, `details` when not empty).
    pub(crate) fn payload_fields(mut self, p: &ErrorPayload) -> Self {
        self = self.field("code", &p.code).field("message", &p.message);
        if !p.details.is_empty() {
            self = self.field("details", &p.details);
        }
        self
    }

    pub(crate) fn finish(mut self) -> String {
        self.out.push('}');
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_keeps_whole_characters() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("héllo", 3), "hé");
        assert_eq!(truncate("abc", 10), "abc");
    }

    #[test]
    fn pointer_escapes() {
        assert_eq!(pointer("/actions", "a/b~c"), "/actions/a~1b~0c");
    }

    #[test]
    fn ids_are_checked() {
        assert!(check_id("", 8).is_err());
        assert!(check_id("a\nb", 8).is_err());
        assert!(check_id("123456789", 8).is_err());
        assert!(check_id("open_settings", 128).is_ok());
    }
}
