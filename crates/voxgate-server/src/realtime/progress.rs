//! `ModelSpeechProgress` pacing: which reply text the client has heard by now.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use voxgate_engine::TurnId;
use voxgate_realtime::ClientBoundMessage;

/// Paces `ModelSpeechProgress` to playback, sentence by sentence, as the published clients
/// read it: each message carries text that has just become audible, and `audio_bytes_played`
/// is the reply's playback position (in output bytes) at which all of it has been heard. The
/// LiveKit plugin times its transcript from consecutive positions and concatenates the texts,
/// so sentences after the first carry their separating space.
///
/// A sentence is closed (its end known) when the next one starts or the reply's audio ends.
/// Without playback reports its end is estimated by a playout clock (chunks play back to back
/// from when they were sent); with reports, a report at or past its end announces it (`exact`).
#[derive(Debug, Default)]
pub(super) struct Progress {
    /// Closed sentences not announced yet: (text, end in bytes, estimated end of playback).
    closed: VecDeque<(String, u64, Instant)>,
    /// The sentence whose audio is still arriving.
    open: Option<String>,
    /// When the audio sent so far will have played, by the playout clock.
    playout_end: Option<Instant>,
    /// Whether a sentence was started in this reply (later ones get a leading space).
    started: bool,
}

impl Progress {
    pub(super) fn start(&mut self, now: Instant, text: String, bytes: u64) {
        self.close(now, bytes);
        let text = if self.started {
            format!(" {text}")
        } else {
            text
        };
        self.started = true;
        self.open = Some(text);
    }

    pub(super) fn audio_sent(&mut self, now: Instant, bytes: usize, bytes_per_second: u64) {
        let nanos = (bytes as u128).saturating_mul(1_000_000_000) / u128::from(bytes_per_second);
        let duration = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        let from = self.playout_end.map_or(now, |end| end.max(now));
        self.playout_end = Some(from + duration);
    }

    /// Closes the open sentence at `bytes`.
    pub(super) fn close(&mut self, now: Instant, bytes: u64) {
        if let Some(text) = self.open.take() {
            let due = self.playout_end.unwrap_or(now);
            self.closed.push_back((text, bytes, due));
        }
    }

    pub(super) fn next_due(&self) -> Option<Instant> {
        self.closed.front().map(|(_, _, due)| *due)
    }

    /// The announcements due by `now` (estimated) and/or `played` bytes (reported); with
    /// neither, every closed sentence.
    pub(super) fn due(
        &mut self,
        now: Option<Instant>,
        played: Option<u64>,
        turn: TurnId,
        exact: bool,
    ) -> Vec<ClientBoundMessage> {
        let mut out = Vec::new();
        while let Some((_, end, due)) = self.closed.front() {
            let heard = match (now, played) {
                (Some(now), _) => *due <= now,
                (None, Some(played)) => *end <= played,
                (None, None) => true,
            };
            if !heard {
                break;
            }
            if let Some((text, end, _)) = self.closed.pop_front() {
                out.push(ClientBoundMessage::model_speech_progress(
                    turn.0, text, end, exact,
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use voxgate_realtime::proto::client_bound_message::Payload;

    fn texts(msgs: &[ClientBoundMessage]) -> Vec<(String, u64, bool)> {
        msgs.iter()
            .map(|m| match &m.payload {
                Some(Payload::ModelSpeechProgress(p)) => {
                    (p.text.clone(), p.audio_bytes_played, p.exact)
                }
                other => panic!("unexpected {other:?}"),
            })
            .collect()
    }

    const RATE: u64 = 32_000; // 16 kHz, 16-bit mono: bytes per second

    #[test]
    fn estimated_progress_follows_the_playout_clock() {
        let t0 = Instant::now();
        let turn = TurnId(1);
        let mut p = Progress::default();
        p.start(t0, "One.".into(), 0);
        p.audio_sent(t0, 32_000, RATE); // one second
        p.start(t0, "Two.".into(), 32_000);
        p.audio_sent(t0, 16_000, RATE); // half a second more
        p.close(t0, 48_000);
        assert_eq!(p.next_due(), Some(t0 + Duration::from_secs(1)));
        assert!(
            p.due(Some(t0 + Duration::from_millis(999)), None, turn, false)
                .is_empty()
        );
        assert_eq!(
            texts(&p.due(Some(t0 + Duration::from_secs(1)), None, turn, false)),
            [("One.".to_owned(), 32_000, false)]
        );
        // Later sentences carry their separating space.
        assert_eq!(
            texts(&p.due(Some(t0 + Duration::from_millis(1_500)), None, turn, false)),
            [(" Two.".to_owned(), 48_000, false)]
        );
        assert_eq!(p.next_due(), None);
    }

    #[test]
    fn audio_sent_late_plays_from_when_it_was_sent() {
        let t0 = Instant::now();
        let mut p = Progress::default();
        p.start(t0, "Late.".into(), 0);
        // The playout clock never runs ahead of real time: a gap in delivery is a gap in
        // playback.
        p.audio_sent(t0 + Duration::from_secs(5), 32_000, RATE);
        p.close(t0 + Duration::from_secs(5), 32_000);
        assert_eq!(p.next_due(), Some(t0 + Duration::from_secs(6)));
    }

    #[test]
    fn playback_reports_announce_exactly_what_was_played() {
        let t0 = Instant::now();
        let turn = TurnId(7);
        let mut p = Progress::default();
        p.start(t0, "A.".into(), 0);
        p.audio_sent(t0, 100, RATE);
        p.start(t0, "B.".into(), 100);
        p.audio_sent(t0, 100, RATE);
        p.close(t0, 200);
        assert!(p.due(None, Some(99), turn, true).is_empty());
        assert_eq!(
            texts(&p.due(None, Some(150), turn, true)),
            [("A.".to_owned(), 100, true)]
        );
        assert_eq!(
            texts(&p.due(None, None, turn, false)),
            [(" B.".to_owned(), 200, false)]
        );
    }
}
