//! Streaming sentence splitting for TTS: a sentence goes to synthesis as soon as it is complete.
//!
//! Latin `.`, `!`, `?` and `…` end a sentence when whitespace follows them (so `3.14`,
//! `example.com` and `e.g.` inside a sentence do not), except after a known abbreviation
//! (`Mr.`, `Dr.`, `etc.`) or a single-letter initial (`J. R. R. Tolkien`). CJK full stops, `！`,
//! `？` and `；` end a sentence at once: those scripts put no space after them. Closing quotes and
//! brackets stay with the sentence they close. A line break ends a sentence too. A sentence that
//! grows past the maximum length is cut at its last comma or space before the limit, so a
//! rambling model cannot hold up speech.

use std::collections::VecDeque;

/// Words that end with a period without ending the sentence (compared case-insensitively).
const ABBREVIATIONS: &[&str] = &[
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e", "approx", "no",
    "fig", "inc", "ltd", "co", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept",
    "oct", "nov", "dec", "mt", "ave", "dept", "est",
];

fn is_cjk_terminal(c: char) -> bool {
    matches!(c, '。' | '！' | '？' | '；' | '｡' | '︒')
}

fn is_latin_terminal(c: char) -> bool {
    matches!(c, '.' | '!' | '?' | '…')
}

fn is_closer(c: char) -> bool {
    matches!(
        c,
        '"' | '\'' | '”' | '’' | ')' | ']' | '}' | '」' | '』' | '）' | '】' | '》' | '〉'
    )
}

fn is_soft_break(c: char) -> bool {
    matches!(c, ',' | ';' | ':' | '，' | '、' | '：' | '—' | '–')
}

/// The streaming splitter. Push text deltas, pop complete sentences, [`Splitter::finish`] at the
/// end of the reply.
#[derive(Debug, Clone)]
pub struct Splitter {
    buf: String,
    /// Byte offset in `buf` where the boundary search resumes.
    scan: usize,
    max_chars: usize,
    ready: VecDeque<String>,
}

enum Scan {
    /// A sentence ends at this byte offset.
    End(usize),
    /// A boundary may be at this offset but the next character decides; wait for more text.
    Undecided(usize),
    /// No boundary in the buffer.
    None,
}

impl Splitter {
    /// A splitter cutting sentences longer than `max_chars` characters (at least 16).
    #[must_use]
    pub fn new(max_chars: usize) -> Self {
        Self {
            buf: String::new(),
            scan: 0,
            max_chars: max_chars.max(16),
            ready: VecDeque::new(),
        }
    }

    /// Adds text; complete sentences become available from [`Splitter::pop`].
    pub fn push(&mut self, text: &str) {
        self.buf.push_str(text);
        self.split(false);
    }

    /// Ends the text: whatever is left becomes the last sentence.
    pub fn finish(&mut self) {
        self.split(true);
        self.take(self.buf.len());
    }

    /// The next complete sentence, trimmed.
    pub fn pop(&mut self) -> Option<String> {
        self.ready.pop_front()
    }

    /// Drops everything (the reply was cancelled).
    pub fn clear(&mut self) {
        self.buf.clear();
        self.scan = 0;
        self.ready.clear();
    }

    /// Whether no text is buffered or waiting.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.buf.trim().is_empty() && self.ready.is_empty()
    }

    fn split(&mut self, at_end: bool) {
        loop {
            match self.boundary(at_end) {
                Scan::End(end) => self.take(end),
                Scan::Undecided(at) => {
                    self.scan = at;
                    break;
                }
                Scan::None => {
                    self.scan = self.buf.len();
                    break;
                }
            }
        }
        if self.buf.len() > self.max_chars {
            self.cut_long();
        }
    }

    fn take(&mut self, end: usize) {
        let sentence = self.buf[..end].trim();
        // Nothing to say in "..." or a lone emoji-free bracket.
        if sentence.chars().any(char::is_alphanumeric) {
            self.ready.push_back(sentence.to_owned());
        }
        self.buf.drain(..end);
        self.scan = 0;
    }

    fn boundary(&self, at_end: bool) -> Scan {
        let buf = self.buf.as_str();
        for (i, c) in buf[self.scan..]
            .char_indices()
            .map(|(i, c)| (i + self.scan, c))
        {
            if c == '\n' {
                if buf[..i].trim().is_empty() {
                    continue;
                }
                return Scan::End(i + 1);
            }
            let cjk = is_cjk_terminal(c);
            if !cjk && !is_latin_terminal(c) {
                continue;
            }
            // The run of terminals and closers that belongs to this sentence.
            let mut end = i + c.len_utf8();
            let mut single_period = c == '.';
            let mut next = None;
            for (j, d) in buf[end..].char_indices() {
                if is_latin_terminal(d) || is_cjk_terminal(d) || is_closer(d) {
                    single_period = false;
                    end = i + c.len_utf8() + j + d.len_utf8();
                } else {
                    next = Some(d);
                    break;
                }
            }
            let Some(next) = next else {
                return if at_end {
                    Scan::End(end)
                } else {
                    Scan::Undecided(i)
                };
            };
            if cjk {
                return Scan::End(end);
            }
            if !next.is_whitespace() {
                continue;
            }
            if single_period && is_abbreviation(&buf[..i]) {
                continue;
            }
            return Scan::End(end);
        }
        Scan::None
    }

    /// Cuts an over-long sentence at the last soft break (or space) within the limit.
    fn cut_long(&mut self) {
        while self.buf.chars().count() > self.max_chars {
            let limit = self
                .buf
                .char_indices()
                .nth(self.max_chars)
                .map_or(self.buf.len(), |(i, _)| i);
            let head = &self.buf[..limit];
            let cut = head
                .char_indices()
                .rev()
                .find(|&(_, c)| is_soft_break(c))
                .or_else(|| head.char_indices().rev().find(|&(_, c)| c.is_whitespace()))
                .map_or(limit, |(i, c)| i + c.len_utf8());
            let cut = if cut == 0 { limit } else { cut };
            self.take(cut);
        }
    }
}

/// Whether the word just before a period is an abbreviation or an initial.
fn is_abbreviation(before: &str) -> bool {
    let word_start = before
        .char_indices()
        .rev()
        .find(|&(_, c)| !(c.is_alphanumeric() || c == '.'))
        .map_or(0, |(i, c)| i + c.len_utf8());
    let word = &before[word_start..];
    let mut chars = word.chars();
    match (chars.next(), chars.next()) {
        (None, _) => false,
        // A single capital letter: an initial.
        (Some(c), None) => c.is_uppercase(),
        _ => ABBREVIATIONS.iter().any(|a| a.eq_ignore_ascii_case(word)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split_all(deltas: &[&str]) -> Vec<String> {
        let mut s = Splitter::new(120);
        let mut out = Vec::new();
        for d in deltas {
            s.push(d);
            out.extend(std::iter::from_fn(|| s.pop()));
        }
        s.finish();
        out.extend(std::iter::from_fn(|| s.pop()));
        out
    }

    #[test]
    fn emits_each_sentence_as_soon_as_the_next_word_starts() {
        let mut s = Splitter::new(120);
        s.push("Hello there");
        assert_eq!(s.pop(), None);
        s.push("! How");
        assert_eq!(s.pop().as_deref(), Some("Hello there!"));
        s.push(" are you?");
        // The question mark could be followed by a closing quote: wait for one more char.
        assert_eq!(s.pop(), None);
        s.finish();
        assert_eq!(s.pop().as_deref(), Some("How are you?"));
        assert!(s.is_empty());
    }

    #[test]
    fn decimals_abbreviations_initials_and_urls_do_not_split() {
        assert_eq!(
            split_all(&[
                "It costs 3",
                ".14 dollars. Mr. Smith met Dr. J. R. Tolkien, e.g. ",
                "at example.com today. Done"
            ]),
            [
                "It costs 3.14 dollars.",
                "Mr. Smith met Dr. J. R. Tolkien, e.g. at example.com today.",
                "Done"
            ]
        );
    }

    #[test]
    fn closers_and_ellipses_stay_with_their_sentence() {
        assert_eq!(
            split_all(&["He said \"stop!\" Then he left... ", "Really?! Yes."]),
            ["He said \"stop!\"", "Then he left...", "Really?!", "Yes."]
        );
    }

    #[test]
    fn cjk_punctuation_splits_without_spaces() {
        assert_eq!(
            split_all(&["你好。今天天气", "怎么样？「很好！」谢谢"]),
            ["你好。", "今天天气怎么样？", "「很好！」", "谢谢"]
        );
    }

    #[test]
    fn long_runs_are_cut_at_a_soft_break() {
        let text = "one two three four five six seven eight nine ten, eleven twelve thirteen \
                    fourteen fifteen sixteen";
        let mut s = Splitter::new(60);
        s.push(text);
        let first = s.pop().unwrap();
        assert_eq!(first, "one two three four five six seven eight nine ten,");
        s.finish();
        assert_eq!(
            s.pop().as_deref(),
            Some("eleven twelve thirteen fourteen fifteen sixteen")
        );
    }

    #[test]
    fn punctuation_only_and_newlines() {
        assert_eq!(
            split_all(&["...\n", "First line\nSecond line"]),
            ["First line", "Second line"]
        );
    }
}
