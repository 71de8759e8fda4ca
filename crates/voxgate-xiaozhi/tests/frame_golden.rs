//! Golden byte vectors for every framing version, decoded and re-encoded byte-exact, and the
//! error cases a peer can produce.
// Test helpers outside #[test] fns are not covered by clippy.toml's test exemptions.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bytes::Bytes;
use voxgate_xiaozhi::frame::{
    DEVICE_MAX_FRAME_LEN, DecodeError, EncodeError, Frame, FrameCodec, FrameHeader, FrameType,
    ProtocolVersion, UnsupportedVersion,
};

const PAYLOAD: [u8; 4] = [0x58, 0x00, 0x01, 0x02];

/// The two worked examples of the protocol notes.
const V2_EXAMPLE: [u8; 20] = [
    0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0xd2, 0x00, 0x00, 0x00, 0x04,
    0x58, 0x00, 0x01, 0x02,
];
const V3_EXAMPLE: [u8; 8] = [0x00, 0x00, 0x00, 0x04, 0x58, 0x00, 0x01, 0x02];

fn codec(version: ProtocolVersion) -> FrameCodec {
    FrameCodec::new(version)
}

fn golden(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/data/frames/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Decodes `bytes`, checks the frame, and re-encodes it to the same bytes through every API.
fn check_golden(version: ProtocolVersion, bytes: &[u8], expected: Frame<'_>) {
    let codec = codec(version);
    let frame = codec.decode(bytes).unwrap();
    assert_eq!(frame, expected);

    let mut vec = Vec::new();
    codec.encode(&expected, &mut vec).unwrap();
    assert_eq!(vec, bytes, "encode into Vec");

    let mut slice = vec![0u8; bytes.len() + 3];
    let written = codec.encode_to_slice(&expected, &mut slice).unwrap();
    assert_eq!(&slice[..written], bytes, "encode into slice");

    let mut payload = vec![0u8; codec.max_payload_len()];
    let header = codec.decode_into(bytes, &mut payload).unwrap();
    assert_eq!(header, expected.header());
    assert_eq!(&payload[..header.payload_len], expected.payload);

    let shared = codec.decode_shared(&Bytes::copy_from_slice(bytes)).unwrap();
    assert_eq!(shared.as_frame(), expected);

    assert_eq!(codec.decode_header(bytes).unwrap(), expected.header());
    assert_eq!(codec.encoded_len(expected.payload.len()), bytes.len());
}

#[test]
fn v1_golden() {
    assert_eq!(golden("v1_opus.bin"), PAYLOAD);
    check_golden(ProtocolVersion::V1, &PAYLOAD, Frame::opus(&PAYLOAD));
    check_golden(ProtocolVersion::V1, &[], Frame::opus(&[]));
}

#[test]
fn v2_golden_matches_the_notes_example() {
    assert_eq!(golden("v2_opus_ts1234.bin"), V2_EXAMPLE);
    check_golden(
        ProtocolVersion::V2,
        &V2_EXAMPLE,
        Frame::opus_at(1234, &PAYLOAD),
    );
}

#[test]
fn v2_golden_other_types_and_reserved_are_data() {
    let json = golden("v2_json_type.bin");
    check_golden(
        ProtocolVersion::V2,
        &json,
        Frame {
            frame_type: FrameType::JSON,
            reserved: 0,
            timestamp: 0,
            payload: b"{\"type\":\"x\"}\n",
        },
    );
    let odd = golden("v2_unknown_type_reserved.bin");
    check_golden(
        ProtocolVersion::V2,
        &odd,
        Frame {
            frame_type: FrameType(0x1234),
            reserved: 0xdead_beef,
            timestamp: u32::MAX,
            payload: &[0xaa, 0xbb],
        },
    );
    let empty = golden("v2_empty_payload.bin");
    check_golden(ProtocolVersion::V2, &empty, Frame::opus_at(60, &[]));
}

#[test]
fn v3_golden_matches_the_notes_example() {
    assert_eq!(golden("v3_opus.bin"), V3_EXAMPLE);
    check_golden(ProtocolVersion::V3, &V3_EXAMPLE, Frame::opus(&PAYLOAD));
}

#[test]
fn v3_golden_other_types_and_reserved_are_data() {
    let odd = golden("v3_unknown_type_reserved.bin");
    check_golden(
        ProtocolVersion::V3,
        &odd,
        Frame {
            frame_type: FrameType(0xff),
            reserved: 0x7f,
            timestamp: 0,
            payload: &[1, 2, 3],
        },
    );
    let opus = golden("v3_opus_120.bin");
    check_golden(ProtocolVersion::V3, &opus, Frame::opus(&opus[4..]));
}

#[test]
fn byte_order_is_big_endian() {
    // One public server writes v2/v3 little-endian; such a frame must not decode as ours.
    let mut little = V3_EXAMPLE;
    little[2..4].copy_from_slice(&4u16.to_le_bytes());
    assert_eq!(
        codec(ProtocolVersion::V3).decode(&little),
        Err(DecodeError::SizeMismatch {
            version: ProtocolVersion::V3,
            declared: 1024,
            actual: 4
        })
    );
}

#[test]
fn short_headers_are_rejected() {
    for len in 0..16 {
        assert_eq!(
            codec(ProtocolVersion::V2).decode(&V2_EXAMPLE[..len]),
            Err(DecodeError::ShortHeader {
                version: ProtocolVersion::V2,
                header_len: 16,
                len
            })
        );
    }
    for len in 0..4 {
        assert_eq!(
            codec(ProtocolVersion::V3).decode(&V3_EXAMPLE[..len]),
            Err(DecodeError::ShortHeader {
                version: ProtocolVersion::V3,
                header_len: 4,
                len
            })
        );
    }
}

#[test]
fn size_mismatch_is_rejected_both_ways() {
    // Fewer payload bytes than declared (truncated frame).
    assert_eq!(
        codec(ProtocolVersion::V2).decode(&V2_EXAMPLE[..19]),
        Err(DecodeError::SizeMismatch {
            version: ProtocolVersion::V2,
            declared: 4,
            actual: 3
        })
    );
    assert_eq!(
        codec(ProtocolVersion::V3).decode(&V3_EXAMPLE[..6]),
        Err(DecodeError::SizeMismatch {
            version: ProtocolVersion::V3,
            declared: 4,
            actual: 2
        })
    );
    // More bytes than declared (trailing garbage).
    let mut long = V2_EXAMPLE.to_vec();
    long.push(0xff);
    assert_eq!(
        codec(ProtocolVersion::V2).decode(&long),
        Err(DecodeError::SizeMismatch {
            version: ProtocolVersion::V2,
            declared: 4,
            actual: 5
        })
    );
    let mut long = V3_EXAMPLE.to_vec();
    long.extend_from_slice(&[0, 0]);
    assert_eq!(
        codec(ProtocolVersion::V3).decode(&long),
        Err(DecodeError::SizeMismatch {
            version: ProtocolVersion::V3,
            declared: 4,
            actual: 6
        })
    );
    // A hostile size that would overflow a naive `header + size` computation.
    let mut huge = V2_EXAMPLE;
    huge[12..16].copy_from_slice(&u32::MAX.to_be_bytes());
    assert_eq!(
        codec(ProtocolVersion::V2).decode(&huge),
        Err(DecodeError::SizeMismatch {
            version: ProtocolVersion::V2,
            declared: u64::from(u32::MAX),
            actual: 4
        })
    );
}

#[test]
fn unknown_versions_are_typed_errors() {
    assert_eq!(
        ProtocolVersion::from_number(0),
        Err(UnsupportedVersion::Number(0))
    );
    assert_eq!(
        ProtocolVersion::from_number(4),
        Err(UnsupportedVersion::Number(4))
    );
    assert!(ProtocolVersion::from_header("").is_err());
    assert!(ProtocolVersion::from_header("2.0").is_err());
    assert_eq!(ProtocolVersion::from_header("1"), Ok(ProtocolVersion::V1));
    // The v2 header's own version field must agree with the connection's version.
    let mut v3_in_v2 = V2_EXAMPLE;
    v3_in_v2[1] = 3;
    assert_eq!(
        codec(ProtocolVersion::V2).decode(&v3_in_v2),
        Err(DecodeError::HeaderVersionMismatch { found: 3 })
    );
}

#[test]
fn oversize_frames_are_rejected() {
    // v3 cannot express a payload above u16::MAX.
    let big = vec![0u8; 65_536];
    let unbounded = codec(ProtocolVersion::V3).with_max_frame_len(usize::MAX);
    assert_eq!(
        unbounded.encode(&Frame::opus(&big), &mut Vec::new()),
        Err(EncodeError::FrameTooLarge {
            version: ProtocolVersion::V3,
            len: 65_540,
            max: 65_539
        })
    );
    let max = vec![0u8; 65_535];
    let mut out = Vec::new();
    unbounded.encode(&Frame::opus(&max), &mut out).unwrap();
    assert_eq!(&out[..4], [0, 0, 0xff, 0xff]);
    assert_eq!(unbounded.decode(&out).unwrap().payload.len(), 65_535);

    // The device limit: 65 535 bytes per frame, header included, in both directions.
    let device = codec(ProtocolVersion::V3);
    assert_eq!(
        device.encode(&Frame::opus(&max), &mut Vec::new()),
        Err(EncodeError::FrameTooLarge {
            version: ProtocolVersion::V3,
            len: 65_539,
            max: 65_535
        })
    );
    assert_eq!(
        device.decode(&out),
        Err(DecodeError::FrameTooLarge {
            len: 65_539,
            max: DEVICE_MAX_FRAME_LEN
        })
    );
    let v1 = vec![0u8; DEVICE_MAX_FRAME_LEN + 1];
    assert_eq!(
        codec(ProtocolVersion::V1).decode(&v1),
        Err(DecodeError::FrameTooLarge {
            len: 65_536,
            max: 65_535
        })
    );
    assert!(
        codec(ProtocolVersion::V2)
            .encode(&Frame::opus(&v1), &mut Vec::new())
            .is_err()
    );
}

#[test]
fn fields_a_version_cannot_carry_are_caller_errors() {
    let stamped = Frame::opus_at(5, &PAYLOAD);
    for version in [ProtocolVersion::V1, ProtocolVersion::V3] {
        assert_eq!(
            codec(version).encode(&stamped, &mut Vec::new()),
            Err(EncodeError::Unrepresentable {
                version,
                field: "timestamp",
                value: 5
            })
        );
    }
    let wide_type = Frame {
        frame_type: FrameType(256),
        ..Frame::opus(&PAYLOAD)
    };
    assert!(matches!(
        codec(ProtocolVersion::V3).encode(&wide_type, &mut Vec::new()),
        Err(EncodeError::Unrepresentable { field: "type", .. })
    ));
    assert!(matches!(
        codec(ProtocolVersion::V1).encode(&wide_type, &mut Vec::new()),
        Err(EncodeError::Unrepresentable { field: "type", .. })
    ));
    let wide_reserved = Frame {
        reserved: 256,
        ..Frame::opus(&PAYLOAD)
    };
    assert!(matches!(
        codec(ProtocolVersion::V3).encode(&wide_reserved, &mut Vec::new()),
        Err(EncodeError::Unrepresentable {
            field: "reserved",
            ..
        })
    ));
}

#[test]
fn decode_into_a_short_buffer_is_reported() {
    let mut small = [0u8; 3];
    assert_eq!(
        codec(ProtocolVersion::V3).decode_into(&V3_EXAMPLE, &mut small),
        Err(DecodeError::BufferTooSmall {
            needed: 4,
            available: 3
        })
    );
}

#[test]
fn header_decodes_from_a_prefix_for_incremental_reads() {
    let codec = codec(ProtocolVersion::V2);
    let header = codec.decode_header(&V2_EXAMPLE[..16]).unwrap();
    assert_eq!(
        header,
        FrameHeader {
            frame_type: FrameType::OPUS,
            reserved: 0,
            timestamp: 1234,
            payload_len: 4
        }
    );
    assert_eq!(codec.header_len() + header.payload_len, V2_EXAMPLE.len());
}
