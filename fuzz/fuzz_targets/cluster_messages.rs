//! What instances read from each other through Redis (`[cluster]`), one input line each, the
//! first byte choosing the reader: routing messages, saved Retell calls, MCP tool lists,
//! perception stream entries, admin push bodies. Nothing panics; what is accepted is written
//! out again in a form that reads back to the same thing (a routing message, a saved call after
//! one round, a perception entry).
#![no_main]

use libfuzzer_sys::fuzz_target;
use voxgate_server::fuzzing::cluster;

fuzz_target!(|data: &[u8]| {
    for line in data.split(|&b| b == b'\n').take(16) {
        let Some((&which, rest)) = line.split_first() else {
            continue;
        };
        let text = String::from_utf8_lossy(rest);
        match which % 5 {
            0 => {
                if let Ok(json) = cluster::routing_message(rest) {
                    let again = cluster::routing_message(json.as_bytes())
                        .expect("a written routing message reads back");
                    assert_eq!(again, json);
                }
            }
            1 => {
                if let Some(saved) = cluster::saved_retell_call("call-1", &text) {
                    let again = cluster::saved_retell_call("call-1", &saved)
                        .expect("a saved call reads back");
                    // A restore marks an open answer as cut off: after one round it is stable.
                    assert_eq!(
                        cluster::saved_retell_call("call-1", &again).as_deref(),
                        Some(again.as_str())
                    );
                }
            }
            2 => {
                let _ = cluster::mcp_tools(&text);
            }
            3 => {
                if let Ok(json) = cluster::perception_entry(&text) {
                    assert_eq!(
                        cluster::perception_entry(&json).expect("an entry reads back"),
                        json
                    );
                }
            }
            _ => {
                let _ = cluster::device_push(rest);
            }
        }
    }
});
