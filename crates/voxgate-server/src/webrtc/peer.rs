//! One WebRTC connection: its str0m [`Rtc`], the Opus codec on both sides of its audio track,
//! real-time pacing of reply audio, and its data channel.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use str0m::channel::ChannelId;
use str0m::format::Codec;
use str0m::media::{Frequency, MediaKind, MediaTime, Mid};
use str0m::net::{Protocol, Receive};
use str0m::{Candidate, Event, IceConnectionState, Input, Output, Rtc};
use tokio::sync::{Notify, mpsc};
use voxgate_audio::opus::{
    FrameDuration, OpusApplication, OpusBackend, OpusDecoder, OpusEncoder, OpusEncoderConfig,
};
use voxgate_audio::resample::RateConverter;

use super::{DataChannel, Datagram, Endpoint, PeerOptions, Slot};

/// The rate reply audio is encoded at: wideband speech, SILK only. At 24 kHz the encoder
/// adds CELT (hybrid mode) for the band above 8 kHz, which cost about a sixth more server CPU
/// at 200 sessions for little a listener hears in synthesized speech. Opus packets carry their
/// bandwidth, so the RTP clock stays 48 kHz.
pub(crate) const ENCODE_RATE: u32 = 16_000;
/// Opus encoder effort for replies. The encoder is most of a WebRTC session's CPU (a profile
/// at 150 sessions: over 40 % of the server's samples in opus-rs's SILK analysis at 5); at 1
/// SILK skips its delayed-decision quantizer and warped analysis, which is what lets 200
/// sessions stream on this 2-core machine, and synthesized speech at 32 kbit/s still sounds
/// clean.
const ENCODE_COMPLEXITY: u8 = 1;
/// One RTP frame.
const FRAME: Duration = Duration::from_millis(20);
/// Samples of one frame at [`ENCODE_RATE`].
const FRAME_SAMPLES: usize = (ENCODE_RATE / 50) as usize;
/// RTP clock ticks of one frame (Opus' RTP clock is always 48 kHz, RFC 7587).
const FRAME_TICKS: u64 = 960;
/// A frame sent this much after its time counts as late.
const LATE: Duration = Duration::from_millis(20);
/// Behind schedule by this much, the pacer starts a new schedule instead of bursting.
const RESYNC: Duration = Duration::from_millis(100);
/// Timeouts already due handled in a row before the connection yields to the runtime.
const MAX_IMMEDIATE_TIMEOUTS: u32 = 8;
/// Datagrams taken from the queue in one go.
const MAX_DATAGRAM_BATCH: usize = 16;
/// Events waiting for the door (20 ms of audio each); more audio is dropped and counted.
const EVENT_QUEUE: usize = 128;
/// Commands waiting for the connection.
const COMMAND_QUEUE: usize = 256;
/// Data channel messages held until the channel opens.
const MAX_PENDING_DATA: usize = 64;
/// How long the connection waits for the door to take a data channel message.
const DATA_WAIT: Duration = Duration::from_secs(1);
/// The text message [`DataChannel::PingPong`] answers, and its answer.
const PING: &[u8] = b"ping";
const PONG: &[u8] = b"pong";

/// What a connection tells its door.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MediaEvent {
    /// The offer was answered (from the door driver, not the connection): send the answer
    /// and, for signalling that trickles them, the server's candidates.
    Answer {
        /// The SDP answer.
        sdp: String,
        /// The server's candidates (`candidate:...`), also inside the answer.
        candidates: Vec<String>,
    },
    /// The offer was refused (from the door driver): why, for the client.
    Refused(String),
    /// ICE and DTLS are up: audio can flow.
    Connected,
    /// The data channel opened (doors that asked for one).
    DataOpen,
    /// 20 ms of the client's audio, mono at the door's input rate.
    Audio(Vec<i16>),
    /// A text message on the data channel.
    Data(String),
    /// The connection ended (the reason is for logs).
    Closed(String),
}

/// What a door asks of its connection.
#[derive(Debug)]
pub(crate) enum PeerCommand {
    /// A remote ICE candidate (`candidate:...`), for signalling that trickles them.
    RemoteCandidate(String),
    /// A text message for the data channel.
    Data(String),
    /// Hang up.
    Close,
}

/// Per-connection counters, readable while it runs and after.
#[derive(Debug, Default)]
pub(crate) struct PeerStats {
    /// Client audio frames received.
    pub(crate) frames_in: AtomicU64,
    /// Reply audio frames sent.
    pub(crate) frames_out: AtomicU64,
    /// Reply frames sent more than 20 ms after their time.
    pub(crate) late_frames: AtomicU64,
    /// Worst lateness of a reply frame, in microseconds.
    pub(crate) max_late_us: AtomicU64,
    /// Client audio frames dropped because the door was behind.
    pub(crate) dropped_in: AtomicU64,
    /// Times str0m's own timer woke the connection.
    pub(crate) timer_wakeups: AtomicU64,
    /// Remote candidates ignored: past [`MAX_REMOTE_CANDIDATES`], or after connecting.
    pub(crate) candidates_ignored: AtomicU64,
}

/// Reply audio waiting to be sent at real time: filled by the door, emptied by the pacer.
struct Playout {
    inner: Mutex<PlayoutInner>,
    /// Wakes an idle pacer when audio arrives.
    ready: Notify,
}

struct PlayoutInner {
    samples: VecDeque<i16>,
    max: usize,
}

impl Playout {
    fn lock(&self) -> std::sync::MutexGuard<'_, PlayoutInner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A door's end of one connection. Dropping it hangs up.
pub(crate) struct PeerHandle {
    events: mpsc::Receiver<MediaEvent>,
    commands: mpsc::Sender<PeerCommand>,
    playout: Arc<Playout>,
    /// Reply audio to [`ENCODE_RATE`], outside the queue's lock so the pacer never waits on
    /// a resampler.
    converter: RateConverter,
    scratch: Vec<i16>,
    id: String,
}

impl std::fmt::Debug for PeerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerHandle").field("id", &self.id).finish()
    }
}

impl PeerHandle {
    /// The next event; `None` once the connection's task ended.
    pub(crate) async fn recv(&mut self) -> Option<MediaEvent> {
        self.events.recv().await
    }

    /// A sender of commands (the data channel writer of a door whose transport it is).
    pub(crate) fn commands(&self) -> mpsc::Sender<PeerCommand> {
        self.commands.clone()
    }

    /// Queues a command; `false` when the connection is gone or far behind.
    pub(crate) fn command(&self, command: PeerCommand) -> bool {
        self.commands.try_send(command).is_ok()
    }

    /// Queues reply audio (mono `i16` at `rate`) for real-time sending; audio beyond
    /// `[webrtc] max_playout_ms` is dropped and counted. Returns the samples dropped.
    pub(crate) fn play(&mut self, samples: &[i16], rate: u32) -> usize {
        self.scratch.clear();
        if self
            .converter
            .process_i16_to_i16(samples, rate, &mut self.scratch)
            .is_err()
        {
            return samples.len();
        }
        let mut p = self.playout.lock();
        let room = p.max.saturating_sub(p.samples.len());
        let take = self.scratch.len().min(room);
        p.samples.extend(&self.scratch[..take]);
        let dropped = self.scratch.len() - take;
        drop(p);
        self.playout.ready.notify_one();
        dropped
    }

    /// Drops every queued reply sample at once (barge-in): the next frame sent is silence or
    /// the next reply.
    pub(crate) fn clear(&mut self) {
        self.playout.lock().samples.clear();
        self.converter.reset();
    }
}

/// What a connection's task needs besides its `Rtc`.
pub(crate) struct PeerContext {
    pub(crate) endpoint: Arc<Endpoint>,
    pub(crate) ufrag: String,
    pub(crate) datagrams: mpsc::Receiver<Datagram>,
    pub(crate) options: PeerOptions,
    pub(crate) connect_timeout: Duration,
    pub(crate) max_playout: Duration,
    /// Held until the task ends: the endpoint counts this connection until then.
    pub(crate) _slot: Slot,
}

/// Starts a connection's task.
pub(crate) fn start(rtc: Rtc, cx: PeerContext) -> PeerHandle {
    let (event_tx, events) = mpsc::channel(EVENT_QUEUE);
    let (commands, command_rx) = mpsc::channel(COMMAND_QUEUE);
    let max = (cx.max_playout.as_millis() as usize) * (ENCODE_RATE as usize) / 1000;
    let playout = Arc::new(Playout {
        inner: Mutex::new(PlayoutInner {
            samples: VecDeque::new(),
            max,
        }),
        ready: Notify::new(),
    });
    let stats = Arc::new(PeerStats::default());
    let id = cx.ufrag.clone();
    let task = Peer {
        rtc,
        events: event_tx,
        playout: Arc::clone(&playout),
        stats: Arc::clone(&stats),
        audio: None,
        channel: None,
        pending_data: VecDeque::new(),
        decoder: None,
        encoder: None,
        next_due: None,
        rtp_ticks: 0,
        last_frame_at: None,
        connected: false,
        remote_candidates: 0,
        started: Instant::now(),
        cx,
    };
    tokio::spawn(task.run(command_rx));
    PeerHandle {
        events,
        commands,
        playout,
        // 24 kHz is a rate the converter supports, so this cannot fail.
        converter: RateConverter::new(ENCODE_RATE).unwrap_or_else(|_| unreachable!()),
        scratch: Vec::new(),
        id,
    }
}

struct Peer {
    rtc: Rtc,
    cx: PeerContext,
    events: mpsc::Sender<MediaEvent>,
    playout: Arc<Playout>,
    stats: Arc<PeerStats>,
    /// The audio m-line and the Opus payload type the client offered.
    audio: Option<(Mid, str0m::format::PayloadParams)>,
    channel: Option<ChannelId>,
    pending_data: VecDeque<String>,
    decoder: Option<OpusDecoder>,
    encoder: Option<OpusEncoder>,
    /// When the next reply frame is due; `None` while nothing is queued.
    next_due: Option<Instant>,
    /// RTP time of the next frame, in 48 kHz ticks.
    rtp_ticks: u64,
    /// When the last frame went out (the pause before a new burst).
    last_frame_at: Option<Instant>,
    connected: bool,
    /// Remote candidates taken so far (at most [`MAX_REMOTE_CANDIDATES`]).
    remote_candidates: usize,
    started: Instant,
}

/// Remote candidates one connection takes from trickle ICE. A browser sends a handful (one per
/// interface and protocol, plus a relay or two); the WebRTC stack keeps every candidate and
/// pairs it with ours, so a client sending thousands made the server spend seconds of CPU.
pub(crate) const MAX_REMOTE_CANDIDATES: usize = 32;

impl Peer {
    async fn run(mut self, mut commands: mpsc::Receiver<PeerCommand>) {
        let reason = self.serve(&mut commands).await;
        let s = &self.stats;
        tracing::info!(
            peer = %self.cx.ufrag,
            %reason,
            frames_in = s.frames_in.load(Ordering::Relaxed),
            frames_out = s.frames_out.load(Ordering::Relaxed),
            late_frames = s.late_frames.load(Ordering::Relaxed),
            max_late_ms = s.max_late_us.load(Ordering::Relaxed) / 1000,
            dropped_in = s.dropped_in.load(Ordering::Relaxed),
            timer_wakeups = s.timer_wakeups.load(Ordering::Relaxed),
            candidates_ignored = s.candidates_ignored.load(Ordering::Relaxed),
            lifetime_ms = self.started.elapsed().as_millis(),
            "webrtc: connection closed"
        );
        self.rtc.disconnect();
        // Whatever str0m still wants to send (a DTLS close alert) goes out now.
        while let Ok(Output::Transmit(t)) = self.rtc.poll_output() {
            self.cx.endpoint.send(t.destination, &t.contents);
        }
        self.cx.endpoint.remove(&self.cx.ufrag);
        let _ = self.events.try_send(MediaEvent::Closed(reason));
        let s = &self.stats;
        if s.late_frames.load(Ordering::Relaxed) > 0 {
            self.cx
                .endpoint
                .metrics()
                .webrtc_late_frames(s.late_frames.load(Ordering::Relaxed));
        }
    }

    /// Runs until the connection ends; returns why.
    async fn serve(&mut self, commands: &mut mpsc::Receiver<PeerCommand>) -> String {
        let connect_by = self.started + self.cx.connect_timeout;
        let mut immediate = 0;
        // One timer for str0m's timeout, the next reply frame and the connect deadline, moved
        // only when its deadline changes: a fresh sleep per loop turn would register and
        // deregister with the runtime's timer on every packet.
        let timer = tokio::time::sleep_until(tokio::time::Instant::from_std(connect_by));
        tokio::pin!(timer);
        let mut armed = Some(connect_by);
        loop {
            let timeout = match self.drain() {
                Ok(t) => t,
                Err(reason) => return reason,
            };
            let now = Instant::now();
            // A frame written asks str0m to packetize and pace it at once: a timeout already
            // due is handled here, not through the runtime's timer (which would cost two more
            // wakeups per frame and a millisecond of timer granularity each). Bounded, so a
            // connection whose timer never settles still yields.
            if timeout <= now && immediate < MAX_IMMEDIATE_TIMEOUTS {
                immediate += 1;
                if let Err(e) = self.rtc.handle_input(Input::Timeout(now)) {
                    return format!("webrtc error: {e}");
                }
                continue;
            }
            immediate = 0;
            if !self.connected && now >= connect_by {
                return "ICE/DTLS did not complete in time".into();
            }
            // Reply audio first: a busy inbound queue must not delay a frame that is due.
            if self.next_due.is_some_and(|d| d <= now) {
                self.pace(now);
                continue;
            }
            let mut wake = timeout;
            if !self.connected {
                wake = wake.min(connect_by);
            }
            if let Some(due) = self.next_due {
                wake = wake.min(due);
            }
            if armed != Some(wake) {
                timer.as_mut().reset(tokio::time::Instant::from_std(wake));
                armed = Some(wake);
            }
            let idle = self.next_due.is_none();
            tokio::select! {
                biased;
                d = self.cx.datagrams.recv() => {
                    let Some(d) = d else { return "endpoint closed".into() };
                    self.receive(&d);
                    // Whatever else already arrived goes in before str0m is polled again.
                    for _ in 0..MAX_DATAGRAM_BATCH {
                        let Ok(d) = self.cx.datagrams.try_recv() else { break };
                        self.receive(&d);
                    }
                }
                c = commands.recv() => match c {
                    None | Some(PeerCommand::Close) => return "closed by the server".into(),
                    Some(PeerCommand::RemoteCandidate(c)) => self.remote_candidate(&c),
                    Some(PeerCommand::Data(text)) => self.send_data(text),
                },
                () = self.playout.ready.notified(), if idle => {
                    if self.connected {
                        self.start_burst(Instant::now());
                    }
                }
                () = &mut timer => {
                    // A fired timer stays ready until it is moved.
                    armed = None;
                    let now = Instant::now();
                    if self.next_due.is_some_and(|d| d <= now) {
                        self.pace(now);
                    }
                    if timeout <= now {
                        self.stats.timer_wakeups.fetch_add(1, Ordering::Relaxed);
                        if let Err(e) = self.rtc.handle_input(Input::Timeout(now)) {
                            return format!("webrtc error: {e}");
                        }
                    }
                }
            }
        }
    }

    /// Sends what str0m transmits and handles its events until it asks for a timeout.
    fn drain(&mut self) -> Result<Instant, String> {
        loop {
            match self.rtc.poll_output() {
                Ok(Output::Timeout(t)) => return Ok(t),
                Ok(Output::Transmit(t)) => self.cx.endpoint.send(t.destination, &t.contents),
                Ok(Output::Event(e)) => self.event(e)?,
                Err(e) => return Err(format!("webrtc error: {e}")),
            }
        }
    }

    fn event(&mut self, event: Event) -> Result<(), String> {
        match event {
            Event::Connected => {
                self.connected = true;
                let _ = self.events.try_send(MediaEvent::Connected);
                if !self.playout.lock().samples.is_empty() {
                    self.start_burst(Instant::now());
                }
            }
            Event::IceConnectionStateChange(IceConnectionState::Disconnected) => {
                return Err("ICE disconnected".into());
            }
            Event::MediaAdded(m) if m.kind == MediaKind::Audio && self.audio.is_none() => {
                let params = self.rtc.writer(m.mid).and_then(|w| {
                    w.payload_params()
                        .find(|p| p.spec().codec == Codec::Opus)
                        .copied()
                });
                let Some(params) = params else {
                    return Err("the audio track has no Opus".into());
                };
                self.audio = Some((m.mid, params));
            }
            Event::MediaData(d) => self.audio_in(&d.data),
            Event::ChannelOpen(id, label)
                if self.cx.options.data_channel == DataChannel::Door && self.channel.is_none() =>
            {
                tracing::debug!(peer = %self.cx.ufrag, %label, "webrtc: data channel open");
                self.channel = Some(id);
                let _ = self.events.try_send(MediaEvent::DataOpen);
                while let Some(text) = self.pending_data.pop_front() {
                    self.send_data(text);
                }
            }
            Event::ChannelData(d) if Some(d.id) == self.channel && !d.binary => {
                match String::from_utf8(d.data) {
                    Ok(text) => self.deliver(MediaEvent::Data(text)),
                    Err(_) => {
                        tracing::debug!(peer = %self.cx.ufrag, "webrtc: data channel text is not UTF-8");
                    }
                }
            }
            Event::ChannelClose(id) if Some(id) == self.channel => {
                return Err("the data channel closed".into());
            }
            Event::ChannelData(d)
                if self.cx.options.data_channel == DataChannel::PingPong
                    && !d.binary
                    && d.data == PING =>
            {
                self.pong(d.id);
            }
            _ => {}
        }
        Ok(())
    }

    /// A data channel message must reach the door: wait a little for room, then give up on it.
    fn deliver(&mut self, event: MediaEvent) {
        match self.events.try_send(event) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(event)) => {
                let tx = self.events.clone();
                // The door is behind by a whole queue of events; a short wait off this task
                // keeps RTP flowing.
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(DATA_WAIT, tx.send(event)).await;
                });
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    fn receive(&mut self, d: &Datagram) {
        let Ok(contents) = d.data.as_slice().try_into() else {
            return;
        };
        let input = Input::Receive(
            d.at,
            Receive {
                proto: Protocol::Udp,
                source: d.source,
                destination: self.local_addr(),
                contents,
            },
        );
        if let Err(e) = self.rtc.handle_input(input) {
            tracing::debug!(peer = %self.cx.ufrag, error = %e, "webrtc: bad input");
        }
    }

    fn local_addr(&self) -> SocketAddr {
        self.cx.endpoint.local_addr()
    }

    fn remote_candidate(&mut self, line: &str) {
        let line = line.trim().trim_start_matches("a=");
        if line.is_empty() {
            // An empty candidate is the end-of-candidates marker.
            return;
        }
        // Connected: the path is chosen, more candidates change nothing. Beyond the cap: a
        // client sending them without end.
        if self.connected || self.remote_candidates >= MAX_REMOTE_CANDIDATES {
            self.stats
                .candidates_ignored
                .fetch_add(1, Ordering::Relaxed);
            self.cx.endpoint.metrics().webrtc_candidate_ignored();
            return;
        }
        match Candidate::from_sdp_string(line) {
            Ok(c) => {
                self.remote_candidates += 1;
                self.rtc.add_remote_candidate(c);
            }
            // mDNS (`.local`) candidates cannot be resolved here; the peer's checks reach us
            // anyway and ICE learns its address from them (a peer-reflexive candidate).
            Err(e) => {
                tracing::debug!(peer = %self.cx.ufrag, error = %e, "webrtc: remote candidate ignored");
            }
        }
    }

    /// Answers a `ping` on channel `id` ([`DataChannel::PingPong`]). A client that sends pings
    /// faster than it reads the answers fills the channel's send buffer; further pongs are then
    /// dropped, so the buffer stays bounded.
    fn pong(&mut self, id: ChannelId) {
        let Some(mut channel) = self.rtc.channel(id) else {
            return;
        };
        match channel.write(false, PONG) {
            Ok(true) => {}
            Ok(false) => {
                tracing::debug!(peer = %self.cx.ufrag, "webrtc: data channel full, pong dropped");
            }
            Err(e) => {
                tracing::debug!(peer = %self.cx.ufrag, error = %e, "webrtc: pong not sent");
            }
        }
    }

    fn send_data(&mut self, text: String) {
        let Some(id) = self.channel else {
            if self.pending_data.len() < MAX_PENDING_DATA {
                self.pending_data.push_back(text);
            }
            return;
        };
        if let Some(mut channel) = self.rtc.channel(id)
            && let Err(e) = channel.write(false, text.as_bytes())
        {
            tracing::debug!(peer = %self.cx.ufrag, error = %e, "webrtc: data channel write failed");
        }
    }

    /// Decodes the client's Opus to the door's rate.
    fn audio_in(&mut self, packet: &[u8]) {
        let rate = self.cx.options.input_rate;
        if self.decoder.is_none() {
            match OpusDecoder::new(rate, codec_backend()) {
                Ok(d) => self.decoder = Some(d),
                Err(e) => {
                    tracing::warn!(error = %e, "webrtc: no Opus decoder");
                    return;
                }
            }
        }
        let Some(decoder) = self.decoder.as_mut() else {
            return;
        };
        let Ok(pcm) = decoder.decode(packet) else {
            return;
        };
        self.stats.frames_in.fetch_add(1, Ordering::Relaxed);
        if self
            .events
            .try_send(MediaEvent::Audio(pcm.to_vec()))
            .is_err()
        {
            self.stats.dropped_in.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Reply audio arrived after a pause: frames go out from now, and the RTP clock skips the
    /// pause (it runs on through silence, so the receiver's jitter buffer sees the gap as
    /// time, not as lost packets).
    fn start_burst(&mut self, now: Instant) {
        if let Some(last) = self.last_frame_at {
            let gap = now.saturating_duration_since(last);
            let frames = u64::try_from(gap.as_micros() / FRAME.as_micros()).unwrap_or(0);
            self.rtp_ticks = self
                .rtp_ticks
                .wrapping_add(frames.saturating_sub(1).saturating_mul(FRAME_TICKS));
        }
        self.next_due = Some(now);
    }

    /// Sends every reply frame that is due; goes idle when the queue is empty.
    fn pace(&mut self, now: Instant) {
        while let Some(due) = self.next_due {
            if due > now {
                return;
            }
            let late = now.saturating_duration_since(due);
            let mut frame = [0i16; FRAME_SAMPLES];
            {
                let mut p = self.playout.lock();
                if p.samples.is_empty() {
                    drop(p);
                    self.next_due = None;
                    return;
                }
                let n = p.samples.len().min(FRAME_SAMPLES);
                for (slot, s) in frame.iter_mut().zip(p.samples.drain(..n)) {
                    *slot = s;
                }
            }
            if late > LATE {
                self.stats.late_frames.fetch_add(1, Ordering::Relaxed);
            }
            self.stats.max_late_us.fetch_max(
                u64::try_from(late.as_micros()).unwrap_or(u64::MAX),
                Ordering::Relaxed,
            );
            self.send_frame(now, &frame);
            self.rtp_ticks = self.rtp_ticks.wrapping_add(FRAME_TICKS);
            if late > RESYNC {
                // Far behind: start a new schedule rather than bursting to catch up, and let
                // the RTP clock skip what was not sent in time, as a real pause.
                self.next_due = Some(now + FRAME);
                let behind = u64::try_from(late.as_micros() / FRAME.as_micros()).unwrap_or(0);
                self.rtp_ticks = self
                    .rtp_ticks
                    .wrapping_add(behind.saturating_mul(FRAME_TICKS));
            } else {
                self.next_due = Some(due + FRAME);
            }
        }
    }

    fn send_frame(&mut self, now: Instant, frame: &[i16]) {
        let Some((mid, params)) = self.audio else {
            return;
        };
        if self.encoder.is_none() {
            let config = OpusEncoderConfig {
                sample_rate: ENCODE_RATE,
                frame_duration: FrameDuration::Ms20,
                bitrate: 32_000,
                complexity: ENCODE_COMPLEXITY,
                cbr: false,
                application: OpusApplication::Voip,
                backend: codec_backend(),
            };
            match OpusEncoder::new(config) {
                Ok(e) => self.encoder = Some(e),
                Err(e) => {
                    tracing::warn!(error = %e, "webrtc: no Opus encoder");
                    return;
                }
            }
        }
        self.last_frame_at = Some(now);
        let Some(encoder) = self.encoder.as_mut() else {
            return;
        };
        let Ok(packet) = encoder.encode(frame) else {
            return;
        };
        let packet = packet.to_vec();
        let time = MediaTime::new(self.rtp_ticks, Frequency::FORTY_EIGHT_KHZ);
        if let Some(writer) = self.rtc.writer(mid)
            && writer.write(params.pt(), now, time, packet).is_ok()
        {
            self.stats.frames_out.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// libopus when the server is built with it (its state is a tenth of opus-rs's, which sizes
/// every encoder and decoder for 48 kHz stereo: with hundreds of connections that is what
/// decides whether the codecs run from cache), else the pure-Rust codec.
fn codec_backend() -> OpusBackend {
    if OpusBackend::Libopus.is_available() {
        OpusBackend::Libopus
    } else {
        OpusBackend::Pure
    }
}
