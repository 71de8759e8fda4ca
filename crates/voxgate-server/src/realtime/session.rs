//! The realtime door's translator: protobuf session messages in, engine events out.
//!
//! [`RealtimeDoor`] holds one connection's state (the engine once the session is initialized,
//! the audio line's codecs, playback progress) and turns each client message, provider event
//! and deadline into `ClientBoundMessage`s and provider requests, without I/O: the shared door
//! driver ([`crate::door`]) runs it. Reply audio goes out droppable (counted when the client
//! does not keep up); everything else is never dropped.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use voxgate_audio::format::{PcmDecoder, PcmEncoder, PcmFormat, SampleFormat};
use voxgate_audio::resample::RateConverter;
use voxgate_audio::vad::{VadConfig, VadState};
use voxgate_engine::history::{self, Content, DeliveryStatus};
use voxgate_engine::{
    ClientEvent, Engine, EngineConfig, ErrorCategory, Input, Output, OutputAudio, ProviderEvent,
    State, ToolDefinition, TriggerMode, TurnId,
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

use super::progress::Progress;
use crate::config::engine::{EngineSettings, Greeting};
use crate::door::{ClientFrame, Inbound, Out, ServerFrame, Translator, close_code};
use crate::metrics::{Door, Metrics};

/// Per-server settings every realtime session uses.
#[derive(Debug, Clone)]
pub(crate) struct RealtimeSettings {
    /// Replaces ElevenLabs' regional hosts for client-configured ElevenLabs TTS
    /// (`[realtime] elevenlabs_base_url`).
    pub(crate) elevenlabs_base_url: Option<String>,
    /// The sessions' LLM context budget (`[realtime] max_context_chars`; 0: unlimited).
    pub(crate) max_context_chars: usize,
    /// Messages a session's history keeps in memory (`[limits] max_history_messages`; 0:
    /// unlimited).
    pub(crate) max_history_messages: usize,
    /// `[realtime.engine]` over `[engine]`; a client's own VAD settings win over it.
    pub(crate) engine: EngineSettings,
}

/// A decoded frame, or the error to report for it.
#[derive(Debug)]
pub(crate) enum Incoming {
    /// A well-formed message.
    Message(Box<ServiceBoundMessage>),
    /// The error to answer an unusable frame with; the session goes on.
    Bad(ClientBoundMessage),
}

/// One realtime connection: before `InitializeSessionRequest` only that is accepted; after it
/// the [`Session`] answers everything.
pub(crate) struct RealtimeDoor {
    metrics: Arc<Metrics>,
    settings: RealtimeSettings,
    session: Option<Session>,
    /// The MCP endpoint's tools (run by the server, never sent to the client), for the
    /// engine made at `InitializeSessionRequest`.
    server_tools: Vec<voxgate_engine::ServerToolDefinition>,
}

/// An initialized session.
struct Session {
    engine: Engine,
    config: SessionConfig,
    decoder: PcmDecoder,
    encoder: PcmEncoder,
    /// Reply audio to the output rate, following the synthesizer's rate.
    resampler: RateConverter,
    /// Reply audio at the output rate, reused between chunks.
    converted: Vec<f32>,
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

fn frame(msg: &ClientBoundMessage) -> ServerFrame {
    ServerFrame::Binary(msg.to_frame())
}

fn is_audio(m: &ServiceBoundMessage) -> bool {
    matches!(
        m,
        ServiceBoundMessage {
            payload: Some(Payload::UserInput(proto::UserInput {
                input: Some(user_input::Input::AudioData(_)),
                ..
            }))
        }
    )
}

impl Translator for RealtimeDoor {
    type In = Incoming;
    type Event = ();

    fn decode(frame: ClientFrame, max: usize) -> Inbound<Incoming> {
        let bad = |m| Inbound::Keep(Incoming::Bad(m));
        match frame {
            ClientFrame::Binary(b) if b.len() > max => bad(ClientBoundMessage::error(
                SessionErrorCategory::ErrorProtocol,
                format!(
                    "frame of {} bytes exceeds the limit of {max} bytes",
                    b.len()
                ),
                None,
            )),
            ClientFrame::Binary(b) => match ServiceBoundMessage::decode_frame(b) {
                Ok(m) if is_audio(&m) => Inbound::Droppable(Incoming::Message(Box::new(m))),
                Ok(m) => Inbound::Keep(Incoming::Message(Box::new(m))),
                Err(e) => bad(e.to_client_message()),
            },
            ClientFrame::Text(_) => bad(ClientBoundMessage::error(
                SessionErrorCategory::ErrorProtocol,
                "text frames are not part of this protocol; send binary protobuf frames",
                None,
            )),
        }
    }

    fn on_client(&mut self, now: Instant, msg: Incoming, out: &mut Out) {
        match msg {
            Incoming::Bad(error) => {
                self.metrics.error(Door::Realtime);
                out.send(frame(&error));
            }
            Incoming::Message(m) => self.handle_message(now, *m, out),
        }
        self.drain(now, out);
    }

    fn on_provider(&mut self, now: Instant, event: ProviderEvent, out: &mut Out) {
        if let Some(s) = &mut self.session {
            // Provider events are never refused while the session is open.
            let _ = s.engine.handle_input(now, Input::Provider(event));
        }
        self.drain(now, out);
    }

    fn on_timeout(&mut self, now: Instant, out: &mut Out) {
        if let Some(s) = &mut self.session {
            if s.engine.poll_timeout().is_some_and(|d| d <= now) {
                s.engine.handle_timeout(now);
            }
            for m in s.progress_due(now, None) {
                out.send(frame(&m));
            }
        }
        self.drain(now, out);
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let s = self.session.as_ref()?;
        match (s.engine.poll_timeout(), s.progress_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn initialized(&self) -> bool {
        self.session.is_some()
    }

    fn on_init_timeout(&mut self, _now: Instant, out: &mut Out) {
        out.send(frame(&ClientBoundMessage::error(
            SessionErrorCategory::ErrorSession,
            "no InitializeSessionRequest in time; closing",
            None,
        )));
    }

    fn is_idle(&self) -> bool {
        self.session.as_ref().is_none_or(|s| {
            matches!(
                s.engine.state(),
                State::Idle | State::Listening | State::NotConnected
            )
        })
    }

    fn on_server_tools(
        &mut self,
        now: Instant,
        tools: Vec<voxgate_engine::ServerToolDefinition>,
        out: &mut Out,
    ) {
        if let Some(s) = &mut self.session {
            let _ = s
                .engine
                .handle_input(now, Input::ServerTools(tools.clone()));
        }
        self.server_tools = tools;
        self.drain(now, out);
    }

    fn speculation_stats(&self) -> Option<voxgate_engine::SpeculationStats> {
        self.session.as_ref().map(|s| s.engine.speculation_stats())
    }

    fn take_telemetry(&mut self, sink: &mut Vec<voxgate_engine::TurnEvent>) {
        if let Some(s) = &mut self.session {
            sink.extend(s.engine.take_telemetry());
        }
    }

    fn on_close(&mut self, now: Instant, out: &mut Out) {
        if let Some(s) = &mut self.session {
            let _ = s.engine.handle_input(now, Input::Close);
            // Cancels still go to the runner; client events are moot now.
            while let Some(o) = s.engine.poll_output() {
                if let Output::Provider(r) = o {
                    out.provider(r);
                }
            }
        }
    }
}

impl RealtimeDoor {
    /// A connection that has not initialized its session yet.
    pub(crate) fn new(metrics: Arc<Metrics>, settings: RealtimeSettings) -> Self {
        Self {
            metrics,
            settings,
            session: None,
            server_tools: Vec::new(),
        }
    }

    /// Reports an error, counting it.
    fn error(&self, out: &mut Out, category: SessionErrorCategory, message: impl Into<String>) {
        self.metrics.error(Door::Realtime);
        out.send(frame(&ClientBoundMessage::error(category, message, None)));
    }

    /// Reports a fatal error and closes after it (1008: the client's setup cannot be served).
    fn fatal(&self, out: &mut Out, msg: &ClientBoundMessage) {
        self.metrics.error(Door::Realtime);
        out.send(frame(msg));
        out.close(close_code::POLICY, "session initialization failed");
    }

    fn handle_message(&mut self, now: Instant, m: ServiceBoundMessage, out: &mut Out) {
        if let Err(e) = m.validate() {
            // A bad initialization leaves nothing to serve; anything else is reported and the
            // session goes on.
            if self.session.is_none()
                && matches!(m.payload, Some(Payload::InitializeSessionRequest(_)))
            {
                self.fatal(out, &e.to_client_message());
                return;
            }
            self.metrics.error(Door::Realtime);
            out.send(frame(&e.to_client_message()));
            return;
        }
        let Some(payload) = m.payload else {
            return;
        };
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
                out.send(frame(&e.to_client_message()));
                return;
            };
            return match SessionConfig::from_wire(&init) {
                Err(e) => self.fatal(out, &voxgate_realtime::Error::from(e).to_client_message()),
                Ok(config) => {
                    let client_vad = init.vad_configuration.as_ref();
                    match session_tts(&config, self.settings.elevenlabs_base_url.as_deref())
                        .and_then(|tts| {
                            let s = Session::new(config, client_vad, &self.settings, now)?;
                            Ok((tts, s))
                        }) {
                        Ok((tts, mut s)) => {
                            if let Some(tts) = tts {
                                out.set_tts(tts);
                            }
                            let _ = s
                                .engine
                                .handle_input(now, Input::ServerTools(self.server_tools.clone()));
                            let s = self.session.insert(s);
                            out.send(frame(&ClientBoundMessage::session_ready()));
                            if let Greeting::Say(words) = self.settings.engine.greeting() {
                                let greet = Input::DirectSpeech {
                                    text: words.to_owned(),
                                    include_in_history: true,
                                    uninterruptible: false,
                                };
                                if let Err(e) = s.engine.handle_input(now, greet) {
                                    let category = category(e.category());
                                    self.error(out, category, e.to_string());
                                }
                            }
                        }
                        Err(message) => self.fatal(
                            out,
                            &ClientBoundMessage::error(
                                SessionErrorCategory::ErrorConfiguration,
                                message,
                                None,
                            ),
                        ),
                    }
                }
            };
        };
        let input = match payload {
            Payload::InitializeSessionRequest(_) => {
                let e = voxgate_realtime::Error::from(ProtocolError::AlreadyInitialized);
                self.metrics.error(Door::Realtime);
                out.send(frame(&e.to_client_message()));
                return;
            }
            Payload::Ping(_) => {
                out.send(frame(&ClientBoundMessage::pong()));
                return;
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
                        return;
                    }
                    Some(user_input::Input::TextData(t)) => Input::Text {
                        text: t.data,
                        mode: trigger_mode(mode),
                    },
                    // `validate` refused a missing input.
                    None => return,
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
                    return;
                };
                for m in session.progress_due(now, Some((turn, r.bytes_played))) {
                    out.send(frame(&m));
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
                    out.send(frame(&msg));
                    return;
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
                        self.error(out, category, e.to_string());
                        return;
                    }
                    if let Some(format) = update.input.and_then(pcm_format) {
                        session.decoder = PcmDecoder::new(format);
                    }
                    update.apply(&mut session.config);
                    return;
                }
            },
        };
        if let Err(e) = session.engine.handle_input(now, input) {
            let category = category(e.category());
            self.error(out, category, e.to_string());
        }
    }

    /// Turns every pending engine output into frames and provider requests.
    fn drain(&mut self, now: Instant, out: &mut Out) {
        let Some(session) = &mut self.session else {
            return;
        };
        while let Some(o) = session.engine.poll_output() {
            match o {
                Output::Provider(r) => out.provider(r),
                Output::Client(event) => {
                    if matches!(event, ClientEvent::UserTranscription { .. }) {
                        // A spoken turn was committed: the server-added time starts.
                        out.turn_decided();
                    }
                    for msg in session.client_messages(now, event, &self.metrics) {
                        let audio = matches!(
                            msg.payload,
                            Some(proto::client_bound_message::Payload::ModelAudioChunk(_))
                        );
                        if audio {
                            out.send_droppable(frame(&msg));
                        } else {
                            out.send(frame(&msg));
                        }
                    }
                }
                _ => {}
            }
        }
    }
}

impl Session {
    /// A session for `config`; `client_vad` is the VAD configuration as the client sent it,
    /// to tell the values it chose from protocol defaults.
    fn new(
        config: SessionConfig,
        client_vad: Option<&proto::VadConfiguration>,
        settings: &RealtimeSettings,
        now: Instant,
    ) -> Result<Self, String> {
        let mut engine_config = EngineConfig {
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
            max_context_chars: settings.max_context_chars,
            max_history_messages: settings.max_history_messages,
            ..EngineConfig::default()
        };
        // The server's settings go over the protocol defaults; what the client set itself
        // goes over both.
        let vad = engine_config.vad;
        settings.engine.apply(&mut engine_config);
        keep_client_vad(&mut engine_config.vad, &vad, client_vad);
        let engine = Engine::new(engine_config, now).map_err(|e| e.to_string())?;
        let resampler =
            RateConverter::new(config.output.sample_rate()).map_err(|e| e.to_string())?;
        let (Some(input), Some(output)) = (pcm_format(config.input), pcm_format(config.output))
        else {
            return Err("unusable audio line".into());
        };
        Ok(Self {
            engine,
            decoder: PcmDecoder::new(input),
            encoder: PcmEncoder::new(output),
            config,
            resampler,
            converted: Vec::new(),
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
                self.resampler.reset();
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
            ClientEvent::History { messages, dropped } => {
                let mut out: Vec<proto::ChatMessage> = Vec::with_capacity(messages.len() + 1);
                if dropped > 0 {
                    // `ChatHistory` has no field for it: an ephemeral system note, first,
                    // tells the client that older messages left the session's memory.
                    out.push(proto::ChatMessage {
                        role: ChatMessageRole::System.into(),
                        content: vec![ChatMessageContent::text(dropped_note(dropped), None)],
                        delivery_status: ChatDeliveryStatus::DeliveryComplete.into(),
                        ephemeral: true,
                        created_at: Some(self.wall_time(now)),
                        turn_id: None,
                        truncated_at_response_turn_id: None,
                    });
                }
                out.extend(messages.iter().map(|m| self.chat_message(m)));
                vec![ClientBoundMessage::chat_history(out)]
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
                // Provider detail is logged under the error id the message names.
                tracing::info!(category = ?c, %message, "realtime session error");
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
        self.converted.clear();
        if let Err(e) = self
            .resampler
            .process_i16(samples, rate, &mut self.converted)
        {
            tracing::warn!(%e, rate, "cannot resample reply audio");
            return Bytes::new();
        }
        let mut bytes = Vec::new();
        self.encoder.encode_f32(&self.converted, &mut bytes);
        Bytes::from(bytes)
    }

    /// The resampler's buffered tail at the end of a response.
    fn flush_audio(&mut self) -> Option<Bytes> {
        self.converted.clear();
        self.resampler.flush(&mut self.converted);
        if self.converted.is_empty() {
            return None;
        }
        let mut bytes = Vec::new();
        self.encoder.encode_f32(&self.converted, &mut bytes);
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

/// The note an export starts with when older messages were dropped from memory
/// (`[limits] max_history_messages`).
fn dropped_note(dropped: u64) -> String {
    format!(
        "{dropped} earlier message{} of this session were dropped from memory \
         ([limits] max_history_messages)",
        if dropped == 1 { "" } else { "s" }
    )
}

fn chat_audio(a: &history::AudioData) -> proto::ChatAudioData {
    let bytes: Vec<u8> = a.samples.iter().flat_map(|s| s.to_le_bytes()).collect();
    let format = AudioFormat::new(a.sample_rate, 1, proto::SampleFormat::Signed16Bit)
        .unwrap_or(AudioFormat::SPEECH_16K);
    proto::ChatAudioData::new(Bytes::from(bytes), format, a.transcription.clone())
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

/// Puts back into `vad` the values of `client` (the session's VAD settings) that the client
/// chose in its `vad_configuration` (`wire`): a non-zero threshold or duration, and the
/// minimum volume whenever it sent a configuration (zero is a meaningful volume). Values the
/// protocol filled in for it stay as the server configured them.
fn keep_client_vad(
    vad: &mut VadConfig,
    client: &VadConfig,
    wire: Option<&proto::VadConfiguration>,
) {
    let Some(w) = wire else { return };
    let set = |d: Option<&proto::Duration>| d.is_some_and(|d| d.seconds != 0 || d.nanos != 0);
    if w.confidence_threshold != 0.0 {
        vad.confidence_threshold = client.confidence_threshold;
    }
    vad.min_volume = client.min_volume;
    if set(w.start_duration.as_ref()) {
        vad.start_duration = client.start_duration;
    }
    if set(w.stop_duration.as_ref()) {
        vad.stop_duration = client.stop_duration;
    }
    if set(w.backbuffer_duration.as_ref()) {
        vad.backbuffer_duration = client.backbuffer_duration;
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use voxgate_engine::{ProviderRequest, RequestId};
    use voxgate_realtime::proto::client_bound_message::Payload as Cb;

    fn door() -> RealtimeDoor {
        RealtimeDoor::new(
            Arc::new(Metrics::new()),
            RealtimeSettings {
                elevenlabs_base_url: None,
                max_context_chars: 0,
                max_history_messages: 0,
                engine: EngineSettings::default(),
            },
        )
    }

    fn feed(d: &mut RealtimeDoor, now: Instant, m: ServiceBoundMessage) -> Out {
        let mut out = Out::new();
        d.on_client(now, Incoming::Message(Box::new(m)), &mut out);
        out
    }

    fn payloads(out: &mut Out) -> Vec<Cb> {
        out.take_frames()
            .into_iter()
            .map(|f| match f {
                ServerFrame::Binary(b) => ClientBoundMessage::decode_frame(b)
                    .unwrap()
                    .payload
                    .unwrap(),
                ServerFrame::Text(t) => panic!("text frame {t}"),
            })
            .collect()
    }

    fn init(d: &mut RealtimeDoor, now: Instant) {
        let config = SessionConfig::new(AudioFormat::SPEECH_16K, AudioFormat::SPEECH_16K);
        let mut out = feed(d, now, ServiceBoundMessage::initialize(&config).unwrap());
        assert!(matches!(payloads(&mut out)[..], [Cb::SessionReady(_)]));
        assert!(d.initialized());
    }

    #[test]
    fn decode_sorts_audio_from_control_and_answers_bad_frames() {
        let audio = ServiceBoundMessage::user_audio(
            1,
            InferenceTriggerMode::Immediate,
            Bytes::from_static(&[0; 32]),
        );
        let frame = ClientFrame::Binary(audio.to_frame());
        assert!(matches!(
            RealtimeDoor::decode(frame, 1024),
            Inbound::Droppable(Incoming::Message(_))
        ));
        let ping = ClientFrame::Binary(ServiceBoundMessage::ping().to_frame());
        assert!(matches!(
            RealtimeDoor::decode(ping, 1024),
            Inbound::Keep(Incoming::Message(_))
        ));
        let big = ClientFrame::Binary(Bytes::from(vec![0u8; 2048]));
        assert!(matches!(
            RealtimeDoor::decode(big, 1024),
            Inbound::Keep(Incoming::Bad(_))
        ));
        let text = ClientFrame::Text("{}".into());
        assert!(matches!(
            RealtimeDoor::decode(text, 1024),
            Inbound::Keep(Incoming::Bad(_))
        ));
        let junk = ClientFrame::Binary(Bytes::from_static(&[0xff, 0xff, 0xff]));
        assert!(matches!(
            RealtimeDoor::decode(junk, 1024),
            Inbound::Keep(Incoming::Bad(_))
        ));
    }

    #[test]
    fn messages_before_initialization_are_errors_and_the_session_goes_on() {
        let mut d = door();
        let now = Instant::now();
        let mut out = feed(&mut d, now, ServiceBoundMessage::ping());
        let p = payloads(&mut out);
        assert!(
            matches!(&p[..], [Cb::Error(e)] if e.message.contains("initialize") || e.message.contains("Initialize")),
            "{p:?}"
        );
        assert!(out.closing().is_none());
        assert!(!d.initialized());
        assert!(d.poll_timeout().is_none());
        init(&mut d, now);
        let mut out = feed(&mut d, now, ServiceBoundMessage::ping());
        assert!(matches!(payloads(&mut out)[..], [Cb::Pong(_)]));
    }

    #[test]
    fn a_second_initialization_is_refused_without_closing() {
        let mut d = door();
        let now = Instant::now();
        init(&mut d, now);
        let config = SessionConfig::new(AudioFormat::SPEECH_16K, AudioFormat::SPEECH_16K);
        let mut out = feed(
            &mut d,
            now,
            ServiceBoundMessage::initialize(&config).unwrap(),
        );
        assert!(matches!(payloads(&mut out)[..], [Cb::Error(_)]));
        assert!(out.closing().is_none());
    }

    #[test]
    fn an_unusable_initialization_is_answered_then_closed_with_policy() {
        let mut d = door();
        // No audio lines at all.
        let init = proto::InitializeSessionRequest::default();
        let mut out = feed(&mut d, Instant::now(), ServiceBoundMessage::from(init));
        assert!(matches!(payloads(&mut out)[..], [Cb::Error(_)]));
        assert_eq!(out.closing().map(|c| c.code), Some(close_code::POLICY));
        assert!(!d.initialized());
    }

    #[test]
    fn the_init_timeout_says_why_before_the_close() {
        let mut d = door();
        let mut out = Out::new();
        d.on_init_timeout(Instant::now(), &mut out);
        let p = payloads(&mut out);
        assert!(
            matches!(&p[..], [Cb::Error(e)] if e.category == SessionErrorCategory::ErrorSession as i32)
        );
    }

    #[test]
    fn a_text_turn_asks_the_model_and_streams_its_reply_on_a_virtual_clock() {
        let mut d = door();
        let t0 = Instant::now();
        init(&mut d, t0);
        assert!(d.is_idle());
        let mut out = feed(
            &mut d,
            t0,
            ServiceBoundMessage::user_text(1, InferenceTriggerMode::Immediate, "hello"),
        );
        // The engine may wait for its own deadline before asking the model.
        let mut requests = out.take_requests();
        let mut now = t0;
        for _ in 0..10 {
            if !requests.is_empty() {
                break;
            }
            now = d
                .poll_timeout()
                .expect("a deadline while the turn is pending");
            let mut out = Out::new();
            d.on_timeout(now, &mut out);
            requests = out.take_requests();
        }
        let id = match &requests[..] {
            [ProviderRequest::Generate { id, .. }] => *id,
            other => panic!("expected one Generate, got {other:?}"),
        };
        assert!(!d.is_idle());
        let mut out = Out::new();
        d.on_provider(
            now,
            ProviderEvent::TextDelta {
                id,
                delta: "Hi there.".into(),
            },
            &mut out,
        );
        d.on_provider(now, ProviderEvent::Done { id }, &mut out);
        let p = payloads(&mut out);
        assert!(p.iter().any(|m| matches!(m, Cb::ResponseBegin(_))), "{p:?}");
        assert!(
            p.iter()
                .any(|m| matches!(m, Cb::ModelTextFragment(f) if f.text.contains("Hi there"))),
            "{p:?}"
        );
        assert!(p.iter().any(|m| matches!(m, Cb::ResponseEnd(_))), "{p:?}");
        // A stale event for a request no longer awaited is ignored.
        let mut out = Out::new();
        d.on_provider(
            now,
            ProviderEvent::TextDelta {
                id: RequestId(9_999),
                delta: "late".into(),
            },
            &mut out,
        );
        assert!(payloads(&mut out).is_empty());
    }

    /// Feeds a text turn and runs the virtual clock until the engine asks the model.
    fn until_generate(d: &mut RealtimeDoor, t0: Instant) -> (Instant, RequestId) {
        let mut out = feed(
            d,
            t0,
            ServiceBoundMessage::user_text(1, InferenceTriggerMode::Immediate, "hello"),
        );
        let mut requests = out.take_requests();
        let mut now = t0;
        for _ in 0..10 {
            if let [ProviderRequest::Generate { id, .. }] = &requests[..] {
                return (now, *id);
            }
            now = d
                .poll_timeout()
                .expect("a deadline while the turn is pending");
            let mut out = Out::new();
            d.on_timeout(now, &mut out);
            requests = out.take_requests();
        }
        panic!("no Generate request: {requests:?}");
    }

    #[test]
    fn close_cancels_provider_work() {
        let mut d = door();
        let t0 = Instant::now();
        init(&mut d, t0);
        let (now, id) = until_generate(&mut d, t0);
        let mut out = Out::new();
        d.on_close(now, &mut out);
        let requests = out.take_requests();
        assert!(
            requests
                .iter()
                .any(|r| matches!(r, ProviderRequest::Cancel { id: c } if *c == id)),
            "{requests:?}"
        );
    }
}
