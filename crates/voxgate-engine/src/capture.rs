//! The VAD plus the audio of the utterance in progress, backbuffer included.

use std::collections::VecDeque;

use voxgate_audio::format::{f32_to_i16, i16_to_f32};
use voxgate_audio::resample::Resampler;
use voxgate_audio::vad::{MODEL_RATE, Vad, VadConfig, VadError, VadOutput, VadState};

/// What one block of audio produced.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum CaptureEvent {
    /// A VAD state change: `(from, to, position, behind, evidence)`, `behind` being how much
    /// audio of the block just processed came after the deciding sample (so the decision
    /// happened that long before the block's end arrived), `evidence` how much audio the VAD
    /// judged before deciding (for `SILENCE`: the silence since the last voiced audio).
    Transition(
        VadState,
        VadState,
        u64,
        std::time::Duration,
        std::time::Duration,
    ),
    /// Per-frame telemetry.
    Frame(voxgate_audio::vad::VadFrame),
    /// Speech was declared (after the VAD's start hysteresis). `(onset, ago)`: the input
    /// position of its first voiced audio, and how much audio came after it up to the end of
    /// the block just processed (so it was heard that long before the block's end arrived).
    SpeechStarted(u64, std::time::Duration),
    /// Speech ended; the utterance at 16 kHz, from the backbuffer to the end of speech.
    SpeechEnded(Vec<i16>),
    /// The VAD has heard the speculation pause inside an utterance (see
    /// [`crate::Speculation::after_silence`]): the utterance so far at 16 kHz, for speculative
    /// recognition. At most once per `SPEECH_ENDING` stretch, only when speculation is on.
    Paused(Vec<i16>),
}

/// Most input samples the VAD is fed at once. Far below the VAD's history (its backbuffer
/// and start window plus a frame of slack, at least a few thousand samples at any rate), so
/// the audio of a speech start decided inside a piece is still held when it is copied.
const PIECE: usize = 256;

#[derive(Debug)]
pub(crate) struct Capture {
    vad: Vad,
    rate: u32,
    capturing: bool,
    /// Input-rate samples of the utterance, starting at absolute position `buf_start`. Kept
    /// 16-bit: speech arrives as 16-bit (Opus, PCM) and an utterance is the largest buffer a
    /// listening session holds, so this halves it.
    buf: Vec<i16>,
    buf_start: u64,
    max_samples: usize,
    /// Samples dropped because an utterance outgrew `max_samples`.
    pub(crate) dropped: u64,
    events: VecDeque<CaptureEvent>,
    scratch: Vec<f32>,
    /// The VAD's state after the last transition.
    state: VadState,
    /// Input samples processed.
    position: u64,
    /// Input samples processed before the VAD was last reset: VAD positions are relative to
    /// it, reported positions absolute.
    offset: u64,
    /// Speculation: input samples of non-speech inside an utterance before
    /// [`CaptureEvent::Paused`] (`None`: speculation is off).
    pause_after: Option<u64>,
    /// VAD-relative position where the current `SPEECH_ENDING` stretch's non-speech began,
    /// while no `Paused` was reported for it.
    pause_from: Option<u64>,
}

impl Capture {
    pub(crate) fn new(
        config: VadConfig,
        rate: u32,
        max_samples: usize,
        telemetry: bool,
        pause_after: Option<std::time::Duration>,
    ) -> Result<Self, VadError> {
        let mut vad = Vad::new(config, rate)?;
        vad.set_frame_telemetry(telemetry);
        // Fail here, not on the first utterance, if the rate cannot be brought to 16 kHz.
        Resampler::new(rate, MODEL_RATE)?;
        Ok(Self {
            vad,
            rate,
            capturing: false,
            buf: Vec::new(),
            buf_start: 0,
            max_samples,
            dropped: 0,
            events: VecDeque::with_capacity(8),
            scratch: Vec::with_capacity(256),
            state: VadState::Silence,
            position: 0,
            offset: 0,
            pause_after: pause_after.map(|d| {
                u64::try_from(d.as_micros() * u128::from(rate) / 1_000_000).unwrap_or(u64::MAX)
            }),
            pause_from: None,
        })
    }

    pub(crate) fn process_i16(&mut self, samples: &[i16]) {
        let mut scratch = std::mem::take(&mut self.scratch);
        for chunk in samples.chunks(PIECE) {
            scratch.clear();
            scratch.extend(chunk.iter().map(|&s| i16_to_f32(s)));
            self.process_piece(&scratch);
        }
        self.scratch = scratch;
    }

    /// Feeds a block of any length. It goes to the VAD in pieces of at most [`PIECE`]
    /// samples, each piece's transitions handled before the next: the VAD keeps only about a
    /// second of history, so a start of speech decided early in a long block (a whole file
    /// in one frame) would otherwise find its onset overwritten by the rest of the block,
    /// and an utterance ending inside the block would be cut against positions the buffer
    /// never held.
    pub(crate) fn process(&mut self, samples: &[f32]) {
        for piece in samples.chunks(PIECE) {
            self.process_piece(piece);
        }
    }

    fn process_piece(&mut self, samples: &[f32]) {
        if self.capturing {
            self.append(samples);
        }
        self.vad.process(samples);
        self.position += samples.len() as u64;
        while let Some(out) = self.vad.poll_output() {
            match out {
                VadOutput::Frame(f) => self.events.push_back(CaptureEvent::Frame(f)),
                VadOutput::Transition(t) => {
                    self.state = t.to;
                    self.pause_from = (t.to == VadState::SpeechEnding && self.capturing)
                        .then_some(t.onset)
                        .filter(|_| self.pause_after.is_some());
                    self.events.push_back(CaptureEvent::Transition(
                        t.from,
                        t.to,
                        self.offset + t.position,
                        std::time::Duration::ZERO,
                        self.duration(t.position.saturating_sub(t.onset)),
                    ));
                    match (t.from, t.to) {
                        (VadState::SpeechStarting, VadState::Speech) if !self.capturing => {
                            self.capturing = true;
                            self.buf.clear();
                            // Everything from the backbuffer up to the end of this block.
                            let mut kept = Vec::new();
                            self.buf_start = self.vad.copy_audio(t.audio_start, &mut kept);
                            self.buf.extend(kept.into_iter().map(f32_to_i16));
                            self.events.push_back(CaptureEvent::SpeechStarted(
                                self.offset + t.onset,
                                std::time::Duration::ZERO,
                            ));
                        }
                        (VadState::SpeechEnding, VadState::Silence) if self.capturing => {
                            self.capturing = false;
                            let keep = t.position.saturating_sub(self.buf_start);
                            self.buf
                                .truncate(usize::try_from(keep).unwrap_or(usize::MAX));
                            let audio = self.take_utterance_16k();
                            self.events.push_back(CaptureEvent::SpeechEnded(audio));
                        }
                        _ => {}
                    }
                }
                _ => {}
            }
        }
        self.check_pause();
    }

    /// Reports [`CaptureEvent::Paused`] once the VAD's latest frame is far enough into a
    /// `SPEECH_ENDING` stretch. The VAD judged everything from the stretch's start to that
    /// frame non-speech; the few samples after it (less than a frame) are judged later, and
    /// speech there takes the VAD back to `SPEECH`, which voids the speculation.
    fn check_pause(&mut self) {
        let (Some(from), Some(after)) = (self.pause_from, self.pause_after) else {
            return;
        };
        let Some(frame) = self.vad.last_frame() else {
            return;
        };
        if self.state != VadState::SpeechEnding || frame.end.saturating_sub(from) < after {
            return;
        }
        self.pause_from = None;
        let audio = self.to_16k(&self.buf);
        self.events.push_back(CaptureEvent::Paused(audio));
    }

    fn append(&mut self, samples: &[f32]) {
        let room = self.max_samples.saturating_sub(self.buf.len());
        let take = room.min(samples.len());
        if self.buf.capacity() - self.buf.len() < take {
            // Grow by half a second at a time instead of doubling: a long utterance would
            // otherwise hold up to twice its size, and it is the biggest buffer a listening
            // session has. (Large blocks are remapped, not copied, by the allocator.)
            let step = (self.rate as usize / 2).max(take);
            self.buf.reserve_exact(step.min(room));
        }
        self.buf
            .extend(samples[..take].iter().map(|&s| f32_to_i16(s)));
        self.dropped += (samples.len() - take) as u64;
    }

    fn take_utterance_16k(&mut self) -> Vec<i16> {
        let samples = std::mem::take(&mut self.buf);
        if self.rate == MODEL_RATE {
            return samples;
        }
        self.to_16k(&samples)
    }

    /// A copy of `samples` (at the input rate) at 16 kHz.
    fn to_16k(&self, samples: &[i16]) -> Vec<i16> {
        if self.rate == MODEL_RATE {
            return samples.to_vec();
        }
        match Resampler::new(self.rate, MODEL_RATE) {
            Ok(mut r) => {
                let input: Vec<f32> = samples.iter().copied().map(i16_to_f32).collect();
                let mut out = Vec::with_capacity(input.len() * 16_000 / self.rate as usize);
                r.process(&input, &mut out);
                r.flush(&mut out);
                let delay = r.delay().min(out.len());
                out.drain(..delay);
                out.into_iter().map(f32_to_i16).collect()
            }
            // Checked in `new`; unreachable in practice.
            Err(_) => Vec::new(),
        }
    }

    /// Ends the stream (the input format changes): the VAD returns to silence and an
    /// utterance in progress ends here, as if its speech had stopped.
    pub(crate) fn finish(&mut self) {
        self.pause_from = None;
        if self.state != VadState::Silence {
            self.events.push_back(CaptureEvent::Transition(
                self.state,
                VadState::Silence,
                self.position,
                std::time::Duration::ZERO,
                std::time::Duration::ZERO,
            ));
            self.state = VadState::Silence;
        }
        if self.capturing {
            self.capturing = false;
            let audio = self.take_utterance_16k();
            self.events.push_back(CaptureEvent::SpeechEnded(audio));
        }
    }

    /// Whether the VAD is in an utterance (speech declared, not yet over).
    pub(crate) fn in_utterance(&self) -> bool {
        self.capturing
    }

    /// Ends the utterance in progress now (`TriggerInference.flush_vad`) and restarts the VAD
    /// so the speech it was tracking does not end a second time.
    pub(crate) fn flush(&mut self) {
        self.finish();
        self.vad.reset();
        self.offset = self.position;
    }

    /// The next event. Events are drained after a whole block is processed, so a transition's
    /// `behind` (and a speech start's `ago`) is measured here, from the block's end.
    pub(crate) fn poll_event(&mut self) -> Option<CaptureEvent> {
        let mut event = self.events.pop_front()?;
        if let CaptureEvent::Transition(_, _, position, behind, _)
        | CaptureEvent::SpeechStarted(position, behind) = &mut event
        {
            *behind = self.duration(self.position.saturating_sub(*position));
        }
        Some(event)
    }

    /// How long `samples` input samples last.
    fn duration(&self, samples: u64) -> std::time::Duration {
        std::time::Duration::from_micros(
            samples.saturating_mul(1_000_000) / u64::from(self.rate.max(1)),
        )
    }
}
