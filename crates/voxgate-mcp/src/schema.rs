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

/// Keywords whose value is a map from names to subschemas.
const SCHEMA_MAPS: &[&str] = &[
    "properties",
    "patternProperties",
    "dependentSchemas",
    "$defs",
    "definitions",
];
/// Keywords whose value is a list of subschemas.
const SCHEMA_LISTS: &[&str] = &["anyOf", "allOf", "oneOf", "prefixItems"];
/// Keywords whose value is one subschema (`items` may also be a list, as in draft 4 to 2019-09).
const SCHEMA_ONE: &[&str] = &[
    "items",
    "additionalItems",
    "additionalProperties",
    "unevaluatedItems",
    "unevaluatedProperties",
    "propertyNames",
    "contains",
    "not",
    "if",
    "then",
    "else",
];

/// Removes keywords whose value is `null` from a schema, recursively through its subschemas,
/// before [`CompiledSchema::compile`].
///
/// For doors that receive schemas from sloppy clients: serializers that write every optional
/// field (Kotlin's, for Gemini's `Schema` type) send `"items": null`, `"enum": null`,
/// `"description": null` and so on, which the service they were written for reads as "unset"
/// but a JSON Schema compiler rejects (`null is not of type "array"`).
///
/// Only keyword positions are touched: the keys of `properties` (and the other name maps) are
/// names, so a property called `description` is kept and cleaned like any subschema; values
/// that are data, not schemas (`enum`, `const`, `default`, `example(s)`), are left alone, nulls
/// inside them included. A property whose schema is `null` (`"properties": {"x": null}`) is
/// dropped, leniently (Gemini itself refuses it): the property is then unconstrained unless it
/// is `required`. `null` entries of `anyOf`/`allOf`/`oneOf` lists are dropped too. Pure and
/// linear in the size of the schema; recursion depth is the schema's own nesting.
pub fn drop_nulls(schema: &mut Value) {
    let Value::Object(map) = schema else {
        if let Value::Array(list) = schema {
            // `items` as a list of schemas (older drafts).
            list.iter_mut().for_each(drop_nulls);
        }
        return;
    };
    map.retain(|_, v| !v.is_null());
    for (key, value) in map.iter_mut() {
        let key = key.as_str();
        if SCHEMA_MAPS.contains(&key) {
            if let Value::Object(named) = value {
                named.retain(|_, v| !v.is_null());
                named.values_mut().for_each(drop_nulls);
            }
        } else if SCHEMA_LISTS.contains(&key) {
            if let Value::Array(list) = value {
                list.retain(|v| !v.is_null());
                list.iter_mut().for_each(drop_nulls);
            }
        } else if SCHEMA_ONE.contains(&key) {
            drop_nulls(value);
        }
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

    /// A Gemini `Schema` as Kotlin serialization writes it: every field, unused ones null.
    fn kotlin(ty: &str, extra: Value) -> Value {
        let mut s = json!({
            "type": ty, "format": null, "title": null, "description": null, "nullable": null,
            "enum": null, "maxItems": null, "minItems": null, "properties": null,
            "required": null, "minProperties": null, "maxProperties": null, "minLength": null,
            "maxLength": null, "pattern": null, "example": null, "anyOf": null,
            "propertyOrdering": null, "default": null, "items": null, "minimum": null,
            "maximum": null
        });
        if let (Value::Object(s), Value::Object(extra)) = (&mut s, extra) {
            s.extend(extra);
        }
        s
    }

    #[test]
    fn drop_nulls_makes_kotlin_schemas_compile() {
        let mut schema = kotlin(
            "object",
            json!({
                "properties": {
                    "description": kotlin("string", json!({"description": "A property named description."})),
                    "tags": kotlin("array", json!({"items": kotlin("string", json!({"enum": ["a", "b"]}))})),
                    "either": kotlin("string", json!({"anyOf": [kotlin("string", json!({})), null]})),
                    "gone": null
                },
                "required": ["description"]
            }),
        );
        assert!(CompiledSchema::compile(&schema).is_err());
        drop_nulls(&mut schema);
        assert_eq!(
            schema,
            json!({
                "type": "object",
                "properties": {
                    "description": {"type": "string", "description": "A property named description."},
                    "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}},
                    "either": {"type": "string", "anyOf": [{"type": "string"}]}
                },
                "required": ["description"]
            })
        );
        let compiled = CompiledSchema::compile(&schema).unwrap();
        assert!(compiled.is_valid(&json!({"description": "x", "tags": ["a"]})));
        assert!(!compiled.is_valid(&json!({"description": "x", "tags": ["c"]})));
        assert!(!compiled.is_valid(&json!({})));
    }

    #[test]
    fn drop_nulls_keeps_data_and_non_schemas() {
        // Nulls that are data (enum members, defaults, examples) stay; so do scalars.
        let mut schema = json!({
            "enum": ["a", null],
            "default": {"x": null},
            "const": null,
            "example": [null],
            "items": [{"type": "string", "title": null}, {"type": "integer"}]
        });
        drop_nulls(&mut schema);
        assert_eq!(
            schema,
            json!({
                "enum": ["a", null],
                "default": {"x": null},
                "example": [null],
                "items": [{"type": "string"}, {"type": "integer"}]
            })
        );
        // `const: null` is a keyword whose value is null: dropped like the others (Gemini
        // has no `const`; a JSON Schema client meaning "must be null" should say `type`).
        for mut v in [json!(null), json!(true), json!("s"), json!(3)] {
            let before = v.clone();
            drop_nulls(&mut v);
            assert_eq!(v, before);
        }
    }

    /// True when no keyword position in `v` (walked as [`drop_nulls`] walks it) holds null.
    fn clean(v: &Value) -> bool {
        match v {
            Value::Object(m) => m.iter().all(|(k, v)| {
                if v.is_null() {
                    return false;
                }
                let k = k.as_str();
                if SCHEMA_MAPS.contains(&k) {
                    v.as_object()
                        .is_none_or(|named| named.values().all(|s| !s.is_null() && clean(s)))
                } else if SCHEMA_LISTS.contains(&k) {
                    v.as_array()
                        .is_none_or(|list| list.iter().all(|s| !s.is_null() && clean(s)))
                } else if SCHEMA_ONE.contains(&k) {
                    clean(v)
                } else {
                    true
                }
            }),
            Value::Array(list) => list.iter().all(clean),
            _ => true,
        }
    }

    fn arb_schema() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let keys = prop::sample::select(vec![
            "type",
            "description",
            "enum",
            "items",
            "properties",
            "anyOf",
            "required",
            "default",
            "not",
            "title",
            "format",
            "minimum",
        ]);
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            "[a-z]{0,4}".prop_map(Value::from),
            any::<i32>().prop_map(Value::from),
        ];
        leaf.prop_recursive(5, 64, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                prop::collection::btree_map(
                    keys.clone().prop_map(str::to_owned),
                    inner.clone(),
                    0..6
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
                prop::collection::btree_map("[a-z]{1,3}", inner, 0..3)
                    .prop_map(|m| json!({"properties": Value::Object(m.into_iter().collect())})),
            ]
        })
    }

    proptest::proptest! {
        #[test]
        fn drop_nulls_leaves_no_null_keyword_and_is_idempotent(mut v in arb_schema()) {
            let original = v.clone();
            drop_nulls(&mut v);
            proptest::prop_assert!(clean(&v), "{v}");
            let once = v.clone();
            drop_nulls(&mut v);
            proptest::prop_assert_eq!(&v, &once);
            // A schema that was clean already is left exactly as it was.
            if clean(&original) {
                proptest::prop_assert_eq!(&once, &original);
            }
        }
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
