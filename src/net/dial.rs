//! How a connection's byte stream is opened: the [`Dialer`] that [`ClientConfig::dialer`] names, and the
//! default one, a TCP connect with the socket options of [`ClientConfig`].
//!
//! A dialer only produces a byte stream to a broker. Everything after it stays with the net layer: the
//! TLS handshake (run over the dialed stream, checking the certificate against the broker's *advertised*
//! address, not where the stream really goes), ApiVersions, the SASL login, and the connect deadline,
//! which covers the dial too. So a dialer that sends every broker through an SSH tunnel or a proxy keeps
//! TLS, SASL and the timeouts exactly as they are for a direct connection.
//!
//! # References
//! - franz-go `kgo.Dialer`, librdkafka `connect_cb` / `socket_cb`: the same hook in other clients

use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use socket2::{SockRef, TcpKeepalive};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpSocket, TcpStream};

use super::ClientConfig;

/// The future a [`Dialer`] returns.
pub type DialFuture<'a> = Pin<Box<dyn Future<Output = io::Result<DialedStream>> + Send + 'a>>;

/// Opens the byte stream of a new broker connection; set one with [`ClientConfig::with_dialer`].
///
/// `dial` is given the broker's address as the cluster metadata (or the bootstrap list) names it, and
/// the [`TcpDialer`] the client would use by default, so a dialer can rewrite the address and still
/// connect with the configured socket options. An error is reported as
/// [`NetError::Connect`](super::NetError::Connect) for `addr` (so the error's message need not repeat
/// the address), and a dial that outlasts [`ClientConfig::connect_timeout`] is dropped and reported the
/// same way. The future may be dropped at any point before it completes.
///
/// Sending every broker through local tunnels (`ssh -L 19092:broker-1:9092 …`), one port per broker:
///
/// ```
/// use std::collections::HashMap;
/// use snapfence::net::{ClientConfig, DialFuture, Dialer, TcpDialer};
///
/// #[derive(Debug)]
/// struct Tunnels(HashMap<String, String>);
///
/// impl Dialer for Tunnels {
///     fn dial<'a>(&'a self, addr: &'a str, tcp: &'a TcpDialer) -> DialFuture<'a> {
///         // An address without a tunnel is dialled as it is.
///         let to = self.0.get(addr).map_or(addr, String::as_str);
///         tcp.connect(to)
///     }
/// }
///
/// let tunnels = Tunnels(HashMap::from([
///     ("broker-1:9092".to_owned(), "127.0.0.1:19092".to_owned()),
///     ("broker-2:9092".to_owned(), "127.0.0.1:19093".to_owned()),
/// ]));
/// let config = ClientConfig::new("broker-1:9092").with_dialer(tunnels);
/// assert!(format!("{config:?}").contains("Tunnels"));
/// ```
pub trait Dialer: Send + Sync + fmt::Debug + 'static {
    /// Opens a stream to the broker at `addr` ("host:port"); `tcp` is the default dialer.
    fn dial<'a>(&'a self, addr: &'a str, tcp: &'a TcpDialer) -> DialFuture<'a>;
}

/// A byte stream a [`Dialer`] opened: a TCP socket, or any other stream (an in-process tunnel, a
/// SOCKS connection already through its handshake).
pub struct DialedStream(Stream);

/// What the net layer needs of a stream that is not a plain socket.
pub(crate) trait AnyStream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> AnyStream for T {}

pub(crate) enum Stream {
    /// Kept apart so the plaintext path splits it without a lock between the reader and the writer.
    Tcp(TcpStream),
    Other(Box<dyn AnyStream>),
}

impl DialedStream {
    /// Any stream that reads and writes bytes; `TcpStream` converts with `From` instead.
    pub fn new<S>(stream: S) -> DialedStream
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        DialedStream(Stream::Other(Box::new(stream)))
    }

    pub(crate) fn into_inner(self) -> Stream {
        self.0
    }
}

impl From<TcpStream> for DialedStream {
    fn from(stream: TcpStream) -> DialedStream {
        DialedStream(Stream::Tcp(stream))
    }
}

impl fmt::Debug for DialedStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Stream::Tcp(s) => f.debug_tuple("DialedStream").field(s).finish(),
            Stream::Other(_) => f.write_str("DialedStream(<stream>)"),
        }
    }
}

/// The default dialer: resolves the address and connects over TCP with the socket options of the
/// [`ClientConfig`] (buffer sizes, keepalive, and `TCP_NODELAY` always), trying each resolved address
/// in turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpDialer {
    send_buffer: Option<usize>,
    receive_buffer: Option<usize>,
    keepalive: Option<Duration>,
}

impl TcpDialer {
    /// The TCP dialer with `config`'s socket options.
    pub fn from_config(config: &ClientConfig) -> TcpDialer {
        TcpDialer {
            send_buffer: config.socket_send_buffer,
            receive_buffer: config.socket_receive_buffer,
            keepalive: config.tcp_keepalive,
        }
    }

    /// Connects to `addr` as the client does by default.
    pub fn connect<'a>(&'a self, addr: &'a str) -> DialFuture<'a> {
        Box::pin(self.connect_any(addr))
    }

    async fn connect_any(&self, addr: &str) -> io::Result<DialedStream> {
        let resolved: Vec<SocketAddr> = tokio::net::lookup_host(addr)
            .await
            .map_err(|e| io::Error::new(e.kind(), format!("cannot resolve: {e}")))?
            .collect();
        let mut last = io::Error::new(io::ErrorKind::NotFound, "the name resolved to no address");
        for sa in resolved {
            match self.connect_one(sa).await {
                Ok(stream) => return Ok(stream.into()),
                // The resolved address is worth saying only when the caller named a host, not this address.
                Err(e) if sa.to_string() == addr => last = e,
                Err(e) => last = io::Error::new(e.kind(), format!("{sa}: {e}")),
            }
        }
        Err(last)
    }

    async fn connect_one(&self, sa: SocketAddr) -> io::Result<TcpStream> {
        let socket = if sa.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        {
            let s = SockRef::from(&socket);
            // Buffer sizes must be set before connecting: the TCP window scale is fixed in the handshake.
            if let Some(n) = self.send_buffer {
                s.set_send_buffer_size(n)?;
            }
            if let Some(n) = self.receive_buffer {
                s.set_recv_buffer_size(n)?;
            }
            if let Some(idle) = self.keepalive {
                let interval = (idle / 6).max(Duration::from_secs(1));
                s.set_tcp_keepalive(&TcpKeepalive::new().with_time(idle).with_interval(interval))?;
            }
            // Requests are written whole and answered one by one; Nagle would only add latency.
            s.set_tcp_nodelay(true)?;
        }
        socket.connect(sa).await
    }
}

impl Dialer for TcpDialer {
    fn dial<'a>(&'a self, addr: &'a str, _tcp: &'a TcpDialer) -> DialFuture<'a> {
        self.connect(addr)
    }
}
