//! OTA request/response and the WebSocket upgrade parameters.
// Test helpers outside #[test] fns are not covered by clippy.toml's test exemptions.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use voxgate_xiaozhi::connect::{AuthError, Authenticated, ConnectParams};
use voxgate_xiaozhi::frame::{ProtocolVersion, UnsupportedVersion};
use voxgate_xiaozhi::ota::{
    ActivateRequest, Activation, DeviceAllowlist, OtaHeaders, OtaRequest, OtaResponse,
    WebSocketConfig,
};
use voxgate_xiaozhi::token::{self, TokenError, TokenSecret};

#[test]
fn ota_headers_are_case_insensitive_and_typed() {
    let headers = OtaHeaders::from_pairs([
        ("DEVICE-ID", &b"AA:BB:CC:DD:EE:FF"[..]),
        ("client-id", b" 3f1a6c2e "),
        ("Activation-Version", b"2"),
        ("Serial-Number", b"SN-0001"),
        ("user-agent", b"bread-compact-wifi/1.6.0"),
        ("Accept-Language", b"zh-CN"),
        ("Content-Type", b"application/json"),
        ("Device-Id", b"ignored:repeat"),
    ]);
    assert_eq!(
        headers,
        OtaHeaders {
            device_id: Some("aa:bb:cc:dd:ee:ff".into()),
            client_id: Some("3f1a6c2e".into()),
            activation_version: Some("2".into()),
            serial_number: Some("SN-0001".into()),
            user_agent: Some("bread-compact-wifi/1.6.0".into()),
            accept_language: Some("zh-CN".into()),
        }
    );
    let bad = OtaHeaders::from_pairs([("Device-Id", &b"\xff\xfe"[..]), ("Client-Id", b"  ")]);
    assert_eq!(bad, OtaHeaders::default());
}

#[test]
fn ota_request_is_lenient() {
    let request = OtaRequest::from_slice(
        br#"{"minimum_free_heap_size":"123","flash_size":"","version":"2","board":{"rssi":-60,"type":"m5stack"},"future_key":[1]}"#,
    )
    .unwrap();
    assert_eq!(request.minimum_free_heap_size, Some(123));
    assert_eq!(request.flash_size, None);
    assert_eq!(request.version, Some(2));
    let board = request.board.as_ref().unwrap();
    assert_eq!(
        (board.rssi, board.board_type.as_deref()),
        (Some(-60), Some("m5stack"))
    );
    assert_eq!(request.other["future_key"], serde_json::json!([1]));
    assert_eq!(request.firmware_echo(), None);

    assert_eq!(
        OtaRequest::from_slice(b"{}").unwrap(),
        OtaRequest::default()
    );
    assert!(OtaRequest::from_slice(br#"{"flash_size":"lots"}"#).is_err());
    assert!(OtaRequest::from_slice(b"[]").is_err());
}

#[test]
fn ota_response_round_trips_and_never_has_mqtt() {
    let response = OtaResponse {
        websocket: Some(WebSocketConfig::new(
            "ws://h/xiaozhi/v1/",
            ProtocolVersion::V3,
        )),
        ..OtaResponse::default()
    };
    let json = response.to_json();
    assert!(json.contains(r#""token":"""#));
    assert!(json.contains(r#""version":3"#));
    let back: OtaResponse = serde_json::from_str(&json).unwrap();
    assert_eq!(back, response);
    // A client reading someone else's response ignores an mqtt section and rejects a bad version.
    let with_mqtt: OtaResponse = serde_json::from_str(
        r#"{"mqtt":{"endpoint":"x"},"websocket":{"url":"ws://h/","version":"2"},"server_time":{"timestamp":"5"}}"#,
    )
    .unwrap();
    assert_eq!(with_mqtt.websocket.unwrap().version, ProtocolVersion::V2);
    assert_eq!(with_mqtt.server_time.unwrap().timezone_offset, 0);
    assert!(
        serde_json::from_str::<OtaResponse>(r#"{"websocket":{"url":"u","version":9}}"#).is_err()
    );
}

const NOW: u64 = 1_700_000_000;
const DEVICE: &str = "aa:bb:cc:dd:ee:ff";

fn secret() -> TokenSecret {
    TokenSecret::new("s3cret").unwrap()
}

#[test]
fn upgrade_headers() {
    let params = ConnectParams::from_headers([
        ("authorization", "Bearer abc.123"),
        ("PROTOCOL-VERSION", "2"),
        ("Device-Id", "AA:BB:CC:DD:EE:FF"),
        ("Client-Id", "c1"),
        ("Sec-WebSocket-Extensions", "permessage-deflate"),
    ]);
    assert_eq!(
        params,
        ConnectParams {
            token: Some("abc.123".into()),
            protocol_version: Some("2".into()),
            device_id: Some(DEVICE.into()),
            client_id: Some("c1".into()),
        }
    );
    assert_eq!(params.framing(), Ok(ProtocolVersion::V2));
}

#[test]
fn a_token_with_a_space_is_kept_verbatim() {
    let params = ConnectParams::from_headers([("Authorization", "Token with spaces")]);
    assert_eq!(params.token.as_deref(), Some("Token with spaces"));
}

#[test]
fn browser_query_parameters() {
    let params = ConnectParams::from_query(
        "?device-id=AA%3Abb%3Acc%3Add%3Aee%3Aff&client-id=web+client&authorization=Bearer%20t.1&x=y",
    );
    assert_eq!(params.device_id.as_deref(), Some(DEVICE));
    assert_eq!(params.client_id.as_deref(), Some("web client"));
    assert_eq!(params.token.as_deref(), Some("t.1"));
    // No version from a browser: the plain v1 framing.
    assert_eq!(params.framing(), Ok(ProtocolVersion::V1));
    // Headers win; the query fills the gaps.
    let merged = ConnectParams::from_headers([("Protocol-Version", "3")]).or(params);
    assert_eq!(merged.framing(), Ok(ProtocolVersion::V3));
    assert_eq!(merged.device_id.as_deref(), Some(DEVICE));
}

#[test]
fn unsupported_protocol_version_is_typed() {
    let params = ConnectParams::from_headers([("Protocol-Version", "4")]);
    assert_eq!(params.framing(), Err(UnsupportedVersion::Number(4)));
}

#[test]
fn authentication() {
    let issued = token::issue(&secret(), "c1", DEVICE, NOW).unwrap();
    let bearer = format!("Bearer {issued}");
    let good = ConnectParams::from_headers([
        ("Authorization", bearer.as_str()),
        ("Device-Id", DEVICE),
        ("Client-Id", "c1"),
    ]);
    assert_eq!(
        good.authenticate(&secret(), NOW),
        Ok(Authenticated::Token { issued_at: NOW })
    );

    let no_device = ConnectParams::from_headers([("Authorization", bearer.as_str())]);
    assert_eq!(
        no_device.authenticate(&secret(), NOW),
        Err(AuthError::MissingDeviceId)
    );
    let no_token = ConnectParams::from_headers([("Device-Id", DEVICE), ("Client-Id", "c1")]);
    assert_eq!(
        no_token.authenticate(&secret(), NOW),
        Err(AuthError::MissingToken)
    );
    let no_client =
        ConnectParams::from_headers([("Authorization", bearer.as_str()), ("Device-Id", DEVICE)]);
    assert_eq!(
        no_client.authenticate(&secret(), NOW),
        Err(AuthError::MissingClientId)
    );
    let other_device = ConnectParams {
        device_id: Some("11:22:33:44:55:66".into()),
        ..good.clone()
    };
    assert_eq!(
        other_device.authenticate(&secret(), NOW),
        Err(AuthError::Token(TokenError::BadSignature))
    );
    let other_client = ConnectParams {
        client_id: Some("c2".into()),
        ..good.clone()
    };
    assert_eq!(
        other_client.authenticate(&secret(), NOW),
        Err(AuthError::Token(TokenError::BadSignature))
    );
    // Half a token is no token.
    let partial = ConnectParams {
        token: Some(issued[..issued.len() / 2].to_owned()),
        ..good
    };
    assert!(partial.authenticate(&secret(), NOW).is_err());
}

#[test]
fn the_allowlist_is_case_insensitive_and_admits_nobody_at_upgrade() {
    let list = DeviceAllowlist::new(["AA:BB:CC:DD:EE:FF", " ", "11:22:33:44:55:66 "]);
    assert!(list.contains(DEVICE));
    assert!(list.contains("11:22:33:44:55:66"));
    assert!(!list.contains(""));
    assert!(!list.is_empty());
    assert!(DeviceAllowlist::default().is_empty());
    // Being listed is no way in: the upgrade still needs the token.
    let listed = ConnectParams::from_headers([("Device-Id", DEVICE), ("Client-Id", "c1")]);
    assert_eq!(
        listed.authenticate(&secret(), NOW),
        Err(AuthError::MissingToken)
    );
}

#[test]
fn activation_wire_shapes() {
    let response = OtaResponse {
        websocket: Some(WebSocketConfig::new(
            "ws://h/xiaozhi/v1/",
            ProtocolVersion::V1,
        )),
        activation: Some(Activation {
            code: "012345".into(),
            message: "code".into(),
            challenge: Some("c0ffee".into()),
            timeout_ms: Some(600_000),
        }),
        ..OtaResponse::default()
    };
    assert_eq!(
        response.to_json(),
        r#"{"websocket":{"url":"ws://h/xiaozhi/v1/","token":"","version":1},"activation":{"code":"012345","message":"code","challenge":"c0ffee","timeout_ms":600000}}"#
    );
    assert_eq!(
        ActivateRequest::from_slice(b"").unwrap(),
        ActivateRequest::default()
    );
    assert_eq!(
        ActivateRequest::from_slice(b" {} ").unwrap(),
        ActivateRequest::default()
    );
    let signed = ActivateRequest::from_slice(
        br#"{"algorithm":"hmac-sha256","serial_number":"SN1","challenge":"c0ffee","hmac":"ab","x":1}"#,
    )
    .unwrap();
    assert_eq!(signed.challenge.as_deref(), Some("c0ffee"));
    assert_eq!(signed.serial_number.as_deref(), Some("SN1"));
    assert!(ActivateRequest::from_slice(b"[1]").is_err());
    assert!(ActivateRequest::from_slice(br#"{"challenge":5}"#).is_err());
}
