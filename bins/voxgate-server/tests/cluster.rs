//! Several instances of the server binary sharing a real `redis-server` on loopback
//! (`[cluster]`, docs/scale-out.md). Each test starts its own Redis on a free port and its own
//! instances, so tests run in parallel and can kill either.
//!
//! Ignored by default (they need `redis-server`): `cargo xtask cluster` installs it (Debian's
//! package) when missing and runs them, and CI does.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use futures::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;

const WAIT: Duration = Duration::from_secs(10);

/// A `redis-server` on a free loopback port, killed when dropped.
struct Redis {
    port: u16,
    child: Option<Child>,
}

impl Redis {
    fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut redis = Self { port, child: None };
        redis.restart();
        redis
    }

    /// (Re)starts the server on the same port, with no persistence (a restart loses
    /// everything, the hardest case for the instances).
    fn restart(&mut self) {
        let bin = std::env::var("VOXGATE_TEST_REDIS_SERVER").unwrap_or("redis-server".into());
        let child = Command::new(&bin)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start {bin} ({e}): install it with `cargo xtask cluster`")
            });
        self.child = Some(child);
        let deadline = Instant::now() + WAIT;
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One instance of the server binary, killed when dropped.
struct Instance {
    addr: SocketAddr,
    child: Child,
}

impl Instance {
    fn start(redis: &Redis, id: &str, env: &[(&str, &str)]) -> Self {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_voxgate-server"));
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("VOXGATE_") {
                cmd.env_remove(k);
            }
        }
        cmd.args(["--listen", "127.0.0.1:0"])
            .env("RUST_LOG", "warn")
            .env("NO_COLOR", "1")
            .env("VOXGATE_REDIS_URL", redis.url())
            .env("VOXGATE_INSTANCE_ID", id)
            // Devices and tests flood one loopback address.
            .env("VOXGATE_MAX_SESSIONS_PER_IP", "0")
            .env("VOXGATE_MAX_CONNECTIONS_PER_IP", "0")
            .env("VOXGATE_MAX_HANDSHAKES_PER_SEC_PER_IP", "0")
            .env("VOXGATE_MAX_SCHEDULING_DELAY_MS", "0")
            // No fixed ports of the doors' own listeners: instances share the machine.
            .env("VOXGATE_GEMINI_LISTEN", "off")
            .env("VOXGATE_XIAOZHI_LISTEN", "")
            .env("VOXGATE_XIAOZHI_OTA_LISTEN", "")
            .env("VOXGATE_WEBRTC_ENABLED", "false")
            // Whatever models this machine has or lacks, none are downloaded.
            .env("VOXGATE_MODELS_AUTO_INSTALL", "false");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, rx) = mpsc::channel();
        let lines = BufReader::new(child.stderr.take().unwrap());
        std::thread::spawn(move || {
            for line in lines.lines().map_while(Result::ok) {
                if let Some(addr) = line.strip_prefix("voxgate-server listening on http://") {
                    let _ = tx.send(addr.trim().to_owned());
                } else if line.contains("ERROR") || line.contains("panicked") {
                    eprintln!("[{line}]");
                }
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the instance starts")
            .parse()
            .unwrap();
        Self { addr, child }
    }

    /// `SIGTERM`: the graceful shutdown an orchestrator starts a drain with.
    fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The test's own Redis connection, for reading what the instances wrote.
async fn redis_get(redis: &Redis, key: &str) -> Option<String> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", redis.port))
        .await
        .ok()?;
    let cmd = format!("*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len());
    s.write_all(cmd.as_bytes()).await.ok()?;
    let mut buf = vec![0u8; 512];
    let n = s.read(&mut buf).await.ok()?;
    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
    if text.starts_with("$-1") {
        return None;
    }
    text.split("\r\n").nth(1).map(str::to_owned)
}

/// One HTTP/1.1 request; the status and the JSON body (Null when it is not JSON).
async fn http(addr: SocketAddr, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    http_as(addr, method, path, body, None).await
}

/// [`http`] with `Authorization: Bearer <token>` when given.
async fn http_as(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&Value>,
    token: Option<&str>,
) -> (u16, Value) {
    let body = body.map(Value::to_string).unwrap_or_default();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut out))
        .await
        .expect("an answer in time")
        .unwrap();
    let text = String::from_utf8_lossy(&out);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A Xiaozhi device `device` connected to `addr`, after its hello was answered.
async fn device(addr: SocketAddr, device: &str) -> Result<Ws, u16> {
    let mut req = format!("ws://{addr}/xiaozhi/v1/")
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("Device-Id", device.parse().unwrap());
    req.headers_mut().insert(
        "Client-Id",
        "3b5c1f2e-0000-4000-8000-000000000001".parse().unwrap(),
    );
    req.headers_mut()
        .insert("Protocol-Version", "1".parse().unwrap());
    let (mut ws, _) = match tokio_tungstenite::connect_async(req).await {
        Ok(c) => c,
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => return Err(r.status().as_u16()),
        Err(e) => panic!("{e}"),
    };
    let hello = json!({"type": "hello", "version": 1, "transport": "websocket",
        "audio_params": {"format": "opus", "sample_rate": 16000, "channels": 1, "frame_duration": 60}});
    ws.send(Message::Text(hello.to_string().into()))
        .await
        .unwrap();
    let answer = next_json(&mut ws).await.expect("a hello back");
    assert_eq!(answer["type"], "hello", "{answer}");
    Ok(ws)
}

/// The device's next JSON message (binary audio skipped); `None` once the socket closed.
async fn next_json(ws: &mut Ws) -> Option<Value> {
    loop {
        match tokio::time::timeout(WAIT, ws.next()).await.ok()? {
            Some(Ok(Message::Text(t))) => return serde_json::from_str(&t).ok(),
            Some(Ok(Message::Binary(_) | Message::Ping(_) | Message::Pong(_))) => {}
            _ => return None,
        }
    }
}

/// Waits until `f` holds, polling every 50 ms, up to `wait`.
async fn eventually<F: Future<Output = bool>>(wait: Duration, mut f: impl FnMut() -> F) -> bool {
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test]
#[ignore = "needs redis-server: cargo xtask cluster"]
async fn a_push_sent_through_one_instance_reaches_a_device_on_another() {
    let redis = Redis::start();
    let a = Instance::start(&redis, "a", &[]);
    let b = Instance::start(&redis, "b", &[]);
    let mut ws = device(b.addr, "AA:BB:CC:00:00:01").await.unwrap();

    let alert =
        json!({"type": "alert", "status": "Warning", "message": "Battery low", "emotion": "sad"});
    let (status, body) = http(
        a.addr,
        "POST",
        "/admin/xiaozhi/devices/aa:bb:cc:00:00:01/push",
        Some(&alert),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["instance"], "b", "answered by the holder: {body}");
    let got = next_json(&mut ws).await.unwrap();
    assert_eq!(
        (got["type"].as_str(), got["message"].as_str()),
        (Some("alert"), Some("Battery low")),
        "{got}"
    );
    assert_eq!(got["session_id"], body["session_id"]);

    // A spoken sentence: the device's session speaks it.
    let (status, body) = http(
        a.addr,
        "POST",
        "/admin/xiaozhi/devices/aa:bb:cc:00:00:01/push",
        Some(&json!({"type": "speak", "text": "Dinner is ready."})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let mut seen = Vec::new();
    while let Some(m) = next_json(&mut ws).await {
        let done = m["type"] == "tts" && m["state"] == "stop";
        seen.push(m);
        if done {
            break;
        }
    }
    assert!(
        seen.iter()
            .any(|m| m["state"] == "sentence_start" && m["text"] == "Dinner is ready."),
        "{seen:?}"
    );

    // Unknown devices and bad pushes are refused the same way on either instance.
    let (status, body) = http(
        a.addr,
        "POST",
        "/admin/xiaozhi/devices/ff:ff:ff:ff:ff:ff/push",
        Some(&alert),
    )
    .await;
    assert_eq!((status, body["error"].as_str()), (404, Some("not_found")));
    let (status, _) = http(
        a.addr,
        "POST",
        "/admin/xiaozhi/devices/aa:bb:cc:00:00:01/push",
        Some(&json!({"type": "system", "command": "format"})),
    )
    .await;
    assert_eq!(status, 400);

    let (status, cluster) = http(a.addr, "GET", "/admin/cluster", None).await;
    assert_eq!(status, 200, "{cluster}");
    assert_eq!(cluster["instance"], "a");
    assert_eq!(cluster["redis"], "up", "{cluster}");
    assert_eq!(cluster["instances"], json!(["a", "b"]), "{cluster}");
    let (_, devices) = http(b.addr, "GET", "/admin/xiaozhi/devices", None).await;
    assert_eq!(devices["devices"], json!(["aa:bb:cc:00:00:01"]));
}

#[tokio::test]
#[ignore = "needs redis-server: cargo xtask cluster"]
async fn the_cluster_limit_refuses_one_more_session_whichever_instance_it_reaches() {
    let redis = Redis::start();
    let env = [("VOXGATE_CLUSTER_MAX_SESSIONS", "2")];
    let a = Instance::start(&redis, "a", &env);
    let b = Instance::start(&redis, "b", &env);
    let first = device(a.addr, "aa:00:00:00:00:01").await.unwrap();
    let _second = device(b.addr, "aa:00:00:00:00:02").await.unwrap();
    for addr in [a.addr, b.addr] {
        assert_eq!(device(addr, "aa:00:00:00:00:03").await.err(), Some(503));
    }
    let (_, cluster) = http(a.addr, "GET", "/admin/cluster", None).await;
    assert_eq!(cluster["sessions"], 2, "{cluster}");
    // A session that ends gives its place back.
    drop(first);
    assert!(
        eventually(WAIT, || async {
            device(b.addr, "aa:00:00:00:00:03").await.is_ok()
        })
        .await,
        "a place came free"
    );
}

#[tokio::test]
#[ignore = "needs redis-server: cargo xtask cluster"]
async fn a_dead_instances_devices_leave_the_directory_within_the_lease() {
    let redis = Redis::start();
    let env = [("VOXGATE_CLUSTER_LEASE_MS", "1500")];
    let a = Instance::start(&redis, "a", &env);
    let b = Instance::start(&redis, "b", &env);
    let mut ws = device(b.addr, "aa:00:00:00:00:09").await.unwrap();
    let key = "voxgate:dir:xiaozhi:aa:00:00:00:00:09";
    assert_eq!(redis_get(&redis, key).await.as_deref(), Some("b"));
    let killed = Instant::now();
    b.kill();
    assert!(
        next_json(&mut ws).await.is_none(),
        "the device lost its server"
    );
    assert!(
        eventually(Duration::from_secs(3), || async {
            redis_get(&redis, key).await.is_none()
        })
        .await,
        "the entry expires with its lease"
    );
    assert!(killed.elapsed() <= Duration::from_millis(1500 + 500));
    // The device reconnects to the surviving instance and is reachable there.
    let mut ws = device(a.addr, "aa:00:00:00:00:09").await.unwrap();
    assert_eq!(redis_get(&redis, key).await.as_deref(), Some("a"));
    let (status, body) = http(
        a.addr,
        "POST",
        "/admin/xiaozhi/devices/aa:00:00:00:00:09/push",
        Some(&json!({"type": "system", "command": "reboot"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(next_json(&mut ws).await.unwrap()["command"], "reboot");
}

#[tokio::test]
#[ignore = "needs redis-server: cargo xtask cluster"]
async fn sessions_outlive_a_redis_restart_and_routing_comes_back() {
    let mut redis = Redis::start();
    let env = [("VOXGATE_CLUSTER_LEASE_MS", "1500")];
    let a = Instance::start(&redis, "a", &env);
    let b = Instance::start(&redis, "b", &env);
    let mut ws = device(b.addr, "aa:00:00:00:00:42").await.unwrap();
    let push = json!({"type": "alert", "status": "Info", "message": "hello", "emotion": "happy"});
    let path = "/admin/xiaozhi/devices/aa:00:00:00:00:42/push";

    redis.stop();
    // Cross-instance requests report the outage; the device's own session goes on.
    let (status, body) = http(a.addr, "POST", path, Some(&push)).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"], "cluster_unavailable");
    let (status, _) = http(b.addr, "POST", path, Some(&push)).await;
    assert_eq!(status, 200, "a push on the holding instance needs no Redis");
    assert_eq!(next_json(&mut ws).await.unwrap()["type"], "alert");
    ws.send(Message::Text(
        json!({"type": "listen", "state": "detect", "text": "what time is it"})
            .to_string()
            .into(),
    ))
    .await
    .unwrap();
    let mut answered = false;
    while let Some(m) = next_json(&mut ws).await {
        if m["type"] == "tts" && m["state"] == "stop" {
            answered = true;
            break;
        }
    }
    assert!(answered, "a turn while Redis is down");

    // An empty Redis comes back: the holder re-creates its entry, routing works again.
    redis.restart();
    assert!(
        eventually(Duration::from_secs(8), || async {
            http(a.addr, "POST", path, Some(&push)).await.0 == 200
        })
        .await,
        "routing recovers"
    );
    assert_eq!(next_json(&mut ws).await.unwrap()["type"], "alert");
}

#[tokio::test]
#[ignore = "needs redis-server: cargo xtask cluster"]
async fn a_perception_event_published_on_one_instance_is_read_on_another() {
    let redis = Redis::start();
    let a = Instance::start(&redis, "a", &[]);
    let b = Instance::start(&redis, "b", &[]);
    // Both readers are at the stream's end once `/admin/cluster` says Redis is up.
    for i in [&a, &b] {
        assert!(
            eventually(WAIT, || async {
                http(i.addr, "GET", "/admin/cluster", None).await.1["redis"] == "up"
            })
            .await
        );
    }
    let event = json!({"name": "face_detected", "device_id": "cam-1", "data": {"who": "ada"}});
    let (status, body) = http(a.addr, "POST", "/api/perception/event", Some(&event)).await;
    assert_eq!(status, 200, "{body}");
    let deadline = Instant::now() + WAIT;
    let state = loop {
        let (status, body) = http(b.addr, "GET", "/admin/perception/cam-1", None).await;
        if status == 200 {
            break body;
        }
        assert!(Instant::now() < deadline, "the event reached instance b");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let text = state.to_string();
    assert!(
        text.contains("face_detected") && text.contains("ada"),
        "{state}"
    );
    // And it is not echoed back to the instance that published it.
    let (_, on_a) = http(a.addr, "GET", "/admin/perception/cam-1", None).await;
    assert!(!on_a.to_string().contains("\"instance\""), "{on_a}");
}

/// A Retell socket for `call_id` on `addr` (the frames the server sends, as JSON).
async fn retell(addr: SocketAddr, call_id: &str) -> Ws {
    let (ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/llm-websocket/{call_id}"))
        .await
        .unwrap();
    ws
}

/// Reads frames until `done` holds for one; every frame read, in order.
async fn retell_until(ws: &mut Ws, done: impl Fn(&Value) -> bool) -> Vec<Value> {
    let mut seen = Vec::new();
    loop {
        let Some(v) = next_json(ws).await else {
            panic!("the socket ended before the awaited frame: {seen:?}")
        };
        let stop = done(&v);
        seen.push(v);
        if stop {
            return seen;
        }
    }
}

#[tokio::test]
#[ignore = "needs redis-server: cargo xtask cluster"]
async fn a_retell_call_whose_socket_moves_resumes_on_the_other_instance() {
    use voxgate_test_support::fake_providers::{FakeDelays, FakeProviders};
    let redis = Redis::start();
    // The model takes 1.5 s to start answering: the request is still owed when the socket moves.
    let fakes = FakeProviders::start(FakeDelays {
        llm_first_token: Duration::from_millis(1500),
        ..FakeDelays::default()
    })
    .await
    .unwrap();
    let env = [("VOXGATE_LLM_BASE_URL", fakes.base_url())];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let a = Instance::start(&redis, "a", &env);
    let b = Instance::start(&redis, "b", &env);

    let mut ws = retell(a.addr, "call-7").await;
    let begun = retell_until(&mut ws, |v| {
        v["response_id"] == 0 && v["content_complete"] == true
    })
    .await;
    assert_eq!(begun[0]["response_type"], "config", "{begun:?}");
    let question = "What is the weather in Oslo?";
    ws.send(Message::Text(
        json!({"interaction_type": "response_required", "response_id": 1,
               "transcript": [{"role": "user", "content": question}]})
        .to_string()
        .into(),
    ))
    .await
    .unwrap();
    // Instance a saved the turn; the socket drops before the answer.
    tokio::time::sleep(Duration::from_millis(300)).await;
    ws.close(None).await.unwrap();
    drop(ws);

    let mut ws = retell(b.addr, "call-7").await;
    let resumed = retell_until(&mut ws, |v| {
        v["response_id"] == 1 && v["content_complete"] == true
    })
    .await;
    assert_eq!(resumed[0]["response_type"], "config");
    assert!(
        resumed.iter().all(|v| v["response_id"] != 0),
        "no second begin message: {resumed:?}"
    );
    let said: String = resumed
        .iter()
        .filter(|v| v["response_id"] == 1)
        .filter_map(|v| v["content"].as_str())
        .collect();
    assert!(!said.is_empty(), "{resumed:?}");
    // Instance b asked its model with the transcript instance a had.
    let messages = fakes.last_llm_messages().unwrap().to_string();
    assert!(messages.contains(question), "{messages}");

    // An operator's interrupt sent to instance a reaches the socket on b.
    let (status, body) = http(
        a.addr,
        "POST",
        "/retell/calls/call-7/interrupt",
        Some(&json!({"content": "Please hold for a moment."})),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let interrupt = retell_until(&mut ws, |v| v["response_type"] == "agent_interrupt").await;
    let last = interrupt.last().unwrap();
    assert_eq!(last["content"], "Please hold for a moment.");
    assert_eq!(last["interrupt_id"], body["interrupt_id"]);
    let (status, _) = http(
        a.addr,
        "POST",
        "/retell/calls/no-such-call/interrupt",
        Some(&json!({"content": "x"})),
    )
    .await;
    assert_eq!(status, 404);
}

/// Plays an MCP server connected to `addr`'s `/mcp` offering one `weather` tool, answering
/// calls with "sunny in <city>" until the socket closes.
async fn weather_mcp_server(addr: SocketAddr) -> tokio::task::JoinHandle<Vec<Value>> {
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/mcp?token=t1"))
        .await
        .unwrap();
    tokio::spawn(async move {
        let mut calls = Vec::new();
        while let Some(m) = next_json(&mut ws).await {
            let reply = |result: Value| json!({"jsonrpc": "2.0", "id": m["id"], "result": result});
            let answer = match m["method"].as_str() {
                Some("initialize") => reply(json!({"protocolVersion": "2024-11-05",
                    "capabilities": {"tools": {}}, "serverInfo": {"name": "weather", "version": "1"}})),
                Some("tools/list") => reply(json!({"tools": [{"name": "weather",
                    "description": "The weather in a city",
                    "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}},
                                    "required": ["city"]}}]})),
                Some("tools/call") => {
                    calls.push(m["params"].clone());
                    let city = m["params"]["arguments"]["city"].as_str().unwrap_or("?");
                    reply(
                        json!({"content": [{"type": "text", "text": format!("sunny in {city}")}]}),
                    )
                }
                _ => continue,
            };
            ws.send(Message::Text(answer.to_string().into()))
                .await
                .unwrap();
        }
        calls
    })
}

#[tokio::test]
#[ignore = "needs redis-server: cargo xtask cluster"]
async fn an_mcp_tool_connected_to_one_instance_is_usable_from_another() {
    let redis = Redis::start();
    let env = [("VOXGATE_CLUSTER_LEASE_MS", "1500")];
    let a = Instance::start(&redis, "a", &env);
    let b = Instance::start(&redis, "b", &env);
    let server = weather_mcp_server(a.addr).await;
    // Instance b lists the tool, with the instance that has it.
    let deadline = Instant::now() + WAIT;
    loop {
        let (_, tools) = http(b.addr, "GET", "/admin/mcp/tools", None).await;
        if tools.to_string().contains("\"weather\"") {
            break;
        }
        assert!(Instant::now() < deadline, "b never saw the tool: {tools}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let call = json!({"name": "weather", "arguments": {"city": "Oslo"}});
    let (status, body) = http(b.addr, "POST", "/admin/mcp/call", Some(&call)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["result"]["content"][0]["text"], "sunny in Oslo",
        "{body}"
    );
    // The schema is checked on the calling instance, as for a local tool.
    let bad = json!({"name": "weather", "arguments": {"town": "Oslo"}});
    let (status, _) = http(b.addr, "POST", "/admin/mcp/call", Some(&bad)).await;
    assert_eq!(status, 400);
    // The MCP server's instance goes away: its tools leave the others.
    a.kill();
    let calls = server.await.unwrap();
    assert_eq!(calls.len(), 1, "{calls:?}");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (_, tools) = http(b.addr, "GET", "/admin/mcp/tools", None).await;
        if !tools.to_string().contains("\"weather\"") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the dead instance's tool stayed: {tools}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
#[ignore = "needs redis-server: cargo xtask cluster"]
async fn a_bridge_conversation_keeps_one_history_whichever_instance_gets_its_messages() {
    let redis = Redis::start();
    let a = Instance::start(&redis, "a", &[]);
    let b = Instance::start(&redis, "b", &[]);
    let say = |content: &str| json!({"content": content, "channel": "web", "session_id": "s1"});
    let (status, first) = http(a.addr, "POST", "/api/message", Some(&say("hello there"))).await;
    assert_eq!(status, 200, "{first}");
    // The next message of the conversation reaches instance b, which hands it to a.
    let (status, second) = http(b.addr, "POST", "/api/message", Some(&say("and again"))).await;
    assert_eq!(status, 200, "{second}");
    let (_, on_a) = http(a.addr, "GET", "/admin/conversations", None).await;
    let (_, on_b) = http(b.addr, "GET", "/admin/conversations", None).await;
    assert!(on_a.to_string().contains("web:s1"), "{on_a}");
    assert!(
        !on_b.to_string().contains("web:s1"),
        "b keeps no copy: {on_b}"
    );
    assert!(on_a.to_string().contains("\"turns\":2"), "{on_a}");
    // A bad message is refused the same way through either.
    let (status, body) = http(
        b.addr,
        "POST",
        "/api/message",
        Some(&json!({"channel": "web", "session_id": "s1"})),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("bad_request")),
        "{body}"
    );
}

/// Counts of instance `addr`'s Redis operations by name (`/admin/cluster`).
async fn redis_ops(addr: SocketAddr) -> Value {
    http(addr, "GET", "/admin/cluster", None).await.1["redis_ops"].clone()
}

fn op_count(ops: &Value, name: &str) -> u64 {
    ops[name]["count"].as_u64().unwrap_or(0)
}

/// The added figures' percentiles of `samples` (ms): p50 and p99.
fn pcts(samples: &mut [f64]) -> (f64, f64) {
    samples.sort_by(f64::total_cmp);
    let at = |p: f64| {
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let i = ((samples.len() as f64 - 1.0) * p).round() as usize;
        samples[i]
    };
    (at(0.5), at(0.99))
}

/// Not a check but a measurement (`cargo xtask cluster` prints it): Redis operations per turn
/// of each door and what they add to a turn. Counts are asserted (they are exact); times only
/// printed.
#[tokio::test]
#[ignore = "needs redis-server: cargo xtask cluster"]
async fn figures_redis_operations_per_turn() {
    let turns: u64 = std::env::var("VOXGATE_CLUSTER_FIGURE_TURNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let redis = Redis::start();
    let env = [("VOXGATE_CLUSTER_MAX_SESSIONS", "1000")];
    let a = Instance::start(&redis, "a", &env);
    let b = Instance::start(&redis, "b", &env);
    let mut rows = Vec::new();

    // Xiaozhi: text turns on one device (their replies are spoken at real time, so a few: the
    // count is exact either way).
    let before = redis_ops(b.addr).await;
    let mut ws = device(b.addr, "aa:00:00:00:01:00").await.unwrap();
    let opened = redis_ops(b.addr).await;
    let xiaozhi_turns = turns.min(10);
    for _ in 0..xiaozhi_turns {
        ws.send(Message::Text(
            json!({"type": "listen", "state": "detect", "text": "tell me a joke"})
                .to_string()
                .into(),
        ))
        .await
        .unwrap();
        while let Some(m) = next_json(&mut ws).await {
            if m["type"] == "tts" && m["state"] == "stop" {
                break;
            }
        }
    }
    let after = redis_ops(b.addr).await;
    let per_open: u64 = ["admit", "claim"]
        .iter()
        .map(|o| op_count(&opened, o) - op_count(&before, o))
        .sum();
    let in_turns: u64 = [
        "admit",
        "claim",
        "holder",
        "release",
        "retell_save",
        "publish",
    ]
    .iter()
    .map(|o| op_count(&after, o) - op_count(&opened, o))
    .sum();
    assert_eq!(
        per_open, 2,
        "a session open: one admission, one directory claim"
    );
    assert_eq!(in_turns, 0, "no Redis on a Xiaozhi turn");
    rows.push(format!(
        "| xiaozhi turn ({xiaozhi_turns}) | 0 (2 at session open: `admit` script, directory `SET`) | n/a | none |"
    ));
    drop(ws);

    // Retell: a call's turns on b.
    let mut call = retell(b.addr, "figures-call").await;
    retell_until(&mut call, |v| {
        v["response_id"] == 0 && v["content_complete"] == true
    })
    .await;
    let before = redis_ops(b.addr).await;
    for id in 1..=turns {
        call.send(Message::Text(
            json!({"interaction_type": "response_required", "response_id": id,
                   "transcript": [{"role": "user", "content": format!("question {id}")}]})
            .to_string()
            .into(),
        ))
        .await
        .unwrap();
        retell_until(&mut call, |v| {
            v["response_id"] == id && v["content_complete"] == true
        })
        .await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = redis_ops(b.addr).await;
    let saves = op_count(&after, "retell_save") - op_count(&before, "retell_save");
    #[allow(clippy::cast_precision_loss)]
    let per_turn = saves as f64 / turns as f64;
    assert!(
        (1.0..=2.0).contains(&per_turn),
        "saves per turn: {per_turn}"
    );
    rows.push(format!(
        "| retell turn ({turns}) | {per_turn:.1} (`SET` of the call's state) | p50 {} / p99 {} µs | none: written by the call's saver task, off the turn path |",
        after["retell_save"]["p50_us"], after["retell_save"]["p99_us"]
    ));
    drop(call);

    // Bridge: the same conversation's messages sent to its holder (b) and through a.
    let say =
        |n: u64| json!({"content": format!("message {n}"), "channel": "fig", "session_id": "s"});
    http(b.addr, "POST", "/api/message", Some(&say(0))).await;
    let (mut direct, mut routed) = (Vec::new(), Vec::new());
    let before = redis_ops(a.addr).await;
    for n in 0..turns {
        let t = Instant::now();
        assert_eq!(
            http(b.addr, "POST", "/api/message", Some(&say(n))).await.0,
            200
        );
        direct.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = Instant::now();
        assert_eq!(
            http(a.addr, "POST", "/api/message", Some(&say(n))).await.0,
            200
        );
        routed.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let after = redis_ops(a.addr).await;
    let ops: u64 = ["holder", "publish"]
        .iter()
        .map(|o| op_count(&after, o) - op_count(&before, o))
        .sum();
    let (d50, d99) = pcts(&mut direct);
    let (r50, r99) = pcts(&mut routed);
    assert_eq!(
        ops,
        2 * turns,
        "the holder script and a publish per routed message"
    );
    rows.push(format!(
        "| bridge message, routed ({turns}) | 2 on the caller (the holder script: `GET` + `PUBSUB NUMSUB`; `PUBLISH`) + 1 `PUBLISH` reply | direct p50 {d50:.2} / p99 {d99:.2} ms, routed p50 {r50:.2} / p99 {r99:.2} ms | p50 {:.2} / p99 {:.2} ms |",
        r50 - d50, r99 - d99
    ));
    let ops_a = redis_ops(a.addr).await;
    println!("\nRedis operations per turn (loopback Redis):\n");
    println!("| turn | Redis operations | their latency | added to the turn |");
    println!("|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
    println!("\nOperation latencies on instance a (µs): {ops_a}");
}

/// nginx (Debian's package) running `deploy/nginx.conf` in front of `upstreams`, killed when
/// dropped.
struct Nginx {
    addr: SocketAddr,
    child: Child,
}

impl Nginx {
    fn start(upstreams: [SocketAddr; 2]) -> Self {
        let free = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        };
        let (port, grpc_port) = (free(), free());
        let dir = std::env::temp_dir().join(format!("voxgate-nginx-{port}"));
        std::fs::create_dir_all(&dir).unwrap();
        let sample = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/nginx.conf"),
        )
        .unwrap();
        let snippet = sample
            .replace("server voxgate-a:8080", &format!("server {}", upstreams[0]))
            .replace("server voxgate-b:8080", &format!("server {}", upstreams[1]))
            .replace("listen 80;", &format!("listen 127.0.0.1:{port};"))
            .replace(
                "listen 8090 http2;",
                &format!("listen 127.0.0.1:{grpc_port} http2;"),
            );
        assert!(
            !snippet.contains("voxgate-a:8080"),
            "the sample's upstreams were replaced"
        );
        let d = dir.display();
        let conf = format!(
            "worker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\ndaemon off;\n\
             events {{ worker_connections 512; }}\n\
             http {{\n access_log off;\n client_body_temp_path {d}/body;\n proxy_temp_path {d}/proxy;\n\
             fastcgi_temp_path {d}/fastcgi;\n uwsgi_temp_path {d}/uwsgi;\n scgi_temp_path {d}/scgi;\n\
             {snippet}\n}}\n"
        );
        std::fs::write(dir.join("nginx.conf"), conf).unwrap();
        let bin = std::env::var("VOXGATE_TEST_NGINX").unwrap_or("nginx".into());
        // Its own process group: the master's workers are stopped with it (a SIGKILL to the
        // master alone leaves a worker running after the test).
        let child = Command::new(&bin)
            .arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(dir.join("nginx.conf"))
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start {bin} ({e}): install it with `cargo xtask cluster`")
            });
        let deadline = Instant::now() + WAIT;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "nginx did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            child,
        }
    }
}

impl Drop for Nginx {
    /// SIGTERM (nginx's fast shutdown: the master stops its workers, then itself), and if the
    /// master is not gone within 5 s, SIGKILL to the whole process group.
    fn drop(&mut self) {
        let pid = self.child.id().to_string();
        let signal = |args: &[&str]| {
            let _ = Command::new("kill")
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        };
        signal(&["-TERM", &pid]);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                // Workers exit with their master; the group kill below catches a stray one.
                signal(&["-KILL", "--", &format!("-{pid}")]);
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        signal(&["-KILL", "--", &format!("-{pid}")]);
        let _ = self.child.wait();
    }
}

#[tokio::test]
#[ignore = "needs redis-server and nginx: cargo xtask cluster"]
async fn the_sample_nginx_configuration_carries_sessions_and_drains_an_instance() {
    let redis = Redis::start();
    let admin = "admin-token-for-the-test";
    let env = [
        ("VOXGATE_ADMIN_TOKENS", admin),
        ("VOXGATE_TRUSTED_PROXIES", "127.0.0.1"),
        ("VOXGATE_SHUTDOWN_GRACE_SECS", "3"),
    ];
    let a = Instance::start(&redis, "a", &env);
    let b = Instance::start(&redis, "b", &env);
    let lb = Nginx::start([a.addr, b.addr]);
    assert_eq!(http(lb.addr, "GET", "/lb-health", None).await.0, 200);
    let (status, health) = http(lb.addr, "GET", "/health", None).await;
    assert_eq!(status, 200, "{health}");
    assert_eq!(health["cluster"]["redis"], "up", "{health}");

    // A device through the proxy; a push through the proxy reaches it (with the admin token:
    // requests through a proxy are not local).
    let mut ws = device(lb.addr, "aa:00:00:00:0b:01").await.unwrap();
    let path = "/admin/xiaozhi/devices/aa:00:00:00:0b:01/push";
    let alert =
        json!({"type": "alert", "status": "Info", "message": "via nginx", "emotion": "happy"});
    assert_eq!(http(lb.addr, "POST", path, Some(&alert)).await.0, 401);
    let (status, pushed) = http_as(lb.addr, "POST", path, Some(&alert), Some(admin)).await;
    assert_eq!(status, 200, "{pushed}");
    assert_eq!(next_json(&mut ws).await.unwrap()["message"], "via nginx");
    let holder = pushed["instance"].as_str().unwrap().to_owned();
    let (draining, other) = if holder == "a" { (&a, &b) } else { (&b, &a) };

    // Drain the device's instance: it stops accepting, so new sessions through the proxy land
    // on the other instance; its idle session is closed at once (1001: a reply in progress
    // would finish first, within the grace period) and the device comes back through the
    // proxy, on the other one.
    draining.terminate();
    let closed = Instant::now();
    assert!(
        next_json(&mut ws).await.is_none(),
        "the idle session is closed"
    );
    assert!(closed.elapsed() < Duration::from_secs(3));
    for i in 0..4 {
        let id = format!("aa:00:00:00:0c:0{i}");
        let _new = device(lb.addr, &id)
            .await
            .expect("a new session during the drain");
        let (_, on_other) = http_as(
            other.addr,
            "GET",
            "/admin/xiaozhi/devices",
            None,
            Some(admin),
        )
        .await;
        assert!(on_other.to_string().contains(&id), "{on_other}");
    }
    let mut ws = device(lb.addr, "aa:00:00:00:0b:01").await.unwrap();
    let (status, pushed) = http_as(lb.addr, "POST", path, Some(&alert), Some(admin)).await;
    assert_eq!(status, 200, "{pushed}");
    assert_ne!(pushed["instance"].as_str(), Some(holder.as_str()));
    assert_eq!(next_json(&mut ws).await.unwrap()["type"], "alert");
}

#[tokio::test]
#[ignore = "needs redis-server: cargo xtask cluster"]
async fn instances_started_without_redis_serve_and_join_when_it_comes() {
    let mut redis = Redis::start();
    redis.stop();
    let env = [
        ("VOXGATE_CLUSTER_LEASE_MS", "1500"),
        ("VOXGATE_CLUSTER_MAX_SESSIONS", "100"),
    ];
    let a = Instance::start(&redis, "a", &env);
    let b = Instance::start(&redis, "b", &env);
    let (_, health) = http(a.addr, "GET", "/health", None).await;
    assert_eq!(health["cluster"]["redis"], "down", "{health}");
    // Sessions are admitted on the instances' own limits, at once.
    let started = Instant::now();
    let mut ws = device(b.addr, "aa:00:00:00:0d:01").await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    let path = "/admin/xiaozhi/devices/aa:00:00:00:0d:01/push";
    let push = json!({"type": "system", "command": "reboot"});
    assert_eq!(http(a.addr, "POST", path, Some(&push)).await.0, 503);
    redis.restart();
    assert!(
        eventually(Duration::from_secs(8), || async {
            http(a.addr, "POST", path, Some(&push)).await.0 == 200
        })
        .await,
        "the cluster forms once Redis answers"
    );
    assert_eq!(next_json(&mut ws).await.unwrap()["command"], "reboot");
    let (_, cluster) = http(a.addr, "GET", "/admin/cluster", None).await;
    assert_eq!(
        cluster["sessions"], 1,
        "the session admitted while Redis was down counts: {cluster}"
    );
}
