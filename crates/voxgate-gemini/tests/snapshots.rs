//! The wire shape of every message, pinned with insta; each is also decoded back to itself.
// Test helpers may unwrap and panic: a failure there is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{Value, json};
use voxgate_gemini::bridge::{
    IceCandidate, IceMessage, ImageGenerationResult, LogMessage, SetupComplete,
};
use voxgate_gemini::live::{ClientContent, GoAway, SessionResumptionUpdate};
use voxgate_gemini::{
    Behavior, Blob, ClientMessage, Content, FunctionCall, FunctionDeclaration, FunctionResponse,
    GenerationConfig, LiveClientMessage, LiveConfig, LiveServerEvent, LiveServerMessage, Modality,
    ModalityTokenCount, Part, PrebuiltVoiceConfig, RealtimeInput, Scheduling, ServerContent,
    ServerMessage, SpeechConfig, Tool, ToolCall, ToolCallCancellation, ToolResponse, Transcription,
    UsageMetadata, VoiceConfig,
};

fn config() -> LiveConfig {
    LiveConfig {
        model: Some("models/gemini-2.0-flash-live-001".into()),
        system_instruction: Some(Content::text("You are a helpful assistant.")),
        generation_config: Some(GenerationConfig {
            temperature: Some(0.7),
            top_k: Some(40),
            max_output_tokens: Some(1024),
            response_modalities: Some(vec![Modality::Audio]),
            speech_config: Some(SpeechConfig {
                voice_config: Some(VoiceConfig {
                    prebuilt_voice_config: Some(PrebuiltVoiceConfig {
                        voice_name: Some("Aoede".into()),
                    }),
                    ..VoiceConfig::default()
                }),
                ..SpeechConfig::default()
            }),
            ..GenerationConfig::default()
        }),
        tools: vec![
            Tool {
                function_declarations: vec![FunctionDeclaration {
                    name: "get_weather".into(),
                    description: Some("Current weather for a city".into()),
                    parameters: Some(json!({
                        "type": "OBJECT",
                        "properties": {"location": {"type": "STRING"}},
                        "required": ["location"]
                    })),
                    behavior: Some(Behavior::NonBlocking),
                    ..FunctionDeclaration::default()
                }],
                ..Tool::default()
            },
            Tool {
                google_search: Some(json!({})),
                ..Tool::default()
            },
        ],
        realtime_input_config: Some(json!({"automaticActivityDetection": {"disabled": false}})),
        ..LiveConfig::default()
    }
}

fn audio_content() -> ServerContent {
    ServerContent {
        model_turn: Some(Content {
            role: Some("model".into()),
            parts: vec![Part::inline(Blob::pcm(&[1, -1, 300], 24_000))],
        }),
        output_transcription: Some(Transcription {
            text: "Hello".into(),
            finished: None,
        }),
        ..ServerContent::default()
    }
}

fn tool_call() -> ToolCall {
    ToolCall {
        function_calls: vec![FunctionCall {
            id: Some("function-call-123".into()),
            name: "get_weather".into(),
            args: Some(json!({"location": "London"})),
        }],
    }
}

fn tool_response() -> ToolResponse {
    ToolResponse {
        function_responses: vec![FunctionResponse {
            id: Some("function-call-123".into()),
            name: "get_weather".into(),
            response: json!({"temperature": "15C", "condition": "Cloudy"}),
            will_continue: None,
            scheduling: Some(Scheduling::WhenIdle),
        }],
    }
}

fn ice(nested: bool) -> IceMessage {
    IceMessage {
        candidate: IceCandidate {
            candidate: Some(
                "candidate:842163049 1 udp 1677729535 192.0.2.7 46154 typ srflx".into(),
            ),
            sdp_mid: Some("0".into()),
            sdp_m_line_index: Some(0),
            username_fragment: None,
        },
        nested,
    }
}

fn client_messages() -> Vec<(&'static str, ClientMessage)> {
    vec![
        (
            "connect_gemini",
            ClientMessage::ConnectGemini {
                initial_config: Some(config()),
            },
        ),
        (
            "send_message",
            ClientMessage::SendMessage {
                parts: vec![Part::text("Hello, what is the weather today?")],
                turn_complete: true,
            },
        ),
        (
            "send_realtime_input_audio",
            ClientMessage::SendRealtimeInput(RealtimeInput {
                audio: Some(Blob::pcm(&[0, 1, 2, -1], 16_000)),
                ..RealtimeInput::default()
            }),
        ),
        (
            "send_realtime_input_text_video",
            ClientMessage::SendRealtimeInput(RealtimeInput {
                text: Some(r#"{"action":"button_click","buttonId":"ok"}"#.into()),
                video: Some(Blob {
                    mime_type: "image/jpeg".into(),
                    data: "/9j/4AAQ".into(),
                }),
                ..RealtimeInput::default()
            }),
        ),
        (
            "send_tool_response",
            ClientMessage::SendToolResponse(tool_response()),
        ),
        ("update_config", ClientMessage::UpdateConfig(config())),
        ("disconnect_gemini", ClientMessage::DisconnectGemini),
        (
            "webrtc_offer",
            ClientMessage::WebrtcOffer {
                sdp: "v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\n".into(),
            },
        ),
        (
            "webrtc_ice_candidate_flat",
            ClientMessage::WebrtcIceCandidate(ice(false)),
        ),
        (
            "webrtc_ice_candidate_nested",
            ClientMessage::WebrtcIceCandidate(ice(true)),
        ),
        (
            "generate_image",
            ClientMessage::GenerateImage {
                text: "a lighthouse at dusk".into(),
                image_data: None,
            },
        ),
        (
            "client_unknown",
            ClientMessage::Unknown {
                kind: "FUTURE_TYPE".into(),
                payload: Some(json!({"x": 1})),
            },
        ),
    ]
}

fn server_messages() -> Vec<(&'static str, ServerMessage)> {
    vec![
        ("gemini_connected", ServerMessage::GeminiConnected),
        (
            "gemini_disconnected",
            ServerMessage::GeminiDisconnected {
                reason: Some("client request".into()),
            },
        ),
        ("gemini_error_invalid_json", ServerMessage::invalid_json()),
        (
            "gemini_error_unknown_type",
            ServerMessage::unknown_type("FOO"),
        ),
        ("gemini_error_not_connected", ServerMessage::not_connected()),
        ("gemini_error_webrtc", ServerMessage::webrtc_unsupported()),
        (
            "content_message_audio",
            ServerMessage::ContentMessage(audio_content()),
        ),
        (
            "content_message_turn_complete",
            ServerMessage::ContentMessage(ServerContent {
                turn_complete: true,
                grounding_metadata: Some(json!({
                    "searchEntryPoint": {"renderedContent": "<div>chip</div>"}
                })),
                ..ServerContent::default()
            }),
        ),
        ("tool_call", ServerMessage::ToolCall(tool_call())),
        (
            "tool_call_cancellation",
            ServerMessage::ToolCallCancellation(ToolCallCancellation {
                ids: vec!["function-call-123".into()],
            }),
        ),
        ("setup_complete", ServerMessage::setup_ok()),
        (
            "setup_complete_failed",
            ServerMessage::setup_failed(Some(1008), "model not found"),
        ),
        ("interrupted", ServerMessage::Interrupted),
        ("turn_complete", ServerMessage::TurnComplete),
        (
            "audio_chunk",
            ServerMessage::AudioChunk {
                data: "AQD/fwCA".into(),
            },
        ),
        (
            "assistant_speaking",
            ServerMessage::AssistantSpeaking { speaking: true },
        ),
        (
            "webrtc_answer",
            ServerMessage::WebrtcAnswer {
                sdp: "v=0\r\n".into(),
            },
        ),
        (
            "server_ice_candidate",
            ServerMessage::WebrtcIceCandidate(ice(false)),
        ),
        (
            "log_message",
            ServerMessage::LogMessage(LogMessage {
                date: "2024-06-01T12:34:56.789Z".into(),
                level: "info".into(),
                message: "session ready".into(),
                details: None,
            }),
        ),
        (
            "image_generation_result",
            ServerMessage::ImageGenerationResult(ImageGenerationResult {
                success: true,
                image_url: Some("https://example.com/img.png".into()),
                image_data: None,
                error: None,
            }),
        ),
        (
            "server_unknown",
            ServerMessage::Unknown {
                kind: "FUTURE_EVENT".into(),
                payload: None,
            },
        ),
    ]
}

fn live_client_messages() -> Vec<(&'static str, LiveClientMessage)> {
    vec![
        ("live_setup", LiveClientMessage::Setup(config())),
        (
            "live_client_content",
            LiveClientMessage::ClientContent(ClientContent {
                turns: vec![Content {
                    role: Some("user".into()),
                    parts: vec![Part::text("Hello")],
                }],
                turn_complete: true,
            }),
        ),
        (
            "live_realtime_input_audio",
            LiveClientMessage::RealtimeInput(RealtimeInput {
                audio: Some(Blob::pcm(&[0, 1, 2, -1], 16_000)),
                ..RealtimeInput::default()
            }),
        ),
        (
            "live_realtime_input_activity",
            LiveClientMessage::RealtimeInput(RealtimeInput {
                activity_start: true,
                audio_stream_end: true,
                ..RealtimeInput::default()
            }),
        ),
        (
            "live_tool_response",
            LiveClientMessage::ToolResponse(tool_response()),
        ),
    ]
}

fn live_server_messages() -> Vec<(&'static str, LiveServerMessage)> {
    vec![
        (
            "live_setup_complete",
            LiveServerMessage::new(LiveServerEvent::SetupComplete),
        ),
        (
            "live_server_content",
            LiveServerMessage {
                event: LiveServerEvent::ServerContent(audio_content()),
                usage_metadata: Some(UsageMetadata {
                    prompt_token_count: Some(123),
                    response_token_count: Some(45),
                    total_token_count: Some(168),
                    response_tokens_details: vec![ModalityTokenCount {
                        modality: Some("AUDIO".into()),
                        token_count: Some(45),
                    }],
                    ..UsageMetadata::default()
                }),
            },
        ),
        (
            "live_tool_call",
            LiveServerMessage::new(LiveServerEvent::ToolCall(tool_call())),
        ),
        (
            "live_tool_call_cancellation",
            LiveServerMessage::new(LiveServerEvent::ToolCallCancellation(
                ToolCallCancellation {
                    ids: vec!["function-call-123".into()],
                },
            )),
        ),
        (
            "live_go_away",
            LiveServerMessage::new(LiveServerEvent::GoAway(GoAway {
                time_left: Some("50s".into()),
            })),
        ),
        (
            "live_session_resumption_update",
            LiveServerMessage::new(LiveServerEvent::SessionResumptionUpdate(
                SessionResumptionUpdate {
                    new_handle: Some("Cg0yMDI1".into()),
                    resumable: true,
                    last_consumed_client_message_index: Some(42),
                },
            )),
        ),
        (
            "live_usage_only",
            LiveServerMessage {
                event: LiveServerEvent::UsageOnly,
                usage_metadata: Some(UsageMetadata {
                    total_token_count: Some(7),
                    ..UsageMetadata::default()
                }),
            },
        ),
    ]
}

fn as_json(text: &str) -> Value {
    serde_json::from_str(text).unwrap()
}

#[test]
fn bridge_client_messages() {
    for (name, msg) in client_messages() {
        let text = msg.encode();
        insta::assert_json_snapshot!(name, as_json(&text));
        assert_eq!(ClientMessage::decode(&text).unwrap(), msg, "{name}");
    }
}

#[test]
fn bridge_server_messages() {
    for (name, msg) in server_messages() {
        let text = msg.encode();
        insta::assert_json_snapshot!(name, as_json(&text));
        assert_eq!(ServerMessage::decode(&text).unwrap(), msg, "{name}");
    }
}

#[test]
fn live_client() {
    for (name, msg) in live_client_messages() {
        let text = msg.encode();
        insta::assert_json_snapshot!(name, as_json(&text));
        assert_eq!(LiveClientMessage::decode(&text).unwrap(), msg, "{name}");
    }
}

#[test]
fn live_server() {
    for (name, msg) in live_server_messages() {
        let text = msg.encode();
        insta::assert_json_snapshot!(name, as_json(&text));
        assert_eq!(LiveServerMessage::decode(&text).unwrap(), msg, "{name}");
    }
}

#[test]
fn setup_complete_default_is_success() {
    assert!(SetupComplete::default().success);
}
