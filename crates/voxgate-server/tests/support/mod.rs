//! Scaffolding shared by the server's integration tests: a server on ephemeral ports that
//! stops on request, WebSocket connect / receive with a timeout, raw HTTP/1.1 requests, the
//! Bridge/MCP helpers (Server-Sent Events, a scripted MCP server that connects in over
//! WebSocket the way `mcp2xiaozhi` / `xiaozhi-mcp` relay one), a Xiaozhi device streaming
//! `question.wav` as real-time Opus, and `/metrics` read with a real Prometheus parser
//! (`prometheus-parse`). Door-specific helpers used by one file stay in it. voxgate-client's
//! end-to-end tests include this file too (`#[path]`).

// Every test binary compiles this module (`mod support;`) but uses only part of it; without
// these allows the unused rest would warn, and clippy `-D warnings` would fail, per binary.
#![allow(dead_code, unreachable_pub, reason = "each test binary uses a subset")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::{Sink, SinkExt, Stream, StreamExt};
use prometheus_parse::{LineInfo, Sample, Scrape};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use voxgate_audio::opus::{FrameDuration, OpusEncoder, OpusEncoderConfig};
use voxgate_server::metrics::Door;
use voxgate_server::{Config, Metrics, Providers, Server};
use voxgate_xiaozhi::frame::{Frame, FrameCodec, ProtocolVersion};

/// How long a test waits for any one thing (a connection, a message, a shutdown) unless it
/// says otherwise.
pub const WAIT: Duration = Duration::from_secs(10);

/// The doors' own listeners a test may ask [`Running::listener`] for.
const LISTENERS: [&str; 3] = ["xiaozhi", "xiaozhi-ota", "gemini"];

/// A server on ephemeral loopback ports, running until [`Running::stop`].
pub struct Running {
    /// The main listener.
    pub addr: SocketAddr,
    /// The server's metrics, for session counts and counters.
    pub metrics: Arc<Metrics>,
    listeners: Vec<(&'static str, SocketAddr)>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// The server `config` describes, with the providers it names (embedded ones for the
    /// sections it leaves out), as `voxgate-server` itself starts.
    pub async fn start(config: Config) -> Self {
        let config = config.with_ephemeral_ports();
        let providers = Providers::from_config(&config).unwrap();
        Self::start_with(config, providers).await
    }

    /// The server `config` describes with the given providers, the overload guard off: a test
    /// shares its threads with the server and often floods it, and on a busy machine (a build
    /// beside the tests) the guard takes that for an overloaded server and refuses sessions the
    /// test counts on. [`Running::start_with_overload_guard`] keeps it.
    pub async fn start_with(mut config: Config, providers: Providers) -> Self {
        config.limits.max_scheduling_delay_ms = 0;
        Self::start_with_overload_guard(config, providers).await
    }

    /// The server `config` describes with the given providers, its overload guard as configured.
    pub async fn start_with_overload_guard(config: Config, providers: Providers) -> Self {
        let config = config.with_ephemeral_ports();
        let server = Server::bind_with(config, providers).await.unwrap();
        let addr = server.local_addr();
        let metrics = server.metrics();
        let listeners = LISTENERS
            .into_iter()
            .filter_map(|name| Some((name, server.listener_addr(name)?)))
            .collect();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            server
                .run(async move {
                    let _ = rx.await;
                })
                .await
                .unwrap();
        });
        Self {
            addr,
            metrics,
            listeners,
            stop: Some(tx),
            task,
        }
    }

    /// The address of a door's own listener (`"xiaozhi"`, `"xiaozhi-ota"`, `"gemini"`), when
    /// the configuration opened it.
    pub fn listener(&self, name: &str) -> Option<SocketAddr> {
        self.listeners
            .iter()
            .find_map(|(n, a)| (*n == name).then_some(*a))
    }

    /// Stops the server and waits for it to finish.
    pub async fn stop(self) {
        self.stop_within(WAIT).await;
    }

    /// Stops the server; it must finish within `wait`.
    pub async fn stop_within(mut self, wait: Duration) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(wait, self.task)
            .await
            .expect("server shuts down")
            .unwrap();
    }

    /// Waits until `door` has no open session.
    pub async fn sessions_drain(&self, door: Door) {
        self.wait_sessions(door, 0).await;
    }

    /// Waits until `door` has `n` open sessions.
    pub async fn wait_sessions(&self, door: Door, n: u64) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while self.metrics.active_sessions(door) != n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} sessions never reached {n}",
                door.label()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

// ---- WebSocket ------------------------------------------------------------------------------

/// A client WebSocket.
pub type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Opens `url` with extra request headers; the upgrade must be answered within `wait`.
pub async fn try_connect(
    url: &str,
    headers: &[(&str, &str)],
    wait: Duration,
) -> Result<Ws, tokio_tungstenite::tungstenite::Error> {
    let mut req = url.into_client_request().unwrap();
    for (k, v) in headers {
        let name: tokio_tungstenite::tungstenite::http::HeaderName = k.parse().unwrap();
        req.headers_mut().insert(name, v.parse().unwrap());
    }
    tokio::time::timeout(wait, tokio_tungstenite::connect_async(req))
        .await
        .expect("connect in time")
        .map(|(ws, _)| ws)
}

/// Opens `ws://{addr}{path}`; the upgrade must succeed.
pub async fn connect(addr: SocketAddr, path: &str) -> Ws {
    try_connect(&format!("ws://{addr}{path}"), &[], WAIT)
        .await
        .unwrap()
}

/// A Xiaozhi device's WebSocket (protocol version 1, the test device's ids), before its hello.
pub async fn xiaozhi_device(addr: SocketAddr) -> Ws {
    try_connect(
        &format!("ws://{addr}/xiaozhi/v1/"),
        &[
            ("Protocol-Version", "1"),
            ("Device-Id", "aa:bb:cc:dd:ee:ff"),
            ("Client-Id", "3b5c1f2e-0000-4000-8000-000000000001"),
        ],
        WAIT,
    )
    .await
    .unwrap()
}

/// The next data message (text or binary) within `wait`, skipping control frames; `None`
/// when the server closed or the connection failed.
pub async fn next_message<S>(rx: &mut S, wait: Duration) -> Option<Message>
where
    S: Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    loop {
        let msg = tokio::time::timeout(wait, rx.next())
            .await
            .expect("a message within the timeout");
        match msg {
            Some(Ok(m @ (Message::Text(_) | Message::Binary(_)))) => return Some(m),
            Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return None,
            Some(Ok(_)) => {}
        }
    }
}

/// Sends `v` as one text frame.
pub async fn send_json(ws: &mut Ws, v: &Value) {
    ws.send(Message::Text(v.to_string().into())).await.unwrap();
}

// ---- HTTP -----------------------------------------------------------------------------------

/// A parsed HTTP response.
#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub head: String,
    pub body: String,
}

impl HttpResponse {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }
}

/// Sends one request (`Connection: close`) and reads the whole response. `body` is sent
/// verbatim; `headers` are extra header lines.
pub async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> HttpResponse {
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    exchange(addr, req.as_bytes(), body).await
}

/// Sends a request written out by the caller (`head` up to and including the blank line,
/// then `body`) and reads the whole response, which the request must make the server close.
pub async fn exchange(addr: SocketAddr, head: &[u8], body: &[u8]) -> HttpResponse {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(head).await.unwrap();
    // A server may answer (413) before reading a large body and close: ignore write errors.
    let _ = s.write_all(body).await;
    let mut raw = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut raw))
        .await
        .expect("response in time")
        .unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    HttpResponse {
        status,
        head: head.to_owned(),
        body,
    }
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

pub async fn post_json(addr: SocketAddr, path: &str, body: &Value) -> HttpResponse {
    http(
        addr,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    )
    .await
}

/// An open Server-Sent Events stream.
pub struct Sse {
    reader: BufReader<TcpStream>,
}

impl Sse {
    pub async fn open(addr: SocketAddr, path: &str) -> Self {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut reader = BufReader::new(s);
        // Skip the response head.
        loop {
            let mut line = String::new();
            tokio::time::timeout(WAIT, reader.read_line(&mut line))
                .await
                .unwrap()
                .unwrap();
            if line == "\r\n" || line.is_empty() {
                break;
            }
            assert!(!line.starts_with("HTTP/1.1 4"), "{line}");
        }
        Self { reader }
    }

    /// The next `(event, data)`; comments (keep-alives) are skipped. Chunk-size lines of
    /// the chunked transfer encoding are not `event:`/`data:` lines and are skipped too.
    pub async fn next(&mut self) -> (String, String) {
        let mut event = String::new();
        let mut data = String::new();
        loop {
            let mut line = String::new();
            let n = tokio::time::timeout(WAIT, self.reader.read_line(&mut line))
                .await
                .expect("SSE event in time")
                .unwrap();
            assert!(n > 0, "SSE stream ended");
            let line = line.trim_end_matches(['\r', '\n']);
            if let Some(e) = line.strip_prefix("event:") {
                event = e.trim().to_owned();
            } else if let Some(d) = line.strip_prefix("data:") {
                data.push_str(d.trim_start());
            } else if line.is_empty() && !data.is_empty() {
                return (event, data);
            }
        }
    }
}

/// Opens `/mcp...` as a bridge would; `Err` carries the HTTP status of a refused upgrade.
pub async fn mcp_connect(addr: SocketAddr, path_and_query: &str) -> Result<Ws, u16> {
    match try_connect(&format!("ws://{addr}{path_and_query}"), &[], WAIT).await {
        Ok(ws) => Ok(ws),
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => Err(resp.status().as_u16()),
        Err(e) => panic!("connect failed: {e}"),
    }
}

/// The next JSON-RPC message from the server (pings answered by tungstenite).
pub async fn recv_json(ws: &mut Ws) -> Value {
    loop {
        if let Message::Text(t) = next_message(ws, WAIT).await.expect("socket open") {
            assert_eq!(t.as_str(), t.trim(), "frames are compact, untrimmed JSON");
            return serde_json::from_str(&t).unwrap();
        }
    }
}

pub fn tool(name: &str, description: &str) -> Value {
    json!({
        "name": name,
        "description": description,
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}},
                        "required": ["text"]}
    })
}

/// Plays the bridge + MCP server through the handshake: answers `initialize`, checks
/// `notifications/initialized`, then serves `tools/list` from `pages` (one page each, linked
/// by cursors). Returns the socket with the handshake done.
pub async fn handshake(ws: &mut Ws, server_name: &str, pages: &[Vec<Value>]) {
    let init = recv_json(ws).await;
    assert_eq!(init["jsonrpc"], "2.0");
    assert_eq!(init["method"], "initialize");
    assert_eq!(init["params"]["protocolVersion"], "2024-11-05");
    send_json(
        ws,
        &json!({"jsonrpc":"2.0","id":init["id"],"result":{
            "protocolVersion":"2024-11-05","capabilities":{"tools":{}},
            "serverInfo":{"name":server_name,"version":"1.0"}}}),
    )
    .await;
    let note = recv_json(ws).await;
    assert_eq!(note["method"], "notifications/initialized");
    assert!(note.get("id").is_none());
    for (i, page) in pages.iter().enumerate() {
        let list = recv_json(ws).await;
        assert_eq!(list["method"], "tools/list");
        let expected_cursor = if i == 0 {
            String::new()
        } else {
            format!("page{i}")
        };
        let cursor = list["params"]["cursor"].as_str().unwrap_or_default();
        assert_eq!(cursor, expected_cursor);
        let mut result = json!({"tools": page});
        if i + 1 < pages.len() {
            result["nextCursor"] = json!(format!("page{}", i + 1));
        }
        send_json(
            ws,
            &json!({"jsonrpc":"2.0","id":list["id"],"result":result}),
        )
        .await;
    }
}

/// Connects to the MCP endpoint at `path_and_query` as a bridge and plays its MCP server
/// through the [`handshake`].
pub async fn mcp_server(
    addr: SocketAddr,
    path_and_query: &str,
    server_name: &str,
    pages: &[Vec<Value>],
) -> Ws {
    let mut ws = mcp_connect(addr, path_and_query).await.unwrap();
    handshake(&mut ws, server_name, pages).await;
    ws
}

/// Answers `tools/call` requests until `n` were served: `echo` returns its text, anything else
/// an error result. Returns the calls seen.
pub async fn serve_calls(ws: &mut Ws, n: usize) -> Vec<Value> {
    serve_calls_after(ws, n, Duration::ZERO).await
}

/// [`serve_calls`], answering each call `delay` after it arrived (a tool that takes its time).
pub async fn serve_calls_after(ws: &mut Ws, n: usize, delay: Duration) -> Vec<Value> {
    let mut seen = Vec::new();
    while seen.len() < n {
        let call = recv_json(ws).await;
        if call["method"] != "tools/call" {
            continue;
        }
        tokio::time::sleep(delay).await;
        let name = call["params"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let text = call["params"]["arguments"]["text"]
            .as_str()
            .unwrap_or_default();
        let result = if name.ends_with("echo") {
            json!({"content":[{"type":"text","text":format!("echo: {text}")}],"isError":false})
        } else {
            json!({"content":[{"type":"text","text":"no such tool"}],"isError":true})
        };
        send_json(
            ws,
            &json!({"jsonrpc":"2.0","id":call["id"],"result":result}),
        )
        .await;
        seen.push(call);
    }
    seen
}

/// Polls `/admin/mcp/tools` until `check` accepts the tool names.
pub async fn wait_tools(addr: SocketAddr, check: impl Fn(&[String]) -> bool) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let r = http(addr, "GET", "/admin/mcp/tools", &[], b"").await;
        assert_eq!(r.status, 200, "{}", r.body);
        let names: Vec<String> = r.json()["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect();
        if check(&names) {
            return names;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "tools never matched: {names:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A language model whose every call fails at once, the way a refused connection does.
#[derive(Debug)]
pub struct RefusingLlm;

impl voxgate_providers::Llm for RefusingLlm {
    fn generate(&self, _request: voxgate_providers::LlmRequest) -> voxgate_providers::LlmStream {
        Box::pin(futures::stream::iter([voxgate_providers::LlmEvent::Error(
            voxgate_providers::ProviderError::Connect("connection refused".into()),
        )]))
    }
}

/// The embedded providers with a [`RefusingLlm`].
pub fn refusing_llm() -> Providers {
    Providers {
        llm: Arc::new(RefusingLlm),
        ..Providers::embedded()
    }
}

// ---- Xiaozhi speech -------------------------------------------------------------------------

/// `question.wav` ("Hello.", a 128 ms pause the VAD sees, then a question; about 2.1 s),
/// 16 kHz mono. Included (not read by path) so voxgate-client's tests find it too.
pub fn question() -> Vec<i16> {
    let wav = voxgate_audio::wav::read_wav(include_bytes!(
        "../../../voxgate-audio/tests/fixtures/question.wav"
    ))
    .unwrap();
    assert_eq!(wav.sample_rate, 16_000);
    wav.to_mono_i16()
}

/// 60 ms Opus packets of `pcm` (16 kHz) followed by `silence_ms` of silence.
pub fn opus_packets(pcm: &[i16], silence_ms: usize) -> Vec<Vec<u8>> {
    opus_packets_of(pcm, silence_ms, FrameDuration::Ms60)
}

/// Opus packets of `frame` duration of `pcm` (16 kHz) followed by `silence_ms` of silence.
pub fn opus_packets_of(pcm: &[i16], silence_ms: usize, frame: FrameDuration) -> Vec<Vec<u8>> {
    let mut enc = OpusEncoder::new(OpusEncoderConfig {
        frame_duration: frame,
        ..OpusEncoderConfig::voice(16_000)
    })
    .unwrap();
    let n = enc.frame_samples();
    let mut all = pcm.to_vec();
    all.extend(std::iter::repeat_n(0, silence_ms * 16));
    all.chunks(n)
        .map(|c| {
            let mut frame = c.to_vec();
            frame.resize(n, 0);
            enc.encode(&frame).unwrap().to_vec()
        })
        .collect()
}

/// A Xiaozhi device ([`xiaozhi_device`]) after its hello (Opus, 16 kHz, 60 ms frames) that
/// started listening in `mode` (`auto`, `manual` or `realtime`), and its frame codec.
pub async fn opus_device(addr: SocketAddr, mode: &str) -> (Ws, FrameCodec) {
    let mut ws = xiaozhi_device(addr).await;
    send_json(
        &mut ws,
        &json!({
            "type": "hello", "version": 1, "transport": "websocket",
            "audio_params": {"format": "opus", "sample_rate": 16000, "channels": 1, "frame_duration": 60}
        }),
    )
    .await;
    let Some(Message::Text(_)) = next_message(&mut ws, WAIT).await else {
        panic!("no server hello");
    };
    send_json(
        &mut ws,
        &json!({"session_id": "s", "type": "listen", "state": "start", "mode": mode}),
    )
    .await;
    (ws, FrameCodec::new(ProtocolVersion::V1))
}

/// Sends `packets` as Opus frames at real time, one 60 ms packet every 60 ms, as a device
/// streams its microphone.
pub async fn stream_opus<S>(sink: &mut S, codec: &FrameCodec, packets: &[Vec<u8>])
where
    S: Sink<Message> + Unpin,
    S::Error: std::fmt::Debug,
{
    for p in packets {
        let mut out = Vec::new();
        codec.encode(&Frame::opus(p), &mut out).unwrap();
        sink.send(Message::Binary(out.into())).await.unwrap();
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
}

/// The JSON messages up to `tts stop` (audio frames counted).
pub async fn until_tts_stop<S>(ws: &mut S) -> (Vec<Value>, usize)
where
    S: Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    let mut json = Vec::new();
    let mut audio = 0;
    loop {
        match next_message(ws, WAIT).await.expect("the server answers") {
            Message::Text(t) => {
                let v: Value = serde_json::from_str(&t).unwrap();
                let stop = v["type"] == "tts" && v["state"] == "stop";
                json.push(v);
                if stop {
                    return (json, audio);
                }
            }
            Message::Binary(_) => audio += 1,
            _ => {}
        }
    }
}

// ---- /metrics -------------------------------------------------------------------------------

/// `GET /metrics`: the response's `Content-Type` and the parsed exposition, after checking
/// that every line is one the parser reads (it skips the others silently).
pub async fn scrape(server: &Running) -> (String, Scrape) {
    let r = http(server.addr, "GET", "/metrics", &[], b"").await;
    assert_eq!(r.status, 200, "{r:?}");
    let content_type = r
        .head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_owned())
        })
        .expect("a Content-Type");
    for line in r.body.lines() {
        assert!(
            matches!(
                LineInfo::parse(line),
                LineInfo::Doc { .. } | LineInfo::Type { .. } | LineInfo::Sample { .. }
            ),
            "unreadable line {line:?}"
        );
    }
    let scrape = Scrape::parse(r.body.lines().map(|l| Ok(l.to_owned()))).unwrap();
    (content_type, scrape)
}

/// Scrapes `/metrics` until `ready` accepts it (metrics of a turn are recorded as the
/// session's events are processed, which may be just after the client saw the reply end).
pub async fn scrape_until(server: &Running, what: &str, ready: impl Fn(&Scrape) -> bool) -> Scrape {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (_, s) = scrape(server).await;
        if ready(&s) {
            return s;
        }
        assert!(tokio::time::Instant::now() < deadline, "never {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn labels(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// The sample of `metric` with exactly the labels `pairs`.
pub fn sample<'a>(scrape: &'a Scrape, metric: &str, pairs: &[(&str, &str)]) -> &'a Sample {
    let want = labels(pairs);
    scrape
        .samples
        .iter()
        .find(|s| s.metric == metric && *s.labels == want)
        .unwrap_or_else(|| panic!("no {metric}{pairs:?}"))
}

/// The value of a counter, gauge or untyped sample (a histogram's `_sum` and `_count`).
pub fn scalar(scrape: &Scrape, metric: &str, pairs: &[(&str, &str)]) -> f64 {
    match sample(scrape, metric, pairs).value {
        prometheus_parse::Value::Counter(v)
        | prometheus_parse::Value::Gauge(v)
        | prometheus_parse::Value::Untyped(v) => v,
        ref other => panic!("{metric} is {other:?}"),
    }
}

/// The `+Inf` bucket (the observation count) of one histogram series.
pub fn histogram_count(scrape: &Scrape, metric: &str, pairs: &[(&str, &str)]) -> f64 {
    let prometheus_parse::Value::Histogram(buckets) = &sample(scrape, metric, pairs).value else {
        panic!("{metric} is not a histogram");
    };
    assert!(buckets.len() > 10, "{metric}: {buckets:?}");
    buckets
        .iter()
        .find(|b| b.less_than == f64::INFINITY)
        .expect("an +Inf bucket")
        .count
}

/// One histogram series: its observation count and their sum, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Histogram {
    /// Observations (the `+Inf` bucket, equal to `_count`).
    pub count: f64,
    /// Their sum (`_sum`).
    pub sum: f64,
}

/// One histogram series, checked for consistency: `_count` equals the `+Inf` bucket and the
/// buckets never decrease.
pub fn histogram(scrape: &Scrape, metric: &str, pairs: &[(&str, &str)]) -> Histogram {
    let count = histogram_count(scrape, metric, pairs);
    assert_eq!(
        scalar(scrape, &format!("{metric}_count"), pairs),
        count,
        "{metric}{pairs:?}"
    );
    let prometheus_parse::Value::Histogram(buckets) = &sample(scrape, metric, pairs).value else {
        unreachable!("checked by histogram_count");
    };
    assert!(
        buckets.windows(2).all(|w| w[0].count <= w[1].count),
        "{metric}{pairs:?}: {buckets:?}"
    );
    Histogram {
        count,
        sum: scalar(scrape, &format!("{metric}_sum"), pairs),
    }
}

// ---- the realtime protocol ------------------------------------------------------------------

/// Sends one realtime message.
pub async fn rt_send(ws: &mut Ws, m: &voxgate_realtime::ServiceBoundMessage) {
    ws.send(Message::Binary(m.to_frame())).await.unwrap();
}

/// The next realtime message's payload.
pub async fn rt_recv<S>(ws: &mut S) -> voxgate_realtime::proto::client_bound_message::Payload
where
    S: Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    loop {
        if let Message::Binary(b) = next_message(ws, WAIT).await.expect("socket open") {
            return voxgate_realtime::ClientBoundMessage::decode_frame(b)
                .unwrap()
                .payload
                .unwrap();
        }
    }
}

/// A text-only realtime session (24 kHz speech formats), initialized.
pub async fn realtime(addr: SocketAddr) -> Ws {
    use voxgate_realtime::proto::client_bound_message::Payload;
    use voxgate_realtime::{AudioFormat, ServiceBoundMessage, SessionConfig};
    let mut ws = connect(addr, "/realtime").await;
    let config = SessionConfig::new(AudioFormat::SPEECH_24K, AudioFormat::SPEECH_24K);
    rt_send(&mut ws, &ServiceBoundMessage::initialize(&config).unwrap()).await;
    assert!(matches!(rt_recv(&mut ws).await, Payload::SessionReady(_)));
    ws
}

/// The default configuration with ASR, LLM and TTS all served by the OpenAI-compatible fakes
/// at `base` (`FakeProviders::base_url`).
pub fn with_fakes(base: &str) -> Config {
    let base = base.to_owned();
    Config {
        asr: Some(voxgate_server::config::AsrConfig {
            base_url: Some(base.clone()),
            ..Default::default()
        }),
        llm: Some(voxgate_server::config::LlmConfig {
            base_url: Some(base.clone()),
            ..Default::default()
        }),
        tts: Some(voxgate_server::config::TtsConfig {
            base_url: Some(base),
            ..Default::default()
        }),
        ..Config::default()
    }
}
