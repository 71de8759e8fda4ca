//! espeak-ng's text-to-IPA phonemizer, from a `libespeak-ng` shared library loaded at run time.
//!
//! Piper voices read IPA phonemes made by espeak-ng. Running the `espeak-ng` program per
//! sentence needs it installed system-wide; this crate loads the library instead (such as the
//! one PyPI's `espeakng-loader` wheel carries, with its `espeak-ng-data` beside it), so a
//! machine with nothing but a models directory can phonemize. The library is opened with
//! `dlopen` when [`Espeak::load`] is called, never linked at build time.
//!
//! The phonemes are the ones the program prints for `espeak-ng -q --ipa -v <voice> --stdin`:
//! the text goes through espeak-ng's whole pipeline (clause reading, translation, then the
//! intonation pass that decides each clause's final stress), and each clause's phonemes are
//! taken where the program prints them. `espeak_TextToPhonemes` skips the intonation pass and
//! so stresses some clauses differently (`wˌʌt` for the program's `wˈʌt` in "What?").
//!
//! espeak-ng keeps its state in globals and is not thread-safe, so a process holds one
//! instance: the first successful [`Espeak::load`] starts it for good, later loads of the same
//! library and data share it, and every call takes a lock. Text is bounded
//! ([`MAX_TEXT_BYTES`]), and so are the phonemes collected ([`MAX_PHONEME_BYTES`]) and the time
//! one call may take ([`TIME_LIMIT`]).
//!
//! Besides `voxgate-opus-sys` (and the test-only `voxgate-test-support`), this is the one
//! voxgate crate with `unsafe` code, all of it in one private module: every foreign call into
//! espeak-ng, each with why it is sound.
//!
//! ```no_run
//! use std::path::Path;
//! use voxgate_espeak::{Espeak, data_beside};
//!
//! let library = Path::new("/models/espeakng_loader/libespeak-ng.so.1.52.0");
//! let espeak = Espeak::load(library, data_beside(library).as_deref())?;
//! let clauses = espeak.phonemize("en-us", "Hello, how are you today?")?;
//! assert_eq!(clauses, ["həlˈoʊ", "hˌaʊ ɑːɹ juː tədˈeɪ"]);
//! # Ok::<(), voxgate_espeak::EspeakError>(())
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

// The foreign calls into libespeak-ng: the crate's only `unsafe` code (the workspace denies it
// everywhere else).
#[cfg(unix)]
#[allow(unsafe_code)]
mod engine;

/// The longest text one [`Espeak::phonemize`] call takes, in bytes: a Piper sentence is at
/// most a few hundred characters, and espeak-ng's work (and the time the lock is held) grows
/// with its input.
pub const MAX_TEXT_BYTES: usize = 4096;

/// The longest voice name, in bytes: the `espeak-ng` program keeps at most 39 (`char
/// voicename[40]`).
pub const MAX_VOICE_BYTES: usize = 39;

/// The most phoneme bytes one call collects; espeak-ng is stopped beyond it (numbers and
/// abbreviations expand, but never this much for [`MAX_TEXT_BYTES`] of text).
pub const MAX_PHONEME_BYTES: usize = 64 * 1024;

/// The longest data directory path, in bytes: espeak-ng 1.52 copies it into a 160-byte buffer
/// (`N_PATH_HOME` on POSIX) and would silently cut a longer one, then look elsewhere.
pub const MAX_DATA_PATH_BYTES: usize = 159;

/// How long one call may run before espeak-ng is stopped (the program path kills the program
/// after the same time).
pub const TIME_LIMIT: Duration = Duration::from_secs(10);

/// Files espeak-ng reads from its data directory at start-up; their presence tells a data
/// directory from a wrong path before espeak-ng is given it.
const DATA_FILES: [&str; 4] = ["phontab", "phonindex", "phondata", "intonations"];

/// What went wrong, and whose fault it is: the configuration (a path, a voice), the caller
/// (text too long), or espeak-ng itself.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EspeakError {
    /// This platform has no in-process phonemizer (only Unix does: espeak-ng writes its
    /// phoneme trace to a C stream, opened here).
    #[error("espeak-ng's library is only loaded in process on Unix; use the espeak-ng program")]
    Unsupported,
    /// The library could not be opened (configuration: wrong path or architecture).
    #[error("cannot load espeak-ng's library {library}: {reason}")]
    Load {
        /// The library asked for.
        library: PathBuf,
        /// The loader's message.
        reason: String,
    },
    /// The library lacks a function this crate calls: it is not libespeak-ng 1.49 or later.
    #[error("{library} is not libespeak-ng 1.49 or later: it has no {symbol}")]
    Symbol {
        /// The library.
        library: PathBuf,
        /// The missing function.
        symbol: &'static str,
    },
    /// The data directory is not one (configuration).
    #[error("{data} is not espeak-ng's data directory: {reason}")]
    Data {
        /// The directory given.
        data: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The process already runs espeak-ng from another library or data directory (espeak-ng
    /// keeps its state in globals, so there is one per process).
    #[error(
        "espeak-ng is already loaded in this process from {loaded} (data {loaded_data}); a \
         process runs one, so {wanted} cannot be used too"
    )]
    AlreadyLoaded {
        /// The library in use.
        loaded: PathBuf,
        /// Its data directory (or espeak-ng's default).
        loaded_data: String,
        /// The library asked for.
        wanted: PathBuf,
    },
    /// espeak-ng refused to start (its data is unreadable or of another version).
    #[error("espeak-ng did not start from {library}: {message}")]
    Init {
        /// The library.
        library: PathBuf,
        /// espeak-ng's message.
        message: String,
    },
    /// An earlier start failed; espeak-ng's global state is not trusted for another try in
    /// this process.
    #[error("espeak-ng failed to start earlier in this process ({0}); restart to try again")]
    Broken(String),
    /// No voice of that name or language (configuration: the voice's `espeak.voice`).
    #[error("espeak-ng has no voice {voice:?}: {message}")]
    Voice {
        /// The voice asked for.
        voice: String,
        /// espeak-ng's message.
        message: String,
    },
    /// A voice name that cannot be one (empty, too long, a NUL): the caller's.
    #[error("{0:?} is not an espeak-ng voice name (1 to {MAX_VOICE_BYTES} bytes, no NUL)")]
    VoiceName(String),
    /// The text is longer than [`MAX_TEXT_BYTES`]: the caller's, who should split it.
    #[error("{len} bytes of text; espeak-ng is given at most {MAX_TEXT_BYTES} at once")]
    TextTooLong {
        /// The text's length in bytes.
        len: usize,
    },
    /// The phonemes of the text exceed [`MAX_PHONEME_BYTES`]; espeak-ng was stopped.
    #[error("the phonemes of this text exceed {MAX_PHONEME_BYTES} bytes; stopped")]
    OutputTooLong,
    /// The text took longer than [`TIME_LIMIT`]; espeak-ng was stopped.
    #[error("espeak-ng took longer than {0:?}; stopped")]
    TimedOut(Duration),
    /// espeak-ng failed on the text.
    #[error("espeak-ng failed on the text: {0}")]
    Synthesis(String),
}

/// The process's espeak-ng, ready to phonemize. Cheap to clone: every handle shares the one
/// instance, and calls take turns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Espeak {
    library: PathBuf,
    data: Option<PathBuf>,
    version: String,
}

impl Espeak {
    /// Loads espeak-ng from `library` with its data directory `data` (the `espeak-ng-data`
    /// directory itself; `None`: where espeak-ng looks by default, `ESPEAK_DATA_PATH` or its
    /// compiled-in place) and starts it, once per process: a later call with the same library
    /// and data returns the same instance. A bare file name (`libespeak-ng.so.1`) is left to
    /// the dynamic loader's search path.
    ///
    /// # Errors
    /// [`EspeakError::Load`], [`EspeakError::Symbol`] or [`EspeakError::Data`] for a wrong
    /// path; [`EspeakError::AlreadyLoaded`] when the process runs espeak-ng from elsewhere;
    /// [`EspeakError::Init`] when espeak-ng refuses its data, after which every load fails with
    /// [`EspeakError::Broken`]; [`EspeakError::Unsupported`] off Unix.
    pub fn load(library: &Path, data: Option<&Path>) -> Result<Self, EspeakError> {
        if library.components().count() > 1 && !library.is_file() {
            return Err(EspeakError::Load {
                library: library.to_path_buf(),
                reason: "no such file".into(),
            });
        }
        let library = library
            .canonicalize()
            .unwrap_or_else(|_| library.to_path_buf());
        let data = data.map(check_data).transpose()?;
        load_engine(library, data)
    }

    /// Phonemizes `text` with the voice `voice` (a name such as `en-us`, or a language, as
    /// `espeak-ng -v` takes it): IPA phonemes, one string per clause, exactly as `espeak-ng -q
    /// --ipa -v <voice> --stdin` prints them one per line (empty clauses and language-switch
    /// marks such as `(fr)` included). The text ends at its first NUL, as espeak-ng reads it.
    ///
    /// # Errors
    /// [`EspeakError::TextTooLong`] or [`EspeakError::VoiceName`] for input beyond the
    /// bounds; [`EspeakError::Voice`] for a voice espeak-ng lacks;
    /// [`EspeakError::OutputTooLong`], [`EspeakError::TimedOut`] or
    /// [`EspeakError::Synthesis`] when espeak-ng was stopped or failed.
    pub fn phonemize(&self, voice: &str, text: &str) -> Result<Vec<String>, EspeakError> {
        let text = text.find('\0').map_or(text, |nul| &text[..nul]);
        if text.len() > MAX_TEXT_BYTES {
            return Err(EspeakError::TextTooLong { len: text.len() });
        }
        if voice.is_empty() || voice.len() > MAX_VOICE_BYTES || voice.contains('\0') {
            return Err(EspeakError::VoiceName(voice.to_owned()));
        }
        phonemize(voice, text)
    }

    /// The library espeak-ng runs from (canonical path).
    #[must_use]
    pub fn library(&self) -> &Path {
        &self.library
    }

    /// Its data directory; `None`: espeak-ng's default.
    #[must_use]
    pub fn data(&self) -> Option<&Path> {
        self.data.as_deref()
    }

    /// espeak-ng's version (`1.52.0`), as the library reports it.
    #[must_use]
    pub fn version(&self) -> &str {
        &self.version
    }
}

/// The `espeak-ng-data` directory beside `library`, if there is one: where PyPI's
/// `espeakng-loader` wheel and Debian's `libespeak-ng1` (multiarch library directory) put it.
#[must_use]
pub fn data_beside(library: &Path) -> Option<PathBuf> {
    let dir = library.parent()?.join("espeak-ng-data");
    DATA_FILES
        .iter()
        .all(|f| dir.join(f).is_file())
        .then_some(dir)
}

/// `data` made canonical, once it is checked to hold espeak-ng's data and to fit espeak-ng's
/// path buffer.
fn check_data(data: &Path) -> Result<PathBuf, EspeakError> {
    let fail = |reason: String| EspeakError::Data {
        data: data.to_path_buf(),
        reason,
    };
    let canonical = data
        .canonicalize()
        .map_err(|e| fail(format!("cannot open it: {e}")))?;
    if let Some(missing) = DATA_FILES.iter().find(|f| !canonical.join(f).is_file()) {
        return Err(fail(format!(
            "it has no {missing} (give the espeak-ng-data directory itself)"
        )));
    }
    let len = canonical.as_os_str().len();
    if len > MAX_DATA_PATH_BYTES {
        return Err(fail(format!(
            "its path is {len} bytes; espeak-ng takes at most {MAX_DATA_PATH_BYTES} (move the \
             models directory to a shorter path)"
        )));
    }
    Ok(canonical)
}

#[cfg(unix)]
fn load_engine(library: PathBuf, data: Option<PathBuf>) -> Result<Espeak, EspeakError> {
    engine::load(library, data)
}

#[cfg(not(unix))]
fn load_engine(_library: PathBuf, _data: Option<PathBuf>) -> Result<Espeak, EspeakError> {
    Err(EspeakError::Unsupported)
}

#[cfg(unix)]
fn phonemize(voice: &str, text: &str) -> Result<Vec<String>, EspeakError> {
    engine::phonemize(voice, text)
}

#[cfg(not(unix))]
fn phonemize(_voice: &str, _text: &str) -> Result<Vec<String>, EspeakError> {
    Err(EspeakError::Unsupported)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b"x").unwrap();
    }

    #[test]
    fn data_is_found_beside_the_library_and_checked() {
        let root = std::env::temp_dir().join(format!("voxgate-espeak-data-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let library = root.join("libespeak-ng.so.1.52.0");
        touch(&library);
        assert_eq!(data_beside(&library), None);
        let data = root.join("espeak-ng-data");
        for f in &DATA_FILES[..3] {
            touch(&data.join(f));
        }
        // One file short: not a data directory.
        assert_eq!(data_beside(&library), None);
        let err = check_data(&data).unwrap_err();
        assert!(err.to_string().contains("intonations"), "{err}");
        touch(&data.join("intonations"));
        assert_eq!(data_beside(&library), Some(data.clone()));
        assert_eq!(check_data(&data).unwrap(), data.canonicalize().unwrap());
        // Its parent is not accepted in its place.
        assert!(matches!(check_data(&root), Err(EspeakError::Data { .. })));

        // A path espeak-ng's buffer would cut.
        let deep = root
            .join("d".repeat(MAX_DATA_PATH_BYTES))
            .join("espeak-ng-data");
        for f in DATA_FILES {
            touch(&deep.join(f));
        }
        let err = check_data(&deep).unwrap_err();
        assert!(err.to_string().contains("shorter path"), "{err}");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn wrong_paths_are_errors_before_anything_is_loaded() {
        let err =
            Espeak::load(Path::new("/nonexistent/voxgate/libespeak-ng.so.1"), None).unwrap_err();
        assert!(
            matches!(&err, EspeakError::Load { library, .. } if library.ends_with("libespeak-ng.so.1")),
            "{err:?}"
        );
        let err = Espeak::load(
            Path::new("/nonexistent/voxgate/libespeak-ng.so.1"),
            Some(Path::new("/nonexistent/voxgate/espeak-ng-data")),
        )
        .unwrap_err();
        assert!(matches!(err, EspeakError::Load { .. }), "{err:?}");
    }

    #[test]
    fn a_file_that_is_not_a_library_is_refused_by_the_loader() {
        let path =
            std::env::temp_dir().join(format!("voxgate-espeak-notlib-{}", std::process::id()));
        std::fs::write(&path, b"not a shared library").unwrap();
        let err = Espeak::load(&path, None).unwrap_err();
        std::fs::remove_file(&path).unwrap();
        if cfg!(unix) {
            // Or, in a process that already runs espeak-ng, refused for that.
            assert!(
                matches!(
                    err,
                    EspeakError::Load { .. } | EspeakError::AlreadyLoaded { .. }
                ),
                "{err:?}"
            );
        } else {
            assert!(matches!(err, EspeakError::Unsupported), "{err:?}");
        }
    }
}
