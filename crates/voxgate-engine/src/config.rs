//! Engine settings.

use std::time::Duration;

use crate::emotion::EmojiPolicy;
use voxgate_audio::vad::VadConfig;
use voxgate_mcp::action::ActionConfig;

/// How the client's output audio is counted, so playback reports (`bytes_played`) can be
/// matched to the audio the engine delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputAudio {
    /// Bytes per second of audio in the client's output format (e.g. 48 000 for 24 kHz mono
    /// 16-bit PCM).
    pub bytes_per_second: u32,
}

/// Default [`EngineConfig::max_context_chars`]: 32 000 characters, about 8 000 tokens of
/// English, which fits the context window of any current chat model with room for the tools
/// and the reply, and keeps per-turn LLM cost and latency flat in long sessions.
pub const DEFAULT_MAX_CONTEXT_CHARS: usize = 32_000;

/// Default [`EngineConfig::max_history_messages`]: 100 messages. Measured (the unit test
/// `history::tests::full_history_stays_well_under_256_kb`): long exchanges, a 400-character
/// user turn and a 1,200-character spoken reply of six sentences with a tool call, hold about
/// 1.6 KB per message once their audio is dropped by [`EngineConfig::max_history_audio`], so a
/// full history holds about 160 KB even when every message is that long, and far less with
/// typical voice turns (a sentence or two). Within the default context budget (32 000
/// characters) that still keeps far more exchanges than the model is given.
pub const DEFAULT_MAX_HISTORY_MESSAGES: usize = 100;

/// Default [`EngineConfig::max_sentences_ahead`]: the sentence playing plus two ready behind it.
/// One long reply then runs at most three synthesizer requests at a time and holds a few
/// sentences of audio, where sending every sentence at once started one synthesizer per
/// sentence (1,200 processes for one 60 KB `DirectSpeech`).
pub const DEFAULT_MAX_SENTENCES_AHEAD: usize = 2;

/// Default [`Speculation::after_silence`]: 64 ms, four VAD frames. The gaps between words
/// (stop consonants, breaths) are up to three frames of non-speech in the VAD fixtures
/// (`question.wav` has three of 16 to 32 ms besides its 128 ms pause after "Hello.",
/// `speech.wav` four of 16 to 48 ms): speculating at the first non-speech frame would start
/// (and throw away) a recognition at each of them, for 48 ms of latency saved.
pub const DEFAULT_SPECULATE_AFTER: Duration = Duration::from_millis(64);

/// Speculative (preemptive) generation at a pause in the user's speech, like LiveKit's
/// preemptive generation. Off by default: every pause that does not end the turn costs a
/// recognition, and when the recognizer answers within the pause a generation (and a first
/// sentence's synthesis) too, all thrown away.
///
/// When the VAD has heard [`Speculation::after_silence`] of non-speech inside an utterance
/// (its `SPEECH_ENDING` state, before `vad_stop_ms` ends the utterance), the engine sends the
/// utterance so far for recognition; with its transcript, a generation with the context the
/// turn would get (history plus this user text, nothing committed); with the reply's first
/// sentence, its synthesis. All answers are held back. When the real pipeline then asks for
/// exactly the same work (the same utterance with only non-speech after the snapshot, an
/// identical context and tools, the same sentence) it takes the held answers instead of
/// asking again, so the reply starts as soon as the turn ends. Anything it does not take is
/// cancelled at the provider and never reaches the client or history. The turn ends exactly
/// as without speculation. See `docs/engine.md` ("Speculation") for measured figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Speculation {
    /// Speculate at pauses. Default false.
    pub enabled: bool,
    /// Non-speech the VAD must hear inside an utterance, counted from the start of its first
    /// non-speech frame, before speculation starts; at most one 16 ms frame means at the
    /// VAD's `SPEECH` to `SPEECH_ENDING` transition itself. A value at or beyond the VAD's
    /// stop duration never speculates. Default [`DEFAULT_SPECULATE_AFTER`].
    pub after_silence: Duration,
}

impl Default for Speculation {
    fn default() -> Self {
        Self {
            enabled: false,
            after_silence: DEFAULT_SPECULATE_AFTER,
        }
    }
}

/// Configuration of an [`crate::Engine`]. Plain data: build it with struct update syntax over
/// [`EngineConfig::default`].
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// Turn-taking: endpointing, interruption policy, playback reports.
    pub turn: voxgate_turn::Config,
    /// VAD hysteresis and backbuffer.
    pub vad: VadConfig,
    /// Sample rate of [`crate::Input::Audio`] in Hz. Default 16 000.
    pub input_rate: u32,
    /// Speak replies: `Some` asks TTS for every sentence and delivers audio; `None` delivers
    /// text fragments (realtime sessions without TTS). Default: 24 kHz mono 16-bit.
    pub output_audio: Option<OutputAudio>,
    /// The system prompt, first in every LLM context.
    pub system_prompt: String,
    /// Sampling temperature passed to the LLM.
    pub temperature: Option<f64>,
    /// Read a leading emoji from each reply as its face ([`crate::ClientEvent::Emotion`]) with
    /// this allowlist and default; `None` leaves replies as they are (emoji are still never
    /// spoken).
    pub emotion: Option<EmojiPolicy>,
    /// Longest sentence sent to TTS, in characters; longer runs are cut at a comma or space.
    pub max_sentence_chars: usize,
    /// Sentences of a spoken reply synthesized ahead of the one playing: the next sentence
    /// goes to TTS only while fewer than this many are being synthesized or wait to be heard.
    /// Bounds what one reply costs at a time (synthesizer runs, audio held) however long it
    /// is; 2 keeps the next sentence ready even when TTS is slower than a short sentence
    /// plays. At least 1. Default [`DEFAULT_MAX_SENTENCES_AHEAD`].
    pub max_sentences_ahead: usize,
    /// Emit [`crate::ClientEvent::VadFrame`] for every 16 ms VAD frame.
    pub vad_frame_telemetry: bool,
    /// Longest utterance kept for transcription; audio beyond it is dropped (and counted).
    pub max_utterance: Duration,
    /// Keep each spoken turn's audio in history (`ChatAudioData`).
    pub keep_user_audio: bool,
    /// Most audio history keeps per session, user and reply audio together: beyond it the
    /// oldest audio is dropped (its text and transcription stay), so a long session's memory
    /// stays bounded (about 32 kB per second at 16 kHz, 48 kB at 24 kHz). Default 5 minutes.
    /// Zero keeps no audio at all, not even while a reply is being spoken: for doors that never
    /// export history audio (a device session then holds no reply PCM).
    pub max_history_audio: Duration,
    /// Largest LLM context, in characters (the system prompt, message texts, tool calls'
    /// names and JSON arguments, tool results; tool definitions are not counted). Count about
    /// four characters per token for English, one per token for CJK. When a reply's context
    /// would be larger, the oldest exchanges (a user turn and everything up to the next one)
    /// leave it for good, reported with [`crate::ClientEvent::ContextTruncated`]; the system
    /// prompt and the newest user turn always stay. History keeps every message (dropped ones
    /// carry [`crate::ChatMessage::truncated_at_response_turn`]). 0: unlimited. Default
    /// [`DEFAULT_MAX_CONTEXT_CHARS`].
    pub max_context_chars: usize,
    /// Most history messages kept in memory, so a client can never grow a session's memory
    /// without bound: when a message beyond it is added the oldest finished message is dropped
    /// (the system prompt is configuration, never a history message, so it always stays) and
    /// counted; exports report the count ([`crate::ClientEvent::History`]). Audio has its own
    /// cap ([`EngineConfig::max_history_audio`]), the model's context its own budget
    /// ([`EngineConfig::max_context_chars`]). 0: unlimited. Default
    /// [`DEFAULT_MAX_HISTORY_MESSAGES`].
    pub max_history_messages: usize,
    /// The client's declared actions (VIP §5.3, [`crate::Input::SetActions`]): how long the
    /// client has to answer an invocation (default 10 s) and the fallback sentence said when
    /// an action fails or times out (`{action}` and `{reason}` are replaced).
    pub actions: ActionConfig,
    /// Speculative generation at pauses (off by default, see [`Speculation`]).
    pub speculation: Speculation,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            turn: voxgate_turn::Config::default(),
            vad: VadConfig::default(),
            input_rate: 16_000,
            output_audio: Some(OutputAudio {
                bytes_per_second: 48_000,
            }),
            system_prompt: String::new(),
            temperature: None,
            emotion: None,
            max_sentence_chars: 200,
            max_sentences_ahead: DEFAULT_MAX_SENTENCES_AHEAD,
            vad_frame_telemetry: false,
            max_utterance: Duration::from_secs(60),
            keep_user_audio: true,
            max_history_audio: Duration::from_secs(300),
            max_context_chars: DEFAULT_MAX_CONTEXT_CHARS,
            max_history_messages: DEFAULT_MAX_HISTORY_MESSAGES,
            actions: ActionConfig::default(),
            speculation: Speculation::default(),
        }
    }
}
