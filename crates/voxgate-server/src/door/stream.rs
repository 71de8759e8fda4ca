//! Sessions over a message stream instead of a WebSocket (the realtime door's gRPC service).
//!
//! A stream carries whole messages both ways, as WebSocket data frames do, but has no control
//! frames of its own: no ping (HTTP/2 keeps the connection alive; a dead peer is found by the
//! write and idle timeouts) and no close handshake (the server ends its half with a status;
//! the client ending its half is its goodbye). Everything else (queues, back-pressure, the
//! provider runner, timers, shutdown, metrics, the observer) is the shared driver's, so a door's
//! translator serves a stream session exactly as a WebSocket one.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use axum::extract::ws::Message;
use futures::{Stream, StreamExt};
use tokio::sync::mpsc;

use super::{
    ClientFrame, CloseRequest, DriverContext, FromReader, IN_QUEUE, OUT_QUEUE, Outlet, ServerFrame,
    ToWriter, Translator, deliver, drive, write,
};

/// What the transport reads, message by message; the stream's end is the client's goodbye.
#[derive(Debug)]
pub(crate) enum StreamIn {
    /// A client message.
    Frame(ClientFrame),
    /// A message over the transport's hard size limit: the session cannot go on.
    TooBig,
    /// The client reset the stream or the connection failed.
    Failed,
}

/// What the session sends: frames, then at most one close.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StreamOut {
    /// A frame for the client.
    Frame(ServerFrame),
    /// The server ends the session; the transport turns the code into its own status.
    Close(CloseRequest),
}

/// The sending half: a bounded queue the transport's response body reads, so a client that
/// stops reading fills it and the driver's write timeout closes the session.
struct StreamOutlet(mpsc::Sender<StreamOut>);

impl Outlet for StreamOutlet {
    async fn send(&mut self, msg: Message) -> bool {
        let frame = match msg {
            Message::Binary(b) => ServerFrame::Binary(b),
            Message::Text(t) => ServerFrame::Text(t.to_string()),
            // Keepalive is the transport's own; the driver sends no pings here.
            Message::Ping(_) | Message::Pong(_) | Message::Close(_) => return true,
        };
        self.0.send(StreamOut::Frame(frame)).await.is_ok()
    }

    async fn close(&mut self, close: CloseRequest) {
        let _ = self.0.send(StreamOut::Close(close)).await;
    }

    async fn finish(&mut self) {}
}

/// Runs one session over a message stream until it ends; `output` closes when it has.
pub(crate) async fn run_stream<T, S>(
    input: S,
    output: mpsc::Sender<StreamOut>,
    translator: T,
    mut cx: DriverContext,
) where
    T: Translator,
    S: Stream<Item = StreamIn> + Send + Unpin + 'static,
{
    let _ticket = cx.sessions.enter();
    let _active = cx.metrics.session(cx.door);
    // No ping frames on a stream: a quiet client is not a dead one.
    cx.limits.ping_interval = None;
    let start = Instant::now();
    let (in_tx, in_rx) = mpsc::channel::<FromReader<T::In>>(IN_QUEUE);
    let (out_tx, out_rx) = mpsc::channel::<ToWriter>(OUT_QUEUE);
    let last_seen = Arc::new(AtomicU64::new(0));
    let reader = tokio::spawn(read::<T, S>(
        input,
        in_tx,
        Arc::clone(&last_seen),
        start,
        cx.max_frame_bytes,
        Arc::clone(&cx.metrics),
        cx.door,
    ));
    let writer = tokio::spawn(write(
        StreamOutlet(output),
        out_rx,
        cx.limits.write_timeout,
        Arc::clone(&cx.metrics),
        cx.door,
    ));
    drive(translator, &cx, in_rx, out_tx, None, start, last_seen).await;
    let _ = writer.await;
    reader.abort();
}

async fn read<T: Translator, S: Stream<Item = StreamIn> + Unpin>(
    mut input: S,
    tx: mpsc::Sender<FromReader<T::In>>,
    last_seen: Arc<AtomicU64>,
    start: Instant,
    max: usize,
    metrics: Arc<crate::metrics::Metrics>,
    door: crate::metrics::Door,
) {
    loop {
        let next = tokio::select! {
            m = input.next() => m,
            () = tx.closed() => return,
        };
        let millis = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
        last_seen.store(millis, Ordering::Relaxed);
        match next {
            Some(StreamIn::Frame(frame)) => {
                if !deliver::<T>(&tx, frame, max, &metrics, door).await {
                    return;
                }
            }
            Some(StreamIn::TooBig) => {
                let _ = tx.send(FromReader::TooBig).await;
                return;
            }
            // Dropping the sender ends the session as a peer gone.
            Some(StreamIn::Failed) => return,
            None => {
                let _ = tx.send(FromReader::Closed).await;
                return;
            }
        }
    }
}
