//! Arbitrary bytes into every voxgate-audio decoder: the Opus decoder (as a packet stream), the
//! WAV reader and the raw sample-format converters. None may panic.
//!
//! Layout: the first byte selects the Opus output rate (`% 5`), the PCM layout (`% 5`, channels
//! from bits 3 to 5) and, with bit 7, whether the rest is one Opus packet (then a lost one) or
//! `[len u8][packet]` records (two of them are decoded).
#![no_main]

use libfuzzer_sys::fuzz_target;
use voxgate_audio::format::{PcmDecoder, PcmFormat, SampleFormat};
use voxgate_audio::opus::{OpusBackend, OpusDecoder};
use voxgate_audio::wav::read_wav;

const RATES: [u32; 5] = [8000, 12_000, 16_000, 24_000, 48_000];
const FORMATS: [SampleFormat; 5] = [
    SampleFormat::Unsigned8,
    SampleFormat::Signed16,
    SampleFormat::Signed32,
    SampleFormat::Float32,
    SampleFormat::Float64,
];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };

    // Opus: `rest` is a sequence of [len u8][packet] records, as a Xiaozhi v3-style stream;
    // a zero length stands for a lost packet and exercises concealment.
    if let Ok(mut dec) = OpusDecoder::new(RATES[usize::from(selector % 5)], OpusBackend::Pure) {
        if selector & 0x80 != 0 {
            // The whole rest as one packet (records stop at 255 bytes; Opus packets go to
            // 1275), then a lost packet after it.
            let _ = dec.decode(rest);
            let _ = dec.conceal(dec.last_frame_samples());
        } else {
            // Opus decoding dominates the cost of an input: two packets, enough for decoder
            // state to carry from one to the next (concealment after a decode, a decode after
            // concealment, `f32` after `i16`), keep executions per second above a thousand
            // (docs/fuzzing.md, "Throughput").
            let mut cursor = rest;
            for k in 0..2 {
                let Some((&len, tail)) = cursor.split_first() else {
                    break;
                };
                let len = usize::from(len).min(tail.len());
                let (packet, next) = tail.split_at(len);
                if packet.is_empty() {
                    let _ = dec.conceal(dec.last_frame_samples());
                } else if k % 2 == 0 {
                    let _ = dec.decode(packet);
                } else if let Ok(pcm) = dec.decode_f32(packet) {
                    assert!(pcm.iter().all(|s| (-1.0..=1.0).contains(s)));
                }
                cursor = next;
            }
        }
    }

    let _ = read_wav(data);
    let _ = read_wav(rest);

    // Raw PCM in the selected layout, split at an arbitrary point.
    let format = FORMATS[usize::from(selector % 5)];
    let channels = u16::from(selector >> 3) % 8 + 1;
    if let Ok(layout) = PcmFormat::new(16_000, channels, format) {
        let split = rest.first().map_or(0, |&b| usize::from(b)).min(rest.len());
        let (a, b) = rest.split_at(split);
        let mut f = Vec::new();
        let mut i = Vec::new();
        let mut dec = PcmDecoder::new(layout);
        dec.decode_f32(a, &mut f);
        dec.decode_f32(b, &mut f);
        let mut dec = PcmDecoder::new(layout);
        dec.decode_i16(a, &mut i);
        dec.decode_i16(b, &mut i);
        assert_eq!(f.len(), i.len());
        assert!(f.iter().all(|s| (-1.0..=1.0).contains(s)));
    }
});
