//! Load generation: many Xiaozhi devices from one process, each streaming real Opus at real
//! time through the server's agent, counting what was sent, what came back and how late.
//!
//! Each session plays the firmware's auto mode in a loop: `listen start auto`, stream the WAV
//! (encoded once, plus a second of silence so the server's VAD ends the utterance) frame by
//! frame every 60 ms until the reply starts (`tts start`), then receive the reply until
//! `tts stop`, and listen again, until the time is up.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use serde::Serialize;
use tokio::time::{Instant, sleep_until};
use tokio_tungstenite::tungstenite::Message;
use voxgate_xiaozhi::control::{DeviceMessage, Listen, ListenMode, ServerMessage, TtsState};
use voxgate_xiaozhi::frame::{Frame, FrameCodec, ProtocolVersion};

use crate::audio::{self, Pacing, Playback};
use crate::ws;
use crate::xiaozhi::{self, UPLINK_FRAME, UPLINK_RATE};

/// Uplink frames sent later than this after their slot count as late sends (client overload).
const SEND_SLACK: Duration = Duration::from_millis(30);
/// Downlink frames later than this after their playback slot count as late (audible gaps).
const PLAY_SLACK: Duration = Duration::from_millis(30);

/// What load to generate.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// The Xiaozhi WebSocket URL.
    pub url: String,
    /// Concurrent sessions.
    pub sessions: usize,
    /// How long each session streams.
    pub seconds: u64,
    /// The speech to stream, looped.
    pub wav: PathBuf,
    /// Sessions start spread over this long, so connections do not all land at once.
    pub ramp: Duration,
    /// Binary protocol version.
    pub protocol_version: u8,
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
    /// Opus frames received.
    pub reply_frames: u64,
    /// Received frames that arrived after their playback slot (gaps a listener would hear).
    pub late_frames: u64,
    /// The worst lateness, in milliseconds.
    pub max_late_ms: u64,
    /// Replies completed (`tts stop`).
    pub turns: u64,
    /// What went wrong, if anything.
    pub error: Option<String>,
}

/// The totals printed at the end.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LoadSummary {
    /// Sessions started.
    pub sessions: usize,
    /// Sessions whose hello was answered.
    pub connected: usize,
    /// Seconds each session streamed.
    pub seconds: u64,
    /// Opus frames sent, all sessions.
    pub frames_sent: u64,
    /// Frames sent late by the client.
    pub late_sends: u64,
    /// Opus frames received, all sessions.
    pub reply_frames: u64,
    /// Received frames late for playback (client-side dropped/late frames).
    pub late_frames: u64,
    /// The worst lateness of any frame, in milliseconds.
    pub max_late_ms: u64,
    /// Replies completed, all sessions.
    pub turns: u64,
    /// The fewest replies any connected session got.
    pub min_turns: u64,
    /// Sessions that ended with an error.
    pub sessions_with_errors: usize,
    /// Up to ten distinct errors.
    pub errors: Vec<String>,
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
        for st in stats {
            s.connected += usize::from(st.connected);
            s.frames_sent += st.frames_sent;
            s.late_sends += st.late_sends;
            s.reply_frames += st.reply_frames;
            s.late_frames += st.late_frames;
            s.max_late_ms = s.max_late_ms.max(st.max_late_ms);
            s.turns += st.turns;
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
        s
    }
}

/// Runs the load and returns the summary.
///
/// # Errors
/// Only when the WAV cannot be read or encoded; session failures are counted, not returned.
pub async fn run(opts: &LoadOptions) -> anyhow::Result<LoadSummary> {
    let version = ProtocolVersion::from_number(u64::from(opts.protocol_version))
        .context("protocol version")?;
    let codec = FrameCodec::new(version);
    let mut samples = audio::load_wav(&opts.wav, UPLINK_RATE)?;
    samples.extend(std::iter::repeat_n(0.0, UPLINK_RATE as usize));
    let mut frames = Vec::new();
    for packet in xiaozhi::encode_opus(&samples)? {
        let mut buf = Vec::new();
        codec
            .encode(&Frame::opus(&packet), &mut buf)
            .context("framing")?;
        frames.push(Bytes::from(buf));
    }
    let frames = Arc::new(frames);
    let n = opts.sessions.max(1);
    let step = opts.ramp / u32::try_from(n).unwrap_or(u32::MAX);
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let frames = Arc::clone(&frames);
        let url = opts.url.clone();
        let begin = start + step * u32::try_from(i).unwrap_or(u32::MAX);
        let end = begin + Duration::from_secs(opts.seconds);
        tasks.push(tokio::spawn(async move {
            sleep_until(begin).await;
            let mut stats = SessionStats::default();
            if let Err(e) = session(i, &url, version, &frames, end, &mut stats).await {
                stats.error = Some(format!("{e:#}"));
            }
            stats
        }));
    }
    let mut stats = Vec::with_capacity(n);
    for t in tasks {
        stats.push(t.await.unwrap_or_else(|e| SessionStats {
            error: Some(format!("task failed: {e}")),
            ..SessionStats::default()
        }));
    }
    Ok(LoadSummary::from_sessions(opts.seconds, &stats))
}

async fn session(
    index: usize,
    url: &str,
    version: ProtocolVersion,
    frames: &[Bytes],
    end: Instant,
    stats: &mut SessionStats,
) -> anyhow::Result<()> {
    let device_id = format!(
        "02:00:00:{:02x}:{:02x}:{:02x}",
        (index >> 16) & 0xff,
        (index >> 8) & 0xff,
        index & 0xff
    );
    let client_id = format!("0b0c0d0e-0000-4000-8000-{index:012}");
    let headers = xiaozhi::upgrade_headers(&device_id, &client_id, None, version);
    let mut ws = ws::connect(url, &headers, Duration::from_secs(10)).await?;
    ws.send(Message::Text(xiaozhi::hello(version, false).into()))
        .await?;
    let codec = FrameCodec::new(version);
    let mut session_id = String::new();
    let mut playback = Playback::new(Duration::from_millis(60), PLAY_SLACK);
    // Streaming: the pacing of the current listen and the next frame (index into `frames`).
    let mut streaming: Option<(Pacing, u64)> = None;
    let hello_by = Instant::now() + Duration::from_secs(10);
    loop {
        let next = streaming.map(|(p, i)| p.due(i));
        let limit = if stats.connected {
            end
        } else {
            hello_by.min(end)
        };
        tokio::select! {
            () = sleep_until(limit) => {
                if !stats.connected { anyhow::bail!("no hello"); }
                break;
            }
            () = sleep_until(next.unwrap_or(limit)), if next.is_some() => {
                let Some((pacing, i)) = streaming.as_mut() else { continue };
                let len = u64::try_from(frames.len()).unwrap_or(1).max(1);
                let frame = frames[usize::try_from(*i % len).unwrap_or(0)].clone();
                if pacing.lateness(*i, Instant::now()) > SEND_SLACK {
                    stats.late_sends += 1;
                }
                ws.send(Message::Binary(frame)).await.context("sending audio")?;
                stats.frames_sent += 1;
                *i += 1;
            }
            msg = ws.next() => match msg {
                Some(Ok(Message::Binary(b))) => {
                    if codec.decode(&b).is_ok() {
                        stats.reply_frames += 1;
                        playback.frame(Instant::now());
                    }
                }
                Some(Ok(Message::Text(t))) => match ServerMessage::from_slice(t.as_bytes()) {
                    Ok(ServerMessage::Hello(h)) => {
                        session_id = h.session_id;
                        let ms = u64::from(h.audio_params.frame_duration.max(1));
                        playback = Playback::new(Duration::from_millis(ms), PLAY_SLACK);
                        stats.connected = true;
                        listen(&mut ws, &session_id).await?;
                        streaming = Some((Pacing::new(Instant::now(), UPLINK_FRAME), 0));
                    }
                    Ok(ServerMessage::Tts(tts)) => match tts.state {
                        // The device stops the microphone while it speaks (auto mode).
                        TtsState::Start => streaming = None,
                        TtsState::Stop => {
                            playback.stop();
                            stats.turns += 1;
                            if Instant::now() < end {
                                listen(&mut ws, &session_id).await?;
                                streaming = Some((Pacing::new(Instant::now(), UPLINK_FRAME), 0));
                            }
                        }
                        _ => {}
                    },
                    _ => {}
                },
                Some(Ok(Message::Close(_))) | None => anyhow::bail!("server closed the session"),
                Some(Err(e)) => return Err(e).context("receiving"),
                Some(Ok(_)) => {}
            }
        }
    }
    stats.late_frames = playback.late;
    stats.max_late_ms = u64::try_from(playback.max_late.as_millis()).unwrap_or(u64::MAX);
    let _ = ws.close(None).await;
    Ok(())
}

async fn listen(ws: &mut ws::Ws, session_id: &str) -> anyhow::Result<()> {
    let mut msg = Listen::start(ListenMode::Auto);
    msg.session_id = Some(session_id.to_owned());
    ws.send(Message::Text(DeviceMessage::from(msg).to_json().into()))
        .await
        .context("sending listen")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_adds_up_and_keeps_distinct_errors() {
        let a = SessionStats {
            connected: true,
            frames_sent: 10,
            reply_frames: 5,
            turns: 2,
            late_frames: 1,
            max_late_ms: 40,
            ..SessionStats::default()
        };
        let b = SessionStats {
            connected: true,
            frames_sent: 7,
            reply_frames: 3,
            turns: 1,
            ..SessionStats::default()
        };
        let c = SessionStats {
            error: Some("refused".into()),
            ..SessionStats::default()
        };
        let d = SessionStats {
            error: Some("refused".into()),
            ..SessionStats::default()
        };
        let s = LoadSummary::from_sessions(30, &[a, b, c, d]);
        assert_eq!(
            (s.sessions, s.connected, s.frames_sent, s.reply_frames),
            (4, 2, 17, 8)
        );
        assert_eq!(
            (s.turns, s.min_turns, s.late_frames, s.max_late_ms),
            (3, 1, 1, 40)
        );
        assert_eq!((s.sessions_with_errors, s.errors.len()), (2, 1));
        assert_eq!(LoadSummary::from_sessions(1, &[]).min_turns, 0);
    }
}
