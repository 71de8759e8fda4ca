//! Device tokens: HMAC-SHA256 over `client_id|device_id|timestamp`, as the reference server
//! issues them.
//!
//! A token is `base64url(hmac)` (no padding), a dot, and the issue time in Unix seconds. It is
//! handed to the device in the OTA response and comes back in the `Authorization` header. The
//! HMAC binds the token to both the client id and the device id: [`verify`] takes the ids the
//! connecting client presents, so a token issued to one device does not open the door for
//! another. Verification accepts only the exact issued text. The crate never reads the clock:
//! the caller passes `now`.
//!
//! ```
//! use voxgate_xiaozhi::token::{self, TokenError, TokenSecret};
//!
//! let secret = TokenSecret::new(b"server secret")?;
//! let now = 1_700_000_000;
//! let issued = token::issue(&secret, "client-uuid", "aa:bb:cc:dd:ee:ff", now)?;
//! assert!(issued.ends_with(".1700000000"));
//!
//! assert_eq!(token::verify(&secret, &issued, "client-uuid", "aa:bb:cc:dd:ee:ff", now + 60), Ok(now));
//! assert_eq!(
//!     token::verify(&secret, &issued, "client-uuid", "11:22:33:44:55:66", now),
//!     Err(TokenError::BadSignature)
//! );
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// The reference server's token lifetime: 30 days.
pub const DEFAULT_MAX_AGE_SECS: u64 = 30 * 24 * 60 * 60;

/// How far in the future an issue time may be before a token is rejected (clock skew between
/// server replicas).
pub const DEFAULT_MAX_SKEW_SECS: u64 = 60;

/// The server's signing key, keyed once.
#[derive(Clone)]
pub struct TokenSecret {
    mac: HmacSha256,
}

impl TokenSecret {
    /// Keys HMAC-SHA256 with `secret`.
    ///
    /// # Errors
    ///
    /// [`InvalidSecret`] for an empty secret, which would make every token forgeable.
    pub fn new(secret: impl AsRef<[u8]>) -> Result<Self, InvalidSecret> {
        let secret = secret.as_ref();
        if secret.is_empty() {
            return Err(InvalidSecret);
        }
        let mac = <HmacSha256 as Mac>::new_from_slice(secret).map_err(|_| InvalidSecret)?;
        Ok(Self { mac })
    }

    fn mac(&self, client_id: &str, device_id: &str, timestamp: &str) -> HmacSha256 {
        let mut mac = self.mac.clone();
        mac.update(client_id.as_bytes());
        mac.update(b"|");
        mac.update(device_id.as_bytes());
        mac.update(b"|");
        mac.update(timestamp.as_bytes());
        mac
    }
}

impl std::fmt::Debug for TokenSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenSecret(..)")
    }
}

/// The signing secret is empty. Blame: the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the token secret must not be empty")]
pub struct InvalidSecret;

/// How long tokens live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenPolicy {
    /// Seconds a token stays valid after its issue time (inclusive).
    pub max_age_secs: u64,
    /// Seconds an issue time may lie in the future.
    pub max_skew_secs: u64,
}

impl Default for TokenPolicy {
    /// 30 days, 60 s of skew.
    fn default() -> Self {
        Self {
            max_age_secs: DEFAULT_MAX_AGE_SECS,
            max_skew_secs: DEFAULT_MAX_SKEW_SECS,
        }
    }
}

/// Why a token was not issued or not accepted.
///
/// Blame: the peer for everything but [`TokenError::AmbiguousIdentity`] on issue, which is the
/// caller's (or, when the ids came from headers, the peer's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    /// Not `<base64url>.<decimal seconds>`, or the signature is not 32 bytes.
    #[error("malformed device token")]
    Malformed,
    /// The signature does not match (wrong secret, device, client or a tampered timestamp).
    #[error("device token signature does not match")]
    BadSignature,
    /// The token is older than the policy allows.
    #[error("device token issued at {issued_at} expired at {expired_at}")]
    Expired {
        /// Issue time, Unix seconds.
        issued_at: u64,
        /// Expiry time, Unix seconds.
        expired_at: u64,
    },
    /// The token was issued further in the future than the allowed skew.
    #[error("device token issued at {issued_at} lies in the future (now {now})")]
    FromTheFuture {
        /// Issue time, Unix seconds.
        issued_at: u64,
        /// The time of verification.
        now: u64,
    },
    /// A client or device id contains `|`, which would let one identity's token verify for
    /// another (`a|b` + `c` and `a` + `b|c` sign the same text).
    #[error("client and device ids must not contain '|'")]
    AmbiguousIdentity,
}

/// Issues a token for (`client_id`, `device_id`) at `now_unix_secs`.
///
/// # Errors
///
/// [`TokenError::AmbiguousIdentity`] when an id contains `|`.
pub fn issue(
    secret: &TokenSecret,
    client_id: &str,
    device_id: &str,
    now_unix_secs: u64,
) -> Result<String, TokenError> {
    check_identity(client_id, device_id)?;
    let timestamp = now_unix_secs.to_string();
    let tag = secret
        .mac(client_id, device_id, &timestamp)
        .finalize()
        .into_bytes();
    let mut token = URL_SAFE_NO_PAD.encode(tag);
    token.push('.');
    token.push_str(&timestamp);
    Ok(token)
}

/// Verifies a token with the default 30-day [`TokenPolicy`]; returns its issue time.
///
/// # Errors
///
/// See [`verify_with`].
pub fn verify(
    secret: &TokenSecret,
    token: &str,
    client_id: &str,
    device_id: &str,
    now_unix_secs: u64,
) -> Result<u64, TokenError> {
    verify_with(
        &TokenPolicy::default(),
        secret,
        token,
        client_id,
        device_id,
        now_unix_secs,
    )
}

/// Verifies a token under `policy`; returns its issue time in Unix seconds.
///
/// Only the exact text [`issue`] produced verifies: no surrounding space, no base64 padding, no
/// non-canonical base64 (trailing bits must be zero), and the timestamp is signed as written (a
/// leading zero changes the signature). The signature is checked first (in constant time), so
/// the time errors are only reported for tokens this server really issued.
///
/// # Errors
///
/// [`TokenError::Malformed`], [`TokenError::BadSignature`], [`TokenError::Expired`],
/// [`TokenError::FromTheFuture`] or [`TokenError::AmbiguousIdentity`].
pub fn verify_with(
    policy: &TokenPolicy,
    secret: &TokenSecret,
    token: &str,
    client_id: &str,
    device_id: &str,
    now_unix_secs: u64,
) -> Result<u64, TokenError> {
    check_identity(client_id, device_id)?;
    let (signature, timestamp) = token.split_once('.').ok_or(TokenError::Malformed)?;
    if timestamp.is_empty() || !timestamp.bytes().all(|b| b.is_ascii_digit()) {
        return Err(TokenError::Malformed);
    }
    let issued_at: u64 = timestamp.parse().map_err(|_| TokenError::Malformed)?;
    // Strict decoding: no padding, canonical trailing bits; one text per signature.
    let signature = URL_SAFE_NO_PAD
        .decode(signature)
        .map_err(|_| TokenError::Malformed)?;
    if signature.len() != 32 {
        return Err(TokenError::Malformed);
    }
    secret
        .mac(client_id, device_id, timestamp)
        .verify_slice(&signature)
        .map_err(|_| TokenError::BadSignature)?;
    if issued_at > now_unix_secs.saturating_add(policy.max_skew_secs) {
        return Err(TokenError::FromTheFuture {
            issued_at,
            now: now_unix_secs,
        });
    }
    let expired_at = issued_at.saturating_add(policy.max_age_secs);
    if now_unix_secs > expired_at {
        return Err(TokenError::Expired {
            issued_at,
            expired_at,
        });
    }
    Ok(issued_at)
}

fn check_identity(client_id: &str, device_id: &str) -> Result<(), TokenError> {
    if client_id.contains('|') || device_id.contains('|') {
        return Err(TokenError::AmbiguousIdentity);
    }
    Ok(())
}
