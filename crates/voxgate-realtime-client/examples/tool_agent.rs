//! A tool-calling agent loop: the client declares tools, the model calls them, the client runs
//! them locally and answers, and the model goes on with the results.
//!
//! ```text
//! cargo run --release --bin voxgate-server            # in another terminal
//! cargo run -p voxgate-realtime-client --example tool_agent -- 'call get_weather {"city": "Paris"}'
//! ```
//!
//! The embedded demo agent calls a tool when asked `call NAME {json}`; a real model decides
//! for itself from the tool descriptions.

use serde_json::{Value, json};
use voxgate_realtime::proto::{InferenceTriggerMode, ToolDefinition};
use voxgate_realtime::{AudioFormat, SessionConfig};
use voxgate_realtime_client::{ClientError, ClientOptions, Endpoint, Event, RealtimeClient};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let prompts: Vec<String> = std::env::args().skip(1).collect();
    let prompts = if prompts.is_empty() {
        vec![r#"call get_weather {"city": "Paris"}"#.to_owned()]
    } else {
        prompts
    };
    let endpoint = Endpoint::websocket("ws://127.0.0.1:8080/realtime");
    for line in run(endpoint, &prompts).await? {
        println!("{line}");
    }
    Ok(())
}

/// The tools this agent offers, with JSON Schemas for their arguments.
fn tools() -> Result<Vec<ToolDefinition>, ClientError> {
    Ok(vec![
        ToolDefinition::from_json(
            "get_weather",
            Some("Current weather in a city".into()),
            &json!({"type": "object", "properties": {"city": {"type": "string"}},
                    "required": ["city"]}),
        )?,
        ToolDefinition::from_json(
            "add",
            Some("The sum of two numbers".into()),
            &json!({"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}),
        )?,
    ])
}

/// Runs a tool locally; errors are results too, so the model can say what went wrong.
fn call_tool(name: &str, arguments: &Value) -> String {
    match name {
        "get_weather" => match arguments["city"].as_str() {
            Some(city) => format!("{city}: sunny, 21 C"),
            None => "error: no city given".to_owned(),
        },
        "add" => match (arguments["a"].as_f64(), arguments["b"].as_f64()) {
            (Some(a), Some(b)) => (a + b).to_string(),
            _ => "error: a and b must be numbers".to_owned(),
        },
        other => format!("error: no tool named {other}"),
    }
}

/// Sends each prompt and serves the model's tool calls until its reply is complete; returns a
/// log of what happened (tool calls, their results, the replies).
pub(crate) async fn run(
    endpoint: Endpoint,
    prompts: &[String],
) -> Result<Vec<String>, ClientError> {
    let config = SessionConfig::new(AudioFormat::SPEECH_24K, AudioFormat::SPEECH_24K);
    let mut client =
        RealtimeClient::connect_with_tools(ClientOptions::new(endpoint), config, tools()?).await?;
    let mut log = Vec::new();
    for prompt in prompts {
        client
            .send_text(prompt.clone(), InferenceTriggerMode::Immediate)
            .await?;
        log.push(format!("user: {prompt}"));
        let mut reply = String::new();
        // A reply that called a tool is followed by the one that uses its result.
        let mut awaiting_result_reply = false;
        loop {
            match client.next_event().await {
                Some(Event::ToolCall(call)) => {
                    let result = call_tool(&call.name, &call.arguments);
                    log.push(format!(
                        "tool {}({}) -> {result}",
                        call.name, call.arguments
                    ));
                    client.tool_result(call.id, result).await?;
                    awaiting_result_reply = true;
                }
                Some(Event::ResponseBegin { .. }) => reply.clear(),
                Some(Event::TextFragment { text, .. }) => reply.push_str(&text),
                Some(Event::ResponseEnd { .. }) => {
                    log.push(format!("assistant: {reply}"));
                    if std::mem::take(&mut awaiting_result_reply) {
                        continue;
                    }
                    break;
                }
                Some(_) => {}
                None => return Err(ClientError::Closed(client.end_reason())),
            }
        }
    }
    client.close().await;
    Ok(log)
}
