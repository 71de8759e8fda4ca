//! A single-pass reader for the transcript events exactly as Retell writes them.
//!
//! `response_required`, `reminder_required` and `update_only` are the big, frequent frames:
//! every one carries the whole transcript so far, word timings included. Through serde each
//! word costs a generic map visit, three key matches and two float parses; this reader walks
//! the bytes once for the one shape Retell sends.
//!
//! It never decides anything on its own. Values outside the words-and-numbers core (the
//! tool-call transcript, keys it does not know) are handed to serde in place; and whenever the
//! frame strays from the shape (an escape in a string, a repeated key, an exponent, a tag it
//! does not handle, malformed JSON…) it returns `None` and the serde decoder reads the whole
//! frame, with all its tolerance and its precise errors. What it does return is what serde
//! would have built: the property tests below and the `retell_events` fuzz target compare the
//! two.

use std::borrow::Cow;

use serde::Deserialize;

use crate::retell_event::{INTERACTION_TYPE, ResponseRequest, RetellEvent, UpdateOnly};
use crate::transcript::{Role, TranscriptItem, TurnTaking, Utterance, Word};

/// Reads `text` when it is a transcript event in Retell's own shape; `None` hands it to serde.
pub(crate) fn decode(text: &str) -> Option<RetellEvent> {
    let mut c = Cursor { text, at: 0 };
    let mut tag = None;
    let mut response_id = None;
    let mut transcript = None;
    let mut tool_calls = None;
    let mut turntaking = None;
    c.object(|c, key| {
        match key {
            INTERACTION_TYPE if tag.is_none() => {
                tag = Some(match &*c.string()? {
                    "response_required" => Tag::ResponseRequired,
                    "reminder_required" => Tag::ReminderRequired,
                    "update_only" => Tag::UpdateOnly,
                    _ => return None,
                });
            }
            "response_id" if response_id.is_none() => response_id = Some(c.integer()?),
            "transcript" if transcript.is_none() => {
                transcript = Some(c.or_null(|c| c.array(16, Cursor::utterance))?);
            }
            // Irregular (unknown roles keep every field): serde's own reader, in place.
            "transcript_with_tool_calls" if tool_calls.is_none() => {
                let start = c.at;
                tool_calls = Some(c.serde::<Option<Vec<TranscriptItem>>>()?);
                // serde_json caps nesting at 127 levels, this value's own included; read on its
                // own it had one level more room than inside the frame. Leave the edge to serde.
                if nesting(text.as_bytes().get(start..c.at)?) > MAX_DELEGATED_NESTING {
                    return None;
                }
            }
            "turntaking" if turntaking.is_none() => {
                turntaking = Some(c.or_null(|c| c.string().map(|s| TurnTaking::from_wire(&s)))?);
            }
            // A repeat of a field serde reads is an error there: let serde report it.
            INTERACTION_TYPE
            | "response_id"
            | "transcript"
            | "transcript_with_tool_calls"
            | "turntaking" => return None,
            _ => c.skip()?,
        }
        Some(())
    })?;
    c.skip_whitespace();
    if c.at != text.len() {
        return None;
    }
    // Fields the event does not have are ignored, as serde ignores them; they were well formed.
    let transcript = transcript.flatten().unwrap_or_default();
    let transcript_with_tool_calls = tool_calls.flatten();
    Some(match tag? {
        Tag::ResponseRequired | Tag::ReminderRequired => {
            let body = ResponseRequest {
                response_id: response_id?,
                transcript,
                transcript_with_tool_calls,
            };
            if matches!(tag, Some(Tag::ResponseRequired)) {
                RetellEvent::ResponseRequired(body)
            } else {
                RetellEvent::ReminderRequired(body)
            }
        }
        Tag::UpdateOnly => RetellEvent::UpdateOnly(UpdateOnly {
            transcript,
            transcript_with_tool_calls,
            turntaking: turntaking.flatten(),
        }),
    })
}

#[derive(Clone, Copy)]
enum Tag {
    ResponseRequired,
    ReminderRequired,
    UpdateOnly,
}

/// Powers of ten that are exact in an `f64`.
const POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

/// Nesting up to which a value serde reads on its own reads the same inside the frame
/// (serde_json allows 127 levels in all).
const MAX_DELEGATED_NESTING: usize = 100;

/// How deeply arrays and objects nest in well-formed JSON.
fn nesting(json: &[u8]) -> usize {
    let (mut depth, mut max) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &b in json {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
        } else {
            match b {
                b'"' => in_string = true,
                b'[' | b'{' => {
                    depth += 1;
                    max = max.max(depth);
                }
                b']' | b'}' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
    }
    max
}

/// Below this a `u64` converts to `f64` exactly.
const EXACT_INT: u64 = 1 << 53;

/// A position in the frame. Every method returns `None` to give up.
struct Cursor<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Cursor<'a> {
    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.text.as_bytes().get(self.at) {
            self.at += 1;
        }
    }

    /// The next byte that is not whitespace, not consumed.
    fn peek(&mut self) -> Option<u8> {
        self.skip_whitespace();
        self.text.as_bytes().get(self.at).copied()
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    /// `null` (then `Some(None)`) or whatever `value` reads.
    fn or_null<T>(&mut self, value: impl FnOnce(&mut Self) -> Option<T>) -> Option<Option<T>> {
        if self.peek()? == b'n' {
            let rest = self.text.as_bytes().get(self.at..)?;
            if !rest.starts_with(b"null") {
                return None;
            }
            self.at += 4;
            return Some(None);
        }
        value(self).map(Some)
    }

    /// One value read by serde's own reader, from where the cursor stands.
    fn serde<T: Deserialize<'a>>(&mut self) -> Option<T> {
        let rest = self.text.get(self.at..)?;
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<T>();
        let value = values.next()?.ok()?;
        self.at += values.byte_offset();
        Some(value)
    }

    /// Steps over a value serde would ignore (it must still be well formed).
    fn skip(&mut self) -> Option<()> {
        self.serde::<serde::de::IgnoredAny>().map(drop)
    }

    /// A string without escapes, borrowed from the frame; `None` otherwise, with the cursor
    /// still at the string.
    fn borrowed(&mut self) -> Option<&'a str> {
        if self.peek()? != b'"' {
            return None;
        }
        let start = self.at + 1;
        let len = self
            .text
            .as_bytes()
            .get(start..)?
            .iter()
            .position(|&b| matches!(b, b'"' | b'\\' | 0..=0x1f))?;
        let end = start + len;
        if self.text.as_bytes().get(end) != Some(&b'"') {
            return None;
        }
        self.at = end + 1;
        // Both ends sit next to an ASCII quote, so this never fails on a `&str`.
        self.text.get(start..end)
    }

    /// A string, borrowed from the frame, or unescaped by serde when it has escapes (serde
    /// also rejects raw control characters).
    fn string(&mut self) -> Option<Cow<'a, str>> {
        match self.borrowed() {
            Some(s) => Some(Cow::Borrowed(s)),
            None => self.escaped().map(Cow::Owned),
        }
    }

    /// A string or `null` (then empty), as `T`; escapes go through serde.
    fn text<T: From<&'a str> + From<String> + Default>(&mut self) -> Option<T> {
        if let Some(s) = self.borrowed() {
            return Some(T::from(s));
        }
        match self.or_null(Self::escaped)? {
            Some(s) => Some(T::from(s)),
            None => Some(T::default()),
        }
    }

    /// A string with escapes, which serde reads (or refuses).
    #[cold]
    fn escaped(&mut self) -> Option<String> {
        if self.peek()? != b'"' {
            return None;
        }
        self.serde::<String>()
    }

    /// Digits up to the first non-digit: their value (`None` past [`EXACT_INT`]) and count.
    fn digits(&mut self, mut value: u64) -> Option<(u64, usize)> {
        let start = self.at;
        while let Some(&b @ b'0'..=b'9') = self.text.as_bytes().get(self.at) {
            // Cannot overflow: `value` was below 2^53 before this digit.
            value = value * 10 + u64::from(b - b'0');
            if value >= EXACT_INT {
                return None;
            }
            self.at += 1;
        }
        Some((value, self.at - start))
    }

    /// A non-negative integer part as JSON allows it (no leading zeros).
    fn integer(&mut self) -> Option<u64> {
        match self.peek()? {
            b'0' => {
                self.at += 1;
                // `01` is not JSON.
                if let Some(b'0'..=b'9') = self.text.as_bytes().get(self.at) {
                    return None;
                }
                Some(0)
            }
            b'1'..=b'9' => self.digits(0).map(|(v, _)| v),
            _ => None,
        }
    }

    /// Seconds: a non-negative number without exponent, short enough that one division by an
    /// exact power of ten gives the correctly rounded value (what serde_json computes too).
    fn seconds(&mut self) -> Option<f64> {
        let int = self.integer()?;
        let (significand, decimals) = if self.text.as_bytes().get(self.at) == Some(&b'.') {
            self.at += 1;
            let (v, n) = self.digits(int)?;
            if n == 0 {
                return None;
            }
            (v, n)
        } else {
            (int, 0)
        };
        #[allow(clippy::cast_precision_loss)] // below EXACT_INT: exact
        let f = significand as f64;
        Some(f / POW10.get(decimals)?)
    }

    /// `{ "key": value, ... }`, each value read by `field` (which returns `None` to give up).
    fn object(&mut self, mut field: impl FnMut(&mut Self, &'a str) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        if self.peek()? == b'}' {
            self.at += 1;
            return Some(());
        }
        loop {
            // A key with escapes is left to serde with the rest of the frame.
            let key = self.borrowed()?;
            self.eat(b':')?;
            field(self, key)?;
            match self.peek()? {
                b',' => self.at += 1,
                b'}' => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// `[ item, ... ]` into a vector with room for `capacity` items.
    fn array<T>(
        &mut self,
        capacity: usize,
        mut item: impl FnMut(&mut Self) -> Option<T>,
    ) -> Option<Vec<T>> {
        self.eat(b'[')?;
        let mut out = Vec::with_capacity(capacity);
        if self.peek()? == b']' {
            self.at += 1;
            return Some(out);
        }
        loop {
            out.push(item(self)?);
            match self.peek()? {
                b',' => self.at += 1,
                b']' => {
                    self.at += 1;
                    return Some(out);
                }
                _ => return None,
            }
        }
    }

    fn utterance(&mut self) -> Option<Utterance> {
        let mut u = Utterance::default();
        let (mut role, mut content, mut words) = (false, false, false);
        self.object(|c, key| {
            match key {
                "role" if !role => {
                    role = true;
                    u.role = c
                        .or_null(Self::string)?
                        .map_or_else(Role::default, |s| Role::from_wire(&s));
                }
                "content" if !content => {
                    content = true;
                    u.content = c.text()?;
                }
                "words" if !words => {
                    words = true;
                    u.words = c.or_null(|c| c.array(16, Self::word))?;
                }
                "role" | "content" | "words" => return None,
                _ => c.skip()?,
            }
            Some(())
        })?;
        Some(u)
    }

    fn word(&mut self) -> Option<Word> {
        let mut w = Word::default();
        let (mut word, mut start, mut end) = (false, false, false);
        self.object(|c, key| {
            match key {
                "word" if !word => {
                    word = true;
                    w.word = c.text()?;
                }
                "start" if !start => {
                    start = true;
                    w.start = c.or_null(Self::seconds)?.unwrap_or_default();
                }
                "end" if !end => {
                    end = true;
                    w.end = c.or_null(Self::seconds)?.unwrap_or_default();
                }
                "word" | "start" | "end" => return None,
                _ => c.skip()?,
            }
            Some(())
        })?;
        Some(w)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use proptest::prelude::*;

    use super::decode;
    use crate::RetellEvent;

    const GOLDEN: &str = include_str!("../tests/data/response_required_10_utterances.json");

    /// What serde makes of `text`, as text: `Debug` tells `-0.0` from `0.0`, `==` does not.
    fn by_serde(text: &str) -> Option<String> {
        RetellEvent::by_serde(text).ok().map(|ev| format!("{ev:?}"))
    }

    /// The fast reader agrees with serde whenever it answers.
    fn agrees(text: &str) -> Result<(), TestCaseError> {
        if let Some(ev) = decode(text) {
            prop_assert_eq!(Some(format!("{ev:?}")), by_serde(text), "{}", text);
        }
        Ok(())
    }

    #[test]
    fn the_benchmark_frame_takes_the_fast_path_and_matches_serde() {
        let fast = decode(GOLDEN).unwrap();
        assert_eq!(Some(format!("{fast:?}")), by_serde(GOLDEN));
        // Pretty-printed, with the tag last and an unknown key: still fast, still the same.
        let mut v: serde_json::Value = serde_json::from_str(GOLDEN).unwrap();
        let o = v.as_object_mut().unwrap();
        let tag = o.remove("interaction_type").unwrap();
        o.insert(
            "x_new".into(),
            serde_json::json!({"deep": [1, {"a": null}]}),
        );
        o.insert("interaction_type".into(), tag);
        let pretty = serde_json::to_string_pretty(&v).unwrap();
        assert_eq!(
            format!("{:?}", decode(&pretty).unwrap()),
            format!("{fast:?}")
        );
    }

    #[test]
    fn unusual_frames_are_left_to_serde() {
        for text in [
            "",
            "{}",
            "[]",
            r#"{"interaction_type":"ping_pong","timestamp":1}"#,
            r#"{"interaction_type":"call_details","call":{}}"#,
            r#"{"interaction_type":"sentiment","transcript":[]}"#,
            r#"{"interaction_type":null,"response_id":1}"#,
            // Missing or odd response ids are serde's to report.
            r#"{"interaction_type":"response_required","transcript":[]}"#,
            r#"{"interaction_type":"response_required","response_id":1.0}"#,
            r#"{"interaction_type":"response_required","response_id":01}"#,
            r#"{"interaction_type":"response_required","response_id":-1}"#,
            r#"{"interaction_type":"response_required","response_id":null}"#,
            r#"{"interaction_type":"response_required","response_id":1,"response_id":2}"#,
            // Raw control characters, exponents, negative or overlong numbers.
            "{\"interaction_type\":\"update_only\",\"transcript\":[{\"content\":\"a\tb\"}]}",
            r#"{"interaction_type":"update_only","transcript":[{"role":"user","words":[{"start":1e3}]}]}"#,
            r#"{"interaction_type":"update_only","transcript":[{"role":"user","words":[{"start":-0.5}]}]}"#,
            r#"{"interaction_type":"update_only","transcript":[{"role":"user","words":[{"start":0.12345678901234567}]}]}"#,
            r#"{"interaction_type":"update_only","transcript":[{"role":"user","words":[{"end":1.}]}]}"#,
            r#"{"interaction_type":"update_only","transcript":[{"role":"user","role":"agent"}]}"#,
            r#"{"interaction_type":"update_only","transcript":[]} trailing"#,
            r#"{"interaction_type":"update_only","transcript":[],}"#,
            r#"{"interaction_type":"update_only","transcript":[nul]}"#,
        ] {
            assert!(decode(text).is_none(), "{text}");
        }
    }

    #[test]
    fn nulls_and_unknown_keys_match_serde() {
        for text in [
            r#"{"interaction_type":"update_only","transcript":null,"turntaking":null}"#,
            r#"{"interaction_type":"update_only","turntaking":"both_turn","response_id":3}"#,
            r#"{"interaction_type":"response_required","response_id":0,"turntaking":"x",
                "transcript":[{"role":null,"content":null,"words":null,"x":[{}]},
                {"words":[{"word":null,"start":null,"end":null,"conf":0.9},{}]}]}"#,
            r#"{"interaction_type":"reminder_required","response_id":9,"transcript_with_tool_calls":[
                {"role":"tool_call_invocation","tool_call_id":"t","name":"f","arguments":"{}"},
                {"role":"dtmf","digit":"7"},{"role":"user","content":"hi"}],"transcript":[]}"#,
            r#"{"interaction_type":"update_only","transcript_with_tool_calls":null}"#,
            // Escapes in values.
            r#"{"interaction_type":"update_\u006fnly","transcript":[{"role":"user","content":
                "\"caf\u00e9\" \\ \ud83d\ude00","words":[{"word":"\"caf\u00e9\"","start":1}]}]}"#,
        ] {
            let fast = decode(text).unwrap_or_else(|| panic!("not fast: {text}"));
            assert_eq!(Some(format!("{fast:?}")), by_serde(text), "{text}");
        }
    }

    #[test]
    fn tool_calls_nested_to_serde_limit_are_left_to_serde() {
        // 125 levels inside an item: over serde_json's limit in the frame, not on their own.
        let deep = format!("{}{}", "[".repeat(125), "]".repeat(125));
        let calls = format!(r#"[{{"role":"x","v":{deep}}}]"#);
        assert!(serde_json::from_str::<Vec<crate::TranscriptItem>>(&calls).is_ok());
        let text =
            format!(r#"{{"interaction_type":"update_only","transcript_with_tool_calls":{calls}}}"#);
        assert!(by_serde(&text).is_none(), "serde_json's limit moved");
        assert!(decode(&text).is_none());
    }

    /// JSON whitespace, sometimes.
    fn ws() -> impl Strategy<Value = &'static str> {
        prop_oneof![8 => Just(""), 1 => Just(" "), 1 => Just("\n  "), 1 => Just("\t\r\n")]
    }

    /// Seconds as Retell writes them, and now and then as it does not.
    fn seconds() -> BoxedStrategy<String> {
        prop_oneof![
            12 => (0u32..100_000, 0u32..1_000_000).prop_map(|(s, f)| format!("{s}.{f:06}")),
            4 => (0u32..100_000, 0u32..1000).prop_map(|(s, f)| format!("{s}.{f}")),
            2 => (0u32..1000).prop_map(|n| n.to_string()),
            1 => any::<f64>().prop_map(|f| f.abs().to_string()),
            1 => any::<f64>().prop_map(|f| format!("{f:e}")),
            1 => "-?(0|[1-9][0-9]{0,20})(\\.[0-9]{1,25})?([eE][+-]?[0-9]{1,3})?",
            1 => "0[0-9]{1,3}(\\.[0-9])?|[0-9]\\.|-0|-0\\.0",
            1 => Just("null".to_owned()),
        ]
        .boxed()
    }

    fn response_id() -> BoxedStrategy<String> {
        prop_oneof![
            12 => (0u32..100_000).prop_map(|n| n.to_string()),
            2 => any::<u64>().prop_map(|n| n.to_string()),
            1 => seconds(),
        ]
        .boxed()
    }

    /// Strings, mostly plain, now and then with what JSON escapes (or not a string).
    fn string() -> BoxedStrategy<String> {
        prop_oneof![
            24 => "[a-zA-Z,.?'! ]{0,12}".prop_map(|s| format!("\"{s}\"")),
            2 => "\\PC{0,6}".prop_map(|s| serde_json::to_string(&s).unwrap()),
            1 => Just(r#""caf\u00e9 \"x\" \\""#.to_owned()),
            1 => Just("\"tab\there\"".to_owned()),
            1 => Just("null".to_owned()),
            1 => Just("7".to_owned()),
        ]
        .boxed()
    }

    /// Any small JSON value, for keys the reader does not know.
    fn value() -> BoxedStrategy<String> {
        prop_oneof![
            4 => seconds(),
            4 => string(),
            2 => Just("[]".to_owned()),
            2 => Just(r#"{"a":[1,{"b":"}"}],"c":true}"#.to_owned()),
            1 => Just("[1,".to_owned()),
        ]
        .boxed()
    }

    /// `{k: v, ...}` with random whitespace.
    fn object(fields: &[(String, String)], ws: &[&'static str]) -> String {
        let mut ws = ws.iter().copied().cycle();
        let mut w = || ws.next().unwrap_or("");
        let mut out = format!("{{{}", w());
        for (i, (k, v)) in fields.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&format!("{}\"{k}\"{}:{}{v}{}", w(), w(), w(), w()));
        }
        out.push('}');
        out
    }

    #[allow(clippy::needless_pass_by_value)] // the shape `prop_map` wants
    fn array(items: Vec<String>) -> String {
        format!("[{}]", items.join(","))
    }

    /// Most of `keys` in any order, now and then a repeat or a key nobody knows.
    fn fields(
        keys: &'static [&'static str],
        value_of: fn(&'static str) -> BoxedStrategy<String>,
    ) -> BoxedStrategy<String> {
        let known: Vec<_> = keys
            .iter()
            .map(|&k| {
                prop::option::weighted(0.85, value_of(k).prop_map(move |v| (k.to_owned(), v)))
            })
            .collect();
        let unknown = prop::option::weighted(0.1, ("x_[a-z]{0,4}", value()));
        let repeat = prop::option::weighted(
            0.03,
            prop::sample::select(keys)
                .prop_flat_map(move |k| value_of(k).prop_map(move |v| (k.to_owned(), v))),
        );
        (known, unknown, repeat, prop::collection::vec(ws(), 8))
            .prop_flat_map(|(known, unknown, repeat, ws)| {
                let fields: Vec<_> = known
                    .into_iter()
                    .flatten()
                    .chain(unknown)
                    .chain(repeat)
                    .collect();
                Just(fields)
                    .prop_shuffle()
                    .prop_map(move |f| object(&f, &ws))
            })
            .boxed()
    }

    fn word() -> BoxedStrategy<String> {
        fields(&["word", "start", "end"], |k| match k {
            "word" => string(),
            _ => seconds(),
        })
    }

    fn utterance() -> BoxedStrategy<String> {
        fields(&["role", "content", "words"], |k| {
            match k {
            "role" => prop_oneof![3 => Just("\"agent\"".to_owned()), 3 => Just("\"user\"".to_owned()), 1 => string()].boxed(),
            "content" => string(),
            _ => prop_oneof![
                16 => prop::collection::vec(word(), 0..5).prop_map(array),
                1 => Just("null".to_owned()),
                1 => value(),
            ]
            .boxed(),
        }
        })
    }

    fn frame() -> impl Strategy<Value = String> {
        let keys = &[
            "interaction_type",
            "response_id",
            "transcript",
            "turntaking",
            "transcript_with_tool_calls",
        ];
        (
            fields(keys, |k| match k {
                "interaction_type" => prop_oneof![
                    6 => Just("\"response_required\"".to_owned()),
                    4 => Just("\"reminder_required\"".to_owned()),
                    4 => Just("\"update_only\"".to_owned()),
                    1 => Just("\"ping_pong\"".to_owned()),
                    1 => string(),
                ]
                .boxed(),
                "response_id" => response_id(),
                "transcript" => prop_oneof![
                    16 => prop::collection::vec(utterance(), 0..4).prop_map(array),
                    1 => value(),
                ]
                .boxed(),
                "turntaking" => prop_oneof![
                    Just("\"agent_turn\"".to_owned()),
                    Just("\"user_turn\"".to_owned()),
                    string(),
                ]
                .boxed(),
                _ => prop_oneof![
                    2 => Just("null".to_owned()),
                    2 => Just(r#"[{"role":"tool_call_result","tool_call_id":"t","content":"ok"}]"#.to_owned()),
                    2 => Just(r#"[{"role":"agent","content":"hi","words":[{"word":"hi","start":0.5}]}]"#.to_owned()),
                    1 => Just(r#"[{"role":"agent","content":5}]"#.to_owned()),
                    1 => value(),
                ]
                .boxed(),
            }),
            prop_oneof![16 => Just(""), 1 => Just(" \n"), 1 => Just("x"), 1 => Just("}")],
        )
            .prop_map(|(f, tail)| f + tail)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn fast_reader_agrees_with_serde(text in frame()) {
            agrees(&text)?;
        }

        #[test]
        fn fast_reader_agrees_on_cut_frames(text in frame(), cut in any::<prop::sample::Index>()) {
            let end = cut.index(text.len() + 1);
            if let Some(prefix) = text.get(..end) {
                agrees(prefix)?;
            }
        }

        #[test]
        fn fast_reader_agrees_on_encoded_events(
            id in any::<u64>(),
            words in prop::collection::vec(("[a-zA-Z',.?]{0,30}", 0u32..10_000_000, 0u32..10_000_000), 0..40),
        ) {
            let words: Vec<crate::Word> = words
                .into_iter()
                .map(|(w, s, e)| crate::Word {
                    word: w.into(),
                    start: f64::from(s) / 1000.0,
                    end: f64::from(e) / 1000.0,
                })
                .collect();
            let ev = RetellEvent::ResponseRequired(crate::ResponseRequest {
                response_id: id,
                transcript: vec![crate::Utterance {
                    role: crate::Role::User,
                    content: "hello".into(),
                    words: Some(words),
                }],
                transcript_with_tool_calls: None,
            });
            let wire = ev.to_json().unwrap();
            // Our own encoding of ordinary frames is the shape the fast reader is for.
            if id < super::EXACT_INT {
                prop_assert!(decode(&wire).is_some(), "{}", wire);
            }
            agrees(&wire)?;
        }
    }
}
