//! What one address can make the Xiaozhi OTA and activation endpoints spend (issue 36): a
//! flood of fake-device OTA requests used to push a real device's pending activation code
//! out of the pending table. Now OTA and `/activate` are rate-limited per client address
//! (`429` with `Retry-After`), and a pending code counts against the address that asked for
//! it, so an address only ever evicts its own.
//!
//! Every request comes from 127.0.0.1; with 127.0.0.1 in `trusted_proxies` the client
//! address is the one `X-Forwarded-For` names, which is how these tests speak for several
//! addresses (the server believes forwarding headers only from a trusted proxy).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};
use support::{HttpResponse, Running};
use voxgate_providers::{DemoAgent, NoAsr, ToneTts};
use voxgate_server::{Config, Providers};

/// The real device and where it asks from.
const DEV: &str = "aa:bb:cc:dd:ee:01";
const CLIENT: &str = "3b5c1f2e-0000-4000-8000-000000000001";
const HOME: &str = "198.51.100.7";
/// The address sending fake devices.
const FLOODER: &str = "203.0.113.9";
/// The size of the flood in the finding.
const FLOOD: usize = 300;
/// The operator's token (with loopback a trusted proxy, no request is local).
const ADMIN: &str = "Bearer ota-limits-admin";

fn providers() -> Providers {
    Providers {
        llm: Arc::new(DemoAgent::new()),
        asr: Arc::new(NoAsr),
        tts: Arc::new(ToneTts),
    }
}

/// `[xiaozhi] auth` on, requests from loopback speaking for the address they forward.
fn config() -> Config {
    let mut config = Config::default();
    config.xiaozhi.auth = true;
    config.xiaozhi.token_secret = "ota limits test secret".into();
    config.trusted_proxies = vec!["127.0.0.1".parse().unwrap()];
    config.admin.tokens = vec!["ota-limits-admin".into()];
    // Every request comes from 127.0.0.1 (a trusted proxy naming the client): the connection
    // cap per socket address would refuse the flood's concurrent connections before the OTA
    // limit this file tests sees them.
    config.limits.max_connections_per_ip = 0;
    config
}

fn fake_device(i: usize) -> String {
    format!("02:00:00:00:{:02x}:{:02x}", i >> 8, i & 0xff)
}

/// An OTA request of `device` from `address`.
async fn ota(addr: SocketAddr, address: &str, device: &str, client: &str) -> HttpResponse {
    let body = json!({"mac_address": device, "application": {"version": "1.6.2"}});
    support::http(
        addr,
        "POST",
        "/xiaozhi/ota/",
        &[
            ("Device-Id", device),
            ("Client-Id", client),
            ("Activation-Version", "1"),
            ("Content-Type", "application/json"),
            ("X-Forwarded-For", address),
        ],
        body.to_string().as_bytes(),
    )
    .await
}

/// `device`'s activation poll from `address`.
async fn poll(addr: SocketAddr, address: &str, device: &str, client: &str) -> HttpResponse {
    support::http(
        addr,
        "POST",
        "/xiaozhi/ota/activate",
        &[
            ("Device-Id", device),
            ("Client-Id", client),
            ("Content-Type", "application/json"),
            ("X-Forwarded-For", address),
        ],
        b"{}",
    )
    .await
}

fn code_of(r: &HttpResponse) -> String {
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["activation"]["code"]
        .as_str()
        .unwrap_or_else(|| panic!("no activation code: {}", r.body))
        .to_owned()
}

fn retry_after(r: &HttpResponse) -> Option<u64> {
    r.head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("retry-after")
            .then(|| v.trim().parse().ok())
            .flatten()
    })
}

/// `FLOOD` fake devices' OTA requests from `FLOODER`, all at once.
async fn flood(addr: SocketAddr) -> Vec<HttpResponse> {
    let devices: Vec<String> = (0..FLOOD).map(fake_device).collect();
    futures::future::join_all(devices.iter().map(|d| ota(addr, FLOODER, d, CLIENT))).await
}

async fn confirm(addr: SocketAddr, code: &str) -> HttpResponse {
    let body = json!({ "code": code }).to_string();
    let headers = [
        ("Authorization", ADMIN),
        ("Content-Type", "application/json"),
    ];
    support::http(
        addr,
        "POST",
        "/admin/xiaozhi/activate",
        &headers,
        body.as_bytes(),
    )
    .await
}

async fn pending(addr: SocketAddr) -> Vec<Value> {
    let headers = [("Authorization", ADMIN)];
    let r = support::http(addr, "GET", "/admin/xiaozhi/activations", &headers, b"").await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["pending"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ota_flood_is_rate_limited_and_the_real_devices_code_survives() {
    let server = Running::start_with(config(), providers()).await;
    let addr = server.addr;
    let code = code_of(&ota(addr, HOME, DEV, CLIENT).await);

    let started = Instant::now();
    let answers = flood(addr).await;
    let took = started.elapsed();
    let passed = answers.iter().filter(|r| r.status == 200).count();
    let limited: Vec<&HttpResponse> = answers.iter().filter(|r| r.status == 429).collect();
    eprintln!(
        "{FLOOD} OTA requests from one address in {took:?}: {passed} answered, {} refused with 429",
        limited.len()
    );
    assert_eq!(passed + limited.len(), FLOOD);
    // The burst (10) and what the rate (5 a second) refilled while the flood lasted.
    let refilled = usize::try_from(took.as_millis() * 5 / 1000).unwrap();
    assert!(
        passed >= 10 && passed <= 10 + refilled + 1,
        "{passed} in {took:?}"
    );
    for r in &limited {
        assert_eq!(retry_after(r), Some(1), "{}", r.head);
        assert_eq!(r.json()["success"], false);
    }

    // The real device's code is still pending: its poll waits, the operator confirms it.
    assert_eq!(poll(addr, HOME, DEV, CLIENT).await.status, 202);
    let r = confirm(addr, &code).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["device_id"], DEV);
    assert_eq!(poll(addr, HOME, DEV, CLIENT).await.status, 200);
    // Another address was never slowed by the flood.
    let r = ota(addr, "198.51.100.8", "aa:bb:cc:dd:ee:02", CLIENT).await;
    code_of(&r);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_activation_poll_is_rate_limited_per_address() {
    let server = Running::start_with(config(), providers()).await;
    let addr = server.addr;
    code_of(&ota(addr, HOME, DEV, CLIENT).await);
    let polls = futures::future::join_all((0..40).map(|_| poll(addr, FLOODER, DEV, CLIENT))).await;
    // Polls are not tied to an address (a device may change its own), so these wait (202)
    // until the burst is spent.
    let limited = polls.iter().filter(|r| r.status == 429).count();
    assert!(
        (25..=30).contains(&limited),
        "{limited} of 40 polls limited"
    );
    assert!(polls.iter().all(|r| [202, 429].contains(&r.status)));
    // The device's own polls, from its address, are not affected.
    assert_eq!(poll(addr, HOME, DEV, CLIENT).await.status, 202);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flooding_address_only_evicts_its_own_codes() {
    // No rate limit: every fake device of the flood gets its code.
    let mut config = config();
    config.xiaozhi.ota_rate_per_sec = 0;
    let server = Running::start_with(config, providers()).await;
    let addr = server.addr;
    let code = code_of(&ota(addr, HOME, DEV, CLIENT).await);
    let neighbour = code_of(&ota(addr, "198.51.100.8", "aa:bb:cc:dd:ee:02", CLIENT).await);

    let answers = flood(addr).await;
    assert!(answers.iter().all(|r| r.status == 200));
    let pending = pending(addr).await;
    let count = |address: &str| pending.iter().filter(|p| p["address"] == address).count();
    // The flooder holds its 8 newest codes; everyone else keeps theirs.
    assert_eq!(
        (count(FLOODER), count(HOME), count("198.51.100.8")),
        (8, 1, 1)
    );
    assert_eq!(pending.len(), 10);
    assert_eq!(confirm(addr, &code).await.json()["device_id"], DEV);
    assert_eq!(
        confirm(addr, &neighbour).await.json()["device_id"],
        "aa:bb:cc:dd:ee:02"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_follow_the_socket_peer_without_trusted_proxies() {
    // Not behind a trusted proxy: X-Forwarded-For proves nothing, so every request counts
    // against 127.0.0.1 however many addresses it claims.
    let mut config = config();
    config.trusted_proxies.clear();
    let server = Running::start_with(config, providers()).await;
    let addr = server.addr;
    let answers = futures::future::join_all((0..30).map(|i| {
        let claimed = format!("203.0.113.{}", i + 1);
        async move { ota(addr, &claimed, &fake_device(i), CLIENT).await }
    }))
    .await;
    let limited = answers.iter().filter(|r| r.status == 429).count();
    assert!(limited >= 15, "{limited} of 30 limited");
    server.stop().await;
}
