//! The load's sessions after their WebSocket handshake: one thread that owns every session's
//! socket and runs them all from one poll loop on the 10 ms grid, instead of a task and a timer
//! per session on an async runtime.
//!
//! Why by hand: what the generator costs is what it does per message, and on an async runtime
//! each 60 ms frame of each session was a timer in the wheel, a task wake-up, a trip through
//! the WebSocket sink (framing into a buffer, masking, a flush) and for each reply frame a
//! second `read` that comes back empty before the task sleeps. Here a grid tick is one
//! `epoll_wait` that returns when the tick is due or a socket is readable; the tick walks the
//! sessions and writes each due frame, prebuilt and masked with a fresh key, with one `write`;
//! a readable socket gets one `read` of up to 8 KiB (level-triggered, so what is left is
//! reported again rather than read until `EAGAIN`), and the server's frames are parsed in
//! place. Replies are handled as soon as they arrive, so latencies are timed to the wake-up,
//! not to the grid.

use std::io::{Cursor, Read as _, Write as _};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsFd as _;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Duration;

use anyhow::{Context as _, bail};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::frame::FrameHeader;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Control, Data, OpCode};
use voxgate_xiaozhi::control::{ServerMessage, TtsState};

use super::{
    BurstTracker, Fleet, HELLO_WAIT, Outcome, PLAY_SLACK, SEND_SLACK, SessionStats, on_grid, slot,
};
use crate::audio::Playback;
use crate::ws::{self, MaskKeys, opcode};
use crate::xiaozhi::UPLINK_FRAME;

/// Bytes read per `read`: a reply frame is a few hundred bytes, so one read takes every frame
/// that arrived since the last one.
const READ_CHUNK: usize = 8192;
/// The largest server message accepted (as tungstenite was configured before).
const MAX_MESSAGE: usize = 1 << 20;
/// Unsent bytes a session may hold when the server stops reading before it counts as failed.
const MAX_PENDING: usize = 1 << 20;
/// How long a closing session waits for the server's close.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// What the connecting side hands the driver.
pub(super) enum Handoff {
    /// A session whose handshake succeeded: its socket, and when it stops starting bursts.
    Open {
        index: usize,
        tcp: TcpStream,
        end: Instant,
    },
    /// A session that never connected.
    Failed { index: usize, stats: SessionStats },
}

/// Where a session is.
enum Phase {
    /// Hello sent, waiting for the server's.
    Hello { by: Instant },
    /// Bursts and answers.
    Running,
    /// Close sent; waiting for the server's close (or the socket's end) until then.
    Closing { until: Instant },
}

/// The burst in flight: its first frame's slot, the next frame to send (none once the answer
/// began or the frames ran out), and its bookkeeping.
type Current = (Instant, Option<usize>, BurstTracker);

/// One session's socket and state.
struct Conn {
    index: usize,
    tcp: TcpStream,
    phase: Phase,
    end: Instant,
    /// Received bytes; the first `rlen` are not parsed yet.
    rbuf: Vec<u8>,
    rlen: usize,
    /// A fragmented message being reassembled (the server sends whole frames; tolerated).
    fragment: Option<(bool, Vec<u8>)>,
    /// Bytes a full socket did not take (written before anything else on the next tick).
    pending: Vec<u8>,
    playback: Playback,
    /// `listen start` for this session, a text payload (known once the hello came).
    listen: Option<Vec<u8>>,
    current: Option<Current>,
    stats: SessionStats,
    in_flight: bool,
}

/// Things the sessions share in the driver.
struct Shared<'a> {
    fleet: &'a Fleet,
    keys: MaskKeys,
    /// Scratch space for one outgoing frame.
    out: Vec<u8>,
}

impl Shared<'_> {
    /// Frames `payload` as one masked client frame in `self.out`.
    fn frame(&mut self, op: u8, payload: &[u8]) -> anyhow::Result<&[u8]> {
        self.out.clear();
        let key = self.keys.next_key()?;
        ws::masked_frame(&mut self.out, op, payload, key);
        Ok(&self.out)
    }
}

impl Conn {
    fn new(index: usize, tcp: TcpStream, end: Instant, now: Instant) -> Self {
        Self {
            index,
            tcp,
            phase: Phase::Hello {
                by: now + HELLO_WAIT,
            },
            end,
            rbuf: vec![0; READ_CHUNK],
            rlen: 0,
            fragment: None,
            pending: Vec::new(),
            playback: Playback::new(UPLINK_FRAME, PLAY_SLACK),
            listen: None,
            current: None,
            stats: SessionStats::default(),
            in_flight: false,
        }
    }

    /// Writes one frame: straight to the socket, or after what is still pending.
    fn send(&mut self, shared: &mut Shared<'_>, op: u8, payload: &[u8]) -> anyhow::Result<()> {
        let frame = shared.frame(op, payload)?;
        if self.pending.is_empty() {
            match self.tcp.write(frame) {
                Ok(n) if n == frame.len() => return Ok(()),
                Ok(n) => self.pending.extend_from_slice(&frame[n..]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    self.pending.extend_from_slice(frame);
                }
                Err(e) => return Err(e.into()),
            }
        } else {
            self.pending.extend_from_slice(frame);
        }
        if self.pending.len() > MAX_PENDING {
            bail!(
                "the server stopped reading ({} bytes unsent)",
                self.pending.len()
            );
        }
        Ok(())
    }

    /// Writes what a full socket did not take earlier.
    fn flush(&mut self) -> anyhow::Result<()> {
        while !self.pending.is_empty() {
            match self.tcp.write(&self.pending) {
                Ok(0) => bail!("the server closed the socket"),
                Ok(n) => {
                    self.pending.drain(..n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Sends `listen start` and begins a burst at the next point of the grid.
    fn start_burst(&mut self, shared: &mut Shared<'_>, now: Instant) -> anyhow::Result<()> {
        let listen = self.listen.take().unwrap_or_default();
        let sent = self.send(shared, opcode::TEXT, &listen);
        self.stats.text_messages += 1;
        self.listen = Some(listen);
        sent.context("sending listen")?;
        let fleet = shared.fleet;
        let first = (!fleet.burst.frames.is_empty()).then_some(0);
        let start = on_grid(fleet.epoch, now);
        self.current = Some((start, first, BurstTracker::new(fleet.burst.plan)));
        self.in_flight = true;
        Ok(())
    }

    /// A burst ended with `outcome`: counts it and starts the next one unless the run is over.
    fn burst_done(
        &mut self,
        shared: &mut Shared<'_>,
        outcome: Outcome,
        now: Instant,
    ) -> anyhow::Result<()> {
        self.stats.record(outcome);
        self.current = None;
        self.in_flight = false;
        if now < self.end {
            self.start_burst(shared, now)?;
        }
        Ok(())
    }

    /// The grid ticked: due frames, deadlines. `Ok(false)`: the session is over.
    fn tick(&mut self, shared: &mut Shared<'_>, now: Instant) -> anyhow::Result<bool> {
        match self.phase {
            Phase::Hello { by } if now >= by => bail!("no hello within {HELLO_WAIT:?}"),
            Phase::Hello { .. } => return Ok(true),
            Phase::Closing { until } => return Ok(now < until),
            Phase::Running => {}
        }
        self.flush().context("sending audio")?;
        // A copy of the shared reference, so `shared` stays free to lend to `send`.
        let fleet: &Fleet = shared.fleet;
        let burst = &fleet.burst;
        loop {
            let Some((start, next, tracker)) = self.current.as_mut() else {
                // The last burst was judged after the run's end: close.
                let close = 1000u16.to_be_bytes();
                let _ = self.send(shared, opcode::CLOSE, &close);
                let _ = self.flush();
                let _ = self.tcp.shutdown(Shutdown::Write);
                self.phase = Phase::Closing {
                    until: now + CLOSE_WAIT,
                };
                return Ok(true);
            };
            let start = *start;
            match *next {
                Some(i) if start + slot(i) <= now => {
                    if now.saturating_duration_since(start + slot(i)) > SEND_SLACK {
                        self.stats.late_sends += 1;
                    }
                    tracker.frame_sent(i, now.saturating_duration_since(start));
                    *next = Some(i + 1).filter(|&k| k < burst.frames.len());
                    self.send(shared, opcode::BINARY, &burst.frames[i])
                        .context("sending audio")?;
                    self.stats.frames_sent += 1;
                }
                Some(_) => return Ok(true),
                None if now >= start + tracker.deadline() => {
                    let outcome = tracker.expired();
                    self.burst_done(shared, outcome, now)?;
                    if self.current.is_none() {
                        continue;
                    }
                    return Ok(true);
                }
                None => return Ok(true),
            }
        }
    }

    /// The socket is readable: one read, then every whole frame in the buffer. `Ok(false)`:
    /// the session is over.
    fn readable(&mut self, shared: &mut Shared<'_>, now: Instant) -> anyhow::Result<bool> {
        // The buffer is zeroed once, when it is made or grows, never per read.
        if self.rlen == self.rbuf.len() {
            let grown = (self.rbuf.len() * 2).min(MAX_MESSAGE + 14);
            if grown == self.rbuf.len() {
                bail!("receiving: a frame over {MAX_MESSAGE} bytes");
            }
            self.rbuf.resize(grown, 0);
        }
        let closing = matches!(self.phase, Phase::Closing { .. });
        match self.tcp.read(&mut self.rbuf[self.rlen..]) {
            Ok(0) if closing => return Ok(false),
            Ok(0) => bail!("server closed the session"),
            Ok(n) => self.rlen += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(true),
            Err(_) if closing => return Ok(false),
            Err(e) => return Err(e).context("receiving"),
        }
        // Parse from a buffer taken out of `self`, so the frames are handled in place.
        let buf = std::mem::take(&mut self.rbuf);
        let mut pos = 0;
        let result = loop {
            let mut cursor = Cursor::new(&buf[pos..self.rlen]);
            let (header, len) = match FrameHeader::parse(&mut cursor) {
                Ok(Some(h)) => h,
                Ok(None) => break Ok(true),
                Err(e) => break Err(anyhow::Error::from(e).context("receiving")),
            };
            let len = match usize::try_from(len) {
                Ok(len) if len <= MAX_MESSAGE => len,
                _ => break Err(anyhow::anyhow!("receiving: a frame of {len} bytes")),
            };
            let body = pos + usize::try_from(cursor.position()).unwrap_or(usize::MAX);
            if self.rlen < body + len {
                break Ok(true);
            }
            pos = body + len;
            if header.mask.is_some() {
                break Err(anyhow::anyhow!("receiving: a masked frame from the server"));
            }
            match self.frame(shared, &header, &buf[body..pos], now) {
                Ok(true) => {}
                other => break other,
            }
        };
        self.rbuf = buf;
        // Keep the start of an incomplete frame at the front; grow for a large one.
        self.rbuf.copy_within(pos..self.rlen, 0);
        self.rlen -= pos;
        result
    }

    /// One frame from the server.
    fn frame(
        &mut self,
        shared: &mut Shared<'_>,
        header: &FrameHeader,
        payload: &[u8],
        now: Instant,
    ) -> anyhow::Result<bool> {
        let closing = matches!(self.phase, Phase::Closing { .. });
        let whole;
        let (binary, message) = match header.opcode {
            OpCode::Control(Control::Ping) => {
                if !closing {
                    self.send(shared, opcode::PONG, payload)
                        .context("sending pong")?;
                }
                return Ok(true);
            }
            OpCode::Control(Control::Close) if closing => return Ok(false),
            OpCode::Control(Control::Close) => bail!("server closed the session"),
            OpCode::Control(_) => return Ok(true),
            OpCode::Data(Data::Continue) => {
                let Some((binary, mut first)) = self.fragment.take() else {
                    bail!("receiving: a continuation without a first frame");
                };
                first.extend_from_slice(payload);
                if first.len() > MAX_MESSAGE {
                    bail!("receiving: a message over {MAX_MESSAGE} bytes");
                }
                if !header.is_final {
                    self.fragment = Some((binary, first));
                    return Ok(true);
                }
                whole = first;
                (binary, whole.as_slice())
            }
            OpCode::Data(Data::Binary | Data::Text) if !header.is_final => {
                let binary = header.opcode == OpCode::Data(Data::Binary);
                self.fragment = Some((binary, payload.to_vec()));
                return Ok(true);
            }
            OpCode::Data(Data::Binary) => (true, payload),
            OpCode::Data(Data::Text) => (false, payload),
            OpCode::Data(_) => return Ok(true),
        };
        if closing {
            return Ok(true);
        }
        if binary {
            self.stats.reply_frames += 1;
            self.playback.frame(now);
            if let Some((start, _, tracker)) = self.current.as_mut() {
                tracker.reply(now.saturating_duration_since(*start), true);
            }
            return Ok(true);
        }
        self.stats.text_messages += 1;
        match ServerMessage::from_slice(message) {
            Ok(ServerMessage::Hello(h)) if self.listen.is_none() => {
                let ms = u64::from(h.audio_params.frame_duration.max(1));
                self.playback = Playback::new(Duration::from_millis(ms), PLAY_SLACK);
                self.stats.connected = true;
                self.listen = Some(super::listen_payload(&h.session_id));
                self.phase = Phase::Running;
                self.start_burst(shared, now)?;
            }
            Ok(ServerMessage::Tts(tts)) => {
                let Some((start, next, tracker)) = self.current.as_mut() else {
                    return Ok(true);
                };
                let at = now.saturating_duration_since(*start);
                match tts.state {
                    // The device stops the microphone while it speaks (auto mode).
                    TtsState::Start => {
                        tracker.tts_start(at);
                        *next = None;
                    }
                    TtsState::Stop => {
                        self.playback.stop();
                        self.stats.turns += 1;
                        if let Some(outcome) = tracker.tts_stop() {
                            self.burst_done(shared, outcome, now)?;
                        }
                    }
                    _ => tracker.reply(at, false),
                }
            }
            _ => {}
        }
        Ok(true)
    }

    /// The session's counters, with `result` (the error that ended it, if any).
    fn finish(mut self, result: anyhow::Result<()>) -> (usize, SessionStats) {
        if let Err(e) = result {
            self.stats.error = Some(format!("{e:#}"));
            if self.in_flight {
                self.stats.record(Outcome::Lost);
            }
        }
        self.stats.late_frames = self.playback.late;
        self.stats.max_late_ms =
            u64::try_from(self.playback.max_late.as_millis()).unwrap_or(u64::MAX);
        (self.index, self.stats)
    }
}

/// Runs the sessions `rx` hands over until `expected` of them have ended; returns each one's
/// counters by index.
pub(super) fn run(
    fleet: &Arc<Fleet>,
    rx: &Receiver<Handoff>,
    expected: usize,
) -> anyhow::Result<Vec<(usize, SessionStats)>> {
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).context("epoll")?;
    let mut shared = Shared {
        fleet,
        keys: MaskKeys::new(),
        out: Vec::with_capacity(1024),
    };
    // Slots of live sessions (`None`: free); the epoll data is the slot.
    let mut conns: Vec<Option<Conn>> = Vec::with_capacity(expected);
    let mut free: Vec<usize> = Vec::new();
    let mut live = 0usize;
    let mut done = Vec::with_capacity(expected);
    let mut events = vec![EpollEvent::empty(); 1024];
    let mut next_tick = on_grid(fleet.epoch, Instant::now());
    let mut senders_gone = false;
    while done.len() < expected {
        // Sessions that finished connecting.
        while !senders_gone {
            match rx.try_recv() {
                Ok(Handoff::Open { index, tcp, end }) => {
                    let now = Instant::now();
                    let mut conn = Conn::new(index, tcp, end, now);
                    let hello = crate::xiaozhi::hello(fleet.version, false);
                    let slot = free.pop().unwrap_or(conns.len());
                    let registered = epoll
                        .add(
                            conn.tcp.as_fd(),
                            EpollEvent::new(EpollFlags::EPOLLIN, slot as u64),
                        )
                        .context("epoll");
                    conn.stats.text_messages += 1;
                    match registered.and_then(|()| {
                        conn.send(&mut shared, opcode::TEXT, hello.as_bytes())
                            .context("sending hello")
                    }) {
                        Ok(()) => {
                            if slot == conns.len() {
                                conns.push(Some(conn));
                            } else {
                                conns[slot] = Some(conn);
                            }
                            live += 1;
                        }
                        Err(e) => {
                            free.push(slot);
                            done.push(conn.finish(Err(e)));
                        }
                    }
                }
                Ok(Handoff::Failed { index, stats }) => done.push((index, stats)),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => senders_gone = true,
            }
        }
        if senders_gone && live == 0 && done.len() < expected {
            bail!("{} sessions were never handed over", expected - done.len());
        }
        let now = Instant::now();
        let wait = next_tick.saturating_duration_since(now);
        // Round up: waking before the tick would only mean waiting again.
        let ms = u16::try_from(wait.as_micros().div_ceil(1000)).unwrap_or(u16::MAX);
        let n = match epoll.wait(&mut events, EpollTimeout::from(ms)) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => 0,
            Err(e) => return Err(e).context("epoll_wait"),
        };
        let now = Instant::now();
        for ev in &events[..n] {
            let slot = usize::try_from(ev.data()).unwrap_or(usize::MAX);
            let Some(conn) = conns.get_mut(slot).and_then(Option::as_mut) else {
                continue;
            };
            let result = conn.readable(&mut shared, now);
            if !matches!(result, Ok(true)) {
                let conn = conns[slot].take();
                if let Some(conn) = conn {
                    live -= 1;
                    free.push(slot);
                    done.push(conn.finish(result.map(|_| ())));
                }
            }
        }
        if now >= next_tick {
            for (slot, entry) in conns.iter_mut().enumerate() {
                let Some(conn) = entry.as_mut() else {
                    continue;
                };
                let result = conn.tick(&mut shared, now);
                if !matches!(result, Ok(true))
                    && let Some(conn) = entry.take()
                {
                    live -= 1;
                    free.push(slot);
                    done.push(conn.finish(result.map(|_| ())));
                }
            }
            // The next point of the grid after now (ticks missed while busy are not replayed:
            // the frames they were due for go out at once on this one).
            next_tick = on_grid(fleet.epoch, now + Duration::from_micros(1));
        }
    }
    Ok(done)
}
