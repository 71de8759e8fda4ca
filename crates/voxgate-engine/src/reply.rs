//! The reply machine: the response being generated and delivered, the one being closed after a
//! cancel, the chunk waiting for the turn machine's `Deliver`, chunk sequence numbers, and what
//! streamed reply text becomes: the leading emoji read as a face (or stripped whole), then
//! either text fragments (no TTS) or sentences synthesized one request each and delivered in
//! order.
//!
//! It never feeds the turn machine itself: each step that makes a chunk returns the
//! [`TurnInput::ResponseChunk`] to feed, and the engine feeds it and drains the turn machine
//! before asking for the next step, so a cancel or an interruption caused by one chunk is seen
//! before the next is made.
//!
//! Bounded by the model's reply, never by the client: one response (plus the one just
//! cancelled, until its record comes out), one held chunk (see [`Reply::deliver`]), the
//! sentences of the reply (each at most [`crate::EngineConfig::max_sentence_chars`]) and their
//! TTS audio.
//!
//! Synthesis is paced by playback: a sentence is sent to TTS only while fewer than
//! [`crate::EngineConfig::max_sentences_ahead`] sentences beyond the one playing are being
//! synthesized or wait to be heard. A long reply (a model's essay, a long `DirectSpeech`)
//! thus costs a few synthesizer runs at a time and a few sentences of audio, however long
//! it is; the rest of its text waits, and [`Reply::synthesis_deadline`] says when playback
//! will have made room.

use std::collections::VecDeque;
use std::mem;
use std::time::{Duration, Instant};

use voxgate_turn::{AudioSpan, Input as TurnInput};

use crate::config::{EngineConfig, OutputAudio};
use crate::emotion::{self, EmojiPolicy, FragmentStripper, lead_settled};
use crate::history::AudioData;
use crate::playback::Ledger;
use crate::provider::{ProviderEvent, ProviderRequest};
use crate::record::next_id;
use crate::sentence::Splitter;
use crate::types::{ClientEvent, RequestId, TurnId};

/// One sentence on its way through TTS.
#[derive(Debug)]
struct Sentence {
    id: RequestId,
    text: String,
    /// Audio that arrived before earlier sentences finished. The TTS back end's answer to one
    /// sentence of the model's reply (at most `max_sentence_chars` of text), not the client's.
    held: VecDeque<(Vec<i16>, u32)>,
    /// Sent to TTS (sentences wait for playback to make room, see the module docs).
    requested: bool,
    started: bool,
    done: bool,
}

/// The response in progress.
#[derive(Debug)]
struct Response {
    turn: TurnId,
    /// The LLM request feeding it (`None` for direct speech).
    llm: Option<RequestId>,
    llm_done: bool,
    started: bool,
    /// The start of the reply, held back until its leading emoji (if any) is complete: it is
    /// read as the face (with an emotion policy) or stripped whole, never shown in pieces.
    /// `None` once settled.
    emotion_buf: Option<String>,
    splitter: Splitter,
    sentences: VecDeque<Sentence>,
    ledger: Ledger,
    /// Calls refused before running: their error results go to the turn machine once
    /// generation has ended, so it asks the model to follow up.
    refused: Vec<String>,
    generation_ended: bool,
    end_sent: bool,
    asks_question: bool,
    /// Text-only replies: emoji removal across fragments.
    stripper: FragmentStripper,
    /// Spoken replies: each delivered sentence's audio, in ledger segment order, up to
    /// `max_history_audio` of it (history keeps no more).
    spoken: Vec<AudioData>,
    /// Samples in `spoken`, at their own rates, in nanoseconds of audio.
    spoken_nanos: u128,
    /// When playback makes room for the next sentence's synthesis (see
    /// [`Reply::synthesis_deadline`]).
    wake: Option<Instant>,
}

impl Response {
    /// The requests still running for this response, LLM first, to cancel.
    fn running(&self) -> Vec<RequestId> {
        self.llm
            .filter(|_| !self.llm_done)
            .into_iter()
            .chain(
                self.sentences
                    .iter()
                    .filter(|s| s.requested && !s.done)
                    .map(|s| s.id),
            )
            .collect()
    }
}

/// A chunk fed to the turn machine, waiting for its `Deliver`.
#[derive(Debug)]
struct Held {
    turn: TurnId,
    seq: u32,
    events: Vec<ClientEvent>,
}

/// What a piece of reply text became, in the order to act on it.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Routed {
    /// The face read from the reply's leading emoji: send it first.
    pub(crate) emotion: Option<ClientEvent>,
    /// A text fragment (text-only replies), held: feed this to the turn machine.
    pub(crate) chunk: Option<TurnInput>,
}

/// A TTS event applied to its sentence.
#[derive(Debug, PartialEq)]
pub(crate) enum Tts {
    /// Kept (audio) or the sentence is done: deliver what is due ([`Reply::next_audio`]).
    Applied,
    /// The sentence failed (it counts as done): report this, then deliver what is due.
    Failed(String),
    /// For a sentence already done, or not a TTS event: count it as stale.
    Stale,
    /// Not a sentence of the response in progress.
    Unknown,
}

/// Generation is over for the response: what to tell the turn machine.
#[derive(Debug, PartialEq)]
pub(crate) struct GenerationEnd {
    /// The response.
    pub(crate) turn: TurnId,
    /// Its last sentence was a question.
    pub(crate) awaits_user: bool,
    /// Tool calls refused before running, to finish now (after `ResponseEnd`).
    pub(crate) refused: Vec<String>,
}

/// A response whose record came out of the turn machine.
#[derive(Debug, PartialEq)]
pub(crate) struct Ended {
    /// A spoken reply: the sentences the user heard (all of them unless interrupted), each
    /// with its audio when kept. `None`: a text reply, or no audio was delivered.
    pub(crate) sentences: Option<Vec<(String, Option<AudioData>)>>,
    /// `ResponseEnd` was already sent to the client.
    pub(crate) end_sent: bool,
}

/// The reply in progress and its delivery to the client.
#[derive(Debug)]
pub(crate) struct Reply {
    /// `Some`: replies are spoken (TTS per sentence); `None`: text fragments.
    output_audio: Option<OutputAudio>,
    max_sentence_chars: usize,
    /// History keeps reply audio (its cap is not zero).
    keep_audio: bool,
    /// Most reply audio kept for history, in nanoseconds.
    max_kept_nanos: u128,
    /// Sentences synthesized or waiting to be heard beyond the one playing.
    max_ahead: usize,
    resp: Option<Response>,
    /// A response just cancelled by the turn machine, kept until its record comes out.
    closing: Option<Response>,
    /// The chunk fed to the turn machine and not yet delivered. One slot is enough, and is the
    /// bound: the turn machine answers every `ResponseChunk` with its `Deliver` inside the same
    /// `handle_input`, and the engine drains the turn machine's outputs right after feeding each
    /// chunk, before making the next; a chunk it refused (its response cancelled or ended) gets
    /// no `Deliver` and is replaced by the next chunk, which is what the client must not see.
    held: Option<Held>,
    chunk_seq: u32,
}

impl Reply {
    /// No reply yet, with the engine's output settings (fixed for the session).
    pub(crate) fn new(config: &EngineConfig) -> Self {
        Self {
            output_audio: config.output_audio,
            max_sentence_chars: config.max_sentence_chars,
            keep_audio: !config.max_history_audio.is_zero(),
            max_kept_nanos: config.max_history_audio.as_nanos(),
            max_ahead: config.max_sentences_ahead.max(1),
            resp: None,
            closing: None,
            held: None,
            chunk_seq: 0,
        }
    }

    /// Starts response `turn`, generated by LLM request `llm` (`None`: direct speech). The
    /// response being closed and any undelivered chunk are dropped: they belong to earlier
    /// turns.
    pub(crate) fn begin(&mut self, turn: TurnId, llm: Option<RequestId>) {
        self.closing = None;
        self.chunk_seq = 0;
        self.held = None;
        self.resp = Some(Response {
            turn,
            llm,
            llm_done: false,
            started: false,
            emotion_buf: Some(String::new()),
            splitter: Splitter::new(self.max_sentence_chars),
            sentences: VecDeque::new(),
            ledger: Ledger::default(),
            refused: Vec::new(),
            generation_ended: false,
            end_sent: false,
            asks_question: false,
            stripper: FragmentStripper::new(),
            spoken: Vec::new(),
            spoken_nanos: 0,
            wake: None,
        });
    }

    /// Starts response `turn` with text known up front (direct speech, a resumed reply): no
    /// LLM, and no face is read from it.
    pub(crate) fn begin_direct(&mut self, turn: TurnId) {
        self.begin(turn, None);
        if let Some(r) = &mut self.resp {
            r.started = true;
            r.llm_done = true;
            r.emotion_buf = None;
        }
    }

    /// The playback position the client reported for response `turn`.
    pub(crate) fn report_playback(&mut self, turn: TurnId, bytes_played: u64) {
        if let Some(r) = self.resp.as_mut().filter(|r| r.turn == turn) {
            r.ledger.report(bytes_played);
        }
    }

    /// Whether `id` is the LLM request of the response in progress.
    pub(crate) fn is_llm(&self, id: RequestId) -> bool {
        self.resp.as_ref().is_some_and(|r| r.llm == Some(id))
    }

    /// Whether `id` is a TTS request of the response in progress.
    pub(crate) fn is_tts(&self, id: RequestId) -> bool {
        self.resp
            .as_ref()
            .is_some_and(|r| r.sentences.iter().any(|s| s.requested && s.id == id))
    }

    /// The sentences to send to TTS now: the next ones in order, while fewer than
    /// `max_ahead` sentences beyond the one playing are being synthesized, wait for delivery,
    /// or were delivered and not yet played out (by `now`, estimated from real time, or by
    /// the client's reports).
    pub(crate) fn due_synthesis(&mut self, now: Instant, reports: bool) -> Vec<ProviderRequest> {
        let mut requests = Vec::new();
        let Some(r) = &mut self.resp else {
            return requests;
        };
        if r.generation_ended {
            return requests;
        }
        let (unplayed, first_end) = r.ledger.unplayed_finished(now, reports);
        let outstanding = unplayed + r.sentences.iter().filter(|s| s.requested).count();
        // One sentence plays; `max_ahead` more may be ready behind it.
        let room = (self.max_ahead + 1).saturating_sub(outstanding);
        let waiting = r.sentences.iter().filter(|s| !s.requested).count();
        // Playback makes room when the earliest unplayed sentence ends (synthesis makes room
        // by finishing, which comes in as an event).
        r.wake = first_end.filter(|_| unplayed > 0 && waiting > room);
        for s in r.sentences.iter_mut().filter(|s| !s.requested).take(room) {
            s.requested = true;
            requests.push(ProviderRequest::Synthesize {
                id: s.id,
                turn: r.turn,
                text: s.text.clone(),
            });
        }
        requests
    }

    /// The first sentence's TTS request, once it is complete (and only once): what a
    /// speculative reply synthesizes ahead, with no playback to pace.
    pub(crate) fn first_synthesis(&mut self) -> Option<ProviderRequest> {
        let r = self.resp.as_mut()?;
        if r.sentences.iter().any(|s| s.requested) {
            return None;
        }
        let s = r.sentences.front_mut()?;
        s.requested = true;
        Some(ProviderRequest::Synthesize {
            id: s.id,
            turn: r.turn,
            text: s.text.clone(),
        })
    }

    /// When playback will have made room for a sentence still waiting for synthesis (the
    /// estimated end of the earliest delivered sentence not yet played, as of the last
    /// [`Reply::due_synthesis`]); `None` when no sentence waits or room depends on synthesis
    /// finishing, not on playback.
    pub(crate) fn synthesis_deadline(&self) -> Option<Instant> {
        let r = self.resp.as_ref()?;
        if r.generation_ended || r.sentences.iter().all(|s| s.requested) {
            return None;
        }
        r.wake
    }

    /// The response's turn while its LLM still streams (`None`: its events are stale).
    pub(crate) fn generating(&self) -> Option<TurnId> {
        self.resp.as_ref().filter(|r| !r.llm_done).map(|r| r.turn)
    }

    /// Marks the response as started by its first text or tool call; `true` the first time,
    /// when the turn machine is to be told.
    pub(crate) fn mark_started(&mut self) -> bool {
        match &mut self.resp {
            Some(r) if !r.started => {
                r.started = true;
                true
            }
            _ => false,
        }
    }

    /// A tool call refused before running: its result goes to the turn machine once generation
    /// ends ([`GenerationEnd::refused`]).
    pub(crate) fn refuse(&mut self, call_id: String) {
        if let Some(r) = &mut self.resp {
            r.refused.push(call_id);
        }
    }

    /// Streamed reply text: held while the leading emoji may still grow, then routed.
    pub(crate) fn text(
        &mut self,
        text: &str,
        policy: Option<&EmojiPolicy>,
        next: &mut u64,
    ) -> Routed {
        let Some(r) = &mut self.resp else {
            return Routed::default();
        };
        if let Some(buf) = &mut r.emotion_buf {
            buf.push_str(text);
            return if lead_settled(buf) {
                self.settle_emotion(policy, next)
            } else {
                Routed::default()
            };
        }
        self.route(text, next)
    }

    /// Whether the response has received no text yet and its emotion is still to be settled
    /// (a reply that fails now has said nothing).
    pub(crate) fn nothing_said(&self) -> bool {
        self.resp
            .as_ref()
            .is_some_and(|r| r.emotion_buf.as_deref() == Some(""))
    }

    /// Decides the face from the held start of the reply (with `policy`; without one it is
    /// only stripped of emoji later) and routes the rest. Nothing when already settled.
    pub(crate) fn settle_emotion(
        &mut self,
        policy: Option<&EmojiPolicy>,
        next: &mut u64,
    ) -> Routed {
        let Some(r) = &mut self.resp else {
            return Routed::default();
        };
        let Some(buf) = r.emotion_buf.take() else {
            return Routed::default();
        };
        let (emotion, rest) = match policy {
            Some(policy) => {
                let e = policy.expression(&buf);
                let event = ClientEvent::Emotion {
                    turn: r.turn,
                    emoji: e.emoji.to_owned(),
                    emotion: e.emotion,
                };
                (Some(event), e.text.to_owned())
            }
            None => (None, buf),
        };
        let mut routed = if rest.is_empty() {
            Routed::default()
        } else {
            self.route(&rest, next)
        };
        routed.emotion = emotion;
        routed
    }

    /// The LLM is done: the last sentence is complete. Call after [`Reply::settle_emotion`]
    /// (and after feeding what it routed), then ask for [`Reply::due_synthesis`] and deliver
    /// what is due.
    pub(crate) fn end_text(&mut self, next: &mut u64) {
        if let Some(r) = &mut self.resp {
            r.llm_done = true;
            r.splitter.finish();
        }
        self.sentences(next);
    }

    /// Settled text to TTS sentences or to a text fragment.
    fn route(&mut self, text: &str, next: &mut u64) -> Routed {
        let Some(r) = &mut self.resp else {
            return Routed::default();
        };
        if self.output_audio.is_some() {
            r.splitter.push(text);
            self.sentences(next);
            return Routed::default();
        }
        let out = r.stripper.push(text);
        Routed {
            chunk: self.text_chunk(out),
            ..Routed::default()
        }
    }

    /// Completed sentences with something to say join the queue for TTS
    /// ([`Reply::due_synthesis`]).
    fn sentences(&mut self, next: &mut u64) {
        let Some(r) = &mut self.resp else {
            return;
        };
        while let Some(sentence) = r.splitter.pop() {
            let text = emotion::strip_emoji(&sentence).into_owned();
            if !text.chars().any(char::is_alphanumeric) {
                continue;
            }
            r.asks_question = text.ends_with('?') || text.ends_with('？');
            let id = next_id(next);
            r.sentences.push_back(Sentence {
                id,
                text,
                held: VecDeque::new(),
                requested: false,
                started: false,
                done: false,
            });
        }
    }

    /// Holds a text fragment and returns its chunk for the turn machine.
    fn text_chunk(&mut self, text: String) -> Option<TurnInput> {
        let r = self.resp.as_mut()?;
        if text.is_empty() || r.generation_ended {
            return None;
        }
        let turn = r.turn;
        let events = vec![ClientEvent::TextFragment {
            turn,
            text: text.clone(),
        }];
        self.hold(turn, events);
        Some(TurnInput::ResponseChunk {
            turn,
            text,
            audio: None,
        })
    }

    fn hold(&mut self, turn: TurnId, events: Vec<ClientEvent>) {
        let seq = self.chunk_seq;
        self.chunk_seq += 1;
        self.held = Some(Held { turn, seq, events });
    }

    /// Applies a TTS event to its sentence.
    pub(crate) fn tts(&mut self, event: ProviderEvent) -> Tts {
        let id = event.id();
        let Some(s) = self
            .resp
            .as_mut()
            .and_then(|r| r.sentences.iter_mut().find(|s| s.requested && s.id == id))
        else {
            return Tts::Unknown;
        };
        if s.done {
            return Tts::Stale;
        }
        match event {
            ProviderEvent::Audio {
                samples,
                sample_rate,
                ..
            } => s.held.push_back((samples, sample_rate)),
            ProviderEvent::Done { .. } => s.done = true,
            ProviderEvent::Failed { message, .. } => {
                s.done = true;
                return Tts::Failed(message);
            }
            _ => return Tts::Stale,
        }
        Tts::Applied
    }

    /// The next audio chunk due, in sentence order (a sentence's audio waits for the sentences
    /// before it to finish), held, as the chunk for the turn machine. Feed each and drain the
    /// turn machine before asking again; `None` when nothing more is due.
    pub(crate) fn next_audio(&mut self, now: Instant) -> Option<TurnInput> {
        loop {
            let r = self.resp.as_mut()?;
            let head = r.sentences.front_mut()?;
            if let Some((samples, rate)) = head.held.pop_front() {
                let first = !head.started;
                head.started = true;
                let text = first.then(|| head.text.clone());
                if let Some(chunk) = self.audio_chunk(now, text, samples, rate) {
                    return Some(chunk);
                }
                continue;
            }
            if head.done {
                r.sentences.pop_front();
                r.ledger.finish_segment();
                continue;
            }
            return None;
        }
    }

    fn audio_chunk(
        &mut self,
        now: Instant,
        first_of: Option<String>,
        samples: Vec<i16>,
        rate: u32,
    ) -> Option<TurnInput> {
        let (Some(r), Some(out)) = (&mut self.resp, self.output_audio) else {
            return None;
        };
        if r.generation_ended || rate == 0 {
            return None;
        }
        let turn = r.turn;
        let n = samples.len() as u64;
        let duration = Duration::from_nanos(
            u64::try_from(u128::from(n) * 1_000_000_000 / u128::from(rate)).unwrap_or(u64::MAX),
        );
        let bytes = n * u64::from(out.bytes_per_second) / u64::from(rate);
        let mut events = Vec::with_capacity(2);
        let mut chunk_text = String::new();
        // History keeps each sentence's audio; a chunk at another rate than its sentence's
        // first (a provider switching rates mid-sentence) is delivered but not kept. Beyond
        // the history's audio cap nothing more is kept: history would drop it anyway.
        let keep = self.keep_audio && r.spoken_nanos < self.max_kept_nanos;
        if keep {
            r.spoken_nanos += duration.as_nanos();
        }
        match (&first_of, r.spoken.last_mut()) {
            _ if !keep => {}
            (Some(text), _) => r.spoken.push(AudioData {
                samples: samples.clone(),
                sample_rate: rate,
                transcription: text.clone(),
            }),
            (None, Some(a)) if a.sample_rate == rate => a.samples.extend_from_slice(&samples),
            _ => {}
        }
        if let Some(text) = &first_of {
            r.ledger.start_segment(text);
            events.push(ClientEvent::SentenceStart {
                turn,
                text: text.clone(),
            });
            chunk_text = if r.ledger.has_audio() {
                format!(" {text}")
            } else {
                text.clone()
            };
        }
        r.ledger.push_audio(now, bytes, duration);
        events.push(ClientEvent::AudioChunk {
            turn,
            samples,
            sample_rate: rate,
            transcript: first_of,
        });
        self.hold(turn, events);
        Some(TurnInput::ResponseChunk {
            turn,
            text: chunk_text,
            audio: Some(AudioSpan { bytes, duration }),
        })
    }

    /// Ends generation once everything is said: the LLM is done, the face decided, every
    /// sentence delivered. `Some` once per response.
    pub(crate) fn end_generation(&mut self) -> Option<GenerationEnd> {
        let r = self.resp.as_mut()?;
        let idle = r.llm_done
            && r.emotion_buf.is_none()
            && r.sentences.is_empty()
            && r.splitter.is_empty();
        if !idle || r.generation_ended {
            return None;
        }
        r.generation_ended = true;
        Some(GenerationEnd {
            turn: r.turn,
            awaits_user: r.asks_question,
            refused: mem::take(&mut r.refused),
        })
    }

    /// The turn machine delivers chunk `seq` of `turn`: its client events. A held chunk that is
    /// not this one was refused by the turn machine and is dropped.
    pub(crate) fn deliver(&mut self, turn: TurnId, seq: u32) -> Vec<ClientEvent> {
        match self.held.take() {
            Some(h) if (h.turn, h.seq) == (turn, seq) => h.events,
            _ => Vec::new(),
        }
    }

    /// The turn machine ended generation of `turn`: `true` when `ResponseEnd` is to be sent
    /// now (once per response).
    pub(crate) fn generation_ended(&mut self, turn: TurnId) -> bool {
        match self.resp.as_mut().filter(|r| r.turn == turn) {
            Some(r) if !r.end_sent => {
                r.end_sent = true;
                true
            }
            _ => false,
        }
    }

    /// The turn machine cancelled response `turn`: it is kept (closing) until its record comes
    /// out; returns the requests to cancel, LLM first.
    pub(crate) fn cancel(&mut self, turn: TurnId) -> Vec<RequestId> {
        if self.resp.as_ref().is_none_or(|r| r.turn != turn) {
            return Vec::new();
        }
        let Some(r) = self.resp.take() else {
            return Vec::new();
        };
        let running = r.running();
        if self.held.as_ref().is_some_and(|h| h.turn == turn) {
            self.held = None;
        }
        self.closing = Some(r);
        running
    }

    /// The turn machine's record of response `turn` came out: the response (in progress or
    /// closing) is done. `None` when it is neither.
    pub(crate) fn end(
        &mut self,
        turn: TurnId,
        now: Instant,
        interrupted: bool,
        playback_reports: bool,
    ) -> Option<Ended> {
        let mut r = if self.resp.as_ref().is_some_and(|r| r.turn == turn) {
            self.resp.take()
        } else if self.closing.as_ref().is_some_and(|r| r.turn == turn) {
            self.closing.take()
        } else {
            None
        }?;
        let sentences = r.ledger.has_audio().then(|| {
            let texts = if interrupted {
                r.ledger.heard_segments(now, playback_reports)
            } else {
                r.ledger.segment_texts()
            };
            let mut audio = mem::take(&mut r.spoken).into_iter();
            texts
                .into_iter()
                .map(|text| {
                    let a = audio.next().map(|mut a| {
                        a.transcription.clone_from(&text);
                        a
                    });
                    (text, a)
                })
                .collect()
        });
        Some(Ended {
            sentences,
            end_sent: r.end_sent,
        })
    }

    /// The session closed: forgets everything; returns the requests of the response in
    /// progress to cancel (the closing one's were cancelled already).
    pub(crate) fn close(&mut self) -> Vec<RequestId> {
        self.closing = None;
        self.held = None;
        self.resp.take().map(|r| r.running()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emotion::Emotion;

    const T: TurnId = TurnId(7);

    fn text_only() -> Reply {
        Reply::new(&EngineConfig {
            output_audio: None,
            ..EngineConfig::default()
        })
    }

    fn spoken() -> Reply {
        Reply::new(&EngineConfig::default())
    }

    fn chunk_text(input: Option<TurnInput>) -> Option<String> {
        match input {
            Some(TurnInput::ResponseChunk { text, .. }) => Some(text),
            _ => None,
        }
    }

    fn synth(requests: &[ProviderRequest]) -> Vec<(RequestId, &str)> {
        requests
            .iter()
            .filter_map(|r| match r {
                ProviderRequest::Synthesize { id, text, .. } => Some((*id, text.as_str())),
                _ => None,
            })
            .collect()
    }

    fn audio(id: RequestId, n: usize) -> ProviderEvent {
        ProviderEvent::Audio {
            id,
            samples: vec![1; n],
            sample_rate: 24_000,
        }
    }

    #[test]
    fn leading_emoji_is_held_until_settled_then_read_as_the_face() {
        let mut r = text_only();
        let mut next = 1;
        r.begin(T, Some(RequestId(99)));
        let policy = EmojiPolicy::faces();
        // The face could still grow (a ZWJ sequence): nothing goes out yet.
        assert_eq!(r.text("😆", Some(&policy), &mut next), Routed::default());
        assert_eq!(r.end_generation(), None);
        let routed = r.text(" Hello", Some(&policy), &mut next);
        assert!(matches!(
            routed.emotion,
            Some(ClientEvent::Emotion { turn: T, ref emoji, emotion: Emotion::Laughing }) if emoji == "😆"
        ));
        assert_eq!(chunk_text(routed.chunk).as_deref(), Some("Hello"));
        assert_eq!(
            r.deliver(T, 0),
            vec![ClientEvent::TextFragment {
                turn: T,
                text: "Hello".into()
            }]
        );
        // Settled: later text is routed at once, no second face.
        let routed = r.text(" there.", Some(&policy), &mut next);
        assert_eq!(routed.emotion, None);
        assert_eq!(chunk_text(routed.chunk).as_deref(), Some(" there."));
    }

    #[test]
    fn text_fragments_are_stripped_of_emoji_keeping_one_space() {
        let mut r = text_only();
        let mut next = 1;
        r.begin_direct(T);
        let shown: Vec<String> = ["see you ", "👋", " soon"]
            .into_iter()
            .filter_map(|t| chunk_text(r.text(t, None, &mut next).chunk))
            .collect();
        assert_eq!(shown.concat(), "see you soon");
    }

    #[test]
    fn sentences_are_synthesized_and_their_audio_delivered_in_order() {
        let mut r = spoken();
        let t0 = Instant::now();
        let mut next = 10;
        r.begin(T, Some(RequestId(1)));
        assert!(r.mark_started());
        assert!(!r.mark_started());
        r.settle_emotion(None, &mut next);
        r.text("Hello there. How are", None, &mut next);
        let first = r.due_synthesis(t0, false);
        assert_eq!(synth(&first), vec![(RequestId(10), "Hello there.")]);
        r.end_text(&mut next);
        let rest = r.due_synthesis(t0, false);
        assert_eq!(synth(&rest), vec![(RequestId(11), "How are")]);
        assert_eq!(r.generating(), None);
        assert!(r.is_tts(RequestId(11)) && !r.is_llm(RequestId(11)));

        // The second sentence's audio waits for the first to finish.
        assert_eq!(r.tts(audio(RequestId(11), 240)), Tts::Applied);
        assert_eq!(chunk_text(r.next_audio(t0)), None);
        assert_eq!(r.tts(audio(RequestId(10), 240)), Tts::Applied);
        assert_eq!(
            chunk_text(r.next_audio(t0)).as_deref(),
            Some("Hello there.")
        );
        assert!(matches!(
            r.deliver(T, 0).as_slice(),
            [
                ClientEvent::SentenceStart { .. },
                ClientEvent::AudioChunk { .. }
            ]
        ));
        assert_eq!(r.next_audio(t0), None);
        assert_eq!(r.tts(audio(RequestId(10), 240)), Tts::Applied);
        // A later chunk of the same sentence carries no text and no SentenceStart.
        assert_eq!(chunk_text(r.next_audio(t0)).as_deref(), Some(""));
        assert!(matches!(
            r.deliver(T, 1).as_slice(),
            [ClientEvent::AudioChunk {
                transcript: None,
                ..
            }]
        ));
        assert_eq!(
            r.tts(ProviderEvent::Done { id: RequestId(10) }),
            Tts::Applied
        );
        assert_eq!(r.tts(audio(RequestId(10), 240)), Tts::Stale);
        // The first is done: the second's held audio follows, after a space.
        assert_eq!(chunk_text(r.next_audio(t0)).as_deref(), Some(" How are"));
        assert!(matches!(
            r.deliver(T, 2).as_slice(),
            [ClientEvent::SentenceStart { .. }, _]
        ));
        assert_eq!(r.end_generation(), None);
        assert_eq!(
            r.tts(ProviderEvent::Failed {
                id: RequestId(11),
                message: "tts down".into()
            }),
            Tts::Failed("tts down".into())
        );
        assert_eq!(r.next_audio(t0), None);
        assert_eq!(
            r.end_generation(),
            Some(GenerationEnd {
                turn: T,
                awaits_user: false,
                refused: vec![]
            })
        );
        assert_eq!(r.end_generation(), None);
        let ended = r.end(T, t0, false, false).unwrap();
        assert_eq!(
            ended
                .sentences
                .unwrap()
                .into_iter()
                .map(|(text, a)| (text, a.map(|a| a.samples.len())))
                .collect::<Vec<_>>(),
            vec![
                ("Hello there.".to_owned(), Some(480)),
                ("How are".to_owned(), Some(240))
            ]
        );
        assert!(!ended.end_sent);
    }

    #[test]
    fn a_question_awaits_the_user_and_refused_calls_wait_for_the_end() {
        let mut r = text_only();
        let mut next = 1;
        r.begin(T, Some(RequestId(1)));
        r.settle_emotion(None, &mut next);
        r.refuse("call-1".into());
        r.end_text(&mut next);
        assert!(r.due_synthesis(Instant::now(), false).is_empty());
        // Text-only replies never set awaits_user from sentences: none are split.
        assert_eq!(
            r.end_generation(),
            Some(GenerationEnd {
                turn: T,
                awaits_user: false,
                refused: vec!["call-1".into()]
            })
        );
        let mut r = spoken();
        r.begin(T, Some(RequestId(1)));
        r.text("Ready? Shall we go?", None, &mut next);
        r.end_text(&mut next);
        let requests = r.due_synthesis(Instant::now(), false);
        let ids = synth(&requests)
            .into_iter()
            .map(|(id, _)| id)
            .collect::<Vec<_>>();
        assert_eq!(ids.len(), 2);
        for id in ids {
            r.tts(ProviderEvent::Done { id });
        }
        assert_eq!(r.next_audio(Instant::now()), None);
        assert!(r.end_generation().is_some_and(|e| e.awaits_user));
    }

    #[test]
    fn one_chunk_is_held_and_a_refused_one_is_never_delivered() {
        let mut r = text_only();
        let mut next = 1;
        r.begin_direct(T);
        assert!(r.text("one", None, &mut next).chunk.is_some());
        // The turn machine refused chunk 0 (no Deliver); chunk 1 replaces it.
        assert!(r.text(" two", None, &mut next).chunk.is_some());
        assert_eq!(r.deliver(T, 0), vec![]);
        assert!(r.text(" three", None, &mut next).chunk.is_some());
        // A Deliver that is not the held chunk's drops it.
        assert_eq!(r.deliver(TurnId(8), 2), vec![]);
        assert_eq!(r.deliver(T, 2), vec![]);
        assert!(r.text(" four", None, &mut next).chunk.is_some());
        assert_eq!(r.deliver(T, 3).len(), 1);
    }

    #[test]
    fn a_cancelled_response_closes_until_its_record_and_stops_its_requests() {
        let mut r = spoken();
        let mut next = 10;
        r.begin(T, Some(RequestId(1)));
        r.settle_emotion(None, &mut next);
        r.text("One. Two. Three", None, &mut next);
        assert_eq!(r.due_synthesis(Instant::now(), false).len(), 2);
        r.tts(ProviderEvent::Done { id: RequestId(10) });
        r.tts(audio(RequestId(11), 24));
        assert!(r.next_audio(Instant::now()).is_some());
        assert!(r.generation_ended(T));
        assert!(!r.generation_ended(T));
        // Another turn's cancel is not this response's.
        assert_eq!(r.cancel(TurnId(3)), vec![]);
        // The LLM first, then the sentences not done.
        assert_eq!(r.cancel(T), vec![RequestId(1), RequestId(11)]);
        assert_eq!(r.deliver(T, 0), vec![]);
        assert!(!r.is_llm(RequestId(1)) && !r.is_tts(RequestId(11)));
        assert_eq!(r.tts(audio(RequestId(11), 24)), Tts::Unknown);
        let ended = r.end(T, Instant::now(), true, false).unwrap();
        assert!(ended.end_sent);
        assert_eq!(r.end(T, Instant::now(), true, false), None);
        // Close cancels what the response in progress still runs.
        r.begin(TurnId(8), Some(RequestId(20)));
        assert_eq!(r.close(), vec![RequestId(20)]);
        assert_eq!(r.generating(), None);
    }

    /// Synthesizes sentence `id` as `ms` milliseconds of 24 kHz audio and delivers it.
    fn synthesized(r: &mut Reply, now: Instant, id: RequestId, ms: usize) {
        assert_eq!(r.tts(audio(id, ms * 24)), Tts::Applied);
        assert_eq!(r.tts(ProviderEvent::Done { id }), Tts::Applied);
        while r.next_audio(now).is_some() {}
    }

    #[test]
    fn a_long_reply_is_synthesized_a_few_sentences_ahead_of_playback() {
        let mut r = spoken();
        let t0 = Instant::now();
        let mut next = 1;
        r.begin_direct(T);
        let text: String = (1..=50).map(|i| format!("Sentence number {i}. ")).collect();
        r.text(&text, None, &mut next);
        r.end_text(&mut next);
        // The sentence to play and two ready behind it; nothing else until room is made.
        let requests = r.due_synthesis(t0, false);
        let asked: Vec<RequestId> = synth(&requests).into_iter().map(|(id, _)| id).collect();
        assert_eq!(asked.len(), 3, "{asked:?}");
        assert!(r.due_synthesis(t0, false).is_empty());
        assert_eq!(
            r.synthesis_deadline(),
            None,
            "waits on synthesis, not playback"
        );
        // Finished synthesis is room only once it has been heard: one second each.
        for id in asked {
            synthesized(&mut r, t0, id, 1_000);
        }
        assert!(r.due_synthesis(t0, false).is_empty());
        let wake = r.synthesis_deadline().expect("playback makes room");
        assert_eq!(wake, t0 + Duration::from_secs(1));
        let more = r.due_synthesis(wake, false);
        assert_eq!(synth(&more), vec![(RequestId(4), "Sentence number 4.")]);
        // With reports on, a report of what was played makes room as well.
        assert!(r.due_synthesis(wake, true).is_empty());
        r.report_playback(T, 2 * 48_000);
        assert_eq!(synth(&r.due_synthesis(wake, true)).len(), 1);
        // Everything is still said, in order, to the end.
        let mut now = wake;
        let mut said = 3;
        let mut in_flight: Vec<RequestId> = vec![RequestId(4), RequestId(5)];
        while let Some(id) = in_flight.first().copied() {
            in_flight.remove(0);
            synthesized(&mut r, now, id, 1_000);
            said += 1;
            now = r.synthesis_deadline().unwrap_or(now);
            let requests = r.due_synthesis(now, false);
            in_flight.extend(synth(&requests).into_iter().map(|(id, _)| id));
            assert!(in_flight.len() <= 3);
        }
        assert_eq!(said, 50);
        assert!(r.end_generation().is_some());
    }

    #[test]
    fn reply_audio_kept_for_history_stops_at_the_history_cap() {
        let mut r = Reply::new(&EngineConfig {
            max_history_audio: Duration::from_millis(1_500),
            ..EngineConfig::default()
        });
        let t0 = Instant::now();
        let mut next = 1;
        r.begin_direct(T);
        r.text("One. Two. Three.", None, &mut next);
        r.end_text(&mut next);
        let requests = r.due_synthesis(t0, false);
        let ids: Vec<RequestId> = synth(&requests).into_iter().map(|(id, _)| id).collect();
        for id in ids {
            synthesized(&mut r, t0, id, 1_000);
        }
        r.end_generation();
        let ended = r.end(T, t0, false, false).unwrap();
        let kept: Vec<Option<usize>> = ended
            .sentences
            .unwrap()
            .into_iter()
            .map(|(_, a)| a.map(|a| a.samples.len()))
            .collect();
        // The second sentence started below the cap and is kept whole; the third is not.
        assert_eq!(kept, vec![Some(24_000), Some(24_000), None]);
    }
}
