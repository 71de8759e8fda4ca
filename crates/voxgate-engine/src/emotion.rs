//! Reading a reply's face: the emoji a model puts first in its reply, named as one of 21
//! emotions, and emoji removed from everything spoken or shown.
//!
//! Protocol-neutral: the engine reports the face as [`crate::ClientEvent::Emotion`] with an
//! [`Emotion`], and each door maps that to its own wire value (the Xiaozhi door to the
//! firmware's `llm` frame). An [`EmojiPolicy`] restricts faces to an allowlist and puts a
//! default face in front of replies that have none.
//!
//! ```
//! use voxgate_engine::emotion::{self, EmojiPolicy, Emotion};
//!
//! let policy = EmojiPolicy::faces();
//! let expression = policy.expression("😆 Sure, the weather is fine! 🌞");
//! assert_eq!(expression.emoji, "😆");
//! assert_eq!(expression.emotion, Emotion::Laughing);
//! assert_eq!(emotion::strip_emoji(expression.text), "Sure, the weather is fine!");
//!
//! // No leading emoji: the policy's default face is used.
//! assert_eq!(policy.expression("Hello").emoji, "🙂");
//! assert_eq!(policy.ensure_prefix("Hello"), "🙂 Hello");
//! ```
//!
//! # What counts as an emoji
//!
//! A cluster is one pictograph (the supplementary-plane pictographic blocks, Miscellaneous
//! Symbols, Dingbats and the few other emoji-by-default symbols), optionally followed by a
//! variation selector, a skin-tone modifier and tag characters, joined to further pictographs by
//! zero-width joiners; or a regional-indicator pair (a flag); or a keycap (`1️⃣`). Symbols that are
//! text by default (`©`, `™`, `↔`, `〰`, ...) count only when followed by U+FE0F, so ordinary
//! punctuation, digits and CJK text are never touched.

use std::borrow::Cow;

/// One of 21 faces a reply can show (the vocabulary of common voice-device firmware, e.g.
/// Xiaozhi's, so a door can pass it on unchanged).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Emotion {
    /// 😶
    Neutral,
    /// 🙂
    Happy,
    /// 😆
    Laughing,
    /// 😂
    Funny,
    /// 😔
    Sad,
    /// 😠
    Angry,
    /// 😭
    Crying,
    /// 😍
    Loving,
    /// 😳
    Embarrassed,
    /// 😲
    Surprised,
    /// 😱
    Shocked,
    /// 🤔
    Thinking,
    /// 😉
    Winking,
    /// 😎
    Cool,
    /// 😌
    Relaxed,
    /// 🤤
    Delicious,
    /// 😘
    Kissy,
    /// 😏
    Confident,
    /// 😴
    Sleepy,
    /// 😜
    Silly,
    /// 🙄
    Confused,
}

/// The 21 faces, emoji → emotion.
pub const FACES: [(&str, Emotion); 21] = [
    ("😶", Emotion::Neutral),
    ("🙂", Emotion::Happy),
    ("😆", Emotion::Laughing),
    ("😂", Emotion::Funny),
    ("😔", Emotion::Sad),
    ("😠", Emotion::Angry),
    ("😭", Emotion::Crying),
    ("😍", Emotion::Loving),
    ("😳", Emotion::Embarrassed),
    ("😲", Emotion::Surprised),
    ("😱", Emotion::Shocked),
    ("🤔", Emotion::Thinking),
    ("😉", Emotion::Winking),
    ("😎", Emotion::Cool),
    ("😌", Emotion::Relaxed),
    ("🤤", Emotion::Delicious),
    ("😘", Emotion::Kissy),
    ("😏", Emotion::Confident),
    ("😴", Emotion::Sleepy),
    ("😜", Emotion::Silly),
    ("🙄", Emotion::Confused),
];

/// Common faces outside the table of [`FACES`], mapped to the closest of them.
///
/// Anything in neither table maps to [`Emotion::Neutral`] (see [`Emotion::nearest`]).
const NEAR_EMOJI: &[(char, Emotion)] = &[
    ('😐', Emotion::Neutral),
    ('😑', Emotion::Neutral),
    ('🫥', Emotion::Neutral),
    ('😀', Emotion::Happy),
    ('😃', Emotion::Happy),
    ('😄', Emotion::Happy),
    ('😊', Emotion::Happy),
    ('😇', Emotion::Happy),
    ('🤗', Emotion::Happy),
    ('🥳', Emotion::Happy),
    ('😺', Emotion::Happy),
    ('😁', Emotion::Laughing),
    ('😸', Emotion::Laughing),
    ('🤣', Emotion::Funny),
    ('😹', Emotion::Funny),
    ('😢', Emotion::Sad),
    ('😞', Emotion::Sad),
    ('😟', Emotion::Sad),
    ('🙁', Emotion::Sad),
    ('☹', Emotion::Sad),
    ('😥', Emotion::Sad),
    ('😓', Emotion::Sad),
    ('🥺', Emotion::Sad),
    ('🥲', Emotion::Sad),
    ('😿', Emotion::Crying),
    ('😡', Emotion::Angry),
    ('🤬', Emotion::Angry),
    ('😤', Emotion::Angry),
    ('👿', Emotion::Angry),
    ('😾', Emotion::Angry),
    ('🥰', Emotion::Loving),
    ('😻', Emotion::Loving),
    ('🤩', Emotion::Loving),
    ('❤', Emotion::Loving),
    ('💕', Emotion::Loving),
    ('💖', Emotion::Loving),
    ('😅', Emotion::Embarrassed),
    ('😬', Emotion::Embarrassed),
    ('🙈', Emotion::Embarrassed),
    ('🫣', Emotion::Embarrassed),
    ('😮', Emotion::Surprised),
    ('😯', Emotion::Surprised),
    ('😦', Emotion::Surprised),
    ('😧', Emotion::Shocked),
    ('😨', Emotion::Shocked),
    ('😰', Emotion::Shocked),
    ('🤯', Emotion::Shocked),
    ('🙀', Emotion::Shocked),
    ('🧐', Emotion::Thinking),
    ('🤨', Emotion::Thinking),
    ('🤓', Emotion::Cool),
    ('🕶', Emotion::Cool),
    ('☺', Emotion::Relaxed),
    ('😋', Emotion::Delicious),
    ('😗', Emotion::Kissy),
    ('😙', Emotion::Kissy),
    ('😚', Emotion::Kissy),
    ('💋', Emotion::Kissy),
    ('😼', Emotion::Confident),
    ('😪', Emotion::Sleepy),
    ('🥱', Emotion::Sleepy),
    ('💤', Emotion::Sleepy),
    ('😛', Emotion::Silly),
    ('😝', Emotion::Silly),
    ('🤪', Emotion::Silly),
    ('🙃', Emotion::Silly),
    ('😕', Emotion::Confused),
    ('😒', Emotion::Confused),
    ('🫤', Emotion::Confused),
    ('😵', Emotion::Confused),
    ('🤷', Emotion::Confused),
];

impl Emotion {
    /// Its lowercase English name (`"happy"`), for logs and text channels.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Neutral => "neutral",
            Self::Happy => "happy",
            Self::Laughing => "laughing",
            Self::Funny => "funny",
            Self::Sad => "sad",
            Self::Angry => "angry",
            Self::Crying => "crying",
            Self::Loving => "loving",
            Self::Embarrassed => "embarrassed",
            Self::Surprised => "surprised",
            Self::Shocked => "shocked",
            Self::Thinking => "thinking",
            Self::Winking => "winking",
            Self::Cool => "cool",
            Self::Relaxed => "relaxed",
            Self::Delicious => "delicious",
            Self::Kissy => "kissy",
            Self::Confident => "confident",
            Self::Sleepy => "sleepy",
            Self::Silly => "silly",
            Self::Confused => "confused",
        }
    }

    /// The emoji of this face in [`FACES`].
    #[must_use]
    pub fn emoji(self) -> &'static str {
        FACES
            .iter()
            .find(|(_, emotion)| *emotion == self)
            .map_or("😶", |(emoji, _)| *emoji)
    }

    /// The face [`FACES`] gives `emoji`, if it is one of the 21 faces.
    ///
    /// A variation selector or skin tone after the face is ignored; anything else makes it a
    /// different emoji.
    pub fn from_emoji(emoji: &str) -> Option<Emotion> {
        let mut chars = emoji.chars().filter(|&c| !is_presentation_or_modifier(c));
        let base = chars.next()?;
        if chars.next().is_some() {
            return None;
        }
        face_emotion(base)
    }

    /// The closest face for any emoji cluster.
    ///
    /// Looks the cluster's first pictograph up in [`FACES`], then in a table of common
    /// faces (😊 → happy, 😢 → sad, 😮 → surprised, 😐 → neutral, 😡 → angry, ...), and falls back
    /// to [`Emotion::Neutral`]: a calm face is the least surprising substitute for one a
    /// client cannot show. A ZWJ sequence is named by its first element
    /// (`😶‍🌫️` → neutral).
    pub fn nearest(emoji: &str) -> Emotion {
        let Some(base) = emoji.trim_start().chars().next() else {
            return Emotion::Neutral;
        };
        face_emotion(base)
            .or_else(|| NEAR_EMOJI.iter().find(|(c, _)| *c == base).map(|(_, e)| *e))
            .unwrap_or(Emotion::Neutral)
    }
}

fn face_emotion(base: char) -> Option<Emotion> {
    FACES
        .iter()
        .find(|(emoji, _)| emoji.starts_with(base))
        .map(|(_, emotion)| *emotion)
}

/// An emoji at the start of a text, and the text after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeadingEmoji<'a> {
    /// The emoji cluster, as written (variation selectors and modifiers included).
    pub emoji: &'a str,
    /// The text after the emoji, with leading whitespace removed.
    pub rest: &'a str,
}

/// Finds the emoji a text starts with, skipping leading whitespace.
///
/// ```
/// use voxgate_engine::emotion::leading_emoji;
///
/// let found = leading_emoji("  👍🏽 Done.").unwrap();
/// assert_eq!((found.emoji, found.rest), ("👍🏽", "Done."));
/// assert!(leading_emoji("Done. 👍").is_none());
/// ```
pub fn leading_emoji(text: &str) -> Option<LeadingEmoji<'_>> {
    let trimmed = text.trim_start();
    let len = emoji_cluster_len(trimmed)?;
    let (emoji, rest) = trimmed.split_at(len);
    Some(LeadingEmoji {
        emoji,
        rest: rest.trim_start(),
    })
}

/// Whether `text` contains any emoji cluster.
pub fn contains_emoji(text: &str) -> bool {
    text.char_indices()
        .any(|(i, c)| is_stray(c) || text.get(i..).and_then(emoji_cluster_len).is_some())
}

/// Removes every emoji from `text`, for speech synthesis and subtitles.
///
/// Punctuation, digits and CJK text are kept. Where removing an emoji would leave two spaces, or a
/// space before closing punctuation, the extra space goes too, and the result is trimmed; a text
/// without emoji is returned borrowed and unchanged.
///
/// ```
/// use voxgate_engine::emotion::strip_emoji;
///
/// assert_eq!(strip_emoji("😊 好的，马上就来！🎉"), "好的，马上就来！");
/// assert_eq!(strip_emoji("I ❤️ Rust 🦀 (really) #1"), "I Rust (really) #1");
/// ```
pub fn strip_emoji(text: &str) -> Cow<'_, str> {
    if !contains_emoji(text) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut removed_last = false;
    while let Some(c) = rest.chars().next() {
        let len = emoji_cluster_len(rest).or_else(|| is_stray(c).then(|| c.len_utf8()));
        if let Some(len) = len {
            rest = rest.get(len..).unwrap_or_default();
            removed_last = true;
            continue;
        }
        if removed_last && c.is_whitespace() && out.ends_with(char::is_whitespace) {
            // The emoji sat between two spaces: keep only the first.
        } else {
            if removed_last && is_closing_punctuation(c) {
                // "hearts ❤️!" reads "hearts!", not "hearts !".
                out.truncate(out.trim_end().len());
            }
            out.push(c);
            removed_last = false;
        }
        rest = rest.get(c.len_utf8()..).unwrap_or_default();
    }
    let trimmed = out.trim();
    if trimmed.len() == out.len() {
        Cow::Owned(out)
    } else {
        Cow::Owned(trimmed.to_owned())
    }
}

fn is_closing_punctuation(c: char) -> bool {
    matches!(
        c,
        '!' | '?'
            | ','
            | '.'
            | ';'
            | ':'
            | ')'
            | ']'
            | '}'
            | '…'
            | '，'
            | '。'
            | '！'
            | '？'
            | '；'
            | '：'
            | '）'
            | '」'
            | '』'
            | '】'
            | '、'
    )
}

/// Which faces the device may show, and the face used when a reply has no allowed one.
///
/// Preset: [`EmojiPolicy::faces`] (the 21 faces of [`FACES`], default 🙂).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmojiPolicy {
    /// `None` allows any emoji.
    allowed: Option<Vec<String>>,
    default: String,
}

impl EmojiPolicy {
    /// Allows exactly `allowed` (compared ignoring variation selectors); `default` is used for
    /// replies without an allowed leading emoji and is allowed too.
    pub fn new<I, S>(allowed: I, default: impl Into<String>) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let default = default.into();
        let mut allowed: Vec<String> = allowed.into_iter().map(Into::into).collect();
        if !allowed.iter().any(|a| same_emoji(a, &default)) {
            allowed.push(default.clone());
        }
        Self {
            allowed: Some(allowed),
            default,
        }
    }

    /// Allows any emoji; `default` is used only for replies without one.
    pub fn any(default: impl Into<String>) -> Self {
        Self {
            allowed: None,
            default: default.into(),
        }
    }

    /// The 21 faces of [`FACES`] with 🙂 (happy) as default.
    pub fn faces() -> Self {
        Self::new(FACES.iter().map(|(emoji, _)| *emoji), "🙂")
    }

    /// The default face.
    pub fn default_emoji(&self) -> &str {
        &self.default
    }

    /// The allowed faces, or `None` when any emoji is allowed.
    pub fn allowed(&self) -> Option<&[String]> {
        self.allowed.as_deref()
    }

    /// Whether `emoji` may be shown.
    pub fn is_allowed(&self, emoji: &str) -> bool {
        match &self.allowed {
            None => emoji_cluster_len(emoji) == Some(emoji.len()),
            Some(list) => list.iter().any(|a| same_emoji(a, emoji)),
        }
    }

    /// Splits a model reply into the face to show and the text after it.
    ///
    /// A leading emoji outside the allowlist is dropped and replaced by the default, so the
    /// device shows exactly one face per reply.
    pub fn expression<'a>(&'a self, reply: &'a str) -> Expression<'a> {
        match leading_emoji(reply) {
            Some(found) if self.is_allowed(found.emoji) => Expression {
                emoji: found.emoji,
                emotion: Emotion::nearest(found.emoji),
                text: found.rest,
                defaulted: false,
            },
            Some(found) => self.defaulted(found.rest),
            None => self.defaulted(reply.trim_start()),
        }
    }

    /// The reply with an allowed emoji in front: unchanged when it already starts with one, else
    /// the default face and a space before the text (a disallowed leading emoji is replaced).
    ///
    /// This is the bridge's last line of defence for text that goes on to another component that
    /// reads the leading emoji itself.
    pub fn ensure_prefix(&self, reply: &str) -> String {
        let expression = self.expression(reply);
        if !expression.defaulted {
            return reply.to_owned();
        }
        if expression.text.is_empty() {
            return self.default.clone();
        }
        format!("{} {}", self.default, expression.text)
    }

    fn defaulted<'a>(&'a self, text: &'a str) -> Expression<'a> {
        Expression {
            emoji: &self.default,
            emotion: Emotion::nearest(&self.default),
            text,
            defaulted: true,
        }
    }
}

impl Default for EmojiPolicy {
    /// [`EmojiPolicy::faces`].
    fn default() -> Self {
        Self::faces()
    }
}

/// The face chosen for one reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expression<'a> {
    /// The emoji chosen (as written in the reply, or the policy's default).
    pub emoji: &'a str,
    /// Its name ([`Emotion::nearest`]).
    pub emotion: Emotion,
    /// The reply after the leading emoji (other emoji are still in it: see [`strip_emoji`]).
    pub text: &'a str,
    /// Whether the policy's default face was used.
    pub defaulted: bool,
}

/// `text` without emoji, for one fragment of a streamed reply: `strip_emoji` trims its result,
/// but the spaces at a fragment's edges separate it from its neighbours ("Hello " + "there"),
/// so they are kept (except leading ones at the start of the reply).
pub(crate) fn strip_chunk(text: &str, reply_start: bool) -> String {
    let stripped = strip_emoji(text);
    if matches!(stripped, Cow::Borrowed(_)) {
        return stripped.into_owned();
    }
    if stripped.trim().is_empty() {
        // Only emoji (and spaces): keep one space so the words around it stay apart.
        let spaced = !reply_start && text.contains(char::is_whitespace);
        return if spaced { " ".into() } else { String::new() };
    }
    let lead = &text[..text.len() - text.trim_start().len()];
    let trail = &text[text.trim_end().len()..];
    let mut out = String::with_capacity(text.len());
    if !reply_start {
        out.push_str(lead);
    }
    out.push_str(stripped.trim());
    out.push_str(trail);
    out
}

/// Emoji removal for a reply streamed in fragments, for outputs that show or speak the text but
/// have no face to put an emoji on (a text-only reply here; a door whose protocol has no emotion
/// channel, such as Retell's spoken content). Each fragment loses its emoji while the spaces
/// between words survive the fragment boundaries: `"see you "` + `"👋"` + `" soon"` reads
/// `"see you soon"`, and a reply's leading emoji leaves no leading space.
///
/// ```
/// use voxgate_engine::emotion::FragmentStripper;
///
/// let mut s = FragmentStripper::new();
/// let out: Vec<String> = ["😊 ", "You ", "said ", "🎉 ", "hi ", "👋", " there"]
///     .iter()
///     .map(|f| s.push(f))
///     .collect();
/// assert_eq!(out.concat(), "You said hi there");
/// ```
#[derive(Debug, Clone, Default)]
pub struct FragmentStripper {
    /// Some text was let through (until then, leading spaces are dropped).
    started: bool,
    /// The text let through last ended in whitespace.
    ends_with_space: bool,
    /// The last fragment with text ended in an emoji (removed).
    emoji_gap: bool,
}

impl FragmentStripper {
    /// A stripper at the start of a reply.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The next fragment without emoji (possibly empty: nothing to send).
    pub fn push(&mut self, fragment: &str) -> String {
        let mut out = strip_chunk(fragment, !self.started);
        // "see you " + "👋" + " soon" (or "see " + "👋 " + "you"): the spaces on both sides of
        // a removed emoji arrive in different fragments; keep one.
        if (self.emoji_gap || contains_emoji(fragment)) && self.ends_with_space {
            out = out.trim_start().to_owned();
        }
        if !fragment.trim().is_empty() {
            self.emoji_gap =
                fragment.trim_end().chars().next_back().is_some_and(|c| {
                    extends_emoji(c) || contains_emoji(c.encode_utf8(&mut [0; 4]))
                });
        }
        if !out.is_empty() {
            self.started = true;
            self.ends_with_space = out.ends_with(char::is_whitespace);
        }
        out
    }
}

/// Whether `c` continues an emoji cluster (ZWJ, variation selectors, skin tones, keycap,
/// tag characters, the second regional indicator of a flag): a grapheme followed by one of
/// these is not complete yet.
pub(crate) fn extends_emoji(c: char) -> bool {
    matches!(
        u32::from(c),
        0x200D | 0xFE0E | 0xFE0F | 0x1F3FB..=0x1F3FF | 0x20E3 | 0xE0020..=0xE007F
            | 0x1F1E6..=0x1F1FF
    )
}

/// Whether the start of a reply is settled: past its leading emoji clusters (and spaces) a
/// complete grapheme that is not an emoji has arrived. Until then a later delta could still
/// extend an emoji (`👨` + `\u{200D}👩`, `1` + `\u{FE0F}\u{20E3}`), so the text is held back.
pub(crate) fn lead_settled(buf: &str) -> bool {
    let mut rest = buf.trim_start();
    while let Some(found) = leading_emoji(rest) {
        rest = found.rest;
    }
    let mut chars = rest.chars();
    match (chars.next(), chars.next()) {
        (Some(c), Some(next)) => !extends_emoji(c) && !extends_emoji(next),
        _ => false,
    }
}

const VS15: char = '\u{FE0E}';
const VS16: char = '\u{FE0F}';
const ZWJ: char = '\u{200D}';
const KEYCAP: char = '\u{20E3}';

fn is_skin_tone(c: char) -> bool {
    ('\u{1F3FB}'..='\u{1F3FF}').contains(&c)
}

fn is_tag(c: char) -> bool {
    ('\u{E0020}'..='\u{E007F}').contains(&c)
}

fn is_regional_indicator(c: char) -> bool {
    ('\u{1F1E6}'..='\u{1F1FF}').contains(&c)
}

fn is_presentation_or_modifier(c: char) -> bool {
    c == VS15 || c == VS16 || is_skin_tone(c)
}

/// Emoji glue left over on its own (a selector, joiner, modifier or tag with no pictograph).
fn is_stray(c: char) -> bool {
    c == VS16 || c == ZWJ || c == KEYCAP || is_skin_tone(c) || is_tag(c)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Presentation {
    /// Shown as emoji without a selector.
    Emoji,
    /// Text unless followed by U+FE0F.
    Text,
}

fn presentation(c: char) -> Option<Presentation> {
    let cp = u32::from(c);
    match cp {
        0x1F000..=0x1FAFF | 0x2600..=0x27BF => Some(Presentation::Emoji),
        0x231A
        | 0x231B
        | 0x23E9..=0x23EC
        | 0x23F0
        | 0x23F3
        | 0x25FD
        | 0x25FE
        | 0x2B1B
        | 0x2B1C
        | 0x2B50
        | 0x2B55 => Some(Presentation::Emoji),
        0x00A9
        | 0x00AE
        | 0x203C
        | 0x2049
        | 0x2122
        | 0x2139
        | 0x2194..=0x2199
        | 0x21A9
        | 0x21AA
        | 0x2328
        | 0x23CF
        | 0x23ED..=0x23EF
        | 0x23F1
        | 0x23F2
        | 0x23F8..=0x23FA
        | 0x24C2
        | 0x25AA
        | 0x25AB
        | 0x25B6
        | 0x25C0
        | 0x25FB
        | 0x25FC
        | 0x2934
        | 0x2935
        | 0x2B05..=0x2B07
        | 0x3030
        | 0x303D
        | 0x3297
        | 0x3299 => Some(Presentation::Text),
        _ => None,
    }
}

/// Length in bytes of the char at the start of `s` if it satisfies `pred`.
fn next_if(s: &str, pred: impl Fn(char) -> bool) -> Option<usize> {
    s.chars().next().filter(|&c| pred(c)).map(char::len_utf8)
}

/// Length of one emoji element (no ZWJ) at the start of `s`.
fn emoji_element_len(s: &str) -> Option<usize> {
    let first = s.chars().next()?;
    let mut len = first.len_utf8();
    let after = |len: usize| s.get(len..).unwrap_or_default();

    if first.is_ascii_digit() || first == '#' || first == '*' {
        len += next_if(after(len), |c| c == VS16).unwrap_or(0);
        return next_if(after(len), |c| c == KEYCAP).map(|k| len + k);
    }
    if is_regional_indicator(first) {
        return Some(len + next_if(after(len), is_regional_indicator).unwrap_or(0));
    }
    match presentation(first)? {
        Presentation::Text => len += next_if(after(len), |c| c == VS16)?,
        Presentation::Emoji => {
            len += next_if(after(len), |c| c == VS16 || c == VS15).unwrap_or(0);
        }
    }
    len += next_if(after(len), is_skin_tone).unwrap_or(0);
    while let Some(tag) = next_if(after(len), is_tag) {
        len += tag;
    }
    len += next_if(after(len), |c| c == VS16).unwrap_or(0);
    Some(len)
}

/// Length of the emoji cluster (ZWJ sequences included) at the start of `s`.
fn emoji_cluster_len(s: &str) -> Option<usize> {
    let mut len = emoji_element_len(s)?;
    loop {
        let rest = s.get(len..).unwrap_or_default();
        let Some(joiner) = next_if(rest, |c| c == ZWJ) else {
            break;
        };
        match rest.get(joiner..).and_then(emoji_element_len) {
            Some(element) => len += joiner + element,
            None => break,
        }
    }
    Some(len)
}

/// Whether two emoji are the same face, ignoring variation selectors.
fn same_emoji(a: &str, b: &str) -> bool {
    fn base(s: &str) -> impl Iterator<Item = char> + '_ {
        s.trim().chars().filter(|&c| c != VS16 && c != VS15)
    }
    base(a).eq(base(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_face_round_trips_and_names_itself() {
        for (emoji, emotion) in FACES {
            assert_eq!(Emotion::from_emoji(emoji), Some(emotion));
            assert_eq!(Emotion::nearest(emoji), emotion);
            assert_eq!(emotion.emoji(), emoji);
        }
        assert_eq!(Emotion::Happy.as_str(), "happy");
        assert_eq!(Emotion::nearest("😊"), Emotion::Happy);
        assert_eq!(Emotion::nearest("🦀"), Emotion::Neutral);
        assert_eq!(Emotion::from_emoji("🙂\u{FE0F}"), Some(Emotion::Happy));
    }

    #[test]
    fn clusters_cover_zwj_flags_keycaps_and_tones() {
        for emoji in ["👨‍👩‍👧", "🏳️‍🌈", "🇨🇳", "1️⃣", "👍🏽", "❤️", "😶‍🌫️"]
        {
            assert_eq!(emoji_cluster_len(emoji), Some(emoji.len()), "{emoji}");
        }
        for text in ["1", "#", "©", "™", "〰", "中", "，", "a"] {
            assert_eq!(emoji_cluster_len(text), None, "{text}");
        }
        assert_eq!(strip_emoji("a\u{FE0F}b\u{200D}c"), "abc");
        assert_eq!(
            strip_emoji("I ❤️ Rust 🦀 (really) #1"),
            "I Rust (really) #1"
        );
    }

    #[test]
    fn policy_replaces_disallowed_faces_with_its_default() {
        let policy = EmojiPolicy::new(["😊"], "😐");
        let e = policy.expression("🎉 party");
        assert_eq!(
            (e.emoji, e.emotion, e.text, e.defaulted),
            ("😐", Emotion::Neutral, "party", true)
        );
        assert!(!policy.expression("😊\u{FE0F} hi").defaulted);
        assert!(EmojiPolicy::any("🙂").is_allowed("🦀"));
        assert!(!EmojiPolicy::any("🙂").is_allowed("🦀 x"));
    }

    #[test]
    fn streamed_fragments_keep_their_separating_spaces() {
        assert_eq!(strip_chunk("Hello ", false), "Hello ");
        assert_eq!(strip_chunk(" 🎉 ", false), " ");
        assert_eq!(strip_chunk(" 🎉 ", true), "");
        assert_eq!(strip_chunk(" there 👋 ", false), " there ");
        assert!(!lead_settled("👨"));
        assert!(!lead_settled("👨\u{200D}"));
        assert!(lead_settled("👨 Hi"));
        assert!(!lead_settled("1"));
    }
}
