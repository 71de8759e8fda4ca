//! The `[engine]` section and its per-door overrides (`[xiaozhi.engine]`, `[realtime.engine]`,
//! `[gemini.engine]`, `[retell.engine]`, `[bridge.engine]`): the conversation engine's timing
//! and budgets in operator units (milliseconds, plain numbers), see `docs/engine.md`.
//!
//! Every key is optional. The sections are overlays, field by field: a door's value wins, else
//! the server's `[engine]` value, else the door's own code default (doors differ: a Xiaozhi
//! device and a realtime client do not start from the same [`EngineConfig`]). Nothing here
//! builds a configuration; [`EngineSettings::apply`] changes the one a door built.
//!
//! ```toml
//! [engine]
//! endpoint_delay_ms = 500          # silence after speech before a finished-looking turn ends
//! vad_stop_ms = 300
//!
//! [xiaozhi.engine]                 # devices in a noisy hall
//! vad_min_volume = 0.5
//! greeting = "Hi! What can I do for you?"
//! ```

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use voxgate_audio::vad::{MAX_BACKBUFFER_DURATION, MAX_START_DURATION, MAX_STOP_DURATION};
use voxgate_engine::EngineConfig;

use super::ConfigError;
use super::env::EnvVars;

/// Longest endpointing or interruption delay accepted: past 10 s a conversation has stalled,
/// and a typo (`50000` for `500`) is caught rather than served.
pub const MAX_DELAY_MS: u64 = 10_000;
/// Most transcript words an interruption may be made to wait for.
pub const MAX_INTERRUPTION_WORDS: u32 = 50;
/// Longest greeting, in characters (a greeting is a sentence or two).
pub const MAX_GREETING_CHARS: usize = 2_000;
/// Largest context budget accepted (about 250 000 tokens, beyond any current model).
pub const MAX_CONTEXT_CHARS: usize = 1_000_000;
/// Most sentences a spoken reply may synthesize ahead of the one playing: each is a
/// synthesizer run (a process for command voices) and its audio held.
pub const MAX_SENTENCES_AHEAD: usize = 8;
/// Longest utterance kept for transcription, in seconds: an utterance is held in memory
/// (about 64 kB a second), so this bounds a session's audio buffer.
pub const MAX_UTTERANCE_SECS: u64 = 120;

/// A number from 0 to 1 (a probability, a volume). Compared by bits, so it is `Eq` like the
/// door sections that hold it (the loader refuses NaN, the only value for which that differs).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Fraction(pub f64);

impl PartialEq for Fraction {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for Fraction {}

impl Fraction {
    /// As the engine's `f32`.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "checked to lie within 0..=1, which f32 holds"
    )]
    #[must_use]
    pub fn as_f32(self) -> f32 {
        self.0 as f32
    }
}

impl FromStr for Fraction {
    type Err = std::num::ParseFloatError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(Self)
    }
}

impl fmt::Display for Fraction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Engine settings an operator may change: `[engine]`, or a door's `[<door>.engine]`.
/// `None` leaves the value to the next layer (see the [module docs](self)).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineSettings {
    /// VAD: model score (0 to 1) a 16 ms frame needs to count as speech. Code default 0.5.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vad_threshold: Option<Fraction>,
    /// VAD: volume (0 to 1, a scale from -60 dBFS to 0 dBFS) a frame needs to count as speech,
    /// so quiet background talk does not open a turn. Code default 0.3.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vad_min_volume: Option<Fraction>,
    /// VAD: speech needed before the user counts as speaking, in ms (0 to 2000). Code
    /// default 96.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vad_start_ms: Option<u64>,
    /// VAD: silence needed before the user counts as done speaking, in ms (0 to 10000).
    /// Code default 200. The turn then waits `endpoint_delay_ms` more.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vad_stop_ms: Option<u64>,
    /// VAD: audio kept from before the detected start of speech, in ms (0 to 3000). Code
    /// default 500.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vad_backbuffer_ms: Option<u64>,
    /// Endpointing: silence after the VAD's end of speech before the user's turn ends, when
    /// it looks finished (the transcript is final), in ms (0 to 10000). Code default 100.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint_delay_ms: Option<u64>,
    /// Endpointing: the longest wait after end of speech, while the recognizer has not
    /// finalized the last words, in ms (0 to 10000; never shorter than `endpoint_delay_ms`).
    /// Code default 2000.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint_max_delay_ms: Option<u64>,
    /// Interruption policy: user speech must last this long while the agent speaks before it
    /// interrupts the agent, in ms (0 to 10000). Code default 300.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interruption_min_speech_ms: Option<u64>,
    /// Interruption policy: transcript words also needed before an interruption counts (0 to
    /// 50; 0: speech alone interrupts). CJK characters count one word each. Code default 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interruption_min_words: Option<u32>,
    /// Interruption policy: an interruption that produced no words this long after the user
    /// stopped was noise, in ms (0 to 10000). Code default 1500.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub false_interruption_timeout_ms: Option<u64>,
    /// Interruption policy: after a false interruption, say the unheard rest of the reply.
    /// Code default true.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resume_false_interruptions: Option<bool>,
    /// Words the agent says verbatim when a session starts (at most 2000 characters); `""`
    /// turns a greeting off. Unset keeps the door's behaviour (see `docs/engine.md`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub greeting: Option<String>,
    /// Largest LLM context, in characters (about four a token in English; 0: unlimited, at
    /// most 1000000): beyond it the oldest exchanges leave the model's context. Code default
    /// 32000.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_context_chars: Option<usize>,
    /// Longest utterance kept for transcription, in seconds (1 to 120); audio beyond it is
    /// dropped. Code default 60.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_utterance_secs: Option<u64>,
    /// Spoken replies: sentences synthesized ahead of the one playing (1 to 8); later ones
    /// wait for playback, so a long reply costs a few synthesizer runs at a time. Code
    /// default 2.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_sentences_ahead: Option<usize>,
    /// Speculative generation at pauses in speech: recognize, generate and synthesize the
    /// first sentence ahead of the turn's end, kept only if the pause ends the turn (an extra
    /// recognition, and often a generation, for every pause that does not). Code default
    /// false; off on a door without a recognizer whatever is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculate: Option<bool>,
    /// Speculation: non-speech the VAD must hear inside an utterance before speculating, in ms
    /// (0 to 10000; up to 16, one VAD frame: at its first non-speech frame; at or beyond
    /// `vad_stop_ms`: never). Code default 64.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculate_after_ms: Option<u64>,
    /// The door has no recognizer (`NoAsr`), set when the configuration is loaded: speculation
    /// stays off there (it would speculate on a placeholder transcript). Not a key.
    #[serde(skip)]
    pub(crate) no_recognizer: bool,
}

/// What a door does at the start of a session (or, for a Xiaozhi device, on its wake word).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Greeting<'a> {
    /// Nothing configured: the door's own behaviour.
    Default,
    /// `greeting = ""`: no greeting.
    Off,
    /// Say these words.
    Say(&'a str),
}

/// Which keys a section may set: a door that does not run the engine's audio path refuses the
/// keys that would have no effect there, so a setting is never silently ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// `[engine]` and the audio doors (Xiaozhi, realtime, Gemini): every key.
    All,
    /// `[retell.engine]`: Retell does its own listening and turn-taking (its knobs are in
    /// `[retell.agent]`); only `greeting` and `max_context_chars` apply.
    Retell,
    /// `[bridge.engine]`: text turns over HTTP; only `max_context_chars` applies.
    Bridge,
}

impl EngineSettings {
    /// Whether no key is set (the section is left out of `--print-config`).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// `self` over `base`, field by field: each key set here wins, the others come from
    /// `base`. A door's section goes over the server's: `door.over(&server)`.
    #[must_use]
    pub fn over(&self, base: &Self) -> Self {
        Self {
            vad_threshold: self.vad_threshold.or(base.vad_threshold),
            vad_min_volume: self.vad_min_volume.or(base.vad_min_volume),
            vad_start_ms: self.vad_start_ms.or(base.vad_start_ms),
            vad_stop_ms: self.vad_stop_ms.or(base.vad_stop_ms),
            vad_backbuffer_ms: self.vad_backbuffer_ms.or(base.vad_backbuffer_ms),
            endpoint_delay_ms: self.endpoint_delay_ms.or(base.endpoint_delay_ms),
            endpoint_max_delay_ms: self.endpoint_max_delay_ms.or(base.endpoint_max_delay_ms),
            interruption_min_speech_ms: self
                .interruption_min_speech_ms
                .or(base.interruption_min_speech_ms),
            interruption_min_words: self.interruption_min_words.or(base.interruption_min_words),
            false_interruption_timeout_ms: self
                .false_interruption_timeout_ms
                .or(base.false_interruption_timeout_ms),
            resume_false_interruptions: self
                .resume_false_interruptions
                .or(base.resume_false_interruptions),
            greeting: self.greeting.clone().or_else(|| base.greeting.clone()),
            max_context_chars: self.max_context_chars.or(base.max_context_chars),
            max_utterance_secs: self.max_utterance_secs.or(base.max_utterance_secs),
            max_sentences_ahead: self.max_sentences_ahead.or(base.max_sentences_ahead),
            speculate: self.speculate.or(base.speculate),
            speculate_after_ms: self.speculate_after_ms.or(base.speculate_after_ms),
            no_recognizer: self.no_recognizer,
        }
    }

    /// Sets every configured value in `c`, a door's engine configuration; unset keys leave
    /// the door's value.
    pub fn apply(&self, c: &mut EngineConfig) {
        let ms = Duration::from_millis;
        if let Some(v) = self.vad_threshold {
            c.vad.confidence_threshold = v.as_f32();
        }
        if let Some(v) = self.vad_min_volume {
            c.vad.min_volume = v.as_f32();
        }
        if let Some(v) = self.vad_start_ms {
            c.vad.start_duration = ms(v);
        }
        if let Some(v) = self.vad_stop_ms {
            c.vad.stop_duration = ms(v);
        }
        if let Some(v) = self.vad_backbuffer_ms {
            c.vad.backbuffer_duration = ms(v);
        }
        if let Some(v) = self.endpoint_delay_ms {
            c.turn.min_endpoint_delay = ms(v);
        }
        if let Some(v) = self.endpoint_max_delay_ms {
            c.turn.max_endpoint_delay = ms(v);
        }
        if let Some(v) = self.interruption_min_speech_ms {
            c.turn.min_interruption_speech = ms(v);
        }
        if let Some(v) = self.interruption_min_words {
            c.turn.min_interruption_words = v;
        }
        if let Some(v) = self.false_interruption_timeout_ms {
            c.turn.false_interruption_timeout = ms(v);
        }
        if let Some(v) = self.resume_false_interruptions {
            c.turn.resume_false_interruptions = v;
        }
        if let Some(v) = self.max_context_chars {
            c.max_context_chars = v;
        }
        if let Some(v) = self.max_utterance_secs {
            c.max_utterance = Duration::from_secs(v);
        }
        if let Some(v) = self.max_sentences_ahead {
            c.max_sentences_ahead = v;
        }
        if let Some(v) = self.speculate {
            c.speculation.enabled = v;
        }
        if let Some(v) = self.speculate_after_ms {
            c.speculation.after_silence = ms(v);
        }
        if self.no_recognizer {
            c.speculation.enabled = false;
        }
    }

    /// The configured greeting.
    #[must_use]
    pub fn greeting(&self) -> Greeting<'_> {
        match self.greeting.as_deref() {
            None => Greeting::Default,
            Some(t) if t.trim().is_empty() => Greeting::Off,
            Some(t) => Greeting::Say(t),
        }
    }

    /// Rejects values out of range and keys `scope` does not use, naming the section
    /// (`engine`, `xiaozhi.engine`) and the key.
    pub(crate) fn check(&self, section: &str, scope: Scope) -> Result<(), ConfigError> {
        let bad =
            |key: &str, m: String| Err(ConfigError::Invalid(format!("[{section}] {key} {m}")));
        for (key, v) in [
            ("vad_threshold", self.vad_threshold),
            ("vad_min_volume", self.vad_min_volume),
        ] {
            if let Some(v) = v
                && !(0.0..=1.0).contains(&v.0)
            {
                return bad(key, format!("= {v} is out of range (0 to 1)"));
            }
        }
        let max_ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        for (key, v, max) in [
            (
                "vad_start_ms",
                self.vad_start_ms,
                max_ms(MAX_START_DURATION),
            ),
            ("vad_stop_ms", self.vad_stop_ms, max_ms(MAX_STOP_DURATION)),
            (
                "vad_backbuffer_ms",
                self.vad_backbuffer_ms,
                max_ms(MAX_BACKBUFFER_DURATION),
            ),
            ("endpoint_delay_ms", self.endpoint_delay_ms, MAX_DELAY_MS),
            (
                "endpoint_max_delay_ms",
                self.endpoint_max_delay_ms,
                MAX_DELAY_MS,
            ),
            (
                "interruption_min_speech_ms",
                self.interruption_min_speech_ms,
                MAX_DELAY_MS,
            ),
            (
                "false_interruption_timeout_ms",
                self.false_interruption_timeout_ms,
                MAX_DELAY_MS,
            ),
            ("speculate_after_ms", self.speculate_after_ms, MAX_DELAY_MS),
        ] {
            if let Some(v) = v
                && v > max
            {
                return bad(key, format!("= {v} ms is out of range (0 to {max})"));
            }
        }
        if let (Some(min), Some(max)) = (self.endpoint_delay_ms, self.endpoint_max_delay_ms)
            && max < min
        {
            return bad(
                "endpoint_max_delay_ms",
                format!("= {max} is shorter than endpoint_delay_ms = {min}"),
            );
        }
        if let Some(n) = self.interruption_min_words
            && n > MAX_INTERRUPTION_WORDS
        {
            return bad(
                "interruption_min_words",
                format!("= {n} is out of range (0 to {MAX_INTERRUPTION_WORDS})"),
            );
        }
        if let Some(g) = &self.greeting
            && g.chars().count() > MAX_GREETING_CHARS
        {
            return bad(
                "greeting",
                format!("is longer than {MAX_GREETING_CHARS} characters"),
            );
        }
        if let Some(n) = self.max_context_chars
            && n > MAX_CONTEXT_CHARS
        {
            return bad(
                "max_context_chars",
                format!("= {n} is out of range (0 to {MAX_CONTEXT_CHARS}; 0: unlimited)"),
            );
        }
        if let Some(s) = self.max_utterance_secs
            && !(1..=MAX_UTTERANCE_SECS).contains(&s)
        {
            return bad(
                "max_utterance_secs",
                format!("= {s} is out of range (1 to {MAX_UTTERANCE_SECS})"),
            );
        }
        if let Some(n) = self.max_sentences_ahead
            && !(1..=MAX_SENTENCES_AHEAD).contains(&n)
        {
            return bad(
                "max_sentences_ahead",
                format!("= {n} is out of range (1 to {MAX_SENTENCES_AHEAD})"),
            );
        }
        let allowed: &[&str] = match scope {
            Scope::All => return Ok(()),
            Scope::Retell => &["greeting", "max_context_chars"],
            Scope::Bridge => &["max_context_chars"],
        };
        let why = match scope {
            Scope::Retell => {
                "has no effect on the Retell door: Retell listens and takes turns itself (see \
                 [retell.agent])"
            }
            _ => "has no effect on the Bridge door: it serves text turns",
        };
        match self.set_keys().into_iter().find(|k| !allowed.contains(k)) {
            Some(key) => bad(key, why.to_owned()),
            None => Ok(()),
        }
    }

    /// The names of the keys that are set.
    fn set_keys(&self) -> Vec<&'static str> {
        let mut keys = Vec::new();
        let mut add = |name, set: bool| {
            if set {
                keys.push(name);
            }
        };
        add("vad_threshold", self.vad_threshold.is_some());
        add("vad_min_volume", self.vad_min_volume.is_some());
        add("vad_start_ms", self.vad_start_ms.is_some());
        add("vad_stop_ms", self.vad_stop_ms.is_some());
        add("vad_backbuffer_ms", self.vad_backbuffer_ms.is_some());
        add("endpoint_delay_ms", self.endpoint_delay_ms.is_some());
        add(
            "endpoint_max_delay_ms",
            self.endpoint_max_delay_ms.is_some(),
        );
        add(
            "interruption_min_speech_ms",
            self.interruption_min_speech_ms.is_some(),
        );
        add(
            "interruption_min_words",
            self.interruption_min_words.is_some(),
        );
        add(
            "false_interruption_timeout_ms",
            self.false_interruption_timeout_ms.is_some(),
        );
        add(
            "resume_false_interruptions",
            self.resume_false_interruptions.is_some(),
        );
        add("greeting", self.greeting.is_some());
        add("max_context_chars", self.max_context_chars.is_some());
        add("max_utterance_secs", self.max_utterance_secs.is_some());
        add("max_sentences_ahead", self.max_sentences_ahead.is_some());
        add("speculate", self.speculate.is_some());
        add("speculate_after_ms", self.speculate_after_ms.is_some());
        keys
    }

    /// Applies the environment's overrides of this section, named `names` (the key in
    /// capitals after the section's prefix: `VOXGATE_ENGINE_ENDPOINT_DELAY_MS` for `[engine]`,
    /// `VOXGATE_XIAOZHI_ENGINE_ENDPOINT_DELAY_MS` for `[xiaozhi.engine]`); a blank
    /// `..._GREETING` turns the greeting off.
    pub(crate) fn apply_env(
        &mut self,
        names: &EnvNames,
        var: &impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        let vars = EnvVars::new(var);
        vars.parsed_some(names.vad_threshold, &mut self.vad_threshold)?;
        vars.parsed_some(names.vad_min_volume, &mut self.vad_min_volume)?;
        vars.parsed_some(names.vad_start_ms, &mut self.vad_start_ms)?;
        vars.parsed_some(names.vad_stop_ms, &mut self.vad_stop_ms)?;
        vars.parsed_some(names.vad_backbuffer_ms, &mut self.vad_backbuffer_ms)?;
        vars.parsed_some(names.endpoint_delay_ms, &mut self.endpoint_delay_ms)?;
        vars.parsed_some(names.endpoint_max_delay_ms, &mut self.endpoint_max_delay_ms)?;
        vars.parsed_some(
            names.interruption_min_speech_ms,
            &mut self.interruption_min_speech_ms,
        )?;
        vars.parsed_some(
            names.interruption_min_words,
            &mut self.interruption_min_words,
        )?;
        vars.parsed_some(
            names.false_interruption_timeout_ms,
            &mut self.false_interruption_timeout_ms,
        )?;
        for (name, into) in [
            (
                names.resume_false_interruptions,
                &mut self.resume_false_interruptions,
            ),
            (names.speculate, &mut self.speculate),
        ] {
            if let Some(v) = vars.raw(name) {
                *into = Some(super::env::parse_bool(name, &v)?);
            }
        }
        vars.optional(names.greeting, &mut self.greeting);
        vars.parsed_some(names.max_context_chars, &mut self.max_context_chars)?;
        vars.parsed_some(names.max_utterance_secs, &mut self.max_utterance_secs)?;
        vars.parsed_some(names.max_sentences_ahead, &mut self.max_sentences_ahead)?;
        vars.parsed_some(names.speculate_after_ms, &mut self.speculate_after_ms)?;
        Ok(())
    }
}

/// The environment variables of one engine section, one per key.
#[derive(Debug)]
pub(crate) struct EnvNames {
    vad_threshold: &'static str,
    vad_min_volume: &'static str,
    vad_start_ms: &'static str,
    vad_stop_ms: &'static str,
    vad_backbuffer_ms: &'static str,
    endpoint_delay_ms: &'static str,
    endpoint_max_delay_ms: &'static str,
    interruption_min_speech_ms: &'static str,
    interruption_min_words: &'static str,
    false_interruption_timeout_ms: &'static str,
    resume_false_interruptions: &'static str,
    greeting: &'static str,
    max_context_chars: &'static str,
    max_utterance_secs: &'static str,
    max_sentences_ahead: &'static str,
    speculate: &'static str,
    speculate_after_ms: &'static str,
}

/// The [`EnvNames`] of a section whose variables start with `$prefix`.
macro_rules! env_names {
    ($prefix:literal) => {
        EnvNames {
            vad_threshold: concat!($prefix, "VAD_THRESHOLD"),
            vad_min_volume: concat!($prefix, "VAD_MIN_VOLUME"),
            vad_start_ms: concat!($prefix, "VAD_START_MS"),
            vad_stop_ms: concat!($prefix, "VAD_STOP_MS"),
            vad_backbuffer_ms: concat!($prefix, "VAD_BACKBUFFER_MS"),
            endpoint_delay_ms: concat!($prefix, "ENDPOINT_DELAY_MS"),
            endpoint_max_delay_ms: concat!($prefix, "ENDPOINT_MAX_DELAY_MS"),
            interruption_min_speech_ms: concat!($prefix, "INTERRUPTION_MIN_SPEECH_MS"),
            interruption_min_words: concat!($prefix, "INTERRUPTION_MIN_WORDS"),
            false_interruption_timeout_ms: concat!($prefix, "FALSE_INTERRUPTION_TIMEOUT_MS"),
            resume_false_interruptions: concat!($prefix, "RESUME_FALSE_INTERRUPTIONS"),
            greeting: concat!($prefix, "GREETING"),
            max_context_chars: concat!($prefix, "MAX_CONTEXT_CHARS"),
            max_utterance_secs: concat!($prefix, "MAX_UTTERANCE_SECS"),
            max_sentences_ahead: concat!($prefix, "MAX_SENTENCES_AHEAD"),
            speculate: concat!($prefix, "SPECULATE"),
            speculate_after_ms: concat!($prefix, "SPECULATE_AFTER_MS"),
        }
    };
}

/// `[engine]`: `VOXGATE_ENGINE_<KEY>`.
pub(crate) const SERVER_ENV: EnvNames = env_names!("VOXGATE_ENGINE_");
/// `[xiaozhi.engine]`: `VOXGATE_XIAOZHI_ENGINE_<KEY>`.
pub(crate) const XIAOZHI_ENV: EnvNames = env_names!("VOXGATE_XIAOZHI_ENGINE_");
/// `[realtime.engine]`: `VOXGATE_REALTIME_ENGINE_<KEY>`.
pub(crate) const REALTIME_ENV: EnvNames = env_names!("VOXGATE_REALTIME_ENGINE_");
/// `[gemini.engine]`: `VOXGATE_GEMINI_ENGINE_<KEY>`.
pub(crate) const GEMINI_ENV: EnvNames = env_names!("VOXGATE_GEMINI_ENGINE_");
/// `[retell.engine]`: `VOXGATE_RETELL_ENGINE_<KEY>`.
pub(crate) const RETELL_ENV: EnvNames = env_names!("VOXGATE_RETELL_ENGINE_");
/// `[vip.engine]`: `VOXGATE_VIP_ENGINE_<KEY>`.
pub(crate) const VIP_ENV: EnvNames = env_names!("VOXGATE_VIP_ENGINE_");
/// `[bridge.engine]`: `VOXGATE_BRIDGE_ENGINE_<KEY>`.
pub(crate) const BRIDGE_ENV: EnvNames = env_names!("VOXGATE_BRIDGE_ENGINE_");

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn invalid(toml: &str) -> String {
        match Config::from_toml(toml) {
            Err(ConfigError::Invalid(m)) => m,
            other => panic!("expected Invalid for {toml:?}, got {other:?}"),
        }
    }

    #[test]
    fn sections_parse_in_friendly_units() {
        let c = Config::from_toml(
            "[engine]\nvad_threshold = 0.6\nvad_stop_ms = 400\nendpoint_delay_ms = 700\n\
             interruption_min_words = 2\nresume_false_interruptions = false\n\
             max_context_chars = 0\nmax_utterance_secs = 30\n\
             [xiaozhi.engine]\ngreeting = \"Hello!\"\nvad_min_volume = 1\n\
             [realtime.engine]\nendpoint_max_delay_ms = 3000\n\
             [gemini.engine]\nvad_start_ms = 0\n\
             [retell.engine]\ngreeting = \"\"\n\
             [bridge.engine]\nmax_context_chars = 8000\n",
        )
        .unwrap();
        assert_eq!(c.engine.vad_threshold, Some(Fraction(0.6)));
        assert_eq!(c.engine.endpoint_delay_ms, Some(700));
        assert_eq!(c.xiaozhi.engine.greeting(), Greeting::Say("Hello!"));
        assert_eq!(c.xiaozhi.engine.vad_min_volume, Some(Fraction(1.0)));
        assert_eq!(c.realtime.engine.endpoint_max_delay_ms, Some(3000));
        assert_eq!(c.gemini.engine.vad_start_ms, Some(0));
        assert_eq!(c.retell.engine.greeting(), Greeting::Off);
        assert_eq!(c.bridge.engine.max_context_chars, Some(8000));
        // --print-config round-trips, and leaves empty sections out.
        let printed = c.to_toml();
        assert!(printed.contains("vad_threshold = 0.6"), "{printed}");
        assert_eq!(Config::from_toml(&printed).unwrap(), c);
        let printed = Config::default().to_toml();
        assert!(!printed.contains("engine]"), "{printed}");
        // Unknown keys are refused like everywhere else.
        assert!(matches!(
            Config::from_toml("[engine]\nendpoint_delay = 500\n"),
            Err(ConfigError::Parse(_))
        ));
        assert!(matches!(
            Config::from_toml("[xiaozhi.engine]\nvad_stop_ms = -1\n"),
            Err(ConfigError::Parse(_))
        ));
    }

    #[test]
    fn out_of_range_values_name_section_and_key() {
        for (toml, want) in [
            (
                "[engine]\nvad_threshold = 1.5",
                "[engine] vad_threshold = 1.5",
            ),
            (
                "[xiaozhi.engine]\nvad_min_volume = -0.1",
                "[xiaozhi.engine] vad_min_volume",
            ),
            (
                "[engine]\nvad_start_ms = 2001",
                "[engine] vad_start_ms = 2001",
            ),
            (
                "[realtime.engine]\nvad_stop_ms = 10001",
                "[realtime.engine] vad_stop_ms",
            ),
            (
                "[engine]\nvad_backbuffer_ms = 3001",
                "[engine] vad_backbuffer_ms",
            ),
            (
                "[gemini.engine]\nendpoint_delay_ms = 50000",
                "[gemini.engine] endpoint_delay_ms = 50000 ms is out of range (0 to 10000)",
            ),
            (
                "[engine]\nendpoint_delay_ms = 900\nendpoint_max_delay_ms = 500",
                "[engine] endpoint_max_delay_ms = 500 is shorter than endpoint_delay_ms",
            ),
            (
                "[engine]\ninterruption_min_speech_ms = 10001",
                "[engine] interruption_min_speech_ms",
            ),
            (
                "[engine]\ninterruption_min_words = 51",
                "[engine] interruption_min_words",
            ),
            (
                "[engine]\nfalse_interruption_timeout_ms = 99999",
                "[engine] false_interruption_timeout_ms",
            ),
            (
                "[engine]\nmax_context_chars = 1000001",
                "[engine] max_context_chars",
            ),
            (
                "[engine]\nmax_utterance_secs = 0",
                "[engine] max_utterance_secs",
            ),
            (
                "[bridge.engine]\nmax_utterance_secs = 500",
                "[bridge.engine] max_utterance_secs",
            ),
            (
                "[retell.engine]\nendpoint_delay_ms = 500",
                "[retell.engine] endpoint_delay_ms has no effect on the Retell door",
            ),
            (
                "[bridge.engine]\ngreeting = \"hi\"",
                "[bridge.engine] greeting has no effect on the Bridge door",
            ),
        ] {
            let m = invalid(&format!("{toml}\n"));
            assert!(m.starts_with(want), "{toml:?}: {m}");
        }
        let long = format!("[engine]\ngreeting = \"{}\"", "a".repeat(2001));
        assert!(invalid(&long).starts_with("[engine] greeting is longer"));
        // NaN is out of range too.
        assert!(invalid("[engine]\nvad_threshold = nan").starts_with("[engine] vad_threshold"));
    }

    #[test]
    fn door_over_server_over_code_default() {
        let server = EngineSettings {
            endpoint_delay_ms: Some(800),
            vad_stop_ms: Some(400),
            greeting: Some("Hi".into()),
            ..EngineSettings::default()
        };
        let door = EngineSettings {
            endpoint_delay_ms: Some(1200),
            greeting: Some(String::new()),
            ..EngineSettings::default()
        };
        let eff = door.over(&server);
        assert_eq!(eff.endpoint_delay_ms, Some(1200), "the door wins");
        assert_eq!(eff.vad_stop_ms, Some(400), "else the server");
        assert_eq!(
            eff.greeting(),
            Greeting::Off,
            "an empty greeting is a value"
        );
        assert_eq!(eff.max_context_chars, None, "else unset");

        // Unset keys keep the door's code default.
        let code = EngineConfig {
            max_context_chars: 1234,
            keep_user_audio: false,
            ..EngineConfig::default()
        };
        let mut c = code.clone();
        eff.apply(&mut c);
        assert_eq!(c.turn.min_endpoint_delay, Duration::from_millis(1200));
        assert_eq!(c.vad.stop_duration, Duration::from_millis(400));
        assert_eq!(c.max_context_chars, 1234);
        assert!(!c.keep_user_audio);
        assert_eq!(c.vad.confidence_threshold, code.vad.confidence_threshold);
        let mut c2 = code.clone();
        EngineSettings::default().apply(&mut c2);
        assert_eq!(c2, code, "an empty section changes nothing");

        // Every key reaches its engine field.
        let all = EngineSettings {
            vad_threshold: Some(Fraction(0.25)),
            vad_min_volume: Some(Fraction(0.75)),
            vad_start_ms: Some(10),
            vad_stop_ms: Some(20),
            vad_backbuffer_ms: Some(30),
            endpoint_delay_ms: Some(40),
            endpoint_max_delay_ms: Some(50),
            interruption_min_speech_ms: Some(60),
            interruption_min_words: Some(3),
            false_interruption_timeout_ms: Some(70),
            resume_false_interruptions: Some(false),
            greeting: Some("Hello".into()),
            max_context_chars: Some(99),
            max_utterance_secs: Some(5),
            max_sentences_ahead: Some(4),
            speculate: Some(true),
            speculate_after_ms: Some(16),
            no_recognizer: false,
        };
        assert_eq!(all.set_keys().len(), 17);
        let mut c = EngineConfig::default();
        all.apply(&mut c);
        let ms = Duration::from_millis;
        assert_eq!((c.vad.confidence_threshold, c.vad.min_volume), (0.25, 0.75));
        assert_eq!(
            (
                c.vad.start_duration,
                c.vad.stop_duration,
                c.vad.backbuffer_duration
            ),
            (ms(10), ms(20), ms(30))
        );
        assert_eq!(
            (c.turn.min_endpoint_delay, c.turn.max_endpoint_delay),
            (ms(40), ms(50))
        );
        assert_eq!(c.turn.min_interruption_speech, ms(60));
        assert_eq!(c.turn.min_interruption_words, 3);
        assert_eq!(c.turn.false_interruption_timeout, ms(70));
        assert!(!c.turn.resume_false_interruptions);
        assert_eq!(c.max_context_chars, 99);
        assert_eq!(c.max_utterance, Duration::from_secs(5));
        assert_eq!(c.max_sentences_ahead, 4);
        assert!(c.speculation.enabled);
        assert_eq!(c.speculation.after_silence, ms(16));
        assert_eq!(all.over(&EngineSettings::default()), all);
        assert_eq!(EngineSettings::default().over(&all), all);
    }

    #[test]
    fn doors_own_older_keys_sit_between_their_section_and_the_servers() {
        use crate::config::RetellConfig;
        let server = EngineSettings {
            greeting: Some("Hi".into()),
            max_context_chars: Some(0),
            endpoint_delay_ms: Some(900),
            ..EngineSettings::default()
        };
        // Retell: the greeting is the begin message, 0 an unlimited bound.
        let c = RetellConfig::default().with_engine(&server);
        assert_eq!(c.begin_message, "Hi");
        assert_eq!(c.context_max_chars, usize::MAX);
        let own = RetellConfig {
            begin_message: "Thanks for calling.".into(),
            context_max_chars: 4000,
            ..RetellConfig::default()
        };
        let c = own.with_engine(&server);
        assert_eq!(
            (c.begin_message.as_str(), c.context_max_chars),
            ("Thanks for calling.", 4000)
        );
        let door = RetellConfig {
            engine: EngineSettings {
                greeting: Some(String::new()),
                max_context_chars: Some(100),
                ..EngineSettings::default()
            },
            ..own
        };
        let c = door.with_engine(&server);
        assert_eq!((c.begin_message.as_str(), c.context_max_chars), ("", 100));
        assert_eq!(
            RetellConfig::default().with_engine(&EngineSettings::default()),
            RetellConfig::default()
        );

        // Realtime: `[realtime] max_context_chars` when changed, under `[realtime.engine]`.
        let mut c = Config {
            engine: server,
            ..Config::default()
        };
        assert_eq!(
            crate::realtime::engine_settings(&c).max_context_chars,
            Some(0)
        );
        c.realtime.max_context_chars = 5000;
        let eff = crate::realtime::engine_settings(&c);
        assert_eq!(eff.max_context_chars, Some(5000));
        assert_eq!(eff.endpoint_delay_ms, Some(900));
        c.realtime.engine.max_context_chars = Some(7000);
        assert_eq!(
            crate::realtime::engine_settings(&c).max_context_chars,
            Some(7000)
        );
    }

    #[test]
    fn speculation_keys_door_variables_and_no_recognizer() {
        let c = Config::from_toml(
            "[engine]\nspeculate_after_ms = 32\n[xiaozhi.engine]\nspeculate = true\n",
        )
        .unwrap();
        let eff = c.xiaozhi.engine.over(&c.engine);
        assert_eq!(
            (eff.speculate, eff.speculate_after_ms),
            (Some(true), Some(32))
        );
        assert!(c.to_toml().contains("speculate = true"));
        assert!(
            invalid("[xiaozhi.engine]\nspeculate_after_ms = 10001\n")
                .starts_with("[xiaozhi.engine] speculate_after_ms")
        );
        assert!(
            invalid("[bridge.engine]\nspeculate = true\n")
                .starts_with("[bridge.engine] speculate has no effect")
        );
        // Each door section has its own variables, over its file values.
        let mut c = Config::default();
        c.apply_env(|k| match k {
            "VOXGATE_XIAOZHI_ENGINE_SPECULATE" => Some("on".into()),
            "VOXGATE_XIAOZHI_ENGINE_ENDPOINT_DELAY_MS" => Some("400".into()),
            "VOXGATE_REALTIME_ENGINE_SPECULATE_AFTER_MS" => Some("16".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(c.xiaozhi.engine.speculate, Some(true));
        assert_eq!(c.xiaozhi.engine.endpoint_delay_ms, Some(400));
        assert_eq!(c.realtime.engine.speculate_after_ms, Some(16));
        assert_eq!(c.engine, EngineSettings::default());
        let bad = Config::default()
            .apply_env(|k| (k == "VOXGATE_XIAOZHI_ENGINE_SPECULATE").then(|| "maybe".into()));
        assert!(matches!(
            bad,
            Err(ConfigError::Env {
                name: "VOXGATE_XIAOZHI_ENGINE_SPECULATE",
                ..
            })
        ));
        // Without a recognizer (no [asr], no [xiaozhi.asr]) speculation stays off.
        c.mark_recognizers();
        let mut engine = EngineConfig::default();
        c.xiaozhi.engine.over(&c.engine).apply(&mut engine);
        assert!(!engine.speculation.enabled);
        c.asr = Some(crate::config::AsrConfig {
            base_url: Some("http://127.0.0.1:9/v1".into()),
            ..crate::config::AsrConfig::default()
        });
        c.mark_recognizers();
        let mut engine = EngineConfig::default();
        c.xiaozhi.engine.over(&c.engine).apply(&mut engine);
        assert!(engine.speculation.enabled);
    }

    #[test]
    fn environment_sets_the_server_section() {
        let mut c = Config::default();
        c.apply_env(|k| match k {
            "VOXGATE_ENGINE_ENDPOINT_DELAY_MS" => Some(" 650 ".into()),
            "VOXGATE_ENGINE_VAD_THRESHOLD" => Some("0.7".into()),
            "VOXGATE_ENGINE_RESUME_FALSE_INTERRUPTIONS" => Some("off".into()),
            "VOXGATE_ENGINE_GREETING" => Some(String::new()),
            _ => None,
        })
        .unwrap();
        assert_eq!(c.engine.endpoint_delay_ms, Some(650));
        assert_eq!(c.engine.vad_threshold, Some(Fraction(0.7)));
        assert_eq!(c.engine.resume_false_interruptions, Some(false));
        assert_eq!(c.engine.greeting(), Greeting::Off);
        let bad = Config::default()
            .apply_env(|k| (k == "VOXGATE_ENGINE_VAD_STOP_MS").then(|| "soon".into()));
        assert!(matches!(
            bad,
            Err(ConfigError::Env {
                name: "VOXGATE_ENGINE_VAD_STOP_MS",
                ..
            })
        ));
        let bad = Config::default()
            .apply_env(|k| (k == "VOXGATE_ENGINE_VAD_STOP_MS").then(|| "20000".into()));
        assert!(matches!(bad, Err(ConfigError::Invalid(_))), "{bad:?}");
    }
}
