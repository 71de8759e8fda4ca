//! A reader for CTranslate2's `model.bin`, the weight file of faster-whisper's models.
//!
//! No Rust crate reads this format, and the file comes from outside (a user may point the
//! server at any model directory), so the reader is a small bounds-checked parser over a byte
//! slice: every length is checked against what is left before it is used, and a damaged file is
//! an error, never a panic or a huge allocation. It is fuzzed (`fuzz_targets/ct2_model.rs`).
//!
//! Layout (little-endian), as written by CTranslate2's model spec serializer, binary version
//! 5 or 6:
//!
//! ```text
//! u32 binary_version
//! str spec_name            (version >= 2)   str = u16 length including a NUL, bytes, NUL
//! u32 spec_revision        (version >= 2)
//! u32 variable_count
//!   str name, u8 rank, u32 dims[rank], u8 dtype (version >= 4), u32 byte_count, bytes
//! u32 alias_count          (version >= 3)
//!   str alias, str variable_name
//! ```

use std::collections::HashMap;

/// The element type of a variable, as CTranslate2 numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 8-bit integer (scalars, or quantized weights with a `*_scale` companion).
    I8,
    /// 16-bit integer.
    I16,
    /// 32-bit integer.
    I32,
    /// IEEE half float.
    F16,
    /// bfloat16.
    BF16,
}

impl DType {
    fn from_id(id: u8) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::I8,
            2 => Self::I16,
            3 => Self::I32,
            4 => Self::F16,
            5 => Self::BF16,
            _ => return None,
        })
    }

    /// Bytes per element.
    #[must_use]
    pub fn size(self) -> usize {
        match self {
            Self::I8 => 1,
            Self::I16 | Self::F16 | Self::BF16 => 2,
            Self::F32 | Self::I32 => 4,
        }
    }
}

/// One named array of the model, borrowing its bytes from the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Variable<'a> {
    /// Dimensions, outermost first; empty for a scalar.
    pub shape: Vec<usize>,
    /// Element type.
    pub dtype: DType,
    /// Raw little-endian elements.
    pub data: &'a [u8],
}

impl Variable<'_> {
    /// The value of an integer scalar (flags and head counts are stored this way).
    #[must_use]
    pub fn scalar_i64(&self) -> Option<i64> {
        if !self.shape.is_empty() {
            return None;
        }
        let d = self.data;
        Some(match self.dtype {
            DType::I8 => i64::from(i8::from_le_bytes([*d.first()?])),
            DType::I16 => i64::from(i16::from_le_bytes([*d.first()?, *d.get(1)?])),
            DType::I32 => i64::from(i32::from_le_bytes(d.get(..4)?.try_into().ok()?)),
            _ => return None,
        })
    }
}

/// A parsed `model.bin`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Model<'a> {
    /// The spec's name, e.g. `WhisperSpec`.
    pub spec: String,
    /// The spec's revision.
    pub revision: u32,
    /// Variables by name (aliases resolved to their targets).
    pub variables: HashMap<String, Variable<'a>>,
}

/// Why a `model.bin` could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Ct2Error {
    /// The file ended inside a field.
    #[error("model.bin is truncated at byte {0}")]
    Truncated(usize),
    /// A binary version this reader does not know.
    #[error("model.bin binary version {0} is not supported (expected 5 or 6)")]
    Version(u32),
    /// A field with an impossible value.
    #[error("model.bin is damaged: {0}")]
    Invalid(String),
}

/// More variables than any real model has; bounds the work a damaged count can cause.
const MAX_VARIABLES: u32 = 100_000;
/// More dimensions than any tensor of a speech model has.
const MAX_RANK: u8 = 8;

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Ct2Error> {
        let end = self
            .at
            .checked_add(n)
            .filter(|e| *e <= self.bytes.len())
            .ok_or(Ct2Error::Truncated(self.at))?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, Ct2Error> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, Ct2Error> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, Ct2Error> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn string(&mut self) -> Result<String, Ct2Error> {
        let n = usize::from(self.u16()?);
        let b = self.take(n)?;
        // The length counts a trailing NUL.
        let b = b.strip_suffix(&[0]).unwrap_or(b);
        if b.contains(&0) {
            return Err(Ct2Error::Invalid(format!(
                "a name before byte {} holds a NUL",
                self.at
            )));
        }
        String::from_utf8(b.to_vec())
            .map_err(|_| Ct2Error::Invalid(format!("a name before byte {} is not UTF-8", self.at)))
    }
}

/// Parses a whole `model.bin`.
///
/// # Errors
/// [`Ct2Error`] when the bytes are not a complete model of a supported version.
pub fn parse(bytes: &[u8]) -> Result<Model<'_>, Ct2Error> {
    let mut r = Reader { bytes, at: 0 };
    let version = r.u32()?;
    if !(5..=6).contains(&version) {
        return Err(Ct2Error::Version(version));
    }
    let spec = r.string()?;
    let revision = r.u32()?;
    let count = r.u32()?;
    if count > MAX_VARIABLES {
        return Err(Ct2Error::Invalid(format!("{count} variables")));
    }
    let mut variables = HashMap::new();
    for _ in 0..count {
        let name = r.string()?;
        let rank = r.u8()?;
        if rank > MAX_RANK {
            return Err(Ct2Error::Invalid(format!("{name}: rank {rank}")));
        }
        let mut shape = Vec::with_capacity(usize::from(rank));
        for _ in 0..rank {
            shape.push(r.u32()? as usize);
        }
        let dtype_id = r.u8()?;
        let dtype = DType::from_id(dtype_id)
            .ok_or_else(|| Ct2Error::Invalid(format!("{name}: data type {dtype_id}")))?;
        let byte_count = r.u32()? as usize;
        let elements = shape
            .iter()
            .try_fold(1usize, |a, d| a.checked_mul(*d))
            .ok_or_else(|| Ct2Error::Invalid(format!("{name}: shape {shape:?} overflows")))?;
        if elements.checked_mul(dtype.size()) != Some(byte_count) {
            return Err(Ct2Error::Invalid(format!(
                "{name}: {byte_count} bytes for shape {shape:?} of {dtype:?}"
            )));
        }
        let data = r.take(byte_count)?;
        variables.insert(name, Variable { shape, dtype, data });
    }
    if version >= 3 {
        let aliases = r.u32()?;
        if aliases > MAX_VARIABLES {
            return Err(Ct2Error::Invalid(format!("{aliases} aliases")));
        }
        for _ in 0..aliases {
            let alias = r.string()?;
            let target = r.string()?;
            let v = variables.get(&target).cloned().ok_or_else(|| {
                Ct2Error::Invalid(format!("alias {alias} names a missing variable {target}"))
            })?;
            variables.insert(alias, v);
        }
    }
    Ok(Model {
        spec,
        revision,
        variables,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&u16::try_from(s.len() + 1).unwrap().to_le_bytes());
        out.extend_from_slice(s.as_bytes());
        out.push(0);
    }

    /// A two-variable file plus an alias, byte by byte.
    fn sample() -> Vec<u8> {
        let mut b = 6u32.to_le_bytes().to_vec();
        string(&mut b, "WhisperSpec");
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&2u32.to_le_bytes());
        string(&mut b, "encoder/num_heads");
        b.push(0); // rank
        b.push(2); // int16
        b.extend_from_slice(&2u32.to_le_bytes());
        b.extend_from_slice(&6i16.to_le_bytes());
        string(&mut b, "w");
        b.push(2);
        b.extend_from_slice(&2u32.to_le_bytes());
        b.extend_from_slice(&3u32.to_le_bytes());
        b.push(4); // f16
        b.extend_from_slice(&12u32.to_le_bytes());
        b.extend_from_slice(&[0x00, 0x3c].repeat(6)); // 1.0 in f16
        b.extend_from_slice(&1u32.to_le_bytes());
        string(&mut b, "projection");
        string(&mut b, "w");
        b
    }

    #[test]
    fn reads_variables_scalars_and_aliases() {
        let bytes = sample();
        let m = parse(&bytes).unwrap();
        assert_eq!((m.spec.as_str(), m.revision), ("WhisperSpec", 3));
        assert_eq!(m.variables["encoder/num_heads"].scalar_i64(), Some(6));
        let w = &m.variables["w"];
        assert_eq!(
            (w.shape.as_slice(), w.dtype, w.data.len()),
            (&[2, 3][..], DType::F16, 12)
        );
        assert_eq!(m.variables["projection"], *w);
        assert_eq!(w.scalar_i64(), None);
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let bytes = sample();
        for n in 0..bytes.len() - 1 {
            assert!(parse(&bytes[..n]).is_err(), "prefix of {n} bytes parsed");
        }
    }

    #[test]
    fn a_name_holding_a_nul_is_refused() {
        // The fuzz smoke's crash: "w\0" renamed to "\0\0" (same length) in the sample.
        let mut bytes = sample();
        let pos = bytes.windows(3).position(|w| w == [2, 0, b'w']).unwrap();
        bytes[pos + 2] = 0;
        assert!(matches!(parse(&bytes), Err(Ct2Error::Invalid(m)) if m.contains("NUL")));
    }

    #[test]
    fn inconsistent_sizes_and_versions_are_refused() {
        let mut bytes = sample();
        bytes[0] = 9;
        assert_eq!(parse(&bytes), Err(Ct2Error::Version(9)));
        let mut bytes = sample();
        // The f16 variable's dtype (4) and byte count (12) sit right before its data; claim 10.
        let pos = bytes
            .windows(5)
            .position(|w| w == [4, 12, 0, 0, 0])
            .unwrap();
        bytes[pos + 1] = 10;
        assert!(matches!(parse(&bytes), Err(Ct2Error::Invalid(m)) if m.contains("10 bytes")));
    }
}
