//! Retell custom-LLM events, both directions: decoders never panic, the single-pass reader
//! of transcript events decodes exactly what serde does, whatever decodes also encodes and
//! decodes again, and the tracker and driver survive any decoded event.
#![no_main]

use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use voxgate_retell::{
    DriverConfig, DriverInput, ResponseTracker, RetellDriver, RetellEvent, ServerEvent,
    TrackerConfig, TrackerInput,
};

fuzz_target!(|data: &[u8]| {
    let now = Instant::now();
    if let Ok(text) = std::str::from_utf8(data) {
        // `Debug` tells -0.0 from 0.0 where `==` does not.
        let fast = RetellEvent::from_json(text).map(|ev| format!("{ev:?}"));
        let serde = RetellEvent::from_json_by_serde(text).map(|ev| format!("{ev:?}"));
        match (fast, serde) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "fast reader and serde differ on {text:?}"),
            (Err(_), Err(_)) => {}
            (a, b) => panic!("fast reader {a:?}, serde {b:?} on {text:?}"),
        }
    }
    if let Ok(ev) = RetellEvent::from_slice(data) {
        let wire = ev.to_json().expect("decoded events encode");
        let again = RetellEvent::from_json(&wire).expect("encoded events decode");
        // Floats may move by one ulp through serde_json's fast parser; tags never do.
        assert_eq!(again.tag(), ev.tag());
        let mut tracker = ResponseTracker::new(TrackerConfig::default());
        let _ = tracker.handle_input(now, TrackerInput::Connected { call_id: "c".into() });
        let _ = tracker.handle_input(now, TrackerInput::Received(ev));
        tracker.handle_timeout(now + Duration::from_secs(10));
        while tracker.poll_output().is_some() {}
    }
    if let Ok(ev) = ServerEvent::from_slice(data) {
        let wire = ev.to_json().expect("decoded events encode");
        let again = ServerEvent::from_json(&wire).expect("encoded events decode");
        assert_eq!(again.tag(), ev.tag());
        let mut driver = RetellDriver::new(DriverConfig::default());
        driver.handle_input(now, DriverInput::Connected);
        driver.handle_input(now, DriverInput::UserSaid("hi".into()));
        driver.handle_input(now, DriverInput::Received(ev));
        driver.handle_timeout(now + Duration::from_secs(10));
        while driver.poll_output().is_some() {}
    }
});
