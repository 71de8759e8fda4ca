//! Decode cost of Retell events. The headline figure is `response_required_10_utterances`:
//! compare it with `python3 benches/python_json.py`, which times `json.loads` on the same file.

use voxgate_retell::{RetellEvent, ServerEvent};

#[global_allocator]
static ALLOC: divan::AllocProfiler = divan::AllocProfiler::system();

const TEN_UTTERANCES: &str = include_str!("../tests/data/response_required_10_utterances.json");
const PING: &str = include_str!("../tests/data/retell/ping_pong.json");
const CHUNK: &str = include_str!("../tests/data/server/response_chunk.json");

fn main() {
    divan::main();
}

/// The benchmark the issue asks for: a 10-utterance transcript with word timings, from a
/// `&str` (what a WebSocket text frame is).
#[divan::bench]
fn response_required_10_utterances() -> RetellEvent {
    RetellEvent::from_json(divan::black_box(TEN_UTTERANCES))
        .unwrap_or_else(|e| unreachable!("golden file decodes: {e}"))
}

/// The same from raw bytes, which adds one UTF-8 validation of the whole frame.
#[divan::bench]
fn response_required_10_utterances_from_bytes() -> RetellEvent {
    RetellEvent::from_slice(divan::black_box(TEN_UTTERANCES.as_bytes()))
        .unwrap_or_else(|e| unreachable!("golden file decodes: {e}"))
}

/// The same frame with one number in exponent form (`4e-1`), which the single-pass reader
/// leaves to serde at the first word: what any frame it does not take costs.
#[divan::bench]
fn response_required_10_utterances_serde_fallback(bencher: divan::Bencher<'_, '_>) {
    let text = TEN_UTTERANCES.replacen(r#""start":0.4,"#, r#""start":4e-1,"#, 1);
    assert_ne!(
        text, TEN_UTTERANCES,
        "the golden file changed: pick another number"
    );
    bencher.bench(|| {
        RetellEvent::from_json(divan::black_box(&text))
            .unwrap_or_else(|e| unreachable!("golden file decodes: {e}"))
    });
}

/// The same bytes into an untyped `serde_json::Value`, for scale.
#[divan::bench]
fn response_required_10_utterances_as_value() -> serde_json::Value {
    serde_json::from_str(divan::black_box(TEN_UTTERANCES))
        .unwrap_or_else(|e| unreachable!("golden file decodes: {e}"))
}

/// The most frequent event (every 2 s).
#[divan::bench]
fn ping_pong() -> RetellEvent {
    RetellEvent::from_slice(divan::black_box(PING.as_bytes()))
        .unwrap_or_else(|e| unreachable!("golden file decodes: {e}"))
}

/// What a Retell-side test tool decodes most.
#[divan::bench]
fn server_response_chunk() -> ServerEvent {
    ServerEvent::from_slice(divan::black_box(CHUNK.as_bytes()))
        .unwrap_or_else(|e| unreachable!("golden file decodes: {e}"))
}
