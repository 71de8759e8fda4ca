//! The WebRTC client against the server's VIP browser door (demo agent, embedded TTS),
//! in-process, over loopback UDP.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{Running, scratch, speech_wav};
use serde_json::Value;
use voxgate_client::events::Events;
use voxgate_client::webrtc::load::{WebrtcLoadOptions, run as run_load};
use voxgate_client::webrtc::{WebrtcOptions, run};
use voxgate_server::Config;

/// The `type`s of the data channel messages received, in order.
fn received(events: &Events) -> Vec<String> {
    events
        .named("recv")
        .filter_map(|e| e["message"]["type"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn a_spoken_turn_gets_a_spoken_reply_and_the_vip_events() {
    let server = Running::start(Config::default()).await;
    let dir = scratch("webrtc-speech");
    let reply = dir.join("reply.wav");
    let mut opts = WebrtcOptions::new(format!("http://{}", server.addr));
    opts.wav = Some(speech_wav(&dir, 1500));
    opts.save_reply = Some(reply.clone());
    opts.timeout = Duration::from_secs(30);
    let mut events = Events::recording();
    let out = run(&opts, &mut events).await.unwrap();
    let kinds = received(&events);
    for kind in [
        "session.connected",
        "state",
        "transcript.user",
        "reply.text",
        "reply.done",
        "turn.latency",
    ] {
        assert!(kinds.iter().any(|k| k == kind), "no {kind}: {kinds:?}");
    }
    assert!(out.session_id.is_some());
    let s = &out.stats;
    assert!(s.connected && s.error.is_none(), "{s:?}");
    assert_eq!(s.turns, 1, "{kinds:?}");
    assert!(s.frames_sent >= 75, "{s:?}");
    assert!(s.packets_received > 10, "{s:?}");
    assert_eq!(s.first_audio_latency_ms.len(), 1, "{s:?}");
    assert!(
        (0.3..30.0).contains(&s.reply_audio_seconds),
        "plausible reply length: {s:?}"
    );
    // The saved reply is the decoded track: 48 kHz, as long as the packets say, not silent.
    let saved = voxgate_audio::wav::read_wav(&std::fs::read(&reply).unwrap()).unwrap();
    assert_eq!(saved.sample_rate, 48_000);
    let pcm = saved.to_mono_i16();
    assert_eq!(pcm.len(), out.audio.len());
    let seconds = pcm.len() as f64 / 48_000.0;
    assert!(
        (seconds - s.reply_audio_seconds).abs() < 0.1,
        "{seconds} vs {s:?}"
    );
    let peak = pcm.iter().map(|x| x.unsigned_abs()).max().unwrap_or(0);
    assert!(peak > 1000, "the reply is not silence (peak {peak})");
    assert!(!out.user_transcripts.is_empty() && !out.reply_texts.is_empty());
    // The stats event closes the run, and no audio is printed inline.
    let stats: Vec<&Value> = events.named("stats").collect();
    assert_eq!(stats.len(), 1);
    assert_eq!(stats[0]["turns"], 1);
    assert!(
        events
            .recorded()
            .iter()
            .all(|e| e.to_string().len() < 20_000)
    );
    server.stop().await;
}

#[tokio::test]
async fn a_text_turn_and_a_declared_action() {
    let server = Running::start(Config::default()).await;
    let mut opts = WebrtcOptions::new(format!("http://{}/", server.addr));
    opts.texts = vec!["hello there".into(), "switch to dark mode".into()];
    opts.declare_theme = true;
    opts.timeout = Duration::from_secs(30);
    let mut events = Events::recording();
    let out = run(&opts, &mut events).await.unwrap();
    let kinds = received(&events);
    assert_eq!(out.stats.turns, 2, "{kinds:?}");
    assert!(
        out.reply_texts.iter().any(|t| t.contains("hello there")),
        "{:?}",
        out.reply_texts
    );
    let sent: Vec<String> = events
        .named("sent")
        .filter_map(|e| e["message"]["type"].as_str().map(str::to_owned))
        .filter(|t| t != "offer")
        .collect();
    assert_eq!(sent.first().map(String::as_str), Some("actions.declare"));
    assert!(
        sent.iter().filter(|t| *t == "input.text").count() == 2,
        "{sent:?}"
    );
    assert!(sent.iter().any(|t| t == "session.end"), "{sent:?}");
    // The demo agent calls a declared tool it hears named ("dark mode"); the client runs it.
    let invoked = kinds.iter().filter(|k| *k == "action.invoke").count();
    assert!(invoked >= 1, "{kinds:?}");
    assert_eq!(out.invocations, invoked as u64, "{kinds:?}");
    let results: Vec<&Value> = events
        .named("sent")
        .filter(|e| e["message"]["type"] == "action.result")
        .collect();
    assert_eq!(results.len(), invoked);
    assert_eq!(results[0]["message"]["status"], "success", "{results:?}");
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_load_run_has_no_failures() {
    // `Running` turns the overload guard off: server and clients share this test's threads.
    let server = Running::start(Config::default()).await;
    let dir = scratch("webrtc-load");
    let opts = WebrtcLoadOptions {
        url: format!("http://{}", server.addr),
        sessions: 5,
        turns: 1,
        wav: speech_wav(&dir, 1500),
        ramp: Duration::from_millis(500),
        timeout: Duration::from_secs(40),
        bind: std::net::IpAddr::from([127, 0, 0, 1]),
        server_pid: Some(std::process::id()),
        token: None,
    };
    let s = run_load(&opts).await.unwrap();
    assert_eq!(s.sessions, 5);
    assert_eq!(s.sessions_ok, 5, "{s:?}");
    assert_eq!(s.sessions_with_errors, 0, "{s:?}");
    assert_eq!(s.turns, 5);
    assert!(s.packets_received > 50, "{s:?}");
    assert!(s.first_audio_latency_ms_p50.is_some() && s.first_audio_latency_ms_p99.is_some());
    let server_usage = s.server.as_ref().unwrap();
    assert!(server_usage.rss_kb_peak > 0);
    server.stop().await;
}

#[tokio::test]
async fn a_refused_offer_is_an_error() {
    let mut config = Config::default();
    config.vip.enabled = false;
    let server = Running::start(config).await;
    let mut opts = WebrtcOptions::new(format!("http://{}", server.addr));
    opts.texts = vec!["hi".into()];
    opts.timeout = Duration::from_secs(10);
    let mut events = Events::recording();
    let err = run(&opts, &mut events).await.unwrap_err();
    assert!(err.to_string().contains("refused"), "{err:#}");
    let stats: Vec<&Value> = events.named("stats").collect();
    assert!(stats[0]["error"].is_string());
    server.stop().await;
}

/// The Gemini bridge's WebRTC signalling: `WEBRTC_OFFER` over `/gemini`, voice on the track,
/// the reply played from the track and the turn's end on the WebSocket.
#[tokio::test]
async fn gemini_webrtc_spoken_turn() {
    let server = Running::start(Config::default()).await;
    let dir = scratch("webrtc-gemini");
    let reply = dir.join("reply.wav");
    let mut opts = WebrtcOptions::new(format!("ws://{}/gemini", server.addr));
    opts.gemini = true;
    opts.wav = Some(speech_wav(&dir, 1500));
    opts.save_reply = Some(reply.clone());
    opts.timeout = Duration::from_secs(30);
    let mut events = Events::recording();
    let result = run(&opts, &mut events).await;
    let kinds: Vec<String> = received(&events);
    let out = result.unwrap();
    for kind in ["SETUP_COMPLETE", "WEBRTC_ANSWER", "TURN_COMPLETE"] {
        assert!(kinds.iter().any(|k| k == kind), "no {kind}: {kinds:?}");
    }
    let s = &out.stats;
    assert!(s.connected && s.turns >= 1, "{s:?}");
    assert!(s.packets_received > 10, "{s:?}");
    assert_eq!(s.first_audio_latency_ms.len(), 1, "{s:?}");
    let saved = voxgate_audio::wav::read_wav(&std::fs::read(&reply).unwrap()).unwrap();
    let peak = saved
        .to_mono_i16()
        .iter()
        .map(|x| x.unsigned_abs())
        .max()
        .unwrap_or(0);
    assert!(peak > 1000, "the reply is not silence (peak {peak})");
    server.stop().await;
}
