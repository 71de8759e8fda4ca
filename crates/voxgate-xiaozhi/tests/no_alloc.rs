//! The audio path does not allocate: decoding and encoding frames into reserved buffers is
//! checked with a counting global allocator.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bytes::{Bytes, BytesMut};
use voxgate_test_support::{CountingAllocator, allocations_during};
use voxgate_xiaozhi::frame::{Frame, FrameCodec, ProtocolVersion};

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

#[test]
fn frame_decode_and_encode_do_not_allocate() {
    let opus: Vec<u8> = (0..120u8).collect();
    for version in ProtocolVersion::ALL {
        let codec = FrameCodec::new(version);
        let stamp = u32::from(version.has_timestamp()) * 1234;
        let frame = Frame::opus_at(stamp, &opus);
        let mut out = Vec::with_capacity(codec.max_frame_len());
        let mut slice = vec![0u8; codec.max_frame_len()];
        let mut payload = vec![0u8; codec.max_payload_len()];
        let mut bytes_mut = BytesMut::with_capacity(codec.max_frame_len());

        let count = allocations_during(|| {
            for _ in 0..100 {
                out.clear();
                codec.encode(&frame, &mut out).unwrap();
                let decoded = codec.decode(&out).unwrap();
                assert_eq!(decoded, frame);
                let header = codec.decode_header(&out).unwrap();
                assert_eq!(header.payload_len, opus.len());
                let written = codec.encode_to_slice(&frame, &mut slice).unwrap();
                let header = codec.decode_into(&slice[..written], &mut payload).unwrap();
                assert_eq!(&payload[..header.payload_len], &opus[..]);
                bytes_mut.clear();
                codec.encode(&frame, &mut bytes_mut).unwrap();
            }
        });
        assert_eq!(count, 0, "{version:?} allocated");

        // Slicing a shared message bumps a reference count; it does not copy or allocate.
        // (`Bytes::from(Vec)` promotes itself to a shared buffer on its first clone: do that
        // once up front, as a socket library's buffer already is.)
        let shared = Bytes::from(out.clone());
        drop(shared.clone());
        let count = allocations_during(|| {
            for _ in 0..100 {
                let frame = codec.decode_shared(&shared).unwrap();
                assert_eq!(frame.payload.len(), opus.len());
            }
        });
        assert_eq!(count, 0, "{version:?} decode_shared allocated");
    }
}

#[test]
fn the_counter_sees_allocations() {
    // Guards against a counter that silently counts nothing.
    let count = allocations_during(|| {
        let v: Vec<u8> = Vec::with_capacity(std::hint::black_box(64));
        std::hint::black_box(v);
    });
    assert_eq!(count, 1);
}
