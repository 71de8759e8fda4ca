//! VAD on the committed fixtures (regenerate with tests/fixtures/make-fixtures.sh).
// Helpers outside #[test] fns may unwrap too: a failure is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

use voxgate_audio::resample::Resampler;
use voxgate_audio::vad::{Vad, VadConfig, VadOutput, VadState, VadTransition};
use voxgate_audio::wav::read_wav;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn load(name: &str) -> Vec<f32> {
    let bytes = std::fs::read(fixture_dir().join(name)).unwrap();
    let wav = read_wav(&bytes).unwrap();
    assert_eq!((wav.sample_rate, wav.channels), (16_000, 1), "{name}");
    wav.to_mono()
}

/// Speech bounds written by the fixture script.
fn bounds() -> (u64, u64) {
    let text = std::fs::read_to_string(fixture_dir().join("fixtures.txt")).unwrap();
    let get = |key: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .unwrap()
            .parse()
            .unwrap()
    };
    (get("speech_start"), get("speech_end"))
}

fn resample(samples: &[f32], to: u32) -> Vec<f32> {
    let mut r = Resampler::new(16_000, to).unwrap();
    let mut out = Vec::new();
    r.process(samples, &mut out);
    let delay = r.delay();
    r.flush(&mut out);
    out.drain(..delay);
    out
}

/// Runs the VAD over `samples` in 60 ms chunks (the Xiaozhi uplink frame) and returns its
/// transitions.
fn transitions(samples: &[f32], rate: u32, config: VadConfig) -> Vec<VadTransition> {
    let mut vad = Vad::new(config, rate).unwrap();
    let mut out = Vec::new();
    for chunk in samples.chunks(rate as usize * 60 / 1000) {
        vad.process(chunk);
        while let Some(o) = vad.poll_output() {
            if let VadOutput::Transition(t) = o {
                out.push(t);
            }
        }
    }
    out
}

fn to_ms(samples: u64, rate: u32) -> i64 {
    i64::try_from(samples * 1000 / u64::from(rate)).unwrap()
}

/// First SPEECH onset and last end of speech, in ms.
fn speech_span(ts: &[VadTransition], rate: u32) -> (i64, i64) {
    let start = ts
        .iter()
        .find(|t| t.to == VadState::Speech)
        .expect("speech was detected");
    let end = ts
        .iter()
        .rev()
        .find(|t| t.to == VadState::Silence && t.from == VadState::SpeechEnding)
        .expect("speech ended");
    (to_ms(start.onset, rate), to_ms(end.onset, rate))
}

fn describe(ts: &[VadTransition], rate: u32) -> String {
    ts.iter()
        .map(|t| {
            format!(
                "{:?}@{}ms(onset {}ms)",
                t.to,
                to_ms(t.position, rate),
                to_ms(t.onset, rate)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Tolerances: onset and end within 100 ms of the script's bounds (the model sees 16 ms
/// frames and soft consonants at the edges are legitimately ambiguous).
const TOL_MS: i64 = 100;

#[test]
fn speech_bounds_at_every_input_rate() {
    let (start, end) = bounds();
    let (start_ms, end_ms) = (to_ms(start, 16_000), to_ms(end, 16_000));
    let speech = load("speech.wav");
    for rate in [8000, 16_000, 24_000, 44_100, 48_000] {
        let input = if rate == 16_000 {
            speech.clone()
        } else {
            resample(&speech, rate)
        };
        let ts = transitions(&input, rate, VadConfig::default());
        eprintln!("{rate} Hz: {}", describe(&ts, rate));
        let (on, off) = speech_span(&ts, rate);
        assert!(
            (on - start_ms).abs() <= TOL_MS,
            "{rate} Hz onset {on} ms, want {start_ms}"
        );
        assert!(
            (off - end_ms).abs() <= TOL_MS,
            "{rate} Hz end {off} ms, want {end_ms}"
        );
        // It ends in silence, and SPEECH is declared within the start window after onset.
        assert_eq!(ts.last().unwrap().to, VadState::Silence);
        let declared = ts.iter().find(|t| t.to == VadState::Speech).unwrap();
        let lag = to_ms(declared.position, rate) - to_ms(declared.onset, rate);
        assert!(
            lag <= 96 + 2 * 16,
            "{rate} Hz: SPEECH declared {lag} ms after onset"
        );
    }
}

#[test]
fn never_fires_on_silence_or_low_noise() {
    for name in ["silence.wav", "noise.wav"] {
        let ts = transitions(&load(name), 16_000, VadConfig::default());
        assert!(
            ts.iter().all(|t| t.to != VadState::Speech),
            "{name}: {}",
            describe(&ts, 16_000)
        );
    }
    // Even with the volume gate off, the model alone rejects the noise.
    let open = VadConfig {
        min_volume: 0.0,
        ..VadConfig::default()
    };
    let ts = transitions(&load("noise.wav"), 16_000, open);
    assert!(
        ts.iter().all(|t| t.to != VadState::Speech),
        "{}",
        describe(&ts, 16_000)
    );
}

#[test]
fn catches_speech_in_noise_at_10_db_snr() {
    let (start, end) = bounds();
    let (start_ms, end_ms) = (to_ms(start, 16_000), to_ms(end, 16_000));
    let ts = transitions(&load("speech_noise_10db.wav"), 16_000, VadConfig::default());
    eprintln!("noisy: {}", describe(&ts, 16_000));
    let (on, off) = speech_span(&ts, 16_000);
    assert!(
        (on - start_ms).abs() <= TOL_MS,
        "onset {on} ms, want {start_ms}"
    );
    assert!(
        (off - end_ms).abs() <= 2 * TOL_MS,
        "end {off} ms, want {end_ms}"
    );
}

#[test]
fn backbuffer_returns_audio_from_before_the_onset() {
    let speech = load("speech.wav");
    let mut vad = Vad::new(VadConfig::default(), 16_000).unwrap();
    for chunk in speech.chunks(960) {
        vad.process(chunk);
        while let Some(o) = vad.poll_output() {
            if let VadOutput::Transition(t) = o
                && t.to == VadState::Speech
            {
                assert_eq!(t.audio_start, t.onset - 8000, "500 ms backbuffer");
                let mut audio = Vec::new();
                let first = vad.copy_audio(t.audio_start, &mut audio);
                assert_eq!(first, t.audio_start);
                let first = usize::try_from(first).unwrap();
                assert_eq!(audio, speech[first..first + audio.len()]);
                assert_eq!(
                    first + audio.len(),
                    usize::try_from(vad.position()).unwrap()
                );
                return;
            }
        }
    }
    panic!("no speech detected");
}

#[test]
fn frame_telemetry_covers_the_stream() {
    let speech = load("speech.wav");
    let mut vad = Vad::new(VadConfig::default(), 16_000).unwrap();
    vad.set_frame_telemetry(true);
    let mut frames = Vec::new();
    for chunk in speech.chunks(320) {
        vad.process(chunk);
        while let Some(o) = vad.poll_output() {
            if let VadOutput::Frame(f) = o {
                frames.push(f);
            }
        }
    }
    assert_eq!(frames.len(), speech.len() / 256);
    assert!(
        frames
            .windows(2)
            .all(|w| w[1].index == w[0].index + 1 && w[1].end == w[0].end + 256)
    );
    let (start, end) = bounds();
    let inside = |f: &&voxgate_audio::vad::VadFrame| f.end > start + 1600 && f.end < end - 1600;
    let speechy = frames
        .iter()
        .filter(inside)
        .filter(|f| f.confidence >= 0.5)
        .count();
    let total = frames.iter().filter(inside).count();
    assert!(
        speechy * 2 > total,
        "{speechy}/{total} frames inside speech score as speech"
    );
    assert!(
        frames
            .iter()
            .filter(|f| f.end < start)
            .all(|f| f.volume == 0.0),
        "digital silence has zero volume"
    );
}

/// A device stream: the speech fixture over the low-level noise floor (looped), then a pause of
/// noise only, then the speech again with the noise, like a user talking, waiting and talking.
fn device_stream() -> Vec<f32> {
    let speech = load("speech.wav");
    let noise = load("noise.wav");
    let mut out: Vec<f32> = speech
        .iter()
        .zip(noise.iter().cycle())
        .map(|(s, n)| s + n)
        .collect();
    out.extend(noise.iter().take(16_000 * 2));
    let again: Vec<f32> = speech
        .iter()
        .zip(noise.iter().cycle().skip(7_000))
        .map(|(s, n)| s + n)
        .collect();
    out.extend(again);
    out
}

/// Runs the VAD in 60 ms chunks with frame telemetry; returns transitions and frames.
fn run_full(
    samples: &[f32],
    rate: u32,
    gate: bool,
) -> (Vec<VadTransition>, Vec<voxgate_audio::vad::VadFrame>) {
    let mut vad = Vad::new(VadConfig::default(), rate).unwrap();
    vad.set_frame_telemetry(true);
    vad.set_volume_gate(gate);
    let (mut ts, mut fs) = (Vec::new(), Vec::new());
    for chunk in samples.chunks(rate as usize * 60 / 1000) {
        vad.process(chunk);
        while let Some(o) = vad.poll_output() {
            match o {
                VadOutput::Transition(t) => ts.push(t),
                VadOutput::Frame(f) => fs.push(f),
                _ => {}
            }
        }
    }
    (ts, fs)
}

/// The volume gate skips the model on frames below `min_volume`, which can never count as
/// speech; replaying the last 256 ms of quiet frames before the next loud one keeps earshot's
/// window, feature context and recurrent state close enough that every transition is the same
/// as with the model run on every frame, none moved by more than one 16 ms frame. Gated frames
/// report confidence 0.0 and their real volume.
#[test]
fn volume_gate_keeps_every_transition() {
    let inputs = [
        ("speech", load("speech.wav")),
        ("speech 10 dB SNR", load("speech_noise_10db.wav")),
        ("noise", load("noise.wav")),
        ("silence", load("silence.wav")),
        ("device stream", device_stream()),
    ];
    for (name, samples) in &inputs {
        for rate in [16_000, 48_000] {
            let input = if rate == 16_000 {
                samples.clone()
            } else {
                resample(samples, rate)
            };
            let (ts_off, fs_off) = run_full(&input, rate, false);
            let (ts_on, fs_on) = run_full(&input, rate, true);
            assert_eq!(fs_on.len(), fs_off.len());
            let mut gated = 0;
            let mut max_diff = 0.0f32;
            for (on, off) in fs_on.iter().zip(&fs_off) {
                assert_eq!(
                    (on.index, on.end, on.volume),
                    (off.index, off.end, off.volume)
                );
                if on.volume < VadConfig::default().min_volume {
                    assert_eq!(on.confidence, 0.0, "{name}: gated frames report 0.0");
                    gated += 1;
                } else {
                    max_diff = max_diff.max((on.confidence - off.confidence).abs());
                }
            }
            eprintln!(
                "{name} @ {rate} Hz: {gated}/{} frames gated, max confidence change on scored \
                 frames {max_diff:.4}",
                fs_on.len()
            );
            if gated > 0 {
                // With the gate off the model scores quiet frames too.
                assert!(
                    fs_off
                        .iter()
                        .any(|f| f.volume < VadConfig::default().min_volume && f.confidence > 0.0),
                    "{name}: set_volume_gate(false) scores every frame"
                );
            }
            // The same transitions in the same order, each decided within one model frame of
            // where the ungated detector decides it.
            let frame = u64::from(rate) * 16 / 1000;
            let same = ts_on.len() == ts_off.len()
                && ts_on.iter().zip(&ts_off).all(|(a, b)| {
                    (a.from, a.to) == (b.from, b.to)
                        && a.position.abs_diff(b.position) <= frame
                        && a.onset.abs_diff(b.onset) <= frame
                });
            assert!(
                same,
                "{name} @ {rate} Hz: gate on {}\ngate off {}",
                describe(&ts_on, rate),
                describe(&ts_off, rate)
            );
        }
    }
}

/// Fed in one call longer than the history, the gate cannot replay the quiet frames the history
/// no longer holds; detection still finds the speech within the usual tolerance.
#[test]
fn volume_gate_with_one_big_chunk() {
    let (start, end) = bounds();
    let (start_ms, end_ms) = (to_ms(start, 16_000), to_ms(end, 16_000));
    let speech = load("speech.wav");
    let mut vad = Vad::new(VadConfig::default(), 16_000).unwrap();
    vad.process(&speech);
    let ts: Vec<VadTransition> = std::iter::from_fn(|| vad.poll_output())
        .filter_map(|o| match o {
            VadOutput::Transition(t) => Some(t),
            _ => None,
        })
        .collect();
    eprintln!("one chunk: {}", describe(&ts, 16_000));
    let (on, off) = speech_span(&ts, 16_000);
    assert!(
        (on - start_ms).abs() <= TOL_MS,
        "onset {on} ms, want {start_ms}"
    );
    assert!(
        (off - end_ms).abs() <= TOL_MS,
        "end {off} ms, want {end_ms}"
    );
    // The history still returns the last samples at their true positions.
    let mut tail = Vec::new();
    let first = vad.copy_audio(0, &mut tail);
    assert_eq!(first + tail.len() as u64, speech.len() as u64);
    assert_eq!(tail, speech[usize::try_from(first).unwrap()..]);
}

/// What the Xiaozhi load generator streams and the server hears: `question.wav` and 2 s of
/// digital silence, through a 16 kHz 60 ms Opus encoder and decoder (libopus when built in).
fn question_through_opus() -> Vec<f32> {
    use voxgate_audio::opus::{OpusBackend, OpusDecoder, OpusEncoder, OpusEncoderConfig};
    let backend = if OpusBackend::Libopus.is_available() {
        OpusBackend::Libopus
    } else {
        OpusBackend::Pure
    };
    let mut samples = load("question.wav");
    samples.resize(samples.len().div_ceil(960) * 960 + 16_000 * 2, 0.0);
    let mut enc = OpusEncoder::new(OpusEncoderConfig {
        backend,
        ..OpusEncoderConfig::voice(16_000)
    })
    .unwrap();
    let mut dec = OpusDecoder::new(16_000, backend).unwrap();
    let mut out = Vec::with_capacity(samples.len());
    for frame in samples.chunks_exact(960) {
        let packet = enc.encode_f32(frame).unwrap().to_vec();
        out.extend_from_slice(dec.decode_f32(&packet).unwrap());
    }
    out
}

/// On the question (with its 140 ms pause after "Hello.") and on the same audio after Opus,
/// the uplink's real input, the gate changes no transition and moves none: the same states at
/// the same sample positions with the model run on every frame or only on frames above
/// `min_volume`.
#[test]
fn volume_gate_changes_nothing_on_the_question() {
    for (name, samples) in [
        ("question", load("question.wav")),
        ("question through Opus", question_through_opus()),
    ] {
        let (ts_off, _) = run_full(&samples, 16_000, false);
        let (ts_on, fs_on) = run_full(&samples, 16_000, true);
        let gated = fs_on
            .iter()
            .filter(|f| f.volume < VadConfig::default().min_volume)
            .count();
        eprintln!(
            "{name}: {gated}/{} frames gated; {}",
            fs_on.len(),
            describe(&ts_on, 16_000)
        );
        assert!(gated > 0, "{name}: the silence is gated");
        assert!(!ts_on.is_empty(), "{name}: speech is found");
        assert_eq!(
            ts_on,
            ts_off,
            "{name}: gate on {}\ngate off {}",
            describe(&ts_on, 16_000),
            describe(&ts_off, 16_000)
        );
    }
}
