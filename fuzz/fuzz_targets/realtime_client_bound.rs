//! Decodes arbitrary bytes as a `ClientBoundMessage`. Decoding and validation must never panic,
//! and whatever decodes must re-encode to a canonical frame that decodes to the same message.
//!
//! Equality is checked on the canonical bytes, because a message holding a NaN float is not
//! equal to itself.
#![no_main]

use voxgate_realtime::ClientBoundMessage;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(message) = ClientBoundMessage::decode_frame(data.to_vec()) else {
        return;
    };
    if let Err(e) = message.validate() {
        // Every error maps to a category and a notification without panicking.
        let _ = e.to_client_message();
    }
    let canonical = message.to_frame();
    let again = match ClientBoundMessage::decode_frame(canonical.clone()) {
        Ok(again) => again,
        Err(e) => panic!("re-encoded frame does not decode: {e}"),
    };
    assert_eq!(again.to_frame(), canonical, "re-encoding is not stable");
    assert_eq!(again.kind(), message.kind());
});
