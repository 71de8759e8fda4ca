//! A tiny ACP agent (protocol version 1) written from the spec, so the ACP brain is tested
//! without Python. It reads newline-delimited JSON-RPC on stdin and writes it on stdout; the
//! behaviour is chosen by the prompt text, the same as `echo_agent.py` (the Python SDK agent):
//!
//! * `whoami`: says `session=<id> cwd=<cwd> pid=<pid> turn=<n> env=<VOXGATE_ACP_TEST_ENV>`.
//! * `slow <n>`: streams `tick0 tick1 ...` every 30 ms; honours `session/cancel`.
//! * `perm <kind> <title>`: reports a `tool_call`, asks permission (allow_once `allow`,
//!   allow_always `always`, reject_once `reject`) and says `outcome=<optionId|cancelled>`.
//! * `lateperm`: streams until cancelled, then asks permission and remembers the outcome.
//! * `last`: says `last=<outcome of the last permission request> cancels=<n>`.
//! * `crash`: streams `dying` and exits with status 3.
//! * `garbage`: writes non-JSON and non-JSON-RPC lines and calls `fs/read_text_file`, then
//!   says `fs=<error code>`.
//! * `recall`: says `recall=<the context blocks received so far>` (`recall=none` without),
//!   its lines joined with ` | `.
//! * anything else: `You said: <text>`, word by word.
//!
//! The command is the prompt's last text block; earlier blocks are context (voxgate sends the
//! conversation so far there when this process replaces an earlier one).
#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::needless_pass_by_value
)]

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};

#[derive(Default)]
struct State {
    next_id: i64,
    pending: HashMap<i64, oneshot::Sender<Value>>,
    cancels: HashMap<String, watch::Sender<bool>>,
    turns: u64,
    cancel_count: u64,
    last_permission: String,
    cwd: String,
    /// The context blocks of every prompt so far.
    context: Vec<String>,
}

#[derive(Clone)]
struct Agent {
    out: mpsc::UnboundedSender<String>,
    state: Arc<Mutex<State>>,
}

impl Agent {
    fn send(&self, v: Value) {
        let _ = self.out.send(v.to_string());
    }

    fn chunk(&self, session: &str, text: &str) {
        self.send(
            json!({"jsonrpc": "2.0", "method": "session/update", "params": {
                "sessionId": session,
                "update": {"sessionUpdate": "agent_message_chunk",
                           "content": {"type": "text", "text": text}},
            }}),
        );
    }

    async fn request(&self, method: &str, params: Value) -> Value {
        let (tx, rx) = oneshot::channel();
        let id = {
            let mut s = self.state.lock().unwrap();
            s.next_id += 1;
            let id = s.next_id;
            s.pending.insert(id, tx);
            id
        };
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        rx.await.unwrap_or(Value::Null)
    }

    async fn ask_permission(&self, session: &str, call_id: &str) -> String {
        let reply = self
            .request(
                "session/request_permission",
                json!({
                    "sessionId": session,
                    "toolCall": {"toolCallId": call_id},
                    "options": [
                        {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                        {"optionId": "always", "name": "Always allow", "kind": "allow_always"},
                        {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
                    ],
                }),
            )
            .await;
        let outcome = &reply["result"]["outcome"];
        let text = match outcome["outcome"].as_str() {
            Some("selected") => outcome["optionId"].as_str().unwrap_or("?").to_owned(),
            Some("cancelled") => "cancelled".to_owned(),
            _ => format!("bad reply {reply}"),
        };
        self.state.lock().unwrap().last_permission = text.clone();
        text
    }

    /// Runs one prompt; returns the stop reason.
    async fn prompt(
        &self,
        session: String,
        text: String,
        mut cancel: watch::Receiver<bool>,
    ) -> &'static str {
        let turn = {
            let mut s = self.state.lock().unwrap();
            s.turns += 1;
            s.turns
        };
        let mut words = text.split_whitespace();
        match words.next().unwrap_or("") {
            "whoami" => {
                let (cwd, _) = (self.state.lock().unwrap().cwd.clone(), ());
                let env = std::env::var("VOXGATE_ACP_TEST_ENV").unwrap_or_default();
                self.chunk(
                    &session,
                    &format!(
                        "session={session} cwd={cwd} pid={} turn={turn} env={env}",
                        std::process::id()
                    ),
                );
            }
            "slow" => {
                let n: u32 = words.next().and_then(|w| w.parse().ok()).unwrap_or(100);
                for i in 0..n {
                    self.chunk(&session, &format!("tick{i} "));
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_millis(30)) => {}
                        _ = cancel.wait_for(|c| *c) => return "cancelled",
                    }
                }
            }
            "perm" => {
                let kind = words.next().unwrap_or("other").to_owned();
                let title: Vec<&str> = words.collect();
                let call_id = format!("call_{turn}");
                self.send(
                    json!({"jsonrpc": "2.0", "method": "session/update", "params": {
                        "sessionId": session,
                        "update": {"sessionUpdate": "tool_call", "toolCallId": call_id,
                                   "title": title.join(" "), "kind": kind, "status": "pending"},
                    }}),
                );
                let outcome = self.ask_permission(&session, &call_id).await;
                self.chunk(&session, &format!("outcome={outcome}"));
            }
            "lateperm" => {
                self.chunk(&session, "waiting ");
                let _ = cancel.wait_for(|c| *c).await;
                self.ask_permission(&session, "late_call").await;
                return "cancelled";
            }
            "recall" => {
                let context = self.state.lock().unwrap().context.join("\n");
                let lines: Vec<&str> = context.lines().filter(|l| !l.trim().is_empty()).collect();
                let text = if lines.is_empty() {
                    "recall=none".to_owned()
                } else {
                    format!("recall={}", lines.join(" | "))
                };
                self.chunk(&session, &text);
            }
            "last" => {
                let s = self.state.lock().unwrap();
                let text = format!("last={} cancels={}", s.last_permission, s.cancel_count);
                drop(s);
                self.chunk(&session, &text);
            }
            "crash" => {
                self.chunk(&session, "dying");
                tokio::time::sleep(Duration::from_millis(50)).await;
                std::process::exit(3);
            }
            "garbage" => {
                let _ = self.out.send("this line is not JSON".into());
                let _ = self.out.send("{\"broken\": ".into());
                let _ = self
                    .out
                    .send("{\"valid\": \"json but not json-rpc\"}".into());
                let _ = self.out.send("[1, 2]".into());
                self.send(json!({"jsonrpc": "2.0", "method": "x/unknown", "params": {}}));
                let reply = self
                    .request(
                        "fs/read_text_file",
                        json!({"sessionId": session, "path": "/etc/passwd"}),
                    )
                    .await;
                let code = reply["error"]["code"].as_i64().unwrap_or(0);
                self.chunk(&session, &format!("fs={code}"));
            }
            _ => {
                let mut first = true;
                for w in format!("You said: {text}").split_inclusive(' ') {
                    if !first {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    first = false;
                    self.chunk(&session, w);
                }
            }
        }
        if *cancel.borrow() {
            "cancelled"
        } else {
            "end_turn"
        }
    }

    fn handle(&self, msg: Value) {
        let id = msg.get("id").cloned();
        let method = msg.get("method").and_then(Value::as_str).map(str::to_owned);
        let params = msg.get("params").cloned().unwrap_or(Value::Null);
        let Some(method) = method else {
            // A response to one of our requests.
            let n = id.as_ref().and_then(Value::as_i64);
            let pending = n.and_then(|n| self.state.lock().unwrap().pending.remove(&n));
            if let Some(tx) = pending {
                let _ = tx.send(msg);
            }
            return;
        };
        let reply_id = id.clone().unwrap_or(Value::Null);
        let reply = move |result: Value| json!({"jsonrpc": "2.0", "id": reply_id.clone(), "result": result});
        match method.as_str() {
            "initialize" => {
                assert_eq!(params["protocolVersion"], 1, "client protocol version");
                assert!(params["clientCapabilities"].is_object());
                assert_eq!(params["clientInfo"]["name"], "voxgate");
                self.send(reply(json!({
                    "protocolVersion": 1,
                    "agentCapabilities": {"loadSession": false},
                    "agentInfo": {"name": "rust-test-agent", "version": "0.0.1"},
                    "authMethods": [],
                })));
            }
            "session/new" => {
                let cwd = params["cwd"].as_str().unwrap_or("").to_owned();
                assert!(cwd.starts_with('/'), "cwd must be absolute: {cwd}");
                assert_eq!(params["mcpServers"], json!([]));
                let sid = {
                    let mut s = self.state.lock().unwrap();
                    s.cwd = cwd;
                    format!("sess_{}", s.cancels.len() + 1)
                };
                let (tx, _) = watch::channel(false);
                self.state.lock().unwrap().cancels.insert(sid.clone(), tx);
                self.send(reply(json!({"sessionId": sid})));
            }
            "session/prompt" => {
                let sid = params["sessionId"].as_str().unwrap_or("").to_owned();
                let mut blocks: Vec<String> = params["prompt"]
                    .as_array()
                    .map(|blocks| {
                        blocks
                            .iter()
                            .filter_map(|b| b["text"].as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default();
                let text = blocks.pop().unwrap_or_default();
                let cancel = {
                    let mut s = self.state.lock().unwrap();
                    s.context.extend(blocks);
                    let (tx, rx) = watch::channel(false);
                    s.cancels.insert(sid.clone(), tx);
                    rx
                };
                let agent = self.clone();
                tokio::spawn(async move {
                    let stop = agent.prompt(sid, text, cancel).await;
                    agent.send(reply(json!({"stopReason": stop})));
                });
            }
            "session/cancel" => {
                let sid = params["sessionId"].as_str().unwrap_or("");
                let mut s = self.state.lock().unwrap();
                s.cancel_count += 1;
                if let Some(tx) = s.cancels.get(sid) {
                    let _ = tx.send(true);
                }
            }
            _ if id.is_some() => self.send(json!({"jsonrpc": "2.0", "id": id,
                "error": {"code": -32601, "message": "method not found"}})),
            _ => {}
        }
    }
}

/// Serves ACP on this process's stdin and stdout until stdin closes. Plain threads do the
/// blocking standard I/O, so only tokio's runtime, sync and time features are needed.
/// Runs this process as the agent when it was started as one (`VOXGATE_ACP_TEST_AGENT` set)
/// and exits; otherwise returns at once. Every test binary that starts the agent calls this from
/// a `#[test]` it re-executes itself with.
pub fn main_if_started_as_agent() {
    if std::env::var_os("VOXGATE_ACP_TEST_AGENT").is_none() {
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // libtest has written `test acp_test_agent_main ... ` without a newline: end that line so
    // the first message stands on its own line (the brain skips the libtest lines).
    println!();
    rt.block_on(run());
    // Exit before libtest prints its summary on stdout.
    std::process::exit(0);
}

pub async fn run() {
    let (out, mut out_rx) = mpsc::unbounded_channel::<String>();
    let writer = tokio::spawn(async move {
        while let Some(line) = out_rx.recv().await {
            let mut stdout = std::io::stdout().lock();
            writeln!(stdout, "{line}").unwrap();
            stdout.flush().unwrap();
        }
    });
    let (in_tx, mut in_rx) = mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { return };
            if in_tx.send(line).is_err() {
                return;
            }
        }
    });
    let agent = Agent {
        out,
        state: Arc::default(),
    };
    while let Some(line) = in_rx.recv().await {
        match serde_json::from_str::<Value>(&line) {
            Ok(v) => agent.handle(v),
            Err(e) => eprintln!("rust test agent: bad line {line:?}: {e}"),
        }
    }
    drop(agent);
    let _ = writer.await;
}
