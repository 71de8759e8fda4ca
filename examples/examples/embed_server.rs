//! Embedding the voxgate server in your own program, with your own language model: implement
//! `voxgate_providers::Llm`, hand it to `Server::bind_with`, run the server on 127.0.0.1 (any
//! free port), and hold one text turn against its realtime door over a real WebSocket, the way
//! a Deepslate-compatible client would. Then shut the server down.
//!
//! `cargo run -p voxgate-examples --example embed_server -- "what can you do?"`

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt, stream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;
use voxgate_providers::{
    FinishReason, Intent, Llm, LlmEvent, LlmRequest, LlmStream, NoAsr, Role, ToneTts,
};
use voxgate_realtime::proto::InferenceTriggerMode;
use voxgate_realtime::proto::client_bound_message::Payload as Down;
use voxgate_realtime::{AudioFormat, ClientBoundMessage, ServiceBoundMessage, SessionConfig};
use voxgate_server::{Config, Providers, Server, ServerError};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long the client waits for any one server message before giving up.
const WAIT: Duration = Duration::from_secs(10);

/// A small deterministic brain: it counts the words of the user's last message and repeats it.
/// A real one would call a model here; the server only needs the stream of events.
struct WordCounter;

impl Llm for WordCounter {
    fn generate(&self, request: LlmRequest) -> LlmStream {
        let answer = match &request.intent {
            Intent::Greet => "Hello! Say something and I will count your words.".to_owned(),
            // A reply (and, in this small brain, a question about the conversation too).
            _ => {
                let said = request
                    .messages
                    .iter()
                    .rev()
                    .find(|m| m.role == Role::User)
                    .map_or("", |m| m.content.trim());
                let words = said.split_whitespace().count();
                let noun = if words == 1 { "word" } else { "words" };
                format!("You said {words} {noun}: {said}")
            }
        };
        // Streamed word by word, as a model would; the stream must end with `Done` (or
        // `Error`).
        let mut events: Vec<LlmEvent> = answer
            .split_inclusive(' ')
            .map(|word| LlmEvent::TextDelta(word.to_owned()))
            .collect();
        events.push(LlmEvent::Done {
            finish_reason: FinishReason::Stop,
            usage: None,
        });
        Box::pin(stream::iter(events))
    }
}

/// A server running in a task of this process, stopped by [`RunningServer::stop`].
pub(crate) struct RunningServer {
    /// The main listener's address (port chosen by the OS).
    pub(crate) addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), ServerError>>,
}

impl RunningServer {
    /// Asks the server to shut down and waits for it: open sessions are closed first.
    pub(crate) async fn stop(self) -> Result<(), BoxError> {
        // The task may already have ended on its own (a listener failure), which the join
        // below reports.
        let _ = self.stop.send(());
        tokio::time::timeout(WAIT, self.task).await???;
        Ok(())
    }
}

/// Binds a server with the default configuration on free loopback ports (no environment, no
/// file) and our own language model, and runs it in a task.
pub(crate) async fn start_server() -> Result<RunningServer, BoxError> {
    let config = Config::default().with_ephemeral_ports();
    let providers = Providers {
        llm: Arc::new(WordCounter),
        // No speech recognizer: this example only sends text. `ToneTts` is the placeholder
        // synthesizer; text-only realtime sessions never ask for speech anyway.
        asr: Arc::new(NoAsr),
        tts: Arc::new(ToneTts),
    };
    let server = Server::bind_with(config, providers).await?;
    let addr = server.local_addr();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async move {
        // Either a stop request or the handle being dropped shuts the server down.
        let _ = stopped.await;
    }));
    Ok(RunningServer { addr, stop, task })
}

/// One text turn on the realtime door at `addr`: initialize a text-only session, send
/// `question`, and collect the reply's text fragments. Returns the reply text.
pub(crate) async fn realtime_turn(addr: SocketAddr, question: &str) -> Result<String, BoxError> {
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/realtime")).await?;

    // Without a TTS configuration in the session the server answers in text.
    let session = SessionConfig::new(AudioFormat::SPEECH_24K, AudioFormat::SPEECH_24K);
    let first = [
        ServiceBoundMessage::initialize(&session)?,
        ServiceBoundMessage::user_text(1, InferenceTriggerMode::Immediate, question),
    ];
    for message in first {
        println!(
            "client -> server: {}",
            message.kind().map_or("?", |k| k.as_str())
        );
        ws.send(Message::Binary(message.to_frame())).await?;
    }

    let mut reply = String::new();
    loop {
        let frame = tokio::time::timeout(WAIT, ws.next())
            .await?
            .ok_or("the server closed the connection")??;
        // Pings and pongs are answered by tungstenite itself.
        let Message::Binary(bytes) = frame else {
            continue;
        };
        let message = ClientBoundMessage::decode_frame(bytes)?;
        let Some(payload) = message.payload else {
            continue;
        };
        match payload {
            Down::SessionReady(_) => println!("server -> client: SessionReady"),
            Down::ResponseBegin(b) => {
                println!("server -> client: ResponseBegin(turn {})", b.turn_id);
            }
            Down::ModelTextFragment(f) => {
                println!("server -> client: ModelTextFragment({:?})", f.text);
                reply.push_str(&f.text);
            }
            Down::ResponseEnd(e) => {
                println!("server -> client: ResponseEnd(turn {})", e.turn_id);
                break;
            }
            Down::Error(e) => {
                return Err(format!("server error {:?}: {}", e.category(), e.message).into());
            }
            // Turn snapshots, inference notices...: not needed here.
            other => println!("server -> client: {other:?}"),
        }
    }
    ws.close(None).await?;
    Ok(reply)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let question = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "what can you do for me today?".to_owned());
    let server = start_server().await?;
    println!("voxgate server listening on {}", server.addr);
    let reply = realtime_turn(server.addr, &question).await?;
    println!("reply: {reply}");
    server.stop().await?;
    println!("server stopped");
    Ok(())
}
