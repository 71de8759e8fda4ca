//! The VIP door's share of the operator's figures (issue 18): a WebRTC session (this crate's
//! client, over loopback UDP) types a turn that makes the demo agent invoke a declared action,
//! then speaks one turn over the audio track, against a server whose recognizer and
//! synthesizer are the in-process fakes with known delays. `/metrics`, parsed with
//! `prometheus-parse` through the server's test support, must show each stage under
//! `door="vip"` with the fakes' delays as lower bounds. voxgate-server's
//! `tests/observability.rs` covers the other doors and `/admin/sessions`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::float_cmp, reason = "counts are small integers, exact in f64")]

mod common;

use std::time::Duration;

use common::support::{Histogram, histogram, scalar, scrape_until};
use common::{Running, scratch, speech_wav};
use prometheus_parse::Scrape;
use voxgate_client::events::Events;
use voxgate_client::webrtc::{WebrtcOptions, run};
use voxgate_server::Config;
use voxgate_server::config::{AsrConfig, TtsConfig};
use voxgate_test_support::fake_providers::{FakeDelays, FakeProviders};

/// The fake recognizer's delay.
const ASR: Duration = Duration::from_millis(100);
/// The fake synthesizer's delay to its first audio byte.
const TTS: Duration = Duration::from_millis(200);
/// The silence the VIP door's VAD waits for before it ends speech (`vad_stop_ms`'s default):
/// the spoken-turn figures count from the last voiced audio, before it.
const VAD_STOP: Duration = Duration::from_millis(200);

fn vip(s: &Scrape, metric: &str) -> Histogram {
    histogram(s, metric, &[("door", "vip")])
}

fn provider(s: &Scrape, kind: &str) -> Histogram {
    histogram(
        s,
        "voxgate_provider_latency_seconds",
        &[("door", "vip"), ("provider", kind)],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vip_session_moves_the_vip_doors_stage_provider_and_action_histograms() {
    let fakes = FakeProviders::start(FakeDelays {
        asr: ASR,
        llm_first_token: Duration::ZERO,
        tts_first_byte: TTS,
    })
    .await
    .unwrap();
    // The demo agent stays the model: it invokes the declared action it hears named.
    let config = Config {
        asr: Some(AsrConfig {
            base_url: Some(fakes.base_url()),
            ..AsrConfig::default()
        }),
        tts: Some(TtsConfig {
            base_url: Some(fakes.base_url()),
            ..TtsConfig::default()
        }),
        ..Config::default()
    };
    let server = Running::start(config).await;
    let dir = scratch("vip-observability");
    let mut opts = WebrtcOptions::new(format!("http://{}", server.addr));
    opts.texts = vec!["switch to dark mode".into()];
    opts.declare_theme = true;
    opts.wav = Some(speech_wav(&dir, 1500));
    opts.timeout = Duration::from_secs(30);
    let mut events = Events::recording();
    let out = run(&opts, &mut events).await.unwrap();
    let s = &out.stats;
    assert!(s.connected && s.error.is_none(), "{s:?}");
    assert!(out.invocations >= 1, "{out:?}");
    assert_eq!(s.first_audio_latency_ms.len(), 1, "{s:?}");

    let after = scrape_until(&server, "the VIP session's figures", |m| {
        vip(m, "voxgate_turn_first_audio_seconds").count >= 1.0
            && scalar(m, "voxgate_sessions_active", &[("door", "vip")]) == 0.0
    })
    .await;
    // The spoken turn: one end-of-speech decision and one wait for the first audio, counted
    // from the last voiced audio (so at least the VAD's silence, and the providers after it).
    let endpointing = vip(&after, "voxgate_turn_endpointing_seconds");
    assert_eq!(endpointing.count, 1.0, "{endpointing:?}");
    assert!(
        (VAD_STOP.as_secs_f64()..1.5).contains(&endpointing.sum),
        "{endpointing:?}"
    );
    let first_audio = vip(&after, "voxgate_turn_first_audio_seconds");
    assert_eq!(first_audio.count, 1.0, "{first_audio:?}");
    let least = (VAD_STOP + ASR + TTS).as_secs_f64();
    assert!(
        first_audio.sum >= least && first_audio.sum < 10.0,
        "{first_audio:?}"
    );
    // The server's own share of the spoken turn, to its first reply audio handed to the
    // WebRTC sender.
    let added = vip(&after, "voxgate_turn_server_added_seconds");
    assert_eq!(added.count, 1.0, "{added:?}");
    assert!(added.sum < 1.0, "{added:?}");
    // Providers: the recognizer once (the spoken turn), the synthesizer per reply sentence,
    // each at least its delay; the in-process model once per reply or follow-up.
    let asr = provider(&after, "asr");
    assert_eq!(asr.count, 1.0, "{asr:?}");
    assert!(asr.sum >= ASR.as_secs_f64(), "{asr:?}");
    let tts = provider(&after, "tts");
    assert!(tts.count >= 2.0, "both replies spoken: {tts:?}");
    assert!(tts.sum >= tts.count * TTS.as_secs_f64(), "{tts:?}");
    assert!(provider(&after, "llm").count >= 2.0);
    // The declared action the client ran: a tool call round trip of kind `action`.
    let action = histogram(
        &after,
        "voxgate_tool_call_seconds",
        &[("door", "vip"), ("kind", "action")],
    );
    assert_eq!(action.count, out.invocations as f64, "{action:?}");
    let ok = [("door", "vip"), ("kind", "action"), ("outcome", "ok")];
    assert_eq!(
        scalar(&after, "voxgate_tool_calls_total", &ok),
        out.invocations as f64
    );
    assert_eq!(
        scalar(&after, "voxgate_sessions_total", &[("door", "vip")]),
        1.0
    );
    // Nothing counted under another door.
    assert_eq!(
        histogram(
            &after,
            "voxgate_turn_first_audio_seconds",
            &[("door", "xiaozhi")]
        )
        .count,
        0.0
    );
    server.stop().await;
}
