//! Maxima for every size a client chooses.
//!
//! A client sets buffer sizes (the VAD windows, the input sample rate) and sends text and tool
//! lists the server keeps for the whole session. Each is bounded here so that no request makes a
//! server allocate more than a known amount: beyond a maximum the configuration is refused with
//! `ERROR_CONFIGURATION` (session configuration) or `ERROR_PROTOCOL` (other messages), never
//! served with a large allocation. Every frame is also bounded by the server's own frame limit.
//!
//! The maxima are far above what the published clients send: `deepslate-core`'s defaults are a
//! 150 ms start, a 390 ms stop and a 1 s backbuffer, with a 16 or 24 kHz input line.
//!
//! | what | maximum | refused as |
//! |---|---|---|
//! | input/output `sample_rate` | [`MAX_SAMPLE_RATE`] (192 kHz) | `ERROR_CONFIGURATION` |
//! | VAD `start_duration` | [`MAX_VAD_START_DURATION`] (2 s) | `ERROR_CONFIGURATION` |
//! | VAD `stop_duration` | [`MAX_VAD_STOP_DURATION`] (10 s) | `ERROR_CONFIGURATION` |
//! | VAD `backbuffer_duration` | [`MAX_VAD_BACKBUFFER_DURATION`] (3 s) | `ERROR_CONFIGURATION` |
//! | `system_prompt` | [`MAX_SYSTEM_PROMPT_BYTES`] (128 KiB) | `ERROR_CONFIGURATION` |
//! | `experiments` entries | [`MAX_EXPERIMENTS`] (64) | `ERROR_CONFIGURATION` |
//! | `UserInput.text_data`, `DirectSpeech.text` | [`MAX_TEXT_BYTES`] (64 KiB) | `ERROR_PROTOCOL` |
//! | `TriggerInference.extra_instructions`, `ConversationQuery` prompt and instructions | [`MAX_INSTRUCTIONS_BYTES`] (128 KiB) | `ERROR_PROTOCOL` |
//! | tool definitions per update | [`MAX_TOOLS`] (128) | `ERROR_PROTOCOL` |
//! | tool `name` | [`MAX_TOOL_NAME_BYTES`] (128 bytes) | `ERROR_PROTOCOL` |
//! | tool `description` | [`MAX_TOOL_DESCRIPTION_BYTES`] (16 KiB) | `ERROR_PROTOCOL` |
//! | tool `parameters` (as compact JSON) | [`MAX_TOOL_SCHEMA_BYTES`] (64 KiB) | `ERROR_PROTOCOL` |
//!
//! With these, the VAD's history (the backbuffer plus the start window, as 16-bit samples) is
//! at most about 5 s * 192 kHz * 2 bytes, under 2 MB, where the old one-hour window allowed
//! gigabytes.

use std::time::Duration;

/// Highest input or output sample rate, in Hz (the same as
/// [`AudioFormat::MAX_SAMPLE_RATE`](crate::AudioFormat::MAX_SAMPLE_RATE)).
pub const MAX_SAMPLE_RATE: u32 = 192_000;

/// Longest VAD `start_duration`: speech needed before the user counts as speaking. It sizes the
/// VAD's history; a start window of seconds would make the agent deaf to short answers anyway.
pub const MAX_VAD_START_DURATION: Duration = Duration::from_secs(2);

/// Longest VAD `stop_duration`: silence needed before the user counts as done. It sizes no
/// buffer, so it is generous (dictation-style pauses), but an end of turn minutes later is a
/// mistake.
pub const MAX_VAD_STOP_DURATION: Duration = Duration::from_secs(10);

/// Longest VAD `backbuffer_duration`: audio kept from before the detected start of speech. It
/// sizes the VAD's history, the largest per-session buffer.
pub const MAX_VAD_BACKBUFFER_DURATION: Duration = Duration::from_secs(3);

/// Longest system prompt, in UTF-8 bytes. It is kept for the session and sent with every
/// model request.
pub const MAX_SYSTEM_PROMPT_BYTES: usize = 128 * 1024;

/// Most entries in `experiments`.
pub const MAX_EXPERIMENTS: usize = 64;

/// Longest user text (`UserInput.text_data`) or direct speech (`DirectSpeech.text`), in UTF-8
/// bytes: each becomes a history entry kept for the session.
pub const MAX_TEXT_BYTES: usize = 64 * 1024;

/// Longest per-request instructions (`TriggerInference.extra_instructions`,
/// `ConversationQuery.prompt` and `.instructions`), in UTF-8 bytes.
pub const MAX_INSTRUCTIONS_BYTES: usize = 128 * 1024;

/// Most tool definitions in one `UpdateToolDefinitionsRequest`.
pub const MAX_TOOLS: usize = 128;

/// Longest tool name, in UTF-8 bytes.
pub const MAX_TOOL_NAME_BYTES: usize = 128;

/// Longest tool description, in UTF-8 bytes.
pub const MAX_TOOL_DESCRIPTION_BYTES: usize = 16 * 1024;

/// Largest tool parameter schema, in bytes of its compact JSON.
pub const MAX_TOOL_SCHEMA_BYTES: usize = 64 * 1024;
