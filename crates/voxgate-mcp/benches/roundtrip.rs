//! A `tools/call` round trip through our client and server machines, JSON bytes both ways.

// A benchmark that unwraps fails loudly on a broken setup, like a test.
#![allow(clippy::unwrap_used)]

use std::time::Instant;

use divan::{AllocProfiler, Bencher};
use serde_json::json;
use voxgate_mcp::Input;
use voxgate_mcp::client::{ClientConfig, ClientOutput, McpClient};
use voxgate_mcp::model::{CallToolResult, Tool};
use voxgate_mcp::server::{McpServer, ServerConfig, ServerOutput};

#[global_allocator]
static ALLOC: AllocProfiler = AllocProfiler::system();

fn main() {
    divan::main();
}

/// Client and server, initialized and with the tool list exchanged.
fn connected(now: Instant) -> (McpClient, McpServer) {
    let mut server = McpServer::new(ServerConfig::default());
    server.set_tools(vec![Tool::new(
        "self.audio_speaker.set_volume",
        "Set the volume of the speaker, 0 to 100",
        json!({"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":100}},"required":["volume"]}),
    )]);
    let mut client = McpClient::new(ClientConfig::default());
    client.start(now).unwrap();
    loop {
        let mut moved = false;
        while let Some(out) = client.poll_output() {
            moved = true;
            if let ClientOutput::Transmit(m) = out {
                server.handle_input(now, Input::Bytes(&m.to_vec()));
            }
        }
        while let Some(out) = server.poll_output() {
            moved = true;
            if let ServerOutput::Transmit(m) = out {
                client.handle_input(now, Input::Bytes(&m.to_vec()));
            }
        }
        if !moved {
            break;
        }
    }
    assert!(client.is_ready() && client.tools().len() == 1);
    (client, server)
}

/// One call: client encodes, server decodes and validates, the owner answers, server encodes,
/// client decodes and reports.
fn round_trip(client: &mut McpClient, server: &mut McpServer, now: Instant) -> CallToolResult {
    client
        .call_tool(now, "self.audio_speaker.set_volume", json!({"volume": 42}))
        .unwrap();
    let Some(ClientOutput::Transmit(req)) = client.poll_output() else {
        unreachable!()
    };
    server.handle_input(now, Input::Bytes(&req.to_vec()));
    let Some(ServerOutput::CallTool { request, .. }) = server.poll_output() else {
        unreachable!()
    };
    server
        .respond_call(&request, &CallToolResult::text("true"))
        .unwrap();
    let Some(ServerOutput::Transmit(reply)) = server.poll_output() else {
        unreachable!()
    };
    client.handle_input(now, Input::Bytes(&reply.to_vec()));
    let Some(ClientOutput::ToolCallFinished { outcome, .. }) = client.poll_output() else {
        unreachable!()
    };
    outcome.unwrap()
}

#[divan::bench]
fn tools_call_round_trip(bencher: Bencher<'_, '_>) {
    let now = Instant::now();
    let (mut client, mut server) = connected(now);
    bencher.bench_local(|| round_trip(&mut client, &mut server, now));
}
