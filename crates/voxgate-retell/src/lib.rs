//! Retell's custom-LLM WebSocket protocol: typed events both ways, a sans-IO response tracker
//! and a Retell-side driver.
//!
//! Retell is the WebSocket *client*; a custom-LLM server accepts it at
//! `{base}/llm-websocket/{call_id}`. Every text frame is one JSON object:
//!
//! - Retell → server: [`RetellEvent`], tagged by `interaction_type` (`ping_pong`,
//!   `call_details`, `update_only`, `response_required`, `reminder_required`).
//! - Server → Retell: [`ServerEvent`], tagged by `response_type` (`config`, `update_agent`,
//!   `ping_pong`, `response`, `agent_interrupt`, `tool_call_invocation`, `tool_call_result`,
//!   `metadata`).
//!
//! Decoding is forward compatible: explicit `null`s count as absent, unknown fields are
//! ignored (or kept, on the call object and the config bodies), unknown event types, roles and
//! turn-taking values are kept as data, and [`ServerEvent::from_json`] also reads the
//! pre-2024 `response` without `response_type`. Decoders never panic; errors say who is to
//! blame ([`Blame`]).
//!
//! # The two machines
//!
//! [`ResponseTracker`] is the server's half of one call: which `response_id` is current, when
//! a stream has gone stale ([`TrackerOutput::Stop`]), the begin message (`response_id` 0), the
//! synthetic reminder turn, resuming after Retell reconnects to the same `call_id`, and the
//! ping/pong deadlines. [`RetellDriver`] is Retell's half, for test tools that play Retell
//! against any custom-LLM server. Both are sans-IO: they never read a clock or touch a socket.
//! Time comes in as a [`std::time::Instant`] you pass (`now`), and timers go out as the
//! deadline [`ResponseTracker::poll_timeout`] returns. The drive loop is the same for both:
//!
//! ```text
//! loop {
//!     while let Some(out) = machine.poll_output() { act on it (send a frame, start an LLM…) }
//!     wait for: a frame, work from the application, or machine.poll_timeout()
//!     frame    => machine.handle_input(now, Received(decoded frame))
//!     app work => machine.handle_input(now, Send(event))        // tracker only
//!     deadline => machine.handle_timeout(now)
//! }
//! ```
//!
//! Keep one tracker per `call_id` for the whole call, not per socket: a reconnect is
//! `handle_input(now, Connected { call_id })` on the same tracker, which sends the config
//! again and not the begin message, and generates an answer the old socket cut off again
//! from its start under the same `response_id` (a [`TrackerOutput::Generate`] right after the
//! config). Close the socket only with code 1000 (anything else ends
//! the call as an error on Retell's side); on an internal error send an apology response.
//!
//! # Example
//!
//! ```
//! use std::time::Instant;
//! use voxgate_retell::{
//!     Response, ResponseTracker, RetellEvent, ServerEvent, TrackerConfig, TrackerInput,
//!     TrackerOutput,
//! };
//!
//! let now = Instant::now();
//! let mut tracker = ResponseTracker::new(TrackerConfig::default());
//! tracker.handle_input(now, TrackerInput::Connected { call_id: "call_1".into() })?;
//!
//! let frame = r#"{"interaction_type":"response_required","response_id":1,
//!     "transcript":[{"role":"user","content":"What time do you open?"}]}"#;
//! tracker.handle_input(now, TrackerInput::Received(RetellEvent::from_json(frame)?))?;
//!
//! let mut to_retell = Vec::new();
//! while let Some(out) = tracker.poll_output() {
//!     match out {
//!         TrackerOutput::Send(ev) => to_retell.push(ev.to_json()?),
//!         TrackerOutput::Generate(g) => {
//!             // A real server streams LLM output here, chunk by chunk.
//!             let answer = Response::chunk(g.response_id, "We open at nine.", true);
//!             tracker.handle_input(now, TrackerInput::Send(ServerEvent::Response(answer)))?;
//!         }
//!         _ => {}
//!     }
//! }
//! // The config, the (empty) begin message, then the answer.
//! assert_eq!(to_retell.len(), 3);
//! assert!(to_retell[2].contains(r#""content":"We open at nine.""#));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod call;
mod de;
mod error;
mod fast;
mod retell_event;
mod server_event;
mod transcript;

pub use call::{Call, CallBounds, CallType};
/// The string type of [`Word::word`], re-exported so callers need not depend on `compact_str`.
pub use compact_str::CompactString;
pub use error::{Blame, DecodeError, EncodeError};
pub use retell_event::{
    CallDetails, INTERACTION_TYPE, PingPong, ResponseRequest, RetellEvent, UnknownEvent, UpdateOnly,
};
pub use server_event::{
    AgentConfig, AgentInterrupt, ConfigBody, Metadata, RESPONSE_TYPE, Response, ServerEvent,
    ToolCallInvocation, ToolCallResult,
};
pub use transcript::{Role, TranscriptItem, TurnTaking, Utterance, Word};

mod tracker;
pub use tracker::{
    BeginMessage, Generate, KEEPALIVE_INTERVAL, MAX_REMEMBERED_TOOL_CALLS, PING_INTERVAL,
    REMINDER_PROMPT, RequestKind, ResponseTracker, SILENCE_TIMEOUT, TrackerConfig, TrackerError,
    TrackerInput, TrackerOutput, TrackerSnapshot, TrackerStats,
};

mod driver;
pub use driver::{DriverConfig, DriverInput, DriverOutput, EndReason, RetellDriver, Violation};
