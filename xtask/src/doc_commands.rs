//! A check that the commands the docs tell people to run name things that exist: every
//! `cargo run -p NAME` / `--package NAME`, `--bin NAME` and `--example NAME` in README.md and
//! docs/ must be a workspace package, binary or example, and a package run without `--bin` or
//! `--example` must have a binary. (A door page once said
//! `cargo run -p voxgate-server`, the library package, and the command failed.)

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("xtask sits in the workspace root")
            .to_path_buf()
    }

    /// The workspace's members, from the root manifest's `members = [...]`.
    fn members(root: &Path) -> Vec<PathBuf> {
        let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
        let start = manifest.find("members = [").expect("a members list");
        let list = &manifest[start..manifest[start..].find(']').unwrap() + start];
        list.split('"')
            .skip(1)
            .step_by(2)
            .map(|m| root.join(m))
            .collect()
    }

    /// `name = "..."` values under `[package]` and `[[bin]]` of a member manifest.
    fn names(manifest: &str) -> (Option<String>, Vec<String>) {
        let mut package = None;
        let mut bins = Vec::new();
        let mut section = "";
        for line in manifest.lines().map(str::trim) {
            if line.starts_with('[') {
                section = line;
                continue;
            }
            let Some(value) = line.strip_prefix("name = \"") else {
                continue;
            };
            let value = value.trim_end_matches('"').to_owned();
            match section {
                "[package]" => package = Some(value),
                "[[bin]]" => bins.push(value),
                _ => {}
            }
        }
        (package, bins)
    }

    fn markdown_files(root: &Path) -> Vec<PathBuf> {
        let mut out = vec![root.join("README.md")];
        let mut dirs = vec![root.join("docs")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "md") {
                    out.push(path);
                }
            }
        }
        out
    }

    #[test]
    fn every_cargo_run_in_the_docs_names_a_real_target() {
        let root = root();
        let (mut packages, mut bins, mut examples) =
            (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
        let mut runnable = BTreeSet::new();
        for member in members(&root) {
            let manifest = std::fs::read_to_string(member.join("Cargo.toml")).unwrap();
            let (package, member_bins) = names(&manifest);
            // A package with src/main.rs and no [[bin]] has a binary of its own name.
            if member_bins.is_empty() && member.join("src/main.rs").is_file() {
                bins.extend(package.clone());
                runnable.extend(package.clone());
            }
            if !member_bins.is_empty() {
                runnable.extend(package.clone());
            }
            bins.extend(member_bins);
            packages.extend(package);
            if let Ok(dir) = std::fs::read_dir(member.join("examples")) {
                for e in dir {
                    let p = e.unwrap().path();
                    if let Some(stem) = p.file_stem() {
                        examples.insert(stem.to_string_lossy().into_owned());
                    }
                }
            }
        }
        let mut wrong = Vec::new();
        let mut checked = 0;
        for file in markdown_files(&root) {
            let text = std::fs::read_to_string(&file).unwrap();
            for (n, line) in text.lines().enumerate() {
                let Some(at) = line.find("cargo run") else {
                    continue;
                };
                let words: Vec<&str> = line[at..]
                    .split(|c: char| c.is_whitespace() || c == '`')
                    .filter(|w| !w.is_empty())
                    .take_while(|w| *w != "--")
                    .collect();
                let picks_target = words.iter().any(|w| *w == "--bin" || *w == "--example");
                for pair in words.windows(2) {
                    let (set, what) = match pair[0] {
                        "-p" | "--package" if picks_target => (&packages, "package"),
                        "-p" | "--package" => (&runnable, "package with a binary"),
                        "--bin" => (&bins, "binary"),
                        "--example" => (&examples, "example"),
                        _ => continue,
                    };
                    checked += 1;
                    if !set.contains(pair[1]) {
                        wrong.push(format!(
                            "{}:{}: no {what} named {:?}",
                            file.strip_prefix(&root).unwrap().display(),
                            n + 1,
                            pair[1]
                        ));
                    }
                }
            }
        }
        assert!(checked > 5, "the docs' commands were found ({checked})");
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }
}
