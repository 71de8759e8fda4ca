//! OpenAI-compatible chat completions with SSE streaming and tool calls (OpenAI, Ollama, vLLM,
//! llama.cpp server, and anything else serving `POST {base}/chat/completions`).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::ProviderError;
use crate::http::{self, BodyReader, HttpSettings};
use crate::sse::SseDecoder;
use crate::types::{
    ChatMessage, FinishReason, Intent, LlmEvent, LlmRequest, Role, ToolCall, ToolDefinition, Usage,
};
use crate::{Llm, LlmStream};

/// Configuration of [`OpenAiChat`].
#[derive(Debug, Clone, PartialEq)]
pub struct OpenAiChatConfig {
    /// API root including the version, as the OpenAI SDKs take it:
    /// `https://api.openai.com/v1`, `http://localhost:11434/v1` (Ollama),
    /// `http://localhost:8000/v1` (vLLM), `http://localhost:8080/v1` (llama.cpp server).
    pub base_url: String,
    /// Model name sent as `model`.
    pub model: String,
    /// Bearer token; local servers usually need none.
    pub api_key: Option<String>,
    /// Default sampling temperature (a request's own value wins).
    pub temperature: Option<f32>,
    /// Ask for token usage in the last chunk (`stream_options.include_usage`). Servers that
    /// reject unknown fields need this off.
    pub include_usage: bool,
    /// Instruction appended as a system message for [`Intent::Greet`].
    pub greeting_instruction: String,
    /// Timeouts and retries.
    pub http: HttpSettings,
}

impl OpenAiChatConfig {
    /// A configuration with defaults for everything but the endpoint and model.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            model: model.into(),
            api_key: None,
            temperature: None,
            include_usage: true,
            greeting_instruction: "Greet the user in one short sentence and offer your help."
                .into(),
            http: HttpSettings::default(),
        }
    }
}

/// Streaming chat completions over an OpenAI-compatible API.
///
/// Tool names that the OpenAI wire format rejects (it allows `[A-Za-z0-9_-]{1,64}`, so the dots
/// of device tools such as `self.audio_speaker.set_volume` are refused) are rewritten for the
/// wire and mapped back in the [`LlmEvent::ToolCall`] events, so callers only ever see the
/// declared names.
#[derive(Debug, Clone)]
pub struct OpenAiChat {
    config: Arc<OpenAiChatConfig>,
    url: String,
    client: reqwest::Client,
}

impl OpenAiChat {
    /// Checks the configuration and builds the HTTP client.
    ///
    /// # Errors
    /// [`ProviderError::Config`] for an unusable base URL.
    pub fn new(config: OpenAiChatConfig) -> Result<Self, ProviderError> {
        let base = http::check_base_url(&config.base_url)?;
        Ok(Self {
            url: format!("{base}/chat/completions"),
            client: http::build_client(&config.http)?,
            config: Arc::new(config),
        })
    }

    /// The JSON body sent for `request`, serialized once (every attempt sends these bytes),
    /// with the wire-to-declared tool name map.
    ///
    /// Written from borrowed wire structs rather than a `serde_json::Value` tree: a long
    /// conversation's context is a hundred messages, and a tree of maps for each of them cost
    /// several allocations per message per turn and was held for the whole stream.
    fn body(&self, request: &LlmRequest) -> (bytes::Bytes, HashMap<String, String>) {
        let names = ToolNames::new(&request.tools);
        let mut messages: Vec<OutMessage<'_>> = request
            .messages
            .iter()
            .map(|m| OutMessage::of(m, &names))
            .collect();
        match &request.intent {
            Intent::Reply => {}
            Intent::Greet => messages.push(OutMessage::plain(
                "system",
                &self.config.greeting_instruction,
            )),
            Intent::ConversationQuery { query } => {
                messages.push(OutMessage::plain("user", query));
            }
        }
        // A conversation query is answered in words, never by acting.
        let tools_allowed = !matches!(request.intent, Intent::ConversationQuery { .. });
        let tools = (tools_allowed && !request.tools.is_empty()).then(|| {
            request
                .tools
                .iter()
                .map(|t| OutTool {
                    kind: "function",
                    function: OutFunction {
                        name: names.wire(&t.name),
                        description: &t.description,
                        parameters: &t.parameters,
                    },
                })
                .collect()
        });
        let body = OutBody {
            model: &self.config.model,
            messages,
            stream: true,
            temperature: request.temperature.or(self.config.temperature),
            max_tokens: request.max_tokens,
            stream_options: self.config.include_usage.then_some(StreamOptions {
                include_usage: true,
            }),
            tools,
        };
        // Serializing borrowed strings, numbers and `Value`s to a `Vec` cannot fail.
        let bytes = serde_json::to_vec(&body).unwrap_or_default();
        (bytes.into(), names.back)
    }
}

/// The request body of `POST /chat/completions`.
#[derive(Serialize)]
struct OutBody<'a> {
    model: &'a str,
    messages: Vec<OutMessage<'a>>,
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<Vec<OutTool<'a>>>,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Serialize)]
struct OutTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: OutFunction<'a>,
}

#[derive(Serialize)]
struct OutFunction<'a> {
    name: String,
    description: &'a str,
    parameters: &'a Value,
}

/// One message of the context. `content` is `null` for an assistant message that only calls
/// tools (OpenAI refuses an empty string there).
#[derive(Serialize)]
struct OutMessage<'a> {
    role: &'static str,
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<OutToolCall<'a>>,
}

#[derive(Serialize)]
struct OutToolCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: OutCallFunction<'a>,
}

#[derive(Serialize)]
struct OutCallFunction<'a> {
    name: String,
    arguments: &'a str,
}

impl<'a> OutMessage<'a> {
    fn plain(role: &'static str, content: &'a str) -> Self {
        Self {
            role,
            content: Some(content),
            tool_call_id: None,
            tool_calls: Vec::new(),
        }
    }

    fn of(m: &'a ChatMessage, names: &ToolNames) -> Self {
        match m.role {
            Role::Tool => Self {
                tool_call_id: Some(m.tool_call_id.as_deref().unwrap_or_default()),
                ..Self::plain("tool", &m.content)
            },
            Role::Assistant if !m.tool_calls.is_empty() => Self {
                role: "assistant",
                content: (!m.content.is_empty()).then_some(m.content.as_str()),
                tool_call_id: None,
                tool_calls: m
                    .tool_calls
                    .iter()
                    .map(|c| OutToolCall {
                        id: &c.id,
                        kind: "function",
                        function: OutCallFunction {
                            name: names.wire(&c.name),
                            arguments: if c.arguments.is_empty() {
                                "{}"
                            } else {
                                &c.arguments
                            },
                        },
                    })
                    .collect(),
            },
            role => Self::plain(role_name(role), &m.content),
        }
    }
}

impl Llm for OpenAiChat {
    fn generate(&self, request: LlmRequest) -> LlmStream {
        let (body, names) = self.body(&request);
        let run = ChatRun {
            chat: self.clone(),
            body,
            reader: None,
            chunks: ChunkDecoder::new(names),
        };
        Box::pin(futures::stream::unfold(run, |mut run| async move {
            run.next().await.map(|e| (e, run))
        }))
    }
}

/// Maps declared tool names to names the wire accepts, and back.
struct ToolNames {
    to_wire: HashMap<String, String>,
    back: HashMap<String, String>,
}

impl ToolNames {
    fn new(tools: &[ToolDefinition]) -> Self {
        let mut names = Self {
            to_wire: HashMap::new(),
            back: HashMap::new(),
        };
        for t in tools {
            let base = sanitize(&t.name);
            let mut wire = base.clone();
            let mut n = 2;
            while names.back.get(&wire).is_some_and(|orig| *orig != t.name) {
                let suffix = format!("_{n}");
                let keep = 64usize.saturating_sub(suffix.len()).min(base.len());
                wire = format!("{}{suffix}", &base[..keep]);
                n += 1;
            }
            names.back.insert(wire.clone(), t.name.clone());
            names.to_wire.insert(t.name.clone(), wire);
        }
        names
    }

    fn wire(&self, name: &str) -> String {
        self.to_wire
            .get(name)
            .cloned()
            .unwrap_or_else(|| sanitize(name))
    }
}

fn sanitize(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if s.is_empty() {
        s.push('_');
    }
    s
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    }
}

// Wire shapes of a streamed chunk; every field optional because servers differ in what they
// send, and unknown fields are ignored.
#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<Choice>,
    usage: Option<WireUsage>,
    error: Option<Value>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    index: u32,
    delta: Option<Delta>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Delta {
    content: Option<String>,
    tool_calls: Option<Vec<WireToolCall>>,
}

#[derive(Deserialize)]
struct WireToolCall {
    index: Option<u32>,
    id: Option<String>,
    function: Option<WireFunction>,
}

#[derive(Deserialize)]
struct WireFunction {
    name: Option<String>,
    arguments: Option<String>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u32,
    #[serde(default)]
    completion_tokens: u32,
}

#[derive(Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// One generation in progress; dropping it drops the connection.
struct ChatRun {
    chat: OpenAiChat,
    body: bytes::Bytes,
    reader: Option<BodyReader>,
    chunks: ChunkDecoder,
}

impl ChatRun {
    async fn next(&mut self) -> Option<LlmEvent> {
        loop {
            if let Some(e) = self.chunks.pop_event() {
                return Some(e);
            }
            if self.chunks.is_done() {
                return None;
            }
            if let Err(e) = self.step().await {
                self.chunks.fail(e);
            }
        }
    }

    async fn step(&mut self) -> Result<(), ProviderError> {
        let Some(reader) = self.reader.as_mut() else {
            let chat = &self.chat;
            let body = &self.body;
            let resp = http::send_with_retries(&chat.config.http, || {
                let mut req = chat
                    .client
                    .post(&chat.url)
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body.clone());
                if let Some(key) = &chat.config.api_key {
                    req = req.bearer_auth(key);
                }
                req.header(reqwest::header::ACCEPT, "text/event-stream")
            })
            .await?;
            self.reader = Some(BodyReader::new(resp, self.chat.config.http.idle_timeout));
            return Ok(());
        };
        match reader.next_chunk().await? {
            Some(bytes) => self.chunks.feed(&bytes),
            None => self.chunks.finish(),
        }
        Ok(())
    }
}

/// Turns a completion stream's body (Server-Sent Events, each one [`Chunk`] of JSON, then
/// `[DONE]`) into [`LlmEvent`]s, assembling tool calls that arrive in pieces. Pure, so the
/// fuzz target runs exactly this; the network side is [`ChatRun`].
#[doc(hidden)]
pub struct ChunkDecoder {
    sse: SseDecoder,
    /// Wire tool name to declared name.
    names: HashMap<String, String>,
    queue: VecDeque<LlmEvent>,
    /// Tool calls being assembled, by their stream index.
    calls: BTreeMap<u32, PartialCall>,
    finish: Option<FinishReason>,
    usage: Option<Usage>,
    done: bool,
}

impl ChunkDecoder {
    /// A decoder mapping wire tool names back through `names` (wire name to declared name).
    #[must_use]
    pub fn new(names: HashMap<String, String>) -> Self {
        Self {
            sse: SseDecoder::new(),
            names,
            queue: VecDeque::new(),
            calls: BTreeMap::new(),
            finish: None,
            usage: None,
            done: false,
        }
    }

    /// The next decoded event, if any.
    pub fn pop_event(&mut self) -> Option<LlmEvent> {
        self.queue.pop_front()
    }

    /// Whether the stream is over (completed or failed): no event follows those queued.
    #[must_use]
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Ends the stream with `error` (a transport failure); events already decoded are still
    /// delivered first.
    pub fn fail(&mut self, error: ProviderError) {
        if !self.done {
            self.done = true;
            self.queue.push_back(LlmEvent::Error(error));
        }
    }

    /// Decodes the next body chunk (split anywhere). Malformed input ends the stream with an
    /// [`LlmEvent::Error`] after the events decoded before it; bytes after the end are ignored.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.done {
            return;
        }
        let mut events = Vec::new();
        let fed = self.sse.feed(bytes, &mut events);
        // The events completed before a bad line count, whatever the chunking: a `[DONE]`
        // among them ends the stream cleanly and the bad line after it is never looked at.
        let result = self.on_events(&events);
        let result = if self.done { result } else { result.and(fed) };
        if let Err(e) = result {
            self.fail(e);
        }
    }

    /// The body ended. A server that finished the choice but closed without `[DONE]` is
    /// tolerated; otherwise the stream ends with [`ProviderError::StreamCut`].
    pub fn finish(&mut self) {
        if self.done {
            return;
        }
        let mut events = Vec::new();
        let result = self
            .sse
            .finish(&mut events)
            .and_then(|()| self.on_events(&events));
        match result {
            Err(e) => self.fail(e),
            Ok(()) if self.done => {}
            Ok(()) if self.finish.is_some() => self.complete(),
            Ok(()) => self.fail(ProviderError::StreamCut(
                "the event stream ended before the completion finished".into(),
            )),
        }
    }

    fn on_events(&mut self, events: &[String]) -> Result<(), ProviderError> {
        for data in events {
            if self.done {
                break;
            }
            self.on_data(data)?;
        }
        Ok(())
    }

    fn on_data(&mut self, data: &str) -> Result<(), ProviderError> {
        if data.trim() == "[DONE]" {
            self.complete();
            return Ok(());
        }
        let chunk: Chunk = serde_json::from_str(data)
            .map_err(|e| ProviderError::Protocol(format!("malformed chunk JSON ({e}): {data}")))?;
        if let Some(err) = chunk.error {
            let message = http::error_message(err.to_string().as_bytes());
            let message = match err.get("message").and_then(Value::as_str) {
                Some(m) => m.to_owned(),
                None => message,
            };
            return Err(ProviderError::Upstream(message));
        }
        if let Some(u) = chunk.usage {
            self.usage = Some(Usage {
                prompt_tokens: u.prompt_tokens,
                completion_tokens: u.completion_tokens,
            });
        }
        // Only the first choice is used (we never ask for `n` > 1).
        for choice in chunk.choices.into_iter().filter(|c| c.index == 0) {
            if let Some(delta) = choice.delta {
                if let Some(text) = delta.content
                    && !text.is_empty()
                {
                    self.queue.push_back(LlmEvent::TextDelta(text));
                }
                for (pos, call) in delta.tool_calls.unwrap_or_default().into_iter().enumerate() {
                    let index = call.index.unwrap_or(u32::try_from(pos).unwrap_or(u32::MAX));
                    let partial = self.calls.entry(index).or_default();
                    if let Some(id) = call.id.filter(|s| !s.is_empty()) {
                        partial.id = id;
                    }
                    if let Some(f) = call.function {
                        if let Some(name) = f.name.filter(|s| !s.is_empty()) {
                            partial.name = name;
                        }
                        if let Some(args) = f.arguments {
                            partial.arguments.push_str(&args);
                        }
                    }
                }
            }
            if let Some(reason) = choice.finish_reason {
                self.finish = Some(FinishReason::from_wire(&reason));
                self.flush_calls();
            }
        }
        Ok(())
    }

    fn flush_calls(&mut self) {
        for (index, call) in std::mem::take(&mut self.calls) {
            let name = self.names.get(&call.name).cloned().unwrap_or(call.name);
            let id = if call.id.is_empty() {
                // llama.cpp and some Ollama versions omit ids; the history still needs one.
                format!("call_{index}")
            } else {
                call.id
            };
            self.queue.push_back(LlmEvent::ToolCall(ToolCall {
                id,
                name,
                arguments: call.arguments,
            }));
        }
    }

    fn complete(&mut self) {
        let had_calls = !self.calls.is_empty();
        self.flush_calls();
        let finish_reason = self.finish.take().unwrap_or(if had_calls {
            FinishReason::ToolCalls
        } else {
            FinishReason::Stop
        });
        self.queue.push_back(LlmEvent::Done {
            finish_reason,
            usage: self.usage,
        });
        self.done = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool(name: &str) -> ToolDefinition {
        ToolDefinition {
            name: name.into(),
            description: String::new(),
            parameters: json!({"type": "object"}),
        }
    }

    fn decode(body: &[u8], piece: usize) -> Vec<LlmEvent> {
        let names = HashMap::from([("a_b".to_owned(), "a.b".to_owned())]);
        let mut d = ChunkDecoder::new(names);
        for c in body.chunks(piece) {
            d.feed(c);
        }
        d.finish();
        std::iter::from_fn(|| d.pop_event()).collect()
    }

    #[test]
    fn chunks_decode_to_text_tool_calls_and_done() {
        let body = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c1\",",
            "\"function\":{\"name\":\"a_b\",\"arguments\":\"{\\\"x\\\"\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,",
            "\"function\":{\"arguments\":\":1}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\n",
            "data: [DONE]\n\n",
        );
        let expected = vec![
            LlmEvent::TextDelta("Hi".into()),
            LlmEvent::ToolCall(ToolCall {
                id: "c1".into(),
                name: "a.b".into(),
                arguments: "{\"x\":1}".into(),
            }),
            LlmEvent::Done {
                finish_reason: FinishReason::ToolCalls,
                usage: None,
            },
        ];
        for piece in [1, 7, body.len()] {
            assert_eq!(decode(body.as_bytes(), piece), expected, "piece {piece}");
        }
    }

    #[test]
    fn bytes_after_done_are_ignored_whatever_the_chunking() {
        // Regression (found writing the `openai_chat_chunks` fuzz target): a bad line after
        // `[DONE]` in the same network chunk failed the finished stream and dropped the
        // events decoded before it; in another chunk it was never read.
        let body =
            b"data: {\"choices\":[{\"delta\":{\"content\":\"ok\"}}]}\n\ndata: [DONE]\n\n\xff\n";
        for piece in [1, 5, body.len()] {
            let events = decode(body, piece);
            assert_eq!(events.len(), 2, "piece {piece}: {events:?}");
            assert!(matches!(events[1], LlmEvent::Done { .. }));
        }
    }

    #[test]
    fn a_cut_stream_keeps_its_text_and_ends_in_one_error() {
        let events = decode(
            b"data: {\"choices\":[{\"delta\":{\"content\":\"par\"}}]}\n\n",
            4,
        );
        assert_eq!(events[0], LlmEvent::TextDelta("par".into()));
        assert!(matches!(
            events[1],
            LlmEvent::Error(ProviderError::StreamCut(_))
        ));
        assert_eq!(events.len(), 2);
    }

    #[test]
    fn dotted_names_are_mapped_both_ways() {
        let names = ToolNames::new(&[tool("self.audio.set_volume"), tool("self_audio_set_volume")]);
        let a = names.wire("self.audio.set_volume");
        let b = names.wire("self_audio_set_volume");
        assert_ne!(a, b);
        assert_eq!(names.back[&a], "self.audio.set_volume");
        assert_eq!(names.back[&b], "self_audio_set_volume");
        for w in [a, b] {
            assert!(
                w.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            );
        }
    }

    #[test]
    fn long_names_fit_the_wire_limit() {
        let long = "x".repeat(100);
        let names = ToolNames::new(&[tool(&long)]);
        assert_eq!(names.wire(&long).len(), 64);
    }

    #[test]
    fn body_has_the_openai_shape() {
        let chat = OpenAiChat::new(OpenAiChatConfig::new("http://127.0.0.1:1/v1", "m")).unwrap();
        let req = LlmRequest {
            messages: vec![
                ChatMessage::system("be brief"),
                ChatMessage::user("hi"),
                ChatMessage::assistant_tool_calls(
                    "",
                    vec![ToolCall {
                        id: "c1".into(),
                        name: "a.b".into(),
                        arguments: String::new(),
                    }],
                ),
                ChatMessage::tool_result("c1", "{\"ok\":true}"),
            ],
            tools: vec![tool("a.b")],
            temperature: Some(0.5),
            ..LlmRequest::default()
        };
        let (body, _) = chat.body(&req);
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["model"], "m");
        assert_eq!(body["stream"], true);
        assert_eq!(body["temperature"], 0.5);
        assert_eq!(body["messages"][2]["content"], Value::Null);
        assert_eq!(
            body["messages"][2]["tool_calls"][0]["function"]["name"],
            "a_b"
        );
        assert_eq!(
            body["messages"][2]["tool_calls"][0]["function"]["arguments"],
            "{}"
        );
        assert_eq!(body["messages"][3]["tool_call_id"], "c1");
        assert_eq!(body["tools"][0]["function"]["name"], "a_b");
        // The whole shape: optional fields absent rather than null, the tool-only assistant
        // message's content null, usage asked for.
        assert_eq!(
            body,
            json!({
                "model": "m",
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": null, "tool_calls": [
                        {"id": "c1", "type": "function",
                         "function": {"name": "a_b", "arguments": "{}"}}
                    ]},
                    {"role": "tool", "content": "{\"ok\":true}", "tool_call_id": "c1"}
                ],
                "stream": true,
                "temperature": 0.5,
                "stream_options": {"include_usage": true},
                "tools": [{"type": "function", "function": {
                    "name": "a_b",
                    "description": "",
                    "parameters": tool("a.b").parameters
                }}]
            })
        );
    }

    #[test]
    fn greeting_and_query_bodies() {
        let mut config = OpenAiChatConfig::new("http://127.0.0.1:1/v1", "m");
        config.include_usage = false;
        let chat = OpenAiChat::new(config).unwrap();
        let greet = LlmRequest {
            messages: vec![ChatMessage::system("be brief")],
            tools: vec![tool("a.b")],
            intent: Intent::Greet,
            max_tokens: Some(40),
            ..LlmRequest::default()
        };
        let (body, _) = chat.body(&greet);
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["messages"][1]["role"], "system");
        assert_eq!(
            body["messages"][1]["content"],
            chat.config.greeting_instruction.as_str()
        );
        assert_eq!(body["max_tokens"], 40);
        assert!(body.get("stream_options").is_none());
        assert!(body.get("temperature").is_none());
        assert_eq!(body["tools"][0]["function"]["name"], "a_b");
        // A conversation query never offers tools.
        let query = LlmRequest {
            intent: Intent::ConversationQuery {
                query: "what did I ask?".into(),
            },
            ..greet
        };
        let (body, _) = chat.body(&query);
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            body["messages"][1],
            json!({"role": "user", "content": "what did I ask?"})
        );
        assert!(body.get("tools").is_none());
    }
}
