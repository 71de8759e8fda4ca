//! The emotion channel: the emoji table, leading-emoji extraction, allowlists and stripping.
// Test helpers outside #[test] fns are not covered by clippy.toml's test exemptions.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use voxgate_xiaozhi::control::ServerMessage;
use voxgate_xiaozhi::emotion::{
    BRIDGE_EMOJI, EmojiPolicy, Emotion, FIRMWARE_EMOJI, contains_emoji, leading_emoji, strip_emoji,
};

#[test]
fn the_firmware_table_maps_both_ways() {
    assert_eq!(FIRMWARE_EMOJI.len(), 21);
    assert_eq!(Emotion::KNOWN.len(), 21);
    for (emoji, emotion) in &FIRMWARE_EMOJI {
        assert_eq!(Emotion::from_emoji(emoji).as_ref(), Some(emotion));
        assert_eq!(emotion.emoji(), Some(*emoji));
        assert_eq!(&Emotion::from(emotion.as_str()), emotion);
        assert_eq!(&Emotion::nearest(emoji), emotion);
    }
    let names: Vec<&str> = FIRMWARE_EMOJI.iter().map(|(_, e)| e.as_str()).collect();
    assert_eq!(
        names.join(" "),
        "neutral happy laughing funny sad angry crying loving embarrassed surprised shocked \
         thinking winking cool relaxed delicious kissy confident sleepy silly confused"
    );
    assert_eq!(Emotion::Other("triangle_exclamation".into()).emoji(), None);
}

#[test]
fn from_emoji_ignores_selectors_and_tones_but_not_other_emoji() {
    assert_eq!(Emotion::from_emoji("😍\u{FE0F}"), Some(Emotion::Loving));
    assert_eq!(Emotion::from_emoji("😊"), None);
    assert_eq!(Emotion::from_emoji("😍😍"), None);
    assert_eq!(Emotion::from_emoji(""), None);
}

#[test]
fn emoji_outside_the_table_get_the_nearest_name_or_neutral() {
    let cases = [
        ("😊", Emotion::Happy),
        ("😢", Emotion::Sad),
        ("😮", Emotion::Surprised),
        ("😐", Emotion::Neutral),
        ("😡", Emotion::Angry),
        ("❤️", Emotion::Loving),
        ("👍🏽", Emotion::Neutral),
        ("🦀", Emotion::Neutral),
        ("😶‍🌫️", Emotion::Neutral),
        ("", Emotion::Neutral),
    ];
    for (emoji, emotion) in cases {
        assert_eq!(Emotion::nearest(emoji), emotion, "{emoji}");
    }
    // Every face of the bridge preset has a name.
    for emoji in BRIDGE_EMOJI {
        assert_ne!(Emotion::nearest(emoji).emoji(), None, "{emoji}");
    }
}

#[test]
fn leading_emoji_handles_whitespace_selectors_tones_and_zwj() {
    let cases = [
        ("😊 hi", "😊", "hi"),
        ("  \n🤔Let me think", "🤔", "Let me think"),
        ("❤️ you", "❤️", "you"),
        ("👋🏻 hello", "👋🏻", "hello"),
        ("👩‍💻 coding", "👩‍💻", "coding"),
        ("🇨🇳 China", "🇨🇳", "China"),
        ("😊😊 twice", "😊", "😊 twice"),
        ("😊", "😊", ""),
    ];
    for (text, emoji, rest) in cases {
        let found = leading_emoji(text).unwrap();
        assert_eq!((found.emoji, found.rest), (emoji, rest), "{text}");
    }
    for text in [
        "hi 😊",
        "",
        "   ",
        "1. first",
        "© 2025",
        "你好😊",
        "#hashtag",
    ] {
        assert_eq!(leading_emoji(text), None, "{text}");
    }
}

#[test]
fn bridge_policy_defaults_to_neutral_face() {
    let policy = EmojiPolicy::bridge();
    assert_eq!(policy.default_emoji(), "😐");
    assert_eq!(policy.allowed().unwrap().len(), 9);

    let allowed = policy.expression("😆 Ha!");
    assert_eq!(
        (
            allowed.emoji,
            &allowed.emotion,
            allowed.text,
            allowed.defaulted
        ),
        ("😆", &Emotion::Laughing, "Ha!", false)
    );
    let none = policy.expression("Plain answer.");
    assert_eq!(
        (none.emoji, &none.emotion, none.text, none.defaulted),
        ("😐", &Emotion::Neutral, "Plain answer.", true)
    );
    let disallowed = policy.expression("🎉 Party!");
    assert_eq!((disallowed.emoji, disallowed.text), ("😐", "Party!"));

    assert_eq!(policy.ensure_prefix("😍 Love it"), "😍 Love it");
    assert_eq!(policy.ensure_prefix("Love it"), "😐 Love it");
    assert_eq!(policy.ensure_prefix("🎉 Party!"), "😐 Party!");
    assert_eq!(policy.ensure_prefix(""), "😐");
}

#[test]
fn firmware_policy_and_custom_policies() {
    let firmware = EmojiPolicy::firmware();
    assert_eq!(firmware, EmojiPolicy::default());
    assert_eq!(firmware.default_emoji(), "🙂");
    assert!(firmware.is_allowed("😎"));
    assert!(!firmware.is_allowed("😊"));
    assert_eq!(firmware.expression("No face").emotion, Emotion::Happy);

    // The default is always allowed; variation selectors do not matter.
    let custom = EmojiPolicy::new(["❤"], "🤖");
    assert!(custom.is_allowed("🤖"));
    assert!(custom.is_allowed("❤️"));
    assert_eq!(custom.expression("❤️ thanks").emotion, Emotion::Loving);
    assert_eq!(custom.expression("thanks").emotion, Emotion::Neutral);

    let any = EmojiPolicy::any("🙂");
    assert_eq!(any.allowed(), None);
    assert_eq!(any.expression("🦀 rust").emoji, "🦀");
    assert!(!any.is_allowed("not an emoji"));
}

#[test]
fn llm_frame_from_a_reply() {
    let policy = EmojiPolicy::bridge();
    let expression = policy.expression("😢 I lost the file.");
    let mut llm = expression.llm_message();
    llm.session_id = Some("s1".into());
    assert_eq!(
        ServerMessage::from(llm).to_json(),
        r#"{"type":"llm","session_id":"s1","text":"😢","emotion":"sad"}"#
    );
}

#[test]
fn strip_emoji_removes_every_emoji_and_keeps_text() {
    let cases = [
        ("😊 Hello there!", "Hello there!"),
        ("Hello 😊 there!", "Hello there!"),
        ("Great job!👍🏽", "Great job!"),
        ("你好😊，今天天气不错🌞。", "你好，今天天气不错。"),
        ("Flags 🇨🇳🇺🇸 and 👩‍👩‍👧‍👦 family", "Flags and family"),
        ("Keycap 1️⃣ vs digit 1", "Keycap vs digit 1"),
        (
            "© 2025 ACME™, rights reserved.",
            "© 2025 ACME™, rights reserved.",
        ),
        (
            "«quotes» — dashes… 「括弧」！",
            "«quotes» — dashes… 「括弧」！",
        ),
        ("Stars ⭐ and hearts ❤️!", "Stars and hearts!"),
        ("😊", ""),
        ("", ""),
    ];
    for (text, expected) in cases {
        assert_eq!(strip_emoji(text), expected, "{text}");
        assert!(!contains_emoji(&strip_emoji(text)), "{text}");
    }
}

#[test]
fn strip_emoji_borrows_when_nothing_changes() {
    let text = "Nothing to strip, 没有表情。";
    assert!(matches!(strip_emoji(text), std::borrow::Cow::Borrowed(t) if t == text));
}

proptest::proptest! {
    #[test]
    fn text_without_emoji_is_untouched(text in "[a-zA-Z0-9 ,.!?'\"#*()\u{4e00}-\u{9fff}\u{3000}-\u{3029}\u{ff01}-\u{ff5e}]{0,40}") {
        proptest::prop_assert_eq!(strip_emoji(&text), text.as_str());
    }

    #[test]
    fn stripped_text_never_contains_emoji(text in any_text_with_emoji()) {
        let stripped = strip_emoji(&text);
        proptest::prop_assert!(!contains_emoji(&stripped), "{:?} -> {:?}", text, stripped);
    }
}

fn any_text_with_emoji() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    let piece = prop_oneof![
        "[a-z ,.!]{0,5}",
        "[\u{4e00}-\u{4e20}，。]{0,3}",
        prop::sample::select(vec![
            "😊",
            "❤️",
            "👍🏽",
            "👩‍💻",
            "🇨🇳",
            "1️⃣",
            "\u{FE0F}",
            "\u{200D}",
            "©\u{FE0F}",
            "⭐"
        ])
        .prop_map(str::to_owned),
        any::<char>().prop_map(String::from),
    ];
    prop::collection::vec(piece, 0..10).prop_map(|pieces| pieces.concat())
}
