//! Repairs the string escaping of hand-built JSON.
//!
//! The firmware embeds text (tool error messages, names) into JSON without always escaping it.
//! Inside string literals this escapes raw control characters, turns invalid escapes (`\x`, `\'`,
//! a short `\u12`) into a literal backslash, replaces lone UTF-16 surrogates with U+FFFD and
//! replaces invalid UTF-8. Text outside strings is left alone, so structural errors still fail.
//! An unescaped `"` inside a string cannot be told from the string's end and is not repaired.

use std::fmt::Write as _;

/// The repaired text, or `None` when repairing changes nothing.
pub(super) fn repair(json: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(json);
    let mut out = String::with_capacity(text.len() + 16);
    let mut chars = text.chars().peekable();
    let mut in_string = false;
    while let Some(c) = chars.next() {
        if !in_string {
            in_string = c == '"';
            out.push(c);
            continue;
        }
        match c {
            '"' => {
                in_string = false;
                out.push(c);
            }
            '\\' => match chars.peek().copied() {
                Some(e @ ('"' | '\\' | '/' | 'b' | 'f' | 'n' | 'r' | 't')) => {
                    chars.next();
                    out.push('\\');
                    out.push(e);
                }
                Some('u') => {
                    let mut lookahead = chars.clone();
                    lookahead.next();
                    match hex4(&mut lookahead) {
                        Some(unit) => {
                            chars = lookahead;
                            push_unit(&mut out, unit, &mut chars);
                        }
                        None => out.push_str("\\\\"),
                    }
                }
                // An invalid escape or a trailing backslash: keep it as a literal backslash.
                _ => out.push_str("\\\\"),
            },
            c if u32::from(c) < 0x20 => push_control(&mut out, c),
            c => out.push(c),
        }
    }
    (out.as_bytes() != json).then_some(out)
}

/// Whether valid JSON text holds a `\uD800`-`\uDFFF` escape that is not half of a surrogate
/// pair: syntax checks (a raw value) let these through, decoding a string rejects them.
///
/// Outside strings valid JSON has no backslash, so escapes are found without tracking strings.
/// Allocation-free; the search for backslashes is a `memchr`.
pub(super) fn has_lone_surrogate(json: &str) -> bool {
    let bytes = json.as_bytes();
    // The end of the last escape read: a backslash before it is that escape's second character.
    let mut escaped_to = 0;
    for (at, _) in json.match_indices('\\') {
        if at < escaped_to {
            continue;
        }
        escaped_to = at
            + match bytes.get(at..).unwrap_or_default() {
                [b'\\', b'u', a, b, c, d, tail @ ..] => match hex_unit([*a, *b, *c, *d]) {
                    Some(0xD800..=0xDBFF) => match tail {
                        [b'\\', b'u', a, b, c, d, ..]
                            if matches!(hex_unit([*a, *b, *c, *d]), Some(0xDC00..=0xDFFF)) =>
                        {
                            12
                        }
                        _ => return true,
                    },
                    Some(0xDC00..=0xDFFF) => return true,
                    _ => 6,
                },
                _ => 2,
            };
    }
    false
}

/// The value of four ASCII hex digits.
fn hex_unit(digits: [u8; 4]) -> Option<u16> {
    digits.iter().try_fold(0u16, |unit, &digit| {
        let value = char::from(digit).to_digit(16)?;
        Some((unit << 4) | u16::try_from(value).ok()?)
    })
}

/// Reads four hex digits, returning their value and their spelling.
fn hex4(chars: &mut impl Iterator<Item = char>) -> Option<(u16, [char; 4])> {
    let mut unit = 0u16;
    let mut spelling = ['0'; 4];
    for slot in &mut spelling {
        let c = chars.next()?;
        // Four hex digits fit a u16 exactly.
        unit = (unit << 4) | u16::try_from(c.to_digit(16)?).ok()?;
        *slot = c;
    }
    Some((unit, spelling))
}

/// Writes a `\uXXXX` escape as spelled, pairing a high surrogate with a following low one.
fn push_unit<I>(
    out: &mut String,
    (unit, spelling): (u16, [char; 4]),
    chars: &mut std::iter::Peekable<I>,
) where
    I: Iterator<Item = char> + Clone,
{
    let escape = |out: &mut String, spelling: [char; 4]| {
        out.push_str("\\u");
        out.extend(spelling);
    };
    match unit {
        0xD800..=0xDBFF => {
            let mut lookahead = chars.clone();
            let low = match (lookahead.next(), lookahead.next()) {
                (Some('\\'), Some('u')) => hex4(&mut lookahead),
                _ => None,
            };
            match low {
                Some((0xDC00..=0xDFFF, low)) => {
                    *chars = lookahead;
                    escape(out, spelling);
                    escape(out, low);
                }
                _ => out.push('\u{FFFD}'),
            }
        }
        0xDC00..=0xDFFF => out.push('\u{FFFD}'),
        _ => escape(out, spelling),
    }
}

fn push_control(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '\u{8}' => out.push_str("\\b"),
        '\u{c}' => out.push_str("\\f"),
        c => {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{has_lone_surrogate, repair};

    #[test]
    fn valid_json_is_left_alone() {
        assert_eq!(repair(br#"{"a":"b\n\u00e9\ud83d\ude00"}"#), None);
    }

    #[test]
    fn control_characters_and_bad_escapes_are_escaped() {
        let fixed = repair(b"{\"m\":\"line1\nline2\t\\x41 \\u12\"}").unwrap();
        assert_eq!(fixed, r#"{"m":"line1\nline2\t\\x41 \\u12"}"#);
        let value: serde_json::Value = serde_json::from_str(&fixed).unwrap();
        assert_eq!(value["m"], "line1\nline2\t\\x41 \\u12");
    }

    #[test]
    fn lone_surrogates_and_bad_utf8_become_replacement_characters() {
        let fixed = repair(b"{\"m\":\"a\\ud800b\\udc00c\xff\"}").unwrap();
        let value: serde_json::Value = serde_json::from_str(&fixed).unwrap();
        assert_eq!(value["m"], "a\u{FFFD}b\u{FFFD}c\u{FFFD}");
    }

    #[test]
    fn lone_surrogates_are_found_exactly() {
        for lone in [
            r#"{"m":"\ud800"}"#,
            r#"{"m":"\uDBFFx"}"#,
            r#"{"m":"\udc00"}"#,
            r#"{"m":"a\ud83d\u0041"}"#,
            r#"{"m":"\ud83d\ude00\ude00"}"#,
            r#"["\\", "\ud800"]"#,
            r#""\ud83d""#,
        ] {
            assert!(has_lone_surrogate(lone), "{lone}");
            assert!(repair(lone.as_bytes()).is_some(), "{lone}");
        }
        for fine in [
            r#"{"m":"plain"}"#,
            r#"{"m":"\ud83d\ude00 \uD83D\uDE00"}"#,
            r#"{"m":"\\ud800 \\\\udc00"}"#,
            r#"{"m":"\u00e9\n\"\\\/\ue000\ud7ff"}"#,
            r#"{"m":"\\"}"#,
        ] {
            assert!(!has_lone_surrogate(fine), "{fine}");
            assert_eq!(repair(fine.as_bytes()), None, "{fine}");
        }
    }

    proptest::proptest! {
        /// On valid JSON, the only thing `repair` changes is a lone surrogate.
        #[test]
        fn lone_surrogate_check_agrees_with_repair(
            parts in proptest::collection::vec(proptest::sample::select(vec![
                r"\ud83d", r"\uDE00", r"\udbff", r"\udc00", r"\\", r"\\u", r"\u0041", r"\n",
                r"\/", "a", "u", "d800", "\u{e9}", "\u{1F600}",
            ]), 0..12),
        ) {
            let json = format!(r#"{{"m":"{}"}}"#, parts.concat());
            let value: serde_json::Value = match serde_json::from_str(&json) {
                Ok(value) => value,
                Err(_) => {
                    proptest::prop_assert!(has_lone_surrogate(&json), "{}", json);
                    return Ok(());
                }
            };
            proptest::prop_assert!(!has_lone_surrogate(&json), "{} {}", json, value);
            proptest::prop_assert_eq!(repair(json.as_bytes()), None);
        }
    }

    #[test]
    fn control_characters_outside_strings_are_not_touched() {
        assert_eq!(repair(b"{\"a\":\n1}"), None);
    }
}
