//! Random event sequences against the machine, checking the invariants of issue 5 on
//! everything it outputs:
//! - one floor holder: state changes chain, and agent audio goes out only while Speaking;
//! - no audio after a clear unless a new response began after it;
//! - every begun response ends or is interrupted exactly once (checked after a final disconnect);
//! - history never holds unheard text: a record is a prefix of what was delivered, complete
//!   only once playback can have finished, and cut off no later than playback can have reached;
//! - tool calls: results and cancels only for invoked calls, at most one each;
//! - determinism: the same sequence gives the same outputs at the same times.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // helpers are test code too

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use voxgate_turn::testing::Harness;
use voxgate_turn::{
    AudioSpan, Config, Delivery, Input, InputError, Interruption, Output, State, TriggerMode,
    TurnId,
};

const BYTES_PER_MS: u64 = 48;
const WORDS: &[&str] = &[
    "",
    "uh",
    "stop",
    "wait a moment",
    "你好",
    "tell me more please",
];
const TEXTS: &[&str] = &["Hello there. ", "One two three ", "你好世界", "", "Done."];

#[derive(Debug, Clone)]
enum Turn {
    Current,
    Older(u32),
}

#[derive(Debug, Clone)]
enum Op {
    Advance(u64),
    SpeechStarted,
    SpeechStopped,
    SpeechOnset,
    SpeechOnsetRejected,
    Words(usize, bool),
    Prediction(f32),
    StartCapture,
    StopCapture,
    Text(usize, u8),
    SpeechTrigger(u8),
    Trigger(bool),
    Abort,
    Direct(bool, bool),
    Started(Turn),
    Chunk(Turn, usize, Option<u64>),
    End(Turn, bool),
    ToolStart(Turn, bool),
    ToolFinish(usize, bool),
    Progress(Turn, u16),
    Reconnect,
}

fn turn_ref() -> impl Strategy<Value = Turn> {
    prop_oneof![6 => Just(Turn::Current), 1 => (0u32..12).prop_map(Turn::Older)]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0u64..2500).prop_map(Op::Advance),
        4 => Just(Op::SpeechStarted),
        4 => Just(Op::SpeechStopped),
        2 => Just(Op::SpeechOnset),
        2 => Just(Op::SpeechOnsetRejected),
        4 => (0..WORDS.len(), any::<bool>()).prop_map(|(w, f)| Op::Words(w, f)),
        1 => (0.0f32..1.0).prop_map(Op::Prediction),
        1 => Just(Op::StartCapture),
        1 => Just(Op::StopCapture),
        2 => (0..WORDS.len(), 0u8..3).prop_map(|(w, m)| Op::Text(w, m)),
        1 => (0u8..3).prop_map(Op::SpeechTrigger),
        1 => any::<bool>().prop_map(Op::Trigger),
        1 => Just(Op::Abort),
        1 => (any::<bool>(), any::<bool>()).prop_map(|(a, b)| Op::Direct(a, b)),
        3 => turn_ref().prop_map(Op::Started),
        10 => (turn_ref(), 0..TEXTS.len(), prop::option::weighted(0.8, 0u64..1500))
            .prop_map(|(t, x, a)| Op::Chunk(t, x, a)),
        4 => (turn_ref(), any::<bool>()).prop_map(|(t, a)| Op::End(t, a)),
        2 => (turn_ref(), any::<bool>()).prop_map(|(t, c)| Op::ToolStart(t, c)),
        2 => (0usize..8, any::<bool>()).prop_map(|(i, ok)| Op::ToolFinish(i, ok)),
        4 => (turn_ref(), 0u16..=1100).prop_map(|(t, p)| Op::Progress(t, p)),
        1 => Just(Op::Reconnect),
    ]
}

fn config() -> impl Strategy<Value = Config> {
    (
        any::<bool>(),
        0u32..3,
        any::<bool>(),
        any::<bool>(),
        0u64..600,
    )
        .prop_map(
            |(reports, words, resume, abort_overrides, min_speech)| Config {
                playback_reports: reports,
                min_interruption_words: words,
                resume_false_interruptions: resume,
                abort_overrides_uninterruptible: abort_overrides,
                min_interruption_speech: Duration::from_millis(min_speech),
                ..Config::default()
            },
        )
}

/// What the test knows of one delivered chunk.
#[derive(Debug, Clone)]
struct Sent {
    text: String,
    offset: u64,
    bytes: u64,
    duration: Duration,
    at: Duration,
    audio: bool,
}

#[derive(Debug, Default)]
struct Checker {
    reports: bool,
    grace: Duration,
    state: Option<State>,
    cursor: usize,
    index: usize,
    open: BTreeSet<TurnId>,
    ended: BTreeSet<TurnId>,
    begun_at: BTreeMap<TurnId, usize>,
    last_clear: Option<usize>,
    cleared: BTreeSet<TurnId>,
    sent: BTreeMap<TurnId, Vec<Sent>>,
    reported: BTreeMap<TurnId, u64>,
    invoked: BTreeSet<String>,
    settled: BTreeSet<String>,
    /// Chunk fed, awaiting its Deliver: (turn, text, audio).
    pending_chunk: Option<(TurnId, String, Option<AudioSpan>)>,
}

impl Checker {
    fn delivered_text(&self, turn: TurnId) -> String {
        self.sent
            .get(&turn)
            .map(|v| v.iter().map(|s| s.text.as_str()).collect())
            .unwrap_or_default()
    }

    /// The most text that can have been played of `turn` at `at`.
    fn reachable_text(&self, turn: TurnId, at: Duration) -> String {
        let Some(chunks) = self.sent.get(&turn) else {
            return String::new();
        };
        let mut out = String::new();
        let mut earliest = Duration::ZERO;
        for c in chunks {
            // A chunk cannot start before it arrived, nor before every earlier chunk played.
            let start = earliest.max(c.at);
            let reached = if self.reports {
                let played = self.reported.get(&turn).copied().unwrap_or(0);
                c.offset < played || c.bytes == 0 && c.offset <= played
            } else {
                start < at || c.duration.is_zero() && start <= at
            };
            if !reached {
                break;
            }
            out.push_str(&c.text);
            earliest = start + c.duration;
        }
        out
    }

    /// Earliest time all audio of `turn` can have played (real-time playback); text-only
    /// chunks take no playing time.
    fn earliest_end(&self, turn: TurnId) -> Duration {
        let mut end = Duration::ZERO;
        for c in self
            .sent
            .get(&turn)
            .into_iter()
            .flatten()
            .filter(|c| c.audio)
        {
            end = end.max(c.at) + c.duration;
        }
        end
    }

    fn observe(&mut self, h: &Harness) {
        let log = h.log();
        while self.cursor < log.len() {
            let (at, out) = log[self.cursor].clone();
            self.cursor += 1;
            self.index += 1;
            self.check(at, out);
        }
        assert_eq!(self.state.unwrap_or(State::NotConnected), h.state());
    }

    fn check(&mut self, at: Duration, out: Output) {
        match out {
            Output::StateChanged { from, to } => {
                assert_eq!(from, self.state.unwrap_or(State::NotConnected));
                assert_ne!(from, to);
                self.state = Some(to);
            }
            Output::ResponseBegun { turn } => {
                assert!(!self.begun_at.contains_key(&turn), "{turn} begun twice");
                self.begun_at.insert(turn, self.index);
                self.open.insert(turn);
            }
            Output::Deliver { turn, seq } => {
                // One floor holder: agent output goes out only while the agent has the floor.
                assert_eq!(
                    self.state,
                    Some(State::Speaking),
                    "deliver outside Speaking"
                );
                assert!(self.open.contains(&turn), "deliver for {turn} not open");
                if let Some(clear) = self.last_clear {
                    assert!(self.begun_at[&turn] > clear, "audio after a clear");
                }
                let (t, text, audio) = self.pending_chunk.take().expect("deliver without chunk");
                assert_eq!(t, turn);
                let chunks = self.sent.entry(turn).or_default();
                assert_eq!(seq as usize, chunks.len());
                let offset = chunks.last().map_or(0, |c| c.offset + c.bytes);
                chunks.push(Sent {
                    text,
                    offset,
                    bytes: audio.map_or(0, |a| a.bytes),
                    duration: audio.map_or(Duration::ZERO, |a| a.duration),
                    at,
                    audio: audio.is_some(),
                });
            }
            Output::ClearPlayback { turn } => {
                assert!(self.open.contains(&turn));
                assert!(
                    self.sent
                        .get(&turn)
                        .is_some_and(|v| v.iter().any(|c| c.audio))
                );
                self.last_clear = Some(self.index);
                self.cleared.insert(turn);
            }
            Output::GenerationEnded { turn } => assert!(self.open.contains(&turn)),
            Output::ResponseEnded(rec) => {
                assert!(
                    self.open.remove(&rec.turn),
                    "{} ended but not open",
                    rec.turn
                );
                assert!(self.ended.insert(rec.turn));
                let delivered = self.delivered_text(rec.turn);
                assert!(
                    delivered.starts_with(&rec.heard_text),
                    "history holds undelivered text: {rec:?} vs {delivered:?}"
                );
                match rec.delivery {
                    Delivery::Complete => {
                        assert_eq!(rec.heard_text, delivered);
                        let done = self.reports
                            && self.reported.get(&rec.turn).copied().unwrap_or(0)
                                >= self
                                    .sent
                                    .get(&rec.turn)
                                    .into_iter()
                                    .flatten()
                                    .map(|c| c.bytes)
                                    .sum::<u64>();
                        let any_audio = self
                            .sent
                            .get(&rec.turn)
                            .is_some_and(|v| v.iter().any(|c| c.audio));
                        if !done && any_audio {
                            let end = self.earliest_end(rec.turn);
                            let grace = if self.reports {
                                self.grace
                            } else {
                                Duration::ZERO
                            };
                            assert!(at >= end + grace, "complete before playback could end");
                        }
                    }
                    Delivery::Interrupted { by } => {
                        // Barge-in halts playback at once: any audio sent is cleared.
                        let had_audio = self
                            .sent
                            .get(&rec.turn)
                            .is_some_and(|v| v.iter().any(|c| c.audio));
                        if had_audio && by != Interruption::Disconnect {
                            assert!(
                                self.cleared.contains(&rec.turn),
                                "interrupted without clear"
                            );
                        }
                        let reachable = self.reachable_text(rec.turn, at);
                        assert!(
                            rec.heard_text.len() <= reachable.len(),
                            "history holds unheard text: {:?} > {:?}",
                            rec.heard_text,
                            reachable
                        );
                    }
                    other => panic!("unknown delivery {other:?}"),
                }
            }
            Output::ActionInvoke { call_id, .. } => {
                assert!(self.invoked.insert(call_id));
            }
            Output::ActionResult { call_id, .. } | Output::CancelTool { call_id } => {
                assert!(self.invoked.contains(&call_id), "unknown call {call_id}");
                assert!(self.settled.insert(call_id), "call settled twice");
            }
            _ => {}
        }
    }
}

fn resolve(h: &Harness, t: &Turn) -> TurnId {
    match t {
        Turn::Current => h
            .machine()
            .current_response()
            .or_else(|| h.last_response_turn())
            .unwrap_or(TurnId(1)),
        Turn::Older(k) => TurnId(k + 1),
    }
}

/// Runs `ops`, checking every output; returns the full log for the determinism check.
fn run(config: &Config, ops: &[Op], origin: Instant) -> Vec<(Duration, Output)> {
    let mut h = Harness::connected(config.clone(), origin);
    let mut c = Checker {
        reports: config.playback_reports,
        grace: config.playback_report_grace,
        ..Checker::default()
    };
    c.observe(&h);
    let mut calls = 0u32;
    let mut call_ids: Vec<String> = Vec::new();
    for op in ops {
        let input = match op {
            Op::Advance(ms) => {
                h.advance(Duration::from_millis(*ms));
                c.observe(&h);
                continue;
            }
            Op::Reconnect => {
                for i in [Input::Disconnected, Input::Connect, Input::Connected] {
                    h.input(i).unwrap();
                }
                c.observe(&h);
                assert!(c.open.is_empty(), "disconnect left responses open");
                continue;
            }
            Op::SpeechStarted => Input::SpeechStarted,
            Op::SpeechStopped => Input::SpeechStopped,
            Op::SpeechOnset => Input::SpeechOnset,
            Op::SpeechOnsetRejected => Input::SpeechOnsetRejected,
            Op::Words(w, f) => Input::Words {
                text: WORDS[*w].into(),
                is_final: *f,
            },
            Op::Prediction(p) => Input::EndOfTurnPrediction { probability: *p },
            Op::StartCapture => Input::StartCapture,
            Op::StopCapture => Input::StopCapture,
            Op::Text(w, m) => Input::Text {
                text: WORDS[*w].into(),
                mode: [
                    TriggerMode::NoTrigger,
                    TriggerMode::Queue,
                    TriggerMode::Immediate,
                ][usize::from(*m)],
            },
            Op::SpeechTrigger(m) => Input::SpeechTrigger(
                [
                    TriggerMode::NoTrigger,
                    TriggerMode::Queue,
                    TriggerMode::Immediate,
                ][usize::from(*m)],
            ),
            Op::Trigger(flush) => Input::TriggerInference {
                instructions: None,
                flush_vad: *flush,
            },
            Op::Abort => Input::Abort,
            Op::Direct(include, unint) => Input::DirectSpeech {
                text: "Notice.".into(),
                include_in_history: *include,
                uninterruptible: *unint,
            },
            Op::Started(t) => Input::ResponseStarted {
                turn: resolve(&h, t),
            },
            Op::Chunk(t, x, a) => {
                let turn = resolve(&h, t);
                let audio = a.map(|ms| AudioSpan {
                    bytes: ms * BYTES_PER_MS,
                    duration: Duration::from_millis(ms),
                });
                c.pending_chunk = Some((turn, TEXTS[*x].into(), audio));
                Input::ResponseChunk {
                    turn,
                    text: TEXTS[*x].into(),
                    audio,
                }
            }
            Op::End(t, awaits) => Input::ResponseEnd {
                turn: resolve(&h, t),
                awaits_user: *awaits,
            },
            Op::ToolStart(t, cancel) => {
                calls += 1;
                let id = format!("call-{calls}");
                call_ids.push(id.clone());
                Input::ToolCallStarted {
                    turn: resolve(&h, t),
                    call_id: id,
                    name: "tool".into(),
                    cancel_on_interrupt: *cancel,
                }
            }
            Op::ToolFinish(i, ok) => Input::ToolCallFinished {
                call_id: call_ids
                    .get(i % call_ids.len().max(1))
                    .cloned()
                    .unwrap_or_else(|| "none".into()),
                ok: *ok,
            },
            Op::Progress(t, permille) => {
                let turn = resolve(&h, t);
                let total: u64 = c
                    .sent
                    .get(&turn)
                    .into_iter()
                    .flatten()
                    .map(|s| s.bytes)
                    .sum();
                let bytes = total * u64::from(*permille) / 1000;
                // The client never reports more than it was sent; the machine keeps the max.
                let bytes = bytes.min(total);
                if h.machine().current_response() == Some(turn) {
                    let r = c.reported.entry(turn).or_default();
                    *r = (*r).max(bytes);
                }
                Input::PlaybackProgress {
                    turn,
                    bytes_played: bytes,
                }
            }
        };
        match h.input(input) {
            Ok(_) => {}
            Err(InputError::UnknownToolCall { .. }) => {}
            Err(e) => panic!("unexpected refusal {e:?} in {:?}", h.state()),
        }
        c.observe(&h);
        // A chunk that was not delivered is stale: it must never reach the client.
        c.pending_chunk = None;
    }
    h.input(Input::Disconnected).unwrap();
    c.observe(&h);
    assert!(c.open.is_empty(), "responses left open: {:?}", c.open);
    assert_eq!(h.state(), State::NotConnected);
    h.log().to_vec()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_sequences_keep_the_invariants(
        config in config(),
        ops in prop::collection::vec(op(), 1..120),
    ) {
        let origin = Instant::now();
        let first = run(&config, &ops, origin);
        let second = run(&config, &ops, origin);
        prop_assert_eq!(first, second, "not deterministic");
    }
}

/// A scripted conversation shape that random sequences rarely hit in full: speech, reply,
/// barge-in, false interruption, resume, completion.
#[test]
fn a_long_structured_sequence_keeps_the_invariants() {
    let ops = vec![
        Op::SpeechStarted,
        Op::Words(5, true),
        Op::SpeechStopped,
        Op::Advance(400),
        Op::Started(Turn::Current),
        Op::Chunk(Turn::Current, 0, Some(800)),
        Op::Chunk(Turn::Current, 1, Some(800)),
        Op::Chunk(Turn::Current, 4, Some(800)),
        Op::End(Turn::Current, false),
        Op::Advance(900),
        Op::SpeechStarted,
        Op::Advance(700),
        Op::SpeechStopped,
        Op::Advance(2000),
        Op::Chunk(Turn::Current, 1, Some(800)),
        Op::End(Turn::Current, true),
        Op::Advance(2500),
        Op::Text(3, 1),
        Op::ToolStart(Turn::Current, true),
        Op::End(Turn::Current, false),
        Op::ToolFinish(0, true),
        Op::Chunk(Turn::Current, 2, None),
        Op::End(Turn::Current, false),
    ];
    for reports in [false, true] {
        let config = Config {
            playback_reports: reports,
            ..Config::default()
        };
        let log = run(&config, &ops, Instant::now());
        assert!(
            log.iter()
                .any(|(_, o)| matches!(o, Output::ResumeResponse { .. }))
        );
    }
}
