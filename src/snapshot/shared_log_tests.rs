//! The shared recovery reader: its core's decisions without I/O, and its driver's failures against a
//! loopback stub that serves only ApiVersions and Metadata (the fetch dies before anything is sent).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::shared_log::Core;
use super::{LogChunk, LogError, SharedLogs, SnapshotLog};
use crate::consumer::supervise_tests::leader_stub;
use crate::consumer::{ConsumerError, ReaderConfig, TopicPartition};
use crate::net::{Client, ClientConfig};
use crate::wire::ErrorCode;

const PATIENCE: Duration = Duration::from_secs(10);

fn tp(p: i32) -> TopicPartition {
    TopicPartition::new("t", p)
}

type Records = Vec<(Option<Bytes>, Option<Bytes>)>;

fn records(keys: &[&str]) -> Records {
    keys.iter()
        .map(|k| {
            (
                Some(Bytes::from(k.to_string())),
                Some(Bytes::from_static(b"v")),
            )
        })
        .collect()
}

/// One Fetch's answer: `keys` for partition `p`.
fn answer(p: i32, keys: &[&str]) -> BTreeMap<TopicPartition, Records> {
    BTreeMap::from([(tp(p), records(keys))])
}

fn later() -> Instant {
    Instant::now() + Duration::from_secs(60)
}

/// A first read assigns the partition; the answer goes to it; the partition's next chunk is read
/// ahead into its room (it stays resumed until then), then paused, and the next read is answered from
/// the room without waiting.
#[test]
fn reads_ahead_one_chunk_and_answers_from_the_room() {
    let mut core: Core<&str> = Core::default();
    assert!(core.handle_read(tp(0), 0, later(), "first").is_none());
    let plan = core.poll_fetch();
    assert_eq!(
        format!("{plan:?}")
            .matches("assign: [(TopicPartition")
            .count(),
        1,
        "{plan:?}"
    );

    let out = core.handle_fetched(Instant::now(), answer(0, &["a", "b"]), |_| (Some(2), None));
    assert_eq!(out.len(), 1);
    let (who, chunk) = &out[0];
    assert_eq!(*who, "first");
    assert_eq!(chunk.as_ref().unwrap().next_offset, 2);
    assert_eq!(chunk.as_ref().unwrap().records, records(&["a", "b"]));

    // Nobody waits now, but the room is empty: the next Fetch reads ahead.
    assert!(core.fetching());
    let plan = format!("{:?}", core.poll_fetch());
    assert!(plan.contains("resume: [TopicPartition"), "{plan}");
    assert!(core
        .handle_fetched(Instant::now(), answer(0, &["c"]), |_| (Some(3), None))
        .is_empty());
    // The room is full: paused, and nothing more to fetch.
    assert!(!core.fetching());
    let plan = format!("{:?}", core.poll_fetch());
    assert!(plan.contains("pause: [TopicPartition"), "{plan}");

    let (who, chunk) = core
        .handle_read(tp(0), 2, later(), "second")
        .expect("answered from the room");
    assert_eq!(who, "second");
    assert_eq!(
        chunk,
        LogChunk {
            records: records(&["c"]),
            next_offset: 3
        }
    );
}

/// A read at an offset other than the room's start drops the room and seeks.
#[test]
fn a_read_elsewhere_drops_the_room_and_seeks() {
    let mut core: Core<&str> = Core::default();
    core.handle_read(tp(0), 0, later(), "first");
    core.poll_fetch();
    core.handle_fetched(Instant::now(), answer(0, &["a"]), |_| (Some(1), None));
    core.poll_fetch();
    core.handle_fetched(Instant::now(), answer(0, &["b"]), |_| (Some(2), None));
    assert!(core.handle_read(tp(0), 0, later(), "again").is_none());
    let plan = format!("{:?}", core.poll_fetch());
    assert!(
        plan.contains("seek: [(TopicPartition { topic: \"t\", partition: 0 }, 0)]"),
        "{plan}"
    );
    let out = core.handle_fetched(Instant::now(), answer(0, &["a"]), |_| (Some(1), None));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, "again");
    assert_eq!(out[0].1.as_ref().unwrap().records, records(&["a"]));
}

/// A partition whose position reached the end the broker reported is not read ahead, and a Fetch
/// that would only read ahead does not wait at the broker.
#[test]
fn no_read_ahead_at_the_end_and_no_long_poll_for_read_ahead() {
    let mut core: Core<&str> = Core::default();
    let now = Instant::now();
    core.handle_read(tp(0), 0, now + Duration::from_millis(300), "p0");
    core.handle_read(tp(1), 0, now + Duration::from_millis(300), "p1");
    core.poll_fetch();
    assert_eq!(
        core.poll_timeout(now, Duration::from_millis(500)),
        Duration::from_millis(300)
    );
    // p0 reaches its end, p1 does not; both reads answered.
    let both = BTreeMap::from([(tp(0), records(&["a"])), (tp(1), records(&["b"]))]);
    let out = core.handle_fetched(now, both, |t| {
        if t.partition == 0 {
            (Some(1), Some(1))
        } else {
            (Some(1), Some(9))
        }
    });
    assert_eq!(out.len(), 2);
    assert!(core.fetching(), "p1 has more to read ahead");
    assert_eq!(
        core.poll_timeout(now, Duration::from_millis(500)),
        Duration::ZERO
    );
    let plan = format!("{:?}", core.poll_fetch());
    assert!(
        plan.contains("pause: [TopicPartition { topic: \"t\", partition: 0 }]"),
        "{plan}"
    );
    core.handle_fetched(now, answer(1, &["c"]), |t| {
        let at = if t.partition == 0 { 1 } else { 2 };
        (Some(at), Some(at))
    });
    assert!(!core.fetching(), "both at their end, nobody waiting");
    // A read at the end makes the partition worth a (waiting) Fetch again.
    core.handle_read(tp(0), 1, now + Duration::from_millis(200), "p0 again");
    assert!(core.fetching());
    assert_eq!(
        core.poll_timeout(now, Duration::from_millis(500)),
        Duration::from_millis(200)
    );
}

/// A chunk fetched from before a seek is dropped: the seek reads from where the read wants.
#[test]
fn a_chunk_from_before_a_seek_is_dropped() {
    let mut core: Core<&str> = Core::default();
    core.handle_read(tp(0), 0, later(), "first");
    core.poll_fetch();
    // While the Fetch is out, the read gives up and another asks from 5.
    core.handle_read(tp(0), 5, later(), "from five");
    let out = core.handle_fetched(Instant::now(), answer(0, &["a"]), |_| (Some(1), None));
    assert!(out.is_empty(), "the stale chunk went nowhere");
    let plan = format!("{:?}", core.poll_fetch());
    assert!(plan.contains(", 5)]"), "{plan}");
    let out = core.handle_fetched(Instant::now(), answer(0, &["f"]), |_| (Some(6), None));
    assert_eq!(out[0].0, "from five");
    assert_eq!(out[0].1.as_ref().unwrap().next_offset, 6);
}

/// A read with nothing to give gets an empty chunk at its own deadline, no earlier; the Fetch waits no
/// longer than the first deadline.
#[test]
fn an_idle_read_gets_an_empty_chunk_at_its_deadline() {
    let mut core: Core<&str> = Core::default();
    let now = Instant::now();
    core.handle_read(tp(0), 7, now + Duration::from_millis(100), "p0");
    core.handle_read(tp(1), 3, now + Duration::from_millis(300), "p1");
    core.poll_fetch();
    assert_eq!(
        core.poll_timeout(now, Duration::from_millis(500)),
        Duration::from_millis(100)
    );
    assert!(core
        .handle_fetched(now, BTreeMap::new(), |_| (None, None))
        .is_empty());
    let out = core.handle_fetched(now + Duration::from_millis(150), BTreeMap::new(), |_| {
        (None, None)
    });
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, "p0");
    assert_eq!(
        out[0].1.as_ref().unwrap(),
        &LogChunk {
            records: Vec::new(),
            next_offset: 7
        }
    );
    assert_eq!(
        core.poll_timeout(now + Duration::from_millis(150), Duration::from_millis(500)),
        Duration::from_millis(150)
    );
}

/// A Fetch that moved a position past markers or aborted records, with nothing to deliver, still
/// answers: the read moves on instead of stalling.
#[test]
fn a_position_moved_without_records_is_a_chunk() {
    let mut core: Core<&str> = Core::default();
    core.handle_read(tp(0), 0, later(), "first");
    core.poll_fetch();
    let out = core.handle_fetched(Instant::now(), BTreeMap::new(), |_| (Some(4), None));
    assert_eq!(out.len(), 1);
    assert_eq!(
        out[0].1.as_ref().unwrap(),
        &LogChunk {
            records: Vec::new(),
            next_offset: 4
        }
    );
}

/// An error the reader names a partition for goes to that partition's read alone, and the partition is
/// let go; any other failure goes to every waiting read.
#[test]
fn errors_go_to_the_reads_they_concern() {
    let mut core: Core<&str> = Core::default();
    core.handle_read(tp(0), 0, later(), "p0");
    core.handle_read(tp(1), 0, later(), "p1");
    core.poll_fetch();
    let named = Arc::new(ConsumerError::Partition {
        partition: tp(1),
        code: ErrorCode::UnknownTopicOrPartition,
    });
    let out = core.handle_failed(Instant::now(), named);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, "p1");
    assert!(matches!(out[0].1, Err(LogError::SharedFetch(_))));
    let plan = format!("{:?}", core.poll_fetch());
    assert!(
        plan.contains("unassign: [TopicPartition { topic: \"t\", partition: 1 }]"),
        "{plan}"
    );

    core.handle_read(tp(1), 0, later(), "p1 again");
    core.poll_fetch();
    let whole = Arc::new(ConsumerError::TaskFailed {
        task: "fetch".into(),
        failure: "gone".into(),
    });
    let mut who: Vec<&str> = core
        .handle_failed(Instant::now(), whole)
        .into_iter()
        .map(|(w, r)| {
            assert!(matches!(r, Err(LogError::SharedFetch(_))));
            w
        })
        .collect();
    who.sort();
    assert_eq!(who, ["p0", "p1 again"]);
}

/// A closed partition is unassigned before the next Fetch and nothing more is fetched for it.
#[test]
fn a_closed_partition_is_unassigned() {
    let mut core: Core<&str> = Core::default();
    core.handle_read(tp(0), 0, later(), "p0");
    core.poll_fetch();
    core.close(&tp(0));
    assert!(!core.fetching());
    let plan = format!("{:?}", core.poll_fetch());
    assert!(plan.contains("unassign: [TopicPartition"), "{plan}");
    assert!(core
        .handle_fetched(Instant::now(), answer(0, &["late"]), |_| (Some(1), None))
        .is_empty());
}

async fn logs() -> (SharedLogs, tokio::task::JoinHandle<()>) {
    let (addr, stub) = leader_stub().await;
    let client = Client::connect(ClientConfig::new(addr.to_string()))
        .await
        .unwrap();
    client.metadata(&["t"]).await.unwrap();
    (SharedLogs::new(client, "t", ReaderConfig::default()), stub)
}

/// The driver task dies: the waiting read ends at once with ReaderGone naming the panic, instead of
/// waiting for ever, and the next read starts a new driver.
#[tokio::test]
async fn a_dead_driver_is_reader_gone() {
    let (logs, stub) = logs().await;
    logs.inner_faults().arm("shared read", 1);
    let mut log = logs.log(0);
    match tokio::time::timeout(PATIENCE, log.fetch(0, Duration::from_millis(100)))
        .await
        .expect("the read ended")
    {
        Err(LogError::ReaderGone(how)) => {
            assert!(how.contains("injected fault at shared read"), "{how}")
        }
        other => panic!("expected ReaderGone, got {other:?}"),
    }
    // A new driver, whose fetch task is made to die: this read is answered by it.
    logs.inner_faults().arm("fetch", 1);
    match tokio::time::timeout(PATIENCE, log.fetch(0, Duration::from_millis(100)))
        .await
        .expect("the read ended")
    {
        Err(LogError::SharedFetch(e)) => {
            assert!(
                matches!(&*e, ConsumerError::TaskFailed { task, .. } if task == "fetch"),
                "{e:?}"
            )
        }
        other => panic!("expected SharedFetch from the new driver, got {other:?}"),
    }
    stub.abort();
}
