//! Xiaozhi access control end to end (`[xiaozhi] auth = true`): OTA issues tokens only to
//! allowlisted or operator-activated devices, the activation flow as the firmware drives it
//! (code in the OTA answer, `/activate` polls, the operator's `POST /admin/xiaozhi/activate`),
//! and the upgrade admitting only a token bound to the presented device and client ids.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::SocketAddr;
use std::sync::Arc;

use serde_json::{Value, json};
use support::{HttpResponse, Running, WAIT, Ws, next_message, send_json, try_connect};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use voxgate_providers::{DemoAgent, NoAsr, ToneTts};
use voxgate_server::{Config, Providers};

/// A device nobody has vouched for yet.
const DEV: &str = "aa:bb:cc:dd:ee:01";
const CLIENT: &str = "3b5c1f2e-0000-4000-8000-000000000001";
/// A device on `allowed_devices`.
const LISTED: &str = "11:22:33:44:55:66";
const LISTED_CLIENT: &str = "3b5c1f2e-0000-4000-8000-000000000002";

const OTA_BODY: &str = r#"{"version": 2, "language": "en-US", "mac_address": "aa:bb:cc:dd:ee:01",
  "application": {"name": "xiaozhi", "version": "1.6.2"}, "board": {"type": "bread-compact-wifi"}}"#;

fn providers() -> Providers {
    Providers {
        llm: Arc::new(DemoAgent::new()),
        asr: Arc::new(NoAsr),
        tts: Arc::new(ToneTts),
    }
}

fn auth_config() -> Config {
    let mut config = Config::default();
    config.xiaozhi.auth = true;
    config.xiaozhi.token_secret = "auth test secret".into();
    config.xiaozhi.allowed_devices = vec![LISTED.to_ascii_uppercase()];
    config
}

/// The firmware's OTA request: `Activation-Version` 1, or 2 with a `Serial-Number`.
async fn ota_as(addr: SocketAddr, path: &str, device: &str, client: &str, serial: bool) -> Value {
    let mut headers = vec![
        ("Device-Id", device),
        ("Client-Id", client),
        ("User-Agent", "bread-compact-wifi/1.6.2"),
        ("Content-Type", "application/json"),
    ];
    if serial {
        headers.extend([("Activation-Version", "2"), ("Serial-Number", "SN-0001")]);
    } else {
        headers.push(("Activation-Version", "1"));
    }
    let r = support::http(addr, "POST", path, &headers, OTA_BODY.as_bytes()).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert!(v.get("mqtt").is_none(), "{v}");
    v
}

async fn ota(addr: SocketAddr, device: &str, client: &str) -> Value {
    ota_as(addr, "/xiaozhi/ota/", device, client, false).await
}

/// The device's activation poll.
async fn poll(
    addr: SocketAddr,
    path: &str,
    device: &str,
    client: &str,
    body: &Value,
) -> HttpResponse {
    support::http(
        addr,
        "POST",
        path,
        &[
            ("Device-Id", device),
            ("Client-Id", client),
            ("Content-Type", "application/json"),
        ],
        body.to_string().as_bytes(),
    )
    .await
}

async fn confirm(addr: SocketAddr, code: &str) -> HttpResponse {
    support::post_json(addr, "/admin/xiaozhi/activate", &json!({ "code": code })).await
}

async fn activations(addr: SocketAddr) -> HttpResponse {
    support::http(addr, "GET", "/admin/xiaozhi/activations", &[], b"").await
}

fn token_of(ota: &Value) -> String {
    ota["websocket"]["token"]
        .as_str()
        .expect("websocket.token is always sent")
        .to_owned()
}

/// The activation block of an OTA answer that must carry one (and no usable token).
fn activation_of(ota: &Value) -> (String, String) {
    assert_eq!(token_of(ota), "", "no token before activation: {ota}");
    assert!(
        ota["websocket"]["url"]
            .as_str()
            .unwrap()
            .ends_with("/xiaozhi/v1/")
    );
    assert_eq!(ota["websocket"]["version"], 1);
    let a = &ota["activation"];
    let code = a["code"].as_str().expect("an activation code").to_owned();
    assert_eq!(code.len(), 6, "{a}");
    assert!(code.bytes().all(|b| b.is_ascii_digit()), "{a}");
    assert!(a["message"].as_str().unwrap().contains(&code), "{a}");
    assert!(a["timeout_ms"].as_u64().unwrap() > 0, "{a}");
    let challenge = a["challenge"].as_str().expect("a challenge").to_owned();
    assert!(challenge.len() >= 16, "{a}");
    (code, challenge)
}

/// A 6-digit code that is not `code`.
fn other_code(code: &str) -> String {
    let n: u32 = code.parse().unwrap();
    format!("{:06}", (n + 1) % 1_000_000)
}

async fn upgrade(addr: SocketAddr, headers: &[(&str, &str)]) -> Result<Ws, WsError> {
    try_connect(&format!("ws://{addr}/xiaozhi/v1/"), headers, WAIT).await
}

fn refused(r: Result<Ws, WsError>) -> u16 {
    match r {
        Err(WsError::Http(resp)) => resp.status().as_u16(),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("upgrade accepted"),
    }
}

/// Upgrades with `token` as `device`/`client` and checks the server answers the hello.
async fn connects(addr: SocketAddr, token: &str, device: &str, client: &str) {
    let bearer = format!("Bearer {token}");
    let headers = [
        ("Authorization", bearer.as_str()),
        ("Protocol-Version", "1"),
        ("Device-Id", device),
        ("Client-Id", client),
    ];
    let mut ws = upgrade(addr, &headers)
        .await
        .expect("the upgrade is accepted");
    send_json(
        &mut ws,
        &json!({"type": "hello", "version": 1, "transport": "websocket",
                "audio_params": {"format": "opus", "sample_rate": 16000, "channels": 1, "frame_duration": 60}}),
    )
    .await;
    match next_message(&mut ws, WAIT).await {
        Some(Message::Text(t)) => {
            let v: Value = serde_json::from_str(&t).unwrap();
            assert_eq!(v["type"], "hello", "{v}");
            assert!(v["session_id"].is_string(), "{v}");
        }
        other => panic!("expected the server hello, got {other:?}"),
    }
}

/// Upgrade refusals for `device`/`client` presenting `token`.
async fn refused_with(addr: SocketAddr, token: Option<&str>, device: &str, client: &str) -> u16 {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("Device-Id", device), ("Client-Id", client)];
    if let Some(b) = &bearer {
        headers.push(("Authorization", b.as_str()));
    }
    refused(upgrade(addr, &headers).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_device_is_activated_by_the_operator_then_connects() {
    let server = Running::start_with(auth_config(), providers()).await;
    let addr = server.addr;

    // OTA: an activation code and no token.
    let first = ota(addr, DEV, CLIENT).await;
    let (code, challenge) = activation_of(&first);
    // The firmware asks again (it loops over OTA while waiting): same code, same challenge.
    let again = ota(addr, DEV, CLIENT).await;
    assert_eq!(activation_of(&again), (code.clone(), challenge.clone()));

    // Meanwhile nothing opens the door for it.
    let listed_token = token_of(&ota(addr, LISTED, LISTED_CLIENT).await);
    assert!(!listed_token.is_empty());
    assert_eq!(refused_with(addr, None, DEV, CLIENT).await, 401);
    assert_eq!(refused_with(addr, Some(""), DEV, CLIENT).await, 401);
    let forged = format!("{}.1700000000", "A".repeat(43));
    assert_eq!(refused_with(addr, Some(&forged), DEV, CLIENT).await, 401);
    assert_eq!(
        refused_with(addr, Some("not-a-token"), DEV, CLIENT).await,
        401
    );
    // A real token, issued to another device id (and client id).
    assert_eq!(
        refused_with(addr, Some(&listed_token), DEV, CLIENT).await,
        401
    );
    assert_eq!(
        refused_with(addr, Some(&listed_token), DEV, LISTED_CLIENT).await,
        401
    );
    // Part of a real token, presented by the device it was issued to.
    let half = &listed_token[..listed_token.len() / 2];
    assert_eq!(
        refused_with(addr, Some(half), LISTED, LISTED_CLIENT).await,
        401
    );
    let (sig, _) = listed_token.split_once('.').unwrap();
    assert_eq!(
        refused_with(addr, Some(sig), LISTED, LISTED_CLIENT).await,
        401
    );

    // The device polls: not yet.
    let r = poll(addr, "/xiaozhi/ota/activate", DEV, CLIENT, &json!({})).await;
    assert_eq!(r.status, 202, "{}", r.body);

    // The operator lists what is waiting: the device, never the code.
    let r = activations(addr).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let list = r.json();
    assert_eq!(list["auth"], true);
    let pending = list["pending"].as_array().unwrap();
    assert_eq!(pending.len(), 1, "{list}");
    assert_eq!(pending[0]["device_id"], DEV);
    assert_eq!(pending[0]["client_id"], CLIENT);
    assert!(pending[0]["age_secs"].is_u64());
    assert!(
        !r.body.contains(&code),
        "the listing shows no codes: {}",
        r.body
    );
    assert_eq!(list["activated"], json!([]));

    // A wrong code, and a body without one.
    let r = confirm(addr, &other_code(&code)).await;
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(r.json()["ok"], false);
    assert_eq!(r.json()["error"], "not_found");
    let r = support::post_json(addr, "/admin/xiaozhi/activate", &json!({"pin": 1})).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(
        poll(addr, "/xiaozhi/ota/activate", DEV, CLIENT, &json!({}))
            .await
            .status,
        202
    );

    // The right code binds the device that showed it.
    let r = confirm(addr, &code).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let bound = r.json();
    assert_eq!(bound["ok"], true);
    assert_eq!(bound["device_id"], DEV);
    assert_eq!(bound["client_id"], CLIENT);
    assert_eq!(bound["persisted"], false);
    // A code works once.
    assert_eq!(confirm(addr, &code).await.status, 404);

    let r = poll(addr, "/xiaozhi/ota/activate", DEV, CLIENT, &json!({})).await;
    assert_eq!((r.status, r.body.as_str()), (200, "success"));
    let list = activations(addr).await.json();
    assert_eq!(list["pending"], json!([]));
    assert_eq!(list["activated"][0]["device_id"], DEV);

    // The next OTA hands out the token, which opens the WebSocket.
    let granted = ota(addr, DEV, CLIENT).await;
    assert!(granted.get("activation").is_none(), "{granted}");
    let token = token_of(&granted);
    assert!(!token.is_empty());
    connects(addr, &token, DEV, CLIENT).await;
    // Bound to its ids: device A's token with `Device-Id: B` (even an allowlisted B), or with
    // another client id, is refused.
    assert_eq!(refused_with(addr, Some(&token), LISTED, CLIENT).await, 401);
    assert_eq!(
        refused_with(addr, Some(&token), "aa:bb:cc:dd:ee:02", CLIENT).await,
        401
    );
    assert_eq!(
        refused_with(addr, Some(&token), DEV, LISTED_CLIENT).await,
        401
    );
    // The same MAC with another client id is a new device to the server: a new code.
    let (intruder_code, _) = activation_of(&ota(addr, DEV, "someone-else").await);
    assert_ne!(intruder_code, code);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowlisted_device_gets_a_token_but_never_skips_it() {
    let server = Running::start_with(auth_config(), providers()).await;
    let addr = server.addr;
    let answer = ota(addr, LISTED, LISTED_CLIENT).await;
    assert!(answer.get("activation").is_none(), "{answer}");
    let token = token_of(&answer);
    assert!(!token.is_empty());
    // The allowlist decides who gets a token, not who may come in without one.
    assert_eq!(refused_with(addr, None, LISTED, LISTED_CLIENT).await, 401);
    connects(addr, &token, LISTED, LISTED_CLIENT).await;
    // `/activate` has nothing to wait for.
    let r = poll(
        addr,
        "/xiaozhi/ota/activate",
        LISTED,
        LISTED_CLIENT,
        &json!({}),
    )
    .await;
    assert_eq!(r.status, 200);
    // OTA without a client id cannot be bound to one: refused with auth on.
    let r = support::http(
        addr,
        "POST",
        "/xiaozhi/ota/",
        &[("Device-Id", LISTED), ("Content-Type", "application/json")],
        b"{}",
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.body);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_with_a_serial_number_echoes_the_challenge() {
    let mut config = auth_config();
    config.xiaozhi.ota_listen = Some("127.0.0.1:0".parse().unwrap());
    let server = Running::start_with(config, providers()).await;
    let ota_addr = server.listener("xiaozhi-ota").unwrap();
    // A device configured with the OTA URL `http://<host>/custom/` polls `/custom/activate`.
    let answer = ota_as(ota_addr, "/custom/", DEV, CLIENT, true).await;
    let (code, challenge) = activation_of(&answer);
    let signed = |challenge: &str| {
        json!({"algorithm": "hmac-sha256", "serial_number": "SN-0001",
               "challenge": challenge, "hmac": "00".repeat(32)})
    };
    for body in [json!({}), signed("not the challenge")] {
        let r = poll(ota_addr, "/custom/activate", DEV, CLIENT, &body).await;
        assert_eq!(r.status, 403, "{body}: {}", r.body);
    }
    let r = poll(
        ota_addr,
        "/custom/activate",
        DEV,
        CLIENT,
        &signed(&challenge),
    )
    .await;
    assert_eq!(r.status, 202, "{}", r.body);
    let r = poll(ota_addr, "/custom/activate", DEV, CLIENT, &json!([1])).await;
    assert_eq!(r.status, 400, "{}", r.body);
    // Another device's poll knows nothing pending.
    let r = poll(
        ota_addr,
        "/custom/activate",
        "aa:bb:cc:dd:ee:09",
        CLIENT,
        &json!({}),
    )
    .await;
    assert_eq!(r.status, 404, "{}", r.body);
    let listed = activations(server.addr).await.json();
    assert_eq!(listed["pending"][0]["serial_number"], "SN-0001");

    assert_eq!(confirm(server.addr, &code).await.status, 200);
    let r = poll(
        ota_addr,
        "/xiaozhi/ota/activate",
        DEV,
        CLIENT,
        &signed(&challenge),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let token = token_of(&ota_as(ota_addr, "/custom/", DEV, CLIENT, true).await);
    connects(server.addr, &token, DEV, CLIENT).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_activations_are_bounded() {
    let mut config = auth_config();
    config.xiaozhi.max_pending_activations = 3;
    let server = Running::start_with(config, providers()).await;
    let addr = server.addr;
    let devices: Vec<String> = (0..5).map(|i| format!("02:00:00:00:00:{i:02x}")).collect();
    let mut codes = Vec::new();
    for d in &devices {
        codes.push(activation_of(&ota(addr, d, CLIENT).await).0);
    }
    let list = activations(addr).await.json();
    let pending: Vec<&str> = list["pending"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["device_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        pending,
        [
            "02:00:00:00:00:02",
            "02:00:00:00:00:03",
            "02:00:00:00:00:04"
        ]
    );
    // The evicted code is gone; its device is told to ask OTA again.
    assert_eq!(confirm(addr, &codes[0]).await.status, 404);
    let r = poll(
        addr,
        "/xiaozhi/ota/activate",
        &devices[0],
        CLIENT,
        &json!({}),
    )
    .await;
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(
        confirm(addr, &codes[4]).await.json()["device_id"],
        devices[4]
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activations_survive_a_restart_in_the_file() {
    let dir = std::env::temp_dir().join(format!(
        "voxgate-xiaozhi-auth-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("activated.json");
    let mut config = auth_config();
    config.xiaozhi.activated_devices_file = file.display().to_string();
    // A random token key per process: tokens die with the server, activations do not.
    config.xiaozhi.token_secret = String::new();

    let server = Running::start_with(config.clone(), providers()).await;
    let (code, _) = activation_of(&ota(server.addr, DEV, CLIENT).await);
    let r = confirm(server.addr, &code).await;
    assert_eq!(r.json()["persisted"], true, "{}", r.body);
    server.stop().await;
    let saved: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(saved[0]["device_id"], DEV);
    assert_eq!(saved[0]["client_id"], CLIENT);
    assert!(saved[0]["activated_at"].as_u64().unwrap() > 1_600_000_000);

    let server = Running::start_with(config, providers()).await;
    let answer = ota(server.addr, DEV, CLIENT).await;
    assert!(answer.get("activation").is_none(), "{answer}");
    connects(server.addr, &token_of(&answer), DEV, CLIENT).await;
    server.stop().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auth_off_every_device_gets_its_url_and_connects() {
    let server = Running::start_with(Config::default(), providers()).await;
    let addr = server.addr;
    let answer = ota(addr, DEV, CLIENT).await;
    assert!(answer.get("activation").is_none(), "{answer}");
    assert!(!token_of(&answer).is_empty());
    let r = poll(addr, "/xiaozhi/ota/activate", DEV, CLIENT, &json!({})).await;
    assert_eq!((r.status, r.body.as_str()), (200, "success"));
    // No token needed, and a wrong one is ignored.
    let mut ws = upgrade(addr, &[("Device-Id", DEV)]).await.unwrap();
    send_json(
        &mut ws,
        &json!({"type": "hello", "version": 1, "transport": "websocket"}),
    )
    .await;
    assert!(matches!(
        next_message(&mut ws, WAIT).await,
        Some(Message::Text(_))
    ));
    connects(addr, "forged.1", DEV, CLIENT).await;
    let list = activations(addr).await.json();
    assert_eq!(list["auth"], false);
    assert_eq!(list["pending"], json!([]));
    server.stop().await;
}
