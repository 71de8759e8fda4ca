//! A Retell custom-LLM server built on `voxgate-retell` alone (plus tokio and
//! tokio-tungstenite): Retell connects to `ws://HOST/llm-websocket/{call_id}`, and the server
//! answers each `response_required` with a `response` streamed word by word. The crate's
//! `ResponseTracker` does the protocol's bookkeeping (the config, the begin message, pings,
//! which `response_id` is current); this program only moves frames and writes the answers.
//!
//! By default the program starts the server on 127.0.0.1 (any free port) and plays Retell's
//! side against it with the crate's `RetellDriver`, then stops:
//!
//! `cargo run -p voxgate-examples --example retell_server`
//!
//! With `--listen ADDR` it serves until Ctrl-C instead, for a real Retell agent whose Custom
//! LLM URL points at it (through a tunnel: Retell connects from the internet):
//!
//! `cargo run -p voxgate-examples --example retell_server -- --listen 127.0.0.1:8081`

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::StatusCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use voxgate_retell::{
    BeginMessage, Call, DriverConfig, DriverInput, DriverOutput, Generate, RequestKind,
    ResponseTracker, RetellDriver, RetellEvent, Role, ServerEvent, TrackerConfig, TrackerInput,
    TrackerOutput,
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What the agent says when the call starts (the begin message, `response_id` 0).
pub(crate) const GREETING: &str = "Hello, this is the example bakery. How can I help?";

/// How long the Retell side waits for the server before giving up.
const WAIT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// The server.

/// The agent's brain: a deterministic answer to the transcript so far. A real server would
/// stream a language model's output instead.
fn answer(request: &Generate) -> String {
    if request.kind == RequestKind::Reminder {
        return "Are you still there?".to_owned();
    }
    let last = request
        .transcript
        .iter()
        .rev()
        .find(|u| u.role == Role::User)
        .map_or("", |u| u.content.as_str());
    let lower = last.to_lowercase();
    if lower.contains("open") {
        "We open at seven and close at six, every day but Sunday.".to_owned()
    } else if lower.contains("bye") {
        "Goodbye, and thank you for calling!".to_owned()
    } else {
        format!("You said: {last}")
    }
}

/// Streams the answer to `request` as `response` chunks, the last one with
/// `content_complete`, at the pace of a model producing words.
async fn stream_answer(request: Generate, chunks: mpsc::Sender<ServerEvent>) {
    let text = answer(&request);
    let words: Vec<&str> = text.split_inclusive(' ').collect();
    for (i, word) in words.iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(15)).await;
        let complete = i + 1 == words.len();
        let chunk = voxgate_retell::Response::chunk(request.response_id, *word, complete);
        if chunks.send(ServerEvent::Response(chunk)).await.is_err() {
            return;
        }
    }
}

/// Waits until `deadline`, or forever without one.
async fn timer(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// One Retell socket, from the handshake to the close.
async fn serve_call(mut ws: WebSocketStream<TcpStream>, call_id: String) -> Result<(), BoxError> {
    let mut tracker = ResponseTracker::new(TrackerConfig {
        begin: BeginMessage::Immediately(GREETING.to_owned()),
        // Ask for pings and reconnects, and the call object (see `TrackerConfig::default`).
        ..TrackerConfig::default()
    });
    tracker.handle_input(Instant::now(), TrackerInput::Connected { call_id })?;
    let (chunks_tx, mut chunks) = mpsc::channel::<ServerEvent>(64);
    let mut generation: Option<JoinHandle<()>> = None;
    'call: loop {
        while let Some(output) = tracker.poll_output() {
            match output {
                TrackerOutput::Send(event) => ws.send(Message::text(event.to_json()?)).await?,
                TrackerOutput::Generate(request) => {
                    // A newer request supersedes the one being answered.
                    if let Some(old) = generation.take() {
                        old.abort();
                    }
                    println!(
                        "server: answering response {} ({:?})",
                        request.response_id, request.kind
                    );
                    generation = Some(tokio::spawn(stream_answer(request, chunks_tx.clone())));
                }
                TrackerOutput::Stop { response_id } => {
                    println!("server: response {response_id} is stale, stopping it");
                    if let Some(old) = generation.take() {
                        old.abort();
                    }
                }
                TrackerOutput::CallDetails(call) => {
                    println!(
                        "server: call {} from agent {} ({})",
                        call.call_id,
                        call.agent_id,
                        call.call_type.as_str()
                    );
                }
                TrackerOutput::RetellSilent => {
                    // Close with 1000 only: Retell then reconnects to the same call.
                    ws.close(Some(CloseFrame {
                        code: CloseCode::Normal,
                        reason: "no ping".into(),
                    }))
                    .await?;
                    break 'call;
                }
                // Transcript updates and unknown events need nothing here.
                _ => {}
            }
        }
        tokio::select! {
            frame = ws.next() => match frame {
                Some(Ok(Message::Text(text))) => match RetellEvent::from_json(&text) {
                    Ok(event) => {
                        tracker.handle_input(Instant::now(), TrackerInput::Received(event))?;
                    }
                    // A peer's bad frame is logged, never fatal.
                    Err(e) => eprintln!("server: ignoring a frame: {e}"),
                },
                // tungstenite answers pings and close frames itself; the stream ends after.
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.into()),
                None => break 'call,
            },
            Some(event) = chunks.recv() => {
                // Chunks of a response that went stale meanwhile are dropped by the tracker;
                // an error here would be a bug in this program, not the peer's fault.
                if let Err(e) = tracker.handle_input(Instant::now(), TrackerInput::Send(event)) {
                    eprintln!("server: {e}");
                }
            }
            () = timer(tracker.poll_timeout()) => tracker.handle_timeout(Instant::now()),
        }
    }
    if let Some(old) = generation.take() {
        old.abort();
    }
    // One tracker per call: a server that keeps it across sockets resumes after a
    // reconnect. This example ends the call with its socket.
    tracker.handle_input(Instant::now(), TrackerInput::Disconnected)?;
    Ok(())
}

/// The WebSocket handshake of a Retell connection, with the call id from its path
/// (`/llm-websocket/{call_id}`); other paths are refused with 404.
#[allow(
    clippy::result_large_err,
    reason = "the handshake callback's error type is tungstenite's"
)]
async fn accept_retell(stream: TcpStream) -> Option<(WebSocketStream<TcpStream>, String)> {
    let mut call_id = None;
    let handshake = tokio_tungstenite::accept_hdr_async(
        stream,
        |request: &Request, response: Response| -> Result<Response, ErrorResponse> {
            match request.uri().path().strip_prefix("/llm-websocket/") {
                Some(id) if !id.is_empty() && !id.contains('/') => {
                    call_id = Some(id.to_owned());
                    Ok(response)
                }
                _ => {
                    let mut refused =
                        ErrorResponse::new(Some("expected /llm-websocket/{call_id}".to_owned()));
                    *refused.status_mut() = StatusCode::NOT_FOUND;
                    Err(refused)
                }
            }
        },
    )
    .await;
    match (handshake, call_id) {
        (Ok(ws), Some(call_id)) => Some((ws, call_id)),
        (Err(e), _) => {
            eprintln!("server: handshake refused: {e}");
            None
        }
        (Ok(_), None) => None,
    }
}

/// Accepts Retell's connections on `listener` until the task is aborted; each call runs in a
/// task of its own, aborted with the server.
pub(crate) async fn serve(listener: TcpListener) {
    let mut calls = JoinSet::new();
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors, usually: give running calls a moment to end.
                eprintln!("server: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        calls.spawn(async move {
            let Some((ws, call_id)) = accept_retell(stream).await else {
                return;
            };
            if let Err(e) = serve_call(ws, call_id).await {
                eprintln!("server: call failed: {e}");
            }
        });
        // Reap finished calls so the set does not grow with every call.
        while calls.try_join_next().is_some() {}
    }
}

/// Binds `addr` and serves in a task; abort the task to stop the server.
pub(crate) async fn start_server(addr: &str) -> Result<(SocketAddr, JoinHandle<()>), BoxError> {
    let listener = TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    Ok((addr, tokio::spawn(serve(listener))))
}

// ---------------------------------------------------------------------------------------------
// Retell's side, for trying the server out.

/// Plays Retell against the custom-LLM server at `url`: waits for the begin message, says each
/// of `lines` in turn, waiting for the answer each time, and hangs up. Returns what the agent
/// said, by `response_id`.
pub(crate) async fn play_retell(url: &str, lines: &[&str]) -> Result<Vec<(u64, String)>, BoxError> {
    let (mut ws, _) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(url)).await??;
    let defaults = DriverConfig::default();
    let mut driver = RetellDriver::new(DriverConfig {
        // The call object Retell sends when the server asks for call details.
        call: Call {
            call_id: url.rsplit('/').next().unwrap_or_default().to_owned(),
            ..defaults.call
        },
        // This script answers at once; no reminders.
        reminder_trigger: None,
        ..defaults
    });
    driver.handle_input(Instant::now(), DriverInput::Connected);
    let mut lines = lines.iter();
    let mut spoken = Vec::new();
    let mut last_heard = Instant::now();
    loop {
        while let Some(output) = driver.poll_output() {
            match output {
                DriverOutput::Send(event) => {
                    // Transcripts grow with the call and pings come every two seconds: print
                    // what matters of them.
                    match &event {
                        RetellEvent::PingPong(_) => {}
                        RetellEvent::ResponseRequired(r) => println!(
                            "retell -> server: response_required (response_id {})",
                            r.response_id
                        ),
                        other => println!("retell -> server: {}", other.tag()),
                    }
                    ws.send(Message::text(event.to_json()?)).await?;
                }
                DriverOutput::AgentSpoke {
                    response_id,
                    content,
                } => {
                    println!("agent ({response_id}): {content}");
                    spoken.push((response_id, content));
                    // The begin message, or the answer to the newest request: the user's turn.
                    if driver.last_requested().is_none_or(|id| id == response_id) {
                        match lines.next() {
                            Some(line) => {
                                println!("user: {line}");
                                driver.handle_input(
                                    Instant::now(),
                                    DriverInput::UserSaid((*line).to_owned()),
                                );
                            }
                            None => {
                                hang_up(ws).await?;
                                return Ok(spoken);
                            }
                        }
                    }
                }
                DriverOutput::Violation(v) => {
                    return Err(format!("protocol violation: {v:?}").into());
                }
                DriverOutput::Close { .. }
                | DriverOutput::Reconnect { .. }
                | DriverOutput::CallEnded(_) => {
                    return Err(format!("the call broke off: {output:?}").into());
                }
                _ => {}
            }
        }
        if last_heard.elapsed() > WAIT {
            return Err("the server went quiet".into());
        }
        tokio::select! {
            frame = ws.next() => match frame {
                Some(Ok(Message::Text(text))) => {
                    last_heard = Instant::now();
                    let event = ServerEvent::from_json(&text)?;
                    driver.handle_input(Instant::now(), DriverInput::Received(event));
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.into()),
                None => return Err("the server closed the socket".into()),
            },
            () = timer(driver.poll_timeout()) => driver.handle_timeout(Instant::now()),
            () = tokio::time::sleep(WAIT) => {}
        }
    }
}

/// Closes the call the way Retell does (code 1000) and waits for the server's answer.
async fn hang_up(
    mut ws: WebSocketStream<impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>,
) -> Result<(), BoxError> {
    ws.close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: "call ended".into(),
    }))
    .await?;
    tokio::time::timeout(WAIT, async { while ws.next().await.is_some() {} }).await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, addr] = args.as_slice()
        && flag == "--listen"
    {
        let (addr, server) = start_server(addr).await?;
        println!("Retell custom LLM URL: ws://{addr}/llm-websocket (Ctrl-C stops)");
        tokio::signal::ctrl_c().await?;
        server.abort();
        return Ok(());
    }
    let (addr, server) = start_server("127.0.0.1:0").await?;
    let url = format!("ws://{addr}/llm-websocket/call_example");
    println!("server listening; Retell connects to {url}");
    play_retell(&url, &["When do you open on Saturday?", "Thanks, bye!"]).await?;
    server.abort();
    Ok(())
}
