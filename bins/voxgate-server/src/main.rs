//! `voxgate-server`: the reference voice-agent server.
//!
//! The protocol crates come first; the server that serves them over real sockets lands with the
//! server issues. Until then this binary says so plainly and exits non-zero, so nobody mistakes
//! it for a working server.

use std::process::ExitCode;

const PLACEHOLDER: &str = "\
voxgate-server: not built yet.

This placeholder will become the voxgate reference server: one process that serves
  - the realtime protobuf session protocol at /realtime (Deepslate-compatible clients),
  - the Xiaozhi ESP32 device protocol at /xiaozhi/v1/ with OTA at /xiaozhi/ota/,
  - Retell's custom-LLM WebSocket at /llm-websocket/{call_id},
  - the Gemini bridge JSON protocol on 127.0.0.1:3001,
on 127.0.0.1:8080 with embedded defaults that work offline.

What exists today are the protocol crates (see README.md). Nothing is listening.";

fn main() -> ExitCode {
    eprintln!("{PLACEHOLDER}");
    ExitCode::from(2)
}
