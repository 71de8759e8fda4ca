//! Speed of the per-frame paths a voice server runs, for both Opus backends.
//!
//! `cargo bench -p voxgate-audio` (the libopus column comes with the default `libopus` feature;
//! `--no-default-features` leaves opus-rs alone). Inputs are the committed speech fixture, so the
//! codec and VAD see real speech.

use std::time::{Duration, Instant};

use divan::{Bencher, black_box};
use voxgate_audio::format::{PcmDecoder, PcmEncoder, PcmFormat, SampleFormat, f32_to_i16};
use voxgate_audio::opus::{
    FrameDuration, OpusApplication, OpusBackend, OpusDecoder, OpusEncoder, OpusEncoderConfig,
};
use voxgate_audio::pacer::{Pacer, PacerConfig};
use voxgate_audio::resample::Resampler;
use voxgate_audio::vad::{Vad, VadConfig};
use voxgate_audio::wav::read_wav;

fn main() {
    divan::main();
}

const BACKENDS: &[&str] = &[
    "opus-rs",
    #[cfg(feature = "libopus")]
    "libopus",
];

fn backend(name: &str) -> OpusBackend {
    if name == "libopus" {
        OpusBackend::Libopus
    } else {
        OpusBackend::Pure
    }
}

fn speech_16k() -> Vec<f32> {
    let wav = read_wav(include_bytes!("../tests/fixtures/speech.wav")).unwrap_or_else(|_| {
        unreachable!("the committed fixture is a valid WAV");
    });
    wav.to_mono()
}

fn at_rate(rate: u32) -> Vec<f32> {
    let speech = speech_16k();
    let Ok(mut r) = Resampler::new(16_000, rate) else {
        unreachable!("common rate");
    };
    let mut out = Vec::new();
    r.process(&speech, &mut out);
    r.flush(&mut out);
    out
}

fn packets(rate: u32, fd: FrameDuration, b: OpusBackend) -> Vec<Vec<u8>> {
    let pcm: Vec<i16> = at_rate(rate).into_iter().map(f32_to_i16).collect();
    let Ok(mut enc) = OpusEncoder::new(OpusEncoderConfig {
        frame_duration: fd,
        backend: b,
        ..OpusEncoderConfig::voice(rate)
    }) else {
        unreachable!("valid config");
    };
    pcm.chunks_exact(enc.frame_samples())
        .filter_map(|f| enc.encode(f).ok().map(<[u8]>::to_vec))
        .collect()
}

/// Xiaozhi uplink: decode one 60 ms Opus packet at 16 kHz and run the VAD over it, cycling
/// through the speech fixture's packets (0.8 s of digital silence, the sentence, 0.8 s of
/// digital silence). See the `device_stream` variants for speech and silence apart.
#[divan::bench(args = BACKENDS)]
fn uplink_60ms_decode_and_vad(bencher: Bencher<'_, '_>, name: &str) {
    uplink(
        bencher,
        name,
        &packets(16_000, FrameDuration::Ms60, backend(name)),
    );
}

/// Which 60 ms packets of a device stream to replay.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    All,
    Speech,
    Silence,
}

fn fixture(name: &str) -> Vec<f32> {
    let bytes: &[u8] = match name {
        "noise" => include_bytes!("../tests/fixtures/noise.wav"),
        _ => include_bytes!("../tests/fixtures/speech.wav"),
    };
    let Ok(wav) = read_wav(bytes) else {
        unreachable!("the committed fixtures are valid WAVs");
    };
    wav.to_mono()
}

/// Speech bounds of `speech.wav` in samples (`tests/fixtures/fixtures.txt`).
const SPEECH: (usize, usize) = (12_800, 69_730);

/// What a listening device sends, at 16 kHz: the sentence over a -58 dBFS noise floor (the
/// `noise.wav` fixture, looped), 2 s of the noise floor alone, the sentence again. About 45 %
/// of it is speech. Returns the samples and, per 60 ms packet, whether it lies inside speech.
fn device_stream() -> (Vec<f32>, Vec<Option<bool>>) {
    let speech = fixture("speech");
    let noise = fixture("noise");
    let mut stream = Vec::new();
    let mut spans = Vec::new();
    for pause in [0, 32_000] {
        let at = stream.len() + pause;
        stream.extend(noise.iter().cycle().take(pause));
        stream.extend(speech.iter().zip(noise.iter().cycle()).map(|(s, n)| s + n));
        spans.push((at + SPEECH.0, at + SPEECH.1));
    }
    let kinds = (0..stream.len() / 960)
        .map(|k| {
            let (a, b) = (k * 960, k * 960 + 960);
            if spans.iter().any(|&(s, e)| a >= s && b <= e) {
                Some(true)
            } else if spans.iter().all(|&(s, e)| b <= s || a >= e) {
                Some(false)
            } else {
                None
            }
        })
        .collect();
    (stream, kinds)
}

fn device_packets(b: OpusBackend, part: Part) -> Vec<Vec<u8>> {
    let (stream, kinds) = device_stream();
    let Ok(mut enc) = OpusEncoder::new(OpusEncoderConfig {
        backend: b,
        ..OpusEncoderConfig::voice(16_000)
    }) else {
        unreachable!("valid config");
    };
    let pcm: Vec<i16> = stream.into_iter().map(f32_to_i16).collect();
    pcm.chunks_exact(enc.frame_samples())
        .zip(kinds)
        .filter_map(|(f, kind)| {
            let p = enc.encode(f).ok()?.to_vec();
            let keep = match part {
                Part::All => true,
                Part::Speech => kind == Some(true),
                Part::Silence => kind == Some(false),
            };
            keep.then_some(p)
        })
        .collect()
}

fn uplink(bencher: Bencher<'_, '_>, name: &str, packets: &[Vec<u8>]) {
    let b = backend(name);
    let Ok(mut dec) = OpusDecoder::new(16_000, b) else {
        unreachable!()
    };
    let Ok(mut vad) = Vad::new(VadConfig::default(), 16_000) else {
        unreachable!()
    };
    let mut k = 0;
    bencher.bench_local(|| {
        if let Ok(pcm) = dec.decode(&packets[k % packets.len()]) {
            vad.process_i16(pcm);
        }
        while black_box(vad.poll_output()).is_some() {}
        k += 1;
    });
}

/// The Xiaozhi uplink on a device stream (speech, pauses and the noise floor between them, see
/// [`device_stream`]), cycled in order: the mean is the average cost of a listening device.
#[divan::bench(args = BACKENDS)]
fn uplink_60ms_device_stream(bencher: Bencher<'_, '_>, name: &str) {
    uplink(bencher, name, &device_packets(backend(name), Part::All));
}

/// Only the device stream's packets that lie entirely inside speech, back to back: the cost
/// while a user talks (the model scores every frame but the quiet gaps between words).
#[divan::bench(args = BACKENDS)]
fn uplink_60ms_speech_only(bencher: Bencher<'_, '_>, name: &str) {
    uplink(bencher, name, &device_packets(backend(name), Part::Speech));
}

/// Only the device stream's noise-floor packets: the cost while a device listens to a quiet
/// room (the volume gate skips the model).
#[divan::bench(args = BACKENDS)]
fn uplink_60ms_silence_only(bencher: Bencher<'_, '_>, name: &str) {
    uplink(bencher, name, &device_packets(backend(name), Part::Silence));
}

/// Xiaozhi downlink: resample 60 ms of TTS audio to 24 kHz and Opus-encode a 60 ms frame at
/// complexity 5 (plus the pacer bookkeeping), with the VoIP application (SILK/hybrid).
#[divan::bench(args = BACKENDS, consts = [22_050, 24_000])]
fn downlink_60ms_resample_and_encode<const TTS_RATE: u32>(bencher: Bencher<'_, '_>, name: &str) {
    downlink(bencher, name, TTS_RATE, OpusApplication::Voip);
}

/// The same downlink with the audio application, what the Xiaozhi reference servers (and the
/// voxgate Xiaozhi door by default) encode replies with: CELT at 24 kbit/s.
#[divan::bench(args = BACKENDS, consts = [22_050, 24_000])]
fn downlink_60ms_resample_and_encode_audio_mode<const TTS_RATE: u32>(
    bencher: Bencher<'_, '_>,
    name: &str,
) {
    downlink(bencher, name, TTS_RATE, OpusApplication::Audio);
}

fn downlink(bencher: Bencher<'_, '_>, name: &str, tts_rate: u32, application: OpusApplication) {
    let tts = at_rate(tts_rate);
    let Ok(mut resampler) = Resampler::new(tts_rate, 24_000) else {
        unreachable!()
    };
    let Ok(mut enc) = OpusEncoder::new(OpusEncoderConfig {
        backend: backend(name),
        application,
        ..OpusEncoderConfig::voice(24_000)
    }) else {
        unreachable!()
    };
    let frame = enc.frame_samples();
    let chunk = tts_rate as usize * 60 / 1000;
    let mut pending = Vec::with_capacity(frame * 3);
    let mut pacer = Pacer::new(PacerConfig::new(Duration::from_millis(60), 5, 64));
    let t0 = Instant::now();
    let mut k = 0usize;
    bencher.bench_local(|| {
        let at = (k * chunk) % (tts.len() - chunk);
        resampler.process(&tts[at..at + chunk], &mut pending);
        while pending.len() >= frame {
            if let Ok(p) = enc.encode_f32(&pending[..frame]) {
                black_box(p);
            }
            pending.drain(..frame);
            let _ = pacer.handle_input(t0, k);
        }
        pacer.handle_timeout(t0 + Duration::from_millis(60 * k as u64));
        while black_box(pacer.poll_output()).is_some() {}
        k += 1;
    });
}

/// One 20 ms frame through the streaming resampler, for the common conversions.
#[divan::bench(args = [
    (24_000, 16_000),
    (48_000, 16_000),
    (8_000, 16_000),
    (44_100, 16_000),
    (22_050, 24_000),
    (16_000, 24_000),
    (24_000, 48_000),
    (16_000, 16_000),
])]
fn resample_20ms(bencher: Bencher<'_, '_>, (from, to): (u32, u32)) {
    let input = at_rate(from);
    let Ok(mut r) = Resampler::new(from, to) else {
        unreachable!()
    };
    let n = from as usize / 50;
    let mut out = Vec::with_capacity(r.block_output_samples() * 4);
    let mut k = 0;
    bencher.bench_local(|| {
        let at = (k * n) % (input.len() - n);
        out.clear();
        r.process(&input[at..at + n], &mut out);
        black_box(&out);
        k += 1;
    });
}

/// The pieces on their own.
#[divan::bench(args = BACKENDS)]
fn opus_decode_60ms_16k(bencher: Bencher<'_, '_>, name: &str) {
    let b = backend(name);
    let packets = packets(16_000, FrameDuration::Ms60, b);
    let Ok(mut dec) = OpusDecoder::new(16_000, b) else {
        unreachable!()
    };
    let mut k = 0;
    bencher.bench_local(|| {
        let _ = black_box(dec.decode(&packets[k % packets.len()]));
        k += 1;
    });
}

/// Encoder alone: one 60 ms frame at 16 kHz, complexity 5 (the Xiaozhi door's own format).
#[divan::bench(args = BACKENDS)]
fn opus_encode_60ms_16k(bencher: Bencher<'_, '_>, name: &str) {
    encode_frames(
        bencher,
        OpusEncoderConfig {
            backend: backend(name),
            ..OpusEncoderConfig::voice(16_000)
        },
    );
}

/// Encoder alone: one 60 ms frame at 24 kHz, complexity 5.
#[divan::bench(args = BACKENDS)]
fn opus_encode_60ms_24k(bencher: Bencher<'_, '_>, name: &str) {
    encode_frames(
        bencher,
        OpusEncoderConfig {
            backend: backend(name),
            ..OpusEncoderConfig::voice(24_000)
        },
    );
}

/// WebRTC reply path: one 20 ms frame of speech at 16 kHz (wideband), at the complexities a
/// server might pick (the WebRTC door uses 1).
#[divan::bench(args = BACKENDS, consts = [0, 1, 5])]
fn webrtc_encode_20ms_16k<const COMPLEXITY: u8>(bencher: Bencher<'_, '_>, name: &str) {
    encode_frames(
        bencher,
        webrtc_reply(name, COMPLEXITY, OpusApplication::Voip),
    );
}

/// The same frame CELT-only (`LowDelay`), at the complexities a server might pick.
#[divan::bench(args = BACKENDS, consts = [0, 1, 5])]
fn webrtc_encode_20ms_16k_celt<const COMPLEXITY: u8>(bencher: Bencher<'_, '_>, name: &str) {
    encode_frames(
        bencher,
        webrtc_reply(name, COMPLEXITY, OpusApplication::LowDelay),
    );
}

/// The WebRTC reply encoder's settings, at `complexity` and `application`.
fn webrtc_reply(name: &str, complexity: u8, application: OpusApplication) -> OpusEncoderConfig {
    OpusEncoderConfig {
        backend: backend(name),
        frame_duration: FrameDuration::Ms20,
        complexity,
        application,
        ..OpusEncoderConfig::voice(16_000)
    }
}

/// Encodes the speech fixture at the config's rate, one frame per iteration, cycling.
fn encode_frames(bencher: Bencher<'_, '_>, config: OpusEncoderConfig) {
    let pcm: Vec<i16> = at_rate(config.sample_rate)
        .into_iter()
        .map(f32_to_i16)
        .collect();
    let Ok(mut enc) = OpusEncoder::new(config) else {
        unreachable!("valid config")
    };
    let n = enc.frame_samples();
    let frames: Vec<&[i16]> = pcm.chunks_exact(n).collect();
    let mut k = 0;
    bencher.bench_local(|| {
        let _ = black_box(enc.encode(frames[k % frames.len()]));
        k += 1;
    });
}

/// WebRTC uplink: one 20 ms packet encoded at 48 kHz (what a browser sends) decoded to the
/// engine's 16 kHz.
#[divan::bench(args = BACKENDS)]
fn webrtc_decode_20ms_48k_to_16k(bencher: Bencher<'_, '_>, name: &str) {
    let b = backend(name);
    let packets = packets(48_000, FrameDuration::Ms20, b);
    let Ok(mut dec) = OpusDecoder::new(16_000, b) else {
        unreachable!()
    };
    let mut k = 0;
    bencher.bench_local(|| {
        let _ = black_box(dec.decode(&packets[k % packets.len()]));
        k += 1;
    });
}

/// VAD alone over 60 ms at 16 kHz (3.75 model frames).
#[divan::bench]
fn vad_60ms_16k(bencher: Bencher<'_, '_>) {
    let speech = speech_16k();
    let Ok(mut vad) = Vad::new(VadConfig::default(), 16_000) else {
        unreachable!()
    };
    let mut k = 0;
    bencher.bench_local(|| {
        let at = (k * 960) % (speech.len() - 960);
        vad.process(&speech[at..at + 960]);
        while black_box(vad.poll_output()).is_some() {}
        k += 1;
    });
}

/// VAD on 60 ms of digital silence at 16 kHz, with the volume gate (`gated`, the default: the
/// frames are below `min_volume`, so earshot is not run) and without it (`scored`: earshot on
/// every 16 ms frame, as before the gate). What a listening device in a quiet room costs.
#[divan::bench(args = ["gated", "scored"])]
fn vad_60ms_16k_silence(bencher: Bencher<'_, '_>, gate: &str) {
    let silence = vec![0.0f32; 960];
    let Ok(mut vad) = Vad::new(VadConfig::default(), 16_000) else {
        unreachable!()
    };
    vad.set_volume_gate(gate == "gated");
    bencher.bench_local(|| {
        vad.process(black_box(&silence));
        while black_box(vad.poll_output()).is_some() {}
    });
}

/// Realtime-protocol uplink: 20 ms of 48 kHz stereo s16 bytes to mono, resampled into the VAD.
#[divan::bench]
fn realtime_uplink_20ms_48k_stereo(bencher: Bencher<'_, '_>) {
    let wide = at_rate(48_000);
    let Ok(format) = PcmFormat::new(48_000, 2, SampleFormat::Signed16) else {
        unreachable!()
    };
    let mut bytes = Vec::new();
    PcmEncoder::new(format).encode_f32(&wide, &mut bytes);
    let mut pcm = PcmDecoder::new(format);
    let Ok(mut vad) = Vad::new(VadConfig::default(), 48_000) else {
        unreachable!()
    };
    let packet = 48 * 20 * 4;
    let mut samples = Vec::with_capacity(4096);
    let mut k = 0;
    bencher.bench_local(|| {
        let at = (k * packet) % (bytes.len() - packet);
        samples.clear();
        pcm.decode_f32(&bytes[at..at + packet], &mut samples);
        vad.process(&samples);
        while black_box(vad.poll_output()).is_some() {}
        k += 1;
    });
}
