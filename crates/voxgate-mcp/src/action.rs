//! The action registry of VIP §5.3: client-side actions the runtime may invoke.
//!
//! The client declares its actions (id, description, parameter schema) and narrates its current
//! view; the runtime may invoke only declared actions, with parameters that pass the schema
//! (`action.invoke`), and the client answers with a success or error payload (`action.result`).
//! When an action fails, is refused, or times out, the outcome carries the standard
//! [`ErrorPayload`] and a deterministic fallback sentence for the runtime to say.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::correlation::Correlation;
use crate::jsonrpc::Id;
use crate::model::Tool;
use crate::registry::RejectedTool;
use crate::schema::{CompiledSchema, ErrorCode, ErrorPayload, Violation};

/// An action the client can perform (a button, a navigation route, an input).
#[derive(Debug, Clone, PartialEq)]
pub struct Action {
    /// Unique id, e.g. `open_settings`.
    pub id: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON Schema of its parameters.
    pub parameters: Value,
}

/// Identifies one invocation (its `action.invoke` and the matching `action.result`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InvocationId(pub u64);

/// Settings.
#[derive(Debug, Clone)]
pub struct ActionConfig {
    /// How long the client has to report a result.
    pub timeout: Duration,
    /// The fallback sentence; `{action}` and `{reason}` are replaced.
    pub fallback_template: String,
}

impl Default for ActionConfig {
    fn default() -> Self {
        ActionConfig {
            timeout: Duration::from_secs(10),
            fallback_template: "Sorry, I couldn't do {action}: {reason}.".to_owned(),
        }
    }
}

/// How an invocation ended, as the client reported it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ActionOutcome {
    /// Done; optional data for the model.
    Success(Value),
    /// Not done; the standard error payload.
    Failure(ErrorPayload),
}

/// What the client sends or the runtime learns.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ActionInput {
    /// The client's full action map (replaces the previous one).
    Declare(Vec<Action>),
    /// The client's narrated state (a textual description of its current view).
    NarratedState(String),
    /// The client's `action.result`.
    Result {
        /// Which invocation.
        invocation: InvocationId,
        /// What happened.
        outcome: ActionOutcome,
    },
}

/// `action.invoke`: tell the client to run an action.
#[derive(Debug, Clone, PartialEq)]
pub struct ActionInvoke {
    /// The invocation.
    pub invocation: InvocationId,
    /// The declared action's id.
    pub action_id: String,
    /// Validated parameters.
    pub parameters: Value,
}

impl ActionInvoke {
    /// The event's name in VIP.
    pub const EVENT: &'static str = "action.invoke";
}

/// `action.result`: the outcome of an invocation, for the runtime.
#[derive(Debug, Clone, PartialEq)]
pub struct ActionResult {
    /// The invocation.
    pub invocation: InvocationId,
    /// The action's id.
    pub action_id: String,
    /// What happened (a timeout is a failure with code `timeout`).
    pub outcome: ActionOutcome,
    /// On failure, the sentence to say to the user.
    pub fallback: Option<String>,
}

impl ActionResult {
    /// The event's name in VIP.
    pub const EVENT: &'static str = "action.result";
}

/// Outputs of the action registry.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ActionOutput {
    /// The declared actions changed: refresh the tools offered to the model from
    /// [`ActionRegistry::tools`]. Actions whose schema did not compile are listed.
    RegistryChanged {
        /// Left-out actions.
        rejected: Vec<RejectedTool>,
    },
    /// The narrated state changed: put it into the model's context.
    NarratedState(String),
    /// Send `action.invoke` to the client.
    Invoke(ActionInvoke),
    /// An `action.result` arrived (or the invocation timed out).
    Result(ActionResult),
}

/// Errors of the action registry.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ActionError {
    /// The runtime asked for an action the client did not declare (never sent to the client).
    #[error("unknown action {0:?}")]
    UnknownAction(String),
    /// Parameters do not match the action's schema (never sent to the client).
    #[error("parameters for {action:?} do not match its schema")]
    InvalidParameters {
        /// The action.
        action: String,
        /// What is wrong.
        violations: Vec<Violation>,
    },
    /// The client reported a result for an invocation that is not pending (peer fault).
    #[error("result for unknown invocation {}", .0.0)]
    UnknownInvocation(InvocationId),
}

/// An invocation refused before reaching the client, with what to tell the model and the user.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{error}")]
pub struct ActionRejected {
    /// Why.
    pub error: ActionError,
    /// The standard error payload for the model.
    pub payload: ErrorPayload,
    /// The sentence to say.
    pub fallback: String,
}

#[derive(Debug, Clone)]
struct Declared {
    action: Action,
    schema: CompiledSchema,
}

/// The sans-IO action registry machine.
#[derive(Debug)]
pub struct ActionRegistry {
    config: ActionConfig,
    actions: BTreeMap<String, Declared>,
    narrated: Option<String>,
    pending: Correlation<(InvocationId, String)>,
    next: u64,
    outputs: VecDeque<ActionOutput>,
}

impl ActionRegistry {
    /// An empty registry.
    pub fn new(config: ActionConfig) -> Self {
        ActionRegistry {
            config,
            actions: BTreeMap::new(),
            narrated: None,
            pending: Correlation::new(),
            next: 1,
            outputs: VecDeque::new(),
        }
    }

    /// Feeds what the client sent. A result for an unknown invocation (late or invented) is
    /// reported as an error and otherwise ignored.
    pub fn handle_input(&mut self, _now: Instant, input: ActionInput) -> Result<(), ActionError> {
        match input {
            ActionInput::Declare(actions) => {
                let mut rejected = Vec::new();
                self.actions.clear();
                for action in actions {
                    if self.actions.contains_key(&action.id) {
                        continue;
                    }
                    match CompiledSchema::compile(&action.parameters) {
                        Ok(schema) => {
                            self.actions
                                .insert(action.id.clone(), Declared { action, schema });
                        }
                        Err(error) => rejected.push(RejectedTool {
                            name: action.id,
                            error: error.into(),
                        }),
                    }
                }
                self.outputs
                    .push_back(ActionOutput::RegistryChanged { rejected });
            }
            ActionInput::NarratedState(text) => {
                if self.narrated.as_deref() != Some(text.as_str()) {
                    self.narrated = Some(text.clone());
                    self.outputs.push_back(ActionOutput::NarratedState(text));
                }
            }
            ActionInput::Result {
                invocation,
                outcome,
            } => {
                let (_, action_id) = self
                    .pending
                    .remove(&key(invocation))
                    .ok_or(ActionError::UnknownInvocation(invocation))?;
                let fallback = match &outcome {
                    ActionOutcome::Success(_) => None,
                    ActionOutcome::Failure(p) => Some(self.fallback(&action_id, &p.message)),
                };
                self.outputs.push_back(ActionOutput::Result(ActionResult {
                    invocation,
                    action_id,
                    outcome,
                    fallback,
                }));
            }
        }
        Ok(())
    }

    /// Invokes a declared action: validates the parameters and emits [`ActionOutput::Invoke`].
    /// `null` parameters are read as `{}`.
    pub fn invoke(
        &mut self,
        now: Instant,
        action_id: &str,
        parameters: Value,
    ) -> Result<InvocationId, Box<ActionRejected>> {
        let parameters = if parameters.is_null() {
            Value::Object(serde_json::Map::new())
        } else {
            parameters
        };
        let checked = match self.actions.get(action_id) {
            None => Err((
                ActionError::UnknownAction(action_id.to_owned()),
                ErrorPayload::new(
                    ErrorCode::UnknownAction,
                    format!("no action {action_id} is available"),
                ),
            )),
            Some(d) => d.schema.validate(&parameters).map_err(|violations| {
                let payload = ErrorPayload {
                    code: ErrorCode::InvalidArguments,
                    message: format!("parameters for {action_id} do not match its schema"),
                    details: violations.clone(),
                };
                (
                    ActionError::InvalidParameters {
                        action: action_id.to_owned(),
                        violations,
                    },
                    payload,
                )
            }),
        };
        if let Err((error, payload)) = checked {
            let fallback = self.fallback(action_id, &payload.message);
            return Err(Box::new(ActionRejected {
                error,
                payload,
                fallback,
            }));
        }
        let invocation = InvocationId(self.next);
        self.next += 1;
        // Invocation ids only grow, so they are never in flight twice.
        let _ = self.pending.insert(
            key(invocation),
            Some(now + self.config.timeout),
            (invocation, action_id.to_owned()),
        );
        self.outputs.push_back(ActionOutput::Invoke(ActionInvoke {
            invocation,
            action_id: action_id.to_owned(),
            parameters,
        }));
        Ok(invocation)
    }

    /// Fails every invocation whose deadline is at or before `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        for (_, (invocation, action_id)) in self.pending.expire(now) {
            let payload = ErrorPayload::new(ErrorCode::Timeout, "the app did not respond in time");
            let fallback = Some(self.fallback(&action_id, &payload.message));
            self.outputs.push_back(ActionOutput::Result(ActionResult {
                invocation,
                action_id,
                outcome: ActionOutcome::Failure(payload),
                fallback,
            }));
        }
    }

    /// The next output.
    pub fn poll_output(&mut self) -> Option<ActionOutput> {
        self.outputs.pop_front()
    }

    /// When [`ActionRegistry::handle_timeout`] must be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.pending.next_deadline()
    }

    /// The declared actions as tools for the [`ToolRegistry`](crate::registry::ToolRegistry)
    /// (source `Client`), in id order.
    pub fn tools(&self) -> Vec<Tool> {
        self.actions
            .values()
            .map(|d| {
                Tool::new(
                    d.action.id.clone(),
                    d.action.description.clone(),
                    d.action.parameters.clone(),
                )
            })
            .collect()
    }

    /// The current narrated state.
    pub fn narrated_state(&self) -> Option<&str> {
        self.narrated.as_deref()
    }

    /// Whether an action is declared.
    pub fn is_declared(&self, action_id: &str) -> bool {
        self.actions.contains_key(action_id)
    }

    /// Invocations awaiting a result.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    fn fallback(&self, action_id: &str, reason: &str) -> String {
        self.config
            .fallback_template
            .replace("{action}", &action_id.replace(['_', '.'], " "))
            .replace("{reason}", reason)
    }
}

fn key(invocation: InvocationId) -> Id {
    Id::Number(i64::try_from(invocation.0).unwrap_or(i64::MAX))
}
