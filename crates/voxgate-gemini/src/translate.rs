//! Mapping between the bridge protocol and the upstream Live API, for a server that passes a
//! bridge session through to the real service. Pure functions and a tiny stateful forwarder:
//! no I/O, no clock.

use crate::bridge::{ClientMessage, ServerMessage, SetupComplete};
use crate::content::Content;
use crate::live::{ClientContent, LiveClientMessage, LiveServerEvent, LiveServerMessage};

impl ClientMessage {
    /// The Live API message this bridge message becomes, if it is forwarded at all.
    ///
    /// `CONNECT_GEMINI` and `UPDATE_CONFIG` become `setup` (a new upstream connection: setup is
    /// once per connection); `SEND_MESSAGE` a user turn; realtime input and tool responses map
    /// one to one. Session control, WebRTC and unknown types return `None`.
    pub fn to_live(&self) -> Option<LiveClientMessage> {
        match self {
            Self::ConnectGemini { initial_config } => Some(LiveClientMessage::Setup(
                initial_config.clone().unwrap_or_default(),
            )),
            Self::UpdateConfig(config) => Some(LiveClientMessage::Setup(config.clone())),
            Self::SendMessage {
                parts,
                turn_complete,
            } => Some(LiveClientMessage::ClientContent(ClientContent {
                turns: vec![Content {
                    role: Some("user".to_owned()),
                    parts: parts.clone(),
                }],
                turn_complete: *turn_complete,
            })),
            Self::SendRealtimeInput(input) => Some(LiveClientMessage::RealtimeInput(input.clone())),
            Self::SendToolResponse(r) => Some(LiveClientMessage::ToolResponse(r.clone())),
            _ => None,
        }
    }
}

/// Turns Live API server messages into the bridge messages clients expect, in order.
///
/// Per `serverContent`: `CONTENT_MESSAGE` first, then (opt-in) one `AUDIO_CHUNK` per audio
/// part, then `INTERRUPTED` and/or `TURN_COMPLETE` when the content carries those flags.
/// `ASSISTANT_SPEAKING {speaking: true}` precedes the first audio of each turn.
#[derive(Debug, Clone, Default)]
pub struct BridgeForwarder {
    audio_chunks: bool,
    speaking: bool,
}

impl BridgeForwarder {
    /// A forwarder; `audio_chunks` turns on the `AUDIO_CHUNK` copies of model audio, which the
    /// original bridge declared but never sent (default off, per connection).
    pub fn new(audio_chunks: bool) -> Self {
        Self {
            audio_chunks,
            speaking: false,
        }
    }

    /// Appends the bridge messages for `msg` to `out`. Messages the bridge does not relay
    /// (`goAway`, `sessionResumptionUpdate`, usage-only, unknown) produce nothing: the server
    /// acts on them itself.
    pub fn forward(&mut self, msg: LiveServerMessage, out: &mut Vec<ServerMessage>) {
        match msg.event {
            LiveServerEvent::SetupComplete => {
                self.speaking = false;
                out.push(ServerMessage::SetupComplete(SetupComplete::default()));
            }
            LiveServerEvent::ServerContent(content) => {
                let has_audio = content.audio().next().is_some();
                if has_audio && !self.speaking {
                    self.speaking = true;
                    out.push(ServerMessage::AssistantSpeaking { speaking: true });
                }
                let chunks: Vec<String> = if self.audio_chunks {
                    content.audio().map(|b| b.data.clone()).collect()
                } else {
                    Vec::new()
                };
                let interrupted = content.interrupted;
                let turn_complete = content.turn_complete;
                out.push(ServerMessage::ContentMessage(content));
                out.extend(
                    chunks
                        .into_iter()
                        .map(|data| ServerMessage::AudioChunk { data }),
                );
                if interrupted {
                    self.speaking = false;
                    out.push(ServerMessage::Interrupted);
                }
                if turn_complete {
                    self.speaking = false;
                    out.push(ServerMessage::TurnComplete);
                }
            }
            LiveServerEvent::ToolCall(call) => out.push(ServerMessage::ToolCall(call)),
            LiveServerEvent::ToolCallCancellation(c) => {
                out.push(ServerMessage::ToolCallCancellation(c));
            }
            _ => {}
        }
    }
}
