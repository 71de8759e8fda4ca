//! A leading emoji split across LLM text deltas never leaks into text-only replies.

mod common;

use common::*;
use voxgate_engine::emotion::EmojiPolicy;
use voxgate_engine::{ClientEvent, EngineConfig, Input, TriggerMode};

/// Single code points, skin tones, ZWJ sequences, flags, keycaps, variation selectors, tags.
const EMOJI: [&str; 9] = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "👨🏻‍❤️‍💋‍👨🏼", "🇫🇷", "1️⃣", "❤️", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "😶‍🌫️"];

/// Runs a text-only reply delivered as `deltas`; returns the emotion shown (if any) and the
/// text the client was sent.
fn reply(policy: Option<EmojiPolicy>, deltas: &[&str]) -> (Option<String>, String) {
    let mut d = Driver::new(EngineConfig {
        output_audio: None,
        emotion: policy,
        ..EngineConfig::default()
    });
    let (id, _) = generate(&d.input(Input::Text {
        text: "hi".into(),
        mode: TriggerMode::Queue,
    }));
    for part in deltas {
        d.provider(delta(id, part));
    }
    d.provider(done(id));
    let mut face = None;
    let mut shown = String::new();
    for e in d.client_events() {
        match e {
            ClientEvent::Emotion { emoji, .. } => face = Some(emoji),
            ClientEvent::TextFragment { text, .. } => shown.push_str(&text),
            _ => {}
        }
    }
    (face, shown)
}

/// Every way to cut `text` in two (provider deltas are `String`s, so every char boundary is
/// every byte boundary a delta can have), plus delivery one char at a time.
fn splits(text: &str) -> Vec<Vec<&str>> {
    let mut out: Vec<Vec<&str>> = (1..text.len())
        .filter(|i| text.is_char_boundary(*i))
        .map(|i| vec![&text[..i], &text[i..]])
        .collect();
    out.push(
        text.char_indices()
            .map(|(i, c)| &text[i..i + c.len_utf8()])
            .collect(),
    );
    out
}

#[test]
fn a_split_leading_emoji_is_stripped_whole_without_a_policy() {
    for emoji in EMOJI {
        let text = format!("{emoji} Hello there.");
        let (_, whole) = reply(None, &[&text]);
        assert_eq!(whole, "Hello there.", "{emoji}");
        for deltas in splits(&text) {
            let (face, shown) = reply(None, &deltas);
            assert_eq!(face, None);
            assert_eq!(shown, "Hello there.", "{emoji} split as {deltas:?}");
        }
    }
}

#[test]
fn a_split_leading_emoji_becomes_the_whole_face_with_a_policy() {
    let policy = EmojiPolicy::any("🙂");
    for emoji in EMOJI {
        let text = format!("{emoji}Hi, friend!");
        let expected = policy.expression(&text).emoji.to_owned();
        assert_eq!(expected, emoji, "the policy reads the whole cluster");
        for deltas in splits(&text) {
            let (face, shown) = reply(Some(policy.clone()), &deltas);
            assert_eq!(face.as_deref(), Some(emoji), "split as {deltas:?}");
            assert_eq!(shown, "Hi, friend!", "{emoji} split as {deltas:?}");
        }
    }
}

#[test]
fn a_reply_of_only_emoji_shows_nothing_and_ends() {
    for deltas in splits("👨‍👩‍👧 🎉") {
        let (face, shown) = reply(None, &deltas);
        assert_eq!((face, shown.as_str()), (None, ""), "{deltas:?}");
    }
}

#[test]
fn emoji_inside_a_reply_go_without_gluing_words_together() {
    let (_, shown) = reply(None, &["Well done ", "🎉 see you ", "👋", " soon."]);
    assert_eq!(shown, "Well done see you soon.");
    let (_, shown) = reply(None, &["Hi. ", "Great 👍🏽 ", "work."]);
    assert_eq!(shown, "Hi. Great work.");
}
