//! Checked session configuration: parse the wire types once, then trust the values.
//!
//! Each type here can only hold valid values; `from_wire` (or `TryFrom`) is the one place where
//! a peer's configuration is checked, and `to_wire` converts back. proto3 cannot tell an unset
//! scalar from zero, so where zero would be meaningless the documented default applies instead;
//! the rules are listed on each type.
//!
//! | Field | Accepted | When zero / absent |
//! |---|---|---|
//! | `sample_rate` | 8000..=192000 Hz | error |
//! | `channel_count` | 1..=8 | error |
//! | `sample_format` | a known `SampleFormat` | `UNSIGNED_8_BIT` (proto3 zero) |
//! | VAD `confidence_threshold` | finite, 0.0 < t <= 1.0 | 0.4 |
//! | VAD `min_volume` | finite, 0.0..=1.0 | 0.0 (no volume gate) |
//! | VAD `start_duration` | nanos < 1e9, at most 2 s | 150 ms |
//! | VAD `stop_duration` | nanos < 1e9, at most 10 s | 390 ms |
//! | VAD `backbuffer_duration` | nanos < 1e9, at most 3 s | 1 s |
//! | `system_prompt` | at most 128 KiB of UTF-8 | empty |
//! | `temperature` | finite, 0.0..=2.0 | 0.0 if the message is present, 0.3 if absent |
//! | `experiments` | at most 64 entries, each with a JSON form | none |
//! | ElevenLabs `stability`, `similarity_boost`, `style` | finite, 0.0..=1.0 | 0.0 |
//! | ElevenLabs `speed` | finite, 0.25..=4.0 | 1.0 |
//!
//! The VAD and temperature defaults are those of the reference Python client, so a client that
//! omits a field gets the behaviour its authors expect. The maxima (all in [`limits`]) bound what
//! a session costs the server: the VAD windows size its audio history, so a client cannot make
//! it hold more than about 5 s of input.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;

use crate::error::{ConfigError, ConfigProblem, StructError, UsageError};
use crate::json;
use crate::limits;
use crate::proto::{
    self, AudioLineConfiguration, ElevenLabsLocation, ElevenLabsTtsConfiguration,
    ElevenLabsVoiceSettings, HostedTtsConfiguration, HostedTtsMode, HostedVoiceCloneV1,
    HostedVoiceRef, InferenceConfiguration, InitializeSessionRequest, ReconfigureSessionRequest,
    SampleFormat, TtsConfiguration, VadConfiguration, hosted_tts_configuration, tts_configuration,
};

const NANOS_PER_SEC: u32 = 1_000_000_000;

fn out_of_range(
    field: &'static str,
    value: impl std::fmt::Display,
    accepted: &'static str,
) -> ConfigError {
    ConfigError::new(
        field,
        ConfigProblem::OutOfRange {
            value: value.to_string(),
            accepted,
        },
    )
}

fn known_enum<E: TryFrom<i32>>(field: &'static str, raw: i32) -> Result<E, ConfigError> {
    E::try_from(raw).map_err(|_| ConfigError::new(field, ConfigProblem::UnknownEnumValue(raw)))
}

fn non_empty(field: &'static str, s: &str) -> Result<(), ConfigError> {
    if s.is_empty() {
        return Err(ConfigError::new(field, ConfigProblem::Empty));
    }
    Ok(())
}

/// Refuses a string or list larger than its documented maximum.
fn check_size(
    field: &'static str,
    len: usize,
    max: usize,
    unit: &'static str,
) -> Result<(), ConfigError> {
    if len > max {
        return Err(ConfigError::new(
            field,
            ConfigProblem::TooLarge { len, max, unit },
        ));
    }
    Ok(())
}

/// Checks a finite float against an inclusive range.
fn ranged(
    field: &'static str,
    value: f64,
    min: f64,
    max: f64,
    accepted: &'static str,
) -> Result<f64, ConfigError> {
    if !value.is_finite() {
        return Err(ConfigError::new(field, ConfigProblem::NotFinite));
    }
    if value < min || value > max {
        return Err(out_of_range(field, value, accepted));
    }
    Ok(value)
}

// ---------------------------------------------------------------------------------------------
// Duration
// ---------------------------------------------------------------------------------------------

impl proto::Duration {
    /// Converts to a [`std::time::Duration`].
    ///
    /// # Errors
    ///
    /// [`ConfigProblem::NanosOutOfRange`] (field `nanos`) when `nanos` is 1e9 or more: such a
    /// value has no canonical meaning, and accepting it would let two encodings mean one span.
    pub fn to_std(self) -> Result<Duration, ConfigError> {
        if self.nanos >= NANOS_PER_SEC {
            return Err(ConfigError::new(
                "nanos",
                ConfigProblem::NanosOutOfRange(self.nanos),
            ));
        }
        Ok(Duration::new(self.seconds, self.nanos))
    }

    /// Converts from a [`std::time::Duration`]; exact, since both are unsigned seconds plus
    /// nanoseconds.
    #[must_use]
    pub fn from_std(d: Duration) -> Self {
        Self {
            seconds: d.as_secs(),
            nanos: d.subsec_nanos(),
        }
    }
}

impl TryFrom<proto::Duration> for Duration {
    type Error = ConfigError;

    fn try_from(d: proto::Duration) -> Result<Self, ConfigError> {
        d.to_std()
    }
}

impl From<Duration> for proto::Duration {
    fn from(d: Duration) -> Self {
        Self::from_std(d)
    }
}

// ---------------------------------------------------------------------------------------------
// Audio format
// ---------------------------------------------------------------------------------------------

/// A checked raw PCM format: a supported sample rate, channel count and known sample format.
///
/// Parsed from `AudioLineConfiguration`. Samples are little-endian and channels interleaved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AudioFormat {
    sample_rate: u32,
    channels: u16,
    sample_format: SampleFormat,
}

impl AudioFormat {
    /// Lowest accepted sample rate, in Hz (telephony).
    pub const MIN_SAMPLE_RATE: u32 = 8_000;
    /// Highest accepted sample rate, in Hz ([`limits::MAX_SAMPLE_RATE`]): it sizes the
    /// per-session audio buffers, with the VAD windows.
    pub const MAX_SAMPLE_RATE: u32 = limits::MAX_SAMPLE_RATE;
    /// Most channels accepted (7.1 surround).
    pub const MAX_CHANNELS: u16 = 8;

    /// 16 kHz mono signed 16-bit: what speech recognisers usually want.
    pub const SPEECH_16K: Self = Self {
        sample_rate: 16_000,
        channels: 1,
        sample_format: SampleFormat::Signed16Bit,
    };
    /// 24 kHz mono signed 16-bit: what the reference client declares for text-only sessions.
    pub const SPEECH_24K: Self = Self {
        sample_rate: 24_000,
        channels: 1,
        sample_format: SampleFormat::Signed16Bit,
    };

    /// Checks and builds a format.
    ///
    /// # Errors
    ///
    /// [`ConfigProblem::OutOfRange`] for `sample_rate` outside 8000..=192000 or `channel_count`
    /// outside 1..=8.
    pub fn new(
        sample_rate: u32,
        channel_count: u32,
        sample_format: SampleFormat,
    ) -> Result<Self, ConfigError> {
        if !(Self::MIN_SAMPLE_RATE..=Self::MAX_SAMPLE_RATE).contains(&sample_rate) {
            return Err(out_of_range("sample_rate", sample_rate, "8000..=192000"));
        }
        let channels = u16::try_from(channel_count)
            .ok()
            .filter(|c| (1..=Self::MAX_CHANNELS).contains(c))
            .ok_or_else(|| out_of_range("channel_count", channel_count, "1..=8"))?;
        Ok(Self {
            sample_rate,
            channels,
            sample_format,
        })
    }

    /// Parses the wire type.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new), plus [`ConfigProblem::UnknownEnumValue`] for an unknown
    /// `sample_format`: audio in an unknown encoding cannot be interpreted.
    pub fn from_wire(wire: &AudioLineConfiguration) -> Result<Self, ConfigError> {
        let format = known_enum("sample_format", wire.sample_format)?;
        Self::new(wire.sample_rate, wire.channel_count, format)
    }

    /// The wire form.
    #[must_use]
    pub fn to_wire(self) -> AudioLineConfiguration {
        AudioLineConfiguration {
            sample_rate: self.sample_rate,
            channel_count: u32::from(self.channels),
            sample_format: self.sample_format.into(),
        }
    }

    /// Samples per second per channel, in Hz.
    #[must_use]
    pub fn sample_rate(self) -> u32 {
        self.sample_rate
    }

    /// Number of interleaved channels.
    #[must_use]
    pub fn channels(self) -> u16 {
        self.channels
    }

    /// Encoding of each sample.
    #[must_use]
    pub fn sample_format(self) -> SampleFormat {
        self.sample_format
    }

    /// Bytes of one sample of one channel.
    #[must_use]
    pub fn bytes_per_sample(self) -> usize {
        match self.sample_format {
            SampleFormat::Unsigned8Bit => 1,
            SampleFormat::Signed16Bit => 2,
            SampleFormat::Signed32Bit | SampleFormat::Float32Bit => 4,
            SampleFormat::Float64Bit => 8,
        }
    }

    /// Bytes of one frame: one sample for every channel. Audio buffers are whole frames.
    #[must_use]
    pub fn bytes_per_frame(self) -> usize {
        self.bytes_per_sample() * usize::from(self.channels)
    }

    /// Bytes of one second of audio.
    #[must_use]
    pub fn bytes_per_second(self) -> u64 {
        // At most 192000 * 8 * 8, far below u64::MAX.
        u64::from(self.sample_rate) * self.bytes_per_frame() as u64
    }

    /// How long `bytes` of audio in this format play; a trailing partial frame counts as
    /// nothing.
    #[must_use]
    pub fn duration_of(self, bytes: u64) -> Duration {
        let frames = bytes / self.bytes_per_frame() as u64;
        let rate = u64::from(self.sample_rate);
        let nanos = (frames % rate) * u64::from(NANOS_PER_SEC) / rate;
        // `nanos` < 1e9 because `frames % rate` < `rate`.
        Duration::new(frames / rate, u32::try_from(nanos).unwrap_or(0))
    }

    /// Bytes of whole frames that play for `duration` (rounded down to a frame), saturating at
    /// `u64::MAX`.
    #[must_use]
    pub fn bytes_for(self, duration: Duration) -> u64 {
        let frames = duration.as_nanos() * u128::from(self.sample_rate) / u128::from(NANOS_PER_SEC);
        let bytes = frames.saturating_mul(self.bytes_per_frame() as u128);
        u64::try_from(bytes).unwrap_or(u64::MAX)
    }
}

impl TryFrom<&AudioLineConfiguration> for AudioFormat {
    type Error = ConfigError;

    fn try_from(wire: &AudioLineConfiguration) -> Result<Self, ConfigError> {
        Self::from_wire(wire)
    }
}

impl From<AudioFormat> for AudioLineConfiguration {
    fn from(format: AudioFormat) -> Self {
        format.to_wire()
    }
}

/// Parses a required audio line, naming it in errors.
fn required_audio(
    field: &'static str,
    wire: Option<&AudioLineConfiguration>,
) -> Result<AudioFormat, ConfigError> {
    let wire = wire.ok_or_else(|| ConfigError::new(field, ConfigProblem::Missing))?;
    AudioFormat::from_wire(wire).map_err(|e| e.within(field))
}

// ---------------------------------------------------------------------------------------------
// VAD
// ---------------------------------------------------------------------------------------------

/// Checked voice activity detection settings.
///
/// Parsed from `VadConfiguration`; an absent message gives [`VadSettings::default()`], and a
/// zero `confidence_threshold` or a zero duration gives that field's default (a zero threshold
/// would call every frame speech, zero windows would make the detector flap).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VadSettings {
    confidence_threshold: f32,
    min_volume: f32,
    start_duration: Duration,
    stop_duration: Duration,
    backbuffer_duration: Duration,
}

impl VadSettings {
    /// Default speech probability threshold.
    pub const DEFAULT_CONFIDENCE_THRESHOLD: f32 = 0.4;
    /// Default minimum volume: no volume gate.
    pub const DEFAULT_MIN_VOLUME: f32 = 0.0;
    /// Default speech time before the user counts as speaking.
    pub const DEFAULT_START_DURATION: Duration = Duration::from_millis(150);
    /// Default silence time before the user counts as done.
    pub const DEFAULT_STOP_DURATION: Duration = Duration::from_millis(390);
    /// Default audio kept from before the start of speech.
    pub const DEFAULT_BACKBUFFER_DURATION: Duration = Duration::from_secs(1);
    /// The old ceiling on every window, before each got its own (smaller) maximum.
    #[deprecated(
        note = "each window has its own maximum: MAX_START_DURATION, MAX_STOP_DURATION, MAX_BACKBUFFER_DURATION"
    )]
    pub const MAX_DURATION: Duration = Duration::from_secs(3600);
    /// Longest accepted `start_duration` ([`limits::MAX_VAD_START_DURATION`]).
    pub const MAX_START_DURATION: Duration = limits::MAX_VAD_START_DURATION;
    /// Longest accepted `stop_duration` ([`limits::MAX_VAD_STOP_DURATION`]).
    pub const MAX_STOP_DURATION: Duration = limits::MAX_VAD_STOP_DURATION;
    /// Longest accepted `backbuffer_duration` ([`limits::MAX_VAD_BACKBUFFER_DURATION`]).
    pub const MAX_BACKBUFFER_DURATION: Duration = limits::MAX_VAD_BACKBUFFER_DURATION;

    /// Checks and builds settings; no defaults are substituted here.
    ///
    /// # Errors
    ///
    /// [`ConfigProblem::NotFinite`] or [`ConfigProblem::OutOfRange`] for a threshold outside
    /// (0, 1] or a volume outside [0, 1]; [`ConfigProblem::OutOfRange`] for a duration that is
    /// zero or longer than its maximum (2 s start, 10 s stop, 3 s backbuffer: the windows size
    /// the detector's audio history).
    pub fn new(
        confidence_threshold: f32,
        min_volume: f32,
        start_duration: Duration,
        stop_duration: Duration,
        backbuffer_duration: Duration,
    ) -> Result<Self, ConfigError> {
        let threshold = f64::from(confidence_threshold);
        ranged("confidence_threshold", threshold, 0.0, 1.0, "(0.0, 1.0]")?;
        if threshold == 0.0 {
            return Err(out_of_range("confidence_threshold", 0, "(0.0, 1.0]"));
        }
        ranged("min_volume", f64::from(min_volume), 0.0, 1.0, "[0.0, 1.0]")?;
        // Zero is rejected because on the wire it means "unset": every value of this type must
        // survive `to_wire` and `from_wire` unchanged.
        for (field, d, max, accepted) in [
            (
                "start_duration",
                start_duration,
                Self::MAX_START_DURATION,
                "(0s, 2s]",
            ),
            (
                "stop_duration",
                stop_duration,
                Self::MAX_STOP_DURATION,
                "(0s, 10s]",
            ),
            (
                "backbuffer_duration",
                backbuffer_duration,
                Self::MAX_BACKBUFFER_DURATION,
                "(0s, 3s]",
            ),
        ] {
            if d.is_zero() || d > max {
                return Err(out_of_range(field, format!("{d:?}"), accepted));
            }
        }
        Ok(Self {
            confidence_threshold,
            min_volume,
            start_duration,
            stop_duration,
            backbuffer_duration,
        })
    }

    /// Parses the wire type, substituting defaults as described on the type.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new), plus [`ConfigProblem::NanosOutOfRange`] for a malformed duration.
    pub fn from_wire(wire: Option<&VadConfiguration>) -> Result<Self, ConfigError> {
        let Some(wire) = wire else {
            return Ok(Self::default());
        };
        let duration = |field: &'static str, d: Option<proto::Duration>, default: Duration| match d
            .map(proto::Duration::to_std)
            .transpose()
        {
            Ok(Some(d)) if !d.is_zero() => Ok(d),
            Ok(_) => Ok(default),
            Err(e) => Err(e.within(field)),
        };
        let threshold = if wire.confidence_threshold == 0.0 {
            Self::DEFAULT_CONFIDENCE_THRESHOLD
        } else {
            wire.confidence_threshold
        };
        Self::new(
            threshold,
            wire.min_volume,
            duration(
                "start_duration",
                wire.start_duration,
                Self::DEFAULT_START_DURATION,
            )?,
            duration(
                "stop_duration",
                wire.stop_duration,
                Self::DEFAULT_STOP_DURATION,
            )?,
            duration(
                "backbuffer_duration",
                wire.backbuffer_duration,
                Self::DEFAULT_BACKBUFFER_DURATION,
            )?,
        )
    }

    /// The wire form, with every field set explicitly.
    #[must_use]
    pub fn to_wire(&self) -> VadConfiguration {
        VadConfiguration {
            confidence_threshold: self.confidence_threshold,
            min_volume: self.min_volume,
            start_duration: Some(self.start_duration.into()),
            stop_duration: Some(self.stop_duration.into()),
            backbuffer_duration: Some(self.backbuffer_duration.into()),
        }
    }

    /// Minimum speech probability for a frame to count as speech, in (0, 1].
    #[must_use]
    pub fn confidence_threshold(&self) -> f32 {
        self.confidence_threshold
    }

    /// Minimum volume for a frame to count as speech, in [0, 1].
    #[must_use]
    pub fn min_volume(&self) -> f32 {
        self.min_volume
    }

    /// Speech time before the user counts as speaking.
    #[must_use]
    pub fn start_duration(&self) -> Duration {
        self.start_duration
    }

    /// Silence time before the user counts as done.
    #[must_use]
    pub fn stop_duration(&self) -> Duration {
        self.stop_duration
    }

    /// Audio kept from before the detected start of speech.
    #[must_use]
    pub fn backbuffer_duration(&self) -> Duration {
        self.backbuffer_duration
    }
}

impl Default for VadSettings {
    fn default() -> Self {
        Self {
            confidence_threshold: Self::DEFAULT_CONFIDENCE_THRESHOLD,
            min_volume: Self::DEFAULT_MIN_VOLUME,
            start_duration: Self::DEFAULT_START_DURATION,
            stop_duration: Self::DEFAULT_STOP_DURATION,
            backbuffer_duration: Self::DEFAULT_BACKBUFFER_DURATION,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Inference
// ---------------------------------------------------------------------------------------------

/// Checked model settings: a system prompt and a sampling temperature in 0.0..=2.0.
///
/// A present `InferenceConfiguration` is taken literally (temperature 0 is a meaningful,
/// deterministic setting); an absent one gives [`InferenceSettings::default()`].
#[derive(Debug, Clone, PartialEq)]
pub struct InferenceSettings {
    system_prompt: String,
    temperature: f64,
}

impl InferenceSettings {
    /// Temperature when the client sends no inference configuration.
    pub const DEFAULT_TEMPERATURE: f64 = 0.3;
    /// Highest accepted temperature.
    pub const MAX_TEMPERATURE: f64 = 2.0;
    /// Longest accepted system prompt in UTF-8 bytes ([`limits::MAX_SYSTEM_PROMPT_BYTES`]).
    pub const MAX_SYSTEM_PROMPT_BYTES: usize = limits::MAX_SYSTEM_PROMPT_BYTES;

    /// Checks and builds settings.
    ///
    /// # Errors
    ///
    /// [`ConfigProblem::NotFinite`] or [`ConfigProblem::OutOfRange`] for a temperature outside
    /// 0.0..=2.0; [`ConfigProblem::TooLarge`] for a system prompt over
    /// [`MAX_SYSTEM_PROMPT_BYTES`](Self::MAX_SYSTEM_PROMPT_BYTES).
    pub fn new(system_prompt: impl Into<String>, temperature: f64) -> Result<Self, ConfigError> {
        let system_prompt = system_prompt.into();
        check_size(
            "system_prompt",
            system_prompt.len(),
            Self::MAX_SYSTEM_PROMPT_BYTES,
            "bytes",
        )?;
        ranged(
            "temperature",
            temperature,
            0.0,
            Self::MAX_TEMPERATURE,
            "0.0..=2.0",
        )?;
        Ok(Self {
            system_prompt,
            temperature,
        })
    }

    /// Parses the wire type.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub fn from_wire(wire: Option<&InferenceConfiguration>) -> Result<Self, ConfigError> {
        match wire {
            None => Ok(Self::default()),
            Some(w) => {
                // Checked before the copy, so an oversized prompt is never duplicated.
                check_size(
                    "system_prompt",
                    w.system_prompt.len(),
                    Self::MAX_SYSTEM_PROMPT_BYTES,
                    "bytes",
                )?;
                Self::new(w.system_prompt.clone(), w.temperature)
            }
        }
    }

    /// The wire form.
    #[must_use]
    pub fn to_wire(&self) -> InferenceConfiguration {
        InferenceConfiguration {
            system_prompt: self.system_prompt.clone(),
            temperature: self.temperature,
        }
    }

    /// The system prompt (may be empty).
    #[must_use]
    pub fn system_prompt(&self) -> &str {
        &self.system_prompt
    }

    /// The sampling temperature.
    #[must_use]
    pub fn temperature(&self) -> f64 {
        self.temperature
    }
}

impl Default for InferenceSettings {
    fn default() -> Self {
        Self {
            system_prompt: String::new(),
            temperature: Self::DEFAULT_TEMPERATURE,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// TTS
// ---------------------------------------------------------------------------------------------

/// Checked text-to-speech configuration.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum TtsSettings {
    /// ElevenLabs with the client's own credentials.
    ElevenLabs(ElevenLabsSettings),
    /// The server's own synthesis.
    Hosted(HostedTtsSettings),
}

impl TtsSettings {
    /// Parses the wire type.
    ///
    /// # Errors
    ///
    /// [`ConfigProblem::Missing`] (field `provider`) when no provider is set, and the provider's
    /// own errors, prefixed with its field name.
    pub fn from_wire(wire: &TtsConfiguration) -> Result<Self, ConfigError> {
        match &wire.provider {
            None => Err(ConfigError::new("provider", ConfigProblem::Missing)),
            Some(tts_configuration::Provider::ElevenLabs(e)) => ElevenLabsSettings::from_wire(e)
                .map(Self::ElevenLabs)
                .map_err(|e| e.within("eleven_labs")),
            Some(tts_configuration::Provider::Hosted(h)) => HostedTtsSettings::from_wire(h)
                .map(Self::Hosted)
                .map_err(|e| e.within("hosted")),
        }
    }

    /// The wire form.
    #[must_use]
    pub fn to_wire(&self) -> TtsConfiguration {
        let provider = match self {
            Self::ElevenLabs(e) => tts_configuration::Provider::ElevenLabs(e.to_wire()),
            Self::Hosted(h) => tts_configuration::Provider::Hosted(h.to_wire()),
        };
        TtsConfiguration {
            provider: Some(provider),
        }
    }
}

/// Checked ElevenLabs configuration: non-empty key and voice, known location.
#[derive(Clone, PartialEq)]
pub struct ElevenLabsSettings {
    api_key: String,
    voice_id: String,
    model_id: Option<String>,
    voice_settings: Option<VoiceSettings>,
    location: ElevenLabsLocation,
}

// The API key is a secret: keep it out of logs.
impl std::fmt::Debug for ElevenLabsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ElevenLabsSettings")
            .field("api_key", &"<redacted>")
            .field("voice_id", &self.voice_id)
            .field("model_id", &self.model_id)
            .field("voice_settings", &self.voice_settings)
            .field("location", &self.location)
            .finish()
    }
}

impl ElevenLabsSettings {
    /// Checks and builds settings for the US endpoint, the provider's default model and the
    /// voice's own settings.
    ///
    /// # Errors
    ///
    /// [`ConfigProblem::Empty`] for an empty `api_key` or `voice_id`.
    pub fn new(
        api_key: impl Into<String>,
        voice_id: impl Into<String>,
    ) -> Result<Self, ConfigError> {
        let (api_key, voice_id) = (api_key.into(), voice_id.into());
        non_empty("api_key", &api_key)?;
        non_empty("voice_id", &voice_id)?;
        Ok(Self {
            api_key,
            voice_id,
            model_id: None,
            voice_settings: None,
            location: ElevenLabsLocation::Us,
        })
    }

    /// Uses a specific ElevenLabs model.
    ///
    /// # Errors
    ///
    /// [`ConfigProblem::Empty`] for an empty model id (absent is `None`, not `""`).
    pub fn with_model_id(mut self, model_id: impl Into<String>) -> Result<Self, ConfigError> {
        let model_id = model_id.into();
        non_empty("model_id", &model_id)?;
        self.model_id = Some(model_id);
        Ok(self)
    }

    /// Overrides the voice's settings.
    #[must_use]
    pub fn with_voice_settings(mut self, settings: VoiceSettings) -> Self {
        self.voice_settings = Some(settings);
        self
    }

    /// Uses a regional endpoint.
    #[must_use]
    pub fn with_location(mut self, location: ElevenLabsLocation) -> Self {
        self.location = location;
        self
    }

    /// Parses the wire type.
    ///
    /// # Errors
    ///
    /// As the builder methods, plus [`ConfigProblem::UnknownEnumValue`] for an unknown
    /// `location` (data residency must never silently fall back to another region).
    pub fn from_wire(wire: &ElevenLabsTtsConfiguration) -> Result<Self, ConfigError> {
        let mut settings = Self::new(wire.api_key.clone(), wire.voice_id.clone())?;
        if let Some(model_id) = &wire.model_id {
            settings = settings.with_model_id(model_id.clone())?;
        }
        if let Some(vs) = &wire.voice_settings {
            let vs = VoiceSettings::from_wire(vs).map_err(|e| e.within("voice_settings"))?;
            settings = settings.with_voice_settings(vs);
        }
        Ok(settings.with_location(known_enum("location", wire.location)?))
    }

    /// The wire form.
    #[must_use]
    pub fn to_wire(&self) -> ElevenLabsTtsConfiguration {
        ElevenLabsTtsConfiguration {
            api_key: self.api_key.clone(),
            voice_id: self.voice_id.clone(),
            model_id: self.model_id.clone(),
            voice_settings: self.voice_settings.map(VoiceSettings::to_wire),
            location: self.location.into(),
        }
    }

    /// The client's ElevenLabs API key.
    #[must_use]
    pub fn api_key(&self) -> &str {
        &self.api_key
    }

    /// The voice.
    #[must_use]
    pub fn voice_id(&self) -> &str {
        &self.voice_id
    }

    /// The model, or `None` for the provider's default.
    #[must_use]
    pub fn model_id(&self) -> Option<&str> {
        self.model_id.as_deref()
    }

    /// Voice overrides, or `None` for the voice's own settings.
    #[must_use]
    pub fn voice_settings(&self) -> Option<VoiceSettings> {
        self.voice_settings
    }

    /// The regional endpoint.
    #[must_use]
    pub fn location(&self) -> ElevenLabsLocation {
        self.location
    }
}

/// Checked ElevenLabs voice settings.
///
/// `stability`, `similarity_boost` and `style` are in 0.0..=1.0; `speed` is in 0.25..=4.0, and a
/// zero `speed` on the wire means 1.0 (normal speed), since speed 0 cannot be spoken.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VoiceSettings {
    stability: f64,
    similarity_boost: f64,
    style: f64,
    use_speaker_boost: bool,
    speed: f64,
}

impl VoiceSettings {
    /// Normal speaking speed.
    pub const DEFAULT_SPEED: f64 = 1.0;

    /// Checks and builds voice settings.
    ///
    /// # Errors
    ///
    /// [`ConfigProblem::NotFinite`] or [`ConfigProblem::OutOfRange`] for a value outside its
    /// range (see the type).
    pub fn new(
        stability: f64,
        similarity_boost: f64,
        style: f64,
        use_speaker_boost: bool,
        speed: f64,
    ) -> Result<Self, ConfigError> {
        Ok(Self {
            stability: ranged("stability", stability, 0.0, 1.0, "0.0..=1.0")?,
            similarity_boost: ranged("similarity_boost", similarity_boost, 0.0, 1.0, "0.0..=1.0")?,
            style: ranged("style", style, 0.0, 1.0, "0.0..=1.0")?,
            use_speaker_boost,
            speed: ranged("speed", speed, 0.25, 4.0, "0.25..=4.0")?,
        })
    }

    /// Parses the wire type; a zero `speed` means [`DEFAULT_SPEED`](Self::DEFAULT_SPEED).
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub fn from_wire(wire: &ElevenLabsVoiceSettings) -> Result<Self, ConfigError> {
        let speed = if wire.speed == 0.0 {
            Self::DEFAULT_SPEED
        } else {
            wire.speed
        };
        Self::new(
            wire.stability,
            wire.similarity_boost,
            wire.style,
            wire.use_speaker_boost,
            speed,
        )
    }

    /// The wire form.
    #[must_use]
    pub fn to_wire(self) -> ElevenLabsVoiceSettings {
        ElevenLabsVoiceSettings {
            stability: self.stability,
            similarity_boost: self.similarity_boost,
            style: self.style,
            use_speaker_boost: self.use_speaker_boost,
            speed: self.speed,
        }
    }

    /// Voice stability.
    #[must_use]
    pub fn stability(self) -> f64 {
        self.stability
    }

    /// Similarity to the original voice.
    #[must_use]
    pub fn similarity_boost(self) -> f64 {
        self.similarity_boost
    }

    /// Style exaggeration.
    #[must_use]
    pub fn style(self) -> f64 {
        self.style
    }

    /// Whether speaker boost is on.
    #[must_use]
    pub fn use_speaker_boost(self) -> bool {
        self.use_speaker_boost
    }

    /// Speaking speed; 1.0 is normal.
    #[must_use]
    pub fn speed(self) -> f64 {
        self.speed
    }
}

/// Checked configuration of the server's own speech synthesis.
#[derive(Debug, Clone, PartialEq)]
pub struct HostedTtsSettings {
    /// The voice to speak with.
    pub voice: HostedVoice,
    /// Quality/latency trade-off.
    pub mode: HostedTtsMode,
}

impl HostedTtsSettings {
    /// Parses the wire type.
    ///
    /// # Errors
    ///
    /// [`ConfigProblem::Missing`] (field `voice`) when no voice is set,
    /// [`ConfigProblem::UnknownEnumValue`] for an unknown `mode`, and the voice's own errors.
    pub fn from_wire(wire: &HostedTtsConfiguration) -> Result<Self, ConfigError> {
        let voice = match &wire.voice {
            None => return Err(ConfigError::new("voice", ConfigProblem::Missing)),
            Some(hosted_tts_configuration::Voice::VoiceRef(r)) => {
                non_empty("voice_id", &r.voice_id).map_err(|e| e.within("voice_ref"))?;
                HostedVoice::Ref {
                    voice_id: r.voice_id.clone(),
                }
            }
            Some(hosted_tts_configuration::Voice::VoiceCloneV1(c)) => HostedVoice::Clone(
                VoiceClone::from_wire(c).map_err(|e| e.within("voice_clone_v1"))?,
            ),
        };
        Ok(Self {
            voice,
            mode: known_enum("mode", wire.mode)?,
        })
    }

    /// The wire form.
    #[must_use]
    pub fn to_wire(&self) -> HostedTtsConfiguration {
        let voice = match &self.voice {
            HostedVoice::Ref { voice_id } => {
                hosted_tts_configuration::Voice::VoiceRef(HostedVoiceRef {
                    voice_id: voice_id.clone(),
                })
            }
            HostedVoice::Clone(c) => hosted_tts_configuration::Voice::VoiceCloneV1(c.to_wire()),
        };
        HostedTtsConfiguration {
            voice: Some(voice),
            mode: self.mode.into(),
        }
    }
}

/// The voice of hosted speech synthesis.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum HostedVoice {
    /// A voice the server knows, by non-empty identifier.
    Ref {
        /// The voice identifier.
        voice_id: String,
    },
    /// A voice cloned from a reference recording.
    Clone(VoiceClone),
}

/// A checked voice-clone reference: whole frames of audio in a valid format.
#[derive(Debug, Clone, PartialEq)]
pub struct VoiceClone {
    audio: Bytes,
    format: AudioFormat,
    ref_text: String,
}

impl VoiceClone {
    /// Checks and builds a clone reference.
    ///
    /// # Errors
    ///
    /// [`ConfigProblem::AudioLength`] (field `audio_data`) when the audio is empty or not whole
    /// frames of `format`.
    pub fn new(
        audio: Bytes,
        format: AudioFormat,
        ref_text: impl Into<String>,
    ) -> Result<Self, ConfigError> {
        let frame = format.bytes_per_frame();
        if audio.is_empty() || !audio.len().is_multiple_of(frame) {
            return Err(ConfigError::new(
                "audio_data",
                ConfigProblem::AudioLength {
                    len: audio.len(),
                    frame,
                },
            ));
        }
        Ok(Self {
            audio,
            format,
            ref_text: ref_text.into(),
        })
    }

    /// Parses the wire type; the audio is shared, not copied.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new), plus the format's errors under `audio_format`.
    pub fn from_wire(wire: &HostedVoiceCloneV1) -> Result<Self, ConfigError> {
        let format = required_audio("audio_format", wire.audio_format.as_ref())?;
        Self::new(wire.audio_data.clone(), format, wire.ref_text.clone())
    }

    /// The wire form.
    #[must_use]
    pub fn to_wire(&self) -> HostedVoiceCloneV1 {
        HostedVoiceCloneV1 {
            audio_data: self.audio.clone(),
            audio_format: Some(self.format.to_wire()),
            ref_text: self.ref_text.clone(),
        }
    }

    /// The reference recording.
    #[must_use]
    pub fn audio(&self) -> &Bytes {
        &self.audio
    }

    /// Its format.
    #[must_use]
    pub fn format(&self) -> AudioFormat {
        self.format
    }

    /// Its transcript.
    #[must_use]
    pub fn ref_text(&self) -> &str {
        &self.ref_text
    }
}

// ---------------------------------------------------------------------------------------------
// Session
// ---------------------------------------------------------------------------------------------

/// A checked `InitializeSessionRequest`.
///
/// Every field is itself a checked type, so the fields are public: any value of this struct is
/// a valid configuration. Both audio lines are required (guessing a format would turn audio
/// into noise); everything else has a default.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionConfig {
    /// Format of the client's audio.
    pub input: AudioFormat,
    /// Format of the server's audio.
    pub output: AudioFormat,
    /// Voice activity detection.
    pub vad: VadSettings,
    /// System prompt and temperature.
    pub inference: InferenceSettings,
    /// Speech synthesis; `None` means the server streams text.
    pub tts: Option<TtsSettings>,
    /// The client sends `PlaybackPositionReport`s.
    pub supports_playback_reporting: bool,
    /// The client wants a `VadAnalysisFrame` per analysed frame.
    pub enable_vad_frame_telemetry: bool,
    /// Experimental features by name, as JSON.
    pub experiments: BTreeMap<String, serde_json::Value>,
}

impl SessionConfig {
    /// A configuration with the given audio lines and defaults for everything else.
    #[must_use]
    pub fn new(input: AudioFormat, output: AudioFormat) -> Self {
        Self {
            input,
            output,
            vad: VadSettings::default(),
            inference: InferenceSettings::default(),
            tts: None,
            supports_playback_reporting: false,
            enable_vad_frame_telemetry: false,
            experiments: BTreeMap::new(),
        }
    }

    /// Parses the wire type.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] whose field is the dotted path from the request, such as
    /// `input_audio_line.sample_rate` or `experiments.flag`; any size over its maximum in
    /// [`limits`] is [`ConfigProblem::TooLarge`] or [`ConfigProblem::OutOfRange`].
    pub fn from_wire(wire: &InitializeSessionRequest) -> Result<Self, ConfigError> {
        let input = required_audio("input_audio_line", wire.input_audio_line.as_ref())?;
        let output = required_audio("output_audio_line", wire.output_audio_line.as_ref())?;
        let vad = VadSettings::from_wire(wire.vad_configuration.as_ref())
            .map_err(|e| e.within("vad_configuration"))?;
        let inference = InferenceSettings::from_wire(wire.inference_configuration.as_ref())
            .map_err(|e| e.within("inference_configuration"))?;
        let tts = wire
            .tts_configuration
            .as_ref()
            .map(TtsSettings::from_wire)
            .transpose()
            .map_err(|e| e.within("tts_configuration"))?;
        check_size(
            "experiments",
            wire.experiments.len(),
            limits::MAX_EXPERIMENTS,
            "entries",
        )?;
        let mut experiments = BTreeMap::new();
        for (name, value) in &wire.experiments {
            let json = json::value_to_json(value).map_err(|e| {
                ConfigError::new(format!("experiments.{name}"), ConfigProblem::Json(e))
            })?;
            experiments.insert(name.clone(), json);
        }
        Ok(Self {
            input,
            output,
            vad,
            inference,
            tts,
            supports_playback_reporting: wire.supports_playback_reporting,
            enable_vad_frame_telemetry: wire.enable_vad_frame_telemetry,
            experiments,
        })
    }

    /// The wire form.
    ///
    /// # Errors
    ///
    /// [`UsageError::Json`] when an experiment value nests deeper than
    /// [`json::MAX_DEPTH`]; nothing else can fail.
    pub fn to_wire(&self) -> Result<InitializeSessionRequest, UsageError> {
        let experiments = self
            .experiments
            .iter()
            .map(|(k, v)| Ok((k.clone(), json::json_to_value(v)?)))
            .collect::<Result<_, StructError>>()
            .map_err(UsageError::Json)?;
        Ok(InitializeSessionRequest {
            input_audio_line: Some(self.input.to_wire()),
            output_audio_line: Some(self.output.to_wire()),
            vad_configuration: Some(self.vad.to_wire()),
            inference_configuration: Some(self.inference.to_wire()),
            tts_configuration: self.tts.as_ref().map(TtsSettings::to_wire),
            supports_playback_reporting: self.supports_playback_reporting,
            enable_vad_frame_telemetry: self.enable_vad_frame_telemetry,
            experiments,
        })
    }
}

impl TryFrom<&InitializeSessionRequest> for SessionConfig {
    type Error = ConfigError;

    fn try_from(wire: &InitializeSessionRequest) -> Result<Self, ConfigError> {
        Self::from_wire(wire)
    }
}

/// A checked `ReconfigureSessionRequest`: each `Some` replaces the current setting.
///
/// A request with neither field is valid and changes nothing.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SessionUpdate {
    /// New format of the client's audio.
    pub input: Option<AudioFormat>,
    /// New system prompt and temperature.
    pub inference: Option<InferenceSettings>,
}

impl SessionUpdate {
    /// Parses the wire type.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field, as for [`SessionConfig::from_wire`].
    pub fn from_wire(wire: &ReconfigureSessionRequest) -> Result<Self, ConfigError> {
        let input = wire
            .input_audio_line
            .as_ref()
            .map(|a| AudioFormat::from_wire(a).map_err(|e| e.within("input_audio_line")))
            .transpose()?;
        let inference = wire
            .inference_configuration
            .as_ref()
            .map(|i| {
                InferenceSettings::from_wire(Some(i))
                    .map_err(|e| e.within("inference_configuration"))
            })
            .transpose()?;
        Ok(Self { input, inference })
    }

    /// Applies the update to a session's configuration.
    pub fn apply(self, config: &mut SessionConfig) {
        if let Some(input) = self.input {
            config.input = input;
        }
        if let Some(inference) = self.inference {
            config.inference = inference;
        }
    }

    /// The wire form.
    #[must_use]
    pub fn to_wire(&self) -> ReconfigureSessionRequest {
        ReconfigureSessionRequest {
            input_audio_line: self.input.map(AudioFormat::to_wire),
            inference_configuration: self.inference.as_ref().map(InferenceSettings::to_wire),
        }
    }
}

impl TryFrom<&ReconfigureSessionRequest> for SessionUpdate {
    type Error = ConfigError;

    fn try_from(wire: &ReconfigureSessionRequest) -> Result<Self, ConfigError> {
        Self::from_wire(wire)
    }
}

#[cfg(test)]
mod tests;
