//! Every example's logic, run for real: each example file is compiled into this test as a
//! module, and its functions are called against real peers on 127.0.0.1 (an in-process voxgate
//! server, the example's own Retell server), exactly as the example's `main` calls them. Each
//! test is bounded by a timeout, so a hang fails instead of blocking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::time::Duration;

// Each example's `main` (and its command-line-only paths) is unused here.
#[allow(dead_code)]
#[path = "../examples/embed_server.rs"]
mod embed_server;

#[allow(dead_code)]
#[path = "../examples/engine_direct.rs"]
mod engine_direct;

#[allow(dead_code)]
#[path = "../examples/retell_server.rs"]
mod retell_server;

#[allow(dead_code)]
#[path = "../examples/gemini_bridge_client.rs"]
mod gemini_bridge_client;

/// Fails the test when `f` takes longer than a test should.
async fn bounded<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f)
        .await
        .expect("the example finished in time")
}

#[tokio::test]
async fn embed_server_answers_a_realtime_turn_with_our_own_llm() {
    bounded(async {
        let server = embed_server::start_server().await.unwrap();
        let reply = embed_server::realtime_turn(server.addr, "one two three")
            .await
            .unwrap();
        assert_eq!(reply, "You said 3 words: one two three");
        // A second session on the same server: the brain is shared, the turns are not.
        let reply = embed_server::realtime_turn(server.addr, "four")
            .await
            .unwrap();
        assert_eq!(reply, "You said 1 word: four");
        server.stop().await.unwrap();
    })
    .await;
}

#[test]
fn engine_direct_runs_a_typed_and_a_spoken_turn() {
    use voxgate_engine::{ClientEvent, ProviderRequest};

    let speech = engine_direct::read_speech(engine_direct::DEFAULT_WAV).unwrap();
    let conversation = engine_direct::converse(&speech).unwrap();

    // One utterance went to the recognizer: the question, cut by the VAD, not the silence.
    let heard: Vec<usize> = conversation
        .requests
        .iter()
        .filter_map(|r| match r {
            ProviderRequest::Transcribe { audio, .. } => Some(audio.len()),
            _ => None,
        })
        .collect();
    assert_eq!(heard.len(), 1, "{:#?}", conversation.lines);
    assert!(
        heard[0] >= speech.len() / 2 && heard[0] < speech.len() + 16_000,
        "{} samples heard of {}",
        heard[0],
        speech.len()
    );
    let transcribed: Vec<&str> = conversation
        .events
        .iter()
        .filter_map(|e| match e {
            ClientEvent::UserTranscription { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(transcribed, [engine_direct::HEARD]);

    // Both replies were spoken sentence by sentence, with audio, and played out in full.
    let sentences: Vec<&str> = conversation
        .events
        .iter()
        .filter_map(|e| match e {
            ClientEvent::SentenceStart { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        sentences.join(" "),
        format!(
            "You said: Good morning! I am only a fake model, sorry. You said: {} I am only a \
             fake model, sorry.",
            engine_direct::HEARD
        )
    );
    let audio = conversation
        .events
        .iter()
        .filter(|e| matches!(e, ClientEvent::AudioChunk { .. }))
        .count();
    assert_eq!(audio, sentences.len());
    let finished: Vec<bool> = conversation
        .events
        .iter()
        .filter_map(|e| match e {
            ClientEvent::ResponseFinished { interrupted, .. } => Some(*interrupted),
            _ => None,
        })
        .collect();
    assert_eq!(finished, [false, false]);
    assert_eq!(
        conversation.lines.len(),
        conversation.events.len() + conversation.requests.len() + 2
    );
}

#[tokio::test]
async fn retell_server_streams_answers_to_the_retell_driver() {
    bounded(async {
        let (addr, server) = retell_server::start_server("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{addr}/llm-websocket/call_test");
        let spoken = retell_server::play_retell(&url, &["When do you open?", "Thanks, bye!"])
            .await
            .unwrap();
        let spoken: Vec<(u64, &str)> = spoken.iter().map(|(id, s)| (*id, s.as_str())).collect();
        assert_eq!(
            spoken,
            [
                (0, retell_server::GREETING),
                (
                    1,
                    "We open at seven and close at six, every day but Sunday."
                ),
                (2, "Goodbye, and thank you for calling!"),
            ]
        );
        // Only Retell's path is served.
        let wrong = tokio_tungstenite::connect_async(format!("ws://{addr}/elsewhere")).await;
        assert!(wrong.is_err());
        server.abort();
    })
    .await;
}

#[tokio::test]
async fn gemini_bridge_client_talks_to_an_in_process_server() {
    let reply = bounded(gemini_bridge_client::ask_in_process_server("hello bridge"))
        .await
        .unwrap();
    assert_eq!(reply.trim(), "You said: hello bridge");
}
