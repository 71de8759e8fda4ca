//! The crate's examples against a real server on 127.0.0.1: each example's work is a function
//! its `main` calls, run here as the example runs it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

#[allow(dead_code, reason = "the example's main is not called here")]
#[path = "../examples/text_chat.rs"]
mod text_chat;
#[allow(dead_code, reason = "the example's main is not called here")]
#[path = "../examples/tool_agent.rs"]
mod tool_agent;
#[allow(dead_code, reason = "the example's main is not called here")]
#[path = "../examples/wav_turn.rs"]
mod wav_turn;

use voxgate_realtime_client::Endpoint;
use voxgate_server::Config;

use common::start;

#[tokio::test]
async fn text_chat_prints_one_reply_per_line_over_both_transports() {
    let (addr, _stop) = start(Config::default()).await;
    for endpoint in [
        Endpoint::websocket(format!("ws://{addr}/realtime")),
        Endpoint::grpc(format!("http://{addr}")),
    ] {
        let input = tokio::io::BufReader::new(&b"hello there\n\nsecond line\n"[..]);
        let mut output = Vec::new();
        let replies = text_chat::chat(endpoint, input, &mut output).await.unwrap();
        assert_eq!(replies, 2);
        assert_eq!(
            String::from_utf8(output).unwrap(),
            "You said: hello there\nYou said: second line\n"
        );
    }
}

#[tokio::test]
async fn the_tool_agent_runs_the_tool_and_the_model_uses_its_result() {
    let (addr, _stop) = start(Config::default()).await;
    let log = tool_agent::run(
        Endpoint::websocket(format!("ws://{addr}/realtime")),
        &[
            r#"call get_weather {"city": "Paris"}"#.to_owned(),
            r#"call add {"a": 2, "b": 40}"#.to_owned(),
        ],
    )
    .await
    .unwrap();
    let text = log.join("\n");
    assert!(
        text.contains(r#"tool get_weather({"city":"Paris"}) -> Paris: sunny, 21 C"#),
        "{text}"
    );
    assert!(text.contains("tool add("), "{text}");
    assert!(text.contains("-> 42"), "{text}");
    let last_replies: Vec<&String> = log.iter().filter(|l| l.starts_with("assistant:")).collect();
    assert!(
        last_replies
            .iter()
            .any(|l| l.contains("Paris: sunny, 21 C")),
        "{text}"
    );
    assert!(last_replies.iter().any(|l| l.contains("42")), "{text}");
}

#[tokio::test]
async fn a_wav_turn_streams_the_file_and_saves_the_spoken_reply() {
    let (addr, _stop) = start(Config::default()).await;
    let dir = std::env::temp_dir().join(format!("voxgate-wav-turn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("question.wav");
    let output = dir.join("reply.wav");
    // 1.2 s of a voiced-like tone at 16 kHz: speech to the server's voice detector.
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 16_000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut writer = hound::WavWriter::create(&input, spec).unwrap();
    for i in 0..19_200u32 {
        let t = f64::from(i) / 16_000.0;
        let s = (t * 220.0 * std::f64::consts::TAU).sin() * 0.5
            + (t * 440.0 * std::f64::consts::TAU).sin() * 0.25;
        #[allow(clippy::cast_possible_truncation, reason = "within i16")]
        writer.write_sample((s * 16_000.0) as i16).unwrap();
    }
    writer.finalize().unwrap();

    let turn = wav_turn::spoken_turn(
        Endpoint::websocket(format!("ws://{addr}/realtime")),
        &input,
        &output,
    )
    .await
    .unwrap();
    // The embedded defaults have no recognizer: the transcript says how much speech it heard.
    assert!(turn.transcript.contains("unrecognized speech"), "{turn:?}");
    let saved = hound::WavReader::open(&output).unwrap();
    assert_eq!(saved.spec().sample_rate, 24_000);
    assert_eq!(saved.len() as usize, turn.reply_samples);
    assert!(turn.reply_samples > 2400, "{turn:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
