//! The VIP §5.3 action registry: declared actions only, validated parameters, results,
//! timeouts and the deterministic fallback.

use std::time::{Duration, Instant};

use serde_json::json;
use voxgate_mcp::action::{
    Action, ActionConfig, ActionError, ActionInput, ActionInvoke, ActionOutcome, ActionOutput,
    ActionRegistry, ActionResult, InvocationId,
};
use voxgate_mcp::registry::{ToolRegistry, ToolSource};
use voxgate_mcp::schema::{ErrorCode, ErrorPayload};

fn declared(now: Instant) -> ActionRegistry {
    let mut r = ActionRegistry::new(ActionConfig::default());
    let declared = r.handle_input(
        now,
        ActionInput::Declare(vec![
            Action {
                id: "open_settings".into(),
                description: "Open the settings page".into(),
                parameters: json!({"type":"object","properties":{}}),
            },
            Action {
                id: "set_quantity".into(),
                description: "Set the quantity field".into(),
                parameters: json!({"type":"object","properties":{"value":{"type":"integer","minimum":1}},"required":["value"]}),
            },
            Action {
                id: "broken".into(),
                description: "".into(),
                parameters: json!({"type": 3}),
            },
        ]),
    );
    assert_eq!(declared, Ok(()));
    r
}

fn drain(r: &mut ActionRegistry) -> Vec<ActionOutput> {
    std::iter::from_fn(|| r.poll_output()).collect()
}

#[test]
fn declaration_feeds_the_tool_registry() {
    let now = Instant::now();
    let mut r = declared(now);
    let out = drain(&mut r);
    let [ActionOutput::RegistryChanged { rejected }] = &out[..] else {
        panic!("{out:?}")
    };
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].name, "broken");
    let mut tools = ToolRegistry::new();
    assert!(
        tools
            .set_source_tools(ToolSource::Client, r.tools())
            .is_empty()
    );
    let names: Vec<&str> = tools.llm_tools().map(|t| t.llm_name()).collect();
    assert_eq!(names, ["open_settings", "set_quantity"]);
}

#[test]
fn narrated_state_is_reported_only_when_it_changes() {
    let now = Instant::now();
    let mut r = declared(now);
    drain(&mut r);
    for text in [
        "Home page, cart has 2 items",
        "Home page, cart has 2 items",
        "Settings modal open",
    ] {
        r.handle_input(now, ActionInput::NarratedState(text.into()))
            .unwrap();
    }
    let out = drain(&mut r);
    assert_eq!(
        out,
        [
            ActionOutput::NarratedState("Home page, cart has 2 items".into()),
            ActionOutput::NarratedState("Settings modal open".into())
        ]
    );
    assert_eq!(r.narrated_state(), Some("Settings modal open"));
}

#[test]
fn only_declared_actions_with_valid_parameters_are_invoked() {
    let now = Instant::now();
    let mut r = declared(now);
    drain(&mut r);

    let rejected = r.invoke(now, "delete_account", json!({})).unwrap_err();
    assert_eq!(
        rejected.error,
        ActionError::UnknownAction("delete_account".into())
    );
    assert_eq!(rejected.payload.code, ErrorCode::UnknownAction);
    assert_eq!(
        rejected.fallback,
        "Sorry, I couldn't do delete account: no action delete_account is available."
    );

    let rejected = r
        .invoke(now, "set_quantity", json!({"value": 0}))
        .unwrap_err();
    assert!(matches!(
        rejected.error,
        ActionError::InvalidParameters { .. }
    ));
    assert_eq!(rejected.payload.details[0].path, "/value");
    assert!(drain(&mut r).is_empty(), "nothing reaches the client");

    let id = r.invoke(now, "set_quantity", json!({"value": 3})).unwrap();
    let out = drain(&mut r);
    assert_eq!(
        out,
        [ActionOutput::Invoke(ActionInvoke {
            invocation: id,
            action_id: "set_quantity".into(),
            parameters: json!({"value": 3}),
        })]
    );
    assert_eq!(ActionInvoke::EVENT, "action.invoke");

    r.handle_input(
        now,
        ActionInput::Result {
            invocation: id,
            outcome: ActionOutcome::Success(json!({"quantity": 3})),
        },
    )
    .unwrap();
    let out = drain(&mut r);
    assert_eq!(
        out,
        [ActionOutput::Result(ActionResult {
            invocation: id,
            action_id: "set_quantity".into(),
            outcome: ActionOutcome::Success(json!({"quantity": 3})),
            fallback: None,
        })]
    );
    assert_eq!(ActionResult::EVENT, "action.result");
    // The same result again is a peer fault.
    assert_eq!(
        r.handle_input(
            now,
            ActionInput::Result {
                invocation: id,
                outcome: ActionOutcome::Success(json!(null))
            }
        ),
        Err(ActionError::UnknownInvocation(id))
    );
}

#[test]
fn failures_and_timeouts_carry_the_fallback() {
    let now = Instant::now();
    let mut r = declared(now);
    drain(&mut r);
    let a = r.invoke(now, "open_settings", json!(null)).unwrap();
    let b = r
        .invoke(now + Duration::from_secs(1), "open_settings", json!({}))
        .unwrap();
    drain(&mut r);

    let failure = ErrorPayload::new(ErrorCode::ExecutionFailed, "the button no longer exists");
    r.handle_input(
        now,
        ActionInput::Result {
            invocation: a,
            outcome: ActionOutcome::Failure(failure.clone()),
        },
    )
    .unwrap();
    let out = drain(&mut r);
    let [ActionOutput::Result(res)] = &out[..] else {
        panic!("{out:?}")
    };
    assert_eq!(res.outcome, ActionOutcome::Failure(failure));
    assert_eq!(
        res.fallback.as_deref(),
        Some("Sorry, I couldn't do open settings: the button no longer exists.")
    );

    assert_eq!(r.poll_timeout(), Some(now + Duration::from_secs(11)));
    r.handle_timeout(now + Duration::from_secs(10));
    assert!(drain(&mut r).is_empty());
    r.handle_timeout(now + Duration::from_secs(11));
    let out = drain(&mut r);
    let [ActionOutput::Result(res)] = &out[..] else {
        panic!("{out:?}")
    };
    assert_eq!(res.invocation, b);
    assert!(matches!(&res.outcome, ActionOutcome::Failure(p) if p.code == ErrorCode::Timeout));
    assert!(res.fallback.is_some());
    assert_eq!(r.pending(), 0);
    assert_eq!(
        r.handle_input(
            now,
            ActionInput::Result {
                invocation: InvocationId(99),
                outcome: ActionOutcome::Success(json!(1))
            }
        ),
        Err(ActionError::UnknownInvocation(InvocationId(99)))
    );
}

#[test]
fn declarations_states_and_results_are_bounded() {
    use voxgate_mcp::action::{
        MAX_ACTION_RESULT_BYTES, MAX_ACTIONS, MAX_FALLBACK_REASON_CHARS, MAX_NARRATED_STATE_BYTES,
    };
    use voxgate_mcp::registry::{MAX_TOOL_NAME_BYTES, RejectReason};
    let now = Instant::now();
    let mut r = declared(now);
    drain(&mut r);
    let action = |id: String| Action {
        id,
        description: String::new(),
        parameters: json!({"type": "object"}),
    };

    // Too many: refused whole, the previous actions stay.
    let many = (0..=MAX_ACTIONS).map(|i| action(format!("a{i}"))).collect();
    assert_eq!(
        r.handle_input(now, ActionInput::Declare(many)),
        Err(ActionError::TooManyActions {
            count: MAX_ACTIONS + 1,
            max: MAX_ACTIONS
        })
    );
    assert!(drain(&mut r).is_empty());
    assert!(r.is_declared("open_settings"));
    let at_max = (0..MAX_ACTIONS).map(|i| action(format!("a{i}"))).collect();
    r.handle_input(now, ActionInput::Declare(at_max)).unwrap();
    assert_eq!(r.tools().len(), MAX_ACTIONS);
    drain(&mut r);

    // A name over the tool registry's maximum is left out.
    r.handle_input(
        now,
        ActionInput::Declare(vec![
            action("n".repeat(MAX_TOOL_NAME_BYTES + 1)),
            action("ok".into()),
        ]),
    )
    .unwrap();
    let out = drain(&mut r);
    let [ActionOutput::RegistryChanged { rejected }] = &out[..] else {
        panic!("{out:?}")
    };
    assert!(matches!(
        rejected[0].error,
        RejectReason::TooLarge { what: "name", .. }
    ));
    assert!(r.is_declared("ok"));

    // Narrated state: at the maximum accepted, beyond it refused and the old one kept.
    let at_max = "s".repeat(MAX_NARRATED_STATE_BYTES);
    r.handle_input(now, ActionInput::NarratedState(at_max.clone()))
        .unwrap();
    assert!(matches!(
        r.handle_input(now, ActionInput::NarratedState(format!("{at_max}s"))),
        Err(ActionError::NarratedStateTooLarge { .. })
    ));
    assert_eq!(r.narrated_state(), Some(at_max.as_str()));
    drain(&mut r);

    // An oversized result fails its invocation; the spoken reason is cut.
    let a = r.invoke(now, "ok", json!({})).unwrap();
    let b = r.invoke(now, "ok", json!({})).unwrap();
    drain(&mut r);
    r.handle_input(
        now,
        ActionInput::Result {
            invocation: a,
            outcome: ActionOutcome::Success(json!("x".repeat(MAX_ACTION_RESULT_BYTES))),
        },
    )
    .unwrap();
    let long_reason = ErrorPayload::new(ErrorCode::ExecutionFailed, "z".repeat(1000));
    r.handle_input(
        now,
        ActionInput::Result {
            invocation: b,
            outcome: ActionOutcome::Failure(long_reason),
        },
    )
    .unwrap();
    let out = drain(&mut r);
    let [ActionOutput::Result(ra), ActionOutput::Result(rb)] = &out[..] else {
        panic!("{out:?}")
    };
    assert!(
        matches!(&ra.outcome, ActionOutcome::Failure(p) if p.code == ErrorCode::ExecutionFailed)
    );
    let fallback = rb.fallback.as_deref().unwrap();
    assert_eq!(
        fallback.matches('z').count(),
        MAX_FALLBACK_REASON_CHARS,
        "{fallback}"
    );
}

#[test]
fn a_cancelled_invocation_has_no_timeout_and_refuses_its_result() {
    let now = Instant::now();
    let mut r = declared(now);
    drain(&mut r);
    let a = r.invoke(now, "open_settings", json!({})).unwrap();
    let b = r.invoke(now, "open_settings", json!({})).unwrap();
    drain(&mut r);
    assert!(r.cancel(a));
    assert!(!r.cancel(a));
    assert_eq!(r.pending(), 1);
    assert_eq!(
        r.handle_input(
            now,
            ActionInput::Result {
                invocation: a,
                outcome: ActionOutcome::Success(json!(null))
            }
        ),
        Err(ActionError::UnknownInvocation(a))
    );
    assert_eq!(r.cancel_all(), [b]);
    assert_eq!(r.poll_timeout(), None);
    r.handle_timeout(now + Duration::from_secs(60));
    assert!(drain(&mut r).is_empty());
}
