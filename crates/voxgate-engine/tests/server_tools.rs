//! Server-side tools (`Input::ServerTools`, e.g. external MCP servers' tools): naming next to
//! the client's tools, routing to the right source as `ProviderRequest::CallTool`, and the
//! result (or failure, or cancellation) going back to the model.
#![allow(clippy::unwrap_used, clippy::panic)] // test helpers may unwrap and panic

mod common;

use common::*;
use serde_json::{Value, json};
use voxgate_engine::provider::{ChatRole, ProviderEvent};
use voxgate_engine::{
    ClientEvent, EngineConfig, Input, ProviderRequest, RequestId, ServerToolDefinition, State,
    ToolDefinition, TriggerMode,
};

fn text_only() -> EngineConfig {
    EngineConfig {
        output_audio: None,
        system_prompt: "You are terse.".into(),
        ..EngineConfig::default()
    }
}

fn text(t: &str) -> Input {
    Input::Text {
        text: t.into(),
        mode: TriggerMode::Queue,
    }
}

fn schema() -> Value {
    json!({"type":"object","properties":{"x":{"type":"integer"}},"required":["x"]})
}

fn server(source: &str, name: &str) -> ServerToolDefinition {
    ServerToolDefinition {
        source: source.into(),
        name: name.into(),
        description: format!("{name} at {source}"),
        parameters: schema(),
    }
}

fn offered(req: &ProviderRequest) -> Vec<(String, String)> {
    let ProviderRequest::Generate { tools, .. } = req else {
        panic!("not a generation: {req:?}")
    };
    tools
        .iter()
        .map(|t| (t.name.clone(), t.description.clone()))
        .collect()
}

fn call(id: RequestId, call_id: &str, name: &str, arguments: Value) -> ProviderEvent {
    ProviderEvent::ToolCall {
        id,
        call_id: call_id.into(),
        name: name.into(),
        arguments,
    }
}

fn call_tool(out: &[voxgate_engine::Output]) -> Vec<ProviderRequest> {
    requests(out)
        .into_iter()
        .filter(|r| matches!(r, ProviderRequest::CallTool { .. }))
        .collect()
}

#[test]
fn a_server_tool_runs_as_a_provider_request_and_its_result_reaches_the_model() {
    let mut d = Driver::new(text_only());
    d.input(Input::ServerTools(vec![server("a", "weather.get")]));
    let (id, req) = generate(&d.input(text("Weather?")));
    assert_eq!(offered(&req)[0].0, "weather_get");
    let mut out = d.provider(call(id, "c1", "weather_get", json!("{\"x\":3}")));
    out.extend(d.provider(done(id)));
    // Nothing for the client to run.
    assert!(
        !client(&out)
            .iter()
            .any(|e| matches!(e, ClientEvent::ToolCallRequest { .. }))
    );
    let calls = call_tool(&out);
    let [
        ProviderRequest::CallTool {
            id: rid,
            call_id,
            source,
            name,
            arguments,
            ..
        },
    ] = &calls[..]
    else {
        panic!("{calls:?}")
    };
    assert_eq!(
        (call_id.as_str(), source.as_str(), name.as_str()),
        ("c1", "a", "weather.get")
    );
    assert_eq!(arguments, &json!({"x": 3}));
    assert_eq!(d.engine.state(), State::Action);
    let out = d.provider(ProviderEvent::ToolOutput {
        id: *rid,
        text: "sunny".into(),
        ok: true,
    });
    let (id2, req) = generate(&out);
    let ProviderRequest::Generate { messages, .. } = req else {
        unreachable!()
    };
    let last = messages.last().unwrap();
    assert_eq!(last.role, ChatRole::Tool);
    assert_eq!(last.content, "sunny");
    assert_eq!(last.tool_call_id.as_deref(), Some("c1"));
    // A second answer for the same request is stale.
    d.provider(ProviderEvent::ToolOutput {
        id: *rid,
        text: "again".into(),
        ok: true,
    });
    d.provider(delta(id2, "Sunny."));
    d.provider(done(id2));
    assert_eq!(d.engine.state(), State::Idle);
}

#[test]
fn clashes_get_distinct_deterministic_names_and_calls_go_to_their_source() {
    let mut d = Driver::new(text_only());
    d.input(Input::SetTools(vec![ToolDefinition {
        name: "echo".into(),
        description: "client echo".into(),
        parameters: schema(),
    }]));
    // Listed out of order: naming follows the source keys, not the list.
    d.input(Input::ServerTools(vec![
        server("b", "echo"),
        server("a", "echo"),
    ]));
    let (id, req) = generate(&d.input(text("Echo")));
    assert_eq!(
        offered(&req),
        [
            ("echo".to_owned(), "client echo".to_owned()),
            ("echo_2".to_owned(), "echo at a".to_owned()),
            ("echo_3".to_owned(), "echo at b".to_owned()),
        ]
    );
    let mut out = d.provider(call(id, "c1", "echo_3", json!({"x": 1})));
    out.extend(d.provider(call(id, "c2", "echo", json!({"x": 2}))));
    out.extend(d.provider(done(id)));
    let sources: Vec<(String, String)> = call_tool(&out)
        .into_iter()
        .map(|r| match r {
            ProviderRequest::CallTool { source, name, .. } => (source, name),
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(sources, [("b".to_owned(), "echo".to_owned())]);
    assert!(client(&out).iter().any(
        |e| matches!(e, ClientEvent::ToolCallRequest { id, name, .. } if id == "c2" && name == "echo")
    ));

    // A source leaving frees its names; the next generation sees the new set.
    d.input(Input::ServerTools(vec![server("b", "echo")]));
    assert_eq!(
        d.engine
            .llm_tools()
            .iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>(),
        ["echo", "echo_2"]
    );
    d.input(Input::ServerTools(Vec::new()));
    assert_eq!(d.engine.llm_tools().len(), 1);
}

#[test]
fn a_failed_call_is_an_error_result_and_the_turn_goes_on() {
    let mut d = Driver::new(text_only());
    d.input(Input::ServerTools(vec![server("a", "slow")]));
    let (id, _) = generate(&d.input(text("Go")));
    let mut out = d.provider(call(id, "c1", "slow", json!({"x": 1})));
    out.extend(d.provider(done(id)));
    let [ProviderRequest::CallTool { id: rid, .. }] = &call_tool(&out)[..] else {
        panic!()
    };
    let out = d.provider(ProviderEvent::Failed {
        id: *rid,
        message: "the MCP server did not answer in time".into(),
    });
    let (_, req) = generate(&out);
    let ProviderRequest::Generate { messages, .. } = req else {
        unreachable!()
    };
    assert_eq!(
        messages.last().unwrap().content,
        "Error: the MCP server did not answer in time"
    );
}

#[test]
fn closing_cancels_a_server_call_in_flight() {
    let mut d = Driver::new(text_only());
    d.input(Input::ServerTools(vec![server("a", "slow")]));
    let (id, _) = generate(&d.input(text("Go")));
    let mut out = d.provider(call(id, "c1", "slow", json!({"x": 1})));
    out.extend(d.provider(done(id)));
    let [ProviderRequest::CallTool { id: rid, .. }] = &call_tool(&out)[..] else {
        panic!()
    };
    let rid = *rid;
    let out = d.input(Input::Close);
    assert!(
        requests(&out)
            .iter()
            .any(|r| matches!(r, ProviderRequest::Cancel { id } if *id == rid)),
        "{out:?}"
    );
    // A late answer is stale.
    d.provider(ProviderEvent::ToolOutput {
        id: rid,
        text: "late".into(),
        ok: true,
    });
}
