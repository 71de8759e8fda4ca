//! Playback-rate delivery of audio frames, driven by `now` values.
//!
//! A device buffers only a little audio (a Xiaozhi device holds 40 packets and drops the rest),
//! so a server must not dump a whole TTS reply at once, yet a small lead hides network jitter.
//! [`Pacer`] releases the first `lead_frames` at once and then one frame per frame duration,
//! keeping the device's buffer at the lead. If the queue runs dry long enough for the device to
//! play everything out, the next frame starts a fresh burst.
//!
//! It is a sans-IO machine with the crate-wide verb set:
//!
//! ```
//! use std::time::{Duration, Instant};
//! use voxgate_audio::pacer::{Pacer, PacerConfig};
//!
//! let mut pacer = Pacer::new(PacerConfig::new(Duration::from_millis(60), 5, 400));
//! let t0 = Instant::now(); // the caller's clock; the pacer never reads one
//! for frame in 0..8u32 {
//!     pacer.handle_input(t0, frame).unwrap();
//! }
//! let burst: Vec<u32> = std::iter::from_fn(|| pacer.poll_output()).collect();
//! assert_eq!(burst, [0, 1, 2, 3, 4]); // the lead goes out at once
//! assert_eq!(pacer.poll_timeout(), Some(t0 + Duration::from_millis(60)));
//! pacer.handle_timeout(t0 + Duration::from_millis(60));
//! assert_eq!(pacer.poll_output(), Some(5)); // then real time
//! assert_eq!(pacer.poll_output(), None);
//! ```

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Slots reserved up front; more are allocated as a long reply needs them.
const INITIAL_SLOTS: usize = 64;

/// Pacing settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacerConfig {
    /// Playback length of one frame.
    pub frame_duration: Duration,
    /// Frames sent at once before pacing starts (the Xiaozhi reference server uses 5); 0 and 1
    /// both mean the first frame goes at once and the rest one per `frame_duration`.
    pub lead_frames: u32,
    /// Most frames held; more are refused and counted as dropped.
    pub capacity: usize,
}

impl PacerConfig {
    /// Builds a configuration.
    #[must_use]
    pub const fn new(frame_duration: Duration, lead_frames: u32, capacity: usize) -> Self {
        Self {
            frame_duration,
            lead_frames,
            capacity,
        }
    }
}

/// Releases queued frames at playback rate with a lead.
#[derive(Debug)]
pub struct Pacer<T> {
    config: PacerConfig,
    queue: VecDeque<T>,
    /// When the current burst began; `None` until the first frame of a burst goes out.
    anchor: Option<Instant>,
    /// Frames released since `anchor`.
    sent: u32,
    now: Option<Instant>,
    dropped: u64,
}

impl<T> Pacer<T> {
    /// An empty pacer.
    #[must_use]
    pub fn new(config: PacerConfig) -> Self {
        Self {
            config,
            // Capacity is a limit, not a reservation: a server holds one pacer per session, and
            // most replies need a few dozen slots. The queue grows (rarely) beyond this.
            queue: VecDeque::with_capacity(config.capacity.min(INITIAL_SLOTS)),
            anchor: None,
            sent: 0,
            now: None,
            dropped: 0,
        }
    }

    /// The settings in force.
    #[must_use]
    pub const fn config(&self) -> &PacerConfig {
        &self.config
    }

    /// Queues a frame. A full queue refuses it, hands it back and counts a drop.
    ///
    /// # Errors
    /// The frame itself when the queue is at capacity.
    pub fn handle_input(&mut self, now: Instant, frame: T) -> Result<(), T> {
        self.advance(now);
        if self.queue.len() >= self.config.capacity {
            self.dropped += 1;
            return Err(frame);
        }
        self.queue.push_back(frame);
        Ok(())
    }

    /// Tells the pacer the time; due frames become available from [`poll_output`](Self::poll_output).
    pub fn handle_timeout(&mut self, now: Instant) {
        self.advance(now);
    }

    /// The next frame due at the last `now` given, if any.
    pub fn poll_output(&mut self) -> Option<T> {
        let now = self.now?;
        if self.queue.is_empty() {
            return None;
        }
        let anchor = *self.anchor.get_or_insert(now);
        if self.due(anchor) > now {
            return None;
        }
        self.sent = self.sent.saturating_add(1);
        self.queue.pop_front()
    }

    /// When the next queued frame is due (`None` with an empty queue).
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.queue.is_empty() {
            return None;
        }
        match self.anchor {
            Some(anchor) => Some(self.due(anchor)),
            None => self.now,
        }
    }

    /// When the peer will have played every frame released so far (for example to send
    /// Xiaozhi's `tts stop` only after the audio is heard); `None` before the first frame.
    #[must_use]
    pub fn drained_at(&self) -> Option<Instant> {
        self.anchor
            .map(|a| a + self.config.frame_duration.saturating_mul(self.sent))
    }

    /// Drops every queued frame and restarts pacing (barge-in); returns how many were dropped.
    /// The frames are not counted in [`dropped`](Self::dropped), which counts overflow only.
    pub fn clear(&mut self) -> usize {
        let n = self.queue.len();
        self.queue.clear();
        self.anchor = None;
        self.sent = 0;
        n
    }

    /// Frames waiting.
    #[must_use]
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Frames refused because the queue was full.
    #[must_use]
    pub const fn dropped(&self) -> u64 {
        self.dropped
    }

    fn due(&self, anchor: Instant) -> Instant {
        // Frames 0..lead go at the anchor, frame k >= lead at anchor + (k - lead + 1) frames.
        let ahead = (self.sent + 1).saturating_sub(self.config.lead_frames.max(1));
        anchor + self.config.frame_duration.saturating_mul(ahead)
    }

    fn advance(&mut self, now: Instant) {
        // Time only moves forward, whatever order the caller's events arrive in.
        let now = self.now.map_or(now, |prev| prev.max(now));
        self.now = Some(now);
        // Nothing queued and everything played out: the peer's buffer is empty, so the next
        // frame starts a new burst with a full lead instead of trickling in late.
        if self.queue.is_empty() && self.drained_at().is_some_and(|end| end <= now) {
            self.anchor = None;
            self.sent = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: Duration = Duration::from_millis(60);

    fn drain<T>(p: &mut Pacer<T>) -> Vec<T> {
        std::iter::from_fn(|| p.poll_output()).collect()
    }

    #[test]
    fn lead_then_real_time() {
        let t0 = Instant::now();
        let mut p = Pacer::new(PacerConfig::new(F, 5, 100));
        for i in 0..20 {
            p.handle_input(t0, i).unwrap();
        }
        assert_eq!(drain(&mut p), vec![0, 1, 2, 3, 4]);
        for k in 1..=15u32 {
            let t = p.poll_timeout().unwrap();
            assert_eq!(t, t0 + F * k);
            // A timer that fires a little early releases nothing.
            p.handle_timeout(t - Duration::from_millis(1));
            assert_eq!(p.poll_output(), None);
            p.handle_timeout(t);
            assert_eq!(drain(&mut p), vec![4 + k]);
        }
        assert_eq!(p.poll_timeout(), None);
        assert_eq!(p.drained_at(), Some(t0 + F * 20));
    }

    #[test]
    fn late_timer_catches_up() {
        let t0 = Instant::now();
        let mut p = Pacer::new(PacerConfig::new(F, 2, 100));
        for i in 0..6 {
            p.handle_input(t0, i).unwrap();
        }
        assert_eq!(drain(&mut p), vec![0, 1]);
        p.handle_timeout(t0 + F * 3);
        assert_eq!(drain(&mut p), vec![2, 3, 4]);
    }

    #[test]
    fn trickle_keeps_schedule_and_underrun_restarts_burst() {
        let t0 = Instant::now();
        let mut p = Pacer::new(PacerConfig::new(F, 3, 100));
        p.handle_input(t0, 0).unwrap();
        assert_eq!(drain(&mut p), vec![0]);
        // A second frame 10 ms later is still inside the lead.
        p.handle_input(t0 + Duration::from_millis(10), 1).unwrap();
        assert_eq!(drain(&mut p), vec![1]);
        // After the device has played both (120 ms), a new sentence gets a full lead again.
        let t1 = t0 + Duration::from_millis(500);
        for i in 2..7 {
            p.handle_input(t1, i).unwrap();
        }
        assert_eq!(drain(&mut p), vec![2, 3, 4]);
        assert_eq!(p.poll_timeout(), Some(t1 + F));
    }

    #[test]
    fn capacity_and_clear() {
        let t0 = Instant::now();
        let mut p = Pacer::new(PacerConfig::new(F, 0, 2));
        p.handle_input(t0, 'a').unwrap();
        p.handle_input(t0, 'b').unwrap();
        assert_eq!(p.handle_input(t0, 'c'), Err('c'));
        assert_eq!(p.dropped(), 1);
        assert_eq!(p.clear(), 2);
        assert_eq!(p.queued(), 0);
        assert_eq!(p.poll_output(), None);
        assert_eq!(p.poll_timeout(), None);
    }

    #[test]
    fn time_never_runs_backwards() {
        let t0 = Instant::now();
        let mut p = Pacer::new(PacerConfig::new(F, 0, 10));
        p.handle_input(t0 + F, 1).unwrap();
        p.handle_input(t0, 2).unwrap();
        assert_eq!(drain(&mut p), vec![1]);
    }
}
