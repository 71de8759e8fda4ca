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
    // Replies and transcripts can be large (Retell sends whole transcripts, Gemini clients
    // whole WAV files): allow frames of a few MiB.
    let config = WebSocketConfig::default()
        .max_message_size(Some(16 << 20))
        .max_frame_size(Some(16 << 20));
    connect_with(url, headers, timeout, config).await
}

/// Opens `url` as [`connect`] does, with `config` (the load generator's sessions take small
/// read buffers: tungstenite zeroes its whole read buffer, 128 KiB by default, on every read).
///
/// # Errors
/// As [`connect`].
pub async fn connect_with(
    url: &str,
    headers: &[(&'static str, String)],
    timeout: Duration,
    config: WebSocketConfig,
) -> anyhow::Result<Ws> {
    let mut request = url
        .into_client_request()
        .with_context(|| format!("bad WebSocket URL {}", redact(url)))?;
    for (name, value) in headers {
        let value = HeaderValue::from_str(value).with_context(|| format!("bad {name} header"))?;
        request.headers_mut().insert(*name, value);
    }
    let connecting = tokio_tungstenite::connect_async_with_config(request, Some(config), true);
    match tokio::time::timeout(timeout, connecting).await {
        Ok(Ok((ws, _response))) => Ok(ws),
        Ok(Err(e)) => Err(e).with_context(|| format!("connecting to {}", redact(url))),
        Err(_) => bail!(
            "connecting to {}: no answer within {timeout:?}",
            redact(url)
        ),
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
    let mut report = json!({"url": redact(url)});
    if let (Some(report), Value::Object(fields)) = (report.as_object_mut(), fields) {
        report.extend(fields);
    }
    events.emit("connected", report);
    Ok(ws)
}

/// `url` with its secrets replaced by `***`, for events and error messages (which end up in
/// logs and CI output): user info, the values of `token` / `secret` / `key` / `api_key` /
/// `access_token` / `authorization` query parameters, the Retell socket secret in
/// `/llm-websocket/{secret}/{call_id}` and the Gemini bridge token in `/gemini/{token}`.
#[must_use]
pub fn redact(url: &str) -> String {
    const SECRET_PARAMS: [&str; 6] = [
        "token",
        "secret",
        "key",
        "api_key",
        "access_token",
        "authorization",
    ];
    let (head, fragment) = url
        .split_once('#')
        .map_or((url, None), |(h, f)| (h, Some(f)));
    let (base, query) = head
        .split_once('?')
        .map_or((head, None), |(b, q)| (b, Some(q)));
    let (scheme, rest) = base.split_once("://").unwrap_or(("", base));
    let (authority, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
    let authority = authority
        .rsplit_once('@')
        .map_or_else(|| authority.to_owned(), |(_, host)| format!("***@{host}"));
    let mut segments: Vec<&str> = path.split('/').collect();
    for i in 0..segments.len() {
        let secret_follows = match segments[i] {
            // `{secret}/{call_id}`: the secret is the segment before the call id.
            "llm-websocket" => segments.len() > i + 2 && !segments[i + 2].is_empty(),
            "gemini" => segments.len() > i + 1,
            _ => false,
        };
        if secret_follows && !segments[i + 1].is_empty() {
            segments[i + 1] = "***";
        }
    }
    let mut out = String::new();
    if !scheme.is_empty() {
        out.push_str(scheme);
        out.push_str("://");
    }
    out.push_str(&authority);
    out.push_str(&segments.join("/"));
    if let Some(query) = query {
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((k, _)) if SECRET_PARAMS.contains(&k.to_ascii_lowercase().as_str()) => {
                    format!("{k}=***")
                }
                _ => pair.to_owned(),
            })
            .collect();
        out.push('?');
        out.push_str(&pairs.join("&"));
    }
    if let Some(fragment) = fragment {
        out.push('#');
        out.push_str(fragment);
    }
    out
}

/// The fields of a `closed` event for the close frame the server sent, if any.
#[must_use]
pub fn close_fields(frame: Option<&CloseFrame>) -> Value {
    json!({"code": frame.map(|f| u16::from(f.code)), "reason": frame.map(|f| f.reason.to_string())})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_reported_without_their_secrets() {
        let cases = [
            (
                "ws://h:1/llm-websocket/call_1",
                "ws://h:1/llm-websocket/call_1",
            ),
            (
                "wss://h/llm-websocket/s3cr3t/call_1",
                "wss://h/llm-websocket/***/call_1",
            ),
            (
                "ws://h/llm-websocket/c?secret=s3cr3t&x=1",
                "ws://h/llm-websocket/c?secret=***&x=1",
            ),
            ("ws://h:8080/mcp?token=abc", "ws://h:8080/mcp?token=***"),
            ("ws://h:8080/gemini/abc", "ws://h:8080/gemini/***"),
            ("ws://h:8080/gemini", "ws://h:8080/gemini"),
            ("ws://u:pw@h:1/realtime#f", "ws://***@h:1/realtime#f"),
            ("ws://h:1", "ws://h:1"),
        ];
        for (url, want) in cases {
            assert_eq!(redact(url), want, "{url}");
        }
    }
}
