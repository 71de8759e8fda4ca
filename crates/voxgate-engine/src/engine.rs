//! The conversation machine: a composition of the turn machine, the capture (VAD), the reply
//! machine ([`crate::reply`]), the tools machine ([`crate::tools`]) and the record machine
//! ([`crate::record`]). Each owns its state; this file routes inputs to them, feeds the turn
//! machine what they report and acts on its outputs, in the order they come.

use std::collections::VecDeque;
use std::mem;
use std::time::{Duration, Instant};

use serde_json::Value;
use voxgate_audio::vad::VadState;
use voxgate_turn::{
    Delivery, Input as TurnInput, Output as TurnOutput, ResponseCause, State, TriggerMode,
    TurnMachine, UserSource,
};

use crate::actions::{Actions, ActionsEvent};
use crate::capture::{Capture, CaptureEvent};
use crate::config::EngineConfig;
use crate::history::{ChatMessage, Content};
use crate::provider::{ContextMessage, ProviderEvent, ProviderRequest, ToolSpec};
use crate::record::{Record, Said};
use crate::reply::{Reply, Routed, Tts};
use crate::speculation::{GenerationKey, Held, Routing, SpeculationStats, Speculator};
use crate::telemetry::{Telemetry, ToolOutcome, TurnEvent};
use crate::tools::{CallInfo, Dispatch, Tools, ToolsEvent};
use crate::types::{
    ClientEvent, ConfigError, ErrorCategory, Input, InputError, Output, RequestId, TurnId,
};

/// History's result for a tool call cancelled before it answered, so every call there is
/// answered and later contexts stay valid.
const CANCELLED_CALL: &str = "the call was cancelled before it finished";

/// The face a reply that failed before its first word shows on doors with an emotion channel:
/// the firmware faces' `confused` ([`crate::emotion::FACES`]).
const FAILURE_FACE: &str = "🙄";

/// One conversation as a sans-IO machine. See the crate docs for the drive loop.
#[derive(Debug)]
pub struct Engine {
    config: EngineConfig,
    turn: TurnMachine,
    capture: Capture,
    /// The recognizer is in use: the turn machine waits for transcripts before ending turns.
    transcribing_enabled: bool,
    tools: Tools,
    /// The client's declared actions, narrated state and invocations in flight (VIP §5.3).
    actions: Actions,
    next_request: u64,
    outputs: VecDeque<Output>,
    /// Transcripts in flight, what was heard, history, queries and exports.
    record: Record,
    /// The reply in progress (and the one closing), its sentences and undelivered chunk.
    reply: Reply,
    /// Provider events for requests no longer awaited.
    stale_events: u64,
    /// [`Input::Close`] was handled.
    closed: bool,
    /// A reply's generation held until a just-connected device has listed its tools (or
    /// [`crate::tools::FIRST_LISTING_WAIT`] passed), so the first turn sees them.
    held: Option<HeldGeneration>,
    /// Speculative work at pauses and the adopted requests still running
    /// ([`crate::Speculation`]).
    spec: Speculator,
    /// Utterances the VAD has started, numbering them so a speculative recognition is only
    /// adopted for the utterance it was taken from.
    utterances: u64,
    /// What happened in each turn, for the host ([`Engine::take_telemetry`]); never read here.
    telemetry: Telemetry,
}

/// The turn of speculative requests ([`ProviderRequest::Generate`] and
/// [`ProviderRequest::Synthesize`] sent at a pause, before the user's turn has ended): no
/// response exists yet. The turn machine never numbers a turn 0.
pub const SPECULATIVE_TURN: TurnId = TurnId(0);

/// A `Generate` request waiting for the device's tools; the tools are read when it goes out.
#[derive(Debug)]
struct HeldGeneration {
    id: RequestId,
    turn: TurnId,
    messages: Vec<ContextMessage>,
}

impl Engine {
    /// A conversation that has just started (the turn machine is connected and Idle).
    ///
    /// # Errors
    /// [`ConfigError`] when the VAD settings, the input rate or the output audio are unusable.
    pub fn new(config: EngineConfig, now: Instant) -> Result<Self, ConfigError> {
        if config.output_audio.is_some_and(|o| o.bytes_per_second == 0) {
            return Err(ConfigError::OutputAudio);
        }
        let capture = new_capture(&config, config.input_rate)?;
        let reply = Reply::new(&config);
        let actions = Actions::new(config.actions.clone());
        let max_history_messages = config.max_history_messages;
        let mut turn = TurnMachine::new(config.turn.clone());
        for input in [TurnInput::Connect, TurnInput::Connected] {
            // Valid in this order on a fresh machine.
            let _ = turn.handle_input(now, input);
        }
        while turn.poll_output().is_some() {}
        Ok(Self {
            config,
            turn,
            capture,
            transcribing_enabled: false,
            tools: Tools::new(),
            actions,
            record: Record::new(max_history_messages),
            reply,
            next_request: 1,
            outputs: VecDeque::new(),
            stale_events: 0,
            closed: false,
            held: None,
            spec: Speculator::new(),
            utterances: 0,
            telemetry: Telemetry::default(),
        })
    }

    /// The turn-taking state (Idle, Listening, Processing, Speaking, Action).
    #[must_use]
    pub fn state(&self) -> State {
        self.turn.state()
    }

    /// The conversation so far.
    #[must_use]
    pub fn history(&self) -> &[ChatMessage] {
        self.record.messages()
    }

    /// The tools offered to the model, with the names it sees.
    #[must_use]
    pub fn llm_tools(&self) -> Vec<ToolSpec> {
        self.tools.llm_tools()
    }

    /// Whether the session was closed ([`Input::Close`]).
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Provider events dropped because their request was cancelled or superseded.
    #[must_use]
    pub fn stale_events(&self) -> u64 {
        self.stale_events
    }

    /// The turn machine's counters (interruptions, stale inputs...).
    #[must_use]
    pub fn turn_stats(&self) -> voxgate_turn::Stats {
        self.turn.stats()
    }

    /// Counters of speculative work ([`crate::Speculation`]): speculations started, adopted
    /// and discarded, speculative requests sent, adopted and cancelled.
    #[must_use]
    pub fn speculation_stats(&self) -> SpeculationStats {
        self.spec.stats()
    }

    /// Drains the turn events observed since the last call, oldest first (see
    /// [`crate::telemetry`]). Optional: the engine never reads them, and keeps at most
    /// [`crate::MAX_TELEMETRY_EVENTS`] for a host that does not drain (the oldest go first,
    /// counted by [`Engine::telemetry_dropped`]).
    pub fn take_telemetry(&mut self) -> std::collections::vec_deque::Drain<'_, TurnEvent> {
        self.telemetry.drain()
    }

    /// Turn events dropped because more than [`crate::MAX_TELEMETRY_EVENTS`] waited undrained.
    #[must_use]
    pub fn telemetry_dropped(&self) -> u64 {
        self.telemetry.dropped()
    }

    /// The next output, if any. Drain after every `handle_*` call.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    /// The earliest instant at which [`Engine::handle_timeout`] has work to do.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        let held = self.held.as_ref().and(self.tools.first_listing_deadline());
        [
            self.turn.poll_timeout(),
            self.tools.poll_timeout(),
            self.actions.poll_timeout(),
            self.reply.synthesis_deadline(),
            held,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Runs the timers due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.turn.handle_timeout(now);
        self.pump(now);
        self.tools.handle_timeout(now);
        self.pump_mcp(now);
        self.actions.handle_timeout(now);
        self.pump_actions(now);
        self.release_held(now);
        self.request_synthesis(now);
        self.settle(now);
    }

    /// Feeds mono audio at the configured input rate without copying it into an [`Input`].
    pub fn handle_audio(&mut self, now: Instant, samples: &[f32]) {
        if self.closed {
            return;
        }
        self.enable_transcripts(now);
        self.capture.process(samples);
        self.capture_events(now);
        self.settle(now);
    }

    /// Feeds mono 16-bit audio at the configured input rate.
    pub fn handle_audio_i16(&mut self, now: Instant, samples: &[i16]) {
        if self.closed {
            return;
        }
        self.enable_transcripts(now);
        self.capture.process_i16(samples);
        self.capture_events(now);
        self.settle(now);
    }

    /// Sets the trigger mode of the audio fed from now on (realtime `UserInput.mode`), before
    /// the audio itself. Default [`TriggerMode::Immediate`]: speech may barge in and every
    /// spoken turn is answered. With [`TriggerMode::Queue`] speech during a reply never cuts
    /// it (no [`ClientEvent::ClearPlayback`]) and is answered once the reply is over; with
    /// [`TriggerMode::NoTrigger`] the spoken turn is transcribed and committed to history
    /// (its [`ClientEvent::UserTranscription`] is sent) without a reply, which a later
    /// `TriggerInference` or triggering input asks for. The mode when the VAD reports the end
    /// of an utterance decides whether it is answered; the mode when speech starts (or
    /// resumes) during a reply decides whether it may interrupt. Cheap when unchanged.
    pub fn set_audio_trigger(&mut self, now: Instant, mode: TriggerMode) {
        if self.closed || self.turn.speech_trigger() == mode {
            return;
        }
        self.feed_internal(now, TurnInput::SpeechTrigger(mode));
        self.pump(now);
        self.settle(now);
    }

    /// Feeds one input at time `now`.
    ///
    /// Provider events for requests no longer awaited are dropped and counted
    /// ([`Engine::stale_events`]): they are races with a cancel, not errors.
    ///
    /// # Errors
    /// [`InputError`] when the client broke the protocol (an unknown tool call id, an empty
    /// query). The engine is unchanged then; report it with [`InputError::category`].
    pub fn handle_input(&mut self, now: Instant, input: Input) -> Result<(), InputError> {
        if self.closed {
            return match input {
                Input::Close => Ok(()),
                Input::Provider(_) => {
                    self.stale_events += 1;
                    Ok(())
                }
                _ => Err(InputError::Closed),
            };
        }
        match input {
            Input::Close => self.close(now),
            Input::Audio(samples) => self.handle_audio(now, &samples),
            Input::AudioI16(samples) => self.handle_audio_i16(now, &samples),
            Input::Text { text, mode } => self.feed(now, TurnInput::Text { text, mode })?,
            Input::AudioTrigger(mode) => self.set_audio_trigger(now, mode),
            Input::TriggerInference {
                instructions,
                flush_vad,
            } => self.trigger(now, instructions, flush_vad)?,
            Input::StartCapture => self.feed(now, TurnInput::StartCapture)?,
            Input::StopCapture => self.feed(now, TurnInput::StopCapture)?,
            Input::Abort => self.feed(now, TurnInput::Abort)?,
            Input::Reconfigure {
                input_rate,
                system_prompt,
                temperature,
            } => {
                if let Some(rate) = input_rate.filter(|r| *r != self.config.input_rate) {
                    let capture = new_capture(&self.config, rate)
                        .map_err(|source| InputError::InputRate { rate, source })?;
                    let mut old = mem::replace(&mut self.capture, capture);
                    self.capture.dropped = old.dropped;
                    self.config.input_rate = rate;
                    old.finish();
                    self.capture_events_of(now, &mut old);
                }
                if let Some(p) = system_prompt {
                    self.config.system_prompt = p;
                }
                if let Some(t) = temperature {
                    self.config.temperature = Some(t);
                }
            }
            Input::DirectSpeech {
                text,
                include_in_history,
                uninterruptible,
            } => self.feed(
                now,
                TurnInput::DirectSpeech {
                    text,
                    include_in_history,
                    uninterruptible,
                },
            )?,
            Input::PlaybackReport { turn, bytes_played } => {
                self.reply.report_playback(turn, bytes_played);
                self.feed(now, TurnInput::PlaybackProgress { turn, bytes_played })?;
                self.request_synthesis(now);
            }
            Input::SetTools(tools) => {
                for error in self.tools.set_client_tools(tools) {
                    self.client(error);
                }
            }
            Input::ServerTools(tools) => {
                // What the registry still refuses (over its size bound with the client's and
                // device's tools) is not the client's doing: it is left out, not reported.
                let _ = self.tools.set_server_tools(tools);
            }
            Input::ToolResult { id, result } => self.client_tool_result(now, id, result)?,
            Input::SetActions(actions) => {
                self.actions.declare(now, actions);
                self.pump_actions(now);
            }
            Input::NarratedState(text) => {
                self.actions.narrate(now, text);
                self.pump_actions(now);
            }
            Input::ActionResult {
                invocation,
                outcome,
            } => {
                self.actions.result(now, invocation, outcome);
                self.pump_actions(now);
            }
            Input::DeviceMcpStart => {
                self.tools.start_device(now);
                self.pump_mcp(now);
            }
            Input::DeviceMcp(payload) => {
                self.tools.device_input(now, payload)?;
                self.pump_mcp(now);
            }
            Input::ConversationQuery {
                prompt,
                instructions,
            } => {
                let request = self.record.query(
                    prompt,
                    instructions,
                    &self.config.system_prompt,
                    self.config.max_context_chars,
                    &mut self.next_request,
                )?;
                match request {
                    Ok(request) => self.provider(request),
                    Err(refused) => self.client(refused),
                }
            }
            Input::ExportHistory {
                await_pending,
                exclude_audio,
            } => {
                if await_pending && self.pending_work() {
                    if let Err(refused) = self.record.await_export(exclude_audio) {
                        self.client(refused);
                    }
                } else {
                    self.export_now(exclude_audio);
                }
            }
            Input::Provider(event) => self.provider_event(now, event),
        }
        self.settle(now);
        Ok(())
    }

    /// `TriggerInference`. A flush while the user's speech is still being captured or
    /// transcribed must not end the turn before its words are in: the utterance is cut here
    /// and sent for transcription, and the turn is stopped explicitly (it ends as soon as the
    /// transcripts arrive) with the trigger waiting on it.
    fn trigger(
        &mut self,
        now: Instant,
        instructions: Option<String>,
        flush_vad: bool,
    ) -> Result<(), InputError> {
        let transcribing = self.capture.in_utterance() || self.record.transcribing();
        if flush_vad && transcribing && self.turn.state() == State::Listening {
            self.capture.flush();
            self.capture_events(now);
            if self.record.transcribing() {
                // Words already in (an earlier part's transcript) must not end the turn
                // before the flushed part is transcribed; its transcript resets this.
                self.feed_internal(now, TurnInput::EndOfTurnPrediction { probability: 0.0 });
            }
            self.feed(now, TurnInput::StopCapture)?;
            return self.feed(
                now,
                TurnInput::TriggerInference {
                    instructions,
                    flush_vad: false,
                },
            );
        }
        self.feed(
            now,
            TurnInput::TriggerInference {
                instructions,
                flush_vad,
            },
        )
    }

    /// Ends the session: the turn machine's disconnect path cuts off the response and cancels
    /// the tools it tracks; everything else in flight is cancelled here.
    fn close(&mut self, now: Instant) {
        self.telemetry.closing();
        self.feed_internal(now, TurnInput::Disconnected);
        self.pump(now);
        // The turn machine's CancelResponse already cancelled the work of a response it cut
        // off (closing in the reply machine); the response in progress was not cancelled yet.
        for id in self.reply.close() {
            self.provider(ProviderRequest::Cancel { id });
        }
        for id in self.record.close() {
            self.provider(ProviderRequest::Cancel { id });
        }
        for id in self.tools.server_requests() {
            self.provider(ProviderRequest::Cancel { id });
        }
        // Calls the turn machine did not track (refused ones awaiting generation's end).
        for (call_id, info) in self.tools.close() {
            self.record
                .tool_result(now, &call_id, CANCELLED_CALL.to_owned());
            self.tool_ended(now, info, ToolOutcome::Cancelled);
        }
        self.actions.close();
        self.spec.close();
        self.send_spec_cancels();
        self.closed = true;
    }

    // ---- plumbing ------------------------------------------------------------------------

    fn client(&mut self, event: ClientEvent) {
        self.outputs.push_back(Output::Client(event));
    }

    fn request(&mut self) -> RequestId {
        crate::record::next_id(&mut self.next_request)
    }

    /// Sends a request of the real pipeline: a generation or synthesis that speculative work
    /// already did is adopted instead of sent, and a cancel of adopted work reaches the
    /// speculative request the provider knows.
    fn provider(&mut self, request: ProviderRequest) {
        let request = match request {
            ProviderRequest::Cancel { id } => ProviderRequest::Cancel {
                id: self.spec.cancel_target(id),
            },
            r @ (ProviderRequest::Generate { .. } | ProviderRequest::Synthesize { .. }) => {
                let adopted = self.spec.adopt(&r);
                self.send_spec_cancels();
                if adopted {
                    return;
                }
                r
            }
            r => r,
        };
        self.outputs.push_back(Output::Provider(request));
    }

    /// Cancels at the provider the speculative work that can no longer be adopted.
    fn send_spec_cancels(&mut self) {
        for id in self.spec.take_cancels() {
            self.outputs
                .push_back(Output::Provider(ProviderRequest::Cancel { id }));
        }
    }

    /// Feeds the turn machine and acts on what it says. A full queue of waiting inputs is
    /// reported to the client and the input dropped, like the other per-session bounds.
    fn feed(&mut self, now: Instant, input: TurnInput) -> Result<(), InputError> {
        match self.turn.handle_input(now, input) {
            Err(e @ voxgate_turn::InputError::QueueFull { .. }) => {
                self.client(ClientEvent::Error {
                    category: ErrorCategory::Session,
                    message: format!("input refused: {e}"),
                });
                return Ok(());
            }
            r => r?,
        }
        self.pump(now);
        Ok(())
    }

    /// Feeds an input the engine itself generated; a refusal would be an engine bug, so it is
    /// reported rather than returned.
    fn feed_internal(&mut self, now: Instant, input: TurnInput) {
        if let Err(e) = self.turn.handle_input(now, input) {
            self.client(ClientEvent::Error {
                category: ErrorCategory::Internal,
                message: e.to_string(),
            });
        }
    }

    fn enable_transcripts(&mut self, now: Instant) {
        if !self.transcribing_enabled {
            self.transcribing_enabled = true;
            // Empty words in Idle only tell the turn machine a recognizer feeds it, so spoken
            // turns wait for their transcript instead of ending empty.
            self.feed_internal(
                now,
                TurnInput::Words {
                    text: String::new(),
                    is_final: false,
                },
            );
            self.pump(now);
        }
    }

    fn pending_work(&self) -> bool {
        self.turn.current_response().is_some() || self.tools.pending()
    }

    fn export_now(&mut self, exclude_audio: bool) {
        let event = self.record.export(exclude_audio);
        self.client(event);
    }

    // ---- audio in ------------------------------------------------------------------------

    fn capture_events(&mut self, now: Instant) {
        while let Some(event) = self.capture.poll_event() {
            self.capture_event(now, event);
        }
    }

    /// Drains a capture that is no longer `self.capture` (replaced by an input-rate change).
    fn capture_events_of(&mut self, now: Instant, capture: &mut Capture) {
        while let Some(event) = capture.poll_event() {
            self.capture_event(now, event);
        }
    }

    fn capture_event(&mut self, now: Instant, event: CaptureEvent) {
        match event {
            CaptureEvent::Transition(from, to, position, behind, evidence) => {
                self.client(ClientEvent::VadState { from, to, position });
                if (from, to) == (VadState::SpeechEnding, VadState::Speech) {
                    // The pause was part of the utterance: what was speculated is not it.
                    self.spec.discard();
                    self.send_spec_cancels();
                }
                match (from, to) {
                    // From Speech only when the stream ends mid-utterance (`Capture::finish`).
                    (VadState::SpeechEnding | VadState::Speech, VadState::Silence) => {
                        // The VAD decided inside the block that just arrived: endpointing
                        // counts from that sample, not from the block's end (up to a 60 ms
                        // Opus frame later). The machine never lets time go backwards, so at
                        // worst this is its last `now`.
                        let at = now.checked_sub(behind).unwrap_or(now);
                        // The operator's figures count from the last voiced audio, the VAD's
                        // silence before this decision earlier.
                        if let Some(voiced) = at.checked_sub(evidence) {
                            self.telemetry.speech_ended(voiced);
                        }
                        self.feed_internal(at, TurnInput::SpeechStopped);
                        self.pump(now);
                    }
                    // Possible speech holds the endpoint until the VAD decides.
                    (VadState::Silence, VadState::SpeechStarting) => {
                        self.feed_internal(now, TurnInput::SpeechOnset);
                    }
                    (VadState::SpeechStarting, VadState::Silence) => {
                        self.feed_internal(now, TurnInput::SpeechOnsetRejected);
                        self.pump(now);
                    }
                    _ => {}
                }
            }
            CaptureEvent::Frame(f) => self.client(ClientEvent::VadFrame {
                index: f.index,
                confidence: f.confidence,
                volume: f.volume,
                state: f.state,
            }),
            CaptureEvent::SpeechStarted(_, ago) => {
                self.telemetry.speech_resumed();
                if matches!(
                    self.turn.state(),
                    State::Processing | State::Speaking | State::Action
                ) {
                    self.telemetry.speech_started(
                        onset_wall(now, ago),
                        self.turn.stats().rejected_interruptions,
                    );
                }
                // The user goes on (a new utterance): the turn will not be what was
                // speculated.
                self.utterances += 1;
                self.spec.discard();
                self.send_spec_cancels();
                self.feed_internal(now, TurnInput::SpeechStarted);
                self.pump(now);
            }
            CaptureEvent::SpeechEnded(audio) => {
                let id = self.request();
                // The copy is only for the history's user audio; without it the recognizer's
                // request holds the only one.
                let kept = if self.config.keep_user_audio {
                    audio.clone()
                } else {
                    Vec::new()
                };
                self.record.transcribe(id, kept);
                let adopted = self.spec.adopt_transcription(id, self.utterances);
                self.send_spec_cancels();
                if !adopted {
                    self.provider(ProviderRequest::Transcribe {
                        id,
                        audio,
                        sample_rate: voxgate_audio::vad::MODEL_RATE,
                    });
                }
            }
            CaptureEvent::Paused(audio) => {
                // Speculate only for the user's own turn (not over a reply that speech may
                // interrupt): its context is then what history holds now.
                if self.turn.state() != State::Listening {
                    return;
                }
                let id = self.request();
                self.spec.start(id, self.utterances);
                self.send_spec_cancels();
                self.outputs
                    .push_back(Output::Provider(ProviderRequest::Transcribe {
                        id,
                        audio,
                        sample_rate: voxgate_audio::vad::MODEL_RATE,
                    }));
            }
        }
    }

    // ---- turn machine outputs ------------------------------------------------------------

    fn pump(&mut self, now: Instant) {
        while let Some(out) = self.turn.poll_output() {
            self.on_turn_output(now, out);
        }
        if self.record.has_exports() && !self.pending_work() {
            for exclude_audio in self.record.take_exports() {
                self.export_now(exclude_audio);
            }
        }
    }

    fn on_turn_output(&mut self, now: Instant, out: TurnOutput) {
        self.observe(now, &out);
        if matches!(out, TurnOutput::UserTurn(_) | TurnOutput::UserTurnDiscarded) {
            // The user turn being speculated for ends here: no generation starts for it any
            // more (the real one, if any, follows at once).
            self.spec.turn_over();
        }
        match out {
            TurnOutput::UserTurn(u) if u.source == UserSource::Speech => {
                let event = self.record.user_speech(
                    now,
                    u.turn,
                    u.text,
                    self.config.keep_user_audio,
                    self.config.max_history_audio,
                );
                self.client(event);
            }
            TurnOutput::UserTurn(u) => self.record.user_text(now, u.turn, u.text),
            TurnOutput::UserTurnDiscarded => self.record.discard_heard(),
            TurnOutput::StartResponse {
                turn,
                instructions,
                cause,
            } => {
                if let Some(text) = instructions {
                    self.record.instructions(now, turn, text);
                }
                // Taken at every start, so a fallback never outlives its follow-up.
                if let Some(fallback) = self.actions.take_fallback()
                    && cause == ResponseCause::ToolResults
                {
                    self.say_fallback(now, turn, &fallback);
                    return;
                }
                let id = self.request();
                self.reply.begin(turn, Some(id));
                let (mut messages, truncated) = self.record.response_context(
                    &self.config.system_prompt,
                    self.config.max_context_chars,
                    self.actions.narrated_chars(),
                    turn,
                );
                self.actions.add_narrated(&mut messages);
                if !truncated.is_empty() {
                    self.client(ClientEvent::ContextTruncated {
                        truncated,
                        response: turn,
                    });
                }
                if self.tools.awaiting_first_listing(now).is_some() {
                    self.held = Some(HeldGeneration { id, turn, messages });
                } else {
                    self.generate(id, turn, messages);
                }
            }
            TurnOutput::Speak { turn, text } | TurnOutput::ResumeResponse { turn, text, .. } => {
                self.reply.begin_direct(turn);
                self.reply_text(now, &text);
                self.end_reply_text(now);
            }
            TurnOutput::ResponseBegun { turn } => {
                self.record.begin_reply(now, turn);
                self.client(ClientEvent::ResponseBegin { turn });
            }
            TurnOutput::Deliver { turn, seq } => {
                for e in self.reply.deliver(turn, seq) {
                    self.client(e);
                }
            }
            TurnOutput::GenerationEnded { turn } if self.reply.generation_ended(turn) => {
                self.client(ClientEvent::ResponseEnd { turn });
            }
            TurnOutput::CancelResponse { turn } => {
                for id in self.reply.cancel(turn) {
                    if self.held.as_ref().is_some_and(|h| h.id == id) {
                        // Never sent: nothing to cancel at the provider.
                        self.held = None;
                    } else {
                        self.provider(ProviderRequest::Cancel { id });
                    }
                }
            }
            TurnOutput::CancelTool { call_id } if self.tools.contains(&call_id) => {
                if let Some(id) = self.tools.server_request(&call_id) {
                    self.provider(ProviderRequest::Cancel { id });
                }
                if let Some(info) = self.tools.cancel(&call_id) {
                    self.tool_ended(now, info, ToolOutcome::Cancelled);
                }
                self.record
                    .tool_result(now, &call_id, CANCELLED_CALL.to_owned());
                self.actions.cancel_call(&call_id);
                self.pump_actions(now);
            }
            TurnOutput::ClearPlayback { .. } => self.client(ClientEvent::ClearPlayback),
            TurnOutput::ResponseEnded(a) => {
                let interrupted = matches!(a.delivery, Delivery::Interrupted { .. });
                let reports = self.config.turn.playback_reports;
                let ended = self.reply.end(a.turn, now, interrupted, reports);
                let (said, end_sent) = match ended {
                    Some(e) => (e.sentences, e.end_sent),
                    None => (None, false),
                };
                let said = said.map_or_else(
                    || Said::Text(a.heard_text.trim().to_owned()),
                    Said::Sentences,
                );
                self.record.reply_ended(
                    now,
                    a.turn,
                    said,
                    interrupted,
                    a.ephemeral,
                    self.config.max_history_audio,
                );
                if !end_sent {
                    self.client(ClientEvent::ResponseEnd { turn: a.turn });
                }
                self.client(ClientEvent::ResponseFinished {
                    turn: a.turn,
                    interrupted,
                });
            }
            TurnOutput::ErrorFatal { reason } => self.client(ClientEvent::Error {
                category: ErrorCategory::Internal,
                message: reason,
            }),
            _ => {}
        }
    }

    /// Records what a turn machine output tells the host's telemetry, before it is acted on.
    fn observe(&mut self, now: Instant, out: &TurnOutput) {
        let t = &mut self.telemetry;
        match out {
            TurnOutput::StateChanged { to, .. } => {
                if !matches!(to, State::Processing | State::Speaking | State::Action) {
                    t.floor_left_system();
                }
                t.push(TurnEvent::State { to: *to, at: now });
            }
            TurnOutput::UserTurn(u) => {
                let speech = u.source == UserSource::Speech;
                t.user_turn(speech);
                t.push(TurnEvent::UserTurn {
                    turn: u.turn,
                    speech,
                    at: now,
                });
            }
            TurnOutput::UserTurnDiscarded => t.speech_resumed(),
            TurnOutput::Latency(l) => t.latency(*l),
            TurnOutput::ResponseBegun { turn } => t.begun(*turn),
            TurnOutput::ClearPlayback { turn } => t.cleared(*turn, now),
            TurnOutput::CancelResponse { turn } => t.cancelled(*turn, now),
            TurnOutput::ResumeResponse { interrupted, .. } => {
                t.push(TurnEvent::FalseInterruption {
                    turn: *interrupted,
                    at: now,
                });
            }
            TurnOutput::ResponseEnded(a) => {
                let by = match a.delivery {
                    Delivery::Interrupted { by } => Some(by),
                    _ => None,
                };
                t.response_ended(a.turn, by, now);
            }
            _ => {}
        }
    }

    // ---- the reply -----------------------------------------------------------------------

    /// Streamed reply text, through the reply machine.
    fn reply_text(&mut self, now: Instant, text: &str) {
        let routed = self
            .reply
            .text(text, self.config.emotion.as_ref(), &mut self.next_request);
        self.routed(now, routed);
    }

    /// Acts on what reply text became: the face, the sentences to synthesize, the text chunk
    /// (fed to the turn machine, which delivers it).
    fn routed(&mut self, now: Instant, routed: Routed) {
        if let Some(event) = routed.emotion {
            self.client(event);
        }
        self.request_synthesis(now);
        if let Some(chunk) = routed.chunk {
            self.feed_internal(now, chunk);
            self.pump(now);
        }
    }

    /// Ends the reply's text: flushes the emotion lookahead and the last sentence.
    fn end_reply_text(&mut self, now: Instant) {
        let routed = self
            .reply
            .settle_emotion(self.config.emotion.as_ref(), &mut self.next_request);
        self.routed(now, routed);
        self.reply.end_text(&mut self.next_request);
        self.request_synthesis(now);
        self.flush_reply(now);
    }

    /// Sends the reply's sentences that playback has made room for to TTS.
    fn request_synthesis(&mut self, now: Instant) {
        let reports = self.config.turn.playback_reports;
        for request in self.reply.due_synthesis(now, reports) {
            self.provider(request);
        }
    }

    /// Delivers TTS audio of the head sentence(s) in order, one chunk at a time so the turn
    /// machine sees each (and may cut the reply) before the next, then ends generation when
    /// all is said.
    fn flush_reply(&mut self, now: Instant) {
        while let Some(chunk) = self.reply.next_audio(now) {
            self.feed_internal(now, chunk);
            self.pump(now);
        }
        // A finished sentence makes room for the next.
        self.request_synthesis(now);
        let Some(end) = self.reply.end_generation() else {
            return;
        };
        self.feed_internal(
            now,
            TurnInput::ResponseEnd {
                turn: end.turn,
                awaits_user: end.awaits_user,
            },
        );
        self.pump(now);
        for call_id in end.refused {
            self.finish_call(now, &call_id, ToolOutcome::Error);
        }
    }
}

impl Engine {
    // ---- speculation ---------------------------------------------------------------------

    /// Ends every entry point: routes the answers of speculative work the real pipeline just
    /// adopted (as if the provider had answered at once), then starts or drops speculative
    /// work as the turn now stands, until nothing is left to replay.
    fn settle(&mut self, now: Instant) {
        loop {
            while let Some(event) = self.spec.pop_replay() {
                self.provider_event(now, event);
            }
            if !self.spec.active() {
                return;
            }
            self.spec.settle_adopted();
            if self.turn.state() != State::Listening {
                if self.held.is_some() {
                    // The real generation waits for the device's tools: it may still adopt.
                    self.spec.turn_over();
                } else {
                    self.spec.drop_generation();
                }
            } else {
                self.speculate_generation(now);
            }
            self.spec.tidy();
            self.send_spec_cancels();
            if self.closed {
                return;
            }
            let Some(event) = self.spec.pop_replay() else {
                return;
            };
            self.provider_event(now, event);
        }
    }

    /// Starts the speculative generation once its transcript is in and the turn's text can
    /// be predicted: the context is the one the real turn would get if it ended now.
    fn speculate_generation(&mut self, now: Instant) {
        let Some((transcript, asr_real)) = self.spec.generation_due() else {
            return;
        };
        // Earlier parts of the turn still being transcribed would change its text: wait.
        if self.record.transcribing_other_than(asr_real) {
            return;
        }
        let transcript = transcript.to_owned();
        let replies = self.turn.speech_trigger() != TriggerMode::NoTrigger;
        let Some((words, typed)) = self.turn.open_user_turn_text() else {
            return;
        };
        // The adopted recognition's words are in the turn machine once the record applied
        // them.
        let applied = asr_real.is_some_and(|id| !self.record.has_transcription(id));
        let text = if applied {
            words
        } else {
            join_words(&words, &transcript)
        };
        if text.is_empty() || typed || !replies {
            // Nothing to answer, or typed text in the turn (its own messages), or a turn
            // committed without a reply: no generation would match.
            self.spec.skip_generation();
            return;
        }
        if self.tools.awaiting_first_listing(now).is_some() {
            // The real generation waits for the device's tools, which would change them.
            return;
        }
        let reserve = self.actions.narrated_chars();
        let mut messages = self.record.context_with_user(
            now,
            &text,
            &self.config.system_prompt,
            self.config.max_context_chars,
            reserve,
        );
        self.actions.add_narrated(&mut messages);
        let tools = self.llm_tools();
        let temperature = self.config.temperature;
        let id = self.request();
        let shadow = self.config.output_audio.map(|_| {
            let mut shadow = Reply::new(&self.config);
            shadow.begin(SPECULATIVE_TURN, Some(id));
            shadow
        });
        self.spec.start_generation(
            id,
            GenerationKey {
                messages: messages.clone(),
                tools: tools.clone(),
                temperature,
            },
            shadow,
        );
        self.outputs
            .push_back(Output::Provider(ProviderRequest::Generate {
                id,
                turn: SPECULATIVE_TURN,
                messages,
                tools,
                temperature,
            }));
    }

    // ---- provider events -----------------------------------------------------------------

    fn provider_event(&mut self, now: Instant, event: ProviderEvent) {
        let event = match self.spec.route(event, self.config.emotion.as_ref()) {
            Routing::Real(event) | Routing::Other(event) => event,
            Routing::Held(held) => {
                if let Held::FirstSentence(text) = held {
                    let id = self.request();
                    self.spec.start_synthesis(id, text.clone());
                    self.outputs
                        .push_back(Output::Provider(ProviderRequest::Synthesize {
                            id,
                            turn: SPECULATIVE_TURN,
                            text,
                        }));
                }
                self.send_spec_cancels();
                return;
            }
        };
        let id = event.id();
        if self.record.awaits_transcript(id) {
            self.asr_event(now, event);
        } else if self.reply.is_llm(id) {
            self.llm_event(now, event);
        } else if self.reply.is_tts(id) {
            self.tts_event(now, event);
        } else if let Some(call_id) = self.tools.server_call_of(id).map(str::to_owned) {
            self.server_tool_event(now, &call_id, event);
        } else if self.record.awaits_query(id) {
            if let Some(events) = self.record.query_event(event) {
                for e in events {
                    self.client(e);
                }
            } else {
                self.stale_events += 1;
            }
        } else {
            self.stale_events += 1;
        }
    }

    fn asr_event(&mut self, now: Instant, event: ProviderEvent) {
        let id = event.id();
        let (text, language) = match event {
            ProviderEvent::Transcript { text, language, .. } => (text, language),
            ProviderEvent::Failed { message, .. } => {
                self.client(ClientEvent::Error {
                    category: ErrorCategory::Audio,
                    message: format!("transcription failed: {message}"),
                });
                (String::new(), String::new())
            }
            // Partial results are not part of the contract; wait for the transcript.
            _ => return,
        };
        self.record.transcribed(id, text, language);
        while let Some(t) = self.record.next_transcript(self.config.max_utterance) {
            if t.more {
                // More of the user's speech is still being transcribed: the turn must not
                // end on this part alone (set before the words, which re-check endpointing).
                self.feed_internal(now, TurnInput::EndOfTurnPrediction { probability: 0.0 });
            }
            self.feed_internal(
                now,
                TurnInput::Words {
                    text: t.text,
                    is_final: true,
                },
            );
            if !t.more {
                // All speech is transcribed: end the turn after the short delay (at once when
                // nothing was said) rather than after the longest wait.
                self.feed_internal(now, TurnInput::EndOfTurnPrediction { probability: 1.0 });
            }
            self.pump(now);
        }
    }

    fn llm_event(&mut self, now: Instant, event: ProviderEvent) {
        let Some(turn) = self.reply.generating() else {
            self.stale_events += 1;
            return;
        };
        // A generation that fails before its first token still makes a response that begins
        // and ends, so every door closes the turn in its own protocol (realtime `ResponseEnd`,
        // Gemini `TURN_COMPLETE`, Xiaozhi `tts stop`) instead of leaving the client waiting.
        if matches!(
            event,
            ProviderEvent::TextDelta { .. }
                | ProviderEvent::ToolCall { .. }
                | ProviderEvent::Failed { .. }
        ) && self.reply.mark_started()
        {
            self.feed_internal(now, TurnInput::ResponseStarted { turn });
            self.pump(now);
        }
        match event {
            ProviderEvent::TextDelta { delta, .. } => self.reply_text(now, &delta),
            ProviderEvent::ToolCall {
                call_id,
                name,
                arguments,
                ..
            } => self.tool_call(now, turn, call_id, &name, arguments),
            ProviderEvent::Done { .. } => self.end_reply_text(now),
            ProviderEvent::Failed { message, .. } => {
                self.client(ClientEvent::Error {
                    category: ErrorCategory::Inference,
                    message,
                });
                // With an emotion channel, a failed reply shows a puzzled face: before its first
                // word instead of the default (usually happy) one, after words that were said
                // (a stream cut mid-reply) as a change of face, so a device never stays happy
                // over a reply that broke off.
                if self.config.emotion.is_some() {
                    if self.reply.nothing_said() {
                        self.reply_text(now, FAILURE_FACE);
                    } else {
                        self.client(ClientEvent::Emotion {
                            turn,
                            emoji: FAILURE_FACE.to_owned(),
                            emotion: crate::emotion::Emotion::Confused,
                        });
                    }
                }
                self.end_reply_text(now);
            }
            _ => self.stale_events += 1,
        }
    }

    fn tts_event(&mut self, now: Instant, event: ProviderEvent) {
        match self.reply.tts(event) {
            Tts::Applied => {}
            Tts::Failed(message) => self.client(ClientEvent::Error {
                category: ErrorCategory::Tts,
                message,
            }),
            Tts::Stale => {
                self.stale_events += 1;
                return;
            }
            Tts::Unknown => return,
        }
        self.flush_reply(now);
    }

    // ---- tools ---------------------------------------------------------------------------

    fn tool_call(
        &mut self,
        now: Instant,
        turn: TurnId,
        call_id: String,
        llm_name: &str,
        arguments: Value,
    ) {
        if self.tools.contains(&call_id) {
            self.stale_events += 1;
            return;
        }
        let prepared = self.tools.prepare(llm_name, arguments);
        let name = prepared.name.clone();
        self.record.tool_call(
            now,
            turn,
            Content::ToolCall {
                id: call_id.clone(),
                name: name.clone(),
                llm_name: llm_name.to_owned(),
                arguments: prepared.arguments.clone(),
            },
        );
        self.feed_internal(
            now,
            TurnInput::ToolCallStarted {
                turn,
                call_id: call_id.clone(),
                name,
                // Tool results survive a barge-in: the action happened either way. A client
                // action is the exception: its invocation dies with the reply (VIP §5.3,
                // see `crate::actions`).
                cancel_on_interrupt: Tools::is_action(&prepared),
            },
        );
        self.pump(now);
        match self.tools.dispatch(now, &call_id, prepared, turn) {
            Dispatch::Client(request) => self.client(request),
            Dispatch::Device => self.pump_mcp(now),
            Dispatch::Action { name, arguments } => {
                match self.actions.invoke(now, &call_id, turn, &name, arguments) {
                    Ok(()) => self.pump_actions(now),
                    Err(payload) => {
                        self.tools.not_run(&call_id);
                        self.record.tool_result(now, &call_id, payload);
                        self.reply.refuse(call_id);
                    }
                }
            }
            Dispatch::Server {
                source,
                name,
                arguments,
            } => {
                let id = self.request();
                self.tools.server_call_sent(&call_id, id);
                self.provider(ProviderRequest::CallTool {
                    id,
                    turn,
                    call_id,
                    source,
                    name,
                    arguments,
                });
            }
            Dispatch::Refused(message) => {
                self.record.tool_result(now, &call_id, message);
                self.reply.refuse(call_id);
            }
        }
    }

    /// Acts on what the actions machine reports (tools to offer, client events, answered
    /// invocations).
    fn pump_actions(&mut self, now: Instant) {
        while let Some(event) = self.actions.poll() {
            match event {
                ActionsEvent::Client(e) => self.client(e),
                ActionsEvent::Tools(tools) => {
                    let rejected = self.tools.set_action_tools(tools);
                    self.actions.tools_rejected(rejected);
                }
                ActionsEvent::Finished {
                    call_id,
                    text,
                    outcome,
                } => {
                    self.record.tool_result(now, &call_id, text);
                    self.finish_call(now, &call_id, outcome);
                }
            }
        }
    }

    /// Response `turn` is the follow-up of failed actions: it says their fallback sentence
    /// verbatim instead of asking the model (VIP §5.5.2, see `crate::actions`).
    fn say_fallback(&mut self, now: Instant, turn: TurnId, text: &str) {
        self.reply.begin_direct(turn);
        self.feed_internal(now, TurnInput::ResponseStarted { turn });
        self.pump(now);
        self.reply_text(now, text);
        self.end_reply_text(now);
    }

    fn client_tool_result(
        &mut self,
        now: Instant,
        id: String,
        result: String,
    ) -> Result<(), InputError> {
        if !self.tools.awaits_client(&id) {
            return Err(InputError::UnknownToolCall(id));
        }
        self.record.tool_result(now, &id, result);
        self.finish_call(now, &id, ToolOutcome::Ok);
        Ok(())
    }

    /// The answer of a server-side call: the model gets it like any tool result; a failed
    /// request (the host could not run it) is an error result, so the turn goes on.
    fn server_tool_event(&mut self, now: Instant, call_id: &str, event: ProviderEvent) {
        let (text, ok) = match event {
            ProviderEvent::ToolOutput { text, ok, .. } => (text, ok),
            ProviderEvent::Failed { message, .. } => (format!("Error: {message}"), false),
            _ => {
                self.stale_events += 1;
                return;
            }
        };
        self.record.tool_result(now, call_id, text);
        let outcome = if ok {
            ToolOutcome::Ok
        } else {
            ToolOutcome::Error
        };
        self.finish_call(now, call_id, outcome);
    }

    fn finish_call(&mut self, now: Instant, call_id: &str, outcome: ToolOutcome) {
        let Some(info) = self.tools.finish(call_id) else {
            return;
        };
        self.tool_ended(now, info, outcome);
        self.feed_internal(
            now,
            TurnInput::ToolCallFinished {
                call_id: call_id.to_owned(),
                ok: outcome == ToolOutcome::Ok,
            },
        );
        self.pump(now);
    }

    /// Reports the end of a call that ran (refused calls have no round trip).
    fn tool_ended(&mut self, now: Instant, info: CallInfo, outcome: ToolOutcome) {
        if let Some(kind) = info.kind {
            self.telemetry.push(TurnEvent::ToolCall {
                turn: info.turn,
                kind,
                name: info.name,
                elapsed: now.saturating_duration_since(info.started),
                outcome,
                at: now,
            });
        }
    }

    /// Acts on what the tools machine reports (device MCP traffic and answered calls).
    fn pump_mcp(&mut self, now: Instant) {
        while let Some(event) = self.tools.poll() {
            match event {
                ToolsEvent::Client(e) => self.client(e),
                ToolsEvent::Finished {
                    call_id,
                    text,
                    outcome,
                } => {
                    self.record.tool_result(now, &call_id, text);
                    self.finish_call(now, &call_id, outcome);
                }
            }
        }
        self.release_held(now);
    }

    /// Sends the held generation once the device's tools are in or the wait is over.
    fn release_held(&mut self, now: Instant) {
        if self.tools.awaiting_first_listing(now).is_none()
            && let Some(h) = self.held.take()
        {
            self.generate(h.id, h.turn, h.messages);
        }
    }

    fn generate(&mut self, id: RequestId, turn: TurnId, messages: Vec<ContextMessage>) {
        let tools = self.llm_tools();
        self.provider(ProviderRequest::Generate {
            id,
            turn,
            messages,
            tools,
            temperature: self.config.temperature,
        });
    }
}

/// The VAD and utterance buffer for audio at `rate`.
fn new_capture(config: &EngineConfig, rate: u32) -> Result<Capture, voxgate_audio::vad::VadError> {
    let max_samples = usize::try_from(config.max_utterance.as_millis() * u128::from(rate) / 1000)
        .unwrap_or(usize::MAX);
    let pause = config
        .speculation
        .enabled
        .then_some(config.speculation.after_silence);
    Capture::new(
        config.vad,
        rate,
        max_samples,
        config.vad_frame_telemetry,
        pause,
    )
}

/// The wall-clock instant of audio heard `ago` before the end of the block that arrived at
/// `now`. An approximation: audio arrives in real time, so the block's last sample was heard
/// about when it arrived and earlier samples that much earlier; network jitter and the
/// client's own buffering (a frame or two, tens of milliseconds) are not seen here, so the
/// onset may be placed that much late or early. Never after `now`.
fn onset_wall(now: Instant, ago: Duration) -> Instant {
    now.checked_sub(ago).unwrap_or(now)
}

/// `words` followed by `more` as the turn machine joins final transcripts.
fn join_words(words: &str, more: &str) -> String {
    match (words.is_empty(), more.is_empty()) {
        (true, _) => more.to_owned(),
        (false, true) => words.to_owned(),
        (false, false) => format!("{words} {more}"),
    }
}
