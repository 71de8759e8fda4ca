//! Small process helpers shared by the xtask commands.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// The workspace root (the parent of the xtask crate).
pub(crate) fn root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// The `cargo` that runs this xtask, so nested builds use the same toolchain.
/// Cargo's target directory: `CARGO_TARGET_DIR` when set, else `target/` in the workspace.
/// Scratch files (venvs, logs) go here too, so a run never writes into the repository when
/// the build is elsewhere.
pub(crate) fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root().join("target"), PathBuf::from)
}

/// The release server and client binaries and the speech fixture the load tools use, unless
/// the caller names its own.
pub(crate) fn release_inputs(
    server_bin: Option<&PathBuf>,
    client_bin: Option<&PathBuf>,
    wav: Option<&PathBuf>,
) -> (PathBuf, PathBuf, PathBuf) {
    let root = root();
    let target = target_dir();
    (
        server_bin
            .cloned()
            .unwrap_or_else(|| target.join("release/voxgate-server")),
        client_bin
            .cloned()
            .unwrap_or_else(|| target.join("release/voxgate-client")),
        wav.cloned()
            .unwrap_or_else(|| root.join("crates/voxgate-audio/tests/fixtures/question.wav")),
    )
}

pub(crate) fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(root());
    cmd
}

/// Runs a command to completion, echoing it first; fails on a non-zero exit.
pub(crate) fn run(cmd: &mut Command) -> anyhow::Result<()> {
    eprintln!("$ {}", describe(cmd));
    let status = cmd
        .status()
        .with_context(|| format!("could not start `{}`", describe(cmd)))?;
    if !status.success() {
        bail!("`{}` failed with {status}", describe(cmd));
    }
    Ok(())
}

/// Runs a command and returns its standard output; fails on a non-zero exit.
pub(crate) fn output(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("could not start `{}`", describe(cmd)))?;
    if !out.status.success() {
        bail!(
            "`{}` failed with {}:\n{}",
            describe(cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8(out.stdout).context("command printed non-UTF-8 output")
}

/// A shell-like rendering of a command for logs.
pub(crate) fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        s.push(' ');
        s.push_str(&arg.to_string_lossy());
    }
    s
}

/// Installs a Debian package when the file it provides is missing (the machines run as root).
pub(crate) fn ensure_tool(path: &str, package: &str) -> anyhow::Result<()> {
    if Path::new(path).exists() {
        return Ok(());
    }
    let install = || {
        run(Command::new("apt-get")
            .args(["install", "-y", "-q", package])
            .env("DEBIAN_FRONTEND", "noninteractive"))
    };
    // A fresh machine has no package lists yet: update once and try again.
    if install().is_err() {
        run(Command::new("apt-get").args(["update", "-q"]))?;
        install().with_context(|| format!("installing {package} (needs root and apt)"))?;
    }
    if !Path::new(path).exists() {
        bail!("installed {package} but {path} is still missing");
    }
    Ok(())
}
