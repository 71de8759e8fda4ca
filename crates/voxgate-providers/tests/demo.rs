//! The embedded defaults: demo agent behaviours, the no-recognizer marker, the tone placeholder.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use futures::StreamExt;
use serde_json::json;
use voxgate_providers::{
    Asr, ChatMessage, DemoAgent, FinishReason, Intent, Llm, LlmEvent, LlmRequest, NoAsr, ToneTts,
    ToolCall, ToolDefinition, Tts, TtsRequest, Utterance, parse_no_asr_marker,
};

fn tool(name: &str) -> ToolDefinition {
    ToolDefinition {
        name: name.into(),
        description: String::new(),
        parameters: json!({"type": "object"}),
    }
}

async fn run(agent: &DemoAgent, request: LlmRequest) -> (String, Vec<LlmEvent>) {
    let events: Vec<LlmEvent> = agent.generate(request).collect().await;
    let text = events
        .iter()
        .filter_map(|e| match e {
            LlmEvent::TextDelta(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    (text, events)
}

fn says(user: &str, tools: Vec<ToolDefinition>) -> LlmRequest {
    LlmRequest {
        messages: vec![ChatMessage::system("prompt"), ChatMessage::user(user)],
        tools,
        ..LlmRequest::default()
    }
}

fn stop() -> Option<&'static LlmEvent> {
    static DONE: LlmEvent = LlmEvent::Done {
        finish_reason: FinishReason::Stop,
        usage: None,
    };
    Some(&DONE)
}

#[tokio::test]
async fn greets_on_a_trigger_and_on_an_empty_history() {
    let agent = DemoAgent::new();
    let greet = LlmRequest {
        intent: Intent::Greet,
        ..LlmRequest::default()
    };
    let (text, events) = run(&agent, greet).await;
    assert!(text.starts_with("👋 Hello!"), "{text}");
    assert_eq!(events.last(), stop());
    let only_system = LlmRequest {
        messages: vec![ChatMessage::system("prompt")],
        ..LlmRequest::default()
    };
    assert_eq!(run(&agent, only_system).await.0, text);
}

#[tokio::test]
async fn echoes_text_behind_an_emoji_streamed_in_pieces() {
    let agent = DemoAgent::new();
    let (text, events) = run(&agent, says("  turn on the lights ", vec![])).await;
    assert_eq!(text, "😊 You said: turn on the lights");
    assert!(events.len() > 3, "streamed word by word");
    assert_eq!(events.last(), stop());
}

#[tokio::test]
async fn calls_a_declared_tool_by_its_exact_name_with_the_arguments() {
    let agent = DemoAgent::new();
    let tools = vec![tool("self.audio_speaker.set_volume"), tool("get_weather")];
    let (text, events) = run(
        &agent,
        says(
            "call self.audio_speaker.set_volume {\"volume\": 40}",
            tools.clone(),
        ),
    )
    .await;
    assert!(text.contains("self.audio_speaker.set_volume"));
    let call = events
        .iter()
        .find_map(|e| match e {
            LlmEvent::ToolCall(c) => Some(c.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(call.name, "self.audio_speaker.set_volume");
    assert_eq!(call.parse_arguments().unwrap(), json!({"volume": 40}));
    assert_eq!(
        events.last(),
        Some(&LlmEvent::Done {
            finish_reason: FinishReason::ToolCalls,
            usage: None
        })
    );
    // Without arguments the call gets an empty object; ids are unique.
    let (_, events) = run(&agent, says("call get_weather", tools)).await;
    let second = events
        .iter()
        .find_map(|e| match e {
            LlmEvent::ToolCall(c) => Some(c.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(second.parse_arguments().unwrap(), json!({}));
    assert_ne!(second.id, call.id);
}

#[tokio::test]
async fn refuses_unknown_tools_and_bad_arguments_in_words() {
    let agent = DemoAgent::new();
    let (text, events) = run(&agent, says("call nope {}", vec![tool("a.b")])).await;
    assert!(text.contains("\"nope\"") && text.contains("a.b"), "{text}");
    assert!(!events.iter().any(|e| matches!(e, LlmEvent::ToolCall(_))));
    let (text, events) = run(&agent, says("call a.b [1, 2]", vec![tool("a.b")])).await;
    assert!(text.contains("JSON object"), "{text}");
    assert!(!events.iter().any(|e| matches!(e, LlmEvent::ToolCall(_))));
    let (text, _) = run(&agent, says("call a.b {oops", vec![tool("a.b")])).await;
    assert!(text.contains("JSON object"), "{text}");
}

#[tokio::test]
async fn reports_the_tool_result_in_its_reply() {
    let agent = DemoAgent::new();
    let request = LlmRequest {
        messages: vec![
            ChatMessage::user("call self.light.set {\"on\": true}"),
            ChatMessage::assistant_tool_calls(
                "🛠️ Calling self.light.set.",
                vec![ToolCall {
                    id: "demo_call_1".into(),
                    name: "self.light.set".into(),
                    arguments: "{\"on\":true}".into(),
                }],
            ),
            ChatMessage::tool_result("demo_call_1", "{\"success\":true}"),
        ],
        tools: vec![tool("self.light.set")],
        ..LlmRequest::default()
    };
    let (text, events) = run(&agent, request).await;
    assert_eq!(
        text,
        "🔧 The tool self.light.set returned: {\"success\":true}"
    );
    assert_eq!(events.last(), stop());
}

#[tokio::test]
async fn summarizes_the_history_on_a_conversation_query() {
    let agent = DemoAgent::new();
    let request = LlmRequest {
        messages: vec![
            ChatMessage::system("prompt"),
            ChatMessage::user("hello"),
            ChatMessage::assistant("😊 You said: hello"),
            ChatMessage::user("what time is it"),
        ],
        intent: Intent::ConversationQuery {
            query: "summarize".into(),
        },
        ..LlmRequest::default()
    };
    let (text, _) = run(&agent, request).await;
    assert_eq!(
        text,
        "📜 3 messages so far: 2 from the user, 1 from the assistant, 0 tool calls, \
         0 tool results; the user last said \"what time is it\"."
    );
    assert!(!text.contains('\n'));
    let empty = LlmRequest {
        intent: Intent::ConversationQuery {
            query: "summarize".into(),
        },
        ..LlmRequest::default()
    };
    assert!(run(&agent, empty).await.0.contains("not started"));
}

#[tokio::test]
async fn without_a_recognizer_the_reply_says_how_much_speech_was_heard() {
    let utterance = Utterance {
        pcm: vec![100; 16_000 * 5 / 2],
        language: Some("en".into()),
    };
    let transcript = NoAsr.transcribe(utterance).await.unwrap();
    assert_eq!(parse_no_asr_marker(&transcript.text), Some(2.5));
    assert_eq!(transcript.language.as_deref(), Some("en"));
    let (text, _) = run(&DemoAgent::new(), says(&transcript.text, vec![])).await;
    assert_eq!(
        text,
        "🎧 I heard 2.5 seconds of speech, but no speech recognizer is configured, so I \
         cannot tell what you said."
    );
}

#[tokio::test]
async fn the_tone_placeholder_beeps_once_per_word() {
    let chunks: Vec<_> = ToneTts
        .synthesize(TtsRequest {
            text: "hello  brave world".into(),
            ..TtsRequest::default()
        })
        .collect()
        .await;
    assert_eq!(chunks.len(), 3);
    let chunks: Vec<_> = chunks.into_iter().map(Result::unwrap).collect();
    for c in &chunks {
        assert_eq!(c.sample_rate, 16_000);
        assert_eq!(c.samples.len(), 3_520);
        let rms = (c.samples.iter().map(|&s| f64::from(s).powi(2)).sum::<f64>()
            / c.samples.len() as f64)
            .sqrt();
        assert!(rms > 3_000.0, "audible: rms {rms}");
        assert_eq!(c.samples[0], 0, "fades in");
    }
    assert_ne!(
        chunks[0].samples, chunks[2].samples,
        "pitch follows the word"
    );
}
