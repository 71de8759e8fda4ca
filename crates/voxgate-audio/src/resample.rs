//! Streaming mono sample-rate conversion on `rubato`.
//!
//! Callers feed chunks of any size; the resampler buffers input until it has one internal block
//! (10 ms of input, rounded by rubato to fit the ratio exactly) and then runs rubato's synchronous
//! FFT resampler on it, which is both the fastest and the highest-quality choice for a fixed
//! ratio. Equal rates take a copy-only fast path.

use audioadapter_buffers::direct::InterleavedSlice;
use rubato::{Fft, FixedSync, Resampler as _};
use thiserror::Error;

/// A resampler could not be built for the requested rates.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ResampleError {
    /// A rate was zero or above 384 kHz.
    #[error("unsupported sample rate {0} Hz")]
    UnsupportedRate(u32),
    /// rubato rejected the configuration.
    #[error("resampler construction failed: {0}")]
    Construction(String),
}

/// Highest rate accepted: far above any voice use, low enough that buffers stay small.
const MAX_RATE: u32 = 384_000;

struct Converter {
    fft: Fft<f32>,
    pending: Vec<f32>,
    block_in: usize,
    block: Vec<f32>,
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
    /// [`ResampleError`] when a rate is zero or above 384 kHz.
    pub fn new(from: u32, to: u32) -> Result<Self, ResampleError> {
        for rate in [from, to] {
            if rate == 0 || rate > MAX_RATE {
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
    /// remaining output to `out`; the resampler is then reset for a new stream.
    pub fn flush(&mut self, out: &mut Vec<f32>) -> usize {
        let Some(c) = self.converter.as_mut() else {
            return 0;
        };
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
