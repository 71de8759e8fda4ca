//! What each Opus encoder complexity (0..=10) costs in CPU and bitrate on real speech, and the
//! decoded audio to score its quality with (`opus_quality.py`, PESQ wideband).
//!
//! Why: the Xiaozhi door encodes every reply as 60 ms Opus frames at 24 kHz, and at hundreds of
//! sessions that encoder is a quarter of the server's CPU. Its complexity (`opus_complexity`,
//! default 5) is the knob; this measures what lowering it saves and loses.
//!
//! ```text
//! cargo run --release -p voxgate-audio --example opus_complexity
//! cargo run --release -p voxgate-audio --no-default-features --example opus_complexity   # opus-rs only
//! python3 crates/voxgate-audio/examples/opus_quality.py
//! ```
//!
//! Options: `--backend libopus|opus-rs|all` (default: every backend built in), `--application
//! audio|voip|all` (default all: the door's default is `audio`, `voip` is the other choice),
//! `--rate 24000` (encoder input rate; 16000 is the device uplink's format), `--bitrate 24000`,
//! `--passes 15` (timed passes; the median is reported), `--input FILE.wav` (any rate; default
//! the committed speech fixture, 16 kHz), `--out DIR` (default `target/opus-quality` in the
//! workspace).
//!
//! Per configuration it writes, in `DIR/<backend>-<application>-<rate>k/` (prefixed with the
//! `--input` file's name when given: `DIR/<name>-<backend>-...`), `ref.wav` (the source at
//! 16 kHz) and `c0.wav`..`c10.wav`: the packets decoded by the same backend straight to 16 kHz
//! (what PESQ wideband takes), shifted by the lag that maximises their cross-correlation with the
//! reference, so they line up sample for sample. Encoder settings are the door's:
//! `OpusEncoderConfig::voice(rate)` with 60 ms frames, VBR, the given bitrate and application.
//!
//! Timing: every timed pass encodes the whole input once per complexity with a fresh encoder,
//! complexities interleaved so that a busy machine slows them all alike; one warm-up pass is
//! not counted. Reported per 60 ms frame: the median over passes of the mean over all frames
//! and of the frames with speech (RMS above -50 dBFS), and the mean over frames of each frame's
//! fastest encode in any pass (the best estimate of an idle core when other jobs share it).
//! The table also gives the bitrate over all frames and over speech frames, and the coding
//! modes of the speech packets as their TOC bytes announce them: at 24 kbit/s the encoder's
//! choice between CELT, hybrid and SILK moves both cost and quality more than the complexity's
//! own effort does.
//!
//! Input: the committed fixture is espeak-ng speech at 16 kHz, so nothing lies above 8 kHz; a
//! 24 kHz encoder at complexity 7 and up notices and codes it as SILK wideband, which real TTS
//! (content up to 12 kHz) does not get. For figures that stand for real replies use full-band
//! human speech, e.g. the voice prompts of Debian's `alsa-utils` (48 kHz):
//!
//! ```text
//! apt-get install alsa-utils sox
//! cd /usr/share/sounds/alsa && for f in Front_Left Front_Center Front_Right Side_Left Side_Right \
//!   Rear_Left Rear_Center Rear_Right; do sox $f.wav /tmp/$f.pad.wav pad 0 0.3; done
//! sox /tmp/{Front_Left,Front_Center,Front_Right,Side_Left,Side_Right,Rear_Left,Rear_Center,Rear_Right}.pad.wav /tmp/alsa-voice.wav
//! cargo run --release -p voxgate-audio --example opus_complexity -- --input /tmp/alsa-voice.wav
//! ```

use std::path::{Path, PathBuf};
use std::time::Instant;

use voxgate_audio::format::f32_to_i16;
use voxgate_audio::opus::{
    FrameDuration, OpusApplication, OpusBackend, OpusDecoder, OpusEncoder, OpusEncoderConfig,
};
use voxgate_audio::resample::Resampler;
use voxgate_audio::wav::{read_wav, write_wav_i16};

/// PESQ wideband works at 16 kHz.
const SCORE_RATE: u32 = 16_000;
/// Longest codec delay searched for when aligning, in samples at 16 kHz (100 ms).
const MAX_LAG: usize = 1600;
/// Frames quieter than this (RMS, dBFS) count as pauses, not speech.
const SPEECH_DBFS: f64 = -50.0;

struct Args {
    backends: Vec<OpusBackend>,
    applications: Vec<OpusApplication>,
    rate: u32,
    bitrate: u32,
    passes: usize,
    input: Option<PathBuf>,
    out: PathBuf,
}

fn usage(msg: &str) -> ! {
    eprintln!(
        "{msg}\nusage: opus_complexity [--backend libopus|opus-rs|all] [--application audio|voip|all] \
         [--rate HZ] [--bitrate BPS] [--passes N] [--input FILE.wav] [--out DIR]"
    );
    std::process::exit(2);
}

fn parse_args() -> Args {
    let available: Vec<OpusBackend> = [OpusBackend::Libopus, OpusBackend::Pure]
        .into_iter()
        .filter(|b| b.is_available())
        .collect();
    let mut args = Args {
        backends: available.clone(),
        applications: vec![OpusApplication::Audio, OpusApplication::Voip],
        rate: 24_000,
        bitrate: 24_000,
        passes: 15,
        input: None,
        out: Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/opus-quality"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let Some(value) = it.next() else {
            usage(&format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--backend" => {
                args.backends = match value.as_str() {
                    "all" => available.clone(),
                    "libopus" => vec![OpusBackend::Libopus],
                    "opus-rs" | "pure" => vec![OpusBackend::Pure],
                    _ => usage(&format!("unknown backend {value}")),
                };
                if let Some(b) = args.backends.iter().find(|b| !b.is_available()) {
                    usage(&format!(
                        "{} is not built in (drop --no-default-features)",
                        backend_name(*b)
                    ));
                }
            }
            "--application" => {
                args.applications = match value.as_str() {
                    "all" => vec![OpusApplication::Audio, OpusApplication::Voip],
                    "audio" => vec![OpusApplication::Audio],
                    "voip" => vec![OpusApplication::Voip],
                    _ => usage(&format!("unknown application {value}")),
                };
            }
            "--rate" => args.rate = value.parse().unwrap_or_else(|_| usage("bad --rate")),
            "--bitrate" => args.bitrate = value.parse().unwrap_or_else(|_| usage("bad --bitrate")),
            "--passes" => {
                args.passes = value
                    .parse::<usize>()
                    .ok()
                    .filter(|&n| n > 0)
                    .unwrap_or_else(|| usage("bad --passes"));
            }
            "--input" => args.input = Some(PathBuf::from(value)),
            "--out" => args.out = PathBuf::from(value),
            _ => usage(&format!("unknown option {flag}")),
        }
    }
    args
}

const fn backend_name(b: OpusBackend) -> &'static str {
    match b {
        OpusBackend::Libopus => "libopus",
        _ => "opus-rs",
    }
}

const fn application_name(a: OpusApplication) -> &'static str {
    match a {
        OpusApplication::Audio => "audio",
        OpusApplication::Voip => "voip",
        _ => "lowdelay",
    }
}

/// `samples` at `from` Hz converted to `to` Hz, the resampler's delay removed so both line up.
fn resample(samples: &[f32], from: u32, to: u32) -> Vec<f32> {
    let mut r = Resampler::new(from, to).unwrap_or_else(|e| usage(&e.to_string()));
    let mut out = Vec::new();
    r.process(samples, &mut out);
    r.flush(&mut out);
    let delay = r.delay().min(out.len());
    out.drain(..delay);
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn rms_dbfs(frame: &[i16]) -> f64 {
    let sum: f64 = frame.iter().map(|&s| f64::from(s).powi(2)).sum();
    let rms = (sum / frame.len().max(1) as f64).sqrt() / 32768.0;
    20.0 * rms.max(1e-10).log10()
}

/// The lag of `test` behind `reference` (0..=MAX_LAG) with the largest cross-correlation.
fn best_lag(reference: &[i16], test: &[i16]) -> usize {
    (0..=MAX_LAG)
        .max_by(|&a, &b| xcorr(reference, test, a).total_cmp(&xcorr(reference, test, b)))
        .unwrap_or(0)
}

fn xcorr(reference: &[i16], test: &[i16], lag: usize) -> f64 {
    reference
        .iter()
        .zip(test.iter().skip(lag))
        .map(|(&a, &b)| f64::from(a) * f64::from(b))
        .sum()
}

/// Coding mode and audio bandwidth a packet's TOC byte announces (RFC 6716 section 3.1).
fn toc_mode(packet: &[u8]) -> &'static str {
    const NAMES: [&str; 32] = [
        "SILK NB",
        "SILK NB",
        "SILK NB",
        "SILK NB",
        "SILK MB",
        "SILK MB",
        "SILK MB",
        "SILK MB",
        "SILK WB",
        "SILK WB",
        "SILK WB",
        "SILK WB",
        "hybrid SWB",
        "hybrid SWB",
        "hybrid FB",
        "hybrid FB",
        "CELT NB",
        "CELT NB",
        "CELT NB",
        "CELT NB",
        "CELT WB",
        "CELT WB",
        "CELT WB",
        "CELT WB",
        "CELT SWB",
        "CELT SWB",
        "CELT SWB",
        "CELT SWB",
        "CELT FB",
        "CELT FB",
        "CELT FB",
        "CELT FB",
    ];
    packet
        .first()
        .map_or("empty", |&toc| NAMES[usize::from(toc >> 3)])
}

/// The modes of the speech packets, most used first, with their share, e.g. `CELT FB 93%`.
fn modes(packets: &[Vec<u8>], speech: &[bool]) -> String {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for (p, _) in packets.iter().zip(speech).filter(|(_, s)| **s) {
        let m = toc_mode(p);
        match counts.iter_mut().find(|(name, _)| *name == m) {
            Some((_, n)) => *n += 1,
            None => counts.push((m, 1)),
        }
    }
    counts.sort_by_key(|c| std::cmp::Reverse(c.1));
    let total: usize = counts.iter().map(|(_, n)| n).sum::<usize>().max(1);
    counts
        .iter()
        .map(|(m, n)| format!("{m} {}%", n * 100 / total))
        .collect::<Vec<_>>()
        .join(", ")
}

fn write_wav(path: &Path, samples: &[i16]) {
    let file = std::fs::File::create(path)
        .unwrap_or_else(|e| usage(&format!("create {}: {e}", path.display())));
    if let Err(e) = write_wav_i16(std::io::BufWriter::new(file), SCORE_RATE, 1, samples) {
        usage(&format!("write {}: {e}", path.display()));
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// One encoder configuration's results per complexity.
#[derive(Default, Clone)]
struct Row {
    /// Per timed pass: mean µs per frame over all frames, and over speech frames.
    all_us: Vec<f64>,
    speech_us: Vec<f64>,
    /// Per frame: its fastest encode over the timed passes.
    frame_min: Vec<f64>,
    /// Packets of the first pass (the encoder is deterministic).
    packets: Vec<Vec<u8>>,
}

fn encoder_config(
    args: &Args,
    backend: OpusBackend,
    app: OpusApplication,
    c: u8,
) -> OpusEncoderConfig {
    OpusEncoderConfig {
        frame_duration: FrameDuration::Ms60,
        bitrate: args.bitrate,
        complexity: c,
        cbr: false,
        application: app,
        backend,
        ..OpusEncoderConfig::voice(args.rate)
    }
}

fn main() {
    let args = parse_args();
    let (source, source_rate) = match &args.input {
        Some(path) => {
            let bytes = std::fs::read(path)
                .unwrap_or_else(|e| usage(&format!("read {}: {e}", path.display())));
            let wav = read_wav(&bytes).unwrap_or_else(|e| usage(&e.to_string()));
            (wav.to_mono(), wav.sample_rate)
        }
        None => {
            let wav = read_wav(include_bytes!("../tests/fixtures/speech.wav"))
                .unwrap_or_else(|e| usage(&e.to_string()));
            (wav.to_mono(), wav.sample_rate)
        }
    };
    let reference: Vec<i16> = resample(&source, source_rate, SCORE_RATE)
        .into_iter()
        .map(f32_to_i16)
        .collect();
    let mut pcm: Vec<i16> = resample(&source, source_rate, args.rate)
        .into_iter()
        .map(f32_to_i16)
        .collect();
    let frame = FrameDuration::Ms60.samples(args.rate);
    // Whole frames, plus one more of silence so the codec's delay does not cut the tail.
    pcm.resize((pcm.len().div_ceil(frame) + 1) * frame, 0);
    let frames: Vec<&[i16]> = pcm.chunks_exact(frame).collect();
    let speech: Vec<bool> = frames.iter().map(|f| rms_dbfs(f) > SPEECH_DBFS).collect();
    let n_speech = speech.iter().filter(|&&s| s).count().max(1);
    let seconds = frames.len() as f64 * 0.06;

    println!(
        "input: {} ({} Hz, {:.2} s, {} frames of 60 ms at {} Hz, {} with speech); {} timed passes; load average at start {}",
        args.input.as_ref().map_or_else(
            || "tests/fixtures/speech.wav".into(),
            |p| p.display().to_string()
        ),
        source_rate,
        source.len() as f64 / f64::from(source_rate),
        frames.len(),
        args.rate,
        n_speech,
        args.passes,
        loadavg()
    );

    for &backend in &args.backends {
        for &app in &args.applications {
            let mut rows = vec![
                Row {
                    frame_min: vec![f64::INFINITY; frames.len()],
                    ..Row::default()
                };
                11
            ];
            for pass in 0..=args.passes {
                for (c, row) in (0u8..).zip(rows.iter_mut()) {
                    let mut enc = OpusEncoder::new(encoder_config(&args, backend, app, c))
                        .unwrap_or_else(|e| usage(&e.to_string()));
                    let (mut all, mut in_speech) = (0f64, 0f64);
                    for (k, (f, &is_speech)) in frames.iter().zip(&speech).enumerate() {
                        let t = Instant::now();
                        let packet = enc.encode(f).unwrap_or_else(|e| usage(&e.to_string()));
                        let us = t.elapsed().as_secs_f64() * 1e6;
                        all += us;
                        if is_speech {
                            in_speech += us;
                        }
                        if pass == 0 {
                            row.packets.push(packet.to_vec());
                        } else if let Some(m) = row.frame_min.get_mut(k) {
                            *m = m.min(us);
                        }
                    }
                    if pass > 0 {
                        row.all_us.push(all / frames.len() as f64);
                        row.speech_us.push(in_speech / n_speech as f64);
                    }
                }
            }

            // An `--input` file's results go beside the fixture's, named after the file.
            let prefix = args
                .input
                .as_ref()
                .and_then(|p| p.file_stem())
                .map_or_else(String::new, |s| format!("{}-", s.to_string_lossy()));
            let dir_name = format!(
                "{prefix}{}-{}-{}k",
                backend_name(backend),
                application_name(app),
                args.rate / 1000
            );
            let dir = args.out.join(&dir_name);
            std::fs::create_dir_all(&dir)
                .unwrap_or_else(|e| usage(&format!("create {}: {e}", dir.display())));
            write_wav(&dir.join("ref.wav"), &reference);

            println!(
                "\n### {} {}, {} kHz, 60 ms, {} kbit/s VBR (load average after: {})\n",
                backend_name(backend),
                application_name(app),
                args.rate / 1000,
                args.bitrate / 1000,
                loadavg()
            );
            println!(
                "| complexity | encode µs / 60 ms frame (median) | speech frames (median) | per-frame minimum | kbit/s | speech kbit/s | speech modes | lag | file |"
            );
            println!("|---|---|---|---|---|---|---|---|---|");
            for (c, row) in rows.iter().enumerate() {
                let mut dec =
                    OpusDecoder::new(SCORE_RATE, backend).unwrap_or_else(|e| usage(&e.to_string()));
                let mut decoded = Vec::new();
                for p in &row.packets {
                    decoded
                        .extend_from_slice(dec.decode(p).unwrap_or_else(|e| usage(&e.to_string())));
                }
                let lag = best_lag(&reference, &decoded);
                let mut aligned: Vec<i16> = decoded
                    .iter()
                    .skip(lag)
                    .take(reference.len())
                    .copied()
                    .collect();
                aligned.resize(reference.len(), 0);
                let file = format!("{dir_name}/c{c}.wav");
                write_wav(&dir.join(format!("c{c}.wav")), &aligned);

                let bytes: usize = row.packets.iter().map(Vec::len).sum();
                let speech_bytes: usize = row
                    .packets
                    .iter()
                    .zip(&speech)
                    .filter(|(_, s)| **s)
                    .map(|(p, _)| p.len())
                    .sum();
                let idle = row.frame_min.iter().sum::<f64>() / frames.len() as f64;
                println!(
                    "| {c} | {:.0} | {:.0} | {:.0} | {:.1} | {:.1} | {} | {:.1} ms | {file} |",
                    median(row.all_us.clone()),
                    median(row.speech_us.clone()),
                    idle,
                    bytes as f64 * 8.0 / seconds / 1000.0,
                    speech_bytes as f64 * 8.0 / (n_speech as f64 * 0.06) / 1000.0,
                    modes(&row.packets, &speech),
                    lag as f64 * 1000.0 / f64::from(SCORE_RATE),
                );
            }
        }
    }
    println!("\nload average at end: {}", loadavg());
}
