//! Speculative generation at pauses ([`voxgate_engine::Speculation`]): the spoken question
//! fixture (`question.wav`: "Hello." then a 128 ms pause the VAD sees, then the question)
//! driven on a virtual clock against scripted providers that answer after fixed delays, hear
//! a transcript that depends on the audio's length and answer the last user message.
#![allow(clippy::unwrap_used, clippy::panic)] // test helpers may unwrap and panic

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::*;
use proptest::prelude::*;
use serde_json::json;
use voxgate_engine::history::Role;
use voxgate_engine::provider::{ChatRole, ProviderEvent};
use voxgate_engine::{
    ClientEvent, EngineConfig, Input, Output, ProviderRequest, RequestId, SPECULATIVE_TURN,
    Speculation, State, ToolDefinition, TriggerMode,
};

const HELLO: &str = "Hello.";
const QUESTION: &str = "Hello, what is the weather like today?";

/// `question.wav`, 16 kHz mono.
fn question() -> Vec<i16> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../voxgate-audio/tests/fixtures/question.wav");
    let wav = voxgate_audio::wav::read_wav(&std::fs::read(path).unwrap()).unwrap();
    assert_eq!((wav.sample_rate, wav.channels), (16_000, 1));
    wav.to_mono_i16()
}

/// The question without "Hello." (from `question_rest_start` in the fixtures' notes): one
/// utterance whose only pause long enough to speculate at is its end.
fn question_rest() -> Vec<i16> {
    question()[8_000..].to_vec()
}

fn config(speculate: bool) -> EngineConfig {
    EngineConfig {
        system_prompt: "Be brief.".into(),
        speculation: Speculation {
            enabled: speculate,
            ..Speculation::default()
        },
        ..EngineConfig::default()
    }
}

/// What the scripted LLM says to a user message.
type Script = Box<dyn Fn(&str) -> Vec<ProviderEventKind>>;

#[derive(Clone)]
enum ProviderEventKind {
    Delta(String),
    Tool(&'static str),
}

/// Providers on the virtual clock: each request is answered after its kind's delay, unless
/// cancelled first.
struct Fakes {
    asr: Duration,
    llm: Duration,
    tts: Duration,
    script: Script,
    /// Answers not yet delivered: (due, event).
    due: Vec<(Duration, ProviderEvent)>,
    /// Every request but cancels, with the time it was made.
    sent: Vec<(Duration, ProviderRequest)>,
    cancelled: Vec<RequestId>,
    /// Requests whose last answer was delivered.
    finished: Vec<RequestId>,
}

impl Fakes {
    fn new(asr: u64, llm: u64, tts: u64) -> Self {
        Self {
            asr: Duration::from_millis(asr),
            llm: Duration::from_millis(llm),
            tts: Duration::from_millis(tts),
            script: Box::new(|user| {
                let text = if user == HELLO {
                    "Hi there! How can I help?".to_owned()
                } else {
                    "Sure thing. It will be sunny.".to_owned()
                };
                text.split_inclusive(' ')
                    .map(|w| ProviderEventKind::Delta(w.to_owned()))
                    .collect()
            }),
            due: Vec::new(),
            sent: Vec::new(),
            cancelled: Vec::new(),
            finished: Vec::new(),
        }
    }

    /// The transcript of `samples` of 16 kHz audio: "Hello." alone is short.
    fn hear(samples: usize) -> &'static str {
        if samples < 16_000 * 6 / 5 {
            HELLO
        } else {
            QUESTION
        }
    }

    fn take(&mut self, at: Duration, out: &[Output]) {
        for request in requests(out) {
            match &request {
                ProviderRequest::Cancel { id } => {
                    self.cancelled.push(*id);
                    self.due.retain(|(_, e)| e.id() != *id);
                    continue;
                }
                ProviderRequest::Transcribe { id, audio, .. } => self.due.push((
                    at + self.asr,
                    ProviderEvent::Transcript {
                        id: *id,
                        text: Self::hear(audio.len()).into(),
                        language: "en".into(),
                    },
                )),
                ProviderRequest::Generate { id, messages, .. } => {
                    let user = messages
                        .iter()
                        .rev()
                        .find(|m| m.role == ChatRole::User)
                        .map(|m| m.content.clone())
                        .unwrap_or_default();
                    for kind in (self.script)(&user) {
                        let event = match kind {
                            ProviderEventKind::Delta(delta) => {
                                ProviderEvent::TextDelta { id: *id, delta }
                            }
                            ProviderEventKind::Tool(name) => ProviderEvent::ToolCall {
                                id: *id,
                                call_id: "call-1".into(),
                                name: name.into(),
                                arguments: json!({}),
                            },
                        };
                        self.due.push((at + self.llm, event));
                    }
                    self.due.push((at + self.llm, done(*id)));
                }
                ProviderRequest::Synthesize { id, .. } => {
                    self.due.push((at + self.tts, tts_audio(*id, 100)));
                    self.due.push((at + self.tts, tts_audio(*id, 100)));
                    self.due.push((at + self.tts, done(*id)));
                }
                _ => {}
            }
            self.sent.push((at, request));
        }
    }

    fn next_due(&self) -> Option<Duration> {
        self.due.iter().map(|(t, _)| *t).min()
    }

    fn pop_due(&mut self, now: Duration) -> Option<ProviderEvent> {
        let i = self.due.iter().position(|(t, _)| *t <= now)?;
        let (_, event) = self.due.remove(i);
        if matches!(
            event,
            ProviderEvent::Transcript { .. } | ProviderEvent::Done { .. }
        ) {
            self.finished.push(event.id());
        }
        Some(event)
    }

    fn count(&self, pick: impl Fn(&ProviderRequest) -> bool) -> usize {
        self.sent.iter().filter(|(_, r)| pick(r)).count()
    }

    fn transcribes(&self) -> usize {
        self.count(|r| matches!(r, ProviderRequest::Transcribe { .. }))
    }

    fn generates(&self) -> usize {
        self.count(|r| matches!(r, ProviderRequest::Generate { .. }))
    }

    fn synthesized(&self) -> Vec<String> {
        self.sent
            .iter()
            .filter_map(|(_, r)| match r {
                ProviderRequest::Synthesize { text, .. } => Some(text.clone()),
                _ => None,
            })
            .collect()
    }

    /// Every request sent was answered to the end or cancelled.
    fn assert_all_settled(&self) {
        for (_, r) in &self.sent {
            let id = match r {
                ProviderRequest::Transcribe { id, .. }
                | ProviderRequest::Generate { id, .. }
                | ProviderRequest::Synthesize { id, .. } => *id,
                _ => continue,
            };
            assert!(
                self.finished.contains(&id) || self.cancelled.contains(&id),
                "{r:?} neither finished nor cancelled"
            );
        }
    }
}

/// The engine and the fakes on one virtual clock.
struct World {
    d: Driver,
    fakes: Fakes,
}

impl World {
    fn new(config: EngineConfig, fakes: Fakes) -> Self {
        Self {
            d: Driver::new(config),
            fakes,
        }
    }

    fn at(&self) -> Duration {
        self.d.now - self.d.origin
    }

    fn collect(&mut self) -> Vec<Output> {
        let out = self.d.drain();
        let at = self.at();
        self.fakes.take(at, &out);
        out
    }

    /// Moves the clock by `by`, firing the engine's timers and delivering the fakes' answers
    /// when due; returns the outputs.
    fn advance(&mut self, by: Duration) -> Vec<Output> {
        let target = self.d.now + by;
        let mut out = Vec::new();
        loop {
            let timer = self.d.engine.poll_timeout();
            let answer = self.fakes.next_due().map(|t| self.d.origin + t);
            let Some(next) = [timer, answer].into_iter().flatten().min() else {
                break;
            };
            if next > target {
                break;
            }
            self.d.now = self.d.now.max(next);
            if timer.is_some_and(|t| t <= self.d.now) {
                self.d.engine.handle_timeout(self.d.now);
                out.extend(self.collect());
            }
            let at = self.at();
            while let Some(event) = self.fakes.pop_due(at) {
                self.d
                    .engine
                    .handle_input(self.d.now, Input::Provider(event))
                    .unwrap();
                out.extend(self.collect());
            }
        }
        self.d.now = target;
        out
    }

    /// Feeds 16 kHz audio in 20 ms frames at real time.
    fn speak(&mut self, samples: &[i16]) -> Vec<Output> {
        let mut out = Vec::new();
        for frame in samples.chunks(320) {
            self.d.engine.handle_audio_i16(self.d.now, frame);
            out.extend(self.collect());
            out.extend(self.advance(20 * MS));
        }
        out
    }

    fn silence(&mut self, ms: usize) -> Vec<Output> {
        self.speak(&vec![0; ms * 16])
    }
}

fn sentences(events: &[ClientEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            ClientEvent::SentenceStart { text, .. } => Some(text.clone()),
            _ => None,
        })
        .collect()
}

fn transcriptions(events: &[ClientEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            ClientEvent::UserTranscription { text, .. } => Some(text.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_pause_that_ends_the_turn_is_answered_from_the_speculation() {
    let mut w = World::new(config(true), Fakes::new(40, 40, 40));
    w.silence(200);
    let mut out = w.speak(&question_rest());
    // Speculative work: never a client event of its own.
    let mut turn_end = None;
    for _ in 0..100 {
        let step = w.silence(20);
        if transcriptions(&client(&step)).is_empty() {
            out.extend(step);
        } else {
            turn_end = Some(step);
            break;
        }
    }
    let turn_end = turn_end.expect("the turn ended");
    assert!(client(&out).iter().all(|e| matches!(
        e,
        ClientEvent::VadState { .. } | ClientEvent::VadFrame { .. }
    )));
    // The reply begins in the same step the turn ends, with the first sentence's audio
    // already in, and the only new request is the second sentence's synthesis.
    let events = client(&turn_end);
    assert_eq!(transcriptions(&events), [QUESTION]);
    assert!(
        events
            .iter()
            .any(|e| matches!(e, ClientEvent::ResponseBegin { .. }))
    );
    assert_eq!(sentences(&events), ["Sure thing."]);
    assert!(
        events
            .iter()
            .any(|e| matches!(e, ClientEvent::AudioChunk { .. }))
    );
    let new: Vec<_> = requests(&turn_end);
    assert!(
        matches!(new.as_slice(), [ProviderRequest::Synthesize { text, turn, .. }] if text == "It will be sunny." && *turn != SPECULATIVE_TURN),
        "{new:#?}"
    );
    w.silence(1500);
    // The providers saw one transcription, one generation and one synthesis per sentence.
    assert_eq!(w.fakes.transcribes(), 1);
    assert_eq!(w.fakes.generates(), 1);
    assert_eq!(w.fakes.synthesized(), ["Sure thing.", "It will be sunny."]);
    assert!(w.fakes.cancelled.is_empty(), "{:?}", w.fakes.cancelled);
    let events = w.d.client_events();
    assert_eq!(sentences(&events), ["Sure thing.", "It will be sunny."]);
    let h = w.d.engine.history();
    assert_eq!(h.len(), 2);
    assert_eq!((h[0].role, h[0].text().as_str()), (Role::User, QUESTION));
    assert_eq!(
        (h[1].role, h[1].text().as_str()),
        (Role::Assistant, "Sure thing. It will be sunny.")
    );
    let stats = w.d.engine.speculation_stats();
    assert_eq!((stats.started, stats.adopted, stats.discarded), (1, 1, 0));
    assert_eq!(
        (
            stats.requests,
            stats.requests_adopted,
            stats.requests_cancelled
        ),
        (3, 3, 0)
    );
    w.fakes.assert_all_settled();
}

#[test]
fn the_same_turn_without_speculation_asks_after_the_turn_ends() {
    let mut w = World::new(config(false), Fakes::new(40, 40, 40));
    w.silence(200);
    w.speak(&question_rest());
    w.silence(1500);
    assert_eq!(w.fakes.transcribes(), 1);
    assert_eq!(w.fakes.generates(), 1);
    assert_eq!(
        sentences(&w.d.client_events()),
        ["Sure thing.", "It will be sunny."]
    );
    let stats = w.d.engine.speculation_stats();
    assert_eq!(stats.started, 0);
    // The transcription goes out only at the VAD's end of speech, 200 ms after the pause
    // began; with speculation it goes out at 64 ms.
    let (at, _) = w.fakes.sent[0];
    let mut s = World::new(config(true), Fakes::new(40, 40, 40));
    s.silence(200);
    s.speak(&question_rest());
    s.silence(1500);
    let (spec_at, _) = s.fakes.sent[0];
    assert!(spec_at + 100 * MS < at, "{spec_at:?} {at:?}");
}

#[test]
fn a_pause_the_user_continues_past_is_cancelled_and_never_heard() {
    // Answers fast enough that the pause after "Hello." starts a generation and a synthesis;
    // the synthesis is still running when the user goes on.
    let mut w = World::new(config(true), Fakes::new(10, 10, 200));
    w.silence(200);
    w.speak(&question());
    // At the pause: a speculative transcription, generation and synthesis of "Hello.".
    let hello: Vec<RequestId> = w
        .fakes
        .sent
        .iter()
        .filter_map(|(_, r)| match r {
            ProviderRequest::Transcribe { id, audio, .. } if Fakes::hear(audio.len()) == HELLO => {
                Some(*id)
            }
            ProviderRequest::Generate { id, messages, .. }
                if messages.last().is_some_and(|m| m.content == HELLO) =>
            {
                Some(*id)
            }
            ProviderRequest::Synthesize { id, text, .. } if text == "Hi there!" => Some(*id),
            _ => None,
        })
        .collect();
    assert_eq!(hello.len(), 3, "{:#?}", w.fakes.sent);
    w.silence(2000);
    // The transcription and generation had finished; the synthesis was cancelled when
    // speech resumed, and none was answered.
    assert!(w.fakes.finished.contains(&hello[0]) && w.fakes.finished.contains(&hello[1]));
    assert!(
        w.fakes.cancelled.contains(&hello[2]),
        "{:?}",
        w.fakes.cancelled
    );
    let events = w.d.client_events();
    assert_eq!(transcriptions(&events), [QUESTION]);
    assert_eq!(sentences(&events), ["Sure thing.", "It will be sunny."]);
    assert_eq!(
        events
            .iter()
            .filter(|e| matches!(e, ClientEvent::ResponseBegin { .. }))
            .count(),
        1
    );
    assert!(!format!("{events:?}").contains("Hi there"));
    let h = w.d.engine.history();
    assert_eq!(h.len(), 2);
    assert_eq!(h[0].text(), QUESTION);
    assert!(!h.iter().any(|m| m.text().contains("Hi there")));
    let stats = w.d.engine.speculation_stats();
    assert_eq!((stats.started, stats.adopted, stats.discarded), (2, 1, 1));
    assert_eq!(stats.requests_cancelled, 1);
    w.fakes.assert_all_settled();
}

#[test]
fn slow_providers_are_cancelled_at_the_resumed_speech() {
    // The recognizer is still working on "Hello." when the user goes on.
    let mut w = World::new(config(true), Fakes::new(300, 400, 200));
    w.silence(200);
    w.speak(&question());
    w.silence(3000);
    let first = w.fakes.sent[0].1.clone();
    let ProviderRequest::Transcribe { id, .. } = first else {
        panic!("{first:?}");
    };
    assert!(w.fakes.cancelled.contains(&id));
    assert_eq!(w.fakes.transcribes(), 2);
    assert_eq!(w.fakes.generates(), 1);
    assert_eq!(transcriptions(&w.d.client_events()), [QUESTION]);
    w.fakes.assert_all_settled();
}

#[test]
fn words_resuming_after_the_utterance_ended_cancel_the_generation() {
    // "Hello." then 260 ms of silence (the VAD ends the utterance) and the question before
    // the turn ends: the recognition of "Hello." is the real one, the generation is not.
    let audio = question();
    let mut config = config(true);
    config.turn.min_endpoint_delay = 300 * MS;
    let mut w = World::new(config, Fakes::new(20, 500, 10));
    w.silence(200);
    w.speak(&audio[..6_200]);
    w.silence(260);
    w.speak(&audio[8_000..]);
    w.silence(2000);
    let events = w.d.client_events();
    assert_eq!(transcriptions(&events), [format!("{HELLO} {QUESTION}")]);
    assert!(!format!("{events:?}").contains("Hi there"));
    // The "Hello." generation was cancelled; the turn's own was adopted.
    let generates: Vec<_> = w
        .fakes
        .sent
        .iter()
        .filter_map(|(_, r)| match r {
            ProviderRequest::Generate { id, messages, .. } => {
                Some((*id, messages.last().unwrap().content.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(generates.len(), 2, "{generates:?}");
    assert_eq!(generates[0].1, HELLO);
    assert!(w.fakes.cancelled.contains(&generates[0].0));
    assert_eq!(generates[1].1, format!("{HELLO} {QUESTION}"));
    w.fakes.assert_all_settled();
}

#[test]
fn barge_in_on_an_adopted_reply_cancels_the_speculative_requests() {
    // The first sentence's synthesis streams slowly: it is still running when the user
    // interrupts the reply it was adopted into.
    let mut w = World::new(config(true), Fakes::new(20, 20, 20));
    w.fakes.script = Box::new(|_| {
        vec![ProviderEventKind::Delta(
            "Sure thing. It will be sunny all day long.".into(),
        )]
    });
    w.silence(200);
    w.speak(&question_rest());
    // Hold back the end of the first sentence's audio: its request stays open.
    let mut spec_tts = None;
    for _ in 0..20 {
        w.silence(10);
        spec_tts = w.fakes.sent.iter().find_map(|(_, r)| match r {
            ProviderRequest::Synthesize { id, turn, .. } if *turn == SPECULATIVE_TURN => Some(*id),
            _ => None,
        });
        if spec_tts.is_some() {
            break;
        }
    }
    let spec_tts = spec_tts.expect("a speculative synthesis");
    w.fakes
        .due
        .retain(|(_, e)| !(e.id() == spec_tts && matches!(e, ProviderEvent::Done { .. })));
    w.silence(600);
    assert_eq!(w.d.engine.state(), State::Speaking);
    // The user speaks over the reply.
    let out = w.speak(&question_rest());
    assert!(
        client(&out)
            .iter()
            .any(|e| matches!(e, ClientEvent::ClearPlayback))
    );
    assert!(
        w.fakes.cancelled.contains(&spec_tts),
        "{:?}",
        w.fakes.cancelled
    );
    // A cancel names only requests the providers know.
    let known: Vec<RequestId> = w
        .fakes
        .sent
        .iter()
        .filter_map(|(_, r)| match r {
            ProviderRequest::Transcribe { id, .. }
            | ProviderRequest::Generate { id, .. }
            | ProviderRequest::Synthesize { id, .. } => Some(*id),
            _ => None,
        })
        .collect();
    for id in &w.fakes.cancelled {
        assert!(known.contains(id), "cancel of unknown {id:?}");
    }
    w.silence(2000);
    w.fakes.assert_all_settled();
}

#[test]
fn close_during_speculation_cancels_every_speculative_request() {
    let mut w = World::new(config(true), Fakes::new(20, 500, 500));
    w.silence(200);
    w.speak(&question()[..6_200]);
    // Into the pause: the transcription is in, the generation runs.
    w.silence(120);
    let pending: Vec<RequestId> = w
        .fakes
        .sent
        .iter()
        .filter_map(|(_, r)| match r {
            ProviderRequest::Generate { id, .. } => Some(*id),
            _ => None,
        })
        .collect();
    assert_eq!(pending.len(), 1, "{:#?}", w.fakes.sent);
    w.d.engine.handle_input(w.d.now, Input::Close).unwrap();
    let out = w.collect();
    assert!(requests(&out).contains(&ProviderRequest::Cancel { id: pending[0] }));
    assert!(!client(&out).iter().any(|e| matches!(
        e,
        ClientEvent::ResponseBegin { .. } | ClientEvent::UserTranscription { .. }
    )));
    assert!(w.d.engine.history().is_empty());
    assert_eq!(w.d.engine.speculation_stats().discarded, 1);
}

#[test]
fn an_abort_during_speculation_drops_the_generation() {
    let mut w = World::new(config(true), Fakes::new(20, 500, 500));
    w.silence(200);
    w.speak(&question_rest());
    w.silence(140);
    let generate = w.fakes.sent.iter().find_map(|(_, r)| match r {
        ProviderRequest::Generate { id, .. } => Some(*id),
        _ => None,
    });
    let id = generate.expect("a speculative generation");
    w.d.engine.handle_input(w.d.now, Input::Abort).unwrap();
    // The user turn it was made for is gone: cancelled at once.
    let out = w.collect();
    assert!(
        requests(&out).contains(&ProviderRequest::Cancel { id }),
        "{out:#?}"
    );
    w.silence(2000);
    // (The utterance's transcript, arriving after the abort, opens a turn of its own, as it
    // does without speculation; that turn asks for its own generation.)
    assert_eq!(w.fakes.generates(), 2);
    // Only the recognition was adopted.
    let stats = w.d.engine.speculation_stats();
    assert_eq!((stats.requests, stats.requests_adopted), (2, 1));
    w.fakes.assert_all_settled();
}

#[test]
fn a_speculative_tool_call_is_cancelled_and_the_real_turn_asks_again() {
    let mut w = World::new(config(true), Fakes::new(20, 20, 20));
    w.fakes.script = Box::new(|_| vec![ProviderEventKind::Tool("get_weather")]);
    w.d.engine
        .handle_input(
            w.d.now,
            Input::SetTools(vec![ToolDefinition {
                name: "get_weather".into(),
                description: "The weather.".into(),
                parameters: json!({"type": "object", "properties": {}}),
            }]),
        )
        .unwrap();
    w.collect();
    w.silence(200);
    let mut before_end = w.speak(&question_rest());
    before_end.extend(w.silence(100));
    let ProviderRequest::Generate { id: spec, turn, .. } = w
        .fakes
        .sent
        .iter()
        .find(|(_, r)| matches!(r, ProviderRequest::Generate { .. }))
        .map(|(_, r)| r.clone())
        .expect("a speculative generation")
    else {
        unreachable!()
    };
    assert_eq!(turn, SPECULATIVE_TURN);
    // Cancelled at its tool call, before the turn ended; no tool ran.
    assert!(w.fakes.cancelled.contains(&spec));
    assert!(
        !client(&before_end)
            .iter()
            .any(|e| matches!(e, ClientEvent::ToolCallRequest { .. }))
    );
    assert!(transcriptions(&client(&before_end)).is_empty());
    w.silence(1000);
    // The real turn asked for its own generation; its tool call reached the client once.
    assert_eq!(w.fakes.generates(), 2);
    let calls =
        w.d.client_events()
            .iter()
            .filter(|e| matches!(e, ClientEvent::ToolCallRequest { .. }))
            .count();
    assert_eq!(calls, 1);
    // The recognition was adopted, the generation not.
    let stats = w.d.engine.speculation_stats();
    assert_eq!((stats.requests, stats.requests_adopted), (2, 1));
}

#[test]
fn no_trigger_speech_is_recognized_early_but_not_answered() {
    let mut w = World::new(config(true), Fakes::new(20, 20, 20));
    w.d.engine
        .set_audio_trigger(w.d.now, TriggerMode::NoTrigger);
    w.collect();
    w.silence(200);
    w.speak(&question_rest());
    w.silence(1000);
    assert_eq!(w.fakes.transcribes(), 1);
    assert_eq!(w.fakes.generates(), 0);
    assert_eq!(transcriptions(&w.d.client_events()), [QUESTION]);
    let stats = w.d.engine.speculation_stats();
    assert_eq!((stats.started, stats.adopted, stats.discarded), (1, 1, 0));
    assert_eq!((stats.requests, stats.requests_adopted), (1, 1));
    w.fakes.assert_all_settled();
}

#[test]
fn text_replies_adopt_the_generation_without_synthesis() {
    let mut w = World::new(
        EngineConfig {
            output_audio: None,
            ..config(true)
        },
        Fakes::new(20, 20, 20),
    );
    w.silence(200);
    w.speak(&question_rest());
    w.silence(1000);
    assert_eq!((w.fakes.transcribes(), w.fakes.generates()), (1, 1));
    assert!(w.fakes.synthesized().is_empty());
    let shown: String =
        w.d.client_events()
            .iter()
            .filter_map(|e| match e {
                ClientEvent::TextFragment { text, .. } => Some(text.clone()),
                _ => None,
            })
            .collect();
    assert_eq!(shown, "Sure thing. It will be sunny.");
    assert_eq!(w.d.engine.speculation_stats().adopted, 1);
}

#[test]
fn a_later_turn_adopts_with_history_in_the_context() {
    let mut w = World::new(config(true), Fakes::new(20, 20, 20));
    for _ in 0..3 {
        w.silence(200);
        w.speak(&question_rest());
        w.silence(3000);
    }
    assert_eq!(w.d.engine.history().len(), 6);
    let stats = w.d.engine.speculation_stats();
    assert_eq!((stats.started, stats.adopted), (3, 3));
    assert_eq!(w.fakes.generates(), 3);
    w.fakes.assert_all_settled();
}

/// The first sentence of the scripted reply to `user`.
fn said(user: &str) -> String {
    format!("You said {}.", user.replace(['.', ',', '?', '!'], ""))
}

/// One piece of a random session: speech, or silence of some length.
#[derive(Debug, Clone)]
enum Piece {
    Hello,
    Question,
    Silence(usize),
}

fn piece() -> impl Strategy<Value = Piece> {
    prop_oneof![
        Just(Piece::Hello),
        Just(Piece::Question),
        prop::sample::select(vec![40usize, 90, 140, 190, 230, 300, 420, 700, 1500])
            .prop_map(Piece::Silence),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Whatever the pauses and the providers' speeds, the client only ever hears replies to
    /// the turns the user ended: each reply answers the transcription it follows, nothing of a
    /// continued turn's speculation is said or kept, and every request ends or is cancelled.
    #[test]
    fn no_speculative_answer_reaches_a_continued_turn(
        pieces in prop::collection::vec(piece(), 1..8),
        asr in 10u64..400,
        llm in 10u64..400,
        tts in 10u64..300,
        endpoint in prop::sample::select(vec![100u64, 400]),
    ) {
        let audio = question();
        let mut config = config(true);
        config.turn.min_endpoint_delay = Duration::from_millis(endpoint);
        let mut w = World::new(config, Fakes::new(asr, llm, tts));
        // The reply names what it answers.
        w.fakes.script = Box::new(|user| {
            vec![ProviderEventKind::Delta(format!("{} Noted.", said(user)))]
        });
        w.silence(100);
        for p in &pieces {
            match p {
                Piece::Hello => { w.speak(&audio[..6_200]); }
                Piece::Question => { w.speak(&audio[8_000..]); }
                Piece::Silence(ms) => { w.silence(*ms); }
            }
        }
        w.silence(4000);
        let events = w.d.client_events();
        let mut heard: Option<String> = None;
        for e in &events {
            match e {
                ClientEvent::UserTranscription { text, .. } => heard = Some(text.clone()),
                ClientEvent::SentenceStart { text, .. } if text.starts_with("You said") => {
                    prop_assert_eq!(Some(text.clone()), heard.as_deref().map(said), "{:#?}", events);
                }
                _ => {}
            }
        }
        // History holds only committed turns and replies to them.
        for pair in w.d.engine.history().windows(2) {
            let reply = pair[1].text();
            if pair[1].role == Role::Assistant && reply.starts_with("You said") {
                prop_assert_eq!(pair[0].role, Role::User);
                let want = said(&pair[0].text());
                prop_assert!(reply.starts_with(&want) || want.starts_with(&reply), "{:?}", pair);
            }
        }
        w.fakes.assert_all_settled();
        let s = w.d.engine.speculation_stats();
        prop_assert_eq!(s.started, s.adopted + s.discarded);
        prop_assert!(s.requests_adopted + s.requests_cancelled <= s.requests);
    }
}

#[test]
fn a_reply_with_a_face_adopts_its_first_sentence() {
    let mut w = World::new(
        EngineConfig {
            emotion: Some(voxgate_engine::emotion::EmojiPolicy::faces()),
            ..config(true)
        },
        Fakes::new(20, 20, 20),
    );
    w.fakes.script = Box::new(|_| {
        ["😊", " Sure", " thing.", " It will be sunny."]
            .into_iter()
            .map(|d| ProviderEventKind::Delta(d.into()))
            .collect()
    });
    w.silence(200);
    w.speak(&question_rest());
    w.silence(1500);
    assert_eq!(
        (w.fakes.transcribes(), w.fakes.generates()),
        (1, 1),
        "{:#?}",
        w.fakes.sent
    );
    assert_eq!(w.fakes.synthesized(), ["Sure thing.", "It will be sunny."]);
    let events = w.d.client_events();
    assert_eq!(
        events
            .iter()
            .filter(|e| matches!(e, ClientEvent::Emotion { .. }))
            .count(),
        1
    );
    assert_eq!(sentences(&events), ["Sure thing.", "It will be sunny."]);
    let stats = w.d.engine.speculation_stats();
    assert_eq!((stats.requests, stats.requests_adopted), (3, 3));
}
