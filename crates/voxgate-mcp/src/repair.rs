//! Repair of JSON whose strings were written without escaping.
//!
//! The Xiaozhi firmware concatenates strings into JSON, so an error message that quotes the
//! offending argument arrives as `"message":"Invalid: "volume" too big"`, and messages may hold
//! raw newlines or Windows paths with lone backslashes. The repair walks the text once, tracks
//! whether a string is a key or a value, and decides for every `"` inside a string whether it
//! really ends the string by looking at what follows (a key must be followed by `:`, a value by
//! `,` + the start of the next member, `}`, `]` or the end). Everything else is escaped.

/// Returns repaired JSON text, or `None` when nothing needed repairing (so the caller's strict
/// parse error stands). The output is valid UTF-8 (invalid input bytes become U+FFFD).
pub fn repair_json(input: &[u8]) -> Option<Vec<u8>> {
    let text = String::from_utf8_lossy(input);
    let s = text.as_bytes();
    let mut out = Vec::with_capacity(s.len() + 16);
    // Open containers: b'{' or b'['.
    let mut stack: Vec<u8> = Vec::new();
    let mut expect_key = false;
    let mut in_string = false;
    let mut is_key = false;
    let mut i = 0;
    while i < s.len() {
        let b = s[i];
        if !in_string {
            match b {
                b'"' => {
                    in_string = true;
                    is_key = expect_key && stack.last() == Some(&b'{');
                }
                b'{' => {
                    stack.push(b'{');
                    expect_key = true;
                }
                b'[' => {
                    stack.push(b'[');
                    expect_key = false;
                }
                b'}' | b']' => {
                    stack.pop();
                    expect_key = false;
                }
                b',' => expect_key = stack.last() == Some(&b'{'),
                b':' => expect_key = false,
                _ => {}
            }
            out.push(b);
            i += 1;
            continue;
        }
        match b {
            b'\\' => match s.get(i + 1) {
                Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
                    out.extend_from_slice(&s[i..i + 2]);
                    i += 2;
                }
                Some(b'u')
                    if s.get(i + 2..i + 6)
                        .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) =>
                {
                    out.extend_from_slice(&s[i..i + 6]);
                    i += 6;
                }
                // A lone backslash stands for itself.
                _ => {
                    out.extend_from_slice(b"\\\\");
                    i += 1;
                }
            },
            b'"' => {
                if closes_string(s, i + 1, is_key, stack.last().copied()) {
                    in_string = false;
                    if is_key {
                        expect_key = false;
                    }
                    out.push(b'"');
                } else {
                    out.extend_from_slice(b"\\\"");
                }
                i += 1;
            }
            b'\n' => {
                out.extend_from_slice(b"\\n");
                i += 1;
            }
            b'\r' => {
                out.extend_from_slice(b"\\r");
                i += 1;
            }
            b'\t' => {
                out.extend_from_slice(b"\\t");
                i += 1;
            }
            c if c < 0x20 => {
                out.extend_from_slice(format!("\\u{c:04x}").as_bytes());
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    (out.as_slice() != input).then_some(out)
}

/// Does a `"` whose next byte is at `at` end the current string?
fn closes_string(s: &[u8], at: usize, is_key: bool, container: Option<u8>) -> bool {
    let Some(j) = skip_ws(s, at) else {
        return true;
    };
    if is_key {
        return s[j] == b':';
    }
    match s[j] {
        b'}' | b']' => true,
        b',' => match skip_ws(s, j + 1) {
            None => false,
            Some(k) => match container {
                // In an object the next member starts with its key.
                Some(b'{') => s[k] == b'"',
                _ => matches!(
                    s[k],
                    b'"' | b'{' | b'[' | b'-' | b'0'..=b'9' | b't' | b'f' | b'n'
                ),
            },
        },
        _ => false,
    }
}

fn skip_ws(s: &[u8], mut i: usize) -> Option<usize> {
    while i < s.len() && s[i].is_ascii_whitespace() {
        i += 1;
    }
    (i < s.len()).then_some(i)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::repair_json;

    fn repaired(s: &str) -> Value {
        serde_json::from_slice(&repair_json(s.as_bytes()).expect("needs repair")).unwrap()
    }

    #[test]
    fn inner_quotes_are_escaped() {
        let v = repaired(
            r#"{"jsonrpc":"2.0","id":3,"error":{"message":"Invalid argument "volume": must be <= 100"}}"#,
        );
        assert_eq!(
            v["error"]["message"],
            "Invalid argument \"volume\": must be <= 100"
        );
        assert_eq!(v["id"], 3);
    }

    #[test]
    fn raw_control_characters_and_lone_backslashes() {
        let v = repaired("{\"message\":\"line one\nline\ttwo C:\\temp\\x \u{1}\"}");
        assert_eq!(v["message"], "line one\nline\ttwo C:\temp\\x \u{1}");
    }

    #[test]
    fn quote_followed_by_comma_inside_a_value() {
        let v = repaired(r#"{"a":"say "hi", then go","b":[ "x"y", 1]}"#);
        assert_eq!(v["a"], "say \"hi\", then go");
        assert_eq!(v["b"], json!(["x\"y", 1]));
    }

    #[test]
    fn valid_json_needs_no_repair() {
        assert!(repair_json(br#"{"a":"b\"c","d":[1,2,{"e":null}]}"#).is_none());
    }

    /// A quote followed (after blanks) by `}`, `]`, `,` or the end really is ambiguous.
    fn ambiguous(text: &str) -> bool {
        let b = text.as_bytes();
        b.iter().enumerate().any(|(i, &c)| {
            c == b'"'
                && matches!(
                    b[i + 1..].iter().find(|x| !x.is_ascii_whitespace()),
                    None | Some(b'}' | b']' | b',')
                )
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any message text the firmware could concatenate in comes back intact, as long as no
        /// quote inside it is followed by something that looks like the end of a value.
        #[test]
        fn concatenated_messages_round_trip(text in "[a-zA-Z0-9 \"\n\t:.{}\\[\\],_-]{0,40}") {
            prop_assume!(!ambiguous(&text));
            let raw = format!(r#"{{"jsonrpc":"2.0","id":1,"error":{{"message":"{text}"}}}}"#);
            let fixed = repair_json(raw.as_bytes()).unwrap_or_else(|| raw.clone().into_bytes());
            let v: Value = serde_json::from_slice(&fixed).unwrap();
            prop_assert_eq!(v["error"]["message"].as_str(), Some(text.as_str()));
            prop_assert_eq!(&v["id"], &json!(1));
        }

        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = repair_json(&bytes);
        }
    }
}
