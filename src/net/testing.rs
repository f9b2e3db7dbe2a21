//! A scripted peer for broker-free tests of the connection machinery: it reads request frames off an
//! in-memory pipe (or a loopback TCP socket), decodes them with kafka-protocol's broker-side decoders, and writes whatever answer
//! the test scripts. It stands in for a socket, never for broker behaviour.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{decode_request_header_from_buffer, Encodable, HeaderVersion};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::conn::{ConnOptions, Connection};

pub(crate) fn options() -> ConnOptions {
    ConnOptions {
        addr: "peer".into(),
        client_id: Arc::from("test-client"),
        max_frame_size: 1 << 20,
        max_in_flight: 8,
        sweep_interval: Duration::from_millis(20),
    }
}

/// A connection whose other end is a [`Peer`], joined by a pipe with `buffer` bytes of capacity in each
/// direction.
pub(crate) fn pair(buffer: usize, opts: ConnOptions) -> (Connection, Peer) {
    let (ours, theirs) = tokio::io::duplex(buffer);
    let (read, write) = tokio::io::split(ours);
    let conn = Connection::spawn(read, write, opts);
    let (read, write) = tokio::io::split(theirs);
    (conn, Peer::new(Box::new(read), Box::new(write)))
}

/// One request as the peer received it.
pub(crate) struct Received {
    pub header: RequestHeader,
    /// The body, after the header.
    pub body: Bytes,
}

pub(crate) struct Peer {
    read: Box<dyn AsyncRead + Send + Unpin>,
    write: Option<Box<dyn AsyncWrite + Send + Unpin>>,
    buf: BytesMut,
}

impl Peer {
    fn new(
        read: Box<dyn AsyncRead + Send + Unpin>,
        write: Box<dyn AsyncWrite + Send + Unpin>,
    ) -> Peer {
        Peer {
            read,
            write: Some(write),
            buf: BytesMut::new(),
        }
    }

    /// The peer end of an accepted loopback connection.
    pub(crate) fn over_tcp(stream: TcpStream) -> Peer {
        let (read, write) = stream.into_split();
        Peer::new(Box::new(read), Box::new(write))
    }

    /// The next whole request frame, or `None` once the client closed its side. A frame that ends
    /// before its announced length is a test failure: the client must never do that.
    pub(crate) async fn next_frame(&mut self) -> Option<Bytes> {
        loop {
            if self.buf.len() >= 4 {
                let len = i32::from_be_bytes(self.buf[..4].try_into().unwrap()) as usize;
                if self.buf.len() >= 4 + len {
                    self.buf.advance(4);
                    return Some(self.buf.split_to(len).freeze());
                }
            }
            let n = self.read.read_buf(&mut self.buf).await.unwrap_or(0);
            if n == 0 {
                assert!(
                    self.buf.is_empty(),
                    "client left {} bytes of an unfinished frame on the wire",
                    self.buf.len()
                );
                return None;
            }
        }
    }

    /// The next request, header decoded.
    pub(crate) async fn next_request(&mut self) -> Option<Received> {
        let mut frame = self.next_frame().await?;
        let header = decode_request_header_from_buffer(&mut frame).expect("request header");
        Some(Received {
            header,
            body: frame,
        })
    }

    /// Answers `correlation_id` with `body` encoded at `version`, header version chosen by the message.
    pub(crate) async fn respond<M: Encodable + HeaderVersion>(
        &mut self,
        correlation_id: i32,
        body: &M,
        version: i16,
    ) {
        let mut frame = BytesMut::new();
        ResponseHeader::default()
            .with_correlation_id(correlation_id)
            .encode(&mut frame, M::header_version(version))
            .unwrap();
        body.encode(&mut frame, version).unwrap();
        self.send_frame(&frame).await;
    }

    /// Writes `payload` behind a correct size prefix.
    pub(crate) async fn send_frame(&mut self, payload: &[u8]) {
        let mut out = BytesMut::with_capacity(4 + payload.len());
        out.put_i32(payload.len() as i32);
        out.put_slice(payload);
        self.send_raw(&out).await;
    }

    /// Writes bytes exactly as given.
    pub(crate) async fn send_raw(&mut self, bytes: &[u8]) {
        let w = self.write.as_mut().expect("peer write side open");
        w.write_all(bytes).await.unwrap();
        w.flush().await.unwrap();
    }

    /// Closes the peer's sending side (the client sees end of stream).
    pub(crate) async fn close_write(&mut self) {
        if let Some(mut w) = self.write.take() {
            let _ = w.shutdown().await;
        }
    }
}

// ---- a one-node loopback stub, for logic tests that need a client to get past its handshake ----------
//
// Each test keeps its own `serve` loop (what it answers, and how it misbehaves, is the test); these
// build the answers every such stub gives the same way, and the accept loop they all share.

/// Accepts loopback connections and runs `serve(peer, its own address)` for each, until the returned
/// task is aborted.
pub(crate) async fn loopback<F, Fut>(
    serve: F,
) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>)
where
    F: Fn(Peer, std::net::SocketAddr) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut connections = tokio::task::JoinSet::new();
        loop {
            let (socket, _) = listener.accept().await.unwrap();
            connections.spawn(serve(Peer::over_tcp(socket), addr));
        }
    });
    (addr, task)
}

/// A [`Dialer`](super::Dialer) whose every dial is an in-memory pipe with `serve(peer, addr)` on the
/// other end: the stub of [`loopback`] without a socket. Under paused time that matters: a socket's
/// readiness is something the runtime polls, and a runtime that finds nothing ready jumps its clock to
/// the next timer (a request timeout, say) even while the stub is about to answer; a pipe wakes the
/// reader as a task, so the clock moves only when everything really waits on a timer.
pub(crate) struct InMemory {
    addr: std::net::SocketAddr,
    serve: Arc<dyn Fn(Peer, std::net::SocketAddr) -> StubFuture + Send + Sync>,
}

type StubFuture = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

impl InMemory {
    /// Every dial runs `serve`, which is told `addr` as its own address (what it advertises in
    /// metadata; the client dials it through this dialer again).
    pub(crate) fn new<F, Fut>(addr: std::net::SocketAddr, serve: F) -> InMemory
    where
        F: Fn(Peer, std::net::SocketAddr) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        InMemory {
            addr,
            serve: Arc::new(move |peer, addr| Box::pin(serve(peer, addr))),
        }
    }
}

impl std::fmt::Debug for InMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InMemory")
            .field("addr", &self.addr)
            .finish()
    }
}

impl super::Dialer for InMemory {
    fn dial<'a>(&'a self, _: &'a str, _: &'a super::TcpDialer) -> super::DialFuture<'a> {
        Box::pin(async move {
            let (ours, theirs) = tokio::io::duplex(1 << 16);
            let (read, write) = tokio::io::split(theirs);
            tokio::spawn((self.serve)(
                Peer::new(Box::new(read), Box::new(write)),
                self.addr,
            ));
            Ok(super::DialedStream::new(ours))
        })
    }
}

/// What a stub broker that serves a transactional producer advertises, as `(api key, min, max)`:
/// Produce, Metadata, FindCoordinator, ApiVersions, InitProducerId, AddPartitionsToTxn,
/// AddOffsetsToTxn, EndTxn and TxnOffsetCommit.
pub(crate) const TRANSACTIONAL_BROKER_APIS: &[(i16, i16, i16)] = &[
    (0, 3, 11),
    (3, 1, 12),
    (10, 0, 4),
    (18, 0, 3),
    (22, 0, 4),
    (24, 0, 3),
    (25, 0, 3),
    (26, 0, 3),
    (28, 0, 3),
];

/// ApiVersions advertising `(api key, min, max)` for each of `keys`.
pub(crate) fn api_versions(
    keys: &[(i16, i16, i16)],
) -> kafka_protocol::messages::ApiVersionsResponse {
    use kafka_protocol::messages::api_versions_response::ApiVersion;
    kafka_protocol::messages::ApiVersionsResponse::default().with_api_keys(
        keys.iter()
            .map(|&(k, min, max)| {
                ApiVersion::default()
                    .with_api_key(k)
                    .with_min_version(min)
                    .with_max_version(max)
            })
            .collect(),
    )
}

/// Metadata of a one-node cluster: node 1 at `addr`, the controller, leading (and the only replica of)
/// every partition of `topics` (name, partition count).
pub(crate) fn one_node_metadata(
    addr: std::net::SocketAddr,
    topics: &[(&str, i32)],
) -> kafka_protocol::messages::MetadataResponse {
    use kafka_protocol::messages::metadata_response::{
        MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
    };
    use kafka_protocol::messages::{BrokerId, MetadataResponse, TopicName};
    use kafka_protocol::protocol::StrBytes;
    let topics = topics
        .iter()
        .map(|&(name, partitions)| {
            MetadataResponseTopic::default()
                .with_name(Some(TopicName(StrBytes::from_string(name.to_owned()))))
                .with_partitions(
                    (0..partitions)
                        .map(|p| {
                            MetadataResponsePartition::default()
                                .with_partition_index(p)
                                .with_leader_id(BrokerId(1))
                                .with_replica_nodes(vec![BrokerId(1)])
                                .with_isr_nodes(vec![BrokerId(1)])
                        })
                        .collect(),
                )
        })
        .collect();
    MetadataResponse::default()
        .with_brokers(vec![MetadataResponseBroker::default()
            .with_node_id(BrokerId(1))
            .with_host("127.0.0.1".into())
            .with_port(i32::from(addr.port()))])
        .with_controller_id(BrokerId(1))
        .with_topics(topics)
}

/// FindCoordinator naming node 1 at `addr` as the coordinator of `key`, in the shape of `version` (a
/// list of coordinators from v4 on).
pub(crate) fn coordinator_is_self(
    addr: std::net::SocketAddr,
    key: &str,
    version: i16,
) -> kafka_protocol::messages::FindCoordinatorResponse {
    use kafka_protocol::messages::find_coordinator_response::Coordinator;
    use kafka_protocol::messages::{BrokerId, FindCoordinatorResponse};
    let port = i32::from(addr.port());
    if version >= 4 {
        FindCoordinatorResponse::default().with_coordinators(vec![Coordinator::default()
            .with_key(key.to_owned().into())
            .with_node_id(BrokerId(1))
            .with_host("127.0.0.1".into())
            .with_port(port)])
    } else {
        FindCoordinatorResponse::default()
            .with_node_id(BrokerId(1))
            .with_host("127.0.0.1".into())
            .with_port(port)
    }
}
