//! WebRTC: the client side of the VIP browser door (`POST /webrtc/offer`, data channel `vip`,
//! `docs/doors/vip.md`) and of the Gemini bridge's WebRTC signalling (`WEBRTC_OFFER` /
//! `WEBRTC_ANSWER` / `WEBRTC_ICE_CANDIDATE` over the `/gemini` WebSocket), on str0m as the
//! offerer.
//!
//! One UDP socket per session, bound to a loopback (or given) address, its host candidate in
//! the offer, so the server needs no trickled candidates from us. A spoken turn is a WAV
//! encoded once into 20 ms Opus frames at 48 kHz, sent at real time, then silence so the
//! server's VAD ends the turn; the reply track's Opus is counted (and decoded when it is
//! saved). Per session the client measures what a listener would notice: the first-audio
//! latency (end of the last voiced frame sent to the first reply RTP packet), packets lost (gaps in the
//! RTP sequence) and late (arriving after a listener with a 40 ms jitter buffer would have played
//! them; see [`ReplyClock`]). Arrival is the kernel's receive time (`SO_TIMESTAMPNS`), so a
//! busy client does not count its own delays as the server's.

pub mod load;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use str0m::change::{SdpAnswer, SdpOffer, SdpPendingOffer};
use str0m::channel::ChannelId;
use str0m::format::Codec;
use str0m::media::{Direction, Frequency, MediaData, MediaKind, MediaTime, Mid, Pt};
use str0m::net::{Protocol, Receive};
use str0m::{Candidate, Event, IceConnectionState, Input, Output, Rtc, RtcConfig};
use tokio::net::UdpSocket;
use tokio_tungstenite::tungstenite::Message;
use voxgate_audio::opus::{
    FrameDuration, OpusBackend, OpusDecoder, OpusEncoder, OpusEncoderConfig,
};
use voxgate_audio::resample::Resampler;
use voxgate_gemini::{ClientMessage, Part, ServerMessage};

use crate::audio;
use crate::events::{Events, redact_audio};
use crate::gemini::GeminiOptions;
use crate::ws::{self, Ws};

/// The rate audio is encoded and decoded at (Opus' RTP clock is always 48 kHz, RFC 7587).
pub const RATE: u32 = 48_000;
/// One RTP frame.
pub const FRAME: Duration = Duration::from_millis(20);
/// Samples (and RTP ticks) of one frame at 48 kHz.
pub const FRAME_SAMPLES: usize = 960;
/// Silence sent after the WAV so the server's VAD ends the turn.
pub const SILENCE_TAIL: Duration = Duration::from_millis(1500);
/// The jitter buffer of the listener the client stands in for: a reply packet arriving more than
/// this long after its time on the reply's clock is late (it would be concealed, not played).
/// 40 ms is about what a browser's adaptive buffer holds on a quiet LAN; a buffer that small
/// is the strict end of what real receivers use.
pub const JITTER_BUFFER: Duration = Duration::from_millis(40);
/// Reply packets arriving this long after the previous one, mid-reply, count as a long gap
/// (the stricter figure: no buffer at all beyond one frame).
pub const LONG_GAP: Duration = Duration::from_millis(40);
/// How long the client stays after the last reply before it hangs up.
const END_TAIL: Duration = Duration::from_millis(300);
/// Frames sent this long after their slot count as late sends (the client fell behind).
const SEND_SLACK: Duration = Duration::from_millis(30);
/// Largest UDP datagram read.
const MAX_DATAGRAM: usize = 2048;
/// Largest HTTP answer body read.
const MAX_ANSWER_BYTES: usize = 256 * 1024;
/// The data channel the VIP door talks on.
pub const VIP_CHANNEL: &str = "vip";

/// What to do in one WebRTC session.
#[derive(Debug, Clone)]
pub struct WebrtcOptions {
    /// VIP: the server's base URL (`http://host:8080`; `/webrtc/offer` is appended unless
    /// present). Gemini: the bridge's WebSocket URL (`ws://host:8080/gemini`).
    pub url: String,
    /// Signal over the Gemini bridge instead of the VIP door.
    pub gemini: bool,
    /// Text turns, each after the previous reply, before the WAV turn.
    pub texts: Vec<String>,
    /// A WAV streamed at real time over the audio track as one spoken turn.
    pub wav: Option<PathBuf>,
    /// Where to save the decoded reply audio (48 kHz mono WAV).
    pub save_reply: Option<PathBuf>,
    /// VIP: declare a `set_theme` action and answer its invocations with success.
    pub declare_theme: bool,
    /// The local address the UDP socket binds (and advertises as the host candidate).
    pub bind: IpAddr,
    /// The model named in the Gemini setup.
    pub model: String,
    /// VIP: a token sent as `Authorization: Bearer` with the offer (`[vip] tokens`).
    pub token: Option<String>,
    /// Give up after this long.
    pub timeout: Duration,
}

impl WebrtcOptions {
    /// Defaults for `url`: VIP, loopback, 30 s timeout, nothing to say.
    #[must_use]
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            gemini: false,
            texts: Vec::new(),
            wav: None,
            save_reply: None,
            declare_theme: false,
            bind: IpAddr::from([127, 0, 0, 1]),
            model: "models/gemini-2.0-flash-live-001".into(),
            token: None,
            timeout: Duration::from_secs(30),
        }
    }
}

/// Per-session counters (the `stats` event, and one row of a load run).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct WebrtcStats {
    /// ICE and DTLS completed.
    pub connected: bool,
    /// Milliseconds from the answer to ICE and DTLS completing.
    pub connect_ms: Option<u64>,
    /// Opus frames sent.
    pub frames_sent: u64,
    /// Frames sent more than 30 ms after their slot (the client fell behind).
    pub late_sends: u64,
    /// Reply RTP packets received.
    pub packets_received: u64,
    /// Reply packets missing from the RTP sequence.
    pub lost_packets: u64,
    /// Reply packets that arrived after their playout time for a listener with a 40 ms jitter
    /// buffer ([`JITTER_BUFFER`]): what a listener would hear as a glitch.
    pub late_packets: u64,
    /// The most any reply packet arrived behind its time on the reply's clock, in
    /// milliseconds: the smallest jitter buffer that would have played every packet.
    pub max_delay_ms: u64,
    /// Reply packets that arrived more than 40 ms after the previous one while a reply was
    /// flowing ([`LONG_GAP`]; stricter than `late_packets`).
    pub long_gaps: u64,
    /// Of the long gaps, those whose RTP time also jumped (the sender marked a pause).
    pub long_gaps_with_rtp_gap: u64,
    /// The longest arrival spacing within a reply, in milliseconds.
    pub max_gap_ms: u64,
    /// Reply audio received, in seconds (from the Opus packets' durations).
    pub reply_audio_seconds: f64,
    /// Per spoken turn: milliseconds from the end of the last voiced frame sent (the server's
    /// VAD may end the turn at a pause inside the WAV) to the first reply packet.
    pub first_audio_latency_ms: Vec<u64>,
    /// Replies completed (`reply.done`, Gemini `TURN_COMPLETE`).
    pub turns: u64,
    /// What went wrong, if anything.
    pub error: Option<String>,
}

/// What a session produced.
#[derive(Debug, Clone, Default)]
pub struct WebrtcOutcome {
    /// The VIP session id (from the answer).
    pub session_id: Option<String>,
    /// The counters.
    pub stats: WebrtcStats,
    /// Decoded reply audio, 48 kHz mono (only when it is saved or asked for).
    pub audio: Vec<i16>,
    /// `transcript.user` texts.
    pub user_transcripts: Vec<String>,
    /// `reply.text` texts (Gemini: model text per turn).
    pub reply_texts: Vec<String>,
    /// `error` messages from the server (the session went on).
    pub errors: Vec<String>,
    /// `action.invoke`s answered.
    pub invocations: u64,
}

/// A WAV encoded once for the track: 20 ms Opus frames, speech then silence, twice: fullband
/// (encoded from 48 kHz, what a browser sends by default) and wideband (encoded from 16 kHz,
/// what a browser sends to a peer whose answer says `maxplaybackrate=16000`).
#[derive(Debug, Clone)]
pub struct EncodedSpeech {
    /// The Opus packets, fullband.
    pub packets: Vec<Vec<u8>>,
    /// The same frames encoded wideband (SILK only).
    pub wideband_packets: Vec<Vec<u8>>,
    /// How many of the packets hold the WAV (the rest are the silence tail).
    pub speech_frames: usize,
    /// Per packet: whether it carries speech (RMS above a tenth of the loudest frame's). The
    /// server's VAD may end a turn at any pause, so the end of speech is the end of the last
    /// voiced frame sent before the reply.
    pub voiced: Vec<bool>,
}

/// The wideband rate: a peer that plays at most this gets [`EncodedSpeech::wideband_packets`].
const WIDEBAND_RATE: u32 = 16_000;

impl EncodedSpeech {
    /// Reads, resamples and encodes `path`, adding `silence_tail` of silent frames.
    ///
    /// # Errors
    /// An unreadable WAV or an encoder failure.
    pub fn from_wav(path: &Path, silence_tail: Duration) -> anyhow::Result<Self> {
        Self::from_samples(&audio::load_wav(path, RATE)?, silence_tail)
    }

    /// Encodes mono 48 kHz samples, adding `silence_tail` of silent frames.
    ///
    /// # Errors
    /// An encoder failure.
    pub fn from_samples(samples: &[f32], silence_tail: Duration) -> anyhow::Result<Self> {
        let mut frames = audio::frames(samples, FRAME_SAMPLES);
        let speech_frames = frames.len();
        let mut voiced = crate::chaos::voiced_frames(samples, FRAME_SAMPLES);
        let tail = silence_tail.as_micros() / FRAME.as_micros();
        frames.extend((0..tail).map(|_| vec![0.0; FRAME_SAMPLES]));
        voiced.resize(frames.len(), false);
        let packets = encode_frames(&frames, RATE)?;
        // The whole stream at once: a resampler's delay would otherwise shift every frame.
        let mut narrow = Resampler::new(RATE, WIDEBAND_RATE).context("resampler")?;
        let mut low = Vec::with_capacity(samples.len() / 3 + 1024);
        narrow.process(samples, &mut low);
        narrow.flush(&mut low);
        let per_frame = FRAME_SAMPLES / 3;
        low.resize(speech_frames * per_frame, 0.0);
        let mut wideband_frames = audio::frames(&low, per_frame);
        wideband_frames.resize(frames.len(), vec![0.0; per_frame]);
        let wideband_packets = encode_frames(&wideband_frames, WIDEBAND_RATE)?;
        Ok(Self {
            packets,
            wideband_packets,
            speech_frames,
            voiced,
        })
    }

    /// The packets to send to a peer whose answer limits playback to `max_playback` Hz.
    #[must_use]
    pub fn packets_for(&self, max_playback: Option<u32>) -> &[Vec<u8>] {
        match max_playback {
            Some(rate) if rate <= WIDEBAND_RATE => &self.wideband_packets,
            _ => &self.packets,
        }
    }
}

/// 20 ms frames at `rate` as Opus packets.
fn encode_frames(frames: &[Vec<f32>], rate: u32) -> anyhow::Result<Vec<Vec<u8>>> {
    let config = OpusEncoderConfig {
        frame_duration: FrameDuration::Ms20,
        bitrate: 32_000,
        ..OpusEncoderConfig::voice(rate)
    };
    let mut enc = OpusEncoder::new(config).context("Opus encoder")?;
    frames
        .iter()
        .map(|f| enc.encode_f32(f).map(<[u8]>::to_vec).context("Opus encode"))
        .collect()
}

/// The `maxplaybackrate` of the Opus format in an SDP (RFC 7587 §6.1): the highest rate the
/// peer will play, so a sender need not encode above it.
#[must_use]
pub fn opus_max_playback_rate(sdp: &str) -> Option<u32> {
    let pts: Vec<&str> = sdp
        .lines()
        .filter_map(|l| l.strip_prefix("a=rtpmap:"))
        .filter_map(|rest| rest.split_once(' '))
        .filter(|(_, codec)| codec.to_ascii_lowercase().starts_with("opus/48000"))
        .map(|(pt, _)| pt)
        .collect();
    sdp.lines()
        .filter_map(|l| l.strip_prefix("a=fmtp:"))
        .filter_map(|rest| rest.split_once(' '))
        .filter(|(pt, _)| pts.contains(pt))
        .flat_map(|(_, params)| params.split(';'))
        .filter_map(|p| p.trim().split_once('='))
        .find(|(k, _)| k.eq_ignore_ascii_case("maxplaybackrate"))
        .and_then(|(_, v)| v.trim().parse().ok())
}

/// Samples at 48 kHz in one Opus packet, from its TOC byte (RFC 6716 §3.1); 0 for an empty or
/// malformed packet.
#[must_use]
pub fn opus_packet_samples(packet: &[u8]) -> usize {
    let Some(&toc) = packet.first() else {
        return 0;
    };
    let config = usize::from(toc >> 3);
    let frame = match config {
        // SILK: 10, 20, 40, 60 ms.
        0..=11 => [480, 960, 1920, 2880][config % 4],
        // Hybrid: 10, 20 ms.
        12..=15 => [480, 960][config % 2],
        // CELT: 2.5, 5, 10, 20 ms.
        _ => [120, 240, 480, 960][config % 4],
    };
    let frames = match toc & 3 {
        0 => 1,
        1 | 2 => 2,
        _ => packet.get(1).map_or(0, |b| usize::from(b & 0x3f)),
    };
    frame * frames
}

/// The VIP door's offer URL for a base URL (`http://h:8080` → `http://h:8080/webrtc/offer`).
///
/// # Errors
/// A URL that is not `http(s)://`.
pub fn offer_url(url: &str) -> anyhow::Result<String> {
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        bail!(
            "the VIP door is reached over HTTP: give http://HOST:PORT (got {}); for the Gemini bridge add --gemini",
            ws::redact(url)
        );
    }
    if url.trim_end_matches('/').ends_with("/webrtc/offer") {
        return Ok(url.trim_end_matches('/').to_owned());
    }
    Ok(format!("{}/webrtc/offer", url.trim_end_matches('/')))
}

/// The answer of `POST /webrtc/offer`.
#[derive(Debug, Clone, Deserialize)]
pub struct HttpAnswer {
    /// The SDP answer.
    pub sdp: String,
    /// `"answer"`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The session id (for `DELETE /webrtc/sessions/<id>`).
    #[serde(default)]
    pub session_id: Option<String>,
}

/// A str0m offerer with one audio track (and the `vip` data channel when `data_channel`),
/// its host candidate at `local`.
struct Offerer {
    rtc: Rtc,
    mid: Mid,
    channel: Option<ChannelId>,
    offer: SdpOffer,
    pending: SdpPendingOffer,
}

fn make_offer(local: SocketAddr, data_channel: bool, now: Instant) -> anyhow::Result<Offerer> {
    // str0m takes its crypto (DTLS, SRTP) from a process-wide default; installing it twice is
    // harmless.
    str0m::crypto::from_feature_flags().install_process_default();
    let mut rtc = RtcConfig::new()
        .clear_codecs()
        .enable_opus(true, false)
        .build(now);
    let candidate = Candidate::host(local, "udp").context("host candidate")?;
    rtc.add_local_candidate(candidate);
    let mut api = rtc.sdp_api();
    let mid = api.add_media(MediaKind::Audio, Direction::SendRecv, None, None, None);
    let channel = data_channel.then(|| api.add_channel(VIP_CHANNEL.into()));
    let (offer, pending) = api.apply().context("str0m made no offer")?;
    Ok(Offerer {
        rtc,
        mid,
        channel,
        offer,
        pending,
    })
}

/// The SDP offer a session would send from `local` (for tests and `--dry-run` style checks).
///
/// # Errors
/// As the offer's construction.
pub fn offer_sdp(local: SocketAddr, data_channel: bool) -> anyhow::Result<String> {
    Ok(make_offer(local, data_channel, Instant::now())?
        .offer
        .to_sdp_string())
}

/// The HTTP client sessions post their offers with.
fn http_client() -> anyhow::Result<reqwest::Client> {
    reqwest::Client::builder().build().context("HTTP client")
}

/// Posts `offer` to the VIP door and returns its answer.
async fn post_offer(
    client: &reqwest::Client,
    url: &str,
    offer: &str,
    token: Option<&str>,
    timeout: Duration,
) -> anyhow::Result<HttpAnswer> {
    let target = offer_url(url)?;
    let body = json!({"sdp": offer, "type": "offer"}).to_string();
    let mut request = client
        .post(&target)
        .timeout(timeout)
        .header("content-type", "application/json")
        .body(body);
    if let Some(token) = token.filter(|t| !t.is_empty()) {
        request = request.bearer_auth(token);
    }
    let response = request
        .send()
        .await
        .with_context(|| format!("posting the offer to {}", ws::redact(&target)))?;
    let status = response.status();
    let bytes = response.bytes().await.context("reading the answer")?;
    if bytes.len() > MAX_ANSWER_BYTES {
        bail!("the answer is over {MAX_ANSWER_BYTES} bytes");
    }
    let text = String::from_utf8_lossy(&bytes);
    if !status.is_success() {
        bail!("the offer was refused: {status}: {text}");
    }
    serde_json::from_str(&text).with_context(|| format!("the answer is not JSON: {text}"))
}

/// One turn of the plan.
#[derive(Debug, Clone)]
enum Turn {
    Text(String),
    Speech,
}

/// What a session does, shared by the command and the load generator.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    turns: Vec<Turn>,
    speech: Option<Arc<EncodedSpeech>>,
    keep_audio: bool,
    declare_theme: bool,
    timeout: Duration,
    bind: IpAddr,
    token: Option<String>,
    /// One HTTP client for every session (building one loads the system's certificates).
    http: reqwest::Client,
}

impl Plan {
    /// `speech_turns` spoken turns of `speech`, nothing else (the load generator's plan).
    pub(crate) fn speech(
        speech: Arc<EncodedSpeech>,
        speech_turns: usize,
        timeout: Duration,
        bind: IpAddr,
        token: Option<String>,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            turns: vec![Turn::Speech; speech_turns],
            speech: Some(speech),
            keep_audio: false,
            declare_theme: false,
            timeout,
            bind,
            token,
            http: http_client()?,
        })
    }
}

/// The signalling channel: the VIP door talks on the data channel after one HTTP exchange;
/// the Gemini bridge keeps its WebSocket.
enum Control {
    Vip,
    Gemini(Box<Ws>),
}

/// Runs one session, emitting every event to `events`; saves the reply audio when asked.
///
/// # Errors
/// Connection or signalling failures, an `error.fatal`, or the timeout.
pub async fn run(opts: &WebrtcOptions, events: &mut Events) -> anyhow::Result<WebrtcOutcome> {
    let mut turns: Vec<Turn> = opts.texts.iter().cloned().map(Turn::Text).collect();
    let speech = match &opts.wav {
        Some(path) => {
            turns.push(Turn::Speech);
            Some(Arc::new(EncodedSpeech::from_wav(path, SILENCE_TAIL)?))
        }
        None => None,
    };
    let plan = Plan {
        turns,
        speech,
        keep_audio: opts.save_reply.is_some(),
        declare_theme: opts.declare_theme,
        timeout: opts.timeout,
        bind: opts.bind,
        token: opts.token.clone(),
        http: http_client()?,
    };
    let mut out = WebrtcOutcome::default();
    let result = if opts.gemini {
        let mut g = GeminiOptions::new(opts.url.clone());
        g.model.clone_from(&opts.model);
        g.audio = true;
        session(&opts.url, Some(&g), &plan, events, &mut out).await
    } else {
        session(&opts.url, None, &plan, events, &mut out).await
    };
    if let Err(e) = &result {
        out.stats.error = Some(format!("{e:#}"));
    }
    events.emit("stats", serde_json::to_value(&out.stats)?);
    result?;
    if let Some(path) = &opts.save_reply {
        audio::save_reply(path, RATE, &out.audio, events)?;
    }
    Ok(out)
}

/// Runs `plan` against `url` (VIP when `gemini` is `None`), filling `out`.
pub(crate) async fn session(
    url: &str,
    gemini: Option<&GeminiOptions>,
    plan: &Plan,
    events: &mut Events,
    out: &mut WebrtcOutcome,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + plan.timeout;
    if plan.bind.is_unspecified() {
        bail!("bind to a specific address (it is advertised as the ICE host candidate)");
    }
    let socket = UdpSocket::bind(SocketAddr::new(plan.bind, 0))
        .await
        .context("binding the UDP socket")?;
    let local = socket.local_addr().context("the UDP socket's address")?;
    // Kernel receive times, so the client's own scheduling delays are not counted as the
    // server's; without them, arrival is when the client read the datagram.
    let _ = nix::sys::socket::setsockopt(
        &socket,
        nix::sys::socket::sockopt::ReceiveTimestampns,
        &true,
    );
    let offerer = make_offer(local, gemini.is_none(), Instant::now())?;
    let offer = offerer.offer.to_sdp_string();
    let mut peer = Peer::new(
        offerer.rtc,
        offerer.mid,
        offerer.channel,
        socket,
        local,
        plan,
    );
    let mut pending = Some(offerer.pending);
    let control = match gemini {
        None => {
            let remaining = deadline.saturating_duration_since(Instant::now());
            events.emit(
                "sent",
                json!({"message": {"type": "offer", "bytes": offer.len()}}),
            );
            let answer = tokio::time::timeout(
                remaining,
                post_offer(&plan.http, url, &offer, plan.token.as_deref(), remaining),
            )
            .await
            .map_err(|_| anyhow::anyhow!("no answer within {:?}", plan.timeout))??;
            events.emit(
                "answer",
                json!({"session_id": answer.session_id, "type": answer.kind}),
            );
            out.session_id.clone_from(&answer.session_id);
            peer.max_playback = opus_max_playback_rate(&answer.sdp);
            let sdp = SdpAnswer::from_sdp_string(&answer.sdp).context("the answer is not SDP")?;
            if let Some(p) = pending.take() {
                peer.rtc
                    .sdp_api()
                    .accept_answer(p, sdp)
                    .context("accepting the answer")?;
            }
            peer.answered = Some(Instant::now());
            Control::Vip
        }
        Some(g) => {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let mut ws = ws::open(url, &[], remaining, events, Value::Null).await?;
            send_gemini(&mut ws, &crate::gemini::connect_message(g)?, events).await?;
            wait_setup(&mut ws, deadline, events).await?;
            send_gemini(&mut ws, &ClientMessage::WebrtcOffer { sdp: offer }, events).await?;
            Control::Gemini(Box::new(ws))
        }
    };
    let result = peer.drive(control, &mut pending, deadline, events).await;
    peer.finish(out);
    result
}

async fn send_gemini(ws: &mut Ws, msg: &ClientMessage, events: &mut Events) -> anyhow::Result<()> {
    let text = msg.encode();
    let mut value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    redact_audio(&mut value);
    if let Some(sdp) = value.pointer_mut("/payload/sdp") {
        // The SDP is long and says nothing a reader of the events needs.
        *sdp = json!("<sdp>");
    }
    events.emit("sent", json!({"message": value}));
    ws.send(Message::Text(text.into())).await.context("sending")
}

/// Reads the bridge until `SETUP_COMPLETE`.
async fn wait_setup(ws: &mut Ws, deadline: Instant, events: &mut Events) -> anyhow::Result<()> {
    loop {
        let next = tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), ws.next());
        let Ok(msg) = next.await else {
            bail!("no SETUP_COMPLETE in time");
        };
        match msg {
            Some(Ok(Message::Text(frame))) => {
                emit_gemini(frame.as_str(), events);
                match ServerMessage::decode(frame.as_str()) {
                    Ok(ServerMessage::SetupComplete(s)) if s.success => return Ok(()),
                    Ok(ServerMessage::SetupComplete(_)) => {
                        bail!("setup failed: {}", frame.as_str())
                    }
                    Ok(ServerMessage::GeminiError { message, .. }) => {
                        bail!("the bridge refused the session: {message}")
                    }
                    _ => {}
                }
            }
            Some(Ok(Message::Close(frame))) => {
                events.emit("closed", ws::close_fields(frame.as_ref()));
                bail!("server closed the session before setup");
            }
            None => bail!("connection lost before setup"),
            Some(Err(e)) => return Err(e).context("receiving"),
            Some(Ok(_)) => {}
        }
    }
}

fn emit_gemini(frame: &str, events: &mut Events) {
    let mut raw: Value = serde_json::from_str(frame).unwrap_or_else(|_| json!(frame));
    redact_audio(&mut raw);
    if let Some(sdp) = raw.pointer_mut("/payload/sdp") {
        *sdp = json!("<sdp>");
    }
    events.emit("recv", json!({"message": raw}));
}

/// A candidate line from a bridge `WEBRTC_ICE_CANDIDATE` (flat or nested); `None` for the
/// end-of-candidates marker.
#[must_use]
pub fn candidate_line(message: &voxgate_gemini::bridge::IceMessage) -> Option<String> {
    let line = message.candidate.candidate.as_deref()?.trim();
    let line = line.strip_prefix("a=").unwrap_or(line);
    (!line.is_empty()).then(|| line.to_owned())
}

/// The reply clock: judges each reply packet's arrival the way a listener's fixed jitter
/// buffer would.
///
/// A reply's packets are due at `anchor + (rtp - anchor_rtp) / 48 kHz`, where the anchor is the
/// packet that arrived earliest for its RTP time so far (the least-delayed one: a receiver
/// plays relative to the best transit it has seen). A packet arriving more than the buffer
/// after that is late. RTP time carries the sender's pauses, so a pause the sender marked is
/// not late; audio the sender could not produce in time is. Each reply starts afresh.
#[derive(Debug, Default)]
pub struct ReplyClock {
    /// The previous packet's arrival and RTP time, while a reply is flowing.
    flowing: Option<(Instant, u64)>,
    /// The least-delayed packet of the reply: its arrival and RTP time.
    anchor: Option<(Instant, u64)>,
    last_seq: Option<u64>,
}

/// How one reply packet arrived (see [`ReplyClock::arrive`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Arrival {
    /// How far behind its time on the reply's clock it arrived.
    pub delay: Duration,
    /// Later than the jitter buffer allows.
    pub late: bool,
    /// Time since the previous packet of the reply, if there was one.
    pub gap: Option<Duration>,
    /// The RTP time jumped by more than two frames since the previous packet.
    pub rtp_jump: bool,
    /// Packets missing from the RTP sequence before this one.
    pub lost: u64,
}

impl ReplyClock {
    /// A packet with sequence numbers `first..=last` and 48 kHz RTP time `rtp` arrived `at`.
    pub fn arrive(&mut self, at: Instant, rtp: u64, first: u64, last: u64) -> Arrival {
        let mut arrival = Arrival::default();
        match self.last_seq {
            Some(prev) => {
                arrival.lost = first.saturating_sub(prev + 1);
                self.last_seq = Some(prev.max(last));
            }
            None => self.last_seq = Some(last),
        }
        if let Some((prev_at, prev_rtp)) = self.flowing {
            arrival.gap = Some(at.saturating_duration_since(prev_at));
            arrival.rtp_jump = rtp.saturating_sub(prev_rtp) > 2 * FRAME_SAMPLES as u64;
        }
        self.flowing = Some((at, rtp));
        let (anchor_at, anchor_rtp) = *self.anchor.get_or_insert((at, rtp));
        // A packet older than the anchor (reordered) is judged against the anchor itself.
        let due = anchor_at + rtp_duration(rtp.saturating_sub(anchor_rtp));
        if at < due {
            self.anchor = Some((at, rtp));
        }
        arrival.delay = at.saturating_duration_since(due);
        arrival.late = arrival.delay > JITTER_BUFFER;
        arrival
    }

    /// The reply is over: the next packet starts a new one.
    pub fn reply_done(&mut self) {
        self.flowing = None;
        self.anchor = None;
    }
}

/// `ticks` of the 48 kHz RTP clock as a duration.
fn rtp_duration(ticks: u64) -> Duration {
    Duration::from_micros(ticks.saturating_mul(1_000) / 48)
}

/// Reads one datagram and the time the kernel received it (`SO_TIMESTAMPNS`; `None` when the
/// socket was not asked for it). The caller waits for readability; this never blocks.
fn recv_stamped(
    socket: &UdpSocket,
    buf: &mut [u8],
    cmsg: &mut [u8],
) -> std::io::Result<(usize, SocketAddr, Option<Instant>)> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, SockaddrStorage, recvmsg};
    use std::os::fd::AsRawFd as _;
    socket.try_io(tokio::io::Interest::READABLE, || {
        let mut iov = [std::io::IoSliceMut::new(buf)];
        let msg = recvmsg::<SockaddrStorage>(
            socket.as_raw_fd(),
            &mut iov,
            Some(cmsg),
            MsgFlags::empty(),
        )?;
        let source = msg
            .address
            .and_then(|a| {
                a.as_sockaddr_in()
                    .map(|v4| SocketAddr::from(std::net::SocketAddrV4::from(*v4)))
                    .or_else(|| {
                        a.as_sockaddr_in6()
                            .map(|v6| SocketAddr::from(std::net::SocketAddrV6::from(*v6)))
                    })
            })
            .ok_or_else(|| std::io::Error::other("a datagram without a source address"))?;
        let stamp = msg.cmsgs()?.find_map(|c| match c {
            ControlMessageOwned::ScmTimestampns(ts) => Some(ts),
            _ => None,
        });
        // The stamp is wall-clock time; its age now turns it into an `Instant`.
        let at = stamp.map(|ts| {
            let received = std::time::UNIX_EPOCH + Duration::from(ts);
            let age = std::time::SystemTime::now()
                .duration_since(received)
                .unwrap_or_default();
            Instant::now().checked_sub(age).unwrap_or_else(Instant::now)
        });
        Ok((msg.bytes, source, at))
    })
}

/// The connection and the session's turn machine.
struct Peer<'p> {
    rtc: Rtc,
    socket: UdpSocket,
    local: SocketAddr,
    mid: Mid,
    channel: Option<ChannelId>,
    channel_open: bool,
    pt: Option<Pt>,
    plan: &'p Plan,
    decoder: Option<OpusDecoder>,
    audio: Vec<i16>,
    reply_samples: u64,
    stats: WebrtcStats,
    clock: ReplyClock,
    /// When the kernel received the datagram last read.
    arrival: Option<Instant>,
    answered: Option<Instant>,
    /// The answer's Opus `maxplaybackrate`: wideband packets are sent when it is 16 kHz or less.
    max_playback: Option<u32>,
    /// VIP: `session.connected` arrived.
    session_ready: bool,
    /// Gemini: the answer arrived.
    answer_accepted: bool,
    /// Remote candidates that came before the answer.
    early_candidates: Vec<String>,
    turn: usize,
    waiting: bool,
    /// The spoken turn being streamed: its first frame's slot and the next frame.
    streaming: Option<(Instant, usize)>,
    /// A spoken turn waits for its first reply packet.
    awaiting_first_audio: bool,
    /// The end of the last voiced frame sent in the current spoken turn.
    speech_end: Option<Instant>,
    /// The first frame's slot, the zero of our RTP clock.
    rtp_zero: Option<Instant>,
    done_at: Option<Instant>,
    session_id: Option<String>,
    user_transcripts: Vec<String>,
    reply_texts: Vec<String>,
    errors: Vec<String>,
    invocations: u64,
    gemini_text: String,
}

impl<'p> Peer<'p> {
    fn new(
        rtc: Rtc,
        mid: Mid,
        channel: Option<ChannelId>,
        socket: UdpSocket,
        local: SocketAddr,
        plan: &'p Plan,
    ) -> Self {
        Self {
            rtc,
            socket,
            local,
            mid,
            channel,
            channel_open: false,
            pt: None,
            plan,
            decoder: None,
            audio: Vec::new(),
            reply_samples: 0,
            stats: WebrtcStats::default(),
            clock: ReplyClock::default(),
            arrival: None,
            answered: None,
            max_playback: None,
            session_ready: false,
            answer_accepted: false,
            early_candidates: Vec::new(),
            turn: 0,
            waiting: false,
            streaming: None,
            awaiting_first_audio: false,
            speech_end: None,
            rtp_zero: None,
            done_at: None,
            session_id: None,
            user_transcripts: Vec::new(),
            reply_texts: Vec::new(),
            errors: Vec::new(),
            invocations: 0,
            gemini_text: String::new(),
        }
    }

    fn finish(self, out: &mut WebrtcOutcome) {
        let mut stats = self.stats;
        stats.reply_audio_seconds = self.reply_samples as f64 / f64::from(RATE);
        if out.session_id.is_none() {
            out.session_id = self.session_id;
        }
        out.stats = stats;
        out.audio = self.audio;
        out.user_transcripts = self.user_transcripts;
        out.reply_texts = self.reply_texts;
        out.errors = self.errors;
        out.invocations = self.invocations;
    }

    /// Ready for turns: media up, and (VIP) the door said hello.
    fn ready(&self, vip: bool) -> bool {
        self.stats.connected && (!vip || self.session_ready)
    }

    async fn drive(
        &mut self,
        mut control: Control,
        pending: &mut Option<SdpPendingOffer>,
        deadline: Instant,
        events: &mut Events,
    ) -> anyhow::Result<()> {
        let vip = matches!(control, Control::Vip);
        let mut buf = vec![0u8; MAX_DATAGRAM];
        let mut cmsg = nix::cmsg_space!(nix::sys::time::TimeSpec);
        let mut immediate = 0;
        // One timer, moved only when its deadline changes (a fresh sleep per turn would
        // register with the runtime's timer on every packet).
        let timer = tokio::time::sleep_until(tokio::time::Instant::from_std(deadline));
        tokio::pin!(timer);
        let mut armed = Some(deadline);
        loop {
            let timeout = self.drain(events, &mut control)?;
            // A frame written asks str0m to packetize and pace it at once: handled here
            // rather than through the runtime's timer (two wakeups per frame), a few in a row
            // at most so the task still yields.
            let now = Instant::now();
            if timeout <= now && immediate < 8 {
                immediate += 1;
                self.rtc
                    .handle_input(Input::Timeout(now))
                    .context("webrtc")?;
                continue;
            }
            immediate = 0;
            if self.ready(vip)
                && !self.waiting
                && self.streaming.is_none()
                && self.done_at.is_none()
            {
                self.next_turn(&mut control, events).await?;
            }
            if let Some(done) = self.done_at
                && Instant::now() >= done
            {
                break;
            }
            let frame_due = self.streaming.map(|(start, i)| slot(start, i));
            if let Some(due) = frame_due
                && due <= Instant::now()
            {
                self.send_frame(Instant::now(), events);
                continue;
            }
            let wake = [Some(timeout), frame_due, self.done_at]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(deadline)
                .min(deadline);
            if armed != Some(wake) {
                timer.as_mut().reset(tokio::time::Instant::from_std(wake));
                armed = Some(wake);
            }
            tokio::select! {
                r = self.socket.readable() => {
                    if r.is_err() {
                        continue;
                    }
                    // ICMP errors from earlier sends surface here on some systems; a spurious
                    // wakeup is `WouldBlock`.
                    let Ok((n, source, at)) = recv_stamped(&self.socket, &mut buf, &mut cmsg)
                    else {
                        continue;
                    };
                    self.arrival = at;
                    self.receive(&buf[..n], source);
                }
                msg = next_ws(&mut control) => {
                    self.on_ws(msg, pending, events)?;
                }
                () = &mut timer => {
                    // A fired timer stays ready until it is moved.
                    armed = None;
                    let now = Instant::now();
                    if now >= deadline {
                        bail!("timed out after {:?}", self.plan.timeout);
                    }
                    if frame_due.is_some_and(|d| d <= now) {
                        self.send_frame(now, events);
                    }
                    if timeout <= now {
                        self.rtc
                            .handle_input(Input::Timeout(now))
                            .context("webrtc")?;
                    }
                }
            }
        }
        self.hang_up(&mut control, events).await;
        Ok(())
    }

    /// Starts the next turn, or schedules the end when there is none.
    async fn next_turn(
        &mut self,
        control: &mut Control,
        events: &mut Events,
    ) -> anyhow::Result<()> {
        if self.turn == 0 && self.plan.declare_theme && matches!(control, Control::Vip) {
            self.send_data(&declare_theme_message(), events);
        }
        match self.plan.turns.get(self.turn).cloned() {
            None => self.done_at = Some(Instant::now() + END_TAIL),
            Some(Turn::Text(text)) => {
                match control {
                    Control::Vip => {
                        self.send_data(&json!({"type": "input.text", "text": text}), events);
                    }
                    Control::Gemini(ws) => {
                        let msg = ClientMessage::SendMessage {
                            parts: vec![Part::text(text)],
                            turn_complete: true,
                        };
                        send_gemini(ws, &msg, events).await?;
                    }
                }
                self.waiting = true;
            }
            Some(Turn::Speech) => {
                let frames = self.plan.speech.as_ref().map_or(0, |s| s.packets.len());
                let start = Instant::now();
                events.emit(
                    "sent",
                    json!({"message": "audio_stream_start", "frames": frames,
                    "frame_ms": FRAME.as_millis()}),
                );
                self.streaming = Some((start, 0));
                self.awaiting_first_audio = true;
                self.speech_end = None;
                self.waiting = true;
            }
        }
        Ok(())
    }

    /// The current turn's reply is done.
    fn turn_done(&mut self) {
        self.clock.reply_done();
        self.stats.turns += 1;
        let speech_sent = match self.streaming {
            None => true,
            Some((_, i)) => i >= self.plan.speech.as_ref().map_or(0, |s| s.speech_frames),
        };
        if self.waiting && speech_sent {
            // The rest of the silence tail is not needed: the turn ended.
            self.streaming = None;
            self.waiting = false;
            self.turn += 1;
        }
    }

    async fn hang_up(&mut self, control: &mut Control, events: &mut Events) {
        match control {
            Control::Vip => {
                self.send_data(&json!({"type": "session.end"}), events);
            }
            Control::Gemini(ws) => {
                let _ = send_gemini(ws, &ClientMessage::DisconnectGemini, events).await;
                let _ = ws.close().await;
            }
        }
        // Send what the data channel queued, then the DTLS close.
        let _ = self.drain_quiet();
        self.rtc.disconnect();
        let _ = self.drain_quiet();
        events.emit("done", json!({"turns": self.stats.turns}));
    }

    /// Sends what str0m transmits, handles its events; returns its next timeout.
    fn drain(&mut self, events: &mut Events, control: &mut Control) -> anyhow::Result<Instant> {
        loop {
            match self.rtc.poll_output().context("webrtc")? {
                Output::Timeout(t) => return Ok(t),
                Output::Transmit(t) => {
                    let _ = self.socket.try_send_to(&t.contents, t.destination);
                }
                Output::Event(e) => self.event(e, events, control)?,
            }
        }
    }

    /// As [`Self::drain`], ignoring events (while hanging up).
    fn drain_quiet(&mut self) -> anyhow::Result<()> {
        loop {
            match self.rtc.poll_output().context("webrtc")? {
                Output::Timeout(_) => return Ok(()),
                Output::Transmit(t) => {
                    let _ = self.socket.try_send_to(&t.contents, t.destination);
                }
                Output::Event(_) => {}
            }
        }
    }

    fn receive(&mut self, data: &[u8], source: SocketAddr) {
        let Ok(contents) = data.try_into() else {
            return;
        };
        let input = Input::Receive(
            Instant::now(),
            Receive {
                proto: Protocol::Udp,
                source,
                destination: self.local,
                contents,
            },
        );
        // A datagram str0m cannot use is dropped, like the network might.
        let _ = self.rtc.handle_input(input);
    }

    fn event(
        &mut self,
        event: Event,
        events: &mut Events,
        control: &mut Control,
    ) -> anyhow::Result<()> {
        match event {
            Event::Connected => {
                self.stats.connected = true;
                self.stats.connect_ms = self.answered.map(|a| ms(a.elapsed()));
                self.pt = self.rtc.writer(self.mid).and_then(|w| {
                    w.payload_params()
                        .find(|p| p.spec().codec == Codec::Opus)
                        .map(|p| p.pt())
                });
                events.emit(
                    "media_connected",
                    json!({"connect_ms": self.stats.connect_ms}),
                );
                if self.pt.is_none() {
                    bail!("the answer has no Opus");
                }
            }
            Event::IceConnectionStateChange(IceConnectionState::Disconnected) => {
                bail!("ICE disconnected");
            }
            Event::MediaData(d) => self.media(&d, events),
            Event::ChannelOpen(id, label) if Some(id) == self.channel => {
                self.channel_open = true;
                events.emit("channel_open", json!({"label": label}));
            }
            Event::ChannelData(d) if Some(d.id) == self.channel && !d.binary => {
                let text = String::from_utf8_lossy(&d.data).into_owned();
                self.vip_message(&text, events)?;
            }
            Event::ChannelClose(id)
                if Some(id) == self.channel
                    && self.done_at.is_none()
                    && matches!(control, Control::Vip) =>
            {
                bail!("the server closed the data channel");
            }
            _ => {}
        }
        Ok(())
    }

    /// A reply packet: counted, timed, decoded when kept.
    fn media(&mut self, d: &MediaData, events: &mut Events) {
        if d.mid != self.mid {
            return;
        }
        // Packets come out of str0m as the datagram carrying them goes in: the last datagram's
        // kernel time is this packet's.
        let at = self.arrival.unwrap_or(d.network_time);
        self.stats.packets_received += 1;
        let arrival = self.clock.arrive(
            at,
            d.time.numer(),
            **d.seq_range.start(),
            **d.seq_range.end(),
        );
        self.stats.lost_packets += arrival.lost;
        self.stats.max_delay_ms = self.stats.max_delay_ms.max(ms(arrival.delay));
        if arrival.late {
            self.stats.late_packets += 1;
        }
        if let Some(gap) = arrival.gap {
            self.stats.max_gap_ms = self.stats.max_gap_ms.max(ms(gap));
            if gap > LONG_GAP {
                self.stats.long_gaps += 1;
                if arrival.rtp_jump {
                    self.stats.long_gaps_with_rtp_gap += 1;
                }
            }
        }
        if self.awaiting_first_audio
            && let Some(eos) = self.speech_end
        {
            let latency = ms(at.saturating_duration_since(eos));
            self.stats.first_audio_latency_ms.push(latency);
            self.awaiting_first_audio = false;
            events.emit(
                "reply_audio_start",
                json!({"first_audio_latency_ms": latency}),
            );
        }
        self.reply_samples += opus_packet_samples(&d.data) as u64;
        if self.plan.keep_audio {
            if self.decoder.is_none() {
                self.decoder = OpusDecoder::new(RATE, OpusBackend::default()).ok();
            }
            if let Some(dec) = self.decoder.as_mut()
                && let Ok(pcm) = dec.decode(&d.data)
            {
                self.audio.extend_from_slice(pcm);
            }
        }
    }

    /// A VIP data channel message.
    fn vip_message(&mut self, text: &str, events: &mut Events) -> anyhow::Result<()> {
        let value: Value = serde_json::from_str(text).unwrap_or_else(|_| json!(text));
        events.emit("recv", json!({"message": value}));
        let field = |k: &str| value.get(k).and_then(Value::as_str).map(str::to_owned);
        match field("type").as_deref() {
            Some("session.connected") => {
                self.session_ready = true;
                self.session_id = field("session_id");
            }
            Some("transcript.user") => self.user_transcripts.extend(field("text")),
            Some("reply.text") => self.reply_texts.extend(field("text")),
            Some("reply.done") => self.turn_done(),
            Some("action.invoke") => {
                let id = value.get("invocation_id").cloned().unwrap_or(Value::Null);
                let action = field("action_id").unwrap_or_default();
                let reply = if self.plan.declare_theme && action == "set_theme" {
                    let theme = value
                        .pointer("/parameters/theme")
                        .cloned()
                        .unwrap_or(Value::Null);
                    json!({"type": "action.result", "invocation_id": id, "status": "success",
                        "data": {"applied": theme}})
                } else {
                    json!({"type": "action.result", "invocation_id": id, "status": "error",
                        "error": {"code": "unknown_action", "message": format!("no action {action:?} here")}})
                };
                self.invocations += 1;
                self.send_data(&reply, events);
            }
            Some("error") => self
                .errors
                .push(field("message").unwrap_or_else(|| text.to_owned())),
            Some("error.fatal") => bail!(
                "the server ended the session: {}",
                field("message").unwrap_or_default()
            ),
            _ => {}
        }
        Ok(())
    }

    /// A bridge WebSocket message.
    fn on_ws(
        &mut self,
        msg: Option<Result<Message, tokio_tungstenite::tungstenite::Error>>,
        pending: &mut Option<SdpPendingOffer>,
        events: &mut Events,
    ) -> anyhow::Result<()> {
        let frame = match msg {
            Some(Ok(Message::Text(frame))) => frame,
            Some(Ok(Message::Close(frame))) => {
                events.emit("closed", ws::close_fields(frame.as_ref()));
                bail!("server closed the session");
            }
            None => bail!("connection lost"),
            Some(Err(e)) => return Err(e).context("receiving"),
            Some(Ok(_)) => return Ok(()),
        };
        emit_gemini(frame.as_str(), events);
        let Ok(message) = ServerMessage::decode(frame.as_str()) else {
            return Ok(());
        };
        match message {
            ServerMessage::WebrtcAnswer { sdp } => {
                self.max_playback = opus_max_playback_rate(&sdp);
                let answer = SdpAnswer::from_sdp_string(&sdp).context("the answer is not SDP")?;
                let Some(p) = pending.take() else {
                    bail!("a second WEBRTC_ANSWER");
                };
                self.rtc
                    .sdp_api()
                    .accept_answer(p, answer)
                    .context("accepting the answer")?;
                self.answered = Some(Instant::now());
                self.answer_accepted = true;
                for line in std::mem::take(&mut self.early_candidates) {
                    self.remote_candidate(&line, events);
                }
            }
            ServerMessage::WebrtcIceCandidate(m) => {
                if let Some(line) = candidate_line(&m) {
                    if self.answer_accepted {
                        self.remote_candidate(&line, events);
                    } else if self.early_candidates.len() < 64 {
                        self.early_candidates.push(line);
                    }
                }
            }
            ServerMessage::ContentMessage(c) => self.gemini_text.push_str(&c.text()),
            ServerMessage::TurnComplete => {
                self.reply_texts.push(std::mem::take(&mut self.gemini_text));
                self.turn_done();
            }
            ServerMessage::GeminiError { message, .. } => {
                if !self.answer_accepted {
                    bail!("the bridge refused the offer: {message}");
                }
                self.errors.push(message);
            }
            ServerMessage::GeminiDisconnected { reason } => {
                bail!("the bridge disconnected: {}", reason.unwrap_or_default());
            }
            _ => {}
        }
        Ok(())
    }

    fn remote_candidate(&mut self, line: &str, events: &mut Events) {
        match Candidate::from_sdp_string(line) {
            Ok(c) => self.rtc.add_remote_candidate(c),
            Err(e) => events.emit(
                "candidate_ignored",
                json!({"candidate": line, "error": e.to_string()}),
            ),
        }
    }

    fn send_data(&mut self, message: &Value, events: &mut Events) {
        let Some(id) = self.channel else {
            return;
        };
        let text = message.to_string();
        let written = self
            .rtc
            .channel(id)
            .is_some_and(|mut ch| ch.write(false, text.as_bytes()).is_ok());
        if written {
            events.emit("sent", json!({"message": message}));
        } else {
            events.emit("not_sent", json!({"message": message}));
        }
    }

    /// Sends the due frame of the spoken turn.
    fn send_frame(&mut self, now: Instant, events: &mut Events) {
        let Some((start, i)) = self.streaming else {
            return;
        };
        let Some(speech) = self.plan.speech.clone() else {
            self.streaming = None;
            return;
        };
        let Some(packet) = speech.packets_for(self.max_playback).get(i) else {
            // The silence tail is over; the reply (or the timeout) ends the turn.
            self.streaming = None;
            events.emit("sent", json!({"message": "audio_stream_end", "frames": i}));
            return;
        };
        let due = slot(start, i);
        if speech.voiced.get(i).copied().unwrap_or(false) {
            self.speech_end = Some(slot(start, i + 1));
        }
        if now.saturating_duration_since(due) > SEND_SLACK {
            self.stats.late_sends += 1;
        }
        let zero = *self.rtp_zero.get_or_insert(due);
        // The RTP clock follows the frames' slots, so a pause between turns shows as a gap.
        let ticks =
            u64::try_from(due.saturating_duration_since(zero).as_micros() / FRAME.as_micros())
                .unwrap_or(u64::MAX / 2)
                * FRAME_SAMPLES as u64;
        if let (Some(pt), Some(writer)) = (self.pt, self.rtc.writer(self.mid))
            && writer
                .write(
                    pt,
                    now,
                    MediaTime::new(ticks, Frequency::FORTY_EIGHT_KHZ),
                    packet.clone(),
                )
                .is_ok()
        {
            self.stats.frames_sent += 1;
        }
        self.streaming = Some((start, i + 1));
    }
}

/// When frame `i` of a stream starting at `start` is due.
fn slot(start: Instant, i: usize) -> Instant {
    start + FRAME * u32::try_from(i).unwrap_or(u32::MAX)
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The next bridge message; never, for the VIP door.
async fn next_ws(
    control: &mut Control,
) -> Option<Result<Message, tokio_tungstenite::tungstenite::Error>> {
    match control {
        Control::Gemini(ws) => ws.next().await,
        Control::Vip => std::future::pending().await,
    }
}

/// The `actions.declare` of `--declare-theme`: one `set_theme` action.
#[must_use]
pub fn declare_theme_message() -> Value {
    json!({
        "type": "actions.declare",
        "actions": {
            "set_theme": {
                "description": "Switch the page between its light and dark theme.",
                "parameters": {
                    "type": "object",
                    "properties": {"theme": {"type": "string", "enum": ["light", "dark"]}},
                    "required": ["theme"],
                },
            },
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds packets `(arrival ms, frame index)` of one reply, sequence numbers in a row.
    fn replay(clock: &mut ReplyClock, t0: Instant, packets: &[(u64, u64)]) -> Vec<Arrival> {
        packets
            .iter()
            .enumerate()
            .map(|(i, &(ms, frame))| {
                let seq = 100 + i as u64;
                clock.arrive(
                    t0 + Duration::from_millis(ms),
                    frame * FRAME_SAMPLES as u64,
                    seq,
                    seq,
                )
            })
            .collect()
    }

    #[test]
    fn a_stall_the_jitter_buffer_absorbs_is_a_long_gap_but_not_late() {
        let mut clock = ReplyClock::default();
        // On time, then a 30 ms stall (two packets behind, then a burst).
        let a = replay(
            &mut clock,
            Instant::now(),
            &[(0, 0), (20, 1), (40, 2), (90, 3), (91, 4), (100, 5)],
        );
        assert!(a.iter().all(|x| !x.late), "{a:?}");
        assert_eq!(a[3].gap, Some(Duration::from_millis(50)));
        assert_eq!(a[3].delay, Duration::from_millis(30));
        assert_eq!(a[4].delay, Duration::from_millis(11));
        assert!(a.iter().all(|x| x.lost == 0 && !x.rtp_jump));
    }

    #[test]
    fn a_packet_behind_by_more_than_the_buffer_is_late() {
        let mut clock = ReplyClock::default();
        let a = replay(
            &mut clock,
            Instant::now(),
            &[(0, 0), (20, 1), (85, 2), (86, 3)],
        );
        assert_eq!(a[2].delay, Duration::from_millis(45));
        assert!(a[2].late);
        // Frame 3 was due at 60 ms: 26 ms behind, inside the buffer.
        assert!(!a[3].late, "{a:?}");
    }

    #[test]
    fn the_least_delayed_packet_anchors_the_clock() {
        let mut clock = ReplyClock::default();
        // The first packet was held up 30 ms; the next ones came on time, and a later one
        // 45 ms behind the better anchor is late though only 15 ms behind the first packet.
        let a = replay(
            &mut clock,
            Instant::now(),
            &[(30, 0), (20, 1), (40, 2), (105, 3)],
        );
        assert_eq!(a[1].delay, Duration::ZERO);
        assert_eq!(a[3].delay, Duration::from_millis(45));
        assert!(a[3].late);
    }

    #[test]
    fn a_pause_in_rtp_time_is_not_late_and_each_reply_starts_afresh() {
        let mut clock = ReplyClock::default();
        let t0 = Instant::now();
        // The sender paused 200 ms and said so in RTP time.
        let a = replay(&mut clock, t0, &[(0, 0), (20, 1), (240, 12), (260, 13)]);
        assert!(a.iter().all(|x| !x.late), "{a:?}");
        assert!(a[2].rtp_jump);
        assert_eq!(a[2].gap, Some(Duration::from_millis(220)));
        // The next reply's RTP time goes on from where it was, its packets a second later in
        // wall time than the old anchor says: a new reply, a new anchor.
        clock.reply_done();
        let b = replay(
            &mut clock,
            t0 + Duration::from_secs(2),
            &[(0, 20), (20, 21)],
        );
        assert!(
            b.iter().all(|x| !x.late && x.gap != Some(Duration::ZERO)),
            "{b:?}"
        );
        assert_eq!(b[0].gap, None);
    }

    #[tokio::test]
    async fn datagrams_carry_the_kernel_receive_time() {
        let rx = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        nix::sys::socket::setsockopt(&rx, nix::sys::socket::sockopt::ReceiveTimestampns, &true)
            .unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        // The kernel turns receive stamping on in deferred work: until it has, a datagram is
        // stamped when it is read. Wait for the first one stamped before it was read.
        let (mut buf, mut cmsg) = ([0u8; 64], nix::cmsg_space!(nix::sys::time::TimeSpec));
        for _ in 0..100 {
            tx.send_to(b"warm", rx.local_addr().unwrap()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
            rx.readable().await.unwrap();
            let (_, _, at) = recv_stamped(&rx, &mut buf, &mut cmsg).unwrap();
            if at.is_some_and(|at| at.elapsed() >= Duration::from_millis(4)) {
                break;
            }
        }
        let before = Instant::now();
        tx.send_to(b"ping", rx.local_addr().unwrap()).await.unwrap();
        // Read well after the datagram came in: the stamp is when it came, not when it is read.
        tokio::time::sleep(Duration::from_millis(50)).await;
        rx.readable().await.unwrap();
        let (n, source, at) = recv_stamped(&rx, &mut buf, &mut cmsg).unwrap();
        let read = Instant::now();
        assert_eq!(
            (&buf[..n], source),
            (&b"ping"[..], tx.local_addr().unwrap())
        );
        let at = at.expect("a kernel timestamp");
        // Wall-clock to monotonic conversion is good to well under the 50 ms it waited.
        assert!(
            read.duration_since(at) >= Duration::from_millis(40),
            "{:?}",
            read - at
        );
        assert!(
            at + Duration::from_millis(10) >= before,
            "{:?}",
            before.checked_duration_since(at)
        );
        // Without the option there is no stamp, and nothing breaks.
        let plain = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        tx.send_to(b"pong", plain.local_addr().unwrap())
            .await
            .unwrap();
        plain.readable().await.unwrap();
        let (_, _, at) = recv_stamped(&plain, &mut buf, &mut cmsg).unwrap();
        assert!(at.is_none());
    }

    #[test]
    fn sequence_gaps_count_lost_packets() {
        let mut clock = ReplyClock::default();
        let t0 = Instant::now();
        assert_eq!(clock.arrive(t0, 0, 10, 10).lost, 0);
        assert_eq!(clock.arrive(t0 + FRAME * 3, 3 * 960, 13, 13).lost, 2);
        // A late duplicate or a reordered packet loses nothing.
        assert_eq!(clock.arrive(t0 + FRAME * 4, 2 * 960, 12, 12).lost, 0);
    }

    #[test]
    fn offer_has_opus_audio_a_data_channel_and_our_candidate() {
        let local: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let sdp = offer_sdp(local, true).unwrap();
        assert!(sdp.contains("m=audio"), "{sdp}");
        assert!(sdp.contains("a=sendrecv"), "{sdp}");
        assert!(sdp.to_ascii_lowercase().contains("opus/48000"), "{sdp}");
        assert!(sdp.contains("m=application"), "{sdp}");
        assert!(sdp.contains("127.0.0.1 40000 typ host"), "{sdp}");
        let sdp = offer_sdp(local, false).unwrap();
        assert!(!sdp.contains("m=application"), "{sdp}");
    }

    #[test]
    fn offer_urls() {
        assert_eq!(
            offer_url("http://h:8080").unwrap(),
            "http://h:8080/webrtc/offer"
        );
        assert_eq!(
            offer_url("http://h:8080/").unwrap(),
            "http://h:8080/webrtc/offer"
        );
        assert_eq!(
            offer_url("https://h/webrtc/offer").unwrap(),
            "https://h/webrtc/offer"
        );
        assert!(offer_url("ws://h:8080/gemini").is_err());
    }

    #[test]
    fn opus_packet_durations_from_the_toc() {
        assert_eq!(opus_packet_samples(&[]), 0);
        // SILK 20 ms, one frame (config 1).
        assert_eq!(opus_packet_samples(&[1 << 3]), 960);
        // CELT 20 ms (config 31), two frames (code 1).
        assert_eq!(opus_packet_samples(&[(31 << 3) | 1]), 1920);
        // Hybrid 10 ms (config 12), code 3 with 3 frames.
        assert_eq!(opus_packet_samples(&[(12 << 3) | 3, 3]), 1440);
        // SILK 60 ms (config 3).
        assert_eq!(opus_packet_samples(&[3 << 3]), 2880);
    }

    #[test]
    fn speech_is_framed_encoded_and_round_trips() {
        // 0.5 s of a 440 Hz tone at 48 kHz.
        let tone: Vec<f32> = (0..24_000)
            .map(|i| (i as f32 * 440.0 * std::f32::consts::TAU / 48_000.0).sin() * 0.4)
            .collect();
        let s = EncodedSpeech::from_samples(&tone, Duration::from_millis(100)).unwrap();
        assert_eq!(s.speech_frames, 25);
        assert_eq!(s.packets.len(), 30);
        assert_eq!(s.voiced.len(), 30);
        assert!(s.voiced[..25].iter().all(|v| *v) && !s.voiced[25..].iter().any(|v| *v));
        let mut dec = OpusDecoder::new(RATE, OpusBackend::default()).unwrap();
        let mut pcm = Vec::new();
        for p in &s.packets {
            assert_eq!(opus_packet_samples(p), FRAME_SAMPLES);
            pcm.extend_from_slice(dec.decode(p).unwrap());
        }
        assert_eq!(pcm.len(), 30 * FRAME_SAMPLES);
        let loud = |x: &[i16]| x.iter().map(|&s| f64::from(s).abs()).sum::<f64>() / x.len() as f64;
        assert!(loud(&pcm[4800..19_200]) > 1000.0, "the tone survives");
        assert!(loud(&pcm[26 * 960..]) < 200.0, "the tail is silence");
        // The wideband packets: as many, SILK-only wideband (TOC configs 8..=11), the tone in
        // them too.
        assert_eq!(s.wideband_packets.len(), 30);
        assert!(
            s.wideband_packets
                .iter()
                .all(|p| (8..=11).contains(&(p[0] >> 3)))
        );
        let mut dec = OpusDecoder::new(RATE, OpusBackend::default()).unwrap();
        let mut wide = Vec::new();
        for p in &s.wideband_packets {
            assert_eq!(opus_packet_samples(p), FRAME_SAMPLES);
            wide.extend_from_slice(dec.decode(p).unwrap());
        }
        assert!(loud(&wide[4800..19_200]) > 1000.0);
        assert!(std::ptr::eq(
            s.packets_for(Some(16_000)),
            s.wideband_packets.as_slice()
        ));
        assert!(std::ptr::eq(
            s.packets_for(Some(48_000)),
            s.packets.as_slice()
        ));
        assert!(std::ptr::eq(s.packets_for(None), s.packets.as_slice()));
    }

    #[test]
    fn max_playback_rate_of_the_opus_format() {
        let sdp = "m=audio 9 UDP/TLS/RTP/SAVPF 111 0\r\na=rtpmap:111 opus/48000/2\r\n\
                   a=rtpmap:0 PCMU/8000\r\na=fmtp:0 maxplaybackrate=8000\r\n\
                   a=fmtp:111 minptime=10; maxplaybackrate=16000\r\n";
        assert_eq!(opus_max_playback_rate(sdp), Some(16_000));
        assert_eq!(
            opus_max_playback_rate("a=rtpmap:111 opus/48000/2\r\na=fmtp:111 minptime=10\r\n"),
            None
        );
    }

    #[test]
    fn bridge_candidates_flat_nested_and_end_marker() {
        use voxgate_gemini::bridge::{IceCandidate, IceMessage};
        let line = "candidate:1 1 udp 2130706431 127.0.0.1 5000 typ host";
        let flat = IceMessage {
            candidate: IceCandidate {
                candidate: Some(format!("a={line}")),
                ..IceCandidate::default()
            },
            nested: false,
        };
        assert_eq!(candidate_line(&flat).as_deref(), Some(line));
        let Ok(ServerMessage::WebrtcIceCandidate(nested)) = ServerMessage::decode(
            &json!({"type": "WEBRTC_ICE_CANDIDATE", "payload": {"candidate":
                {"candidate": line, "sdpMid": "0", "sdpMLineIndex": 0}}})
            .to_string(),
        ) else {
            panic!("decodes")
        };
        assert_eq!(candidate_line(&nested).as_deref(), Some(line));
        assert!(Candidate::from_sdp_string(line).is_ok());
        let end = IceMessage {
            candidate: IceCandidate {
                candidate: Some(String::new()),
                ..IceCandidate::default()
            },
            nested: false,
        };
        assert_eq!(candidate_line(&end), None);
    }

    #[test]
    fn unspecified_bind_is_refused() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut opts = WebrtcOptions::new("http://127.0.0.1:9");
        opts.bind = IpAddr::from([0, 0, 0, 0]);
        opts.timeout = Duration::from_secs(2);
        let err = rt.block_on(run(&opts, &mut Events::discard())).unwrap_err();
        assert!(err.to_string().contains("specific address"), "{err:#}");
    }
}
