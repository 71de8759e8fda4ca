//! The emotion names of the `llm` (and `alert`) frame, and the face the firmware shows for each.
//!
//! The firmware knows 21 faces by name and reads only the frame's `emotion`; `text` carries the
//! matching emoji for clients that show it. Reading a face out of model text (leading emoji,
//! allowlists, emoji stripping) is not part of the protocol: it lives in the engine
//! (`voxgate_engine::emotion`), and a server maps the engine's face to an [`Emotion`] here.
//!
//! ```
//! use voxgate_xiaozhi::control::{Llm, ServerMessage};
//! use voxgate_xiaozhi::emotion::Emotion;
//!
//! let happy = Emotion::from("happy");
//! assert_eq!(happy, Emotion::Happy);
//! assert_eq!(happy.emoji(), Some("🙂"));
//! assert_eq!(
//!     ServerMessage::from(Llm::from_emotion(happy)).to_json(),
//!     r#"{"type":"llm","text":"🙂","emotion":"happy"}"#
//! );
//!
//! // A name the firmware does not know is kept; the device shows its neutral face for it.
//! assert_eq!(Emotion::from("triangle_exclamation").emoji(), None);
//! ```

use crate::macros::string_enum;

string_enum! {
    /// One of the firmware's 21 face names (`emotion` in [`Llm`](crate::control::Llm) and
    /// [`Alert`](crate::control::Alert)).
    ///
    /// Names outside the table are kept as [`Emotion::Other`]; the firmware shows its neutral
    /// face for them.
    Emotion {
        /// 😶
        Neutral => "neutral",
        /// 🙂 (the reference server's default)
        Happy => "happy",
        /// 😆
        Laughing => "laughing",
        /// 😂
        Funny => "funny",
        /// 😔
        Sad => "sad",
        /// 😠
        Angry => "angry",
        /// 😭
        Crying => "crying",
        /// 😍
        Loving => "loving",
        /// 😳
        Embarrassed => "embarrassed",
        /// 😲
        Surprised => "surprised",
        /// 😱
        Shocked => "shocked",
        /// 🤔
        Thinking => "thinking",
        /// 😉
        Winking => "winking",
        /// 😎
        Cool => "cool",
        /// 😌
        Relaxed => "relaxed",
        /// 🤤
        Delicious => "delicious",
        /// 😘
        Kissy => "kissy",
        /// 😏
        Confident => "confident",
        /// 😴
        Sleepy => "sleepy",
        /// 😜
        Silly => "silly",
        /// 🙄
        Confused => "confused",
    }
}

/// The firmware's emoji table, emoji → name, in the firmware's order.
pub const FIRMWARE_EMOJI: [(&str, Emotion); 21] = [
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

impl Emotion {
    /// The firmware's emoji for this name; `None` for [`Emotion::Other`].
    pub fn emoji(&self) -> Option<&'static str> {
        FIRMWARE_EMOJI
            .iter()
            .find(|(_, emotion)| emotion == self)
            .map(|(emoji, _)| *emoji)
    }
}
