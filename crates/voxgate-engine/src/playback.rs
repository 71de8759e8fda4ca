//! Which words of a spoken reply the user heard, sentence by sentence.
//!
//! The turn machine tracks playback per delivered chunk, but TTS audio for one sentence arrives
//! in many chunks whose total length is unknown until the sentence is done, so it cannot know
//! which chunk carries which words. This ledger keeps each sentence's byte range in the
//! response's audio and maps a playback position (reported bytes, or bytes estimated from time
//! as the client plays in real time) to a word-aligned prefix of the reply.

use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
struct Segment {
    text: String,
    start: u64,
    bytes: u64,
    done: bool,
    /// When its audio delivered so far will have played, by the real-time estimate.
    est_end: Option<Instant>,
}

#[derive(Debug, Clone, Copy)]
struct Chunk {
    est_start: Instant,
    duration: Duration,
    bytes: u64,
}

/// Sentence byte ranges and delivery times of one response's audio.
#[derive(Debug, Clone, Default)]
pub(crate) struct Ledger {
    segments: Vec<Segment>,
    chunks: Vec<Chunk>,
    total: u64,
    est_end: Option<Instant>,
    reported: u64,
}

impl Ledger {
    /// Starts a sentence whose audio follows.
    pub(crate) fn start_segment(&mut self, text: &str) {
        if let Some(last) = self.segments.last_mut() {
            last.done = true;
        }
        self.segments.push(Segment {
            text: text.to_owned(),
            start: self.total,
            bytes: 0,
            done: false,
            est_end: None,
        });
    }

    /// Marks the current sentence's audio as complete.
    pub(crate) fn finish_segment(&mut self) {
        if let Some(last) = self.segments.last_mut() {
            last.done = true;
        }
    }

    /// Records a delivered chunk of the current sentence.
    pub(crate) fn push_audio(&mut self, now: Instant, bytes: u64, duration: Duration) {
        let est_start = self.est_end.map_or(now, |e| e.max(now));
        self.est_end = Some(est_start + duration);
        self.chunks.push(Chunk {
            est_start,
            duration,
            bytes,
        });
        self.total = self.total.saturating_add(bytes);
        if let Some(last) = self.segments.last_mut() {
            last.bytes = last.bytes.saturating_add(bytes);
            last.est_end = self.est_end;
        }
    }

    /// Finished sentences whose audio has not played out by `now` (neither by the real-time
    /// estimate nor, with reports on, by the client's reports), and the estimated end of the
    /// earliest of them. Pacing only; what was heard is [`Ledger::heard_segments`].
    pub(crate) fn unplayed_finished(
        &self,
        now: Instant,
        reports: bool,
    ) -> (usize, Option<Instant>) {
        let mut count = 0;
        let mut first_end = None;
        // Playback is in order: the unplayed finished sentences are the last finished ones.
        for s in self.segments.iter().rev().filter(|s| s.done) {
            if self.played(s, now, reports) {
                break;
            }
            count += 1;
            first_end = s.est_end;
        }
        (count, first_end)
    }

    fn played(&self, s: &Segment, now: Instant, reports: bool) -> bool {
        s.est_end.is_none_or(|end| end <= now)
            || reports && self.reported >= s.start.saturating_add(s.bytes)
    }

    /// A client report of cumulative bytes played (never goes backwards).
    pub(crate) fn report(&mut self, bytes_played: u64) {
        self.reported = self.reported.max(bytes_played);
    }

    pub(crate) fn has_audio(&self) -> bool {
        self.total > 0
    }

    fn position(&self, now: Instant, reports: bool) -> u64 {
        if reports {
            return self.reported.min(self.total);
        }
        let mut pos = 0u64;
        for c in &self.chunks {
            if now <= c.est_start {
                break;
            }
            let played = now.saturating_duration_since(c.est_start);
            if played >= c.duration || c.duration.is_zero() {
                pos += c.bytes;
            } else {
                let part = u128::from(c.bytes) * played.as_nanos() / c.duration.as_nanos();
                pos += u64::try_from(part).unwrap_or(c.bytes);
                break;
            }
        }
        pos
    }

    /// Everything the reply says, sentence by sentence.
    #[cfg(test)]
    pub(crate) fn full_text(&self) -> String {
        join_all(&self.segment_texts())
    }

    /// Every sentence's text, in order.
    pub(crate) fn segment_texts(&self) -> Vec<String> {
        self.segments.iter().map(|s| s.text.clone()).collect()
    }

    /// The word-aligned prefix of the reply the user heard by `now`.
    #[cfg(test)]
    pub(crate) fn heard_text(&self, now: Instant, reports: bool) -> String {
        join_all(&self.heard_segments(now, reports))
    }

    /// What the user heard of each sentence by `now`: whole sentences, then a word-aligned
    /// prefix of the one cut off; sentences not reached are left out.
    pub(crate) fn heard_segments(&self, now: Instant, reports: bool) -> Vec<String> {
        let pos = self.position(now, reports);
        // Bytes per character of finished sentences: estimates how long the sentence still
        // being synthesized will be.
        let (done_bytes, done_chars) = self
            .segments
            .iter()
            .filter(|s| s.done && s.bytes > 0)
            .fold((0u64, 0u64), |(b, c), s| {
                (b + s.bytes, c + s.text.chars().count() as u64)
            });
        let mut out = Vec::new();
        for s in &self.segments {
            if s.bytes == 0 || pos <= s.start {
                break;
            }
            let mut total = s.bytes;
            if !s.done && done_chars > 0 {
                let expected = done_bytes * s.text.chars().count() as u64 / done_chars;
                total = total.max(expected);
            }
            let played = (pos - s.start).min(total);
            if played >= total && s.done {
                out.push(s.text.clone());
                continue;
            }
            out.push(word_prefix(&s.text, played, total).to_owned());
            break;
        }
        out
    }
}

/// Sentences joined as [`join`] does.
#[cfg(test)]
pub(crate) fn join_all(texts: &[impl AsRef<str>]) -> String {
    let mut out = String::new();
    for t in texts {
        join(&mut out, t.as_ref());
    }
    out
}

fn is_wide(c: char) -> bool {
    c as u32 >= 0x2E80
}

/// Appends a sentence, with a space between sentences of space-separated scripts.
pub(crate) fn join(out: &mut String, text: &str) {
    if text.is_empty() {
        return;
    }
    let gap = match (out.chars().next_back(), text.chars().next()) {
        (Some(a), Some(b)) => !(is_wide(a) || is_wide(b) || a.is_whitespace()),
        _ => false,
    };
    if gap {
        out.push(' ');
    }
    out.push_str(text);
}

/// The longest prefix of `text` that ends at a word end within the first `num/den` of its
/// characters. CJK characters are words of their own; a word is never cut in half.
pub(crate) fn word_prefix(text: &str, num: u64, den: u64) -> &str {
    if den == 0 || num >= den {
        return text;
    }
    let total = text.chars().count() as u64;
    let limit = total * num / den;
    let mut cut = 0;
    let mut chars = text.char_indices().enumerate().peekable();
    while let Some((ci, (bi, c))) = chars.next() {
        if ci as u64 >= limit {
            break;
        }
        let end = bi + c.len_utf8();
        let wordy = c.is_alphanumeric() || c == '\'' || c == '’';
        if is_wide(c) && c.is_alphanumeric() {
            cut = end;
        } else if wordy {
            let continues = chars.peek().is_some_and(|&(_, (_, n))| {
                (n.is_alphanumeric() || n == '\'' || n == '’') && !is_wide(n)
            });
            if !continues {
                cut = end;
            }
        } else if cut > 0 && !c.is_whitespace() {
            // Punctuation right after a heard word was heard with it.
            cut = end;
        }
    }
    &text[..cut]
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn reports_map_bytes_to_sentences_and_words() {
        let t0 = Instant::now();
        let mut l = Ledger::default();
        l.start_segment("One two three four.");
        l.push_audio(t0, 500, 500 * MS);
        l.push_audio(t0, 500, 500 * MS);
        l.start_segment("Five six seven eight.");
        l.push_audio(t0, 1000, 1000 * MS);
        l.finish_segment();
        assert_eq!(l.heard_text(t0, true), "");
        l.report(1000);
        assert_eq!(l.heard_text(t0, true), "One two three four.");
        l.report(1500);
        // Half of "Five six seven eight." (21 chars): 10 chars → "Five six".
        assert_eq!(l.heard_text(t0, true), "One two three four. Five six");
        l.report(2000);
        assert_eq!(l.full_text(), l.heard_text(t0, true));
    }

    #[test]
    fn estimate_plays_in_real_time_from_delivery() {
        let t0 = Instant::now();
        let mut l = Ledger::default();
        l.start_segment("Alpha beta.");
        l.push_audio(t0, 100, 1000 * MS);
        l.finish_segment();
        assert_eq!(l.heard_text(t0 + 300 * MS, false), "");
        assert_eq!(l.heard_text(t0 + 600 * MS, false), "Alpha");
        assert_eq!(l.heard_text(t0 + 2000 * MS, false), "Alpha beta.");
    }

    #[test]
    fn word_prefix_never_cuts_words() {
        assert_eq!(word_prefix("hello world", 3, 11), "");
        assert_eq!(word_prefix("hello world", 6, 11), "hello");
        assert_eq!(word_prefix("hi, there", 4, 9), "hi,");
        assert_eq!(word_prefix("你好世界", 1, 2), "你好");
        assert_eq!(word_prefix("abc", 5, 3), "abc");
    }
}
