//! The Gemini bridge JSON protocol: `CONNECT_GEMINI`, wait for `SETUP_COMPLETE`, send text
//! turns (`SEND_MESSAGE`) or stream a WAV as 16 kHz PCM (`SEND_REALTIME_INPUT`), print every
//! server message, save the reply PCM.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::time::{Instant, sleep_until};
use tokio_tungstenite::tungstenite::Message;
use voxgate_gemini::{Blob, ClientMessage, LiveConfig, Part, RealtimeInput, ServerMessage};

use crate::audio::{self, Pacing};
use crate::events::{Events, redact_audio};
use crate::ws::{self, Ws};

/// The rate of the audio the client sends.
pub const INPUT_RATE: u32 = 16_000;
/// The rate of reply audio unless its mime type says otherwise.
pub const OUTPUT_RATE: u32 = 24_000;
/// Audio chunk length sent in each `SEND_REALTIME_INPUT`.
const CHUNK: Duration = Duration::from_millis(40);
/// Silence after the WAV, so a server-side VAD sees the end of speech.
const SILENCE_TAIL: Duration = Duration::from_millis(1200);

/// What to do in one bridge session.
#[derive(Debug, Clone)]
pub struct GeminiOptions {
    /// `ws://host:3001/` or `ws://host:8080/gemini`.
    pub url: String,
    /// Text turns, each after the previous `TURN_COMPLETE`.
    pub texts: Vec<String>,
    /// A WAV streamed at real time as one audio turn.
    pub wav: Option<PathBuf>,
    /// Where to save the reply audio as WAV; asks for `AUDIO` replies.
    pub save_reply: Option<PathBuf>,
    /// The model name in the setup.
    pub model: String,
    /// Ask for audio replies even without `save_reply`.
    pub audio: bool,
    /// Give up after this long.
    pub timeout: Duration,
}

impl GeminiOptions {
    /// Defaults for `url`: text replies, 30 s timeout.
    #[must_use]
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            texts: Vec::new(),
            wav: None,
            save_reply: None,
            model: "models/gemini-2.0-flash-live-001".into(),
            audio: false,
            timeout: Duration::from_secs(30),
        }
    }
}

/// What a session produced.
#[derive(Debug, Clone, Default)]
pub struct GeminiOutcome {
    /// Model text per completed turn.
    pub turns: Vec<String>,
    /// Input transcriptions.
    pub input_transcripts: Vec<String>,
    /// Output transcriptions.
    pub output_transcripts: Vec<String>,
    /// `GEMINI_ERROR` messages.
    pub errors: Vec<String>,
    /// Reply audio (s16 at `sample_rate`).
    pub audio: Vec<i16>,
    /// The reply audio's rate.
    pub sample_rate: u32,
}

enum Turn {
    Text(String),
    Audio(Vec<Vec<f32>>),
}

/// The `CONNECT_GEMINI` message for `opts`.
///
/// # Errors
/// Never in practice (the config is built from known-good JSON).
pub fn connect_message(opts: &GeminiOptions) -> anyhow::Result<ClientMessage> {
    let modality = if opts.audio || opts.save_reply.is_some() {
        "AUDIO"
    } else {
        "TEXT"
    };
    let config: LiveConfig = serde_json::from_value(json!({
        "model": opts.model,
        "generationConfig": {"responseModalities": [modality]},
    }))
    .context("building the live config")?;
    Ok(ClientMessage::ConnectGemini {
        initial_config: Some(config),
    })
}

/// Runs one bridge session, emitting every event to `events`.
///
/// # Errors
/// Connection failures, a failed setup, the server closing before the turns finished, or the
/// timeout.
pub async fn run(opts: &GeminiOptions, events: &mut Events) -> anyhow::Result<GeminiOutcome> {
    let deadline = Instant::now() + opts.timeout;
    let mut turns: Vec<Turn> = opts.texts.iter().cloned().map(Turn::Text).collect();
    if let Some(path) = &opts.wav {
        let chunks = audio::wav_frames(path, INPUT_RATE, CHUNK, SILENCE_TAIL)?;
        turns.push(Turn::Audio(chunks));
    }
    let mut ws = ws::open(&opts.url, &[], opts.timeout, events, Value::Null).await?;
    send(&mut ws, &connect_message(opts)?, events).await?;

    let mut out = GeminiOutcome {
        sample_rate: OUTPUT_RATE,
        ..GeminiOutcome::default()
    };
    let mut ready = false;
    let mut turn_index = 0usize;
    let mut waiting = false;
    let mut streaming: Option<(Pacing, usize)> = None;
    let mut text = String::new();

    loop {
        if ready && !waiting && streaming.is_none() {
            match turns.get(turn_index) {
                None => break,
                Some(Turn::Text(t)) => {
                    let msg = ClientMessage::SendMessage {
                        parts: vec![Part::text(t.clone())],
                        turn_complete: true,
                    };
                    send(&mut ws, &msg, events).await?;
                    waiting = true;
                }
                Some(Turn::Audio(chunks)) => {
                    events.emit(
                        "sent",
                        json!({"message": "audio_stream_start", "chunks": chunks.len(),
                        "chunk_ms": CHUNK.as_millis()}),
                    );
                    streaming = Some((Pacing::new(Instant::now(), CHUNK), 0));
                    waiting = true;
                }
            }
        }
        let next = streaming.map(|(p, i)| p.due(i as u64));
        tokio::select! {
            () = sleep_until(deadline) => bail!("timed out after {:?}", opts.timeout),
            () = sleep_until(next.unwrap_or(deadline)), if next.is_some() => {
                let Some((_, i)) = streaming.as_mut() else { continue };
                let Some(Turn::Audio(chunks)) = turns.get(turn_index) else { continue };
                if let Some(chunk) = chunks.get(*i) {
                    let pcm: Vec<i16> = chunk.iter().map(|&s| voxgate_audio::format::f32_to_i16(s)).collect();
                    let input = RealtimeInput { audio: Some(Blob::pcm(&pcm, INPUT_RATE)), ..RealtimeInput::default() };
                    let frame = ClientMessage::SendRealtimeInput(input).encode();
                    ws.send(Message::Text(frame.into())).await.context("sending audio")?;
                    *i += 1;
                } else {
                    let end = RealtimeInput { audio_stream_end: true, ..RealtimeInput::default() };
                    send(&mut ws, &ClientMessage::SendRealtimeInput(end), events).await?;
                    streaming = None;
                }
            }
            msg = ws.next() => match msg {
                Some(Ok(Message::Text(frame))) => {
                    let mut raw: Value = serde_json::from_str(frame.as_str()).unwrap_or_else(|_| json!(frame.as_str()));
                    redact_audio(&mut raw);
                    events.emit("recv", json!({"message": raw}));
                    let message = match ServerMessage::decode(frame.as_str()) {
                        Ok(m) => m,
                        Err(e) => {
                            events.emit("malformed", json!({"error": e.to_string()}));
                            continue;
                        }
                    };
                    match message {
                        ServerMessage::SetupComplete(s) => {
                            if !s.success {
                                bail!("setup failed: {}", frame.as_str());
                            }
                            ready = true;
                        }
                        ServerMessage::ContentMessage(c) => {
                            text.push_str(&c.text());
                            for blob in c.audio() {
                                let mut pcm = Vec::new();
                                match blob.decode_pcm(&mut pcm) {
                                    Ok(info) => {
                                        if let Some(rate) = info.sample_rate { out.sample_rate = rate; }
                                        out.audio.extend_from_slice(&pcm[..info.samples.min(pcm.len())]);
                                    }
                                    Err(e) => events.emit("bad_audio", json!({"error": e.to_string()})),
                                }
                            }
                            if let Some(t) = &c.input_transcription { out.input_transcripts.push(t.text.clone()); }
                            if let Some(t) = &c.output_transcription { out.output_transcripts.push(t.text.clone()); }
                        }
                        ServerMessage::AudioChunk { data } => {
                            let blob = Blob { mime_type: format!("audio/pcm;rate={OUTPUT_RATE}"), data };
                            let mut pcm = Vec::new();
                            if let Ok(info) = blob.decode_pcm(&mut pcm) {
                                out.audio.extend_from_slice(&pcm[..info.samples.min(pcm.len())]);
                            }
                        }
                        ServerMessage::TurnComplete => {
                            out.turns.push(std::mem::take(&mut text));
                            if waiting && streaming.is_none() {
                                waiting = false;
                                turn_index += 1;
                            }
                        }
                        ServerMessage::GeminiError { message, .. } => {
                            if !ready { bail!("the bridge refused the session: {message}"); }
                            out.errors.push(message);
                        }
                        ServerMessage::GeminiDisconnected { reason } => {
                            bail!("the bridge disconnected: {}", reason.unwrap_or_default());
                        }
                        _ => {}
                    }
                }
                Some(Ok(Message::Close(frame))) => {
                    events.emit("closed", ws::close_fields(frame.as_ref()));
                    bail!("server closed the session");
                }
                None => bail!("connection lost"),
                Some(Err(e)) => return Err(e).context("receiving"),
                Some(Ok(_)) => {}
            }
        }
    }
    send(&mut ws, &ClientMessage::DisconnectGemini, events).await?;
    let _ = ws.close(None).await;
    events.emit(
        "done",
        json!({"turns": out.turns.len(), "audio_samples": out.audio.len()}),
    );
    if let Some(path) = &opts.save_reply {
        audio::save_reply(path, out.sample_rate, &out.audio, events)?;
    }
    Ok(out)
}

async fn send(ws: &mut Ws, msg: &ClientMessage, events: &mut Events) -> anyhow::Result<()> {
    let text = msg.encode();
    let mut value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    redact_audio(&mut value);
    events.emit("sent", json!({"message": value}));
    ws.send(Message::Text(text.into())).await.context("sending")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_asks_for_the_right_modality() {
        let mut opts = GeminiOptions::new("ws://x");
        let v: Value = serde_json::from_str(&connect_message(&opts).unwrap().encode()).unwrap();
        assert_eq!(v["type"], "CONNECT_GEMINI");
        let modalities = &v["payload"]["initialConfig"]["generationConfig"]["responseModalities"];
        assert_eq!(modalities.to_string().to_uppercase(), r#"["TEXT"]"#);
        opts.save_reply = Some("x.wav".into());
        let v: Value = serde_json::from_str(&connect_message(&opts).unwrap().encode()).unwrap();
        let modalities = &v["payload"]["initialConfig"]["generationConfig"]["responseModalities"];
        assert_eq!(modalities.to_string().to_uppercase(), r#"["AUDIO"]"#);
    }
}
