//! The turn-taking machine.

use std::collections::{BTreeMap, VecDeque};
use std::mem;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::playback::Playback;
use crate::text::word_count;
use crate::types::{
    AssistantTurn, Delivery, Input, InputError, Interruption, Output, ResponseCause, ResponseKind,
    State, TriggerMode, TurnId, TurnLatency, UserSource, UserTurn,
};

/// Counters for observability; they never influence behaviour.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Responses cut off by any source.
    pub interruptions: u64,
    /// Speech while the system held the floor that did not pass the interruption policy.
    pub rejected_interruptions: u64,
    /// Interruptions that produced no words and were followed by a resume.
    pub false_interruptions: u64,
    /// Provider or client events for turns that are no longer current (dropped).
    pub stale_inputs: u64,
    /// User turns discarded as empty.
    pub discarded_user_turns: u64,
}

/// Transcript of one stretch of user speech: finalized text plus the current partial.
#[derive(Debug, Clone, Default)]
struct Utterance {
    finals: String,
    partial: String,
}

impl Utterance {
    fn push(&mut self, text: &str, is_final: bool) {
        if is_final {
            let text = text.trim();
            if !text.is_empty() {
                if !self.finals.is_empty() {
                    self.finals.push(' ');
                }
                self.finals.push_str(text);
            }
            self.partial.clear();
        } else {
            self.partial = text.trim().to_owned();
        }
    }

    fn words(&self) -> usize {
        word_count(&self.finals) + word_count(&self.partial)
    }

    fn text(&self) -> String {
        match (self.finals.is_empty(), self.partial.is_empty()) {
            (_, true) => self.finals.clone(),
            (true, false) => self.partial.clone(),
            (false, false) => format!("{} {}", self.finals, self.partial),
        }
    }
}

/// The open user turn while Listening.
#[derive(Debug, Clone, Default)]
struct UserTurnState {
    /// Voice or words were seen in this turn (else it is a follow-up wait).
    active: bool,
    /// Push-to-talk: no endpointing until `StopCapture`.
    manual: bool,
    /// The VAD marks speech in this turn (else words alone do).
    vad: bool,
    /// `StopCapture` or a flush: end without the minimum silence.
    explicit_stop: bool,
    speech_ended_at: Option<Instant>,
    utterance: Utterance,
    prediction: Option<f32>,
    /// Typed text (QUEUE/IMMEDIATE) that arrived during the turn.
    texts: Vec<String>,
    /// A trigger waits for this turn to end (`Some(instructions)`).
    trigger: Option<Option<String>>,
    /// Deadline for a follow-up wait with no speech.
    listen_deadline: Option<Instant>,
    /// Trigger mode of the turn's speech, taken at its latest speech event (`None`: the
    /// machine's current [`Input::SpeechTrigger`] when the turn ends).
    mode: Option<TriggerMode>,
}

/// User speech while the system holds the floor that may become a barge-in.
#[derive(Debug, Clone)]
struct Candidate {
    /// Started by VAD (else by words alone).
    vad: bool,
    started_at: Instant,
    /// The speech lasted long enough (or words alone started it).
    speech_ok: bool,
    /// When the VAD speech (or the last words) ended; the candidate expires later.
    ended_at: Option<Instant>,
    utterance: Utterance,
    /// Trigger mode of the speech at its latest event: anything but `Immediate` never barges
    /// in and is held (without expiring) until the system turn ends.
    mode: TriggerMode,
}

impl Candidate {
    /// Speech that waits for the system turn instead of interrupting it.
    fn held(&self) -> bool {
        self.mode != TriggerMode::Immediate
    }
}

#[derive(Debug, Clone)]
struct ToolCall {
    cancel_on_interrupt: bool,
}

/// The current system turn's response.
#[derive(Debug, Clone)]
struct Response {
    turn: TurnId,
    kind: ResponseKind,
    begun: bool,
    generation_ended: bool,
    awaits_user: bool,
    uninterruptible: bool,
    ephemeral: bool,
    playback: Playback,
    tools: BTreeMap<String, ToolCall>,
    /// The generator ended while tools were pending: the model needs their results.
    follow_up: bool,
    origin: Instant,
    endpointing: Option<Duration>,
    started_at: Option<Instant>,
    first_audio_at: Option<Instant>,
    latency_sent: bool,
}

/// Most inputs that wait: queued behind the current system turn (typed text in `QUEUE` mode,
/// triggers, uninterruptible direct speech), and typed texts joining one user turn. A client
/// that sends more is refused ([`InputError::QueueFull`]) rather than growing memory: 16 is
/// far more than a person types or a client triggers during one reply, and each entry is
/// answered by a reply of its own, so a longer backlog would only be stale by the time it ran.
pub const MAX_QUEUED_INPUTS: usize = 16;

/// Work that waits for the current system turn to end.
#[derive(Debug, Clone)]
enum Pending {
    Text(String),
    Trigger(Option<String>),
    Direct {
        text: String,
        include_in_history: bool,
        uninterruptible: bool,
    },
}

/// A reply cut off by user speech; resumed if the interruption turns out false.
#[derive(Debug, Clone)]
struct Suspended {
    turn: TurnId,
    rest: String,
    ephemeral: bool,
}

/// The turn-taking machine: one per conversation. See the crate docs for the drive loop.
#[derive(Debug, Clone)]
pub struct TurnMachine {
    config: Config,
    state: State,
    now: Option<Instant>,
    next_turn: u32,
    outputs: VecDeque<Output>,
    /// The session feeds transcript words, so empty speech can be told from real speech.
    transcripts_seen: bool,
    /// The VAD's current verdict, tracked in every state.
    user_speaking: bool,
    /// The VAD hears a possible start of speech ([`Input::SpeechOnset`]).
    speech_onset: bool,
    user: Option<UserTurnState>,
    candidate: Option<Candidate>,
    response: Option<Response>,
    /// Tool calls of interrupted responses whose results survive.
    detached_tools: BTreeMap<String, TurnId>,
    queue: VecDeque<Pending>,
    suspended: Option<Suspended>,
    /// Trigger mode of the user's audio ([`Input::SpeechTrigger`]).
    speech_trigger: TriggerMode,
    stats: Stats,
}

impl TurnMachine {
    /// A machine in [`State::NotConnected`].
    #[must_use]
    pub fn new(config: Config) -> Self {
        Self {
            config,
            state: State::NotConnected,
            now: None,
            next_turn: 1,
            outputs: VecDeque::new(),
            transcripts_seen: false,
            user_speaking: false,
            speech_onset: false,
            user: None,
            candidate: None,
            response: None,
            detached_tools: BTreeMap::new(),
            queue: VecDeque::new(),
            suspended: None,
            speech_trigger: TriggerMode::Immediate,
            stats: Stats::default(),
        }
    }

    /// The current state.
    #[must_use]
    pub fn state(&self) -> State {
        self.state
    }

    /// The configuration in use.
    #[must_use]
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Counters since creation.
    #[must_use]
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// The trigger mode of the user's audio, as last set by [`Input::SpeechTrigger`].
    #[must_use]
    pub fn speech_trigger(&self) -> TriggerMode {
        self.speech_trigger
    }

    /// The response currently holding the system turn, if any.
    #[must_use]
    pub fn current_response(&self) -> Option<TurnId> {
        self.response.as_ref().map(|r| r.turn)
    }

    /// The words of the open user turn so far, as its [`Output::UserTurn`] would carry them
    /// if it ended now (finals and the current partial), and whether typed text joined it
    /// (it then becomes user turns of its own). `None` while no user turn is open. A host that
    /// prepares work ahead of the turn's end (speculative generation) predicts the turn's text
    /// from it; nothing here changes when the turn ends.
    #[must_use]
    pub fn open_user_turn_text(&self) -> Option<(String, bool)> {
        self.user
            .as_ref()
            .map(|u| (u.utterance.text(), !u.texts.is_empty()))
    }

    /// Feeds one input at time `now`.
    ///
    /// Provider and client events for turns that are no longer current (a chunk arriving after
    /// a cancel, a late playback report) are dropped silently and counted in [`Stats`]: they
    /// are races, not errors.
    ///
    /// # Errors
    /// [`InputError`] when the peer broke the protocol in this state (input before the
    /// session, an unknown tool call id). The machine is unchanged then.
    pub fn handle_input(&mut self, now: Instant, input: Input) -> Result<(), InputError> {
        let now = self.tick(now);
        match input {
            Input::Connect => {
                if self.state != State::NotConnected {
                    return Err(InputError::HandshakeOutOfOrder(self.state));
                }
                self.set_state(State::Connecting);
            }
            Input::Connected => {
                if self.state != State::Connecting {
                    return Err(InputError::HandshakeOutOfOrder(self.state));
                }
                self.set_state(State::Idle);
                self.outputs.push_back(Output::SessionConnected);
            }
            Input::Disconnected => self.end_session(now),
            Input::Fatal { reason } => {
                self.outputs.push_back(Output::ErrorFatal { reason });
                self.end_session(now);
            }
            other => {
                if matches!(self.state, State::NotConnected | State::Connecting) {
                    return Err(InputError::NotConnected);
                }
                self.session_input(now, other)?;
            }
        }
        self.update(now);
        // An input can make a deadline already past (a late final transcript after the
        // endpoint delay): act on it now rather than wait for the host's next timeout.
        self.run_timers(now);
        Ok(())
    }

    /// Processes every timer due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        let now = self.tick(now);
        self.run_timers(now);
    }

    fn run_timers(&mut self, now: Instant) {
        if matches!(self.state, State::NotConnected | State::Connecting) {
            return;
        }
        if let Some(c) = &mut self.candidate {
            if c.vad && !c.speech_ok && c.ended_at.is_none() {
                if now >= c.started_at + self.config.min_interruption_speech {
                    c.speech_ok = true;
                }
            } else if !c.held()
                && c.ended_at
                    .is_some_and(|e| now >= e + self.config.false_interruption_timeout)
            {
                self.candidate = None;
                self.stats.rejected_interruptions += 1;
            }
            self.check_candidate(now);
        }
        if self.state == State::Listening {
            if self.false_interruption_deadline().is_some_and(|d| now >= d) {
                self.false_interruption(now);
            } else if self.endpoint_deadline().is_some_and(|d| now >= d) {
                self.end_user_turn(now, None);
            } else if self
                .user
                .as_ref()
                .and_then(|u| u.listen_deadline)
                .is_some_and(|d| now >= d)
            {
                // A trigger that waited for an answer that never came is answered, not lost.
                match self.user.take().and_then(|u| u.trigger) {
                    Some(instructions) => {
                        self.request_response(now, ResponseCause::Trigger, instructions, now, None);
                    }
                    None => self.set_state(State::Idle),
                }
            }
        }
        self.update(now);
    }

    /// The next output, if any. Drain after every `handle_*` call.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    /// The earliest instant at which [`TurnMachine::handle_timeout`] has work to do.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut best: Option<Instant> = None;
        let mut consider = |d: Option<Instant>| {
            if let Some(d) = d {
                best = Some(best.map_or(d, |b| b.min(d)));
            }
        };
        if let Some(c) = &self.candidate {
            if c.vad && !c.speech_ok && c.ended_at.is_none() {
                consider(Some(c.started_at + self.config.min_interruption_speech));
            }
            consider(
                c.ended_at
                    .filter(|_| !c.held())
                    .map(|e| e + self.config.false_interruption_timeout),
            );
        }
        if self.state == State::Listening {
            consider(self.false_interruption_deadline());
            consider(self.endpoint_deadline());
            consider(self.user.as_ref().and_then(|u| u.listen_deadline));
        }
        if self.state == State::Speaking
            && let Some(r) = &self.response
            && (r.generation_ended || !r.tools.is_empty())
        {
            consider(r.playback.finish_deadline(
                self.config.playback_reports,
                self.config.playback_report_grace,
            ));
        }
        best
    }

    /// Time never goes backwards inside the machine, so a host's clock hiccup cannot reorder
    /// deadlines.
    fn tick(&mut self, now: Instant) -> Instant {
        let now = self.now.map_or(now, |prev| prev.max(now));
        self.now = Some(now);
        now
    }

    fn alloc_turn(&mut self) -> TurnId {
        let id = TurnId(self.next_turn);
        self.next_turn = self.next_turn.wrapping_add(1).max(1);
        id
    }

    fn set_state(&mut self, to: State) {
        if self.state != to {
            self.outputs.push_back(Output::StateChanged {
                from: self.state,
                to,
            });
            self.state = to;
        }
    }

    fn session_input(&mut self, now: Instant, input: Input) -> Result<(), InputError> {
        match input {
            Input::SpeechStarted => {
                self.speech_onset = false;
                self.speech_started(now);
            }
            Input::SpeechStopped => {
                self.speech_onset = false;
                self.speech_stopped(now);
            }
            Input::SpeechOnset => self.speech_onset = true,
            Input::SpeechOnsetRejected => {
                self.speech_onset = false;
                self.answer_idle_trigger(now);
            }
            Input::Words { text, is_final } => self.words(now, &text, is_final),
            Input::EndOfTurnPrediction { probability } => {
                if let Some(u) = &mut self.user {
                    u.prediction = Some(probability);
                }
            }
            Input::StartCapture => {
                if self.response.is_some() {
                    if !self.abort_allowed() {
                        return Ok(());
                    }
                    self.interrupt(now, Interruption::Capture);
                }
                self.candidate = None;
                let u = self.open_user_turn();
                u.manual = true;
                u.active = true;
            }
            Input::StopCapture => {
                if let Some(u) = &mut self.user {
                    u.manual = false;
                    u.active = true;
                    u.explicit_stop = true;
                    u.speech_ended_at = Some(now);
                    u.listen_deadline = None;
                }
            }
            Input::Text { text, mode } => self.text(now, text, mode)?,
            Input::SpeechTrigger(mode) => self.speech_trigger = mode,
            Input::TriggerInference {
                instructions,
                flush_vad,
            } => self.trigger(now, instructions, flush_vad)?,
            Input::Abort => self.abort(now),
            Input::DirectSpeech {
                text,
                include_in_history,
                uninterruptible,
            } => self.direct_speech(now, text, include_in_history, uninterruptible)?,
            Input::ResponseStarted { turn } => {
                if let Some(r) = self.current_mut(turn) {
                    r.started_at.get_or_insert(now);
                    self.begin(turn);
                }
            }
            Input::ResponseChunk { turn, text, audio } => {
                let Some(r) = self.current_mut(turn) else {
                    return Ok(());
                };
                if r.generation_ended {
                    self.stats.stale_inputs += 1;
                    return Ok(());
                }
                r.started_at.get_or_insert(now);
                if audio.is_some() {
                    r.first_audio_at.get_or_insert(now);
                }
                let seq = r.playback.push(now, text, audio);
                self.begin(turn);
                // Output goes to the client only while the system is Speaking; a text-only
                // chunk during a tool call is spoken, then the state settles back to Action.
                self.set_state(State::Speaking);
                self.outputs.push_back(Output::Deliver { turn, seq });
                self.emit_first_audio_latency();
            }
            Input::ResponseEnd { turn, awaits_user } => {
                if let Some(r) = self.current_mut(turn)
                    && !r.generation_ended
                {
                    r.generation_ended = true;
                    r.awaits_user = awaits_user;
                    // Tools still running, or already finished during this generation: the
                    // model never sees a result in the stream that called the tool, so any
                    // call asks for a follow-up response.
                    r.follow_up |= !r.tools.is_empty();
                    if r.begun {
                        self.outputs.push_back(Output::GenerationEnded { turn });
                    }
                }
            }
            Input::ToolCallStarted {
                turn,
                call_id,
                name,
                cancel_on_interrupt,
            } => {
                let known = self.detached_tools.contains_key(&call_id);
                let Some(r) = self.current_mut(turn) else {
                    return Ok(());
                };
                if r.generation_ended || known || r.tools.contains_key(&call_id) {
                    self.stats.stale_inputs += 1;
                    return Ok(());
                }
                r.started_at.get_or_insert(now);
                r.tools.insert(
                    call_id.clone(),
                    ToolCall {
                        cancel_on_interrupt,
                    },
                );
                self.begin(turn);
                self.outputs.push_back(Output::ActionInvoke {
                    turn,
                    call_id,
                    name,
                });
            }
            Input::ToolCallFinished { call_id, ok } => {
                let mut in_response = false;
                if let Some(r) = self.response.as_mut()
                    && r.tools.remove(&call_id).is_some()
                {
                    r.follow_up = true;
                    in_response = true;
                }
                let found = in_response || self.detached_tools.remove(&call_id).is_some();
                if !found {
                    return Err(InputError::UnknownToolCall { call_id });
                }
                self.outputs.push_back(Output::ActionResult { call_id, ok });
            }
            Input::PlaybackProgress { turn, bytes_played } => {
                if let Some(r) = self.current_mut(turn) {
                    r.playback.report(bytes_played);
                }
            }
            Input::Connect | Input::Connected | Input::Disconnected | Input::Fatal { .. } => {}
        }
        Ok(())
    }

    /// The current response if it is `turn`; otherwise counts a stale input.
    fn current_mut(&mut self, turn: TurnId) -> Option<&mut Response> {
        match &mut self.response {
            Some(r) if r.turn == turn => Some(r),
            _ => {
                self.stats.stale_inputs += 1;
                None
            }
        }
    }

    fn begin(&mut self, turn: TurnId) {
        if let Some(r) = &mut self.response
            && r.turn == turn
            && !r.begun
        {
            r.begun = true;
            self.outputs.push_back(Output::ResponseBegun { turn });
        }
    }

    fn abort_allowed(&self) -> bool {
        !self.response.as_ref().is_some_and(|r| r.uninterruptible)
            || self.config.abort_overrides_uninterruptible
    }

    fn interruptible(&self) -> bool {
        !self.response.as_ref().is_some_and(|r| r.uninterruptible)
    }

    // ---- user side -------------------------------------------------------------------------

    fn open_user_turn(&mut self) -> &mut UserTurnState {
        self.set_state(State::Listening);
        self.user.get_or_insert_with(UserTurnState::default)
    }

    fn speech_started(&mut self, now: Instant) {
        self.user_speaking = true;
        match self.state {
            State::Idle | State::Listening => {
                self.outputs.push_back(Output::InputDetected);
                let mode = self.speech_trigger;
                let u = self.open_user_turn();
                u.active = true;
                u.vad = true;
                u.speech_ended_at = None;
                u.explicit_stop = false;
                u.prediction = None;
                u.listen_deadline = None;
                u.mode = Some(mode);
            }
            _ => match &mut self.candidate {
                Some(c) => {
                    // Speech resumed within a pending candidate: it keeps its start.
                    c.vad = true;
                    c.ended_at = None;
                    c.mode = self.speech_trigger;
                }
                None => {
                    self.candidate = Some(Candidate {
                        vad: true,
                        started_at: now,
                        speech_ok: false,
                        ended_at: None,
                        utterance: Utterance::default(),
                        mode: self.speech_trigger,
                    });
                }
            },
        }
    }

    fn speech_stopped(&mut self, now: Instant) {
        self.user_speaking = false;
        if self.state == State::Listening
            && let Some(u) = &mut self.user
            && u.active
        {
            u.speech_ended_at = Some(now);
            u.mode = Some(self.speech_trigger);
        }
        if let Some(c) = &mut self.candidate {
            c.mode = self.speech_trigger;
            if c.vad && !c.speech_ok && now >= c.started_at + self.config.min_interruption_speech {
                c.speech_ok = true;
            }
            if c.vad && !c.speech_ok {
                // Too short to be a barge-in (a cough, a backchannel).
                self.candidate = None;
                self.stats.rejected_interruptions += 1;
            } else {
                c.ended_at = Some(now);
            }
        }
        self.check_candidate(now);
    }

    fn words(&mut self, now: Instant, text: &str, is_final: bool) {
        self.transcripts_seen = true;
        match self.state {
            State::Idle | State::Listening => {
                if self.state == State::Idle && word_count(text) == 0 {
                    return;
                }
                let speaking = self.user_speaking;
                if self.state == State::Idle {
                    self.outputs.push_back(Output::InputDetected);
                }
                let u = self.open_user_turn();
                u.active = true;
                u.listen_deadline = None;
                u.utterance.push(text, is_final);
                if !speaking && !u.manual && !u.vad {
                    // Words without VAD: the words themselves mark the end of speech.
                    u.speech_ended_at = Some(now);
                }
            }
            _ => {
                // An empty transcript is no speech: it must not start a words-only candidate,
                // which counts as long enough and would let VAD speech that joins it skip the
                // minimum interruption speech.
                if self.candidate.is_none() && word_count(text) == 0 {
                    return;
                }
                let speaking = self.user_speaking;
                let mode = self.speech_trigger;
                let c = self.candidate.get_or_insert_with(|| Candidate {
                    vad: false,
                    started_at: now,
                    speech_ok: true,
                    ended_at: None,
                    utterance: Utterance::default(),
                    mode,
                });
                c.utterance.push(text, is_final);
                if !c.vad && !speaking {
                    c.ended_at = Some(now);
                }
                self.check_candidate(now);
            }
        }
    }

    /// Applies the interruption policy to the pending candidate.
    fn check_candidate(&mut self, now: Instant) {
        let Some(c) = &self.candidate else { return };
        if self.response.is_none() || !self.interruptible() || !c.speech_ok || c.held() {
            return;
        }
        let words = c.utterance.words();
        let needed = self.config.min_interruption_words as usize;
        let enough_words = if c.vad {
            words >= needed
        } else {
            words >= needed.max(1)
        };
        if !enough_words {
            return;
        }
        let by = if c.vad {
            Interruption::Speech
        } else {
            Interruption::Words
        };
        let Some(c) = self.candidate.take() else {
            return;
        };
        self.interrupt(now, by);
        self.outputs.push_back(Output::InputDetected);
        let speaking = self.user_speaking;
        let u = self.open_user_turn();
        u.active = true;
        u.vad = c.vad;
        u.utterance = c.utterance;
        u.mode = Some(c.mode);
        u.speech_ended_at = if speaking {
            None
        } else {
            Some(c.ended_at.unwrap_or(now))
        };
    }

    fn endpoint_deadline(&self) -> Option<Instant> {
        let u = self.user.as_ref()?;
        if !u.active || u.manual || (self.user_speaking || self.speech_onset) && !u.explicit_stop {
            return None;
        }
        let end = u.speech_ended_at?;
        let min = if u.explicit_stop {
            Duration::ZERO
        } else {
            self.config.min_endpoint_delay
        };
        let max = self.config.max_endpoint_delay.max(min);
        let wait = match u.prediction {
            Some(p) if p >= self.config.end_of_turn_threshold => min,
            Some(_) => max,
            None if !self.transcripts_seen => min,
            // The recognizer is still revising the last words: wait for its final.
            None if !u.utterance.partial.is_empty() => max,
            // Words are expected but none came yet: give the recognizer time (and a false
            // interruption time to show itself).
            None if u.utterance.finals.is_empty() && u.texts.is_empty() => max,
            None => min,
        };
        Some(end + wait)
    }

    fn false_interruption_deadline(&self) -> Option<Instant> {
        self.suspended.as_ref()?;
        let u = self.user.as_ref()?;
        if self.user_speaking || u.manual || u.utterance.words() > 0 || !u.texts.is_empty() {
            return None;
        }
        if !self.transcripts_seen {
            return None;
        }
        Some(u.speech_ended_at? + self.config.false_interruption_timeout)
    }

    /// The interruption produced no words: drop the user turn and resume the cut-off reply.
    fn false_interruption(&mut self, now: Instant) {
        self.user = None;
        self.stats.discarded_user_turns += 1;
        self.outputs.push_back(Output::UserTurnDiscarded);
        self.resume_or_idle(now);
    }

    fn resume_or_idle(&mut self, now: Instant) {
        match self.suspended.take() {
            Some(s) if self.config.resume_false_interruptions => {
                self.stats.false_interruptions += 1;
                let turn = self.alloc_turn();
                self.outputs.push_back(Output::ResumeResponse {
                    turn,
                    interrupted: s.turn,
                    text: s.rest,
                });
                self.start_system_response(now, turn, ResponseKind::Resumed, s.ephemeral, false);
                self.begin(turn);
            }
            _ => self.set_state(State::Idle),
        }
    }

    /// Ends the open user turn: commits it (and replies) or discards it when empty.
    /// `trigger` overrides the turn's own pending trigger (a flush).
    fn end_user_turn(&mut self, now: Instant, flush: Option<Option<String>>) {
        let Some(u) = self.user.take() else { return };
        let text = u.utterance.text();
        let spoken = u.active && (!text.is_empty() || !self.transcripts_seen);
        let trigger = flush.or(u.trigger);
        let origin = u.speech_ended_at.unwrap_or(now);
        // NO_TRIGGER speech is committed without a reply, unless typed text or a trigger in
        // the same turn asks for one.
        let replies = trigger.is_some()
            || !u.texts.is_empty()
            || u.mode.unwrap_or(self.speech_trigger) != TriggerMode::NoTrigger;
        let mut last_user = None;
        if spoken {
            let turn = self.alloc_turn();
            self.outputs.push_back(Output::UserTurn(UserTurn {
                turn,
                text,
                source: UserSource::Speech,
            }));
            last_user = Some(turn);
        }
        for text in u.texts {
            let turn = self.alloc_turn();
            self.outputs.push_back(Output::UserTurn(UserTurn {
                turn,
                text,
                source: UserSource::Text,
            }));
            last_user = Some(turn);
        }
        match (last_user, trigger) {
            (Some(_), _) if !replies => {
                self.suspended = None;
                if !self.run_queue(now) {
                    self.set_state(State::Idle);
                }
            }
            (Some(user_turn), trigger) => {
                self.suspended = None;
                let endpointing = spoken.then(|| now.saturating_duration_since(origin));
                let origin = if spoken { origin } else { now };
                self.request_response(
                    now,
                    ResponseCause::User(user_turn),
                    trigger.flatten(),
                    origin,
                    endpointing,
                );
            }
            (None, Some(instructions)) => {
                self.suspended = None;
                self.request_response(now, ResponseCause::Trigger, instructions, now, None);
            }
            (None, None) => {
                self.stats.discarded_user_turns += 1;
                self.outputs.push_back(Output::UserTurnDiscarded);
                self.resume_or_idle(now);
            }
        }
    }

    // ---- client commands -------------------------------------------------------------------

    /// Queues `pending` behind the current system turn, within [`MAX_QUEUED_INPUTS`].
    fn enqueue(&mut self, pending: Pending) -> Result<(), InputError> {
        if self.queue.len() >= MAX_QUEUED_INPUTS {
            return Err(InputError::QueueFull {
                limit: MAX_QUEUED_INPUTS,
            });
        }
        self.queue.push_back(pending);
        Ok(())
    }

    fn text(&mut self, now: Instant, text: String, mode: TriggerMode) -> Result<(), InputError> {
        match (mode, self.state) {
            (TriggerMode::NoTrigger, _) => {
                self.record_text(text);
            }
            (_, State::Listening) => {
                if let Some(u) = &mut self.user {
                    // A held push-to-talk turn never ends on its own: bound what it collects.
                    if u.texts.len() >= MAX_QUEUED_INPUTS {
                        return Err(InputError::QueueFull {
                            limit: MAX_QUEUED_INPUTS,
                        });
                    }
                    u.texts.push(text);
                    u.active = true;
                    u.listen_deadline = None;
                    if u.speech_ended_at.is_none() && !self.user_speaking && !u.manual {
                        u.speech_ended_at = Some(now);
                        u.explicit_stop = true;
                    }
                }
            }
            (_, State::Idle) => {
                let user = self.record_text(text);
                self.request_response(now, ResponseCause::User(user), None, now, None);
            }
            (TriggerMode::Immediate, _) if self.interruptible() => {
                self.interrupt(now, Interruption::Text);
                self.commit_held_speech();
                let user = self.record_text(text);
                self.request_response(now, ResponseCause::User(user), None, now, None);
            }
            _ => self.enqueue(Pending::Text(text))?,
        }
        Ok(())
    }

    /// Drops the pending candidate; speech held by its trigger mode (`QUEUE`/`NO_TRIGGER`)
    /// that has words is committed first, so what the user said before the system turn was
    /// cut by other means stays in history (without asking for a reply of its own).
    fn commit_held_speech(&mut self) {
        let Some(c) = self.candidate.take() else {
            return;
        };
        let text = c.utterance.text();
        if c.held() && !text.is_empty() {
            let turn = self.alloc_turn();
            self.outputs.push_back(Output::UserTurn(UserTurn {
                turn,
                text,
                source: UserSource::Speech,
            }));
        }
    }

    fn record_text(&mut self, text: String) -> TurnId {
        let turn = self.alloc_turn();
        self.outputs.push_back(Output::UserTurn(UserTurn {
            turn,
            text,
            source: UserSource::Text,
        }));
        turn
    }

    fn trigger(
        &mut self,
        now: Instant,
        instructions: Option<String>,
        flush_vad: bool,
    ) -> Result<(), InputError> {
        match self.state {
            State::Idle => {
                self.request_response(now, ResponseCause::Trigger, instructions, now, None);
            }
            State::Listening if flush_vad => self.end_user_turn(now, Some(instructions)),
            State::Listening => match &mut self.user {
                Some(u) => {
                    u.trigger = Some(instructions);
                    self.answer_idle_trigger(now);
                }
                None => self.request_response(now, ResponseCause::Trigger, instructions, now, None),
            },
            _ => self.enqueue(Pending::Trigger(instructions))?,
        }
        Ok(())
    }

    /// A trigger held by a user turn in which nobody speaks or types (the wait for an answer
    /// after the system asked a question) is answered now: nothing but the wait's timeout
    /// would end that turn, and clients asking for a reply expect it within seconds.
    fn answer_idle_trigger(&mut self, now: Instant) {
        let idle = self.state == State::Listening
            && !self.user_speaking
            && !self.speech_onset
            && self
                .user
                .as_ref()
                .is_some_and(|u| !u.active && !u.manual && u.trigger.is_some());
        if !idle {
            return;
        }
        if let Some(instructions) = self.user.take().and_then(|u| u.trigger) {
            self.request_response(now, ResponseCause::Trigger, instructions, now, None);
        }
    }

    fn abort(&mut self, now: Instant) {
        match self.state {
            State::Listening => {
                self.user = None;
                self.stats.discarded_user_turns += 1;
                self.outputs.push_back(Output::UserTurnDiscarded);
                self.set_state(State::Idle);
            }
            State::Processing | State::Speaking | State::Action => {
                if !self.abort_allowed() {
                    return;
                }
                self.interrupt(now, Interruption::ClientAbort);
                self.commit_held_speech();
                self.suspended = None;
                // Queued typed text stays in history; it just no longer asks for a reply.
                for pending in mem::take(&mut self.queue) {
                    if let Pending::Text(text) = pending {
                        self.record_text(text);
                    }
                }
                self.after_system_turn();
            }
            _ => {}
        }
    }

    fn direct_speech(
        &mut self,
        now: Instant,
        text: String,
        include_in_history: bool,
        uninterruptible: bool,
    ) -> Result<(), InputError> {
        if self.response.is_some() {
            if !self.interruptible() {
                return self.enqueue(Pending::Direct {
                    text,
                    include_in_history,
                    uninterruptible,
                });
            }
            self.interrupt(now, Interruption::DirectSpeech);
        }
        self.commit_held_speech();
        self.suspended = None;
        if let Some(u) = self.user.take() {
            // The user's words so far stay in history without asking for a reply.
            let text = u.utterance.text();
            if !text.is_empty() {
                let turn = self.alloc_turn();
                self.outputs.push_back(Output::UserTurn(UserTurn {
                    turn,
                    text,
                    source: UserSource::Speech,
                }));
            }
            for t in u.texts {
                self.record_text(t);
            }
        }
        self.speak(now, text, include_in_history, uninterruptible);
        Ok(())
    }

    fn speak(
        &mut self,
        now: Instant,
        text: String,
        include_in_history: bool,
        uninterruptible: bool,
    ) {
        let turn = self.alloc_turn();
        self.outputs.push_back(Output::Speak { turn, text });
        self.start_system_response(
            now,
            turn,
            ResponseKind::Direct,
            !include_in_history,
            uninterruptible,
        );
        self.begin(turn);
    }

    // ---- system side -----------------------------------------------------------------------

    fn request_response(
        &mut self,
        now: Instant,
        cause: ResponseCause,
        instructions: Option<String>,
        origin: Instant,
        endpointing: Option<Duration>,
    ) {
        let turn = self.alloc_turn();
        self.outputs.push_back(Output::StartResponse {
            turn,
            cause,
            instructions,
        });
        self.start_system_response(now, turn, ResponseKind::Model, false, false);
        if let Some(r) = &mut self.response {
            r.origin = origin;
            r.endpointing = endpointing;
        }
    }

    fn start_system_response(
        &mut self,
        now: Instant,
        turn: TurnId,
        kind: ResponseKind,
        ephemeral: bool,
        uninterruptible: bool,
    ) {
        self.user = None;
        self.response = Some(Response {
            turn,
            kind,
            begun: false,
            generation_ended: false,
            awaits_user: false,
            uninterruptible,
            ephemeral,
            playback: Playback::default(),
            tools: BTreeMap::new(),
            follow_up: false,
            origin: now,
            endpointing: None,
            started_at: None,
            first_audio_at: None,
            latency_sent: false,
        });
        self.set_state(State::Processing);
    }

    /// Barge-in: halt playback, cancel generation and cancellable tools, and record exactly
    /// what was heard. The caller decides where the floor goes next.
    fn interrupt(&mut self, now: Instant, by: Interruption) {
        let Some(mut r) = self.response.take() else {
            return;
        };
        self.stats.interruptions += 1;
        self.suspended = None;
        // Halting playback comes first: it is the one thing the user notices.
        if r.playback.has_audio() {
            self.outputs
                .push_back(Output::ClearPlayback { turn: r.turn });
        }
        if !r.generation_ended {
            self.outputs
                .push_back(Output::CancelResponse { turn: r.turn });
        }
        for (call_id, call) in mem::take(&mut r.tools) {
            if call.cancel_on_interrupt {
                self.outputs.push_back(Output::CancelTool { call_id });
            } else {
                self.detached_tools.insert(call_id, r.turn);
            }
        }
        if r.begun {
            let heard = r.playback.heard_text(now, self.config.playback_reports);
            let delivered = r.playback.delivered_text();
            let rest = delivered
                .get(heard.len()..)
                .unwrap_or_default()
                .trim_start()
                .to_owned();
            if matches!(by, Interruption::Speech | Interruption::Words) && word_count(&rest) > 0 {
                self.suspended = Some(Suspended {
                    turn: r.turn,
                    rest,
                    ephemeral: r.ephemeral,
                });
            }
            self.emit_latency_of(&mut r);
            self.outputs.push_back(Output::ResponseEnded(AssistantTurn {
                turn: r.turn,
                heard_text: heard,
                delivery: Delivery::Interrupted { by },
                ephemeral: r.ephemeral,
                kind: r.kind,
            }));
        }
    }

    fn emit_first_audio_latency(&mut self) {
        if let Some(mut r) = self.response.take() {
            if r.first_audio_at.is_some() {
                self.emit_latency_of(&mut r);
            }
            self.response = Some(r);
        }
    }

    fn emit_latency_of(&mut self, r: &mut Response) {
        if r.latency_sent || !r.begun {
            return;
        }
        r.latency_sent = true;
        let since = |t: Option<Instant>| t.map(|t| t.saturating_duration_since(r.origin));
        self.outputs.push_back(Output::Latency(TurnLatency {
            turn: r.turn,
            origin: r.origin,
            endpointing: r.endpointing,
            to_response_start: since(r.started_at),
            to_first_audio: since(r.first_audio_at),
        }));
    }

    /// Moves the system turn along: Processing → Speaking/Action, and ends the response once
    /// generation, tools and playback are all done.
    fn update(&mut self, now: Instant) {
        let reports = self.config.playback_reports;
        let grace = self.config.playback_report_grace;
        let Some(r) = &self.response else { return };
        let playing = r.playback.has_audio() && !r.playback.finished(now, reports, grace);
        let next = if !r.tools.is_empty() && !playing {
            State::Action
        } else if r.playback.has_chunks() && (playing || !r.generation_ended) {
            State::Speaking
        } else if !r.generation_ended || !r.tools.is_empty() {
            State::Processing
        } else {
            self.finish_response(now);
            return;
        };
        self.set_state(next);
    }

    fn finish_response(&mut self, now: Instant) {
        let Some(mut r) = self.response.take() else {
            return;
        };
        if r.begun {
            self.emit_latency_of(&mut r);
            self.outputs.push_back(Output::ResponseEnded(AssistantTurn {
                turn: r.turn,
                heard_text: r.playback.delivered_text(),
                delivery: Delivery::Complete,
                ephemeral: r.ephemeral,
                kind: r.kind,
            }));
        }
        if r.follow_up {
            self.request_response(now, ResponseCause::ToolResults, None, now, None);
            return;
        }
        self.candidate_to_user_turn(now);
        if self.state == State::Listening {
            return;
        }
        if self.run_queue(now) {
            return;
        }
        if r.awaits_user {
            let listen_timeout = self.config.listen_timeout;
            let u = self.open_user_turn();
            u.listen_deadline = Some(now + listen_timeout);
            return;
        }
        self.set_state(State::Idle);
    }

    /// Speech held back during uninterruptible speech (or still going on) becomes a user turn.
    fn candidate_to_user_turn(&mut self, now: Instant) {
        let c = self.candidate.take();
        if c.is_none() && !self.user_speaking {
            return;
        }
        self.outputs.push_back(Output::InputDetected);
        let speaking = self.user_speaking;
        let u = self.open_user_turn();
        u.active = true;
        u.vad |= speaking;
        if let Some(c) = c {
            u.vad |= c.vad;
            u.utterance = c.utterance;
            u.mode = Some(c.mode);
            if !speaking {
                u.speech_ended_at = Some(c.ended_at.unwrap_or(now));
            }
        }
    }

    fn run_queue(&mut self, now: Instant) -> bool {
        let Some(next) = self.queue.pop_front() else {
            return false;
        };
        match next {
            Pending::Text(text) => {
                let user = self.record_text(text);
                self.request_response(now, ResponseCause::User(user), None, now, None);
            }
            Pending::Trigger(instructions) => {
                self.request_response(now, ResponseCause::Trigger, instructions, now, None);
            }
            Pending::Direct {
                text,
                include_in_history,
                uninterruptible,
            } => self.speak(now, text, include_in_history, uninterruptible),
        }
        true
    }

    /// After an abort: the floor goes to the user if they are talking, else to nobody.
    fn after_system_turn(&mut self) {
        if self.user_speaking {
            self.outputs.push_back(Output::InputDetected);
            let u = self.open_user_turn();
            u.active = true;
            u.vad = true;
        } else {
            self.set_state(State::Idle);
        }
    }

    fn end_session(&mut self, now: Instant) {
        if self.response.is_some() {
            self.interrupt(now, Interruption::Disconnect);
        }
        for call_id in mem::take(&mut self.detached_tools).into_keys() {
            self.outputs.push_back(Output::CancelTool { call_id });
        }
        self.user = None;
        self.candidate = None;
        self.suspended = None;
        self.queue.clear();
        self.user_speaking = false;
        self.speech_onset = false;
        self.speech_trigger = TriggerMode::Immediate;
        self.set_state(State::NotConnected);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Harness;

    fn text(text: &str, mode: TriggerMode) -> Input {
        Input::Text {
            text: text.into(),
            mode,
        }
    }

    #[test]
    fn queue_behind_a_reply_is_bounded_for_every_kind_of_input() {
        let mut h = Harness::connected(Config::default(), Instant::now());
        h.input(text("hi", TriggerMode::Immediate)).unwrap();
        assert_eq!(h.state(), State::Processing);
        for n in 0..MAX_QUEUED_INPUTS {
            let input = match n % 3 {
                0 => text("later", TriggerMode::Queue),
                1 => Input::TriggerInference {
                    instructions: None,
                    flush_vad: false,
                },
                _ => text("and this", TriggerMode::Queue),
            };
            h.input(input).unwrap();
        }
        assert_eq!(h.machine().queue.len(), MAX_QUEUED_INPUTS);
        let full = Err(InputError::QueueFull {
            limit: MAX_QUEUED_INPUTS,
        });
        assert_eq!(h.input(text("one too many", TriggerMode::Queue)), full);
        let trigger = Input::TriggerInference {
            instructions: Some("x".into()),
            flush_vad: false,
        };
        assert_eq!(h.input(trigger), full);
        assert_eq!(h.machine().queue.len(), MAX_QUEUED_INPUTS);
    }

    #[test]
    fn uninterruptible_direct_speech_queue_is_bounded() {
        let mut h = Harness::connected(Config::default(), Instant::now());
        let direct = || Input::DirectSpeech {
            text: "Please hold.".into(),
            include_in_history: true,
            uninterruptible: true,
        };
        h.input(direct()).unwrap();
        for _ in 0..MAX_QUEUED_INPUTS {
            h.input(direct()).unwrap();
        }
        assert_eq!(
            h.input(direct()),
            Err(InputError::QueueFull {
                limit: MAX_QUEUED_INPUTS
            })
        );
        assert_eq!(h.machine().queue.len(), MAX_QUEUED_INPUTS);
    }

    #[test]
    fn texts_joining_a_held_push_to_talk_turn_are_bounded() {
        let mut h = Harness::connected(Config::default(), Instant::now());
        h.input(Input::StartCapture).unwrap();
        assert_eq!(h.state(), State::Listening);
        for _ in 0..MAX_QUEUED_INPUTS {
            h.input(text("more", TriggerMode::Immediate)).unwrap();
        }
        assert!(matches!(
            h.input(text("too much", TriggerMode::Immediate)),
            Err(InputError::QueueFull { .. })
        ));
        let texts = h.machine().user.as_ref().map(|u| u.texts.len());
        assert_eq!(texts, Some(MAX_QUEUED_INPUTS));
        // The turn still ends normally with what it kept.
        let outs = h.input(Input::StopCapture).unwrap();
        let mut outs = outs;
        outs.extend(h.advance(Duration::from_secs(5)));
        let typed = outs
            .iter()
            .filter(|o| matches!(o, Output::UserTurn(u) if u.source == UserSource::Text))
            .count();
        assert_eq!(typed, MAX_QUEUED_INPUTS);
    }
}
