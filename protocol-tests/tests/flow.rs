//! The #732 pair on a real broker: a stale owner's late flush after a handover. Unfenced, its snapshot lands
//! after the new owner's and the next recovery folds onto stale state (the corruption is asserted); fenced,
//! the same sequence is rejected and the recovered state equals a fold of all input from scratch. On the
//! snapshot topic, and on the PostgreSQL store.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol_tests::member::{MemberArgs, MemberProcess};
use protocol_tests::tally::{fold_all, Counter, Tally};
use protocol_tests::{cluster, unique, ClusterSpec, KafkaCluster, PostgresServer};
use snapfence::consumer::{
    list_offsets, GroupConfig, GroupConsumerConfig, GroupProtocol, OffsetReset, OffsetSpec,
    PartitionReader, ReaderConfig, StartAt,
};
use snapfence::net::{Client, ClientConfig};
use snapfence::producer::{
    Producer, ProducerConfig, ProducerRecord, TopicPartition, TransactionalConfig,
    TransactionalProducer,
};
use snapfence::records::{IsolationLevel, Record};
use snapfence::snapshot::postgres::PgStoreConfig;
use snapfence::snapshot::{
    BoxError, Change, Clock, Flow, FlowConfig, FlowError, Fold, MissingSnapshotTopic, Outputs,
    PersistenceMode, SnapshotConfig, SnapshotTopicError, SystemClock,
};

struct World {
    client: Client,
    input: String,
    snapshots: String,
    group: String,
    txn_prefix: String,
    producer: Producer,
    /// Every event written, per key, in order: the oracle.
    written: HashMap<Bytes, Vec<Bytes>>,
    seq: u64,
    protocol: GroupProtocol,
    partitions: i32,
    /// Snapshots to PostgreSQL instead of the snapshot topic.
    postgres: Option<PgStoreConfig>,
}

impl World {
    async fn new(kafka: &KafkaCluster) -> World {
        World::with_partitions(kafka, 1).await
    }

    async fn with_partitions(kafka: &KafkaCluster, partitions: i32) -> World {
        World::with_topics(
            kafka,
            partitions,
            Some((partitions, &[("cleanup.policy", "compact")])),
        )
        .await
    }

    /// An input of `partitions` partitions and, if `snapshots` says so, a snapshot topic with that
    /// partition count and those configs.
    async fn with_topics(
        kafka: &KafkaCluster,
        partitions: i32,
        snapshots_topic: Option<(i32, &[(&str, &str)])>,
    ) -> World {
        let client = Client::connect(ClientConfig::new(kafka.bootstrap()))
            .await
            .unwrap();
        let input = unique("input");
        let snapshots = unique("snapshots");
        snapfence::admin::create_topic(&client, &input, partitions, -1, &[])
            .await
            .unwrap();
        if let Some((n, configs)) = snapshots_topic {
            snapfence::admin::create_topic(&client, &snapshots, n, -1, configs)
                .await
                .unwrap();
        }
        let producer = Producer::new(client.clone(), ProducerConfig::default())
            .await
            .unwrap();
        World {
            client,
            input,
            snapshots,
            group: unique("group"),
            txn_prefix: unique("snap"),
            producer,
            written: HashMap::new(),
            seq: 0,
            protocol: GroupConfig::new("-").protocol,
            partitions,
            postgres: None,
        }
    }

    async fn emit(&mut self, key: &str, n: usize) {
        let mut deliveries = Vec::new();
        for _ in 0..n {
            self.seq += 1;
            let value = Bytes::from(format!("{key}-event-{}", self.seq));
            // Keys spread over the partitions by their bytes: stable, and every partition gets some.
            let partition = key.bytes().map(i32::from).sum::<i32>() % self.partitions;
            let key = Bytes::copy_from_slice(key.as_bytes());
            self.written
                .entry(key.clone())
                .or_default()
                .push(value.clone());
            let record = ProducerRecord::new(self.input.as_str(), Some(value))
                .key(key)
                .partition(partition);
            deliveries.push(self.producer.send(record).await.unwrap());
        }
        for d in deliveries {
            d.await.unwrap();
        }
    }

    fn expected(&self) -> HashMap<Bytes, Tally> {
        self.written
            .iter()
            .filter_map(|(k, vs)| Some((k.clone(), fold_all(vs)?)))
            .collect()
    }

    fn config(&self, mode: PersistenceMode) -> FlowConfig {
        let mut group = GroupConfig::new(&self.group);
        group.session_timeout = Duration::from_secs(6);
        group.heartbeat_interval = Duration::from_millis(500);
        group.max_poll_interval = Duration::from_secs(3);
        group.protocol = self.protocol.clone();
        let mut consumer = GroupConsumerConfig::new(group);
        consumer.reader.reset = OffsetReset::Earliest;
        let mut snapshots = SnapshotConfig::new(&self.snapshots, &self.txn_prefix);
        snapshots.recovery_stall_timeout = Some(Duration::from_secs(30));
        let mut c = FlowConfig::new(consumer, &self.input, snapshots);
        c.mode = mode;
        c.postgres = self.postgres.clone();
        c
    }

    async fn flow(&self, mode: PersistenceMode) -> Flow<Counter> {
        Flow::start(self.client.clone(), self.config(mode), Counter)
            .await
            .unwrap()
    }
}

/// Polls `flow` until it holds partition 0 and has folded `events` events in total on it.
async fn poll_until(flow: &mut Flow<Counter>, events: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        flow.poll_once(Duration::from_millis(100)).await.unwrap();
        if let Some(state) = flow.state(0) {
            if state.values().map(|t| t.count).sum::<u64>() >= events {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the flow never reached {events} events"
        );
    }
}

/// Runs the handover story and returns what a fresh owner recovers and folds afterwards, plus whether the
/// stale owner's late flush was refused.
async fn handover(
    kafka: &KafkaCluster,
    mode: PersistenceMode,
    protocol: &GroupProtocol,
    postgres: Option<&PgStoreConfig>,
) -> (HashMap<Bytes, Tally>, HashMap<Bytes, Tally>, bool) {
    let mut w = World::new(kafka).await;
    w.postgres = postgres.cloned();
    w.protocol = protocol.clone();
    w.emit("a", 5).await;
    w.emit("b", 5).await;

    // A owns the partition, folds and persists everything so far, commits.
    let mut a = w.flow(mode).await;
    poll_until(&mut a, 10).await;
    a.persist().await.unwrap();
    a.commit().await.unwrap();

    // More input; A folds it in memory, then stalls (a GC pause: no polls) before its next flush.
    w.emit("a", 5).await;
    poll_until(&mut a, 15).await;

    // B joins while A is stalled; A's member is evicted after max.poll.interval, B takes over, recovers,
    // folds the backlog and new input, persists and commits.
    let mut b = w.flow(mode).await;
    w.emit("a", 5).await;
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        b.poll_once(Duration::from_millis(200)).await.unwrap();
        if b.state(0).is_some_and(|s| {
            s.get(&Bytes::from_static(b"a"))
                .is_some_and(|t| t.count >= 15)
        }) {
            break;
        }
        assert!(Instant::now() < deadline, "B never took over and caught up");
    }
    b.persist().await.unwrap();
    b.commit().await.unwrap();

    // A wakes up and flushes before it polls again: its stale snapshot of "a" (10 events) goes out last.
    // Refused either way: returned (the stopping mode) or absorbed and counted (the default drops the
    // stale state to acquire it again, or rejoins).
    let persisted = a.persist().await;
    let absorbed = a.stats();
    let stale_refused = persisted.is_err() || absorbed.fences_recovered + absorbed.rejoins > 0;
    drop(a);
    drop(b);

    // A fresh owner recovers and folds what remains.
    let mut c = w.flow(mode).await;
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut quiet = 0;
    while quiet < 10 {
        let n = c.poll_once(Duration::from_millis(200)).await.unwrap();
        quiet = if n == 0 && c.state(0).is_some() {
            quiet + 1
        } else {
            0
        };
        assert!(Instant::now() < deadline, "C never settled");
    }
    let got = c.state(0).unwrap();
    (got, w.expected(), stale_refused)
}

/// The pair under each protocol a broker offers: classic (cooperative-sticky, the default) everywhere, and
/// the KIP-848 consumer protocol on 4.x (TV2 and TV1).
async fn pair(kafka: &KafkaCluster, protocol: GroupProtocol, postgres: Option<&PgStoreConfig>) {
    let v = format!("{} {:?}", kafka.version(), protocol);
    let (got, want, refused) = handover(
        kafka,
        PersistenceMode::NonTransactional,
        &protocol,
        postgres,
    )
    .await;
    assert!(
        !refused,
        "{v}: the unfenced stale flush was expected to land"
    );
    assert_ne!(
        got, want,
        "{v}: unfenced, the stale snapshot must corrupt the recovered state"
    );

    let (got, want, refused) =
        handover(kafka, PersistenceMode::Transactional, &protocol, postgres).await;
    assert!(refused, "{v}: the fenced stale flush must be refused");
    assert_eq!(
        got, want,
        "{v}: fenced, recovery must equal a fold of all input"
    );
}

/// Under the classic protocol on Kafka 4 (TV2 and TV1) and 3.9, a stale owner's late flush corrupts
/// recovery when unfenced and is refused when fenced, so recovery equals a fold of all input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_732_unfenced_corrupts_fenced_prevents() {
    let classic = GroupConfig::new("-").protocol;
    for spec in [
        ClusterSpec::kafka4(),
        ClusterSpec::kafka4_tv1(),
        ClusterSpec::kafka39(),
    ] {
        let kafka = cluster(spec).await;
        pair(&kafka, classic.clone(), None).await;
    }
}

/// The pair on the PostgreSQL store (KIP-939 two-phase commit and the fencing row): unfenced (plain
/// upserts, offsets by the consumer) the thawed owner's rows land and a fresh owner's state is wrong;
/// fenced its flush is refused and a fresh owner's state equals a fold of all input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_732_on_the_postgres_store() {
    let kafka = cluster(ClusterSpec::kafka4().with_two_phase_commit()).await;
    let pg = tokio::task::spawn_blocking(PostgresServer::start)
        .await
        .unwrap()
        .expect("start PostgreSQL");
    let store = PgStoreConfig::new(pg.url());
    pair(&kafka, GroupConfig::new("-").protocol, Some(&store)).await;
}

/// Under the KIP-848 consumer protocol on Kafka 4 (TV2 and TV1), a stale owner's late flush corrupts
/// recovery when unfenced and is refused when fenced, so recovery equals a fold of all input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_732_under_the_consumer_protocol() {
    let kip848 = GroupProtocol::Consumer {
        server_assignor: None,
    };
    for spec in [ClusterSpec::kafka4(), ClusterSpec::kafka4_tv1()] {
        let kafka = cluster(spec).await;
        pair(&kafka, kip848.clone(), None).await;
    }
}

/// A crashed owner whose open transaction already carries its offset commit must not hold its partition
/// up until that transaction times out: the next owner takes the partition over (fencing the crashed
/// producer and aborting its transaction) before it reads the committed offset, so that stable read
/// answers at once instead of UNSTABLE_OFFSET_COMMIT. Found by the fault campaign (kill-mid-txn rounds that
/// stalled for the 1 min transaction timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_is_not_held_up_by_a_crashed_owners_pending_offset_commit() {
    for spec in [
        ClusterSpec::kafka4(),
        ClusterSpec::kafka4_tv1(),
        ClusterSpec::kafka39(),
    ] {
        let kafka = cluster(spec).await;
        let mut w = World::new(&kafka).await;
        w.emit("a", 5).await;
        let mut a = w.flow(PersistenceMode::Transactional).await;
        poll_until(&mut a, 5).await;
        a.persist().await.unwrap();
        a.commit().await.unwrap();

        // A crashes inside its next transaction: a snapshot sent and the offset commit pending, never
        // ended, with a timeout far beyond the test.
        let metadata = a.group_metadata().current().expect("A has joined");
        let id = w
            .config(PersistenceMode::Transactional)
            .snapshots
            .transactional_id(0);
        let mut txn = TransactionalConfig::new(id);
        txn.transaction_timeout = Duration::from_secs(600);
        let mut crashed = TransactionalProducer::init(w.client.clone(), txn)
            .await
            .unwrap();
        crashed.begin().unwrap();
        crashed
            .send(
                ProducerRecord::new(w.snapshots.as_str(), Some(Bytes::from_static(b"stale")))
                    .key(Bytes::from_static(b"a"))
                    .partition(0),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        crashed
            .send_offsets(
                [(TopicPartition::new(w.input.as_str(), 0), 5.into())],
                &metadata,
            )
            .await
            .unwrap();
        drop(a);

        let began = Instant::now();
        let mut b = w.flow(PersistenceMode::Transactional).await;
        let deadline = Instant::now() + Duration::from_secs(60);
        while b.state(0).is_none() {
            b.poll_once(Duration::from_millis(200))
                .await
                .unwrap_or_else(|e| panic!("{}: the takeover failed: {e}", kafka.version()));
            assert!(Instant::now() < deadline, "B never took over");
        }
        let took = began.elapsed();
        assert_eq!(b.state(0).unwrap(), w.expected(), "{}", kafka.version());
        // A's session (6 s) must expire first; the crashed transaction's timeout is 600 s.
        assert!(
            took < Duration::from_secs(30),
            "{}: takeover took {took:?}",
            kafka.version()
        );
        eprintln!(
            "{}: takeover past a pending offset commit in {took:?}",
            kafka.version()
        );
        drop(crashed);
    }
}

/// The session timeout of every member (classic here; the consumer protocol's is the fixture broker's
/// `group.consumer.session.timeout.ms`, also 6 s).
const SESSION: Duration = Duration::from_secs(6);

/// Members as separate processes, restarted like a supervisor would when one exits (a fenced stale owner
/// stops; a new process takes its place).
struct Members {
    program: &'static std::path::Path,
    args: MemberArgs,
    procs: Vec<MemberProcess>,
    restarts: u32,
    fenced: u32,
}

impl Members {
    fn spawn(&mut self) {
        self.procs
            .push(MemberProcess::spawn(self.program, &self.args).expect("start flow-member"));
    }

    /// Restarts every member that exited; a frozen one is left frozen.
    fn supervise(&mut self) {
        for m in self.procs.iter_mut() {
            if !m.is_paused() && !m.is_running() {
                let log = m.log();
                if log
                    .failure
                    .as_deref()
                    .is_some_and(|f| f.contains("fenced=true"))
                {
                    self.fenced += 1;
                }
                eprintln!("member {} exited ({:?}); restarting", m.pid(), log.failure);
                *m = MemberProcess::spawn(self.program, &self.args).expect("restart flow-member");
                self.restarts += 1;
            }
        }
    }
}

/// End to end: flow members as processes in one group over a four-partition input while events flow; a
/// third member joins and is later killed (rebalances); one owner is frozen with SIGSTOP clearly past its
/// session timeout, so its heartbeats stop and the others take its partitions over, then thawed (a zombie
/// that acts on stale state). Afterwards a fresh member's state for every key equals a fold of all of that
/// key's input events from scratch: nothing lost, nothing folded twice, no stale snapshot kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_to_end_state_survives_rebalances_and_a_zombie() {
    let classic = GroupConfig::new("-").protocol;
    let kip848 = GroupProtocol::Consumer {
        server_assignor: None,
    };
    for (spec, protocol) in [
        (ClusterSpec::kafka4(), classic.clone()),
        (ClusterSpec::kafka4(), kip848.clone()),
        (ClusterSpec::kafka4_tv1(), classic.clone()),
        (ClusterSpec::kafka4_tv1(), kip848),
        (kafka39_classic_coordinator(), classic),
    ] {
        let kafka = cluster(spec).await;
        end_to_end(&kafka, protocol).await;
    }
}

/// 3.9 with its own default, the classic group coordinator (the fixture's default 3.9 since issue 18;
/// it used to switch the KIP-848 preview on). The preview's new coordinator loses WriteTxnMarkers answers (KAFKA-17877, fixed in 4.0;
/// `tests/txn_markers.rs` shows it): the transaction coordinator then never finishes that transaction, and
/// its transactional id stays wedged (every InitProducerId answers CONCURRENT_TRANSACTIONS) until the
/// coordinator moves. Members committing offset-only transactions on several partitions at once trigger
/// it in about a third of the runs of this test; nothing a client does unwedges the id
/// (docs/reliability.md).
fn kafka39_classic_coordinator() -> ClusterSpec {
    ClusterSpec::kafka39()
}

async fn end_to_end(kafka: &KafkaCluster, protocol: GroupProtocol) {
    let began = Instant::now();
    let mut w = World::with_partitions(kafka, 4).await;
    w.protocol = protocol.clone();
    let mut args = MemberArgs::new(
        &kafka.bootstrap(),
        &w.group,
        &w.input,
        &w.snapshots,
        &w.txn_prefix,
    );
    args.consumer_protocol = matches!(protocol, GroupProtocol::Consumer { .. });
    args.session_timeout = SESSION;
    let mut members = Members {
        program: std::path::Path::new(env!("CARGO_BIN_EXE_flow-member")),
        args,
        procs: Vec::new(),
        restarts: 0,
        fenced: 0,
    };
    members.spawn();
    members.spawn();
    let keys = ["k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"];
    let mut tick = 0usize;
    let mut emit = async |w: &mut World, members: &mut Members| {
        tick += 1;
        w.emit(keys[tick % keys.len()], 2).await;
        w.emit(keys[(tick * 3 + 1) % keys.len()], 1).await;
        members.supervise();
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    // Events flow; a third member joins after a while (a rebalance).
    for i in 0..30 {
        if i == 10 {
            members.spawn();
        }
        emit(&mut w, &mut members).await;
    }
    // Freeze an owner once it holds something, clearly past its session timeout, while events flow.
    let deadline = Instant::now() + Duration::from_secs(60);
    while members.procs[0].held().is_empty() {
        emit(&mut w, &mut members).await;
        assert!(Instant::now() < deadline, "member 0 never got a partition");
    }
    let frozen_held = members.procs[0].held();
    members.procs[0].pause();
    let frozen_at = Instant::now();
    let mut taken_over = false;
    // Frozen for at least the session timeout plus 3 s, and until another member holds its partitions.
    while frozen_at.elapsed() < SESSION + Duration::from_secs(3) || !taken_over {
        emit(&mut w, &mut members).await;
        taken_over |= members.procs[1..]
            .iter()
            .any(|m| m.held().iter().any(|p| frozen_held.contains(p)));
        assert!(
            frozen_at.elapsed() < Duration::from_secs(60),
            "{}: nobody took over {frozen_held:?} from the frozen member",
            kafka.version()
        );
    }
    let frozen_for = frozen_at.elapsed();
    // Thaw it: it acts on its stale state first (the fence must refuse its flush).
    members.procs[0].resume();
    for i in 0..30 {
        if i == 10 {
            // The third member dies without leaving: its session expires and the group rebalances.
            let mut third = members.procs.pop().expect("three members");
            third.kill();
        }
        emit(&mut w, &mut members).await;
    }
    for m in members.procs.drain(..) {
        m.close(Duration::from_secs(10));
    }

    // A fresh member alone recovers every partition and folds what remains.
    let mut c = w.flow(PersistenceMode::Transactional).await;
    let ends = snapfence::consumer::list_offsets(
        &w.client,
        &(0..4)
            .map(|p| snapfence::consumer::TopicPartition::new(w.input.as_str(), p))
            .collect::<Vec<_>>(),
        snapfence::consumer::OffsetSpec::Latest,
        snapfence::records::IsolationLevel::ReadUncommitted,
    )
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        c.poll_once(Duration::from_millis(200)).await.unwrap();
        let mut caught_up = true;
        for (tp, end) in &ends {
            if c.position(tp.partition).is_none_or(|p| p < *end) {
                caught_up = false;
            }
        }
        if caught_up {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the fresh member never caught up"
        );
    }
    let mut got = HashMap::new();
    for p in 0..4 {
        got.extend(c.state(p).unwrap());
    }
    eprintln!(
        "end to end on {} {protocol:?}: {} events, froze {frozen_held:?} for {:.1}s, {} restarts \
         ({} after a fence), {:.1}s",
        kafka.version(),
        w.seq,
        frozen_for.as_secs_f64(),
        members.restarts,
        members.fenced,
        began.elapsed().as_secs_f64()
    );
    assert_eq!(got, w.expected(), "{} {protocol:?}", kafka.version());
}

/// Starts a flow of `w` and returns the outcome and how long `Flow::start` took.
async fn timed_start(
    w: &World,
    config: FlowConfig,
) -> (Result<Flow<Counter>, FlowError>, Duration) {
    let began = Instant::now();
    let flow = Flow::start(w.client.clone(), config, Counter).await;
    (flow, began.elapsed())
}

/// How long a misconfigured start may take: a few round trips, not the 30-50 s of produce retries the
/// first snapshot write would otherwise spend before UNKNOWN_TOPIC_OR_PARTITION.
const FAIL_FAST: Duration = Duration::from_secs(3);

/// A fresh group under Flow starts every partition at the earliest input offset even with the reader's
/// default reset (`Fail`), instead of failing its first poll with NoCommittedOffset, and records that
/// start as the group's committed offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_group_starts_from_earliest_with_default_reset() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let mut w = World::new(&kafka).await;
    w.emit("a", 3).await;
    w.emit("b", 2).await;
    let mut config = w.config(PersistenceMode::Transactional);
    config.consumer.reader.reset = snapfence::consumer::ReaderConfig::default().reset;
    assert_eq!(config.consumer.reader.reset, OffsetReset::Fail);
    assert_eq!(config.initial_offset, OffsetReset::Earliest);
    let mut flow = Flow::start(w.client.clone(), config, Counter)
        .await
        .unwrap();
    poll_until(&mut flow, 5).await;
    assert_eq!(flow.state(0).unwrap(), w.expected());
    let tp = snapfence::consumer::TopicPartition::new(w.input.as_str(), 0);
    let committed =
        snapfence::consumer::committed_offsets(&w.client, &w.group, std::slice::from_ref(&tp))
            .await
            .unwrap();
    assert_eq!(
        committed.get(&tp).copied().flatten(),
        Some(0),
        "the flow commits the start it chose for a fresh partition"
    );
    flow.close().await.unwrap();
}

/// A missing snapshot topic fails `Flow::start` at once with a typed error naming the fix, and with
/// `MissingSnapshotTopic::Create` the flow creates it compacted with the input's partition count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_snapshot_topic_fails_fast_or_is_created() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let mut w = World::with_topics(&kafka, 2, None).await;
    let (flow, took) = timed_start(&w, w.config(PersistenceMode::Transactional)).await;
    let err = flow.unwrap_err();
    eprintln!("missing snapshot topic refused in {took:?}: {err}");
    assert!(
        matches!(&err, FlowError::SnapshotTopic(SnapshotTopicError::Missing { topic, partitions: 2, .. })
            if *topic == w.snapshots),
        "{err:?}"
    );
    assert!(took < FAIL_FAST, "took {took:?}");

    let mut config = w.config(PersistenceMode::Transactional);
    config.missing_snapshot_topic = MissingSnapshotTopic::Create {
        replication_factor: None,
    };
    let (flow, took) = timed_start(&w, config).await;
    let mut flow = flow.unwrap();
    eprintln!("snapshot topic created and checked in {took:?}");
    let metadata = w.client.metadata(&[w.snapshots.as_str()]).await.unwrap();
    assert_eq!(metadata.topics[&w.snapshots].partitions.len(), 2);
    let policy = snapfence::admin::topic_config(&w.client, &w.snapshots, "cleanup.policy")
        .await
        .unwrap();
    assert_eq!(policy.as_deref(), Some("compact"));
    // And it is usable: a fold persists into it.
    w.partitions = 1; // every event to partition 0, which poll_until watches
    w.emit("a", 2).await;
    poll_until(&mut flow, 2).await;
    flow.persist().await.unwrap();
    flow.close().await.unwrap();
}

/// A snapshot topic whose cleanup policy deletes old records is refused: its snapshots would vanish
/// after the retention while their input offsets stay committed, losing state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_policy_snapshot_topic_is_refused() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let w = World::with_topics(&kafka, 1, Some((1, &[("cleanup.policy", "delete")]))).await;
    let (flow, took) = timed_start(&w, w.config(PersistenceMode::Transactional)).await;
    let err = flow.unwrap_err();
    eprintln!("delete-policy snapshot topic refused in {took:?}: {err}");
    assert!(
        matches!(&err, FlowError::SnapshotTopic(SnapshotTopicError::NotCompacted { cleanup_policy, .. })
            if cleanup_policy.as_deref() == Some("delete")),
        "{err:?}"
    );
    assert!(took < FAIL_FAST, "took {took:?}");
}

/// A snapshot topic with another partition count than the input is refused: snapshot partition N must
/// hold input partition N's state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_count_mismatch_is_refused() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let w = World::with_topics(&kafka, 2, Some((1, &[("cleanup.policy", "compact")]))).await;
    let (flow, took) = timed_start(&w, w.config(PersistenceMode::NonTransactional)).await;
    let err = flow.unwrap_err();
    eprintln!("partition mismatch refused in {took:?}: {err}");
    assert!(
        matches!(
            &err,
            FlowError::SnapshotTopic(SnapshotTopicError::PartitionMismatch {
                partitions: 1,
                input_partitions: 2,
                ..
            })
        ),
        "{err:?}"
    );
    assert!(took < FAIL_FAST, "took {took:?}");
}

/// After `Flow::close` the member has left the group and flushed: a new member takes the partition over
/// well inside the old member's session timeout, and recovers everything the closed one folded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_hands_over_without_waiting_out_the_session() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    for protocol in [
        GroupConfig::new("-").protocol,
        GroupProtocol::Consumer {
            server_assignor: None,
        },
    ] {
        let mut w = World::new(&kafka).await;
        w.protocol = protocol.clone();
        // Long enough that waiting it out is unmistakable (classic; under KIP-848 the broker's 6 s).
        let session = Duration::from_secs(30);
        let config = |w: &World| {
            let mut c = w.config(PersistenceMode::Transactional);
            c.consumer.group.session_timeout = session;
            c.consumer.group.max_poll_interval = Duration::from_secs(60);
            c
        };
        w.emit("a", 4).await;
        let mut a = Flow::start(w.client.clone(), config(&w), Counter)
            .await
            .unwrap();
        poll_until(&mut a, 4).await;
        // Folded, never persisted or committed by hand: close must do both.
        a.close().await.unwrap();
        let tp = snapfence::consumer::TopicPartition::new(w.input.as_str(), 0);
        let committed =
            snapfence::consumer::committed_offsets(&w.client, &w.group, std::slice::from_ref(&tp))
                .await
                .unwrap();
        assert_eq!(
            committed.get(&tp).copied().flatten(),
            Some(4),
            "{protocol:?}: close persists and commits everything folded"
        );
        w.emit("a", 3).await;

        let began = Instant::now();
        let mut b = Flow::start(w.client.clone(), config(&w), Counter)
            .await
            .unwrap();
        poll_until(&mut b, 7).await;
        let took = began.elapsed();
        eprintln!("{protocol:?}: after close, the next member held and caught up in {took:?}");
        assert_eq!(b.state(0).unwrap(), w.expected(), "{protocol:?}");
        let bound = match protocol {
            GroupProtocol::Consumer { .. } => SESSION,
            _ => Duration::from_secs(10),
        };
        assert!(took < bound, "{protocol:?}: took {took:?}");
        b.close().await.unwrap();
    }
}

/// Counts events like [`Counter`], but an event whose value is `del` deletes the key, and a key idle for
/// `ttl` (no event for that long, by event timestamp) expires by timer: deadline = last event + ttl.
#[derive(Debug, Clone, Copy)]
struct Expiring {
    ttl: Option<i64>,
}

/// The tally of a key plus the timestamp of its last event (for its timer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    tally: Tally,
    seen: i64,
}

impl Fold for Expiring {
    type State = Seen;
    fn fold(
        &self,
        key: &Bytes,
        state: &mut Option<Seen>,
        event: &Record,
        out: &mut Outputs,
    ) -> Change {
        if event.value.as_deref() == Some(b"del") {
            return Change::Delete;
        }
        let mut tally = state.map(|s| s.tally);
        Counter.fold(key, &mut tally, event, out);
        *state = tally.map(|tally| Seen {
            tally,
            seen: event.timestamp,
        });
        Change::Update
    }
    fn encode(&self, s: &Seen) -> Bytes {
        let mut v = Counter.encode(&s.tally).to_vec();
        v.extend_from_slice(&s.seen.to_be_bytes());
        Bytes::from(v)
    }
    fn decode(&self, b: &[u8]) -> Result<Seen, BoxError> {
        if b.len() != 24 {
            return Err("a seen tally is 24 bytes".into());
        }
        Ok(Seen {
            tally: Counter.decode(&b[..16])?,
            seen: i64::from_be_bytes(b[16..].try_into()?),
        })
    }
    fn deadline(&self, _key: &Bytes, s: &Seen) -> Option<i64> {
        self.ttl.map(|t| s.seen + t)
    }
    fn on_deadline(&self, _key: &Bytes, _s: &mut Seen, _now: i64, _out: &mut Outputs) -> Change {
        Change::Delete
    }
}

/// A clock the test sets.
#[derive(Debug, Default)]
struct ManualClock(AtomicI64);

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(AtomicOrdering::Relaxed)
    }
}

/// Polls until `flow` holds partition 0 and its position reached `end`.
async fn catch_up<F: Fold>(flow: &mut Flow<F>, end: i64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while flow.position(0).is_none_or(|p| p < end) {
        flow.poll_once(Duration::from_millis(100)).await.unwrap();
        assert!(Instant::now() < deadline, "never reached offset {end}");
    }
}

/// Every record of snapshot partition 0 as stored (read_uncommitted: aborted ones and, until the cleaner
/// removes them, superseded ones and tombstones too), as (key, value).
async fn stored_records(w: &World) -> Vec<(Option<Bytes>, Option<Bytes>)> {
    let tp = TopicPartition::new(w.snapshots.as_str(), 0);
    let end = list_offsets(
        &w.client,
        std::slice::from_ref(&tp),
        OffsetSpec::Latest,
        IsolationLevel::ReadUncommitted,
    )
    .await
    .unwrap()[&tp];
    let mut reader = PartitionReader::new(w.client.clone(), ReaderConfig::default());
    reader.assign(tp.clone(), StartAt::Earliest);
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    // The position is unknown until the first fetch resolves "earliest".
    while end > 0 && reader.position(&tp).is_none_or(|p| p < end) {
        for part in reader.fetch().await.unwrap() {
            out.extend(part.records.into_iter().map(|r| (r.key, r.value)));
        }
        assert!(Instant::now() < deadline, "never read to {end}");
    }
    out
}

/// The oracle for deletes: per key, the fold of its events since its last `del`, absent when that is the
/// last event.
fn expected_with_deletes(w: &World) -> HashMap<Bytes, Tally> {
    w.written
        .iter()
        .filter_map(|(k, vs)| {
            let since = match vs.iter().rposition(|v| v == "del") {
                Some(i) => &vs[i + 1..],
                None => &vs[..],
            };
            Some((k.clone(), fold_all(since)?))
        })
        .collect()
}

impl World {
    async fn emit_value(&mut self, key: &str, value: &str) {
        let key_bytes = Bytes::copy_from_slice(key.as_bytes());
        let value = Bytes::copy_from_slice(value.as_bytes());
        self.written
            .entry(key_bytes.clone())
            .or_default()
            .push(value.clone());
        let record = ProducerRecord::new(self.input.as_str(), Some(value))
            .key(key_bytes)
            .partition(0);
        self.producer.send(record).await.unwrap().await.unwrap();
        self.seq += 1;
    }
}

/// A deleted key stays deleted through the log cleaner: with the cleaner compacting the snapshot topic
/// (tombstones included) while aborted transactions sit in it, a fresh owner recovers exactly the fold of
/// all input, deleted keys absent and re-created keys folded from their re-creation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_survive_log_cleaning_and_aborted_transactions() {
    let kafka = cluster(ClusterSpec::kafka4().with_prop("log.cleaner.backoff.ms", "100")).await;
    let mut w = World::with_topics(
        &kafka,
        1,
        Some((
            1,
            &[
                ("cleanup.policy", "compact"),
                ("segment.ms", "100"),
                ("segment.bytes", "1048576"),
                ("min.cleanable.dirty.ratio", "0.01"),
                ("delete.retention.ms", "100"),
                ("min.compaction.lag.ms", "0"),
            ],
        )),
    )
    .await;
    let mut config = w.config(PersistenceMode::Transactional);
    config.clock = Arc::new(ManualClock::default());
    // The test works between polls (zombie transactions, waits for the cleaner): no eviction for that.
    config.consumer.group.max_poll_interval = Duration::from_secs(60);
    config.consumer.group.session_timeout = Duration::from_secs(30);
    let mut a = Flow::start(w.client.clone(), config.clone(), Expiring { ttl: None })
        .await
        .unwrap();
    let mut txn_writes = 0usize;
    for round in 0..7 {
        for k in 0..12 {
            let key = format!("k{k:02}");
            w.emit_value(&key, &format!("{key}-r{round}")).await;
            // Every third key is deleted in even rounds and re-created in odd ones.
            if k % 3 == 0 && round % 2 == 0 {
                w.emit_value(&key, "del").await;
            }
        }
        catch_up(&mut a, w.seq as i64).await;
        a.persist().await.unwrap();
        a.commit().await.unwrap();
        a.persist().await.unwrap(); // the tombstones the commit made due
        txn_writes += 12;

        // A writer that aborts: garbage values under the same keys, never visible to recovery.
        let mut zombie = TransactionalProducer::init(
            w.client.clone(),
            TransactionalConfig::new(unique("aborting")),
        )
        .await
        .unwrap();
        zombie.begin().unwrap();
        let mut sent = Vec::new();
        for k in 0..12 {
            let record = ProducerRecord::new(
                w.snapshots.as_str(),
                Some(Bytes::from_static(b"not an envelope")),
            )
            .key(Bytes::from(format!("k{k:02}")))
            .partition(0);
            sent.push(zombie.send(record).await.unwrap());
        }
        // Written to the log (acknowledged), then aborted: the records stay until the cleaner drops them.
        for d in sent {
            d.await.unwrap();
        }
        zombie.abort().await.unwrap();
        zombie.close().await;
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert_eq!(
        a.state(0)
            .unwrap()
            .into_iter()
            .map(|(k, s)| (k, s.tally))
            .collect::<HashMap<_, _>>(),
        expected_with_deletes(&w)
    );
    a.close().await.unwrap();

    // Wait for the cleaner: far fewer records stored than were written (snapshots, graves, tombstones,
    // aborted garbage and markers).
    let written = txn_writes + 7 * 12;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let stored = stored_records(&w).await;
        if stored.len() < written / 2 {
            eprintln!(
                "cleaned: {} records stored of {written} written",
                stored.len()
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cleaner never ran: {} stored",
            stored.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let mut b = Flow::start(w.client.clone(), config, Expiring { ttl: None })
        .await
        .unwrap();
    catch_up(&mut b, w.seq as i64).await;
    let recovered: HashMap<Bytes, Tally> = b
        .state(0)
        .unwrap()
        .into_iter()
        .map(|(k, s)| (k, s.tally))
        .collect();
    let expected = expected_with_deletes(&w);
    assert!(expected.len() < 12, "some keys end deleted");
    assert_eq!(recovered, expected);
    b.close().await.unwrap();
}

/// An idle key's expiry is persisted and fenced like an event: it lands as a tombstone, and a restarted
/// owner neither resurrects the key nor expires the key that was not idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_key_expires_and_the_expiry_survives_a_restart() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let mut w = World::new(&kafka).await;
    // Ten minutes ago: the broker refuses timestamps far ahead of its clock.
    let t0 = SystemClock.now_ms() - 600_000;
    let ttl = 60_000;
    let clock = Arc::new(ManualClock(AtomicI64::new(t0)));
    let mut config = w.config(PersistenceMode::Transactional);
    config.clock = clock.clone();
    config.consumer.group.max_poll_interval = Duration::from_secs(60);
    let fold = Expiring { ttl: Some(ttl) };
    for (key, at) in [("idle", t0), ("busy", t0), ("busy", t0 + 40_000)] {
        let value = Bytes::from(format!("{key}@{at}"));
        w.written
            .entry(Bytes::copy_from_slice(key.as_bytes()))
            .or_default()
            .push(value.clone());
        let record = ProducerRecord::new(w.input.as_str(), Some(value))
            .key(Bytes::copy_from_slice(key.as_bytes()))
            .partition(0)
            .timestamp(at);
        w.producer.send(record).await.unwrap().await.unwrap();
    }
    let mut a = Flow::start(w.client.clone(), config.clone(), fold)
        .await
        .unwrap();
    catch_up(&mut a, 3).await;
    assert_eq!(a.next_deadline(), Some(t0 + ttl));
    clock.0.store(t0 + ttl - 1, AtomicOrdering::Relaxed);
    assert_eq!(a.tick(), 0, "not before the deadline");
    clock.0.store(t0 + ttl + 1, AtomicOrdering::Relaxed);
    assert_eq!(a.tick(), 1, "the idle key expires, the busy one does not");
    let live = a.state(0).unwrap();
    assert!(!live.contains_key(&b"idle"[..]) && live.contains_key(&b"busy"[..]));
    // Close persists the expiry, commits past it and writes its tombstone.
    a.close().await.unwrap();
    let stored = stored_records(&w).await;
    assert!(
        stored
            .iter()
            .any(|(k, v)| k.as_deref() == Some(&b"idle"[..]) && v.is_none()),
        "the expiry landed as a tombstone: {stored:?}"
    );

    let mut b = Flow::start(w.client.clone(), config, fold).await.unwrap();
    catch_up(&mut b, 3).await;
    assert_eq!(b.tick(), 0, "busy's recovered deadline is still ahead");
    let state = b.state(0).unwrap();
    assert_eq!(
        state.keys().collect::<Vec<_>>(),
        vec![&Bytes::from_static(b"busy")]
    );
    assert_eq!(state[&b"busy"[..]].tally, w.expected()[&b"busy"[..]]);
    assert_eq!(b.next_deadline(), Some(t0 + 40_000 + ttl));
    b.close().await.unwrap();
}
