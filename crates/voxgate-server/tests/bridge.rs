//! The Bridge HTTP API over real sockets: `/api/message` turns with the emoji prefix and
//! per-conversation history, token auth, JSON errors, perception events on the bus, and the
//! localhost-only admin routes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use support::{Running, Sse, WAIT, http, post_json};
use voxgate_providers::{Llm, LlmEvent, LlmRequest, LlmStream, ProviderError};
use voxgate_server::{Config, Providers};

async fn message(server: &Running, body: Value) -> Value {
    let r = post_json(server.addr, "/api/message", &body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

#[tokio::test]
async fn message_replies_with_the_emoji_prefix_and_keeps_history_per_conversation() {
    tokio::time::timeout(WAIT * 3, async {
        let server = Running::start(Config::default()).await;
        // DemoAgent echoes with 😊, which the stackchan channel allows.
        let r = message(
            &server,
            json!({"content":"hello there","channel":"stackchan","session_id":"s1"}),
        )
        .await;
        assert_eq!(r["response"], "😊 You said: hello there");
        assert_eq!(r["session_id"], "s1");
        // 🤷 is not one of the nine faces: the default face replaces it.
        let r = message(
            &server,
            json!({"content":"call nope {}","channel":"stackchan","session_id":"s1"}),
        )
        .await;
        let text = r["response"].as_str().unwrap();
        assert!(text.starts_with("😐 I do not know a tool called"), "{text}");
        assert!(!text.contains('🤷'), "{text}");
        // Other channels get the model's reply as it is.
        let r = message(&server, json!({"content":"call nope {}","channel":"web"})).await;
        let text = r["response"].as_str().unwrap();
        assert!(text.starts_with("🤷 I do not know"), "{text}");

        let r = http(server.addr, "GET", "/admin/conversations", &[], b"").await;
        assert_eq!(r.status, 200);
        let list = r.json()["conversations"].as_array().unwrap().clone();
        let find = |key: &str| list.iter().find(|c| c["key"] == key).cloned().unwrap();
        let s1 = find("stackchan:s1");
        assert_eq!(s1["turns"], 2);
        // Two user messages and two replies (plus the system prompt).
        assert!(s1["messages"].as_u64().unwrap() >= 4, "{s1}");
        assert_eq!(find("web:default")["turns"], 1);

        // Clearing forgets the history.
        let r = post_json(
            server.addr,
            "/admin/conversations/clear",
            &json!({"key":"stackchan:s1"}),
        )
        .await;
        assert_eq!(r.json()["cleared"], 1);
        let r = http(server.addr, "GET", "/admin/conversations", &[], b"").await;
        assert_eq!(r.json()["conversations"].as_array().unwrap().len(), 1);
        server.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn tokens_guard_the_api() {
    tokio::time::timeout(WAIT * 2, async {
        let mut config = Config::default();
        config.bridge.tokens = vec!["tok".into()];
        let server = Running::start(config).await;
        let body = json!({"content":"hi"}).to_string();
        let r = http(server.addr, "POST", "/api/message", &[], body.as_bytes()).await;
        assert_eq!(r.status, 401);
        assert_eq!(r.json()["error"], "unauthorized");
        assert!(
            r.head
                .to_ascii_lowercase()
                .contains("www-authenticate: bearer")
        );
        let wrong = [("Authorization", "Bearer nope")];
        let r = http(server.addr, "POST", "/api/message", &wrong, body.as_bytes()).await;
        assert_eq!(r.status, 401);
        let event = json!({"name":"face_lost","device_id":"d"}).to_string();
        let r = http(
            server.addr,
            "POST",
            "/api/perception/event",
            &wrong,
            event.as_bytes(),
        )
        .await;
        assert_eq!(r.status, 401);
        let r = http(server.addr, "GET", "/admin/sessions", &[], b"").await;
        assert_eq!(r.status, 401);
        let good = [("Authorization", "Bearer tok")];
        let r = http(server.addr, "POST", "/api/message", &good, body.as_bytes()).await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.json()["response"], "😊 You said: hi");
        let r = http(
            server.addr,
            "POST",
            "/api/perception/event",
            &good,
            event.as_bytes(),
        )
        .await;
        assert_eq!(r.json(), json!({"ok": true}));
        let r = http(server.addr, "GET", "/admin/sessions", &good, b"").await;
        assert_eq!(r.status, 200);
        // The scheme in any letter case, as docs/security.md says.
        let lower = [("Authorization", "bearer tok")];
        let r = http(server.addr, "POST", "/api/message", &lower, body.as_bytes()).await;
        assert_eq!(r.status, 200, "{}", r.body);
        // /health stays open.
        let r = http(server.addr, "GET", "/health", &[], b"").await;
        assert_eq!(r.status, 200);
        server.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn bad_requests_get_json_errors_with_their_status() {
    tokio::time::timeout(WAIT * 2, async {
        let mut config = Config::default();
        config.bridge.max_body_bytes = 1024;
        let server = Running::start(config).await;
        let a = server.addr;
        let check = |r: support::HttpResponse, status: u16, code: &str| {
            assert_eq!(r.status, status, "{}", r.body);
            let v = r.json();
            assert_eq!(v["ok"], false);
            assert_eq!(v["error"], code, "{v}");
            assert!(!v["detail"].as_str().unwrap().is_empty());
        };
        check(
            http(a, "POST", "/api/message", &[], b"{not json").await,
            400,
            "bad_json",
        );
        check(
            post_json(a, "/api/message", &json!([1, 2])).await,
            400,
            "bad_request",
        );
        check(
            post_json(a, "/api/message", &json!({"content":"  "})).await,
            400,
            "bad_request",
        );
        check(
            post_json(a, "/api/message", &json!({"content":5})).await,
            400,
            "bad_request",
        );
        check(
            post_json(a, "/api/message", &json!({"content":"x","channel":1})).await,
            400,
            "bad_request",
        );
        let big = json!({"content": "x".repeat(4096)});
        check(post_json(a, "/api/message", &big).await, 413, "too_large");
        check(
            http(a, "GET", "/api/nope", &[], b"").await,
            404,
            "not_found",
        );
        check(
            http(a, "GET", "/admin/nope", &[], b"").await,
            404,
            "not_found",
        );
        check(
            http(a, "GET", "/api/message", &[], b"").await,
            405,
            "method_not_allowed",
        );
        check(
            post_json(a, "/api/perception/event", &json!({"device_id":"d"})).await,
            400,
            "bad_request",
        );
        check(
            post_json(
                a,
                "/api/perception/event",
                &json!({"name":"x","device_id":"d","data":3}),
            )
            .await,
            400,
            "bad_request",
        );
        // The server is still fine.
        let r = post_json(a, "/api/message", &json!({"content":"still here"})).await;
        assert_eq!(r.json()["response"], "😊 You said: still here");
        server.stop().await;
    })
    .await
    .unwrap();
}

/// A model that always fails, or never answers.
struct Broken {
    hang: bool,
}

impl Llm for Broken {
    fn generate(&self, _request: LlmRequest) -> LlmStream {
        if self.hang {
            Box::pin(futures::stream::pending())
        } else {
            Box::pin(futures::stream::iter([LlmEvent::Error(
                ProviderError::Connect("model unreachable".into()),
            )]))
        }
    }
}

#[tokio::test]
async fn provider_failure_is_500_and_a_stuck_turn_504() {
    tokio::time::timeout(WAIT * 2, async {
        let providers = Providers {
            llm: Arc::new(Broken { hang: false }),
            ..Providers::embedded()
        };
        let server = Running::start_with(Config::default(), providers).await;
        let r = post_json(server.addr, "/api/message", &json!({"content":"hi"})).await;
        assert_eq!(r.status, 500, "{}", r.body);
        assert_eq!(r.json()["error"], "provider_failed");
        // The provider's text stays in the log; the caller gets an id to quote.
        let detail = r.json()["detail"].as_str().unwrap().to_owned();
        assert!(!detail.contains("model unreachable"), "{detail}");
        assert!(
            detail.contains("the language model failed (error id "),
            "{detail}"
        );
        server.stop().await;

        let mut config = Config::default();
        config.bridge.turn_timeout_secs = 1;
        let providers = Providers {
            llm: Arc::new(Broken { hang: true }),
            ..Providers::embedded()
        };
        let server = Running::start_with(config, providers).await;
        let t0 = std::time::Instant::now();
        let r = post_json(server.addr, "/api/message", &json!({"content":"hi"})).await;
        assert_eq!(r.status, 504, "{}", r.body);
        assert!(t0.elapsed() < Duration::from_secs(5));
        // The conversation is usable again afterwards (the stuck reply was aborted).
        let r = post_json(server.addr, "/api/message", &json!({"content":"again"})).await;
        assert_eq!(r.status, 504, "{}", r.body);
        server.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn perception_events_reach_subscribers_and_update_device_state() {
    tokio::time::timeout(WAIT * 2, async {
        let server = Running::start(Config::default()).await;
        let mut sse = Sse::open(server.addr, "/api/perception/events").await;
        // The subscriber is registered once the stream is open.
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let r = http(server.addr, "GET", "/admin/sessions", &[], b"").await;
            if r.json()["perception_subscribers"] == 1 {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let event = json!({"name":"face_detected","data":{"name":"Ana","confidence":0.9},
            "device_id":"aa:bb","session_id":"xz-1","ts":1715000000.0});
        let r = post_json(server.addr, "/api/perception/event", &event).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.json(), json!({"ok": true}));
        let (kind, data) = sse.next().await;
        assert_eq!(kind, "perception");
        let got: Value = serde_json::from_str(&data).unwrap();
        assert_eq!(got["name"], "face_detected");
        assert_eq!(got["device_id"], "aa:bb");
        assert_eq!(got["data"]["name"], "Ana");
        assert_eq!(got["ts"], 1715000000.0);
        assert_eq!(got["origin"], "http");

        let state = post_json(
            server.addr,
            "/api/perception/event",
            &json!({"name":"state_changed","data":{"state":"speaking"},"device_id":"aa:bb"}),
        )
        .await;
        assert_eq!(state.status, 200);
        assert_eq!(sse.next().await.0, "perception");
        let r = http(server.addr, "GET", "/admin/perception/aa:bb", &[], b"").await;
        assert_eq!(r.status, 200, "{}", r.body);
        let s = r.json();
        assert_eq!(s["events"], 2);
        assert_eq!(s["face_present"], true);
        assert_eq!(s["identity"], "Ana");
        assert_eq!(s["state"], "speaking");
        assert_eq!(s["session_id"], "xz-1");
        assert_eq!(s["last_event"], "state_changed");

        // An admin test event goes through the same bus.
        let r = post_json(
            server.addr,
            "/admin/perception/event",
            &json!({"name":"face_lost","device_id":"aa:bb"}),
        )
        .await;
        assert_eq!(r.json()["delivered"], 1);
        let (_, data) = sse.next().await;
        let got: Value = serde_json::from_str(&data).unwrap();
        assert_eq!(
            (got["name"].as_str(), got["origin"].as_str()),
            (Some("face_lost"), Some("admin"))
        );
        let r = http(server.addr, "GET", "/admin/perception", &[], b"").await;
        let devices = r.json()["devices"].as_array().unwrap().clone();
        assert_eq!(devices.len(), 1);
        assert_eq!(devices[0]["face_present"], false);
        assert_eq!(devices[0]["identity"], Value::Null);
        let r = http(server.addr, "GET", "/admin/perception/unknown", &[], b"").await;
        assert_eq!(r.status, 404);
        server.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn admin_from_localhost() {
    tokio::time::timeout(WAIT, async {
        let server = Running::start(Config::default()).await;
        let r = http(server.addr, "GET", "/admin/sessions", &[], b"").await;
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        assert_eq!(v["sessions"]["mcp"], 0);
        assert!(v["conversations"].as_array().unwrap().is_empty());
        let r = http(server.addr, "GET", "/admin/mcp/tools", &[], b"").await;
        assert_eq!(r.json()["tools"], json!([]));
        let r = post_json(server.addr, "/admin/mcp/call", &json!({"name":"nothing"})).await;
        assert_eq!(r.status, 400, "{}", r.body);
        // Through a proxy everything looks local: refused.
        let r = http(
            server.addr,
            "GET",
            "/admin/sessions",
            &[("X-Forwarded-For", "203.0.113.7")],
            b"",
        )
        .await;
        assert_eq!(r.status, 403);
        assert_eq!(r.json()["error"], "forbidden");
        server.stop().await;
    })
    .await
    .unwrap();
}
