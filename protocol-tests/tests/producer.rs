//! The producer against real brokers: Kafka 4.x with transaction version 2, 4.x formatted with version 1,
//! and 3.9; with the Java client as the oracle for what a transaction makes visible.
//!
//! Our reader here is a small fetch loop over the records layer's visibility engine (the consumer's
//! partition reader is built elsewhere); the Java consumer is the reference it is compared with.
//!
//! A commit returns once the coordinator has logged it; the markers that make the records visible follow
//! asynchronously. Reads that expect every transaction decided therefore wait until the last stable
//! offset has caught up with the high watermark.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::TopicName;
use kafka_protocol::protocol::StrBytes;
use protocol_tests::{cluster, unique, ClusterSpec, KafkaCluster};
use snapfence::net::{CallOptions, Client, ClientConfig, Target, Verdict};
use snapfence::producer::{
    ErrorClass, ProducerError, ProducerRecord, TopicPartition, TransactionState,
    TransactionalConfig, TransactionalProducer,
};
use snapfence::records::{visible_in, AbortedTransaction, IsolationLevel};
use snapfence::ErrorCode;

// ------------------------------------------------------------------------------------------------
// helpers

async fn client(kafka: &KafkaCluster) -> Client {
    Client::connect(ClientConfig::new(kafka.bootstrap()))
        .await
        .expect("connect to the test cluster")
}

async fn new_topic(client: &Client, prefix: &str) -> String {
    let name = unique(prefix);
    snapfence::admin::create_topic(client, &name, 1, -1, &[])
        .await
        .expect("create topic");
    name
}

fn config(txn_id: &str) -> TransactionalConfig {
    let mut c = TransactionalConfig::new(txn_id);
    c.operation_timeout = Duration::from_secs(30);
    c.producer.linger = Duration::from_millis(2);
    c
}

fn record(topic: &str, v: &str) -> ProducerRecord {
    ProducerRecord::new(topic, Some(Bytes::copy_from_slice(v.as_bytes())))
        .key(Bytes::copy_from_slice(v.as_bytes()))
        .partition(0)
}

/// One partition as a reader sees it: `(offset, key, value)` of every delivered record, and the
/// partition's high watermark and last stable offset at the end of the read.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Read {
    records: Vec<(i64, Option<String>, Option<String>)>,
    high_watermark: i64,
    last_stable_offset: i64,
}

impl Read {
    fn values(&self) -> Vec<String> {
        self.records
            .iter()
            .map(|(_, _, v)| v.clone().unwrap_or_default())
            .collect()
    }
}

/// Our reader: fetches partition 0 of `topic` from offset 0 at `isolation` until it reaches the end a
/// reader at that isolation may reach (the LSO at read_committed, the high watermark otherwise), and
/// filters with the records layer's visibility engine.
async fn read(client: &Client, topic: &str, isolation: IsolationLevel) -> Read {
    let mut offset = 0i64;
    let mut records = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let options = CallOptions {
            max_version: Some(12),
            ..CallOptions::default()
        };
        let build = |_v: i16| protocol_tests::fetch_by_name(topic, 0, offset, isolation);
        let resp = client
            .call(Target::leader(topic, 0), &options, build, |r, _| {
                Verdict::Done(r)
            })
            .await
            .expect("fetch");
        let p = &resp.responses[0].partitions[0];
        assert_eq!(
            ErrorCode::from_code(p.error_code),
            ErrorCode::None,
            "fetch error"
        );
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
        let v = visible_in(bytes, &aborted, isolation, offset).expect("decodable batches");
        for r in v.iter() {
            let s = |b: Option<&[u8]>| b.map(|b| String::from_utf8_lossy(b).into_owned());
            records.push((r.offset(), s(r.key()), s(r.value())));
        }
        offset = v.next_offset.max(offset);
        if offset >= end {
            return Read {
                records,
                high_watermark: p.high_watermark,
                last_stable_offset: p.last_stable_offset,
            };
        }
        assert!(
            Instant::now() < deadline,
            "read of {topic} stuck at {offset} < {end}"
        );
    }
}

/// Waits until no transaction is open on the partition (the LSO reached the high watermark), then reads.
async fn read_settled(client: &Client, topic: &str, isolation: IsolationLevel) -> Read {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = read(client, topic, IsolationLevel::ReadUncommitted).await;
        if r.last_stable_offset == r.high_watermark {
            return read(client, topic, isolation).await;
        }
        assert!(
            Instant::now() < deadline,
            "{topic}: a transaction stayed open: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the last stable offset has not moved for a second (markers of finished transactions
/// written; what remains open stays open).
async fn wait_lso_still(client: &Client, topic: &str) {
    let mut last = -1;
    let mut since = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let lso = read(client, topic, IsolationLevel::ReadUncommitted)
            .await
            .last_stable_offset;
        if lso != last {
            last = lso;
            since = Instant::now();
        } else if since.elapsed() >= Duration::from_secs(1) {
            return;
        }
        assert!(Instant::now() < deadline, "{topic}: the LSO kept moving");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn java_binary() -> PathBuf {
    match std::env::var_os("JAVA_HOME").filter(|d| !d.is_empty()) {
        Some(home) => PathBuf::from(home).join("bin").join("java"),
        None => PathBuf::from("java"),
    }
}

fn oracle_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("java/TxnOracle.java")
}

/// Runs the Java oracle with `args` and returns its standard output.
async fn java(kafka: &KafkaCluster, args: Vec<String>) -> String {
    let libs = kafka.libs_dir();
    tokio::task::spawn_blocking(move || {
        let out = Command::new(java_binary())
            .arg("-cp")
            .arg(format!("{}/*", libs.display()))
            .arg(oracle_path())
            .args(&args)
            .output()
            .expect("run java");
        assert!(
            out.status.success(),
            "java {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf-8 output")
    })
    .await
    .expect("java thread")
}

/// What the Java consumer delivers at `isolation`.
async fn java_read(kafka: &KafkaCluster, topic: &str, isolation: IsolationLevel) -> Read {
    let level = match isolation {
        IsolationLevel::ReadCommitted => "read_committed",
        IsolationLevel::ReadUncommitted => "read_uncommitted",
    };
    let args = vec![
        "consume".into(),
        kafka.bootstrap(),
        topic.into(),
        level.into(),
    ];
    let out = java(kafka, args).await;
    let mut records = Vec::new();
    let mut end = -1;
    for line in out.lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        let s = |x: &str| (x != "-").then(|| x.to_owned());
        match parts.as_slice() {
            ["R", offset, key, value] => {
                records.push((offset.parse().unwrap(), s(key), s(value)));
            }
            ["END", e] => end = e.parse().unwrap(),
            _ => {}
        }
    }
    assert!(end >= 0, "the oracle printed no END line:\n{out}");
    Read {
        records,
        high_watermark: end,
        last_stable_offset: end,
    }
}

async fn init(client: &Client, txn_id: &str) -> TransactionalProducer {
    TransactionalProducer::init(client.clone(), config(txn_id))
        .await
        .expect("init")
}

async fn commit_values(p: &mut TransactionalProducer, topic: &str, values: &[&str]) {
    p.begin().unwrap();
    let mut deliveries = Vec::new();
    for v in values {
        deliveries.push(p.send(record(topic, v)).await.unwrap());
    }
    p.commit().await.expect("commit");
    for d in deliveries {
        d.await.expect("delivered");
    }
}

fn specs() -> [(&'static str, ClusterSpec); 3] {
    [
        ("kafka4 tv2", ClusterSpec::kafka4()),
        ("kafka4 tv1", ClusterSpec::kafka4_tv1()),
        ("kafka3.9", ClusterSpec::kafka39()),
    ]
}

// ------------------------------------------------------------------------------------------------
// the basic cycle

/// Commits are visible at read_committed, aborts are not, and each cluster negotiates the transaction
/// version it offers.
#[tokio::test]
async fn commit_and_abort_are_seen_by_our_reader_on_every_version() {
    for (name, spec) in specs() {
        let kafka = cluster(spec).await;
        let client = client(&kafka).await;
        let topic = new_topic(&client, "smoke").await;
        let mut p = init(&client, &unique("tx-smoke")).await;
        let tv = p.transaction_version();
        assert_eq!(
            tv,
            if name == "kafka4 tv2" { 2 } else { 1 },
            "{name} negotiated the wrong transaction version"
        );
        commit_values(&mut p, &topic, &["a", "b"]).await;
        p.begin().unwrap();
        p.send(record(&topic, "x")).await.unwrap().await.unwrap();
        p.abort().await.expect("abort");
        commit_values(&mut p, &topic, &["c"]).await;
        let committed = read_settled(&client, &topic, IsolationLevel::ReadCommitted).await;
        assert_eq!(committed.values(), vec!["a", "b", "c"], "{name} (TV{tv})");
        let all = read(&client, &topic, IsolationLevel::ReadUncommitted).await;
        assert_eq!(all.values(), vec!["a", "b", "x", "c"], "{name} (TV{tv})");
    }
}

// ------------------------------------------------------------------------------------------------
// the Java client as the oracle

/// What we commit the Java consumer delivers at read_committed, what we abort it does not, and at
/// read_uncommitted it sees both; our reader agrees with it record for record, offsets included.
#[tokio::test]
async fn java_reads_what_we_commit_and_not_what_we_abort() {
    for (name, spec) in specs() {
        let kafka = cluster(spec).await;
        let client = client(&kafka).await;
        let topic = new_topic(&client, "oracle-ours").await;
        let mut p = init(&client, &unique("tx-oracle")).await;
        commit_values(&mut p, &topic, &["c1", "c2"]).await;
        p.begin().unwrap();
        for v in ["a1", "a2"] {
            p.send(record(&topic, v)).await.unwrap().await.unwrap();
        }
        p.abort().await.unwrap();
        commit_values(&mut p, &topic, &["c3"]).await;
        let ours_rc = read_settled(&client, &topic, IsolationLevel::ReadCommitted).await;
        let ours_ru = read(&client, &topic, IsolationLevel::ReadUncommitted).await;

        let java_rc = java_read(&kafka, &topic, IsolationLevel::ReadCommitted).await;
        assert_eq!(java_rc.values(), vec!["c1", "c2", "c3"], "{name}");
        let java_ru = java_read(&kafka, &topic, IsolationLevel::ReadUncommitted).await;
        assert_eq!(
            java_ru.values(),
            vec!["c1", "c2", "a1", "a2", "c3"],
            "{name}"
        );
        assert_eq!(ours_rc.records, java_rc.records, "{name}: read_committed");
        assert_eq!(ours_ru.records, java_ru.records, "{name}: read_uncommitted");
    }
}

/// Java writes interleaved commits, aborts, plain writes and transactions left open; our reader (the
/// visibility engine over raw fetches) delivers exactly what Java's read_committed consumer delivers,
/// and stops at the same last stable offset.
#[tokio::test]
async fn our_reader_matches_java_over_interleaved_transactions() {
    let script = "c:a+b,a:x+y,n:p,c:c,o:open1,c:d,a:z,o:open2,c:e,n:q";
    for (name, spec) in specs() {
        let kafka = cluster(spec).await;
        let client = client(&kafka).await;
        let topic = new_topic(&client, "oracle-java").await;
        let args = vec![
            "produce".into(),
            kafka.bootstrap(),
            topic.clone(),
            unique("jtx"),
            script.into(),
        ];
        let out = java(&kafka, args).await;
        assert!(out.contains("DONE"), "{name}: {out}");
        wait_lso_still(&client, &topic).await;
        let java_rc = java_read(&kafka, &topic, IsolationLevel::ReadCommitted).await;
        let ours_rc = read(&client, &topic, IsolationLevel::ReadCommitted).await;
        assert_eq!(ours_rc.records, java_rc.records, "{name}: read_committed");
        assert_eq!(
            ours_rc.last_stable_offset, java_rc.last_stable_offset,
            "{name}: both stop at the first open transaction"
        );
        // The first open transaction pins the LSO: only what precedes it is visible.
        assert_eq!(java_rc.values(), vec!["a", "b", "p", "c"], "{name}");
        let java_ru = java_read(&kafka, &topic, IsolationLevel::ReadUncommitted).await;
        let ours_ru = read(&client, &topic, IsolationLevel::ReadUncommitted).await;
        assert_eq!(ours_ru.records, java_ru.records, "{name}: read_uncommitted");
        assert_eq!(
            ours_ru.values().len(),
            12,
            "{name}: every record, aborted ones included"
        );
    }
}

// ------------------------------------------------------------------------------------------------
// fencing

/// A second producer with the same transactional id fences the first: the first's open transaction is
/// aborted by the second's init (the LSO is back at the high watermark right away, long before the
/// transaction timeout) and the first fails fatally on its next operation.
#[tokio::test]
async fn a_second_init_fences_the_first_and_aborts_its_transaction() {
    for (name, spec) in specs() {
        let kafka = cluster(spec).await;
        let client = client(&kafka).await;
        let topic = new_topic(&client, "fence").await;
        let id = unique("tx-fence");
        let mut first = init(&client, &id).await;
        first.begin().unwrap();
        for v in ["z1", "z2"] {
            first.send(record(&topic, v)).await.unwrap().await.unwrap();
        }
        let open = read(&client, &topic, IsolationLevel::ReadUncommitted).await;
        assert!(
            open.last_stable_offset < open.high_watermark,
            "{name}: the open transaction pins the LSO"
        );
        let started = Instant::now();
        let mut second = init(&client, &id).await;
        // Init returns once the abort is decided; its markers follow within moments, not the 60 s
        // transaction timeout.
        let after = read_settled(&client, &topic, IsolationLevel::ReadUncommitted).await;
        assert_eq!(after.last_stable_offset, after.high_watermark, "{name}");
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{name}: long before the 60 s transaction timeout ({:?})",
            started.elapsed()
        );
        let err = first.commit().await.expect_err("fenced");
        assert!(err.is_fatal(), "{name}: {err}");
        assert!(matches!(err, ProducerError::Fenced { .. }), "{name}: {err}");
        assert_eq!(first.state(), TransactionState::FatalError);
        assert!(first.begin().is_err());
        // The new owner works, and nothing of the fenced transaction ever shows.
        commit_values(&mut second, &topic, &["ok"]).await;
        let rc = read_settled(&client, &topic, IsolationLevel::ReadCommitted).await;
        assert_eq!(rc.values(), vec!["ok"], "{name}");
    }
}

// ------------------------------------------------------------------------------------------------
// KIP-447

use kafka_protocol::messages::offset_fetch_request::{OffsetFetchRequest, OffsetFetchRequestTopic};
use kafka_protocol::messages::GroupId;
use snapfence::GroupMetadata;

/// Joins (or, with its member id, rejoins) `group` as a classic consumer; returns the metadata after
/// the sync. Raw requests: the group consumer is built elsewhere, and only a real generation matters.
async fn join(client: &Client, group: &str, member: &str) -> GroupMetadata {
    protocol_tests::join_classic(client, group, member, 30_000)
        .await
        .expect("join")
}

/// The group's committed offset for partition 0 of `topic`, waiting out pending transactional offsets.
async fn committed_offset(client: &Client, group: &str, topic: &str) -> i64 {
    let build = |_v: i16| {
        OffsetFetchRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(group.to_owned())))
            .with_topics(Some(vec![OffsetFetchRequestTopic::default()
                .with_name(TopicName(StrBytes::from_string(topic.to_owned())))
                .with_partition_indexes(vec![0])]))
            .with_require_stable(true)
    };
    let options = CallOptions {
        max_version: Some(7),
        min_version: Some(7),
        ..CallOptions::default()
    };
    let resp = client
        .call(
            Target::group(group),
            &options,
            build,
            |r, _| match ErrorCode::from_code(r.topics[0].partitions[0].error_code) {
                ErrorCode::UnstableOffsetCommit => Verdict::Retry(ErrorCode::UnstableOffsetCommit),
                _ => Verdict::Done(r),
            },
        )
        .await
        .expect("offset fetch");
    resp.topics[0].partitions[0].committed_offset
}

/// A transactional offset commit with a stale generation, or an unknown member id, is rejected as a
/// commit failure; the transaction aborts and neither its records nor its offset become visible.
#[tokio::test]
async fn stale_generation_and_unknown_member_fence_the_commit() {
    for (name, spec) in specs() {
        let kafka = cluster(spec).await;
        let client = client(&kafka).await;
        let out_topic = new_topic(&client, "fenced-out").await;
        let in_topic = new_topic(&client, "fenced-in").await;
        let group = unique("g");
        let first = join(&client, &group, "").await;
        let mut p = init(&client, &unique("tx-447")).await;
        let offsets = |o: i64| [(TopicPartition::new(in_topic.as_str(), 0), o.into())];

        // The current generation commits.
        p.begin().unwrap();
        let good = p.send(record(&out_topic, "good")).await.unwrap();
        p.send_offsets(offsets(10), &first)
            .await
            .expect("current generation");
        p.commit().await.expect("commit");
        good.await.expect("written");
        assert_eq!(
            committed_offset(&client, &group, &in_topic).await,
            10,
            "{name}"
        );

        // A rebalance moves the group on; the old metadata is now a stale owner's.
        let second = join(&client, &group, first.member_id()).await;
        assert!(second.generation_id() > first.generation_id(), "{name}");
        let unknown =
            GroupMetadata::new(group.as_str(), second.generation_id(), "not-a-member", None)
                .unwrap();
        for (stale, expected) in [
            (&first, ErrorCode::IllegalGeneration),
            (&unknown, ErrorCode::UnknownMemberId),
        ] {
            p.begin().unwrap();
            let _stale = p.send(record(&out_topic, "stale")).await.unwrap();
            let err = p
                .send_offsets(offsets(20), stale)
                .await
                .expect_err("fenced");
            assert!(
                err.is_commit_fenced() && err.is_abortable(),
                "{name}: {err}"
            );
            assert!(
                matches!(err, ProducerError::CommitFenced { code, .. } if code == expected),
                "{name}: expected {expected}, got {err}"
            );
            let refused = p
                .commit()
                .await
                .expect_err("commit refused after the fence");
            assert!(refused.is_commit_fenced(), "{name}: {refused}");
            p.abort().await.expect("abort");
        }
        let rc = read_settled(&client, &out_topic, IsolationLevel::ReadCommitted).await;
        assert_eq!(
            rc.values(),
            vec!["good"],
            "{name}: nothing of the fenced transactions"
        );
        assert_eq!(
            committed_offset(&client, &group, &in_topic).await,
            10,
            "{name}"
        );
        // The current member still commits.
        p.begin().unwrap();
        p.send_offsets(offsets(30), &second)
            .await
            .expect("current member");
        p.commit().await.unwrap();
        assert_eq!(
            committed_offset(&client, &group, &in_topic).await,
            30,
            "{name}"
        );
    }
}

// ------------------------------------------------------------------------------------------------
// transaction timeout

/// A transaction left open past `transaction.timeout.ms` is aborted by the broker, and the producer's
/// next call reports it as fatal: the coordinator bumped the epoch, which the producer cannot tell from a
/// newer owner (TV1: PRODUCER_FENCED; TV2: INVALID_TXN_STATE), and never as a commit that may have
/// happened. A new producer for the same id takes over.
#[tokio::test]
async fn a_timed_out_transaction_is_aborted_and_reported() {
    for (name, spec) in specs() {
        let kafka = cluster(spec).await;
        let client = client(&kafka).await;
        let topic = new_topic(&client, "timeout").await;
        let id = unique("tx-timeout");
        let mut cfg = config(&id);
        cfg.transaction_timeout = Duration::from_secs(2);
        let mut p = TransactionalProducer::init(client.clone(), cfg)
            .await
            .unwrap();
        p.begin().unwrap();
        p.send(record(&topic, "late")).await.unwrap().await.unwrap();
        // The coordinator's abort scan runs every second in the fixture.
        let aborted = read_settled(&client, &topic, IsolationLevel::ReadCommitted).await;
        assert!(aborted.values().is_empty(), "{name}");
        let err = p.commit().await.expect_err("the transaction was aborted");
        eprintln!(
            "{name}: commit after the broker's timeout abort: {err} ({:?})",
            err.class()
        );
        assert_eq!(err.class(), ErrorClass::Fatal, "{name}: {err}");
        assert_eq!(p.state(), TransactionState::FatalError, "{name}");
        let rc = read_settled(&client, &topic, IsolationLevel::ReadCommitted).await;
        assert!(
            rc.values().is_empty(),
            "{name}: the timed-out records stay invisible"
        );
        let mut next = init(&client, &id).await;
        commit_values(&mut next, &topic, &["after"]).await;
        let rc = read_settled(&client, &topic, IsolationLevel::ReadCommitted).await;
        assert_eq!(rc.values(), vec!["after"], "{name}");
    }
}

// ------------------------------------------------------------------------------------------------
// TV2

use kafka_protocol::messages::produce_request::{
    PartitionProduceData, ProduceRequest, TopicProduceData,
};
use kafka_protocol::messages::TransactionalId;
use snapfence::records::{BatchBuilder, Compression, NewRecord, ProducerStamp};

/// Under TV2 every commit bumps the epoch and the producer carries on under the new one; a write with
/// the epoch of a finished transaction is rejected.
#[tokio::test]
async fn tv2_bumps_the_epoch_on_every_commit_and_rejects_stale_epochs() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let client = client(&kafka).await;
    let topic = new_topic(&client, "tv2").await;
    let id = unique("tx-tv2");
    let mut p = init(&client, &id).await;
    assert_eq!(p.transaction_version(), 2);
    let mut seen = vec![p.producer_id_and_epoch().unwrap()];
    for v in ["one", "two", "three"] {
        commit_values(&mut p, &topic, &[v]).await;
        seen.push(p.producer_id_and_epoch().unwrap());
    }
    for w in seen.windows(2) {
        assert!(
            w[1].id != w[0].id || w[1].epoch == w[0].epoch + 1,
            "the epoch did not advance with each commit: {seen:?}"
        );
    }
    // A write stamped with the first transaction's epoch, as a zombie of it would send.
    let stale = seen[0];
    let mut b = BatchBuilder::new(Compression::None, 1 << 20);
    assert!(b
        .try_append(&NewRecord {
            timestamp: 0,
            key: None,
            value: Some(b"zombie"),
            headers: &[],
        })
        .unwrap());
    let batch = b
        .seal(ProducerStamp {
            producer_id: stale.id,
            producer_epoch: stale.epoch,
            base_sequence: 0,
            transactional: true,
        })
        .unwrap();
    let build = |_v: i16| {
        ProduceRequest::default()
            .with_transactional_id(Some(TransactionalId(StrBytes::from_string(id.clone()))))
            .with_acks(-1)
            .with_timeout_ms(10_000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_string(topic.clone())))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(0)
                    .with_records(Some(batch.bytes().clone()))])])
    };
    let options = CallOptions {
        min_version: Some(12),
        max_version: Some(12),
        max_retries: Some(0),
        ..CallOptions::default()
    };
    let resp = client
        .call(
            Target::leader(topic.as_str(), 0),
            &options,
            build,
            |r, _| Verdict::Done(r),
        )
        .await
        .expect("produce answered");
    let code = ErrorCode::from_code(resp.responses[0].partition_responses[0].error_code);
    eprintln!("stale-epoch produce answered {code}");
    assert!(
        matches!(
            code,
            ErrorCode::InvalidProducerEpoch | ErrorCode::ProducerFenced
        ),
        "a stale epoch must be rejected, got {code}"
    );
    let rc = read_settled(&client, &topic, IsolationLevel::ReadCommitted).await;
    assert_eq!(rc.values(), vec!["one", "two", "three"]);
}

// ------------------------------------------------------------------------------------------------
// coordinator failover

/// Three nodes: the transaction coordinator's node is killed mid-transaction. The producer finds the new
/// coordinator; the commit completes or honestly reports an unknown outcome, and a new init completes.
#[tokio::test]
async fn commit_survives_the_coordinator_node_dying() {
    let kafka = protocol_tests::dedicated(ClusterSpec::three_nodes()).await;
    if kafka.is_external() {
        return eprintln!("skipped: node faults need the fixture's own cluster");
    }
    let client = client(&kafka).await;
    let topic = unique("failover");
    snapfence::admin::create_topic(&client, &topic, 1, 3, &[])
        .await
        .expect("create topic");
    let id = unique("tx-failover");
    let mut cfg = config(&id);
    cfg.operation_timeout = Duration::from_secs(60);
    let mut p = TransactionalProducer::init(client.clone(), cfg.clone())
        .await
        .unwrap();
    let coordinator = client
        .coordinator(snapfence::net::CoordinatorKind::Transaction, &id)
        .await
        .unwrap();
    p.begin().unwrap();
    for v in ["f1", "f2"] {
        p.send(record(&topic, v)).await.unwrap().await.unwrap();
    }
    kafka.kill(coordinator);
    let committed = match p.commit().await {
        Ok(()) => true,
        Err(e) if e.is_outcome_unknown() => {
            eprintln!("commit after the coordinator died: {e}");
            p.reinit()
                .await
                .expect("re-initialise after an unknown commit");
            false
        }
        Err(e) => panic!("the commit must complete or be outcome-unknown, got {e}"),
    };
    eprintln!("commit after killing coordinator {coordinator}: committed = {committed}");
    let moved = client
        .coordinator(snapfence::net::CoordinatorKind::Transaction, &id)
        .await
        .unwrap();
    assert_ne!(moved, coordinator, "a new coordinator took over");
    // A new producer for the same id initialises against the new coordinator.
    let mut q = TransactionalProducer::init(client.clone(), cfg)
        .await
        .expect("init");
    commit_values(&mut q, &topic, &["after"]).await;
    let rc = read_settled(&client, &topic, IsolationLevel::ReadCommitted).await;
    let values = rc.values();
    if committed {
        assert_eq!(values, vec!["f1", "f2", "after"]);
    } else {
        assert!(
            values == vec!["f1", "f2", "after"] || values == vec!["after"],
            "all or nothing of the unknown transaction: {values:?}"
        );
    }
}

// ------------------------------------------------------------------------------------------------
// idempotent producer

/// The idempotent producer under a small buffer: `try_send` fails fast (retriable) when the buffer is
/// full, `send` waits for room, and every record lands once, in order per partition.
#[tokio::test]
async fn idempotent_producer_back_pressure_and_delivery() {
    use snapfence::producer::{Producer, ProducerConfig};
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let client = client(&kafka).await;
    let topic = unique("idem");
    snapfence::admin::create_topic(&client, &topic, 3, -1, &[])
        .await
        .unwrap();
    let mut cfg = ProducerConfig::default();
    cfg.buffer_memory = 64 * 1024;
    cfg.batch_size = 16 * 1024;
    cfg.linger = Duration::from_millis(20);
    let producer = Producer::new(client.clone(), cfg).await.unwrap();
    let value = Bytes::from(vec![b'v'; 1000]);
    let mut full = None;
    let mut deliveries = Vec::new();
    for i in 0..200 {
        let r = ProducerRecord::new(topic.as_str(), Some(value.clone())).key(format!("k{i}"));
        match producer.try_send(r) {
            Ok(d) => deliveries.push(d),
            Err(e) => {
                full = Some(e);
                break;
            }
        }
    }
    let full = full.expect("200 KB of records cannot fit a 64 KB buffer");
    assert!(
        matches!(full, ProducerError::BufferFull { .. }) && full.is_retriable(),
        "{full}"
    );
    for i in 0..300 {
        let r = ProducerRecord::new(topic.as_str(), Some(value.clone())).key(format!("w{i}"));
        deliveries.push(producer.send(r).await.expect("send waits for room"));
    }
    producer.flush().await;
    let mut per_partition: std::collections::BTreeMap<i32, Vec<i64>> = Default::default();
    for d in deliveries {
        let m = d.await.expect("written");
        per_partition
            .entry(m.topic_partition.partition)
            .or_default()
            .push(m.offset.expect("offset"));
    }
    let total: usize = per_partition.values().map(Vec::len).sum();
    assert!(total >= 300);
    for offsets in per_partition.values() {
        let expected: Vec<i64> = (0..offsets.len() as i64).collect();
        assert_eq!(offsets, &expected, "once each, in order");
    }
}

/// `send_buffered` must put a partly filled batch on the wire at once instead of after its linger: the
/// group commit relies on it so the last batch of every transaction does not wait out `linger`.
#[tokio::test]
async fn send_buffered_ends_the_linger_of_what_is_buffered() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let client = client(&kafka).await;
    let topic = new_topic(&client, "send-buffered").await;
    let mut c = config(&unique("send-buffered"));
    // Far longer than the assertion below allows: only send_buffered can get the record out in time.
    c.producer.linger = Duration::from_secs(60);
    let mut p = TransactionalProducer::init(client.clone(), c)
        .await
        .expect("init");
    p.begin().unwrap();
    let delivery = p.send(record(&topic, "a")).await.unwrap();
    tokio::pin!(delivery);
    // Still lingering: nothing acknowledges it on its own within a second.
    assert!(
        tokio::time::timeout(Duration::from_secs(1), &mut delivery)
            .await
            .is_err(),
        "a record was acknowledged before its 60 s linger without send_buffered"
    );
    p.send_buffered();
    let acked = tokio::time::timeout(Duration::from_secs(20), &mut delivery)
        .await
        .expect("send_buffered did not end the linger")
        .expect("delivered");
    assert_eq!(acked.offset, Some(0));
    p.commit().await.expect("commit");
    let read = read_settled(&client, &topic, IsolationLevel::ReadCommitted).await;
    assert_eq!(read.records.len(), 1, "{read:?}");
}

/// Every record of `partition` of `topic` from offset 0 to the high watermark, as `(offset, value)`.
/// A fetch refused while leadership moves is retried after a metadata refresh.
async fn read_partition(client: &Client, topic: &str, partition: i32) -> Vec<(i64, String)> {
    let mut offset = 0i64;
    let mut records = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            Instant::now() < deadline,
            "read of {topic}-{partition} stuck at {offset}"
        );
        let options = CallOptions {
            max_version: Some(12),
            ..CallOptions::default()
        };
        let build = |_v: i16| {
            protocol_tests::fetch_by_name(topic, partition, offset, IsolationLevel::ReadUncommitted)
        };
        let resp = client
            .call(Target::leader(topic, partition), &options, build, |r, _| {
                Verdict::Done(r)
            })
            .await
            .expect("fetch");
        let p = &resp.responses[0].partitions[0];
        if ErrorCode::from_code(p.error_code) != ErrorCode::None {
            client.invalidate_leader(topic, partition);
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        let bytes = p.records.clone().unwrap_or_default();
        let v = visible_in(bytes, &[], IsolationLevel::ReadUncommitted, offset)
            .expect("decodable batches");
        for r in v.iter() {
            let value = r.value().map(|b| String::from_utf8_lossy(b).into_owned());
            records.push((r.offset(), value.unwrap_or_default()));
        }
        offset = v.next_offset.max(offset);
        if offset >= p.high_watermark {
            return records;
        }
    }
}

/// Three nodes: the leader of one partition of a six-partition topic is killed during an idempotent
/// burst with several requests in flight per partition. Read back, every partition holds exactly the
/// records acknowledged to it, each once: the resends after the lost connection (whose outcomes were
/// unknown) were deduplicated by their sequences, and nothing after a lost batch slipped in ahead of it.
#[tokio::test]
async fn a_leader_killed_during_a_multi_partition_idempotent_burst_leaves_no_gap_and_no_duplicate()
{
    use snapfence::producer::{Producer, ProducerConfig};
    use std::collections::{BTreeMap, BTreeSet};
    const PARTITIONS: i32 = 6;
    const RECORDS: usize = 6_000;
    let kafka = protocol_tests::dedicated(ClusterSpec::three_nodes()).await;
    if kafka.is_external() {
        return eprintln!("skipped: node faults need the fixture's own cluster");
    }
    let client = client(&kafka).await;
    let topic = unique("idem-kill");
    snapfence::admin::create_topic(&client, &topic, PARTITIONS, 3, &[])
        .await
        .expect("create topic");
    let victim = client.leader(&topic, 0).await.expect("leader").node;
    let mut cfg = ProducerConfig::default();
    cfg.linger = Duration::from_millis(1);
    // Small batches, so every partition has several requests in flight when the leader dies.
    cfg.batch_size = 8 * 1024;
    cfg.retry_backoff = Duration::from_millis(50);
    cfg.delivery_timeout = Duration::from_secs(120);
    let producer = Producer::new(client.clone(), cfg).await.unwrap();
    let value = |seq: usize| format!("{seq:08}-{}", "x".repeat(1000));
    let mut deliveries = Vec::new();
    for seq in 0..RECORDS {
        if seq == RECORDS / 3 {
            kafka.kill(victim);
            eprintln!("killed node {victim}, the leader of {topic}-0, after {seq} records");
        }
        let partition = (seq % PARTITIONS as usize) as i32;
        let r =
            ProducerRecord::new(topic.as_str(), Some(Bytes::from(value(seq)))).partition(partition);
        deliveries.push((seq, partition, producer.send(r).await.expect("send")));
    }
    let mut acked: BTreeMap<i32, BTreeSet<usize>> = BTreeMap::new();
    let mut unknown: BTreeMap<i32, BTreeSet<usize>> = BTreeMap::new();
    for (seq, partition, d) in deliveries {
        match d.await {
            Ok(m) => {
                assert_eq!(m.topic_partition.partition, partition);
                acked.entry(partition).or_default().insert(seq);
            }
            // The only failure an idempotent producer may report here is an honest "may have been
            // written"; those records may appear at most once.
            Err(e) if e.is_outcome_unknown() => {
                eprintln!("record {seq}: {e}");
                unknown.entry(partition).or_default().insert(seq);
            }
            Err(e) => panic!("record {seq} on partition {partition} failed: {e}"),
        }
    }
    let total_acked: usize = acked.values().map(BTreeSet::len).sum();
    eprintln!("acknowledged {total_acked} of {RECORDS}");
    for partition in 0..PARTITIONS {
        let read = read_partition(&client, &topic, partition).await;
        let seqs: Vec<usize> = read
            .iter()
            .map(|(_, v)| v[..8].parse().expect("a sequence number"))
            .collect();
        let distinct: BTreeSet<usize> = seqs.iter().copied().collect();
        assert_eq!(
            distinct.len(),
            seqs.len(),
            "partition {partition}: a duplicate"
        );
        let want = acked.get(&partition).cloned().unwrap_or_default();
        let maybe = unknown.get(&partition).cloned().unwrap_or_default();
        assert!(
            want.is_subset(&distinct),
            "partition {partition}: acknowledged records missing: {:?}",
            want.difference(&distinct).take(10).collect::<Vec<_>>()
        );
        let extra: Vec<_> = distinct
            .difference(&want)
            .filter(|s| !maybe.contains(s))
            .collect();
        assert!(
            extra.is_empty(),
            "partition {partition}: records nobody sent: {extra:?}"
        );
        // Per partition, the log is in send order: sequences rule out a later batch ahead of a lost one.
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "partition {partition}: out of send order"
        );
        // And offsets are contiguous from 0: no gap.
        for (i, (offset, _)) in read.iter().enumerate() {
            assert_eq!(*offset, i as i64, "partition {partition}: a gap");
        }
    }
}
