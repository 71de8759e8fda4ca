//! WAV read and write through `hound`, for tests, tools and fixtures.

use std::io::{Cursor, Read, Seek, Write};

use thiserror::Error;

/// A WAV file could not be read or written.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum WavError {
    /// The bytes are not a WAV file this crate reads (blame: whoever produced them).
    #[error("malformed or unsupported WAV: {0}")]
    Malformed(String),
    /// Reading or writing the underlying stream failed.
    #[error("WAV I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The caller asked for a layout WAV cannot hold (zero channels, zero rate, ragged frames).
    #[error("invalid WAV layout: {0}")]
    InvalidLayout(String),
}

fn from_hound(e: hound::Error) -> WavError {
    match e {
        hound::Error::IoError(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
            WavError::Malformed("truncated".into())
        }
        hound::Error::IoError(io) => WavError::Io(io),
        other => WavError::Malformed(other.to_string()),
    }
}

/// Decoded WAV audio: interleaved `f32` samples in `-1.0..=1.0`.
#[derive(Debug, Clone, PartialEq)]
pub struct WavAudio {
    /// Samples per second per channel.
    pub sample_rate: u32,
    /// Interleaved channel count.
    pub channels: u16,
    /// Interleaved samples.
    pub samples: Vec<f32>,
}

impl WavAudio {
    /// Frames (samples per channel).
    #[must_use]
    pub fn frames(&self) -> usize {
        self.samples.len() / usize::from(self.channels.max(1))
    }

    /// Channels averaged to one.
    #[must_use]
    pub fn to_mono(&self) -> Vec<f32> {
        let ch = usize::from(self.channels.max(1));
        #[allow(clippy::cast_precision_loss)]
        let inv = 1.0 / ch as f32;
        self.samples
            .chunks_exact(ch)
            .map(|f| f.iter().sum::<f32>() * inv)
            .collect()
    }

    /// Channels averaged to one, as `i16`.
    #[must_use]
    pub fn to_mono_i16(&self) -> Vec<i16> {
        self.to_mono()
            .into_iter()
            .map(crate::format::f32_to_i16)
            .collect()
    }
}

/// Reads a whole WAV file (8/16/24/32-bit integer or 32-bit float PCM) from memory.
///
/// # Errors
/// [`WavError::Malformed`] for anything that is not such a file, including truncated data.
pub fn read_wav(bytes: &[u8]) -> Result<WavAudio, WavError> {
    // Memory cannot fail to read: an I/O error here means the bytes ran out.
    read_wav_from(Cursor::new(bytes)).map_err(|e| match e {
        WavError::Io(io) => WavError::Malformed(io.to_string()),
        other => other,
    })
}

/// Reads a whole WAV file from a reader.
///
/// # Errors
/// As [`read_wav`], plus [`WavError::Io`].
pub fn read_wav_from<R: Read>(reader: R) -> Result<WavAudio, WavError> {
    let mut r = hound::WavReader::new(reader).map_err(from_hound)?;
    let spec = r.spec();
    if spec.channels == 0 || spec.sample_rate == 0 {
        return Err(WavError::Malformed("zero channels or sample rate".into()));
    }
    // The header's length is peer data: never size an allocation from it.
    let samples: Vec<f32> = match spec.sample_format {
        hound::SampleFormat::Float => {
            if spec.bits_per_sample != 32 {
                return Err(WavError::Malformed(format!(
                    "{}-bit float",
                    spec.bits_per_sample
                )));
            }
            r.samples::<f32>()
                .map(|s| {
                    s.map(|v| if v.is_nan() { 0.0 } else { v.clamp(-1.0, 1.0) })
                        .map_err(from_hound)
                })
                .collect::<Result<_, _>>()?
        }
        hound::SampleFormat::Int => {
            let bits = spec.bits_per_sample;
            if !(1..=32).contains(&bits) {
                return Err(WavError::Malformed(format!("{bits}-bit integer")));
            }
            let scale = 1.0 / f64::from(1u32 << (bits - 1).min(31));
            r.samples::<i32>()
                .map(|s| {
                    s.map(|v| {
                        #[allow(clippy::cast_possible_truncation)]
                        let f = (f64::from(v) * scale).clamp(-1.0, 1.0) as f32;
                        f
                    })
                    .map_err(from_hound)
                })
                .collect::<Result<_, _>>()?
        }
    };
    if !samples.len().is_multiple_of(usize::from(spec.channels)) {
        return Err(WavError::Malformed("data ends inside a frame".into()));
    }
    Ok(WavAudio {
        sample_rate: spec.sample_rate,
        channels: spec.channels,
        samples,
    })
}

/// Writes interleaved 16-bit PCM as a WAV file.
///
/// # Errors
/// [`WavError::InvalidLayout`] for zero channels or rate or a sample count that is not a whole
/// number of frames, [`WavError::Io`] when writing fails.
pub fn write_wav_i16<W: Write + Seek>(
    writer: W,
    sample_rate: u32,
    channels: u16,
    samples: &[i16],
) -> Result<(), WavError> {
    if channels == 0 || sample_rate == 0 || !samples.len().is_multiple_of(usize::from(channels)) {
        return Err(WavError::InvalidLayout(format!(
            "{} samples, {channels} channels, {sample_rate} Hz",
            samples.len()
        )));
    }
    let spec = hound::WavSpec {
        channels,
        sample_rate,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::new(writer, spec).map_err(from_hound)?;
    let mut w16 = w.get_i16_writer(
        u32::try_from(samples.len())
            .map_err(|_| WavError::InvalidLayout("more than 4 Gi samples".into()))?,
    );
    for &s in samples {
        w16.write_sample(s);
    }
    w16.flush().map_err(from_hound)?;
    w.finalize().map_err(from_hound)
}

/// Encodes interleaved 16-bit PCM as WAV bytes in memory.
///
/// # Errors
/// As [`write_wav_i16`].
pub fn wav_bytes_i16(
    sample_rate: u32,
    channels: u16,
    samples: &[i16],
) -> Result<Vec<u8>, WavError> {
    let mut cursor = Cursor::new(Vec::with_capacity(44 + samples.len() * 2));
    write_wav_i16(&mut cursor, sample_rate, channels, samples)?;
    Ok(cursor.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn header_is_canonical() {
        let bytes = wav_bytes_i16(16_000, 1, &[0, 1, -1]).unwrap();
        assert_eq!(&bytes[..4], b"RIFF");
        assert_eq!(&bytes[8..16], b"WAVEfmt ");
        assert_eq!(bytes.len(), 44 + 6);
        assert_eq!(
            u32::from_le_bytes(bytes[24..28].try_into().unwrap()),
            16_000
        );
    }

    #[test]
    fn rejects_bad_layouts_and_bytes() {
        assert!(matches!(
            wav_bytes_i16(16_000, 2, &[1, 2, 3]),
            Err(WavError::InvalidLayout(_))
        ));
        let e = read_wav(b"RIFF");
        assert!(matches!(e, Err(WavError::Malformed(_))), "{e:?}");
        let mut bytes = wav_bytes_i16(8000, 1, &[1, 2, 3, 4]).unwrap();
        bytes.truncate(bytes.len() - 1);
        assert!(read_wav(&bytes).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        #[test]
        fn round_trip(ch in 1u16..4, frames in proptest::collection::vec(any::<i16>(), 0..100), rate in 1u32..200_000) {
            let samples: Vec<i16> = frames.iter().flat_map(|&s| std::iter::repeat_n(s, ch.into())).collect();
            let bytes = wav_bytes_i16(rate, ch, &samples).unwrap();
            let wav = read_wav(&bytes).unwrap();
            prop_assert_eq!(wav.sample_rate, rate);
            prop_assert_eq!(wav.channels, ch);
            prop_assert_eq!(wav.frames(), frames.len());
            prop_assert_eq!(wav.to_mono_i16(), frames);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = read_wav(&bytes);
        }
    }
}
