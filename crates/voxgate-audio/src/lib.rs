//! Audio for voice agents without I/O: sample formats, streaming resampling, Opus, VAD, WAV and
//! playback pacing.
//!
//! Everything a voice server or device client needs between bytes on the wire and 16 kHz mono
//! speech for a VAD or recogniser, as plain values and state machines: no async runtime, no
//! threads, no clock (time comes in as `now` values or as sample counts).
//!
//! | module | what |
//! |---|---|
//! | [`format`](mod@format) | the realtime protocol's raw PCM formats (u8, s16, s32, f32, f64; any channels) to and from mono `f32`/`i16`, carrying partial frames |
//! | [`resample`] | streaming resampler on `rubato` (FFT, fixed ratio) for any pair of rates up to [`resample::MAX_SAMPLE_RATE`], with its delay; copy-only when rates match; [`resample::RateConverter`] follows a source rate that changes mid-stream |
//! | [`opus`] | mono Opus encoder/decoder, backend libopus (C built with `cc`, the default `libopus` feature) or `opus-rs` (pure Rust, always there) |
//! | [`vad`] | voice activity detection on `earshot` with `VadConfiguration` semantics and the four `VadState`s; every window and the input rate have a documented maximum ([`vad::MAX_BACKBUFFER_DURATION`] and friends), so a detector holds at most [`vad::MAX_HISTORY_SAMPLES`] of history |
//! | [`wav`] | WAV read/write via `hound` |
//! | [`pacer`] | releases frames at playback rate with a lead (sans-IO, `now` passed in) |
//!
//! # Example: a Xiaozhi uplink frame into the VAD
//!
//! ```
//! use voxgate_audio::opus::{OpusBackend, OpusDecoder, OpusEncoder, OpusEncoderConfig};
//! use voxgate_audio::vad::{Vad, VadConfig, VadOutput, VadState};
//!
//! // A device sends 60 ms Opus packets at 16 kHz; here we make one from a tone.
//! let mut enc = OpusEncoder::new(OpusEncoderConfig::voice(16_000))?;
//! let tone: Vec<i16> = (0..enc.frame_samples())
//!     .map(|i| ((i as f32 * 0.07).sin() * 8000.0) as i16)
//!     .collect();
//! let packet = enc.encode(&tone)?.to_vec();
//!
//! let mut dec = OpusDecoder::new(16_000, OpusBackend::Pure)?;
//! let mut vad = Vad::new(VadConfig::default(), 16_000)?;
//! let pcm = dec.decode(&packet)?; // a corrupt packet would be an Err, never a panic
//! vad.process_i16(pcm);
//! while let Some(out) = vad.poll_output() {
//!     if let VadOutput::Transition(t) = out {
//!         println!("{:?} -> {:?} at sample {}", t.from, t.to, t.position);
//!     }
//! }
//! // A lost packet: let the decoder conceal it.
//! let filler = dec.conceal(dec.last_frame_samples())?;
//! assert_eq!(filler.len(), 960);
//! // 60 ms is shorter than the default start_duration (96 ms): SPEECH cannot be declared yet.
//! assert_ne!(vad.state(), VadState::Speech);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Drive loops
//!
//! - [`vad::Vad`]: `process(samples)` (any chunk size), then drain `poll_output()` until `None`.
//!   Positions in its outputs are input-rate sample counts from the start of the stream.
//! - [`pacer::Pacer`]: `handle_input(now, frame)` to queue, `handle_timeout(now)` when the
//!   deadline from `poll_timeout()` passes, and `poll_output()` until `None` after either.
//! - [`resample::RateConverter`]: `process(samples, source_rate, &mut out)` (or `process_i16`,
//!   `process_i16_to_i16`) per chunk, `flush(&mut out)` at the end of a stream, `reset()` on a
//!   barge-in. A changed source rate flushes the old resampler into `out` and builds a new one.
//! - [`resample::Resampler`], [`PcmDecoder`](format::PcmDecoder): push chunks, get whatever output is ready
//!   appended to a caller-owned `Vec` (reuse it and nothing is allocated in steady state).
//!
//! # Opus backends
//!
//! `opus-rs` is a pure-Rust port of libopus 1.6: no C toolchain or system library. The `libopus`
//! feature, on by default, adds the reference C library (1.6.1) through `voxgate-opus-sys`, which
//! compiles it with the `cc` crate (a C compiler, no cmake); it costs less CPU and a tenth of the
//! memory per codec, so servers prefer it. `default-features = false` leaves the pure-Rust
//! backend alone. Both sit behind the same [`opus::OpusEncoder`] and
//! [`opus::OpusDecoder`]; choose per instance with [`opus::OpusBackend`]. Both support 8/12/16/24/48
//! kHz, 20/40/60 ms frames, bitrate, complexity, CBR/VBR and packet-loss concealment; the
//! cross-decode tests show their decoders agree to over 100 dB SNR on each other's packets.
//! Not exposed (by either backend, here): in-band FEC, DTX and stereo encoding.
//!
//! # Errors
//!
//! Each module has its own error type, named by who is to blame: [`opus::OpusError::Corrupt`]
//! and [`wav::WavError::Malformed`] are the peer's bytes; `InvalidConfig`, `FrameLength`,
//! [`vad::VadError`] and [`FormatError`](format::FormatError) are caller bugs. Raw PCM conversion cannot fail:
//! every byte string is some audio.

pub mod format;
pub mod opus;
pub mod pacer;
pub mod resample;
pub mod vad;
pub mod wav;
