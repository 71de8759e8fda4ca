//! Our client against a scripted Xiaozhi device: golden replies from tests/data (shapes taken
//! from the firmware's wire behaviour), snapshots of what we send.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use voxgate_mcp::Input;
use voxgate_mcp::client::{CallError, ClientConfig, ClientOutput, McpClient};
use voxgate_mcp::jsonrpc::{self, Id, Message, Payload};
use voxgate_mcp::model::{Implementation, Vision};
use voxgate_mcp::registry::{ToolRegistry, ToolSource};

macro_rules! data {
    ($name:literal) => {
        include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/", $name)).as_slice()
    };
}

fn drain(c: &mut McpClient) -> Vec<ClientOutput> {
    std::iter::from_fn(|| c.poll_output()).collect()
}

fn sent(outputs: &[ClientOutput]) -> Vec<Value> {
    outputs
        .iter()
        .filter_map(|o| match o {
            ClientOutput::Transmit(m) => Some(m.to_value()),
            _ => None,
        })
        .collect()
}

fn device_client() -> McpClient {
    McpClient::new(
        ClientConfig {
            with_user_tools: true,
            client_info: Implementation::new("voxgate", "test"),
            ..ClientConfig::default()
        }
        .with_vision(Vision {
            url: "http://voxgate.local:8003/mcp/vision/explain".into(),
            token: "test-token".into(),
        }),
    )
}

#[test]
fn initialize_and_paged_listing_against_device_replies() {
    let t0 = Instant::now();
    let mut c = device_client();
    c.start(t0).unwrap();
    let out = drain(&mut c);
    let init = sent(&out);
    assert_eq!(init.len(), 1);
    // Numeric id and the vision capability, always.
    assert!(init[0]["id"].is_i64());
    insta::assert_json_snapshot!("initialize_request", init[0]);

    c.handle_input(t0, Input::Bytes(data!("device_initialize_reply.json")));
    let out = drain(&mut c);
    let Some(ClientOutput::Ready(info)) = out.first() else {
        panic!("{out:?}")
    };
    assert_eq!(info.server_info.name, "bread-compact-wifi");
    assert_eq!(info.capabilities["tools"], json!({}));
    let msgs = sent(&out);
    insta::assert_json_snapshot!("after_initialize", msgs);
    assert_eq!(msgs[1]["id"], 2);

    c.handle_input(t0, Input::Bytes(data!("device_tools_list_page1.json")));
    let out = drain(&mut c);
    let msgs = sent(&out);
    assert_eq!(msgs.len(), 1, "{out:?}");
    // nextCursor is a tool name and goes back verbatim.
    assert_eq!(
        msgs[0]["params"],
        json!({"cursor":"self.screen.set_theme","withUserTools":true})
    );
    assert_eq!(msgs[0]["id"], 3);

    // Page 2 uses Python-style separators and has no nextCursor: the last page.
    c.handle_input(t0, Input::Bytes(data!("device_tools_list_page2.json")));
    let out = drain(&mut c);
    let [ClientOutput::ToolsListed(tools)] = out.as_slice() else {
        panic!("{out:?}")
    };
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "self.get_device_status",
            "self.audio_speaker.set_volume",
            "self.screen.set_brightness",
            "self.screen.set_theme",
            "self.camera.take_photo",
            "self.reboot"
        ]
    );

    // The registry hides the user-only reboot from the model and maps names.
    let mut reg = ToolRegistry::new();
    assert!(
        reg.set_source_tools(ToolSource::Device, tools.clone())
            .is_empty()
    );
    let offered: Vec<&str> = reg.llm_tools().map(|t| t.llm_name()).collect();
    assert_eq!(offered.len(), 5);
    assert!(!offered.contains(&"self_reboot"));
    let call = reg
        .prepare_call("self_audio_speaker_set_volume", json!({"volume": 30}))
        .unwrap();
    assert_eq!(call.name, "self.audio_speaker.set_volume");

    let id = c.call_tool(t0, &call.name, call.arguments).unwrap();
    assert_eq!(id.id(), Id::Number(4));
    let msgs = sent(&drain(&mut c));
    insta::assert_json_snapshot!("tools_call_request", msgs[0]);
    c.handle_input(t0, Input::Bytes(data!("device_call_success.json")));
    let out = drain(&mut c);
    let [
        ClientOutput::ToolCallFinished {
            outcome: Ok(r),
            name,
            ..
        },
    ] = out.as_slice()
    else {
        panic!("{out:?}")
    };
    assert_eq!(name, "self.audio_speaker.set_volume");
    assert!(!r.is_error);
    assert_eq!(r.joined_text(), "true");
}

fn ready_client(t0: Instant) -> McpClient {
    let mut c = McpClient::new(ClientConfig {
        list_tools_on_ready: false,
        ..ClientConfig::default()
    });
    assert_eq!(c.start(t0), Ok(()));
    c.handle_input(t0, Input::Bytes(data!("device_initialize_reply.json")));
    drain(&mut c);
    c
}

#[test]
fn error_without_code_fails_the_call() {
    let t0 = Instant::now();
    let mut c = ready_client(t0);
    for _ in 0..4 {
        // Ids 2..=5; the golden error answers id 5.
        c.call_tool(t0, "self.light.on", json!({})).unwrap();
    }
    drain(&mut c);
    c.handle_input(t0, Input::Bytes(data!("device_error_without_code.json")));
    let out = drain(&mut c);
    let [
        ClientOutput::ToolCallFinished {
            call,
            outcome: Err(CallError::Rpc(e)),
            ..
        },
    ] = out.as_slice()
    else {
        panic!("{out:?}")
    };
    assert_eq!(call.get(), 5);
    assert_eq!(e.code, None);
    assert_eq!(e.message, "Unknown tool: self.light.on");
}

#[test]
fn broken_escaping_is_repaired() {
    let bytes = data!("device_error_broken_escaping.json");
    assert!(
        serde_json::from_slice::<Value>(bytes).is_err(),
        "the fixture must be broken JSON"
    );
    let decoded = jsonrpc::decode(bytes).unwrap();
    assert!(decoded.repaired);
    let Payload::Single(Message::Response(r)) = decoded.payload else {
        panic!()
    };
    assert_eq!(r.id, Id::Number(6));
    let e = r.outcome.unwrap_err();
    assert_eq!(
        e.message,
        "Invalid arguments: \"volume\" must be between 0 and 100, got \"150\"\npath D:\\data\\mcp"
    );

    let t0 = Instant::now();
    let mut c = ready_client(t0);
    for _ in 0..5 {
        c.call_tool(t0, "self.audio_speaker.set_volume", json!({"volume": 150}))
            .unwrap();
    }
    drain(&mut c);
    c.handle_input(t0, Input::Bytes(bytes));
    let out = drain(&mut c);
    assert!(
        matches!(
            &out[..],
            [ClientOutput::ToolCallFinished {
                outcome: Err(CallError::Rpc(_)),
                ..
            }]
        ),
        "{out:?}"
    );
}

#[test]
fn device_notifications_are_reported_and_late_replies_are_faults() {
    let t0 = Instant::now();
    let mut c = ready_client(t0);
    c.handle_input(
        t0,
        Input::Bytes(data!("device_notification_state_changed.json")),
    );
    let out = drain(&mut c);
    let [ClientOutput::Notification(n)] = out.as_slice() else {
        panic!("{out:?}")
    };
    assert_eq!(n.method, "notifications/state_changed");
    assert_eq!(n.params.as_ref().unwrap()["newState"], "listening");

    // A call that times out, then its late reply.
    let call = c
        .call_tool_with_timeout(
            t0,
            "self.camera.take_photo",
            json!({"question":"what is this"}),
            Duration::from_secs(5),
        )
        .unwrap();
    drain(&mut c);
    assert_eq!(c.poll_timeout(), Some(t0 + Duration::from_secs(5)));
    c.handle_timeout(t0 + Duration::from_secs(4));
    assert!(c.poll_output().is_none());
    c.handle_timeout(t0 + Duration::from_secs(5));
    let out = drain(&mut c);
    assert!(matches!(
        &out[..],
        [ClientOutput::ToolCallFinished { call: id, outcome: Err(CallError::Timeout), .. }] if *id == call
    ));
    let late = format!(
        r#"{{"jsonrpc":"2.0","id":{},"result":{{"content":[],"isError":false}}}}"#,
        call.get()
    );
    c.handle_input(t0 + Duration::from_secs(6), Input::Bytes(late.as_bytes()));
    let out = drain(&mut c);
    assert!(matches!(&out[..], [ClientOutput::PeerFault(_)]), "{out:?}");
    assert_eq!(c.poll_timeout(), None);
}
