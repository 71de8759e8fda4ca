//! Arbitrary bytes as a Xiaozhi binary frame in every protocol version. Decoding must never
//! panic; a frame that decodes must re-encode to exactly the same bytes, through every API.
#![no_main]

use libfuzzer_sys::fuzz_target;
use voxgate_xiaozhi::bytes::Bytes;
use voxgate_xiaozhi::frame::{FrameCodec, ProtocolVersion};

fuzz_target!(|data: &[u8]| {
    for version in ProtocolVersion::ALL {
        let codec = FrameCodec::new(version);
        let header = codec.decode_header(data);
        let Ok(frame) = codec.decode(data) else {
            assert!(codec.decode_shared(&Bytes::copy_from_slice(data)).is_err());
            continue;
        };
        assert_eq!(header, Ok(frame.header()));

        let mut wire = Vec::with_capacity(codec.max_frame_len());
        codec
            .encode(&frame, &mut wire)
            .expect("a decoded frame re-encodes");
        assert_eq!(wire, data);

        let mut slice = vec![0u8; data.len()];
        let written = codec
            .encode_to_slice(&frame, &mut slice)
            .expect("fits exactly");
        assert_eq!(&slice[..written], data);

        let mut payload = vec![0u8; codec.max_payload_len()];
        let copied = codec
            .decode_into(data, &mut payload)
            .expect("decodes again");
        assert_eq!(&payload[..copied.payload_len], frame.payload);

        let shared = codec
            .decode_shared(&Bytes::copy_from_slice(data))
            .expect("decodes again");
        assert_eq!(shared.as_frame(), frame);
    }
});
