//! Every message, generated: encoding then decoding gives it back, both directions; and
//! decoding arbitrary text never panics.
// Test helpers may unwrap and panic: a failure there is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use proptest::prelude::*;
use serde_json::{Map, Value};
use voxgate_vip::{
    ActionDeclaration, ActionOutcome, AudioFormat, ClientMessage, ErrorCode, ErrorPayload, Limits,
    ServerMessage, SessionConnected, Violation, VipState,
};

/// Any text, control characters, quotes and non-ASCII included.
fn text() -> impl Strategy<Value = String> {
    "(?s).{0,40}"
}

/// An id: 1 to 40 characters, no control characters.
fn id() -> impl Strategy<Value = String> {
    "[^\\p{Cc}]{1,40}"
}

/// JSON without floats (a float may come back one ULP off through serde_json's fast parser).
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(text(), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn code() -> impl Strategy<Value = ErrorCode> {
    prop_oneof![
        Just(ErrorCode::InvalidParameters),
        Just(ErrorCode::UnknownAction),
        Just(ErrorCode::ExecutionFailed),
        Just(ErrorCode::Timeout),
        Just(ErrorCode::Cancelled),
        Just(ErrorCode::Unavailable),
        Just(ErrorCode::UnknownType),
        Just(ErrorCode::TooLarge),
        Just(ErrorCode::Malformed),
        Just(ErrorCode::InvalidMessage),
        // Unknown codes are kept; a known name always reads as its variant.
        "[a-z_]{0,20}".prop_map(|s| ErrorCode::parse(&s)),
    ]
}

fn payload() -> impl Strategy<Value = ErrorPayload> {
    (
        code(),
        text(),
        prop::collection::vec((text(), text()), 0..3),
    )
        .prop_map(|(code, message, details)| {
            ErrorPayload::new(code, message).with_details(
                details
                    .into_iter()
                    .map(|(p, m)| Violation::new(p, m))
                    .collect(),
            )
        })
}

fn state() -> impl Strategy<Value = VipState> {
    prop_oneof![
        Just(VipState::Idle),
        Just(VipState::Listening),
        Just(VipState::Processing),
        Just(VipState::Action),
        Just(VipState::Speaking),
    ]
}

fn schema() -> impl Strategy<Value = Value> {
    (
        any::<bool>(),
        prop::collection::btree_map(text(), json_value(), 0..3),
        prop::option::of(prop::collection::vec(text(), 0..3)),
    )
        .prop_map(|(typed, properties, required)| {
            let mut s = Map::new();
            if typed {
                s.insert("type".into(), "object".into());
            }
            s.insert(
                "properties".into(),
                Value::Object(properties.into_iter().collect()),
            );
            if let Some(r) = required {
                s.insert("required".into(), r.into());
            }
            Value::Object(s)
        })
}

fn actions() -> impl Strategy<Value = Vec<ActionDeclaration>> {
    // Unique ids, in any order.
    prop::collection::btree_map(id(), (text(), schema()), 0..6)
        .prop_flat_map(|m| {
            let v: Vec<_> = m.into_iter().collect();
            Just(v).prop_shuffle()
        })
        .prop_map(|v| {
            v.into_iter()
                .map(|(id, (description, parameters))| ActionDeclaration {
                    id,
                    description,
                    parameters,
                })
                .collect()
        })
}

fn client_message() -> impl Strategy<Value = ClientMessage> {
    prop_oneof![
        actions().prop_map(|actions| ClientMessage::ActionsDeclare { actions }),
        text().prop_map(|text| ClientMessage::StateNarrate { text }),
        (
            id(),
            prop_oneof![
                prop::option::of(json_value().prop_filter("null reads as none", |v| !v.is_null()))
                    .prop_map(|data| ActionOutcome::Success { data }),
                payload().prop_map(ActionOutcome::Error),
            ]
        )
            .prop_map(|(invocation_id, outcome)| ClientMessage::ActionResult {
                invocation_id,
                outcome
            }),
        Just(ClientMessage::InputDetected),
        "(?s).{0,10}[^\\s].{0,10}".prop_map(|text| ClientMessage::InputText { text }),
        Just(ClientMessage::SessionEnd),
        (code(), text()).prop_map(|(code, message)| ClientMessage::ErrorFatal { code, message }),
        "[a-z]{1,10}\\.[a-z]{1,10}x".prop_map(|type_name| ClientMessage::Unknown { type_name }),
    ]
}

fn server_message() -> impl Strategy<Value = ServerMessage> {
    prop_oneof![
        (
            text(),
            text(),
            text(),
            any::<u32>(),
            any::<u16>(),
            any::<[u64; 4]>()
        )
            .prop_map(|(session_id, protocol, codec, sample_rate, channels, l)| {
                ServerMessage::SessionConnected(SessionConnected {
                    session_id,
                    protocol,
                    audio: AudioFormat {
                        codec,
                        sample_rate,
                        channels,
                    },
                    limits: Limits {
                        max_actions: l[0],
                        max_narrated_state_bytes: l[1],
                        max_action_result_bytes: l[2],
                        max_message_bytes: l[3],
                    },
                })
            }),
        (state(), state(), any::<Option<u64>>()).prop_map(|(state, previous, turn)| {
            ServerMessage::State {
                state,
                previous,
                turn,
            }
        }),
        Just(ServerMessage::InputDetected),
        (any::<u64>(), text())
            .prop_map(|(turn, text)| ServerMessage::TranscriptUser { turn, text }),
        (any::<u64>(), text()).prop_map(|(turn, text)| ServerMessage::ReplyText { turn, text }),
        (any::<u64>(), any::<bool>())
            .prop_map(|(turn, interrupted)| ServerMessage::ReplyDone { turn, interrupted }),
        (
            text(),
            text(),
            json_value().prop_filter("null reads as {}", |v| !v.is_null())
        )
            .prop_map(|(invocation_id, action_id, parameters)| {
                ServerMessage::ActionInvoke {
                    invocation_id,
                    action_id,
                    parameters,
                }
            }),
        (text(), payload()).prop_map(|(invocation_id, error)| ServerMessage::ActionCancelled {
            invocation_id,
            error
        }),
        (any::<u64>(), any::<u64>(), any::<Option<u64>>()).prop_map(|(turn, a, t)| {
            ServerMessage::TurnLatency {
                turn,
                end_of_speech_to_first_audio_ms: a,
                end_of_speech_to_transcript_ms: t,
            }
        }),
        payload().prop_map(ServerMessage::Error),
        (code(), text()).prop_map(|(code, message)| ServerMessage::ErrorFatal { code, message }),
        "[a-z]{1,10}\\.[a-z]{1,10}x".prop_map(|type_name| ServerMessage::Unknown { type_name }),
    ]
}

proptest! {
    #[test]
    fn client_messages_round_trip(msg in client_message()) {
        let text = msg.encode();
        prop_assert_eq!(ClientMessage::decode(&text), Ok(msg.clone()));
        prop_assert_eq!(ClientMessage::decode_slice(text.as_bytes()), Ok(msg));
    }

    #[test]
    fn server_messages_round_trip(msg in server_message()) {
        let text = msg.encode();
        prop_assert_eq!(ServerMessage::decode(&text), Ok(msg));
    }

    #[test]
    fn arbitrary_text_never_panics(text in "(?s).{0,200}") {
        let _ = ClientMessage::decode(&text);
        let _ = ServerMessage::decode(&text);
    }

    /// Mutated valid messages: whatever decodes re-encodes to text that decodes the same.
    #[test]
    fn what_decodes_re_encodes(msg in client_message(), cut in any::<prop::sample::Index>(), junk in "[\\[\\]{}\",:0-9a-z.nul ]{0,4}") {
        let text = msg.encode();
        let at = cut.index(text.len() + 1);
        if text.is_char_boundary(at) {
            let mutated = format!("{}{}{}", &text[..at], junk, &text[at..]);
            if let Ok(m) = ClientMessage::decode(&mutated) {
                prop_assert_eq!(ClientMessage::decode(&m.encode()), Ok(m));
            }
            if let Ok(m) = ServerMessage::decode(&mutated) {
                prop_assert_eq!(ServerMessage::decode(&m.encode()), Ok(m));
            }
        }
    }
}
