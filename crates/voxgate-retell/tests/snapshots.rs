//! Every golden message decoded and re-encoded; the snapshots pin the JSON shapes we emit.

// Helpers outside #[test] fns fail loudly too: a missing golden file is a failed test.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::path::Path;

use voxgate_retell::{RetellEvent, ServerEvent};

fn files(dir: &str) -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(dir);
    let mut out: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
            (stem, fs::read_to_string(&p).unwrap())
        })
        .collect();
    out.sort();
    out
}

#[test]
fn retell_to_server_events() {
    let files = files("retell");
    assert!(files.len() >= 8);
    for (name, text) in files {
        let ev = RetellEvent::from_json(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        insta::assert_json_snapshot!(format!("retell__{name}"), ev);
        // What we emit must decode to the same value.
        assert_eq!(
            RetellEvent::from_json(&ev.to_json().unwrap()).unwrap(),
            ev,
            "{name}"
        );
    }
}

#[test]
fn server_to_retell_events() {
    let files = files("server");
    assert!(files.len() >= 12);
    for (name, text) in files {
        let ev = ServerEvent::from_json(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        insta::assert_json_snapshot!(format!("server__{name}"), ev);
        assert_eq!(
            ServerEvent::from_json(&ev.to_json().unwrap()).unwrap(),
            ev,
            "{name}"
        );
    }
}

#[test]
fn benchmark_payload_decodes() {
    let text = fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/response_required_10_utterances.json"),
    )
    .unwrap();
    let RetellEvent::ResponseRequired(r) = RetellEvent::from_json(&text).unwrap() else {
        panic!("not a response_required");
    };
    assert_eq!(r.response_id, 5);
    assert_eq!(r.transcript.len(), 10);
    assert!(
        r.transcript
            .iter()
            .all(|u| u.words.as_ref().is_some_and(|w| w.len() > 10))
    );
}
