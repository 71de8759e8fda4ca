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
