//! The exact JSON text of every message this crate writes.
//!
//! Control messages are snapshotted as the compact text sent on the wire (key order and all),
//! because the firmware's and third-party clients' parsers are the judges of that text.
// Test helpers outside #[test] fns are not covered by clippy.toml's test exemptions.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::json;
use voxgate_xiaozhi::control::{
    Abort, AbortReason, Alert, AudioParams, DeviceHello, DeviceMessage, Emotion, Event, Features,
    Iot, Listen, ListenMode, Llm, Mcp, ServerHello, ServerMessage, Stt, System, SystemCommand,
    Transport, Tts, UnknownMessage,
};
use voxgate_xiaozhi::frame::ProtocolVersion;
use voxgate_xiaozhi::ota::{
    Activation, Firmware, OtaRequest, OtaResponse, ServerTime, WebSocketConfig,
};

fn with_session<T>(mut message: T, set: impl FnOnce(&mut T)) -> T {
    set(&mut message);
    message
}

fn device(message: impl Into<DeviceMessage>) -> String {
    message.into().to_json()
}

fn server(message: impl Into<ServerMessage>) -> String {
    message.into().to_json()
}

#[test]
fn device_hello() {
    let hello = DeviceHello {
        session_id: None,
        version: Some(3),
        features: Features {
            aec: Some(true),
            mcp: Some(true),
            glyph_push: Some(false),
            other: [("camera".to_owned(), json!(true))].into_iter().collect(),
        },
        transport: Some(Transport::WebSocket),
        audio_params: Some(AudioParams::uplink()),
    };
    insta::assert_snapshot!("device_hello", device(hello));
    insta::assert_snapshot!("device_hello_minimal", device(DeviceHello::default()));
}

#[test]
fn server_hello() {
    insta::assert_snapshot!("server_hello", server(ServerHello::new("b6f1c6a2")));
    let custom = ServerHello {
        audio_params: AudioParams {
            sample_rate: 16_000,
            frame_duration: 20,
            ..AudioParams::downlink()
        },
        ..ServerHello::new("")
    };
    insta::assert_snapshot!("server_hello_16k_20ms_empty_session", server(custom));
}

#[test]
fn listen() {
    insta::assert_snapshot!(
        "listen_start_auto",
        device(with_session(Listen::start(ListenMode::Auto), |m| {
            m.session_id = Some("s1".into());
        }))
    );
    insta::assert_snapshot!(
        "listen_start_manual",
        device(Listen::start(ListenMode::Manual))
    );
    insta::assert_snapshot!(
        "listen_start_realtime",
        device(Listen::start(ListenMode::Realtime))
    );
    insta::assert_snapshot!("listen_stop", device(Listen::stop()));
    insta::assert_snapshot!("listen_detect", device(Listen::detect("你好小智")));
}

#[test]
fn abort() {
    insta::assert_snapshot!("abort", device(Abort::default()));
    insta::assert_snapshot!(
        "abort_wake_word",
        device(Abort {
            session_id: Some("s1".into()),
            reason: Some(AbortReason::WakeWordDetected),
        })
    );
}

#[test]
fn mcp() {
    let payload = json!({"jsonrpc": "2.0", "method": "tools/call", "id": 3,
        "params": {"name": "self.audio_speaker.set_volume", "arguments": {"volume": 50}}});
    insta::assert_snapshot!("mcp", server(Mcp::wrap(payload.clone())));
    insta::assert_snapshot!(
        "mcp_with_session",
        device(Mcp::wrap(payload).with_session_id("s1"))
    );
}

#[test]
fn iot_and_event() {
    let iot = Iot {
        session_id: Some("s1".into()),
        fields: [(
            "states".to_owned(),
            json!([{"name": "Speaker", "state": {"volume": 80}}]),
        )]
        .into_iter()
        .collect(),
    };
    insta::assert_snapshot!("iot", device(iot));
    let event = Event {
        session_id: None,
        name: "sound_event".into(),
        data: Some(json!({"direction": 90})),
        ts: Some(1_715_000_000_123_u64.into()),
    };
    insta::assert_snapshot!("event", device(event));
}

#[test]
fn unknown() {
    let unknown = UnknownMessage {
        message_type: "goodbye".into(),
        fields: [("session_id".to_owned(), json!("s1"))]
            .into_iter()
            .collect(),
    };
    insta::assert_snapshot!("unknown_device", device(unknown.clone()));
    insta::assert_snapshot!("unknown_server", server(unknown));
}

#[test]
fn stt_tts_llm() {
    insta::assert_snapshot!("stt", server(Stt::new("what's the weather \"today\"?")));
    insta::assert_snapshot!("tts_start", server(Tts::start()));
    insta::assert_snapshot!(
        "tts_sentence_start",
        server(Tts::sentence_start("今天天气很好。"))
    );
    insta::assert_snapshot!(
        "tts_stop",
        server(with_session(Tts::stop(), |m| m.session_id = Some("s1".into())))
    );
    insta::assert_snapshot!("llm", server(Llm::from_emotion(Emotion::Happy)));
    insta::assert_snapshot!(
        "llm_from_unlisted_emoji",
        server(Llm {
            session_id: None,
            text: "😊".into(),
            emotion: Emotion::Happy,
        })
    );
}

#[test]
fn system_and_alert() {
    insta::assert_snapshot!(
        "system_reboot",
        server(System {
            session_id: None,
            command: SystemCommand::Reboot,
        })
    );
    insta::assert_snapshot!(
        "alert",
        server(Alert {
            session_id: None,
            status: "Warning".into(),
            message: "Battery low".into(),
            emotion: Emotion::Sad,
        })
    );
    // Empty fields are still written: the firmware needs all three keys.
    insta::assert_snapshot!(
        "alert_empty",
        server(Alert {
            session_id: Some("s1".into()),
            status: String::new(),
            message: String::new(),
            emotion: Emotion::Other(String::new()),
        })
    );
}

#[test]
fn ota_response() {
    let full = OtaResponse {
        websocket: Some(
            WebSocketConfig::new("ws://192.168.1.10:8000/xiaozhi/v1/", ProtocolVersion::V2)
                .with_token("c2lnbmF0dXJl.1700000000"),
        ),
        server_time: Some(ServerTime {
            timestamp: 1_700_000_000_000,
            timezone_offset: 480,
        }),
        firmware: Some(Firmware {
            version: "1.6.0".into(),
            url: String::new(),
        }),
        activation: Some(Activation {
            code: "123456".into(),
            message: "xiaozhi.me\n123456".into(),
            challenge: Some("2f1c".into()),
            timeout_ms: None,
        }),
    };
    insta::assert_json_snapshot!("ota_response_full", full);
    insta::assert_snapshot!("ota_response_full_wire", full.to_json());
    let tokenless = OtaResponse {
        websocket: Some(WebSocketConfig::new(
            "ws://host:8000/xiaozhi/v1/",
            ProtocolVersion::V1,
        )),
        ..OtaResponse::default()
    };
    insta::assert_snapshot!("ota_response_tokenless", tokenless.to_json());
}

#[test]
fn ota_request_normalized() {
    let body = br#"{"version":2,"language":"zh-CN","flash_size":16777216,"minimum_free_heap_size":"7265","mac_address":"aa:bb:cc:dd:ee:ff","uuid":"5b4e2a4c","chip_model_name":"esp32s3","chip_info":{"model":9,"cores":2,"revision":2,"features":18},"application":{"name":"xiaozhi","version":"1.6.0","compile_time":"Apr  1 2025T12:00:00Z","idf_version":"v5.4","elf_sha256":"ab12"},"partition_table":[{"label":"nvs","type":1,"subtype":2,"address":36864,"size":16384}],"ota":{"label":"ota_0"},"board":{"type":"bread-compact-wifi","name":"bread","ssid":"home","rssi":"-55","channel":1,"ip":"192.168.1.20","mac":"aa:bb:cc:dd:ee:ff"}}"#;
    let request = OtaRequest::from_slice(body).unwrap();
    insta::assert_json_snapshot!("ota_request", request);
}
