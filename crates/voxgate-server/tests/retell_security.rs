//! Who may open the Retell custom-LLM socket, over real sockets on 127.0.0.1: the URL secret
//! (path and query forms, refused before the upgrade and never logged) and the one-socket-per-
//! call rule (a second socket for a live call is refused and the live one keeps answering; a
//! reconnect after it closed resumes the call within the window and starts over after it).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::SinkExt;
use serde_json::{Value, json};
use support::{Running, WAIT, Ws};
use tokio_tungstenite::tungstenite::{self, Message};
use voxgate_server::Config;
use voxgate_server::metrics::Door;

/// The secret every test of this file configures (so the log check can look for it).
const SECRET: &str = "rtl-4f9c2b7e1d0a5c3b8e6f";

/// A bounded test: every test body runs under this.
async fn bounded<F: Future<Output = ()>>(f: F) {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("test finished in time");
}

fn config(f: impl FnOnce(&mut Config)) -> Config {
    let mut c = Config::default();
    f(&mut c);
    c
}

/// A door with the secret, a begin message and agent settings (so a fresh call is told apart
/// from a resumed one: only a fresh call gets the begin message and `update_agent`).
fn guarded(f: impl FnOnce(&mut Config)) -> Config {
    config(|c| {
        c.retell.secret = SECRET.into();
        c.retell.begin_message = "Welcome.".into();
        c.retell.agent.responsiveness = Some(0.5);
        f(c);
    })
}

/// The socket path with the secret as a path segment: what Retell makes of the pasted URL.
fn with_secret(call_id: &str) -> String {
    format!("/llm-websocket/{SECRET}/{call_id}")
}

/// Opens `ws://{addr}{path}`; a refused upgrade gives its status and body.
async fn open(addr: SocketAddr, path: &str) -> Result<Ws, (u16, String)> {
    match support::try_connect(&format!("ws://{addr}{path}"), &[], WAIT).await {
        Ok(ws) => Ok(ws),
        Err(tungstenite::Error::Http(r)) => {
            let body = r
                .body()
                .as_deref()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default();
            Err((r.status().as_u16(), body))
        }
        Err(e) => panic!("connecting to {path} failed: {e}"),
    }
}

/// The status of a refused upgrade (the socket must not open); the body must not quote the
/// secret.
async fn refused(addr: SocketAddr, path: &str) -> u16 {
    match open(addr, path).await {
        Ok(_) => panic!("{path} was let in"),
        Err((status, body)) => {
            assert!(
                !body.contains(SECRET) && !body.contains("rtl-4f9c"),
                "{body}"
            );
            status
        }
    }
}

/// One socket's side of a call: every server frame seen (keep-alives left out).
struct Socket {
    ws: Ws,
    frames: Vec<Value>,
}

impl Socket {
    fn new(ws: Ws) -> Self {
        Self {
            ws,
            frames: Vec::new(),
        }
    }

    /// Reads frames until one matches `done`; the socket must stay open meanwhile.
    async fn until(&mut self, what: &str, done: impl Fn(&Value) -> bool) {
        loop {
            let Some(msg) = support::next_message(&mut self.ws, WAIT).await else {
                panic!(
                    "socket closed while waiting for {what}; frames {:#?}",
                    self.frames
                );
            };
            let Message::Text(t) = msg else { continue };
            let v: Value = serde_json::from_str(&t).unwrap();
            if v["response_type"] == "ping_pong" {
                continue;
            }
            self.frames.push(v);
            if done(self.frames.last().unwrap()) {
                return;
            }
        }
    }

    /// Waits for the begin message (`response_id` 0, complete).
    async fn begun(&mut self) {
        self.until("the begin message", |f| {
            f["response_type"] == "response"
                && f["response_id"] == 0
                && f["content_complete"] == true
        })
        .await;
    }

    /// Asks for response `id` to the caller saying `said`; the answer's whole text.
    async fn ask(&mut self, id: u64, said: &str) -> String {
        let request = json!({
            "interaction_type": "response_required",
            "response_id": id,
            "transcript": [{"role": "user", "content": said}],
        });
        support::send_json(&mut self.ws, &request).await;
        self.until(&format!("response {id}"), |f| {
            f["response_type"] == "response"
                && f["response_id"] == id
                && f["content_complete"] == true
        })
        .await;
        self.frames
            .iter()
            .filter(|f| f["response_type"] == "response" && f["response_id"] == id)
            .map(|f| f["content"].as_str().unwrap())
            .collect()
    }

    /// Whether this socket got what only a call's first socket gets.
    fn got_a_fresh_start(&self) -> bool {
        self.frames.iter().any(|f| {
            (f["response_type"] == "response" && f["response_id"] == 0)
                || f["response_type"] == "update_agent"
        })
    }
}

// ---- the secret ------------------------------------------------------------------------------

/// Everything the server logs, from every test of this binary.
fn captured_logs() -> Arc<Mutex<String>> {
    static LOGS: OnceLock<Arc<Mutex<String>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Arc::new(Mutex::new(String::new()));
        let capture = Capture(Arc::clone(&logs));
        tracing::subscriber::set_global_default(capture).unwrap();
        logs
    })
    .clone()
}

/// A tracing subscriber that writes every event's and span's fields into a string.
struct Capture(Arc<Mutex<String>>);

struct Fields<'a>(&'a mut String);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, " {}={value:?}", field.name());
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let mut line = format!("span {}", span.metadata().name());
        span.record(&mut Fields(&mut line));
        self.0.lock().unwrap().push_str(&(line + "\n"));
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        let mut line = String::from("record");
        values.record(&mut Fields(&mut line));
        self.0.lock().unwrap().push_str(&(line + "\n"));
    }

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        let mut line = format!("{} {}", event.metadata().level(), event.metadata().target());
        event.record(&mut Fields(&mut line));
        self.0.lock().unwrap().push_str(&(line + "\n"));
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

#[tokio::test]
async fn with_a_secret_only_the_right_one_opens_the_socket() {
    let logs = captured_logs();
    bounded(async {
        let server = Running::start(guarded(|_| {})).await;
        let addr = server.addr;
        let prefix = &SECRET[..SECRET.len() - 1];
        let longer = format!("{SECRET}0");
        // No secret: 401; a wrong, partial, longer or empty one: 403 (path and query forms).
        assert_eq!(refused(addr, "/llm-websocket/call_s").await, 401);
        assert_eq!(refused(addr, "/llm-websocket/call_s?other=1").await, 401);
        // The call id forgotten: the secret lands where the call id goes, and is still no
        // secret.
        assert_eq!(
            refused(addr, &format!("/llm-websocket/{SECRET}")).await,
            401
        );
        for wrong in ["wrong", prefix, longer.as_str(), "RTL-4F9C2B7E1D0A5C3B8E6F"] {
            let path = format!("/llm-websocket/{wrong}/call_s");
            assert_eq!(refused(addr, &path).await, 403, "{path}");
            let query = format!("/llm-websocket/call_s?secret={wrong}");
            assert_eq!(refused(addr, &query).await, 403, "{query}");
        }
        assert_eq!(refused(addr, "/llm-websocket/call_s?secret=").await, 403);
        assert_eq!(
            refused(addr, &format!("/llm-websocket/x/{SECRET}/call_s")).await,
            404
        );
        // Nothing was let in.
        assert_eq!(server.metrics.active_sessions(Door::Retell), 0);

        // The right secret in the path: a working call.
        let mut call = Socket::new(open(addr, &with_secret("call_p")).await.unwrap());
        call.begun().await;
        assert_eq!(call.ask(1, "hello").await, "You said: hello");
        // ... and in the query.
        let query = format!("/llm-websocket/call_q?secret={SECRET}");
        let mut call = Socket::new(open(addr, &query).await.unwrap());
        call.begun().await;
        assert_eq!(call.ask(1, "hi").await, "You said: hi");
        server.stop().await;
    })
    .await;
    // Refusals and calls were logged, the secret never.
    let logs = logs.lock().unwrap().clone();
    assert!(logs.contains("Retell upgrade refused"), "{logs}");
    assert!(logs.contains("call_p"), "{logs}");
    assert!(!logs.contains("rtl-4f9c"), "the secret was logged:\n{logs}");
}

#[tokio::test]
async fn without_a_secret_todays_urls_work_and_urls_with_one_are_refused() {
    bounded(async {
        let server = Running::start(config(|c| c.retell.begin_message = "Hi.".into())).await;
        let mut call = Socket::new(open(server.addr, "/llm-websocket/call_open").await.unwrap());
        call.begun().await;
        assert_eq!(call.ask(1, "hello").await, "You said: hello");
        // A URL with a secret the server does not have: refused, so an operator who pasted
        // one does not run unprotected without knowing.
        let path = "/llm-websocket/some-secret/call_other";
        assert_eq!(refused(server.addr, path).await, 404);
        let query = "/llm-websocket/call_other?secret=some-secret";
        assert_eq!(refused(server.addr, query).await, 404);
        server.stop().await;
    })
    .await;
}

// ---- one socket per call -------------------------------------------------------------------

#[tokio::test]
async fn a_second_socket_for_a_live_call_is_refused_and_the_first_keeps_answering() {
    let logs = captured_logs();
    bounded(async {
        let server = Running::start(guarded(|_| {})).await;
        let addr = server.addr;
        let mut first = Socket::new(open(addr, &with_secret("call_live")).await.unwrap());
        first.begun().await;
        assert_eq!(first.ask(1, "one").await, "You said: one");
        // A takeover attempt with the right secret, path or query form: 409 (after the
        // reconnect grace); meanwhile and afterwards the first socket answers as before.
        let path = with_secret("call_live");
        let (status, answer) = tokio::join!(refused(addr, &path), first.ask(2, "two"));
        assert_eq!(status, 409);
        assert_eq!(answer, "You said: two");
        let query = format!("/llm-websocket/call_live?secret={SECRET}");
        assert_eq!(refused(addr, &query).await, 409);
        assert_eq!(first.ask(3, "three").await, "You said: three");
        assert_eq!(server.metrics.active_sessions(Door::Retell), 1);
        // Without the secret the answer is 401, not 409: it says nothing about the call.
        assert_eq!(refused(addr, "/llm-websocket/call_live").await, 401);
        server.stop().await;
    })
    .await;
    // The refusals were logged, without the call id (docs/doors/retell.md).
    let logs = logs.lock().unwrap().clone();
    let refusals: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("has a live socket"))
        .collect();
    assert!(!refusals.is_empty(), "{logs}");
    assert!(
        refusals.iter().all(|l| !l.contains("call_live")),
        "{refusals:#?}"
    );
}

/// A closed call keeps its state for a resume only within `max_parked_call_bytes`: one over
/// it is forgotten as its socket closes, and a reconnect starts afresh (an outside probe had
/// ten closed calls hold 88 MiB of `call_details` for the whole window).
#[tokio::test]
async fn a_closed_call_over_the_parked_bound_is_forgotten() {
    bounded(async {
        let server = Running::start(guarded(|c| {
            c.retell.max_parked_call_bytes = 4 * 1024;
        }))
        .await;
        let addr = server.addr;
        for (call_id, metadata_bytes, resumes) in
            [("call_small", 100, true), ("call_big", 8_000, false)]
        {
            let mut first = Socket::new(open(addr, &with_secret(call_id)).await.unwrap());
            first.begun().await;
            let details = json!({
                "interaction_type": "call_details",
                "call": {"call_id": call_id, "metadata": {"note": "m".repeat(metadata_bytes)}},
            });
            support::send_json(&mut first.ws, &details).await;
            assert_eq!(first.ask(1, "one").await, "You said: one");
            first.ws.close(None).await.unwrap();
            server.sessions_drain(Door::Retell).await;
            let mut second = Socket::new(open(addr, &with_secret(call_id)).await.unwrap());
            assert_eq!(second.ask(2, "two").await, "You said: two");
            assert_eq!(
                !second.got_a_fresh_start(),
                resumes,
                "{call_id}: {:#?}",
                second.frames
            );
            second.ws.close(None).await.unwrap();
            server.sessions_drain(Door::Retell).await;
        }
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn a_reconnect_after_the_socket_closed_resumes_the_call() {
    bounded(async {
        let server = Running::start(guarded(|_| {})).await;
        let addr = server.addr;
        let mut first = Socket::new(open(addr, &with_secret("call_rc")).await.unwrap());
        first.begun().await;
        assert_eq!(first.ask(1, "one").await, "You said: one");
        assert!(first.got_a_fresh_start());

        // Retell closes the socket and reconnects at once (the reconnect may reach the
        // server before the close has been handled: the grace covers it).
        first.ws.close(None).await.unwrap();
        let mut second = Socket::new(open(addr, &with_secret("call_rc")).await.unwrap());
        assert_eq!(second.ask(2, "two").await, "You said: two");
        assert_eq!(second.frames[0]["response_type"], "config");
        assert!(!second.got_a_fresh_start(), "{:#?}", second.frames);

        // The connection drops without a close frame; the reconnect resumes too.
        drop(second);
        let query = format!("/llm-websocket/call_rc?secret={SECRET}");
        let mut third = Socket::new(open(addr, &query).await.unwrap());
        assert_eq!(third.ask(3, "three").await, "You said: three");
        assert!(!third.got_a_fresh_start(), "{:#?}", third.frames);
        third.ws.close(None).await.unwrap();
        server.sessions_drain(Door::Retell).await;
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn two_reconnects_at_once_one_wins() {
    bounded(async {
        let server = Running::start(guarded(|_| {})).await;
        let addr = server.addr;
        let mut first = Socket::new(open(addr, &with_secret("call_race")).await.unwrap());
        first.begun().await;
        first.ws.close(None).await.unwrap();
        server.sessions_drain(Door::Retell).await;

        let path = with_secret("call_race");
        let (a, b) = tokio::join!(open(addr, &path), open(addr, &path));
        let (winner, loser) = match (a, b) {
            (Ok(ws), Err(refusal)) | (Err(refusal), Ok(ws)) => (ws, refusal),
            (a, b) => panic!(
                "exactly one reconnect must win: {:?} / {:?}",
                a.map(drop),
                b.map(drop)
            ),
        };
        assert_eq!(loser.0, 409, "{}", loser.1);
        let mut winner = Socket::new(winner);
        assert_eq!(winner.ask(1, "who won?").await, "You said: who won?");
        assert!(!winner.got_a_fresh_start(), "{:#?}", winner.frames);
        // Once the winner leaves, the call is free again.
        winner.ws.close(None).await.unwrap();
        let mut next = Socket::new(open(addr, &path).await.unwrap());
        assert_eq!(next.ask(2, "me now").await, "You said: me now");
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn after_the_resume_window_a_reconnect_starts_a_new_call() {
    bounded(async {
        let server = Running::start(guarded(|c| c.retell.resume_window_secs = 1)).await;
        let addr = server.addr;
        let mut first = Socket::new(open(addr, &with_secret("call_late")).await.unwrap());
        first.begun().await;
        first.ws.close(None).await.unwrap();
        server.sessions_drain(Door::Retell).await;
        // Longer than the window after the socket closed.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let mut again = Socket::new(open(addr, &with_secret("call_late")).await.unwrap());
        assert_eq!(again.ask(1, "new call?").await, "You said: new call?");
        // A new call: the begin message and update_agent again.
        let kinds: Vec<_> = again.frames.iter().map(|f| &f["response_type"]).collect();
        assert_eq!(kinds[..3], ["config", "response", "update_agent"]);
        assert_eq!(again.frames[1]["response_id"], 0);
        assert_eq!(again.frames[1]["content"], "Welcome.");
        server.stop().await;
    })
    .await;
}

#[tokio::test]
async fn a_refused_socket_does_not_count_against_the_call() {
    bounded(async {
        // Wrong secrets for a live call's id change nothing for it.
        let server = Running::start(guarded(|_| {})).await;
        let addr = server.addr;
        let mut call = Socket::new(open(addr, &with_secret("call_keep")).await.unwrap());
        call.begun().await;
        for _ in 0..3 {
            assert_eq!(refused(addr, "/llm-websocket/nope/call_keep").await, 403);
        }
        assert_eq!(call.ask(1, "still mine").await, "You said: still mine");
        let mut ws = call.ws;
        ws.send(Message::Close(None)).await.unwrap();
        server.sessions_drain(Door::Retell).await;
        server.stop().await;
    })
    .await;
}
