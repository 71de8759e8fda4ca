//! `[llm]`, `[asr]` and `[tts]`: which provider each kind uses, its options, its deadlines and
//! its fallback; and the same sections per door (`[xiaozhi.llm]`, `[retell.tts]`...), which
//! replace the server's for that door only.
//!
//! Every section is one flat table whose `provider` picks the back end (see
//! `docs/providers.md`). The table is parsed loosely (every option optional) and then
//! [resolved](LlmConfig::resolve) into a typed plan, so a wrong choice is reported with the
//! section's name and the valid choices rather than as a serde "unknown variant".
//!
//! Without `provider`, the kind is inferred as before this setting existed: `openai` when
//! `base_url` is given (and, for the LLM, `acp` when an `[llm.acp]` table is), otherwise the
//! embedded default (`demo`, `none`, `embedded`).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::env::{EnvVars, Secret};
use super::{AcpBrainConfig, ConfigError};

/// Default deadline to an LLM's first token, retries included.
pub const DEFAULT_LLM_TIMEOUT_SECS: u64 = 10;
/// Default deadline of a transcription.
pub const DEFAULT_ASR_TIMEOUT_SECS: u64 = 15;
/// Default deadline to a synthesizer's first audio chunk.
pub const DEFAULT_TTS_TIMEOUT_SECS: u64 = 10;
/// Default limit on the silence between two streamed items once output has begun.
pub const DEFAULT_IDLE_TIMEOUT_SECS: u64 = 30;

/// The LLM providers `[llm] provider` accepts.
pub const LLM_PROVIDERS: [&str; 3] = ["openai", "demo", "acp"];
/// The ASR providers `[asr] provider` accepts.
pub const ASR_PROVIDERS: [&str; 3] = ["openai", "local", "none"];
/// The TTS providers `[tts] provider` accepts.
pub const TTS_PROVIDERS: [&str; 7] = [
    "openai",
    "elevenlabs",
    "local",
    "command",
    "espeak",
    "tone",
    "embedded",
];

/// The doors that accept provider overrides, as their config sections are named.
pub const OVERRIDE_DOORS: [&str; 6] = ["realtime", "xiaozhi", "gemini", "retell", "bridge", "vip"];

/// A language model section (`[llm]`, `[<door>.llm]`, `[llm.fallback]`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LlmConfig {
    /// `openai`, `demo` or `acp`; inferred when absent (see the module docs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// `openai`: API root with version, e.g. `http://localhost:11434/v1`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// `openai`: model name; default `gpt-4o-mini`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// `openai`: bearer token, if the service needs one (masked by `--print-config`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    /// `acp`: the agent process (same keys as the top-level `[acp]` section).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acp: Option<AcpBrainConfig>,
    /// Seconds to the first token, retries included; 0: no deadline. Default 10 (none for
    /// `acp`, which has its own start-up and idle limits).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    /// Seconds of silence allowed between two tokens once the reply has begun; 0: no limit.
    /// Default 30 (none for `acp`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_timeout_secs: Option<u64>,
    /// Used for a request when this one fails or times out before its first token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback: Option<Box<LlmConfig>>,
}

/// A speech recognizer section (`[asr]`, `[<door>.asr]`, `[asr.fallback]`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AsrConfig {
    /// `openai`, `local` or `none`; inferred when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// `openai`: API root with version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// `openai`: model name; default `whisper-1`. `local`: the Whisper model directory
    /// (CTranslate2 layout); default the one installed in the models directory
    /// (`VOXGATE_MODELS_DIR`, see `docs/offline.md`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// `openai`: bearer token (masked by `--print-config`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    /// `local`: recognitions run at once (threads); default 1 (each uses every core).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workers: Option<usize>,
    /// `local`: recognitions that may wait for a worker; beyond, a turn gets a "busy" error
    /// at once (and the fallback, if any). Default 3.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<usize>,
    /// `local`: language of multilingual models when the door gives none; default `en`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// Seconds a transcription may take, retries included; 0: no deadline. Default 15.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    /// Used for an utterance when this one fails or times out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback: Option<Box<AsrConfig>>,
}

/// A speech synthesizer section (`[tts]`, `[<door>.tts]`, `[tts.fallback]`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TtsConfig {
    /// `openai`, `elevenlabs`, `command`, `espeak`, `tone` or `embedded`; inferred when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// `openai`: API root with version (required). `elevenlabs`: API root instead of
    /// ElevenLabs' own host (optional).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// `openai`: model, default `tts-1`. `elevenlabs`: `model_id`, default the service's.
    /// `local`: the Piper voice (`.onnx`, its `.onnx.json` beside it); default the one
    /// installed in the models directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// `local`: the ONNX Runtime shared library; default the one installed in the models
    /// directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub onnxruntime: Option<String>,
    /// `local`: the voice's phonemizer as espeak-ng's shared library, loaded in process (its
    /// data in `espeak-ng-data` beside it); default the one installed in the models directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub espeak_library: Option<String>,
    /// `local`: the voice's phonemizer as the `espeak-ng` program (a name on `PATH` or a path),
    /// run once per sentence; the default when espeak-ng's library is not installed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub espeak_program: Option<String>,
    /// `local`: speaker number of a multi-speaker voice.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speaker: Option<i64>,
    /// `local`: sentences synthesized at once (threads); default 2.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workers: Option<usize>,
    /// `local`: sentences that may wait for a worker; beyond, a "busy" error (and the
    /// fallback, if any). Default 16.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<usize>,
    /// `openai`: voice, default `alloy`. `elevenlabs`: the voice id (required).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub voice: Option<String>,
    /// `openai` (optional), `elevenlabs` (required): the key (masked by `--print-config`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    /// `elevenlabs`: output rate, one of 8000, 16000, 22050, 24000, 44100; default 16000.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sample_rate: Option<u32>,
    /// `command`: a program that reads the text on stdin and writes a 16-bit WAV to stdout.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// `command`: its arguments.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
    /// Seconds to the first audio chunk, retries included; 0: no deadline. Default 10.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    /// Seconds of silence allowed between two chunks once audio has begun; 0: no limit.
    /// Default 30.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_timeout_secs: Option<u64>,
    /// Used for a sentence when this one fails or times out before its first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback: Option<Box<TtsConfig>>,
}

/// The limits a provider runs under, and what to use when it fails before any output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan<S> {
    /// The provider and its options.
    pub spec: S,
    /// Deadline to the first token / transcript / audio chunk; `None`: none.
    pub first: Option<Duration>,
    /// Limit on the silence between two items after the first; `None`: none.
    pub idle: Option<Duration>,
    /// The fallback, with its own limits.
    pub fallback: Option<Box<Plan<S>>>,
}

/// A resolved LLM choice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LlmSpec {
    /// An OpenAI-compatible chat completions endpoint.
    OpenAi {
        /// API root.
        base_url: String,
        /// Model name.
        model: String,
        /// Bearer token.
        api_key: Option<String>,
    },
    /// The offline demo agent.
    Demo,
    /// An ACP agent process.
    Acp(AcpBrainConfig),
}

/// A resolved ASR choice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AsrSpec {
    /// An OpenAI-compatible `/audio/transcriptions` endpoint.
    OpenAi {
        /// API root.
        base_url: String,
        /// Model name.
        model: String,
        /// Bearer token.
        api_key: Option<String>,
    },
    /// Whisper in process (`voxgate-local-speech`).
    Local {
        /// The model directory.
        model: PathBuf,
        /// Worker threads.
        workers: usize,
        /// Waiting recognitions beyond the running ones.
        queue: usize,
        /// Language for multilingual models.
        language: String,
    },
    /// No recognizer (`NoAsr`).
    None,
}

/// A resolved TTS choice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TtsSpec {
    /// An OpenAI-compatible `/audio/speech` endpoint.
    OpenAi {
        /// API root.
        base_url: String,
        /// Model name.
        model: String,
        /// Voice name.
        voice: String,
        /// Bearer token.
        api_key: Option<String>,
    },
    /// ElevenLabs streaming synthesis.
    ElevenLabs {
        /// The account key.
        api_key: String,
        /// The voice id.
        voice_id: String,
        /// The model id; the service default when `None`.
        model_id: Option<String>,
        /// Another API root (a proxy, a test double).
        base_url: Option<String>,
        /// Output rate.
        sample_rate: u32,
    },
    /// A Piper voice in process (`voxgate-local-speech`).
    Local {
        /// The voice's `.onnx` file.
        model: PathBuf,
        /// The ONNX Runtime shared library.
        onnxruntime: PathBuf,
        /// What turns the text into phonemes.
        phonemizer: PhonemizerSpec,
        /// Speaker of a multi-speaker voice.
        speaker: Option<i64>,
        /// Worker threads.
        workers: usize,
        /// Waiting sentences beyond the running ones.
        queue: usize,
    },
    /// A local program writing WAV.
    Command {
        /// The program.
        program: String,
        /// Its arguments.
        args: Vec<String>,
    },
    /// `espeak-ng --stdout --stdin`.
    Espeak,
    /// The placeholder tones.
    Tone,
    /// `espeak-ng` when installed, else tones.
    Embedded,
}

/// A Piper voice's phonemizer: espeak-ng either way, the same phonemes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PhonemizerSpec {
    /// espeak-ng's shared library, loaded in process (`espeak_library`).
    Library(PathBuf),
    /// The `espeak-ng` program, run once per sentence (`espeak_program`).
    Program(String),
}

impl std::fmt::Display for PhonemizerSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Library(path) => write!(f, "espeak-ng library {} (in process)", path.display()),
            Self::Program(program) => {
                write!(f, "espeak-ng program `{program}` (one run per sentence)")
            }
        }
    }
}

/// Seconds as a limit, 0 meaning none.
fn limit(secs: Option<u64>, default: u64) -> Option<Duration> {
    Some(secs.unwrap_or(default))
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
}

fn invalid(message: String) -> ConfigError {
    ConfigError::Invalid(message)
}

/// The chosen provider: the given one (checked against `valid`) or `inferred`.
fn choose(
    section: &str,
    given: Option<&str>,
    valid: &[&str],
    inferred: &'static str,
) -> Result<String, ConfigError> {
    let Some(p) = given else {
        return Ok(inferred.to_owned());
    };
    let p = p.trim().to_ascii_lowercase();
    if valid.contains(&p.as_str()) {
        Ok(p)
    } else {
        Err(invalid(format!(
            "[{section}] provider = {:?} is not a provider; valid choices: {}",
            given.unwrap_or_default(),
            valid.join(", ")
        )))
    }
}

/// Fails when a set option (by name) is not one `provider` reads.
fn only(
    section: &str,
    provider: &str,
    set: &[(&str, bool)],
    allowed: &[&str],
) -> Result<(), ConfigError> {
    for (name, is_set) in set {
        if *is_set && !allowed.contains(name) {
            return Err(invalid(format!(
                "[{section}] {name} is not an option of provider \"{provider}\" (its options: {})",
                if allowed.is_empty() {
                    "none".to_owned()
                } else {
                    allowed.join(", ")
                }
            )));
        }
    }
    Ok(())
}

/// `value` when within `min..=max`, else an error naming the option.
fn bounded(
    section: &str,
    name: &str,
    value: usize,
    min: usize,
    max: usize,
) -> Result<usize, ConfigError> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(invalid(format!(
            "[{section}] {name} = {value} is out of range ({min} to {max})"
        )))
    }
}

fn required(
    section: &str,
    provider: &str,
    name: &str,
    v: Option<&String>,
) -> Result<String, ConfigError> {
    v.filter(|s| !s.trim().is_empty())
        .cloned()
        .ok_or_else(|| invalid(format!("[{section}] provider \"{provider}\" needs {name}")))
}

impl LlmConfig {
    /// Checks the section named `section` (`llm`, `xiaozhi.llm`...) and its fallback.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the section: an unknown provider (with the valid
    /// choices), an option the provider does not read, a missing required option.
    pub fn resolve(&self, section: &str) -> Result<Plan<LlmSpec>, ConfigError> {
        let inferred = if self.acp.is_some() {
            "acp"
        } else if self.base_url.is_some() {
            "openai"
        } else {
            "demo"
        };
        let provider = choose(section, self.provider.as_deref(), &LLM_PROVIDERS, inferred)?;
        let set = [
            ("base_url", self.base_url.is_some()),
            ("model", self.model.is_some()),
            ("api_key", self.api_key.is_some()),
            ("acp", self.acp.is_some()),
        ];
        let (spec, default_first, default_idle) = match provider.as_str() {
            "openai" => {
                only(section, &provider, &set, &["base_url", "model", "api_key"])?;
                (
                    LlmSpec::OpenAi {
                        base_url: required(section, &provider, "base_url", self.base_url.as_ref())?,
                        model: self.model.clone().unwrap_or_else(|| "gpt-4o-mini".into()),
                        api_key: self.api_key.clone(),
                    },
                    DEFAULT_LLM_TIMEOUT_SECS,
                    DEFAULT_IDLE_TIMEOUT_SECS,
                )
            }
            "acp" => {
                only(section, &provider, &set, &["acp"])?;
                let acp = self.acp.clone().ok_or_else(|| {
                    invalid(format!(
                        "[{section}] provider \"acp\" needs an [{section}.acp] table with command"
                    ))
                })?;
                // The agent has its own start-up and idle limits (tools can take minutes).
                (LlmSpec::Acp(acp), 0, 0)
            }
            _ => {
                only(section, &provider, &set, &[])?;
                (
                    LlmSpec::Demo,
                    DEFAULT_LLM_TIMEOUT_SECS,
                    DEFAULT_IDLE_TIMEOUT_SECS,
                )
            }
        };
        let fallback = self
            .fallback
            .as_ref()
            .map(|f| f.resolve(&format!("{section}.fallback")).map(Box::new))
            .transpose()?;
        Ok(Plan {
            spec,
            first: limit(self.timeout_secs, default_first),
            idle: limit(self.idle_timeout_secs, default_idle),
            fallback,
        })
    }

    fn mask_secrets(&mut self) {
        self.api_key.mask();
        if let Some(a) = &mut self.acp {
            a.env.mask();
        }
        if let Some(f) = &mut self.fallback {
            f.mask_secrets();
        }
    }
}

impl AsrConfig {
    /// The section without the options only a remote service reads (switching to `local`).
    #[must_use]
    pub(crate) fn without_remote(self) -> Self {
        Self {
            base_url: None,
            api_key: None,
            ..self
        }
    }

    /// Checks the section named `section` and its fallback.
    ///
    /// # Errors
    /// As [`LlmConfig::resolve`].
    pub fn resolve(&self, section: &str) -> Result<Plan<AsrSpec>, ConfigError> {
        let inferred = if self.base_url.is_some() {
            "openai"
        } else {
            "none"
        };
        let provider = choose(section, self.provider.as_deref(), &ASR_PROVIDERS, inferred)?;
        let set = [
            ("base_url", self.base_url.is_some()),
            ("model", self.model.is_some()),
            ("api_key", self.api_key.is_some()),
            ("workers", self.workers.is_some()),
            ("queue", self.queue.is_some()),
            ("language", self.language.is_some()),
        ];
        let spec = if provider == "openai" {
            only(section, &provider, &set, &["base_url", "model", "api_key"])?;
            AsrSpec::OpenAi {
                base_url: required(section, &provider, "base_url", self.base_url.as_ref())?,
                model: self.model.clone().unwrap_or_else(|| "whisper-1".into()),
                api_key: self.api_key.clone(),
            }
        } else if provider == "local" {
            only(
                section,
                &provider,
                &set,
                &["model", "workers", "queue", "language"],
            )?;
            let model = match &self.model {
                Some(m) => PathBuf::from(m),
                None => crate::local_speech::installed_whisper()
                    .map_err(|why| invalid(format!("[{section}] provider \"local\": {why}")))?,
            };
            AsrSpec::Local {
                model,
                workers: bounded(section, "workers", self.workers.unwrap_or(1), 1, 64)?,
                queue: bounded(section, "queue", self.queue.unwrap_or(3), 0, 1024)?,
                language: self.language.clone().unwrap_or_else(|| "en".into()),
            }
        } else {
            only(section, &provider, &set, &[])?;
            AsrSpec::None
        };
        let fallback = self
            .fallback
            .as_ref()
            .map(|f| f.resolve(&format!("{section}.fallback")).map(Box::new))
            .transpose()?;
        Ok(Plan {
            spec,
            first: limit(self.timeout_secs, DEFAULT_ASR_TIMEOUT_SECS),
            idle: None,
            fallback,
        })
    }

    fn mask_secrets(&mut self) {
        self.api_key.mask();
        if let Some(f) = &mut self.fallback {
            f.mask_secrets();
        }
    }
}

/// ElevenLabs' PCM output rates.
const ELEVENLABS_RATES: [u32; 5] = [8_000, 16_000, 22_050, 24_000, 44_100];

impl TtsConfig {
    /// Checks the section named `section` and its fallback.
    ///
    /// # Errors
    /// As [`LlmConfig::resolve`].
    pub fn resolve(&self, section: &str) -> Result<Plan<TtsSpec>, ConfigError> {
        let inferred = if self.base_url.is_some() {
            "openai"
        } else if self.command.is_some() {
            "command"
        } else {
            "embedded"
        };
        let provider = choose(section, self.provider.as_deref(), &TTS_PROVIDERS, inferred)?;
        let set = [
            ("base_url", self.base_url.is_some()),
            ("model", self.model.is_some()),
            ("voice", self.voice.is_some()),
            ("api_key", self.api_key.is_some()),
            ("sample_rate", self.sample_rate.is_some()),
            ("command", self.command.is_some()),
            ("args", self.args.is_some()),
            ("onnxruntime", self.onnxruntime.is_some()),
            ("espeak_library", self.espeak_library.is_some()),
            ("espeak_program", self.espeak_program.is_some()),
            ("speaker", self.speaker.is_some()),
            ("workers", self.workers.is_some()),
            ("queue", self.queue.is_some()),
        ];
        let p = provider.as_str();
        let spec = match p {
            "openai" => {
                only(section, p, &set, &["base_url", "model", "voice", "api_key"])?;
                TtsSpec::OpenAi {
                    base_url: required(section, p, "base_url", self.base_url.as_ref())?,
                    model: self.model.clone().unwrap_or_else(|| "tts-1".into()),
                    voice: self.voice.clone().unwrap_or_else(|| "alloy".into()),
                    api_key: self.api_key.clone(),
                }
            }
            "elevenlabs" => {
                only(
                    section,
                    p,
                    &set,
                    &["base_url", "model", "voice", "api_key", "sample_rate"],
                )?;
                let sample_rate = self.sample_rate.unwrap_or(16_000);
                if !ELEVENLABS_RATES.contains(&sample_rate) {
                    return Err(invalid(format!(
                        "[{section}] sample_rate = {sample_rate}: ElevenLabs offers {ELEVENLABS_RATES:?}"
                    )));
                }
                TtsSpec::ElevenLabs {
                    api_key: required(section, p, "api_key", self.api_key.as_ref())?,
                    voice_id: required(section, p, "voice (the voice id)", self.voice.as_ref())?,
                    model_id: self.model.clone(),
                    base_url: self.base_url.clone(),
                    sample_rate,
                }
            }
            "local" => {
                only(
                    section,
                    p,
                    &set,
                    &[
                        "model",
                        "onnxruntime",
                        "espeak_library",
                        "espeak_program",
                        "speaker",
                        "workers",
                        "queue",
                    ],
                )?;
                let phonemizer = match (&self.espeak_library, &self.espeak_program) {
                    (Some(_), Some(_)) => {
                        return Err(invalid(format!(
                            "[{section}] espeak_library and espeak_program are two phonemizers; \
                             set one"
                        )));
                    }
                    (Some(library), None) => PhonemizerSpec::Library(PathBuf::from(library)),
                    (None, Some(program)) => PhonemizerSpec::Program(program.clone()),
                    (None, None) => crate::local_speech::installed_phonemizer(),
                };
                let found = |m: Option<&String>, kind| match m {
                    Some(m) => Ok(PathBuf::from(m)),
                    None => crate::local_speech::installed_voice(kind)
                        .map_err(|why| invalid(format!("[{section}] provider \"local\": {why}"))),
                };
                TtsSpec::Local {
                    model: found(self.model.as_ref(), crate::local_speech::VoicePart::Voice)?,
                    onnxruntime: found(
                        self.onnxruntime.as_ref(),
                        crate::local_speech::VoicePart::Runtime,
                    )?,
                    phonemizer,
                    speaker: self.speaker,
                    workers: bounded(section, "workers", self.workers.unwrap_or(2), 1, 64)?,
                    queue: bounded(section, "queue", self.queue.unwrap_or(16), 0, 1024)?,
                }
            }
            "command" => {
                only(section, p, &set, &["command", "args"])?;
                TtsSpec::Command {
                    program: required(section, p, "command", self.command.as_ref())?,
                    args: self.args.clone().unwrap_or_default(),
                }
            }
            other => {
                only(section, p, &set, &[])?;
                match other {
                    "espeak" => TtsSpec::Espeak,
                    "tone" => TtsSpec::Tone,
                    _ => TtsSpec::Embedded,
                }
            }
        };
        let fallback = self
            .fallback
            .as_ref()
            .map(|f| f.resolve(&format!("{section}.fallback")).map(Box::new))
            .transpose()?;
        Ok(Plan {
            spec,
            first: limit(self.timeout_secs, DEFAULT_TTS_TIMEOUT_SECS),
            idle: limit(self.idle_timeout_secs, DEFAULT_IDLE_TIMEOUT_SECS),
            fallback,
        })
    }

    fn mask_secrets(&mut self) {
        self.api_key.mask();
        if let Some(f) = &mut self.fallback {
            f.mask_secrets();
        }
    }
}

/// A resolved provider in words, for the start-up log (never a key).
pub trait Describe {
    /// The provider kind and what identifies it (model, host, program).
    fn describe(&self) -> String;
}

impl Describe for LlmSpec {
    fn describe(&self) -> String {
        match self {
            Self::OpenAi {
                base_url, model, ..
            } => format!("openai {model} at {base_url}"),
            Self::Demo => "demo (the offline demo agent)".to_owned(),
            Self::Acp(a) => format!("acp agent `{}`", a.command),
        }
    }
}

impl Describe for AsrSpec {
    fn describe(&self) -> String {
        match self {
            Self::OpenAi {
                base_url, model, ..
            } => format!("openai {model} at {base_url}"),
            Self::Local {
                model,
                workers,
                queue,
                ..
            } => format!(
                "local whisper {} ({workers} workers, queue {queue})",
                model.display()
            ),
            Self::None => "none (spoken turns are answered without a transcript)".to_owned(),
        }
    }
}

impl Describe for TtsSpec {
    fn describe(&self) -> String {
        match self {
            Self::OpenAi {
                base_url,
                model,
                voice,
                ..
            } => format!("openai {model} ({voice}) at {base_url}"),
            Self::ElevenLabs {
                voice_id, base_url, ..
            } => format!(
                "elevenlabs voice {voice_id}{}",
                base_url
                    .as_ref()
                    .map(|u| format!(" at {u}"))
                    .unwrap_or_default()
            ),
            Self::Local {
                model,
                workers,
                phonemizer,
                ..
            } => format!(
                "local piper voice {} ({workers} workers; phonemizer: {phonemizer})",
                model.display()
            ),
            Self::Command { program, .. } => format!("command `{program}`"),
            Self::Espeak => "espeak (espeak-ng)".to_owned(),
            Self::Tone => "tone (placeholder beeps)".to_owned(),
            Self::Embedded => format!("embedded: {}", voxgate_providers::embedded_tts_name()),
        }
    }
}

fn secs(d: Option<Duration>) -> String {
    d.map_or_else(|| "none".to_owned(), |d| format!("{} s", d.as_secs()))
}

impl<S: Describe> Plan<S> {
    /// The provider, its deadlines and its fallback, in words for the start-up log.
    #[must_use]
    pub fn describe(&self) -> String {
        let mut s = format!(
            "{} (deadline {}{})",
            self.spec.describe(),
            secs(self.first),
            if self.idle.is_some() {
                format!(", idle {}", secs(self.idle))
            } else {
                String::new()
            }
        );
        if let Some(f) = &self.fallback {
            s.push_str(", fallback ");
            s.push_str(&f.describe());
        }
        s
    }
}

impl DoorProviders {
    /// One phrase per door with overrides (`xiaozhi door: TTS tone (...)`), for the start-up log;
    /// sections that do not resolve were refused at load time and are skipped.
    #[must_use]
    pub fn describe(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (door, d) in &self.0 {
            let mut parts = Vec::new();
            if let Some(Ok(p)) = d.llm.as_ref().map(|l| l.resolve(&format!("{door}.llm"))) {
                parts.push(format!("LLM {}", p.describe()));
            }
            if let Some(Ok(p)) = d.asr.as_ref().map(|a| a.resolve(&format!("{door}.asr"))) {
                parts.push(format!("ASR {}", p.describe()));
            }
            if let Some(Ok(p)) = d.tts.as_ref().map(|t| t.resolve(&format!("{door}.tts"))) {
                parts.push(format!("TTS {}", p.describe()));
            }
            if !parts.is_empty() {
                out.push(format!("{door} door: {}", parts.join("; ")));
            }
        }
        out
    }
}

/// One door's provider overrides (`[xiaozhi.llm]`, `[xiaozhi.asr]`, `[xiaozhi.tts]`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DoorProviderConfig {
    /// Replaces the server's `[llm]` (and `[acp]`) for this door.
    pub llm: Option<LlmConfig>,
    /// Replaces the server's `[asr]` for this door.
    pub asr: Option<AsrConfig>,
    /// Replaces the server's `[tts]` for this door.
    pub tts: Option<TtsConfig>,
}

impl DoorProviderConfig {
    /// Whether the door overrides nothing.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.llm.is_none() && self.asr.is_none() && self.tts.is_none()
    }
}

/// Every door's overrides, by the door's section name ([`OVERRIDE_DOORS`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DoorProviders(pub std::collections::BTreeMap<String, DoorProviderConfig>);

impl DoorProviders {
    /// The overrides of `door` (`"xiaozhi"`...), if any.
    #[must_use]
    pub fn get(&self, door: &str) -> Option<&DoorProviderConfig> {
        self.0.get(door).filter(|d| !d.is_empty())
    }

    /// Removes the `llm`/`asr`/`tts` tables of every door section from `table` (the door
    /// sections themselves do not know these keys) and parses them.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the section for a table that does not parse.
    pub(crate) fn take(table: &mut toml::Table) -> Result<Self, ConfigError> {
        let mut doors = std::collections::BTreeMap::new();
        for door in OVERRIDE_DOORS {
            let Some(toml::Value::Table(section)) = table.get_mut(door) else {
                continue;
            };
            let mut d = DoorProviderConfig::default();
            if let Some(v) = section.remove("llm") {
                d.llm = Some(parse(door, "llm", v)?);
            }
            if let Some(v) = section.remove("asr") {
                d.asr = Some(parse(door, "asr", v)?);
            }
            if let Some(v) = section.remove("tts") {
                d.tts = Some(parse(door, "tts", v)?);
            }
            if !d.is_empty() {
                doors.insert(door.to_owned(), d);
            }
        }
        Ok(Self(doors))
    }

    /// Puts the overrides back into a serialized configuration (for `--print-config`),
    /// secrets masked.
    pub(crate) fn insert_masked(&self, table: &mut toml::Table) {
        for (door, d) in &self.0 {
            let section = table
                .entry(door.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            let toml::Value::Table(section) = section else {
                continue;
            };
            let mut d = d.clone();
            if let Some(mut l) = d.llm.take() {
                l.mask_secrets();
                insert(section, "llm", &l);
            }
            if let Some(mut a) = d.asr.take() {
                a.mask_secrets();
                insert(section, "asr", &a);
            }
            if let Some(mut t) = d.tts.take() {
                t.mask_secrets();
                insert(section, "tts", &t);
            }
        }
    }

    /// Resolves every override, so a bad one fails at load time.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        for (door, d) in &self.0 {
            if let Some(l) = &d.llm {
                l.resolve(&format!("{door}.llm"))?;
            }
            if let Some(a) = &d.asr {
                a.resolve(&format!("{door}.asr"))?;
            }
            if let Some(t) = &d.tts {
                t.resolve(&format!("{door}.tts"))?;
            }
        }
        Ok(())
    }
}

fn parse<T: serde::de::DeserializeOwned>(
    door: &str,
    kind: &str,
    v: toml::Value,
) -> Result<T, ConfigError> {
    v.try_into()
        .map_err(|e: toml::de::Error| invalid(format!("[{door}.{kind}]: {}", e.message())))
}

fn insert<T: Serialize>(section: &mut toml::Table, key: &str, v: &T) {
    if let Ok(v) = toml::Value::try_from(v) {
        section.insert(key.to_owned(), v);
    }
}

/// Masks the secrets of the server-wide sections for `--print-config`.
pub(crate) fn mask_sections(
    llm: &mut Option<LlmConfig>,
    asr: &mut Option<AsrConfig>,
    tts: &mut Option<TtsConfig>,
) {
    if let Some(l) = llm {
        l.mask_secrets();
    }
    if let Some(a) = asr {
        a.mask_secrets();
    }
    if let Some(t) = tts {
        t.mask_secrets();
    }
}

/// The `VOXGATE_{LLM,ASR,TTS}_*` overrides. `*_BASE_URL`, `*_PROVIDER` and `*_TIMEOUT_SECS`
/// create their section; the others change an existing one.
pub(crate) fn apply_env(
    llm: &mut Option<LlmConfig>,
    asr: &mut Option<AsrConfig>,
    tts: &mut Option<TtsConfig>,
    vars: EnvVars<'_>,
) -> Result<(), ConfigError> {
    if let Some(v) = vars.raw("VOXGATE_LLM_BASE_URL") {
        llm.get_or_insert_with(LlmConfig::default).base_url = Some(v);
    }
    if let Some(v) = vars.raw("VOXGATE_LLM_PROVIDER") {
        llm.get_or_insert_with(LlmConfig::default).provider = Some(v.trim().to_owned());
    }
    if let Some(v) = vars.get::<u64>("VOXGATE_LLM_TIMEOUT_SECS")? {
        llm.get_or_insert_with(LlmConfig::default).timeout_secs = Some(v);
    }
    if let Some(l) = llm {
        vars.optional("VOXGATE_LLM_MODEL", &mut l.model);
        vars.optional("VOXGATE_LLM_API_KEY", &mut l.api_key);
    }
    if let Some(v) = vars.raw("VOXGATE_ASR_BASE_URL") {
        asr.get_or_insert_with(AsrConfig::default).base_url = Some(v);
    }
    if let Some(v) = vars.raw("VOXGATE_ASR_PROVIDER") {
        asr.get_or_insert_with(AsrConfig::default).provider = Some(v.trim().to_owned());
    }
    if let Some(v) = vars.get::<u64>("VOXGATE_ASR_TIMEOUT_SECS")? {
        asr.get_or_insert_with(AsrConfig::default).timeout_secs = Some(v);
    }
    if let Some(a) = asr {
        vars.optional("VOXGATE_ASR_MODEL", &mut a.model);
        vars.optional("VOXGATE_ASR_API_KEY", &mut a.api_key);
    }
    if let Some(v) = vars.raw("VOXGATE_TTS_BASE_URL") {
        tts.get_or_insert_with(TtsConfig::default).base_url = Some(v);
    }
    if let Some(v) = vars.raw("VOXGATE_TTS_PROVIDER") {
        tts.get_or_insert_with(TtsConfig::default).provider = Some(v.trim().to_owned());
    }
    if let Some(v) = vars.get::<u64>("VOXGATE_TTS_TIMEOUT_SECS")? {
        tts.get_or_insert_with(TtsConfig::default).timeout_secs = Some(v);
    }
    if let Some(t) = tts {
        vars.optional("VOXGATE_TTS_MODEL", &mut t.model);
        vars.optional("VOXGATE_TTS_VOICE", &mut t.voice);
        vars.optional("VOXGATE_TTS_API_KEY", &mut t.api_key);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn err(text: &str) -> String {
        match Config::from_toml(text) {
            Err(e) => e.to_string(),
            Ok(c) => panic!("expected an error, got {c:?}"),
        }
    }

    #[test]
    fn every_llm_provider_parses() {
        let c = Config::from_toml(
            "[llm]\nprovider = \"openai\"\nbase_url = \"http://x/v1\"\nmodel = \"m\"\n\
             api_key = \"sk\"\ntimeout_secs = 3\n",
        )
        .unwrap();
        let p = c.llm_plan().unwrap();
        assert_eq!(
            p.spec,
            LlmSpec::OpenAi {
                base_url: "http://x/v1".into(),
                model: "m".into(),
                api_key: Some("sk".into())
            }
        );
        assert_eq!(p.first, Some(Duration::from_secs(3)));
        assert_eq!(p.idle, Some(Duration::from_secs(DEFAULT_IDLE_TIMEOUT_SECS)));
        let c = Config::from_toml("[llm]\nprovider = \"demo\"\n").unwrap();
        assert_eq!(c.llm_plan().unwrap().spec, LlmSpec::Demo);
        let c = Config::from_toml("[llm]\nprovider = \"acp\"\n[llm.acp]\ncommand = \"agent\"\n")
            .unwrap();
        let p = c.llm_plan().unwrap();
        assert!(matches!(p.spec, LlmSpec::Acp(ref a) if a.command == "agent"));
        assert_eq!(p.first, None, "ACP keeps its own limits");
        // The top-level [acp] section is the same as provider = "acp".
        let c = Config::from_toml("[acp]\ncommand = \"agent\"\n").unwrap();
        assert!(matches!(c.llm_plan().unwrap().spec, LlmSpec::Acp(_)));
        // No section: the demo agent with the default deadline.
        let p = Config::default().llm_plan().unwrap();
        assert_eq!(p.spec, LlmSpec::Demo);
        assert_eq!(p.first, Some(Duration::from_secs(DEFAULT_LLM_TIMEOUT_SECS)));
    }

    #[test]
    fn legacy_sections_infer_openai() {
        let c = Config::from_toml(
            "[llm]\nbase_url = \"http://x/v1\"\n[asr]\nbase_url = \"http://a/v1\"\n\
             [tts]\nbase_url = \"http://t/v1\"\nvoice = \"nova\"\n",
        )
        .unwrap();
        assert!(
            matches!(c.llm_plan().unwrap().spec, LlmSpec::OpenAi { ref model, .. } if model == "gpt-4o-mini")
        );
        assert!(
            matches!(c.asr_plan().unwrap().spec, AsrSpec::OpenAi { ref model, .. } if model == "whisper-1")
        );
        assert!(
            matches!(c.tts_plan().unwrap().spec, TtsSpec::OpenAi { ref model, ref voice, .. } if model == "tts-1" && voice == "nova")
        );
    }

    #[test]
    fn every_asr_and_tts_provider_parses() {
        let c = Config::from_toml("[asr]\nprovider = \"none\"\ntimeout_secs = 0\n").unwrap();
        let p = c.asr_plan().unwrap();
        assert_eq!(p.spec, AsrSpec::None);
        assert_eq!(p.first, None, "0 turns the deadline off");
        for (kind, spec) in [
            ("espeak", TtsSpec::Espeak),
            ("tone", TtsSpec::Tone),
            ("embedded", TtsSpec::Embedded),
        ] {
            let c = Config::from_toml(&format!("[tts]\nprovider = \"{kind}\"\n")).unwrap();
            assert_eq!(c.tts_plan().unwrap().spec, spec);
        }
        let c = Config::from_toml(
            "[tts]\nprovider = \"command\"\ncommand = \"piper\"\nargs = [\"-m\", \"v.onnx\"]\n",
        )
        .unwrap();
        assert_eq!(
            c.tts_plan().unwrap().spec,
            TtsSpec::Command {
                program: "piper".into(),
                args: vec!["-m".into(), "v.onnx".into()]
            }
        );
        let c = Config::from_toml(
            "[tts]\nprovider = \"elevenlabs\"\napi_key = \"xi\"\nvoice = \"abc\"\nsample_rate = 24000\n",
        )
        .unwrap();
        assert!(matches!(
            c.tts_plan().unwrap().spec,
            TtsSpec::ElevenLabs { sample_rate: 24_000, ref voice_id, .. } if voice_id == "abc"
        ));
        let printed = c.to_toml();
        assert!(!printed.contains("\"xi\""), "{printed}");
        assert!(
            err("[tts]\nprovider = \"elevenlabs\"\nvoice = \"abc\"\n").contains("needs api_key")
        );
        assert!(
            err("[tts]\nprovider = \"elevenlabs\"\napi_key = \"k\"\nvoice = \"v\"\nsample_rate = 1\n")
                .contains("sample_rate")
        );
    }

    #[test]
    fn unknown_provider_names_the_section_and_the_choices() {
        let e = err("[llm]\nprovider = \"gpt\"\n");
        assert!(e.contains("[llm] provider = \"gpt\""), "{e}");
        assert!(e.contains("openai, demo, acp"), "{e}");
        let e = err("[tts]\nprovider = \"polly\"\n");
        assert!(e.contains("[tts]") && e.contains("elevenlabs"), "{e}");
        let e = err("[xiaozhi.asr]\nprovider = \"vosk\"\n");
        assert!(
            e.contains("[xiaozhi.asr]") && e.contains("openai, local, none"),
            "{e}"
        );
        let e = err("[llm]\nprovider = \"demo\"\nbase_url = \"http://x\"\n");
        assert!(
            e.contains("base_url is not an option of provider \"demo\""),
            "{e}"
        );
        let e = err("[llm]\nprovider = \"openai\"\n");
        assert!(e.contains("needs base_url"), "{e}");
        let e = err(
            "[llm]\nprovider = \"openai\"\nbase_url = \"http://x\"\n[llm.fallback]\nprovider = \"x\"\n",
        );
        assert!(e.contains("[llm.fallback]"), "{e}");
        // An unknown provider from the environment is reported the same way.
        let e = Config::default()
            .apply_env(|k| (k == "VOXGATE_TTS_PROVIDER").then(|| "nope".into()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("[tts] provider = \"nope\""), "{e}");
    }

    #[test]
    fn fallbacks_parse_with_their_own_limits() {
        let c = Config::from_toml(
            "[llm]\nbase_url = \"http://primary/v1\"\ntimeout_secs = 2\n\
             [llm.fallback]\nprovider = \"demo\"\ntimeout_secs = 5\n\
             [asr]\nbase_url = \"http://a/v1\"\n[asr.fallback]\nprovider = \"none\"\n\
             [tts]\nbase_url = \"http://t/v1\"\n[tts.fallback]\nprovider = \"tone\"\n",
        )
        .unwrap();
        let p = c.llm_plan().unwrap();
        assert_eq!(p.first, Some(Duration::from_secs(2)));
        let f = p.fallback.unwrap();
        assert_eq!(f.spec, LlmSpec::Demo);
        assert_eq!(f.first, Some(Duration::from_secs(5)));
        assert_eq!(c.asr_plan().unwrap().fallback.unwrap().spec, AsrSpec::None);
        assert_eq!(c.tts_plan().unwrap().fallback.unwrap().spec, TtsSpec::Tone);
        let back = Config::from_toml(&c.to_toml()).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn door_overrides_parse_print_and_mask() {
        let c = Config::from_toml(
            "[xiaozhi]\nwebsocket_url = \"ws://x/\"\n[xiaozhi.tts]\nprovider = \"tone\"\n\
             [retell.llm]\nbase_url = \"http://r/v1\"\napi_key = \"sk-door\"\n\
             [bridge.asr]\nprovider = \"none\"\n",
        )
        .unwrap();
        assert_eq!(
            c.xiaozhi.websocket_url, "ws://x/",
            "the door's own keys still parse"
        );
        let x = c.door_providers.get("xiaozhi").unwrap();
        assert_eq!(
            x.tts.as_ref().unwrap().resolve("xiaozhi.tts").unwrap().spec,
            TtsSpec::Tone
        );
        assert!(x.llm.is_none());
        assert!(c.door_providers.get("retell").unwrap().llm.is_some());
        assert!(c.door_providers.get("gemini").is_none());
        let printed = c.to_toml();
        assert!(printed.contains("[retell.llm]"), "{printed}");
        assert!(!printed.contains("sk-door"), "{printed}");
        let back = Config::from_toml(&printed).unwrap();
        assert_eq!(back.door_providers.0.len(), 3);
        // Unknown keys inside an override are errors naming the section.
        let e = err("[gemini.llm]\nbase_urll = \"http://x\"\n");
        assert!(e.contains("[gemini.llm]"), "{e}");
    }

    #[test]
    fn start_up_descriptions_name_kinds_deadlines_fallbacks_and_doors() {
        let c = Config::from_toml(
            "[llm]\nbase_url = \"http://x/v1\"\napi_key = \"sk-secret\"\ntimeout_secs = 2\n\
             [llm.fallback]\nprovider = \"demo\"\n[retell.tts]\nprovider = \"tone\"\n",
        )
        .unwrap();
        let llm = c.llm_plan().unwrap().describe();
        assert_eq!(
            llm,
            "openai gpt-4o-mini at http://x/v1 (deadline 2 s, idle 30 s), fallback demo (the \
             offline demo agent) (deadline 10 s, idle 30 s)"
        );
        assert!(!llm.contains("sk-secret"));
        assert_eq!(
            c.door_providers.describe(),
            ["retell door: TTS tone (placeholder beeps) (deadline 10 s, idle 30 s)"]
        );
    }

    #[test]
    fn env_provider_and_timeouts() {
        let mut c = Config::default();
        c.apply_env(|k| match k {
            "VOXGATE_LLM_PROVIDER" => Some("demo".into()),
            "VOXGATE_LLM_TIMEOUT_SECS" => Some("4".into()),
            "VOXGATE_TTS_PROVIDER" => Some("tone".into()),
            "VOXGATE_ASR_TIMEOUT_SECS" => Some("7".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(c.llm_plan().unwrap().first, Some(Duration::from_secs(4)));
        assert_eq!(c.tts_plan().unwrap().spec, TtsSpec::Tone);
        assert_eq!(c.asr_plan().unwrap().first, Some(Duration::from_secs(7)));
        let bad = Config::default()
            .apply_env(|k| (k == "VOXGATE_LLM_TIMEOUT_SECS").then(|| "soon".into()));
        assert!(matches!(
            bad,
            Err(ConfigError::Env {
                name: "VOXGATE_LLM_TIMEOUT_SECS",
                ..
            })
        ));
    }
}
