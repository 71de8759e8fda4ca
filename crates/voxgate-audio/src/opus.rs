//! Mono Opus encoder and decoder with a choice of backend.
//!
//! [`OpusBackend::Pure`] (the enum's default) is the pure-Rust `opus-rs` port of libopus 1.6.
//! [`OpusBackend::Libopus`] is the reference C library (1.6.1), compiled from its sources by the
//! `voxgate-opus-sys` crate with the `cc` crate: a fresh machine needs only the Rust toolchain's C
//! compiler, no cmake. It comes with the `libopus` cargo feature, on by default; build with
//! `default-features = false` for pure Rust alone. Both speak the same bitstream (RFC 6716); the
//! crate's tests encode with one and decode with the other.
//!
//! What each backend supports here:
//!
//! | | `opus-rs` | libopus |
//! |---|---|---|
//! | rates | 8, 12, 16, 24, 48 kHz | 8, 12, 16, 24, 48 kHz |
//! | frames | 20, 40, 60 ms | 20, 40, 60 ms |
//! | bitrate, complexity, CBR/VBR | yes | yes |
//! | packet-loss concealment | yes (empty packet) | yes |
//! | in-band FEC | not exposed here | not exposed here |
//!
//! Both decoders downmix a stereo packet to mono, as libopus does. Corrupt packets come back as
//! [`OpusError::Corrupt`], never a panic: every packet is first checked against the framing
//! rules of RFC 6716 section 3.2 (libopus checks the same; `opus-rs` 0.1.40 does not, and panics
//! on an over-long frame, found by the `audio_decode` fuzz target), and a panic inside `opus-rs`
//! on a packet that passes is caught and reported as corrupt, with the decoder rebuilt.
//!
//! Known limits of `opus-rs` 0.1.40 compared with libopus: no public control of the coded
//! bandwidth or signal type, so a 24 kHz VoIP encoder always runs hybrid SILK+CELT, which costs
//! about 35 % more CPU than libopus at complexity 5 (see the crate README for figures).

use thiserror::Error;

/// Largest Opus packet for one frame (RFC 6716 section 3.2.1).
pub const MAX_PACKET_BYTES: usize = 1276;

/// Which Opus implementation does the work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum OpusBackend {
    /// The pure-Rust `opus-rs` crate.
    #[default]
    Pure,
    /// The reference C libopus, through `voxgate-opus-sys` (needs the `libopus` feature, on by
    /// default).
    Libopus,
}

impl OpusBackend {
    /// True when this build can construct the backend.
    #[must_use]
    pub const fn is_available(self) -> bool {
        match self {
            Self::Pure => true,
            Self::Libopus => cfg!(feature = "libopus"),
        }
    }
}

/// Length of one encoded frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum FrameDuration {
    /// 20 ms.
    Ms20,
    /// 40 ms.
    Ms40,
    /// 60 ms, the Xiaozhi default.
    #[default]
    Ms60,
}

impl FrameDuration {
    /// Duration in milliseconds.
    #[must_use]
    pub const fn millis(self) -> u32 {
        match self {
            Self::Ms20 => 20,
            Self::Ms40 => 40,
            Self::Ms60 => 60,
        }
    }

    /// The frame length for `millis`, if it is one Opus frames here can have.
    #[must_use]
    pub const fn from_millis(millis: u32) -> Option<Self> {
        match millis {
            20 => Some(Self::Ms20),
            40 => Some(Self::Ms40),
            60 => Some(Self::Ms60),
            _ => None,
        }
    }

    /// Samples in one frame at `sample_rate`.
    #[must_use]
    pub const fn samples(self, sample_rate: u32) -> usize {
        (sample_rate / 1000 * self.millis()) as usize
    }
}

/// The encoder's tuning target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum OpusApplication {
    /// Speech: favours intelligibility (SILK/hybrid).
    #[default]
    Voip,
    /// General audio.
    Audio,
    /// Lowest algorithmic delay (CELT only).
    LowDelay,
}

/// Who is to blame for an Opus failure.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum OpusError {
    /// The peer sent a packet that does not decode.
    #[error("corrupt Opus packet: {0}")]
    Corrupt(String),
    /// The caller asked for something the codec does not do (rate, frame size, setting).
    #[error("invalid Opus configuration: {0}")]
    InvalidConfig(String),
    /// The caller passed a PCM frame of the wrong length.
    #[error("expected {expected} samples per frame, got {got}")]
    FrameLength {
        /// Samples the encoder was configured for.
        expected: usize,
        /// Samples passed.
        got: usize,
    },
    /// The backend is not compiled in (enable the `libopus` feature).
    #[error("Opus backend {0:?} is not compiled in")]
    BackendUnavailable(OpusBackend),
    /// The codec failed on valid input (a bug in the backend).
    #[error("Opus codec failure: {0}")]
    Internal(String),
}

fn check_rate(sample_rate: u32) -> Result<(), OpusError> {
    if matches!(sample_rate, 8000 | 12_000 | 16_000 | 24_000 | 48_000) {
        Ok(())
    } else {
        Err(OpusError::InvalidConfig(format!(
            "sample rate {sample_rate} Hz is not an Opus rate (8, 12, 16, 24 or 48 kHz); resample first"
        )))
    }
}

/// Settings for an [`OpusEncoder`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpusEncoderConfig {
    /// Input rate: 8000, 12000, 16000, 24000 or 48000.
    pub sample_rate: u32,
    /// Frame length.
    pub frame_duration: FrameDuration,
    /// Target bitrate in bits per second (500..=512000).
    pub bitrate: u32,
    /// Encoder effort 0..=10; higher is better quality for more CPU.
    pub complexity: u8,
    /// Constant bitrate instead of the default variable bitrate.
    pub cbr: bool,
    /// Tuning target.
    pub application: OpusApplication,
    /// Implementation.
    pub backend: OpusBackend,
}

impl OpusEncoderConfig {
    /// Speech defaults for `sample_rate`: 60 ms frames, 24 kbit/s, complexity 5, VBR, `opus-rs`.
    #[must_use]
    pub const fn voice(sample_rate: u32) -> Self {
        Self {
            sample_rate,
            frame_duration: FrameDuration::Ms60,
            bitrate: 24_000,
            complexity: 5,
            cbr: false,
            application: OpusApplication::Voip,
            backend: OpusBackend::Pure,
        }
    }

    fn validate(&self) -> Result<(), OpusError> {
        check_rate(self.sample_rate)?;
        if !(500..=512_000).contains(&self.bitrate) {
            return Err(OpusError::InvalidConfig(format!(
                "bitrate {} outside 500..=512000",
                self.bitrate
            )));
        }
        if self.complexity > 10 {
            return Err(OpusError::InvalidConfig(format!(
                "complexity {} outside 0..=10",
                self.complexity
            )));
        }
        if !self.backend.is_available() {
            return Err(OpusError::BackendUnavailable(self.backend));
        }
        Ok(())
    }
}

enum EncoderImpl {
    Pure(Box<opus_rs::OpusEncoder>),
    #[cfg(feature = "libopus")]
    Libopus(voxgate_opus_sys::Encoder),
}

/// A mono Opus encoder producing one packet per frame.
pub struct OpusEncoder {
    config: OpusEncoderConfig,
    frame_samples: usize,
    inner: EncoderImpl,
    packet: [u8; MAX_PACKET_BYTES],
    // `encode_f32` converts into this once, so both backends take their integer path. Empty
    // until then: `i16` callers never need it.
    scratch_i16: Vec<i16>,
}

impl std::fmt::Debug for OpusEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpusEncoder")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl OpusEncoder {
    /// Builds an encoder.
    ///
    /// # Errors
    /// [`OpusError::InvalidConfig`] for an unsupported rate, bitrate or complexity, and
    /// [`OpusError::BackendUnavailable`] for a backend that is not compiled in.
    pub fn new(config: OpusEncoderConfig) -> Result<Self, OpusError> {
        config.validate()?;
        let frame_samples = config.frame_duration.samples(config.sample_rate);
        let inner = match config.backend {
            OpusBackend::Pure => {
                let app = match config.application {
                    OpusApplication::Voip => opus_rs::Application::Voip,
                    OpusApplication::Audio => opus_rs::Application::Audio,
                    OpusApplication::LowDelay => opus_rs::Application::RestrictedLowDelay,
                };
                let rate = i32::try_from(config.sample_rate).unwrap_or(0);
                let enc = opus_rs::OpusEncoder::new(rate, 1, app)
                    .map_err(|e| OpusError::InvalidConfig(e.to_owned()))?;
                EncoderImpl::Pure(Box::new(enc))
            }
            #[cfg(feature = "libopus")]
            OpusBackend::Libopus => {
                use voxgate_opus_sys::Application;
                let app = match config.application {
                    OpusApplication::Voip => Application::Voip,
                    OpusApplication::Audio => Application::Audio,
                    OpusApplication::LowDelay => Application::RestrictedLowDelay,
                };
                let enc = voxgate_opus_sys::Encoder::new(config.sample_rate, 1, app)
                    .map_err(|e| OpusError::InvalidConfig(e.to_string()))?;
                EncoderImpl::Libopus(enc)
            }
            #[cfg(not(feature = "libopus"))]
            OpusBackend::Libopus => return Err(OpusError::BackendUnavailable(config.backend)),
        };
        let mut this = Self {
            config,
            frame_samples,
            inner,
            packet: [0; MAX_PACKET_BYTES],
            scratch_i16: Vec::new(),
        };
        this.apply_settings()?;
        Ok(this)
    }

    fn apply_settings(&mut self) -> Result<(), OpusError> {
        let c = self.config;
        let bitrate = i32::try_from(c.bitrate).unwrap_or(i32::MAX);
        match &mut self.inner {
            EncoderImpl::Pure(e) => {
                e.bitrate_bps = bitrate;
                e.complexity = i32::from(c.complexity);
                e.use_cbr = c.cbr;
            }
            #[cfg(feature = "libopus")]
            EncoderImpl::Libopus(e) => {
                let err = |e: voxgate_opus_sys::Error| OpusError::InvalidConfig(e.to_string());
                e.set_bitrate(bitrate).map_err(err)?;
                e.set_complexity(i32::from(c.complexity)).map_err(err)?;
                e.set_vbr(!c.cbr).map_err(err)?;
            }
        }
        Ok(())
    }

    /// The configuration in force.
    #[must_use]
    pub const fn config(&self) -> &OpusEncoderConfig {
        &self.config
    }

    /// Samples each [`encode`](Self::encode) call takes.
    #[must_use]
    pub const fn frame_samples(&self) -> usize {
        self.frame_samples
    }

    /// Changes the target bitrate for the next frames.
    ///
    /// # Errors
    /// [`OpusError::InvalidConfig`] outside 500..=512000.
    pub fn set_bitrate(&mut self, bitrate: u32) -> Result<(), OpusError> {
        let mut next = self.config;
        next.bitrate = bitrate;
        next.validate()?;
        self.config = next;
        self.apply_settings()
    }

    /// Changes the encoder effort for the next frames.
    ///
    /// # Errors
    /// [`OpusError::InvalidConfig`] above 10.
    pub fn set_complexity(&mut self, complexity: u8) -> Result<(), OpusError> {
        let mut next = self.config;
        next.complexity = complexity;
        next.validate()?;
        self.config = next;
        self.apply_settings()
    }

    fn check_len(&self, got: usize) -> Result<(), OpusError> {
        if got == self.frame_samples {
            Ok(())
        } else {
            Err(OpusError::FrameLength {
                expected: self.frame_samples,
                got,
            })
        }
    }

    /// Encodes exactly one frame of `i16` PCM; the packet borrows the encoder's buffer.
    ///
    /// # Errors
    /// [`OpusError::FrameLength`] for a frame of the wrong length.
    pub fn encode(&mut self, pcm: &[i16]) -> Result<&[u8], OpusError> {
        self.check_len(pcm.len())?;
        let n = match &mut self.inner {
            EncoderImpl::Pure(e) => e
                .encode_i16(pcm, pcm.len(), &mut self.packet)
                .map_err(|e| OpusError::Internal(e.to_owned()))?,
            #[cfg(feature = "libopus")]
            EncoderImpl::Libopus(e) => e
                .encode(pcm, &mut self.packet)
                .map_err(|e| OpusError::Internal(e.to_string()))?,
        };
        Ok(&self.packet[..n.min(MAX_PACKET_BYTES)])
    }

    /// Encodes exactly one frame of `f32` PCM in `-1.0..=1.0`.
    ///
    /// # Errors
    /// [`OpusError::FrameLength`] for a frame of the wrong length.
    pub fn encode_f32(&mut self, pcm: &[f32]) -> Result<&[u8], OpusError> {
        self.check_len(pcm.len())?;
        // The pure backend's speech path is integer, and libopus clamps nothing on the float
        // path: one conversion here serves both and keeps out-of-range input well defined.
        self.scratch_i16.clear();
        self.scratch_i16
            .extend(pcm.iter().map(|&s| crate::format::f32_to_i16(s)));
        let scratch = std::mem::take(&mut self.scratch_i16);
        let result = self.encode(&scratch).map(<[u8]>::len);
        self.scratch_i16 = scratch;
        let n = result?;
        Ok(&self.packet[..n])
    }
}

enum DecoderImpl {
    Pure(Box<opus_rs::OpusDecoder>),
    #[cfg(feature = "libopus")]
    Libopus(voxgate_opus_sys::Decoder),
}

/// A mono Opus decoder with packet-loss concealment.
pub struct OpusDecoder {
    sample_rate: u32,
    backend: OpusBackend,
    inner: DecoderImpl,
    /// Samples in the longest packet (120 ms): the size of each output buffer once used.
    max_samples: usize,
    /// Output buffers, each sized on its first use: a caller decodes to one sample type, and
    /// the other would be kilobytes per session held for nothing.
    pcm_f32: Vec<f32>,
    pcm_i16: Vec<i16>,
    last_frame: usize,
}

impl std::fmt::Debug for OpusDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpusDecoder")
            .field("sample_rate", &self.sample_rate)
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

impl OpusDecoder {
    /// Builds a mono decoder producing `sample_rate` audio (any Opus rate, whatever the encoder
    /// used).
    ///
    /// # Errors
    /// [`OpusError::InvalidConfig`] for a rate Opus does not decode to, and
    /// [`OpusError::BackendUnavailable`] for a backend that is not compiled in.
    pub fn new(sample_rate: u32, backend: OpusBackend) -> Result<Self, OpusError> {
        check_rate(sample_rate)?;
        let inner = match backend {
            OpusBackend::Pure => {
                let rate = i32::try_from(sample_rate).unwrap_or(0);
                DecoderImpl::Pure(Box::new(
                    opus_rs::OpusDecoder::new(rate, 1)
                        .map_err(|e| OpusError::InvalidConfig(e.to_owned()))?,
                ))
            }
            #[cfg(feature = "libopus")]
            OpusBackend::Libopus => DecoderImpl::Libopus(
                voxgate_opus_sys::Decoder::new(sample_rate, 1)
                    .map_err(|e| OpusError::InvalidConfig(e.to_string()))?,
            ),
            #[cfg(not(feature = "libopus"))]
            OpusBackend::Libopus => return Err(OpusError::BackendUnavailable(backend)),
        };
        Ok(Self {
            sample_rate,
            backend,
            inner,
            // 120 ms is the longest packet Opus allows.
            max_samples: sample_rate as usize * 120 / 1000,
            pcm_f32: Vec::new(),
            pcm_i16: Vec::new(),
            last_frame: FrameDuration::Ms20.samples(sample_rate),
        })
    }

    /// Output rate in Hz.
    #[must_use]
    pub const fn sample_rate(&self) -> u32 {
        self.sample_rate
    }

    /// The implementation in use.
    #[must_use]
    pub const fn backend(&self) -> OpusBackend {
        self.backend
    }

    /// Decodes one packet to `i16` PCM, borrowed from the decoder.
    ///
    /// # Errors
    /// [`OpusError::Corrupt`] for a packet that does not decode (including an empty one: use
    /// [`conceal`](Self::conceal) for a lost packet).
    pub fn decode(&mut self, packet: &[u8]) -> Result<&[i16], OpusError> {
        let n = self.decode_inner(packet, false)?;
        Ok(&self.pcm_i16[..n])
    }

    /// Decodes one packet to `f32` PCM in `-1.0..=1.0`, borrowed from the decoder.
    ///
    /// # Errors
    /// As [`decode`](Self::decode).
    pub fn decode_f32(&mut self, packet: &[u8]) -> Result<&[f32], OpusError> {
        let n = self.decode_inner(packet, true)?;
        Ok(&self.pcm_f32[..n])
    }

    /// Synthesises `samples` of audio for a lost packet from the decoder state (packet-loss
    /// concealment); pass the lost packet's length, usually the previous frame's, see
    /// [`last_frame_samples`](Self::last_frame_samples).
    ///
    /// # Errors
    /// [`OpusError::InvalidConfig`] when `samples` is not a multiple of 2.5 ms or exceeds 120 ms.
    pub fn conceal(&mut self, samples: usize) -> Result<&[i16], OpusError> {
        let step = self.sample_rate as usize / 400;
        if samples == 0 || !samples.is_multiple_of(step) || samples > self.max_samples {
            return Err(OpusError::InvalidConfig(format!(
                "cannot conceal {samples} samples: need a multiple of 2.5 ms up to 120 ms"
            )));
        }
        self.size_buffers(matches!(self.inner, DecoderImpl::Pure(_)), true);
        let n = match &mut self.inner {
            DecoderImpl::Pure(d) => {
                let n = d
                    .decode(&[], samples, &mut self.pcm_f32[..samples])
                    .map_err(|e| OpusError::Internal(e.to_owned()))?;
                to_i16(&self.pcm_f32[..n], &mut self.pcm_i16[..n]);
                n
            }
            #[cfg(feature = "libopus")]
            DecoderImpl::Libopus(d) => d
                .decode(&[], &mut self.pcm_i16[..samples], false)
                .map_err(|e| OpusError::Internal(e.to_string()))?,
        };
        Ok(&self.pcm_i16[..n.min(samples)])
    }

    /// Samples in the last decoded packet (20 ms before the first): the usual length to conceal.
    #[must_use]
    pub const fn last_frame_samples(&self) -> usize {
        self.last_frame
    }

    /// Clears the decoder state, e.g. for a new stream from the same peer.
    ///
    /// # Errors
    /// [`OpusError::Internal`] if the backend cannot be rebuilt.
    pub fn reset(&mut self) -> Result<(), OpusError> {
        *self = Self::new(self.sample_rate, self.backend)?;
        Ok(())
    }

    fn decode_inner(&mut self, packet: &[u8], want_f32: bool) -> Result<usize, OpusError> {
        // An empty packet means "lost" to both libraries; from a peer it is malformed, and
        // concealment is a separate, explicit call. (A lone TOC byte is legal: a DTX frame.)
        validate_packet(packet).map_err(|e| OpusError::Corrupt(e.to_owned()))?;
        let pure = matches!(self.inner, DecoderImpl::Pure(_));
        // opus-rs decodes to `f32` only; libopus to the type asked for.
        self.size_buffers(want_f32 || pure, !want_f32);
        let max = self.max_samples;
        let n = match &mut self.inner {
            DecoderImpl::Pure(d) => {
                // Second line of defence after `validate_packet`: a panic inside opus-rs on a
                // packet that passes the framing rules becomes a corrupt-packet error and a
                // fresh decoder, not a crashed server. (The fuzz target aborts on panics, so
                // any such case still shows up there.)
                let pcm = &mut self.pcm_f32;
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    d.decode(packet, max, pcm)
                }));
                let n = match result {
                    Ok(r) => r.map_err(|e| OpusError::Corrupt(e.to_owned()))?,
                    Err(_) => {
                        let rate = i32::try_from(self.sample_rate).unwrap_or(0);
                        if let Ok(fresh) = opus_rs::OpusDecoder::new(rate, 1) {
                            **d = fresh;
                        }
                        return Err(OpusError::Corrupt("opus-rs panicked on this packet".into()));
                    }
                }
                .min(max);
                if !want_f32 {
                    to_i16(&self.pcm_f32[..n], &mut self.pcm_i16[..n]);
                }
                n
            }
            #[cfg(feature = "libopus")]
            DecoderImpl::Libopus(d) => if want_f32 {
                d.decode_float(packet, &mut self.pcm_f32[..max], false)
            } else {
                d.decode(packet, &mut self.pcm_i16[..max], false)
            }
            .map_err(|e| OpusError::Corrupt(e.to_string()))?
            .min(max),
        };
        if want_f32 {
            // libopus's float decoder does not clip (its `i16` path does): a hostile packet
            // stream drove it to thousands (found by the `opus_libopus` fuzz target).
            for s in &mut self.pcm_f32[..n] {
                *s = if s.is_nan() { 0.0 } else { s.clamp(-1.0, 1.0) };
            }
        }
        self.last_frame = n;
        Ok(n)
    }

    /// Gives the output buffers that are about to be used their full size (once).
    fn size_buffers(&mut self, f32_out: bool, i16_out: bool) {
        if f32_out && self.pcm_f32.len() < self.max_samples {
            self.pcm_f32.resize(self.max_samples, 0.0);
        }
        if i16_out && self.pcm_i16.len() < self.max_samples {
            self.pcm_i16.resize(self.max_samples, 0);
        }
    }
}

/// Checks a packet against RFC 6716 section 3.2 (frame packing) before a backend sees it:
/// every frame at most 1275 bytes, code-3 frame counts 1..=48 and at most 120 ms of audio, and
/// lengths and padding that fit the packet. libopus does the same in `opus_packet_parse`;
/// `opus-rs` 0.1.40 does not reject oversized frames and can panic on them, so both backends get
/// this gate.
fn validate_packet(packet: &[u8]) -> Result<(), &'static str> {
    const MAX_FRAME: usize = 1275;
    let (&toc, mut rest) = packet.split_first().ok_or("empty packet")?;
    // Frame duration in units of 2.5 ms, from the TOC's configuration number (RFC 6716 table 2).
    let config = toc >> 3;
    let units: usize = match config {
        0..=11 => [4, 8, 16, 24][usize::from(config % 4)],
        12..=15 => [4, 8][usize::from(config % 2)],
        _ => [1, 2, 4, 8][usize::from(config % 4)],
    };
    let frame_len = |rest: &mut &[u8]| -> Result<usize, &'static str> {
        match *rest {
            [b0 @ 0..=251, tail @ ..] => {
                *rest = tail;
                Ok(usize::from(*b0))
            }
            [b0, b1, tail @ ..] => {
                *rest = tail;
                Ok(usize::from(*b0) + 4 * usize::from(*b1))
            }
            _ => Err("truncated frame length"),
        }
    };
    match toc & 3 {
        0 => {
            if rest.len() > MAX_FRAME {
                return Err("frame longer than 1275 bytes");
            }
        }
        1 => {
            if rest.len() % 2 != 0 || rest.len() / 2 > MAX_FRAME {
                return Err("code 1 frames of unequal or excessive size");
            }
        }
        2 => {
            let first = frame_len(&mut rest)?;
            if first > rest.len() || first > MAX_FRAME || rest.len() - first > MAX_FRAME {
                return Err("code 2 frame lengths do not fit");
            }
        }
        _ => {
            let (&count_byte, tail) = rest.split_first().ok_or("code 3 without frame count")?;
            rest = tail;
            let count = usize::from(count_byte & 0x3f);
            if count == 0 || count * units > 48 {
                return Err("code 3 frame count is zero or over 120 ms");
            }
            if count_byte & 0x40 != 0 {
                let mut padding = 0usize;
                loop {
                    let (&p, tail) = rest.split_first().ok_or("truncated padding length")?;
                    rest = tail;
                    padding += if p == 255 { 254 } else { usize::from(p) };
                    if p != 255 {
                        break;
                    }
                }
                rest = rest
                    .get(
                        ..rest
                            .len()
                            .checked_sub(padding)
                            .ok_or("padding longer than packet")?,
                    )
                    .ok_or("padding longer than packet")?;
            }
            if count_byte & 0x80 != 0 {
                let mut total = 0usize;
                for _ in 1..count {
                    let n = frame_len(&mut rest)?;
                    if n > MAX_FRAME {
                        return Err("frame longer than 1275 bytes");
                    }
                    total += n;
                }
                let last = rest
                    .len()
                    .checked_sub(total)
                    .ok_or("frame lengths exceed packet")?;
                if last > MAX_FRAME {
                    return Err("frame longer than 1275 bytes");
                }
            } else if rest.len() % count != 0 || rest.len() / count > MAX_FRAME {
                return Err("code 3 CBR frames of unequal or excessive size");
            }
        }
    }
    Ok(())
}

fn to_i16(src: &[f32], dst: &mut [i16]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = crate::format::f32_to_i16(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tone(rate: u32, n: usize, offset: usize) -> Vec<i16> {
        (0..n)
            .map(|i| {
                let t = (i + offset) as f32 / rate as f32;
                let s = 0.3 * (std::f32::consts::TAU * 300.0 * t).sin()
                    + 0.2 * (std::f32::consts::TAU * 1100.0 * t).sin();
                crate::format::f32_to_i16(s)
            })
            .collect()
    }

    fn energy(x: &[i16]) -> f64 {
        x.iter().map(|&s| f64::from(s).powi(2)).sum::<f64>() / x.len().max(1) as f64
    }

    #[test]
    fn rejects_bad_settings() {
        let mut c = OpusEncoderConfig::voice(22_050);
        assert!(matches!(
            OpusEncoder::new(c),
            Err(OpusError::InvalidConfig(_))
        ));
        c.sample_rate = 16_000;
        c.complexity = 11;
        assert!(OpusEncoder::new(c).is_err());
        c.complexity = 5;
        c.bitrate = 100;
        assert!(OpusEncoder::new(c).is_err());
        c.bitrate = 24_000;
        let mut e = OpusEncoder::new(c).unwrap();
        assert_eq!(
            e.encode(&[0; 10]).unwrap_err(),
            OpusError::FrameLength {
                expected: 960,
                got: 10
            }
        );
        assert!(e.set_complexity(12).is_err());
        assert_eq!(e.config().complexity, 5);
    }

    #[cfg(not(feature = "libopus"))]
    #[test]
    fn libopus_needs_its_feature() {
        assert!(!OpusBackend::Libopus.is_available());
        assert_eq!(
            OpusDecoder::new(16_000, OpusBackend::Libopus).unwrap_err(),
            OpusError::BackendUnavailable(OpusBackend::Libopus)
        );
    }

    #[test]
    fn round_trip_every_rate_and_frame() {
        for rate in [8000, 12_000, 16_000, 24_000, 48_000] {
            for fd in [
                FrameDuration::Ms20,
                FrameDuration::Ms40,
                FrameDuration::Ms60,
            ] {
                let mut cfg = OpusEncoderConfig::voice(rate);
                cfg.frame_duration = fd;
                let mut enc = OpusEncoder::new(cfg).unwrap();
                let mut dec = OpusDecoder::new(rate, OpusBackend::Pure).unwrap();
                let n = enc.frame_samples();
                assert_eq!(n, fd.samples(rate));
                let mut last = Vec::new();
                for k in 0..8 {
                    let pcm = tone(rate, n, k * n);
                    let pkt = enc.encode(&pcm).unwrap().to_vec();
                    assert!(pkt.len() > 2 && pkt.len() <= MAX_PACKET_BYTES);
                    last = dec.decode(&pkt).unwrap().to_vec();
                    assert_eq!(last.len(), n, "{rate} {fd:?}");
                }
                let e_in = energy(&tone(rate, n, 7 * n));
                let e_out = energy(&last);
                assert!(
                    e_out > e_in * 0.3 && e_out < e_in * 2.0,
                    "{rate} {fd:?}: energy {e_out} vs {e_in}"
                );
            }
        }
    }

    #[test]
    fn bitrate_changes_packet_size() {
        let mut cfg = OpusEncoderConfig::voice(16_000);
        cfg.cbr = true;
        cfg.bitrate = 12_000;
        let mut enc = OpusEncoder::new(cfg).unwrap();
        let pcm = tone(16_000, 960, 0);
        let small = enc.encode(&pcm).unwrap().len();
        enc.set_bitrate(48_000).unwrap();
        let big = enc.encode(&pcm).unwrap().len();
        assert!(big > small * 2, "{small} -> {big}");
    }

    #[test]
    fn concealment_fills_a_lost_frame() {
        let mut enc = OpusEncoder::new(OpusEncoderConfig::voice(16_000)).unwrap();
        let mut dec = OpusDecoder::new(16_000, OpusBackend::Pure).unwrap();
        for k in 0..5 {
            let pkt = enc.encode(&tone(16_000, 960, k * 960)).unwrap().to_vec();
            dec.decode(&pkt).unwrap();
        }
        assert_eq!(dec.last_frame_samples(), 960);
        let plc = dec.conceal(960).unwrap();
        assert_eq!(plc.len(), 960);
        assert!(energy(plc) > 0.0, "concealment continues the signal");
        assert!(dec.conceal(100).is_err());
    }

    #[test]
    fn corrupt_packets_are_errors() {
        let mut dec = OpusDecoder::new(16_000, OpusBackend::Pure).unwrap();
        assert!(matches!(dec.decode(&[]), Err(OpusError::Corrupt(_))));
        // A lone TOC byte is a DTX frame: concealed, not an error.
        assert_eq!(dec.decode(&[0x78]).unwrap().len(), 320);
        // Code 3 with a frame count of zero.
        assert!(matches!(
            dec.decode(&[0x7b, 0x00]),
            Err(OpusError::Corrupt(_))
        ));
        // Code 3 claiming 48 frames of 60 ms (2.88 s), over the 120 ms limit.
        assert!(dec.decode(&[0x7b, 48, 0, 0, 0]).is_err());
        // Code 0 with a 1276-byte frame.
        let mut big = vec![0x78];
        big.resize(1277, 0x55);
        assert!(matches!(dec.decode(&big), Err(OpusError::Corrupt(_))));
        // Code 2 whose first frame claims more than the packet holds.
        assert!(dec.decode(&[0x7a, 200, 1, 2]).is_err());
        // Code 3 VBR with padding longer than the packet.
        assert!(dec.decode(&[0x7b, 0xc2, 255, 255, 3, 1]).is_err());
    }

    #[test]
    fn validator_accepts_what_encoders_produce() {
        for rate in [8000, 16_000, 24_000, 48_000] {
            for fd in [
                FrameDuration::Ms20,
                FrameDuration::Ms40,
                FrameDuration::Ms60,
            ] {
                for application in [
                    OpusApplication::Voip,
                    OpusApplication::Audio,
                    OpusApplication::LowDelay,
                ] {
                    let mut enc = OpusEncoder::new(OpusEncoderConfig {
                        frame_duration: fd,
                        application,
                        bitrate: 64_000,
                        ..OpusEncoderConfig::voice(rate)
                    })
                    .unwrap();
                    for k in 0..3 {
                        let pkt = enc
                            .encode(&tone(rate, enc.frame_samples(), k * 960))
                            .unwrap();
                        assert_eq!(
                            validate_packet(pkt),
                            Ok(()),
                            "{rate} {fd:?} {application:?}"
                        );
                    }
                }
            }
        }
    }

    /// Regression (found by the `opus_libopus` fuzz target): libopus's float decoder does not
    /// clip, and the same packet fed repeatedly drove `decode_f32` output to hundreds (the
    /// documented range is `-1.0..=1.0`; the `i16` path saturates).
    #[cfg(feature = "libopus")]
    #[test]
    fn libopus_f32_output_stays_in_range() {
        let hex: String = [
            "e2ee8ee878e4bae20ce3cfe42ee748e959eae0e9b8e721e4b1df3cdbaed7dad558d666d9dbde2ee68dee02f7",
            "9efea204a208950ad10a000af808920884093a0cbd10b8167d1d2a24cb298e2de02e8e2dcb292a247d1db816",
            "bd103a0c84099208f808000ad10a950aa208a2049efe02f78dee2ee6dbde66d958d6dad5aed73cdbb1df21e4",
            "b8e7e0e959ea48e92ee7cfe40ce3bae278e48ee8e2eef7f6000009091e117217881b461df41c311bd218b816",
            "a71520164818df1b4f20c4245228262aa8299a262521d2197311fe0862015efb5ef76bf52ff500f608f76ef7",
            "7cf6c6f343ef48e983e2d6db35d672d220d172d235d6d6db83e2",
        ]
        .concat();
        let packet: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        for backend in [OpusBackend::Libopus, OpusBackend::Pure] {
            let mut dec = OpusDecoder::new(16_000, backend).unwrap();
            let mut peak = 0f32;
            for _ in 0..8 {
                let pcm = dec.decode_f32(&packet).unwrap();
                assert!(!pcm.is_empty());
                peak = pcm.iter().fold(peak, |m, s| m.max(s.abs()));
            }
            assert!(peak <= 1.0, "{backend:?}: peak {peak}");
        }
    }

    /// The framing gate agrees with libopus's own packet parser on arbitrary packets.
    #[cfg(feature = "libopus")]
    mod against_libopus {
        use super::super::validate_packet;
        use proptest::prelude::*;

        fn packet() -> impl Strategy<Value = Vec<u8>> {
            // Mostly short packets, every TOC code, and code-3 count bytes with the padding and
            // VBR flags set often enough to matter.
            (
                any::<u8>(),
                any::<u8>(),
                proptest::collection::vec(any::<u8>(), 0..40),
                0usize..1400,
            )
                .prop_map(|(toc, count, body, filler)| {
                    let mut p = vec![toc, count];
                    p.extend_from_slice(&body);
                    if toc & 1 == 0 {
                        p.resize(p.len() + filler, 0x11);
                    }
                    p
                })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2000))]
            #[test]
            fn same_verdict_as_opus_packet_parse(p in packet()) {
                let ours = validate_packet(&p).is_ok();
                let theirs = voxgate_opus_sys::packet_parse(&p).is_ok();
                prop_assert_eq!(ours, theirs, "packet {:02x?}", &p[..p.len().min(16)]);
            }
        }
    }
}
