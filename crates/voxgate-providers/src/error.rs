//! One error type for every provider, typed by who is to blame.

use std::time::Duration;

use thiserror::Error;

/// Which wait ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TimeoutPhase {
    /// Opening the connection (TCP and TLS).
    Connect,
    /// Waiting for the response headers after sending the request.
    FirstByte,
    /// Waiting for the next chunk of a streamed body.
    Idle,
    /// The whole operation (a local program, a non-streamed request).
    Total,
}

/// Why a provider could not do its work.
///
/// Streams report these as their last item; they never panic and never hang past the configured
/// timeouts.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum ProviderError {
    /// The caller configured something that cannot work (bad URL, empty voice id...).
    /// Blame: the caller.
    #[error("invalid provider configuration: {0}")]
    Config(String),
    /// The connection could not be opened or broke before the response began.
    /// Blame: the network or the remote host.
    #[error("connection failed: {0}")]
    Connect(String),
    /// A configured timeout elapsed.
    #[error("timed out ({phase:?}) after {after:?}")]
    Timeout {
        /// What was being waited for.
        phase: TimeoutPhase,
        /// The limit that elapsed.
        after: Duration,
    },
    /// The service rejected the credentials (HTTP 401 or 403). Blame: the caller's key.
    #[error("authentication failed (HTTP {status}): {message}")]
    Auth {
        /// HTTP status code.
        status: u16,
        /// The service's own explanation, when it gave one.
        message: String,
    },
    /// The service answered with another error status (after any retries).
    #[error("service error (HTTP {status}): {message}")]
    Http {
        /// HTTP status code.
        status: u16,
        /// The service's own explanation (the OpenAI-style `error.message` when present).
        message: String,
    },
    /// The service reported an error inside an otherwise successful stream.
    #[error("service reported an error mid-stream: {0}")]
    Upstream(String),
    /// The response stream ended or broke before it was complete. Blame: the remote host or the
    /// network.
    #[error("stream cut before completion: {0}")]
    StreamCut(String),
    /// The service sent something that does not follow its wire format (bad JSON, bad audio).
    /// Blame: the remote host.
    #[error("protocol violation by the service: {0}")]
    Protocol(String),
    /// A local program failed (could not start, exited with an error, wrote bad output).
    #[error("local command failed: {0}")]
    Command(String),
    /// Encoding or decoding local audio failed.
    #[error("audio: {0}")]
    Audio(String),
    /// An in-process model (local speech recognition or synthesis) failed: a model file that
    /// does not load, an inference error, a worker that died.
    #[error("local model failed: {0}")]
    Local(String),
    /// An in-process engine has every worker busy and its queue full; the request was refused
    /// at once rather than left waiting without bound. Blame: load beyond the configured pool.
    #[error("local engine busy: {0}")]
    Busy(String),
}

impl ProviderError {
    /// Whether retrying the same request later might succeed (network trouble, timeouts, 5xx,
    /// 429), as opposed to errors that will repeat (bad key, bad request, bad configuration).
    #[must_use]
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Connect(_)
            | Self::Timeout { .. }
            | Self::StreamCut(_)
            | Self::Upstream(_)
            | Self::Busy(_) => true,
            Self::Http { status, .. } => *status == 429 || *status >= 500,
            _ => false,
        }
    }
}
