//! Load generation: many Xiaozhi devices from one process, each speaking in bursts at real
//! time and timing the server's answers.
//!
//! Each session plays the firmware's auto mode: hello, `listen start auto`, then a **burst**:
//! the WAV (by default a 2.09 s spoken question with a 140 ms pause after "Hello.") and 2 s of
//! silence, as 60 ms Opus frames at real time. The frames are encoded once and shared by every
//! session. Per burst the session records:
//!
//! - **end of speech**: the end of the last voiced frame (RMS above a tenth of the loudest
//!   frame's, as the WebRTC load does) — frame `i` goes out at `start + i × 60 ms` and its
//!   audio ends one frame later;
//! - end of speech → `tts start`, and → the first binary (audio) frame after it;
//! - a **cut** utterance: `tts start` before the voiced part was all sent (the server ended the
//!   turn at a pause and answered half a question);
//! - an **unanswered** burst: no `tts start` within `answer_timeout` after the burst's last
//!   frame.
//!
//! Like the device, the session stops sending at `tts start`, and after `tts stop` sends
//! `listen start` and the next burst at once: open loop, the bursts wait on nothing but the
//! server's answers (and the timeout when there is none). After `seconds` no new burst starts;
//! the bursts in flight finish (answer or timeout), so every burst is judged.
//!
//! It is meant to be cheap: the handshakes run on the caller's async runtime, and then one
//! driver thread (by default) runs every session from a single poll loop (`driver`): every
//! burst starts on a shared 10 ms grid, so all sessions' frame slots fall on its ticks and one
//! wake-up sends whatever is due; the Opus frames are encoded once and written as prebuilt,
//! freshly masked WebSocket frames with one `write` each; a readable socket gets one read and
//! its frames are parsed in place; reply audio is only counted, never decoded. The summary
//! says what the client itself cost (`client_cpu_percent_of_one_core` and
//! `client_cpu_us_per_message`, from `/proc/self/stat`).

mod driver;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use serde::Serialize;
use tokio::time::{Instant, sleep_until};
use tokio_tungstenite::MaybeTlsStream;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use voxgate_xiaozhi::control::{DeviceMessage, Listen, ListenMode};
use voxgate_xiaozhi::frame::{Frame, FrameCodec, ProtocolVersion};

use crate::audio;
use crate::chaos::voiced_frames;
use crate::webrtc::load::percentile;
use crate::ws;
use crate::xiaozhi::{self, UPLINK_FRAME, UPLINK_RATE};
use driver::Handoff;

/// The default burst's speech: "Hello." a 140 ms pause, "What will the weather be like
/// tomorrow?" (espeak-ng, 16 kHz mono, 2.09 s; `crates/voxgate-audio/tests/fixtures/
/// question.wav`, made by `make-fixtures.sh` there), built in so the command needs no file.
pub const DEFAULT_WAV: &[u8] =
    include_bytes!("../../../crates/voxgate-audio/tests/fixtures/question.wav");

/// Uplink frames sent later than this after their slot count as late sends (client overload).
const SEND_SLACK: Duration = Duration::from_millis(30);
/// Downlink frames later than this after their playback slot count as late (audible gaps).
const PLAY_SLACK: Duration = Duration::from_millis(30);
/// How long a session waits for the server's hello.
const HELLO_WAIT: Duration = Duration::from_secs(10);

/// What load to generate.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// The Xiaozhi WebSocket URL.
    pub url: String,
    /// Concurrent sessions.
    pub sessions: usize,
    /// How long sessions start bursts; the bursts in flight then finish.
    pub seconds: u64,
    /// The speech of a burst ([`DEFAULT_WAV`] when `None`).
    pub wav: Option<PathBuf>,
    /// Silence streamed after the speech, so the server's VAD ends the utterance.
    pub silence: Duration,
    /// A burst with no `tts start` this long after its last frame is unanswered; an answer
    /// with no `tts stop` this long after its last message is unfinished.
    pub answer_timeout: Duration,
    /// Sessions start spread over this long, so connections do not all land at once.
    pub ramp: Duration,
    /// Binary protocol version.
    pub protocol_version: u8,
    /// Driver threads (each runs its share of the sessions after their handshake).
    pub threads: usize,
}

impl LoadOptions {
    /// `sessions` devices on `url` for `seconds` with the default burst, a 5 s ramp and a
    /// 10 s answer timeout.
    #[must_use]
    pub fn new(url: impl Into<String>, sessions: usize, seconds: u64) -> Self {
        Self {
            url: url.into(),
            sessions,
            seconds,
            wav: None,
            silence: Duration::from_secs(2),
            answer_timeout: Duration::from_secs(10),
            ramp: Duration::from_secs(5),
            protocol_version: 1,
            threads: 1,
        }
    }
}

/// A burst's timing, as offsets from its first frame's slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BurstPlan {
    /// The index of the last voiced frame (`None`: the WAV is silent).
    pub last_voiced: Option<usize>,
    /// End of speech: the end of the last voiced frame's slot.
    pub speech_end: Duration,
    /// The whole burst, speech and silence.
    pub len: Duration,
    /// See [`LoadOptions::answer_timeout`].
    pub answer_timeout: Duration,
}

impl BurstPlan {
    /// The plan of a burst whose frames are `voiced` or not, `frame` long each.
    #[must_use]
    pub fn new(voiced: &[bool], frame: Duration, answer_timeout: Duration) -> Self {
        let last_voiced = voiced.iter().rposition(|v| *v);
        let n = |k: usize| u32::try_from(k).unwrap_or(u32::MAX);
        Self {
            last_voiced,
            speech_end: frame * n(last_voiced.map_or(0, |i| i + 1)),
            len: frame * n(voiced.len()),
            answer_timeout,
        }
    }
}

/// How a burst ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// `tts start` after the end of speech, and `tts stop` after it.
    Answered {
        /// End of speech → `tts start`.
        to_tts_start: Duration,
        /// End of speech → the first audio frame (`None`: the reply had no audio).
        to_first_audio: Option<Duration>,
    },
    /// `tts start` before the voiced part was all sent.
    Cut,
    /// No `tts start` within the answer timeout after the burst.
    Unanswered,
    /// An answer began but no `tts stop` came within the answer timeout of its last message.
    Unfinished {
        /// The answer began before the speech was all sent.
        cut: bool,
    },
    /// The session failed while the burst was in flight.
    Lost,
}

/// One burst's bookkeeping. It is fed what happened, as offsets from the burst's start, and
/// decides the [`Outcome`]; it reads no clock, so it is tested with made-up times.
#[derive(Debug, Clone, Copy)]
pub struct BurstTracker {
    plan: BurstPlan,
    /// When the last voiced frame went out.
    voiced_sent: Option<Duration>,
    tts_start: Option<Duration>,
    first_audio: Option<Duration>,
    /// The answer's latest message (`tts start`, audio, other `tts` states).
    last_reply: Option<Duration>,
}

impl BurstTracker {
    /// A burst just starting.
    #[must_use]
    pub fn new(plan: BurstPlan) -> Self {
        Self {
            plan,
            voiced_sent: None,
            tts_start: None,
            first_audio: None,
            last_reply: None,
        }
    }

    /// Frame `index` went out at `at`.
    pub fn frame_sent(&mut self, index: usize, at: Duration) {
        if Some(index) == self.plan.last_voiced {
            self.voiced_sent = Some(at);
        }
    }

    /// Whether the last voiced frame has gone out (a silent WAV has none to send).
    #[must_use]
    pub fn speech_sent(&self) -> bool {
        self.voiced_sent.is_some() || self.plan.last_voiced.is_none()
    }

    /// `tts start` arrived at `at` (a repeat is ignored).
    pub fn tts_start(&mut self, at: Duration) {
        if self.tts_start.is_none() {
            self.tts_start = Some(at);
        }
        self.last_reply = Some(at);
    }

    /// Whether the answer has begun.
    #[must_use]
    pub fn answering(&self) -> bool {
        self.tts_start.is_some()
    }

    /// Another message of the answer (an audio frame when `audio`) arrived at `at`.
    pub fn reply(&mut self, at: Duration, audio: bool) {
        if self.tts_start.is_some() {
            if audio && self.first_audio.is_none() {
                self.first_audio = Some(at);
            }
            self.last_reply = Some(at);
        }
    }

    fn cut(&self) -> bool {
        match (self.tts_start, self.plan.last_voiced) {
            (Some(_), None) => false,
            (Some(start), Some(_)) => self.voiced_sent.is_none_or(|sent| start < sent),
            (None, _) => false,
        }
    }

    /// `tts stop` arrived: the burst's outcome (`None` when no answer had begun: a stray stop).
    #[must_use]
    pub fn tts_stop(&self) -> Option<Outcome> {
        let start = self.tts_start?;
        if self.cut() {
            return Some(Outcome::Cut);
        }
        let end = self.plan.speech_end;
        Some(Outcome::Answered {
            to_tts_start: start.saturating_sub(end),
            to_first_audio: self.first_audio.map(|a| a.saturating_sub(end)),
        })
    }

    /// When the burst is given up if nothing more arrives: the answer timeout after the burst
    /// (no answer yet) or after the answer's last message.
    #[must_use]
    pub fn deadline(&self) -> Duration {
        match self.last_reply {
            Some(last) => last + self.plan.answer_timeout,
            None => self.plan.len + self.plan.answer_timeout,
        }
    }

    /// The outcome when [`deadline`](Self::deadline) passed.
    #[must_use]
    pub fn expired(&self) -> Outcome {
        if self.answering() {
            Outcome::Unfinished { cut: self.cut() }
        } else {
            Outcome::Unanswered
        }
    }
}

/// Counters of one session.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SessionStats {
    /// The server answered the hello.
    pub connected: bool,
    /// Opus frames sent.
    pub frames_sent: u64,
    /// Frames sent more than 30 ms after their slot (the client fell behind).
    pub late_sends: u64,
    /// Binary (audio) frames received.
    pub reply_frames: u64,
    /// Text (JSON) messages sent and received.
    pub text_messages: u64,
    /// Received frames that arrived after their playback slot (gaps a listener would hear).
    pub late_frames: u64,
    /// The worst lateness, in milliseconds.
    pub max_late_ms: u64,
    /// `tts stop`s received.
    pub turns: u64,
    /// Bursts judged.
    pub bursts: u64,
    /// Bursts answered after the end of speech and finished.
    pub answered: u64,
    /// Bursts answered before the speech was all sent.
    pub cut: u64,
    /// Bursts with no answer in time.
    pub unanswered: u64,
    /// Answers with no `tts stop` in time.
    pub unfinished: u64,
    /// Bursts in flight when the session failed.
    pub lost: u64,
    /// Answers that finished without a single audio frame.
    pub silent_answers: u64,
    /// End of speech → `tts start` per answered burst, in microseconds.
    #[serde(skip)]
    pub tts_start_us: Vec<u32>,
    /// End of speech → first audio frame per answered burst, in microseconds.
    #[serde(skip)]
    pub first_audio_us: Vec<u32>,
    /// What went wrong, if anything.
    pub error: Option<String>,
}

impl SessionStats {
    /// Counts a burst's outcome.
    pub fn record(&mut self, outcome: Outcome) {
        let us = |d: Duration| u32::try_from(d.as_micros()).unwrap_or(u32::MAX);
        self.bursts += 1;
        match outcome {
            Outcome::Answered {
                to_tts_start,
                to_first_audio,
            } => {
                self.answered += 1;
                self.tts_start_us.push(us(to_tts_start));
                match to_first_audio {
                    Some(d) => self.first_audio_us.push(us(d)),
                    None => self.silent_answers += 1,
                }
            }
            Outcome::Cut => self.cut += 1,
            Outcome::Unanswered => self.unanswered += 1,
            Outcome::Unfinished { cut } => {
                self.unfinished += 1;
                self.cut += u64::from(cut);
            }
            Outcome::Lost => self.lost += 1,
        }
    }
}

/// The totals printed at the end.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LoadSummary {
    /// Sessions started.
    pub sessions: usize,
    /// Sessions whose hello was answered.
    pub connected: usize,
    /// Seconds during which sessions started bursts.
    pub seconds: u64,
    /// The speech of a burst, seconds (the WAV).
    pub speech_seconds: f64,
    /// A whole burst (speech and silence), seconds.
    pub burst_seconds: f64,
    /// Bursts judged, all sessions.
    pub bursts: u64,
    /// Bursts answered after the end of speech, with `tts stop`.
    pub answered: u64,
    /// Answered bursts as a share of all bursts, percent.
    pub turns_done_percent: f64,
    /// Cut utterances: `tts start` before the burst's speech was all sent.
    pub cut: u64,
    /// Bursts with no `tts start` within the answer timeout.
    pub unanswered: u64,
    /// Answers with no `tts stop` within the answer timeout of their last message.
    pub unfinished: u64,
    /// Bursts in flight when their session failed.
    pub lost: u64,
    /// Answers with no audio frame.
    pub silent_answers: u64,
    /// End of speech → `tts start`, median, ms.
    pub tts_start_latency_ms_p50: Option<f64>,
    /// 99th percentile, ms.
    pub tts_start_latency_ms_p99: Option<f64>,
    /// The worst, ms.
    pub tts_start_latency_ms_max: Option<f64>,
    /// End of speech → first audio frame, median, ms.
    pub first_audio_latency_ms_p50: Option<f64>,
    /// 99th percentile, ms.
    pub first_audio_latency_ms_p99: Option<f64>,
    /// The worst, ms.
    pub first_audio_latency_ms_max: Option<f64>,
    /// Opus frames sent, all sessions.
    pub frames_sent: u64,
    /// Frames sent late by the client (> 30 ms after their slot).
    pub late_sends: u64,
    /// Audio frames received, all sessions.
    pub reply_frames: u64,
    /// Text (JSON) messages sent and received, all sessions.
    pub text_messages: u64,
    /// Received frames late for playback (> 30 ms after their slot).
    pub late_frames: u64,
    /// The worst lateness of any received frame, ms.
    pub max_late_ms: u64,
    /// `tts stop`s received, all sessions.
    pub turns: u64,
    /// The fewest `tts stop`s any connected session got.
    pub min_turns: u64,
    /// Sessions that ended with an error.
    pub sessions_with_errors: usize,
    /// Up to ten distinct errors.
    pub errors: Vec<String>,
    /// Wall time from the first session's start to the last one's end, seconds.
    pub wall_seconds: f64,
    /// CPU time the client process used over that time (user + system), seconds.
    pub client_cpu_seconds: f64,
    /// Of it, in the client's own code (user).
    pub client_cpu_user_seconds: f64,
    /// Of it, in the kernel (system): mostly TCP, one send per frame; on loopback the
    /// receiving side's protocol work runs in the sender's system call too.
    pub client_cpu_system_seconds: f64,
    /// The same as a share of one core, percent.
    pub client_cpu_percent_of_one_core: f64,
    /// The same per 1,000 sessions (the client's goal: at most 10 %).
    pub client_cpu_percent_per_1000_sessions: f64,
    /// CPU per WebSocket message (frames sent and received, text included), microseconds:
    /// what the generator costs independent of how fast the server answers.
    pub client_cpu_us_per_message: f64,
}

/// A percentile of microsecond samples, in milliseconds to 0.1.
fn ms(sorted: &[u64], p: usize) -> Option<f64> {
    percentile(sorted, p).map(|us| (us as f64 / 100.0).round() / 10.0)
}

impl LoadSummary {
    /// Adds up the sessions' counters.
    #[must_use]
    pub fn from_sessions(seconds: u64, stats: &[SessionStats]) -> Self {
        let mut s = Self {
            sessions: stats.len(),
            seconds,
            min_turns: u64::MAX,
            ..Self::default()
        };
        let mut to_start = Vec::new();
        let mut to_audio = Vec::new();
        for st in stats {
            s.connected += usize::from(st.connected);
            s.frames_sent += st.frames_sent;
            s.late_sends += st.late_sends;
            s.reply_frames += st.reply_frames;
            s.text_messages += st.text_messages;
            s.late_frames += st.late_frames;
            s.max_late_ms = s.max_late_ms.max(st.max_late_ms);
            s.turns += st.turns;
            s.bursts += st.bursts;
            s.answered += st.answered;
            s.cut += st.cut;
            s.unanswered += st.unanswered;
            s.unfinished += st.unfinished;
            s.lost += st.lost;
            s.silent_answers += st.silent_answers;
            to_start.extend(st.tts_start_us.iter().map(|&v| u64::from(v)));
            to_audio.extend(st.first_audio_us.iter().map(|&v| u64::from(v)));
            if st.connected {
                s.min_turns = s.min_turns.min(st.turns);
            }
            if let Some(e) = &st.error {
                s.sessions_with_errors += 1;
                if s.errors.len() < 10 && !s.errors.contains(e) {
                    s.errors.push(e.clone());
                }
            }
        }
        if s.min_turns == u64::MAX {
            s.min_turns = 0;
        }
        if s.bursts > 0 {
            s.turns_done_percent = (s.answered as f64 * 1000.0 / s.bursts as f64).round() / 10.0;
        }
        to_start.sort_unstable();
        to_audio.sort_unstable();
        s.tts_start_latency_ms_p50 = ms(&to_start, 50);
        s.tts_start_latency_ms_p99 = ms(&to_start, 99);
        s.tts_start_latency_ms_max = ms(&to_start, 100);
        s.first_audio_latency_ms_p50 = ms(&to_audio, 50);
        s.first_audio_latency_ms_p99 = ms(&to_audio, 99);
        s.first_audio_latency_ms_max = ms(&to_audio, 100);
        s
    }
}

/// The burst every session streams: framed Opus packets (speech then silence), which are
/// voiced, and the timing plan.
#[derive(Debug, Clone)]
pub struct Burst {
    /// One prebuilt binary frame per 60 ms.
    pub frames: Vec<Bytes>,
    /// Per frame: whether it carries speech.
    pub voiced: Vec<bool>,
    /// The timing.
    pub plan: BurstPlan,
    /// The speech alone, seconds.
    pub speech_seconds: f64,
}

impl Burst {
    /// Encodes `samples` (16 kHz mono) and `silence` after them for `version`'s framing.
    ///
    /// # Errors
    /// An encoder failure.
    pub fn new(
        samples: &[f32],
        silence: Duration,
        version: ProtocolVersion,
        answer_timeout: Duration,
    ) -> anyhow::Result<Self> {
        let codec = FrameCodec::new(version);
        let frame_len = audio::frame_samples(UPLINK_RATE, UPLINK_FRAME);
        // The speech padded to whole frames, then whole frames of silence.
        let speech_frames = samples.len().div_ceil(frame_len.max(1));
        let silence_frames =
            usize::try_from(silence.as_micros().div_ceil(UPLINK_FRAME.as_micros())).unwrap_or(0);
        let mut all = samples.to_vec();
        all.resize((speech_frames + silence_frames) * frame_len, 0.0);
        let mut voiced = voiced_frames(samples, frame_len);
        voiced.resize(speech_frames + silence_frames, false);
        let mut frames = Vec::with_capacity(voiced.len());
        for packet in xiaozhi::encode_opus(&all)? {
            let mut buf = Vec::new();
            codec
                .encode(&Frame::opus(&packet), &mut buf)
                .context("framing")?;
            frames.push(Bytes::from(buf));
        }
        anyhow::ensure!(
            frames.len() == voiced.len(),
            "{} Opus frames but {} analysed",
            frames.len(),
            voiced.len()
        );
        Ok(Self {
            plan: BurstPlan::new(&voiced, UPLINK_FRAME, answer_timeout),
            frames,
            voiced,
            speech_seconds: samples.len() as f64 / f64::from(UPLINK_RATE),
        })
    }

    /// The burst of `opts`: its WAV (or the built-in question) and silence.
    ///
    /// # Errors
    /// An unreadable WAV or an encoder failure.
    pub fn for_options(opts: &LoadOptions) -> anyhow::Result<Self> {
        let version = ProtocolVersion::from_number(u64::from(opts.protocol_version))
            .context("protocol version")?;
        let samples = match &opts.wav {
            Some(path) => audio::load_wav(path, UPLINK_RATE)?,
            None => {
                let wav = voxgate_audio::wav::read_wav(DEFAULT_WAV).context("built-in WAV")?;
                audio::resample(&wav.to_mono(), wav.sample_rate, UPLINK_RATE)?
            }
        };
        Self::new(&samples, opts.silence, version, opts.answer_timeout)
    }
}

/// The user and system CPU time of this process so far, seconds, from `/proc/self/stat`
/// (Linux; zero elsewhere).
pub(crate) fn own_cpu_seconds(ticks_per_second: u64) -> (f64, f64) {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return (0.0, 0.0);
    };
    // Fields after the parenthesised command name: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| -> u64 { fields.get(n - 3).and_then(|f| f.parse().ok()).unwrap_or(0) };
    let tick = ticks_per_second.max(1) as f64;
    (field(14) as f64 / tick, field(15) as f64 / tick)
}

/// Runs the load and returns the summary.
///
/// The sessions connect (the WebSocket handshake) as tasks on the caller's runtime, each at
/// its place in the ramp, and are then handed to the driver threads (`threads` of them, one
/// by default), which run everything after the handshake (`driver`).
///
/// # Errors
/// Only when the WAV cannot be read or encoded or a driver thread cannot start; session
/// failures are counted, not returned.
pub async fn run(opts: &LoadOptions) -> anyhow::Result<LoadSummary> {
    let version = ProtocolVersion::from_number(u64::from(opts.protocol_version))
        .context("protocol version")?;
    let burst = Burst::for_options(opts)?;
    let ticks = crate::procstat::clock_ticks();
    let n = opts.sessions.max(1);
    let threads = opts.threads.clamp(1, n);
    let step = opts.ramp / u32::try_from(n).unwrap_or(u32::MAX);
    let cpu_before = own_cpu_seconds(ticks);
    let start = Instant::now();
    let fleet = Arc::new(Fleet {
        url: opts.url.clone(),
        version,
        burst,
        epoch: start,
    });
    let mut senders = Vec::with_capacity(threads);
    let mut drivers = Vec::with_capacity(threads);
    for d in 0..threads {
        let (tx, rx) = std::sync::mpsc::channel();
        let expected = (d..n).step_by(threads).count();
        let fleet = Arc::clone(&fleet);
        let handle = std::thread::Builder::new()
            .name(format!("load-driver-{d}"))
            .spawn(move || driver::run(&fleet, &rx, expected))
            .context("starting a driver thread")?;
        senders.push(tx);
        drivers.push(handle);
    }
    for i in 0..n {
        let fleet = Arc::clone(&fleet);
        let tx = senders[i % threads].clone();
        let begin = start + step * u32::try_from(i).unwrap_or(u32::MAX);
        let end = begin + Duration::from_secs(opts.seconds);
        tokio::spawn(async move {
            sleep_until(begin).await;
            let handoff = match connect(i, &fleet).await {
                Ok(tcp) => Handoff::Open { index: i, tcp, end },
                Err(e) => Handoff::Failed {
                    index: i,
                    stats: SessionStats {
                        error: Some(format!("{e:#}")),
                        ..SessionStats::default()
                    },
                },
            };
            // A driver that is gone has failed; its error is reported below.
            let _ = tx.send(handoff);
        });
    }
    drop(senders);
    let joined = tokio::task::spawn_blocking(move || {
        drivers
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("a driver thread panicked"))?
            })
            .collect::<Vec<_>>()
    })
    .await
    .context("waiting for the drivers")?;
    let mut stats = vec![SessionStats::default(); n];
    for result in joined {
        for (index, s) in result? {
            if let Some(slot) = stats.get_mut(index) {
                *slot = s;
            }
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let cpu_after = own_cpu_seconds(ticks);
    let user = (cpu_after.0 - cpu_before.0).max(0.0);
    let system = (cpu_after.1 - cpu_before.1).max(0.0);
    let cpu = user + system;
    let mut summary = LoadSummary::from_sessions(opts.seconds, &stats);
    summary.speech_seconds = (fleet.burst.speech_seconds * 1000.0).round() / 1000.0;
    summary.burst_seconds = (fleet.burst.plan.len.as_secs_f64() * 1000.0).round() / 1000.0;
    summary.wall_seconds = (wall * 10.0).round() / 10.0;
    summary.client_cpu_seconds = (cpu * 100.0).round() / 100.0;
    summary.client_cpu_user_seconds = (user * 100.0).round() / 100.0;
    summary.client_cpu_system_seconds = (system * 100.0).round() / 100.0;
    if wall > 0.0 {
        let percent = cpu / wall * 100.0;
        summary.client_cpu_percent_of_one_core = (percent * 100.0).round() / 100.0;
        summary.client_cpu_percent_per_1000_sessions =
            (percent * 1000.0 / n as f64 * 100.0).round() / 100.0;
    }
    let messages = summary.frames_sent + summary.reply_frames + summary.text_messages;
    if messages > 0 {
        summary.client_cpu_us_per_message = (cpu * 1e6 / messages as f64 * 10.0).round() / 10.0;
    }
    Ok(summary)
}

/// Session `index`'s WebSocket handshake; returns its socket for a driver (nonblocking).
async fn connect(index: usize, fleet: &Fleet) -> anyhow::Result<std::net::TcpStream> {
    let device_id = format!(
        "02:00:00:{:02x}:{:02x}:{:02x}",
        (index >> 16) & 0xff,
        (index >> 8) & 0xff,
        index & 0xff
    );
    let client_id = format!("0b0c0d0e-0000-4000-8000-{index:012}");
    let headers = xiaozhi::upgrade_headers(&device_id, &client_id, None, fleet.version);
    let config = WebSocketConfig::default()
        .max_message_size(Some(1 << 20))
        .max_frame_size(Some(1 << 20));
    let ws = ws::connect_with(&fleet.url, &headers, HELLO_WAIT, config).await?;
    // The server says nothing before the device's hello, so no frame is left in
    // tungstenite's buffer when the socket changes hands.
    let MaybeTlsStream::Plain(tcp) = ws.into_inner() else {
        anyhow::bail!("the load generator speaks ws:// only");
    };
    Ok(tcp.into_std()?)
}

/// The `listen start auto` of `session_id` (a text message's payload), built once per session.
fn listen_payload(session_id: &str) -> Vec<u8> {
    let mut msg = Listen::start(ListenMode::Auto);
    msg.session_id = Some(session_id.to_owned());
    DeviceMessage::from(msg).to_json().into_bytes()
}

/// What every session shares.
struct Fleet {
    url: String,
    version: ProtocolVersion,
    burst: Burst,
    /// The grid bursts start on (see [`TICK`]).
    epoch: Instant,
}

/// Bursts start on a grid of this step from the run's start, so every frame slot of every
/// session falls on it too (60 ms is a multiple) and the driver wakes at most 100 times a
/// second to send, however many sessions: waking costs more than sending on a virtual machine
/// (a context switch out of idle each time), and 35 sessions on their own slots woke it 600
/// times a second. A burst starts at most this much after `tts stop`.
const TICK: Duration = Duration::from_millis(10);

/// The first point of the grid at or after `now`.
fn on_grid(epoch: Instant, now: Instant) -> Instant {
    let since = now.saturating_duration_since(epoch).as_nanos();
    let tick = TICK.as_nanos();
    let steps = u64::try_from(since.div_ceil(tick)).unwrap_or(u64::MAX / 2);
    epoch + Duration::from_nanos(steps.saturating_mul(u64::try_from(tick).unwrap_or(1)))
}

/// The offset of frame `i`'s slot from its burst's start.
fn slot(i: usize) -> Duration {
    UPLINK_FRAME * u32::try_from(i).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    /// 10 voiced frames of 60 ms (the last one, index 9, ends at 600 ms), then 10 silent:
    /// the burst lasts 1.2 s; 5 s answer timeout.
    fn plan() -> BurstPlan {
        let mut voiced = vec![true; 10];
        voiced[4] = false; // a pause inside the speech does not move its end
        voiced.extend([false; 10]);
        BurstPlan::new(&voiced, MS(60), MS(5000))
    }

    /// A tracker whose frames went out on time up to (not including) `upto`.
    fn sent(upto: usize) -> BurstTracker {
        let mut t = BurstTracker::new(plan());
        for i in 0..upto {
            t.frame_sent(i, MS(60 * i as u64 + 2));
        }
        t
    }

    #[test]
    fn bursts_start_on_the_grid() {
        let epoch = Instant::now();
        assert_eq!(on_grid(epoch, epoch), epoch);
        assert_eq!(on_grid(epoch, epoch + MS(1)), epoch + MS(10));
        assert_eq!(on_grid(epoch, epoch + MS(20)), epoch + MS(20));
        assert_eq!(
            on_grid(epoch, epoch + Duration::from_micros(20_001)),
            epoch + MS(30)
        );
    }

    #[test]
    fn the_plan_ends_speech_at_the_last_voiced_frame() {
        let p = plan();
        assert_eq!(p.last_voiced, Some(9));
        assert_eq!(p.speech_end, MS(600));
        assert_eq!(p.len, MS(1200));
        let silent = BurstPlan::new(&[false; 3], MS(60), MS(1));
        assert_eq!((silent.last_voiced, silent.speech_end), (None, MS(0)));
    }

    #[test]
    fn an_answer_after_the_speech_is_timed_from_its_end() {
        let mut t = sent(15);
        // Stopped streaming at tts start (frame 15 on), answered 450 ms after the speech.
        t.tts_start(MS(1050));
        t.reply(MS(1060), false); // sentence_start
        t.reply(MS(1100), true);
        t.reply(MS(1160), true);
        assert_eq!(
            t.tts_stop(),
            Some(Outcome::Answered {
                to_tts_start: MS(450),
                to_first_audio: Some(MS(500)),
            })
        );
        // An answer without audio.
        let mut t = sent(20);
        t.tts_start(MS(1300));
        assert_eq!(
            t.tts_stop(),
            Some(Outcome::Answered {
                to_tts_start: MS(700),
                to_first_audio: None,
            })
        );
    }

    #[test]
    fn an_answer_before_the_speech_was_sent_is_a_cut() {
        // The VAD ended the turn at the pause (frame 4): the answer comes while frame 7 is
        // the latest sent.
        let mut t = sent(8);
        t.tts_start(MS(470));
        t.reply(MS(500), true);
        assert_eq!(t.tts_stop(), Some(Outcome::Cut));
        // Arriving between the last voiced frame's send and its slot's end is not a cut.
        let mut t = sent(10);
        t.tts_start(MS(590));
        assert_eq!(
            t.tts_stop(),
            Some(Outcome::Answered {
                to_tts_start: MS(0),
                to_first_audio: None
            })
        );
    }

    #[test]
    fn silence_after_the_burst_is_unanswered_at_the_timeout() {
        let t = sent(20);
        assert_eq!(t.deadline(), MS(1200 + 5000));
        assert_eq!(t.expired(), Outcome::Unanswered);
        // A stray tts stop without a start decides nothing.
        assert_eq!(t.tts_stop(), None);
    }

    #[test]
    fn an_answer_that_never_stops_is_unfinished_after_its_last_message() {
        let mut t = sent(12);
        t.tts_start(MS(900));
        t.reply(MS(1000), true);
        t.reply(MS(2000), true);
        assert_eq!(t.deadline(), MS(2000 + 5000));
        assert_eq!(t.expired(), Outcome::Unfinished { cut: false });
        let mut t = sent(3);
        t.tts_start(MS(200));
        assert_eq!(t.deadline(), MS(5200));
        assert_eq!(t.expired(), Outcome::Unfinished { cut: true });
        // Audio before any tts start is not the answer's.
        let mut t = sent(20);
        t.reply(MS(1500), true);
        assert_eq!(t.deadline(), MS(6200));
    }

    #[test]
    fn outcomes_add_up_to_percentiles_and_shares() {
        let mut a = SessionStats {
            connected: true,
            turns: 3,
            frames_sent: 10,
            ..SessionStats::default()
        };
        for ms in [500, 600, 700] {
            a.record(Outcome::Answered {
                to_tts_start: MS(ms),
                to_first_audio: Some(MS(ms + 40)),
            });
        }
        a.record(Outcome::Cut);
        let mut b = SessionStats {
            connected: true,
            turns: 1,
            late_frames: 1,
            max_late_ms: 40,
            ..SessionStats::default()
        };
        b.record(Outcome::Answered {
            to_tts_start: MS(800),
            to_first_audio: None,
        });
        b.record(Outcome::Unanswered);
        b.record(Outcome::Unfinished { cut: true });
        let c = SessionStats {
            error: Some("refused".into()),
            ..SessionStats::default()
        };
        let mut d = c.clone();
        d.record(Outcome::Lost);
        let s = LoadSummary::from_sessions(30, &[a, b, c, d]);
        assert_eq!((s.sessions, s.connected, s.frames_sent), (4, 2, 10));
        assert_eq!((s.bursts, s.answered, s.cut, s.unanswered), (8, 4, 2, 1));
        assert_eq!((s.unfinished, s.lost, s.silent_answers), (1, 1, 1));
        assert_eq!(s.turns_done_percent, 50.0);
        assert_eq!(s.tts_start_latency_ms_p50, Some(600.0));
        assert_eq!(s.tts_start_latency_ms_p99, Some(800.0));
        assert_eq!(s.tts_start_latency_ms_max, Some(800.0));
        assert_eq!(s.first_audio_latency_ms_p50, Some(640.0));
        assert_eq!(s.first_audio_latency_ms_max, Some(740.0));
        assert_eq!(
            (s.turns, s.min_turns, s.late_frames, s.max_late_ms),
            (4, 1, 1, 40)
        );
        assert_eq!((s.sessions_with_errors, s.errors.len()), (2, 1));
        let empty = LoadSummary::from_sessions(1, &[]);
        assert_eq!((empty.min_turns, empty.turns_done_percent), (0, 0.0));
        assert_eq!(empty.tts_start_latency_ms_p50, None);
    }

    #[test]
    fn the_built_in_question_is_one_utterance_with_a_short_pause() {
        let burst = Burst::for_options(&LoadOptions::new("ws://h/", 1, 1)).unwrap();
        assert!(
            (2.0..2.2).contains(&burst.speech_seconds),
            "{}",
            burst.speech_seconds
        );
        // 35 frames of speech (2.1 s), 34 of silence (2.04 s).
        assert_eq!(burst.frames.len(), 69);
        assert_eq!(burst.plan.len, MS(69 * 60));
        let last = burst.plan.last_voiced.unwrap();
        assert!((33..35).contains(&last), "{last}");
        // "Hello." then at most 3 unvoiced 60 ms frames (the pause is 140 ms), then the rest.
        let first_gap = burst.voiced.iter().position(|v| !v).unwrap();
        let gap = burst.voiced[first_gap..].iter().position(|v| *v).unwrap();
        assert!(first_gap >= 5 && gap <= 3, "{:?}", burst.voiced);
        assert!(
            burst.voiced[first_gap + gap..=last]
                .iter()
                .filter(|v| !**v)
                .count()
                <= 2
        );
    }
}
