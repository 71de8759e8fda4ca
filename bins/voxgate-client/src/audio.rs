//! Audio helpers shared by the doors: WAV in (mono, resampled), real-time pacing, WAV out.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use serde_json::json;
use tokio::time::Instant;
use voxgate_audio::format::f32_to_i16;
use voxgate_audio::resample::Resampler;
use voxgate_audio::wav::{read_wav, wav_bytes_i16};

use crate::events::Events;

/// Reads a WAV file as mono `f32` samples at `rate` (channels averaged, resampled).
///
/// # Errors
/// When the file cannot be read or is not a supported WAV, or the rate is unusable.
pub fn load_wav(path: &Path, rate: u32) -> anyhow::Result<Vec<f32>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let wav = read_wav(&bytes).with_context(|| format!("decoding {}", path.display()))?;
    resample(&wav.to_mono(), wav.sample_rate, rate)
}

/// A WAV file to stream: mono frames of `frame` at `rate` (the last one padded with silence),
/// then `silence_tail` of silent frames so a server-side VAD sees the end of the speech.
///
/// # Errors
/// As [`load_wav`].
pub fn wav_frames(
    path: &Path,
    rate: u32,
    frame: Duration,
    silence_tail: Duration,
) -> anyhow::Result<Vec<Vec<f32>>> {
    let samples = load_wav(path, rate)?;
    let len = frame_samples(rate, frame);
    let mut out = frames(&samples, len);
    let tail = silence_tail.as_micros() / frame.as_micros().max(1);
    out.extend((0..tail).map(|_| vec![0.0; len]));
    Ok(out)
}

/// Resamples mono audio from `from` Hz to `to` Hz (a copy when the rates match).
///
/// # Errors
/// When the resampler refuses the rates.
pub fn resample(samples: &[f32], from: u32, to: u32) -> anyhow::Result<Vec<f32>> {
    if from == to {
        return Ok(samples.to_vec());
    }
    let mut r = Resampler::new(from, to).context("resampler")?;
    let delay = r.delay();
    let mut out = Vec::with_capacity(expected_len(samples.len(), from, to) + delay + 1024);
    r.process(samples, &mut out);
    r.flush(&mut out);
    // The filter delays the signal: drop its head so timing matches the source.
    let out = out.split_off(delay.min(out.len()));
    let want = expected_len(samples.len(), from, to);
    Ok(out.into_iter().take(want).collect())
}

/// Samples after resampling `len` samples from `from` Hz to `to` Hz.
#[must_use]
pub fn expected_len(len: usize, from: u32, to: u32) -> usize {
    let n = u128::try_from(len).unwrap_or(u128::MAX) * u128::from(to) / u128::from(from.max(1));
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// Samples in one frame of `frame` at `rate`.
#[must_use]
pub fn frame_samples(rate: u32, frame: Duration) -> usize {
    usize::try_from(u128::from(rate) * frame.as_micros() / 1_000_000).unwrap_or(usize::MAX)
}

/// Splits `samples` into frames of `len`, the last one padded with silence.
#[must_use]
pub fn frames(samples: &[f32], len: usize) -> Vec<Vec<f32>> {
    if len == 0 {
        return Vec::new();
    }
    samples
        .chunks(len)
        .map(|c| {
            let mut f = c.to_vec();
            f.resize(len, 0.0);
            f
        })
        .collect()
}

/// `f32` samples to 16-bit little-endian PCM bytes.
#[must_use]
pub fn s16le(samples: &[f32]) -> Vec<u8> {
    samples
        .iter()
        .flat_map(|&s| f32_to_i16(s).to_le_bytes())
        .collect()
}

/// 16-bit little-endian bytes to samples (a trailing odd byte is ignored).
#[must_use]
pub fn from_s16le(bytes: &[u8]) -> Vec<i16> {
    bytes
        .chunks_exact(2)
        .map(|b| i16::from_le_bytes([b[0], b[1]]))
        .collect()
}

/// Writes mono 16-bit PCM at `rate` as a WAV file.
///
/// # Errors
/// When the file cannot be written.
pub fn save_wav(path: &Path, rate: u32, samples: &[i16]) -> anyhow::Result<()> {
    let bytes = wav_bytes_i16(rate, 1, samples).context("encoding WAV")?;
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

/// Saves the reply audio as [`save_wav`] does and reports it as a `saved` event.
///
/// # Errors
/// As [`save_wav`].
pub fn save_reply(
    path: &Path,
    rate: u32,
    samples: &[i16],
    events: &mut Events,
) -> anyhow::Result<()> {
    save_wav(path, rate, samples)?;
    events.emit(
        "saved",
        json!({"path": path.display().to_string(), "samples": samples.len(), "sample_rate": rate}),
    );
    Ok(())
}

/// Real-time pacing of a stream of equal frames: frame `n` is due `n` frame durations after
/// the start, so sending never drifts however late one wake-up was.
#[derive(Debug, Clone, Copy)]
pub struct Pacing {
    start: Instant,
    frame: Duration,
}

impl Pacing {
    /// Frames of `frame` starting at `start`.
    #[must_use]
    pub fn new(start: Instant, frame: Duration) -> Self {
        Self { start, frame }
    }

    /// When frame `n` is due.
    #[must_use]
    pub fn due(&self, n: u64) -> Instant {
        self.start + self.frame * u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// How late frame `n` goes out at `now` (zero when on time or early).
    #[must_use]
    pub fn lateness(&self, n: u64, now: Instant) -> Duration {
        now.saturating_duration_since(self.due(n))
    }
}

/// Playback of received frames as a device would play them: playback starts with the first
/// frame, each frame lasts `frame`; a frame that arrives after its playback slot is late (the
/// listener hears a gap) and playback resumes from its arrival.
#[derive(Debug, Clone)]
pub struct Playback {
    frame: Duration,
    slack: Duration,
    /// When the next frame would start playing, if playing.
    next_slot: Option<Instant>,
    /// Frames received.
    pub frames: u64,
    /// Frames that arrived after their slot plus the slack.
    pub late: u64,
    /// The largest amount by which a frame was late.
    pub max_late: Duration,
}

impl Playback {
    /// Frames of `frame`, tolerating `slack` of lateness (scheduler jitter).
    #[must_use]
    pub fn new(frame: Duration, slack: Duration) -> Self {
        Self {
            frame,
            slack,
            next_slot: None,
            frames: 0,
            late: 0,
            max_late: Duration::ZERO,
        }
    }

    /// A frame arrived at `now`.
    pub fn frame(&mut self, now: Instant) {
        self.frames += 1;
        let slot = match self.next_slot {
            None => now,
            Some(slot) if now > slot + self.slack => {
                self.late += 1;
                self.max_late = self.max_late.max(now - slot);
                now
            }
            Some(slot) => slot,
        };
        self.next_slot = Some(slot + self.frame);
    }

    /// The stream ended (e.g. `tts stop`): the next frame starts a new playback.
    pub fn stop(&mut self) {
        self.next_slot = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_sizes_follow_rate_and_duration() {
        assert_eq!(frame_samples(16_000, Duration::from_millis(60)), 960);
        assert_eq!(frame_samples(24_000, Duration::from_millis(20)), 480);
        assert_eq!(frame_samples(44_100, Duration::from_millis(10)), 441);
    }

    #[test]
    fn frames_are_padded_and_complete() {
        let s: Vec<f32> = (0..2500).map(|i| i as f32 / 5000.0).collect();
        let f = frames(&s, 960);
        assert_eq!(f.len(), 3);
        assert!(f.iter().all(|f| f.len() == 960));
        assert_eq!(f[2][2500 - 1920 - 1], s[2499]);
        assert_eq!(f[2][959], 0.0);
        assert!(frames(&s, 0).is_empty());
    }

    #[test]
    fn pacing_does_not_drift() {
        let start = Instant::now();
        let p = Pacing::new(start, Duration::from_millis(60));
        assert_eq!(p.due(0), start);
        assert_eq!(p.due(1000), start + Duration::from_secs(60));
        assert_eq!(
            p.lateness(2, start + Duration::from_millis(130)),
            Duration::from_millis(10)
        );
        assert_eq!(
            p.lateness(2, start + Duration::from_millis(100)),
            Duration::ZERO
        );
    }

    #[test]
    fn playback_counts_underruns_only() {
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        let mut p = Playback::new(ms(60), ms(20));
        // A burst of 5 then one per 60 ms: never late.
        for _ in 0..5 {
            p.frame(t0);
        }
        for i in 1..=10u32 {
            p.frame(t0 + ms(60) * i);
        }
        assert_eq!((p.frames, p.late), (15, 0));
        // Buffered until t0 + 900 ms; a frame at +1000 ms is 100 ms late.
        p.frame(t0 + ms(1000));
        assert_eq!(p.late, 1);
        assert_eq!(p.max_late, ms(100));
        // Playback resumed at the late frame: the next, on time, is fine.
        p.frame(t0 + ms(1060));
        assert_eq!(p.late, 1);
        // Within the slack is not late.
        p.frame(t0 + ms(1135));
        assert_eq!(p.late, 1);
        p.stop();
        p.frame(t0 + ms(5000));
        assert_eq!(p.late, 1);
    }

    #[test]
    fn resampling_keeps_duration_and_pcm_round_trips() {
        let tone: Vec<f32> = (0..48_000).map(|i| (i as f32 * 0.05).sin() * 0.5).collect();
        let out = resample(&tone, 48_000, 16_000).unwrap();
        assert_eq!(out.len(), 16_000);
        let energy: f32 = out.iter().map(|s| s * s).sum::<f32>() / out.len() as f32;
        assert!(energy > 0.05, "the tone survives: {energy}");
        let bytes = s16le(&[0.0, 0.5, -1.0]);
        assert_eq!(from_s16le(&bytes), vec![0, 16384, -32768]);
    }
}
