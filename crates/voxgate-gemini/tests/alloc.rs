//! Audio decoding into a caller's buffer allocates nothing, WAV files included.
// Test helpers may unwrap and panic: a failure there is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use voxgate_gemini::audio::{decode_audio_into, encode_pcm_base64, max_pcm_samples};
use voxgate_test_support::{CountingAllocator, allocations_during};

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

#[test]
fn decode_into_buffer_does_not_allocate() {
    let samples: Vec<i16> = (0..2_400)
        .map(|i| i16::try_from(i % 3000).unwrap())
        .collect();
    let mut raw = String::new();
    encode_pcm_base64(&samples, &mut raw);

    // The same samples inside a WAV file with an odd-length extra chunk.
    let mut wav = Vec::new();
    wav.extend_from_slice(b"RIFF\0\0\0\0WAVEfmt \x10\0\0\0\x01\0\x01\0");
    wav.extend_from_slice(&24_000u32.to_le_bytes());
    wav.extend_from_slice(&48_000u32.to_le_bytes());
    wav.extend_from_slice(b"\x02\0\x10\0LIST\x01\0\0\0x\0data");
    wav.extend_from_slice(&4_800u32.to_le_bytes());
    for s in &samples {
        wav.extend_from_slice(&s.to_le_bytes());
    }
    let mut wav_i16: Vec<i16> = Vec::new();
    // Encode the WAV bytes through the PCM encoder by pairing them (its length is even).
    for p in wav.chunks_exact(2) {
        wav_i16.push(i16::from_le_bytes([p[0], p[1]]));
    }
    let mut wav_b64 = String::new();
    encode_pcm_base64(&wav_i16, &mut wav_b64);

    let mut out = vec![0i16; max_pcm_samples(wav_b64.len())];
    let n = allocations_during(|| {
        let info = decode_audio_into(&raw, "audio/pcm;rate=24000", &mut out).unwrap();
        assert_eq!(info.samples, samples.len());
        let info = decode_audio_into(&wav_b64, "audio/wav", &mut out).unwrap();
        assert_eq!(info.samples, samples.len());
        assert_eq!(info.sample_rate, Some(24_000));
    });
    assert_eq!(&out[..samples.len()], samples.as_slice());
    assert_eq!(n, 0, "decoding allocated {n} times");
}
