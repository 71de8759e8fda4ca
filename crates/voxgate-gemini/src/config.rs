//! The session configuration: `LiveConfig` on the bridge (`CONNECT_GEMINI.initialConfig`,
//! `UPDATE_CONFIG`), which is the upstream `setup` message's body.
//!
//! Keys this version does not model are kept in `extra` maps, so a config passes through to the
//! Live service unchanged (newer options such as `contextWindowCompression` keep working).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::content::{Content, Extra};
use crate::de;

de::string_enum! {
    /// An output modality (`responseModalities`); matched in any letter case.
    Modality {
        /// Text output.
        Text = "TEXT",
        /// Spoken output (24 kHz PCM).
        Audio = "AUDIO",
        /// Image output.
        Image = "IMAGE",
    }
}

de::string_enum! {
    /// Whether the model waits for a function's result (`behavior`).
    Behavior {
        /// The model waits (the default).
        Blocking = "BLOCKING",
        /// The model keeps talking while the function runs.
        NonBlocking = "NON_BLOCKING",
    }
}

/// The session configuration.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LiveConfig {
    /// `models/gemini-2.0-flash-live-001`...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The system prompt.
    #[serde(
        alias = "system_instruction",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub system_instruction: Option<Content>,
    /// Sampling and output settings.
    #[serde(
        alias = "generation_config",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub generation_config: Option<GenerationConfig>,
    /// Tools the model may call.
    #[serde(
        default,
        deserialize_with = "de::vec_skip_nulls",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub tools: Vec<Tool>,
    /// Safety settings, kept as JSON.
    #[serde(
        alias = "safety_settings",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub safety_settings: Option<Value>,
    /// Voice-activity detection wishes (`automaticActivityDetection`...), kept as JSON.
    #[serde(
        alias = "realtime_input_config",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub realtime_input_config: Option<Value>,
    /// Session resumption request (`{handle?, transparent?}`), kept as JSON.
    #[serde(
        alias = "session_resumption",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub session_resumption: Option<Value>,
    /// Ask for transcripts of the user's audio (`{}` enables).
    #[serde(
        alias = "input_audio_transcription",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub input_audio_transcription: Option<Value>,
    /// Ask for transcripts of the model's audio (`{}` enables).
    #[serde(
        alias = "output_audio_transcription",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub output_audio_transcription: Option<Value>,
    /// Keys not modelled here, passed through.
    #[serde(flatten)]
    pub extra: Extra,
}

impl LiveConfig {
    /// True if the config asks for spoken output.
    pub fn wants_audio(&self) -> bool {
        self.generation_config
            .as_ref()
            .and_then(|g| g.response_modalities.as_ref())
            .is_some_and(|m| m.contains(&Modality::Audio))
    }

    /// The prebuilt voice name (`Aoede`...), if one is set.
    pub fn voice_name(&self) -> Option<&str> {
        self.generation_config
            .as_ref()?
            .speech_config
            .as_ref()?
            .voice_config
            .as_ref()?
            .prebuilt_voice_config
            .as_ref()?
            .voice_name
            .as_deref()
    }
}

/// Sampling and output settings.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GenerationConfig {
    /// Sampling temperature.
    #[serde(
        default,
        deserialize_with = "de::opt_f64",
        skip_serializing_if = "Option::is_none"
    )]
    pub temperature: Option<f64>,
    /// Top-k sampling.
    #[serde(
        alias = "top_k",
        default,
        deserialize_with = "de::opt_u32",
        skip_serializing_if = "Option::is_none"
    )]
    pub top_k: Option<u32>,
    /// Nucleus sampling.
    #[serde(
        alias = "top_p",
        default,
        deserialize_with = "de::opt_f64",
        skip_serializing_if = "Option::is_none"
    )]
    pub top_p: Option<f64>,
    /// Output length cap.
    #[serde(
        alias = "max_output_tokens",
        default,
        deserialize_with = "de::opt_u32",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_output_tokens: Option<u32>,
    /// Number of candidates (the Live API allows 1).
    #[serde(
        alias = "candidate_count",
        default,
        deserialize_with = "de::opt_u32",
        skip_serializing_if = "Option::is_none"
    )]
    pub candidate_count: Option<u32>,
    /// Stop sequences.
    #[serde(
        alias = "stop_sequences",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub stop_sequences: Option<Vec<String>>,
    /// Output modalities; a single string is accepted for a list of one.
    #[serde(
        alias = "response_modalities",
        default,
        deserialize_with = "de::opt_one_or_many",
        skip_serializing_if = "Option::is_none"
    )]
    pub response_modalities: Option<Vec<Modality>>,
    /// Voice settings.
    #[serde(
        alias = "speech_config",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub speech_config: Option<SpeechConfig>,
    /// Keys not modelled here, passed through.
    #[serde(flatten)]
    pub extra: Extra,
}

/// Voice settings.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SpeechConfig {
    /// Which voice.
    #[serde(
        alias = "voice_config",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub voice_config: Option<VoiceConfig>,
    /// BCP-47 language of the speech.
    #[serde(
        alias = "language_code",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub language_code: Option<String>,
    /// Keys not modelled here, passed through.
    #[serde(flatten)]
    pub extra: Extra,
}

/// Which voice.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VoiceConfig {
    /// A prebuilt voice.
    #[serde(
        alias = "prebuilt_voice_config",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub prebuilt_voice_config: Option<PrebuiltVoiceConfig>,
    /// Keys not modelled here, passed through.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A prebuilt voice by name.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PrebuiltVoiceConfig {
    /// `Aoede`, `Puck`...
    #[serde(alias = "voice_name", default, skip_serializing_if = "Option::is_none")]
    pub voice_name: Option<String>,
}

/// A tool the model may use.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Tool {
    /// Functions the client implements.
    #[serde(
        alias = "function_declarations",
        default,
        deserialize_with = "de::vec_skip_nulls",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub function_declarations: Vec<FunctionDeclaration>,
    /// Built-in Google Search (`{}` enables).
    #[serde(
        alias = "google_search",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub google_search: Option<Value>,
    /// Built-in code execution (`{}` enables).
    #[serde(
        alias = "code_execution",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub code_execution: Option<Value>,
    /// Keys not modelled here, passed through.
    #[serde(flatten)]
    pub extra: Extra,
}

/// One function the model may call.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FunctionDeclaration {
    /// Function name.
    #[serde(default, deserialize_with = "de::null_default")]
    pub name: String,
    /// What it does, for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// JSON Schema (OpenAPI subset) of the arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    /// Blocking or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub behavior: Option<Behavior>,
    /// Keys not modelled here (`response`, `parametersJsonSchema`...), passed through.
    #[serde(flatten)]
    pub extra: Extra,
}
