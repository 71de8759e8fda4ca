//! Audio blobs: WAV-in-one-frame, header quirks, and the decoder checked against the reference
//! base64 implementation on arbitrary input.
// Test helpers may unwrap and panic: a failure there is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use proptest::prelude::*;
use voxgate_gemini::audio::{
    WavHeader, decode_audio, decode_audio_into, decode_pcm_base64, decode_pcm_scalar,
    encode_pcm_base64, max_pcm_samples,
};
use voxgate_gemini::{AudioError, Blame, Blob, ClientMessage};

fn wav_bytes(
    rate: u32,
    channels: u16,
    bits: u16,
    tag: u16,
    extra_chunk: &[u8],
    data: &[u8],
) -> Vec<u8> {
    let mut w = Vec::new();
    w.extend_from_slice(b"RIFF");
    w.extend_from_slice(&0u32.to_le_bytes());
    w.extend_from_slice(b"WAVE");
    w.extend_from_slice(b"fmt ");
    w.extend_from_slice(&16u32.to_le_bytes());
    w.extend_from_slice(&tag.to_le_bytes());
    w.extend_from_slice(&channels.to_le_bytes());
    w.extend_from_slice(&rate.to_le_bytes());
    let block = u32::from(channels) * u32::from(bits / 8);
    w.extend_from_slice(&(rate * block).to_le_bytes());
    w.extend_from_slice(&u16::try_from(block).unwrap().to_le_bytes());
    w.extend_from_slice(&bits.to_le_bytes());
    w.extend_from_slice(extra_chunk);
    w.extend_from_slice(b"data");
    w.extend_from_slice(&u32::try_from(data.len()).unwrap().to_le_bytes());
    w.extend_from_slice(data);
    let riff_len = u32::try_from(w.len() - 8).unwrap();
    w[4..8].copy_from_slice(&riff_len.to_le_bytes());
    w
}

fn pcm_bytes(samples: &[i16]) -> Vec<u8> {
    samples.iter().flat_map(|s| s.to_le_bytes()).collect()
}

fn tone(n: usize) -> Vec<i16> {
    (0..n)
        .map(|i| i16::try_from((i * 37) % 60_000).unwrap_or(i16::MIN) ^ 0x2A5)
        .collect()
}

/// The test client's quirk: a whole ~370 KB WAV file as one `audio` frame.
#[test]
fn whole_wav_file_in_one_frame() {
    let samples = tone(185_000);
    let wav = wav_bytes(16_000, 1, 16, 1, &[], &pcm_bytes(&samples));
    assert!(wav.len() > 370_000);
    let frame = format!(
        r#"{{"type":"SEND_REALTIME_INPUT","payload":{{"audio":{{"mimeType":"audio/pcm;rate=16000","data":"{}"}}}}}}"#,
        STANDARD.encode(&wav)
    );
    let ClientMessage::SendRealtimeInput(input) = ClientMessage::decode(&frame).unwrap() else {
        panic!()
    };
    let mut pcm = Vec::new();
    let info = input.audio.unwrap().decode_pcm(&mut pcm).unwrap();
    assert_eq!(pcm.len(), samples.len());
    assert_eq!(pcm, samples, "the 44-byte header is stripped, not played");
    assert_eq!(info.sample_rate, Some(16_000));
    assert_eq!(info.channels, 1);
    assert_eq!(info.wav.unwrap().data_offset, 44);
}

/// A WAV's own rate wins over the mime type, and its channel count is reported.
#[test]
fn wav_header_rate_and_channels_are_honoured() {
    let samples = tone(4_800);
    let wav = wav_bytes(48_000, 2, 16, 1, &[], &pcm_bytes(&samples));
    let mut pcm = Vec::new();
    let info = decode_audio(&STANDARD.encode(&wav), "audio/pcm;rate=16000", &mut pcm).unwrap();
    assert_eq!(info.sample_rate, Some(48_000));
    assert_eq!(info.channels, 2);
    assert_eq!(pcm, samples);
}

/// A LIST chunk puts the samples at an odd offset; a trailing chunk follows the data.
#[test]
fn wav_with_odd_data_offset_and_trailing_chunk() {
    let samples = tone(1_001);
    let mut wav = wav_bytes(
        24_000,
        1,
        16,
        1,
        b"LIST\x05\0\0\0INFOx\0",
        &pcm_bytes(&samples),
    );
    wav.extend_from_slice(b"id3 \x04\0\0\0abcd");
    let mut out = vec![0i16; max_pcm_samples(wav.len() * 4 / 3 + 4)];
    let info = decode_audio_into(&STANDARD.encode(&wav), "audio/wav", &mut out).unwrap();
    assert_eq!(
        info.wav,
        Some(WavHeader {
            format_tag: 1,
            channels: 1,
            sample_rate: 24_000,
            bits_per_sample: 16,
            data_offset: 58,
            data_len: Some(2_002),
        })
    );
    assert_eq!(&out[..info.samples], samples.as_slice());
}

#[test]
fn wav_in_other_pcm_formats_is_converted_to_16_bit() {
    // The same four samples (silence, half scale up and down, full scale down) in each format.
    let want = [0_i16, 16_384, -16_384, -32_768];
    let float = |v: f32| -> Vec<u8> {
        [0.0, v, -v, -1.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect()
    };
    let cases: [(u16, u16, Vec<u8>, [i16; 4]); 5] = [
        (1, 8, vec![0x80, 0xC0, 0x40, 0x00], want),
        (
            1,
            24,
            [0_i32, 0x40_0000, -0x40_0000, -0x80_0000]
                .iter()
                .flat_map(|x| x.to_le_bytes()[..3].to_vec())
                .collect(),
            want,
        ),
        (
            1,
            32,
            [0_i32, 0x4000_0000, -0x4000_0000, i32::MIN]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
            want,
        ),
        (3, 32, float(0.5), [0, 16_384, -16_384, -32_767]),
        (
            3,
            64,
            [0.0_f64, 0.5, -0.5, -1.0]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
            [0, 16_384, -16_384, -32_767],
        ),
    ];
    for (tag, bits, data, expected) in cases {
        let wav = wav_bytes(8_000, 1, bits, tag, &[], &data);
        let mut pcm = vec![7_i16];
        let info = decode_audio(&STANDARD.encode(&wav), "audio/pcm;rate=16000", &mut pcm)
            .unwrap_or_else(|e| panic!("tag {tag}, {bits} bits: {e}"));
        assert_eq!(pcm[1..], expected, "tag {tag}, {bits} bits");
        assert_eq!(pcm[0], 7, "appended");
        assert_eq!(
            (info.samples, info.sample_rate, info.channels),
            (4, Some(8_000), 1)
        );
        assert!(!info.odd_byte_dropped);
    }
    // Out-of-range and NaN floats are clamped and silenced; a partial last sample is dropped.
    let mut data: Vec<u8> = [2.0_f32, -3.0, f32::NAN]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    data.extend([1, 2]);
    let wav = wav_bytes(8_000, 1, 32, 3, &[], &data);
    let mut pcm = Vec::new();
    let info = decode_audio(&STANDARD.encode(&wav), "audio/wav", &mut pcm).unwrap();
    assert_eq!(pcm, [32_767, -32_767, 0]);
    assert!(info.odd_byte_dropped);
    // Into a caller's buffer, 8-bit data reports the room it needs.
    let wav = wav_bytes(8_000, 1, 8, 1, &[], &[0x80; 100]);
    let b64 = STANDARD.encode(&wav);
    let mut out = vec![0_i16; max_pcm_samples(b64.len())];
    assert_eq!(
        decode_audio_into(&b64, "audio/wav", &mut out[..50]),
        Err(AudioError::BufferTooSmall {
            needed: 100,
            capacity: 50
        })
    );
}

#[test]
fn wav_in_other_formats_is_reported() {
    for (tag, bits) in [(3, 16), (1, 12), (6, 8), (0x55, 16)] {
        let wav = wav_bytes(44_100, 1, bits, tag, &[], &[0; 16]);
        let mut out = [0i16; 16];
        let err = decode_audio_into(&STANDARD.encode(&wav), "audio/wav", &mut out).unwrap_err();
        assert_eq!(
            err,
            AudioError::UnsupportedWav {
                format_tag: tag,
                bits_per_sample: bits
            }
        );
        assert_eq!(err.blame(), Blame::Protocol);
    }
}

#[test]
fn truncated_wav_header_is_malformed() {
    let wav = wav_bytes(16_000, 1, 16, 1, &[], &[]);
    let b64 = STANDARD.encode(&wav[..30]);
    let mut out = [0i16; 16];
    let err = decode_audio_into(&b64, "audio/wav", &mut out).unwrap_err();
    assert_eq!(err.blame(), Blame::Malformed);
}

#[test]
fn buffer_too_small_blames_the_caller() {
    let b64 = STANDARD.encode(pcm_bytes(&tone(100)));
    let mut out = [0i16; 10];
    let err = decode_pcm_base64(&b64, &mut out).unwrap_err();
    assert_eq!(
        err,
        AudioError::BufferTooSmall {
            needed: 100,
            capacity: 10
        }
    );
    assert_eq!(err.blame(), Blame::Caller);
}

#[test]
fn odd_byte_is_dropped_and_reported() {
    let b64 = STANDARD.encode([1u8, 0, 2, 0, 9]);
    let mut pcm = Vec::new();
    let info = decode_audio(&b64, "audio/pcm", &mut pcm).unwrap();
    assert_eq!(pcm, [1, 2]);
    assert!(info.odd_byte_dropped);
    assert_eq!(
        info.sample_rate, None,
        "no rate given: the caller's default applies"
    );
}

#[test]
fn blob_pcm_round_trip() {
    let samples = tone(2_400);
    let blob = Blob::pcm(&samples, 24_000);
    assert_eq!(blob.mime_type, "audio/pcm;rate=24000");
    assert_eq!(blob.data, STANDARD.encode(pcm_bytes(&samples)));
    let mut back = Vec::new();
    let info = blob.decode_pcm(&mut back).unwrap();
    assert_eq!(back, samples);
    assert_eq!(info.sample_rate, Some(24_000));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Same bytes as the reference implementation, for any input length and alignment.
    #[test]
    fn matches_reference_decoder(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let b64 = STANDARD.encode(&bytes);
        let mut out = vec![0i16; max_pcm_samples(b64.len())];
        let n = decode_pcm_base64(&b64, &mut out).unwrap();
        let expect: Vec<i16> = bytes
            .chunks_exact(2)
            .map(|p| i16::from_le_bytes([p[0], p[1]]))
            .collect();
        prop_assert_eq!(&out[..n], expect.as_slice());
        // The portable path agrees with the SIMD one.
        let mut scalar = vec![0i16; max_pcm_samples(b64.len())];
        let n = decode_pcm_scalar(&b64, &mut scalar).unwrap();
        prop_assert_eq!(&scalar[..n], expect.as_slice());
    }

    /// Whitespace anywhere (Android line wrapping, stray CRLF) changes nothing.
    #[test]
    fn whitespace_is_ignored(
        bytes in proptest::collection::vec(any::<u8>(), 0..300),
        breaks in proptest::collection::vec((any::<prop::sample::Index>(), prop::sample::select(vec![" ", "\n", "\r\n", "\t"])), 0..8),
    ) {
        let clean = STANDARD.encode(&bytes);
        let mut dirty = clean.clone();
        for (at, ws) in breaks {
            let i = at.index(dirty.len() + 1);
            dirty.insert_str(i, ws);
        }
        let mut a = vec![0i16; max_pcm_samples(dirty.len())];
        let mut b = vec![0i16; max_pcm_samples(dirty.len())];
        let na = decode_pcm_base64(&clean, &mut a).unwrap();
        let nb = decode_pcm_base64(&dirty, &mut b).unwrap();
        prop_assert_eq!(&a[..na], &b[..nb]);
    }

    /// Encoding then decoding gives the samples back.
    #[test]
    fn encode_decode_round_trip(samples in proptest::collection::vec(any::<i16>(), 0..500)) {
        let mut b64 = String::new();
        encode_pcm_base64(&samples, &mut b64);
        prop_assert_eq!(&b64, &STANDARD.encode(pcm_bytes(&samples)));
        let mut out = vec![0i16; max_pcm_samples(b64.len())];
        let n = decode_pcm_base64(&b64, &mut out).unwrap();
        prop_assert_eq!(&out[..n], samples.as_slice());
    }

    /// Any WAV wrapping (extra chunk of any size, so any data alignment) strips cleanly.
    #[test]
    fn wav_wrapping_strips_cleanly(
        samples in proptest::collection::vec(any::<i16>(), 0..400),
        extra_len in 0usize..40,
        rate in prop::sample::select(vec![8_000u32, 16_000, 24_000, 44_100, 48_000]),
    ) {
        let mut extra = b"junk".to_vec();
        extra.extend_from_slice(&u32::try_from(extra_len).unwrap().to_le_bytes());
        extra.extend(std::iter::repeat_n(7u8, extra_len));
        if extra_len % 2 == 1 {
            extra.push(0);
        }
        let wav = wav_bytes(rate, 1, 16, 1, &extra, &pcm_bytes(&samples));
        let mut pcm = Vec::new();
        let info = decode_audio(&STANDARD.encode(&wav), "audio/pcm;rate=16000", &mut pcm).unwrap();
        prop_assert_eq!(pcm, samples);
        prop_assert_eq!(info.sample_rate, Some(rate));
    }

    /// Arbitrary text never panics the decoder.
    #[test]
    fn arbitrary_text_never_panics(text in ".{0,200}", mime in "[a-z/;=0-9]{0,30}") {
        let mut out = vec![0i16; 64];
        let _ = decode_audio_into(&text, &mime, &mut out);
        let mut grow = Vec::new();
        let _ = decode_audio(&format!("UklGR{text}"), &mime, &mut grow);
    }
}
