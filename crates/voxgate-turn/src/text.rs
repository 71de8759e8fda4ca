//! Word counting and word-aligned cutting, for min-words interruption and heard-text truncation.

/// Scripts written without spaces: every character is a word of its own.
fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x3040..=0x30FF      // Hiragana, Katakana
        | 0x3400..=0x4DBF    // CJK Extension A
        | 0x4E00..=0x9FFF    // CJK Unified Ideographs
        | 0xAC00..=0xD7AF    // Hangul syllables
        | 0xF900..=0xFAFF    // CJK Compatibility Ideographs
        | 0x20000..=0x2FA1F) // Extensions B.. and compatibility supplement
}

fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '\'' || c == '’'
}

/// Byte offsets just past the end of each word, in order.
fn word_ends(text: &str) -> impl Iterator<Item = (usize, usize)> + '_ {
    // Yields (char index of the end, byte index of the end).
    let mut chars = text.char_indices().enumerate().peekable();
    std::iter::from_fn(move || {
        while let Some((ci, (bi, c))) = chars.next() {
            let end = (ci + 1, bi + c.len_utf8());
            if is_cjk(c) {
                return Some(end);
            }
            if is_word_char(c) {
                let next_continues = chars
                    .peek()
                    .is_some_and(|&(_, (_, n))| is_word_char(n) && !is_cjk(n));
                if !next_continues {
                    return Some(end);
                }
            }
        }
        None
    })
}

/// Number of words in `text` (CJK characters count one each).
pub(crate) fn word_count(text: &str) -> usize {
    word_ends(text).count()
}

/// The longest prefix of `text` ending at a word end that lies within the first
/// `num / den` of its characters. Never returns a word that was not entirely covered.
pub(crate) fn word_prefix(text: &str, num: u128, den: u128) -> &str {
    if den == 0 || num >= den {
        return text;
    }
    let total = text.chars().count() as u128;
    let limit = total.saturating_mul(num) / den;
    let mut cut = 0;
    for (ci, bi) in word_ends(text) {
        if ci as u128 > limit {
            break;
        }
        cut = bi;
    }
    &text[..cut]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_latin_and_cjk_words() {
        assert_eq!(word_count(""), 0);
        assert_eq!(word_count("  ...  "), 0);
        assert_eq!(word_count("Hello, world!"), 2);
        assert_eq!(word_count("don't stop"), 2);
        assert_eq!(word_count("你好世界"), 4);
        assert_eq!(word_count("ok 你好"), 3);
    }

    #[test]
    fn prefix_only_keeps_whole_words() {
        let t = "one two three";
        assert_eq!(word_prefix(t, 0, 10), "");
        assert_eq!(word_prefix(t, 2, 13), "");
        assert_eq!(word_prefix(t, 3, 13), "one");
        assert_eq!(word_prefix(t, 6, 13), "one");
        assert_eq!(word_prefix(t, 7, 13), "one two");
        assert_eq!(word_prefix(t, 12, 13), "one two");
        assert_eq!(word_prefix(t, 13, 13), t);
        assert_eq!(word_prefix("你好世界", 1, 2), "你好");
    }
}
