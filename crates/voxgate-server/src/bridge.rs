//! The Bridge HTTP API: `POST /api/message` (text in, the agent's reply out), `POST
//! /api/perception/event` feeding the perception event bus, and localhost-only `/admin/*`.

use std::sync::Arc;

use axum::Router;
use serde::{Deserialize, Serialize};

use crate::config::ConfigError;
use crate::server::App;

/// Settings of this door (`[bridge]` in the configuration file).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BridgeConfig {}

impl BridgeConfig {
    /// Applies the door's `VOXGATE_BRIDGE_*` environment overrides.
    pub(crate) fn apply_env(
        &mut self,
        _var: &impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        Ok(())
    }

    /// Replaces secrets with `***` for `--print-config`.
    pub(crate) fn mask_secrets(&mut self) {}

    /// Rejects values out of range.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        Ok(())
    }
}

/// The door's routes on the main listener.
pub(crate) fn routes() -> Router<Arc<App>> {
    Router::new()
}
