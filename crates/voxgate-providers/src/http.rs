//! HTTP plumbing shared by the HTTP providers: timeouts, retries before the first byte, error
//! mapping, and a body reader with an idle timeout.

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;

use crate::error::{ProviderError, TimeoutPhase};

/// Timeouts and retry policy of an HTTP provider.
///
/// Retries happen only before the response begins (connection failures, first-byte timeouts,
/// HTTP 429 and 5xx): once bytes have been streamed to the caller a retry would repeat them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpSettings {
    /// Limit on opening the connection (TCP and TLS).
    pub connect_timeout: Duration,
    /// Limit on waiting for the response headers after sending the request (for an LLM this
    /// includes the time to process the prompt).
    pub first_byte_timeout: Duration,
    /// Limit on the silence between two chunks of a streamed body.
    pub idle_timeout: Duration,
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// Wait before the first retry; doubled for each further retry.
    pub initial_backoff: Duration,
    /// Idle connections kept open to the provider's host for later requests; a connection
    /// coming free beyond them is closed.
    ///
    /// Without a cap the pool holds every connection used in the last
    /// [`idle_connection_timeout`](Self::idle_connection_timeout): the HTTP client opens a
    /// new connection whenever none is free at the moment of a request, even if one frees a
    /// millisecond later, and keeps both. Under a steady load of voice sessions that grew to
    /// hundreds of idle connections, each holding its read and write buffers.
    pub max_idle_connections: usize,
    /// How long an idle connection is kept for reuse before it is closed.
    pub idle_connection_timeout: Duration,
}

/// Default [`HttpSettings::max_idle_connections`]: enough to ride out the second-to-second
/// swing of a few hundred requests in flight without new TLS handshakes; a busier server opens
/// more as it needs them.
pub const DEFAULT_MAX_IDLE_CONNECTIONS: usize = 32;

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            first_byte_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(20),
            max_retries: 2,
            initial_backoff: Duration::from_millis(250),
            max_idle_connections: DEFAULT_MAX_IDLE_CONNECTIONS,
            idle_connection_timeout: Duration::from_secs(90),
        }
    }
}

/// Builds a client with the connect timeout and the connection pool's limits; the other
/// limits are applied per request.
pub(crate) fn build_client(settings: &HttpSettings) -> Result<reqwest::Client, ProviderError> {
    reqwest::Client::builder()
        .connect_timeout(settings.connect_timeout)
        .pool_max_idle_per_host(settings.max_idle_connections)
        .pool_idle_timeout(settings.idle_connection_timeout)
        .build()
        .map_err(|e| ProviderError::Config(describe(&e)))
}

/// Joins an error with its causes: reqwest's own message rarely says what went wrong.
pub(crate) fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(cause) = src {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        src = cause.source();
    }
    s
}

/// Checks a base URL once, when the provider is built, so a typo fails at configuration time.
pub(crate) fn check_base_url(base: &str) -> Result<String, ProviderError> {
    let trimmed = base.trim_end_matches('/');
    let parsed = reqwest::Url::parse(trimmed)
        .map_err(|e| ProviderError::Config(format!("base URL {base:?}: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(ProviderError::Config(format!(
            "base URL {base:?}: scheme must be http or https"
        )));
    }
    Ok(trimmed.to_owned())
}

/// Sends the request built by `make` (called once per attempt, because bodies such as multipart
/// forms cannot be replayed) and returns a successful response, retrying transient failures
/// before the first byte with exponential backoff.
pub(crate) async fn send_with_retries(
    settings: &HttpSettings,
    make: impl Fn() -> reqwest::RequestBuilder,
) -> Result<reqwest::Response, ProviderError> {
    let mut attempt = 0u32;
    loop {
        let result = send_once(settings, make()).await;
        match result {
            Ok(resp) => return Ok(resp),
            Err(e) if e.is_transient() && attempt < settings.max_retries => {
                let wait = settings
                    .initial_backoff
                    .saturating_mul(1u32 << attempt.min(16));
                tokio::time::sleep(wait).await;
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

async fn send_once(
    settings: &HttpSettings,
    req: reqwest::RequestBuilder,
) -> Result<reqwest::Response, ProviderError> {
    let resp = match tokio::time::timeout(settings.first_byte_timeout, req.send()).await {
        Err(_) => {
            return Err(ProviderError::Timeout {
                phase: TimeoutPhase::FirstByte,
                after: settings.first_byte_timeout,
            });
        }
        Ok(Err(e)) if e.is_timeout() => {
            return Err(ProviderError::Timeout {
                phase: TimeoutPhase::Connect,
                after: settings.connect_timeout,
            });
        }
        Ok(Err(e)) if e.is_builder() => return Err(ProviderError::Config(describe(&e))),
        Ok(Err(e)) => return Err(ProviderError::Connect(describe(&e))),
        Ok(Ok(resp)) => resp,
    };
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    // The error body is small; it still gets the idle limit so a stalled error cannot hang us.
    let body = match tokio::time::timeout(settings.idle_timeout, resp.bytes()).await {
        Ok(Ok(b)) => b,
        _ => Bytes::new(),
    };
    Err(error_from_status(status.as_u16(), &body))
}

/// Maps an error status and its body to an error, extracting the service's message from the
/// OpenAI (`{"error":{"message":..}}`), Ollama (`{"error":".."}`) or ElevenLabs
/// (`{"detail":{"message":..}}` / `{"detail":".."}`) shapes, else the body text.
pub(crate) fn error_from_status(status: u16, body: &[u8]) -> ProviderError {
    let message = error_message(body);
    if status == 401 || status == 403 {
        ProviderError::Auth { status, message }
    } else {
        ProviderError::Http { status, message }
    }
}

pub(crate) fn error_message(body: &[u8]) -> String {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
        for key in ["error", "detail"] {
            match v.get(key) {
                Some(serde_json::Value::String(s)) => return s.clone(),
                Some(obj @ serde_json::Value::Object(_)) => {
                    if let Some(m) = obj.get("message").and_then(|m| m.as_str()) {
                        return m.to_owned();
                    }
                }
                _ => {}
            }
        }
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    // Error pages can be large HTML documents; the start is enough to diagnose.
    match text.char_indices().nth(500) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_owned(),
    }
}

/// A streamed response body read chunk by chunk, each wait bounded by the idle timeout.
pub(crate) struct BodyReader {
    stream: BoxStream<'static, reqwest::Result<Bytes>>,
    idle: Duration,
}

impl BodyReader {
    pub(crate) fn new(resp: reqwest::Response, idle: Duration) -> Self {
        Self {
            stream: resp.bytes_stream().boxed(),
            idle,
        }
    }

    /// The next chunk, `None` at a clean end of body.
    pub(crate) async fn next_chunk(&mut self) -> Result<Option<Bytes>, ProviderError> {
        match tokio::time::timeout(self.idle, self.stream.next()).await {
            Err(_) => Err(ProviderError::Timeout {
                phase: TimeoutPhase::Idle,
                after: self.idle,
            }),
            Ok(None) => Ok(None),
            Ok(Some(Err(e))) => Err(ProviderError::StreamCut(describe(&e))),
            Ok(Some(Ok(b))) => Ok(Some(b)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_messages_from_every_known_shape() {
        assert_eq!(
            error_message(br#"{"error":{"message":"boom","type":"server_error"}}"#),
            "boom"
        );
        assert_eq!(
            error_message(br#"{"error":"model not found"}"#),
            "model not found"
        );
        assert_eq!(
            error_message(br#"{"detail":{"status":"invalid_api_key","message":"bad key"}}"#),
            "bad key"
        );
        assert_eq!(error_message(b"  plain text \n"), "plain text");
        assert_eq!(error_message(&[b'x'; 600]).len(), 503);
    }

    #[test]
    fn auth_statuses_are_auth_errors() {
        assert!(matches!(
            error_from_status(401, b""),
            ProviderError::Auth { status: 401, .. }
        ));
        assert!(matches!(
            error_from_status(500, b""),
            ProviderError::Http { status: 500, .. }
        ));
        assert!(error_from_status(503, b"").is_transient());
        assert!(!error_from_status(400, b"").is_transient());
    }

    #[test]
    fn base_urls_are_checked() {
        assert_eq!(check_base_url("http://h:1/v1/").unwrap(), "http://h:1/v1");
        assert!(check_base_url("ftp://h").is_err());
        assert!(check_base_url("not a url").is_err());
    }
}
