//! The WebSocket upgrade: who is connecting, with which framing, and whether they may.
//!
//! Devices send `Authorization`, `Protocol-Version`, `Device-Id` and `Client-Id` headers; browser
//! clients, which cannot set headers on a WebSocket, send `device-id`, `client-id` and
//! `authorization` as query parameters. [`ConnectParams`] reads both.
//!
//! [`ConnectParams::authenticate`] admits a connection only with a token this server issued for
//! exactly the `Client-Id` and `Device-Id` the request presents: both are headers the client
//! chooses, so neither admits anyone on its own. Which devices get a token at all is decided at
//! OTA time ([`DeviceAllowlist`](crate::ota::DeviceAllowlist), activation), not here.
//!
//! ```
//! use voxgate_xiaozhi::connect::{AuthError, Authenticated, ConnectParams};
//! use voxgate_xiaozhi::frame::ProtocolVersion;
//! use voxgate_xiaozhi::token::{self, TokenError, TokenSecret};
//!
//! let secret = TokenSecret::new("s3cret")?;
//! let now = 1_700_000_000;
//! let bearer = format!("Bearer {}", token::issue(&secret, "c1", "aa:bb:cc:dd:ee:ff", now)?);
//! let params = ConnectParams::from_headers([
//!     ("Authorization", bearer.as_str()),
//!     ("Protocol-Version", "3"),
//!     ("Device-Id", "AA:BB:CC:DD:EE:FF"),
//!     ("Client-Id", "c1"),
//! ]);
//! assert_eq!(params.framing()?, ProtocolVersion::V3);
//! assert_eq!(params.authenticate(&secret, now)?, Authenticated::Token { issued_at: now });
//!
//! // The same token presented by another device id is refused.
//! let other = ConnectParams { device_id: Some("11:22:33:44:55:66".into()), ..params };
//! assert_eq!(other.authenticate(&secret, now), Err(AuthError::Token(TokenError::BadSignature)));
//!
//! // A browser client passes the same values as query parameters; without a token it is refused.
//! let browser = ConnectParams::from_query("device-id=aa%3Abb%3Acc%3Add%3Aee%3Aff&client-id=web");
//! assert_eq!(browser.authenticate(&secret, now), Err(AuthError::MissingToken));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::borrow::Cow;

use crate::frame::{ProtocolVersion, UnsupportedVersion};
use crate::ota::header_text;
use crate::token::{self, TokenError, TokenSecret};

/// The upgrade request's parameters.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConnectParams {
    /// The bearer token: the `Authorization` value without its `Bearer ` prefix. A device whose
    /// stored token already contains a space sends it verbatim, and it is kept verbatim here.
    pub token: Option<String>,
    /// The raw `Protocol-Version` value; see [`framing`](Self::framing).
    pub protocol_version: Option<String>,
    /// `Device-Id`: the device's MAC, lowercased.
    pub device_id: Option<String>,
    /// `Client-Id`: the device's UUID.
    pub client_id: Option<String>,
}

impl ConnectParams {
    /// Reads the parameters from request headers (names case-insensitive, first occurrence
    /// wins, non-UTF-8 values ignored).
    pub fn from_headers<I, K, V>(headers: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<[u8]>,
    {
        let mut params = Self::default();
        for (name, value) in headers {
            params.set(name.as_ref(), header_text(value.as_ref()));
        }
        params.normalize();
        params
    }

    /// Reads the parameters from a URL query string (`device-id`, `client-id`,
    /// `authorization`, `protocol-version`; percent-encoding and `+` decoded; a leading `?` is
    /// ignored).
    pub fn from_query(query: &str) -> Self {
        let mut params = Self::default();
        let query = query.strip_prefix('?').unwrap_or(query);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_decode(value);
            params.set(&percent_decode(name), header_text(value.as_bytes()));
        }
        params.normalize();
        params
    }

    /// Fills the parameters missing here from `other` (e.g. headers first, then the query).
    #[must_use]
    pub fn or(self, other: Self) -> Self {
        Self {
            token: self.token.or(other.token),
            protocol_version: self.protocol_version.or(other.protocol_version),
            device_id: self.device_id.or(other.device_id),
            client_id: self.client_id.or(other.client_id),
        }
    }

    /// The binary framing for this connection; version 1 when no version was sent (browser
    /// clients).
    ///
    /// # Errors
    ///
    /// [`UnsupportedVersion`] for any value but 1, 2 or 3.
    pub fn framing(&self) -> Result<ProtocolVersion, UnsupportedVersion> {
        self.protocol_version
            .as_deref()
            .map_or(Ok(ProtocolVersion::V1), ProtocolVersion::from_header)
    }

    /// Decides whether the connection may proceed: it needs a valid token issued for exactly
    /// the client and device ids it presents (checked in constant time by the HMAC).
    ///
    /// There is deliberately no bypass by device id: `Device-Id` is a header the client
    /// chooses, so a list of device ids may only decide who is *issued* a token (at OTA time,
    /// see [`DeviceAllowlist`](crate::ota::DeviceAllowlist)), never who may skip it.
    ///
    /// # Errors
    ///
    /// [`AuthError`] naming what is missing or wrong.
    pub fn authenticate(
        &self,
        secret: &TokenSecret,
        now_unix_secs: u64,
    ) -> Result<Authenticated, AuthError> {
        let device_id = self
            .device_id
            .as_deref()
            .ok_or(AuthError::MissingDeviceId)?;
        let token = self.token.as_deref().ok_or(AuthError::MissingToken)?;
        let client_id = self
            .client_id
            .as_deref()
            .ok_or(AuthError::MissingClientId)?;
        let issued_at = token::verify(secret, token, client_id, device_id, now_unix_secs)?;
        Ok(Authenticated::Token { issued_at })
    }

    fn set(&mut self, name: &str, value: Option<String>) {
        let slot = if name.eq_ignore_ascii_case("authorization") {
            &mut self.token
        } else if name.eq_ignore_ascii_case("protocol-version") {
            &mut self.protocol_version
        } else if name.eq_ignore_ascii_case("device-id") {
            &mut self.device_id
        } else if name.eq_ignore_ascii_case("client-id") {
            &mut self.client_id
        } else {
            return;
        };
        if slot.is_none() {
            *slot = value;
        }
    }

    fn normalize(&mut self) {
        if let Some(id) = &mut self.device_id {
            id.make_ascii_lowercase();
        }
        if let Some(token) = self.token.take() {
            self.token = bearer_token(&token).map(str::to_owned);
        }
    }
}

/// The token in an `Authorization` value: after `Bearer ` (any case), else the whole value.
fn bearer_token(value: &str) -> Option<&str> {
    let token = match value.split_once(' ') {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("bearer") => rest.trim(),
        _ => value,
    };
    (!token.is_empty()).then_some(token)
}

fn percent_decode(text: &str) -> Cow<'_, str> {
    if !text.contains(['%', '+']) {
        return Cow::Borrowed(text);
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let hex = |j: usize| bytes.get(j).and_then(|&h| char::from(h).to_digit(16));
        match (b, hex(i + 1), hex(i + 2)) {
            (b'%', Some(hi), Some(lo)) => {
                // Two hex digits fit a byte.
                out.push(u8::try_from(hi * 16 + lo).unwrap_or(b'?'));
                i += 3;
            }
            (b'+', _, _) => {
                out.push(b' ');
                i += 1;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

/// How a connection was admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Authenticated {
    /// The token is valid and bound to the presented client and device ids.
    Token {
        /// When it was issued, Unix seconds.
        issued_at: u64,
    },
}

/// Why a connection was refused. Blame: the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// No `Device-Id`.
    #[error("no device id in the upgrade request")]
    MissingDeviceId,
    /// No `Client-Id` (needed to check the token).
    #[error("no client id in the upgrade request")]
    MissingClientId,
    /// No `Authorization`.
    #[error("no authorization token in the upgrade request")]
    MissingToken,
    /// The token is not valid.
    #[error(transparent)]
    Token(#[from] TokenError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_prefix_is_removed_and_spaced_tokens_kept_verbatim() {
        assert_eq!(bearer_token("Bearer abc.1"), Some("abc.1"));
        assert_eq!(bearer_token("bearer  abc.1 "), Some("abc.1"));
        assert_eq!(bearer_token("Token abc def"), Some("Token abc def"));
        assert_eq!(bearer_token("abc.1"), Some("abc.1"));
        assert_eq!(bearer_token("Bearer "), None);
    }

    #[test]
    fn percent_decoding_handles_malformed_escapes() {
        assert_eq!(percent_decode("a%3Ab+c%zz%4"), "a:b c%zz%4");
    }
}
