//! `google.protobuf.Struct` and `Value` to and from [`serde_json::Value`].
//!
//! Tool schemas (`ToolDefinition.parameters`), tool arguments (`ToolCallRequest.parameters`) and
//! `experiments` travel as protobuf `Struct`/`Value`; servers and clients work with JSON. The
//! mapping is protobuf's own JSON mapping:
//!
//! - JSON numbers become `number_value`, an `f64`: integers above 2^53 lose precision, exactly as
//!   with every other protobuf implementation. Going back, integral values within ±2^53 become
//!   JSON integers (`3.0` → `3`) and everything else a JSON float.
//! - NaN and infinities have no JSON form. Converting them is an error
//!   ([`StructError::NonFiniteNumber`]) rather than a silent `null`, as in protobuf's reference
//!   JSON printer.
//! - A `Value` without a kind is an error ([`StructError::MissingKind`]).
//! - A `Struct` is always an object, so JSON that is not an object cannot become one
//!   ([`StructError::NotAnObject`]).
//! - Nesting deeper than [`MAX_DEPTH`] is an error in both directions, so a hostile or buggy
//!   value cannot exhaust the stack.
//!
//! The errors carry a JSON pointer to the offending value.

use prost_types::value::Kind;
use prost_types::{ListValue, NullValue, Struct, Value};
use serde_json::{Map, Number};

use crate::error::StructError;

/// Deepest nesting converted, in objects plus arrays. Matches prost's decode recursion limit, so
/// anything decoded from the wire converts.
pub const MAX_DEPTH: usize = 100;

/// Largest integer an `f64` holds exactly (2^53).
const MAX_EXACT_INTEGER: f64 = 9_007_199_254_740_992.0;

/// Converts a `Struct` to a JSON object.
///
/// # Errors
///
/// See the [module documentation](self).
pub fn struct_to_json(s: &Struct) -> Result<Map<String, serde_json::Value>, StructError> {
    let mut pointer = String::new();
    fields_to_json(s, &mut pointer, 0)
}

/// Converts a `Value` to JSON.
///
/// # Errors
///
/// See the [module documentation](self).
pub fn value_to_json(v: &Value) -> Result<serde_json::Value, StructError> {
    let mut pointer = String::new();
    to_json(v, &mut pointer, 0)
}

/// Converts a JSON object to a `Struct`.
///
/// # Errors
///
/// [`StructError::NotAnObject`] for any other JSON type, [`StructError::TooDeep`] beyond
/// [`MAX_DEPTH`].
pub fn json_to_struct(json: &serde_json::Value) -> Result<Struct, StructError> {
    match json {
        serde_json::Value::Object(map) => map_to_struct(map),
        other => Err(StructError::NotAnObject {
            found: json_type(other),
        }),
    }
}

/// Converts a JSON object's members to a `Struct`.
///
/// # Errors
///
/// [`StructError::TooDeep`] beyond [`MAX_DEPTH`].
pub fn map_to_struct(map: &Map<String, serde_json::Value>) -> Result<Struct, StructError> {
    let mut pointer = String::new();
    object_from_json(map, &mut pointer, 0)
}

/// Converts JSON to a `Value`.
///
/// # Errors
///
/// [`StructError::TooDeep`] beyond [`MAX_DEPTH`].
pub fn json_to_value(json: &serde_json::Value) -> Result<Value, StructError> {
    let mut pointer = String::new();
    from_json(json, &mut pointer, 0)
}

fn json_type(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Appends one RFC 6901 reference token, escaping `~` and `/`.
fn push_token(pointer: &mut String, token: &str) {
    pointer.push('/');
    for c in token.chars() {
        match c {
            '~' => pointer.push_str("~0"),
            '/' => pointer.push_str("~1"),
            c => pointer.push(c),
        }
    }
}

/// Runs `f` with `token` appended to the pointer, restoring the pointer afterwards. Sharing one
/// pointer buffer keeps the successful path free of per-value allocations.
fn with_token<T>(pointer: &mut String, token: &str, f: impl FnOnce(&mut String) -> T) -> T {
    let len = pointer.len();
    push_token(pointer, token);
    let out = f(pointer);
    pointer.truncate(len);
    out
}

fn check_depth(pointer: &str, depth: usize) -> Result<(), StructError> {
    if depth >= MAX_DEPTH {
        return Err(StructError::TooDeep {
            pointer: pointer.to_owned(),
            limit: MAX_DEPTH,
        });
    }
    Ok(())
}

fn fields_to_json(
    s: &Struct,
    pointer: &mut String,
    depth: usize,
) -> Result<Map<String, serde_json::Value>, StructError> {
    check_depth(pointer, depth)?;
    let mut map = Map::new();
    for (key, value) in &s.fields {
        let json = with_token(pointer, key, |p| to_json(value, p, depth + 1))?;
        map.insert(key.clone(), json);
    }
    Ok(map)
}

fn to_json(
    v: &Value,
    pointer: &mut String,
    depth: usize,
) -> Result<serde_json::Value, StructError> {
    let Some(kind) = &v.kind else {
        return Err(StructError::MissingKind {
            pointer: pointer.clone(),
        });
    };
    Ok(match kind {
        // Any number in `null_value` means null: protobuf's JSON printer does the same for the
        // single-valued NullValue enum.
        Kind::NullValue(_) => serde_json::Value::Null,
        Kind::BoolValue(b) => serde_json::Value::Bool(*b),
        Kind::NumberValue(n) => serde_json::Value::Number(number_to_json(*n, pointer)?),
        Kind::StringValue(s) => serde_json::Value::String(s.clone()),
        Kind::ListValue(list) => {
            check_depth(pointer, depth)?;
            let mut out = Vec::with_capacity(list.values.len());
            for (i, item) in list.values.iter().enumerate() {
                out.push(with_token(pointer, &i.to_string(), |p| {
                    to_json(item, p, depth + 1)
                })?);
            }
            serde_json::Value::Array(out)
        }
        Kind::StructValue(s) => serde_json::Value::Object(fields_to_json(s, pointer, depth)?),
    })
}

fn number_to_json(n: f64, pointer: &str) -> Result<Number, StructError> {
    if n.fract() == 0.0 && n.abs() <= MAX_EXACT_INTEGER {
        // Exact: |n| <= 2^53 is integral and within i64.
        #[allow(clippy::cast_possible_truncation)]
        return Ok(Number::from(n as i64));
    }
    Number::from_f64(n).ok_or_else(|| StructError::NonFiniteNumber {
        pointer: pointer.to_owned(),
    })
}

fn object_from_json(
    map: &Map<String, serde_json::Value>,
    pointer: &mut String,
    depth: usize,
) -> Result<Struct, StructError> {
    check_depth(pointer, depth)?;
    let mut fields = std::collections::BTreeMap::new();
    for (key, value) in map {
        let v = with_token(pointer, key, |p| from_json(value, p, depth + 1))?;
        fields.insert(key.clone(), v);
    }
    Ok(Struct { fields })
}

fn from_json(
    json: &serde_json::Value,
    pointer: &mut String,
    depth: usize,
) -> Result<Value, StructError> {
    let kind = match json {
        serde_json::Value::Null => Kind::NullValue(NullValue::NullValue.into()),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        // Always finite without serde_json's `arbitrary_precision`; with it, a huge literal can
        // round to infinity, which protobuf's JSON parser rejects too.
        serde_json::Value::Number(n) => match n.as_f64() {
            Some(f) if f.is_finite() => Kind::NumberValue(f),
            _ => {
                return Err(StructError::NonFiniteNumber {
                    pointer: pointer.clone(),
                });
            }
        },
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Array(items) => {
            check_depth(pointer, depth)?;
            let mut values = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                values.push(with_token(pointer, &i.to_string(), |p| {
                    from_json(item, p, depth + 1)
                })?);
            }
            Kind::ListValue(ListValue { values })
        }
        serde_json::Value::Object(map) => Kind::StructValue(object_from_json(map, pointer, depth)?),
    };
    Ok(Value { kind: Some(kind) })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn number(n: f64) -> Value {
        Value {
            kind: Some(Kind::NumberValue(n)),
        }
    }

    #[test]
    fn round_trips_a_schema() {
        let schema = json!({
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
                "unit": {"enum": ["c", "f", null]},
                "ratio": {"default": 0.5},
                "nested": {"a": [[], {}, [true, false]]}
            },
            "required": ["city"],
            "additionalProperties": false
        });
        let s = json_to_struct(&schema).unwrap();
        assert_eq!(
            s.fields["required"],
            Value {
                kind: Some(Kind::ListValue(ListValue {
                    values: vec![Value {
                        kind: Some(Kind::StringValue("city".into()))
                    }]
                }))
            }
        );
        assert_eq!(
            serde_json::Value::Object(struct_to_json(&s).unwrap()),
            schema
        );
    }

    #[test]
    fn integers_become_doubles() {
        let v = json_to_value(&json!(3)).unwrap();
        assert_eq!(v, number(3.0));
        let v = json_to_value(&json!(-7)).unwrap();
        assert_eq!(v, number(-7.0));
        // Precision loss above 2^53 is protobuf's, not ours: the nearest double is stored.
        let v = json_to_value(&json!(u64::MAX)).unwrap();
        assert_eq!(v, number(18_446_744_073_709_551_615.0));
    }

    #[test]
    fn integral_doubles_print_as_integers() {
        assert_eq!(value_to_json(&number(3.0)).unwrap(), json!(3));
        assert_eq!(value_to_json(&number(-0.0)).unwrap(), json!(0));
        assert_eq!(value_to_json(&number(2.5)).unwrap(), json!(2.5));
        assert_eq!(value_to_json(&number(1e300)).unwrap(), json!(1e300));
        assert_eq!(
            value_to_json(&number(MAX_EXACT_INTEGER)).unwrap(),
            json!(9_007_199_254_740_992_i64)
        );
    }

    #[test]
    fn non_finite_numbers_are_errors_with_a_pointer() {
        for n in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let s = json_to_struct(&json!({"a/b": {"list": [1]}})).unwrap();
            let mut s = s;
            let Some(Kind::StructValue(inner)) = &mut s.fields.get_mut("a/b").unwrap().kind else {
                panic!("shape");
            };
            let Some(Kind::ListValue(list)) = &mut inner.fields.get_mut("list").unwrap().kind
            else {
                panic!("shape");
            };
            list.values.push(number(n));
            assert_eq!(
                struct_to_json(&s).unwrap_err(),
                StructError::NonFiniteNumber {
                    pointer: "/a~1b/list/1".into()
                }
            );
        }
    }

    #[test]
    fn kindless_value_is_an_error() {
        let mut s = Struct::default();
        s.fields.insert("x~".into(), Value { kind: None });
        assert_eq!(
            struct_to_json(&s).unwrap_err(),
            StructError::MissingKind {
                pointer: "/x~0".into()
            }
        );
    }

    #[test]
    fn any_null_value_number_is_null() {
        let v = Value {
            kind: Some(Kind::NullValue(7)),
        };
        assert_eq!(value_to_json(&v).unwrap(), serde_json::Value::Null);
    }

    #[test]
    fn top_level_must_be_an_object() {
        for (json, found) in [
            (json!(null), "null"),
            (json!(true), "a boolean"),
            (json!(1), "a number"),
            (json!("s"), "a string"),
            (json!([]), "an array"),
        ] {
            assert_eq!(
                json_to_struct(&json).unwrap_err(),
                StructError::NotAnObject { found }
            );
        }
    }

    #[test]
    fn depth_is_limited_both_ways() {
        let mut deep = json!(1);
        for _ in 0..MAX_DEPTH + 5 {
            deep = json!([deep]);
        }
        assert!(matches!(
            json_to_value(&deep).unwrap_err(),
            StructError::TooDeep {
                limit: MAX_DEPTH,
                ..
            }
        ));
        let mut v = number(1.0);
        for _ in 0..MAX_DEPTH + 5 {
            v = Value {
                kind: Some(Kind::ListValue(ListValue { values: vec![v] })),
            };
        }
        assert!(matches!(
            value_to_json(&v).unwrap_err(),
            StructError::TooDeep { .. }
        ));
        // One level below the limit converts.
        let mut ok = json!(1);
        for _ in 0..MAX_DEPTH - 1 {
            ok = json!([ok]);
        }
        let v = json_to_value(&ok).unwrap();
        assert_eq!(value_to_json(&v).unwrap(), ok);
    }
}
