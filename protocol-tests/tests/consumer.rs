//! The consumer against real Apache Kafka brokers started by the fixture: both isolation levels,
//! ListOffsets at both levels, group membership under the classic protocol (eager and cooperative, on
//! 4.x and 3.9) and the KIP-848 consumer protocol (4.x), generation tracking, eviction, and interop
//! with the Java consumer.
//!
//! Test data is written with raw Produce requests built by the records layer's encoder (plain and
//! transactional), so these tests depend on nothing above the consumer.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    AddPartitionsToTxnRequest, EndTxnRequest, InitProducerIdRequest, ProduceRequest, ProducerId,
    TopicName, TransactionalId,
};
use kafka_protocol::protocol::StrBytes;
use protocol_tests::raw::{
    batch, connect as client, new_topic, produce, produce_raw, reader_config,
};
use protocol_tests::{cluster, dedicated, unique, ClusterSpec, KafkaCluster};
use snapfence::consumer::{
    commit_offsets, list_offsets, Assignor, ConsumerError, GroupConfig, GroupConsumer,
    GroupConsumerConfig, GroupProtocol, LostReason, OffsetReset, OffsetSpec, PartitionReader,
    RebalanceListener, StartAt, TopicPartition,
};
use snapfence::net::{CallOptions, Client, Target, Verdict};
use snapfence::records::{IsolationLevel, ProducerStamp};
use snapfence::ErrorCode;
use tokio::io::{AsyncBufReadExt, BufReader};

// ------------------------------------------------------------------------------------------ helpers

async fn topic(client: &Client, partitions: i32) -> String {
    new_topic(client, "t", partitions).await
}

/// A transaction opened with raw requests (InitProducerId, AddPartitionsToTxn, Produce), left open
/// until `end` is called.
struct RawTxn {
    id: String,
    producer_id: i64,
    epoch: i16,
}

impl RawTxn {
    async fn begin(client: &Client, topic: &str, partition: i32, values: &[&str]) -> RawTxn {
        let id = unique("txn");
        let (producer_id, epoch) = client
            .call(
                Target::transaction(id.as_str()),
                &CallOptions::default(),
                |_| {
                    InitProducerIdRequest::default()
                        .with_transactional_id(Some(TransactionalId(StrBytes::from_string(
                            id.clone(),
                        ))))
                        .with_transaction_timeout_ms(60_000)
                        .with_producer_id(ProducerId(-1))
                        .with_producer_epoch(-1)
                },
                |r, _| Verdict::from_code(r.error_code, (r.producer_id.0, r.producer_epoch)),
            )
            .await
            .expect("InitProducerId");
        let t = topic.to_string();
        client
            .call(
                Target::transaction(id.as_str()),
                &CallOptions {
                    max_version: Some(3),
                    ..CallOptions::default()
                },
                |_| {
                    AddPartitionsToTxnRequest::default()
                        .with_v3_and_below_transactional_id(TransactionalId(StrBytes::from_string(
                            id.clone(),
                        )))
                        .with_v3_and_below_producer_id(ProducerId(producer_id))
                        .with_v3_and_below_producer_epoch(epoch)
                        .with_v3_and_below_topics(vec![AddPartitionsToTxnTopic::default()
                            .with_name(TopicName(StrBytes::from_string(t.clone())))
                            .with_partitions(vec![partition])])
                },
                |r, _| {
                    let code = r.results_by_topic_v3_and_below[0].results_by_partition[0]
                        .partition_error_code;
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
        RawTxn {
            id,
            producer_id,
            epoch,
        }
    }

    async fn end(self, client: &Client, commit: bool) {
        client
            .call(
                Target::transaction(self.id.as_str()),
                &CallOptions::default(),
                |_| {
                    EndTxnRequest::default()
                        .with_transactional_id(TransactionalId(StrBytes::from_string(
                            self.id.clone(),
                        )))
                        .with_producer_id(ProducerId(self.producer_id))
                        .with_producer_epoch(self.epoch)
                        .with_committed(commit)
                },
                |r, _| Verdict::from_code(r.error_code, r.error_code),
            )
            .await
            .expect("EndTxn");
    }
}

/// Polls `check` until it returns `Some` or `limit` passes.
async fn eventually<T>(
    what: &str,
    limit: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> T {
    let until = Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < until,
            "timed out after {limit:?} waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Reads for `until`, or until `want` records arrived (whichever comes first).
async fn read_up_to(reader: &mut PartitionReader, want: usize, until: Duration) -> Vec<String> {
    let mut out = Vec::new();
    let deadline = Instant::now() + until;
    while Instant::now() < deadline && out.len() < want {
        for batch in reader.fetch().await.expect("fetch") {
            out.extend(
                batch
                    .records
                    .iter()
                    .map(|r| String::from_utf8(r.value.clone().unwrap().to_vec()).unwrap()),
            );
        }
    }
    out
}

/// Reads everything that arrives within `until`.
async fn read_all(reader: &mut PartitionReader, until: Duration) -> Vec<String> {
    read_up_to(reader, usize::MAX, until).await
}

// ------------------------------------------------------------------------ isolation levels

/// A read_committed reader stops at the LSO while a transaction is open and moves on when it commits;
/// a read_uncommitted reader sees the open transaction's records at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_committed_stops_at_the_lso_until_commit() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let c = client(&kafka).await;
    let t = topic(&c, 1).await;
    let tp = TopicPartition::new(t.as_str(), 0);
    produce(&c, &t, 0, &["a", "b"]).await;
    let txn = RawTxn::begin(&c, &t, 0, &["t1", "t2"]).await;
    produce(&c, &t, 0, &["c"]).await;

    let mut committed =
        PartitionReader::new(c.clone(), reader_config(IsolationLevel::ReadCommitted));
    committed.assign(tp.clone(), StartAt::Earliest);
    let mut uncommitted =
        PartitionReader::new(c.clone(), reader_config(IsolationLevel::ReadUncommitted));
    uncommitted.assign(tp.clone(), StartAt::Earliest);

    assert_eq!(
        read_up_to(&mut uncommitted, 5, Duration::from_secs(10)).await,
        ["a", "b", "t1", "t2", "c"]
    );
    assert_eq!(
        read_up_to(&mut committed, 2, Duration::from_secs(10)).await,
        ["a", "b"]
    );
    assert_eq!(
        read_all(&mut committed, Duration::from_secs(1)).await,
        Vec::<String>::new(),
        "stops at the LSO"
    );
    assert_eq!(committed.position(&tp), Some(2));

    txn.end(&c, true).await;
    let after = eventually(
        "the committed transaction shows",
        Duration::from_secs(10),
        async || {
            let got = read_all(&mut committed, Duration::from_millis(500)).await;
            (!got.is_empty()).then_some(got)
        },
    )
    .await;
    assert_eq!(after, ["t1", "t2", "c"]);
}

/// An aborted transaction's records are never delivered at read_committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_committed_skips_aborted_records() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let c = client(&kafka).await;
    let t = topic(&c, 1).await;
    let tp = TopicPartition::new(t.as_str(), 0);
    let txn = RawTxn::begin(&c, &t, 0, &["x1", "x2"]).await;
    txn.end(&c, false).await;
    produce(&c, &t, 0, &["after"]).await;
    let mut committed =
        PartitionReader::new(c.clone(), reader_config(IsolationLevel::ReadCommitted));
    committed.assign(tp.clone(), StartAt::Earliest);
    let got = eventually(
        "the record after the abort",
        Duration::from_secs(10),
        async || {
            let got = read_all(&mut committed, Duration::from_millis(500)).await;
            (!got.is_empty()).then_some(got)
        },
    )
    .await;
    assert_eq!(got, ["after"]);
}

/// ListOffsets latest is the high watermark at read_uncommitted and the LSO at read_committed; they
/// meet again once the transaction commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_offsets_latest_is_hw_or_lso() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let c = client(&kafka).await;
    let t = topic(&c, 1).await;
    let tp = TopicPartition::new(t.as_str(), 0);
    produce(&c, &t, 0, &["a", "b", "c"]).await;
    let txn = RawTxn::begin(&c, &t, 0, &["t1"]).await;
    produce(&c, &t, 0, &["d"]).await;
    let parts = [tp.clone()];
    let hw = list_offsets(
        &c,
        &parts,
        OffsetSpec::Latest,
        IsolationLevel::ReadUncommitted,
    )
    .await
    .unwrap()[&tp];
    let lso = list_offsets(
        &c,
        &parts,
        OffsetSpec::Latest,
        IsolationLevel::ReadCommitted,
    )
    .await
    .unwrap()[&tp];
    let earliest = list_offsets(
        &c,
        &parts,
        OffsetSpec::Earliest,
        IsolationLevel::ReadCommitted,
    )
    .await
    .unwrap()[&tp];
    assert_eq!(hw, 5);
    assert_eq!(lso, 3, "pinned at the open transaction's first offset");
    assert_eq!(earliest, 0);
    txn.end(&c, true).await;
    let lso = eventually(
        "the LSO moves past the commit marker",
        Duration::from_secs(10),
        async || {
            let lso = list_offsets(
                &c,
                &parts,
                OffsetSpec::Latest,
                IsolationLevel::ReadCommitted,
            )
            .await
            .unwrap()[&tp];
            (lso > 3).then_some(lso)
        },
    )
    .await;
    let hw = list_offsets(
        &c,
        &parts,
        OffsetSpec::Latest,
        IsolationLevel::ReadUncommitted,
    )
    .await
    .unwrap()[&tp];
    assert_eq!(lso, hw, "no open transaction: LSO = HW (6 with the marker)");
    assert_eq!(hw, 6);
}

/// OFFSET_OUT_OF_RANGE follows the explicit policy: fail (and stay stopped until a seek), or reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offset_out_of_range_follows_the_policy() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let c = client(&kafka).await;
    let t = topic(&c, 1).await;
    let tp = TopicPartition::new(t.as_str(), 0);
    produce(&c, &t, 0, &["a", "b"]).await;
    let mut failing =
        PartitionReader::new(c.clone(), reader_config(IsolationLevel::ReadUncommitted));
    failing.assign(tp.clone(), StartAt::Offset(100));
    match failing.fetch().await {
        Err(ConsumerError::OffsetOutOfRange { partition, offset }) => {
            assert_eq!((partition, offset), (tp.clone(), 100));
        }
        other => panic!("expected OffsetOutOfRange, got {other:?}"),
    }
    assert!(
        failing.fetch().await.unwrap().is_empty(),
        "stopped until a seek"
    );
    failing.seek(&tp, StartAt::Offset(1));
    assert_eq!(
        read_up_to(&mut failing, 1, Duration::from_secs(10)).await,
        ["b"]
    );

    let mut config = reader_config(IsolationLevel::ReadUncommitted);
    config.reset = OffsetReset::Earliest;
    let mut resetting = PartitionReader::new(c.clone(), config);
    resetting.assign(tp.clone(), StartAt::Offset(100));
    assert_eq!(
        read_up_to(&mut resetting, 2, Duration::from_secs(10)).await,
        ["a", "b"]
    );
}

/// Several partitions on one leader come back from one fetch round, and `partition_max_bytes` bounds
/// what each returns: room for one 2 kB batch but not two, so each partition yields one record per
/// round (the broker cuts the second batch short and the partial batch is not delivered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_partitions_per_fetch_within_max_bytes() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let c = client(&kafka).await;
    let t = topic(&c, 3).await;
    let big = "x".repeat(2000);
    for p in 0..3 {
        for _ in 0..5 {
            produce(&c, &t, p, &[big.as_str()]).await;
        }
    }
    let mut config = reader_config(IsolationLevel::ReadUncommitted);
    config.partition_max_bytes = 3000;
    let mut reader = PartitionReader::new(c.clone(), config);
    for p in 0..3 {
        reader.assign(TopicPartition::new(t.as_str(), p), StartAt::Offset(0));
    }
    // The first rounds may only learn the leaders; the first round with records has them all.
    let round = eventually(
        "a round with records",
        Duration::from_secs(10),
        async || {
            let round = reader.fetch().await.unwrap();
            (!round.is_empty()).then_some(round)
        },
    )
    .await;
    assert_eq!(round.len(), 3, "all three partitions in one round");
    for batch in &round {
        assert_eq!(batch.records.len(), 1, "one batch fits, two do not");
    }
    let mut total: usize = round.iter().map(|b| b.records.len()).sum();
    while total < 15 {
        total += reader
            .fetch()
            .await
            .unwrap()
            .iter()
            .map(|b| b.records.len())
            .sum::<usize>();
    }
    assert_eq!(total, 15);
}

/// After the partition leader is killed, the reader follows the new leader (a higher leader epoch)
/// and reads on from its position without losing or repeating a record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reader_follows_a_leader_change() {
    let kafka = dedicated(ClusterSpec::three_nodes()).await;
    let c = client(&kafka).await;
    let t = unique("t");
    snapfence::admin::create_topic(&c, &t, 1, 3, &[])
        .await
        .expect("create topic");
    let tp = TopicPartition::new(t.as_str(), 0);
    produce(&c, &t, 0, &["a", "b", "c"]).await;
    let mut reader = PartitionReader::new(c.clone(), reader_config(IsolationLevel::ReadCommitted));
    reader.assign(tp.clone(), StartAt::Offset(0));
    assert_eq!(
        read_up_to(&mut reader, 3, Duration::from_secs(10)).await,
        ["a", "b", "c"]
    );
    let before = c.leader(&t, 0).await.expect("leader");
    kafka.kill(before.node);
    // Writing again needs the new leader too; the net layer re-routes, the election takes seconds.
    let writer = client(&kafka).await;
    eventually(
        "a write to the new leader",
        Duration::from_secs(60),
        async || {
            let stamp = ProducerStamp::NONE;
            let records = batch(&["d", "e", "f"], stamp);
            let t = t.clone();
            writer.invalidate_leader(&t, 0);
            writer
                .call(
                    Target::leader(t.as_str(), 0),
                    &CallOptions {
                        max_version: Some(protocol_tests::raw::BY_NAME),
                        ..CallOptions::default()
                    },
                    |_| {
                        ProduceRequest::default()
                            .with_acks(-1)
                            .with_timeout_ms(10_000)
                            .with_topic_data(vec![TopicProduceData::default()
                                .with_name(TopicName(StrBytes::from_string(t.clone())))
                                .with_partition_data(vec![PartitionProduceData::default()
                                    .with_index(0)
                                    .with_records(Some(records.clone()))])])
                    },
                    |r, _| {
                        let p = &r.responses[0].partition_responses[0];
                        Verdict::from_code(p.error_code, p.error_code)
                    },
                )
                .await
                .ok()
                .filter(|code| *code == 0)
        },
    )
    .await;
    assert_eq!(
        read_up_to(&mut reader, 3, Duration::from_secs(60)).await,
        ["d", "e", "f"],
        "nothing lost, nothing repeated"
    );
    let after = c.leader(&t, 0).await.expect("new leader");
    assert_ne!(after.node, before.node);
    assert!(after.epoch > before.epoch, "{before:?} -> {after:?}");
}

// -------------------------------------------------------------------------------- groups

/// Every rebalance event of every member, in one order.
#[derive(Debug, Clone, PartialEq)]
enum Ev {
    Assigned(usize, TopicPartition),
    RevokeStart(usize, TopicPartition),
    RevokeDone(usize, TopicPartition),
    Lost(usize, TopicPartition, LostReason),
}

#[derive(Clone)]
struct Log {
    member: usize,
    events: Arc<Mutex<Vec<Ev>>>,
    /// How long a revoke handler takes: long enough that a handover racing it would show.
    revoke_delay: Duration,
}

impl RebalanceListener for Log {
    async fn on_partitions_revoked(&mut self, partitions: &[TopicPartition]) {
        for p in partitions {
            self.events
                .lock()
                .unwrap()
                .push(Ev::RevokeStart(self.member, p.clone()));
        }
        tokio::time::sleep(self.revoke_delay).await;
        for p in partitions {
            self.events
                .lock()
                .unwrap()
                .push(Ev::RevokeDone(self.member, p.clone()));
        }
    }
    async fn on_partitions_assigned(&mut self, partitions: &[TopicPartition]) {
        for p in partitions {
            self.events
                .lock()
                .unwrap()
                .push(Ev::Assigned(self.member, p.clone()));
        }
    }
    async fn on_partitions_lost(&mut self, partitions: &[TopicPartition], reason: LostReason) {
        for p in partitions {
            self.events
                .lock()
                .unwrap()
                .push(Ev::Lost(self.member, p.clone(), reason));
        }
    }
}

/// Replays the log: a partition is assigned to a member only when no other member holds it (held =
/// assigned and its revoke handler not yet returned).
fn check_no_overlap(events: &[Ev]) {
    let mut holder: BTreeMap<TopicPartition, usize> = BTreeMap::new();
    for e in events {
        match e {
            Ev::Assigned(m, p) => {
                if let Some(other) = holder.get(p) {
                    assert_eq!(
                        other, m,
                        "{p} assigned to member {m} while member {other} holds it: {events:?}"
                    );
                }
                holder.insert(p.clone(), *m);
            }
            Ev::RevokeDone(m, p) | Ev::Lost(m, p, _) => {
                if holder.get(p) == Some(m) {
                    holder.remove(p);
                }
            }
            Ev::RevokeStart(..) => {}
        }
    }
}

fn group_config(group: &str, protocol: GroupProtocol) -> GroupConsumerConfig {
    let mut g = GroupConfig::new(group);
    g.protocol = protocol;
    g.session_timeout = Duration::from_secs(10);
    g.heartbeat_interval = Duration::from_millis(500);
    g.max_poll_interval = Duration::from_secs(30);
    let mut c = GroupConsumerConfig::new(g);
    c.reader.reset = OffsetReset::Earliest;
    c.reader.max_wait = Duration::from_millis(100);
    c
}

fn classic(assignor: Assignor) -> GroupProtocol {
    GroupProtocol::Classic {
        assignors: vec![assignor],
    }
}

fn consumer_protocol() -> GroupProtocol {
    GroupProtocol::Consumer {
        server_assignor: None,
    }
}

/// Polls every member for `d`.
async fn poll_all<L: RebalanceListener>(members: &mut [GroupConsumer<L>], d: Duration) {
    let until = Instant::now() + d;
    while Instant::now() < until {
        for m in members.iter_mut() {
            m.poll(Duration::from_millis(50)).await.expect("poll");
        }
    }
}

/// Polls until the members' assignments partition `all` exactly (and stay so for a moment).
async fn settle<L: RebalanceListener>(
    members: &mut [GroupConsumer<L>],
    all: &BTreeSet<TopicPartition>,
    limit: Duration,
) {
    let until = Instant::now() + limit;
    loop {
        poll_all(members, Duration::from_millis(300)).await;
        let sets: Vec<BTreeSet<TopicPartition>> = members.iter().map(|m| m.assignment()).collect();
        let union: BTreeSet<TopicPartition> = sets.iter().flatten().cloned().collect();
        let total: usize = sets.iter().map(|s| s.len()).sum();
        if union == *all && total == all.len() && sets.iter().all(|s| !s.is_empty()) {
            return;
        }
        assert!(
            Instant::now() < until,
            "did not settle within {limit:?}: {sets:?}"
        );
    }
}

/// Two of our members share a topic: after each rebalance every partition is owned by exactly one of
/// them, and no partition is handed to one before the other's revoke handler returned.
async fn two_members_share_a_topic(spec: ClusterSpec, protocol: GroupProtocol) {
    let kafka = cluster(spec).await;
    let c = client(&kafka).await;
    let t = topic(&c, 6).await;
    let all: BTreeSet<TopicPartition> =
        (0..6).map(|p| TopicPartition::new(t.as_str(), p)).collect();
    let group = unique("g");
    let events = Arc::new(Mutex::new(Vec::new()));
    let log = |member| Log {
        member,
        events: events.clone(),
        revoke_delay: Duration::from_millis(300),
    };
    let first = GroupConsumer::subscribe(
        c.clone(),
        group_config(&group, protocol.clone()),
        [t.as_str()],
        log(0),
    )
    .await
    .unwrap();
    let mut members = vec![first];
    eventually(
        "the first member owns everything",
        Duration::from_secs(30),
        async || {
            members[0].poll(Duration::from_millis(100)).await.unwrap();
            (members[0].assignment() == all).then_some(())
        },
    )
    .await;
    let second = GroupConsumer::subscribe(
        c.clone(),
        group_config(&group, protocol.clone()),
        [t.as_str()],
        log(1),
    )
    .await
    .unwrap();
    members.push(second);
    settle(&mut members, &all, Duration::from_secs(60)).await;
    check_no_overlap(&events.lock().unwrap());
    let loads: Vec<usize> = members.iter().map(|m| m.assignment().len()).collect();
    assert_eq!(loads, [3, 3]);

    // The second leaves; the first takes everything back.
    let second = members.pop().unwrap();
    second.close(Duration::from_secs(10)).await.unwrap();
    eventually(
        "the first member owns everything again",
        Duration::from_secs(30),
        async || {
            members[0].poll(Duration::from_millis(100)).await.unwrap();
            (members[0].assignment() == all).then_some(())
        },
    )
    .await;
    let events = events.lock().unwrap().clone();
    check_no_overlap(&events);
    assert!(
        !events.iter().any(|e| matches!(e, Ev::Lost(..))),
        "a healthy group loses nothing: {events:?}"
    );
    members
        .pop()
        .unwrap()
        .close(Duration::from_secs(10))
        .await
        .unwrap();
}

/// Under eager rebalancing (range) on Kafka 4, two members never own a partition at once and split a
/// topic evenly, and the one left takes everything back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_members_eager_kafka4() {
    two_members_share_a_topic(ClusterSpec::kafka4(), classic(Assignor::Range)).await;
}

/// Under cooperative rebalancing on Kafka 4, two members never own a partition at once and split a topic
/// evenly, and the one left takes everything back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_members_cooperative_kafka4() {
    two_members_share_a_topic(ClusterSpec::kafka4(), classic(Assignor::CooperativeSticky)).await;
}

/// Under the KIP-848 consumer protocol on Kafka 4, two members never own a partition at once and split a
/// topic evenly, and the one left takes everything back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_members_consumer_protocol_kafka4() {
    two_members_share_a_topic(ClusterSpec::kafka4(), consumer_protocol()).await;
}

/// Under eager rebalancing (round robin) on Kafka 3.9, two members never own a partition at once and
/// split a topic evenly, and the one left takes everything back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_members_eager_kafka39() {
    two_members_share_a_topic(ClusterSpec::kafka39(), classic(Assignor::RoundRobin)).await;
}

/// Under cooperative rebalancing on Kafka 3.9, two members never own a partition at once and split a
/// topic evenly, and the one left takes everything back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_members_cooperative_kafka39() {
    two_members_share_a_topic(ClusterSpec::kafka39(), classic(Assignor::CooperativeSticky)).await;
}

/// A rebalance that leaves this member's partitions alone still moves its generation (or member
/// epoch), and the group metadata shows the new one after the next poll. The bump comes from a second
/// member joining the group subscribed to a different topic.
async fn silent_bump_is_visible(spec: ClusterSpec, protocol: GroupProtocol) {
    let kafka = cluster(spec).await;
    let c = client(&kafka).await;
    let mine = topic(&c, 2).await;
    let other = topic(&c, 2).await;
    let group = unique("g");
    let events = Arc::new(Mutex::new(Vec::new()));
    let mut a = GroupConsumer::subscribe(
        c.clone(),
        group_config(&group, protocol.clone()),
        [mine.as_str()],
        Log {
            member: 0,
            events: events.clone(),
            revoke_delay: Duration::ZERO,
        },
    )
    .await
    .unwrap();
    let handle = a.group_metadata();
    assert_eq!(handle.current(), None, "absent before the first join");
    let before = eventually("the first join", Duration::from_secs(30), async || {
        a.poll(Duration::from_millis(100)).await.unwrap();
        (a.assignment().len() == 2)
            .then(|| handle.current())
            .flatten()
    })
    .await;
    let owned = a.assignment();
    let events_before = events.lock().unwrap().len();

    let mut b = GroupConsumer::subscribe(
        c.clone(),
        group_config(&group, protocol.clone()),
        [other.as_str()],
        (),
    )
    .await
    .unwrap();
    let after = eventually(
        "the generation moves",
        Duration::from_secs(30),
        async || {
            a.poll(Duration::from_millis(100)).await.unwrap();
            b.poll(Duration::from_millis(100)).await.unwrap();
            let now = handle.current().unwrap();
            (now.generation_id() > before.generation_id()).then_some(now)
        },
    )
    .await;
    assert!(after.generation_id() >= 0);
    assert_eq!(after.member_id(), before.member_id());
    assert_eq!(
        a.assignment(),
        owned,
        "the bump changed nothing in this member's assignment"
    );
    if !matches!(protocol, GroupProtocol::Classic { ref assignors } if assignors == &[Assignor::Range])
    {
        // Eager revokes and reassigns everything on every rebalance; the others fire nothing.
        let events = events.lock().unwrap().clone();
        assert_eq!(events.len(), events_before, "{events:?}");
    }
    b.close(Duration::from_secs(10)).await.unwrap();
    a.close(Duration::from_secs(10)).await.unwrap();
}

/// Under eager rebalancing on Kafka 4, a rebalance that leaves this member's partitions alone still
/// shows its new generation in the group metadata.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_bump_eager_kafka4() {
    silent_bump_is_visible(ClusterSpec::kafka4(), classic(Assignor::Range)).await;
}

/// Under cooperative rebalancing on Kafka 4, a rebalance that leaves this member's partitions alone
/// shows its new generation in the group metadata and fires no listener event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_bump_cooperative_kafka4() {
    silent_bump_is_visible(ClusterSpec::kafka4(), classic(Assignor::CooperativeSticky)).await;
}

/// Under the consumer protocol on Kafka 4, a rebalance that leaves this member's partitions alone shows
/// its new member epoch in the group metadata and fires no listener event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_bump_consumer_protocol_kafka4() {
    silent_bump_is_visible(ClusterSpec::kafka4(), consumer_protocol()).await;
}

/// Under cooperative rebalancing on Kafka 3.9, a rebalance that leaves this member's partitions alone
/// shows its new generation in the group metadata and fires no listener event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_bump_cooperative_kafka39() {
    silent_bump_is_visible(ClusterSpec::kafka39(), classic(Assignor::CooperativeSticky)).await;
}

/// A member that stops heartbeating (its process paused or gone) is evicted after the session
/// timeout; a commit carrying its old group metadata is then refused as fenced.
async fn evicted_member_commit_is_fenced(
    spec: ClusterSpec,
    protocol: GroupProtocol,
    session: Duration,
) {
    let kafka = cluster(spec).await;
    let c = client(&kafka).await;
    let t = topic(&c, 1).await;
    let tp = TopicPartition::new(t.as_str(), 0);
    let group = unique("g");
    let mut config = group_config(&group, protocol);
    config.group.session_timeout = session;
    let mut zombie = GroupConsumer::subscribe(c.clone(), config, [t.as_str()], ())
        .await
        .unwrap();
    let handle = zombie.group_metadata();
    let token = eventually("the join", Duration::from_secs(30), async || {
        zombie.poll(Duration::from_millis(100)).await.unwrap();
        (!zombie.assignment().is_empty())
            .then(|| handle.current())
            .flatten()
    })
    .await;
    let offsets = BTreeMap::from([(tp.clone(), 0)]);
    commit_offsets(&c, &token, &offsets)
        .await
        .expect("a live member's commit is accepted");
    // The member stops: no more heartbeats, no leave request.
    drop(zombie);
    tokio::time::sleep(session + Duration::from_secs(3)).await;
    match commit_offsets(&c, &token, &offsets).await {
        Err(ConsumerError::CommitFenced { code, .. }) => assert!(
            matches!(
                code,
                ErrorCode::IllegalGeneration | ErrorCode::UnknownMemberId
            ),
            "{code}"
        ),
        other => panic!("expected a fenced commit, got {other:?}"),
    }
}

/// On Kafka 4, a classic-protocol member evicted after its session timeout cannot commit with its old
/// group metadata: the commit is refused as fenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicted_classic_member_is_fenced_kafka4() {
    evicted_member_commit_is_fenced(
        ClusterSpec::kafka4(),
        classic(Assignor::CooperativeSticky),
        Duration::from_secs(3),
    )
    .await;
}

/// On Kafka 4, a consumer-protocol member evicted after the broker's session timeout cannot commit with
/// its old group metadata: the commit is refused as fenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicted_consumer_protocol_member_is_fenced_kafka4() {
    // The consumer protocol's session timeout is the broker's (the fixture sets 6 s).
    evicted_member_commit_is_fenced(
        ClusterSpec::kafka4(),
        consumer_protocol(),
        Duration::from_secs(6),
    )
    .await;
}

/// On Kafka 3.9, a classic-protocol member evicted after its session timeout cannot commit with its old
/// group metadata: the commit is refused as fenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicted_classic_member_is_fenced_kafka39() {
    evicted_member_commit_is_fenced(
        ClusterSpec::kafka39(),
        classic(Assignor::Range),
        Duration::from_secs(3),
    )
    .await;
}

/// Static membership (KIP-345): a static member that stops and comes back under the same instance id
/// within its session resumes its partitions without a rebalance: same generation, new member id.
/// (With two members the restarted one may be the leader, which exercises KIP-814's skip-assignment.)
async fn static_member_restart_keeps_the_generation(spec: ClusterSpec, assignor: Assignor) {
    let kafka = cluster(spec).await;
    let c = client(&kafka).await;
    let t = topic(&c, 4).await;
    let all: BTreeSet<TopicPartition> =
        (0..4).map(|p| TopicPartition::new(t.as_str(), p)).collect();
    let group = unique("g");
    let config = |instance: &str| {
        let mut config = group_config(&group, classic(assignor));
        config.group.group_instance_id = Some(instance.to_string());
        config.group.session_timeout = Duration::from_secs(30);
        config
    };
    let a = GroupConsumer::subscribe(c.clone(), config("a"), [t.as_str()], ())
        .await
        .unwrap();
    let b = GroupConsumer::subscribe(c.clone(), config("b"), [t.as_str()], ())
        .await
        .unwrap();
    let mut members = vec![a, b];
    settle(&mut members, &all, Duration::from_secs(60)).await;
    let before_a = members[0].group_metadata().current().unwrap();
    let owned_a = members[0].assignment();
    // "a" restarts: a static member's close sends no LeaveGroup.
    members
        .remove(0)
        .close(Duration::from_secs(10))
        .await
        .unwrap();
    let a = GroupConsumer::subscribe(c.clone(), config("a"), [t.as_str()], ())
        .await
        .unwrap();
    members.insert(0, a);
    settle(&mut members, &all, Duration::from_secs(60)).await;
    let after_a = members[0].group_metadata().current().unwrap();
    assert_eq!(after_a.group_instance_id(), Some("a"));
    assert_ne!(
        after_a.member_id(),
        before_a.member_id(),
        "a new member id for the new process"
    );
    assert_eq!(
        after_a.generation_id(),
        before_a.generation_id(),
        "no rebalance"
    );
    assert_eq!(members[0].assignment(), owned_a, "the same partitions back");
    for m in members {
        m.close(Duration::from_secs(10)).await.unwrap();
    }
}

/// On Kafka 4, a static member restarted within its session gets its partitions back under the same
/// generation, with no rebalance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_member_restart_kafka4() {
    static_member_restart_keeps_the_generation(ClusterSpec::kafka4(), Assignor::Range).await;
}

/// On Kafka 3.9 with cooperative rebalancing, a static member restarted within its session gets its
/// partitions back under the same generation, with no rebalance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_member_restart_kafka39() {
    static_member_restart_keeps_the_generation(ClusterSpec::kafka39(), Assignor::CooperativeSticky)
        .await;
}

/// A member whose application stops polling past max_poll_interval leaves the group and reports its
/// partitions lost on the next poll, instead of being evicted silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poll_interval_expiry_is_reported_as_lost() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let c = client(&kafka).await;
    let t = topic(&c, 1).await;
    let group = unique("g");
    let mut config = group_config(&group, classic(Assignor::CooperativeSticky));
    config.group.max_poll_interval = Duration::from_secs(3);
    let events = Arc::new(Mutex::new(Vec::new()));
    let mut m = GroupConsumer::subscribe(
        c.clone(),
        config,
        [t.as_str()],
        Log {
            member: 0,
            events: events.clone(),
            revoke_delay: Duration::ZERO,
        },
    )
    .await
    .unwrap();
    eventually("the join", Duration::from_secs(30), async || {
        m.poll(Duration::from_millis(100)).await.unwrap();
        (!m.assignment().is_empty()).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    m.poll(Duration::from_millis(100)).await.unwrap();
    let events = events.lock().unwrap().clone();
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Ev::Lost(_, _, LostReason::PollIntervalExceeded))),
        "{events:?}"
    );
    // And it rejoins.
    eventually("the rejoin", Duration::from_secs(30), async || {
        m.poll(Duration::from_millis(100)).await.unwrap();
        (!m.assignment().is_empty()).then_some(())
    })
    .await;
}

/// Committed offsets round-trip through OffsetCommit/OffsetFetch, and a new member resumes there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_and_resume() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let c = client(&kafka).await;
    let t = topic(&c, 1).await;
    let tp = TopicPartition::new(t.as_str(), 0);
    produce(&c, &t, 0, &["a", "b", "c"]).await;
    let group = unique("g");
    let mut m = GroupConsumer::subscribe(
        c.clone(),
        group_config(&group, classic(Assignor::Range)),
        [t.as_str()],
        (),
    )
    .await
    .unwrap();
    let first = eventually("records", Duration::from_secs(30), async || {
        let got = m.poll(Duration::from_millis(200)).await.unwrap();
        (!got.is_empty()).then_some(got)
    })
    .await;
    assert_eq!(first[0].records[0].offset, 0);
    m.commit_offsets(&BTreeMap::from([(tp.clone(), 2)]))
        .await
        .unwrap();
    assert_eq!(
        m.committed(std::slice::from_ref(&tp)).await.unwrap()[&tp],
        Some(2)
    );
    m.close(Duration::from_secs(10)).await.unwrap();

    let mut again = GroupConsumer::subscribe(
        c.clone(),
        group_config(&group, classic(Assignor::Range)),
        [t.as_str()],
        (),
    )
    .await
    .unwrap();
    let resumed = eventually("records again", Duration::from_secs(30), async || {
        let got = again.poll(Duration::from_millis(200)).await.unwrap();
        (!got.is_empty()).then_some(got)
    })
    .await;
    assert_eq!(
        resumed[0].records[0].offset, 2,
        "resumes at the committed offset"
    );
    again.close(Duration::from_secs(10)).await.unwrap();
}

// ------------------------------------------------------------------------------- interop

struct JavaMember {
    child: tokio::process::Child,
    lines: tokio::sync::mpsc::Receiver<String>,
    owned: BTreeSet<String>,
}

impl JavaMember {
    async fn start(
        kafka: &KafkaCluster,
        group: &str,
        topic: &str,
        protocol: &str,
        assignor: &str,
    ) -> JavaMember {
        let source = concat!(env!("CARGO_MANIFEST_DIR"), "/java/InteropConsumer.java");
        let java = match std::env::var_os("JAVA_HOME").filter(|d| !d.is_empty()) {
            Some(home) => std::path::PathBuf::from(home).join("bin").join("java"),
            None => std::path::PathBuf::from("java"),
        };
        let mut child = tokio::process::Command::new(java)
            .arg("-cp")
            .arg(format!("{}/*", kafka.libs_dir().display()))
            .arg(source)
            .args([kafka.bootstrap().as_str(), group, topic, protocol, assignor])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start java");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = tokio::sync::mpsc::channel(1024);
        tokio::spawn(async move {
            let mut r = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = r.next_line().await {
                if tx.send(line).await.is_err() {
                    break;
                }
            }
        });
        JavaMember {
            child,
            lines,
            owned: BTreeSet::new(),
        }
    }

    /// Reads what the Java member printed so far; its owned set is the latest OWNED line.
    fn drain(&mut self) {
        while let Ok(line) = self.lines.try_recv() {
            if let Some(rest) = line.strip_prefix("OWNED ") {
                let parts = rest.split_once(' ').map(|x| x.1).unwrap_or("");
                self.owned = parts
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect();
            }
        }
    }

    async fn stop(mut self) {
        drop(self.child.stdin.take());
        let _ = tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await;
    }
}

/// One of our members and one Java consumer in the same group split the partitions: each partition
/// owned by exactly one of them, both owning some.
async fn interop(spec: ClusterSpec, ours: GroupProtocol, java_protocol: &str, java_assignor: &str) {
    let kafka = cluster(spec).await;
    let c = client(&kafka).await;
    let t = topic(&c, 4).await;
    let group = unique("g");
    let mut java = JavaMember::start(&kafka, &group, &t, java_protocol, java_assignor).await;
    let mut me = GroupConsumer::subscribe(c.clone(), group_config(&group, ours), [t.as_str()], ())
        .await
        .unwrap();
    let all: BTreeSet<String> = (0..4).map(|p| format!("{t}-{p}")).collect();
    eventually(
        "the group splits the partitions",
        Duration::from_secs(90),
        async || {
            me.poll(Duration::from_millis(200)).await.unwrap();
            java.drain();
            let mine: BTreeSet<String> = me.assignment().iter().map(|tp| tp.to_string()).collect();
            let union: BTreeSet<String> = mine.union(&java.owned).cloned().collect();
            let split = union == all
                && mine.is_disjoint(&java.owned)
                && !mine.is_empty()
                && !java.owned.is_empty();
            split.then_some(())
        },
    )
    .await;
    java.stop().await;
    me.close(Duration::from_secs(10)).await.unwrap();
}

/// On Kafka 4 our cooperative member and a Java cooperative-sticky consumer share a group, each
/// partition owned by exactly one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interop_java_classic_cooperative_kafka4() {
    interop(
        ClusterSpec::kafka4(),
        classic(Assignor::CooperativeSticky),
        "classic",
        "cooperative-sticky",
    )
    .await;
}

/// On Kafka 3.9 our range member and a Java range consumer share a group, each partition owned by
/// exactly one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interop_java_classic_range_kafka39() {
    interop(
        ClusterSpec::kafka39(),
        classic(Assignor::Range),
        "classic",
        "range",
    )
    .await;
}

/// On Kafka 4 our consumer-protocol member and a Java consumer-protocol consumer share a group, each
/// partition owned by exactly one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interop_java_consumer_protocol_kafka4() {
    interop(ClusterSpec::kafka4(), consumer_protocol(), "consumer", "").await;
}
