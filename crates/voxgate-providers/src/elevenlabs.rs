//! ElevenLabs streaming synthesis over HTTP, used with a realtime client's own key and voice.

use std::sync::Arc;

use serde_json::json;

use crate::error::ProviderError;
use crate::http::{self, HttpSettings};
use crate::openai_audio::{AudioDecoder, audio_stream};
use crate::types::TtsRequest;
use crate::{Tts, TtsStream};

/// ElevenLabs regional API host, mirroring the realtime protocol's `ElevenLabsLocation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ElevenLabsLocation {
    /// United States: the default production host `https://api.elevenlabs.io` (ElevenLabs also
    /// lists the US-pinned `https://api.us.elevenlabs.io`; set
    /// [`ElevenLabsConfig::base_url`] to use it).
    #[default]
    Us,
    /// European Union data residency: `https://api.eu.residency.elevenlabs.io`.
    Eu,
    /// India data residency: `https://api.in.residency.elevenlabs.io`.
    India,
}

impl ElevenLabsLocation {
    /// The API root of this location (hosts as listed in ElevenLabs' API reference).
    #[must_use]
    pub fn base_url(self) -> &'static str {
        match self {
            Self::Us => "https://api.elevenlabs.io",
            Self::Eu => "https://api.eu.residency.elevenlabs.io",
            Self::India => "https://api.in.residency.elevenlabs.io",
        }
    }
}

/// Voice fine-tuning, as in the realtime protocol's `ElevenLabsVoiceSettings`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VoiceSettings {
    /// Voice stability (0.0 to 1.0).
    pub stability: f64,
    /// How closely to match the original voice (0.0 to 1.0).
    pub similarity_boost: f64,
    /// Style exaggeration (0.0 to 1.0).
    pub style: f64,
    /// Whether to apply speaker boost.
    pub use_speaker_boost: bool,
    /// Speaking speed; 1.0 is normal.
    pub speed: f64,
}

/// Configuration of [`ElevenLabsTts`].
#[derive(Debug, Clone, PartialEq)]
pub struct ElevenLabsConfig {
    /// The account's API key, sent as `xi-api-key`.
    pub api_key: String,
    /// Voice used when a request names none.
    pub voice_id: String,
    /// Model (`eleven_flash_v2_5`...); the service default when `None`.
    pub model_id: Option<String>,
    /// Voice fine-tuning; the voice's stored settings when `None`.
    pub voice_settings: Option<VoiceSettings>,
    /// Regional host.
    pub location: ElevenLabsLocation,
    /// Overrides the location's host (a proxy, a test server).
    pub base_url: Option<String>,
    /// Output rate: 8000, 16000, 22050, 24000 or 44100 (`output_format=pcm_<rate>`).
    pub sample_rate: u32,
    /// Timeouts and retries.
    pub http: HttpSettings,
}

impl ElevenLabsConfig {
    /// A configuration for 16 kHz output from the US host.
    pub fn new(api_key: impl Into<String>, voice_id: impl Into<String>) -> Self {
        Self {
            api_key: api_key.into(),
            voice_id: voice_id.into(),
            model_id: None,
            voice_settings: None,
            location: ElevenLabsLocation::Us,
            base_url: None,
            sample_rate: 16_000,
            http: HttpSettings::default(),
        }
    }
}

/// Synthesis through `POST {host}/v1/text-to-speech/{voice_id}/stream?output_format=pcm_<rate>`
/// with headerless 16-bit PCM streamed back.
#[derive(Debug, Clone)]
pub struct ElevenLabsTts {
    config: Arc<ElevenLabsConfig>,
    base: String,
    client: reqwest::Client,
}

const RATES: [u32; 5] = [8_000, 16_000, 22_050, 24_000, 44_100];

fn valid_voice(id: &str) -> bool {
    !id.is_empty()
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

impl ElevenLabsTts {
    /// Checks the configuration and builds the HTTP client.
    ///
    /// # Errors
    /// [`ProviderError::Config`] for an empty key, a voice id that is not a plain identifier,
    /// an unsupported rate or an unusable base URL.
    pub fn new(config: ElevenLabsConfig) -> Result<Self, ProviderError> {
        if config.api_key.is_empty() {
            return Err(ProviderError::Config("empty ElevenLabs API key".into()));
        }
        if !valid_voice(&config.voice_id) {
            return Err(ProviderError::Config(format!(
                "ElevenLabs voice id {:?} is not an identifier",
                config.voice_id
            )));
        }
        if !RATES.contains(&config.sample_rate) {
            return Err(ProviderError::Config(format!(
                "ElevenLabs has no PCM output at {} Hz",
                config.sample_rate
            )));
        }
        let base = config
            .base_url
            .as_deref()
            .unwrap_or(config.location.base_url());
        Ok(Self {
            base: http::check_base_url(base)?,
            client: http::build_client(&config.http)?,
            config: Arc::new(config),
        })
    }

    /// The request URL for `voice_id`.
    fn url(&self, voice_id: &str) -> String {
        format!(
            "{}/v1/text-to-speech/{voice_id}/stream?output_format=pcm_{}",
            self.base, self.config.sample_rate
        )
    }
}

impl Tts for ElevenLabsTts {
    fn synthesize(&self, request: TtsRequest) -> TtsStream {
        if request.text.trim().is_empty() {
            return Box::pin(futures::stream::empty());
        }
        let voice = request
            .voice
            .unwrap_or_else(|| self.config.voice_id.clone());
        if !valid_voice(&voice) {
            let err = ProviderError::Config(format!("voice id {voice:?} is not an identifier"));
            return Box::pin(futures::stream::iter([Err(err)]));
        }
        let cfg = Arc::clone(&self.config);
        let mut body = json!({"text": request.text});
        if let Some(obj) = body.as_object_mut() {
            if let Some(model) = &cfg.model_id {
                obj.insert("model_id".into(), json!(model));
            }
            if let Some(s) = cfg.voice_settings {
                obj.insert(
                    "voice_settings".into(),
                    json!({
                        "stability": s.stability,
                        "similarity_boost": s.similarity_boost,
                        "style": s.style,
                        "use_speaker_boost": s.use_speaker_boost,
                        "speed": s.speed,
                    }),
                );
            }
        }
        let url = self.url(&voice);
        let client = self.client.clone();
        let make = move || {
            client
                .post(&url)
                .header("xi-api-key", &cfg.api_key)
                .header(reqwest::header::ACCEPT, "audio/pcm")
                .json(&body)
        };
        audio_stream(
            self.config.http.clone(),
            make,
            AudioDecoder::pcm(self.config.sample_rate),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regional_hosts_and_urls() {
        let mut cfg = ElevenLabsConfig::new("k", "voice_1");
        cfg.location = ElevenLabsLocation::Eu;
        cfg.sample_rate = 24_000;
        let tts = ElevenLabsTts::new(cfg).unwrap();
        assert_eq!(
            tts.url("abc"),
            "https://api.eu.residency.elevenlabs.io/v1/text-to-speech/abc/stream?output_format=pcm_24000"
        );
        assert_eq!(
            ElevenLabsLocation::India.base_url(),
            "https://api.in.residency.elevenlabs.io"
        );
    }

    #[test]
    fn bad_configurations_are_refused() {
        assert!(ElevenLabsTts::new(ElevenLabsConfig::new("", "v")).is_err());
        assert!(ElevenLabsTts::new(ElevenLabsConfig::new("k", "../x")).is_err());
        let mut cfg = ElevenLabsConfig::new("k", "v");
        cfg.sample_rate = 12_345;
        assert!(ElevenLabsTts::new(cfg).is_err());
    }
}
