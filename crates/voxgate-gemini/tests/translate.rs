//! Mapping between the bridge protocol and the upstream Live API.

// Test helpers may unwrap and panic: a failure there is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::json;
use voxgate_gemini::live::ClientContent;
use voxgate_gemini::{
    Blob, BridgeForwarder, ClientMessage, Content, LiveClientMessage, LiveConfig, LiveServerEvent,
    LiveServerMessage, Part, RealtimeInput, ServerContent, ServerMessage, ToolCall,
    ToolCallCancellation,
};

fn audio_content(samples: &[i16]) -> ServerContent {
    ServerContent {
        model_turn: Some(Content {
            role: Some("model".into()),
            parts: vec![Part::inline(Blob::pcm(samples, 24_000))],
        }),
        ..ServerContent::default()
    }
}

fn forward(f: &mut BridgeForwarder, event: LiveServerEvent) -> Vec<&'static str> {
    let mut out = Vec::new();
    f.forward(LiveServerMessage::new(event), &mut out);
    out.iter()
        .map(|m| match m {
            ServerMessage::SetupComplete(_) => "SETUP_COMPLETE",
            ServerMessage::AssistantSpeaking { speaking: true } => "ASSISTANT_SPEAKING",
            ServerMessage::ContentMessage(_) => "CONTENT_MESSAGE",
            ServerMessage::AudioChunk { .. } => "AUDIO_CHUNK",
            ServerMessage::Interrupted => "INTERRUPTED",
            ServerMessage::TurnComplete => "TURN_COMPLETE",
            ServerMessage::ToolCall(_) => "TOOL_CALL",
            ServerMessage::ToolCallCancellation(_) => "TOOL_CALL_CANCELLATION",
            other => panic!("unexpected {other:?}"),
        })
        .collect()
}

#[test]
fn a_spoken_turn_in_bridge_order() {
    let mut f = BridgeForwarder::default();
    assert_eq!(
        forward(&mut f, LiveServerEvent::SetupComplete),
        ["SETUP_COMPLETE"]
    );
    assert_eq!(
        forward(
            &mut f,
            LiveServerEvent::ServerContent(audio_content(&[1, 2]))
        ),
        ["ASSISTANT_SPEAKING", "CONTENT_MESSAGE"],
        "speaking is announced once, before the first audio"
    );
    assert_eq!(
        forward(&mut f, LiveServerEvent::ServerContent(audio_content(&[3]))),
        ["CONTENT_MESSAGE"],
        "AUDIO_CHUNK is off by default"
    );
    assert_eq!(
        forward(
            &mut f,
            LiveServerEvent::ServerContent(ServerContent {
                turn_complete: true,
                ..ServerContent::default()
            })
        ),
        ["CONTENT_MESSAGE", "TURN_COMPLETE"],
        "TURN_COMPLETE follows the content carrying the flag"
    );
    assert_eq!(
        forward(&mut f, LiveServerEvent::ServerContent(audio_content(&[4]))),
        ["ASSISTANT_SPEAKING", "CONTENT_MESSAGE"],
        "a new turn announces speech again"
    );
}

#[test]
fn interruption_and_opt_in_audio_chunks() {
    let mut f = BridgeForwarder::new(true);
    let samples = [7i16, -7, 300];
    let mut out = Vec::new();
    f.forward(
        LiveServerMessage::new(LiveServerEvent::ServerContent(audio_content(&samples))),
        &mut out,
    );
    let Some(ServerMessage::AudioChunk { data }) = out.last() else {
        panic!("{out:?}")
    };
    assert_eq!(data, &Blob::pcm(&samples, 24_000).data);
    assert_eq!(
        forward(
            &mut f,
            LiveServerEvent::ServerContent(ServerContent {
                interrupted: true,
                ..ServerContent::default()
            })
        ),
        ["CONTENT_MESSAGE", "INTERRUPTED"]
    );
    assert_eq!(
        forward(
            &mut f,
            LiveServerEvent::ToolCall(ToolCall {
                function_calls: vec![]
            })
        ),
        ["TOOL_CALL"]
    );
    assert_eq!(
        forward(
            &mut f,
            LiveServerEvent::ToolCallCancellation(ToolCallCancellation {
                ids: vec!["a".into()]
            })
        ),
        ["TOOL_CALL_CANCELLATION"]
    );
    assert!(forward(&mut f, LiveServerEvent::UsageOnly).is_empty());
}

#[test]
fn client_messages_to_live() {
    let msg = ClientMessage::SendMessage {
        parts: vec![Part::text("hi")],
        turn_complete: true,
    };
    assert_eq!(
        msg.to_live(),
        Some(LiveClientMessage::ClientContent(ClientContent {
            turns: vec![Content {
                role: Some("user".into()),
                parts: vec![Part::text("hi")],
            }],
            turn_complete: true,
        }))
    );
    let config = LiveConfig {
        model: Some("models/x".into()),
        ..LiveConfig::default()
    };
    assert_eq!(
        ClientMessage::UpdateConfig(config.clone()).to_live(),
        Some(LiveClientMessage::Setup(config.clone()))
    );
    assert_eq!(
        ClientMessage::ConnectGemini {
            initial_config: Some(config.clone())
        }
        .to_live(),
        Some(LiveClientMessage::Setup(config))
    );
    let input = RealtimeInput {
        text: Some("{}".into()),
        ..RealtimeInput::default()
    };
    assert_eq!(
        ClientMessage::SendRealtimeInput(input.clone()).to_live(),
        Some(LiveClientMessage::RealtimeInput(input))
    );
    assert_eq!(ClientMessage::DisconnectGemini.to_live(), None);
    let v: serde_json::Value = serde_json::from_str(
        &ClientMessage::SendMessage {
            parts: vec![Part::text("hi")],
            turn_complete: false,
        }
        .to_live()
        .unwrap()
        .encode(),
    )
    .unwrap();
    assert_eq!(
        v,
        json!({"clientContent": {"turns": [{"role": "user", "parts": [{"text": "hi"}]}]}})
    );
}

#[test]
fn bare_server_content_payload_is_accepted() {
    let text = r#"{"type":"CONTENT_MESSAGE","payload":{"modelTurn":{"parts":[{"text":"hi"}]}}}"#;
    let ServerMessage::ContentMessage(c) = ServerMessage::decode(text).unwrap() else {
        panic!()
    };
    assert_eq!(c.text(), "hi");
}
