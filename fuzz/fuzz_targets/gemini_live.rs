//! Upstream Live API frames from either side: decoding never panics, and whatever decodes
//! re-encodes to a frame that decodes again.
#![no_main]

use voxgate_gemini::{LiveClientMessage, LiveServerMessage};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(msg) = LiveServerMessage::decode_slice(data) {
        assert!(LiveServerMessage::decode(&msg.encode()).is_ok());
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(msg) = LiveClientMessage::decode(text) {
            assert!(LiveClientMessage::decode(&msg.encode()).is_ok());
        }
    }
});
