//! Helpers shared by the end-to-end tests: a real server in-process, a short speech WAV.
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};

// The server's own test scaffolding (a server on free loopback ports until stopped, and more),
// shared rather than copied.
#[path = "../../../../crates/voxgate-server/tests/support/mod.rs"]
pub mod support;

pub use support::Running;

/// A fresh scratch directory under the target dir.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("voxgate-client-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The first `millis` ms of the audio crate's speech fixture (16 kHz mono) as a WAV in `dir`.
pub fn speech_wav(dir: &Path, millis: usize) -> PathBuf {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../crates/voxgate-audio/tests/fixtures/speech.wav");
    let wav = voxgate_audio::wav::read_wav(&std::fs::read(fixture).unwrap()).unwrap();
    let n = wav.sample_rate as usize * millis / 1000;
    let samples: Vec<i16> = wav.to_mono_i16().into_iter().take(n).collect();
    let path = dir.join("speech.wav");
    std::fs::write(
        &path,
        voxgate_audio::wav::wav_bytes_i16(wav.sample_rate, 1, &samples).unwrap(),
    )
    .unwrap();
    path
}
