//! The device's audio on its way to the engine: binary frames in the connection's framing,
//! Opus at any rate and frame length, decoded to the VAD's rate.

use voxgate_audio::opus::{OpusBackend, OpusDecoder, OpusError};
use voxgate_xiaozhi::frame::{DecodeError, FrameCodec, ProtocolVersion};

/// Uplink Opus is always decoded at the VAD's rate (Opus decodes to any rate).
pub(super) const INPUT_RATE: u32 = 16_000;

/// Why a device's binary frame gave no audio (the protocol has no error to answer with).
#[derive(Debug, thiserror::Error)]
pub(super) enum UplinkError {
    /// The framing is wrong (a v2/v3 header that lies about its length, an unknown type).
    #[error("bad binary frame: {0}")]
    Frame(#[from] DecodeError),
    /// The decoder could not be built.
    #[error("cannot build the uplink decoder: {0}")]
    Decoder(OpusError),
    /// The packet is not Opus the decoder accepts.
    #[error("undecodable Opus packet: {0}")]
    Packet(OpusError),
}

/// One connection's uplink decoding.
pub(super) struct Uplink {
    codec: FrameCodec,
    backend: OpusBackend,
    /// Built at the first audio frame and dropped when the stream ends (a half-duplex device
    /// sends no audio while it speaks): the pure-Rust decoder holds about 190 KB.
    decoder: Option<OpusDecoder>,
}

impl Uplink {
    /// Checks that a decoder can be built (so the hello fails, not the first utterance); the
    /// decoder itself is built when audio arrives.
    pub(super) fn new(version: ProtocolVersion, backend: OpusBackend) -> Result<Self, OpusError> {
        OpusDecoder::new(INPUT_RATE, backend)?;
        Ok(Self {
            codec: FrameCodec::new(version),
            backend,
            decoder: None,
        })
    }

    /// The PCM of one binary frame at [`INPUT_RATE`]; `None` for a frame without audio.
    pub(super) fn decode(&mut self, frame: &[u8]) -> Result<Option<&[f32]>, UplinkError> {
        let payload = self.codec.decode(frame)?.payload;
        if payload.is_empty() {
            return Ok(None);
        }
        if self.decoder.is_none() {
            let d = OpusDecoder::new(INPUT_RATE, self.backend).map_err(UplinkError::Decoder)?;
            self.decoder = Some(d);
        }
        let Some(decoder) = &mut self.decoder else {
            return Ok(None);
        };
        decoder
            .decode_f32(payload)
            .map(Some)
            .map_err(UplinkError::Packet)
    }

    /// The device's audio stream ended; the next utterance starts a fresh one.
    pub(super) fn end_stream(&mut self) {
        self.decoder = None;
    }

    /// Whether a decoder is held now (memory).
    #[cfg(test)]
    fn decoding(&self) -> bool {
        self.decoder.is_some()
    }
}

#[cfg(test)]
mod tests {
    use voxgate_audio::opus::{OpusEncoder, OpusEncoderConfig};
    use voxgate_xiaozhi::frame::Frame;

    use super::*;

    fn packet(rate: u32) -> Vec<u8> {
        let mut enc = OpusEncoder::new(OpusEncoderConfig::voice(rate)).unwrap();
        let n = enc.frame_samples();
        let pcm: Vec<i16> = (0..n)
            .map(|i| if i % 64 < 32 { 6000 } else { -6000 })
            .collect();
        enc.encode(&pcm).unwrap().to_vec()
    }

    fn framed(version: ProtocolVersion, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        FrameCodec::new(version)
            .encode(&Frame::opus(payload), &mut out)
            .unwrap();
        out
    }

    #[test]
    fn packets_at_any_rate_decode_at_the_vad_rate() {
        for version in ProtocolVersion::ALL {
            let mut u = Uplink::new(version, OpusBackend::Pure).unwrap();
            assert!(!u.decoding());
            for rate in [16_000, 24_000, 48_000] {
                let pcm = u.decode(&framed(version, &packet(rate))).unwrap().unwrap();
                assert_eq!(pcm.len(), 960, "60 ms at 16 kHz");
            }
            assert!(u.decoding());
            u.end_stream();
            assert!(!u.decoding());
            assert!(
                u.decode(&framed(version, &packet(16_000)))
                    .unwrap()
                    .is_some()
            );
        }
    }

    #[test]
    fn empty_and_bad_frames_give_no_audio() {
        let mut u = Uplink::new(ProtocolVersion::V3, OpusBackend::Pure).unwrap();
        assert!(
            u.decode(&framed(ProtocolVersion::V3, &[]))
                .unwrap()
                .is_none()
        );
        assert!(!u.decoding(), "no decoder for a frame without audio");
        // A v3 header announcing 16 bytes over 2.
        assert!(matches!(
            u.decode(&[0, 0, 0x00, 0x10, 1, 2]),
            Err(UplinkError::Frame(_))
        ));
        assert!(matches!(
            u.decode(&framed(ProtocolVersion::V3, &[0xff; 40])),
            Err(UplinkError::Packet(_))
        ));
    }
}
