//! The #732 pair on a real broker: a stale owner's late flush after a handover. Unfenced, its snapshot lands
//! after the new owner's and the next recovery folds onto stale state (the corruption is asserted); fenced,
//! the same sequence is rejected and the recovered state equals a fold of all input from scratch.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol_tests::{cluster, unique, ClusterSpec, KafkaCluster};
use snapfence::consumer::{GroupConfig, GroupConsumerConfig, GroupProtocol, OffsetReset};
use snapfence::net::{Client, ClientConfig};
use snapfence::producer::{Producer, ProducerConfig, ProducerRecord};
use snapfence::records::Record;
use snapfence::snapshot::{BoxError, Flow, FlowConfig, Fold, PersistenceMode, SnapshotConfig};

/// Per key: how many events, and a running hash of their values in order. Any lost, repeated or reordered
/// event changes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tally {
    count: u64,
    hash: u64,
}

struct Counter;

fn step(t: Option<Tally>, value: &[u8]) -> Tally {
    let t = t.unwrap_or(Tally { count: 0, hash: 17 });
    let mut h = t.hash;
    for b in value {
        h = h
            .wrapping_mul(1_099_511_628_211)
            .wrapping_add(u64::from(*b));
    }
    Tally {
        count: t.count + 1,
        hash: h.rotate_left(5),
    }
}

impl Fold for Counter {
    type State = Tally;
    fn fold(&self, _key: &Bytes, state: Option<Tally>, event: &Record) -> Tally {
        step(state, event.value.as_deref().unwrap_or_default())
    }
    fn encode(&self, s: &Tally) -> Bytes {
        let mut v = Vec::with_capacity(16);
        v.extend_from_slice(&s.count.to_be_bytes());
        v.extend_from_slice(&s.hash.to_be_bytes());
        Bytes::from(v)
    }
    fn decode(&self, b: &[u8]) -> Result<Tally, BoxError> {
        let b: [u8; 16] = b.try_into().map_err(|_| "a tally is 16 bytes")?;
        let (c, h) = b.split_at(8);
        Ok(Tally {
            count: u64::from_be_bytes(c.try_into()?),
            hash: u64::from_be_bytes(h.try_into()?),
        })
    }
}

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
}

impl World {
    async fn new(kafka: &KafkaCluster) -> World {
        World::with_partitions(kafka, 1).await
    }

    async fn with_partitions(kafka: &KafkaCluster, partitions: i32) -> World {
        let client = Client::connect(ClientConfig::new(&kafka.bootstrap()))
            .await
            .unwrap();
        let input = unique("input");
        let snapshots = unique("snapshots");
        client
            .create_topic(&input, partitions, -1, &[])
            .await
            .unwrap();
        client
            .create_topic(&snapshots, partitions, -1, &[("cleanup.policy", "compact")])
            .await
            .unwrap();
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
            .map(|(k, vs)| {
                (
                    k.clone(),
                    vs.iter().fold(None, |t, v| Some(step(t, v))).unwrap(),
                )
            })
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
        if let Some(state) = flow.state(0).await {
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
) -> (HashMap<Bytes, Tally>, HashMap<Bytes, Tally>, bool) {
    let mut w = World::new(kafka).await;
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
        if b.state(0).await.is_some_and(|s| {
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
    let stale_refused = a.persist().await.is_err();
    drop(a);
    drop(b);

    // A fresh owner recovers and folds what remains.
    let mut c = w.flow(mode).await;
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut quiet = 0;
    while quiet < 10 {
        let n = c.poll_once(Duration::from_millis(200)).await.unwrap();
        quiet = if n == 0 && c.state(0).await.is_some() {
            quiet + 1
        } else {
            0
        };
        assert!(Instant::now() < deadline, "C never settled");
    }
    let got = c.state(0).await.unwrap();
    (got, w.expected(), stale_refused)
}

/// The pair under each protocol a broker offers: classic (cooperative-sticky, the default) everywhere, and
/// the KIP-848 consumer protocol on 4.x (TV2 and TV1).
async fn pair(kafka: &KafkaCluster, protocol: GroupProtocol) {
    let v = format!("{} {:?}", kafka.version(), protocol);
    let (got, want, refused) = handover(kafka, PersistenceMode::NonTransactional, &protocol).await;
    assert!(
        !refused,
        "{v}: the unfenced stale flush was expected to land"
    );
    assert_ne!(
        got, want,
        "{v}: unfenced, the stale snapshot must corrupt the recovered state"
    );

    let (got, want, refused) = handover(kafka, PersistenceMode::Transactional, &protocol).await;
    assert!(refused, "{v}: the fenced stale flush must be refused");
    assert_eq!(
        got, want,
        "{v}: fenced, recovery must equal a fold of all input"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_732_unfenced_corrupts_fenced_prevents() {
    let classic = GroupConfig::new("-").protocol;
    for spec in [
        ClusterSpec::kafka4(),
        ClusterSpec::kafka4_tv1(),
        ClusterSpec::kafka39(),
    ] {
        let kafka = cluster(spec).await;
        pair(&kafka, classic.clone()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_732_under_the_consumer_protocol() {
    let kip848 = GroupProtocol::Consumer {
        server_assignor: None,
    };
    for spec in [ClusterSpec::kafka4(), ClusterSpec::kafka4_tv1()] {
        let kafka = cluster(spec).await;
        pair(&kafka, kip848.clone()).await;
    }
}

/// One member of the end-to-end run, restarted like a supervisor would when it fails (a fenced stale owner
/// stops; a new process takes its place).
struct Member {
    flow: Option<Flow<Counter>>,
    paused_until: Option<Instant>,
    restarts: u32,
}

impl Member {
    async fn drive(&mut self, w: &World, tick: u32) {
        if self.paused_until.is_some_and(|t| Instant::now() < t) {
            return;
        }
        self.paused_until = None;
        let flow = match &mut self.flow {
            Some(f) => f,
            None => self
                .flow
                .insert(w.flow(PersistenceMode::Transactional).await),
        };
        let mut step = flow.poll_once(Duration::from_millis(50)).await.map(|_| ());
        if step.is_ok() && tick % 3 == 0 {
            step = flow.persist().await;
        }
        if step.is_ok() && tick % 6 == 0 {
            step = flow.commit().await;
        }
        if let Err(e) = step {
            eprintln!("member failed and is restarted: {e}");
            self.flow = None;
            self.restarts += 1;
        }
    }
}

/// End to end: three flow instances in one group over a four-partition input while events flow; a member
/// joins and leaves (rebalances), one member stalls past max.poll.interval and resumes (a zombie, restarted
/// when its next flush is refused). Afterwards a fresh member's state for every key equals a fold of all of
/// that key's input events from scratch: nothing lost, nothing folded twice.
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
        (ClusterSpec::kafka39(), classic),
    ] {
        let kafka = cluster(spec).await;
        end_to_end(&kafka, protocol).await;
    }
}

async fn end_to_end(kafka: &KafkaCluster, protocol: GroupProtocol) {
    let mut w = World::with_partitions(kafka, 4).await;
    w.protocol = protocol.clone();
    let keys = ["k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"];
    let mut members: Vec<Member> = (0..2)
        .map(|_| Member {
            flow: None,
            paused_until: None,
            restarts: 0,
        })
        .collect();
    for tick in 0..60u32 {
        w.emit(keys[tick as usize % keys.len()], 2).await;
        w.emit(keys[(tick as usize * 3 + 1) % keys.len()], 1).await;
        if tick == 10 {
            members.push(Member {
                flow: None,
                paused_until: None,
                restarts: 0,
            });
        }
        if tick == 20 {
            members[0].paused_until = Some(Instant::now() + Duration::from_secs(6));
        }
        if tick == 40 {
            // The third member goes away without leaving: its session expires and the group rebalances.
            members.pop();
        }
        for m in members.iter_mut() {
            m.drive(&w, tick).await;
        }
    }
    for m in members.iter_mut() {
        if let Some(f) = &m.flow {
            let _ = f.persist().await;
            let _ = f.commit().await;
        }
    }
    let restarts: u32 = members.iter().map(|m| m.restarts).sum();
    drop(members);

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
            if c.position(tp.partition).await.is_none_or(|p| p < *end) {
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
        got.extend(c.state(p).await.unwrap());
    }
    eprintln!(
        "end to end on {} {protocol:?}: {} events, {restarts} restarts",
        kafka.version(),
        w.seq
    );
    assert_eq!(got, w.expected(), "{} {protocol:?}", kafka.version());
}
