//! Figures of the local speech models: load time, memory, real-time factor and word error
//! rate of recognition (trimmed and full 30-second window) on sentences spoken by espeak-ng,
//! the cost of phonemizing a sentence with espeak-ng's library and with its program, and the
//! Piper voice. `cargo xtask offline` runs it on the models it installs:
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

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Instant;

use voxgate_local_speech::{
    LocalWhisper, ModelDir, PiperConfig, PiperTts, WhisperConfig, WorkerPool, wer,
};

// The tests' sentences and their espeak-ng speaker, so the figures and the accuracy test
// measure the same thing.
#[path = "../tests/support/mod.rs"]
mod support;

use support::{SENTENCES, speak, to_16k};

/// Resident memory of this process in MB (Linux).
fn rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Milliseconds per sentence of espeak-ng's library in process and of its program (one run per
/// sentence, as the voice runs it), on `sentences` phonemized `rounds` times.
fn phonemizers(library: Option<&std::path::Path>, sentences: &[&str], rounds: usize) {
    let per = |elapsed: std::time::Duration| {
        elapsed.as_secs_f64() * 1e3 / (rounds * sentences.len()) as f64
    };
    if let Some(library) = library {
        let data = voxgate_espeak::data_beside(library);
        let espeak = voxgate_espeak::Espeak::load(library, data.as_deref()).unwrap();
        espeak.phonemize("en-us", sentences[0]).unwrap();
        let started = Instant::now();
        for _ in 0..rounds {
            for s in sentences {
                espeak.phonemize("en-us", s).unwrap();
            }
        }
        println!(
            "phonemizer: espeak-ng {} library, in process: {:.2} ms per sentence",
            espeak.version(),
            per(started.elapsed())
        );
    }
    let run = |text: &str| {
        let mut child = Command::new("espeak-ng")
            .args(["-q", "--ipa", "-v", "en-us", "--stdin"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(text.as_bytes())?;
        child.wait_with_output().map(|_| ())
    };
    if run(sentences[0]).is_err() {
        println!("phonemizer: no espeak-ng program on PATH to compare with");
        return;
    }
    let started = Instant::now();
    for _ in 0..rounds {
        for s in sentences {
            run(s).unwrap();
        }
    }
    println!(
        "phonemizer: espeak-ng program, one run per sentence: {:.2} ms per sentence",
        per(started.elapsed())
    );
}

fn main() {
    let found = ModelDir::from_env().find();
    phonemizers(found.espeak.as_deref(), &SENTENCES, 10);
    let phonemizer = found.phonemizer();
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
        let mut config = PiperConfig::new(voice.clone(), lib);
        config.phonemizer = phonemizer;
        println!("piper phonemizer: {}", config.phonemizer);
        let piper = PiperTts::new(config, WorkerPool::new("bench-tts", 1, 0).unwrap()).unwrap();
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
