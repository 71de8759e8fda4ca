//! The VIP translator on a virtual clock: data channel messages and media events in, VIP
//! messages, provider requests and track commands out.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use voxgate_engine::{EngineConfig, ProviderEvent, ProviderRequest, RequestId};

use super::VipDoor;
use crate::door::{ClientFrame, Inbound, MediaCommand, Out, ServerFrame, Translator};
use crate::metrics::Metrics;
use crate::webrtc::MediaEvent;

struct Harness {
    door: VipDoor,
    out: Out,
    now: Instant,
}

impl Harness {
    fn connected() -> Self {
        let now = Instant::now();
        let door = VipDoor::new(
            EngineConfig::default(),
            "s1".into(),
            Arc::new(Metrics::new()),
            now,
        )
        .unwrap();
        let mut h = Self {
            door,
            out: Out::new(),
            now,
        };
        assert!(!h.door.initialized());
        h.door.on_media(h.now, MediaEvent::DataOpen, &mut h.out);
        h
    }

    #[allow(
        clippy::needless_pass_by_value,
        reason = "tests read better with json! inline"
    )]
    fn client(&mut self, msg: Value) {
        let Inbound::Keep(m) = VipDoor::decode(ClientFrame::Text(msg.to_string().into()), 1 << 16)
        else {
            panic!("VIP messages are never droppable");
        };
        self.door.on_client(self.now, m, &mut self.out);
    }

    fn provider(&mut self, event: ProviderEvent) {
        self.now += Duration::from_millis(10);
        self.door.on_provider(self.now, event, &mut self.out);
    }

    fn messages(&mut self) -> Vec<Value> {
        self.out
            .take_frames()
            .into_iter()
            .map(|f| match f {
                ServerFrame::Text(t) => serde_json::from_str(&t).unwrap(),
                ServerFrame::Binary(_) => panic!("VIP sends text only"),
            })
            .collect()
    }

    fn synthesize_id(&mut self) -> RequestId {
        self.out
            .take_requests()
            .into_iter()
            .find_map(|r| match r {
                ProviderRequest::Synthesize { id, .. } => Some(id),
                _ => None,
            })
            .expect("the sentence is synthesized")
    }

    fn generate_id(&mut self) -> RequestId {
        self.out
            .take_requests()
            .into_iter()
            .find_map(|r| match r {
                ProviderRequest::Generate { id, .. } => Some(id),
                _ => None,
            })
            .expect("a generation was asked for")
    }
}

fn kinds(messages: &[Value]) -> Vec<String> {
    messages
        .iter()
        .map(|m| match m["type"].as_str().unwrap() {
            "state" => format!("state:{}", m["state"].as_str().unwrap()),
            t => t.to_owned(),
        })
        .collect()
}

#[test]
fn the_open_data_channel_gets_session_connected_and_initializes() {
    let mut h = Harness::connected();
    assert!(h.door.initialized());
    let m = h.messages();
    assert_eq!(kinds(&m), ["session.connected"]);
    assert_eq!(m[0]["session_id"], "s1");
    assert_eq!(m[0]["protocol"], "vip/1");
    assert_eq!(m[0]["audio"]["sample_rate"], 48_000);
}

#[test]
fn bad_and_unknown_messages_are_refused_and_the_session_goes_on() {
    let mut h = Harness::connected();
    h.messages();
    let Inbound::Keep(m) = VipDoor::decode(ClientFrame::Text("{not json".into()), 1 << 16) else {
        panic!()
    };
    h.door.on_client(h.now, m, &mut h.out);
    h.client(json!({"type": "video.frame"}));
    h.client(json!({"type": "action.result", "invocation_id": "99", "status": "success"}));
    let m = h.messages();
    assert_eq!(kinds(&m), ["error", "error", "error"]);
    assert_eq!(m[1]["code"], "unknown_type");
    assert!(h.out.closing().is_none());
}

#[test]
fn a_typed_turn_goes_processing_then_speaking_with_text_and_audio_on_the_track() {
    let mut h = Harness::connected();
    h.messages();
    h.client(json!({"type": "input.text", "text": "hello"}));
    let m = h.messages();
    assert_eq!(kinds(&m), ["state:processing"]);
    assert_eq!(m[0]["turn"], 1);
    assert_eq!(m[0]["previous"], "idle");
    let id = h.generate_id();
    h.provider(ProviderEvent::TextDelta {
        id,
        delta: "Hi there.".into(),
    });
    h.provider(ProviderEvent::Done { id });
    let tts = h.synthesize_id();
    h.provider(ProviderEvent::Audio {
        id: tts,
        samples: vec![1000; 2400],
        sample_rate: 24_000,
    });
    let m = h.messages();
    assert_eq!(kinds(&m), ["state:speaking", "reply.text"], "{m:?}");
    assert_eq!(m[1]["text"], "Hi there.");
    assert_eq!(m[1]["turn"], 1);
    // A typed turn has no end of speech: no latency figure.
    let media = h.out.take_media();
    assert!(
        matches!(&media[..], [MediaCommand::Play { samples, rate: 24_000 }] if samples.len() == 2400),
        "{media:?}"
    );
}

#[test]
fn an_action_is_invoked_after_its_state_and_its_result_continues_the_turn() {
    let mut h = Harness::connected();
    h.client(json!({"type": "actions.declare", "actions": {"set_theme": {
        "description": "Switch the page theme",
        "parameters": {"type": "object", "properties": {"theme": {"type": "string",
            "enum": ["light", "dark"]}}, "required": ["theme"]}}}}));
    h.client(json!({"type": "state.narrate", "text": "Theme: light"}));
    h.client(json!({"type": "input.text", "text": "dark mode please"}));
    h.messages();
    let id = h.generate_id();
    h.provider(ProviderEvent::ToolCall {
        id,
        call_id: "c1".into(),
        name: "set_theme".into(),
        arguments: json!({"theme": "dark"}),
    });
    h.provider(ProviderEvent::Done { id });
    let m = h.messages();
    let k = kinds(&m);
    let action = k
        .iter()
        .position(|k| k == "state:action")
        .expect("action state");
    let invoke = k.iter().position(|k| k == "action.invoke").expect("invoke");
    assert!(action < invoke, "{k:?}");
    assert_eq!(m[invoke]["action_id"], "set_theme");
    assert_eq!(m[invoke]["parameters"], json!({"theme": "dark"}));
    let invocation = m[invoke]["invocation_id"].as_str().unwrap().to_owned();
    h.client(json!({"type": "action.result", "invocation_id": invocation,
        "status": "success", "data": {"theme": "dark"}}));
    // The response that called the action is over; the turn goes on with the result.
    let m = h.messages();
    assert_eq!(kinds(&m), ["reply.done", "state:processing"], "{m:?}");
    assert_eq!(m[1]["turn"], 1);
    // The follow-up reply is generated with the result.
    h.generate_id();
}

#[test]
fn a_refused_result_settles_its_invocation_as_a_failure() {
    let mut h = Harness::connected();
    h.client(json!({"type": "actions.declare", "actions": {"open_settings": {}}}));
    h.client(json!({"type": "input.text", "text": "settings"}));
    let m = h.messages();
    assert_eq!(
        kinds(&m),
        ["session.connected", "state:processing"],
        "{m:?}"
    );
    let id = h.generate_id();
    h.provider(ProviderEvent::ToolCall {
        id,
        call_id: "c1".into(),
        name: "open_settings".into(),
        arguments: json!({}),
    });
    h.provider(ProviderEvent::Done { id });
    let m = h.messages();
    let invoke = m.iter().find(|m| m["type"] == "action.invoke").unwrap();
    let invocation = invoke["invocation_id"].as_str().unwrap().to_owned();
    // `status: "error"` without its payload is refused...
    h.client(json!({"type": "action.result", "invocation_id": invocation, "status": "error"}));
    let m = h.messages();
    assert_eq!(m[0]["type"], "error", "{m:?}");
    assert_eq!(m[0]["code"], "invalid_message");
    // ...and the turn goes on at once with the failure, not at the action timeout: the
    // registry's fallback sentence is spoken.
    assert!(kinds(&m).contains(&"state:processing".to_owned()), "{m:?}");
    let spoken = h
        .out
        .take_requests()
        .into_iter()
        .any(|r| matches!(r, ProviderRequest::Synthesize { ref text, .. } if !text.is_empty()));
    assert!(spoken);
}

#[test]
fn invalid_action_parameters_never_reach_the_client() {
    let mut h = Harness::connected();
    h.client(json!({"type": "actions.declare", "actions": {"set_theme": {
        "parameters": {"type": "object", "properties": {"theme": {"type": "string",
            "enum": ["light", "dark"]}}, "required": ["theme"]}}}}));
    h.client(json!({"type": "input.text", "text": "purple"}));
    h.messages();
    let id = h.generate_id();
    h.provider(ProviderEvent::ToolCall {
        id,
        call_id: "c1".into(),
        name: "set_theme".into(),
        arguments: json!({"theme": "purple"}),
    });
    h.provider(ProviderEvent::Done { id });
    let m = h.messages();
    assert!(!kinds(&m).contains(&"action.invoke".to_owned()), "{m:?}");
}

#[test]
fn the_clients_input_detected_stops_a_reply_at_once() {
    let mut h = Harness::connected();
    h.client(json!({"type": "input.text", "text": "hello"}));
    let id = h.generate_id();
    h.provider(ProviderEvent::TextDelta {
        id,
        delta: "A long answer.".into(),
    });
    h.provider(ProviderEvent::Done { id });
    let tts = h.synthesize_id();
    h.provider(ProviderEvent::Audio {
        id: tts,
        samples: vec![1000; 24_000],
        sample_rate: 24_000,
    });
    h.out.take_media();
    h.messages();
    h.client(json!({"type": "input.detected"}));
    assert_eq!(h.out.take_media().first(), Some(&MediaCommand::Clear));
    let m = h.messages();
    let k = kinds(&m);
    assert!(k.contains(&"reply.done".to_owned()), "{k:?}");
    let done = m.iter().find(|m| m["type"] == "reply.done").unwrap();
    assert_eq!(done["interrupted"], true);
}

#[test]
fn a_closed_connection_ends_the_session_and_hangs_up() {
    let mut h = Harness::connected();
    h.door.on_media(
        h.now,
        MediaEvent::Closed("ICE disconnected".into()),
        &mut h.out,
    );
    assert!(h.out.closing().is_some());
    let mut out = Out::new();
    h.door.on_close(h.now, &mut out);
    assert_eq!(out.take_media(), [MediaCommand::Hangup]);
}

#[test]
fn session_end_closes_normally() {
    let mut h = Harness::connected();
    h.client(json!({"type": "session.end"}));
    assert_eq!(
        h.out.closing().map(|c| c.code),
        Some(crate::door::close_code::NORMAL)
    );
}
