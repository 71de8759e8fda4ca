//! The realtime door: the protobuf session protocol (Deepslate-compatible) over WebSocket.
//!
//! One task per connection owns one [`Engine`]. A reader task decodes frames into a bounded
//! queue (audio is dropped and counted when the queue is full, control messages wait); a writer
//! task sends encoded frames from another bounded queue (reply audio is dropped and counted
//! when the client does not keep up, control messages wait). The session loop waits for a
//! client message, a provider event or the engine's deadline, feeds it in with
//! `Instant::now()`, and drains the engine's outputs: client events become
//! `ClientBoundMessage`s, provider requests become tasks ([`crate::providers`]).
//!
//! Per session: a client whose `TtsConfiguration` names ElevenLabs gets its own synthesizer
//! (its key, voice, model, settings and location; `[realtime] elevenlabs_base_url` overrides
//! the host); hosted TTS uses the server's. `ModelSpeechProgress` is paced to playback
//! ([`Progress`]); `InferenceComplete` precedes each `ResponseEnd`; a final `TurnSnapshot`
//! follows each finished reply. The engine's `Emotion` events have no counterpart in this
//! protocol and are dropped, so replies reach realtime clients without emoji (the engine never
//! shows or speaks them). `ContextTruncated` reports the turns the engine drops from the model's
//! context to keep it within `[realtime] max_context_chars`; exported messages carry the
//! response turn that dropped them in `truncated_at_response_turn_id`. The user guide is
//! `docs/doors/realtime.md`.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use axum::extract::ws::{Message, WebSocket};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use tokio::sync::{mpsc, watch};
use voxgate_audio::format::{PcmDecoder, PcmEncoder, PcmFormat, SampleFormat, i16_to_f32};
use voxgate_audio::resample::Resampler;
use voxgate_audio::vad::{VadConfig, VadState};
use voxgate_engine::history::{self, Content, DeliveryStatus};
use voxgate_engine::{
    ClientEvent, Engine, EngineConfig, ErrorCategory, Input, Output, OutputAudio, ProviderEvent,
    ToolDefinition, TriggerMode, TurnId,
};
use voxgate_providers::{ElevenLabsConfig, ElevenLabsLocation, ElevenLabsTts, Tts};
use voxgate_realtime::prost_types;
use voxgate_realtime::proto::{
    self, ChatDeliveryStatus, ChatMessageContent, ChatMessageRole, InferenceTriggerMode,
    SessionErrorCategory, service_bound_message::Payload, user_input,
};
use voxgate_realtime::{
    AudioFormat, ClientBoundMessage, Open, ProtocolError, ServiceBoundMessage, SessionConfig,
    SessionUpdate, TtsSettings,
};

use crate::metrics::{Direction, Door, Metrics};
use crate::providers::{Providers, Runner};

/// What a connection needs from the server.
#[derive(Debug, Clone)]
pub(crate) struct DoorContext {
    pub(crate) providers: Providers,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) max_frame_bytes: usize,
    pub(crate) shutdown: watch::Receiver<bool>,
    /// Replaces ElevenLabs' regional hosts for client-configured ElevenLabs TTS
    /// (`[realtime] elevenlabs_base_url`).
    pub(crate) elevenlabs_base_url: Option<String>,
    /// The sessions' LLM context budget (`[realtime] max_context_chars`; 0: unlimited).
    pub(crate) max_context_chars: usize,
}

/// A decoded frame, or the error to report for it.
enum Incoming {
    Message(ServiceBoundMessage),
    Bad(ClientBoundMessage),
}

/// A frame for the writer; `close` ends the connection after it.
struct Outgoing {
    frame: Bytes,
    close: bool,
}

const IN_QUEUE: usize = 64;
const OUT_QUEUE: usize = 256;

/// Serves one upgraded connection until the client leaves, a fatal error, or shutdown.
pub(crate) async fn serve(socket: WebSocket, ctx: DoorContext) {
    let metrics = Arc::clone(&ctx.metrics);
    let _active = metrics.session(Door::Realtime);
    let (mut sink, mut stream) = socket.split();
    let (in_tx, in_rx) = mpsc::channel::<Incoming>(IN_QUEUE);
    let (out_tx, mut out_rx) = mpsc::channel::<Outgoing>(OUT_QUEUE);

    let reader_metrics = Arc::clone(&ctx.metrics);
    let max = ctx.max_frame_bytes;
    let reader = tokio::spawn(async move {
        while let Some(Ok(msg)) = stream.next().await {
            let incoming = match msg {
                Message::Binary(b) if b.len() > max => Incoming::Bad(ClientBoundMessage::error(
                    SessionErrorCategory::ErrorProtocol,
                    format!(
                        "frame of {} bytes exceeds the limit of {max} bytes",
                        b.len()
                    ),
                    None,
                )),
                Message::Binary(b) => match ServiceBoundMessage::decode_frame(b) {
                    Ok(m) => Incoming::Message(m),
                    Err(e) => Incoming::Bad(e.to_client_message()),
                },
                Message::Text(_) => Incoming::Bad(ClientBoundMessage::error(
                    SessionErrorCategory::ErrorProtocol,
                    "text frames are not part of this protocol; send binary protobuf frames",
                    None,
                )),
                Message::Close(_) => break,
                Message::Ping(_) | Message::Pong(_) => continue,
            };
            let is_audio = matches!(
                &incoming,
                Incoming::Message(ServiceBoundMessage {
                    payload: Some(Payload::UserInput(proto::UserInput {
                        input: Some(user_input::Input::AudioData(_)),
                        ..
                    }))
                })
            );
            if is_audio {
                match in_tx.try_send(incoming) {
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        reader_metrics.dropped(Door::Realtime, Direction::Uplink, 1);
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => break,
                    Ok(()) => {}
                }
            } else if in_tx.send(incoming).await.is_err() {
                break;
            }
        }
    });
    let writer = tokio::spawn(async move {
        while let Some(out) = out_rx.recv().await {
            if sink.send(Message::Binary(out.frame)).await.is_err() {
                return;
            }
            if out.close {
                break;
            }
        }
        let _ = sink.close().await;
    });

    let (runner, provider_rx) = Runner::new(ctx.providers.clone(), Arc::clone(&ctx.metrics));
    let mut conn = Connection {
        out: out_tx,
        metrics: Arc::clone(&ctx.metrics),
        session: None,
        runner,
        elevenlabs_base_url: ctx.elevenlabs_base_url.clone(),
        max_context_chars: ctx.max_context_chars,
    };
    conn.run(in_rx, provider_rx, ctx.shutdown).await;
    // Dropping the connection aborts provider work and closes the writer's queue.
    drop(conn);
    reader.abort();
    let _ = writer.await;
}

/// Whether the session goes on after a message.
#[derive(Debug, PartialEq, Eq)]
enum Flow {
    Continue,
    Close,
}

struct Connection {
    out: mpsc::Sender<Outgoing>,
    metrics: Arc<Metrics>,
    session: Option<Session>,
    runner: Runner,
    elevenlabs_base_url: Option<String>,
    max_context_chars: usize,
}

/// An initialized session.
struct Session {
    engine: Engine,
    config: SessionConfig,
    decoder: PcmDecoder,
    encoder: PcmEncoder,
    /// Reply audio resampler, keyed by its source rate.
    resampler: Option<(u32, Resampler)>,
    scratch: Vec<f32>,
    last_packet: u64,
    /// The response being delivered (playback reports without `turn_id` refer to it).
    current_turn: Option<TurnId>,
    /// Output-format bytes of reply audio sent for `current_turn` so far.
    turn_bytes: u64,
    /// `ModelSpeechProgress` for `current_turn`, paced to playback.
    progress: Progress,
    /// Wall clock and monotonic clock at the start, to date history messages.
    epoch: (Instant, SystemTime),
}

impl Connection {
    async fn run(
        &mut self,
        mut in_rx: mpsc::Receiver<Incoming>,
        mut provider_rx: mpsc::Receiver<ProviderEvent>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        if *shutdown.borrow() {
            return;
        }
        loop {
            let deadline = self.session.as_ref().and_then(|s| {
                match (s.engine.poll_timeout(), s.progress_deadline()) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                }
            });
            let sleep_until = deadline
                .map(tokio::time::Instant::from_std)
                .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
            let flow = tokio::select! {
                incoming = in_rx.recv() => match incoming {
                    None => break,
                    Some(Incoming::Bad(error)) => {
                        self.send(error).await;
                        self.metrics.error(Door::Realtime);
                        Flow::Continue
                    }
                    Some(Incoming::Message(m)) => self.handle_message(m).await,
                },
                Some(event) = provider_rx.recv() => {
                    self.runner.finished(&event);
                    if let Some(s) = &mut self.session {
                        // Provider events are never refused while the session is open.
                        let _ = s.engine.handle_input(Instant::now(), Input::Provider(event));
                    }
                    Flow::Continue
                }
                () = tokio::time::sleep_until(sleep_until), if deadline.is_some() => {
                    let now = Instant::now();
                    let mut progress = Vec::new();
                    if let Some(s) = &mut self.session {
                        if s.engine.poll_timeout().is_some_and(|d| d <= now) {
                            s.engine.handle_timeout(now);
                        }
                        progress = s.progress_due(now, None);
                    }
                    for m in progress {
                        self.send(m).await;
                    }
                    Flow::Continue
                }
                _ = shutdown.changed() => Flow::Close,
            };
            self.drain().await;
            if flow == Flow::Close {
                break;
            }
        }
        if let Some(s) = &mut self.session {
            let _ = s.engine.handle_input(Instant::now(), Input::Close);
            // Cancels still go to the runner; client events are moot now.
            while let Some(out) = s.engine.poll_output() {
                if let Output::Provider(r) = out {
                    self.runner.start(r);
                }
            }
        }
    }

    async fn send(&self, msg: ClientBoundMessage) {
        let _ = self
            .out
            .send(Outgoing {
                frame: msg.to_frame(),
                close: false,
            })
            .await;
    }

    /// Reports an error, counting it.
    async fn error(&self, category: SessionErrorCategory, message: impl Into<String>) {
        self.metrics.error(Door::Realtime);
        self.send(ClientBoundMessage::error(category, message, None))
            .await;
    }

    /// Reports a fatal error and asks the writer to close after it.
    async fn fatal(&self, msg: ClientBoundMessage) -> Flow {
        self.metrics.error(Door::Realtime);
        let _ = self
            .out
            .send(Outgoing {
                frame: msg.to_frame(),
                close: true,
            })
            .await;
        Flow::Close
    }

    async fn handle_message(&mut self, m: ServiceBoundMessage) -> Flow {
        if let Err(e) = m.validate() {
            // A bad initialization leaves nothing to serve; anything else is reported and the
            // session goes on.
            if self.session.is_none()
                && matches!(m.payload, Some(Payload::InitializeSessionRequest(_)))
            {
                return self.fatal(e.to_client_message()).await;
            }
            self.metrics.error(Door::Realtime);
            self.send(e.to_client_message()).await;
            return Flow::Continue;
        }
        let Some(payload) = m.payload else {
            return Flow::Continue;
        };
        let now = Instant::now();
        let Some(session) = &mut self.session else {
            let Payload::InitializeSessionRequest(init) = payload else {
                let kind = ServiceBoundMessage {
                    payload: Some(payload),
                }
                .kind()
                .map_or("message", |k| k.as_str());
                let e =
                    voxgate_realtime::Error::from(ProtocolError::NotInitialized { message: kind });
                self.metrics.error(Door::Realtime);
                self.send(e.to_client_message()).await;
                return Flow::Continue;
            };
            return match SessionConfig::from_wire(&init) {
                Err(e) => {
                    self.fatal(voxgate_realtime::Error::from(e).to_client_message())
                        .await
                }
                Ok(config) => match session_tts(&config, self.elevenlabs_base_url.as_deref())
                    .and_then(|tts| Ok((tts, Session::new(config, self.max_context_chars, now)?)))
                {
                    Ok((tts, s)) => {
                        if let Some(tts) = tts {
                            self.runner.set_tts(tts);
                        }
                        self.session = Some(s);
                        self.send(ClientBoundMessage::session_ready()).await;
                        Flow::Continue
                    }
                    Err(message) => {
                        self.fatal(ClientBoundMessage::error(
                            SessionErrorCategory::ErrorConfiguration,
                            message,
                            None,
                        ))
                        .await
                    }
                },
            };
        };
        let input = match payload {
            Payload::InitializeSessionRequest(_) => {
                let e = voxgate_realtime::Error::from(ProtocolError::AlreadyInitialized);
                self.metrics.error(Door::Realtime);
                self.send(e.to_client_message()).await;
                return Flow::Continue;
            }
            Payload::Ping(_) => {
                self.send(ClientBoundMessage::pong()).await;
                return Flow::Continue;
            }
            Payload::UserInput(u) => {
                let mode = u.mode_open();
                match u.input {
                    Some(user_input::Input::AudioData(a)) => {
                        session
                            .engine
                            .set_audio_trigger(now, audio_trigger_mode(mode));
                        session.last_packet = u.packet_id;
                        session.scratch.clear();
                        session.decoder.decode_f32(&a.data, &mut session.scratch);
                        session.engine.handle_audio(now, &session.scratch);
                        return Flow::Continue;
                    }
                    Some(user_input::Input::TextData(t)) => Input::Text {
                        text: t.data,
                        mode: trigger_mode(mode),
                    },
                    // `validate` refused a missing input.
                    None => return Flow::Continue,
                }
            }
            Payload::UpdateToolDefinitionsRequest(u) => {
                let mut tools = Vec::with_capacity(u.tool_definitions.len());
                for t in u.tool_definitions {
                    let parameters = t
                        .parameters
                        .as_ref()
                        .and_then(|s| voxgate_realtime::json::struct_to_json(s).ok())
                        .map_or_else(
                            || serde_json::json!({"type": "object", "properties": {}}),
                            serde_json::Value::Object,
                        );
                    tools.push(ToolDefinition {
                        name: t.name,
                        description: t.description.unwrap_or_default(),
                        parameters,
                    });
                }
                Input::SetTools(tools)
            }
            Payload::ToolCallResponse(r) => Input::ToolResult {
                id: r.id,
                result: r.result,
            },
            Payload::TriggerInference(t) => Input::TriggerInference {
                instructions: t.extra_instructions,
                flush_vad: t.flush_vad,
            },
            Payload::ExportChatHistoryRequest(r) => Input::ExportHistory {
                await_pending: r.await_pending,
                exclude_audio: r.exclude_audio,
            },
            Payload::PlaybackPositionReport(r) => {
                let Some(turn) = r.turn_id.map(TurnId).or(session.current_turn) else {
                    return Flow::Continue;
                };
                for m in session.progress_due(now, Some((turn, r.bytes_played))) {
                    // `self.out` directly: `session` borrows `self.session`.
                    let frame = m.to_frame();
                    let _ = self
                        .out
                        .send(Outgoing {
                            frame,
                            close: false,
                        })
                        .await;
                }
                Input::PlaybackReport {
                    turn,
                    bytes_played: r.bytes_played,
                }
            }
            Payload::DirectSpeech(d) => Input::DirectSpeech {
                text: d.text,
                include_in_history: d.include_in_history,
                uninterruptible: d.uninterruptable,
            },
            Payload::ConversationQuery(q) => Input::ConversationQuery {
                prompt: q.prompt,
                instructions: q.instructions,
            },
            Payload::ReconfigureSessionRequest(r) => match SessionUpdate::from_wire(&r) {
                Err(e) => {
                    let msg = voxgate_realtime::Error::from(e).to_client_message();
                    self.metrics.error(Door::Realtime);
                    self.send(msg).await;
                    return Flow::Continue;
                }
                Ok(update) => {
                    // Only a changed rate swaps the engine's VAD; a new channel count or
                    // sample format is the decoder's business alone.
                    let input_rate = update
                        .input
                        .map(AudioFormat::sample_rate)
                        .filter(|r| *r != session.config.input.sample_rate());
                    let (system_prompt, temperature) = match &update.inference {
                        Some(i) => (Some(i.system_prompt().to_owned()), Some(i.temperature())),
                        None => (None, None),
                    };
                    let input = Input::Reconfigure {
                        input_rate,
                        system_prompt,
                        temperature,
                    };
                    if let Err(e) = session.engine.handle_input(now, input) {
                        // Refused unchanged: keep decoding the old format too.
                        let category = category(e.category());
                        self.error(category, e.to_string()).await;
                        return Flow::Continue;
                    }
                    if let Some(format) = update.input.and_then(pcm_format) {
                        session.decoder = PcmDecoder::new(format);
                    }
                    update.apply(&mut session.config);
                    return Flow::Continue;
                }
            },
        };
        if let Err(e) = session.engine.handle_input(now, input) {
            let category = category(e.category());
            self.error(category, e.to_string()).await;
        }
        Flow::Continue
    }

    /// Sends every pending engine output.
    async fn drain(&mut self) {
        loop {
            let Some(session) = &mut self.session else {
                return;
            };
            let Some(out) = session.engine.poll_output() else {
                return;
            };
            match out {
                Output::Provider(r) => self.runner.start(r),
                Output::Client(event) => {
                    let now = Instant::now();
                    for msg in session.client_messages(now, event, &self.metrics) {
                        let audio = matches!(
                            msg.payload,
                            Some(proto::client_bound_message::Payload::ModelAudioChunk(_))
                        );
                        let out = Outgoing {
                            frame: msg.to_frame(),
                            close: false,
                        };
                        if audio {
                            if self.out.try_send(out).is_err() {
                                self.metrics.dropped(Door::Realtime, Direction::Downlink, 1);
                            }
                        } else {
                            let _ = self.out.send(out).await;
                        }
                    }
                }
                _ => {}
            }
        }
    }
}

impl Session {
    fn new(config: SessionConfig, max_context_chars: usize, now: Instant) -> Result<Self, String> {
        let engine_config = EngineConfig {
            turn: voxgate_turn_config(config.supports_playback_reporting),
            vad: VadConfig {
                confidence_threshold: config.vad.confidence_threshold(),
                min_volume: config.vad.min_volume(),
                start_duration: config.vad.start_duration(),
                stop_duration: config.vad.stop_duration(),
                backbuffer_duration: config.vad.backbuffer_duration(),
            },
            input_rate: config.input.sample_rate(),
            // Speak only when the client configured TTS: text-only clients get fragments.
            output_audio: config.tts.as_ref().map(|_| OutputAudio {
                bytes_per_second: u32::try_from(config.output.bytes_per_second())
                    .unwrap_or(u32::MAX),
            }),
            system_prompt: config.inference.system_prompt().to_owned(),
            temperature: Some(config.inference.temperature()),
            vad_frame_telemetry: config.enable_vad_frame_telemetry,
            max_context_chars,
            ..EngineConfig::default()
        };
        let engine = Engine::new(engine_config, now).map_err(|e| e.to_string())?;
        let (Some(input), Some(output)) = (pcm_format(config.input), pcm_format(config.output))
        else {
            return Err("unusable audio line".into());
        };
        Ok(Self {
            engine,
            decoder: PcmDecoder::new(input),
            encoder: PcmEncoder::new(output),
            config,
            resampler: None,
            scratch: Vec::new(),
            last_packet: 0,
            current_turn: None,
            turn_bytes: 0,
            progress: Progress::default(),
            epoch: (now, SystemTime::now()),
        })
    }

    /// The protocol messages for one engine event (none for events this door does not show).
    fn client_messages(
        &mut self,
        now: Instant,
        event: ClientEvent,
        metrics: &Metrics,
    ) -> Vec<ClientBoundMessage> {
        match event {
            ClientEvent::ResponseBegin { turn } => {
                self.current_turn = Some(turn);
                self.turn_bytes = 0;
                self.progress = Progress::default();
                vec![ClientBoundMessage::response_begin(turn.0)]
            }
            ClientEvent::ResponseEnd { turn } => {
                let mut out = Vec::new();
                if let Some(tail) = self.flush_audio() {
                    self.turn_bytes += tail.len() as u64;
                    self.progress
                        .audio_sent(now, tail.len(), self.output_rate());
                    out.push(ClientBoundMessage::model_audio_chunk(tail, Some(turn.0)));
                }
                self.progress.close(now, self.turn_bytes);
                // Generation is over (finished or cut off): nothing more will be inferred
                // for this turn, though its audio may still be playing.
                out.push(ClientBoundMessage::inference_complete(turn.0));
                out.push(ClientBoundMessage::response_end(turn.0));
                out
            }
            ClientEvent::ResponseFinished { turn, interrupted } => {
                metrics.turn(Door::Realtime);
                // Played out: whatever progress is still pending was heard. Cut off: what
                // was not announced yet was not heard (the snapshot has the truncated text).
                let mut out = Vec::new();
                if !interrupted && self.current_turn == Some(turn) {
                    out = self.progress.due(None, None, turn, false);
                }
                self.progress = Progress::default();
                // The reply's history entry is final now (truncated to what was heard when
                // cut off): the client's authoritative record of the turn.
                let message = self
                    .engine
                    .history()
                    .iter()
                    .rev()
                    .find(|m| m.turn == Some(turn) && m.role == history::Role::Assistant)
                    .map(|m| self.chat_message(&m.without_audio()));
                out.extend(message.map(|m| ClientBoundMessage::turn_snapshot(m, true)));
                out
            }
            ClientEvent::SentenceStart { text, .. } => {
                // Announced once its audio has been played (see `Progress`).
                self.progress.start(now, text, self.turn_bytes);
                Vec::new()
            }
            ClientEvent::TextFragment { turn, text } => {
                vec![ClientBoundMessage::model_text_fragment(text, Some(turn.0))]
            }
            ClientEvent::AudioChunk {
                turn,
                samples,
                sample_rate,
                ..
            } => {
                let audio = self.convert_audio(&samples, sample_rate);
                if audio.is_empty() {
                    return Vec::new();
                }
                self.turn_bytes += audio.len() as u64;
                self.progress
                    .audio_sent(now, audio.len(), self.output_rate());
                vec![ClientBoundMessage::model_audio_chunk(audio, Some(turn.0))]
            }
            ClientEvent::ClearPlayback => {
                self.progress = Progress::default();
                if let Some((_, r)) = &mut self.resampler {
                    r.reset();
                }
                vec![ClientBoundMessage::playback_clear_buffer()]
            }
            ClientEvent::VadState { from, to, position } => {
                vec![ClientBoundMessage::vad_state_event(
                    self.session_time(position),
                    vad_state(from),
                    vad_state(to),
                    self.last_packet,
                )]
            }
            ClientEvent::VadFrame {
                index,
                confidence,
                volume,
                state,
            } => vec![ClientBoundMessage::vad_analysis_frame(
                index,
                Duration::from_millis(index.saturating_mul(16)),
                confidence,
                volume,
                vad_state(state),
                vec![self.last_packet],
            )],
            ClientEvent::UserTranscription {
                turn,
                text,
                language,
            } => vec![ClientBoundMessage::user_transcription_result(
                turn.0, text, language,
            )],
            ClientEvent::ToolCallRequest {
                id,
                name,
                arguments,
                turn,
            } => {
                let request = proto::ToolCallRequest::from_json(
                    id.clone(),
                    name.clone(),
                    &arguments,
                    Some(turn.0),
                )
                .unwrap_or(proto::ToolCallRequest {
                    id,
                    name,
                    parameters: None,
                    turn_id: Some(turn.0),
                });
                vec![ClientBoundMessage::tool_call_request(request)]
            }
            ClientEvent::History { messages, .. } => {
                let messages = messages.iter().map(|m| self.chat_message(m)).collect();
                vec![ClientBoundMessage::chat_history(messages)]
            }
            ClientEvent::QueryResult { text } => {
                vec![ClientBoundMessage::conversation_query_result(text)]
            }
            ClientEvent::ContextTruncated {
                truncated,
                response,
            } => vec![ClientBoundMessage::context_truncated(
                truncated.iter().map(|t| t.0).collect(),
                response.0,
            )],
            ClientEvent::Error {
                category: c,
                message,
            } => {
                metrics.error(Door::Realtime);
                vec![ClientBoundMessage::error(category(c), message, None)]
            }
            // The protocol has no face: the reply's leading emoji is neither spoken nor shown
            // (see docs/doors/realtime.md). Device MCP belongs to the Xiaozhi door.
            _ => Vec::new(),
        }
    }

    /// Output bytes per second (at least 1).
    fn output_rate(&self) -> u64 {
        self.config.output.bytes_per_second().max(1)
    }

    /// When the next `ModelSpeechProgress` is due by estimated playback (sessions without
    /// playback reports).
    fn progress_deadline(&self) -> Option<Instant> {
        if self.config.supports_playback_reporting {
            return None;
        }
        self.progress.next_due()
    }

    /// `ModelSpeechProgress` for the sentences played by `now` (estimated) or, with a
    /// playback report for the current turn, by `bytes_played` (exact).
    fn progress_due(
        &mut self,
        now: Instant,
        report: Option<(TurnId, u64)>,
    ) -> Vec<ClientBoundMessage> {
        let Some(turn) = self.current_turn else {
            return Vec::new();
        };
        match report {
            Some((t, bytes)) if t == turn => self.progress.due(None, Some(bytes), turn, true),
            Some(_) => Vec::new(),
            None if self.config.supports_playback_reporting => Vec::new(),
            None => self.progress.due(Some(now), None, turn, false),
        }
    }

    fn session_time(&self, position: u64) -> Duration {
        let rate = u64::from(self.config.input.sample_rate().max(1));
        Duration::from_micros(position.saturating_mul(1_000_000) / rate)
    }

    /// Reply audio (mono i16 at `rate`) in the client's output format.
    fn convert_audio(&mut self, samples: &[i16], rate: u32) -> Bytes {
        let out_rate = self.config.output.sample_rate();
        let floats: Vec<f32> = samples.iter().map(|&s| i16_to_f32(s)).collect();
        let mut bytes = Vec::new();
        if rate == out_rate {
            self.encoder.encode_f32(&floats, &mut bytes);
            return Bytes::from(bytes);
        }
        if self
            .resampler
            .as_ref()
            .is_none_or(|(from, _)| *from != rate)
        {
            match Resampler::new(rate, out_rate) {
                Ok(r) => self.resampler = Some((rate, r)),
                Err(e) => {
                    tracing::warn!(%e, rate, out_rate, "cannot resample reply audio");
                    self.resampler = None;
                    return Bytes::new();
                }
            }
        }
        let mut converted = Vec::new();
        if let Some((_, r)) = &mut self.resampler {
            r.process(&floats, &mut converted);
        }
        self.encoder.encode_f32(&converted, &mut bytes);
        Bytes::from(bytes)
    }

    /// The resampler's buffered tail at the end of a response.
    fn flush_audio(&mut self) -> Option<Bytes> {
        let (_, r) = self.resampler.as_mut()?;
        let mut tail = Vec::new();
        r.flush(&mut tail);
        if tail.is_empty() {
            return None;
        }
        let mut bytes = Vec::new();
        self.encoder.encode_f32(&tail, &mut bytes);
        Some(Bytes::from(bytes))
    }

    fn wall_time(&self, at: Instant) -> prost_types::Timestamp {
        let (mono, wall) = self.epoch;
        let t = if at >= mono {
            wall + (at - mono)
        } else {
            wall.checked_sub(mono - at).unwrap_or(wall)
        };
        let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        prost_types::Timestamp {
            seconds: i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(since.subsec_nanos()).unwrap_or(0),
        }
    }

    /// The engine's history message in the protocol's `ChatMessage` model.
    fn chat_message(&self, m: &history::ChatMessage) -> proto::ChatMessage {
        let role = match m.role {
            history::Role::System => ChatMessageRole::System,
            history::Role::User => ChatMessageRole::User,
            _ => ChatMessageRole::Assistant,
        };
        let delivery = match m.delivery {
            DeliveryStatus::InProgress => ChatDeliveryStatus::DeliveryInProgress,
            DeliveryStatus::Interrupted => ChatDeliveryStatus::DeliveryInterrupted,
            _ => ChatDeliveryStatus::DeliveryComplete,
        };
        let content = m
            .content
            .iter()
            .filter_map(|c| match c {
                Content::Text { text, tts_audio } => Some(ChatMessageContent::text(
                    text.clone(),
                    tts_audio.as_ref().map(chat_audio),
                )),
                Content::InputAudio(a) => Some(ChatMessageContent::input_audio(chat_audio(a))),
                Content::Thoughts(t) => Some(ChatMessageContent::thoughts(t.clone())),
                Content::ToolCall {
                    id,
                    name,
                    arguments,
                    ..
                } => Some(ChatMessageContent::tool_call(
                    proto::ToolCallRequest::from_json(
                        id.clone(),
                        name.clone(),
                        arguments,
                        m.turn.map(|t| t.0),
                    )
                    .unwrap_or(proto::ToolCallRequest {
                        id: id.clone(),
                        name: name.clone(),
                        parameters: None,
                        turn_id: m.turn.map(|t| t.0),
                    }),
                )),
                Content::ToolResult { id, result } => {
                    Some(ChatMessageContent::tool_result(proto::ToolCallResponse {
                        id: id.clone(),
                        result: result.clone(),
                    }))
                }
                Content::Instructions(i) => Some(ChatMessageContent::instructions(i.clone())),
                _ => None,
            })
            .collect();
        proto::ChatMessage {
            role: role.into(),
            content,
            delivery_status: delivery.into(),
            ephemeral: m.ephemeral,
            created_at: Some(self.wall_time(m.created_at)),
            turn_id: m.turn.map(|t| t.0),
            truncated_at_response_turn_id: m.truncated_at_response_turn.map(|t| t.0),
        }
    }
}

fn chat_audio(a: &history::AudioData) -> proto::ChatAudioData {
    let bytes: Vec<u8> = a.samples.iter().flat_map(|s| s.to_le_bytes()).collect();
    let format = AudioFormat::new(a.sample_rate, 1, proto::SampleFormat::Signed16Bit)
        .unwrap_or(AudioFormat::SPEECH_16K);
    proto::ChatAudioData::new(Bytes::from(bytes), format, a.transcription.clone())
}

/// Paces `ModelSpeechProgress` to playback, sentence by sentence, as the published clients
/// read it: each message carries text that has just become audible, and `audio_bytes_played`
/// is the reply's playback position (in output bytes) at which all of it has been heard. The
/// LiveKit plugin times its transcript from consecutive positions and concatenates the texts,
/// so sentences after the first carry their separating space.
///
/// A sentence is closed (its end known) when the next one starts or the reply's audio ends.
/// Without playback reports its end is estimated by a playout clock (chunks play back to back
/// from when they were sent); with reports, a report at or past its end announces it (`exact`).
#[derive(Debug, Default)]
struct Progress {
    /// Closed sentences not announced yet: (text, end in bytes, estimated end of playback).
    closed: std::collections::VecDeque<(String, u64, Instant)>,
    /// The sentence whose audio is still arriving.
    open: Option<String>,
    /// When the audio sent so far will have played, by the playout clock.
    playout_end: Option<Instant>,
    /// Whether a sentence was started in this reply (later ones get a leading space).
    started: bool,
}

impl Progress {
    fn start(&mut self, now: Instant, text: String, bytes: u64) {
        self.close(now, bytes);
        let text = if self.started {
            format!(" {text}")
        } else {
            text
        };
        self.started = true;
        self.open = Some(text);
    }

    fn audio_sent(&mut self, now: Instant, bytes: usize, bytes_per_second: u64) {
        let nanos = (bytes as u128).saturating_mul(1_000_000_000) / u128::from(bytes_per_second);
        let duration = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        let from = self.playout_end.map_or(now, |end| end.max(now));
        self.playout_end = Some(from + duration);
    }

    /// Closes the open sentence at `bytes`.
    fn close(&mut self, now: Instant, bytes: u64) {
        if let Some(text) = self.open.take() {
            let due = self.playout_end.unwrap_or(now);
            self.closed.push_back((text, bytes, due));
        }
    }

    fn next_due(&self) -> Option<Instant> {
        self.closed.front().map(|(_, _, due)| *due)
    }

    /// The announcements due by `now` (estimated) and/or `played` bytes (reported); with
    /// neither, every closed sentence.
    fn due(
        &mut self,
        now: Option<Instant>,
        played: Option<u64>,
        turn: TurnId,
        exact: bool,
    ) -> Vec<ClientBoundMessage> {
        let mut out = Vec::new();
        while let Some((_, end, due)) = self.closed.front() {
            let heard = match (now, played) {
                (Some(now), _) => *due <= now,
                (None, Some(played)) => *end <= played,
                (None, None) => true,
            };
            if !heard {
                break;
            }
            if let Some((text, end, _)) = self.closed.pop_front() {
                out.push(ClientBoundMessage::model_speech_progress(
                    turn.0, text, end, exact,
                ));
            }
        }
        out
    }
}

/// ElevenLabs' PCM output rates (`output_format=pcm_<rate>`).
const ELEVENLABS_RATES: [u32; 5] = [8_000, 16_000, 22_050, 24_000, 44_100];

/// The synthesizer a session's `TtsConfiguration` asks for: `Some` for ElevenLabs with the
/// client's key, voice, model, settings and location (at the supported rate nearest the
/// client's output rate, so little or no resampling is needed); `None` keeps the server's own
/// (hosted TTS, or no TTS at all).
fn session_tts(
    config: &SessionConfig,
    base_url: Option<&str>,
) -> Result<Option<Arc<dyn Tts>>, String> {
    let Some(TtsSettings::ElevenLabs(e)) = &config.tts else {
        return Ok(None);
    };
    let out_rate = config.output.sample_rate();
    let sample_rate = ELEVENLABS_RATES
        .iter()
        .copied()
        .min_by_key(|r| r.abs_diff(out_rate))
        .unwrap_or(24_000);
    let mut c = ElevenLabsConfig::new(e.api_key(), e.voice_id());
    c.model_id = e.model_id().map(str::to_owned);
    c.voice_settings = e
        .voice_settings()
        .map(|v| voxgate_providers::VoiceSettings {
            stability: v.stability(),
            similarity_boost: v.similarity_boost(),
            style: v.style(),
            use_speaker_boost: v.use_speaker_boost(),
            speed: v.speed(),
        });
    c.location = match e.location() {
        proto::ElevenLabsLocation::Eu => ElevenLabsLocation::Eu,
        proto::ElevenLabsLocation::India => ElevenLabsLocation::India,
        _ => ElevenLabsLocation::Us,
    };
    c.base_url = base_url.map(str::to_owned);
    c.sample_rate = sample_rate;
    ElevenLabsTts::new(c)
        .map(|t| Some(Arc::new(t) as Arc<dyn Tts>))
        .map_err(|e| format!("tts_configuration.eleven_labs: {e}"))
}

fn voxgate_turn_config(playback_reports: bool) -> voxgate_turn::Config {
    voxgate_turn::Config {
        playback_reports,
        ..voxgate_turn::Config::default()
    }
}

/// The audio crate's layout for a checked wire format (`None` cannot happen: the wire format
/// guarantees a non-zero rate and channel count).
fn pcm_format(f: AudioFormat) -> Option<PcmFormat> {
    let sample_format = match f.sample_format() {
        proto::SampleFormat::Unsigned8Bit => SampleFormat::Unsigned8,
        proto::SampleFormat::Signed16Bit => SampleFormat::Signed16,
        proto::SampleFormat::Signed32Bit => SampleFormat::Signed32,
        proto::SampleFormat::Float32Bit => SampleFormat::Float32,
        proto::SampleFormat::Float64Bit => SampleFormat::Float64,
    };
    PcmFormat::new(f.sample_rate(), f.channels(), sample_format).ok()
}

fn trigger_mode(mode: Open<InferenceTriggerMode>) -> TriggerMode {
    match mode.known() {
        Some(InferenceTriggerMode::NoTrigger) => TriggerMode::NoTrigger,
        Some(InferenceTriggerMode::Immediate) => TriggerMode::Immediate,
        // Unknown values act like the default of a newer client: queue the reply.
        _ => TriggerMode::Queue,
    }
}

/// Audio's trigger mode: unknown values keep the default behaviour of spoken turns (barge-in,
/// reply at the end of the turn), which is what `IMMEDIATE` clients get.
fn audio_trigger_mode(mode: Open<InferenceTriggerMode>) -> TriggerMode {
    match mode.known() {
        Some(InferenceTriggerMode::NoTrigger) => TriggerMode::NoTrigger,
        Some(InferenceTriggerMode::Queue) => TriggerMode::Queue,
        _ => TriggerMode::Immediate,
    }
}

fn vad_state(s: VadState) -> proto::VadState {
    match s {
        VadState::SpeechStarting => proto::VadState::SpeechStarting,
        VadState::Speech => proto::VadState::Speech,
        VadState::SpeechEnding => proto::VadState::SpeechEnding,
        _ => proto::VadState::Silence,
    }
}

fn category(c: ErrorCategory) -> SessionErrorCategory {
    match c {
        ErrorCategory::Session => SessionErrorCategory::ErrorSession,
        ErrorCategory::Configuration => SessionErrorCategory::ErrorConfiguration,
        ErrorCategory::Protocol => SessionErrorCategory::ErrorProtocol,
        ErrorCategory::Inference => SessionErrorCategory::ErrorInference,
        ErrorCategory::Audio => SessionErrorCategory::ErrorAudio,
        ErrorCategory::Tts => SessionErrorCategory::ErrorTts,
        _ => SessionErrorCategory::ErrorInternal,
    }
}
