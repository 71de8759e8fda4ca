//! Content, parts, blobs, tool calls and model output: the shapes shared by the bridge and the
//! upstream Live API (the bridge forwards them verbatim).
//!
//! Every field accepts its camelCase and snake_case spelling and `null`; output uses camelCase
//! and omits empty fields.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::audio::{self, DecodedAudio};
use crate::de;
use crate::error::AudioError;

/// Inline bytes with their mime type: audio, images, video frames.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Blob {
    /// `audio/pcm;rate=16000`, `image/jpeg`...
    #[serde(alias = "mime_type", default, deserialize_with = "de::null_default")]
    pub mime_type: String,
    /// Base64 of the bytes.
    #[serde(default, deserialize_with = "de::null_default")]
    pub data: String,
}

impl Blob {
    /// A blob of 16-bit PCM at `sample_rate`, base64-encoded from `samples`.
    pub fn pcm(samples: &[i16], sample_rate: u32) -> Self {
        let mut data = String::new();
        audio::encode_pcm_base64(samples, &mut data);
        Self {
            mime_type: format!("audio/pcm;rate={sample_rate}"),
            data,
        }
    }

    /// True for `audio/*` mime types.
    pub fn is_audio(&self) -> bool {
        self.mime_type
            .get(..6)
            .is_some_and(|p| p.eq_ignore_ascii_case("audio/"))
    }

    /// Decodes this blob's audio into `out` (see [`audio::decode_audio_into`]).
    pub fn decode_pcm_into(&self, out: &mut [i16]) -> Result<DecodedAudio, AudioError> {
        audio::decode_audio_into(&self.data, &self.mime_type, out)
    }

    /// Decodes this blob's audio, appending to `out` (see [`audio::decode_audio`]).
    pub fn decode_pcm(&self, out: &mut Vec<i16>) -> Result<DecodedAudio, AudioError> {
        audio::decode_audio(&self.data, &self.mime_type, out)
    }
}

/// A reference to stored data (`fileData`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileData {
    /// Mime type of the file.
    #[serde(
        alias = "mime_type",
        default,
        deserialize_with = "de::null_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub mime_type: String,
    /// Where the file is.
    #[serde(alias = "file_uri", default, deserialize_with = "de::null_default")]
    pub file_uri: String,
}

/// The model asks for a function to be run.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FunctionCall {
    /// Call id, echoed in the response (the Live API always sets it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Function name.
    #[serde(default, deserialize_with = "de::null_default")]
    pub name: String,
    /// Arguments as a JSON object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Value>,
}

/// The result of a function call.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FunctionResponse {
    /// The id of the [`FunctionCall`] answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Function name.
    #[serde(default, deserialize_with = "de::null_default")]
    pub name: String,
    /// The result, a JSON object (upstream refuses anything else).
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub response: Value,
    /// For NON_BLOCKING functions: more responses for this call follow.
    #[serde(
        alias = "will_continue",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub will_continue: Option<bool>,
    /// For NON_BLOCKING functions: how the model treats the result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling: Option<Scheduling>,
}

de::string_enum! {
    /// How the model schedules a NON_BLOCKING function's result.
    Scheduling {
        /// Add to context without interrupting or prompting a reply.
        Silent = "SILENT",
        /// Reply once the model is idle.
        WhenIdle = "WHEN_IDLE",
        /// Interrupt the current output and reply now.
        Interrupt = "INTERRUPT",
    }
}

/// One piece of a [`Content`]. Known kinds are typed; rarer ones are kept as JSON.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Part {
    /// Text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Inline bytes (model audio is `audio/pcm;rate=24000`).
    #[serde(
        alias = "inline_data",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub inline_data: Option<Blob>,
    /// A function call from the model.
    #[serde(
        alias = "function_call",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub function_call: Option<FunctionCall>,
    /// A function result.
    #[serde(
        alias = "function_response",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub function_response: Option<FunctionResponse>,
    /// Stored file reference.
    #[serde(alias = "file_data", default, skip_serializing_if = "Option::is_none")]
    pub file_data: Option<FileData>,
    /// Code the model wrote (code execution tool), kept as JSON.
    #[serde(
        alias = "executable_code",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub executable_code: Option<Value>,
    /// Output of that code, kept as JSON.
    #[serde(
        alias = "code_execution_result",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub code_execution_result: Option<Value>,
    /// The part is the model's reasoning, not its answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thought: Option<bool>,
    /// Opaque signature of the model's reasoning, to send back unchanged.
    #[serde(
        alias = "thought_signature",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub thought_signature: Option<String>,
    /// Video clipping metadata, kept as JSON.
    #[serde(
        alias = "video_metadata",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub video_metadata: Option<Value>,
}

impl Part {
    /// A text part.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            text: Some(text.into()),
            ..Self::default()
        }
    }

    /// An inline-data part.
    pub fn inline(blob: Blob) -> Self {
        Self {
            inline_data: Some(blob),
            ..Self::default()
        }
    }
}

/// A turn: a role and its parts.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Content {
    /// `user`, `model`, `function`... (absent in system instructions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// The parts, in order.
    #[serde(
        default,
        deserialize_with = "de::vec_skip_nulls",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub parts: Vec<Part>,
}

impl Content {
    /// A content of text parts (used for system instructions).
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            role: None,
            parts: vec![Part::text(text)],
        }
    }

    /// The concatenated text of all text parts.
    pub fn joined_text(&self) -> String {
        self.parts
            .iter()
            .filter_map(|p| p.text.as_deref())
            .collect()
    }
}

/// A transcription of input or output audio.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Transcription {
    /// Transcribed text (incremental).
    #[serde(default, deserialize_with = "de::null_default")]
    pub text: String,
    /// The transcription of this stretch of audio is final.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished: Option<bool>,
}

/// Incremental model output: `serverContent` upstream, the payload of `CONTENT_MESSAGE` on the
/// bridge.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerContent {
    /// What the model produced (text, audio as `inlineData`).
    #[serde(alias = "model_turn", default, skip_serializing_if = "Option::is_none")]
    pub model_turn: Option<Content>,
    /// The model finished its turn.
    #[serde(
        alias = "turn_complete",
        default,
        deserialize_with = "de::null_default",
        skip_serializing_if = "de::is_false"
    )]
    pub turn_complete: bool,
    /// Client input interrupted the model; stop playback.
    #[serde(
        default,
        deserialize_with = "de::null_default",
        skip_serializing_if = "de::is_false"
    )]
    pub interrupted: bool,
    /// The model finished generating (playback may still be running).
    #[serde(
        alias = "generation_complete",
        default,
        deserialize_with = "de::null_default",
        skip_serializing_if = "de::is_false"
    )]
    pub generation_complete: bool,
    /// Transcript of the user's audio.
    #[serde(
        alias = "input_transcription",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub input_transcription: Option<Transcription>,
    /// Transcript of the model's audio.
    #[serde(
        alias = "output_transcription",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub output_transcription: Option<Transcription>,
    /// Search grounding (clients render `searchEntryPoint.renderedContent` as a chip).
    #[serde(
        alias = "grounding_metadata",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub grounding_metadata: Option<Value>,
    /// URL context tool metadata.
    #[serde(
        alias = "url_context_metadata",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub url_context_metadata: Option<Value>,
    /// Why the turn completed (`NEED_MORE_INPUT`...).
    #[serde(
        alias = "turn_complete_reason",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub turn_complete_reason: Option<String>,
    /// The model waits for more input before replying.
    #[serde(
        alias = "waiting_for_input",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub waiting_for_input: Option<bool>,
    /// Token usage, where a bridge put it inside the content (the seed shows it here).
    #[serde(
        alias = "usage_metadata",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub usage_metadata: Option<UsageMetadata>,
}

impl ServerContent {
    /// Iterates over the audio blobs of the model turn.
    pub fn audio(&self) -> impl Iterator<Item = &Blob> {
        self.model_turn
            .iter()
            .flat_map(|c| c.parts.iter())
            .filter_map(|p| p.inline_data.as_ref())
            .filter(|b| b.is_audio())
    }

    /// The model turn's text parts, concatenated.
    pub fn text(&self) -> String {
        self.model_turn
            .as_ref()
            .map(Content::joined_text)
            .unwrap_or_default()
    }
}

/// The model asks for functions to be run (`toolCall`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCall {
    /// The calls; answer each by id.
    #[serde(
        alias = "function_calls",
        default,
        deserialize_with = "de::vec_skip_nulls"
    )]
    pub function_calls: Vec<FunctionCall>,
}

/// Pending calls the model no longer wants (its turn was interrupted).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ToolCallCancellation {
    /// Ids of the cancelled calls.
    #[serde(default, deserialize_with = "de::vec_skip_nulls")]
    pub ids: Vec<String>,
}

/// Function results sent back to the model (`toolResponse`), in the flat form.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolResponse {
    /// One per answered call.
    #[serde(
        alias = "function_responses",
        default,
        deserialize_with = "de::vec_skip_nulls"
    )]
    pub function_responses: Vec<FunctionResponse>,
}

/// Token counts for one modality.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModalityTokenCount {
    /// `TEXT`, `AUDIO`...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modality: Option<String>,
    /// Tokens.
    #[serde(
        alias = "token_count",
        default,
        deserialize_with = "de::opt_u64",
        skip_serializing_if = "Option::is_none"
    )]
    pub token_count: Option<u64>,
}

/// Token usage of the session so far (`usageMetadata`). Counts accept numbers or strings.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageMetadata {
    /// Prompt tokens.
    #[serde(
        alias = "prompt_token_count",
        default,
        deserialize_with = "de::opt_u64",
        skip_serializing_if = "Option::is_none"
    )]
    pub prompt_token_count: Option<u64>,
    /// Tokens served from the cache.
    #[serde(
        alias = "cached_content_token_count",
        default,
        deserialize_with = "de::opt_u64",
        skip_serializing_if = "Option::is_none"
    )]
    pub cached_content_token_count: Option<u64>,
    /// Response tokens.
    #[serde(
        alias = "response_token_count",
        default,
        deserialize_with = "de::opt_u64",
        skip_serializing_if = "Option::is_none"
    )]
    pub response_token_count: Option<u64>,
    /// Tokens of tool-use prompts.
    #[serde(
        alias = "tool_use_prompt_token_count",
        default,
        deserialize_with = "de::opt_u64",
        skip_serializing_if = "Option::is_none"
    )]
    pub tool_use_prompt_token_count: Option<u64>,
    /// Thinking tokens.
    #[serde(
        alias = "thoughts_token_count",
        default,
        deserialize_with = "de::opt_u64",
        skip_serializing_if = "Option::is_none"
    )]
    pub thoughts_token_count: Option<u64>,
    /// All tokens.
    #[serde(
        alias = "total_token_count",
        default,
        deserialize_with = "de::opt_u64",
        skip_serializing_if = "Option::is_none"
    )]
    pub total_token_count: Option<u64>,
    /// Prompt tokens per modality.
    #[serde(
        alias = "prompt_tokens_details",
        default,
        deserialize_with = "de::vec_skip_nulls",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub prompt_tokens_details: Vec<ModalityTokenCount>,
    /// Cached tokens per modality.
    #[serde(
        alias = "cache_tokens_details",
        default,
        deserialize_with = "de::vec_skip_nulls",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub cache_tokens_details: Vec<ModalityTokenCount>,
    /// Response tokens per modality.
    #[serde(
        alias = "response_tokens_details",
        default,
        deserialize_with = "de::vec_skip_nulls",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub response_tokens_details: Vec<ModalityTokenCount>,
    /// Tool-use prompt tokens per modality.
    #[serde(
        alias = "tool_use_prompt_tokens_details",
        default,
        deserialize_with = "de::vec_skip_nulls",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub tool_use_prompt_tokens_details: Vec<ModalityTokenCount>,
}

/// Keys of a JSON object this version does not model, kept so they pass through unchanged.
pub type Extra = Map<String, Value>;

/// Streamed input: audio, a video frame, text, or activity markers (`realtimeInput` upstream,
/// the payload of `SEND_REALTIME_INPUT` on the bridge).
///
/// The deprecated `mediaChunks` (or `chunks`) list is accepted on input: like the original
/// bridge documents, only its first chunk is used, as `audio` or `video` by its mime type.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", from = "RawRealtimeInput")]
pub struct RealtimeInput {
    /// Audio (`audio/pcm;rate=16000` s16le mono unless the mime type says otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audio: Option<Blob>,
    /// A video frame (`image/jpeg`...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub video: Option<Blob>,
    /// Text typed or produced by a UI.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The user started speaking (with client-side voice-activity detection).
    #[serde(
        skip_serializing_if = "de::is_false",
        serialize_with = "de::ser_presence"
    )]
    pub activity_start: bool,
    /// The user stopped speaking (with client-side voice-activity detection).
    #[serde(
        skip_serializing_if = "de::is_false",
        serialize_with = "de::ser_presence"
    )]
    pub activity_end: bool,
    /// The audio stream paused (the microphone was turned off).
    #[serde(skip_serializing_if = "de::is_false")]
    pub audio_stream_end: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawRealtimeInput {
    #[serde(default)]
    audio: Option<Blob>,
    #[serde(default)]
    video: Option<Blob>,
    #[serde(default)]
    text: Option<String>,
    #[serde(alias = "activity_start", default, deserialize_with = "de::presence")]
    activity_start: bool,
    #[serde(alias = "activity_end", default, deserialize_with = "de::presence")]
    activity_end: bool,
    #[serde(
        alias = "audio_stream_end",
        default,
        deserialize_with = "de::null_default"
    )]
    audio_stream_end: bool,
    #[serde(
        alias = "media_chunks",
        default,
        deserialize_with = "de::vec_skip_nulls"
    )]
    media_chunks: Vec<Blob>,
    // A field of its own, not an alias: the Android client sends both as null, and aliases of
    // one field present twice are a duplicate-field error.
    #[serde(default, deserialize_with = "de::vec_skip_nulls")]
    chunks: Vec<Blob>,
}

impl From<RawRealtimeInput> for RealtimeInput {
    fn from(raw: RawRealtimeInput) -> Self {
        let mut out = Self {
            audio: raw.audio,
            video: raw.video,
            text: raw.text,
            activity_start: raw.activity_start,
            activity_end: raw.activity_end,
            audio_stream_end: raw.audio_stream_end,
        };
        let first = raw.media_chunks.into_iter().chain(raw.chunks).next();
        if let Some(first) = first {
            let slot = if first.is_audio() {
                &mut out.audio
            } else {
                &mut out.video
            };
            if slot.is_none() {
                *slot = Some(first);
            }
        }
        out
    }
}
