//! What happened in each turn, for the host's metrics, traces and timelines.
//!
//! The engine records a [`TurnEvent`] at each point of a turn an operator asks about (state
//! changes, committed user turns, the turn machine's latency figures, interruptions, tool call
//! round trips, response ends) in a bounded queue the host drains with
//! [`crate::Engine::take_telemetry`]. Recording is observational only: nothing in the engine
//! reads the queue, so draining it (or never draining it) changes no behaviour. A host that
//! never drains it pays for at most [`MAX_TELEMETRY_EVENTS`] small events; beyond that the
//! oldest are dropped and counted ([`crate::Engine::telemetry_dropped`]).
//!
//! # Order and pairing
//! Events come in the order they happened, each stamped with the `now` of the call that
//! observed it. What a consumer may rely on:
//! - [`TurnEvent::Latency`] comes once per response that began (said or showed something,
//!   or called a tool), at its first audio chunk when it has audio, else when it ends; always
//!   before that response's [`TurnEvent::ResponseEnded`].
//! - [`TurnEvent::ResponseEnded`] comes once per response that began, including responses
//!   cut off by the end of the session (`interrupted: true`, without an
//!   [`TurnEvent::Interrupted`]). A response cut off before it began gets an `Interrupted`
//!   but no `ResponseEnded` and no `Latency`.
//! - Responses need not follow a [`TurnEvent::UserTurn`]: triggered replies
//!   (`TriggerInference`, greetings), direct speech, the follow-up reply after tool results
//!   and the resumed rest of a falsely interrupted reply have none.
//! - Typed text with `NoTrigger`, and spoken turns in `NoTrigger` mode, give a `UserTurn` with
//!   no response after it.
//! - [`TurnEvent::FalseInterruption`] names the response that was cut off (the `turn` of the
//!   earlier `Interrupted`); the resumed rest is a new response with its own id, whose
//!   `Latency` and `ResponseEnded` follow.
//! - [`TurnEvent::ToolCall`] may come after its response ended: a tool's result survives a
//!   barge-in, and the follow-up reply waits for it.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::types::TurnId;

/// Most events kept for the host (see [`crate::Engine::take_telemetry`]): a turn makes about
/// ten, so a host draining after every step never comes near it; one that never drains holds
/// at most this many.
pub const MAX_TELEMETRY_EVENTS: usize = 256;

/// What happened in a turn, for the host's metrics, traces and timelines. Observational only:
/// draining it (or not) never changes the engine's behaviour.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum TurnEvent {
    /// The turn machine's state changed. The changes while the engine is created (to
    /// `Idle`) are not reported; closing the session reports the change to `NotConnected`.
    State {
        /// The new state.
        to: voxgate_turn::State,
        /// When.
        at: Instant,
    },
    /// A user turn was committed (spoken: after recognition; typed: at once).
    UserTurn {
        /// The user turn's id (from the same counter as responses').
        turn: TurnId,
        /// Spoken (else typed).
        speech: bool,
        /// When it was committed.
        at: Instant,
    },
    /// The turn machine's latency figures for a response (once per begun response). For a
    /// turn whose speech the VAD ended, they count from the last voiced audio (`origin`, in
    /// audio time mapped to the wall clock), what the user experiences as stopping: the turn
    /// machine counts from the VAD's decision, its `vad_stop_ms` of silence later.
    Latency(voxgate_turn::TurnLatency),
    /// The user interrupted the reply. `barge_in`: for speech, the time from the speech onset
    /// (the first voiced audio, in audio time mapped to the wall clock) to the moment the
    /// engine told the client to clear playback ([`crate::ClientEvent::ClearPlayback`]);
    /// `None` when not spoken or playback was not cleared.
    ///
    /// Every interruption but the end of the session: speech, transcript words, a client
    /// abort, a push-to-talk press, `Immediate` text and direct speech that preempts.
    Interrupted {
        /// The response cut off.
        turn: TurnId,
        /// Speech onset → playback cleared.
        barge_in: Option<Duration>,
        /// When.
        at: Instant,
    },
    /// An interruption proved false (the user did not go on) and the reply resumed.
    FalseInterruption {
        /// The response that had been cut off (the resumed rest gets a new id).
        turn: TurnId,
        /// When the reply resumed.
        at: Instant,
    },
    /// A tool call ended (result, error, cancel or timeout): its round trip from the request.
    /// Calls refused before they ran (an unknown tool, arguments that break its schema, an
    /// action the client did not declare, a device that is not connected) are not reported:
    /// they have no round trip.
    ToolCall {
        /// The response that called it.
        turn: TurnId,
        /// Who ran it.
        kind: ToolKind,
        /// The tool's own name (as its source knows it, not the model-facing one).
        name: String,
        /// From the model's call (when the engine sent it out) to its end.
        elapsed: Duration,
        /// How it ended.
        outcome: ToolOutcome,
        /// When it ended.
        at: Instant,
    },
    /// A response ended.
    ResponseEnded {
        /// The response.
        turn: TurnId,
        /// Cut off (by the user, or by the end of the session).
        interrupted: bool,
        /// When.
        at: Instant,
    },
}

/// Who ran a tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ToolKind {
    /// The session's client (realtime `ToolCallRequest`, Gemini).
    Client,
    /// Server-side: MCP hub / server tools run by the host via
    /// [`crate::ProviderRequest::CallTool`].
    Mcp,
    /// The Xiaozhi device's MCP tools.
    Device,
    /// A VIP action (`action.invoke`).
    Action,
}

/// How a tool call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ToolOutcome {
    /// It answered with a result.
    Ok,
    /// It answered with an error, or the host could not run it.
    Error,
    /// The engine gave up on it: its reply was cut off, or the session closed.
    Cancelled,
    /// No answer within the runner's deadline (device MCP calls and actions; server-side
    /// calls time out in the host, which reports a failure: [`ToolOutcome::Error`]).
    Timeout,
}

impl ToolKind {
    /// Stable lowercase name, for metric labels.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Client => "client",
            Self::Mcp => "mcp",
            Self::Device => "device",
            Self::Action => "action",
        }
    }
}

impl ToolOutcome {
    /// Stable lowercase name, for metric labels.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Error => "error",
            Self::Cancelled => "cancelled",
            Self::Timeout => "timeout",
        }
    }
}

/// The speech that may barge into the reply: where it began on the wall clock, and the turn
/// machine's count of rejected interruptions when it did (a change means the machine dropped
/// that candidate, so the next speech starts a new one).
#[derive(Debug, Clone, Copy)]
struct Onset {
    at: Instant,
    rejected: u64,
}

/// The queue and what the engine remembers to derive events from the turn machine's outputs.
#[derive(Debug, Default)]
pub(crate) struct Telemetry {
    events: VecDeque<TurnEvent>,
    dropped: u64,
    /// The latest response that began: one cancelled before it began has no `ResponseEnded`.
    begun: Option<TurnId>,
    /// The latest `ClearPlayback`: the response and when.
    cleared: Option<(TurnId, Instant)>,
    /// Onset of the speech the turn machine holds as a possible barge-in.
    onset: Option<Onset>,
    /// The session is closing: its cut-offs are not the user's interruptions.
    closing: bool,
    /// The last voiced audio of the speech the VAD last ended (wall clock), until the user
    /// speaks again or the utterance is committed or discarded.
    voiced_end: Option<Instant>,
    /// The committed spoken user turn's last voiced audio, for its response's figures.
    turn_voiced_end: Option<Instant>,
}

impl Telemetry {
    pub(crate) fn push(&mut self, event: TurnEvent) {
        if self.events.len() >= MAX_TELEMETRY_EVENTS {
            self.events.pop_front();
            self.dropped += 1;
        }
        self.events.push_back(event);
    }

    pub(crate) fn drain(&mut self) -> std::collections::vec_deque::Drain<'_, TurnEvent> {
        self.events.drain(..)
    }

    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }

    pub(crate) fn closing(&mut self) {
        self.closing = true;
    }

    /// The VAD declared speech while the system holds the floor, its first voiced audio at
    /// `at`: the start of a barge-in candidate unless the machine still holds an earlier one
    /// (speech resuming within a candidate keeps its start, as in the turn machine).
    pub(crate) fn speech_started(&mut self, at: Instant, rejected: u64) {
        if self.onset.is_none_or(|o| o.rejected != rejected) {
            self.onset = Some(Onset { at, rejected });
        }
    }

    /// The VAD ended the user's speech; its last voiced audio was at `voiced`.
    pub(crate) fn speech_ended(&mut self, voiced: Instant) {
        self.voiced_end = Some(voiced);
    }

    /// The user speaks again (or the utterance was discarded): the end recorded is not the
    /// turn's.
    pub(crate) fn speech_resumed(&mut self) {
        self.voiced_end = None;
    }

    /// A user turn was committed: a spoken one ended where its speech last ended.
    pub(crate) fn user_turn(&mut self, speech: bool) {
        if speech {
            self.turn_voiced_end = self.voiced_end.take();
        }
    }

    /// The turn machine's figures for a response, counted from the last voiced audio when
    /// they answer speech the VAD ended (see [`TurnEvent::Latency`]).
    pub(crate) fn latency(&mut self, mut l: voxgate_turn::TurnLatency) {
        if l.endpointing.is_some()
            && let Some(voiced) = self.turn_voiced_end.take()
            && voiced <= l.origin
        {
            let lag = l.origin - voiced;
            l.origin = voiced;
            l.endpointing = l.endpointing.map(|d| d + lag);
            l.to_response_start = l.to_response_start.map(|d| d + lag);
            l.to_first_audio = l.to_first_audio.map(|d| d + lag);
        }
        self.push(TurnEvent::Latency(l));
    }

    /// The floor left the system (the candidate became the user's turn, or was dropped with
    /// the system turn).
    pub(crate) fn floor_left_system(&mut self) {
        self.onset = None;
    }

    pub(crate) fn begun(&mut self, turn: TurnId) {
        self.begun = Some(turn);
    }

    pub(crate) fn cleared(&mut self, turn: TurnId, now: Instant) {
        self.cleared = Some((turn, now));
    }

    /// The turn machine cancelled `turn`'s generation (it only does on an interruption): a
    /// response that had not begun ends here, unseen.
    pub(crate) fn cancelled(&mut self, turn: TurnId, now: Instant) {
        if self.begun == Some(turn) {
            // It ends with `ResponseEnded`, which reports the interruption.
            return;
        }
        // Every interruption takes the turn machine's barge-in candidate with it (it becomes
        // the user's turn or history), even when the next response follows at once.
        self.onset = None;
        if !self.closing {
            self.push(TurnEvent::Interrupted {
                turn,
                barge_in: None,
                at: now,
            });
        }
    }

    /// A begun response ended; `by` is what interrupted it, if anything.
    pub(crate) fn response_ended(
        &mut self,
        turn: TurnId,
        by: Option<voxgate_turn::Interruption>,
        now: Instant,
    ) {
        use voxgate_turn::Interruption;
        let onset = if by.is_some() {
            // See `cancelled`: the candidate is gone with the interruption.
            self.onset.take()
        } else {
            self.onset
        };
        if let Some(by) = by
            && by != Interruption::Disconnect
            && !self.closing
        {
            let barge_in = match (by, self.cleared, onset) {
                (Interruption::Speech, Some((cleared, at)), Some(onset)) if cleared == turn => {
                    Some(at.saturating_duration_since(onset.at))
                }
                _ => None,
            };
            self.push(TurnEvent::Interrupted {
                turn,
                barge_in,
                at: now,
            });
        }
        self.push(TurnEvent::ResponseEnded {
            turn,
            interrupted: by.is_some(),
            at: now,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_keeps_the_newest_and_counts_the_dropped() {
        let mut t = Telemetry::default();
        let now = Instant::now();
        for n in 0..MAX_TELEMETRY_EVENTS + 10 {
            t.push(TurnEvent::UserTurn {
                turn: TurnId(u32::try_from(n).unwrap_or(u32::MAX)),
                speech: false,
                at: now,
            });
        }
        assert_eq!(t.dropped(), 10);
        let kept: Vec<TurnEvent> = t.drain().collect();
        assert_eq!(kept.len(), MAX_TELEMETRY_EVENTS);
        assert!(matches!(
            kept[0],
            TurnEvent::UserTurn {
                turn: TurnId(10),
                ..
            }
        ));
        assert_eq!(t.drain().count(), 0);
    }
}
