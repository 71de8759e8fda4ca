//! `[retell]`: settings of the Retell custom-LLM door, with `VOXGATE_RETELL_*` overrides.

use serde::{Deserialize, Serialize};
use voxgate_retell::AgentConfig;

use crate::config::ConfigError;
use crate::config::env::{EnvVars, Secret};

/// Settings of the Retell door (`[retell]` in the configuration file).
///
/// ```toml
/// [retell]
/// enabled = true
/// begin_message = ""                  # "" lets the user speak first
/// begin_after_call_details = false    # true: begin only once call_details arrived
/// system_prompt = "You are a friendly voice agent on a phone call. Keep answers short."
/// auto_reconnect = true               # Retell pings every 2 s and reconnects when we go silent
/// call_details = true                 # ask Retell for the call object
/// transcript_with_tool_calls = true
/// resume_window_secs = 60             # a call's state outlives its socket this long
/// max_frame_bytes = 16777216
/// transfer_number = ""                # used when the model transfers without a number
/// end_call_tool = true
/// transfer_tool = true
/// max_tool_rounds = 4
/// context_max_utterances = 50         # the model sees at most the newest 50 transcript entries
/// context_max_chars = 16000           # ... and at most 16,000 characters of them
/// apology = "Sorry, something went wrong on my side. Could you say that again?"
/// metadata = true                     # a metadata event after each finished response
/// control_token = ""                  # bearer for /retell/calls/*; "" = local requests only
/// secret = ""                         # socket URL secret: /llm-websocket/{secret}/{call_id}
///
/// [retell.agent]                      # sent as update_agent when the call starts
/// responsiveness = 0.8
/// interruption_sensitivity = 0.6
/// reminder_trigger_ms = 10000
/// reminder_max_count = 1
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetellConfig {
    /// Serve `/llm-websocket/{call_id}` and the control API.
    pub enabled: bool,
    /// Text of the begin message (`response_id` 0); empty means "wait for the user".
    pub begin_message: String,
    /// Send the begin message only once `call_details` arrives (Retell's Node example) instead
    /// of right after the config (its Python example). Needs `call_details = true`.
    pub begin_after_call_details: bool,
    /// Instructions given to the model before the transcript. `{{name}}` is replaced by the
    /// call's `retell_llm_dynamic_variables`.
    pub system_prompt: String,
    /// `config.auto_reconnect`: ping/pong every 2 s and reconnects when a side goes silent.
    pub auto_reconnect: bool,
    /// `config.call_details`: ask Retell for the call object.
    pub call_details: bool,
    /// `config.transcript_with_tool_calls`: Retell weaves our tool calls into transcripts, so
    /// later turns show the model its own tool results.
    pub transcript_with_tool_calls: bool,
    /// How long a call's state (begin sent, call details, interrupt ids) is kept after its
    /// socket closes, so a reconnect to the same `call_id` resumes. 0 forgets at once.
    pub resume_window_secs: u64,
    /// Largest inbound frame. Transcripts grow with the call; keep it at several MiB.
    pub max_frame_bytes: usize,
    /// Largest state one closed call keeps for its resume window (its conversation as the
    /// cluster store saves it: the pending request's transcript, call details, ids); a call
    /// over it is forgotten as its socket closes and a reconnect starts afresh. Default
    /// 1 MiB.
    pub max_parked_call_bytes: usize,
    /// Most bytes all closed calls keep together; beyond, the longest parked are forgotten.
    /// Default 64 MiB.
    pub max_parked_bytes: usize,
    /// Number used when the model calls `transfer_call` without one; empty: the model must
    /// give one.
    pub transfer_number: String,
    /// Offer the model an `end_call` tool (the response then carries `end_call: true`).
    pub end_call_tool: bool,
    /// Offer the model a `transfer_call` tool (the response then carries `transfer_number`).
    pub transfer_tool: bool,
    /// Tool rounds per response at most (a model looping on tools is cut off).
    pub max_tool_rounds: u32,
    /// The model sees at most this many of the newest transcript entries (an utterance, or a
    /// tool result), so a long call's context does not grow without bound: Retell sends the
    /// whole transcript with every request. At least 1.
    pub context_max_utterances: usize,
    /// The model sees at most this many characters of the newest transcript entries (content
    /// and tool call arguments); older entries are left out, and a single newest entry longer
    /// than this keeps only its end. At least 1.
    pub context_max_chars: usize,
    /// Said instead when the model fails or a request frame is unreadable.
    pub apology: String,
    /// Send a `metadata` event (response id, tools used, actions) after each response.
    pub metadata: bool,
    /// Bearer token for the control API (`/retell/calls/...`). Empty: the control API only
    /// answers local requests (a loopback peer that is not a trusted proxy; `crate::access`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub control_token: String,
    /// Secret the socket URL must carry: `/llm-websocket/{secret}/{call_id}` (paste
    /// `wss://host/llm-websocket/{secret}` into Retell, which appends the call id) or
    /// `/llm-websocket/{call_id}?secret={secret}`. Empty: no secret, any socket URL is served.
    /// Letters, digits, `-`, `_`, `.` and `~` only, so it goes into a URL as written.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub secret: String,
    /// Agent settings sent as `update_agent` once per call; nothing is sent when all are unset.
    pub agent: RetellAgentSettings,
    /// Offer the tools of the external MCP servers connected to `/mcp` to this door's
    /// conversations (run by the server, bounded by `[mcp] call_timeout_secs`). Default on:
    /// only the operator's `/mcp` endpoint supplies them.
    pub mcp_tools: bool,
    /// `[retell.engine]`: engine settings for this door, over `[engine]`: only `greeting` (the begin message) and `max_context_chars`.
    #[serde(skip_serializing_if = "crate::config::EngineSettings::is_empty")]
    pub engine: crate::config::EngineSettings,
}

/// `[retell.agent]`: the `update_agent` body.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetellAgentSettings {
    /// 0..=1: lower waits longer before answering.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub responsiveness: Option<f64>,
    /// 0..=1: higher lets the user interrupt the agent more easily.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interruption_sensitivity: Option<f64>,
    /// Silence after agent speech (ms) before Retell asks for a reminder.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reminder_trigger_ms: Option<u64>,
    /// Reminders in a row at most; 0 disables reminders.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reminder_max_count: Option<u64>,
}

impl RetellAgentSettings {
    /// The `update_agent` body, `None` when nothing is configured.
    pub(crate) fn to_agent_config(&self) -> Option<AgentConfig> {
        if *self == Self::default() {
            return None;
        }
        #[allow(clippy::cast_precision_loss, reason = "milliseconds far below 2^52")]
        let reminder_trigger_ms = self.reminder_trigger_ms.map(|ms| ms as f64);
        Some(AgentConfig {
            responsiveness: self.responsiveness,
            interruption_sensitivity: self.interruption_sensitivity,
            reminder_trigger_ms,
            reminder_max_count: self.reminder_max_count,
            ..AgentConfig::default()
        })
    }
}

/// Default `system_prompt`.
pub(crate) const DEFAULT_SYSTEM_PROMPT: &str = "You are a friendly voice agent answering a phone call. \
    Keep answers short and conversational: they are spoken aloud. Call end_call when the caller \
    says goodbye, and transfer_call when they ask for a human.";

/// Default `apology`.
pub(crate) const DEFAULT_APOLOGY: &str =
    "Sorry, something went wrong on my side. Could you say that again?";

/// Default `context_max_utterances`: a few minutes of conversation.
pub(crate) const DEFAULT_CONTEXT_MAX_UTTERANCES: usize = 50;

/// Default `context_max_chars`: about 4,000 tokens of transcript.
pub(crate) const DEFAULT_CONTEXT_MAX_CHARS: usize = 16_000;

/// Default `max_frame_bytes`: 16 MiB (Retell sends the whole transcript in every event).
pub(crate) const DEFAULT_MAX_FRAME_BYTES: usize = 16 << 20;

impl Default for RetellConfig {
    fn default() -> Self {
        Self {
            mcp_tools: true,
            enabled: true,
            begin_message: String::new(),
            begin_after_call_details: false,
            system_prompt: DEFAULT_SYSTEM_PROMPT.into(),
            auto_reconnect: true,
            call_details: true,
            transcript_with_tool_calls: true,
            resume_window_secs: 60,
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            max_parked_call_bytes: super::registry::MAX_PARKED_CALL_BYTES,
            max_parked_bytes: super::registry::MAX_PARKED_BYTES,
            transfer_number: String::new(),
            end_call_tool: true,
            transfer_tool: true,
            max_tool_rounds: 4,
            context_max_utterances: DEFAULT_CONTEXT_MAX_UTTERANCES,
            context_max_chars: DEFAULT_CONTEXT_MAX_CHARS,
            apology: DEFAULT_APOLOGY.into(),
            metadata: true,
            control_token: String::new(),
            secret: String::new(),
            agent: RetellAgentSettings::default(),
            engine: crate::config::EngineSettings::default(),
        }
    }
}

impl RetellConfig {
    /// This configuration as a call sees it, with the engine settings that apply to Retell:
    /// `[retell.engine]` over this section's `begin_message` and `context_max_chars` (when
    /// changed from their defaults: the door's own spelling of the same settings) over
    /// `[engine]`. `greeting` becomes the begin message (`""`: the user speaks first),
    /// `max_context_chars` the context bound (0: unlimited).
    #[must_use]
    pub(crate) fn with_engine(&self, server: &crate::config::EngineSettings) -> Self {
        use crate::config::engine::Greeting;
        let own = crate::config::EngineSettings {
            greeting: (!self.begin_message.is_empty()).then(|| self.begin_message.clone()),
            max_context_chars: (self.context_max_chars != DEFAULT_CONTEXT_MAX_CHARS)
                .then_some(self.context_max_chars),
            ..crate::config::EngineSettings::default()
        };
        let settings = self.engine.over(&own.over(server));
        let mut c = self.clone();
        match settings.greeting() {
            Greeting::Default => {}
            Greeting::Off => c.begin_message.clear(),
            Greeting::Say(words) => words.clone_into(&mut c.begin_message),
        }
        if let Some(n) = settings.max_context_chars {
            c.context_max_chars = if n == 0 { usize::MAX } else { n };
        }
        c
    }

    /// Applies the door's `VOXGATE_RETELL_*` environment overrides (see docs/doors/retell.md).
    pub(crate) fn apply_env(
        &mut self,
        var: &impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        let vars = EnvVars::new(var);
        vars.flag("VOXGATE_RETELL_ENABLED", &mut self.enabled)?;
        vars.flag("VOXGATE_RETELL_MCP_TOOLS", &mut self.mcp_tools)?;
        vars.string("VOXGATE_RETELL_BEGIN_MESSAGE", &mut self.begin_message);
        let after_details = &mut self.begin_after_call_details;
        vars.flag("VOXGATE_RETELL_BEGIN_AFTER_CALL_DETAILS", after_details)?;
        vars.string("VOXGATE_RETELL_SYSTEM_PROMPT", &mut self.system_prompt);
        vars.flag("VOXGATE_RETELL_AUTO_RECONNECT", &mut self.auto_reconnect)?;
        vars.flag("VOXGATE_RETELL_CALL_DETAILS", &mut self.call_details)?;
        let with_tools = &mut self.transcript_with_tool_calls;
        vars.flag("VOXGATE_RETELL_TRANSCRIPT_WITH_TOOL_CALLS", with_tools)?;
        vars.parsed(
            "VOXGATE_RETELL_RESUME_WINDOW_SECS",
            &mut self.resume_window_secs,
        )?;
        vars.parsed("VOXGATE_RETELL_MAX_FRAME_BYTES", &mut self.max_frame_bytes)?;
        vars.parsed(
            "VOXGATE_RETELL_MAX_PARKED_CALL_BYTES",
            &mut self.max_parked_call_bytes,
        )?;
        vars.parsed(
            "VOXGATE_RETELL_MAX_PARKED_BYTES",
            &mut self.max_parked_bytes,
        )?;
        vars.string("VOXGATE_RETELL_TRANSFER_NUMBER", &mut self.transfer_number);
        vars.flag("VOXGATE_RETELL_END_CALL_TOOL", &mut self.end_call_tool)?;
        vars.flag("VOXGATE_RETELL_TRANSFER_TOOL", &mut self.transfer_tool)?;
        vars.parsed("VOXGATE_RETELL_MAX_TOOL_ROUNDS", &mut self.max_tool_rounds)?;
        vars.parsed(
            "VOXGATE_RETELL_CONTEXT_MAX_UTTERANCES",
            &mut self.context_max_utterances,
        )?;
        vars.parsed(
            "VOXGATE_RETELL_CONTEXT_MAX_CHARS",
            &mut self.context_max_chars,
        )?;
        vars.string("VOXGATE_RETELL_APOLOGY", &mut self.apology);
        vars.flag("VOXGATE_RETELL_METADATA", &mut self.metadata)?;
        vars.string("VOXGATE_RETELL_CONTROL_TOKEN", &mut self.control_token);
        vars.string("VOXGATE_RETELL_SECRET", &mut self.secret);
        let agent = &mut self.agent;
        vars.parsed_some("VOXGATE_RETELL_RESPONSIVENESS", &mut agent.responsiveness)?;
        vars.parsed_some(
            "VOXGATE_RETELL_INTERRUPTION_SENSITIVITY",
            &mut agent.interruption_sensitivity,
        )?;
        vars.parsed_some(
            "VOXGATE_RETELL_REMINDER_TRIGGER_MS",
            &mut agent.reminder_trigger_ms,
        )?;
        vars.parsed_some(
            "VOXGATE_RETELL_REMINDER_MAX_COUNT",
            &mut agent.reminder_max_count,
        )?;
        Ok(())
    }

    /// Replaces secrets with `***` for `--print-config`.
    pub(crate) fn mask_secrets(&mut self) {
        self.control_token.mask();
        self.secret.mask();
    }

    /// Rejects values out of range.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(format!("[retell] {m}")));
        if self.begin_after_call_details && !self.call_details {
            return bad(
                "begin_after_call_details = true needs call_details = true, or the begin \
                 message is never sent"
                    .into(),
            );
        }
        if self.max_frame_bytes < 64 * 1024 {
            return bad(format!(
                "max_frame_bytes = {} is below the minimum of 65536 (transcripts grow with the call)",
                self.max_frame_bytes
            ));
        }
        if !self
            .secret
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~'))
        {
            // The value itself is not shown: it is a secret.
            return bad(
                "secret may hold only letters, digits, '-', '_', '.' and '~' (it goes into \
                 the socket URL as written); `openssl rand -hex 32` makes a good one"
                    .into(),
            );
        }
        if self.context_max_utterances == 0 || self.context_max_chars == 0 {
            return bad(
                "context_max_utterances and context_max_chars must be at least 1, or the model \
                 never sees what the caller said"
                    .into(),
            );
        }
        for (name, v) in [
            ("responsiveness", self.agent.responsiveness),
            (
                "interruption_sensitivity",
                self.agent.interruption_sensitivity,
            ),
        ] {
            if let Some(v) = v
                && !(0.0..=1.0).contains(&v)
            {
                return bad(format!("agent.{name} = {v} is outside 0..=1"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_overrides_and_checks() {
        let mut c = RetellConfig::default();
        let env = |k: &str| match k {
            "VOXGATE_RETELL_BEGIN_MESSAGE" => Some("Hi there".to_owned()),
            "VOXGATE_RETELL_BEGIN_AFTER_CALL_DETAILS" => Some("yes".to_owned()),
            "VOXGATE_RETELL_RESUME_WINDOW_SECS" => Some("5".to_owned()),
            "VOXGATE_RETELL_REMINDER_MAX_COUNT" => Some("2".to_owned()),
            "VOXGATE_RETELL_CONTROL_TOKEN" => Some("tok".to_owned()),
            "VOXGATE_RETELL_SECRET" => Some("s3cr3t-Path_ok.~".to_owned()),
            "VOXGATE_RETELL_CONTEXT_MAX_UTTERANCES" => Some("20".to_owned()),
            "VOXGATE_RETELL_CONTEXT_MAX_CHARS" => Some("4000".to_owned()),
            _ => None,
        };
        c.apply_env(&env).unwrap();
        assert_eq!(c.begin_message, "Hi there");
        assert!(c.begin_after_call_details);
        assert_eq!(c.resume_window_secs, 5);
        assert_eq!(c.agent.reminder_max_count, Some(2));
        assert_eq!((c.context_max_utterances, c.context_max_chars), (20, 4000));
        assert_eq!(c.secret, "s3cr3t-Path_ok.~");
        c.check().unwrap();
        let mut shown = c.clone();
        shown.mask_secrets();
        assert_eq!(shown.control_token, "***");
        assert_eq!(shown.secret, "***");
        for bad in ["a/b", "a?b", "a b", "a%2Fb", "ä"] {
            let c = RetellConfig {
                secret: bad.into(),
                ..RetellConfig::default()
            };
            let e = c.check().unwrap_err().to_string();
            assert!(!e.contains(bad), "{e}");
        }
        c.call_details = false;
        assert!(c.check().is_err());
        let bad = RetellConfig::default()
            .apply_env(&|k: &str| (k == "VOXGATE_RETELL_ENABLED").then(|| "maybe".into()));
        assert!(matches!(bad, Err(ConfigError::Env { .. })));
        let mut c = RetellConfig::default();
        c.agent.responsiveness = Some(1.5);
        assert!(c.check().is_err());
        let c = RetellConfig {
            context_max_chars: 0,
            ..RetellConfig::default()
        };
        assert!(c.check().is_err());
    }

    #[test]
    fn agent_update_only_when_configured() {
        assert_eq!(RetellAgentSettings::default().to_agent_config(), None);
        let a = RetellAgentSettings {
            reminder_trigger_ms: Some(5000),
            ..RetellAgentSettings::default()
        };
        assert_eq!(
            a.to_agent_config().unwrap().reminder_trigger_ms,
            Some(5000.0)
        );
    }
}
