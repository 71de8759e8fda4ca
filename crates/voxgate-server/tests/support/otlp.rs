//! A real OTLP/HTTP trace receiver for tests: an in-process HTTP server on a free loopback
//! port that accepts `POST /v1/traces` with `application/x-protobuf` bodies as a collector
//! does, decodes them with the official `opentelemetry-proto` messages, keeps every span for
//! assertions, and answers with an empty `ExportTraceServiceResponse`.
//!
//! [`SpanTree`] makes parent/child assertions short:
//!
//! ```ignore
//! let tree = receiver.wait_for_spans(3).await;
//! assert_eq!(tree.shape(), "session\n  turn\n    llm\n");
//! let turn = tree.one("turn");
//! assert_eq!(tree.parent_of(turn).unwrap().name, "session");
//! assert_eq!(tree.child_names("turn"), ["llm"]);
//! ```
//!
//! Included as its own module (`#[path = "support/otlp.rs"] mod otlp;`) by the tests that need
//! it, so the other test binaries (and voxgate-client's) do not need `opentelemetry-proto`.

#![allow(dead_code, unreachable_pub, reason = "each test binary uses a subset")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use prost::Message as _;
use tokio::sync::Notify;

/// How long [`OtlpReceiver::wait_for`] waits for spans to arrive.
pub const WAIT: Duration = Duration::from_secs(15);

/// One span as a collector received it, ids in lowercase hex.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedSpan {
    /// The span's name (`session`, `turn`, `llm`...).
    pub name: String,
    /// 32 hex digits.
    pub trace_id: String,
    /// 16 hex digits.
    pub span_id: String,
    /// The parent's span id; `None` for a root span.
    pub parent_span_id: Option<String>,
    /// Attributes with their values as text (`"1"`, `"true"`, `"xiaozhi"`).
    pub attributes: BTreeMap<String, String>,
    /// Start, nanoseconds since the Unix epoch.
    pub start_unix_nanos: u64,
    /// End, nanoseconds since the Unix epoch.
    pub end_unix_nanos: u64,
    /// Names of the span's events (a `tracing` event inside the span: its message).
    pub events: Vec<String>,
    /// The span's status is an error.
    pub error: bool,
    /// `service.name` of the resource that sent it.
    pub service_name: Option<String>,
    /// The instrumentation scope (tracer) name.
    pub scope: String,
}

impl ReceivedSpan {
    /// The attribute `key` as text; panics naming the span when it is missing.
    pub fn attr(&self, key: &str) -> &str {
        self.attributes.get(key).map_or_else(
            || {
                panic!(
                    "span {} has no attribute {key:?}: {:?}",
                    self.name, self.attributes
                )
            },
            String::as_str,
        )
    }

    /// How long the span lasted.
    pub fn duration(&self) -> Duration {
        Duration::from_nanos(self.end_unix_nanos.saturating_sub(self.start_unix_nanos))
    }
}

/// What the handler shares with the test.
#[derive(Default)]
struct Received {
    spans: Mutex<Vec<ReceivedSpan>>,
    /// Export requests accepted, and refused (wrong path handled by axum; wrong content type
    /// or an undecodable body here).
    requests: Mutex<(usize, usize)>,
    arrived: Notify,
}

/// A running receiver; stop it with [`OtlpReceiver::stop`] (dropping it also ends the
/// server, with the test's runtime).
pub struct OtlpReceiver {
    /// Where it listens.
    pub addr: SocketAddr,
    received: Arc<Received>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl OtlpReceiver {
    /// Starts a receiver on `127.0.0.1:0`.
    pub async fn start() -> Self {
        let received = Arc::new(Received::default());
        let app = Router::new()
            .route("/v1/traces", post(export))
            .with_state(received.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        Self {
            addr,
            received,
            stop: Some(stop),
            task,
        }
    }

    /// The base URL to configure as `[telemetry] otlp_endpoint` (`http://127.0.0.1:PORT`).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far, in arrival order.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.received.spans.lock().unwrap().clone()
    }

    /// Export requests (accepted, refused) so far.
    pub fn requests(&self) -> (usize, usize) {
        *self.received.requests.lock().unwrap()
    }

    /// The spans received so far as a tree.
    pub fn span_tree(&self) -> SpanTree {
        SpanTree::new(self.spans())
    }

    /// Waits (up to [`WAIT`]) until `done` holds for the spans received, and returns them as
    /// a tree; panics with what did arrive otherwise.
    pub async fn wait_for(&self, done: impl Fn(&SpanTree) -> bool) -> SpanTree {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let arrived = self.received.arrived.notified();
            let tree = self.span_tree();
            if done(&tree) {
                return tree;
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                panic!(
                    "the spans awaited did not arrive within {WAIT:?}; received:\n{}",
                    tree.render()
                );
            }
        }
    }

    /// Waits until at least `n` spans have arrived (see [`Self::wait_for`]).
    pub async fn wait_for_spans(&self, n: usize) -> SpanTree {
        self.wait_for(|t| t.spans().len() >= n).await
    }

    /// Stops the server and waits for it to end.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(WAIT, &mut self.task)
            .await
            .expect("the OTLP receiver stops")
            .unwrap();
    }
}

/// `POST /v1/traces`: an OTLP/HTTP protobuf export.
async fn export(
    State(received): State<Arc<Received>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let refuse = |status: StatusCode, why: String| {
        received.requests.lock().unwrap().1 += 1;
        (status, why).into_response()
    };
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if content_type != "application/x-protobuf" {
        return refuse(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("content-type {content_type:?}, want application/x-protobuf"),
        );
    }
    let request = match ExportTraceServiceRequest::decode(body) {
        Ok(r) => r,
        Err(e) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                format!("not an export request: {e}"),
            );
        }
    };
    let mut spans = Vec::new();
    for resource_spans in request.resource_spans {
        let service_name = resource_spans.resource.as_ref().and_then(|r| {
            r.attributes
                .iter()
                .find(|kv| kv.key == "service.name")
                .map(|kv| text(kv.value.as_ref()))
        });
        for scope_spans in resource_spans.scope_spans {
            let scope = scope_spans.scope.map(|s| s.name).unwrap_or_default();
            for span in scope_spans.spans {
                spans.push(ReceivedSpan {
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: (!span.parent_span_id.is_empty())
                        .then(|| hex(&span.parent_span_id)),
                    attributes: attributes(&span.attributes),
                    start_unix_nanos: span.start_time_unix_nano,
                    end_unix_nanos: span.end_time_unix_nano,
                    events: span.events.into_iter().map(|e| e.name).collect(),
                    // STATUS_CODE_ERROR = 2.
                    error: span.status.is_some_and(|s| s.code == 2),
                    service_name: service_name.clone(),
                    scope: scope.clone(),
                });
            }
        }
    }
    received.spans.lock().unwrap().extend(spans);
    received.requests.lock().unwrap().0 += 1;
    received.arrived.notify_waiters();
    (
        [(header::CONTENT_TYPE, "application/x-protobuf")],
        ExportTraceServiceResponse::default().encode_to_vec(),
    )
        .into_response()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
        .collect()
}

/// An attribute value as text: strings as they are, numbers and booleans as Rust prints them.
fn text(value: Option<&AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        None => String::new(),
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(Value::BytesValue(b)) => hex(b),
        Some(Value::ArrayValue(a)) => {
            let items: Vec<String> = a.values.iter().map(|v| text(Some(v))).collect();
            format!("[{}]", items.join(", "))
        }
        Some(other) => format!("{other:?}"),
    }
}

/// Received spans with their parent links, for short assertions about a trace's shape.
#[derive(Debug, Clone)]
pub struct SpanTree {
    spans: Vec<ReceivedSpan>,
}

impl SpanTree {
    /// A tree of `spans`, ordered by start time.
    pub fn new(mut spans: Vec<ReceivedSpan>) -> Self {
        spans.sort_by_key(|s| (s.start_unix_nanos, s.end_unix_nanos));
        Self { spans }
    }

    /// Every span, by start time.
    pub fn spans(&self) -> &[ReceivedSpan] {
        &self.spans
    }

    /// The spans called `name`, by start time.
    pub fn named(&self, name: &str) -> Vec<&ReceivedSpan> {
        self.spans.iter().filter(|s| s.name == name).collect()
    }

    /// The one span called `name`; panics (showing the tree) unless there is exactly one.
    pub fn one(&self, name: &str) -> &ReceivedSpan {
        match self.named(name).as_slice() {
            [one] => one,
            found => panic!(
                "want one span {name:?}, found {}:\n{}",
                found.len(),
                self.render()
            ),
        }
    }

    /// `span`'s parent, when it was received.
    pub fn parent_of(&self, span: &ReceivedSpan) -> Option<&ReceivedSpan> {
        let parent = span.parent_span_id.as_deref()?;
        self.spans
            .iter()
            .find(|s| s.span_id == parent && s.trace_id == span.trace_id)
    }

    /// The children of `span`, by start time.
    pub fn children(&self, span: &ReceivedSpan) -> Vec<&ReceivedSpan> {
        self.spans
            .iter()
            .filter(|s| {
                s.trace_id == span.trace_id && s.parent_span_id.as_deref() == Some(&span.span_id)
            })
            .collect()
    }

    /// The children of every span called `name`, by start time.
    pub fn children_of(&self, name: &str) -> Vec<&ReceivedSpan> {
        let mut children: Vec<&ReceivedSpan> = self
            .named(name)
            .into_iter()
            .flat_map(|p| self.children(p))
            .collect();
        children.sort_by_key(|s| s.start_unix_nanos);
        children
    }

    /// The names of [`Self::children_of`] `name`, by start time.
    pub fn child_names(&self, name: &str) -> Vec<&str> {
        self.children_of(name)
            .into_iter()
            .map(|s| s.name.as_str())
            .collect()
    }

    /// Spans without a parent, or whose parent was not received.
    pub fn roots(&self) -> Vec<&ReceivedSpan> {
        self.spans
            .iter()
            .filter(|s| self.parent_of(s).is_none())
            .collect()
    }

    /// The span reached from a root called `path[0]` through children called `path[1..]`;
    /// panics (showing the tree) when there is no such chain or more than one.
    pub fn path(&self, path: &[&str]) -> &ReceivedSpan {
        let Some((first, rest)) = path.split_first() else {
            panic!("an empty path");
        };
        let mut found: Vec<&ReceivedSpan> = self
            .roots()
            .into_iter()
            .filter(|s| s.name == *first)
            .collect();
        for name in rest {
            found = found
                .into_iter()
                .flat_map(|p| self.children(p))
                .filter(|s| s.name == *name)
                .collect();
        }
        match found.as_slice() {
            [one] => one,
            _ => panic!(
                "want one span at {}, found {}:\n{}",
                path.join(" > "),
                found.len(),
                self.render()
            ),
        }
    }

    /// The tree's names only, one per line, two spaces per level, children by start time:
    /// `"session\n  turn\n    llm\n"`. Compare it whole for a trace's shape.
    pub fn shape(&self) -> String {
        self.draw(false)
    }

    /// Like [`Self::shape`] with each span's attributes (the `code.*`, `target`, timing and
    /// thread ones left out), for failure messages.
    pub fn render(&self) -> String {
        self.draw(true)
    }

    fn draw(&self, with_attributes: bool) -> String {
        fn walk(tree: &SpanTree, span: &ReceivedSpan, depth: usize, attrs: bool, out: &mut String) {
            let _ = write!(out, "{}{}", "  ".repeat(depth), span.name);
            if attrs {
                let shown: Vec<String> = span
                    .attributes
                    .iter()
                    .filter(|(k, _)| !is_bookkeeping(k))
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                if !shown.is_empty() {
                    let _ = write!(out, " {{{}}}", shown.join(" "));
                }
            }
            out.push('\n');
            for child in tree.children(span) {
                walk(tree, child, depth + 1, attrs, out);
            }
        }
        let mut out = String::new();
        for root in self.roots() {
            walk(self, root, 0, with_attributes, &mut out);
        }
        out
    }
}

/// Attributes tracing-opentelemetry adds to every span (source location, target, busy/idle
/// time, thread), which say nothing about the conversation.
pub fn is_bookkeeping(key: &str) -> bool {
    key.starts_with("code.")
        || key.starts_with("thread.")
        || matches!(key, "target" | "busy_ns" | "idle_ns" | "level")
}
