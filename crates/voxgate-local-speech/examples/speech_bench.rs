//! Figures of the local speech models: load time, memory, real-time factor and word error
//! rate of recognition (trimmed and full 30-second window) on sentences spoken by espeak-ng,
//! and of the Piper voice. `cargo xtask offline` runs it on the models it installs:
//!
//! ```text
//! VOXGATE_MODELS_DIR=target/models cargo run --release -p voxgate-local-speech --example speech_bench
//! ```

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation
)]

use std::process::Command;
use std::time::Instant;

use voxgate_audio::resample::Resampler;
use voxgate_audio::wav::read_wav;
use voxgate_local_speech::{
    LocalWhisper, ModelDir, PiperConfig, PiperTts, WhisperConfig, WorkerPool, wer,
};

const SENTENCES: [&str; 8] = [
    "What is the weather like in Paris today?",
    "Please turn on the lights in the kitchen.",
    "Set a timer for ten minutes.",
    "Tell me a joke about computers.",
    "How far is the moon from the earth?",
    "I would like to order a large pizza with mushrooms.",
    "Can you remind me to call my mother tomorrow morning?",
    "Play some relaxing music in the living room.",
];

/// Resident memory of this process in MB (Linux).
fn rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn to_16k(pcm: &[f32], rate: u32) -> Vec<i16> {
    let mut out = Vec::new();
    let mut r = Resampler::new(rate, 16_000).unwrap();
    r.process(pcm, &mut out);
    r.flush(&mut out);
    out.iter()
        .map(|s| (s * 32_767.0).clamp(-32_768.0, 32_767.0) as i16)
        .collect()
}

fn speak(text: &str) -> Vec<i16> {
    // A file rather than --stdout: espeak-ng streams a WAV header without sizes.
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("voxgate-speak-{}-{n}.wav", std::process::id()));
    let status = Command::new("espeak-ng")
        .args(["-v", "en-us", "-s", "160", "-w"])
        .arg(&path)
        .arg(text)
        .status()
        .expect("espeak-ng (Debian package espeak-ng)");
    assert!(status.success(), "espeak-ng failed");
    let bytes = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let wav = read_wav(&bytes).unwrap();
    to_16k(&wav.to_mono(), wav.sample_rate)
}

fn main() {
    let found = ModelDir::from_env().find();
    let whisper_dir = found
        .whisper
        .clone()
        .expect("no Whisper model: set VOXGATE_MODELS_DIR or run `cargo xtask models`");
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    println!("machine: {threads} cores; model {}", whisper_dir.display());

    let spoken: Vec<(&str, Vec<i16>)> = SENTENCES.iter().map(|s| (*s, speak(s))).collect();
    let audio_secs: f64 = spoken.iter().map(|(_, p)| p.len() as f64 / 16_000.0).sum();

    let rss0 = rss_mb();
    let started = Instant::now();
    let mut cfg = WhisperConfig::new(whisper_dir);
    let whisper = LocalWhisper::load(cfg.clone(), WorkerPool::new("bench", 1, 0).unwrap()).unwrap();
    let load = started.elapsed();
    let rss1 = rss_mb();
    println!(
        "whisper load {:.0} ms, +{:.0} MB resident",
        load.as_secs_f64() * 1e3,
        rss1 - rss0
    );
    // Warm-up (first-use allocations), not counted.
    whisper.transcribe_blocking(&spoken[0].1, None).unwrap();
    println!(
        "| window | audio s | CPU wall s | real-time factor | words wrong | WER | peak RSS MB |"
    );
    println!("|---|---|---|---|---|---|---|");
    for full in [false, true] {
        cfg.full_window = full;
        let w = LocalWhisper::load(cfg.clone(), WorkerPool::new("bench", 1, 0).unwrap()).unwrap();
        let (mut errors, mut words) = (0, 0);
        let started = Instant::now();
        for (text, pcm) in &spoken {
            let heard = w.transcribe_blocking(pcm, None).unwrap();
            let (e, n) = wer::word_errors(text, &heard);
            if e > 0 {
                eprintln!("  {text} → {heard}");
            }
            errors += e;
            words += n;
        }
        let secs = started.elapsed().as_secs_f64();
        println!(
            "| {} | {audio_secs:.1} | {secs:.2} | {:.3} | {errors}/{words} | {:.3} | {:.0} |",
            if full {
                "full 30 s"
            } else {
                "trimmed (default)"
            },
            secs / audio_secs,
            errors as f64 / words as f64,
            rss_mb()
        );
    }

    if let (Some(voice), Some(lib)) = (found.piper_voice, found.onnxruntime) {
        let rss0 = rss_mb();
        let started = Instant::now();
        let piper = PiperTts::new(
            PiperConfig::new(voice.clone(), lib),
            WorkerPool::new("bench-tts", 1, 0).unwrap(),
        )
        .unwrap();
        let load = started.elapsed();
        println!(
            "piper {} load {:.0} ms, +{:.0} MB resident",
            voice.display(),
            load.as_secs_f64() * 1e3,
            rss_mb() - rss0
        );
        piper.synthesize_blocking(SENTENCES[0]).unwrap();
        let (mut synth, mut audio) = (0.0, 0.0);
        let (mut errors, mut words) = (0, 0);
        for text in SENTENCES {
            let started = Instant::now();
            let pcm = piper.synthesize_blocking(text).unwrap();
            synth += started.elapsed().as_secs_f64();
            audio += pcm.samples.len() as f64 / f64::from(pcm.sample_rate);
            // The voice, heard by the recognizer: a check that it speaks the words.
            let f: Vec<f32> = pcm
                .samples
                .iter()
                .map(|s| f32::from(*s) / 32_768.0)
                .collect();
            let heard = whisper
                .transcribe_blocking(&to_16k(&f, pcm.sample_rate), None)
                .unwrap();
            let (e, n) = wer::word_errors(text, &heard);
            errors += e;
            words += n;
        }
        println!(
            "piper: {audio:.1} s of speech in {synth:.2} s, real-time factor {:.3}; \
             recognized back with WER {:.3} ({errors}/{words}); RSS {:.0} MB",
            synth / audio,
            errors as f64 / words as f64,
            rss_mb()
        );
    }
}
