//! Session lifecycle and turn-taking inputs: close, input-rate changes, triggers, push-to-talk,
//! VAD telemetry and false interruptions, on a virtual clock with scripted providers.

mod common;

use common::*;
use serde_json::json;
use voxgate_engine::history::{Content, DeliveryStatus, Role};
use voxgate_engine::provider::ProviderEvent;
use voxgate_engine::{
    ClientEvent, EngineConfig, Input, InputError, ProviderRequest, State, ToolDefinition,
    TriggerMode,
};

fn text(t: &str) -> Input {
    Input::Text {
        text: t.into(),
        mode: TriggerMode::Queue,
    }
}

fn lights_tool() -> Input {
    Input::SetTools(vec![ToolDefinition {
        name: "lights.set".into(),
        description: "Switch the lights".into(),
        parameters: json!({"type":"object","properties":{"on":{"type":"boolean"}}}),
    }])
}

#[test]
fn close_mid_reply_cancels_everything_and_leaves_a_consistent_history() {
    let mut d = Driver::new(EngineConfig::default());
    d.input(lights_tool());
    let (id, _) = generate(&d.input(text("lights on and tell me a story")));
    let s = synth(&d.provider(delta(id, "Switching them on. Once upon")));
    assert_eq!(s.len(), 1);
    d.provider(ProviderEvent::ToolCall {
        id,
        call_id: "c1".into(),
        name: "lights_set".into(),
        arguments: json!({"on": true}),
    });
    d.provider(tts_audio(s[0].0, 300));
    let query = requests(&d.input(Input::ConversationQuery {
        prompt: Some("what is going on?".into()),
        instructions: None,
    }));
    let ProviderRequest::Query { id: q, .. } = query[0] else {
        panic!("{query:?}")
    };
    let turn = d.engine.history()[1].turn.unwrap();

    let out = d.input(Input::Close);
    let reqs = requests(&out);
    for cancelled in [id, s[0].0, q] {
        assert!(
            reqs.contains(&ProviderRequest::Cancel { id: cancelled }),
            "{cancelled} not cancelled: {reqs:?}"
        );
    }
    let events = client(&out);
    let end = events
        .iter()
        .filter(|e| **e == ClientEvent::ResponseEnd { turn })
        .count();
    assert_eq!(end, 1, "{events:?}");
    assert_eq!(
        events.last(),
        Some(&ClientEvent::ResponseFinished {
            turn,
            interrupted: true
        })
    );
    assert!(d.engine.is_closed());
    assert_eq!(d.engine.state(), State::NotConnected);
    assert_eq!(d.engine.poll_timeout(), None);

    // History: the reply is cut off and the pending call has its (cancelled) result.
    let reply = &d.engine.history()[1];
    assert_eq!(reply.role, Role::Assistant);
    assert_eq!(reply.delivery, DeliveryStatus::Interrupted);
    let calls = reply
        .content
        .iter()
        .filter(|c| matches!(c, Content::ToolCall { id, .. } if id == "c1"))
        .count();
    let results = reply
        .content
        .iter()
        .filter(|c| matches!(c, Content::ToolResult { id, .. } if id == "c1"))
        .count();
    assert_eq!((calls, results), (1, 1), "{:?}", reply.content);
    assert!(reply.text().len() < "Switching them on.".len() + 1);

    // Afterwards: client inputs are refused, provider events are stale, audio is ignored.
    assert_eq!(
        d.try_input(Input::ToolResult {
            id: "c1".into(),
            result: "ok".into()
        }),
        Err(InputError::Closed)
    );
    assert_eq!(d.try_input(text("hello?")), Err(InputError::Closed));
    assert_eq!(
        InputError::Closed.category(),
        voxgate_engine::ErrorCategory::Session
    );
    let stale = d.engine.stale_events();
    assert!(d.provider(delta(id, " a time.")).is_empty());
    assert!(d.provider(done(s[0].0)).is_empty());
    assert_eq!(d.engine.stale_events(), stale + 2);
    assert!(d.speak(&speech()[..16_000]).is_empty());
    // Closing twice is harmless.
    assert!(d.input(Input::Close).is_empty());
}

#[test]
fn close_while_the_user_speaks_cancels_the_transcription_and_commits_nothing() {
    let mut d = Driver::new(EngineConfig::default());
    let mut out = d.speak(&speech());
    out.extend(d.silence(600));
    let asr: Vec<_> = requests(&out)
        .into_iter()
        .filter_map(|r| match r {
            ProviderRequest::Transcribe { id, .. } => Some(id),
            _ => None,
        })
        .collect();
    assert!(!asr.is_empty());
    let out = d.input(Input::Close);
    for id in &asr {
        assert!(requests(&out).contains(&ProviderRequest::Cancel { id: *id }));
    }
    // No response had begun: nothing to end.
    assert!(
        !client(&out)
            .iter()
            .any(|e| matches!(e, ClientEvent::ResponseEnd { .. }))
    );
    let late = d.provider(ProviderEvent::Transcript {
        id: asr[0],
        text: "hello".into(),
        language: "en".into(),
    });
    assert!(late.is_empty());
    assert!(d.engine.history().is_empty());
}

#[test]
fn close_before_the_first_token_cancels_the_generation() {
    let mut d = Driver::new(EngineConfig::default());
    let (id, _) = generate(&d.input(text("hi")));
    let out = d.input(Input::Close);
    assert_eq!(requests(&out), [ProviderRequest::Cancel { id }]);
    assert!(client(&out).is_empty(), "{out:?}");
    // The user's turn stays; no assistant entry was ever begun.
    let h = d.engine.history();
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].role, Role::User);
}

/// The speech fixture at `rate` Hz (f32).
#[allow(clippy::unwrap_used)] // tests may unwrap
fn speech_at(rate: u32) -> Vec<f32> {
    let input: Vec<f32> = speech()
        .into_iter()
        .map(voxgate_audio::format::i16_to_f32)
        .collect();
    let mut r = voxgate_audio::resample::Resampler::new(16_000, rate).unwrap();
    let mut out = Vec::new();
    r.process(&input, &mut out);
    r.flush(&mut out);
    out
}

/// Feeds f32 audio in 20 ms frames (`frame` samples) at real time.
fn speak_at(d: &mut Driver, frame: usize, samples: &[f32]) -> Vec<voxgate_engine::Output> {
    let mut out = Vec::new();
    for chunk in samples.chunks(frame) {
        out.extend(d.input(Input::Audio(chunk.to_vec())));
        out.extend(d.advance(20 * MS));
    }
    out
}

fn transcribes(out: &[voxgate_engine::Output]) -> Vec<(voxgate_engine::RequestId, usize)> {
    requests(out)
        .into_iter()
        .filter_map(|r| match r {
            ProviderRequest::Transcribe {
                id,
                audio,
                sample_rate,
            } => {
                assert_eq!(sample_rate, 16_000);
                Some((id, audio.len()))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn reconfigure_switches_the_input_rate_and_inference_settings_keeping_history() {
    let mut d = Driver::new(EngineConfig {
        system_prompt: "Be casual.".into(),
        ..EngineConfig::default()
    });
    let (id, _) = generate(&d.input(text("hi")));
    let mut out = d.provider(delta(id, "Hey there."));
    out.extend(d.provider(done(id)));
    let s = synth(&out);
    d.provider(tts_audio(s[0].0, 100));
    d.provider(done(s[0].0));
    d.advance(500 * MS);
    assert_eq!(d.engine.history().len(), 2);

    let out = d.input(Input::Reconfigure {
        input_rate: Some(48_000),
        system_prompt: Some("Be formal.".into()),
        temperature: Some(0.3),
    });
    assert!(out.is_empty(), "{out:?}");
    // Speech at the new rate goes through the new VAD and resampler: one utterance, at 16 kHz.
    let mut out = speak_at(&mut d, 960, &speech_at(48_000));
    out.extend(speak_at(&mut d, 960, &vec![0.0; 48_000 * 6 / 10]));
    let asr = transcribes(&out);
    assert!(!asr.is_empty());
    // Speech spans 0.8 s..4.36 s of the fixture with pauses the VAD may cut at; with
    // backbuffers (0.5 s each) and hangover the utterances hold 3..6 s at 16 kHz.
    let total: usize = asr.iter().map(|(_, n)| n).sum();
    assert!((16_000 * 3..16_000 * 6).contains(&total), "{asr:?}");
    let mut out = Vec::new();
    for (i, (id, _)) in asr.iter().enumerate() {
        out.extend(d.provider(ProviderEvent::Transcript {
            id: *id,
            text: if i == 0 {
                "good evening".into()
            } else {
                String::new()
            },
            language: "en".into(),
        }));
    }
    out.extend(d.advance(1000 * MS));
    let (_, req) = generate(&out);
    let ProviderRequest::Generate {
        messages,
        temperature,
        ..
    } = req
    else {
        unreachable!()
    };
    assert_eq!(temperature, Some(0.3));
    let texts: Vec<&str> = messages.iter().map(|m| m.content.as_str()).collect();
    assert_eq!(texts, ["Be formal.", "hi", "Hey there.", "good evening"]);
}

#[test]
fn reconfigure_mid_utterance_ends_it_and_transcribes_what_was_said() {
    let mut d = Driver::new(EngineConfig::default());
    // 2.5 s in: the VAD declared the second utterance at ~2.06 s.
    let out = d.speak(&speech()[..40_000]);
    assert!(client(&out).iter().any(|e| matches!(
        e,
        ClientEvent::VadState {
            to: voxgate_audio::vad::VadState::Speech,
            ..
        }
    )));
    assert_eq!(d.engine.state(), State::Listening);
    let out = d.input(Input::Reconfigure {
        input_rate: Some(24_000),
        system_prompt: None,
        temperature: None,
    });
    let events = client(&out);
    assert!(
        matches!(
            events[..],
            [ClientEvent::VadState {
                to: voxgate_audio::vad::VadState::Silence,
                position: 40_000,
                ..
            }]
        ),
        "{events:?}"
    );
    let asr = transcribes(&out);
    assert_eq!(asr.len(), 1);
    // From the onset (~1.98 s) minus the 0.5 s backbuffer up to the switch at 2.5 s.
    assert!((15_700..=16_800).contains(&asr[0].1), "{asr:?}");
    // The first utterance was already sent for transcription before the switch.
    let first = transcribes(&d.log.iter().map(|(_, o)| o.clone()).collect::<Vec<_>>());
    assert_eq!(first.len(), 2);
    let mut out = d.provider(ProviderEvent::Transcript {
        id: first[0].0,
        text: "hello".into(),
        language: "en".into(),
    });
    out.extend(d.provider(ProviderEvent::Transcript {
        id: asr[0].0,
        text: "there".into(),
        language: "en".into(),
    }));
    out.extend(d.advance(1000 * MS));
    generate(&out);
    let h = d.engine.history();
    assert_eq!(
        (h[0].role, h[0].text().as_str()),
        (Role::User, "hello there")
    );
}

#[test]
fn reconfigure_to_an_unusable_rate_changes_nothing() {
    let mut d = Driver::new(EngineConfig::default());
    let err = d
        .try_input(Input::Reconfigure {
            input_rate: Some(0),
            system_prompt: Some("ignored".into()),
            temperature: None,
        })
        .unwrap_err();
    assert!(
        matches!(err, InputError::InputRate { rate: 0, .. }),
        "{err}"
    );
    assert_eq!(err.category(), voxgate_engine::ErrorCategory::Configuration);
    // Still 16 kHz, still the old prompt.
    let mut out = d.speak(&speech());
    out.extend(d.silence(600));
    assert_eq!(transcribes(&out).len(), 3);
    let (_, req) = generate(&d.input(text("hi")));
    let ProviderRequest::Generate { messages, .. } = req else {
        unreachable!()
    };
    assert!(messages.iter().all(|m| m.content != "ignored"));
}
