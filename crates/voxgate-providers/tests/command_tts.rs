//! `CommandTts` with tiny shell scripts (and espeak-ng when installed).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::collect;
use futures::StreamExt;
use voxgate_providers::{
    CommandTts, CommandTtsConfig, ProviderError, TimeoutPhase, Tts, TtsRequest, embedded_tts,
};

/// A fresh directory for one test's script and files.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("voxgate-cmd-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes an executable `sh` script.
fn script(dir: &Path, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("tts.sh");
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn config(program: PathBuf) -> CommandTtsConfig {
    CommandTtsConfig {
        program,
        args: vec!["--flag".into()],
        voice_flag: Some("-v".into()),
        timeout: Duration::from_secs(5),
    }
}

fn say(text: &str) -> TtsRequest {
    TtsRequest {
        text: text.into(),
        voice: Some("en-gb".into()),
        ..TtsRequest::default()
    }
}

#[tokio::test]
async fn reads_the_wav_a_script_writes_and_passes_text_on_stdin() {
    let dir = scratch("wav");
    let samples: Vec<i16> = (0..5_000i32)
        .map(|i| i16::try_from((i * 13) % 30_000 - 15_000).unwrap())
        .collect();
    std::fs::write(
        dir.join("out.wav"),
        voxgate_audio::wav::wav_bytes_i16(22_050, 1, &samples).unwrap(),
    )
    .unwrap();
    let d = dir.display();
    let program = script(
        &dir,
        &format!("echo \"$@\" > {d}/args.txt\ncat > {d}/text.txt\ncat {d}/out.wav"),
    );
    let tts = CommandTts::new(config(program));
    let items = collect(tts.synthesize(say("-rf is not an option here"))).await;
    let mut got = Vec::new();
    for c in items {
        let c = c.unwrap();
        assert_eq!(c.sample_rate, 22_050);
        got.extend(c.samples);
    }
    assert_eq!(got, samples);
    assert_eq!(
        std::fs::read_to_string(dir.join("text.txt")).unwrap(),
        "-rf is not an option here\n"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("args.txt")).unwrap(),
        "--flag -v en-gb\n"
    );
}

#[tokio::test]
async fn a_failing_program_reports_its_exit_status_and_stderr() {
    let dir = scratch("fail");
    let program = script(&dir, "cat > /dev/null\necho 'voice not found' >&2\nexit 3");
    let items = collect(CommandTts::new(config(program)).synthesize(say("x"))).await;
    match &items[..] {
        [Err(ProviderError::Command(msg))] => {
            assert!(msg.contains("voice not found"), "{msg}");
            assert!(msg.contains('3'), "{msg}");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn output_that_is_not_wav_is_a_protocol_error() {
    let dir = scratch("notwav");
    let program = script(&dir, "cat > /dev/null\necho 'this is not audio at all'");
    let items = collect(CommandTts::new(config(program)).synthesize(say("x"))).await;
    assert!(
        matches!(items[..], [Err(ProviderError::Protocol(_))]),
        "{items:?}"
    );
}

#[tokio::test]
async fn a_missing_program_is_a_command_error() {
    let tts = CommandTts::new(config("/nonexistent/voxgate-tts".into()));
    let items = collect(tts.synthesize(say("x"))).await;
    assert!(
        matches!(items[..], [Err(ProviderError::Command(_))]),
        "{items:?}"
    );
}

#[tokio::test]
async fn a_program_that_hangs_is_killed_at_the_timeout() {
    let dir = scratch("hang");
    let program = script(&dir, "exec sleep 30");
    let mut cfg = config(program);
    cfg.timeout = Duration::from_millis(300);
    let started = Instant::now();
    let items = collect(CommandTts::new(cfg).synthesize(say("x"))).await;
    assert!(matches!(
        items[..],
        [Err(ProviderError::Timeout {
            phase: TimeoutPhase::Total,
            ..
        })]
    ));
    assert!(started.elapsed() < Duration::from_secs(3));
}

fn alive(pid: u32) -> bool {
    // A zombie has exited; only a running or sleeping process counts.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            let state = s.rsplit(") ").next().unwrap_or("").chars().next();
            !matches!(state, Some('Z' | 'X'))
        })
        .unwrap_or(false)
}

#[tokio::test]
async fn dropping_the_stream_kills_the_program() {
    let dir = scratch("drop");
    std::fs::write(
        dir.join("out.wav"),
        voxgate_audio::wav::wav_bytes_i16(16_000, 1, &[1; 4_000]).unwrap(),
    )
    .unwrap();
    let d = dir.display();
    // `exec` so the script's pid is the sleeping process.
    let program = script(
        &dir,
        &format!("cat > /dev/null\necho $$ > {d}/pid\ncat {d}/out.wav\nexec sleep 30"),
    );
    let mut stream = CommandTts::new(config(program)).synthesize(say("x"));
    let first = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .unwrap();
    assert!(first.unwrap().is_ok());
    let pid: u32 = std::fs::read_to_string(dir.join("pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(alive(pid));
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(3);
    while alive(pid) {
        assert!(Instant::now() < deadline, "child {pid} still running");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn espeak_ng_speaks_when_installed() {
    let on_path = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .any(|d| d.join("espeak-ng").is_file());
    if !on_path {
        println!("note: espeak-ng is not installed; skipping the real-program case");
        return;
    }
    let tts = CommandTts::new(CommandTtsConfig::espeak_ng());
    let items = collect(tts.synthesize(TtsRequest {
        text: "Hello from voxgate.".into(),
        language: Some("en".into()),
        ..TtsRequest::default()
    }))
    .await;
    let mut samples = Vec::new();
    for c in items {
        let c = c.unwrap();
        assert_eq!(c.sample_rate, 22_050);
        samples.extend(c.samples);
    }
    assert!(
        samples.len() > 22_050 / 2,
        "at least half a second of speech"
    );
    assert!(samples.iter().any(|&s| s.unsigned_abs() > 1_000), "audible");
}

#[tokio::test]
async fn the_embedded_default_always_produces_audio() {
    let items = collect(embedded_tts().synthesize(TtsRequest {
        text: "two words".into(),
        ..TtsRequest::default()
    }))
    .await;
    let total: usize = items.into_iter().map(|c| c.unwrap().samples.len()).sum();
    assert!(total > 0);
}

/// The pool bounds the processes running at once, whoever asks: the rest wait, in order,
/// and their timeouts start when their process does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_pool_runs_at_most_its_size_at_once_and_queues_the_rest() {
    let dir = scratch("pool");
    std::fs::write(
        dir.join("out.wav"),
        voxgate_audio::wav::wav_bytes_i16(16_000, 1, &[0; 160]).unwrap(),
    )
    .unwrap();
    let d = dir.display();
    // Each run marks itself running for 300 ms; the peak is the most marks seen at once.
    let program = script(
        &dir,
        &format!(
            "cat > /dev/null\ntouch {d}/run.$$\nls {d} | grep -c '^run' >> {d}/seen\n\
             sleep 0.3\nrm {d}/run.$$\ncat {d}/out.wav"
        ),
    );
    let pool = voxgate_providers::ProcessPool::new(3);
    let mut cfg = config(program);
    // Twelve runs of 0.3 s through three places take 1.2 s: a 1 s timeout counted from the
    // request instead of the process start would fail the last ones.
    cfg.timeout = Duration::from_secs(1);
    let a = CommandTts::with_pool(cfg.clone(), pool.clone());
    let b = CommandTts::with_pool(cfg, pool.clone());
    let runs = (0..12).map(|i| {
        let tts = if i % 2 == 0 { a.clone() } else { b.clone() };
        tokio::spawn(async move { collect(tts.synthesize(say("x"))).await })
    });
    let results = futures::future::join_all(runs).await;
    for r in results {
        for item in r.unwrap() {
            item.unwrap();
        }
    }
    let seen = std::fs::read_to_string(dir.join("seen")).unwrap();
    let peak = seen
        .lines()
        .map(|l| l.trim().parse::<usize>().unwrap())
        .max();
    assert_eq!(seen.lines().count(), 12);
    assert!(peak.is_some_and(|p| p <= 3), "peak {peak:?}: {seen}");
    assert_eq!(pool.running(), 0);
}
