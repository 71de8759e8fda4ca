//! Synthesis by a local program that reads text on stdin and writes a WAV file to stdout.
//!
//! Every run is a process, so what runs at once is bounded by a [`ProcessPool`] that the
//! synthesizers of a server share: requests beyond it wait their turn (the engine already
//! keeps each reply to a few sentences ahead of playback). Starting a process (fork and exec)
//! blocks the calling thread, so it happens on tokio's blocking pool, never on a runtime
//! worker; waiting for it is asynchronous.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdout, Command};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::demo::ToneTts;
use crate::error::{ProviderError, TimeoutPhase};
use crate::types::{PcmChunk, TtsRequest};
use crate::wav_stream::WavStreamDecoder;
use crate::{Tts, TtsStream};

/// How much of the child's stderr is kept for error messages.
const MAX_STDERR: usize = 4096;

/// Processes a [`ProcessPool::default`] runs at once: two per core, at least four. A
/// synthesizer process is mostly CPU, so more than this only makes each one slower.
#[must_use]
pub fn default_max_processes() -> usize {
    std::thread::available_parallelism()
        .map_or(2, std::num::NonZeroUsize::get)
        .saturating_mul(2)
        .max(4)
}

/// A bound on synthesizer processes running at once, shared by the [`CommandTts`]s made with
/// it (clones share it). Requests beyond it wait in order, each until a process ends; the
/// time a request waits does not count against its timeout.
#[derive(Debug, Clone)]
pub struct ProcessPool {
    permits: Arc<Semaphore>,
    max: usize,
}

impl ProcessPool {
    /// A pool running at most `max` processes at once (at least one).
    #[must_use]
    pub fn new(max: usize) -> Self {
        let max = max.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            permits: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    /// The most processes the pool runs at once.
    #[must_use]
    pub fn max(&self) -> usize {
        self.max
    }

    /// Processes running now.
    #[must_use]
    pub fn running(&self) -> usize {
        self.max - self.permits.available_permits()
    }

    async fn acquire(&self) -> Result<OwnedSemaphorePermit, ProviderError> {
        Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .map_err(|_| ProviderError::Command("the process pool is closed".into()))
    }
}

impl Default for ProcessPool {
    /// [`default_max_processes`].
    fn default() -> Self {
        Self::new(default_max_processes())
    }
}

/// Configuration of [`CommandTts`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandTtsConfig {
    /// The program, by path or by name looked up on `PATH`.
    pub program: PathBuf,
    /// Arguments. The text is never passed as an argument (no quoting or option-injection
    /// issues): it is written to the program's stdin.
    pub args: Vec<String>,
    /// Flag placed before the voice (the request's voice, else its language) when the request
    /// has one; no voice argument when `None`.
    pub voice_flag: Option<String>,
    /// Limit on the whole run; the child is killed when it elapses.
    pub timeout: Duration,
}

impl CommandTtsConfig {
    /// `espeak-ng --stdout --stdin`, with `-v <voice or language>`.
    #[must_use]
    pub fn espeak_ng() -> Self {
        Self {
            program: "espeak-ng".into(),
            args: vec!["--stdout".into(), "--stdin".into()],
            voice_flag: Some("-v".into()),
            timeout: Duration::from_secs(20),
        }
    }
}

/// Runs a local program per sentence and streams the WAV it writes to stdout.
///
/// The child is started with `kill_on_drop`, so dropping the stream (barge-in, cancel) or
/// hitting the timeout kills it. A non-zero exit status, output that is not a 16-bit PCM WAV,
/// or a failure to start become [`ProviderError::Command`] / [`ProviderError::Protocol`] items.
#[derive(Debug, Clone)]
pub struct CommandTts {
    config: Arc<CommandTtsConfig>,
    pool: ProcessPool,
}

impl CommandTts {
    /// A synthesizer running `config` with a pool of its own ([`ProcessPool::default`]). The
    /// program is looked up when a sentence is synthesized.
    #[must_use]
    pub fn new(config: CommandTtsConfig) -> Self {
        Self::with_pool(config, ProcessPool::default())
    }

    /// A synthesizer running `config` whose processes count against `pool`, shared with
    /// other synthesizers (a server's doors).
    #[must_use]
    pub fn with_pool(config: CommandTtsConfig, pool: ProcessPool) -> Self {
        Self {
            config: Arc::new(config),
            pool,
        }
    }
}

/// The path of `program` when it is an executable on `PATH` (or an existing path).
fn find_program(program: &Path) -> Option<PathBuf> {
    if program.components().count() > 1 {
        return program.is_file().then(|| program.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// What [`embedded_tts`] would pick on this machine, for start-up logs: `"espeak-ng"`, or the
/// tone placeholder with the reason.
#[must_use]
pub fn embedded_tts_name() -> &'static str {
    if find_program(&CommandTtsConfig::espeak_ng().program).is_some() {
        "espeak-ng"
    } else {
        "tone placeholder (espeak-ng is not on PATH: install it for real speech)"
    }
}

/// The embedded default synthesizer: `espeak-ng` when it is on `PATH`, otherwise the
/// placeholder [`ToneTts`] (beeps, not speech).
#[must_use]
pub fn embedded_tts() -> Arc<dyn Tts> {
    embedded_tts_in(ProcessPool::default())
}

/// [`embedded_tts`] whose processes count against `pool`.
#[must_use]
pub fn embedded_tts_in(pool: ProcessPool) -> Arc<dyn Tts> {
    let espeak = CommandTtsConfig::espeak_ng();
    match find_program(&espeak.program) {
        Some(path) => Arc::new(CommandTts::with_pool(
            CommandTtsConfig {
                program: path,
                ..espeak
            },
            pool,
        )),
        None => Arc::new(ToneTts),
    }
}

impl Tts for CommandTts {
    fn synthesize(&self, request: TtsRequest) -> TtsStream {
        if request.text.trim().is_empty() {
            return Box::pin(futures::stream::empty());
        }
        let run = CommandRun {
            config: Arc::clone(&self.config),
            pool: self.pool.clone(),
            request: Some(request),
            running: None,
            decoder: WavStreamDecoder::new(),
            deadline: Instant::now() + self.config.timeout,
            done: false,
        };
        Box::pin(futures::stream::unfold(run, |mut run| async move {
            loop {
                if run.done {
                    return None;
                }
                match run.step().await {
                    Ok(Some(chunk)) => return Some((Ok(chunk), run)),
                    Ok(None) => {}
                    Err(e) => {
                        run.done = true;
                        // Kill the child now rather than when the caller drops the stream.
                        run.running = None;
                        return Some((Err(e), run));
                    }
                }
            }
        }))
    }
}

struct Running {
    /// The pool's place, given back when the run ends (after the child is killed).
    _permit: OwnedSemaphorePermit,
    child: Child,
    stdout: ChildStdout,
    stderr: JoinHandle<Vec<u8>>,
    buf: Vec<u8>,
}

struct CommandRun {
    config: Arc<CommandTtsConfig>,
    pool: ProcessPool,
    request: Option<TtsRequest>,
    running: Option<Running>,
    decoder: WavStreamDecoder,
    deadline: Instant,
    done: bool,
}

impl CommandRun {
    async fn spawn(&self, request: TtsRequest) -> Result<Running, ProviderError> {
        let permit = self.pool.acquire().await?;
        let cfg = Arc::clone(&self.config);
        let voice = request.voice.or(request.language);
        // fork and exec block the calling thread (for milliseconds under load): never a
        // runtime worker's.
        let mut child = tokio::task::spawn_blocking(move || {
            let mut cmd = Command::new(&cfg.program);
            cmd.args(&cfg.args);
            if let (Some(flag), Some(voice)) = (&cfg.voice_flag, voice) {
                cmd.arg(flag).arg(voice);
            }
            cmd.stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true);
            cmd.spawn().map_err(|e| {
                ProviderError::Command(format!("cannot start {}: {e}", cfg.program.display()))
            })
        })
        .await
        .map_err(|e| ProviderError::Command(format!("starting the program: {e}")))??;
        let (Some(mut stdin), Some(stdout), Some(mut stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(ProviderError::Command("child pipes missing".into()));
        };
        // Written from a task: a child that fills stdout before reading all its input would
        // otherwise deadlock against us.
        let text = request.text;
        tokio::spawn(async move {
            let _ = stdin.write_all(text.as_bytes()).await;
            let _ = stdin.write_all(b"\n").await;
        });
        let stderr = tokio::spawn(async move {
            let mut kept = Vec::new();
            let mut buf = [0u8; 1024];
            while let Ok(n) = stderr.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                let room = MAX_STDERR.saturating_sub(kept.len()).min(n);
                kept.extend_from_slice(&buf[..room]);
            }
            kept
        });
        Ok(Running {
            _permit: permit,
            child,
            stdout,
            stderr,
            buf: vec![0; 8192],
        })
    }

    fn timeout(&self) -> ProviderError {
        ProviderError::Timeout {
            phase: TimeoutPhase::Total,
            after: self.config.timeout,
        }
    }

    async fn step(&mut self) -> Result<Option<PcmChunk>, ProviderError> {
        if let Some(request) = self.request.take() {
            self.running = Some(self.spawn(request).await?);
            // The timeout covers the run, not the wait for a place in the pool.
            self.deadline = Instant::now() + self.config.timeout;
            return Ok(None);
        }
        let deadline = self.deadline;
        let timeout = self.timeout();
        let Some(run) = self.running.as_mut() else {
            self.done = true;
            return Ok(None);
        };
        let n = tokio::time::timeout_at(deadline, run.stdout.read(&mut run.buf))
            .await
            .map_err(|_| timeout.clone())?
            .map_err(|e| ProviderError::Command(format!("reading stdout: {e}")))?;
        if n > 0 {
            return self.decoder.feed(&run.buf[..n]);
        }
        self.done = true;
        let status = tokio::time::timeout_at(deadline, run.child.wait())
            .await
            .map_err(|_| timeout.clone())?
            .map_err(|e| ProviderError::Command(format!("waiting for the program: {e}")))?;
        if !status.success() {
            let stderr = tokio::time::timeout(Duration::from_millis(200), &mut run.stderr)
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default();
            return Err(ProviderError::Command(format!(
                "{} exited with {status}: {}",
                self.config.program.display(),
                String::from_utf8_lossy(&stderr).trim()
            )));
        }
        self.decoder.finish()?;
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_found_on_path() {
        assert!(find_program(Path::new("sh")).is_some());
        assert!(find_program(Path::new("/bin/sh")).is_some());
        assert!(find_program(Path::new("voxgate-no-such-program")).is_none());
    }
}
