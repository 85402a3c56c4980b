//! Who may hold a connection, and how long one may stay silent: at most
//! [`Limits::max_connections`] open on each port (one more is closed at once), and each must send
//! its first request head (HTTP/1) or its HTTP/2 preface (gRPC) whole within
//! [`Limits::header_read_timeout`]. A client that opens connections and trickles bytes, or sends
//! nothing, holds neither a task nor a socket past that.
//!
//! On the HTTP port hyper's own header timeout bounds every request head (the first and those of
//! a kept-alive connection); on the gRPC port the preface is read here before tonic sees the
//! connection, and replayed to it.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The bounds on each port's connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The most connections open at once on one port; one more is closed as soon as it is
    /// accepted. Default 10,000 (a fleet of Envoys keeps a few per worker thread).
    pub max_connections: usize,
    /// How long a connection has to send a whole request head (HTTP) or the HTTP/2 preface
    /// (gRPC) before it is closed. Default 10 s (Envoy sends its preface as it connects).
    pub header_read_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 10_000,
            header_read_timeout: Duration::from_secs(10),
        }
    }
}

/// The client's first bytes on an HTTP/2 connection (RFC 9113 §3.4).
const PREFACE_LEN: usize = 24;

/// The connections of one port, counted.
pub(crate) struct Gate {
    limits: Limits,
    open: Arc<Semaphore>,
}

impl Gate {
    pub(crate) fn new(limits: Limits) -> Gate {
        Gate {
            limits,
            open: Arc::new(Semaphore::new(limits.max_connections)),
        }
    }

    pub(crate) fn limits(&self) -> Limits {
        self.limits
    }

    /// The next connection under the limit: one over it is closed here (its client sees the
    /// connection end at once, not a hang), and `refused` is called. `None` when accepting
    /// fails for good.
    pub(crate) async fn accept(
        &self,
        listener: &TcpListener,
        refused: impl Fn(),
    ) -> Option<(TcpStream, OwnedSemaphorePermit)> {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                // Out of file descriptors, or a connection reset before it was accepted: the
                // listener itself is fine; a moment later it may accept again.
                Err(error) if is_transient(&error) => {
                    tracing::debug!(%error, "accept failed; trying again");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
                Err(error) => {
                    tracing::error!(%error, "cannot accept connections");
                    return None;
                }
            };
            match self.open.clone().try_acquire_owned() {
                Ok(permit) => {
                    // An answer's last small frame must not wait for the client's delayed
                    // acknowledgement (Nagle): 40 ms on a tail of calls.
                    let _ = stream.set_nodelay(true);
                    return Some((stream, permit));
                }
                Err(_) => {
                    refused();
                    drop(stream);
                }
            }
        }
    }
}

fn is_transient(error: &io::Error) -> bool {
    !matches!(
        error.kind(),
        io::ErrorKind::InvalidInput | io::ErrorKind::PermissionDenied | io::ErrorKind::Unsupported
    )
}

/// A gRPC connection whose preface arrived in time: counted against the limit until dropped,
/// and read from the preface on.
pub(crate) struct Admitted {
    stream: TcpStream,
    /// The preface, read to time it; handed to tonic first.
    preface: [u8; PREFACE_LEN],
    replayed: usize,
    _open: OwnedSemaphorePermit,
}

impl Admitted {
    /// Reads `stream`'s preface within `within`.
    pub(crate) async fn preface(
        mut stream: TcpStream,
        open: OwnedSemaphorePermit,
        within: Duration,
    ) -> Result<Admitted, Unadmitted> {
        let mut preface = [0; PREFACE_LEN];
        match tokio::time::timeout(within, stream.read_exact(&mut preface)).await {
            Ok(Ok(_)) => Ok(Admitted {
                stream,
                preface,
                replayed: 0,
                _open: open,
            }),
            Ok(Err(error)) => {
                tracing::debug!(%error, "connection closed before its HTTP/2 preface");
                Err(Unadmitted::Gone)
            }
            Err(_) => {
                tracing::debug!(?within, "no HTTP/2 preface in time: connection closed");
                Err(Unadmitted::TimedOut)
            }
        }
    }
}

/// Why a connection was not handed to the gRPC server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unadmitted {
    /// Its preface did not come whole in time: closed.
    TimedOut,
    /// The client went away first.
    Gone,
}

impl AsyncRead for Admitted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.replayed < PREFACE_LEN {
            let rest = &this.preface[this.replayed..];
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            this.replayed += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Admitted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

impl tonic::transport::server::Connected for Admitted {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}
