//! The transaction machine's deadlines, driven through the transactional producer's driver on tokio's
//! paused clock: the driver reads `crate::clock::now`, so advancing tokio's time moves the machine's
//! `now` too, and an operation timeout of minutes elapses in milliseconds of real time.
//!
//! The broker is an in-memory stub (`net::testing::InMemory`) that answers the requests a producer
//! makes before its first transaction, and answers InitProducerId as the test scripts. It stands in
//! for no broker behaviour: what is under test is the machine's timing, seen through the driver.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::{
    AddOffsetsToTxnResponse, FindCoordinatorRequest, InitProducerIdResponse, ProducerId,
};
use kafka_protocol::protocol::Decodable;

use crate::net::testing::{
    api_versions, coordinator_is_self, one_node_metadata, InMemory, Peer, TRANSACTIONAL_BROKER_APIS,
};
use crate::net::{Client, ClientConfig};
use crate::producer::{
    ErrorClass, ProducerError, TopicPartition, TransactionalConfig, TransactionalProducer,
};
use crate::wire::ErrorCode;
use crate::GroupMetadata;

const ADDR: &str = "127.0.0.1:9092";

/// One broker (node 1, itself), coordinator for everything. InitProducerId is answered `busy` for
/// the first `busy_answers` attempts (counted in `attempts` across connections), then with id 7.
/// AddOffsetsToTxn is accepted; TxnOffsetCommit is read and never answered.
async fn serve(
    mut peer: Peer,
    addr: SocketAddr,
    busy: ErrorCode,
    busy_answers: usize,
    attempts: Arc<AtomicUsize>,
) {
    while let Some(request) = peer.next_request().await {
        let id = request.header.correlation_id;
        let version = request.header.request_api_version;
        match request.header.request_api_key {
            18 => {
                let answer = api_versions(TRANSACTIONAL_BROKER_APIS);
                peer.respond(id, &answer, version.min(3)).await;
            }
            3 => {
                peer.respond(id, &one_node_metadata(addr, &[]), version)
                    .await
            }
            10 => {
                let mut body = request.body.clone();
                let key = FindCoordinatorRequest::decode(&mut body, version)
                    .ok()
                    .map(|r| {
                        r.coordinator_keys
                            .first()
                            .map_or_else(|| r.key.to_string(), ToString::to_string)
                    })
                    .unwrap_or_default();
                let answer = coordinator_is_self(addr, &key, version);
                peer.respond(id, &answer, version).await;
            }
            25 => {
                peer.respond(id, &AddOffsetsToTxnResponse::default(), version)
                    .await
            }
            // The group coordinator that takes the offset commit and never answers it.
            28 => {}
            22 => {
                let n = attempts.fetch_add(1, Ordering::SeqCst);
                let answer = if n < busy_answers {
                    InitProducerIdResponse::default()
                        .with_error_code(busy.code())
                        .with_producer_id(ProducerId(-1))
                        .with_producer_epoch(-1)
                } else {
                    InitProducerIdResponse::default()
                        .with_producer_id(ProducerId(7))
                        .with_producer_epoch(0)
                };
                peer.respond(id, &answer, version).await;
            }
            other => panic!("the paused-time stub does not serve api key {other}"),
        }
    }
}

async fn client(busy: ErrorCode, busy_answers: usize, attempts: Arc<AtomicUsize>) -> Client {
    let addr: SocketAddr = ADDR.parse().unwrap();
    let dialer = InMemory::new(addr, move |peer, addr| {
        serve(peer, addr, busy, busy_answers, attempts.clone())
    });
    Client::connect(ClientConfig::new(ADDR).with_dialer(dialer))
        .await
        .unwrap()
}

fn config(operation_timeout: Duration) -> TransactionalConfig {
    let mut c = TransactionalConfig::new("tx");
    c.operation_timeout = operation_timeout;
    c
}

/// An `init` answered "not now" gives up at the operation timeout, and that deadline is the machine's,
/// read on tokio's clock: ten minutes of retries (about 600, the backoff capped at 1 s) pass on the
/// paused clock in a moment of real time. With the driver on `std::time::Instant` the machine's `now`
/// would stand still while the backoff sleeps jump ahead: it would never see its deadline, and the
/// stub's 2 000th answer, a success, would end the init instead of the timeout.
#[tokio::test(start_paused = true)]
async fn init_gives_up_at_its_deadline_on_tokio_time() {
    let attempts = Arc::new(AtomicUsize::new(0));
    let client = client(
        ErrorCode::CoordinatorLoadInProgress,
        2_000,
        attempts.clone(),
    )
    .await;
    let timeout = Duration::from_secs(600);
    let real = std::time::Instant::now();
    let began = tokio::time::Instant::now();
    let err = match TransactionalProducer::init(client, config(timeout)).await {
        Ok(_) => panic!(
            "init outlived its deadline: {} attempts",
            attempts.load(Ordering::SeqCst)
        ),
        Err(e) => e,
    };
    let waited = began.elapsed();
    match &err {
        ProducerError::Timeout {
            op,
            elapsed,
            class,
            last_error,
        } => {
            assert_eq!(*op, "init");
            assert_eq!(*class, ErrorClass::Retriable);
            assert_eq!(*last_error, Some(ErrorCode::CoordinatorLoadInProgress));
            assert!(
                *elapsed >= timeout,
                "gave up at {elapsed:?}, before the deadline"
            );
        }
        other => panic!("expected the init timeout, got {other:?}"),
    }
    // The backoff is capped at 1 s, so the retries went on until the deadline and stopped within one
    // backoff of it.
    assert!(
        waited >= timeout && waited <= timeout + Duration::from_secs(2),
        "tokio time spent: {waited:?}"
    );
    let n = attempts.load(Ordering::SeqCst);
    assert!(
        (590..2_000).contains(&n),
        "retried until the deadline: {n} attempts"
    );
    assert!(
        real.elapsed() < Duration::from_secs(60),
        "the deadline came on tokio's clock, not in real time: {:?}",
        real.elapsed()
    );
}

/// The machine's backoff between retries is waited on tokio's clock, attempt by attempt: two answers
/// "loading" cost exactly the first two delays (100 ms, then 200 ms) and no more, and the third
/// attempt succeeds.
#[tokio::test(start_paused = true)]
async fn init_retries_after_the_machine_backoff_on_tokio_time() {
    let attempts = Arc::new(AtomicUsize::new(0));
    let client = client(ErrorCode::CoordinatorLoadInProgress, 2, attempts.clone()).await;
    let began = tokio::time::Instant::now();
    let producer = TransactionalProducer::init(client, config(Duration::from_secs(60)))
        .await
        .expect("the third InitProducerId succeeds");
    let waited = began.elapsed();
    assert_eq!(attempts.load(Ordering::SeqCst), 3);
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_millis(400),
        "two backoffs of 100 and 200 ms: {waited:?}"
    );
    assert_eq!(
        producer.state(),
        crate::producer::TransactionState::Ready,
        "initialised"
    );
}

/// A TxnOffsetCommit that the group coordinator takes and never answers ends at the operation's
/// deadline (5 s), not at the request's own timeout (the client's, 30 s): `send_offsets` fails then,
/// abortable, naming the missing answer as REQUEST_TIMED_OUT. Before the driver cut attempts at the
/// deadline, the attempt under way ran its whole request timeout first.
#[tokio::test(start_paused = true)]
async fn send_offsets_never_answered_ends_at_the_operation_deadline() {
    let client = client(ErrorCode::None, 0, Arc::new(AtomicUsize::new(0))).await;
    let timeout = Duration::from_secs(5);
    let mut p = TransactionalProducer::init(client, config(timeout))
        .await
        .expect("init");
    p.begin().expect("begin");
    let group = GroupMetadata::new("g", 5, "m-1", None).expect("group metadata");
    let began = tokio::time::Instant::now();
    let err = p
        .send_offsets([(TopicPartition::new("in", 0), 1.into())], &group)
        .await
        .expect_err("never answered");
    let waited = began.elapsed();
    assert!(
        waited >= timeout && waited < timeout + Duration::from_secs(2),
        "ended at the operation deadline, not the request timeout: {waited:?}"
    );
    match &err {
        ProducerError::Timeout { op, last_error, .. } => {
            assert_eq!(*op, "send_offsets");
            assert_eq!(*last_error, Some(ErrorCode::RequestTimedOut));
        }
        other => panic!("expected the send_offsets timeout, got {other:?}"),
    }
    assert!(err.is_abortable(), "{err:?}");
}
