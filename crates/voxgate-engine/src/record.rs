//! The record machine: what the user said and what was said in all: transcriptions in flight
//! (applied in request order), the utterances heard for the user turn being built, the
//! recognizer's language, the chat [`History`], and the conversation queries and history
//! exports waiting for answers.
//!
//! Every queue here is bounded so a client cannot grow a session's memory: history by
//! [`crate::EngineConfig::max_history_messages`], queries by [`MAX_PENDING_QUERIES`], awaited
//! exports by [`MAX_PENDING_EXPORTS`], heard utterances by [`MAX_HEARD_UTTERANCES`] (and their
//! audio by one [`crate::EngineConfig::max_utterance`]). Transcriptions in flight are one per
//! utterance the VAD ended, and are answered or cancelled by the recognizer.

use std::collections::VecDeque;
use std::mem;
use std::time::Duration;

use crate::history::History;
use crate::provider::{ChatRole, ContextMessage, ProviderEvent, ProviderRequest};
use crate::types::{ClientEvent, ErrorCategory, InputError, RequestId};

/// Most conversation queries answered at once (each is an LLM request): a client asking more
/// before the answers come is refused with [`ClientEvent::Error`], so it cannot make the session
/// hold (or the server run) an unbounded number of requests.
pub const MAX_PENDING_QUERIES: usize = 4;

/// Most history exports waiting for the response in progress (`await_pending`): one answers
/// the question "what was said"; more than a few waiting at once is a client loop, refused with
/// [`ClientEvent::Error`] so each waiting export's copy of history cannot pile up.
pub const MAX_PENDING_EXPORTS: usize = 4;

/// Most transcribed utterances kept for one user turn before it is committed: a held
/// push-to-talk turn (or speech that keeps a turn open) could otherwise collect utterances
/// without end. Beyond it each new utterance's audio is merged into the last entry.
pub(crate) const MAX_HEARD_UTTERANCES: usize = 64;

/// The next request id from the engine's counter.
pub(crate) fn next_id(next: &mut u64) -> RequestId {
    let id = RequestId(*next);
    *next += 1;
    id
}

/// A transcription in flight; results are applied in request order.
#[derive(Debug)]
pub(crate) struct Asr {
    pub(crate) id: RequestId,
    pub(crate) audio: Vec<i16>,
    pub(crate) result: Option<(String, String)>,
}

/// A conversation query being answered.
#[derive(Debug)]
pub(crate) struct Query {
    pub(crate) id: RequestId,
    text: String,
    outcome: Option<Result<(), String>>,
}

/// Transcripts, history, queries and exports of one conversation.
#[derive(Debug)]
pub(crate) struct Record {
    /// Transcriptions in flight, oldest first.
    pub(crate) asr: VecDeque<Asr>,
    /// Transcribed utterances not yet committed as a user turn.
    pub(crate) heard: Vec<(Vec<i16>, String)>,
    /// The recognizer's latest language.
    pub(crate) language: String,
    /// The conversation so far.
    pub(crate) history: History,
    pub(crate) queries: VecDeque<Query>,
    /// Exports waiting for the response in progress (`exclude_audio` each).
    pub(crate) exports: VecDeque<bool>,
}

impl Record {
    /// An empty record keeping at most `max_history_messages` messages (0: unlimited).
    pub(crate) fn new(max_history_messages: usize) -> Self {
        Self {
            asr: VecDeque::new(),
            heard: Vec::new(),
            language: String::new(),
            history: History::with_limit(max_history_messages),
            queries: VecDeque::new(),
            exports: VecDeque::new(),
        }
    }

    /// Keeps a transcribed utterance for the user turn, within [`MAX_HEARD_UTTERANCES`] and,
    /// for its audio, within one `max_utterance` for the whole turn (beyond it the text still
    /// counts, the audio is not kept).
    pub(crate) fn hear(&mut self, mut audio: Vec<i16>, text: String, max_utterance: Duration) {
        let max_samples = usize::try_from(
            max_utterance.as_millis() * u128::from(voxgate_audio::vad::MODEL_RATE) / 1000,
        )
        .unwrap_or(usize::MAX);
        let kept: usize = self.heard.iter().map(|(a, _)| a.len()).sum();
        if kept.saturating_add(audio.len()) > max_samples {
            audio = Vec::new();
        }
        let full = self.heard.len() >= MAX_HEARD_UTTERANCES;
        match self.heard.last_mut() {
            // The turn's text comes from the turn machine's words; here only audio matters.
            Some((last_audio, _)) if full => last_audio.extend_from_slice(&audio),
            _ => self.heard.push((audio, text)),
        }
    }

    /// The history export, `exclude_audio` or not.
    pub(crate) fn export(&self, exclude_audio: bool) -> ClientEvent {
        let messages = self
            .history
            .messages()
            .iter()
            .map(|m| {
                if exclude_audio {
                    m.without_audio()
                } else {
                    m.clone()
                }
            })
            .collect();
        ClientEvent::History {
            messages,
            dropped: self.history.dropped(),
        }
    }

    /// Queues an export until the response in progress is over; `Err` is the refusal to send
    /// when [`MAX_PENDING_EXPORTS`] already wait.
    pub(crate) fn await_export(&mut self, exclude_audio: bool) -> Result<(), ClientEvent> {
        if self.exports.len() >= MAX_PENDING_EXPORTS {
            return Err(ClientEvent::Error {
                category: ErrorCategory::Session,
                message: format!(
                    "history export refused: {MAX_PENDING_EXPORTS} exports already wait for \
                     the response in progress"
                ),
            });
        }
        self.exports.push_back(exclude_audio);
        Ok(())
    }

    /// A conversation query: the request to send, or (inner `Err`) the refusal to report
    /// when [`MAX_PENDING_QUERIES`] are being answered.
    ///
    /// # Errors
    /// [`InputError::EmptyQuery`] with neither prompt nor instructions.
    pub(crate) fn query(
        &mut self,
        prompt: Option<String>,
        instructions: Option<String>,
        system_prompt: &str,
        max_context_chars: usize,
        next: &mut u64,
    ) -> Result<Result<ProviderRequest, ClientEvent>, InputError> {
        let prompt = prompt.filter(|p| !p.trim().is_empty());
        let instructions = instructions.filter(|i| !i.trim().is_empty());
        if prompt.is_none() && instructions.is_none() {
            return Err(InputError::EmptyQuery);
        }
        if self.queries.len() >= MAX_PENDING_QUERIES {
            return Ok(Err(ClientEvent::Error {
                category: ErrorCategory::Session,
                message: format!(
                    "conversation query refused: {MAX_PENDING_QUERIES} queries are already \
                     being answered"
                ),
            }));
        }
        // The same bound as replies, with room for the question; a query is no response, so
        // what it leaves out stays in later replies' contexts (nothing is marked or reported).
        let reserve = instructions.as_ref().map_or(0, |i| i.chars().count())
            + prompt.as_ref().map_or(0, |p| p.chars().count());
        let mut messages = self
            .history
            .context(system_prompt, max_context_chars, reserve)
            .messages;
        if let Some(i) = instructions {
            messages.push(ContextMessage::new(ChatRole::System, i));
        }
        if let Some(p) = prompt {
            messages.push(ContextMessage::new(ChatRole::User, p));
        }
        let id = next_id(next);
        self.queries.push_back(Query {
            id,
            text: String::new(),
            outcome: None,
        });
        Ok(Ok(ProviderRequest::Query { id, messages }))
    }

    /// Applies an event of a query; the answers now due go out in the order the queries came.
    /// `None`: the event is stale (its query already ended, or it is unknown).
    pub(crate) fn query_event(&mut self, event: ProviderEvent) -> Option<Vec<ClientEvent>> {
        let id = event.id();
        let q = self.queries.iter_mut().find(|q| q.id == id)?;
        if q.outcome.is_some() {
            return None;
        }
        match event {
            ProviderEvent::TextDelta { delta, .. } => q.text.push_str(&delta),
            ProviderEvent::Done { .. } => q.outcome = Some(Ok(())),
            ProviderEvent::Failed { message, .. } => q.outcome = Some(Err(message)),
            _ => {}
        }
        let mut out = Vec::new();
        while self.queries.front().is_some_and(|q| q.outcome.is_some()) {
            let Some(q) = self.queries.pop_front() else {
                break;
            };
            match q.outcome {
                Some(Ok(())) => out.push(ClientEvent::QueryResult {
                    text: q.text.trim().to_owned(),
                }),
                Some(Err(message)) => out.push(ClientEvent::Error {
                    category: ErrorCategory::Inference,
                    message: format!("conversation query failed: {message}"),
                }),
                None => {}
            }
        }
        Some(out)
    }

    /// The session is over: forgets what waits and returns the requests to cancel.
    pub(crate) fn close(&mut self) -> Vec<RequestId> {
        self.heard.clear();
        self.exports.clear();
        mem::take(&mut self.asr)
            .into_iter()
            .map(|a| a.id)
            .chain(mem::take(&mut self.queries).into_iter().map(|q| q.id))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(r: &mut Record, next: &mut u64) -> Result<ProviderRequest, ClientEvent> {
        r.query(Some("What did I say?".into()), None, "S", 0, next)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn queries_are_bounded_and_answered_in_order() {
        let mut r = Record::new(0);
        let mut next = 1;
        let ids: Vec<RequestId> = (0..MAX_PENDING_QUERIES)
            .map(|_| match ask(&mut r, &mut next) {
                Ok(ProviderRequest::Query { id, .. }) => id,
                other => panic!("{other:?}"),
            })
            .collect();
        assert!(matches!(
            ask(&mut r, &mut next),
            Err(ClientEvent::Error {
                category: ErrorCategory::Session,
                ..
            })
        ));
        assert_eq!((r.queries.len(), next), (MAX_PENDING_QUERIES, 5));
        assert_eq!(
            r.query(None, Some(" ".into()), "S", 0, &mut next),
            Err(InputError::EmptyQuery)
        );
        // The second answer waits for the first.
        assert_eq!(
            r.query_event(ProviderEvent::Done { id: ids[1] }),
            Some(vec![])
        );
        assert_eq!(r.query_event(ProviderEvent::Done { id: ids[1] }), None);
        let out = r.query_event(ProviderEvent::Done { id: ids[0] }).unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(r.queries.len(), MAX_PENDING_QUERIES - 2);
        assert!(ask(&mut r, &mut next).is_ok());
    }

    #[test]
    fn awaited_exports_are_bounded() {
        let mut r = Record::new(0);
        for _ in 0..MAX_PENDING_EXPORTS {
            assert!(r.await_export(true).is_ok());
        }
        assert!(r.await_export(false).is_err());
        assert_eq!(r.exports.len(), MAX_PENDING_EXPORTS);
        assert!(r.close().is_empty());
        assert!(r.exports.is_empty());
    }

    #[test]
    fn heard_utterances_and_their_audio_are_bounded() {
        let mut r = Record::new(0);
        let max = Duration::from_secs(1);
        for n in 0..MAX_HEARD_UTTERANCES * 3 {
            r.hear(vec![0; 160], format!("part {n}"), max);
        }
        assert_eq!(r.heard.len(), MAX_HEARD_UTTERANCES);
        let samples: usize = r.heard.iter().map(|(a, _)| a.len()).sum();
        // 100 parts of 10 ms fill the one-second cap; the rest are not kept.
        assert_eq!(samples, 16_000);
    }
}
