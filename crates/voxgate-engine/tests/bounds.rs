//! Per-session bounds: a client can never grow a session's memory without bound. Each test
//! fills past a limit and checks the refusal or drop by counts.
#![allow(clippy::unwrap_used, clippy::panic)]

mod common;

use common::{Driver, client, done, generate, requests};
use voxgate_engine::{
    ClientEvent, EngineConfig, ErrorCategory, Input, MAX_PENDING_EXPORTS, MAX_PENDING_QUERIES,
    ProviderRequest, TriggerMode,
};

fn text_only() -> EngineConfig {
    EngineConfig {
        output_audio: None,
        ..EngineConfig::default()
    }
}

fn errors(events: &[ClientEvent]) -> Vec<ErrorCategory> {
    events
        .iter()
        .filter_map(|e| match e {
            ClientEvent::Error { category, .. } => Some(*category),
            _ => None,
        })
        .collect()
}

fn say(text: &str, mode: TriggerMode) -> Input {
    Input::Text {
        text: text.into(),
        mode,
    }
}

#[test]
fn conversation_queries_beyond_the_bound_are_refused_without_a_request() {
    let mut d = Driver::new(text_only());
    let query = || Input::ConversationQuery {
        prompt: Some("What did I say?".into()),
        instructions: None,
    };
    let mut asked = 0;
    for _ in 0..MAX_PENDING_QUERIES {
        let out = d.input(query());
        asked += requests(&out)
            .iter()
            .filter(|r| matches!(r, ProviderRequest::Query { .. }))
            .count();
    }
    assert_eq!(asked, MAX_PENDING_QUERIES);
    let out = d.input(query());
    assert!(requests(&out).is_empty());
    assert_eq!(errors(&client(&out)), [ErrorCategory::Session]);
}

#[test]
fn awaited_exports_beyond_the_bound_are_refused() {
    let mut d = Driver::new(text_only());
    let out = d.input(say("Hi", TriggerMode::Immediate));
    let (id, _) = generate(&out);
    let export = || Input::ExportHistory {
        await_pending: true,
        exclude_audio: true,
    };
    for _ in 0..MAX_PENDING_EXPORTS {
        assert!(client(&d.input(export())).is_empty());
    }
    assert_eq!(
        errors(&client(&d.input(export()))),
        [ErrorCategory::Session]
    );
    let out = d.provider(done(id));
    let exports = client(&out)
        .into_iter()
        .filter(|e| matches!(e, ClientEvent::History { .. }))
        .count();
    assert_eq!(exports, MAX_PENDING_EXPORTS);
}

#[test]
fn queued_text_beyond_the_turn_queue_is_refused_as_an_error_event() {
    let mut d = Driver::new(text_only());
    d.input(say("Hi", TriggerMode::Immediate));
    for _ in 0..voxgate_turn::MAX_QUEUED_INPUTS {
        assert!(errors(&client(&d.input(say("later", TriggerMode::Queue)))).is_empty());
    }
    let out = d.try_input(say("too many", TriggerMode::Queue)).unwrap();
    assert_eq!(errors(&client(&out)), [ErrorCategory::Session]);
}

#[test]
fn history_keeps_the_newest_messages_and_exports_count_the_dropped() {
    let mut d = Driver::new(EngineConfig {
        max_history_messages: 4,
        ..text_only()
    });
    for n in 0..5 {
        let out = d.input(say(&format!("turn {n}"), TriggerMode::Immediate));
        let (id, _) = generate(&out);
        d.provider(common::delta(id, "Ok."));
        d.provider(done(id));
    }
    assert_eq!(d.engine.history().len(), 4);
    assert_eq!(d.engine.history()[2].text(), "turn 4");
    let out = d.input(Input::ExportHistory {
        await_pending: false,
        exclude_audio: true,
    });
    let events = client(&out);
    let [ClientEvent::History { messages, dropped }] = events.as_slice() else {
        panic!("{out:?}")
    };
    assert_eq!((messages.len(), *dropped), (4, 6));
}

/// One long `DirectSpeech` (or a model's long answer) never has more than the configured
/// sentences at the synthesizer at once: the rest waits for playback, and every sentence is
/// still said, in order, at the pace the client plays them.
#[test]
fn a_long_reply_runs_a_bounded_number_of_syntheses_at_a_time() {
    use common::{MS, synth, tts_audio};
    let mut d = Driver::new(EngineConfig::default());
    let text: String = (1..=120)
        .map(|i| format!("This is sentence {i}. "))
        .collect();
    let mut out = d.input(Input::DirectSpeech {
        text,
        include_in_history: true,
        uninterruptible: false,
    });
    let mut in_flight: Vec<_> = synth(&out);
    let mut said = Vec::new();
    let mut peak = in_flight.len();
    while let Some((id, text)) = (!in_flight.is_empty()).then(|| in_flight.remove(0)) {
        // Each sentence: 500 ms of audio, synthesized 50 ms after it was asked for.
        out = d.advance(50 * MS);
        out.extend(d.provider(tts_audio(id, 500)));
        out.extend(d.provider(done(id)));
        said.push(text);
        in_flight.extend(synth(&out));
        if in_flight.is_empty() {
            // Nothing at the synthesizer: the rest waits for playback to make room.
            out = d.advance(600 * MS);
            in_flight.extend(synth(&out));
        }
        peak = peak.max(in_flight.len());
    }
    assert_eq!(said.len(), 120);
    for (i, text) in said.iter().enumerate() {
        assert_eq!(*text, format!("This is sentence {}.", i + 1));
    }
    // The one playing plus the default two ahead.
    assert!(peak <= 3, "{peak} syntheses at once");
    // Paced by playback: 120 half-second sentences take about a minute to say.
    let took = d.now - d.origin;
    assert!(took >= 55_000 * MS, "{took:?}");
}
