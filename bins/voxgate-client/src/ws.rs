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

/// WebSocket opcodes of the frames the load generator writes itself.
pub mod opcode {
    /// A text message.
    pub const TEXT: u8 = 0x1;
    /// A binary message.
    pub const BINARY: u8 = 0x2;
    /// Close.
    pub const CLOSE: u8 = 0x8;
    /// Pong (the answer to the server's keepalive ping).
    pub const PONG: u8 = 0xA;
}

/// Masking keys for client frames, a fresh one per frame as RFC 6455 §5.3 requires ("a fresh
/// masking key ... derived from a strong source of entropy", unpredictable from the previous
/// ones): straight from the OS's random source (`getrandom`), fetched 1,024 keys at a time so a
/// frame costs a copy of 4 bytes, not a system call.
#[derive(Debug)]
pub struct MaskKeys {
    pool: Box<[u8; 4096]>,
    next: usize,
}

impl Default for MaskKeys {
    fn default() -> Self {
        Self::new()
    }
}

impl MaskKeys {
    /// An empty pool, filled on first use.
    #[must_use]
    pub fn new() -> Self {
        Self {
            pool: Box::new([0; 4096]),
            next: 4096,
        }
    }

    /// The next key.
    ///
    /// # Errors
    /// The OS's random source failed.
    pub fn next_key(&mut self) -> anyhow::Result<[u8; 4]> {
        if self.next + 4 > self.pool.len() {
            getrandom::fill(&mut self.pool[..])
                .map_err(|e| anyhow::anyhow!("random masking keys: {e}"))?;
            self.next = 0;
        }
        let mut key = [0; 4];
        key.copy_from_slice(&self.pool[self.next..self.next + 4]);
        self.next += 4;
        Ok(key)
    }
}

/// Appends one final client frame of `opcode` carrying `payload`, masked with `key`, to `out`:
/// what tungstenite would write, without its message and sink machinery (the load generator
/// writes it to the socket itself, one system call per frame).
pub fn masked_frame(out: &mut Vec<u8>, opcode: u8, payload: &[u8], key: [u8; 4]) {
    out.push(0x80 | (opcode & 0x0f));
    let n = payload.len();
    if let Ok(short) = u8::try_from(n)
        && short <= 125
    {
        out.push(0x80 | short);
    } else if let Ok(medium) = u16::try_from(n) {
        out.push(0x80 | 126);
        out.extend_from_slice(&medium.to_be_bytes());
    } else {
        out.push(0x80 | 127);
        out.extend_from_slice(&(n as u64).to_be_bytes());
    }
    out.extend_from_slice(&key);
    let start = out.len();
    out.extend_from_slice(payload);
    for (i, b) in out[start..].iter_mut().enumerate() {
        *b ^= key[i & 3];
    }
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
    fn masked_frames_are_what_tungstenite_reads() {
        use std::io::Cursor;
        use tokio_tungstenite::tungstenite::protocol::frame::FrameHeader;
        use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
        let mut keys = MaskKeys::new();
        let (a, b) = (keys.next_key().unwrap(), keys.next_key().unwrap());
        assert_ne!(a, b, "a fresh key per frame");
        for len in [0usize, 5, 125, 126, 300, 70_000] {
            let payload: Vec<u8> = (0..len).map(|i| u8::try_from(i % 251).unwrap()).collect();
            let mut out = Vec::new();
            masked_frame(&mut out, opcode::BINARY, &payload, a);
            let mut cursor = Cursor::new(&out);
            let (header, n) = FrameHeader::parse(&mut cursor).unwrap().unwrap();
            assert_eq!(n, len as u64);
            assert!(header.is_final);
            assert_eq!(header.opcode, OpCode::Data(Data::Binary));
            assert_eq!(header.mask, Some(a));
            let body: Vec<u8> = out[usize::try_from(cursor.position()).unwrap()..]
                .iter()
                .enumerate()
                .map(|(i, b)| b ^ a[i & 3])
                .collect();
            assert_eq!(body, payload, "{len}");
        }
    }

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
