//! The realtime door: the protobuf session protocol (Deepslate-compatible) over WebSocket.
//!
//! Each connection is a [`RealtimeDoor`] translator run by the shared door driver
//! ([`crate::door`]): the driver owns the socket, the queues, the provider tasks, the
//! lifecycle timers and close; the translator turns protocol messages into engine inputs and
//! engine events into protocol messages.
//!
//! Per session: a client whose `TtsConfiguration` names ElevenLabs gets its own synthesizer
//! (its key, voice, model, settings and location; `[realtime] elevenlabs_base_url` overrides
//! the host); hosted TTS uses the server's. `ModelSpeechProgress` is paced to playback
//! ([`progress`]); `InferenceComplete` precedes each `ResponseEnd`; a final `TurnSnapshot`
//! follows each finished reply. The engine's `Emotion` events have no counterpart in this
//! protocol and are dropped, so replies reach realtime clients without emoji (the engine never
//! shows or speaks them). `ContextTruncated` reports the turns the engine drops from the model's
//! context to keep it within `[realtime] max_context_chars`; exported messages carry the
//! response turn that dropped them in `truncated_at_response_turn_id`. A connection that does
//! not initialize within the init timeout gets an `ErrorSession` notification and a 1008 close;
//! an unusable `InitializeSessionRequest` is answered with its error and a 1008 close. The user
//! guide is `docs/doors/realtime.md`.

mod progress;
mod session;

use session::{RealtimeDoor, RealtimeSettings};

use std::sync::Arc;

use axum::extract::ws::WebSocket;

use crate::metrics::Door;
use crate::server::App;

/// Serves one upgraded connection until the client leaves, a fatal error, a timeout or
/// shutdown.
pub(crate) async fn serve(socket: WebSocket, app: Arc<App>) {
    let settings = RealtimeSettings {
        elevenlabs_base_url: app.config.realtime.elevenlabs_base_url.clone(),
        max_context_chars: app.config.realtime.max_context_chars,
        max_history_messages: app.config.limits.max_history_messages,
    };
    let door = RealtimeDoor::new(Arc::clone(&app.metrics), settings);
    crate::door::run(socket, door, app.driver(Door::Realtime)).await;
}
