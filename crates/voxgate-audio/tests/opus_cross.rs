//! Cross-decode: packets from one backend decode with the other (needs `--features libopus`).
// Helpers outside #[test] fns may unwrap too: a failure is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![cfg(feature = "libopus")]

use voxgate_audio::format::f32_to_i16;
use voxgate_audio::opus::{
    FrameDuration, OpusBackend, OpusDecoder, OpusEncoder, OpusEncoderConfig,
};

fn speechlike(rate: u32, n: usize, offset: usize) -> Vec<i16> {
    (0..n)
        .map(|i| {
            let t = (i + offset) as f32 / rate as f32;
            // A 150 Hz voiced buzz with two formant-ish partials, amplitude-modulated at 4 Hz.
            let env = 0.5 + 0.5 * (std::f32::consts::TAU * 4.0 * t).sin();
            let s = (std::f32::consts::TAU * 150.0 * t).sin() * 0.3
                + (std::f32::consts::TAU * 700.0 * t).sin() * 0.15
                + (std::f32::consts::TAU * 2200.0 * t).sin() * 0.05;
            f32_to_i16(s * env)
        })
        .collect()
}

/// Signal-to-noise ratio of `got` against `want` in dB, after the codec's delay.
fn snr_db(want: &[i16], got: &[i16], delay: usize) -> f64 {
    let mut sig = 0.0;
    let mut noise = 0.0;
    for (w, g) in want.iter().zip(&got[delay..]) {
        sig += f64::from(*w).powi(2);
        noise += (f64::from(*w) - f64::from(*g)).powi(2);
    }
    10.0 * (sig / noise.max(1.0)).log10()
}

fn best_snr(want: &[i16], got: &[i16]) -> f64 {
    (0..400)
        .map(|d| snr_db(&want[..want.len() - 400], got, d))
        .fold(f64::MIN, f64::max)
}

/// Encodes with `enc_backend`, decodes with both backends; returns (SNR of the cross-decoded
/// audio against the input, SNR of the cross-decoded audio against the same-backend decode).
fn run(enc_backend: OpusBackend, rate: u32, fd: FrameDuration) -> (f64, f64) {
    let mut cfg = OpusEncoderConfig::voice(rate);
    cfg.frame_duration = fd;
    cfg.bitrate = 32_000;
    cfg.backend = enc_backend;
    let other = match enc_backend {
        OpusBackend::Pure => OpusBackend::Libopus,
        _ => OpusBackend::Pure,
    };
    let mut enc = OpusEncoder::new(cfg).unwrap();
    let mut same = OpusDecoder::new(rate, enc_backend).unwrap();
    let mut cross = OpusDecoder::new(rate, other).unwrap();
    let n = enc.frame_samples();
    let input = speechlike(rate, n * 25, 0);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for frame in input.chunks_exact(n) {
        let pkt = enc.encode(frame).unwrap().to_vec();
        a.extend_from_slice(same.decode(&pkt).unwrap());
        b.extend_from_slice(cross.decode(&pkt).unwrap());
    }
    assert_eq!(b.len(), input.len());
    (best_snr(&input, &b), snr_db(&a, &b, 0))
}

fn check(enc_backend: OpusBackend) {
    for rate in [8000, 16_000, 24_000, 48_000] {
        for fd in [
            FrameDuration::Ms20,
            FrameDuration::Ms40,
            FrameDuration::Ms60,
        ] {
            let (vs_input, vs_same) = run(enc_backend, rate, fd);
            eprintln!(
                "{enc_backend:?} encoder, {rate} Hz {fd:?}: {vs_input:.1} dB vs input, {vs_same:.1} dB vs same-backend decode"
            );
            // Opus is perceptual, so waveform SNR against the input is modest (hybrid mode at
            // 24/48 kHz especially); it still proves the cross-decoded audio is the signal.
            assert!(vs_input > 3.0, "{rate} {fd:?}: {vs_input:.1} dB vs input");
            // The two decoders implement the same normative algorithm (they agree to over 100 dB).
            assert!(
                vs_same > 60.0,
                "{rate} {fd:?}: decoders differ, {vs_same:.1} dB"
            );
        }
    }
}

#[test]
fn pure_encoder_libopus_decoder() {
    check(OpusBackend::Pure);
}

#[test]
fn libopus_encoder_pure_decoder() {
    check(OpusBackend::Libopus);
}

#[test]
fn both_decoders_agree_on_the_same_packets() {
    let mut enc = OpusEncoder::new(OpusEncoderConfig::voice(16_000)).unwrap();
    let mut pure = OpusDecoder::new(16_000, OpusBackend::Pure).unwrap();
    let mut c = OpusDecoder::new(16_000, OpusBackend::Libopus).unwrap();
    let input = speechlike(16_000, 960 * 10, 0);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for frame in input.chunks_exact(960) {
        let pkt = enc.encode(frame).unwrap().to_vec();
        a.extend_from_slice(pure.decode(&pkt).unwrap());
        b.extend_from_slice(c.decode(&pkt).unwrap());
    }
    // Same bitstream, same reference algorithm: the two outputs are near-identical.
    let snr = snr_db(&b, &a, 0);
    assert!(snr > 30.0, "decoders disagree: {snr:.1} dB");
}

#[test]
fn libopus_conceals_and_rejects_garbage() {
    let mut enc = OpusEncoder::new(OpusEncoderConfig {
        backend: OpusBackend::Libopus,
        ..OpusEncoderConfig::voice(16_000)
    })
    .unwrap();
    let mut dec = OpusDecoder::new(16_000, OpusBackend::Libopus).unwrap();
    let pkt = enc.encode(&speechlike(16_000, 960, 0)).unwrap().to_vec();
    dec.decode(&pkt).unwrap();
    assert_eq!(dec.conceal(960).unwrap().len(), 960);
    assert!(dec.decode(&[0x7b, 0x00]).is_err());
}

/// CELT-only (low delay) and general-audio packets cross-decode too, not just SILK/hybrid speech.
#[test]
fn celt_and_audio_modes_cross_decode() {
    use voxgate_audio::opus::OpusApplication;
    for application in [OpusApplication::LowDelay, OpusApplication::Audio] {
        for enc_backend in [OpusBackend::Pure, OpusBackend::Libopus] {
            let mut enc = OpusEncoder::new(OpusEncoderConfig {
                application,
                backend: enc_backend,
                bitrate: 64_000,
                frame_duration: FrameDuration::Ms20,
                ..OpusEncoderConfig::voice(48_000)
            })
            .unwrap();
            let mut pure = OpusDecoder::new(48_000, OpusBackend::Pure).unwrap();
            let mut c = OpusDecoder::new(48_000, OpusBackend::Libopus).unwrap();
            let input = speechlike(48_000, 960 * 20, 0);
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for frame in input.chunks_exact(960) {
                let pkt = enc.encode(frame).unwrap().to_vec();
                a.extend_from_slice(pure.decode(&pkt).unwrap());
                b.extend_from_slice(c.decode(&pkt).unwrap());
            }
            let agree = snr_db(&b, &a, 0);
            let vs_input = best_snr(&input, &b);
            eprintln!(
                "{application:?} from {enc_backend:?}: decoders agree to {agree:.1} dB, {vs_input:.1} dB vs input"
            );
            assert!(
                agree > 60.0,
                "{application:?} {enc_backend:?}: {agree:.1} dB"
            );
            assert!(
                vs_input > 3.0,
                "{application:?} {enc_backend:?}: {vs_input:.1} dB vs input"
            );
        }
    }
}
