//! Arbitrary bytes as a Xiaozhi JSON control message, in both directions. Parsing must never
//! panic; a message that parses must serialize to JSON that parses back to the same message.
//! An `mcp` payload is raw JSON text written back verbatim: it round-trips exactly at once.
#![no_main]

use libfuzzer_sys::fuzz_target;
use voxgate_xiaozhi::control::{DeviceMessage, ServerMessage};

fuzz_target!(|data: &[u8]| {
    if let Ok(message) = DeviceMessage::from_slice(data) {
        let json = message.to_json();
        let again = DeviceMessage::from_slice(json.as_bytes()).expect("our own JSON parses");
        assert_eq!(again.to_json(), json);
        if let DeviceMessage::Mcp(mcp) = &message {
            assert_eq!(&again, &message);
            assert!(json.contains(mcp.payload_json()));
        }
        // Values that have no exact JSON form (e.g. float `ts`) may change once; after that the
        // message is a fixed point.
        if again != message {
            assert_eq!(
                DeviceMessage::from_slice(again.to_json().as_bytes()).ok(),
                Some(again)
            );
        }
    }
    if let Ok(message) = ServerMessage::from_slice(data) {
        let json = message.to_json();
        let again = ServerMessage::from_slice(json.as_bytes()).expect("our own JSON parses");
        assert_eq!(again.to_json(), json);
        if let ServerMessage::Mcp(mcp) = &message {
            assert_eq!(&again, &message);
            assert!(json.contains(mcp.payload_json()));
        }
        if again != message {
            assert_eq!(
                ServerMessage::from_slice(again.to_json().as_bytes()).ok(),
                Some(again)
            );
        }
    }
});
