//! Engine mode: a bridge session answered by voxgate's own pipeline.
//!
//! The bridge's messages become engine inputs (typed text, 16 kHz PCM or a whole WAV file,
//! client tool results) and the engine's events become the Live API shapes the bridge's apps
//! read inside `CONTENT_MESSAGE`: `modelTurn` text or 24 kHz `inlineData` audio,
//! `inputTranscription`/`outputTranscription`, `interrupted` and `turnComplete` (each followed
//! by its own `INTERRUPTED`/`TURN_COMPLETE`), and `TOOL_CALL`/`TOOL_CALL_CANCELLATION`.
//!
//! While the app's WebRTC connection is up ([`EngineSession::set_media`]) the microphone comes
//! from its track ([`EngineSession::media_audio`], the same path as `SEND_REALTIME_INPUT` audio)
//! and the reply's audio goes out on it as [`MediaCommand::Play`] at the engine's own rate
//! instead of `inlineData` (no `AUDIO_CHUNK` either); everything else stays on the WebSocket,
//! and a barge-in clears the track's queued audio ([`MediaCommand::Clear`]).
//!
//! No I/O: the session takes the time as a value and writes frames, provider requests and media
//! commands into the door driver's [`Out`]; provider events come back through
//! [`EngineSession::provider_event`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use voxgate_audio::format::i16_to_f32;
use voxgate_audio::resample::RateConverter;
use voxgate_engine::{
    ClientEvent, Engine, EngineConfig, Input, Output, OutputAudio, ProviderEvent, ProviderRequest,
    RequestId, State, ToolDefinition, TriggerMode, TurnId,
};
use voxgate_gemini::live::{INPUT_SAMPLE_RATE, OUTPUT_SAMPLE_RATE};
use voxgate_gemini::{
    Blob, ClientMessage, Content, FunctionCall, LiveConfig, Modality, Part, RealtimeInput,
    ServerContent, ServerMessage, ToolCall, ToolCallCancellation, ToolResponse, Transcription,
};

use super::emit;
use crate::config::engine::{EngineSettings, Greeting};
use crate::door::{MediaCommand, Out};
use crate::metrics::{Door, Metrics};

/// Per-connection output options from the door's configuration.
#[derive(Debug, Clone, Copy)]
pub(super) struct Flags {
    pub(super) audio_chunks: bool,
    pub(super) assistant_speaking: bool,
    /// `[limits] max_history_messages` (0: unlimited).
    pub(super) max_history_messages: usize,
}

/// Lowest and highest input sample rates heard: at 16 kHz the engine hears at most twice the
/// samples a frame holds, and the VAD takes rates up to its own maximum.
const MIN_INPUT_RATE: u32 = 8_000;
const MAX_INPUT_RATE: u32 = voxgate_audio::vad::MAX_INPUT_RATE;

/// Input frames (samples per channel) mixed and resampled at a time: 256 ms at 16 kHz.
const PIECE_FRAMES: usize = 4096;

/// Ids of cancelled calls remembered so a late `SEND_TOOL_RESPONSE` for one is ignored quietly.
const CANCELLED_MEMORY: usize = 64;

/// Request ids as the driver's runner sees them: the runner serves the whole connection while
/// every session's engine counts its ids from 1, so each session tags its ids with its own
/// generation in the high bits. An event of a replaced session (already queued when it was
/// cancelled) then matches no request of the new one and is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Ids {
    generation: u32,
}

/// Bits of a runner id that hold the engine's own id.
const ID_BITS: u32 = 32;

impl Ids {
    /// The ids of the session numbered `generation` on its connection.
    pub(super) fn new(generation: u32) -> Self {
        Self { generation }
    }

    fn base(self) -> u64 {
        u64::from(self.generation) << ID_BITS
    }

    /// The engine's request with its id in the runner's space; `None` for an id or request
    /// kind that cannot be mapped (four billion requests in one session, a request kind
    /// added to the engine later).
    fn outgoing(self, mut request: ProviderRequest) -> Option<ProviderRequest> {
        let id = match &mut request {
            ProviderRequest::Transcribe { id, .. }
            | ProviderRequest::Generate { id, .. }
            | ProviderRequest::Query { id, .. }
            | ProviderRequest::Synthesize { id, .. }
            | ProviderRequest::CallTool { id, .. }
            | ProviderRequest::Cancel { id } => id,
            other => {
                tracing::warn!(request = ?other, "gemini door: provider request not mapped");
                return None;
            }
        };
        if id.0 >> ID_BITS != 0 {
            return None;
        }
        *id = RequestId(id.0 | self.base());
        Some(request)
    }

    /// A runner event with its id back in the engine's space; `None` when it belongs to
    /// another session.
    fn incoming(self, mut event: ProviderEvent) -> Option<ProviderEvent> {
        if event.id().0 >> ID_BITS != u64::from(self.generation) {
            return None;
        }
        let id = match &mut event {
            ProviderEvent::Transcript { id, .. }
            | ProviderEvent::TextDelta { id, .. }
            | ProviderEvent::ToolCall { id, .. }
            | ProviderEvent::Audio { id, .. }
            | ProviderEvent::ToolOutput { id, .. }
            | ProviderEvent::Done { id }
            | ProviderEvent::Failed { id, .. } => id,
            _ => return None,
        };
        *id = RequestId(id.0 & ((1 << ID_BITS) - 1));
        Some(event)
    }
}

/// One bridge session driven by an [`Engine`]. Its provider work runs in the door driver;
/// [`close`](Self::close) cancels it.
pub(super) struct EngineSession {
    engine: Engine,
    ids: Ids,
    metrics: Arc<Metrics>,
    flags: Flags,
    /// Replies are spoken (AUDIO modality) rather than written.
    audio_out: bool,
    in_resampler: RateConverter,
    out_resampler: RateConverter,
    samples: Vec<i16>,
    /// One piece of input mixed to mono, and resampled to 16 kHz ([`Self::pcm`]).
    floats: Vec<f32>,
    converted: Vec<f32>,
    /// A model turn is open: it still owes the client `turnComplete` or `interrupted`.
    turn_open: bool,
    /// Spoken output of the open turn has started.
    speaking: bool,
    /// Output transcription of the open turn has started (sentences are joined by a space).
    transcribed: bool,
    /// Client tool calls of the open turn awaiting `SEND_TOOL_RESPONSE`: (id, name).
    pending_calls: Vec<(String, String)>,
    /// Responses that called client tools: the engine ends them once the results are in
    /// and answers in a new response, which closes the bridge turn.
    call_turns: Vec<TurnId>,
    cancelled: Vec<String>,
    /// The app's WebRTC connection is up: reply audio goes out on its track.
    media: bool,
    /// Reply audio went to the track since the last [`MediaCommand::Clear`].
    played: bool,
}

/// Spoken output unless the config asks for text only (the Live API's default is audio).
fn wants_audio(config: &LiveConfig) -> bool {
    match config
        .generation_config
        .as_ref()
        .and_then(|g| g.response_modalities.as_ref())
    {
        None => true,
        Some(m) if m.is_empty() => true,
        Some(m) => m.contains(&Modality::Audio),
    }
}

fn system_prompt(config: &LiveConfig) -> String {
    config
        .system_instruction
        .as_ref()
        .map(Content::joined_text)
        .unwrap_or_default()
}

fn temperature(config: &LiveConfig) -> Option<f64> {
    config.generation_config.as_ref()?.temperature
}

/// Gemini's `Schema` fields that are int64, which proto3 JSON may write as strings (`"5"`).
const INT64_KEYWORDS: &[&str] = &[
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "minLength",
    "maxLength",
];

/// A Gemini `Schema` as JSON Schema, accepting what Gemini's API accepts: explicit nulls for
/// unset fields (the Android app's Kotlin serializer writes every field) are dropped
/// ([`voxgate_mcp::schema::drop_nulls`]); types in OpenAPI style (`"OBJECT"`, `"STRING"`)
/// become lower case and `TYPE_UNSPECIFIED` no type; `nullable: true` adds `"null"` to the
/// type; int64 bounds written as strings become numbers.
fn json_schema(v: &Value) -> Value {
    let mut v = v.clone();
    voxgate_mcp::schema::drop_nulls(&mut v);
    gemini_to_json_schema(&mut v);
    v
}

fn gemini_to_json_schema(v: &mut Value) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(t)) = m.get_mut("type") {
                if t.eq_ignore_ascii_case("TYPE_UNSPECIFIED") {
                    m.remove("type");
                } else {
                    t.make_ascii_lowercase();
                }
            }
            if m.get("nullable") == Some(&Value::Bool(true))
                && let Some(Value::String(t)) = m.get("type")
                && t != "null"
            {
                let t = Value::String(t.clone());
                m.insert("type".into(), Value::Array(vec![t, "null".into()]));
            }
            for k in INT64_KEYWORDS {
                if let Some(n) = m
                    .get(*k)
                    .and_then(Value::as_str)
                    .and_then(|s| s.parse::<u64>().ok())
                {
                    m.insert((*k).into(), n.into());
                }
            }
            // Data keywords hold values, not schemas: a `default` object with a "type" key
            // is left as sent.
            for (k, v) in m.iter_mut() {
                if !matches!(
                    k.as_str(),
                    "enum" | "default" | "example" | "const" | "examples"
                ) {
                    gemini_to_json_schema(v);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(gemini_to_json_schema),
        _ => {}
    }
}

fn tools(config: &LiveConfig) -> Vec<ToolDefinition> {
    config
        .tools
        .iter()
        .flat_map(|t| &t.function_declarations)
        .filter(|f| !f.name.is_empty())
        .map(|f| {
            let schema = f
                .extra
                .get("parametersJsonSchema")
                .filter(|v| !v.is_null())
                .or(f.parameters.as_ref())
                .map(json_schema)
                .filter(Value::is_object)
                .unwrap_or_else(|| serde_json::json!({"type": "object", "properties": {}}));
            ToolDefinition {
                name: f.name.clone(),
                description: f.description.clone().unwrap_or_default(),
                parameters: schema,
            }
        })
        .collect()
}

fn content(c: ServerContent) -> ServerMessage {
    ServerMessage::ContentMessage(c)
}

fn model_parts(parts: Vec<Part>) -> ServerContent {
    ServerContent {
        model_turn: Some(Content { role: None, parts }),
        ..ServerContent::default()
    }
}

impl EngineSession {
    /// The engine's speculation counters.
    pub(super) fn speculation_stats(&self) -> voxgate_engine::SpeculationStats {
        self.engine.speculation_stats()
    }

    /// Moves the engine's turn events into `sink`.
    pub(super) fn take_telemetry(&mut self, sink: &mut Vec<voxgate_engine::TurnEvent>) {
        sink.extend(self.engine.take_telemetry());
    }

    /// A session with `config` whose requests carry `ids`; [`start`](Self::start) applies
    /// its tools.
    pub(super) fn new(
        config: &LiveConfig,
        settings: &EngineSettings,
        metrics: Arc<Metrics>,
        flags: Flags,
        ids: Ids,
        now: Instant,
    ) -> Result<Self, String> {
        let audio_out = wants_audio(config);
        let mut engine_config = EngineConfig {
            input_rate: INPUT_SAMPLE_RATE,
            output_audio: audio_out.then_some(OutputAudio {
                bytes_per_second: OUTPUT_SAMPLE_RATE * 2,
            }),
            system_prompt: system_prompt(config),
            temperature: temperature(config),
            // The bridge protocol has no history export: keeping speech would only cost memory.
            keep_user_audio: false,
            max_history_audio: Duration::ZERO,
            max_history_messages: flags.max_history_messages,
            ..EngineConfig::default()
        };
        settings.apply(&mut engine_config);
        let engine = Engine::new(engine_config, now).map_err(|e| e.to_string())?;
        Ok(Self {
            engine,
            ids,
            metrics,
            flags,
            audio_out,
            in_resampler: RateConverter::new(INPUT_SAMPLE_RATE).map_err(|e| e.to_string())?,
            out_resampler: RateConverter::new(OUTPUT_SAMPLE_RATE).map_err(|e| e.to_string())?,
            samples: Vec::new(),
            floats: Vec::new(),
            converted: Vec::new(),
            turn_open: false,
            speaking: false,
            transcribed: false,
            pending_calls: Vec::new(),
            call_turns: Vec::new(),
            cancelled: Vec::new(),
            media: false,
            played: false,
        })
    }

    /// Declares the config's tools (a refused declaration is answered with `GEMINI_ERROR`),
    /// before the caller sends `SETUP_COMPLETE`, on connect and on `UPDATE_CONFIG` alike.
    pub(super) fn start(&mut self, now: Instant, config: &LiveConfig, out: &mut Out) {
        self.input(now, Input::SetTools(tools(config)), out);
    }

    /// Offers the MCP endpoint's tools (run by the server, never declared to the client).
    pub(super) fn server_tools(
        &mut self,
        now: Instant,
        tools: Vec<voxgate_engine::ServerToolDefinition>,
        out: &mut Out,
    ) {
        self.input(now, Input::ServerTools(tools), out);
    }

    /// Says the configured greeting (`[gemini.engine] greeting`), if any, as a model turn.
    pub(super) fn greet(&mut self, now: Instant, settings: &EngineSettings, out: &mut Out) {
        if let Greeting::Say(words) = settings.greeting() {
            let greet = Input::DirectSpeech {
                text: words.to_owned(),
                include_in_history: true,
                uninterruptible: false,
            };
            self.input(now, greet, out);
        }
    }

    /// Whether the app's WebRTC connection is up: while it is, reply audio goes out on its
    /// track as [`MediaCommand::Play`] rather than in `CONTENT_MESSAGE`s.
    pub(super) fn set_media(&mut self, up: bool) {
        self.media = up;
        if !up {
            self.played = false;
        }
    }

    /// 20 ms of the app's microphone from its WebRTC track (mono at 16 kHz): heard exactly
    /// like `SEND_REALTIME_INPUT` audio.
    pub(super) fn media_audio(&mut self, now: Instant, samples: &[i16], out: &mut Out) {
        self.pcm(now, samples, 1, INPUT_SAMPLE_RATE, false, out);
    }

    /// When [`timeout`](Self::timeout) is next due.
    pub(super) fn deadline(&self) -> Option<Instant> {
        self.engine.poll_timeout()
    }

    pub(super) fn timeout(&mut self, now: Instant, out: &mut Out) {
        self.engine.handle_timeout(now);
        self.drain(out);
    }

    /// A provider event; events of other sessions on the connection are dropped.
    pub(super) fn provider_event(&mut self, now: Instant, event: ProviderEvent, out: &mut Out) {
        if let Some(event) = self.ids.incoming(event) {
            self.input(now, Input::Provider(event), out);
        }
    }

    /// `UPDATE_CONFIG` can be applied in place (keeping the conversation) unless it switches
    /// between spoken and written replies.
    pub(super) fn can_reconfigure(&self, config: &LiveConfig) -> bool {
        wants_audio(config) == self.audio_out
    }

    pub(super) fn reconfigure(&mut self, now: Instant, config: &LiveConfig, out: &mut Out) {
        self.input(
            now,
            Input::Reconfigure {
                input_rate: None,
                system_prompt: Some(system_prompt(config)),
                temperature: temperature(config),
            },
            out,
        );
        self.input(now, Input::SetTools(tools(config)), out);
    }

    /// Ends the session: the engine's cancels of its work in flight go out; nothing else does.
    pub(super) fn close(&mut self, now: Instant, out: &mut Out) {
        let _ = self.engine.handle_input(now, Input::Close);
        while let Some(o) = self.engine.poll_output() {
            if let Output::Provider(r) = o {
                self.request(r, out);
            }
        }
    }

    /// A session message (`SEND_MESSAGE`, `SEND_REALTIME_INPUT`, `SEND_TOOL_RESPONSE`).
    pub(super) fn handle(&mut self, now: Instant, msg: ClientMessage, out: &mut Out) {
        match msg {
            ClientMessage::SendMessage {
                parts,
                turn_complete,
            } => {
                let mut heard_audio = false;
                for blob in parts.iter().filter_map(|p| p.inline_data.as_ref()) {
                    if blob.is_audio() {
                        heard_audio |= self.audio(now, blob, out);
                    }
                }
                let text: String = parts
                    .iter()
                    .filter_map(|p| p.text.as_deref())
                    .collect::<Vec<_>>()
                    .join(" ");
                if !text.trim().is_empty() {
                    self.text(now, text, turn_complete, out);
                } else if turn_complete {
                    self.end_of_input(now, heard_audio, out);
                }
            }
            ClientMessage::SendRealtimeInput(r) => self.realtime_input(now, r, out),
            ClientMessage::SendToolResponse(r) => self.tool_response(now, r, out),
            _ => {}
        }
    }

    fn realtime_input(&mut self, now: Instant, r: RealtimeInput, out: &mut Out) {
        if r.activity_start {
            self.input(now, Input::StartCapture, out);
        }
        if let Some(blob) = &r.audio {
            let whole_file = self.audio(now, blob, out);
            // A whole WAV file is a complete utterance: answer it without waiting for more.
            if whole_file {
                self.end_of_input(now, true, out);
            }
        }
        // Video frames are accepted and ignored: the pipeline has no vision model.
        if let Some(text) = r.text.filter(|t| !t.trim().is_empty()) {
            self.text(now, text, true, out);
        }
        if r.activity_end {
            self.input(now, Input::StopCapture, out);
        }
        if r.audio_stream_end {
            self.end_of_input(now, true, out);
        }
    }

    /// The user's input is complete: a spoken turn still being captured is cut and answered.
    /// With `only_if_listening` false a reply is asked for even when nothing was captured (an
    /// empty `SEND_MESSAGE` with `turnComplete`, as upstream).
    fn end_of_input(&mut self, now: Instant, only_if_listening: bool, out: &mut Out) {
        if only_if_listening && self.engine.state() != State::Listening {
            return;
        }
        self.input(
            now,
            Input::TriggerInference {
                instructions: None,
                flush_vad: true,
            },
            out,
        );
    }

    fn text(&mut self, now: Instant, text: String, turn_complete: bool, out: &mut Out) {
        let mode = if turn_complete {
            // New content interrupts the model, as upstream: a turn waiting on tool results
            // is cancelled here (the engine does not report that as an interruption).
            if !self.pending_calls.is_empty() {
                self.interrupt(out);
            }
            TriggerMode::Immediate
        } else {
            TriggerMode::NoTrigger
        };
        self.input(now, Input::Text { text, mode }, out);
    }

    /// Feeds an audio blob; true if it was a whole WAV file.
    fn audio(&mut self, now: Instant, blob: &Blob, out: &mut Out) -> bool {
        self.samples.clear();
        let info = match blob.decode_pcm(&mut self.samples) {
            Ok(info) => info,
            Err(e) => {
                self.metrics.error(Door::Gemini);
                emit(
                    out,
                    &ServerMessage::error(format!(
                        "Invalid audio in {}: {e}.",
                        if blob.mime_type.is_empty() {
                            "audio blob"
                        } else {
                            blob.mime_type.as_str()
                        }
                    )),
                );
                return false;
            }
        };
        let rate = info.sample_rate.unwrap_or(INPUT_SAMPLE_RATE);
        let channels = usize::from(info.channels.max(1));
        let whole_file = info.wav.is_some();
        let samples = std::mem::take(&mut self.samples);
        let heard = self.pcm(now, &samples, channels, rate, whole_file, out);
        self.samples = samples;
        heard && whole_file
    }

    /// Feeds interleaved PCM (`channels` at `rate`) to the engine, mixed to mono and
    /// resampled to 16 kHz; `last` flushes the resampler (a whole file). False when the rate
    /// is unusable (answered with `GEMINI_ERROR`).
    ///
    /// A frame of any length goes through in pieces of [`PIECE_FRAMES`], so the mixed and
    /// resampled copies stay small whatever the frame holds; the engine hears the pieces as
    /// the one stream they are.
    fn pcm(
        &mut self,
        now: Instant,
        samples: &[i16],
        channels: usize,
        rate: u32,
        last: bool,
        out: &mut Out,
    ) -> bool {
        if !(MIN_INPUT_RATE..=MAX_INPUT_RATE).contains(&rate) {
            // Below the minimum each sample would become thousands at 16 kHz: a small frame
            // claiming `rate=1` would cost gigabytes.
            self.metrics.error(Door::Gemini);
            emit(
                out,
                &ServerMessage::error(format!(
                    "Unusable audio sample rate {rate} Hz: send {MIN_INPUT_RATE} to {MAX_INPUT_RATE} Hz."
                )),
            );
            return false;
        }
        let channels = channels.max(1);
        let mut converted = std::mem::take(&mut self.converted);
        for piece in samples.chunks(PIECE_FRAMES.saturating_mul(channels)) {
            self.floats.clear();
            self.floats.extend(piece.chunks(channels).map(|frame| {
                let sum: f32 = frame.iter().map(|&s| i16_to_f32(s)).sum();
                #[allow(clippy::cast_precision_loss, reason = "a handful of channels")]
                let n = frame.len() as f32;
                sum / n
            }));
            if rate == INPUT_SAMPLE_RATE {
                self.engine.handle_audio(now, &self.floats);
            } else {
                converted.clear();
                if let Err(e) = self
                    .in_resampler
                    .process(&self.floats, rate, &mut converted)
                {
                    self.converted = converted;
                    self.metrics.error(Door::Gemini);
                    emit(
                        out,
                        &ServerMessage::error(format!(
                            "Unusable audio sample rate {rate} Hz: {e}."
                        )),
                    );
                    return false;
                }
                self.engine.handle_audio(now, &converted);
            }
            self.drain(out);
        }
        if last && rate != INPUT_SAMPLE_RATE {
            converted.clear();
            self.in_resampler.flush(&mut converted);
            self.engine.handle_audio(now, &converted);
            self.drain(out);
        }
        self.converted = converted;
        true
    }

    fn tool_response(&mut self, now: Instant, r: ToolResponse, out: &mut Out) {
        for fr in r.function_responses {
            let id = fr.id.clone().or_else(|| {
                self.pending_calls
                    .iter()
                    .find(|(_, name)| *name == fr.name)
                    .map(|(id, _)| id.clone())
            });
            let Some(id) = id else {
                self.metrics.error(Door::Gemini);
                emit(
                    out,
                    &ServerMessage::error(format!("No pending tool call named {:?}.", fr.name)),
                );
                continue;
            };
            if let Some(pos) = self.pending_calls.iter().position(|(p, _)| *p == id) {
                self.pending_calls.remove(pos);
                let result = serde_json::to_string(&fr.response).unwrap_or_default();
                self.input(now, Input::ToolResult { id, result }, out);
            } else if !self.cancelled.contains(&id) {
                self.metrics.error(Door::Gemini);
                emit(
                    out,
                    &ServerMessage::error(format!("No pending tool call with id {id:?}.")),
                );
            }
        }
    }

    fn input(&mut self, now: Instant, input: Input, out: &mut Out) {
        if let Err(e) = self.engine.handle_input(now, input) {
            self.metrics.error(Door::Gemini);
            emit(out, &ServerMessage::error(e.to_string()));
        }
        self.drain(out);
    }

    fn request(&self, request: ProviderRequest, out: &mut Out) {
        if let Some(r) = self.ids.outgoing(request) {
            out.provider(r);
        }
    }

    fn drain(&mut self, out: &mut Out) {
        while let Some(o) = self.engine.poll_output() {
            match o {
                Output::Provider(r) => self.request(r, out),
                Output::Client(event) => self.client_event(event, out),
                _ => {}
            }
        }
    }

    /// Closes the open turn as interrupted, cancelling its pending tool calls.
    fn interrupt(&mut self, out: &mut Out) {
        if !self.turn_open && self.pending_calls.is_empty() {
            return;
        }
        if self.speaking && self.flags.assistant_speaking {
            emit(out, &ServerMessage::AssistantSpeaking { speaking: false });
        }
        self.clear_media(out);
        emit(
            out,
            &content(ServerContent {
                interrupted: true,
                ..ServerContent::default()
            }),
        );
        emit(out, &ServerMessage::Interrupted);
        if !self.pending_calls.is_empty() {
            let ids: Vec<String> = self.pending_calls.drain(..).map(|(id, _)| id).collect();
            self.cancelled.extend(ids.iter().cloned());
            let excess = self.cancelled.len().saturating_sub(CANCELLED_MEMORY);
            self.cancelled.drain(..excess);
            emit(
                out,
                &ServerMessage::ToolCallCancellation(ToolCallCancellation { ids }),
            );
        }
        self.end_turn();
    }

    fn end_turn(&mut self) {
        self.turn_open = false;
        self.call_turns.clear();
        self.speaking = false;
        self.transcribed = false;
        self.out_resampler.reset();
    }

    fn client_event(&mut self, event: ClientEvent, out: &mut Out) {
        match event {
            ClientEvent::ResponseBegin { .. } => self.turn_open = true,
            ClientEvent::TextFragment { text, .. } => {
                self.turn_open = true;
                emit(out, &content(model_parts(vec![Part::text(text)])));
            }
            ClientEvent::AudioChunk {
                samples,
                sample_rate,
                transcript,
                ..
            } => {
                self.turn_open = true;
                if let Some(text) = transcript {
                    let text = if self.transcribed {
                        format!(" {text}")
                    } else {
                        text
                    };
                    self.transcribed = true;
                    emit(
                        out,
                        &content(ServerContent {
                            output_transcription: Some(Transcription {
                                text,
                                finished: None,
                            }),
                            ..ServerContent::default()
                        }),
                    );
                }
                if self.media {
                    // The media layer resamples; the engine's rate goes as it is.
                    self.push_audio(&samples, sample_rate, out);
                } else {
                    let audio = self.convert(&samples, sample_rate);
                    self.push_audio(&audio, OUTPUT_SAMPLE_RATE, out);
                }
            }
            ClientEvent::ResponseEnd { .. } => {
                let tail = self.flush_audio();
                self.push_audio(&tail, OUTPUT_SAMPLE_RATE, out);
            }
            ClientEvent::ClearPlayback => {
                self.out_resampler.reset();
                self.clear_media(out);
            }
            ClientEvent::ResponseFinished { turn, interrupted } => {
                self.metrics.turn(Door::Gemini);
                let called = self.call_turns.iter().position(|t| *t == turn);
                if interrupted {
                    self.interrupt(out);
                } else if let Some(i) = called.filter(|_| self.pending_calls.is_empty()) {
                    // The follow-up response with the tool results comes next.
                    self.call_turns.remove(i);
                } else if self.pending_calls.is_empty() && self.turn_open {
                    if self.speaking && self.flags.assistant_speaking {
                        emit(out, &ServerMessage::AssistantSpeaking { speaking: false });
                    }
                    emit(
                        out,
                        &content(ServerContent {
                            turn_complete: true,
                            ..ServerContent::default()
                        }),
                    );
                    emit(out, &ServerMessage::TurnComplete);
                    self.end_turn();
                }
                // With calls pending the turn goes on once their results are in.
            }
            ClientEvent::UserTranscription { text, .. } => {
                // A spoken turn was committed: the server-added time starts.
                out.turn_decided();
                // The user spoke over a turn that waits on tool results: it is cut off.
                if !self.pending_calls.is_empty() {
                    self.interrupt(out);
                }
                emit(
                    out,
                    &content(ServerContent {
                        input_transcription: Some(Transcription {
                            text,
                            finished: Some(true),
                        }),
                        ..ServerContent::default()
                    }),
                );
            }
            ClientEvent::ToolCallRequest {
                id,
                name,
                arguments,
                turn,
            } => {
                self.turn_open = true;
                if !self.call_turns.contains(&turn) {
                    self.call_turns.push(turn);
                }
                self.pending_calls.push((id.clone(), name.clone()));
                emit(
                    out,
                    &ServerMessage::ToolCall(ToolCall {
                        function_calls: vec![FunctionCall {
                            id: Some(id),
                            name,
                            args: Some(arguments),
                        }],
                    }),
                );
            }
            ClientEvent::Error { category, message } => {
                self.metrics.error(Door::Gemini);
                tracing::info!(?category, %message, "gemini session error");
                emit(out, &ServerMessage::error(message));
            }
            // VAD telemetry, subtitles, faces and device MCP have no bridge message.
            _ => {}
        }
    }

    /// Reply audio (mono at `rate`): on the WebRTC track while it is up, else as 24 kHz
    /// `inlineData` (`rate` is then [`OUTPUT_SAMPLE_RATE`]) and, opted in, `AUDIO_CHUNK`.
    fn push_audio(&mut self, samples: &[i16], rate: u32, out: &mut Out) {
        if samples.is_empty() {
            return;
        }
        if !self.speaking {
            self.speaking = true;
            if self.flags.assistant_speaking {
                emit(out, &ServerMessage::AssistantSpeaking { speaking: true });
            }
        }
        if self.media {
            // The app plays only its remote track: a copy over the WebSocket would be
            // bandwidth it never uses.
            self.played = true;
            out.media(MediaCommand::Play {
                samples: samples.to_vec(),
                rate,
            });
            return;
        }
        let blob = Blob::pcm(samples, OUTPUT_SAMPLE_RATE);
        let data = self.flags.audio_chunks.then(|| blob.data.clone());
        emit(out, &content(model_parts(vec![Part::inline(blob)])));
        if let Some(data) = data {
            emit(out, &ServerMessage::AudioChunk { data });
        }
    }

    /// Drops the reply audio queued on the WebRTC track (barge-in), if any went there.
    fn clear_media(&mut self, out: &mut Out) {
        if self.media && self.played {
            self.played = false;
            out.media(MediaCommand::Clear);
        }
    }

    /// Reply audio (mono i16 at `rate`) at the bridge's 24 kHz.
    fn convert(&mut self, samples: &[i16], rate: u32) -> Vec<i16> {
        let mut converted = Vec::with_capacity(samples.len());
        if let Err(e) = self
            .out_resampler
            .process_i16_to_i16(samples, rate, &mut converted)
        {
            tracing::warn!(%e, rate, "cannot resample reply audio");
            return Vec::new();
        }
        converted
    }

    fn flush_audio(&mut self) -> Vec<i16> {
        let mut tail = Vec::new();
        self.out_resampler.flush_i16(&mut tail);
        tail
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::door::ServerFrame;

    const FLAGS: Flags = Flags {
        audio_chunks: false,
        assistant_speaking: true,
        max_history_messages: 0,
    };
    const MS: Duration = Duration::from_millis(1);

    /// A session of generation 1 on a virtual clock; `config` is the wire `LiveConfig`.
    struct Harness {
        s: EngineSession,
        now: Instant,
        out: Out,
    }

    impl Harness {
        fn new(config: Value) -> Self {
            let config: LiveConfig = serde_json::from_value(config).unwrap();
            let now = Instant::now();
            let mut s = EngineSession::new(
                &config,
                &EngineSettings::default(),
                Arc::new(Metrics::new()),
                FLAGS,
                Ids::new(1),
                now,
            )
            .unwrap();
            let mut out = Out::new();
            s.start(now, &config, &mut out);
            assert!(out.frames().is_empty(), "{out:?}");
            Self { s, now, out }
        }

        fn text_only() -> Self {
            Self::new(json!({"generationConfig": {"responseModalities": ["TEXT"]}}))
        }

        #[allow(
            clippy::needless_pass_by_value,
            reason = "call sites pass json! literals"
        )]
        fn client(&mut self, msg: Value) {
            let m = ClientMessage::decode(&msg.to_string()).unwrap();
            self.s.handle(self.now, m, &mut self.out);
        }

        fn say(&mut self, text: &str) {
            self.client(json!({"type": "SEND_MESSAGE", "payload": {"parts": [{"text": text}]}}));
        }

        fn provider(&mut self, event: ProviderEvent) {
            self.s.provider_event(self.now, event, &mut self.out);
        }

        /// Moves the clock by `by`, firing the session's deadlines on the way.
        fn advance(&mut self, by: Duration) {
            let target = self.now + by;
            while let Some(d) = self.s.deadline().filter(|d| *d <= target) {
                self.now = self.now.max(d);
                self.s.timeout(self.now, &mut self.out);
            }
            self.now = target;
        }

        /// The frames so far as JSON, with whether each may be dropped.
        fn frames(&mut self) -> Vec<(Value, bool)> {
            let frames = self
                .out
                .frames()
                .iter()
                .map(|(f, droppable)| match f {
                    ServerFrame::Text(t) => (serde_json::from_str(t).unwrap(), *droppable),
                    ServerFrame::Binary(_) => panic!("the bridge sends text"),
                })
                .collect();
            self.out.take_frames();
            frames
        }

        fn messages(&mut self) -> Vec<Value> {
            self.frames().into_iter().map(|(v, _)| v).collect()
        }

        fn requests(&mut self) -> Vec<ProviderRequest> {
            self.out.take_requests()
        }

        /// The one `Generate` request made since the last look.
        fn generate(&mut self) -> RequestId {
            let ids: Vec<RequestId> = self
                .requests()
                .into_iter()
                .filter_map(|r| match r {
                    ProviderRequest::Generate { id, .. } => Some(id),
                    _ => None,
                })
                .collect();
            assert_eq!(ids.len(), 1, "{ids:?}");
            ids[0]
        }
    }

    fn kinds(messages: &[Value]) -> Vec<&str> {
        messages
            .iter()
            .map(|m| m["type"].as_str().unwrap())
            .collect()
    }

    fn delta(id: RequestId, text: &str) -> ProviderEvent {
        ProviderEvent::TextDelta {
            id,
            delta: text.into(),
        }
    }

    fn weather_tools() -> Value {
        json!({
            "generationConfig": {"responseModalities": "TEXT"},
            "tools": [{"functionDeclarations": [{"name": "get_weather",
                "description": "Weather for a city",
                "parameters": {"type": "OBJECT", "properties": {"city": {"type": "STRING"}}}}]}]
        })
    }

    #[test]
    fn ids_carry_the_session_generation_both_ways() {
        let ids = Ids::new(3);
        let r = ids
            .outgoing(ProviderRequest::Cancel { id: RequestId(7) })
            .unwrap();
        assert_eq!(
            r,
            ProviderRequest::Cancel {
                id: RequestId(3 << 32 | 7)
            }
        );
        assert_eq!(
            ids.incoming(ProviderEvent::Done {
                id: RequestId(3 << 32 | 7)
            }),
            Some(ProviderEvent::Done { id: RequestId(7) })
        );
        // Another session's event (the one before, or a later one) is not ours.
        for other in [2_u64 << 32 | 7, 4 << 32 | 7, 7] {
            assert_eq!(
                ids.incoming(ProviderEvent::Done {
                    id: RequestId(other)
                }),
                None
            );
        }
        assert_eq!(
            ids.outgoing(ProviderRequest::Cancel {
                id: RequestId(1 << 32)
            }),
            None
        );
    }

    #[test]
    fn a_text_turn_opens_with_its_first_text_and_closes_once() {
        let mut h = Harness::text_only();
        h.say("hi");
        let id = h.generate();
        assert_eq!(
            id.0 >> 32,
            1,
            "the request carries the session's generation"
        );
        assert!(h.messages().is_empty());
        h.provider(delta(id, "Hel"));
        h.provider(delta(id, "lo"));
        h.provider(ProviderEvent::Done { id });
        let frames = h.frames();
        assert!(
            frames.iter().all(|(_, droppable)| !droppable),
            "text is never dropped"
        );
        let messages: Vec<Value> = frames.into_iter().map(|(v, _)| v).collect();
        assert_eq!(
            kinds(&messages),
            [
                "CONTENT_MESSAGE",
                "CONTENT_MESSAGE",
                "CONTENT_MESSAGE",
                "TURN_COMPLETE"
            ]
        );
        let texts: Vec<&str> = messages[..2]
            .iter()
            .map(|m| {
                m["payload"]["serverContent"]["modelTurn"]["parts"][0]["text"]
                    .as_str()
                    .unwrap()
            })
            .collect();
        assert_eq!(texts, ["Hel", "lo"]);
        assert_eq!(
            messages[2]["payload"]["serverContent"]["turnComplete"],
            true
        );
        // A repeated end, or an event for an id of another session, changes nothing.
        h.provider(ProviderEvent::Done { id });
        h.provider(delta(RequestId(2 << 32 | (id.0 & 0xffff_ffff)), "stale"));
        assert!(h.messages().is_empty());
        assert!(h.requests().is_empty());
    }

    #[test]
    fn tool_calls_keep_the_turn_open_until_the_answer_with_their_results() {
        let mut h = Harness::new(weather_tools());
        h.say("Weather in Paris?");
        let id = h.generate();
        h.provider(ProviderEvent::ToolCall {
            id,
            call_id: "c1".into(),
            name: "get_weather".into(),
            arguments: json!({"city": "Paris"}),
        });
        h.provider(ProviderEvent::Done { id });
        let m = h.messages();
        assert_eq!(kinds(&m), ["TOOL_CALL"], "{m:?}");
        assert_eq!(
            m[0]["payload"]["toolCall"]["functionCalls"][0],
            json!({"id": "c1", "name": "get_weather", "args": {"city": "Paris"}})
        );
        // A response for a call that was never made is refused; the pending one stays.
        h.client(
            json!({"type": "SEND_TOOL_RESPONSE", "payload": {"toolResponse": {
            "functionResponses": [{"id": "nope", "name": "get_weather", "response": {}}]}}}),
        );
        let m = h.messages();
        assert_eq!(
            m[0]["payload"]["message"],
            "No pending tool call with id \"nope\"."
        );
        assert!(h.requests().is_empty());
        // Without an id the response is matched by name.
        h.client(
            json!({"type": "SEND_TOOL_RESPONSE", "payload": {"toolResponse": {
            "functionResponses": [{"name": "get_weather", "response": {"sky": "sunny"}}]}}}),
        );
        assert!(h.messages().is_empty());
        let id2 = h.generate();
        h.provider(delta(id2, "Sunny."));
        h.provider(ProviderEvent::Done { id: id2 });
        let m = h.messages();
        assert_eq!(
            kinds(&m),
            ["CONTENT_MESSAGE", "CONTENT_MESSAGE", "TURN_COMPLETE"],
            "{m:?}"
        );
        assert_eq!(m[1]["payload"]["serverContent"]["turnComplete"], true);
    }

    #[test]
    fn new_input_cancels_pending_calls_and_a_late_result_is_ignored() {
        let mut h = Harness::new(weather_tools());
        h.say("Weather?");
        let id = h.generate();
        h.provider(ProviderEvent::ToolCall {
            id,
            call_id: "c1".into(),
            name: "get_weather".into(),
            arguments: json!({}),
        });
        h.provider(ProviderEvent::Done { id });
        assert_eq!(kinds(&h.messages()), ["TOOL_CALL"]);
        h.say("never mind");
        let m = h.messages();
        assert_eq!(
            kinds(&m),
            ["CONTENT_MESSAGE", "INTERRUPTED", "TOOL_CALL_CANCELLATION"],
            "{m:?}"
        );
        assert_eq!(m[0]["payload"]["serverContent"]["interrupted"], true);
        assert_eq!(
            m[2]["payload"]["toolCallCancellation"]["ids"],
            json!(["c1"])
        );
        let id2 = h.generate();
        // The app answers the cancelled call anyway: quietly ignored, nothing is asked of
        // the model.
        h.client(
            json!({"type": "SEND_TOOL_RESPONSE", "payload": {"toolResponse": {
            "functionResponses": [{"id": "c1", "name": "get_weather", "response": {}}]}}}),
        );
        assert!(h.messages().is_empty());
        assert!(h.requests().is_empty());
        h.provider(delta(id2, "OK."));
        h.provider(ProviderEvent::Done { id: id2 });
        assert_eq!(
            kinds(&h.messages()),
            ["CONTENT_MESSAGE", "CONTENT_MESSAGE", "TURN_COMPLETE"]
        );
    }

    #[test]
    fn a_spoken_reply_joins_its_sentence_transcripts_and_brackets_its_audio() {
        let mut h = Harness::new(json!({}));
        h.say("hi");
        let id = h.generate();
        h.provider(delta(id, "Hello there. How are you?"));
        h.provider(ProviderEvent::Done { id });
        let sentences: Vec<(RequestId, String)> = h
            .requests()
            .into_iter()
            .filter_map(|r| match r {
                ProviderRequest::Synthesize { id, text, .. } => Some((id, text)),
                _ => None,
            })
            .collect();
        let texts: Vec<&str> = sentences.iter().map(|(_, t)| t.as_str()).collect();
        assert_eq!(texts, ["Hello there.", "How are you?"]);
        for (id, _) in &sentences {
            assert_eq!(id.0 >> 32, 1);
            h.provider(ProviderEvent::Audio {
                id: *id,
                samples: vec![100; 2400],
                sample_rate: OUTPUT_SAMPLE_RATE,
            });
            h.provider(ProviderEvent::Done { id: *id });
        }
        h.advance(2000 * MS);
        let frames = h.frames();
        let shape: Vec<String> = frames
            .iter()
            .map(|(m, droppable)| {
                let c = &m["payload"]["serverContent"];
                let what = match m["type"].as_str().unwrap() {
                    "CONTENT_MESSAGE" if c["outputTranscription"].is_object() => {
                        format!(
                            "said {:?}",
                            c["outputTranscription"]["text"].as_str().unwrap()
                        )
                    }
                    "CONTENT_MESSAGE" if c["modelTurn"].is_object() => "audio".into(),
                    "CONTENT_MESSAGE" if c["turnComplete"] == true => "turnComplete".into(),
                    "ASSISTANT_SPEAKING" => format!("speaking {}", m["payload"]["speaking"]),
                    other => other.into(),
                };
                if *droppable {
                    format!("{what} (droppable)")
                } else {
                    what
                }
            })
            .collect();
        assert_eq!(
            shape,
            [
                "said \"Hello there.\"",
                "speaking true",
                "audio (droppable)",
                "said \" How are you?\"",
                "audio (droppable)",
                "speaking false",
                "turnComplete",
                "TURN_COMPLETE"
            ]
        );
    }

    #[test]
    fn reply_audio_at_another_rate_is_resampled_to_24_khz() {
        let mut h = Harness::new(json!({}));
        h.say("hi");
        let id = h.generate();
        h.provider(delta(id, "One."));
        h.provider(ProviderEvent::Done { id });
        let synth: Vec<RequestId> = h
            .requests()
            .into_iter()
            .filter_map(|r| match r {
                ProviderRequest::Synthesize { id, .. } => Some(id),
                _ => None,
            })
            .collect();
        h.provider(ProviderEvent::Audio {
            id: synth[0],
            samples: vec![1000; 16_000],
            sample_rate: 16_000,
        });
        h.provider(ProviderEvent::Done { id: synth[0] });
        h.advance(3000 * MS);
        let mut samples = Vec::new();
        for m in h.messages() {
            let part = &m["payload"]["serverContent"]["modelTurn"]["parts"][0];
            if let Some(blob) = part.get("inlineData") {
                assert_eq!(blob["mimeType"], "audio/pcm;rate=24000");
                let blob: Blob = serde_json::from_value(blob.clone()).unwrap();
                blob.decode_pcm(&mut samples).unwrap();
            }
        }
        // One second at 16 kHz is one second at 24 kHz (the tail flushed at the end).
        assert!(
            (23_500..=24_500).contains(&samples.len()),
            "{}",
            samples.len()
        );
    }

    #[test]
    fn close_cancels_the_work_in_flight_in_the_session_id_space() {
        let mut h = Harness::text_only();
        h.say("hi");
        let id = h.generate();
        h.s.close(h.now, &mut h.out);
        assert_eq!(h.requests(), [ProviderRequest::Cancel { id }]);
        assert!(h.messages().is_empty());
    }

    #[test]
    fn openapi_types_become_json_schema() {
        let v = serde_json::json!({"type": "OBJECT", "properties": {"city": {"type": "STRING"}},
            "required": ["city"]});
        assert_eq!(
            json_schema(&v),
            serde_json::json!({"type": "object", "properties": {"city": {"type": "string"}},
                "required": ["city"]})
        );
    }

    #[test]
    fn gemini_schema_quirks_become_json_schema() {
        // The Android app's shape: unset fields null, a property named "description".
        let v = serde_json::json!({"type": "OBJECT", "description": null, "enum": null,
            "properties": {
                "description": {"type": "STRING", "items": null, "nullable": true},
                "to": {"type": "ARRAY", "items": {"type": "STRING", "format": null},
                    "maxItems": "5", "minItems": 1},
                "any": {"type": "TYPE_UNSPECIFIED", "default": {"type": "KEPT"}}
            },
            "required": ["description"], "anyOf": null});
        assert_eq!(
            json_schema(&v),
            serde_json::json!({"type": "object", "properties": {
                "description": {"type": ["string", "null"], "nullable": true},
                "to": {"type": "array", "items": {"type": "string"}, "maxItems": 5, "minItems": 1},
                "any": {"default": {"type": "KEPT"}}
            }, "required": ["description"]})
        );
        assert!(voxgate_mcp::schema::CompiledSchema::compile(&json_schema(&v)).is_ok());
    }

    /// A `SEND_REALTIME_INPUT` audio frame of `samples` with `mime`.
    fn pcm_frame(mime: &str, samples: &[i16]) -> Value {
        let mut data = String::new();
        voxgate_gemini::audio::encode_pcm_base64(samples, &mut data);
        json!({"type": "SEND_REALTIME_INPUT", "payload": {"audio": {"mimeType": mime, "data": data}}})
    }

    #[test]
    fn sample_rates_that_would_multiply_the_audio_are_refused() {
        let mut h = Harness::text_only();
        // At 1 Hz each sample would become 16,000 at 16 kHz: an 8 MiB frame, 50 billion.
        for rate in [1, 7_999, 192_001] {
            h.client(pcm_frame(&format!("audio/pcm;rate={rate}"), &[0; 100]));
            let m = h.messages();
            assert_eq!(kinds(&m), ["GEMINI_ERROR"], "{rate}: {m:?}");
            assert_eq!(
                m[0]["payload"]["message"],
                format!("Unusable audio sample rate {rate} Hz: send 8000 to 192000 Hz.")
            );
        }
        // A WAV header's rate is checked the same way.
        let wav = voxgate_audio::wav::wav_bytes_i16(2, 1, &[0; 100]).unwrap();
        let samples: Vec<i16> = wav
            .chunks_exact(2)
            .map(|c| i16::from_le_bytes([c[0], c[1]]))
            .collect();
        h.client(pcm_frame("audio/pcm;rate=16000", &samples));
        let m = h.messages();
        assert_eq!(
            m[0]["payload"]["message"], "Unusable audio sample rate 2 Hz: send 8000 to 192000 Hz.",
            "{m:?}"
        );
        // The edges are heard.
        for rate in [8_000, 192_000] {
            h.client(pcm_frame(&format!("audio/pcm;rate={rate}"), &[0; 100]));
            assert!(h.messages().is_empty(), "{rate}");
        }
    }

    #[test]
    fn modality_defaults_to_audio() {
        let text: LiveConfig = serde_json::from_str(
            r#"{"generationConfig":{"responseModalities":"text","temperature":null}}"#,
        )
        .unwrap();
        assert!(!wants_audio(&text));
        let audio: LiveConfig =
            serde_json::from_str(r#"{"generationConfig":{"responseModalities":["Audio"]}}"#)
                .unwrap();
        assert!(wants_audio(&audio));
        assert!(wants_audio(&LiveConfig::default()));
    }
}
