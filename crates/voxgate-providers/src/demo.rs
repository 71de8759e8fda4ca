//! The embedded defaults: a scripted demo agent, a stand-in for a missing recognizer and a
//! placeholder tone synthesizer, so the server does something observable with no configuration
//! and no network.

use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use futures::stream;

use crate::error::ProviderError;
use crate::types::{
    ChatMessage, FinishReason, Intent, LlmEvent, LlmRequest, PcmChunk, Role, ToolCall, Transcript,
    TtsRequest, Utterance,
};
use crate::{Asr, Llm, LlmStream, Tts, TtsStream};

/// A scripted agent that needs no model. It exists so every door can be tried end to end
/// (greeting, echo, client and device tool round trips, conversation queries) on a laptop with
/// nothing configured.
///
/// * [`Intent::Greet`] (or a reply request with nothing new to answer): a greeting.
/// * A user message `call <tool name> <JSON object>`: a [`LlmEvent::ToolCall`] to the tool of
///   that exact declared name (dots included) with those arguments; when the tool is unknown or
///   the arguments are not a JSON object it says so instead.
/// * A user message naming a declared tool by keywords (the way a page's actions are asked
///   for: "switch to dark mode", "open settings"): a call to the one tool that matches. A tool
///   matches when every required parameter is a string `enum` one of whose values is a word of
///   the message (`set_theme` with `theme: ["light", "dark"]` for "dark mode"), or when it has
///   no required parameters and every word of its name is in the message (`open_settings`).
///   Nothing is called when no tool or more than one matches.
/// * A tool result as the last message: a reply reporting the tool's name and result.
/// * The [`NoAsr`] marker: how many seconds of speech it heard and that no recognizer is
///   configured.
/// * Any other user text: `😊 You said: <text>`.
/// * [`Intent::ConversationQuery`]: a one-line summary of the history.
///
/// Every reply starts with an emoji, which the Xiaozhi door turns into the device's emotion.
/// Text is streamed word by word, like a model would.
#[derive(Debug, Default)]
pub struct DemoAgent {
    calls: AtomicU64,
}

impl DemoAgent {
    /// A new agent; tool call ids count from 1.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The whole scripted answer to `request`, as the events [`Llm::generate`] streams.
    #[must_use]
    pub fn respond(&self, request: &LlmRequest) -> Vec<LlmEvent> {
        match &request.intent {
            Intent::Greet => text_reply(GREETING),
            Intent::ConversationQuery { .. } => text_reply(&summarize(&request.messages)),
            Intent::Reply => self.reply(request),
        }
    }

    fn reply(&self, request: &LlmRequest) -> Vec<LlmEvent> {
        let Some(last) = request
            .messages
            .iter()
            .rev()
            .find(|m| m.role != Role::System)
        else {
            return text_reply(GREETING);
        };
        match last.role {
            Role::Tool => text_reply(&report_tool_result(&request.messages, last)),
            Role::User => self.answer_user(request, last.content.trim()),
            _ => text_reply(GREETING),
        }
    }

    fn answer_user(&self, request: &LlmRequest, text: &str) -> Vec<LlmEvent> {
        if text.is_empty() {
            return text_reply("🤔 I did not catch anything. Type or say something!");
        }
        if let Some(seconds) = parse_no_asr_marker(text) {
            return text_reply(&format!(
                "🎧 I heard {seconds:.1} seconds of speech, but no speech recognizer is \
                 configured, so I cannot tell what you said."
            ));
        }
        let Some(rest) = text.strip_prefix("call ") else {
            if let Some((name, args)) = keyword_call(&request.tools, text) {
                return self.call(&name, &args);
            }
            return text_reply(&format!("😊 You said: {text}"));
        };
        let rest = rest.trim_start();
        let (name, args) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
        if !request.tools.iter().any(|t| t.name == name) {
            let known: Vec<&str> = request.tools.iter().map(|t| t.name.as_str()).collect();
            let known = if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            };
            return text_reply(&format!(
                "🤷 I do not know a tool called {name:?}. Available tools: {known}."
            ));
        }
        let args = args.trim();
        let args = if args.is_empty() { "{}" } else { args };
        match serde_json::from_str::<serde_json::Value>(args) {
            Ok(v @ serde_json::Value::Object(_)) => self.call(name, &v),
            _ => text_reply(&format!(
                "🤔 The arguments of {name} must be a JSON object, for example: \
                 call {name} {{\"key\": 1}}"
            )),
        }
    }
}

impl DemoAgent {
    /// A tool call to `name` with `arguments`, announced in words first.
    fn call(&self, name: &str, arguments: &serde_json::Value) -> Vec<LlmEvent> {
        let n = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        let mut events = words(&format!("🛠️ Calling {name}."));
        events.push(LlmEvent::ToolCall(ToolCall {
            id: format!("demo_call_{n}"),
            name: name.to_owned(),
            arguments: arguments.to_string(),
        }));
        events.push(LlmEvent::Done {
            finish_reason: FinishReason::ToolCalls,
            usage: None,
        });
        events
    }
}

/// The one tool `text` asks for by keywords, with its arguments (see [`DemoAgent`]).
fn keyword_call(
    tools: &[crate::types::ToolDefinition],
    text: &str,
) -> Option<(String, serde_json::Value)> {
    let said: Vec<String> = text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    let has = |w: &str| said.iter().any(|s| s == &w.to_lowercase());
    let mut found = None;
    for tool in tools {
        let params = &tool.parameters;
        let required: Vec<&str> = params
            .get("required")
            .and_then(serde_json::Value::as_array)
            .map(|r| r.iter().filter_map(serde_json::Value::as_str).collect())
            .unwrap_or_default();
        let args = if required.is_empty() {
            let name_words: Vec<&str> = tool
                .name
                .split(|c: char| !c.is_alphanumeric())
                .filter(|w| !w.is_empty())
                .collect();
            if name_words.is_empty() || !name_words.iter().all(|w| has(w)) {
                continue;
            }
            serde_json::Value::Object(serde_json::Map::new())
        } else {
            let mut args = serde_json::Map::new();
            for p in &required {
                let values: Vec<&str> = params
                    .pointer(&format!("/properties/{p}/enum"))
                    .and_then(serde_json::Value::as_array)
                    .map(|e| e.iter().filter_map(serde_json::Value::as_str).collect())
                    .unwrap_or_default();
                let mut hits = values.iter().filter(|v| has(v));
                match (hits.next(), hits.next()) {
                    (Some(v), None) => {
                        args.insert((*p).to_owned(), (*v).into());
                    }
                    _ => break,
                }
            }
            if args.len() != required.len() {
                continue;
            }
            serde_json::Value::Object(args)
        };
        if found.is_some() {
            return None;
        }
        found = Some((tool.name.clone(), args));
    }
    found
}

impl Llm for DemoAgent {
    fn generate(&self, request: LlmRequest) -> LlmStream {
        Box::pin(stream::iter(self.respond(&request)))
    }
}

const GREETING: &str = "👋 Hello! I am the voxgate demo agent. Say or type something and I will \
    repeat it, or type call <tool name> <JSON arguments> to call one of your tools.";

fn words(text: &str) -> Vec<LlmEvent> {
    text.split_inclusive(' ')
        .map(|w| LlmEvent::TextDelta(w.to_owned()))
        .collect()
}

fn text_reply(text: &str) -> Vec<LlmEvent> {
    let mut events = words(text);
    events.push(LlmEvent::Done {
        finish_reason: FinishReason::Stop,
        usage: None,
    });
    events
}

fn report_tool_result(history: &[ChatMessage], result: &ChatMessage) -> String {
    let name = result.tool_call_id.as_deref().and_then(|id| {
        history
            .iter()
            .flat_map(|m| &m.tool_calls)
            .find(|c| c.id == id)
            .map(|c| c.name.as_str())
    });
    match name {
        Some(name) => format!("🔧 The tool {name} returned: {}", result.content),
        None => format!("🔧 A tool returned: {}", result.content),
    }
}

fn clip(text: &str, max_chars: usize) -> String {
    let text = text.trim();
    match text.char_indices().nth(max_chars) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// One line: message counts by role, tool calls, and the last thing the user said.
fn summarize(history: &[ChatMessage]) -> String {
    let count = |r: Role| history.iter().filter(|m| m.role == r).count();
    let (user, assistant, tool) = (count(Role::User), count(Role::Assistant), count(Role::Tool));
    let calls: usize = history.iter().map(|m| m.tool_calls.len()).sum();
    if user + assistant + tool == 0 {
        return "📜 The conversation has not started yet.".into();
    }
    let mut line = format!(
        "📜 {} messages so far: {user} from the user, {assistant} from the assistant, \
         {calls} tool calls, {tool} tool results",
        user + assistant + tool
    );
    if let Some(last) = history.iter().rev().find(|m| m.role == Role::User) {
        line.push_str(&format!(
            "; the user last said \"{}\"",
            clip(&last.content, 60)
        ));
    }
    line.push('.');
    line
}

const NO_ASR_PREFIX: &str = "[unrecognized speech: ";
const NO_ASR_SUFFIX: &str = " s; no speech recognizer is configured]";

/// The transcript text [`NoAsr`] returns for `seconds` of speech.
#[must_use]
pub fn no_asr_marker(seconds: f64) -> String {
    format!("{NO_ASR_PREFIX}{seconds:.1}{NO_ASR_SUFFIX}")
}

/// The seconds of speech in a [`no_asr_marker`] text, `None` for any other text.
#[must_use]
pub fn parse_no_asr_marker(text: &str) -> Option<f64> {
    text.strip_prefix(NO_ASR_PREFIX)?
        .strip_suffix(NO_ASR_SUFFIX)?
        .parse()
        .ok()
}

/// The recognizer used when none is configured.
///
/// Design choice: it is an [`Asr`] that *succeeds* with a marker transcript
/// (`[unrecognized speech: 2.4 s; no speech recognizer is configured]`, see [`no_asr_marker`])
/// rather than an error or an empty text. That way the engine handles an audio turn exactly like
/// any other (the marker becomes the user message and the turn gets a reply); the
/// [`DemoAgent`] recognizes the marker and says how much speech it heard, and a real model
/// reading it understands what happened too.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoAsr;

#[async_trait]
impl Asr for NoAsr {
    async fn transcribe(&self, utterance: Utterance) -> Result<Transcript, ProviderError> {
        Ok(Transcript {
            text: no_asr_marker(utterance.seconds()),
            language: utterance.language,
        })
    }
}

/// **Placeholder** synthesizer: one audible beep per word, no speech at all.
///
/// It is what the embedded defaults fall back to when `espeak-ng` is not installed, so that
/// audio clients still hear that (and roughly how much) the agent answered. Each word becomes
/// a 160 ms tone whose pitch (300 to 700 Hz) depends on the word, followed by 60 ms of silence;
/// one [`PcmChunk`] per word at 16 kHz.
#[derive(Debug, Default, Clone, Copy)]
pub struct ToneTts;

impl ToneTts {
    /// Output sample rate.
    pub const SAMPLE_RATE: u32 = 16_000;

    /// The samples for one word.
    #[must_use]
    pub fn word_tone(word: &str) -> Vec<i16> {
        const TONE: usize = 2_560; // 160 ms
        const GAP: usize = 960; // 60 ms
        const FADE: usize = 160; // 10 ms, so the tone starts and stops without clicks
        let hash = word.bytes().fold(2_166_136_261u32, |h, b| {
            (h ^ u32::from(b)).wrapping_mul(16_777_619)
        });
        let freq = 300.0 + f64::from(hash % 400);
        // The sine by rotating a unit phasor one sample's angle at a time: a `sin` call per
        // sample was a visible share of a loaded server's CPU (this is the provider load tests
        // and test suites run on). 2,560 rotations in f64 drift far below one LSB.
        let step = 2.0 * std::f64::consts::PI * freq / f64::from(Self::SAMPLE_RATE);
        let (step_sin, step_cos) = step.sin_cos();
        let (mut sin, mut cos) = (0.0f64, 1.0f64);
        let mut out = Vec::with_capacity(TONE + GAP);
        for i in 0..TONE {
            #[allow(clippy::cast_precision_loss)]
            let edge = i.min(TONE - 1 - i) as f64;
            let env = (edge / FADE as f64).min(1.0);
            #[allow(clippy::cast_possible_truncation)]
            out.push((sin * env * 9_000.0) as i16);
            (sin, cos) = (
                sin * step_cos + cos * step_sin,
                cos * step_cos - sin * step_sin,
            );
        }
        out.resize(TONE + GAP, 0);
        out
    }
}

impl Tts for ToneTts {
    fn synthesize(&self, request: TtsRequest) -> TtsStream {
        let chunks: Vec<_> = request
            .text
            .split_whitespace()
            .map(|w| {
                Ok(PcmChunk {
                    sample_rate: Self::SAMPLE_RATE,
                    samples: Self::word_tone(w),
                })
            })
            .collect();
        Box::pin(stream::iter(chunks))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ToolDefinition;
    use serde_json::json;

    #[test]
    #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
    fn the_rotated_phasor_is_the_sine() {
        for word in ["hello", "a", "supercalifragilistic"] {
            let hash = word.bytes().fold(2_166_136_261u32, |h, b| {
                (h ^ u32::from(b)).wrapping_mul(16_777_619)
            });
            let freq = 300.0 + f64::from(hash % 400);
            let tone = ToneTts::word_tone(word);
            assert_eq!(tone.len(), 2_560 + 960);
            for (i, &got) in tone[..2_560].iter().enumerate() {
                let edge = i.min(2_559 - i) as f64;
                let env = (edge / 160.0).min(1.0);
                let v = (2.0 * std::f64::consts::PI * freq * i as f64 / 16_000.0).sin();
                let want = (v * env * 9_000.0) as i16;
                assert!(
                    (i32::from(got) - i32::from(want)).abs() <= 1,
                    "{word} {i}: {got} vs {want}"
                );
            }
            assert!(tone[2_560..].iter().all(|&s| s == 0));
        }
    }

    fn tool(name: &str, parameters: serde_json::Value) -> ToolDefinition {
        ToolDefinition {
            name: name.into(),
            description: String::new(),
            parameters,
        }
    }

    fn page_tools() -> Vec<ToolDefinition> {
        vec![
            tool(
                "set_theme",
                json!({"type": "object", "properties": {"theme": {"type": "string",
                    "enum": ["light", "dark"]}}, "required": ["theme"]}),
            ),
            tool("open_settings", json!({"type": "object", "properties": {}})),
            tool(
                "fill_field",
                json!({"type": "object", "properties": {"field": {"type": "string",
                    "enum": ["name", "email"]}, "value": {"type": "string"}},
                    "required": ["field", "value"]}),
            ),
        ]
    }

    #[test]
    fn keywords_pick_the_one_matching_tool() {
        let tools = page_tools();
        assert_eq!(
            keyword_call(&tools, "Switch to dark mode, please."),
            Some(("set_theme".into(), json!({"theme": "dark"})))
        );
        assert_eq!(
            keyword_call(&tools, "open the settings"),
            Some(("open_settings".into(), json!({})))
        );
        // A required parameter without an enum cannot be guessed.
        assert_eq!(keyword_call(&tools, "fill in my name"), None);
        // Nothing named, or two tools named: no call.
        assert_eq!(keyword_call(&tools, "hello there"), None);
        assert_eq!(keyword_call(&tools, "open settings in dark mode"), None);
        // Two values of one enum: ambiguous.
        assert_eq!(keyword_call(&tools, "light or dark"), None);
    }
}
