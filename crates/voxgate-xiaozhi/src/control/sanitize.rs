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
    use super::repair;

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
    fn control_characters_outside_strings_are_not_touched() {
        assert_eq!(repair(b"{\"a\":\n1}"), None);
    }
}
