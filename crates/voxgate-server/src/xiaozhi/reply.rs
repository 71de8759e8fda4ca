//! Reply audio on its way to the device: resampled to the announced rate, cut into announced
//! frames, Opus-encoded as it arrives (a frame per session step), paced (a lead burst, then
//! real time, so the device's small buffer never overflows) and framed in the device's
//! protocol version on release.
//!
//! Frames wait in the pacer encoded: a reply synthesized faster than real time is held as Opus
//! packets (about 180 bytes per 60 ms at 24 kbit/s) rather than PCM (2.9 KB), which keeps a
//! long reply from costing hundreds of kilobytes per session. The encoding itself is spread
//! over the session's steps, [`ENCODE_PER_STEP`] frames at a time, each step due at once
//! ([`Reply::poll_timeout`]): a TTS chunk is often a second of speech or more, and encoding it
//! whole before releasing anything made the first frame wait for all of it (2 ms for a
//! second of speech) and held the runtime's thread from every other session meanwhile. The
//! framing (and the v2 timestamp) is added on release, so audio dropped by a barge-in leaves
//! no gap in the timestamps. A sentence's subtitle rides with the first frame of its audio so
//! it shows when the sentence plays.

use std::collections::VecDeque;
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
/// Frames encoded per step of the session while reply audio waits as PCM.
const ENCODE_PER_STEP: usize = 1;
/// Most whole frames left waiting as PCM after a push (about 2 s at 60 ms); audio beyond is
/// encoded at once, so a synthesizer far faster than the session's steps cannot make the
/// session hold its reply as PCM, sixteen times the size of the packets.
const MAX_PCM_FRAMES: usize = 34;

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
/// its end (and its last frame encoded). The pure-Rust encoder alone holds about 310 KB of
/// fixed buffers, and replies are encoded as fast as the TTS delivers them (the pacer then
/// holds packets), so keeping it only for that stretch is most of the difference between an
/// idle and a speaking session's memory.
///
/// Audio stays 16-bit from the TTS to the encoder: at the announced rate (the usual case,
/// 24 kHz speech for a 24 kHz downlink) the samples are copied once, into `pcm`, and each whole
/// frame is encoded straight from there; other rates go through the resampler in `f32` and
/// come back rounded once.
struct Encoding {
    encoder: OpusEncoder,
    rate: RateConverter,
    /// Reply audio at the announced rate not yet encoded.
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
    /// `sentence_start`s waiting for the first frame of their audio, with the position (in
    /// [`appended`](Self::appended) samples) where that audio starts.
    subtitles: VecDeque<(u64, String)>,
    /// Samples at the announced rate given to the encoder's buffer, ever.
    appended: u64,
    /// Samples at the announced rate encoded (or dropped by a clear), ever.
    encoded: u64,
    /// The response's audio ended (its last frame padded) at this position, with this many of
    /// the subtitles queued before it: those left when the encoding reaches it had no audio.
    flush: Option<(u64, usize)>,
    /// The last time given: PCM waiting to be encoded is due then.
    now: Option<Instant>,
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
            subtitles: VecDeque::new(),
            appended: 0,
            encoded: 0,
            flush: None,
            now: None,
            codec: FrameCodec::new(settings.version),
            timestamp: 0,
        })
    }

    /// A sentence starts: its subtitle goes out with the first frame of its audio.
    pub(super) fn sentence(&mut self, subtitle: String) {
        self.subtitles.push_back((self.appended, subtitle));
    }

    /// Reply audio in: resampled and kept for encoding, which the following steps do
    /// ([`handle_timeout`](Self::handle_timeout)) unless more than [`MAX_PCM_FRAMES`] wait.
    /// Returns the frames the full pacer refused.
    pub(super) fn push_audio(&mut self, now: Instant, samples: &[i16], rate: u32) -> u64 {
        self.tick(now);
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
            if let Some(e) = &mut self.encoding {
                let before = e.pcm.len();
                if let Err(err) = e.rate.process_i16_to_i16(slice, rate, &mut e.pcm) {
                    tracing::warn!(%err, rate, "cannot resample reply audio");
                    return dropped;
                }
                self.appended += (e.pcm.len() - before) as u64;
            }
            let excess = self.pcm_frames().saturating_sub(MAX_PCM_FRAMES);
            if excess > 0 {
                dropped += self.encode_frames(now, excess);
            }
        }
        dropped
    }

    /// The end of a response's audio: the resampler's tail and a last, zero-padded frame. The
    /// encoder goes once that is encoded; what is left of the reply waits in the pacer as
    /// packets. Returns the frames the full pacer refused.
    pub(super) fn flush(&mut self, now: Instant) -> u64 {
        self.tick(now);
        let n = self.frame_samples;
        if let Some(e) = &mut self.encoding {
            let before = e.pcm.len();
            e.rate.flush_i16(&mut e.pcm);
            let partial = e.pcm.len() % n;
            if partial > 0 {
                e.pcm.extend(std::iter::repeat_n(0, n - partial));
            }
            self.appended += (e.pcm.len() - before) as u64;
        }
        self.flush = Some((self.appended, self.subtitles.len()));
        self.encode_frames(now, 0)
    }

    /// Drops every queued and partial reply frame (barge-in, abort).
    pub(super) fn clear(&mut self) {
        self.pacer.clear();
        self.encoding = None;
        self.subtitles.clear();
        self.flush = None;
        self.encoded = self.appended;
    }

    /// Playback starts afresh: the next frame opens a new lead burst.
    pub(super) fn restart_pacing(&mut self) {
        self.pacer.clear();
    }

    /// Tells the time: encodes the next [`ENCODE_PER_STEP`] frames of waiting audio, and due
    /// items come from [`poll_output`](Self::poll_output). Returns the frames the full pacer
    /// refused.
    pub(super) fn handle_timeout(&mut self, now: Instant) -> u64 {
        self.tick(now);
        let dropped = self.encode_frames(now, ENCODE_PER_STEP);
        self.pacer.handle_timeout(now);
        dropped
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

    /// When the next queued item is due: at once while audio waits to be encoded.
    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        let encode = if self.pcm_frames() > 0 {
            self.now
        } else {
            None
        };
        [self.pacer.poll_timeout(), encode]
            .into_iter()
            .flatten()
            .min()
    }

    /// Items waiting: in the pacer, and whole frames not yet encoded. (A partial frame is not
    /// counted: it becomes a frame only when the response's audio ends, and a response whose
    /// end is never flushed must not hold `tts stop` back.)
    pub(super) fn queued(&self) -> usize {
        self.pacer.queued() + self.pcm_frames()
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

    /// Time only moves forward, whatever order the caller's events arrive in.
    fn tick(&mut self, now: Instant) {
        self.now = Some(self.now.map_or(now, |prev| prev.max(now)));
    }

    /// Whole frames of audio waiting to be encoded.
    fn pcm_frames(&self) -> usize {
        self.encoding
            .as_ref()
            .map_or(0, |e| e.pcm.len() / self.frame_samples)
    }

    /// Encodes up to `max` whole frames of waiting audio and queues them, with the subtitles
    /// whose audio starts in them; then finishes a flushed response that is all encoded.
    /// Returns the frames refused.
    fn encode_frames(&mut self, now: Instant, max: usize) -> u64 {
        let n = self.frame_samples;
        let mut dropped = 0;
        if let Some(e) = &mut self.encoding {
            let mut start = 0;
            while start / n < max
                && let Some(chunk) = e.pcm.get(start..start + n)
            {
                start += n;
                let end = self.encoded + n as u64;
                self.encoded = end;
                // Subtitles of sentences that start in this frame: all but the last go out on
                // their own (sentences shorter than a frame), the last with the frame.
                let mut subtitle = None;
                while self.subtitles.front().is_some_and(|(at, _)| *at < end) {
                    if let Some(earlier) = subtitle.take() {
                        dropped += push(&mut self.pacer, now, Some(earlier), None);
                    }
                    subtitle = self.subtitles.pop_front().map(|(_, s)| s);
                    if let Some((_, before)) = &mut self.flush {
                        *before = before.saturating_sub(1);
                    }
                }
                match e.encoder.encode(chunk) {
                    Ok(p) => {
                        let packet = Bytes::copy_from_slice(p);
                        dropped += push(&mut self.pacer, now, subtitle, Some(packet));
                    }
                    Err(err) => {
                        tracing::warn!(%err, "opus encode failed");
                        if subtitle.is_some() {
                            dropped += push(&mut self.pacer, now, subtitle, None);
                        }
                    }
                }
            }
            e.pcm.drain(..start);
        }
        if let Some((end, before)) = self.flush
            && self.encoded >= end
        {
            // Sentences with no audio at all still get their subtitles, in order.
            for _ in 0..before {
                if let Some((_, s)) = self.subtitles.pop_front() {
                    dropped += push(&mut self.pacer, now, Some(s), None);
                }
            }
            self.flush = None;
            if self.encoding.as_ref().is_none_or(|e| e.pcm.is_empty()) {
                self.encoding = None;
            }
        }
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

/// Queues one paced item; 1 when the full pacer refused it.
fn push(
    pacer: &mut Pacer<Paced>,
    now: Instant,
    subtitle: Option<String>,
    packet: Option<Bytes>,
) -> u64 {
    u64::from(pacer.handle_input(now, Paced { subtitle, packet }).is_err())
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

    /// What the session's steps at `now` release: steps go on while something is due.
    fn release(r: &mut Reply, now: Instant) -> Vec<Released> {
        let mut out = Vec::new();
        loop {
            r.handle_timeout(now);
            out.extend(std::iter::from_fn(|| r.poll_output()));
            if r.poll_timeout().is_none_or(|t| t > now) {
                return out;
            }
        }
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
        assert_eq!(r.queued(), 2);
        let mut dec = OpusDecoder::new(24_000, OpusBackend::Pure).unwrap();
        let out = release(&mut r, t0);
        assert_eq!(out.len(), 2);
        for x in out {
            let pcm = dec.decode(&x.frame.unwrap()).unwrap();
            assert_eq!(pcm.len(), FRAME);
        }
        assert!(
            !r.is_encoding(),
            "the encoder lives only while audio arrives and waits"
        );
    }

    #[test]
    fn a_long_chunk_is_encoded_a_frame_per_step() {
        let t0 = Instant::now();
        let mut r = Reply::new(settings(ProtocolVersion::V1)).unwrap();
        r.sentence("hello".into());
        r.push_audio(t0, &tone(FRAME * 8, 24_000), 24_000);
        r.flush(t0);
        assert_eq!(r.poll_timeout(), Some(t0), "encoding is due at once");
        // The first step encodes and releases the first frame alone.
        r.handle_timeout(t0);
        let first: Vec<_> = std::iter::from_fn(|| r.poll_output()).collect();
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].subtitle.as_deref(), Some("hello"));
        assert_eq!(r.queued(), 7);
        assert_eq!(r.poll_timeout(), Some(t0));
        // The rest of the lead follows step by step at the same instant.
        assert_eq!(release(&mut r, t0).len(), 4);
        assert_eq!(r.poll_timeout(), Some(t0 + 60 * MS));
    }

    #[test]
    fn more_than_two_seconds_waiting_is_encoded_at_once() {
        let t0 = Instant::now();
        let mut r = Reply::new(settings(ProtocolVersion::V1)).unwrap();
        r.push_audio(t0, &tone(FRAME * 40, 24_000), 24_000);
        assert_eq!(r.pcm_frames(), MAX_PCM_FRAMES);
        assert_eq!(r.pacer.queued(), 40 - MAX_PCM_FRAMES);
        assert_eq!(r.queued(), 40);
    }

    #[test]
    fn subtitles_ride_with_the_frame_their_audio_starts_in() {
        let t0 = Instant::now();
        let mut r = Reply::new(settings(ProtocolVersion::V1)).unwrap();
        r.sentence("one".into());
        r.push_audio(t0, &tone(FRAME * 2, 24_000), 24_000);
        // Two sentences whose audio starts in the third frame, the first shorter than a frame.
        r.sentence("two".into());
        r.push_audio(t0, &tone(FRAME / 2, 24_000), 24_000);
        r.sentence("three".into());
        r.push_audio(t0, &tone(FRAME * 2, 24_000), 24_000);
        r.flush(t0);
        let out = release(&mut r, t0);
        let shape: Vec<_> = out
            .iter()
            .map(|x| (x.subtitle.as_deref(), x.frame.is_some()))
            .collect();
        assert_eq!(
            shape,
            [
                (Some("one"), true),
                (None, true),
                (Some("two"), false),
                (Some("three"), true),
                (None, true),
            ]
        );
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
        assert_eq!(r.push_audio(t0, &tone(FRAME * 5, 24_000), 24_000), 0);
        let dropped: u64 = (0..5).map(|_| r.handle_timeout(t0)).sum();
        assert_eq!(dropped, 2);
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
