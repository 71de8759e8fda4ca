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

use std::time::Instant;

use crate::history::{AudioData, ChatMessage, Content, DeliveryStatus, History};
use crate::provider::{ChatRole, ContextMessage, ProviderEvent, ProviderRequest};
use crate::types::{ClientEvent, ErrorCategory, InputError, RequestId, TurnId};

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
struct Asr {
    id: RequestId,
    audio: Vec<i16>,
    result: Option<(String, String)>,
}

/// A transcript applied in request order ([`Record::next_transcript`]).
#[derive(Debug, PartialEq)]
pub(crate) struct Transcript {
    /// What was said, trimmed (empty: nothing was recognised).
    pub(crate) text: String,
    /// More of the user's speech is still being transcribed.
    pub(crate) more: bool,
}

/// What a finished reply said, for its history entry.
#[derive(Debug, PartialEq)]
pub(crate) enum Said {
    /// A spoken reply: the sentences heard, each with its audio when kept.
    Sentences(Vec<(String, Option<AudioData>)>),
    /// A text reply (or one without audio): the text heard.
    Text(String),
}

/// A conversation query being answered.
#[derive(Debug)]
struct Query {
    id: RequestId,
    text: String,
    outcome: Option<Result<(), String>>,
}

/// Transcripts, history, queries and exports of one conversation.
#[derive(Debug)]
pub(crate) struct Record {
    /// Transcriptions in flight, oldest first.
    asr: VecDeque<Asr>,
    /// Transcribed utterances not yet committed as a user turn.
    heard: Vec<(Vec<i16>, String)>,
    /// The recognizer's latest language.
    language: String,
    /// The conversation so far.
    history: History,
    queries: VecDeque<Query>,
    /// Exports waiting for the response in progress (`exclude_audio` each).
    exports: VecDeque<bool>,
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

    /// The conversation so far.
    pub(crate) fn messages(&self) -> &[ChatMessage] {
        self.history.messages()
    }

    // ---- transcripts ---------------------------------------------------------------------

    /// Whether speech is still being transcribed.
    pub(crate) fn transcribing(&self) -> bool {
        !self.asr.is_empty()
    }

    /// An utterance sent for transcription as request `id`; `audio` is kept for history
    /// (empty when user audio is not kept).
    pub(crate) fn transcribe(&mut self, id: RequestId, audio: Vec<i16>) {
        self.asr.push_back(Asr {
            id,
            audio,
            result: None,
        });
    }

    /// Whether a transcription other than `except` is in flight (or waits for earlier ones).
    pub(crate) fn transcribing_other_than(&self, except: Option<RequestId>) -> bool {
        self.asr.iter().any(|a| Some(a.id) != except)
    }

    /// Whether transcription `id` has not been applied yet (in flight, or its result waits for
    /// earlier ones).
    pub(crate) fn has_transcription(&self, id: RequestId) -> bool {
        self.asr.iter().any(|a| a.id == id)
    }

    /// The LLM context a reply would get if a spoken user turn saying `text` were committed
    /// now ([`crate::history::History::context_with_user`]); nothing changes.
    pub(crate) fn context_with_user(
        &self,
        now: Instant,
        text: &str,
        system_prompt: &str,
        max_chars: usize,
        reserve: usize,
    ) -> Vec<ContextMessage> {
        self.history
            .context_with_user(now, text, system_prompt, max_chars, reserve)
    }

    /// Whether `id` is a transcription still waiting for its result.
    pub(crate) fn awaits_transcript(&self, id: RequestId) -> bool {
        self.asr.iter().any(|a| a.id == id && a.result.is_none())
    }

    /// The result of transcription `id` (empty text when it failed); it is applied once the
    /// transcriptions before it are ([`Record::next_transcript`]).
    pub(crate) fn transcribed(&mut self, id: RequestId, text: String, language: String) {
        if let Some(a) = self
            .asr
            .iter_mut()
            .find(|a| a.id == id && a.result.is_none())
        {
            a.result = Some((text, language));
        }
    }

    /// The oldest transcript if its result is in, applied: its language becomes the
    /// recognizer's, and its utterance is heard for the user turn (within `max_utterance` of
    /// audio). Feed each to the turn machine before asking for the next: a user turn committed
    /// on one takes the utterances heard so far.
    pub(crate) fn next_transcript(&mut self, max_utterance: Duration) -> Option<Transcript> {
        if self.asr.front().is_none_or(|a| a.result.is_none()) {
            return None;
        }
        let Some(Asr {
            audio,
            result: Some((text, language)),
            ..
        }) = self.asr.pop_front()
        else {
            return None;
        };
        if !language.is_empty() {
            self.language = language;
        }
        let text = text.trim().to_owned();
        if !text.is_empty() {
            self.hear(audio, text.clone(), max_utterance);
        }
        Some(Transcript {
            text,
            more: !self.asr.is_empty(),
        })
    }

    // ---- history -------------------------------------------------------------------------

    /// Commits a spoken user turn with the audio heard for it (when `keep_audio`), within
    /// `max_audio` of history audio; returns its transcription event for the client.
    pub(crate) fn user_speech(
        &mut self,
        now: Instant,
        turn: TurnId,
        text: String,
        keep_audio: bool,
        max_audio: Duration,
    ) -> ClientEvent {
        let heard = mem::take(&mut self.heard);
        let mut samples = Vec::new();
        if keep_audio {
            for (audio, _) in &heard {
                samples.extend_from_slice(audio);
            }
        }
        self.history.push_user_audio(
            now,
            turn,
            AudioData {
                samples,
                sample_rate: voxgate_audio::vad::MODEL_RATE,
                transcription: text.clone(),
            },
        );
        self.history.cap_audio(max_audio);
        ClientEvent::UserTranscription {
            turn,
            text,
            language: self.language.clone(),
        }
    }

    /// Commits a typed user turn.
    pub(crate) fn user_text(&mut self, now: Instant, turn: TurnId, text: String) {
        self.history.push_user_text(now, turn, text);
    }

    /// The spoken turn being built was discarded: forgets what was heard for it.
    pub(crate) fn discard_heard(&mut self) {
        self.heard.clear();
    }

    /// Instructions given for response `turn`.
    pub(crate) fn instructions(&mut self, now: Instant, turn: TurnId, text: String) {
        self.history.push_instructions(now, turn, text);
    }

    /// Response `turn` began: its (in progress) history entry exists from now on.
    pub(crate) fn begin_reply(&mut self, now: Instant, turn: TurnId) {
        self.history.assistant(now, turn);
    }

    /// A tool call made in response `turn` ([`Content::ToolCall`]).
    pub(crate) fn tool_call(&mut self, now: Instant, turn: TurnId, call: Content) {
        self.history.assistant(now, turn).content.push(call);
    }

    /// The result of tool call `call_id`.
    pub(crate) fn tool_result(&mut self, now: Instant, call_id: &str, result: String) {
        self.history.push_tool_result(now, call_id, result);
    }

    /// Files what response `turn` said once it is over, within `max_audio` of history audio.
    pub(crate) fn reply_ended(
        &mut self,
        now: Instant,
        turn: TurnId,
        said: Said,
        interrupted: bool,
        ephemeral: bool,
        max_audio: Duration,
    ) {
        match said {
            Said::Sentences(sentences) => {
                self.history.set_assistant_sentences(now, turn, sentences);
                self.history.cap_audio(max_audio);
            }
            Said::Text(text) => self.history.set_assistant_text(now, turn, text),
        }
        let m = self.history.assistant(now, turn);
        m.delivery = if interrupted {
            DeliveryStatus::Interrupted
        } else {
            DeliveryStatus::Complete
        };
        m.ephemeral = ephemeral;
        m.compact();
    }

    /// The LLM context for response `turn`, within `max_chars` with `reserve` characters left
    /// for what the caller adds (the narrated state), and the turns that left it for good now
    /// (marked in history, to report to the client).
    pub(crate) fn response_context(
        &mut self,
        system_prompt: &str,
        max_chars: usize,
        reserve: usize,
        turn: TurnId,
    ) -> (Vec<ContextMessage>, Vec<TurnId>) {
        let context = self.history.context(system_prompt, max_chars, reserve);
        let truncated = self.history.mark_truncated(&context.dropped, turn);
        (context.messages, truncated)
    }

    /// Keeps a transcribed utterance for the user turn, within [`MAX_HEARD_UTTERANCES`] and,
    /// for its audio, within one `max_utterance` for the whole turn (beyond it the text still
    /// counts, the audio is not kept).
    fn hear(&mut self, mut audio: Vec<i16>, text: String, max_utterance: Duration) {
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

    /// Whether exports wait for the response in progress.
    pub(crate) fn has_exports(&self) -> bool {
        !self.exports.is_empty()
    }

    /// The exports waiting for the response in progress, taken (`exclude_audio` each).
    pub(crate) fn take_exports(&mut self) -> VecDeque<bool> {
        mem::take(&mut self.exports)
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

    /// Whether `id` is a conversation query being answered.
    pub(crate) fn awaits_query(&self, id: RequestId) -> bool {
        self.queries.iter().any(|q| q.id == id)
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
    fn transcripts_apply_in_request_order_and_commit_what_was_heard() {
        let mut r = Record::new(0);
        let max = Duration::from_secs(60);
        r.transcribe(RequestId(1), vec![1; 10]);
        r.transcribe(RequestId(2), vec![2; 20]);
        assert!(r.transcribing() && r.awaits_transcript(RequestId(2)));
        r.transcribed(RequestId(2), " later ".into(), "fr".into());
        assert!(!r.awaits_transcript(RequestId(2)));
        // The second waits for the first.
        assert_eq!(r.next_transcript(max), None);
        r.transcribed(RequestId(1), "first".into(), String::new());
        let first = r.next_transcript(max);
        let second = r.next_transcript(max);
        assert_eq!(
            (first, second),
            (
                Some(Transcript {
                    text: "first".into(),
                    more: true
                }),
                Some(Transcript {
                    text: "later".into(),
                    more: false
                })
            )
        );
        assert!(!r.transcribing());
        let now = Instant::now();
        let event = r.user_speech(now, TurnId(1), "first later".into(), true, max);
        assert_eq!(
            event,
            ClientEvent::UserTranscription {
                turn: TurnId(1),
                text: "first later".into(),
                language: "fr".into()
            }
        );
        assert!(r.heard.is_empty());
        match &r.messages()[0].content[0] {
            Content::InputAudio(a) => assert_eq!(a.samples.len(), 30),
            other => panic!("{other:?}"),
        }
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
