//! What the tests share: a real server on free loopback ports.
#![allow(dead_code, reason = "each test file uses its share")]

use std::net::SocketAddr;
use std::time::Duration;

use voxgate_server::{Config, Server};

/// How long a test waits for anything the server should do at once.
pub(crate) const WAIT: Duration = Duration::from_secs(10);

/// A server with `config` on free loopback ports; it stops when the returned sender fires or
/// is dropped.
pub(crate) async fn start(config: Config) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let server = Server::bind(config.with_ephemeral_ports()).await.unwrap();
    let addr = server.local_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));
    (addr, stop)
}
