//! Where and how to connect: the endpoint (WebSocket or gRPC URL, hosted URL layout), the API
//! key, timeouts and reconnection.

use std::time::Duration;

/// Base URL of the hosted Deepslate service (the published Python client's default).
pub const DEEPSLATE_BASE_URL: &str = "https://app.deepslate.eu";

/// How the session's messages travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Transport {
    /// One protobuf message per binary WebSocket frame (`ws://` or `wss://`).
    WebSocket,
    /// gRPC: `voxgate.realtime.v1.RealtimeService/Session`, one bidirectional stream
    /// (`http://`, plaintext HTTP/2).
    Grpc,
}

/// The server to talk to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    url: String,
    transport: Transport,
}

impl Endpoint {
    /// A WebSocket URL as it is (a self-hosted server: `ws://host:port/realtime`).
    #[must_use]
    pub fn websocket(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            transport: Transport::WebSocket,
        }
    }

    /// A gRPC server (`http://host:port`, the server's main listener unless it moved the
    /// service to `[realtime] grpc_listen`). Plaintext HTTP/2 only: for TLS use
    /// [`websocket`](Self::websocket) with `wss://`.
    #[must_use]
    pub fn grpc(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            transport: Transport::Grpc,
        }
    }

    /// The hosted layout: `{base}/api/v1/vendors/{vendor}/organizations/{organization}/realtime`
    /// with an optional `/{model}`, `https` becoming `wss` and `http` becoming `ws` (as the
    /// published clients build it; [`DEEPSLATE_BASE_URL`] is the hosted service). A voxgate
    /// server serves the same paths.
    #[must_use]
    pub fn hosted(base_url: &str, vendor: &str, organization: &str, model: Option<&str>) -> Self {
        let (scheme, rest) = match base_url.split_once("://") {
            Some(("https", rest)) => ("wss", rest),
            Some(("http", rest)) => ("ws", rest),
            Some((scheme, rest)) => (scheme, rest),
            None => ("wss", base_url),
        };
        let host = rest.trim_end_matches('/');
        let mut url = format!(
            "{scheme}://{host}/api/v1/vendors/{}/organizations/{}/realtime",
            escape(vendor),
            escape(organization)
        );
        if let Some(model) = model {
            url.push('/');
            url.push_str(&escape(model));
        }
        Self::websocket(url)
    }

    /// The URL.
    #[must_use]
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The transport.
    #[must_use]
    pub fn transport(&self) -> Transport {
        self.transport
    }
}

/// Percent-encodes a path segment (everything but RFC 3986's unreserved characters).
fn escape(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Reconnection after a connection is lost: exponential back-off from `initial_delay`,
/// doubling up to `max_delay`, at most `max_attempts` times in a row (0: never reconnect).
///
/// The default (3 attempts, 1 s doubling to 30 s) is the published Python client's. A lost
/// connection is one that failed (I/O error, reset, server going away or failing); a session
/// the server ended normally or for the client's own error is not reconnected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reconnect {
    /// Attempts after a loss before giving up.
    pub max_attempts: u32,
    /// Wait before the first attempt.
    pub initial_delay: Duration,
    /// Longest wait between attempts.
    pub max_delay: Duration,
}

impl Reconnect {
    /// Never reconnect: a lost connection ends the client.
    pub const NEVER: Self = Self {
        max_attempts: 0,
        initial_delay: Duration::ZERO,
        max_delay: Duration::ZERO,
    };

    /// The wait before attempt `n` (1-based).
    #[must_use]
    pub fn delay(&self, attempt: u32) -> Duration {
        let factor = 1u32
            .checked_shl(attempt.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.initial_delay
            .checked_mul(factor)
            .unwrap_or(self.max_delay)
            .min(self.max_delay)
    }
}

impl Default for Reconnect {
    fn default() -> Self {
        Self {
            max_attempts: 3,
            initial_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(30),
        }
    }
}

/// Everything [`RealtimeClient::connect`](crate::RealtimeClient::connect) needs besides the
/// session configuration.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// The server.
    pub endpoint: Endpoint,
    /// Sent as `Authorization: Bearer <key>` (the `authorization` metadata over gRPC).
    pub api_key: Option<String>,
    /// Bound on opening the connection (TCP, TLS, HTTP upgrade).
    pub connect_timeout: Duration,
    /// Bound on the wait for `SessionReady` after the initialization.
    pub ready_timeout: Duration,
    /// Bound on the wait for the answer to a query, a history export or a ping.
    pub request_timeout: Duration,
    /// What to do when the connection is lost.
    pub reconnect: Reconnect,
}

impl ClientOptions {
    /// Options for `endpoint`: no key, 10 s to connect and to get ready, 60 s per request,
    /// the default reconnection.
    #[must_use]
    pub fn new(endpoint: Endpoint) -> Self {
        Self {
            endpoint,
            api_key: None,
            connect_timeout: Duration::from_secs(10),
            ready_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(60),
            reconnect: Reconnect::default(),
        }
    }

    /// With a bearer key.
    #[must_use]
    pub fn with_api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// With a reconnection policy.
    #[must_use]
    pub fn with_reconnect(mut self, reconnect: Reconnect) -> Self {
        self.reconnect = reconnect;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosted_urls_follow_the_published_layout() {
        let e = Endpoint::hosted(DEEPSLATE_BASE_URL, "v1", "org 2", None);
        assert_eq!(
            e.url(),
            "wss://app.deepslate.eu/api/v1/vendors/v1/organizations/org%202/realtime"
        );
        assert_eq!(e.transport(), Transport::WebSocket);
        let e = Endpoint::hosted("http://127.0.0.1:8080/", "v", "o", Some("a/b"));
        assert_eq!(
            e.url(),
            "ws://127.0.0.1:8080/api/v1/vendors/v/organizations/o/realtime/a%2Fb"
        );
    }

    #[test]
    fn back_off_doubles_up_to_the_cap() {
        let r = Reconnect::default();
        assert_eq!(r.delay(1), Duration::from_secs(1));
        assert_eq!(r.delay(2), Duration::from_secs(2));
        assert_eq!(r.delay(5), Duration::from_secs(16));
        assert_eq!(r.delay(6), Duration::from_secs(30));
        assert_eq!(r.delay(200), Duration::from_secs(30));
    }
}
