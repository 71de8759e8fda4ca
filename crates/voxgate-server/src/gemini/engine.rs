//! Engine mode: a bridge session answered by voxgate's own pipeline.
//!
//! The bridge's messages become engine inputs (typed text, 16 kHz PCM or a whole WAV file,
//! client tool results) and the engine's events become the Live API shapes the bridge's apps
//! read inside `CONTENT_MESSAGE`: `modelTurn` text or 24 kHz `inlineData` audio,
//! `inputTranscription`/`outputTranscription`, `interrupted` and `turnComplete` (each followed
//! by its own `INTERRUPTED`/`TURN_COMPLETE`), and `TOOL_CALL`/`TOOL_CALL_CANCELLATION`.
//!
//! No I/O: the session takes the time as a value and writes frames and provider requests into
//! the door driver's [`Out`]; provider events come back through [`EngineSession::provider_event`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use voxgate_audio::format::{f32_to_i16, i16_to_f32};
use voxgate_audio::resample::Resampler;
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
use crate::door::Out;
use crate::metrics::{Door, Metrics};

/// Per-connection output options from the door's configuration.
#[derive(Debug, Clone, Copy)]
pub(super) struct Flags {
    pub(super) audio_chunks: bool,
    pub(super) assistant_speaking: bool,
}

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
            | ProviderEvent::Done { id }
            | ProviderEvent::Failed { id, .. } => id,
            _ => return None,
        };
        *id = RequestId(id.0 & ((1 << ID_BITS) - 1));
        Some(event)
    }
}

/// Mono audio at a source rate that may change between calls, converted to one fixed rate.
///
/// Kept apart so the rate-aware resampler planned for `voxgate_audio::resample` can replace it
/// in one place.
struct RateConverter {
    to: u32,
    state: Option<(u32, Resampler)>,
}

impl RateConverter {
    fn new(to: u32) -> Self {
        Self { to, state: None }
    }

    /// Appends `input` (at `from` Hz) converted to `out`; a source at the target rate is
    /// copied. `Err` when `from` cannot be converted (nothing is appended).
    fn process(&mut self, from: u32, input: &[f32], out: &mut Vec<f32>) -> Result<(), String> {
        if from == self.to {
            out.extend_from_slice(input);
            return Ok(());
        }
        if self.state.as_ref().is_none_or(|(rate, _)| *rate != from) {
            match Resampler::new(from, self.to) {
                Ok(r) => self.state = Some((from, r)),
                Err(e) => {
                    self.state = None;
                    return Err(e.to_string());
                }
            }
        }
        if let Some((_, r)) = &mut self.state {
            r.process(input, out);
        }
        Ok(())
    }

    /// Appends what the resampler still holds (the end of a stream).
    fn flush(&mut self, out: &mut Vec<f32>) {
        if let Some((_, r)) = &mut self.state {
            r.flush(out);
        }
    }

    /// Forgets held samples (playback was cut).
    fn reset(&mut self) {
        if let Some((_, r)) = &mut self.state {
            r.reset();
        }
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
    floats: Vec<f32>,
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

/// Gemini declares parameter types in OpenAPI style (`"OBJECT"`, `"STRING"`); JSON Schema
/// wants them lower case.
fn json_schema(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let v = match (k.as_str(), v) {
                        ("type", Value::String(t)) => Value::String(t.to_ascii_lowercase()),
                        _ => json_schema(v),
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(json_schema).collect()),
        other => other.clone(),
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
    /// A session with `config` whose requests carry `ids`; [`start`](Self::start) applies
    /// its tools once the client was told the setup succeeded.
    pub(super) fn new(
        config: &LiveConfig,
        metrics: Arc<Metrics>,
        flags: Flags,
        ids: Ids,
        now: Instant,
    ) -> Result<Self, String> {
        let audio_out = wants_audio(config);
        let engine_config = EngineConfig {
            input_rate: INPUT_SAMPLE_RATE,
            output_audio: audio_out.then_some(OutputAudio {
                bytes_per_second: OUTPUT_SAMPLE_RATE * 2,
            }),
            system_prompt: system_prompt(config),
            temperature: temperature(config),
            // The bridge protocol has no history export: keeping speech would only cost memory.
            keep_user_audio: false,
            max_history_audio: Duration::ZERO,
            ..EngineConfig::default()
        };
        let engine = Engine::new(engine_config, now).map_err(|e| e.to_string())?;
        Ok(Self {
            engine,
            ids,
            metrics,
            flags,
            audio_out,
            in_resampler: RateConverter::new(INPUT_SAMPLE_RATE),
            out_resampler: RateConverter::new(OUTPUT_SAMPLE_RATE),
            samples: Vec::new(),
            floats: Vec::new(),
            turn_open: false,
            speaking: false,
            transcribed: false,
            pending_calls: Vec::new(),
            call_turns: Vec::new(),
            cancelled: Vec::new(),
        })
    }

    /// Declares the config's tools (a refused declaration is answered with `GEMINI_ERROR`).
    pub(super) fn start(&mut self, now: Instant, config: &LiveConfig, out: &mut Out) {
        self.input(now, Input::SetTools(tools(config)), out);
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
        self.floats.clear();
        self.floats
            .extend(self.samples.chunks(channels).map(|frame| {
                let sum: f32 = frame.iter().map(|&s| i16_to_f32(s)).sum();
                #[allow(clippy::cast_precision_loss, reason = "a handful of channels")]
                let n = frame.len() as f32;
                sum / n
            }));
        if rate == INPUT_SAMPLE_RATE {
            self.engine.handle_audio(now, &self.floats);
        } else {
            let mut converted = Vec::new();
            if let Err(e) = self
                .in_resampler
                .process(rate, &self.floats, &mut converted)
            {
                self.metrics.error(Door::Gemini);
                emit(
                    out,
                    &ServerMessage::error(format!("Unusable audio sample rate {rate} Hz: {e}.")),
                );
                return false;
            }
            if info.wav.is_some() {
                self.in_resampler.flush(&mut converted);
            }
            self.engine.handle_audio(now, &converted);
        }
        self.drain(out);
        info.wav.is_some()
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
                let audio = self.convert(&samples, sample_rate);
                self.push_audio(&audio, out);
            }
            ClientEvent::ResponseEnd { .. } => {
                let tail = self.flush_audio();
                self.push_audio(&tail, out);
            }
            ClientEvent::ClearPlayback => self.out_resampler.reset(),
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
            ClientEvent::Error { message, .. } => {
                self.metrics.error(Door::Gemini);
                emit(out, &ServerMessage::error(message));
            }
            // VAD telemetry, subtitles, faces and device MCP have no bridge message.
            _ => {}
        }
    }

    fn push_audio(&mut self, samples: &[i16], out: &mut Out) {
        if samples.is_empty() {
            return;
        }
        if !self.speaking {
            self.speaking = true;
            if self.flags.assistant_speaking {
                emit(out, &ServerMessage::AssistantSpeaking { speaking: true });
            }
        }
        let blob = Blob::pcm(samples, OUTPUT_SAMPLE_RATE);
        let data = self.flags.audio_chunks.then(|| blob.data.clone());
        emit(out, &content(model_parts(vec![Part::inline(blob)])));
        if let Some(data) = data {
            emit(out, &ServerMessage::AudioChunk { data });
        }
    }

    /// Reply audio (mono i16 at `rate`) at the bridge's 24 kHz.
    fn convert(&mut self, samples: &[i16], rate: u32) -> Vec<i16> {
        if rate == OUTPUT_SAMPLE_RATE {
            return samples.to_vec();
        }
        let floats: Vec<f32> = samples.iter().map(|&s| i16_to_f32(s)).collect();
        let mut converted = Vec::new();
        if let Err(e) = self.out_resampler.process(rate, &floats, &mut converted) {
            tracing::warn!(%e, rate, "cannot resample reply audio");
            return Vec::new();
        }
        converted.into_iter().map(f32_to_i16).collect()
    }

    fn flush_audio(&mut self) -> Vec<i16> {
        let mut tail = Vec::new();
        self.out_resampler.flush(&mut tail);
        tail.into_iter().map(f32_to_i16).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
