//! Streaming mono sample-rate conversion on `rubato`.
//!
//! Callers feed chunks of any size; the resampler buffers input until it has one internal block
//! (10 ms of input, rounded by rubato to fit the ratio exactly) and then runs rubato's synchronous
//! FFT resampler on it, which is both the fastest and the highest-quality choice for a fixed
//! ratio. Equal rates take a copy-only fast path.
//!
//! [`Resampler`] is fixed to one pair of rates. [`RateConverter`] is fixed to one output rate and
//! follows whatever rate the incoming audio has (TTS voices differ, clients change formats): it
//! builds a resampler lazily, rebuilds it when the source rate changes (flushing the old one's
//! tail first, so no audio is lost) and copies when the rates are equal.

use audioadapter_buffers::direct::InterleavedSlice;
use rubato::{Fft, FixedSync, Resampler as _};
use thiserror::Error;

/// A resampler could not be built for the requested rates.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ResampleError {
    /// A rate was zero or above [`MAX_SAMPLE_RATE`].
    #[error("unsupported sample rate {0} Hz (must be 1..={MAX_SAMPLE_RATE})")]
    UnsupportedRate(u32),
    /// rubato rejected the configuration.
    #[error("resampler construction failed: {0}")]
    Construction(String),
}

/// Highest rate accepted, in Hz: far above any voice use, low enough that buffers stay small.
pub const MAX_SAMPLE_RATE: u32 = 384_000;

struct Converter {
    fft: Fft<f32>,
    pending: Vec<f32>,
    block_in: usize,
    block: Vec<f32>,
    /// Input arrived since the last reset: only then does a flush owe the filter's delay.
    fed: bool,
}

/// A streaming mono resampler between two fixed rates.
pub struct Resampler {
    from: u32,
    to: u32,
    converter: Option<Converter>,
}

impl std::fmt::Debug for Resampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resampler")
            .field("from", &self.from)
            .field("to", &self.to)
            .field("delay", &self.delay())
            .finish_non_exhaustive()
    }
}

impl Resampler {
    /// A resampler from `from` Hz to `to` Hz.
    ///
    /// # Errors
    /// [`ResampleError`] when a rate is zero or above [`MAX_SAMPLE_RATE`].
    pub fn new(from: u32, to: u32) -> Result<Self, ResampleError> {
        for rate in [from, to] {
            if rate == 0 || rate > MAX_SAMPLE_RATE {
                return Err(ResampleError::UnsupportedRate(rate));
            }
        }
        if from == to {
            return Ok(Self {
                from,
                to,
                converter: None,
            });
        }
        let chunk_hint = (from / 100).max(1) as usize;
        let fft = Fft::<f32>::new(from as usize, to as usize, chunk_hint, 1, FixedSync::Both)
            .map_err(|e| ResampleError::Construction(e.to_string()))?;
        let block_in = fft.input_frames_next();
        let block = vec![0.0; fft.output_frames_max()];
        Ok(Self {
            from,
            to,
            converter: Some(Converter {
                fft,
                pending: Vec::with_capacity(block_in),
                block_in,
                block,
                fed: false,
            }),
        })
    }

    /// Input rate in Hz.
    #[must_use]
    pub const fn input_rate(&self) -> u32 {
        self.from
    }

    /// Output rate in Hz.
    #[must_use]
    pub const fn output_rate(&self) -> u32 {
        self.to
    }

    /// True when input passes through unchanged (equal rates).
    #[must_use]
    pub const fn is_passthrough(&self) -> bool {
        self.converter.is_none()
    }

    /// The fixed signal delay in output samples: output sample `delay() + n` corresponds to
    /// input time `n / output_rate`. Zero for the passthrough.
    #[must_use]
    pub fn delay(&self) -> usize {
        self.converter.as_ref().map_or(0, |c| c.fft.output_delay())
    }

    /// Input samples consumed per internal block (the buffering latency); 1 for the passthrough.
    #[must_use]
    pub fn block_input_samples(&self) -> usize {
        self.converter.as_ref().map_or(1, |c| c.block_in)
    }

    /// Most output samples one internal block can produce; size output buffers with it.
    #[must_use]
    pub fn block_output_samples(&self) -> usize {
        self.converter.as_ref().map_or(1, |c| c.block.len())
    }

    /// Input samples waiting for a full block.
    #[must_use]
    pub fn pending_input(&self) -> usize {
        self.converter.as_ref().map_or(0, |c| c.pending.len())
    }

    /// Resamples `input` and appends whatever output is ready to `out`; returns the number of
    /// samples appended.
    ///
    /// `out` only grows when it lacks capacity, so a caller reusing one buffer allocates nothing
    /// in steady state.
    pub fn process(&mut self, mut input: &[f32], out: &mut Vec<f32>) -> usize {
        let Some(c) = self.converter.as_mut() else {
            out.extend_from_slice(input);
            return input.len();
        };
        let before = out.len();
        c.fed |= !input.is_empty();
        while !input.is_empty() {
            let take = (c.block_in - c.pending.len()).min(input.len());
            let (head, rest) = input.split_at(take);
            c.pending.extend_from_slice(head);
            input = rest;
            if c.pending.len() == c.block_in {
                c.run(out);
            }
        }
        out.len() - before
    }

    /// Pushes the buffered tail and the filter's delay line out with silence, appending the
    /// remaining output to `out`; the resampler is then reset for a new stream. A resampler that
    /// has had no input since it was built, reset or flushed appends nothing.
    pub fn flush(&mut self, out: &mut Vec<f32>) -> usize {
        let Some(c) = self.converter.as_mut() else {
            return 0;
        };
        if !c.fed {
            return 0;
        }
        let before = out.len();
        let mut owed = c.fft.output_delay();
        if !c.pending.is_empty() {
            let real = c.pending.len();
            #[allow(clippy::cast_precision_loss)]
            let ratio = c.fft.output_frames_max() as f64 / c.block_in as f64;
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let real_out = (real as f64 * ratio).round() as usize;
            owed += real_out;
            c.pending.resize(c.block_in, 0.0);
            let start = out.len();
            c.run(out);
            let produced = out.len() - start;
            let keep = produced.min(owed);
            out.truncate(start + keep);
            owed -= keep;
        }
        while owed > 0 {
            c.pending.resize(c.block_in, 0.0);
            let start = out.len();
            c.run(out);
            let keep = (out.len() - start).min(owed);
            out.truncate(start + keep);
            owed -= keep;
        }
        self.reset();
        out.len() - before
    }

    /// Forgets buffered input and filter state.
    pub fn reset(&mut self) {
        if let Some(c) = self.converter.as_mut() {
            c.pending.clear();
            c.fft.reset();
            c.fed = false;
        }
    }
}

impl Converter {
    fn run(&mut self, out: &mut Vec<f32>) {
        let frames_out = self.block.len();
        let written = match (
            InterleavedSlice::new(&self.pending[..], 1, self.block_in),
            InterleavedSlice::new_mut(&mut self.block[..], 1, frames_out),
        ) {
            (Ok(input), Ok(mut output)) => self
                .fft
                .process_into_buffer(&input, &mut output, None)
                .map_or(0, |(_, written)| written),
            // Sizes come from the resampler itself, so this cannot happen.
            _ => 0,
        };
        out.extend_from_slice(&self.block[..written.min(frames_out)]);
        self.pending.clear();
    }
}

/// Input arriving as `i16` is converted to `f32` this many samples at a time, so the scratch
/// buffers stay a few kilobytes however long a chunk is (a TTS chunk can be seconds of audio).
const SLICE: usize = 1024;

/// A streaming mono resampler to one fixed output rate from whatever rate the input has.
///
/// Doors receive audio whose rate can change between chunks (a TTS voice per sentence, a client
/// re-sending its format); this keeps one [`Resampler`] for the current source rate, built on
/// first use and rebuilt when the rate changes. Before a rebuild the old resampler is flushed
/// into the output, so the tail of the previous audio is never lost. Equal rates copy.
///
/// An unusable source rate (zero or above [`MAX_SAMPLE_RATE`]) is an error for that chunk only:
/// the chunk is dropped and the converter keeps its previous state.
///
/// All output is appended to a caller-owned `Vec`; a caller that reuses it allocates nothing in
/// steady state (only a rate change builds a new resampler).
pub struct RateConverter {
    to: u32,
    resampler: Option<Resampler>,
    /// `i16` input as `f32`, one [`SLICE`] at a time.
    scratch: Vec<f32>,
    /// `f32` output on its way to an `i16` caller.
    converted: Vec<f32>,
}

impl std::fmt::Debug for RateConverter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateConverter")
            .field("output_rate", &self.to)
            .field("resampler", &self.resampler)
            .finish_non_exhaustive()
    }
}

impl RateConverter {
    /// A converter to `output_rate` Hz; no resampler is built until audio arrives.
    ///
    /// # Errors
    /// [`ResampleError::UnsupportedRate`] when `output_rate` is zero or above
    /// [`MAX_SAMPLE_RATE`].
    pub fn new(output_rate: u32) -> Result<Self, ResampleError> {
        if output_rate == 0 || output_rate > MAX_SAMPLE_RATE {
            return Err(ResampleError::UnsupportedRate(output_rate));
        }
        Ok(Self {
            to: output_rate,
            resampler: None,
            scratch: Vec::new(),
            converted: Vec::new(),
        })
    }

    /// Output rate in Hz.
    #[must_use]
    pub const fn output_rate(&self) -> u32 {
        self.to
    }

    /// The source rate of the current resampler, if audio has arrived.
    #[must_use]
    pub fn source_rate(&self) -> Option<u32> {
        self.resampler.as_ref().map(Resampler::input_rate)
    }

    /// The current resampler's signal delay in output samples (see [`Resampler::delay`]); zero
    /// before any audio and for equal rates.
    #[must_use]
    pub fn delay(&self) -> usize {
        self.resampler.as_ref().map_or(0, Resampler::delay)
    }

    /// Input samples waiting in the current resampler for a full block.
    #[must_use]
    pub fn pending_input(&self) -> usize {
        self.resampler.as_ref().map_or(0, Resampler::pending_input)
    }

    /// The resampler for `source_rate`, built or rebuilt as needed; a replaced resampler's tail
    /// goes to `out` first. On error nothing changes.
    fn resampler_for(
        &mut self,
        source_rate: u32,
        out: &mut Vec<f32>,
    ) -> Result<&mut Resampler, ResampleError> {
        let current = self.resampler.as_ref().map(Resampler::input_rate);
        if current != Some(source_rate) {
            let fresh = Resampler::new(source_rate, self.to)?;
            if let Some(mut old) = self.resampler.take() {
                old.flush(out);
            }
            return Ok(self.resampler.insert(fresh));
        }
        match self.resampler.as_mut() {
            Some(r) => Ok(r),
            // `current` was `Some`, so the resampler is there; answer like a bad rate anyway
            // rather than panic.
            None => Err(ResampleError::UnsupportedRate(source_rate)),
        }
    }

    /// Converts `samples` (mono `f32` at `source_rate` Hz) and appends whatever output is ready
    /// to `out`, including a replaced resampler's tail; returns the number of samples appended.
    ///
    /// # Errors
    /// [`ResampleError`] when no resampler can be built for `source_rate`; the chunk is dropped
    /// and the converter is unchanged.
    pub fn process(
        &mut self,
        samples: &[f32],
        source_rate: u32,
        out: &mut Vec<f32>,
    ) -> Result<usize, ResampleError> {
        let before = out.len();
        let r = self.resampler_for(source_rate, out)?;
        r.process(samples, out);
        Ok(out.len() - before)
    }

    /// [`process`](Self::process) for `i16` input (TTS audio), with `f32` output.
    ///
    /// # Errors
    /// As [`process`](Self::process).
    pub fn process_i16(
        &mut self,
        samples: &[i16],
        source_rate: u32,
        out: &mut Vec<f32>,
    ) -> Result<usize, ResampleError> {
        let before = out.len();
        self.resampler_for(source_rate, out)?;
        let mut scratch = std::mem::take(&mut self.scratch);
        for slice in samples.chunks(SLICE) {
            scratch.clear();
            scratch.extend(slice.iter().map(|&s| crate::format::i16_to_f32(s)));
            if let Some(r) = self.resampler.as_mut() {
                r.process(&scratch, out);
            }
        }
        self.scratch = scratch;
        Ok(out.len() - before)
    }

    /// [`process`](Self::process) for `i16` input with `i16` output; equal rates copy the
    /// samples unchanged.
    ///
    /// # Errors
    /// As [`process`](Self::process).
    pub fn process_i16_to_i16(
        &mut self,
        samples: &[i16],
        source_rate: u32,
        out: &mut Vec<i16>,
    ) -> Result<usize, ResampleError> {
        let before = out.len();
        let mut converted = std::mem::take(&mut self.converted);
        converted.clear();
        let result = self
            .resampler_for(source_rate, &mut converted)
            .map(|r| r.is_passthrough());
        extend_i16(out, &converted);
        match result {
            Ok(true) => out.extend_from_slice(samples),
            Ok(false) => {
                for slice in samples.chunks(SLICE) {
                    converted.clear();
                    // Reuses `scratch` for the input and `converted` for the output.
                    let _ = self.process_i16(slice, source_rate, &mut converted);
                    extend_i16(out, &converted);
                }
            }
            Err(e) => {
                self.converted = converted;
                return Err(e);
            }
        }
        converted.clear();
        self.converted = converted;
        Ok(out.len() - before)
    }

    /// The end of a stream: appends the current resampler's buffered tail and filter delay to
    /// `out` and resets it for the next stream at the same rate; returns the samples appended.
    pub fn flush(&mut self, out: &mut Vec<f32>) -> usize {
        self.resampler.as_mut().map_or(0, |r| r.flush(out))
    }

    /// [`flush`](Self::flush) with `i16` output.
    pub fn flush_i16(&mut self, out: &mut Vec<i16>) -> usize {
        let mut converted = std::mem::take(&mut self.converted);
        converted.clear();
        let n = self.flush(&mut converted);
        extend_i16(out, &converted);
        converted.clear();
        self.converted = converted;
        n
    }

    /// Forgets buffered input and filter state (a barge-in: the rest of the audio is not
    /// wanted); the resampler is kept for the next stream.
    pub fn reset(&mut self) {
        if let Some(r) = self.resampler.as_mut() {
            r.reset();
        }
    }
}

fn extend_i16(out: &mut Vec<i16>, samples: &[f32]) {
    out.extend(samples.iter().map(|&s| crate::format::f32_to_i16(s)));
}

#[cfg(test)]
mod tests {
    use super::*;

    const RATES: [u32; 6] = [8000, 16_000, 22_050, 24_000, 44_100, 48_000];

    fn sine(rate: u32, hz: f32, secs: f32) -> Vec<f32> {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let n = (rate as f32 * secs) as usize;
        (0..n)
            .map(|i| 0.5 * (std::f32::consts::TAU * hz * i as f32 / rate as f32).sin())
            .collect()
    }

    #[test]
    fn rejects_bad_rates() {
        assert!(matches!(
            Resampler::new(0, 16_000),
            Err(ResampleError::UnsupportedRate(0))
        ));
        assert!(Resampler::new(16_000, 1_000_000).is_err());
    }

    /// A second flush, or a flush before any input, has no delay line to push out: flushing at
    /// the end of every response must not add silence to responses without audio.
    #[test]
    fn flush_without_input_appends_nothing() {
        let mut r = Resampler::new(24_000, 16_000).unwrap();
        let mut out = Vec::new();
        assert_eq!(r.flush(&mut out), 0);
        r.process(&[0.1; 100], &mut out);
        assert!(r.flush(&mut out) > 0);
        assert_eq!(r.flush(&mut out), 0);
        r.process(&[0.1; 100], &mut out);
        r.reset();
        assert_eq!(r.flush(&mut out), 0);
    }

    #[test]
    fn passthrough_copies() {
        let mut r = Resampler::new(16_000, 16_000).unwrap();
        assert!(r.is_passthrough());
        let mut out = Vec::new();
        r.process(&[0.1, 0.2], &mut out);
        assert_eq!(out, vec![0.1, 0.2]);
        assert_eq!(r.delay(), 0);
    }

    /// Every pair of common rates keeps the length ratio and the tone, whatever the chunking.
    #[test]
    fn all_common_pairs_keep_length_and_tone() {
        for &from in &RATES {
            for &to in &RATES {
                let input = sine(from, 440.0, 0.5);
                let mut r = Resampler::new(from, to).unwrap();
                let mut out = Vec::new();
                // Awkward chunk sizes: primes and single samples.
                let mut i = 0;
                let mut step = 1;
                while i < input.len() {
                    let end = (i + step).min(input.len());
                    r.process(&input[i..end], &mut out);
                    i = end;
                    step = step * 7 % 997 + 1;
                }
                let delay = r.delay();
                r.flush(&mut out);
                let expected = input.len() as f64 * f64::from(to) / f64::from(from);
                let got = (out.len() - delay) as f64;
                assert!(
                    (got - expected).abs() <= 2.0,
                    "{from}->{to}: {got} samples, expected {expected}"
                );
                // Compare against the ideal tone, skipping the filter edges; the true delay can
                // be a fraction of a sample, so take the best of a few sub-sample shifts.
                let aligned = &out[delay..];
                let rms = (-4..=4)
                    .map(|q| {
                        let shift = q as f32 / 8.0;
                        let mut err = 0.0f64;
                        for (k, &s) in aligned.iter().enumerate().skip(200).take(2000) {
                            let t = (k as f32 + shift) / to as f32;
                            let ideal = 0.5 * (std::f32::consts::TAU * 440.0 * t).sin();
                            err += f64::from((s - ideal).powi(2));
                        }
                        (err / 2000.0).sqrt()
                    })
                    .fold(f64::INFINITY, f64::min);
                assert!(rms < 0.01, "{from}->{to}: rms error {rms}");
            }
        }
    }
}

#[cfg(test)]
mod converter_tests {
    use super::*;
    use crate::format::{f32_to_i16, i16_to_f32};
    use proptest::prelude::*;

    const RATES: [u32; 6] = [8000, 16_000, 22_050, 24_000, 44_100, 48_000];

    fn ramp(n: usize) -> Vec<f32> {
        #[allow(clippy::cast_precision_loss)]
        (0..n).map(|i| ((i as f32) * 0.013).sin() * 0.4).collect()
    }

    /// Equal lengths and samples, without printing thousands of them on failure.
    fn assert_same(got: &[f32], want: &[f32]) {
        assert_eq!(got.len(), want.len(), "lengths differ");
        let first = got
            .iter()
            .zip(want)
            .position(|(a, b)| a.to_bits() != b.to_bits());
        assert_eq!(first, None, "first differing sample");
    }

    /// What one fixed resampler makes of a whole stream, flushed.
    fn reference(samples: &[f32], from: u32, to: u32) -> Vec<f32> {
        let mut r = Resampler::new(from, to).unwrap();
        let mut out = Vec::new();
        r.process(samples, &mut out);
        r.flush(&mut out);
        out
    }

    #[test]
    fn rejects_bad_rates_without_losing_state() {
        assert_eq!(
            RateConverter::new(0).unwrap_err(),
            ResampleError::UnsupportedRate(0)
        );
        assert!(RateConverter::new(MAX_SAMPLE_RATE + 1).is_err());

        let mut c = RateConverter::new(16_000).unwrap();
        let mut out = Vec::new();
        let first = ramp(1000);
        c.process(&first, 24_000, &mut out).unwrap();
        let pending = c.pending_input();
        for bad in [0, MAX_SAMPLE_RATE + 1, u32::MAX] {
            assert_eq!(
                c.process(&[0.5; 100], bad, &mut out),
                Err(ResampleError::UnsupportedRate(bad))
            );
            assert_eq!(
                c.process_i16(&[1; 100], bad, &mut out),
                Err(ResampleError::UnsupportedRate(bad))
            );
            let mut ints = Vec::new();
            assert!(c.process_i16_to_i16(&[1; 100], bad, &mut ints).is_err());
            assert!(ints.is_empty());
        }
        // The dropped chunks left the 24 kHz stream exactly as it was.
        assert_eq!(c.source_rate(), Some(24_000));
        assert_eq!(c.pending_input(), pending);
        c.flush(&mut out);
        assert_eq!(out, reference(&first, 24_000, 16_000));
    }

    #[test]
    fn equal_rates_copy() {
        let mut c = RateConverter::new(24_000).unwrap();
        let mut out = Vec::new();
        assert_eq!(c.process(&[0.25, -0.5], 24_000, &mut out), Ok(2));
        assert_eq!(out, vec![0.25, -0.5]);
        assert_eq!(c.delay(), 0);
        assert_eq!(c.flush(&mut out), 0);
        let mut ints = Vec::new();
        let input = [i16::MIN, -1, 0, 1, i16::MAX];
        assert_eq!(c.process_i16_to_i16(&input, 24_000, &mut ints), Ok(5));
        assert_eq!(ints, input);
        let mut floats = Vec::new();
        c.process_i16(&input, 24_000, &mut floats).unwrap();
        assert_eq!(floats, input.map(i16_to_f32));
    }

    /// A rate change flushes the old resampler first: the output is exactly what two separate
    /// resamplers make of the two streams, one after the other.
    #[test]
    fn rate_change_mid_stream_keeps_the_tail() {
        let a = ramp(7_000);
        let b = ramp(5_000);
        let mut c = RateConverter::new(24_000).unwrap();
        let mut out = Vec::new();
        for chunk in a.chunks(333) {
            c.process(chunk, 22_050, &mut out).unwrap();
        }
        assert_eq!(c.source_rate(), Some(22_050));
        for chunk in b.chunks(250) {
            c.process(chunk, 16_000, &mut out).unwrap();
        }
        assert_eq!(c.source_rate(), Some(16_000));
        c.flush(&mut out);
        let mut expected = reference(&a, 22_050, 24_000);
        expected.extend(reference(&b, 16_000, 24_000));
        assert_same(&out, &expected);

        // Into and out of the copy path as well.
        let mut out = Vec::new();
        c.process(&a, 24_000, &mut out).unwrap();
        c.process(&b, 48_000, &mut out).unwrap();
        c.process(&a, 24_000, &mut out).unwrap();
        let mut expected = reference(&a, 24_000, 24_000);
        expected.extend(reference(&b, 48_000, 24_000));
        expected.extend_from_slice(&a);
        assert_same(&out, &expected);
    }

    #[test]
    fn i16_paths_match_the_f32_path() {
        let ints: Vec<i16> = ramp(5_000).into_iter().map(f32_to_i16).collect();
        let floats: Vec<f32> = ints.iter().map(|&s| i16_to_f32(s)).collect();
        let expected = reference(&floats, 16_000, 24_000);

        let mut c = RateConverter::new(24_000).unwrap();
        let mut out = Vec::new();
        // Longer than one internal slice, so the slicing is exercised.
        c.process_i16(&ints, 16_000, &mut out).unwrap();
        c.flush(&mut out);
        assert_same(&out, &expected);

        let mut c = RateConverter::new(24_000).unwrap();
        let mut out = Vec::new();
        for chunk in ints.chunks(1500) {
            c.process_i16_to_i16(chunk, 16_000, &mut out).unwrap();
        }
        c.flush_i16(&mut out);
        assert_eq!(
            out,
            expected.iter().map(|&s| f32_to_i16(s)).collect::<Vec<_>>()
        );
    }

    #[test]
    fn flush_ends_a_stream_and_reset_drops_it() {
        let a = ramp(3_000);
        let mut c = RateConverter::new(16_000).unwrap();
        let mut out = Vec::new();
        assert_eq!(c.flush(&mut out), 0, "nothing to flush before any audio");
        c.process(&a, 48_000, &mut out).unwrap();
        c.flush(&mut out);
        assert_eq!(out, reference(&a, 48_000, 16_000));
        assert_eq!(c.pending_input(), 0);
        // The resampler survives the flush and starts the next stream clean.
        let mut second = Vec::new();
        c.process(&a, 48_000, &mut second).unwrap();
        c.flush(&mut second);
        assert_eq!(second, out);

        let mut dropped = Vec::new();
        c.process(&a[..100], 48_000, &mut dropped).unwrap();
        assert!(c.pending_input() > 0);
        c.reset();
        assert_eq!(c.pending_input(), 0);
        let mut after = Vec::new();
        c.process(&a, 48_000, &mut after).unwrap();
        c.flush(&mut after);
        assert_eq!(after, out, "reset forgot the earlier 100 samples");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Output tracks input * ratio: short of it by less than one internal block before the
        /// flush, and equal to it (within rounding) plus the delay after.
        #[test]
        fn output_length_tracks_the_ratio(
            from in prop::sample::select(RATES.to_vec()),
            to in prop::sample::select(RATES.to_vec()),
            chunks in prop::collection::vec(0usize..1500, 1..12),
        ) {
            let mut c = RateConverter::new(to).unwrap();
            let mut out = Vec::new();
            let mut fed = 0usize;
            for n in chunks {
                c.process(&ramp(n), from, &mut out).unwrap();
                fed += n;
                let ideal = fed as f64 * f64::from(to) / f64::from(from);
                let block = c.resampler.as_ref().unwrap().block_output_samples() as f64;
                let got = out.len() as f64;
                prop_assert!(got <= ideal + 1.0, "{got} > {ideal}");
                prop_assert!(got > ideal - block - 1.0, "{got} vs {ideal}, block {block}");
            }
            let delay = c.delay();
            c.flush(&mut out);
            let ideal = fed as f64 * f64::from(to) / f64::from(from);
            let got = (out.len() - delay) as f64;
            prop_assert!((got - ideal).abs() <= 2.0, "{from}->{to}: {got} vs {ideal}");
        }
    }
}
