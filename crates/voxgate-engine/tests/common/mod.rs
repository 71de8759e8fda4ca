//! A virtual clock and scripted providers for driving an [`Engine`] through whole
//! conversations.
#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use voxgate_engine::provider::ProviderEvent;
use voxgate_engine::{
    ClientEvent, Engine, EngineConfig, Input, InputError, Output, ProviderRequest, RequestId,
};

pub const MS: Duration = Duration::from_millis(1);

/// The engine on a virtual clock; every output is logged with its time.
pub struct Driver {
    pub engine: Engine,
    pub origin: Instant,
    pub now: Instant,
    pub log: Vec<(Duration, Output)>,
}

impl Driver {
    pub fn new(config: EngineConfig) -> Self {
        let origin = Instant::now();
        Self {
            engine: Engine::new(config, origin).unwrap(),
            origin,
            now: origin,
            log: Vec::new(),
        }
    }

    /// Every output pending now, logged at the current time.
    pub fn drain(&mut self) -> Vec<Output> {
        let at = self.now - self.origin;
        let out: Vec<Output> = std::iter::from_fn(|| self.engine.poll_output()).collect();
        self.log.extend(out.iter().cloned().map(|o| (at, o)));
        out
    }

    pub fn try_input(&mut self, input: Input) -> Result<Vec<Output>, InputError> {
        self.engine.handle_input(self.now, input)?;
        Ok(self.drain())
    }

    pub fn input(&mut self, input: Input) -> Vec<Output> {
        self.try_input(input).unwrap()
    }

    pub fn provider(&mut self, event: ProviderEvent) -> Vec<Output> {
        self.input(Input::Provider(event))
    }

    /// Moves the clock, firing due timers at their deadlines.
    pub fn advance(&mut self, by: Duration) -> Vec<Output> {
        let target = self.now + by;
        let mut out = Vec::new();
        while let Some(d) = self.engine.poll_timeout().filter(|d| *d <= target) {
            self.now = self.now.max(d);
            self.engine.handle_timeout(self.now);
            out.extend(self.drain());
        }
        self.now = target;
        out
    }

    /// Feeds mono 16 kHz audio in 20 ms frames at real time; returns the outputs.
    pub fn speak(&mut self, samples: &[i16]) -> Vec<Output> {
        let mut out = Vec::new();
        for frame in samples.chunks(320) {
            self.engine.handle_audio_i16(self.now, frame);
            out.extend(self.drain());
            out.extend(self.advance(20 * MS));
        }
        out
    }

    pub fn silence(&mut self, ms: usize) -> Vec<Output> {
        self.speak(&vec![0i16; ms * 16])
    }

    pub fn client_events(&self) -> Vec<ClientEvent> {
        self.log
            .iter()
            .filter_map(|(_, o)| match o {
                Output::Client(e) => Some(e.clone()),
                _ => None,
            })
            .collect()
    }
}

pub fn client(out: &[Output]) -> Vec<ClientEvent> {
    out.iter()
        .filter_map(|o| match o {
            Output::Client(e) => Some(e.clone()),
            _ => None,
        })
        .collect()
}

pub fn requests(out: &[Output]) -> Vec<ProviderRequest> {
    out.iter()
        .filter_map(|o| match o {
            Output::Provider(r) => Some(r.clone()),
            _ => None,
        })
        .collect()
}

/// The id of the one `Generate` among `out`.
pub fn generate(out: &[Output]) -> (RequestId, ProviderRequest) {
    let found: Vec<_> = requests(out)
        .into_iter()
        .filter(|r| matches!(r, ProviderRequest::Generate { .. }))
        .collect();
    assert_eq!(found.len(), 1, "expected one Generate in {out:#?}");
    match &found[0] {
        ProviderRequest::Generate { id, .. } => (*id, found[0].clone()),
        _ => unreachable!(),
    }
}

/// `(id, text)` of every `Synthesize` among `out`.
pub fn synth(out: &[Output]) -> Vec<(RequestId, String)> {
    requests(out)
        .into_iter()
        .filter_map(|r| match r {
            ProviderRequest::Synthesize { id, text, .. } => Some((id, text)),
            _ => None,
        })
        .collect()
}

pub fn delta(id: RequestId, text: &str) -> ProviderEvent {
    ProviderEvent::TextDelta {
        id,
        delta: text.into(),
    }
}

pub fn done(id: RequestId) -> ProviderEvent {
    ProviderEvent::Done { id }
}

/// `ms` of a 24 kHz tone as TTS audio.
pub fn tts_audio(id: RequestId, ms: usize) -> ProviderEvent {
    ProviderEvent::Audio {
        id,
        samples: (0..ms * 24)
            .map(|i| voxgate_audio::format::f32_to_i16((i as f32 * 0.05).sin() * 0.25))
            .collect(),
        sample_rate: 24_000,
    }
}

/// The speech fixture of voxgate-audio: 16 kHz mono, speech from 0.8 s to ~4.36 s.
pub fn speech() -> Vec<i16> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../voxgate-audio/tests/fixtures/speech.wav");
    let wav = voxgate_audio::wav::read_wav(&std::fs::read(path).unwrap()).unwrap();
    assert_eq!((wav.sample_rate, wav.channels), (16_000, 1));
    wav.to_mono_i16()
}

/// The question fixture of voxgate-audio: 16 kHz mono, "Hello." then a question, about 2.1 s
/// of speech from the first sample to near the last.
pub fn question() -> Vec<i16> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../voxgate-audio/tests/fixtures/question.wav");
    let wav = voxgate_audio::wav::read_wav(&std::fs::read(path).unwrap()).unwrap();
    assert_eq!((wav.sample_rate, wav.channels), (16_000, 1));
    wav.to_mono_i16()
}
