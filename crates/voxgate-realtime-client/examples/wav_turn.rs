//! A spoken turn: stream a WAV file to the server at real time, save the spoken reply as WAV.
//!
//! ```text
//! cargo run --release --bin voxgate-server            # in another terminal
//! cargo run -p voxgate-realtime-client --example wav_turn -- question.wav reply.wav
//! ```
//!
//! The input must be 16-bit PCM (any rate, mono or the first channel); the session declares
//! the file's rate, so the server resamples, not this program.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use voxgate_realtime::proto::{HostedTtsMode, InferenceTriggerMode, SampleFormat};
use voxgate_realtime::{AudioFormat, HostedTtsSettings, HostedVoice, SessionConfig, TtsSettings};
use voxgate_realtime_client::{ClientOptions, Endpoint, Event, RealtimeClient};

/// Audio goes out in 20 ms packets, as a microphone would send it.
const PACKET: Duration = Duration::from_millis(20);
/// Silence after the speech, so the server's voice detector hears the end of the turn.
const TAIL: Duration = Duration::from_millis(1000);
/// The rate asked of the reply.
const REPLY_RATE: u32 = 24_000;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [input, output] = args.as_slice() else {
        return Err("usage: wav_turn INPUT.wav OUTPUT.wav".into());
    };
    let turn = spoken_turn(
        Endpoint::websocket("ws://127.0.0.1:8080/realtime"),
        Path::new(input),
        Path::new(output),
    )
    .await?;
    println!("heard: {}", turn.transcript);
    println!("reply: {} samples at {REPLY_RATE} Hz", turn.reply_samples);
    Ok(())
}

/// What one spoken turn produced.
#[derive(Debug)]
pub(crate) struct SpokenTurn {
    /// What the server recognized.
    pub(crate) transcript: String,
    /// Samples of reply audio written to the output file.
    pub(crate) reply_samples: usize,
}

/// Streams `input` at real time, waits for the reply and writes its audio to `output`.
pub(crate) async fn spoken_turn(
    endpoint: Endpoint,
    input: &Path,
    output: &Path,
) -> Result<SpokenTurn, Box<dyn std::error::Error>> {
    let mut reader = hound::WavReader::open(input)?;
    let spec = reader.spec();
    if spec.bits_per_sample != 16 || spec.sample_format != hound::SampleFormat::Int {
        return Err(format!("{}: 16-bit PCM expected", input.display()).into());
    }
    let channels = usize::from(spec.channels);
    let mono: Vec<i16> = reader
        .samples::<i16>()
        .step_by(channels)
        .collect::<Result<_, _>>()?;
    let mut config = SessionConfig::new(
        AudioFormat::new(spec.sample_rate, 1, SampleFormat::Signed16Bit)?,
        AudioFormat::new(REPLY_RATE, 1, SampleFormat::Signed16Bit)?,
    );
    // The server's own voice (hosted TTS) speaks the reply.
    config.tts = Some(TtsSettings::Hosted(HostedTtsSettings {
        voice: HostedVoice::Ref {
            voice_id: "default".into(),
        },
        mode: HostedTtsMode::LowLatency,
    }));
    let mut client = RealtimeClient::connect(ClientOptions::new(endpoint), config).await?;

    let per_packet = usize::try_from(u64::from(spec.sample_rate) * 20 / 1000)?;
    let tail_samples = u128::from(spec.sample_rate) * TAIL.as_millis() / 1000;
    let tail = vec![0i16; usize::try_from(tail_samples)?];
    let mut clock = tokio::time::interval(PACKET);
    for packet in mono.chunks(per_packet).chain(tail.chunks(per_packet)) {
        clock.tick().await;
        let bytes: Vec<u8> = packet.iter().flat_map(|s| s.to_le_bytes()).collect();
        client
            .send_audio(Bytes::from(bytes), InferenceTriggerMode::Immediate)
            .await?;
    }

    let mut transcript = String::new();
    let mut audio: Vec<i16> = Vec::new();
    while let Some(event) = client.next_event().await {
        match event {
            Event::UserTranscription { text, .. } => transcript = text,
            Event::AudioChunk { audio: chunk, .. } => audio.extend(
                chunk
                    .chunks_exact(2)
                    .map(|b| i16::from_le_bytes([b[0], b[1]])),
            ),
            // The reply this turn asked for: the first one with audio.
            Event::ResponseEnd { .. } if !audio.is_empty() => break,
            Event::Error(e) => return Err(e.to_string().into()),
            _ => {}
        }
    }
    client.close().await;

    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: REPLY_RATE,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut writer = hound::WavWriter::create(output, spec)?;
    for s in &audio {
        writer.write_sample(*s)?;
    }
    writer.finalize()?;
    Ok(SpokenTurn {
        transcript,
        reply_samples: audio.len(),
    })
}
