//! Property tests: every event encodes and decodes back to itself, and arbitrary input never
//! panics a decoder.

use proptest::prelude::*;
use serde_json::{Map, Value, json};
use voxgate_retell::{
    AgentConfig, AgentInterrupt, Call, CallDetails, CallType, ConfigBody, Metadata, PingPong,
    Response, ResponseRequest, RetellEvent, Role, ServerEvent, ToolCallInvocation, ToolCallResult,
    TranscriptItem, TurnTaking, UnknownEvent, UpdateOnly, Utterance, Word,
};

fn text() -> impl Strategy<Value = String> {
    "\\PC{0,12}"
}

/// Seconds with millisecond precision: what Retell sends, and exact through serde_json's
/// default (not correctly rounded for every float) parser.
fn seconds() -> impl Strategy<Value = f64> {
    (0u32..10_000_000).prop_map(|ms| f64::from(ms) / 1000.0)
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        text().prop_map(Value::from),
    ]
}

fn object() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::btree_map("[a-z_]{1,8}", leaf(), 0..4).prop_map(|m| m.into_iter().collect())
}

/// Tags that are not real event types.
fn unknown_tag() -> impl Strategy<Value = String> {
    "x_[a-z_]{0,10}"
}

fn role() -> impl Strategy<Value = Role> {
    prop_oneof![
        Just(Role::Agent),
        Just(Role::User),
        "[a-z]{0,3}_[a-z]{1,6}".prop_map(Role::Other),
    ]
}

fn word() -> impl Strategy<Value = Word> {
    (text(), seconds(), seconds()).prop_map(|(word, start, end)| Word {
        word: word.into(),
        start,
        end,
    })
}

fn utterance() -> impl Strategy<Value = Utterance> {
    (
        role(),
        text(),
        prop::option::of(prop::collection::vec(word(), 0..4)),
    )
        .prop_map(|(role, content, words)| Utterance {
            role,
            content,
            words,
        })
}

fn agent_or_user() -> impl Strategy<Value = Utterance> {
    (
        prop_oneof![Just(Role::Agent), Just(Role::User)],
        text(),
        prop::option::of(prop::collection::vec(word(), 0..3)),
    )
        .prop_map(|(role, content, words)| Utterance {
            role,
            content,
            words,
        })
}

fn item() -> impl Strategy<Value = TranscriptItem> {
    prop_oneof![
        agent_or_user().prop_map(TranscriptItem::Utterance),
        (text(), text(), text()).prop_map(|(tool_call_id, name, arguments)| {
            TranscriptItem::ToolCallInvocation {
                tool_call_id,
                name,
                arguments,
            }
        }),
        (text(), text()).prop_map(|(tool_call_id, content)| TranscriptItem::ToolCallResult {
            tool_call_id,
            content
        }),
        (unknown_tag(), object()).prop_map(|(role, fields)| TranscriptItem::Other { role, fields }),
    ]
}

fn transcript() -> impl Strategy<Value = Vec<Utterance>> {
    prop::collection::vec(utterance(), 0..4)
}

fn woven() -> impl Strategy<Value = Option<Vec<TranscriptItem>>> {
    prop::option::of(prop::collection::vec(item(), 0..4))
}

fn call() -> impl Strategy<Value = Call> {
    let call_type = prop_oneof![
        Just(CallType::PhoneCall),
        Just(CallType::WebCall),
        Just(CallType::Unspecified),
        "[a-z]{1,8}_x".prop_map(CallType::Other),
    ];
    (
        (text(), text(), text(), call_type),
        (
            prop::option::of(text()),
            prop::option::of(text()),
            prop::option::of(text()),
        ),
        prop::option::of(object().prop_map(Value::Object)),
        prop::option::of(prop::collection::btree_map(text(), text(), 0..3)),
        object(),
    )
        .prop_map(
            |(
                (call_id, agent_id, call_status, call_type),
                (direction, from_number, to_number),
                metadata,
                vars,
                extra,
            )| {
                // Extra keys never shadow modelled ones.
                let extra = extra
                    .into_iter()
                    .map(|(k, v)| (format!("x_{k}"), v))
                    .collect();
                Call {
                    call_id,
                    agent_id,
                    call_status,
                    call_type,
                    direction,
                    from_number,
                    to_number,
                    metadata,
                    retell_llm_dynamic_variables: vars,
                    extra,
                }
            },
        )
}

fn request() -> impl Strategy<Value = ResponseRequest> {
    (any::<u64>(), transcript(), woven()).prop_map(
        |(response_id, transcript, transcript_with_tool_calls)| ResponseRequest {
            response_id,
            transcript,
            transcript_with_tool_calls,
        },
    )
}

fn retell_event() -> impl Strategy<Value = RetellEvent> {
    let turntaking = prop::option::of(prop_oneof![
        Just(TurnTaking::AgentTurn),
        Just(TurnTaking::UserTurn),
        "x_[a-z]{1,6}".prop_map(TurnTaking::Other),
    ]);
    prop_oneof![
        any::<u64>().prop_map(|timestamp| RetellEvent::PingPong(PingPong { timestamp })),
        call().prop_map(|call| RetellEvent::CallDetails(Box::new(CallDetails { call }))),
        (transcript(), woven(), turntaking).prop_map(
            |(transcript, transcript_with_tool_calls, turntaking)| {
                RetellEvent::UpdateOnly(UpdateOnly {
                    transcript,
                    transcript_with_tool_calls,
                    turntaking,
                })
            }
        ),
        request().prop_map(RetellEvent::ResponseRequired),
        request().prop_map(RetellEvent::ReminderRequired),
        (unknown_tag(), object())
            .prop_map(|(tag, fields)| RetellEvent::Unknown(UnknownEvent { tag, fields })),
    ]
}

fn response() -> impl Strategy<Value = Response> {
    (
        (any::<u64>(), text(), any::<bool>()),
        (
            any::<Option<bool>>(),
            any::<Option<bool>>(),
            any::<Option<bool>>(),
        ),
        (prop::option::of(text()), prop::option::of("[0-9*#]{1,4}")),
    )
        .prop_map(
            |(
                (response_id, content, content_complete),
                (no_interruption_allowed, end_call, show_transferee_as_caller),
                (transfer_number, digit_to_press),
            )| Response {
                response_id,
                content,
                content_complete,
                no_interruption_allowed,
                end_call,
                transfer_number,
                show_transferee_as_caller,
                digit_to_press,
            },
        )
}

fn server_event() -> impl Strategy<Value = ServerEvent> {
    let flags = (
        any::<Option<bool>>(),
        any::<Option<bool>>(),
        any::<Option<bool>>(),
        object(),
    );
    let unit = prop::option::of((0u32..=1000).prop_map(|n| f64::from(n) / 1000.0));
    prop_oneof![
        flags.prop_map(
            |(auto_reconnect, call_details, transcript_with_tool_calls, extra)| {
                let extra = extra
                    .into_iter()
                    .map(|(k, v)| (format!("x_{k}"), v))
                    .collect();
                ServerEvent::Config(ConfigBody {
                    auto_reconnect,
                    call_details,
                    transcript_with_tool_calls,
                    extra,
                })
            }
        ),
        (
            unit.clone(),
            unit,
            prop::option::of(seconds()),
            any::<Option<u64>>()
        )
            .prop_map(
                |(
                    responsiveness,
                    interruption_sensitivity,
                    reminder_trigger_ms,
                    reminder_max_count,
                )| {
                    ServerEvent::UpdateAgent(AgentConfig {
                        responsiveness,
                        interruption_sensitivity,
                        reminder_trigger_ms,
                        reminder_max_count,
                        extra: Map::new(),
                    })
                }
            ),
        any::<u64>().prop_map(|timestamp| ServerEvent::PingPong(PingPong { timestamp })),
        response().prop_map(ServerEvent::Response),
        (response(), any::<u64>()).prop_map(|(r, interrupt_id)| ServerEvent::AgentInterrupt(
            AgentInterrupt {
                interrupt_id,
                content: r.content,
                content_complete: r.content_complete,
                no_interruption_allowed: r.no_interruption_allowed,
                end_call: r.end_call,
                transfer_number: r.transfer_number,
                digit_to_press: r.digit_to_press,
            }
        )),
        (text(), text(), text()).prop_map(|(tool_call_id, name, arguments)| {
            ServerEvent::ToolCallInvocation(ToolCallInvocation {
                tool_call_id,
                name,
                arguments,
            })
        }),
        (text(), text()).prop_map(|(tool_call_id, content)| {
            ServerEvent::ToolCallResult(ToolCallResult {
                tool_call_id,
                content,
            })
        }),
        prop::option::of(object().prop_map(Value::Object))
            .prop_map(|metadata| ServerEvent::Metadata(Metadata { metadata })),
        (unknown_tag(), object())
            .prop_map(|(tag, fields)| ServerEvent::Unknown(UnknownEvent { tag, fields })),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn retell_events_round_trip(ev in retell_event()) {
        let wire = ev.to_json().unwrap();
        prop_assert_eq!(RetellEvent::from_json(&wire).unwrap(), ev);
    }

    #[test]
    fn server_events_round_trip(ev in server_event()) {
        let wire = ev.to_json().unwrap();
        prop_assert_eq!(ServerEvent::from_json(&wire).unwrap(), ev);
    }

    #[test]
    fn legacy_responses_decode_like_tagged_ones(r in response()) {
        let mut v = serde_json::to_value(ServerEvent::Response(r.clone())).unwrap();
        v.as_object_mut().unwrap().remove("response_type");
        prop_assert_eq!(ServerEvent::from_json(&v.to_string()).unwrap(), ServerEvent::Response(r));
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = RetellEvent::from_slice(&bytes);
        let _ = ServerEvent::from_slice(&bytes);
    }

    #[test]
    fn arbitrary_objects_with_real_tags_never_panic(
        tag in prop::sample::select(vec![
            "ping_pong", "call_details", "update_only", "response_required", "reminder_required",
            "config", "update_agent", "response", "agent_interrupt", "tool_call_invocation",
            "tool_call_result", "metadata",
        ]),
        fields in object(),
        transcript in prop::option::of(leaf()),
    ) {
        let mut o = fields;
        o.insert("interaction_type".into(), json!(tag));
        o.insert("response_type".into(), json!(tag));
        if let Some(t) = transcript {
            o.insert("transcript".into(), json!([{ "role": t }]));
        }
        let text = Value::Object(o).to_string();
        // Errors are fine (they are typed); panics are not.
        let _ = RetellEvent::from_json(&text);
        let _ = ServerEvent::from_json(&text);
    }
}
