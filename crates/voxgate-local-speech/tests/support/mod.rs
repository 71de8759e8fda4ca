//! Shared by the model tests: the installed models and spoken test sentences made by
//! espeak-ng at test time.

#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation
)]

use std::path::PathBuf;
use std::process::Command;

use voxgate_audio::resample::Resampler;
use voxgate_audio::wav::read_wav;
use voxgate_local_speech::{InstalledModels, ModelDir};

/// Sentences a voice assistant hears, with the words each should be recognized as.
pub const SENTENCES: [&str; 8] = [
    "What is the weather like in Paris today?",
    "Please turn on the lights in the kitchen.",
    "Set a timer for ten minutes.",
    "Tell me a joke about computers.",
    "How far is the moon from the earth?",
    "I would like to order a large pizza with mushrooms.",
    "Can you remind me to call my mother tomorrow morning?",
    "Play some relaxing music in the living room.",
];

/// The models `cargo xtask offline` installed (`VOXGATE_MODELS_DIR`); panics with the way to
/// get them when they are missing, since these tests are run on purpose.
pub fn models() -> InstalledModels {
    let dir = ModelDir::from_env();
    let found = dir.find();
    assert!(
        found.has_asr() && found.has_tts(),
        "no models in {} (VOXGATE_MODELS_DIR): run `cargo xtask offline` or `cargo xtask models`",
        dir.path().display()
    );
    found
}

/// The Whisper model directory.
pub fn whisper_dir() -> PathBuf {
    models().whisper.expect("checked by models()")
}

/// `pcm` at `rate` as 16 kHz.
pub fn to_16k(pcm: &[f32], rate: u32) -> Vec<i16> {
    let mut out = Vec::new();
    if rate == 16_000 {
        out.extend_from_slice(pcm);
    } else {
        let mut r = Resampler::new(rate, 16_000).unwrap();
        r.process(pcm, &mut out);
        r.flush(&mut out);
    }
    out.iter()
        .map(|s| (s * 32_767.0).clamp(-32_768.0, 32_767.0) as i16)
        .collect()
}

/// `text` spoken by espeak-ng (US English, 160 words a minute), as 16 kHz mono PCM.
pub fn speak(text: &str) -> Vec<i16> {
    // A file rather than --stdout: espeak-ng streams a WAV header without sizes.
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("voxgate-speak-{}-{n}.wav", std::process::id()));
    let status = Command::new("espeak-ng")
        .args(["-v", "en-us", "-s", "160", "-w"])
        .arg(&path)
        .arg(text)
        .status()
        .expect("espeak-ng runs (Debian package espeak-ng; `cargo xtask offline` installs it)");
    assert!(status.success(), "espeak-ng failed");
    let bytes = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let wav = read_wav(&bytes).unwrap();
    to_16k(&wav.to_mono(), wav.sample_rate)
}
