//! What the client has played of one response: from its reports, or estimated from time.

use std::time::{Duration, Instant};

use crate::text::word_prefix;
use crate::types::AudioSpan;

#[derive(Debug, Clone)]
struct Chunk {
    text: String,
    /// Byte offset of the chunk's start in the response's audio.
    offset: u64,
    /// `None` for text-only chunks (zero-length in the audio timeline).
    audio: Option<AudioSpan>,
    /// When the client should start playing it: it plays at real time, so a chunk starts when
    /// it arrives or when the previous chunk ends, whichever is later.
    est_start: Instant,
}

/// Where playback of one response stands.
#[derive(Debug, Clone, Default)]
pub(crate) struct Playback {
    chunks: Vec<Chunk>,
    total_bytes: u64,
    /// Estimated end of the last audio chunk; `None` until audio was delivered.
    est_end: Option<Instant>,
    /// Highest cumulative position the client reported.
    reported: Option<u64>,
}

/// The measure of "how far" playback went, in one of the two ways it can be known.
#[derive(Clone, Copy)]
enum Position {
    Bytes(u64),
    Time(Instant),
}

impl Playback {
    /// Records a delivered chunk; returns its sequence number.
    pub(crate) fn push(&mut self, now: Instant, text: String, audio: Option<AudioSpan>) -> u32 {
        let est_start = self.est_end.map_or(now, |end| end.max(now));
        let offset = self.total_bytes;
        if let Some(span) = audio {
            self.total_bytes = self.total_bytes.saturating_add(span.bytes);
            self.est_end = Some(est_start + span.duration);
        }
        self.chunks.push(Chunk {
            text,
            offset,
            audio,
            est_start,
        });
        u32::try_from(self.chunks.len() - 1).unwrap_or(u32::MAX)
    }

    pub(crate) fn report(&mut self, bytes_played: u64) {
        self.reported = Some(self.reported.map_or(bytes_played, |r| r.max(bytes_played)));
    }

    pub(crate) fn has_chunks(&self) -> bool {
        !self.chunks.is_empty()
    }

    pub(crate) fn has_audio(&self) -> bool {
        self.est_end.is_some()
    }

    /// When playback is considered finished if nothing else is heard (estimate, or estimate plus
    /// grace with reports on). `None` without audio.
    pub(crate) fn finish_deadline(&self, reports: bool, grace: Duration) -> Option<Instant> {
        let end = self.est_end?;
        if reports {
            if self.reported.is_some_and(|r| r >= self.total_bytes) {
                return None;
            }
            Some(end + grace)
        } else {
            Some(end)
        }
    }

    /// Whether every delivered chunk has been played out.
    pub(crate) fn finished(&self, now: Instant, reports: bool, grace: Duration) -> bool {
        if reports && self.reported.is_some_and(|r| r >= self.total_bytes) {
            return true;
        }
        self.finish_deadline(reports, grace)
            .is_none_or(|deadline| now >= deadline)
    }

    fn position(&self, now: Instant, reports: bool) -> Position {
        if reports {
            Position::Bytes(self.reported.unwrap_or(0))
        } else {
            Position::Time(now)
        }
    }

    /// The text the user has heard: whole chunks played out, plus the whole words of the chunk
    /// in progress that fit in the played fraction. Text-only chunks count once playback
    /// reaches their place.
    pub(crate) fn heard_text(&self, now: Instant, reports: bool) -> String {
        let pos = self.position(now, reports);
        let mut heard = String::new();
        for chunk in &self.chunks {
            let (played, total) = match (chunk.audio, pos) {
                (None, Position::Bytes(b)) if b >= chunk.offset => (1, 1),
                (None, Position::Time(t)) if t >= chunk.est_start => (1, 1),
                (None, _) => break,
                (Some(span), Position::Bytes(b)) => (
                    u128::from(b.saturating_sub(chunk.offset).min(span.bytes)),
                    u128::from(span.bytes),
                ),
                (Some(span), Position::Time(t)) => (
                    t.saturating_duration_since(chunk.est_start)
                        .min(span.duration)
                        .as_nanos(),
                    span.duration.as_nanos(),
                ),
            };
            if total > 0 && played >= total || total == 0 && pos_reached(pos, chunk) {
                heard.push_str(&chunk.text);
                continue;
            }
            heard.push_str(word_prefix(&chunk.text, played, total));
            break;
        }
        heard
    }

    /// Everything delivered so far, heard or not.
    pub(crate) fn delivered_text(&self) -> String {
        self.chunks.iter().map(|c| c.text.as_str()).collect()
    }
}

/// Zero-length audio chunks count as played once the position reaches them.
fn pos_reached(pos: Position, chunk: &Chunk) -> bool {
    match pos {
        Position::Bytes(b) => b >= chunk.offset,
        Position::Time(t) => t >= chunk.est_start,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(ms: u64) -> Option<AudioSpan> {
        Some(AudioSpan {
            bytes: ms * 48,
            duration: Duration::from_millis(ms),
        })
    }

    #[test]
    fn estimate_follows_real_time_and_underruns() {
        let t0 = Instant::now();
        let mut p = Playback::default();
        p.push(t0, "Hello there. ".into(), span(1000));
        // Arrives late: plays from its arrival, not from the end of the first chunk.
        p.push(
            t0 + Duration::from_millis(1500),
            "How are you?".into(),
            span(1000),
        );
        assert_eq!(p.heard_text(t0, false), "");
        assert_eq!(
            p.heard_text(t0 + Duration::from_millis(500), false),
            "Hello"
        );
        assert_eq!(
            p.heard_text(t0 + Duration::from_millis(1200), false),
            "Hello there. "
        );
        assert_eq!(
            p.heard_text(t0 + Duration::from_millis(2000), false),
            "Hello there. How"
        );
        assert!(!p.finished(t0 + Duration::from_millis(2499), false, Duration::ZERO));
        assert!(p.finished(t0 + Duration::from_millis(2500), false, Duration::ZERO));
    }

    #[test]
    fn reports_decide_when_on() {
        let t0 = Instant::now();
        let mut p = Playback::default();
        p.push(t0, "one two ".into(), span(100));
        p.push(t0, "three".into(), span(100));
        let late = t0 + Duration::from_secs(10);
        assert_eq!(p.heard_text(late, true), "");
        p.report(4800);
        assert_eq!(p.heard_text(late, true), "one two ");
        p.report(100); // never goes backwards
        assert_eq!(p.heard_text(late, true), "one two ");
        assert!(!p.finished(t0, true, Duration::from_secs(1)));
        p.report(9600);
        assert_eq!(p.heard_text(t0, true), "one two three");
        assert!(p.finished(t0, true, Duration::from_secs(1)));
    }

    #[test]
    fn text_only_chunks_are_heard_on_delivery() {
        let t0 = Instant::now();
        let mut p = Playback::default();
        p.push(t0, "Hi".into(), None);
        assert_eq!(p.heard_text(t0, false), "Hi");
        assert_eq!(p.heard_text(t0, true), "Hi");
        assert!(p.finished(t0, false, Duration::ZERO));
    }
}
