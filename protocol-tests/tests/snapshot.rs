//! The snapshot store against real brokers: the generation fence, group commit, the takeover abort and the
//! high-watermark-bounded recovery read, on Kafka 4.x with transaction version 2, 4.x formatted with
//! version 1, and 3.9.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol_tests::{cluster, unique, ClusterSpec, KafkaCluster};
use snapfence::consumer::{
    list_offsets, GroupConfig, GroupConsumer, GroupConsumerConfig, GroupProtocol, OffsetReset,
    OffsetSpec, TopicPartition as ConsumerTp,
};
use snapfence::net::{Client, ClientConfig};
use snapfence::producer::{
    ProducerRecord, TopicPartition, TransactionalConfig, TransactionalProducer,
};
use snapfence::records::IsolationLevel;
use snapfence::snapshot::{
    recover, Assignment, MetadataSource, PartitionLog, RecoveredState, RecoveryConfig, SharedLogs,
    SnapshotConfig, SnapshotError, SnapshotStore, StallDiagnosis,
};
use snapfence::GroupMetadata;

async fn client(kafka: &KafkaCluster) -> Client {
    Client::connect(ClientConfig::new(kafka.bootstrap()))
        .await
        .expect("connect")
}

struct Setup {
    client: Client,
    input: String,
    snapshots: String,
    group: String,
    member: GroupConsumer,
}

/// An input and a snapshot topic of one partition, and one live member of a fresh group subscribed to the
/// input, polled until its first join has completed.
async fn setup(kafka: &KafkaCluster) -> Setup {
    setup_with(kafka, GroupConfig::new("-").protocol).await
}

/// [`setup`] with the member on `protocol`.
async fn setup_with(kafka: &KafkaCluster, protocol: GroupProtocol) -> Setup {
    let client = client(kafka).await;
    let input = unique("input");
    let snapshots = unique("snapshots");
    snapfence::admin::create_topic(&client, &input, 1, -1, &[])
        .await
        .unwrap();
    snapfence::admin::create_topic(&client, &snapshots, 1, -1, &[("cleanup.policy", "compact")])
        .await
        .unwrap();
    let group = unique("group");
    let mut group_config = GroupConfig::new(&group);
    group_config.protocol = protocol;
    let mut consumer_config = GroupConsumerConfig::new(group_config);
    consumer_config.reader.reset = OffsetReset::Earliest;
    let mut member = GroupConsumer::subscribe(client.clone(), consumer_config, [input.clone()], ())
        .await
        .unwrap();
    let handle = member.group_metadata();
    let deadline = Instant::now() + Duration::from_secs(60);
    while handle.current().is_none() {
        assert!(Instant::now() < deadline, "the member never joined");
        member.poll(Duration::from_millis(200)).await.unwrap();
    }
    Setup {
        client,
        input,
        snapshots,
        group,
        member,
    }
}

fn config(s: &Setup, cap: usize) -> SnapshotConfig {
    let mut c = SnapshotConfig::new(&s.snapshots, unique("txn"));
    c.max_writes_per_transaction = cap;
    c.recovery_stall_timeout = Some(Duration::from_secs(30));
    c
}

fn assignment(s: &Setup, metadata: Arc<dyn MetadataSource>) -> Assignment {
    Assignment {
        input: TopicPartition::new(s.input.as_str(), 0),
        assigned_offset: 0,
        metadata,
    }
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

async fn recovered(s: &Setup) -> RecoveredState {
    let mut log = PartitionLog::new(s.client.clone(), &s.snapshots, 0);
    let cfg = RecoveryConfig {
        stall_timeout: Some(Duration::from_secs(30)),
        ..RecoveryConfig::default()
    };
    recover(&mut log, 0, &cfg).await.unwrap().0
}

async fn offsets(client: &Client, topic: &str) -> (i64, i64) {
    let tp = [ConsumerTp::new(topic, 0)];
    let hw = list_offsets(
        client,
        &tp,
        OffsetSpec::Latest,
        IsolationLevel::ReadUncommitted,
    )
    .await
    .unwrap()[&tp[0]];
    let lso = list_offsets(
        client,
        &tp,
        OffsetSpec::Latest,
        IsolationLevel::ReadCommitted,
    )
    .await
    .unwrap()[&tp[0]];
    (hw, lso)
}

fn specs() -> [ClusterSpec; 3] {
    [
        ClusterSpec::kafka4(),
        ClusterSpec::kafka4_tv1(),
        ClusterSpec::kafka39(),
    ]
}

/// A stale generation cannot write: the very first write (gated by the seeded offset) and every later one
/// are rejected by the group coordinator and nothing of them becomes visible, while the live metadata of the
/// same member writes fine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_generation_is_fenced_and_nothing_lands() {
    for spec in specs() {
        let kafka = cluster(spec).await;
        stale_token_is_fenced(&kafka, GroupConfig::new("-").protocol).await;
    }
}

/// The same under the KIP-848 consumer protocol, where the token is the member epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_member_epoch_is_fenced_and_nothing_lands() {
    for spec in [ClusterSpec::kafka4(), ClusterSpec::kafka4_tv1()] {
        let kafka = cluster(spec).await;
        let kip848 = GroupProtocol::Consumer {
            server_assignor: None,
        };
        stale_token_is_fenced(&kafka, kip848).await;
    }
}

async fn stale_token_is_fenced(kafka: &KafkaCluster, protocol: GroupProtocol) {
    {
        let s = setup_with(kafka, protocol).await;
        let live = s.member.group_metadata().current().unwrap();
        let stale =
            GroupMetadata::new(&s.group, live.generation_id() + 7, live.member_id(), None).unwrap();
        let stale_source: Arc<dyn MetadataSource> = Arc::new(move || Some(stale.clone()));
        let cfg = config(&s, 256);
        let store =
            SnapshotStore::acquire(s.client.clone(), cfg.clone(), assignment(&s, stale_source))
                .await
                .unwrap();
        let err = store.write(b("k"), Some(b("stale"))).await.unwrap_err();
        assert!(
            err.is_fenced(),
            "{}: first write must be fenced, got {err}",
            kafka.version()
        );
        let err = store.commit_offset(5).await.unwrap_err();
        assert!(
            err.is_fenced(),
            "{}: offset-only commit must be fenced, got {err}",
            kafka.version()
        );
        store.close().await;
        assert!(
            recovered(&s).await.is_empty(),
            "{}: a fenced write landed",
            kafka.version()
        );

        let unknown =
            GroupMetadata::new(&s.group, live.generation_id(), "not-a-member", None).unwrap();
        let unknown_source: Arc<dyn MetadataSource> = Arc::new(move || Some(unknown.clone()));
        let store = SnapshotStore::acquire(
            s.client.clone(),
            cfg.clone(),
            assignment(&s, unknown_source),
        )
        .await
        .unwrap();
        let err = store
            .write(b("k"), Some(b("unknown member")))
            .await
            .unwrap_err();
        assert!(
            err.is_fenced(),
            "{}: unknown member must be fenced, got {err}",
            kafka.version()
        );
        store.close().await;

        let store = SnapshotStore::acquire(
            s.client.clone(),
            cfg,
            assignment(&s, Arc::new(s.member.group_metadata())),
        )
        .await
        .unwrap();
        store.write(b("k"), Some(b("live"))).await.unwrap();
        store.close().await;
        let state = recovered(&s).await;
        assert_eq!(state.get(b("k")), Some(&*b("live")), "{}", kafka.version());
    }
}

/// Concurrent writes of distinct keys through one partition's producer are all committed, at cap 1 (a
/// transaction each) and at the default cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_all_commit() {
    for spec in specs() {
        let kafka = cluster(spec).await;
        for cap in [1usize, 256] {
            let s = setup(&kafka).await;
            let store = Arc::new(
                SnapshotStore::acquire(
                    s.client.clone(),
                    config(&s, cap),
                    assignment(&s, Arc::new(s.member.group_metadata())),
                )
                .await
                .unwrap(),
            );
            let n = if cap == 1 { 40 } else { 400 };
            let mut tasks = Vec::new();
            for i in 0..n {
                let store = store.clone();
                tasks.push(tokio::spawn(async move {
                    store
                        .write(b(&format!("key-{i}")), Some(b(&format!("v{i}"))))
                        .await
                }));
            }
            for t in tasks {
                t.await.unwrap().unwrap();
            }
            let state = recovered(&s).await;
            assert_eq!(state.len(), n, "{} cap {cap}", kafka.version());
            for i in 0..n {
                assert_eq!(
                    state.get(b(&format!("key-{i}"))),
                    Some(&*b(&format!("v{i}")))
                );
            }
        }
    }
}

/// The high watermark once every commit marker is written (the last stable offset has reached it: the
/// markers follow a commit asynchronously).
async fn settled_log_end(client: &Client, topic: &str) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (hw, lso) = offsets(client, topic).await;
        if hw == lso {
            return hw;
        }
        assert!(Instant::now() < deadline, "the markers were never written");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A burst of writes issued together runs ceil(n / cap) transactions and not one more (the writes after
/// the first join the transaction the first one began). Counted by the store and on the broker: each
/// committed transaction leaves one commit marker in the snapshot partition, so once the markers are
/// written (the last stable offset reaches the high watermark) the log has grown by n + transactions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_runs_ceil_n_over_cap_transactions() {
    for spec in specs() {
        let kafka = cluster(spec).await;
        for (cap, n) in [(256usize, 2000usize), (2000, 2000)] {
            let s = setup(&kafka).await;
            let store = SnapshotStore::acquire(
                s.client.clone(),
                config(&s, cap),
                assignment(&s, Arc::new(s.member.group_metadata())),
            )
            .await
            .unwrap();
            // Warm-up: coordinators found, connections open, as in the benchmark.
            store.write(b("warm-up"), Some(b("w"))).await.unwrap();
            let began = store.transactions();
            let log_before = settled_log_end(&s.client, &s.snapshots).await;
            // Issued from a task, as an application's flush runs: the drain the first write starts then
            // waits for this task to yield (see group_commit's `supervise`), by which time all are queued.
            let store = Arc::new(store);
            let burst = {
                let store = Arc::clone(&store);
                tokio::spawn(async move {
                    let value = Bytes::from(vec![b'v'; 1024]);
                    let pending: Vec<_> = (0..n)
                        .map(|i| {
                            store
                                .try_write(b(&format!("key-{i}")), Some(value.clone()))
                                .expect("the queue has room")
                        })
                        .collect();
                    for p in pending {
                        p.await.unwrap();
                    }
                })
            };
            burst.await.unwrap();
            let store = Arc::try_unwrap(store).expect("the burst task is done");
            let txns = store.transactions() - began;
            let ctx = format!("{} cap {cap}", kafka.version());
            assert_eq!(txns, n.div_ceil(cap) as u64, "{ctx}");
            let log_end = settled_log_end(&s.client, &s.snapshots).await;
            assert_eq!(
                (log_end - log_before) as u64,
                n as u64 + txns,
                "one commit marker per transaction: {ctx}"
            );
            store.close().await;
            assert_eq!(recovered(&s).await.len(), n + 1, "{ctx}");
        }
    }
}

/// Takeover after a crash: the previous owner's transaction is left open (its producer never closes, and
/// its timeout is long); the next owner's acquire aborts it, so the LSO is back at the high watermark right
/// after acquire — long before any timeout — and recovery sees only committed snapshots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_aborts_crashed_owners_open_transaction() {
    for spec in specs() {
        let kafka = cluster(spec).await;
        let s = setup(&kafka).await;
        let cfg = config(&s, 256);
        let live: Arc<dyn MetadataSource> = Arc::new(s.member.group_metadata());

        // The first owner commits one snapshot, then "crashes" with a second one in an open transaction.
        let first =
            SnapshotStore::acquire(s.client.clone(), cfg.clone(), assignment(&s, live.clone()))
                .await
                .unwrap();
        first.write(b("a"), Some(b("committed"))).await.unwrap();
        first.close().await;
        let mut crashed_cfg = TransactionalConfig::new(cfg.transactional_id(0));
        crashed_cfg.transaction_timeout = Duration::from_secs(600);
        let mut crashed = TransactionalProducer::init(client(&kafka).await, crashed_cfg)
            .await
            .unwrap();
        crashed.begin().unwrap();
        crashed
            .send(
                ProducerRecord::new(s.snapshots.as_str(), Some(b("uncommitted")))
                    .key(b("a"))
                    .partition(0),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        let (hw, lso) = offsets(&s.client, &s.snapshots).await;
        assert!(
            lso < hw,
            "{}: the crashed owner's transaction pins the LSO ({lso} < {hw})",
            kafka.version()
        );

        let began = Instant::now();
        let next =
            SnapshotStore::acquire(s.client.clone(), cfg.clone(), assignment(&s, live.clone()))
                .await
                .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let (hw, lso) = offsets(&s.client, &s.snapshots).await;
            if hw == lso {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{}: the takeover did not abort the open transaction",
                kafka.version()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let state = recovered(&s).await;
        let took = began.elapsed();
        assert_eq!(
            state.get(b("a")),
            Some(&*b("committed")),
            "{}",
            kafka.version()
        );
        assert!(
            took < Duration::from_secs(3),
            "{}: takeover to recovered state took {took:?}",
            kafka.version()
        );
        eprintln!(
            "{}: takeover to recovered state in {took:?}",
            kafka.version()
        );
        next.close().await;
        drop(crashed);
    }
}

/// A foreign transaction held open on the snapshot partition: recovery waits it out (never stopping at the
/// LSO), completes with committed keys only once it aborts, and the deadline, set above the wait, does not
/// fire; with the deadline below the wait it fails, diagnosed as an open transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_waits_out_a_foreign_transaction() {
    for spec in specs() {
        let kafka = cluster(spec).await;
        let s = setup(&kafka).await;
        let cfg = config(&s, 256);
        let store = SnapshotStore::acquire(
            s.client.clone(),
            cfg.clone(),
            assignment(&s, Arc::new(s.member.group_metadata())),
        )
        .await
        .unwrap();
        store.write(b("before"), Some(b("1"))).await.unwrap();

        let mut foreign = TransactionalProducer::init(
            client(&kafka).await,
            TransactionalConfig::new(unique("foreign")),
        )
        .await
        .unwrap();
        foreign.begin().unwrap();
        foreign
            .send(
                ProducerRecord::new(s.snapshots.as_str(), Some(b("foreign")))
                    .key(b("x"))
                    .partition(0),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        // A committed snapshot above the foreign transaction's start: an LSO-bounded read would miss it.
        store.write(b("after"), Some(b("2"))).await.unwrap();

        let short = RecoveryConfig {
            stall_timeout: Some(Duration::from_secs(2)),
            ..RecoveryConfig::default()
        };
        let err = recover(
            &mut PartitionLog::new(s.client.clone(), &s.snapshots, 0),
            0,
            &short,
        )
        .await
        .unwrap_err();
        match &err {
            SnapshotError::RecoveryStalled {
                diagnosis: StallDiagnosis::OpenTransaction { .. },
                ..
            } => {}
            other => panic!(
                "{}: expected an open-transaction stall, got {other}",
                kafka.version()
            ),
        }

        let aborter = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            foreign.abort().await.unwrap();
        });
        let long = RecoveryConfig {
            stall_timeout: Some(Duration::from_secs(30)),
            ..RecoveryConfig::default()
        };
        let (state, stats) = recover(
            &mut PartitionLog::new(s.client.clone(), &s.snapshots, 0),
            0,
            &long,
        )
        .await
        .unwrap();
        aborter.await.unwrap();
        assert!(stats.waited_for_open_transactions, "{}", kafka.version());
        assert_eq!(
            state.get(b("after")),
            Some(&*b("2")),
            "{}: the read stopped at the LSO",
            kafka.version()
        );
        assert_eq!(state.get(b("before")), Some(&*b("1")));
        assert!(
            !state.contains_key(b("x")),
            "{}: an aborted record was read",
            kafka.version()
        );
        store.close().await;
    }
}

/// Sixteen snapshot partitions recovered at once through one shared reader and through a reader each:
/// the same committed state (an aborted transaction's keys absent from both), and the shared reads
/// need a fraction of the Fetch requests, since each carries every partition the broker leads. On 4.x
/// (Fetch by topic id) and 3.9.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_of_many_partitions_shares_fetches() {
    const PARTITIONS: i32 = 16;
    /// Keys per partition per transaction: one batch of ~2 KiB each.
    const KEYS: usize = 15;
    /// Transactions; the one numbered ABORTED is aborted.
    const ROUNDS: usize = 12;
    const ABORTED: usize = 5;
    for spec in [ClusterSpec::kafka4(), ClusterSpec::kafka39()] {
        let kafka = cluster(spec).await;
        let client = client(&kafka).await;
        let topic = unique("snapshots");
        snapfence::admin::create_topic(
            &client,
            &topic,
            PARTITIONS,
            -1,
            &[("cleanup.policy", "compact")],
        )
        .await
        .unwrap();
        let mut producer =
            TransactionalProducer::init(client.clone(), TransactionalConfig::new(unique("fill")))
                .await
                .unwrap();
        let value = Bytes::from(vec![b'v'; 100]);
        for round in 0..ROUNDS {
            producer.begin().unwrap();
            let mut acks = Vec::new();
            for p in 0..PARTITIONS {
                for k in 0..KEYS {
                    let record = ProducerRecord::new(topic.as_str(), Some(value.clone()))
                        .key(b(&format!("r{round}-p{p}-k{k}")))
                        .partition(p);
                    acks.push(producer.send(record).await.unwrap());
                }
            }
            for ack in acks {
                ack.await.unwrap();
            }
            if round != ABORTED {
                producer.commit().await.unwrap();
            } else {
                producer.abort().await.unwrap();
            }
        }

        // Small chunks, so that each partition takes several fetches; still above one batch, because a
        // batch larger than the bound comes whole only as the first of a response (KIP-74), truncated
        // (no progress) anywhere else.
        let mut reader = snapfence::consumer::ReaderConfig::default();
        reader.partition_max_bytes = 4096;
        let cfg = RecoveryConfig {
            stall_timeout: Some(Duration::from_secs(30)),
            ..RecoveryConfig::default()
        };
        let shared = SharedLogs::new(client.clone(), &topic, reader.clone());
        let mut reads = tokio::task::JoinSet::new();
        for p in 0..PARTITIONS {
            let mut log = shared.log(p);
            let cfg = cfg.clone();
            reads.spawn(async move { (p, recover(&mut log, p, &cfg).await.unwrap().0) });
        }
        let mut by_shared = std::collections::BTreeMap::new();
        while let Some(done) = reads.join_next().await {
            let (p, state) = done.unwrap();
            by_shared.insert(p, state);
        }

        let mut reads = tokio::task::JoinSet::new();
        for p in 0..PARTITIONS {
            let client = client.clone();
            let topic = topic.clone();
            let reader = reader.clone();
            let cfg = cfg.clone();
            reads.spawn(async move {
                let mut log = PartitionLog::with_reader(client, &topic, p, reader);
                let state = recover(&mut log, p, &cfg).await.unwrap().0;
                (p, state, log.fetch_stats().requests)
            });
        }
        let mut separate_requests = 0;
        while let Some(done) = reads.join_next().await {
            let (p, state, requests) = done.unwrap();
            separate_requests += requests;
            let ours = &by_shared[&p];
            assert_eq!(
                ours.len(),
                (ROUNDS - 1) * KEYS,
                "{}: partition {p}",
                kafka.version()
            );
            for k in 0..KEYS {
                for round in 0..ROUNDS {
                    let key = format!("r{round}-p{p}-k{k}");
                    let expected = (round != ABORTED).then_some(&value[..]);
                    assert_eq!(ours.get(&key), expected, "{key}");
                }
            }
            // Compared as sets: the state's iteration order is its table's, not the log's.
            let theirs: std::collections::BTreeMap<_, _> = state.iter().collect();
            let mine: std::collections::BTreeMap<_, _> = ours.iter().collect();
            assert!(
                mine == theirs,
                "{}: partition {p}: states differ",
                kafka.version()
            );
        }
        let shared_requests = shared.fetch_requests();
        eprintln!(
            "{}: {PARTITIONS} partitions recovered with {shared_requests} shared Fetch requests, \
             {separate_requests} with a reader each",
            kafka.version()
        );
        assert!(
            shared_requests > 0 && shared_requests * 4 <= separate_requests,
            "{}: shared {shared_requests}, separate {separate_requests}",
            kafka.version()
        );
    }
}
