//! The MCP endpoint's tools in every engine door: an MCP server connects to `/mcp` over a real
//! socket, a session of the Xiaozhi, realtime, Gemini (engine mode) or Retell door asks the
//! demo agent (`call <tool> <JSON>`) to use its tool, and the call reaches the MCP server with
//! the arguments and its result comes back into the reply. Also: `mcp_tools = false` offers
//! nothing, clashing names get distinct ones routed to the right server, and an MCP server that
//! never answers gives the model an error result after `[mcp] call_timeout_secs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::SocketAddr;

use serde_json::{Value, json};
use support::{
    Running, WAIT, Ws, connect, mcp_server, next_message, realtime, recv_json, rt_recv, rt_send,
    send_json, serve_calls, tool, wait_tools, xiaozhi_device,
};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;
use voxgate_realtime::ServiceBoundMessage;
use voxgate_realtime::proto::client_bound_message::Payload as Down;
use voxgate_realtime::proto::{InferenceTriggerMode, ToolDefinition};
use voxgate_server::Config;

const CALL: &str = r#"call text_echo {"text":"ping pong"}"#;

/// The call the MCP server must have seen for [`CALL`].
fn expected_call() -> Value {
    json!({"name":"text.echo","arguments":{"text":"ping pong"}})
}

/// A server with `config` and one MCP server offering `text.echo`, its tools in the hub.
async fn with_echo_server(config: Config) -> (Running, Ws) {
    let server = Running::start(config).await;
    let ws = mcp_server(
        server.addr,
        "/mcp?token=t",
        "tools",
        &[vec![tool("text.echo", "Echo text back")]],
    )
    .await;
    wait_tools(server.addr, |n| n == ["text_echo"]).await;
    (server, ws)
}

/// Serves `n` calls on the MCP server's socket in the background.
fn serve(mut ws: Ws, n: usize) -> JoinHandle<(Ws, Vec<Value>)> {
    tokio::spawn(async move {
        let seen = serve_calls(&mut ws, n).await;
        (ws, seen)
    })
}

/// Nothing but what we ask for next arrived on the MCP server's socket: no call was made.
async fn no_call_arrived(ws: &mut Ws) {
    send_json(ws, &json!({"jsonrpc":"2.0","id":77,"method":"ping"})).await;
    let answer = recv_json(ws).await;
    assert_eq!(answer["id"], 77, "{answer}");
}

// ---- Xiaozhi ---------------------------------------------------------------------------------

/// A Xiaozhi device after its hello (v1 framing, no device MCP).
async fn device(addr: SocketAddr) -> Ws {
    let mut ws = xiaozhi_device(addr).await;
    send_json(
        &mut ws,
        &json!({"type":"hello","version":1,"features":{"mcp":false},"transport":"websocket",
            "audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}),
    )
    .await;
    let hello = recv_text(&mut ws).await;
    assert_eq!(hello["type"], "hello", "{hello}");
    ws
}

/// The next JSON frame (audio skipped).
async fn recv_text(ws: &mut Ws) -> Value {
    loop {
        match next_message(ws, WAIT).await.expect("socket open") {
            Message::Text(t) => return serde_json::from_str(&t).unwrap(),
            Message::Binary(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// The sentences of one Xiaozhi reply, up to its `tts stop`.
async fn device_turn(ws: &mut Ws, text: &str) -> String {
    send_json(
        ws,
        &json!({"session_id":"s","type":"listen","state":"detect","text":text}),
    )
    .await;
    let mut said = Vec::new();
    loop {
        let v = recv_text(ws).await;
        if v["type"] == "tts" && v["state"] == "sentence_start" {
            said.push(v["text"].as_str().unwrap().to_owned());
        }
        if v["type"] == "tts" && v["state"] == "stop" {
            return said.join(" ");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xiaozhi_turn_calls_an_mcp_tool() {
    tokio::time::timeout(WAIT * 3, async {
        let (server, ws) = with_echo_server(Config::default()).await;
        let calls = serve(ws, 1);
        let mut dev = device(server.addr).await;
        let said = device_turn(&mut dev, CALL).await;
        let said = if said.contains("returned") {
            said
        } else {
            // The result may come in a follow-up response after the first one's stop.
            format!("{said} {}", device_turn_rest(&mut dev).await)
        };
        assert!(
            said.contains("text_echo returned: echo: ping pong"),
            "{said}"
        );
        let (_, seen) = calls.await.unwrap();
        assert_eq!(seen[0]["params"], expected_call());
        server.stop().await;
    })
    .await
    .unwrap();
}

/// Sentences up to the next `tts stop` without sending anything.
async fn device_turn_rest(ws: &mut Ws) -> String {
    let mut said = Vec::new();
    loop {
        let v = recv_text(ws).await;
        if v["type"] == "tts" && v["state"] == "sentence_start" {
            said.push(v["text"].as_str().unwrap().to_owned());
        }
        if v["type"] == "tts" && v["state"] == "stop" {
            return said.join(" ");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_door_with_mcp_tools_off_does_not_offer_them() {
    tokio::time::timeout(WAIT * 3, async {
        let mut config = Config::default();
        config.xiaozhi.mcp_tools = false;
        let (server, mut ws) = with_echo_server(config).await;
        let mut dev = device(server.addr).await;
        let said = device_turn(&mut dev, CALL).await;
        assert!(said.contains("I do not know a tool called"), "{said}");
        no_call_arrived(&mut ws).await;
        // The realtime door still has them (the switch is per door).
        let mut rt = realtime(server.addr).await;
        let calls = serve(ws, 1);
        let text = realtime_turn(&mut rt, CALL).await;
        assert!(text.contains("echo: ping pong"), "{text}");
        assert_eq!(calls.await.unwrap().1[0]["params"], expected_call());
        server.stop().await;
    })
    .await
    .unwrap();
}

// ---- realtime --------------------------------------------------------------------------------

async fn realtime_turn(ws: &mut Ws, text: &str) -> String {
    rt_send(
        ws,
        &ServiceBoundMessage::user_text(1, InferenceTriggerMode::Queue, text),
    )
    .await;
    let mut said = String::new();
    while !said.contains("returned") {
        match rt_recv(ws).await {
            Down::ModelTextFragment(f) => said.push_str(&f.text),
            Down::ToolCallRequest(r) => panic!("the client was asked to run {}", r.name),
            Down::Error(e) => panic!("error {e:?}"),
            _ => {}
        }
    }
    // The rest of the reply, to its end.
    loop {
        match rt_recv(ws).await {
            Down::ModelTextFragment(f) => said.push_str(&f.text),
            Down::ResponseEnd(_) => return said,
            Down::ToolCallRequest(r) => panic!("the client was asked to run {}", r.name),
            _ => {}
        }
    }
}

#[tokio::test]
async fn realtime_turn_calls_an_mcp_tool_the_client_never_sees() {
    tokio::time::timeout(WAIT * 3, async {
        let (server, ws) = with_echo_server(Config::default()).await;
        let calls = serve(ws, 1);
        let mut rt = realtime(server.addr).await;
        let said = realtime_turn(&mut rt, CALL).await;
        assert!(
            said.contains("text_echo returned: echo: ping pong"),
            "{said}"
        );
        assert_eq!(calls.await.unwrap().1[0]["params"], expected_call());
        server.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn clashing_names_are_made_distinct_and_calls_reach_the_right_server() {
    tokio::time::timeout(WAIT * 3, async {
        let (server, first) = with_echo_server(Config::default()).await;
        // A second MCP server offering the same tool.
        let second = mcp_server(
            server.addr,
            "/mcp?token=t",
            "more tools",
            &[vec![tool("text.echo", "Echo text back, too")]],
        )
        .await;
        wait_tools(server.addr, |n| n.len() == 2).await;
        let mut rt = realtime(server.addr).await;
        // The client's own tool keeps its name; the MCP servers' get `_2`, `_3` in the order
        // they connected.
        let client_tool = ToolDefinition::from_json(
            "text_echo",
            Some("The client's echo".into()),
            &json!({"type":"object","properties":{"text":{"type":"string"}}}),
        )
        .unwrap();
        rt_send(
            &mut rt,
            &ServiceBoundMessage::update_tools(vec![client_tool]),
        )
        .await;
        let calls = serve(second, 1);
        let said = realtime_turn(&mut rt, r#"call text_echo_3 {"text":"ping pong"}"#).await;
        assert!(said.contains("echo: ping pong"), "{said}");
        assert_eq!(calls.await.unwrap().1[0]["params"], expected_call());
        let mut first = first;
        no_call_arrived(&mut first).await;
        let calls = serve(first, 1);
        let said = realtime_turn(&mut rt, r#"call text_echo_2 {"text":"ping pong"}"#).await;
        assert!(said.contains("echo: ping pong"), "{said}");
        assert_eq!(calls.await.unwrap().1[0]["params"], expected_call());
        server.stop().await;
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn an_mcp_server_that_never_answers_gives_the_model_an_error_result() {
    tokio::time::timeout(WAIT * 3, async {
        let mut config = Config::default();
        config.mcp.call_timeout_secs = 1;
        let (server, mut ws) = with_echo_server(config).await;
        let mut rt = realtime(server.addr).await;
        rt_send(
            &mut rt,
            &ServiceBoundMessage::user_text(1, InferenceTriggerMode::Queue, CALL),
        )
        .await;
        // The call arrives and is never answered.
        let call = loop {
            let m = recv_json(&mut ws).await;
            if m["method"] == "tools/call" {
                break m;
            }
        };
        assert_eq!(call["params"], expected_call());
        let mut said = String::new();
        while !said.contains("returned") {
            if let Down::ModelTextFragment(f) = rt_recv(&mut rt).await {
                said.push_str(&f.text);
            }
        }
        loop {
            match rt_recv(&mut rt).await {
                Down::ModelTextFragment(f) => said.push_str(&f.text),
                Down::ResponseEnd(_) => break,
                _ => {}
            }
        }
        assert!(said.contains("did not answer in time"), "{said}");
        // The session goes on.
        rt_send(
            &mut rt,
            &ServiceBoundMessage::user_text(2, InferenceTriggerMode::Queue, "hello"),
        )
        .await;
        let mut next = String::new();
        loop {
            match rt_recv(&mut rt).await {
                Down::ModelTextFragment(f) => next.push_str(&f.text),
                Down::ResponseEnd(_) => break,
                _ => {}
            }
        }
        assert!(next.contains("You said: hello"), "{next}");
        server.stop().await;
    })
    .await
    .unwrap();
}

// ---- Gemini (engine mode) --------------------------------------------------------------------

#[tokio::test]
async fn gemini_engine_turn_calls_an_mcp_tool() {
    tokio::time::timeout(WAIT * 3, async {
        let (server, ws) = with_echo_server(Config::default()).await;
        let calls = serve(ws, 1);
        let mut g = connect(server.addr, "/gemini").await;
        send_json(
            &mut g,
            &json!({"type":"CONNECT_GEMINI","payload":{"initialConfig":{
                "model":"models/gemini-2.0-flash-live-001",
                "generationConfig":{"responseModalities":["text"]}}}}),
        )
        .await;
        assert_eq!(recv_json(&mut g).await["type"], "GEMINI_CONNECTED");
        assert_eq!(recv_json(&mut g).await["type"], "SETUP_COMPLETE");
        send_json(
            &mut g,
            &json!({"type":"SEND_MESSAGE","payload":{"parts":[{"text":CALL}],"turnComplete":true}}),
        )
        .await;
        let mut said = String::new();
        loop {
            let m = recv_json(&mut g).await;
            if said.contains("returned") && m["type"] == "TURN_COMPLETE" {
                break;
            }
            assert_ne!(
                m["type"], "TOOL_CALL",
                "the client was asked to run a tool: {m}"
            );
            assert_ne!(m["type"], "GEMINI_ERROR", "{m}");
            for p in m["payload"]["serverContent"]["modelTurn"]["parts"]
                .as_array()
                .cloned()
                .unwrap_or_default()
            {
                said.push_str(p["text"].as_str().unwrap_or_default());
            }
        }
        assert!(said.contains("echo: ping pong"), "{said}");
        assert_eq!(calls.await.unwrap().1[0]["params"], expected_call());
        server.stop().await;
    })
    .await
    .unwrap();
}

// ---- Retell ----------------------------------------------------------------------------------

#[tokio::test]
async fn retell_turn_calls_an_mcp_tool_and_reports_it() {
    tokio::time::timeout(WAIT * 3, async {
        let (server, ws) = with_echo_server(Config::default()).await;
        let calls = serve(ws, 1);
        let mut r = connect(server.addr, "/llm-websocket/call_mcp").await;
        send_json(
            &mut r,
            &json!({"interaction_type":"response_required","response_id":1,
                "transcript":[{"role":"user","content":CALL}]}),
        )
        .await;
        let mut frames = Vec::new();
        loop {
            let f = recv_json(&mut r).await;
            let done = f["response_type"] == "response"
                && f["response_id"] == 1
                && f["content_complete"] == true;
            frames.push(f);
            if done {
                break;
            }
        }
        let content: String = frames
            .iter()
            .filter(|f| f["response_type"] == "response" && f["response_id"] == 1)
            .filter_map(|f| f["content"].as_str())
            .collect();
        assert!(
            content.contains("text_echo returned: echo: ping pong"),
            "{content}"
        );
        let invocation = frames
            .iter()
            .find(|f| f["response_type"] == "tool_call_invocation")
            .expect("the call is reported");
        assert_eq!(invocation["name"], "text_echo");
        let result = frames
            .iter()
            .find(|f| f["response_type"] == "tool_call_result")
            .expect("the result is reported");
        assert_eq!(result["tool_call_id"], invocation["tool_call_id"]);
        assert_eq!(result["content"], "echo: ping pong");
        assert_eq!(calls.await.unwrap().1[0]["params"], expected_call());
        server.stop().await;
    })
    .await
    .unwrap();
}
