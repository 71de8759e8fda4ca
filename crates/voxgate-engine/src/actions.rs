//! The actions machine: the client's VIP action registry (§5.3) wired into the conversation.
//!
//! The client declares its actions ([`crate::Input::SetActions`]) and narrates its current view
//! ([`crate::Input::NarratedState`]); the registry itself is
//! [`voxgate_mcp::action::ActionRegistry`], a pure machine. This part owns it and translates:
//!
//! - **Declared actions are tools.** Each goes into the tool registry under
//!   [`ToolSource::Action`](voxgate_mcp::registry::ToolSource::Action) (VIP: the registry "acts
//!   as the Tool Definition for the LLM"), so the model sees it with an LLM-safe name next to
//!   the client's, the device's and the server's tools, and its arguments are checked against
//!   the schema before anything else happens.
//! - **The narrated state is context, not history.** The newest one goes into every reply's
//!   context as one system message right before the newest user turn (at the end when there is
//!   none yet): VIP says the runtime "cannot guess the application state" and must be told the
//!   *current* view, so it sits next to the request it is about, it is counted in the context
//!   budget, and it never piles up in history (each reply sees only the newest). Keeping it out
//!   of the system prompt keeps the prompt, and every earlier message, an unchanged prefix for
//!   provider-side prompt caches when the view changes.
//! - **Invocation flow (§5.3.3).** A model's call of an action is validated again by the action
//!   registry and becomes [`ClientEvent::ActionInvoke`]; the client's `action.result`
//!   ([`crate::Input::ActionResult`]) becomes the call's result for the model. A call the
//!   registries refuse (unknown action, parameters that break the schema) never reaches the
//!   client: the model gets the standard error payload as the result and may correct itself in
//!   the follow-up reply, as for any refused tool call.
//! - **Deterministic fallback (§5.5.2).** When the client reports a failure, or no result comes
//!   within [`voxgate_mcp::action::ActionConfig::timeout`], the model gets the error payload as
//!   the result and the runtime "informs the user verbally" with the registry's fallback
//!   sentence: the follow-up response speaks the fallback sentence(s) verbatim instead of
//!   asking the model, so what the user hears about a failure never depends on the model. (A
//!   success follows VIP's `Action_Complete → Processing`: the model generates the
//!   confirmation.) When one reply's calls both fail and succeed, the follow-up speaks only the
//!   fallback; the successes are in the model's context for the next turn.
//! - **Interruption.** An action call is cancelled with the reply that made it (barge-in,
//!   abort, close): the invocation is forgotten, the client is told with
//!   [`ClientEvent::ActionCancelled`], history gets a "cancelled" result, and a late result is
//!   refused with [`ClientEvent::ActionError`]; it never reaches a finished turn.
//!
//! Bounded: the registry bounds declarations, narrated state and results
//! ([`voxgate_mcp::action::MAX_ACTIONS`], [`voxgate_mcp::action::MAX_NARRATED_STATE_BYTES`],
//! [`voxgate_mcp::action::MAX_ACTION_RESULT_BYTES`], the tool registry's per-tool maxima);
//! invocations come from the model's calls, never from the client, and leave the table when
//! answered, timed out or cancelled.

use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use serde_json::Value;
use voxgate_mcp::action::{
    Action, ActionConfig, ActionError, ActionInput, ActionOutcome, ActionOutput, ActionRegistry,
    InvocationId,
};
use voxgate_mcp::model::Tool;
use voxgate_mcp::registry::RejectedTool;
use voxgate_mcp::schema::{ErrorCode, ErrorPayload};

use crate::history::context_chars;
use crate::provider::{ChatRole, ContextMessage};
use crate::telemetry::ToolOutcome;
use crate::types::{ClientEvent, TurnId};

/// What introduces the narrated state in the model's context.
pub(crate) const NARRATED_STATE_HEADER: &str = "The app's current view, as the app describes it (the actions you can take in it are your \
     tools):\n";

/// An invocation awaiting the client.
#[derive(Debug)]
struct Pending {
    /// The model's call id (history and the turn machine know the call by it).
    call_id: String,
    /// The response that invoked it.
    turn: TurnId,
}

/// What the actions machine reports.
#[derive(Debug, PartialEq)]
pub(crate) enum ActionsEvent {
    /// Send to the client.
    Client(ClientEvent),
    /// The declared actions changed: offer these as the action tools.
    Tools(Vec<Tool>),
    /// An invocation ended (the client answered, or it timed out).
    Finished {
        /// The model's call id.
        call_id: String,
        /// The result for the model.
        text: String,
        /// How it ended (a failure or a timeout are not `Ok`).
        outcome: ToolOutcome,
    },
}

/// The action registry, the invocations in flight and the fallback sentences to say.
#[derive(Debug)]
pub(crate) struct Actions {
    registry: ActionRegistry,
    pending: BTreeMap<InvocationId, Pending>,
    /// Fallback sentences of invocations that failed since the last response started; the
    /// follow-up response says them.
    fallbacks: Vec<String>,
    queued: VecDeque<ActionsEvent>,
}

impl Actions {
    /// No actions, no narrated state.
    pub(crate) fn new(config: ActionConfig) -> Self {
        Self {
            registry: ActionRegistry::new(config),
            pending: BTreeMap::new(),
            fallbacks: Vec::new(),
            queued: VecDeque::new(),
        }
    }

    /// Replaces the declared actions.
    pub(crate) fn declare(&mut self, now: Instant, actions: Vec<Action>) {
        let result = self
            .registry
            .handle_input(now, ActionInput::Declare(actions));
        self.refused(result);
    }

    /// Sets the narrated state (empty: none).
    pub(crate) fn narrate(&mut self, now: Instant, text: String) {
        let result = self
            .registry
            .handle_input(now, ActionInput::NarratedState(text));
        self.refused(result);
    }

    /// The client's `action.result`.
    pub(crate) fn result(
        &mut self,
        now: Instant,
        invocation: InvocationId,
        outcome: ActionOutcome,
    ) {
        let result = self.registry.handle_input(
            now,
            ActionInput::Result {
                invocation,
                outcome,
            },
        );
        self.refused(result);
    }

    /// Reports what the registry refused from the client.
    fn refused(&mut self, result: Result<(), ActionError>) {
        let Err(e) = result else { return };
        let (invocation, code) = match &e {
            ActionError::UnknownInvocation(i) => (Some(*i), "unknown_invocation"),
            ActionError::TooManyActions { .. } | ActionError::NarratedStateTooLarge { .. } => {
                (None, "too_large")
            }
            _ => (None, "refused"),
        };
        self.queued
            .push_back(ActionsEvent::Client(ClientEvent::ActionError {
                invocation,
                action: None,
                error: ErrorPayload::new(ErrorCode::Other(code.to_owned()), e.to_string()),
            }));
    }

    /// Reports actions the tool registry left out (e.g. too many tools over all sources).
    pub(crate) fn tools_rejected(&mut self, rejected: Vec<RejectedTool>) {
        for r in rejected {
            self.queued.push_back(rejected_event(r));
        }
    }

    /// Invokes a declared action for the model's call `call_id` of response `turn`. On refusal
    /// (the action is not declared, the parameters break its schema) nothing reaches the client
    /// and the error payload for the model is returned.
    pub(crate) fn invoke(
        &mut self,
        now: Instant,
        call_id: &str,
        turn: TurnId,
        action_id: &str,
        parameters: Value,
    ) -> Result<(), String> {
        match self.registry.invoke(now, action_id, parameters) {
            Ok(invocation) => {
                self.pending.insert(
                    invocation,
                    Pending {
                        call_id: call_id.to_owned(),
                        turn,
                    },
                );
                Ok(())
            }
            Err(rejected) => Err(rejected.payload.to_value().to_string()),
        }
    }

    /// The turn machine gave up on call `call_id` (its reply was cut off): forgets its
    /// invocation, if it is one, and tells the client.
    pub(crate) fn cancel_call(&mut self, call_id: &str) {
        let Some(invocation) = self
            .pending
            .iter()
            .find_map(|(i, p)| (p.call_id == call_id).then_some(*i))
        else {
            return;
        };
        self.pending.remove(&invocation);
        self.registry.cancel(invocation);
        self.queued
            .push_back(ActionsEvent::Client(ClientEvent::ActionCancelled {
                invocation,
                reason: ErrorPayload::new(
                    ErrorCode::Other("cancelled".to_owned()),
                    "the reply that invoked the action was cut off",
                ),
            }));
    }

    /// The session is over: forgets every invocation and fallback, silently.
    pub(crate) fn close(&mut self) {
        self.registry.cancel_all();
        self.pending.clear();
        self.fallbacks.clear();
        self.queued.clear();
    }

    /// When the next invocation times out.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.registry.poll_timeout()
    }

    /// Times out the invocations due at `now`.
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        self.registry.handle_timeout(now);
    }

    /// Whether an invocation awaits the client.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.pending.len()
    }

    /// The fallback sentences of the failures since the last response started, joined, taken.
    /// Called at every response start, so a fallback never outlives the follow-up it was for.
    pub(crate) fn take_fallback(&mut self) -> Option<String> {
        if self.fallbacks.is_empty() {
            return None;
        }
        Some(std::mem::take(&mut self.fallbacks).join(" "))
    }

    /// The narrated state's message for the model, if there is one.
    pub(crate) fn narrated_message(&self) -> Option<ContextMessage> {
        let state = self.registry.narrated_state()?.trim();
        if state.is_empty() {
            return None;
        }
        Some(ContextMessage::new(
            ChatRole::System,
            format!("{NARRATED_STATE_HEADER}{state}"),
        ))
    }

    /// How many characters of the context budget the narrated state takes.
    pub(crate) fn narrated_chars(&self) -> usize {
        self.narrated_message().as_ref().map_or(0, context_chars)
    }

    /// Puts the narrated state into a reply's context: right before the newest user message,
    /// or last when there is none.
    pub(crate) fn add_narrated(&self, messages: &mut Vec<ContextMessage>) {
        let Some(message) = self.narrated_message() else {
            return;
        };
        let at = messages
            .iter()
            .rposition(|m| m.role == ChatRole::User)
            .unwrap_or(messages.len());
        messages.insert(at, message);
    }

    /// The next thing to act on.
    pub(crate) fn poll(&mut self) -> Option<ActionsEvent> {
        loop {
            if let Some(event) = self.queued.pop_front() {
                return Some(event);
            }
            match self.registry.poll_output()? {
                ActionOutput::RegistryChanged { rejected } => {
                    self.queued
                        .push_back(ActionsEvent::Tools(self.registry.tools()));
                    self.tools_rejected(rejected);
                }
                ActionOutput::Invoke(invoke) => {
                    let Some(p) = self.pending.get(&invoke.invocation) else {
                        continue;
                    };
                    return Some(ActionsEvent::Client(ClientEvent::ActionInvoke {
                        invocation: invoke.invocation,
                        action_id: invoke.action_id,
                        parameters: invoke.parameters,
                        turn: p.turn,
                    }));
                }
                ActionOutput::Result(r) => {
                    let Some(p) = self.pending.remove(&r.invocation) else {
                        continue;
                    };
                    let (text, outcome) = match r.outcome {
                        ActionOutcome::Success(data) => (success_text(data), ToolOutcome::Ok),
                        ActionOutcome::Failure(payload) => {
                            let outcome = if payload.code == ErrorCode::Timeout {
                                self.queued.push_back(ActionsEvent::Client(
                                    ClientEvent::ActionCancelled {
                                        invocation: r.invocation,
                                        reason: payload.clone(),
                                    },
                                ));
                                ToolOutcome::Timeout
                            } else {
                                ToolOutcome::Error
                            };
                            (payload.to_value().to_string(), outcome)
                        }
                        // A future outcome kind: report it to the model as it is.
                        other => (format!("{other:?}"), ToolOutcome::Error),
                    };
                    self.fallbacks.extend(r.fallback);
                    self.queued.push_back(ActionsEvent::Finished {
                        call_id: p.call_id,
                        text,
                        outcome,
                    });
                }
                // Read when a context is built (see `narrated_message`).
                _ => {}
            }
        }
    }
}

/// The model's result for a successful action: `{"status":"success"}`, with the client's data
/// under `data` when it sent some.
fn success_text(data: Value) -> String {
    let mut result = serde_json::Map::new();
    result.insert("status".to_owned(), Value::from("success"));
    if !data.is_null() {
        result.insert("data".to_owned(), data);
    }
    Value::Object(result).to_string()
}

fn rejected_event(r: RejectedTool) -> ActionsEvent {
    let error = ErrorPayload::new(ErrorCode::Other("refused".to_owned()), r.to_string());
    let action = (!r.name.is_empty()).then_some(r.name);
    ActionsEvent::Client(ClientEvent::ActionError {
        invocation: None,
        action,
        error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    fn open_settings() -> Action {
        Action {
            id: "open_settings".into(),
            description: "Open the settings page".into(),
            parameters: json!({"type": "object", "properties": {}}),
        }
    }

    fn drain(a: &mut Actions) -> Vec<ActionsEvent> {
        std::iter::from_fn(|| a.poll()).collect()
    }

    #[test]
    fn narrated_state_goes_before_the_newest_user_message() {
        let now = Instant::now();
        let mut a = Actions::new(ActionConfig::default());
        let mut messages = vec![
            ContextMessage::new(ChatRole::System, "Be brief."),
            ContextMessage::new(ChatRole::User, "hi"),
            ContextMessage::new(ChatRole::Assistant, "hello"),
            ContextMessage::new(ChatRole::User, "open settings"),
        ];
        a.add_narrated(&mut messages);
        assert_eq!(messages.len(), 4, "no state, no message");
        a.narrate(now, "Home page".into());
        assert!(drain(&mut a).is_empty());
        assert_eq!(a.narrated_chars(), NARRATED_STATE_HEADER.len() + 9);
        a.add_narrated(&mut messages);
        assert_eq!(messages[3].role, ChatRole::System);
        assert!(messages[3].content.ends_with("Home page"));
        assert_eq!(messages[4].content, "open settings");

        let mut greeting = vec![ContextMessage::new(ChatRole::System, "Be brief.")];
        a.add_narrated(&mut greeting);
        assert_eq!(greeting.len(), 2);
        a.narrate(now, "  ".into());
        assert_eq!(a.narrated_message(), None);
    }

    #[test]
    fn invocations_map_to_calls_and_timeouts_tell_the_client() {
        let now = Instant::now();
        let mut a = Actions::new(ActionConfig {
            timeout: Duration::from_secs(2),
            ..ActionConfig::default()
        });
        a.declare(now, vec![open_settings()]);
        let events = drain(&mut a);
        assert!(matches!(&events[..], [ActionsEvent::Tools(t)] if t.len() == 1));
        a.invoke(now, "c1", TurnId(4), "open_settings", json!({}))
            .unwrap();
        let events = drain(&mut a);
        assert!(matches!(
            &events[..],
            [ActionsEvent::Client(ClientEvent::ActionInvoke {
                turn: TurnId(4),
                ..
            })]
        ));
        assert_eq!(a.poll_timeout(), Some(now + Duration::from_secs(2)));
        a.handle_timeout(now + Duration::from_secs(2));
        let events = drain(&mut a);
        assert!(matches!(
            &events[..],
            [
                ActionsEvent::Client(ClientEvent::ActionCancelled { .. }),
                ActionsEvent::Finished {
                    outcome: ToolOutcome::Timeout,
                    ..
                }
            ]
        ));
        assert!(a.take_fallback().is_some());
        assert_eq!(a.take_fallback(), None);
        assert_eq!(a.pending(), 0);
    }

    #[test]
    fn cancelled_invocations_refuse_their_late_result() {
        let now = Instant::now();
        let mut a = Actions::new(ActionConfig::default());
        a.declare(now, vec![open_settings()]);
        a.invoke(now, "c1", TurnId(2), "open_settings", json!(null))
            .unwrap();
        let invocation = match &drain(&mut a)[..] {
            [
                _,
                ActionsEvent::Client(ClientEvent::ActionInvoke { invocation, .. }),
            ] => *invocation,
            other => panic!("{other:?}"),
        };
        a.cancel_call("other");
        assert_eq!(a.pending(), 1);
        a.cancel_call("c1");
        assert_eq!(a.pending(), 0);
        assert_eq!(a.poll_timeout(), None);
        assert!(matches!(
            &drain(&mut a)[..],
            [ActionsEvent::Client(ClientEvent::ActionCancelled { .. })]
        ));
        a.result(now, invocation, ActionOutcome::Success(json!(1)));
        assert!(matches!(
            &drain(&mut a)[..],
            [ActionsEvent::Client(ClientEvent::ActionError { invocation: Some(i), .. })] if *i == invocation
        ));
        assert_eq!(a.take_fallback(), None);
    }

    #[test]
    fn refused_invocations_never_reach_the_client() {
        let now = Instant::now();
        let mut a = Actions::new(ActionConfig::default());
        a.declare(now, vec![open_settings()]);
        drain(&mut a);
        let payload = a
            .invoke(now, "c1", TurnId(2), "delete_account", json!({}))
            .unwrap_err();
        assert!(payload.contains("unknown_action"), "{payload}");
        assert!(drain(&mut a).is_empty());
        assert_eq!(a.pending(), 0);
    }

    #[test]
    fn success_text_carries_the_data() {
        assert_eq!(success_text(Value::Null), r#"{"status":"success"}"#);
        let text = success_text(json!({"page": "settings"}));
        let parsed: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            parsed,
            json!({"status": "success", "data": {"page": "settings"}})
        );
    }
}
