//! `OpenAiChat` against a fake OpenAI-compatible server speaking SSE.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use common::*;
use serde_json::{Value, json};
use voxgate_providers::{
    ChatMessage, FinishReason, Llm, LlmEvent, LlmRequest, OpenAiChat, OpenAiChatConfig,
    ProviderError, TimeoutPhase, ToolCall, ToolDefinition, Usage,
};

type Seen = Arc<Mutex<Vec<(HeaderMap, Value)>>>;

fn sse(events: &[&str]) -> Vec<u8> {
    events
        .iter()
        .map(|e| format!("data: {e}\n\n"))
        .collect::<String>()
        .into_bytes()
}

fn delta(content: &str) -> String {
    json!({"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":content},"finish_reason":null}]}).to_string()
}

/// A server answering every request with `body` split into `pieces`, recording requests.
async fn sse_server(pieces: Vec<Vec<u8>>) -> (String, Seen) {
    let seen: Seen = Arc::default();
    let s2 = Arc::clone(&seen);
    let router = axum::Router::new().route(
        "/v1/chat/completions",
        post(move |headers: HeaderMap, Json(body): Json<Value>| {
            let pieces = pieces.clone();
            let seen = Arc::clone(&s2);
            async move {
                seen.lock().unwrap().push((headers, body));
                (
                    [("content-type", "text/event-stream")],
                    chunked_body(pieces),
                )
            }
        }),
    );
    (serve(router).await, seen)
}

fn chat(base: &str) -> OpenAiChat {
    let mut cfg = OpenAiChatConfig::new(format!("{base}/v1"), "test-model");
    cfg.api_key = Some("sk-test".into());
    cfg.temperature = Some(0.3);
    cfg.http = fast_http();
    OpenAiChat::new(cfg).unwrap()
}

fn hello() -> LlmRequest {
    LlmRequest {
        messages: vec![ChatMessage::system("be brief"), ChatMessage::user("hi")],
        ..LlmRequest::default()
    }
}

fn text_of(events: &[LlmEvent]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            LlmEvent::TextDelta(t) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

fn last_error(events: &[LlmEvent]) -> &ProviderError {
    match events.last() {
        Some(LlmEvent::Error(e)) => e,
        other => panic!("expected an error event last, got {other:?}"),
    }
}

#[tokio::test]
async fn streams_text_then_done_with_usage() {
    let body = sse(&[
        &json!({"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}).to_string(),
        &delta("Hel"),
        &delta("lo, wörld"),
        &json!({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}).to_string(),
        &json!({"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}})
            .to_string(),
        "[DONE]",
    ]);
    // Split at awkward places: inside a UTF-8 sequence, inside `data:`, between CR and LF.
    let pieces: Vec<Vec<u8>> = body.chunks(7).map(<[u8]>::to_vec).collect();
    let (base, seen) = sse_server(pieces).await;
    let events = collect(chat(&base).generate(hello())).await;
    assert_eq!(text_of(&events), "Hello, wörld");
    assert_eq!(
        events.last(),
        Some(&LlmEvent::Done {
            finish_reason: FinishReason::Stop,
            usage: Some(Usage {
                prompt_tokens: 12,
                completion_tokens: 3
            })
        })
    );
    let seen = seen.lock().unwrap();
    let (headers, req) = &seen[0];
    assert_eq!(headers["authorization"], "Bearer sk-test");
    assert_eq!(req["model"], "test-model");
    assert_eq!(req["stream"], true);
    assert_eq!(req["stream_options"]["include_usage"], true);
    assert_eq!(req["messages"][1], json!({"role": "user", "content": "hi"}));
    assert!((req["temperature"].as_f64().unwrap() - 0.3).abs() < 1e-6);
    assert!(req.get("tools").is_none());
}

#[tokio::test]
async fn tool_call_fragments_are_assembled_by_index_and_names_mapped_back() {
    let frag = |index: u32, id: Option<&str>, name: Option<&str>, args: &str| {
        let mut call = json!({"index": index, "function": {"arguments": args}});
        if let Some(id) = id {
            call["id"] = json!(id);
            call["type"] = json!("function");
        }
        if let Some(name) = name {
            call["function"]["name"] = json!(name);
        }
        json!({"choices":[{"index":0,"delta":{"tool_calls":[call]}}]}).to_string()
    };
    let body = sse(&[
        &delta("Let me do that."),
        &frag(0, Some("call_a"), Some("self_light_set"), ""),
        &frag(1, Some("call_b"), Some("get_time"), "{\"tz\":"),
        &frag(0, None, None, "{\"on\":"),
        &frag(0, None, None, " true}"),
        &frag(1, None, None, "\"UTC\"}"),
        &json!({"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}).to_string(),
        "[DONE]",
    ]);
    let (base, seen) = sse_server(vec![body]).await;
    let tool = |name: &str| ToolDefinition {
        name: name.into(),
        description: format!("the {name} tool"),
        parameters: json!({"type": "object"}),
    };
    let req = LlmRequest {
        tools: vec![tool("self.light.set"), tool("get_time")],
        ..hello()
    };
    let events = collect(chat(&base).generate(req)).await;
    assert_eq!(
        events,
        vec![
            LlmEvent::TextDelta("Let me do that.".into()),
            LlmEvent::ToolCall(ToolCall {
                id: "call_a".into(),
                name: "self.light.set".into(),
                arguments: "{\"on\": true}".into(),
            }),
            LlmEvent::ToolCall(ToolCall {
                id: "call_b".into(),
                name: "get_time".into(),
                arguments: "{\"tz\":\"UTC\"}".into(),
            }),
            LlmEvent::Done {
                finish_reason: FinishReason::ToolCalls,
                usage: None
            },
        ]
    );
    let seen = seen.lock().unwrap();
    let tools = &seen[0].1["tools"];
    assert_eq!(tools[0]["type"], "function");
    assert_eq!(tools[0]["function"]["name"], "self_light_set");
    assert_eq!(
        tools[0]["function"]["description"],
        "the self.light.set tool"
    );
    assert_eq!(tools[1]["function"]["name"], "get_time");
}

#[tokio::test]
async fn http_500_is_retried_then_reported_with_the_service_message() {
    let hits = Arc::new(Mutex::new(0u32));
    let h2 = Arc::clone(&hits);
    let router = axum::Router::new().route(
        "/v1/chat/completions",
        post(move || {
            let hits = Arc::clone(&h2);
            async move {
                *hits.lock().unwrap() += 1;
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    Json(json!({"error": {"message": "The server had an error", "type": "server_error"}})),
                )
            }
        }),
    );
    let base = serve(router).await;
    let mut cfg = OpenAiChatConfig::new(format!("{base}/v1"), "m");
    cfg.http = fast_http();
    cfg.http.max_retries = 2;
    let events = collect(OpenAiChat::new(cfg).unwrap().generate(hello())).await;
    assert_eq!(events.len(), 1);
    assert_eq!(
        last_error(&events),
        &ProviderError::Http {
            status: 500,
            message: "The server had an error".into()
        }
    );
    assert_eq!(*hits.lock().unwrap(), 3, "one attempt and two retries");
}

#[tokio::test]
async fn a_retry_after_503_succeeds() {
    let hits = Arc::new(Mutex::new(0u32));
    let h2 = Arc::clone(&hits);
    let router = axum::Router::new().route(
        "/v1/chat/completions",
        post(move || {
            let hits = Arc::clone(&h2);
            async move {
                let n = {
                    let mut h = hits.lock().unwrap();
                    *h += 1;
                    *h
                };
                if n == 1 {
                    (StatusCode::SERVICE_UNAVAILABLE, "busy").into_response()
                } else {
                    let body = sse(&[
                        &delta("ok"),
                        &json!({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})
                            .to_string(),
                        "[DONE]",
                    ]);
                    ([("content-type", "text/event-stream")], body).into_response()
                }
            }
        }),
    );
    let base = serve(router).await;
    let mut cfg = OpenAiChatConfig::new(format!("{base}/v1"), "m");
    cfg.http = fast_http();
    cfg.http.max_retries = 1;
    let events = collect(OpenAiChat::new(cfg).unwrap().generate(hello())).await;
    assert_eq!(text_of(&events), "ok");
    assert!(matches!(events.last(), Some(LlmEvent::Done { .. })));
    assert_eq!(*hits.lock().unwrap(), 2);
}

#[tokio::test]
async fn unauthorized_is_an_auth_error_without_retries() {
    let hits = Arc::new(Mutex::new(0u32));
    let h2 = Arc::clone(&hits);
    let router = axum::Router::new().route(
        "/v1/chat/completions",
        post(move || {
            let hits = Arc::clone(&h2);
            async move {
                *hits.lock().unwrap() += 1;
                (
                    StatusCode::UNAUTHORIZED,
                    Json(json!({"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}})),
                )
            }
        }),
    );
    let base = serve(router).await;
    let mut cfg = OpenAiChatConfig::new(format!("{base}/v1"), "m");
    cfg.http = fast_http();
    cfg.http.max_retries = 3;
    let events = collect(OpenAiChat::new(cfg).unwrap().generate(hello())).await;
    assert_eq!(
        last_error(&events),
        &ProviderError::Auth {
            status: 401,
            message: "Incorrect API key provided".into()
        }
    );
    assert_eq!(*hits.lock().unwrap(), 1);
}

#[tokio::test]
async fn a_server_that_never_answers_times_out_at_the_first_byte() {
    let router = axum::Router::new().route(
        "/v1/chat/completions",
        post(|| async {
            tokio::time::sleep(Duration::from_secs(30)).await;
            "late"
        }),
    );
    let base = serve(router).await;
    let started = Instant::now();
    let events = collect(chat(&base).generate(hello())).await;
    assert!(matches!(
        last_error(&events),
        ProviderError::Timeout {
            phase: TimeoutPhase::FirstByte,
            ..
        }
    ));
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn a_stream_that_stalls_mid_way_times_out_idle() {
    let router = axum::Router::new().route(
        "/v1/chat/completions",
        post(|| async {
            (
                [("content-type", "text/event-stream")],
                stalled_body(vec![sse(&[&delta("par")])]),
            )
        }),
    );
    let base = serve(router).await;
    let events = collect(chat(&base).generate(hello())).await;
    assert_eq!(text_of(&events), "par");
    assert!(matches!(
        last_error(&events),
        ProviderError::Timeout {
            phase: TimeoutPhase::Idle,
            ..
        }
    ));
}

#[tokio::test]
async fn a_connection_cut_mid_stream_is_a_stream_cut() {
    let body = chunk(&sse(&[&delta("half an ans")]));
    let base = serve_raw(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
        body,
    )
    .await;
    let events = collect(chat(&base).generate(hello())).await;
    assert_eq!(text_of(&events), "half an ans");
    assert!(matches!(last_error(&events), ProviderError::StreamCut(_)));
}

#[tokio::test]
async fn a_clean_end_before_the_completion_finished_is_a_stream_cut() {
    let (base, _) = sse_server(vec![sse(&[&delta("a")])]).await;
    let events = collect(chat(&base).generate(hello())).await;
    assert!(matches!(last_error(&events), ProviderError::StreamCut(_)));
}

#[tokio::test]
async fn a_finished_choice_without_done_marker_is_accepted() {
    let body = sse(&[
        &delta("a"),
        &json!({"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}).to_string(),
    ]);
    let (base, _) = sse_server(vec![body]).await;
    let events = collect(chat(&base).generate(hello())).await;
    assert_eq!(
        events.last(),
        Some(&LlmEvent::Done {
            finish_reason: FinishReason::Length,
            usage: None
        })
    );
}

#[tokio::test]
async fn malformed_sse_json_is_a_protocol_error() {
    let (base, _) = sse_server(vec![sse(&[&delta("x"), "{\"choices\": [", "[DONE]"])]).await;
    let events = collect(chat(&base).generate(hello())).await;
    assert_eq!(text_of(&events), "x");
    assert!(matches!(last_error(&events), ProviderError::Protocol(_)));
}

#[tokio::test]
async fn an_error_object_inside_the_stream_is_an_upstream_error() {
    let (base, _) = sse_server(vec![sse(&[
        &json!({"error": {"message": "model overloaded"}}).to_string(),
    ])])
    .await;
    let events = collect(chat(&base).generate(hello())).await;
    assert_eq!(
        last_error(&events),
        &ProviderError::Upstream("model overloaded".into())
    );
}

#[tokio::test]
async fn connection_refused_is_a_connect_error() {
    let base = dead_url().await;
    let events = collect(chat(&base).generate(hello())).await;
    assert!(matches!(last_error(&events), ProviderError::Connect(_)));
}

#[tokio::test]
async fn greet_and_conversation_query_are_mapped_to_messages() {
    let body = sse(&[&delta("hi"), "[DONE]"]);
    let (base, seen) = sse_server(vec![body]).await;
    let llm = chat(&base);
    let greet = LlmRequest {
        intent: voxgate_providers::Intent::Greet,
        ..hello()
    };
    collect(llm.generate(greet)).await;
    let query = LlmRequest {
        intent: voxgate_providers::Intent::ConversationQuery {
            query: "What did we talk about?".into(),
        },
        ..hello()
    };
    collect(llm.generate(query)).await;
    let seen = seen.lock().unwrap();
    assert_eq!(seen[0].1["messages"][2]["role"], "system");
    assert_eq!(
        seen[1].1["messages"][2],
        json!({"role": "user", "content": "What did we talk about?"})
    );
}

/// A keep-alive HTTP/1.1 chat server that holds the first `together` requests until all of
/// them have arrived (so each needs its own connection), and counts the connections it
/// accepted and those still open.
async fn counting_server(together: usize) -> (String, [Arc<AtomicUsize>; 2]) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let open = Arc::new(AtomicUsize::new(0));
    let accepted = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(tokio::sync::Barrier::new(together));
    let body = sse(&[
        &delta("hi"),
        &json!({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}).to_string(),
        "[DONE]",
    ]);
    let (counter, total) = (Arc::clone(&open), Arc::clone(&accepted));
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            counter.fetch_add(1, Ordering::SeqCst);
            total.fetch_add(1, Ordering::SeqCst);
            let (counter, barrier, body) =
                (Arc::clone(&counter), Arc::clone(&barrier), body.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                'requests: loop {
                    // One request: its head, then as many body bytes as it announces.
                    let head_end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => break 'requests,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse().unwrap());
                    while buf.len() < head_end + len {
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => break 'requests,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    buf.drain(..head_end + len);
                    barrier.wait().await;
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n",
                        body.len()
                    );
                    if sock.write_all(reply.as_bytes()).await.is_err()
                        || sock.write_all(&body).await.is_err()
                    {
                        break;
                    }
                }
                counter.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    (format!("http://{addr}"), [open, accepted])
}

/// Runs `n` requests at once against a [`counting_server`] with the pool capped at
/// `max_idle`, and returns how many connections are still open once they have all finished
/// and the pool has settled.
async fn open_after_concurrent_requests(n: usize, max_idle: usize) -> usize {
    let (base, [open, accepted]) = counting_server(n).await;
    let mut cfg = OpenAiChatConfig::new(format!("{base}/v1"), "test-model");
    cfg.http = fast_http();
    cfg.http.first_byte_timeout = Duration::from_secs(10);
    cfg.http.max_idle_connections = max_idle;
    let llm = OpenAiChat::new(cfg).unwrap();
    let runs = (0..n).map(|_| collect(llm.generate(hello())));
    for events in futures::future::join_all(runs).await {
        assert_eq!(text_of(&events), "hi", "{events:?}");
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        n,
        "the requests needed a connection each"
    );
    // Connections go back to the pool (or are closed) just after their bodies end.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut last = n;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = open.load(Ordering::SeqCst);
        if now <= max_idle && now == last {
            break;
        }
        last = now;
    }
    open.load(Ordering::SeqCst)
}

#[tokio::test]
async fn the_pool_keeps_at_most_max_idle_connections() {
    assert_eq!(open_after_concurrent_requests(6, 2).await, 2);
}

#[tokio::test]
async fn below_the_cap_every_connection_is_kept_for_reuse() {
    assert_eq!(open_after_concurrent_requests(6, 8).await, 6);
}
