//! Audio blobs: base64 16-bit PCM decoded straight into a caller's sample buffer.
//!
//! Gemini carries audio as base64 text inside JSON: `audio/pcm;rate=16000` s16le mono from
//! clients, `audio/pcm;rate=24000` from the model. Decoding goes from the base64 characters
//! directly to `i16` samples, with no intermediate byte buffer, so a 100 ms frame costs a couple
//! of microseconds.
//!
//! Tolerated on input, because real clients do it: line breaks and other whitespace inside the
//! base64 (Android's `Base64.DEFAULT` wraps lines), the URL-safe alphabet, missing padding,
//! and a whole WAV file (RIFF header included) sent as one frame: the header is detected, parsed
//! and stripped, its rate and channel count are reported, and samples in another PCM format
//! (8-bit unsigned, 24- or 32-bit integer, 32- or 64-bit float) are converted to 16-bit.

use crate::error::AudioError;

const INVALID: u8 = 0xFF;
const WHITESPACE: u8 = 0xFE;
const PAD: u8 = 0xFD;

/// Sextet value of each byte, or one of the markers above.
static SEXTET: [u8; 256] = build_sextets();

const fn build_sextets() -> [u8; 256] {
    let mut t = [INVALID; 256];
    let mut i = 0u8;
    while i < 26 {
        t[(b'A' + i) as usize] = i;
        t[(b'a' + i) as usize] = 26 + i;
        i += 1;
    }
    let mut d = 0u8;
    while d < 10 {
        t[(b'0' + d) as usize] = 52 + d;
        d += 1;
    }
    t[b'+' as usize] = 62;
    t[b'-' as usize] = 62;
    t[b'/' as usize] = 63;
    t[b'_' as usize] = 63;
    t[b'=' as usize] = PAD;
    t[b' ' as usize] = WHITESPACE;
    t[b'\t' as usize] = WHITESPACE;
    t[b'\n' as usize] = WHITESPACE;
    t[b'\r' as usize] = WHITESPACE;
    t
}

/// Bits set in a pre-shifted entry when the character is not a base64 digit.
const BAD_BITS: u32 = 0xFF00_0000;

/// The sextet of each character already shifted to its place in a 24-bit group, so a group of
/// four characters is four loads and three ORs; anything that is not a digit sets `BAD_BITS`.
const fn build_shifted(shift: u32) -> [u32; 256] {
    let mut t = [BAD_BITS; 256];
    let mut i = 0;
    while i < 256 {
        let v = SEXTET[i];
        if v < 64 {
            t[i] = (v as u32) << shift;
        }
        i += 1;
    }
    t
}

static SHIFT0: [u32; 256] = build_shifted(18);
static SHIFT1: [u32; 256] = build_shifted(12);
static SHIFT2: [u32; 256] = build_shifted(6);
static SHIFT3: [u32; 256] = build_shifted(0);

/// Eight characters as two 24-bit groups; `None` if any is not a base64 digit.
#[inline(always)]
fn groups(c: &[u8]) -> Option<(u32, u32)> {
    let (Some(&a), Some(&b), Some(&cc), Some(&d), Some(&e), Some(&f), Some(&g), Some(&h)) = (
        c.first(),
        c.get(1),
        c.get(2),
        c.get(3),
        c.get(4),
        c.get(5),
        c.get(6),
        c.get(7),
    ) else {
        return None;
    };
    let w0 = SHIFT0[usize::from(a)]
        | SHIFT1[usize::from(b)]
        | SHIFT2[usize::from(cc)]
        | SHIFT3[usize::from(d)];
    let w1 = SHIFT0[usize::from(e)]
        | SHIFT1[usize::from(f)]
        | SHIFT2[usize::from(g)]
        | SHIFT3[usize::from(h)];
    if (w0 | w1) & BAD_BITS != 0 {
        None
    } else {
        Some((w0, w1))
    }
}

/// Byte `n` (0 = most significant) of a 24-bit group.
#[inline(always)]
fn byte(w: u32, n: u32) -> u8 {
    (w >> (16 - 8 * n)).to_le_bytes()[0]
}

/// Decodes whole 8-character blocks into 3 samples each, starting on a sample boundary.
/// Returns the number of blocks decoded; stops at the first block that needs the slow path.
fn fast_aligned(src: &[u8], dst: &mut [i16]) -> usize {
    let mut done = 0;
    for (c, s) in src.chunks_exact(8).zip(dst.chunks_exact_mut(3)) {
        let Some((w0, w1)) = groups(c) else { break };
        s[0] = i16::from_le_bytes([byte(w0, 0), byte(w0, 1)]);
        s[1] = i16::from_le_bytes([byte(w0, 2), byte(w1, 0)]);
        s[2] = i16::from_le_bytes([byte(w1, 1), byte(w1, 2)]);
        done += 1;
    }
    done
}

/// Like [`fast_aligned`] when one low byte is already pending (the PCM data starts at an odd
/// offset, as after a 44-byte WAV header). Returns blocks decoded and the new pending byte.
fn fast_carry(src: &[u8], dst: &mut [i16], mut pending: u8) -> (usize, u8) {
    let mut done = 0;
    for (c, s) in src.chunks_exact(8).zip(dst.chunks_exact_mut(3)) {
        let Some((w0, w1)) = groups(c) else { break };
        s[0] = i16::from_le_bytes([pending, byte(w0, 0)]);
        s[1] = i16::from_le_bytes([byte(w0, 1), byte(w0, 2)]);
        s[2] = i16::from_le_bytes([byte(w1, 0), byte(w1, 1)]);
        pending = byte(w1, 2);
        done += 1;
    }
    (done, pending)
}

/// Where decoded bytes go.
trait Sink {
    /// Takes one byte; `false` stops decoding (the sink wants no more).
    fn push(&mut self, b: u8) -> bool;
    /// Decodes as many whole 8-character blocks as it can at once; returns characters consumed.
    fn fast(&mut self, _input: &[u8]) -> usize {
        0
    }
}

/// Pairs bytes into little-endian samples, optionally skipping a header and stopping after a
/// byte budget (a WAV `data` chunk followed by other chunks).
struct PcmSink<'a> {
    out: &'a mut [i16],
    len: usize,
    pending: Option<u8>,
    skip: usize,
    remaining: usize,
    overflow: usize,
}

impl Sink for PcmSink<'_> {
    #[inline]
    fn push(&mut self, b: u8) -> bool {
        if self.skip > 0 {
            self.skip -= 1;
            return true;
        }
        if self.remaining == 0 {
            return false;
        }
        self.remaining -= 1;
        match self.pending.take() {
            None => self.pending = Some(b),
            Some(lo) => {
                let s = i16::from_le_bytes([lo, b]);
                match self.out.get_mut(self.len) {
                    Some(slot) => {
                        *slot = s;
                        self.len += 1;
                    }
                    None => self.overflow += 1,
                }
            }
        }
        true
    }

    fn fast(&mut self, input: &[u8]) -> usize {
        if self.skip > 0 || self.overflow > 0 {
            return 0;
        }
        let room = self.out.len().saturating_sub(self.len);
        let blocks = (input.len() / 8).min(room / 3).min(self.remaining / 6);
        if blocks == 0 {
            return 0;
        }
        let (Some(src), Some(dst)) = (
            input.get(..blocks * 8),
            self.out.get_mut(self.len..self.len + blocks * 3),
        ) else {
            return 0;
        };
        let done = match self.pending {
            None => fast_aligned(src, dst),
            Some(p) => {
                let (done, p) = fast_carry(src, dst, p);
                self.pending = Some(p);
                done
            }
        };
        self.len += done * 3;
        self.remaining -= done * 6;
        done * 8
    }
}

/// A WAV sample format converted to 16-bit ([`WavSample::of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WavSample {
    U8,
    I24,
    I32,
    F32,
    F64,
}

impl WavSample {
    /// The conversion for a header's format; `None` for 16-bit integer PCM (decoded as it is)
    /// and `Err` for what is not converted.
    fn of(h: &WavHeader) -> Result<Option<Self>, AudioError> {
        Ok(Some(match (h.format_tag, h.bits_per_sample) {
            (1, 16) => return Ok(None),
            (1, 8) => Self::U8,
            (1, 24) => Self::I24,
            (1, 32) => Self::I32,
            (3, 32) => Self::F32,
            (3, 64) => Self::F64,
            (format_tag, bits_per_sample) => {
                return Err(AudioError::UnsupportedWav {
                    format_tag,
                    bits_per_sample,
                });
            }
        }))
    }

    /// Bytes of one sample.
    fn width(self) -> usize {
        match self {
            Self::U8 => 1,
            Self::I24 => 3,
            Self::I32 | Self::F32 => 4,
            Self::F64 => 8,
        }
    }

    /// One little-endian sample (`b` is [`width`](Self::width) bytes) as 16-bit: integers keep
    /// their top 16 bits, floats are clamped to -1..=1 (NaN is silence).
    fn to_i16(self, b: &[u8; 8]) -> i16 {
        let float = |v: f64| {
            let v = if v.is_nan() { 0.0 } else { v.clamp(-1.0, 1.0) };
            #[allow(clippy::cast_possible_truncation, reason = "clamped to the i16 range")]
            let s = (v * 32767.0).round() as i16;
            s
        };
        match self {
            Self::U8 => i16::from_le_bytes([0, b[0] ^ 0x80]),
            Self::I24 => i16::from_le_bytes([b[1], b[2]]),
            Self::I32 => i16::from_le_bytes([b[2], b[3]]),
            Self::F32 => float(f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
            Self::F64 => float(f64::from_le_bytes(*b)),
        }
    }
}

/// Converts WAV samples of another format to 16-bit, skipping the header and stopping after
/// the `data` chunk, like [`PcmSink`].
struct ConvertSink<'a> {
    out: &'a mut [i16],
    len: usize,
    format: WavSample,
    sample: [u8; 8],
    filled: usize,
    skip: usize,
    remaining: usize,
    overflow: usize,
}

impl Sink for ConvertSink<'_> {
    fn push(&mut self, b: u8) -> bool {
        if self.skip > 0 {
            self.skip -= 1;
            return true;
        }
        if self.remaining == 0 {
            return false;
        }
        self.remaining -= 1;
        if let Some(slot) = self.sample.get_mut(self.filled) {
            *slot = b;
        }
        self.filled += 1;
        if self.filled == self.format.width() {
            self.filled = 0;
            let s = self.format.to_i16(&self.sample);
            match self.out.get_mut(self.len) {
                Some(slot) => {
                    *slot = s;
                    self.len += 1;
                }
                None => self.overflow += 1,
            }
        }
        true
    }
}

/// Collects the first bytes of a blob (to read a WAV header) and stops when full.
struct PrefixSink<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl Sink for PrefixSink<'_> {
    fn push(&mut self, b: u8) -> bool {
        match self.buf.get_mut(self.len) {
            Some(slot) => {
                *slot = b;
                self.len += 1;
                true
            }
            None => false,
        }
    }
}

/// Flushes a partial group of `n` sextets (2 or 3) as its 1 or 2 whole bytes.
fn flush_partial<S: Sink>(quad: [u8; 4], n: usize, sink: &mut S) -> bool {
    let w = (u32::from(quad[0]) << 18)
        | (u32::from(quad[1]) << 12)
        | (u32::from(quad[2]) << 6)
        | u32::from(quad[3]);
    match n {
        2 => sink.push(byte(w, 0)),
        3 => sink.push(byte(w, 0)) && sink.push(byte(w, 1)),
        _ => true,
    }
}

/// The decoding loop: whole blocks through the sink's fast path, everything else (whitespace,
/// padding, a header to skip, odd alignment at the end) one character at a time.
fn run<S: Sink>(input: &[u8], sink: &mut S) -> Result<(), AudioError> {
    let mut quad = [0u8; 4];
    let mut n = 0usize;
    let mut in_padding = false;
    let mut i = 0usize;
    while i < input.len() {
        if n == 0 && !in_padding {
            i += sink.fast(input.get(i..).unwrap_or_default());
        }
        let Some(&c) = input.get(i) else { break };
        let v = SEXTET[usize::from(c)];
        match v {
            0..=63 => {
                // Concatenated base64 (each piece padded on its own) continues after padding.
                in_padding = false;
                quad[n] = v;
                n += 1;
                if n == 4 {
                    n = 0;
                    let w = (u32::from(quad[0]) << 18)
                        | (u32::from(quad[1]) << 12)
                        | (u32::from(quad[2]) << 6)
                        | u32::from(quad[3]);
                    if !(sink.push(byte(w, 0)) && sink.push(byte(w, 1)) && sink.push(byte(w, 2))) {
                        return Ok(());
                    }
                }
            }
            WHITESPACE => {}
            PAD if in_padding => {}
            PAD if n >= 2 => {
                if !flush_partial(quad, n, sink) {
                    return Ok(());
                }
                quad = [0; 4];
                n = 0;
                in_padding = true;
            }
            _ => return Err(AudioError::InvalidBase64 { offset: i }),
        }
        i += 1;
    }
    match n {
        0 => Ok(()),
        1 => Err(AudioError::TruncatedBase64),
        _ => {
            flush_partial(quad, n, sink);
            Ok(())
        }
    }
}

/// Canonical base64 (standard alphabet, padded, no whitespace) decoded with SIMD straight into
/// the bytes of `out`. `None` sends the input to the tolerant scalar path, which also reports
/// errors precisely.
#[cfg(feature = "simd")]
fn simd_decode(input: &[u8], out: &mut [i16]) -> Option<(usize, bool)> {
    let b64 = base64_simd::STANDARD;
    let bytes = b64.decoded_length(input).ok()?;
    let samples = bytes / 2;
    // The decoder needs room for an odd trailing byte too; without it, go scalar.
    let view = out.get_mut(..bytes.div_ceil(2))?;
    let raw: &mut [u8] = bytemuck::cast_slice_mut(view);
    let raw = raw.get_mut(..bytes)?;
    b64.decode(input, base64_simd::Out::from_slice(raw)).ok()?;
    // Samples are little-endian on the wire; a no-op on little-endian hosts.
    for s in out.get_mut(..samples)? {
        *s = i16::from_le(*s);
    }
    Some((samples, bytes % 2 == 1))
}

#[cfg(not(feature = "simd"))]
fn simd_decode(_input: &[u8], _out: &mut [i16]) -> Option<(usize, bool)> {
    None
}

/// The most samples `b64_len` characters of base64 can decode to: size buffers with it.
pub fn max_pcm_samples(b64_len: usize) -> usize {
    b64_len.div_ceil(4) * 3 / 2
}

/// Decodes base64 s16le PCM (no header detection) into `out`; returns the number of samples.
///
/// An odd trailing byte is ignored. Fails with [`AudioError::BufferTooSmall`] (reporting the
/// size needed) if `out` is too short; [`max_pcm_samples`] gives a size that always fits.
pub fn decode_pcm_base64(b64: &str, out: &mut [i16]) -> Result<usize, AudioError> {
    if let Some((samples, _)) = simd_decode(b64.as_bytes(), out) {
        return Ok(samples);
    }
    decode_pcm_scalar(b64, out)
}

/// [`decode_pcm_base64`] without the SIMD fast path (for tests and comparisons).
#[doc(hidden)]
pub fn decode_pcm_scalar(b64: &str, out: &mut [i16]) -> Result<usize, AudioError> {
    let mut sink = PcmSink {
        out,
        len: 0,
        pending: None,
        skip: 0,
        remaining: usize::MAX,
        overflow: 0,
    };
    run(b64.as_bytes(), &mut sink)?;
    finish(&sink).map(|_| sink.len)
}

fn finish(sink: &PcmSink<'_>) -> Result<bool, AudioError> {
    if sink.overflow > 0 {
        return Err(AudioError::BufferTooSmall {
            needed: sink.len + sink.overflow,
            capacity: sink.out.len(),
        });
    }
    Ok(sink.pending.is_some())
}

/// The useful fields of a RIFF/WAV header found at the start of an audio blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WavHeader {
    /// `wFormatTag` (for WAVE_FORMAT_EXTENSIBLE, the tag of the sub-format).
    pub format_tag: u16,
    /// Interleaved channels.
    pub channels: u16,
    /// Frames per second.
    pub sample_rate: u32,
    /// Bits per sample.
    pub bits_per_sample: u16,
    /// Byte offset of the sample data.
    pub data_offset: usize,
    /// Length of the sample data in bytes; `None` when the header leaves it open (streaming
    /// writers put 0 or 0xFFFFFFFF there) and the data runs to the end.
    pub data_len: Option<usize>,
}

/// Base64 of `RIFF` begins with these characters.
const RIFF_B64: &str = "UklGR";

/// How much of a WAV file is decoded to find the `data` chunk.
const WAV_PREFIX: usize = 8192;

/// Parses a RIFF/WAV header from the first bytes of a file.
///
/// Returns `Ok(None)` when `bytes` does not start with `RIFF....WAVE`. Every format is
/// reported, not refused: the caller decides ([`decode_audio_into`] converts the common PCM
/// formats and refuses the rest).
pub fn parse_wav_header(bytes: &[u8]) -> Result<Option<WavHeader>, AudioError> {
    if bytes.get(..4) != Some(b"RIFF") || bytes.get(8..12) != Some(b"WAVE") {
        return Ok(None);
    }
    let le16 = |at: usize| {
        bytes
            .get(at..at.saturating_add(2))
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let le32 = |at: usize| {
        bytes
            .get(at..at.saturating_add(4))
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let mut fmt: Option<(u16, u16, u32, u16)> = None;
    let mut pos = 12usize;
    loop {
        let (Some(id), Some(size)) = (
            bytes.get(pos..pos.saturating_add(4)),
            le32(pos.saturating_add(4)),
        ) else {
            return Err(AudioError::BadWav("no data chunk in the header"));
        };
        let body = pos.saturating_add(8);
        let size = usize::try_from(size).unwrap_or(usize::MAX);
        match id {
            b"fmt " => {
                let (Some(mut tag), Some(channels), Some(rate), Some(bits)) = (
                    le16(body),
                    le16(body.saturating_add(2)),
                    le32(body.saturating_add(4)),
                    le16(body.saturating_add(14)),
                ) else {
                    return Err(AudioError::BadWav("fmt chunk too short"));
                };
                if tag == 0xFFFE && size >= 40 {
                    // WAVE_FORMAT_EXTENSIBLE: the real tag starts the sub-format GUID.
                    tag = le16(body.saturating_add(24))
                        .ok_or(AudioError::BadWav("fmt chunk too short"))?;
                }
                if channels == 0 || rate == 0 {
                    return Err(AudioError::BadWav("zero channels or sample rate"));
                }
                fmt = Some((tag, channels, rate, bits));
            }
            b"data" => {
                let Some((format_tag, channels, sample_rate, bits_per_sample)) = fmt else {
                    return Err(AudioError::BadWav("data chunk before fmt chunk"));
                };
                let data_len = match size {
                    0 => None,
                    n if n == usize::MAX || u32::try_from(n) == Ok(u32::MAX) => None,
                    n => Some(n),
                };
                return Ok(Some(WavHeader {
                    format_tag,
                    channels,
                    sample_rate,
                    bits_per_sample,
                    data_offset: body,
                    data_len,
                }));
            }
            _ => {}
        }
        // Chunks are padded to an even length.
        pos = body
            .checked_add(size)
            .and_then(|p| p.checked_add(size & 1))
            .ok_or(AudioError::BadWav("chunk size overflows"))?;
    }
}

/// Sample rate and channel count announced by a mime type such as `audio/pcm;rate=24000`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MimeAudio {
    /// `rate=` parameter.
    pub sample_rate: Option<u32>,
    /// `channels=` parameter.
    pub channels: Option<u16>,
}

impl MimeAudio {
    /// Parses the parameters of a mime type; unknown parameters and bad values are ignored.
    pub fn parse(mime: &str) -> Self {
        let mut out = Self::default();
        for param in mime.split(';').skip(1) {
            let Some((k, v)) = param.split_once('=') else {
                continue;
            };
            let k = k.trim();
            let v = v.trim().trim_matches('"');
            if k.eq_ignore_ascii_case("rate") {
                out.sample_rate = v.parse().ok().filter(|&r| r > 0);
            } else if k.eq_ignore_ascii_case("channels") {
                out.channels = v.parse().ok().filter(|&c| c > 0);
            }
        }
        out
    }
}

/// What [`decode_audio_into`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct DecodedAudio {
    /// Samples written (interleaved if more than one channel).
    pub samples: usize,
    /// From the WAV header if there was one, else from the mime type; `None` if neither said,
    /// and the caller applies its default (16 kHz for input, 24 kHz for model output).
    pub sample_rate: Option<u32>,
    /// From the WAV header, else the mime type, else 1.
    pub channels: u16,
    /// The stripped WAV header, if the blob was a whole WAV file.
    pub wav: Option<WavHeader>,
    /// The data ended inside a sample (an odd byte of 16-bit data); that partial sample was
    /// dropped.
    pub odd_byte_dropped: bool,
}

/// Decodes an audio blob (base64 data plus its mime type) into `out`, stripping a WAV header.
///
/// 16-bit integer PCM is produced. A WAV file's samples are converted from its own format:
/// 8-bit unsigned, 16-, 24- or 32-bit integer, 32- or 64-bit float PCM (WAVE_FORMAT_EXTENSIBLE
/// too); anything else is refused with [`AudioError::UnsupportedWav`], which reports what it
/// was. 8-bit data decodes to one sample a byte, more than [`max_pcm_samples`] allows for: size
/// `out` from the [`AudioError::BufferTooSmall`] it reports, or use [`decode_audio`].
pub fn decode_audio_into(
    b64: &str,
    mime: &str,
    out: &mut [i16],
) -> Result<DecodedAudio, AudioError> {
    let announced = MimeAudio::parse(mime);
    let input = b64.as_bytes();
    let wav = if b64.trim_start().starts_with(RIFF_B64) {
        sniff_wav(input)?
    } else {
        None
    };
    if wav.is_none()
        && let Some((samples, odd_byte_dropped)) = simd_decode(input, out)
    {
        return Ok(DecodedAudio {
            samples,
            sample_rate: announced.sample_rate,
            channels: announced.channels.unwrap_or(1),
            wav: None,
            odd_byte_dropped,
        });
    }
    let (skip, remaining) = match &wav {
        Some(h) => {
            let range = (h.data_offset, h.data_len.unwrap_or(usize::MAX));
            if let Some(format) = WavSample::of(h)? {
                return convert_wav(input, h, format, out);
            }
            range
        }
        None => (0, usize::MAX),
    };
    let mut sink = PcmSink {
        out,
        len: 0,
        pending: None,
        skip,
        remaining,
        overflow: 0,
    };
    run(input, &mut sink)?;
    let odd_byte_dropped = finish(&sink)?;
    Ok(DecodedAudio {
        samples: sink.len,
        sample_rate: wav.map(|h| h.sample_rate).or(announced.sample_rate),
        channels: wav.map(|h| h.channels).or(announced.channels).unwrap_or(1),
        wav,
        odd_byte_dropped,
    })
}

/// The samples of a WAV file in `format`, converted to 16-bit.
fn convert_wav(
    input: &[u8],
    h: &WavHeader,
    format: WavSample,
    out: &mut [i16],
) -> Result<DecodedAudio, AudioError> {
    let mut sink = ConvertSink {
        out,
        len: 0,
        format,
        sample: [0; 8],
        filled: 0,
        skip: h.data_offset,
        remaining: h.data_len.unwrap_or(usize::MAX),
        overflow: 0,
    };
    run(input, &mut sink)?;
    if sink.overflow > 0 {
        return Err(AudioError::BufferTooSmall {
            needed: sink.len + sink.overflow,
            capacity: sink.out.len(),
        });
    }
    Ok(DecodedAudio {
        samples: sink.len,
        sample_rate: Some(h.sample_rate),
        channels: h.channels,
        wav: Some(*h),
        odd_byte_dropped: sink.filled > 0,
    })
}

/// Like [`decode_audio_into`], appending to a vector (grown as needed).
pub fn decode_audio(b64: &str, mime: &str, out: &mut Vec<i16>) -> Result<DecodedAudio, AudioError> {
    let start = out.len();
    out.resize(start + max_pcm_samples(b64.len()), 0);
    let mut res = decode_audio_into(b64, mime, out.get_mut(start..).unwrap_or_default());
    if let Err(AudioError::BufferTooSmall { needed, .. }) = res {
        // 8-bit WAV data: a sample a byte. `needed` counts the samples the data holds, at most
        // the bytes the base64 decodes to.
        out.resize(start + needed, 0);
        res = decode_audio_into(b64, mime, out.get_mut(start..).unwrap_or_default());
    }
    let written = res.as_ref().map_or(0, |d| d.samples);
    out.truncate(start + written);
    res
}

fn sniff_wav(input: &[u8]) -> Result<Option<WavHeader>, AudioError> {
    let mut buf = [0u8; WAV_PREFIX];
    let mut sink = PrefixSink {
        buf: &mut buf,
        len: 0,
    };
    run(input, &mut sink)?;
    let len = sink.len;
    match parse_wav_header(buf.get(..len).unwrap_or_default()) {
        // A header cut short by our prefix is only an error if the blob itself ended there.
        Err(AudioError::BadWav(_)) if len == WAV_PREFIX => {
            Err(AudioError::BadWav("data chunk not within the first 8 KiB"))
        }
        other => other,
    }
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn push_group(out: &mut String, w: u32, chars: usize) {
    for k in 0..4 {
        if k < chars {
            let idx = (w >> (18 - 6 * k)) & 63;
            out.push(char::from(ALPHABET[idx as usize]));
        } else {
            out.push('=');
        }
    }
}

/// Appends the standard padded base64 of `samples` as s16le bytes: the inverse of
/// [`decode_pcm_base64`], for sending audio (AUDIO_CHUNK, `inlineData`).
pub fn encode_pcm_base64(samples: &[i16], out: &mut String) {
    out.reserve((samples.len() * 2).div_ceil(3) * 4);
    let mut blocks = samples.chunks_exact(3);
    for s in &mut blocks {
        let [a, b] = s[0].to_le_bytes();
        let [c, d] = s[1].to_le_bytes();
        let [e, f] = s[2].to_le_bytes();
        push_group(
            out,
            (u32::from(a) << 16) | (u32::from(b) << 8) | u32::from(c),
            4,
        );
        push_group(
            out,
            (u32::from(d) << 16) | (u32::from(e) << 8) | u32::from(f),
            4,
        );
    }
    let mut tail = [0u8; 4];
    let mut n = 0;
    for s in blocks.remainder() {
        for b in s.to_le_bytes() {
            tail[n] = b;
            n += 1;
        }
    }
    // 0, 2 or 4 bytes remain.
    let mut rest = tail.get(..n).unwrap_or_default();
    while !rest.is_empty() {
        let take = rest.len().min(3);
        let mut w = 0u32;
        for (k, &b) in rest.iter().take(take).enumerate() {
            w |= u32::from(b) << (16 - 8 * k);
        }
        push_group(out, w, take + 1);
        rest = rest.get(take..).unwrap_or_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples_of(bytes: &[u8]) -> Vec<i16> {
        bytes
            .chunks_exact(2)
            .map(|p| i16::from_le_bytes([p[0], p[1]]))
            .collect()
    }

    #[test]
    fn decodes_known_vector() {
        // 0x0001, 0x7fff, 0x8000 little-endian.
        let b64 = "AQD/fwCA";
        let mut out = [0i16; 3];
        assert_eq!(decode_pcm_base64(b64, &mut out), Ok(3));
        assert_eq!(out, [1, i16::MAX, i16::MIN]);
    }

    #[test]
    fn tolerates_line_breaks_padding_and_url_alphabet() {
        let bytes: Vec<u8> = (0..=255u8).chain(0..=255u8).collect();
        let std = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1Njc4OTo7PD0+P0BBQkNERUZHSElKS0xNTk9QUVJTVFVWV1hZWltcXV5fYGFiY2RlZmdoaWprbG1ub3BxcnN0dXZ3eHl6e3x9fn+AgYKDhIWGh4iJiouMjY6PkJGSk5SVlpeYmZqbnJ2en6ChoqOkpaanqKmqq6ytrq+wsbKztLW2t7i5uru8vb6/wMHCw8TFxsfIycrLzM3Oz9DR0tPU1dbX2Nna29zd3t/g4eLj5OXm5+jp6uvs7e7v8PHy8/T19vf4+fr7/P3+/wABAgMEBQYHCAkKCwwNDg8QERITFBUWFxgZGhscHR4fICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj9AQUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVpbXF1eX2BhYmNkZWZnaGlqa2xtbm9wcXJzdHV2d3h5ent8fX5/gIGCg4SFhoeIiYqLjI2Oj5CRkpOUlZaXmJmam5ydnp+goaKjpKWmp6ipqqusra6vsLGys7S1tre4ubq7vL2+v8DBwsPExcbHyMnKy8zNzs/Q0dLT1NXW19jZ2tvc3d7f4OHi4+Tl5ufo6err7O3u7/Dx8vP09fb3+Pn6+/z9/v8=";
        let wrapped: String = std
            .as_bytes()
            .chunks(76)
            .map(|c| std::str::from_utf8(c).unwrap().to_owned() + "\r\n")
            .collect();
        let url = std.replace('+', "-").replace('/', "_");
        let unpadded = std.trim_end_matches('=');
        for text in [std, wrapped.as_str(), url.as_str(), unpadded] {
            let mut out = vec![0i16; max_pcm_samples(text.len())];
            let n = decode_pcm_base64(text, &mut out).unwrap();
            assert_eq!(&out[..n], samples_of(&bytes).as_slice(), "input {text:?}");
        }
    }

    #[test]
    fn rejects_garbage_with_offset() {
        let mut out = [0i16; 8];
        assert_eq!(
            decode_pcm_base64("AAAA*AAA", &mut out),
            Err(AudioError::InvalidBase64 { offset: 4 })
        );
        assert_eq!(
            decode_pcm_base64("AAAAA", &mut out),
            Err(AudioError::TruncatedBase64)
        );
        assert_eq!(
            decode_pcm_base64("=AAA", &mut out),
            Err(AudioError::InvalidBase64 { offset: 0 })
        );
    }

    #[test]
    fn reports_needed_size() {
        let mut out = [0i16; 2];
        assert_eq!(
            decode_pcm_base64("AQD/fwCAAQD/fwCA", &mut out),
            Err(AudioError::BufferTooSmall {
                needed: 6,
                capacity: 2
            })
        );
    }

    #[test]
    fn mime_rate_and_channels() {
        assert_eq!(
            MimeAudio::parse("audio/pcm;rate=24000"),
            MimeAudio {
                sample_rate: Some(24000),
                channels: None
            }
        );
        assert_eq!(
            MimeAudio::parse("audio/L16; Rate=\"8000\"; channels=2"),
            MimeAudio {
                sample_rate: Some(8000),
                channels: Some(2)
            }
        );
        assert_eq!(MimeAudio::parse("audio/pcm;rate=abc").sample_rate, None);
        assert_eq!(MimeAudio::parse("audio/pcm").sample_rate, None);
    }

    #[test]
    fn encode_matches_decode_for_every_tail_length() {
        for n in 0..10 {
            let samples: Vec<i16> = (0..n)
                .map(|i| i16::try_from(i * 3000 - 15000).unwrap())
                .collect();
            let mut text = String::new();
            encode_pcm_base64(&samples, &mut text);
            assert_eq!(text.len() % 4, 0);
            let mut out = vec![0i16; max_pcm_samples(text.len())];
            let got = decode_pcm_base64(&text, &mut out).unwrap();
            assert_eq!(&out[..got], samples.as_slice());
        }
    }

    #[test]
    fn wav_header_with_extra_chunk() {
        let mut wav = Vec::new();
        wav.extend_from_slice(b"RIFF\0\0\0\0WAVE");
        wav.extend_from_slice(b"LIST\x03\0\0\0abc\0");
        wav.extend_from_slice(b"fmt \x10\0\0\0");
        wav.extend_from_slice(&1u16.to_le_bytes());
        wav.extend_from_slice(&2u16.to_le_bytes());
        wav.extend_from_slice(&44100u32.to_le_bytes());
        wav.extend_from_slice(&(44100u32 * 4).to_le_bytes());
        wav.extend_from_slice(&4u16.to_le_bytes());
        wav.extend_from_slice(&16u16.to_le_bytes());
        wav.extend_from_slice(b"data\x04\0\0\0");
        let h = parse_wav_header(&wav).unwrap().unwrap();
        assert_eq!(
            h,
            WavHeader {
                format_tag: 1,
                channels: 2,
                sample_rate: 44100,
                bits_per_sample: 16,
                data_offset: wav.len(),
                data_len: Some(4),
            }
        );
        assert_eq!(parse_wav_header(b"not a wav file"), Ok(None));
        assert!(parse_wav_header(&wav[..30]).is_err());
    }
}
