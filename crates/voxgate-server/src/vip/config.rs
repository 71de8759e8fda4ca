//! `[vip]`: the VIP browser door's settings and their `VOXGATE_VIP_*` overrides.
//!
//! | key | env | default | |
//! |---|---|---|---|
//! | `enabled` | `VOXGATE_VIP_ENABLED` | `true` | serve `POST /webrtc/offer` |
//! | `playground` | `VOXGATE_VIP_PLAYGROUND` | `true` | serve the playground page at `/` |
//! | `tokens` | `VOXGATE_VIP_TOKENS` (comma-separated) | none | when set, every offer must carry one as `Authorization: Bearer` or `?token=` (masked in `--print-config`) |
//! | `mcp_tools` | `VOXGATE_VIP_MCP_TOOLS` | `true` | offer the MCP endpoint's tools to the conversation |
//!
//! The conversation's `[vip.engine]` and `[vip.llm]`/`[vip.asr]`/`[vip.tts]` sections work as
//! every door's.

use serde::{Deserialize, Serialize};

use crate::config::ConfigError;
use crate::config::env::{EnvVars, Secret};

/// Settings of the VIP browser door (`[vip]` in the configuration file).
///
/// ```toml
/// [vip]
/// enabled = true
/// playground = true      # the page at /
/// tokens = ["..."]       # required of every offer when set
/// mcp_tools = true
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VipConfig {
    /// Serve `POST /webrtc/offer` (and `DELETE /webrtc/sessions/<id>`).
    pub enabled: bool,
    /// Serve the playground page at `/`.
    pub playground: bool,
    /// Tokens; when any is set an offer without one is refused with 401.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<String>,
    /// Offer the tools of the MCP servers connected to `/mcp` to this door's conversations.
    pub mcp_tools: bool,
    /// `[vip.engine]`: engine settings for this door, over `[engine]`.
    #[serde(skip_serializing_if = "crate::config::EngineSettings::is_empty")]
    pub engine: crate::config::EngineSettings,
}

impl Default for VipConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            playground: true,
            tokens: Vec::new(),
            mcp_tools: true,
            engine: crate::config::EngineSettings::default(),
        }
    }
}

impl VipConfig {
    /// Applies the `VOXGATE_VIP_*` overrides.
    pub(crate) fn apply_env(
        &mut self,
        var: &impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        let vars = EnvVars::new(var);
        vars.flag("VOXGATE_VIP_ENABLED", &mut self.enabled)?;
        vars.flag("VOXGATE_VIP_PLAYGROUND", &mut self.playground)?;
        vars.flag("VOXGATE_VIP_MCP_TOOLS", &mut self.mcp_tools)?;
        vars.list("VOXGATE_VIP_TOKENS", &mut self.tokens);
        Ok(())
    }

    /// Replaces secrets with `***` for `--print-config`.
    pub(crate) fn mask_secrets(&mut self) {
        self.tokens.mask();
    }
}
