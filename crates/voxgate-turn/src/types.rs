//! The values that go in and out of the machine.

use std::fmt;
use std::time::{Duration, Instant};

/// The session states of the VIP state machine (seed §5.2.1).
///
/// Exactly one state is current, so exactly one party holds the floor ([`State::floor`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum State {
    /// No session exists.
    NotConnected,
    /// The handshake is in progress.
    Connecting,
    /// The session is up and nobody holds the floor.
    Idle,
    /// The user holds the floor: their audio (or text) is being captured.
    Listening,
    /// The system holds the floor and is computing (endpointed input, inference, synthesis).
    Processing,
    /// The system holds the floor and its reply is being delivered to the client.
    Speaking,
    /// The system holds the floor while tools (client actions or server tools) run.
    Action,
}

impl State {
    /// Who holds the floor in this state.
    #[must_use]
    pub fn floor(self) -> Floor {
        match self {
            Self::NotConnected | Self::Connecting | Self::Idle => Floor::Nobody,
            Self::Listening => Floor::User,
            Self::Processing | Self::Speaking | Self::Action => Floor::System,
        }
    }
}

/// The holder of the conversational floor (seed §5.1.2, exclusivity).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Floor {
    /// Nobody: the session is idle or not connected.
    Nobody,
    /// The user.
    User,
    /// The system (assistant).
    System,
}

/// Identifies one turn (a committed user turn or one assistant response).
///
/// Allocated by the machine from one counter so ids are unique within a session and increase;
/// the realtime protocol's `turn_id` fields carry it unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TurnId(pub u32);

impl fmt::Display for TurnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "turn#{}", self.0)
    }
}

/// How a text input, or the user's speech, asks for inference (the realtime protocol's
/// `InferenceTriggerMode`).
///
/// For speech ([`Input::SpeechTrigger`]): `NoTrigger` commits the spoken turn without a reply,
/// `Queue` answers it after the current system turn, `Immediate` may barge in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TriggerMode {
    /// Add the text to the conversation without starting a reply.
    NoTrigger,
    /// Start a reply once the current system turn has finished.
    Queue,
    /// Interrupt the current system turn (if interruptible) and reply now.
    Immediate,
}

/// The audio extent of one delivered chunk, in the units the client reports playback in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AudioSpan {
    /// Size of the chunk as the client counts it for `bytes_played` reports.
    pub bytes: u64,
    /// Playing time of the chunk at the output sample rate.
    pub duration: Duration,
}

/// Everything the machine reacts to. Feed with [`crate::TurnMachine::handle_input`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Input {
    /// The transport is up and the handshake began (NotConnected → Connecting).
    Connect,
    /// The handshake finished (Connecting → Idle, emits [`Output::SessionConnected`]).
    Connected,
    /// The session ended; every open response is closed as interrupted.
    Disconnected,
    /// An unrecoverable failure; emits [`Output::ErrorFatal`] and ends the session.
    Fatal {
        /// Human-readable cause, passed through to the event.
        reason: String,
    },
    /// The VAD reports that user speech started (after its own start hysteresis).
    SpeechStarted,
    /// The VAD reports that user speech stopped (after its own stop hysteresis).
    SpeechStopped,
    /// The VAD hears what may be speech but has not confirmed it (its start hysteresis is
    /// running). Endpointing holds while it lasts: speech resuming after a pause would
    /// otherwise race the endpoint timer by the length of the hysteresis, and lose under
    /// load. Ends with [`Input::SpeechStarted`] or [`Input::SpeechOnsetRejected`]; optional
    /// (a host that never sends it gets the endpoint as before).
    SpeechOnset,
    /// What [`Input::SpeechOnset`] announced was not speech (the VAD went back to silence).
    SpeechOnsetRejected,
    /// Transcript words of the current user speech.
    Words {
        /// The text; a partial replaces the previous partial, a final is appended.
        text: String,
        /// Whether the recognizer will not revise this text any more.
        is_final: bool,
    },
    /// A turn-end model's verdict on the current pause (room for Smart-Turn-like models).
    EndOfTurnPrediction {
        /// Probability that the user has finished their turn, 0.0..=1.0.
        probability: f32,
    },
    /// Push-to-talk press or `listen start` in manual mode: the user takes the floor now.
    StartCapture,
    /// Push-to-talk release or `listen stop`: the user says their turn is over.
    StopCapture,
    /// Typed user text with the realtime protocol's trigger mode.
    Text {
        /// The user's text.
        text: String,
        /// Whether and when it starts a reply.
        mode: TriggerMode,
    },
    /// The trigger mode of the audio the client is sending now (realtime `UserInput.mode` on
    /// audio). Default [`TriggerMode::Immediate`]. The machine reads it at speech events:
    /// speech that starts while the system holds the floor can barge in only when the mode is
    /// `Immediate` (otherwise it is held, never clears playback, and becomes a user turn when
    /// the system turn ends); when a spoken user turn ends, `NoTrigger` commits it without a
    /// reply, `Queue` and `Immediate` reply. Setting it changes nothing by itself.
    SpeechTrigger(TriggerMode),
    /// `TriggerInference`: start a reply now (greetings, app-driven turns).
    TriggerInference {
        /// Extra instructions for this reply.
        instructions: Option<String>,
        /// End the user's current utterance first instead of waiting for it to end.
        flush_vad: bool,
    },
    /// The client aborted the agent (Xiaozhi `abort`, a stop button).
    Abort,
    /// Speak this text verbatim, cancelling any inference (`DirectSpeech`).
    DirectSpeech {
        /// Text to synthesize.
        text: String,
        /// Keep it in history (otherwise the history record is marked ephemeral).
        include_in_history: bool,
        /// User speech cannot interrupt it.
        uninterruptible: bool,
    },
    /// The model began producing the response for `turn` (first token).
    ResponseStarted {
        /// The turn from [`Output::StartResponse`].
        turn: TurnId,
    },
    /// A piece of the response is ready to go to the client.
    ResponseChunk {
        /// The response it belongs to.
        turn: TurnId,
        /// The text this chunk speaks (or shows, when `audio` is `None`).
        text: String,
        /// The chunk's audio, or `None` for text-only output.
        audio: Option<AudioSpan>,
    },
    /// The generator finished `turn`: no more chunks will follow.
    ResponseEnd {
        /// The response that finished generating.
        turn: TurnId,
        /// The reply asked the user something: listen right after playback.
        awaits_user: bool,
    },
    /// The model called a tool during `turn`.
    ToolCallStarted {
        /// The response that called it.
        turn: TurnId,
        /// Correlates the result.
        call_id: String,
        /// Tool name.
        name: String,
        /// Cancel this call if the user barges in (else its result survives the interruption).
        cancel_on_interrupt: bool,
    },
    /// A tool call finished (successfully or not).
    ToolCallFinished {
        /// The id from [`Input::ToolCallStarted`].
        call_id: String,
        /// Whether it succeeded.
        ok: bool,
    },
    /// The client's cumulative playback position for `turn` (`PlaybackPositionReport`).
    PlaybackProgress {
        /// The response being played.
        turn: TurnId,
        /// Bytes played so far in this response, in [`AudioSpan::bytes`] units.
        bytes_played: u64,
    },
}

/// What interrupted a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Interruption {
    /// User speech that passed the interruption policy.
    Speech,
    /// Transcript words without VAD speech that passed the policy.
    Words,
    /// A client abort.
    ClientAbort,
    /// A push-to-talk press.
    Capture,
    /// An `IMMEDIATE` text input.
    Text,
    /// A `DirectSpeech` that preempted the reply.
    DirectSpeech,
    /// The session ended.
    Disconnect,
}

/// How a response ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Delivery {
    /// Everything generated was played out.
    Complete,
    /// Cut off; the record holds only what the user heard (`DELIVERY_INTERRUPTED`).
    Interrupted {
        /// What cut it off.
        by: Interruption,
    },
}

/// Where a response came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ResponseKind {
    /// Generated by the model after [`Output::StartResponse`].
    Model,
    /// Verbatim text from [`Input::DirectSpeech`].
    Direct,
    /// The unheard rest of a reply cut off by a false interruption.
    Resumed,
}

/// The history record of one assistant response: exactly what the user heard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssistantTurn {
    /// The response.
    pub turn: TurnId,
    /// The text the user heard (all of it when complete, a word-aligned prefix when cut off).
    pub heard_text: String,
    /// Complete or interrupted.
    pub delivery: Delivery,
    /// Direct speech with `include_in_history: false`: keep it out of the model's context.
    pub ephemeral: bool,
    /// Where the response came from.
    pub kind: ResponseKind,
}

/// Where a user turn's content came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum UserSource {
    /// Speech (VAD and/or transcript words, or push-to-talk).
    Speech,
    /// Typed text.
    Text,
}

/// The history record of one committed user turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserTurn {
    /// The turn id (shared counter with responses).
    pub turn: TurnId,
    /// The transcript or typed text (empty for speech when no recognizer feeds words).
    pub text: String,
    /// Speech or text.
    pub source: UserSource,
}

/// Why a response was requested.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ResponseCause {
    /// A user turn (speech or text) ended.
    User(TurnId),
    /// `TriggerInference` (or a trigger that waited for the user's turn to end).
    Trigger,
    /// Tool results arrived after the model had ended its response.
    ToolResults,
}

/// Per-response latency figures, measured from `origin` (end of user speech for spoken turns,
/// the input's arrival otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TurnLatency {
    /// The response measured.
    pub turn: TurnId,
    /// The instant the figures count from.
    pub origin: Instant,
    /// Endpointing delay: end of user speech → user turn committed (`None` if not spoken).
    pub endpointing: Option<Duration>,
    /// Origin → first sign of the response (first token, chunk or tool call).
    pub to_response_start: Option<Duration>,
    /// Origin → first audio chunk delivered (`None` for text-only responses).
    pub to_first_audio: Option<Duration>,
}

/// Everything the machine asks of its host or reports. Drain with
/// [`crate::TurnMachine::poll_output`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Output {
    /// The state changed.
    StateChanged {
        /// Previous state.
        from: State,
        /// New state.
        to: State,
    },
    /// Mandatory VIP event `session.connected`.
    SessionConnected,
    /// Mandatory VIP event `input.detected`: the user took the floor by voice.
    InputDetected,
    /// Mandatory VIP event `action.invoke`: run this tool call.
    ActionInvoke {
        /// The response that called it.
        turn: TurnId,
        /// Correlation id.
        call_id: String,
        /// Tool name.
        name: String,
    },
    /// Mandatory VIP event `action.result`.
    ActionResult {
        /// Correlation id.
        call_id: String,
        /// Whether it succeeded (the model tells the user about failures).
        ok: bool,
    },
    /// Mandatory VIP event `error.fatal`; the session is over.
    ErrorFatal {
        /// Cause.
        reason: String,
    },
    /// A user turn was committed to history.
    UserTurn(UserTurn),
    /// A user turn ended with nothing in it (noise, a cough) and was dropped.
    UserTurnDiscarded,
    /// Ask the model for a response with this turn id.
    StartResponse {
        /// Id to tag every provider event of this response with.
        turn: TurnId,
        /// Why.
        cause: ResponseCause,
        /// Extra instructions from `TriggerInference`.
        instructions: Option<String>,
    },
    /// Synthesize this text verbatim as response `turn` (direct speech).
    Speak {
        /// Id to tag the resulting chunks with.
        turn: TurnId,
        /// Text to speak.
        text: String,
    },
    /// Re-send the unheard rest of `interrupted` as response `turn` (false interruption).
    ResumeResponse {
        /// Id to tag the resulting chunks with.
        turn: TurnId,
        /// The response that was cut off.
        interrupted: TurnId,
        /// What the user did not hear.
        text: String,
    },
    /// The response began (realtime `ResponseBegin`, Xiaozhi `tts start`).
    ResponseBegun {
        /// The response.
        turn: TurnId,
    },
    /// Forward the chunk just fed for `turn` to the client (stale chunks never get this).
    Deliver {
        /// The response.
        turn: TurnId,
        /// 0-based index of the chunk within the response.
        seq: u32,
    },
    /// The generator finished the response (realtime `ResponseEnd`); playback may continue.
    GenerationEnded {
        /// The response.
        turn: TurnId,
    },
    /// Stop generating `turn` (cancel the LLM stream / TTS).
    CancelResponse {
        /// The response to cancel.
        turn: TurnId,
    },
    /// Cancel a pending tool call marked cancel-on-interrupt.
    CancelTool {
        /// Correlation id.
        call_id: String,
    },
    /// Halt playback at once: clear the client's audio buffer (`PlaybackClearBuffer`,
    /// Xiaozhi `tts stop`). No audio of `turn` is delivered after this.
    ClearPlayback {
        /// The response whose audio is being cleared.
        turn: TurnId,
    },
    /// The response is over; the record is what history must hold.
    ResponseEnded(AssistantTurn),
    /// Latency figures of a response (once per response that began).
    Latency(TurnLatency),
}

/// Inputs refused because the peer broke the protocol in this state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InputError {
    /// The input needs an established session (realtime `ERROR_SESSION`).
    #[error("no session is established")]
    NotConnected,
    /// `Connect` or `Connected` arrived out of order.
    #[error("session handshake input out of order in state {0:?}")]
    HandshakeOutOfOrder(State),
    /// A tool result for a call that is not pending.
    #[error("no pending tool call with id {call_id:?}")]
    UnknownToolCall {
        /// The unknown id.
        call_id: String,
    },
    /// Typed text, a trigger or direct speech would wait for the current system turn (or join
    /// the user's turn) beyond [`crate::MAX_QUEUED_INPUTS`]: refused so a client cannot grow
    /// the queue without bound. Nothing was queued.
    #[error("too many inputs waiting for the current turn (at most {limit})")]
    QueueFull {
        /// The bound that was reached.
        limit: usize,
    },
}
