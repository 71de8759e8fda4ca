//! Bridge frames from either side: decoding never panics, and whatever decodes re-encodes to
//! a frame that decodes again. Audio blobs, and the raw input as base64 audio, are decoded too.
#![no_main]

use voxgate_gemini::{ClientMessage, ServerMessage};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let mut pcm = [0i16; 4096];
    if let Ok(msg) = ClientMessage::decode_slice(data) {
        if let ClientMessage::SendRealtimeInput(input) = &msg {
            if let Some(blob) = &input.audio {
                let _ = blob.decode_pcm_into(&mut pcm);
            }
        }
        let again = ClientMessage::decode(&msg.encode());
        assert!(again.is_ok(), "re-encoded client message must decode");
    }
    if let Ok(text) = std::str::from_utf8(data) {
        // The raw input as an audio blob too: base64, whitespace, WAV headers, odd lengths.
        let _ = voxgate_gemini::audio::decode_audio_into(text, "audio/pcm;rate=16000", &mut pcm);
        if let Ok(msg) = ServerMessage::decode_slice(data) {
            if let ServerMessage::ContentMessage(content) = &msg {
                for blob in content.audio() {
                    let _ = blob.decode_pcm_into(&mut pcm);
                }
            }
            let again = ServerMessage::decode(&msg.encode());
            assert!(again.is_ok(), "re-encoded server message must decode");
        }
    }
});
