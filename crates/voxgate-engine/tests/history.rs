//! History completeness after the realtime `ChatMessage` model: per-sentence TTS audio, user
//! input audio, `exclude_audio` exports and the per-session audio cap.

mod common;

use std::time::Duration;

use common::*;
use voxgate_engine::history::{AudioData, Content, DeliveryStatus};
use voxgate_engine::provider::ProviderEvent;
use voxgate_engine::{ChatMessage, ClientEvent, EngineConfig, Input, TriggerMode};

fn text(t: &str) -> Input {
    Input::Text {
        text: t.into(),
        mode: TriggerMode::Queue,
    }
}

fn samples(event: &ProviderEvent) -> Vec<i16> {
    match event {
        ProviderEvent::Audio { samples, .. } => samples.clone(),
        _ => Vec::new(),
    }
}

/// Runs one spoken reply of `sentences`, each with `ms` of audio; returns each sentence's
/// samples as delivered.
fn spoken_reply(d: &mut Driver, prompt: &str, reply: &str, ms: usize) -> Vec<Vec<i16>> {
    let (id, _) = generate(&d.input(text(prompt)));
    let mut out = d.provider(delta(id, reply));
    out.extend(d.provider(done(id)));
    let mut audio = Vec::new();
    for (sid, _) in synth(&out) {
        let a = tts_audio(sid, ms / 2);
        let b = tts_audio(sid, ms - ms / 2);
        audio.push([samples(&a), samples(&b)].concat());
        d.provider(a);
        d.provider(b);
        d.provider(done(sid));
    }
    d.advance(Duration::from_millis(
        u64::try_from(ms * audio.len()).unwrap_or(0) + 2000,
    ));
    audio
}

fn exported(d: &mut Driver, exclude_audio: bool) -> Vec<ChatMessage> {
    let out = d.input(Input::ExportHistory {
        await_pending: false,
        exclude_audio,
    });
    client(&out)
        .into_iter()
        .find_map(|e| match e {
            ClientEvent::History { messages: h, .. } => Some(h),
            _ => None,
        })
        .unwrap_or_default()
}

fn tts(text: &str, samples: Vec<i16>) -> Content {
    Content::Text {
        text: text.into(),
        tts_audio: Some(AudioData {
            samples,
            sample_rate: 24_000,
            transcription: text.into(),
        }),
    }
}

#[test]
fn spoken_replies_keep_each_sentence_with_its_audio_unless_excluded() {
    let mut d = Driver::new(EngineConfig::default());
    let audio = spoken_reply(&mut d, "hello", "Hi there! The answer is four.", 400);
    let reply = &d.engine.history()[1];
    assert_eq!(
        reply.content,
        [
            tts("Hi there!", audio[0].clone()),
            tts("The answer is four.", audio[1].clone())
        ]
    );
    assert_eq!(reply.text(), "Hi there! The answer is four.");
    assert_eq!(exported(&mut d, false), d.engine.history());
    let lean = exported(&mut d, true);
    assert_eq!(
        lean[1].content,
        [
            Content::Text {
                text: "Hi there!".into(),
                tts_audio: None
            },
            Content::Text {
                text: "The answer is four.".into(),
                tts_audio: None
            }
        ]
    );
}

#[test]
fn user_audio_turns_keep_their_audio_with_the_transcription() {
    let mut d = Driver::new(EngineConfig::default());
    let mut out = d.speak(&speech());
    out.extend(d.silence(600));
    let asr: Vec<(voxgate_engine::RequestId, usize)> = requests(&out)
        .into_iter()
        .filter_map(|r| match r {
            voxgate_engine::ProviderRequest::Transcribe { id, audio, .. } => {
                Some((id, audio.len()))
            }
            _ => None,
        })
        .collect();
    for (i, (id, _)) in asr.iter().enumerate() {
        d.provider(ProviderEvent::Transcript {
            id: *id,
            text: ["turn", "the", "lights"][i % 3].into(),
            language: "en".into(),
        });
    }
    d.advance(1000 * MS);
    let Content::InputAudio(a) = &d.engine.history()[0].content[0] else {
        unreachable!("{:?}", d.engine.history()[0])
    };
    assert_eq!(a.transcription, "turn the lights");
    assert_eq!(a.sample_rate, 16_000);
    assert_eq!(a.samples.len(), asr.iter().map(|(_, n)| n).sum::<usize>());
    let lean = exported(&mut d, true);
    assert_eq!(
        lean[0].content,
        [Content::InputAudio(AudioData {
            samples: Vec::new(),
            sample_rate: 16_000,
            transcription: "turn the lights".into()
        })]
    );
}

#[test]
fn interrupted_reply_keeps_the_heard_sentences_and_their_audio() {
    let mut config = EngineConfig::default();
    config.turn.playback_reports = true;
    let mut d = Driver::new(config);
    let (id, _) = generate(&d.input(text("a story")));
    let s = synth(&d.provider(delta(
        id,
        "Once upon a time. There lived a very old king in a castle. He",
    )));
    assert_eq!(s.len(), 2);
    let (a, b) = (tts_audio(s[0].0, 1000), tts_audio(s[1].0, 1000));
    let (sa, sb) = (samples(&a), samples(&b));
    for e in [a, done(s[0].0), b, done(s[1].0)] {
        d.provider(e);
    }
    let turn = d.engine.history()[1].turn.unwrap();
    d.input(Input::PlaybackReport {
        turn,
        bytes_played: 48_000 + 19_200,
    });
    d.input(Input::Abort);
    let reply = &d.engine.history()[1];
    assert_eq!(reply.delivery, DeliveryStatus::Interrupted);
    assert_eq!(
        reply.content,
        [tts("Once upon a time.", sa), tts("There lived a", sb)]
    );
}

#[test]
fn the_audio_cap_drops_the_oldest_audio_and_keeps_the_text() {
    let mut d = Driver::new(EngineConfig {
        max_history_audio: Duration::from_secs(1),
        ..EngineConfig::default()
    });
    spoken_reply(&mut d, "one", "First reply.", 600);
    assert!(matches!(
        &d.engine.history()[1].content[..],
        [Content::Text {
            tts_audio: Some(_),
            ..
        }]
    ));
    let second = spoken_reply(&mut d, "two", "Second reply.", 600);
    let h = d.engine.history();
    // 1.2 s kept would exceed the cap: the first reply's audio goes, its text stays.
    assert_eq!(
        h[1].content,
        [Content::Text {
            text: "First reply.".into(),
            tts_audio: None
        }]
    );
    assert_eq!(h[3].content, [tts("Second reply.", second[0].clone())]);
    let kept: usize = h
        .iter()
        .flat_map(|m| &m.content)
        .map(|c| match c {
            Content::Text {
                tts_audio: Some(a), ..
            } => a.samples.len(),
            Content::InputAudio(a) => a.samples.len(),
            _ => 0,
        })
        .sum();
    assert!(kept <= 24_000, "{kept} samples kept");
}
