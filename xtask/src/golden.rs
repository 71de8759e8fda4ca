//! `cargo xtask golden`: regenerate golden vectors with third-party implementations.
//!
//! The realtime protocol's vectors come from the reference Python client (`deepslate-core`),
//! installed at pinned versions into a venv under `target/golden-venv`. Its protobuf module
//! serializes the messages built by `xtask/golden/realtime_golden.py`; the same script checks
//! that `proto/realtime.proto` describes exactly the published schema. The vectors are written
//! to `crates/voxgate-realtime/tests/data/` and copied into the realtime fuzz seed directories.
//!
//! `--check` regenerates into a scratch directory and fails if anything differs from the
//! committed files, so CI notices a stale vector or a drifting .proto.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use crate::util;

/// Options for `cargo xtask golden`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Only check that the committed vectors and seeds match a fresh generation; change nothing.
    #[arg(long)]
    pub(crate) check: bool,
}

/// Pinned so the vectors are reproducible: the protobuf runtime decides the bytes.
const REQUIREMENTS: &[&str] = &[
    "deepslate-core==0.1.23",
    "protobuf==7.36.2",
    "grpcio-tools==1.85.1",
];

/// Where the realtime vectors live, relative to the workspace root.
const DATA_DIR: &str = "crates/voxgate-realtime/tests/data";

pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let root = util::root();
    let python = ensure_venv()?;
    let scratch = util::target_dir().join("xtask-golden");
    if scratch.exists() {
        fs::remove_dir_all(&scratch).with_context(|| format!("clearing {}", scratch.display()))?;
    }
    util::run(
        Command::new(&python)
            .arg(root.join("xtask/golden/realtime_golden.py"))
            .arg("--proto")
            .arg(root.join("proto/realtime.proto"))
            .arg("--out")
            .arg(&scratch)
            .current_dir(&root),
    )?;
    let fresh = read_bins(&scratch)?;
    if fresh.is_empty() {
        bail!("the golden script wrote no vectors");
    }

    // Every vector is a seed for the fuzz target of its direction (by file-name prefix).
    let destinations = [
        (root.join(DATA_DIR), ""),
        (root.join("fuzz/seeds/realtime_service_bound"), "service_"),
        (root.join("fuzz/seeds/realtime_client_bound"), "client_"),
    ];
    let mut stale = Vec::new();
    for (dir, prefix) in &destinations {
        let expected: BTreeMap<&String, &Vec<u8>> = fresh
            .iter()
            .filter(|(name, _)| name.starts_with(prefix))
            .collect();
        if args.check {
            let committed = read_bins(dir)?;
            for (name, bytes) in &expected {
                match committed.get(*name) {
                    None => stale.push(format!("{}: missing", dir.join(name).display())),
                    Some(c) if c != *bytes => {
                        stale.push(format!("{}: differs", dir.join(name).display()));
                    }
                    Some(_) => {}
                }
            }
            for name in committed.keys().filter(|n| !expected.contains_key(n)) {
                stale.push(format!("{}: no longer generated", dir.join(name).display()));
            }
        } else {
            sync(dir, &expected)?;
        }
    }
    if !stale.is_empty() {
        bail!(
            "golden vectors are out of date; run `cargo xtask golden` and commit:\n  {}",
            stale.join("\n  ")
        );
    }
    eprintln!(
        "{} {} golden vectors",
        if args.check { "checked" } else { "wrote" },
        fresh.len()
    );
    Ok(())
}

/// Creates the venv and installs the pinned packages unless it already has them.
fn ensure_venv() -> anyhow::Result<PathBuf> {
    let venv = util::target_dir().join("golden-venv");
    let python = venv.join("bin").join("python");
    let marker = venv.join("voxgate-requirements.txt");
    let wanted = REQUIREMENTS.join("\n");
    if fs::read_to_string(&marker).ok().as_deref() == Some(wanted.as_str()) && python.exists() {
        return Ok(python);
    }
    if !python.exists() {
        util::run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    }
    util::run(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(REQUIREMENTS),
    )?;
    fs::write(&marker, wanted).with_context(|| format!("writing {}", marker.display()))?;
    Ok(python)
}

/// The `.bin` files of a directory by name (empty when the directory does not exist).
fn read_bins(dir: &Path) -> anyhow::Result<BTreeMap<String, Vec<u8>>> {
    let mut out = BTreeMap::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(out);
    };
    for entry in entries {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "bin") {
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .context("non-UTF-8 file name")?
                .to_owned();
            let bytes = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            out.insert(name, bytes);
        }
    }
    Ok(out)
}

/// Makes `dir`'s `.bin` files exactly `expected`.
fn sync(dir: &Path, expected: &BTreeMap<&String, &Vec<u8>>) -> anyhow::Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for name in read_bins(dir)?.keys() {
        if !expected.contains_key(name) {
            fs::remove_file(dir.join(name))?;
        }
    }
    for (name, bytes) in expected {
        let path = dir.join(name);
        fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
