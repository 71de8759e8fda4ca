//! The device's speaker as the Xiaozhi protocol sees it: `tts start` / `tts stop` and the
//! half-duplex gate on uplink audio.
//!
//! A device shows "speaking" from `tts start` to `tts stop` and, unless it listens in
//! `realtime` mode, sends no audio in between (it would hear itself). So:
//!
//! - a response's start is announced once, however many responses follow back to back;
//! - a finished response is stopped only after its paced audio has played out on the device;
//! - a cut-off response (barge-in, abort, manual listen) is stopped at once, and audio still
//!   arriving for it is dropped until the next response begins;
//! - every `abort` is answered with exactly one `tts stop`, whether the engine was speaking
//!   (its clear already stopped) or not (the device waits for the stop either way).
//!
//! [`Speech`] makes these decisions from events and time values; the door sends the frames.

use std::time::{Duration, Instant};

use voxgate_xiaozhi::control::ListenMode;

/// Longest wait for a finished reply's audio to play out before `tts stop` goes anyway.
const MAX_PLAYOUT_WAIT: Duration = Duration::from_secs(60);

/// The `tts` state of one device session.
#[derive(Debug, Default)]
pub(super) struct Speech {
    /// The device listens while it speaks (`realtime` mode: it cancels its own echo).
    full_duplex: bool,
    /// `tts start` was sent and `tts stop` not yet.
    speaking: bool,
    /// The response finished; `tts stop` goes out once the paced audio has played.
    stop_pending: bool,
    /// When the pending stop is due, once the reply's last frame has been released.
    stop_at: Option<Instant>,
    /// Audio of a cleared response is dropped until the next response begins.
    muted: bool,
    /// `tts stop` messages decided so far, so an abort answered by the engine's own clear is
    /// not answered twice.
    stops: u64,
}

/// Where an abort started: [`Speech::aborted`] answers it unless a stop went out since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct AbortMark(u64);

impl Speech {
    /// A silent device in `auto` mode.
    pub(super) fn new() -> Self {
        Self::default()
    }

    /// `listen start` with `mode`.
    pub(super) fn listen(&mut self, mode: &ListenMode) {
        self.full_duplex = *mode == ListenMode::Realtime;
    }

    /// Whether uplink audio is heard now (half duplex: not while the device speaks).
    pub(super) fn hears_uplink(&self) -> bool {
        !self.speaking || self.full_duplex
    }

    /// Between `tts start` and `tts stop`.
    pub(super) fn speaking(&self) -> bool {
        self.speaking
    }

    /// Whether reply text and audio are dropped (the response was cleared).
    pub(super) fn muted(&self) -> bool {
        self.muted
    }

    /// A response begins. `true`: send `tts start`; playback starts afresh and, in half
    /// duplex, the uplink stream ends (the next utterance starts a new one).
    pub(super) fn begin(&mut self) -> bool {
        self.muted = false;
        self.stop_pending = false;
        self.stop_at = None;
        if self.speaking {
            return false;
        }
        self.speaking = true;
        true
    }

    /// The response is over. `true`: it was cut off, send `tts stop` now and drop its audio;
    /// otherwise the stop waits for playback ([`played`](Self::played)).
    pub(super) fn finished(&mut self, interrupted: bool) -> bool {
        if !self.speaking {
            return false;
        }
        if interrupted {
            self.stop_now();
            return true;
        }
        self.stop_pending = true;
        false
    }

    /// The engine cleared playback (barge-in, abort). `true`: send `tts stop` now. Either way
    /// queued audio is dropped and late audio of this response ignored.
    pub(super) fn clear(&mut self) -> bool {
        self.muted = true;
        if !self.speaking {
            return false;
        }
        self.stop_now();
        true
    }

    /// The paced audio's state after a release: `queued` frames still waiting, the last one
    /// released plays out at `drained_at`. `true`: the finished reply has played out, send
    /// `tts stop` now.
    pub(super) fn played(
        &mut self,
        now: Instant,
        queued: usize,
        drained_at: Option<Instant>,
    ) -> bool {
        if !self.stop_pending || queued > 0 {
            self.stop_at = None;
            return false;
        }
        let due = *self
            .stop_at
            .get_or_insert_with(|| drained_at.unwrap_or(now).min(now + MAX_PLAYOUT_WAIT));
        if due > now {
            return false;
        }
        self.stop_now();
        true
    }

    /// When [`played`](Self::played) will say stop, if nothing else happens first.
    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        self.stop_at
    }

    /// An abort arrives; feed it to the engine and its outputs to this machine, then call
    /// [`aborted`](Self::aborted) with the mark.
    pub(super) fn abort(&self) -> AbortMark {
        AbortMark(self.stops)
    }

    /// The abort's outputs are handled. `true`: no `tts stop` answered it yet, send one now.
    /// The device is silent afterwards either way.
    pub(super) fn aborted(&mut self, mark: AbortMark) -> bool {
        let answered = self.stops != mark.0;
        self.speaking = false;
        self.stop_pending = false;
        self.stop_at = None;
        if answered {
            return false;
        }
        self.stops += 1;
        true
    }

    fn stop_now(&mut self) {
        self.speaking = false;
        self.stop_pending = false;
        self.stop_at = None;
        self.stops += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn start_once_and_stop_after_playout() {
        let t0 = Instant::now();
        let mut s = Speech::new();
        assert!(s.hears_uplink());
        assert!(s.begin(), "tts start");
        assert!(s.speaking());
        assert!(!s.hears_uplink(), "half duplex while speaking");
        // A second response back to back: no second start.
        assert!(!s.begin());
        // Frames still queued: nothing is due.
        assert!(!s.played(t0, 3, Some(t0 + 300 * MS)));
        assert!(!s.finished(false), "a finished reply waits for playout");
        assert!(!s.played(t0, 3, Some(t0 + 300 * MS)));
        assert_eq!(s.poll_timeout(), None);
        // The last frame is released at 100 ms and plays until 400 ms.
        let t1 = t0 + 100 * MS;
        assert!(!s.played(t1, 0, Some(t0 + 400 * MS)));
        assert_eq!(s.poll_timeout(), Some(t0 + 400 * MS));
        assert!(!s.played(t0 + 399 * MS, 0, Some(t0 + 400 * MS)));
        assert!(s.played(t0 + 400 * MS, 0, Some(t0 + 400 * MS)), "tts stop");
        assert!(!s.speaking());
        assert!(s.hears_uplink());
        assert_eq!(s.poll_timeout(), None);
        // Said once.
        assert!(!s.played(t0 + 500 * MS, 0, Some(t0 + 400 * MS)));
    }

    #[test]
    fn a_reply_without_audio_stops_at_once() {
        let t0 = Instant::now();
        let mut s = Speech::new();
        assert!(s.begin());
        assert!(!s.finished(false));
        assert!(s.played(t0, 0, None));
    }

    #[test]
    fn playout_wait_is_bounded() {
        let t0 = Instant::now();
        let mut s = Speech::new();
        s.begin();
        s.finished(false);
        let far = t0 + Duration::from_secs(3600);
        assert!(!s.played(t0, 0, Some(far)));
        assert_eq!(s.poll_timeout(), Some(t0 + MAX_PLAYOUT_WAIT));
        // The deadline does not move with time.
        assert!(!s.played(t0 + Duration::from_secs(30), 0, Some(far)));
        assert_eq!(s.poll_timeout(), Some(t0 + MAX_PLAYOUT_WAIT));
        assert!(s.played(t0 + MAX_PLAYOUT_WAIT, 0, Some(far)));
    }

    #[test]
    fn a_new_response_during_playout_cancels_the_pending_stop() {
        let t0 = Instant::now();
        let mut s = Speech::new();
        s.begin();
        s.finished(false);
        assert!(!s.played(t0, 0, Some(t0 + 200 * MS)));
        assert!(!s.begin(), "still speaking: no second start");
        assert_eq!(s.poll_timeout(), None);
        assert!(!s.played(t0 + 300 * MS, 0, Some(t0 + 200 * MS)));
        assert!(s.speaking());
    }

    #[test]
    fn realtime_mode_hears_while_speaking() {
        let mut s = Speech::new();
        s.listen(&ListenMode::Realtime);
        s.begin();
        assert!(s.hears_uplink());
        s.listen(&ListenMode::Manual);
        assert!(!s.hears_uplink());
        s.listen(&ListenMode::Auto);
        assert!(!s.hears_uplink());
    }

    #[test]
    fn an_interrupted_reply_stops_at_once() {
        let mut s = Speech::new();
        s.begin();
        assert!(s.finished(true));
        assert!(!s.speaking());
        // Not speaking: nothing to stop.
        assert!(!s.finished(true));
        assert!(!s.finished(false));
    }

    #[test]
    fn clear_stops_once_and_mutes_until_the_next_response() {
        let mut s = Speech::new();
        s.begin();
        assert!(s.clear(), "tts stop");
        assert!(s.muted());
        assert!(!s.clear(), "already stopped");
        assert!(
            !s.finished(true),
            "the engine's interrupted finish adds nothing"
        );
        assert!(s.begin());
        assert!(!s.muted());
    }

    #[test]
    fn abort_is_answered_exactly_once() {
        let t0 = Instant::now();
        // Speaking: the engine clears playback, which is the answer.
        let mut s = Speech::new();
        s.begin();
        let mark = s.abort();
        assert!(s.clear());
        assert!(!s.finished(true));
        assert!(!s.aborted(mark), "already answered by the clear");
        assert!(!s.speaking());
        // Idle: nothing from the engine, the abort itself is answered.
        let mark = s.abort();
        assert!(s.aborted(mark));
        // A finished reply still playing out: the engine says nothing, the abort stops it
        // and the pending stop is gone.
        s.begin();
        s.finished(false);
        assert!(!s.played(t0, 0, Some(t0 + 500 * MS)));
        let mark = s.abort();
        assert!(s.aborted(mark));
        assert!(!s.speaking());
        assert_eq!(s.poll_timeout(), None);
        assert!(!s.played(t0 + 600 * MS, 0, Some(t0 + 500 * MS)));
    }
}
