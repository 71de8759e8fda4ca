//! The `text/event-stream` decoder on an arbitrary body. The first byte picks a chunk size:
//! the body fed whole and fed in chunks must give the same events and the same verdict (a
//! server's chunking is not ours to see), and no event carries more data than the body held.
#![no_main]

use libfuzzer_sys::fuzz_target;
use voxgate_providers::sse::SseDecoder;

fn decode(body: &[u8], piece: usize) -> (Vec<String>, bool) {
    let mut decoder = SseDecoder::new();
    let mut out = Vec::new();
    for chunk in body.chunks(piece.max(1)) {
        if decoder.feed(chunk, &mut out).is_err() {
            return (out, false);
        }
    }
    let ok = decoder.finish(&mut out).is_ok();
    (out, ok)
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let whole = decode(body, body.len());
    // Small pieces split lines, CRLFs and UTF-8 sequences; large ones stress the line buffer.
    let piece = match selector {
        0..=127 => usize::from(selector) + 1,
        _ => (usize::from(selector) - 127) * 4096,
    };
    let pieces = decode(body, piece);
    assert_eq!(whole, pieces, "chunking changed the events (piece {piece})");
    let (events, _) = whole;
    let lines = body.iter().filter(|&&b| b == b'\n').count() + 1;
    assert!(events.len() <= lines, "more events than lines");
    let total: usize = events.iter().map(String::len).sum();
    assert!(total <= body.len(), "events hold more data than the body");
});
