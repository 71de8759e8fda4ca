//! An OpenAI-compatible chat-completions stream (SSE body of JSON chunks) through the decoder
//! the provider uses. The first byte picks a chunk size. Decoding never panics; the
//! events do not depend on the chunking; a stream ends in exactly one `Done` or `Error`, last;
//! and the text and tool arguments it yields are never longer than the body.
#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use voxgate_providers::LlmEvent;
use voxgate_providers::fuzzing::ChunkDecoder;

fn names() -> HashMap<String, String> {
    HashMap::from([(
        "self_audio_speaker_set_volume".to_owned(),
        "self.audio_speaker.set_volume".to_owned(),
    )])
}

/// What `OpenAiChat`'s stream yields for `body` arriving in `piece`-byte chunks.
fn run(body: &[u8], piece: usize) -> Vec<LlmEvent> {
    let mut decoder = ChunkDecoder::new(names());
    let mut events = Vec::new();
    for piece in body.chunks(piece.max(1)) {
        decoder.feed(piece);
        events.extend(std::iter::from_fn(|| decoder.pop_event()));
    }
    decoder.finish();
    events.extend(std::iter::from_fn(|| decoder.pop_event()));
    assert!(decoder.is_done());
    events
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let whole = run(body, body.len());
    let piece = match selector {
        0..=127 => usize::from(selector) + 1,
        _ => (usize::from(selector) - 127) * 4096,
    };
    assert_eq!(
        whole,
        run(body, piece),
        "chunking changed the events (piece {piece})"
    );

    let terminal = |e: &LlmEvent| matches!(e, LlmEvent::Done { .. } | LlmEvent::Error(_));
    let ends = whole.iter().filter(|e| terminal(e)).count();
    assert_eq!(ends, 1, "a stream ends exactly once: {whole:?}");
    assert!(
        whole.last().is_some_and(terminal),
        "the end is the last event"
    );
    let mut produced = 0;
    for event in &whole {
        match event {
            LlmEvent::TextDelta(text) => {
                assert!(!text.is_empty(), "empty text delta");
                produced += text.len();
            }
            LlmEvent::ToolCall(call) => {
                assert!(!call.id.is_empty(), "tool call without id");
                produced += call.arguments.len();
            }
            _ => {}
        }
    }
    assert!(produced <= body.len(), "more text than the body held");
});
