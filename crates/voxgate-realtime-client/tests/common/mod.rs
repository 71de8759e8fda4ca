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
    let server = Server::bind(quiet(config)).await.unwrap();
    let addr = server.local_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));
    (addr, stop)
}

/// `config` on free ports without the overload guard: a test shares its runtime with the server
/// and sends audio as fast as it can, which the guard (tested in voxgate-server) would take for
/// an overloaded server on a busy machine.
pub(crate) fn quiet(mut config: Config) -> Config {
    config.limits.max_scheduling_delay_ms = 0;
    config.with_ephemeral_ports()
}
