//! Our client against our server, with a virtual clock, bytes in between.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use voxgate_mcp::Input;
use voxgate_mcp::PeerFault;
use voxgate_mcp::client::{CallError, ClientConfig, ClientOutput, McpClient};
use voxgate_mcp::jsonrpc::{ErrorObject, Id};
use voxgate_mcp::model::{CallToolResult, Tool};
use voxgate_mcp::server::{McpServer, ServerConfig, ServerOutput};

/// Two machines, a virtual clock and the events each reported (transmits are delivered).
struct Pair {
    now: Instant,
    client: McpClient,
    server: McpServer,
    client_events: Vec<ClientOutput>,
    server_events: Vec<ServerOutput>,
    /// Whether server→client messages are delivered (false: the server is unreachable).
    deliver_to_client: bool,
}

impl Pair {
    fn new(client: ClientConfig, server: ServerConfig, tools: Vec<Tool>) -> Self {
        let mut server = McpServer::new(server);
        assert!(server.set_tools(tools).is_empty());
        Pair {
            now: Instant::now(),
            client: McpClient::new(client),
            server,
            client_events: Vec::new(),
            server_events: Vec::new(),
            deliver_to_client: true,
        }
    }

    /// Runs until neither machine has output.
    fn settle(&mut self) {
        loop {
            let mut moved = false;
            while let Some(out) = self.client.poll_output() {
                moved = true;
                match out {
                    ClientOutput::Transmit(m) => self
                        .server
                        .handle_input(self.now, Input::Bytes(&m.to_vec())),
                    other => self.client_events.push(other),
                }
            }
            while let Some(out) = self.server.poll_output() {
                moved = true;
                match out {
                    ServerOutput::Transmit(m) if self.deliver_to_client => {
                        self.client
                            .handle_input(self.now, Input::Bytes(&m.to_vec()));
                    }
                    ServerOutput::Transmit(_) => {}
                    other => self.server_events.push(other),
                }
            }
            if !moved {
                break;
            }
        }
    }

    /// Advances the clock to `to`, firing every timer on the way.
    fn advance(&mut self, to: Instant) {
        loop {
            let next = [self.client.poll_timeout(), self.server.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            match next {
                Some(t) if t <= to => {
                    self.now = self.now.max(t);
                    self.client.handle_timeout(self.now);
                    self.server.handle_timeout(self.now);
                    self.settle();
                }
                _ => break,
            }
        }
        self.now = to;
    }

    fn take_client(&mut self) -> Vec<ClientOutput> {
        std::mem::take(&mut self.client_events)
    }

    fn take_server(&mut self) -> Vec<ServerOutput> {
        std::mem::take(&mut self.server_events)
    }

    fn start(&mut self) {
        assert_eq!(self.client.start(self.now), Ok(()));
        self.settle();
    }
}

fn tool(name: &str, desc_len: usize) -> Tool {
    Tool::new(
        name,
        "x".repeat(desc_len),
        json!({"type":"object","properties":{"level":{"type":"integer","minimum":0,"maximum":10}},"required":["level"]}),
    )
}

fn many_tools() -> Vec<Tool> {
    let mut tools: Vec<Tool> = (0..12)
        .map(|i| tool(&format!("self.tool_{i}"), 300))
        .collect();
    tools.insert(5, tool("self.reboot", 10).user_only());
    tools
}

fn names(tools: &[Tool]) -> Vec<String> {
    tools.iter().map(|t| t.name.clone()).collect()
}

#[test]
fn initialize_then_paged_listing_returns_every_visible_tool() {
    let server = ServerConfig {
        page_bytes: 1000,
        ..ServerConfig::default()
    };
    let mut p = Pair::new(ClientConfig::default(), server, many_tools());
    p.start();
    let events = p.take_client();
    let ClientOutput::Ready(info) = &events[0] else {
        panic!("{events:?}")
    };
    assert_eq!(info.protocol_version, "2024-11-05");
    assert_eq!(info.capabilities["tools"]["listChanged"], true);
    let ClientOutput::ToolsListed(tools) = &events[1] else {
        panic!("{events:?}")
    };
    let expected: Vec<String> = (0..12).map(|i| format!("self.tool_{i}")).collect();
    assert_eq!(names(tools), expected, "user-only tools need withUserTools");
    assert_eq!(events.len(), 2);
    assert!(matches!(
        &p.take_server()[..],
        [ServerOutput::Initialized(_)]
    ));
    assert_eq!(p.client.in_flight(), 0);

    // With user tools, the reboot tool is listed too.
    let mut p = Pair::new(
        ClientConfig {
            with_user_tools: true,
            ..ClientConfig::default()
        },
        ServerConfig {
            page_bytes: 1000,
            ..ServerConfig::default()
        },
        many_tools(),
    );
    p.start();
    assert_eq!(names(p.client.tools()), names(&many_tools()));
}

#[test]
fn pages_are_capped_and_cursor_is_the_next_tool_name() {
    let mut server = McpServer::new(ServerConfig {
        page_bytes: 1000,
        ..ServerConfig::default()
    });
    server.set_tools(many_tools());
    let now = Instant::now();
    server.handle_input(now, Input::Bytes(br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2024-11-05","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#));
    server.handle_input(now, Input::Bytes(br#"{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"cursor":"","withUserTools":false}}"#));
    let outs: Vec<ServerOutput> = std::iter::from_fn(|| server.poll_output()).collect();
    let ServerOutput::Transmit(m) = &outs[2] else {
        panic!("{outs:?}")
    };
    let v = m.to_value();
    let page = v["result"]["tools"].as_array().unwrap();
    assert!(!page.is_empty());
    assert!(serde_json::to_vec(page).unwrap().len() <= 1000 + 400);
    let cursor = v["result"]["nextCursor"].as_str().unwrap();
    assert_eq!(cursor, format!("self.tool_{}", page.len()));

    // The last page has no nextCursor at all.
    let req =
        br#"{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{"cursor":"self.tool_11"}}"#;
    server.handle_input(now, Input::Bytes(req));
    let ServerOutput::Transmit(m) = server.poll_output().unwrap() else {
        panic!()
    };
    let v = m.to_value();
    assert_eq!(v["result"]["tools"].as_array().unwrap().len(), 1);
    assert!(v["result"].get("nextCursor").is_none());

    // An unknown cursor is an invalid-params error.
    server.handle_input(
        now,
        Input::Bytes(
            br#"{"jsonrpc":"2.0","id":4,"method":"tools/list","params":{"cursor":"nope"}}"#,
        ),
    );
    let ServerOutput::Transmit(m) = server.poll_output().unwrap() else {
        panic!()
    };
    assert_eq!(m.to_value()["error"]["code"], ErrorObject::INVALID_PARAMS);
}

fn ready_pair() -> Pair {
    let mut p = Pair::new(
        ClientConfig::default(),
        ServerConfig::default(),
        many_tools(),
    );
    p.start();
    p.take_client();
    p.take_server();
    p
}

#[test]
fn tool_call_round_trip() {
    let mut p = ready_pair();
    let call = p
        .client
        .call_tool(p.now, "self.tool_3", json!({"level": 7}))
        .unwrap();
    p.settle();
    let events = p.take_server();
    let [
        ServerOutput::CallTool {
            request,
            name,
            arguments,
        },
    ] = &events[..]
    else {
        panic!("{events:?}")
    };
    assert_eq!(name, "self.tool_3");
    assert_eq!(arguments, &json!({"level": 7}));
    assert_eq!(request, &call.id());
    p.server
        .respond_call(request, &CallToolResult::text("done"))
        .unwrap();
    // Answering twice is a caller bug, reported as such.
    assert!(
        p.server
            .respond_call(request, &CallToolResult::text("again"))
            .is_err()
    );
    p.settle();
    let events = p.take_client();
    let [
        ClientOutput::ToolCallFinished {
            call: c,
            outcome: Ok(r),
            ..
        },
    ] = &events[..]
    else {
        panic!("{events:?}")
    };
    assert_eq!(*c, call);
    assert_eq!(r.joined_text(), "done");
}

#[test]
fn invalid_arguments_come_back_as_an_error_result_with_the_standard_payload() {
    let mut p = ready_pair();
    p.client
        .call_tool(p.now, "self.tool_1", json!({"level": 99}))
        .unwrap();
    p.settle();
    assert!(p.take_server().is_empty(), "the tool must not run");
    let events = p.take_client();
    let [ClientOutput::ToolCallFinished { outcome: Ok(r), .. }] = &events[..] else {
        panic!("{events:?}")
    };
    assert!(r.is_error);
    let payload: Value = serde_json::from_str(&r.joined_text()).unwrap();
    assert_eq!(payload["error"]["code"], "invalid_arguments");
    assert_eq!(payload["error"]["details"][0]["path"], "/level");
}

#[test]
fn unknown_tool_and_unknown_method_are_rpc_errors_with_codes() {
    let mut p = ready_pair();
    p.client.call_tool(p.now, "self.nope", json!({})).unwrap();
    p.settle();
    let events = p.take_client();
    let [
        ClientOutput::ToolCallFinished {
            outcome: Err(CallError::Rpc(e)),
            ..
        },
    ] = &events[..]
    else {
        panic!("{events:?}")
    };
    assert_eq!(e.code, Some(ErrorObject::INVALID_PARAMS));
    assert_eq!(e.message, "Unknown tool: self.nope");

    p.server.handle_input(
        p.now,
        Input::Bytes(br#"{"jsonrpc":"2.0","id":"s-1","method":"resources/list"}"#),
    );
    let ServerOutput::Transmit(m) = p.server.poll_output().unwrap() else {
        panic!()
    };
    // String ids are echoed as strings.
    assert_eq!(
        m.to_value(),
        json!({"jsonrpc":"2.0","id":"s-1","error":{"code":-32601,"message":"Method not found: resources/list"}})
    );
}

#[test]
fn client_times_out_when_the_server_is_silent_and_the_server_answers_its_own_timeout() {
    let mut p = ready_pair();
    p.deliver_to_client = false;
    let t0 = p.now;
    let call = p
        .client
        .call_tool_with_timeout(
            t0,
            "self.tool_0",
            json!({"level": 1}),
            Duration::from_secs(5),
        )
        .unwrap();
    p.settle();
    assert_eq!(p.client.poll_timeout(), Some(t0 + Duration::from_secs(5)));
    assert_eq!(p.server.poll_timeout(), Some(t0 + Duration::from_secs(30)));
    p.advance(t0 + Duration::from_secs(31));
    let events = p.take_client();
    assert!(matches!(
        &events[..],
        [ClientOutput::ToolCallFinished { call: c, outcome: Err(CallError::Timeout), .. }] if *c == call
    ));
    let events = p.take_server();
    assert!(
        matches!(&events[..], [ServerOutput::CallTool { .. }, ServerOutput::CallTimedOut { name, .. }] if name == "self.tool_0")
    );
    assert_eq!(p.client.poll_timeout(), None);
    assert_eq!(p.server.poll_timeout(), None);
}

#[test]
fn cancel_reaches_the_server_and_closing_fails_everything() {
    let mut p = ready_pair();
    let a = p
        .client
        .call_tool(p.now, "self.tool_0", json!({"level": 1}))
        .unwrap();
    let b = p
        .client
        .call_tool(p.now, "self.tool_1", json!({"level": 2}))
        .unwrap();
    p.settle();
    p.take_server();
    assert!(p.client.cancel(a, "user interrupted"));
    assert!(!p.client.cancel(a, "twice"));
    p.settle();
    let events = p.take_server();
    assert!(matches!(&events[..], [ServerOutput::CallCancelled { request }] if *request == a.id()));
    assert_eq!(p.server.pending_calls(), 1);

    p.client.handle_input(p.now, Input::Closed);
    let events: Vec<ClientOutput> = std::iter::from_fn(|| p.client.poll_output()).collect();
    assert!(matches!(
        &events[..],
        [ClientOutput::ToolCallFinished { call, outcome: Err(CallError::Closed), .. }] if *call == b
    ));
    assert!(p.client.call_tool(p.now, "x", json!({})).is_err());
    p.server.handle_input(p.now, Input::Closed);
    assert!(matches!(
        p.server.poll_output(),
        Some(ServerOutput::CallCancelled { .. })
    ));
}

#[test]
fn tool_changes_trigger_a_relist() {
    let mut p = ready_pair();
    p.server.set_tools(vec![tool("self.only", 5)]);
    p.settle();
    let events = p.take_client();
    assert!(
        matches!(&events[0], ClientOutput::Notification(n) if n.method == "notifications/tools/list_changed")
    );
    assert!(matches!(&events[1], ClientOutput::ToolsListed(t) if names(t) == ["self.only"]));
}

#[test]
fn ping_both_ways_and_requests_before_initialize() {
    let mut p = ready_pair();
    let call = p.client.ping(p.now).unwrap();
    p.settle();
    assert!(
        matches!(&p.take_client()[..], [ClientOutput::Pong { call: c, outcome: Ok(()) }] if *c == call)
    );

    // A server→client ping is answered by the client itself.
    p.client.handle_input(
        p.now,
        Input::Bytes(br#"{"jsonrpc":"2.0","id":99,"method":"ping"}"#),
    );
    let Some(ClientOutput::Transmit(m)) = p.client.poll_output() else {
        panic!()
    };
    assert_eq!(m.to_value(), json!({"jsonrpc":"2.0","id":99,"result":{}}));

    let mut fresh = McpServer::new(ServerConfig::default());
    fresh.handle_input(
        p.now,
        Input::Bytes(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#),
    );
    let Some(ServerOutput::Transmit(m)) = fresh.poll_output() else {
        panic!()
    };
    assert_eq!(m.to_value()["error"]["code"], ErrorObject::INVALID_REQUEST);
    assert!(matches!(
        fresh.poll_output(),
        Some(ServerOutput::PeerFault(PeerFault::NotInitialized(_)))
    ));
}

#[test]
fn server_answers_garbage_and_batches() {
    let mut p = ready_pair();
    p.server
        .handle_input(p.now, Input::Bytes(b"not json at all"));
    let Some(ServerOutput::Transmit(m)) = p.server.poll_output() else {
        panic!()
    };
    assert_eq!(m.to_value()["error"]["code"], ErrorObject::PARSE_ERROR);
    assert_eq!(m.to_value()["id"], Value::Null);
    assert!(matches!(
        p.server.poll_output(),
        Some(ServerOutput::PeerFault(PeerFault::Malformed(_)))
    ));

    p.server.handle_input(
        p.now,
        Input::Bytes(
            br#"[{"jsonrpc":"2.0","id":10,"method":"ping"}, {"jsonrpc":"2.0","id":11,"method":7}]"#,
        ),
    );
    let outs: Vec<ServerOutput> = std::iter::from_fn(|| p.server.poll_output()).collect();
    let ServerOutput::Transmit(first) = &outs[0] else {
        panic!("{outs:?}")
    };
    assert_eq!(
        first.to_value(),
        json!({"jsonrpc":"2.0","id":10,"result":{}})
    );
    let ServerOutput::Transmit(second) = &outs[1] else {
        panic!("{outs:?}")
    };
    assert_eq!(second.to_value()["id"], 11);
    assert_eq!(
        second.to_value()["error"]["code"],
        ErrorObject::INVALID_REQUEST
    );

    // A duplicate in-flight request id is refused without running the tool twice.
    let call = br#"{"jsonrpc":"2.0","id":"dup","method":"tools/call","params":{"name":"self.tool_0","arguments":{"level":1}}}"#;
    p.server.handle_input(p.now, Input::Bytes(call));
    p.server.handle_input(p.now, Input::Bytes(call));
    let outs: Vec<ServerOutput> = std::iter::from_fn(|| p.server.poll_output()).collect();
    assert!(
        matches!(&outs[0], ServerOutput::CallTool { request, .. } if *request == Id::from("dup"))
    );
    assert!(
        matches!(&outs[1], ServerOutput::Transmit(m) if m.to_value()["error"]["code"] == ErrorObject::INVALID_REQUEST)
    );
}

#[test]
fn listing_that_never_ends_is_cut_off() {
    let now = Instant::now();
    let mut c = McpClient::new(ClientConfig {
        max_pages: 3,
        ..ClientConfig::default()
    });
    c.start(now).unwrap();
    let init = br#"{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2024-11-05","capabilities":{},"serverInfo":{"name":"s","version":"1"}}}"#;
    c.handle_input(now, Input::Bytes(init));
    for id in 2..=4 {
        let page = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"result":{{"tools":[{{"name":"t{id}"}}],"nextCursor":"c{id}"}}}}"#
        );
        c.handle_input(now, Input::Bytes(page.as_bytes()));
    }
    let outs: Vec<ClientOutput> = std::iter::from_fn(|| c.poll_output()).collect();
    assert!(
        outs.iter()
            .any(|o| matches!(o, ClientOutput::PeerFault(PeerFault::PagingLoop(_))))
    );
    assert!(
        outs.iter()
            .any(|o| matches!(o, ClientOutput::ToolsListed(t) if t.len() == 3))
    );
    assert_eq!(c.in_flight(), 0);
}
