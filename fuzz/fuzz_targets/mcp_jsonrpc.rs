//! The JSON-RPC decoder (with escaping repair) and both MCP machines on arbitrary peer bytes:
//! nothing may panic, and whatever decodes re-encodes to JSON that decodes to the same message.
#![no_main]

use std::sync::LazyLock;
use std::time::Instant;

use voxgate_mcp::Input;
use voxgate_mcp::client::{ClientConfig, McpClient};
use voxgate_mcp::jsonrpc::{self, Payload};
use voxgate_mcp::model::Tool;
use voxgate_mcp::serde_json;
use voxgate_mcp::server::{McpServer, ServerConfig};

static MACHINES: LazyLock<(Instant, McpServer, McpClient)> = LazyLock::new(|| {
    let now = Instant::now();
    let mut server = McpServer::new(ServerConfig {
        page_bytes: 200,
        ..ServerConfig::default()
    });
    server.set_tools(vec![
        Tool::new(
            "self.audio_speaker.set_volume",
            "Set the volume",
            serde_json::json!({
                "type": "object",
                "properties": {"volume": {"type": "integer", "minimum": 0, "maximum": 100}},
                "required": ["volume"]
            }),
        ),
        Tool::new(
            "self.reboot",
            "Reboot",
            serde_json::json!({"type": "object"}),
        )
        .user_only(),
    ]);
    server.handle_input(
        now,
        Input::Bytes(br#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}"#),
    );
    let mut client = McpClient::new(ClientConfig::default());
    let _ = client.start(now);
    client.handle_input(now, Input::Bytes(br#"{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":{"name":"d","version":"1"}}}"#));
    let _ = client.call_tool(
        now,
        "self.audio_speaker.set_volume",
        serde_json::json!({"volume": 1}),
    );
    while server.poll_output().is_some() {}
    while client.poll_output().is_some() {}
    (now, server, client)
});

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = voxgate_mcp::repair_json(data);
    if let Ok(decoded) = jsonrpc::decode(data) {
        let messages = match decoded.payload {
            Payload::Single(m) => vec![m],
            Payload::Batch(items) => items.into_iter().flatten().collect(),
            _ => Vec::new(),
        };
        for m in messages {
            let again = jsonrpc::decode(&m.to_vec()).expect("our encoding must decode");
            assert!(!again.repaired, "our encoding must be valid JSON");
            assert_eq!(again.payload, Payload::Single(m));
        }
    }

    // Compiling schemas is slow; build the machines once and fuzz clones of them.
    let (now, mut server, mut client) = MACHINES.clone();
    server.handle_input(now, Input::Bytes(data));
    while server.poll_output().is_some() {}
    server.handle_timeout(now + std::time::Duration::from_secs(60));
    while server.poll_output().is_some() {}

    client.handle_input(now, Input::Bytes(data));
    while client.poll_output().is_some() {}
    client.handle_timeout(now + std::time::Duration::from_secs(60));
    while client.poll_output().is_some() {}
});
