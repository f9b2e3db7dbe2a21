//! The partition reader's Fetch against real Apache Kafka brokers: topics by id (Fetch v13+, KIP-516)
//! and fetch sessions (KIP-227) on 4.4, 4.2 and 3.9; many partitions read exactly once; read_committed
//! in a session; a session the broker lost (closed under the reader, or a broker restart) resets to a
//! full fetch without losing or repeating a record; and what sessions save per poll on 64 partitions.
//!
//! Test data is written with raw Produce requests built by the records layer's encoder, so these tests
//! depend on nothing above the consumer.
//!
//! # References
//! - KIP-227 (fetch sessions), KIP-516 (topic ids in Fetch v13+)

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::{
    AddPartitionsToTxnRequest, BrokerId, EndTxnRequest, FetchRequest, InitProducerIdRequest,
    ProducerId, TopicName, TransactionalId,
};
use kafka_protocol::protocol::StrBytes;
use metrics::{Counter, CounterFn, Gauge, Histogram, Key, KeyName, Metadata, Recorder};
use metrics::{SharedString, Unit};
use protocol_tests::raw::{
    batch, connect as client, new_topic, produce, produce_raw, reader_config,
};
use protocol_tests::{cluster, dedicated, unique, ClusterSpec};
use snapfence::consumer::{PartitionReader, StartAt, TopicPartition};
use snapfence::net::{CallOptions, Client, Target, Verdict};
use snapfence::records::{IsolationLevel, ProducerStamp};
use snapfence::ErrorCode;

// ------------------------------------------------------------------------------------------ helpers

async fn topic(client: &Client, partitions: i32) -> String {
    new_topic(client, "f", partitions).await
}

/// One transaction of raw requests (InitProducerId, AddPartitionsToTxn, Produce, EndTxn) writing
/// `values` to one partition, committed or aborted.
async fn transaction(
    client: &Client,
    topic: &str,
    partition: i32,
    values: &[String],
    commit: bool,
) {
    let id = unique("txn");
    let txn_id = || TransactionalId(StrBytes::from_string(id.clone()));
    let (producer_id, epoch) = client
        .call(
            Target::transaction(id.as_str()),
            &CallOptions::default(),
            |_| {
                InitProducerIdRequest::default()
                    .with_transactional_id(Some(txn_id()))
                    .with_transaction_timeout_ms(60_000)
                    .with_producer_id(ProducerId(-1))
                    .with_producer_epoch(-1)
            },
            |r, _| Verdict::from_code(r.error_code, (r.producer_id.0, r.producer_epoch)),
        )
        .await
        .expect("InitProducerId");
    client
        .call(
            Target::transaction(id.as_str()),
            &CallOptions {
                max_version: Some(3),
                ..CallOptions::default()
            },
            |_| {
                AddPartitionsToTxnRequest::default()
                    .with_v3_and_below_transactional_id(txn_id())
                    .with_v3_and_below_producer_id(ProducerId(producer_id))
                    .with_v3_and_below_producer_epoch(epoch)
                    .with_v3_and_below_topics(vec![AddPartitionsToTxnTopic::default()
                        .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                        .with_partitions(vec![partition])])
            },
            |r, _| {
                let code =
                    r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code;
                Verdict::from_code(code, code)
            },
        )
        .await
        .expect("AddPartitionsToTxn");
    let stamp = ProducerStamp {
        producer_id,
        producer_epoch: epoch,
        base_sequence: 0,
        transactional: true,
    };
    produce_raw(client, topic, partition, batch(values, stamp), Some(&id)).await;
    client
        .call(
            Target::transaction(id.as_str()),
            &CallOptions {
                // v5+ (transaction version 2) bumps the epoch; the raw producer is done either way.
                max_version: Some(4),
                ..CallOptions::default()
            },
            |_| {
                EndTxnRequest::default()
                    .with_transactional_id(txn_id())
                    .with_producer_id(ProducerId(producer_id))
                    .with_producer_epoch(epoch)
                    .with_committed(commit)
            },
            |r, _| Verdict::from_code(r.error_code, r.error_code),
        )
        .await
        .expect("EndTxn");
}

fn values(p: i32, from: usize, n: usize) -> Vec<String> {
    (from..from + n).map(|i| format!("{p}-{i}")).collect()
}

fn assign_all(reader: &mut PartitionReader, topic: &str, partitions: i32) {
    for p in 0..partitions {
        reader.assign(TopicPartition::new(topic, p), StartAt::Earliest);
    }
}

/// Reads until `want` records arrived (or `limit` passes), then `linger` longer to catch any extra;
/// the values by partition, in the order delivered.
async fn read_by_partition(
    reader: &mut PartitionReader,
    want: usize,
    limit: Duration,
    linger: Duration,
) -> BTreeMap<i32, Vec<String>> {
    let mut out: BTreeMap<i32, Vec<String>> = BTreeMap::new();
    let mut n = 0;
    let deadline = Instant::now() + limit;
    let mut stop: Option<Instant> = None;
    while stop.is_none_or(|s| Instant::now() < s) && Instant::now() < deadline {
        for part in reader.fetch().await.expect("fetch") {
            for r in &part.records {
                let v = String::from_utf8(r.value.clone().unwrap().to_vec()).unwrap();
                out.entry(part.partition.partition).or_default().push(v);
                n += 1;
            }
        }
        if n >= want && stop.is_none() {
            stop = Some(Instant::now() + linger);
        }
    }
    out
}

fn expect_exactly(got: &BTreeMap<i32, Vec<String>>, want: &BTreeMap<i32, Vec<String>>) {
    for (p, values) in want {
        assert_eq!(got.get(p), Some(values), "partition {p}");
    }
    assert_eq!(
        got.len(),
        want.len(),
        "no partition delivered unasked: {got:?}"
    );
}

// ------------------------------------------------------------------------- topic ids and sessions

/// Reading 64 partitions of one leader goes by topic id at Fetch v13+ in one session: every record
/// is delivered exactly once, idle polls carry no partition either way, and one new record costs one
/// partition in the answer and one in the next request.
async fn many_partitions_in_one_session(spec: ClusterSpec) {
    const PARTITIONS: i32 = 64;
    let kafka = cluster(spec).await;
    let c = client(&kafka).await;
    let t = topic(&c, PARTITIONS).await;
    let mut want = BTreeMap::new();
    for p in 0..PARTITIONS {
        let v = values(p, 0, 1 + (p as usize % 3));
        produce(&c, &t, p, &v).await;
        want.insert(p, v);
    }
    let total: usize = want.values().map(Vec::len).sum();

    let mut reader =
        PartitionReader::new(c.clone(), reader_config(IsolationLevel::ReadUncommitted));
    assign_all(&mut reader, &t, PARTITIONS);
    let got = read_by_partition(
        &mut reader,
        total,
        Duration::from_secs(30),
        Duration::from_millis(500),
    )
    .await;
    expect_exactly(&got, &want);

    let stats = reader.fetch_stats();
    let node = c.cached_metadata().leader(&t, 0).expect("leader").node;
    let advertised = c
        .broker_versions(node)
        .await
        .expect("versions")
        .broker_range(1)
        .expect("Fetch advertised");
    eprintln!(
        "{}: broker advertises Fetch {advertised:?}; the reader used v{}; {stats:?}",
        kafka.version(),
        stats.last_version
    );
    assert!(stats.last_version >= 13, "{stats:?}");
    assert_eq!(stats.by_topic_id, stats.requests, "every Fetch by id");
    assert!(stats.incremental > 0, "{stats:?}");
    assert_eq!(stats.session_resets, 0, "{stats:?}");
    let sessions = reader.fetch_sessions();
    assert_eq!(sessions.len(), 1, "one session for the one leader");
    assert_ne!(sessions[&node], 0, "the broker gave the session an id");

    // The request after the last records carries their partitions' new positions; after that the
    // session has nothing to say either way.
    reader.fetch().await.expect("fetch");
    let before = reader.fetch_stats();
    for _ in 0..3 {
        assert!(reader.fetch().await.expect("fetch").is_empty());
    }
    let idle = reader.fetch_stats();
    assert_eq!(idle.requests - before.requests, 3);
    assert_eq!(idle.incremental - before.incremental, 3);
    assert_eq!(idle.partitions_sent, before.partitions_sent, "{idle:?}");
    assert_eq!(
        idle.partitions_answered, before.partitions_answered,
        "{idle:?}"
    );

    produce(&c, &t, 17, &values(17, 10, 1)).await;
    let got = read_by_partition(
        &mut reader,
        1,
        Duration::from_secs(10),
        Duration::from_millis(300),
    )
    .await;
    assert_eq!(got, BTreeMap::from([(17, values(17, 10, 1))]));
    let after = reader.fetch_stats();
    assert_eq!(
        after.partitions_answered - idle.partitions_answered,
        1,
        "only the partition with news is answered: {after:?}"
    );
    assert_eq!(
        after.partitions_sent - idle.partitions_sent,
        1,
        "only the partition that moved is sent again: {after:?}"
    );
    assert_eq!(
        reader.fetch_sessions(),
        sessions,
        "the same session throughout"
    );
}

/// On Kafka 4, 64 partitions of one leader are read by topic id in one incremental fetch session, every
/// record exactly once, with idle fetches carrying no partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_partitions_in_one_session_kafka4() {
    many_partitions_in_one_session(ClusterSpec::kafka4()).await;
}

/// On Kafka 4.2, 64 partitions of one leader are read by topic id in one incremental fetch session,
/// every record exactly once, with idle fetches carrying no partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_partitions_in_one_session_kafka42() {
    many_partitions_in_one_session(ClusterSpec::kafka42()).await;
}

/// On Kafka 3.9, 64 partitions of one leader are read by topic id in one incremental fetch session,
/// every record exactly once, with idle fetches carrying no partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_partitions_in_one_session_kafka39() {
    many_partitions_in_one_session(ClusterSpec::kafka39()).await;
}

/// read_committed in a session still drops aborted transactions and control markers: on each
/// partition only the plain and the committed records are delivered, each once.
async fn read_committed_in_a_session(spec: ClusterSpec) {
    const PARTITIONS: i32 = 8;
    let kafka = cluster(spec).await;
    let c = client(&kafka).await;
    let t = topic(&c, PARTITIONS).await;
    let mut reader = PartitionReader::new(c.clone(), reader_config(IsolationLevel::ReadCommitted));
    assign_all(&mut reader, &t, PARTITIONS);
    // A session first, so the transactions arrive through incremental fetches.
    let deadline = Instant::now() + Duration::from_secs(10);
    while reader.fetch_sessions().is_empty() {
        assert!(
            Instant::now() < deadline,
            "no session: {:?}",
            reader.fetch_stats()
        );
        reader.fetch().await.expect("fetch");
    }

    let mut want = BTreeMap::new();
    for p in 0..PARTITIONS {
        transaction(&c, &t, p, &values(p, 0, 2), false).await;
        let plain = values(p, 2, 1);
        produce(&c, &t, p, &plain).await;
        let committed = values(p, 3, 2);
        transaction(&c, &t, p, &committed, true).await;
        transaction(&c, &t, p, &values(p, 5, 1), false).await;
        want.insert(p, [plain, committed].concat());
    }
    let got = read_by_partition(
        &mut reader,
        want.values().map(Vec::len).sum(),
        Duration::from_secs(30),
        Duration::from_millis(800),
    )
    .await;
    expect_exactly(&got, &want);
    let stats = reader.fetch_stats();
    assert!(
        stats.incremental > 0 && stats.last_version >= 13,
        "{stats:?}"
    );
}

/// On Kafka 4, read_committed through incremental fetches delivers each partition's plain and committed
/// records exactly once and nothing aborted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_committed_in_a_session_kafka4() {
    read_committed_in_a_session(ClusterSpec::kafka4()).await;
}

/// On Kafka 3.9, read_committed through incremental fetches delivers each partition's plain and
/// committed records exactly once and nothing aborted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_committed_in_a_session_kafka39() {
    read_committed_in_a_session(ClusterSpec::kafka39()).await;
}

/// A raw Fetch in session `id` at `epoch` with no partitions; the broker's top-level error code.
async fn raw_session_fetch(client: &Client, node: i32, id: i32, epoch: i32) -> ErrorCode {
    let code = client
        .call(
            Target::Broker(node),
            &CallOptions {
                min_version: Some(13),
                ..CallOptions::default()
            },
            |_| {
                FetchRequest::default()
                    .with_replica_id(BrokerId(-1))
                    .with_max_wait_ms(0)
                    .with_min_bytes(0)
                    .with_max_bytes(1 << 20)
                    .with_session_id(id)
                    .with_session_epoch(epoch)
            },
            |r, _| Verdict::Done(r.error_code),
        )
        .await
        .expect("raw fetch");
    ErrorCode::from_code(code)
}

/// A session the broker no longer has (here closed under the reader, as an eviction would drop it)
/// costs one reset: the next Fetch is full, a new session opens, and no record is lost or repeated.
/// `close` then frees the new one on the broker.
async fn lost_session_resets(spec: ClusterSpec) {
    const PARTITIONS: i32 = 4;
    let kafka = cluster(spec).await;
    let c = client(&kafka).await;
    let t = topic(&c, PARTITIONS).await;
    let mut want: BTreeMap<i32, Vec<String>> = BTreeMap::new();
    for p in 0..PARTITIONS {
        produce(&c, &t, p, &values(p, 0, 2)).await;
        want.insert(p, values(p, 0, 2));
    }
    let mut reader =
        PartitionReader::new(c.clone(), reader_config(IsolationLevel::ReadUncommitted));
    assign_all(&mut reader, &t, PARTITIONS);
    let mut got = read_by_partition(&mut reader, 8, Duration::from_secs(20), Duration::ZERO).await;
    let (node, first) = reader
        .fetch_sessions()
        .into_iter()
        .next()
        .expect("a session");

    // Closed by someone else: the broker forgets it, as it does a session it evicts.
    assert_eq!(
        raw_session_fetch(&c, node, first, -1).await,
        ErrorCode::None
    );
    for p in 0..PARTITIONS {
        produce(&c, &t, p, &values(p, 2, 1)).await;
        want.get_mut(&p).unwrap().extend(values(p, 2, 1));
    }
    for (p, v) in read_by_partition(
        &mut reader,
        PARTITIONS as usize,
        Duration::from_secs(20),
        Duration::from_millis(500),
    )
    .await
    {
        got.entry(p).or_default().extend(v);
    }
    expect_exactly(&got, &want);
    let stats = reader.fetch_stats();
    assert_eq!(stats.session_resets, 1, "{stats:?}");
    let second = reader.fetch_sessions()[&node];
    assert_ne!(second, first, "a new session after the reset");

    reader.close().await;
    assert!(reader.fetch_sessions().is_empty());
    assert_eq!(
        raw_session_fetch(&c, node, second, 1).await,
        ErrorCode::FetchSessionIdNotFound,
        "close freed the session on the broker"
    );
}

/// On Kafka 4, a fetch session the broker lost costs exactly one reset and no record lost or repeated,
/// and close frees the new session on the broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_session_resets_kafka4() {
    lost_session_resets(ClusterSpec::kafka4()).await;
}

/// On Kafka 3.9, a fetch session the broker lost costs exactly one reset and no record lost or repeated,
/// and close frees the new session on the broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_session_resets_kafka39() {
    lost_session_resets(ClusterSpec::kafka39()).await;
}

/// A broker restart drops every session and the connection with it: the reader goes on with a new
/// session and delivers every record exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_restart_resets_the_session() {
    const PARTITIONS: i32 = 4;
    let kafka = dedicated(ClusterSpec::kafka4()).await;
    let c = client(&kafka).await;
    let t = topic(&c, PARTITIONS).await;
    let mut want: BTreeMap<i32, Vec<String>> = BTreeMap::new();
    for p in 0..PARTITIONS {
        produce(&c, &t, p, &values(p, 0, 2)).await;
        want.insert(p, values(p, 0, 2));
    }
    let mut reader =
        PartitionReader::new(c.clone(), reader_config(IsolationLevel::ReadUncommitted));
    assign_all(&mut reader, &t, PARTITIONS);
    let mut got = read_by_partition(&mut reader, 8, Duration::from_secs(20), Duration::ZERO).await;
    let (node, first) = reader
        .fetch_sessions()
        .into_iter()
        .next()
        .expect("a session");

    kafka.restart(node).await;
    for p in 0..PARTITIONS {
        produce(&c, &t, p, &values(p, 2, 2)).await;
        want.get_mut(&p).unwrap().extend(values(p, 2, 2));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while got.values().map(Vec::len).sum::<usize>() < 16 && Instant::now() < deadline {
        // Fetches fail while the broker comes back; the reader backs off and goes on.
        match reader.fetch().await {
            Ok(parts) => {
                for part in parts {
                    got.entry(part.partition.partition).or_default().extend(
                        part.records
                            .iter()
                            .map(|r| String::from_utf8(r.value.clone().unwrap().to_vec()).unwrap()),
                    );
                }
            }
            Err(e) => eprintln!("fetch during the restart: {e}"),
        }
    }
    for (p, v) in read_by_partition(
        &mut reader,
        0,
        Duration::from_secs(5),
        Duration::from_millis(500),
    )
    .await
    {
        got.entry(p).or_default().extend(v);
    }
    expect_exactly(&got, &want);
    let second = reader.fetch_sessions().get(&node).copied();
    assert!(
        second.is_some_and(|s| s != 0 && s != first),
        "a new session after the restart: {second:?} (was {first})"
    );
}

// ------------------------------------------------------------------------------- the measurement

#[derive(Default)]
struct Cell(AtomicU64);

impl CounterFn for Cell {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::Relaxed);
    }
    fn absolute(&self, value: u64) {
        self.0.fetch_max(value, Ordering::Relaxed);
    }
}

/// Keeps the counters it is told about; gauges and histograms go nowhere.
#[derive(Default)]
struct Counters(Mutex<HashMap<String, Arc<Cell>>>);

impl Counters {
    fn get(&self, name: &str) -> u64 {
        let cells = self.0.lock().unwrap();
        cells.get(name).map_or(0, |c| c.0.load(Ordering::Relaxed))
    }
}

impl Recorder for Counters {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let mut cells = self.0.lock().unwrap();
        Counter::from_arc(cells.entry(key.name().to_owned()).or_default().clone())
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

/// Per poll of one reader: Fetch requests, and the bytes on the wire each way.
#[derive(Debug, Default, Clone, Copy)]
struct PerPoll {
    requests: f64,
    sent: f64,
    received: f64,
}

/// `polls` polls of `reader`, before each of which `active` partitions get one new record.
async fn measure(
    rec: &Counters,
    producer: &Client,
    topic: &str,
    reader: &mut PartitionReader,
    polls: usize,
    active: i32,
    next_value: &mut usize,
) -> PerPoll {
    let (mut sent, mut received) = (0, 0);
    let requests = reader.fetch_stats().requests;
    for poll in 0..polls {
        for i in 0..active {
            let p = (poll as i32 * active + i) % 64;
            produce(producer, topic, p, &values(p, *next_value, 1)).await;
            *next_value += 1;
        }
        let (s, r) = (
            rec.get("snapfence_network_sent_bytes_total"),
            rec.get("snapfence_network_received_bytes_total"),
        );
        reader.fetch().await.expect("fetch");
        sent += rec.get("snapfence_network_sent_bytes_total") - s;
        received += rec.get("snapfence_network_received_bytes_total") - r;
    }
    let n = polls as f64;
    PerPoll {
        requests: (reader.fetch_stats().requests - requests) as f64 / n,
        sent: sent as f64 / n,
        received: received as f64 / n,
    }
}

/// What a session saves a member reading 64 partitions with few records each, against the same reader
/// without sessions (every Fetch lists all 64 and the broker answers for all 64), on the same broker
/// in one run: per poll when nothing is new, and when 4 partitions have one new record each. Prints
/// the figures; fails if the session does not send and receive fewer bytes when idle.
#[test]
fn measure_64_partitions_per_poll() {
    let rec = Counters::default();
    let figures = metrics::with_local_recorder(&rec, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let kafka = cluster(ClusterSpec::kafka4()).await;
                let producer = client(&kafka).await;
                let t = topic(&producer, 64).await;
                for p in 0..64 {
                    produce(&producer, &t, p, &values(p, 0, 3)).await;
                }
                let mut next = 100;
                let mut out = Vec::new();
                for sessions in [false, true] {
                    let c = client(&kafka).await;
                    let config = reader_config(IsolationLevel::ReadUncommitted);
                    let mut reader = if sessions {
                        PartitionReader::new(c, config)
                    } else {
                        PartitionReader::sessionless(c, config)
                    };
                    assign_all(&mut reader, &t, 64);
                    // The 3 records of each partition, and what the measurements before wrote.
                    let want = 192 + (next - 100);
                    let got = read_by_partition(
                        &mut reader,
                        want,
                        Duration::from_secs(30),
                        Duration::ZERO,
                    )
                    .await;
                    assert_eq!(got.values().map(Vec::len).sum::<usize>(), want);
                    reader.fetch().await.expect("fetch");
                    let idle = measure(&rec, &producer, &t, &mut reader, 10, 0, &mut next).await;
                    let active = measure(&rec, &producer, &t, &mut reader, 10, 4, &mut next).await;
                    out.push((sessions, idle, active, reader.fetch_stats()));
                }
                out
            })
    });
    for (sessions, idle, active, stats) in &figures {
        eprintln!(
            "64 partitions, {}: idle poll {:.1} req, {:.0} B sent, {:.0} B received; \
             4 new records per poll {:.1} req, {:.0} B sent, {:.0} B received (Fetch v{})",
            if *sessions { "session" } else { "sessionless" },
            idle.requests,
            idle.sent,
            idle.received,
            active.requests,
            active.sent,
            active.received,
            stats.last_version,
        );
    }
    let (_, before, _, _) = figures[0];
    let (_, after, _, _) = figures[1];
    assert!(after.sent < before.sent / 4.0, "{before:?} -> {after:?}");
    assert!(
        after.received < before.received / 4.0,
        "{before:?} -> {after:?}"
    );
}
