//! Runnable examples of the voxgate crates; see `examples/examples/*.rs`. The examples use only
//! the crates' public APIs, exactly as a project depending on them from crates.io would.
//!
//! | example | what it shows | run it |
//! |---|---|---|
//! | `realtime_session` | the realtime protocol codec without sockets: handshake, a text turn, protocol errors | `cargo run -p voxgate-examples --example realtime_session` |
//! | `xiaozhi_turn` | one Xiaozhi turn as a device receives it: hello, STT, emotion, versioned audio frames | `cargo run -p voxgate-examples --example xiaozhi_turn` |
//! | `embed_server` | `voxgate_server` embedded with your own LLM (`voxgate_providers::Llm`), a text turn on its realtime door over WebSocket, then shutdown | `cargo run -p voxgate-examples --example embed_server [-- TEXT]` |
//! | `engine_direct` | the sans-IO `voxgate_engine::Engine` driven by hand: your clock, your (fake) recognizer, model and synthesizer, a typed and a spoken turn | `cargo run -p voxgate-examples --example engine_direct [-- FILE.wav]` |
//! | `retell_server` | a Retell custom-LLM WebSocket server on `voxgate-retell` alone, and Retell's side played by the crate's `RetellDriver` | `cargo run -p voxgate-examples --example retell_server` (or `-- --listen ADDR` to serve a real Retell agent) |
//! | `gemini_bridge_client` | a Gemini bridge client on `voxgate-gemini`: set up a text session, send a message, print the reply | `cargo run -p voxgate-examples --example gemini_bridge_client [-- URL [TEXT]]` (no URL: a voxgate server in the same process) |
//!
//! `cargo test -p voxgate-examples` runs the networked examples' logic against real peers on
//! 127.0.0.1 (`examples/tests/examples.rs` compiles each example file as a module).
