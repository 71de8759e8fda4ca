//! Property tests: every message type survives encode → decode unchanged and re-encodes to the
//! same bytes, including unknown enum values and arbitrary Structs.

#![allow(clippy::unwrap_used, reason = "test code")]

use bytes::Bytes;
use proptest::prelude::*;
use prost::Message;
use prost_types::value::Kind;
use prost_types::{ListValue, Struct, Timestamp, Value};
use voxgate_realtime::proto::*;
use voxgate_realtime::{ClientBoundMessage, ServiceBoundMessage, json};

// ---------------------------------------------------------------------------------------------
// Leaves
// ---------------------------------------------------------------------------------------------

fn text() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9 _.,äöüß€\u{1f600}-\u{1f64f}]{0,12}"
}

fn opt_text() -> impl Strategy<Value = Option<String>> {
    prop::option::of(text())
}

fn bytes() -> impl Strategy<Value = Bytes> {
    prop::collection::vec(any::<u8>(), 0..48).prop_map(Bytes::from)
}

/// Mostly known values, sometimes anything: unknown values must survive too.
fn enum_raw(known: i32) -> impl Strategy<Value = i32> {
    prop_oneof![4 => 0..known, 1 => any::<i32>()]
}

/// Finite floats (NaN is never equal to itself, so it cannot take part in equality checks).
fn f64_finite() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(0.0),
        -1.0e6..1.0e6,
        prop::num::f64::NORMAL | prop::num::f64::SUBNORMAL
    ]
}

fn f32_finite() -> impl Strategy<Value = f32> {
    prop_oneof![
        Just(0.0f32),
        0.0f32..=1.0,
        prop::num::f32::NORMAL | prop::num::f32::SUBNORMAL
    ]
}

fn duration() -> impl Strategy<Value = Duration> {
    (any::<u64>(), any::<u32>()).prop_map(|(seconds, nanos)| Duration { seconds, nanos })
}

fn timestamp() -> impl Strategy<Value = Timestamp> {
    (any::<i64>(), any::<i32>()).prop_map(|(seconds, nanos)| Timestamp { seconds, nanos })
}

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Kind::NullValue(0)),
        any::<bool>().prop_map(Kind::BoolValue),
        f64_finite().prop_map(Kind::NumberValue),
        text().prop_map(Kind::StringValue),
    ]
    .prop_map(|k| Value { kind: Some(k) });
    leaf.prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4)
                .prop_map(|values| Kind::ListValue(ListValue { values })),
            prop::collection::btree_map(text(), inner, 0..4)
                .prop_map(|fields| Kind::StructValue(Struct { fields })),
        ]
        .prop_map(|k| Value { kind: Some(k) })
    })
}

fn structure() -> impl Strategy<Value = Struct> {
    prop::collection::btree_map(text(), value(), 0..4).prop_map(|fields| Struct { fields })
}

// ---------------------------------------------------------------------------------------------
// Messages
// ---------------------------------------------------------------------------------------------

fn audio_line() -> impl Strategy<Value = AudioLineConfiguration> {
    (any::<u32>(), any::<u32>(), enum_raw(5)).prop_map(|(sample_rate, channel_count, f)| {
        AudioLineConfiguration {
            sample_rate,
            channel_count,
            sample_format: f,
        }
    })
}

fn vad_configuration() -> impl Strategy<Value = VadConfiguration> {
    (
        f32_finite(),
        f32_finite(),
        prop::option::of(duration()),
        prop::option::of(duration()),
        prop::option::of(duration()),
    )
        .prop_map(|(c, v, start, stop, back)| VadConfiguration {
            confidence_threshold: c,
            min_volume: v,
            start_duration: start,
            stop_duration: stop,
            backbuffer_duration: back,
        })
}

fn inference() -> impl Strategy<Value = InferenceConfiguration> {
    (text(), f64_finite()).prop_map(|(system_prompt, temperature)| InferenceConfiguration {
        system_prompt,
        temperature,
    })
}

fn voice_settings() -> impl Strategy<Value = ElevenLabsVoiceSettings> {
    (
        f64_finite(),
        f64_finite(),
        f64_finite(),
        any::<bool>(),
        f64_finite(),
    )
        .prop_map(|(a, b, c, d, e)| ElevenLabsVoiceSettings {
            stability: a,
            similarity_boost: b,
            style: c,
            use_speaker_boost: d,
            speed: e,
        })
}

fn eleven_labs() -> impl Strategy<Value = ElevenLabsTtsConfiguration> {
    (
        text(),
        text(),
        opt_text(),
        prop::option::of(voice_settings()),
        enum_raw(3),
    )
        .prop_map(|(api_key, voice_id, model_id, voice_settings, location)| {
            ElevenLabsTtsConfiguration {
                api_key,
                voice_id,
                model_id,
                voice_settings,
                location,
            }
        })
}

fn voice_clone() -> impl Strategy<Value = HostedVoiceCloneV1> {
    (bytes(), prop::option::of(audio_line()), text()).prop_map(
        |(audio_data, audio_format, ref_text)| HostedVoiceCloneV1 {
            audio_data,
            audio_format,
            ref_text,
        },
    )
}

fn hosted() -> impl Strategy<Value = HostedTtsConfiguration> {
    use hosted_tts_configuration::Voice;
    (
        prop::option::of(prop_oneof![
            text().prop_map(|voice_id| Voice::VoiceRef(HostedVoiceRef { voice_id })),
            voice_clone().prop_map(Voice::VoiceCloneV1),
        ]),
        enum_raw(2),
    )
        .prop_map(|(voice, mode)| HostedTtsConfiguration { voice, mode })
}

fn tts() -> impl Strategy<Value = TtsConfiguration> {
    use tts_configuration::Provider;
    prop::option::of(prop_oneof![
        eleven_labs().prop_map(Provider::ElevenLabs),
        hosted().prop_map(Provider::Hosted),
    ])
    .prop_map(|provider| TtsConfiguration { provider })
}

fn initialize() -> impl Strategy<Value = InitializeSessionRequest> {
    (
        prop::option::of(audio_line()),
        prop::option::of(audio_line()),
        prop::option::of(vad_configuration()),
        prop::option::of(inference()),
        prop::option::of(tts()),
        any::<bool>(),
        any::<bool>(),
        prop::collection::btree_map(text(), value(), 0..4),
    )
        .prop_map(|(i, o, v, inf, t, p, e, x)| InitializeSessionRequest {
            input_audio_line: i,
            output_audio_line: o,
            vad_configuration: v,
            inference_configuration: inf,
            tts_configuration: t,
            supports_playback_reporting: p,
            enable_vad_frame_telemetry: e,
            experiments: x,
        })
}

fn reconfigure() -> impl Strategy<Value = ReconfigureSessionRequest> {
    (
        prop::option::of(audio_line()),
        prop::option::of(inference()),
    )
        .prop_map(|(a, i)| ReconfigureSessionRequest {
            input_audio_line: a,
            inference_configuration: i,
        })
}

fn user_input() -> impl Strategy<Value = UserInput> {
    use user_input::Input;
    (
        any::<u64>(),
        enum_raw(3),
        prop::option::of(prop_oneof![
            bytes().prop_map(|data| Input::AudioData(AudioData { data })),
            text().prop_map(|data| Input::TextData(TextData { data })),
        ]),
    )
        .prop_map(|(packet_id, mode, input)| UserInput {
            packet_id,
            mode,
            input,
        })
}

fn tool_definition() -> impl Strategy<Value = ToolDefinition> {
    (text(), opt_text(), prop::option::of(structure())).prop_map(
        |(name, description, parameters)| ToolDefinition {
            name,
            description,
            parameters,
        },
    )
}

fn update_tools() -> impl Strategy<Value = UpdateToolDefinitionsRequest> {
    prop::collection::vec(tool_definition(), 0..3)
        .prop_map(|tool_definitions| UpdateToolDefinitionsRequest { tool_definitions })
}

fn tool_call_request() -> impl Strategy<Value = ToolCallRequest> {
    (
        text(),
        text(),
        prop::option::of(structure()),
        prop::option::of(any::<u32>()),
    )
        .prop_map(|(id, name, parameters, turn_id)| ToolCallRequest {
            id,
            name,
            parameters,
            turn_id,
        })
}

fn tool_call_response() -> impl Strategy<Value = ToolCallResponse> {
    (text(), text()).prop_map(|(id, result)| ToolCallResponse { id, result })
}

fn audio_data() -> impl Strategy<Value = AudioData> {
    bytes().prop_map(|data| AudioData { data })
}

fn chat_audio() -> impl Strategy<Value = ChatAudioData> {
    (
        prop::option::of(audio_data()),
        prop::option::of(audio_line()),
        text(),
    )
        .prop_map(|(audio, format, transcription)| ChatAudioData {
            audio,
            format,
            transcription,
        })
}

fn chat_content() -> impl Strategy<Value = ChatMessageContent> {
    use chat_message_content::Content;
    prop::option::of(prop_oneof![
        (text(), prop::option::of(chat_audio())).prop_map(
            |(text, tts_audio)| Content::TextContent(ChatTextContent { text, tts_audio })
        ),
        chat_audio().prop_map(Content::InputAudio),
        text().prop_map(Content::Thoughts),
        tool_call_request().prop_map(Content::ToolCall),
        tool_call_response().prop_map(Content::ToolResult),
        text().prop_map(Content::Instructions),
    ])
    .prop_map(|content| ChatMessageContent { content })
}

fn chat_message() -> impl Strategy<Value = ChatMessage> {
    (
        enum_raw(3),
        prop::collection::vec(chat_content(), 0..4),
        enum_raw(3),
        any::<bool>(),
        prop::option::of(timestamp()),
        prop::option::of(any::<u32>()),
        prop::option::of(any::<u32>()),
    )
        .prop_map(
            |(role, content, delivery_status, ephemeral, created_at, turn_id, trunc)| ChatMessage {
                role,
                content,
                delivery_status,
                ephemeral,
                created_at,
                turn_id,
                truncated_at_response_turn_id: trunc,
            },
        )
}

fn chat_history() -> impl Strategy<Value = ChatHistory> {
    prop::collection::vec(chat_message(), 0..3).prop_map(|messages| ChatHistory { messages })
}

fn vad_frame() -> impl Strategy<Value = VadAnalysisFrame> {
    (
        any::<u64>(),
        prop::option::of(duration()),
        f32_finite(),
        f32_finite(),
        enum_raw(4),
        prop::collection::vec(any::<u64>(), 0..4),
    )
        .prop_map(
            |(frame_index, session_time, confidence, volume, state, ids)| VadAnalysisFrame {
                frame_index,
                session_time,
                confidence,
                volume,
                state,
                source_packet_ids: ids,
            },
        )
}

fn vad_event() -> impl Strategy<Value = VadStateEvent> {
    (
        prop::option::of(duration()),
        enum_raw(4),
        enum_raw(4),
        any::<u64>(),
    )
        .prop_map(
            |(session_time, from_state, to_state, packet_id)| VadStateEvent {
                session_time,
                from_state,
                to_state,
                packet_id,
            },
        )
}

fn service_payload() -> impl Strategy<Value = service_bound_message::Payload> {
    use service_bound_message::Payload as P;
    prop_oneof![
        initialize().prop_map(P::InitializeSessionRequest),
        reconfigure().prop_map(P::ReconfigureSessionRequest),
        user_input().prop_map(P::UserInput),
        update_tools().prop_map(P::UpdateToolDefinitionsRequest),
        tool_call_response().prop_map(P::ToolCallResponse),
        (opt_text(), any::<bool>()).prop_map(|(extra_instructions, flush_vad)| {
            P::TriggerInference(TriggerInference {
                extra_instructions,
                flush_vad,
            })
        }),
        (any::<bool>(), any::<bool>()).prop_map(|(await_pending, exclude_audio)| {
            P::ExportChatHistoryRequest(ExportChatHistoryRequest {
                await_pending,
                exclude_audio,
            })
        }),
        (any::<u64>(), prop::option::of(any::<u32>())).prop_map(|(bytes_played, turn_id)| {
            P::PlaybackPositionReport(PlaybackPositionReport {
                bytes_played,
                turn_id,
            })
        }),
        (text(), any::<bool>(), any::<bool>()).prop_map(|(text, include_in_history, u)| {
            P::DirectSpeech(DirectSpeech {
                text,
                include_in_history,
                uninterruptable: u,
            })
        }),
        (opt_text(), opt_text()).prop_map(|(prompt, instructions)| {
            P::ConversationQuery(ConversationQuery {
                prompt,
                instructions,
            })
        }),
        Just(P::Ping(Ping {})),
    ]
}

fn client_payload() -> impl Strategy<Value = client_bound_message::Payload> {
    use client_bound_message::Payload as P;
    prop_oneof![
        tool_call_request().prop_map(P::ToolCallRequest),
        (text(), prop::option::of(any::<u32>()))
            .prop_map(|(text, turn_id)| P::ModelTextFragment(ModelTextFragment { text, turn_id })),
        (
            prop::option::of(audio_data()),
            prop::option::of(any::<u32>())
        )
            .prop_map(|(audio, turn_id)| P::ModelAudioChunk(ModelAudioChunk { audio, turn_id })),
        Just(P::PlaybackClearBuffer(PlaybackClearBuffer {})),
        any::<u32>().prop_map(|turn_id| P::ResponseBegin(ResponseBegin { turn_id })),
        any::<u32>().prop_map(|turn_id| P::ResponseEnd(ResponseEnd { turn_id })),
        chat_history().prop_map(P::ChatHistory),
        (enum_raw(8), text(), opt_text()).prop_map(|(category, message, trace_id)| {
            P::Error(SessionErrorNotification {
                category,
                message,
                trace_id,
            })
        }),
        (any::<u32>(), text(), text()).prop_map(|(turn_id, text, language)| {
            P::UserTranscriptionResult(UserTranscriptionResult {
                turn_id,
                text,
                language,
            })
        }),
        text().prop_map(|text| P::ConversationQueryResult(ConversationQueryResult { text })),
        Just(P::SessionReady(SessionReady {})),
        vad_frame().prop_map(P::VadAnalysisFrame),
        vad_event().prop_map(P::VadStateEvent),
        (prop::collection::vec(any::<u32>(), 0..5), any::<u32>()).prop_map(|(ids, r)| {
            P::ContextTruncated(ContextTruncated {
                truncated_turn_ids: ids,
                response_turn_id: r,
            })
        }),
        Just(P::Pong(Pong {})),
        (any::<u32>(), text(), any::<u64>(), any::<bool>()).prop_map(
            |(turn_id, text, b, exact)| {
                P::ModelSpeechProgress(ModelSpeechProgress {
                    turn_id,
                    text,
                    audio_bytes_played: b,
                    exact,
                })
            }
        ),
        (prop::option::of(chat_message()), any::<bool>())
            .prop_map(|(message, is_final)| P::TurnSnapshot(TurnSnapshot { message, is_final })),
        any::<u32>().prop_map(|turn_id| P::InferenceComplete(InferenceComplete { turn_id })),
    ]
}

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

/// Encode, decode from `Bytes`, compare, and re-encode to the same bytes.
fn round_trip<M: Message + Default + PartialEq + std::fmt::Debug>(message: &M) {
    let bytes = Bytes::from(message.encode_to_vec());
    assert_eq!(bytes.len(), message.encoded_len());
    let decoded = M::decode(bytes.clone()).unwrap();
    assert_eq!(&decoded, message);
    assert_eq!(decoded.encode_to_vec(), bytes);
}

macro_rules! round_trips {
    ($($name:ident: $strategy:expr;)+) => {
        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]
            $(
                #[test]
                fn $name(message in $strategy) {
                    round_trip(&message);
                }
            )+
        }
    };
}

round_trips! {
    tool_definition_round_trips: tool_definition();
    update_tools_round_trips: update_tools();
    tool_call_request_round_trips: tool_call_request();
    tool_call_response_round_trips: tool_call_response();
    duration_round_trips: duration();
    audio_line_round_trips: audio_line();
    vad_configuration_round_trips: vad_configuration();
    vad_frame_round_trips: vad_frame();
    vad_event_round_trips: vad_event();
    inference_round_trips: inference();
    eleven_labs_round_trips: eleven_labs();
    voice_settings_round_trips: voice_settings();
    voice_clone_round_trips: voice_clone();
    hosted_round_trips: hosted();
    tts_round_trips: tts();
    initialize_round_trips: initialize();
    reconfigure_round_trips: reconfigure();
    user_input_round_trips: user_input();
    chat_audio_round_trips: chat_audio();
    chat_content_round_trips: chat_content();
    chat_message_round_trips: chat_message();
    chat_history_round_trips: chat_history();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn service_bound_frames_round_trip(payload in service_payload()) {
        let message = ServiceBoundMessage { payload: Some(payload) };
        let frame = message.to_frame();
        let decoded = ServiceBoundMessage::decode_frame(frame.clone()).unwrap();
        prop_assert_eq!(&decoded, &message);
        prop_assert_eq!(decoded.to_frame(), frame);
        prop_assert_eq!(decoded.kind(), message.kind());
    }

    #[test]
    fn client_bound_frames_round_trip(payload in client_payload()) {
        let message = ClientBoundMessage { payload: Some(payload) };
        let frame = message.to_frame();
        let decoded = ClientBoundMessage::decode_frame(frame.clone()).unwrap();
        prop_assert_eq!(&decoded, &message);
        prop_assert_eq!(decoded.to_frame(), frame);
    }

    #[test]
    fn structs_round_trip_through_json(s in structure()) {
        let json = json::struct_to_json(&s).unwrap();
        let back = json::map_to_struct(&json).unwrap();
        prop_assert_eq!(back, s);
    }

    #[test]
    fn map_entries_are_encoded_in_key_order(
        map in prop::collection::btree_map(text(), value(), 0..6),
    ) {
        // Python's deterministic serialization sorts map entries by key; so must we, or
        // re-encoding its messages would not reproduce their bytes.
        let request = InitializeSessionRequest { experiments: map.clone(), ..Default::default() };
        let raw = RawEntries::decode(&request.encode_to_vec()[..]).unwrap();
        let wire_order: Vec<String> = raw.entries.into_iter().map(|e| e.key).collect();
        let sorted: Vec<String> = map.into_keys().collect();
        prop_assert_eq!(wire_order, sorted);
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_reencode_stably(
        data in prop::collection::vec(any::<u8>(), 0..256),
    ) {
        let frame = Bytes::from(data);
        if let Ok(m) = ServiceBoundMessage::decode_frame(frame.clone()) {
            let _ = m.validate();
            let canonical = m.to_frame();
            let again = ServiceBoundMessage::decode_frame(canonical.clone()).unwrap();
            prop_assert_eq!(again.to_frame(), canonical);
        }
        if let Ok(m) = ClientBoundMessage::decode_frame(frame) {
            let _ = m.validate();
            let canonical = m.to_frame();
            let again = ClientBoundMessage::decode_frame(canonical.clone()).unwrap();
            prop_assert_eq!(again.to_frame(), canonical);
        }
    }
}

/// The `experiments` entries of an `InitializeSessionRequest`, in wire order.
#[derive(Clone, PartialEq, prost::Message)]
struct RawEntries {
    #[prost(message, repeated, tag = "8")]
    entries: Vec<RawEntry>,
}

/// A map entry's key; the value is skipped.
#[derive(Clone, PartialEq, prost::Message)]
struct RawEntry {
    #[prost(string, tag = "1")]
    key: String,
}
