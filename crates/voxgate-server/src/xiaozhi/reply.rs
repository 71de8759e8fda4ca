//! Reply audio on its way to the device: resampled to the announced rate, cut into announced
//! frames, Opus-encoded as it arrives, paced (a lead burst, then real time, so the device's
//! small buffer never overflows) and framed in the device's protocol version on release.
//!
//! Frames wait in the pacer encoded: a reply synthesized faster than real time is held as Opus
//! packets (about 180 bytes per 60 ms at 24 kbit/s) rather than PCM (2.9 KB), which keeps a
//! long reply from costing hundreds of kilobytes per session. The framing (and the v2
//! timestamp) is added on release, so audio dropped by a barge-in leaves no gap in the
//! timestamps. A sentence's subtitle rides with the first frame of its audio so it shows when
//! the sentence plays.

use std::time::{Duration, Instant};

use bytes::Bytes;
use voxgate_audio::opus::{OpusEncoder, OpusEncoderConfig, OpusError};
use voxgate_audio::pacer::{Pacer, PacerConfig};
use voxgate_audio::resample::RateConverter;
use voxgate_xiaozhi::frame::{Frame, FrameCodec, ProtocolVersion};

/// Reply frames held by the pacer: 2 minutes of 60 ms frames.
const PACER_CAPACITY: usize = 2_000;
/// Reply audio is converted and resampled this many samples at a time.
const PUSH_SLICE: usize = 1024;

/// How reply audio is encoded and paced.
#[derive(Debug, Clone, Copy)]
pub(super) struct ReplySettings {
    /// The downlink encoder (its rate and frame length are the ones announced in the hello).
    pub(super) encoder: OpusEncoderConfig,
    /// Frames sent at once before real-time pacing.
    pub(super) lead_frames: u32,
    /// The device's binary framing.
    pub(super) version: ProtocolVersion,
}

/// A paced item: a frame, and the subtitle to show when it starts playing.
struct Paced {
    subtitle: Option<String>,
    /// One Opus packet of the announced frame length; `None` for a subtitle without audio.
    packet: Option<Bytes>,
}

/// What is due for the device, in order: the subtitle first, then the frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Released {
    /// A `tts sentence_start` to send (control: never dropped).
    pub(super) subtitle: Option<String>,
    /// One Opus frame in the device's framing (reply audio: droppable).
    pub(super) frame: Option<Bytes>,
}

/// What turns reply audio into Opus packets: it exists only from a response's first audio to
/// its end. The pure-Rust encoder alone holds about 310 KB of fixed buffers, and replies are
/// encoded as fast as the TTS delivers them (the pacer then holds packets), so keeping it only
/// for that stretch is most of the difference between an idle and a speaking session's memory.
///
/// Audio stays 16-bit from the TTS to the encoder: at the announced rate (the usual case,
/// 24 kHz speech for a 24 kHz downlink) the samples are copied once, into `pcm`, and each whole
/// frame is encoded straight from there; other rates go through the resampler in `f32` and
/// come back rounded once.
struct Encoding {
    encoder: OpusEncoder,
    rate: RateConverter,
    /// Reply audio at the announced rate not yet a whole frame.
    pcm: Vec<i16>,
}

impl Encoding {
    fn new(config: OpusEncoderConfig) -> Result<Self, String> {
        let encoder = OpusEncoder::new(config).map_err(|e| e.to_string())?;
        let n = encoder.frame_samples();
        Ok(Self {
            encoder,
            rate: RateConverter::new(config.sample_rate).map_err(|e| e.to_string())?,
            // A frame not yet whole plus one slice of input at up to twice the rate.
            pcm: Vec::with_capacity(n + 2 * PUSH_SLICE),
        })
    }
}

/// One device session's reply audio, from TTS samples to framed, paced Opus.
pub(super) struct Reply {
    encoder_config: OpusEncoderConfig,
    /// Present only while reply audio is arriving.
    encoding: Option<Encoding>,
    frame_samples: usize,
    frame_ms: u32,
    pacer: Pacer<Paced>,
    /// A `sentence_start` waiting for the first frame of its audio.
    subtitle: Option<String>,
    codec: FrameCodec,
    /// v2 downlink timestamp: milliseconds of audio released.
    timestamp: u32,
}

impl Reply {
    /// Checks the settings by building an encoder once (so a setting the codec refuses fails
    /// the hello, not the first reply); the encoder itself is built when audio arrives.
    pub(super) fn new(settings: ReplySettings) -> Result<Self, OpusError> {
        Self::with_capacity(settings, PACER_CAPACITY)
    }

    fn with_capacity(settings: ReplySettings, capacity: usize) -> Result<Self, OpusError> {
        let frame_samples = OpusEncoder::new(settings.encoder)?.frame_samples();
        let frame_ms = settings.encoder.frame_duration.millis();
        Ok(Self {
            encoder_config: settings.encoder,
            encoding: None,
            frame_samples,
            frame_ms,
            pacer: Pacer::new(PacerConfig::new(
                Duration::from_millis(u64::from(frame_ms)),
                settings.lead_frames,
                capacity,
            )),
            subtitle: None,
            codec: FrameCodec::new(settings.version),
            timestamp: 0,
        })
    }

    /// A sentence starts: its subtitle goes out with the first frame of its audio.
    pub(super) fn sentence(&mut self, subtitle: String) {
        self.subtitle = Some(subtitle);
    }

    /// Reply audio in: resampled, cut into frames, encoded and queued. Returns the frames the
    /// full pacer refused.
    pub(super) fn push_audio(&mut self, now: Instant, samples: &[i16], rate: u32) -> u64 {
        if rate == 0 {
            return 0;
        }
        // A TTS chunk can be a whole sentence (seconds of audio). Taking it a slice at a time
        // keeps the conversion and resampling buffers at a few kilobytes for the session's
        // life instead of growing to the longest sentence ever spoken.
        let mut dropped = 0;
        for slice in samples.chunks(PUSH_SLICE) {
            if self.encoding.is_none() {
                match Encoding::new(self.encoder_config) {
                    Ok(e) => self.encoding = Some(e),
                    Err(e) => {
                        tracing::warn!(%e, "cannot build the reply encoder");
                        return dropped;
                    }
                }
            }
            if let Some(e) = &mut self.encoding
                && let Err(err) = e.rate.process_i16_to_i16(slice, rate, &mut e.pcm)
            {
                tracing::warn!(%err, rate, "cannot resample reply audio");
                return dropped;
            }
            dropped += self.encode_frames(now);
        }
        dropped
    }

    /// The end of a response's audio: the resampler's tail and a last, zero-padded frame.
    /// The encoder goes with it; what is left of the reply waits in the pacer as packets.
    /// Returns the frames the full pacer refused.
    pub(super) fn flush(&mut self, now: Instant) -> u64 {
        let n = self.frame_samples;
        if let Some(e) = &mut self.encoding {
            e.rate.flush_i16(&mut e.pcm);
            let partial = e.pcm.len() % n;
            if partial > 0 {
                e.pcm.extend(std::iter::repeat_n(0, n - partial));
            }
        }
        let dropped = self.encode_frames(now);
        self.encoding = None;
        if let Some(subtitle) = self.subtitle.take() {
            // A sentence with no audio at all still gets its subtitle, in order.
            let _ = self.pacer.handle_input(
                now,
                Paced {
                    subtitle: Some(subtitle),
                    packet: None,
                },
            );
        }
        dropped
    }

    /// Drops every queued and partial reply frame (barge-in, abort).
    pub(super) fn clear(&mut self) {
        self.pacer.clear();
        self.encoding = None;
        self.subtitle = None;
    }

    /// Playback starts afresh: the next frame opens a new lead burst.
    pub(super) fn restart_pacing(&mut self) {
        self.pacer.clear();
    }

    /// Tells the pacer the time; due items come from [`poll_output`](Self::poll_output).
    pub(super) fn handle_timeout(&mut self, now: Instant) {
        self.pacer.handle_timeout(now);
    }

    /// The next item due at the last time given.
    pub(super) fn poll_output(&mut self) -> Option<Released> {
        let paced = self.pacer.poll_output()?;
        let frame = paced.packet.and_then(|p| self.frame(p));
        Some(Released {
            subtitle: paced.subtitle,
            frame,
        })
    }

    /// When the next queued item is due.
    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        self.pacer.poll_timeout()
    }

    /// Items waiting in the pacer.
    pub(super) fn queued(&self) -> usize {
        self.pacer.queued()
    }

    /// When the device will have played every frame released so far.
    pub(super) fn drained_at(&self) -> Option<Instant> {
        self.pacer.drained_at()
    }

    /// Whether the reply encoder is built (memory: it exists only while audio arrives).
    #[cfg(test)]
    fn is_encoding(&self) -> bool {
        self.encoding.is_some()
    }

    /// Encodes every whole frame of reply audio and queues it; returns the frames refused.
    fn encode_frames(&mut self, now: Instant) -> u64 {
        let n = self.frame_samples;
        let Some(e) = &mut self.encoding else {
            return 0;
        };
        let mut dropped = 0;
        let mut start = 0;
        while let Some(chunk) = e.pcm.get(start..start + n) {
            start += n;
            let packet = match e.encoder.encode(chunk) {
                Ok(p) => Bytes::copy_from_slice(p),
                Err(err) => {
                    tracing::warn!(%err, "opus encode failed");
                    continue;
                }
            };
            let paced = Paced {
                subtitle: self.subtitle.take(),
                packet: Some(packet),
            };
            if self.pacer.handle_input(now, paced).is_err() {
                dropped += 1;
            }
        }
        e.pcm.drain(..start);
        dropped
    }

    /// One Opus packet in the device's framing, stamped with the audio time released so far.
    /// Version 1 frames are the bare packet, sent as it is; the others get their header in
    /// one copy.
    fn frame(&mut self, packet: Bytes) -> Option<Bytes> {
        let framed = if self.codec.header_len() == 0 {
            packet
        } else {
            let frame = if self.codec.version().has_timestamp() {
                Frame::opus_at(self.timestamp, &packet)
            } else {
                Frame::opus(&packet)
            };
            let mut buf = Vec::with_capacity(self.codec.encoded_len(packet.len()));
            if let Err(e) = self.codec.encode(&frame, &mut buf) {
                tracing::warn!(%e, "frame encode failed");
                return None;
            }
            Bytes::from(buf)
        };
        self.timestamp = self.timestamp.wrapping_add(self.frame_ms);
        Some(framed)
    }
}

#[cfg(test)]
mod tests {
    use voxgate_audio::opus::{FrameDuration, OpusBackend, OpusDecoder};

    use super::*;

    const MS: Duration = Duration::from_millis(1);
    /// 60 ms at 24 kHz.
    const FRAME: usize = 1440;

    fn settings(version: ProtocolVersion) -> ReplySettings {
        ReplySettings {
            encoder: OpusEncoderConfig {
                frame_duration: FrameDuration::Ms60,
                backend: OpusBackend::Pure,
                ..OpusEncoderConfig::voice(24_000)
            },
            lead_frames: 5,
            version,
        }
    }

    /// A square wave of about 440 Hz at `rate`.
    fn tone(n: usize, rate: u32) -> Vec<i16> {
        let half = (rate / 880) as usize;
        (0..n)
            .map(|i| {
                if (i / half).is_multiple_of(2) {
                    6000
                } else {
                    -6000
                }
            })
            .collect()
    }

    fn release(r: &mut Reply, now: Instant) -> Vec<Released> {
        r.handle_timeout(now);
        std::iter::from_fn(|| r.poll_output()).collect()
    }

    #[test]
    fn a_lead_burst_then_real_time_and_the_subtitle_with_the_first_frame() {
        let t0 = Instant::now();
        let mut r = Reply::new(settings(ProtocolVersion::V1)).unwrap();
        r.sentence("hello".into());
        assert_eq!(r.push_audio(t0, &tone(FRAME * 8, 24_000), 24_000), 0);
        assert_eq!(r.flush(t0), 0);
        assert_eq!(r.queued(), 8);
        let burst = release(&mut r, t0);
        assert_eq!(burst.len(), 5, "the lead goes out at once");
        assert_eq!(burst[0].subtitle.as_deref(), Some("hello"));
        assert!(burst.iter().all(|x| x.frame.is_some()));
        assert!(burst[1..].iter().all(|x| x.subtitle.is_none()));
        assert_eq!(r.poll_timeout(), Some(t0 + 60 * MS));
        assert!(release(&mut r, t0 + 59 * MS).is_empty());
        assert_eq!(release(&mut r, t0 + 60 * MS).len(), 1);
        assert_eq!(release(&mut r, t0 + 120 * MS).len(), 1);
        assert_eq!(release(&mut r, t0 + 180 * MS).len(), 1);
        assert_eq!(r.queued(), 0);
        assert_eq!(r.poll_timeout(), None);
        // Eight frames from t0: heard until 480 ms.
        assert_eq!(r.drained_at(), Some(t0 + 480 * MS));
    }

    #[test]
    fn frames_are_decodable_and_a_partial_frame_is_padded() {
        let t0 = Instant::now();
        let mut r = Reply::new(settings(ProtocolVersion::V1)).unwrap();
        r.push_audio(t0, &tone(FRAME + 100, 24_000), 24_000);
        assert_eq!(r.queued(), 1, "one whole frame so far");
        assert!(r.is_encoding());
        r.flush(t0);
        assert!(
            !r.is_encoding(),
            "the encoder lives only while audio arrives"
        );
        assert_eq!(r.queued(), 2);
        let mut dec = OpusDecoder::new(24_000, OpusBackend::Pure).unwrap();
        for x in release(&mut r, t0) {
            let pcm = dec.decode(&x.frame.unwrap()).unwrap();
            assert_eq!(pcm.len(), FRAME);
        }
    }

    #[test]
    fn other_rates_are_resampled_and_may_change_mid_reply() {
        let t0 = Instant::now();
        let mut r = Reply::new(settings(ProtocolVersion::V1)).unwrap();
        // One second at 16 kHz, then one at 48 kHz: about two seconds at 24 kHz.
        r.push_audio(t0, &tone(16_000, 16_000), 16_000);
        r.push_audio(t0, &tone(48_000, 48_000), 48_000);
        r.flush(t0);
        let frames = r.queued();
        assert!((33..=36).contains(&frames), "{frames} frames of 60 ms");
    }

    #[test]
    fn a_sentence_without_audio_still_shows_in_order() {
        let t0 = Instant::now();
        let mut r = Reply::new(settings(ProtocolVersion::V1)).unwrap();
        r.sentence("first".into());
        r.push_audio(t0, &tone(FRAME, 24_000), 24_000);
        r.sentence("silent".into());
        r.flush(t0);
        let out = release(&mut r, t0);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].subtitle.as_deref(), Some("first"));
        assert_eq!(
            out[1],
            Released {
                subtitle: Some("silent".into()),
                frame: None
            }
        );
    }

    #[test]
    fn v2_timestamps_count_released_audio_without_gaps_after_a_clear() {
        let t0 = Instant::now();
        let mut r = Reply::new(settings(ProtocolVersion::V2)).unwrap();
        let codec = FrameCodec::new(ProtocolVersion::V2);
        let stamp = |x: &Released| {
            let bytes = x.frame.clone().unwrap();
            codec.decode(&bytes).unwrap().timestamp
        };
        r.push_audio(t0, &tone(FRAME * 10, 24_000), 24_000);
        let first = release(&mut r, t0);
        assert_eq!(
            first.iter().map(stamp).collect::<Vec<_>>(),
            [0, 60, 120, 180, 240]
        );
        // A barge-in drops the five queued frames; the next reply continues at 300 ms.
        r.clear();
        assert_eq!(r.queued(), 0);
        assert!(!r.is_encoding());
        r.restart_pacing();
        let t1 = t0 + Duration::from_secs(2);
        r.push_audio(t1, &tone(FRAME * 2, 24_000), 24_000);
        r.flush(t1);
        let next = release(&mut r, t1);
        assert_eq!(next.iter().map(stamp).collect::<Vec<_>>(), [300, 360]);
    }

    #[test]
    fn v3_frames_carry_the_packet() {
        let t0 = Instant::now();
        let mut r = Reply::new(settings(ProtocolVersion::V3)).unwrap();
        r.push_audio(t0, &tone(FRAME, 24_000), 24_000);
        let x = release(&mut r, t0).pop().unwrap();
        let bytes = x.frame.unwrap();
        let frame = FrameCodec::new(ProtocolVersion::V3).decode(&bytes).unwrap();
        assert!(frame.frame_type.is_opus());
        assert!(!frame.payload.is_empty());
    }

    #[test]
    fn a_full_pacer_refuses_and_counts() {
        let t0 = Instant::now();
        let mut r = Reply::with_capacity(settings(ProtocolVersion::V1), 3).unwrap();
        assert_eq!(r.push_audio(t0, &tone(FRAME * 5, 24_000), 24_000), 2);
        assert_eq!(r.queued(), 3);
        assert_eq!(r.push_audio(t0, &[], 24_000), 0);
        assert_eq!(
            r.push_audio(t0, &tone(FRAME, 24_000), 0),
            0,
            "rate 0 is ignored"
        );
    }

    #[test]
    fn a_rate_the_codec_refuses_fails_at_once() {
        let mut s = settings(ProtocolVersion::V1);
        s.encoder.sample_rate = 22_050;
        assert!(Reply::new(s).is_err());
    }

    #[test]
    fn restarting_pacing_opens_a_new_burst() {
        let t0 = Instant::now();
        let mut r = Reply::new(settings(ProtocolVersion::V1)).unwrap();
        r.push_audio(t0, &tone(FRAME * 5, 24_000), 24_000);
        assert_eq!(release(&mut r, t0).len(), 5);
        r.restart_pacing();
        assert_eq!(r.drained_at(), None);
        let t1 = t0 + 100 * MS;
        r.push_audio(t1, &tone(FRAME * 5, 24_000), 24_000);
        assert_eq!(release(&mut r, t1).len(), 5, "a fresh lead");
    }
}
