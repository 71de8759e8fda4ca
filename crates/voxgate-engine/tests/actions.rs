//! The client's VIP action registry (§5.3) through the engine: declared actions offered as
//! tools, the narrated state in the model's context, `action.invoke` / `action.result`, the
//! deterministic fallback on failure and timeout, and invocations cut off with their reply.

#![allow(clippy::unwrap_used, clippy::panic)] // test helpers may unwrap and panic

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use voxgate_engine::history::Content;
use voxgate_engine::provider::{ChatRole, ContextMessage, ProviderEvent};
use voxgate_engine::{
    Action, ActionConfig, ActionOutcome, ClientEvent, EngineConfig, ErrorCode, ErrorPayload, Input,
    InvocationId, Output, ProviderRequest, RequestId, State, ToolDefinition, TriggerMode, TurnId,
};

fn config() -> EngineConfig {
    EngineConfig {
        output_audio: None,
        system_prompt: "You drive the app.".into(),
        actions: ActionConfig {
            timeout: Duration::from_secs(5),
            ..ActionConfig::default()
        },
        ..EngineConfig::default()
    }
}

fn text(t: &str) -> Input {
    Input::Text {
        text: t.into(),
        mode: TriggerMode::Queue,
    }
}

fn open_settings() -> Action {
    Action {
        id: "open_settings".into(),
        description: "Open the settings page".into(),
        parameters: json!({"type": "object", "properties": {}}),
    }
}

fn set_quantity() -> Action {
    Action {
        id: "cart.set_quantity".into(),
        description: "Set the quantity field".into(),
        parameters: json!({
            "type": "object",
            "properties": {"value": {"type": "integer", "minimum": 1}},
            "required": ["value"]
        }),
    }
}

/// A session with both actions declared and a narrated state.
fn session() -> Driver {
    let mut d = Driver::new(config());
    let out = d.input(Input::SetActions(vec![open_settings(), set_quantity()]));
    assert!(client(&out).is_empty(), "{out:?}");
    d.input(Input::NarratedState(
        "Home page; the cart holds 2 items.".into(),
    ));
    d
}

fn messages_of(req: &ProviderRequest) -> &[ContextMessage] {
    match req {
        ProviderRequest::Generate { messages, .. } => messages,
        _ => unreachable!(),
    }
}

fn tool_names(req: &ProviderRequest) -> Vec<String> {
    match req {
        ProviderRequest::Generate { tools, .. } => tools.iter().map(|t| t.name.clone()).collect(),
        _ => unreachable!(),
    }
}

fn call(id: RequestId, call_id: &str, name: &str, arguments: serde_json::Value) -> ProviderEvent {
    ProviderEvent::ToolCall {
        id,
        call_id: call_id.into(),
        name: name.into(),
        arguments,
    }
}

/// The `(invocation, action_id, parameters)` of every `ActionInvoke` among `out`.
fn invokes(out: &[Output]) -> Vec<(InvocationId, String, serde_json::Value)> {
    client(out)
        .into_iter()
        .filter_map(|e| match e {
            ClientEvent::ActionInvoke {
                invocation,
                action_id,
                parameters,
                ..
            } => Some((invocation, action_id, parameters)),
            _ => None,
        })
        .collect()
}

fn fragments(out: &[Output]) -> String {
    client(out)
        .into_iter()
        .filter_map(|e| match e {
            ClientEvent::TextFragment { text, .. } => Some(text),
            _ => None,
        })
        .collect()
}

fn generates(out: &[Output]) -> usize {
    requests(out)
        .iter()
        .filter(|r| matches!(r, ProviderRequest::Generate { .. }))
        .count()
}

/// The user asks, the model calls `open_settings`: the invocation's id.
fn invoke_open_settings(d: &mut Driver) -> (InvocationId, TurnId) {
    let (id, _) = generate(&d.input(text("Open the settings.")));
    let mut out = d.provider(call(id, "call-1", "open_settings", json!({})));
    out.extend(d.provider(done(id)));
    let inv = invokes(&out);
    assert_eq!(inv.len(), 1, "{out:#?}");
    assert_eq!(inv[0].1, "open_settings");
    assert_eq!(inv[0].2, json!({}));
    let turn = client(&out)
        .into_iter()
        .find_map(|e| match e {
            ClientEvent::ActionInvoke { turn, .. } => Some(turn),
            _ => None,
        })
        .unwrap();
    assert_eq!(d.engine.state(), State::Action);
    (inv[0].0, turn)
}

#[test]
fn declared_actions_are_tools_and_a_call_round_trips_through_the_client() {
    let mut d = session();
    let names: Vec<String> = d.engine.llm_tools().into_iter().map(|t| t.name).collect();
    // In id order.
    assert_eq!(names, ["cart_set_quantity", "open_settings"]);

    let (id, req) = generate(&d.input(text("Set the quantity to 3.")));
    assert_eq!(tool_names(&req), ["cart_set_quantity", "open_settings"]);
    // Chat APIs hand arguments over as a JSON string.
    let mut out = d.provider(call(
        id,
        "call-1",
        "cart_set_quantity",
        json!("{\"value\":3}"),
    ));
    out.extend(d.provider(done(id)));
    let turn = d.engine.history()[1].turn.unwrap();
    let invocation = match &client(&out)[..] {
        [
            ClientEvent::ResponseBegin { .. },
            ClientEvent::ActionInvoke {
                invocation,
                action_id,
                parameters,
                turn: t,
            },
            ClientEvent::ResponseEnd { .. },
        ] => {
            assert_eq!(action_id, "cart.set_quantity");
            assert_eq!(parameters, &json!({"value": 3}));
            assert_eq!(*t, turn);
            *invocation
        }
        other => panic!("{other:#?}"),
    };
    assert_eq!(d.engine.state(), State::Action);
    assert_eq!(generates(&out), 0, "the model waits for the result");

    let out = d.input(Input::ActionResult {
        invocation,
        outcome: ActionOutcome::Success(json!({"quantity": 3})),
    });
    let (id2, req) = generate(&out);
    let messages = messages_of(&req);
    let n = messages.len();
    assert_eq!(messages[n - 2].role, ChatRole::Assistant);
    assert_eq!(messages[n - 2].tool_calls[0].name, "cart_set_quantity");
    assert_eq!(messages[n - 1].role, ChatRole::Tool);
    assert_eq!(messages[n - 1].tool_call_id.as_deref(), Some("call-1"));
    let result: serde_json::Value = serde_json::from_str(&messages[n - 1].content).unwrap();
    assert_eq!(
        result,
        json!({"status": "success", "data": {"quantity": 3}})
    );

    // The model confirms (VIP: Action_Complete → Processing for confirmation speech).
    let mut out = d.provider(delta(id2, "Done, three it is."));
    out.extend(d.provider(done(id2)));
    assert_eq!(fragments(&out), "Done, three it is.");
    assert_eq!(d.engine.state(), State::Idle);
    assert_eq!(
        d.engine.history().last().unwrap().text(),
        "Done, three it is."
    );
}

#[test]
fn the_narrated_state_sits_right_before_the_newest_user_turn_and_follows_changes() {
    let mut d = session();
    let (id, req) = generate(&d.input(text("Where am I?")));
    let messages = messages_of(&req);
    let roles: Vec<ChatRole> = messages.iter().map(|m| m.role).collect();
    assert_eq!(roles, [ChatRole::System, ChatRole::System, ChatRole::User]);
    assert_eq!(messages[0].content, "You drive the app.");
    assert!(
        messages[1]
            .content
            .ends_with("Home page; the cart holds 2 items."),
        "{}",
        messages[1].content
    );
    d.provider(delta(id, "On the home page."));
    d.provider(done(id));

    // The view changes: the next reply sees only the new state, before the new question.
    d.input(Input::NarratedState("Settings modal open.".into()));
    let (id, req) = generate(&d.input(text("And now?")));
    let messages = messages_of(&req);
    let roles: Vec<ChatRole> = messages.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [
            ChatRole::System,
            ChatRole::User,
            ChatRole::Assistant,
            ChatRole::System,
            ChatRole::User
        ]
    );
    assert!(messages[3].content.ends_with("Settings modal open."));
    assert_eq!(messages[4].content, "And now?");
    let all: String = messages.iter().map(|m| m.content.as_str()).collect();
    assert!(!all.contains("Home page"), "old state left the context");
    d.provider(done(id));
    // Never part of history.
    assert!(
        d.engine
            .history()
            .iter()
            .all(|m| !m.text().contains("modal"))
    );

    // An empty state removes it.
    d.input(Input::NarratedState(String::new()));
    let (_, req) = generate(&d.input(text("Hm?")));
    assert!(
        messages_of(&req)
            .iter()
            .all(|m| !m.content.contains("Settings modal"))
    );
}

#[test]
fn the_narrated_state_counts_in_the_context_budget() {
    let mut d = Driver::new(EngineConfig {
        max_context_chars: 400,
        ..config()
    });
    let (id, _) = generate(&d.input(text(&"a".repeat(100))));
    d.provider(delta(id, &"b".repeat(100)));
    d.provider(done(id));
    // Without a state, both exchanges fit.
    let (id, req) = generate(&d.input(text("c")));
    assert_eq!(messages_of(&req).len(), 4);
    d.provider(done(id));
    // A long state pushes the oldest exchange out.
    d.input(Input::NarratedState("x".repeat(250)));
    let out = d.input(text("d"));
    let (_, req) = generate(&out);
    let messages = messages_of(&req);
    assert!(
        client(&out)
            .iter()
            .any(|e| matches!(e, ClientEvent::ContextTruncated { .. }))
    );
    assert!(messages.iter().all(|m| !m.content.starts_with("aaa")));
    assert!(messages.iter().any(|m| m.content.ends_with("xxx")));
}

#[test]
fn a_failed_action_is_reported_to_the_model_and_the_fallback_is_said_verbatim() {
    let mut d = session();
    let (invocation, _) = invoke_open_settings(&mut d);
    let out = d.input(Input::ActionResult {
        invocation,
        outcome: ActionOutcome::Failure(ErrorPayload::new(
            ErrorCode::ExecutionFailed,
            "the button no longer exists",
        )),
    });
    assert_eq!(
        generates(&out),
        0,
        "the fallback is not the model's to phrase"
    );
    assert_eq!(
        fragments(&out),
        "Sorry, I couldn't do open settings: the button no longer exists."
    );
    assert_eq!(d.engine.state(), State::Idle);
    let h = d.engine.history();
    let result = h
        .iter()
        .flat_map(|m| &m.content)
        .find_map(|c| match c {
            Content::ToolResult { id, result } if id == "call-1" => Some(result.clone()),
            _ => None,
        })
        .unwrap();
    assert!(result.contains("execution_failed"), "{result}");
    assert_eq!(
        h.last().unwrap().text(),
        "Sorry, I couldn't do open settings: the button no longer exists."
    );

    // The next turn is the model's again, with the failure in its context.
    let (_, req) = generate(&d.input(text("Try again.")));
    let messages = messages_of(&req);
    assert!(
        messages
            .iter()
            .any(|m| m.role == ChatRole::Tool && m.content.contains("execution_failed"))
    );
}

#[test]
fn the_fallback_is_spoken_when_replies_are_spoken() {
    let mut d = Driver::new(EngineConfig {
        output_audio: Some(voxgate_engine::OutputAudio {
            bytes_per_second: 32_000,
        }),
        ..config()
    });
    d.input(Input::SetActions(vec![open_settings()]));
    let (invocation, _) = invoke_open_settings(&mut d);
    let out = d.input(Input::ActionResult {
        invocation,
        outcome: ActionOutcome::Failure(ErrorPayload::new(
            ErrorCode::Other("refused".into()),
            "the user is not signed in",
        )),
    });
    let s = synth(&out);
    assert_eq!(s.len(), 1, "{out:#?}");
    assert_eq!(
        s[0].1,
        "Sorry, I couldn't do open settings: the user is not signed in."
    );
}

#[test]
fn an_action_without_a_result_times_out_on_the_engine_clock() {
    let mut d = session();
    let (invocation, _) = invoke_open_settings(&mut d);
    let deadline = d.engine.poll_timeout().unwrap();
    assert_eq!(deadline - d.now, Duration::from_secs(5));
    assert!(d.advance(Duration::from_millis(4_999)).is_empty());
    assert_eq!(d.engine.state(), State::Action);
    let out = d.advance(Duration::from_millis(1));
    let events = client(&out);
    assert!(events.iter().any(|e| matches!(
        e,
        ClientEvent::ActionCancelled { invocation: i, reason } if *i == invocation && reason.code == ErrorCode::Timeout
    )));
    assert_eq!(generates(&out), 0);
    assert_eq!(
        fragments(&out),
        "Sorry, I couldn't do open settings: the app did not respond in time."
    );
    assert_eq!(d.engine.state(), State::Idle);
    // The result after the deadline is refused, not applied.
    let out = d.input(Input::ActionResult {
        invocation,
        outcome: ActionOutcome::Success(json!(null)),
    });
    assert!(matches!(
        &client(&out)[..],
        [ClientEvent::ActionError { invocation: Some(i), .. }] if *i == invocation
    ));
    assert_eq!(generates(&out), 0);
}

#[test]
fn invalid_parameters_and_unknown_actions_go_back_to_the_model_not_the_client() {
    let mut d = session();
    let (id, _) = generate(&d.input(text("Set the quantity to zero.")));
    let mut out = d.provider(call(id, "c1", "cart_set_quantity", json!({"value": 0})));
    out.extend(d.provider(call(id, "c2", "delete_account", json!({}))));
    out.extend(d.provider(done(id)));
    assert!(invokes(&out).is_empty(), "nothing reaches the client");
    // The model gets the error payloads and may correct itself (no fallback: the model erred,
    // not the app).
    let (id2, req) = generate(&out);
    let results: Vec<&str> = messages_of(&req)
        .iter()
        .filter(|m| m.role == ChatRole::Tool)
        .map(|m| m.content.as_str())
        .collect();
    assert_eq!(results.len(), 2);
    assert!(results[0].contains("invalid_arguments"), "{}", results[0]);
    assert!(results[1].contains("unknown_tool"), "{}", results[1]);
    let mut out = d.provider(call(id2, "c3", "cart_set_quantity", json!({"value": 1})));
    out.extend(d.provider(done(id2)));
    assert_eq!(invokes(&out).len(), 1);
}

#[test]
fn an_invocation_cut_off_by_an_abort_is_dropped_and_its_late_result_refused() {
    let mut d = session();
    let (invocation, _) = invoke_open_settings(&mut d);
    let out = d.input(Input::Abort);
    assert!(client(&out).iter().any(|e| matches!(
        e,
        ClientEvent::ActionCancelled { invocation: i, .. } if *i == invocation
    )));
    assert_eq!(d.engine.state(), State::Idle);
    assert_eq!(d.engine.poll_timeout(), None, "no timer left for it");
    let out = d.input(Input::ActionResult {
        invocation,
        outcome: ActionOutcome::Failure(ErrorPayload::new(ErrorCode::ExecutionFailed, "late")),
    });
    assert!(matches!(
        &client(&out)[..],
        [ClientEvent::ActionError { invocation: Some(i), error, .. }]
            if *i == invocation && error.code == ErrorCode::Other("unknown_invocation".into())
    ));
    assert!(requests(&out).is_empty());
    // History answers the call ("cancelled"), and the next turn starts clean: no fallback.
    assert!(d.engine.history().iter().flat_map(|m| &m.content).any(
        |c| matches!(c, Content::ToolResult { id, result } if id == "call-1" && result.contains("cancelled"))
    ));
    let (id, _) = generate(&d.input(text("Never mind.")));
    let out = d.provider(delta(id, "OK."));
    assert_eq!(fragments(&out), "OK.");
}

#[test]
fn a_result_for_an_invocation_never_issued_is_refused() {
    let mut d = session();
    let out = d.input(Input::ActionResult {
        invocation: InvocationId(42),
        outcome: ActionOutcome::Success(json!(1)),
    });
    assert!(matches!(
        &client(&out)[..],
        [ClientEvent::ActionError {
            invocation: Some(InvocationId(42)),
            ..
        }]
    ));
    assert_eq!(d.engine.state(), State::Idle);
}

#[test]
fn actions_replaced_mid_session_change_the_offered_tools_and_keep_invocations_in_flight() {
    let mut d = session();
    let (invocation, _) = invoke_open_settings(&mut d);
    // The view changed while the action ran: a new action map, without open_settings.
    d.input(Input::SetActions(vec![Action {
        id: "close_settings".into(),
        description: "Close the settings page".into(),
        parameters: json!({"type": "object"}),
    }]));
    d.input(Input::NarratedState("Settings page.".into()));
    let names: Vec<String> = d.engine.llm_tools().into_iter().map(|t| t.name).collect();
    assert_eq!(names, ["close_settings"]);
    // The invocation sent before still finishes, and the follow-up sees the new tools and state.
    let out = d.input(Input::ActionResult {
        invocation,
        outcome: ActionOutcome::Success(json!(null)),
    });
    let (id, req) = generate(&out);
    assert_eq!(tool_names(&req), ["close_settings"]);
    assert!(
        messages_of(&req)
            .iter()
            .any(|m| m.role == ChatRole::System && m.content.ends_with("Settings page."))
    );
    // A call of the removed action is refused.
    let mut out = d.provider(call(id, "c9", "open_settings", json!({})));
    out.extend(d.provider(done(id)));
    assert!(invokes(&out).is_empty());

    // Removing every action.
    d.input(Input::SetActions(Vec::new()));
    assert!(d.engine.llm_tools().is_empty());
}

#[test]
fn actions_and_client_tools_live_side_by_side() {
    let mut d = session();
    d.input(Input::SetTools(vec![ToolDefinition {
        name: "weather.get".into(),
        description: "Weather".into(),
        parameters: json!({"type": "object"}),
    }]));
    let names: Vec<String> = d.engine.llm_tools().into_iter().map(|t| t.name).collect();
    assert_eq!(names, ["weather_get", "cart_set_quantity", "open_settings"]);
    // Declaring actions again leaves the client's tools alone, and vice versa.
    d.input(Input::SetActions(vec![open_settings()]));
    d.input(Input::SetTools(Vec::new()));
    let names: Vec<String> = d.engine.llm_tools().into_iter().map(|t| t.name).collect();
    assert_eq!(names, ["open_settings"]);
    // An action's call id is not a tool call the client may answer.
    let (id, _) = generate(&d.input(text("Settings.")));
    d.provider(call(id, "call-1", "open_settings", json!({})));
    assert!(
        d.try_input(Input::ToolResult {
            id: "call-1".into(),
            result: "x".into()
        })
        .is_err()
    );
}

#[test]
fn oversized_declarations_and_states_are_refused_and_the_previous_ones_stay() {
    let mut d = session();
    let many: Vec<Action> = (0..=voxgate_mcp::action::MAX_ACTIONS)
        .map(|i| Action {
            id: format!("a{i}"),
            description: String::new(),
            parameters: json!({"type": "object"}),
        })
        .collect();
    let out = d.input(Input::SetActions(many));
    assert!(matches!(
        &client(&out)[..],
        [ClientEvent::ActionError { error, .. }] if error.code == ErrorCode::Other("too_large".into())
    ));
    assert_eq!(d.engine.llm_tools().len(), 2);

    // One action over a per-action maximum, one whose schema does not compile: left out.
    let out = d.input(Input::SetActions(vec![
        open_settings(),
        Action {
            id: "long".into(),
            description: "d".repeat(voxgate_mcp::registry::MAX_TOOL_DESCRIPTION_BYTES + 1),
            parameters: json!({"type": "object"}),
        },
        Action {
            id: "broken".into(),
            description: String::new(),
            parameters: json!({"type": 3}),
        },
    ]));
    let refused: Vec<Option<String>> = client(&out)
        .into_iter()
        .filter_map(|e| match e {
            ClientEvent::ActionError { action, .. } => Some(action),
            _ => None,
        })
        .collect();
    assert_eq!(refused, [Some("long".into()), Some("broken".into())]);
    assert_eq!(d.engine.llm_tools().len(), 1);

    let out = d.input(Input::NarratedState(
        "x".repeat(voxgate_mcp::action::MAX_NARRATED_STATE_BYTES + 1),
    ));
    assert!(matches!(
        &client(&out)[..],
        [ClientEvent::ActionError { .. }]
    ));
    let (_, req) = generate(&d.input(text("Where?")));
    assert!(
        messages_of(&req)
            .iter()
            .any(|m| m.content.ends_with("Home page; the cart holds 2 items."))
    );
}

#[test]
fn an_oversized_result_fails_the_action() {
    let mut d = session();
    let (invocation, _) = invoke_open_settings(&mut d);
    let out = d.input(Input::ActionResult {
        invocation,
        outcome: ActionOutcome::Success(json!(
            "r".repeat(voxgate_mcp::action::MAX_ACTION_RESULT_BYTES)
        )),
    });
    assert!(fragments(&out).starts_with("Sorry, I couldn't do open settings: the app's result"));
    let result = d
        .engine
        .history()
        .iter()
        .flat_map(|m| &m.content)
        .find_map(|c| match c {
            Content::ToolResult { id, result } if id == "call-1" => Some(result.len()),
            _ => None,
        })
        .unwrap();
    assert!(result < 1_000);
}

#[test]
fn close_forgets_invocations_in_flight() {
    let mut d = session();
    let (invocation, _) = invoke_open_settings(&mut d);
    d.input(Input::Close);
    assert_eq!(d.engine.poll_timeout(), None);
    assert!(
        d.try_input(Input::ActionResult {
            invocation,
            outcome: ActionOutcome::Success(json!(null)),
        })
        .is_err()
    );
}

#[test]
fn one_failure_among_several_actions_makes_the_follow_up_the_fallback() {
    let mut d = session();
    let (id, _) = generate(&d.input(text("Open settings and set the quantity to 2.")));
    let mut out = d.provider(call(id, "c1", "open_settings", json!({})));
    out.extend(d.provider(call(id, "c2", "cart_set_quantity", json!({"value": 2}))));
    out.extend(d.provider(done(id)));
    let inv = invokes(&out);
    assert_eq!(inv.len(), 2);
    let out = d.input(Input::ActionResult {
        invocation: inv[1].0,
        outcome: ActionOutcome::Success(json!(null)),
    });
    assert!(requests(&out).is_empty(), "waits for the other action");
    assert_eq!(d.engine.state(), State::Action);
    let out = d.input(Input::ActionResult {
        invocation: inv[0].0,
        outcome: ActionOutcome::Failure(ErrorPayload::new(ErrorCode::ExecutionFailed, "locked")),
    });
    assert_eq!(generates(&out), 0);
    assert_eq!(
        fragments(&out),
        "Sorry, I couldn't do open settings: locked."
    );
    // Both results are in the model's next context.
    let (_, req) = generate(&d.input(text("Well?")));
    let results: Vec<&str> = messages_of(&req)
        .iter()
        .filter(|m| m.role == ChatRole::Tool)
        .map(|m| m.content.as_str())
        .collect();
    assert_eq!(results.len(), 2);
}

#[test]
fn a_new_user_turn_barging_in_cancels_the_invocation_and_is_answered_by_the_model() {
    let mut d = session();
    let (invocation, _) = invoke_open_settings(&mut d);
    let out = d.input(Input::Text {
        text: "No, wait, go home.".into(),
        mode: TriggerMode::Immediate,
    });
    assert!(client(&out).iter().any(|e| matches!(
        e,
        ClientEvent::ActionCancelled { invocation: i, .. } if *i == invocation
    )));
    let (id, req) = generate(&out);
    let messages = messages_of(&req);
    assert_eq!(messages.last().unwrap().content, "No, wait, go home.");
    // The cancelled call is answered in the context, so the model knows it did not finish.
    assert!(
        messages
            .iter()
            .any(|m| m.role == ChatRole::Tool && m.content.contains("cancelled"))
    );
    // The late result is refused and does not touch the new reply.
    let out = d.input(Input::ActionResult {
        invocation,
        outcome: ActionOutcome::Success(json!(null)),
    });
    assert!(matches!(
        &client(&out)[..],
        [ClientEvent::ActionError { .. }]
    ));
    assert!(requests(&out).is_empty());
    let out = d.provider(delta(id, "Going home."));
    assert_eq!(fragments(&out), "Going home.");
}
