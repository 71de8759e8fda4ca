//! `cargo xtask publish-check`: every publishable crate through `cargo publish --dry-run`.
//!
//! The crates are found with `cargo metadata` (every workspace member whose `publish` is not
//! `false`), so a new crate is checked without editing this file. They go through one
//! `cargo publish --dry-run -p A -p B ...`, because cargo packages workspace-local
//! dependencies together only within one invocation: checked one by one, a crate whose
//! voxgate dependency is not on crates.io yet could not be verified.
//!
//! By default each package is also verified (built from its `.crate`, as crates.io users would
//! build it), which compiles every dependency again under `target/package/`: minutes. With
//! `--no-verify` only the packaging is checked (the manifest as published, the files included,
//! versions on every dependency): seconds, which is what `cargo xtask ci` runs.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::Value;

use crate::util;

/// Options for `cargo xtask publish-check`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Check the packaging only; do not build each package from its `.crate`.
    #[arg(long)]
    pub(crate) no_verify: bool,
}

/// One publishable crate and what the dry run said about it.
#[derive(Debug, Default, PartialEq)]
struct Outcome {
    version: String,
    /// Cargo's `Packaged N files, SIZE (SIZE compressed)`, without the verb.
    packaged: Option<String>,
    /// How long its verification build took, once it finished.
    verified_in: Option<Duration>,
    /// The first error cargo reported while this crate was being packaged or verified.
    error: Option<String>,
}

pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let json =
        util::output(util::cargo().args(["metadata", "--no-deps", "--format-version", "1"]))?;
    let metadata: Value = serde_json::from_str(&json).context("parsing cargo metadata")?;
    let crates = publishable(&metadata)?;
    if crates.is_empty() {
        bail!("no workspace member is publishable");
    }

    let mut cmd = util::cargo();
    cmd.args(["publish", "--dry-run", "--color", "never"]);
    // A dry run checks what would be published; uncommitted work is part of what is checked.
    cmd.arg("--allow-dirty");
    if args.no_verify {
        cmd.arg("--no-verify");
    }
    for c in &crates {
        cmd.args(["-p", &c.name]);
    }
    eprintln!("$ {}", util::describe(&cmd));
    let started = Instant::now();
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("could not start `{}`", util::describe(&cmd)))?;
    let stderr = child
        .stderr
        .take()
        .context("cargo's stderr was not captured")?;

    let mut outcomes: BTreeMap<String, Outcome> = crates
        .iter()
        .map(|c| {
            let outcome = Outcome {
                version: c.version.clone(),
                error: (!c.missing.is_empty())
                    .then(|| format!("missing from the crate: {}", c.missing.join(", "))),
                ..Outcome::default()
            };
            (c.name.clone(), outcome)
        })
        .collect();
    let incomplete = crates.iter().filter(|c| !c.missing.is_empty()).count();
    let mut tracker = Tracker {
        manifests: crates
            .iter()
            .map(|c| (c.manifest.clone(), c.name.clone()))
            .filter(|(m, _)| !m.is_empty())
            .collect(),
        ..Tracker::default()
    };
    let mut log = Vec::new();
    for line in BufReader::new(stderr).lines() {
        let line = line.context("reading cargo's output")?;
        if let Some(name) = tracker.observe(&line, Instant::now(), &mut outcomes) {
            eprintln!("  verifying {name} ...");
        }
        // Compilation progress would bury the errors in the log shown on failure.
        if !is_progress(&line) {
            log.push(line);
        }
    }
    let status = child.wait().context("waiting for cargo publish")?;
    tracker.finish(Instant::now(), &mut outcomes);

    let width = outcomes.keys().map(String::len).max().unwrap_or_default();
    for (name, outcome) in &outcomes {
        let line = summary(outcome, args.no_verify, status.success());
        println!("{name:<width$} {line}");
    }
    eprintln!(
        "== publish-check: {} crate(s), {} in {:.1?}",
        outcomes.len(),
        if args.no_verify {
            "packaged without verification"
        } else {
            "packaged and verified"
        },
        started.elapsed()
    );
    if !status.success() {
        eprintln!("--- cargo publish output (compilation progress left out):");
        for line in &log {
            eprintln!("{line}");
        }
        bail!("`cargo publish --dry-run` failed with {status}");
    }
    if incomplete > 0 {
        bail!("{incomplete} crate(s) lack files their package must carry");
    }
    Ok(())
}

/// A workspace member that may be published.
#[derive(Debug, PartialEq)]
struct Publishable {
    name: String,
    version: String,
    /// Its `Cargo.toml`, which cargo names in errors about the manifest.
    manifest: String,
    /// Files the package must carry that its directory lacks (see [`missing_files`]).
    missing: Vec<String>,
}

/// Every workspace member that may be published, by name.
fn publishable(metadata: &Value) -> anyhow::Result<Vec<Publishable>> {
    let members: Vec<&str> = metadata["workspace_members"]
        .as_array()
        .context("metadata has no workspace_members")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let mut out = Vec::new();
    for p in metadata["packages"]
        .as_array()
        .context("metadata has no packages")?
    {
        let id = p["id"].as_str().context("package without id")?;
        if !members.contains(&id) {
            continue;
        }
        // `publish`: null when it may go to any registry, a list of registry names otherwise
        // (`publish = false` is the empty list).
        let allowed = match &p["publish"] {
            Value::Null => true,
            Value::Array(registries) => !registries.is_empty(),
            _ => false,
        };
        if allowed {
            let name = p["name"].as_str().context("package without name")?;
            let version = p["version"].as_str().context("package without version")?;
            out.push(Publishable {
                name: name.to_owned(),
                version: version.to_owned(),
                manifest: p["manifest_path"].as_str().unwrap_or_default().to_owned(),
                missing: missing_files(p),
            });
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// What a crate's directory lacks of what its package must carry: the README crates.io shows,
/// and the text of each license its `license` names (MIT and Apache-2.0 require their text
/// to go with every copy; the workspace's are linked into each crate directory as
/// `LICENSE-MIT` and `LICENSE-APACHE`). Cargo checks neither: a package without them is
/// published without complaint.
fn missing_files(package: &Value) -> Vec<String> {
    let Some(dir) = package["manifest_path"]
        .as_str()
        .and_then(|m| std::path::Path::new(m).parent())
    else {
        return vec!["Cargo.toml (no manifest_path)".to_owned()];
    };
    let license = package["license"].as_str().unwrap_or_default();
    let mut wanted = vec![package["readme"].as_str().unwrap_or("README.md")];
    if license.contains("MIT") {
        wanted.push("LICENSE-MIT");
    }
    if license.contains("Apache-2.0") {
        wanted.push("LICENSE-APACHE");
    }
    wanted
        .into_iter()
        .filter(|f| !dir.join(f).is_file())
        .map(str::to_owned)
        .collect()
}

/// Reads cargo's status lines in order: which crate is being packaged or verified, and when.
#[derive(Debug, Default)]
struct Tracker {
    /// `(manifest path, crate)`: an error naming a manifest is that crate's, whatever cargo
    /// was doing (manifests are checked before anything is packaged).
    manifests: Vec<(String, String)>,
    packaging: Option<String>,
    verifying: Option<(String, Instant)>,
}

impl Tracker {
    /// Takes one line of cargo's stderr; returns the crate whose verification starts with it.
    fn observe(
        &mut self,
        line: &str,
        now: Instant,
        outcomes: &mut BTreeMap<String, Outcome>,
    ) -> Option<String> {
        let trimmed = line.trim_start();
        let (verb, rest) = trimmed.split_once(' ').unwrap_or((trimmed, ""));
        let subject = rest.split(' ').next().unwrap_or_default();
        match verb {
            "Packaging" => self.packaging = Some(subject.to_owned()),
            "Packaged" => {
                if let Some(o) = self.packaging.as_ref().and_then(|n| outcomes.get_mut(n)) {
                    o.packaged = Some(rest.to_owned());
                }
            }
            "Verifying" => {
                self.finish(now, outcomes);
                self.verifying = Some((subject.to_owned(), now));
                return Some(subject.to_owned());
            }
            // Uploads (aborted: dry run) come after every verification.
            "Uploading" => self.finish(now, outcomes),
            // `error: ...` and compiler errors such as `error[E0432]: ...`.
            v if v.starts_with("error") => {
                let named = self
                    .manifests
                    .iter()
                    .find(|(m, _)| line.contains(m.as_str()))
                    .map(|(_, n)| n);
                let current = named
                    .or(self.verifying.as_ref().map(|(n, _)| n))
                    .or(self.packaging.as_ref());
                if let Some(o) = current.and_then(|n| outcomes.get_mut(n))
                    && o.error.is_none()
                {
                    o.error = Some(trimmed.to_owned());
                }
            }
            _ => {}
        }
        None
    }

    /// Ends the verification in progress, if any: it succeeded unless an error was seen.
    fn finish(&mut self, now: Instant, outcomes: &mut BTreeMap<String, Outcome>) {
        if let Some((name, since)) = self.verifying.take()
            && let Some(o) = outcomes.get_mut(&name)
            && o.error.is_none()
        {
            o.verified_in = Some(now.duration_since(since));
        }
    }
}

/// Cargo's compilation progress lines, which say nothing about packaging.
fn is_progress(line: &str) -> bool {
    let verb = line.split_whitespace().next().unwrap_or_default();
    matches!(
        verb,
        "Compiling" | "Checking" | "Downloaded" | "Downloading" | "Unpacking" | "Blocking"
    )
}

/// The line reported for a crate, after its name: version, package size, verdict.
fn summary(outcome: &Outcome, no_verify: bool, succeeded: bool) -> String {
    let what = outcome.packaged.as_deref().unwrap_or("not packaged");
    let verdict = if let Some(error) = &outcome.error {
        format!("FAILED: {error}")
    } else if let Some(took) = outcome.verified_in {
        format!("ok, verified in {took:.1?}")
    } else if no_verify && outcome.packaged.is_some() {
        // Packaging is the whole check here, and it went through for this crate even when a
        // later one failed.
        "ok (packaging only)".to_owned()
    } else if succeeded {
        "ok".to_owned()
    } else {
        "not reached".to_owned()
    };
    format!("{:<7} {what:<44} {verdict}", outcome.version)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcomes(names: &[&str]) -> BTreeMap<String, Outcome> {
        names
            .iter()
            .map(|n| {
                (
                    (*n).to_owned(),
                    Outcome {
                        version: "0.1.0".into(),
                        ..Outcome::default()
                    },
                )
            })
            .collect()
    }

    #[test]
    fn publishable_members_only() {
        let metadata = serde_json::json!({
            "workspace_members": ["a 0.1.0", "b 0.0.0", "c 0.1.0", "d 0.2.0"],
            "packages": [
                {"id": "a 0.1.0", "name": "a", "version": "0.1.0", "publish": null},
                {"id": "b 0.0.0", "name": "b", "version": "0.0.0", "publish": []},
                {"id": "c 0.1.0", "name": "c", "version": "0.1.0", "publish": ["crates-io"]},
                {"id": "d 0.2.0", "name": "d", "version": "0.2.0", "publish": null},
                {"id": "e 1.0.0", "name": "e", "version": "1.0.0", "publish": null},
            ],
        });
        let found: Vec<(String, String)> = publishable(&metadata)
            .unwrap()
            .into_iter()
            .map(|p| (p.name, p.version))
            .collect();
        assert_eq!(
            found,
            [
                ("a".to_owned(), "0.1.0".to_owned()),
                ("c".to_owned(), "0.1.0".to_owned()),
                ("d".to_owned(), "0.2.0".to_owned()),
            ]
        );
    }

    #[test]
    fn the_workspace_has_publishable_crates_and_not_the_tools() {
        let json = util::output(util::cargo().args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ]))
        .unwrap();
        let crates = publishable(&serde_json::from_str(&json).unwrap()).unwrap();
        let names: Vec<&str> = crates.iter().map(|c| c.name.as_str()).collect();
        for published in ["voxgate-realtime", "voxgate-engine", "voxgate-server"] {
            assert!(names.contains(&published), "{names:?}");
        }
        for tool in ["xtask", "voxgate-examples", "voxgate-test-support"] {
            assert!(!names.contains(&tool), "{names:?}");
        }
        // Every one carries its README and license texts.
        let incomplete: Vec<_> = crates.iter().filter(|c| !c.missing.is_empty()).collect();
        assert!(incomplete.is_empty(), "{incomplete:#?}");
    }

    #[test]
    fn license_texts_follow_the_license_expression() {
        let dir = std::env::temp_dir().join(format!("xtask-publish-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("README.md"), "# a").unwrap();
        std::fs::write(dir.join("LICENSE-MIT"), "MIT").unwrap();
        let manifest = dir.join("Cargo.toml").to_string_lossy().into_owned();
        let package = |license: &str, readme: Value| serde_json::json!({"manifest_path": manifest, "license": license, "readme": readme});
        assert!(missing_files(&package("MIT", Value::Null)).is_empty());
        assert_eq!(
            missing_files(&package("MIT OR Apache-2.0", "README.md".into())),
            ["LICENSE-APACHE"]
        );
        assert_eq!(
            missing_files(&package(
                "(MIT OR Apache-2.0) AND BSD-3-Clause",
                "DOCS.md".into()
            )),
            ["DOCS.md", "LICENSE-APACHE"]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn cargo_output_gives_one_outcome_per_crate() {
        let mut out = outcomes(&["a", "b", "c"]);
        let mut t = Tracker::default();
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        let lines = [
            (0, "   Packaging a v0.1.0 (/w/crates/a)"),
            (0, "    Updating crates.io index"),
            (0, "    Packaged 7 files, 39.8KiB (12.7KiB compressed)"),
            (1, "   Packaging b v0.1.0 (/w/crates/b)"),
            (1, "    Packaged 26 files, 794.7KiB (407.0KiB compressed)"),
            (1, "   Packaging c v0.1.0 (/w/crates/c)"),
            (1, "    Packaged 3 files, 1.0KiB (0.5KiB compressed)"),
            (2, "   Verifying a v0.1.0 (/w/crates/a)"),
            (3, "   Compiling a v0.1.0 (/w/target/package/a-0.1.0)"),
            (
                5,
                "    Finished `dev` profile [unoptimized + debuginfo] target(s) in 3s",
            ),
            (5, "   Verifying b v0.1.0 (/w/crates/b)"),
            (9, "error[E0432]: unresolved import `voxgate_x`"),
            (9, "error: failed to verify package tarball"),
        ];
        let mut started = Vec::new();
        for (s, line) in lines {
            started.extend(t.observe(line, at(s), &mut out));
        }
        t.finish(at(10), &mut out);
        assert_eq!(started, ["a", "b"]);
        assert_eq!(out["a"].verified_in, Some(Duration::from_secs(3)));
        assert_eq!(
            out["a"].packaged.as_deref(),
            Some("7 files, 39.8KiB (12.7KiB compressed)")
        );
        assert_eq!(out["b"].verified_in, None);
        assert_eq!(
            out["b"].error.as_deref(),
            Some("error[E0432]: unresolved import `voxgate_x`")
        );
        assert_eq!(out["c"].verified_in, None);
        assert!(summary(&out["a"], false, false).contains("ok, verified in 3.0s"));
        assert!(summary(&out["b"], false, false).contains("FAILED: error[E0432]"));
        assert!(summary(&out["c"], false, false).contains("not reached"));
    }

    #[test]
    fn an_error_about_a_manifest_names_its_crate() {
        let mut out = outcomes(&["a", "b"]);
        let mut t = Tracker {
            manifests: vec![
                ("/w/crates/a/Cargo.toml".into(), "a".into()),
                ("/w/crates/b/Cargo.toml".into(), "b".into()),
            ],
            ..Tracker::default()
        };
        t.observe(
            "error: failed to verify manifest at `/w/crates/b/Cargo.toml`",
            Instant::now(),
            &mut out,
        );
        assert_eq!(out["a"].error, None);
        assert!(
            out["b"]
                .error
                .as_deref()
                .unwrap()
                .contains("crates/b/Cargo.toml")
        );
    }

    #[test]
    fn an_error_while_packaging_names_the_crate() {
        let mut out = outcomes(&["a", "b"]);
        let mut t = Tracker::default();
        let now = Instant::now();
        for line in [
            "   Packaging a v0.1.0 (/w/crates/a)",
            "    Packaged 7 files, 39.8KiB (12.7KiB compressed)",
            "   Packaging b v0.1.0 (/w/crates/b)",
            "error: failed to prepare local package for uploading",
        ] {
            t.observe(line, now, &mut out);
        }
        assert_eq!(out["a"].error, None);
        assert_eq!(
            out["b"].error.as_deref(),
            Some("error: failed to prepare local package for uploading")
        );
        assert!(summary(&out["a"], true, false).contains("ok (packaging only)"));
        assert!(summary(&out["b"], true, false).contains("FAILED"));
        let ok = Outcome {
            version: "0.1.0".into(),
            packaged: Some("1 files".into()),
            ..Outcome::default()
        };
        assert!(summary(&ok, true, true).contains("ok (packaging only)"));
    }
}
