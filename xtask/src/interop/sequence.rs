//! The `sequence` scenario: the published client `deepslate-core` as the reference for the event
//! sequence of `voxgate-client realtime`.
//!
//! `realtime_sequence.py` (deepslate-core, WebSocket door) and `voxgate-client realtime` (over
//! the WebSocket door, then over gRPC) run the same scripted session against the same server,
//! each writing the oneof names of the `ClientBoundMessage`s it received, in order, as a JSON
//! array. Both are given the same arguments, so the script lives in one place (here); every
//! sequence of the Rust client must equal deepslate-core's, and a difference fails with a diff.

use std::fs::{self, File};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

use super::{API_KEY, SCRIPTS, Scenario, build_bin, run_with_limit};
use crate::util;

/// The typed turns of the scripted session, in order; the second makes the demo agent call the
/// client tool.
const TEXTS: [&str; 2] = ["hello there", r#"call get_weather {"city": "Paris"}"#];
/// The client tool both sides declare (with a `{"city": string}` object schema) and the result
/// they answer each of its calls with.
const TOOL_RESULT: &str = "get_weather=sunny, 21 C";

/// The session script as command-line arguments, the same for the Python script and the CLI.
fn script_args(kinds_out: &Path) -> Vec<String> {
    let mut args = Vec::new();
    for text in TEXTS {
        args.push("--text".to_owned());
        args.push(text.to_owned());
    }
    args.extend([
        "--tool-result".to_owned(),
        TOOL_RESULT.to_owned(),
        "--kinds-out".to_owned(),
        kinds_out.display().to_string(),
        "--api-key".to_owned(),
        API_KEY.to_owned(),
    ]);
    args
}

/// Records deepslate-core's sequence, then checks `voxgate-client realtime`'s over WebSocket
/// and over gRPC against it.
pub(super) fn run(
    python: &Path,
    root: &Path,
    logs: &Path,
    addr: SocketAddr,
    timeout: u64,
) -> anyhow::Result<()> {
    let ws_url = format!("ws://{addr}/realtime");
    let reference_path = logs.join("sequence-deepslate.json");
    let mut cmd = Command::new(python);
    cmd.arg("-u")
        .arg(root.join(SCRIPTS).join(Scenario::Sequence.script()))
        .arg(&ws_url)
        .args(script_args(&reference_path));
    let reference = record(cmd, root, logs, "deepslate", &reference_path, timeout)
        .context("realtime_sequence.py (deepslate-core, WebSocket)")?;
    eprintln!(
        "== interop sequence: deepslate-core over WebSocket: {} messages: {}",
        reference.len(),
        reference.join(" ")
    );
    // The script's second turn calls the tool once; a reference without that call (or with
    // more) would hold the Rust client to a session that did not happen as scripted.
    let calls = reference
        .iter()
        .filter(|k| *k == "tool_call_request")
        .count();
    if calls != 1 {
        bail!(
            "deepslate-core's sequence has {calls} tool_call_request, expected 1: {}",
            reference.join(" ")
        );
    }

    let client = build_bin("voxgate-client", "voxgate-client")?;
    // Both transports run even when the first differs: which of them differ says where to look.
    let mut differences = Vec::new();
    for (transport, url) in [("websocket", ws_url), ("grpc", format!("http://{addr}"))] {
        let kinds_path = logs.join(format!("sequence-rust-{transport}.json"));
        let mut cmd = Command::new(&client);
        cmd.arg("realtime").arg(&url).args(script_args(&kinds_path));
        if transport == "grpc" {
            cmd.arg("--grpc");
        }
        let kinds = record(
            cmd,
            root,
            logs,
            &format!("rust-{transport}"),
            &kinds_path,
            timeout,
        )
        .with_context(|| format!("voxgate-client realtime over {transport}"))?;
        if kinds == reference {
            eprintln!(
                "== interop sequence: voxgate-client over {transport}: the same {} messages",
                kinds.len()
            );
        } else {
            differences.push(format!(
                "voxgate-client realtime over {transport} ({url}) received another sequence than \
                 deepslate-core over WebSocket (- only deepslate-core, + only voxgate-client; \
                 files {} and {}):\n{}",
                reference_path.display(),
                kinds_path.display(),
                diff(&reference, &kinds)
            ));
        }
    }
    if !differences.is_empty() {
        bail!("{}", differences.join("\n"));
    }
    Ok(())
}

/// Runs one recorder with the time limit (output in `<logs>/sequence-<name>.log`) and reads the
/// JSON array of message kinds it wrote to `kinds_path`.
fn record(
    mut cmd: Command,
    root: &Path,
    logs: &Path,
    name: &str,
    kinds_path: &Path,
    timeout: u64,
) -> anyhow::Result<Vec<String>> {
    let log_path: PathBuf = logs.join(format!("sequence-{name}.log"));
    let log = File::create(&log_path)?;
    // A file left by an earlier run must not pass for this one's.
    if kinds_path.exists() {
        fs::remove_file(kinds_path)
            .with_context(|| format!("removing {}", kinds_path.display()))?;
    }
    cmd.current_dir(root)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    eprintln!("== interop sequence: $ {}", util::describe(&cmd));
    let status = run_with_limit(&mut cmd, timeout)?;
    let output = fs::read_to_string(&log_path).unwrap_or_default();
    match status {
        Some(s) if s.success() => {}
        Some(s) => bail!("exited with {s}; its output:\n{output}"),
        None => bail!("did not finish within {timeout} s; its output:\n{output}"),
    }
    let text = fs::read_to_string(kinds_path).with_context(|| {
        format!(
            "reading {} (the run succeeded but wrote no sequence); its output:\n{output}",
            kinds_path.display()
        )
    })?;
    serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not a JSON array of strings:\n{text}",
            kinds_path.display()
        )
    })
}

/// A line diff of two sequences over their longest common subsequence: `  ` both, `- ` only in
/// `a`, `+ ` only in `b`, each line with its index in `a` or `b`.
fn diff(a: &[String], b: &[String]) -> String {
    // lcs[i][j]: length of the longest common subsequence of a[i..] and b[j..].
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut out = String::new();
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            out.push_str(&format!("  {i:>3} {j:>3}  {}\n", a[i]));
            i += 1;
            j += 1;
        } else if j < b.len() && (i == a.len() || lcs[i][j + 1] >= lcs[i + 1][j]) {
            out.push_str(&format!("+     {j:>3}  {}\n", b[j]));
            j += 1;
        } else {
            out.push_str(&format!("- {i:>3}      {}\n", a[i]));
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::diff;

    fn v(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn equal_sequences_diff_to_context_only() {
        let a = v(&["session_ready", "response_begin", "chat_history"]);
        let d = diff(&a, &a);
        assert_eq!(d.lines().count(), 3);
        assert!(d.lines().all(|l| l.starts_with("  ")), "{d}");
    }

    #[test]
    fn a_missing_and_an_extra_message_are_marked() {
        let a = v(&[
            "session_ready",
            "response_begin",
            "model_text_fragment",
            "response_end",
            "chat_history",
        ]);
        let b = v(&[
            "session_ready",
            "response_begin",
            "response_end",
            "turn_snapshot",
            "chat_history",
        ]);
        let d = diff(&a, &b);
        let marked: Vec<&str> = d
            .lines()
            .filter(|l| !l.starts_with("  "))
            .map(|l| l.split_whitespace().last().unwrap_or_default())
            .collect();
        assert_eq!(marked, ["model_text_fragment", "turn_snapshot"], "{d}");
        assert!(d.contains("- ") && d.contains("+ "), "{d}");
        assert_eq!(d.lines().filter(|l| l.starts_with("- ")).count(), 1, "{d}");
        assert_eq!(d.lines().filter(|l| l.starts_with("+ ")).count(), 1, "{d}");
    }

    #[test]
    fn diff_of_an_empty_sequence_lists_the_other() {
        let b = v(&["session_ready", "chat_history"]);
        assert_eq!(
            diff(&[], &b).lines().filter(|l| l.starts_with('+')).count(),
            2
        );
        assert_eq!(
            diff(&b, &[]).lines().filter(|l| l.starts_with('-')).count(),
            2
        );
    }
}
