//! The Gemini bridge JSON protocol and the upstream Gemini Live API messages, tolerant of real
//! clients.
//!
//! A pure codec: no I/O, no async runtime, no clock. Three parts:
//!
//! - [`bridge`]: the `{"type", "payload"}` frames between client apps and a Gemini bridge
//!   server ([`ClientMessage`] in, [`ServerMessage`] out, both directions decode and encode),
//!   with the error texts clients already know as constructors
//!   ([`ServerMessage::invalid_json`], [`ServerMessage::unknown_type`],
//!   [`ServerMessage::not_connected`]).
//! - [`live`]: the upstream Live API messages (`setup`, `clientContent`, `realtimeInput`,
//!   `toolResponse`; `setupComplete`, `serverContent`, `toolCall`, `toolCallCancellation`,
//!   `usageMetadata`, `goAway`, `sessionResumptionUpdate`) for passing a session through, and
//!   [`BridgeForwarder`] / [`ClientMessage::to_live`] to map between the two.
//! - [`audio`]: base64 PCM decoded straight into `i16` samples, rate from the mime type, WAV
//!   headers detected and stripped.
//!
//! Tolerance, because real clients need it: explicit `null` anywhere, camelCase or snake_case
//! keys, integers as strings, `responseModalities` as a string or a list in any letter case,
//! flat or nested ICE candidates and `SETUP_COMPLETE`, the deprecated `chunks`/`mediaChunks`
//! (first chunk used). Unknown message types and enum values are kept as data, never errors.
//! Decoders never panic; errors say who is to blame ([`Blame`]).
//!
//! ```
//! use voxgate_gemini::{ClientMessage, ServerMessage};
//!
//! // An Android client's frame: nulls for every unset field.
//! let frame = r#"{"type":"SEND_REALTIME_INPUT","payload":{"text":null,"video":null,
//!     "audio":{"mimeType":"audio/pcm;rate=16000","data":"AQD/fwCA"}}}"#;
//! let ClientMessage::SendRealtimeInput(input) = ClientMessage::decode(frame)? else {
//!     unreachable!()
//! };
//! let blob = input.audio.expect("audio");
//! let mut pcm = [0i16; 8];
//! let info = blob.decode_pcm_into(&mut pcm)?;
//! assert_eq!(info.sample_rate, Some(16_000));
//! assert_eq!(&pcm[..info.samples], &[1, i16::MAX, i16::MIN]);
//!
//! // Bad input becomes the protocol's own error message.
//! let err = ClientMessage::decode("{not json").unwrap_err();
//! assert_eq!(err.reply(), ServerMessage::invalid_json());
//! assert_eq!(
//!     ServerMessage::invalid_json().encode(),
//!     r#"{"type":"GEMINI_ERROR","payload":{"message":"Invalid JSON message received."}}"#
//! );
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod audio;
pub mod bridge;
mod config;
mod content;
mod de;
mod error;
pub mod live;
mod translate;

pub use bridge::{ClientMessage, ServerMessage};
pub use config::{
    Behavior, FunctionDeclaration, GenerationConfig, LiveConfig, Modality, PrebuiltVoiceConfig,
    SpeechConfig, Tool, VoiceConfig,
};
pub use content::{
    Blob, Content, Extra, FileData, FunctionCall, FunctionResponse, ModalityTokenCount, Part,
    RealtimeInput, Scheduling, ServerContent, ToolCall, ToolCallCancellation, ToolResponse,
    Transcription, UsageMetadata,
};
pub use error::{AudioError, Blame, DecodeError};
pub use live::{LiveClientMessage, LiveServerEvent, LiveServerMessage};
pub use translate::BridgeForwarder;

// The README's example is compiled and run with the doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
