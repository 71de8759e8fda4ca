//! The libopus backend (voxgate-audio's `libopus` feature; this target needs the fuzz crate's
//! `libopus` feature and cmake). The first byte picks the rate and the encoder settings.
//!
//! Decoding: the rest as one packet (selector bit 5) or as two `[len u8][packet]` records, at
//! the selected rate (the decoder is mono; stereo packets are downmixed). Never a panic; what
//! decodes is at most 120 ms, a whole number of 2.5 ms steps, and `f32` output keeps the
//! documented range.
//!
//! Encoding: the rest as little-endian PCM, one frame as `i16` or (selector bit 6) as `f32`
//! (NaN and infinities included). The packet fits `MAX_PACKET_BYTES` and decodes to one frame
//! with both backends.
#![no_main]

use libfuzzer_sys::fuzz_target;
use voxgate_audio::opus::{
    FrameDuration, MAX_PACKET_BYTES, OpusApplication, OpusBackend, OpusDecoder, OpusEncoder,
    OpusEncoderConfig,
};

const RATES: [u32; 5] = [8000, 12_000, 16_000, 24_000, 48_000];
const DURATIONS: [FrameDuration; 3] = [
    FrameDuration::Ms20,
    FrameDuration::Ms40,
    FrameDuration::Ms60,
];
const APPS: [OpusApplication; 3] = [
    OpusApplication::Voip,
    OpusApplication::Audio,
    OpusApplication::LowDelay,
];

fn check_decoded(rate: u32, n: usize) {
    let step = rate as usize / 400;
    assert!(
        n <= rate as usize * 120 / 1000,
        "{n} samples is over 120 ms"
    );
    assert!(
        n % step == 0,
        "{n} samples is not a whole number of 2.5 ms steps"
    );
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let rate = RATES[usize::from(selector % 5)];

    let mut dec = OpusDecoder::new(rate, OpusBackend::Libopus).expect("libopus is compiled in");
    if selector & 0x20 != 0 {
        // The whole rest as one packet: records stop at 255 bytes, Opus packets go to 1275.
        if let Ok(pcm) = dec.decode(rest) {
            check_decoded(rate, pcm.len());
        }
    } else {
        // Two packets carry decoder state from one to the next; more only slow the target.
        let mut cursor = rest;
        for k in 0..2 {
            let Some((&len, tail)) = cursor.split_first() else {
                break;
            };
            let len = usize::from(len).min(tail.len());
            let (packet, next) = tail.split_at(len);
            cursor = next;
            if packet.is_empty() {
                let samples = dec.last_frame_samples();
                if let Ok(pcm) = dec.conceal(samples) {
                    assert!(pcm.len() <= samples);
                }
            } else if k % 2 == 0 {
                if let Ok(pcm) = dec.decode(packet) {
                    check_decoded(rate, pcm.len());
                }
            } else if let Ok(pcm) = dec.decode_f32(packet) {
                check_decoded(rate, pcm.len());
                assert!(
                    pcm.iter().all(|s| (-1.0..=1.0).contains(s)),
                    "f32 output outside -1.0..=1.0"
                );
            }
        }
    }

    let settings = rest.first().copied().unwrap_or(0);
    let config = OpusEncoderConfig {
        sample_rate: rate,
        frame_duration: DURATIONS[usize::from(settings % 3)],
        bitrate: [6_000, 16_000, 24_000, 64_000, 510_000][usize::from(selector / 5 % 5)],
        complexity: settings / 3 % 11,
        cbr: selector & 0x80 != 0,
        application: APPS[usize::from(settings / 33 % 3)],
        backend: OpusBackend::Libopus,
    };
    let mut enc = OpusEncoder::new(config).expect("a valid configuration");
    let frame = enc.frame_samples();
    // One frame, as `i16` or as `f32` (NaN and infinities included) by the selector's bit 6:
    // encoding is the costly part of an input (libopus itself, which is not instrumented), so
    // one frame an input. The packet decodes to one frame with libopus (the decoder above: a
    // valid packet decodes whole whatever state came before) and with opus-rs.
    let packet = if selector & 0x40 == 0 {
        rest.get(..2 * frame).map(|b| {
            let pcm: Vec<i16> = b
                .chunks_exact(2)
                .map(|s| i16::from_le_bytes([s[0], s[1]]))
                .collect();
            enc.encode(&pcm).expect("a whole frame encodes").to_vec()
        })
    } else {
        rest.get(..4 * frame).map(|b| {
            let pcm: Vec<f32> = b
                .chunks_exact(4)
                .map(|s| f32::from_le_bytes([s[0], s[1], s[2], s[3]]))
                .collect();
            enc.encode_f32(&pcm).expect("a whole frame encodes").to_vec()
        })
    };
    if let Some(packet) = packet {
        assert!(!packet.is_empty() && packet.len() <= MAX_PACKET_BYTES);
        assert_eq!(dec.decode(&packet).map(<[i16]>::len), Ok(frame));
        let mut pure = OpusDecoder::new(rate, OpusBackend::Pure).expect("opus-rs decoder");
        assert_eq!(pure.decode(&packet).map(<[i16]>::len), Ok(frame));
    }
    // Settings from the input: out-of-range ones are refused, never applied.
    let bitrate = rest
        .iter()
        .fold(0u32, |a, &b| a.rotate_left(8) ^ u32::from(b));
    assert_eq!(
        enc.set_bitrate(bitrate).is_ok(),
        (500..=512_000).contains(&bitrate)
    );
    assert_eq!(enc.set_complexity(settings).is_ok(), settings <= 10);
});
