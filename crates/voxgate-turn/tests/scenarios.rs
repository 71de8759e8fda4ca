//! One scenario per transition of the VIP state machine and per interruption rule, on the
//! virtual clock of `voxgate_turn::testing`.
#![allow(clippy::unwrap_used)] // helpers are test code too

use std::time::{Duration, Instant};

use voxgate_turn::testing::Harness;
use voxgate_turn::{
    AssistantTurn, AudioSpan, Config, Delivery, Input, InputError, Interruption, Output,
    ResponseCause, ResponseKind, State, TriggerMode, TurnId, UserSource, UserTurn,
};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// 24 kHz 16-bit mono: 48 bytes per millisecond.
fn audio(millis: u64) -> Option<AudioSpan> {
    Some(AudioSpan {
        bytes: millis * 48,
        duration: ms(millis),
    })
}

fn harness() -> Harness {
    Harness::connected(Config::default(), Instant::now())
}

fn harness_with(config: Config) -> Harness {
    Harness::connected(config, Instant::now())
}

fn words(text: &str, is_final: bool) -> Input {
    Input::Words {
        text: text.into(),
        is_final,
    }
}

fn chunk(turn: TurnId, text: &str, millis: u64) -> Input {
    Input::ResponseChunk {
        turn,
        text: text.into(),
        audio: audio(millis),
    }
}

fn end(turn: TurnId) -> Input {
    Input::ResponseEnd {
        turn,
        awaits_user: false,
    }
}

fn states(outs: &[Output]) -> Vec<(State, State)> {
    outs.iter()
        .filter_map(|o| match o {
            Output::StateChanged { from, to } => Some((*from, *to)),
            _ => None,
        })
        .collect()
}

fn ended(outs: &[Output]) -> Vec<AssistantTurn> {
    outs.iter()
        .filter_map(|o| match o {
            Output::ResponseEnded(a) => Some(a.clone()),
            _ => None,
        })
        .collect()
}

fn user_turns(outs: &[Output]) -> Vec<UserTurn> {
    outs.iter()
        .filter_map(|o| match o {
            Output::UserTurn(u) => Some(u.clone()),
            _ => None,
        })
        .collect()
}

fn log(h: &Harness) -> Vec<Output> {
    h.log().iter().map(|(_, o)| o.clone()).collect()
}

/// The user says `text` (final transcript) over `speech` and the endpoint fires; returns the
/// requested response's turn.
fn user_says(h: &mut Harness, text: &str, speech: Duration) -> TurnId {
    h.input(Input::SpeechStarted).unwrap();
    h.advance(speech / 2);
    h.input(words(text, true)).unwrap();
    h.advance(speech / 2);
    h.input(Input::SpeechStopped).unwrap();
    let outs = h.fire_next_timeout();
    assert_eq!(h.state(), State::Processing, "{outs:?}");
    h.last_response_turn().unwrap()
}

/// A response speaking `parts`, each `each` long, delivered at once.
fn reply(h: &mut Harness, turn: TurnId, parts: &[&str], each: u64) {
    h.input(Input::ResponseStarted { turn }).unwrap();
    for p in parts {
        h.input(chunk(turn, p, each)).unwrap();
    }
}

// ---- session lifecycle ----------------------------------------------------------------------

#[test]
fn handshake_moves_not_connected_to_connecting_to_idle_and_announces_the_session() {
    let mut h = Harness::new(Config::default(), Instant::now());
    assert_eq!(h.state(), State::NotConnected);
    assert_eq!(h.input(Input::SpeechStarted), Err(InputError::NotConnected));
    assert_eq!(
        h.input(Input::Connected),
        Err(InputError::HandshakeOutOfOrder(State::NotConnected))
    );
    let outs = h.input(Input::Connect).unwrap();
    assert_eq!(states(&outs), [(State::NotConnected, State::Connecting)]);
    assert_eq!(
        h.input(Input::Text {
            text: "hi".into(),
            mode: TriggerMode::Queue
        }),
        Err(InputError::NotConnected)
    );
    let outs = h.input(Input::Connected).unwrap();
    assert_eq!(states(&outs), [(State::Connecting, State::Idle)]);
    assert!(outs.contains(&Output::SessionConnected));
    assert_eq!(
        h.input(Input::Connect),
        Err(InputError::HandshakeOutOfOrder(State::Idle))
    );
}

#[test]
fn disconnect_closes_every_open_response_and_tool() {
    let mut h = harness();
    let turn = user_says(&mut h, "turn on the light", ms(600));
    h.input(Input::ToolCallStarted {
        turn,
        call_id: "c1".into(),
        name: "light.on".into(),
        cancel_on_interrupt: false,
    })
    .unwrap();
    h.input(chunk(turn, "Sure.", 500)).unwrap();
    let outs = h.input(Input::Disconnected).unwrap();
    assert_eq!(h.state(), State::NotConnected);
    let e = ended(&outs);
    assert_eq!(e.len(), 1);
    assert_eq!(
        e[0].delivery,
        Delivery::Interrupted {
            by: Interruption::Disconnect
        }
    );
    assert!(outs.contains(&Output::CancelTool {
        call_id: "c1".into()
    }));
    assert!(outs.contains(&Output::CancelResponse { turn }));
}

#[test]
fn fatal_error_is_announced_and_ends_the_session() {
    let mut h = harness();
    let outs = h
        .input(Input::Fatal {
            reason: "provider gone".into(),
        })
        .unwrap();
    assert_eq!(
        outs[0],
        Output::ErrorFatal {
            reason: "provider gone".into()
        }
    );
    assert_eq!(h.state(), State::NotConnected);
    // A new session can start on the same machine.
    h.input(Input::Connect).unwrap();
    h.input(Input::Connected).unwrap();
    assert_eq!(h.state(), State::Idle);
}

// ---- VAD_Start, VAD_End and endpointing -----------------------------------------------------

#[test]
fn vad_start_moves_idle_to_listening_with_input_detected() {
    let mut h = harness();
    let outs = h.input(Input::SpeechStarted).unwrap();
    assert_eq!(outs[0], Output::InputDetected);
    assert_eq!(states(&outs), [(State::Idle, State::Listening)]);
}

#[test]
fn vad_end_moves_listening_to_processing_after_the_minimum_delay_once_words_are_final() {
    let mut h = harness();
    h.input(Input::SpeechStarted).unwrap();
    h.input(words("what's the weather", true)).unwrap();
    h.advance(ms(700));
    h.input(Input::SpeechStopped).unwrap();
    let stop = h.elapsed();
    let min = Config::default().min_endpoint_delay;
    assert!(h.advance(min - ms(1)).is_empty());
    let outs = h.advance(ms(1));
    assert_eq!(h.elapsed() - stop, min);
    assert_eq!(states(&outs), [(State::Listening, State::Processing)]);
    let u = user_turns(&outs);
    assert_eq!(u[0].text, "what's the weather");
    assert_eq!(u[0].source, UserSource::Speech);
    assert!(outs.contains(&Output::StartResponse {
        turn: TurnId(u[0].turn.0 + 1),
        cause: ResponseCause::User(u[0].turn),
        instructions: None,
    }));
}

#[test]
fn endpointing_waits_for_the_final_transcript_up_to_the_maximum() {
    let mut h = harness();
    h.input(Input::SpeechStarted).unwrap();
    h.input(words("so I was", false)).unwrap();
    h.input(Input::SpeechStopped).unwrap();
    // Only a partial: the recognizer may still change it, so the short delay does not apply.
    assert!(h.advance(ms(1000)).is_empty());
    assert_eq!(h.state(), State::Listening);
    // The final arrives late: the minimum delay has already passed, so the turn ends now.
    let outs = h.input(words("so I was thinking", true)).unwrap();
    assert_eq!(user_turns(&outs)[0].text, "so I was thinking");
    assert_eq!(h.state(), State::Processing);

    // Without any final, the maximum delay ends the turn with the partial.
    let mut h = harness();
    h.input(Input::SpeechStarted).unwrap();
    h.input(words("hmm maybe", false)).unwrap();
    h.input(Input::SpeechStopped).unwrap();
    let stop = h.elapsed();
    let outs = h.fire_next_timeout();
    assert_eq!(h.elapsed() - stop, Config::default().max_endpoint_delay);
    assert_eq!(user_turns(&outs)[0].text, "hmm maybe");
}

#[test]
fn endpointing_follows_a_turn_model_when_one_speaks() {
    let mut h = harness();
    h.input(Input::SpeechStarted).unwrap();
    h.input(words("I want to", true)).unwrap();
    h.input(Input::SpeechStopped).unwrap();
    h.input(Input::EndOfTurnPrediction { probability: 0.1 })
        .unwrap();
    let stop = h.elapsed();
    h.fire_next_timeout();
    assert_eq!(h.elapsed() - stop, Config::default().max_endpoint_delay);

    let mut h = harness();
    h.input(Input::SpeechStarted).unwrap();
    h.input(words("hmm", false)).unwrap();
    h.input(Input::SpeechStopped).unwrap();
    h.input(Input::EndOfTurnPrediction { probability: 0.9 })
        .unwrap();
    let stop = h.elapsed();
    h.fire_next_timeout();
    assert_eq!(h.elapsed() - stop, Config::default().min_endpoint_delay);
}

#[test]
fn speech_resuming_during_the_endpoint_wait_keeps_one_user_turn() {
    let mut h = harness();
    h.input(Input::SpeechStarted).unwrap();
    h.input(words("book a table", true)).unwrap();
    h.input(Input::SpeechStopped).unwrap();
    h.advance(Config::default().min_endpoint_delay / 2);
    h.input(Input::SpeechStarted).unwrap();
    assert_eq!(h.machine().poll_timeout(), None);
    h.input(words("for two", true)).unwrap();
    h.input(Input::SpeechStopped).unwrap();
    let outs = h.fire_next_timeout();
    let u = user_turns(&outs);
    assert_eq!(u.len(), 1);
    assert_eq!(u[0].text, "book a table for two");
}

#[test]
fn a_possible_onset_holds_the_endpoint_until_the_vad_decides() {
    let min = Config::default().min_endpoint_delay;
    let mut h = harness();
    h.input(Input::SpeechStarted).unwrap();
    h.input(words("book a table", true)).unwrap();
    h.input(Input::SpeechStopped).unwrap();
    // Speech-like frames just before the deadline: the VAD has not confirmed them yet.
    h.advance(min - ms(10));
    h.input(Input::SpeechOnset).unwrap();
    assert_eq!(h.machine().poll_timeout(), None);
    assert!(
        h.advance(ms(90)).is_empty(),
        "the endpoint fired during the onset"
    );
    // Confirmed: one user turn, however long the hysteresis took.
    h.input(Input::SpeechStarted).unwrap();
    h.input(words("for two", true)).unwrap();
    h.input(Input::SpeechStopped).unwrap();
    let outs = h.fire_next_timeout();
    let u = user_turns(&outs);
    assert_eq!(u.len(), 1);
    assert_eq!(u[0].text, "book a table for two");

    // Rejected (a click, a breath): the endpoint is due already and fires at once.
    let mut h = harness();
    h.input(Input::SpeechStarted).unwrap();
    h.input(words("book a table", true)).unwrap();
    h.input(Input::SpeechStopped).unwrap();
    let stop = h.elapsed();
    h.advance(min - ms(10));
    h.input(Input::SpeechOnset).unwrap();
    h.advance(ms(30));
    let outs = h.input(Input::SpeechOnsetRejected).unwrap();
    assert_eq!(user_turns(&outs)[0].text, "book a table");
    assert_eq!(h.elapsed() - stop, min + ms(20));
    assert_eq!(h.state(), State::Processing);
}

#[test]
fn without_a_recognizer_vad_alone_ends_the_turn_after_the_minimum_delay() {
    let mut h = harness();
    h.input(Input::SpeechStarted).unwrap();
    h.advance(ms(900));
    h.input(Input::SpeechStopped).unwrap();
    let outs = h.fire_next_timeout();
    let u = user_turns(&outs);
    assert_eq!(u.len(), 1);
    assert_eq!(u[0].text, "");
    assert_eq!(h.state(), State::Processing);
}

#[test]
fn a_user_turn_with_no_words_is_discarded_when_a_recognizer_is_present() {
    let mut h = harness();
    user_says(&mut h, "hello", ms(400));
    let turn = h.last_response_turn().unwrap();
    h.input(end(turn)).unwrap();
    assert_eq!(h.state(), State::Idle);
    h.input(Input::SpeechStarted).unwrap();
    h.input(Input::SpeechStopped).unwrap();
    let outs = h.advance(ms(5000));
    assert!(outs.contains(&Output::UserTurnDiscarded));
    assert_eq!(states(&outs), [(State::Listening, State::Idle)]);
    assert_eq!(h.machine().stats().discarded_user_turns, 1);
}

#[test]
fn push_to_talk_ends_the_turn_on_release_not_on_silence() {
    let mut h = harness();
    let outs = h.input(Input::StartCapture).unwrap();
    assert_eq!(states(&outs), [(State::Idle, State::Listening)]);
    h.input(words("call mom", true)).unwrap();
    h.input(Input::SpeechStarted).unwrap();
    h.input(Input::SpeechStopped).unwrap();
    assert!(h.advance(ms(5000)).is_empty());
    let outs = h.input(Input::StopCapture).unwrap();
    assert_eq!(user_turns(&outs)[0].text, "call mom");
    assert_eq!(h.state(), State::Processing);
}

// ---- Intent_Resolved, Action_Complete, Playback_Complete ------------------------------------

#[test]
fn first_chunk_moves_processing_to_speaking_and_playback_end_to_idle() {
    let mut h = harness();
    let turn = user_says(&mut h, "hi", ms(300));
    let outs = h.input(Input::ResponseStarted { turn }).unwrap();
    assert_eq!(outs, [Output::ResponseBegun { turn }]);
    assert_eq!(h.state(), State::Processing);
    let outs = h.input(chunk(turn, "Hello! ", 800)).unwrap();
    assert_eq!(
        outs[..2],
        [
            Output::StateChanged {
                from: State::Processing,
                to: State::Speaking
            },
            Output::Deliver { turn, seq: 0 },
        ]
    );
    h.input(chunk(turn, "How can I help?", 1200)).unwrap();
    let outs = h.input(end(turn)).unwrap();
    assert_eq!(outs, [Output::GenerationEnded { turn }]);
    assert!(h.advance(ms(1999)).is_empty());
    let outs = h.advance(ms(1));
    assert_eq!(states(&outs), [(State::Speaking, State::Idle)]);
    assert_eq!(
        ended(&outs),
        [AssistantTurn {
            turn,
            heard_text: "Hello! How can I help?".into(),
            delivery: Delivery::Complete,
            ephemeral: false,
            kind: ResponseKind::Model,
        }]
    );
}

#[test]
fn playback_reports_end_playback_when_the_client_has_played_everything() {
    let mut h = harness_with(Config {
        playback_reports: true,
        ..Config::default()
    });
    let turn = user_says(&mut h, "hi", ms(300));
    reply(&mut h, turn, &["Hello there."], 500);
    h.input(end(turn)).unwrap();
    // The estimate alone does not end it while reports are expected...
    assert!(h.advance(ms(600)).is_empty());
    h.input(Input::PlaybackProgress {
        turn,
        bytes_played: 300 * 48,
    })
    .unwrap();
    assert_eq!(h.state(), State::Speaking);
    let outs = h
        .input(Input::PlaybackProgress {
            turn,
            bytes_played: 500 * 48,
        })
        .unwrap();
    assert_eq!(states(&outs), [(State::Speaking, State::Idle)]);

    // ...but lost reports cannot hang the turn: the grace period ends it.
    let turn = user_says(&mut h, "again", ms(300));
    reply(&mut h, turn, &["Hello again."], 500);
    h.input(end(turn)).unwrap();
    let at = h.elapsed();
    let outs = h.fire_next_timeout();
    assert_eq!(
        h.elapsed() - at,
        ms(500) + Config::default().playback_report_grace
    );
    assert_eq!(states(&outs), [(State::Speaking, State::Idle)]);
}

#[test]
fn a_follow_up_question_moves_speaking_to_listening_and_times_out_to_idle() {
    let mut h = harness();
    let turn = user_says(&mut h, "set an alarm", ms(500));
    reply(&mut h, turn, &["For what time?"], 900);
    h.input(Input::ResponseEnd {
        turn,
        awaits_user: true,
    })
    .unwrap();
    let outs = h.advance(ms(900));
    assert_eq!(states(&outs), [(State::Speaking, State::Listening)]);
    let outs = h.advance(Config::default().listen_timeout);
    assert_eq!(states(&outs), [(State::Listening, State::Idle)]);
    assert!(user_turns(&outs).is_empty());
}

/// What the Deepslate plugins hit: a reply request while the machine waits for an answer to
/// its question is answered at once, not held for speech that never comes (and then dropped
/// with the wait).
#[test]
fn a_trigger_during_the_wait_after_a_question_is_answered_at_once() {
    for instructions in [None, Some("Say more.".to_owned())] {
        let mut h = harness();
        let turn = user_says(&mut h, "set an alarm", ms(500));
        reply(&mut h, turn, &["For what time?"], 900);
        h.input(Input::ResponseEnd {
            turn,
            awaits_user: true,
        })
        .unwrap();
        let outs = h.advance(ms(900));
        assert_eq!(states(&outs), [(State::Speaking, State::Listening)]);
        h.advance(ms(2_000));
        let outs = h
            .input(Input::TriggerInference {
                instructions: instructions.clone(),
                flush_vad: false,
            })
            .unwrap();
        assert!(
            outs.iter().any(|o| matches!(
                o,
                Output::StartResponse { cause: ResponseCause::Trigger, instructions: i, .. }
                    if *i == instructions
            )),
            "{outs:?}"
        );
        assert_eq!(states(&outs), [(State::Listening, State::Processing)]);
        assert!(user_turns(&outs).is_empty());
    }
}

/// A trigger that waits for possible speech is never lost with the wait: answered when the
/// onset turns out not to be speech, or when the wait after the question times out.
#[test]
fn a_trigger_held_by_a_possible_onset_is_answered_when_no_speech_follows() {
    for rejected in [true, false] {
        let mut h = harness();
        let turn = user_says(&mut h, "set an alarm", ms(500));
        reply(&mut h, turn, &["For what time?"], 900);
        h.input(Input::ResponseEnd {
            turn,
            awaits_user: true,
        })
        .unwrap();
        h.advance(ms(900));
        h.input(Input::SpeechOnset).unwrap();
        let outs = h
            .input(Input::TriggerInference {
                instructions: None,
                flush_vad: false,
            })
            .unwrap();
        assert!(states(&outs).is_empty(), "waits for the onset: {outs:?}");
        let outs = if rejected {
            h.input(Input::SpeechOnsetRejected).unwrap()
        } else {
            h.advance(Config::default().listen_timeout)
        };
        assert!(
            outs.iter().any(|o| matches!(
                o,
                Output::StartResponse {
                    cause: ResponseCause::Trigger,
                    ..
                }
            )),
            "{outs:?}"
        );
        assert_eq!(states(&outs), [(State::Listening, State::Processing)]);
    }
}

#[test]
fn a_tool_call_moves_processing_to_action_and_back_to_processing_when_done() {
    let mut h = harness();
    let turn = user_says(&mut h, "open settings", ms(500));
    let outs = h
        .input(Input::ToolCallStarted {
            turn,
            call_id: "nav-1".into(),
            name: "navigate".into(),
            cancel_on_interrupt: true,
        })
        .unwrap();
    assert!(outs.contains(&Output::ActionInvoke {
        turn,
        call_id: "nav-1".into(),
        name: "navigate".into()
    }));
    assert_eq!(h.state(), State::Action);
    let outs = h
        .input(Input::ToolCallFinished {
            call_id: "nav-1".into(),
            ok: true,
        })
        .unwrap();
    assert!(outs.contains(&Output::ActionResult {
        call_id: "nav-1".into(),
        ok: true
    }));
    // The model is still generating: confirmation speech follows in the same response.
    assert_eq!(states(&outs), [(State::Action, State::Processing)]);
    h.input(chunk(turn, "Done.", 400)).unwrap();
    assert_eq!(h.state(), State::Speaking);
}

#[test]
fn a_tool_that_finishes_before_the_model_ends_still_gets_a_follow_up_response() {
    // A device answers `tools/call` in milliseconds, often before the stream that called the
    // tool has ended; the model never sees the result in that stream.
    let mut h = harness();
    let turn = user_says(&mut h, "volume fifty", ms(500));
    h.input(Input::ToolCallStarted {
        turn,
        call_id: "v".into(),
        name: "set_volume".into(),
        cancel_on_interrupt: false,
    })
    .unwrap();
    h.input(Input::ToolCallFinished {
        call_id: "v".into(),
        ok: true,
    })
    .unwrap();
    let outs = h.input(end(turn)).unwrap();
    let next = h.last_response_turn().unwrap();
    assert_ne!(next, turn);
    assert!(outs.contains(&Output::StartResponse {
        turn: next,
        cause: ResponseCause::ToolResults,
        instructions: None
    }));
}

#[test]
fn tool_results_after_the_model_ended_ask_for_a_follow_up_response_which_may_be_empty() {
    let mut h = harness();
    let turn = user_says(&mut h, "lights off", ms(500));
    h.input(Input::ToolCallStarted {
        turn,
        call_id: "7".into(),
        name: "lights".into(),
        cancel_on_interrupt: false,
    })
    .unwrap();
    h.input(end(turn)).unwrap();
    assert_eq!(h.state(), State::Action);
    let outs = h
        .input(Input::ToolCallFinished {
            call_id: "7".into(),
            ok: false,
        })
        .unwrap();
    let next = h.last_response_turn().unwrap();
    assert!(outs.contains(&Output::StartResponse {
        turn: next,
        cause: ResponseCause::ToolResults,
        instructions: None
    }));
    assert_eq!(states(&outs), [(State::Action, State::Processing)]);
    // The model has nothing to add: Action_Complete ends in Idle.
    let outs = h.input(end(next)).unwrap();
    assert_eq!(states(&outs), [(State::Processing, State::Idle)]);
}

#[test]
fn a_tool_called_while_speaking_waits_for_playback_then_shows_action() {
    let mut h = harness();
    let turn = user_says(&mut h, "what's on my screen", ms(500));
    reply(&mut h, turn, &["Let me look."], 600);
    h.input(Input::ToolCallStarted {
        turn,
        call_id: "cam".into(),
        name: "camera".into(),
        cancel_on_interrupt: true,
    })
    .unwrap();
    assert_eq!(h.state(), State::Speaking);
    let outs = h.advance(ms(600));
    assert_eq!(states(&outs), [(State::Speaking, State::Action)]);
    assert_eq!(h.machine().poll_timeout(), None);
}

#[test]
fn unknown_tool_results_are_refused() {
    let mut h = harness();
    assert_eq!(
        h.input(Input::ToolCallFinished {
            call_id: "nope".into(),
            ok: true
        }),
        Err(InputError::UnknownToolCall {
            call_id: "nope".into()
        })
    );
}

#[test]
fn latency_figures_count_from_the_end_of_user_speech() {
    let mut h = harness();
    h.input(Input::SpeechStarted).unwrap();
    h.input(words("hello", true)).unwrap();
    h.input(Input::SpeechStopped).unwrap();
    h.fire_next_timeout();
    let turn = h.last_response_turn().unwrap();
    h.advance(ms(150));
    h.input(Input::ResponseStarted { turn }).unwrap();
    h.advance(ms(100));
    let outs = h.input(chunk(turn, "Hi!", 300)).unwrap();
    let lat = outs
        .iter()
        .find_map(|o| match o {
            Output::Latency(l) => Some(*l),
            _ => None,
        })
        .unwrap();
    assert_eq!(lat.turn, turn);
    let min = Config::default().min_endpoint_delay;
    assert_eq!(lat.endpointing, Some(min));
    assert_eq!(lat.to_response_start, Some(min + ms(150)));
    assert_eq!(lat.to_first_audio, Some(min + ms(250)));
    // Once per response.
    let outs = h.input(chunk(turn, " Bye.", 300)).unwrap();
    assert!(!outs.iter().any(|o| matches!(o, Output::Latency(_))));
}

// ---- barge-in and the interruption policy ---------------------------------------------------

#[test]
fn barge_in_halts_playback_first_cancels_generation_and_keeps_only_heard_words() {
    let mut h = harness();
    let turn = user_says(&mut h, "tell me a story", ms(500));
    reply(
        &mut h,
        turn,
        &["Once upon a time ", "there was a king."],
        1000,
    );
    h.advance(ms(500));
    h.input(Input::SpeechStarted).unwrap();
    let outs = h.advance(ms(300));
    // Halting playback is the first thing that happens.
    assert_eq!(outs[0], Output::ClearPlayback { turn });
    assert!(outs.contains(&Output::CancelResponse { turn }));
    assert_eq!(states(&outs), [(State::Speaking, State::Listening)]);
    let e = ended(&outs);
    assert_eq!(
        e[0].delivery,
        Delivery::Interrupted {
            by: Interruption::Speech
        }
    );
    // 800 ms into the first 1 s chunk of 17 characters: 13 characters, whole words only.
    assert_eq!(e[0].heard_text, "Once upon a");
    // The provider keeps streaming the cancelled turn: nothing of it reaches the client.
    let outs = h.input(chunk(turn, "The end.", 500)).unwrap();
    assert!(outs.is_empty());
    assert_eq!(h.machine().stats().interruptions, 1);
}

#[test]
fn heard_text_follows_playback_reports_when_the_client_sends_them() {
    let mut h = harness_with(Config {
        playback_reports: true,
        ..Config::default()
    });
    let turn = user_says(&mut h, "story", ms(500));
    reply(&mut h, turn, &["One two three four. ", "Five six."], 1000);
    h.advance(ms(1500));
    // The client is behind the real-time estimate: only half of the first chunk was heard.
    h.input(Input::PlaybackProgress {
        turn,
        bytes_played: 500 * 48,
    })
    .unwrap();
    h.input(Input::SpeechStarted).unwrap();
    let outs = h.advance(ms(300));
    assert_eq!(ended(&outs)[0].heard_text, "One two");
    // A late report for the interrupted turn is ignored.
    let outs = h
        .input(Input::PlaybackProgress {
            turn,
            bytes_played: 2000 * 48,
        })
        .unwrap();
    assert!(outs.is_empty());
}

#[test]
fn speech_shorter_than_the_minimum_does_not_interrupt() {
    let mut h = harness();
    let turn = user_says(&mut h, "hi", ms(300));
    reply(&mut h, turn, &["Hello, nice to meet you."], 2000);
    h.input(Input::SpeechStarted).unwrap();
    h.advance(ms(200));
    let outs = h.input(Input::SpeechStopped).unwrap();
    assert!(outs.is_empty());
    h.advance(ms(2000));
    assert_eq!(h.machine().stats().rejected_interruptions, 1);
    assert_eq!(h.machine().stats().interruptions, 0);
    assert_eq!(h.state(), State::Speaking);
    assert_eq!(
        ended(&h.input(end(turn)).unwrap())
            .first()
            .map(|a| a.delivery),
        Some(Delivery::Complete)
    );
}

#[test]
fn an_empty_transcript_while_speaking_does_not_shorten_the_minimum_speech() {
    let mut h = harness();
    let turn = user_says(&mut h, "hi", ms(300));
    reply(&mut h, turn, &["Hello, nice to meet you."], 2000);
    // A recognizer streaming during the reply sends an empty partial before any speech.
    assert!(h.input(words("", false)).unwrap().is_empty());
    h.advance(ms(100));
    h.input(Input::SpeechStarted).unwrap();
    let outs = h.advance(ms(200));
    assert!(
        !outs
            .iter()
            .any(|o| matches!(o, Output::ClearPlayback { .. })),
        "interrupted before the minimum speech: {outs:?}"
    );
    assert_eq!(h.state(), State::Speaking);
    let outs = h.advance(ms(150));
    assert_eq!(outs[0], Output::ClearPlayback { turn });
    assert_eq!(h.machine().stats().interruptions, 1);
}

#[test]
fn min_words_holds_the_interruption_until_the_words_arrive() {
    let mut h = harness_with(Config {
        min_interruption_words: 2,
        ..Config::default()
    });
    let turn = user_says(&mut h, "hi", ms(300));
    reply(&mut h, turn, &["A long answer follows here."], 4000);
    h.input(Input::SpeechStarted).unwrap();
    h.advance(ms(600));
    assert_eq!(h.state(), State::Speaking, "duration alone is not enough");
    let outs = h.input(words("wait", false)).unwrap();
    assert!(outs.is_empty(), "one word is not enough");
    let outs = h.input(words("wait stop", false)).unwrap();
    assert_eq!(outs[0], Output::ClearPlayback { turn });
    assert_eq!(h.state(), State::Listening);
    // The words that interrupted belong to the new user turn.
    h.input(Input::SpeechStopped).unwrap();
    h.input(words("wait stop", true)).unwrap();
    let outs = h.fire_next_timeout();
    assert_eq!(user_turns(&outs)[0].text, "wait stop");
}

#[test]
fn transcript_words_alone_interrupt_when_no_vad_speaks() {
    let mut h = harness();
    let turn = user_says(&mut h, "hi", ms(300));
    reply(&mut h, turn, &["Let me tell you about our offers."], 3000);
    h.advance(ms(400));
    let outs = h.input(words("no thanks", true)).unwrap();
    let e = ended(&outs);
    assert_eq!(
        e[0].delivery,
        Delivery::Interrupted {
            by: Interruption::Words
        }
    );
    assert_eq!(h.state(), State::Listening);
    let outs = h.fire_next_timeout();
    assert_eq!(user_turns(&outs)[0].text, "no thanks");
}

#[test]
fn a_false_interruption_resumes_the_unheard_rest_of_the_reply() {
    let mut h = harness();
    let turn = user_says(&mut h, "recipe please", ms(300));
    reply(
        &mut h,
        turn,
        &["Boil water. ", "Add pasta. ", "Wait ten minutes."],
        1000,
    );
    h.input(end(turn)).unwrap();
    h.advance(ms(900));
    h.input(Input::SpeechStarted).unwrap();
    // Confirmed 1.2 s in: 20% into "Add pasta. ", not a whole word yet.
    let outs = h.advance(ms(300));
    assert_eq!(ended(&outs)[0].heard_text, "Boil water. ");
    h.input(Input::SpeechStopped).unwrap();
    let stop = h.elapsed();
    // No words came: it was a cough or the agent's own echo.
    let outs = h.fire_next_timeout();
    assert_eq!(
        h.elapsed() - stop,
        Config::default().false_interruption_timeout
    );
    assert!(outs.contains(&Output::UserTurnDiscarded));
    let resumed = h.last_response_turn().unwrap();
    assert!(outs.contains(&Output::ResumeResponse {
        turn: resumed,
        interrupted: turn,
        text: "Add pasta. Wait ten minutes.".into()
    }));
    assert!(outs.contains(&Output::ResponseBegun { turn: resumed }));
    assert_eq!(h.state(), State::Processing);
    assert_eq!(h.machine().stats().false_interruptions, 1);
    h.input(chunk(resumed, "Add pasta. Wait ten minutes.", 2000))
        .unwrap();
    h.input(end(resumed)).unwrap();
    let e = ended(&h.advance(ms(2000)));
    assert_eq!(e[0].kind, ResponseKind::Resumed);
    assert_eq!(e[0].delivery, Delivery::Complete);
}

#[test]
fn resume_can_be_turned_off() {
    let mut h = harness_with(Config {
        resume_false_interruptions: false,
        ..Config::default()
    });
    let turn = user_says(&mut h, "recipe", ms(300));
    reply(&mut h, turn, &["Boil water. Add pasta."], 2000);
    h.input(Input::SpeechStarted).unwrap();
    h.advance(ms(400));
    h.input(Input::SpeechStopped).unwrap();
    let outs = h.advance(ms(5000));
    assert!(outs.contains(&Output::UserTurnDiscarded));
    assert!(
        !outs
            .iter()
            .any(|o| matches!(o, Output::ResumeResponse { .. }))
    );
    assert_eq!(h.state(), State::Idle);
}

#[test]
fn a_real_interruption_commits_the_user_turn_and_never_resumes() {
    let mut h = harness();
    let turn = user_says(&mut h, "recipe", ms(300));
    reply(&mut h, turn, &["Boil water. Add pasta."], 2000);
    h.input(Input::SpeechStarted).unwrap();
    h.advance(ms(400));
    h.input(words("actually make it rice", true)).unwrap();
    h.input(Input::SpeechStopped).unwrap();
    let outs = h.advance(ms(5000));
    assert!(
        !outs
            .iter()
            .any(|o| matches!(o, Output::ResumeResponse { .. }))
    );
    assert_eq!(user_turns(&outs)[0].text, "actually make it rice");
    assert_eq!(h.state(), State::Processing);
}

#[test]
fn barge_in_while_processing_cancels_generation_without_clearing_playback() {
    let mut h = harness();
    let turn = user_says(&mut h, "hello", ms(300));
    h.input(Input::SpeechStarted).unwrap();
    let outs = h.advance(ms(300));
    assert!(outs.contains(&Output::CancelResponse { turn }));
    assert!(
        !outs
            .iter()
            .any(|o| matches!(o, Output::ClearPlayback { .. }))
    );
    assert!(ended(&outs).is_empty(), "it never began");
    assert_eq!(states(&outs), [(State::Processing, State::Listening)]);
}

#[test]
fn barge_in_cancels_only_tools_marked_cancel_on_interrupt_and_keeps_the_others() {
    let mut h = harness();
    let turn = user_says(&mut h, "do things", ms(300));
    for (id, cancel) in [("a", true), ("b", false)] {
        h.input(Input::ToolCallStarted {
            turn,
            call_id: id.into(),
            name: "t".into(),
            cancel_on_interrupt: cancel,
        })
        .unwrap();
    }
    h.input(Input::SpeechStarted).unwrap();
    let outs = h.advance(ms(300));
    assert!(outs.contains(&Output::CancelTool {
        call_id: "a".into()
    }));
    assert!(!outs.contains(&Output::CancelTool {
        call_id: "b".into()
    }));
    assert_eq!(h.state(), State::Listening);
    // The surviving tool's result still arrives and is reported, without taking the floor.
    let outs = h
        .input(Input::ToolCallFinished {
            call_id: "b".into(),
            ok: true,
        })
        .unwrap();
    assert_eq!(
        outs,
        [Output::ActionResult {
            call_id: "b".into(),
            ok: true
        }]
    );
    assert_eq!(h.state(), State::Listening);
    assert!(
        h.input(Input::ToolCallFinished {
            call_id: "a".into(),
            ok: true
        })
        .is_err()
    );
}

#[test]
fn uninterruptible_direct_speech_ignores_speech_and_hands_over_afterwards() {
    let mut h = harness();
    let outs = h
        .input(Input::DirectSpeech {
            text: "Please listen carefully.".into(),
            include_in_history: true,
            uninterruptible: true,
        })
        .unwrap();
    let turn = h.last_response_turn().unwrap();
    assert!(outs.contains(&Output::Speak {
        turn,
        text: "Please listen carefully.".into()
    }));
    assert!(outs.contains(&Output::ResponseBegun { turn }));
    h.input(chunk(turn, "Please listen carefully.", 1500))
        .unwrap();
    h.input(end(turn)).unwrap();
    h.input(Input::SpeechStarted).unwrap();
    h.input(words("what", false)).unwrap();
    h.advance(ms(1000));
    assert_eq!(h.state(), State::Speaking);
    let outs = h.advance(ms(500));
    assert_eq!(ended(&outs)[0].delivery, Delivery::Complete);
    // The user is still talking when it ends: they get the floor with their words so far.
    assert_eq!(states(&outs), [(State::Speaking, State::Listening)]);
    h.input(words("what was that", true)).unwrap();
    h.input(Input::SpeechStopped).unwrap();
    let outs = h.fire_next_timeout();
    assert_eq!(user_turns(&outs)[0].text, "what was that");
}

#[test]
fn direct_speech_preempts_a_reply_and_can_stay_out_of_history() {
    let mut h = harness();
    let turn = user_says(&mut h, "hi", ms(300));
    reply(&mut h, turn, &["Hello there, friend."], 2000);
    h.advance(ms(100));
    let outs = h
        .input(Input::DirectSpeech {
            text: "Your timer is done.".into(),
            include_in_history: false,
            uninterruptible: false,
        })
        .unwrap();
    assert_eq!(outs[0], Output::ClearPlayback { turn });
    assert_eq!(
        ended(&outs)[0].delivery,
        Delivery::Interrupted {
            by: Interruption::DirectSpeech
        }
    );
    let direct = h.last_response_turn().unwrap();
    h.input(Input::ResponseChunk {
        turn: direct,
        text: "Your timer is done.".into(),
        audio: None,
    })
    .unwrap();
    let outs = h.input(end(direct)).unwrap();
    let e = ended(&outs);
    assert!(e[0].ephemeral);
    assert_eq!(e[0].kind, ResponseKind::Direct);
    assert_eq!(e[0].heard_text, "Your timer is done.");
    assert_eq!(h.state(), State::Idle);
}

#[test]
fn client_abort_stops_at_once_and_gives_the_floor_to_nobody() {
    let mut h = harness();
    let turn = user_says(&mut h, "sing", ms(300));
    reply(&mut h, turn, &["La la la la."], 3000);
    let outs = h.input(Input::Abort).unwrap();
    assert_eq!(outs[0], Output::ClearPlayback { turn });
    assert_eq!(
        ended(&outs)[0].delivery,
        Delivery::Interrupted {
            by: Interruption::ClientAbort
        }
    );
    assert_eq!(states(&outs), [(State::Speaking, State::Idle)]);
    // No resume after an abort, however long we wait.
    assert!(h.advance(ms(10_000)).is_empty());
}

#[test]
fn abort_overrides_uninterruptible_speech_only_when_configured() {
    for overrides in [true, false] {
        let mut h = harness_with(Config {
            abort_overrides_uninterruptible: overrides,
            ..Config::default()
        });
        h.input(Input::DirectSpeech {
            text: "Safety notice.".into(),
            include_in_history: true,
            uninterruptible: true,
        })
        .unwrap();
        let turn = h.last_response_turn().unwrap();
        h.input(chunk(turn, "Safety notice.", 2000)).unwrap();
        let outs = h.input(Input::Abort).unwrap();
        assert_eq!(
            outs.contains(&Output::ClearPlayback { turn }),
            overrides,
            "overrides={overrides}"
        );
    }
}

#[test]
fn abort_while_listening_discards_the_user_turn() {
    let mut h = harness();
    h.input(Input::SpeechStarted).unwrap();
    h.input(words("never mind", false)).unwrap();
    let outs = h.input(Input::Abort).unwrap();
    assert!(outs.contains(&Output::UserTurnDiscarded));
    assert_eq!(h.state(), State::Idle);
}

// ---- text input and TriggerInference --------------------------------------------------------

#[test]
fn no_trigger_text_is_recorded_without_a_reply() {
    let mut h = harness();
    let outs = h
        .input(Input::Text {
            text: "context: user is in Berlin".into(),
            mode: TriggerMode::NoTrigger,
        })
        .unwrap();
    assert_eq!(user_turns(&outs)[0].source, UserSource::Text);
    assert!(states(&outs).is_empty());
    assert_eq!(h.last_response_turn(), None);
}

#[test]
fn queued_text_waits_for_the_current_turn_to_finish() {
    let mut h = harness();
    let turn = user_says(&mut h, "hi", ms(300));
    reply(&mut h, turn, &["Hello."], 500);
    h.input(end(turn)).unwrap();
    let outs = h
        .input(Input::Text {
            text: "and the news?".into(),
            mode: TriggerMode::Queue,
        })
        .unwrap();
    assert!(outs.is_empty());
    let outs = h.advance(ms(500));
    assert_eq!(ended(&outs)[0].delivery, Delivery::Complete);
    assert_eq!(user_turns(&outs)[0].text, "and the news?");
    assert_eq!(states(&outs), [(State::Speaking, State::Processing)]);
}

#[test]
fn immediate_text_interrupts_the_current_reply() {
    let mut h = harness();
    let turn = user_says(&mut h, "hi", ms(300));
    reply(&mut h, turn, &["Hello, how are you today?"], 2000);
    h.advance(ms(500));
    let outs = h
        .input(Input::Text {
            text: "stop, weather please".into(),
            mode: TriggerMode::Immediate,
        })
        .unwrap();
    assert_eq!(outs[0], Output::ClearPlayback { turn });
    assert_eq!(
        ended(&outs)[0].delivery,
        Delivery::Interrupted {
            by: Interruption::Text
        }
    );
    let u = user_turns(&outs);
    assert_eq!(u[0].text, "stop, weather please");
    assert!(outs.contains(&Output::StartResponse {
        turn: h.last_response_turn().unwrap(),
        cause: ResponseCause::User(u[0].turn),
        instructions: None
    }));
    assert_eq!(h.state(), State::Processing);
}

#[test]
fn text_during_a_user_turn_joins_it() {
    let mut h = harness();
    h.input(Input::SpeechStarted).unwrap();
    h.input(words("look at this", true)).unwrap();
    h.input(Input::Text {
        text: "https://example.com".into(),
        mode: TriggerMode::Immediate,
    })
    .unwrap();
    h.input(Input::SpeechStopped).unwrap();
    let outs = h.fire_next_timeout();
    let u = user_turns(&outs);
    assert_eq!(u.len(), 2);
    assert_eq!(u[1].text, "https://example.com");
    assert_eq!(h.state(), State::Processing);
}

#[test]
fn trigger_inference_replies_from_idle_with_instructions() {
    let mut h = harness();
    let outs = h
        .input(Input::TriggerInference {
            instructions: Some("greet the user".into()),
            flush_vad: false,
        })
        .unwrap();
    assert!(outs.contains(&Output::StartResponse {
        turn: TurnId(1),
        cause: ResponseCause::Trigger,
        instructions: Some("greet the user".into())
    }));
    assert_eq!(states(&outs), [(State::Idle, State::Processing)]);
}

#[test]
fn trigger_inference_with_flush_vad_ends_the_user_turn_at_once() {
    let mut h = harness();
    h.input(Input::SpeechStarted).unwrap();
    h.input(words("and then", true)).unwrap();
    let outs = h
        .input(Input::TriggerInference {
            instructions: None,
            flush_vad: true,
        })
        .unwrap();
    assert_eq!(user_turns(&outs)[0].text, "and then");
    assert_eq!(h.state(), State::Processing);
}

#[test]
fn trigger_inference_without_flush_waits_for_the_user_turn() {
    let mut h = harness();
    h.input(Input::SpeechStarted).unwrap();
    h.input(words("one more thing", true)).unwrap();
    let outs = h
        .input(Input::TriggerInference {
            instructions: Some("be brief".into()),
            flush_vad: false,
        })
        .unwrap();
    assert!(outs.is_empty());
    assert_eq!(h.state(), State::Listening);
    h.input(Input::SpeechStopped).unwrap();
    let outs = h.fire_next_timeout();
    let u = user_turns(&outs);
    assert!(outs.contains(&Output::StartResponse {
        turn: h.last_response_turn().unwrap(),
        cause: ResponseCause::User(u[0].turn),
        instructions: Some("be brief".into())
    }));
}

#[test]
fn the_log_keeps_virtual_times() {
    let mut h = harness();
    h.advance(ms(250));
    h.input(Input::SpeechStarted).unwrap();
    let (at, first) = h.log().last().unwrap().clone();
    assert_eq!(at, ms(250));
    assert_eq!(
        first,
        Output::StateChanged {
            from: State::Idle,
            to: State::Listening
        }
    );
    assert_eq!(log(&h).len(), 5);
}
