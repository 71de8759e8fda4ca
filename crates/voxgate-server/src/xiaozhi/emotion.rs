//! The engine's protocol-neutral face as the Xiaozhi firmware's `llm` emotion name.

use voxgate_engine::emotion::Emotion;
use voxgate_xiaozhi::emotion::Emotion as Wire;

/// The firmware's name for `emotion`: the firmware knows all 21 of the engine's faces under the
/// same names; a face added to the engine later shows as neutral until it is mapped here.
pub(crate) fn to_wire(emotion: Emotion) -> Wire {
    match emotion {
        Emotion::Neutral => Wire::Neutral,
        Emotion::Happy => Wire::Happy,
        Emotion::Laughing => Wire::Laughing,
        Emotion::Funny => Wire::Funny,
        Emotion::Sad => Wire::Sad,
        Emotion::Angry => Wire::Angry,
        Emotion::Crying => Wire::Crying,
        Emotion::Loving => Wire::Loving,
        Emotion::Embarrassed => Wire::Embarrassed,
        Emotion::Surprised => Wire::Surprised,
        Emotion::Shocked => Wire::Shocked,
        Emotion::Thinking => Wire::Thinking,
        Emotion::Winking => Wire::Winking,
        Emotion::Cool => Wire::Cool,
        Emotion::Relaxed => Wire::Relaxed,
        Emotion::Delicious => Wire::Delicious,
        Emotion::Kissy => Wire::Kissy,
        Emotion::Confident => Wire::Confident,
        Emotion::Sleepy => Wire::Sleepy,
        Emotion::Silly => Wire::Silly,
        Emotion::Confused => Wire::Confused,
        _ => Wire::Neutral,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use voxgate_engine::emotion::FACES;

    #[test]
    fn every_face_keeps_its_name_and_emoji_on_the_wire() {
        for (emoji, emotion) in FACES {
            let wire = to_wire(emotion);
            assert_eq!(wire.as_str(), emotion.as_str());
            assert_eq!(wire.emoji(), Some(emoji));
        }
    }
}
