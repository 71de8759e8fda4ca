//! Audio for voice agents without I/O: sample formats, streaming resampling, Opus, VAD, WAV and playback pacing.

pub mod format;
pub mod opus;
pub mod pacer;
pub mod resample;
pub mod vad;
pub mod wav;
