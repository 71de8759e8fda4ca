//! The door driver: one session lifecycle shared by every WebSocket door.
//!
//! A door is a translator between its wire protocol and the engine ([`Translator`]): it turns
//! a decoded client message, a provider event or a deadline into frames for the client and
//! requests for the providers, and does no I/O itself, so its decisions are unit-tested on a
//! virtual clock. This module owns everything else a session needs, once for every door:
//!
//! - a **reader task** that decodes frames into a bounded queue: messages the translator marks
//!   droppable (audio) are dropped and counted when the queue is full, others wait (which
//!   pushes back on the peer through TCP);
//! - a **writer task** that sends from a bounded queue, each write bounded by the write
//!   timeout: a peer that stops reading is closed within it;
//! - the **session loop**, which waits for client input, provider events, the translator's own
//!   events, its deadline and the lifecycle timers, and never waits on the writer: reply audio
//!   that does not fit the writer's queue is dropped and counted; control frames that do not
//!   fit wait in a bounded overflow, and a peer that lets that fill up is closed;
//! - the **provider runner** ([`Runner`]): requests the translator asks for run as tasks whose
//!   events come back into the loop, and all of them are aborted when the session ends;
//! - **timeouts**: initialization, idle, WebSocket ping/pong keepalive (a peer that answers
//!   nothing for two intervals is dead), write;
//! - **close**: a client's close frame is answered with one (tungstenite echoes its code); the
//!   server closes with a meaningful code ([`close_code`]); at shutdown a session stops reading,
//!   lets its reply finish for up to the grace period, and closes with 1001 (or the door's
//!   [`Translator::SHUTDOWN_CLOSE_CODE`]).

use std::borrow::Cow;
use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use tokio::sync::{Notify, mpsc, watch};
use voxgate_engine::{ProviderEvent, ProviderRequest};
use voxgate_providers::Tts;

use crate::metrics::{Direction, Door, Metrics};
use crate::providers::{Arrived, McpTools, Providers, Runner};

pub(crate) mod observe;
pub(crate) mod stream;
mod turn_timer;
use crate::webrtc::{Endpoint, MediaEvent, PeerCommand, PeerHandle, PeerOptions};
use observe::{Identity, Observer};
use tracing::Instrument as _;
use turn_timer::{FirstAudio, Step, Trigger, TurnTimer};

/// WebSocket close codes the doors use (RFC 6455 section 7.4.1).
pub(crate) mod close_code {
    /// The session ended normally (the peer left, an idle timeout, the protocol's goodbye).
    pub(crate) const NORMAL: u16 = 1000;
    /// The server is shutting down.
    pub(crate) const GOING_AWAY: u16 = 1001;
    /// The peer broke the protocol's rules (no initialization in time, a fatal bad message).
    pub(crate) const POLICY: u16 = 1008;
    /// A message over the hard size limit.
    pub(crate) const TOO_BIG: u16 = 1009;
    /// The server failed.
    pub(crate) const INTERNAL: u16 = 1011;
}

/// Client messages waiting for the session loop. Small: a session that falls behind drops
/// audio rather than buffering seconds of it.
const IN_QUEUE: usize = 64;
/// Frames waiting for the writer (about 15 s of 60 ms audio frames).
const OUT_QUEUE: usize = 256;
/// Control frames held while the writer's queue is full; a peer that lets this many pile up
/// is not reading and is closed.
const MAX_OVERFLOW: usize = 1024;
/// Keepalive: a peer silent (no frame, no pong) for this many ping intervals is dead.
const MISSED_PONGS: u32 = 2;
/// How long a closed session waits for the peer to answer its close frame.
const CLOSE_WAIT: Duration = Duration::from_secs(2);
/// ... and for each frame the peer still sends before that answer.
const CLOSE_IDLE: Duration = Duration::from_millis(200);

/// A WebSocket data frame from the client, before the door decodes it.
#[derive(Debug)]
pub(crate) enum ClientFrame {
    /// A text frame.
    Text(Utf8Bytes),
    /// A binary frame.
    Binary(Bytes),
}

/// What the reader does with a decoded client frame.
#[derive(Debug)]
pub(crate) enum Inbound<M> {
    /// Must reach the session: the reader waits for room in the queue.
    Keep(M),
    /// Audio: dropped (and counted) when the session is behind.
    Droppable(M),
}

/// A frame for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ServerFrame {
    /// A text frame.
    Text(String),
    /// A binary frame.
    Binary(Bytes),
}

/// How the driver ends a session it was asked to close.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CloseRequest {
    /// The WebSocket close code ([`close_code`]).
    pub(crate) code: u16,
    /// A short reason for the peer (at most 123 bytes on the wire).
    pub(crate) reason: Cow<'static, str>,
}

/// What a translator asks of the session's WebRTC connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MediaCommand {
    /// Answer an SDP offer; the connection replaces the session's earlier one. The answer (or
    /// the refusal) comes back as [`MediaEvent::Answer`] / [`MediaEvent::Refused`].
    Accept {
        /// The client's SDP offer.
        offer: String,
        /// What the door needs of the connection.
        options: PeerOptions,
    },
    /// A remote ICE candidate (`candidate:...`).
    Candidate(String),
    /// Reply audio (mono `i16` at `rate`), sent at real time on the track.
    Play {
        /// The samples.
        samples: Vec<i16>,
        /// Their rate.
        rate: u32,
    },
    /// Drop the reply audio not yet sent (barge-in).
    Clear,
    /// Hang up the connection.
    Hangup,
}

/// What one translator step asks of the driver, in order.
#[derive(Default)]
pub(crate) struct Out {
    frames: Vec<(ServerFrame, bool)>,
    requests: Vec<ProviderRequest>,
    tts: Option<Arc<dyn Tts>>,
    media: Vec<MediaCommand>,
    close: Option<CloseRequest>,
    /// A user turn's end was decided in this step (the server-added latency starts).
    decided: bool,
}

impl std::fmt::Debug for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Out")
            .field("frames", &self.frames)
            .field("requests", &self.requests.len())
            .field("tts", &self.tts.is_some())
            .field("media", &self.media.len())
            .field("close", &self.close)
            .finish()
    }
}

impl Out {
    /// An empty step.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// A frame that must reach the client (control, text, events).
    pub(crate) fn send(&mut self, frame: ServerFrame) {
        if self.close.is_none() {
            self.frames.push((frame, false));
        }
    }

    /// Reply audio: dropped and counted when the client does not keep up.
    pub(crate) fn send_droppable(&mut self, frame: ServerFrame) {
        if self.close.is_none() {
            self.frames.push((frame, true));
        }
    }

    /// Work for the providers (or the cancellation of some).
    pub(crate) fn provider(&mut self, request: ProviderRequest) {
        self.requests.push(request);
    }

    /// Marks the end of a user turn: the time to the first reply audio frame written
    /// (`send_droppable`, or played on the session's WebRTC track), provider waits excluded,
    /// goes to the server-added histogram.
    pub(crate) fn turn_decided(&mut self) {
        self.decided = true;
    }

    /// Nothing was asked.
    fn is_empty(&self) -> bool {
        self.frames.is_empty()
            && self.requests.is_empty()
            && self.tts.is_none()
            && self.media.is_empty()
            && self.close.is_none()
    }

    /// Work for the session's WebRTC connection.
    pub(crate) fn media(&mut self, command: MediaCommand) {
        if self.close.is_none() {
            self.media.push(command);
        }
    }

    /// The media commands queued so far (tests).
    #[cfg(test)]
    pub(crate) fn take_media(&mut self) -> Vec<MediaCommand> {
        std::mem::take(&mut self.media)
    }

    /// Replaces this session's synthesizer (a client that brings its own voice).
    pub(crate) fn set_tts(&mut self, tts: Arc<dyn Tts>) {
        self.tts = Some(tts);
    }

    /// Ends the session after the frames already queued; later frames are not sent.
    pub(crate) fn close(&mut self, code: u16, reason: impl Into<Cow<'static, str>>) {
        if self.close.is_none() {
            self.close = Some(CloseRequest {
                code,
                reason: reason.into(),
            });
        }
    }

    /// Whether a close was asked for (tests).
    #[cfg(test)]
    pub(crate) fn closing(&self) -> Option<&CloseRequest> {
        self.close.as_ref()
    }

    /// The frames queued so far, and whether each is droppable (tests).
    #[cfg(test)]
    pub(crate) fn frames(&self) -> &[(ServerFrame, bool)] {
        &self.frames
    }

    /// Takes the frames queued so far (tests).
    #[cfg(test)]
    pub(crate) fn take_frames(&mut self) -> Vec<ServerFrame> {
        self.frames.drain(..).map(|(f, _)| f).collect()
    }

    /// Takes the provider requests queued so far (tests).
    #[cfg(test)]
    pub(crate) fn take_requests(&mut self) -> Vec<ProviderRequest> {
        std::mem::take(&mut self.requests)
    }
}

/// One door's protocol logic, without I/O: the driver feeds it and carries out what it asks.
///
/// Every method takes the time as a value, so a translator is tested by calling it with a
/// virtual clock and reading its [`Out`].
pub(crate) trait Translator: Send + 'static {
    /// A decoded client message (or the error to answer a bad one with).
    type In: Send + 'static;
    /// Events from a source the translator owns (a pass-through upstream, a control API).
    type Event: Send + 'static;

    /// Decodes one client frame in the reader task; `max_frame_bytes` is the configured size
    /// limit, beyond which the door answers with its protocol's error.
    fn decode(frame: ClientFrame, max_frame_bytes: usize) -> Inbound<Self::In>;

    /// The close code of a shutdown, once the reply in flight finished or the grace ran out.
    /// 1001 by default; a protocol that treats every code but 1000 as an error (Retell)
    /// overrides it.
    const SHUTDOWN_CLOSE_CODE: u16 = close_code::GOING_AWAY;

    /// The session starts, before any client message: a protocol where the server speaks
    /// first (Retell's config and begin message) sends it here.
    fn on_start(&mut self, _now: Instant, _out: &mut Out) {}

    /// A client message.
    fn on_client(&mut self, now: Instant, msg: Self::In, out: &mut Out);

    /// A provider event for a request this session made.
    fn on_provider(&mut self, now: Instant, event: ProviderEvent, out: &mut Out);

    /// The deadline from [`poll_timeout`](Self::poll_timeout) has come.
    fn on_timeout(&mut self, now: Instant, out: &mut Out);

    /// When [`on_timeout`](Self::on_timeout) is next due.
    fn poll_timeout(&self) -> Option<Instant>;

    /// Whether the client has initialized the session (the initialization timeout stops).
    fn initialized(&self) -> bool;

    /// The initialization timeout ran out; the driver then closes with 1008.
    fn on_init_timeout(&mut self, _now: Instant, _out: &mut Out) {}

    /// The server is shutting down: tell the client if the protocol can.
    fn on_shutdown(&mut self, _now: Instant, _out: &mut Out) {}

    /// Nothing is in flight that a shutdown should let finish (a reply being spoken).
    fn is_idle(&self) -> bool {
        true
    }

    /// The session ends, for any reason: cancel provider work. Frames are not sent any more.
    fn on_close(&mut self, _now: Instant, _out: &mut Out) {}

    /// The conversation engine's speculation counters so far (`None`: no engine yet, or a
    /// door without one); the driver adds what is new to `/metrics` after every step.
    fn speculation_stats(&self) -> Option<voxgate_engine::SpeculationStats> {
        None
    }

    /// The MCP endpoint's tools, at the start of the session and again whenever they change
    /// (servers connecting or leaving): the door hands them to its conversation
    /// (`Input::ServerTools`, kept for an engine made later) so its next generation offers
    /// them; their calls come back as `ProviderRequest::CallTool`, which the runner executes.
    /// Only called when the door's `mcp_tools` is on.
    fn on_server_tools(
        &mut self,
        _now: Instant,
        _tools: Vec<voxgate_engine::ServerToolDefinition>,
        _out: &mut Out,
    ) {
    }

    /// An event of the session's WebRTC connection (or the answer to a
    /// [`MediaCommand::Accept`]). Data channel text does not come here: it is decoded like a
    /// client frame and reaches [`on_client`](Self::on_client).
    fn on_media(&mut self, _now: Instant, _event: MediaEvent, _out: &mut Out) {}

    /// The translator's own event source, if it has one now.
    fn events(&mut self) -> Option<&mut mpsc::Receiver<Self::Event>> {
        None
    }

    /// An event from [`events`](Self::events); `None` when that source closed (the
    /// translator must then stop returning it).
    fn on_event(&mut self, _now: Instant, _event: Option<Self::Event>, _out: &mut Out) {}

    /// Moves the engine's turn events since the last call into `sink` (metrics, traces and
    /// the admin timeline); doors without an engine have none.
    fn take_telemetry(&mut self, _sink: &mut Vec<voxgate_engine::TurnEvent>) {}
}

/// Lifecycle limits of one session. `None` turns a timer off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SessionLimits {
    /// Close (1008) a session not initialized within this.
    pub(crate) init_timeout: Option<Duration>,
    /// Close (1000) a session whose client sent nothing for this long.
    pub(crate) idle_timeout: Option<Duration>,
    /// Send a WebSocket ping this often; a peer silent for two intervals is dead.
    pub(crate) ping_interval: Option<Duration>,
    /// Close a peer that does not take a frame within this.
    pub(crate) write_timeout: Option<Duration>,
    /// At shutdown, how long a session may finish its reply before it is closed with 1001.
    pub(crate) shutdown_grace: Duration,
}

impl Default for SessionLimits {
    fn default() -> Self {
        Self {
            init_timeout: Some(Duration::from_secs(10)),
            idle_timeout: Some(Duration::from_secs(300)),
            ping_interval: Some(Duration::from_secs(20)),
            write_timeout: Some(Duration::from_secs(10)),
            shutdown_grace: Duration::from_secs(5),
        }
    }
}

impl SessionLimits {
    /// The server-wide `[limits]`; a door applies its own overrides on top.
    pub(crate) fn from_config(c: &crate::config::limits::LimitsConfig) -> Self {
        Self {
            init_timeout: c.init_timeout(),
            idle_timeout: c.idle_timeout(),
            ping_interval: c.ping_interval(),
            write_timeout: c.write_timeout(),
            shutdown_grace: c.shutdown_grace(),
        }
    }
}

/// Sessions open across every door, so a shutdown can wait for them to close.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    open: AtomicUsize,
    closed: Notify,
    /// What `GET /admin/sessions` lists.
    pub(crate) registry: Arc<observe::Registry>,
}

impl Sessions {
    /// Sessions open now.
    pub(crate) fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// Waits until no session is open.
    pub(crate) async fn wait_closed(&self) {
        loop {
            let notified = self.closed.notified();
            if self.open() == 0 {
                return;
            }
            notified.await;
        }
    }

    fn enter(self: &Arc<Self>) -> SessionTicket {
        self.open.fetch_add(1, Ordering::AcqRel);
        SessionTicket(Arc::clone(self))
    }
}

struct SessionTicket(Arc<Sessions>);

impl Drop for SessionTicket {
    fn drop(&mut self) {
        if self.0.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.closed.notify_waiters();
        }
    }
}

/// What the driver needs from the server for one session.
#[derive(Debug, Clone)]
pub(crate) struct DriverContext {
    pub(crate) door: Door,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) providers: Providers,
    pub(crate) limits: SessionLimits,
    pub(crate) max_frame_bytes: usize,
    pub(crate) shutdown: watch::Receiver<bool>,
    pub(crate) sessions: Arc<Sessions>,
    /// The MCP endpoint's tools, when the door offers them (its `mcp_tools`).
    pub(crate) mcp: Option<McpTools>,
    /// The WebRTC endpoint, for doors that carry audio over WebRTC.
    pub(crate) webrtc: Option<Arc<Endpoint>>,
    /// Who the session is, for its logs, spans and admin entry (the door fills it in).
    pub(crate) identity: Identity,
}

/// What the reader passes to the session loop.
enum FromReader<M> {
    Message(M),
    /// The peer sent a close frame (tungstenite has queued the answer).
    Closed,
    /// A message over the hard limit: the connection cannot go on.
    TooBig,
}

/// What the writer sends.
enum ToWriter {
    /// A frame, and the timing of a turn when it is the turn's first reply audio.
    Frame(Message, Option<FirstAudio>),
    Close(CloseRequest),
}

/// Why a session ended, for logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    PeerClosed,
    PeerGone,
    Requested,
    DeadPeer,
    SlowReader,
    Shutdown,
}

impl End {
    /// The `reason` of the `session closed` line.
    fn label(self) -> &'static str {
        match self {
            Self::PeerClosed => "peer_closed",
            Self::PeerGone => "peer_gone",
            Self::Requested => "closed_by_server",
            Self::DeadPeer => "dead_peer",
            Self::SlowReader => "slow_reader",
            Self::Shutdown => "shutdown",
        }
    }
}

/// What woke the session loop.
enum Wake<M, E> {
    Client(Option<FromReader<M>>),
    Provider(Arrived),
    Event(Option<E>),
    Room(mpsc::OwnedPermit<ToWriter>),
    Media(Option<MediaEvent>),
    Timer,
    /// The MCP endpoint's tools changed.
    Tools,
    Shutdown,
    WriterGone,
}

async fn recv_opt<T>(rx: Option<&mut mpsc::Receiver<T>>) -> Option<T> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

async fn recv_peer(peer: Option<&mut PeerHandle>) -> Option<MediaEvent> {
    match peer {
        Some(p) => p.recv().await,
        None => std::future::pending().await,
    }
}

async fn changed_opt(rx: Option<&mut watch::Receiver<u64>>) -> bool {
    match rx {
        Some(rx) => rx.changed().await.is_ok(),
        None => std::future::pending().await,
    }
}

fn to_message(frame: ServerFrame) -> Message {
    match frame {
        ServerFrame::Text(t) => Message::Text(t.into()),
        ServerFrame::Binary(b) => Message::Binary(b),
    }
}

/// Whether a read error is tungstenite refusing a message over the hard limit.
fn is_capacity_error(e: axum::Error) -> bool {
    e.into_inner()
        .downcast_ref::<tokio_tungstenite::tungstenite::Error>()
        .is_some_and(|e| matches!(e, tokio_tungstenite::tungstenite::Error::Capacity(_)))
}

/// Runs one session over an upgraded socket until it ends, then closes the socket.
pub(crate) async fn run<T: Translator>(socket: WebSocket, translator: T, cx: DriverContext) {
    let _ticket = cx.sessions.enter();
    let _active = cx.metrics.session(cx.door);
    let door = cx.door;
    let start = Instant::now();
    let (sink, stream) = socket.split();
    let (in_tx, in_rx) = mpsc::channel::<FromReader<T::In>>(IN_QUEUE);
    let (out_tx, out_rx) = mpsc::channel::<ToWriter>(OUT_QUEUE);
    // Milliseconds after `start` of the last frame of any kind (pongs too): keepalive.
    let last_seen = Arc::new(AtomicU64::new(0));

    let reader = tokio::spawn(read::<T>(
        stream,
        in_tx,
        Arc::clone(&last_seen),
        start,
        cx.max_frame_bytes,
        Arc::clone(&cx.metrics),
        door,
    ));
    let writer = tokio::spawn(write(
        WsOutlet(sink),
        out_rx,
        cx.limits.write_timeout,
        Arc::clone(&cx.metrics),
        door,
    ));
    let end = drive(translator, &cx, in_rx, out_tx, None, start, last_seen).await;
    // The writer ends by itself: its queue is closed and every write is bounded.
    let _ = writer.await;
    // After our close frame the reader reads on until the peer answers it: a socket dropped
    // with unread input is reset, and the peer may lose the close frame (and frames before it).
    let mut reader = reader;
    if matches!(end, End::Requested | End::Shutdown) {
        let _ = tokio::time::timeout(CLOSE_WAIT, &mut reader).await;
    }
    reader.abort();
}

/// Runs one session whose transport is a WebRTC connection's data channel (the VIP door):
/// data channel text is decoded like WebSocket text frames and text frames go out on the
/// channel; the connection's audio and state reach the translator as media events. The
/// session ends when the connection does (the translator closes on
/// [`MediaEvent::Closed`]) or as any other session.
pub(crate) async fn run_peer<T: Translator>(peer: PeerHandle, translator: T, cx: DriverContext) {
    let _ticket = cx.sessions.enter();
    let _active = cx.metrics.session(cx.door);
    let start = Instant::now();
    // No socket to read: the sender stays here so the session never sees its input end.
    let (_in_tx, in_rx) = mpsc::channel::<FromReader<T::In>>(1);
    let (out_tx, out_rx) = mpsc::channel::<ToWriter>(OUT_QUEUE);
    let writer = tokio::spawn(write_peer(peer.commands(), out_rx, cx.limits.write_timeout));
    let last_seen = Arc::new(AtomicU64::new(0));
    drive(translator, &cx, in_rx, out_tx, Some(peer), start, last_seen).await;
    let _ = writer.await;
}

/// Sends text frames on a connection's data channel; a close hangs up.
async fn write_peer(
    commands: mpsc::Sender<PeerCommand>,
    mut rx: mpsc::Receiver<ToWriter>,
    timeout: Option<Duration>,
) {
    let bounded = timeout.unwrap_or(Duration::from_secs(3600));
    while let Some(item) = rx.recv().await {
        let command = match item {
            ToWriter::Frame(Message::Text(t), _) => PeerCommand::Data(t.to_string()),
            ToWriter::Frame(..) => continue,
            ToWriter::Close(_) => PeerCommand::Close,
        };
        let close = matches!(command, PeerCommand::Close);
        match tokio::time::timeout(bounded, commands.send(command)).await {
            Ok(Ok(())) if !close => {}
            _ => return,
        }
    }
    let _ = commands.send(PeerCommand::Close).await;
}

/// The session loop of one session, whatever its transport; returns why it ended.
async fn drive<T: Translator>(
    translator: T,
    cx: &DriverContext,
    in_rx: mpsc::Receiver<FromReader<T::In>>,
    out_tx: mpsc::Sender<ToWriter>,
    peer: Option<PeerHandle>,
    start: Instant,
    last_seen: Arc<AtomicU64>,
) -> End {
    let door = cx.door;
    let observer = Observer::open(
        door,
        cx.identity.clone(),
        Arc::clone(&cx.metrics),
        Arc::clone(&cx.sessions.registry),
    );
    let span = observer.span().clone();
    // Made in the session's span: a stateful brain (an ACP agent) keeps the span current at
    // its creation for its own tasks, so its lines name the session.
    let (mut runner, provider_rx) =
        span.in_scope(|| Runner::new(cx.providers.clone(), Arc::clone(&cx.metrics), door));
    runner.set_mcp(cx.mcp.clone());
    let mut session = Loop {
        peer,
        endpoint: cx.webrtc.clone(),
        max_frame_bytes: cx.max_frame_bytes,
        speculation: voxgate_engine::SpeculationStats::default(),
        tools: cx
            .mcp
            .as_ref()
            .map(|m| (Arc::clone(&m.hub), m.hub.subscribe(), m.scope.clone())),
        t: translator,
        runner,
        out: out_tx,
        overflow: VecDeque::new(),
        metrics: Arc::clone(&cx.metrics),
        door,
        limits: cx.limits.clone(),
        start,
        last_seen,
        last_message: start,
        next_ping: cx.limits.ping_interval.map(|i| start + i),
        turn: TurnTimer::default(),
        first_audio: None,
        draining: None,
        obs: observer,
    };
    async move {
        let end = session.run(in_rx, provider_rx, cx.shutdown.clone()).await;
        session.finish(end).await;
        session.obs.close(end.label());
        end
    }
    .instrument(span)
    .await
}

/// Reads and discards what the peer still sends until it answers our close frame; the
/// session no longer takes input. A peer quiet for [`CLOSE_IDLE`] has nothing unread left to
/// reset the connection with, so it is not waited for.
async fn discard_until_close(mut stream: futures::stream::SplitStream<WebSocket>) {
    while let Ok(Some(Ok(m))) = tokio::time::timeout(CLOSE_IDLE, stream.next()).await {
        if matches!(m, Message::Close(_)) {
            return;
        }
    }
}

async fn read<T: Translator>(
    mut stream: futures::stream::SplitStream<WebSocket>,
    tx: mpsc::Sender<FromReader<T::In>>,
    last_seen: Arc<AtomicU64>,
    start: Instant,
    max: usize,
    metrics: Arc<Metrics>,
    door: Door,
) {
    loop {
        let next = tokio::select! {
            m = stream.next() => m,
            () = tx.closed() => return discard_until_close(stream).await,
        };
        let msg = match next {
            None => break,
            Some(Err(e)) => {
                if is_capacity_error(e) {
                    let _ = tx.send(FromReader::TooBig).await;
                }
                break;
            }
            Some(Ok(m)) => m,
        };
        let millis = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
        last_seen.store(millis, Ordering::Relaxed);
        let frame = match msg {
            Message::Text(t) => ClientFrame::Text(t),
            Message::Binary(b) => ClientFrame::Binary(b),
            Message::Close(_) => {
                let _ = tx.send(FromReader::Closed).await;
                break;
            }
            Message::Ping(_) | Message::Pong(_) => continue,
        };
        if !deliver::<T>(&tx, frame, max, &metrics, door).await {
            return discard_until_close(stream).await;
        }
    }
}

/// Decodes one client frame and queues it for the session loop: a message that must arrive
/// waits for room (pushing back on the peer), audio is dropped and counted when the session is
/// behind. False once the session no longer reads.
async fn deliver<T: Translator>(
    tx: &mpsc::Sender<FromReader<T::In>>,
    frame: ClientFrame,
    max: usize,
    metrics: &Metrics,
    door: Door,
) -> bool {
    match T::decode(frame, max) {
        Inbound::Keep(m) => tx.send(FromReader::Message(m)).await.is_ok(),
        Inbound::Droppable(m) => match tx.try_send(FromReader::Message(m)) {
            Err(mpsc::error::TrySendError::Full(_)) => {
                metrics.dropped(door, Direction::Uplink, 1);
                true
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
            Ok(()) => true,
        },
    }
}

/// Where the writer puts the session's frames: a WebSocket, or a message stream (gRPC).
trait Outlet: Send + 'static {
    /// Sends one frame; false when the peer is gone.
    fn send(&mut self, msg: Message) -> impl Future<Output = bool> + Send;
    /// Ends the session with the server's close.
    fn close(&mut self, close: CloseRequest) -> impl Future<Output = ()> + Send;
    /// Ends the transport once the session ended without a close of the server's (the peer
    /// left, or the writer's queue closed).
    fn finish(&mut self) -> impl Future<Output = ()> + Send;
}

/// A WebSocket's sending half.
struct WsOutlet(futures::stream::SplitSink<WebSocket, Message>);

impl Outlet for WsOutlet {
    async fn send(&mut self, msg: Message) -> bool {
        self.0.send(msg).await.is_ok()
    }

    async fn close(&mut self, c: CloseRequest) {
        let frame = CloseFrame {
            code: c.code,
            reason: truncate_reason(&c.reason).into(),
        };
        let _ = self.0.send(Message::Close(Some(frame))).await;
    }

    async fn finish(&mut self) {
        // Sends the answer to the peer's close frame, which tungstenite queued.
        let _ = self.0.close().await;
    }
}

/// Sends frames until the queue closes or a write fails or times out; then ends the transport
/// (a close of our own, or on a WebSocket the answer to the peer's, which tungstenite queued).
async fn write<O: Outlet>(
    mut outlet: O,
    mut rx: mpsc::Receiver<ToWriter>,
    timeout: Option<Duration>,
    metrics: Arc<Metrics>,
    door: Door,
) {
    let bounded = timeout.unwrap_or(Duration::from_secs(3600));
    while let Some(item) = rx.recv().await {
        let (msg, first) = match item {
            ToWriter::Frame(m, first) => (m, first),
            ToWriter::Close(c) => {
                let _ = tokio::time::timeout(bounded, outlet.close(c)).await;
                return;
            }
        };
        match tokio::time::timeout(bounded, outlet.send(msg)).await {
            Ok(true) => {
                if let Some(first) = first {
                    metrics.server_added(door, first.server_added(Instant::now()));
                }
            }
            // The send failed: after the peer's close frame tungstenite refuses data frames
            // but still owes the peer the answer it queued, which finishing flushes (a peer
            // that is gone fails it at once).
            Ok(false) => break,
            // The peer does not read: nothing more can be sent.
            Err(_) => return,
        }
    }
    let _ = tokio::time::timeout(bounded, outlet.finish()).await;
}

/// A close reason fits a control frame: 123 bytes, cut at a character boundary.
fn truncate_reason(reason: &str) -> String {
    let mut end = reason.len().min(123);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    reason[..end].to_owned()
}

struct Loop<T: Translator> {
    t: T,
    /// The session's WebRTC connection, once it has one.
    peer: Option<PeerHandle>,
    endpoint: Option<Arc<Endpoint>>,
    max_frame_bytes: usize,
    runner: Runner,
    out: mpsc::Sender<ToWriter>,
    /// Control frames waiting for room in the writer's queue.
    overflow: VecDeque<ToWriter>,
    metrics: Arc<Metrics>,
    door: Door,
    limits: SessionLimits,
    start: Instant,
    last_seen: Arc<AtomicU64>,
    /// When the client last sent a data message (idle timeout).
    last_message: Instant,
    next_ping: Option<Instant>,
    /// The turn between its decision and its first reply audio frame.
    turn: TurnTimer,
    /// The timing the next reply audio frame queued carries.
    first_audio: Option<FirstAudio>,
    /// Shutting down: the deadline by which the session closes with 1001.
    draining: Option<Instant>,
    /// The translator's speculation counters as last added to the metrics.
    speculation: voxgate_engine::SpeculationStats,
    /// The session's span, lines, turn figures and admin entry.
    obs: Observer,
    /// The MCP hub whose tools the door offers, its change notices and the scope.
    tools: Option<(
        Arc<crate::mcp_endpoint::hub::McpHub>,
        watch::Receiver<u64>,
        crate::mcp_endpoint::hub::Scope,
    )>,
}

impl<T: Translator> Loop<T> {
    async fn run(
        &mut self,
        mut in_rx: mpsc::Receiver<FromReader<T::In>>,
        mut provider_rx: mpsc::Receiver<Arrived>,
        mut shutdown: watch::Receiver<bool>,
    ) -> End {
        if *shutdown.borrow() {
            return End::Shutdown;
        }
        let mut out = Out::new();
        self.t.on_start(Instant::now(), &mut out);
        if let Some((hub, changes, scope)) = &mut self.tools {
            changes.mark_unchanged();
            let tools = hub.server_tools(scope);
            self.t.on_server_tools(Instant::now(), tools, &mut out);
        }
        if let Some(end) = self.apply(out) {
            return end;
        }
        loop {
            let deadline = self.deadline();
            let wake = {
                let room = !self.overflow.is_empty();
                let out = self.out.clone();
                let events = self.t.events();
                let reading = self.draining.is_none();
                let changes = self.tools.as_mut().map(|(_, c, _)| c);
                let changes_open = changes.is_some();
                let peer = self.peer.as_mut();
                tokio::select! {
                    m = in_rx.recv(), if reading => Wake::Client(m),
                    Some(p) = provider_rx.recv() => Wake::Provider(p),
                    e = recv_opt(events) => Wake::Event(e),
                    m = recv_peer(peer) => Wake::Media(m),
                    p = out.clone().reserve_owned(), if room => match p {
                        Ok(p) => Wake::Room(p),
                        Err(_) => Wake::WriterGone,
                    },
                    () = tokio::time::sleep_until(tokio::time::Instant::from_std(deadline)) => Wake::Timer,
                    // The session holds the hub, so its change sender outlives this loop.
                    alive = changed_opt(changes), if changes_open => if alive { Wake::Tools } else { Wake::Timer },
                    _ = shutdown.changed(), if reading => Wake::Shutdown,
                    () = out.closed() => Wake::WriterGone,
                }
            };
            let now = Instant::now();
            let mut out = Out::new();
            let mut trigger = Trigger {
                at: now,
                answer_to: None,
            };
            match wake {
                Wake::Client(None) => return End::PeerGone,
                Wake::Client(Some(FromReader::Closed)) => return End::PeerClosed,
                Wake::Client(Some(FromReader::TooBig)) => {
                    self.metrics.error(self.door);
                    out.close(close_code::TOO_BIG, "message too big");
                }
                Wake::Client(Some(FromReader::Message(m))) => {
                    self.last_message = now;
                    self.t.on_client(now, m, &mut out);
                }
                Wake::Provider(Arrived { event, at }) => {
                    trigger = Trigger {
                        at,
                        answer_to: Some(event.id()),
                    };
                    self.runner.finished(&event);
                    self.obs.provider_event(&event, at);
                    self.t.on_provider(now, event, &mut out);
                }
                Wake::Event(e) => self.t.on_event(now, e, &mut out),
                Wake::Media(m) => self.media_event(now, m, &mut out),
                Wake::Room(permit) => {
                    if let Some(item) = self.overflow.pop_front() {
                        permit.send(item);
                    }
                    self.pump_overflow();
                }
                Wake::Timer => {
                    trigger.at = deadline.min(now);
                    if let Some(end) = self.timers(now, &mut out) {
                        return end;
                    }
                }
                Wake::Tools => {
                    if let Some((hub, changes, scope)) = &mut self.tools {
                        changes.mark_unchanged();
                        let tools = hub.server_tools(scope);
                        self.t.on_server_tools(now, tools, &mut out);
                    }
                }
                Wake::Shutdown => {
                    self.t.on_shutdown(now, &mut out);
                    self.draining = Some(now + self.limits.shutdown_grace);
                }
                Wake::WriterGone => return End::SlowReader,
            }
            let step = Step {
                decided: out.decided,
                requests: &out.requests,
                audio_frames: out
                    .frames
                    .iter()
                    .filter(|(_, droppable)| *droppable)
                    .count()
                    + out
                        .media
                        .iter()
                        .filter(|m| matches!(m, MediaCommand::Play { .. }))
                        .count(),
            };
            if let Some(first) = self.turn.step(trigger, now, &step) {
                self.first_audio = Some(first);
            }
            if let Some(end) = self.apply(out) {
                return end;
            }
            if self.draining.is_some() && self.t.is_idle() && self.overflow.is_empty() {
                return End::Shutdown;
            }
            if self.deadline() <= Instant::now() {
                // More work is due at once (a translator spreading a long job over steps):
                // let the writer, which this step may have woken, send what is queued first.
                tokio::task::yield_now().await;
            }
        }
    }

    /// The earliest instant something is due: the translator, a lifecycle timer or the drain.
    fn deadline(&self) -> Instant {
        let mut d = self.t.poll_timeout();
        let mut at = |t: Option<Instant>| {
            if let Some(t) = t {
                d = Some(d.map_or(t, |d| d.min(t)));
            }
        };
        if !self.t.initialized() {
            at(self.limits.init_timeout.map(|i| self.start + i));
        }
        at(self.limits.idle_timeout.map(|i| self.last_message + i));
        at(self.next_ping);
        at(self.draining);
        // Nothing due: wake up now and then anyway, which costs nothing measurable.
        d.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600))
    }

    fn timers(&mut self, now: Instant, out: &mut Out) -> Option<End> {
        if self.draining.is_some_and(|d| now >= d) {
            return Some(End::Shutdown);
        }
        if !self.t.initialized()
            && let Some(init) = self.limits.init_timeout
            && now >= self.start + init
        {
            self.metrics.error(self.door);
            self.t.on_init_timeout(now, out);
            out.close(
                close_code::POLICY,
                format!(
                    "session not initialized within {} s",
                    init.as_secs_f64().ceil()
                ),
            );
            return None;
        }
        if let Some(idle) = self.limits.idle_timeout
            && now >= self.last_message + idle
        {
            out.close(close_code::NORMAL, "idle timeout");
            return None;
        }
        if let (Some(interval), Some(due)) = (self.limits.ping_interval, self.next_ping)
            && now >= due
        {
            let seen = self.start + Duration::from_millis(self.last_seen.load(Ordering::Relaxed));
            if now.saturating_duration_since(seen) > interval * MISSED_PONGS {
                return Some(End::DeadPeer);
            }
            self.queue(ToWriter::Frame(Message::Ping(Bytes::new()), None), false);
            self.next_ping = Some(now + interval);
        }
        if self.t.poll_timeout().is_some_and(|t| t <= now) {
            self.t.on_timeout(now, out);
        }
        None
    }

    /// Adds the speculation the translator counted since the last report to the metrics (a
    /// new engine, after an `UPDATE_CONFIG` for instance, counts from zero again).
    fn report_speculation(&mut self) {
        let Some(now) = self.t.speculation_stats() else {
            return;
        };
        if now == self.speculation {
            return;
        }
        let last = if now.started < self.speculation.started {
            voxgate_engine::SpeculationStats::default()
        } else {
            self.speculation
        };
        let mut new = now;
        new.started -= last.started;
        new.adopted = new.adopted.saturating_sub(last.adopted);
        new.discarded = new.discarded.saturating_sub(last.discarded);
        new.requests = new.requests.saturating_sub(last.requests);
        new.requests_adopted = new.requests_adopted.saturating_sub(last.requests_adopted);
        new.requests_cancelled = new
            .requests_cancelled
            .saturating_sub(last.requests_cancelled);
        self.metrics.speculation(self.door, &new);
        self.speculation = now;
    }

    /// Carries out one step's output; `Some` when the session must end.
    fn apply(&mut self, out: Out) -> Option<End> {
        self.report_speculation();
        self.t.take_telemetry(self.obs.events());
        self.obs.take_events();
        let Out {
            frames,
            requests,
            tts,
            media,
            close,
            decided: _,
        } = out;
        let mut answers = Out::new();
        for command in media {
            self.media_command(command, &mut answers);
        }
        if let Some(tts) = tts {
            self.runner.set_tts(tts);
        }
        let now = Instant::now();
        for r in requests {
            let span = self.obs.request(&r, now);
            self.runner.start_in(r, span);
        }
        for (frame, droppable) in frames {
            let first = if droppable {
                self.first_audio.take()
            } else {
                None
            };
            self.queue(ToWriter::Frame(to_message(frame), first), droppable);
        }
        if self.overflow.len() > MAX_OVERFLOW {
            return Some(End::SlowReader);
        }
        if let Some(c) = close {
            self.overflow.push_back(ToWriter::Close(c));
            return Some(End::Requested);
        }
        if answers.is_empty() {
            None
        } else {
            // What the translator said to an answered (or refused) offer.
            self.apply(answers)
        }
    }

    /// Carries out one media command; the answer to an offer goes to the translator, and what
    /// it says in return into `out`.
    fn media_command(&mut self, command: MediaCommand, out: &mut Out) {
        let now = Instant::now();
        match command {
            MediaCommand::Accept { offer, options } => {
                let Some(endpoint) = self.endpoint.clone() else {
                    let reason = "WebRTC is not enabled on this server".to_owned();
                    self.t.on_media(now, MediaEvent::Refused(reason), out);
                    return;
                };
                match endpoint.accept(&offer, options) {
                    Ok(accepted) => {
                        self.peer = Some(accepted.peer);
                        let event = MediaEvent::Answer {
                            sdp: accepted.answer,
                            candidates: accepted.candidates,
                        };
                        self.t.on_media(now, event, out);
                    }
                    Err(e) => self
                        .t
                        .on_media(now, MediaEvent::Refused(e.to_string()), out),
                }
            }
            MediaCommand::Candidate(c) => {
                if let Some(p) = &self.peer {
                    p.command(PeerCommand::RemoteCandidate(c));
                }
            }
            MediaCommand::Play { samples, rate } => {
                if let Some(p) = &mut self.peer {
                    let dropped = p.play(&samples, rate);
                    // A turn's first reply audio handed to the WebRTC sender, which paces it
                    // out: the WebSocket writer's write for the doors that play on a track.
                    if let Some(first) = self.first_audio.take() {
                        let added = first.server_added(Instant::now());
                        self.metrics.server_added(self.door, added);
                    }
                    if dropped > 0 {
                        self.metrics.dropped(self.door, Direction::Downlink, 1);
                    }
                }
            }
            MediaCommand::Clear => {
                if let Some(p) = &mut self.peer {
                    p.clear();
                }
            }
            MediaCommand::Hangup => self.peer = None,
        }
    }

    /// An event of the session's connection: data channel text is a client message, the rest
    /// goes to the translator.
    fn media_event(&mut self, now: Instant, event: Option<MediaEvent>, out: &mut Out) {
        let event = match event {
            Some(e) => e,
            // The connection's task ended without a word (it always sends `Closed` first
            // unless its queue was full).
            None => {
                self.peer = None;
                MediaEvent::Closed("the connection ended".into())
            }
        };
        match event {
            MediaEvent::Data(text) => {
                self.last_message = now;
                match T::decode(ClientFrame::Text(text.into()), self.max_frame_bytes) {
                    Inbound::Keep(m) | Inbound::Droppable(m) => self.t.on_client(now, m, out),
                }
            }
            MediaEvent::Closed(reason) => {
                self.peer = None;
                self.t.on_media(now, MediaEvent::Closed(reason), out);
            }
            e @ MediaEvent::Audio(_) => {
                self.last_message = now;
                self.t.on_media(now, e, out);
            }
            e => self.t.on_media(now, e, out),
        }
    }

    /// Moves held control frames to the writer while it has room.
    fn pump_overflow(&mut self) {
        while let Some(item) = self.overflow.pop_front() {
            match self.out.try_send(item) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(item)) => {
                    self.overflow.push_front(item);
                    return;
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    self.overflow.clear();
                    return;
                }
            }
        }
    }

    fn queue(&mut self, item: ToWriter, droppable: bool) {
        if !self.overflow.is_empty() {
            if droppable {
                self.metrics.dropped(self.door, Direction::Downlink, 1);
            } else {
                self.overflow.push_back(item);
            }
            return;
        }
        match self.out.try_send(item) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(item)) => {
                if droppable {
                    self.metrics.dropped(self.door, Direction::Downlink, 1);
                } else {
                    self.overflow.push_back(item);
                }
            }
            // The writer is gone; the loop notices on its next turn.
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    /// Ends the session: provider work is cancelled, and what is still owed to a live peer
    /// (queued control frames, the close frame) is handed to the writer within the write
    /// timeout.
    async fn finish(&mut self, end: End) {
        let now = Instant::now();
        let mut out = Out::new();
        self.t.on_close(now, &mut out);
        self.report_speculation();
        self.t.take_telemetry(self.obs.events());
        self.obs.take_events();
        for r in out.requests.drain(..) {
            let span = self.obs.request(&r, now);
            self.runner.start_in(r, span);
        }
        match end {
            End::Shutdown => self.overflow.push_back(ToWriter::Close(CloseRequest {
                code: T::SHUTDOWN_CLOSE_CODE,
                reason: "server shutting down".into(),
            })),
            // A dead or non-reading peer is not waited for.
            End::DeadPeer | End::SlowReader | End::PeerGone => {
                self.overflow.clear();
                return;
            }
            End::PeerClosed | End::Requested => {}
        }
        let limit = self.limits.write_timeout.unwrap_or(Duration::from_secs(10));
        let out = self.out.clone();
        let overflow = std::mem::take(&mut self.overflow);
        let _ = tokio::time::timeout(limit, async move {
            for item in overflow {
                if out.send(item).await.is_err() {
                    return;
                }
            }
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_drops_frames_after_close() {
        let mut out = Out::new();
        out.send(ServerFrame::Text("a".into()));
        out.send_droppable(ServerFrame::Binary(Bytes::from_static(b"x")));
        out.close(close_code::POLICY, "bad");
        out.send(ServerFrame::Text("b".into()));
        out.close(close_code::NORMAL, "ignored");
        assert_eq!(
            out.frames(),
            &[
                (ServerFrame::Text("a".into()), false),
                (ServerFrame::Binary(Bytes::from_static(b"x")), true)
            ]
        );
        assert_eq!(out.closing().map(|c| c.code), Some(close_code::POLICY));
    }

    #[test]
    fn close_reasons_fit_a_control_frame() {
        let long = "é".repeat(100);
        let r = truncate_reason(&long);
        assert!(r.len() <= 123);
        assert!(long.starts_with(&r));
        assert_eq!(truncate_reason("short"), "short");
    }

    #[tokio::test]
    async fn sessions_wait_for_the_last_close() {
        let s = Arc::new(Sessions::default());
        let a = s.enter();
        let b = s.enter();
        assert_eq!(s.open(), 2);
        let waiter = tokio::spawn({
            let s = Arc::clone(&s);
            async move { s.wait_closed().await }
        });
        drop(a);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(b);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(s.open(), 0);
    }
}
