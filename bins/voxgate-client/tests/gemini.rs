//! The Gemini bridge client against the server's bridge door (engine mode, demo agent,
//! embedded TTS), in-process.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{Running, scratch, speech_wav};
use voxgate_client::events::Events;
use voxgate_client::gemini::{GeminiOptions, run};
use voxgate_server::Config;

#[tokio::test]
async fn text_turns_complete_in_order() {
    let server = Running::start(Config::default()).await;
    let mut opts = GeminiOptions::new(format!("ws://{}/gemini", server.addr));
    opts.texts = vec!["hello there".into(), "one more".into()];
    opts.timeout = Duration::from_secs(15);
    let mut events = Events::recording();
    let out = run(&opts, &mut events).await.unwrap();
    assert_eq!(out.turns.len(), 2, "{:?}", events.recorded());
    assert!(
        out.turns[0].contains("You said: hello there"),
        "{:?}",
        out.turns
    );
    assert!(out.turns[1].contains("You said: one more"));
    assert!(out.errors.is_empty());
    let kinds: Vec<&str> = events
        .named("recv")
        .filter_map(|e| e["message"]["type"].as_str())
        .collect();
    let connected = kinds.iter().position(|k| *k == "GEMINI_CONNECTED").unwrap();
    let setup = kinds.iter().position(|k| *k == "SETUP_COMPLETE").unwrap();
    let complete = kinds.iter().position(|k| *k == "TURN_COMPLETE").unwrap();
    assert!(connected < setup && setup < complete, "{kinds:?}");
    server.stop().await;
}

#[tokio::test]
async fn streamed_speech_gets_a_spoken_reply_saved_as_wav() {
    let server = Running::start(Config::default()).await;
    let dir = scratch("gemini-wav");
    let reply = dir.join("reply.wav");
    let mut opts = GeminiOptions::new(format!("ws://{}/gemini", server.addr));
    opts.wav = Some(speech_wav(&dir, 1500));
    opts.save_reply = Some(reply.clone());
    opts.timeout = Duration::from_secs(20);
    let mut events = Events::recording();
    let out = run(&opts, &mut events).await.unwrap();
    assert_eq!(out.turns.len(), 1, "{:?}", events.recorded());
    assert!(!out.audio.is_empty(), "{:?}", events.recorded());
    let saved = voxgate_audio::wav::read_wav(&std::fs::read(&reply).unwrap()).unwrap();
    assert_eq!(saved.sample_rate, out.sample_rate);
    assert_eq!(saved.frames(), out.audio.len());
    // Audio is never printed inline.
    assert!(
        events
            .recorded()
            .iter()
            .all(|e| e.to_string().len() < 20_000)
    );
    server.stop().await;
}
