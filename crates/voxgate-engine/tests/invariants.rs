//! Random sequences of client inputs and scripted provider events (answers to real requests,
//! stale ones, mismatched kinds) checked against the engine's promises to its client.

mod common;

use std::collections::BTreeMap;
use std::sync::OnceLock;

use common::*;
use proptest::prelude::*;
use serde_json::json;
use voxgate_engine::emotion::EmojiPolicy;
use voxgate_engine::history::Role;
use voxgate_engine::provider::ProviderEvent;
use voxgate_engine::{
    ClientEvent, EngineConfig, Input, Output, ProviderRequest, RequestId, ToolDefinition,
    TriggerMode, TurnId,
};

fn fixture() -> &'static [i16] {
    static SPEECH: OnceLock<Vec<i16>> = OnceLock::new();
    SPEECH.get_or_init(speech)
}

#[derive(Debug, Clone)]
enum Op {
    Text(usize, bool),
    AudioTrigger(u8),
    Trigger(bool),
    Abort,
    Direct(bool),
    StartCapture,
    StopCapture,
    Report(u64),
    Advance(u64),
    /// `frames` 20 ms frames of the speech fixture from frame `from`.
    Speak(usize, usize),
    ToolResult(usize),
    Export(bool, bool),
    Query,
    Reconfigure(bool),
    /// Answer the `.0`-th latest request (of all issued, cancelled ones included) with kind
    /// `.1`.
    Provider(usize, Kind),
}

#[derive(Debug, Clone)]
enum Kind {
    Delta(usize),
    ToolCall(usize, bool),
    Audio(usize),
    Transcript(usize),
    Done,
    Failed,
}

const TEXTS: [&str; 8] = [
    "Hello there. ",
    "😀",
    "\u{1F468}",
    "\u{200D}\u{1F469} Hi",
    "How are you? ",
    "1\u{FE0F}",
    "\u{20E3} ok",
    "",
];

fn op() -> impl Strategy<Value = Op> {
    let kind = prop_oneof![
        4 => (0..TEXTS.len()).prop_map(Kind::Delta),
        1 => (0..3usize, any::<bool>()).prop_map(|(c, ok)| Kind::ToolCall(c, ok)),
        5 => (0..300usize).prop_map(Kind::Audio),
        1 => (0..TEXTS.len()).prop_map(Kind::Transcript),
        3 => Just(Kind::Done),
        1 => Just(Kind::Failed),
    ];
    prop_oneof![
        2 => (0..TEXTS.len(), any::<bool>()).prop_map(|(t, i)| Op::Text(t, i)),
        1 => (0u8..3).prop_map(Op::AudioTrigger),
        1 => any::<bool>().prop_map(Op::Trigger),
        1 => Just(Op::Abort),
        1 => any::<bool>().prop_map(Op::Direct),
        1 => Just(Op::StartCapture),
        1 => Just(Op::StopCapture),
        1 => (0..200_000u64).prop_map(Op::Report),
        3 => (0..3000u64).prop_map(Op::Advance),
        2 => (0..220usize, 1..60usize).prop_map(|(f, n)| Op::Speak(f, n)),
        1 => (0..3usize).prop_map(Op::ToolResult),
        1 => (any::<bool>(), any::<bool>()).prop_map(|(a, e)| Op::Export(a, e)),
        1 => Just(Op::Query),
        1 => any::<bool>().prop_map(Op::Reconfigure),
        // Mostly the latest requests (live work), sometimes any (stale work).
        14 => (prop_oneof![6 => 0..3usize, 1 => 0..64usize], kind)
            .prop_map(|(r, k)| Op::Provider(r, k)),
    ]
}

/// Runs `ops`, then closes the session; returns every client event and the issued requests.
fn run(spoken: bool, emotion: bool, ops: &[Op]) -> (Driver, Vec<ClientEvent>) {
    let mut d = Driver::new(EngineConfig {
        output_audio: if spoken {
            EngineConfig::default().output_audio
        } else {
            None
        },
        emotion: emotion.then(EmojiPolicy::faces),
        ..EngineConfig::default()
    });
    d.input(Input::SetTools(vec![ToolDefinition {
        name: "lights.set".into(),
        description: "Lights".into(),
        parameters: json!({"type":"object","properties":{"on":{"type":"boolean"}},"required":["on"]}),
    }]));
    let mut issued: Vec<ProviderRequest> = Vec::new();
    let mut rate = 16_000usize;
    let mut last_turn = None;
    for op in ops {
        let out = apply(&mut d, op, &issued, &mut rate, &mut last_turn);
        for o in out {
            if let Output::Provider(r) = o
                && !matches!(r, ProviderRequest::Cancel { .. })
            {
                issued.push(r);
            }
        }
    }
    let _ = d.try_input(Input::Close);
    let events = d.client_events();
    (d, events)
}

fn apply(
    d: &mut Driver,
    op: &Op,
    issued: &[ProviderRequest],
    rate: &mut usize,
    last_turn: &mut Option<TurnId>,
) -> Vec<Output> {
    let mut out = Vec::new();
    match op {
        Op::Text(t, immediate) => feed(
            d,
            &mut out,
            Input::Text {
                text: format!("user says {}", TEXTS[*t]),
                mode: if *immediate {
                    TriggerMode::Immediate
                } else {
                    TriggerMode::Queue
                },
            },
        ),
        Op::AudioTrigger(m) => feed(
            d,
            &mut out,
            Input::AudioTrigger(
                [
                    TriggerMode::NoTrigger,
                    TriggerMode::Queue,
                    TriggerMode::Immediate,
                ][usize::from(*m)],
            ),
        ),
        Op::Trigger(flush) => feed(
            d,
            &mut out,
            Input::TriggerInference {
                instructions: Some("go".into()),
                flush_vad: *flush,
            },
        ),
        Op::Abort => feed(d, &mut out, Input::Abort),
        Op::Direct(uninterruptible) => feed(
            d,
            &mut out,
            Input::DirectSpeech {
                text: "Please hold. One moment.".into(),
                include_in_history: true,
                uninterruptible: *uninterruptible,
            },
        ),
        Op::StartCapture => feed(d, &mut out, Input::StartCapture),
        Op::StopCapture => feed(d, &mut out, Input::StopCapture),
        Op::Report(bytes) => {
            if let Some(turn) = *last_turn {
                feed(
                    d,
                    &mut out,
                    Input::PlaybackReport {
                        turn,
                        bytes_played: *bytes,
                    },
                );
            }
        }
        Op::Advance(ms) => out.extend(d.advance(std::time::Duration::from_millis(*ms))),
        Op::Speak(from, frames) => {
            let step = *rate / 50;
            let speech = fixture();
            for f in *from..from + frames {
                // At 16 kHz the fixture itself; at 48 kHz each sample three times.
                let start = (f * 320) % speech.len().max(1);
                let end = (start + 320).min(speech.len());
                let frame: Vec<f32> = speech[start..end]
                    .iter()
                    .flat_map(|s| std::iter::repeat_n(f32::from(*s) / 32768.0, step / 320))
                    .collect();
                feed(d, &mut out, Input::Audio(frame));
                out.extend(d.advance(20 * MS));
            }
        }
        Op::ToolResult(c) => feed(
            d,
            &mut out,
            Input::ToolResult {
                id: format!("c{c}"),
                result: "done".into(),
            },
        ),
        Op::Export(await_pending, exclude_audio) => feed(
            d,
            &mut out,
            Input::ExportHistory {
                await_pending: *await_pending,
                exclude_audio: *exclude_audio,
            },
        ),
        Op::Query => feed(
            d,
            &mut out,
            Input::ConversationQuery {
                prompt: Some("summary?".into()),
                instructions: None,
            },
        ),
        Op::Reconfigure(high) => {
            *rate = if *high { 48_000 } else { 16_000 };
            feed(
                d,
                &mut out,
                Input::Reconfigure {
                    input_rate: Some(u32::try_from(*rate).unwrap_or(16_000)),
                    system_prompt: Some("be kind".into()),
                    temperature: Some(0.5),
                },
            );
        }
        Op::Provider(r, kind) => {
            if issued.is_empty() {
                return out;
            }
            let id = request_id(&issued[issued.len() - 1 - r % issued.len()]);
            let event = match kind {
                Kind::Delta(t) => delta(id, TEXTS[*t]),
                Kind::ToolCall(c, ok) => ProviderEvent::ToolCall {
                    id,
                    call_id: format!("c{c}"),
                    name: if *ok { "lights_set" } else { "nope" }.into(),
                    arguments: json!({"on": true}),
                },
                Kind::Audio(ms) => tts_audio(id, *ms),
                Kind::Transcript(t) => ProviderEvent::Transcript {
                    id,
                    text: TEXTS[*t].into(),
                    language: "en".into(),
                },
                Kind::Done => done(id),
                Kind::Failed => ProviderEvent::Failed {
                    id,
                    message: "boom".into(),
                },
            };
            feed(d, &mut out, Input::Provider(event));
        }
    }
    for o in &out {
        if let Output::Client(ClientEvent::ResponseBegin { turn }) = o {
            *last_turn = Some(*turn);
        }
    }
    out
}

/// Feeds `i`; refusals (the client's fault) are fine, they must leave the engine usable.
fn feed(d: &mut Driver, out: &mut Vec<Output>, i: Input) {
    if let Ok(o) = d.try_input(i) {
        out.extend(o);
    }
}

fn request_id(r: &ProviderRequest) -> RequestId {
    match r {
        ProviderRequest::Transcribe { id, .. }
        | ProviderRequest::Generate { id, .. }
        | ProviderRequest::Query { id, .. }
        | ProviderRequest::Synthesize { id, .. }
        | ProviderRequest::Cancel { id } => *id,
        _ => RequestId(0),
    }
}

fn squeeze(s: &str) -> String {
    s.chars().filter(|c| !c.is_whitespace()).collect()
}

fn check(d: &Driver, events: &[ClientEvent]) -> Result<(), TestCaseError> {
    let mut begins: BTreeMap<TurnId, usize> = BTreeMap::new();
    let mut ends: BTreeMap<TurnId, usize> = BTreeMap::new();
    let mut sent: BTreeMap<TurnId, String> = BTreeMap::new();
    let mut current: Option<TurnId> = None;
    let mut cleared = false;
    for e in events {
        match e {
            ClientEvent::ResponseBegin { turn } => {
                *begins.entry(*turn).or_default() += 1;
                current = Some(*turn);
                cleared = false;
            }
            ClientEvent::ResponseEnd { turn } => *ends.entry(*turn).or_default() += 1,
            ClientEvent::ClearPlayback => cleared = true,
            ClientEvent::AudioChunk { turn, .. } => {
                prop_assert!(!cleared, "audio of {turn:?} after ClearPlayback");
                prop_assert_eq!(Some(*turn), current, "audio of a response not begun last");
            }
            ClientEvent::TextFragment { turn, text }
            | ClientEvent::SentenceStart { turn, text } => {
                prop_assert_eq!(Some(*turn), current, "text of a response not begun last");
                sent.entry(*turn).or_default().push_str(&squeeze(text));
            }
            _ => {}
        }
    }
    for (turn, n) in &begins {
        prop_assert_eq!(*n, 1, "{:?} began {} times", turn, n);
        prop_assert_eq!(ends.get(turn).copied(), Some(1), "{:?} ends", turn);
    }
    for turn in ends.keys() {
        prop_assert!(
            begins.contains_key(turn),
            "{turn:?} ended without beginning"
        );
    }
    for m in d
        .engine
        .history()
        .iter()
        .filter(|m| m.role == Role::Assistant)
    {
        let said = squeeze(&m.text());
        if said.is_empty() {
            continue;
        }
        let shown = m
            .turn
            .and_then(|t| sent.get(&t))
            .cloned()
            .unwrap_or_default();
        prop_assert!(
            shown.starts_with(&said),
            "history holds {said:?} but the client was sent {shown:?}"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn random_conversations_keep_the_engines_promises(
        spoken in any::<bool>(),
        emotion in any::<bool>(),
        ops in proptest::collection::vec(op(), 1..64),
    ) {
        let (d, events) = run(spoken, emotion, &ops);
        check(&d, &events)?;
        prop_assert!(d.engine.is_closed());
    }
}
