//! One Xiaozhi turn as a server sends it, printed as the device would receive it: hello, a text
//! turn from `listen detect`, the emotion frame, a subtitle, version 2 audio frames with the
//! timestamps the device echoes back for echo cancellation, and `tts stop`.
//!
//! `cargo run -p voxgate-examples --example xiaozhi_turn`

use voxgate_engine::emotion::{EmojiPolicy, strip_emoji};
use voxgate_xiaozhi::control::{DeviceMessage, Llm, ServerHello, ServerMessage, Stt, Tts};
use voxgate_xiaozhi::emotion::Emotion;
use voxgate_xiaozhi::frame::{Frame, FrameCodec, ProtocolVersion};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The upgrade request said `Protocol-Version: 2`; that fixes the framing both ways.
    let codec = FrameCodec::new(ProtocolVersion::from_header("2")?);

    let hello = DeviceMessage::from_slice(
        br#"{"type":"hello","version":2,"features":{"aec":true,"mcp":true},"transport":"websocket","audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}"#,
    )?;
    println!("device: {}", hello.message_type());
    println!(
        "server: {}",
        ServerMessage::from(ServerHello::new("session-1")).to_json()
    );

    let detect = DeviceMessage::from_slice(
        br#"{"session_id":"session-1","type":"listen","state":"detect","text":"what time is it?"}"#,
    )?;
    let DeviceMessage::Listen(listen) = detect else {
        return Err("expected a listen message".into());
    };
    let heard = listen.text.unwrap_or_default();
    println!(
        "server: {}",
        ServerMessage::from(Stt::new(heard.clone())).to_json()
    );
    println!("server: {}", ServerMessage::from(Tts::start()).to_json());

    // The model's reply leads with an emoji: it becomes the face, never the speech. The engine
    // reads the face; the firmware knows it under the same name.
    let reply = format!("🤔 You asked: {heard} Let me check.");
    let policy = EmojiPolicy::faces();
    let face = policy.expression(&reply);
    let llm = Llm {
        session_id: None,
        text: face.emoji.to_owned(),
        emotion: Emotion::from(face.emotion.as_str()),
    };
    println!("server: {}", ServerMessage::from(llm).to_json());
    let spoken = strip_emoji(face.text);
    println!(
        "server: {}",
        ServerMessage::from(Tts::sentence_start(spoken.trim())).to_json()
    );

    // Three 60 ms frames of (fake) Opus, stamped with their play-out time in milliseconds.
    let mut wire = Vec::with_capacity(codec.max_frame_len());
    for i in 0..3u32 {
        let opus = [0x58, 0x00, u8::try_from(i)?, 0x02];
        wire.clear();
        codec.encode(&Frame::opus_at(i * 60, &opus), &mut wire)?;
        let decoded = codec.decode(&wire)?;
        println!(
            "server: binary {:02x?} (timestamp {} ms, {} byte payload)",
            wire,
            decoded.timestamp,
            decoded.payload.len()
        );
    }
    println!("server: {}", ServerMessage::from(Tts::stop()).to_json());
    Ok(())
}
