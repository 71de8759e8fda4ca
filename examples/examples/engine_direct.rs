//! Driving the conversation engine (`voxgate-engine`) directly, without the server: the
//! engine is a sans-IO machine, so this program owns the clock (a virtual one, starting at an
//! `Instant` and moved by hand) and the providers (fakes that answer at once). It runs a typed
//! turn and a spoken turn and prints every output with its time: what the engine tells the
//! client, and what it asks a recognizer, a model and a synthesizer to do.
//!
//! `cargo run -p voxgate-examples --example engine_direct [-- speech.wav]`
//!
//! The spoken turn plays a 16 kHz mono WAV (default: the repository's `question.wav` fixture,
//! "Hello. What will the weather be like tomorrow?"). The fake recognizer does not listen: it
//! answers every utterance with that sentence.

use std::time::{Duration, Instant};

use voxgate_engine::provider::ChatRole;
use voxgate_engine::{
    ClientEvent, Engine, EngineConfig, Input, Output, ProviderEvent, ProviderRequest, State,
    TriggerMode,
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The WAV the spoken turn plays when no path is given.
pub(crate) const DEFAULT_WAV: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../crates/voxgate-audio/tests/fixtures/question.wav"
);

/// What the fake recognizer hears in every utterance.
pub(crate) const HEARD: &str = "Hello. What will the weather be like tomorrow?";

/// 20 ms of 16 kHz audio: the frame size a client typically streams.
const FRAME_SAMPLES: usize = 320;
const FRAME: Duration = Duration::from_millis(20);

/// Recognizer, model and synthesizer stand-ins: deterministic, instantaneous answers.
struct FakeProviders;

impl FakeProviders {
    /// Everything a provider would stream back for `request`, in order.
    fn answer(request: &ProviderRequest) -> Vec<ProviderEvent> {
        match request {
            ProviderRequest::Transcribe { id, .. } => vec![ProviderEvent::Transcript {
                id: *id,
                text: HEARD.to_owned(),
                language: "en".to_owned(),
            }],
            ProviderRequest::Generate { id, messages, .. } => {
                let last = messages
                    .iter()
                    .rev()
                    .find(|m| m.role == ChatRole::User)
                    .map_or("", |m| m.content.as_str());
                let reply = format!("You said: {last} I am only a fake model, sorry.");
                text_stream(*id, &reply)
            }
            ProviderRequest::Query { id, .. } => text_stream(*id, "A short conversation."),
            ProviderRequest::Synthesize { id, text, .. } => {
                // A quiet 24 kHz tone, 150 ms per word, in one chunk.
                let words = text.split_whitespace().count().max(1);
                let samples = (0..words * 3_600)
                    .map(|i| {
                        let t = i as f32 / 24_000.0;
                        voxgate_audio::format::f32_to_i16(
                            (t * 440.0 * std::f32::consts::TAU).sin() * 0.1,
                        )
                    })
                    .collect();
                vec![
                    ProviderEvent::Audio {
                        id: *id,
                        samples,
                        sample_rate: 24_000,
                    },
                    ProviderEvent::Done { id: *id },
                ]
            }
            ProviderRequest::CallTool { id, .. } => vec![ProviderEvent::Failed {
                id: *id,
                message: "this example runs no tools".to_owned(),
            }],
            // `Cancel`: nothing is running in the background here, so nothing to stop.
            _ => Vec::new(),
        }
    }
}

/// A model's answer streamed word by word, then `Done`.
fn text_stream(id: voxgate_engine::RequestId, text: &str) -> Vec<ProviderEvent> {
    let mut events: Vec<ProviderEvent> = text
        .split_inclusive(' ')
        .map(|word| ProviderEvent::TextDelta {
            id,
            delta: word.to_owned(),
        })
        .collect();
    events.push(ProviderEvent::Done { id });
    events
}

/// What happened in one conversation, for printing and for checks.
#[derive(Debug, Default)]
pub(crate) struct Conversation {
    /// One line per output, with its time.
    pub(crate) lines: Vec<String>,
    /// Every client event, in order.
    pub(crate) events: Vec<ClientEvent>,
    /// Every provider request, in order.
    pub(crate) requests: Vec<ProviderRequest>,
}

/// The host of one engine: the virtual clock, the fake providers and the log.
struct Host {
    engine: Engine,
    start: Instant,
    now: Instant,
    out: Conversation,
}

impl Host {
    fn new(config: EngineConfig) -> Result<Self, BoxError> {
        let start = Instant::now();
        Ok(Self {
            engine: Engine::new(config, start)?,
            start,
            now: start,
            out: Conversation::default(),
        })
    }

    fn note(&mut self, line: &str) {
        let t = self.now.duration_since(self.start).as_secs_f64();
        self.out.lines.push(format!("[{t:6.3} s] {line}"));
    }

    /// Drains the engine's outputs; provider requests are answered at once, and those answers
    /// drained in turn, until the engine has nothing more to say.
    fn pump(&mut self) -> Result<(), BoxError> {
        loop {
            let mut answers = Vec::new();
            while let Some(output) = self.engine.poll_output() {
                match output {
                    Output::Client(event) => {
                        self.note(&format!("-> client   {}", describe_event(&event)));
                        self.out.events.push(event);
                    }
                    Output::Provider(request) => {
                        self.note(&format!("-> provider {}", describe_request(&request)));
                        answers.extend(FakeProviders::answer(&request));
                        self.out.requests.push(request);
                    }
                    // Newer engine versions may add outputs; this host ignores them.
                    _ => {}
                }
            }
            if answers.is_empty() {
                return Ok(());
            }
            for answer in answers {
                self.engine
                    .handle_input(self.now, Input::Provider(answer))?;
            }
        }
    }

    /// Moves the clock forward by `by`, firing every timer that falls due on the way.
    fn advance(&mut self, by: Duration) -> Result<(), BoxError> {
        let target = self.now + by;
        while let Some(due) = self.engine.poll_timeout().filter(|d| *d <= target) {
            self.now = self.now.max(due);
            self.engine.handle_timeout(self.now);
            self.pump()?;
        }
        self.now = target;
        Ok(())
    }

    /// Plays 16 kHz mono audio in 20 ms frames at real time (on the virtual clock).
    fn speak(&mut self, samples: &[i16]) -> Result<(), BoxError> {
        for frame in samples.chunks(FRAME_SAMPLES) {
            self.engine.handle_audio_i16(self.now, frame);
            self.pump()?;
            self.advance(FRAME)?;
        }
        Ok(())
    }

    /// Lets time pass until the engine is idle again (the reply's audio has played out), at
    /// most `limit` of virtual time.
    fn until_idle(&mut self, limit: Duration) -> Result<(), BoxError> {
        let end = self.now + limit;
        while self.now < end && self.engine.state() != State::Idle {
            self.advance(FRAME)?;
        }
        if self.engine.state() == State::Idle {
            Ok(())
        } else {
            Err(format!("still {:?} after {limit:?}", self.engine.state()).into())
        }
    }
}

fn describe_event(event: &ClientEvent) -> String {
    match event {
        ClientEvent::ResponseBegin { turn } => format!("ResponseBegin({turn})"),
        ClientEvent::TextFragment { turn, text } => format!("TextFragment({turn}, {text:?})"),
        ClientEvent::SentenceStart { turn, text } => format!("SentenceStart({turn}, {text:?})"),
        ClientEvent::AudioChunk {
            turn,
            samples,
            sample_rate,
            ..
        } => format!(
            "AudioChunk({turn}, {} samples at {sample_rate} Hz)",
            samples.len()
        ),
        ClientEvent::ResponseEnd { turn } => format!("ResponseEnd({turn})"),
        ClientEvent::ResponseFinished { turn, interrupted } => {
            format!("ResponseFinished({turn}, interrupted: {interrupted})")
        }
        ClientEvent::VadState { from, to, position } => {
            format!("VadState({from:?} -> {to:?} at sample {position})")
        }
        ClientEvent::UserTranscription { turn, text, .. } => {
            format!("UserTranscription({turn}, {text:?})")
        }
        other => format!("{other:?}"),
    }
}

fn describe_request(request: &ProviderRequest) -> String {
    match request {
        ProviderRequest::Transcribe {
            id,
            audio,
            sample_rate,
        } => format!(
            "Transcribe({id}, {:.2} s of audio)",
            audio.len() as f64 / f64::from(*sample_rate)
        ),
        ProviderRequest::Generate { id, messages, .. } => {
            format!("Generate({id}, {} context messages)", messages.len())
        }
        ProviderRequest::Synthesize { id, text, .. } => format!("Synthesize({id}, {text:?})"),
        ProviderRequest::Cancel { id } => format!("Cancel({id})"),
        other => format!("{other:?}"),
    }
}

/// A typed turn, then a spoken turn of `speech` (16 kHz mono), on one engine.
pub(crate) fn converse(speech: &[i16]) -> Result<Conversation, BoxError> {
    let config = EngineConfig {
        system_prompt: "You are a helpful voice assistant.".to_owned(),
        // Replies are spoken (the default, 24 kHz 16-bit mono output): each sentence goes to
        // the synthesizer and comes out as audio. `None` would give text fragments instead.
        ..EngineConfig::default()
    };
    let mut host = Host::new(config)?;

    host.note("== typed turn");
    host.engine.handle_input(
        host.now,
        Input::Text {
            text: "Good morning!".to_owned(),
            mode: TriggerMode::Queue,
        },
    )?;
    host.pump()?;
    host.until_idle(Duration::from_secs(30))?;

    host.note("== spoken turn");
    host.speak(speech)?;
    // Trailing silence lets the VAD hear the end of the utterance.
    host.speak(&vec![0; 16 * 1_500])?;
    host.until_idle(Duration::from_secs(30))?;
    Ok(host.out)
}

/// A 16 kHz mono WAV file's samples.
pub(crate) fn read_speech(path: &str) -> Result<Vec<i16>, BoxError> {
    let wav = voxgate_audio::wav::read_wav(&std::fs::read(path)?)?;
    if wav.sample_rate != 16_000 {
        return Err(format!("{path}: {} Hz, expected 16000 Hz", wav.sample_rate).into());
    }
    Ok(wav.to_mono_i16())
}

fn main() -> Result<(), BoxError> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| DEFAULT_WAV.to_owned());
    let conversation = converse(&read_speech(&path)?)?;
    for line in &conversation.lines {
        println!("{line}");
    }
    Ok(())
}
