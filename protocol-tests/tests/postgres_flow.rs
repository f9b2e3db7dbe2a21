//! The #732 pair on the PostgreSQL snapshot store: a stale owner's late flush after a handover.
//! Unfenced (plain upserts, offsets committed by the consumer) its rows land over the new owner's and
//! the next recovery folds onto stale state; fenced (Kafka 2PC plus the fencing row) the same sequence
//! is refused and a fresh owner's state equals a fold of all input from scratch.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol_tests::tally::{fold_all, Counter, Tally};
use protocol_tests::{cluster, unique, ClusterSpec, KafkaCluster, PostgresServer};
use snapfence::consumer::{GroupConfig, GroupConsumerConfig, OffsetReset};
use snapfence::net::{Client, ClientConfig};
use snapfence::producer::{Producer, ProducerConfig, ProducerRecord};
use snapfence::snapshot::postgres::PgStoreConfig;
use snapfence::snapshot::{Flow, FlowConfig, PersistenceMode, SnapshotConfig};

struct World {
    client: Client,
    input: String,
    group: String,
    prefix: String,
    pg: PgStoreConfig,
    producer: Producer,
    written: HashMap<Bytes, Vec<Bytes>>,
    seq: u64,
}

impl World {
    async fn new(kafka: &KafkaCluster, pg: &PostgresServer) -> World {
        let client = Client::connect(ClientConfig::new(&kafka.bootstrap()))
            .await
            .unwrap();
        let input = unique("pgflow-in");
        snapfence::admin::create_topic(&client, &input, 1, -1, &[])
            .await
            .unwrap();
        let producer = Producer::new(client.clone(), ProducerConfig::default())
            .await
            .unwrap();
        World {
            client,
            input,
            group: unique("pgflow-group"),
            prefix: unique("pgflow"),
            pg: PgStoreConfig::new(pg.url()),
            producer,
            written: HashMap::new(),
            seq: 0,
        }
    }

    async fn emit(&mut self, key: &str, n: usize) {
        let mut deliveries = Vec::new();
        for _ in 0..n {
            self.seq += 1;
            let value = Bytes::from(format!("{key}-event-{}", self.seq));
            let key = Bytes::copy_from_slice(key.as_bytes());
            self.written
                .entry(key.clone())
                .or_default()
                .push(value.clone());
            let record = ProducerRecord::new(self.input.as_str(), Some(value))
                .key(key)
                .partition(0);
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

    async fn flow(&self, mode: PersistenceMode) -> Flow<Counter> {
        let mut group = GroupConfig::new(&self.group);
        group.session_timeout = Duration::from_secs(6);
        group.heartbeat_interval = Duration::from_millis(500);
        group.max_poll_interval = Duration::from_secs(3);
        let mut consumer = GroupConsumerConfig::new(group);
        consumer.reader.reset = OffsetReset::Earliest;
        // The snapshot topic is named but never used (nor checked): snapshots go to PostgreSQL.
        let snapshots = SnapshotConfig::new("no-such-topic", &self.prefix);
        let mut c = FlowConfig::new(consumer, &self.input, snapshots);
        c.mode = mode;
        c.postgres = Some(self.pg.clone());
        Flow::start(self.client.clone(), c, Counter).await.unwrap()
    }
}

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

/// A owns the partition and persists; stalls holding newer in-memory state; B takes over, catches up,
/// persists and commits; A wakes and flushes its stale state. Returns what a fresh owner C recovers and
/// folds, what a fold of all input gives, and whether A's late flush was refused.
async fn handover(
    kafka: &KafkaCluster,
    pg: &PostgresServer,
    mode: PersistenceMode,
) -> (HashMap<Bytes, Tally>, HashMap<Bytes, Tally>, bool) {
    let mut w = World::new(kafka, pg).await;
    w.emit("a", 5).await;
    w.emit("b", 5).await;
    let mut a = w.flow(mode).await;
    poll_until(&mut a, 10).await;
    a.persist().await.unwrap();
    a.commit().await.unwrap();

    w.emit("a", 5).await;
    poll_until(&mut a, 15).await;

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

    let persisted = a.persist().await;
    let absorbed = a.stats();
    let refused = persisted.is_err() || absorbed.fences_recovered + absorbed.rejoins > 0;
    drop(a);
    drop(b);

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
    (got, w.expected(), refused)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_732_on_postgres_unfenced_corrupts_fenced_prevents() {
    let kafka = cluster(ClusterSpec::kafka4().with_two_phase_commit()).await;
    let pg = tokio::task::spawn_blocking(PostgresServer::start)
        .await
        .unwrap()
        .expect("start PostgreSQL");

    let (got, want, refused) = handover(&kafka, &pg, PersistenceMode::NonTransactional).await;
    assert!(!refused, "the unfenced stale flush was expected to land");
    assert_ne!(
        got, want,
        "unfenced, the stale rows must corrupt the recovered state"
    );

    let (got, want, refused) = handover(&kafka, &pg, PersistenceMode::Transactional).await;
    assert!(refused, "the fenced stale flush must be refused");
    assert_eq!(got, want, "fenced, recovery must equal a fold of all input");
}
