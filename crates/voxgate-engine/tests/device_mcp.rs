//! The device's MCP server changing its tools mid-session, and the messages the engine does
//! not act on.

mod common;

use common::*;
use serde_json::{Value, json};
use voxgate_engine::{ClientEvent, EngineConfig, Input, Output, ProviderRequest, TriggerMode};

fn device_messages(out: &[Output]) -> Vec<Value> {
    client(out)
        .into_iter()
        .filter_map(|e| match e {
            ClientEvent::DeviceMcp(m) => Some(m.to_value()),
            _ => None,
        })
        .collect()
}

fn tool(name: &str) -> Value {
    json!({"name": name, "description": format!("{name} tool"),
           "inputSchema": {"type": "object", "properties": {}}})
}

/// A started, initialized device offering `tools`.
fn device(tools: &[&str]) -> Driver {
    let mut d = Driver::new(EngineConfig {
        output_audio: None,
        ..EngineConfig::default()
    });
    let sent = device_messages(&d.input(Input::DeviceMcpStart));
    let sent = device_messages(&d.input(Input::DeviceMcp(json!({
        "jsonrpc":"2.0","id":sent[0]["id"],
        "result":{"protocolVersion":"2024-11-05","capabilities":{"tools":{"listChanged":true}},
                  "serverInfo":{"name":"xiaozhi","version":"2.0"}}
    }))));
    let list = sent.iter().find(|m| m["method"] == "tools/list").cloned();
    let list = list.unwrap_or_default();
    let tools: Vec<Value> = tools.iter().map(|t| tool(t)).collect();
    d.input(Input::DeviceMcp(
        json!({"jsonrpc":"2.0","id":list["id"],"result":{"tools":tools}}),
    ));
    d
}

fn offered(d: &Driver) -> Vec<String> {
    d.engine.llm_tools().into_iter().map(|t| t.name).collect()
}

#[test]
fn list_changed_relists_and_the_next_reply_sees_the_new_tools() {
    let mut d = device(&["self.light.on"]);
    assert_eq!(offered(&d), ["self_light_on"]);
    let out = d.input(Input::DeviceMcp(
        json!({"jsonrpc":"2.0","method":"notifications/tools/list_changed"}),
    ));
    let sent = device_messages(&out);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0]["method"], "tools/list");
    // Until the new list arrives the old one stands.
    assert_eq!(offered(&d), ["self_light_on"]);
    d.input(Input::DeviceMcp(json!({"jsonrpc":"2.0","id":sent[0]["id"],
        "result":{"tools":[tool("self.light.off"), tool("self.camera.take_photo")]}})));
    let mut names = offered(&d);
    names.sort();
    assert_eq!(names, ["self_camera_take_photo", "self_light_off"]);
    let (_, req) = generate(&d.input(Input::Text {
        text: "lights off".into(),
        mode: TriggerMode::Queue,
    }));
    let ProviderRequest::Generate { tools, .. } = req else {
        unreachable!()
    };
    let mut names: Vec<String> = tools.into_iter().map(|t| t.name).collect();
    names.sort();
    assert_eq!(names, ["self_camera_take_photo", "self_light_off"]);
}

#[test]
fn a_failed_relist_keeps_the_old_tools_and_reports_it() {
    let mut d = device(&["self.light.on"]);
    let sent = device_messages(&d.input(Input::DeviceMcp(
        json!({"jsonrpc":"2.0","method":"notifications/tools/list_changed"}),
    )));
    let out = d.input(Input::DeviceMcp(json!({"jsonrpc":"2.0","id":sent[0]["id"],
        "error":{"code":-32603,"message":"busy"}})));
    assert!(matches!(
        &client(&out)[..],
        [ClientEvent::Error {
            category: voxgate_engine::ErrorCategory::Protocol,
            ..
        }]
    ));
    assert_eq!(offered(&d), ["self_light_on"]);
}

#[test]
fn other_notifications_are_ignored_and_requests_refused() {
    let mut d = device(&["self.light.on"]);
    for method in [
        "notifications/state_changed",
        "notifications/progress",
        "notifications/message",
    ] {
        let out = d.input(Input::DeviceMcp(
            json!({"jsonrpc":"2.0","method":method,"params":{"state":"idle"}}),
        ));
        assert!(out.is_empty(), "{method}: {out:?}");
    }
    let out = d.input(Input::DeviceMcp(json!({"jsonrpc":"2.0","id":"s1",
        "method":"sampling/createMessage","params":{"messages":[]}})));
    let sent = device_messages(&out);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0]["id"], "s1");
    assert_eq!(sent[0]["error"]["code"], -32601);
    // A ping is answered by the MCP client itself.
    let sent = device_messages(&d.input(Input::DeviceMcp(
        json!({"jsonrpc":"2.0","id":7,"method":"ping"}),
    )));
    assert_eq!(sent, [json!({"jsonrpc":"2.0","id":7,"result":{}})]);
    assert_eq!(offered(&d), ["self_light_on"]);
}

/// A text turn right after the device connected waits for the device's first tool listing,
/// so the first reply sees the device's tools.
#[test]
fn the_first_reply_waits_for_the_device_tools() {
    let mut d = Driver::new(EngineConfig {
        output_audio: None,
        ..EngineConfig::default()
    });
    let sent = device_messages(&d.input(Input::DeviceMcpStart));
    let out = d.input(Input::Text {
        text: "lights on".into(),
        mode: TriggerMode::Queue,
    });
    assert!(requests(&out).is_empty(), "held: {out:?}");
    let sent = device_messages(&d.input(Input::DeviceMcp(json!({
        "jsonrpc":"2.0","id":sent[0]["id"],
        "result":{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},
                  "serverInfo":{"name":"xiaozhi","version":"2.0"}}
    }))));
    let list = sent
        .iter()
        .find(|m| m["method"] == "tools/list")
        .unwrap()
        .clone();
    let out = d.input(Input::DeviceMcp(
        json!({"jsonrpc":"2.0","id":list["id"],"result":{"tools":[tool("self.light.on")]}}),
    ));
    let (_, req) = generate(&out);
    let ProviderRequest::Generate { tools, .. } = req else {
        unreachable!()
    };
    assert_eq!(
        tools.into_iter().map(|t| t.name).collect::<Vec<_>>(),
        ["self_light_on"]
    );
    // Later turns are not held.
    assert!(
        d.engine.poll_timeout().is_none_or(|t| t > d.now),
        "no wait is pending"
    );
}

/// A device that never lists its tools delays the first reply by at most the wait.
#[test]
fn a_silent_device_holds_the_first_reply_only_briefly() {
    let mut d = Driver::new(EngineConfig {
        output_audio: None,
        ..EngineConfig::default()
    });
    d.input(Input::DeviceMcpStart);
    let out = d.input(Input::Text {
        text: "hello".into(),
        mode: TriggerMode::Queue,
    });
    assert!(requests(&out).is_empty());
    let out = d.advance(std::time::Duration::from_millis(999));
    assert!(requests(&out).is_empty(), "{out:?}");
    let out = d.advance(std::time::Duration::from_millis(2));
    let (_, req) = generate(&out);
    assert!(matches!(req, ProviderRequest::Generate { .. }));
}

/// An abort while the first reply waits drops it without a provider call.
#[test]
fn an_abort_drops_a_held_reply() {
    let mut d = Driver::new(EngineConfig {
        output_audio: None,
        ..EngineConfig::default()
    });
    d.input(Input::DeviceMcpStart);
    d.input(Input::Text {
        text: "hello".into(),
        mode: TriggerMode::Queue,
    });
    let out = d.input(Input::Abort);
    assert!(
        !requests(&out).iter().any(|r| matches!(
            r,
            ProviderRequest::Cancel { .. } | ProviderRequest::Generate { .. }
        )),
        "{out:?}"
    );
    let out = d.advance(std::time::Duration::from_secs(2));
    assert!(
        !requests(&out)
            .iter()
            .any(|r| matches!(r, ProviderRequest::Generate { .. })),
        "the held reply never goes out: {out:?}"
    );
}
