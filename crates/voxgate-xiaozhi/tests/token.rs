//! Device tokens: issue, verify, expiry, tampering and identity binding.
// Test helpers outside #[test] fns are not covered by clippy.toml's test exemptions.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use voxgate_xiaozhi::token::{
    self, DEFAULT_MAX_AGE_SECS, InvalidSecret, TokenError, TokenPolicy, TokenSecret,
};

const CLIENT: &str = "3f1a6c2e-9b0d-4c8e-a1f2-0d9c8b7a6e5f";
const DEVICE: &str = "aa:bb:cc:dd:ee:ff";
const NOW: u64 = 1_700_000_000;

fn secret() -> TokenSecret {
    TokenSecret::new("server-secret").unwrap()
}

#[test]
fn token_format_matches_the_reference_server() {
    let issued = token::issue(&secret(), CLIENT, DEVICE, NOW).unwrap();
    // Recompute independently: HMAC-SHA256 over `client|device|ts`, base64url without padding.
    let mut mac = Hmac::<Sha256>::new_from_slice(b"server-secret").unwrap();
    mac.update(format!("{CLIENT}|{DEVICE}|{NOW}").as_bytes());
    let expected = format!(
        "{}.{NOW}",
        URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
    );
    assert_eq!(issued, expected);
    assert!(!issued.contains('='));
    assert_eq!(issued.len(), 43 + 1 + 10);
}

#[test]
fn a_fresh_token_verifies_until_it_expires() {
    let issued = token::issue(&secret(), CLIENT, DEVICE, NOW).unwrap();
    assert_eq!(
        token::verify(&secret(), &issued, CLIENT, DEVICE, NOW),
        Ok(NOW)
    );
    let last_valid = NOW + DEFAULT_MAX_AGE_SECS;
    assert_eq!(
        token::verify(&secret(), &issued, CLIENT, DEVICE, last_valid),
        Ok(NOW)
    );
    assert_eq!(
        token::verify(&secret(), &issued, CLIENT, DEVICE, last_valid + 1),
        Err(TokenError::Expired {
            issued_at: NOW,
            expired_at: last_valid
        })
    );
    assert_eq!(DEFAULT_MAX_AGE_SECS, 30 * 86_400);
}

#[test]
fn tokens_from_the_future_are_rejected_beyond_the_skew() {
    let issued = token::issue(&secret(), CLIENT, DEVICE, NOW + 60).unwrap();
    assert_eq!(
        token::verify(&secret(), &issued, CLIENT, DEVICE, NOW),
        Ok(NOW + 60)
    );
    let issued = token::issue(&secret(), CLIENT, DEVICE, NOW + 61).unwrap();
    assert_eq!(
        token::verify(&secret(), &issued, CLIENT, DEVICE, NOW),
        Err(TokenError::FromTheFuture {
            issued_at: NOW + 61,
            now: NOW
        })
    );
}

#[test]
fn a_custom_policy_changes_the_lifetime() {
    let policy = TokenPolicy {
        max_age_secs: 10,
        max_skew_secs: 0,
    };
    let issued = token::issue(&secret(), CLIENT, DEVICE, NOW).unwrap();
    assert_eq!(
        token::verify_with(&policy, &secret(), &issued, CLIENT, DEVICE, NOW + 10),
        Ok(NOW)
    );
    assert!(matches!(
        token::verify_with(&policy, &secret(), &issued, CLIENT, DEVICE, NOW + 11),
        Err(TokenError::Expired { .. })
    ));
    assert!(matches!(
        token::verify_with(&policy, &secret(), &issued, CLIENT, DEVICE, NOW - 1),
        Err(TokenError::FromTheFuture { .. })
    ));
}

#[test]
fn wrong_device_client_or_secret_is_a_bad_signature() {
    let issued = token::issue(&secret(), CLIENT, DEVICE, NOW).unwrap();
    let bad = Err(TokenError::BadSignature);
    assert_eq!(
        token::verify(&secret(), &issued, CLIENT, "11:22:33:44:55:66", NOW),
        bad
    );
    assert_eq!(
        token::verify(&secret(), &issued, "other-client", DEVICE, NOW),
        bad
    );
    let other = TokenSecret::new("another secret").unwrap();
    assert_eq!(token::verify(&other, &issued, CLIENT, DEVICE, NOW), bad);
}

#[test]
fn tampering_is_detected() {
    let issued = token::issue(&secret(), CLIENT, DEVICE, NOW - 40 * 86_400).unwrap();
    let (signature, _) = issued.split_once('.').unwrap();
    // Extending an expired token by rewriting its timestamp breaks the signature.
    let extended = format!("{signature}.{NOW}");
    assert_eq!(
        token::verify(&secret(), &extended, CLIENT, DEVICE, NOW),
        Err(TokenError::BadSignature)
    );
    // Flipping one signature character.
    let mut flipped = issued.clone().into_bytes();
    flipped[0] = if flipped[0] == b'A' { b'B' } else { b'A' };
    let flipped = String::from_utf8(flipped).unwrap();
    assert_eq!(
        token::verify(&secret(), &flipped, CLIENT, DEVICE, NOW),
        Err(TokenError::BadSignature)
    );
}

#[test]
fn malformed_tokens_are_typed_errors() {
    let issued = token::issue(&secret(), CLIENT, DEVICE, NOW).unwrap();
    let (signature, _) = issued.split_once('.').unwrap();
    for token in [
        String::new(),
        "no-dot".to_owned(),
        format!("{signature}."),
        format!("{signature}.-5"),
        format!("{signature}.12a"),
        format!("{signature}.99999999999999999999999"),
        format!("{signature}.1.2"),
        format!("!!!.{NOW}"),
        format!("{}.{NOW}", &signature[..20]),
        format!(".{NOW}"),
    ] {
        assert_eq!(
            token::verify(&secret(), &token, CLIENT, DEVICE, NOW),
            Err(TokenError::Malformed),
            "{token}"
        );
    }
    // Only the exact issued text verifies: no padding, no surrounding space, no truncation.
    for token in [
        format!("{signature}=.{NOW}"),
        format!(" {issued}"),
        format!("{issued} "),
        signature.to_owned(),
        format!("{}.{NOW}", &signature[..signature.len() - 1]),
    ] {
        assert_eq!(
            token::verify(&secret(), &token, CLIENT, DEVICE, NOW),
            Err(TokenError::Malformed),
            "{token}"
        );
    }
    // A leading zero or a cut timestamp is another text: its signature does not match.
    for token in [
        format!("{signature}.0{NOW}"),
        issued[..issued.len() - 1].to_owned(),
    ] {
        assert_eq!(
            token::verify(&secret(), &token, CLIENT, DEVICE, NOW),
            Err(TokenError::BadSignature),
            "{token}"
        );
    }
    // Non-canonical base64 (non-zero trailing bits in the last character) is refused.
    let last = signature.chars().last().unwrap();
    let alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let pos = alphabet.find(last).unwrap();
    let sibling = alphabet.chars().nth(pos ^ 1).unwrap();
    let non_canonical = format!("{}{sibling}.{NOW}", &signature[..signature.len() - 1]);
    assert_eq!(
        token::verify(&secret(), &non_canonical, CLIENT, DEVICE, NOW),
        Err(TokenError::Malformed)
    );
}

#[test]
fn separator_in_ids_is_refused() {
    assert_eq!(
        token::issue(&secret(), "a|b", "c", NOW),
        Err(TokenError::AmbiguousIdentity)
    );
    let issued = token::issue(&secret(), "a", "b", NOW).unwrap();
    assert_eq!(
        token::verify(&secret(), &issued, "a|b", "c", NOW),
        Err(TokenError::AmbiguousIdentity)
    );
}

#[test]
fn empty_secret_is_refused() {
    assert_eq!(TokenSecret::new("").unwrap_err(), InvalidSecret);
    assert_eq!(format!("{:?}", secret()), "TokenSecret(..)");
}
