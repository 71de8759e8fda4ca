//! Neural speech synthesis with Piper voices: text → IPA phonemes (espeak-ng) → phoneme ids
//! (the voice's `phoneme_id_map`) → a VITS model run by ONNX Runtime → 16-bit PCM.
//!
//! A voice is `<voice>.onnx` plus `<voice>.onnx.json`. ONNX Runtime is loaded at run time from a
//! shared library (`libonnxruntime.so.*`, e.g. from PyPI's `onnxruntime` wheel); one process
//! loads one ONNX Runtime, shared by every voice. The phonemes follow Piper's own phonemizer:
//! espeak-ng's IPA per clause, the clause's punctuation kept, codepoints decomposed (NFD), each
//! codepoint mapped to its ids, `^ _ (id _)* $` around the sentence.
//!
//! espeak-ng runs either in process from its shared library ([`Phonemizer::Library`], through
//! `voxgate-espeak`) or as the `espeak-ng` program once per sentence ([`Phonemizer::Program`]).
//! Both give the clauses `espeak-ng -q --ipa` prints, and the same code below turns them into
//! the sentence's phonemes, so a voice says the same with either.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::time::{Duration, Instant};

use ort::environment::Environment;
use ort::session::{Session, SessionInputValue};
use ort::value::Tensor;
use serde::Deserialize;
use voxgate_providers::{PcmChunk, ProviderError, TimeoutPhase, Tts, TtsRequest, TtsStream};

use crate::models::Phonemizer;
use crate::pool::WorkerPool;

/// Limit on one `espeak-ng` run (one sentence); the child is killed when it elapses.
const ESPEAK_TIMEOUT: Duration = Duration::from_secs(10);
/// How much of espeak-ng's stderr is kept for error messages.
const MAX_STDERR: u64 = 4096;

/// Settings of a Piper voice.
#[derive(Debug, Clone, PartialEq)]
pub struct PiperConfig {
    /// The voice's model, `<voice>.onnx`.
    pub model: PathBuf,
    /// The voice's JSON config; `None` means the model's path with `.json` appended
    /// (`<voice>.onnx.json`), as Piper names it.
    pub config: Option<PathBuf>,
    /// The ONNX Runtime shared library (`libonnxruntime.so.<version>`), loaded at run time.
    /// One process loads one: every voice must name the same file.
    pub onnxruntime: PathBuf,
    /// What turns text into IPA phonemes: espeak-ng's library in process, or the `espeak-ng`
    /// program (the default, looked up on `PATH`). [`crate::InstalledModels::phonemizer`] is
    /// the installed library when there is one.
    pub phonemizer: Phonemizer,
    /// Speaker id of a multi-speaker voice; `None` means speaker 0. Ignored by voices whose
    /// model has no speaker input.
    pub speaker: Option<i64>,
    /// Speed override: the voice's `length_scale` (larger is slower) when `None`.
    pub length_scale: Option<f32>,
    /// ONNX Runtime threads within one synthesis. 1 by default: the worker pool runs
    /// requests side by side, so more threads per request would only oversubscribe the CPU.
    pub intra_threads: usize,
}

impl PiperConfig {
    /// The voice `model` (with its config beside it), run by the ONNX Runtime library
    /// `onnxruntime`, with the `espeak-ng` program from `PATH` as the phonemizer and one thread
    /// per synthesis.
    #[must_use]
    pub fn new(model: PathBuf, onnxruntime: PathBuf) -> Self {
        Self {
            model,
            config: None,
            onnxruntime,
            phonemizer: Phonemizer::default(),
            speaker: None,
            length_scale: None,
            intra_threads: 1,
        }
    }

    /// Where the voice's JSON config is read from.
    fn config_path(&self) -> PathBuf {
        self.config.clone().unwrap_or_else(|| {
            let mut path = self.model.clone().into_os_string();
            path.push(".json");
            PathBuf::from(path)
        })
    }
}

/// A Piper voice behind [`Tts`]: each sentence is one job on the [`WorkerPool`], so synthesis
/// never blocks the async runtime and the first sentence's audio arrives before the rest is
/// synthesized.
///
/// The model is loaded once, in [`PiperTts::new`]; clones of the stream's state share it.
/// `TtsRequest::voice` and `language` are ignored: the voice is the model.
#[derive(Clone)]
pub struct PiperTts {
    voice: Arc<Voice>,
    pool: WorkerPool,
}

impl std::fmt::Debug for PiperTts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PiperTts")
            .field("model", &self.voice.model)
            .field("espeak_voice", &self.voice.espeak_voice)
            .field("sample_rate", &self.voice.sample_rate)
            .field("pool", &self.pool)
            .finish_non_exhaustive()
    }
}

/// Everything a synthesis needs; shared by the pool jobs.
struct Voice {
    model: PathBuf,
    /// One session for the voice: creating one costs a second and tens of megabytes, and
    /// `Session::run` needs `&mut`, so runs take turns.
    session: Mutex<Session>,
    ids: PhonemeIds,
    phonemes: Phonemes,
    espeak_voice: String,
    sample_rate: u32,
    /// `[noise_scale, length_scale, noise_w]`, the model's `scales` input.
    scales: [f32; 3],
    /// The `sid` input, for models that have one.
    speaker: Option<i64>,
}

/// The phonemizer of a loaded voice.
enum Phonemes {
    /// espeak-ng in process (one per process, shared by every voice).
    Library(voxgate_espeak::Espeak),
    /// The program, run per sentence.
    Program(String),
}

impl Phonemes {
    /// Starts `choice`: loads espeak-ng's library (once per process) or takes the program.
    fn start(choice: Phonemizer) -> Result<Self, ProviderError> {
        match choice {
            Phonemizer::Program(program) => {
                tracing::info!(
                    program,
                    "Piper phonemizer: the espeak-ng program, one run per sentence"
                );
                Ok(Self::Program(program))
            }
            Phonemizer::Library(library) => {
                let data = voxgate_espeak::data_beside(&library);
                let espeak =
                    voxgate_espeak::Espeak::load(&library, data.as_deref()).map_err(|e| {
                        let message = format!("the espeak-ng library as phonemizer: {e}");
                        match e {
                            voxgate_espeak::EspeakError::Init { .. }
                            | voxgate_espeak::EspeakError::Broken(_) => {
                                ProviderError::Local(message)
                            }
                            _ => ProviderError::Config(message),
                        }
                    })?;
                tracing::info!(
                    library = %espeak.library().display(),
                    data = %espeak.data().map_or_else(|| "espeak-ng's default".into(), |d| d.display().to_string()),
                    version = espeak.version(),
                    "Piper phonemizer: the espeak-ng library, in process"
                );
                Ok(Self::Library(espeak))
            }
        }
    }

    /// The clauses of `sentence` as `espeak-ng -q --ipa` prints them, cleaned
    /// ([`clean_lines`]).
    fn clauses(&self, voice: &str, sentence: &str) -> Result<Vec<String>, ProviderError> {
        match self {
            Self::Program(program) => run_espeak(program, voice, sentence, ESPEAK_TIMEOUT),
            Self::Library(espeak) => espeak
                .phonemize(voice, sentence)
                .map(|lines| clean_lines(lines.iter().map(String::as_str)))
                .map_err(|e| match e {
                    voxgate_espeak::EspeakError::Voice { .. } => {
                        ProviderError::Config(format!("espeak-ng: {e}"))
                    }
                    voxgate_espeak::EspeakError::TimedOut(after) => ProviderError::Timeout {
                        phase: TimeoutPhase::Total,
                        after,
                    },
                    e => ProviderError::Local(format!("espeak-ng: {e}")),
                }),
        }
    }
}

/// The voice's JSON config (`<voice>.onnx.json`), the fields synthesis uses.
#[derive(Debug, Deserialize)]
struct VoiceFile {
    audio: AudioSection,
    espeak: EspeakSection,
    #[serde(default)]
    inference: InferenceSection,
    phoneme_id_map: HashMap<String, Vec<i64>>,
    #[serde(default)]
    num_speakers: u32,
    #[serde(default)]
    phoneme_type: Option<String>,
}

#[derive(Debug, Deserialize)]
struct AudioSection {
    sample_rate: u32,
}

#[derive(Debug, Deserialize)]
struct EspeakSection {
    voice: String,
}

/// Piper's defaults when the config leaves them out.
#[derive(Debug, Deserialize)]
#[serde(default)]
struct InferenceSection {
    noise_scale: f32,
    length_scale: f32,
    noise_w: f32,
}

impl Default for InferenceSection {
    fn default() -> Self {
        Self {
            noise_scale: 0.667,
            length_scale: 1.0,
            noise_w: 0.8,
        }
    }
}

/// The ONNX Runtime environment of the process, with the library it was loaded from. ort
/// allows one environment per process, and the library cannot be unloaded, so the first
/// successful load is kept for good.
static ORT: Mutex<Option<(PathBuf, Environment)>> = Mutex::new(None);

/// The process's ONNX Runtime environment, loading `library` the first time.
fn ort_environment(library: &Path) -> Result<Environment, ProviderError> {
    // A bare file name is left to the dynamic loader's search path.
    if library.components().count() > 1 && !library.is_file() {
        return Err(ProviderError::Config(format!(
            "the ONNX Runtime library {} does not exist",
            library.display()
        )));
    }
    let wanted = library
        .canonicalize()
        .unwrap_or_else(|_| library.to_path_buf());
    let mut slot = ORT.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((loaded, env)) = slot.as_ref() {
        if *loaded != wanted {
            return Err(ProviderError::Config(format!(
                "ONNX Runtime is already loaded from {}; a process can load only one, so {} \
                 cannot be used too",
                loaded.display(),
                library.display()
            )));
        }
        return Ok(env.clone());
    }
    let env = ort::init_from(&wanted)
        .map_err(|e| ProviderError::Local(format!("cannot load ONNX Runtime: {e}")))?
        .with_name("voxgate")
        .with_telemetry(false)
        .build()
        .map_err(|e| {
            ProviderError::Local(format!(
                "cannot start ONNX Runtime from {}: {e}",
                wanted.display()
            ))
        })?;
    tracing::info!(library = %wanted.display(), "ONNX Runtime loaded");
    *slot = Some((wanted, env.clone()));
    Ok(env)
}

impl PiperTts {
    /// Loads the voice: reads its JSON config, loads ONNX Runtime (once per process), starts
    /// the phonemizer (espeak-ng's library, once per process, or the program), creates the
    /// model's session and synthesizes one word to check that the phonemizer and the model
    /// work (and to make the first real request as fast as the next ones). Blocks for one to a
    /// few seconds (ONNX Runtime's graph optimization); call it at start-up.
    ///
    /// # Errors
    /// [`ProviderError::Config`] for a missing or invalid file (the message names it), a voice
    /// this crate cannot phonemize or a speaker the voice lacks; [`ProviderError::Local`] when
    /// ONNX Runtime, espeak-ng's library or the model fails; [`ProviderError::Command`] when the
    /// `espeak-ng` program cannot run.
    pub fn new(config: PiperConfig, pool: WorkerPool) -> Result<Self, ProviderError> {
        let config_path = config.config_path();
        let text = std::fs::read_to_string(&config_path).map_err(|e| {
            ProviderError::Config(format!(
                "cannot read the Piper voice config {}: {e}",
                config_path.display()
            ))
        })?;
        let file: VoiceFile = serde_json::from_str(&text).map_err(|e| {
            ProviderError::Config(format!(
                "invalid Piper voice config {}: {e}",
                config_path.display()
            ))
        })?;
        if let Some(kind) = file.phoneme_type.as_deref()
            && kind != "espeak"
        {
            return Err(ProviderError::Config(format!(
                "{}: phoneme_type {kind:?} is not supported (only \"espeak\")",
                config_path.display()
            )));
        }
        let ids = PhonemeIds::new(file.phoneme_id_map)
            .map_err(|e| ProviderError::Config(format!("{}: {e}", config_path.display())))?;
        let speakers = file.num_speakers.max(1);
        let speaker = config.speaker.unwrap_or(0);
        if speaker < 0 || speaker >= i64::from(speakers) {
            return Err(ProviderError::Config(format!(
                "speaker {speaker} does not exist: {} has {speakers} speaker(s)",
                config.model.display()
            )));
        }
        if !config.model.is_file() {
            return Err(ProviderError::Config(format!(
                "the Piper model {} does not exist",
                config.model.display()
            )));
        }

        let phonemes = Phonemes::start(config.phonemizer)?;
        let env = ort_environment(&config.onnxruntime)?;
        let started = Instant::now();
        let session = load_session(&env, &config.model, config.intra_threads)?;
        let has_sid = session.inputs().iter().any(|i| i.name() == "sid");
        tracing::info!(
            model = %config.model.display(),
            millis = started.elapsed().as_millis(),
            "Piper voice loaded"
        );

        let inference = file.inference;
        let voice = Voice {
            model: config.model,
            session: Mutex::new(session),
            ids,
            phonemes,
            espeak_voice: file.espeak.voice,
            sample_rate: file.audio.sample_rate,
            scales: [
                inference.noise_scale,
                config.length_scale.unwrap_or(inference.length_scale),
                inference.noise_w,
            ],
            speaker: has_sid.then_some(speaker),
        };
        voice.synthesize_sentence("Hi.")?;
        Ok(Self {
            voice: Arc::new(voice),
            pool,
        })
    }

    /// The pool the syntheses run on.
    #[must_use]
    pub fn pool(&self) -> &WorkerPool {
        &self.pool
    }

    /// The sample rate of the voice's audio (22050 Hz for Piper's `medium` voices).
    #[must_use]
    pub fn sample_rate(&self) -> u32 {
        self.voice.sample_rate
    }

    /// Synthesizes all of `text` on the calling thread, sentence after sentence, into one
    /// chunk (empty for text with nothing to say). This blocks for hundreds of milliseconds per
    /// sentence: call it from a worker thread (the [`Tts`] stream runs each sentence as a
    /// [`WorkerPool`] job) or a benchmark, never on the async runtime.
    ///
    /// # Errors
    /// [`ProviderError::Command`] / [`ProviderError::Timeout`] when the `espeak-ng` program
    /// fails; [`ProviderError::Local`] when espeak-ng's library or inference fails.
    pub fn synthesize_blocking(&self, text: &str) -> Result<PcmChunk, ProviderError> {
        let mut samples = Vec::new();
        for sentence in split_sentences(text) {
            if let Some(chunk) = self.voice.synthesize_sentence(&sentence)? {
                samples.extend_from_slice(&chunk.samples);
            }
        }
        Ok(PcmChunk {
            sample_rate: self.voice.sample_rate,
            samples,
        })
    }
}

/// Creates the model's session with `intra_threads` threads per run.
fn load_session(
    env: &Environment,
    model: &Path,
    intra_threads: usize,
) -> Result<Session, ProviderError> {
    let fail = |e: &dyn std::fmt::Display| {
        ProviderError::Local(format!(
            "cannot load the Piper model {}: {e}",
            model.display()
        ))
    };
    let threads = intra_threads.max(1);
    let mut builder = Session::builder(env)
        .map_err(|e| fail(&e))?
        .with_intra_threads(threads)
        .map_err(|e| fail(&e))?;
    if threads > 1 {
        // Spinning threads would burn the CPU the other workers need between runs.
        builder = builder
            .with_intra_op_spinning(false)
            .map_err(|e| fail(&e))?;
    }
    builder.commit_from_file(model).map_err(|e| fail(&e))
}

impl Voice {
    /// One sentence to audio: `None` when espeak-ng finds nothing to say in it.
    fn synthesize_sentence(&self, sentence: &str) -> Result<Option<PcmChunk>, ProviderError> {
        let clauses = self.phonemes.clauses(&self.espeak_voice, sentence)?;
        let Some(phonemes) = sentence_phonemes(sentence, &clauses) else {
            return Ok(None);
        };
        let (ids, dropped) = self.ids.encode(&phonemes);
        if dropped > 0 {
            tracing::debug!(
                dropped,
                phonemes,
                "phonemes missing from the voice's map were left out"
            );
        } else {
            tracing::trace!(phonemes, "phonemized");
        }
        let audio = self.infer(ids)?;
        Ok(Some(PcmChunk {
            sample_rate: self.sample_rate,
            samples: to_pcm(&audio),
        }))
    }

    /// Runs the model on one sentence's ids; the audio as floats in about [-1, 1].
    fn infer(&self, ids: Vec<i64>) -> Result<Vec<f32>, ProviderError> {
        let fail =
            |e: &dyn std::fmt::Display| ProviderError::Local(format!("Piper inference: {e}"));
        let len = i64::try_from(ids.len()).map_err(|e| fail(&e))?;
        let mut inputs: Vec<(std::borrow::Cow<'_, str>, SessionInputValue<'_>)> = ort::inputs! {
            "input" => Tensor::from_array(([1, ids.len()], ids)).map_err(|e| fail(&e))?,
            "input_lengths" => Tensor::from_array(([1usize], vec![len])).map_err(|e| fail(&e))?,
            "scales" => Tensor::from_array(([3usize], self.scales.to_vec())).map_err(|e| fail(&e))?,
        };
        if let Some(sid) = self.speaker {
            let sid = Tensor::from_array(([1usize], vec![sid])).map_err(|e| fail(&e))?;
            inputs.push(("sid".into(), sid.into()));
        }
        // A panic while locked cannot leave the session half-updated: `run` is one FFI call.
        let mut session = self.session.lock().unwrap_or_else(PoisonError::into_inner);
        let outputs = session.run(inputs).map_err(|e| fail(&e))?;
        let Some(audio) = outputs.values().next() else {
            return Err(fail(&"the model has no output"));
        };
        let (_, samples) = audio.try_extract_tensor::<f32>().map_err(|e| fail(&e))?;
        Ok(samples.to_vec())
    }
}

impl Tts for PiperTts {
    fn synthesize(&self, request: TtsRequest) -> TtsStream {
        let sentences = split_sentences(&request.text);
        if sentences.is_empty() {
            return Box::pin(futures::stream::empty());
        }
        let voice = Arc::clone(&self.voice);
        let pool = self.pool.clone();
        let state = (sentences.into_iter(), false);
        Box::pin(futures::stream::unfold(
            state,
            move |(mut sentences, failed)| {
                let voice = Arc::clone(&voice);
                let pool = pool.clone();
                async move {
                    if failed {
                        return None;
                    }
                    // Sentences with nothing to say produce no chunk; go on to the next one.
                    loop {
                        let sentence = sentences.next()?;
                        let voice = Arc::clone(&voice);
                        match pool.run(move || voice.synthesize_sentence(&sentence)).await {
                            Ok(Ok(Some(chunk))) => return Some((Ok(chunk), (sentences, false))),
                            Ok(Ok(None)) => {}
                            Ok(Err(e)) | Err(e) => return Some((Err(e), (sentences, true))),
                        }
                    }
                }
            },
        ))
    }
}

/// The voice's `phoneme_id_map`, by codepoint.
#[derive(Debug)]
struct PhonemeIds {
    map: HashMap<char, Vec<i64>>,
    pad: Vec<i64>,
    bos: Vec<i64>,
    eos: Vec<i64>,
}

impl PhonemeIds {
    /// Keeps the single-codepoint entries (Piper maps codepoint by codepoint); the pad `_`,
    /// start `^` and end `$` entries must be there.
    fn new(map: HashMap<String, Vec<i64>>) -> Result<Self, String> {
        let mut by_char = HashMap::with_capacity(map.len());
        for (key, ids) in map {
            let mut chars = key.chars();
            if let (Some(c), None) = (chars.next(), chars.next()) {
                by_char.insert(c, ids);
            }
        }
        let take = |c: char| {
            by_char
                .get(&c)
                .cloned()
                .ok_or_else(|| format!("phoneme_id_map lacks {c:?}"))
        };
        let (pad, bos, eos) = (take('_')?, take('^')?, take('$')?);
        Ok(Self {
            map: by_char,
            pad,
            bos,
            eos,
        })
    }

    /// `^ _ (ids _)* $` for the phonemes' codepoints after decomposition; also the number of
    /// codepoints left out because the map lacks them.
    fn encode(&self, phonemes: &str) -> (Vec<i64>, usize) {
        let mut ids = Vec::with_capacity(2 * phonemes.len() + 3);
        ids.extend_from_slice(&self.bos);
        ids.extend_from_slice(&self.pad);
        let mut dropped = 0;
        let mut push = |c: char| match self.map.get(&c) {
            Some(id) => {
                ids.extend_from_slice(id);
                ids.extend_from_slice(&self.pad);
            }
            None => dropped += 1,
        };
        for c in phonemes.chars() {
            match decompose(c) {
                Some((base, mark)) => {
                    push(base);
                    push(mark);
                }
                None => push(c),
            }
        }
        ids.extend_from_slice(&self.eos);
        (ids, dropped)
    }
}

/// The canonical decomposition (NFD) of the precomposed letters espeak-ng's IPA can contain:
/// Piper decomposes phonemes before mapping them, so `ç` is `c` + U+0327 to its voices.
fn decompose(c: char) -> Option<(char, char)> {
    const TILDE: char = '\u{303}';
    Some(match c {
        'ç' => ('c', '\u{327}'),
        'ã' => ('a', TILDE),
        'ẽ' => ('e', TILDE),
        'ĩ' => ('i', TILDE),
        'õ' => ('o', TILDE),
        'ũ' => ('u', TILDE),
        'ỹ' => ('y', TILDE),
        'ñ' => ('n', TILDE),
        _ => return None,
    })
}

/// Characters that end a sentence when whitespace (or the end) follows.
fn is_terminator(c: char) -> bool {
    matches!(c, '.' | '!' | '?' | ';' | ':' | '…')
}

/// Characters that may follow a sentence's punctuation and belong to that sentence.
fn is_closer(c: char) -> bool {
    matches!(c, '"' | '\'' | ')' | ']' | '}' | '”' | '’' | '»')
}

/// The longest piece synthesized at once, in characters. The model's memory and time grow
/// with its input, and a caller may pass any text: longer sentences are cut at a space.
const MAX_SENTENCE_CHARS: usize = 400;

/// Cuts `piece` into parts of at most [`MAX_SENTENCE_CHARS`], at the last space before the
/// limit (or at the limit when there is none).
fn bounded(piece: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut rest = piece;
    while rest.chars().count() > MAX_SENTENCE_CHARS {
        let limit = rest
            .char_indices()
            .nth(MAX_SENTENCE_CHARS)
            .map_or(rest.len(), |(i, _)| i);
        let cut = rest[..limit]
            .rfind(char::is_whitespace)
            .filter(|c| *c > 0)
            .unwrap_or(limit);
        parts.push(rest[..cut].trim());
        rest = rest[cut..].trim_start();
    }
    parts.push(rest);
    parts
}

/// Splits text into sentences at `. ! ? ; :` followed by whitespace and at newlines, so each
/// can be synthesized (and heard) before the next. A period followed by a lowercase word
/// (`e.g. this`) does not end a sentence. Pieces with nothing to pronounce are left out, and
/// longer than [`MAX_SENTENCE_CHARS`] are cut.
fn split_sentences(text: &str) -> Vec<String> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let mut sentences = Vec::new();
    let mut push = |piece: &str| {
        for part in bounded(piece.trim()) {
            if part.chars().any(is_pronounceable) {
                sentences.push(part.to_owned());
            }
        }
    };
    let mut start = 0;
    let mut i = 0;
    while let Some(&(pos, c)) = chars.get(i) {
        if c == '\n' {
            push(&text[start..pos]);
            start = pos + 1;
            i += 1;
            continue;
        }
        if !is_terminator(c) {
            i += 1;
            continue;
        }
        // The whole run of punctuation and closing quotes stays with the sentence.
        let mut only_periods = true;
        let mut j = i;
        while let Some(&(_, d)) = chars.get(j) {
            if is_terminator(d) {
                only_periods &= d == '.';
            } else if !is_closer(d) {
                break;
            }
            j += 1;
        }
        let end = chars.get(j).map_or(text.len(), |&(p, _)| p);
        let next_word = text[end..].trim_start().chars().next();
        let ends = match chars.get(j) {
            None => true,
            Some(&(_, d)) if d.is_whitespace() => {
                !(only_periods && next_word.is_some_and(char::is_lowercase))
            }
            Some(_) => false,
        };
        if ends {
            push(&text[start..end]);
            start = end;
        }
        i = j;
    }
    push(&text[start..]);
    sentences
}

/// Whether `c` is something espeak-ng would say, rather than punctuation or space.
fn is_pronounceable(c: char) -> bool {
    !c.is_whitespace()
        && !c.is_ascii_punctuation()
        && !matches!(c, '…' | '“' | '”' | '‘' | '’' | '«' | '»' | '–' | '—')
}

/// The punctuation that ends `text` (past closing quotes), as Piper puts it after the phonemes.
fn final_punctuation(text: &str) -> Option<char> {
    text.trim_end()
        .chars()
        .rev()
        .find(|&c| !is_closer(c))
        .filter(|c| matches!(c, '.' | ',' | '!' | '?' | ';' | ':'))
}

/// How many clause breaks espeak-ng makes inside a sentence: commas followed (past closing
/// quotes) by whitespace. The sentence's other punctuation ends it.
fn inner_commas(text: &str) -> usize {
    let chars: Vec<char> = text.trim_end().chars().collect();
    chars
        .iter()
        .enumerate()
        .filter(|&(i, &c)| {
            c == ',' && {
                let after = chars[i + 1..].iter().find(|&&d| !is_closer(d));
                after.is_some_and(|d| d.is_whitespace())
            }
        })
        .count()
}

/// The sentence's phonemes as Piper writes them, from espeak-ng's clauses (one per output
/// line): clauses joined by `", "` and the sentence's final punctuation appended. When the
/// clauses do not match the sentence's commas one for one (espeak-ng split elsewhere), they are
/// joined by spaces. `None` when there are no phonemes at all.
fn sentence_phonemes(sentence: &str, clauses: &[String]) -> Option<String> {
    if clauses.is_empty() {
        return None;
    }
    let separator = if clauses.len() == inner_commas(sentence) + 1 {
        ", "
    } else {
        tracing::debug!(
            clauses = clauses.len(),
            sentence,
            "espeak-ng's clauses do not match the commas; joining them with spaces"
        );
        " "
    };
    let mut phonemes = clauses.join(separator);
    if let Some(p) = final_punctuation(sentence) {
        phonemes.push(p);
    }
    Some(phonemes)
}

/// espeak-ng's clause lines, cleaned ([`clean_clause`]), empty clauses left out: the same for
/// the program's output lines and the library's clauses.
fn clean_lines<'a>(lines: impl Iterator<Item = &'a str>) -> Vec<String> {
    lines.map(clean_clause).filter(|c| !c.is_empty()).collect()
}

/// One clause line of espeak-ng's output without its language-switch flags (`(en)`, `(fr)`,
/// put around words it reads in another language).
fn clean_clause(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(open) = rest.find('(') {
        out.push_str(&rest[..open]);
        match rest[open..].find(')') {
            Some(close) => rest = &rest[open + close + 1..],
            None => {
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out.trim().to_owned()
}

/// Kills the child when dropped, so an early return or timeout never leaves it running.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Runs `espeak-ng -q --ipa -v <voice> --stdin` on `text`: its IPA phonemes, one clause per
/// output line, without language flags, empty clauses left out. Blocking; killed after
/// `timeout`.
fn run_espeak(
    program: &str,
    voice: &str,
    text: &str,
    timeout: Duration,
) -> Result<Vec<String>, ProviderError> {
    let deadline = Instant::now() + timeout;
    let child = Command::new(program)
        .args(["-q", "--ipa", "-v", voice, "--stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| ProviderError::Command(format!("cannot start {program}: {e}")))?;
    let mut child = KillOnDrop(child);
    let (Some(mut stdin), Some(mut stdout), Some(stderr)) = (
        child.0.stdin.take(),
        child.0.stdout.take(),
        child.0.stderr.take(),
    ) else {
        return Err(ProviderError::Command(format!(
            "{program}: child pipes missing"
        )));
    };
    let thread_error =
        |e: std::io::Error| ProviderError::Local(format!("cannot start a thread: {e}"));
    // Input and output go through their own threads: neither pipe can then block the other,
    // and the wait for output can time out.
    let text = text.to_owned();
    std::thread::Builder::new()
        .name("espeak-in".into())
        .spawn(move || {
            let _ = stdin.write_all(text.as_bytes());
        })
        .map_err(thread_error)?;
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("espeak-out".into())
        .spawn(move || {
            let mut out = Vec::new();
            let _ = tx.send(stdout.read_to_end(&mut out).map(|_| out));
        })
        .map_err(thread_error)?;
    let timed_out = || ProviderError::Timeout {
        phase: TimeoutPhase::Total,
        after: timeout,
    };
    let out = match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => {
            return Err(ProviderError::Command(format!(
                "reading {program}'s output: {e}"
            )));
        }
        Err(mpsc::RecvTimeoutError::Timeout) => return Err(timed_out()),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            return Err(ProviderError::Command(format!(
                "{program}'s output was lost"
            )));
        }
    };
    let status = wait_until(&mut child.0, deadline)
        .map_err(|e| ProviderError::Command(format!("waiting for {program}: {e}")))?
        .ok_or_else(timed_out)?;
    if !status.success() {
        let mut message = String::new();
        let _ = stderr.take(MAX_STDERR).read_to_string(&mut message);
        return Err(ProviderError::Command(format!(
            "{program} -v {voice} exited with {status}: {}",
            message.trim()
        )));
    }
    Ok(clean_lines(String::from_utf8_lossy(&out).lines()))
}

/// Waits for the child's exit until `deadline`; `None` when it has not exited by then.
fn wait_until(child: &mut Child, deadline: Instant) -> std::io::Result<Option<ExitStatus>> {
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The model's float audio as 16-bit PCM: scaled down to a peak of 1 when it exceeds it (as
/// Piper does, rather than clipping), non-finite samples silenced.
fn to_pcm(audio: &[f32]) -> Vec<i16> {
    let peak = audio
        .iter()
        .filter(|x| x.is_finite())
        .fold(0.0f32, |peak, x| peak.max(x.abs()));
    let gain = if peak > 1.0 { 32767.0 / peak } else { 32767.0 };
    audio
        .iter()
        .map(|&x| {
            let x = if x.is_finite() { x * gain } else { 0.0 };
            // In range by construction (|x| <= 32767); the clamp guards rounding.
            #[allow(clippy::cast_possible_truncation)]
            let sample = x.round().clamp(-32767.0, 32767.0) as i16;
            sample
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny_map() -> PhonemeIds {
        let map = [
            ("_", 0),
            ("^", 1),
            ("$", 2),
            (" ", 3),
            (",", 8),
            ("?", 13),
            ("c", 16),
            ("h", 20),
            ("i", 21),
            ("ˈ", 120),
            ("\u{327}", 140),
            ("aɪ", 161),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), vec![v]))
        .collect();
        PhonemeIds::new(map).unwrap()
    }

    #[test]
    fn phonemes_map_to_ids_with_pads_between() {
        let ids = tiny_map();
        assert_eq!(
            ids.encode("hˈi?"),
            (vec![1, 0, 20, 0, 120, 0, 21, 0, 13, 0, 2], 0)
        );
        assert_eq!(ids.encode(""), (vec![1, 0, 2], 0));
    }

    #[test]
    fn unknown_phonemes_are_dropped_and_counted() {
        let ids = tiny_map();
        // 'x' and 'ʊ' are not in the map; the two-codepoint key "aɪ" is never used.
        assert_eq!(ids.encode("hx ʊi"), (vec![1, 0, 20, 0, 3, 0, 21, 0, 2], 2));
        assert_eq!(ids.encode("aɪ").1, 2);
    }

    #[test]
    fn precomposed_letters_are_decomposed() {
        let ids = tiny_map();
        assert_eq!(ids.encode("ç"), (vec![1, 0, 16, 0, 140, 0, 2], 0));
    }

    #[test]
    fn maps_without_pad_start_or_end_are_refused() {
        let map: HashMap<String, Vec<i64>> =
            [("^".to_owned(), vec![1]), ("$".to_owned(), vec![2])].into();
        let err = PhonemeIds::new(map).unwrap_err();
        assert!(err.contains("'_'"), "{err}");
    }

    #[test]
    fn overlong_sentences_are_cut_at_spaces() {
        let long = "word ".repeat(200);
        let parts = split_sentences(&long);
        assert!(parts.len() >= 3, "{}", parts.len());
        assert!(
            parts
                .iter()
                .all(|p| p.chars().count() <= MAX_SENTENCE_CHARS)
        );
        assert_eq!(parts.join(" "), long.trim());
        // No space at all: cut at the limit, nothing lost.
        let solid = "é".repeat(MAX_SENTENCE_CHARS * 2 + 5);
        let parts = split_sentences(&solid);
        assert_eq!(parts.len(), 3);
        assert_eq!(parts.concat(), solid);
    }

    #[test]
    fn text_splits_into_sentences() {
        assert_eq!(
            split_sentences("Hello, how are you? I'm fine!  Thanks; really: yes.\nNew line"),
            [
                "Hello, how are you?",
                "I'm fine!",
                "Thanks;",
                "really:",
                "yes.",
                "New line"
            ]
        );
        assert_eq!(
            split_sentences("Pi is 3.14, e.g. roughly. \"Quoted.\" Then (this.) End"),
            [
                "Pi is 3.14, e.g. roughly.",
                "\"Quoted.\"",
                "Then (this.)",
                "End"
            ]
        );
        assert_eq!(
            split_sentences("Wait... What?! No"),
            ["Wait...", "What?!", "No"]
        );
        assert_eq!(split_sentences("Mr. Smith"), ["Mr.", "Smith"]);
        assert_eq!(split_sentences("time 10:30 ok"), ["time 10:30 ok"]);
    }

    #[test]
    fn text_without_words_has_no_sentences() {
        assert!(split_sentences("").is_empty());
        assert!(split_sentences("  \n\t ").is_empty());
        assert!(split_sentences("... ?! -- \"\"").is_empty());
    }

    #[test]
    fn clauses_get_piper_punctuation() {
        let clauses = |c: &[&str]| c.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            sentence_phonemes(
                "Hello, how are you today?",
                &clauses(&["həlˈoʊ", "hˌaʊ ɑːɹ juː tədˈeɪ"])
            )
            .as_deref(),
            Some("həlˈoʊ, hˌaʊ ɑːɹ juː tədˈeɪ?")
        );
        // A closing quote after the comma still breaks the clause.
        assert_eq!(
            sentence_phonemes("\"Hi,\" she said.", &clauses(&["hˈaɪ", "ʃiː sˈɛd"])).as_deref(),
            Some("hˈaɪ, ʃiː sˈɛd.")
        );
        // espeak-ng split where there is no comma: spaces, and no comma invented.
        assert_eq!(
            sentence_phonemes("one two", &clauses(&["wˈʌn", "tˈuː"])).as_deref(),
            Some("wˈʌn tˈuː")
        );
        assert_eq!(sentence_phonemes("...", &[]), None);
    }

    #[test]
    fn language_flags_are_removed() {
        assert_eq!(
            clean_clause("bɔ̃ʒˈuʁ lə- (en)wiːkˈɛnd(fr) "),
            "bɔ̃ʒˈuʁ lə- wiːkˈɛnd"
        );
        assert_eq!(clean_clause("abc (unclosed"), "abc");
    }

    #[test]
    fn float_audio_becomes_clipped_free_pcm() {
        assert_eq!(
            to_pcm(&[0.0, 0.5, -0.5, 1.0, -1.0]),
            [0, 16384, -16384, 32767, -32767]
        );
        // A peak above 1 scales everything down rather than clipping.
        assert_eq!(to_pcm(&[2.0, -1.0, 0.5]), [32767, -16384, 8192]);
        assert_eq!(to_pcm(&[f32::NAN, f32::INFINITY, 0.25]), [0, 0, 8192]);
        assert!(to_pcm(&[]).is_empty());
    }

    #[test]
    fn config_path_defaults_to_the_model_plus_json() {
        let mut config = PiperConfig::new("/v/en_US-joe-medium.onnx".into(), "/lib/ort.so".into());
        assert_eq!(
            config.config_path(),
            Path::new("/v/en_US-joe-medium.onnx.json")
        );
        config.config = Some("/other.json".into());
        assert_eq!(config.config_path(), Path::new("/other.json"));
        assert_eq!(config.intra_threads, 1);
        assert_eq!(config.phonemizer, Phonemizer::Program("espeak-ng".into()));
    }

    #[test]
    fn espeak_phonemizes_when_installed() {
        if Command::new("espeak-ng").arg("--version").output().is_err() {
            eprintln!("espeak-ng is not installed; skipped");
            return;
        }
        let clauses = run_espeak(
            "espeak-ng",
            "en-us",
            "Hello, how are you today?",
            ESPEAK_TIMEOUT,
        )
        .unwrap();
        assert_eq!(clauses.len(), 2, "{clauses:?}");
        let err = run_espeak("voxgate-no-such-espeak", "en-us", "hi", ESPEAK_TIMEOUT).unwrap_err();
        assert!(matches!(err, ProviderError::Command(_)), "{err:?}");
        let err = run_espeak("espeak-ng", "xx-no-such-voice", "hi", ESPEAK_TIMEOUT).unwrap_err();
        assert!(matches!(err, ProviderError::Command(_)), "{err:?}");
    }

    /// Sentences with what makes phonemizers differ: punctuation of every kind, numbers,
    /// money, dates and times, abbreviations, several clauses, quotes, other languages' words.
    const COMPARED: [&str; 28] = [
        "Hello, how are you today?",
        "I'm fine, thanks!",
        "What?",
        "Wait... What?! No.",
        "Pi is 3.14, e.g. roughly.",
        "Mr. Smith paid $12.50 on 3/4/2024 at 10:30 am.",
        "Dr. Jones, the C.E.O. of ACME Inc., said: \"no\"; then left...",
        "It's 1,234,567 people; wow!",
        "One, two, three, four, five.",
        "\"Hi,\" she said.",
        "The U.S.A. and the U.K. are allies.",
        "I live at 221B Baker St. near the station.",
        "Café naïve résumé.",
        "Bonjour, le weekend!",
        "Call 555-0199 or email info@example.com.",
        "It costs €5, £4 or ¥600 (roughly).",
        "The meeting is on Monday, January 1st, 2024, at 9:00.",
        "50% of 1/2 is 25%.",
        "Temperatures reach -5°C at night.",
        "Is it 1990 or 2090? Neither.",
        "Hmm... well, okay — fine.",
        "She said: 'yes'; he said: 'no'.",
        "A, B, and C; then D.",
        "Set a timer for ten minutes.",
        "How far is the moon from the earth?",
        "I would like to order a large pizza with mushrooms.",
        "Can you remind me to call my mother tomorrow morning?",
        "NASA's 2nd launch, at 06:45 UTC, was a success!!!",
    ];

    /// The models the tests read: `VOXGATE_MODELS_DIR`, else the workspace's `target/models`
    /// (where `cargo xtask offline` installs them).
    fn test_models() -> (PathBuf, crate::InstalledModels) {
        let dir = std::env::var_os(crate::MODELS_DIR_VAR)
            .filter(|d| !d.is_empty())
            .map_or_else(
                || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/models"),
                PathBuf::from,
            );
        let found = crate::ModelDir::new(&dir).find();
        (dir, found)
    }

    /// The installed espeak-ng library, started; `None` (and why) when it is not installed.
    fn installed_espeak() -> Option<voxgate_espeak::Espeak> {
        let (dir, found) = test_models();
        let Some(library) = found.espeak else {
            eprintln!(
                "skipped: espeak-ng's library is not installed in {} (cargo xtask models --dir \
                 target/models, or cargo xtask offline)",
                dir.display()
            );
            return None;
        };
        let data = voxgate_espeak::data_beside(&library);
        Some(voxgate_espeak::Espeak::load(&library, data.as_deref()).unwrap())
    }

    /// `sentence`'s phonemes as the voice gets them from `phonemes`.
    fn phonemes_of(phonemes: &Phonemes, sentence: &str) -> Option<String> {
        sentence_phonemes(sentence, &phonemes.clauses("en-us", sentence).unwrap())
    }

    /// The `espeak-ng` program on `PATH`, with the version it reports.
    fn program_on_path() -> Option<(PathBuf, String)> {
        let path = std::env::var_os("PATH")?;
        let program = std::env::split_paths(&path)
            .map(|d| d.join("espeak-ng"))
            .find(|p| p.is_file())?;
        Some((
            program.clone(),
            program_version(&program.display().to_string())?,
        ))
    }

    /// The version `program --version` reports: `eSpeak NG text-to-speech: 1.52.0  Data at:`.
    fn program_version(program: &str) -> Option<String> {
        let out = Command::new(program).arg("--version").output().ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let version = text
            .split("text-to-speech:")
            .nth(1)?
            .split_whitespace()
            .next()?;
        Some(version.to_owned())
    }

    /// A script running `program` on espeak-ng's `library` and its data (the program is a
    /// thin front end of the library, which holds the version, the rules and the dictionaries),
    /// so that a system program of another release compares with the same espeak-ng.
    #[cfg(target_os = "linux")]
    fn program_on_library(program: &Path, espeak: &voxgate_espeak::Espeak) -> Option<PathBuf> {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("voxgate-espeak-cli-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink(espeak.library(), dir.join("libespeak-ng.so.1")).unwrap();
        let quoted = |p: &Path| {
            let p = p.display().to_string();
            (!p.contains('\'')).then(|| format!("'{p}'"))
        };
        let script = format!(
            "#!/bin/sh\nLD_LIBRARY_PATH={}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}} exec {} \
             --path={} \"$@\"\n",
            quoted(&dir)?,
            quoted(program)?,
            quoted(espeak.data()?)?
        );
        let wrapper = dir.join("espeak-ng");
        std::fs::write(&wrapper, script).unwrap();
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
        Some(wrapper)
    }

    #[cfg(not(target_os = "linux"))]
    fn program_on_library(_: &Path, _: &voxgate_espeak::Espeak) -> Option<PathBuf> {
        None
    }

    #[test]
    fn the_library_phonemizes_as_the_program_does() {
        let Some(espeak) = installed_espeak() else {
            return;
        };
        let Some((program, version)) = program_on_path() else {
            eprintln!("skipped: no espeak-ng program on PATH to compare with");
            return;
        };
        let library = Phonemes::Library(espeak.clone());
        let wrapped = version != espeak.version();
        let same_release = if !wrapped {
            program
        } else {
            // The dictionaries of two releases differ ("four" is fˈoːɹ in 1.51, fˈɔːɹ in
            // 1.52): say where, then compare the program on the library's release.
            let system = Phonemes::Program(program.display().to_string());
            for sentence in COMPARED {
                let (a, b) = (
                    phonemes_of(&system, sentence),
                    phonemes_of(&library, sentence),
                );
                if a != b {
                    eprintln!(
                        "espeak-ng {version} (program) and {} (library) differ on {sentence:?}: \
                         {a:?} / {b:?}",
                        espeak.version()
                    );
                }
            }
            let Some(wrapper) = program_on_library(&program, &espeak) else {
                eprintln!(
                    "skipped: the espeak-ng program is {version}, the library {}, and the \
                     program cannot be run on the library here",
                    espeak.version()
                );
                return;
            };
            let wrapped = program_version(&wrapper.display().to_string());
            assert_eq!(
                wrapped.as_deref(),
                Some(espeak.version()),
                "{}",
                wrapper.display()
            );
            wrapper
        };
        let program = Phonemes::Program(same_release.display().to_string());
        let mut compared = 0;
        for sentence in COMPARED {
            assert_eq!(
                phonemes_of(&library, sentence),
                phonemes_of(&program, sentence),
                "{sentence}"
            );
            compared += 1;
        }
        // Whole replies, cut into sentences as the voice cuts them, one after the other in
        // the one espeak-ng: nothing carries over from a sentence to the next.
        let reply = COMPARED.join(" ");
        for sentence in split_sentences(&reply)
            .iter()
            .chain(split_sentences(&reply).iter().rev())
        {
            assert_eq!(
                phonemes_of(&library, sentence),
                phonemes_of(&program, sentence),
                "{sentence}"
            );
            compared += 1;
        }
        eprintln!(
            "espeak-ng {}: the library and {} agree on {compared} sentences",
            espeak.version(),
            same_release.display()
        );
        if wrapped && let Some(dir) = same_release.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    #[test]
    fn the_library_gives_the_voice_its_phonemes() {
        let Some(espeak) = installed_espeak() else {
            return;
        };
        assert_eq!(espeak.version(), "1.52.0", "these phonemes are 1.52.0's");
        let library = Phonemes::Library(espeak);
        // What `espeak-ng -q --ipa -v en-us` (1.52.0) prints, joined as Piper joins it.
        for (sentence, phonemes) in [
            ("Hello, how are you today?", "həlˈoʊ, hˌaʊ ɑːɹ juː tədˈeɪ?"),
            ("What?", "wˈʌt?"),
            (
                "Pi is 3.14, e.g. roughly.",
                "pˈaɪ ɪz θɹˈiː pɔɪnt wˈʌn fˈɔːɹ, fˌɔːɹɛɡzˈæmpəl ɹˈʌfli.",
            ),
            ("One, two, three.", "wˈʌn, tˈuː, θɹˈiː."),
            ("Mr.", "mˈɪstɚ."),
        ] {
            assert_eq!(
                phonemes_of(&library, sentence).as_deref(),
                Some(phonemes),
                "{sentence}"
            );
        }
        assert_eq!(phonemes_of(&library, "..."), None);
        // A voice espeak-ng lacks is the configuration's fault.
        let err = library.clauses("xx-no-such-voice", "Hello").unwrap_err();
        assert!(
            matches!(&err, ProviderError::Config(m) if m.contains("xx-no-such-voice")),
            "{err:?}"
        );
    }
}
