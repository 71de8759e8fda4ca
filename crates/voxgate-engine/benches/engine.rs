//! The engine's own cost per 20 ms audio frame and per LLM token.
//!
//! `frame_*` feeds 20 ms frames (320 samples at 16 kHz) of the speech fixture through the whole
//! engine (VAD included); `vad_only_*` feeds the same frames to a bare `Vad`, so the engine's
//! own share is the difference. `token_*` feeds one LLM text delta to a reply in progress.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use divan::{Bencher, counter::ItemsCount};
use voxgate_audio::vad::{Vad, VadConfig};
use voxgate_engine::{
    Engine, EngineConfig, Input, Output, ProviderEvent, ProviderRequest, RequestId, TriggerMode,
};

fn main() {
    divan::main();
}

fn speech() -> Vec<i16> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../voxgate-audio/tests/fixtures/speech.wav"
    );
    voxgate_audio::wav::read_wav(&std::fs::read(path).unwrap())
        .unwrap()
        .to_mono_i16()
}

const FRAMES: usize = 200;

fn frames(speech: bool) -> Vec<Vec<i16>> {
    let audio = if speech {
        self::speech()
    } else {
        vec![0; 320 * FRAMES]
    };
    audio
        .chunks_exact(320)
        .cycle()
        .take(FRAMES)
        .map(<[i16]>::to_vec)
        .collect()
}

fn run_frames(bencher: Bencher<'_, '_>, speech: bool) {
    let frames = frames(speech);
    bencher
        .counter(ItemsCount::new(FRAMES))
        .with_inputs(|| Engine::new(EngineConfig::default(), Instant::now()).unwrap())
        .bench_local_values(|mut engine| {
            let mut now = Instant::now();
            for f in &frames {
                engine.handle_audio_i16(now, f);
                while let Some(o) = engine.poll_output() {
                    divan::black_box(o);
                }
                if engine.poll_timeout().is_some_and(|t| t <= now) {
                    engine.handle_timeout(now);
                }
                now += std::time::Duration::from_millis(20);
            }
            engine
        });
}

fn run_vad(bencher: Bencher<'_, '_>, speech: bool) {
    let frames = frames(speech);
    bencher
        .counter(ItemsCount::new(FRAMES))
        .with_inputs(|| Vad::new(VadConfig::default(), 16_000).unwrap())
        .bench_local_values(|mut vad| {
            for f in &frames {
                vad.process_i16(f);
                while let Some(o) = vad.poll_output() {
                    divan::black_box(o);
                }
            }
            vad
        });
}

/// 20 ms frames of silence through the engine.
#[divan::bench]
fn frame_silence(bencher: Bencher<'_, '_>) {
    run_frames(bencher, false);
}

/// 20 ms frames of speech through the engine (utterance capture, turn events).
#[divan::bench]
fn frame_speech(bencher: Bencher<'_, '_>) {
    run_frames(bencher, true);
}

/// The same silent frames through the bare VAD.
#[divan::bench]
fn vad_only_silence(bencher: Bencher<'_, '_>) {
    run_vad(bencher, false);
}

/// The same speech frames through the bare VAD.
#[divan::bench]
fn vad_only_speech(bencher: Bencher<'_, '_>) {
    run_vad(bencher, true);
}

const TOKENS: usize = 200;

fn replying(tts: bool) -> (Engine, RequestId) {
    let config = if tts {
        EngineConfig::default()
    } else {
        EngineConfig {
            output_audio: None,
            ..EngineConfig::default()
        }
    };
    let now = Instant::now();
    let mut engine = Engine::new(config, now).unwrap();
    engine
        .handle_input(
            now,
            Input::Text {
                text: "Tell me about the sea.".into(),
                mode: TriggerMode::Queue,
            },
        )
        .unwrap();
    let id = std::iter::from_fn(|| engine.poll_output())
        .find_map(|o| match o {
            Output::Provider(ProviderRequest::Generate { id, .. }) => Some(id),
            _ => None,
        })
        .unwrap();
    (engine, id)
}

/// Typical LLM tokens: words with a leading space, sentence ends now and then.
fn tokens() -> Vec<String> {
    let words = [
        " The", " sea", " is", " wide", ",", " deep", " and", " old", ".", " Waves", " roll",
        " in", " from", " far", " away", "!",
    ];
    words
        .iter()
        .cycle()
        .take(TOKENS)
        .map(|w| (*w).to_owned())
        .collect()
}

fn run_tokens(bencher: Bencher<'_, '_>, tts: bool) {
    let tokens = tokens();
    bencher
        .counter(ItemsCount::new(TOKENS))
        .with_inputs(|| {
            let (engine, id) = replying(tts);
            let events: Vec<Input> = tokens
                .iter()
                .map(|t| {
                    Input::Provider(ProviderEvent::TextDelta {
                        id,
                        delta: t.clone(),
                    })
                })
                .collect();
            (engine, events)
        })
        .bench_local_values(|(mut engine, events)| {
            let now = Instant::now();
            for e in events {
                engine.handle_input(now, e).unwrap();
                while let Some(o) = engine.poll_output() {
                    divan::black_box(o);
                }
            }
            engine
        });
}

/// One token of a text-only reply (a `TextFragment` per token).
#[divan::bench]
fn token_text(bencher: Bencher<'_, '_>) {
    run_tokens(bencher, false);
}

/// One token of a spoken reply (sentence splitting, a `Synthesize` per sentence).
#[divan::bench]
fn token_tts(bencher: Bencher<'_, '_>) {
    run_tokens(bencher, true);
}
