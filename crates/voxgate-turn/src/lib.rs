//! The sans-IO turn-taking machine: floor control, endpointing, interruption policy, barge-in,
//! playback tracking.
//!
//! [`TurnMachine`] implements the VIP state machine (NotConnected, Connecting, Idle, Listening,
//! Processing, Speaking, Action) with one floor holder at a time. It knows nothing of protocols,
//! codecs, sockets or clocks: the host feeds VAD changes, transcript words, client commands and
//! provider events as [`Input`]s together with the current time, and carries out the
//! [`Output`]s (start a response, deliver a chunk, clear the client's buffer, cancel a tool...).
//!
//! # Time
//! Time is a [`std::time::Instant`] passed in as `now`; the machine never reads a clock. Timers
//! go out as a deadline from [`TurnMachine::poll_timeout`]. Times that go backwards are clamped
//! to the latest seen, so the machine is deterministic: the same inputs at the same instants
//! give the same outputs. Tests drive it with a virtual clock ([`testing::Harness`]).
//!
//! # Drive loop
//! ```text
//! loop {
//!     wait for the next input, or until machine.poll_timeout()
//!     if an input arrived: machine.handle_input(now, input)?   // Err: the peer's fault
//!     else:                machine.handle_timeout(now)
//!     while let Some(out) = machine.poll_output() { act on it }
//! }
//! ```
//! For [`Input::ResponseChunk`] the host keeps the chunk until the outputs are drained and
//! forwards it only if an [`Output::Deliver`] for it came out: chunks of cancelled responses
//! never reach the client.
//!
//! # Example
//! ```
//! use std::time::{Duration, Instant};
//! use voxgate_turn::{AudioSpan, Config, Input, Output, State, TurnMachine};
//!
//! let t0 = Instant::now();
//! let mut m = TurnMachine::new(Config::default());
//! m.handle_input(t0, Input::Connect).unwrap();
//! m.handle_input(t0, Input::Connected).unwrap();
//! m.handle_input(t0, Input::SpeechStarted).unwrap();
//! m.handle_input(t0, Input::Words { text: "what time is it".into(), is_final: true }).unwrap();
//! let t1 = t0 + Duration::from_millis(800);
//! m.handle_input(t1, Input::SpeechStopped).unwrap();
//! assert_eq!(m.state(), State::Listening);
//!
//! // Endpointing: the turn ends after the minimum delay, then a response is requested.
//! let end = m.poll_timeout().unwrap();
//! assert_eq!(end - t1, Config::default().min_endpoint_delay);
//! m.handle_timeout(end);
//! let turn = std::iter::from_fn(|| m.poll_output())
//!     .find_map(|o| match o {
//!         Output::StartResponse { turn, .. } => Some(turn),
//!         _ => None,
//!     })
//!     .unwrap();
//! assert_eq!(m.state(), State::Processing);
//!
//! let audio = Some(AudioSpan { bytes: 48_000, duration: Duration::from_secs(1) });
//! m.handle_input(end, Input::ResponseChunk { turn, text: "It is noon.".into(), audio }).unwrap();
//! assert_eq!(m.state(), State::Speaking);
//! ```
//!
//! # Interruptions
//! Every source goes through one policy ([`Config`]): user speech must last
//! [`Config::min_interruption_speech`] (and carry [`Config::min_interruption_words`] words) while
//! the system holds the floor; transcript words alone count too. Barge-in emits
//! [`Output::ClearPlayback`] first, cancels generation and cancel-on-interrupt tools, records
//! the response as interrupted with exactly the heard text, and gives the user the floor. If the
//! interruption produces no words, the unheard rest is re-sent ([`Output::ResumeResponse`]).
//! Client aborts, push-to-talk, `IMMEDIATE` text and direct speech interrupt at once; direct
//! speech may itself be uninterruptible.
//!
//! Speech follows the trigger mode of the user's audio ([`Input::SpeechTrigger`], default
//! `IMMEDIATE`): with `QUEUE` or `NO_TRIGGER` it never barges in but is held until the system
//! turn ends and then becomes the user's turn; a spoken turn ending in `NO_TRIGGER` is
//! committed without a reply.
//!
//! Inputs that wait (typed text, triggers and uninterruptible direct speech behind a system
//! turn; typed texts joining one user turn) are bounded by [`MAX_QUEUED_INPUTS`]: beyond it the
//! input is refused with [`InputError::QueueFull`] and nothing is queued.

mod config;
mod machine;
mod playback;
pub mod testing;
mod text;
mod types;

pub use config::Config;
pub use machine::{MAX_QUEUED_INPUTS, Stats, TurnMachine};
pub use types::{
    AssistantTurn, AudioSpan, Delivery, Floor, Input, InputError, Interruption, Output,
    ResponseCause, ResponseKind, State, TriggerMode, TurnId, TurnLatency, UserSource, UserTurn,
};
