//! `HostedTtsConfiguration`, encoded by hand in field-number order.
//!
//! Its oneof `voice` has fields 1 and 3 around the plain field `mode` (2). prost encodes a oneof
//! as one unit at the position of its lowest tag, so a derived implementation writes
//! `voice_clone_v1` (3) before `mode` (2), while the reference implementation writes fields in
//! number order. Both orders decode the same, but re-encoding a reference client's message would
//! not reproduce its bytes. This implementation interleaves the fields so it does; codegen maps
//! the type here with `extern_path`.

use bytes::{Buf, BufMut};
use prost::encoding::{self, DecodeContext, WireType};
use prost::{DecodeError, Message};

use crate::proto::HostedTtsMode;

/// Speech synthesis by the server itself.
#[derive(Clone, PartialEq, Default, Debug)]
pub struct HostedTtsConfiguration {
    /// The voice to speak with.
    pub voice: Option<Voice>,
    /// Quality/latency trade-off; a [`HostedTtsMode`] (see [`mode_open`](Self::mode_open)).
    pub mode: i32,
}

/// Nested types of [`HostedTtsConfiguration`].
pub mod hosted_tts_configuration {
    use crate::proto::{HostedVoiceCloneV1, HostedVoiceRef};

    /// The voice to speak with.
    // prost's Oneof derive also implements Debug.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Voice {
        /// A voice the server already knows.
        #[prost(message, tag = "1")]
        VoiceRef(HostedVoiceRef),
        /// A voice cloned from a reference recording.
        #[prost(message, tag = "3")]
        VoiceCloneV1(HostedVoiceCloneV1),
    }
}

use hosted_tts_configuration::Voice;

impl HostedTtsConfiguration {
    /// Sets `mode`.
    pub fn set_mode(&mut self, mode: HostedTtsMode) {
        self.mode = mode.into();
    }
}

impl Message for HostedTtsConfiguration {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if let Some(Voice::VoiceRef(v)) = &self.voice {
            encoding::message::encode(1, v, buf);
        }
        if self.mode != 0 {
            encoding::int32::encode(2, &self.mode, buf);
        }
        if let Some(Voice::VoiceCloneV1(v)) = &self.voice {
            encoding::message::encode(3, v, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            1 | 3 => Voice::merge(&mut self.voice, tag, wire_type, buf, ctx),
            2 => encoding::int32::merge(wire_type, &mut self.mode, buf, ctx),
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let mode = if self.mode == 0 {
            0
        } else {
            encoding::int32::encoded_len(2, &self.mode)
        };
        mode + self.voice.as_ref().map_or(0, Voice::encoded_len)
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::proto::{HostedVoiceCloneV1, HostedVoiceRef};

    fn clone_config() -> HostedTtsConfiguration {
        HostedTtsConfiguration {
            voice: Some(Voice::VoiceCloneV1(HostedVoiceCloneV1 {
                audio_data: Bytes::from_static(&[1, 2]),
                audio_format: None,
                ref_text: String::new(),
            })),
            mode: HostedTtsMode::LowLatency.into(),
        }
    }

    #[test]
    fn fields_are_written_in_number_order() {
        let bytes = clone_config().encode_to_vec();
        // mode (field 2, varint 1), then voice_clone_v1 (field 3, 4 bytes: audio_data = [1, 2]).
        assert_eq!(bytes, [0x10, 0x01, 0x1a, 0x04, 0x0a, 0x02, 0x01, 0x02]);
        assert_eq!(bytes.len(), clone_config().encoded_len());
        let with_ref = HostedTtsConfiguration {
            voice: Some(Voice::VoiceRef(HostedVoiceRef {
                voice_id: "v".into(),
            })),
            mode: 1,
        };
        assert_eq!(
            with_ref.encode_to_vec(),
            [0x0a, 0x03, 0x0a, 0x01, b'v', 0x10, 0x01]
        );
    }

    #[test]
    fn decodes_either_order_and_skips_unknown_fields() {
        let reversed = [0x1a, 0x04, 0x0a, 0x02, 0x01, 0x02, 0x10, 0x01, 0x20, 0x07];
        let decoded = HostedTtsConfiguration::decode(&reversed[..]).unwrap();
        assert_eq!(decoded, clone_config());
        let mut cleared = decoded;
        cleared.clear();
        assert_eq!(cleared, HostedTtsConfiguration::default());
        assert!(HostedTtsConfiguration::decode(&[0x12, 0x00][..]).is_err());
    }
}
