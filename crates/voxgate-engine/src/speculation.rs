//! Speculative (preemptive) work at a pause in the user's speech, adopted by the real pipeline
//! only when it asks for exactly the same work.
//!
//! At a pause ([`crate::Speculation::after_silence`] of non-speech inside an utterance) the
//! engine sends the utterance so far for recognition, then (with its transcript) a generation
//! with the context the turn would get, then (with the reply's first sentence) that sentence's
//! synthesis. Each is a request of its own id; its answers are held here, never routed. The
//! real pipeline then runs as it always does, and every request it makes is offered here
//! first:
//!
//! - a transcription of the same utterance, with only non-speech heard after the snapshot
//!   (speech resuming voids the speculation before the utterance ends);
//! - a generation whose context, tools and temperature equal the speculative one's;
//! - after an adopted generation, a synthesis of the same sentence text.
//!
//! A match is adopted: the real request is not sent; the answers held so far are replayed
//! under the real request's id (as if the provider had answered at once), later ones are
//! re-tagged as they come, and a cancel of the real id cancels the speculative one. Anything
//! that can no longer be adopted is cancelled at the provider at once: speech resumes, a new
//! utterance starts, the user turn ends without taking it, the real request differs, the
//! speculative answer fails or calls a tool, the session closes. The safety is in the matching:
//! adopted work is what the real pipeline would have asked for, so what reaches the client
//! and history is what it would have been, only sooner; nothing held here is routed otherwise.
//!
//! Tools are never run speculatively: a speculative generation that calls one is cancelled
//! whole, and the real pipeline asks again once the turn is real. (Adopting only the text
//! before the call would need the real request to continue a stream mid-way, which no model
//! API does; adopting the call would be safe, it runs only after adoption, but a reply that
//! calls a tool is not spoken sooner by it, since its follow-up generation waits for the
//! result anyway.)
//!
//! Bounds: one speculation at a time (a new pause replaces the last one's unadopted work); per
//! speculation one recognition, one generation and one synthesis, the first sentence only (at
//! most [`crate::EngineConfig::max_sentence_chars`]): what the user hears first is all that
//! speculation can make sooner, later sentences are synthesized while the first plays. The
//! answers held are bounded by [`MAX_HELD_EVENTS`] per request (beyond it the request is
//! cancelled), and come from the providers, never from the client.

use std::collections::VecDeque;
use std::mem;

use crate::emotion::EmojiPolicy;
use crate::provider::{ContextMessage, ProviderEvent, ProviderRequest, ToolSpec};
use crate::reply::Reply;
use crate::types::RequestId;

/// Most provider events held for one speculative request before it is adopted. A reply's
/// stream is a few hundred deltas, a sentence's audio a few dozen chunks; past this the
/// request is cancelled rather than held.
pub(crate) const MAX_HELD_EVENTS: usize = 4096;

/// Counters of speculative work, cumulative for the session ([`crate::Engine::speculation_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SpeculationStats {
    /// Speculations started: pauses whose utterance so far was sent for recognition.
    pub started: u64,
    /// Speculations the real pipeline took work from: the pause was the end of the
    /// utterance, so at least its recognition was used (and its generation too when the
    /// transcript came before the turn ended and the context did not change).
    pub adopted: u64,
    /// Speculations none of whose work was used: the user went on speaking within the pause,
    /// the recognition failed, the session closed. Once over, every speculation counts as
    /// adopted or discarded.
    pub discarded: u64,
    /// Speculative provider requests sent (recognitions, generations, syntheses).
    pub requests: u64,
    /// Speculative provider requests the real pipeline adopted instead of asking again.
    pub requests_adopted: u64,
    /// Speculative provider requests cancelled at the provider before they finished.
    pub requests_cancelled: u64,
}

/// A speculative request and the answers held for it.
#[derive(Debug)]
struct Pending {
    id: RequestId,
    events: Vec<ProviderEvent>,
    /// Its last event is in.
    finished: bool,
}

#[derive(Debug)]
enum Part {
    /// Not started (yet).
    Idle,
    Running(Pending),
    /// Taken by the real pipeline.
    Adopted,
    /// Thrown away, or never to start.
    Gone,
}

impl Part {
    fn running_id(&self) -> Option<RequestId> {
        match self {
            Self::Running(p) => Some(p.id),
            _ => None,
        }
    }
}

/// Everything a generation request is matched on.
#[derive(Debug, PartialEq)]
pub(crate) struct GenerationKey {
    pub(crate) messages: Vec<ContextMessage>,
    pub(crate) tools: Vec<ToolSpec>,
    pub(crate) temperature: Option<f64>,
}

/// One pause's speculative work.
#[derive(Debug)]
struct Spec {
    /// The engine's number of the utterance the snapshot was taken from.
    utterance: u64,
    asr: Part,
    /// The real id the recognition was adopted under.
    asr_real: Option<RequestId>,
    /// The speculative transcript, once in.
    transcript: Option<String>,
    llm: Part,
    key: Option<GenerationKey>,
    /// The reply machine run over the speculative stream, only to find its first sentence
    /// exactly as the real reply will (spoken replies, until the first sentence is found).
    shadow: Option<Reply>,
    /// Ids for the shadow's own sentences (never sent).
    shadow_ids: u64,
    tts: Part,
    tts_text: String,
    /// The user turn it was made for is over: no generation starts any more.
    turn_over: bool,
    /// The real pipeline took some of its work.
    adopted: bool,
}

/// What a provider event is, seen from here.
#[derive(Debug)]
pub(crate) enum Routing {
    /// An answer of adopted work, re-tagged with the real request's id: route it.
    Real(ProviderEvent),
    /// An answer of speculative work, held; the engine may have work to start.
    Held(Held),
    /// Not speculative work: route it as usual.
    Other(ProviderEvent),
}

/// What a held answer calls for.
#[derive(Debug, PartialEq)]
pub(crate) enum Held {
    /// Nothing.
    Nothing,
    /// The speculative reply's first sentence is complete: synthesize it.
    FirstSentence(String),
}

/// The speculation machine: at most one speculation, the adopted requests still running, the
/// answers to replay and the cancels to send.
#[derive(Debug)]
pub(crate) struct Speculator {
    spec: Option<Spec>,
    /// Adopted requests still running: `(real id, speculative id)`. At most one per part of
    /// a speculation, removed on their last event or their cancel.
    aliases: Vec<(RequestId, RequestId)>,
    /// Held answers of adopted work, re-tagged, for the engine to route next.
    replay: VecDeque<ProviderEvent>,
    /// Speculative requests to cancel at the provider.
    cancels: Vec<RequestId>,
    stats: SpeculationStats,
}

impl Speculator {
    pub(crate) fn new() -> Self {
        Self {
            spec: None,
            aliases: Vec::new(),
            replay: VecDeque::new(),
            cancels: Vec::new(),
            stats: SpeculationStats::default(),
        }
    }

    pub(crate) fn stats(&self) -> SpeculationStats {
        self.stats
    }

    /// Whether a speculation is in progress.
    pub(crate) fn active(&self) -> bool {
        self.spec.is_some()
    }

    /// A pause in utterance `utterance`: its recognition goes out as request `asr`. Replaces
    /// the speculation in progress (its unadopted work is cancelled).
    pub(crate) fn start(&mut self, asr: RequestId, utterance: u64) {
        self.discard();
        self.stats.started += 1;
        self.stats.requests += 1;
        self.spec = Some(Spec {
            utterance,
            asr: Part::Running(Pending {
                id: asr,
                events: Vec::new(),
                finished: false,
            }),
            asr_real: None,
            transcript: None,
            llm: Part::Idle,
            key: None,
            shadow: None,
            shadow_ids: 1,
            tts: Part::Idle,
            tts_text: String::new(),
            turn_over: false,
            adopted: false,
        });
    }

    /// Ends the speculation in progress: its unadopted work is cancelled (adopted requests
    /// run on as the real pipeline's). Speech resumed, a new utterance began, or the turn
    /// went elsewhere.
    pub(crate) fn discard(&mut self) {
        let Some(mut spec) = self.spec.take() else {
            return;
        };
        for part in [&mut spec.asr, &mut spec.llm, &mut spec.tts] {
            self.drop_part(part);
        }
        if !spec.adopted {
            self.stats.discarded += 1;
        }
    }

    /// Cancels a part that was not adopted (a finished one needs no cancel); an adopted part
    /// stays adopted.
    fn drop_part(&mut self, part: &mut Part) {
        match mem::replace(part, Part::Gone) {
            Part::Running(p) if !p.finished => {
                self.cancels.push(p.id);
                self.stats.requests_cancelled += 1;
            }
            Part::Adopted => *part = Part::Adopted,
            _ => {}
        }
    }

    /// The user turn of the speculation is over while its real generation waits to go out
    /// (held for the device's tools): nothing new starts, what runs may still be adopted.
    pub(crate) fn turn_over(&mut self) {
        if let Some(s) = &mut self.spec {
            s.turn_over = true;
        }
    }

    /// The user turn is over and its real generation went out (or none will): a speculative
    /// generation not adopted by now never will be, and is cancelled with its synthesis.
    pub(crate) fn drop_generation(&mut self) {
        let Some(mut spec) = self.spec.take() else {
            return;
        };
        spec.turn_over = true;
        self.drop_unadopted_generation(&mut spec);
        self.spec = Some(spec);
    }

    fn drop_unadopted_generation(&mut self, spec: &mut Spec) {
        if !matches!(spec.llm, Part::Adopted) {
            self.drop_part(&mut spec.llm);
            self.drop_part(&mut spec.tts);
            spec.shadow = None;
            spec.key = None;
        }
    }

    /// After the answers of an adopted generation were replayed: a speculative synthesis the
    /// real reply did not ask for by then (its first sentence differs, or the reply was cut
    /// off first) never will be adopted, and is cancelled.
    pub(crate) fn settle_adopted(&mut self) {
        let Some(mut spec) = self.spec.take() else {
            return;
        };
        if matches!(spec.llm, Part::Adopted) {
            self.drop_part(&mut spec.tts);
        }
        self.spec = Some(spec);
    }

    /// Forgets the speculation once nothing of it runs or can still start.
    pub(crate) fn tidy(&mut self) {
        let Some(s) = &self.spec else { return };
        let running = |p: &Part| matches!(p, Part::Running(_));
        let may_start = matches!(s.llm, Part::Idle) && !s.turn_over;
        if !running(&s.asr) && !running(&s.llm) && !running(&s.tts) && !may_start {
            self.discard();
        }
    }

    /// The session is over: everything speculative is cancelled, and so is adopted work the
    /// real pipeline did not cancel itself.
    pub(crate) fn close(&mut self) {
        self.discard();
        for (_, spec) in mem::take(&mut self.aliases) {
            self.cancels.push(spec);
        }
        self.replay.clear();
    }

    /// Speculative requests to cancel at the provider now.
    pub(crate) fn take_cancels(&mut self) -> Vec<RequestId> {
        mem::take(&mut self.cancels)
    }

    /// The next adopted answer to route.
    pub(crate) fn pop_replay(&mut self) -> Option<ProviderEvent> {
        self.replay.pop_front()
    }

    /// The request id to cancel for real request `id`: the speculative request it was
    /// adopted from, if any (the alias ends there).
    pub(crate) fn cancel_target(&mut self, id: RequestId) -> RequestId {
        match self.aliases.iter().position(|(real, _)| *real == id) {
            Some(i) => self.aliases.swap_remove(i).1,
            None => id,
        }
    }

    /// Takes over a running part of `spec` for real request `real`: its held answers are
    /// replayed under `real`, and later ones are re-tagged while it runs.
    fn adopt_part(&mut self, spec: &mut Spec, pending: Pending, real: RequestId) {
        if !spec.adopted {
            spec.adopted = true;
            self.stats.adopted += 1;
        }
        self.stats.requests_adopted += 1;
        if !pending.finished {
            self.aliases.push((real, pending.id));
        }
        self.replay
            .extend(pending.events.into_iter().map(|e| e.with_id(real)));
    }

    /// The VAD ended utterance `utterance` and the real pipeline transcribes it as request
    /// `real`: `true` when the speculative recognition of the same utterance is adopted
    /// instead (do not send the request).
    pub(crate) fn adopt_transcription(&mut self, real: RequestId, utterance: u64) -> bool {
        let Some(spec) = &mut self.spec else {
            return false;
        };
        if spec.utterance != utterance {
            self.discard();
            return false;
        }
        if !matches!(spec.asr, Part::Running(_)) {
            // Gone (it failed): the real request goes out.
            return false;
        }
        let Part::Running(pending) = mem::replace(&mut spec.asr, Part::Adopted) else {
            return false;
        };
        spec.asr_real = Some(real);
        let mut spec = self.spec.take();
        if let Some(s) = &mut spec {
            self.adopt_part(s, pending, real);
        }
        self.spec = spec;
        true
    }

    /// Whether a generation may start, with the speculative transcript and the real id of
    /// the adopted recognition (`None` while it is still speculative).
    pub(crate) fn generation_due(&self) -> Option<(&str, Option<RequestId>)> {
        let s = self.spec.as_ref()?;
        if !matches!(s.llm, Part::Idle) || s.turn_over {
            return None;
        }
        let text = s.transcript.as_deref()?;
        Some((text, s.asr_real))
    }

    /// No generation will be made for this speculation (an empty transcript, typed text in
    /// the turn, a session that does not reply).
    pub(crate) fn skip_generation(&mut self) {
        if let Some(s) = &mut self.spec
            && matches!(s.llm, Part::Idle)
        {
            s.llm = Part::Gone;
            s.tts = Part::Gone;
        }
    }

    /// The speculative generation went out as request `id`, matched on `key`; `shadow` (for
    /// spoken replies) finds its first sentence.
    pub(crate) fn start_generation(
        &mut self,
        id: RequestId,
        key: GenerationKey,
        shadow: Option<Reply>,
    ) {
        let Some(s) = &mut self.spec else { return };
        self.stats.requests += 1;
        s.llm = Part::Running(Pending {
            id,
            events: Vec::new(),
            finished: false,
        });
        s.key = Some(key);
        if shadow.is_none() {
            s.tts = Part::Gone;
        }
        s.shadow = shadow;
    }

    /// The first sentence's speculative synthesis went out as request `id`.
    pub(crate) fn start_synthesis(&mut self, id: RequestId, text: String) {
        let Some(s) = &mut self.spec else { return };
        self.stats.requests += 1;
        s.tts = Part::Running(Pending {
            id,
            events: Vec::new(),
            finished: false,
        });
        s.tts_text = text;
    }

    /// A real `Generate` or `Synthesize` is about to go out: `true` when speculative work is
    /// adopted instead (do not send it). Speculative work it makes useless is cancelled.
    pub(crate) fn adopt(&mut self, request: &ProviderRequest) -> bool {
        let Some(mut spec) = self.spec.take() else {
            return false;
        };
        let adopted = self.adopt_in(&mut spec, request);
        self.spec = Some(spec);
        adopted
    }

    fn adopt_in(&mut self, spec: &mut Spec, request: &ProviderRequest) -> bool {
        match request {
            ProviderRequest::Generate {
                id,
                messages,
                tools,
                temperature,
                ..
            } => {
                if !matches!(spec.llm, Part::Running(_)) {
                    return false;
                }
                let same = spec.key.as_ref().is_some_and(|k| {
                    k.temperature == *temperature && k.messages == *messages && k.tools == *tools
                });
                spec.turn_over = true;
                if !same {
                    self.drop_unadopted_generation(spec);
                    return false;
                }
                let Part::Running(pending) = mem::replace(&mut spec.llm, Part::Adopted) else {
                    return false;
                };
                spec.key = None;
                spec.shadow = None;
                if matches!(spec.tts, Part::Idle) {
                    // The real reply asks for its own sentences from here on.
                    spec.tts = Part::Gone;
                }
                self.adopt_part(spec, pending, *id);
                true
            }
            ProviderRequest::Synthesize { id, text, .. } => {
                if !matches!(spec.llm, Part::Adopted) || !matches!(spec.tts, Part::Running(_)) {
                    return false;
                }
                if *text != spec.tts_text {
                    self.drop_part(&mut spec.tts);
                    return false;
                }
                let Part::Running(pending) = mem::replace(&mut spec.tts, Part::Adopted) else {
                    return false;
                };
                self.adopt_part(spec, pending, *id);
                true
            }
            _ => false,
        }
    }

    /// Sorts a provider event: adopted work's (re-tagged), speculative work's (held), or
    /// another request's.
    pub(crate) fn route(&mut self, event: ProviderEvent, policy: Option<&EmojiPolicy>) -> Routing {
        let id = event.id();
        if let Some(i) = self.aliases.iter().position(|(_, spec)| *spec == id) {
            let real = self.aliases[i].0;
            if event.is_last() {
                self.aliases.swap_remove(i);
            }
            if let (Some(s), ProviderEvent::Transcript { text, .. }) = (&mut self.spec, &event)
                && s.asr_real == Some(real)
            {
                s.transcript = Some(text.trim().to_owned());
            }
            return Routing::Real(event.with_id(real));
        }
        let Some(s) = &mut self.spec else {
            return Routing::Other(event);
        };
        if s.asr.running_id() == Some(id) {
            return Routing::Held(self.asr_event(event));
        }
        if s.llm.running_id() == Some(id) {
            return Routing::Held(self.llm_event(event, policy));
        }
        if s.tts.running_id() == Some(id) {
            return Routing::Held(self.tts_event(event));
        }
        Routing::Other(event)
    }

    /// Holds `event` for the running `part`; `false` when it is over its bound (the part is
    /// then dropped).
    fn hold(part: &mut Part, event: ProviderEvent) -> bool {
        let Part::Running(p) = part else { return false };
        if p.events.len() >= MAX_HELD_EVENTS {
            return false;
        }
        p.finished |= event.is_last();
        p.events.push(event);
        true
    }

    fn asr_event(&mut self, event: ProviderEvent) -> Held {
        let Some(s) = &mut self.spec else {
            return Held::Nothing;
        };
        match &event {
            ProviderEvent::Transcript { text, .. } => {
                s.transcript = Some(text.trim().to_owned());
                Self::hold(&mut s.asr, event);
            }
            // A failed recognition is not adopted: the real pipeline asks again, and the
            // speculation has nothing to go on.
            ProviderEvent::Failed { .. } => {
                Self::hold(&mut s.asr, event);
                self.discard();
            }
            // Partial results are not part of the contract.
            _ => {}
        }
        Held::Nothing
    }

    fn llm_event(&mut self, event: ProviderEvent, policy: Option<&EmojiPolicy>) -> Held {
        let Some(s) = &mut self.spec else {
            return Held::Nothing;
        };
        match &event {
            ProviderEvent::ToolCall { .. } | ProviderEvent::Failed { .. } => {
                // Never run a tool speculatively, never adopt a failure: the real pipeline
                // asks again once the turn is real. (A failed request needs no cancel.)
                Self::hold(&mut s.llm, event);
                self.drop_generation_keep_turn();
                return Held::Nothing;
            }
            ProviderEvent::TextDelta { .. } | ProviderEvent::Done { .. } => {}
            _ => return Held::Nothing,
        }
        let first = match (&event, s.shadow.as_mut()) {
            (ProviderEvent::TextDelta { delta, .. }, Some(shadow)) => {
                shadow.text(delta, policy, &mut s.shadow_ids);
                shadow.first_synthesis()
            }
            (ProviderEvent::Done { .. }, Some(shadow)) => {
                shadow.settle_emotion(policy, &mut s.shadow_ids);
                shadow.end_text(&mut s.shadow_ids);
                shadow.first_synthesis()
            }
            _ => None,
        };
        if !Self::hold(&mut s.llm, event) {
            self.drop_generation_keep_turn();
            return Held::Nothing;
        }
        match first {
            Some(ProviderRequest::Synthesize { text, .. }) if matches!(s.tts, Part::Idle) => {
                s.shadow = None;
                Held::FirstSentence(text)
            }
            _ => Held::Nothing,
        }
    }

    /// Drops the generation and its synthesis without ending the user turn's speculation.
    fn drop_generation_keep_turn(&mut self) {
        let Some(mut spec) = self.spec.take() else {
            return;
        };
        self.drop_unadopted_generation(&mut spec);
        self.spec = Some(spec);
    }

    fn tts_event(&mut self, event: ProviderEvent) -> Held {
        let Some(s) = &mut self.spec else {
            return Held::Nothing;
        };
        let failed = matches!(event, ProviderEvent::Failed { .. });
        if !Self::hold(&mut s.tts, event) || failed {
            // A failed synthesis is not adopted: the real reply asks again.
            let mut tts = mem::replace(&mut s.tts, Part::Gone);
            self.drop_part(&mut tts);
        }
        Held::Nothing
    }
}
