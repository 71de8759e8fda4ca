//! Pass-through mode: a bridge session relayed to the Gemini Live API.
//!
//! `CONNECT_GEMINI` (or `UPDATE_CONFIG`) opens one upstream WebSocket
//! (`{base_url}/ws/...BidiGenerateContent?key=...`) and sends `setup`; bridge messages become
//! `clientContent`/`realtimeInput`/`toolResponse` ([`ClientMessage::to_live`]) and upstream
//! messages come back through [`BridgeForwarder`]. Client messages sent before the upstream's
//! `setupComplete` wait in a bounded queue. The upstream connection is I/O, so it runs in its
//! own task ([`relay`]); the session itself does none: it queues frames for that task and
//! handles the task's [`UpEvent`]s, which the door driver delivers. The task belongs to the
//! session: dropping the session aborts it and closes the upstream socket.
//!
//! With the app's WebRTC connection up ([`PassSession::set_media`]) its microphone goes up as
//! `realtimeInput.audio` ([`PassSession::media_audio`]) and the upstream's reply audio is taken
//! out of the relayed content and played on the track ([`MediaCommand::Play`]); the rest of
//! the content (text, transcriptions, flags) is relayed as before, and `interrupted` clears
//! the track's queued audio.

use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;
use voxgate_gemini::live::{INPUT_SAMPLE_RATE, LIVE_WS_PATH, OUTPUT_SAMPLE_RATE};
use voxgate_gemini::{
    Blob, BridgeForwarder, ClientMessage, LiveClientMessage, LiveConfig, LiveServerEvent,
    LiveServerMessage, RealtimeInput, ServerContent, ServerMessage,
};

use super::{GeminiConfig, emit, log_message};
use crate::door::{MediaCommand, Out};
use crate::metrics::{Direction, Door, Metrics};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Frames waiting for the upstream (before `setupComplete`, or when it reads slowly).
const UP_QUEUE: usize = 1024;
/// Audio is dropped (and counted) once this many frames wait, so that control messages
/// always find room behind it; a control message that finds the queue full means the
/// upstream stopped reading, and the session ends.
const AUDIO_QUEUE: usize = 256;
const EVENT_QUEUE: usize = 256;

/// What the upstream task reports.
#[derive(Debug)]
pub(super) enum UpEvent {
    /// The WebSocket is open and `setup` was sent.
    Open,
    /// A decoded upstream message (boxed: it is large and events queue up).
    Message(Box<LiveServerMessage>),
    /// An upstream frame that could not be decoded.
    Bad(String),
    /// The connection could not be opened.
    Failed(String),
    /// The upstream closed the connection.
    Closed { code: Option<u16>, reason: String },
}

/// A session's end of its upstream connection.
pub(super) struct Link {
    /// Encoded Live API frames for the upstream, after `setup`.
    pub(super) to_up: mpsc::Sender<String>,
    /// What the connection reports.
    pub(super) events: mpsc::Receiver<UpEvent>,
    /// The task running the connection, aborted with the session.
    pub(super) task: Option<JoinHandle<()>>,
}

/// Opens an upstream connection to a URL, sending a `setup` frame first. [`connector`] in
/// the server; tests pass one that hands them the far ends of the channels.
pub(super) type Connector = Arc<dyn Fn(String, String) -> Link + Send + Sync>;

/// The real upstream: a [`relay`] task per session.
pub(super) fn connector() -> Connector {
    Arc::new(|url, setup| {
        let (to_up, up_rx) = mpsc::channel(UP_QUEUE);
        let (ev_tx, events) = mpsc::channel(EVENT_QUEUE);
        let task = tokio::spawn(relay(url, setup, up_rx, ev_tx));
        Link {
            to_up,
            events,
            task: Some(task),
        }
    })
}

/// The channels of a [`Link`] whose far ends the caller drives (tests).
#[cfg(test)]
pub(super) fn test_link() -> (Link, mpsc::Receiver<String>, mpsc::Sender<UpEvent>) {
    let (to_up, up_rx) = mpsc::channel(UP_QUEUE);
    let (ev_tx, events) = mpsc::channel(EVENT_QUEUE);
    (
        Link {
            to_up,
            events,
            task: None,
        },
        up_rx,
        ev_tx,
    )
}

/// One relayed session. Dropping it ends the upstream connection.
pub(super) struct PassSession {
    to_up: mpsc::Sender<String>,
    events: mpsc::Receiver<UpEvent>,
    task: Option<JoinHandle<()>>,
    forwarder: BridgeForwarder,
    metrics: Arc<Metrics>,
    /// Send `GEMINI_CONNECTED` when the upstream opens (not for `UPDATE_CONFIG`).
    announce: bool,
    setup_done: bool,
    assistant_speaking: bool,
    /// The app's WebRTC connection is up: reply audio goes out on its track.
    media: bool,
}

impl Drop for PassSession {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// Percent-encodes a query value.
fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The upstream URL: the Live API path is appended to a bare host URL.
pub(super) fn upstream_url(base_url: &str, api_key: &str) -> String {
    let base = base_url.trim().trim_end_matches('/');
    let after_scheme = base.split_once("://").map_or(base, |(_, rest)| rest);
    let mut url = if after_scheme.contains('/') {
        base.to_owned()
    } else {
        format!("{base}{LIVE_WS_PATH}")
    };
    url.push(if url.contains('?') { '&' } else { '?' });
    url.push_str("key=");
    url.push_str(&query_escape(api_key));
    url
}

impl PassSession {
    /// Opens the upstream connection for a session with `config` through `connect`;
    /// `announce` sends `GEMINI_CONNECTED` when it opens (a `CONNECT_GEMINI`, not an
    /// `UPDATE_CONFIG`).
    pub(super) fn start(
        mut config: LiveConfig,
        door: &GeminiConfig,
        metrics: Arc<Metrics>,
        announce: bool,
        connect: &Connector,
    ) -> Result<Self, String> {
        let Some(key) = door.api_key.as_deref().filter(|k| !k.trim().is_empty()) else {
            return Err(
                "Pass-through mode needs a Gemini API key: set gemini.api_key or \
                        VOXGATE_GEMINI_API_KEY."
                    .into(),
            );
        };
        let model = config
            .model
            .take()
            .filter(|m| !m.trim().is_empty())
            .unwrap_or_else(|| door.model.clone());
        config.model = Some(if model.starts_with("models/") || model.contains('/') {
            model
        } else {
            format!("models/{model}")
        });
        let setup = LiveClientMessage::Setup(config).encode();
        let url = upstream_url(&door.base_url, key);
        let Link {
            to_up,
            events,
            task,
        } = connect(url, setup);
        Ok(Self {
            to_up,
            events,
            task,
            forwarder: BridgeForwarder::new(door.audio_chunks),
            metrics,
            announce,
            setup_done: false,
            assistant_speaking: door.assistant_speaking,
            media: false,
        })
    }

    pub(super) fn events(&mut self) -> &mut mpsc::Receiver<UpEvent> {
        &mut self.events
    }

    /// Relays a session message upstream. Audio is dropped (and counted) when the upstream
    /// does not keep up; other messages queue. False when the upstream has stopped reading
    /// (the queue is full): the session cannot go on.
    pub(super) fn forward(&mut self, msg: &ClientMessage, out: &mut Out) -> bool {
        let live = match msg {
            ClientMessage::SendRealtimeInput(r) => match strip_wav(r) {
                Ok(Some(r)) => Some(LiveClientMessage::RealtimeInput(r)),
                Ok(None) => msg.to_live(),
                Err(e) => {
                    self.metrics.error(Door::Gemini);
                    emit(out, &ServerMessage::error(e));
                    return true;
                }
            },
            _ => msg.to_live(),
        };
        let Some(live) = live else { return true };
        self.send_up(&live)
    }

    /// Whether the app's WebRTC connection is up: while it is, the upstream's reply audio is
    /// played on its track instead of relayed in `CONTENT_MESSAGE`s.
    pub(super) fn set_media(&mut self, up: bool) {
        self.media = up;
    }

    /// 20 ms of the app's microphone from its WebRTC track (mono at 16 kHz), sent up as
    /// `realtimeInput.audio` like `SEND_REALTIME_INPUT` audio. False as for
    /// [`forward`](Self::forward).
    pub(super) fn media_audio(&mut self, samples: &[i16]) -> bool {
        self.send_up(&LiveClientMessage::RealtimeInput(RealtimeInput {
            audio: Some(Blob::pcm(samples, INPUT_SAMPLE_RATE)),
            ..RealtimeInput::default()
        }))
    }

    /// Queues a Live API message for the upstream; audio is dropped (and counted) when the
    /// upstream does not keep up. False when it has stopped reading.
    fn send_up(&mut self, live: &LiveClientMessage) -> bool {
        let audio_only = matches!(live, LiveClientMessage::RealtimeInput(r)
            if r.audio.is_some() && r.text.is_none() && !r.activity_end && !r.audio_stream_end);
        let queued = UP_QUEUE.saturating_sub(self.to_up.capacity());
        if audio_only && queued >= AUDIO_QUEUE {
            self.metrics.dropped(Door::Gemini, Direction::Uplink, 1);
            return true;
        }
        match self.to_up.try_send(live.encode()) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) if audio_only => {
                self.metrics.dropped(Door::Gemini, Direction::Uplink, 1);
                true
            }
            Err(mpsc::error::TrySendError::Full(_)) => false,
            // The task ended; its Closed/Failed event tells the client.
            Err(mpsc::error::TrySendError::Closed(_)) => true,
        }
    }

    /// Handles an upstream event; false when the session is over.
    pub(super) fn upstream_event(&mut self, event: UpEvent, out: &mut Out) -> bool {
        match event {
            UpEvent::Open => {
                if self.announce {
                    emit(out, &ServerMessage::GeminiConnected);
                }
                true
            }
            UpEvent::Message(m) => {
                match &m.event {
                    LiveServerEvent::SetupComplete => self.setup_done = true,
                    LiveServerEvent::GoAway(g) => {
                        emit(
                            out,
                            &log_message(
                                "warn",
                                format!(
                                    "Gemini will close the session in {}.",
                                    g.time_left.as_deref().unwrap_or("a moment")
                                ),
                            ),
                        );
                    }
                    _ => {}
                }
                let mut relayed = Vec::new();
                self.forwarder.forward(*m, &mut relayed);
                for m in relayed {
                    match m {
                        ServerMessage::AssistantSpeaking { .. } if !self.assistant_speaking => {}
                        // The app hears the reply on its track, not in copies of it.
                        ServerMessage::AudioChunk { .. } if self.media => {}
                        ServerMessage::ContentMessage(c) if self.media => {
                            if let Some(c) = self.play(c, out) {
                                emit(out, &ServerMessage::ContentMessage(c));
                            }
                        }
                        m => emit(out, &m),
                    }
                }
                true
            }
            UpEvent::Bad(details) => {
                self.metrics.error(Door::Gemini);
                emit(
                    out,
                    &ServerMessage::GeminiError {
                        message: "Gemini sent a message that could not be decoded.".into(),
                        details: Some(details.into()),
                    },
                );
                true
            }
            UpEvent::Failed(reason) => {
                self.metrics.error(Door::Gemini);
                // Connection failures are the server's business (key, network, quota): the
                // detail goes to the log under the id the client is given.
                let message = crate::incident::tagged("Could not connect to Gemini", &reason);
                emit(out, &ServerMessage::setup_failed(None, message.clone()));
                emit(out, &ServerMessage::error(message));
                false
            }
            UpEvent::Closed { code, reason } => {
                if self.setup_done {
                    emit(
                        out,
                        &ServerMessage::GeminiDisconnected {
                            // A normal close says why the session ended (time limit, goAway);
                            // any other reason may be about the server's key or quota.
                            reason: Some(match code {
                                Some(1000) => format!("Gemini closed the session (1000): {reason}"),
                                Some(c) => crate::incident::tagged(
                                    &format!("Gemini closed the session ({c})"),
                                    &reason,
                                ),
                                None => {
                                    crate::incident::tagged("Gemini closed the session", &reason)
                                }
                            }),
                        },
                    );
                } else {
                    self.metrics.error(Door::Gemini);
                    let message =
                        crate::incident::tagged("Gemini refused the session setup", &reason);
                    emit(
                        out,
                        &ServerMessage::setup_failed(code.map(i64::from), message.clone()),
                    );
                    emit(out, &ServerMessage::error(message));
                }
                false
            }
        }
    }
}

impl PassSession {
    /// Takes the reply audio out of `content` and plays it on the WebRTC track (an
    /// `interrupted` content first clears what the track still holds); the rest of the
    /// content, if anything is left, is for the WebSocket.
    fn play(&mut self, mut content: ServerContent, out: &mut Out) -> Option<ServerContent> {
        if content.interrupted {
            out.media(MediaCommand::Clear);
        }
        if let Some(turn) = &mut content.model_turn {
            let mut samples = Vec::new();
            turn.parts.retain(|part| {
                let Some(blob) = part.inline_data.as_ref().filter(|b| b.is_audio()) else {
                    return true;
                };
                samples.clear();
                match blob.decode_pcm(&mut samples) {
                    Ok(info) => out.media(MediaCommand::Play {
                        samples: std::mem::take(&mut samples),
                        rate: info.sample_rate.unwrap_or(OUTPUT_SAMPLE_RATE),
                    }),
                    Err(e) => {
                        self.metrics.error(Door::Gemini);
                        tracing::debug!(error = %e, "gemini pass-through: undecodable reply audio");
                    }
                }
                false
            });
            if turn.parts.is_empty() {
                content.model_turn = None;
            }
        }
        (content != ServerContent::default()).then_some(content)
    }
}

/// A whole WAV file in one audio frame becomes raw PCM (the Live API takes no headers), mono
/// at the file's rate. `Ok(None)` when the audio is not a WAV file.
fn strip_wav(r: &RealtimeInput) -> Result<Option<RealtimeInput>, String> {
    let Some(blob) = &r.audio else {
        return Ok(None);
    };
    if !blob.data.trim_start().starts_with("UklGR") {
        return Ok(None);
    }
    let mut samples = Vec::new();
    let info = blob
        .decode_pcm(&mut samples)
        .map_err(|e| format!("Invalid audio in {}: {e}.", blob.mime_type))?;
    let Some(header) = info.wav else {
        return Ok(None);
    };
    let channels = usize::from(info.channels.max(1));
    let mono: Vec<i16> = if channels == 1 {
        samples
    } else {
        samples
            .chunks(channels)
            .map(|f| {
                let sum: i32 = f.iter().map(|&s| i32::from(s)).sum();
                let n = i32::try_from(f.len()).unwrap_or(1).max(1);
                i16::try_from(sum / n).unwrap_or(0)
            })
            .collect()
    };
    let mut out = r.clone();
    out.audio = Some(Blob::pcm(&mono, header.sample_rate));
    Ok(Some(out))
}

/// The upstream connection: connect, send `setup`, then relay both ways. Client frames wait
/// until `setupComplete` (the Live API wants nothing before it).
async fn relay(
    url: String,
    setup: String,
    mut to_up: mpsc::Receiver<String>,
    events: mpsc::Sender<UpEvent>,
) {
    let ws =
        match tokio::time::timeout(CONNECT_TIMEOUT, tokio_tungstenite::connect_async(url)).await {
            Ok(Ok((ws, _))) => ws,
            Ok(Err(e)) => {
                let _ = events.send(UpEvent::Failed(describe(&e))).await;
                return;
            }
            Err(_) => {
                let _ = events
                    .send(UpEvent::Failed("timed out connecting".into()))
                    .await;
                return;
            }
        };
    let (mut sink, mut stream) = ws.split();
    if let Err(e) = sink.send(Message::Text(setup.into())).await {
        let _ = events.send(UpEvent::Failed(describe(&e))).await;
        return;
    }
    if events.send(UpEvent::Open).await.is_err() {
        return;
    }
    let mut ready = false;
    loop {
        tokio::select! {
            frame = stream.next() => {
                let event = match frame {
                    Some(Ok(Message::Text(t))) => decode(LiveServerMessage::decode(t.as_str())),
                    Some(Ok(Message::Binary(b))) => decode(LiveServerMessage::decode_slice(&b)),
                    Some(Ok(Message::Close(frame))) => {
                        let (code, reason) = frame.map_or((None, String::new()), |f| {
                            (Some(u16::from(f.code)), f.reason.to_string())
                        });
                        let _ = events.send(UpEvent::Closed { code, reason }).await;
                        return;
                    }
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => {
                        let _ = events
                            .send(UpEvent::Closed { code: None, reason: describe(&e) })
                            .await;
                        return;
                    }
                    None => {
                        let _ = events
                            .send(UpEvent::Closed { code: None, reason: "connection closed".into() })
                            .await;
                        return;
                    }
                };
                if matches!(&event, UpEvent::Message(m) if m.event == LiveServerEvent::SetupComplete) {
                    ready = true;
                }
                if events.send(event).await.is_err() {
                    return;
                }
            }
            frame = to_up.recv(), if ready => {
                let Some(frame) = frame else {
                    let _ = sink.close().await;
                    return;
                };
                if let Err(e) = sink.send(Message::Text(frame.into())).await {
                    let _ = events
                        .send(UpEvent::Closed { code: None, reason: describe(&e) })
                        .await;
                    return;
                }
            }
        }
    }
}

fn decode(r: Result<LiveServerMessage, voxgate_gemini::DecodeError>) -> UpEvent {
    match r {
        Ok(m) => UpEvent::Message(Box::new(m)),
        Err(e) => UpEvent::Bad(e.to_string()),
    }
}

/// An upstream error without the URL (it carries the API key).
fn describe(e: &tokio_tungstenite::tungstenite::Error) -> String {
    use tokio_tungstenite::tungstenite::Error;
    match e {
        Error::Http(response) => format!("HTTP {}", response.status()),
        Error::Url(_) => "invalid upstream URL".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            upstream_url("wss://generativelanguage.googleapis.com/", "a b"),
            format!("wss://generativelanguage.googleapis.com{LIVE_WS_PATH}?key=a%20b")
        );
        assert_eq!(
            upstream_url("ws://127.0.0.1:9/custom?x=1", "k"),
            "ws://127.0.0.1:9/custom?x=1&key=k"
        );
    }
}
