//! Secrets: comparison that does not leak through timing, and randomness from the OS.
//!
//! Both sides are hashed with SHA-256 before a constant-time comparison, so neither the
//! position of the first differing byte nor the secret's length shows in how long a refusal
//! takes; every configured key is compared, matched or not.

use sha2::{Digest, Sha256};
use subtle::{Choice, ConstantTimeEq};

/// Whether `given` equals `expected`, in time independent of their contents.
pub(crate) fn secret_eq(expected: &str, given: &str) -> bool {
    digest_eq(expected, given).into()
}

/// Whether `given` equals one of `keys`; every key is compared.
pub(crate) fn matches_any(keys: &[String], given: &str) -> bool {
    keys.iter()
        .fold(Choice::from(0), |found, k| found | digest_eq(k, given))
        .into()
}

fn digest_eq(a: &str, b: &str) -> Choice {
    Sha256::digest(a.as_bytes())
        .as_slice()
        .ct_eq(Sha256::digest(b.as_bytes()).as_slice())
}

/// `n` bytes from the operating system's random source (keys, tokens, ids).
pub(crate) fn random_bytes(n: usize) -> Result<Vec<u8>, getrandom::Error> {
    let mut out = vec![0u8; n];
    getrandom::fill(&mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_secrets_match_and_others_do_not() {
        assert!(secret_eq("s3cret", "s3cret"));
        assert!(!secret_eq("s3cret", "s3cre"));
        assert!(!secret_eq("s3cret", "s3creT"));
        assert!(!secret_eq("s3cret", ""));
        let keys = vec!["k1".to_owned(), "k2".to_owned()];
        assert!(matches_any(&keys, "k2"));
        assert!(!matches_any(&keys, "k3"));
        assert!(!matches_any(&[], "k1"));
    }

    #[test]
    fn random_bytes_differ() {
        let a = random_bytes(32).unwrap();
        let b = random_bytes(32).unwrap();
        assert_eq!(a.len(), 32);
        assert_ne!(a, b);
    }
}
