//! The whole client path (connect, ApiVersions, metadata, a request) against a loopback TCP stub that
//! answers one request wrongly on purpose: with a correlation id nobody sent, or by closing the socket
//! halfway through the response. The stub is a fake peer for the connection state machine; it claims
//! nothing about how a broker behaves (the protocol-tests crate does that against real brokers).
//!
//! # References
//! - Kafka protocol guide, "Common Request and Response Structure" (correlation ids, size prefix)

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use kafka_protocol::messages::{MetadataRequest, MetadataResponse, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion};

use super::testing::{api_versions, loopback, one_node_metadata, Peer};
use super::{Client, ClientConfig, ConnectionFailure, NetError, Target};

/// How the stub spoils the one Metadata request it was told to spoil.
#[derive(Clone, Copy, Debug)]
enum Spoil {
    /// Answer with the request's correlation id plus 1000, then keep the socket open.
    WrongCorrelationId,
    /// Send the size prefix and half of the answer, then close the socket.
    CloseMidResponse,
}

struct Stub {
    addr: SocketAddr,
    /// Connections accepted so far.
    accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Stub {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves ApiVersions and Metadata (one broker, node 1, at the stub's own address) on every
/// connection, and spoils the Metadata request numbered `spoil_at` (counted over all connections).
async fn stub(spoil_at: usize, spoil: Spoil) -> Stub {
    let accepted = Arc::new(AtomicUsize::new(0));
    let metadata_seen = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    let (addr, task) = loopback(move |peer, addr| {
        counter.fetch_add(1, Ordering::SeqCst);
        serve(peer, addr, metadata_seen.clone(), spoil_at, spoil)
    })
    .await;
    Stub {
        addr,
        accepted,
        task,
    }
}

async fn serve(
    mut peer: Peer,
    addr: SocketAddr,
    metadata_seen: Arc<AtomicUsize>,
    spoil_at: usize,
    spoil: Spoil,
) {
    while let Some(request) = peer.next_request().await {
        let id = request.header.correlation_id;
        let version = request.header.request_api_version;
        match request.header.request_api_key {
            18 => {
                let answer = api_versions(&[(18, 0, 3), (3, 0, 12)]);
                peer.respond(id, &answer, version.min(3)).await;
            }
            3 => {
                let answer = one_node_metadata(addr, &[]);
                if metadata_seen.fetch_add(1, Ordering::SeqCst) != spoil_at {
                    peer.respond(id, &answer, version).await;
                    continue;
                }
                match spoil {
                    Spoil::WrongCorrelationId => peer.respond(id + 1000, &answer, version).await,
                    Spoil::CloseMidResponse => {
                        let mut frame = BytesMut::new();
                        ResponseHeader::default()
                            .with_correlation_id(id)
                            .encode(&mut frame, MetadataResponse::header_version(version))
                            .unwrap();
                        answer.encode(&mut frame, version).unwrap();
                        let len = frame.len() as i32;
                        let mut raw = len.to_be_bytes().to_vec();
                        raw.extend_from_slice(&frame[..frame.len() / 2]);
                        peer.send_raw(&raw).await;
                        return;
                    }
                }
            }
            other => panic!("the stub serves ApiVersions and Metadata only, got api key {other}"),
        }
    }
}

fn config(addr: SocketAddr) -> ClientConfig {
    ClientConfig {
        bootstrap: vec![addr.to_string()],
        // Far longer than the test waits: the failure must come from the bytes, not from a timeout.
        request_timeout: Duration::from_secs(60),
        retry_backoff: Duration::from_millis(10),
        ..ClientConfig::default()
    }
}

/// Runs one spoiled exchange and returns its connection error (`send_once` wraps it as the single
/// exhausted attempt), after checking the client neither hung nor kept
/// the spoiled connection: the next request succeeds over a new connection.
async fn spoiled_then_recovered(spoil: Spoil) -> NetError {
    // Metadata request 0 is the one `Client::connect` makes; request 1 is the test's.
    let stub = stub(1, spoil).await;
    let client = Client::connect(config(stub.addr)).await.unwrap();
    let metadata = |_| MetadataRequest::default().with_topics(Some(vec![]));
    let err = tokio::time::timeout(
        Duration::from_secs(10),
        client.send_once(Target::Any, metadata),
    )
    .await
    .expect("a spoiled answer fails the request promptly; it does not wait for the timeout")
    .unwrap_err();
    let err = match err {
        NetError::RetriesExhausted {
            attempts: 1, last, ..
        } => *last,
        other => panic!("one attempt, then its error: {other:?}"),
    };
    let before = stub.accepted.load(Ordering::SeqCst);
    let (answer, _) = tokio::time::timeout(
        Duration::from_secs(10),
        client.send_once(Target::Any, metadata),
    )
    .await
    .expect("the next request is not stuck behind the dead connection")
    .expect("the next request goes over a fresh connection and succeeds");
    assert_eq!(answer.brokers.len(), 1);
    assert!(
        stub.accepted.load(Ordering::SeqCst) > before,
        "the spoiled connection was reset and a new one opened"
    );
    err
}

/// A response carrying a correlation id the client never sent is a typed connection failure; the
/// connection is dropped rather than trusted for the next answer.
#[tokio::test]
async fn tcp_peer_with_wrong_correlation_id_fails_typed_and_resets() {
    let err = spoiled_then_recovered(Spoil::WrongCorrelationId).await;
    assert!(
        matches!(
            &err,
            NetError::Connection {
                failure: ConnectionFailure::UnexpectedCorrelationId(_),
                ..
            }
        ),
        "{err:?}"
    );
}

/// A peer that closes halfway through a response fails the waiting request with a typed error.
#[tokio::test]
async fn tcp_peer_closing_mid_response_fails_typed_and_resets() {
    let err = spoiled_then_recovered(Spoil::CloseMidResponse).await;
    assert!(
        matches!(
            &err,
            NetError::Connection {
                failure: ConnectionFailure::ClosedMidFrame,
                outcome_unknown: true,
                ..
            }
        ),
        "{err:?}"
    );
}

/// A refused connection's error says each fact once: the address, then why (it used to read "cannot
/// connect to A: cannot connect to A: A: Connection refused").
#[tokio::test]
async fn a_refused_bootstrap_names_its_address_once() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    }; // closed again: connecting is refused
    let one = format!("127.0.0.1:{port}");
    let err = Client::connect(ClientConfig::new(&one)).await.unwrap_err();
    let text = err.to_string();
    assert_eq!(text.matches(&one).count(), 1, "{text}");
    assert!(
        text.starts_with(&format!("cannot connect to {one}: ")),
        "{text}"
    );

    // With two addresses, each reason names its own address, once.
    let two = ClientConfig {
        bootstrap: vec![one.clone(), "localhost:1".into()],
        ..ClientConfig::new(&one)
    };
    let text = Client::connect(two).await.unwrap_err().to_string();
    assert_eq!(text.matches(&one).count(), 2, "list and its reason: {text}");
    assert_eq!(text.matches("localhost:1").count(), 2, "{text}");
}

/// Dials the stub wherever the client meant to go, counting the dials, optionally through a
/// non-TCP stream wrapper so the boxed-stream path is the one exercised.
#[derive(Debug)]
struct ToStub {
    stub: SocketAddr,
    asked: std::sync::Mutex<Vec<String>>,
    boxed: bool,
}

impl super::Dialer for ToStub {
    fn dial<'a>(&'a self, addr: &'a str, tcp: &'a super::TcpDialer) -> super::DialFuture<'a> {
        self.asked.lock().unwrap().push(addr.to_owned());
        Box::pin(async move {
            let to = self.stub.to_string();
            if !self.boxed {
                return tcp.connect(&to).await;
            }
            let direct = tokio::net::TcpStream::connect(self.stub).await?;
            Ok(super::DialedStream::new(tokio::io::BufStream::new(direct)))
        })
    }
}

/// Every connection goes through the configured dialer, which is given the address the client
/// meant (here one that does not even resolve), plain and boxed streams alike.
#[tokio::test]
async fn a_custom_dialer_opens_every_connection() {
    for boxed in [false, true] {
        let stub = stub(usize::MAX, Spoil::WrongCorrelationId).await;
        let dialer = Arc::new(ToStub {
            stub: stub.addr,
            asked: Default::default(),
            boxed,
        });
        let config = ClientConfig {
            bootstrap: vec!["broker.invalid:9092".into()],
            dialer: Some(dialer.clone()),
            ..config(stub.addr)
        };
        let client = Client::connect(config).await.unwrap();
        let metadata = |_| MetadataRequest::default().with_topics(Some(vec![]));
        // Node 1, as the stub's metadata names it, is reached through the dialer too.
        client.send_once(Target::Broker(1), metadata).await.unwrap();
        let asked = dialer.asked.lock().unwrap().clone();
        assert_eq!(
            asked.first().map(String::as_str),
            Some("broker.invalid:9092")
        );
        assert!(asked.contains(&stub.addr.to_string()), "{asked:?}");
        assert_eq!(stub.accepted.load(Ordering::SeqCst), asked.len());
    }
}

#[derive(Debug)]
struct Refusing;

impl super::Dialer for Refusing {
    fn dial<'a>(&'a self, _: &'a str, _: &'a super::TcpDialer) -> super::DialFuture<'a> {
        Box::pin(async { Err(std::io::Error::other("the tunnel is down")) })
    }
}

#[derive(Debug)]
struct Never;

impl super::Dialer for Never {
    fn dial<'a>(&'a self, _: &'a str, _: &'a super::TcpDialer) -> super::DialFuture<'a> {
        Box::pin(std::future::pending())
    }
}

/// A dialer's failure is the net layer's connect error for the address, named once, with the
/// dialer's own words as the reason.
#[tokio::test]
async fn a_dialer_error_is_a_connect_error_naming_the_address_once() {
    let addr = "broker-7.example:9092";
    let err = Client::connect(ClientConfig::new(addr).with_dialer(Refusing))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(err.is_transport(), "{err:?}");
    assert_eq!(text.matches(addr).count(), 1, "{text}");
    assert!(text.contains("the tunnel is down"), "{text}");
}

/// A dial that never finishes is cut by the connect timeout (paused time: the runtime jumps to the
/// deadline once nothing else can run), and reported as a connect error, not a hang.
#[tokio::test(start_paused = true)]
async fn a_dial_that_never_finishes_times_out_as_a_connect_error() {
    let config = ClientConfig {
        connect_timeout: Duration::from_secs(3),
        ..ClientConfig::new("127.0.0.1:9").with_dialer(Never)
    };
    let err = Client::connect(config).await.unwrap_err();
    let text = err.to_string();
    assert_eq!(text.matches("127.0.0.1:9").count(), 1, "{text}");
    assert!(text.contains("timed out after 3s"), "{text}");
}

/// With several connections per broker, every request of a partition goes on its
/// [`connection_of_partition`](super::connection_of_partition) connection and every request of a coordinator key
/// on its [`connection_of_key`](super::connection_of_key) one, the same connection each time; a request to a
/// broker by id goes on the first connection unless it names a lane. The stub tags each answer with
/// the connection (accept order) it came in on, and each Metadata request carries the test's label as
/// its one topic name.
#[tokio::test]
async fn requests_keep_to_their_lane_of_the_broker() {
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use kafka_protocol::messages::TopicName;
    use kafka_protocol::protocol::StrBytes;
    use std::sync::Mutex;

    type Seen = Arc<Mutex<Vec<(String, usize)>>>;
    let seen: Seen = Arc::default();
    let accepted = Arc::new(AtomicUsize::new(0));
    let (record, counter) = (seen.clone(), accepted.clone());
    let (addr, task) = loopback(move |mut peer: Peer, addr| {
        let conn = counter.fetch_add(1, Ordering::SeqCst);
        let record = record.clone();
        async move {
            while let Some(request) = peer.next_request().await {
                let id = request.header.correlation_id;
                let version = request.header.request_api_version;
                match request.header.request_api_key {
                    18 => {
                        let answer = api_versions(&[(18, 0, 3), (3, 0, 12), (10, 0, 4)]);
                        peer.respond(id, &answer, version.min(3)).await;
                    }
                    10 => {
                        let mut body = request.body.clone();
                        let asked = kafka_protocol::messages::FindCoordinatorRequest::decode(
                            &mut body, version,
                        )
                        .unwrap();
                        let key = asked
                            .coordinator_keys
                            .first()
                            .map_or_else(|| asked.key.to_string(), |k| k.to_string());
                        let answer = super::testing::coordinator_is_self(addr, &key, version);
                        peer.respond(id, &answer, version).await;
                    }
                    3 => {
                        let mut body = request.body.clone();
                        let asked = MetadataRequest::decode(&mut body, version);
                        let label = asked
                            .ok()
                            .and_then(|m| m.topics)
                            .and_then(|t| t.first().and_then(|t| t.name.clone()))
                            .map(|n| n.0.to_string());
                        if let Some(label) = label.filter(|l| l.starts_with("label-")) {
                            record.lock().unwrap().push((label, conn));
                        }
                        peer.respond(id, &one_node_metadata(addr, &[("t", 6)]), version)
                            .await;
                    }
                    other => panic!("unexpected api key {other}"),
                }
            }
        }
    })
    .await;
    let _stop = AbortOnDrop(task);
    let lanes = 3;
    let client = Client::connect(ClientConfig {
        connections_per_broker: lanes,
        ..config(addr)
    })
    .await
    .unwrap();
    client.metadata(&["t"]).await.unwrap();
    let labelled = |label: String| {
        move |_| {
            MetadataRequest::default().with_topics(Some(vec![MetadataRequestTopic::default()
                .with_name(Some(TopicName(StrBytes::from_string(label.clone()))))]))
        }
    };
    for round in 0..2 {
        for p in 0..6 {
            client
                .send(Target::leader("t", p), labelled(format!("label-p{p}")))
                .await
                .unwrap();
        }
        for key in ["g", "h", "i"] {
            client
                .send(
                    Target::group(key.to_string()),
                    labelled(format!("label-k{key}")),
                )
                .await
                .unwrap();
        }
        client
            .send(Target::Broker(1), labelled("label-broker".into()))
            .await
            .unwrap();
        let named = super::CallOptions {
            connection: Some(lanes + 2),
            ..super::CallOptions::default()
        };
        client
            .call(
                Target::Broker(1),
                &named,
                labelled("label-lane2".into()),
                |r, _| super::Verdict::Done(r),
            )
            .await
            .unwrap();
        assert_eq!(seen.lock().unwrap().len(), 11 * (round + 1));
    }
    let seen = seen.lock().unwrap().clone();
    // Lane of each label, through the connection it came in on; the first connection is lane 0
    // (it is the bootstrap one, filed under node 1's first lane).
    let mut conn_of: std::collections::HashMap<String, usize> = Default::default();
    for (label, conn) in &seen {
        let first = *conn_of.entry(label.clone()).or_insert(*conn);
        assert_eq!(first, *conn, "{label} changed connection: {seen:?}");
    }
    let lane_conn = |label: &str| conn_of[label];
    let conns: std::collections::HashSet<usize> = conn_of.values().copied().collect();
    assert_eq!(conns.len(), lanes, "every lane used, none more: {seen:?}");
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        lanes,
        "one connection per lane"
    );
    for p in 0..6 {
        for q in 0..6 {
            let same_lane = super::connection_of_partition("t", p, lanes)
                == super::connection_of_partition("t", q, lanes);
            let same_conn = lane_conn(&format!("label-p{p}")) == lane_conn(&format!("label-p{q}"));
            assert_eq!(same_lane, same_conn, "partitions {p} and {q}: {seen:?}");
        }
    }
    for key in ["g", "h", "i"] {
        let p = (0..6)
            .find(|p| {
                super::connection_of_partition("t", *p, lanes)
                    == super::connection_of_key(key, lanes)
            })
            .unwrap();
        assert_eq!(
            lane_conn(&format!("label-k{key}")),
            lane_conn(&format!("label-p{p}")),
            "{key}"
        );
    }
    let lane0 = (0..6)
        .find(|p| super::connection_of_partition("t", *p, lanes) == 0)
        .unwrap();
    let lane2 = (0..6)
        .find(|p| super::connection_of_partition("t", *p, lanes) == 2)
        .unwrap();
    assert_eq!(
        lane_conn("label-broker"),
        lane_conn(&format!("label-p{lane0}"))
    );
    assert_eq!(
        lane_conn("label-lane2"),
        lane_conn(&format!("label-p{lane2}"))
    );
}

/// Aborts a stub's accept loop when the test ends, however it ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Consecutive partitions of a topic fall on consecutive lanes (so a topic spreads evenly), a key's
/// lane is fixed, and one lane is always lane 0.
#[test]
fn lanes_spread_partitions_evenly_and_fix_keys() {
    for lanes in [2, 3, 4] {
        let mut count = vec![0; lanes];
        for p in 0..(4 * lanes as i32) {
            let lane = super::connection_of_partition("events", p, lanes);
            assert_eq!(
                lane,
                (super::connection_of_partition("events", 0, lanes) + p as usize) % lanes
            );
            count[lane] += 1;
        }
        assert!(count.iter().all(|c| *c == 4), "{count:?}");
        assert_eq!(
            super::connection_of_key("g", lanes),
            super::connection_of_key("g", lanes)
        );
    }
    assert_eq!(super::connection_of_partition("events", 7, 1), 0);
    assert_eq!(super::connection_of_key("snapfence-7", 1), 0);
    let spread: std::collections::HashSet<usize> = (0..64)
        .map(|p| super::connection_of_key(&format!("tx-{p}"), 4))
        .collect();
    assert_eq!(spread.len(), 4, "64 transactional ids reach every lane");
}
