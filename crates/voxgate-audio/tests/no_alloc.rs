//! Steady state allocates nothing per frame: a counting global allocator watches the uplink
//! (Opus decode + VAD, and raw PCM + resample + VAD) and downlink (resample + Opus encode +
//! pacer) paths after a warm-up.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use voxgate_audio::format::{PcmDecoder, PcmEncoder, PcmFormat, SampleFormat};
use voxgate_audio::opus::{OpusBackend, OpusDecoder, OpusEncoder, OpusEncoderConfig};
use voxgate_audio::pacer::{Pacer, PacerConfig};
use voxgate_audio::resample::{RateConverter, Resampler};
use voxgate_audio::vad::{Vad, VadConfig};
use voxgate_audio::wav::read_wav;
use voxgate_test_support::CountingAllocator;

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

fn allocations() -> u64 {
    voxgate_test_support::allocations().count
}

fn speech() -> Vec<f32> {
    let bytes = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/speech.wav"
    ))
    .unwrap();
    read_wav(&bytes).unwrap().to_mono()
}

fn backends() -> Vec<OpusBackend> {
    [OpusBackend::Pure, OpusBackend::Libopus]
        .into_iter()
        .filter(|b| b.is_available())
        .collect()
}

/// Runs `frame(k)` for warm-up frames, then asserts the next ones allocate nothing.
fn assert_steady_state(name: &str, mut frame: impl FnMut(usize)) {
    for k in 0..30 {
        frame(k);
    }
    let before = allocations();
    for k in 30..230 {
        frame(k);
    }
    let n = allocations() - before;
    assert_eq!(
        n, 0,
        "{name}: {n} allocations over 200 frames in steady state"
    );
}

#[test]
fn xiaozhi_uplink_opus_then_vad() {
    let speech = speech();
    for backend in backends() {
        // Real packets, encoded up front (encoding is not part of this path).
        let mut enc = OpusEncoder::new(OpusEncoderConfig {
            backend,
            ..OpusEncoderConfig::voice(16_000)
        })
        .unwrap();
        let pcm: Vec<i16> = speech
            .iter()
            .map(|&s| voxgate_audio::format::f32_to_i16(s))
            .collect();
        let packets: Vec<Vec<u8>> = pcm
            .chunks_exact(960)
            .map(|f| enc.encode(f).unwrap().to_vec())
            .collect();
        let mut dec = OpusDecoder::new(16_000, backend).unwrap();
        let mut vad = Vad::new(VadConfig::default(), 16_000).unwrap();
        vad.set_frame_telemetry(true);
        assert_steady_state(&format!("uplink {backend:?}"), |k| {
            let pcm = dec.decode(&packets[k % packets.len()]).unwrap();
            vad.process_i16(pcm);
            while vad.poll_output().is_some() {}
            if k % 10 == 9 {
                // A lost packet now and then.
                let n = dec.last_frame_samples();
                vad.process_i16(dec.conceal(n).unwrap());
            }
        });
    }
}

#[test]
fn realtime_uplink_pcm_resample_vad() {
    let speech = speech();
    let mut to48 = Resampler::new(16_000, 48_000).unwrap();
    let mut wide = Vec::new();
    to48.process(&speech, &mut wide);
    let format = PcmFormat::new(48_000, 2, SampleFormat::Signed16).unwrap();
    let mut bytes = Vec::new();
    PcmEncoder::new(format).encode_f32(&wide, &mut bytes);
    let mut pcm = PcmDecoder::new(format);
    let mut vad = Vad::new(VadConfig::default(), 48_000).unwrap();
    let mut samples = Vec::with_capacity(4096);
    // 20 ms packets cut one byte off the frame grid, so carries happen every time.
    let packet = 48 * 20 * 4 + 1;
    assert_steady_state("realtime uplink", |k| {
        let at = (k * packet) % (bytes.len() - packet);
        samples.clear();
        pcm.decode_f32(&bytes[at..at + packet], &mut samples);
        vad.process(&samples);
        while vad.poll_output().is_some() {}
    });
}

#[test]
fn xiaozhi_downlink_resample_encode_pace() {
    let speech = speech();
    for backend in backends() {
        for tts_rate in [22_050, 24_000] {
            let mut to_tts = Resampler::new(16_000, tts_rate).unwrap();
            let mut tts = Vec::new();
            to_tts.process(&speech, &mut tts);
            let mut resampler = Resampler::new(tts_rate, 24_000).unwrap();
            let mut enc = OpusEncoder::new(OpusEncoderConfig {
                backend,
                ..OpusEncoderConfig::voice(24_000)
            })
            .unwrap();
            let frame = enc.frame_samples();
            let mut pending: Vec<f32> = Vec::with_capacity(frame * 3);
            let mut pacer = Pacer::new(PacerConfig::new(Duration::from_millis(60), 5, 64));
            let t0 = Instant::now();
            let chunk = tts_rate as usize * 60 / 1000;
            let mut bytes_out = 0usize;
            assert_steady_state(&format!("downlink {backend:?} {tts_rate}"), |k| {
                let at = (k * chunk) % (tts.len() - chunk);
                resampler.process(&tts[at..at + chunk], &mut pending);
                while pending.len() >= frame {
                    let packet = enc.encode_f32(&pending[..frame]).unwrap();
                    bytes_out += packet.len();
                    pending.drain(..frame);
                    let _ = pacer.handle_input(t0, k);
                }
                let now = t0 + Duration::from_millis(60 * k as u64);
                pacer.handle_timeout(now);
                while pacer.poll_output().is_some() {}
            });
            assert!(bytes_out > 0);
        }
    }
}

/// A door's reply path: TTS audio as i16 at whatever rate the voice has, through one
/// `RateConverter` into a reused buffer. After warm-up (and the rebuild a rate change costs),
/// frames allocate nothing, including the end-of-sentence flushes.
#[test]
fn rate_converter_steady_state() {
    let speech = speech();
    let tts: Vec<i16> = speech
        .iter()
        .map(|&s| voxgate_audio::format::f32_to_i16(s))
        .collect();
    for (rate, out_rate) in [(22_050, 24_000), (24_000, 16_000), (16_000, 16_000)] {
        let mut conv = RateConverter::new(out_rate).unwrap();
        let mut out: Vec<f32> = Vec::with_capacity(8192);
        let mut ints: Vec<i16> = Vec::with_capacity(8192);
        let chunk = rate as usize * 60 / 1000;
        assert_steady_state(&format!("rate converter {rate}->{out_rate}"), |k| {
            let at = (k * chunk) % (tts.len() - chunk);
            out.clear();
            conv.process_i16(&tts[at..at + chunk], rate, &mut out)
                .unwrap();
            ints.clear();
            conv.process_i16_to_i16(&tts[at..at + chunk], rate, &mut ints)
                .unwrap();
            if k % 7 == 6 {
                out.clear();
                conv.flush(&mut out);
                ints.clear();
                conv.flush_i16(&mut ints);
            }
        });
    }
    // And f32 input (the Gemini uplink) after a rate change mid-stream.
    let mut conv = RateConverter::new(16_000).unwrap();
    let mut out: Vec<f32> = Vec::with_capacity(8192);
    conv.process(&speech[..4800], 48_000, &mut out).unwrap();
    assert_steady_state("rate converter f32 44.1k->16k", |k| {
        let at = (k * 441) % (speech.len() - 441);
        out.clear();
        conv.process(&speech[at..at + 441], 44_100, &mut out)
            .unwrap();
    });
}

/// The counter itself works (otherwise the tests above would pass vacuously).
#[test]
fn counter_sees_allocations() {
    let before = allocations();
    let v = std::hint::black_box(vec![0u8; 64]);
    assert_eq!(allocations() - before, 1);
    drop(v);
    let mut out = Vec::new();
    let mut r = Resampler::new(24_000, 16_000).unwrap();
    let before = allocations();
    r.process(&[0.0; 480], &mut out);
    assert!(allocations() > before, "a fresh output Vec must grow");
}

/// Heap one detector holds: earshot's boxed model state (7.6 KiB), the 16-bit history (the
/// 500 ms backbuffer plus the start window, 20 KiB at 16 kHz, where it also serves the volume
/// gate's replay), the gate's 8 KiB replay ring when resampling, and the output queue. Before
/// the history was stored as 16-bit samples a detector held 51,700 bytes at 16 kHz (176,710 at
/// 48 kHz, most of it the f32 history).
#[test]
fn vad_heap_per_session() {
    for (rate, bound) in [(16_000, 30 * 1024), (48_000, 124 * 1024)] {
        let (vad, stats) =
            voxgate_test_support::measure(|| Vad::new(VadConfig::default(), rate).unwrap());
        eprintln!(
            "Vad at {rate} Hz: {} heap bytes in {} allocations, {} inline",
            stats.bytes,
            stats.count,
            size_of_val(&vad)
        );
        assert!(stats.bytes > 20_000, "the history is counted");
        assert!(
            stats.bytes <= bound,
            "{rate} Hz: {} bytes, want at most {bound}",
            stats.bytes
        );
        drop(vad);
    }
    // The largest configuration a client can ask for, at the highest rate: the history is
    // bounded (a 60 s backbuffer and start window at 192 kHz used to cost 46 MB).
    let largest = VadConfig {
        start_duration: voxgate_audio::vad::MAX_START_DURATION,
        stop_duration: voxgate_audio::vad::MAX_STOP_DURATION,
        backbuffer_duration: voxgate_audio::vad::MAX_BACKBUFFER_DURATION,
        ..VadConfig::default()
    };
    let rate = voxgate_audio::vad::MAX_INPUT_RATE;
    let (vad, stats) = voxgate_test_support::measure(|| Vad::new(largest, rate).unwrap());
    // History plus the model, the 192 kHz -> 16 kHz resampler (about 90 KiB) and the queues.
    let bound = voxgate_audio::vad::MAX_HISTORY_SAMPLES * 2 + 160 * 1024;
    assert!(
        stats.bytes <= bound as u64,
        "largest VAD: {} bytes, want at most {bound}",
        stats.bytes
    );
    assert!(stats.bytes > 1_500_000, "the 5 s history is counted");
    drop(vad);
}

/// Heap one codec holds once built (its state and this crate's buffers), per backend, at the
/// Xiaozhi door's rate and at 48 kHz. libopus's state is allocated from Rust (voxgate-opus-sys),
/// so the counting allocator sees all of it. The figures are printed for the docs:
/// `cargo test -p voxgate-audio --test no_alloc codec_heap -- --nocapture`.
#[test]
fn codec_heap_per_backend() {
    // A tag of this thread's own, so tests running beside it are not counted.
    const TAG: usize = 3;
    voxgate_test_support::set_thread_tag(TAG);
    let held = |build: &dyn Fn() -> Box<dyn std::any::Any>| {
        let before = voxgate_test_support::live_bytes_tagged(TAG);
        let codec = build();
        let bytes = voxgate_test_support::live_bytes_tagged(TAG) - before;
        drop(codec);
        bytes
    };
    let mut pure_total = 0;
    for rate in [16_000, 48_000] {
        for backend in backends() {
            let enc = held(&|| {
                Box::new(
                    OpusEncoder::new(OpusEncoderConfig {
                        backend,
                        ..OpusEncoderConfig::voice(rate)
                    })
                    .unwrap(),
                )
            });
            let dec = held(&|| Box::new(OpusDecoder::new(rate, backend).unwrap()));
            println!(
                "{backend:?} at {rate} Hz: encoder {:.1} KB, decoder {:.1} KB of heap \
                 (structs {} + {} bytes)",
                enc as f64 / 1000.0,
                dec as f64 / 1000.0,
                size_of::<OpusEncoder>(),
                size_of::<OpusDecoder>(),
            );
            match backend {
                OpusBackend::Pure => pure_total = enc + dec,
                _ => assert!(
                    enc + dec < pure_total,
                    "libopus ({}) should hold less than opus-rs ({pure_total})",
                    enc + dec
                ),
            }
        }
    }
    voxgate_test_support::set_thread_tag(0);
}
