//! The realtime client against the real server (in-process, embedded demo agent and TTS).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{Running, scratch, speech_wav};
use voxgate_client::events::Events;
use voxgate_client::realtime::{RealtimeOptions, run};
use voxgate_server::Config;

#[tokio::test]
async fn text_turns_get_replies_in_order_with_every_event_printed() {
    let server = Running::start(Config::default()).await;
    let mut opts = RealtimeOptions::new(format!("ws://{}/realtime", server.addr));
    opts.texts = vec!["hello there".into(), "second question".into()];
    opts.timeout = Duration::from_secs(15);
    let mut events = Events::recording();
    let out = run(&opts, &mut events).await.unwrap();
    assert_eq!(out.replies.len(), 2, "{:?}", events.recorded());
    assert!(
        out.replies[0].text.contains("You said: hello there"),
        "{:?}",
        out.replies
    );
    assert!(out.replies[1].text.contains("You said: second question"));
    assert!(out.replies[0].turn_id < out.replies[1].turn_id);
    assert!(out.errors.is_empty());
    let names: Vec<&str> = events
        .recorded()
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    let ready = names.iter().position(|n| *n == "session_ready").unwrap();
    let begin = names.iter().position(|n| *n == "response_begin").unwrap();
    let end = names.iter().position(|n| *n == "response_end").unwrap();
    assert!(ready < begin && begin < end, "{names:?}");
    assert!(events.named("model_text_fragment").count() >= 2);
    assert!(events.recorded().iter().all(|e| e["t_ms"].is_u64()));
    server.stop().await;
}

#[tokio::test]
async fn a_wav_streams_at_real_time_and_the_spoken_reply_is_saved() {
    let server = Running::start(Config::default()).await;
    let dir = scratch("realtime-wav");
    let wav = speech_wav(&dir, 1500);
    let reply = dir.join("reply.wav");
    let mut opts = RealtimeOptions::new(format!("ws://{}/realtime", server.addr));
    opts.wav = Some(wav);
    opts.save_reply = Some(reply.clone());
    opts.input_rate = 24_000; // resampled from the file's 16 kHz
    opts.output_rate = 16_000;
    opts.timeout = Duration::from_secs(20);
    let mut events = Events::recording();
    let started = std::time::Instant::now();
    let out = run(&opts, &mut events).await.unwrap();
    // 1.5 s of speech and 1.2 s of silence went out at real time, not faster.
    assert!(
        started.elapsed() >= Duration::from_millis(2600),
        "{:?}",
        started.elapsed()
    );
    assert!(
        out.transcriptions
            .iter()
            .any(|t| t.contains("unrecognized speech")),
        "the server heard the speech: {:?}",
        events.recorded()
    );
    let names: Vec<String> = events
        .recorded()
        .iter()
        .filter(|e| e["event"] != "model_audio_chunk")
        .map(|e| e.to_string())
        .collect();
    assert_eq!(out.replies.len(), 1, "{names:#?}");
    assert!(out.replies[0].audio_bytes > 0);
    assert!(
        events.named("vad_state_event").count() > 0
            || events.named("playback_clear_buffer").count() > 0
    );
    let saved = voxgate_audio::wav::read_wav(&std::fs::read(&reply).unwrap()).unwrap();
    assert_eq!((saved.sample_rate, saved.channels), (16_000, 1));
    assert_eq!(saved.frames(), out.audio.len());
    assert!(
        saved.frames() > 1600,
        "at least 0.1 s of speech: {}",
        saved.frames()
    );
    server.stop().await;
}

#[tokio::test]
async fn api_keys_are_sent_as_bearer_tokens() {
    let mut config = Config::default();
    config.realtime.api_keys = vec!["s3cret".into()];
    let server = Running::start(config).await;
    let mut opts = RealtimeOptions::new(format!(
        "ws://{}/api/v1/vendors/v/organizations/o/realtime",
        server.addr
    ));
    opts.texts = vec!["ping".into()];
    opts.timeout = Duration::from_secs(10);
    let refused = run(&opts, &mut Events::recording()).await;
    assert!(refused.is_err());
    opts.api_key = Some("s3cret".into());
    let out = run(&opts, &mut Events::recording()).await.unwrap();
    assert_eq!(out.replies.len(), 1);
    server.stop().await;
}

#[tokio::test]
async fn an_unreachable_server_fails_fast() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let mut opts = RealtimeOptions::new(format!("ws://{addr}/realtime"));
    opts.timeout = Duration::from_secs(3);
    let err = run(&opts, &mut Events::recording()).await.unwrap_err();
    assert!(format!("{err:#}").contains("connecting"), "{err:#}");
}

#[tokio::test]
async fn grpc_and_websocket_sessions_get_the_same_message_sequence() {
    let server = Running::start(Config::default()).await;
    let dir = scratch("realtime-kinds");
    let mut sequences = Vec::new();
    for (grpc, url) in [
        (false, format!("ws://{}/realtime", server.addr)),
        (true, format!("http://{}", server.addr)),
    ] {
        let kinds = dir.join(format!("kinds-{grpc}.json"));
        let mut opts = RealtimeOptions::new(url);
        opts.grpc = grpc;
        opts.texts = vec![
            "hello there".into(),
            r#"call get_weather {"city": "Paris"}"#.into(),
        ];
        opts.tool_results = vec![("get_weather".into(), "sunny, 21 C".into())];
        opts.kinds_out = Some(kinds.clone());
        opts.timeout = Duration::from_secs(15);
        let mut events = Events::recording();
        let out = run(&opts, &mut events).await.unwrap();
        assert!(
            out.replies.iter().any(|r| r.text.contains("sunny, 21 C")),
            "grpc {grpc}: the tool result continued the reply: {:?}",
            out.replies
        );
        assert_eq!(
            events
                .named("sent")
                .filter(|e| e["message"] == "tool_call_response")
                .count(),
            1
        );
        let written: Vec<String> =
            serde_json::from_str(&std::fs::read_to_string(&kinds).unwrap()).unwrap();
        assert_eq!(written, out.kinds, "grpc {grpc}");
        sequences.push(written);
    }
    let (ws, grpc) = (&sequences[0], &sequences[1]);
    assert_eq!(ws.first().map(String::as_str), Some("session_ready"));
    assert_eq!(ws.last().map(String::as_str), Some("chat_history"));
    assert!(ws.iter().any(|k| k == "tool_call_request"), "{ws:?}");
    assert_eq!(ws, grpc, "the same session over both transports");
    server.stop().await;
}
