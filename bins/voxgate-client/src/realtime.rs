//! The realtime protobuf door (Deepslate-compatible): initialize, send text turns or stream a
//! WAV at real time, print every server message, save the spoken reply.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::time::{Instant, sleep_until};
use tokio_tungstenite::tungstenite::Message;
use voxgate_realtime::proto::client_bound_message::Payload as Down;
use voxgate_realtime::proto::{
    ChatDeliveryStatus, ChatMessageRole, HostedTtsMode, InferenceTriggerMode, SessionErrorCategory,
    VadState, chat_message_content,
};
use voxgate_realtime::{
    AudioFormat, ClientBoundMessage, HostedTtsSettings, HostedVoice, ServiceBoundMessage,
    SessionConfig, TtsSettings,
};

use crate::audio::{self, Pacing};
use crate::events::Events;
use crate::ws::{self, Ws};

/// Audio frames of 20 ms, the size real-time clients send.
const FRAME: Duration = Duration::from_millis(20);
/// Silence streamed after the WAV so the server's VAD sees the end of the utterance.
const SILENCE_TAIL: Duration = Duration::from_millis(1200);
/// How long to wait for the VAD to start a reply before forcing one with `flush_vad`.
const FLUSH_AFTER: Duration = Duration::from_secs(2);

/// What to do in one realtime session.
#[derive(Debug, Clone)]
pub struct RealtimeOptions {
    /// `ws://host:port/realtime` or the long vendor path.
    pub url: String,
    /// Text turns, sent one after the other, each after the previous reply ended.
    pub texts: Vec<String>,
    /// A WAV file streamed at real time after the text turns.
    pub wav: Option<PathBuf>,
    /// Where to save the reply audio (all replies, in order) as WAV; implies `tts`.
    pub save_reply: Option<PathBuf>,
    /// Bearer key for `Authorization`.
    pub api_key: Option<String>,
    /// The declared input line: 16-bit mono at this rate.
    pub input_rate: u32,
    /// The requested output line: 16-bit mono at this rate.
    pub output_rate: u32,
    /// Ask for spoken replies (hosted TTS) instead of text fragments.
    pub tts: bool,
    /// System prompt sent with the initialization.
    pub system_prompt: Option<String>,
    /// Give up after this long.
    pub timeout: Duration,
}

impl RealtimeOptions {
    /// Defaults for `url`: no turns, 16 kHz in, 24 kHz out, text replies, 30 s timeout.
    #[must_use]
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            texts: Vec::new(),
            wav: None,
            save_reply: None,
            api_key: None,
            input_rate: 16_000,
            output_rate: 24_000,
            tts: false,
            system_prompt: None,
            timeout: Duration::from_secs(30),
        }
    }
}

/// One reply as received.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reply {
    /// The turn id of `ResponseBegin`.
    pub turn_id: u32,
    /// Text fragments (or audio transcripts) joined.
    pub text: String,
    /// Bytes of reply audio.
    pub audio_bytes: usize,
}

/// What a session produced.
#[derive(Debug, Clone, Default)]
pub struct RealtimeOutcome {
    /// Replies in order.
    pub replies: Vec<Reply>,
    /// User transcriptions received.
    pub transcriptions: Vec<String>,
    /// Errors the server notified.
    pub errors: Vec<String>,
    /// All reply audio as samples at the output rate.
    pub audio: Vec<i16>,
}

enum Turn {
    Text(String),
    Audio(Vec<Bytes>),
}

/// Runs one session, emitting every server message to `events`.
///
/// # Errors
/// Connection failures, a server error or close before the turns finished, or the timeout.
pub async fn run(opts: &RealtimeOptions, events: &mut Events) -> anyhow::Result<RealtimeOutcome> {
    let mut turns: Vec<Turn> = opts.texts.iter().cloned().map(Turn::Text).collect();
    if let Some(path) = &opts.wav {
        let frames = audio::wav_frames(path, opts.input_rate, FRAME, SILENCE_TAIL)?
            .iter()
            .map(|f| Bytes::from(audio::s16le(f)))
            .collect();
        turns.push(Turn::Audio(frames));
    }
    let deadline = Instant::now() + opts.timeout;
    let headers: Vec<(&str, String)> = opts
        .api_key
        .iter()
        .map(|k| ("authorization", format!("Bearer {k}")))
        .collect();
    let mut ws = ws::open(&opts.url, &headers, opts.timeout, events, Value::Null).await?;

    let input = AudioFormat::new(
        opts.input_rate,
        1,
        voxgate_realtime::proto::SampleFormat::Signed16Bit,
    )
    .context("input format")?;
    let output = AudioFormat::new(
        opts.output_rate,
        1,
        voxgate_realtime::proto::SampleFormat::Signed16Bit,
    )
    .context("output format")?;
    let mut config = SessionConfig::new(input, output);
    if opts.tts || opts.save_reply.is_some() {
        config.tts = Some(TtsSettings::Hosted(HostedTtsSettings {
            voice: HostedVoice::Ref {
                voice_id: "default".into(),
            },
            mode: HostedTtsMode::LowLatency,
        }));
    }
    if let Some(prompt) = &opts.system_prompt {
        config.inference = voxgate_realtime::InferenceSettings::new(
            prompt.clone(),
            voxgate_realtime::InferenceSettings::DEFAULT_TEMPERATURE,
        )
        .context("system prompt")?;
    }
    send(
        &mut ws,
        &ServiceBoundMessage::initialize(&config).context("initialize")?,
    )
    .await?;
    events.emit(
        "sent",
        json!({"message": "initialize_session_request", "input_rate": opts.input_rate,
               "output_rate": opts.output_rate, "tts": config.tts.is_some()}),
    );

    let mut out = RealtimeOutcome::default();
    let mut ready = false;
    let mut packet_id = 0u64;
    let mut turn_index = 0usize;
    // The current turn: sent and awaiting its ResponseEnd.
    let mut waiting = false;
    let mut streaming: Option<(Pacing, usize)> = None;
    let mut stream_done_at: Option<Instant> = None;
    let mut flushed = false;
    // Replies finished since the current turn began (audio turns may get one mid-stream).
    let mut turn_replies = 0usize;
    let mut current: Option<Reply> = None;

    loop {
        if ready && !waiting && streaming.is_none() {
            match turns.get(turn_index) {
                None => break,
                Some(Turn::Text(text)) => {
                    packet_id += 1;
                    let msg = ServiceBoundMessage::user_text(
                        packet_id,
                        InferenceTriggerMode::Immediate,
                        text.clone(),
                    );
                    send(&mut ws, &msg).await?;
                    events.emit(
                        "sent",
                        json!({"message": "user_input", "packet_id": packet_id, "text": text}),
                    );
                    waiting = true;
                }
                Some(Turn::Audio(frames)) => {
                    events.emit(
                        "sent",
                        json!({"message": "audio_stream_start", "frames": frames.len(),
                        "frame_ms": FRAME.as_millis()}),
                    );
                    streaming = Some((Pacing::new(Instant::now(), FRAME), 0));
                    stream_done_at = None;
                    flushed = false;
                    turn_replies = 0;
                    waiting = true;
                }
            }
        }
        let next_frame = streaming.map(|(p, i)| p.due(i as u64));
        let flush_at = match (stream_done_at, flushed, &current) {
            (Some(t), false, None) => Some(t + FLUSH_AFTER),
            _ => None,
        };
        tokio::select! {
            () = sleep_until(deadline) => bail!("timed out after {:?}", opts.timeout),
            () = sleep_until(next_frame.unwrap_or(deadline)), if next_frame.is_some() => {
                let Some((pacing, i)) = streaming.as_mut() else { continue };
                if let Some(Turn::Audio(frames)) = turns.get(turn_index) {
                    if let Some(frame) = frames.get(*i) {
                        packet_id += 1;
                        let msg = ServiceBoundMessage::user_audio(packet_id, InferenceTriggerMode::Immediate, frame.clone());
                        send(&mut ws, &msg).await?;
                        *i += 1;
                    }
                    if *i >= frames.len() {
                        let late = pacing.lateness((*i - 1) as u64, Instant::now());
                        events.emit("sent", json!({"message": "audio_stream_end", "frames": *i,
                            "last_frame_late_ms": late.as_millis()}));
                        streaming = None;
                        stream_done_at = Some(Instant::now());
                    }
                }
            }
            () = sleep_until(flush_at.unwrap_or(deadline)), if flush_at.is_some() => {
                if turn_replies > 0 {
                    // Answered while streaming (the reply outran real time) and nothing more
                    // began after the audio: the turn is over.
                    waiting = false;
                    turn_index += 1;
                    stream_done_at = None;
                    continue;
                }
                // The VAD did not end the utterance (e.g. no speech detected): end it now.
                send(&mut ws, &ServiceBoundMessage::trigger_inference(None, true)).await?;
                events.emit("sent", json!({"message": "trigger_inference", "flush_vad": true}));
                flushed = true;
            }
            msg = ws.next() => {
                let bytes = match msg {
                    Some(Ok(Message::Binary(b))) => b,
                    Some(Ok(Message::Close(frame))) => {
                        events.emit("closed", ws::close_fields(frame.as_ref()));
                        bail!("server closed the session{}", last_error(&out));
                    }
                    None => bail!("connection lost{}", last_error(&out)),
                    Some(Err(e)) => return Err(e).context("receiving"),
                    Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => continue,
                    Some(Ok(Message::Text(t))) => {
                        events.emit("unexpected_text", json!({"text": t.as_str()}));
                        continue;
                    }
                };
                let message = match ClientBoundMessage::decode_frame(bytes) {
                    Ok(m) => m,
                    Err(e) => {
                        events.emit("malformed", json!({"error": e.to_string()}));
                        continue;
                    }
                };
                let Some(payload) = message.payload else {
                    events.emit("empty", Value::Null);
                    continue;
                };
                let (name, fields) = describe(&payload);
                events.emit(name, fields);
                match payload {
                    Down::SessionReady(_) => ready = true,
                    Down::ResponseBegin(b) => {
                        current = Some(Reply { turn_id: b.turn_id, ..Reply::default() });
                    }
                    Down::ModelTextFragment(f) => {
                        if let Some(r) = &mut current { r.text.push_str(&f.text); }
                    }
                    Down::ModelAudioChunk(c) => {
                        if let Some(a) = &c.audio {
                            out.audio.extend(audio::from_s16le(&a.data));
                            if let Some(r) = &mut current { r.audio_bytes += a.data.len(); }
                        }
                    }
                    Down::ResponseEnd(_) => {
                        if let Some(r) = current.take() { out.replies.push(r); }
                        turn_replies += 1;
                        if waiting && streaming.is_none() {
                            waiting = false;
                            turn_index += 1;
                            stream_done_at = None;
                        }
                    }
                    Down::UserTranscriptionResult(t) => out.transcriptions.push(t.text),
                    Down::Error(e) => {
                        out.errors.push(e.message.clone());
                        if !ready {
                            bail!("server refused the session: {}", e.message);
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    let _ = ws.close(None).await;
    events.emit(
        "done",
        json!({"replies": out.replies.len(), "audio_samples": out.audio.len()}),
    );
    if let Some(path) = &opts.save_reply {
        audio::save_reply(path, opts.output_rate, &out.audio, events)?;
    }
    Ok(out)
}

fn last_error(out: &RealtimeOutcome) -> String {
    out.errors
        .last()
        .map(|e| format!(": {e}"))
        .unwrap_or_default()
}

async fn send(ws: &mut Ws, msg: &ServiceBoundMessage) -> anyhow::Result<()> {
    ws.send(Message::Binary(msg.to_frame()))
        .await
        .context("sending")
}

fn vad_state(raw: i32) -> Value {
    VadState::try_from(raw).map_or_else(|_| json!(raw), |s| json!(s.as_str_name()))
}

fn seconds(d: Option<&voxgate_realtime::proto::Duration>) -> Value {
    d.map_or(Value::Null, |d| {
        #[allow(clippy::cast_precision_loss)]
        let s = d.seconds as f64 + f64::from(d.nanos) / 1e9;
        json!(s)
    })
}

/// The event name and fields for one server message.
#[must_use]
pub fn describe(payload: &Down) -> (&'static str, Value) {
    match payload {
        Down::SessionReady(_) => ("session_ready", Value::Null),
        Down::ResponseBegin(b) => ("response_begin", json!({"turn_id": b.turn_id})),
        Down::ResponseEnd(e) => ("response_end", json!({"turn_id": e.turn_id})),
        Down::ModelTextFragment(f) => (
            "model_text_fragment",
            json!({"turn_id": f.turn_id, "text": f.text}),
        ),
        Down::ModelAudioChunk(c) => (
            "model_audio_chunk",
            json!({"turn_id": c.turn_id, "bytes": c.audio.as_ref().map_or(0, |a| a.data.len())}),
        ),
        Down::PlaybackClearBuffer(_) => ("playback_clear_buffer", Value::Null),
        Down::ToolCallRequest(t) => (
            "tool_call_request",
            json!({"id": t.id, "name": t.name, "turn_id": t.turn_id,
                   "parameters": t.parameters.as_ref()
                        .and_then(|p| voxgate_realtime::json::struct_to_json(p).ok())
                        .map(Value::Object)}),
        ),
        Down::ChatHistory(h) => (
            "chat_history",
            json!({"messages": h.messages.iter().map(chat_message).collect::<Vec<_>>()}),
        ),
        Down::Error(e) => (
            "error",
            json!({"category": SessionErrorCategory::try_from(e.category)
                        .map_or_else(|_| json!(e.category), |c| json!(c.as_str_name())),
                   "message": e.message, "trace_id": e.trace_id}),
        ),
        Down::UserTranscriptionResult(t) => (
            "user_transcription_result",
            json!({"turn_id": t.turn_id, "text": t.text, "language": t.language}),
        ),
        Down::ConversationQueryResult(q) => ("conversation_query_result", json!({"text": q.text})),
        Down::VadAnalysisFrame(f) => (
            "vad_analysis_frame",
            json!({"frame_index": f.frame_index, "session_time": seconds(f.session_time.as_ref()),
                   "confidence": f.confidence, "volume": f.volume, "state": vad_state(f.state)}),
        ),
        Down::VadStateEvent(v) => (
            "vad_state_event",
            json!({"session_time": seconds(v.session_time.as_ref()), "from": vad_state(v.from_state),
                   "to": vad_state(v.to_state), "packet_id": v.packet_id}),
        ),
        Down::ContextTruncated(c) => (
            "context_truncated",
            json!({"truncated_turn_ids": c.truncated_turn_ids, "response_turn_id": c.response_turn_id}),
        ),
        Down::Pong(_) => ("pong", Value::Null),
        Down::ModelSpeechProgress(p) => (
            "model_speech_progress",
            json!({"turn_id": p.turn_id, "text": p.text, "audio_bytes_played": p.audio_bytes_played, "exact": p.exact}),
        ),
        Down::TurnSnapshot(s) => (
            "turn_snapshot",
            json!({"is_final": s.is_final, "message": s.message.as_ref().map(chat_message)}),
        ),
        Down::InferenceComplete(i) => ("inference_complete", json!({"turn_id": i.turn_id})),
    }
}

fn chat_message(m: &voxgate_realtime::proto::ChatMessage) -> Value {
    let content: Vec<Value> = m
        .content
        .iter()
        .filter_map(|c| c.content.as_ref())
        .map(|c| match c {
            chat_message_content::Content::TextContent(t) => json!({"text": t.text,
                "tts_audio_bytes": t.tts_audio.as_ref().and_then(|a| a.audio.as_ref()).map(|a| a.data.len())}),
            chat_message_content::Content::InputAudio(a) => json!({"input_audio_bytes":
                a.audio.as_ref().map_or(0, |a| a.data.len()), "transcription": a.transcription}),
            chat_message_content::Content::Thoughts(t) => json!({"thoughts": t}),
            chat_message_content::Content::ToolCall(t) => json!({"tool_call": {"id": t.id, "name": t.name}}),
            chat_message_content::Content::ToolResult(r) => json!({"tool_result": {"id": r.id, "result": r.result}}),
            chat_message_content::Content::Instructions(i) => json!({"instructions": i}),
        })
        .collect();
    json!({
        "role": ChatMessageRole::try_from(m.role).map_or_else(|_| json!(m.role), |r| json!(r.as_str_name())),
        "delivery": ChatDeliveryStatus::try_from(m.delivery_status)
            .map_or_else(|_| json!(m.delivery_status), |d| json!(d.as_str_name())),
        "ephemeral": m.ephemeral,
        "turn_id": m.turn_id,
        "content": content,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use voxgate_realtime::proto;

    #[test]
    fn server_messages_render_as_named_events() {
        let (n, v) = describe(&ClientBoundMessage::response_begin(7).payload.unwrap());
        assert_eq!((n, v), ("response_begin", json!({"turn_id": 7})));
        let chunk = ClientBoundMessage::model_audio_chunk(Bytes::from_static(&[0; 960]), Some(7));
        let (n, v) = describe(&chunk.payload.unwrap());
        assert_eq!(
            (n, v),
            ("model_audio_chunk", json!({"turn_id": 7, "bytes": 960}))
        );
        let err = ClientBoundMessage::error(SessionErrorCategory::ErrorProtocol, "bad", None);
        let (n, v) = describe(&err.payload.unwrap());
        assert_eq!(n, "error");
        assert_eq!(v["category"], "ERROR_PROTOCOL");
        assert_eq!(v["message"], "bad");
        let vad = Down::VadStateEvent(proto::VadStateEvent {
            session_time: Some(proto::Duration {
                seconds: 1,
                nanos: 500_000_000,
            }),
            from_state: 0,
            to_state: 77,
            packet_id: 3,
        });
        let (_, v) = describe(&vad);
        assert_eq!(
            v,
            json!({"session_time": 1.5, "from": "SILENCE", "to": 77, "packet_id": 3})
        );
    }
}
