//! The Retell client (Retell's side, via the codec's driver) against the server's custom-LLM
//! door, in-process with the demo agent.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::Running;
use voxgate_client::events::Events;
use voxgate_client::retell::{RetellOptions, run};
use voxgate_server::Config;

fn position(events: &Events, pred: impl Fn(&serde_json::Value) -> bool) -> Option<usize> {
    events.recorded().iter().position(pred)
}

#[tokio::test]
async fn utterances_get_complete_responses_with_call_details_sent() {
    let server = Running::start(Config::default()).await;
    let mut opts = RetellOptions::new(format!("ws://{}/llm-websocket/call_e2e_1", server.addr));
    opts.texts = vec!["hello there".into(), "and a second thing".into()];
    opts.timeout = Duration::from_secs(15);
    let mut events = Events::recording();
    let out = run(&opts, &mut events).await.unwrap();
    assert!(out.configured);
    assert_eq!(
        out.begin.as_deref(),
        Some(""),
        "the default begin message lets the user speak"
    );
    assert!(out.violations.is_empty(), "{:?}", out.violations);
    assert_eq!(out.responses.len(), 2, "{:?}", events.recorded());
    assert_eq!(out.responses[0].0, 1);
    assert_eq!(out.responses[1].0, 2);
    assert!(
        out.responses[0].1.contains("You said: hello there"),
        "{:?}",
        out.responses
    );
    assert!(out.responses[1].1.contains("You said: and a second thing"));
    // Retell answered the server's config with call_details (the server asks for them).
    let details = position(&events, |e| {
        e["event"] == "sent" && e["message"]["interaction_type"] == "call_details"
    })
    .expect("call_details sent");
    let request = position(&events, |e| {
        e["event"] == "sent" && e["message"]["interaction_type"] == "response_required"
    })
    .unwrap();
    assert!(details < request);
    server.stop().await;
}

#[tokio::test]
async fn a_begin_message_after_call_details_is_waited_for() {
    let mut config = Config::default();
    config.retell.begin_message = "Hi, this is voxgate.".into();
    config.retell.begin_after_call_details = true;
    let server = Running::start(config).await;
    let mut opts = RetellOptions::new(format!("ws://{}/llm-websocket/call_e2e_2", server.addr));
    opts.texts = vec!["ok".into()];
    opts.timeout = Duration::from_secs(15);
    let mut events = Events::recording();
    let out = run(&opts, &mut events).await.unwrap();
    assert_eq!(out.begin.as_deref(), Some("Hi, this is voxgate."));
    let details = position(&events, |e| {
        e["event"] == "sent" && e["message"]["interaction_type"] == "call_details"
    })
    .unwrap();
    let begin = position(&events, |e| {
        e["event"] == "agent_spoke" && e["response_id"] == 0
    })
    .unwrap();
    let asked = position(&events, |e| {
        e["event"] == "sent" && e["message"]["interaction_type"] == "response_required"
    })
    .unwrap();
    assert!(
        details < begin && begin < asked,
        "call_details, then begin, then the user"
    );
    assert_eq!(out.responses.len(), 1);
    server.stop().await;
}

/// Reads one WebSocket frame the server sent (never masked): the raw bytes and, for a text
/// frame, its payload.
async fn read_frame(
    from: &mut tokio::net::tcp::OwnedReadHalf,
) -> std::io::Result<(Vec<u8>, Option<String>)> {
    use tokio::io::AsyncReadExt;
    let mut head = [0u8; 2];
    from.read_exact(&mut head).await?;
    let mut raw = head.to_vec();
    let len = match head[1] & 0x7f {
        126 => {
            let mut ext = [0u8; 2];
            from.read_exact(&mut ext).await?;
            raw.extend_from_slice(&ext);
            u64::from(u16::from_be_bytes(ext))
        }
        127 => {
            let mut ext = [0u8; 8];
            from.read_exact(&mut ext).await?;
            raw.extend_from_slice(&ext);
            u64::from_be_bytes(ext)
        }
        n => u64::from(n),
    };
    let mut payload = vec![0u8; usize::try_from(len).unwrap()];
    from.read_exact(&mut payload).await?;
    raw.extend_from_slice(&payload);
    let text = (head[0] & 0x0f == 1).then(|| String::from_utf8_lossy(&payload).into_owned());
    Ok((raw, text))
}

/// A TCP proxy to `server` that cuts its first connection (both ways, no close handshake: a
/// network failure) right after passing on the first unfinished chunk of response 1; later
/// connections pass through untouched. Returns its address.
async fn cutting_proxy(server: std::net::SocketAddr) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut first = true;
        while let Ok((mut client, _)) = listener.accept().await {
            let mut upstream = tokio::net::TcpStream::connect(server).await.unwrap();
            if !std::mem::take(&mut first) {
                tokio::spawn(async move {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                });
                continue;
            }
            tokio::spawn(async move {
                let (mut client_rx, mut client_tx) = client.into_split();
                let (mut up_rx, mut up_tx) = upstream.into_split();
                let to_server =
                    tokio::spawn(async move { tokio::io::copy(&mut client_rx, &mut up_tx).await });
                // The upgrade response, byte by byte up to its blank line.
                let mut head = Vec::new();
                while !head.ends_with(b"\r\n\r\n") {
                    let mut b = [0u8; 1];
                    if up_rx.read_exact(&mut b).await.is_err() {
                        return;
                    }
                    head.push(b[0]);
                }
                client_tx.write_all(&head).await.unwrap();
                while let Ok((raw, text)) = read_frame(&mut up_rx).await {
                    client_tx.write_all(&raw).await.unwrap();
                    let cut = text
                        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                        .is_some_and(|v| {
                            v["response_type"] == "response"
                                && v["response_id"] == 1
                                && v["content_complete"] == false
                        });
                    if cut {
                        break;
                    }
                }
                // Dropping every half (and the copying task) cuts the connection both ways.
                to_server.abort();
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_connection_cut_mid_answer_is_reconnected_and_the_answer_still_arrives_whole() {
    let server = Running::start(Config::default()).await;
    let proxy = cutting_proxy(server.addr).await;
    let mut opts = RetellOptions::new(format!("ws://{proxy}/llm-websocket/call_e2e_cut"));
    opts.texts = vec!["hello there".into(), "and a second thing".into()];
    opts.timeout = Duration::from_secs(20);
    let mut events = Events::recording();
    let out = run(&opts, &mut events).await.unwrap();
    let reconnected = position(&events, |e| e["event"] == "reconnect");
    assert!(reconnected.is_some(), "{:?}", events.recorded());
    assert!(out.violations.is_empty(), "{:?}", out.violations);
    // Each answer whole (from its start, once), under the id that asked for it.
    assert_eq!(
        out.responses,
        [
            (1, "You said: hello there".to_owned()),
            (2, "You said: and a second thing".to_owned())
        ],
        "{:?}",
        events.recorded()
    );
    server.stop().await;
}
