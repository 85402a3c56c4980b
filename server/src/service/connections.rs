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
use tokio_rustls::TlsAcceptor;

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

/// A gRPC connection whose preface arrived in time (after its TLS handshake, on a TLS port):
/// counted against the limit until dropped, and read from the preface on.
pub(crate) struct Admitted {
    stream: Io,
    /// The preface, read to time it; handed to tonic first.
    preface: [u8; PREFACE_LEN],
    replayed: usize,
    _open: OwnedSemaphorePermit,
}

impl Admitted {
    /// Completes `stream`'s TLS handshake with `tls` (when the port has TLS) and reads its
    /// preface, both within `within`.
    pub(crate) async fn preface(
        stream: TcpStream,
        open: OwnedSemaphorePermit,
        within: Duration,
        tls: Option<&TlsAcceptor>,
    ) -> Result<Admitted, Unadmitted> {
        let mut preface = [0; PREFACE_LEN];
        let arrived = tokio::time::timeout(within, async {
            let mut stream = match tls {
                None => Io::Plain(stream),
                Some(acceptor) => match acceptor.accept(stream).await {
                    Ok(stream) => Io::Tls(Box::new(stream)),
                    Err(error) => return Err(Unadmitted::Handshake(error)),
                },
            };
            match stream.read_exact(&mut preface).await {
                Ok(_) => Ok(stream),
                Err(error) => Err(Unadmitted::Gone(error)),
            }
        })
        .await;
        match arrived {
            Ok(Ok(stream)) => Ok(Admitted {
                stream,
                preface,
                replayed: 0,
                _open: open,
            }),
            Ok(Err(unadmitted)) => {
                tracing::debug!(%unadmitted, "connection closed before its HTTP/2 preface");
                Err(unadmitted)
            }
            Err(_) => {
                tracing::debug!(?within, "no HTTP/2 preface in time: connection closed");
                Err(Unadmitted::TimedOut)
            }
        }
    }
}

/// Why a connection was not handed to the gRPC server.
#[derive(Debug)]
pub(crate) enum Unadmitted {
    /// Its preface did not come whole in time: closed.
    TimedOut,
    /// The TLS handshake failed (no client certificate where one is required, an untrusted one,
    /// not TLS at all).
    Handshake(io::Error),
    /// The client went away first.
    Gone(io::Error),
}

impl std::fmt::Display for Unadmitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unadmitted::TimedOut => f.write_str("no HTTP/2 preface in time"),
            Unadmitted::Handshake(error) => write!(f, "TLS handshake failed: {error}"),
            Unadmitted::Gone(error) => write!(f, "closed by the client: {error}"),
        }
    }
}

/// A connection's bytes: plain, or through TLS.
enum Io {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl Io {
    fn tcp(&self) -> &TcpStream {
        match self {
            Io::Plain(stream) => stream,
            Io::Tls(stream) => stream.get_ref().0,
        }
    }
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(stream) => Pin::new(stream).poll_read(cx, buf),
            Io::Tls(stream) => Pin::new(stream).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(stream) => Pin::new(stream).poll_write(cx, buf),
            Io::Tls(stream) => Pin::new(stream).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(stream) => Pin::new(stream).poll_flush(cx),
            Io::Tls(stream) => Pin::new(stream).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(stream) => Pin::new(stream).poll_shutdown(cx),
            Io::Tls(stream) => Pin::new(stream).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            Io::Tls(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Io::Plain(stream) => stream.is_write_vectored(),
            Io::Tls(stream) => stream.is_write_vectored(),
        }
    }
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
        self.stream.tcp().connect_info()
    }
}
