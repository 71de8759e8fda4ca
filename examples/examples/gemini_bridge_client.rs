//! A client of a Gemini bridge, on `voxgate-gemini`'s typed messages: connect, set up a
//! text session (`CONNECT_GEMINI`), send a typed message (`SEND_MESSAGE`), print the model's
//! reply as it streams in (`CONTENT_MESSAGE`s until `TURN_COMPLETE`), and disconnect.
//!
//! Without a URL it starts a voxgate server in this process (embedded defaults: the offline
//! demo agent answers) and talks to its Gemini door's own listener; with one it talks to any
//! bridge, a voxgate server's (`ws://127.0.0.1:3001/`, `ws://127.0.0.1:8080/gemini`) or the
//! original gateway's:
//!
//! `cargo run -p voxgate-examples --example gemini_bridge_client [-- URL [TEXT]]`

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use voxgate_gemini::{
    ClientMessage, GenerationConfig, LiveConfig, Modality, Part, ServerContent, ServerMessage,
};
use voxgate_server::{Config, Server};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// How long the client waits for any one message before giving up.
const WAIT: Duration = Duration::from_secs(10);

async fn send(ws: &mut Ws, message: &ClientMessage) -> Result<(), BoxError> {
    let text = message.encode();
    println!("client -> bridge: {text}");
    ws.send(Message::text(text)).await?;
    Ok(())
}

/// The next bridge message; frames that are not JSON messages (pings) are skipped.
async fn recv(ws: &mut Ws) -> Result<ServerMessage, BoxError> {
    loop {
        let frame = tokio::time::timeout(WAIT, ws.next())
            .await?
            .ok_or("the bridge closed the connection")??;
        let message = match frame {
            Message::Text(text) => ServerMessage::decode(&text)?,
            // Some bridges send their JSON in binary frames.
            Message::Binary(bytes) => ServerMessage::decode_slice(&bytes)?,
            _ => continue,
        };
        match &message {
            ServerMessage::ContentMessage(content) => {
                let text: String = model_text(content);
                println!("bridge -> client: CONTENT_MESSAGE {text:?}");
            }
            other => println!("bridge -> client: {}", other.kind()),
        }
        return Ok(message);
    }
}

/// The text parts of a model turn, joined.
fn model_text(content: &ServerContent) -> String {
    content
        .model_turn
        .iter()
        .flat_map(|turn| &turn.parts)
        .filter_map(|part| part.text.as_deref())
        .collect()
}

/// Reads until `done` says stop, failing on a `GEMINI_ERROR`.
async fn recv_until(
    ws: &mut Ws,
    mut done: impl FnMut(&ServerMessage) -> bool,
) -> Result<(), BoxError> {
    loop {
        let message = recv(ws).await?;
        if let ServerMessage::GeminiError { message, .. } = &message {
            return Err(format!("bridge error: {message}").into());
        }
        if done(&message) {
            return Ok(());
        }
    }
}

/// One typed turn with the bridge at `url`; returns the model's reply text.
pub(crate) async fn ask(url: &str, text: &str) -> Result<String, BoxError> {
    let (mut ws, _) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(url)).await??;

    // Text replies only: no audio to decode, no speech synthesizer needed on the server.
    let config = LiveConfig {
        generation_config: Some(GenerationConfig {
            response_modalities: Some(vec![Modality::Text]),
            ..GenerationConfig::default()
        }),
        ..LiveConfig::default()
    };
    send(
        &mut ws,
        &ClientMessage::ConnectGemini {
            initial_config: Some(config),
        },
    )
    .await?;
    // `GEMINI_CONNECTED`, then `SETUP_COMPLETE` once the session is ready.
    let mut setup = None;
    recv_until(&mut ws, |m| {
        if let ServerMessage::SetupComplete(s) = m {
            setup = Some(s.clone());
        }
        setup.is_some()
    })
    .await?;
    if let Some(s) = setup.filter(|s| !s.success) {
        return Err(format!("setup failed: {:?}", s.error).into());
    }

    send(
        &mut ws,
        &ClientMessage::SendMessage {
            parts: vec![Part::text(text)],
            turn_complete: true,
        },
    )
    .await?;
    let mut reply = String::new();
    recv_until(&mut ws, |m| {
        if let ServerMessage::ContentMessage(content) = m {
            reply.push_str(&model_text(content));
        }
        matches!(m, ServerMessage::TurnComplete)
    })
    .await?;

    send(&mut ws, &ClientMessage::DisconnectGemini).await?;
    recv_until(&mut ws, |m| {
        matches!(m, ServerMessage::GeminiDisconnected { .. })
    })
    .await?;
    ws.close(None).await?;
    Ok(reply)
}

/// Starts a voxgate server on free loopback ports with its embedded defaults, asks it `text`
/// through its Gemini door's own listener, and stops it. Returns the reply text.
pub(crate) async fn ask_in_process_server(text: &str) -> Result<String, BoxError> {
    // The Gemini door is on by default, in engine mode, with its own listener (127.0.0.1:3001
    // by default, any path); `with_ephemeral_ports` moves every listener to a free port.
    let server = Server::bind(Config::default().with_ephemeral_ports()).await?;
    let gemini = server
        .listener_addr("gemini")
        .ok_or("the Gemini door's own listener is off")?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));
    let reply = ask(&format!("ws://{gemini}/"), text).await;
    let _ = stop.send(());
    tokio::time::timeout(WAIT, running).await???;
    reply
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let mut args = std::env::args().skip(1);
    let url = args.next();
    let text = args.next().unwrap_or_else(|| "hello from Rust".to_owned());
    let reply = match url {
        Some(url) => ask(&url, &text).await?,
        None => ask_in_process_server(&text).await?,
    };
    println!("reply: {reply}");
    Ok(())
}
