//! Golden vectors serialized by the reference Python client (`cargo xtask golden`): every one
//! decodes to the expected values, validates, and re-encodes to the very same bytes.

#![allow(
    clippy::unwrap_used,
    clippy::panic,
    reason = "test helpers: a panic is a failed assertion"
)]

use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use serde_json::json;
use voxgate_realtime::proto::chat_message_content::Content;
use voxgate_realtime::proto::client_bound_message::Payload as C;
use voxgate_realtime::proto::hosted_tts_configuration::Voice;
use voxgate_realtime::proto::service_bound_message::Payload as S;
use voxgate_realtime::proto::user_input::Input;
use voxgate_realtime::proto::*;
use voxgate_realtime::{
    AudioFormat, ClientBoundMessage, HostedVoice, Open, ServiceBoundMessage, SessionConfig,
    SessionUpdate, TtsSettings, json,
};

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

fn load(name: &str) -> Bytes {
    let path = data_dir().join(format!("{name}.bin"));
    Bytes::from(fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

/// Decodes, validates and checks the byte-identical re-encoding.
fn service(name: &str) -> S {
    let bytes = load(name);
    let msg = ServiceBoundMessage::decode_frame(bytes.clone()).unwrap();
    msg.validate().unwrap();
    assert_eq!(msg.to_frame(), bytes, "{name} re-encodes differently");
    msg.payload.unwrap()
}

fn client(name: &str) -> C {
    let bytes = load(name);
    let msg = ClientBoundMessage::decode_frame(bytes.clone()).unwrap();
    msg.validate().unwrap();
    assert_eq!(msg.to_frame(), bytes, "{name} re-encodes differently");
    msg.payload.unwrap()
}

/// The generator's deterministic audio (see `pcm` in realtime_golden.py).
fn pcm(len: usize, seed: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i * 31 + seed * 17 + (i >> 3)) & 0xff).to_le_bytes()[0])
        .collect()
}

fn line(rate: u32, channels: u32, format: SampleFormat) -> Option<AudioLineConfiguration> {
    Some(AudioLineConfiguration {
        sample_rate: rate,
        channel_count: channels,
        sample_format: format.into(),
    })
}

#[test]
fn every_vector_is_covered() {
    let files: BTreeSet<String> = fs::read_dir(data_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter_map(|n| n.strip_suffix(".bin").map(str::to_owned))
        .collect();
    let tested: BTreeSet<String> = TESTED.iter().map(|s| (*s).to_owned()).collect();
    assert_eq!(
        files, tested,
        "a vector without a test, or a test without a vector"
    );
}

/// Every vector this file checks; `every_vector_is_covered` keeps it honest.
const TESTED: &[&str] = &[
    "service_initialize_full",
    "service_initialize_hosted_clone",
    "service_initialize_hosted_ref",
    "service_reconfigure",
    "service_reconfigure_empty",
    "service_user_input_audio",
    "service_user_input_text",
    "service_update_tools",
    "service_tool_call_response",
    "service_trigger_inference",
    "service_export_chat_history",
    "service_playback_report",
    "service_direct_speech",
    "service_conversation_query",
    "service_ping",
    "client_tool_call_request",
    "client_model_text_fragment",
    "client_model_audio_chunk",
    "client_playback_clear_buffer",
    "client_response_begin",
    "client_response_end",
    "client_chat_history",
    "client_error",
    "client_user_transcription_result",
    "client_conversation_query_result",
    "client_session_ready",
    "client_vad_analysis_frame",
    "client_vad_state_event",
    "client_context_truncated",
    "client_pong",
    "client_model_speech_progress",
    "client_turn_snapshot",
    "client_inference_complete",
];

#[test]
fn initialize_full() {
    let S::InitializeSessionRequest(r) = service("service_initialize_full") else {
        panic!()
    };
    assert_eq!(
        r.input_audio_line,
        line(16_000, 1, SampleFormat::Signed16Bit)
    );
    assert_eq!(
        r.output_audio_line,
        line(24_000, 2, SampleFormat::Float32Bit)
    );
    let vad = r.vad_configuration.unwrap();
    assert_eq!(vad.confidence_threshold, 0.625);
    assert_eq!(vad.min_volume, 0.125);
    assert_eq!(vad.start_duration.unwrap().nanos, 150_000_000);
    assert_eq!(vad.stop_duration.unwrap().nanos, 390_000_000);
    assert_eq!(
        vad.backbuffer_duration,
        Some(voxgate_realtime::proto::Duration {
            seconds: 1,
            nanos: 500
        })
    );
    let inference = r.inference_configuration.as_ref().unwrap();
    assert_eq!(
        inference.system_prompt,
        "You are a helpful assistant. Antworte auf Deutsch, bitte. \u{2764}"
    );
    assert_eq!(inference.temperature, 0.3);
    let Some(tts_configuration::Provider::ElevenLabs(el)) =
        &r.tts_configuration.as_ref().unwrap().provider
    else {
        panic!()
    };
    assert_eq!(el.api_key, "sk_test_0123456789abcdef");
    assert_eq!(el.voice_id, "21m00Tcm4TlvDq8ikWAM");
    assert_eq!(el.model_id.as_deref(), Some("eleven_turbo_v2"));
    assert_eq!(el.location_open(), Open::Known(ElevenLabsLocation::Eu));
    assert_eq!(
        el.voice_settings,
        Some(ElevenLabsVoiceSettings {
            stability: 0.5,
            similarity_boost: 0.75,
            style: 0.1,
            use_speaker_boost: true,
            speed: 1.1,
        })
    );
    assert!(r.supports_playback_reporting);
    assert!(r.enable_vad_frame_telemetry);

    let config = SessionConfig::from_wire(&r).unwrap();
    assert_eq!(config.input, AudioFormat::SPEECH_16K);
    assert_eq!(config.output.channels(), 2);
    assert_eq!(config.vad.backbuffer_duration(), Duration::new(1, 500));
    let expected = json!({
        "flag": true,
        "ratio": 0.75,
        "name": "beta",
        "nothing": null,
        "list": [1, "two", false, null],
        "nested": {"a": {"b": 3, "c": [0.5]}},
    });
    let experiments = serde_json::Value::Object(config.experiments.clone().into_iter().collect());
    assert_eq!(experiments, expected);
    let Some(TtsSettings::ElevenLabs(el)) = &config.tts else {
        panic!()
    };
    assert_eq!(el.voice_settings().unwrap().speed(), 1.1);
    // The checked configuration writes back exactly what the reference client sent.
    assert_eq!(config.to_wire().unwrap(), r);
}

#[test]
fn initialize_hosted_clone() {
    let S::InitializeSessionRequest(r) = service("service_initialize_hosted_clone") else {
        panic!()
    };
    let config = SessionConfig::from_wire(&r).unwrap();
    assert_eq!(config.input.sample_format(), SampleFormat::Signed32Bit);
    assert_eq!(config.output.sample_rate(), 22_050);
    assert_eq!(config.inference.temperature(), 1.25);
    let Some(TtsSettings::Hosted(hosted)) = &config.tts else {
        panic!()
    };
    assert_eq!(hosted.mode, HostedTtsMode::LowLatency);
    let HostedVoice::Clone(clone) = &hosted.voice else {
        panic!()
    };
    assert_eq!(clone.audio()[..], pcm(960, 3)[..]);
    assert_eq!(clone.format(), AudioFormat::SPEECH_16K);
    assert_eq!(
        clone.ref_text(),
        "The quick brown fox jumps over the lazy dog."
    );
    assert_eq!(config.to_wire().unwrap(), r);
}

#[test]
fn initialize_hosted_ref() {
    let S::InitializeSessionRequest(r) = service("service_initialize_hosted_ref") else {
        panic!()
    };
    let Some(tts_configuration::Provider::Hosted(h)) =
        &r.tts_configuration.as_ref().unwrap().provider
    else {
        panic!()
    };
    assert_eq!(
        h.voice,
        Some(Voice::VoiceRef(HostedVoiceRef {
            voice_id: "nova".into()
        }))
    );
    assert_eq!(h.mode_open(), Open::Known(HostedTtsMode::HighQuality));
    let config = SessionConfig::from_wire(&r).unwrap();
    assert_eq!(config.input, AudioFormat::SPEECH_24K);
    assert_eq!(config.vad, voxgate_realtime::VadSettings::default());
    // min_volume is 0 on the wire, so it is not written; everything else is explicit.
    assert_eq!(config.to_wire().unwrap(), r);
}

#[test]
fn reconfigure() {
    let S::ReconfigureSessionRequest(r) = service("service_reconfigure") else {
        panic!()
    };
    let update = SessionUpdate::from_wire(&r).unwrap();
    assert_eq!(
        update.input,
        Some(AudioFormat::new(8_000, 1, SampleFormat::Unsigned8Bit).unwrap())
    );
    let inference = update.inference.as_ref().unwrap();
    assert_eq!(inference.system_prompt(), "Speak like a pirate.");
    assert_eq!(inference.temperature(), 0.9);
    assert_eq!(update.to_wire(), r);

    let S::ReconfigureSessionRequest(r) = service("service_reconfigure_empty") else {
        panic!()
    };
    assert_eq!(
        SessionUpdate::from_wire(&r).unwrap(),
        SessionUpdate::default()
    );
}

#[test]
fn user_input_audio() {
    let bytes = load("service_user_input_audio");
    let S::UserInput(input) = service("service_user_input_audio") else {
        panic!()
    };
    assert_eq!(input.packet_id, 42);
    assert_eq!(
        input.mode_open(),
        Open::Known(InferenceTriggerMode::Immediate)
    );
    let Some(Input::AudioData(audio)) = input.input else {
        panic!()
    };
    assert_eq!(audio.data[..], pcm(640, 0)[..]);
    assert_eq!(
        ServiceBoundMessage::user_audio(42, InferenceTriggerMode::Immediate, audio.data).to_frame(),
        bytes
    );
}

#[test]
fn user_input_text() {
    let S::UserInput(input) = service("service_user_input_text") else {
        panic!()
    };
    assert_eq!(input.packet_id, 43);
    assert_eq!(input.mode_open(), Open::Known(InferenceTriggerMode::Queue));
    assert_eq!(
        input.input,
        Some(Input::TextData(TextData {
            data: "Wie spät ist es? \u{1f570}".into()
        }))
    );
}

#[test]
fn update_tools() {
    let bytes = load("service_update_tools");
    let S::UpdateToolDefinitionsRequest(update) = service("service_update_tools") else {
        panic!()
    };
    let [weather, hang_up] = &update.tool_definitions[..] else {
        panic!()
    };
    assert_eq!(weather.name, "get_weather");
    assert_eq!(
        weather.description.as_deref(),
        Some("Weather forecast for a location")
    );
    let schema = json!({
        "type": "object",
        "properties": {
            "location": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name"},
                    "country": {"type": "string", "minLength": 2, "maxLength": 2},
                },
                "required": ["city"],
            },
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
            "hourly": {"type": "boolean"},
            "note": {"type": ["string", "null"], "default": null},
        },
        "required": ["location"],
        "additionalProperties": false,
    });
    let parsed = json::struct_to_json(weather.parameters.as_ref().unwrap()).unwrap();
    assert_eq!(serde_json::Value::Object(parsed), schema);
    assert_eq!(hang_up.name, "hang_up");
    assert_eq!(hang_up.description, None);

    // Built from JSON with our helpers, the request encodes exactly like Python's.
    let rebuilt = ServiceBoundMessage::update_tools(vec![
        ToolDefinition::from_json(
            "get_weather",
            Some("Weather forecast for a location".into()),
            &schema,
        )
        .unwrap(),
        ToolDefinition::from_json(
            "hang_up",
            None,
            &json!({"type": "object", "properties": {}}),
        )
        .unwrap(),
    ]);
    assert_eq!(rebuilt.to_frame(), bytes);
}

#[test]
fn small_service_messages() {
    assert_eq!(
        service("service_tool_call_response"),
        S::ToolCallResponse(ToolCallResponse {
            id: "call_7".into(),
            result: r#"{"temp_c": 21}"#.into()
        })
    );
    assert_eq!(
        service("service_trigger_inference"),
        S::TriggerInference(TriggerInference {
            extra_instructions: Some("Greet the user by name.".into()),
            flush_vad: true
        })
    );
    assert_eq!(
        service("service_export_chat_history"),
        S::ExportChatHistoryRequest(ExportChatHistoryRequest {
            await_pending: true,
            exclude_audio: true
        })
    );
    assert_eq!(
        service("service_playback_report"),
        S::PlaybackPositionReport(PlaybackPositionReport {
            bytes_played: 96_000,
            turn_id: Some(2)
        })
    );
    assert_eq!(
        service("service_direct_speech"),
        S::DirectSpeech(DirectSpeech {
            text: "Please hold.".into(),
            include_in_history: false,
            uninterruptable: true
        })
    );
    assert_eq!(
        service("service_conversation_query"),
        S::ConversationQuery(ConversationQuery {
            prompt: Some("You summarise calls.".into()),
            instructions: Some("Summarise in one sentence.".into())
        })
    );
    assert_eq!(service("service_ping"), S::Ping(Ping {}));

    // The constructors produce the same bytes as the reference client.
    for (name, msg) in [
        (
            "service_tool_call_response",
            ServiceBoundMessage::tool_call_response("call_7", r#"{"temp_c": 21}"#),
        ),
        (
            "service_trigger_inference",
            ServiceBoundMessage::trigger_inference(Some("Greet the user by name.".into()), true),
        ),
        (
            "service_export_chat_history",
            ServiceBoundMessage::export_chat_history(true, true),
        ),
        (
            "service_playback_report",
            ServiceBoundMessage::playback_report(96_000, Some(2)),
        ),
        (
            "service_direct_speech",
            ServiceBoundMessage::direct_speech("Please hold.", false, true),
        ),
        (
            "service_conversation_query",
            ServiceBoundMessage::conversation_query(
                Some("You summarise calls.".into()),
                Some("Summarise in one sentence.".into()),
            )
            .unwrap(),
        ),
        ("service_ping", ServiceBoundMessage::ping()),
    ] {
        assert_eq!(msg.to_frame(), load(name), "{name}");
    }
}

fn weather_call() -> ToolCallRequest {
    ToolCallRequest::from_json(
        "call_7",
        "get_weather",
        &json!({"location": {"city": "Berlin", "country": "DE"}, "days": 3, "hourly": false}),
        Some(4),
    )
    .unwrap()
}

#[test]
fn tool_call_request() {
    let C::ToolCallRequest(call) = client("client_tool_call_request") else {
        panic!()
    };
    assert_eq!(call, weather_call());
    assert_eq!(
        ClientBoundMessage::tool_call_request(weather_call()).to_frame(),
        load("client_tool_call_request")
    );
}

#[test]
fn chat_history() {
    let C::ChatHistory(history) = client("client_chat_history") else {
        panic!()
    };
    let [system, user, assistant, ephemeral] = &history.messages[..] else {
        panic!("{} messages", history.messages.len())
    };

    assert_eq!(system.role_open(), Open::Known(ChatMessageRole::System));
    assert_eq!(
        system.delivery_status_open(),
        Open::Known(ChatDeliveryStatus::DeliveryComplete)
    );
    assert_eq!(
        system.content,
        vec![ChatMessageContent::text("Be brief.", None)]
    );
    assert_eq!(system.turn_id, None);
    assert_eq!(
        system.created_at,
        Some(prost_types::Timestamp {
            seconds: 1_767_225_600,
            nanos: 0
        })
    );

    assert_eq!(user.role_open(), Open::Known(ChatMessageRole::User));
    assert_eq!(user.turn_id, Some(1));
    assert_eq!(
        user.content,
        vec![ChatMessageContent::input_audio(ChatAudioData::new(
            Bytes::from(pcm(640, 1)),
            AudioFormat::SPEECH_16K,
            "What's the weather in Berlin?",
        ))]
    );
    assert_eq!(user.created_at.unwrap().nanos, 250_000_000);

    assert_eq!(
        assistant.role_open(),
        Open::Known(ChatMessageRole::Assistant)
    );
    assert_eq!(
        assistant.delivery_status_open(),
        Open::Known(ChatDeliveryStatus::DeliveryInterrupted)
    );
    assert_eq!(assistant.turn_id, Some(2));
    assert_eq!(assistant.truncated_at_response_turn_id, Some(5));
    assert_eq!(assistant.created_at.unwrap().nanos, 999_999_999);
    let tts_audio = ChatAudioData::new(
        Bytes::from(pcm(320, 5)),
        AudioFormat::SPEECH_24K,
        "Hello! How can I help?",
    );
    assert_eq!(
        assistant.content,
        vec![
            ChatMessageContent::thoughts("The user wants the forecast; call the tool."),
            ChatMessageContent::tool_call(weather_call()),
            ChatMessageContent::tool_result(ToolCallResponse {
                id: "call_7".into(),
                result: r#"{"temp_c": 21}"#.into()
            }),
            ChatMessageContent::text("Hello! How can I help?", Some(tts_audio)),
            ChatMessageContent::instructions("Greet the user."),
        ]
    );
    let kinds: Vec<&str> = assistant
        .content
        .iter()
        .map(|c| match c.content.as_ref().unwrap() {
            Content::TextContent(_) => "text",
            Content::InputAudio(_) => "input_audio",
            Content::Thoughts(_) => "thoughts",
            Content::ToolCall(_) => "tool_call",
            Content::ToolResult(_) => "tool_result",
            Content::Instructions(_) => "instructions",
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "thoughts",
            "tool_call",
            "tool_result",
            "text",
            "instructions"
        ]
    );

    assert!(ephemeral.ephemeral);
    assert_eq!(
        ephemeral.delivery_status_open(),
        Open::Known(ChatDeliveryStatus::DeliveryInProgress)
    );
    assert_eq!(ephemeral.turn_id, Some(3));
    assert_eq!(ephemeral.created_at.unwrap().nanos, 1);

    // Rebuilt with the constructors, the history encodes like Python's.
    assert_eq!(
        ClientBoundMessage::chat_history(history.messages.clone()).to_frame(),
        load("client_chat_history")
    );
}

#[test]
fn turn_snapshot() {
    let C::TurnSnapshot(snapshot) = client("client_turn_snapshot") else {
        panic!()
    };
    assert!(snapshot.is_final);
    let C::ChatHistory(history) = client("client_chat_history") else {
        panic!()
    };
    assert_eq!(snapshot.message.as_ref(), Some(&history.messages[2]));
}

#[test]
fn vad_telemetry() {
    let C::VadAnalysisFrame(frame) = client("client_vad_analysis_frame") else {
        panic!()
    };
    assert_eq!(frame.state_open(), Open::Known(VadState::SpeechEnding));
    assert_eq!(
        ClientBoundMessage::vad_analysis_frame(
            1234,
            Duration::new(19, 744_000_000),
            0.875,
            0.25,
            VadState::SpeechEnding,
            vec![41, 42],
        )
        .to_frame(),
        load("client_vad_analysis_frame")
    );
    let C::VadStateEvent(event) = client("client_vad_state_event") else {
        panic!()
    };
    assert_eq!(
        event.from_state_open(),
        Open::Known(VadState::SpeechStarting)
    );
    assert_eq!(event.to_state_open(), Open::Known(VadState::Speech));
    assert_eq!(
        ClientBoundMessage::vad_state_event(
            Duration::new(20, 16_000_000),
            VadState::SpeechStarting,
            VadState::Speech,
            42,
        )
        .to_frame(),
        load("client_vad_state_event")
    );
}

#[test]
fn error_notification() {
    let C::Error(e) = client("client_error") else {
        panic!()
    };
    assert_eq!(
        e.category_open(),
        Open::Known(SessionErrorCategory::ErrorConfiguration)
    );
    assert_eq!(e.trace_id.as_deref(), Some("trace-0001"));
    assert_eq!(
        ClientBoundMessage::error(
            SessionErrorCategory::ErrorConfiguration,
            "input_audio_line.sample_rate: 0 is outside 8000..=192000",
            Some("trace-0001".into()),
        )
        .to_frame(),
        load("client_error")
    );
}

#[test]
fn constructors_match_the_reference_client() {
    let cases = [
        (
            "client_model_text_fragment",
            ClientBoundMessage::model_text_fragment("Hello", Some(2)),
        ),
        (
            "client_model_audio_chunk",
            ClientBoundMessage::model_audio_chunk(Bytes::from(pcm(480, 2)), Some(2)),
        ),
        (
            "client_playback_clear_buffer",
            ClientBoundMessage::playback_clear_buffer(),
        ),
        (
            "client_response_begin",
            ClientBoundMessage::response_begin(2),
        ),
        ("client_response_end", ClientBoundMessage::response_end(2)),
        (
            "client_user_transcription_result",
            ClientBoundMessage::user_transcription_result(1, "What's the weather in Berlin?", "en"),
        ),
        (
            "client_conversation_query_result",
            ClientBoundMessage::conversation_query_result("The user asked about weather."),
        ),
        ("client_session_ready", ClientBoundMessage::session_ready()),
        (
            "client_context_truncated",
            ClientBoundMessage::context_truncated(vec![1, 2, 3], 9),
        ),
        ("client_pong", ClientBoundMessage::pong()),
        (
            "client_model_speech_progress",
            ClientBoundMessage::model_speech_progress(2, "Hello! How", 19_200, true),
        ),
        (
            "client_inference_complete",
            ClientBoundMessage::inference_complete(2),
        ),
    ];
    for (name, msg) in cases {
        // Decoding checks the vector's values; comparing bytes checks the constructor's.
        assert_eq!(
            ClientBoundMessage::decode_frame(load(name)).unwrap(),
            msg,
            "{name}"
        );
        client(name);
        assert_eq!(msg.to_frame(), load(name), "{name}");
    }
    let C::TurnSnapshot(snapshot) = client("client_turn_snapshot") else {
        panic!()
    };
    assert_eq!(
        ClientBoundMessage::turn_snapshot(snapshot.message.unwrap(), true).to_frame(),
        load("client_turn_snapshot")
    );
}
