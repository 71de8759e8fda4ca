//! The client: a connection task that owns the transport, and the handles that talk to it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use voxgate_realtime::proto::client_bound_message::Payload;
use voxgate_realtime::proto::{
    ChatMessage, InferenceTriggerMode, SessionErrorCategory, ToolDefinition,
};
use voxgate_realtime::{
    ClientBoundMessage, Open, ServiceBoundMessage, SessionConfig, SessionUpdate,
};

use crate::error::{ClientError, Loss};
use crate::event::{Event, SessionError, event_of};
use crate::link::Link;
use crate::options::ClientOptions;

/// Commands waiting for the connection task; senders wait when it is full (back-pressure).
const COMMAND_QUEUE: usize = 256;
/// Events waiting for the application; the connection stops reading when it is full.
const EVENT_QUEUE: usize = 1024;
/// The start of the server's error message for a failed `ConversationQuery` (voxgate servers).
const QUERY_FAILED: &str = "conversation query failed";

/// A realtime session with a server.
///
/// [`connect`](Self::connect) opens the connection, initializes the session and waits for
/// `SessionReady`. The methods of [`Handle`] (reached through this type, or a cloned
/// [`handle`](Self::handle) for another task) send; [`next_event`](Self::next_event) receives.
/// A lost connection is reconnected as [`Reconnect`](crate::Reconnect) says, with the same
/// configuration and tools; [`Event::Reconnecting`] and [`Event::Reconnected`] tell. Dropping
/// the client closes the session.
#[derive(Debug)]
pub struct RealtimeClient {
    handle: Handle,
    events: mpsc::Receiver<Event>,
    close: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

/// The sending side of a session; cheap to clone.
#[derive(Debug, Clone)]
pub struct Handle {
    commands: mpsc::Sender<Command>,
    packet_id: Arc<AtomicU64>,
    request_timeout: Duration,
    end: Arc<Mutex<Option<String>>>,
}

#[derive(Debug)]
enum Command {
    Send(ServiceBoundMessage),
    Query(
        ServiceBoundMessage,
        oneshot::Sender<Result<String, ClientError>>,
    ),
    Export(
        ServiceBoundMessage,
        oneshot::Sender<Result<Vec<ChatMessage>, ClientError>>,
    ),
    Ping(oneshot::Sender<Result<(), ClientError>>),
    Tools(Vec<ToolDefinition>),
    Reconfigure(SessionUpdate),
}

impl RealtimeClient {
    /// Connects, initializes the session with `config` and waits for `SessionReady`.
    ///
    /// # Errors
    /// [`ClientError::Connect`], [`ClientError::Unauthorized`] or [`ClientError::Refused`]
    /// when the connection cannot be had, [`ClientError::Initialize`] when the server rejects
    /// the configuration, [`ClientError::Timeout`] without `SessionReady` in time, and
    /// [`ClientError::Usage`] for a configuration that cannot be encoded.
    pub async fn connect(
        options: ClientOptions,
        config: SessionConfig,
    ) -> Result<Self, ClientError> {
        Self::connect_with_tools(options, config, Vec::new()).await
    }

    /// [`connect`](Self::connect), declaring the client's tools right after the
    /// initialization (as the published clients do).
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    pub async fn connect_with_tools(
        options: ClientOptions,
        config: SessionConfig,
        tools: Vec<ToolDefinition>,
    ) -> Result<Self, ClientError> {
        // Checked before any connection: a configuration that cannot be encoded fails here.
        ServiceBoundMessage::initialize(&config)?;
        let mut link = Link::open(&options).await?;
        handshake(&mut link, &config, &tools, options.ready_timeout).await?;
        let (commands, command_rx) = mpsc::channel(COMMAND_QUEUE);
        let (events, event_rx) = mpsc::channel(EVENT_QUEUE);
        let (close, close_rx) = oneshot::channel();
        let end = Arc::new(Mutex::new(None));
        let handle = Handle {
            commands,
            packet_id: Arc::new(AtomicU64::new(1)),
            request_timeout: options.request_timeout,
            end: Arc::clone(&end),
        };
        let conn = Connection {
            options,
            config,
            tools,
            events,
            queries: VecDeque::new(),
            exports: VecDeque::new(),
            pings: VecDeque::new(),
        };
        let task = tokio::spawn(async move {
            let reason = conn.run(link, command_rx, close_rx).await;
            if let Ok(mut end) = end.lock() {
                *end = reason;
            }
        });
        Ok(Self {
            handle,
            events: event_rx,
            close: Some(close),
            task: Some(task),
        })
    }

    /// The next event; `None` once the session is over (see [`Handle::end_reason`]).
    pub async fn next_event(&mut self) -> Option<Event> {
        self.events.recv().await
    }

    /// The next event if one is already queued, without waiting. Events the server sent
    /// before an answer (a query's, an export's) are queued by the time the answer is
    /// returned, so this drains them in order.
    pub fn try_next_event(&mut self) -> Option<Event> {
        self.events.try_recv().ok()
    }

    /// A sending handle for another task.
    #[must_use]
    pub fn handle(&self) -> Handle {
        self.handle.clone()
    }

    /// Ends the session: a WebSocket close (1000) or the end of the gRPC request stream, then
    /// waits (at most 2 s) for the server to finish.
    pub async fn close(mut self) {
        if let Some(close) = self.close.take() {
            let _ = close.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl std::ops::Deref for RealtimeClient {
    type Target = Handle;

    fn deref(&self) -> &Handle {
        &self.handle
    }
}

impl Drop for RealtimeClient {
    fn drop(&mut self) {
        // The task sees the close sender go and closes the connection.
        if let Some(close) = self.close.take() {
            let _ = close.send(());
        }
    }
}

impl Handle {
    /// Sends a text turn as `UserInput`.
    ///
    /// # Errors
    /// [`ClientError::Closed`] once the session is over.
    pub async fn send_text(
        &self,
        text: impl Into<String>,
        mode: InferenceTriggerMode,
    ) -> Result<(), ClientError> {
        let id = self.next_packet_id();
        self.send(ServiceBoundMessage::user_text(id, mode, text))
            .await
    }

    /// Sends audio in the session's input format as `UserInput` (packet ids count up).
    ///
    /// # Errors
    /// [`ClientError::Closed`] once the session is over.
    pub async fn send_audio(
        &self,
        audio: Bytes,
        mode: InferenceTriggerMode,
    ) -> Result<(), ClientError> {
        let id = self.next_packet_id();
        self.send(ServiceBoundMessage::user_audio(id, mode, audio))
            .await
    }

    /// Answers a [`ToolCall`](crate::ToolCall).
    ///
    /// # Errors
    /// [`ClientError::Closed`] once the session is over.
    pub async fn tool_result(
        &self,
        id: impl Into<String>,
        result: impl Into<String>,
    ) -> Result<(), ClientError> {
        self.send(ServiceBoundMessage::tool_call_response(id, result))
            .await
    }

    /// Speaks `text` now (cancelling any inference); `include_in_history: false` keeps it out
    /// of the model's context, `uninterruptable` protects it from barge-in.
    ///
    /// # Errors
    /// [`ClientError::Closed`] once the session is over.
    pub async fn direct_speech(
        &self,
        text: impl Into<String>,
        include_in_history: bool,
        uninterruptable: bool,
    ) -> Result<(), ClientError> {
        self.send(ServiceBoundMessage::direct_speech(
            text,
            include_in_history,
            uninterruptable,
        ))
        .await
    }

    /// Starts a reply now (a greeting), with optional extra instructions; `flush_vad` ends the
    /// user's current utterance first.
    ///
    /// # Errors
    /// [`ClientError::Closed`] once the session is over.
    pub async fn trigger_inference(
        &self,
        extra_instructions: Option<String>,
        flush_vad: bool,
    ) -> Result<(), ClientError> {
        self.send(ServiceBoundMessage::trigger_inference(
            extra_instructions,
            flush_vad,
        ))
        .await
    }

    /// Changes the input audio format or the inference settings; a reconnection uses them.
    ///
    /// # Errors
    /// [`ClientError::Closed`] once the session is over.
    pub async fn reconfigure(&self, update: SessionUpdate) -> Result<(), ClientError> {
        self.command(Command::Reconfigure(update)).await
    }

    /// Replaces the client's tools; a reconnection declares them again.
    ///
    /// # Errors
    /// [`ClientError::Closed`] once the session is over.
    pub async fn update_tools(&self, tools: Vec<ToolDefinition>) -> Result<(), ClientError> {
        self.command(Command::Tools(tools)).await
    }

    /// Reports how many bytes of reply audio have been played (sessions with
    /// `supports_playback_reporting`).
    ///
    /// # Errors
    /// [`ClientError::Closed`] once the session is over.
    pub async fn report_playback(
        &self,
        bytes_played: u64,
        turn_id: Option<u32>,
    ) -> Result<(), ClientError> {
        self.send(ServiceBoundMessage::playback_report(bytes_played, turn_id))
            .await
    }

    /// Asks the model a one-off question about the conversation, outside it.
    ///
    /// # Errors
    /// [`ClientError::Usage`] with neither `prompt` nor `instructions`; the server's error
    /// ([`ClientError::Session`]), [`ClientError::Timeout`], [`ClientError::Disconnected`] or
    /// [`ClientError::Closed`].
    pub async fn query(
        &self,
        prompt: Option<String>,
        instructions: Option<String>,
    ) -> Result<String, ClientError> {
        let message = ServiceBoundMessage::conversation_query(prompt, instructions)?;
        let (tx, rx) = oneshot::channel();
        self.command(Command::Query(message, tx)).await?;
        self.answer(rx).await
    }

    /// The conversation so far; `await_pending` waits for replies in flight, `exclude_audio`
    /// leaves audio out.
    ///
    /// # Errors
    /// [`ClientError::Timeout`], [`ClientError::Disconnected`] or [`ClientError::Closed`].
    pub async fn export_history(
        &self,
        await_pending: bool,
        exclude_audio: bool,
    ) -> Result<Vec<ChatMessage>, ClientError> {
        let (tx, rx) = oneshot::channel();
        let message = ServiceBoundMessage::export_chat_history(await_pending, exclude_audio);
        self.command(Command::Export(message, tx)).await?;
        self.answer(rx).await
    }

    /// The round trip of a `Ping`.
    ///
    /// # Errors
    /// [`ClientError::Timeout`], [`ClientError::Disconnected`] or [`ClientError::Closed`].
    pub async fn ping(&self) -> Result<Duration, ClientError> {
        let start = Instant::now();
        let (tx, rx) = oneshot::channel();
        self.command(Command::Ping(tx)).await?;
        self.answer(rx).await?;
        Ok(start.elapsed())
    }

    /// Why the session ended, once it has (`None` while it runs or after a close of the
    /// client's own).
    #[must_use]
    pub fn end_reason(&self) -> Option<String> {
        self.end.lock().ok().and_then(|e| e.clone())
    }

    /// Sends any message as it is (for what the typed methods do not cover).
    ///
    /// # Errors
    /// [`ClientError::Closed`] once the session is over.
    pub async fn send(&self, message: ServiceBoundMessage) -> Result<(), ClientError> {
        self.command(Command::Send(message)).await
    }

    fn next_packet_id(&self) -> u64 {
        self.packet_id.fetch_add(1, Ordering::Relaxed)
    }

    async fn command(&self, command: Command) -> Result<(), ClientError> {
        self.commands
            .send(command)
            .await
            .map_err(|_| ClientError::Closed(self.end_reason()))
    }

    async fn answer<T>(
        &self,
        rx: oneshot::Receiver<Result<T, ClientError>>,
    ) -> Result<T, ClientError> {
        match tokio::time::timeout(self.request_timeout, rx).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(ClientError::Closed(self.end_reason())),
            Err(_) => Err(ClientError::Timeout(self.request_timeout)),
        }
    }
}

/// Initializes a fresh connection: `InitializeSessionRequest`, the tools if any, then waits for
/// `SessionReady`.
async fn handshake(
    link: &mut Link,
    config: &SessionConfig,
    tools: &[ToolDefinition],
    timeout: Duration,
) -> Result<(), ClientError> {
    let lost = |loss: Loss| match loss {
        Loss::Refused(r) if r.contains("Unauthenticated") => ClientError::Unauthorized(r),
        other => ClientError::Disconnected(other.reason().to_owned()),
    };
    link.send(&ServiceBoundMessage::initialize(config)?)
        .await
        .map_err(lost)?;
    if !tools.is_empty() {
        link.send(&ServiceBoundMessage::update_tools(tools.to_vec()))
            .await
            .map_err(lost)?;
    }
    let ready = async {
        loop {
            let message = link.recv().await.map_err(lost)?;
            match message.payload {
                Some(Payload::SessionReady(_)) => return Ok(()),
                Some(Payload::Error(e)) => {
                    return Err(ClientError::Initialize(SessionError {
                        category: e.category_open(),
                        message: e.message,
                        trace_id: e.trace_id,
                    }));
                }
                // Nothing else should come first; a newer server's extras are skipped.
                _ => {}
            }
        }
    };
    tokio::time::timeout(timeout, ready)
        .await
        .map_err(|_| ClientError::Timeout(timeout))?
}

/// Why the connection loop stopped serving a link.
enum Stop {
    /// The application closed the session (or dropped the client).
    Closed,
    /// The connection ended.
    Lost(Loss),
}

/// The connection task's state: what a reconnection needs, and the callers waiting for
/// answers (the server answers each kind in order).
struct Connection {
    options: ClientOptions,
    config: SessionConfig,
    tools: Vec<ToolDefinition>,
    events: mpsc::Sender<Event>,
    queries: VecDeque<oneshot::Sender<Result<String, ClientError>>>,
    exports: VecDeque<oneshot::Sender<Result<Vec<ChatMessage>, ClientError>>>,
    pings: VecDeque<oneshot::Sender<Result<(), ClientError>>>,
}

impl Connection {
    /// Serves links until the session ends; returns why it ended (`None`: closed by the
    /// application).
    async fn run(
        mut self,
        mut link: Link,
        mut commands: mpsc::Receiver<Command>,
        mut close: oneshot::Receiver<()>,
    ) -> Option<String> {
        loop {
            let loss = match self.serve(&mut link, &mut commands, &mut close).await {
                Stop::Closed => {
                    link.close().await;
                    return None;
                }
                Stop::Lost(loss) => loss,
            };
            tracing::debug!(reason = loss.reason(), "realtime connection lost");
            self.fail_pending(loss.reason());
            let Loss::Failed(reason) = loss else {
                return Some(loss.reason().to_owned());
            };
            match self.reconnect(reason, &mut close).await {
                Ok(Some(new)) => link = new,
                Ok(None) => return None,
                Err(reason) => return Some(reason),
            }
        }
    }

    /// Reconnects with back-off; `Ok(None)` when the application closed meanwhile, `Err` with
    /// the last failure when the attempts ran out or a failure is final.
    async fn reconnect(
        &mut self,
        mut reason: String,
        close: &mut oneshot::Receiver<()>,
    ) -> Result<Option<Link>, String> {
        let policy = self.options.reconnect;
        for attempt in 1..=policy.max_attempts {
            self.emit(Event::Reconnecting {
                attempt,
                reason: reason.clone(),
            })
            .await;
            tokio::select! {
                () = tokio::time::sleep(policy.delay(attempt)) => {}
                _ = &mut *close => return Ok(None),
            }
            let attempt_result = async {
                let mut link = Link::open(&self.options).await?;
                handshake(
                    &mut link,
                    &self.config,
                    &self.tools,
                    self.options.ready_timeout,
                )
                .await?;
                Ok::<_, ClientError>(link)
            };
            let result = tokio::select! {
                r = attempt_result => r,
                _ = &mut *close => return Ok(None),
            };
            match result {
                Ok(link) => {
                    self.emit(Event::Reconnected { attempt }).await;
                    return Ok(Some(link));
                }
                Err(e @ (ClientError::Unauthorized(_) | ClientError::Initialize(_))) => {
                    return Err(e.to_string());
                }
                Err(e) => reason = e.to_string(),
            }
        }
        Err(reason)
    }

    async fn serve(
        &mut self,
        link: &mut Link,
        commands: &mut mpsc::Receiver<Command>,
        close: &mut oneshot::Receiver<()>,
    ) -> Stop {
        loop {
            tokio::select! {
                biased;
                _ = &mut *close => return Stop::Closed,
                command = commands.recv() => {
                    let Some(command) = command else { return Stop::Closed };
                    if let Err(loss) = self.command(link, command).await {
                        return Stop::Lost(loss);
                    }
                }
                message = link.recv() => match message {
                    Ok(message) => self.message(message).await,
                    Err(loss) => return Stop::Lost(loss),
                },
            }
        }
    }

    async fn command(&mut self, link: &mut Link, command: Command) -> Result<(), Loss> {
        let message = match command {
            Command::Send(m) => m,
            Command::Query(m, tx) => {
                self.queries.push_back(tx);
                m
            }
            Command::Export(m, tx) => {
                self.exports.push_back(tx);
                m
            }
            Command::Ping(tx) => {
                self.pings.push_back(tx);
                ServiceBoundMessage::ping()
            }
            Command::Tools(tools) => {
                self.tools.clone_from(&tools);
                ServiceBoundMessage::update_tools(tools)
            }
            Command::Reconfigure(update) => {
                if let Some(input) = update.input {
                    self.config.input = input;
                }
                if let Some(inference) = &update.inference {
                    self.config.inference = inference.clone();
                }
                ServiceBoundMessage::reconfigure(&update)
            }
        };
        link.send(&message).await
    }

    async fn message(&mut self, message: ClientBoundMessage) {
        let Some(payload) = message.payload else {
            return;
        };
        match payload {
            Payload::ConversationQueryResult(r) => answer(&mut self.queries, Ok(r.text)),
            Payload::ChatHistory(h) => answer(&mut self.exports, Ok(h.messages)),
            Payload::Pong(_) => answer(&mut self.pings, Ok(())),
            Payload::Error(e)
                if !self.queries.is_empty()
                    && e.category_open() == Open::Known(SessionErrorCategory::ErrorInference)
                    && e.message.starts_with(QUERY_FAILED) =>
            {
                let error = SessionError {
                    category: e.category_open(),
                    message: e.message,
                    trace_id: e.trace_id,
                };
                answer(&mut self.queries, Err(ClientError::Session(error)));
            }
            Payload::SessionReady(_) => {}
            other => {
                let event = event_of(other).unwrap_or_else(|payload| {
                    Event::Other(Box::new(ClientBoundMessage {
                        payload: Some(payload),
                    }))
                });
                self.emit(event).await;
            }
        }
    }

    async fn emit(&self, event: Event) {
        // An application that dropped its receiver only sends: nothing to tell it.
        let _ = self.events.send(event).await;
    }

    /// The connection is gone: every caller waiting for an answer gets an error.
    fn fail_pending(&mut self, reason: &str) {
        let lost = || ClientError::Disconnected(reason.to_owned());
        for tx in self.queries.drain(..) {
            let _ = tx.send(Err(lost()));
        }
        for tx in self.exports.drain(..) {
            let _ = tx.send(Err(lost()));
        }
        for tx in self.pings.drain(..) {
            let _ = tx.send(Err(lost()));
        }
    }
}

/// Answers the oldest waiting caller (an unexpected answer, with nobody waiting, is dropped).
fn answer<T>(
    waiting: &mut VecDeque<oneshot::Sender<Result<T, ClientError>>>,
    result: Result<T, ClientError>,
) {
    if let Some(tx) = waiting.pop_front() {
        let _ = tx.send(result);
    }
}
