//! LLM, ASR and TTS back ends behind async traits: OpenAI-compatible APIs, ElevenLabs, a local
//! command TTS, and offline embedded defaults.
//!
//! The server holds providers as trait objects (`Arc<dyn Llm>`, `Arc<dyn Asr>`,
//! `Arc<dyn Tts>`) and connects them to the pure conversation engine's requests:
//!
//! | trait | input | output |
//! |-------|-------|--------|
//! | [`Llm`] | [`LlmRequest`] (history, tools, intent) | [`LlmStream`] of [`LlmEvent`] |
//! | [`Asr`] | [`Utterance`] (16 kHz mono PCM, language hint) | [`Transcript`] |
//! | [`Tts`] | [`TtsRequest`] (one sentence) | [`TtsStream`] of [`PcmChunk`] |
//!
//! Streams are `'static` and own everything they need, so they can be moved into a task;
//! dropping one cancels the work (closes the HTTP connection, kills the child process).
//! Failures never panic and never hang: every HTTP provider bounds the connection, the wait for
//! the first byte and each silence between chunks ([`HttpSettings`]), retries with backoff only
//! before the first byte, and reports what went wrong as a typed [`ProviderError`] (as the last
//! [`LlmEvent::Error`] or `Err` item of a stream).
//!
//! Implementations:
//! * [`OpenAiChat`]: OpenAI-compatible chat completions with SSE streaming and tool calls
//!   (OpenAI, Ollama, vLLM, llama.cpp server).
//! * [`OpenAiTranscription`] and [`OpenAiSpeech`]: `/audio/transcriptions` and
//!   `/audio/speech`.
//! * [`ElevenLabsTts`]: ElevenLabs streaming synthesis with the client's key and voice.
//! * [`CommandTts`]: a local program (by default `espeak-ng --stdout`) that writes WAV.
//! * [`AcpAgent`]: an Agent Client Protocol agent process as the brain ([`acp`]).
//! * Embedded defaults, no configuration and no network: [`DemoAgent`], [`NoAsr`], and
//!   [`embedded_tts`] (`espeak-ng` when installed, else the placeholder [`ToneTts`]).
//!
//! # Example
//! ```
//! use futures::StreamExt;
//! use voxgate_providers::{ChatMessage, DemoAgent, Llm, LlmEvent, LlmRequest};
//!
//! let agent: std::sync::Arc<dyn Llm> = std::sync::Arc::new(DemoAgent::new());
//! let request = LlmRequest {
//!     messages: vec![ChatMessage::user("hello there")],
//!     ..LlmRequest::default()
//! };
//! let events: Vec<LlmEvent> = futures::executor::block_on(agent.generate(request).collect());
//! let text: String = events
//!     .iter()
//!     .filter_map(|e| match e {
//!         LlmEvent::TextDelta(t) => Some(t.as_str()),
//!         _ => None,
//!     })
//!     .collect();
//! assert_eq!(text, "😊 You said: hello there");
//! assert!(matches!(events.last(), Some(LlmEvent::Done { .. })));
//! ```

use std::pin::Pin;

use futures::Stream;

pub mod acp;
mod command;
mod demo;
mod elevenlabs;
mod error;
mod http;
mod openai_audio;
mod openai_chat;
pub mod sse;
mod types;
pub mod wav_stream;

pub use acp::{AcpAgent, AcpConfig, AcpConversation, AcpPermissions, default_max_agent_processes};
pub use command::{
    CommandTts, CommandTtsConfig, ProcessPool, default_max_processes, embedded_tts,
    embedded_tts_in, embedded_tts_name,
};
pub use demo::{DemoAgent, NoAsr, ToneTts, no_asr_marker, parse_no_asr_marker};
pub use elevenlabs::{ElevenLabsConfig, ElevenLabsLocation, ElevenLabsTts, VoiceSettings};
pub use error::{ProviderError, TimeoutPhase};
pub use http::{DEFAULT_MAX_IDLE_CONNECTIONS, HttpSettings};
pub use openai_audio::{
    OpenAiSpeech, OpenAiSpeechConfig, OpenAiTranscription, OpenAiTranscriptionConfig, SpeechFormat,
};
pub use openai_chat::{OpenAiChat, OpenAiChatConfig};
pub use types::{
    ChatMessage, FinishReason, Intent, LlmEvent, LlmRequest, PcmChunk, Role, ToolCall,
    ToolDefinition, Transcript, TtsRequest, TtsResult, Usage, Utterance,
};

/// A generation in progress; see [`LlmEvent`] for the order of items.
pub type LlmStream = Pin<Box<dyn Stream<Item = LlmEvent> + Send + 'static>>;

/// Synthesized audio in progress: PCM chunks, and at most one `Err` as the last item.
pub type TtsStream = Pin<Box<dyn Stream<Item = TtsResult> + Send + 'static>>;

/// A language model that streams text and tool calls.
pub trait Llm: Send + Sync {
    /// Starts a generation. Nothing happens until the stream is polled; dropping it cancels.
    fn generate(&self, request: LlmRequest) -> LlmStream;

    /// A handle for one conversation. Stateless models (the default, `None`) are shared by
    /// every conversation; stateful back ends that keep the history themselves (an ACP agent)
    /// return a fresh handle, and the server uses it for all requests of that conversation.
    fn for_conversation(&self) -> Option<std::sync::Arc<dyn Llm>> {
        None
    }

    /// For a conversation handle ([`Llm::for_conversation`]) of a back end that runs a process
    /// per conversation (an ACP agent): makes sure the next turn has a process, so a caller
    /// can refuse a request at once instead of failing its turn later. A handle whose process
    /// is not running takes its place among the back end's processes now and calls `hold`
    /// for whatever the caller counts processes with (an admission permit); both are kept
    /// until the process ends (it idles out, exits, or goes with the handle). Back ends
    /// without processes have nothing to reserve: `Ok`, and `hold` is not called.
    ///
    /// # Errors
    /// [`ProviderError::Busy`] when every process place is taken; `hold`'s error as it is.
    fn reserve_process(
        &self,
        hold: &mut dyn FnMut() -> Result<ProcessHold, ProviderError>,
    ) -> Result<(), ProviderError> {
        let _ = hold;
        Ok(())
    }
}

/// What a caller keeps with a conversation's back-end process for as long as the process
/// runs (an admission permit, say); see [`Llm::reserve_process`].
pub type ProcessHold = Box<dyn std::any::Any + Send>;

/// A speech recognizer for whole utterances.
#[async_trait::async_trait]
pub trait Asr: Send + Sync {
    /// Transcribes one utterance.
    ///
    /// # Errors
    /// A [`ProviderError`] saying who is to blame.
    async fn transcribe(&self, utterance: Utterance) -> Result<Transcript, ProviderError>;
}

/// A speech synthesizer.
pub trait Tts: Send + Sync {
    /// Starts synthesizing `request`. Nothing happens until the stream is polled; dropping it
    /// cancels.
    fn synthesize(&self, request: TtsRequest) -> TtsStream;
}

/// Pure parsers otherwise private, for the fuzz targets in `fuzz/`; not a stable API.
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::openai_chat::ChunkDecoder;
}
