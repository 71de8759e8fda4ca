//! The in-process speech providers (`provider = "local"`), loaded once per process, and where
//! their models are installed.
//!
//! A Whisper model takes about 150 MB once converted and a Piper voice about 100 MB; the
//! provider sections that name the same model (the server's, a door's override, a fallback)
//! share one loaded copy and one worker pool rather than loading it again.
//!
//! Without the `local-speech` feature the same functions exist and say that this build has no
//! local speech, so configurations and the binary read the same either way.

use std::path::{Path, PathBuf};

/// The part of a Piper voice looked for in the models directory.
#[derive(Debug, Clone, Copy)]
pub(crate) enum VoicePart {
    /// The voice's `.onnx` file.
    Voice,
    /// The ONNX Runtime shared library.
    Runtime,
}

/// The models directory the server reads: `VOXGATE_MODELS_DIR`, else
/// `$XDG_DATA_HOME/voxgate/models`, else `~/.local/share/voxgate/models`.
#[must_use]
pub fn default_models_dir() -> PathBuf {
    #[cfg(feature = "local-speech")]
    {
        voxgate_local_speech::ModelDir::from_env()
            .path()
            .to_path_buf()
    }
    #[cfg(not(feature = "local-speech"))]
    {
        PathBuf::from("models")
    }
}

/// What is installed in a models directory: the Whisper model, the Piper voice and the ONNX
/// Runtime library (each `None` when missing, all `None` without the feature).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Installed {
    pub(crate) whisper: Option<PathBuf>,
    pub(crate) voice: Option<PathBuf>,
    pub(crate) runtime: Option<PathBuf>,
}

/// The one-line install, for messages.
pub(crate) fn install_hint() -> &'static str {
    #[cfg(feature = "local-speech")]
    {
        voxgate_local_speech::INSTALL_HINT
    }
    #[cfg(not(feature = "local-speech"))]
    {
        "rebuild voxgate-server with its default `local-speech` feature"
    }
}

pub(crate) fn installed_in(dir: &Path) -> Installed {
    #[cfg(feature = "local-speech")]
    {
        let f = voxgate_local_speech::ModelDir::new(dir).find();
        Installed {
            whisper: f.whisper,
            voice: f.piper_voice,
            runtime: f.onnxruntime,
        }
    }
    #[cfg(not(feature = "local-speech"))]
    {
        let _ = dir;
        Installed::default()
    }
}

/// The Whisper model installed in the default models directory.
pub(crate) fn installed_whisper() -> Result<PathBuf, String> {
    let dir = default_models_dir();
    installed_in(&dir)
        .whisper
        .ok_or_else(|| missing("a Whisper model", &dir))
}

/// A part of the Piper voice installed in the default models directory.
pub(crate) fn installed_voice(part: VoicePart) -> Result<PathBuf, String> {
    let dir = default_models_dir();
    let found = installed_in(&dir);
    match part {
        VoicePart::Voice => found.voice.ok_or_else(|| missing("a Piper voice", &dir)),
        VoicePart::Runtime => found
            .runtime
            .ok_or_else(|| missing("the ONNX Runtime library", &dir)),
    }
}

fn missing(what: &str, dir: &Path) -> String {
    if cfg!(feature = "local-speech") {
        format!(
            "needs {what} and none is installed in {}; install it with: {}",
            dir.display(),
            install_hint()
        )
    } else {
        format!(
            "this server was built without local speech: {}",
            install_hint()
        )
    }
}

#[cfg(not(feature = "local-speech"))]
pub(crate) fn whisper(
    _model: &Path,
    _workers: usize,
    _queue: usize,
    _language: &str,
) -> Result<std::sync::Arc<dyn voxgate_providers::Asr>, voxgate_providers::ProviderError> {
    Err(voxgate_providers::ProviderError::Config(missing(
        "",
        Path::new(""),
    )))
}

#[cfg(not(feature = "local-speech"))]
pub(crate) fn piper(
    _model: &Path,
    _onnxruntime: &Path,
    _speaker: Option<i64>,
    _workers: usize,
    _queue: usize,
) -> Result<std::sync::Arc<dyn voxgate_providers::Tts>, voxgate_providers::ProviderError> {
    Err(voxgate_providers::ProviderError::Config(missing(
        "",
        Path::new(""),
    )))
}

#[cfg(feature = "local-speech")]
pub(crate) use loaded::{health, piper, whisper};

/// The loaded models' pools for `/health` (an empty list without the feature).
#[cfg(not(feature = "local-speech"))]
pub(crate) fn health() -> serde_json::Value {
    serde_json::Value::Array(Vec::new())
}

#[cfg(feature = "local-speech")]
mod loaded {
    use std::collections::HashMap;
    use std::path::{Path, PathBuf};
    use std::sync::{Arc, Mutex, OnceLock};

    use voxgate_local_speech::{LocalWhisper, PiperConfig, PiperTts, WhisperConfig, WorkerPool};
    use voxgate_providers::{Asr, ProviderError, Tts};

    type AsrKey = (PathBuf, usize, usize, String);
    type TtsKey = (PathBuf, PathBuf, Option<i64>, usize, usize);

    fn asr_cache() -> &'static Mutex<HashMap<AsrKey, Arc<LocalWhisper>>> {
        static CACHE: OnceLock<Mutex<HashMap<AsrKey, Arc<LocalWhisper>>>> = OnceLock::new();
        CACHE.get_or_init(Mutex::default)
    }

    fn tts_cache() -> &'static Mutex<HashMap<TtsKey, Arc<PiperTts>>> {
        static CACHE: OnceLock<Mutex<HashMap<TtsKey, Arc<PiperTts>>>> = OnceLock::new();
        CACHE.get_or_init(Mutex::default)
    }

    /// The Whisper recognizer for these settings, loaded on first use.
    ///
    /// # Errors
    /// [`ProviderError::Config`] naming the model file that is missing or unreadable.
    pub(crate) fn whisper(
        model: &Path,
        workers: usize,
        queue: usize,
        language: &str,
    ) -> Result<Arc<dyn Asr>, ProviderError> {
        let key = (model.to_path_buf(), workers, queue, language.to_owned());
        let mut cache = asr_cache()
            .lock()
            .map_err(|_| ProviderError::Local("model cache poisoned".into()))?;
        if let Some(w) = cache.get(&key) {
            return Ok(Arc::clone(w) as Arc<dyn Asr>);
        }
        let started = std::time::Instant::now();
        let pool = WorkerPool::new("whisper", workers, queue)?;
        let mut config = WhisperConfig::new(model.to_path_buf());
        config.language = language.to_owned();
        let loaded = Arc::new(LocalWhisper::load(config, pool)?);
        tracing::info!(
            model = %model.display(),
            load_ms = started.elapsed().as_secs_f64() * 1e3,
            "local speech recognizer loaded"
        );
        cache.insert(key, Arc::clone(&loaded));
        Ok(loaded)
    }

    /// One entry per loaded model: what it is and its pool's counters (`/health`).
    pub(crate) fn health() -> serde_json::Value {
        let entry = |kind: &str, model: &Path, pool: &WorkerPool| {
            let s = pool.stats();
            serde_json::json!({
                "kind": kind,
                "model": model.display().to_string(),
                "workers": s.workers,
                "queue": s.queue,
                "in_flight": s.in_flight,
                "done": s.done,
                "refused_busy": s.refused,
            })
        };
        let mut out = Vec::new();
        if let Ok(cache) = asr_cache().lock() {
            out.extend(cache.iter().map(|(k, w)| entry("asr", &k.0, w.pool())));
        }
        if let Ok(cache) = tts_cache().lock() {
            out.extend(cache.iter().map(|(k, p)| entry("tts", &k.0, p.pool())));
        }
        serde_json::Value::Array(out)
    }

    /// The Piper voice for these settings, loaded on first use.
    ///
    /// # Errors
    /// [`ProviderError::Config`] or [`ProviderError::Local`] when the voice or the ONNX Runtime
    /// library does not load.
    pub(crate) fn piper(
        model: &Path,
        onnxruntime: &Path,
        speaker: Option<i64>,
        workers: usize,
        queue: usize,
    ) -> Result<Arc<dyn Tts>, ProviderError> {
        let key = (
            model.to_path_buf(),
            onnxruntime.to_path_buf(),
            speaker,
            workers,
            queue,
        );
        let mut cache = tts_cache()
            .lock()
            .map_err(|_| ProviderError::Local("model cache poisoned".into()))?;
        if let Some(p) = cache.get(&key) {
            return Ok(Arc::clone(p) as Arc<dyn Tts>);
        }
        let started = std::time::Instant::now();
        let pool = WorkerPool::new("piper", workers, queue)?;
        let mut config = PiperConfig::new(model.to_path_buf(), onnxruntime.to_path_buf());
        config.speaker = speaker;
        let loaded = Arc::new(PiperTts::new(config, pool)?);
        tracing::info!(
            voice = %model.display(),
            load_ms = started.elapsed().as_secs_f64() * 1e3,
            "local speech synthesizer loaded"
        );
        cache.insert(key, Arc::clone(&loaded));
        Ok(loaded)
    }
}
