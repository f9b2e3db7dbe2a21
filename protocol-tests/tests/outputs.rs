//! Exactly-once output on a real broker: members emit one output per input event (the `Echo` fold),
//! riding with the key's snapshot. One owner is SIGKILLed in the middle of a wave, another is frozen in
//! a flush past its session timeout and thawed (a zombie that acts on stale state, whose refused commit
//! is recovered in place), and afterwards a `read_committed` reader of the output topic must see every
//! input event's output exactly once. The same scenario in the unfenced mode shows duplicates, so the
//! check can fail.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol_tests::member::{MemberArgs, MemberProcess};
use protocol_tests::tally::Echo;
use protocol_tests::{cluster, unique, ClusterSpec, KafkaCluster};
use snapfence::consumer::{
    list_offsets, GroupConfig, GroupConsumerConfig, OffsetReset, OffsetSpec, PartitionReader,
    ReaderConfig, StartAt, TopicPartition,
};
use snapfence::net::{Client, ClientConfig};
use snapfence::producer::{Producer, ProducerConfig, ProducerRecord};
use snapfence::records::IsolationLevel;
use snapfence::snapshot::{Flow, FlowConfig, PersistenceMode, SnapshotConfig};

const PARTITIONS: i32 = 4;
const SESSION: Duration = Duration::from_secs(6);
const KEYS: [&str; 8] = ["k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"];

/// What the output topic holds, per input event (key, offset): how many committed outputs.
struct Tallied {
    /// Input events with no output.
    lost: Vec<(Bytes, i64)>,
    /// Input events with more than one output, and how many.
    duplicated: Vec<((Bytes, i64), usize)>,
    events: usize,
    outputs: usize,
}

/// Every record of `topic` as a reader at `isolation` sees it, as (key, value), up to the end that
/// isolation level reports (the LSO for read_committed).
async fn read_all(
    client: &Client,
    topic: &str,
    isolation: IsolationLevel,
) -> Vec<(Option<Bytes>, Option<Bytes>)> {
    let tps: Vec<TopicPartition> = (0..PARTITIONS)
        .map(|p| TopicPartition::new(topic, p))
        .collect();
    let ends = list_offsets(client, &tps, OffsetSpec::Latest, isolation)
        .await
        .unwrap();
    let mut config = ReaderConfig::default();
    config.isolation = isolation;
    let mut out = Vec::new();
    for tp in tps {
        let end = ends[&tp];
        let mut reader = PartitionReader::new(client.clone(), config.clone());
        reader.assign(tp.clone(), StartAt::Earliest);
        let deadline = Instant::now() + Duration::from_secs(60);
        while end > 0 && reader.position(&tp).is_none_or(|p| p < end) {
            for part in reader.fetch().await.unwrap() {
                out.extend(part.records.into_iter().map(|r| (r.key, r.value)));
            }
            assert!(Instant::now() < deadline, "{tp:?}: never read to {end}");
        }
    }
    out
}

/// The flow configuration of the in-process member that finishes the input.
fn finisher_config(args: &MemberArgs) -> FlowConfig {
    let mut group = GroupConfig::new(&args.group);
    group.session_timeout = SESSION;
    group.heartbeat_interval = Duration::from_millis(500);
    let mut consumer = GroupConsumerConfig::new(group);
    consumer.reader.reset = OffsetReset::Earliest;
    let mut snapshots = SnapshotConfig::new(&args.snapshots, &args.txn_prefix);
    snapshots.recovery_stall_timeout = Some(Duration::from_secs(30));
    let mut c = FlowConfig::new(consumer, &args.input, snapshots);
    c.mode = if args.transactional {
        PersistenceMode::Transactional
    } else {
        PersistenceMode::NonTransactional
    };
    c
}

/// Runs the scenario (members with a kill mid-wave and a zombie, then an in-process member that
/// finishes the input) and counts each input event's committed outputs.
async fn scenario(kafka: &KafkaCluster, transactional: bool) -> Tallied {
    let client = Client::connect(ClientConfig::new(kafka.bootstrap()))
        .await
        .unwrap();
    let (input, snapshots, output) = (unique("in"), unique("snap"), unique("out"));
    for (topic, configs) in [
        (&input, &[][..]),
        (&snapshots, &[("cleanup.policy", "compact")][..]),
        (&output, &[][..]),
    ] {
        snapfence::admin::create_topic(&client, topic, PARTITIONS, -1, configs)
            .await
            .unwrap();
    }
    let producer = Producer::new(client.clone(), ProducerConfig::default())
        .await
        .unwrap();
    let mut args = MemberArgs::new(
        &kafka.bootstrap(),
        &unique("group"),
        &input,
        &snapshots,
        &unique("txn"),
    );
    args.transactional = transactional;
    args.session_timeout = SESSION;
    args.recover = true;
    args.output = Some(output.clone());
    let program = std::path::Path::new(env!("CARGO_BIN_EXE_flow-member"));
    let spawn = || MemberProcess::spawn(program, &args).expect("start flow-member");
    let mut members = vec![spawn(), spawn()];
    let mut seq = 0u64;
    let mut emit = async |members: &mut Vec<MemberProcess>| {
        for _ in 0..3 {
            seq += 1;
            let key = KEYS[(seq * 5 % 8) as usize];
            let partition = key.bytes().map(i32::from).sum::<i32>() % PARTITIONS;
            let record =
                ProducerRecord::new(input.as_str(), Some(Bytes::from(format!("{key}-{seq}"))))
                    .key(key)
                    .partition(partition);
            producer.send(record).await.unwrap().await.unwrap();
        }
        // A member that exited (it should not: fences are recovered in place) is replaced.
        for m in members.iter_mut() {
            if !m.is_paused() && !m.is_running() {
                eprintln!("a member exited: {:?}", m.log().failure);
                *m = spawn();
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for _ in 0..30 {
        emit(&mut members).await;
    }

    // SIGKILL an owner in the middle of a wave: frozen a moment after its flush began, then killed.
    let deadline = Instant::now() + Duration::from_secs(60);
    while members[1].held().is_empty() {
        emit(&mut members).await;
        assert!(Instant::now() < deadline, "member 1 never held a partition");
    }
    members[1].freeze_in_next_flush(Duration::from_millis(2));
    while !members[1].frozen_in_flush() {
        emit(&mut members).await;
        assert!(Instant::now() < deadline, "member 1 never flushed");
    }
    members[1].kill();
    members[1] = spawn();
    for _ in 0..20 {
        emit(&mut members).await;
    }

    // A zombie: frozen at the start of a flush past its session, until another member holds its
    // partitions; thawed, it finishes that stale flush first.
    let deadline = Instant::now() + Duration::from_secs(60);
    while members[0].held().is_empty() {
        emit(&mut members).await;
        assert!(Instant::now() < deadline, "member 0 never held a partition");
    }
    members[0].freeze_in_next_flush(Duration::ZERO);
    while !members[0].frozen_in_flush() {
        emit(&mut members).await;
        assert!(Instant::now() < deadline, "member 0 never flushed");
    }
    let frozen_held = members[0].held();
    let frozen_at = Instant::now();
    loop {
        emit(&mut members).await;
        let taken = members[1].held().iter().any(|p| frozen_held.contains(p));
        if frozen_at.elapsed() > SESSION + Duration::from_secs(3) && taken {
            break;
        }
        assert!(
            frozen_at.elapsed() < Duration::from_secs(60),
            "nobody took {frozen_held:?} over from the frozen member"
        );
    }
    members[0].resume();
    for _ in 0..30 {
        emit(&mut members).await;
    }
    for m in members.drain(..) {
        m.close(Duration::from_secs(15));
    }

    // One member alone finishes the input and closes (a last flush and commit).
    let ends = list_offsets(
        &client,
        &(0..PARTITIONS)
            .map(|p| TopicPartition::new(input.as_str(), p))
            .collect::<Vec<_>>(),
        OffsetSpec::Latest,
        IsolationLevel::ReadUncommitted,
    )
    .await
    .unwrap();
    let echo = Echo {
        topic: output.as_str().into(),
    };
    let mut last = Flow::start(client.clone(), finisher_config(&args), echo)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while ends
        .iter()
        .any(|(tp, end)| last.position(tp.partition).is_none_or(|p| p < *end))
    {
        last.poll_once(Duration::from_millis(200)).await.unwrap();
        assert!(Instant::now() < deadline, "the last member never caught up");
    }
    last.close().await.unwrap();

    let events: Vec<(Bytes, i64)> = {
        // The input is not transactional: its offsets are its records' positions.
        let mut out = Vec::new();
        for p in 0..PARTITIONS {
            let tp = TopicPartition::new(input.as_str(), p);
            let mut reader = PartitionReader::new(client.clone(), ReaderConfig::default());
            reader.assign(tp.clone(), StartAt::Earliest);
            while reader.position(&tp).is_none_or(|o| o < ends[&tp]) {
                for part in reader.fetch().await.unwrap() {
                    out.extend(part.records.into_iter().map(|r| (r.key.unwrap(), r.offset)));
                }
            }
        }
        out
    };
    let mut counts: BTreeMap<(Bytes, i64), usize> = BTreeMap::new();
    let outputs = read_all(&client, &output, IsolationLevel::ReadCommitted).await;
    for (key, value) in &outputs {
        let offset = std::str::from_utf8(value.as_deref().unwrap())
            .unwrap()
            .parse()
            .unwrap();
        *counts.entry((key.clone().unwrap(), offset)).or_default() += 1;
    }
    Tallied {
        lost: events
            .iter()
            .filter(|e| !counts.contains_key(*e))
            .cloned()
            .collect(),
        duplicated: counts
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(e, n)| (e.clone(), *n))
            .collect(),
        events: events.len(),
        outputs: outputs.len(),
    }
}

/// Fenced: every input event's output is committed exactly once, through a kill mid-wave and a
/// zombie; unfenced: the zombie's stale flush and the successor's replay both emit, so duplicates
/// show (the check can fail).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_commit_exactly_once_through_a_kill_and_a_zombie() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let fenced = scenario(&kafka, true).await;
    eprintln!(
        "fenced: {} events, {} outputs, {} lost, {} duplicated",
        fenced.events,
        fenced.outputs,
        fenced.lost.len(),
        fenced.duplicated.len()
    );
    assert!(fenced.events > 200, "{} events", fenced.events);
    assert!(fenced.lost.is_empty(), "lost: {:?}", fenced.lost);
    assert!(
        fenced.duplicated.is_empty(),
        "duplicated: {:?}",
        fenced.duplicated
    );
    assert_eq!(fenced.outputs, fenced.events);

    let plain = scenario(&kafka, false).await;
    eprintln!(
        "unfenced: {} events, {} outputs, {} lost, {} duplicated",
        plain.events,
        plain.outputs,
        plain.lost.len(),
        plain.duplicated.len()
    );
    assert!(
        !plain.duplicated.is_empty(),
        "the unfenced mode is at least once: a zombie's stale flush duplicates outputs"
    );
}
