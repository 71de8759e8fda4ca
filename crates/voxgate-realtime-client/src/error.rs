//! Errors of the client.

use crate::event::SessionError;

/// Why a call on the client failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The server could not be reached or the connection could not be set up.
    #[error("cannot connect to {url}: {reason}")]
    Connect {
        /// The endpoint's URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The server refused the API key (HTTP 401/403, gRPC `UNAUTHENTICATED`).
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    /// The server refused the session for now (at capacity, rate limited, overloaded).
    #[error("refused by the server: {0}")]
    Refused(String),
    /// The server did not accept the session's initialization.
    #[error("session not initialized: {0}")]
    Initialize(SessionError),
    /// The server did not answer in time.
    #[error("no answer within {0:?}")]
    Timeout(std::time::Duration),
    /// The server answered a request with an error.
    #[error("{0}")]
    Session(SessionError),
    /// The message could not be built (a tool schema that is not a JSON object, a query with
    /// neither prompt nor instructions...).
    #[error(transparent)]
    Usage(#[from] voxgate_realtime::UsageError),
    /// The connection was lost before the request was answered.
    #[error("connection lost: {0}")]
    Disconnected(String),
    /// The session is over (closed by either side, or reconnection gave up).
    #[error("the session is closed{}", .0.as_deref().map(|r| format!(": {r}")).unwrap_or_default())]
    Closed(Option<String>),
}

/// How a connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Loss {
    /// It failed (I/O error, reset, the server going away or failing): worth reconnecting.
    Failed(String),
    /// The server ended the session normally.
    Ended(String),
    /// The server ended the session for a reason a new connection would meet again.
    Refused(String),
}

impl Loss {
    pub(crate) fn failed(reason: impl Into<String>) -> Self {
        Self::Failed(reason.into())
    }

    pub(crate) fn protocol(reason: impl Into<String>) -> Self {
        Self::Refused(reason.into())
    }

    pub(crate) fn ended() -> Self {
        Self::Ended("the server ended the session".into())
    }

    pub(crate) fn reason(&self) -> &str {
        match self {
            Self::Failed(r) | Self::Ended(r) | Self::Refused(r) => r,
        }
    }
}
