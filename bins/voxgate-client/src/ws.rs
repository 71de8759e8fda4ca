//! WebSocket plumbing shared by the doors.

use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// A client WebSocket.
pub type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Opens `url` with extra request headers, failing after `timeout`.
///
/// # Errors
/// A bad URL or header, a refused connection or upgrade, or the timeout.
pub async fn connect(
    url: &str,
    headers: &[(&'static str, String)],
    timeout: Duration,
) -> anyhow::Result<Ws> {
    let mut request = url
        .into_client_request()
        .with_context(|| format!("bad WebSocket URL {url}"))?;
    for (name, value) in headers {
        let value = HeaderValue::from_str(value).with_context(|| format!("bad {name} header"))?;
        request.headers_mut().insert(*name, value);
    }
    // Replies and transcripts can be large (Retell sends whole transcripts, Gemini clients
    // whole WAV files): allow frames of a few MiB.
    let config = WebSocketConfig::default()
        .max_message_size(Some(16 << 20))
        .max_frame_size(Some(16 << 20));
    let connecting = tokio_tungstenite::connect_async_with_config(request, Some(config), true);
    match tokio::time::timeout(timeout, connecting).await {
        Ok(Ok((ws, _response))) => Ok(ws),
        Ok(Err(e)) => Err(e).with_context(|| format!("connecting to {url}")),
        Err(_) => bail!("connecting to {url}: no answer within {timeout:?}"),
    }
}
