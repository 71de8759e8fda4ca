//! Property tests: every message decodes back to itself after encoding, and no shape of JSON
//! makes a decoder panic.
// Test helpers may unwrap and panic: a failure there is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use proptest::prelude::*;
use serde_json::{Map, Value, json};
use voxgate_gemini::bridge::{IceCandidate, IceMessage, ImageGenerationResult, LogMessage};
use voxgate_gemini::live::{ClientContent, GoAway, SessionResumptionUpdate};
use voxgate_gemini::{
    Blob, ClientMessage, Content, FunctionCall, FunctionResponse, GenerationConfig,
    LiveClientMessage, LiveConfig, LiveServerEvent, LiveServerMessage, Modality, Part,
    RealtimeInput, ServerContent, ServerMessage, ToolCall, ToolCallCancellation, ToolResponse,
    Transcription, UsageMetadata,
};

fn text() -> impl Strategy<Value = String> {
    "\\PC{0,12}"
}

fn object() -> impl Strategy<Value = Value> {
    proptest::collection::btree_map(
        "[a-z]{1,6}",
        prop_oneof![
            any::<i64>().prop_map(Value::from),
            text().prop_map(Value::from),
            any::<bool>().prop_map(Value::from),
        ],
        0..4,
    )
    .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>()))
}

fn blob() -> impl Strategy<Value = Blob> {
    (
        proptest::collection::vec(any::<i16>(), 0..20),
        prop::sample::select(vec![8_000u32, 16_000, 24_000]),
    )
        .prop_map(|(s, rate)| Blob::pcm(&s, rate))
}

fn function_call() -> impl Strategy<Value = FunctionCall> {
    (
        proptest::option::of(text()),
        text(),
        proptest::option::of(object()),
    )
        .prop_map(|(id, name, args)| FunctionCall { id, name, args })
}

fn function_response() -> impl Strategy<Value = FunctionResponse> {
    (
        proptest::option::of(text()),
        text(),
        object(),
        proptest::option::of(any::<bool>()),
    )
        .prop_map(|(id, name, response, will_continue)| FunctionResponse {
            id,
            name,
            response,
            will_continue,
            scheduling: None,
        })
}

fn part() -> impl Strategy<Value = Part> {
    prop_oneof![
        text().prop_map(Part::text),
        blob().prop_map(Part::inline),
        function_call().prop_map(|c| Part {
            function_call: Some(c),
            ..Part::default()
        }),
        function_response().prop_map(|r| Part {
            function_response: Some(r),
            ..Part::default()
        }),
    ]
}

fn content() -> impl Strategy<Value = Content> {
    (
        proptest::option::of(prop::sample::select(vec!["user", "model"])),
        proptest::collection::vec(part(), 0..3),
    )
        .prop_map(|(role, parts)| Content {
            role: role.map(str::to_owned),
            parts,
        })
}

fn config() -> impl Strategy<Value = LiveConfig> {
    (
        proptest::option::of(text()),
        proptest::option::of(text()),
        proptest::option::of(0u32..8),
        proptest::option::of(proptest::collection::vec(
            prop::sample::select(vec![Modality::Text, Modality::Audio, Modality::Image]),
            0..3,
        )),
        proptest::option::of(object()),
    )
        .prop_map(|(model, system, quarter, modalities, vad)| LiveConfig {
            model,
            system_instruction: system.map(Content::text),
            generation_config: Some(GenerationConfig {
                temperature: quarter.map(|q| f64::from(q) / 4.0),
                response_modalities: modalities,
                ..GenerationConfig::default()
            }),
            realtime_input_config: vad,
            ..LiveConfig::default()
        })
}

fn realtime_input() -> impl Strategy<Value = RealtimeInput> {
    (
        proptest::option::of(blob()),
        proptest::option::of(text()),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(audio, text, start, end, stream_end)| RealtimeInput {
            audio,
            video: None,
            text,
            activity_start: start,
            activity_end: end,
            audio_stream_end: stream_end,
        })
}

fn tool_response() -> impl Strategy<Value = ToolResponse> {
    proptest::collection::vec(function_response(), 0..3)
        .prop_map(|function_responses| ToolResponse { function_responses })
}

fn ice() -> impl Strategy<Value = IceMessage> {
    (
        proptest::option::of(text()),
        proptest::option::of(text()),
        proptest::option::of(0u32..4),
        any::<bool>(),
    )
        .prop_map(|(candidate, sdp_mid, idx, nested)| IceMessage {
            candidate: IceCandidate {
                candidate,
                sdp_mid,
                sdp_m_line_index: idx,
                username_fragment: None,
            },
            nested,
        })
}

fn client_message() -> impl Strategy<Value = ClientMessage> {
    prop_oneof![
        proptest::option::of(config())
            .prop_map(|initial_config| ClientMessage::ConnectGemini { initial_config }),
        (proptest::collection::vec(part(), 0..3), any::<bool>()).prop_map(
            |(parts, turn_complete)| ClientMessage::SendMessage {
                parts,
                turn_complete
            }
        ),
        realtime_input().prop_map(ClientMessage::SendRealtimeInput),
        tool_response().prop_map(ClientMessage::SendToolResponse),
        config().prop_map(ClientMessage::UpdateConfig),
        Just(ClientMessage::DisconnectGemini),
        text().prop_map(|sdp| ClientMessage::WebrtcOffer { sdp }),
        ice().prop_map(ClientMessage::WebrtcIceCandidate),
        (text(), proptest::option::of(text()))
            .prop_map(|(text, image_data)| ClientMessage::GenerateImage { text, image_data }),
        ("x_[a-z_]{0,8}", proptest::option::of(object()))
            .prop_map(|(kind, payload)| ClientMessage::Unknown { kind, payload }),
    ]
}

fn server_content() -> impl Strategy<Value = ServerContent> {
    (
        proptest::option::of(content()),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        proptest::option::of(text()),
        proptest::option::of(object()),
    )
        .prop_map(
            |(model_turn, turn_complete, interrupted, generation_complete, tr, grounding)| {
                ServerContent {
                    model_turn,
                    turn_complete,
                    interrupted,
                    generation_complete,
                    output_transcription: tr.map(|text| Transcription {
                        text,
                        finished: None,
                    }),
                    grounding_metadata: grounding,
                    ..ServerContent::default()
                }
            },
        )
}

fn server_message() -> impl Strategy<Value = ServerMessage> {
    prop_oneof![
        Just(ServerMessage::GeminiConnected),
        proptest::option::of(text())
            .prop_map(|reason| ServerMessage::GeminiDisconnected { reason }),
        (text(), proptest::option::of(object()))
            .prop_map(|(message, details)| ServerMessage::GeminiError { message, details }),
        server_content().prop_map(ServerMessage::ContentMessage),
        proptest::collection::vec(function_call(), 0..3)
            .prop_map(|function_calls| ServerMessage::ToolCall(ToolCall { function_calls })),
        proptest::collection::vec(text(), 0..3)
            .prop_map(|ids| { ServerMessage::ToolCallCancellation(ToolCallCancellation { ids }) }),
        Just(ServerMessage::setup_ok()),
        (proptest::option::of(any::<i64>()), text())
            .prop_map(|(code, m)| ServerMessage::setup_failed(code, m)),
        Just(ServerMessage::Interrupted),
        Just(ServerMessage::TurnComplete),
        blob().prop_map(|b| ServerMessage::AudioChunk { data: b.data }),
        any::<bool>().prop_map(|speaking| ServerMessage::AssistantSpeaking { speaking }),
        text().prop_map(|sdp| ServerMessage::WebrtcAnswer { sdp }),
        ice().prop_map(ServerMessage::WebrtcIceCandidate),
        (text(), text(), text()).prop_map(|(date, level, message)| {
            ServerMessage::LogMessage(LogMessage {
                date,
                level,
                message,
                details: None,
            })
        }),
        (
            any::<bool>(),
            proptest::option::of(text()),
            proptest::option::of(text())
        )
            .prop_map(|(success, image_url, error)| {
                ServerMessage::ImageGenerationResult(ImageGenerationResult {
                    success,
                    image_url,
                    image_data: None,
                    error,
                })
            }),
    ]
}

fn live_client_message() -> impl Strategy<Value = LiveClientMessage> {
    prop_oneof![
        config().prop_map(LiveClientMessage::Setup),
        (proptest::collection::vec(content(), 0..3), any::<bool>()).prop_map(
            |(turns, turn_complete)| LiveClientMessage::ClientContent(ClientContent {
                turns,
                turn_complete
            })
        ),
        realtime_input().prop_map(LiveClientMessage::RealtimeInput),
        tool_response().prop_map(LiveClientMessage::ToolResponse),
    ]
}

fn live_server_message() -> impl Strategy<Value = LiveServerMessage> {
    let event = prop_oneof![
        Just(LiveServerEvent::SetupComplete),
        server_content().prop_map(LiveServerEvent::ServerContent),
        proptest::collection::vec(function_call(), 0..3)
            .prop_map(|function_calls| LiveServerEvent::ToolCall(ToolCall { function_calls })),
        proptest::collection::vec(text(), 0..3)
            .prop_map(|ids| LiveServerEvent::ToolCallCancellation(ToolCallCancellation { ids })),
        proptest::option::of(0u32..100).prop_map(|s| LiveServerEvent::GoAway(GoAway {
            time_left: s.map(|s| format!("{s}s"))
        })),
        (
            proptest::option::of(text()),
            any::<bool>(),
            proptest::option::of(any::<u64>())
        )
            .prop_map(|(new_handle, resumable, idx)| {
                LiveServerEvent::SessionResumptionUpdate(SessionResumptionUpdate {
                    new_handle,
                    resumable,
                    last_consumed_client_message_index: idx,
                })
            }),
    ];
    (event, proptest::option::of((any::<u64>(), any::<u32>()))).prop_map(|(event, usage)| {
        LiveServerMessage {
            event,
            usage_metadata: usage.map(|(total, prompt)| UsageMetadata {
                total_token_count: Some(total),
                prompt_token_count: Some(u64::from(prompt)),
                ..UsageMetadata::default()
            }),
        }
    })
}

/// Arbitrary JSON, for "never panics" checks.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        text().prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map(
                prop::sample::select(vec![
                    "parts",
                    "audio",
                    "data",
                    "mimeType",
                    "turnComplete",
                    "initialConfig",
                    "generationConfig",
                    "responseModalities",
                    "candidate",
                    "toolResponse",
                    "functionResponses",
                    "serverContent",
                    "setupComplete",
                    "usageMetadata",
                    "topK",
                    "mediaChunks",
                    "sdpMLineIndex",
                    "model",
                    "x",
                ])
                .prop_map(str::to_owned),
                inner,
                0..4
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn client_messages_round_trip(msg in client_message()) {
        prop_assert_eq!(ClientMessage::decode(&msg.encode()).unwrap(), msg);
    }

    #[test]
    fn server_messages_round_trip(msg in server_message()) {
        prop_assert_eq!(ServerMessage::decode(&msg.encode()).unwrap(), msg);
    }

    #[test]
    fn live_client_messages_round_trip(msg in live_client_message()) {
        prop_assert_eq!(LiveClientMessage::decode(&msg.encode()).unwrap(), msg);
    }

    #[test]
    fn live_server_messages_round_trip(msg in live_server_message()) {
        prop_assert_eq!(LiveServerMessage::decode(&msg.encode()).unwrap(), msg);
    }

    #[test]
    fn bridge_decoders_never_panic(
        kind in prop::sample::select(vec![
            "CONNECT_GEMINI", "SEND_MESSAGE", "SEND_REALTIME_INPUT", "SEND_TOOL_RESPONSE",
            "UPDATE_CONFIG", "WEBRTC_ICE_CANDIDATE", "GENERATE_IMAGE", "CONTENT_MESSAGE",
            "TOOL_CALL", "SETUP_COMPLETE", "LOG_MESSAGE", "IMAGE_GENERATION_RESULT", "OTHER",
        ]),
        payload in any_json(),
    ) {
        let frame = json!({"type": kind, "payload": payload}).to_string();
        let _ = ClientMessage::decode(&frame);
        let _ = ServerMessage::decode(&frame);
    }

    #[test]
    fn live_decoders_never_panic(
        key in prop::sample::select(vec![
            "setup", "clientContent", "realtimeInput", "toolResponse", "serverContent",
            "toolCall", "toolCallCancellation", "goAway", "sessionResumptionUpdate",
            "usageMetadata", "setupComplete", "other",
        ]),
        value in any_json(),
    ) {
        let frame = json!({ key: value }).to_string();
        let _ = LiveClientMessage::decode(&frame);
        let _ = LiveServerMessage::decode(&frame);
    }
}
