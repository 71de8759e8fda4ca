//! Audio frames are decoded and encoded without heap allocations beyond the frame buffer, and
//! decoded audio shares the frame's memory.

#![allow(clippy::unwrap_used, clippy::panic, reason = "test code")]

use bytes::{Bytes, BytesMut};
use voxgate_realtime::proto::InferenceTriggerMode;
use voxgate_realtime::proto::client_bound_message::Payload as C;
use voxgate_realtime::proto::service_bound_message::Payload as S;
use voxgate_realtime::proto::user_input::Input;
use voxgate_realtime::{ClientBoundMessage, ServiceBoundMessage};
use voxgate_test_support::{CountingAllocator, measure};

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// Runs `f` and returns its result with the number of allocations it made on this thread.
fn allocations<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let (out, stats) = measure(f);
    (out, stats.count)
}

fn audio() -> Vec<u8> {
    (0..640u32).map(|i| (i % 251).to_le_bytes()[0]).collect()
}

/// A frame whose buffer is already reference-counted, as WebSocket libraries hand them out.
fn shared(frame: Bytes) -> Bytes {
    // Cloning promotes a Vec-backed `Bytes` to its shared representation (one allocation);
    // dropping the clone keeps that representation.
    drop(frame.clone());
    frame
}

/// True when `inner` lies within `outer`'s memory.
fn borrows(outer: &Bytes, inner: &Bytes) -> bool {
    let range = outer.as_ptr_range();
    let inner = inner.as_ptr_range();
    range.start <= inner.start && inner.end <= range.end
}

#[test]
fn audio_user_input_decodes_without_allocating_or_copying() {
    let msg = ServiceBoundMessage::user_audio(7, InferenceTriggerMode::Immediate, audio().into());
    let frame = shared(msg.to_frame());

    let (decoded, n) = allocations(|| ServiceBoundMessage::decode_frame(frame.clone()).unwrap());
    assert_eq!(n, 0, "decoding allocated");

    let Some(S::UserInput(input)) = &decoded.payload else {
        panic!("{decoded:?}")
    };
    let Some(Input::AudioData(data)) = &input.input else {
        panic!()
    };
    assert_eq!(data.data[..], audio()[..]);
    assert!(
        borrows(&frame, &data.data),
        "the audio was copied out of the frame"
    );
    // The audio is the frame's tail: the 640 bytes after the envelope's headers.
    assert_eq!(
        data.data.as_ptr(),
        frame[frame.len() - 640..].as_ptr(),
        "the audio does not point into the frame"
    );
}

#[test]
fn vec_backed_frames_cost_at_most_the_shared_header() {
    let frame =
        ServiceBoundMessage::user_audio(1, InferenceTriggerMode::Queue, audio().into()).to_frame();
    let owned = Bytes::from(frame.to_vec());
    // `bytes` allocates a reference-count header the first time a Vec-backed buffer is shared;
    // that belongs to the buffer, not to decoding, and happens at most once.
    let (decoded, n) = allocations(|| ServiceBoundMessage::decode_frame(owned.clone()).unwrap());
    assert!(n <= 1, "{n} allocations");
    let Some(S::UserInput(input)) = &decoded.payload else {
        panic!()
    };
    let Some(Input::AudioData(data)) = &input.input else {
        panic!()
    };
    assert!(borrows(&owned, &data.data));
}

#[test]
fn audio_user_input_encodes_without_allocating() {
    // prost appends a `Bytes` field by cloning it, which would promote a Vec-backed buffer (the
    // one-time header again); audio arriving from a decoder or network stack is shared already.
    let audio = shared(audio().into());
    let msg = ServiceBoundMessage::user_audio(7, InferenceTriggerMode::Immediate, audio);
    let mut buf = BytesMut::with_capacity(1024);
    let ((), n) = allocations(|| {
        buf.clear();
        msg.encode_frame(&mut buf).unwrap();
    });
    assert_eq!(n, 0, "encoding into a buffer with room allocated");
    assert_eq!(buf.freeze(), msg.to_frame());

    let (frame, n) = allocations(|| msg.to_frame());
    assert_eq!(n, 1, "to_frame allocates exactly its output");
    // 640 bytes of audio plus 13 of framing: three length-delimited headers of 3 bytes each
    // (key and two-byte length) and two 2-byte varint fields (packet_id, mode).
    assert_eq!(frame.len(), 640 + 13);
}

#[test]
fn model_audio_chunk_round_trips_without_allocating() {
    let msg = ClientBoundMessage::model_audio_chunk(audio().into(), Some(3));
    let frame = shared(msg.to_frame());
    let (decoded, n) = allocations(|| ClientBoundMessage::decode_frame(frame.clone()).unwrap());
    assert_eq!(n, 0, "decoding allocated");
    let Some(C::ModelAudioChunk(chunk)) = &decoded.payload else {
        panic!()
    };
    assert!(borrows(&frame, &chunk.audio.as_ref().unwrap().data));

    let mut buf = BytesMut::with_capacity(1024);
    let (result, n) = allocations(|| decoded.encode_frame(&mut buf));
    result.unwrap();
    assert_eq!(n, 0, "encoding allocated");
    assert_eq!(buf.freeze(), frame);
}
