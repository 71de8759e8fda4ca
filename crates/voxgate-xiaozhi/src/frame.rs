//! Binary audio framing: protocol versions 1, 2 and 3.
//!
//! Every WebSocket binary message carries exactly one frame. The framing version is not negotiated
//! in the hello: the device learns it from the OTA response (`websocket.version`), announces it in
//! the `Protocol-Version` upgrade header and uses it in both directions for the whole connection.
//! A server therefore builds one [`FrameCodec`] per connection and uses it for every frame.
//!
//! | version | header (big-endian)                                                       |
//! |---------|---------------------------------------------------------------------------|
//! | 1       | none: the message is one Opus packet                                      |
//! | 2       | `version u16` `type u16` `reserved u32` `timestamp u32` `payload_size u32` |
//! | 3       | `type u8` `reserved u8` `payload_size u16`                                 |
//!
//! Decoding borrows the payload from the received message ([`FrameCodec::decode`]), copies it into
//! a caller-owned buffer ([`FrameCodec::decode_into`]) or slices a shared [`Bytes`]
//! ([`FrameCodec::decode_shared`]); encoding appends to any [`BufMut`] or writes into a slice. None
//! of these allocate, which keeps the per-frame audio path free of the allocator.
//!
//! The firmware trusts `payload_size` without a bounds check, so [`FrameCodec::encode`] derives it
//! from the payload and can never emit a wrong size; on receive a wrong size is a typed error.

use std::fmt;

use bytes::{BufMut, Bytes};

/// The largest WebSocket message the firmware sends or accepts, header included.
///
/// The device never fragments and caps a frame at 65 535 bytes; a [`FrameCodec`] enforces this
/// limit in both directions unless configured otherwise with [`FrameCodec::with_max_frame_len`].
pub const DEVICE_MAX_FRAME_LEN: usize = 65_535;

/// Length of the version 2 header in bytes.
pub const V2_HEADER_LEN: usize = 16;

/// Length of the version 3 header in bytes.
pub const V3_HEADER_LEN: usize = 4;

/// The longest header of any version; a buffer this long holds any header.
pub const MAX_HEADER_LEN: usize = V2_HEADER_LEN;

/// A binary framing version, fixed for the lifetime of a connection.
///
/// Parse it from the `Protocol-Version` upgrade header with [`ProtocolVersion::from_header`] or
/// from a number with [`ProtocolVersion::from_number`]; unknown versions are an
/// [`UnsupportedVersion`] error, never a panic. It serializes as the bare JSON number the OTA
/// response and the hello carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[non_exhaustive]
pub enum ProtocolVersion {
    /// Version 1: the binary message is exactly one Opus packet, with no header.
    #[default]
    V1,
    /// Version 2: a 16-byte header with a frame type and a millisecond timestamp.
    V2,
    /// Version 3: a 4-byte header with a frame type and the payload size.
    V3,
}

impl ProtocolVersion {
    /// Every supported version, oldest first.
    pub const ALL: [ProtocolVersion; 3] = [Self::V1, Self::V2, Self::V3];

    /// The version with wire number `number`.
    ///
    /// # Errors
    ///
    /// [`UnsupportedVersion`] when `number` is not 1, 2 or 3.
    pub const fn from_number(number: u64) -> Result<Self, UnsupportedVersion> {
        match number {
            1 => Ok(Self::V1),
            2 => Ok(Self::V2),
            3 => Ok(Self::V3),
            _ => Err(UnsupportedVersion::Number(number)),
        }
    }

    /// Parses the value of a `Protocol-Version` header (surrounding whitespace is ignored).
    ///
    /// # Errors
    ///
    /// [`UnsupportedVersion`] when the value is not a decimal 1, 2 or 3.
    pub fn from_header(value: &str) -> Result<Self, UnsupportedVersion> {
        let trimmed = value.trim();
        match trimmed.parse::<u64>() {
            Ok(number) => Self::from_number(number),
            Err(_) => Err(UnsupportedVersion::Text(trimmed.to_owned())),
        }
    }

    /// The wire number of this version (1, 2 or 3).
    pub const fn number(self) -> u8 {
        match self {
            Self::V1 => 1,
            Self::V2 => 2,
            Self::V3 => 3,
        }
    }

    /// The length of this version's frame header in bytes (0 for version 1).
    pub const fn header_len(self) -> usize {
        match self {
            Self::V1 => 0,
            Self::V2 => V2_HEADER_LEN,
            Self::V3 => V3_HEADER_LEN,
        }
    }

    /// Whether frames of this version carry a timestamp (only version 2 does).
    pub const fn has_timestamp(self) -> bool {
        matches!(self, Self::V2)
    }

    /// The largest payload the header's `payload_size` field can express.
    ///
    /// Version 1 has no size field; its bound is the WebSocket message itself.
    pub const fn max_encodable_payload(self) -> u64 {
        match self {
            Self::V1 | Self::V2 => u32::MAX as u64,
            Self::V3 => u16::MAX as u64,
        }
    }
}

impl fmt::Display for ProtocolVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.number())
    }
}

impl TryFrom<u64> for ProtocolVersion {
    type Error = UnsupportedVersion;

    fn try_from(number: u64) -> Result<Self, Self::Error> {
        Self::from_number(number)
    }
}

impl std::str::FromStr for ProtocolVersion {
    type Err = UnsupportedVersion;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::from_header(s)
    }
}

impl serde::Serialize for ProtocolVersion {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u8(self.number())
    }
}

impl<'de> serde::Deserialize<'de> for ProtocolVersion {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let number = crate::lenient::deserialize_u64(deserializer)?;
        Self::from_number(number).map_err(serde::de::Error::custom)
    }
}

/// A framing version this crate does not know.
///
/// Blame: the peer (or the configuration that announced the version).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UnsupportedVersion {
    /// A numeric version other than 1, 2 or 3.
    #[error("unsupported binary protocol version {0} (expected 1, 2 or 3)")]
    Number(u64),
    /// A `Protocol-Version` header value that is not a number.
    #[error("unsupported binary protocol version {0:?} (expected 1, 2 or 3)")]
    Text(String),
}

/// The `type` field of a version 2 or 3 header.
///
/// A newtype rather than an enum so that values this crate does not know are carried as data.
/// The firmware only sends [`FrameType::OPUS`] and ignores the field on receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct FrameType(pub u16);

impl FrameType {
    /// An Opus packet (0).
    pub const OPUS: Self = Self(0);
    /// A JSON text (1): documented for version 2, never sent by the firmware.
    pub const JSON: Self = Self(1);

    /// The raw wire value.
    pub const fn get(self) -> u16 {
        self.0
    }

    /// Whether this is [`FrameType::OPUS`].
    pub const fn is_opus(self) -> bool {
        self.0 == Self::OPUS.0
    }
}

impl fmt::Display for FrameType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::OPUS => f.write_str("opus"),
            Self::JSON => f.write_str("json"),
            Self(other) => write!(f, "type {other}"),
        }
    }
}

/// The metadata of one frame: everything except the payload bytes.
///
/// Fields a version does not carry are zero when decoded and must be zero when encoded (version 1
/// carries none; version 3 has no timestamp and 8-bit `type` and `reserved`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FrameHeader {
    /// The frame type (version 2 and 3).
    pub frame_type: FrameType,
    /// The reserved field, kept as data (`u32` in version 2, `u8` in version 3; 0 by convention).
    pub reserved: u32,
    /// Milliseconds (version 2 only).
    ///
    /// The device stamps each uplink frame with the timestamp of the downlink frame that was
    /// playing when the microphone captured it (0 when nothing played), which lets a server line
    /// up the echo reference for acoustic echo cancellation.
    pub timestamp: u32,
    /// Payload length in bytes: the declared `payload_size` for versions 2 and 3, the message
    /// length for version 1.
    pub payload_len: usize,
}

/// One decoded or to-be-encoded frame, borrowing its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Frame<'a> {
    /// The frame type (version 2 and 3); [`FrameType::OPUS`] by default.
    pub frame_type: FrameType,
    /// The reserved header field, kept as data; 0 by default.
    pub reserved: u32,
    /// The version 2 timestamp in milliseconds; must be 0 for other versions.
    pub timestamp: u32,
    /// The payload: normally one Opus packet.
    pub payload: &'a [u8],
}

impl<'a> Frame<'a> {
    /// An Opus frame without a timestamp, valid in every version.
    pub const fn opus(payload: &'a [u8]) -> Self {
        Self {
            frame_type: FrameType::OPUS,
            reserved: 0,
            timestamp: 0,
            payload,
        }
    }

    /// An Opus frame stamped with `timestamp` milliseconds (version 2 only).
    pub const fn opus_at(timestamp: u32, payload: &'a [u8]) -> Self {
        Self {
            frame_type: FrameType::OPUS,
            reserved: 0,
            timestamp,
            payload,
        }
    }

    /// The header describing this frame.
    pub const fn header(&self) -> FrameHeader {
        FrameHeader {
            frame_type: self.frame_type,
            reserved: self.reserved,
            timestamp: self.timestamp,
            payload_len: self.payload.len(),
        }
    }
}

/// A decoded frame whose payload is a zero-copy slice of a shared [`Bytes`] message.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct SharedFrame {
    /// The frame's metadata.
    pub header: FrameHeader,
    /// The payload, sharing the received message's allocation.
    pub payload: Bytes,
}

impl SharedFrame {
    /// A borrowed view of this frame, e.g. to re-encode it.
    pub fn as_frame(&self) -> Frame<'_> {
        Frame {
            frame_type: self.header.frame_type,
            reserved: self.header.reserved,
            timestamp: self.header.timestamp,
            payload: &self.payload,
        }
    }
}

/// Why a received binary message is not a valid frame.
///
/// Blame: the peer, except [`DecodeError::BufferTooSmall`], which is the caller's (the buffer
/// passed to [`FrameCodec::decode_into`] is shorter than the codec's maximum payload).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The message is shorter than the version's header.
    #[error("frame of {len} bytes is shorter than the {header_len}-byte v{version} header")]
    ShortHeader {
        /// The framing version in use.
        version: ProtocolVersion,
        /// The header length of that version.
        header_len: usize,
        /// The length of the received message.
        len: usize,
    },
    /// `payload_size` disagrees with the number of bytes after the header (either way).
    #[error("v{version} header declares a {declared}-byte payload but {actual} bytes follow it")]
    SizeMismatch {
        /// The framing version in use.
        version: ProtocolVersion,
        /// The header's `payload_size`.
        declared: u64,
        /// The bytes actually present after the header.
        actual: usize,
    },
    /// The message is longer than the codec's maximum frame length.
    #[error("frame of {len} bytes exceeds the {max}-byte limit")]
    FrameTooLarge {
        /// The length of the received message.
        len: usize,
        /// The codec's limit ([`DEVICE_MAX_FRAME_LEN`] by default).
        max: usize,
    },
    /// A version 2 header whose own `version` field is not 2.
    #[error("v2 header carries version field {found}")]
    HeaderVersionMismatch {
        /// The value of the header's `version` field.
        found: u16,
    },
    /// The caller's output buffer cannot hold the payload (caller's fault).
    #[error("payload of {needed} bytes does not fit the {available}-byte output buffer")]
    BufferTooSmall {
        /// The payload length.
        needed: usize,
        /// The output buffer length.
        available: usize,
    },
}

/// Why a frame cannot be encoded. Blame: always the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// The encoded frame would exceed the codec's maximum frame length (or the version's
    /// `payload_size` field).
    #[error("encoded v{version} frame of {len} bytes exceeds the {max}-byte limit")]
    FrameTooLarge {
        /// The framing version in use.
        version: ProtocolVersion,
        /// Header plus payload length.
        len: u64,
        /// The largest frame allowed.
        max: u64,
    },
    /// A header field is set that this version cannot carry (e.g. a timestamp in version 3).
    #[error("v{version} frames cannot carry {field} = {value}")]
    Unrepresentable {
        /// The framing version in use.
        version: ProtocolVersion,
        /// The field's name.
        field: &'static str,
        /// The value that does not fit.
        value: u32,
    },
    /// The output slice is too short for the encoded frame.
    #[error("encoded frame of {needed} bytes does not fit the {available}-byte output")]
    BufferTooSmall {
        /// Header plus payload length.
        needed: usize,
        /// The space available.
        available: usize,
    },
}

/// Encodes and decodes frames of one [`ProtocolVersion`].
///
/// Create one per connection from the `Protocol-Version` header. The codec is `Copy` and holds no
/// state, so it can be shared freely between the read and write halves of a socket.
///
/// ```
/// use voxgate_xiaozhi::frame::{Frame, FrameCodec, ProtocolVersion};
///
/// let codec = FrameCodec::new(ProtocolVersion::from_header("2")?);
/// let mut wire = Vec::with_capacity(codec.max_frame_len());
/// codec.encode(&Frame::opus_at(1234, &[0x58, 0x00, 0x01, 0x02]), &mut wire)?;
/// assert_eq!(wire, [0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0x04, 0xd2, 0, 0, 0, 4, 0x58, 0, 1, 2]);
///
/// let frame = codec.decode(&wire)?;
/// assert_eq!(frame.timestamp, 1234);
/// assert_eq!(frame.payload, [0x58, 0x00, 0x01, 0x02]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameCodec {
    version: ProtocolVersion,
    max_frame_len: usize,
}

impl FrameCodec {
    /// A codec for `version` limited to [`DEVICE_MAX_FRAME_LEN`] bytes per frame.
    pub const fn new(version: ProtocolVersion) -> Self {
        Self {
            version,
            max_frame_len: DEVICE_MAX_FRAME_LEN,
        }
    }

    /// Changes the largest frame (header included) accepted and produced.
    ///
    /// Raise it only for peers known to accept larger messages: the firmware does not.
    #[must_use]
    pub const fn with_max_frame_len(mut self, max_frame_len: usize) -> Self {
        self.max_frame_len = max_frame_len;
        self
    }

    /// The framing version.
    pub const fn version(&self) -> ProtocolVersion {
        self.version
    }

    /// The largest frame, header included, this codec accepts and produces.
    pub const fn max_frame_len(&self) -> usize {
        self.max_frame_len
    }

    /// The header length of this codec's version.
    pub const fn header_len(&self) -> usize {
        self.version.header_len()
    }

    /// The largest payload this codec accepts and produces.
    pub fn max_payload_len(&self) -> usize {
        let by_frame = self.max_frame_len.saturating_sub(self.header_len());
        let by_field = usize::try_from(self.version.max_encodable_payload()).unwrap_or(usize::MAX);
        by_frame.min(by_field)
    }

    /// The length of the encoded frame for a payload of `payload_len` bytes.
    pub const fn encoded_len(&self, payload_len: usize) -> usize {
        self.header_len().saturating_add(payload_len)
    }

    /// Reads the header at the start of `bytes` without looking at the payload.
    ///
    /// Only the first [`header_len`](Self::header_len) bytes are needed, so a reader of a byte
    /// stream can learn how many payload bytes to wait for. For version 1, which has no header,
    /// the whole of `bytes` is the payload.
    ///
    /// # Errors
    ///
    /// [`DecodeError::ShortHeader`], or [`DecodeError::HeaderVersionMismatch`] for a version 2
    /// header whose `version` field is not 2.
    #[inline]
    pub fn decode_header(&self, bytes: &[u8]) -> Result<FrameHeader, DecodeError> {
        match self.version {
            ProtocolVersion::V1 => Ok(FrameHeader {
                payload_len: bytes.len(),
                ..FrameHeader::default()
            }),
            ProtocolVersion::V2 => {
                let Some(h) = bytes.first_chunk::<V2_HEADER_LEN>() else {
                    return Err(self.short_header(bytes.len()));
                };
                let version = u16::from_be_bytes([h[0], h[1]]);
                if version != 2 {
                    return Err(DecodeError::HeaderVersionMismatch { found: version });
                }
                let declared = u32::from_be_bytes([h[12], h[13], h[14], h[15]]);
                Ok(FrameHeader {
                    frame_type: FrameType(u16::from_be_bytes([h[2], h[3]])),
                    reserved: u32::from_be_bytes([h[4], h[5], h[6], h[7]]),
                    timestamp: u32::from_be_bytes([h[8], h[9], h[10], h[11]]),
                    // Saturating keeps 16-bit targets honest: such a size can never match.
                    payload_len: usize::try_from(declared).unwrap_or(usize::MAX),
                })
            }
            ProtocolVersion::V3 => {
                let Some(h) = bytes.first_chunk::<V3_HEADER_LEN>() else {
                    return Err(self.short_header(bytes.len()));
                };
                Ok(FrameHeader {
                    frame_type: FrameType(u16::from(h[0])),
                    reserved: u32::from(h[1]),
                    timestamp: 0,
                    payload_len: usize::from(u16::from_be_bytes([h[2], h[3]])),
                })
            }
        }
    }

    /// Decodes one whole binary message, borrowing the payload from it.
    ///
    /// # Errors
    ///
    /// A [`DecodeError`] when the message is too large, shorter than the header, or its
    /// `payload_size` disagrees with its length.
    #[inline]
    pub fn decode<'a>(&self, bytes: &'a [u8]) -> Result<Frame<'a>, DecodeError> {
        let header = self.check(bytes)?;
        // `check` proved the payload is exactly the bytes after the header.
        let payload = bytes.get(self.header_len()..).unwrap_or_default();
        Ok(Frame {
            frame_type: header.frame_type,
            reserved: header.reserved,
            timestamp: header.timestamp,
            payload,
        })
    }

    /// Decodes one whole binary message and copies its payload to the start of `out`.
    ///
    /// Returns the header; the payload is `&out[..header.payload_len]`. Size `out` with
    /// [`max_payload_len`](Self::max_payload_len) to accept every valid frame.
    ///
    /// # Errors
    ///
    /// As [`decode`](Self::decode), plus [`DecodeError::BufferTooSmall`].
    pub fn decode_into(&self, bytes: &[u8], out: &mut [u8]) -> Result<FrameHeader, DecodeError> {
        let frame = self.decode(bytes)?;
        let available = out.len();
        let Some(dst) = out.get_mut(..frame.payload.len()) else {
            return Err(DecodeError::BufferTooSmall {
                needed: frame.payload.len(),
                available,
            });
        };
        dst.copy_from_slice(frame.payload);
        Ok(frame.header())
    }

    /// Decodes a message held in a shared [`Bytes`]; the payload shares its allocation.
    ///
    /// # Errors
    ///
    /// As [`decode`](Self::decode).
    pub fn decode_shared(&self, bytes: &Bytes) -> Result<SharedFrame, DecodeError> {
        let header = self.check(bytes)?;
        Ok(SharedFrame {
            header,
            payload: bytes.slice(self.header_len()..),
        })
    }

    /// Writes the header for `header` into the start of `out` and returns its length.
    ///
    /// Lets a caller reserve the header room, encode Opus straight into the bytes after it, then
    /// fill the header in, with no copy of the payload.
    ///
    /// # Errors
    ///
    /// [`EncodeError`] when the header cannot describe such a frame or `out` is too short.
    pub fn encode_header(
        &self,
        header: &FrameHeader,
        out: &mut [u8],
    ) -> Result<usize, EncodeError> {
        let mut buf = [0u8; MAX_HEADER_LEN];
        let len = self.header_bytes(header, &mut buf)?;
        let available = out.len();
        let (Some(dst), Some(src)) = (out.get_mut(..len), buf.get(..len)) else {
            return Err(EncodeError::BufferTooSmall {
                needed: len,
                available,
            });
        };
        dst.copy_from_slice(src);
        Ok(len)
    }

    /// Appends the encoded frame (header, then payload) to `out`.
    ///
    /// `payload_size` is always derived from the payload, so the result is well formed. With a
    /// `Vec<u8>` or `BytesMut` whose capacity is reserved this does not allocate.
    ///
    /// # Errors
    ///
    /// [`EncodeError`] when the frame is too large, sets a field the version cannot carry, or
    /// does not fit a fixed-size `out`.
    #[inline]
    pub fn encode<B: BufMut + ?Sized>(
        &self,
        frame: &Frame<'_>,
        out: &mut B,
    ) -> Result<(), EncodeError> {
        let mut header = [0u8; MAX_HEADER_LEN];
        let header_len = self.header_bytes(&frame.header(), &mut header)?;
        let needed = header_len + frame.payload.len();
        // `BufMut` panics on overflow; check first so a fixed-size sink reports an error instead.
        if out.remaining_mut() < needed {
            return Err(EncodeError::BufferTooSmall {
                needed,
                available: out.remaining_mut(),
            });
        }
        out.put_slice(header.get(..header_len).unwrap_or_default());
        out.put_slice(frame.payload);
        Ok(())
    }

    /// Writes the encoded frame to the start of `out` and returns its length.
    ///
    /// # Errors
    ///
    /// As [`encode`](Self::encode).
    pub fn encode_to_slice(&self, frame: &Frame<'_>, out: &mut [u8]) -> Result<usize, EncodeError> {
        let available = out.len();
        let mut sink = &mut *out;
        self.encode(frame, &mut sink)?;
        Ok(available - sink.len())
    }

    fn short_header(&self, len: usize) -> DecodeError {
        DecodeError::ShortHeader {
            version: self.version,
            header_len: self.header_len(),
            len,
        }
    }

    /// Validates a whole message and returns its header.
    #[inline]
    fn check(&self, bytes: &[u8]) -> Result<FrameHeader, DecodeError> {
        if bytes.len() > self.max_frame_len {
            return Err(DecodeError::FrameTooLarge {
                len: bytes.len(),
                max: self.max_frame_len,
            });
        }
        let header = self.decode_header(bytes)?;
        let actual = bytes.len() - self.header_len();
        if header.payload_len != actual {
            return Err(DecodeError::SizeMismatch {
                version: self.version,
                declared: header.payload_len as u64,
                actual,
            });
        }
        Ok(header)
    }

    /// Serializes `header` into `buf`, returning the header length.
    #[inline]
    fn header_bytes(
        &self,
        header: &FrameHeader,
        buf: &mut [u8; MAX_HEADER_LEN],
    ) -> Result<usize, EncodeError> {
        let version = self.version;
        let total = self.header_len() as u64 + header.payload_len as u64;
        let max = (self.max_frame_len as u64)
            .min(self.header_len() as u64 + version.max_encodable_payload());
        if total > max {
            return Err(EncodeError::FrameTooLarge {
                version,
                len: total,
                max,
            });
        }
        let unrepresentable = |field, value| EncodeError::Unrepresentable {
            version,
            field,
            value,
        };
        match version {
            ProtocolVersion::V1 => {
                if !header.frame_type.is_opus() {
                    return Err(unrepresentable("type", u32::from(header.frame_type.0)));
                }
                if header.reserved != 0 {
                    return Err(unrepresentable("reserved", header.reserved));
                }
                if header.timestamp != 0 {
                    return Err(unrepresentable("timestamp", header.timestamp));
                }
                Ok(0)
            }
            ProtocolVersion::V2 => {
                // The limit check above bounds the payload by `u32::MAX`.
                let size = u32::try_from(header.payload_len)
                    .map_err(|_| unrepresentable("payload_size", u32::MAX))?;
                buf[0..2].copy_from_slice(&2u16.to_be_bytes());
                buf[2..4].copy_from_slice(&header.frame_type.0.to_be_bytes());
                buf[4..8].copy_from_slice(&header.reserved.to_be_bytes());
                buf[8..12].copy_from_slice(&header.timestamp.to_be_bytes());
                buf[12..16].copy_from_slice(&size.to_be_bytes());
                Ok(V2_HEADER_LEN)
            }
            ProtocolVersion::V3 => {
                let frame_type = u8::try_from(header.frame_type.0)
                    .map_err(|_| unrepresentable("type", u32::from(header.frame_type.0)))?;
                let reserved = u8::try_from(header.reserved)
                    .map_err(|_| unrepresentable("reserved", header.reserved))?;
                if header.timestamp != 0 {
                    return Err(unrepresentable("timestamp", header.timestamp));
                }
                let size = u16::try_from(header.payload_len)
                    .map_err(|_| unrepresentable("payload_size", u32::from(u16::MAX)))?;
                buf[0] = frame_type;
                buf[1] = reserved;
                buf[2..4].copy_from_slice(&size.to_be_bytes());
                Ok(V3_HEADER_LEN)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_is_the_bare_payload() {
        let codec = FrameCodec::new(ProtocolVersion::V1);
        let mut out = Vec::new();
        codec.encode(&Frame::opus(&[1, 2, 3]), &mut out).unwrap();
        assert_eq!(out, [1, 2, 3]);
        assert_eq!(codec.decode(&out).unwrap(), Frame::opus(&[1, 2, 3]));
    }

    #[test]
    fn encode_to_slice_reports_written_length_and_short_buffers() {
        let codec = FrameCodec::new(ProtocolVersion::V3);
        let mut out = [0u8; 8];
        assert_eq!(
            codec.encode_to_slice(&Frame::opus(&[9, 9]), &mut out),
            Ok(6)
        );
        assert_eq!(out[..6], [0, 0, 0, 2, 9, 9]);
        assert_eq!(
            codec.encode_to_slice(&Frame::opus(&[0; 5]), &mut out),
            Err(EncodeError::BufferTooSmall {
                needed: 9,
                available: 8
            })
        );
    }

    #[test]
    fn v2_header_version_field_must_be_two() {
        let codec = FrameCodec::new(ProtocolVersion::V2);
        let mut bytes = [0u8; 16];
        bytes[1] = 3;
        assert_eq!(
            codec.decode(&bytes),
            Err(DecodeError::HeaderVersionMismatch { found: 3 })
        );
    }

    #[test]
    fn header_can_be_written_in_place_before_the_payload() {
        let codec = FrameCodec::new(ProtocolVersion::V2);
        let mut buf = [0u8; 20];
        buf[16..].copy_from_slice(&[0x58, 0, 1, 2]);
        let header = FrameHeader {
            timestamp: 1234,
            payload_len: 4,
            ..FrameHeader::default()
        };
        assert_eq!(codec.encode_header(&header, &mut buf), Ok(16));
        assert_eq!(
            codec.decode(&buf).unwrap(),
            Frame::opus_at(1234, &[0x58, 0, 1, 2])
        );
    }

    #[test]
    fn max_payload_len_respects_frame_and_field_limits() {
        assert_eq!(
            FrameCodec::new(ProtocolVersion::V1).max_payload_len(),
            65_535
        );
        assert_eq!(
            FrameCodec::new(ProtocolVersion::V2).max_payload_len(),
            65_519
        );
        assert_eq!(
            FrameCodec::new(ProtocolVersion::V3).max_payload_len(),
            65_531
        );
        let big = FrameCodec::new(ProtocolVersion::V3).with_max_frame_len(1 << 20);
        assert_eq!(big.max_payload_len(), 65_535);
    }

    #[test]
    fn protocol_version_parses_header_values() {
        assert_eq!(ProtocolVersion::from_header(" 3 "), Ok(ProtocolVersion::V3));
        assert_eq!(
            ProtocolVersion::from_header("4"),
            Err(UnsupportedVersion::Number(4))
        );
        assert_eq!(
            ProtocolVersion::from_header("v2"),
            Err(UnsupportedVersion::Text("v2".into()))
        );
    }
}
