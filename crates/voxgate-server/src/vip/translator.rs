//! The VIP door as a translator: data channel messages and the track's audio in, engine
//! events out as VIP messages and reply audio for the track. No I/O and no clock: the driver
//! gives it the time and carries out its [`Out`].
//!
//! The VIP states of §5.2 are the turn machine's own states (its `Idle`, `Listening`,
//! `Processing`, `Action`, `Speaking` were modelled on VIP), so the door reports the engine's
//! state after every step rather than keeping a second machine that could disagree.

use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;
use voxgate_engine::{
    Action, ActionOutcome, ClientEvent, Engine, EngineConfig, Input, InvocationId, Output,
    OutputAudio, ProviderEvent, State, TriggerMode,
};
use voxgate_vip::{
    ActionDeclaration, ClientMessage, DecodeError, ErrorCode, ErrorPayload, ServerMessage,
    SessionConnected, VipState,
};

use crate::door::{ClientFrame, Inbound, MediaCommand, Out, ServerFrame, Translator, close_code};
use crate::metrics::{Door, Metrics};
use crate::webrtc::MediaEvent;

/// The rate the track's audio reaches the engine at.
pub(super) const INPUT_RATE: u32 = 16_000;

/// One browser session.
pub(super) struct VipDoor {
    engine: Engine,
    session_id: String,
    metrics: Arc<Metrics>,
    /// The data channel is open and `session.connected` went out.
    connected: bool,
    /// The VIP state last reported.
    reported: VipState,
    /// The door's turn number (a spoken or typed turn), reported with every turn event.
    turn: u64,
    /// When the user's speech last went quiet (the VAD's first silent frame after speech).
    speech_end: Option<Instant>,
    /// The current turn's end of speech, once the turn machine ended the turn.
    turn_speech_end: Option<Instant>,
    /// End of speech → transcript, for the latency report.
    transcript_ms: Option<u64>,
    /// The current turn's first reply audio went out.
    first_audio: bool,
    /// `input.detected` went out for the current stretch of listening.
    heard: bool,
    floats: Vec<f32>,
}

/// What a data channel message decodes to.
#[derive(Debug)]
pub(super) enum VipIn {
    Message(ClientMessage),
    Bad(DecodeError),
}

impl VipDoor {
    pub(super) fn new(
        mut config: EngineConfig,
        session_id: String,
        metrics: Arc<Metrics>,
        now: Instant,
    ) -> Result<Self, String> {
        config.input_rate = INPUT_RATE;
        config.output_audio = Some(OutputAudio {
            bytes_per_second: 24_000 * 2,
        });
        let engine = Engine::new(config, now).map_err(|e| e.to_string())?;
        Ok(Self {
            engine,
            session_id,
            metrics,
            connected: false,
            reported: VipState::Idle,
            turn: 0,
            speech_end: None,
            turn_speech_end: None,
            transcript_ms: None,
            first_audio: false,
            heard: false,
            floats: Vec::new(),
        })
    }

    fn send(out: &mut Out, m: &ServerMessage) {
        out.send(ServerFrame::Text(m.encode()));
    }

    fn refuse(&self, out: &mut Out, payload: ErrorPayload) {
        self.metrics.error(Door::Vip);
        Self::send(out, &ServerMessage::Error(payload));
    }

    fn input(&mut self, now: Instant, input: Input, out: &mut Out) {
        if let Err(e) = self.engine.handle_input(now, input) {
            self.refuse(
                out,
                ErrorPayload::new(ErrorCode::InvalidMessage, e.to_string()),
            );
        }
        self.drain(now, out);
    }

    /// Carries out the engine's outputs, then reports a state change.
    fn drain(&mut self, now: Instant, out: &mut Out) {
        while let Some(o) = self.engine.poll_output() {
            match o {
                Output::Provider(r) => out.provider(r),
                Output::Client(event) => self.client_event(now, event, out),
                _ => {}
            }
        }
        self.report_state(out);
    }

    fn report_state(&mut self, out: &mut Out) {
        let state = match self.engine.state() {
            State::Listening => VipState::Listening,
            State::Processing => VipState::Processing,
            State::Speaking => VipState::Speaking,
            State::Action => VipState::Action,
            _ => VipState::Idle,
        };
        if state == self.reported || !self.connected {
            self.reported = state;
            return;
        }
        let previous = self.reported;
        self.reported = state;
        if state != VipState::Listening {
            self.heard = false;
        }
        // A turn begins when the floor passes to the system from the user or from idle.
        if matches!(previous, VipState::Idle | VipState::Listening)
            && matches!(
                state,
                VipState::Processing | VipState::Action | VipState::Speaking
            )
        {
            self.turn += 1;
            self.first_audio = false;
            self.transcript_ms = None;
            self.turn_speech_end = if previous == VipState::Listening {
                self.speech_end
            } else {
                None
            };
        }
        let turn = (!matches!(state, VipState::Idle | VipState::Listening)).then_some(self.turn);
        Self::send(
            out,
            &ServerMessage::State {
                state,
                previous,
                turn,
            },
        );
    }

    fn client_event(&mut self, now: Instant, event: ClientEvent, out: &mut Out) {
        // The state this step ends in goes out before what happens in it (`action` before its
        // `action.invoke`, `speaking` before the reply's text), except at a reply's end, where
        // `reply.done` comes first and the state after it.
        if !matches!(event, ClientEvent::ResponseFinished { .. }) {
            self.report_state(out);
        }
        match event {
            ClientEvent::VadState { to, .. } => match to {
                voxgate_audio::vad::VadState::Speech => {
                    self.speech_end = None;
                    // Once per stretch of listening: a pause inside an utterance is not news.
                    if self.connected && !self.heard {
                        self.heard = true;
                        Self::send(out, &ServerMessage::InputDetected);
                    }
                }
                voxgate_audio::vad::VadState::SpeechEnding => self.speech_end = Some(now),
                _ => {}
            },
            ClientEvent::AudioChunk {
                samples,
                sample_rate,
                ..
            } => {
                if !self.first_audio {
                    self.first_audio = true;
                    if let Some(end) = self.turn_speech_end {
                        let ms = now.saturating_duration_since(end).as_millis();
                        Self::send(
                            out,
                            &ServerMessage::TurnLatency {
                                turn: self.turn,
                                end_of_speech_to_first_audio_ms: u64::try_from(ms)
                                    .unwrap_or(u64::MAX),
                                end_of_speech_to_transcript_ms: self.transcript_ms,
                            },
                        );
                    }
                }
                out.media(MediaCommand::Play {
                    samples,
                    rate: sample_rate,
                });
            }
            ClientEvent::ClearPlayback => out.media(MediaCommand::Clear),
            ClientEvent::SentenceStart { text, .. } | ClientEvent::TextFragment { text, .. } => {
                Self::send(
                    out,
                    &ServerMessage::ReplyText {
                        turn: self.turn,
                        text,
                    },
                );
            }
            ClientEvent::UserTranscription { text, .. } => {
                // A spoken turn was committed: the server-added time starts.
                out.turn_decided();
                if let Some(end) = self.turn_speech_end {
                    let ms = now.saturating_duration_since(end).as_millis();
                    self.transcript_ms = Some(u64::try_from(ms).unwrap_or(u64::MAX));
                }
                Self::send(
                    out,
                    &ServerMessage::TranscriptUser {
                        turn: self.turn,
                        text,
                    },
                );
            }
            ClientEvent::ResponseFinished { interrupted, .. } => {
                self.metrics.turn(Door::Vip);
                Self::send(
                    out,
                    &ServerMessage::ReplyDone {
                        turn: self.turn,
                        interrupted,
                    },
                );
            }
            ClientEvent::ActionInvoke {
                invocation,
                action_id,
                parameters,
                ..
            } => Self::send(
                out,
                &ServerMessage::ActionInvoke {
                    invocation_id: invocation.0.to_string(),
                    action_id,
                    parameters,
                },
            ),
            ClientEvent::ActionCancelled { invocation, reason } => Self::send(
                out,
                &ServerMessage::ActionCancelled {
                    invocation_id: invocation.0.to_string(),
                    error: from_engine(&reason),
                },
            ),
            ClientEvent::ActionError { error, .. } => self.refuse(out, from_engine(&error)),
            ClientEvent::Error { category, message } => {
                tracing::info!(?category, %message, "vip session error");
                self.refuse(out, ErrorPayload::new(ErrorCode::Unavailable, message));
            }
            _ => {}
        }
    }

    fn message(&mut self, now: Instant, m: ClientMessage, out: &mut Out) {
        match m {
            ClientMessage::ActionsDeclare { actions } => {
                let actions = actions.into_iter().map(to_engine_action).collect();
                self.input(now, Input::SetActions(actions), out);
            }
            ClientMessage::StateNarrate { text } => {
                self.input(now, Input::NarratedState(text), out);
            }
            ClientMessage::ActionResult {
                invocation_id,
                outcome,
            } => {
                let Ok(id) = invocation_id.parse::<u64>() else {
                    self.refuse(
                        out,
                        ErrorPayload::new(
                            ErrorCode::InvalidMessage,
                            format!("no invocation {invocation_id:?} is awaited"),
                        ),
                    );
                    return;
                };
                let outcome = match outcome {
                    voxgate_vip::ActionOutcome::Success { data } => {
                        ActionOutcome::Success(data.unwrap_or(Value::Null))
                    }
                    voxgate_vip::ActionOutcome::Error(e) => ActionOutcome::Failure(to_engine(&e)),
                    _ => ActionOutcome::Failure(voxgate_mcp::schema::ErrorPayload::new(
                        voxgate_mcp::schema::ErrorCode::ExecutionFailed,
                        "unknown outcome",
                    )),
                };
                self.input(
                    now,
                    Input::ActionResult {
                        invocation: InvocationId(id),
                        outcome,
                    },
                    out,
                );
            }
            ClientMessage::InputDetected => {
                // The client heard its user start: stop the reply at once, as the engine's
                // own barge-in would a moment later.
                if matches!(self.reported, VipState::Speaking | VipState::Action) {
                    out.media(MediaCommand::Clear);
                    self.input(now, Input::Abort, out);
                }
            }
            ClientMessage::InputText { text } => {
                let mode = TriggerMode::Immediate;
                self.input(now, Input::Text { text, mode }, out);
            }
            ClientMessage::SessionEnd => out.close(close_code::NORMAL, "session.end"),
            ClientMessage::ErrorFatal { code, message } => {
                tracing::info!(%code, %message, "vip: client gave up");
                out.close(close_code::NORMAL, "error.fatal from the client");
            }
            ClientMessage::Unknown { type_name } => {
                self.refuse(out, ErrorPayload::unknown_type(&type_name));
            }
            _ => {}
        }
    }
}

fn to_engine_action(a: ActionDeclaration) -> Action {
    Action {
        id: a.id,
        description: a.description,
        parameters: a.parameters,
    }
}

/// The engine's (MCP crate's) error payload in VIP's words.
fn from_engine(e: &voxgate_mcp::schema::ErrorPayload) -> ErrorPayload {
    use voxgate_mcp::schema::ErrorCode as E;
    let code = match &e.code {
        E::UnknownTool | E::UnknownAction => ErrorCode::UnknownAction,
        E::InvalidArguments => ErrorCode::InvalidParameters,
        E::Timeout => ErrorCode::Timeout,
        E::ExecutionFailed => ErrorCode::ExecutionFailed,
        other => ErrorCode::parse(other.as_str()),
    };
    ErrorPayload::new(code, e.message.clone()).with_details(
        e.details
            .iter()
            .map(|v| voxgate_vip::Violation::new(v.path.clone(), v.message.clone()))
            .collect(),
    )
}

/// A client's error payload for the engine.
fn to_engine(e: &ErrorPayload) -> voxgate_mcp::schema::ErrorPayload {
    use voxgate_mcp::schema::ErrorCode as E;
    let code = match &e.code {
        ErrorCode::InvalidParameters => E::InvalidArguments,
        ErrorCode::UnknownAction => E::UnknownAction,
        ErrorCode::Timeout => E::Timeout,
        ErrorCode::ExecutionFailed => E::ExecutionFailed,
        other => E::parse(other.as_str()),
    };
    let mut p = voxgate_mcp::schema::ErrorPayload::new(code, e.message.clone());
    p.details = e
        .details
        .iter()
        .map(|v| voxgate_mcp::schema::Violation {
            path: v.path.clone(),
            message: v.message.clone(),
        })
        .collect();
    p
}

impl Translator for VipDoor {
    type In = VipIn;
    type Event = ();

    fn decode(frame: ClientFrame, _max_frame_bytes: usize) -> Inbound<VipIn> {
        let decoded = match frame {
            ClientFrame::Text(t) => ClientMessage::decode(t.as_str()),
            ClientFrame::Binary(b) => ClientMessage::decode_slice(&b),
        };
        Inbound::Keep(match decoded {
            Ok(m) => VipIn::Message(m),
            Err(e) => VipIn::Bad(e),
        })
    }

    fn on_client(&mut self, now: Instant, msg: VipIn, out: &mut Out) {
        match msg {
            VipIn::Message(m) => self.message(now, m, out),
            VipIn::Bad(e) => {
                let payload = e.payload();
                self.refuse(out, payload.clone());
                // A result the client meant for an invocation but got wrong (too large, bad
                // shape) still settles it, as a failure, rather than leaving the turn waiting
                // for the action timeout.
                if let Some(id) = e.invocation_id().and_then(|id| id.parse::<u64>().ok()) {
                    let failure = voxgate_mcp::schema::ErrorPayload::new(
                        voxgate_mcp::schema::ErrorCode::ExecutionFailed,
                        format!("the client's result was refused: {}", payload.message),
                    );
                    self.input(
                        now,
                        Input::ActionResult {
                            invocation: InvocationId(id),
                            outcome: ActionOutcome::Failure(failure),
                        },
                        out,
                    );
                }
            }
        }
    }

    fn on_provider(&mut self, now: Instant, event: ProviderEvent, out: &mut Out) {
        self.input(now, Input::Provider(event), out);
    }

    fn on_timeout(&mut self, now: Instant, out: &mut Out) {
        self.engine.handle_timeout(now);
        self.drain(now, out);
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.engine.poll_timeout()
    }

    fn initialized(&self) -> bool {
        self.connected
    }

    fn on_init_timeout(&mut self, _now: Instant, out: &mut Out) {
        Self::send(
            out,
            &ServerMessage::ErrorFatal {
                code: ErrorCode::Timeout,
                message: "the WebRTC connection did not come up in time".into(),
            },
        );
    }

    fn on_shutdown(&mut self, _now: Instant, out: &mut Out) {
        Self::send(
            out,
            &ServerMessage::ErrorFatal {
                code: ErrorCode::Unavailable,
                message: "server shutting down".into(),
            },
        );
    }

    fn is_idle(&self) -> bool {
        matches!(self.reported, VipState::Idle | VipState::Listening)
    }

    fn speculation_stats(&self) -> Option<voxgate_engine::SpeculationStats> {
        Some(self.engine.speculation_stats())
    }

    fn take_telemetry(&mut self, sink: &mut Vec<voxgate_engine::TurnEvent>) {
        sink.extend(self.engine.take_telemetry());
    }

    fn on_close(&mut self, now: Instant, out: &mut Out) {
        let _ = self.engine.handle_input(now, Input::Close);
        while let Some(o) = self.engine.poll_output() {
            if let Output::Provider(r) = o {
                out.provider(r);
            }
        }
        out.media(MediaCommand::Hangup);
    }

    fn on_server_tools(
        &mut self,
        now: Instant,
        tools: Vec<voxgate_engine::ServerToolDefinition>,
        out: &mut Out,
    ) {
        self.input(now, Input::ServerTools(tools), out);
    }

    fn on_media(&mut self, now: Instant, event: MediaEvent, out: &mut Out) {
        match event {
            MediaEvent::DataOpen => {
                self.connected = true;
                Self::send(
                    out,
                    &ServerMessage::SessionConnected(SessionConnected::new(
                        self.session_id.clone(),
                    )),
                );
                tracing::info!("vip: session connected");
            }
            MediaEvent::Audio(samples) => {
                self.floats.clear();
                self.floats.extend(
                    samples
                        .iter()
                        .map(|&s| voxgate_audio::format::i16_to_f32(s)),
                );
                self.engine.handle_audio(now, &self.floats);
                self.drain(now, out);
            }
            MediaEvent::Closed(reason) => {
                tracing::info!(%reason, "vip: connection closed");
                out.close(close_code::NORMAL, "connection closed");
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests;
