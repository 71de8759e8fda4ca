//! WebRTC load: N concurrent VIP sessions from one process, each its own UDP socket and str0m
//! connection, each streaming the WAV at real time as spoken turns and receiving the replies;
//! the summary adds up what a listener would notice (first-audio latency, lost and late reply
//! packets) and, given the server's pid, what the server spent (CPU and memory from `/proc`).

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::time::{Instant, sleep_until};

use super::{EncodedSpeech, Plan, SILENCE_TAIL, WebrtcOutcome, WebrtcStats, session};
use crate::events::Events;

/// What load to generate.
#[derive(Debug, Clone)]
pub struct WebrtcLoadOptions {
    /// The server's base URL (`http://host:8080`).
    pub url: String,
    /// Concurrent sessions.
    pub sessions: usize,
    /// Spoken turns per session.
    pub turns: usize,
    /// The speech each turn streams.
    pub wav: PathBuf,
    /// Sessions start spread over this long.
    pub ramp: Duration,
    /// Each session gives up after this long.
    pub timeout: Duration,
    /// The address the sessions' UDP sockets bind.
    pub bind: IpAddr,
    /// The server's process id, to sample its CPU and memory (Linux `/proc`).
    pub server_pid: Option<u32>,
    /// A token sent as `Authorization: Bearer` with each offer (`[vip] tokens`).
    pub token: Option<String>,
}

/// The server's CPU and memory over the run.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ServerUsage {
    /// CPU time used during the run, in seconds (user + system).
    pub cpu_seconds: f64,
    /// That time over the run's wall time, in percent of one core.
    pub cpu_percent_of_one_core: f64,
    /// Resident memory before the first session, KB.
    pub rss_kb_before: u64,
    /// The most resident memory seen (sampled every second), KB.
    pub rss_kb_peak: u64,
    /// Resident memory after the last session, KB.
    pub rss_kb_after: u64,
    /// (peak − before) / sessions, KB.
    pub peak_kb_per_session: f64,
}

/// The totals printed at the end.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct WebrtcLoadSummary {
    /// Sessions started.
    pub sessions: usize,
    /// Sessions that completed every turn without an error.
    pub sessions_ok: usize,
    /// Sessions whose ICE and DTLS completed.
    pub connected: usize,
    /// Sessions that ended with an error.
    pub sessions_with_errors: usize,
    /// Up to ten distinct errors.
    pub errors: Vec<String>,
    /// Replies completed, all sessions.
    pub turns: u64,
    /// Opus frames sent, all sessions.
    pub frames_sent: u64,
    /// Frames the client sent late (the client machine fell behind).
    pub late_sends: u64,
    /// Reply RTP packets received.
    pub packets_received: u64,
    /// Reply packets missing from the RTP sequences.
    pub lost_packets: u64,
    /// Reply packets that arrived after their playout time with a 40 ms jitter buffer.
    pub late_packets: u64,
    /// The most any reply packet arrived behind its time, ms (the buffer that would have
    /// played everything).
    pub max_delay_ms: u64,
    /// Reply packets that arrived over 40 ms after the previous one mid-reply.
    pub long_gaps: u64,
    /// Of those, the ones where the sender's RTP time also jumped.
    pub long_gaps_with_rtp_gap: u64,
    /// The longest arrival spacing within any reply, ms.
    pub max_gap_ms: u64,
    /// Reply audio received, all sessions, seconds.
    pub reply_audio_seconds: f64,
    /// First-audio latency (end of speech → first reply packet), median, ms.
    pub first_audio_latency_ms_p50: Option<u64>,
    /// 99th percentile, ms.
    pub first_audio_latency_ms_p99: Option<u64>,
    /// The worst, ms.
    pub first_audio_latency_ms_max: Option<u64>,
    /// Median time from the answer to ICE and DTLS completing, ms.
    pub connect_ms_p50: Option<u64>,
    /// Wall time of the run, seconds.
    pub wall_seconds: f64,
    /// The server's CPU and memory, when its pid was given.
    pub server: Option<ServerUsage>,
}

/// The nearest-rank percentile `p` (percent, 0..=100) of sorted `values`.
#[must_use]
pub fn percentile(sorted: &[u64], p: usize) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    // Rank k is the smallest with k / n >= p / 100.
    let n = sorted.len();
    let rank = (p.min(100) * n).div_ceil(100);
    sorted.get(rank.clamp(1, n) - 1).copied()
}

impl WebrtcLoadSummary {
    /// Adds up the sessions' counters; a session is ok when it has no error and completed
    /// `turns` replies.
    #[must_use]
    pub fn from_sessions(stats: &[WebrtcStats], turns: usize) -> Self {
        let mut s = Self {
            sessions: stats.len(),
            ..Self::default()
        };
        let mut latencies = Vec::new();
        let mut connects = Vec::new();
        for st in stats {
            s.connected += usize::from(st.connected);
            if st.error.is_none() && st.turns >= turns as u64 {
                s.sessions_ok += 1;
            }
            if let Some(e) = &st.error {
                s.sessions_with_errors += 1;
                if s.errors.len() < 10 && !s.errors.contains(e) {
                    s.errors.push(e.clone());
                }
            }
            s.turns += st.turns;
            s.frames_sent += st.frames_sent;
            s.late_sends += st.late_sends;
            s.packets_received += st.packets_received;
            s.lost_packets += st.lost_packets;
            s.late_packets += st.late_packets;
            s.max_delay_ms = s.max_delay_ms.max(st.max_delay_ms);
            s.long_gaps += st.long_gaps;
            s.long_gaps_with_rtp_gap += st.long_gaps_with_rtp_gap;
            s.max_gap_ms = s.max_gap_ms.max(st.max_gap_ms);
            s.reply_audio_seconds += st.reply_audio_seconds;
            latencies.extend_from_slice(&st.first_audio_latency_ms);
            connects.extend(st.connect_ms);
        }
        s.reply_audio_seconds = (s.reply_audio_seconds * 1000.0).round() / 1000.0;
        latencies.sort_unstable();
        connects.sort_unstable();
        s.first_audio_latency_ms_p50 = percentile(&latencies, 50);
        s.first_audio_latency_ms_p99 = percentile(&latencies, 99);
        s.first_audio_latency_ms_max = latencies.last().copied();
        s.connect_ms_p50 = percentile(&connects, 50);
        s
    }
}

/// Runs the load and returns the summary.
///
/// # Errors
/// Only when the WAV cannot be read or encoded or no HTTP client can be made; session failures are counted, not returned.
pub async fn run(opts: &WebrtcLoadOptions) -> anyhow::Result<WebrtcLoadSummary> {
    let speech = Arc::new(EncodedSpeech::from_wav(&opts.wav, SILENCE_TAIL)?);
    let plan = Arc::new(Plan::speech(
        speech,
        opts.turns.max(1),
        opts.timeout,
        opts.bind,
        opts.token.clone(),
    )?);
    let n = opts.sessions.max(1);
    let before = opts.server_pid.and_then(sample);
    let peak = Arc::new(std::sync::atomic::AtomicU64::new(
        before.map_or(0, |s| s.rss_kb),
    ));
    let sampler = opts.server_pid.map(|pid| {
        let peak = Arc::clone(&peak);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                if let Some(s) = sample(pid) {
                    peak.fetch_max(s.rss_kb, std::sync::atomic::Ordering::Relaxed);
                }
            }
        })
    });
    let step = opts.ramp / u32::try_from(n).unwrap_or(u32::MAX);
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let plan = Arc::clone(&plan);
        let url = opts.url.clone();
        let begin = start + step * u32::try_from(i).unwrap_or(u32::MAX);
        tasks.push(tokio::spawn(async move {
            sleep_until(begin).await;
            let mut out = WebrtcOutcome::default();
            let result = session(&url, None, &plan, &mut Events::discard(), &mut out).await;
            if let Err(e) = result {
                out.stats.error = Some(format!("{e:#}"));
            }
            out.stats.reply_audio_seconds =
                (out.stats.reply_audio_seconds * 1000.0).round() / 1000.0;
            out.stats
        }));
    }
    let mut stats = Vec::with_capacity(n);
    for t in tasks {
        stats.push(t.await.unwrap_or_else(|e| WebrtcStats {
            error: Some(format!("task failed: {e}")),
            ..WebrtcStats::default()
        }));
    }
    let wall = start.elapsed().as_secs_f64();
    if let Some(s) = sampler {
        s.abort();
    }
    let mut summary = WebrtcLoadSummary::from_sessions(&stats, opts.turns.max(1));
    summary.wall_seconds = (wall * 10.0).round() / 10.0;
    if let (Some(pid), Some(before)) = (opts.server_pid, before)
        && let Some(after) = sample(pid)
    {
        let ticks = crate::procstat::clock_ticks();
        let cpu_seconds = after.cpu_ticks.saturating_sub(before.cpu_ticks) as f64 / ticks as f64;
        let rss_kb_peak = peak
            .load(std::sync::atomic::Ordering::Relaxed)
            .max(after.rss_kb);
        summary.server = Some(ServerUsage {
            cpu_seconds,
            cpu_percent_of_one_core: if wall > 0.0 {
                cpu_seconds / wall * 100.0
            } else {
                0.0
            },
            rss_kb_before: before.rss_kb,
            rss_kb_peak,
            rss_kb_after: after.rss_kb,
            peak_kb_per_session: rss_kb_peak.saturating_sub(before.rss_kb) as f64 / n as f64,
        });
    }
    Ok(summary)
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    cpu_ticks: u64,
    rss_kb: u64,
}

/// The process's CPU ticks (user + system) and resident memory, from Linux `/proc`.
fn sample(pid: u32) -> Option<Sample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| -> u64 { fields.get(n - 3).and_then(|f| f.parse().ok()).unwrap_or(0) };
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Some(Sample {
        cpu_ticks: field(14) + field(15),
        rss_kb,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        assert_eq!(percentile(&[], 50), None);
        assert_eq!(percentile(&[7], 99), Some(7));
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50), Some(50));
        assert_eq!(percentile(&v, 99), Some(99));
        assert_eq!(percentile(&v, 100), Some(100));
        assert_eq!(percentile(&[1, 2, 3], 0), Some(1));
    }

    #[test]
    fn summary_adds_up_and_counts_ok_sessions() {
        let ok = WebrtcStats {
            connected: true,
            connect_ms: Some(5),
            turns: 1,
            packets_received: 100,
            late_packets: 1,
            max_delay_ms: 50,
            long_gaps: 2,
            max_gap_ms: 45,
            first_audio_latency_ms: vec![300],
            reply_audio_seconds: 2.0,
            ..WebrtcStats::default()
        };
        let short = WebrtcStats {
            connected: true,
            turns: 0,
            ..WebrtcStats::default()
        };
        let failed = WebrtcStats {
            error: Some("refused".into()),
            ..WebrtcStats::default()
        };
        let s =
            WebrtcLoadSummary::from_sessions(&[ok.clone(), ok, short, failed.clone(), failed], 1);
        assert_eq!((s.sessions, s.sessions_ok, s.connected), (5, 2, 3));
        assert_eq!((s.sessions_with_errors, s.errors.len()), (2, 1));
        assert_eq!(
            (s.packets_received, s.late_packets, s.max_gap_ms),
            (200, 2, 45)
        );
        assert_eq!((s.long_gaps, s.max_delay_ms), (4, 50));
        assert_eq!(s.first_audio_latency_ms_p50, Some(300));
        assert_eq!(s.connect_ms_p50, Some(5));
        assert!((s.reply_audio_seconds - 4.0).abs() < 1e-9);
    }

    #[test]
    fn own_process_can_be_sampled() {
        let s = sample(std::process::id()).unwrap();
        assert!(s.rss_kb > 0);
        assert!(crate::procstat::clock_ticks() > 0);
        assert!(sample(u32::MAX).is_none());
    }
}
