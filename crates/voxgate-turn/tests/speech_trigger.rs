//! The trigger mode of spoken input ([`Input::SpeechTrigger`]), on the virtual clock of
//! `voxgate_turn::testing`: `NoTrigger` commits speech without a reply, `Queue` answers it
//! after the current system turn without cutting it, `Immediate` keeps the barge-in rules.
#![allow(clippy::unwrap_used)] // helpers are test code too

use std::time::{Duration, Instant};

use voxgate_turn::testing::Harness;
use voxgate_turn::{
    AudioSpan, Config, Delivery, Input, Interruption, Output, ResponseCause, State, TriggerMode,
    TurnId, UserSource, UserTurn,
};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn harness() -> Harness {
    Harness::connected(Config::default(), Instant::now())
}

fn words(text: &str) -> Input {
    Input::Words {
        text: text.into(),
        is_final: true,
    }
}

fn user_turns(outs: &[Output]) -> Vec<UserTurn> {
    outs.iter()
        .filter_map(|o| match o {
            Output::UserTurn(u) => Some(u.clone()),
            _ => None,
        })
        .collect()
}

fn starts(outs: &[Output]) -> Vec<(TurnId, ResponseCause)> {
    outs.iter()
        .filter_map(|o| match o {
            Output::StartResponse { turn, cause, .. } => Some((*turn, *cause)),
            _ => None,
        })
        .collect()
}

fn clears(outs: &[Output]) -> usize {
    outs.iter()
        .filter(|o| {
            matches!(
                o,
                Output::ClearPlayback { .. } | Output::CancelResponse { .. }
            )
        })
        .count()
}

fn log(h: &Harness) -> Vec<Output> {
    h.log().iter().map(|(_, o)| o.clone()).collect()
}

/// The user speaks `text` for `speech` (final transcript mid-way), then falls silent.
fn speak(h: &mut Harness, text: &str, speech: Duration) -> Vec<Output> {
    let mut outs = h.input(Input::SpeechStarted).unwrap();
    outs.extend(h.advance(speech / 2));
    outs.extend(h.input(words(text)).unwrap());
    outs.extend(h.advance(speech / 2));
    outs.extend(h.input(Input::SpeechStopped).unwrap());
    outs
}

/// A spoken exchange in the default mode, leaving a reply of `millis` of audio playing;
/// returns the reply's turn.
fn playing_reply(h: &mut Harness, millis: u64) -> TurnId {
    speak(h, "tell me a story", ms(400));
    h.fire_next_timeout();
    let turn = h.last_response_turn().unwrap();
    h.input(Input::ResponseStarted { turn }).unwrap();
    h.input(Input::ResponseChunk {
        turn,
        text: "Once upon a time there was a fox.".into(),
        audio: Some(AudioSpan {
            bytes: millis * 48,
            duration: ms(millis),
        }),
    })
    .unwrap();
    h.input(Input::ResponseEnd {
        turn,
        awaits_user: false,
    })
    .unwrap();
    assert_eq!(h.state(), State::Speaking);
    turn
}

#[test]
fn speech_trigger_defaults_to_immediate_and_only_changes_on_input() {
    let mut h = harness();
    assert_eq!(h.machine().speech_trigger(), TriggerMode::Immediate);
    let outs = h.input(Input::SpeechTrigger(TriggerMode::Queue)).unwrap();
    assert!(outs.is_empty(), "{outs:?}");
    assert_eq!(h.machine().speech_trigger(), TriggerMode::Queue);
    assert_eq!(h.state(), State::Idle);
}

#[test]
fn no_trigger_speech_is_committed_without_a_reply_until_a_trigger() {
    let mut h = harness();
    h.input(Input::SpeechTrigger(TriggerMode::NoTrigger))
        .unwrap();
    speak(&mut h, "my order number is 42", ms(800));
    let outs = h.advance(ms(5000));
    let u = user_turns(&outs);
    assert_eq!(u.len(), 1, "{outs:?}");
    assert_eq!(u[0].text, "my order number is 42");
    assert_eq!(u[0].source, UserSource::Speech);
    assert!(starts(&log(&h)).is_empty());
    assert_eq!(h.state(), State::Idle);
    assert!(!outs.contains(&Output::UserTurnDiscarded));

    let outs = h
        .input(Input::TriggerInference {
            instructions: None,
            flush_vad: false,
        })
        .unwrap();
    assert_eq!(
        starts(&outs),
        [(TurnId(u[0].turn.0 + 1), ResponseCause::Trigger)]
    );
    assert_eq!(h.state(), State::Processing);
}

#[test]
fn no_trigger_speech_is_answered_by_a_later_triggering_text_or_speech() {
    let mut h = harness();
    h.input(Input::SpeechTrigger(TriggerMode::NoTrigger))
        .unwrap();
    speak(&mut h, "I live in Berlin", ms(600));
    h.advance(ms(3000));
    assert_eq!(h.state(), State::Idle);
    let outs = h
        .input(Input::Text {
            text: "what's the weather?".into(),
            mode: TriggerMode::Queue,
        })
        .unwrap();
    let u = user_turns(&outs);
    assert_eq!(
        starts(&outs),
        [(TurnId(u[0].turn.0 + 1), ResponseCause::User(u[0].turn))]
    );

    // Speech in a triggering mode after NO_TRIGGER speech.
    let mut h = harness();
    h.input(Input::SpeechTrigger(TriggerMode::NoTrigger))
        .unwrap();
    speak(&mut h, "I live in Berlin", ms(600));
    h.advance(ms(3000));
    h.input(Input::SpeechTrigger(TriggerMode::Immediate))
        .unwrap();
    speak(&mut h, "what's the weather?", ms(600));
    let outs = h.advance(ms(3000));
    let u = user_turns(&outs);
    assert_eq!(u.len(), 1);
    assert_eq!(
        starts(&outs),
        [(TurnId(u[0].turn.0 + 1), ResponseCause::User(u[0].turn))]
    );
}

#[test]
fn typed_text_or_a_trigger_during_a_no_trigger_turn_still_replies() {
    let mut h = harness();
    h.input(Input::SpeechTrigger(TriggerMode::NoTrigger))
        .unwrap();
    h.input(Input::SpeechStarted).unwrap();
    h.input(words("look at this")).unwrap();
    h.input(Input::Text {
        text: "https://example.com".into(),
        mode: TriggerMode::Queue,
    })
    .unwrap();
    h.input(Input::SpeechStopped).unwrap();
    let outs = h.fire_next_timeout();
    let u = user_turns(&outs);
    assert_eq!(u.len(), 2);
    assert_eq!(
        starts(&outs),
        [(TurnId(u[1].turn.0 + 1), ResponseCause::User(u[1].turn))]
    );

    // TriggerInference with flush_vad ends the NO_TRIGGER turn and replies to it.
    let mut h = harness();
    h.input(Input::SpeechTrigger(TriggerMode::NoTrigger))
        .unwrap();
    h.input(Input::SpeechStarted).unwrap();
    h.input(words("summarise that")).unwrap();
    let outs = h
        .input(Input::TriggerInference {
            instructions: None,
            flush_vad: true,
        })
        .unwrap();
    let u = user_turns(&outs);
    assert_eq!(
        starts(&outs),
        [(TurnId(u[0].turn.0 + 1), ResponseCause::User(u[0].turn))]
    );
}

#[test]
fn the_mode_when_the_utterance_ends_counts() {
    // Started as IMMEDIATE, ended as NO_TRIGGER: no reply.
    let mut h = harness();
    h.input(Input::SpeechStarted).unwrap();
    h.input(words("just so you know")).unwrap();
    h.input(Input::SpeechTrigger(TriggerMode::NoTrigger))
        .unwrap();
    h.input(Input::SpeechStopped).unwrap();
    let outs = h.advance(ms(3000));
    assert_eq!(user_turns(&outs).len(), 1);
    assert!(starts(&outs).is_empty());

    // Started as NO_TRIGGER, ended as QUEUE: a reply.
    let mut h = harness();
    h.input(Input::SpeechTrigger(TriggerMode::NoTrigger))
        .unwrap();
    h.input(Input::SpeechStarted).unwrap();
    h.input(words("so what now")).unwrap();
    h.input(Input::SpeechTrigger(TriggerMode::Queue)).unwrap();
    h.input(Input::SpeechStopped).unwrap();
    let outs = h.advance(ms(3000));
    assert_eq!(starts(&outs).len(), 1);
}

#[test]
fn no_trigger_speech_during_a_reply_does_not_cut_it_and_is_committed_after_it() {
    let mut h = harness();
    let reply = playing_reply(&mut h, 4000);
    h.input(Input::SpeechTrigger(TriggerMode::NoTrigger))
        .unwrap();
    h.advance(ms(200));
    let mut outs = speak(&mut h, "note to self", ms(1000));
    // Held well past the false-interruption timeout: it does not expire.
    outs.extend(h.advance(ms(2000)));
    assert_eq!(clears(&outs), 0, "{outs:?}");
    assert!(user_turns(&outs).is_empty());
    assert_eq!(h.state(), State::Speaking);

    let outs = h.advance(ms(3000));
    let ended: Vec<_> = outs
        .iter()
        .filter_map(|o| match o {
            Output::ResponseEnded(a) => Some(a.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(ended.len(), 1);
    assert_eq!(ended[0].turn, reply);
    assert_eq!(ended[0].delivery, Delivery::Complete);
    let u = user_turns(&outs);
    assert_eq!(u.len(), 1, "{outs:?}");
    assert_eq!(u[0].text, "note to self");
    assert!(starts(&outs).is_empty());
    assert_eq!(h.state(), State::Idle);
    assert_eq!(h.machine().stats().interruptions, 0);
}

#[test]
fn queued_speech_during_a_reply_is_answered_after_it() {
    let mut h = harness();
    let reply = playing_reply(&mut h, 4000);
    h.input(Input::SpeechTrigger(TriggerMode::Queue)).unwrap();
    h.advance(ms(200));
    let mut outs = speak(&mut h, "and then what happened", ms(1000));
    outs.extend(h.advance(ms(2000)));
    assert_eq!(clears(&outs), 0, "{outs:?}");
    assert!(starts(&outs).is_empty());
    assert_eq!(h.machine().current_response(), Some(reply));

    let outs = h.advance(ms(3000));
    let u = user_turns(&outs);
    assert_eq!(u.len(), 1, "{outs:?}");
    assert_eq!(u[0].text, "and then what happened");
    let s = starts(&outs);
    assert_eq!(
        s,
        [(TurnId(u[0].turn.0 + 1), ResponseCause::User(u[0].turn))]
    );
    // The answer starts once the first reply is over, not before.
    let at = |pred: &dyn Fn(&Output) -> bool| {
        h.log()
            .iter()
            .find(|(_, o)| pred(o))
            .map(|(t, _)| *t)
            .unwrap()
    };
    let reply_end = at(&|o| matches!(o, Output::ResponseEnded(a) if a.turn == reply));
    let start = at(&|o| matches!(o, Output::StartResponse { turn, .. } if *turn == s[0].0));
    assert!(start >= reply_end);
    assert_eq!(h.state(), State::Processing);
}

#[test]
fn queued_speech_still_running_when_the_reply_ends_takes_the_floor() {
    let mut h = harness();
    playing_reply(&mut h, 1000);
    h.input(Input::SpeechTrigger(TriggerMode::Queue)).unwrap();
    h.advance(ms(500));
    h.input(Input::SpeechStarted).unwrap();
    let outs = h.advance(ms(1000));
    assert_eq!(clears(&outs), 0);
    // The reply finished while the user talks: the user holds the floor now.
    assert_eq!(h.state(), State::Listening);
    h.input(words("wait one more thing")).unwrap();
    h.input(Input::SpeechStopped).unwrap();
    let outs = h.fire_next_timeout();
    assert_eq!(user_turns(&outs)[0].text, "wait one more thing");
    assert_eq!(starts(&outs).len(), 1);
}

#[test]
fn immediate_speech_still_barges_in() {
    let mut h = harness();
    let reply = playing_reply(&mut h, 4000);
    h.input(Input::SpeechTrigger(TriggerMode::Queue)).unwrap();
    h.input(Input::SpeechTrigger(TriggerMode::Immediate))
        .unwrap();
    h.advance(ms(200));
    h.input(Input::SpeechStarted).unwrap();
    let outs = h.advance(ms(400));
    assert_eq!(outs[0], Output::ClearPlayback { turn: reply });
    assert!(outs.iter().any(|o| matches!(
        o,
        Output::ResponseEnded(a) if a.delivery == Delivery::Interrupted { by: Interruption::Speech }
    )));
    assert_eq!(h.state(), State::Listening);
}

#[test]
fn held_speech_that_resumes_in_immediate_mode_barges_in() {
    let mut h = harness();
    let reply = playing_reply(&mut h, 4000);
    h.input(Input::SpeechTrigger(TriggerMode::Queue)).unwrap();
    speak(&mut h, "hmm", ms(400));
    assert_eq!(h.machine().current_response(), Some(reply));
    h.input(Input::SpeechTrigger(TriggerMode::Immediate))
        .unwrap();
    // The resumed speech already lasted long enough: it cuts the reply at once.
    let outs = h.input(Input::SpeechStarted).unwrap();
    assert_eq!(outs[0], Output::ClearPlayback { turn: reply }, "{outs:?}");
    assert_eq!(h.state(), State::Listening);
}

#[test]
fn held_speech_is_committed_when_immediate_text_cuts_the_reply() {
    let mut h = harness();
    let reply = playing_reply(&mut h, 4000);
    h.input(Input::SpeechTrigger(TriggerMode::Queue)).unwrap();
    speak(&mut h, "by the way", ms(600));
    let outs = h
        .input(Input::Text {
            text: "stop please".into(),
            mode: TriggerMode::Immediate,
        })
        .unwrap();
    assert_eq!(outs[0], Output::ClearPlayback { turn: reply });
    let u = user_turns(&outs);
    assert_eq!(u.len(), 2, "{outs:?}");
    assert_eq!(
        (u[0].text.as_str(), u[0].source),
        ("by the way", UserSource::Speech)
    );
    assert_eq!(
        (u[1].text.as_str(), u[1].source),
        ("stop please", UserSource::Text)
    );
    // One reply, to the text; the held speech is in history before it.
    assert_eq!(
        starts(&outs),
        [(TurnId(u[1].turn.0 + 1), ResponseCause::User(u[1].turn))]
    );
}
