//! The audio work one Xiaozhi turn of the load generator's pattern costs (uplink Opus decode,
//! VAD, reply Opus encode) and the CPU that work alone takes at a number of sessions: the floor
//! under any server's cost per turn, whatever its sockets, tasks and engine cost on top.
//!
//! Why: issue 17 asks for 1,000 streaming sessions on a 2-core machine. Before asking how much
//! cheaper the server's own code can get, this says how much of the machine the codecs and the
//! VAD take by themselves, with the libopus build the server uses by default.
//!
//! ```text
//! cargo run --release -p voxgate-audio --example turn_floor
//! cargo run --release -p voxgate-audio --example turn_floor -- --sessions 300,1000 --turn-seconds 3.33
//! ```
//!
//! A turn is what `cargo xtask load` has each device do: the built-in question (the committed
//! `question.wav`, 2.09 s) then silence as 60 ms Opus frames at 16 kHz, encoded as the
//! generator does (`OpusEncoderConfig::voice(16000)`), until the reply has played; and a reply
//! of 1.0 s at 24 kHz (the fake synthesizer's rate and length; its sound is the committed
//! `speech.wav`'s speech, so the encoder works on real speech), encoded with the Xiaozhi door's
//! defaults (60 ms frames, 24 kbit/s, complexity 5, the `audio` application). The server side
//! is done as the door does it: a fresh libopus decoder per utterance decoding to `f32`, the
//! VAD at its defaults over every decoded frame, a fresh encoder per reply.
//!
//! `--turn-seconds` is how often a session takes a turn (default 3.33 s: `cargo xtask load
//! --sessions 300` ran 5,400 turns of 300 sessions in 60 s, since a device starts its next
//! question when the reply's `tts stop` arrives); it sets how many silent frames a turn
//! carries and the turns a second of the given sessions. Timing: `--passes` (default 30) whole
//! turns after one warm-up, each part's fastest pass reported (the best estimate of an idle
//! core when other jobs share the machine), so the floor is a lower bound. `--complexity`
//! (default 5, the door's `opus_complexity`) sets the reply encoder's effort.

use std::time::{Duration, Instant};

use voxgate_audio::format::f32_to_i16;
use voxgate_audio::opus::{
    FrameDuration, OpusApplication, OpusBackend, OpusDecoder, OpusEncoder, OpusEncoderConfig,
};
use voxgate_audio::resample::Resampler;
use voxgate_audio::vad::{Vad, VadConfig};
use voxgate_audio::wav::read_wav;

const UPLINK_RATE: u32 = 16_000;
const FRAME: Duration = Duration::from_millis(60);
const REPLY: Duration = Duration::from_secs(1);
/// The reply's rate: what the fake synthesizer of `cargo xtask load` sends.
const REPLY_RATE: u32 = 24_000;
/// Where the speech of the committed `speech.wav` starts, in samples at 16 kHz
/// (`tests/fixtures/fixtures.txt`).
const SPEECH_START: usize = 12_800;

struct Args {
    sessions: Vec<u32>,
    turn_seconds: f64,
    cores: f64,
    passes: usize,
    complexity: u8,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        sessions: vec![300, 1_000],
        turn_seconds: 3.33,
        cores: 2.0,
        passes: 30,
        complexity: 5,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--sessions" => {
                a.sessions = value()?
                    .split(',')
                    .map(|s| s.trim().parse().map_err(|e| format!("--sessions {s}: {e}")))
                    .collect::<Result<_, _>>()?;
            }
            "--turn-seconds" => {
                a.turn_seconds = value()?
                    .parse()
                    .map_err(|e| format!("--turn-seconds: {e}"))?;
            }
            "--cores" => a.cores = value()?.parse().map_err(|e| format!("--cores: {e}"))?,
            "--passes" => a.passes = value()?.parse().map_err(|e| format!("--passes: {e}"))?,
            "--complexity" => {
                a.complexity = value()?
                    .parse()
                    .ok()
                    .filter(|c| *c <= 10)
                    .ok_or("--complexity takes 0 to 10")?;
            }
            "-h" | "--help" => {
                return Err(
                    "options: --sessions 300,1000 --turn-seconds 3.33 --cores 2 \
                            --passes 30 --complexity 5"
                        .into(),
                );
            }
            other => return Err(format!("unknown option {other} (try --help)")),
        }
    }
    let speech_len = question_16k()?.len() as f64 / f64::from(UPLINK_RATE);
    if !(a.turn_seconds.is_finite() && a.turn_seconds > speech_len) {
        return Err(format!(
            "--turn-seconds must be longer than the question ({speech_len:.2} s)"
        ));
    }
    if a.passes == 0 || a.sessions.is_empty() || a.cores.is_nan() || a.cores <= 0.0 {
        return Err("--passes, --sessions and --cores must be positive".into());
    }
    Ok(a)
}

fn question_16k() -> Result<Vec<f32>, String> {
    let wav = read_wav(include_bytes!("../tests/fixtures/question.wav"))
        .map_err(|e| format!("question.wav: {e}"))?;
    resample(&wav.to_mono(), wav.sample_rate, UPLINK_RATE)
}

fn resample(pcm: &[f32], from: u32, to: u32) -> Result<Vec<f32>, String> {
    if from == to {
        return Ok(pcm.to_vec());
    }
    let mut r = Resampler::new(from, to).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    r.process(pcm, &mut out);
    r.flush(&mut out);
    Ok(out)
}

/// One second of the committed speech fixture (espeak-ng, 16 kHz) from where its speech
/// starts, at the reply's rate and padded to whole frames, as 16-bit samples: the door encodes
/// replies from `i16`.
fn reply_pcm() -> Result<Vec<i16>, String> {
    let wav = read_wav(include_bytes!("../tests/fixtures/speech.wav"))
        .map_err(|e| format!("speech.wav: {e}"))?;
    let mono = wav.to_mono();
    let n = usize::try_from(wav.sample_rate).unwrap_or(usize::MAX);
    let second = mono
        .get(SPEECH_START..SPEECH_START + n)
        .ok_or("speech.wav is shorter than expected")?;
    let mut out = resample(second, wav.sample_rate, REPLY_RATE)?;
    // The door pads the reply's last frame with silence.
    let frames = REPLY.as_millis().div_ceil(FRAME.as_millis());
    out.resize(
        frame_samples(REPLY_RATE) * usize::try_from(frames).unwrap_or(0),
        0.0,
    );
    Ok(out.into_iter().map(f32_to_i16).collect())
}

fn frame_samples(rate: u32) -> usize {
    usize::try_from(u128::from(rate) * FRAME.as_millis() / 1_000).unwrap_or(usize::MAX)
}

/// The device's packets for one turn: the question padded to whole frames, then silence up to
/// `turn_seconds`.
fn uplink_packets(turn_seconds: f64) -> Result<Vec<Vec<u8>>, String> {
    let mut pcm = question_16k()?;
    let n = frame_samples(UPLINK_RATE);
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a positive number of 60 ms frames, checked in parse"
    )]
    let frames = (turn_seconds / FRAME.as_secs_f64()).round() as usize;
    pcm.resize(frames.max(pcm.len().div_ceil(n)) * n, 0.0);
    let mut enc =
        OpusEncoder::new(OpusEncoderConfig::voice(UPLINK_RATE)).map_err(|e| e.to_string())?;
    pcm.chunks_exact(n)
        .map(|f| {
            enc.encode_f32(f)
                .map(<[u8]>::to_vec)
                .map_err(|e| e.to_string())
        })
        .collect()
}

fn reply_config(complexity: u8) -> OpusEncoderConfig {
    OpusEncoderConfig {
        frame_duration: FrameDuration::Ms60,
        application: OpusApplication::Audio,
        backend: OpusBackend::Libopus,
        complexity,
        ..OpusEncoderConfig::voice(REPLY_RATE)
    }
}

/// One pass of each part, timed apart.
fn pass(packets: &[Vec<u8>], reply: &[i16], complexity: u8) -> Result<[Duration; 3], String> {
    let (mut decode, mut vad_time) = (Duration::ZERO, Duration::ZERO);
    let started = Instant::now();
    let mut dec = OpusDecoder::new(UPLINK_RATE, OpusBackend::Libopus).map_err(|e| e.to_string())?;
    let mut vad = Vad::new(VadConfig::default(), UPLINK_RATE).map_err(|e| e.to_string())?;
    decode += started.elapsed();
    for p in packets {
        let t = Instant::now();
        let pcm = dec.decode_f32(p).map_err(|e| e.to_string())?;
        let decoded = Instant::now();
        vad.process(pcm);
        while std::hint::black_box(vad.poll_output()).is_some() {}
        vad_time += decoded.elapsed();
        decode += decoded - t;
    }
    let t = Instant::now();
    let mut enc = OpusEncoder::new(reply_config(complexity)).map_err(|e| e.to_string())?;
    for f in reply.chunks_exact(frame_samples(REPLY_RATE)) {
        std::hint::black_box(enc.encode(f).map_err(|e| e.to_string())?);
    }
    Ok([decode, vad_time, t.elapsed()])
}

fn main() {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<(), String> {
    let packets = uplink_packets(args.turn_seconds)?;
    let reply = reply_pcm()?;
    pass(&packets, &reply, args.complexity)?;
    let mut best = [Duration::MAX; 3];
    for _ in 0..args.passes {
        let p = pass(&packets, &reply, args.complexity)?;
        for (b, t) in best.iter_mut().zip(p) {
            *b = (*b).min(t);
        }
    }
    let reply_frames = reply.len() / frame_samples(REPLY_RATE);
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let total = best.iter().map(|d| d.as_secs_f64()).sum::<f64>();
    println!(
        "one turn ({} uplink frames of 60 ms at 16 kHz, {reply_frames} reply frames at 24 kHz; \
         fastest of {} passes, libopus, reply complexity {}):",
        packets.len(),
        args.passes,
        args.complexity
    );
    println!(
        "  uplink decode {:.0} us, VAD {:.0} us, reply encode {:.0} us: {:.2} ms a turn",
        us(best[0]),
        us(best[1]),
        us(best[2]),
        total * 1e3
    );
    for &n in &args.sessions {
        let turns = f64::from(n) / args.turn_seconds;
        let cores = turns * total;
        println!(
            "  {n} sessions, a turn each every {:.2} s: {turns:.0} turns a second, {cores:.2} \
             cores of codec and VAD work alone ({:.0} % of {} cores)",
            args.turn_seconds,
            100.0 * cores / args.cores,
            args.cores
        );
    }
    Ok(())
}
