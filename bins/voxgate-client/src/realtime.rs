//! The realtime protobuf door (Deepslate-compatible), on the `voxgate-realtime-client` crate:
//! initialize, send text turns or stream a WAV at real time, answer tool calls, print every
//! server message, save the spoken reply; over WebSocket or (with `--grpc`) gRPC.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use bytes::Bytes;
use serde_json::{Value, json};
use tokio::time::{Instant, sleep_until};
use voxgate_realtime::proto::{
    ChatDeliveryStatus, ChatMessageRole, HostedTtsMode, InferenceTriggerMode, ToolDefinition,
    VadState, chat_message_content,
};
use voxgate_realtime::{
    AudioFormat, HostedTtsSettings, HostedVoice, Open, SessionConfig, TtsSettings,
};
use voxgate_realtime_client::{ClientOptions, Endpoint, Event, RealtimeClient, Reconnect};

use crate::audio::{self, Pacing};
use crate::events::Events;

/// Audio frames of 20 ms, the size real-time clients send.
const FRAME: Duration = Duration::from_millis(20);
/// Silence streamed after the WAV so the server's VAD sees the end of the utterance.
const SILENCE_TAIL: Duration = Duration::from_millis(1200);
/// How long to wait for the VAD to start a reply before forcing one with `flush_vad`.
const FLUSH_AFTER: Duration = Duration::from_secs(2);

/// What to do in one realtime session.
#[derive(Debug, Clone)]
pub struct RealtimeOptions {
    /// `ws://host:port/realtime` or the long vendor path; with `grpc`, `http://host:port`.
    pub url: String,
    /// Speak gRPC (`voxgate.realtime.v1.RealtimeService`) instead of WebSocket.
    pub grpc: bool,
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
    /// Client tools (name, result): each is declared with a `{"city": string}` object schema
    /// and every call of it is answered with the result.
    pub tool_results: Vec<(String, String)>,
    /// Write the oneof names of every server message, in order, as a JSON array here; the
    /// session then ends with a history export (`chat_history` last).
    pub kinds_out: Option<PathBuf>,
    /// Give up after this long.
    pub timeout: Duration,
}

impl RealtimeOptions {
    /// Defaults for `url`: WebSocket, no turns, 16 kHz in, 24 kHz out, text replies, 30 s
    /// timeout.
    #[must_use]
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            grpc: false,
            texts: Vec::new(),
            wav: None,
            save_reply: None,
            api_key: None,
            input_rate: 16_000,
            output_rate: 24_000,
            tts: false,
            system_prompt: None,
            tool_results: Vec::new(),
            kinds_out: None,
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
    /// The oneof names of the server's messages, in order.
    pub kinds: Vec<&'static str>,
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
    tokio::time::timeout(opts.timeout, session(opts, events))
        .await
        .map_err(|_| anyhow!("timed out after {:?}", opts.timeout))?
}

fn config(opts: &RealtimeOptions) -> anyhow::Result<SessionConfig> {
    let line = |rate| AudioFormat::new(rate, 1, voxgate_realtime::proto::SampleFormat::Signed16Bit);
    let mut config = SessionConfig::new(
        line(opts.input_rate).context("input format")?,
        line(opts.output_rate).context("output format")?,
    );
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
    Ok(config)
}

/// The state of the turn being served.
#[derive(Default)]
struct TurnState {
    /// Sent and not done yet.
    waiting: bool,
    /// A tool result was sent and no reply began since.
    awaiting_continuation: bool,
    /// Replies finished since the turn began (audio turns may get one mid-stream).
    replies: usize,
}

async fn session(opts: &RealtimeOptions, events: &mut Events) -> anyhow::Result<RealtimeOutcome> {
    let mut turns: Vec<Turn> = opts.texts.iter().cloned().map(Turn::Text).collect();
    if let Some(path) = &opts.wav {
        let frames = audio::wav_frames(path, opts.input_rate, FRAME, SILENCE_TAIL)?
            .iter()
            .map(|f| Bytes::from(audio::s16le(f)))
            .collect();
        turns.push(Turn::Audio(frames));
    }
    let config = config(opts)?;
    let tools = opts
        .tool_results
        .iter()
        .map(|(name, _)| {
            ToolDefinition::from_json(
                name.clone(),
                None,
                &json!({"type": "object", "properties": {"city": {"type": "string"}}}),
            )
        })
        .collect::<Result<Vec<_>, _>>()
        .context("tool definition")?;
    let endpoint = if opts.grpc {
        Endpoint::grpc(opts.url.clone())
    } else {
        Endpoint::websocket(opts.url.clone())
    };
    let mut options = ClientOptions::new(endpoint).with_reconnect(Reconnect::NEVER);
    options.api_key.clone_from(&opts.api_key);
    options.connect_timeout = opts.timeout;
    options.ready_timeout = opts.timeout;
    options.request_timeout = opts.timeout;
    events.emit(
        "sent",
        json!({"message": "initialize_session_request", "input_rate": opts.input_rate,
               "output_rate": opts.output_rate, "tts": config.tts.is_some(),
               "transport": if opts.grpc { "grpc" } else { "websocket" }}),
    );
    let mut client = RealtimeClient::connect_with_tools(options, config, tools)
        .await
        .with_context(|| format!("connecting to {}", opts.url))?;
    let mut out = RealtimeOutcome::default();
    out.kinds.push("session_ready");
    events.emit("session_ready", Value::Null);

    let mut current: Option<Reply> = None;
    for turn in &turns {
        let mut state = TurnState {
            waiting: true,
            ..TurnState::default()
        };
        let mut streaming: Option<(Pacing, usize, &[Bytes])> = None;
        match turn {
            Turn::Text(text) => {
                client
                    .send_text(text.clone(), InferenceTriggerMode::Immediate)
                    .await?;
                events.emit("sent", json!({"message": "user_input", "text": text}));
            }
            Turn::Audio(frames) => {
                events.emit(
                    "sent",
                    json!({"message": "audio_stream_start", "frames": frames.len(),
                    "frame_ms": FRAME.as_millis()}),
                );
                streaming = Some((Pacing::new(Instant::now(), FRAME), 0, frames));
            }
        }
        let mut stream_done_at: Option<Instant> = None;
        let mut flushed = false;
        while state.waiting {
            let next_frame = streaming.as_ref().map(|(p, i, _)| p.due(*i as u64));
            let flush_at = match (stream_done_at, flushed, &current) {
                (Some(t), false, None) => Some(t + FLUSH_AFTER),
                _ => None,
            };
            let far = Instant::now() + Duration::from_secs(3600);
            tokio::select! {
                () = sleep_until(next_frame.unwrap_or(far)), if next_frame.is_some() => {
                    let Some((pacing, i, frames)) = streaming.as_mut() else { continue };
                    if let Some(frame) = frames.get(*i) {
                        client.send_audio(frame.clone(), InferenceTriggerMode::Immediate).await?;
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
                () = sleep_until(flush_at.unwrap_or(far)), if flush_at.is_some() => {
                    if state.replies > 0 {
                        // Answered while streaming (the reply outran real time) and nothing
                        // more began after the audio: the turn is over.
                        state.waiting = false;
                        continue;
                    }
                    // The VAD did not end the utterance (e.g. no speech detected): end it now.
                    client.trigger_inference(None, true).await?;
                    events.emit("sent", json!({"message": "trigger_inference", "flush_vad": true}));
                    flushed = true;
                }
                event = client.next_event() => {
                    let Some(event) = event else {
                        bail!("the session ended: {}", client.end_reason().unwrap_or_default());
                    };
                    let streaming_now = streaming.is_some();
                    handle(&client, opts, event, &mut out, &mut current, &mut state, streaming_now, events)
                        .await?;
                }
            }
        }
    }
    if let Some(path) = &opts.kinds_out {
        let history = client.export_history(true, true).await?;
        // What the server sent before the history (a reply's final snapshot) is queued.
        while let Some(event) = client.try_next_event() {
            if let Some(kind) = event.kind() {
                out.kinds.push(kind.as_str());
            }
            let (name, fields) = describe(&event);
            events.emit(name, fields);
        }
        out.kinds.push("chat_history");
        events.emit(
            "chat_history",
            json!({"messages": history.iter().map(chat_message).collect::<Vec<_>>()}),
        );
        let text = serde_json::to_string_pretty(&out.kinds)?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    client.close().await;
    events.emit(
        "done",
        json!({"replies": out.replies.len(), "audio_samples": out.audio.len()}),
    );
    if let Some(path) = &opts.save_reply {
        audio::save_reply(path, opts.output_rate, &out.audio, events)?;
    }
    Ok(out)
}

/// One server event: printed, recorded, and acted on (tool calls answered, turns ended).
#[allow(
    clippy::too_many_arguments,
    reason = "the session loop's state, passed once"
)]
async fn handle(
    client: &RealtimeClient,
    opts: &RealtimeOptions,
    event: Event,
    out: &mut RealtimeOutcome,
    current: &mut Option<Reply>,
    state: &mut TurnState,
    streaming: bool,
    events: &mut Events,
) -> anyhow::Result<()> {
    if let Some(kind) = event.kind() {
        out.kinds.push(kind.as_str());
    }
    let (name, fields) = describe(&event);
    events.emit(name, fields);
    match event {
        Event::ResponseBegin { turn_id } => {
            *current = Some(Reply {
                turn_id,
                ..Reply::default()
            });
            state.awaiting_continuation = false;
        }
        Event::TextFragment { text, .. } => {
            if let Some(r) = current {
                r.text.push_str(&text);
            }
        }
        Event::AudioChunk { audio: a, .. } => {
            out.audio.extend(audio::from_s16le(&a));
            if let Some(r) = current {
                r.audio_bytes += a.len();
            }
        }
        Event::ResponseEnd { .. } => {
            if let Some(r) = current.take() {
                out.replies.push(r);
            }
            state.replies += 1;
            if !streaming && !state.awaiting_continuation {
                state.waiting = false;
            }
        }
        Event::UserTranscription { text, .. } => out.transcriptions.push(text),
        Event::ToolCall(call) => {
            if let Some((_, result)) = opts.tool_results.iter().find(|(n, _)| *n == call.name) {
                client.tool_result(call.id.clone(), result.clone()).await?;
                events.emit(
                    "sent",
                    json!({"message": "tool_call_response", "id": call.id, "result": result}),
                );
                state.awaiting_continuation = true;
            } else {
                // Nobody answers it; the turn does not wait for it.
                events.emit("unanswered_tool_call", json!({"name": call.name}));
            }
        }
        Event::Error(e) => out.errors.push(e.message),
        _ => {}
    }
    Ok(())
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

/// The event name (the message's oneof name) and fields for one server event.
#[must_use]
pub fn describe(event: &Event) -> (&'static str, Value) {
    let name = event.kind().map_or("client", |k| k.as_str());
    let fields = match event {
        Event::ResponseBegin { turn_id }
        | Event::ResponseEnd { turn_id }
        | Event::InferenceComplete { turn_id } => json!({"turn_id": turn_id}),
        Event::TextFragment { turn_id, text } => json!({"turn_id": turn_id, "text": text}),
        Event::AudioChunk { turn_id, audio } => json!({"turn_id": turn_id, "bytes": audio.len()}),
        Event::PlaybackClear => Value::Null,
        Event::ToolCall(t) => json!({"id": t.id, "name": t.name, "turn_id": t.turn_id,
                                     "parameters": t.arguments}),
        Event::Error(e) => json!({
            "category": match e.category {
                Open::Known(c) => json!(c.as_str_name()),
                Open::Unknown(v) => json!(v),
            },
            "message": e.message, "trace_id": e.trace_id}),
        Event::UserTranscription {
            turn_id,
            text,
            language,
        } => json!({"turn_id": turn_id, "text": text, "language": language}),
        Event::VadFrame(f) => json!({"frame_index": f.frame_index,
            "session_time": seconds(f.session_time.as_ref()),
            "confidence": f.confidence, "volume": f.volume, "state": vad_state(f.state)}),
        Event::VadState(v) => json!({"session_time": seconds(v.session_time.as_ref()),
            "from": vad_state(v.from_state), "to": vad_state(v.to_state), "packet_id": v.packet_id}),
        Event::ContextTruncated {
            truncated_turn_ids,
            response_turn_id,
        } => {
            json!({"truncated_turn_ids": truncated_turn_ids, "response_turn_id": response_turn_id})
        }
        Event::SpeechProgress(p) => json!({"turn_id": p.turn_id, "text": p.text,
            "audio_bytes_played": p.audio_bytes_played, "exact": p.exact}),
        Event::TurnSnapshot { message, is_final } => {
            json!({"is_final": is_final, "message": chat_message(message)})
        }
        Event::Reconnecting { attempt, reason } => {
            json!({"reconnecting": attempt, "reason": reason})
        }
        Event::Reconnected { attempt } => json!({"reconnected": attempt}),
        other => json!({"debug": format!("{other:?}")}),
    };
    (name, fields)
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
    use voxgate_realtime::proto::{self, SessionErrorCategory};

    #[test]
    fn server_events_render_as_named_events() {
        let (n, v) = describe(&Event::ResponseBegin { turn_id: 7 });
        assert_eq!((n, v), ("response_begin", json!({"turn_id": 7})));
        let chunk = Event::AudioChunk {
            turn_id: Some(7),
            audio: Bytes::from_static(&[0; 960]),
        };
        assert_eq!(
            describe(&chunk),
            ("model_audio_chunk", json!({"turn_id": 7, "bytes": 960}))
        );
        let err = Event::Error(voxgate_realtime_client::SessionError {
            category: Open::Known(SessionErrorCategory::ErrorProtocol),
            message: "bad".into(),
            trace_id: None,
        });
        let (n, v) = describe(&err);
        assert_eq!(n, "error");
        assert_eq!(v["category"], "ERROR_PROTOCOL");
        assert_eq!(v["message"], "bad");
        let vad = Event::VadState(proto::VadStateEvent {
            session_time: Some(proto::Duration {
                seconds: 1,
                nanos: 500_000_000,
            }),
            from_state: 0,
            to_state: 77,
            packet_id: 3,
        });
        let (n, v) = describe(&vad);
        assert_eq!(n, "vad_state_event");
        assert_eq!(
            v,
            json!({"session_time": 1.5, "from": "SILENCE", "to": 77, "packet_id": 3})
        );
    }
}
