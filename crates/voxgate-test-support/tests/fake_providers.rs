//! The fake providers speak the wire formats the server's real provider clients use: each
//! endpoint is called through voxgate-providers' own OpenAI clients (what the server sends and
//! parses), and through raw reqwest for the exact bytes (SSE events, PCM length, errors).
//! Run with `cargo test -p voxgate-test-support --features fake-providers`.

use std::time::{Duration, Instant};

use futures::StreamExt as _;
use voxgate_providers::{
    Asr as _, ChatMessage, Llm as _, LlmEvent, LlmRequest, OpenAiChat, OpenAiChatConfig,
    OpenAiSpeech, OpenAiSpeechConfig, OpenAiTranscription, OpenAiTranscriptionConfig, Tts as _,
    TtsRequest, Utterance,
};
use voxgate_test_support::fake_providers::{
    FakeCounts, FakeDelays, FakeProviders, REPLY_CHUNKS, SPEECH_SAMPLES, TRANSCRIPT,
};

fn ask() -> LlmRequest {
    LlmRequest {
        messages: vec![
            ChatMessage::system("be brief"),
            ChatMessage::user("weather?"),
        ],
        ..LlmRequest::default()
    }
}

#[tokio::test]
async fn the_real_provider_clients_get_a_transcript_a_sentence_and_a_second_of_speech() {
    let fakes = FakeProviders::start(FakeDelays::default()).await.unwrap();
    let base = fakes.base_url();

    let asr = OpenAiTranscription::new(OpenAiTranscriptionConfig::new(&base, "whisper-1")).unwrap();
    let heard = asr
        .transcribe(Utterance {
            pcm: vec![100; 16_000],
            language: Some("en".into()),
        })
        .await
        .unwrap();
    assert_eq!(heard.text, TRANSCRIPT);

    let llm = OpenAiChat::new(OpenAiChatConfig::new(&base, "fake")).unwrap();
    let events: Vec<LlmEvent> = llm.generate(ask()).collect().await;
    let deltas: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            LlmEvent::TextDelta(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(deltas, REPLY_CHUNKS);
    assert!(
        matches!(events.last(), Some(LlmEvent::Done { .. })),
        "{events:?}"
    );

    let tts = OpenAiSpeech::new(OpenAiSpeechConfig::new(&base, "tts-1", "alloy")).unwrap();
    let chunks: Vec<_> = tts
        .synthesize(TtsRequest {
            text: deltas.concat(),
            ..TtsRequest::default()
        })
        .collect()
        .await;
    assert!(chunks.len() > 1, "streamed in pieces");
    let mut samples = 0;
    for c in chunks {
        let c = c.unwrap();
        assert_eq!(c.sample_rate, 24_000);
        samples += c.samples.len();
    }
    assert_eq!(samples, SPEECH_SAMPLES);

    assert_eq!(
        fakes.counts(),
        FakeCounts {
            asr: 1,
            llm: 1,
            tts: 1,
            bad_requests: 0,
            ..FakeCounts::default()
        }
    );
    fakes.stop();
}

#[tokio::test]
async fn raw_wire_shapes_and_bad_requests() {
    let fakes = FakeProviders::start(FakeDelays::default()).await.unwrap();
    let base = fakes.base_url();
    let http = reqwest::Client::new();

    let form = reqwest::multipart::Form::new()
        .part(
            "file",
            reqwest::multipart::Part::bytes(b"RIFF....WAVE".to_vec()).file_name("u.wav"),
        )
        .text("model", "whisper-1")
        .text("response_format", "json");
    let resp = http
        .post(format!("{base}/audio/transcriptions"))
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body, serde_json::json!({ "text": TRANSCRIPT }));

    let resp = http
        .post(format!("{base}/chat/completions"))
        .json(&serde_json::json!({"model": "m", "stream": true, "messages": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let text = resp.text().await.unwrap();
    let events: Vec<&str> = text
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").unwrap())
        .collect();
    // The role chunk, eight deltas, the finish chunk, [DONE].
    assert_eq!(events.len(), 11, "{text}");
    assert_eq!(events[10], "[DONE]");
    let finish: serde_json::Value = serde_json::from_str(events[9]).unwrap();
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    let said: String = events[1..9]
        .iter()
        .map(|e| {
            let v: serde_json::Value = serde_json::from_str(e).unwrap();
            assert_eq!(v["object"], "chat.completion.chunk");
            v["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(said, REPLY_CHUNKS.concat());

    let resp = http
        .post(format!("{base}/audio/speech"))
        .json(&serde_json::json!({"model": "tts-1", "input": "Hi.", "voice": "alloy", "response_format": "pcm"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.bytes().await.unwrap().len(), SPEECH_SAMPLES * 2);

    // Shapes the server never sends are refused and counted.
    for (path, body) in [
        ("chat/completions", serde_json::json!({"messages": []})),
        (
            "audio/speech",
            serde_json::json!({"input": "Hi.", "response_format": "mp3"}),
        ),
    ] {
        let resp = http
            .post(format!("{base}/{path}"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 400, "{path}");
    }
    let resp = http
        .post(format!("{base}/audio/transcriptions"))
        .body("not a form")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    assert_eq!(fakes.counts().bad_requests, 3);
}

#[test]
fn delays_hold_back_the_first_output_and_the_thread_version_serves_without_a_runtime() {
    let delay = Duration::from_millis(150);
    let fakes = FakeProviders::spawn(FakeDelays {
        asr: delay,
        llm_first_token: delay,
        tts_first_byte: delay,
    })
    .unwrap();
    let base = fakes.base_url();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let http = reqwest::Client::new();
        let started = Instant::now();
        let resp = http
            .post(format!("{base}/audio/speech"))
            .json(&serde_json::json!({"input": "Hi.", "response_format": "pcm"}))
            .send()
            .await
            .unwrap();
        // The headers come at once; the audio after the delay.
        assert_eq!(resp.status(), 200);
        let body = resp.bytes().await.unwrap();
        assert!(started.elapsed() >= delay);
        assert_eq!(body.len(), SPEECH_SAMPLES * 2);
    });
    assert_eq!(fakes.counts().tts, 1);
    fakes.stop();
}
