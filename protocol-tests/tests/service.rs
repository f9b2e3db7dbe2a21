//! What a service asks of a running flow, on a real broker: readiness (true only once every assigned
//! partition is recovered and caught up, false again while a newly assigned one is), lookups of one key
//! under concurrent folding (always a state the fold held), and members told apart by their default
//! client ids.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol_tests::tally::{fold_all, Counter, Tally};
use protocol_tests::{cluster, describe_group, flow_topics, unique, ClusterSpec, KafkaCluster};
use snapfence::consumer::{
    list_offsets, GroupConfig, GroupConsumerConfig, GroupProtocol, OffsetReset, OffsetSpec,
};
use snapfence::net::{Client, ClientConfig};
use snapfence::producer::{Producer, ProducerConfig, ProducerRecord, TopicPartition};
use snapfence::records::IsolationLevel;
use snapfence::snapshot::{
    Flow, FlowClosed, FlowConfig, FlowHandle, LookupError, PartitionReadiness, SnapshotConfig,
};

/// An input and a snapshot topic of `partitions` partitions, a producer, and every event written per key.
struct World {
    client: Client,
    input: String,
    snapshots: String,
    group: String,
    prefix: String,
    partitions: i32,
    producer: Producer,
    written: HashMap<Bytes, Vec<Bytes>>,
    seq: u64,
    protocol: GroupProtocol,
}

impl World {
    async fn new(kafka: &KafkaCluster, partitions: i32) -> World {
        let client = Client::connect(ClientConfig::new(kafka.bootstrap()))
            .await
            .unwrap();
        let (input, snapshots) = flow_topics(&client, "svc", partitions).await;
        let producer = Producer::new(client.clone(), ProducerConfig::default())
            .await
            .unwrap();
        World {
            client,
            input,
            snapshots,
            group: unique("group"),
            prefix: unique("snap"),
            partitions,
            producer,
            written: HashMap::new(),
            seq: 0,
            protocol: GroupConfig::new("-").protocol,
        }
    }

    /// Writes `n` events to `key`, on the partition the default partitioner picks (as lookups assume).
    async fn emit(&mut self, key: &str, n: usize) {
        let mut deliveries = Vec::with_capacity(n);
        for _ in 0..n {
            self.seq += 1;
            let value = Bytes::from(format!("{key}-{}", self.seq));
            let key = Bytes::copy_from_slice(key.as_bytes());
            self.written
                .entry(key.clone())
                .or_default()
                .push(value.clone());
            let record = ProducerRecord::new(self.input.as_str(), Some(value)).key(key);
            deliveries.push(self.producer.send(record).await.unwrap());
        }
        for d in deliveries {
            d.await.unwrap();
        }
    }

    async fn ends(&self) -> BTreeMap<i32, i64> {
        let tps: Vec<_> = (0..self.partitions)
            .map(|p| TopicPartition::new(self.input.as_str(), p))
            .collect();
        let ends = list_offsets(
            &self.client,
            &tps,
            OffsetSpec::Latest,
            IsolationLevel::ReadUncommitted,
        )
        .await
        .unwrap();
        ends.into_iter().map(|(tp, o)| (tp.partition, o)).collect()
    }

    fn config(&self) -> FlowConfig {
        let mut group = GroupConfig::new(&self.group);
        group.session_timeout = Duration::from_secs(6);
        group.heartbeat_interval = Duration::from_millis(500);
        // Long: a member a test does not poll for a while must not be evicted meanwhile.
        group.max_poll_interval = Duration::from_secs(60);
        group.protocol = self.protocol.clone();
        let mut consumer = GroupConsumerConfig::new(group);
        consumer.reader.reset = OffsetReset::Earliest;
        FlowConfig::new(
            consumer,
            &self.input,
            SnapshotConfig::new(&self.snapshots, &self.prefix),
        )
    }

    /// A flow that fetches at most 16 KiB per partition per poll, so a backlog takes many polls.
    async fn slow_flow(&self) -> Flow<Counter> {
        let mut config = self.config();
        config.consumer.reader.partition_max_bytes = 16 * 1024;
        config.consumer.reader.max_bytes = 16 * 1024;
        Flow::start(self.client.clone(), config, Counter)
            .await
            .unwrap()
    }

    async fn flow(&self) -> Flow<Counter> {
        Flow::start(self.client.clone(), self.config(), Counter)
            .await
            .unwrap()
    }
}

/// Keys spread over both partitions of a two-partition input by the default partitioner.
fn keys() -> Vec<String> {
    (0..40).map(|i| format!("key-{i}")).collect()
}

/// Whether every partition `flow` holds has folded up to `ends`.
fn caught_up_to(flow: &FlowHandle<Counter>, ends: &BTreeMap<i32, i64>) -> bool {
    flow.readiness()
        .partitions
        .keys()
        .all(|p| flow.position(*p).is_some_and(|pos| pos >= ends[p]))
}

/// Samples `flow`'s readiness every millisecond until told to stop: returns whether it was ever seen
/// unready, and the first time it was seen ready while a held partition was behind `ends` (a defect).
fn sample(
    flow: FlowHandle<Counter>,
    ends: BTreeMap<i32, i64>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(bool, Option<String>)> {
    tokio::spawn(async move {
        let (mut unready, mut early) = (false, None);
        while !stop.load(Ordering::Relaxed) {
            let r = flow.readiness();
            if !r.is_ready() {
                unready = true;
            } else if early.is_none() && !caught_up_to(&flow, &ends) {
                early = Some(format!("ready at {r:?} before reaching {ends:?}"));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        (unready, early)
    })
}

/// Readiness goes true only once the member has joined and every assigned partition has recovered and
/// folded the input that was there at its acquisition; a rebalance that assigns a partition with a
/// backlog makes it false until that partition catches up, and then true again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_recovery_catch_up_and_assignment() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    readiness_story(&kafka, GroupConfig::new("-").protocol).await;
}

/// The same under the KIP-848 consumer protocol, where the coordinator assigns and revokes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_recovery_catch_up_and_assignment_under_kip848() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let protocol = GroupProtocol::Consumer {
        server_assignor: None,
    };
    readiness_story(&kafka, protocol).await;
}

async fn readiness_story(kafka: &KafkaCluster, protocol: GroupProtocol) {
    let mut w = World::new(kafka, 2).await;
    w.protocol = protocol;
    for key in keys() {
        w.emit(&key, 200).await;
    }
    let ends = w.ends().await;

    let mut a = w.slow_flow().await;
    let ha = a.handle();
    assert!(!ha.is_ready(), "not ready before the first assignment");
    assert!(!ha.readiness().joined);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen_catching_up = false;
    while !ha.is_ready() {
        a.poll_once(Duration::from_millis(100)).await.unwrap();
        let r = ha.readiness();
        seen_catching_up |= r
            .partitions
            .values()
            .any(|p| matches!(p, PartitionReadiness::CatchingUp { .. }));
        assert!(Instant::now() < deadline, "never ready: {r:?}");
    }
    assert!(
        caught_up_to(&ha, &ends),
        "ready only once caught up: {:?}",
        ha.readiness()
    );
    assert_eq!(ha.readiness().partitions.len(), 2);
    assert!(
        seen_catching_up,
        "8 000 events take many 16 KiB fetches to fold"
    );
    a.persist().await.unwrap();
    a.commit().await.unwrap();

    // B joins: one partition moves to it (cooperative-sticky), and B is ready once it caught up.
    let mut b = w.flow().await;
    let hb = b.handle();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(hb.is_ready() && hb.readiness().partitions.len() == 1 && ha.partitions().len() == 1) {
        tokio::join!(
            async { a.poll_once(Duration::from_millis(50)).await.unwrap() },
            async { b.poll_once(Duration::from_millis(50)).await.unwrap() }
        );
        assert!(
            Instant::now() < deadline,
            "B never took a partition over: A {:?}, B {:?}",
            ha.readiness(),
            hb.readiness()
        );
    }
    assert!(
        ha.is_ready(),
        "A lost a partition, still ready with the other"
    );
    let moved = *hb.readiness().partitions.keys().next().unwrap();
    b.close().await.unwrap();

    // A backlog on the moved partition while A has not polled yet: A takes it back with input to fold.
    let on_moved: Vec<String> = keys()
        .into_iter()
        .filter(|k| snapfence::producer::default_partition(k.as_bytes(), 2) == moved)
        .collect();
    for key in &on_moved {
        w.emit(key, 300).await;
    }
    let ends = w.ends().await;
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample(ha.clone(), ends.clone(), Arc::clone(&stop));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(ha.readiness().partitions.len() == 2 && ha.is_ready()) {
        a.poll_once(Duration::from_millis(100)).await.unwrap();
        assert!(
            Instant::now() < deadline,
            "A never took partition {moved} back: {:?}",
            ha.readiness()
        );
    }
    stop.store(true, Ordering::Relaxed);
    let (unready, early) = sampler.await.unwrap();
    assert!(
        unready,
        "the partition assigned with a backlog made A unready"
    );
    assert_eq!(early, None);
    assert!(caught_up_to(&ha, &ends));
    a.close().await.unwrap();
}

/// Lookups while the flow folds (run by `Flow::run` in another task) each return a state the fold held:
/// the tally of the first `count` events of the key, never a torn or invented one; counts never go
/// back; and once the input is folded the lookup equals a fold of all of it. A key never written has no
/// state, and a partition another member holds answers NotHeld.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_under_concurrent_folding_return_states_the_fold_held() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let mut w = World::new(&kafka, 2).await;
    w.emit("hot", 10).await;
    let flow = w.flow().await;
    let handle = flow.handle();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(flow.run(async {
        let _ = stop_rx.await;
    }));
    handle.ready().await.unwrap();

    let writer_done = Arc::new(AtomicBool::new(false));
    let seen: Arc<Mutex<Vec<Tally>>> = Arc::default();
    let reader = {
        let (handle, done, seen) = (handle.clone(), Arc::clone(&writer_done), Arc::clone(&seen));
        tokio::spawn(async move {
            let mut last = 0;
            loop {
                let finished = done.load(Ordering::Relaxed);
                let found = handle
                    .get(b"hot")
                    .expect("this member holds every partition");
                let tally = found.state.expect("hot has events");
                assert!(
                    tally.count >= last,
                    "a lookup went back: {} after {last}",
                    tally.count
                );
                assert!(found.generation >= 0, "{found:?}");
                last = tally.count;
                seen.lock().unwrap().push(tally);
                if finished {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    for _ in 0..20 {
        w.emit("hot", 100).await;
    }
    writer_done.store(true, Ordering::Relaxed);
    reader.await.unwrap();

    // Every looked-up tally is the fold of a prefix of what was written.
    let written = &w.written[&Bytes::from_static(b"hot")];
    let seen = seen.lock().unwrap().clone();
    let distinct: std::collections::BTreeSet<u64> = seen.iter().map(|t| t.count).collect();
    for t in &seen {
        let prefix = fold_all(&written[..t.count as usize]).unwrap();
        assert_eq!(*t, prefix, "a state the fold held after {} events", t.count);
    }
    eprintln!("{} lookups, {} distinct counts", seen.len(), distinct.len());
    assert!(
        distinct.len() > 1,
        "lookups saw the fold move: {distinct:?}"
    );

    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let t = handle.get(b"hot").unwrap().state.unwrap();
        if t.count == written.len() as u64 {
            assert_eq!(t, fold_all(written).unwrap());
            break;
        }
        assert!(Instant::now() < deadline, "never folded everything: {t:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(handle.get(b"never-written").unwrap().state, None);
    let many = handle.get_many([&b"hot"[..], b"never-written"]);
    assert_eq!(many.len(), 2);
    assert_eq!(many[0].as_ref().unwrap().state.unwrap().count, 2010);
    assert_eq!(many[1].as_ref().unwrap().state, None);
    assert_eq!(
        handle.get_in(7, b"hot").unwrap_err(),
        LookupError::NotHeld { partition: 7 }
    );
    stop_tx.send(()).unwrap();
    running.await.unwrap().unwrap();
    assert!(!handle.is_ready());
    assert_eq!(
        handle.ready().await,
        Err(FlowClosed),
        "a closed flow is never ready"
    );
    assert_eq!(
        handle.get(b"hot").unwrap_err(),
        LookupError::NotHeld {
            partition: snapfence::producer::default_partition(b"hot", 2)
        }
    );
}

/// A waiter for readiness is told when the flow is dropped before it was ever ready, instead of waiting
/// forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readiness_waiter_is_released_when_the_flow_is_dropped() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let w = World::new(&kafka, 2).await;
    let flow = w.flow().await;
    let handle = flow.handle();
    let waiter = tokio::spawn(async move { handle.ready().await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "never polled, so never ready");
    drop(flow);
    let waited = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter was released")
        .unwrap();
    assert_eq!(waited, Err(FlowClosed));
}

/// Two flows in one process, each with a default `ClientConfig`, show up in DescribeGroups under two
/// different client ids that both name this process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_of_one_process_get_distinct_default_client_ids() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let w = World::new(&kafka, 2).await;
    let connect = || Client::connect(ClientConfig::new(kafka.bootstrap()));
    let (ca, cb) = (connect().await.unwrap(), connect().await.unwrap());
    let mut a = Flow::start(ca, w.config(), Counter).await.unwrap();
    let mut b = Flow::start(cb, w.config(), Counter).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let described = loop {
        tokio::join!(
            async { a.poll_once(Duration::from_millis(50)).await.unwrap() },
            async { b.poll_once(Duration::from_millis(50)).await.unwrap() }
        );
        let d = describe_group(&w.client, &w.group).await.unwrap();
        if d.state == "Stable" && d.client_ids.len() == 2 {
            break d;
        }
        assert!(Instant::now() < deadline, "never two stable members: {d:?}");
    };
    let pid = format!("-{}-", std::process::id());
    assert_ne!(
        described.client_ids[0], described.client_ids[1],
        "{described:?}"
    );
    for id in &described.client_ids {
        assert!(
            id.starts_with("snapfence-") && id.contains(&pid),
            "{described:?}"
        );
    }
    a.close().await.unwrap();
    b.close().await.unwrap();
    let after = describe_group(&w.client, &w.group).await.unwrap();
    assert_eq!(after.state, "Empty", "both left cleanly: {after:?}");
}
