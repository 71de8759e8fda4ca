//! libopus, compiled from its C sources by `build.rs` with the `cc` crate (a C compiler is all
//! it needs: no cmake), and a small safe API over the few functions voxgate uses.
//!
//! The codec state lives in memory allocated from Rust (`opus_*_get_size` + `opus_*_init`
//! rather than `opus_*_create`), so it is counted by Rust's allocator like any other state and
//! freed by `Drop`; libopus allocates nothing else for encode and decode (its scratch arrays are
//! C99 variable-length arrays on the stack).
//!
//! This is voxgate's only crate with `unsafe` code for libopus (the others are
//! `voxgate-espeak`, for espeak-ng, and the test-only `voxgate-test-support`): every call is
//! wrapped here with its preconditions checked, so callers stay in safe Rust.
#![allow(unsafe_code)]

use std::ffi::{CStr, c_int, c_uchar};

/// The raw C declarations (from libopus's `include/opus.h` and `opus_defines.h`).
mod ffi {
    use std::ffi::{c_char, c_int, c_uchar};

    /// `OpusEncoder`, opaque.
    #[repr(C)]
    pub(crate) struct OpusEncoder {
        _private: [u8; 0],
    }

    /// `OpusDecoder`, opaque.
    #[repr(C)]
    pub(crate) struct OpusDecoder {
        _private: [u8; 0],
    }

    unsafe extern "C" {
        pub(crate) fn opus_encoder_get_size(channels: c_int) -> c_int;
        pub(crate) fn opus_encoder_init(
            st: *mut OpusEncoder,
            fs: i32,
            channels: c_int,
            application: c_int,
        ) -> c_int;
        pub(crate) fn opus_encode(
            st: *mut OpusEncoder,
            pcm: *const i16,
            frame_size: c_int,
            data: *mut c_uchar,
            max_data_bytes: i32,
        ) -> i32;
        pub(crate) fn opus_encoder_ctl(st: *mut OpusEncoder, request: c_int, ...) -> c_int;
        pub(crate) fn opus_decoder_get_size(channels: c_int) -> c_int;
        pub(crate) fn opus_decoder_init(st: *mut OpusDecoder, fs: i32, channels: c_int) -> c_int;
        pub(crate) fn opus_decode(
            st: *mut OpusDecoder,
            data: *const c_uchar,
            len: i32,
            pcm: *mut i16,
            frame_size: c_int,
            decode_fec: c_int,
        ) -> c_int;
        pub(crate) fn opus_decode_float(
            st: *mut OpusDecoder,
            data: *const c_uchar,
            len: i32,
            pcm: *mut f32,
            frame_size: c_int,
            decode_fec: c_int,
        ) -> c_int;
        pub(crate) fn opus_packet_parse(
            data: *const c_uchar,
            len: i32,
            out_toc: *mut c_uchar,
            frames: *mut *const c_uchar,
            size: *mut i16,
            payload_offset: *mut c_int,
        ) -> c_int;
        pub(crate) fn opus_strerror(error: c_int) -> *const c_char;
        pub(crate) fn opus_get_version_string() -> *const c_char;
    }

    pub(crate) const OPUS_OK: c_int = 0;
    pub(crate) const OPUS_BAD_ARG: c_int = -1;
    pub(crate) const OPUS_BUFFER_TOO_SMALL: c_int = -2;
    pub(crate) const OPUS_APPLICATION_VOIP: c_int = 2048;
    pub(crate) const OPUS_APPLICATION_AUDIO: c_int = 2049;
    pub(crate) const OPUS_APPLICATION_RESTRICTED_LOWDELAY: c_int = 2051;
    pub(crate) const OPUS_SET_BITRATE_REQUEST: c_int = 4002;
    pub(crate) const OPUS_SET_VBR_REQUEST: c_int = 4006;
    pub(crate) const OPUS_SET_COMPLEXITY_REQUEST: c_int = 4010;
}

/// A libopus error code (`OPUS_BAD_ARG`, `OPUS_INVALID_PACKET`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Error(i32);

impl Error {
    /// The raw (negative) libopus code.
    #[must_use]
    pub const fn code(self) -> i32 {
        self.0
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // SAFETY: opus_strerror returns a static NUL-terminated string for any code (unknown
        // ones get "unknown error"), never null.
        let msg = unsafe { CStr::from_ptr(ffi::opus_strerror(self.0)) };
        write!(f, "{} ({})", msg.to_string_lossy(), self.0)
    }
}

impl std::error::Error for Error {}

/// The libopus release compiled in, e.g. `libopus 1.6.1`.
#[must_use]
pub fn version() -> &'static str {
    // SAFETY: returns a pointer to a static NUL-terminated string.
    unsafe { CStr::from_ptr(ffi::opus_get_version_string()) }
        .to_str()
        .unwrap_or("libopus")
}

/// The encoder's tuning target (`OPUS_APPLICATION_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Application {
    /// Speech.
    Voip,
    /// General audio.
    Audio,
    /// Lowest delay: CELT only.
    RestrictedLowDelay,
}

/// 16-byte aligned storage for a codec state (malloc's alignment on 64-bit targets, which
/// `opus_*_create` would have given it).
#[derive(Clone, Copy)]
#[repr(C, align(16))]
struct Chunk([u8; 16]);

fn state_memory(bytes: c_int) -> Result<Box<[Chunk]>, Error> {
    let bytes = usize::try_from(bytes).map_err(|_| Error(ffi::OPUS_BAD_ARG))?;
    if bytes == 0 {
        return Err(Error(ffi::OPUS_BAD_ARG));
    }
    Ok(vec![Chunk([0; 16]); bytes.div_ceil(16)].into_boxed_slice())
}

fn check_channels(channels: u8) -> Result<c_int, Error> {
    match channels {
        1 | 2 => Ok(c_int::from(channels)),
        _ => Err(Error(ffi::OPUS_BAD_ARG)),
    }
}

fn check(code: c_int) -> Result<usize, Error> {
    usize::try_from(code).map_err(|_| Error(code))
}

/// An Opus encoder (`OpusEncoder`).
pub struct Encoder {
    state: Box<[Chunk]>,
    channels: usize,
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder")
            .field("channels", &self.channels)
            .field("state_bytes", &self.state_bytes())
            .finish()
    }
}

impl Encoder {
    /// An encoder for `sample_rate` (8000, 12000, 16000, 24000 or 48000) and 1 or 2 channels.
    ///
    /// # Errors
    /// `OPUS_BAD_ARG` for another rate or channel count.
    pub fn new(sample_rate: u32, channels: u8, application: Application) -> Result<Self, Error> {
        let ch = check_channels(channels)?;
        let fs = i32::try_from(sample_rate).map_err(|_| Error(ffi::OPUS_BAD_ARG))?;
        let app = match application {
            Application::Voip => ffi::OPUS_APPLICATION_VOIP,
            Application::Audio => ffi::OPUS_APPLICATION_AUDIO,
            Application::RestrictedLowDelay => ffi::OPUS_APPLICATION_RESTRICTED_LOWDELAY,
        };
        // SAFETY: no preconditions (channels is checked again by libopus).
        let size = unsafe { ffi::opus_encoder_get_size(ch) };
        let mut this = Self {
            state: state_memory(size)?,
            channels: usize::from(channels),
        };
        // SAFETY: the state points to `size` writable, suitably aligned bytes, which is what
        // opus_encoder_init requires; it initialises all of them.
        check(unsafe { ffi::opus_encoder_init(this.ptr(), fs, ch, app) })?;
        Ok(this)
    }

    fn ptr(&mut self) -> *mut ffi::OpusEncoder {
        self.state.as_mut_ptr().cast()
    }

    fn ctl(&mut self, request: c_int, value: i32) -> Result<(), Error> {
        // SAFETY: the state was initialised by opus_encoder_init; the SET requests used here
        // take one `opus_int32` argument, passed as such.
        let code = unsafe { ffi::opus_encoder_ctl(self.ptr(), request, value) };
        if code == ffi::OPUS_OK {
            Ok(())
        } else {
            Err(Error(code))
        }
    }

    /// Target bitrate in bits per second (`OPUS_SET_BITRATE`).
    ///
    /// # Errors
    /// `OPUS_BAD_ARG` for a bitrate libopus rejects.
    pub fn set_bitrate(&mut self, bitrate: i32) -> Result<(), Error> {
        self.ctl(ffi::OPUS_SET_BITRATE_REQUEST, bitrate)
    }

    /// Encoder effort 0..=10 (`OPUS_SET_COMPLEXITY`).
    ///
    /// # Errors
    /// `OPUS_BAD_ARG` outside 0..=10.
    pub fn set_complexity(&mut self, complexity: i32) -> Result<(), Error> {
        self.ctl(ffi::OPUS_SET_COMPLEXITY_REQUEST, complexity)
    }

    /// Variable (true, the default) or constant bitrate (`OPUS_SET_VBR`).
    ///
    /// # Errors
    /// Never in practice (libopus accepts 0 and 1).
    pub fn set_vbr(&mut self, vbr: bool) -> Result<(), Error> {
        self.ctl(ffi::OPUS_SET_VBR_REQUEST, i32::from(vbr))
    }

    /// Encodes one frame of interleaved PCM (2.5 to 120 ms of it) into `out`; returns the packet
    /// length.
    ///
    /// # Errors
    /// `OPUS_BAD_ARG` for a frame length Opus does not have (or PCM not a whole number of
    /// samples per channel), `OPUS_BUFFER_TOO_SMALL` when `out` cannot hold the packet.
    pub fn encode(&mut self, pcm: &[i16], out: &mut [u8]) -> Result<usize, Error> {
        if pcm.is_empty() || !pcm.len().is_multiple_of(self.channels) {
            return Err(Error(ffi::OPUS_BAD_ARG));
        }
        let frame =
            c_int::try_from(pcm.len() / self.channels).map_err(|_| Error(ffi::OPUS_BAD_ARG))?;
        if out.is_empty() {
            return Err(Error(ffi::OPUS_BUFFER_TOO_SMALL));
        }
        let max = i32::try_from(out.len()).unwrap_or(i32::MAX);
        // SAFETY: the state is initialised; `pcm` holds frame * channels samples; `out` is
        // writable for `max` bytes; libopus writes nothing past either.
        let n = unsafe { ffi::opus_encode(self.ptr(), pcm.as_ptr(), frame, out.as_mut_ptr(), max) };
        check(n)
    }

    /// Bytes of libopus state behind this encoder.
    #[must_use]
    pub fn state_bytes(&self) -> usize {
        size_of_val::<[Chunk]>(&self.state)
    }
}

/// An Opus decoder (`OpusDecoder`), with packet-loss concealment.
pub struct Decoder {
    state: Box<[Chunk]>,
    channels: usize,
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder")
            .field("channels", &self.channels)
            .field("state_bytes", &self.state_bytes())
            .finish()
    }
}

impl Decoder {
    /// A decoder producing `sample_rate` audio (8000, 12000, 16000, 24000 or 48000) in 1 or 2
    /// channels, whatever the packets were encoded with.
    ///
    /// # Errors
    /// `OPUS_BAD_ARG` for another rate or channel count.
    pub fn new(sample_rate: u32, channels: u8) -> Result<Self, Error> {
        let ch = check_channels(channels)?;
        let fs = i32::try_from(sample_rate).map_err(|_| Error(ffi::OPUS_BAD_ARG))?;
        // SAFETY: no preconditions.
        let size = unsafe { ffi::opus_decoder_get_size(ch) };
        let mut this = Self {
            state: state_memory(size)?,
            channels: usize::from(channels),
        };
        // SAFETY: as for the encoder: `size` writable, aligned bytes, initialised by the call.
        check(unsafe { ffi::opus_decoder_init(this.ptr(), fs, ch) })?;
        Ok(this)
    }

    fn ptr(&mut self) -> *mut ffi::OpusDecoder {
        self.state.as_mut_ptr().cast()
    }

    /// Frame size (per channel) that fits `len` interleaved samples, and the packet pointer and
    /// length to pass (null and 0 for an empty packet: a lost one, to conceal).
    fn args(&self, packet: &[u8], len: usize) -> Result<(*const c_uchar, i32, c_int), Error> {
        let frame = c_int::try_from(len / self.channels).map_err(|_| Error(ffi::OPUS_BAD_ARG))?;
        if frame == 0 {
            return Err(Error(ffi::OPUS_BUFFER_TOO_SMALL));
        }
        if packet.is_empty() {
            return Ok((std::ptr::null(), 0, frame));
        }
        let n = i32::try_from(packet.len()).map_err(|_| Error(ffi::OPUS_BAD_ARG))?;
        Ok((packet.as_ptr(), n, frame))
    }

    /// Decodes one packet into interleaved `i16` PCM; an empty `packet` conceals a lost one
    /// (`pcm.len()` then sets how much, a multiple of 2.5 ms). Returns samples per channel.
    ///
    /// # Errors
    /// `OPUS_INVALID_PACKET` for a corrupt packet, `OPUS_BUFFER_TOO_SMALL` when `pcm` cannot
    /// hold its audio, `OPUS_BAD_ARG` for a concealment length that is not a whole frame.
    pub fn decode(&mut self, packet: &[u8], pcm: &mut [i16], fec: bool) -> Result<usize, Error> {
        let (data, len, frame) = self.args(packet, pcm.len())?;
        // SAFETY: the state is initialised; `data` is null with len 0 or points to `len`
        // readable bytes; `pcm` is writable for frame * channels samples, the most libopus
        // writes.
        let n = unsafe {
            ffi::opus_decode(
                self.ptr(),
                data,
                len,
                pcm.as_mut_ptr(),
                frame,
                c_int::from(fec),
            )
        };
        check(n)
    }

    /// As [`decode`](Self::decode), to `f32` PCM (not clipped: libopus's float path can exceed
    /// ±1.0).
    ///
    /// # Errors
    /// As [`decode`](Self::decode).
    pub fn decode_float(
        &mut self,
        packet: &[u8],
        pcm: &mut [f32],
        fec: bool,
    ) -> Result<usize, Error> {
        let (data, len, frame) = self.args(packet, pcm.len())?;
        // SAFETY: as in `decode`.
        let n = unsafe {
            ffi::opus_decode_float(
                self.ptr(),
                data,
                len,
                pcm.as_mut_ptr(),
                frame,
                c_int::from(fec),
            )
        };
        check(n)
    }

    /// Bytes of libopus state behind this decoder.
    #[must_use]
    pub fn state_bytes(&self) -> usize {
        size_of_val::<[Chunk]>(&self.state)
    }
}

/// Parses a packet's framing with libopus's `opus_packet_parse` (RFC 6716 section 3.2); returns
/// the number of frames in it.
///
/// # Errors
/// `OPUS_INVALID_PACKET` for a packet that breaks the framing rules.
pub fn packet_parse(packet: &[u8]) -> Result<usize, Error> {
    let len = i32::try_from(packet.len()).map_err(|_| Error(ffi::OPUS_BAD_ARG))?;
    let mut toc: c_uchar = 0;
    let mut frames = [std::ptr::null::<c_uchar>(); 48];
    let mut sizes = [0i16; 48];
    let mut offset: c_int = 0;
    // SAFETY: `packet` is readable for `len` bytes; the output arrays have the 48 entries the
    // function may fill.
    let n = unsafe {
        ffi::opus_packet_parse(
            packet.as_ptr(),
            len,
            &raw mut toc,
            frames.as_mut_ptr(),
            sizes.as_mut_ptr(),
            &raw mut offset,
        )
    };
    check(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_is_the_pinned_release() {
        assert_eq!(version(), "libopus 1.6.1");
    }

    /// On x86 the CPU detection is cached (build.rs): the cached answer is CPUID's, and codecs
    /// built after the first still get it.
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    #[test]
    fn cpu_detection_is_cached_and_unchanged() {
        unsafe extern "C" {
            fn opus_select_arch() -> c_int;
            fn voxgate_opus_select_arch_uncached() -> c_int;
        }
        // SAFETY: neither takes arguments nor touches memory the caller owns.
        let (cached, uncached) =
            unsafe { (opus_select_arch(), voxgate_opus_select_arch_uncached()) };
        assert_eq!(cached, uncached);
        assert!(cached >= 0);
        for _ in 0..3 {
            // SAFETY: as above.
            assert_eq!(unsafe { opus_select_arch() }, uncached);
            assert!(Decoder::new(16_000, 1).is_ok());
        }
    }

    #[test]
    #[allow(
        clippy::cast_possible_truncation,
        reason = "a tone of amplitude 8000 fits i16"
    )]
    fn encodes_and_decodes_a_tone() {
        let rate = 16_000;
        let mut enc = Encoder::new(rate, 1, Application::Voip).unwrap();
        enc.set_bitrate(24_000).unwrap();
        enc.set_complexity(5).unwrap();
        enc.set_vbr(true).unwrap();
        let mut dec = Decoder::new(rate, 1).unwrap();
        let mut packet = [0u8; 1276];
        let mut pcm = vec![0i16; 960];
        let mut energy = 0.0;
        for k in 0..10 {
            let frame: Vec<i16> = (0..960)
                .map(|i| {
                    let t = (k * 960 + i) as f32 / rate as f32;
                    (8000.0 * (std::f32::consts::TAU * 440.0 * t).sin()) as i16
                })
                .collect();
            let n = enc.encode(&frame, &mut packet).unwrap();
            assert_eq!(packet_parse(&packet[..n]), Ok(1));
            assert_eq!(dec.decode(&packet[..n], &mut pcm, false), Ok(960));
            energy = pcm.iter().map(|&s| f64::from(s).powi(2)).sum::<f64>() / 960.0;
        }
        assert!(energy > 8000.0f64.powi(2) / 2.0 * 0.5, "energy {energy}");
        // Concealment: an empty packet, the length given by the buffer.
        assert_eq!(dec.decode(&[], &mut pcm[..320], false), Ok(320));
        let mut f = vec![0f32; 960];
        assert_eq!(dec.decode_float(&[], &mut f, false), Ok(960));
    }

    #[test]
    fn bad_arguments_are_errors() {
        assert!(Encoder::new(22_050, 1, Application::Voip).is_err());
        assert!(Encoder::new(16_000, 3, Application::Voip).is_err());
        assert!(Decoder::new(44_100, 1).is_err());
        let mut enc = Encoder::new(16_000, 1, Application::Voip).unwrap();
        assert!(enc.set_complexity(11).is_err());
        let mut out = [0u8; 100];
        assert_eq!(
            enc.encode(&[0; 100], &mut out),
            Err(Error(ffi::OPUS_BAD_ARG))
        );
        assert!(enc.encode(&[0; 320], &mut []).is_err());
        let mut dec = Decoder::new(16_000, 1).unwrap();
        assert!(dec.decode(&[0x78, 1, 2], &mut [], false).is_err());
        assert!(packet_parse(&[]).is_err());
        assert!(packet_parse(&[0x7b, 0x00]).is_err());
        assert!(!Error(-4).to_string().is_empty());
    }

    #[test]
    fn state_is_the_size_libopus_asks_for() {
        let enc = Encoder::new(48_000, 1, Application::Voip).unwrap();
        let dec = Decoder::new(48_000, 1).unwrap();
        // SAFETY: no preconditions.
        let (e, d) = unsafe { (ffi::opus_encoder_get_size(1), ffi::opus_decoder_get_size(1)) };
        assert_eq!(
            enc.state_bytes(),
            usize::try_from(e).unwrap().div_ceil(16) * 16
        );
        assert_eq!(
            dec.state_bytes(),
            usize::try_from(d).unwrap().div_ceil(16) * 16
        );
    }
}
