//! Several co-partitioned input topics folded into one state per key, on a real broker: the events of
//! two topics are merged in timestamp order (ties by topic order) into a fold that remembers their
//! order; an owner crashes after writing snapshots past its last commit, the next one replays from
//! the committed offsets of both topics, and a third recovers from the snapshots alone. Each ends with
//! every key's events in the merged order, each once; on the snapshot topic and on the PostgreSQL
//! store, fenced and unfenced. A flow whose inputs are not co-partitioned, or whose assignor could
//! split them, is refused at start.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol_tests::{cluster, cluster_and_postgres, unique, ClusterSpec};
use snapfence::consumer::{
    committed_offsets, Assignor, GroupConfig, GroupConsumerConfig, GroupProtocol, TopicPartition,
};
use snapfence::net::{Client, ClientConfig};
use snapfence::producer::{Producer, ProducerConfig, ProducerRecord};
use snapfence::records::Record;
use snapfence::snapshot::postgres::{inspect_partition, PgStoreConfig};
use snapfence::snapshot::SnapshotTopicError;
use snapfence::snapshot::{
    open_snapshot_value, BoxError, Change, Flow, FlowConfig, FlowError, Fold, Outputs,
    PersistenceMode, SnapshotConfig, SnapshotError, SnapshotValue,
};

const PARTITIONS: i32 = 2;
const KEYS: usize = 6;

/// Remembers every event's id in the order folded: a replay that folds one twice, loses one or folds
/// two in another order leaves another trail.
struct Trail;

impl Fold for Trail {
    type State = Vec<String>;
    fn fold(&self, _: &Bytes, s: &mut Option<Vec<String>>, e: &Record, _: &mut Outputs) -> Change {
        let id = String::from_utf8_lossy(e.value.as_deref().unwrap_or_default()).into_owned();
        s.get_or_insert_with(Vec::new).push(id);
        Change::Update
    }
    fn encode(&self, s: &Vec<String>) -> Bytes {
        s.join(",").into()
    }
    fn decode(&self, b: &[u8]) -> Result<Vec<String>, BoxError> {
        let text = std::str::from_utf8(b)?;
        Ok(text.split(',').map(str::to_owned).collect())
    }
}

/// One input event: which topic (0 or 1), its key's index, its timestamp and id.
#[derive(Debug, Clone)]
struct Event {
    input: usize,
    key: usize,
    ts: i64,
    id: String,
}

/// `n` events over both topics with timestamps that rise on each topic, sometimes equal across them
/// (a tie, broken by topic order), all after `t`: a part produced later is stamped later, the
/// condition under which a live merge and a replay agree (docs/fencing.md, "Several inputs").
fn events(seed: u64, n: usize, t: &mut i64, seq: &mut usize) -> Vec<Event> {
    *t += 1;
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move |m: u64| {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d) % m
    };
    (0..n)
        .map(|_| {
            if next(4) != 0 {
                *t += 1 + next(3) as i64;
            }
            *seq += 1;
            let input = next(2) as usize;
            Event {
                input,
                key: next(KEYS as u64) as usize,
                ts: *t,
                id: format!("{}{}", ["a", "b"][input], *seq),
            }
        })
        .collect()
}

struct Setup {
    client: Client,
    protocol: GroupProtocol,
    mode: PersistenceMode,
    postgres: Option<PgStoreConfig>,
    inputs: [String; 2],
    snapshots: String,
    group: String,
    prefix: String,
}

impl Setup {
    fn key(k: usize) -> Bytes {
        format!("k{k}").into()
    }

    fn partition(k: usize) -> i32 {
        (k % PARTITIONS as usize) as i32
    }

    async fn produce(&self, producer: &Producer, events: &[Event]) {
        let mut deliveries = Vec::new();
        for e in events {
            let r = ProducerRecord::new(
                self.inputs[e.input].as_str(),
                Some(Bytes::from(e.id.clone())),
            )
            .key(Self::key(e.key))
            .partition(Self::partition(e.key))
            .timestamp(e.ts);
            deliveries.push(producer.send(r).await.unwrap());
        }
        for d in deliveries {
            d.await.unwrap();
        }
    }

    /// Produces 120 more events (from generator `seed`, after time `t`) and adds them to `all`.
    async fn add_part(
        &self,
        producer: &Producer,
        all: &mut Vec<Event>,
        seed: u64,
        t: &mut i64,
        seq: &mut usize,
    ) {
        let part = events(seed, 120, t, seq);
        self.produce(producer, &part).await;
        all.extend(part);
    }

    fn config(&self, protocol: GroupProtocol) -> FlowConfig {
        let mut group = GroupConfig::new(&self.group);
        group.protocol = protocol;
        group.session_timeout = Duration::from_secs(6);
        group.heartbeat_interval = Duration::from_millis(500);
        let mut config = FlowConfig::new(
            GroupConsumerConfig::new(group),
            &self.inputs[0],
            SnapshotConfig::new(&self.snapshots, &self.prefix),
        );
        config.more_input_topics = vec![self.inputs[1].clone()];
        config.mode = self.mode;
        config.postgres = self.postgres.clone();
        config
    }

    async fn flow(&self) -> Flow<Trail> {
        Flow::start(
            self.client.clone(),
            self.config(self.protocol.clone()),
            Trail,
        )
        .await
        .unwrap()
    }

    /// Polls until the flow holds every partition with every input's position at `ends`.
    async fn fold_to(&self, flow: &mut Flow<Trail>, ends: &BTreeMap<(usize, i32), i64>) {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let done = (0..PARTITIONS).all(|p| {
                flow.positions(p)
                    .is_some_and(|v| v == [ends[&(0, p)], ends[&(1, p)]])
            });
            if done {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "never folded to {ends:?}: {:?}",
                (0..PARTITIONS)
                    .map(|p| flow.positions(p))
                    .collect::<Vec<_>>()
            );
            flow.poll_once(Duration::from_millis(100)).await.unwrap();
        }
    }

    async fn committed(&self) -> BTreeMap<(usize, i32), i64> {
        let tps: Vec<TopicPartition> = (0..2)
            .flat_map(|i| (0..PARTITIONS).map(move |p| (i, p)))
            .map(|(i, p)| TopicPartition::new(self.inputs[i].as_str(), p))
            .collect();
        let got = committed_offsets(&self.client, &self.group, &tps)
            .await
            .unwrap();
        tps.iter()
            .map(|tp| {
                let i = usize::from(tp.topic.as_ref() != self.inputs[0].as_str());
                (
                    (i, tp.partition),
                    got.get(tp).copied().flatten().unwrap_or(-1),
                )
            })
            .collect()
    }
}

/// Every key's events in the merged order: by timestamp, ties by topic order (each topic's own order
/// kept).
fn expected(events: &[Event]) -> BTreeMap<Bytes, Vec<String>> {
    let mut sorted: Vec<(usize, &Event)> = events.iter().enumerate().collect();
    sorted.sort_by_key(|(seq, e)| (e.ts, e.input, *seq));
    let mut out: BTreeMap<Bytes, Vec<String>> = BTreeMap::new();
    for (_, e) in sorted {
        out.entry(Setup::key(e.key)).or_default().push(e.id.clone());
    }
    out
}

fn states(flow: &Flow<Trail>) -> BTreeMap<Bytes, Vec<String>> {
    (0..PARTITIONS)
        .flat_map(|p| flow.state(p).unwrap_or_default())
        .collect()
}

fn ends_of(events: &[Event]) -> BTreeMap<(usize, i32), i64> {
    let mut ends: BTreeMap<(usize, i32), i64> = (0..2)
        .flat_map(|i| (0..PARTITIONS).map(move |p| ((i, p), 0)))
        .collect();
    for e in events {
        *ends.get_mut(&(e.input, Setup::partition(e.key))).unwrap() += 1;
    }
    ends
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_inputs_fold_in_merged_order_through_a_crash_and_a_recovery() {
    let range = GroupProtocol::Classic {
        assignors: vec![Assignor::Range],
    };
    two_inputs_through_a_crash(range, PersistenceMode::Transactional, false).await;
}

/// The same under the KIP-848 protocol with the server's range assignor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_inputs_fold_in_merged_order_under_the_consumer_protocol() {
    let range = GroupProtocol::Consumer {
        server_assignor: Some("range".into()),
    };
    two_inputs_through_a_crash(range, PersistenceMode::Transactional, false).await;
}

/// The same unfenced: plain writes, both offsets in one OffsetCommit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_inputs_fold_in_merged_order_unfenced() {
    let range = GroupProtocol::Classic {
        assignors: vec![Assignor::Range],
    };
    two_inputs_through_a_crash(range, PersistenceMode::NonTransactional, false).await;
}

/// The same on the PostgreSQL store: every flush's one TxnOffsetCommit carries both offsets, and the
/// fencing row records both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_inputs_fold_in_merged_order_on_postgres() {
    let range = GroupProtocol::Classic {
        assignors: vec![Assignor::Range],
    };
    two_inputs_through_a_crash(range, PersistenceMode::Transactional, true).await;
}

/// The same on the PostgreSQL store unfenced: rows upserted, both offsets in one OffsetCommit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_inputs_fold_in_merged_order_on_postgres_unfenced() {
    let range = GroupProtocol::Classic {
        assignors: vec![Assignor::Range],
    };
    two_inputs_through_a_crash(range, PersistenceMode::NonTransactional, true).await;
}

async fn two_inputs_through_a_crash(protocol: GroupProtocol, mode: PersistenceMode, on_pg: bool) {
    let (kafka, pg) = cluster_and_postgres(ClusterSpec::kafka4(), on_pg).await;
    let client = Client::connect(ClientConfig::new(kafka.bootstrap()))
        .await
        .unwrap();
    let setup = Setup {
        client: client.clone(),
        protocol,
        mode,
        postgres: pg.as_ref().map(|pg| {
            let mut c = PgStoreConfig::new(pg.url());
            c.table_prefix = "sf_two_inputs".into();
            c
        }),
        inputs: [unique("orders"), unique("payments")],
        snapshots: unique("orders-snap"),
        group: unique("two-inputs"),
        prefix: unique("two-inputs-txn"),
    };
    for t in &setup.inputs {
        snapfence::admin::create_topic(&client, t, PARTITIONS, -1, &[])
            .await
            .unwrap();
    }
    snapfence::admin::create_topic(
        &client,
        &setup.snapshots,
        PARTITIONS,
        -1,
        &[("cleanup.policy", "compact")],
    )
    .await
    .unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default())
        .await
        .unwrap();
    let (mut t, mut seq) = (1_796_083_200_000, 0);
    let mut all = Vec::new();

    // The first owner folds a first part and commits it, then a second part it only persists, and
    // crashes: its snapshots account for events past the committed offsets of both topics.
    setup
        .add_part(&producer, &mut all, 1, &mut t, &mut seq)
        .await;
    let mut first = setup.flow().await;
    setup.fold_to(&mut first, &ends_of(&all)).await;
    first.persist().await.unwrap();
    first.commit().await.unwrap();
    let committed = ends_of(&all);
    assert_eq!(setup.committed().await, committed);
    setup
        .add_part(&producer, &mut all, 2, &mut t, &mut seq)
        .await;
    setup.fold_to(&mut first, &ends_of(&all)).await;
    first.persist().await.unwrap();
    assert_eq!(
        states(&first),
        expected(&all),
        "the first owner's merged fold"
    );
    drop(first);
    assert_eq!(
        setup.committed().await,
        committed,
        "nothing committed past the first part"
    );

    // The next owner replays both topics from their committed offsets, skipping what the snapshots
    // account for topic by topic, and folds a third part.
    setup
        .add_part(&producer, &mut all, 3, &mut t, &mut seq)
        .await;
    let mut second = setup.flow().await;
    setup.fold_to(&mut second, &ends_of(&all)).await;
    second.persist().await.unwrap();
    second.commit().await.unwrap();
    assert_eq!(states(&second), expected(&all), "replayed through a crash");
    second.close().await.unwrap();
    assert_eq!(
        setup.committed().await,
        ends_of(&all),
        "one transaction committed both topics' offsets"
    );

    // The snapshots carry an offset per topic (and the fencing rows both offsets).
    let last: HashMap<Bytes, Bytes> = match &setup.postgres {
        None => {
            let snapshots = protocol_tests::campaign::read_topic(
                &client,
                &setup.snapshots,
                PARTITIONS,
                snapfence::records::IsolationLevel::ReadCommitted,
            )
            .await
            .unwrap();
            snapshots
                .into_iter()
                .filter_map(|(k, v, _)| Some((k?, v?)))
                .collect()
        }
        Some(pg) => {
            let mut last = HashMap::new();
            let ends = ends_of(&all);
            for p in 0..PARTITIONS {
                let view = inspect_partition(pg, &setup.prefix, p).await.unwrap();
                let expected = (mode == PersistenceMode::Transactional)
                    .then(|| vec![ends[&(0, p)], ends[&(1, p)]]);
                assert_eq!(view.input_offsets, expected, "partition {p}'s fencing row");
                for (k, v) in &view.snapshots {
                    last.insert(Bytes::copy_from_slice(k), Bytes::copy_from_slice(v));
                }
            }
            last
        }
    };
    assert_eq!(last.len(), KEYS);
    for v in last.values() {
        assert!(
            matches!(open_snapshot_value(v), Ok(SnapshotValue::LiveInputs { last_offsets, .. }) if last_offsets.len() == 2),
            "{v:?}"
        );
    }

    // A third owner recovers it all from the snapshots.
    let mut third = setup.flow().await;
    let handle = third.handle();
    let ready = tokio::spawn(async move { handle.ready().await });
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready.is_finished() {
        assert!(Instant::now() < deadline, "the third owner never got ready");
        third.poll_once(Duration::from_millis(100)).await.unwrap();
    }
    ready.await.unwrap().unwrap();
    assert_eq!(
        states(&third),
        expected(&all),
        "recovered from the snapshots"
    );
    third.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inputs_that_are_not_co_partitioned_are_refused() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let client = Client::connect(ClientConfig::new(kafka.bootstrap()))
        .await
        .unwrap();
    let setup = Setup {
        client: client.clone(),
        protocol: GroupProtocol::Classic {
            assignors: vec![Assignor::Range],
        },
        mode: PersistenceMode::Transactional,
        postgres: None,
        inputs: [unique("left"), unique("right")],
        snapshots: unique("left-snap"),
        group: unique("refused"),
        prefix: unique("refused-txn"),
    };
    snapfence::admin::create_topic(&client, &setup.inputs[0], 2, -1, &[])
        .await
        .unwrap();
    snapfence::admin::create_topic(&client, &setup.inputs[1], 3, -1, &[])
        .await
        .unwrap();
    snapfence::admin::create_topic(
        &client,
        &setup.snapshots,
        2,
        -1,
        &[("cleanup.policy", "compact")],
    )
    .await
    .unwrap();
    let range = GroupProtocol::Classic {
        assignors: vec![Assignor::Range],
    };
    match Flow::start(client.clone(), setup.config(range), Trail).await {
        Err(FlowError::SnapshotTopic(SnapshotTopicError::InputPartitionMismatch {
            partitions: 3,
            first_partitions: 2,
            ..
        })) => {}
        other => panic!(
            "a mismatched partition count must be refused: {:?}",
            other.err()
        ),
    }
    // Assignors that place each topic's partitions on their own, under either protocol.
    for protocol in [
        GroupProtocol::Classic {
            assignors: vec![Assignor::CooperativeSticky],
        },
        GroupProtocol::Classic {
            assignors: vec![Assignor::Range, Assignor::RoundRobin],
        },
        GroupProtocol::Consumer {
            server_assignor: None,
        },
        GroupProtocol::Consumer {
            server_assignor: Some("uniform".into()),
        },
    ] {
        match Flow::start(client.clone(), setup.config(protocol.clone()), Trail).await {
            Err(FlowError::Snapshot(SnapshotError::Config(why))) => {
                assert!(why.to_lowercase().contains("range"), "{why}")
            }
            other => panic!("{protocol:?} must be refused: {:?}", other.err()),
        }
    }
}
