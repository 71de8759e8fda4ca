//! `POST /api/perception/event` bodies and Xiaozhi `event` frames, one per input line (even
//! lines as HTTP bodies, odd lines as device frames), published on one bus. Validation never
//! panics; an accepted event respects the documented bounds and serializes to JSON; the
//! per-device state counts exactly the accepted events and keeps at most 64 names a device.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use voxgate_server::fuzzing::Perception;

fuzz_target!(|data: &[u8]| {
    let bus = Perception::new();
    let mut accepted = 0u64;
    for (i, line) in data.split(|&b| b == b'\n').take(64).enumerate() {
        let published = if i % 2 == 0 {
            bus.post(line)
        } else {
            bus.device_frame(line, "aa:bb:cc:dd:ee:ff", "session-1")
        };
        let Ok(json) = published else {
            continue;
        };
        accepted += 1;
        let event: Value = serde_json::from_str(&json).expect("an accepted event is JSON");
        let name = event["name"].as_str().expect("name is text");
        assert!(
            !name.is_empty() && name.len() <= 64 && name.trim() == name,
            "{name:?}"
        );
        let device = event["device_id"].as_str().expect("device id is text");
        assert!(!device.is_empty() && device.len() <= 256, "{device:?}");
        if let Some(session) = event["session_id"].as_str() {
            assert!(session.len() <= 256);
        }
        let ts = event["ts"].as_f64().expect("ts is a number");
        assert!(ts.is_finite() && ts >= 0.0);
        assert!(event["data"].is_object());
    }
    let devices: Value = serde_json::from_str(&bus.devices_json()).expect("state is JSON");
    let devices = devices.as_array().expect("a list of devices");
    let mut counted = 0;
    for device in devices {
        let events = device["events"].as_u64().expect("a count");
        assert!(events >= 1);
        counted += events;
        assert!(device["latest"].as_object().is_some_and(|m| m.len() <= 64));
    }
    assert_eq!(
        counted, accepted,
        "state does not count the accepted events"
    );
});
