//! Serde helpers for Retell's habit of sending explicit `null` for any field.

use serde::{Deserialize, Deserializer};

/// Reads an optional value where `null` means "the default": strings become empty, lists empty,
/// flags false. Combine with `#[serde(default)]` so an absent field behaves the same.
pub(crate) fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// Reads a JSON value where `null` means absent, so `Some(Value::Null)` never appears.
pub(crate) fn null_as_none_value<'de, D>(d: D) -> Result<Option<serde_json::Value>, D::Error>
where
    D: Deserializer<'de>,
{
    let v = serde_json::Value::deserialize(d)?;
    Ok(if v.is_null() { None } else { Some(v) })
}

/// Whether the first non-whitespace byte opens an object (serde would accept arrays for structs).
pub(crate) fn starts_object(bytes: &[u8]) -> bool {
    bytes
        .iter()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        .is_some_and(|&b| b == b'{')
}
