//! Failures whose detail stays in the server's log.
//!
//! A provider's error text can carry its request ids, account names, quota figures or a body
//! echoed from the upstream API (up to 500 characters): nothing a caller should see. Clients
//! get a generic message with an id instead, and the detail is logged under the same id, so an
//! operator can find it from the id a user quotes.

use std::fmt::Display;
use std::sync::atomic::{AtomicU64, Ordering};

/// Logs `detail` under a fresh error id and returns the message for the client:
/// `"<what> failed (error id <id>)"`.
pub(crate) fn report(what: &str, detail: &dyn Display) -> String {
    tagged(&format!("{what} failed"), detail)
}

/// Logs `detail` under a fresh error id and returns `"<message> (error id <id>)"`.
pub(crate) fn tagged(message: &str, detail: &dyn Display) -> String {
    let id = new_id();
    tracing::warn!(error_id = %id, %detail, "{message}");
    format!("{message} (error id {id})")
}

/// 16 hex digits from the OS random source; ids only need to be unique enough to find a log
/// line, so if that source fails a process-wide counter stands in rather than losing the error.
fn new_id() -> String {
    static FALLBACK: AtomicU64 = AtomicU64::new(0);
    let bytes = crate::secret::random_bytes(8).unwrap_or_else(|_| {
        FALLBACK
            .fetch_add(1, Ordering::Relaxed)
            .to_be_bytes()
            .to_vec()
    });
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_message_hides_the_detail_and_names_an_id() {
        let detail = "HTTP 401 from api.example: {\"error\":\"key sk-live-123 revoked\"}";
        let a = report("the language model", &detail);
        let b = report("the language model", &detail);
        assert!(a.starts_with("the language model failed (error id "), "{a}");
        assert!(!a.contains("sk-live") && !a.contains("401"), "{a}");
        let id = a.trim_end_matches(')').rsplit(' ').next().unwrap();
        assert_eq!(id.len(), 16);
        assert!(id.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b, "every report gets its own id");
    }
}
