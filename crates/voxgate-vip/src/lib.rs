//! The Voice Interaction Protocol (VIP) as voxgate's browser door speaks it: the JSON
//! messages of the WebRTC data channel, both ways, and VIP's session state machine (§5.2).
//!
//! A pure codec: no I/O, no async runtime, no clock, no other voxgate crate. The wire shapes
//! are `docs/doors/vip.md`.
//!
//! - [`ClientMessage`] (browser to server: `actions.declare`, `state.narrate`,
//!   `action.result`, `input.detected`, `input.text`, `session.end`, `error.fatal`) decodes
//!   tolerantly (explicit `null` is an absent field, unknown fields are ignored, unknown types
//!   are kept as [`ClientMessage::Unknown`]) and strictly where it matters: every size a client
//!   sets is bounded (the `MAX_*` constants), ids are checked, action ids are unique, parameter
//!   schemas are object schemas, an `action.result` is either a success or an error payload.
//!   A refusal is a [`DecodeError`] whose [`payload`](DecodeError::payload) is the `error`
//!   reply.
//! - [`ServerMessage`] (server to browser) encodes with the documented field names, `type`
//!   first; both types also decode and encode the other way, for clients and tests.
//! - [`VipMachine`]: the server's state machine; every [`StateChange`] it returns is a
//!   `state` message.
//!
//! Decoders never panic.
//!
//! ```
//! use voxgate_vip::{ClientMessage, ErrorPayload, ServerMessage, VipInput, VipMachine};
//!
//! let reply = match ClientMessage::decode(r#"{"type":"input.text","text":"hi","extra":null}"#) {
//!     Ok(ClientMessage::InputText { text }) => {
//!         let mut machine = VipMachine::new();
//!         let change = machine.handle_input(VipInput::TextInput { turn: 1 }).expect("idle to processing");
//!         assert_eq!(text, "hi");
//!         change.message()
//!     }
//!     Ok(ClientMessage::Unknown { type_name }) => ErrorPayload::unknown_type(&type_name).into(),
//!     Ok(_) => unreachable!(),
//!     Err(e) => e.payload().into(),
//! };
//! assert_eq!(
//!     reply.encode(),
//!     r#"{"type":"state","state":"processing","previous":"idle","turn":1}"#
//! );
//!
//! // Bad input becomes the `error` reply, naming the field.
//! let err = ClientMessage::decode(r#"{"type":"input.text"}"#).unwrap_err();
//! assert_eq!(
//!     ServerMessage::from(err.payload()).encode(),
//!     r#"{"type":"error","code":"invalid_message","message":"invalid `input.text`: /text: required","details":[{"path":"/text","message":"required"}]}"#
//! );
//! ```

mod error;
mod machine;
mod message;
mod wire;

pub use error::{DecodeError, ErrorCode, ErrorPayload, Violation};
pub use machine::{StateChange, VipInput, VipMachine, VipState};
pub use message::{
    ActionDeclaration, ActionOutcome, AudioFormat, ClientMessage, Limits, ServerMessage,
    SessionConnected,
};

/// The protocol version in `session.connected`.
pub const PROTOCOL: &str = "vip/1";

/// Largest data-channel message accepted from a client, in bytes. Checked before parsing.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// Most actions in one `actions.declare`. The same as the engine's
/// `voxgate_mcp::action::MAX_ACTIONS` (duplicated, not imported: codec crates depend on no
/// other voxgate crate), so a declaration this crate accepts is never refused whole later.
pub const MAX_ACTIONS: usize = 64;

/// Longest action id, in bytes: the tool registry's name limit
/// (`voxgate_mcp::registry::MAX_TOOL_NAME_BYTES`).
pub const MAX_ACTION_ID_BYTES: usize = 128;

/// Longest action description, in bytes. Below the engine's per-tool limit (16 KiB): 64 of
/// them must fit in one message, and a sentence or two is what a model needs.
pub const MAX_ACTION_DESCRIPTION_BYTES: usize = 2 * 1024;

/// Longest narrated state, in UTF-8 bytes: the engine's
/// `voxgate_mcp::action::MAX_NARRATED_STATE_BYTES`.
pub const MAX_NARRATED_STATE_BYTES: usize = 8 * 1024;

/// Largest `action.result` data or error payload, in bytes of compact JSON: the engine's
/// `voxgate_mcp::action::MAX_ACTION_RESULT_BYTES`.
pub const MAX_ACTION_RESULT_BYTES: usize = 16 * 1024;

/// Longest `invocation_id` a client may quote, in bytes (the server's own are much shorter).
pub const MAX_INVOCATION_ID_BYTES: usize = 128;

/// Longest typed turn (`input.text`), in bytes: a long paragraph.
pub const MAX_INPUT_TEXT_BYTES: usize = 4 * 1024;

/// A client's `error.fatal` `code` is cut to this many bytes.
pub const MAX_FATAL_CODE_BYTES: usize = 64;

/// A client's `error.fatal` `message` is cut to this many bytes (it is logged).
pub const MAX_FATAL_MESSAGE_BYTES: usize = 1024;

/// An unknown message's `type` is kept cut to this many bytes (it is quoted in the
/// `unknown_type` reply).
pub const MAX_TYPE_NAME_BYTES: usize = 64;

// The README's example is compiled and run with the doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
