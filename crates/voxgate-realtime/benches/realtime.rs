//! Framing costs on the hot paths: 20 ms of 16 kHz mono audio (640 bytes) each way, a text
//! input, and a chat history export. Run with `cargo bench -p voxgate-realtime`; the allocation
//! columns come from divan's `AllocProfiler`.

use bytes::{Bytes, BytesMut};
use divan::{AllocProfiler, Bencher, black_box};
use voxgate_realtime::proto::{ChatMessage, ChatMessageRole, InferenceTriggerMode};
use voxgate_realtime::proto::{ChatMessageContent, ToolCallResponse};
use voxgate_realtime::{AudioFormat, ClientBoundMessage, ServiceBoundMessage};

#[global_allocator]
static ALLOC: AllocProfiler = AllocProfiler::system();

fn main() {
    divan::main();
}

/// A frame buffer as a WebSocket library hands it out: already reference-counted.
fn shared(bytes: Bytes) -> Bytes {
    drop(bytes.clone());
    bytes
}

fn audio_frame() -> Bytes {
    let audio: Vec<u8> = (0..640u32).map(|i| (i % 251).to_le_bytes()[0]).collect();
    shared(
        ServiceBoundMessage::user_audio(42, InferenceTriggerMode::Immediate, shared(audio.into()))
            .to_frame(),
    )
}

#[divan::bench]
fn decode_audio_user_input(bencher: Bencher<'_, '_>) {
    let frame = audio_frame();
    bencher.bench(|| ServiceBoundMessage::decode_frame(black_box(frame.clone())));
}

#[divan::bench]
fn encode_audio_user_input(bencher: Bencher<'_, '_>) {
    let message = ServiceBoundMessage::decode_frame(audio_frame());
    let mut buf = BytesMut::with_capacity(1024);
    bencher.bench_local(|| {
        buf.clear();
        if let Ok(m) = &message {
            let _ = black_box(m).encode_frame(&mut buf);
        }
    });
}

#[divan::bench]
fn encode_audio_user_input_to_frame(bencher: Bencher<'_, '_>) {
    let message = ServiceBoundMessage::decode_frame(audio_frame());
    bencher.bench(|| message.as_ref().map(|m| black_box(m).to_frame()).ok());
}

#[divan::bench]
fn decode_text_user_input(bencher: Bencher<'_, '_>) {
    let frame = shared(
        ServiceBoundMessage::user_text(
            43,
            InferenceTriggerMode::Queue,
            "What is the weather like in Berlin tomorrow afternoon?",
        )
        .to_frame(),
    );
    bencher.bench(|| ServiceBoundMessage::decode_frame(black_box(frame.clone())));
}

#[divan::bench]
fn encode_model_audio_chunk(bencher: Bencher<'_, '_>) {
    let audio: Vec<u8> = vec![0x55; 960];
    let message = ClientBoundMessage::model_audio_chunk(shared(audio.into()), Some(7));
    let mut buf = BytesMut::with_capacity(2048);
    bencher.bench_local(|| {
        buf.clear();
        let _ = black_box(&message).encode_frame(&mut buf);
    });
}

/// A 20-message history: user audio turns, assistant text, a tool exchange.
fn history_frame() -> Bytes {
    let mut messages = Vec::new();
    for turn in 0..10u32 {
        messages.push(ChatMessage {
            role: ChatMessageRole::User.into(),
            content: vec![ChatMessageContent::input_audio(
                voxgate_realtime::proto::ChatAudioData::new(
                    shared(vec![0u8; 3200].into()),
                    AudioFormat::SPEECH_16K,
                    "what's the weather like",
                ),
            )],
            turn_id: Some(turn * 2),
            ..Default::default()
        });
        messages.push(ChatMessage {
            role: ChatMessageRole::Assistant.into(),
            content: vec![
                ChatMessageContent::tool_result(ToolCallResponse {
                    id: format!("call_{turn}"),
                    result: r#"{"temp_c": 21}"#.into(),
                }),
                ChatMessageContent::text("It will be sunny and 21 degrees tomorrow.", None),
            ],
            turn_id: Some(turn * 2 + 1),
            ..Default::default()
        });
    }
    shared(ClientBoundMessage::chat_history(messages).to_frame())
}

#[divan::bench]
fn decode_chat_history(bencher: Bencher<'_, '_>) {
    let frame = history_frame();
    bencher
        .counter(divan::counter::BytesCount::new(frame.len()))
        .bench(|| ClientBoundMessage::decode_frame(black_box(frame.clone())));
}
