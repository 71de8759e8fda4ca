//! Xiaozhi device tokens against a fixed secret. Input: `token\nclient_id\ndevice_id` (missing
//! ids take defaults). Verifying an arbitrary token never panics and accepts only the exact
//! token this secret issues for those ids (no padding, no surrounding whitespace: the check is
//! exact); a token issued here verifies, and every mutation the input drives does not.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use voxgate_xiaozhi::token::{self, TokenError, TokenPolicy, TokenSecret};

const NOW: u64 = 1_700_000_000;

static SECRET: LazyLock<TokenSecret> =
    LazyLock::new(|| TokenSecret::new("fuzz secret").expect("non-empty"));
static OTHER: LazyLock<TokenSecret> =
    LazyLock::new(|| TokenSecret::new("fuzz secret 2").expect("non-empty"));

fn mutate(token: &str, op: &[u8]) -> String {
    let mut bytes = token.as_bytes().to_vec();
    let (kind, pos, value) = (op[0] % 4, usize::from(op[1]), op[2]);
    let at = pos % (bytes.len() + 1);
    match kind {
        0 if at < bytes.len() => bytes[at] = value,
        1 if at < bytes.len() => bytes[at] ^= value | 1,
        2 => bytes.insert(at, value),
        _ if at < bytes.len() => {
            bytes.remove(at);
        }
        _ => bytes.push(value),
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(3, '\n');
    let candidate = parts.next().unwrap_or_default();
    let client = parts
        .next()
        .unwrap_or("2f1c8f1e-8a3b-4d0e-9c51-6f1d2b9c0a11");
    let device = parts.next().unwrap_or("aa:bb:cc:dd:ee:ff");
    let ambiguous = client.contains('|') || device.contains('|');

    // An arbitrary token verifies only if it is exactly what this secret issues.
    match token::verify(&SECRET, candidate, client, device, NOW) {
        Ok(issued_at) => {
            let expected = token::issue(&SECRET, client, device, issued_at).expect("ids are fine");
            assert_eq!(candidate, expected, "a token not issued here verified");
            assert!(issued_at <= NOW + token::DEFAULT_MAX_SKEW_SECS);
            assert!(NOW - issued_at <= token::DEFAULT_MAX_AGE_SECS);
        }
        Err(TokenError::AmbiguousIdentity) => assert!(ambiguous),
        Err(_) => assert!(!ambiguous),
    }
    let strict = TokenPolicy {
        max_age_secs: 0,
        max_skew_secs: 0,
    };
    let _ = token::verify_with(&strict, &SECRET, candidate, client, device, u64::MAX);

    // A token issued here verifies; mutations of it, the wrong secret or other ids do not.
    let issued_at = NOW - u64::from(data.first().copied().unwrap_or(0)) * 3600;
    let issued = match token::issue(&SECRET, client, device, issued_at) {
        Ok(t) => t,
        Err(e) => {
            assert!(ambiguous && e == TokenError::AmbiguousIdentity);
            return;
        }
    };
    assert_eq!(
        token::verify(&SECRET, &issued, client, device, NOW),
        Ok(issued_at)
    );
    assert_eq!(
        token::verify(&OTHER, &issued, client, device, NOW),
        Err(TokenError::BadSignature)
    );
    let other_client = format!("{client}x");
    assert_eq!(
        token::verify(&SECRET, &issued, &other_client, device, NOW),
        Err(TokenError::BadSignature)
    );
    assert_eq!(
        token::verify(&SECRET, &issued, client, &device.to_ascii_uppercase(), NOW).is_ok(),
        device.to_ascii_uppercase() == device
    );
    for op in data.chunks_exact(3).take(32) {
        let mutated = mutate(&issued, op);
        let verdict = token::verify(&SECRET, &mutated, client, device, NOW);
        if mutated == issued {
            assert_eq!(
                verdict,
                Ok(issued_at),
                "an edit that changed nothing was refused"
            );
        } else {
            assert!(
                verdict.is_err(),
                "mutated token {mutated:?} of {issued:?} verified"
            );
        }
    }
});
