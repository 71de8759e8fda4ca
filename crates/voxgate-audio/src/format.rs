//! Raw PCM sample formats and conversion to and from mono `f32` / `i16`.
//!
//! The realtime protocol sends raw little-endian interleaved PCM in one of five sample formats and
//! any channel count. Packets may split a sample (or a multi-channel frame) anywhere, so the
//! [`PcmDecoder`] carries the incomplete tail of one call over to the next instead of failing.

use thiserror::Error;

/// One raw PCM sample encoding: little-endian, interleaved.
///
/// Mirrors the realtime protocol's `SampleFormat` (the server maps the wire enum onto this one).
/// Floats are treated as the usual `-1.0..=1.0` PCM range and clamped, even though the protocol
/// documents `0.0..1.0`: real clients send signed floats, and clamping keeps a stray value from
/// wrapping when converted to integers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SampleFormat {
    /// Unsigned 8-bit, silence at 128.
    Unsigned8,
    /// Signed 16-bit.
    Signed16,
    /// Signed 32-bit.
    Signed32,
    /// IEEE 754 32-bit float.
    Float32,
    /// IEEE 754 64-bit float.
    Float64,
}

impl SampleFormat {
    /// Bytes taken by one sample of one channel.
    #[must_use]
    pub const fn bytes_per_sample(self) -> usize {
        match self {
            Self::Unsigned8 => 1,
            Self::Signed16 => 2,
            Self::Signed32 | Self::Float32 => 4,
            Self::Float64 => 8,
        }
    }
}

/// A caller passed a PCM layout that cannot describe audio.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum FormatError {
    /// Zero channels.
    #[error("channel count must be at least 1")]
    NoChannels,
    /// Zero sample rate.
    #[error("sample rate must be at least 1 Hz")]
    ZeroSampleRate,
}

/// The layout of a raw PCM stream: rate, channel count and sample encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PcmFormat {
    sample_rate: u32,
    channels: u16,
    sample_format: SampleFormat,
}

impl PcmFormat {
    /// Validates and builds a layout.
    ///
    /// # Errors
    /// [`FormatError`] when the rate or channel count is zero.
    pub const fn new(
        sample_rate: u32,
        channels: u16,
        sample_format: SampleFormat,
    ) -> Result<Self, FormatError> {
        if sample_rate == 0 {
            return Err(FormatError::ZeroSampleRate);
        }
        if channels == 0 {
            return Err(FormatError::NoChannels);
        }
        Ok(Self {
            sample_rate,
            channels,
            sample_format,
        })
    }

    /// Samples per second per channel.
    #[must_use]
    pub const fn sample_rate(&self) -> u32 {
        self.sample_rate
    }

    /// Interleaved channel count.
    #[must_use]
    pub const fn channels(&self) -> u16 {
        self.channels
    }

    /// Encoding of each sample.
    #[must_use]
    pub const fn sample_format(&self) -> SampleFormat {
        self.sample_format
    }

    /// Bytes of one interleaved frame (one sample for every channel).
    #[must_use]
    pub const fn bytes_per_frame(&self) -> usize {
        self.sample_format.bytes_per_sample() * self.channels as usize
    }
}

/// Converts an `f32` sample to `i16`, clamping to the `-1.0..=1.0` range (NaN becomes silence).
///
/// Uses the 32768 scale that Opus uses, so `i16 -> f32 -> i16` is exact.
#[must_use]
#[inline]
pub fn f32_to_i16(sample: f32) -> i16 {
    let scaled = clamp_unit(sample) * 32768.0;
    // `f32::round` (half away from zero) without calling it: on baseline x86-64 it is a libm
    // call per sample, which kept the conversion loops of every audio path from vectorising
    // (1.4 % of the server's profile at 500 Xiaozhi sessions). Truncation is one instruction,
    // and the fraction left is exact (both are within 2^15), so the result is the same.
    #[allow(clippy::cast_possible_truncation)]
    let whole = scaled as i32;
    #[allow(clippy::cast_precision_loss)]
    let fraction = scaled - whole as f32;
    let rounded = if fraction >= 0.5 {
        whole + 1
    } else if fraction <= -0.5 {
        whole - 1
    } else {
        whole
    };
    // In range after the clamp, but for +1.0 (32768), which saturates to i16::MAX.
    #[allow(clippy::cast_possible_truncation)]
    let out = rounded.clamp(i32::from(i16::MIN), i32::from(i16::MAX)) as i16;
    out
}

/// Converts an `i16` sample to `f32` in `-1.0..1.0`.
#[must_use]
#[inline]
pub fn i16_to_f32(sample: i16) -> f32 {
    f32::from(sample) / 32768.0
}

#[inline]
fn clamp_unit(sample: f32) -> f32 {
    if sample.is_nan() {
        0.0
    } else {
        sample.clamp(-1.0, 1.0)
    }
}

/// Reads one sample of `format` from exactly `bytes_per_sample` bytes.
#[inline]
fn read_sample(format: SampleFormat, b: &[u8]) -> f32 {
    match (format, b) {
        (SampleFormat::Unsigned8, [x, ..]) => (f32::from(*x) - 128.0) / 128.0,
        (SampleFormat::Signed16, [a, b, ..]) => f32::from(i16::from_le_bytes([*a, *b])) / 32768.0,
        (SampleFormat::Signed32, [a, b, c, d, ..]) => {
            // f64 keeps all 32 bits before the final narrowing.
            #[allow(clippy::cast_possible_truncation)]
            let v = (f64::from(i32::from_le_bytes([*a, *b, *c, *d])) / 2_147_483_648.0) as f32;
            v
        }
        (SampleFormat::Float32, [a, b, c, d, ..]) => {
            clamp_unit(f32::from_le_bytes([*a, *b, *c, *d]))
        }
        (SampleFormat::Float64, [a, b, c, d, e, f, g, h, ..]) => {
            let v = f64::from_le_bytes([*a, *b, *c, *d, *e, *f, *g, *h]);
            if v.is_nan() {
                0.0
            } else {
                #[allow(clippy::cast_possible_truncation)]
                let v = v.clamp(-1.0, 1.0) as f32;
                v
            }
        }
        // Callers always pass whole samples; a short slice reads as silence rather than panicking.
        _ => 0.0,
    }
}

/// Streaming converter from raw interleaved PCM bytes to mono samples.
///
/// Multi-channel input is downmixed by averaging the channels. Bytes that do not complete a frame
/// are kept and prepended to the next call, so a peer may split packets anywhere.
#[derive(Debug, Clone)]
pub struct PcmDecoder {
    format: PcmFormat,
    carry: Vec<u8>,
}

impl PcmDecoder {
    /// A decoder for `format`.
    #[must_use]
    pub fn new(format: PcmFormat) -> Self {
        Self {
            format,
            carry: Vec::with_capacity(format.bytes_per_frame()),
        }
    }

    /// The layout this decoder reads.
    #[must_use]
    pub const fn format(&self) -> PcmFormat {
        self.format
    }

    /// Bytes held back because they did not complete a frame.
    #[must_use]
    pub fn pending_bytes(&self) -> usize {
        self.carry.len()
    }

    /// Drops any carried partial frame (after a reconfiguration or a stream restart).
    pub fn reset(&mut self) {
        self.carry.clear();
    }

    /// Appends the mono `f32` samples in `bytes` (plus any carried bytes) to `out`; returns how
    /// many samples were appended.
    pub fn decode_f32(&mut self, bytes: &[u8], out: &mut Vec<f32>) -> usize {
        let before = out.len();
        self.decode_with(bytes, |s| out.push(s));
        out.len() - before
    }

    /// Like [`decode_f32`](Self::decode_f32) but yields `i16` samples.
    pub fn decode_i16(&mut self, bytes: &[u8], out: &mut Vec<i16>) -> usize {
        let before = out.len();
        if self.format.sample_format == SampleFormat::Signed16 && self.format.channels == 1 {
            // The common wire format needs no float round trip.
            self.decode_s16_mono(bytes, out);
        } else {
            self.decode_with(bytes, |s| out.push(f32_to_i16(s)));
        }
        out.len() - before
    }

    fn decode_s16_mono(&mut self, mut bytes: &[u8], out: &mut Vec<i16>) {
        if let [carried] = self.carry.as_slice()
            && let [first, rest @ ..] = bytes
        {
            out.push(i16::from_le_bytes([*carried, *first]));
            self.carry.clear();
            bytes = rest;
        }
        let mut chunks = bytes.chunks_exact(2);
        out.extend(chunks.by_ref().map(|c| match c {
            [a, b] => i16::from_le_bytes([*a, *b]),
            _ => 0,
        }));
        self.carry.extend_from_slice(chunks.remainder());
    }

    fn decode_with(&mut self, mut bytes: &[u8], mut emit: impl FnMut(f32)) {
        let frame = self.format.bytes_per_frame();
        let sample_format = self.format.sample_format;
        let channels = self.format.channels as usize;
        #[allow(clippy::cast_precision_loss)]
        let inv = 1.0 / channels as f32;
        let mix = |f: &[u8]| -> f32 {
            let sum: f32 = f
                .chunks_exact(sample_format.bytes_per_sample())
                .map(|s| read_sample(sample_format, s))
                .sum();
            sum * inv
        };
        if !self.carry.is_empty() {
            let need = frame - self.carry.len();
            let take = need.min(bytes.len());
            let (head, rest) = bytes.split_at(take);
            self.carry.extend_from_slice(head);
            bytes = rest;
            if self.carry.len() < frame {
                return;
            }
            emit(mix(&self.carry));
            self.carry.clear();
        }
        let mut frames = bytes.chunks_exact(frame);
        for f in frames.by_ref() {
            emit(mix(f));
        }
        self.carry.extend_from_slice(frames.remainder());
    }
}

/// Writes mono samples as raw interleaved PCM, copying each sample to every channel.
#[derive(Debug, Clone, Copy)]
pub struct PcmEncoder {
    format: PcmFormat,
}

impl PcmEncoder {
    /// An encoder for `format`.
    #[must_use]
    pub const fn new(format: PcmFormat) -> Self {
        Self { format }
    }

    /// The layout this encoder writes.
    #[must_use]
    pub const fn format(&self) -> PcmFormat {
        self.format
    }

    /// Appends `samples` (clamped to `-1.0..=1.0`) to `out` in the encoder's layout.
    pub fn encode_f32(&self, samples: &[f32], out: &mut Vec<u8>) {
        out.reserve(samples.len() * self.format.bytes_per_frame());
        for &s in samples {
            let s = clamp_unit(s);
            for _ in 0..self.format.channels {
                self.write(s, out);
            }
        }
    }

    /// Appends `samples` to `out` in the encoder's layout.
    pub fn encode_i16(&self, samples: &[i16], out: &mut Vec<u8>) {
        out.reserve(samples.len() * self.format.bytes_per_frame());
        for &s in samples {
            for _ in 0..self.format.channels {
                match self.format.sample_format {
                    SampleFormat::Signed16 => out.extend_from_slice(&s.to_le_bytes()),
                    SampleFormat::Signed32 => {
                        out.extend_from_slice(&(i32::from(s) << 16).to_le_bytes());
                    }
                    _ => self.write(i16_to_f32(s), out),
                }
            }
        }
    }

    fn write(&self, s: f32, out: &mut Vec<u8>) {
        match self.format.sample_format {
            SampleFormat::Unsigned8 => {
                // In 0..=255 after the clamp; `as` saturates the +1.0 edge.
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let b = (s * 128.0 + 128.0).round().clamp(0.0, 255.0) as u8;
                out.push(b);
            }
            SampleFormat::Signed16 => out.extend_from_slice(&f32_to_i16(s).to_le_bytes()),
            SampleFormat::Signed32 => {
                #[allow(clippy::cast_possible_truncation)]
                let v = (f64::from(s) * 2_147_483_648.0)
                    .round()
                    .clamp(f64::from(i32::MIN), f64::from(i32::MAX)) as i32;
                out.extend_from_slice(&v.to_le_bytes());
            }
            SampleFormat::Float32 => out.extend_from_slice(&s.to_le_bytes()),
            SampleFormat::Float64 => out.extend_from_slice(&f64::from(s).to_le_bytes()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Ties, values just either side of them, the ends of the range and every 16-bit sample:
    /// the cases where a rounding shortcut goes wrong.
    #[test]
    fn f32_to_i16_matches_round_at_ties_and_edges() {
        let reference = |x: f32| -> i16 {
            #[allow(clippy::cast_possible_truncation)]
            let r = (x.clamp(-1.0, 1.0) * 32768.0).round() as i16;
            r
        };
        let mut cases = vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            2.0,
            -2.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MIN_POSITIVE,
            -f32::MIN_POSITIVE,
        ];
        for k in -32_768i32..=32_768 {
            #[allow(clippy::cast_precision_loss)]
            let at = k as f32;
            for scaled in [at, at + 0.5, at - 0.5] {
                let x = scaled / 32768.0;
                cases.extend([x, x.next_up(), x.next_down()]);
            }
        }
        for x in cases {
            assert_eq!(f32_to_i16(x), reference(x), "{x:e}");
        }
        assert_eq!(f32_to_i16(f32::NAN), 0);
        for s in i16::MIN..=i16::MAX {
            assert_eq!(f32_to_i16(i16_to_f32(s)), s);
        }
    }

    const ALL: [SampleFormat; 5] = [
        SampleFormat::Unsigned8,
        SampleFormat::Signed16,
        SampleFormat::Signed32,
        SampleFormat::Float32,
        SampleFormat::Float64,
    ];

    fn fmt(sf: SampleFormat, ch: u16) -> PcmFormat {
        PcmFormat::new(16_000, ch, sf).unwrap()
    }

    #[test]
    fn rejects_degenerate_layouts() {
        assert_eq!(
            PcmFormat::new(0, 1, SampleFormat::Signed16),
            Err(FormatError::ZeroSampleRate)
        );
        assert_eq!(
            PcmFormat::new(8000, 0, SampleFormat::Signed16),
            Err(FormatError::NoChannels)
        );
    }

    #[test]
    fn known_values_per_format() {
        let cases: [(SampleFormat, Vec<u8>, f32); 6] = [
            (SampleFormat::Unsigned8, vec![128], 0.0),
            (SampleFormat::Unsigned8, vec![0], -1.0),
            (
                SampleFormat::Signed16,
                (-16384i16).to_le_bytes().to_vec(),
                -0.5,
            ),
            (
                SampleFormat::Signed32,
                (1i32 << 30).to_le_bytes().to_vec(),
                0.5,
            ),
            (SampleFormat::Float32, 0.25f32.to_le_bytes().to_vec(), 0.25),
            (
                SampleFormat::Float64,
                (-0.75f64).to_le_bytes().to_vec(),
                -0.75,
            ),
        ];
        for (sf, bytes, want) in cases {
            let mut d = PcmDecoder::new(fmt(sf, 1));
            let mut out = Vec::new();
            assert_eq!(d.decode_f32(&bytes, &mut out), 1, "{sf:?}");
            assert!((out[0] - want).abs() < 1e-6, "{sf:?}: {} != {want}", out[0]);
        }
    }

    #[test]
    fn floats_are_clamped_and_nan_is_silence() {
        let mut bytes = Vec::new();
        for v in [2.0f32, -3.0, f32::NAN, f32::INFINITY] {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        let mut d = PcmDecoder::new(fmt(SampleFormat::Float32, 1));
        let mut out = Vec::new();
        d.decode_i16(&bytes, &mut out);
        assert_eq!(out, vec![i16::MAX, i16::MIN, 0, i16::MAX]);
    }

    #[test]
    fn stereo_is_averaged() {
        let mut bytes = Vec::new();
        for v in [1000i16, 3000, -200, 200] {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        let mut d = PcmDecoder::new(fmt(SampleFormat::Signed16, 2));
        let mut out = Vec::new();
        d.decode_i16(&bytes, &mut out);
        assert_eq!(out, vec![2000, 0]);
    }

    #[test]
    fn odd_byte_counts_are_carried() {
        let enc = PcmEncoder::new(fmt(SampleFormat::Signed16, 1));
        let mut bytes = Vec::new();
        enc.encode_i16(&[1, -2, 300], &mut bytes);
        let mut d = PcmDecoder::new(fmt(SampleFormat::Signed16, 1));
        let mut out = Vec::new();
        d.decode_i16(&bytes[..3], &mut out);
        assert_eq!(out, vec![1]);
        assert_eq!(d.pending_bytes(), 1);
        d.decode_i16(&bytes[3..4], &mut out);
        assert_eq!(out, vec![1, -2]);
        d.decode_i16(&bytes[4..], &mut out);
        assert_eq!(out, vec![1, -2, 300]);
        assert_eq!(d.pending_bytes(), 0);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Any split of the byte stream yields the same samples as one call.
        #[test]
        fn splitting_never_changes_output(
            fi in 0usize..5,
            ch in 1u16..4,
            samples in proptest::collection::vec(any::<i16>(), 0..64),
            cuts in proptest::collection::vec(0usize..512, 0..6),
        ) {
            let f = fmt(ALL[fi], ch);
            let mut bytes = Vec::new();
            PcmEncoder::new(f).encode_i16(&samples, &mut bytes);
            let mut whole = Vec::new();
            PcmDecoder::new(f).decode_f32(&bytes, &mut whole);
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(bytes.len())).collect();
            cuts.sort_unstable();
            let mut d = PcmDecoder::new(f);
            let mut parts = Vec::new();
            let mut prev = 0;
            for c in cuts.into_iter().chain([bytes.len()]) {
                d.decode_f32(&bytes[prev..c], &mut parts);
                prev = c;
            }
            prop_assert_eq!(whole, parts);
            prop_assert_eq!(d.pending_bytes(), 0);
        }

        /// The libm-free rounding is `f32::round` (half away from zero), for any value.
        #[test]
        fn f32_to_i16_rounds_as_round_does(x in any::<f32>()) {
            let expected = if x.is_nan() { 0 } else {
                #[allow(clippy::cast_possible_truncation)]
                let r = (x.clamp(-1.0, 1.0) * 32768.0).round() as i16;
                r
            };
            prop_assert_eq!(f32_to_i16(x), expected);
        }

        /// 16-bit and wider formats carry i16 audio without loss.
        #[test]
        fn i16_round_trip(fi in 1usize..5, ch in 1u16..3, samples in proptest::collection::vec(any::<i16>(), 0..64)) {
            let f = fmt(ALL[fi], ch);
            let mut bytes = Vec::new();
            PcmEncoder::new(f).encode_i16(&samples, &mut bytes);
            let mut back = Vec::new();
            PcmDecoder::new(f).decode_i16(&bytes, &mut back);
            prop_assert_eq!(samples, back);
        }

        /// Arbitrary bytes never panic and every full frame yields one sample in range.
        #[test]
        fn arbitrary_bytes(fi in 0usize..5, ch in 1u16..5, bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let f = fmt(ALL[fi], ch);
            let mut out = Vec::new();
            let mut d = PcmDecoder::new(f);
            let n = d.decode_f32(&bytes, &mut out);
            prop_assert_eq!(n, bytes.len() / f.bytes_per_frame());
            prop_assert!(out.iter().all(|s| (-1.0..=1.0).contains(s)));
        }
    }
}
