//! Incremental decoding of a streamed 16-bit PCM WAV (from an HTTP body or a child's stdout).
//!
//! Whole-file readers cannot be used here: streamed WAVs are played while they arrive and carry
//! a placeholder data length (0, `0xFFFFFFFF`, or a large guess), because the writer did not
//! know the length when it wrote the header.

use crate::error::ProviderError;
use crate::types::PcmChunk;

/// Header bytes accepted before the `data` chunk; real headers are under 100 bytes.
const MAX_HEADER: usize = 64 * 1024;

#[derive(Debug, Clone, Copy)]
struct Format {
    sample_rate: u32,
    channels: u16,
}

/// Turns WAV bytes, split anywhere, into mono [`PcmChunk`]s (channels are averaged).
#[derive(Debug, Default)]
pub struct WavStreamDecoder {
    header: Vec<u8>,
    format: Option<Format>,
    /// Bytes of sample data left per the header, `None` when the length is a placeholder.
    remaining: Option<u64>,
    carry: Vec<u8>,
}

impl WavStreamDecoder {
    /// A decoder at the start of a file.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The sample rate, once the header has been read.
    #[must_use]
    pub fn sample_rate(&self) -> Option<u32> {
        self.format.map(|f| f.sample_rate)
    }

    /// Feeds bytes; returns the samples they completed (`None` while still in the header or
    /// when no whole frame arrived).
    ///
    /// # Errors
    /// [`ProviderError::Protocol`] when the bytes are not a 16-bit PCM WAV.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Option<PcmChunk>, ProviderError> {
        let Some(format) = self.format else {
            // Only the header is buffered, never more than 64 KiB of it; a first chunk that
            // holds the header and sample data too (a whole file in one read) is fine.
            let room = MAX_HEADER.saturating_sub(self.header.len());
            let (head, tail) = bytes.split_at(bytes.len().min(room));
            self.header.extend_from_slice(head);
            return match parse_header(&self.header)? {
                None if tail.is_empty() => Ok(None),
                None => Err(bad("no data chunk in the first 64 KiB")),
                Some((format, data_start, data_len)) => {
                    self.format = Some(format);
                    self.remaining = data_len;
                    let mut rest = self.header.split_off(data_start);
                    rest.extend_from_slice(tail);
                    self.header = Vec::new();
                    self.samples(format, &rest)
                }
            };
        };
        self.samples(format, bytes)
    }

    /// Ends the stream.
    ///
    /// # Errors
    /// [`ProviderError::Protocol`] when the header never completed.
    pub fn finish(&self) -> Result<(), ProviderError> {
        if self.format.is_none() {
            return Err(bad("the WAV header is incomplete"));
        }
        Ok(())
    }

    fn samples(&mut self, format: Format, bytes: &[u8]) -> Result<Option<PcmChunk>, ProviderError> {
        let mut bytes = bytes;
        if let Some(left) = self.remaining.as_mut() {
            // Chunks after the data (LIST, id3) are not audio.
            let take = usize::try_from(*left)
                .unwrap_or(usize::MAX)
                .min(bytes.len());
            bytes = &bytes[..take];
            *left -= take as u64;
        }
        self.carry.extend_from_slice(bytes);
        let channels = usize::from(format.channels);
        let frame = 2 * channels;
        let whole = self.carry.len() / frame * frame;
        if whole == 0 {
            return Ok(None);
        }
        let samples: Vec<i16> = self.carry[..whole]
            .chunks_exact(frame)
            .map(|f| {
                let sum: i32 = f
                    .chunks_exact(2)
                    .map(|s| i32::from(i16::from_le_bytes([s[0], s[1]])))
                    .sum();
                // The mean of i16 values always fits in i16.
                i16::try_from(sum / i32::from(format.channels)).unwrap_or_default()
            })
            .collect();
        self.carry.drain(..whole);
        Ok(Some(PcmChunk {
            sample_rate: format.sample_rate,
            samples,
        }))
    }
}

fn bad(msg: &str) -> ProviderError {
    ProviderError::Protocol(format!("WAV stream: {msg}"))
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// `Ok(None)` while more bytes are needed; else the format, where sample data starts and its
/// declared length (`None` for a placeholder).
fn parse_header(b: &[u8]) -> Result<Option<(Format, usize, Option<u64>)>, ProviderError> {
    if b.len() < 12 {
        return Ok(None);
    }
    if &b[..4] != b"RIFF" || &b[8..12] != b"WAVE" {
        return Err(bad("not a RIFF/WAVE file"));
    }
    let mut pos = 12;
    let mut format = None;
    loop {
        if b.len() < pos + 8 {
            return Ok(None);
        }
        let id = &b[pos..pos + 4];
        let size = u32_at(b, pos + 4);
        let body = pos + 8;
        if id == b"data" {
            let format = format.ok_or_else(|| bad("data chunk before fmt chunk"))?;
            let declared = match size {
                0 | u32::MAX => None,
                n => Some(u64::from(n)),
            };
            return Ok(Some((format, body, declared)));
        }
        let size = usize::try_from(size).map_err(|_| bad("chunk too large"))?;
        let end = body.saturating_add(size).saturating_add(size & 1);
        if end > MAX_HEADER {
            return Err(bad("header chunk too large"));
        }
        if b.len() < end {
            return Ok(None);
        }
        if id == b"fmt " {
            if size < 16 {
                return Err(bad("fmt chunk too short"));
            }
            let tag = u16_at(b, body);
            let channels = u16_at(b, body + 2);
            let sample_rate = u32_at(b, body + 4);
            let bits = u16_at(b, body + 14);
            if !(tag == 1 || tag == 0xFFFE) || bits != 16 {
                return Err(bad(&format!(
                    "only 16-bit integer PCM is supported (format {tag:#x}, {bits} bits)"
                )));
            }
            if channels == 0 || sample_rate == 0 {
                return Err(bad("zero channels or sample rate"));
            }
            format = Some(Format {
                sample_rate,
                channels,
            });
        }
        pos = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(bytes: &[u8], piece: usize) -> (u32, Vec<i16>) {
        let mut d = WavStreamDecoder::new();
        let mut out = Vec::new();
        for c in bytes.chunks(piece) {
            if let Some(chunk) = d.feed(c).unwrap() {
                out.extend(chunk.samples);
            }
        }
        d.finish().unwrap();
        (d.sample_rate().unwrap(), out)
    }

    #[test]
    fn decodes_a_file_split_anywhere() {
        let pcm: Vec<i16> = (0..300i16).map(|i| i * 97 - 10_000).collect();
        let wav = voxgate_audio::wav::wav_bytes_i16(22_050, 1, &pcm).unwrap();
        for piece in [1, 2, 3, 7, 44, 45, 1000] {
            assert_eq!(decode(&wav, piece), (22_050, pcm.clone()), "piece {piece}");
        }
    }

    #[test]
    fn placeholder_length_streams_to_the_end_and_stereo_is_averaged() {
        let mut wav = voxgate_audio::wav::wav_bytes_i16(8_000, 2, &[100, 300, -2, -4]).unwrap();
        wav[40..44].copy_from_slice(&u32::MAX.to_le_bytes());
        wav.extend_from_slice(&[10, 0, 30, 0]);
        assert_eq!(decode(&wav, 5), (8_000, vec![200, -3, 20]));
    }

    #[test]
    fn declared_length_stops_before_trailing_chunks() {
        let mut wav = voxgate_audio::wav::wav_bytes_i16(16_000, 1, &[1, 2]).unwrap();
        wav.extend_from_slice(b"LIST\x04\x00\x00\x00abcd");
        assert_eq!(decode(&wav, 3).1, vec![1, 2]);
    }

    #[test]
    fn a_whole_file_larger_than_the_header_limit_decodes_in_one_feed() {
        // Regression (found writing the `wav_stream` fuzz target): a first chunk over 64 KiB
        // was refused as "no data chunk in the first 64 KiB" although its header was 44 bytes.
        let pcm: Vec<i16> = (0..40_000)
            .map(|i| i16::try_from(i % 2000).unwrap() - 1000)
            .collect();
        let wav = voxgate_audio::wav::wav_bytes_i16(16_000, 1, &pcm).unwrap();
        assert!(wav.len() > MAX_HEADER);
        assert_eq!(decode(&wav, wav.len()), (16_000, pcm));
    }

    #[test]
    fn a_header_without_data_chunk_is_refused_after_64_kib() {
        let mut wav = voxgate_audio::wav::wav_bytes_i16(16_000, 1, &[]).unwrap();
        wav.truncate(36);
        while wav.len() <= MAX_HEADER {
            wav.extend_from_slice(b"junk\xe8\x03\x00\x00");
            wav.resize(wav.len() + 1000, 0);
        }
        assert!(WavStreamDecoder::new().feed(&wav).is_err());
        let mut d = WavStreamDecoder::new();
        let errors = wav.chunks(1000).filter_map(|c| d.feed(c).err()).count();
        assert!(errors > 0);
    }

    #[test]
    fn rejects_what_it_cannot_play() {
        let mut d = WavStreamDecoder::new();
        assert!(
            d.feed(b"ID3\x03\x00\x00\x00\x00\x00\x00\x00\x00\x00")
                .is_err()
        );
        let mut wav = voxgate_audio::wav::wav_bytes_i16(16_000, 1, &[1]).unwrap();
        wav[34] = 8; // 8 bits per sample
        assert!(WavStreamDecoder::new().feed(&wav).is_err());
        let mut d = WavStreamDecoder::new();
        d.feed(b"RIFF\0\0\0\0WAVEfm").unwrap();
        assert!(d.finish().is_err());
    }
}
