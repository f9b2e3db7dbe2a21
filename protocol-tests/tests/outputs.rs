//! Exactly-once output on a real broker: members emit one output per input event (the `Echo` fold),
//! riding with the key's snapshot. One owner is SIGKILLed in the middle of a wave, another is frozen in
//! a flush past its session timeout and thawed (a zombie that acts on stale state, whose refused commit
//! is recovered in place), and afterwards a `read_committed` reader of the output topic must see every
//! input event's output exactly once. The same scenario in the unfenced mode shows duplicates, so the
//! check can fail.

use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol_tests::campaign::{count_outputs, OutputCount};
use protocol_tests::member::{MemberArgs, MemberProcess};
use protocol_tests::tally::Echo;
use protocol_tests::{cluster, unique, ClusterSpec, KafkaCluster};
use snapfence::consumer::{
    list_offsets, GroupConfig, GroupConsumerConfig, OffsetReset, OffsetSpec, TopicPartition,
};
use snapfence::net::{Client, ClientConfig};
use snapfence::producer::{Producer, ProducerConfig, ProducerRecord};
use snapfence::records::IsolationLevel;
use snapfence::snapshot::{Flow, FlowConfig, PersistenceMode, SnapshotConfig};

const PARTITIONS: i32 = 4;
const SESSION: Duration = Duration::from_secs(6);
const KEYS: [&str; 8] = ["k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"];

/// Fresh input, snapshot (compacted) and output topics of [`PARTITIONS`] partitions each.
async fn topics(client: &Client) -> (String, String, String) {
    let (input, snapshots, output) = (unique("in"), unique("snap"), unique("out"));
    for (topic, configs) in [
        (&input, &[][..]),
        (&snapshots, &[("cleanup.policy", "compact")][..]),
        (&output, &[][..]),
    ] {
        snapfence::admin::create_topic(client, topic, PARTITIONS, -1, configs)
            .await
            .unwrap();
    }
    (input, snapshots, output)
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
async fn scenario(kafka: &KafkaCluster, transactional: bool) -> OutputCount {
    let client = Client::connect(ClientConfig::new(kafka.bootstrap()))
        .await
        .unwrap();
    let (input, snapshots, output) = topics(&client).await;
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

    count_outputs(&client, &input, &output, PARTITIONS)
        .await
        .unwrap()
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

/// Outputs held in memory are bounded: a partition whose held outputs reach
/// `max_output_bytes_per_partition` is persisted by the poll that folded them, so its outputs become
/// visible without a persist call; with the default budget the same poll persists nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_over_its_output_budget_persists_early() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let client = Client::connect(ClientConfig::new(kafka.bootstrap()))
        .await
        .unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default())
        .await
        .unwrap();
    for (budget, expect_visible) in [(None, false), (Some(1), true)] {
        let (input, snapshots, output) = topics(&client).await;
        for i in 0..20 {
            let record = ProducerRecord::new(input.as_str(), Some(Bytes::from(format!("v{i}"))))
                .key(KEYS[i % KEYS.len()])
                .partition(0);
            producer.send(record).await.unwrap().await.unwrap();
        }
        let mut args = MemberArgs::new(
            &kafka.bootstrap(),
            &unique("group"),
            &input,
            &snapshots,
            &unique("txn"),
        );
        args.session_timeout = SESSION;
        let mut config = finisher_config(&args);
        if let Some(b) = budget {
            config.max_output_bytes_per_partition = b;
        }
        let echo = Echo {
            topic: output.as_str().into(),
        };
        let mut flow = Flow::start(client.clone(), config, echo).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while flow.position(0).is_none_or(|p| p < 20) {
            flow.poll_once(Duration::from_millis(200)).await.unwrap();
            assert!(Instant::now() < deadline, "never folded the input");
        }
        // No persist call: only the budget can have written anything. Markers follow a commit by a
        // moment, so the reader waits (up to 10 s) for what it expects.
        let until = Instant::now() + Duration::from_secs(if expect_visible { 10 } else { 2 });
        let seen = loop {
            let seen = protocol_tests::campaign::read_topic(
                &client,
                &output,
                PARTITIONS,
                IsolationLevel::ReadCommitted,
            )
            .await
            .unwrap();
            if seen.len() >= 20 || Instant::now() > until {
                break seen;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        if expect_visible {
            assert_eq!(
                seen.len(),
                20,
                "budget {budget:?}: every output persisted early"
            );
        } else {
            assert!(
                seen.is_empty(),
                "the default budget holds {} outputs",
                seen.len()
            );
        }
        drop(flow);
    }
}
