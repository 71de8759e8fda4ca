//! Speculative generation on the Xiaozhi door, over real sockets: a device streams
//! `question.wav` ("Hello.", a 128 ms pause the VAD sees, then the question) as real-time
//! 60 ms Opus packets to a server whose ASR, LLM and TTS are the in-process OpenAI-compatible
//! fakes, with a recognizer that hears short audio as "Hello." (and a model that answers that
//! with another sentence). The pause starts speculation, which is cancelled when the user goes
//! on; the turn is answered for the whole question, and the fakes saw the cancellations.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use support::{Running, opus_device, opus_packets, question, stream_opus, until_tts_stop};
use voxgate_server::Config;
use voxgate_server::config::{AsrConfig, LlmConfig, TtsConfig};
use voxgate_server::metrics::Door;
use voxgate_test_support::fake_providers::{
    FakeDelays, FakeOptions, FakeProviders, SHORT_REPLY, SHORT_TRANSCRIPT, TRANSCRIPT,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_mid_question_is_speculated_on_cancelled_and_the_question_answered() {
    // A recognizer slow enough that it is still working on "Hello." when the user goes on
    // (the pause lasts 128 ms, the speculation starts 64 ms into it).
    let fakes = FakeProviders::start_with(FakeOptions {
        delays: FakeDelays {
            asr: Duration::from_millis(300),
            llm_first_token: Duration::from_millis(100),
            tts_first_byte: Duration::from_millis(50),
        },
        // "Hello." with its backbuffer is under a second; the whole question over 1.5 s.
        short_below: Some(Duration::from_millis(1_200)),
    })
    .await
    .unwrap();
    let base = fakes.base_url();
    let mut config = Config::from_toml("[xiaozhi.engine]\nspeculate = true\n").unwrap();
    config.asr = Some(AsrConfig {
        base_url: Some(base.clone()),
        ..AsrConfig::default()
    });
    config.llm = Some(LlmConfig {
        base_url: Some(base.clone()),
        ..LlmConfig::default()
    });
    config.tts = Some(TtsConfig {
        base_url: Some(base),
        ..TtsConfig::default()
    });
    let server = Running::start(config).await;
    let (mut ws, codec) = opus_device(server.addr, "auto").await;
    // Real time: one 60 ms packet every 60 ms, then 1.2 s of silence.
    stream_opus(&mut ws, &codec, &opus_packets(&question(), 1_200)).await;
    let (events, audio) = until_tts_stop(&mut ws).await;
    let said: Vec<&str> = events
        .iter()
        .filter(|v| v["type"] == "stt")
        .filter_map(|v| v["text"].as_str())
        .collect();
    assert_eq!(said, [TRANSCRIPT], "{events:#?}");
    let sentences: Vec<&str> = events
        .iter()
        .filter(|v| v["type"] == "tts" && v["state"] == "sentence_start")
        .filter_map(|v| v["text"].as_str())
        .collect();
    assert_eq!(
        sentences,
        ["It will be sunny tomorrow with a light breeze."],
        "{events:#?}"
    );
    assert!(!format!("{events:?}").contains(SHORT_REPLY));
    assert!(!format!("{events:?}").contains(&format!("\"{SHORT_TRANSCRIPT}\"")));
    assert!(audio > 0);
    // The speculation at "Hello." was cancelled at the recognizer; the one at the end of the
    // question became the reply (one recognition, generation and synthesis for it).
    let mut counts = fakes.counts();
    for _ in 0..50 {
        if counts.asr_cancelled > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        counts = fakes.counts();
    }
    assert!(counts.asr_cancelled >= 1, "{counts:?}");
    assert_eq!((counts.llm, counts.tts), (1, 1), "{counts:?}");
    assert_eq!(counts.bad_requests, 0);
    // The pause's speculation was discarded, the end's adopted (at least its recognition:
    // with a recognizer slower than the VAD's stop plus the endpoint delay the turn ends as
    // its transcript arrives, and the real generation goes out at once).
    let m = &server.metrics;
    let started = m.speculations(Door::Xiaozhi, 0);
    let adopted = m.speculations(Door::Xiaozhi, 1);
    let discarded = m.speculations(Door::Xiaozhi, 2);
    assert!(
        started >= 2 && adopted == 1 && discarded == started - 1,
        "{started} {adopted} {discarded}"
    );
    let text = m.render();
    assert!(
        text.lines()
            .any(|l| l == "voxgate_speculations_total{door=\"xiaozhi\",outcome=\"adopted\"} 1"),
        "{text}"
    );
    assert!(text.lines().any(|l| l.starts_with(
        "voxgate_speculative_requests_total{door=\"xiaozhi\",outcome=\"cancelled\"} "
    ) && !l.ends_with(" 0")));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speculation_is_off_by_default() {
    let fakes = FakeProviders::start_with(FakeOptions {
        delays: FakeDelays::default(),
        short_below: Some(Duration::from_millis(1_200)),
    })
    .await
    .unwrap();
    let config = support::with_fakes(&fakes.base_url());
    let server = Running::start(config).await;
    let (mut ws, codec) = opus_device(server.addr, "auto").await;
    stream_opus(&mut ws, &codec, &opus_packets(&question(), 1_200)).await;
    let (events, _) = until_tts_stop(&mut ws).await;
    assert!(
        events
            .iter()
            .any(|v| v["type"] == "stt" && v["text"] == TRANSCRIPT)
    );
    let counts = fakes.counts();
    assert_eq!((counts.asr, counts.asr_cancelled), (1, 0), "{counts:?}");
    assert_eq!(server.metrics.speculations(Door::Xiaozhi, 0), 0);
    server.stop().await;
}
