//! Runnable examples of the voxgate crates; see `examples/examples/*.rs`.
//!
//! Run one with `cargo run -p voxgate-examples --example realtime_session`. The examples use
//! only the crates' public APIs, exactly as a project depending on them from crates.io would.
