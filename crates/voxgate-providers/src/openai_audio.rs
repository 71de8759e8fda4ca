//! OpenAI-compatible `/audio/transcriptions` (recognition) and `/audio/speech` (synthesis), plus
//! the streamed-audio reader shared with the ElevenLabs provider.

use std::sync::Arc;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::json;

use crate::error::ProviderError;
use crate::http::{self, BodyReader, HttpSettings};
use crate::types::{PcmChunk, Transcript, TtsRequest, Utterance};
use crate::wav_stream::WavStreamDecoder;
use crate::{Asr, Tts, TtsStream};

/// Longest transcription response accepted.
const MAX_JSON: usize = 1 << 20;

/// Configuration of [`OpenAiTranscription`].
#[derive(Debug, Clone, PartialEq)]
pub struct OpenAiTranscriptionConfig {
    /// API root including the version, e.g. `https://api.openai.com/v1`.
    pub base_url: String,
    /// Model name (`whisper-1`, `gpt-4o-transcribe`, or the local server's name).
    pub model: String,
    /// Bearer token; local servers usually need none.
    pub api_key: Option<String>,
    /// Timeouts and retries (the first-byte limit covers the recognition itself).
    pub http: HttpSettings,
}

impl OpenAiTranscriptionConfig {
    /// A configuration with default timeouts.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            model: model.into(),
            api_key: None,
            http: HttpSettings::default(),
        }
    }
}

/// Recognition through `POST {base}/audio/transcriptions`: the utterance is uploaded as a
/// 16 kHz mono 16-bit WAV file in a multipart form (`file`, `model`, `language`,
/// `response_format=json`).
#[derive(Debug, Clone)]
pub struct OpenAiTranscription {
    config: Arc<OpenAiTranscriptionConfig>,
    url: String,
    client: reqwest::Client,
}

impl OpenAiTranscription {
    /// Checks the configuration and builds the HTTP client.
    ///
    /// # Errors
    /// [`ProviderError::Config`] for an unusable base URL.
    pub fn new(config: OpenAiTranscriptionConfig) -> Result<Self, ProviderError> {
        let base = http::check_base_url(&config.base_url)?;
        Ok(Self {
            url: format!("{base}/audio/transcriptions"),
            client: http::build_client(&config.http)?,
            config: Arc::new(config),
        })
    }
}

#[derive(Deserialize)]
struct TranscriptionResponse {
    text: String,
    language: Option<String>,
}

#[async_trait]
impl Asr for OpenAiTranscription {
    async fn transcribe(&self, utterance: Utterance) -> Result<Transcript, ProviderError> {
        let Utterance { pcm, language } = utterance;
        // The WAV is built once and shared by every attempt (`Bytes` clones are references), and
        // the PCM is released before the upload: a session otherwise held the utterance three
        // times over (PCM, WAV, the attempt's copy) while the recognizer worked.
        let wav = bytes::Bytes::from(
            voxgate_audio::wav::wav_bytes_i16(Utterance::SAMPLE_RATE, 1, &pcm)
                .map_err(|e| ProviderError::Audio(e.to_string()))?,
        );
        drop(pcm);
        let cfg = &self.config;
        let resp = http::send_with_retries(&cfg.http, || {
            let len = wav.len() as u64;
            let file = reqwest::multipart::Part::stream_with_length(wav.clone(), len)
                .file_name("utterance.wav")
                .mime_str("audio/wav")
                .unwrap_or_else(|_| reqwest::multipart::Part::bytes(Vec::new()));
            let mut form = reqwest::multipart::Form::new()
                .part("file", file)
                .text("model", cfg.model.clone())
                .text("response_format", "json");
            if let Some(lang) = &language {
                form = form.text("language", lang.clone());
            }
            let mut req = self.client.post(&self.url).multipart(form);
            if let Some(key) = &cfg.api_key {
                req = req.bearer_auth(key);
            }
            req
        })
        .await?;
        let body = read_all(BodyReader::new(resp, cfg.http.idle_timeout), MAX_JSON).await?;
        let parsed: TranscriptionResponse = serde_json::from_slice(&body)
            .map_err(|e| ProviderError::Protocol(format!("malformed transcription JSON ({e})")))?;
        Ok(Transcript {
            text: parsed.text.trim().to_owned(),
            language: parsed.language.or(language),
        })
    }
}

async fn read_all(mut reader: BodyReader, limit: usize) -> Result<Vec<u8>, ProviderError> {
    let mut body = Vec::new();
    while let Some(chunk) = reader.next_chunk().await? {
        if body.len() + chunk.len() > limit {
            return Err(ProviderError::Protocol(format!(
                "response larger than {limit} bytes"
            )));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Audio format asked of `/audio/speech`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SpeechFormat {
    /// Headerless 16-bit little-endian mono PCM at the given rate (OpenAI sends 24 kHz).
    Pcm {
        /// The rate the service produces.
        sample_rate: u32,
    },
    /// A WAV stream; the rate is read from its header.
    Wav,
}

/// Configuration of [`OpenAiSpeech`].
#[derive(Debug, Clone, PartialEq)]
pub struct OpenAiSpeechConfig {
    /// API root including the version, e.g. `https://api.openai.com/v1`.
    pub base_url: String,
    /// Model name (`tts-1`, `gpt-4o-mini-tts`, or the local server's name).
    pub model: String,
    /// Voice used when a request names none.
    pub voice: String,
    /// Bearer token; local servers usually need none.
    pub api_key: Option<String>,
    /// `response_format` to request.
    pub format: SpeechFormat,
    /// Speaking speed (0.25 to 4.0); the service default when `None`.
    pub speed: Option<f32>,
    /// Timeouts and retries.
    pub http: HttpSettings,
}

impl OpenAiSpeechConfig {
    /// A configuration asking for 24 kHz PCM, OpenAI's `pcm` format.
    pub fn new(
        base_url: impl Into<String>,
        model: impl Into<String>,
        voice: impl Into<String>,
    ) -> Self {
        Self {
            base_url: base_url.into(),
            model: model.into(),
            voice: voice.into(),
            api_key: None,
            format: SpeechFormat::Pcm {
                sample_rate: 24_000,
            },
            speed: None,
            http: HttpSettings::default(),
        }
    }
}

/// Synthesis through `POST {base}/audio/speech`, streaming the audio as it arrives.
#[derive(Debug, Clone)]
pub struct OpenAiSpeech {
    config: Arc<OpenAiSpeechConfig>,
    url: String,
    client: reqwest::Client,
}

impl OpenAiSpeech {
    /// Checks the configuration and builds the HTTP client.
    ///
    /// # Errors
    /// [`ProviderError::Config`] for an unusable base URL or a zero PCM rate.
    pub fn new(config: OpenAiSpeechConfig) -> Result<Self, ProviderError> {
        let base = http::check_base_url(&config.base_url)?;
        if config.format == (SpeechFormat::Pcm { sample_rate: 0 }) {
            return Err(ProviderError::Config("PCM sample rate 0".into()));
        }
        Ok(Self {
            url: format!("{base}/audio/speech"),
            client: http::build_client(&config.http)?,
            config: Arc::new(config),
        })
    }
}

impl Tts for OpenAiSpeech {
    fn synthesize(&self, request: TtsRequest) -> TtsStream {
        if request.text.trim().is_empty() {
            return Box::pin(futures::stream::empty());
        }
        let cfg = Arc::clone(&self.config);
        let (format, decoder) = match cfg.format {
            SpeechFormat::Pcm { sample_rate } => ("pcm", AudioDecoder::pcm(sample_rate)),
            SpeechFormat::Wav => ("wav", AudioDecoder::Wav(WavStreamDecoder::new())),
        };
        let mut body = json!({
            "model": cfg.model,
            "input": request.text,
            "voice": request.voice.unwrap_or_else(|| cfg.voice.clone()),
            "response_format": format,
        });
        if let (Some(speed), Some(obj)) = (cfg.speed, body.as_object_mut()) {
            obj.insert("speed".into(), json!(speed));
        }
        let client = self.client.clone();
        let url = self.url.clone();
        let make = move || {
            let mut req = client.post(&url).json(&body);
            if let Some(key) = &cfg.api_key {
                req = req.bearer_auth(key);
            }
            req
        };
        audio_stream(self.config.http.clone(), make, decoder)
    }
}

/// How a streamed audio body becomes samples.
pub(crate) enum AudioDecoder {
    /// Headerless 16-bit little-endian mono PCM.
    Pcm {
        sample_rate: u32,
        /// A sample split across two body chunks.
        odd: Option<u8>,
    },
    Wav(WavStreamDecoder),
}

impl AudioDecoder {
    pub(crate) fn pcm(sample_rate: u32) -> Self {
        Self::Pcm {
            sample_rate,
            odd: None,
        }
    }

    fn feed(&mut self, bytes: &[u8]) -> Result<Option<PcmChunk>, ProviderError> {
        match self {
            Self::Wav(d) => d.feed(bytes),
            Self::Pcm { sample_rate, odd } => {
                let mut samples = Vec::with_capacity(bytes.len() / 2 + 1);
                let mut rest = bytes;
                if let Some(lo) = odd.take() {
                    let Some((&hi, tail)) = rest.split_first() else {
                        *odd = Some(lo);
                        return Ok(None);
                    };
                    samples.push(i16::from_le_bytes([lo, hi]));
                    rest = tail;
                }
                let mut pairs = rest.chunks_exact(2);
                samples.extend(pairs.by_ref().map(|p| i16::from_le_bytes([p[0], p[1]])));
                *odd = pairs.remainder().first().copied();
                Ok((!samples.is_empty()).then_some(PcmChunk {
                    sample_rate: *sample_rate,
                    samples,
                }))
            }
        }
    }

    fn finish(&self) -> Result<(), ProviderError> {
        match self {
            Self::Wav(d) => d.finish(),
            Self::Pcm { odd: Some(_), .. } => Err(ProviderError::StreamCut(
                "the PCM stream ended inside a sample".into(),
            )),
            Self::Pcm { .. } => Ok(()),
        }
    }
}

struct AudioRun<F> {
    http: HttpSettings,
    make: F,
    reader: Option<BodyReader>,
    decoder: AudioDecoder,
    done: bool,
}

/// Streams the audio answer of the request built by `make` through `decoder`.
pub(crate) fn audio_stream<F>(http: HttpSettings, make: F, decoder: AudioDecoder) -> TtsStream
where
    F: Fn() -> reqwest::RequestBuilder + Send + Sync + 'static,
{
    let run = AudioRun {
        http,
        make,
        reader: None,
        decoder,
        done: false,
    };
    Box::pin(futures::stream::unfold(run, |mut run| async move {
        loop {
            if run.done {
                return None;
            }
            match run.step().await {
                Ok(Some(chunk)) => return Some((Ok(chunk), run)),
                Ok(None) => {}
                Err(e) => {
                    run.done = true;
                    return Some((Err(e), run));
                }
            }
        }
    }))
}

impl<F> AudioRun<F>
where
    F: Fn() -> reqwest::RequestBuilder,
{
    /// `Ok(None)` when no samples were completed by this step (or at the clean end).
    async fn step(&mut self) -> Result<Option<PcmChunk>, ProviderError> {
        let Some(reader) = self.reader.as_mut() else {
            let resp = http::send_with_retries(&self.http, &self.make).await?;
            self.reader = Some(BodyReader::new(resp, self.http.idle_timeout));
            return Ok(None);
        };
        match reader.next_chunk().await? {
            Some(bytes) => self.decoder.feed(&bytes),
            None => {
                self.done = true;
                self.decoder.finish()?;
                Ok(None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pcm_samples_split_across_chunks_are_joined() {
        let mut d = AudioDecoder::pcm(24_000);
        let bytes: Vec<u8> = [1i16, -2, 300, -400]
            .iter()
            .flat_map(|s| s.to_le_bytes())
            .collect();
        let mut out = Vec::new();
        for piece in [&bytes[..1], &bytes[1..2], &bytes[2..5], &bytes[5..]] {
            if let Some(c) = d.feed(piece).unwrap() {
                assert_eq!(c.sample_rate, 24_000);
                out.extend(c.samples);
            }
        }
        d.finish().unwrap();
        assert_eq!(out, vec![1, -2, 300, -400]);
        d.feed(&[7]).unwrap();
        assert!(matches!(d.finish(), Err(ProviderError::StreamCut(_))));
    }
}
