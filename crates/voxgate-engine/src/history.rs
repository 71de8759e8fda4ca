//! Chat history after the realtime protocol's `ChatMessage` model, and the LLM context built
//! from it.
//!
//! Spoken replies keep one [`Content::Text`] per synthesized sentence with that sentence's
//! audio in `tts_audio`; spoken user turns keep their utterances in [`Content::InputAudio`]
//! with the transcription. Audio is what makes history large, so the engine keeps at most
//! [`crate::EngineConfig::max_history_audio`] of it per session: past that, the oldest audio
//! is dropped (texts and transcriptions stay). Exports with `exclude_audio` leave all of it
//! out.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::provider::{ChatRole, ContextMessage, ContextToolCall};
use crate::types::TurnId;

/// Who a history message is from (`ChatMessageRole`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Role {
    /// Instructions and protocol-level notes.
    System,
    /// The user (tool results the client returned are filed with the assistant's call instead).
    User,
    /// The assistant.
    Assistant,
}

/// Delivery of a message to the user (`ChatDeliveryStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeliveryStatus {
    /// Still being generated or played.
    InProgress,
    /// Delivered in full.
    Complete,
    /// Cut off; the text holds exactly what was heard.
    Interrupted,
}

/// Recorded audio (`ChatAudioData`). Its format (`AudioLineConfiguration`) is always mono
/// 16-bit PCM at `sample_rate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AudioData {
    /// Samples (empty when exported with `exclude_audio` or dropped by the session's audio
    /// cap).
    pub samples: Vec<i16>,
    /// Their rate in Hz.
    pub sample_rate: u32,
    /// What was said in it.
    pub transcription: String,
}

/// One item of a message (`ChatMessageContent`).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Content {
    /// Text: typed by the user, or what the assistant said (with its speech, if kept).
    Text {
        /// The text.
        text: String,
        /// The synthesized speech of it: for spoken replies, each sentence's audio as it was
        /// delivered (`None` for text-only replies, typed text, exports with `exclude_audio`
        /// and audio dropped by the session's cap).
        tts_audio: Option<AudioData>,
    },
    /// A spoken user turn.
    InputAudio(AudioData),
    /// Model reasoning kept out of speech.
    Thoughts(String),
    /// The assistant called a tool.
    ToolCall {
        /// Correlation id.
        id: String,
        /// The tool's own name (as its source declared it).
        name: String,
        /// Name the model used, kept so later contexts repeat the call exactly.
        llm_name: String,
        /// Arguments.
        arguments: Value,
    },
    /// A tool's result.
    ToolResult {
        /// The call it answers.
        id: String,
        /// The result text.
        result: String,
    },
    /// Extra instructions (`TriggerInference.extra_instructions`).
    Instructions(String),
}

impl AudioData {
    fn compact(&mut self) {
        self.samples.shrink_to_fit();
        self.transcription.shrink_to_fit();
    }

    /// Its length in microseconds.
    fn micros(&self) -> u128 {
        if self.sample_rate == 0 {
            return 0;
        }
        self.samples.len() as u128 * 1_000_000 / u128::from(self.sample_rate)
    }
}

impl Content {
    /// The recorded audio of this item, if any.
    fn audio(&self) -> Option<&AudioData> {
        match self {
            Self::InputAudio(a) => Some(a),
            Self::Text {
                tts_audio: Some(a), ..
            } => Some(a),
            _ => None,
        }
    }
}

/// One message of the conversation (`ChatMessage`).
#[derive(Debug, Clone, PartialEq)]
pub struct ChatMessage {
    /// Who.
    pub role: Role,
    /// What, in order.
    pub content: Vec<Content>,
    /// Delivery status (user messages are always complete).
    pub delivery: DeliveryStatus,
    /// Kept for the client's record but never given to the model (direct speech with
    /// `include_in_history: false`).
    pub ephemeral: bool,
    /// When it was created (the door turns this into wall-clock time).
    pub created_at: Instant,
    /// The turn it belongs to.
    pub turn: Option<TurnId>,
    /// The response turn that was the first generated without this message: it was dropped
    /// from the model's context then (and stays out) to keep the context within
    /// [`crate::EngineConfig::max_context_chars`]. `None` while it is still in the context.
    /// Unrelated to interruption, which is [`DeliveryStatus::Interrupted`] with the text cut
    /// to what was heard.
    pub truncated_at_response_turn: Option<TurnId>,
}

impl ChatMessage {
    fn new(role: Role, turn: Option<TurnId>, created_at: Instant) -> Self {
        Self {
            role,
            content: Vec::new(),
            delivery: DeliveryStatus::Complete,
            ephemeral: false,
            created_at,
            turn,
            truncated_at_response_turn: None,
        }
    }

    /// The message's text: its text items, or transcriptions of its audio, joined as
    /// sentences (a space between them except around CJK).
    #[must_use]
    pub fn text(&self) -> String {
        let mut out = String::new();
        for c in &self.content {
            let t = match c {
                Content::Text { text, .. } => text.as_str(),
                Content::InputAudio(a) => a.transcription.as_str(),
                _ => continue,
            };
            crate::playback::join(&mut out, t);
        }
        out
    }

    /// Gives back the spare capacity a message's buffers grew while it was being built (a
    /// reply's text arrives token by token): a finished message is kept for the rest of the
    /// session, a hundred of them by default, so their slack adds up.
    pub(crate) fn compact(&mut self) {
        for c in &mut self.content {
            match c {
                Content::Text { text, tts_audio } => {
                    text.shrink_to_fit();
                    if let Some(a) = tts_audio {
                        a.compact();
                    }
                }
                Content::InputAudio(a) => a.compact(),
                Content::Thoughts(t) | Content::Instructions(t) => t.shrink_to_fit(),
                Content::ToolCall {
                    id, name, llm_name, ..
                } => {
                    id.shrink_to_fit();
                    name.shrink_to_fit();
                    llm_name.shrink_to_fit();
                }
                Content::ToolResult { id, result } => {
                    id.shrink_to_fit();
                    result.shrink_to_fit();
                }
            }
        }
        self.content.shrink_to_fit();
    }

    /// A copy without audio samples (`exclude_audio`).
    #[must_use]
    pub fn without_audio(&self) -> Self {
        let mut m = self.clone();
        for c in &mut m.content {
            match c {
                Content::InputAudio(a) => a.samples = Vec::new(),
                Content::Text { tts_audio, .. } => *tts_audio = None,
                _ => {}
            }
        }
        m
    }
}

/// The conversation record.
#[derive(Debug, Clone, Default)]
pub(crate) struct History {
    messages: Vec<ChatMessage>,
    /// Most messages kept (0: unlimited).
    limit: usize,
    /// Messages dropped from memory to stay within `limit`.
    dropped: u64,
}

impl History {
    /// An empty history keeping at most `limit` messages (0: unlimited).
    pub(crate) fn with_limit(limit: usize) -> Self {
        Self {
            limit,
            ..Self::default()
        }
    }

    pub(crate) fn messages(&self) -> &[ChatMessage] {
        &self.messages
    }

    /// Messages dropped from memory since the start.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Adds a message, dropping the oldest finished ones beyond the limit. A message still in
    /// progress (the reply being generated) is never dropped: its calls and text are still
    /// being filed.
    fn push(&mut self, mut m: ChatMessage) {
        if m.delivery != DeliveryStatus::InProgress {
            m.compact();
        }
        self.messages.push(m);
        while self.limit > 0 && self.messages.len() > self.limit {
            let Some(oldest) = self
                .messages
                .iter()
                .position(|m| m.delivery != DeliveryStatus::InProgress)
            else {
                break;
            };
            self.messages.remove(oldest);
            self.dropped += 1;
        }
    }

    pub(crate) fn push_user_text(&mut self, now: Instant, turn: TurnId, text: String) {
        let mut m = ChatMessage::new(Role::User, Some(turn), now);
        m.content.push(Content::Text {
            text,
            tts_audio: None,
        });
        self.push(m);
    }

    pub(crate) fn push_user_audio(&mut self, now: Instant, turn: TurnId, audio: AudioData) {
        let mut m = ChatMessage::new(Role::User, Some(turn), now);
        m.content.push(Content::InputAudio(audio));
        self.push(m);
    }

    pub(crate) fn push_instructions(&mut self, now: Instant, turn: TurnId, text: String) {
        let mut m = ChatMessage::new(Role::System, Some(turn), now);
        m.content.push(Content::Instructions(text));
        self.push(m);
    }

    /// The assistant message of `turn`, created (in progress) on first use.
    pub(crate) fn assistant(&mut self, now: Instant, turn: TurnId) -> &mut ChatMessage {
        let found = self
            .messages
            .iter()
            .rposition(|m| m.role == Role::Assistant && m.turn == Some(turn));
        let i = match found {
            Some(i) => i,
            None => {
                let mut m = ChatMessage::new(Role::Assistant, Some(turn), now);
                m.delivery = DeliveryStatus::InProgress;
                self.push(m);
                self.messages.len() - 1
            }
        };
        &mut self.messages[i]
    }

    /// Sets the spoken text of `turn`'s reply (replacing any earlier text item).
    pub(crate) fn set_assistant_text(&mut self, now: Instant, turn: TurnId, text: String) {
        let m = self.assistant(now, turn);
        m.content.retain(|c| !matches!(c, Content::Text { .. }));
        if !text.is_empty() {
            // Text first: the model said it before (or while) its tools ran.
            m.content.insert(
                0,
                Content::Text {
                    text,
                    tts_audio: None,
                },
            );
        }
    }

    /// Sets the spoken text of `turn`'s reply as one text item per sentence, each with its
    /// audio (replacing any earlier text items).
    pub(crate) fn set_assistant_sentences(
        &mut self,
        now: Instant,
        turn: TurnId,
        sentences: Vec<(String, Option<AudioData>)>,
    ) {
        let m = self.assistant(now, turn);
        m.content.retain(|c| !matches!(c, Content::Text { .. }));
        let texts = sentences
            .into_iter()
            .filter(|(text, _)| !text.is_empty())
            .map(|(text, tts_audio)| Content::Text { text, tts_audio });
        // Text first: the model said it before (or while) its tools ran.
        m.content.splice(0..0, texts);
    }

    /// Drops the oldest recorded audio until at most `cap` of it is kept (texts and
    /// transcriptions stay). Returns how many audio items were dropped.
    pub(crate) fn cap_audio(&mut self, cap: Duration) -> usize {
        let cap = cap.as_micros();
        let mut total: u128 = self
            .messages
            .iter()
            .flat_map(|m| &m.content)
            .filter_map(Content::audio)
            .map(AudioData::micros)
            .sum();
        let mut dropped = 0;
        for c in self.messages.iter_mut().flat_map(|m| &mut m.content) {
            if total <= cap {
                break;
            }
            let micros = c.audio().map_or(0, AudioData::micros);
            if micros == 0 {
                continue;
            }
            match c {
                Content::InputAudio(a) => a.samples = Vec::new(),
                Content::Text { tts_audio, .. } => *tts_audio = None,
                _ => continue,
            }
            total -= micros;
            dropped += 1;
        }
        dropped
    }

    /// Files a tool result with the assistant message that made the call.
    pub(crate) fn push_tool_result(&mut self, now: Instant, call_id: &str, result: String) {
        let owner = self.messages.iter().rposition(|m| {
            m.content
                .iter()
                .any(|c| matches!(c, Content::ToolCall { id, .. } if id == call_id))
        });
        let content = Content::ToolResult {
            id: call_id.to_owned(),
            result,
        };
        match owner {
            Some(i) => self.messages[i].content.push(content),
            None => {
                let mut m = ChatMessage::new(Role::Assistant, None, now);
                m.content.push(content);
                self.push(m);
            }
        }
    }

    /// Builds the LLM context within `max_chars` ([`crate::EngineConfig::max_context_chars`];
    /// 0: unlimited): the system prompt, then every non-ephemeral message not already dropped
    /// from the context. An assistant message becomes an assistant message (text + calls)
    /// followed by one tool message per result.
    ///
    /// When the whole does not fit (`reserve` counts what the caller appends), the oldest
    /// exchanges are left out, whole: an exchange is a user message with everything after it
    /// up to the next user message (replies, tool calls with their results, instructions), so
    /// the context never starts with an answer to a question it lacks and a tool call never
    /// loses its result. The system prompt and the newest exchange (the newest user turn and
    /// the reply being built) always stay, even when they alone exceed the budget. Nothing is
    /// marked here: the caller records the left-out messages with [`History::mark_truncated`]
    /// when they leave the context for good.
    pub(crate) fn context(&self, system_prompt: &str, max_chars: usize, reserve: usize) -> Context {
        self.context_of(
            self.messages.iter().enumerate(),
            system_prompt,
            max_chars,
            reserve,
        )
    }

    /// The context a reply would get if a spoken user turn saying `text` were committed now
    /// (history's message limit applied as [`History::push`] would), without changing
    /// anything: the speculative generation's context, which must equal the real one for the
    /// speculative work to be adopted (see `crate::speculation`).
    pub(crate) fn context_with_user(
        &self,
        now: Instant,
        text: &str,
        system_prompt: &str,
        max_chars: usize,
        reserve: usize,
    ) -> Vec<ContextMessage> {
        let mut user = ChatMessage::new(Role::User, None, now);
        user.content.push(Content::InputAudio(AudioData {
            samples: Vec::new(),
            sample_rate: voxgate_audio::vad::MODEL_RATE,
            transcription: text.to_owned(),
        }));
        // `push` drops the oldest finished messages beyond the limit: skip those.
        let mut drop = if self.limit > 0 {
            (self.messages.len() + 1).saturating_sub(self.limit)
        } else {
            0
        };
        let all = self
            .messages
            .iter()
            .chain(std::iter::once(&user))
            .enumerate()
            .filter(move |(_, m)| {
                if drop > 0 && m.delivery != DeliveryStatus::InProgress {
                    drop -= 1;
                    return false;
                }
                true
            });
        self.context_of(all, system_prompt, max_chars, reserve)
            .messages
    }

    fn context_of<'a>(
        &self,
        messages: impl Iterator<Item = (usize, &'a ChatMessage)>,
        system_prompt: &str,
        max_chars: usize,
        reserve: usize,
    ) -> Context {
        /// Messages of one exchange, their context and its size.
        struct Exchange {
            indices: Vec<usize>,
            context: Vec<ContextMessage>,
            chars: usize,
        }
        let mut exchanges: Vec<Exchange> = Vec::new();
        for (i, m) in messages {
            if m.ephemeral || m.truncated_at_response_turn.is_some() {
                continue;
            }
            let context = message_context(m);
            let chars = context.iter().map(context_chars).sum::<usize>();
            match exchanges.last_mut() {
                Some(e) if m.role != Role::User => {
                    e.indices.push(i);
                    e.context.extend(context);
                    e.chars += chars;
                }
                _ => exchanges.push(Exchange {
                    indices: vec![i],
                    context,
                    chars,
                }),
            }
        }
        let mut total = system_prompt.chars().count()
            + reserve
            + exchanges.iter().map(|e| e.chars).sum::<usize>();
        let mut first = 0;
        while max_chars > 0 && total > max_chars && first + 1 < exchanges.len() {
            total -= exchanges[first].chars;
            first += 1;
        }
        let mut messages = Vec::with_capacity(self.messages.len() + 1);
        if !system_prompt.is_empty() {
            messages.push(ContextMessage::new(ChatRole::System, system_prompt));
        }
        let mut dropped = Vec::new();
        for (n, e) in exchanges.into_iter().enumerate() {
            if n < first {
                dropped.extend(e.indices);
            } else {
                messages.extend(e.context);
            }
        }
        Context { messages, dropped }
    }

    /// Records that the messages at `dropped` (from [`History::context`]) left the context
    /// for good when response `response` was generated without them: later contexts leave
    /// them out too. Returns their turns, each once, oldest first.
    pub(crate) fn mark_truncated(&mut self, dropped: &[usize], response: TurnId) -> Vec<TurnId> {
        let mut turns = Vec::new();
        for &i in dropped {
            let Some(m) = self.messages.get_mut(i) else {
                continue;
            };
            m.truncated_at_response_turn = Some(response);
            if let Some(t) = m.turn
                && !turns.contains(&t)
            {
                turns.push(t);
            }
        }
        turns
    }
}

/// An LLM context built from history ([`History::context`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Context {
    /// The messages for the model.
    pub(crate) messages: Vec<ContextMessage>,
    /// History indices of the messages left out to fit the budget (not yet marked).
    pub(crate) dropped: Vec<usize>,
}

/// The context messages of one history message.
fn message_context(m: &ChatMessage) -> Vec<ContextMessage> {
    let mut out = Vec::new();
    match m.role {
        Role::User => {
            let text = m.text();
            if !text.is_empty() {
                out.push(ContextMessage::new(ChatRole::User, text));
            }
        }
        Role::System => {
            for c in &m.content {
                if let Content::Instructions(t) | Content::Text { text: t, .. } = c {
                    out.push(ContextMessage::new(ChatRole::System, t.clone()));
                }
            }
        }
        Role::Assistant => {
            let mut msg = ContextMessage::new(ChatRole::Assistant, m.text());
            let mut results = Vec::new();
            for c in &m.content {
                match c {
                    Content::ToolCall {
                        id,
                        llm_name,
                        arguments,
                        ..
                    } => msg.tool_calls.push(ContextToolCall {
                        id: id.clone(),
                        name: llm_name.clone(),
                        arguments: arguments.clone(),
                    }),
                    Content::ToolResult { id, result } => {
                        let mut r = ContextMessage::new(ChatRole::Tool, result.clone());
                        r.tool_call_id = Some(id.clone());
                        results.push(r);
                    }
                    _ => {}
                }
            }
            if !msg.content.is_empty() || !msg.tool_calls.is_empty() {
                out.push(msg);
            }
            out.extend(results);
        }
    }
    out
}

/// The size of a context message as the budget counts it: the characters of its text, plus
/// each tool call's name and JSON arguments (a rough stand-in for tokens: about four
/// characters per token in English, one per CJK character).
pub(crate) fn context_chars(m: &ContextMessage) -> usize {
    m.content.chars().count()
        + m.tool_calls
            .iter()
            .map(|c| c.name.chars().count() + c.arguments.to_string().chars().count())
            .sum::<usize>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn context_pairs_calls_with_results_and_skips_ephemeral() {
        let t0 = Instant::now();
        let mut h = History::default();
        h.push_user_text(t0, TurnId(1), "volume up".into());
        h.assistant(t0, TurnId(2)).content.push(Content::ToolCall {
            id: "c1".into(),
            name: "self.audio_speaker.set_volume".into(),
            llm_name: "self_audio_speaker_set_volume".into(),
            arguments: json!({"volume": 80}),
        });
        h.push_tool_result(t0, "c1", "true".into());
        h.set_assistant_text(t0, TurnId(3), "Done.".into());
        h.assistant(t0, TurnId(4)).ephemeral = true;
        h.set_assistant_text(t0, TurnId(4), "Hold on.".into());
        let ctx = h.context("Be brief.", 0, 0).messages;
        let roles: Vec<ChatRole> = ctx.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [
                ChatRole::System,
                ChatRole::User,
                ChatRole::Assistant,
                ChatRole::Tool,
                ChatRole::Assistant
            ]
        );
        assert_eq!(ctx[2].tool_calls[0].name, "self_audio_speaker_set_volume");
        assert_eq!(ctx[3].tool_call_id.as_deref(), Some("c1"));
        assert_eq!(ctx[4].content, "Done.");
    }

    #[test]
    fn budget_groups_exchanges_from_each_user_turn_and_skips_ephemeral_messages() {
        let t0 = Instant::now();
        let mut h = History::default();
        // A greeting before the user spoke is an exchange of its own.
        h.push_instructions(t0, TurnId(1), "Greet.".into());
        h.set_assistant_text(t0, TurnId(1), "Hello!".into());
        h.push_user_text(t0, TurnId(2), "0123456789".into());
        h.assistant(t0, TurnId(3)).ephemeral = true;
        h.set_assistant_text(t0, TurnId(3), "One moment.".into());
        h.set_assistant_text(t0, TurnId(4), "abcdefghij".into());
        // A result whose call is unknown is filed on its own, in the exchange it came in.
        h.push_tool_result(t0, "lost", "r".into());
        h.push_user_text(t0, TurnId(5), "klmnopqrst".into());

        let all = h.context("S", 0, 0);
        assert!(all.dropped.is_empty());
        assert_eq!(all.messages.len(), 7);
        // 1 + 12 + 21 + 10 = 44: the greeting goes first, then the first question with its
        // reply and the stray result; the newest question stays even alone over budget.
        assert_eq!(h.context("S", 40, 0).dropped, [0, 1]);
        assert_eq!(h.context("S", 20, 0).dropped, [0, 1, 2, 4, 5]);
        let tight = h.context("S", 1, 100);
        assert_eq!(tight.dropped, [0, 1, 2, 4, 5]);
        let texts: Vec<&str> = tight.messages.iter().map(|m| m.content.as_str()).collect();
        assert_eq!(texts, ["S", "klmnopqrst"]);

        // Marked messages stay out; their turns are reported once each, the ephemeral one's
        // never.
        let dropped = h.context("S", 20, 0).dropped;
        assert_eq!(
            h.mark_truncated(&dropped, TurnId(6)),
            [TurnId(1), TurnId(2), TurnId(4)]
        );
        assert_eq!(h.messages()[3].truncated_at_response_turn, None);
        assert_eq!(h.messages()[5].truncated_at_response_turn, Some(TurnId(6)));
        let after = h.context("S", 0, 0);
        assert!(after.dropped.is_empty());
        assert_eq!(after.messages.len(), 2);
    }

    #[test]
    fn without_audio_drops_samples_keeps_transcription() {
        let t0 = Instant::now();
        let mut h = History::default();
        h.push_user_audio(
            t0,
            TurnId(1),
            AudioData {
                samples: vec![1, 2, 3],
                sample_rate: 16_000,
                transcription: "hi".into(),
            },
        );
        let m = h.messages()[0].without_audio();
        assert_eq!(
            m.content,
            [Content::InputAudio(AudioData {
                samples: vec![],
                sample_rate: 16_000,
                transcription: "hi".into()
            })]
        );
        assert_eq!(m.text(), "hi");
    }

    /// Heap and inline bytes a history holds: every message, its content items and what they
    /// own (string and sample capacities, JSON arguments as serialized).
    fn held_bytes(h: &History) -> usize {
        use std::mem::size_of;
        h.messages
            .iter()
            .map(|m| {
                size_of::<ChatMessage>()
                    + m.content.capacity() * size_of::<Content>()
                    + m.content
                        .iter()
                        .map(|c| match c {
                            Content::Text { text, tts_audio } => {
                                text.capacity()
                                    + tts_audio.as_ref().map_or(0, |a| {
                                        a.samples.capacity() * 2 + a.transcription.capacity()
                                    })
                            }
                            Content::InputAudio(a) => {
                                a.samples.capacity() * 2 + a.transcription.capacity()
                            }
                            Content::Thoughts(t) | Content::Instructions(t) => t.capacity(),
                            Content::ToolCall {
                                id,
                                name,
                                llm_name,
                                arguments,
                            } => {
                                id.capacity()
                                    + name.capacity()
                                    + llm_name.capacity()
                                    + arguments.to_string().len() * 2
                            }
                            Content::ToolResult { id, result } => id.capacity() + result.capacity(),
                        })
                        .sum::<usize>()
            })
            .sum::<usize>()
            + h.messages.capacity() * size_of::<ChatMessage>()
    }

    /// Fills a history with long exchanges: a 400-character spoken user turn (its audio
    /// already dropped by the audio cap) and a 1,200-character reply of six sentences that
    /// called a tool.
    fn fill_long(h: &mut History, exchanges: u32) {
        let t0 = Instant::now();
        for n in 0..exchanges {
            let user = TurnId(2 * n + 1);
            let reply = TurnId(2 * n + 2);
            h.push_user_audio(
                t0,
                user,
                AudioData {
                    samples: Vec::new(),
                    sample_rate: 16_000,
                    transcription: "u".repeat(400),
                },
            );
            let call = format!("call_{n:08}");
            h.assistant(t0, reply).content.push(Content::ToolCall {
                id: call.clone(),
                name: "self.audio_speaker.set_volume".into(),
                llm_name: "self_audio_speaker_set_volume".into(),
                arguments: json!({"volume": 80}),
            });
            h.push_tool_result(t0, &call, "{\"success\":true}".into());
            let sentences = (0..6).map(|_| ("s".repeat(200), None)).collect();
            h.set_assistant_sentences(t0, reply, sentences);
            h.assistant(t0, reply).delivery = DeliveryStatus::Complete;
        }
    }

    #[test]
    fn full_history_stays_well_under_256_kb() {
        let limit = crate::DEFAULT_MAX_HISTORY_MESSAGES;
        let mut h = History::with_limit(limit);
        fill_long(&mut h, 60);
        assert_eq!(h.messages().len(), limit);
        let full = held_bytes(&h);
        fill_long(&mut h, 240);
        // Memory does not grow once full; the drops are counted.
        assert_eq!(h.messages().len(), limit);
        assert_eq!(h.dropped(), 600 - limit as u64);
        let bytes = held_bytes(&h);
        assert!(bytes <= full + full / 10, "{full} -> {bytes}");
        assert!(bytes < 256 * 1024 * 9 / 10, "{bytes} bytes");
        eprintln!("full history of long messages: {bytes} bytes");
    }

    #[test]
    fn finished_messages_hold_no_spare_capacity() {
        let t0 = Instant::now();
        let mut h = History::with_limit(10);
        let mut grown = String::with_capacity(4096);
        grown.push_str("What will the weather be like tomorrow?");
        h.push_user_text(t0, TurnId(1), grown.clone());
        let reply = h.assistant(t0, TurnId(2));
        reply.content.reserve(16);
        h.set_assistant_sentences(t0, TurnId(2), vec![(grown, None)]);
        // Still in progress: left alone (its text may still grow).
        assert!(h.messages()[1].content.capacity() >= 16);
        let reply = h.assistant(t0, TurnId(2));
        reply.delivery = DeliveryStatus::Complete;
        reply.compact();
        for m in h.messages() {
            assert_eq!(m.content.capacity(), m.content.len());
            for c in &m.content {
                let Content::Text { text, .. } = c else {
                    panic!("{c:?}")
                };
                assert_eq!(text.capacity(), text.len());
            }
        }
    }

    #[test]
    fn dropping_keeps_the_reply_in_progress_and_unlimited_keeps_all() {
        let t0 = Instant::now();
        let mut h = History::with_limit(2);
        h.assistant(t0, TurnId(1));
        h.push_user_text(t0, TurnId(2), "a".into());
        h.push_user_text(t0, TurnId(3), "b".into());
        h.push_user_text(t0, TurnId(4), "c".into());
        let turns: Vec<_> = h.messages().iter().map(|m| m.turn).collect();
        assert_eq!(turns, [Some(TurnId(1)), Some(TurnId(4))]);
        assert_eq!(h.dropped(), 2);
        let mut all = History::with_limit(0);
        fill_long(&mut all, 20);
        assert_eq!((all.messages().len(), all.dropped()), (40, 0));
    }
}
