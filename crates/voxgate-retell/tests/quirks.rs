//! Quirks from the protocol notes: where the seed doc and real traffic disagree, and the
//! tolerance old or sloppy peers need.

#![allow(clippy::unwrap_used, clippy::panic)]

use serde_json::json;
use voxgate_retell::{
    Blame, CallType, DecodeError, RetellEvent, Role, ServerEvent, TranscriptItem, TurnTaking,
};

#[test]
fn tool_call_arguments_are_a_string_not_a_boolean() {
    let ok = r#"{"response_type":"tool_call_invocation","tool_call_id":"t","name":"f","arguments":"{\"a\":1}"}"#;
    let ServerEvent::ToolCallInvocation(t) = ServerEvent::from_json(ok).unwrap() else {
        panic!("wrong variant")
    };
    assert_eq!(t.arguments, r#"{"a":1}"#);
    // The seed's "boolean" is a doc bug: a real boolean is the peer's fault, not a panic.
    let bad = r#"{"response_type":"tool_call_invocation","tool_call_id":"t","name":"f","arguments":true}"#;
    let err = ServerEvent::from_json(bad).unwrap_err();
    assert!(
        matches!(
            err,
            DecodeError::Schema {
                event: "tool_call_invocation",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(err.blame(), Blame::Peer);
}

#[test]
fn the_seed_samples_that_are_doc_bugs_give_typed_errors() {
    // Seed's response_required sample: `timestamp` instead of `response_id`.
    let seed_sample = r#"{"interaction_type":"response_required","timestamp":3,"transcript":[]}"#;
    let err = RetellEvent::from_json(seed_sample).unwrap_err();
    assert!(
        matches!(
            err,
            DecodeError::Schema {
                event: "response_required",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(err.blame(), Blame::Peer);
    // Seed's update_only sample is missing a comma: not JSON at all.
    let seed_update = r#"{"interaction_type":"update_only","transcript":[{"role":"agent","content":"Hey how can I help you?"
        "words":[]}]}"#;
    let err = RetellEvent::from_json(seed_update).unwrap_err();
    assert!(matches!(err, DecodeError::Syntax(_)), "{err}");
    assert_eq!(err.blame(), Blame::MalformedInput);
}

#[test]
fn explicit_nulls_are_accepted_everywhere() {
    let call = r#"{"interaction_type":"call_details","call":{"call_id":null,"agent_id":null,
        "call_status":null,"call_type":null,"direction":null,"from_number":null,"to_number":null,
        "metadata":null,"retell_llm_dynamic_variables":null}}"#;
    let RetellEvent::CallDetails(d) = RetellEvent::from_json(call).unwrap() else {
        panic!()
    };
    assert_eq!(d.call.call_type, CallType::Unspecified);
    assert_eq!(d.call.metadata, None);
    assert!(d.call.extra.is_empty());

    let ev = RetellEvent::from_json(r#"{"interaction_type":"call_details","call":null}"#).unwrap();
    assert!(matches!(ev, RetellEvent::CallDetails(_)));
    let ev =
        RetellEvent::from_json(r#"{"interaction_type":"ping_pong","timestamp":null}"#).unwrap();
    assert_eq!(
        ev,
        RetellEvent::PingPong(voxgate_retell::PingPong { timestamp: 0 })
    );
    let ev = RetellEvent::from_json(
        r#"{"interaction_type":"update_only","transcript":null,"transcript_with_tool_calls":null,"turntaking":null}"#,
    )
    .unwrap();
    assert!(
        matches!(ev, RetellEvent::UpdateOnly(u) if u.transcript.is_empty() && u.turntaking.is_none())
    );

    for text in [
        r#"{"response_type":"config","config":null}"#,
        r#"{"response_type":"config","config":{"auto_reconnect":null,"call_details":null}}"#,
        r#"{"response_type":"update_agent","agent_config":{"responsiveness":null,"reminder_max_count":null}}"#,
        r#"{"response_type":"response","response_id":1,"content":null,"content_complete":null,
            "no_interruption_allowed":null,"end_call":null,"transfer_number":null,
            "show_transferee_as_caller":null,"digit_to_press":null}"#,
        r#"{"response_type":"agent_interrupt","interrupt_id":2,"content":null,"content_complete":null,"end_call":null}"#,
        r#"{"response_type":"tool_call_invocation","tool_call_id":null,"name":null,"arguments":null}"#,
        r#"{"response_type":"tool_call_result","tool_call_id":null,"content":null}"#,
        r#"{"response_type":"metadata","metadata":null}"#,
        r#"{"response_type":"ping_pong","timestamp":null}"#,
    ] {
        let ev = ServerEvent::from_json(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        // Nulls mean absent: nothing null comes back out.
        assert!(!ev.to_json().unwrap().contains("null"), "{text}");
    }
}

#[test]
fn unknown_event_types_are_kept_whole() {
    let text = r#"{"interaction_type":"sentiment","score":0.5,"labels":["calm"]}"#;
    let RetellEvent::Unknown(u) = RetellEvent::from_json(text).unwrap() else {
        panic!()
    };
    assert_eq!(u.tag, "sentiment");
    assert_eq!(u.fields["labels"], json!(["calm"]));
    let back: serde_json::Value =
        serde_json::from_str(&RetellEvent::Unknown(u).to_json().unwrap()).unwrap();
    assert_eq!(
        back,
        serde_json::from_str::<serde_json::Value>(text).unwrap()
    );

    let text = r#"{"response_type":"play_audio","url":"https://x/y.wav"}"#;
    assert_eq!(ServerEvent::from_json(text).unwrap().tag(), "play_audio");
}

#[test]
fn unknown_roles_and_turntaking_values_are_data() {
    let text = r#"{"interaction_type":"update_only","turntaking":"both_turn","transcript":[
        {"role":"transfer_target","content":"Billing, hi."}],
        "transcript_with_tool_calls":[{"role":"node_transition","former_node_id":"a","new_node_id":"b"},
        {"role":"dtmf","digit":"7"}]}"#;
    let RetellEvent::UpdateOnly(u) = RetellEvent::from_json(text).unwrap() else {
        panic!()
    };
    assert_eq!(u.transcript[0].role, Role::Other("transfer_target".into()));
    assert_eq!(u.turntaking, Some(TurnTaking::Other("both_turn".into())));
    let items = u.transcript_with_tool_calls.unwrap();
    assert!(
        matches!(&items[0], TranscriptItem::Other { role, fields } if role == "node_transition" && fields["new_node_id"] == "b")
    );
    assert!(
        matches!(&items[1], TranscriptItem::Other { role, fields } if role == "dtmf" && fields["digit"] == "7")
    );
}

#[test]
fn pre_2024_responses_without_response_type_parse_on_the_retell_side() {
    let old = r#"{"response_id":4,"content":"Goodbye.","content_complete":true,"end_call":true}"#;
    let ServerEvent::Response(r) = ServerEvent::from_json(old).unwrap() else {
        panic!()
    };
    assert_eq!((r.response_id, r.end_call), (4, Some(true)));
    // Re-encoding writes the modern form.
    assert!(
        ServerEvent::Response(r)
            .to_json()
            .unwrap()
            .starts_with(r#"{"response_type":"response""#)
    );
    // Without either tag or id there is nothing to go on.
    let err = ServerEvent::from_json(r#"{"content":"hi"}"#).unwrap_err();
    assert!(matches!(err, DecodeError::MissingTag("response_type")));
    let err = RetellEvent::from_json(r#"{"interaction_type":null,"response_id":1}"#).unwrap_err();
    assert!(matches!(err, DecodeError::MissingTag("interaction_type")));
}

#[test]
fn the_tag_may_come_anywhere_and_unknown_fields_are_ignored() {
    let text = r#"{"response_id":8,"transcript":[],"new_field":{"deep":[1,2]},"interaction_type":"reminder_required"}"#;
    assert!(
        matches!(RetellEvent::from_json(text).unwrap(), RetellEvent::ReminderRequired(r) if r.response_id == 8)
    );
}

#[test]
fn frames_that_are_not_objects() {
    for (text, blame) in [
        ("", Blame::MalformedInput),
        ("{", Blame::MalformedInput),
        ("[1,2]", Blame::MalformedInput),
        ("\"ping\"", Blame::MalformedInput),
        ("{\"interaction_type\":5}", Blame::Peer),
        (
            "{\"interaction_type\":\"ping_pong\"} trailing",
            Blame::MalformedInput,
        ),
    ] {
        let err = RetellEvent::from_json(text).unwrap_err();
        assert_eq!(err.blame(), blame, "{text}: {err}");
        let err =
            ServerEvent::from_json(&text.replace("interaction_type", "response_type")).unwrap_err();
        assert_eq!(err.blame(), blame, "{text}: {err}");
    }
    assert!(matches!(
        RetellEvent::from_json("[1]").unwrap_err(),
        DecodeError::NotAnObject
    ));
}

#[test]
fn phone_call_details_keep_unknown_keys_on_the_way_out() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/retell/call_details.json"
    ))
    .unwrap();
    let RetellEvent::CallDetails(d) = RetellEvent::from_json(&text).unwrap() else {
        panic!()
    };
    assert_eq!(d.call.call_type, CallType::PhoneCall);
    assert_eq!(d.call.direction.as_deref(), Some("inbound"));
    assert_eq!(
        d.call.retell_llm_dynamic_variables.as_ref().unwrap()["customer_name"],
        "John Doe"
    );
    assert_eq!(d.call.extra["opt_out_sensitive_data_storage"], json!(true));
    let out = RetellEvent::CallDetails(d).to_json().unwrap();
    assert!(out.contains(r#""opt_out_sensitive_data_storage":true"#));
}

#[test]
fn long_transcripts_are_not_capped() {
    // A long call: several MiB of transcript in one frame (Retell only closes with 1009 when a
    // frame exceeds the socket's limit; the codec must not impose a smaller one).
    let words: Vec<String> = (0..40)
        .map(|i| format!(r#"{{"word":"w{i}","start":{i}.25,"end":{i}.5}}"#))
        .collect();
    let utterance = format!(
        r#"{{"role":"user","content":"{}","words":[{}]}}"#,
        "x ".repeat(40),
        words.join(",")
    );
    let utterances = vec![utterance; 2000].join(",");
    let text = format!(
        r#"{{"interaction_type":"response_required","response_id":1000,"transcript":[{utterances}]}}"#
    );
    assert!(text.len() > 2 << 20, "{}", text.len());
    let RetellEvent::ResponseRequired(r) = RetellEvent::from_json(&text).unwrap() else {
        panic!()
    };
    assert_eq!(r.transcript.len(), 2000);
}
