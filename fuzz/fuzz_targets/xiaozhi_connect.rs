//! The Xiaozhi WebSocket upgrade's parameters: the first line is the URL query (browser
//! clients), the following lines are `Name: value` headers (devices). Reading never panics,
//! values keep their invariants, headers and query round-trip, and authentication agrees with
//! the token verifier.
#![no_main]

use std::fmt::Write as _;
use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use voxgate_xiaozhi::connect::{AuthError, Authenticated, ConnectParams};
use voxgate_xiaozhi::token::{self, TokenSecret};

const NOW: u64 = 1_700_000_000;

static SECRET: LazyLock<TokenSecret> =
    LazyLock::new(|| TokenSecret::new("fuzz secret").expect("non-empty"));

fn percent_encode_all(text: &str) -> String {
    text.bytes().fold(String::new(), |mut out, b| {
        let _ = write!(out, "%{b:02X}");
        out
    })
}

fn check(params: &ConnectParams) {
    for v in [
        &params.token,
        &params.protocol_version,
        &params.device_id,
        &params.client_id,
    ]
    .into_iter()
    .flatten()
    {
        assert!(!v.is_empty(), "empty value kept");
        assert_eq!(v.trim(), v, "value not trimmed");
    }
    if let Some(id) = &params.device_id {
        assert!(
            !id.bytes().any(|b| b.is_ascii_uppercase()),
            "device id not lowercased"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let (query, head) = match data.iter().position(|&b| b == b'\n') {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[][..]),
    };
    let headers: Vec<(String, &[u8])> = head
        .split(|&b| b == b'\n')
        .filter_map(|line| {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let colon = line.iter().position(|&b| b == b':')?;
            let name = String::from_utf8_lossy(&line[..colon]).trim().to_owned();
            Some((name, &line[colon + 1..]))
        })
        .collect();
    let from_headers = ConnectParams::from_headers(headers.iter().map(|(k, v)| (k.as_str(), *v)));
    let from_query = ConnectParams::from_query(&String::from_utf8_lossy(query));
    check(&from_headers);
    check(&from_query);
    let params = from_headers.clone().or(from_query.clone());
    check(&params);
    assert_eq!(
        params.device_id,
        from_headers
            .device_id
            .clone()
            .or(from_query.device_id.clone())
    );

    // What was read, written back as headers and as a fully escaped query, reads the same.
    let mut written = Vec::new();
    if let Some(t) = &params.token {
        written.push(("Authorization", format!("Bearer {t}")));
    }
    for (name, value) in [
        ("Protocol-Version", &params.protocol_version),
        ("Device-Id", &params.device_id),
        ("Client-Id", &params.client_id),
    ] {
        if let Some(v) = value {
            written.push((name, v.clone()));
        }
    }
    let reread = ConnectParams::from_headers(written.iter().map(|(k, v)| (*k, v.as_str())));
    assert_eq!(reread, params, "headers do not round-trip");
    let query: Vec<String> = written
        .iter()
        .map(|(k, v)| format!("{}={}", k.to_ascii_lowercase(), percent_encode_all(v)))
        .collect();
    let reread = ConnectParams::from_query(&format!("?{}", query.join("&")));
    assert_eq!(reread, params, "query does not round-trip");

    match params.framing() {
        Ok(v) => {
            let sent = params
                .protocol_version
                .as_deref()
                .map_or(Ok(1), |p| p.trim().parse());
            assert_eq!(sent, Ok(u64::from(v.number())));
        }
        Err(_) => assert!(params.protocol_version.is_some()),
    }

    // No device id skips the token: only a valid token bound to both ids is admitted.
    match params.authenticate(&SECRET, NOW) {
        Ok(Authenticated::Token { issued_at }) => {
            let (Some(t), Some(c), Some(d)) = (&params.token, &params.client_id, &params.device_id)
            else {
                panic!("a token was accepted without all of token, client and device");
            };
            assert_eq!(token::verify(&SECRET, t, c, d, NOW), Ok(issued_at));
        }
        Ok(other) => panic!("unknown admission {other:?}"),
        Err(AuthError::MissingDeviceId) => assert!(params.device_id.is_none()),
        Err(AuthError::MissingToken) => assert!(params.token.is_none()),
        Err(AuthError::MissingClientId) => assert!(params.client_id.is_none()),
        Err(_) => {}
    }
});
