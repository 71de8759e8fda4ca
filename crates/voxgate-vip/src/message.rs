//! The data-channel messages, both ways: one JSON object per message, with a `type`.

use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

use crate::error::{DecodeError, ErrorCode, ErrorPayload};
use crate::machine::VipState;
use crate::wire::{Bad, Fields, Writer, check_id, json, pointer, truncate};
use crate::{
    MAX_ACTION_DESCRIPTION_BYTES, MAX_ACTION_ID_BYTES, MAX_ACTION_RESULT_BYTES, MAX_ACTIONS,
    MAX_FATAL_CODE_BYTES, MAX_FATAL_MESSAGE_BYTES, MAX_INPUT_TEXT_BYTES, MAX_INVOCATION_ID_BYTES,
    MAX_MESSAGE_BYTES, MAX_NARRATED_STATE_BYTES, MAX_TYPE_NAME_BYTES, PROTOCOL,
};

/// One client action of the Action Registry (VIP §5.3.1): a button, a route, an input.
#[derive(Debug, Clone, PartialEq)]
pub struct ActionDeclaration {
    /// Unique id, e.g. `open_settings` (1 to [`MAX_ACTION_ID_BYTES`] bytes, no control
    /// characters). On the wire it is the key of the `actions` map.
    pub id: String,
    /// What it does, for the model (empty when the client sent none).
    pub description: String,
    /// JSON Schema of its parameters: an object whose `type`, if present, is `"object"`. An
    /// absent schema reads as `{"type": "object", "properties": {}}` (no parameters).
    pub parameters: Value,
}

impl ActionDeclaration {
    /// An action without parameters.
    pub fn new(id: impl Into<String>, description: impl Into<String>) -> Self {
        ActionDeclaration {
            id: id.into(),
            description: description.into(),
            parameters: empty_schema(),
        }
    }
}

fn empty_schema() -> Value {
    let mut schema = Map::new();
    schema.insert("type".into(), Value::String("object".into()));
    schema.insert("properties".into(), Value::Object(Map::new()));
    Value::Object(schema)
}

/// How the client says an invocation went (`action.result`, VIP §5.3.3 step 5).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ActionOutcome {
    /// `status: "success"`, with the optional `data` for the model.
    Success {
        /// What the action returned, if anything (`null` reads as none).
        data: Option<Value>,
    },
    /// `status: "error"` with the standard error payload.
    Error(ErrorPayload),
}

/// A message from the client (browser) to the server.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ClientMessage {
    /// `actions.declare`: the full Action Registry, replacing the previous one. In the order
    /// the client sent them; ids are unique (a repeated key is refused).
    ActionsDeclare {
        /// The actions, at most [`MAX_ACTIONS`].
        actions: Vec<ActionDeclaration>,
    },
    /// `state.narrate`: the Narrated State (VIP §5.3.2), at most
    /// [`MAX_NARRATED_STATE_BYTES`].
    StateNarrate {
        /// The description of the client's current view.
        text: String,
    },
    /// `action.result`: the outcome of one `action.invoke`.
    ActionResult {
        /// The invocation, as the server sent it.
        invocation_id: String,
        /// Success (with data) or the error payload.
        outcome: ActionOutcome,
    },
    /// `input.detected`: the client's VAD or push-to-talk started (a barge-in when the server
    /// is speaking).
    InputDetected,
    /// `input.text`: a typed user turn (not empty, at most [`MAX_INPUT_TEXT_BYTES`]).
    InputText {
        /// What the user typed.
        text: String,
    },
    /// `session.end`: hang up.
    SessionEnd,
    /// `error.fatal`: the client gives up. Over-long fields are cut, not refused (the session
    /// ends either way): `code` to [`MAX_FATAL_CODE_BYTES`], `message` to
    /// [`MAX_FATAL_MESSAGE_BYTES`].
    ErrorFatal {
        /// Why, machine-readable.
        code: ErrorCode,
        /// Why, in words.
        message: String,
    },
    /// A `type` this crate does not know, kept (cut to [`MAX_TYPE_NAME_BYTES`]) so the door
    /// can answer `unknown_type` and go on.
    Unknown {
        /// The message's `type`.
        type_name: String,
    },
}

/// What the server announces in `session.connected`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionConnected {
    /// The session's id (also in the signalling answer).
    pub session_id: String,
    /// The protocol version, [`PROTOCOL`] (`vip/1`).
    pub protocol: String,
    /// The audio track's format.
    pub audio: AudioFormat,
    /// The bounds this server enforces.
    pub limits: Limits,
}

impl SessionConnected {
    /// This crate's protocol, audio format and limits for session `session_id`.
    pub fn new(session_id: impl Into<String>) -> Self {
        SessionConnected {
            session_id: session_id.into(),
            protocol: PROTOCOL.to_owned(),
            audio: AudioFormat::default(),
            limits: Limits::default(),
        }
    }
}

/// The audio track's format in `session.connected`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AudioFormat {
    /// Codec name, `opus`.
    pub codec: String,
    /// Samples per second, 48000.
    pub sample_rate: u32,
    /// Channels, 1.
    pub channels: u16,
}

impl Default for AudioFormat {
    fn default() -> Self {
        AudioFormat {
            codec: "opus".to_owned(),
            sample_rate: 48_000,
            channels: 1,
        }
    }
}

/// The bounds in `session.connected`, so a client can check before it sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Most actions in one `actions.declare`.
    pub max_actions: u64,
    /// Longest `state.narrate` text, in UTF-8 bytes.
    pub max_narrated_state_bytes: u64,
    /// Largest `action.result` data or error, in bytes of compact JSON.
    pub max_action_result_bytes: u64,
    /// Largest message, in bytes.
    pub max_message_bytes: u64,
}

impl Default for Limits {
    /// This crate's bounds.
    fn default() -> Self {
        Limits {
            max_actions: MAX_ACTIONS as u64,
            max_narrated_state_bytes: MAX_NARRATED_STATE_BYTES as u64,
            max_action_result_bytes: MAX_ACTION_RESULT_BYTES as u64,
            max_message_bytes: MAX_MESSAGE_BYTES as u64,
        }
    }
}

/// A message from the server to the client.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ServerMessage {
    /// `session.connected`: the data channel is open (VIP §5.5.1). The state is `idle`.
    SessionConnected(SessionConnected),
    /// `state`: one transition of the server's state machine.
    State {
        /// The new state.
        state: VipState,
        /// The state before.
        previous: VipState,
        /// The turn the new state belongs to (`null` in `idle` and `listening`).
        turn: Option<u64>,
    },
    /// `input.detected` with `source: "server"`: the server's VAD heard speech start.
    InputDetected,
    /// `transcript.user`: the user's spoken turn, as recognized.
    TranscriptUser {
        /// The turn.
        turn: u64,
        /// The transcript.
        text: String,
    },
    /// `reply.text`: a sentence of the reply as it starts playing.
    ReplyText {
        /// The turn.
        turn: u64,
        /// The sentence.
        text: String,
    },
    /// `reply.done`: the reply finished playing, or was cut off.
    ReplyDone {
        /// The turn.
        turn: u64,
        /// Cut off by barge-in.
        interrupted: bool,
    },
    /// `action.invoke`: run a declared action (VIP §5.3.3 step 3).
    ActionInvoke {
        /// Opaque id to quote in `action.result`.
        invocation_id: String,
        /// The declared action's id.
        action_id: String,
        /// Parameters, already validated against the action's schema.
        parameters: Value,
    },
    /// `action.cancelled`: the server no longer waits for this invocation's result.
    ActionCancelled {
        /// The invocation.
        invocation_id: String,
        /// Why (`timeout`, `cancelled`, ...).
        error: ErrorPayload,
    },
    /// `turn.latency`: once per spoken turn, when its first reply audio is sent.
    TurnLatency {
        /// The turn.
        turn: u64,
        /// End of speech to the first reply audio sent, in milliseconds.
        end_of_speech_to_first_audio_ms: u64,
        /// End of speech to the final transcript, when there was one.
        end_of_speech_to_transcript_ms: Option<u64>,
    },
    /// `error`: something the client sent was refused; the session goes on. The payload's
    /// fields are flat in the message.
    Error(ErrorPayload),
    /// `error.fatal`: the session cannot go on; the server closes the connection after it.
    ErrorFatal {
        /// Why, machine-readable.
        code: ErrorCode,
        /// Why, in words.
        message: String,
    },
    /// A `type` this crate does not know (a newer server), kept as data.
    Unknown {
        /// The message's `type`.
        type_name: String,
    },
}

/// Size check, UTF-8 check, then the JSON object and its `type`.
fn envelope(text: &str) -> Result<(Map<String, Value>, String), DecodeError> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| DecodeError::NotJson(e.to_string()))?;
    let Value::Object(mut map) = value else {
        return Err(DecodeError::NoType);
    };
    let Some(Value::String(type_name)) = map.remove("type") else {
        return Err(DecodeError::NoType);
    };
    Ok((map, type_name))
}

fn check_size(len: usize) -> Result<(), DecodeError> {
    if len > MAX_MESSAGE_BYTES {
        return Err(DecodeError::TooLarge {
            len,
            max: MAX_MESSAGE_BYTES,
        });
    }
    Ok(())
}

fn invalid(type_name: &str, bad: Bad) -> DecodeError {
    DecodeError::Invalid {
        type_name: type_name.to_owned(),
        path: bad.path,
        message: bad.message,
        invocation_id: None,
    }
}

impl ClientMessage {
    /// Decodes one data-channel text message.
    ///
    /// Refuses (with a [`DecodeError`] that maps to the `error` reply) a message over
    /// [`MAX_MESSAGE_BYTES`], one that is not a JSON object with a string `type`, and a known
    /// `type` whose fields are missing, mistyped or over their bounds. Unknown types decode to
    /// [`ClientMessage::Unknown`]; unknown fields are ignored; explicit `null` is read as an
    /// absent field. Never panics.
    pub fn decode(text: &str) -> Result<ClientMessage, DecodeError> {
        check_size(text.len())?;
        let (map, type_name) = envelope(text)?;
        let f = Fields::new(&map, "");
        let t = type_name.as_str();
        let msg = match t {
            "actions.declare" => ClientMessage::ActionsDeclare {
                actions: decode_actions(&f, text).map_err(|b| invalid(t, b))?,
            },
            "state.narrate" => ClientMessage::StateNarrate {
                text: f
                    .str_req("text", MAX_NARRATED_STATE_BYTES)
                    .map_err(|b| invalid(t, b))?
                    .to_owned(),
            },
            "action.result" => decode_result(&f)?,
            "input.detected" => ClientMessage::InputDetected,
            "input.text" => {
                let text = f
                    .str_req("text", MAX_INPUT_TEXT_BYTES)
                    .map_err(|b| invalid(t, b))?;
                if text.trim().is_empty() {
                    return Err(invalid(t, Bad::new("/text", "must not be empty")));
                }
                ClientMessage::InputText {
                    text: text.to_owned(),
                }
            }
            "session.end" => ClientMessage::SessionEnd,
            "error.fatal" => {
                let code = f
                    .str_cut("code", MAX_FATAL_CODE_BYTES)
                    .map_err(|b| invalid(t, b))?
                    .unwrap_or_default();
                let message = f
                    .str_cut("message", MAX_FATAL_MESSAGE_BYTES)
                    .map_err(|b| invalid(t, b))?
                    .unwrap_or_default();
                ClientMessage::ErrorFatal {
                    code: ErrorCode::parse(code),
                    message: message.to_owned(),
                }
            }
            _ => ClientMessage::Unknown {
                type_name: truncate(t, MAX_TYPE_NAME_BYTES).to_owned(),
            },
        };
        Ok(msg)
    }

    /// [`ClientMessage::decode`] for a binary data-channel message (UTF-8 JSON); the size is
    /// checked before the encoding.
    pub fn decode_slice(bytes: &[u8]) -> Result<ClientMessage, DecodeError> {
        check_size(bytes.len())?;
        let text = std::str::from_utf8(bytes).map_err(|_| DecodeError::NotUtf8)?;
        ClientMessage::decode(text)
    }

    /// The message's wire `type`.
    pub fn type_name(&self) -> &str {
        match self {
            ClientMessage::ActionsDeclare { .. } => "actions.declare",
            ClientMessage::StateNarrate { .. } => "state.narrate",
            ClientMessage::ActionResult { .. } => "action.result",
            ClientMessage::InputDetected => "input.detected",
            ClientMessage::InputText { .. } => "input.text",
            ClientMessage::SessionEnd => "session.end",
            ClientMessage::ErrorFatal { .. } => "error.fatal",
            ClientMessage::Unknown { type_name } => type_name,
        }
    }

    /// The wire text (compact JSON, `type` first): what a client sends. A message that
    /// [`ClientMessage::decode`] returned encodes to text that decodes to it again (unless
    /// its numbers grow past [`MAX_MESSAGE_BYTES`] on re-encoding, e.g. `1e9` in `data`).
    pub fn encode(&self) -> String {
        let w = Writer::new(self.type_name());
        match self {
            ClientMessage::ActionsDeclare { actions } => {
                let mut map = String::from("{");
                for (i, a) in actions.iter().enumerate() {
                    if i > 0 {
                        map.push(',');
                    }
                    map.push_str(&json(&a.id));
                    map.push(':');
                    map.push_str(
                        &Writer::object()
                            .field("description", &a.description)
                            .field("parameters", &a.parameters)
                            .finish(),
                    );
                }
                map.push('}');
                let mut w = w;
                w.raw("actions", &map);
                w.finish()
            }
            ClientMessage::StateNarrate { text } | ClientMessage::InputText { text } => {
                w.field("text", text).finish()
            }
            ClientMessage::ActionResult {
                invocation_id,
                outcome,
            } => {
                let w = w.field("invocation_id", invocation_id);
                match outcome {
                    ActionOutcome::Success { data: None } => w.field("status", "success"),
                    ActionOutcome::Success { data: Some(data) } => {
                        w.field("status", "success").field("data", data)
                    }
                    ActionOutcome::Error(error) => w.field("status", "error").field("error", error),
                }
                .finish()
            }
            ClientMessage::ErrorFatal { code, message } => {
                w.field("code", code).field("message", message).finish()
            }
            ClientMessage::InputDetected
            | ClientMessage::SessionEnd
            | ClientMessage::Unknown { .. } => w.finish(),
        }
    }
}

/// `actions.declare`'s map: shape from the parsed value, then order and duplicates from a
/// second, streaming read of the text (a parsed map keeps neither).
fn decode_actions(f: &Fields<'_>, text: &str) -> Result<Vec<ActionDeclaration>, Bad> {
    let actions = f.obj_req("actions")?;
    if actions.map.len() > MAX_ACTIONS {
        return Err(Bad::new(
            "/actions",
            format!(
                "holds {} actions, more than the maximum of {MAX_ACTIONS}",
                actions.map.len()
            ),
        ));
    }
    let ordered = serde_json::from_str::<DeclareWire>(text)
        .map_err(|e| Bad::new("/actions", strip_position(&e)))?
        .actions
        .map(|a| a.0)
        .unwrap_or_default();
    let mut out = Vec::with_capacity(ordered.len());
    for (id, value) in ordered {
        let at = pointer("/actions", &id);
        check_id(&id, MAX_ACTION_ID_BYTES).map_err(|m| Bad::new(at.clone(), format!("id {m}")))?;
        let Value::Object(map) = &value else {
            return Err(Bad::new(at, "must be an object"));
        };
        let a = Fields::new(map, at);
        let description = a
            .str_opt("description", MAX_ACTION_DESCRIPTION_BYTES)?
            .unwrap_or_default()
            .to_owned();
        let parameters = match a.get("parameters") {
            None => empty_schema(),
            Some(schema) => {
                check_schema(schema).map_err(|m| Bad::new(a.path("parameters"), m))?;
                schema.clone()
            }
        };
        out.push(ActionDeclaration {
            id,
            description,
            parameters,
        });
    }
    Ok(out)
}

/// The shape a parameter schema must have: an object schema. Whether it is valid JSON Schema
/// (and whether invocations match it) is the engine's to check.
fn check_schema(schema: &Value) -> Result<(), String> {
    let Value::Object(map) = schema else {
        return Err("must be a JSON Schema object".to_owned());
    };
    match map.get("type") {
        None | Some(Value::Null) => {}
        Some(Value::String(t)) if t == "object" => {}
        Some(_) => return Err("must be an object schema (`\"type\": \"object\"`)".to_owned()),
    }
    match map.get("properties") {
        None | Some(Value::Null | Value::Object(_)) => {}
        Some(_) => return Err("`properties` must be an object".to_owned()),
    }
    match map.get("required") {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) if items.iter().all(Value::is_string) => {}
        Some(_) => return Err("`required` must be an array of strings".to_owned()),
    }
    Ok(())
}

/// serde_json's message without " at line 1 column 40": the path already says where.
fn strip_position(e: &serde_json::Error) -> String {
    let s = e.to_string();
    match s.rfind(" at line ") {
        Some(i) => s[..i].to_owned(),
        None => s,
    }
}

/// Just the `actions` field, read in order.
#[derive(Deserialize)]
struct DeclareWire {
    #[serde(default)]
    actions: Option<ActionMap>,
}

/// The `actions` object's entries in wire order; a repeated id is an error.
struct ActionMap(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for ActionMap {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = ActionMap;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object of actions keyed by id")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut access: A,
            ) -> Result<ActionMap, A::Error> {
                let mut out: Vec<(String, Value)> = Vec::new();
                while let Some(id) = access.next_key::<String>()? {
                    if out.iter().any(|(seen, _)| *seen == id) {
                        return Err(serde::de::Error::custom(format!(
                            "action id `{}` is declared twice",
                            truncate(&id, MAX_ACTION_ID_BYTES)
                        )));
                    }
                    let value = access.next_value::<Value>()?;
                    out.push((id, value));
                }
                Ok(ActionMap(out))
            }
        }
        deserializer.deserialize_map(Visit)
    }
}

fn decode_result(f: &Fields<'_>) -> Result<ClientMessage, DecodeError> {
    const T: &str = "action.result";
    let invocation_id = f
        .id_req("invocation_id", MAX_INVOCATION_ID_BYTES)
        .map_err(|b| invalid(T, b))?
        .to_owned();
    let with_id = |bad: Bad| DecodeError::Invalid {
        type_name: T.to_owned(),
        path: bad.path,
        message: bad.message,
        invocation_id: Some(invocation_id.clone()),
    };
    let status = f.str_req("status", 64).map_err(with_id)?;
    let (outcome, size) = match status {
        "success" => {
            let data = f.get("data").cloned();
            let size = data.as_ref().map_or(0, |d| json(d).len());
            (ActionOutcome::Success { data }, size)
        }
        "error" => {
            let error = f
                .obj_req("error")
                .and_then(|e| e.error_payload())
                .map_err(with_id)?;
            let size = json(&error).len();
            (ActionOutcome::Error(error), size)
        }
        _ => {
            return Err(with_id(Bad::new(
                "/status",
                "must be \"success\" or \"error\"",
            )));
        }
    };
    if size > MAX_ACTION_RESULT_BYTES {
        let field = if matches!(outcome, ActionOutcome::Success { .. }) {
            "/data"
        } else {
            "/error"
        };
        return Err(with_id(Bad::new(
            field,
            format!("is {size} bytes of JSON, more than the maximum of {MAX_ACTION_RESULT_BYTES}"),
        )));
    }
    Ok(ClientMessage::ActionResult {
        invocation_id,
        outcome,
    })
}

impl ServerMessage {
    /// The wire text (compact JSON, `type` first, field names as in `docs/doors/vip.md`;
    /// `details` omitted when empty, `turn` and `end_of_speech_to_transcript_ms` written as
    /// `null` when unknown).
    pub fn encode(&self) -> String {
        let w = Writer::new(self.type_name());
        match self {
            ServerMessage::SessionConnected(s) => w
                .field("session_id", &s.session_id)
                .field("protocol", &s.protocol)
                .raw_obj(
                    "audio",
                    &Writer::object()
                        .field("codec", &s.audio.codec)
                        .field("sample_rate", &s.audio.sample_rate)
                        .field("channels", &s.audio.channels)
                        .finish(),
                )
                .raw_obj(
                    "limits",
                    &Writer::object()
                        .field("max_actions", &s.limits.max_actions)
                        .field(
                            "max_narrated_state_bytes",
                            &s.limits.max_narrated_state_bytes,
                        )
                        .field("max_action_result_bytes", &s.limits.max_action_result_bytes)
                        .field("max_message_bytes", &s.limits.max_message_bytes)
                        .finish(),
                ),
            ServerMessage::State {
                state,
                previous,
                turn,
            } => w
                .field("state", state.as_str())
                .field("previous", previous.as_str())
                .field("turn", turn),
            ServerMessage::InputDetected => w.field("source", "server"),
            ServerMessage::TranscriptUser { turn, text }
            | ServerMessage::ReplyText { turn, text } => w.field("turn", turn).field("text", text),
            ServerMessage::ReplyDone { turn, interrupted } => {
                w.field("turn", turn).field("interrupted", interrupted)
            }
            ServerMessage::ActionInvoke {
                invocation_id,
                action_id,
                parameters,
            } => w
                .field("invocation_id", invocation_id)
                .field("action_id", action_id)
                .field("parameters", parameters),
            ServerMessage::ActionCancelled {
                invocation_id,
                error,
            } => w
                .field("invocation_id", invocation_id)
                .field("error", error),
            ServerMessage::TurnLatency {
                turn,
                end_of_speech_to_first_audio_ms,
                end_of_speech_to_transcript_ms,
            } => w
                .field("turn", turn)
                .field(
                    "end_of_speech_to_first_audio_ms",
                    end_of_speech_to_first_audio_ms,
                )
                .field(
                    "end_of_speech_to_transcript_ms",
                    end_of_speech_to_transcript_ms,
                ),
            ServerMessage::Error(p) => w.payload_fields(p),
            ServerMessage::ErrorFatal { code, message } => {
                w.field("code", code).field("message", message)
            }
            ServerMessage::Unknown { .. } => w,
        }
        .finish()
    }

    /// The message's wire `type`.
    pub fn type_name(&self) -> &str {
        match self {
            ServerMessage::SessionConnected(_) => "session.connected",
            ServerMessage::State { .. } => "state",
            ServerMessage::InputDetected => "input.detected",
            ServerMessage::TranscriptUser { .. } => "transcript.user",
            ServerMessage::ReplyText { .. } => "reply.text",
            ServerMessage::ReplyDone { .. } => "reply.done",
            ServerMessage::ActionInvoke { .. } => "action.invoke",
            ServerMessage::ActionCancelled { .. } => "action.cancelled",
            ServerMessage::TurnLatency { .. } => "turn.latency",
            ServerMessage::Error(_) => "error",
            ServerMessage::ErrorFatal { .. } => "error.fatal",
            ServerMessage::Unknown { type_name } => type_name,
        }
    }

    /// Decodes a server message: for clients (the load-test client, tests). Tolerant like
    /// [`ClientMessage::decode`] (`null` as absent, unknown fields ignored, unknown types kept
    /// as [`ServerMessage::Unknown`]) but without the client-side size bounds: the server is
    /// trusted to send what it encodes. Never panics.
    pub fn decode(text: &str) -> Result<ServerMessage, DecodeError> {
        let (map, type_name) = envelope(text)?;
        let t = type_name.as_str();
        decode_server(&Fields::new(&map, ""), t).map_err(|b| invalid(t, b))
    }

    /// [`ServerMessage::decode`] for bytes (UTF-8 JSON).
    pub fn decode_slice(bytes: &[u8]) -> Result<ServerMessage, DecodeError> {
        let text = std::str::from_utf8(bytes).map_err(|_| DecodeError::NotUtf8)?;
        ServerMessage::decode(text)
    }
}

fn state_field(f: &Fields<'_>, key: &str) -> Result<VipState, Bad> {
    let s = f.str_req(key, usize::MAX)?;
    VipState::parse(s).ok_or_else(|| {
        Bad::new(
            f.path(key),
            format!("unknown state `{}`", truncate(s, MAX_TYPE_NAME_BYTES)),
        )
    })
}

fn decode_server(f: &Fields<'_>, t: &str) -> Result<ServerMessage, Bad> {
    const ANY: usize = usize::MAX;
    let msg = match t {
        "session.connected" => {
            let audio = f.obj_req("audio")?;
            let limits = f.obj_req("limits")?;
            ServerMessage::SessionConnected(SessionConnected {
                session_id: f.str_req("session_id", ANY)?.to_owned(),
                protocol: f.str_req("protocol", ANY)?.to_owned(),
                audio: AudioFormat {
                    codec: audio.str_req("codec", ANY)?.to_owned(),
                    sample_rate: u32::try_from(audio.u64_req("sample_rate")?)
                        .map_err(|_| Bad::new(audio.path("sample_rate"), "out of range"))?,
                    channels: u16::try_from(audio.u64_req("channels")?)
                        .map_err(|_| Bad::new(audio.path("channels"), "out of range"))?,
                },
                limits: Limits {
                    max_actions: limits.u64_req("max_actions")?,
                    max_narrated_state_bytes: limits.u64_req("max_narrated_state_bytes")?,
                    max_action_result_bytes: limits.u64_req("max_action_result_bytes")?,
                    max_message_bytes: limits.u64_req("max_message_bytes")?,
                },
            })
        }
        "state" => ServerMessage::State {
            state: state_field(f, "state")?,
            previous: state_field(f, "previous")?,
            turn: f.u64_opt("turn")?,
        },
        "input.detected" => ServerMessage::InputDetected,
        "transcript.user" => ServerMessage::TranscriptUser {
            turn: f.u64_req("turn")?,
            text: f.str_req("text", ANY)?.to_owned(),
        },
        "reply.text" => ServerMessage::ReplyText {
            turn: f.u64_req("turn")?,
            text: f.str_req("text", ANY)?.to_owned(),
        },
        "reply.done" => ServerMessage::ReplyDone {
            turn: f.u64_req("turn")?,
            interrupted: f.bool_req("interrupted")?,
        },
        "action.invoke" => ServerMessage::ActionInvoke {
            invocation_id: f.str_req("invocation_id", ANY)?.to_owned(),
            action_id: f.str_req("action_id", ANY)?.to_owned(),
            parameters: f
                .get("parameters")
                .cloned()
                .unwrap_or_else(|| Value::Object(Map::new())),
        },
        "action.cancelled" => ServerMessage::ActionCancelled {
            invocation_id: f.str_req("invocation_id", ANY)?.to_owned(),
            error: f.obj_req("error")?.error_payload()?,
        },
        "turn.latency" => ServerMessage::TurnLatency {
            turn: f.u64_req("turn")?,
            end_of_speech_to_first_audio_ms: f.u64_req("end_of_speech_to_first_audio_ms")?,
            end_of_speech_to_transcript_ms: f.u64_opt("end_of_speech_to_transcript_ms")?,
        },
        "error" => ServerMessage::Error(f.error_payload()?),
        "error.fatal" => ServerMessage::ErrorFatal {
            code: ErrorCode::parse(f.str_req("code", ANY)?),
            message: f.str_opt("message", ANY)?.unwrap_or_default().to_owned(),
        },
        _ => ServerMessage::Unknown {
            type_name: truncate(t, MAX_TYPE_NAME_BYTES).to_owned(),
        },
    };
    Ok(msg)
}

impl From<ErrorPayload> for ServerMessage {
    /// The `error` reply carrying `payload`.
    fn from(payload: ErrorPayload) -> Self {
        ServerMessage::Error(payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn refused(text: &str) -> (String, String) {
        match ClientMessage::decode(text) {
            Err(DecodeError::Invalid { path, message, .. }) => (path, message),
            other => panic!("{text}: {other:?}"),
        }
    }

    fn declare(actions: &Value) -> String {
        json!({"type": "actions.declare", "actions": actions}).to_string()
    }

    #[test]
    fn not_json_not_object_and_no_type_are_malformed() {
        for text in [
            "{",
            "[]",
            "1",
            "\"x\"",
            "{}",
            r#"{"type":1}"#,
            r#"{"type":null}"#,
        ] {
            let err = ClientMessage::decode(text).unwrap_err();
            assert_eq!(err.payload().code, ErrorCode::Malformed, "{text}");
        }
        assert_eq!(
            ClientMessage::decode_slice(b"{\"type\":\"\xff\"}"),
            Err(DecodeError::NotUtf8)
        );
    }

    #[test]
    fn size_is_checked_before_parsing() {
        let text = " ".repeat(MAX_MESSAGE_BYTES + 1);
        assert_eq!(
            ClientMessage::decode(&text),
            Err(DecodeError::TooLarge {
                len: MAX_MESSAGE_BYTES + 1,
                max: MAX_MESSAGE_BYTES
            })
        );
        assert!(matches!(
            ClientMessage::decode_slice(&vec![0xff; MAX_MESSAGE_BYTES + 1]),
            Err(DecodeError::TooLarge { .. })
        ));
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let deep = format!(
            r#"{{"type":"action.result","invocation_id":"1","status":"success","data":{}{}}}"#,
            "[".repeat(10_000),
            "]".repeat(10_000)
        );
        assert!(matches!(
            ClientMessage::decode(&deep),
            Err(DecodeError::NotJson(_))
        ));
    }

    #[test]
    fn unknown_types_are_kept_and_cut() {
        assert_eq!(
            ClientMessage::decode(r#"{"type":"ping","x":1}"#),
            Ok(ClientMessage::Unknown {
                type_name: "ping".into()
            })
        );
        let long = format!(r#"{{"type":"{}"}}"#, "é".repeat(100));
        let Ok(ClientMessage::Unknown { type_name }) = ClientMessage::decode(&long) else {
            panic!()
        };
        assert_eq!(type_name, "é".repeat(32));
    }

    #[test]
    fn unit_messages_ignore_fields() {
        assert_eq!(
            ClientMessage::decode(r#"{"type":"input.detected","source":"vad"}"#),
            Ok(ClientMessage::InputDetected)
        );
        assert_eq!(
            ClientMessage::decode(r#"{"type":"session.end","reason":null}"#),
            Ok(ClientMessage::SessionEnd)
        );
    }

    #[test]
    fn actions_keep_their_order_and_defaults() {
        let text = r#"{"type":"actions.declare","actions":{
            "zoom":{"description":"Zoom in","parameters":{"type":"object","properties":{"level":{"type":"integer"}},"required":["level"]}},
            "back":{"description":null,"parameters":null},
            "help":{}}}"#;
        let Ok(ClientMessage::ActionsDeclare { actions }) = ClientMessage::decode(text) else {
            panic!()
        };
        let ids: Vec<_> = actions.iter().map(|a| a.id.as_str()).collect();
        assert_eq!(ids, ["zoom", "back", "help"]);
        assert_eq!(actions[1].description, "");
        assert_eq!(
            actions[1].parameters,
            json!({"type": "object", "properties": {}})
        );
        assert_eq!(actions[2], ActionDeclaration::new("help", ""));
        // A schema without `type` is an object schema too.
        let ok = declare(&json!({"a": {"parameters": {"properties": {}}}}));
        assert!(ClientMessage::decode(&ok).is_ok());
        assert_eq!(
            ClientMessage::decode(&declare(&json!({}))),
            Ok(ClientMessage::ActionsDeclare { actions: vec![] })
        );
    }

    #[test]
    fn duplicate_action_ids_are_refused() {
        let text = r#"{"type":"actions.declare","actions":{"a":{},"b":{},"a":{}}}"#;
        let (path, message) = refused(text);
        assert_eq!(path, "/actions");
        assert_eq!(message, "action id `a` is declared twice");
    }

    #[test]
    fn action_bounds() {
        let many: Map<String, Value> = (0..=MAX_ACTIONS)
            .map(|i| (format!("a{i}"), json!({})))
            .collect();
        assert_eq!(
            refused(&declare(&Value::Object(many))),
            (
                "/actions".into(),
                "holds 65 actions, more than the maximum of 64".into()
            )
        );
        let exactly: Map<String, Value> = (0..MAX_ACTIONS)
            .map(|i| (format!("a{i}"), json!({})))
            .collect();
        assert!(ClientMessage::decode(&declare(&Value::Object(exactly))).is_ok());

        let long_id = "x".repeat(MAX_ACTION_ID_BYTES + 1);
        let (path, message) = refused(&declare(&json!({ long_id.clone(): {} })));
        assert_eq!(path, format!("/actions/{long_id}"));
        assert!(message.starts_with("id is 129 bytes"), "{message}");
        assert_eq!(
            refused(&declare(&json!({"": {}}))).1,
            "id must not be empty"
        );
        assert_eq!(
            refused(&declare(&json!({"a\u{0}": {}}))).1,
            "id must not contain control characters"
        );
        let long_text = "d".repeat(MAX_ACTION_DESCRIPTION_BYTES + 1);
        assert_eq!(
            refused(&declare(&json!({"a/b": {"description": long_text}}))).0,
            "/actions/a~1b/description"
        );
    }

    #[test]
    fn action_shapes_are_checked() {
        let cases = [
            (json!(null), "/actions", "required"),
            (json!([]), "/actions", "must be an object, not an array"),
            (json!({"a": 1}), "/actions/a", "must be an object"),
            (
                json!({"a": {"description": 3}}),
                "/actions/a/description",
                "must be a string, not a number",
            ),
            (
                json!({"a": {"parameters": {"type": "string"}}}),
                "/actions/a/parameters",
                "must be an object schema (`\"type\": \"object\"`)",
            ),
            (
                json!({"a": {"parameters": "object"}}),
                "/actions/a/parameters",
                "must be a JSON Schema object",
            ),
            (
                json!({"a": {"parameters": {"properties": []}}}),
                "/actions/a/parameters",
                "`properties` must be an object",
            ),
            (
                json!({"a": {"parameters": {"required": [1]}}}),
                "/actions/a/parameters",
                "`required` must be an array of strings",
            ),
        ];
        for (actions, path, message) in cases {
            assert_eq!(
                refused(&declare(&actions)),
                (path.to_owned(), message.to_owned()),
                "{actions}"
            );
        }
    }

    #[test]
    fn narrated_state_bound() {
        let at = |n: usize| json!({"type": "state.narrate", "text": "n".repeat(n)}).to_string();
        assert!(ClientMessage::decode(&at(MAX_NARRATED_STATE_BYTES)).is_ok());
        assert_eq!(refused(&at(MAX_NARRATED_STATE_BYTES + 1)).0, "/text");
        assert_eq!(
            refused(r#"{"type":"state.narrate","text":null}"#),
            ("/text".into(), "required".into())
        );
        // An empty view is still a narration.
        assert!(ClientMessage::decode(r#"{"type":"state.narrate","text":""}"#).is_ok());
    }

    #[test]
    fn input_text_must_say_something() {
        assert_eq!(
            refused(r#"{"type":"input.text","text":"  "}"#),
            ("/text".into(), "must not be empty".into())
        );
        let long = json!({"type": "input.text", "text": "t".repeat(MAX_INPUT_TEXT_BYTES + 1)});
        assert_eq!(refused(&long.to_string()).0, "/text");
    }

    #[test]
    fn action_results() {
        assert_eq!(
            ClientMessage::decode(
                r#"{"type":"action.result","invocation_id":"7","status":"success","data":null,"error":null}"#
            ),
            Ok(ClientMessage::ActionResult {
                invocation_id: "7".into(),
                outcome: ActionOutcome::Success { data: None }
            })
        );
        let failed = ClientMessage::decode(
            r#"{"type":"action.result","invocation_id":"7","status":"error","error":{"code":"invalid_parameters","message":"bad","details":[{"path":"/level","message":"not an integer"},{"path":null}]}}"#,
        );
        assert_eq!(
            failed,
            Ok(ClientMessage::ActionResult {
                invocation_id: "7".into(),
                outcome: ActionOutcome::Error(
                    ErrorPayload::new(ErrorCode::InvalidParameters, "bad").with_details(vec![
                        crate::Violation::new("/level", "not an integer"),
                        crate::Violation::new("", ""),
                    ])
                )
            })
        );
    }

    #[test]
    fn bad_action_results_name_their_invocation() {
        let cases = [
            (
                r#"{"type":"action.result","invocation_id":"7","status":"done"}"#,
                "/status",
            ),
            (
                r#"{"type":"action.result","invocation_id":"7","status":"error"}"#,
                "/error",
            ),
            (
                r#"{"type":"action.result","invocation_id":"7","status":"error","error":{"message":"x"}}"#,
                "/error/code",
            ),
            (
                r#"{"type":"action.result","invocation_id":"7","status":"error","error":{"code":"x","details":{}}}"#,
                "/error/details",
            ),
            (r#"{"type":"action.result","invocation_id":"7"}"#, "/status"),
        ];
        for (text, path) in cases {
            let err = ClientMessage::decode(text).unwrap_err();
            assert_eq!(err.invocation_id(), Some("7"), "{text}");
            assert_eq!(err.payload().details[0].path, path, "{text}");
        }
        let no_id = ClientMessage::decode(r#"{"type":"action.result","status":"success"}"#);
        assert_eq!(no_id.unwrap_err().invocation_id(), None);
        let numeric = ClientMessage::decode(r#"{"type":"action.result","invocation_id":7}"#);
        assert_eq!(
            numeric.unwrap_err().payload().details[0].message,
            "must be a string, not a number"
        );
    }

    #[test]
    fn action_result_bound_is_on_compact_json() {
        let result = |data: Value| {
            json!({"type": "action.result", "invocation_id": "1", "status": "success", "data": data})
                .to_string()
        };
        // A string of n bytes is n + 2 bytes of JSON.
        let fits = result(json!("d".repeat(MAX_ACTION_RESULT_BYTES - 2)));
        assert!(ClientMessage::decode(&fits).is_ok());
        let over = result(json!("d".repeat(MAX_ACTION_RESULT_BYTES - 1)));
        let err = ClientMessage::decode(&over).unwrap_err();
        assert_eq!(err.invocation_id(), Some("1"));
        assert_eq!(err.payload().details[0].path, "/data");
    }

    #[test]
    fn fatal_errors_are_cut_not_refused() {
        let text =
            json!({"type": "error.fatal", "code": "c".repeat(100), "message": "m".repeat(5000)});
        let Ok(ClientMessage::ErrorFatal { code, message }) =
            ClientMessage::decode(&text.to_string())
        else {
            panic!()
        };
        assert_eq!(code.as_str().len(), MAX_FATAL_CODE_BYTES);
        assert_eq!(message.len(), MAX_FATAL_MESSAGE_BYTES);
        assert_eq!(
            ClientMessage::decode(r#"{"type":"error.fatal"}"#),
            Ok(ClientMessage::ErrorFatal {
                code: ErrorCode::Other(String::new()),
                message: String::new()
            })
        );
    }

    #[test]
    fn server_decode_reads_nulls_and_refuses_unknown_states() {
        assert_eq!(
            ServerMessage::decode(
                r#"{"type":"state","state":"idle","previous":"speaking","turn":null}"#
            ),
            Ok(ServerMessage::State {
                state: VipState::Idle,
                previous: VipState::Speaking,
                turn: None
            })
        );
        let err = ServerMessage::decode(r#"{"type":"state","state":"asleep","previous":"idle"}"#)
            .unwrap_err();
        assert_eq!(err.payload().details[0].message, "unknown state `asleep`");
        assert_eq!(
            ServerMessage::decode(
                r#"{"type":"turn.latency","turn":2,"end_of_speech_to_first_audio_ms":840,"end_of_speech_to_transcript_ms":null}"#
            ),
            Ok(ServerMessage::TurnLatency {
                turn: 2,
                end_of_speech_to_first_audio_ms: 840,
                end_of_speech_to_transcript_ms: None
            })
        );
    }
}
