//! The conversation machine.

use std::collections::VecDeque;
use std::mem;
use std::time::{Duration, Instant};

use crate::emotion::{self, EmojiPolicy, extends_emoji, lead_settled, strip_chunk};
use serde_json::Value;
use voxgate_audio::vad::VadState;
use voxgate_turn::{
    AudioSpan, Delivery, Input as TurnInput, Output as TurnOutput, State, TriggerMode, TurnMachine,
    UserSource,
};

use crate::capture::{Capture, CaptureEvent};
use crate::config::EngineConfig;
use crate::history::{AudioData, ChatMessage, Content, DeliveryStatus};
use crate::playback::Ledger;
use crate::provider::{ContextMessage, ProviderEvent, ProviderRequest, ToolSpec};
use crate::record::{Asr, Record};
use crate::sentence::Splitter;
use crate::tools::{Dispatch, Tools, ToolsEvent};
use crate::types::{
    ClientEvent, ConfigError, ErrorCategory, Input, InputError, Output, RequestId, TurnId,
};

/// History's result for a tool call cancelled before it answered, so every call there is
/// answered and later contexts stay valid.
const CANCELLED_CALL: &str = "the call was cancelled before it finished";

/// One sentence on its way through TTS.
#[derive(Debug)]
struct Sentence {
    id: RequestId,
    text: String,
    /// Audio that arrived before earlier sentences finished.
    held: VecDeque<(Vec<i16>, u32)>,
    started: bool,
    done: bool,
}

/// The response in progress.
#[derive(Debug)]
struct Response {
    turn: TurnId,
    /// The LLM request feeding it (`None` for direct speech).
    llm: Option<RequestId>,
    llm_done: bool,
    started: bool,
    /// The start of the reply, held back until its leading emoji (if any) is complete: it is
    /// read as the face (with an emotion policy) or stripped whole, never shown in pieces.
    /// `None` once settled.
    emotion_buf: Option<String>,
    splitter: Splitter,
    sentences: VecDeque<Sentence>,
    ledger: Ledger,
    /// Calls refused before running: their error results go to the turn machine once
    /// generation has ended, so it asks the model to follow up.
    refused: Vec<String>,
    generation_ended: bool,
    end_sent: bool,
    asks_question: bool,
    /// Text-only replies: everything shown so far.
    shown: String,
    /// Text-only replies: the last fragment with text ended in an emoji (removed).
    emoji_gap: bool,
    /// Spoken replies: each delivered sentence's audio, in ledger segment order.
    spoken: Vec<AudioData>,
}

/// One conversation as a sans-IO machine. See the crate docs for the drive loop.
#[derive(Debug)]
pub struct Engine {
    config: EngineConfig,
    turn: TurnMachine,
    capture: Capture,
    /// The recognizer is in use: the turn machine waits for transcripts before ending turns.
    transcribing_enabled: bool,
    tools: Tools,
    next_request: u64,
    outputs: VecDeque<Output>,
    /// Transcripts in flight, what was heard, history, queries and exports.
    record: Record,
    resp: Option<Response>,
    /// A response just cancelled by the turn machine, kept until its record comes out.
    closing: Option<Response>,
    /// Client events waiting for the turn machine's `Deliver` of their chunk.
    held: VecDeque<(TurnId, u32, Vec<ClientEvent>)>,
    chunk_seq: u32,
    /// Provider events for requests no longer awaited.
    stale_events: u64,
    /// [`Input::Close`] was handled.
    closed: bool,
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
            record: Record::new(max_history_messages),
            next_request: 1,
            outputs: VecDeque::new(),
            resp: None,
            closing: None,
            held: VecDeque::new(),
            chunk_seq: 0,
            stale_events: 0,
            closed: false,
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
        self.record.history.messages()
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

    /// The next output, if any. Drain after every `handle_*` call.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    /// The earliest instant at which [`Engine::handle_timeout`] has work to do.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        let t = self.turn.poll_timeout();
        let m = self.tools.poll_timeout();
        match (t, m) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Runs the timers due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.turn.handle_timeout(now);
        self.pump(now);
        self.tools.handle_timeout(now);
        self.pump_mcp(now);
    }

    /// Feeds mono audio at the configured input rate without copying it into an [`Input`].
    pub fn handle_audio(&mut self, now: Instant, samples: &[f32]) {
        if self.closed {
            return;
        }
        self.enable_transcripts(now);
        self.capture.process(samples);
        self.capture_events(now);
    }

    /// Feeds mono 16-bit audio at the configured input rate.
    pub fn handle_audio_i16(&mut self, now: Instant, samples: &[i16]) {
        if self.closed {
            return;
        }
        self.enable_transcripts(now);
        self.capture.process_i16(samples);
        self.capture_events(now);
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
                if let Some(r) = self.resp.as_mut().filter(|r| r.turn == turn) {
                    r.ledger.report(bytes_played);
                }
                self.feed(now, TurnInput::PlaybackProgress { turn, bytes_played })?;
            }
            Input::SetTools(tools) => {
                for error in self.tools.set_client_tools(tools) {
                    self.client(error);
                }
            }
            Input::ToolResult { id, result } => self.client_tool_result(now, id, result)?,
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
        let transcribing = self.capture.in_utterance() || !self.record.asr.is_empty();
        if flush_vad && transcribing && self.turn.state() == State::Listening {
            self.capture.flush();
            self.capture_events(now);
            if !self.record.asr.is_empty() {
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
        self.feed_internal(now, TurnInput::Disconnected);
        self.pump(now);
        // The turn machine's CancelResponse already cancelled the work of a response it cut
        // off (now in `closing`); anything still in `resp` was not cancelled yet.
        self.closing = None;
        if let Some(r) = self.resp.take() {
            if let Some(id) = r.llm.filter(|_| !r.llm_done) {
                self.provider(ProviderRequest::Cancel { id });
            }
            for s in r.sentences.iter().filter(|s| !s.done) {
                self.provider(ProviderRequest::Cancel { id: s.id });
            }
        }
        for id in self.record.close() {
            self.provider(ProviderRequest::Cancel { id });
        }
        // Calls the turn machine did not track (refused ones awaiting generation's end).
        for call_id in self.tools.close() {
            self.record
                .history
                .push_tool_result(now, &call_id, CANCELLED_CALL.to_owned());
        }
        self.held.clear();
        self.closed = true;
    }

    // ---- plumbing ------------------------------------------------------------------------

    fn client(&mut self, event: ClientEvent) {
        self.outputs.push_back(Output::Client(event));
    }

    fn request(&mut self) -> RequestId {
        crate::record::next_id(&mut self.next_request)
    }

    fn provider(&mut self, request: ProviderRequest) {
        self.outputs.push_back(Output::Provider(request));
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
            CaptureEvent::Transition(from, to, position) => {
                self.client(ClientEvent::VadState { from, to, position });
                // From Speech only when the stream ends mid-utterance (`Capture::finish`).
                if to == VadState::Silence
                    && matches!(from, VadState::SpeechEnding | VadState::Speech)
                {
                    self.feed_internal(now, TurnInput::SpeechStopped);
                    self.pump(now);
                }
            }
            CaptureEvent::Frame(f) => self.client(ClientEvent::VadFrame {
                index: f.index,
                confidence: f.confidence,
                volume: f.volume,
                state: f.state,
            }),
            CaptureEvent::SpeechStarted => {
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
                self.record.asr.push_back(Asr {
                    id,
                    audio: kept,
                    result: None,
                });
                self.provider(ProviderRequest::Transcribe {
                    id,
                    audio,
                    sample_rate: voxgate_audio::vad::MODEL_RATE,
                });
            }
        }
    }

    // ---- turn machine outputs ------------------------------------------------------------

    fn pump(&mut self, now: Instant) {
        while let Some(out) = self.turn.poll_output() {
            self.on_turn_output(now, out);
        }
        if !self.record.exports.is_empty() && !self.pending_work() {
            for exclude_audio in mem::take(&mut self.record.exports) {
                self.export_now(exclude_audio);
            }
        }
    }

    fn on_turn_output(&mut self, now: Instant, out: TurnOutput) {
        match out {
            TurnOutput::UserTurn(u) => {
                if u.source == UserSource::Speech {
                    let heard = mem::take(&mut self.record.heard);
                    let mut samples = Vec::new();
                    if self.config.keep_user_audio {
                        for (audio, _) in &heard {
                            samples.extend_from_slice(audio);
                        }
                    }
                    self.record.history.push_user_audio(
                        now,
                        u.turn,
                        AudioData {
                            samples,
                            sample_rate: voxgate_audio::vad::MODEL_RATE,
                            transcription: u.text.clone(),
                        },
                    );
                    self.record.history.cap_audio(self.config.max_history_audio);
                    self.client(ClientEvent::UserTranscription {
                        turn: u.turn,
                        text: u.text,
                        language: self.record.language.clone(),
                    });
                } else {
                    self.record.history.push_user_text(now, u.turn, u.text);
                }
            }
            TurnOutput::UserTurnDiscarded => self.record.heard.clear(),
            TurnOutput::StartResponse {
                turn, instructions, ..
            } => {
                if let Some(text) = instructions {
                    self.record.history.push_instructions(now, turn, text);
                }
                let id = self.request();
                self.new_response(turn, Some(id));
                let messages = self.response_context(turn);
                let tools = self.llm_tools();
                self.provider(ProviderRequest::Generate {
                    id,
                    turn,
                    messages,
                    tools,
                    temperature: self.config.temperature,
                });
            }
            TurnOutput::Speak { turn, text } | TurnOutput::ResumeResponse { turn, text, .. } => {
                self.new_response(turn, None);
                if let Some(r) = &mut self.resp {
                    r.started = true;
                    r.llm_done = true;
                    r.emotion_buf = None;
                }
                self.reply_text(now, &text);
                self.end_reply_text(now);
            }
            TurnOutput::ResponseBegun { turn } => {
                self.record.history.assistant(now, turn);
                self.client(ClientEvent::ResponseBegin { turn });
            }
            TurnOutput::Deliver { turn, seq } => {
                while let Some((t, s, events)) = self.held.pop_front() {
                    if (t, s) == (turn, seq) {
                        for e in events {
                            self.client(e);
                        }
                        break;
                    }
                }
            }
            TurnOutput::GenerationEnded { turn } => self.send_end(turn),
            TurnOutput::CancelResponse { turn } => {
                if self.resp.as_ref().is_some_and(|r| r.turn == turn)
                    && let Some(r) = self.resp.take()
                {
                    if let Some(id) = r.llm.filter(|_| !r.llm_done) {
                        self.provider(ProviderRequest::Cancel { id });
                    }
                    for s in r.sentences.iter().filter(|s| !s.done) {
                        self.outputs
                            .push_back(Output::Provider(ProviderRequest::Cancel { id: s.id }));
                    }
                    self.held.retain(|(t, _, _)| *t != turn);
                    self.closing = Some(r);
                }
            }
            TurnOutput::CancelTool { call_id } if self.tools.cancel(&call_id) => {
                self.record
                    .history
                    .push_tool_result(now, &call_id, CANCELLED_CALL.to_owned());
            }
            TurnOutput::ClearPlayback { .. } => self.client(ClientEvent::ClearPlayback),
            TurnOutput::ResponseEnded(a) => {
                let interrupted = matches!(a.delivery, Delivery::Interrupted { .. });
                let mut r = if self.resp.as_ref().is_some_and(|r| r.turn == a.turn) {
                    self.resp.take()
                } else if self.closing.as_ref().is_some_and(|r| r.turn == a.turn) {
                    self.closing.take()
                } else {
                    None
                };
                match r {
                    Some(Response {
                        ref ledger,
                        ref mut spoken,
                        ..
                    }) if ledger.has_audio() => {
                        let texts = if interrupted {
                            ledger.heard_segments(now, self.config.turn.playback_reports)
                        } else {
                            ledger.segment_texts()
                        };
                        let mut audio = mem::take(spoken).into_iter();
                        let sentences = texts
                            .into_iter()
                            .map(|text| {
                                let a = audio.next().map(|mut a| {
                                    a.transcription.clone_from(&text);
                                    a
                                });
                                (text, a)
                            })
                            .collect();
                        self.record
                            .history
                            .set_assistant_sentences(now, a.turn, sentences);
                        self.record.history.cap_audio(self.config.max_history_audio);
                    }
                    _ => {
                        let text = a.heard_text.trim().to_owned();
                        self.record.history.set_assistant_text(now, a.turn, text);
                    }
                }
                let m = self.record.history.assistant(now, a.turn);
                m.delivery = if interrupted {
                    DeliveryStatus::Interrupted
                } else {
                    DeliveryStatus::Complete
                };
                m.ephemeral = a.ephemeral;
                if r.as_ref().is_none_or(|r| !r.end_sent) {
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

    /// The LLM context for response `turn`, within the budget: exchanges left out now leave
    /// the context for good, are marked in history and reported to the client.
    fn response_context(&mut self, turn: TurnId) -> Vec<ContextMessage> {
        let context = self.record.history.context(
            &self.config.system_prompt,
            self.config.max_context_chars,
            0,
        );
        let truncated = self.record.history.mark_truncated(&context.dropped, turn);
        if !truncated.is_empty() {
            self.client(ClientEvent::ContextTruncated {
                truncated,
                response: turn,
            });
        }
        context.messages
    }

    fn send_end(&mut self, turn: TurnId) {
        if let Some(r) = self.resp.as_mut().filter(|r| r.turn == turn)
            && !r.end_sent
        {
            r.end_sent = true;
            self.client(ClientEvent::ResponseEnd { turn });
        }
    }

    fn new_response(&mut self, turn: TurnId, llm: Option<RequestId>) {
        self.closing = None;
        self.chunk_seq = 0;
        self.held.clear();
        self.resp = Some(Response {
            turn,
            llm,
            llm_done: false,
            started: false,
            emotion_buf: Some(String::new()),
            splitter: Splitter::new(self.config.max_sentence_chars),
            sentences: VecDeque::new(),
            ledger: Ledger::default(),
            refused: Vec::new(),
            generation_ended: false,
            end_sent: false,
            asks_question: false,
            shown: String::new(),
            emoji_gap: false,
            spoken: Vec::new(),
        });
    }

    // ---- reply text ----------------------------------------------------------------------

    /// Routes reply text: held for the emotion decision, then to TTS sentences or text chunks.
    fn reply_text(&mut self, now: Instant, text: &str) {
        let Some(r) = &mut self.resp else { return };
        if let Some(buf) = &mut r.emotion_buf {
            buf.push_str(text);
            if lead_settled(buf) {
                self.decide_emotion(now);
            }
            return;
        }
        self.route_text(now, text);
    }

    fn route_text(&mut self, now: Instant, text: &str) {
        let Some(r) = &mut self.resp else { return };
        if self.config.output_audio.is_some() {
            r.splitter.push(text);
            self.start_sentences();
        } else {
            let mut out = strip_chunk(text, r.shown.is_empty());
            // "see you " + "👋" + " soon": the spaces on both sides of a removed emoji
            // arrive in different fragments; keep one.
            if r.emoji_gap && r.shown.ends_with(char::is_whitespace) {
                out = out.trim_start().to_owned();
            }
            if !text.trim().is_empty() {
                r.emoji_gap = text.trim_end().chars().next_back().is_some_and(|c| {
                    extends_emoji(c) || emotion::contains_emoji(c.encode_utf8(&mut [0; 4]))
                });
            }
            self.text_chunk(now, out);
        }
    }

    fn decide_emotion(&mut self, now: Instant) {
        let Some(r) = &mut self.resp else {
            return;
        };
        let Some(buf) = r.emotion_buf.take() else {
            return;
        };
        let rest = match &self.config.emotion {
            Some(policy) => {
                let (event, rest) = expression(policy, r.turn, &buf);
                self.client(event);
                rest
            }
            None => buf,
        };
        if !rest.is_empty() {
            self.route_text(now, &rest);
        }
    }

    /// Sends completed sentences to TTS.
    fn start_sentences(&mut self) {
        loop {
            let Some(r) = &mut self.resp else { return };
            let Some(sentence) = r.splitter.pop() else {
                return;
            };
            let text = emotion::strip_emoji(&sentence).into_owned();
            if !text.chars().any(char::is_alphanumeric) {
                continue;
            }
            r.asks_question = text.ends_with('?') || text.ends_with('？');
            let turn = r.turn;
            let id = self.request();
            if let Some(r) = &mut self.resp {
                r.sentences.push_back(Sentence {
                    id,
                    text: text.clone(),
                    held: VecDeque::new(),
                    started: false,
                    done: false,
                });
            }
            self.provider(ProviderRequest::Synthesize { id, turn, text });
        }
    }

    fn text_chunk(&mut self, now: Instant, text: String) {
        let Some(r) = &mut self.resp else { return };
        if text.is_empty() || r.generation_ended {
            return;
        }
        r.shown.push_str(&text);
        let turn = r.turn;
        let seq = self.chunk_seq;
        self.chunk_seq += 1;
        self.held.push_back((
            turn,
            seq,
            vec![ClientEvent::TextFragment {
                turn,
                text: text.clone(),
            }],
        ));
        self.feed_internal(
            now,
            TurnInput::ResponseChunk {
                turn,
                text,
                audio: None,
            },
        );
        self.pump(now);
    }

    /// Delivers TTS audio of the head sentence(s) in order, then ends generation when all is
    /// said.
    fn flush_reply(&mut self, now: Instant) {
        loop {
            let Some(r) = &mut self.resp else { return };
            let Some(head) = r.sentences.front_mut() else {
                break;
            };
            if let Some((samples, rate)) = head.held.pop_front() {
                let first = !head.started;
                head.started = true;
                let text = head.text.clone();
                self.audio_chunk(now, first.then_some(text), samples, rate);
                continue;
            }
            if head.done {
                r.sentences.pop_front();
                r.ledger.finish_segment();
                continue;
            }
            break;
        }
        self.maybe_end_generation(now);
    }

    fn audio_chunk(
        &mut self,
        now: Instant,
        first_of: Option<String>,
        samples: Vec<i16>,
        rate: u32,
    ) {
        let (Some(r), Some(out)) = (&mut self.resp, self.config.output_audio) else {
            return;
        };
        if r.generation_ended || rate == 0 {
            return;
        }
        let turn = r.turn;
        let n = samples.len() as u64;
        let duration = Duration::from_nanos(
            u64::try_from(u128::from(n) * 1_000_000_000 / u128::from(rate)).unwrap_or(u64::MAX),
        );
        let bytes = n * u64::from(out.bytes_per_second) / u64::from(rate);
        let mut events = Vec::with_capacity(2);
        let mut chunk_text = String::new();
        // History keeps each sentence's audio; a chunk at another rate than its sentence's
        // first (a provider switching rates mid-sentence) is delivered but not kept.
        let keep = !self.config.max_history_audio.is_zero();
        match (&first_of, r.spoken.last_mut()) {
            _ if !keep => {}
            (Some(text), _) => r.spoken.push(AudioData {
                samples: samples.clone(),
                sample_rate: rate,
                transcription: text.clone(),
            }),
            (None, Some(a)) if a.sample_rate == rate => a.samples.extend_from_slice(&samples),
            _ => {}
        }
        if let Some(text) = &first_of {
            r.ledger.start_segment(text);
            events.push(ClientEvent::SentenceStart {
                turn,
                text: text.clone(),
            });
            chunk_text = if r.ledger.has_audio() {
                format!(" {text}")
            } else {
                text.clone()
            };
        }
        r.ledger.push_audio(now, bytes, duration);
        events.push(ClientEvent::AudioChunk {
            turn,
            samples,
            sample_rate: rate,
            transcript: first_of,
        });
        let seq = self.chunk_seq;
        self.chunk_seq += 1;
        self.held.push_back((turn, seq, events));
        self.feed_internal(
            now,
            TurnInput::ResponseChunk {
                turn,
                text: chunk_text,
                audio: Some(AudioSpan { bytes, duration }),
            },
        );
        self.pump(now);
    }

    fn maybe_end_generation(&mut self, now: Instant) {
        let Some(r) = &mut self.resp else { return };
        let idle = r.llm_done
            && r.emotion_buf.is_none()
            && r.sentences.is_empty()
            && r.splitter.is_empty();
        if !idle || r.generation_ended {
            return;
        }
        r.generation_ended = true;
        let turn = r.turn;
        let awaits_user = r.asks_question;
        let refused = mem::take(&mut r.refused);
        self.feed_internal(now, TurnInput::ResponseEnd { turn, awaits_user });
        self.pump(now);
        for call_id in refused {
            self.finish_call(now, &call_id, false);
        }
    }

    /// Ends the reply's text: flushes the emotion lookahead and the last sentence.
    fn end_reply_text(&mut self, now: Instant) {
        if self.resp.as_ref().is_some_and(|r| r.emotion_buf.is_some()) {
            self.decide_emotion(now);
        }
        if let Some(r) = &mut self.resp {
            r.llm_done = true;
            r.splitter.finish();
        }
        self.start_sentences();
        self.flush_reply(now);
    }
}

impl Engine {
    // ---- provider events -----------------------------------------------------------------

    fn provider_event(&mut self, now: Instant, event: ProviderEvent) {
        let id = event.id();
        if let Some(pos) = self
            .record
            .asr
            .iter()
            .position(|a| a.id == id && a.result.is_none())
        {
            self.asr_event(now, pos, event);
        } else if self.resp.as_ref().is_some_and(|r| r.llm == Some(id)) {
            self.llm_event(now, event);
        } else if self
            .resp
            .as_ref()
            .is_some_and(|r| r.sentences.iter().any(|s| s.id == id))
        {
            self.tts_event(now, event);
        } else if self.record.queries.iter().any(|q| q.id == id) {
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

    fn asr_event(&mut self, now: Instant, pos: usize, event: ProviderEvent) {
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
        if let Some(a) = self.record.asr.get_mut(pos) {
            a.result = Some((text, language));
        }
        while self.record.asr.front().is_some_and(|a| a.result.is_some()) {
            let Some(Asr {
                audio,
                result: Some((text, language)),
                ..
            }) = self.record.asr.pop_front()
            else {
                break;
            };
            if !language.is_empty() {
                self.record.language = language;
            }
            let text = text.trim().to_owned();
            let empty = text.is_empty();
            if !empty {
                self.record
                    .hear(audio, text.clone(), self.config.max_utterance);
            }
            if !self.record.asr.is_empty() {
                // More of the user's speech is still being transcribed: the turn must not
                // end on this part alone (set before the words, which re-check endpointing).
                self.feed_internal(now, TurnInput::EndOfTurnPrediction { probability: 0.0 });
            }
            self.feed_internal(
                now,
                TurnInput::Words {
                    text,
                    is_final: true,
                },
            );
            if self.record.asr.is_empty() {
                // All speech is transcribed: end the turn after the short delay (at once when
                // nothing was said) rather than after the longest wait.
                self.feed_internal(now, TurnInput::EndOfTurnPrediction { probability: 1.0 });
            }
            self.pump(now);
        }
    }

    fn llm_event(&mut self, now: Instant, event: ProviderEvent) {
        let Some(r) = &mut self.resp else { return };
        if r.llm_done {
            self.stale_events += 1;
            return;
        }
        let turn = r.turn;
        if !r.started
            && matches!(
                event,
                ProviderEvent::TextDelta { .. } | ProviderEvent::ToolCall { .. }
            )
        {
            r.started = true;
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
                self.end_reply_text(now);
            }
            _ => self.stale_events += 1,
        }
    }

    fn tts_event(&mut self, now: Instant, event: ProviderEvent) {
        let Some(r) = &mut self.resp else { return };
        let id = event.id();
        let Some(s) = r.sentences.iter_mut().find(|s| s.id == id) else {
            return;
        };
        if s.done {
            self.stale_events += 1;
            return;
        }
        match event {
            ProviderEvent::Audio {
                samples,
                sample_rate,
                ..
            } => s.held.push_back((samples, sample_rate)),
            ProviderEvent::Done { .. } => s.done = true,
            ProviderEvent::Failed { message, .. } => {
                s.done = true;
                self.client(ClientEvent::Error {
                    category: ErrorCategory::Tts,
                    message,
                });
            }
            _ => {
                self.stale_events += 1;
                return;
            }
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
        self.record
            .history
            .assistant(now, turn)
            .content
            .push(Content::ToolCall {
                id: call_id.clone(),
                name: name.clone(),
                llm_name: llm_name.to_owned(),
                arguments: prepared.arguments.clone(),
            });
        self.feed_internal(
            now,
            TurnInput::ToolCallStarted {
                turn,
                call_id: call_id.clone(),
                name,
                // Tool results survive a barge-in: the action happened either way.
                cancel_on_interrupt: false,
            },
        );
        self.pump(now);
        match self.tools.dispatch(now, &call_id, prepared, turn) {
            Dispatch::Client(request) => self.client(request),
            Dispatch::Device => self.pump_mcp(now),
            Dispatch::Refused(message) => {
                self.record.history.push_tool_result(now, &call_id, message);
                if let Some(r) = &mut self.resp {
                    r.refused.push(call_id);
                }
            }
        }
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
        self.record.history.push_tool_result(now, &id, result);
        self.finish_call(now, &id, true);
        Ok(())
    }

    fn finish_call(&mut self, now: Instant, call_id: &str, ok: bool) {
        if !self.tools.finish(call_id) {
            return;
        }
        self.feed_internal(
            now,
            TurnInput::ToolCallFinished {
                call_id: call_id.to_owned(),
                ok,
            },
        );
        self.pump(now);
    }

    /// Acts on what the tools machine reports (device MCP traffic and answered calls).
    fn pump_mcp(&mut self, now: Instant) {
        while let Some(event) = self.tools.poll() {
            match event {
                ToolsEvent::Client(e) => self.client(e),
                ToolsEvent::Finished { call_id, text, ok } => {
                    self.record.history.push_tool_result(now, &call_id, text);
                    self.finish_call(now, &call_id, ok);
                }
            }
        }
    }

    // ---- queries -------------------------------------------------------------------------
}

/// The VAD and utterance buffer for audio at `rate`.
fn new_capture(config: &EngineConfig, rate: u32) -> Result<Capture, voxgate_audio::vad::VadError> {
    let max_samples = usize::try_from(config.max_utterance.as_millis() * u128::from(rate) / 1000)
        .unwrap_or(usize::MAX);
    Capture::new(config.vad, rate, max_samples, config.vad_frame_telemetry)
}

/// The face for a reply and the text after it.
fn expression(policy: &EmojiPolicy, turn: TurnId, text: &str) -> (ClientEvent, String) {
    let e = policy.expression(text);
    (
        ClientEvent::Emotion {
            turn,
            emoji: e.emoji.to_owned(),
            emotion: e.emotion,
        },
        e.text.to_owned(),
    )
}
