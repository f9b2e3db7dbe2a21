//! The driver's supervision: each spawned task is made to panic at a test-only fault point, and every
//! waiter must come away with a typed error instead of waiting on the dead task.
//!
//! The broker is a loopback stub that answers the handful of requests a producer makes before anything
//! is sent (ApiVersions, Metadata, FindCoordinator, InitProducerId). It stands in for no broker
//! behaviour: every test kills its task before a Produce or an AddPartitionsToTxn would go out.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::{InitProducerIdResponse, ProducerId};
use tokio::time::timeout;

use super::{IdFetch, Inner, Mode};
use crate::net::testing::{
    api_versions, coordinator_is_self, loopback, one_node_metadata, Peer, TRANSACTIONAL_BROKER_APIS,
};
use crate::net::{Client, ClientConfig};
use crate::producer::{
    Producer, ProducerConfig, ProducerError, ProducerRecord, TransactionalConfig,
    TransactionalProducer,
};

/// Long enough for anything that is going to happen here; a waiter still waiting by then waits on a
/// dead task.
const PATIENCE: Duration = Duration::from_secs(10);

async fn stub_broker() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    loopback(serve).await
}

/// One broker (node 1, itself), topic `t` with one partition it leads, coordinator for everything.
async fn serve(mut peer: Peer, addr: SocketAddr) {
    while let Some(request) = peer.next_request().await {
        let id = request.header.correlation_id;
        let version = request.header.request_api_version;
        match request.header.request_api_key {
            18 => {
                let answer = api_versions(TRANSACTIONAL_BROKER_APIS);
                peer.respond(id, &answer, version.min(3)).await;
            }
            3 => {
                let answer = one_node_metadata(addr, &[("t", 1)]);
                peer.respond(id, &answer, version).await;
            }
            10 => {
                let answer = coordinator_is_self(addr, "tx", version);
                peer.respond(id, &answer, version).await;
            }
            22 => {
                let answer = InitProducerIdResponse::default()
                    .with_producer_id(ProducerId(7))
                    .with_producer_epoch(0);
                peer.respond(id, &answer, version).await;
            }
            other => panic!("the producer stub does not serve api key {other}"),
        }
    }
}

/// Records stay buffered (no linger runs out during a test) unless a test says otherwise.
fn config(linger: Duration) -> ProducerConfig {
    ProducerConfig {
        linger,
        ..ProducerConfig::default()
    }
}

fn record() -> ProducerRecord {
    ProducerRecord::new("t", Some("v".into())).partition(0)
}

async fn client(addr: SocketAddr) -> Client {
    Client::connect(ClientConfig::new(addr.to_string()))
        .await
        .unwrap()
}

/// Lets the driver finish its first pass and park, so a fault armed next fires on a later pass.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(50)).await;
}

fn assert_task_failed(err: &ProducerError, expect_task: &str, point: &str) {
    match err {
        ProducerError::TaskFailed { task, failure } => {
            assert_eq!(task, expect_task);
            assert!(
                failure.contains(&format!("injected fault at {point}")),
                "the panic's message is kept: {failure}"
            );
        }
        other => panic!("expected TaskFailed from {expect_task}, got {other:?}"),
    }
    assert!(err.is_fatal());
}

/// Later calls are refused with the dead task's error as the cause.
fn assert_refused(inner: &Arc<Inner>, expect_task: &str) {
    match inner.try_append(record()) {
        Err((ProducerError::Defunct { cause }, _)) => {
            assert!(
                matches!(&*cause, ProducerError::TaskFailed { task, .. } if task == expect_task),
                "{cause:?}"
            );
        }
        Err((other, _)) => panic!("expected Defunct(TaskFailed), got {other:?}"),
        Ok(_) => panic!("a producer with a dead {expect_task} task accepted a record"),
    }
}

/// A broker's sender that panics fails the record it carried with a fatal error naming the sender and
/// the panic, gives up its slot, and the producer refuses later sends: no Delivery waits on a dead
/// sender.
#[tokio::test]
async fn a_panicked_sender_fails_its_records_and_frees_its_slot() {
    let (addr, stub) = stub_broker().await;
    let producer = Producer::new(client(addr).await, config(Duration::ZERO))
        .await
        .unwrap();
    let inner = producer.inner().clone();
    inner.faults.arm("sender", 1);
    let delivery = producer.send(record()).await.unwrap();
    let outcome = timeout(PATIENCE, delivery)
        .await
        .expect("the record's Delivery resolves although its sender died");
    assert_task_failed(&outcome.unwrap_err(), "sender to broker 1", "sender");
    assert!(
        inner.lock().senders.is_empty(),
        "the dead sender's slot is free"
    );
    assert_refused(&inner, "sender to broker 1");
    timeout(PATIENCE, producer.flush())
        .await
        .expect("flush returns");
    stub.abort();
}

/// When the driver task itself dies, the records it held fail with a fatal error naming it, flush
/// returns and later sends are refused: nothing waits on a driver that is gone.
#[tokio::test]
async fn a_dead_driver_fails_every_waiter() {
    let (addr, stub) = stub_broker().await;
    let producer = Producer::new(client(addr).await, config(Duration::from_secs(3600)))
        .await
        .unwrap();
    let inner = producer.inner().clone();
    settle().await;
    inner.faults.arm("driver", 1);
    // The append wakes the driver, which dies at the top of that pass with the record buffered.
    let delivery = producer.send(record()).await.unwrap();
    let outcome = timeout(PATIENCE, delivery)
        .await
        .expect("the buffered record's Delivery resolves although the driver died");
    assert_task_failed(&outcome.unwrap_err(), "driver", "driver");
    timeout(PATIENCE, producer.flush())
        .await
        .expect("flush returns");
    assert_refused(&inner, "driver");
    stub.abort();
}

/// An idempotent producer's id fetch that panics clears its in-flight flag and makes the producer
/// fatal, so the buffered record and later sends fail typed instead of waiting for an id that never
/// comes.
#[tokio::test]
async fn a_panicked_id_fetch_fails_the_held_records() {
    let (addr, stub) = stub_broker().await;
    let producer = Producer::new(client(addr).await, config(Duration::from_secs(3600)))
        .await
        .unwrap();
    let inner = producer.inner().clone();
    let delivery = producer.send(record()).await.unwrap();
    settle().await;
    inner.faults.arm("producer id", 1);
    // What an exhausted epoch would report (the core's `need_new_id`), without exhausting one.
    if let Mode::Idempotent { new_id } = &mut inner.lock().mode {
        *new_id = IdFetch::Wanted;
    }
    inner.wake();
    let outcome = timeout(PATIENCE, delivery)
        .await
        .expect("the held record's Delivery resolves although the id fetch died");
    assert_task_failed(&outcome.unwrap_err(), "producer id", "producer id");
    assert!(
        !matches!(
            inner.lock().mode,
            Mode::Idempotent {
                new_id: IdFetch::InFlight
            }
        ),
        "the in-flight flag is clear"
    );
    assert_refused(&inner, "producer id");
    stub.abort();
}

/// A TV1 enrolment (AddPartitionsToTxn) that panics clears its in-flight flag and makes the producer
/// fatal: the record waiting for the enrolment fails typed and `commit` returns a fatal error instead
/// of waiting for an enrolment that never ends.
#[tokio::test]
async fn a_panicked_enrolment_fails_the_transaction() {
    let (addr, stub) = stub_broker().await;
    let mut producer = TransactionalProducer::init(client(addr).await, {
        let mut c = TransactionalConfig::new("tx");
        c.producer = config(Duration::ZERO);
        c
    })
    .await
    .unwrap();
    let inner = producer.inner().clone();
    settle().await;
    inner.faults.arm("add partitions", 1);
    producer.begin().unwrap();
    let delivery = producer.send(record()).await.unwrap();
    let outcome = timeout(PATIENCE, delivery)
        .await
        .expect("the record's Delivery resolves although the enrolment died");
    assert_task_failed(&outcome.unwrap_err(), "add partitions", "add partitions");
    assert!(
        !inner.lock().mode.add_in_flight(),
        "the in-flight flag is clear"
    );
    let commit = timeout(PATIENCE, producer.commit())
        .await
        .expect("commit returns");
    let err = commit.expect_err("a transaction whose enrolment died cannot commit");
    assert!(err.is_fatal(), "{err:?}");
    stub.abort();
}

/// The lookup of a leader missing from the metadata cache that panics clears its in-flight flag and
/// makes the producer fatal: the record held back for want of a leader fails typed instead of waiting
/// for a lookup that never ends.
#[tokio::test]
async fn a_panicked_leader_lookup_fails_the_held_records() {
    let (addr, stub) = stub_broker().await;
    let client = client(addr).await;
    let producer = Producer::new(client.clone(), config(Duration::from_secs(3600)))
        .await
        .unwrap();
    let inner = producer.inner().clone();
    let delivery = producer.send(record()).await.unwrap();
    settle().await;
    inner.faults.arm("leaders", 1);
    // The leader is forgotten (as after NOT_LEADER_OR_FOLLOWER), so the flush's pass must look it up.
    client.invalidate_leader("t", 0);
    let (outcome, flushed) = tokio::join!(
        timeout(PATIENCE, delivery),
        timeout(PATIENCE, producer.flush())
    );
    let outcome = outcome.expect("the held record's Delivery resolves although the lookup died");
    assert_task_failed(&outcome.unwrap_err(), "leader lookup", "leaders");
    flushed.expect("flush returns");
    assert!(
        !inner.lock().refresh_in_flight,
        "the in-flight flag is clear"
    );
    // `try_append` picks the partition from the cache before it asks the core.
    client.metadata(&["t"]).await.unwrap();
    assert_refused(&inner, "leader lookup");
    stub.abort();
}

/// How a pass's batches become requests: one batch per partition per request, a request's record bytes
/// within the budget (a lone larger batch goes alone), and each partition's batches in strictly later
/// requests, so they reach the broker in sequence order.
#[test]
fn requests_keep_to_the_byte_budget_and_each_partitions_order() {
    use std::collections::HashMap;

    use bytes::Bytes;

    use super::requests_by_leader;
    use crate::net::ClusterMetadata;
    use crate::producer::produce_core::ToSend;
    use crate::producer::{ProducerIdEpoch, TopicPartition};

    let addr: SocketAddr = "127.0.0.1:9092".parse().unwrap();
    let meta = ClusterMetadata::default().merged(&one_node_metadata(addr, &[("t", 4)]));
    let batch = |id: u64, partition: i32, len: usize| ToSend {
        id,
        partition: TopicPartition::new("t", partition),
        records: Bytes::from(vec![0u8; len]),
        ids: ProducerIdEpoch { id: 7, epoch: 0 },
        base_sequence: 0,
        attempt: 0,
        deadline: std::time::Instant::now(),
    };
    // Partition 0: three batches of 400; 1: one of 400; 2: one of 1500 (over the budget); 3: one of 100.
    let out = vec![
        batch(1, 0, 400),
        batch(2, 1, 400),
        batch(3, 0, 400),
        batch(4, 2, 1500),
        batch(5, 0, 400),
        batch(6, 3, 100),
    ];
    let jobs = requests_by_leader(&meta, out.clone(), (3, 12), 1000, 1, &mut HashMap::new());
    let layout: Vec<Vec<(i32, u64)>> = jobs
        .iter()
        .map(|j| {
            j.batches
                .iter()
                .map(|b| (b.partition.partition, b.id))
                .collect()
        })
        .collect();
    assert_eq!(
        layout,
        vec![
            vec![(0, 1), (1, 2), (3, 6)],
            vec![(0, 3)],
            vec![(2, 4)],
            vec![(0, 5)],
        ]
    );
    for job in &jobs {
        assert_eq!(job.node, 1);
        let bytes: usize = job.batches.iter().map(|b| b.records.len()).sum();
        assert!(
            bytes <= 1000 || job.batches.len() == 1,
            "{bytes} bytes in one request"
        );
        assert_eq!(job.names.len(), job.batches.len());
    }
    // Two connections: each request carries only partitions of its lane, and a partition's batches
    // still go in strictly later requests of that lane.
    let jobs = requests_by_leader(&meta, out, (3, 12), 1000, 2, &mut HashMap::new());
    let lane = |p: i32| crate::net::connection_of_partition("t", p, 2);
    let mut last: HashMap<i32, usize> = HashMap::new();
    for (i, job) in jobs.iter().enumerate() {
        assert!(job
            .batches
            .iter()
            .all(|b| lane(b.partition.partition) == job.lane));
        for b in &job.batches {
            if let Some(before) = last.insert(b.partition.partition, i) {
                assert!(
                    before < i,
                    "partition {} out of order",
                    b.partition.partition
                );
            }
        }
    }
    let lanes: std::collections::HashSet<usize> = jobs.iter().map(|j| j.lane).collect();
    assert_eq!(lanes.len(), 2, "both lanes carry requests");
    let batches: usize = jobs.iter().map(|j| j.batches.len()).sum();
    assert_eq!(batches, 6);
}
