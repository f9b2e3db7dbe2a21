//! Several connections per broker (`ClientConfig::connections_per_broker`) against a real Kafka 4.4
//! broker: a wide idempotent burst opens exactly one connection per lane and every partition's records
//! land once and in the order they were sent; a reader of the same partitions keeps one fetch session
//! per connection and reads each record once; and transactional ids spread over the connections still
//! fence their predecessors.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol_tests::{cluster, unique, ClusterSpec};
use snapfence::consumer::{PartitionReader, ReaderConfig, StartAt, TopicPartition};
use snapfence::net::{Client, ClientConfig, DialFuture, Dialer, TcpDialer};
use snapfence::producer::{
    Producer, ProducerConfig, ProducerError, ProducerRecord, TransactionalConfig,
    TransactionalProducer,
};
use snapfence::records::IsolationLevel;

const PARTITIONS: i32 = 16;
const PER_PARTITION: usize = 300;

/// A plain TCP dial that counts how many connections the client opened.
#[derive(Debug, Default, Clone)]
struct Counting(Arc<AtomicUsize>);

impl Dialer for Counting {
    fn dial<'a>(&'a self, addr: &'a str, tcp: &'a TcpDialer) -> DialFuture<'a> {
        self.0.fetch_add(1, Ordering::SeqCst);
        tcp.connect(addr)
    }
}

async fn pooled(bootstrap: &str, connections: usize) -> (Client, Counting) {
    let dials = Counting::default();
    let config = ClientConfig {
        connections_per_broker: connections,
        ..ClientConfig::new(bootstrap).with_dialer(dials.clone())
    };
    (Client::connect(config).await.unwrap(), dials)
}

fn value(partition: i32, i: usize) -> Bytes {
    let mut v = format!("{partition}:{i}:").into_bytes();
    v.resize(1024, b'x');
    Bytes::from(v)
}

/// 16 partitions x 300 records of 1 KiB, all sent at once over four connections to the one broker:
/// four connections in all (the bootstrap one is the first), each partition's records at offsets
/// 0..300 in the order they were sent (no gap, no duplicate, no reordering across connections), and a
/// reader on the same client reads them back once each, with a fetch session on each connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wide_burst_spreads_over_the_connections_and_keeps_each_partitions_order() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let lanes = 4;
    let (client, dials) = pooled(&kafka.bootstrap(), lanes).await;
    let topic = unique("pool");
    snapfence::admin::create_topic(&client, &topic, PARTITIONS, 1, &[])
        .await
        .unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default())
        .await
        .unwrap();
    let mut deliveries = Vec::new();
    for i in 0..PER_PARTITION {
        for p in 0..PARTITIONS {
            let r = ProducerRecord::new(topic.as_str(), Some(value(p, i))).partition(p);
            deliveries.push((p, i, producer.send(r).await.unwrap()));
        }
    }
    for (p, i, d) in deliveries {
        let meta = d.await.unwrap();
        assert_eq!(meta.topic_partition.partition, p);
        assert_eq!(meta.offset, Some(i as i64), "partition {p}, record {i}");
    }
    producer.close().await;
    let nodes = client.cached_metadata().brokers.len();
    assert_eq!(
        dials.0.load(Ordering::SeqCst),
        lanes * nodes,
        "one connection per lane and broker"
    );

    let mut reader = committed_reader(&client, &topic, PARTITIONS);
    let read = read_values(
        &mut reader,
        PARTITIONS as usize * PER_PARTITION,
        Duration::ZERO,
    )
    .await;
    for p in 0..PARTITIONS {
        let expected: Vec<Bytes> = (0..PER_PARTITION).map(|i| value(p, i)).collect();
        assert!(read[&p] == expected, "partition {p} read back differently");
    }
    let sessions = reader.fetch_sessions_by_connection();
    let used: HashSet<usize> = sessions.keys().map(|(_, lane)| *lane).collect();
    assert_eq!(
        used.len(),
        lanes,
        "a fetch session per connection: {sessions:?}"
    );
    assert_eq!(
        dials.0.load(Ordering::SeqCst),
        lanes * nodes,
        "the reader opened no connection of its own"
    );
    reader.close().await;
}

/// A read_committed reader of every partition of `topic` from the start.
fn committed_reader(client: &Client, topic: &str, partitions: i32) -> PartitionReader {
    let mut config = ReaderConfig::default();
    config.isolation = IsolationLevel::ReadCommitted;
    config.max_wait = Duration::from_millis(100);
    let mut reader = PartitionReader::new(client.clone(), config);
    for p in 0..partitions {
        reader.assign(TopicPartition::new(topic, p), StartAt::Earliest);
    }
    reader
}

/// Each partition's values, read until `want` in all and then for `more`; fails after 60 s.
async fn read_values(
    reader: &mut PartitionReader,
    want: usize,
    more: Duration,
) -> BTreeMap<i32, Vec<Bytes>> {
    let mut read: BTreeMap<i32, Vec<Bytes>> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut settled: Option<Instant> = None;
    while settled.is_none_or(|at| Instant::now() < at) {
        for part in reader.fetch().await.unwrap() {
            let got = read.entry(part.partition.partition).or_default();
            got.extend(part.records.into_iter().map(|r| r.value.unwrap()));
        }
        let counts: BTreeMap<i32, usize> = read.iter().map(|(p, v)| (*p, v.len())).collect();
        assert!(Instant::now() < deadline, "read stalled: {counts:?}");
        if settled.is_none() && counts.values().sum::<usize>() >= want {
            settled = Some(Instant::now() + more);
        }
    }
    read
}

/// Twelve transactional producers, each on its own partition, share one client with three connections
/// per broker (so their ids' requests spread over them) and commit at once; then a new producer with
/// each id takes over: every old producer's next commit is fenced, and a read_committed read holds
/// exactly the committed records of both generations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_ids_spread_over_connections_still_fence() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let (client, _) = pooled(&kafka.bootstrap(), 3).await;
    let topic = unique("pool-txn");
    let n = 12;
    snapfence::admin::create_topic(&client, &topic, n, 1, &[])
        .await
        .unwrap();
    let prefix = unique("pool-txn-id");
    let generation = |tag: &'static str| {
        let (client, topic, prefix) = (client.clone(), topic.clone(), prefix.clone());
        async move {
            let mut tasks = tokio::task::JoinSet::new();
            for p in 0..n {
                let (client, topic, id) = (client.clone(), topic.clone(), format!("{prefix}-{p}"));
                tasks.spawn(async move {
                    let mut txn = TransactionalProducer::init(client, TransactionalConfig::new(id))
                        .await
                        .unwrap();
                    txn.begin().unwrap();
                    let r =
                        ProducerRecord::new(topic.as_str(), Some(Bytes::from(tag))).partition(p);
                    let d = txn.send(r).await.unwrap();
                    txn.commit().await.unwrap();
                    d.await.unwrap();
                    txn.begin().unwrap();
                    (p, txn)
                });
            }
            let mut open = Vec::new();
            while let Some(done) = tasks.join_next().await {
                open.push(done.unwrap());
            }
            open
        }
    };
    let old = generation("first").await;
    let new = generation("second").await;
    for (p, mut txn) in old {
        let r = ProducerRecord::new(topic.as_str(), Some(Bytes::from("zombie"))).partition(p);
        let sent = match txn.send(r).await {
            Ok(d) => txn.commit().await.map(|_| d),
            Err(e) => Err(e),
        };
        match sent {
            Err(
                ProducerError::Fenced { .. }
                | ProducerError::CommitFenced { .. }
                | ProducerError::MustAbort { .. },
            ) => {}
            other => panic!("partition {p}: the old producer was not fenced: {other:?}"),
        }
    }
    for (_, txn) in new {
        txn.close().await;
    }
    // Both generations, and then a further second, in which a committed zombie record (there must be
    // none) would show up.
    let mut reader = committed_reader(&client, &topic, n);
    let read = read_values(&mut reader, 2 * n as usize, Duration::from_secs(1)).await;
    for p in 0..n {
        assert_eq!(
            read[&p],
            vec![Bytes::from("first"), Bytes::from("second")],
            "partition {p}"
        );
    }
}
