//! The Retell custom-LLM door end to end: a real server on 127.0.0.1:0, a real WebSocket client
//! (tokio-tungstenite) playing Retell with the codec crate's `RetellDriver`, the embedded demo
//! agent (or small scripted LLMs through the providers' trait where timing or failure matter).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use support::{Running, WAIT, Ws, next_message};
use tokio_tungstenite::tungstenite::Message;
use voxgate_providers::{FinishReason, Llm, LlmEvent, LlmRequest, LlmStream, ProviderError};
use voxgate_retell::{
    DriverConfig, DriverInput, DriverOutput, EndReason, REMINDER_PROMPT, RetellDriver, ServerEvent,
    TranscriptItem, Violation,
};
use voxgate_server::metrics::Door;
use voxgate_server::{Config, Providers};

/// A counter of the retell door in the server's metrics.
fn counter(server: &Running, name: &str) -> u64 {
    let key = format!("{name}{{door=\"retell\"}} ");
    server
        .metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(&key).map(|v| v.parse().unwrap()))
        .unwrap()
}

/// Sends Retell's `ping_pong` with `timestamp`.
async fn ping(ws: &mut Ws, timestamp: u64) {
    let ping = json!({"interaction_type": "ping_pong", "timestamp": timestamp});
    support::send_json(ws, &ping).await;
}

async fn connect(addr: SocketAddr, call_id: &str) -> Ws {
    support::connect(addr, &format!("/llm-websocket/{call_id}")).await
}

/// One simulated Retell call: the socket, the driver, and every frame the server sent.
struct RetellCall {
    addr: SocketAddr,
    call_id: String,
    ws: Ws,
    driver: RetellDriver,
    /// Server frames as JSON, in order (across reconnects).
    frames: Vec<Value>,
    /// The close code the server sent, once it closed.
    closed: Option<u16>,
    /// Driver outputs seen by `frames_until`, not yet looked at by `until`.
    backlog: Vec<DriverOutput>,
}

fn quiet_driver() -> DriverConfig {
    DriverConfig {
        reminder_trigger: None,
        ..DriverConfig::default()
    }
}

impl RetellCall {
    async fn open(addr: SocketAddr, call_id: &str, cfg: DriverConfig) -> Self {
        let ws = connect(addr, call_id).await;
        let mut driver = RetellDriver::new(cfg);
        driver.handle_input(Instant::now(), DriverInput::Connected);
        Self {
            addr,
            call_id: call_id.to_owned(),
            ws,
            driver,
            frames: Vec::new(),
            closed: None,
            backlog: Vec::new(),
        }
    }

    fn input(&mut self, input: DriverInput) {
        self.driver.handle_input(Instant::now(), input);
    }

    async fn send_raw(&mut self, text: &str) {
        self.ws.send(Message::Text(text.into())).await.unwrap();
    }

    /// Pumps frames both ways until a driver output matches `pred`; returns every output seen.
    async fn until(
        &mut self,
        what: &str,
        mut pred: impl FnMut(&DriverOutput) -> bool,
    ) -> Vec<DriverOutput> {
        let deadline = tokio::time::Instant::now() + WAIT;
        let mut seen = Vec::new();
        for o in std::mem::take(&mut self.backlog) {
            let hit = pred(&o);
            seen.push(o);
            if hit {
                return seen;
            }
        }
        loop {
            while let Some(o) = self.driver.poll_output() {
                if let DriverOutput::Send(ev) = &o
                    && self.closed.is_none()
                {
                    let text = ev.to_json().unwrap();
                    self.ws.send(Message::Text(text.into())).await.unwrap();
                }
                let hit = pred(&o);
                seen.push(o);
                if hit {
                    return seen;
                }
            }
            let timer = self
                .driver
                .poll_timeout()
                .map(tokio::time::Instant::from_std);
            let far = tokio::time::Instant::now() + WAIT;
            tokio::select! {
                msg = self.ws.next(), if self.closed.is_none() => self.frame(msg),
                () = tokio::time::sleep_until(timer.unwrap_or(far)), if timer.is_some() => {
                    self.driver.handle_timeout(Instant::now());
                }
                () = tokio::time::sleep_until(deadline) => {
                    panic!("timed out waiting for {what}; outputs {seen:?}; frames {:#?}", self.frames)
                }
            }
        }
    }

    fn frame(&mut self, msg: Option<Result<Message, tokio_tungstenite::tungstenite::Error>>) {
        match msg {
            Some(Ok(Message::Text(t))) => {
                self.frames.push(serde_json::from_str(&t).unwrap());
                let ev = ServerEvent::from_json(&t).unwrap();
                self.input(DriverInput::Received(ev));
            }
            Some(Ok(Message::Close(f))) => {
                self.closed = Some(f.map_or(1005, |f| u16::from(f.code)));
                self.input(DriverInput::Disconnected);
            }
            Some(Ok(_)) => {}
            None | Some(Err(_)) => {
                self.closed.get_or_insert(1006);
                self.input(DriverInput::Disconnected);
            }
        }
    }

    /// Sends what the driver wants sent, then reads frames until `done` holds.
    async fn frames_until(&mut self, what: &str, done: impl Fn(&Self) -> bool) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            while let Some(o) = self.driver.poll_output() {
                if let DriverOutput::Send(ev) = &o
                    && self.closed.is_none()
                {
                    let text = ev.to_json().unwrap();
                    self.ws.send(Message::Text(text.into())).await.unwrap();
                }
                self.backlog.push(o);
            }
            if done(self) {
                return;
            }
            assert!(self.closed.is_none(), "closed while waiting for {what}");
            match tokio::time::timeout_at(deadline, self.ws.next()).await {
                Ok(m) => self.frame(m),
                Err(_) => panic!("timed out waiting for {what}; frames {:#?}", self.frames),
            }
        }
    }

    /// Waits for the begin message (which the driver does not report when it is empty).
    async fn begun(&mut self) {
        self.frames_until("the begin message", |c| !c.responses(0).is_empty())
            .await;
    }

    /// The whole text of the next spoken response with this id.
    async fn spoken(&mut self, response_id: u64) -> String {
        let out = self
            .until(&format!("response {response_id}"), |o| {
                matches!(o, DriverOutput::AgentSpoke { response_id: r, .. } if *r == response_id)
            })
            .await;
        assert_no_violation(&out);
        match out.last() {
            Some(DriverOutput::AgentSpoke { content, .. }) => content.clone(),
            _ => unreachable!(),
        }
    }

    /// A new socket to the same URL (Retell's reconnect).
    async fn reconnect(&mut self) {
        self.ws = connect(self.addr, &self.call_id).await;
        self.closed = None;
        self.input(DriverInput::Connected);
    }

    /// Frames without keep-alives (their timestamps depend on timing), for snapshots.
    fn shown_frames(&self) -> Vec<Value> {
        self.frames
            .iter()
            .filter(|f| f["response_type"] != "ping_pong")
            .cloned()
            .collect()
    }

    fn responses(&self, id: u64) -> Vec<&Value> {
        self.frames
            .iter()
            .filter(|f| f["response_type"] == "response" && f["response_id"] == id)
            .collect()
    }
}

fn assert_no_violation(out: &[DriverOutput]) {
    let v: Vec<&Violation> = out
        .iter()
        .filter_map(|o| match o {
            DriverOutput::Violation(v) => Some(v),
            _ => None,
        })
        .collect();
    assert!(v.is_empty(), "protocol violations: {v:?}");
}

/// A bounded test: every test body runs under this.
async fn bounded<F: Future<Output = ()>>(f: F) {
    tokio::time::timeout(Duration::from_secs(30), f)
        .await
        .expect("test finished in time");
}

/// A server for `config` and one call to it with a quiet driver: how most tests begin.
async fn open_call(config: Config, call_id: &str) -> (Running, RetellCall) {
    let server = Running::start(config).await;
    let call = RetellCall::open(server.addr, call_id, quiet_driver()).await;
    (server, call)
}

fn config(f: impl FnOnce(&mut Config)) -> Config {
    let mut c = Config::default();
    f(&mut c);
    c
}

#[tokio::test]
async fn config_then_begin_at_once() {
    bounded(async {
        let (server, mut call) = open_call(
            config(|c| {
                c.retell.begin_message = "Hello from voxgate.".into();
            }),
            "call_test",
        )
        .await;
        let begin = call.spoken(0).await;
        assert_eq!(begin, "Hello from voxgate.");
        insta::assert_json_snapshot!("begin_at_once", call.shown_frames());
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn begin_after_call_details() {
    bounded(async {
        let (server, mut call) = open_call(
            config(|c| {
                c.retell.begin_message = "Thanks for calling.".into();
                c.retell.begin_after_call_details = true;
            }),
            "call_test",
        )
        .await;
        let out = call
            .until("begin", |o| matches!(o, DriverOutput::AgentSpoke { .. }))
            .await;
        // The driver sent call_details (asked for by the config) before the begin arrived.
        let details = out
            .iter()
            .position(|o| {
                matches!(
                    o,
                    DriverOutput::Send(voxgate_retell::RetellEvent::CallDetails(_))
                )
            })
            .expect("call details sent");
        assert!(details < out.len() - 1);
        assert_eq!(call.frames[0]["response_type"], "config");
        assert_eq!(call.frames[1]["response_id"], 0);
        insta::assert_json_snapshot!("begin_after_call_details", call.shown_frames());
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn a_turn_streams_chunks_and_completes() {
    bounded(async {
        let (server, mut call) = open_call(Config::default(), "call_test").await;
        call.input(DriverInput::UserSaid("hello there".into()));
        let text = call.spoken(1).await;
        assert_eq!(text, "You said: hello there");
        let chunks = call.responses(1);
        assert!(chunks.len() > 2, "streamed in pieces: {chunks:?}");
        assert!(
            chunks[..chunks.len() - 1]
                .iter()
                .all(|c| c["content_complete"] == false)
        );
        assert_eq!(chunks.last().unwrap()["content_complete"], true);
        // The metadata event follows the response.
        call.until("metadata", |o| matches!(o, DriverOutput::Metadata(_)))
            .await;
        assert_eq!(counter(&server, "voxgate_turns_total"), 1);
        insta::assert_json_snapshot!("turn", call.shown_frames());
        server.stop().await;
    })
    .await;
}

/// Streams `words` words, one every `gap`, for any request.
struct SlowLlm {
    words: usize,
    gap: Duration,
}

impl Llm for SlowLlm {
    fn generate(&self, _request: LlmRequest) -> LlmStream {
        let (words, gap) = (self.words, self.gap);
        Box::pin(futures::stream::unfold(0, move |i| async move {
            if i > words {
                return None;
            }
            tokio::time::sleep(gap).await;
            let ev = if i == words {
                LlmEvent::Done {
                    finish_reason: FinishReason::Stop,
                    usage: None,
                }
            } else {
                LlmEvent::TextDelta(format!("w{i} "))
            };
            Some((ev, i + 1))
        }))
    }
}

fn with_llm(llm: impl Llm + 'static) -> Providers {
    Providers {
        llm: Arc::new(llm),
        ..Providers::embedded()
    }
}

#[tokio::test]
async fn a_newer_response_id_stops_the_stale_one() {
    bounded(async {
        let llm = SlowLlm {
            words: 40,
            gap: Duration::from_millis(20),
        };
        let server = Running::start_with(Config::default(), with_llm(llm)).await;
        let mut call = RetellCall::open(server.addr, "call_test", quiet_driver()).await;
        call.input(DriverInput::UserSaid("first".into()));
        // Wait for the first chunk of response 1, then ask again.
        call.frames_until("a chunk of response 1", |c| !c.responses(1).is_empty())
            .await;
        call.input(DriverInput::UserSaid("second".into()));
        let text = call.spoken(2).await;
        assert_eq!(text.split_whitespace().count(), 40);
        let stale = call.responses(1);
        assert!(
            stale.len() < 40,
            "response 1 went on streaming: {} chunks",
            stale.len()
        );
        assert!(stale.iter().all(|c| c["content_complete"] == false));
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn reminders_get_the_synthetic_turn() {
    bounded(async {
        let server = Running::start(config(|c| {
            c.retell.begin_message = "Hi, anyone there?".into();
        }))
        .await;
        let driver = DriverConfig {
            reminder_trigger: Some(Duration::from_millis(150)),
            reminder_max_count: 1,
            ..DriverConfig::default()
        };
        let mut call = RetellCall::open(server.addr, "call_test", driver).await;
        call.begun().await;
        // After 150 ms of silence the driver sends reminder_required with id 1.
        let text = call.spoken(1).await;
        assert_eq!(text, format!("You said: {REMINDER_PROMPT}"));
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn tool_calls_are_reported_and_the_same_response_continues() {
    bounded(async {
        let (server, mut call) = open_call(Config::default(), "call_test").await;
        call.input(DriverInput::UserSaid("call get_call_details {}".into()));
        let text = call.spoken(1).await;
        assert!(
            text.starts_with("Calling get_call_details. The tool get_call_details returned: "),
            "{text}"
        );
        assert!(text.contains(r#""call_id":"call_test""#), "{text}");
        let kinds: Vec<&str> = call
            .frames
            .iter()
            .filter_map(|f| f["response_type"].as_str())
            .filter(|t| *t != "ping_pong")
            .collect();
        let inv = kinds
            .iter()
            .position(|k| *k == "tool_call_invocation")
            .unwrap();
        assert_eq!(kinds[inv + 1], "tool_call_result");
        assert_eq!(kinds[inv - 1], "response");
        assert_eq!(kinds[inv + 2], "response");
        let woven = call.driver.transcript_with_tool_calls();
        assert!(
            woven
                .iter()
                .any(|i| matches!(i, TranscriptItem::ToolCallResult { .. }))
        );
        insta::assert_json_snapshot!("tool_call", call.shown_frames());
        // The next request carries the tool call in transcript_with_tool_calls; the context
        // built from it is accepted and the conversation goes on.
        call.input(DriverInput::UserSaid("thanks".into()));
        assert_eq!(call.spoken(2).await, "You said: thanks");
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn end_call_from_the_model() {
    bounded(async {
        let (server, mut call) = open_call(Config::default(), "call_test").await;
        call.input(DriverInput::UserSaid(
            r#"call end_call {"message": "Goodbye!"}"#.into(),
        ));
        let out = call
            .until("call end", |o| matches!(o, DriverOutput::CallEnded(_)))
            .await;
        assert_no_violation(&out);
        assert!(out.contains(&DriverOutput::CallEnded(EndReason::EndCallRequested)));
        assert!(out.contains(&DriverOutput::AgentSpoke {
            response_id: 1,
            content: "Calling end_call. Goodbye!".into()
        }));
        let last = call.responses(1).last().copied().unwrap().clone();
        insta::assert_json_snapshot!("end_call", last);
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn transfer_from_the_model() {
    bounded(async {
        let (server, mut call) = open_call(
            config(|c| {
                c.retell.transfer_number = "+15550100".into();
            }),
            "call_test",
        )
        .await;
        call.input(DriverInput::UserSaid("call transfer_call {}".into()));
        let out = call
            .until("transfer", |o| matches!(o, DriverOutput::Transfer { .. }))
            .await;
        assert!(out.contains(&DriverOutput::Transfer {
            number: "+15550100".into()
        }));
        let last = call.responses(1).last().copied().unwrap().clone();
        insta::assert_json_snapshot!("transfer", last);
        // A number from the model wins over the configured desk.
        call.input(DriverInput::UserSaid(
            r#"call transfer_call {"number": "+15550199", "message": "Connecting you."}"#.into(),
        ));
        let out = call
            .until("transfer", |o| matches!(o, DriverOutput::Transfer { .. }))
            .await;
        assert!(out.contains(&DriverOutput::Transfer {
            number: "+15550199".into()
        }));
        server.stop().await;
    })
    .await;
}

/// A control API request, with the token when given: (status, body).
async fn control(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> (u16, String) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(auth) = &auth {
        headers.push(("Authorization", auth));
    }
    let r = support::http(addr, method, path, &headers, body.as_bytes()).await;
    (r.status, r.body)
}

#[tokio::test]
async fn agent_interrupt_and_metadata_from_the_control_api() {
    bounded(async {
        let (server, mut call) = open_call(Config::default(), "call_ctl").await;
        call.frames_until("config", |c| !c.frames.is_empty()).await;
        let path = "/retell/calls/call_ctl/interrupt";
        let (status, body) = control(
            server.addr,
            "POST",
            path,
            r#"{"content":"Sorry to cut in."}"#,
            None,
        )
        .await;
        assert_eq!(status, 202, "{body}");
        assert_eq!(
            serde_json::from_str::<Value>(&body).unwrap()["interrupt_id"],
            1
        );
        let out = call
            .until("interrupt", |o| {
                matches!(o, DriverOutput::InterruptSpoken { .. })
            })
            .await;
        assert!(out.contains(&DriverOutput::InterruptSpoken {
            interrupt_id: 1,
            content: "Sorry to cut in.".into()
        }));
        let frame = call
            .frames
            .iter()
            .find(|f| f["response_type"] == "agent_interrupt")
            .unwrap()
            .clone();
        insta::assert_json_snapshot!("agent_interrupt", frame);

        let (status, _) = control(
            server.addr,
            "POST",
            "/retell/calls/call_ctl/metadata",
            r#"{"step":"checkout"}"#,
            None,
        )
        .await;
        assert_eq!(status, 202);
        let out = call
            .until("metadata", |o| matches!(o, DriverOutput::Metadata(_)))
            .await;
        assert_eq!(
            out.last(),
            Some(&DriverOutput::Metadata(Some(json!({"step": "checkout"}))))
        );

        let (status, body) = control(server.addr, "GET", "/retell/calls", "", None).await;
        assert_eq!(status, 200);
        assert_eq!(
            serde_json::from_str::<Value>(&body).unwrap(),
            json!({"calls": [{"call_id": "call_ctl", "connected": true}]})
        );
        let (status, _) = control(
            server.addr,
            "POST",
            "/retell/calls/nope/interrupt",
            r#"{"content":"x"}"#,
            None,
        )
        .await;
        assert_eq!(status, 404);
        let (status, _) =
            control(server.addr, "POST", path, r#"{"text":"wrong field"}"#, None).await;
        assert_eq!(status, 400);
        server.stop().await;

        // With a token, the control API wants it.
        let server = Running::start(config(|c| c.retell.control_token = "s3cret".into())).await;
        let (status, _) = control(server.addr, "GET", "/retell/calls", "", None).await;
        assert_eq!(status, 401);
        let (status, _) = control(server.addr, "GET", "/retell/calls", "", Some("s3cret")).await;
        assert_eq!(status, 200);
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn ping_pong_echoes_the_timestamp() {
    bounded(async {
        let server = Running::start(Config::default()).await;
        let mut ws = connect(server.addr, "call_ping").await;
        ping(&mut ws, 1700000000123).await;
        loop {
            let msg = next_message(&mut ws, WAIT).await.unwrap();
            let v: Value = serde_json::from_str(msg.to_text().unwrap()).unwrap();
            if v["response_type"] == "ping_pong" {
                insta::assert_json_snapshot!("ping_pong", v);
                break;
            }
        }
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn update_agent_from_config_once_per_call() {
    bounded(async {
        let (server, mut call) = open_call(
            config(|c| {
                c.retell.agent.responsiveness = Some(0.8);
                c.retell.agent.reminder_trigger_ms = Some(5000);
                c.retell.agent.reminder_max_count = Some(2);
            }),
            "call_ua",
        )
        .await;
        call.begun().await;
        call.frames_until("update_agent", |c| {
            c.frames
                .iter()
                .any(|f| f["response_type"] == "update_agent")
        })
        .await;
        let frame = call
            .frames
            .iter()
            .find(|f| f["response_type"] == "update_agent")
            .unwrap()
            .clone();
        insta::assert_json_snapshot!("update_agent", frame);
        // A reconnect resumes: config again, no second update_agent.
        call.ws.close(None).await.unwrap();
        call.until("reconnect", |o| matches!(o, DriverOutput::Reconnect { .. }))
            .await;
        let before = call.frames.len();
        call.reconnect().await;
        call.input(DriverInput::UserSaid("hi".into()));
        call.spoken(1).await;
        let after: Vec<_> = call.frames[before..]
            .iter()
            .map(|f| f["response_type"].clone())
            .collect();
        assert_eq!(after[0], "config");
        assert!(!after.contains(&json!("update_agent")), "{after:?}");
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn a_reconnect_resumes_the_call() {
    bounded(async {
        let (server, mut call) = open_call(
            config(|c| {
                c.retell.begin_message = "Welcome.".into();
            }),
            "call_rc",
        )
        .await;
        call.begun().await;
        call.input(DriverInput::UserSaid("one".into()));
        call.spoken(1).await;
        let (status, _) = control(
            server.addr,
            "POST",
            "/retell/calls/call_rc/interrupt",
            r#"{"content":"Note."}"#,
            None,
        )
        .await;
        assert_eq!(status, 202);
        call.until("interrupt", |o| {
            matches!(o, DriverOutput::InterruptSpoken { .. })
        })
        .await;

        // The socket drops (Retell's side); Retell reconnects to the same URL.
        call.ws.close(None).await.unwrap();
        call.until("reconnect", |o| matches!(o, DriverOutput::Reconnect { .. }))
            .await;
        server.sessions_drain(Door::Retell).await;
        let before = call.frames.len();
        call.reconnect().await;
        call.input(DriverInput::UserSaid("two".into()));
        // The driver flags a repeated begin message as a violation; `spoken` asserts none.
        assert_eq!(call.spoken(2).await, "You said: two");
        assert!(!call.frames[before..].iter().any(|f| f["response_id"] == 0));
        // Interrupt ids go on from the first socket's.
        let (status, body) = control(
            server.addr,
            "POST",
            "/retell/calls/call_rc/interrupt",
            r#"{"content":"Again."}"#,
            None,
        )
        .await;
        assert_eq!(status, 202);
        assert_eq!(
            serde_json::from_str::<Value>(&body).unwrap()["interrupt_id"],
            2
        );
        server.stop().await;

        // With no resume window the same call_id starts over: a fresh begin message.
        let server = Running::start(config(|c| {
            c.retell.begin_message = "Welcome.".into();
            c.retell.resume_window_secs = 0;
        }))
        .await;
        let mut ws = connect(server.addr, "call_rc").await;
        ws.close(None).await.unwrap();
        server.sessions_drain(Door::Retell).await;
        let mut call = RetellCall::open(server.addr, "call_rc", quiet_driver()).await;
        assert_eq!(call.spoken(0).await, "Welcome.");
        server.stop().await;
    })
    .await;
}

/// The text frames of `ws` as JSON until response `id` completes (pings answered on the way:
/// a resumed socket is a live Retell socket).
async fn read_response(ws: &mut Ws, id: u64) -> Vec<Value> {
    let mut frames = Vec::new();
    loop {
        let Some(Message::Text(t)) = next_message(ws, WAIT).await else {
            panic!("no complete response {id}; frames {frames:#?}");
        };
        let v: Value = serde_json::from_str(&t).unwrap();
        let done = v["response_type"] == "response"
            && v["response_id"] == id
            && v["content_complete"] == true;
        frames.push(v);
        if done {
            return frames;
        }
    }
}

/// The text of response `id` in `frames`, its chunks joined.
fn content_of(frames: &[Value], id: u64) -> String {
    frames
        .iter()
        .filter(|f| f["response_type"] == "response" && f["response_id"] == id)
        .map(|f| f["content"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn a_response_cut_off_by_a_dropped_socket_is_sent_again_whole_after_the_resume() {
    bounded(async {
        let llm = SlowLlm {
            words: 30,
            gap: Duration::from_millis(30),
        };
        let server = Running::start_with(Config::default(), with_llm(llm)).await;
        let whole: String = (0..30).map(|i| format!("w{i} ")).collect();
        let mut call = RetellCall::open(server.addr, "call_cut", quiet_driver()).await;
        call.begun().await;
        call.input(DriverInput::UserSaid("tell me a long story".into()));
        call.frames_until("some of response 1", |c| c.responses(1).len() >= 3)
            .await;
        // The socket drops mid-answer, without a close handshake (a network failure).
        let RetellCall { ws, .. } = call;
        drop(ws);
        server.sessions_drain(Door::Retell).await;

        // A reconnect within the window that does not even ask again: the door owes response
        // 1 and sends it whole, from its start, under the same id, to the end. Retell asking
        // again with the same id on the new socket gets no second answer.
        let mut ws = connect(server.addr, "call_cut").await;
        let again = json!({"interaction_type": "response_required", "response_id": 1,
            "transcript": [{"role": "user", "content": "tell me a long story"}]});
        support::send_json(&mut ws, &again).await;
        let frames = read_response(&mut ws, 1).await;
        assert_eq!(frames[0]["response_type"], "config");
        assert!(
            !frames.iter().any(|f| f["response_id"] == 0),
            "no second begin message: {frames:#?}"
        );
        let first = frames.iter().find(|f| f["response_id"] == 1).unwrap();
        assert_eq!(first["content"], "w0 ");
        assert_eq!(content_of(&frames, 1), whole);
        // Nothing more of response 1 follows: a ping's echo comes next.
        ping(&mut ws, 42).await;
        loop {
            let Some(Message::Text(t)) = next_message(&mut ws, WAIT).await else {
                panic!("no ping echo");
            };
            let v: Value = serde_json::from_str(&t).unwrap();
            assert_ne!(v["response_type"], "response", "a second answer: {v}");
            if v["response_type"] == "ping_pong" && v["timestamp"] == 42 {
                break;
            }
        }
        assert_eq!(counter(&server, "voxgate_turns_total"), 1);
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn the_driver_reconnecting_mid_answer_hears_the_whole_answer_once() {
    bounded(async {
        let llm = SlowLlm {
            words: 30,
            gap: Duration::from_millis(30),
        };
        let server = Running::start_with(Config::default(), with_llm(llm)).await;
        let whole: String = (0..30).map(|i| format!("w{i} ")).collect();
        let mut call = RetellCall::open(server.addr, "call_cut2", quiet_driver()).await;
        call.begun().await;
        call.input(DriverInput::UserSaid("tell me a long story".into()));
        call.frames_until("some of response 1", |c| c.responses(1).len() >= 3)
            .await;
        call.ws.close(None).await.unwrap();
        call.until("reconnect", |o| matches!(o, DriverOutput::Reconnect { .. }))
            .await;
        server.sessions_drain(Door::Retell).await;
        call.reconnect().await;
        // The driver asks again for response 1 (as Retell does); the answer is whole.
        assert_eq!(call.spoken(1).await, whole);
        call.input(DriverInput::UserSaid("and then?".into()));
        assert_eq!(call.spoken(2).await, whole);
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn the_demo_agents_emoji_are_not_spoken() {
    bounded(async {
        let (server, mut call) = open_call(Config::default(), "call_emoji").await;
        call.input(DriverInput::UserSaid("smile 😀 please 🎉 now".into()));
        let text = call.spoken(1).await;
        assert_eq!(text, "You said: smile please now");
        for chunk in call.responses(1) {
            let content = chunk["content"].as_str().unwrap();
            assert!(
                !voxgate_engine::emotion::contains_emoji(content),
                "emoji in {chunk}"
            );
        }
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn malformed_frames_are_survived_and_unreadable_requests_get_the_apology() {
    bounded(async {
        let (server, mut call) = open_call(Config::default(), "call_bad").await;
        call.begun().await;
        call.send_raw("this is not json").await;
        call.send_raw("[1, 2, 3]").await;
        call.send_raw(r#"{"no_type": true}"#).await;
        call.send_raw(r#"{"interaction_type":"from_the_future","x":1}"#)
            .await;
        call.ws
            .send(Message::Binary(vec![0xff, 0x00, 0x13].into()))
            .await
            .unwrap();
        // A request the codec cannot read (transcript is not a list) still gets an answer.
        call.send_raw(
            r#"{"interaction_type":"response_required","response_id":7,"transcript":"oops"}"#,
        )
        .await;
        call.frames_until("the apology", |c| {
            c.responses(7).iter().any(|r| r["content_complete"] == true)
        })
        .await;
        let apology = call.responses(7).last().copied().unwrap().clone();
        insta::assert_json_snapshot!("apology", apology);
        assert!(call.closed.is_none());
        // Four unreadable frames and the unreadable request; the unknown type is not an error.
        assert_eq!(counter(&server, "voxgate_errors_total"), 5);
        // The session goes on: the driver's next id is 1 (it never saw the raw request),
        // which is lower than 7 and still wins as the latest request.
        call.input(DriverInput::UserSaid("still fine?".into()));
        let out = call
            .until("answer", |o| {
                matches!(o, DriverOutput::AgentSpoke { response_id: 1, .. })
            })
            .await;
        assert!(out.contains(&DriverOutput::AgentSpoke {
            response_id: 1,
            content: "You said: still fine?".into()
        }));
        server.stop().await;
    })
    .await;
}

/// Fails every request.
struct BrokenLlm;

impl Llm for BrokenLlm {
    fn generate(&self, _request: LlmRequest) -> LlmStream {
        Box::pin(futures::stream::iter([LlmEvent::Error(
            ProviderError::Config("model unreachable".into()),
        )]))
    }
}

#[tokio::test]
async fn llm_failure_is_an_apology_not_a_close() {
    bounded(async {
        let server = Running::start_with(Config::default(), with_llm(BrokenLlm)).await;
        let mut call = RetellCall::open(server.addr, "call_fail", quiet_driver()).await;
        call.input(DriverInput::UserSaid("hello".into()));
        assert_eq!(
            call.spoken(1).await,
            voxgate_server::RetellConfig::default().apology
        );
        assert!(call.closed.is_none());
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn disconnects_free_sessions_and_shutdown_closes_with_1000() {
    bounded(async {
        let llm = SlowLlm {
            words: 1000,
            gap: Duration::from_millis(5),
        };
        let server = Running::start_with(Config::default(), with_llm(llm)).await;
        let mut a = RetellCall::open(server.addr, "call_a", quiet_driver()).await;
        let mut b = RetellCall::open(server.addr, "call_b", quiet_driver()).await;
        a.begun().await;
        b.begun().await;
        assert_eq!(server.metrics.active_sessions(Door::Retell), 2);
        // A disconnect mid-response frees the session (the LLM task is aborted with it).
        a.input(DriverInput::UserSaid("talk a lot".into()));
        a.until("request sent", |o| {
            matches!(
                o,
                DriverOutput::Send(voxgate_retell::RetellEvent::ResponseRequired(_))
            )
        })
        .await;
        a.ws.close(None).await.unwrap();
        drop(a);
        server.wait_sessions(Door::Retell, 1).await;
        // Shutdown closes the remaining socket with 1000, the only code Retell treats as normal.
        let metrics = Arc::clone(&server.metrics);
        let stop = server.stop();
        let close = async {
            while b.closed.is_none() {
                let m = tokio::time::timeout(WAIT, b.ws.next()).await.unwrap();
                b.frame(m);
            }
        };
        tokio::join!(stop, close);
        assert_eq!(b.closed, Some(1000));
        assert_eq!(metrics.active_sessions(Door::Retell), 0);
    })
    .await;
}

#[tokio::test]
async fn a_disabled_door_is_not_served() {
    bounded(async {
        let server = Running::start(config(|c| c.retell.enabled = false)).await;
        let url = format!("ws://{}/llm-websocket/call_off", server.addr);
        let err = tokio_tungstenite::connect_async(url).await.unwrap_err();
        assert!(
            matches!(&err, tokio_tungstenite::tungstenite::Error::Http(r) if r.status() == 404),
            "{err:?}"
        );
        let (status, _) = control(server.addr, "GET", "/retell/calls", "", None).await;
        assert_eq!(status, 404);
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn retell_silence_closes_with_1000_for_a_reconnect() {
    bounded(async {
        let server = Running::start(Config::default()).await;
        let mut ws = connect(server.addr, "call_quiet").await;
        // One ping arms the keep-alive; then Retell goes quiet.
        ping(&mut ws, 1).await;
        let started = Instant::now();
        let mut keepalives = 0;
        let code = loop {
            match tokio::time::timeout(WAIT, ws.next()).await.unwrap() {
                Some(Ok(Message::Close(f))) => break f.map(|f| u16::from(f.code)),
                Some(Ok(Message::Text(t))) => {
                    let v: Value = serde_json::from_str(&t).unwrap();
                    if v["response_type"] == "ping_pong" && v["timestamp"] != 1 {
                        keepalives += 1;
                    }
                }
                Some(Ok(_)) => {}
                other => panic!("socket ended without a close frame: {other:?}"),
            }
        };
        assert_eq!(code, Some(1000));
        assert!(
            started.elapsed() >= Duration::from_secs(4),
            "{:?}",
            started.elapsed()
        );
        // The server kept pinging (every 3 s without Retell's pings) until it gave up.
        assert!(keepalives >= 1);
        server.sessions_drain(Door::Retell).await;
        server.stop().await;
    })
    .await;
}

/// Reads until the server's close frame; its code (a dropped connection fails the test).
async fn close_code_from(ws: &mut Ws) -> u16 {
    loop {
        match tokio::time::timeout(WAIT, ws.next()).await.unwrap() {
            Some(Ok(Message::Close(f))) => return f.map_or(1005, |f| u16::from(f.code)),
            Some(Ok(_)) => {}
            other => panic!("the connection ended without a close frame: {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_client_close_is_answered_with_a_close_frame() {
    bounded(async {
        let server = Running::start(config(|c| {
            c.retell.begin_message = "Hello.".into();
        }))
        .await;
        let mut call = RetellCall::open(server.addr, "call_bye", quiet_driver()).await;
        call.begun().await;
        // Retell hangs up: a close frame with 1000; the server answers the handshake.
        call.ws
            .send(Message::Close(Some(
                tokio_tungstenite::tungstenite::protocol::CloseFrame {
                    code: 1000.into(),
                    reason: "call ended".into(),
                },
            )))
            .await
            .unwrap();
        assert_eq!(close_code_from(&mut call.ws).await, 1000);
        server.sessions_drain(Door::Retell).await;
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn shutdown_lets_the_streamed_response_finish_then_closes_with_1000() {
    bounded(async {
        // About 0.6 s of streaming, well within the shutdown grace period.
        let llm = SlowLlm {
            words: 30,
            gap: Duration::from_millis(20),
        };
        let server = Running::start_with(Config::default(), with_llm(llm)).await;
        let mut call = RetellCall::open(server.addr, "call_drain", quiet_driver()).await;
        call.input(DriverInput::UserSaid("tell me a story".into()));
        call.frames_until("a chunk of response 1", |c| !c.responses(1).is_empty())
            .await;
        let stop = server.stop();
        let read = async {
            while call.closed.is_none() {
                let m = tokio::time::timeout(WAIT, call.ws.next()).await.unwrap();
                call.frame(m);
            }
        };
        tokio::join!(stop, read);
        assert_eq!(call.closed, Some(1000));
        let chunks = call.responses(1);
        assert_eq!(chunks.last().unwrap()["content_complete"], true);
        let text: String = chunks
            .iter()
            .map(|c| c["content"].as_str().unwrap())
            .collect();
        assert_eq!(text.split_whitespace().count(), 30);
    })
    .await;
}
