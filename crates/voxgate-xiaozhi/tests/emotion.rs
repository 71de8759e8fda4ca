//! The emotion channel on the wire: the firmware's face names, their emoji and the `llm` frame.
//!
//! Reading a face out of model text is the engine's (`voxgate_engine::emotion`), tested there.

use voxgate_xiaozhi::control::{Alert, Llm, ServerMessage};
use voxgate_xiaozhi::emotion::{Emotion, FIRMWARE_EMOJI};

#[test]
fn the_firmware_table_names_every_face_once() {
    assert_eq!(FIRMWARE_EMOJI.len(), 21);
    assert_eq!(Emotion::KNOWN.len(), 21);
    for (emoji, emotion) in &FIRMWARE_EMOJI {
        assert_eq!(emotion.emoji(), Some(*emoji));
        assert_eq!(&Emotion::from(emotion.as_str()), emotion);
    }
    let names: Vec<&str> = FIRMWARE_EMOJI.iter().map(|(_, e)| e.as_str()).collect();
    assert_eq!(
        names.join(" "),
        "neutral happy laughing funny sad angry crying loving embarrassed surprised shocked \
         thinking winking cool relaxed delicious kissy confident sleepy silly confused"
    );
    let mut emoji: Vec<&str> = FIRMWARE_EMOJI.iter().map(|(e, _)| *e).collect();
    emoji.sort_unstable();
    emoji.dedup();
    assert_eq!(emoji.len(), 21, "two names share an emoji");
}

#[test]
fn unknown_names_are_kept_and_have_no_emoji() {
    let other = Emotion::from("triangle_exclamation");
    assert_eq!(other, Emotion::Other("triangle_exclamation".into()));
    assert_eq!(other.as_str(), "triangle_exclamation");
    assert_eq!(other.emoji(), None);
    // Names are case-sensitive on the wire, as in the firmware.
    assert_eq!(Emotion::from("Happy"), Emotion::Other("Happy".into()));
}

#[test]
fn llm_frame_from_an_emotion() {
    let mut llm = Llm::from_emotion(Emotion::Sad);
    assert_eq!(llm.text, "😔");
    llm.session_id = Some("s1".into());
    assert_eq!(
        ServerMessage::from(llm).to_json(),
        r#"{"type":"llm","session_id":"s1","text":"😔","emotion":"sad"}"#
    );
    // An unknown name goes out as written, with no emoji.
    assert_eq!(
        ServerMessage::from(Llm::from_emotion(Emotion::from("sparkles"))).to_json(),
        r#"{"type":"llm","text":"","emotion":"sparkles"}"#
    );
}

#[test]
fn emotion_names_round_trip_through_serde() {
    for emotion in Emotion::KNOWN
        .iter()
        .cloned()
        .chain([Emotion::from("wink_wink")])
    {
        let json = serde_json::to_string(&emotion).unwrap();
        assert_eq!(json, format!("\"{}\"", emotion.as_str()));
        let back: Emotion = serde_json::from_str(&json).unwrap();
        assert_eq!(back, emotion);
    }
    let alert = ServerMessage::from(Alert {
        session_id: None,
        status: "Warning".into(),
        message: "Battery low".into(),
        emotion: Emotion::Sleepy,
    });
    assert_eq!(
        alert.to_json(),
        r#"{"type":"alert","status":"Warning","message":"Battery low","emotion":"sleepy"}"#
    );
}
