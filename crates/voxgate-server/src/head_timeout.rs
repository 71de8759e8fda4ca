//! A deadline on a connection's first HTTP request head (slow-drip "slowloris" upgrades).
//!
//! `axum::serve` runs hyper without a timer, so hyper's own header-read timeout never fires and
//! a client that sends its upgrade request a byte at a time, or nothing at all, holds a
//! connection forever. [`HeadTimeoutListener`] accepts like a `TcpListener` but hands out
//! streams whose reads fail with `TimedOut` once the deadline passes before the end of the
//! first request head (`\r\n\r\n`) has arrived; hyper then drops the connection. After the head
//! the stream is transparent, so upgraded WebSocket sessions are untouched (their own timeouts
//! are the door driver's).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Sleep;

/// A `TcpListener` whose connections must send their first request head within a deadline.
#[derive(Debug)]
pub(crate) struct HeadTimeoutListener {
    inner: TcpListener,
    /// `None`: no deadline.
    timeout: Option<Duration>,
}

impl HeadTimeoutListener {
    pub(crate) fn new(inner: TcpListener, timeout: Option<Duration>) -> Self {
        Self { inner, timeout }
    }
}

impl axum::serve::Listener for HeadTimeoutListener {
    type Io = HeadTimeoutStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.inner.accept().await {
                Ok((stream, addr)) => return (HeadTimeoutStream::new(stream, self.timeout), addr),
                Err(e) if is_connection_error(&e) => {}
                Err(e) => {
                    // Most likely out of file descriptors: wait for some to close rather than
                    // spin.
                    tracing::error!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// A TCP stream whose reads fail once its first request head is late.
#[derive(Debug)]
pub(crate) struct HeadTimeoutStream {
    inner: TcpStream,
    /// Present until the head has arrived.
    deadline: Option<Pin<Box<Sleep>>>,
    head: HeadEnd,
}

impl HeadTimeoutStream {
    fn new(inner: TcpStream, timeout: Option<Duration>) -> Self {
        Self {
            inner,
            deadline: timeout.map(|t| Box::pin(tokio::time::sleep(t))),
            head: HeadEnd::default(),
        }
    }
}

/// Finds the end of an HTTP/1 request head (`\r\n\r\n`) across reads, byte by byte, so it
/// keeps no buffer and a head split anywhere is still found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct HeadEnd {
    /// How much of `\r\n\r\n` the last bytes matched.
    matched: u8,
}

impl HeadEnd {
    /// Feeds bytes; true once the end of the head was seen.
    fn feed(&mut self, bytes: &[u8]) -> bool {
        for &b in bytes {
            self.matched = match (self.matched, b) {
                (0 | 2, b'\r') => self.matched + 1,
                (1 | 3, b'\n') => self.matched + 1,
                (_, b'\r') => 1,
                _ => 0,
            };
            if self.matched == 4 {
                return true;
            }
        }
        false
    }
}

impl AsyncRead for HeadTimeoutStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(deadline) = &mut this.deadline
            && deadline.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "request head not received in time",
            )));
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if this.deadline.is_some()
            && let Poll::Ready(Ok(())) = &r
            && this.head.feed(&buf.filled()[before..])
        {
            this.deadline = None;
        }
        r
    }
}

impl AsyncWrite for HeadTimeoutStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn the_end_of_a_head_is_found_across_any_split() {
        let head = b"GET / HTTP/1.1\r\nHost: x\r\n\r\nbody";
        for split in 0..head.len() {
            let mut h = HeadEnd::default();
            let (a, b) = head.split_at(split);
            let found = h.feed(a) || h.feed(b);
            assert!(found, "split at {split}");
        }
        let mut h = HeadEnd::default();
        assert!(!h.feed(b"GET / HTTP/1.1\r\nHost: x\r\n"));
        assert!(!h.feed(b"\r\r\n"));
        let mut h = HeadEnd::default();
        assert!(!h.feed(b"\n\n\r\n\n"));
        assert!(h.feed(b"\r\n\r\n"));
    }

    async fn pair(timeout: Duration) -> (TcpStream, HeadTimeoutStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut l = HeadTimeoutListener::new(l, Some(timeout));
        let addr = axum::serve::Listener::local_addr(&l).unwrap();
        let client = tokio::spawn(async move { TcpStream::connect(addr).await.unwrap() });
        let (server, _) = axum::serve::Listener::accept(&mut l).await;
        (client.await.unwrap(), server)
    }

    #[tokio::test]
    async fn a_late_head_times_out_and_a_complete_one_lifts_the_deadline() {
        let (mut client, mut server) = pair(Duration::from_millis(200)).await;
        client.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        let mut buf = [0u8; 64];
        let n = server.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"GET / HTTP/1.1\r\n");
        let e = server.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);

        let (mut client, mut server) = pair(Duration::from_millis(200)).await;
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let _ = server.read(&mut buf).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        client.write_all(b"later").await.unwrap();
        let n = server.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"later");
    }
}
