//! Real-client quirks from the bridge notes, decoded from golden frames under tests/data.
// Test helpers may unwrap and panic: a failure there is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::json;
use voxgate_gemini::bridge::IceMessage;
use voxgate_gemini::live::GoAway;
use voxgate_gemini::{
    Behavior, Blame, ClientMessage, DecodeError, LiveClientMessage, LiveServerEvent,
    LiveServerMessage, Modality, ServerMessage,
};

fn data(name: &str) -> String {
    let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn android_connect_with_all_nulls() {
    let ClientMessage::ConnectGemini { initial_config } =
        ClientMessage::decode(&data("android_connect_nulls.json")).unwrap()
    else {
        panic!("not CONNECT_GEMINI")
    };
    let config = initial_config.unwrap();
    assert_eq!(
        config.model.as_deref(),
        Some("models/gemini-2.0-flash-live-001")
    );
    assert!(
        config.wants_audio(),
        "a single \"AUDIO\" string is a list of one"
    );
    assert_eq!(config.voice_name(), Some("Aoede"));
    let gen_config = config.generation_config.as_ref().unwrap();
    assert_eq!(gen_config.temperature, None);
    assert_eq!(gen_config.stop_sequences, None);
    // A null tool and a null declaration are skipped, not errors.
    assert_eq!(config.tools.len(), 1);
    let decl = &config.tools[0].function_declarations;
    assert_eq!(decl.len(), 1);
    assert_eq!(decl[0].name, "create_canvas_tool");
    assert_eq!(decl[0].behavior, None);
    assert_eq!(config.tools[0].google_search, None);
    assert_eq!(
        config.system_instruction.unwrap().joined_text(),
        "You are a helpful assistant."
    );
}

#[test]
fn android_realtime_input_with_nulls() {
    let ClientMessage::SendRealtimeInput(input) =
        ClientMessage::decode(&data("android_realtime_nulls.json")).unwrap()
    else {
        panic!("not SEND_REALTIME_INPUT")
    };
    assert_eq!(input.text, None);
    assert_eq!(input.video, None);
    let mut pcm = Vec::new();
    let info = input.audio.unwrap().decode_pcm(&mut pcm).unwrap();
    assert_eq!(info.sample_rate, Some(16_000));
    assert_eq!(pcm, [0, 1, 2, -1, -1]);
}

#[test]
fn android_send_message_null_turn_complete_defaults_to_true() {
    let msg = ClientMessage::decode(&data("android_send_message_nulls.json")).unwrap();
    let ClientMessage::SendMessage {
        parts,
        turn_complete,
    } = msg
    else {
        panic!("not SEND_MESSAGE")
    };
    assert!(turn_complete);
    assert_eq!(
        parts[0].text.as_deref(),
        Some("Hello, what is the weather today?")
    );
    // Absent also defaults to true; explicit false is kept.
    let absent = r#"{"type":"SEND_MESSAGE","payload":{"parts":[{"text":"hi"}]}}"#;
    let explicit = r#"{"type":"SEND_MESSAGE","payload":{"parts":[],"turnComplete":false}}"#;
    assert!(matches!(
        ClientMessage::decode(absent).unwrap(),
        ClientMessage::SendMessage {
            turn_complete: true,
            ..
        }
    ));
    assert!(matches!(
        ClientMessage::decode(explicit).unwrap(),
        ClientMessage::SendMessage {
            turn_complete: false,
            ..
        }
    ));
}

#[test]
fn android_tool_response_with_nulls() {
    let ClientMessage::SendToolResponse(r) =
        ClientMessage::decode(&data("android_tool_response_nulls.json")).unwrap()
    else {
        panic!("not SEND_TOOL_RESPONSE")
    };
    let f = &r.function_responses[0];
    assert_eq!(f.id.as_deref(), Some("function-call-123"));
    assert_eq!(f.name, "getCurrentTime");
    assert_eq!(f.response, json!({"currentTime": "2024-06-01T12:34:56Z"}));
    assert_eq!(f.will_continue, None);
}

#[test]
fn deprecated_nested_tool_response_is_still_read() {
    let old = r#"{"type":"SEND_TOOL_RESPONSE","payload":{"parts":[{"functionResponse":
        {"id":"c1","name":"f","response":{"ok":true}}}]}}"#;
    let ClientMessage::SendToolResponse(r) = ClientMessage::decode(old).unwrap() else {
        panic!()
    };
    assert_eq!(r.function_responses[0].id.as_deref(), Some("c1"));
}

#[test]
fn ice_candidates_flat_and_nested() {
    let nested = ClientMessage::decode(&data("android_ice_nested.json")).unwrap();
    let flat = ClientMessage::decode(&data("seed_ice_flat.json")).unwrap();
    let (
        ClientMessage::WebrtcIceCandidate(IceMessage {
            candidate: a,
            nested: true,
        }),
        ClientMessage::WebrtcIceCandidate(IceMessage {
            candidate: b,
            nested: false,
        }),
    ) = (&nested, &flat)
    else {
        panic!("{nested:?} / {flat:?}")
    };
    assert_eq!(a, b);
    assert_eq!(a.sdp_m_line_index, Some(0));
    assert_eq!(a.sdp_mid.as_deref(), Some("0"));
    // Each is re-encoded in the form it came in.
    let again: serde_json::Value = serde_json::from_str(&nested.encode()).unwrap();
    assert!(again["payload"]["candidate"].is_object());
    let again: serde_json::Value = serde_json::from_str(&flat.encode()).unwrap();
    assert!(again["payload"]["candidate"].is_string());
}

#[test]
fn update_config_payload_is_the_config_itself() {
    let ClientMessage::UpdateConfig(config) =
        ClientMessage::decode(&data("update_config_lowercase_array.json")).unwrap()
    else {
        panic!("not UPDATE_CONFIG")
    };
    let g = config.generation_config.as_ref().unwrap();
    assert_eq!(
        g.response_modalities.as_deref(),
        Some(&[Modality::Text, Modality::Audio][..])
    );
    assert_eq!(g.temperature, Some(0.7));
    assert_eq!(g.top_k, Some(40));
    // An option this version does not model passes through.
    assert_eq!(
        config.extra.get("contextWindowCompression"),
        Some(&json!({"slidingWindow": {}}))
    );
    let encoded: serde_json::Value =
        serde_json::from_str(&LiveClientMessage::Setup(config).encode()).unwrap();
    assert_eq!(
        encoded["setup"]["contextWindowCompression"],
        json!({"slidingWindow": {}})
    );
    assert_eq!(
        encoded["setup"]["generationConfig"]["responseModalities"],
        json!(["TEXT", "AUDIO"])
    );
}

#[test]
fn legacy_media_chunks_first_chunk_is_used() {
    let ClientMessage::SendRealtimeInput(input) =
        ClientMessage::decode(&data("legacy_media_chunks.json")).unwrap()
    else {
        panic!()
    };
    assert_eq!(input.audio.unwrap().data, "AQD/fwCA");
    let image = r#"{"type":"SEND_REALTIME_INPUT","payload":{"chunks":[{"mimeType":"image/jpeg","data":"/9j/"}]}}"#;
    let ClientMessage::SendRealtimeInput(input) = ClientMessage::decode(image).unwrap() else {
        panic!()
    };
    assert_eq!(input.video.unwrap().mime_type, "image/jpeg");
    assert_eq!(input.audio, None);
}

#[test]
fn setup_complete_nested_flat_and_failed() {
    let nested = ServerMessage::decode(&data("original_setup_complete.json")).unwrap();
    assert_eq!(nested, ServerMessage::setup_ok());
    assert_eq!(
        nested.encode(),
        data("original_setup_complete.json").trim_end()
    );
    let flat = ServerMessage::decode(
        r#"{"type":"SETUP_COMPLETE","payload":{"success":false,"error":{"code":1008,"message":"bad model"}}}"#,
    )
    .unwrap();
    assert_eq!(flat, ServerMessage::setup_failed(Some(1008), "bad model"));
}

#[test]
fn original_audio_content_message() {
    let ServerMessage::ContentMessage(content) =
        ServerMessage::decode(&data("original_content_audio.json")).unwrap()
    else {
        panic!()
    };
    let blob = content.audio().next().unwrap();
    let mut pcm = [0i16; 4];
    let info = blob.decode_pcm_into(&mut pcm).unwrap();
    assert_eq!(info.sample_rate, Some(24_000));
    assert_eq!(&pcm[..info.samples], &[1, i16::MAX, i16::MIN]);
    assert!(ServerMessage::ContentMessage(content).is_droppable());
    assert!(!ServerMessage::TurnComplete.is_droppable());
}

#[test]
fn grounding_metadata_beside_server_content_is_folded_in() {
    let text = r#"{"type":"CONTENT_MESSAGE","payload":{"serverContent":{"turnComplete":true},
        "groundingMetadata":{"searchEntryPoint":{"renderedContent":"<div>chip</div>"}}}}"#;
    let ServerMessage::ContentMessage(c) = ServerMessage::decode(text).unwrap() else {
        panic!()
    };
    assert!(c.turn_complete);
    assert_eq!(
        c.grounding_metadata.unwrap()["searchEntryPoint"]["renderedContent"],
        "<div>chip</div>"
    );
}

#[test]
fn error_texts_clients_know() {
    let expect = |m: ServerMessage, text: &str| {
        let v: serde_json::Value = serde_json::from_str(&m.encode()).unwrap();
        assert_eq!(
            v,
            json!({"type": "GEMINI_ERROR", "payload": {"message": text}})
        );
    };
    expect(
        ServerMessage::invalid_json(),
        "Invalid JSON message received.",
    );
    expect(
        ServerMessage::unknown_type("FOO"),
        "Unknown message type: FOO",
    );
    expect(
        ServerMessage::not_connected(),
        "Gemini not connected. Send CONNECT_GEMINI first.",
    );
}

#[test]
fn bad_input_is_typed_by_blame_and_answered() {
    for (text, blame) in [
        ("not json", Blame::Malformed),
        ("[1,2,3]", Blame::Malformed),
        (r#"{"payload":{}}"#, Blame::Protocol),
        (
            r#"{"type":"SEND_MESSAGE","payload":{"parts":"oops"}}"#,
            Blame::Protocol,
        ),
        (r#"{"type":"UPDATE_CONFIG","payload":[1]}"#, Blame::Protocol),
    ] {
        let err = ClientMessage::decode(text).unwrap_err();
        assert_eq!(err.blame(), blame, "{text}");
        let ServerMessage::GeminiError { .. } = err.reply() else {
            panic!("reply to {text} is not GEMINI_ERROR")
        };
    }
    assert!(matches!(
        ClientMessage::decode_slice(b"{\"type\":\"\xff\"}"),
        Err(DecodeError::Json(_))
    ));
}

#[test]
fn unknown_types_are_data() {
    let msg = ClientMessage::decode(r#"{"type":"NEW_THING","payload":{"x":1}}"#).unwrap();
    assert_eq!(
        msg,
        ClientMessage::Unknown {
            kind: "NEW_THING".into(),
            payload: Some(json!({"x": 1}))
        }
    );
    assert_eq!(
        ServerMessage::unknown_type(msg.kind()),
        ServerMessage::error("Unknown message type: NEW_THING")
    );
    // groundingMetadata is a field, not a type: the seed's row decodes as unknown.
    assert!(matches!(
        ServerMessage::decode(r#"{"type":"groundingMetadata","payload":{}}"#).unwrap(),
        ServerMessage::Unknown { .. }
    ));
}

#[test]
fn payloadless_types_accept_null_or_missing_payload() {
    for text in [
        r#"{"type":"DISCONNECT_GEMINI"}"#,
        r#"{"type":"DISCONNECT_GEMINI","payload":null}"#,
        r#"{"type":"DISCONNECT_GEMINI","payload":{}}"#,
    ] {
        assert_eq!(
            ClientMessage::decode(text).unwrap(),
            ClientMessage::DisconnectGemini
        );
    }
    assert_eq!(
        ServerMessage::decode(r#"{"type":"INTERRUPTED","payload":{"reason":"barge-in"}}"#).unwrap(),
        ServerMessage::Interrupted
    );
    assert_eq!(
        ServerMessage::decode(r#"{"type":"TURN_COMPLETE","payload":null}"#).unwrap(),
        ServerMessage::TurnComplete
    );
}

#[test]
fn non_blocking_behavior_and_unknown_enum_values() {
    let text = r#"{"type":"UPDATE_CONFIG","payload":{"tools":[{"functionDeclarations":[
        {"name":"a","behavior":"NON_BLOCKING"},{"name":"b","behavior":"someday"}]}]}}"#;
    let ClientMessage::UpdateConfig(c) = ClientMessage::decode(text).unwrap() else {
        panic!()
    };
    let d = &c.tools[0].function_declarations;
    assert_eq!(d[0].behavior, Some(Behavior::NonBlocking));
    assert_eq!(d[1].behavior, Some(Behavior::Other("someday".into())));
}

#[test]
fn live_snake_case_and_int64_strings() {
    let msg = LiveServerMessage::decode(&data("live_server_content_snake.json")).unwrap();
    let LiveServerEvent::ServerContent(c) = &msg.event else {
        panic!()
    };
    assert!(c.turn_complete);
    assert_eq!(c.text(), "Hi there");
    assert_eq!(c.output_transcription.as_ref().unwrap().text, "Hi there");
    let usage = msg.usage_metadata.as_ref().unwrap();
    assert_eq!(usage.prompt_token_count, Some(123));
    assert_eq!(usage.response_token_count, Some(45));
    assert_eq!(usage.total_token_count, Some(168));
    assert_eq!(usage.response_tokens_details[0].token_count, Some(45));

    let msg = LiveServerMessage::decode(&data("live_session_resumption.json")).unwrap();
    let LiveServerEvent::SessionResumptionUpdate(u) = &msg.event else {
        panic!()
    };
    // Beyond 2^53: only exact as a string.
    assert_eq!(
        u.last_consumed_client_message_index,
        Some(9_007_199_254_740_993)
    );
    assert!(u.resumable);
    let v: serde_json::Value = serde_json::from_str(&msg.encode()).unwrap();
    assert_eq!(
        v["sessionResumptionUpdate"]["lastConsumedClientMessageIndex"],
        "9007199254740993"
    );
}

#[test]
fn live_go_away_and_tool_call() {
    let msg = LiveServerMessage::decode(&data("live_go_away.json")).unwrap();
    let LiveServerEvent::GoAway(g) = &msg.event else {
        panic!()
    };
    assert_eq!(
        g.time_left_duration(),
        Some(std::time::Duration::from_secs(50))
    );
    let g = GoAway {
        time_left: Some("0.25s".into()),
    };
    assert_eq!(
        g.time_left_duration(),
        Some(std::time::Duration::from_millis(250))
    );

    let msg = LiveServerMessage::decode(&data("live_tool_call.json")).unwrap();
    let LiveServerEvent::ToolCall(call) = &msg.event else {
        panic!()
    };
    assert_eq!(call.function_calls[0].name, "get_weather");
    assert_eq!(
        call.function_calls[0].args,
        Some(json!({"location": "London"}))
    );
}

#[test]
fn live_unknown_keys_usage_only_and_errors() {
    let msg =
        LiveServerMessage::decode(r#"{"voiceActivity":{"voiceActivityType":"ACTIVITY_START"}}"#)
            .unwrap();
    assert!(
        matches!(msg.event, LiveServerEvent::Unknown { ref key, .. } if key == "voiceActivity")
    );
    let msg = LiveServerMessage::decode(r#"{"usageMetadata":{"totalTokenCount":3}}"#).unwrap();
    assert_eq!(msg.event, LiveServerEvent::UsageOnly);
    assert_eq!(
        LiveServerMessage::decode("{}").unwrap_err().blame(),
        Blame::Protocol
    );
    assert_eq!(
        LiveServerMessage::decode("{").unwrap_err().blame(),
        Blame::Malformed
    );
    assert_eq!(
        LiveServerMessage::decode(r#"{"serverContent":{"turnComplete":"yes"}}"#)
            .unwrap_err()
            .blame(),
        Blame::Protocol
    );
    let msg = LiveClientMessage::decode(
        r#"{"realtime_input":{"activity_start":{},"audio_stream_end":null}}"#,
    )
    .unwrap();
    let LiveClientMessage::RealtimeInput(r) = msg else {
        panic!()
    };
    assert!(r.activity_start);
    assert!(!r.activity_end);
    assert!(!r.audio_stream_end);
}

/// Kotlin serialization writes every unset field as `null`: each type decodes with every
/// field of its payload (and of nested objects) null.
#[test]
fn every_payload_field_null() {
    let client = [
        r#"{"type":"CONNECT_GEMINI","payload":{"initialConfig":null}}"#,
        r#"{"type":"CONNECT_GEMINI","payload":{"initialConfig":{"model":null,"systemInstruction":null,"generationConfig":null,"tools":null,"safetySettings":null,"realtimeInputConfig":null,"sessionResumption":null,"inputAudioTranscription":null,"outputAudioTranscription":null}}}"#,
        r#"{"type":"SEND_MESSAGE","payload":{"parts":null,"turnComplete":null}}"#,
        r#"{"type":"SEND_MESSAGE","payload":{"parts":[{"text":null,"inlineData":null,"functionCall":null,"functionResponse":null,"fileData":null,"executableCode":null,"codeExecutionResult":null,"thought":null,"thoughtSignature":null,"videoMetadata":null}]}}"#,
        r#"{"type":"SEND_REALTIME_INPUT","payload":{"text":null,"audio":null,"video":null,"chunks":null,"mediaChunks":null,"activityStart":null,"activityEnd":null,"audioStreamEnd":null}}"#,
        r#"{"type":"SEND_REALTIME_INPUT","payload":{"audio":{"mimeType":null,"data":null}}}"#,
        r#"{"type":"SEND_TOOL_RESPONSE","payload":{"toolResponse":null}}"#,
        r#"{"type":"SEND_TOOL_RESPONSE","payload":{"toolResponse":{"functionResponses":[{"id":null,"name":null,"response":null,"willContinue":null,"scheduling":null}]}}}"#,
        r#"{"type":"UPDATE_CONFIG","payload":{"generationConfig":{"temperature":null,"topK":null,"topP":null,"maxOutputTokens":null,"candidateCount":null,"stopSequences":null,"responseModalities":null,"speechConfig":{"voiceConfig":{"prebuiltVoiceConfig":{"voiceName":null}},"languageCode":null}}}}"#,
        r#"{"type":"UPDATE_CONFIG","payload":{"tools":[{"functionDeclarations":[{"name":null,"description":null,"parameters":null,"behavior":null}],"googleSearch":null,"codeExecution":null}]}}"#,
        r#"{"type":"UPDATE_CONFIG","payload":null}"#,
        r#"{"type":"WEBRTC_OFFER","payload":{"sdp":null}}"#,
        r#"{"type":"WEBRTC_ICE_CANDIDATE","payload":{"candidate":null,"sdpMid":null,"sdpMLineIndex":null,"usernameFragment":null}}"#,
        r#"{"type":"WEBRTC_ICE_CANDIDATE","payload":{"candidate":{"candidate":null,"sdpMid":null,"sdpMLineIndex":null}}}"#,
        r#"{"type":"GENERATE_IMAGE","payload":{"text":null,"imageData":null}}"#,
    ];
    for text in client {
        ClientMessage::decode(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    }
    let server = [
        r#"{"type":"GEMINI_DISCONNECTED","payload":{"reason":null}}"#,
        r#"{"type":"GEMINI_ERROR","payload":{"message":null,"details":null}}"#,
        r#"{"type":"CONTENT_MESSAGE","payload":{"serverContent":{"modelTurn":null,"turnComplete":null,"interrupted":null,"generationComplete":null,"inputTranscription":null,"outputTranscription":{"text":null,"finished":null},"groundingMetadata":null,"urlContextMetadata":null,"turnCompleteReason":null,"waitingForInput":null,"usageMetadata":null}}}"#,
        r#"{"type":"TOOL_CALL","payload":{"toolCall":{"functionCalls":[{"id":null,"name":null,"args":null},null]}}}"#,
        r#"{"type":"TOOL_CALL_CANCELLATION","payload":{"toolCallCancellation":{"ids":[null,"a"]}}}"#,
        r#"{"type":"SETUP_COMPLETE","payload":{"setupComplete":{"success":null,"error":null}}}"#,
        r#"{"type":"SETUP_COMPLETE","payload":{"setupComplete":{"success":false,"error":{"code":null,"message":null,"details":null}}}}"#,
        r#"{"type":"AUDIO_CHUNK","payload":{"data":null}}"#,
        r#"{"type":"ASSISTANT_SPEAKING","payload":{"speaking":null}}"#,
        r#"{"type":"WEBRTC_ANSWER","payload":{"sdp":null}}"#,
        r#"{"type":"LOG_MESSAGE","payload":{"date":null,"type":null,"message":null,"details":null}}"#,
        r#"{"type":"IMAGE_GENERATION_RESULT","payload":{"success":null,"imageUrl":null,"imageData":null,"error":null}}"#,
    ];
    for text in server {
        ServerMessage::decode(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    }
    let live = [
        r#"{"sessionResumptionUpdate":{"newHandle":null,"resumable":null,"lastConsumedClientMessageIndex":null},"usageMetadata":null}"#,
        r#"{"goAway":{"timeLeft":null}}"#,
        r#"{"usageMetadata":{"promptTokenCount":null,"totalTokenCount":null,"promptTokensDetails":null}}"#,
    ];
    for text in live {
        LiveServerMessage::decode(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    }
}
