//! The action registry of VIP §5.3: client-side actions the runtime may invoke.
//!
//! The client declares its actions (id, description, parameter schema) and narrates its current
//! view; the runtime may invoke only declared actions, with parameters that pass the schema
//! (`action.invoke`), and the client answers with a success or error payload (`action.result`).
//! When an action fails, is refused, or times out, the outcome carries the standard
//! [`ErrorPayload`] and a deterministic fallback sentence for the runtime to say.
//!
//! Everything here comes from the client, so it is bounded: at most [`MAX_ACTIONS`] actions
//! (a longer list is refused whole and the previous one stays), each within the tool
//! registry's per-tool maxima ([`MAX_TOOL_NAME_BYTES`] of id, [`MAX_TOOL_DESCRIPTION_BYTES`]
//! of description, [`MAX_TOOL_SCHEMA_BYTES`] of schema; an action over one is left out like one
//! whose schema does not compile), a narrated state of at most [`MAX_NARRATED_STATE_BYTES`]
//! (a longer one is refused and the previous one stays), and a result of at most
//! [`MAX_ACTION_RESULT_BYTES`] (a larger one ends its invocation as a failure). The reason
//! quoted in a fallback sentence is cut to [`MAX_FALLBACK_REASON_CHARS`].

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::correlation::Correlation;
use crate::jsonrpc::Id;
use crate::model::Tool;
use crate::registry::{
    MAX_TOOL_DESCRIPTION_BYTES, MAX_TOOL_NAME_BYTES, MAX_TOOL_SCHEMA_BYTES, RejectReason,
    RejectedTool,
};
use crate::schema::{CompiledSchema, ErrorCode, ErrorPayload, Violation};

/// Most actions one declaration may hold: half of the tool registry's
/// [`MAX_TOOLS`](crate::registry::MAX_TOOLS), so the device's and the server's tools keep room
/// next to them, and already more than a model chooses from well.
pub const MAX_ACTIONS: usize = 64;

/// Longest narrated state accepted, in UTF-8 bytes (about 2,000 tokens of English). It goes
/// into the model's context on every reply, so it is kept well below the context budget.
pub const MAX_NARRATED_STATE_BYTES: usize = 8 * 1024;

/// Largest `action.result` accepted, in bytes of compact JSON (the success data or the error
/// payload). It becomes the model's tool result; a larger one ends the invocation as an
/// `execution_failed` failure instead.
pub const MAX_ACTION_RESULT_BYTES: usize = 16 * 1024;

/// Most characters of a failure's reason quoted in the fallback sentence: it is spoken, and the
/// client wrote it.
pub const MAX_FALLBACK_REASON_CHARS: usize = 160;

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
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// The client reported a result for an invocation that is not pending (peer fault, or a
    /// result that arrived after a timeout or [`ActionRegistry::cancel`]).
    #[error("result for unknown invocation {}", .0.0)]
    UnknownInvocation(InvocationId),
    /// The declaration holds more than [`MAX_ACTIONS`] actions; the previous one stays.
    #[error("{count} actions declared, more than the maximum of {max}")]
    TooManyActions {
        /// Actions in the declaration.
        count: usize,
        /// [`MAX_ACTIONS`].
        max: usize,
    },
    /// The narrated state is over [`MAX_NARRATED_STATE_BYTES`]; the previous one stays.
    #[error("the narrated state is {len} bytes, more than the maximum of {max} bytes")]
    NarratedStateTooLarge {
        /// Its size in bytes.
        len: usize,
        /// [`MAX_NARRATED_STATE_BYTES`].
        max: usize,
    },
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
                if actions.len() > MAX_ACTIONS {
                    return Err(ActionError::TooManyActions {
                        count: actions.len(),
                        max: MAX_ACTIONS,
                    });
                }
                let mut rejected = Vec::new();
                self.actions.clear();
                for action in actions {
                    if self.actions.contains_key(&action.id) {
                        continue;
                    }
                    if let Err(error) = check_sizes(&action) {
                        rejected.push(RejectedTool {
                            name: action.id,
                            error,
                        });
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
                if text.len() > MAX_NARRATED_STATE_BYTES {
                    return Err(ActionError::NarratedStateTooLarge {
                        len: text.len(),
                        max: MAX_NARRATED_STATE_BYTES,
                    });
                }
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
                let outcome = bounded(outcome);
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

    /// Forgets a pending invocation without a result (the runtime gave up on it, e.g. the
    /// user interrupted the reply that asked for it): no output, and a later `action.result`
    /// for it is refused as [`ActionError::UnknownInvocation`]. False when it was not pending.
    pub fn cancel(&mut self, invocation: InvocationId) -> bool {
        self.pending.remove(&key(invocation)).is_some()
    }

    /// Forgets every pending invocation (the session is over); returns them.
    pub fn cancel_all(&mut self) -> Vec<InvocationId> {
        self.pending
            .drain()
            .into_iter()
            .map(|(_, (i, _))| i)
            .collect()
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
    /// (source [`ToolSource::Action`](crate::registry::ToolSource::Action)), in id order.
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
        let reason = reason.trim().trim_end_matches('.');
        let reason: String = reason.chars().take(MAX_FALLBACK_REASON_CHARS).collect();
        self.config
            .fallback_template
            .replace("{action}", &action_id.replace(['_', '.'], " "))
            .replace("{reason}", &reason)
    }
}

/// The tool registry's per-tool maxima, applied to an action (cheapest first).
fn check_sizes(action: &Action) -> Result<(), RejectReason> {
    let too_large = |what, len, max| RejectReason::TooLarge { what, len, max };
    if action.id.len() > MAX_TOOL_NAME_BYTES {
        return Err(too_large("name", action.id.len(), MAX_TOOL_NAME_BYTES));
    }
    if action.description.len() > MAX_TOOL_DESCRIPTION_BYTES {
        return Err(too_large(
            "description",
            action.description.len(),
            MAX_TOOL_DESCRIPTION_BYTES,
        ));
    }
    let schema = json_bytes(&action.parameters);
    if schema > MAX_TOOL_SCHEMA_BYTES {
        return Err(too_large("schema", schema, MAX_TOOL_SCHEMA_BYTES));
    }
    Ok(())
}

/// An outcome within [`MAX_ACTION_RESULT_BYTES`], or the failure that replaces a larger one.
fn bounded(outcome: ActionOutcome) -> ActionOutcome {
    let len = match &outcome {
        ActionOutcome::Success(v) => json_bytes(v),
        ActionOutcome::Failure(p) => json_bytes(&p.to_value()),
    };
    if len <= MAX_ACTION_RESULT_BYTES {
        return outcome;
    }
    ActionOutcome::Failure(ErrorPayload::new(
        ErrorCode::ExecutionFailed,
        format!(
            "the app's result was {len} bytes, more than the maximum of {MAX_ACTION_RESULT_BYTES}"
        ),
    ))
}

/// Compact JSON size of `value`, counted without keeping the text.
fn json_bytes(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 = self.0.saturating_add(buf.len());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut n = Count(0);
    // Writing a JSON value into a counter cannot fail.
    let _ = serde_json::to_writer(&mut n, value);
    n.0
}

fn key(invocation: InvocationId) -> Id {
    Id::Number(i64::try_from(invocation.0).unwrap_or(i64::MAX))
}
