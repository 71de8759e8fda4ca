//! The Gemini bridge door: apps speak the bridge's JSON protocol to us as they would to a Gemini
//! Live bridge; `engine` mode answers with voxgate's own pipeline, `passthrough` relays to the
//! real Gemini Live API.

use std::sync::Arc;

use axum::Router;
use serde::{Deserialize, Serialize};

use crate::config::ConfigError;
use crate::server::{App, DoorListener};

/// Settings of the Gemini bridge door (`[gemini]` in the configuration file).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GeminiConfig {}

impl GeminiConfig {
    /// Applies the door's `VOXGATE_GEMINI_*` environment overrides.
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

/// The door's routes on the main listener.
pub(crate) fn routes() -> Router<Arc<App>> {
    Router::new()
}

/// The door's own listener (any path), when configured.
pub(crate) fn listeners(_config: &crate::Config) -> Vec<DoorListener> {
    Vec::new()
}
