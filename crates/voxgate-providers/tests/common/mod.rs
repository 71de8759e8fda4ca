//! Fake servers on 127.0.0.1 for the provider tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use voxgate_providers::HttpSettings;

/// Serves `router` on an ephemeral port; returns `http://127.0.0.1:PORT`.
pub(crate) async fn serve(router: axum::Router) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    });
    format!("http://{addr}")
}

/// A server that answers every connection with `head` (status line and headers) and then the
/// given raw body bytes, and closes the socket: used to cut a chunked body mid-way.
pub(crate) async fn serve_raw(head: &'static str, body: Vec<u8>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let body = body.clone();
            tokio::spawn(async move {
                // Read the request head (and whatever body came with it) before answering.
                let mut buf = vec![0u8; 65536];
                let _ = tokio::time::timeout(Duration::from_millis(200), async {
                    use tokio::io::AsyncReadExt;
                    let _ = sock.read(&mut buf).await;
                })
                .await;
                let _ = sock.write_all(head.as_bytes()).await;
                let _ = sock.write_all(&body).await;
                let _ = sock.flush().await;
                // Dropping the socket closes it without the terminating chunk.
            });
        }
    });
    format!("http://{addr}")
}

/// One HTTP/1.1 chunk.
pub(crate) fn chunk(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

/// A port nobody listens on.
pub(crate) async fn dead_url() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}

/// Short limits so failure tests finish in well under a second.
pub(crate) fn fast_http() -> HttpSettings {
    HttpSettings {
        connect_timeout: Duration::from_millis(500),
        first_byte_timeout: Duration::from_millis(400),
        idle_timeout: Duration::from_millis(300),
        max_retries: 0,
        initial_backoff: Duration::from_millis(10),
        ..HttpSettings::default()
    }
}

/// Collects a stream, failing the test instead of hanging.
pub(crate) async fn collect<S: Stream + Unpin>(s: S) -> Vec<S::Item> {
    tokio::time::timeout(Duration::from_secs(10), s.collect::<Vec<_>>())
        .await
        .expect("the stream must end by itself")
}

/// A body that yields `parts` and then never ends (a stalled server).
pub(crate) fn stalled_body(parts: Vec<Vec<u8>>) -> axum::body::Body {
    let s = futures::stream::iter(parts.into_iter().map(Ok::<_, std::io::Error>))
        .chain(futures::stream::pending());
    axum::body::Body::from_stream(s)
}

/// A body delivered in the given pieces, with a pause between them so they arrive separately.
pub(crate) fn chunked_body(parts: Vec<Vec<u8>>) -> axum::body::Body {
    let s = futures::stream::iter(parts).then(|p| async move {
        tokio::time::sleep(Duration::from_millis(2)).await;
        Ok::<_, std::io::Error>(p)
    });
    axum::body::Body::from_stream(s)
}
