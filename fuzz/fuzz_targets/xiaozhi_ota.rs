//! The Xiaozhi OTA request as an HTTP request: header lines, a blank line, the JSON body.
//! Reading the headers and the body never panics; what reads keeps its invariants (ids
//! lowercased, values trimmed and non-empty), the body round-trips through its JSON form, and
//! the answer built from it is JSON that parses back to the same answer.
#![no_main]

use libfuzzer_sys::fuzz_target;
use voxgate_xiaozhi::frame::ProtocolVersion;
use voxgate_xiaozhi::ota::{OtaHeaders, OtaRequest, OtaResponse, ServerTime, WebSocketConfig};

/// `Name: value` lines up to the first blank line; the rest is the body.
fn split_request(data: &[u8]) -> (Vec<(String, &[u8])>, &[u8]) {
    let (head, body) = match data.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(at) => (&data[..at], &data[at + 4..]),
        None => (data, &[][..]),
    };
    let headers = head
        .split(|&b| b == b'\n')
        .filter_map(|line| {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let colon = line.iter().position(|&b| b == b':')?;
            let name = String::from_utf8_lossy(&line[..colon]).trim().to_owned();
            Some((name, &line[colon + 1..]))
        })
        .collect();
    (headers, body)
}

fn check_value(value: Option<&String>) {
    if let Some(v) = value {
        assert!(!v.is_empty(), "empty header value kept");
        assert_eq!(v.trim(), v, "header value not trimmed");
    }
}

fuzz_target!(|data: &[u8]| {
    let (pairs, body) = split_request(data);
    let headers = OtaHeaders::from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), *v)));
    for v in [
        &headers.device_id,
        &headers.client_id,
        &headers.activation_version,
        &headers.user_agent,
        &headers.accept_language,
    ] {
        check_value(v.as_ref());
    }
    if let Some(id) = &headers.device_id {
        assert!(
            !id.bytes().any(|b| b.is_ascii_uppercase()),
            "device id not lowercased"
        );
    }
    // Reading what was read changes nothing.
    let again = OtaHeaders::from_pairs(
        [
            ("Device-Id", &headers.device_id),
            ("Client-Id", &headers.client_id),
            ("Activation-Version", &headers.activation_version),
            ("User-Agent", &headers.user_agent),
            ("Accept-Language", &headers.accept_language),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k, v.as_deref()?))),
    );
    assert_eq!(again, headers);

    let Ok(request) = OtaRequest::from_slice(body) else {
        return;
    };
    let json = serde_json::to_vec(&request).expect("a parsed request serializes");
    let again = OtaRequest::from_slice(&json).expect("our own JSON parses");
    // A float without an exact JSON form may move once; after that the request is a fixed point.
    if again != request {
        let json = serde_json::to_vec(&again).expect("a parsed request serializes");
        assert_eq!(OtaRequest::from_slice(&json).ok(), Some(again));
    }
    if let Some(firmware) = request.firmware_echo() {
        assert_eq!(Some(firmware.version.as_str()), request.firmware_version());
        assert!(firmware.url.is_empty(), "the echo offers no download");
    }

    let response = OtaResponse {
        websocket: Some(
            WebSocketConfig::new("ws://127.0.0.1:8000/xiaozhi/v1/", ProtocolVersion::V3)
                .with_token(headers.client_id.clone().unwrap_or_default()),
        ),
        server_time: Some(ServerTime {
            timestamp: request.flash_size.unwrap_or(1_700_000_000_000),
            timezone_offset: 480,
        }),
        firmware: request.firmware_echo(),
        activation: None,
    };
    let wire = response.to_json();
    assert!(
        !wire.contains("\"mqtt\""),
        "the answer never moves the device to MQTT"
    );
    let parsed: OtaResponse = serde_json::from_str(&wire).expect("our answer parses");
    assert_eq!(parsed, response);
});
