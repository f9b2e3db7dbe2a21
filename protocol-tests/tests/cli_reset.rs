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
