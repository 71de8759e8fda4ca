//! The Xiaozhi door: ESP32 devices over WebSocket (JSON control frames, binary Opus audio) and
//! the OTA endpoint that tells them where to connect.

mod config;

use std::sync::Arc;

use axum::Router;

pub use config::XiaozhiConfig;

use crate::server::App;

/// The door's routes on the main listener.
pub(crate) fn routes() -> Router<Arc<App>> {
    Router::new()
}

/// The door's own listeners (WebSocket on any path, OTA), when configured.
pub(crate) fn listeners(_config: &crate::Config) -> Vec<crate::server::DoorListener> {
    Vec::new()
}
