//! Settings of the Xiaozhi door.

use serde::{Deserialize, Serialize};

use crate::config::ConfigError;

/// Settings of the Xiaozhi door (`[xiaozhi]` in the configuration file).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct XiaozhiConfig {}

impl XiaozhiConfig {
    /// Applies the door's `VOXGATE_XIAOZHI_*` environment overrides.
    pub(crate) fn apply_env(
        &mut self,
        _var: &impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        Ok(())
    }

    /// Replaces secrets with `***` for `--print-config`.
    pub(crate) fn mask_secrets(&mut self) {}

    /// Moves the door's own listeners (those enabled) to free loopback ports.
    pub(crate) fn ephemeral_ports(&mut self) {}

    /// Rejects values out of range.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        Ok(())
    }
}
