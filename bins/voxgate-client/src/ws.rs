//! WebSocket plumbing shared by the doors.

use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::events::Events;

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

/// Opens `url` as [`connect`] does and reports it as a `connected` event: the URL plus
/// `fields` (a JSON object, or `null` for none).
///
/// # Errors
/// As [`connect`].
pub async fn open(
    url: &str,
    headers: &[(&'static str, String)],
    timeout: Duration,
    events: &mut Events,
    fields: Value,
) -> anyhow::Result<Ws> {
    let ws = connect(url, headers, timeout).await?;
    let mut report = json!({"url": url});
    if let (Some(report), Value::Object(fields)) = (report.as_object_mut(), fields) {
        report.extend(fields);
    }
    events.emit("connected", report);
    Ok(ws)
}

/// The fields of a `closed` event for the close frame the server sent, if any.
#[must_use]
pub fn close_fields(frame: Option<&CloseFrame>) -> Value {
    json!({"code": frame.map(|f| u16::from(f.code)), "reason": frame.map(|f| f.reason.to_string())})
}
