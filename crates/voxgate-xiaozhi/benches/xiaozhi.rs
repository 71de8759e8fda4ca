//! Benchmarks for the per-frame audio path and the control-message path.
//!
//! Run with `cargo bench -p voxgate-xiaozhi`. The allocation columns come from divan's
//! `AllocProfiler`: the frame benchmarks must show zero allocations.

use divan::{AllocProfiler, Bencher, black_box};
use voxgate_xiaozhi::control::{DeviceMessage, Llm, Mcp, ServerHello, ServerMessage, Tts};
use voxgate_xiaozhi::emotion::Emotion;
use voxgate_xiaozhi::frame::{Frame, FrameCodec, ProtocolVersion};
use voxgate_xiaozhi::token::{self, TokenSecret};

#[global_allocator]
static ALLOC: AllocProfiler = AllocProfiler::system();

fn main() {
    divan::main();
}

/// A 60 ms Opus packet at a typical voice bitrate is about 120 bytes.
const OPUS_LEN: usize = 120;

fn opus() -> Vec<u8> {
    std::iter::successors(Some(11u8), |b| Some(b.wrapping_add(37)))
        .take(OPUS_LEN)
        .collect()
}

fn stamp(version: ProtocolVersion) -> u32 {
    if version.has_timestamp() { 1234 } else { 0 }
}

fn encoded(version: ProtocolVersion, payload: &[u8]) -> Vec<u8> {
    let codec = FrameCodec::new(version);
    let mut out = Vec::new();
    codec
        .encode(&Frame::opus_at(stamp(version), payload), &mut out)
        .unwrap_or_default();
    out
}

mod frame {
    use super::*;

    #[divan::bench(args = ProtocolVersion::ALL)]
    fn decode_header(bencher: Bencher<'_, '_>, version: ProtocolVersion) {
        let codec = FrameCodec::new(version);
        let wire = encoded(version, &opus());
        bencher.bench_local(|| codec.decode_header(black_box(&wire)));
    }

    #[divan::bench(args = ProtocolVersion::ALL)]
    fn decode(bencher: Bencher<'_, '_>, version: ProtocolVersion) {
        let codec = FrameCodec::new(version);
        let wire = encoded(version, &opus());
        bencher.bench_local(|| codec.decode(black_box(&wire)).map(|f| f.payload.len()));
    }

    #[divan::bench(args = ProtocolVersion::ALL)]
    fn decode_into(bencher: Bencher<'_, '_>, version: ProtocolVersion) {
        let codec = FrameCodec::new(version);
        let wire = encoded(version, &opus());
        let mut payload = vec![0u8; codec.max_payload_len()];
        bencher.bench_local(|| codec.decode_into(black_box(&wire), &mut payload).is_ok());
    }

    #[divan::bench(args = ProtocolVersion::ALL)]
    fn encode(bencher: Bencher<'_, '_>, version: ProtocolVersion) {
        let codec = FrameCodec::new(version);
        let payload = opus();
        let frame = Frame::opus_at(stamp(version), &payload);
        let mut out = Vec::with_capacity(codec.max_frame_len());
        bencher.bench_local(|| {
            out.clear();
            codec.encode(black_box(&frame), &mut out).is_ok()
        });
    }
}

mod control {
    use super::*;

    const LISTEN: &str =
        r#"{"session_id":"a1b2c3d4","type":"listen","state":"start","mode":"auto"}"#;
    const ABORT: &str = r#"{"session_id":"a1b2c3d4","type":"abort","reason":"wake_word_detected"}"#;
    const HELLO: &str = r#"{"type":"hello","version":1,"features":{"aec":true,"mcp":true},"transport":"websocket","audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}"#;
    const MCP: &str = r#"{"session_id":"a1b2c3d4","type":"mcp","payload":{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"true"}],"isError":false}}}"#;
    /// A tool result with escaped quotes and an escaped surrogate pair (an ASCII-only client):
    /// the payload's escapes are checked for lone surrogates.
    const MCP_ESCAPED: &str = r#"{"session_id":"a1b2c3d4","type":"mcp","payload":{"jsonrpc":"2.0","id":4,"result":{"content":[{"type":"text","text":"\ud83d\udd0a {\"volume\":50,\"muted\":false}"}],"isError":false}}}"#;

    fn sample(name: &str) -> &'static str {
        match name {
            "listen" => LISTEN,
            "abort" => ABORT,
            "hello" => HELLO,
            "mcp_escaped" => MCP_ESCAPED,
            _ => MCP,
        }
    }

    #[divan::bench(args = ["listen", "abort", "hello", "mcp", "mcp_escaped"])]
    fn parse_device(bencher: Bencher<'_, '_>, name: &str) {
        let json = sample(name);
        bencher.bench_local(|| DeviceMessage::from_slice(black_box(json.as_bytes())).is_ok());
    }

    #[divan::bench]
    fn parse_server_tts(bencher: Bencher<'_, '_>) {
        let json = r#"{"type":"tts","state":"sentence_start","text":"The weather is fine today."}"#;
        bencher.bench_local(|| ServerMessage::from_slice(black_box(json.as_bytes())).is_ok());
    }

    /// A `tools/call` request to the device: the payload is kept as raw text, not a `Value`.
    #[divan::bench]
    fn parse_server_mcp(bencher: Bencher<'_, '_>) {
        let json = r#"{"type":"mcp","session_id":"a1b2c3d4","payload":{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":50}}}}"#;
        bencher.bench_local(|| ServerMessage::from_slice(black_box(json.as_bytes())).is_ok());
    }

    #[divan::bench]
    fn serialize_server_hello(bencher: Bencher<'_, '_>) {
        let message = ServerMessage::from(ServerHello::new("a1b2c3d4"));
        bencher.bench_local(|| black_box(&message).to_json());
    }

    #[divan::bench]
    fn serialize_tts_sentence(bencher: Bencher<'_, '_>) {
        let message = ServerMessage::from(Tts::sentence_start("The weather is fine today."));
        bencher.bench_local(|| black_box(&message).to_json());
    }

    #[divan::bench]
    fn serialize_llm(bencher: Bencher<'_, '_>) {
        let message = ServerMessage::from(Llm::from_emotion(Emotion::Happy));
        bencher.bench_local(|| black_box(&message).to_json());
    }

    #[divan::bench]
    fn serialize_mcp(bencher: Bencher<'_, '_>) {
        let payload = serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "self.audio_speaker.set_volume", "arguments": {"volume": 50}}});
        let message = ServerMessage::from(Mcp::wrap(payload).with_session_id("a1b2c3d4"));
        bencher.bench_local(|| black_box(&message).to_json());
    }
}

mod auth {
    use super::*;

    #[divan::bench]
    fn verify_token(bencher: Bencher<'_, '_>) {
        let Ok(secret) = TokenSecret::new("server secret") else {
            return;
        };
        let now = 1_700_000_000;
        let issued = token::issue(&secret, "client", "aa:bb:cc:dd:ee:ff", now).unwrap_or_default();
        bencher.bench_local(|| {
            token::verify(
                &secret,
                black_box(&issued),
                "client",
                "aa:bb:cc:dd:ee:ff",
                now,
            )
            .is_ok()
        });
    }
}
