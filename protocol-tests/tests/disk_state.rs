//! The flow's on-disk state (`StateConfig::Disk`, the `disk-state` feature) on a real broker: a member
//! restarted on its data directory reads only what was written since its image's checkpoint and ends
//! with the state a fold of all input gives; an image that belongs elsewhere, is too old to have seen
//! every tombstone, has lost the log under it, or is corrupt is never used: the partition is read whole,
//! and the flow says why.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol_tests::tally::{fold_all, Counter, Tally};
use protocol_tests::{cluster, unique, ClusterSpec, KafkaCluster};
use snapfence::consumer::{
    list_offsets, GroupConfig, GroupConsumerConfig, OffsetReset, OffsetSpec,
};
use snapfence::net::{Client, ClientConfig};
use snapfence::producer::{Producer, ProducerConfig, ProducerRecord, TopicPartition};
use snapfence::records::IsolationLevel;
use snapfence::snapshot::{DiskState, DiskStats, Flow, FlowConfig, SnapshotConfig, StateConfig};

struct World {
    client: Client,
    input: String,
    snapshots: String,
    group: String,
    txn_prefix: String,
    producer: Producer,
    partitions: i32,
    /// Every event written, per key, in order: the oracle.
    written: HashMap<Bytes, Vec<Bytes>>,
    /// Events written per partition.
    per_partition: HashMap<i32, i64>,
    /// Data directories made by this world, removed when it is dropped.
    dirs: Vec<PathBuf>,
    /// The members' `DiskState::memory_budget`.
    budget: Option<u64>,
}

impl Drop for World {
    fn drop(&mut self) {
        for dir in &self.dirs {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl World {
    async fn new(
        kafka: &KafkaCluster,
        partitions: i32,
        snapshot_configs: &[(&str, &str)],
    ) -> World {
        World::with_replicas(kafka, partitions, -1, snapshot_configs).await
    }

    /// A world whose snapshot topic has `replicas` replicas (-1: the broker's default).
    async fn with_replicas(
        kafka: &KafkaCluster,
        partitions: i32,
        replicas: i16,
        snapshot_configs: &[(&str, &str)],
    ) -> World {
        let client = Client::connect(ClientConfig::new(kafka.bootstrap()))
            .await
            .unwrap();
        let input = unique("input");
        let snapshots = unique("snapshots");
        snapfence::admin::create_topic(&client, &input, partitions, -1, &[])
            .await
            .unwrap();
        let mut configs = snapshot_configs.to_vec();
        if !configs.iter().any(|(k, _)| *k == "cleanup.policy") {
            configs.push(("cleanup.policy", "compact"));
        }
        snapfence::admin::create_topic(&client, &snapshots, partitions, replicas, &configs)
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
            partitions,
            written: HashMap::new(),
            per_partition: HashMap::new(),
            dirs: Vec::new(),
            budget: None,
        }
    }

    /// A fresh data directory.
    fn dir(&mut self, name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(unique(&format!("snapfence-state-{name}")));
        self.dirs.push(dir.clone());
        dir
    }

    /// `n` events for each of `keys`, each key on partition (its number mod the partition count).
    async fn emit(&mut self, keys: std::ops::Range<usize>, n: usize, tag: &str) {
        let mut deliveries = Vec::new();
        for round in 0..n {
            for k in keys.clone() {
                let key = Bytes::from(format!("k{k:04}"));
                let value = Bytes::from(format!("{tag}-{round}"));
                self.push(key, value, &mut deliveries).await;
            }
        }
        for d in deliveries {
            d.await.unwrap();
        }
    }

    /// Deletes key `k`.
    async fn delete(&mut self, k: usize) {
        let mut deliveries = Vec::new();
        let key = Bytes::from(format!("k{k:04}"));
        self.push(key, Bytes::from_static(b"x-del"), &mut deliveries)
            .await;
        for d in deliveries {
            d.await.unwrap();
        }
    }

    async fn push(
        &mut self,
        key: Bytes,
        value: Bytes,
        deliveries: &mut Vec<snapfence::producer::Delivery>,
    ) {
        let k: i32 = std::str::from_utf8(&key[1..]).unwrap().parse().unwrap();
        let partition = k % self.partitions;
        self.written
            .entry(key.clone())
            .or_default()
            .push(value.clone());
        *self.per_partition.entry(partition).or_default() += 1;
        let record = ProducerRecord::new(self.input.as_str(), Some(value))
            .key(key)
            .partition(partition);
        deliveries.push(self.producer.send(record).await.unwrap());
    }

    fn expected(&self, partition: i32) -> HashMap<Bytes, Tally> {
        self.written
            .iter()
            .filter(|(k, _)| {
                std::str::from_utf8(&k[1..])
                    .unwrap()
                    .parse::<i32>()
                    .unwrap()
                    % self.partitions
                    == partition
            })
            .filter_map(|(k, vs)| Some((k.clone(), fold_all(vs)?)))
            .collect()
    }

    fn config(&self, group: &str, dir: &Path, state_version: u32) -> FlowConfig {
        let mut g = GroupConfig::new(group);
        g.session_timeout = Duration::from_secs(10);
        g.heartbeat_interval = Duration::from_millis(500);
        let mut consumer = GroupConsumerConfig::new(g);
        consumer.reader.reset = OffsetReset::Earliest;
        let mut snapshots = SnapshotConfig::new(&self.snapshots, &self.txn_prefix);
        snapshots.recovery_stall_timeout = Some(Duration::from_secs(30));
        let mut c = FlowConfig::new(consumer, &self.input, snapshots);
        let mut disk = DiskState::new(dir, state_version);
        disk.memory_budget = self.budget;
        c.state = StateConfig::Disk(disk);
        c
    }

    /// A member of the world's group on `dir`, run until it folded every event written, then persisted,
    /// committed and closed (which brings its images to the high watermark). Returns what it held and
    /// what its acquisitions did.
    async fn run_member(&self, dir: &Path, state_version: u32) -> (Held, DiskStats) {
        self.run_member_in(&self.group.clone(), dir, state_version)
            .await
    }

    async fn run_member_in(
        &self,
        group: &str,
        dir: &Path,
        state_version: u32,
    ) -> (Held, DiskStats) {
        let mut flow = Flow::start(
            self.client.clone(),
            self.config(group, dir, state_version),
            Counter,
        )
        .await
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            flow.poll_once(Duration::from_millis(100)).await.unwrap();
            let done = (0..self.partitions).all(|p| {
                let end = self.per_partition.get(&p).copied().unwrap_or(0);
                flow.position(p).is_some_and(|at| at >= end)
            });
            if done {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the member never folded every event"
            );
        }
        flow.persist().await.unwrap();
        flow.commit().await.unwrap();
        // Graves become tombstones once a commit passed them.
        flow.persist().await.unwrap();
        flow.commit().await.unwrap();
        let held = (0..self.partitions)
            .map(|p| (p, flow.state(p).unwrap_or_default()))
            .collect();
        let stats = flow.disk_stats();
        flow.close().await.unwrap();
        (held, stats)
    }

    fn assert_folds_all(&self, held: &Held) {
        for p in 0..self.partitions {
            assert_eq!(held[&p], self.expected(p), "partition {p}");
        }
    }

    async fn high_watermark(&self, partition: i32) -> i64 {
        let tp = TopicPartition::new(self.snapshots.as_str(), partition);
        list_offsets(
            &self.client,
            std::slice::from_ref(&tp),
            OffsetSpec::Latest,
            IsolationLevel::ReadUncommitted,
        )
        .await
        .unwrap()[&tp]
    }
}

type Held = HashMap<i32, HashMap<Bytes, Tally>>;

fn fallbacks(stats: &DiskStats, reason: &str) -> u64 {
    stats.fallbacks.get(reason).copied().unwrap_or(0)
}

/// A member restarted on its data directory reads only the snapshot records written after its images'
/// checkpoints, and its state is the fold of all input. A member on an empty directory reads every
/// record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_on_its_data_directory_reads_only_what_was_written_since() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let mut w = World::new(&kafka, 1, &[]).await;
    let dir = w.dir("restart");
    w.emit(0..40, 5, "a").await;

    let (held, first) = w.run_member(&dir, 1).await;
    w.assert_folds_all(&held);
    assert_eq!(first.resumed, 0);
    assert_eq!(fallbacks(&first, "no_checkpoint"), 1, "{first:?}");

    // While the member is away, another one (on an empty directory, so it reads the whole partition:
    // 40 keys' snapshots) folds changes to three keys and writes their snapshots.
    w.emit(0..3, 2, "b").await;
    let elsewhere = w.dir("elsewhere");
    let (held, other) = w.run_member(&elsewhere, 1).await;
    w.assert_folds_all(&held);
    assert_eq!(fallbacks(&other, "no_checkpoint"), 1, "{other:?}");
    assert_eq!(other.records_read, 40, "{other:?}");

    // Back on its directory, the member reads only those three snapshots (its close brought the
    // image to the high watermark of then), and has nothing left to fold: its state is the image
    // plus the three, and it equals a fold of all input.
    let (held, again) = w.run_member(&dir, 1).await;
    assert_eq!(again.resumed, 1, "{again:?}");
    assert!(again.fallbacks.is_empty(), "{again:?}");
    assert_eq!(again.records_read, 3, "{again:?}");
    w.assert_folds_all(&held);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// An image copied from another partition, an image of another group, and an image written under
/// another state-encoding version are not used: each partition is read whole, for the reason
/// `identity`, and the state is right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_of_another_partition_group_or_encoding_is_read_whole() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let mut w = World::new(&kafka, 2, &[]).await;
    let dir = w.dir("own");
    w.emit(0..20, 3, "a").await;
    let (held, _) = w.run_member(&dir, 1).await;
    w.assert_folds_all(&held);

    // Partition 0's image where partition 1's belongs, and the other way round.
    let swapped = w.dir("swapped");
    let image = |d: &Path, p: i32| d.join(format!("{}-{p}", w.snapshots));
    copy_dir(&image(&dir, 0), &image(&swapped, 1));
    copy_dir(&image(&dir, 1), &image(&swapped, 0));
    w.emit(0..4, 1, "b").await;
    let (held, stats) = w.run_member(&swapped, 1).await;
    w.assert_folds_all(&held);
    assert_eq!(fallbacks(&stats, "identity"), 2, "{stats:?}");
    assert_eq!(stats.resumed, 0, "{stats:?}");

    // The same directory under a new encoding version.
    w.emit(0..4, 1, "c").await;
    let (held, stats) = w.run_member(&dir, 2).await;
    w.assert_folds_all(&held);
    assert_eq!(fallbacks(&stats, "identity"), 2, "{stats:?}");

    // Another group's member on a copy of that directory (its own group has committed nothing, so it
    // folds every event from the start, on the snapshots' keys).
    let other = w.dir("other-group");
    copy_dir(&dir, &other);
    let group = unique("other-group");
    let (_, stats) = w.run_member_in(&group, &other, 2).await;
    assert_eq!(fallbacks(&stats, "identity"), 2, "{stats:?}");
}

/// A key deleted after the image's checkpoint, whose tombstone the cleaner has removed by the time the
/// image's member restarts: the log no longer says the key is gone, so only a full read keeps it
/// deleted. The checkpoint is older than `delete.retention.ms`, and the partition is read whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tombstone_the_cleaner_removed_after_the_checkpoint_keeps_its_key_deleted() {
    let kafka = cluster(ClusterSpec::kafka4().with_prop("log.cleaner.backoff.ms", "100")).await;
    let mut w = World::new(
        &kafka,
        1,
        &[
            ("segment.ms", "100"),
            ("segment.bytes", "1048576"),
            ("min.cleanable.dirty.ratio", "0.01"),
            ("delete.retention.ms", "100"),
            ("min.compaction.lag.ms", "0"),
        ],
    )
    .await;
    let dir = w.dir("stale");
    w.emit(0..10, 2, "a").await;
    let (held, _) = w.run_member(&dir, 1).await;
    assert!(held[&0].contains_key(&Bytes::from_static(b"k0003")));

    // Another member (its own directory) deletes k0003: a grave, then its tombstone.
    w.delete(3).await;
    let elsewhere = w.dir("elsewhere");
    let (held, _) = w.run_member(&elsewhere, 1).await;
    w.assert_folds_all(&held);
    assert!(!held[&0].contains_key(&Bytes::from_static(b"k0003")));

    // Wait until the cleaner has removed every record of k0003, tombstone included. New writes to
    // other keys roll segments so the tombstone's segment becomes cleanable.
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut round = 0;
    while key_records(&w, b"k0003").await > 0 {
        assert!(
            Instant::now() < deadline,
            "the cleaner never removed k0003's tombstone"
        );
        round += 1;
        w.emit(5..6, 1, &format!("roll{round}")).await;
        let (_, _) = w.run_member(&elsewhere, 1).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    let (held, stats) = w.run_member(&dir, 1).await;
    assert!(
        !held[&0].contains_key(&Bytes::from_static(b"k0003")),
        "the deleted key came back: {stats:?}"
    );
    assert_eq!(fallbacks(&stats, "too_old"), 1, "{stats:?}");
    w.assert_folds_all(&held);
}

/// How many records of `key` the snapshot partition stores (read_uncommitted: everything not yet
/// cleaned away).
async fn key_records(w: &World, key: &[u8]) -> usize {
    use snapfence::consumer::{PartitionReader, ReaderConfig, StartAt};
    let tp = TopicPartition::new(w.snapshots.as_str(), 0);
    let end = w.high_watermark(0).await;
    let mut reader = PartitionReader::new(w.client.clone(), ReaderConfig::default());
    reader.assign(tp.clone(), StartAt::Earliest);
    let mut n = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while end > 0 && reader.position(&tp).is_none_or(|p| p < end) {
        for part in reader.fetch().await.unwrap() {
            n += part
                .records
                .iter()
                .filter(|r| r.key.as_deref() == Some(key))
                .count();
        }
        assert!(Instant::now() < deadline, "never read to {end}");
    }
    n
}

/// Records deleted past the checkpoint (DeleteRecords): the image cannot be brought up to date from the
/// log, and the partition is read whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_start_past_the_checkpoint_is_read_whole() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    // Deletion below the log end is for topics that also delete by retention.
    let mut w = World::new(
        &kafka,
        1,
        &[
            ("cleanup.policy", "compact,delete"),
            ("retention.ms", "-1"),
            ("retention.bytes", "-1"),
        ],
    )
    .await;
    let dir = w.dir("behind");
    w.emit(0..10, 2, "a").await;
    let (_, _) = w.run_member(&dir, 1).await;
    let checkpoint = w.high_watermark(0).await;

    w.emit(0..10, 1, "b").await;
    let elsewhere = w.dir("elsewhere");
    let (_, _) = w.run_member(&elsewhere, 1).await;
    assert!(w.high_watermark(0).await > checkpoint + 1);
    delete_records(&w, 0, checkpoint + 1).await;

    let (_, stats) = w.run_member(&dir, 1).await;
    assert_eq!(fallbacks(&stats, "log_start_passed"), 1, "{stats:?}");
    assert_eq!(stats.resumed, 0, "{stats:?}");
}

/// DeleteRecords of `partition` of the snapshot topic below `offset`.
async fn delete_records(w: &World, partition: i32, offset: i64) {
    use kafka_protocol::messages::delete_records_request::{
        DeleteRecordsPartition, DeleteRecordsTopic,
    };
    use kafka_protocol::messages::{DeleteRecordsRequest, TopicName};
    use kafka_protocol::protocol::StrBytes;
    use snapfence::net::{CallOptions, Target, Verdict};
    let request = DeleteRecordsRequest::default()
        .with_timeout_ms(10_000)
        .with_topics(vec![DeleteRecordsTopic::default()
            .with_name(TopicName(StrBytes::from_string(w.snapshots.clone())))
            .with_partitions(vec![DeleteRecordsPartition::default()
                .with_partition_index(partition)
                .with_offset(offset)])]);
    let low = w
        .client
        .call(
            Target::leader(w.snapshots.clone(), partition),
            &CallOptions::default(),
            |_| request.clone(),
            |r, _| {
                let p = &r.topics[0].partitions[0];
                if p.error_code != 0 {
                    Verdict::from_code(p.error_code, Err(p.error_code))
                } else {
                    Verdict::Done(Ok(p.low_watermark))
                }
            },
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(low, offset);
}

/// A flipped byte in the image's table file: the store finds it when the block is read, and the
/// partition is read whole into a fresh image; the state is right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_image_is_found_and_read_whole() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let mut w = World::new(&kafka, 1, &[]).await;
    let dir = w.dir("corrupt");
    w.emit(0..3000, 1, "a").await;
    let (_, _) = w.run_member(&dir, 1).await;

    let tables = table_files(&dir.join(format!("{}-0", w.snapshots)));
    let biggest = tables
        .iter()
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .expect("the image has table files");
    let mut bytes = std::fs::read(biggest).unwrap();
    let at = bytes.len() / 6;
    bytes[at] ^= 0x40;
    std::fs::write(biggest, &bytes).unwrap();

    w.emit(0..5, 1, "b").await;
    let (held, stats) = w.run_member(&dir, 1).await;
    assert_eq!(fallbacks(&stats, "corrupt"), 1, "{stats:?}");
    w.assert_folds_all(&held);
}

/// Every file under a `tables` folder below `dir`.
fn table_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.parent().is_some_and(|p| p.ends_with("tables")) {
                out.push(path);
            }
        }
    }
    out
}

/// The log truncated below the checkpoint and then written past it again: an unclean election makes a
/// replica that lacks the image's last records the leader, and new writes bring the high watermark back
/// above the checkpoint (so the high watermark alone sees nothing wrong). OffsetForLeaderEpoch for the
/// checkpoint's epoch ends below the checkpoint, and the partition is read whole for `diverged`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncation_followed_by_new_writes_is_read_whole() {
    use protocol_tests::dedicated;
    // Its own cluster: nodes stop. The snapshot topic has two replicas and accepts writes on one, so
    // one replica can hold records the other never got; unclean elections are allowed on it.
    let kafka = dedicated(ClusterSpec::three_nodes()).await;
    let mut w = World::with_replicas(
        &kafka,
        1,
        2,
        &[
            ("min.insync.replicas", "1"),
            ("unclean.leader.election.enable", "true"),
        ],
    )
    .await;
    let dir = w.dir("truncated");
    w.emit(0..20, 2, "a").await;
    let (_, _) = w.run_member(&dir, 1).await;

    // The replica that is not the leader stops; the member writes 20 more snapshots on the leader
    // alone, and its close brings the image past them.
    let metadata = w.client.metadata(&[w.snapshots.as_str()]).await.unwrap();
    let partition = &metadata.topics[&w.snapshots].partitions[&0];
    let leader = partition.leader;
    let follower = *partition.replicas.iter().find(|r| **r != leader).unwrap();
    let before = w.high_watermark(0).await;
    assert!(tokio::task::block_in_place(|| kafka.stop(follower)));
    w.emit(0..20, 1, "b").await;
    let (_, _) = w.run_member(&dir, 1).await;
    let checkpoint = w.high_watermark(0).await;
    assert!(checkpoint > before + 20, "{before} -> {checkpoint}");

    // The leader dies; the stale replica comes back and is elected uncleanly, its log ending at
    // `before`. (Both down at once loses the controller quorum until the follower is back.)
    kafka.kill(leader);
    kafka.restart(follower).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        elect_unclean(&w, 0).await;
        w.client.invalidate_leader(&w.snapshots, 0);
        if let Ok(l) = w.client.leader(&w.snapshots, 0).await {
            if l.node == follower {
                break;
            }
        }
        assert!(Instant::now() < deadline, "the stale replica never led");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(w.high_watermark(0).await, before, "the new leader's log");
    // Another member writes past the checkpoint again, under the new leader.
    let elsewhere = w.dir("elsewhere");
    let mut round = 0;
    while w.high_watermark(0).await <= checkpoint + 5 {
        round += 1;
        assert!(round < 10, "the log never grew past the checkpoint again");
        w.emit(0..20, 1, &format!("c{round}")).await;
        let (_, _) = w.run_member(&elsewhere, 1).await;
    }
    kafka.restart(leader).await;

    let (_, stats) = w.run_member(&dir, 1).await;
    assert_eq!(fallbacks(&stats, "diverged"), 1, "{stats:?}");
    assert_eq!(stats.resumed, 0, "{stats:?}");
}

/// ElectLeaders, unclean, for `partition` of the snapshot topic. Its answer is printed, not judged:
/// the caller waits for the leader it wants (the controller may have elected already).
async fn elect_unclean(w: &World, partition: i32) {
    use kafka_protocol::messages::elect_leaders_request::TopicPartitions;
    use kafka_protocol::messages::{ElectLeadersRequest, TopicName};
    use kafka_protocol::protocol::StrBytes;
    use snapfence::net::{CallOptions, Target, Verdict};
    let request = ElectLeadersRequest::default()
        .with_election_type(1)
        .with_timeout_ms(10_000)
        .with_topic_partitions(Some(vec![TopicPartitions::default()
            .with_topic(TopicName(StrBytes::from_string(w.snapshots.clone())))
            .with_partitions(vec![partition])]));
    let code = w
        .client
        .call(
            Target::Any,
            &CallOptions::default(),
            |_| request.clone(),
            |r, _| {
                let code = r
                    .replica_election_results
                    .iter()
                    .flat_map(|t| t.partition_result.iter())
                    .map(|p| p.error_code)
                    .next()
                    .unwrap_or(r.error_code);
                Verdict::Done(code)
            },
        )
        .await;
    eprintln!("unclean election of {}-{partition}: {code:?}", w.snapshots);
}

/// A member process on its data directory, killed (SIGKILL) while one of its transactions is open: the
/// outcome is unknown to it, and its image holds only what read_committed reads returned, so the
/// open transaction's snapshots never entered it. Restarted on the directory, the member's state is the
/// fold of all input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_killed_in_a_transaction_restarts_on_its_directory_to_the_right_state() {
    use protocol_tests::member::{MemberArgs, MemberProcess};
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let mut w = World::new(&kafka, 1, &[]).await;
    let dir = w.dir("killed");
    w.emit(0..50, 2, "a").await;
    let (held, _) = w.run_member(&dir, 1).await;
    w.assert_folds_all(&held);

    let mut args = MemberArgs::new(
        &kafka.bootstrap(),
        &w.group,
        &w.input,
        &w.snapshots,
        &w.txn_prefix,
    );
    args.state_dir = Some(dir.clone());
    let program = Path::new(env!("CARGO_BIN_EXE_flow-member"));
    for round in 0..3 {
        let mut member = MemberProcess::spawn(program, &args).unwrap();
        member.freeze_in_next_flush(Duration::from_millis(3));
        w.emit(0..50, 1, &format!("r{round}")).await;
        let deadline = Instant::now() + Duration::from_secs(60);
        while !member.frozen_in_flush() {
            assert!(Instant::now() < deadline, "the member never flushed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        member.kill();
        let (held, stats) = w.run_member(&dir, 1).await;
        w.assert_folds_all(&held);
        assert_eq!(stats.resumed, 1, "round {round}: {stats:?}");
    }
}

/// A member process killed while it brings its image up to date: the records of the fetches it read
/// are in the image, the checkpoint has not moved. The next member on the directory resumes from the old
/// checkpoint, reads everything past it again, and ends with the fold of all input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_killed_while_its_image_is_written_restarts_to_the_right_state() {
    use protocol_tests::member::{MemberArgs, MemberProcess};
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let mut w = World::new(&kafka, 1, &[]).await;
    let warm = w.dir("warm");
    w.emit(0..10, 1, "a").await;
    let (_, _) = w.run_member(&warm, 1).await;
    // 100 000 snapshots written past the warm image's checkpoint by another member.
    const KEYS: usize = 100_000;
    w.emit(0..KEYS, 1, "big").await;
    let elsewhere = w.dir("elsewhere");
    let (_, _) = w.run_member(&elsewhere, 1).await;

    let mut args = MemberArgs::new(
        &kafka.bootstrap(),
        &w.group,
        &w.input,
        &w.snapshots,
        &w.txn_prefix,
    );
    let program = Path::new(env!("CARGO_BIN_EXE_flow-member"));
    for round in 0..2 {
        let dir = w.dir(&format!("copy{round}"));
        copy_dir(&warm, &dir);
        let copied = dir_bytes(&dir);
        args.state_dir = Some(dir.clone());
        let mut member = MemberProcess::spawn(program, &args).unwrap();
        // Killed once the image has taken a good part of the records past its checkpoint in.
        let deadline = Instant::now() + Duration::from_secs(60);
        while dir_bytes(&dir) < copied + 1_000_000 {
            assert!(
                Instant::now() < deadline,
                "the member never wrote its image"
            );
            assert!(member.is_running(), "the member ended");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        member.kill();
        w.emit(0..10, 1, &format!("r{round}")).await;
        let (held, stats) = w.run_member(&dir, 1).await;
        w.assert_folds_all(&held);
        // Resumed from the warm checkpoint, and read every snapshot past it again: the killed
        // member's checkpoint never moved.
        assert_eq!(stats.resumed, 1, "round {round}: {stats:?}");
        assert!(
            stats.records_read >= KEYS as u64,
            "round {round}: the killed member had finished: {stats:?}"
        );
    }
}

/// Bytes of every file below `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            match entry.metadata() {
                Ok(m) if m.is_dir() => stack.push(entry.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}

/// Warm takeovers: a member that gives a partition up keeps following its snapshots into its image
/// (`DiskState::warm_for`), so when the partition comes back (the other member leaves, as in a rolling
/// deploy) it reads almost nothing: what the other member wrote was followed while it was away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_that_comes_back_is_taken_over_from_the_tail() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let mut w = World::new(&kafka, 2, &[]).await;
    let (dir_a, dir_b) = (w.dir("warm-a"), w.dir("warm-b"));
    w.emit(0..40, 2, "a").await;
    let warm = |dir: &Path| {
        let mut c = w.config(&w.group, dir, 1);
        let mut disk = DiskState::new(dir, 1);
        disk.warm_for = Duration::from_secs(120);
        disk.warm_every = Duration::from_millis(200);
        c.state = StateConfig::Disk(disk);
        c
    };
    let caught_up = |w: &World, flow: &Flow<Counter>, partitions: &[i32]| {
        partitions.iter().all(|p| {
            let end = w.per_partition.get(p).copied().unwrap_or(0);
            flow.position(*p).is_some_and(|at| at >= end)
        })
    };

    let mut a = Flow::start(w.client.clone(), warm(&dir_a), Counter)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(a.partitions() == [0, 1] && caught_up(&w, &a, &[0, 1])) {
        assert!(
            Instant::now() < deadline,
            "the first member never caught up"
        );
        a.poll_once(Duration::from_millis(100)).await.unwrap();
    }
    a.persist().await.unwrap();
    a.commit().await.unwrap();
    // The first member runs on its own from here, persisting and committing as it goes.
    let stop = Arc::new(AtomicBool::new(false));
    let running = tokio::spawn({
        let stop = Arc::clone(&stop);
        async move {
            while !stop.load(Ordering::SeqCst) {
                a.poll_once(Duration::from_millis(100)).await.unwrap();
                a.persist().await.unwrap();
                a.commit().await.unwrap();
            }
            a
        }
    });

    // A second member joins and takes one partition over; it folds a thousand keys' events there.
    let mut b = Flow::start(w.client.clone(), warm(&dir_b), Counter)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while b.partitions().len() != 1 {
        assert!(
            Instant::now() < deadline,
            "the second member never got a partition"
        );
        b.poll_once(Duration::from_millis(100)).await.unwrap();
    }
    let moved = b.partitions()[0];
    w.emit(1_000..3_000, 1, "b").await;
    while !caught_up(&w, &b, &[moved]) {
        assert!(
            Instant::now() < deadline,
            "the second member never caught up"
        );
        b.poll_once(Duration::from_millis(100)).await.unwrap();
    }
    b.persist().await.unwrap();
    b.commit().await.unwrap();
    // The first member's follower reads those snapshots while the second member still holds them.
    tokio::time::sleep(Duration::from_secs(2)).await;
    b.close().await.unwrap();

    // The partition comes back to the first member.
    stop.store(true, Ordering::SeqCst);
    let mut a = running.await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(a.partitions() == [0, 1] && caught_up(&w, &a, &[0, 1])) {
        assert!(Instant::now() < deadline, "the partition never came back");
        a.poll_once(Duration::from_millis(100)).await.unwrap();
    }
    let stats = a.disk_stats();
    let held: Held = [0, 1]
        .into_iter()
        .map(|p| (p, a.state(p).unwrap_or_default()))
        .collect();
    w.assert_folds_all(&held);
    // The thousand snapshots of the moved partition were followed, not read at the takeover.
    assert!(stats.followed_records >= 1_000, "{stats:?}");
    assert!(stats.records_read < 100, "{stats:?}");
    assert_eq!(stats.follow_failures, 0, "{stats:?}");
    a.close().await.unwrap();
}

/// A member driven on its own task: polls, persists and commits until told to stop, then hands the
/// flow back.
struct Running {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<Flow<Counter>>,
}

impl Running {
    async fn start(w: &World, config: FlowConfig) -> Running {
        use std::sync::atomic::{AtomicBool, Ordering};
        let mut flow = Flow::start(w.client.clone(), config, Counter)
            .await
            .unwrap();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let stop = std::sync::Arc::clone(&stop);
            async move {
                while !stop.load(Ordering::SeqCst) {
                    flow.poll_once(Duration::from_millis(100)).await.unwrap();
                    flow.persist().await.unwrap();
                    flow.commit().await.unwrap();
                }
                flow
            }
        });
        Running { stop, task }
    }

    async fn stop(self) -> Flow<Counter> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.task.await.unwrap()
    }
}

/// A rolling restart of three members on their data directories, with warm takeovers and events
/// flowing: each member in turn closes and starts again on its directory. Every member resumes
/// partitions from its images, followed partitions are read while away, nothing is read whole for a
/// reason other than a missing image, and at the end the members' states are the fold of all input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_three_members_with_warm_takeovers() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let mut w = World::new(&kafka, 6, &[]).await;
    let dirs: Vec<PathBuf> = (0..3).map(|i| w.dir(&format!("rolling{i}"))).collect();
    let config = |w: &World, dir: &Path| {
        let mut c = w.config(&w.group, dir, 1);
        let mut disk = DiskState::new(dir, 1);
        disk.warm_for = Duration::from_secs(300);
        disk.warm_every = Duration::from_millis(300);
        c.state = StateConfig::Disk(disk);
        c
    };
    w.emit(0..120, 2, "a").await;
    let mut members = Vec::new();
    for dir in &dirs {
        members.push(Some(Running::start(&w, config(&w, dir)).await));
        w.emit(0..120, 1, "join").await;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let mut totals = DiskStats::default();
    let mut add = |s: &DiskStats| {
        totals.resumed += s.resumed;
        totals.records_read += s.records_read;
        totals.followed_records += s.followed_records;
        totals.follow_failures += s.follow_failures;
        for (why, n) in &s.fallbacks {
            *totals.fallbacks.entry(why).or_default() += n;
        }
    };
    for round in 0..1 {
        for i in 0..3 {
            let flow = members[i].take().unwrap().stop().await;
            add(&flow.disk_stats());
            flow.close().await.unwrap();
            w.emit(0..120, 1, &format!("away{round}-{i}")).await;
            tokio::time::sleep(Duration::from_secs(2)).await;
            members[i] = Some(Running::start(&w, config(&w, &dirs[i])).await);
            w.emit(0..120, 1, &format!("back{round}-{i}")).await;
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }
    // Settle: every partition held by someone and caught up; then stop everyone.
    let mut flows = Vec::new();
    for m in members.iter_mut() {
        flows.push(m.take().unwrap().stop().await);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        for f in flows.iter_mut() {
            f.poll_once(Duration::from_millis(50)).await.unwrap();
        }
        let held: Vec<i32> = flows.iter().flat_map(|f| f.partitions()).collect();
        let settled = (0..6).all(|p| {
            let end = w.per_partition.get(&p).copied().unwrap_or(0);
            flows
                .iter()
                .any(|f| f.position(p).is_some_and(|at| at >= end))
        });
        if held.len() == 6 && settled {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the members never settled: {held:?}"
        );
    }
    let mut held: Held = HashMap::new();
    for f in &flows {
        for p in f.partitions() {
            held.insert(p, f.state(p).unwrap_or_default());
        }
        add(&f.disk_stats());
    }
    w.assert_folds_all(&held);
    for f in flows {
        f.close().await.unwrap();
    }
    eprintln!("rolling restart: {totals:?}");
    assert!(totals.resumed >= 6, "{totals:?}");
    assert!(totals.followed_records > 0, "{totals:?}");
    assert_eq!(totals.follow_failures, 0, "{totals:?}");
    assert!(
        totals.fallbacks.keys().all(|why| *why == "no_checkpoint"),
        "{totals:?}"
    );
}

/// About 120 keys of the tests' sizes (a key costs its key, its snapshot and 96 bytes).
const SMALL_BUDGET: u64 = 16 << 10;

/// With a memory budget a member keeps few keys in memory, loading each from its image when an event
/// needs it, and still ends with the fold of all input: on an empty directory (every key new), after a
/// restart on its directory (reading only what another member wrote meanwhile, loading nothing it was
/// not asked for), and folding events for keys that live only on disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_with_a_memory_budget_loads_keys_as_events_need_them() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let mut w = World::new(&kafka, 1, &[]).await;
    w.budget = Some(SMALL_BUDGET);
    let dir = w.dir("budget");
    w.emit(0..2000, 2, "a").await;

    let (held, first) = w.run_member(&dir, 1).await;
    w.assert_folds_all(&held);
    assert!(first.keys_evicted >= 1500, "{first:?}");
    assert!(first.keys_in_memory < 400, "{first:?}");

    // Another member (whole state in memory, its own directory) folds changes to 50 keys.
    w.budget = None;
    w.emit(0..50, 1, "b").await;
    let elsewhere = w.dir("budget-elsewhere");
    let (held, _) = w.run_member(&elsewhere, 1).await;
    w.assert_folds_all(&held);

    // Back on its directory with the budget: it reads the 50 snapshots, and loads no key, as no event
    // asks for one; its state (read through the image) is the fold of all input.
    w.budget = Some(SMALL_BUDGET);
    let (held, again) = w.run_member(&dir, 1).await;
    assert_eq!(again.resumed, 1, "{again:?}");
    assert_eq!(again.records_read, 50, "{again:?}");
    assert_eq!(again.keys_loaded, 0, "{again:?}");
    w.assert_folds_all(&held);

    // Events for 300 keys that are only on disk: each is loaded, folded onto its recovered state, and
    // dropped again.
    w.emit(1000..1300, 1, "c").await;
    w.delete(1500).await;
    let (held, third) = w.run_member(&dir, 1).await;
    assert!(third.keys_loaded >= 301, "{third:?}");
    assert!(third.keys_evicted >= 100, "{third:?}");
    w.assert_folds_all(&held);
}

/// A key that expires (a timer deletes it `TTL` after its last event) expires whether it is in memory
/// or not: after it was dropped from memory with its timer set (found through the deadlines the owner
/// noted as it dropped keys), and after a restart that loaded no key (found through the image's
/// deadline index).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timers_of_keys_on_disk_fire() {
    const TTL: i64 = 3_600_000;
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let mut w = World::new(&kafka, 1, &[]).await;
    w.budget = Some(SMALL_BUDGET);
    let dir = w.dir("timers");
    // Keys 0..300 were last seen at t0, keys 300..600 ten hours later, both in the past (the broker
    // refuses timestamps far ahead of its clock); the flow's clock is the test's.
    let t0 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
        - 20 * TTL;
    let mut deliveries = Vec::new();
    for k in 0..600usize {
        let at = if k < 300 { t0 } else { t0 + 10 * TTL };
        let record = ProducerRecord::new(w.input.as_str(), Some(Bytes::from_static(b"x")))
            .key(Bytes::from(format!("k{k:04}")))
            .partition(0)
            .timestamp(at);
        deliveries.push(w.producer.send(record).await.unwrap());
    }
    for d in deliveries {
        d.await.unwrap();
    }
    let live = |flow: &Flow<Expiring>| -> Vec<usize> {
        let mut keys: Vec<usize> = flow
            .state(0)
            .unwrap_or_default()
            .keys()
            .map(|k| std::str::from_utf8(&k[1..]).unwrap().parse().unwrap())
            .collect();
        keys.sort_unstable();
        keys
    };

    let clock = Arc::new(ManualClock(AtomicI64::new(t0 + TTL / 2)));
    let mut flow = start_expiring(&w, &dir, &clock).await;
    fold_to(&mut flow, 600).await;
    flow.persist().await.unwrap();
    flow.commit().await.unwrap();
    let stats = flow.disk_stats();
    assert!(stats.keys_evicted >= 400, "{stats:?}");
    assert_eq!(flow.tick(), 0, "nothing is due yet");
    assert_eq!(live(&flow), (0..600).collect::<Vec<_>>());

    // Past the first keys' deadline: the 300 fire, though most of them were out of memory.
    clock.0.store(t0 + 2 * TTL, Ordering::Relaxed);
    assert!(flow.next_deadline().is_some_and(|d| d <= t0 + TTL));
    assert_eq!(flow.tick(), 300);
    settle(&mut flow).await;
    assert_eq!(live(&flow), (300..600).collect::<Vec<_>>());
    flow.close().await.unwrap();

    // A restart past every deadline: the takeover finds the other 300 in the image's index.
    clock.0.store(t0 + 20 * TTL, Ordering::Relaxed);
    let mut flow = start_expiring(&w, &dir, &clock).await;
    fold_to(&mut flow, 600).await;
    settle(&mut flow).await;
    let stats = flow.disk_stats();
    assert_eq!(stats.resumed, 1, "{stats:?}");
    assert!(stats.keys_loaded >= 300, "{stats:?}");
    assert_eq!(live(&flow), Vec::<usize>::new());
    flow.close().await.unwrap();
}

/// A block that fails its checksum when a key is loaded stops the flow with a typed error, and marks
/// the image so that the next start reads the partition whole (`corrupt`) and ends right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_block_met_while_loading_a_key_stops_the_flow_and_is_read_whole_next() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let mut w = World::new(&kafka, 1, &[]).await;
    w.budget = Some(SMALL_BUDGET);
    let dir = w.dir("lazy-corrupt");
    w.emit(0..3000, 1, "a").await;
    let (_, _) = w.run_member(&dir, 1).await;

    let image = dir.join(format!("{}-0", w.snapshots));
    let biggest = table_files(&image)
        .into_iter()
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .expect("the image has table files");
    let mut bytes = std::fs::read(&biggest).unwrap();
    let at = bytes.len() / 6;
    bytes[at] ^= 0x40;
    std::fs::write(&biggest, &bytes).unwrap();

    // Every key gets an event, so every block of the image is read.
    w.emit(0..3000, 1, "b").await;
    let mut flow = Flow::start(w.client.clone(), w.config(&w.group, &dir, 1), Counter)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let err = loop {
        let step = match flow.poll_once(Duration::from_millis(100)).await {
            Ok(_) => flow.persist().await,
            Err(e) => Err(e),
        };
        if let Err(e) = step {
            break e;
        }
        assert!(Instant::now() < deadline, "the corrupt block was never met");
    };
    assert!(
        matches!(&err, snapfence::snapshot::FlowError::State { source, .. } if source.is_corrupt()),
        "{err}"
    );
    drop(flow);

    let (held, stats) = w.run_member(&dir, 1).await;
    assert_eq!(fallbacks(&stats, "corrupt"), 1, "{stats:?}");
    w.assert_folds_all(&held);
}

/// Counter with an expiry: a key is deleted `ttl` after its last event's timestamp (wall clock).
struct Expiring {
    ttl: i64,
}

impl snapfence::snapshot::Fold for Expiring {
    type State = (Tally, i64);
    fn fold(
        &self,
        key: &Bytes,
        state: &mut Option<(Tally, i64)>,
        event: &snapfence::records::Record,
        out: &mut snapfence::snapshot::Outputs,
    ) -> snapfence::snapshot::Change {
        let mut tally = state.map(|(t, _)| t);
        let change = Counter.fold(key, &mut tally, event, out);
        *state = tally.map(|t| (t, event.timestamp));
        change
    }
    fn encode(&self, s: &(Tally, i64)) -> Bytes {
        let mut v = Counter.encode(&s.0).to_vec();
        v.extend_from_slice(&s.1.to_be_bytes());
        Bytes::from(v)
    }
    fn decode(&self, b: &[u8]) -> Result<(Tally, i64), snapfence::snapshot::BoxError> {
        let (tally, seen) = b.split_at_checked(16).ok_or("a short state")?;
        Ok((Counter.decode(tally)?, i64::from_be_bytes(seen.try_into()?)))
    }
    fn deadline(&self, _key: &Bytes, s: &(Tally, i64)) -> Option<i64> {
        Some(s.1 + self.ttl)
    }
    fn on_deadline(
        &self,
        _key: &Bytes,
        _s: &mut (Tally, i64),
        _now: i64,
        _out: &mut snapfence::snapshot::Outputs,
    ) -> snapfence::snapshot::Change {
        snapfence::snapshot::Change::Delete
    }
}

/// A clock the test sets.
#[derive(Debug)]
struct ManualClock(AtomicI64);

impl snapfence::snapshot::Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

async fn start_expiring(w: &World, dir: &Path, clock: &Arc<ManualClock>) -> Flow<Expiring> {
    let mut config = w.config(&w.group, dir, 1);
    config.clock = clock.clone();
    Flow::start(w.client.clone(), config, Expiring { ttl: 3_600_000 })
        .await
        .unwrap()
}

/// Polls until partition 0 is held and folded up to `end`.
async fn fold_to<F: snapfence::snapshot::Fold>(flow: &mut Flow<F>, end: i64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while flow.position(0).is_none_or(|p| p < end) {
        flow.poll_once(Duration::from_millis(100)).await.unwrap();
        assert!(Instant::now() < deadline, "never reached offset {end}");
    }
}

/// Persists and commits twice (graves become tombstones once a commit passed them).
async fn settle<F: snapfence::snapshot::Fold>(flow: &mut Flow<F>) {
    for _ in 0..2 {
        flow.persist().await.unwrap();
        flow.commit().await.unwrap();
    }
}
