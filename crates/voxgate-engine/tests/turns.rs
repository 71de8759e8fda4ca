//! Turn-taking inputs through the engine: TriggerInference, push-to-talk, VAD telemetry and
//! false interruptions, on a virtual clock with scripted providers.

mod common;

use common::*;
use voxgate_audio::vad::VadState;
use voxgate_engine::history::{Content, DeliveryStatus, Role};
use voxgate_engine::provider::{ChatRole, ProviderEvent};
use voxgate_engine::{
    ClientEvent, EngineConfig, Input, Output, ProviderRequest, RequestId, State, TriggerMode,
};

fn transcribes(out: &[Output]) -> Vec<RequestId> {
    requests(out)
        .into_iter()
        .filter_map(|r| match r {
            ProviderRequest::Transcribe { id, .. } => Some(id),
            _ => None,
        })
        .collect()
}

fn transcript(id: RequestId, text: &str) -> ProviderEvent {
    ProviderEvent::Transcript {
        id,
        text: text.into(),
        language: "en".into(),
    }
}

fn generates(out: &[Output]) -> usize {
    requests(out)
        .iter()
        .filter(|r| matches!(r, ProviderRequest::Generate { .. }))
        .count()
}

/// The context of a `Generate` (empty for any other request, failing the comparisons).
fn context(req: &ProviderRequest) -> Vec<(ChatRole, String)> {
    let ProviderRequest::Generate { messages, .. } = req else {
        return Vec::new();
    };
    messages
        .iter()
        .map(|m| (m.role, m.content.clone()))
        .collect()
}

#[test]
fn trigger_in_idle_replies_and_records_its_instructions() {
    let mut d = Driver::new(EngineConfig {
        output_audio: None,
        system_prompt: "You are a concierge.".into(),
        ..EngineConfig::default()
    });
    let out = d.input(Input::TriggerInference {
        instructions: Some("Greet the guest by name: Ada.".into()),
        flush_vad: false,
    });
    let (id, req) = generate(&out);
    assert_eq!(
        context(&req),
        [
            (ChatRole::System, "You are a concierge.".to_owned()),
            (ChatRole::System, "Greet the guest by name: Ada.".to_owned()),
        ]
    );
    d.provider(delta(id, "Welcome, Ada."));
    d.provider(done(id));
    let h = d.engine.history();
    assert_eq!(h.len(), 2);
    assert_eq!(h[0].role, Role::System);
    assert_eq!(
        h[0].content,
        [Content::Instructions(
            "Greet the guest by name: Ada.".into()
        )]
    );
    assert_eq!(
        (h[1].role, h[1].text().as_str()),
        (Role::Assistant, "Welcome, Ada.")
    );

    // Without instructions nothing but the reply is recorded.
    let (id, req) = generate(&d.input(Input::TriggerInference {
        instructions: None,
        flush_vad: false,
    }));
    assert_eq!(context(&req).len(), 3);
    d.provider(delta(id, "Anything else?"));
    d.provider(done(id));
    let h = d.engine.history();
    assert_eq!(h.len(), 3);
    assert_eq!(h[2].role, Role::Assistant);
}

#[test]
fn trigger_without_flush_waits_for_the_users_turn_to_end() {
    let mut d = Driver::new(EngineConfig::default());
    // 2.5 s into the fixture the user is mid-utterance.
    let mut out = d.speak(&speech()[..40_000]);
    assert_eq!(d.engine.state(), State::Listening);
    out.extend(d.input(Input::TriggerInference {
        instructions: Some("Be brief.".into()),
        flush_vad: false,
    }));
    out.extend(d.speak(&speech()[40_000..]));
    out.extend(d.silence(600));
    assert_eq!(generates(&out), 0);
    let mut out = Vec::new();
    for (i, id) in transcribes(&d.log.iter().map(|(_, o)| o.clone()).collect::<Vec<_>>())
        .into_iter()
        .enumerate()
    {
        out.extend(d.provider(transcript(id, ["one", "two", "three"][i % 3])));
    }
    out.extend(d.advance(1000 * MS));
    let (_, req) = generate(&out);
    let ctx = context(&req);
    assert_eq!(
        ctx,
        [
            (ChatRole::User, "one two three".to_owned()),
            (ChatRole::System, "Be brief.".to_owned())
        ]
    );
}

#[test]
fn trigger_with_flush_cuts_the_utterance_and_replies_once_it_is_transcribed() {
    let mut d = Driver::new(EngineConfig::default());
    let out = d.speak(&speech()[..40_000]);
    let first = transcribes(&out);
    assert_eq!(first.len(), 1, "the first utterance ended at ~1.8 s");
    let out = d.input(Input::TriggerInference {
        instructions: Some("Answer now.".into()),
        flush_vad: true,
    });
    // The VAD returns to silence at the flush and the partial utterance goes to the recognizer.
    assert_eq!(
        client(&out),
        [ClientEvent::VadState {
            from: VadState::Speech,
            to: VadState::Silence,
            position: 40_000
        }]
    );
    let second = transcribes(&out);
    assert_eq!(second.len(), 1);
    assert_eq!(generates(&out), 0, "the words are not in yet");
    let mut out = d.provider(transcript(first[0], "what time"));
    out.extend(d.provider(transcript(second[0], "is it")));
    // No endpointing delay: the turn was stopped explicitly.
    let (_, req) = generate(&out);
    assert_eq!(
        context(&req),
        [
            (ChatRole::User, "what time is it".to_owned()),
            (ChatRole::System, "Answer now.".to_owned())
        ]
    );
    let h = d.engine.history();
    assert!(
        matches!(&h[0].content[..], [Content::InputAudio(a)] if a.transcription == "what time is it")
    );
    assert_eq!(h[1].content, [Content::Instructions("Answer now.".into())]);
    // The VAD restarted: later speech is a new utterance with positions that keep counting.
    let out = d.speak(&speech()[..32_000]);
    let positions: Vec<u64> = client(&out)
        .iter()
        .filter_map(|e| match e {
            ClientEvent::VadState { position, .. } => Some(*position),
            _ => None,
        })
        .collect();
    assert!(!positions.is_empty());
    assert!(positions.iter().all(|p| *p > 40_000), "{positions:?}");
}

#[test]
fn push_to_talk_holds_the_turn_until_release() {
    let mut d = Driver::new(EngineConfig::default());
    d.input(Input::StartCapture);
    assert_eq!(d.engine.state(), State::Listening);
    let mut out = d.speak(&speech());
    out.extend(d.silence(3000));
    let asr = transcribes(&out);
    assert!(!asr.is_empty());
    let mut out = Vec::new();
    for id in &asr {
        out.extend(d.provider(transcript(*id, "hold on")));
    }
    // Long silence and every transcript in, yet no reply while the button is held.
    out.extend(d.advance(5000 * MS));
    assert_eq!(generates(&out), 0);
    assert_eq!(d.engine.state(), State::Listening);
    let mut out = d.input(Input::StopCapture);
    out.extend(d.advance(100 * MS));
    let (id, req) = generate(&out);
    assert_eq!(context(&req)[0].0, ChatRole::User);

    // Pressing again during the reply cuts it off at once.
    let out = d.provider(delta(id, "Sure thing. Take your time, there is"));
    let s = synth(&out);
    d.provider(tts_audio(s[0].0, 1000));
    d.provider(done(s[0].0));
    let turn = d.engine.history()[1].turn.unwrap();
    let out = d.input(Input::StartCapture);
    let events = client(&out);
    assert_eq!(events[0], ClientEvent::ClearPlayback);
    assert!(events.contains(&ClientEvent::ResponseFinished {
        turn,
        interrupted: true
    }));
    assert!(requests(&out).contains(&ProviderRequest::Cancel { id }));
    assert_eq!(d.engine.state(), State::Listening);
    assert_eq!(d.engine.history()[1].delivery, DeliveryStatus::Interrupted);
}

#[test]
fn vad_frame_telemetry_reports_every_frame_in_order() {
    let mut d = Driver::new(EngineConfig {
        vad_frame_telemetry: true,
        ..EngineConfig::default()
    });
    let out = d.speak(&speech()[..32_000]);
    let events = client(&out);
    let frames: Vec<(u64, f32, f32, VadState)> = events
        .iter()
        .filter_map(|e| match e {
            ClientEvent::VadFrame {
                index,
                confidence,
                volume,
                state,
            } => Some((*index, *confidence, *volume, *state)),
            _ => None,
        })
        .collect();
    // 2 s of 16 kHz audio in 16 ms frames.
    assert_eq!(frames.len(), 125);
    assert!(frames.iter().enumerate().all(|(i, f)| f.0 == i as u64));
    assert!(
        frames
            .iter()
            .all(|f| (0.0..=1.0).contains(&f.1) && (0.0..=1.0).contains(&f.2))
    );
    // Frames agree with the state changes reported around them.
    let mut state = VadState::Silence;
    for e in &events {
        match e {
            ClientEvent::VadState { from, to, .. } => {
                assert_eq!(*from, state);
                state = *to;
            }
            ClientEvent::VadFrame { state: s, .. } => assert_eq!(*s, state),
            _ => {}
        }
    }
    assert!(frames.iter().any(|f| f.3 == VadState::Speech));
    assert!(frames.iter().any(|f| f.1 > 0.5) && frames.iter().any(|f| f.1 < 0.5));

    // Off by default.
    let mut quiet = Driver::new(EngineConfig::default());
    let out = quiet.speak(&speech()[..32_000]);
    assert!(
        !client(&out)
            .iter()
            .any(|e| matches!(e, ClientEvent::VadFrame { .. }))
    );
}

#[test]
fn false_interruption_resumes_the_unheard_rest() {
    let mut d = Driver::new(EngineConfig::default());
    let (id, _) = generate(&d.input(Input::Text {
        text: "count".into(),
        mode: TriggerMode::Queue,
    }));
    let mut out = d.provider(delta(
        id,
        "One two three four five six seven eight nine ten.",
    ));
    out.extend(d.provider(done(id)));
    let s = synth(&out);
    d.provider(tts_audio(s[0].0, 2000));
    d.provider(done(s[0].0));
    let cut = d.engine.history()[1].turn.unwrap();
    // A cough over the reply: long enough to count as a barge-in, then nothing recognised.
    let mut out = d.speak(&speech()[..16_000 * 2]);
    assert!(client(&out).contains(&ClientEvent::ClearPlayback));
    let heard = d.engine.history()[1].text();
    assert_eq!(d.engine.history()[1].delivery, DeliveryStatus::Interrupted);
    assert!(heard.starts_with("One two"), "{heard}");
    out.extend(d.silence(300));
    let mut out2 = Vec::new();
    for id in transcribes(&d.log.iter().map(|(_, o)| o.clone()).collect::<Vec<_>>()) {
        out2.extend(d.provider(transcript(id, "")));
    }
    out2.extend(d.advance(3000 * MS));
    // The rest is spoken again as a new response: no LLM call, one sentence to synthesize.
    assert_eq!(generates(&out2), 0);
    let again = synth(&out2);
    assert_eq!(again.len(), 1, "{out2:?}");
    let rest = &again[0].1;
    assert!(rest.ends_with("nine ten."), "{rest}");
    assert_eq!(
        format!("{heard} {rest}"),
        "One two three four five six seven eight nine ten."
    );
    let mut out3 = d.provider(tts_audio(again[0].0, 500));
    out3.extend(d.provider(done(again[0].0)));
    out3.extend(d.advance(1000 * MS));
    let events: Vec<ClientEvent> = client(&out2).into_iter().chain(client(&out3)).collect();
    let resumed = events
        .iter()
        .find_map(|e| match e {
            ClientEvent::ResponseBegin { turn } => Some(*turn),
            _ => None,
        })
        .unwrap();
    assert!(resumed > cut);
    assert!(events.contains(&ClientEvent::ResponseFinished {
        turn: resumed,
        interrupted: false
    }));
    assert_eq!(d.engine.turn_stats().false_interruptions, 1);
    let h = d.engine.history();
    assert_eq!(h.last().unwrap().text(), *rest);
    assert_eq!(h.last().unwrap().delivery, DeliveryStatus::Complete);
    assert_eq!(d.engine.state(), State::Idle);
}

#[test]
fn no_trigger_audio_is_transcribed_and_committed_without_a_reply() {
    let mut d = Driver::new(EngineConfig::default());
    d.input(Input::AudioTrigger(TriggerMode::NoTrigger));
    let mut out = d.speak(&speech());
    out.extend(d.silence(1000));
    let asr = transcribes(&out);
    assert!(!asr.is_empty());
    let mut out = Vec::new();
    for id in &asr {
        out.extend(d.provider(transcript(*id, "my room is 12")));
    }
    out.extend(d.advance(5000 * MS));
    assert_eq!(generates(&out), 0);
    assert!(
        client(&out)
            .iter()
            .any(|e| matches!(e, ClientEvent::UserTranscription { text, .. } if text.contains("my room is 12")))
    );
    assert_eq!(d.engine.state(), State::Idle);
    let h = d.engine.history();
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].role, Role::User);
    // A trigger answers it.
    let out = d.input(Input::TriggerInference {
        instructions: None,
        flush_vad: false,
    });
    let (_, req) = generate(&out);
    assert_eq!(context(&req)[0].0, ChatRole::User);
    assert!(context(&req)[0].1.contains("my room is 12"));
}

#[test]
fn queued_audio_during_a_reply_waits_for_it_without_clearing_playback() {
    let mut d = Driver::new(EngineConfig::default());
    let out = d.input(Input::Text {
        text: "tell me a story".into(),
        mode: TriggerMode::Queue,
    });
    let (id, _) = generate(&out);
    let mut out = d.provider(delta(id, "Once upon a time."));
    out.extend(d.provider(done(id)));
    let s = synth(&out);
    d.provider(tts_audio(s[0].0, 8000));
    d.provider(done(s[0].0));
    assert_eq!(d.engine.state(), State::Speaking);
    // The user talks over the 8 s reply with QUEUE audio (about 5 s of it).
    d.engine.set_audio_trigger(d.now, TriggerMode::Queue);
    let mut out = d.speak(&speech());
    for id in transcribes(&out) {
        out.extend(d.provider(transcript(id, "and then")));
    }
    assert!(!client(&out).contains(&ClientEvent::ClearPlayback));
    assert_eq!(generates(&out), 0);
    assert_eq!(d.engine.state(), State::Speaking);
    // The reply plays out, then the speech is committed and answered.
    let out = d.advance(4000 * MS);
    let events = client(&out);
    let finished = events
        .iter()
        .position(|e| {
            matches!(
                e,
                ClientEvent::ResponseFinished {
                    interrupted: false,
                    ..
                }
            )
        })
        .expect("the reply finished");
    let heard = events
        .iter()
        .position(|e| matches!(e, ClientEvent::UserTranscription { .. }))
        .expect("the speech is committed");
    assert!(finished < heard);
    let (_, req) = generate(&out);
    let ctx = context(&req);
    assert_eq!(ctx.last().unwrap().0, ChatRole::User);
    assert!(ctx.last().unwrap().1.contains("and then"));
    assert_eq!(d.engine.turn_stats().interruptions, 0);
}

/// Feeds 16 kHz `samples` in `block_ms` blocks, each when its last sample would have arrived
/// (real time), then a second of nothing, answering every transcription at once; returns when
/// each `Generate` went out.
fn generate_times(d: &mut Driver, samples: &[i16], block_ms: u32) -> Vec<std::time::Duration> {
    for block in samples.chunks(16 * block_ms as usize) {
        let mut out = d.advance(block_ms * MS);
        d.engine.handle_audio_i16(d.now, block);
        out.extend(d.drain());
        for id in transcribes(&out) {
            d.provider(transcript(id, "book a table"));
        }
    }
    d.advance(1000 * MS);
    d.log
        .iter()
        .filter(|(_, o)| generates(std::slice::from_ref(o)) > 0)
        .map(|(at, _)| *at)
        .collect()
}

#[test]
fn endpointing_counts_from_the_vad_decision_not_from_the_end_of_the_block() {
    let config = EngineConfig::default();
    let delay = config.turn.min_endpoint_delay;
    let stop = config.vad.stop_duration;
    let mut d = Driver::new(config);
    // The fixture's first phrase ends at 1552 ms (the VAD's first silent frame); then silence.
    let samples = &speech()[..16 * 1552];
    let mut all = samples.to_vec();
    all.extend(std::iter::repeat_n(0, 16 * 1000));
    // 60 ms Opus frames, as a Xiaozhi device sends them.
    let times = generate_times(&mut d, &all, 60);
    // The VAD decides at the end of the 16 ms frame that completes the stop duration.
    let frames = u32::try_from(stop.as_millis().div_ceil(16)).unwrap();
    let decided = 1552 * MS + 16 * MS * frames;
    assert_eq!(times, [decided + delay], "{times:?}");
}

#[test]
fn speech_resuming_inside_the_vad_start_window_keeps_one_turn() {
    // The fixture pauses 416 ms after its first phrase: the VAD ends the utterance at
    // 1792 ms and hears speech again from 1968 ms, declaring it at 2064 ms. An endpoint due at
    // 2032 ms falls inside that window: held, it keeps one turn.
    let mut config = EngineConfig::default();
    config.vad.stop_duration = 240 * MS;
    config.turn.min_endpoint_delay = 240 * MS;
    let mut d = Driver::new(config.clone());
    let times = generate_times(&mut d, &speech(), 20);
    assert_eq!(times.len(), 1, "{times:?}");
    assert!(times[0] > 4_300 * MS, "{times:?}");

    // Due before the first speech frame, the endpoint ends the turn in the pause.
    config.turn.min_endpoint_delay = 180 * MS;
    let mut d = Driver::new(config);
    let times = generate_times(&mut d, &speech(), 20);
    assert_eq!(times.first(), Some(&(1972 * MS)), "{times:?}");
}

/// The audio of every `Transcribe` among `out`, in order.
fn utterances(out: &[Output]) -> Vec<Vec<i16>> {
    requests(out)
        .into_iter()
        .filter_map(|r| match r {
            ProviderRequest::Transcribe { audio, .. } => Some(audio),
            _ => None,
        })
        .collect()
}

#[test]
fn a_whole_recording_in_one_call_is_heard_as_if_streamed() {
    // A second of silence, the question, a second of silence: the shape of a WAV file an app
    // sends in one frame. The speech fixture adds an utterance boundary inside the call.
    let silence = vec![0_i16; 16_000];
    let mut recordings = Vec::new();
    for speech in [question(), speech()] {
        let mut audio = silence.clone();
        audio.extend(&speech);
        audio.extend(&silence);
        recordings.push((speech.len(), audio));
    }
    for (speech_len, audio) in recordings {
        let mut streamed = Driver::new(EngineConfig::default());
        let heard = utterances(&streamed.speak(&audio));
        assert!(!heard.is_empty());
        assert!(
            heard.iter().map(Vec::len).sum::<usize>() >= speech_len - 16_000 / 2,
            "streamed, the speech is heard whole"
        );
        for f32_samples in [true, false] {
            let mut d = Driver::new(EngineConfig::default());
            let out = if f32_samples {
                let floats = audio
                    .iter()
                    .map(|&s| voxgate_audio::format::i16_to_f32(s))
                    .collect();
                d.input(Input::Audio(floats))
            } else {
                d.input(Input::AudioI16(audio.clone()))
            };
            // Every utterance ends inside the call, complete, with no more audio or time.
            let got = utterances(&out);
            let lengths = |u: &[Vec<i16>]| u.iter().map(Vec::len).collect::<Vec<_>>();
            assert_eq!(lengths(&got), lengths(&heard), "f32 {f32_samples}");
            assert!(got == heard, "the same audio, f32 {f32_samples}");
            // ... and the turn is answered once transcribed, on the endpointing timer alone.
            let mut out = Vec::new();
            for id in transcribes(&d.log.iter().map(|(_, o)| o.clone()).collect::<Vec<_>>()) {
                out.extend(d.provider(transcript(id, "words")));
            }
            out.extend(d.advance(3000 * MS));
            assert_eq!(generates(&out), 1, "f32 {f32_samples}");
        }
    }
}
