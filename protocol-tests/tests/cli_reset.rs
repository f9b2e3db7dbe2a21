//! `snapfence reset` against a real broker, with real flows on both sides of it: a flow folds its input
//! and closes, the tool moves its group and deletes the snapshots the new position contradicts, and a new
//! flow must then end with exactly the state the snapshot rule promises (docs/cli.md, "reset"). The tool
//! runs in-process through `snapfence_cli::run`, as the cli crate's own tests run it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol_tests::tally::{fold_all, Counter, Tally};
use protocol_tests::{cluster, unique, ClusterSpec, KafkaCluster, PostgresServer};
use serde_json::Value;
use snapfence::consumer::{
    committed_offsets, GroupConfig, GroupConsumerConfig, GroupProtocol, OffsetReset, TopicPartition,
};
use snapfence::net::{Client, ClientConfig};
use snapfence::producer::{
    Producer, ProducerConfig, ProducerRecord, TransactionalConfig, TransactionalProducer,
};
use snapfence::snapshot::postgres::PgStoreConfig;
use snapfence::snapshot::{Flow, FlowConfig, SnapshotConfig};

struct Run {
    code: i32,
    out: String,
    err: String,
}

impl Run {
    fn ok(self) -> Run {
        assert_eq!(
            self.code, 0,
            "exit {}\nstdout:\n{}\nstderr:\n{}",
            self.code, self.out, self.err
        );
        self
    }

    /// The output's JSON lines.
    fn json_lines(&self) -> Vec<Value> {
        self.out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect()
    }
}

async fn snapfence(kafka: &KafkaCluster, args: &[&str]) -> Run {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let mut input = std::io::empty();
    let mut io = snapfence_cli::Io {
        out: &mut out,
        err: &mut err,
        input: &mut input,
        progress: false,
    };
    let bootstrap = kafka.bootstrap();
    let argv = ["snapfence", "--bootstrap", bootstrap.as_str()]
        .into_iter()
        .chain(args.iter().copied());
    let code = snapfence_cli::run(argv, &mut io).await;
    Run {
        code,
        out: String::from_utf8(out).expect("utf8"),
        err: String::from_utf8(err).expect("utf8"),
    }
}

/// One input event as written: its key, value, partition and offset.
struct Event {
    key: Bytes,
    value: Bytes,
    partition: i32,
    offset: i64,
}

struct World {
    client: Client,
    input: String,
    snapshots: String,
    group: String,
    prefix: String,
    partitions: i32,
    protocol: GroupProtocol,
    producer: Producer,
    events: Vec<Event>,
    /// Snapshots in PostgreSQL instead of the snapshot topic.
    postgres: Option<PgStoreConfig>,
}

impl World {
    async fn new(kafka: &KafkaCluster, partitions: i32, protocol: GroupProtocol) -> World {
        let client = Client::connect(ClientConfig::new(kafka.bootstrap()))
            .await
            .unwrap();
        let (input, snapshots) = protocol_tests::flow_topics(&client, "reset", partitions).await;
        let producer = Producer::new(client.clone(), ProducerConfig::default())
            .await
            .unwrap();
        World {
            client,
            input,
            snapshots,
            group: unique("reset-group"),
            prefix: unique("reset-tx"),
            partitions,
            protocol,
            producer,
            events: Vec::new(),
            postgres: None,
        }
    }

    /// Writes `n` events of `key` to `partition`, in order, recording their offsets.
    async fn emit(&mut self, key: &str, partition: i32, n: usize) {
        for _ in 0..n {
            let value = Bytes::from(format!("{key}-{}", self.events.len()));
            let key = Bytes::copy_from_slice(key.as_bytes());
            let record = ProducerRecord::new(self.input.as_str(), Some(value.clone()))
                .key(key.clone())
                .partition(partition);
            let meta = self.producer.send(record).await.unwrap().await.unwrap();
            self.events.push(Event {
                key,
                value,
                partition,
                offset: meta.offset.expect("an offset"),
            });
        }
    }

    /// The fold of every event with an offset at or past `from` of its partition, per key.
    fn fold_from(&self, from: impl Fn(i32) -> i64) -> HashMap<Bytes, Tally> {
        let mut per_key: HashMap<Bytes, Vec<Bytes>> = HashMap::new();
        for e in self.events.iter().filter(|e| e.offset >= from(e.partition)) {
            per_key
                .entry(e.key.clone())
                .or_default()
                .push(e.value.clone());
        }
        per_key
            .into_iter()
            .filter_map(|(k, vs)| Some((k, fold_all(&vs)?)))
            .collect()
    }

    fn config(&self) -> FlowConfig {
        let mut group = GroupConfig::new(&self.group);
        group.session_timeout = Duration::from_secs(10);
        group.heartbeat_interval = Duration::from_millis(500);
        group.protocol = self.protocol.clone();
        let mut consumer = GroupConsumerConfig::new(group);
        consumer.reader.reset = OffsetReset::Earliest;
        let mut snapshots = SnapshotConfig::new(&self.snapshots, &self.prefix);
        snapshots.recovery_stall_timeout = Some(Duration::from_secs(30));
        let mut config = FlowConfig::new(consumer, &self.input, snapshots);
        config.postgres = self.postgres.clone();
        config
    }

    /// Starts a flow and polls it until it holds every partition and has read each to its end; returns
    /// it with its state over all partitions.
    async fn caught_up_flow(&self) -> (Flow<Counter>, HashMap<Bytes, Tally>) {
        let mut flow = Flow::start(self.client.clone(), self.config(), Counter)
            .await
            .unwrap();
        let ends: Vec<i64> = (0..self.partitions)
            .map(|p| {
                self.events
                    .iter()
                    .filter(|e| e.partition == p)
                    .map(|e| e.offset + 1)
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            flow.poll_once(Duration::from_millis(100)).await.unwrap();
            let caught_up = (0..self.partitions)
                .all(|p| flow.position(p).is_some_and(|at| at >= ends[p as usize]));
            if caught_up {
                break;
            }
            assert!(Instant::now() < deadline, "the flow never caught up");
        }
        let mut state = HashMap::new();
        for p in 0..self.partitions {
            state.extend(flow.state(p).unwrap());
        }
        (flow, state)
    }

    async fn committed(&self) -> Vec<Option<i64>> {
        let tps: Vec<TopicPartition> = (0..self.partitions)
            .map(|p| TopicPartition::new(self.input.as_str(), p))
            .collect();
        let got = committed_offsets(&self.client, &self.group, &tps)
            .await
            .unwrap();
        tps.iter().map(|tp| got[tp]).collect()
    }

    /// What `recover` reads back from every snapshot partition: (key, envelope offset or -1 for a grave),
    /// sorted.
    async fn snapshot_keys(&self, kafka: &KafkaCluster) -> Vec<(String, i64)> {
        let run = snapfence(
            kafka,
            &["--format", "json", "recover", &self.snapshots, "--keys"],
        )
        .await
        .ok();
        let mut keys = Vec::new();
        for doc in run.json_lines() {
            for k in doc["key_list"].as_array().into_iter().flatten() {
                let offset = match k["kind"].as_str() {
                    Some("live") => k["last_offset"].as_i64().unwrap(),
                    _ => -1,
                };
                keys.push((k["key"]["data"].as_str().unwrap().to_owned(), offset));
            }
        }
        keys.sort();
        keys
    }

    fn reset_args<'a>(&'a self, extra: &[&'a str]) -> Vec<&'a str> {
        let mut args = vec![
            "reset",
            "--group",
            &self.group,
            "--input",
            &self.input,
            "--snapshots",
            &self.snapshots,
            "--prefix",
            &self.prefix,
        ];
        args.extend_from_slice(extra);
        args
    }
}

fn protocols() -> [GroupProtocol; 2] {
    [
        GroupConfig::new("-").protocol,
        GroupProtocol::Consumer {
            server_assignor: None,
        },
    ]
}

/// A reset while the group has a member is refused with its own exit status and changes nothing: the
/// member would commit over it and keep folding onto the state the reset deletes. Classic and KIP-848
/// groups alike (DescribeGroups and ConsumerGroupDescribe).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_with_a_live_member_is_refused_and_changes_nothing() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    for protocol in protocols() {
        let mut w = World::new(&kafka, 1, protocol.clone()).await;
        w.emit("a", 0, 4).await;
        let (mut flow, _) = w.caught_up_flow().await;
        flow.persist().await.unwrap();
        flow.commit().await.unwrap();
        let (committed, snapshots) = (w.committed().await, w.snapshot_keys(&kafka).await);
        assert_eq!(committed, [Some(4)], "{protocol:?}");
        assert_eq!(snapshots, [("a".to_owned(), 3)], "{protocol:?}");

        let refused = snapfence(&kafka, &w.reset_args(&["--to-earliest", "--execute"])).await;
        assert_eq!(
            refused.code,
            snapfence_cli::error::EXIT_GROUP_ACTIVE,
            "{protocol:?}\n{}\n{}",
            refused.out,
            refused.err
        );
        assert!(
            refused.err.contains("has members") && refused.err.contains("next step"),
            "{}",
            refused.err
        );
        assert_eq!(w.committed().await, committed, "{protocol:?}");
        assert_eq!(w.snapshot_keys(&kafka).await, snapshots, "{protocol:?}");
        // The member is still the owner: it commits on as before.
        w.emit("a", 0, 1).await;
        let deadline = Instant::now() + Duration::from_secs(30);
        while flow.position(0) != Some(5) {
            flow.poll_once(Duration::from_millis(100)).await.unwrap();
            assert!(Instant::now() < deadline, "{protocol:?}: no progress");
        }
        flow.close().await.unwrap();
        assert_eq!(w.committed().await, [Some(5)], "{protocol:?}");
    }
}

/// After a flow folded everything and closed, `reset --to-earliest --execute` leaves the group at each
/// partition's log start and no snapshot behind, and the next flow folds all input once: its state is a
/// fold of all input, not a doubled one. Classic and KIP-848 groups (the commit as no member is taken
/// from both once they are empty).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_to_earliest_refolds_all_input_exactly_once() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    for protocol in protocols() {
        let mut w = World::new(&kafka, 2, protocol.clone()).await;
        w.emit("a", 0, 3).await;
        w.emit("b", 1, 2).await;
        w.emit("c", 0, 2).await;
        w.emit("a", 0, 1).await;
        let all = w.fold_from(|_| 0);
        let (flow, state) = w.caught_up_flow().await;
        assert_eq!(state, all, "{protocol:?}");
        flow.close().await.unwrap();
        assert_eq!(w.committed().await, [Some(6), Some(2)], "{protocol:?}");

        let run = snapfence(
            &kafka,
            &w.reset_args(&["--to-earliest", "--execute", "--format", "json"]),
        )
        .await
        .ok();
        let doc = &run.json_lines()[0];
        assert_eq!(doc["outcome"], "reset", "{doc}");
        assert_eq!(doc["delete"], 3, "{doc}");
        assert_eq!(doc["partitions"][0]["direction"], "backward", "{doc}");
        assert_eq!(w.committed().await, [Some(0), Some(0)], "{protocol:?}");
        assert!(
            w.snapshot_keys(&kafka).await.is_empty(),
            "{protocol:?}: the tombstones leave no key to recover"
        );

        let (flow, state) = w.caught_up_flow().await;
        assert_eq!(state, all, "{protocol:?}: each event folded once");
        flow.close().await.unwrap();
        assert_eq!(w.committed().await, [Some(6), Some(2)], "{protocol:?}");
    }
}

/// A reset to a middle offset N deletes exactly the snapshots at or past N and keeps the rest. The next
/// flow then holds, per key: the whole fold for a key whose last event lies before N (kept, never
/// refolded), and for a key with events at or past N a fold of only those (its snapshot deleted, it starts
/// from nothing at N).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_to_a_middle_offset_deletes_only_the_snapshots_at_or_past_it() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let mut w = World::new(&kafka, 1, GroupConfig::new("-").protocol).await;
    w.emit("a", 0, 3).await; // 0..=2
    w.emit("b", 0, 3).await; // 3..=5: b's last event is before N
    w.emit("c", 0, 2).await; // 6, 7
    w.emit("a", 0, 2).await; // 8, 9
    w.emit("d", 0, 2).await; // 10, 11
    const N: i64 = 6;
    let (flow, state) = w.caught_up_flow().await;
    assert_eq!(state, w.fold_from(|_| 0));
    flow.close().await.unwrap();
    let before = w.snapshot_keys(&kafka).await;
    assert_eq!(
        before,
        [
            ("a".to_owned(), 9),
            ("b".to_owned(), 5),
            ("c".to_owned(), 7),
            ("d".to_owned(), 11)
        ]
    );

    // A straggling owner of snapshot partition 0 with a transaction open: a snapshot of z it never
    // committed. The reset's InitProducerId on <prefix>-0 must abort it (and the read must not wait it out).
    let mut straggler = TransactionalProducer::init(
        w.client.clone(),
        TransactionalConfig::new(format!("{}-0", w.prefix)),
    )
    .await
    .unwrap();
    straggler.begin().unwrap();
    let late = [&[1u8][..], &100i64.to_be_bytes(), b"late"].concat();
    straggler
        .send(
            ProducerRecord::new(w.snapshots.as_str(), Some(Bytes::from(late)))
                .key(Bytes::from_static(b"z"))
                .partition(0),
        )
        .await
        .unwrap()
        .await
        .unwrap();

    let to = format!("0:{N}");
    let run = snapfence(&kafka, &w.reset_args(&["--to-offset", &to, "--execute"]))
        .await
        .ok();
    eprintln!("{}", run.out);
    assert!(
        run.out
            .contains("p0: 3 tombstone(s) committed in one transaction of")
            && run.out.contains("back 6"),
        "{}",
        run.out
    );
    assert_eq!(w.committed().await, [Some(N)]);
    assert_eq!(w.snapshot_keys(&kafka).await, [("b".to_owned(), 5)]);
    let fenced = straggler.commit().await.unwrap_err();
    assert!(fenced.is_fatal(), "the straggler is fenced: {fenced:?}");

    // The promised state, built key by key from the events.
    let whole = w.fold_from(|_| 0);
    let from_n = w.fold_from(|_| N);
    let mut expected = HashMap::new();
    for key in whole.keys() {
        let last = w
            .events
            .iter()
            .filter(|e| e.key == *key)
            .map(|e| e.offset)
            .max()
            .unwrap();
        let tally = if last < N { whole[key] } else { from_n[key] };
        expected.insert(key.clone(), tally);
    }
    assert_eq!(expected[&Bytes::from_static(b"a")].count, 2);
    assert_eq!(expected[&Bytes::from_static(b"b")].count, 3);
    let (flow, state) = w.caught_up_flow().await;
    assert_eq!(state, expected);
    flow.close().await.unwrap();
}

/// Without --execute, reset prints the plan (each partition's committed and new offset, the move, what
/// it would delete, the rule) and changes nothing: neither the committed offsets nor the snapshots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_prints_the_plan_and_changes_nothing() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let mut w = World::new(&kafka, 2, GroupConfig::new("-").protocol).await;
    w.emit("a", 0, 3).await;
    w.emit("b", 1, 2).await;
    let (flow, _) = w.caught_up_flow().await;
    flow.close().await.unwrap();
    let (committed, snapshots) = (w.committed().await, w.snapshot_keys(&kafka).await);
    assert_eq!(committed, [Some(3), Some(2)]);

    let text = snapfence(&kafka, &w.reset_args(&["--to-earliest"]))
        .await
        .ok()
        .out;
    eprintln!("{text}");
    assert!(
        text.contains("dry run: nothing was changed")
            && text.contains("back 3")
            && text.contains("back 2")
            && text.contains("rule: "),
        "{text}"
    );
    let json = snapfence(
        &kafka,
        &w.reset_args(&["--to-timestamp", "0", "--format", "json"]),
    )
    .await
    .ok();
    let doc = &json.json_lines()[0];
    assert_eq!(doc["outcome"], "planned", "{doc}");
    assert_eq!(doc["delete"], 2, "{doc}");
    assert_eq!(doc["partitions"][1]["committed"], 2, "{doc}");
    assert_eq!(doc["partitions"][1]["new_offset"], 0, "{doc}");
    // Forward, to the end: nothing is deleted.
    let latest = snapfence(&kafka, &w.reset_args(&["--to-latest", "--format", "json"]))
        .await
        .ok();
    let doc = &latest.json_lines()[0];
    assert_eq!(doc["delete"], 0, "{doc}");
    assert_eq!(doc["partitions"][0]["direction"], "unchanged", "{doc}");
    // An offset outside the log is refused before anything is read.
    let outside = snapfence(&kafka, &w.reset_args(&["--to-offset", "0:99"])).await;
    assert_eq!(
        outside.code,
        snapfence_cli::error::EXIT_NOT_FOUND,
        "{}",
        outside.err
    );

    assert_eq!(w.committed().await, committed);
    assert_eq!(w.snapshot_keys(&kafka).await, snapshots);
}

/// The same middle-offset reset on a flow that keeps its snapshots in PostgreSQL: the rows at or past N
/// are deleted and the fencing row records N (a takeover starts at the later of it and the group's
/// offset, so leaving it would undo the reset), its owner epoch is bumped (so every earlier owner's
/// flush fails its compare-and-set), a dry run changes nothing, and the next flow ends with exactly the
/// state the rule promises.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_on_the_postgres_store_moves_the_fencing_row_and_deletes_the_rows_at_or_past_it() {
    let kafka = cluster(ClusterSpec::kafka4().with_two_phase_commit()).await;
    let pg = tokio::task::spawn_blocking(PostgresServer::start)
        .await
        .unwrap()
        .expect("start PostgreSQL");
    let mut w = World::new(&kafka, 1, GroupConfig::new("-").protocol).await;
    let store = PgStoreConfig::new(pg.url());
    w.postgres = Some(store.clone());
    w.emit("a", 0, 3).await; // 0..=2
    w.emit("b", 0, 3).await; // 3..=5
    w.emit("c", 0, 2).await; // 6, 7
    w.emit("a", 0, 2).await; // 8, 9
    const N: i64 = 6;
    let (flow, state) = w.caught_up_flow().await;
    assert_eq!(state, w.fold_from(|_| 0));
    flow.close().await.unwrap();
    let view = snapfence::snapshot::postgres::inspect_partition(&store, &w.prefix, 0)
        .await
        .unwrap();
    assert_eq!(view.committed_offset, Some(10));
    assert_eq!(view.snapshots.len(), 3);

    let url = pg.url();
    let base = [
        "reset",
        "--group",
        w.group.as_str(),
        "--input",
        w.input.as_str(),
        "--postgres",
        url.as_str(),
        "--prefix",
        w.prefix.as_str(),
        "--to-offset",
        "6",
    ];
    let dry = snapfence(&kafka, &base).await.ok();
    assert!(
        dry.out.contains("store offset") && dry.out.contains("dry run"),
        "{}",
        dry.out
    );
    let unchanged = snapfence::snapshot::postgres::inspect_partition(&store, &w.prefix, 0)
        .await
        .unwrap();
    assert_eq!(unchanged.committed_offset, Some(10));
    assert_eq!(unchanged.snapshots, view.snapshots);

    let mut execute = base.to_vec();
    execute.push("--execute");
    let run = snapfence(&kafka, &execute).await.ok();
    assert!(
        run.out.contains("p0: 2 snapshot row(s) deleted, 1 kept"),
        "{}",
        run.out
    );
    let after = snapfence::snapshot::postgres::inspect_partition(&store, &w.prefix, 0)
        .await
        .unwrap();
    assert_eq!(after.committed_offset, Some(N));
    assert!(
        after.owner_epoch > view.owner_epoch,
        "the reset bumped the epoch"
    );
    let kept: Vec<&[u8]> = after.snapshots.iter().map(|(k, _)| k).collect();
    assert_eq!(kept, [&b"b"[..]]);
    assert_eq!(w.committed().await, [Some(N)]);

    let whole = w.fold_from(|_| 0);
    let from_n = w.fold_from(|_| N);
    let expected: HashMap<Bytes, Tally> = [
        (Bytes::from_static(b"a"), from_n[&Bytes::from_static(b"a")]),
        (Bytes::from_static(b"b"), whole[&Bytes::from_static(b"b")]),
        (Bytes::from_static(b"c"), from_n[&Bytes::from_static(b"c")]),
    ]
    .into();
    let (flow, state) = w.caught_up_flow().await;
    assert_eq!(state, expected);
    flow.close().await.unwrap();
}

/// One event of a two-input flow: which input, its key, value, partition, offset and timestamp.
struct TsEvent {
    input: usize,
    key: Bytes,
    value: Bytes,
    partition: i32,
    offset: i64,
    ts: i64,
}

/// A flow of two co-partitioned inputs (classic `range`), on the snapshot topic or PostgreSQL.
struct TwoInputs {
    client: Client,
    producer: Producer,
    inputs: [String; 2],
    snapshots: String,
    group: String,
    prefix: String,
    postgres: Option<PgStoreConfig>,
    events: Vec<TsEvent>,
}

const TWO_PARTITIONS: i32 = 2;

impl TwoInputs {
    async fn new(kafka: &KafkaCluster, postgres: Option<PgStoreConfig>) -> TwoInputs {
        let client = Client::connect(ClientConfig::new(kafka.bootstrap()))
            .await
            .unwrap();
        let (first, snapshots) =
            protocol_tests::flow_topics(&client, "reset-two", TWO_PARTITIONS).await;
        let second = unique("reset-two-b");
        snapfence::admin::create_topic(&client, &second, TWO_PARTITIONS, -1, &[])
            .await
            .unwrap();
        let producer = Producer::new(client.clone(), ProducerConfig::default())
            .await
            .unwrap();
        TwoInputs {
            client,
            producer,
            inputs: [first, second],
            snapshots,
            group: unique("reset-two-group"),
            prefix: unique("reset-two-tx"),
            postgres,
            events: Vec::new(),
        }
    }

    /// Events `from..to` over the first `keys` keys, on both inputs (or on `only` one), one timestamp
    /// each (rising, no ties), so the merged order is the order written.
    async fn produce(&mut self, from: usize, to: usize, keys: usize, only: Option<usize>) {
        for i in from..to {
            let input = only.unwrap_or(usize::from(i % 3 == 1));
            let k = (i * 7) % keys;
            let key = Bytes::from(format!("k{k}"));
            let partition = i32::try_from(k).unwrap() % TWO_PARTITIONS;
            let ts = 1_796_083_200_000 + i64::try_from(i).unwrap() * 1000;
            let value = Bytes::from(format!("{}{i}", ["a", "b"][input]));
            let record = ProducerRecord::new(self.inputs[input].as_str(), Some(value.clone()))
                .key(key.clone())
                .partition(partition)
                .timestamp(ts);
            let meta = self.producer.send(record).await.unwrap().await.unwrap();
            self.events.push(TsEvent {
                input,
                key,
                value,
                partition,
                offset: meta.offset.expect("an offset"),
                ts,
            });
        }
    }

    fn config(&self) -> FlowConfig {
        let mut group = GroupConfig::new(&self.group);
        group.session_timeout = Duration::from_secs(10);
        group.heartbeat_interval = Duration::from_millis(500);
        group.protocol = GroupProtocol::Classic {
            assignors: vec![snapfence::consumer::Assignor::Range],
        };
        let mut consumer = GroupConsumerConfig::new(group);
        consumer.reader.reset = OffsetReset::Earliest;
        let mut config = FlowConfig::new(
            consumer,
            &self.inputs[0],
            SnapshotConfig::new(&self.snapshots, &self.prefix),
        );
        config.more_input_topics = vec![self.inputs[1].clone()];
        config.postgres = self.postgres.clone();
        config
    }

    /// Each input partition's end.
    fn end(&self, input: usize, partition: i32) -> i64 {
        self.events
            .iter()
            .filter(|e| e.input == input && e.partition == partition)
            .map(|e| e.offset + 1)
            .max()
            .unwrap_or(0)
    }

    /// Per key, the fold in merged order of its events at or past `from(input, partition)`; for a key
    /// in `whole`, of all its events.
    fn fold(&self, from: impl Fn(usize, i32) -> i64, whole: &[Bytes]) -> HashMap<Bytes, Tally> {
        let mut merged: Vec<&TsEvent> = self.events.iter().collect();
        merged.sort_by_key(|e| (e.ts, e.input));
        let mut per_key: HashMap<Bytes, Vec<Bytes>> = HashMap::new();
        for e in merged {
            if whole.contains(&e.key) || e.offset >= from(e.input, e.partition) {
                per_key
                    .entry(e.key.clone())
                    .or_default()
                    .push(e.value.clone());
            }
        }
        per_key
            .into_iter()
            .filter_map(|(k, vs)| Some((k, fold_all(&vs)?)))
            .collect()
    }

    /// Starts a flow, folds every input to its end, and closes it; returns its state.
    async fn fold_all_and_close(&self) -> HashMap<Bytes, Tally> {
        let mut flow = self.start().await;
        let state = self.catch_up(&mut flow).await;
        flow.close().await.unwrap();
        state
    }

    async fn start(&self) -> Flow<Counter> {
        Flow::start(self.client.clone(), self.config(), Counter)
            .await
            .unwrap()
    }

    /// Polls `flow` until every input is folded to its end; returns its state.
    async fn catch_up(&self, flow: &mut Flow<Counter>) -> HashMap<Bytes, Tally> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            flow.poll_once(Duration::from_millis(100)).await.unwrap();
            let done = (0..TWO_PARTITIONS).all(|p| {
                flow.positions(p)
                    .is_some_and(|v| v == [self.end(0, p), self.end(1, p)])
            });
            if done {
                break;
            }
            assert!(Instant::now() < deadline, "the flow never caught up");
        }
        let mut state = HashMap::new();
        for p in 0..TWO_PARTITIONS {
            state.extend(flow.state(p).unwrap());
        }
        state
    }

    /// The group's committed offset per (input, partition).
    async fn committed(&self) -> Vec<Option<i64>> {
        let tps: Vec<TopicPartition> = (0..2)
            .flat_map(|i| (0..TWO_PARTITIONS).map(move |p| (i, p)))
            .map(|(i, p)| TopicPartition::new(self.inputs[i].as_str(), p))
            .collect();
        let got = committed_offsets(&self.client, &self.group, &tps)
            .await
            .unwrap();
        tps.iter().map(|tp| got[tp]).collect()
    }

    /// Every snapshot's key with its per-input offsets, from the snapshot topic or the store's rows.
    async fn envelopes(&self, kafka: &KafkaCluster) -> HashMap<Bytes, Vec<i64>> {
        let mut out = HashMap::new();
        match &self.postgres {
            Some(pg) => {
                for p in 0..TWO_PARTITIONS {
                    let view =
                        snapfence::snapshot::postgres::inspect_partition(pg, &self.prefix, p)
                            .await
                            .unwrap();
                    for (k, v) in &view.snapshots {
                        let opened = snapfence::snapshot::open_snapshot_value(v).unwrap();
                        out.insert(Bytes::copy_from_slice(k), opened.input_offsets());
                    }
                }
            }
            None => {
                let run = snapfence(
                    kafka,
                    &["--format", "json", "recover", &self.snapshots, "--keys"],
                )
                .await
                .ok();
                for doc in run.json_lines() {
                    for k in doc["key_list"].as_array().into_iter().flatten() {
                        let key = k["key"]["data"].as_str().unwrap().to_owned();
                        let offsets = k["input_offsets"]
                            .as_array()
                            .unwrap_or_else(|| panic!("no input offsets: {k}"))
                            .iter()
                            .map(|o| o.as_i64().unwrap())
                            .collect();
                        out.insert(Bytes::from(key), offsets);
                    }
                }
            }
        }
        out
    }

    fn reset_args<'a>(&'a self, url: &'a Option<String>, extra: &[&'a str]) -> Vec<&'a str> {
        let mut args = vec![
            "reset",
            "--group",
            &self.group,
            "--input",
            &self.inputs[0],
            "--input",
            &self.inputs[1],
            "--prefix",
            &self.prefix,
        ];
        match url {
            Some(url) => args.extend(["--postgres", url.as_str()]),
            None => args.extend(["--snapshots", self.snapshots.as_str()]),
        }
        args.extend_from_slice(extra);
        args
    }
}

/// A flow of two co-partitioned inputs is reset on both together. Naming one input is refused and
/// changes nothing. A reset to a time in the middle moves each input to its first event at or after it,
/// in one commit, and deletes exactly the snapshots that reach the new offset of either input (their
/// envelopes say where both inputs stood when they were written): the next flow then holds those keys
/// folded from the new offsets, and every other key's whole fold, in merged order. A reset to the
/// earliest offsets deletes every snapshot and the next flow folds all of both inputs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flow_with_two_inputs_is_reset_on_both() {
    two_inputs_reset(None).await;
}

/// The same on the PostgreSQL store: the fencing row records both inputs' new offsets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flow_with_two_inputs_is_reset_on_both_on_postgres() {
    let pg = tokio::task::spawn_blocking(PostgresServer::start)
        .await
        .unwrap()
        .expect("start PostgreSQL");
    let mut store = PgStoreConfig::new(pg.url());
    store.table_prefix = "sf_reset_two".into();
    two_inputs_reset(Some(store)).await;
}

async fn two_inputs_reset(postgres: Option<PgStoreConfig>) {
    let spec = if postgres.is_some() {
        ClusterSpec::kafka4().with_two_phase_commit()
    } else {
        ClusterSpec::kafka4()
    };
    let kafka = cluster(spec).await;
    let url = postgres.as_ref().map(|p| p.url.clone());
    let mut extra_pg = Vec::new();
    if let Some(p) = &postgres {
        extra_pg = vec!["--postgres-table-prefix", p.table_prefix.as_str()];
    }
    let mut w = TwoInputs::new(&kafka, postgres.clone()).await;
    // Four keys, persisted and committed; then more events of two of them, on the second input only.
    // The snapshots of the other two were written while both inputs stood before the second part;
    // those of the two reach past it on the second input only.
    w.produce(0, 48, 4, None).await;
    let mut flow = w.start().await;
    w.catch_up(&mut flow).await;
    flow.persist().await.unwrap();
    flow.commit().await.unwrap();
    w.produce(48, 72, 2, Some(1)).await;
    let all = w.fold(|_, _| 0, &[]);
    assert_eq!(w.catch_up(&mut flow).await, all, "the merged fold");
    flow.close().await.unwrap();
    let ends: Vec<Option<i64>> = (0..2)
        .flat_map(|i| (0..TWO_PARTITIONS).map(move |p| (i, p)))
        .map(|(i, p)| Some(w.end(i, p)))
        .collect();
    assert_eq!(w.committed().await, ends);

    // One input named: refused, nothing changed.
    let mut one = vec![
        "reset",
        "--group",
        w.group.as_str(),
        "--input",
        w.inputs[0].as_str(),
        "--prefix",
        w.prefix.as_str(),
        "--to-earliest",
        "--execute",
    ];
    match &url {
        Some(url) => one.extend(["--postgres", url.as_str()]),
        None => one.extend(["--snapshots", w.snapshots.as_str()]),
    }
    one.extend_from_slice(&extra_pg);
    let refused = snapfence(&kafka, &one).await;
    assert_eq!(refused.code, 1, "{}\n{}", refused.out, refused.err);
    assert!(
        refused.err.contains("accounts for 2 input topic(s)"),
        "{}",
        refused.err
    );
    assert_eq!(
        w.committed().await,
        ends,
        "the refused reset changed nothing"
    );

    // The start of the second part: each input's first event at or after it.
    let cut = w.events[48].ts;
    let n = |input: usize, partition: i32| {
        w.events
            .iter()
            .filter(|e| e.input == input && e.partition == partition && e.ts >= cut)
            .map(|e| e.offset)
            .min()
            .unwrap_or_else(|| w.end(input, partition))
    };
    let envelopes = w.envelopes(&kafka).await;
    let partition_of = |k: &Bytes| w.events.iter().find(|e| e.key == k).unwrap().partition;
    let (mut doomed, mut kept) = (Vec::new(), Vec::new());
    for (k, v) in &envelopes {
        let p = partition_of(k);
        if v.iter().enumerate().any(|(i, o)| *o >= n(i, p)) {
            doomed.push(k.clone());
        } else {
            kept.push(k.clone());
        }
    }
    assert!(
        !doomed.is_empty() && !kept.is_empty(),
        "a cut that keeps some keys and not others: {envelopes:?}"
    );
    let cut_text = cut.to_string();
    let mut args = w.reset_args(&url, &["--to-timestamp", &cut_text, "--execute"]);
    args.extend_from_slice(&extra_pg);
    args.extend(["--format", "json"]);
    let run = snapfence(&kafka, &args).await.ok();
    let doc = &run.json_lines()[0];
    assert_eq!(doc["outcome"], "reset", "{doc}");
    assert_eq!(doc["delete"], doomed.len(), "{doc}");
    assert_eq!(
        doc["partitions"][0]["inputs"][1]["topic"], w.inputs[1],
        "{doc}"
    );
    let moved: Vec<Option<i64>> = (0..2)
        .flat_map(|i| (0..TWO_PARTITIONS).map(move |p| (i, p)))
        .map(|(i, p)| Some(n(i, p)))
        .collect();
    assert_eq!(w.committed().await, moved, "one commit moved both inputs");
    if let Some(pg) = &postgres {
        for p in 0..TWO_PARTITIONS {
            let view = snapfence::snapshot::postgres::inspect_partition(pg, &w.prefix, p)
                .await
                .unwrap();
            assert_eq!(
                view.input_offsets,
                Some(vec![n(0, p), n(1, p)]),
                "p{p}'s fencing row"
            );
        }
    }
    let mut remaining: Vec<Bytes> = w.envelopes(&kafka).await.into_keys().collect();
    remaining.sort();
    let mut kept_sorted = kept.clone();
    kept_sorted.sort();
    assert_eq!(
        remaining, kept_sorted,
        "exactly the snapshots reaching a new offset went"
    );
    assert_eq!(
        w.fold_all_and_close().await,
        w.fold(n, &kept),
        "kept keys whole, the others folded from the new offsets"
    );

    // Back to the start: every snapshot goes, and all of both inputs is folded once.
    let mut args = w.reset_args(&url, &["--to-earliest", "--execute"]);
    args.extend_from_slice(&extra_pg);
    snapfence(&kafka, &args).await.ok();
    assert!(w.envelopes(&kafka).await.is_empty());
    assert_eq!(w.fold_all_and_close().await, all, "each event once");
}
