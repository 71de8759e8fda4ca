//! Voice activity detection on `earshot` with the realtime protocol's `VadConfiguration` rules.
//!
//! earshot scores 16 ms frames (256 samples at 16 kHz) from 0 to 1. [`Vad`] resamples any input
//! rate to 16 kHz, scores each frame, measures its volume, and runs a four-state hysteresis:
//!
//! ```text
//!            speech frame                  start_duration of speech
//! SILENCE ────────────────▶ SPEECH_STARTING ─────────────────────────▶ SPEECH
//!    ▲        (a silent frame goes back)                                 │ silent frame
//!    │                                                                   ▼
//!    └──────────────── stop_duration of silence ─────────────────── SPEECH_ENDING
//!                            (a speech frame goes back to SPEECH)
//! ```
//!
//! A frame counts as speech when its confidence reaches `confidence_threshold` and its volume
//! reaches `min_volume`. The volume is measured first, and a frame below `min_volume` is not
//! scored by the model at all (its confidence reads 0.0): silence and background noise cost
//! almost nothing, and the states are the same as with every frame scored. Every transition is reported with sample positions in the caller's
//! input rate, and the detector keeps the last `backbuffer_duration` (plus the start window) of
//! input (as 16-bit PCM) so the audio from just before speech was declared can be handed to a
//! recogniser.
//!
//! Every size a caller chooses is bounded ([`MAX_START_DURATION`], [`MAX_STOP_DURATION`],
//! [`MAX_BACKBUFFER_DURATION`], [`MAX_INPUT_RATE`]), so a detector never holds more than
//! [`MAX_HISTORY_SAMPLES`] of history (under 2 MB) whatever a peer configured: these settings
//! usually come from a client (the realtime protocol's `VadConfiguration`), and the history is
//! the largest buffer of a session.
//!
//! The drive loop: feed samples with [`Vad::process`] (any chunk size), then drain
//! [`Vad::poll_output`] until it returns `None`. Time is the sample count, so the detector needs
//! no clock.

use std::collections::VecDeque;
use std::time::Duration;

use thiserror::Error;

use crate::resample::{ResampleError, Resampler};

/// Samples per earshot frame at 16 kHz.
pub const FRAME_SAMPLES: usize = 256;
/// The rate earshot's model runs at.
pub const MODEL_RATE: u32 = 16_000;
const FRAME_MICROS: u64 = 16_000;
/// `volume` = dBFS of the frame's RMS mapped linearly from this floor (0.0) to 0 dBFS (1.0).
pub const VOLUME_FLOOR_DBFS: f32 = -60.0;

/// Longest `start_duration` accepted: it sizes the history, and a start window of seconds would
/// miss every short answer anyway.
pub const MAX_START_DURATION: Duration = Duration::from_secs(2);
/// Longest `stop_duration` accepted. It sizes no buffer, so it is generous (pauses while
/// dictating), but an end of speech minutes after the last word is a mistake.
pub const MAX_STOP_DURATION: Duration = Duration::from_secs(10);
/// Longest `backbuffer_duration` accepted: it sizes the history, the largest buffer a detector
/// holds. Published clients ask for 0.3-1 s.
pub const MAX_BACKBUFFER_DURATION: Duration = Duration::from_secs(3);
/// Highest input rate accepted, in Hz (the realtime protocol's highest rate): the history is
/// kept at the input rate.
pub const MAX_INPUT_RATE: u32 = 192_000;
/// Most samples of history one detector keeps (as 16-bit PCM, so twice this in bytes): the
/// longest backbuffer and start window plus the resampler's latency at [`MAX_INPUT_RATE`], with
/// room to spare. [`Vad::new`] refuses anything that would need more.
pub const MAX_HISTORY_SAMPLES: usize = 1_000_000;

/// Detector settings, with the realtime protocol's `VadConfiguration` meaning.
///
/// [`validate`](Self::validate) (also run by [`Vad::new`]) checks the ranges and maxima.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VadConfig {
    /// Model score (0..=1) a frame needs to count as speech.
    pub confidence_threshold: f32,
    /// Volume (0..=1, see [`VOLUME_FLOOR_DBFS`]) a frame needs to count as speech, so quiet
    /// background talk or breath noise does not open a turn.
    pub min_volume: f32,
    /// Speech needed, without a silent frame, to go from `SPEECH_STARTING` to `SPEECH`.
    pub start_duration: Duration,
    /// Silence needed, without a speech frame, to go from `SPEECH_ENDING` to `SILENCE`.
    pub stop_duration: Duration,
    /// Audio kept from before the speech onset and returned with it.
    pub backbuffer_duration: Duration,
}

impl Default for VadConfig {
    /// Tuned on the crate's fixtures: faster than Pipecat's 0.2 s start and LiveKit's 0.55 s
    /// silence, yet it ignores silence and low-level noise and holds speech at 10 dB SNR.
    /// (Endpointing, the wait before a turn ends, belongs to the turn machine, not here.)
    fn default() -> Self {
        Self {
            confidence_threshold: 0.5,
            min_volume: 0.3,
            start_duration: Duration::from_millis(96),
            stop_duration: Duration::from_millis(200),
            backbuffer_duration: Duration::from_millis(500),
        }
    }
}

/// A configuration or rate the detector cannot use (a caller bug).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum VadError {
    /// A threshold outside 0..=1 or not a number.
    #[error("{0} must be within 0..=1")]
    OutOfRange(&'static str),
    /// A duration longer than its maximum ([`MAX_START_DURATION`], [`MAX_STOP_DURATION`],
    /// [`MAX_BACKBUFFER_DURATION`]): the buffers are sized from them.
    #[error("{} must be at most {:?}", .0, max_duration(.0))]
    TooLong(&'static str),
    /// An input rate above [`MAX_INPUT_RATE`].
    #[error("input rate {0} Hz is above the detector's maximum of {MAX_INPUT_RATE} Hz")]
    InputRate(u32),
    /// The input rate cannot be resampled to 16 kHz.
    #[error(transparent)]
    Rate(#[from] ResampleError),
}

/// The maximum of the duration called `field` (for error messages).
fn max_duration(field: &str) -> Duration {
    match field {
        "start_duration" => MAX_START_DURATION,
        "stop_duration" => MAX_STOP_DURATION,
        _ => MAX_BACKBUFFER_DURATION,
    }
}

impl VadConfig {
    /// Checks the thresholds (0..=1) and the durations (each within its maximum).
    ///
    /// # Errors
    /// [`VadError::OutOfRange`] or [`VadError::TooLong`] naming the field.
    pub fn validate(&self) -> Result<(), VadError> {
        check_unit(self.confidence_threshold, "confidence_threshold")?;
        check_unit(self.min_volume, "min_volume")?;
        for (d, name) in [
            (self.start_duration, "start_duration"),
            (self.stop_duration, "stop_duration"),
            (self.backbuffer_duration, "backbuffer_duration"),
        ] {
            if d > max_duration(name) {
                return Err(VadError::TooLong(name));
            }
        }
        Ok(())
    }
}

/// The detector's state, as the realtime protocol's `VadState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum VadState {
    /// No speech.
    #[default]
    Silence,
    /// Speech frames seen, not yet `start_duration` of them.
    SpeechStarting,
    /// Speech declared.
    Speech,
    /// Silent frames seen during speech, not yet `stop_duration` of them.
    SpeechEnding,
}

/// Telemetry for one 16 ms model frame.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VadFrame {
    /// Frame number from the start of the stream.
    pub index: u64,
    /// Input-rate sample position of the frame's end.
    pub end: u64,
    /// Model score, 0..=1. 0.0 when the frame's volume is below `min_volume`: such a frame can
    /// never count as speech, so the model is not run on it (see [`Vad::set_volume_gate`]).
    pub confidence: f32,
    /// Volume, 0..=1.
    pub volume: f32,
    /// State after this frame.
    pub state: VadState,
}

/// A state change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VadTransition {
    /// State before.
    pub from: VadState,
    /// State after.
    pub to: VadState,
    /// Input-rate sample position where the change was decided (the end of the deciding frame).
    pub position: u64,
    /// Input-rate sample position where the evidence for the new state began: the first speech
    /// frame for `SPEECH_STARTING`/`SPEECH`, the first silent frame for `SPEECH_ENDING`/`SILENCE`
    /// (so for `SILENCE` it is where the speech ended).
    pub onset: u64,
    /// For `SPEECH_STARTING`/`SPEECH`: `onset` minus the backbuffer, the first sample worth
    /// passing to a recogniser (copy it with [`Vad::copy_audio`]); otherwise equal to `onset`.
    pub audio_start: u64,
}

/// What the detector reports.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum VadOutput {
    /// A state change.
    Transition(VadTransition),
    /// Per-frame telemetry (only with [`Vad::set_frame_telemetry`] on).
    Frame(VadFrame),
}

/// `f32` to 16-bit, clamped, NaN to 0, rounded to nearest (ties to even: the 1.5 * 2^23 trick,
/// exact for the clamped range). Unlike `f32::round`, which is a libm call on baseline x86-64,
/// this vectorises; it runs on every input sample.
#[allow(clippy::cast_possible_truncation)]
fn to_i16(sample: f32) -> i16 {
    const MAGIC: f32 = 12_582_912.0;
    let scaled = sample.clamp(-1.0, 1.0) * 32768.0;
    // `as` saturates +32768.0 to i16::MAX and maps NaN to 0.
    ((scaled + MAGIC) - MAGIC) as i16
}

/// Fixed-size history of input samples, addressed by absolute position. Stored as 16-bit PCM:
/// every source a voice server sees (Opus, 16-bit PCM, WAV) is 16-bit already, and it halves
/// the largest buffer a detector holds.
#[derive(Debug)]
struct History {
    buf: Vec<i16>,
    written: u64,
}

impl History {
    /// Ring index of absolute position `pos`.
    fn slot(&self, pos: u64) -> usize {
        usize::try_from(pos % self.buf.len() as u64).unwrap_or(0)
    }

    fn push_with<T: Copy>(&mut self, samples: &[T], convert: impl Fn(T) -> i16) {
        let cap = self.buf.len();
        if cap == 0 {
            return;
        }
        // Only the last `cap` samples can be kept; the ones before still advance the position.
        let skip = samples.len().saturating_sub(cap);
        self.written += skip as u64;
        let samples = &samples[skip..];
        let at = self.slot(self.written);
        let first = (cap - at).min(samples.len());
        for (d, &s) in self.buf[at..at + first].iter_mut().zip(samples) {
            *d = convert(s);
        }
        for (d, &s) in self.buf.iter_mut().zip(&samples[first..]) {
            *d = convert(s);
        }
        self.written += samples.len() as u64;
    }

    fn push(&mut self, samples: &[f32]) {
        self.push_with(samples, to_i16);
    }

    fn push_i16(&mut self, samples: &[i16]) {
        self.push_with(samples, |s| s);
    }

    /// Copies the model frame starting at absolute position `pos`, if all of it is still held.
    fn frame(&self, pos: u64, out: &mut [f32; FRAME_SAMPLES]) -> bool {
        if pos < self.oldest() || pos + FRAME_SAMPLES as u64 > self.written {
            return false;
        }
        let at = self.slot(pos);
        let first = (self.buf.len() - at).min(FRAME_SAMPLES);
        let (head, tail) = out.split_at_mut(first);
        for (d, &s) in head.iter_mut().zip(&self.buf[at..at + first]) {
            *d = crate::format::i16_to_f32(s);
        }
        for (d, &s) in tail.iter_mut().zip(&self.buf) {
            *d = crate::format::i16_to_f32(s);
        }
        true
    }

    fn oldest(&self) -> u64 {
        self.written.saturating_sub(self.buf.len() as u64)
    }

    fn copy_from(&self, from: u64, out: &mut Vec<f32>) -> u64 {
        let start = from.clamp(self.oldest(), self.written);
        let cap = self.buf.len() as u64;
        let mut pos = start;
        while pos < self.written {
            let at = self.slot(pos);
            let run = usize::try_from((self.written - pos).min(cap - pos % cap)).unwrap_or(0);
            out.extend(
                self.buf[at..at + run]
                    .iter()
                    .map(|&s| crate::format::i16_to_f32(s)),
            );
            pos += run as u64;
        }
        start
    }
}

/// Quiet frames replayed through the model before the next loud one (see [`Model`]).
const REPLAY_FRAMES: usize = 16;

/// earshot plus the volume gate.
///
/// A frame below `min_volume` can never count as speech, so the model is not run on it. earshot
/// carries state from frame to frame: a 768-sample (three-frame) analysis window, the log-mel
/// features of the last three frames, and a recurrent state with a long memory. So that the
/// first loud frame after a quiet run is scored almost as if the model had seen the whole run,
/// the last [`REPLAY_FRAMES`] quiet frames (256 ms) are kept and fed to the model (scores
/// discarded) before it. That refills the window and the feature context exactly and lets the
/// recurrent state settle on the quiet audio it would have ended the run with. A quiet run of
/// up to 256 ms (pauses between words) is scored as without the gate, only later (exactly for
/// 16-bit input: the frames are kept as 16-bit samples); after a longer one the next scores
/// differ by a few hundredths (0.04-0.10 on the fixtures, where three replayed frames left
/// differences of 0.4; sixteen keep every transition of the fixtures and move none by more than
/// one frame). Each quiet frame beyond the replay saves one model call (about 9 µs).
struct Model {
    detector: Box<earshot::Detector>,
    /// The frame being filled, at 16 kHz, sanitised to `-1.0..=1.0`.
    frame: [f32; FRAME_SAMPLES],
    fill: usize,
    /// Ring of the most recent quiet frames not yet seen by the model, as 16-bit PCM (8 KiB):
    /// quiet frame `k` of the run is at `k % REPLAY_FRAMES`. Empty at 16 kHz, where the
    /// history already holds them (unless one call fed more than the history holds, when the
    /// frames already overwritten are left out of the replay).
    quiet: Vec<[i16; FRAME_SAMPLES]>,
    /// Quiet frames in the current run not yet seen by the model.
    skipped: u64,
    gate: bool,
}

impl Model {
    /// Scores the full frame: `(confidence, volume)`, confidence 0.0 when gated. `history` and
    /// `frame_start` (the frame's model-rate position) locate the quiet frames to replay when the
    /// input is at 16 kHz and the ring is not used.
    fn score(&mut self, min_volume: f32, history: &History, frame_start: u64) -> (f32, f32) {
        let energy: f32 = self.frame.iter().map(|s| s * s).sum::<f32>() / FRAME_SAMPLES as f32;
        let dbfs = 10.0 * energy.max(1e-12).log10();
        let volume = ((dbfs - VOLUME_FLOOR_DBFS) / -VOLUME_FLOOR_DBFS).clamp(0.0, 1.0);
        if self.gate && volume < min_volume {
            // Kept only when resampling (the ring is empty at 16 kHz, where `get_mut` is None).
            let slot = usize::try_from(self.skipped % REPLAY_FRAMES as u64).unwrap_or(0);
            if let Some(quiet) = self.quiet.get_mut(slot) {
                // The frame is sanitised to -1..=1, so this stays in range (`as` saturates
                // +1.0). Truncation instead of rounding: exact for 16-bit sources (multiples of
                // 1/32768), within one step otherwise, and it vectorises where `round` is a libm
                // call.
                #[allow(clippy::cast_possible_truncation)]
                for (d, &s) in quiet.iter_mut().zip(&self.frame) {
                    *d = (s * 32768.0) as i16;
                }
            }
            self.skipped += 1;
            return (0.0, volume);
        }
        if self.skipped > 0 {
            let n = self.skipped.min(REPLAY_FRAMES as u64);
            let mut replay = [0.0f32; FRAME_SAMPLES];
            for k in self.skipped - n..self.skipped {
                let found = if self.quiet.is_empty() {
                    // At 16 kHz the history holds the quiet frames themselves.
                    let back = (self.skipped - k) * FRAME_SAMPLES as u64;
                    frame_start
                        .checked_sub(back)
                        .is_some_and(|pos| history.frame(pos, &mut replay))
                } else {
                    let slot = usize::try_from(k % REPLAY_FRAMES as u64).unwrap_or(0);
                    for (d, &s) in replay.iter_mut().zip(&self.quiet[slot]) {
                        *d = crate::format::i16_to_f32(s);
                    }
                    true
                };
                if found {
                    self.detector.predict_f32(&replay);
                }
            }
            self.skipped = 0;
        }
        (
            self.detector.predict_f32(&self.frame).clamp(0.0, 1.0),
            volume,
        )
    }

    fn reset(&mut self) {
        self.detector.reset();
        self.fill = 0;
        self.skipped = 0;
    }
}

/// The streaming voice activity detector.
pub struct Vad {
    config: VadConfig,
    input_rate: u32,
    resampler: Resampler,
    model: Model,
    resampled: Vec<f32>,
    /// Resampled samples already consumed into frames (model-rate position).
    model_pos: u64,
    /// Input samples consumed.
    input_pos: u64,
    frames: u64,
    state: VadState,
    /// Model-rate position where the current speech or silence run began.
    run_start: u64,
    /// Model-rate position of the first frame of the current utterance.
    speech_start: u64,
    run_frames: u64,
    start_frames: u64,
    stop_frames: u64,
    backbuffer: u64,
    history: History,
    telemetry: bool,
    last: Option<VadFrame>,
    outputs: VecDeque<VadOutput>,
}

impl std::fmt::Debug for Vad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vad")
            .field("config", &self.config)
            .field("input_rate", &self.input_rate)
            .field("state", &self.state)
            .field("position", &self.input_pos)
            .finish_non_exhaustive()
    }
}

fn frames_for(d: Duration) -> u64 {
    u64::try_from(d.as_micros())
        .unwrap_or(u64::MAX)
        .div_ceil(FRAME_MICROS)
}

fn check_unit(v: f32, name: &'static str) -> Result<(), VadError> {
    if (0.0..=1.0).contains(&v) {
        Ok(())
    } else {
        Err(VadError::OutOfRange(name))
    }
}

/// Output reports queued before the caller drains them: a few per frame is the most a 60 ms
/// packet produces, so this never grows in steady state.
const OUTPUT_QUEUE: usize = 32;

impl Vad {
    /// A detector for mono audio at `input_rate` Hz.
    ///
    /// # Errors
    /// [`VadError`] for a configuration [`VadConfig::validate`] refuses, an input rate of zero
    /// or above [`MAX_INPUT_RATE`].
    pub fn new(config: VadConfig, input_rate: u32) -> Result<Self, VadError> {
        config.validate()?;
        if input_rate > MAX_INPUT_RATE {
            return Err(VadError::InputRate(input_rate));
        }
        let resampler = Resampler::new(input_rate, MODEL_RATE)?;
        let to_input = |d: Duration| -> u64 {
            u64::try_from(d.as_micros() * u128::from(input_rate) / 1_000_000).unwrap_or(u64::MAX)
        };
        let backbuffer = to_input(config.backbuffer_duration);
        // Enough history to reach back from the SPEECH decision to onset minus the backbuffer,
        // including the resampler's delay and one frame of slack.
        let start = to_input(Duration::from_micros(
            (frames_for(config.start_duration) + 2) * FRAME_MICROS,
        ));
        let delay_in = resampler.delay() as u64 * u64::from(input_rate) / u64::from(MODEL_RATE)
            + resampler.block_input_samples() as u64;
        let mut history_len = usize::try_from(backbuffer + start + delay_in).unwrap_or(usize::MAX);
        // The maxima above keep this within bounds; the check keeps it so if they ever change.
        if history_len > MAX_HISTORY_SAMPLES {
            return Err(VadError::TooLong("backbuffer_duration"));
        }
        let quiet_frames = if resampler.is_passthrough() {
            // The gate replays quiet frames from the history: keep them and a 60 ms packet.
            history_len = history_len.max((REPLAY_FRAMES + 1) * FRAME_SAMPLES + 960);
            0
        } else {
            REPLAY_FRAMES
        };
        // The passthrough never uses `resampled`; otherwise it holds one block's output.
        let resampled_cap = if resampler.is_passthrough() {
            0
        } else {
            resampler.block_output_samples()
        };
        Ok(Self {
            config,
            input_rate,
            resampler,
            model: Model {
                detector: earshot::Detector::default_boxed(),
                frame: [0.0; FRAME_SAMPLES],
                fill: 0,
                quiet: vec![[0; FRAME_SAMPLES]; quiet_frames],
                skipped: 0,
                gate: true,
            },
            resampled: Vec::with_capacity(resampled_cap),
            model_pos: 0,
            input_pos: 0,
            frames: 0,
            state: VadState::Silence,
            run_start: 0,
            speech_start: 0,
            run_frames: 0,
            start_frames: frames_for(config.start_duration),
            stop_frames: frames_for(config.stop_duration),
            backbuffer,
            history: History {
                buf: vec![0; history_len],
                written: 0,
            },
            telemetry: false,
            last: None,
            outputs: VecDeque::with_capacity(OUTPUT_QUEUE),
        })
    }

    /// The settings in force.
    #[must_use]
    pub const fn config(&self) -> &VadConfig {
        &self.config
    }

    /// The input rate in Hz.
    #[must_use]
    pub const fn input_rate(&self) -> u32 {
        self.input_rate
    }

    /// Current state.
    #[must_use]
    pub const fn state(&self) -> VadState {
        self.state
    }

    /// Input samples consumed so far.
    #[must_use]
    pub const fn position(&self) -> u64 {
        self.input_pos
    }

    /// The most recent frame's telemetry, whether or not frame outputs are on.
    #[must_use]
    pub const fn last_frame(&self) -> Option<VadFrame> {
        self.last
    }

    /// Emit a [`VadOutput::Frame`] for every 16 ms frame (off by default).
    pub fn set_frame_telemetry(&mut self, on: bool) {
        self.telemetry = on;
    }

    /// Skip the model on frames below `min_volume` (on by default). Such a frame can never count
    /// as speech, so the states and transitions are the same either way (the fixture tests check
    /// it); with the gate on, a skipped frame reports confidence 0.0. Turn it off to get the
    /// model's score on every frame for telemetry, at the model's cost on silence too.
    pub fn set_volume_gate(&mut self, on: bool) {
        self.model.gate = on;
    }

    /// Feeds mono samples in `-1.0..=1.0` (others are clamped). The kept history is stored as
    /// 16-bit PCM, so [`Vad::copy_audio`] returns them rounded to 16 bits.
    pub fn process(&mut self, samples: &[f32]) {
        self.history.push(samples);
        self.input_pos += samples.len() as u64;
        if self.resampler.is_passthrough() {
            self.feed(
                samples,
                |s| {
                    if s.is_nan() { 0.0 } else { s.clamp(-1.0, 1.0) }
                },
            );
            return;
        }
        self.resample_and_feed(samples);
    }

    /// Feeds mono `i16` samples.
    pub fn process_i16(&mut self, samples: &[i16]) {
        self.history.push_i16(samples);
        self.input_pos += samples.len() as u64;
        if self.resampler.is_passthrough() {
            self.feed(samples, crate::format::i16_to_f32);
            return;
        }
        let mut buf = [0.0f32; 256];
        for chunk in samples.chunks(buf.len()) {
            for (d, &s) in buf.iter_mut().zip(chunk) {
                *d = crate::format::i16_to_f32(s);
            }
            self.resample_and_feed(&buf[..chunk.len()]);
        }
    }

    fn resample_and_feed(&mut self, samples: &[f32]) {
        let mut resampled = std::mem::take(&mut self.resampled);
        // Feed the resampler in slices so `resampled` never outgrows its first allocation.
        for chunk in samples.chunks(self.resampler.block_input_samples().max(1)) {
            resampled.clear();
            self.resampler.process(chunk, &mut resampled);
            self.feed(&resampled, |s| {
                if s.is_nan() { 0.0 } else { s.clamp(-1.0, 1.0) }
            });
        }
        self.resampled = resampled;
    }

    /// Appends model-rate samples to the current frame, scoring each one that fills up.
    fn feed<T: Copy>(&mut self, mut samples: &[T], convert: impl Fn(T) -> f32) {
        while !samples.is_empty() {
            let fill = self.model.fill;
            let n = (FRAME_SAMPLES - fill).min(samples.len());
            for (d, &s) in self.model.frame[fill..fill + n]
                .iter_mut()
                .zip(&samples[..n])
            {
                *d = convert(s);
            }
            samples = &samples[n..];
            self.model.fill += n;
            if self.model.fill == FRAME_SAMPLES {
                self.model.fill = 0;
                self.on_frame();
            }
        }
    }

    /// The next report, oldest first.
    pub fn poll_output(&mut self) -> Option<VadOutput> {
        self.outputs.pop_front()
    }

    /// Appends the kept input audio from `from` (clamped to what is still held) up to the current
    /// position to `out`; returns the position of the first sample copied. The audio is kept as
    /// 16-bit PCM, so samples fed as `f32` come back rounded to 16 bits.
    pub fn copy_audio(&self, from: u64, out: &mut Vec<f32>) -> u64 {
        self.history.copy_from(from, out)
    }

    /// Back to `SILENCE` at position 0 with fresh model state (a new stream).
    pub fn reset(&mut self) {
        self.resampler.reset();
        self.model.reset();
        self.resampled.clear();
        self.model_pos = 0;
        self.input_pos = 0;
        self.frames = 0;
        self.state = VadState::Silence;
        self.run_start = 0;
        self.speech_start = 0;
        self.run_frames = 0;
        self.history.written = 0;
        self.last = None;
        self.outputs.clear();
    }

    /// Model-rate position to input-rate position, undoing the resampler's delay.
    fn to_input(&self, model_pos: u64) -> u64 {
        let delayed = model_pos.saturating_sub(self.resampler.delay() as u64);
        delayed * u64::from(self.input_rate) / u64::from(MODEL_RATE)
    }

    fn on_frame(&mut self) {
        let (confidence, volume) =
            self.model
                .score(self.config.min_volume, &self.history, self.model_pos);
        let frame_start = self.model_pos;
        self.model_pos += FRAME_SAMPLES as u64;
        let frame_end = self.model_pos;
        let speech =
            confidence >= self.config.confidence_threshold && volume >= self.config.min_volume;

        match (self.state, speech) {
            (VadState::Silence, true) => {
                self.run_start = frame_start;
                self.speech_start = frame_start;
                self.run_frames = 1;
                self.transition(VadState::SpeechStarting, frame_end);
                if self.run_frames >= self.start_frames {
                    self.transition(VadState::Speech, frame_end);
                }
            }
            (VadState::SpeechStarting, true) => {
                self.run_frames += 1;
                if self.run_frames >= self.start_frames {
                    self.transition(VadState::Speech, frame_end);
                }
            }
            (VadState::SpeechStarting, false) => {
                self.run_start = frame_start;
                self.transition(VadState::Silence, frame_end);
            }
            (VadState::Speech, false) => {
                self.run_start = frame_start;
                self.run_frames = 1;
                self.transition(VadState::SpeechEnding, frame_end);
                if self.run_frames >= self.stop_frames {
                    self.transition(VadState::Silence, frame_end);
                }
            }
            (VadState::SpeechEnding, false) => {
                self.run_frames += 1;
                if self.run_frames >= self.stop_frames {
                    self.transition(VadState::Silence, frame_end);
                }
            }
            (VadState::SpeechEnding, true) => {
                // The pause was part of the speech: onset goes back to before it began.
                self.transition(VadState::Speech, frame_end);
            }
            (VadState::Silence, false) | (VadState::Speech, true) => {}
        }

        let report = VadFrame {
            index: self.frames,
            end: self.to_input(frame_end),
            confidence,
            volume,
            state: self.state,
        };
        self.frames += 1;
        self.last = Some(report);
        if self.telemetry {
            self.outputs.push_back(VadOutput::Frame(report));
        }
    }

    fn transition(&mut self, to: VadState, decided_at: u64) {
        let from = self.state;
        self.state = to;
        let (onset, audio_start) = match to {
            VadState::SpeechStarting | VadState::Speech => {
                let onset = self.to_input(self.speech_start);
                (onset, onset.saturating_sub(self.backbuffer))
            }
            _ => {
                let onset = self.to_input(self.run_start);
                (onset, onset)
            }
        };
        self.outputs.push_back(VadOutput::Transition(VadTransition {
            from,
            to,
            position: self.to_input(decided_at),
            onset,
            audio_start,
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_config() {
        let mut c = VadConfig {
            confidence_threshold: 1.5,
            ..VadConfig::default()
        };
        assert_eq!(
            Vad::new(c, 16_000).unwrap_err(),
            VadError::OutOfRange("confidence_threshold")
        );
        c.confidence_threshold = 0.5;
        c.min_volume = f32::NAN;
        assert!(Vad::new(c, 16_000).is_err());
        c.min_volume = 0.1;
        c.stop_duration = Duration::from_secs(61);
        assert_eq!(
            Vad::new(c, 16_000).unwrap_err(),
            VadError::TooLong("stop_duration")
        );
        assert!(Vad::new(VadConfig::default(), 0).is_err());
    }

    /// Each window is accepted at its maximum and refused just above it, with a message naming
    /// the field and the maximum; so is the input rate.
    #[test]
    fn windows_and_rate_are_bounded() {
        type Set = fn(&mut VadConfig, Duration);
        let fields: [(&str, Set, Duration); 3] = [
            (
                "start_duration",
                |c, d| c.start_duration = d,
                MAX_START_DURATION,
            ),
            (
                "stop_duration",
                |c, d| c.stop_duration = d,
                MAX_STOP_DURATION,
            ),
            (
                "backbuffer_duration",
                |c, d| c.backbuffer_duration = d,
                MAX_BACKBUFFER_DURATION,
            ),
        ];
        for (name, set, max) in fields {
            let mut c = VadConfig::default();
            set(&mut c, max);
            assert_eq!(c.validate(), Ok(()));
            set(&mut c, max + Duration::from_nanos(1));
            assert_eq!(c.validate(), Err(VadError::TooLong(name)));
            let err = Vad::new(c, 16_000).unwrap_err();
            assert_eq!(err, VadError::TooLong(name));
            assert_eq!(err.to_string(), format!("{name} must be at most {max:?}"));
        }
        assert!(Vad::new(VadConfig::default(), MAX_INPUT_RATE).is_ok());
        let err = Vad::new(VadConfig::default(), MAX_INPUT_RATE + 1).unwrap_err();
        assert_eq!(err, VadError::InputRate(MAX_INPUT_RATE + 1));
        assert_eq!(
            err.to_string(),
            "input rate 192001 Hz is above the detector's maximum of 192000 Hz"
        );
    }

    /// The largest configuration at the highest rate fits the documented history bound.
    #[test]
    fn largest_history_fits_the_bound() {
        let c = VadConfig {
            start_duration: MAX_START_DURATION,
            stop_duration: MAX_STOP_DURATION,
            backbuffer_duration: MAX_BACKBUFFER_DURATION,
            ..VadConfig::default()
        };
        for rate in [
            8_000,
            16_000,
            44_100,
            48_000,
            96_000,
            176_400,
            MAX_INPUT_RATE,
        ] {
            let vad = Vad::new(c, rate).unwrap();
            let held = vad.history.buf.len();
            assert!(held <= MAX_HISTORY_SAMPLES, "{rate} Hz: {held}");
            // And it really holds the whole backbuffer plus start window.
            let needed = usize::try_from((MAX_BACKBUFFER_DURATION + MAX_START_DURATION).as_secs())
                .unwrap()
                * rate as usize;
            assert!(held >= needed, "{rate} Hz: {held} < {needed}");
        }
    }

    #[test]
    fn history_wraps_and_clamps() {
        let mut h = History {
            buf: vec![0; 4],
            written: 0,
        };
        let f = |v: &[i16]| -> Vec<f32> { v.iter().map(|&s| f32::from(s) / 32768.0).collect() };
        h.push_i16(&[1, 2, 3]);
        h.push(&f(&[4, 5, 6]));
        let mut out = Vec::new();
        assert_eq!(h.copy_from(0, &mut out), 2);
        assert_eq!(out, f(&[3, 4, 5, 6]));
        out.clear();
        assert_eq!(h.copy_from(5, &mut out), 5);
        assert_eq!(out, f(&[6]));
        // More than the ring holds at once: the last four are kept at their true positions.
        h.push_i16(&[7, 8, 9, 10, 11]);
        assert_eq!(h.written, 11);
        out.clear();
        assert_eq!(h.copy_from(0, &mut out), 7);
        assert_eq!(out, f(&[8, 9, 10, 11]));
        // Floats are kept rounded to 16 bits and clamped.
        h.push(&[0.5 + 0.1 / 32768.0, 2.0]);
        out.clear();
        h.copy_from(11, &mut out);
        assert_eq!(out, vec![0.5, 32767.0 / 32768.0]);
    }

    #[test]
    fn to_i16_rounds_clamps_and_zeroes_nan() {
        for k in [-32768i16, -12345, -1, 0, 1, 16384, 32767] {
            assert_eq!(to_i16(f32::from(k) / 32768.0), k);
        }
        assert_eq!(to_i16(0.4 / 32768.0), 0);
        assert_eq!(to_i16(0.6 / 32768.0), 1);
        assert_eq!(to_i16(-0.6 / 32768.0), -1);
        assert_eq!(to_i16(2.0), i16::MAX);
        assert_eq!(to_i16(-2.0), i16::MIN);
        assert_eq!(to_i16(f32::NAN), 0);
        // Agrees with the crate's rounding everywhere but exact ties.
        for i in 0..100_000 {
            let x = (i as f32 / 50_000.0 - 1.0) * 0.999_97;
            if (x * 32768.0).fract().abs() != 0.5 {
                assert_eq!(to_i16(x), crate::format::f32_to_i16(x), "{x}");
            }
        }
    }

    /// With a zero threshold and volume every frame is speech, so the machine walks
    /// SILENCE -> STARTING -> SPEECH after exactly `start_duration`.
    #[test]
    fn hysteresis_counts_frames() {
        let cfg = VadConfig {
            confidence_threshold: 0.0,
            min_volume: 0.0,
            start_duration: Duration::from_millis(48),
            ..VadConfig::default()
        };
        let mut vad = Vad::new(cfg, 16_000).unwrap();
        vad.set_frame_telemetry(true);
        vad.process(&vec![0.01; FRAME_SAMPLES * 3]);
        let outs: Vec<_> = std::iter::from_fn(|| vad.poll_output()).collect();
        let transitions: Vec<_> = outs
            .iter()
            .filter_map(|o| match o {
                VadOutput::Transition(t) => Some((t.to, t.position, t.onset)),
                VadOutput::Frame(_) => None,
            })
            .collect();
        assert_eq!(
            transitions,
            vec![
                (VadState::SpeechStarting, 256, 0),
                (VadState::Speech, 768, 0)
            ]
        );
        let frames = outs
            .iter()
            .filter(|o| matches!(o, VadOutput::Frame(_)))
            .count();
        assert_eq!(frames, 3);
        assert_eq!(vad.last_frame().unwrap().index, 2);
    }

    #[test]
    fn volume_scale() {
        let mut vad = Vad::new(VadConfig::default(), 16_000).unwrap();
        // A full-scale square wave is 0 dBFS; one at 1/1000 is -60 dBFS.
        let sq: Vec<f32> = (0..FRAME_SAMPLES)
            .map(|i| if i % 2 == 0 { 1.0 } else { -1.0 })
            .collect();
        vad.process(&sq);
        assert!((vad.last_frame().unwrap().volume - 1.0).abs() < 1e-3);
        let quiet: Vec<f32> = sq.iter().map(|s| s * 0.001).collect();
        vad.process(&quiet);
        assert!(vad.last_frame().unwrap().volume < 1e-3);
        vad.process(&[f32::NAN; FRAME_SAMPLES]);
        assert_eq!(vad.last_frame().unwrap().volume, 0.0);
    }
}
