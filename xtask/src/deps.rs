//! `cargo xtask deps`: enforce the layering of ARCHITECTURE.md from `cargo metadata`.
//!
//! Every workspace package declares its layer in `[package.metadata.voxgate] layer = "..."`:
//! - `codec`: a wire codec. Pure, and independent of every other codec crate.
//! - `pure`: sans-IO logic. Never reaches an async runtime, sockets or the clock.
//! - `io`: runtime glue (providers, server, binaries); anything goes.
//! - `tool`: repository automation (xtask); anything goes.
//!
//! Only normal (non-dev, non-build) dependencies count, walked transitively with all features
//! on, so an optional feature cannot sneak tokio into a pure crate either.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, bail};
use serde_json::Value;

use crate::util;

/// Crates whose presence means a runtime, sockets or OS threads for I/O.
const FORBIDDEN_IN_PURE: &[&str] = &[
    "tokio",
    "async-std",
    "smol",
    "mio",
    "socket2",
    "hyper",
    "axum",
    "reqwest",
    "tungstenite",
    "tokio-tungstenite",
];

pub(crate) fn run() -> anyhow::Result<()> {
    let json =
        util::output(util::cargo().args(["metadata", "--format-version", "1", "--all-features"]))?;
    let metadata: Value = serde_json::from_str(&json).context("parsing cargo metadata")?;
    let violations = check(&metadata)?;
    if violations.is_empty() {
        eprintln!("layering rules hold");
        Ok(())
    } else {
        for v in &violations {
            eprintln!("layering violation: {v}");
        }
        bail!("{} layering violation(s)", violations.len())
    }
}

/// Returns every violation of the layering rules in `cargo metadata` output.
pub(crate) fn check(metadata: &Value) -> anyhow::Result<Vec<String>> {
    let packages = metadata["packages"]
        .as_array()
        .context("metadata has no packages")?;
    let members: BTreeSet<&str> = metadata["workspace_members"]
        .as_array()
        .context("metadata has no workspace_members")?
        .iter()
        .filter_map(Value::as_str)
        .collect();

    let mut name_of = BTreeMap::new();
    let mut layer_of = BTreeMap::new();
    let mut violations = Vec::new();
    for p in packages {
        let id = p["id"].as_str().context("package without id")?;
        let name = p["name"].as_str().context("package without name")?;
        name_of.insert(id, name);
        if members.contains(id) {
            match p["metadata"]["voxgate"]["layer"].as_str() {
                Some(layer @ ("codec" | "pure" | "io" | "tool")) => {
                    layer_of.insert(id, layer);
                }
                Some(other) => violations.push(format!(
                    "{name}: unknown layer `{other}` (expected codec, pure, io or tool)"
                )),
                None => violations.push(format!(
                    "{name}: no `[package.metadata.voxgate] layer` (codec, pure, io or tool)"
                )),
            }
        }
    }

    let mut normal_deps: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for node in metadata["resolve"]["nodes"]
        .as_array()
        .context("metadata has no resolve graph")?
    {
        let id = node["id"].as_str().context("resolve node without id")?;
        let deps = node["deps"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        let normal = deps.iter().filter(|d| {
            d["dep_kinds"]
                .as_array()
                .is_some_and(|kinds| kinds.iter().any(|k| k["kind"].is_null()))
        });
        normal_deps.insert(id, normal.filter_map(|d| d["pkg"].as_str()).collect());
    }

    for (&id, &layer) in &layer_of {
        if !matches!(layer, "codec" | "pure") {
            continue;
        }
        let name = name_of[id];
        // Depth-first walk with a path back to the member, so the message shows the chain.
        let mut stack = vec![(id, vec![name])];
        let mut seen = BTreeSet::from([id]);
        while let Some((at, path)) = stack.pop() {
            for &dep in normal_deps.get(at).map(Vec::as_slice).unwrap_or_default() {
                if !seen.insert(dep) {
                    continue;
                }
                let dep_name = name_of.get(dep).copied().unwrap_or(dep);
                let mut dep_path = path.clone();
                dep_path.push(dep_name);
                if FORBIDDEN_IN_PURE.contains(&dep_name) {
                    violations.push(format!(
                        "{name} is `{layer}` but reaches `{dep_name}`: {}",
                        dep_path.join(" -> ")
                    ));
                }
                if layer == "codec" && layer_of.get(dep) == Some(&"codec") {
                    violations.push(format!(
                        "codec {name} depends on codec {dep_name}: {}",
                        dep_path.join(" -> ")
                    ));
                }
                stack.push((dep, dep_path));
            }
        }
    }
    Ok(violations)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::check;

    fn pkg(name: &str, layer: Option<&str>) -> serde_json::Value {
        let metadata = layer.map_or(json!(null), |l| json!({ "voxgate": { "layer": l } }));
        json!({ "id": name, "name": name, "metadata": metadata })
    }

    fn node(name: &str, deps: &[(&str, Option<&str>)]) -> serde_json::Value {
        let deps: Vec<_> = deps
            .iter()
            .map(|(d, kind)| json!({ "pkg": d, "dep_kinds": [{ "kind": kind }] }))
            .collect();
        json!({ "id": name, "deps": deps })
    }

    fn metadata(
        packages: &[serde_json::Value],
        members: &[&str],
        nodes: &[serde_json::Value],
    ) -> serde_json::Value {
        json!({ "packages": packages, "workspace_members": members, "resolve": { "nodes": nodes } })
    }

    #[test]
    fn transitive_tokio_in_a_pure_crate_is_reported_with_its_chain() {
        let m = metadata(
            &[
                pkg("turn", Some("pure")),
                pkg("helper", None),
                pkg("tokio", None),
            ],
            &["turn"],
            &[
                node("turn", &[("helper", None)]),
                node("helper", &[("tokio", None)]),
                node("tokio", &[]),
            ],
        );
        let v = check(&m).unwrap();
        assert_eq!(
            v,
            ["turn is `pure` but reaches `tokio`: turn -> helper -> tokio"]
        );
    }

    #[test]
    fn dev_dependencies_and_io_crates_may_use_tokio() {
        let m = metadata(
            &[
                pkg("turn", Some("pure")),
                pkg("server", Some("io")),
                pkg("tokio", None),
            ],
            &["turn", "server"],
            &[
                node("turn", &[("tokio", Some("dev"))]),
                node("server", &[("tokio", None)]),
                node("tokio", &[]),
            ],
        );
        assert!(check(&m).unwrap().is_empty());
    }

    #[test]
    fn codecs_must_not_depend_on_each_other_and_layers_are_required() {
        let m = metadata(
            &[
                pkg("a", Some("codec")),
                pkg("b", Some("codec")),
                pkg("c", None),
            ],
            &["a", "b", "c"],
            &[node("a", &[("b", None)]), node("b", &[]), node("c", &[])],
        );
        let v = check(&m).unwrap();
        assert_eq!(
            v,
            [
                "c: no `[package.metadata.voxgate] layer` (codec, pure, io or tool)",
                "codec a depends on codec b: a -> b",
            ]
        );
    }
}
