//! Recognition with the installed Whisper model (`cargo xtask offline` installs it and runs
//! these; ignored in `cargo test --workspace`, which needs no model).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::cast_precision_loss)]

mod support;

use std::sync::{Arc, Barrier};

use voxgate_local_speech::{LocalWhisper, WhisperConfig, WorkerPool, wer};
use voxgate_providers::{Asr, ProviderError, Utterance};

/// The highest word error rate accepted over the test sentences. Measured: 0 errors in 64
/// words with tiny.en on espeak-ng's voice (release and debug builds alike); the margin allows
/// a different espeak-ng version's pronunciation.
const MAX_WER: f64 = 0.10;

fn load(workers: usize, queue: usize) -> LocalWhisper {
    let pool = WorkerPool::new("test-whisper", workers, queue).unwrap();
    LocalWhisper::load(WhisperConfig::new(support::whisper_dir()), pool).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the Whisper model: cargo xtask offline"]
async fn recognizes_spoken_sentences_under_the_error_rate() {
    let whisper = load(1, 8);
    let (mut errors, mut words) = (0, 0);
    for sentence in support::SENTENCES {
        let pcm = support::speak(sentence);
        let t = whisper
            .transcribe(Utterance {
                pcm,
                language: None,
            })
            .await
            .unwrap();
        let (e, n) = wer::word_errors(sentence, &t.text);
        println!("{e}/{n}\t{sentence}\t→ {}", t.text);
        errors += e;
        words += n;
        assert_eq!(t.language.as_deref(), Some("en"));
    }
    let rate = errors as f64 / words as f64;
    println!("word error rate {rate:.3} ({errors}/{words})");
    assert!(rate <= MAX_WER, "word error rate {rate:.3} above {MAX_WER}");
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the Whisper model: cargo xtask offline"]
async fn silence_is_no_speech_not_a_hallucination() {
    let whisper = load(1, 1);
    for pcm in [vec![0i16; 32_000], Vec::new()] {
        let t = whisper
            .transcribe(Utterance {
                pcm,
                language: None,
            })
            .await
            .unwrap();
        assert_eq!(t.text, "", "silence transcribed as {:?}", t.text);
    }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the Whisper model: cargo xtask offline"]
async fn a_full_pool_refuses_at_once_with_busy_and_recovers() {
    let whisper = load(1, 0);
    let pcm = support::speak("Set a timer for ten minutes.");
    // Hold the only worker until the refused request has been answered.
    let gate = Arc::new(Barrier::new(2));
    let held = {
        let pool = whisper.pool().clone();
        let gate = Arc::clone(&gate);
        tokio::spawn(async move { pool.run(move || gate.wait()).await })
    };
    while whisper.pool().stats().in_flight == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    let started = std::time::Instant::now();
    let refused = whisper
        .transcribe(Utterance {
            pcm: pcm.clone(),
            language: None,
        })
        .await;
    assert!(
        matches!(&refused, Err(ProviderError::Busy(m)) if m.contains("test-whisper")),
        "{refused:?}"
    );
    assert!(started.elapsed() < std::time::Duration::from_millis(100));
    gate.wait();
    held.await.unwrap().unwrap();
    let t = whisper
        .transcribe(Utterance {
            pcm,
            language: None,
        })
        .await
        .unwrap();
    assert_eq!(
        wer::word_error_rate("Set a timer for ten minutes.", &t.text),
        0.0,
        "{}",
        t.text
    );
    assert_eq!(whisper.pool().stats().refused, 1);
}
