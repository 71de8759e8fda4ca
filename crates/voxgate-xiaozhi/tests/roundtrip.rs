//! Property tests: frames and control messages survive encode → decode unchanged, and no input
//! makes a decoder panic.
// Test helpers outside #[test] fns are not covered by clippy.toml's test exemptions.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use proptest::prelude::*;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};
use voxgate_xiaozhi::control::{
    Abort, AbortReason, Alert, AudioFormat, AudioParams, DeviceHello, DeviceMessage, Emotion,
    Event, Features, Iot, Listen, ListenMode, ListenState, Llm, Mcp, ServerHello, ServerMessage,
    Stt, System, SystemCommand, Transport, Tts, TtsState, UnknownMessage,
};
use voxgate_xiaozhi::frame::{Frame, FrameCodec, FrameType, ProtocolVersion};

fn version() -> impl Strategy<Value = ProtocolVersion> {
    prop::sample::select(ProtocolVersion::ALL.to_vec())
}

/// Header fields valid for `version`, as (type, reserved, timestamp).
fn fields(version: ProtocolVersion) -> BoxedStrategy<(u16, u32, u32)> {
    match version {
        ProtocolVersion::V2 => (any::<u16>(), any::<u32>(), any::<u32>()).boxed(),
        ProtocolVersion::V3 => (any::<u8>(), any::<u8>())
            .prop_map(|(t, r)| (u16::from(t), u32::from(r), 0))
            .boxed(),
        _ => Just((0, 0, 0)).boxed(),
    }
}

proptest! {
    #[test]
    fn frames_round_trip(
        (version, (frame_type, reserved, timestamp)) in version().prop_flat_map(|v| (Just(v), fields(v))),
        payload in prop::collection::vec(any::<u8>(), 0..2048),
    ) {
        let codec = FrameCodec::new(version);
        let frame = Frame { frame_type: FrameType(frame_type), reserved, timestamp, payload: &payload };
        let mut wire = Vec::new();
        codec.encode(&frame, &mut wire).unwrap();
        prop_assert_eq!(wire.len(), codec.encoded_len(payload.len()));
        prop_assert_eq!(codec.decode(&wire).unwrap(), frame);
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics_and_valid_frames_re_encode_exactly(
        version in version(),
        bytes in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let codec = FrameCodec::new(version);
        if let Ok(frame) = codec.decode(&bytes) {
            let mut wire = Vec::new();
            codec.encode(&frame, &mut wire).unwrap();
            prop_assert_eq!(wire, bytes);
        }
    }

    #[test]
    fn a_correct_size_field_always_decodes(
        version in prop::sample::select(vec![ProtocolVersion::V2, ProtocolVersion::V3]),
        mut header in prop::collection::vec(any::<u8>(), 16),
        payload in prop::collection::vec(any::<u8>(), 0..300),
    ) {
        let codec = FrameCodec::new(version);
        let len = payload.len();
        if version == ProtocolVersion::V2 {
            header[0..2].copy_from_slice(&2u16.to_be_bytes());
            header[12..16].copy_from_slice(&u32::try_from(len).unwrap().to_be_bytes());
        } else {
            header.truncate(4);
            header[2..4].copy_from_slice(&u16::try_from(len).unwrap().to_be_bytes());
        }
        header.extend_from_slice(&payload);
        prop_assert_eq!(codec.decode(&header).unwrap().payload, &payload[..]);
    }
}

/// Text with the characters that stress a JSON writer: quotes, backslashes, control characters,
/// CJK, emoji.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9 _.:-]{0,12}",
        any::<String>(),
        Just("\"\\/\u{0}\u{1f}\n\t你好😊\u{FE0F}".to_owned()),
    ]
}

fn opt_text() -> impl Strategy<Value = Option<String>> {
    prop::option::of(text())
}

/// A string enum value: any known value or an unknown one.
fn string_enum<T: Clone + std::fmt::Debug + From<String> + 'static>(
    known: &'static [T],
) -> impl Strategy<Value = T> {
    prop_oneof![
        prop::sample::select(known.to_vec()),
        text().prop_map(T::from),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(text(), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// An object's extra fields, avoiding the keys the message owns.
fn fields_without(reserved: &'static [&'static str]) -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::btree_map(text(), json_value(), 0..4).prop_map(move |m| {
        m.into_iter()
            .filter(|(k, _)| !reserved.contains(&k.as_str()))
            .collect()
    })
}

fn audio_params() -> impl Strategy<Value = AudioParams> {
    (
        string_enum(AudioFormat::KNOWN),
        any::<u32>(),
        any::<u16>(),
        any::<u32>(),
    )
        .prop_map(
            |(format, sample_rate, channels, frame_duration)| AudioParams {
                format,
                sample_rate,
                channels,
                frame_duration,
            },
        )
}

fn features() -> impl Strategy<Value = Features> {
    (
        any::<Option<bool>>(),
        any::<Option<bool>>(),
        any::<Option<bool>>(),
        prop::collection::btree_map(text(), json_value(), 0..3),
    )
        .prop_map(|(aec, mcp, glyph_push, other)| Features {
            aec,
            mcp,
            glyph_push,
            other: other
                .into_iter()
                .filter(|(k, _)| !["aec", "mcp", "glyph_push"].contains(&k.as_str()))
                .collect(),
        })
}

fn unknown(known: &'static [&'static str]) -> impl Strategy<Value = UnknownMessage> {
    (text(), fields_without(&["type"]))
        .prop_filter("a known type", move |(t, _)| !known.contains(&t.as_str()))
        .prop_map(|(message_type, fields)| UnknownMessage {
            message_type,
            fields,
        })
}

/// JSON text for `value`: compact, pretty-printed, or with spacing after every separator.
fn json_text(value: &Value, style: u8) -> String {
    match style % 3 {
        0 => value.to_string(),
        1 => serde_json::to_string_pretty(value).unwrap(),
        _ => {
            let mut out = Vec::new();
            let formatter = serde_json::ser::PrettyFormatter::with_indent(b"");
            value
                .serialize(&mut serde_json::Serializer::with_formatter(
                    &mut out, formatter,
                ))
                .unwrap();
            String::from_utf8(out).unwrap()
        }
    }
}

fn mcp() -> impl Strategy<Value = Mcp> {
    (opt_text(), json_value(), any::<u8>()).prop_map(|(session_id, payload, style)| {
        let raw = RawValue::from_string(json_text(&payload, style)).unwrap();
        Mcp {
            session_id,
            payload: raw,
        }
    })
}

fn device_message() -> impl Strategy<Value = DeviceMessage> {
    prop_oneof![
        (
            opt_text(),
            any::<Option<u32>>(),
            features(),
            prop::option::of(string_enum(Transport::KNOWN)),
            prop::option::of(audio_params())
        )
            .prop_map(|(session_id, version, features, transport, audio_params)| {
                DeviceMessage::Hello(DeviceHello {
                    session_id,
                    version,
                    features,
                    transport,
                    audio_params,
                })
            }),
        (
            opt_text(),
            string_enum(ListenState::KNOWN),
            prop::option::of(string_enum(ListenMode::KNOWN)),
            opt_text()
        )
            .prop_map(
                |(session_id, state, mode, text)| DeviceMessage::Listen(Listen {
                    session_id,
                    state,
                    mode,
                    text
                })
            ),
        (
            opt_text(),
            prop::option::of(string_enum(AbortReason::KNOWN))
        )
            .prop_map(|(session_id, reason)| DeviceMessage::Abort(Abort { session_id, reason })),
        mcp().prop_map(DeviceMessage::Mcp),
        (opt_text(), fields_without(&["type", "session_id"]))
            .prop_map(|(session_id, fields)| DeviceMessage::Iot(Iot { session_id, fields })),
        (
            opt_text(),
            text(),
            prop::option::of(json_value().prop_filter("null is absent", |v| !v.is_null())),
            prop::option::of(prop_oneof![
                any::<i64>().prop_map(serde_json::Number::from),
                // Quarter seconds are exact in binary; serde_json's default float parser is not
                // correctly rounded for arbitrary digits (its `float_roundtrip` feature is off).
                any::<i32>().prop_filter_map("finite", |q| serde_json::Number::from_f64(
                    f64::from(q) / 4.0
                )),
            ])
        )
            .prop_map(|(session_id, name, data, ts)| DeviceMessage::Event(Event {
                session_id,
                name,
                data,
                ts
            })),
        unknown(&["hello", "listen", "abort", "mcp", "iot", "event"])
            .prop_map(DeviceMessage::Unknown),
    ]
}

fn server_message() -> impl Strategy<Value = ServerMessage> {
    prop_oneof![
        (text(), string_enum(Transport::KNOWN), audio_params()).prop_map(
            |(session_id, transport, audio_params)| ServerMessage::Hello(ServerHello {
                session_id,
                transport,
                audio_params
            })
        ),
        (opt_text(), text())
            .prop_map(|(session_id, text)| ServerMessage::Stt(Stt { session_id, text })),
        (opt_text(), string_enum(TtsState::KNOWN), opt_text()).prop_map(
            |(session_id, state, text)| ServerMessage::Tts(Tts {
                session_id,
                state,
                text
            })
        ),
        (opt_text(), text(), string_enum(Emotion::KNOWN)).prop_map(
            |(session_id, text, emotion)| ServerMessage::Llm(Llm {
                session_id,
                text,
                emotion
            })
        ),
        mcp().prop_map(ServerMessage::Mcp),
        (opt_text(), string_enum(SystemCommand::KNOWN)).prop_map(|(session_id, command)| {
            ServerMessage::System(System {
                session_id,
                command,
            })
        }),
        (opt_text(), text(), text(), string_enum(Emotion::KNOWN)).prop_map(
            |(session_id, status, message, emotion)| ServerMessage::Alert(Alert {
                session_id,
                status,
                message,
                emotion
            })
        ),
        unknown(&["hello", "stt", "tts", "llm", "mcp", "system", "alert"])
            .prop_map(ServerMessage::Unknown),
    ]
}

proptest! {
    #[test]
    fn device_messages_round_trip(message in device_message()) {
        let json = message.to_json();
        prop_assert_eq!(DeviceMessage::from_slice(json.as_bytes()).unwrap(), message);
    }

    #[test]
    fn server_messages_round_trip(message in server_message()) {
        let json = message.to_json();
        prop_assert_eq!(ServerMessage::from_slice(json.as_bytes()).unwrap(), message);
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_parsers(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = DeviceMessage::from_slice(&bytes);
        let _ = ServerMessage::from_slice(&bytes);
    }

    #[test]
    fn arbitrary_objects_parse_stably(
        kind in prop::sample::select(vec!["hello", "listen", "abort", "mcp", "iot", "event", "stt", "tts", "llm", "system", "alert", "x"]),
        fields in fields_without(&["type"]),
    ) {
        let mut object = fields;
        object.insert("type".into(), json!(kind));
        let text = Value::Object(object).to_string();
        if let Ok(message) = DeviceMessage::from_slice(text.as_bytes()) {
            prop_assert_eq!(DeviceMessage::from_slice(message.to_json().as_bytes()).unwrap(), message);
        }
        if let Ok(message) = ServerMessage::from_slice(text.as_bytes()) {
            prop_assert_eq!(ServerMessage::from_slice(message.to_json().as_bytes()).unwrap(), message);
        }
    }

    #[test]
    fn mcp_payload_text_is_kept_verbatim(
        session_id in opt_text(),
        payload in json_value(),
        style in any::<u8>(),
        spacing in "[ \t\r\n]{0,3}",
    ) {
        let text = json_text(&payload, style);
        let session = session_id
            .as_ref()
            .map(|id| format!(r#""session_id":{},"#, Value::from(id.as_str())))
            .unwrap_or_default();
        let json = format!(r#"{{{session}"type":"mcp","payload":{spacing}{text}{spacing}}}"#);
        let DeviceMessage::Mcp(mcp) = DeviceMessage::from_slice(json.as_bytes()).unwrap() else {
            panic!("not an mcp: {json}")
        };
        prop_assert_eq!(mcp.payload_json(), text.as_str());
        prop_assert_eq!(&mcp.payload_value().unwrap(), &payload);
        prop_assert_eq!(&Mcp::wrap(payload.clone()).payload_value().unwrap(), &payload);
        let again = ServerMessage::from(mcp.clone()).to_json();
        let ServerMessage::Mcp(back) = ServerMessage::from_slice(again.as_bytes()).unwrap() else {
            panic!("not an mcp: {again}")
        };
        prop_assert_eq!(back, mcp);
    }

    #[test]
    fn raw_control_characters_and_bad_escapes_in_strings_are_repaired(
        text in "([a-z\u{0}-\u{1f}]|\\\\[xq']|\\\\u[dD][0-9a-fA-F]{3})*",
    ) {
        let json = format!(r#"{{"type":"listen","state":"detect","text":"{text}"}}"#);
        let parsed = DeviceMessage::from_slice(json.as_bytes());
        prop_assert!(parsed.is_ok(), "{json:?}");

        // The same inside an MCP payload: the repaired text is kept and decodes.
        let json = format!(r#"{{"type":"mcp","payload":{{"error":{{"message":"{text}"}}}}}}"#);
        let Ok(DeviceMessage::Mcp(mcp)) = DeviceMessage::from_slice(json.as_bytes()) else {
            panic!("not an mcp: {json:?}")
        };
        prop_assert!(mcp.payload_value().is_ok(), "{json:?} -> {}", mcp.payload_json());
    }
}
