//! The client through a custom `Dialer` and the fixture's fault-injecting proxy, against a real broker:
//! plain traffic passes, a partition fails requests with the net layer's typed timeout (and heals), a
//! cut response fails the request as a dead connection, and a Produce whose answer is lost is retried
//! by the idempotent producer without a duplicate in the log, or reported as of unknown outcome once
//! its delivery timeout runs out; inside a transaction, lost Produce and EndTxn answers are resent and
//! the committed records appear once. The lost-answer tests run on Kafka 4.4 (TV2, and TV1 where
//! transactions are involved) and on 3.9, whose transactions predate KIP-890.
//!
//! # References
//! - KIP-98 (idempotent producer: sequence numbers let the broker drop a retried batch it already has)

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::MetadataRequest;
use protocol_tests::{cluster, unique, ClusterSpec, Fault, FaultProxy, KafkaCluster, Requests};
use snapfence::consumer::{committed_offsets, PartitionReader, ReaderConfig, StartAt};
use snapfence::net::{
    CallOptions, Client, ClientConfig, ConnectionFailure, DialFuture, Dialer, NetError, Target,
    TcpDialer, Verdict,
};
use snapfence::producer::{
    Producer, ProducerConfig, ProducerError, ProducerRecord, TopicPartition, TransactionalConfig,
    TransactionalProducer,
};
use snapfence::records::{visible_in, AbortedTransaction, IsolationLevel};
use snapfence::ErrorCode;

const PRODUCE: i16 = 0;
const METADATA: i16 = 3;

/// Sends every broker address to its proxy listener, and refuses any address the proxy does not
/// stand for, so nothing in these tests can reach a broker around the proxy.
#[derive(Debug)]
struct ViaProxy(HashMap<String, String>);

impl Dialer for ViaProxy {
    fn dial<'a>(&'a self, addr: &'a str, tcp: &'a TcpDialer) -> DialFuture<'a> {
        match self.0.get(addr) {
            Some(local) => tcp.connect(local),
            None => Box::pin(async move {
                Err(std::io::Error::other(format!(
                    "{addr} has no proxy listener"
                )))
            }),
        }
    }
}

struct Setup {
    proxy: FaultProxy,
    client: Client,
    /// The one broker's address, the proxy's key for it.
    broker: String,
}

/// A proxy in front of every node of `kafka`, and a client that dials only through it. `None` for an
/// external cluster (its node addresses are not known here).
async fn through_proxy(kafka: &KafkaCluster, request_timeout: Duration) -> Option<Setup> {
    through_proxy_with(kafka, request_timeout, 1).await
}

/// [`through_proxy`] with `connections` connections per broker.
async fn through_proxy_with(
    kafka: &KafkaCluster,
    request_timeout: Duration,
    connections: usize,
) -> Option<Setup> {
    if kafka.is_external() {
        return None;
    }
    let brokers: Vec<String> = kafka
        .node_ids()
        .into_iter()
        .map(|n| kafka.node_address(n))
        .collect();
    let proxy = FaultProxy::start(brokers.clone(), 18).await.expect("proxy");
    let routes = proxy
        .routes()
        .into_iter()
        .map(|(up, local)| (up, local.to_string()))
        .collect();
    let config = ClientConfig {
        request_timeout,
        connect_timeout: Duration::from_secs(10),
        max_retries: 3,
        connections_per_broker: connections,
        ..ClientConfig::new(kafka.bootstrap()).with_dialer(ViaProxy(routes))
    };
    let client = Client::connect(config)
        .await
        .expect("connect through the proxy");
    Some(Setup {
        proxy,
        client,
        broker: brokers[0].clone(),
    })
}

async fn metadata_once(client: &Client) -> Result<(), NetError> {
    client
        .send_once(Target::Any, |_| {
            MetadataRequest::default().with_topics(Some(vec![]))
        })
        .await
        .map(|_| ())
}

/// The error of the single attempt `send_once` makes.
fn attempt(e: NetError) -> NetError {
    match e {
        NetError::RetriesExhausted { last, .. } => *last,
        other => other,
    }
}

/// The values in partition 0 of `topic`, every record up to the high watermark.
async fn values(client: &Client, topic: &str) -> Vec<String> {
    read(client, topic, IsolationLevel::ReadUncommitted).await
}

/// The committed values in partition 0 of `topic`, once no transaction is open on it.
async fn values_committed(client: &Client, topic: &str) -> Vec<String> {
    loop {
        let (hw, lso) = ends(client, topic).await;
        if hw == lso {
            return read(client, topic, IsolationLevel::ReadCommitted).await;
        }
        // The commit's markers are written after the commit returns.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn ends(client: &Client, topic: &str) -> (i64, i64) {
    let p = fetch(client, topic, 0, IsolationLevel::ReadUncommitted).await;
    (p.high_watermark, p.last_stable_offset)
}

async fn fetch(
    client: &Client,
    topic: &str,
    offset: i64,
    isolation: IsolationLevel,
) -> kafka_protocol::messages::fetch_response::PartitionData {
    let build = |_v: i16| protocol_tests::fetch_by_name(topic, 0, offset, isolation);
    let options = CallOptions {
        max_version: Some(12),
        ..CallOptions::default()
    };
    let mut resp = client
        .call(Target::leader(topic, 0), &options, build, |r, _| {
            Verdict::Done(r)
        })
        .await
        .expect("fetch");
    let p = resp.responses.swap_remove(0).partitions.swap_remove(0);
    assert_eq!(ErrorCode::from_code(p.error_code), ErrorCode::None);
    p
}

/// Every value a reader at `isolation` sees in partition 0, up to where it may read.
async fn read(client: &Client, topic: &str, isolation: IsolationLevel) -> Vec<String> {
    let mut offset = 0i64;
    let mut out = Vec::new();
    loop {
        let p = fetch(client, topic, offset, isolation).await;
        let end = match isolation {
            IsolationLevel::ReadCommitted => p.last_stable_offset,
            IsolationLevel::ReadUncommitted => p.high_watermark,
        };
        let aborted: Vec<AbortedTransaction> = p
            .aborted_transactions
            .iter()
            .flatten()
            .map(|a| AbortedTransaction {
                producer_id: a.producer_id.0,
                first_offset: a.first_offset,
            })
            .collect();
        let bytes = p.records.clone().unwrap_or_default();
        let v = visible_in(bytes, &aborted, isolation, offset).expect("batches");
        for r in v.iter() {
            out.push(String::from_utf8_lossy(r.value().unwrap_or_default()).into_owned());
        }
        offset = v.next_offset.max(offset);
        if offset >= end {
            return out;
        }
    }
}

async fn topic(client: &Client, prefix: &str) -> String {
    let name = unique(prefix);
    snapfence::admin::create_topic(client, &name, 1, -1, &[])
        .await
        .expect("create topic");
    name
}

fn producer_config(request_timeout: Duration, delivery_timeout: Duration) -> ProducerConfig {
    let mut c = ProducerConfig::default();
    c.linger = Duration::from_millis(1);
    c.request_timeout = request_timeout;
    c.delivery_timeout = delivery_timeout;
    c
}

fn record(topic: &str, v: &str) -> ProducerRecord {
    ProducerRecord::new(topic, Some(Bytes::copy_from_slice(v.as_bytes()))).partition(0)
}

/// Waits (without a deadline of its own: the test's runner bounds it) until `done` holds.
async fn until(mut done: impl FnMut() -> bool) {
    while !done() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Through an untroubled proxy everything works: metadata, topic creation, produce, fetch, and every
/// byte went through the proxy.
#[tokio::test]
async fn pass_through_carries_metadata_produce_and_fetch() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let Some(s) = through_proxy(&kafka, Duration::from_secs(30)).await else {
        return;
    };
    metadata_once(&s.client).await.expect("metadata");
    let topic = topic(&s.client, "dial-pass").await;
    let producer = Producer::new(
        s.client.clone(),
        producer_config(Duration::from_secs(30), Duration::from_secs(120)),
    )
    .await
    .expect("producer");
    let mut deliveries = Vec::new();
    for v in ["a", "b", "c"] {
        deliveries.push(producer.send(record(&topic, v)).await.expect("send"));
    }
    producer.flush().await;
    for d in deliveries {
        d.await.expect("delivered");
    }
    assert_eq!(values(&s.client, &topic).await, ["a", "b", "c"]);
    let stats = s.proxy.stats(&s.broker).expect("stats");
    assert!(stats.connections >= 1 && stats.requests >= 5, "{stats:?}");
    assert_eq!(stats.requests, stats.responses, "{stats:?}");
    s.proxy.check().expect("no proxy failure");
}

/// A partition (accepted, never answered, never reset) fails a request with the net layer's typed
/// timeout instead of hanging, and the client works again once it heals.
#[tokio::test]
async fn a_blackholed_broker_times_out_typed_and_recovers_after_heal() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let Some(s) = through_proxy(&kafka, Duration::from_secs(2)).await else {
        return;
    };
    metadata_once(&s.client)
        .await
        .expect("metadata before the cut");
    s.proxy.set(&s.broker, Fault::Blackhole).expect("cut");
    let err = attempt(metadata_once(&s.client).await.expect_err("no answer"));
    assert!(
        matches!(
            err,
            NetError::Timeout {
                outcome_unknown: true,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(s.proxy.stats(&s.broker).expect("stats").held >= 1);
    s.proxy.heal();
    metadata_once(&s.client).await.expect("metadata after heal");
    s.proxy.check().expect("no proxy failure");
}

/// A response cut half-way, then reset, fails the request as a dead connection, not as bad bytes.
#[tokio::test]
async fn a_response_reset_midway_fails_as_a_dead_connection() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let Some(s) = through_proxy(&kafka, Duration::from_secs(30)).await else {
        return;
    };
    metadata_once(&s.client).await.expect("metadata before");
    s.proxy
        .set(
            &s.broker,
            Fault::ResetMidResponse(Requests::ApiKeys(vec![METADATA])),
        )
        .expect("set");
    let err = attempt(metadata_once(&s.client).await.expect_err("cut"));
    assert!(
        matches!(
            &err,
            NetError::Connection {
                failure: ConnectionFailure::ClosedMidFrame | ConnectionFailure::Io(_),
                outcome_unknown: true,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(s.proxy.stats(&s.broker).expect("stats").resets, 1);
    s.proxy.heal();
    metadata_once(&s.client).await.expect("metadata after heal");
}

/// A Produce that lands but whose answer is lost is sent again with the same sequence number, and the
/// broker keeps one copy: the record is delivered and appears once in the log.
#[tokio::test]
async fn a_lost_produce_answer_is_retried_without_a_duplicate() {
    for spec in produce_legs() {
        lost_produce_answer_is_retried_without_a_duplicate_on(spec).await;
    }
}

async fn lost_produce_answer_is_retried_without_a_duplicate_on(spec: ClusterSpec) {
    let kafka = cluster(spec).await;
    let Some(s) = through_proxy(&kafka, Duration::from_secs(30)).await else {
        return;
    };
    let topic = topic(&s.client, "dial-lost").await;
    let producer = Producer::new(
        s.client.clone(),
        producer_config(Duration::from_secs(2), Duration::from_secs(120)),
    )
    .await
    .expect("producer");
    s.proxy
        .set(
            &s.broker,
            Fault::DropResponses(Requests::ApiKeys(vec![PRODUCE])),
        )
        .expect("set");
    let delivery = producer.send(record(&topic, "once")).await.expect("send");
    until(|| {
        s.proxy
            .stats(&s.broker)
            .is_ok_and(|st| st.dropped_responses >= 1)
    })
    .await;
    s.proxy.heal();
    let meta = delivery.await.expect("delivered after the retry");
    // The broker answers a duplicate with the first copy's offset (or, in old releases, none).
    assert!(matches!(meta.offset, Some(0) | None), "{meta:?}");
    assert_eq!(
        values(&s.client, &topic).await,
        ["once"],
        "one copy in the log"
    );
    s.proxy.check().expect("no proxy failure");
}

/// With three connections per broker, Produce answers are cut mid-frame on the connections of a burst
/// over six partitions (at least three cuts, each a dead connection with its requests of unknown
/// outcome): every record is delivered, and each partition holds its records once and in the order
/// sent, as the sequencer resends each connection's unanswered batches and the broker drops what it
/// already had.
#[tokio::test]
async fn cut_answers_on_several_connections_leave_each_partition_once_and_in_order() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let Some(s) = through_proxy_with(&kafka, Duration::from_secs(30), 3).await else {
        return;
    };
    let partitions = 6;
    let per_partition = 200;
    let topic = unique("dial-pool");
    snapfence::admin::create_topic(&s.client, &topic, partitions, -1, &[])
        .await
        .expect("create topic");
    let producer = Producer::new(
        s.client.clone(),
        producer_config(Duration::from_secs(2), Duration::from_secs(120)),
    )
    .await
    .expect("producer");
    let value = |p: i32, i: usize| Bytes::from(format!("{p}-{i}"));
    let send =
        |p: i32, i: usize| ProducerRecord::new(topic.as_str(), Some(value(p, i))).partition(p);
    // One record per partition first, so that all three connections are open before the cuts.
    for p in 0..partitions {
        producer
            .send(send(p, 0))
            .await
            .expect("send")
            .await
            .expect("warm-up");
    }
    s.proxy
        .set(
            &s.broker,
            Fault::ResetMidResponse(Requests::ApiKeys(vec![PRODUCE])),
        )
        .expect("set");
    let mut deliveries = Vec::new();
    for i in 1..per_partition {
        for p in 0..partitions {
            deliveries.push(producer.send(send(p, i)).await.expect("send"));
        }
    }
    until(|| s.proxy.stats(&s.broker).is_ok_and(|st| st.resets >= 3)).await;
    s.proxy.heal();
    for d in deliveries {
        d.await.expect("delivered after the resends");
    }
    producer.close().await;
    let mut config = ReaderConfig::default();
    config.max_wait = Duration::from_millis(100);
    let mut reader = PartitionReader::new(s.client.clone(), config);
    for p in 0..partitions {
        reader.assign(TopicPartition::new(topic.as_str(), p), StartAt::Earliest);
    }
    let mut read: BTreeMap<i32, Vec<Bytes>> = BTreeMap::new();
    while read.values().map(Vec::len).sum::<usize>() < partitions as usize * per_partition {
        for part in reader.fetch().await.expect("fetch") {
            read.entry(part.partition.partition)
                .or_default()
                .extend(part.records.into_iter().filter_map(|r| r.value));
        }
    }
    for p in 0..partitions {
        let expected: Vec<Bytes> = (0..per_partition).map(|i| value(p, i)).collect();
        assert!(read[&p] == expected, "partition {p}: {:?}", read[&p]);
    }
    assert!(s.proxy.stats(&s.broker).expect("stats").resets >= 3);
    s.proxy.check().expect("no proxy failure");
}

/// When no answer ever comes back before the delivery timeout, the idempotent producer reports the
/// outcome as unknown, not as a failure: and indeed the record was written, once.
#[tokio::test]
async fn a_produce_never_answered_is_reported_as_unknown_and_was_written_once() {
    for spec in produce_legs() {
        produce_never_answered_is_reported_as_unknown_and_was_written_once_on(spec).await;
    }
}

async fn produce_never_answered_is_reported_as_unknown_and_was_written_once_on(spec: ClusterSpec) {
    let kafka = cluster(spec).await;
    let Some(s) = through_proxy(&kafka, Duration::from_secs(30)).await else {
        return;
    };
    let topic = topic(&s.client, "dial-unknown").await;
    let producer = Producer::new(
        s.client.clone(),
        producer_config(Duration::from_secs(2), Duration::from_secs(8)),
    )
    .await
    .expect("producer");
    s.proxy
        .set(
            &s.broker,
            Fault::DropResponses(Requests::ApiKeys(vec![PRODUCE])),
        )
        .expect("set");
    let delivery = producer.send(record(&topic, "maybe")).await.expect("send");
    let err = delivery.await.expect_err("no answer ever came");
    assert!(
        matches!(
            err,
            ProducerError::DeliveryOutcomeUnknown {
                transactional: false,
                ..
            }
        ) && err.is_outcome_unknown(),
        "{err:?}"
    );
    assert!(s.proxy.stats(&s.broker).expect("stats").dropped_responses >= 1);
    s.proxy.heal();
    assert_eq!(values(&s.client, &topic).await, ["maybe"], "written, once");
    s.proxy.check().expect("no proxy failure");
}

const END_TXN: i16 = 26;

fn txn_config(id: &str) -> TransactionalConfig {
    let mut c = TransactionalConfig::new(id);
    c.operation_timeout = Duration::from_secs(60);
    c.producer.linger = Duration::from_millis(1);
    c.producer.request_timeout = Duration::from_secs(2);
    c
}

/// Inside a transaction, a lost Produce answer and then a lost EndTxn answer: the batch is resent
/// and kept once, the commit is sent again and holds, and a read_committed reader sees each record
/// exactly once. On transaction version 2 and 1 (TV1 adds partitions with AddPartitionsToTxn and
/// ends without an epoch bump, so the resent EndTxn meets a different coordinator path).
#[tokio::test]
async fn lost_answers_inside_a_transaction_neither_duplicate_nor_lose() {
    for spec in [
        ClusterSpec::kafka4(),
        ClusterSpec::kafka4_tv1(),
        ClusterSpec::kafka39(),
    ] {
        lost_answers_inside_a_transaction(spec).await;
    }
}

async fn lost_answers_inside_a_transaction(spec: ClusterSpec) {
    let tv = expected_tv(&spec);
    let kafka = cluster(spec).await;
    let Some(s) = through_proxy(&kafka, Duration::from_secs(3)).await else {
        return;
    };
    let topic = topic(&s.client, "dial-txn").await;
    let mut p = TransactionalProducer::init(s.client.clone(), txn_config(&unique("dial-txn")))
        .await
        .expect("init");
    p.begin().expect("begin");
    assert_eq!(
        i16::from(p.transaction_version()),
        tv,
        "the leg runs the version it names"
    );
    s.proxy
        .set(
            &s.broker,
            Fault::DropResponses(Requests::ApiKeys(vec![PRODUCE])),
        )
        .expect("set");
    let first = p.send(record(&topic, "one")).await.expect("send");
    until(|| {
        s.proxy
            .stats(&s.broker)
            .is_ok_and(|st| st.dropped_responses >= 1)
    })
    .await;
    s.proxy.heal();
    first.await.expect("delivered after the resend");
    let second = p.send(record(&topic, "two")).await.expect("send");
    second.await.expect("delivered");

    s.proxy
        .set(
            &s.broker,
            Fault::DropResponses(Requests::ApiKeys(vec![END_TXN])),
        )
        .expect("set");
    let dropped_before = s.proxy.stats(&s.broker).expect("stats").dropped_responses;
    let (committed, ()) = tokio::join!(p.commit(), async {
        until(|| {
            s.proxy
                .stats(&s.broker)
                .is_ok_and(|st| st.dropped_responses > dropped_before)
        })
        .await;
        s.proxy.heal();
    });
    committed.expect("the commit, sent again, holds");
    assert_eq!(values_committed(&s.client, &topic).await, ["one", "two"]);
    s.proxy.check().expect("no proxy failure");
}

/// The transaction version a leg's cluster runs: what it was formatted with, else the release's
/// default (2 from 4.0, 1 before: 3.9 has no KIP-890 part 2).
fn expected_tv(spec: &ClusterSpec) -> i16 {
    spec.transaction_version
        .unwrap_or(if spec.version.major() >= 4 { 2 } else { 1 })
}

/// The Kafka releases the lost-answer tests run on: the newest, and 3.9 (the last 3.x, before
/// KIP-890: no epoch bump per transaction, and its own Produce and EndTxn versions).
fn produce_legs() -> [ClusterSpec; 2] {
    [ClusterSpec::kafka4(), ClusterSpec::kafka39()]
}

/// Added latency with jitter, both ways, slows every exchange (each answer waits at least twice the
/// base) but breaks none: produced records arrive once and in order.
#[tokio::test]
async fn latency_slows_but_breaks_nothing() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let Some(s) = through_proxy(&kafka, Duration::from_secs(30)).await else {
        return;
    };
    let topic = topic(&s.client, "dial-slow").await;
    let base = Duration::from_millis(100);
    s.proxy
        .set(
            &s.broker,
            Fault::Latency {
                base,
                jitter: Duration::from_millis(100),
            },
        )
        .expect("set");
    let started = tokio::time::Instant::now();
    metadata_once(&s.client).await.expect("metadata");
    assert!(started.elapsed() >= base * 2, "{:?}", started.elapsed());
    let producer = Producer::new(
        s.client.clone(),
        producer_config(Duration::from_secs(30), Duration::from_secs(120)),
    )
    .await
    .expect("producer");
    let mut deliveries = Vec::new();
    for v in ["x", "y", "z"] {
        deliveries.push(producer.send(record(&topic, v)).await.expect("send"));
    }
    producer.flush().await;
    for d in deliveries {
        d.await.expect("delivered");
    }
    s.proxy.heal();
    assert_eq!(values(&s.client, &topic).await, ["x", "y", "z"]);
    s.proxy.check().expect("no proxy failure");
}

const ADD_OFFSETS_TO_TXN: i16 = 25;
const TXN_OFFSET_COMMIT: i16 = 28;

/// The committed offset of `group` for partition 0 of `topic` (pending transactional offsets waited
/// out).
async fn committed(client: &Client, group: &str, topic: &str) -> Option<i64> {
    let tp = TopicPartition::new(topic, 0);
    committed_offsets(client, group, std::slice::from_ref(&tp))
        .await
        .expect("committed offsets")
        .get(&tp)
        .copied()
        .flatten()
}

/// A TxnOffsetCommit that lands but whose answer is lost (twice) is sent again inside the same
/// transaction; the commit holds once: the record is read once, the group's offset is the one sent,
/// and the next transaction moves it on. TV2 and TV1 (where AddOffsetsToTxn comes first).
#[tokio::test]
async fn lost_txn_offset_commit_answers_commit_once() {
    for spec in [
        ClusterSpec::kafka4(),
        ClusterSpec::kafka4_tv1(),
        ClusterSpec::kafka39(),
    ] {
        let kafka = cluster(spec).await;
        let Some(s) = through_proxy(&kafka, Duration::from_secs(2)).await else {
            return;
        };
        let out = topic(&s.client, "dial-toc-out").await;
        let input = topic(&s.client, "dial-toc-in").await;
        let group = unique("dial-toc-g");
        let member = protocol_tests::join_classic(&s.client, &group, "", 60_000)
            .await
            .expect("join");
        let mut p = TransactionalProducer::init(s.client.clone(), txn_config(&unique("dial-toc")))
            .await
            .expect("init");
        p.begin().expect("begin");
        p.send(record(&out, "first"))
            .await
            .expect("send")
            .await
            .expect("delivered");
        s.proxy
            .set(
                &s.broker,
                Fault::DropResponses(Requests::ApiKeys(vec![
                    ADD_OFFSETS_TO_TXN,
                    TXN_OFFSET_COMMIT,
                ])),
            )
            .expect("set");
        let before = s.proxy.stats(&s.broker).expect("stats").dropped_responses;
        let (sent, ()) = tokio::join!(
            p.send_offsets(
                [(TopicPartition::new(input.as_str(), 0), 7.into())],
                &member
            ),
            async {
                // Two answers lost: the first attempt and its first resend.
                until(|| {
                    s.proxy
                        .stats(&s.broker)
                        .is_ok_and(|st| st.dropped_responses >= before + 2)
                })
                .await;
                s.proxy.heal();
            }
        );
        sent.expect("the offset commit, sent again, is answered");
        p.commit().await.expect("commit");
        assert_eq!(values_committed(&s.client, &out).await, ["first"]);
        assert_eq!(committed(&s.client, &group, &input).await, Some(7));

        // The next transaction, with nothing lost, moves the offset on: nothing of the resends is
        // left pending to hold it back.
        p.begin().expect("begin");
        p.send_offsets(
            [(TopicPartition::new(input.as_str(), 0), 9.into())],
            &member,
        )
        .await
        .expect("offsets");
        p.commit().await.expect("commit");
        assert_eq!(committed(&s.client, &group, &input).await, Some(9));
        assert_eq!(values_committed(&s.client, &out).await, ["first"]);
        s.proxy.check().expect("no proxy failure");
    }
}

/// Every EndTxn answer lost until the operation timeout: the request landed, so the commit happened,
/// but the producer cannot know; it reports `CommitOutcomeUnknown` (class outcome-unknown, never a
/// plain failure), refuses to abort, and after the heal the commit called again finds it done. A next
/// owner of the transactional id then starts cleanly, and read_committed sees each record once.
#[tokio::test]
async fn an_end_txn_never_answered_is_reported_unknown_and_the_next_owner_finds_it_committed() {
    for spec in [
        ClusterSpec::kafka4(),
        ClusterSpec::kafka4_tv1(),
        ClusterSpec::kafka39(),
    ] {
        let kafka = cluster(spec).await;
        let Some(s) = through_proxy(&kafka, Duration::from_secs(2)).await else {
            return;
        };
        let out = topic(&s.client, "dial-endtxn").await;
        let id = unique("dial-endtxn");
        let mut config = txn_config(&id);
        config.operation_timeout = Duration::from_secs(6);
        let mut p = TransactionalProducer::init(s.client.clone(), config.clone())
            .await
            .expect("init");
        p.begin().expect("begin");
        p.send(record(&out, "one"))
            .await
            .expect("send")
            .await
            .expect("delivered");
        s.proxy
            .set(
                &s.broker,
                Fault::DropResponses(Requests::ApiKeys(vec![END_TXN])),
            )
            .expect("set");
        let started = tokio::time::Instant::now();
        let err = p.commit().await.expect_err("no EndTxn answer ever came");
        let waited = started.elapsed();
        assert!(
            matches!(err, ProducerError::CommitOutcomeUnknown { .. }) && err.is_outcome_unknown(),
            "{err:?}"
        );
        assert!(
            waited < Duration::from_secs(20),
            "bounded by the operation timeout: {waited:?}"
        );
        assert!(s.proxy.stats(&s.broker).expect("stats").dropped_responses >= 1);
        let refused = p
            .abort()
            .await
            .expect_err("no abort while the commit may land");
        assert!(
            matches!(refused, ProducerError::IllegalState { .. }),
            "{refused:?}"
        );
        s.proxy.heal();
        // The commit did land: read_committed shows it before anyone resolves anything.
        assert_eq!(values_committed(&s.client, &out).await, ["one"]);
        p.commit()
            .await
            .expect("the commit called again finds it done");
        // A next owner of the id fences this one and commits its own transaction on top.
        let mut next = TransactionalProducer::init(s.client.clone(), config)
            .await
            .expect("the next owner's init");
        next.begin().expect("begin");
        next.send(record(&out, "two"))
            .await
            .expect("send")
            .await
            .expect("delivered");
        next.commit().await.expect("commit");
        assert_eq!(values_committed(&s.client, &out).await, ["one", "two"]);
        p.begin().expect("begin");
        let stale = p.send(record(&out, "stale")).await.expect("queued");
        let late = match stale.await {
            Err(e) => Err(e),
            Ok(_) => p.commit().await,
        };
        let late = late.expect_err("the old owner is fenced");
        assert!(late.is_fatal() || late.is_abortable(), "{late:?}");
        assert_eq!(values_committed(&s.client, &out).await, ["one", "two"]);
        s.proxy.check().expect("no proxy failure");
    }
}

/// A deadline for one step of a test, so a hang fails with what hung instead of running forever.
async fn within<T>(what: &str, d: Duration, f: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(d, f).await {
        Ok(v) => v,
        Err(_) => panic!("{what} hung for more than {d:?}"),
    }
}

/// On three nodes, only the group coordinator's node is cut off (blackholed) while the transaction
/// coordinator's node and the record's partition leader stay reachable. The transaction's writes go on;
/// the offset commit, which needs the group coordinator, fails typed within the operation timeout; an
/// OffsetFetch fails typed too; nothing hangs. The abort (the transaction coordinator's business)
/// succeeds during the cut, and after the heal the same producer commits records and offsets, once.
#[tokio::test]
async fn a_cut_to_the_group_coordinator_alone_fails_the_offset_commit_typed_and_heals() {
    use snapfence::net::CoordinatorKind;
    let kafka = cluster(ClusterSpec::three_nodes()).await;
    let Some(s) = through_proxy(&kafka, Duration::from_secs(2)).await else {
        return;
    };
    // A group and a transactional id whose coordinators are on different nodes.
    let mut pick = None;
    for _ in 0..50 {
        let (g, t) = (unique("dial-cut-g"), unique("dial-cut-t"));
        let gc = s
            .client
            .coordinator(CoordinatorKind::Group, &g)
            .await
            .expect("group coordinator");
        let tc = s
            .client
            .coordinator(CoordinatorKind::Transaction, &t)
            .await
            .expect("transaction coordinator");
        if gc != tc {
            pick = Some((g, gc, t, tc));
            break;
        }
    }
    let (group, gc, txn_id, tc) = pick.expect("coordinators on different nodes");
    // A one-partition topic led by a node other than the group coordinator's.
    let mut led_elsewhere = None;
    for _ in 0..10 {
        let t = topic(&s.client, "dial-cut-out").await;
        if s.client.leader(&t, 0).await.expect("leader").node != gc {
            led_elsewhere = Some(t);
            break;
        }
    }
    let out = led_elsewhere.expect("a topic not led by the group coordinator's node");
    let input = TopicPartition::new(out.as_str(), 0);
    let member = protocol_tests::join_classic(&s.client, &group, "", 60_000)
        .await
        .expect("join");
    let mut config = txn_config(&txn_id);
    config.operation_timeout = Duration::from_secs(8);
    let mut p = TransactionalProducer::init(s.client.clone(), config)
        .await
        .expect("init");
    let rec = |v: &str| record(&out, v);

    let cut = kafka.node_address(gc);
    s.proxy.set(&cut, Fault::Blackhole).expect("cut");
    p.begin().expect("begin");
    within(
        "a send to a reachable leader",
        Duration::from_secs(30),
        async { p.send(rec("cut-off")).await.expect("send").await },
    )
    .await
    .expect("the record's leader is reachable: delivered");
    let started = tokio::time::Instant::now();
    let err = within(
        "send_offsets during the cut",
        Duration::from_secs(60),
        async { p.send_offsets([(input.clone(), 1.into())], &member).await },
    )
    .await
    .expect_err("the group coordinator is unreachable");
    eprintln!(
        "send_offsets with the group coordinator (node {gc}) cut, transaction coordinator node {tc}: \
         {err:?} after {:?}",
        started.elapsed()
    );
    // What 4.4 gives: the operation timeout, abortable (nothing was applied: the requests never
    // reached the coordinator), naming the coordinator lookup's last answer.
    assert!(
        matches!(err, ProducerError::Timeout { .. }) && err.is_abortable(),
        "typed, and the transaction must not commit: {err:?}"
    );
    let fetch = within(
        "OffsetFetch during the cut",
        Duration::from_secs(60),
        async { committed_offsets(&s.client, &group, std::slice::from_ref(&input)).await },
    )
    .await;
    assert!(fetch.is_err(), "{fetch:?}");
    eprintln!("OffsetFetch during the cut: {fetch:?}");
    assert!(s.proxy.stats(&cut).expect("stats").held >= 1);
    within("abort during the cut", Duration::from_secs(60), p.abort())
        .await
        .expect("the abort goes to the reachable transaction coordinator");

    s.proxy.heal();
    p.begin().expect("begin");
    within(
        "the transaction after the heal",
        Duration::from_secs(90),
        async {
            p.send(rec("healed")).await.expect("send").await?;
            p.send_offsets([(input.clone(), 2.into())], &member).await?;
            p.commit().await
        },
    )
    .await
    .expect("after the heal the transaction commits");
    assert_eq!(committed(&s.client, &group, &out).await, Some(2));
    assert_eq!(
        values_committed(&s.client, &out).await,
        ["healed"],
        "nothing of the aborted transaction"
    );
    s.proxy.check().expect("no proxy failure");
}
