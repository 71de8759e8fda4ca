//! Deserializers that accept the loosely typed values hand-built JSON contains.
//!
//! The firmware and third-party clients build JSON by string concatenation, so a number may
//! arrive as `"123"`, and an absent value as `null` or `""`. These helpers accept all of those
//! while still rejecting values that are not numbers at all.

use std::fmt;

use serde::Deserializer;
use serde::de::{self, Visitor};

/// Accepts a non-negative integer given as a JSON number (integral float included) or a string.
struct U64Visitor;

impl Visitor<'_> for U64Visitor {
    type Value = Option<u64>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a non-negative integer, possibly as a string")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Some(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        u64::try_from(v)
            .map(Some)
            .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        // Some clients serialize every number as a float (`60.0`).
        if v.fract() == 0.0 && (0.0..=u64::MAX as f64).contains(&v) {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            Ok(Some(v as u64))
        } else {
            Err(E::invalid_value(de::Unexpected::Float(v), &self))
        }
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        let trimmed = v.trim();
        if trimmed.is_empty() {
            return Ok(None);
        }
        trimmed
            .parse::<u64>()
            .map(Some)
            .map_err(|_| E::invalid_value(de::Unexpected::Str(v), &self))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

/// Accepts a signed integer given as a JSON number or a string.
struct I64Visitor;

impl Visitor<'_> for I64Visitor {
    type Value = Option<i64>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an integer, possibly as a string")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        i64::try_from(v)
            .map(Some)
            .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &self))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Some(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        if v.fract() == 0.0 && (i64::MIN as f64..=i64::MAX as f64).contains(&v) {
            #[allow(clippy::cast_possible_truncation)]
            Ok(Some(v as i64))
        } else {
            Err(E::invalid_value(de::Unexpected::Float(v), &self))
        }
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        let trimmed = v.trim();
        if trimmed.is_empty() {
            return Ok(None);
        }
        trimmed
            .parse::<i64>()
            .map(Some)
            .map_err(|_| E::invalid_value(de::Unexpected::Str(v), &self))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

/// A required `u64` (number or numeric string).
pub(crate) fn deserialize_u64<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    d.deserialize_any(U64Visitor)?
        .ok_or_else(|| de::Error::custom("expected a non-negative integer, found nothing"))
}

/// An optional `u64`: `null`, `""` and absence are `None`.
pub(crate) fn opt_u64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    d.deserialize_any(U64Visitor)
}

/// An optional `u32`.
pub(crate) fn opt_u32<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    opt_u64(d)?
        .map(|v| u32::try_from(v).map_err(|_| de::Error::custom("integer out of range for u32")))
        .transpose()
}

/// An optional `u16`.
pub(crate) fn opt_u16<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u16>, D::Error> {
    opt_u64(d)?
        .map(|v| u16::try_from(v).map_err(|_| de::Error::custom("integer out of range for u16")))
        .transpose()
}

/// An optional `i64`.
pub(crate) fn opt_i64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    d.deserialize_any(I64Visitor)
}

/// An optional `i32`.
pub(crate) fn opt_i32<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i32>, D::Error> {
    opt_i64(d)?
        .map(|v| i32::try_from(v).map_err(|_| de::Error::custom("integer out of range for i32")))
        .transpose()
}
