//! Argument validation against a tool's JSON Schema, and the standard error payload.

use std::fmt;
use std::sync::Arc;

use serde::{Serialize, Serializer};
use serde_json::Value;

use crate::model::CallToolResult;

/// How many violations an error payload lists; the model needs the first few, not hundreds.
const MAX_VIOLATIONS: usize = 8;

/// A JSON Schema compiled once, so validating a call costs well under a microsecond for a
/// typical tool. Cheap to clone (shared).
#[derive(Clone)]
pub struct CompiledSchema {
    validator: Arc<jsonschema::Validator>,
}

impl fmt::Debug for CompiledSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CompiledSchema")
    }
}

/// A schema that cannot be compiled (bad keyword values, or a `$ref` to another document:
/// remote and file references are deliberately not resolved).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid JSON Schema: {0}")]
pub struct SchemaError(pub String);

/// One way the arguments break the schema.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// JSON Pointer to the offending value (`""` for the whole arguments object).
    pub path: String,
    /// What is wrong, in words.
    pub message: String,
}

impl CompiledSchema {
    /// Compiles a schema. The draft is read from `$schema`; without one, 2020-12 (MCP's default).
    pub fn compile(schema: &Value) -> Result<Self, SchemaError> {
        jsonschema::validator_for(schema)
            .map(|v| CompiledSchema {
                validator: Arc::new(v),
            })
            .map_err(|e| SchemaError(e.to_string()))
    }

    /// True when `instance` satisfies the schema (the fast path: no error is built).
    pub fn is_valid(&self, instance: &Value) -> bool {
        self.validator.is_valid(instance)
    }

    /// `Ok` or the first violations.
    pub fn validate(&self, instance: &Value) -> Result<(), Vec<Violation>> {
        if self.validator.is_valid(instance) {
            return Ok(());
        }
        let violations: Vec<Violation> = self
            .validator
            .iter_errors(instance)
            .take(MAX_VIOLATIONS)
            .map(|e| Violation {
                path: e.instance_path().as_str().to_owned(),
                message: e.to_string(),
            })
            .collect();
        Err(violations)
    }
}

/// Machine-readable reason in an [`ErrorPayload`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorCode {
    /// No such tool or action (the model invented it).
    UnknownTool,
    /// The action is not in the client's registry.
    UnknownAction,
    /// The tool exists but is not offered to the model (user-only).
    NotAllowed,
    /// Arguments are not valid JSON or do not match the schema.
    InvalidArguments,
    /// No result before the deadline.
    Timeout,
    /// The tool or action ran and failed.
    ExecutionFailed,
    /// Any other code, kept as sent.
    Other(String),
}

impl ErrorCode {
    /// The wire string (`snake_case`).
    pub fn as_str(&self) -> &str {
        match self {
            ErrorCode::UnknownTool => "unknown_tool",
            ErrorCode::UnknownAction => "unknown_action",
            ErrorCode::NotAllowed => "not_allowed",
            ErrorCode::InvalidArguments => "invalid_arguments",
            ErrorCode::Timeout => "timeout",
            ErrorCode::ExecutionFailed => "execution_failed",
            ErrorCode::Other(s) => s,
        }
    }

    /// Reads a wire string; unknown strings become [`ErrorCode::Other`].
    pub fn parse(s: &str) -> Self {
        match s {
            "unknown_tool" => ErrorCode::UnknownTool,
            "unknown_action" => ErrorCode::UnknownAction,
            "not_allowed" => ErrorCode::NotAllowed,
            "invalid_arguments" => ErrorCode::InvalidArguments,
            "timeout" => ErrorCode::Timeout,
            "execution_failed" => ErrorCode::ExecutionFailed,
            other => ErrorCode::Other(other.to_owned()),
        }
    }
}

impl Serialize for ErrorCode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// The one error shape every failed tool call or action returns to the model, so it can tell the
/// user what went wrong: `{"error":{"code":"invalid_arguments","message":...,"details":[...]}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ErrorPayload {
    /// Machine-readable reason.
    pub code: ErrorCode,
    /// Human-readable reason.
    pub message: String,
    /// Schema violations, when that is the reason.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<Violation>,
}

impl ErrorPayload {
    /// A payload without details.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ErrorPayload {
            code,
            message: message.into(),
            details: Vec::new(),
        }
    }

    /// `{"error":{...}}`: the value handed to the model as the tool's output.
    pub fn to_value(&self) -> Value {
        let inner = serde_json::to_value(self).unwrap_or(Value::Null);
        Value::Object(serde_json::Map::from_iter([("error".to_owned(), inner)]))
    }

    /// The payload as an MCP tool result with `isError: true` (text content holding the JSON).
    pub fn to_call_result(&self) -> CallToolResult {
        CallToolResult::error_text(self.to_value().to_string())
    }
}

impl fmt::Display for ErrorPayload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn validates_and_reports_paths() {
        let s = CompiledSchema::compile(&json!({
            "type":"object",
            "properties":{"volume":{"type":"integer","minimum":0,"maximum":100}},
            "required":["volume"]
        }))
        .unwrap();
        assert!(s.validate(&json!({"volume": 40})).is_ok());
        let v = s.validate(&json!({"volume": 140})).unwrap_err();
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].path, "/volume");
        assert!(v[0].message.contains("100"), "{}", v[0].message);
        let v = s.validate(&json!({})).unwrap_err();
        assert_eq!(v[0].path, "");
        assert!(v[0].message.contains("volume"));
    }

    #[test]
    fn remote_refs_are_not_fetched() {
        let err = CompiledSchema::compile(&json!({"$ref":"https://example.com/schema.json"}));
        assert!(err.is_err());
        assert!(CompiledSchema::compile(&json!({"type": 12})).is_err());
    }

    #[test]
    fn payload_shape() {
        let p = ErrorPayload {
            code: ErrorCode::InvalidArguments,
            message: "bad".into(),
            details: vec![Violation {
                path: "/a".into(),
                message: "x".into(),
            }],
        };
        assert_eq!(
            p.to_value(),
            json!({"error":{"code":"invalid_arguments","message":"bad","details":[{"path":"/a","message":"x"}]}})
        );
        assert!(p.to_call_result().is_error);
        assert_eq!(ErrorCode::parse("weird"), ErrorCode::Other("weird".into()));
        assert_eq!(ErrorCode::parse("timeout"), ErrorCode::Timeout);
    }
}
