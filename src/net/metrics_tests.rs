//! The net layer's metrics move when they should: each test installs a recording recorder for its own
//! thread and drives a [`Client`] against a loopback stub peer. The stub answers ApiVersions, Metadata
//! and the SASL requests, and spoils what a test asks it to; it is a fake peer for the client's own
//! bookkeeping, and claims nothing about how a broker behaves.
//!
//! # References
//! - `docs/metrics.md` (the names and their label values)

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::{
    ApiVersionsResponse, MetadataRequest, SaslAuthenticateResponse, SaslHandshakeResponse,
};

use super::testing::{api_versions, loopback, one_node_metadata, Peer};
use super::{CallOptions, Client, ClientConfig, NetError, SaslConfig, SaslMechanism, Target};
use crate::net::Verdict;
use crate::telemetry::recording::Recording;
use crate::telemetry::{
    AUTHENTICATION_FAILURES, CONNECTIONS_OPENED, CONNECTIONS_POISONED, RECEIVED_BYTES, RECONNECTS,
    REQUESTS_IN_FLIGHT, REQUEST_DURATION, REQUEST_RETRIES, SENT_BYTES,
};
use crate::wire::ErrorCode;

/// What the stub does wrong.
#[derive(Clone, Copy)]
enum Misbehave {
    Nothing,
    /// Answers the Metadata request with this index (over all connections) under a correlation id
    /// nobody sent.
    WrongCorrelationIdAt(usize),
    /// Refuses every SASL login.
    RefuseLogin,
}

struct Stub {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Stub {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn stub(misbehave: Misbehave) -> Stub {
    // Metadata requests counted over every connection, so a misbehaviour can pick one.
    let metadata_seen = Arc::new(AtomicUsize::new(0));
    let (addr, task) =
        loopback(move |peer, addr| serve(peer, addr, metadata_seen.clone(), misbehave)).await;
    Stub { addr, task }
}

async fn serve(mut peer: Peer, addr: SocketAddr, seen: Arc<AtomicUsize>, misbehave: Misbehave) {
    while let Some(request) = peer.next_request().await {
        let id = request.header.correlation_id;
        let version = request.header.request_api_version;
        match request.header.request_api_key {
            18 => {
                let answer = api_versions(&[(18, 0, 3), (3, 0, 12), (17, 0, 1), (36, 0, 2)]);
                peer.respond(id, &answer, version.min(3)).await;
            }
            3 => {
                let answer = one_node_metadata(addr, &[]);
                let n = seen.fetch_add(1, Ordering::SeqCst);
                let id = match misbehave {
                    Misbehave::WrongCorrelationIdAt(at) if at == n => id + 1000,
                    _ => id,
                };
                peer.respond(id, &answer, version).await;
            }
            17 => {
                let answer = SaslHandshakeResponse::default().with_mechanisms(vec!["PLAIN".into()]);
                peer.respond(id, &answer, version).await;
            }
            36 => {
                let answer = match misbehave {
                    Misbehave::RefuseLogin => SaslAuthenticateResponse::default()
                        .with_error_code(ErrorCode::SaslAuthenticationFailed.code())
                        .with_error_message(Some("bad credentials".into())),
                    _ => SaslAuthenticateResponse::default(),
                };
                peer.respond(id, &answer, version).await;
            }
            other => panic!("the stub does not serve api key {other}"),
        }
    }
}

fn config(addr: SocketAddr) -> ClientConfig {
    ClientConfig {
        bootstrap: vec![addr.to_string()],
        request_timeout: Duration::from_secs(60),
        retry_backoff: Duration::from_millis(1),
        retry_backoff_max: Duration::from_millis(5),
        ..ClientConfig::default()
    }
}

fn metadata(_: i16) -> MetadataRequest {
    MetadataRequest::default().with_topics(Some(vec![]))
}

/// An answered request is timed under its API's name, and its bytes are counted both ways; nothing
/// stays counted in flight once it is answered.
#[test]
fn a_request_records_its_latency_and_bytes() {
    let rec = Recording::default();
    rec.run(async {
        let stub = stub(Misbehave::Nothing).await;
        let client = Client::connect(config(stub.addr)).await.unwrap();
        let api = [("api", "Metadata")];
        // Connecting asked for the broker list once.
        assert_eq!(rec.samples(REQUEST_DURATION.name, &api).len(), 1);
        let (sent, received) = (
            rec.counter(SENT_BYTES.name, &[]),
            rec.counter(RECEIVED_BYTES.name, &[]),
        );
        client.send_once(Target::Any, metadata).await.unwrap();
        let samples = rec.samples(REQUEST_DURATION.name, &api);
        assert_eq!(samples.len(), 2, "{samples:?}");
        assert!(
            samples.iter().all(|s| *s >= 0.0 && *s < 60.0),
            "{samples:?}"
        );
        assert_eq!(
            rec.samples(REQUEST_DURATION.name, &[("api", "ApiVersions")])
                .len(),
            1
        );
        assert!(rec.counter(SENT_BYTES.name, &[]) > sent);
        assert!(rec.counter(RECEIVED_BYTES.name, &[]) > received);
        assert_eq!(rec.counter(CONNECTIONS_OPENED.name, &[]), 1);
        assert_eq!(rec.gauge(REQUESTS_IN_FLIGHT.name), 0.0);
    });
}

/// A poisoned connection is counted with its reason when it breaks, and the reconnect when the next
/// request opens its replacement.
#[test]
fn a_poisoned_connection_counts_a_reconnect_on_the_next_request() {
    let rec = Recording::default();
    rec.run(async {
        // Metadata request 0 is the one `Client::connect` makes; request 1 is spoiled.
        let stub = stub(Misbehave::WrongCorrelationIdAt(1)).await;
        let client = Client::connect(config(stub.addr)).await.unwrap();
        client.send_once(Target::Any, metadata).await.unwrap_err();
        let poisoned = [("reason", "unexpected_correlation_id")];
        assert_eq!(rec.counter(CONNECTIONS_POISONED.name, &poisoned), 1);
        assert_eq!(
            rec.counter(RECONNECTS.name, &[]),
            0,
            "not before a request needs one"
        );

        client.send_once(Target::Any, metadata).await.unwrap();
        assert_eq!(rec.counter(RECONNECTS.name, &[]), 1);
        assert_eq!(rec.counter(CONNECTIONS_OPENED.name, &[]), 2);
        assert_eq!(rec.gauge(REQUESTS_IN_FLIGHT.name), 0.0);
    });
}

/// A login the broker refuses is counted under its mechanism.
#[test]
fn a_refused_login_counts_an_authentication_failure() {
    let rec = Recording::default();
    rec.run(async {
        let stub = stub(Misbehave::RefuseLogin).await;
        let sasl = SaslConfig::new(SaslMechanism::Plain, "alice", "wrong");
        let err = Client::connect(config(stub.addr).with_sasl(sasl))
            .await
            .unwrap_err();
        assert!(matches!(err, NetError::Authentication { .. }), "{err:?}");
        let plain = [("mechanism", "PLAIN")];
        assert_eq!(rec.counter(AUTHENTICATION_FAILURES.name, &plain), 1);
        assert_eq!(rec.counter(CONNECTIONS_OPENED.name, &[]), 0);
    });

    // A login that succeeds counts nothing.
    let rec = Recording::default();
    rec.run(async {
        let stub = stub(Misbehave::Nothing).await;
        let sasl = SaslConfig::new(SaslMechanism::Plain, "alice", "right");
        Client::connect(config(stub.addr).with_sasl(sasl))
            .await
            .unwrap();
        assert_eq!(
            rec.counter(AUTHENTICATION_FAILURES.name, &[("mechanism", "PLAIN")]),
            0
        );
        assert_eq!(rec.counter(CONNECTIONS_OPENED.name, &[]), 1);
    });
}

/// Every retry the routing loop makes is counted once, under why it was made.
#[test]
fn retries_are_counted_by_reason() {
    let rec = Recording::default();
    rec.run(async {
        let stub = stub(Misbehave::Nothing).await;
        let client = Client::connect(config(stub.addr)).await.unwrap();
        let mut verdicts = vec![
            Verdict::Reroute(ErrorCode::NotCoordinator),
            Verdict::Retry(ErrorCode::ConcurrentTransactions),
            Verdict::Retry(ErrorCode::ConcurrentTransactions),
        ];
        client
            .call(Target::Any, &CallOptions::default(), metadata, |_, _| {
                verdicts.pop().unwrap_or(Verdict::Done(()))
            })
            .await
            .unwrap();
        let reason = |r| rec.counter(REQUEST_RETRIES.name, &[("reason", r)]);
        assert_eq!(reason("retriable"), 2);
        assert_eq!(reason("reroute"), 1);
        assert_eq!(reason("transport"), 0);
    });
}

/// A request counts as in flight from taking its slot until its answer arrives, and one whose caller
/// gave up stays counted until the late answer comes: the slot is still taken.
#[test]
fn in_flight_counts_requests_until_answered_even_abandoned_ones() {
    use kafka_protocol::messages::ApiVersionsRequest;

    let rec = Recording::default();
    rec.run(async {
        let (conn, mut peer) = super::testing::pair(4096, super::testing::options());
        let request = ApiVersionsRequest::default();
        let waiting = {
            let conn = conn.clone();
            let request = request.clone();
            tokio::spawn(async move { conn.request(&request, 0, Duration::from_secs(60)).await })
        };
        let first = peer.next_request().await.unwrap();
        assert_eq!(rec.gauge(REQUESTS_IN_FLIGHT.name), 1.0);
        let answer = ApiVersionsResponse::default();
        peer.respond(first.header.correlation_id, &answer, 0).await;
        waiting.await.unwrap().unwrap();
        assert_eq!(rec.gauge(REQUESTS_IN_FLIGHT.name), 0.0);

        // Abandoned after its frame went out: still in flight until the answer is read and dropped.
        let abandoned = {
            let conn = conn.clone();
            tokio::spawn(async move { conn.request(&request, 0, Duration::from_secs(60)).await })
        };
        let second = peer.next_request().await.unwrap();
        abandoned.abort();
        let _ = abandoned.await;
        assert_eq!(rec.gauge(REQUESTS_IN_FLIGHT.name), 1.0);
        peer.respond(second.header.correlation_id, &answer, 0).await;
        while conn.pending_len() > 0 {
            tokio::task::yield_now().await;
        }
        assert_eq!(rec.gauge(REQUESTS_IN_FLIGHT.name), 0.0);
    });
}
