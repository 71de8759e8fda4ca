//! The Xiaozhi device client against the server's Xiaozhi door (OTA, hello, MCP, text and
//! audio turns in each binary framing), in-process with the demo agent and embedded TTS.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{Running, scratch, speech_wav};
use voxgate_client::events::Events;
use voxgate_client::xiaozhi::{XiaozhiOptions, run};
use voxgate_server::Config;
use voxgate_xiaozhi::control::ListenMode;

#[tokio::test]
async fn ota_then_a_text_turn_with_mcp_answered_and_the_reply_saved() {
    let server = Running::start(Config::default()).await;
    let dir = scratch("xiaozhi-text");
    let reply = dir.join("reply.wav");
    let mut opts = XiaozhiOptions::new(None);
    opts.ota = Some(format!("http://{}/xiaozhi/ota/", server.addr));
    opts.texts = vec!["hello there".into()];
    opts.protocol_version = Some(2);
    opts.save_reply = Some(reply.clone());
    opts.timeout = Duration::from_secs(20);
    let mut events = Events::recording();
    let out = run(&opts, &mut events).await.unwrap();
    let ota = events
        .named("ota")
        .next()
        .expect("the OTA answer is printed");
    assert!(
        ota["websocket"]["url"]
            .as_str()
            .unwrap()
            .ends_with("/xiaozhi/v1/")
    );
    assert!(!out.session_id.is_empty());
    assert_eq!(out.turns, 1);
    assert_eq!(out.stt, ["hello there"]);
    assert!(
        out.sentences
            .iter()
            .any(|s| s.contains("You said: hello there")),
        "{:?}",
        out.sentences
    );
    assert!(!out.emotions.is_empty());
    assert!(out.reply_frames > 0);
    assert!(
        out.mcp_requests.iter().any(|m| m == "initialize"),
        "{:?}",
        out.mcp_requests
    );
    assert!(out.mcp_requests.iter().any(|m| m == "tools/list"));
    let saved = voxgate_audio::wav::read_wav(&std::fs::read(&reply).unwrap()).unwrap();
    assert_eq!(saved.sample_rate, 24_000);
    assert_eq!(saved.frames(), out.audio.len());
    assert!(saved.frames() > 2400);
    server.stop().await;
}

#[tokio::test]
async fn streamed_opus_speech_gets_a_reply_in_v3_framing_auto_mode() {
    let server = Running::start(Config::default()).await;
    let dir = scratch("xiaozhi-wav");
    let mut opts = XiaozhiOptions::new(Some(format!("ws://{}/xiaozhi/v1/", server.addr)));
    opts.wav = Some(speech_wav(&dir, 1500));
    opts.protocol_version = Some(3);
    opts.mode = ListenMode::Auto;
    opts.mcp = false;
    opts.timeout = Duration::from_secs(30);
    let mut events = Events::recording();
    let out = run(&opts, &mut events).await.unwrap();
    assert_eq!(
        out.turns,
        1,
        "{:?}",
        events
            .recorded()
            .iter()
            .filter(|e| e["event"] != "audio")
            .collect::<Vec<_>>()
    );
    // The server's VAD ended the turn on the speech it heard (no recognizer: the demo agent
    // says how much it heard), and the client stopped its microphone at `tts start`.
    assert!(
        out.sentences
            .iter()
            .any(|s| s.contains("seconds of speech")),
        "{:?}",
        out.sentences
    );
    let stopped = events
        .named("sent")
        .find(|e| e["message"] == "audio_stream_end")
        .expect("the stream ended");
    assert!(
        stopped["frames"].as_u64().unwrap() < 60,
        "stopped at tts start: {stopped}"
    );
    assert!(out.reply_frames > 10);
    assert!(
        events
            .named("audio")
            .all(|e| e["samples"].as_u64().unwrap() > 0),
        "every frame decodes"
    );
    assert!(out.mcp_requests.is_empty(), "no MCP without the feature");
    server.stop().await;
}

#[tokio::test]
async fn an_unactivated_device_is_told_its_code_and_connects_once_confirmed() {
    let mut config = Config::default();
    config.xiaozhi.auth = true;
    config.xiaozhi.token_secret = "client-test-key".into();
    let server = Running::start(config).await;
    let mut opts = XiaozhiOptions::new(None);
    opts.ota = Some(format!("http://{}/xiaozhi/ota/", server.addr));
    opts.texts = vec!["hello there".into()];
    opts.timeout = Duration::from_secs(20);

    let err = run(&opts, &mut Events::recording()).await.unwrap_err();
    let message = format!("{err:#}");
    let code: String = message
        .split("code ")
        .nth(1)
        .expect("the code is named")
        .chars()
        .take(6)
        .collect();
    assert!(code.chars().all(|c| c.is_ascii_digit()), "{message}");

    // The operator confirms the code the device showed; the next run gets a token and talks.
    let confirmed = reqwest::Client::new()
        .post(format!("http://{}/admin/xiaozhi/activate", server.addr))
        .json(&serde_json::json!({ "code": code }))
        .send()
        .await
        .unwrap();
    assert!(confirmed.status().is_success(), "{confirmed:?}");
    let out = run(&opts, &mut Events::recording()).await.unwrap();
    assert_eq!(out.turns, 1);
    server.stop().await;
}
