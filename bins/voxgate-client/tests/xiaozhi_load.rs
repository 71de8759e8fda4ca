//! The Xiaozhi load generator against the real server in-process, whose ASR, LLM and TTS are
//! the zero-delay OpenAI-compatible fakes: every burst (the built-in question, then silence)
//! goes through a real recognition → completion → synthesis turn and is answered after the
//! end of speech, never cut, never left unanswered.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::Running;
use voxgate_client::load::{LoadOptions, run};
use voxgate_test_support::fake_providers::{FakeDelays, FakeProviders};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_devices_get_every_question_answered_after_it_ends() {
    let fakes = FakeProviders::start(FakeDelays::default()).await.unwrap();
    let config = common::support::with_fakes(&fakes.base_url());
    let server = Running::start(config).await;
    let mut opts = LoadOptions::new(format!("ws://{}/xiaozhi/v1/", server.addr), 3, 2);
    opts.ramp = Duration::from_millis(300);
    opts.answer_timeout = Duration::from_secs(5);
    let s = run(&opts).await.unwrap();
    eprintln!("{}", serde_json::to_string(&s).unwrap());
    assert_eq!(s.connected, 3, "{s:?}");
    assert!(s.errors.is_empty(), "{s:?}");
    // Each session's first burst started within the 2 s and was answered; the runtime is
    // shared with the server, so no figure is checked but that they exist and are ordered.
    assert!(s.bursts >= 3, "{s:?}");
    assert_eq!(
        (s.cut, s.unanswered, s.unfinished, s.lost),
        (0, 0, 0, 0),
        "{s:?}"
    );
    assert_eq!(s.answered, s.bursts, "{s:?}");
    assert_eq!(s.turns_done_percent, 100.0);
    assert!(s.min_turns >= 1, "{s:?}");
    assert!(s.reply_frames > 0);
    let to_start = s.tts_start_latency_ms_p50.unwrap();
    let to_audio = s.first_audio_latency_ms_p50.unwrap();
    assert!(to_start > 0.0 && to_audio >= to_start, "{s:?}");
    assert!(s.tts_start_latency_ms_max >= s.tts_start_latency_ms_p99);
    assert!(s.client_cpu_seconds >= 0.0 && s.wall_seconds > 2.0);
    let counts = fakes.counts();
    assert_eq!(counts.bad_requests, 0);
    assert!(
        counts.asr >= s.bursts && counts.tts >= s.bursts,
        "{counts:?}"
    );
    server.stop().await;
}
