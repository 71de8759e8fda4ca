//! One voice conversation as a sans-IO machine: turn-taking, tools, history, sentence splitting
//! and emotion, asking providers for work through outputs.
//!
//! An [`Engine`] composes the turn machine ([`voxgate_turn`]), the VAD
//! ([`voxgate_audio::vad`]), the tool registry and the device MCP client ([`voxgate_mcp`]), the
//! emotion channel ([`emotion`]), a streaming [`sentence::Splitter`] and the
//! chat [`history`]. Every door (realtime, Xiaozhi, Gemini bridge, Retell) drives one engine per
//! conversation and only translates: protocol messages become [`Input`]s, [`ClientEvent`]s
//! become protocol messages, and [`ProviderRequest`]s go to LLM/ASR/TTS back ends whose
//! answers come back as [`Input::Provider`] tagged with the engine's [`RequestId`].
//!
//! # Structure
//! [`Engine`] is a composition, in the manner of a sans-IO peer connection built from parts:
//! it routes each input to the part that owns the state, feeds the turn machine what the
//! parts report and acts on the turn machine's outputs, in the order they come. The parts:
//! - the turn machine ([`voxgate_turn`]) decides who has the floor and which reply chunks
//!   reach the client;
//! - the capture (the VAD and the utterance being spoken) cuts speech into utterances;
//! - the reply machine owns the response being generated and delivered, the one being closed
//!   after a cancel, the chunk waiting for the turn machine's `Deliver`, chunk sequence
//!   numbers, sentence splitting and the emotion lookahead of streamed text. Each step that
//!   makes a chunk hands it back to the engine, which feeds it to the turn machine and drains
//!   its outputs before the next step, so a barge-in caused by one chunk stops the next;
//! - the tools machine holds the tool registry, the device MCP client and the calls in
//!   flight;
//! - the actions machine holds the client's VIP action registry (§5.3,
//!   [`Input::SetActions`], [`Input::NarratedState`]): declared actions are offered as tools,
//!   the narrated state goes into every reply's context as a system message right before the
//!   newest user turn, a model's call of an action becomes [`ClientEvent::ActionInvoke`] and
//!   the client's [`Input::ActionResult`] its result; a failure or timeout is reported to the
//!   model and the registry's fallback sentence is said verbatim as the follow-up reply;
//!   invocations die with the reply that made them ([`ClientEvent::ActionCancelled`]);
//! - the record machine holds the transcriptions in flight (applied in request order), the
//!   utterances heard for the user turn, the [`history`] and the queries and exports waiting
//!   for answers;
//! - the speculation machine ([`Speculation`], off by default) holds the work started at a
//!   pause in speech (recognition of the utterance so far, the generation it would get, its
//!   first sentence's synthesis) until the real pipeline asks for exactly the same work and
//!   adopts it, or cancels it at the provider; nothing of it reaches the client or history
//!   otherwise ([`Engine::speculation_stats`] counts it).
//!
//! What happened in each turn (state changes, user turns, latency figures, interruptions and
//! barge-in time, tool call round trips, response ends) is recorded as [`TurnEvent`]s for the
//! host's metrics and traces ([`telemetry`], [`Engine::take_telemetry`]); nothing in the
//! engine reads them back.
//!
//! Every per-session queue is bounded ([`EngineConfig::max_history_messages`],
//! [`MAX_PENDING_QUERIES`], [`MAX_PENDING_EXPORTS`], [`voxgate_turn::MAX_QUEUED_INPUTS`],
//! the action registry's [`voxgate_mcp::action::MAX_ACTIONS`],
//! [`voxgate_mcp::action::MAX_NARRATED_STATE_BYTES`] and
//! [`voxgate_mcp::action::MAX_ACTION_RESULT_BYTES`]):
//! beyond a bound the oldest history is dropped and counted, or the request is refused with
//! [`ClientEvent::Error`]. What the reply machine holds comes from the model's reply, never
//! from the client: one response (and the one closing), one undelivered chunk, the reply's
//! sentences (each at most [`EngineConfig::max_sentence_chars`]) and their TTS audio.
//!
//! # Drive loop
//! ```text
//! engine = Engine::new(config, now)?
//! loop {
//!     wait for: client input, a provider event, or engine.poll_timeout()
//!     client input   => engine.handle_input(now, input)        // Err: the client's fault
//!     audio          => engine.handle_audio(now, &samples)     // no copy
//!     provider event => engine.handle_input(now, Input::Provider(event))
//!     deadline       => engine.handle_timeout(now)
//!     while let Some(out) = engine.poll_output() {
//!         Output::Client(event)     => send to the client
//!         Output::Provider(request) => start it (Cancel: stop it; its late events are ignored)
//!     }
//!     for event in engine.take_telemetry() { metrics, traces, timeline }   // optional
//! }
//! ```
//! Time is only ever the `now` passed in; the same inputs at the same instants give the same
//! outputs, which is how the tests run whole conversations on a virtual clock.
//!
//! # A turn
//! Audio goes through the VAD; at the end of speech the utterance (backbuffer included, 16 kHz)
//! goes out as [`ProviderRequest::Transcribe`]. The transcript commits the user turn
//! ([`ClientEvent::UserTranscription`]) and the turn machine asks for a reply:
//! [`ProviderRequest::Generate`] with the context built from history and the tools of every
//! source. The context stays within [`EngineConfig::max_context_chars`]: the oldest exchanges
//! leave it for good, reported with [`ClientEvent::ContextTruncated`]. Text deltas pass the emotion channel (the leading emoji becomes
//! [`ClientEvent::Emotion`]), then either become [`ClientEvent::TextFragment`]s (no TTS) or are
//! split into sentences, each synthesized by its own [`ProviderRequest::Synthesize`] and
//! delivered in order as [`ClientEvent::SentenceStart`] + [`ClientEvent::AudioChunk`]s. Tool
//! calls are validated against their schema and routed to the client
//! ([`ClientEvent::ToolCallRequest`]) or to the device over MCP ([`ClientEvent::DeviceMcp`]);
//! their results trigger a follow-up generation. Barge-in clears playback, cancels the
//! provider requests and truncates the history entry to the words the user heard (from
//! playback reports, or estimated from time).
//!
//! # Example
//! ```
//! use std::time::Instant;
//! use voxgate_engine::{
//!     ClientEvent, Engine, EngineConfig, Input, Output, ProviderEvent, ProviderRequest,
//!     TriggerMode,
//! };
//!
//! let now = Instant::now();
//! let config = EngineConfig { output_audio: None, ..EngineConfig::default() };
//! let mut engine = Engine::new(config, now)?;
//! engine.handle_input(now, Input::Text { text: "Hi!".into(), mode: TriggerMode::Queue })?;
//! let id = std::iter::from_fn(|| engine.poll_output())
//!     .find_map(|o| match o {
//!         Output::Provider(ProviderRequest::Generate { id, .. }) => Some(id),
//!         _ => None,
//!     })
//!     .unwrap();
//! for event in [
//!     ProviderEvent::TextDelta { id, delta: "Hello there.".into() },
//!     ProviderEvent::Done { id },
//! ] {
//!     engine.handle_input(now, Input::Provider(event))?;
//! }
//! let shown: String = std::iter::from_fn(|| engine.poll_output())
//!     .filter_map(|o| match o {
//!         Output::Client(ClientEvent::TextFragment { text, .. }) => Some(text),
//!         _ => None,
//!     })
//!     .collect();
//! assert_eq!(shown, "Hello there.");
//! assert_eq!(engine.history()[1].text(), "Hello there.");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod actions;
mod capture;
mod config;
pub mod emotion;
mod engine;
pub mod history;
mod playback;
pub mod provider;
mod record;
mod reply;
pub mod sentence;
mod speculation;
pub mod telemetry;
mod tools;
mod types;

pub use config::{
    DEFAULT_MAX_CONTEXT_CHARS, DEFAULT_MAX_HISTORY_MESSAGES, DEFAULT_MAX_SENTENCES_AHEAD,
    DEFAULT_SPECULATE_AFTER, EngineConfig, OutputAudio, Speculation,
};
pub use engine::{Engine, SPECULATIVE_TURN};
pub use history::ChatMessage;
pub use provider::{ProviderEvent, ProviderRequest};
pub use record::{MAX_PENDING_EXPORTS, MAX_PENDING_QUERIES};
pub use speculation::SpeculationStats;
pub use telemetry::{MAX_TELEMETRY_EVENTS, ToolKind, ToolOutcome, TurnEvent};
pub use types::ServerToolDefinition;
pub use types::{
    ClientEvent, ConfigError, ErrorCategory, Input, InputError, Output, RequestId, ToolDefinition,
    TurnId,
};
/// The VIP action registry's values, used in [`Input::SetActions`], [`Input::ActionResult`]
/// and the action [`ClientEvent`]s.
pub use voxgate_mcp::action::{Action, ActionConfig, ActionOutcome, InvocationId};
/// The standard error payload of failed actions and tool calls.
pub use voxgate_mcp::schema::{ErrorCode, ErrorPayload};
/// The turn machine's trigger modes and states, used in [`Input::Text`] and [`Engine::state`].
pub use voxgate_turn::{State, TriggerMode};
