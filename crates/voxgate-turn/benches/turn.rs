//! Throughput of `handle_input` over a typical turn: the user speaks with streaming partials,
//! the endpoint fires, the reply streams 60 ms audio chunks with playback reports, ends and
//! plays out. Divan reports time per turn; events per second = events per turn / that time.

use std::time::{Duration, Instant};

use divan::Bencher;
use voxgate_turn::{AudioSpan, Config, Input, Output, TurnMachine};

fn main() {
    divan::main();
}

/// Partial transcripts during the user's speech.
const PARTIALS: usize = 10;
/// 60 ms chunks of reply audio (3 s of speech).
const CHUNKS: usize = 50;

/// Events fed per turn: speech start/stop, partials, one final, response start, chunks plus one
/// playback report each, response end, plus the two timeouts (endpoint, playback end).
const EVENTS_PER_TURN: u64 = (2 + PARTIALS + 1 + 1 + 2 * CHUNKS + 1 + 2) as u64;

fn drain(m: &mut TurnMachine) -> usize {
    let mut n = 0;
    while let Some(o) = m.poll_output() {
        divan::black_box(&o);
        n += 1;
    }
    n
}

fn one_turn(m: &mut TurnMachine, t: &mut Instant) -> usize {
    let mut outputs = 0;
    let step = Duration::from_millis(60);
    m.handle_input(*t, Input::SpeechStarted).ok();
    for i in 0..PARTIALS {
        *t += step;
        let text = "what is the weather like in Berlin tomorrow"
            .split(' ')
            .take(i + 1)
            .collect::<Vec<_>>()
            .join(" ");
        m.handle_input(
            *t,
            Input::Words {
                text,
                is_final: false,
            },
        )
        .ok();
    }
    m.handle_input(
        *t,
        Input::Words {
            text: "what is the weather like in Berlin tomorrow".into(),
            is_final: true,
        },
    )
    .ok();
    m.handle_input(*t, Input::SpeechStopped).ok();
    outputs += drain(m);
    if let Some(deadline) = m.poll_timeout() {
        *t = deadline;
        m.handle_timeout(*t);
    }
    let mut turn = None;
    while let Some(o) = m.poll_output() {
        if let Output::StartResponse { turn: id, .. } = o {
            turn = Some(id);
        }
        outputs += 1;
    }
    let Some(turn) = turn else { return outputs };
    m.handle_input(*t, Input::ResponseStarted { turn }).ok();
    for i in 0..CHUNKS {
        m.handle_input(
            *t,
            Input::ResponseChunk {
                turn,
                text: "Sunny, twenty degrees. ".into(),
                audio: Some(AudioSpan {
                    bytes: 2880,
                    duration: step,
                }),
            },
        )
        .ok();
        outputs += drain(m);
        *t += step;
        m.handle_input(
            *t,
            Input::PlaybackProgress {
                turn,
                bytes_played: 2880 * (i as u64),
            },
        )
        .ok();
    }
    m.handle_input(
        *t,
        Input::ResponseEnd {
            turn,
            awaits_user: false,
        },
    )
    .ok();
    if let Some(deadline) = m.poll_timeout() {
        *t = deadline;
        m.handle_timeout(*t);
    }
    outputs += drain(m);
    outputs
}

#[divan::bench(args = [false, true])]
fn typical_turn(bencher: Bencher<'_, '_>, playback_reports: bool) {
    let config = Config {
        playback_reports,
        ..Config::default()
    };
    bencher
        .counter(divan::counter::ItemsCount::new(EVENTS_PER_TURN))
        .with_inputs(|| {
            let t = Instant::now();
            let mut m = TurnMachine::new(config.clone());
            m.handle_input(t, Input::Connect).ok();
            m.handle_input(t, Input::Connected).ok();
            while m.poll_output().is_some() {}
            (m, t)
        })
        .bench_local_values(|(mut m, mut t)| {
            let n = one_turn(&mut m, &mut t);
            assert!(n > CHUNKS, "the turn ran through");
            m
        });
}
