//! VIP's state machine (§5.2), as the server runs it and reports it with `state` messages.
//!
//! The transition table is on [`VipMachine`].

use serde::{Deserialize, Serialize};

use crate::message::ServerMessage;

/// The session states of VIP §5.2.1 once connected (`Not Connected` and `Connecting` are the
/// client's own, before `session.connected`). The set is normative, so a state this crate
/// does not know is an error rather than data: a new one would be a new protocol version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum VipState {
    /// Waiting for the user.
    #[default]
    Idle,
    /// The user is speaking.
    Listening,
    /// The runtime is working on the user's turn (ASR, LLM).
    Processing,
    /// The client is running an action for the runtime.
    Action,
    /// The reply is playing.
    Speaking,
}

impl VipState {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            VipState::Idle => "idle",
            VipState::Listening => "listening",
            VipState::Processing => "processing",
            VipState::Action => "action",
            VipState::Speaking => "speaking",
        }
    }

    /// Reads a wire name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "idle" => VipState::Idle,
            "listening" => VipState::Listening,
            "processing" => VipState::Processing,
            "action" => VipState::Action,
            "speaking" => VipState::Speaking,
            _ => return None,
        })
    }

    /// The system holds the floor (a speech start here is a barge-in).
    pub fn is_system_turn(self) -> bool {
        matches!(
            self,
            VipState::Processing | VipState::Action | VipState::Speaking
        )
    }
}

impl std::fmt::Display for VipState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What happened, as the door learns it from the VAD, the client and the engine. Turns are the
/// engine's turn numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum VipInput {
    /// Speech started: the server's VAD, or the client's `input.detected`. A barge-in when the
    /// system holds the floor.
    SpeechStarted,
    /// The speech that started was not a turn after all (noise, too short).
    SpeechDiscarded,
    /// The turn machine ended the user's spoken turn.
    EndOfSpeech {
        /// The new turn.
        turn: u64,
    },
    /// The engine took an `input.text` as a turn (interrupting any reply in progress).
    TextInput {
        /// The new turn.
        turn: u64,
    },
    /// The reply's first audio (or, for a text-only reply, its first text) went out.
    ReplyStarted {
        /// The turn replied to.
        turn: u64,
    },
    /// An `action.invoke` went out.
    ActionInvoked {
        /// The turn that asked for it.
        turn: u64,
    },
    /// An invocation ended: its `action.result` came, or it was cancelled.
    ActionSettled {
        /// The turn that asked for it.
        turn: u64,
    },
    /// The reply finished playing.
    PlaybackFinished {
        /// The turn replied to.
        turn: u64,
    },
    /// The turn ended without (more) audio: nothing to say, or the engine gave up on it.
    TurnEnded {
        /// The turn.
        turn: u64,
    },
}

/// One transition; send it as [`StateChange::message`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateChange {
    /// The state before.
    pub from: VipState,
    /// The state now.
    pub to: VipState,
    /// The turn the new state belongs to; `None` in idle and listening (a spoken turn gets its
    /// number when it ends).
    pub turn: Option<u64>,
}

impl StateChange {
    /// The `state` message reporting this change.
    pub fn message(&self) -> ServerMessage {
        ServerMessage::State {
            state: self.to,
            previous: self.from,
            turn: self.turn,
        }
    }
}

/// The server's VIP state machine for one session. Starts `idle` (the state
/// `session.connected` implies).
///
/// Sans-IO and clock-free: the door feeds it what the engine and the VAD did
/// ([`VipInput`]) and sends a `state` message for every [`StateChange`] it returns. It has no
/// timers, so it has only [`VipMachine::handle_input`] (no `handle_timeout`/`poll_timeout`),
/// and since one input makes at most one transition the change is returned directly instead of
/// queued for `poll_output`.
///
/// | from | input | to |
/// |---|---|---|
/// | idle | [`SpeechStarted`](VipInput::SpeechStarted) | listening |
/// | listening | [`SpeechDiscarded`](VipInput::SpeechDiscarded) | idle |
/// | listening | [`EndOfSpeech`](VipInput::EndOfSpeech) | processing |
/// | any, for a new turn | [`TextInput`](VipInput::TextInput) | processing |
/// | processing | [`ReplyStarted`](VipInput::ReplyStarted) | speaking |
/// | processing | [`ActionInvoked`](VipInput::ActionInvoked) | action |
/// | action | [`ActionSettled`](VipInput::ActionSettled) (the last one out) | processing |
/// | processing / action | [`TurnEnded`](VipInput::TurnEnded) | idle |
/// | speaking | [`PlaybackFinished`](VipInput::PlaybackFinished) | idle |
/// | speaking / processing / action | [`SpeechStarted`](VipInput::SpeechStarted) (barge-in) | listening |
///
/// Every other pair, and an input naming another turn than the current one (a late event of a
/// turn that was cut off), changes nothing and returns `None`: the events arrive from several
/// sources and a stale one must not move the state.
///
/// ```
/// use voxgate_vip::{VipInput, VipMachine, VipState};
///
/// let mut machine = VipMachine::new();
/// let mut sent = Vec::new();
/// for input in [
///     VipInput::SpeechStarted,
///     VipInput::EndOfSpeech { turn: 1 },
///     VipInput::ReplyStarted { turn: 1 },
///     VipInput::SpeechStarted, // barge-in
///     VipInput::PlaybackFinished { turn: 1 }, // late: turn 1 was cut off
/// ] {
///     if let Some(change) = machine.handle_input(input) {
///         sent.push(change.message().encode());
///     }
/// }
/// assert_eq!(machine.state(), VipState::Listening);
/// assert_eq!(
///     sent.last().map(String::as_str),
///     Some(r#"{"type":"state","state":"listening","previous":"speaking","turn":null}"#)
/// );
/// assert_eq!(sent.len(), 4);
/// ```
#[derive(Debug, Clone, Default)]
pub struct VipMachine {
    state: VipState,
    turn: Option<u64>,
    pending_actions: u32,
}

impl VipMachine {
    /// A machine in `idle`.
    pub fn new() -> Self {
        VipMachine::default()
    }

    /// The current state.
    pub fn state(&self) -> VipState {
        self.state
    }

    /// The current turn (`None` in idle and listening).
    pub fn turn(&self) -> Option<u64> {
        self.turn
    }

    /// Invocations of the current turn not settled yet.
    pub fn pending_actions(&self) -> u32 {
        self.pending_actions
    }

    /// Applies one input; returns the transition it made, or `None` when it changes nothing
    /// (see the module's table).
    pub fn handle_input(&mut self, input: VipInput) -> Option<StateChange> {
        use VipState::{Action, Idle, Listening, Processing, Speaking};
        let now_turn = self.turn;
        let current = move |turn: u64| now_turn == Some(turn);
        let (to, turn) = match (self.state, input) {
            (Idle, VipInput::SpeechStarted) => (Listening, None),
            (s, VipInput::SpeechStarted) if s.is_system_turn() => (Listening, None),
            (Listening, VipInput::SpeechDiscarded) => (Idle, None),
            (Listening, VipInput::EndOfSpeech { turn }) => (Processing, Some(turn)),
            (_, VipInput::TextInput { turn }) if !current(turn) => (Processing, Some(turn)),
            (Processing, VipInput::ReplyStarted { turn }) if current(turn) => {
                (Speaking, Some(turn))
            }
            (Processing | Action, VipInput::ActionInvoked { turn }) if current(turn) => {
                self.pending_actions = self.pending_actions.saturating_add(1);
                if self.state == Action {
                    return None;
                }
                (Action, Some(turn))
            }
            (Action, VipInput::ActionSettled { turn }) if current(turn) => {
                self.pending_actions = self.pending_actions.saturating_sub(1);
                if self.pending_actions > 0 {
                    return None;
                }
                (Processing, Some(turn))
            }
            (Processing | Action, VipInput::TurnEnded { turn }) if current(turn) => (Idle, None),
            (Speaking, VipInput::PlaybackFinished { turn }) if current(turn) => (Idle, None),
            _ => return None,
        };
        let from = self.state;
        // Invocations are outstanding only in `action`: leaving it any other way than by the
        // last settlement (a new turn, a barge-in, the turn's end) abandons them.
        if to != Action {
            self.pending_actions = 0;
        }
        self.state = to;
        self.turn = turn;
        Some(StateChange { from, to, turn })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use VipInput::*;
    use VipState::{Action, Idle, Listening, Processing, Speaking};

    /// A machine driven to `state` in turn 7 (listening and idle have no turn).
    fn at(state: VipState) -> VipMachine {
        let mut m = VipMachine::new();
        let path: &[VipInput] = match state {
            Idle => &[],
            Listening => &[SpeechStarted],
            Processing => &[SpeechStarted, EndOfSpeech { turn: 7 }],
            Action => &[
                SpeechStarted,
                EndOfSpeech { turn: 7 },
                ActionInvoked { turn: 7 },
            ],
            Speaking => &[
                SpeechStarted,
                EndOfSpeech { turn: 7 },
                ReplyStarted { turn: 7 },
            ],
        };
        for &i in path {
            assert!(m.handle_input(i).is_some(), "{i:?} from {:?}", m.state());
        }
        assert_eq!(m.state(), state);
        m
    }

    fn step(from: VipState, input: VipInput) -> Option<StateChange> {
        at(from).handle_input(input)
    }

    fn change(from: VipState, to: VipState, turn: Option<u64>) -> Option<StateChange> {
        Some(StateChange { from, to, turn })
    }

    const ALL: [VipState; 5] = [Idle, Listening, Processing, Action, Speaking];

    #[test]
    fn idle_speech_start_listens() {
        assert_eq!(step(Idle, SpeechStarted), change(Idle, Listening, None));
    }

    #[test]
    fn listening_end_of_speech_processes_the_new_turn() {
        assert_eq!(
            step(Listening, EndOfSpeech { turn: 8 }),
            change(Listening, Processing, Some(8))
        );
    }

    #[test]
    fn listening_discarded_speech_goes_back_to_idle() {
        assert_eq!(
            step(Listening, SpeechDiscarded),
            change(Listening, Idle, None)
        );
    }

    #[test]
    fn idle_text_input_processes() {
        assert_eq!(
            step(Idle, TextInput { turn: 8 }),
            change(Idle, Processing, Some(8))
        );
    }

    #[test]
    fn text_input_starts_a_new_turn_from_any_state_but_its_own() {
        for s in ALL {
            assert_eq!(
                step(s, TextInput { turn: 8 }),
                change(s, Processing, Some(8)),
                "{s}"
            );
        }
        for s in [Processing, Action, Speaking] {
            assert_eq!(step(s, TextInput { turn: 7 }), None, "{s}");
        }
    }

    #[test]
    fn processing_reply_started_speaks() {
        assert_eq!(
            step(Processing, ReplyStarted { turn: 7 }),
            change(Processing, Speaking, Some(7))
        );
    }

    #[test]
    fn processing_action_invoked_acts() {
        let mut m = at(Processing);
        assert_eq!(
            m.handle_input(ActionInvoked { turn: 7 }),
            change(Processing, Action, Some(7))
        );
        assert_eq!(m.pending_actions(), 1);
    }

    #[test]
    fn action_settled_goes_back_to_processing_when_the_last_one_settles() {
        let mut m = at(Action);
        assert_eq!(m.handle_input(ActionInvoked { turn: 7 }), None);
        assert_eq!(m.pending_actions(), 2);
        assert_eq!(m.handle_input(ActionSettled { turn: 7 }), None);
        assert_eq!(
            m.handle_input(ActionSettled { turn: 7 }),
            change(Action, Processing, Some(7))
        );
        assert_eq!(m.pending_actions(), 0);
        // And on to a reply, and a second action in the same turn.
        assert!(m.handle_input(ActionInvoked { turn: 7 }).is_some());
        assert!(m.handle_input(ActionSettled { turn: 7 }).is_some());
        assert_eq!(
            m.handle_input(ReplyStarted { turn: 7 }),
            change(Processing, Speaking, Some(7))
        );
    }

    #[test]
    fn a_typed_turn_abandons_outstanding_actions() {
        let mut m = at(Action);
        assert_eq!(
            m.handle_input(TextInput { turn: 8 }),
            change(Action, Processing, Some(8))
        );
        assert_eq!(m.pending_actions(), 0);
        assert_eq!(m.handle_input(ActionSettled { turn: 7 }), None);
    }

    #[test]
    fn processing_or_action_turn_ended_idles() {
        for s in [Processing, Action] {
            assert_eq!(step(s, TurnEnded { turn: 7 }), change(s, Idle, None), "{s}");
        }
    }

    #[test]
    fn speaking_playback_finished_idles() {
        assert_eq!(
            step(Speaking, PlaybackFinished { turn: 7 }),
            change(Speaking, Idle, None)
        );
    }

    #[test]
    fn barge_in_from_every_system_state_listens_and_drops_the_turn() {
        for s in [Speaking, Processing, Action] {
            let mut m = at(s);
            assert_eq!(
                m.handle_input(SpeechStarted),
                change(s, Listening, None),
                "{s}"
            );
            assert_eq!(m.turn(), None);
            assert_eq!(m.pending_actions(), 0);
            // The cut-off turn's late events move nothing.
            for late in [
                ReplyStarted { turn: 7 },
                ActionSettled { turn: 7 },
                PlaybackFinished { turn: 7 },
                TurnEnded { turn: 7 },
            ] {
                assert_eq!(
                    m.handle_input(late),
                    None,
                    "{late:?} after barge-in from {s}"
                );
            }
            assert_eq!(
                m.handle_input(EndOfSpeech { turn: 8 }),
                change(Listening, Processing, Some(8))
            );
        }
    }

    #[test]
    fn everything_else_is_a_no_op() {
        let moves = |s: VipState, i: VipInput| {
            matches!(
                (s, i),
                (Idle | Processing | Action | Speaking, SpeechStarted)
                    | (Listening, SpeechDiscarded | EndOfSpeech { .. })
                    | (_, TextInput { .. })
                    | (
                        Processing,
                        ReplyStarted { .. } | ActionInvoked { .. } | TurnEnded { .. }
                    )
                    | (
                        Action,
                        ActionSettled { .. } | TurnEnded { .. } | ActionInvoked { .. }
                    )
                    | (Speaking, PlaybackFinished { .. })
            )
        };
        let inputs = [
            SpeechStarted,
            SpeechDiscarded,
            EndOfSpeech { turn: 7 },
            TextInput { turn: 8 },
            ReplyStarted { turn: 7 },
            ActionInvoked { turn: 7 },
            ActionSettled { turn: 7 },
            PlaybackFinished { turn: 7 },
            TurnEnded { turn: 7 },
        ];
        for s in ALL {
            for i in inputs {
                let mut m = at(s);
                let before = (m.state(), m.turn(), m.pending_actions());
                let out = m.handle_input(i);
                if !moves(s, i) {
                    assert_eq!(out, None, "{i:?} from {s}");
                    assert_eq!((m.state(), m.turn(), m.pending_actions()), before);
                }
            }
        }
    }

    #[test]
    fn events_of_another_turn_are_ignored() {
        assert_eq!(step(Processing, ReplyStarted { turn: 6 }), None);
        assert_eq!(step(Processing, ActionInvoked { turn: 6 }), None);
        assert_eq!(step(Action, ActionSettled { turn: 6 }), None);
        assert_eq!(step(Speaking, PlaybackFinished { turn: 6 }), None);
        assert_eq!(step(Processing, TurnEnded { turn: 6 }), None);
    }

    #[test]
    fn change_reports_as_a_state_message() {
        let c = StateChange {
            from: Processing,
            to: Speaking,
            turn: Some(3),
        };
        assert_eq!(
            c.message().encode(),
            r#"{"type":"state","state":"speaking","previous":"processing","turn":3}"#
        );
    }

    #[test]
    fn names_round_trip() {
        for s in ALL {
            assert_eq!(VipState::parse(s.as_str()), Some(s));
        }
        assert_eq!(VipState::parse("connecting"), None);
    }

    fn input() -> impl proptest::strategy::Strategy<Value = VipInput> {
        use proptest::prelude::*;
        (0u8..9, 0u64..4).prop_map(|(k, turn)| match k {
            0 => SpeechStarted,
            1 => SpeechDiscarded,
            2 => EndOfSpeech { turn },
            3 => TextInput { turn },
            4 => ReplyStarted { turn },
            5 => ActionInvoked { turn },
            6 => ActionSettled { turn },
            7 => PlaybackFinished { turn },
            _ => TurnEnded { turn },
        })
    }

    proptest::proptest! {
        /// Any sequence: changes describe the machine, a turn exactly in the system states,
        /// outstanding actions exactly in `action`.
        #[test]
        fn invariants_hold(inputs in proptest::collection::vec(input(), 0..64)) {
            let mut m = VipMachine::new();
            for i in inputs {
                let before = (m.state(), m.turn());
                match m.handle_input(i) {
                    Some(c) => {
                        proptest::prop_assert_eq!((c.from, c.to, c.turn), (before.0, m.state(), m.turn()));
                        proptest::prop_assert!(c.from != c.to || c.turn != before.1);
                    }
                    None => proptest::prop_assert_eq!((m.state(), m.turn()), before),
                }
                proptest::prop_assert_eq!(m.turn().is_some(), m.state().is_system_turn());
                proptest::prop_assert_eq!(m.pending_actions() > 0, m.state() == Action);
            }
        }
    }
}
