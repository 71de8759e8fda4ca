//! Errors, typed by who is to blame.

/// Who caused an error: decides whether a server answers the peer, logs a bug, or both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Blame {
    /// The peer sent bytes that are not what the protocol's syntax allows (bad JSON, bad base64).
    Malformed,
    /// The peer sent well-formed data that breaks the protocol (a payload of the wrong shape).
    Protocol,
    /// The calling code misused this crate (for example an output buffer that is too small).
    Caller,
}

/// A message could not be decoded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The text is not JSON, or not a JSON object.
    #[error("invalid JSON: {0}")]
    Json(#[source] serde_json::Error),
    /// A bridge frame without a string `type`.
    #[error("message has no \"type\" string")]
    MissingType,
    /// A known message type whose payload has the wrong shape.
    #[error("invalid {kind} payload: {source}")]
    Payload {
        /// The message type (`SEND_MESSAGE`, `serverContent`...).
        kind: String,
        /// What serde found wrong.
        #[source]
        source: serde_json::Error,
    },
}

impl DecodeError {
    /// Who is to blame.
    pub fn blame(&self) -> Blame {
        match self {
            Self::Json(_) => Blame::Malformed,
            Self::MissingType | Self::Payload { .. } => Blame::Protocol,
        }
    }
}

/// Audio data could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AudioError {
    /// A byte that is neither base64, padding nor whitespace, or padding in the wrong place.
    #[error("invalid base64 at byte {offset}")]
    InvalidBase64 {
        /// Offset into the base64 text.
        offset: usize,
    },
    /// The base64 text ends in the middle of a group (a single dangling character).
    #[error("truncated base64")]
    TruncatedBase64,
    /// A RIFF/WAV header that cannot be parsed.
    #[error("malformed WAV header: {0}")]
    BadWav(&'static str),
    /// A WAV file this crate does not convert to 16-bit PCM; its format is reported.
    #[error("unsupported WAV format (format tag {format_tag}, {bits_per_sample} bits)")]
    UnsupportedWav {
        /// `wFormatTag` (1 = PCM, 3 = IEEE float, 0xFFFE = extensible).
        format_tag: u16,
        /// Bits per sample.
        bits_per_sample: u16,
    },
    /// The caller's output buffer cannot hold the samples.
    #[error("output buffer holds {capacity} samples, {needed} needed")]
    BufferTooSmall {
        /// Samples the input decodes to.
        needed: usize,
        /// Samples the buffer holds.
        capacity: usize,
    },
}

impl AudioError {
    /// Who is to blame.
    pub fn blame(&self) -> Blame {
        match self {
            Self::InvalidBase64 { .. } | Self::TruncatedBase64 | Self::BadWav(_) => {
                Blame::Malformed
            }
            Self::UnsupportedWav { .. } => Blame::Protocol,
            Self::BufferTooSmall { .. } => Blame::Caller,
        }
    }
}
