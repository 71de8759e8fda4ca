//! The wire shape of every message, pinned with insta; each is also decoded back to itself and
//! written with `type` first.
// Test helpers may unwrap and panic: a failure there is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{Value, json};
use voxgate_vip::{
    ActionDeclaration, ActionOutcome, ClientMessage, ErrorCode, ErrorPayload, ServerMessage,
    SessionConnected, Violation, VipState,
};

fn as_json(text: &str) -> Value {
    serde_json::from_str(text).unwrap()
}

fn invalid_parameters() -> ErrorPayload {
    ErrorPayload::new(
        ErrorCode::InvalidParameters,
        "the parameters do not match the schema",
    )
    .with_details(vec![Violation::new(
        "/level",
        "\"high\" is not of type \"integer\"",
    )])
}

fn server_messages() -> Vec<(&'static str, ServerMessage)> {
    vec![
        (
            "session_connected",
            ServerMessage::SessionConnected(SessionConnected::new("vip-5f2c9a")),
        ),
        (
            "state_listening",
            ServerMessage::State {
                state: VipState::Listening,
                previous: VipState::Idle,
                turn: None,
            },
        ),
        (
            "state_speaking",
            ServerMessage::State {
                state: VipState::Speaking,
                previous: VipState::Processing,
                turn: Some(3),
            },
        ),
        ("input_detected", ServerMessage::InputDetected),
        (
            "transcript_user",
            ServerMessage::TranscriptUser {
                turn: 3,
                text: "open the settings".into(),
            },
        ),
        (
            "reply_text",
            ServerMessage::ReplyText {
                turn: 3,
                text: "Opening the settings.".into(),
            },
        ),
        (
            "reply_done",
            ServerMessage::ReplyDone {
                turn: 3,
                interrupted: true,
            },
        ),
        (
            "action_invoke",
            ServerMessage::ActionInvoke {
                invocation_id: "12".into(),
                action_id: "set_zoom".into(),
                parameters: json!({"level": 2}),
            },
        ),
        (
            "action_cancelled",
            ServerMessage::ActionCancelled {
                invocation_id: "12".into(),
                error: ErrorPayload::new(ErrorCode::Timeout, "no result within 10 s"),
            },
        ),
        (
            "turn_latency",
            ServerMessage::TurnLatency {
                turn: 3,
                end_of_speech_to_first_audio_ms: 840,
                end_of_speech_to_transcript_ms: Some(310),
            },
        ),
        (
            "turn_latency_no_transcript",
            ServerMessage::TurnLatency {
                turn: 4,
                end_of_speech_to_first_audio_ms: 620,
                end_of_speech_to_transcript_ms: None,
            },
        ),
        (
            "error",
            ServerMessage::Error(ErrorPayload::unknown_type("ping")),
        ),
        (
            "error_with_details",
            ClientMessage::decode(r#"{"type":"state.narrate","text":7}"#)
                .unwrap_err()
                .payload()
                .into(),
        ),
        (
            "error_fatal",
            ServerMessage::ErrorFatal {
                code: ErrorCode::Unavailable,
                message: "the speech service is unavailable".into(),
            },
        ),
    ]
}

fn client_messages() -> Vec<(&'static str, ClientMessage)> {
    let mut zoom = ActionDeclaration::new("set_zoom", "Set the map's zoom level");
    zoom.parameters = json!({
        "type": "object",
        "properties": {"level": {"type": "integer", "minimum": 1, "maximum": 20}},
        "required": ["level"]
    });
    vec![
        (
            "client_actions_declare",
            ClientMessage::ActionsDeclare {
                actions: vec![
                    ActionDeclaration::new("open_settings", "Open the settings page"),
                    zoom,
                ],
            },
        ),
        (
            "client_state_narrate",
            ClientMessage::StateNarrate {
                text: "The map page; zoom level 3; a search box.".into(),
            },
        ),
        (
            "client_action_result_success",
            ClientMessage::ActionResult {
                invocation_id: "12".into(),
                outcome: ActionOutcome::Success {
                    data: Some(json!({"zoom": 2})),
                },
            },
        ),
        (
            "client_action_result_error",
            ClientMessage::ActionResult {
                invocation_id: "12".into(),
                outcome: ActionOutcome::Error(invalid_parameters()),
            },
        ),
        ("client_input_detected", ClientMessage::InputDetected),
        (
            "client_input_text",
            ClientMessage::InputText {
                text: "what's on this page?".into(),
            },
        ),
        ("client_session_end", ClientMessage::SessionEnd),
        (
            "client_error_fatal",
            ClientMessage::ErrorFatal {
                code: ErrorCode::Other("microphone_denied".into()),
                message: "the user denied the microphone".into(),
            },
        ),
    ]
}

#[test]
fn server_messages_are_pinned_and_decode_to_themselves() {
    for (name, msg) in server_messages() {
        let text = msg.encode();
        assert!(
            text.starts_with(&format!(r#"{{"type":"{}""#, msg.type_name())),
            "{text}"
        );
        assert_eq!(ServerMessage::decode(&text).as_ref(), Ok(&msg), "{name}");
        insta::assert_json_snapshot!(name, as_json(&text));
    }
}

#[test]
fn client_messages_are_pinned_and_decode_to_themselves() {
    for (name, msg) in client_messages() {
        let text = msg.encode();
        assert!(
            text.starts_with(&format!(r#"{{"type":"{}""#, msg.type_name())),
            "{text}"
        );
        assert_eq!(ClientMessage::decode(&text).as_ref(), Ok(&msg), "{name}");
        insta::assert_json_snapshot!(name, as_json(&text));
    }
}

#[test]
fn exact_wire_text_of_a_few() {
    assert_eq!(
        ServerMessage::SessionConnected(SessionConnected::new("s1")).encode(),
        r#"{"type":"session.connected","session_id":"s1","protocol":"vip/1","audio":{"codec":"opus","sample_rate":48000,"channels":1},"limits":{"max_actions":64,"max_narrated_state_bytes":8192,"max_action_result_bytes":16384,"max_message_bytes":65536}}"#
    );
    assert_eq!(
        ServerMessage::Error(ErrorPayload::new(ErrorCode::TooLarge, "big")).encode(),
        r#"{"type":"error","code":"too_large","message":"big"}"#
    );
    assert_eq!(
        ServerMessage::State {
            state: VipState::Listening,
            previous: VipState::Speaking,
            turn: None
        }
        .encode(),
        r#"{"type":"state","state":"listening","previous":"speaking","turn":null}"#
    );
    // Action order is the declaration's.
    let ClientMessage::ActionsDeclare { actions } = &client_messages()[0].1 else {
        panic!()
    };
    let text = ClientMessage::ActionsDeclare {
        actions: actions.iter().rev().cloned().collect(),
    }
    .encode();
    assert!(text.find("set_zoom") < text.find("open_settings"), "{text}");
}
