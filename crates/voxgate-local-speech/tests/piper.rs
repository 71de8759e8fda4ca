//! Piper synthesis with a real voice and ONNX Runtime.
//!
//! Ignored by default: they need a Piper voice, the ONNX Runtime library and espeak-ng's
//! library, which `cargo xtask offline` installs (under `target/models`, named by
//! `VOXGATE_MODELS_DIR`) before running them (without espeak-ng's library, the `espeak-ng`
//! program on `PATH` phonemizes).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may unwrap and panic

use std::path::PathBuf;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use futures::StreamExt;
use voxgate_local_speech::{Phonemizer, PiperConfig, PiperTts, WorkerPool};
use voxgate_providers::{PcmChunk, ProviderError, Tts, TtsRequest, TtsResult};

mod support;

/// The installed voice with the installed phonemizer: espeak-ng's library when it is there.
fn config() -> PiperConfig {
    let m = support::models();
    let mut config = PiperConfig::new(
        m.piper_voice.clone().expect("checked by models()"),
        m.onnxruntime.clone().expect("checked by models()"),
    );
    config.phonemizer = m.phonemizer();
    config
}

fn voice(workers: usize, queue: usize) -> (PiperTts, WorkerPool) {
    let pool = WorkerPool::new("piper-test", workers, queue).unwrap();
    let tts = PiperTts::new(config(), pool.clone()).unwrap();
    (tts, pool)
}

fn request(text: &str) -> TtsRequest {
    TtsRequest {
        text: text.to_owned(),
        ..TtsRequest::default()
    }
}

fn rms(samples: &[i16]) -> f64 {
    let sum: f64 = samples.iter().map(|&s| f64::from(s).powi(2)).sum();
    (sum / samples.len().max(1) as f64).sqrt()
}

fn seconds(chunk: &PcmChunk) -> f64 {
    chunk.samples.len() as f64 / f64::from(chunk.sample_rate)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Piper voice and ONNX Runtime: cargo xtask offline"]
async fn synthesizes_a_sentence_as_speech() {
    let (tts, _pool) = voice(1, 1);
    assert_eq!(tts.sample_rate(), 22_050);
    let items: Vec<TtsResult> = tts
        .synthesize(request("Hello, how are you today?"))
        .collect()
        .await;
    assert_eq!(items.len(), 1, "one sentence, one chunk: {items:?}");
    let chunk = items.into_iter().next().unwrap().unwrap();
    assert_eq!(chunk.sample_rate, 22_050);
    let secs = seconds(&chunk);
    assert!((1.0..=3.5).contains(&secs), "{secs} s");
    let rms = rms(&chunk.samples);
    assert!(rms > 500.0, "too quiet to be speech: RMS {rms}");
    let peak = chunk
        .samples
        .iter()
        .map(|s| i32::from(*s).abs())
        .max()
        .unwrap();
    assert!(peak <= 32767, "{peak}");

    // The blocking entry point produces the same kind of audio.
    let blocking = tts
        .synthesize_blocking("Hello, how are you today?")
        .unwrap();
    assert_eq!(blocking.sample_rate, 22_050);
    assert!((1.0..=3.5).contains(&seconds(&blocking)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Piper voice and ONNX Runtime: cargo xtask offline"]
async fn long_text_streams_one_chunk_per_sentence() {
    let (tts, _pool) = voice(2, 2);
    let short = tts.synthesize_blocking("Yes.").unwrap();
    let items: Vec<TtsResult> = tts
        .synthesize(request(
            "Yes. The weather today is sunny with a light breeze from the west.",
        ))
        .collect()
        .await;
    let chunks: Vec<PcmChunk> = items.into_iter().map(Result::unwrap).collect();
    assert_eq!(chunks.len(), 2);
    // In order: the one-word sentence first, then the long one.
    assert!(
        seconds(&chunks[0]) < seconds(&chunks[1]),
        "{} s then {} s",
        seconds(&chunks[0]),
        seconds(&chunks[1])
    );
    assert!((seconds(&chunks[0]) - seconds(&short)).abs() < 0.3);
    assert!(chunks.iter().all(|c| rms(&c.samples) > 300.0));

    for text in ["", "   \n ", "..."] {
        let items: Vec<TtsResult> = tts.synthesize(request(text)).collect().await;
        assert!(items.is_empty(), "{text:?}: {items:?}");
    }
    assert!(tts.synthesize_blocking("").unwrap().samples.is_empty());
}

#[test]
#[ignore = "needs the Piper voice and ONNX Runtime: cargo xtask offline"]
fn bad_files_are_errors_not_panics() {
    let pool = WorkerPool::new("piper-test", 1, 0).unwrap();

    let missing = PathBuf::from("/nonexistent/voxgate/en_US-nobody-medium.onnx");
    let mut cfg = config();
    cfg.model = missing.clone();
    let err = PiperTts::new(cfg, pool.clone()).unwrap_err();
    assert!(
        matches!(&err, ProviderError::Config(m) if m.contains(missing.to_str().unwrap())),
        "{err:?}"
    );

    // A model with its config in place but no model file.
    let mut cfg = config();
    let json = PathBuf::from(format!("{}.json", cfg.model.display()));
    cfg.config = Some(json.clone());
    cfg.model = missing.clone();
    let err = PiperTts::new(cfg, pool.clone()).unwrap_err();
    assert!(
        matches!(&err, ProviderError::Config(m) if m.contains(missing.to_str().unwrap())),
        "{err:?}"
    );

    let mut cfg = config();
    cfg.onnxruntime = PathBuf::from("/nonexistent/libonnxruntime.so.1");
    let err = PiperTts::new(cfg, pool.clone()).unwrap_err();
    assert!(
        matches!(&err, ProviderError::Config(m) if m.contains("/nonexistent/libonnxruntime.so.1")),
        "{err:?}"
    );

    // A file that is not a shared library: refused by the loader, or because the process
    // already loaded another ONNX Runtime. Either way an error.
    let mut cfg = config();
    cfg.onnxruntime = json;
    let err = PiperTts::new(cfg, pool.clone()).unwrap_err();
    assert!(
        matches!(err, ProviderError::Local(_) | ProviderError::Config(_)),
        "{err:?}"
    );

    let mut cfg = config();
    cfg.speaker = Some(7);
    let err = PiperTts::new(cfg, pool.clone()).unwrap_err();
    assert!(matches!(err, ProviderError::Config(_)), "{err:?}");

    let mut cfg = config();
    cfg.phonemizer = Phonemizer::Program("voxgate-no-such-espeak".to_owned());
    let err = PiperTts::new(cfg, pool.clone()).unwrap_err();
    assert!(matches!(err, ProviderError::Command(_)), "{err:?}");

    let mut cfg = config();
    cfg.phonemizer = Phonemizer::Library("/nonexistent/voxgate/libespeak-ng.so.1".into());
    let err = PiperTts::new(cfg, pool).unwrap_err();
    assert!(
        matches!(&err, ProviderError::Config(m) if m.contains("/nonexistent/voxgate/libespeak-ng.so.1")),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Piper voice and ONNX Runtime: cargo xtask offline"]
async fn a_full_pool_refuses_with_busy() {
    let (tts, pool) = voice(1, 0);
    // Hold the only worker so the first request to reach the pool is refused.
    let gate = Arc::new(Barrier::new(2));
    let holder = tokio::spawn({
        let pool = pool.clone();
        let gate = Arc::clone(&gate);
        async move { pool.run(move || gate.wait()).await }
    });
    while pool.stats().in_flight < 1 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let first = tts.synthesize(request("Hello there. How are you?"));
    let second = tts.synthesize(request("Good morning."));

    let refused: Vec<TtsResult> = first.collect().await;
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(
        matches!(&refused[0], Err(ProviderError::Busy(_))),
        "{refused:?}"
    );
    assert!(refused[0].as_ref().unwrap_err().is_transient());

    gate.wait();
    holder.await.unwrap().unwrap();
    let served: Vec<TtsResult> = second.collect().await;
    assert_eq!(served.len(), 1);
    assert!(!served[0].as_ref().unwrap().samples.is_empty());
    assert_eq!(pool.stats().refused, 1);
}
