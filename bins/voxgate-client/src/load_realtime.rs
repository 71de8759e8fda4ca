//! `voxgate-client load realtime`: N concurrent realtime sessions over WebSocket or gRPC, on
//! the `voxgate-realtime-client` crate, each streaming 16 kHz PCM at real time like a
//! microphone: a spoken question, then silence until the spoken reply has ended (or the answer
//! timeout), then the question again, until `--seconds` have passed.
//!
//! Figures per turn: end of speech (the last speech packet sent) → `ResponseBegin` and → the
//! first `ModelAudioChunk`; a reply that begins before the speech ended counts as cut, a burst
//! without `ResponseBegin` within the answer timeout as unanswered. The same workload over
//! both transports is what `cargo xtask load --realtime` compares.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use serde::Serialize;
use tokio::time::{Instant, MissedTickBehavior};
use voxgate_realtime::proto::{HostedTtsMode, InferenceTriggerMode};
use voxgate_realtime::{AudioFormat, HostedTtsSettings, HostedVoice, SessionConfig, TtsSettings};
use voxgate_realtime_client::{ClientOptions, Endpoint, Event, RealtimeClient, Reconnect};

use crate::webrtc::load::percentile;

/// The uplink: 16 kHz mono s16 in 20 ms packets, as the published clients send it.
const RATE: u32 = 16_000;
const PACKET: Duration = Duration::from_millis(20);
const PACKET_SAMPLES: usize = 320;

/// What load to generate.
#[derive(Debug, Clone)]
pub struct RealtimeLoadOptions {
    /// `ws://HOST:PORT/realtime`, or with `grpc` the server's `http://HOST:PORT`.
    pub url: String,
    /// gRPC instead of WebSocket.
    pub grpc: bool,
    /// Concurrent sessions.
    pub sessions: usize,
    /// Seconds during which sessions start bursts (the bursts in flight then finish).
    pub seconds: u64,
    /// Seconds over which the sessions start.
    pub ramp: f64,
    /// The speech of a burst (default: the built-in 2.09 s question).
    pub wav: Option<PathBuf>,
    /// Seconds after a burst without a reply before it counts as unanswered.
    pub answer_timeout: f64,
}

/// What one run measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RealtimeLoadSummary {
    /// `websocket` or `grpc`.
    pub transport: &'static str,
    /// Sessions asked for.
    pub sessions: usize,
    /// Sessions that connected and got `SessionReady`.
    pub connected: usize,
    /// Sessions that could not connect.
    pub connect_failures: usize,
    /// Sessions lost mid-run.
    pub lost: usize,
    /// Bursts whose speech was sent.
    pub turns_started: u64,
    /// Bursts answered with a complete reply.
    pub turns_done: u64,
    /// `turns_done` of `turns_started`.
    pub turns_done_percent: f64,
    /// End of speech → `ResponseBegin`, ms.
    pub tts_start_latency_ms_p50: Option<f64>,
    /// 99th percentile, ms.
    pub tts_start_latency_ms_p99: Option<f64>,
    /// End of speech → first reply audio, ms.
    pub first_audio_latency_ms_p50: Option<f64>,
    /// 99th percentile, ms.
    pub first_audio_latency_ms_p99: Option<f64>,
    /// Replies that began before the speech ended.
    pub cut: u64,
    /// Bursts without a reply within the answer timeout.
    pub unanswered: u64,
    /// Replies begun but not ended within the answer timeout.
    pub unfinished: u64,
    /// Bytes of reply audio received.
    pub reply_audio_bytes: u64,
    /// The generator's own CPU over the run, % of one core.
    pub client_cpu_percent_of_one_core: f64,
    /// The same per 1,000 sessions.
    pub client_cpu_percent_per_1000_sessions: f64,
    /// `turns_started`, under the Xiaozhi load's name (`cargo xtask load` reads both).
    pub bursts: u64,
    /// `turns_done`, under the Xiaozhi load's name.
    pub answered: u64,
}

#[derive(Debug, Default)]
struct SessionStats {
    connected: bool,
    lost: bool,
    turns_started: u64,
    turns_done: u64,
    tts_start_us: Vec<u64>,
    first_audio_us: Vec<u64>,
    cut: u64,
    unanswered: u64,
    unfinished: u64,
    audio_bytes: u64,
}

/// The speech of a burst in 20 ms packets of 16 kHz s16le.
fn speech_packets(wav: Option<&PathBuf>) -> anyhow::Result<Vec<Bytes>> {
    let samples: Vec<f32> = match wav {
        Some(path) => crate::audio::load_wav(path, RATE)?,
        None => {
            let wav = voxgate_audio::wav::read_wav(crate::load::DEFAULT_WAV)
                .context("the built-in question")?;
            let mono: Vec<f32> = wav
                .to_mono_i16()
                .iter()
                .map(|s| f32::from(*s) / 32_768.0)
                .collect();
            crate::audio::resample(&mono, wav.sample_rate, RATE)?
        }
    };
    Ok(samples
        .chunks(PACKET_SAMPLES)
        .map(|c| {
            let mut bytes = crate::audio::s16le(c);
            bytes.resize(PACKET_SAMPLES * 2, 0);
            Bytes::from(bytes)
        })
        .collect())
}

/// Runs the load and returns the summary; session failures are counted, not returned.
///
/// # Errors
/// When the WAV cannot be read.
pub async fn run(opts: &RealtimeLoadOptions) -> anyhow::Result<RealtimeLoadSummary> {
    let speech = Arc::new(speech_packets(opts.wav.as_ref())?);
    let n = opts.sessions.max(1);
    let step = Duration::from_secs_f64(opts.ramp.max(0.0)) / u32::try_from(n).unwrap_or(u32::MAX);
    let ticks = crate::procstat::clock_ticks();
    let cpu_before = crate::load::own_cpu_seconds(ticks);
    let start = Instant::now();
    let stop_at = start + Duration::from_secs(opts.seconds);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let opts = opts.clone();
        let speech = Arc::clone(&speech);
        let at = start + step * u32::try_from(i).unwrap_or(u32::MAX);
        tasks.spawn(async move {
            tokio::time::sleep_until(at).await;
            session(&opts, &speech, stop_at).await
        });
    }
    let mut stats = Vec::with_capacity(n);
    while let Some(s) = tasks.join_next().await {
        stats.push(s.unwrap_or_default());
    }
    let wall = start.elapsed().as_secs_f64().max(0.001);
    let cpu_after = crate::load::own_cpu_seconds(ticks);
    let cpu = (cpu_after.0 + cpu_after.1) - (cpu_before.0 + cpu_before.1);
    Ok(summarize(opts, &stats, cpu / wall * 100.0))
}

fn summarize(opts: &RealtimeLoadOptions, stats: &[SessionStats], cpu: f64) -> RealtimeLoadSummary {
    let mut tts: Vec<u64> = stats
        .iter()
        .flat_map(|s| s.tts_start_us.iter().copied())
        .collect();
    let mut audio: Vec<u64> = stats
        .iter()
        .flat_map(|s| s.first_audio_us.iter().copied())
        .collect();
    tts.sort_unstable();
    audio.sort_unstable();
    let ms = |v: &[u64], p| percentile(v, p).map(|us| (us as f64 / 100.0).round() / 10.0);
    let sum = |f: fn(&SessionStats) -> u64| stats.iter().map(f).sum::<u64>();
    let turns_started = sum(|s| s.turns_started);
    let turns_done = sum(|s| s.turns_done);
    RealtimeLoadSummary {
        transport: if opts.grpc { "grpc" } else { "websocket" },
        sessions: opts.sessions,
        connected: stats.iter().filter(|s| s.connected).count(),
        connect_failures: stats.iter().filter(|s| !s.connected).count(),
        lost: stats.iter().filter(|s| s.lost).count(),
        turns_started,
        turns_done,
        turns_done_percent: if turns_started == 0 {
            0.0
        } else {
            turns_done as f64 * 100.0 / turns_started as f64
        },
        tts_start_latency_ms_p50: ms(&tts, 50),
        tts_start_latency_ms_p99: ms(&tts, 99),
        first_audio_latency_ms_p50: ms(&audio, 50),
        first_audio_latency_ms_p99: ms(&audio, 99),
        cut: sum(|s| s.cut),
        unanswered: sum(|s| s.unanswered),
        unfinished: sum(|s| s.unfinished),
        reply_audio_bytes: sum(|s| s.audio_bytes),
        client_cpu_percent_of_one_core: cpu,
        client_cpu_percent_per_1000_sessions: cpu * 1000.0 / opts.sessions.max(1) as f64,
        bursts: turns_started,
        answered: turns_done,
    }
}

/// Where a session is in its burst.
enum Phase {
    /// Sending the speech; the next packet's index.
    Speaking(usize),
    /// Speech sent at `ended`; silence flows until the reply ends.
    Waiting {
        ended: Instant,
        begun: Option<Instant>,
        audio: bool,
    },
}

async fn session(opts: &RealtimeLoadOptions, speech: &[Bytes], stop_at: Instant) -> SessionStats {
    let mut stats = SessionStats::default();
    let endpoint = if opts.grpc {
        Endpoint::grpc(opts.url.clone())
    } else {
        Endpoint::websocket(opts.url.clone())
    };
    let mut config = SessionConfig::new(AudioFormat::SPEECH_16K, AudioFormat::SPEECH_24K);
    config.tts = Some(TtsSettings::Hosted(HostedTtsSettings {
        voice: HostedVoice::Ref {
            voice_id: "default".into(),
        },
        mode: HostedTtsMode::LowLatency,
    }));
    let options = ClientOptions::new(endpoint).with_reconnect(Reconnect::NEVER);
    let Ok(mut client) = RealtimeClient::connect(options, config).await else {
        return stats;
    };
    stats.connected = true;
    let silence = Bytes::from(vec![0u8; PACKET_SAMPLES * 2]);
    let answer_timeout = Duration::from_secs_f64(opts.answer_timeout);
    let mut clock = tokio::time::interval(PACKET);
    clock.set_missed_tick_behavior(MissedTickBehavior::Burst);
    let mut phase = Phase::Speaking(0);
    stats.turns_started += 1;
    loop {
        tokio::select! {
            _ = clock.tick() => {
                let packet = match &mut phase {
                    Phase::Speaking(i) => {
                        let packet = speech[*i].clone();
                        *i += 1;
                        if *i == speech.len() {
                            phase = Phase::Waiting { ended: Instant::now(), begun: None, audio: false };
                        }
                        packet
                    }
                    Phase::Waiting { ended, begun, .. } => {
                        if ended.elapsed() > answer_timeout {
                            if begun.is_some() {
                                stats.unfinished += 1;
                            } else {
                                stats.unanswered += 1;
                            }
                            if Instant::now() >= stop_at {
                                break;
                            }
                            stats.turns_started += 1;
                            phase = Phase::Speaking(0);
                        }
                        silence.clone()
                    }
                };
                if client.send_audio(packet, InferenceTriggerMode::Immediate).await.is_err() {
                    stats.lost = true;
                    break;
                }
            }
            event = client.next_event() => {
                let Some(event) = event else {
                    stats.lost = true;
                    break;
                };
                match (&mut phase, event) {
                    (Phase::Speaking(_), Event::ResponseBegin { .. }) => stats.cut += 1,
                    (Phase::Waiting { ended, begun, .. }, Event::ResponseBegin { .. }) if begun.is_none() => {
                        *begun = Some(Instant::now());
                        stats.tts_start_us.push(micros(ended.elapsed()));
                    }
                    (Phase::Waiting { ended, audio, .. }, Event::AudioChunk { audio: a, .. }) => {
                        stats.audio_bytes += a.len() as u64;
                        if !*audio {
                            *audio = true;
                            stats.first_audio_us.push(micros(ended.elapsed()));
                        }
                    }
                    (Phase::Waiting { begun: Some(_), .. }, Event::ResponseEnd { .. }) => {
                        stats.turns_done += 1;
                        if Instant::now() >= stop_at {
                            break;
                        }
                        stats.turns_started += 1;
                        phase = Phase::Speaking(0);
                    }
                    (_, Event::AudioChunk { audio: a, .. }) => stats.audio_bytes += a.len() as u64,
                    _ => {}
                }
            }
        }
    }
    client.close().await;
    stats
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
