//! A virtual-clock harness for driving a [`TurnMachine`] in tests, here and in crates that
//! build on it.
//!
//! The harness owns the clock: time moves only through [`Harness::advance`], which fires every
//! timer that falls due on the way, in order, at its exact deadline. Every output is logged
//! with its time since the origin.

use std::time::{Duration, Instant};

use crate::{Config, Input, InputError, Output, State, TurnId, TurnMachine};

/// A [`TurnMachine`] on a virtual clock.
#[derive(Debug, Clone)]
pub struct Harness {
    machine: TurnMachine,
    origin: Instant,
    now: Instant,
    log: Vec<(Duration, Output)>,
}

impl Harness {
    /// A machine in NotConnected; `origin` is the virtual time zero (any instant will do).
    #[must_use]
    pub fn new(config: Config, origin: Instant) -> Self {
        Self {
            machine: TurnMachine::new(config),
            origin,
            now: origin,
            log: Vec::new(),
        }
    }

    /// A machine already through Connect and Connected (in Idle), its outputs drained.
    #[must_use]
    pub fn connected(config: Config, origin: Instant) -> Self {
        let mut h = Self::new(config, origin);
        for input in [Input::Connect, Input::Connected] {
            // Both are valid in this order from NotConnected; an error would be a bug here.
            if h.input(input).is_err() {
                debug_assert!(false, "handshake refused");
            }
        }
        h
    }

    /// The machine under test.
    #[must_use]
    pub fn machine(&self) -> &TurnMachine {
        &self.machine
    }

    /// The machine's current state.
    #[must_use]
    pub fn state(&self) -> State {
        self.machine.state()
    }

    /// The virtual now.
    #[must_use]
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Virtual time since the origin.
    #[must_use]
    pub fn elapsed(&self) -> Duration {
        self.now - self.origin
    }

    /// Every output so far, with its virtual time.
    #[must_use]
    pub fn log(&self) -> &[(Duration, Output)] {
        &self.log
    }

    /// Feeds an input at the virtual now and returns the outputs it produced.
    ///
    /// # Errors
    /// Whatever [`TurnMachine::handle_input`] refuses.
    pub fn input(&mut self, input: Input) -> Result<Vec<Output>, InputError> {
        self.machine.handle_input(self.now, input)?;
        Ok(self.drain())
    }

    /// Moves the clock forward by `by`, firing due timers in order; returns their outputs.
    pub fn advance(&mut self, by: Duration) -> Vec<Output> {
        let target = self.now + by;
        let mut out = Vec::new();
        // Bounded so a machine that keeps re-arming a past deadline fails loudly in tests
        // instead of hanging them.
        for _ in 0..10_000 {
            match self.machine.poll_timeout() {
                Some(deadline) if deadline <= target => {
                    self.now = self.now.max(deadline);
                    self.machine.handle_timeout(self.now);
                    out.extend(self.drain());
                }
                _ => {
                    self.now = target;
                    return out;
                }
            }
        }
        debug_assert!(
            false,
            "timer storm: poll_timeout keeps returning past deadlines"
        );
        self.now = target;
        out
    }

    /// Advances to the next deadline (if any) and fires it; returns its outputs.
    pub fn fire_next_timeout(&mut self) -> Vec<Output> {
        match self.machine.poll_timeout() {
            Some(deadline) => {
                let by = deadline.saturating_duration_since(self.now);
                self.advance(by)
            }
            None => Vec::new(),
        }
    }

    /// The turn of the most recent [`Output::StartResponse`], [`Output::Speak`] or
    /// [`Output::ResumeResponse`] — the id the provider events must carry.
    #[must_use]
    pub fn last_response_turn(&self) -> Option<TurnId> {
        self.log.iter().rev().find_map(|(_, o)| match o {
            Output::StartResponse { turn, .. }
            | Output::Speak { turn, .. }
            | Output::ResumeResponse { turn, .. } => Some(*turn),
            _ => None,
        })
    }

    fn drain(&mut self) -> Vec<Output> {
        let at = self.elapsed();
        let out: Vec<Output> = std::iter::from_fn(|| self.machine.poll_output()).collect();
        self.log.extend(out.iter().cloned().map(|o| (at, o)));
        out
    }
}
