//! Parsing the JSON that real devices and clients send, and the typed errors for what cannot be
//! parsed.
// Test helpers outside #[test] fns are not covered by clippy.toml's test exemptions.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::json;
use serde_json::value::RawValue;
use voxgate_xiaozhi::control::{
    Abort, AbortReason, Alert, AudioFormat, AudioParams, DeviceMessage, Emotion, Event, Listen,
    ListenMode, ListenState, Mcp, ParseError, ServerHello, ServerMessage, Stt, SystemCommand,
    Transport, TtsState,
};

fn data(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/data/control/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn device(json: &[u8]) -> DeviceMessage {
    DeviceMessage::from_slice(json)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(json)))
}

fn server(json: &str) -> ServerMessage {
    json.parse()
        .unwrap_or_else(|e: ParseError| panic!("{e}: {json}"))
}

#[test]
fn firmware_hello() {
    let DeviceMessage::Hello(hello) = device(&data("firmware_hello.json")) else {
        panic!("not a hello")
    };
    assert_eq!(hello.version, Some(1));
    assert_eq!(hello.features.aec, Some(true));
    assert_eq!(hello.features.mcp, Some(true));
    assert_eq!(hello.features.glyph_push, Some(false));
    assert!(hello.features.other.is_empty());
    assert_eq!(hello.transport, Some(Transport::WebSocket));
    assert_eq!(hello.audio_params, Some(AudioParams::uplink()));
    assert_eq!(hello.session_id, None);
}

#[test]
fn python_client_hello_with_spaced_separators_and_escaped_unicode() {
    let DeviceMessage::Hello(hello) = device(&data("python_hello.json")) else {
        panic!("not a hello")
    };
    assert_eq!(hello.version, Some(3));
    assert_eq!(hello.features.mcp, Some(true));
    assert_eq!(hello.features.aec, None);
    // Unknown features are kept with their values.
    assert_eq!(hello.features.other["camera"], json!({"fps": 5}));
    assert_eq!(hello.uplink_audio().sample_rate, 16_000);
}

#[test]
fn browser_hello_without_transport_or_audio_params() {
    let DeviceMessage::Hello(hello) = device(&data("browser_hello.json")) else {
        panic!("not a hello")
    };
    assert_eq!(hello.transport, None);
    assert_eq!(hello.audio_params, None);
    assert_eq!(hello.uplink_audio(), AudioParams::uplink());
    assert_eq!(hello.features.mcp, Some(false));
}

#[test]
fn desktop_hello_with_20ms_frames_pretty_printed_and_reordered() {
    let DeviceMessage::Hello(hello) = device(&data("desktop_hello_20ms.json")) else {
        panic!("not a hello")
    };
    let audio = hello.uplink_audio();
    assert_eq!(audio.frame_duration, 20);
    // A numeric string is accepted where a number belongs.
    assert_eq!(audio.sample_rate, 16_000);
    assert_eq!(audio.samples_per_frame(), 320);
    assert_eq!(hello.version, None);
}

#[test]
fn hello_with_partial_audio_params_gets_defaults() {
    let DeviceMessage::Hello(hello) =
        device(br#"{"type":"hello","audio_params":{"format":"opus","frame_duration":20.0}}"#)
    else {
        panic!("not a hello")
    };
    let audio = hello.audio_params.unwrap();
    assert_eq!(
        (audio.sample_rate, audio.channels, audio.frame_duration),
        (16_000, 1, 20)
    );
    // The seed's short server hello: the downlink default fills the rest.
    let ServerMessage::Hello(answer) = server(
        r#"{"type":"hello","transport":"websocket","session_id":"xxx","audio_params":{"format":"opus","sample_rate":24000}}"#,
    ) else {
        panic!("not a hello")
    };
    assert_eq!(answer, ServerHello::new("xxx"));
}

#[test]
fn listen_start_stop_detect() {
    assert_eq!(
        device(br#"{"session_id":"s","type":"listen","state":"start","mode":"auto"}"#),
        DeviceMessage::Listen(Listen {
            session_id: Some("s".into()),
            ..Listen::start(ListenMode::Auto)
        })
    );
    assert_eq!(
        device(br#"{"type":"listen","state":"stop"}"#),
        DeviceMessage::Listen(Listen::stop())
    );
    let DeviceMessage::Listen(detect) = device(&data("listen_detect.json")) else {
        panic!("not a listen")
    };
    assert_eq!(detect.state, ListenState::Detect);
    assert_eq!(detect.text.as_deref(), Some("你好小智"));
    assert_eq!(detect.session_id.as_deref(), Some("7f2c"));
}

#[test]
fn unknown_listen_mode_and_state_are_kept() {
    let DeviceMessage::Listen(listen) =
        device(br#"{"type":"listen","state":"pause","mode":"vad"}"#)
    else {
        panic!("not a listen")
    };
    assert_eq!(listen.state, ListenState::Other("pause".into()));
    assert_eq!(listen.mode, Some(ListenMode::Other("vad".into())));
    assert_eq!(
        DeviceMessage::from(listen).to_json(),
        r#"{"type":"listen","state":"pause","mode":"vad"}"#
    );
}

#[test]
fn abort_with_and_without_reason() {
    assert_eq!(
        device(&data("abort_reason.json")),
        DeviceMessage::Abort(Abort {
            session_id: Some("7f2c".into()),
            reason: Some(AbortReason::WakeWordDetected),
        })
    );
    assert_eq!(
        device(br#"{"type":"abort"}"#),
        DeviceMessage::Abort(Abort::default())
    );
}

#[test]
fn mcp_with_broken_escaping_is_repaired() {
    let DeviceMessage::Mcp(mcp) = device(&data("mcp_broken_escaping.json")) else {
        panic!("not an mcp")
    };
    assert_eq!(mcp.session_id.as_deref(), Some("7f2c"));
    // The repaired text is what the payload keeps.
    assert_eq!(
        mcp.payload_json(),
        "{\"jsonrpc\":\"2.0\",\"id\":3,\"error\":{\"message\":\"Unknown tool: self.light\\tbad \\\\x escape\\nand newline \\\\u12 \u{FFFD}\"}}"
    );
    let payload = mcp.payload_value().unwrap();
    assert_eq!(payload["id"], 3);
    assert_eq!(
        payload["error"]["message"],
        "Unknown tool: self.light\tbad \\x escape\nand newline \\u12 \u{FFFD}"
    );
}

#[test]
fn lone_surrogates_in_an_otherwise_valid_mcp_payload_are_repaired() {
    // serde_json's syntax check of a raw value lets lone surrogate escapes through; the JSON-RPC
    // layer would then fail to decode the payload.
    for (json, text) in [
        (
            r#"{"type":"mcp","payload":{"m":"a\ud800b\uDC00c"}}"#,
            "a\u{FFFD}b\u{FFFD}c",
        ),
        (r#"{"type":"mcp","payload":["\ud83d"]}"#, "\u{FFFD}"),
    ] {
        let DeviceMessage::Mcp(mcp) = device(json.as_bytes()) else {
            panic!("not an mcp")
        };
        let value = mcp.payload_value().unwrap();
        let found = value.get("m").unwrap_or_else(|| &value[0]);
        assert_eq!(found, text, "{json}");
    }
    // Paired surrogates and escaped backslashes are valid and kept as sent.
    for payload in [
        r#"{"m":"\ud83d\ude00"}"#,
        r#"{"m":"\\ud800"}"#,
        r#"{"m":"\uD83D\uDE00 \u00e9"}"#,
    ] {
        let json = format!(r#"{{"type":"mcp","payload":{payload}}}"#);
        let DeviceMessage::Mcp(mcp) = device(json.as_bytes()) else {
            panic!("not an mcp")
        };
        assert_eq!(mcp.payload_json(), payload);
        mcp.payload_value().unwrap();
    }
}

#[test]
fn mcp_with_and_without_session_id() {
    let payload = json!({"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"true"}],"isError":false}});
    let text = format!(r#"{{"type":"mcp","payload":{payload}}}"#);
    assert_eq!(
        device(text.as_bytes()),
        DeviceMessage::Mcp(Mcp::wrap(payload.clone()))
    );
    assert_eq!(
        server(&format!(
            r#"{{"payload":{payload},"session_id":"s","type":"mcp"}}"#
        )),
        ServerMessage::Mcp(Mcp::wrap(payload).with_session_id("s"))
    );
}

#[test]
fn mcp_payload_is_kept_verbatim() {
    // Spacing, key order, number spelling, escapes and duplicate keys are the JSON-RPC layer's
    // business: the envelope keeps the text as sent and writes it back unchanged.
    let payload = "{ \"jsonrpc\" : \"2.0\",\n  \"id\": 1.50, \"result\": {\"t\": \"caf\\u00e9 \\/\", \"t\": 1e400} }";
    let json = format!(r#"{{"session_id":"s","type":"mcp","payload":  {payload} }}"#);
    let DeviceMessage::Mcp(mcp) = device(json.as_bytes()) else {
        panic!("not an mcp")
    };
    assert_eq!(mcp.payload_json(), payload);
    assert_eq!(
        ServerMessage::from(mcp.clone()).to_json(),
        format!(r#"{{"type":"mcp","session_id":"s","payload":{payload}}}"#)
    );
    // 1e400 does not fit an f64: the text is kept, but it has no `Value`.
    assert!(mcp.payload_value().is_err());

    // Equality is textual.
    let spaced = Mcp::from_raw(RawValue::from_string(r#"{"id": 1}"#.to_owned()).unwrap());
    let compact = Mcp::wrap(json!({"id": 1}));
    assert_eq!(compact.payload_json(), r#"{"id":1}"#);
    assert_ne!(spaced, compact);
    assert_eq!(
        spaced.payload_value().unwrap(),
        compact.payload_value().unwrap()
    );
    assert_eq!(
        spaced.clone().with_session_id("s"),
        spaced.with_session_id("s")
    );
}

#[test]
fn mcp_wraps_values_serializable_types_and_raw_text() {
    #[derive(serde::Serialize)]
    struct Call<'a> {
        jsonrpc: &'a str,
        id: u32,
        method: &'a str,
    }
    let typed = Mcp::try_wrap(&Call {
        jsonrpc: "2.0",
        id: 7,
        method: "tools/list",
    })
    .unwrap();
    assert_eq!(
        typed.payload_json(),
        r#"{"jsonrpc":"2.0","id":7,"method":"tools/list"}"#
    );
    let raw = RawValue::from_string(typed.payload_json().to_owned()).unwrap();
    assert_eq!(Mcp::from_raw(raw), typed);
    assert_eq!(
        typed.into_raw().get(),
        r#"{"jsonrpc":"2.0","id":7,"method":"tools/list"}"#
    );
    let map_with_int_keys: std::collections::BTreeMap<u8, u8> = [(1, 2)].into();
    assert!(Mcp::try_wrap(&map_with_int_keys).is_ok());
    let map_with_tuple_keys: std::collections::BTreeMap<(u8, u8), u8> = [((1, 2), 3)].into();
    assert!(Mcp::try_wrap(&map_with_tuple_keys).is_err());
}

#[test]
fn legacy_iot_is_accepted() {
    let DeviceMessage::Iot(iot) = device(&data("iot.json")) else {
        panic!("not an iot")
    };
    assert_eq!(iot.session_id.as_deref(), Some("7f2c"));
    assert_eq!(iot.fields["update"], true);
    assert_eq!(iot.fields["descriptors"][0]["name"], "Speaker");
    assert!(!iot.fields.contains_key("type"));
}

#[test]
fn perception_event_is_accepted() {
    let DeviceMessage::Event(event) = device(&data("event.json")) else {
        panic!("not an event")
    };
    assert_eq!(
        event,
        Event {
            session_id: None,
            name: "face_detected".into(),
            data: Some(json!({"count": 1, "box": [10, 20, 30, 40]})),
            ts: serde_json::Number::from_f64(1_715_000_000.5),
        }
    );
}

#[test]
fn unknown_types_are_kept_whole() {
    let message = device(&data("unknown_type.json"));
    let DeviceMessage::Unknown(unknown) = &message else {
        panic!("not unknown")
    };
    assert_eq!(unknown.message_type, "goodbye");
    assert_eq!(unknown.session_id(), Some("7f2c"));
    assert_eq!(unknown.fields["extra"], json!({"nested": [1, 2, 3]}));
    assert_eq!(message.session_id(), Some("7f2c"));
    // Nothing is lost on the way back out.
    let reparsed: serde_json::Value = serde_json::from_str(&message.to_json()).unwrap();
    let original: serde_json::Value = serde_json::from_slice(&data("unknown_type.json")).unwrap();
    assert_eq!(reparsed, original);
}

#[test]
fn direction_matters_for_known_types() {
    // A server-bound parser does not know `tts`; it keeps it as data.
    assert_eq!(
        device(br#"{"type":"tts","state":"start"}"#).message_type(),
        "tts"
    );
    assert!(matches!(
        device(br#"{"type":"tts","state":"start"}"#),
        DeviceMessage::Unknown(_)
    ));
    assert!(matches!(
        server(r#"{"type":"listen","state":"start"}"#),
        ServerMessage::Unknown(_)
    ));
}

#[test]
fn server_messages_parse() {
    assert_eq!(
        server(r#"{"type":"stt","text":"\u5929\u6c14"}"#),
        ServerMessage::Stt(Stt::new("天气"))
    );
    let ServerMessage::Tts(tts) = server(r#"{"type":"tts","state":"sentence_start","text":"Hi."}"#)
    else {
        panic!("not tts")
    };
    assert_eq!(
        (tts.state, tts.text.as_deref()),
        (TtsState::SentenceStart, Some("Hi."))
    );
    let ServerMessage::Llm(llm) = server(r#"{"type":"llm","text":"🙂","emotion":"happy"}"#)
    else {
        panic!("not llm")
    };
    assert_eq!(llm.emotion, Emotion::Happy);
    let ServerMessage::System(system) = server(r#"{"type":"system","command":"reboot"}"#) else {
        panic!("not system")
    };
    assert_eq!(system.command, SystemCommand::Reboot);
    assert_eq!(
        server(r#"{"type":"alert","status":"Warning","message":"Battery low","emotion":"sad"}"#),
        ServerMessage::Alert(Alert {
            session_id: None,
            status: "Warning".into(),
            message: "Battery low".into(),
            emotion: Emotion::Sad,
        })
    );
}

#[test]
fn escaped_type_tag_is_unescaped() {
    assert!(matches!(
        device(br#"{"type":"\u0061bort"}"#),
        DeviceMessage::Abort(_)
    ));
}

#[test]
fn audio_format_other_is_kept() {
    let DeviceMessage::Hello(hello) =
        device(br#"{"type":"hello","audio_params":{"format":"pcm_s16le"}}"#)
    else {
        panic!("not a hello")
    };
    assert_eq!(
        hello.audio_params.unwrap().format,
        AudioFormat::Other("pcm_s16le".into())
    );
}

#[test]
fn malformed_json_is_a_typed_error() {
    for input in [
        &b""[..],
        b"{",
        b"{\"type\":\"listen\"",
        b"not json",
        b"{\"type\":}",
    ] {
        assert!(
            matches!(
                DeviceMessage::from_slice(input),
                Err(ParseError::Malformed(_))
            ),
            "{}",
            String::from_utf8_lossy(input)
        );
    }
}

#[test]
fn non_objects_are_a_typed_error() {
    for input in [&b"[1,2]"[..], b"\"hello\"", b"42", b"null"] {
        assert!(matches!(
            DeviceMessage::from_slice(input),
            Err(ParseError::NotAnObject)
        ));
    }
}

#[test]
fn missing_or_non_string_type_is_a_typed_error() {
    for input in [
        &br#"{}"#[..],
        br#"{"state":"start"}"#,
        br#"{"type":1}"#,
        br#"{"type":null}"#,
    ] {
        assert!(matches!(
            DeviceMessage::from_slice(input),
            Err(ParseError::MissingType)
        ));
    }
}

#[test]
fn known_types_with_bad_fields_are_a_typed_error() {
    let cases: [(&[u8], &str); 5] = [
        (br#"{"type":"listen"}"#, "listen"),
        (br#"{"type":"listen","state":5}"#, "listen"),
        (br#"{"type":"mcp"}"#, "mcp"),
        (
            br#"{"type":"hello","audio_params":{"sample_rate":"fast"}}"#,
            "hello",
        ),
        (br#"{"type":"event","data":{}}"#, "event"),
    ];
    for (input, expected) in cases {
        match DeviceMessage::from_slice(input) {
            Err(ParseError::InvalidMessage { message_type, .. }) => {
                assert_eq!(message_type, expected);
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(matches!(
        ServerMessage::from_slice(br#"{"type":"alert","status":"x","message":"y"}"#),
        Err(ParseError::InvalidMessage {
            message_type: "alert",
            ..
        })
    ));
}

#[test]
fn trailing_garbage_is_rejected() {
    assert!(matches!(
        DeviceMessage::from_slice(br#"{"type":"abort"} x"#),
        Err(ParseError::Malformed(_))
    ));
    // Whitespace (a trailing newline) is fine.
    assert!(DeviceMessage::from_slice(b"{\"type\":\"abort\"}\r\n").is_ok());
}
