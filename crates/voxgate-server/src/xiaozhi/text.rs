//! Text decisions of the Xiaozhi door: what a device's screen shows of a transcript, and
//! which `listen detect` texts are wake words.

/// `text` without NoAsr's markers (an utterance the VAD split in parts has one per part),
/// whitespace collapsed: with no recognizer configured the model is told how much speech it
/// missed, but the device's screen has nothing sensible to show.
pub(super) fn without_no_asr_markers(text: &str) -> String {
    let marker = voxgate_providers::no_asr_marker(0.0);
    let Some((prefix, suffix)) = marker.split_once("0.0") else {
        return collapse(text);
    };
    let mut kept = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(prefix) {
        let after = &rest[start + prefix.len()..];
        let Some(end) = after.find(suffix) else {
            // An unterminated marker is not NoAsr's: it is the user's text.
            break;
        };
        kept.push_str(&rest[..start]);
        // Markers are glued to their neighbours: keep the words apart.
        kept.push(' ');
        rest = &after[end + suffix.len()..];
    }
    kept.push_str(rest);
    collapse(&kept)
}

fn collapse(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether `text` is one of the wake words, ignoring case, spaces and punctuation (devices
/// report what their wake-word engine heard, punctuated or not).
pub(super) fn is_wake_word(text: &str, words: &[String]) -> bool {
    let norm = |s: &str| -> String {
        s.chars()
            .filter(|c| c.is_alphanumeric())
            .flat_map(char::to_lowercase)
            .collect()
    };
    let t = norm(text);
    !t.is_empty() && words.iter().any(|w| norm(w) == t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_asr_markers_are_not_shown() {
        let m = voxgate_providers::no_asr_marker(1.5);
        let n = voxgate_providers::no_asr_marker(12.0);
        assert_eq!(without_no_asr_markers(&m), "");
        assert_eq!(without_no_asr_markers(&format!("{m} {n}")), "");
        assert_eq!(without_no_asr_markers(&format!("{m}{n}")), "");
        assert_eq!(without_no_asr_markers(&format!("hi {m} there")), "hi there");
        assert_eq!(without_no_asr_markers(&format!("hi{m}there")), "hi there");
        assert_eq!(without_no_asr_markers(&format!("  {m}  你好 ")), "你好");
        assert_eq!(without_no_asr_markers("plain  words "), "plain words");
        assert_eq!(without_no_asr_markers(""), "");
    }

    #[test]
    fn an_unterminated_marker_is_the_users_text() {
        let m = voxgate_providers::no_asr_marker(2.0);
        let (prefix, _) = m.split_once("2.0").unwrap();
        let text = format!("{m} said {prefix}3.0 and more");
        assert_eq!(
            without_no_asr_markers(&text),
            format!("said {prefix}3.0 and more")
        );
    }

    #[test]
    fn wake_words_match_loosely() {
        let words = vec!["你好小智".to_owned(), "Hi ESP".to_owned()];
        assert!(is_wake_word("你好，小智！", &words));
        assert!(is_wake_word("hi esp", &words));
        assert!(is_wake_word("HI-ESP.", &words));
        assert!(!is_wake_word("hi esp please", &words));
        assert!(!is_wake_word("what time is it", &words));
        assert!(!is_wake_word("", &words));
        assert!(!is_wake_word("!!", &words));
        assert!(!is_wake_word("hi esp", &[]));
    }
}
