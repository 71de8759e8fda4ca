//! The turn events the engine reports for the host's metrics, traces and timelines
//! (`Engine::take_telemetry`): what each kind of turn yields, the barge-in time, tool call
//! round trips by runner and outcome, and the queue's bound.

#![allow(clippy::unwrap_used, clippy::panic)] // test helpers may unwrap and panic

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use voxgate_engine::provider::ProviderEvent;
use voxgate_engine::{
    Action, ActionConfig, EngineConfig, Input, MAX_TELEMETRY_EVENTS, Output, ProviderRequest,
    RequestId, ServerToolDefinition, State, ToolDefinition, ToolKind, ToolOutcome, TriggerMode,
    TurnEvent, TurnId,
};

fn text_only() -> EngineConfig {
    EngineConfig {
        output_audio: None,
        ..EngineConfig::default()
    }
}

fn text(t: &str, mode: TriggerMode) -> Input {
    Input::Text {
        text: t.into(),
        mode,
    }
}

fn events(d: &mut Driver) -> Vec<TurnEvent> {
    d.engine.take_telemetry().collect()
}

fn states(events: &[TurnEvent]) -> Vec<State> {
    events
        .iter()
        .filter_map(|e| match e {
            TurnEvent::State { to, .. } => Some(*to),
            _ => None,
        })
        .collect()
}

fn position(events: &[TurnEvent], f: impl Fn(&TurnEvent) -> bool) -> usize {
    events
        .iter()
        .position(f)
        .unwrap_or_else(|| panic!("not found in {events:#?}"))
}

fn tool_calls(events: &[TurnEvent]) -> Vec<(TurnId, ToolKind, String, Duration, ToolOutcome)> {
    events
        .iter()
        .filter_map(|e| match e {
            TurnEvent::ToolCall {
                turn,
                kind,
                name,
                elapsed,
                outcome,
                ..
            } => Some((*turn, *kind, name.clone(), *elapsed, *outcome)),
            _ => None,
        })
        .collect()
}

fn transcribes(d: &Driver) -> Vec<RequestId> {
    d.log
        .iter()
        .filter_map(|(_, o)| match o {
            Output::Provider(ProviderRequest::Transcribe { id, .. }) => Some(*id),
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

/// A spoken reply of `ms` of audio to a typed question; returns its turn.
fn speaking(d: &mut Driver, ms: usize) -> TurnId {
    let (id, _) = generate(&d.input(text("count", TriggerMode::Queue)));
    let out = d.provider(delta(
        id,
        "One two three four five six seven eight nine ten.",
    ));
    let mut out = out;
    out.extend(d.provider(done(id)));
    let s = synth(&out);
    d.provider(tts_audio(s[0].0, ms));
    d.provider(done(s[0].0));
    assert_eq!(d.engine.state(), State::Speaking);
    d.engine.history()[1].turn.unwrap()
}

#[test]
fn a_spoken_turn_reports_its_states_user_turn_latency_and_end() {
    let mut d = Driver::new(EngineConfig::default());
    d.speak(&speech());
    d.silence(600);
    let mut out = Vec::new();
    for id in transcribes(&d) {
        out.extend(d.provider(transcript(id, "hello")));
    }
    out.extend(d.advance(500 * MS));
    let (id, _) = generate(&out);
    let mut out = d.provider(delta(id, "Hi there."));
    out.extend(d.provider(done(id)));
    d.advance(200 * MS);
    let s = synth(&out);
    d.provider(tts_audio(s[0].0, 500));
    d.provider(done(s[0].0));
    d.advance(2000 * MS);
    assert_eq!(d.engine.state(), State::Idle);

    let ev = events(&mut d);
    assert_eq!(
        states(&ev),
        [
            State::Listening,
            State::Processing,
            State::Speaking,
            State::Idle
        ]
    );
    let user = position(&ev, |e| {
        matches!(e, TurnEvent::UserTurn { speech: true, .. })
    });
    let latency = position(&ev, |e| matches!(e, TurnEvent::Latency(_)));
    let ended = position(&ev, |e| {
        matches!(
            e,
            TurnEvent::ResponseEnded {
                interrupted: false,
                ..
            }
        )
    });
    assert!(user < latency && latency < ended, "{ev:#?}");
    let TurnEvent::Latency(l) = &ev[latency] else {
        unreachable!()
    };
    let endpointing = l.endpointing.expect("a spoken turn is endpointed");
    // The turn waited for its transcripts, which came after the 600 ms of silence.
    assert!(endpointing > Duration::ZERO, "{l:?}");
    let first_audio = l.to_first_audio.expect("the reply has audio");
    // The reply's audio came 200 ms after its text: first audio is later than the first token.
    assert!(
        first_audio >= l.to_response_start.unwrap() + 200 * MS,
        "{l:?}"
    );
    let TurnEvent::ResponseEnded { turn, .. } = &ev[ended] else {
        unreachable!()
    };
    assert_eq!(*turn, l.turn);
    assert!(
        !ev.iter()
            .any(|e| matches!(e, TurnEvent::Interrupted { .. }))
    );
    // Drained: nothing until something happens.
    assert_eq!(d.engine.take_telemetry().count(), 0);
    assert_eq!(d.engine.telemetry_dropped(), 0);
}

#[test]
fn a_spoken_turn_counts_from_the_last_voiced_audio_not_the_vads_decision() {
    let config = EngineConfig::default();
    let mut d = Driver::new(config.clone());
    // Each utterance the VAD ends (the fixture has pauses) is transcribed at once, until the
    // first turn is decided.
    let mut out = Vec::new();
    let mut answered = 0;
    let mut asked_at = None;
    let audio: Vec<i16> = speech().into_iter().chain(vec![0; 16 * 1000]).collect();
    for frame in audio.chunks(320) {
        out.extend(d.speak(frame));
        let asked: Vec<(Duration, RequestId)> = d
            .log
            .iter()
            .filter_map(|(at, o)| match o {
                Output::Provider(ProviderRequest::Transcribe { id, .. }) => Some((*at, *id)),
                _ => None,
            })
            .collect();
        for (at, id) in asked.into_iter().skip(answered) {
            answered += 1;
            asked_at = Some(d.origin + at);
            out.extend(d.provider(transcript(id, "hello")));
        }
        if requests(&out)
            .iter()
            .any(|r| matches!(r, ProviderRequest::Generate { .. }))
        {
            break;
        }
    }
    let asked_at = asked_at.expect("the VAD ended the speech");
    let (id, _) = generate(&out);
    let mut out = d.provider(delta(id, "Hi there."));
    out.extend(d.provider(done(id)));
    let s = synth(&out);
    d.provider(tts_audio(s[0].0, 300));
    let ev = events(&mut d);
    let latency = position(&ev, |e| matches!(e, TurnEvent::Latency(_)));
    let TurnEvent::Latency(l) = &ev[latency] else {
        unreachable!()
    };
    // The VAD heard `stop_duration` of silence after the last voiced audio before it decided
    // (and the recognition went out); the turn then waited `min_endpoint_delay`.
    assert!(asked_at - l.origin >= config.vad.stop_duration, "{l:?}");
    assert!(
        asked_at - l.origin < config.vad.stop_duration + 100 * MS,
        "{l:?}"
    );
    let endpointing = l.endpointing.unwrap();
    let least = config.vad.stop_duration + config.turn.min_endpoint_delay;
    assert!(endpointing >= least, "{endpointing:?} < {least:?}");
    assert!(endpointing < least + 200 * MS, "{endpointing:?}");
    assert!(l.to_first_audio.unwrap() >= endpointing, "{l:?}");
}

#[test]
fn a_barge_in_reports_the_time_from_speech_onset_to_cleared_playback() {
    let mut d = Driver::new(EngineConfig::default());
    // The client streams audio from the start of the session, as the voice doors do.
    d.silence(100);
    let cut = speaking(&mut d, 2000);
    events(&mut d);
    // Speech starts 0.8 s into the fixture.
    d.speak(&speech()[..16_000 * 2]);
    let ev = events(&mut d);
    let interrupted = position(&ev, |e| matches!(e, TurnEvent::Interrupted { .. }));
    let TurnEvent::Interrupted { turn, barge_in, .. } = &ev[interrupted] else {
        unreachable!()
    };
    assert_eq!(*turn, cut);
    let barge_in = barge_in.expect("speech cleared playback");
    // The VAD declares speech after its start hysteresis (96 ms of voiced audio) and the turn
    // machine lets it interrupt after 300 ms more: the barge-in took at least both.
    let config = EngineConfig::default();
    let least = config.vad.start_duration + config.turn.min_interruption_speech;
    assert!(barge_in >= least, "{barge_in:?} < {least:?}");
    assert!(barge_in < least + 200 * MS, "{barge_in:?}");
    let ended = position(
        &ev,
        |e| matches!(e, TurnEvent::ResponseEnded { turn, interrupted: true, .. } if *turn == cut),
    );
    assert!(interrupted < ended);
    // The user holds the floor now.
    assert_eq!(states(&ev).last(), Some(&State::Listening));
}

#[test]
fn a_barge_in_counts_from_its_own_speech_not_from_speech_an_earlier_interruption_took() {
    let mut d = Driver::new(EngineConfig::default());
    d.silence(100);
    let cut = speaking(&mut d, 3000);
    // Speech starts over the reply (0.8 s into the fixture) but has not lasted long enough to
    // interrupt when typed text does.
    d.speak(&speech()[..16_000]);
    let (id, _) = generate(&d.input(text("stop", TriggerMode::Immediate)));
    d.silence(1000);
    let ev = events(&mut d);
    assert!(ev.iter().any(|e| matches!(
        e,
        TurnEvent::Interrupted { turn, barge_in: None, .. } if *turn == cut
    )));
    // The answer to the text is spoken; new speech barges into it.
    let mut out = d.provider(delta(id, "Stopping now, as you asked me to."));
    out.extend(d.provider(done(id)));
    let s = synth(&out);
    d.provider(tts_audio(s[0].0, 3000));
    d.provider(done(s[0].0));
    assert_eq!(d.engine.state(), State::Speaking);
    d.speak(&speech()[..16_000 * 2]);
    let ev = events(&mut d);
    let barge_in = ev
        .iter()
        .find_map(|e| match e {
            TurnEvent::Interrupted { barge_in, .. } => *barge_in,
            _ => None,
        })
        .expect("speech cleared playback");
    let config = EngineConfig::default();
    let least = config.vad.start_duration + config.turn.min_interruption_speech;
    assert!(
        barge_in >= least && barge_in < least + 200 * MS,
        "{barge_in:?}"
    );
}

#[test]
fn an_abort_interrupts_without_a_barge_in_time() {
    let mut d = Driver::new(EngineConfig::default());
    let cut = speaking(&mut d, 2000);
    events(&mut d);
    d.input(Input::Abort);
    let ev = events(&mut d);
    assert!(ev.iter().any(|e| matches!(
        e,
        TurnEvent::Interrupted { turn, barge_in: None, .. } if *turn == cut
    )));
    assert!(ev.iter().any(|e| matches!(
        e,
        TurnEvent::ResponseEnded { turn, interrupted: true, .. } if *turn == cut
    )));
}

#[test]
fn a_reply_cut_before_it_began_is_interrupted_without_an_end() {
    let mut d = Driver::new(text_only());
    d.input(text("tell me a story", TriggerMode::Queue));
    assert_eq!(d.engine.state(), State::Processing);
    events(&mut d);
    d.input(text("no, a poem", TriggerMode::Immediate));
    let ev = events(&mut d);
    let interrupted: Vec<_> = ev
        .iter()
        .filter(|e| matches!(e, TurnEvent::Interrupted { barge_in: None, .. }))
        .collect();
    assert_eq!(interrupted.len(), 1, "{ev:#?}");
    assert!(
        !ev.iter()
            .any(|e| matches!(e, TurnEvent::ResponseEnded { .. }))
    );
}

#[test]
fn a_false_interruption_names_the_reply_it_cut() {
    let mut d = Driver::new(EngineConfig::default());
    let cut = speaking(&mut d, 2000);
    events(&mut d);
    // A cough over the reply: long enough to count as a barge-in, then nothing recognised.
    d.speak(&speech()[..16_000 * 2]);
    d.silence(300);
    let mut out = Vec::new();
    for id in transcribes(&d) {
        out.extend(d.provider(transcript(id, "")));
    }
    out.extend(d.advance(3000 * MS));
    let again = synth(&out);
    assert_eq!(again.len(), 1);
    d.provider(tts_audio(again[0].0, 500));
    d.provider(done(again[0].0));
    d.advance(1000 * MS);
    let ev = events(&mut d);
    let resumed = position(
        &ev,
        |e| matches!(e, TurnEvent::FalseInterruption { turn, .. } if *turn == cut),
    );
    let interrupted = position(
        &ev,
        |e| matches!(e, TurnEvent::Interrupted { turn, .. } if *turn == cut),
    );
    assert!(interrupted < resumed);
    // The resumed rest is a response of its own that ends normally.
    let ended = position(
        &ev,
        |e| matches!(e, TurnEvent::ResponseEnded { turn, interrupted: false, .. } if *turn > cut),
    );
    assert!(resumed < ended);
    assert_eq!(d.engine.turn_stats().false_interruptions, 1);
    assert!(!ev.iter().any(|e| matches!(e, TurnEvent::UserTurn { .. })));
}

fn weather() -> ToolDefinition {
    ToolDefinition {
        name: "weather.get".into(),
        description: "Weather for a city".into(),
        parameters: json!({"type":"object","properties":{"city":{"type":"string"}}}),
    }
}

fn call(id: RequestId, call_id: &str, name: &str) -> ProviderEvent {
    ProviderEvent::ToolCall {
        id,
        call_id: call_id.into(),
        name: name.into(),
        arguments: json!({"city": "Paris"}),
    }
}

#[test]
fn a_client_tool_call_reports_its_round_trip() {
    let mut d = Driver::new(text_only());
    d.input(Input::SetTools(vec![weather()]));
    let (id, _) = generate(&d.input(text("Weather?", TriggerMode::Queue)));
    d.provider(call(id, "c1", "weather_get"));
    d.provider(done(id));
    let turn = d.engine.history()[1].turn.unwrap();
    d.advance(250 * MS);
    d.input(Input::ToolResult {
        id: "c1".into(),
        result: "sunny".into(),
    });
    assert_eq!(
        tool_calls(&events(&mut d)),
        [(
            turn,
            ToolKind::Client,
            "weather.get".into(),
            250 * MS,
            ToolOutcome::Ok
        )]
    );
}

#[test]
fn a_server_tool_call_reports_its_round_trip_and_failure() {
    let mut d = Driver::new(text_only());
    d.input(Input::ServerTools(vec![ServerToolDefinition {
        source: "hub".into(),
        name: "weather.get".into(),
        description: "Weather".into(),
        parameters: weather().parameters,
    }]));
    let (id, _) = generate(&d.input(text("Weather?", TriggerMode::Queue)));
    let mut out = d.provider(call(id, "c1", "weather_get"));
    out.extend(d.provider(call(id, "c2", "weather_get")));
    out.extend(d.provider(done(id)));
    let turn = d.engine.history()[1].turn.unwrap();
    let rids: Vec<RequestId> = requests(&out)
        .into_iter()
        .filter_map(|r| match r {
            ProviderRequest::CallTool { id, .. } => Some(id),
            _ => None,
        })
        .collect();
    assert_eq!(rids.len(), 2);
    d.advance(120 * MS);
    d.provider(ProviderEvent::ToolOutput {
        id: rids[0],
        text: "sunny".into(),
        ok: true,
    });
    d.advance(30 * MS);
    d.provider(ProviderEvent::Failed {
        id: rids[1],
        message: "the hub is down".into(),
    });
    let name = || "weather.get".to_owned();
    assert_eq!(
        tool_calls(&events(&mut d)),
        [
            (turn, ToolKind::Mcp, name(), 120 * MS, ToolOutcome::Ok),
            (turn, ToolKind::Mcp, name(), 150 * MS, ToolOutcome::Error),
        ]
    );
}

#[test]
fn a_tool_call_pending_at_close_is_cancelled() {
    let mut d = Driver::new(text_only());
    d.input(Input::SetTools(vec![weather()]));
    let (id, _) = generate(&d.input(text("Weather?", TriggerMode::Queue)));
    d.provider(call(id, "c1", "weather_get"));
    d.provider(done(id));
    let turn = d.engine.history()[1].turn.unwrap();
    d.advance(40 * MS);
    events(&mut d);
    d.input(Input::Close);
    let ev = events(&mut d);
    assert_eq!(
        tool_calls(&ev),
        [(
            turn,
            ToolKind::Client,
            "weather.get".into(),
            40 * MS,
            ToolOutcome::Cancelled
        )]
    );
    // The end of the session cuts the reply, but nobody interrupted it.
    assert!(ev.iter().any(|e| matches!(
        e,
        TurnEvent::ResponseEnded { turn: t, interrupted: true, .. } if *t == turn
    )));
    assert!(
        !ev.iter()
            .any(|e| matches!(e, TurnEvent::Interrupted { .. }))
    );
    assert_eq!(states(&ev), [State::NotConnected]);
}

fn actions_config() -> EngineConfig {
    EngineConfig {
        output_audio: None,
        actions: ActionConfig {
            timeout: Duration::from_secs(5),
            ..ActionConfig::default()
        },
        ..EngineConfig::default()
    }
}

fn open_settings() -> Action {
    Action {
        id: "open_settings".into(),
        description: "Open the settings page".into(),
        parameters: json!({"type": "object", "properties": {}}),
    }
}

fn action_call(id: RequestId) -> ProviderEvent {
    ProviderEvent::ToolCall {
        id,
        call_id: "a1".into(),
        name: "open_settings".into(),
        arguments: json!({}),
    }
}

#[test]
fn an_action_cut_off_with_its_reply_is_cancelled() {
    let mut d = Driver::new(actions_config());
    d.input(Input::SetActions(vec![open_settings()]));
    let (id, _) = generate(&d.input(text("Open settings", TriggerMode::Queue)));
    d.provider(action_call(id));
    let turn = d.engine.history()[1].turn.unwrap();
    d.advance(70 * MS);
    d.input(text("stop", TriggerMode::Immediate));
    let ev = events(&mut d);
    assert_eq!(
        tool_calls(&ev),
        [(
            turn,
            ToolKind::Action,
            "open_settings".into(),
            70 * MS,
            ToolOutcome::Cancelled
        )]
    );
    assert!(ev.iter().any(|e| matches!(
        e,
        TurnEvent::Interrupted { turn: t, .. } if *t == turn
    )));
}

#[test]
fn an_action_without_an_answer_times_out() {
    let mut d = Driver::new(actions_config());
    d.input(Input::SetActions(vec![open_settings()]));
    let (id, _) = generate(&d.input(text("Open settings", TriggerMode::Queue)));
    d.provider(action_call(id));
    d.provider(done(id));
    let turn = d.engine.history()[1].turn.unwrap();
    d.advance(Duration::from_secs(6));
    assert_eq!(
        tool_calls(&events(&mut d)),
        [(
            turn,
            ToolKind::Action,
            "open_settings".into(),
            Duration::from_secs(5),
            ToolOutcome::Timeout
        )]
    );
}

#[test]
fn a_refused_call_has_no_round_trip() {
    let mut d = Driver::new(text_only());
    let (id, _) = generate(&d.input(text("Weather?", TriggerMode::Queue)));
    d.provider(call(id, "c1", "no_such_tool"));
    d.provider(done(id));
    assert!(tool_calls(&events(&mut d)).is_empty());
}

#[test]
fn the_queue_is_bounded_when_nobody_drains_it() {
    let mut d = Driver::new(text_only());
    let turns = 100;
    for n in 0..turns {
        let (id, _) = generate(&d.input(text(&format!("question {n}"), TriggerMode::Queue)));
        d.provider(delta(id, "Answer."));
        d.provider(done(id));
    }
    assert_eq!(d.engine.state(), State::Idle);
    // Each turn: its user turn, Processing, Speaking, Latency, the end and Idle.
    let per_turn = 6;
    let kept: Vec<TurnEvent> = events(&mut d);
    assert_eq!(kept.len(), MAX_TELEMETRY_EVENTS);
    assert_eq!(
        d.engine.telemetry_dropped(),
        (turns * per_turn - MAX_TELEMETRY_EVENTS) as u64
    );
    // The newest are kept.
    assert!(matches!(
        kept.last(),
        Some(TurnEvent::State {
            to: State::Idle,
            ..
        })
    ));
    // Behaviour never depended on draining: every turn was answered.
    assert_eq!(d.engine.history().last().unwrap().text(), "Answer.");
}

fn device_messages(out: &[Output]) -> Vec<serde_json::Value> {
    client(out)
        .into_iter()
        .filter_map(|e| match e {
            voxgate_engine::ClientEvent::DeviceMcp(m) => Some(m.to_value()),
            _ => None,
        })
        .collect()
}

#[test]
fn device_tool_calls_report_their_round_trip_and_timeout() {
    let mut d = Driver::new(text_only());
    let sent = device_messages(&d.input(Input::DeviceMcpStart));
    let sent = device_messages(&d.input(Input::DeviceMcp(json!({
        "jsonrpc":"2.0","id":sent[0]["id"],
        "result":{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},
                  "serverInfo":{"name":"xiaozhi","version":"2.0"}}
    }))));
    let list = sent.iter().find(|m| m["method"] == "tools/list").unwrap();
    d.input(Input::DeviceMcp(json!({"jsonrpc":"2.0","id":list["id"],"result":{"tools":[
        {"name":"self.light.on","description":"Light on","inputSchema":{"type":"object","properties":{}}}
    ]}})));
    let (id, _) = generate(&d.input(text("Light on", TriggerMode::Queue)));
    let mut out = d.provider(ProviderEvent::ToolCall {
        id,
        call_id: "d1".into(),
        name: "self_light_on".into(),
        arguments: json!({}),
    });
    out.extend(d.provider(ProviderEvent::ToolCall {
        id,
        call_id: "d2".into(),
        name: "self_light_on".into(),
        arguments: json!({}),
    }));
    out.extend(d.provider(done(id)));
    let turn = d.engine.history()[1].turn.unwrap();
    let calls = device_messages(&out);
    assert_eq!(calls.len(), 2, "{calls:?}");
    d.advance(80 * MS);
    d.input(Input::DeviceMcp(
        json!({"jsonrpc":"2.0","id":calls[0]["id"],
        "result":{"content":[{"type":"text","text":"on"}],"isError":false}}),
    ));
    // The second is never answered: the MCP client's deadline ends it.
    d.advance(Duration::from_secs(60));
    let calls = tool_calls(&events(&mut d));
    assert_eq!(
        calls[0],
        (
            turn,
            ToolKind::Device,
            "self.light.on".into(),
            80 * MS,
            ToolOutcome::Ok
        )
    );
    assert_eq!(calls.len(), 2, "{calls:?}");
    // The device MCP client's default deadline is 30 s.
    assert_eq!(
        (calls[1].1, calls[1].3, calls[1].4),
        (
            ToolKind::Device,
            Duration::from_secs(30),
            ToolOutcome::Timeout
        )
    );
}
