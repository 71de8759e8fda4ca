//! A text chat in the terminal: each line you type is a turn, the reply streams back.
//!
//! ```text
//! cargo run --release --bin voxgate-server            # in another terminal
//! cargo run -p voxgate-realtime-client --example text_chat
//! cargo run -p voxgate-realtime-client --example text_chat -- --grpc http://127.0.0.1:8080
//! ```

use std::io::Write;

use tokio::io::{AsyncBufRead, AsyncBufReadExt as _, BufReader};
use voxgate_realtime::proto::InferenceTriggerMode;
use voxgate_realtime::{AudioFormat, SessionConfig};
use voxgate_realtime_client::{ClientError, ClientOptions, Endpoint, Event, RealtimeClient};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let endpoint = match (args.next(), args.next()) {
        (Some(flag), Some(url)) if flag == "--grpc" => Endpoint::grpc(url),
        (Some(url), _) => Endpoint::websocket(url),
        (None, _) => Endpoint::websocket("ws://127.0.0.1:8080/realtime"),
    };
    eprintln!(
        "connected to {}; type a line, Ctrl-D to leave",
        endpoint.url()
    );
    let stdin = BufReader::new(tokio::io::stdin());
    chat(endpoint, stdin, &mut std::io::stdout()).await?;
    Ok(())
}

/// Sends each line of `input` as a text turn and writes each reply to `output`, one line per
/// reply; returns how many replies were written.
pub(crate) async fn chat(
    endpoint: Endpoint,
    input: impl AsyncBufRead + Unpin,
    output: &mut impl Write,
) -> Result<usize, ClientError> {
    // A text-only session: no audio flows either way.
    let config = SessionConfig::new(AudioFormat::SPEECH_24K, AudioFormat::SPEECH_24K);
    let mut client = RealtimeClient::connect(ClientOptions::new(endpoint), config).await?;
    let mut lines = input.lines();
    let mut replies = 0;
    while let Ok(Some(line)) = lines.next_line().await {
        if line.trim().is_empty() {
            continue;
        }
        client
            .send_text(line, InferenceTriggerMode::Immediate)
            .await?;
        loop {
            match client.next_event().await {
                Some(Event::TextFragment { text, .. }) => {
                    let _ = write!(output, "{text}");
                    let _ = output.flush();
                }
                Some(Event::ResponseEnd { .. }) => {
                    let _ = writeln!(output);
                    replies += 1;
                    break;
                }
                Some(Event::Error(e)) => eprintln!("server error: {e}"),
                Some(_) => {}
                None => return Err(ClientError::Closed(client.end_reason())),
            }
        }
    }
    client.close().await;
    Ok(replies)
}
