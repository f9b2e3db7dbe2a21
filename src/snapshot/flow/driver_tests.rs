//! The flow driver over bare group-commit queues with fake transaction runners: partitions independent,
//! fences kept to their partition, and the persist-wave benchmark.

use std::sync::atomic::AtomicUsize;
use std::time::Instant;

use super::lane::*;
use super::shared::judge;
use super::*;
use crate::records::{Record, TimestampType};
use crate::snapshot::fold::{BoxError, Change, Outputs};
use crate::snapshot::fold_core::PartitionCore;
use crate::snapshot::group_commit::Entry;
use crate::snapshot::group_commit::{GroupCommit, MetadataSource, TransactionRunner};
use crate::snapshot::{FailureKind, TxnFailure};
use crate::GroupMetadata;

/// Counts events per key, in place.
struct Count;

impl Fold for Count {
    type State = u64;
    fn fold(
        &self,
        _key: &Bytes,
        n: &mut Option<u64>,
        _event: &Record,
        _out: &mut Outputs,
    ) -> Change {
        *n.get_or_insert(0) += 1;
        Change::Update
    }
    fn encode(&self, n: &u64) -> Bytes {
        Bytes::copy_from_slice(&n.to_be_bytes())
    }
    fn decode(&self, b: &[u8]) -> Result<u64, BoxError> {
        Ok(u64::from_be_bytes(b.try_into()?))
    }
}

/// Sleeps `delay` per transaction, then succeeds, or fails with `fails` (a group fence when only
/// `fenced` is set); counts transactions.
struct FakeRunner {
    delay: Duration,
    fenced: bool,
    fails: Option<FailureKind>,
    transactions: Arc<AtomicUsize>,
}

impl TransactionRunner for FakeRunner {
    fn begin(&mut self) -> Result<(), TxnFailure> {
        Ok(())
    }

    async fn send(&mut self, _entry: Entry) -> Result<(), TxnFailure> {
        Ok(())
    }

    async fn settle(&mut self) -> Result<(), TxnFailure> {
        Ok(())
    }

    async fn commit(&mut self, _offset: i64, _metadata: GroupMetadata) -> Result<(), TxnFailure> {
        tokio::time::sleep(self.delay).await;
        self.transactions.fetch_add(1, Ordering::Relaxed);
        if let Some(kind) = self.fails {
            return Err(TxnFailure::scripted(kind));
        }
        if self.fenced {
            return Err(TxnFailure::scripted(FailureKind::Fenced));
        }
        Ok(())
    }

    async fn abort(&mut self) -> Result<(), TxnFailure> {
        Ok(())
    }
}

fn metadata() -> Arc<dyn MetadataSource> {
    Arc::new(|| Some(GroupMetadata::new("g", 1, "m", None).unwrap()))
}

fn lane(
    partition: i32,
    delay: Duration,
    fenced: bool,
    keys: usize,
) -> (Arc<Lane<u64, GroupCommit<FakeRunner>>>, Arc<AtomicUsize>) {
    failing_lane(
        partition,
        delay,
        fenced.then_some(FailureKind::Fenced),
        keys,
    )
}

fn failing_lane(
    partition: i32,
    delay: Duration,
    fails: Option<FailureKind>,
    keys: usize,
) -> (Arc<Lane<u64, GroupCommit<FakeRunner>>>, Arc<AtomicUsize>) {
    let transactions = Arc::new(AtomicUsize::new(0));
    let runner = FakeRunner {
        delay,
        fenced: false,
        fails,
        transactions: Arc::clone(&transactions),
    };
    let writer = GroupCommit::new(partition, runner, metadata(), 0, 256, 65_536).unwrap();
    let mut core = PartitionCore::new(0);
    for i in 0..keys {
        let event = Record {
            offset: i as i64,
            timestamp: 0,
            timestamp_type: TimestampType::CreateTime,
            key: Some(Bytes::from(format!("key-{i:06}"))),
            value: None,
            headers: Vec::new(),
        };
        core.handle_event(&Count, &event);
    }
    (Arc::new(Lane::new(partition, core, writer)), transactions)
}

async fn persist_all(
    lanes: &[Arc<Lane<u64, GroupCommit<FakeRunner>>>],
    limit: usize,
) -> Result<(), FlowError> {
    let failures = each_lane(lanes.to_vec(), limit, |lane| async move {
        persist_lane(&Count, &lane).await
    })
    .await;
    failures.into_iter().next().map_or(Ok(()), |(_, e)| Err(e))
}

/// A fenced partition stops alone: the others' waves land and their committable offsets move, the fenced
/// one keeps every key held and writes nothing more.
#[tokio::test]
async fn a_fenced_partition_does_not_stop_the_others() {
    let (good, _) = lane(0, Duration::from_millis(1), false, 10);
    let (stale, _) = lane(1, Duration::from_millis(1), true, 10);
    let lanes = vec![Arc::clone(&good), Arc::clone(&stale)];
    let err = persist_all(&lanes, 8).await.unwrap_err();
    assert!(err.is_fenced(), "{err}");
    assert_eq!(good.core().committable(), 10);
    assert_eq!(stale.core().committable(), 0);
    assert!(stale.core().is_fenced());
    commit_lane(&good, CommitWhen::Moved).await.unwrap();
    assert!(
        persist_lane(&Count, &stale).await.is_ok(),
        "nothing more to write"
    );
}

/// A fenced transaction's error reaches the flow with its producer error typed: readable as a
/// `ProducerError` field, and on the `source()` chain, with no downcast anywhere.
#[tokio::test]
async fn a_fence_keeps_its_typed_cause_up_to_the_flow() {
    use crate::producer::ProducerError;
    use crate::wire::ErrorCode;
    use std::error::Error as _;

    let (stale, _) = lane(1, Duration::from_millis(1), true, 3);
    let err = persist_all(&[stale], 8).await.unwrap_err();
    assert!(err.is_fenced() && !err.is_producer_fenced(), "{err}");
    let FlowError::Snapshot(SnapshotError::Transaction { failure, .. }) = &err else {
        panic!("not a failed transaction: {err:?}");
    };
    let cause: &ProducerError = &failure.source;
    assert!(
        matches!(
            cause,
            ProducerError::CommitFenced {
                code: ErrorCode::IllegalGeneration,
                ..
            }
        ),
        "{cause:?}"
    );
    assert_eq!(failure.fence_code(), Some(ErrorCode::IllegalGeneration));
    // FlowError -> (transparent) SnapshotError -> TxnFailure -> ProducerError.
    let mut chain = Vec::new();
    let mut next = err.source();
    while let Some(e) = next {
        chain.push(e.to_string());
        next = e.source();
    }
    assert_eq!(chain, [failure.to_string(), cause.to_string()]);
    assert!(chain[1].contains("ILLEGAL_GENERATION"), "{chain:?}");
    assert_eq!(
        err.response(),
        Some(crate::snapshot::Response::RecoverInPlace)
    );
}

/// The consumer's fenced offset commit is classified by the same table as the transaction's.
#[test]
fn the_consumers_fence_reads_the_same_table() {
    use crate::snapshot::Response;
    use crate::wire::ErrorCode;
    for (code, kind, response) in [
        (
            ErrorCode::IllegalGeneration,
            FailureKind::Fenced,
            Response::RecoverInPlace,
        ),
        (
            ErrorCode::StaleMemberEpoch,
            FailureKind::Fenced,
            Response::RecoverInPlace,
        ),
        (
            ErrorCode::UnknownMemberId,
            FailureKind::Evicted,
            Response::Rejoin,
        ),
        (
            ErrorCode::FencedInstanceId,
            FailureKind::InstanceFenced,
            Response::Stop,
        ),
    ] {
        let err = FlowError::Consumer(ConsumerError::CommitFenced {
            group: "g".into(),
            code,
        });
        assert_eq!(err.failure_kind(), Some(kind), "{code}");
        assert_eq!(err.response(), Some(response), "{code}");
        assert!(err.is_fenced() && !err.is_producer_fenced(), "{code}");
    }
    let other = FlowError::Consumer(ConsumerError::NoCommittedOffset {
        partition: TopicPartition::new("in", 0),
    });
    assert_eq!(other.response(), None);
    assert!(!other.is_fenced());
}

/// Folding into a partition while its wave is in flight is not blocked by the wave, and a slow partition
/// does not delay another's persist: the core's lock is never held across the write.
#[tokio::test]
async fn a_slow_partition_holds_up_neither_folding_nor_other_partitions() {
    let (slow, _) = lane(0, Duration::from_secs(3600), false, 10);
    let (fast, _) = lane(1, Duration::from_millis(1), false, 10);
    let slow_wave = tokio::spawn({
        let slow = Arc::clone(&slow);
        async move { persist_lane(&Count, &slow).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let event = Record {
        offset: 10,
        timestamp: 0,
        timestamp_type: TimestampType::CreateTime,
        key: Some(Bytes::from_static(b"key-000000")),
        value: None,
        headers: Vec::new(),
    };
    assert_eq!(slow.core().handle_event(&Count, &event), Folded::Changed);
    tokio::time::timeout(Duration::from_secs(5), persist_lane(&Count, &fast))
        .await
        .expect("the fast partition is not held up")
        .unwrap();
    assert_eq!(fast.core().committable(), 10);
    assert_eq!(slow.core().committable(), 0, "the slow wave has not landed");
    slow_wave.abort();
    let _ = slow_wave.await;
    // The dropped wave counts as failed: everything it carried is written again.
    assert_eq!(
        slow.core().poll_wave(&Count).map(|w| w.writes.len()),
        Some(10)
    );
}

/// The benchmark row of docs/benchmarks.md: one persist wave over 8 partitions × 1 000 keys, each
/// partition's transactions delayed differently (5-40 ms), independent partitions against a forced
/// serial run in the same process. Run with
/// `cargo test --release -p snapfence --lib persist_wave_benchmark -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: run it on purpose"]
async fn persist_wave_benchmark() {
    const PARTITIONS: i32 = 8;
    const KEYS: usize = 1_000;
    let delay = |p: i32| Duration::from_millis(5 * (p as u64 + 1));
    let mut rows = Vec::new();
    for round in 0..3 {
        let mut timings = Vec::new();
        for limit in [8usize, 1] {
            let built: Vec<_> = (0..PARTITIONS)
                .map(|p| lane(p, delay(p), false, KEYS))
                .collect();
            let lanes: Vec<_> = built.iter().map(|(l, _)| Arc::clone(l)).collect();
            let began = Instant::now();
            persist_all(&lanes, limit).await.unwrap();
            let took = began.elapsed();
            let txns: usize = built.iter().map(|(_, t)| t.load(Ordering::Relaxed)).sum();
            for l in &lanes {
                assert_eq!(l.core().committable(), KEYS as i64);
            }
            timings.push((took, txns));
        }
        let (parallel, serial) = (timings[0], timings[1]);
        println!(
            "round {round}: independent {:>7.1} ms ({} txns), serial {:>7.1} ms ({} txns), ratio {:.2}",
            parallel.0.as_secs_f64() * 1e3,
            parallel.1,
            serial.0.as_secs_f64() * 1e3,
            serial.1,
            serial.0.as_secs_f64() / parallel.0.as_secs_f64()
        );
        rows.push(serial.0.as_secs_f64() / parallel.0.as_secs_f64());
    }
    rows.sort_by(f64::total_cmp);
    println!("median serial/independent ratio: {:.2}", rows[1]);
}

type FakeLanes = Mutex<BTreeMap<i32, Arc<Lane<u64, GroupCommit<FakeRunner>>>>>;

/// Three lanes, partition 1 failing with `kind`, persisted once, then judged under `policy`: which
/// lanes are left, what the caller is told, and what the fence handling plans next.
async fn one_failing_wave(
    kind: FailureKind,
    policy: FencePolicy,
) -> (Vec<i32>, Result<(), FlowError>, Mutex<FenceCore>) {
    let held: FakeLanes = Mutex::new(
        (0..3)
            .map(|p| {
                let fails = (p == 1).then_some(kind);
                (p, failing_lane(p, Duration::from_millis(1), fails, 5).0)
            })
            .collect(),
    );
    let lanes: Vec<_> = held.lock().unwrap().values().cloned().collect();
    let failures = each_lane(
        lanes,
        8,
        |lane| async move { persist_lane(&Count, &lane).await },
    )
    .await;
    assert_eq!(failures.len(), 1, "only partition 1 fails");
    let fence = Mutex::new(FenceCore::new(policy));
    let judged = judge(&held, &fence, failures, Site::Held);
    assert!(judged
        .dropped
        .iter()
        .all(|l| !held.lock().unwrap().contains_key(&l.partition)));
    let left = held.lock().unwrap().keys().copied().collect();
    (left, judged.result, fence)
}

/// A spurious fence (the group refused one partition's commit) in the tolerant mode drops only that
/// partition's lane, tells the caller nothing, counts it, and the next plan acquires it again while the
/// consumer still owns it.
#[tokio::test]
async fn a_spurious_fence_drops_one_lane_and_plans_its_reacquisition() {
    let (left, result, fence) = one_failing_wave(FailureKind::Fenced, FencePolicy::Recover).await;
    assert_eq!(left, vec![0, 2]);
    assert!(result.is_ok(), "{result:?}");
    let mut fence = fence.into_inner().unwrap();
    assert_eq!(fence.stats().fences_recovered, 1);
    assert_eq!(
        fence.poll_reacquire(&[0, 1, 2].into_iter().collect()),
        vec![1]
    );
}

/// An unknown outcome is recovered in place too: the new acquisition's InitProducerId settles it.
#[tokio::test]
async fn an_unknown_outcome_is_recovered_in_place() {
    let (left, result, _) =
        one_failing_wave(FailureKind::OutcomeUnknown, FencePolicy::Recover).await;
    assert_eq!(left, vec![0, 2]);
    assert!(result.is_ok(), "{result:?}");
}

/// An eviction or a producer fence drops every lane (nothing is written from the old membership)
/// and queues one rejoin, without an error to the caller.
#[tokio::test]
async fn an_eviction_or_a_producer_fence_drops_everything_and_rejoins() {
    for kind in [FailureKind::Evicted, FailureKind::ProducerFenced] {
        let (left, result, fence) = one_failing_wave(kind, FencePolicy::Recover).await;
        assert!(left.is_empty(), "{kind:?}: {left:?}");
        assert!(result.is_ok(), "{kind:?}: {result:?}");
        let mut fence = fence.into_inner().unwrap();
        assert!(fence.poll_rejoin().is_some(), "{kind:?}");
        assert_eq!(fence.stats().rejoins, 1);
    }
}

/// The stopping mode keeps today's behaviour: the error reaches the caller and no lane is dropped;
/// stopping kinds stop in the tolerant mode as well.
#[tokio::test]
async fn the_stopping_mode_and_stopping_kinds_return_the_error() {
    for (kind, policy) in [
        (FailureKind::Fenced, FencePolicy::Stop),
        (FailureKind::Evicted, FencePolicy::Stop),
        (FailureKind::InstanceFenced, FencePolicy::Recover),
        (FailureKind::Fatal, FencePolicy::Recover),
    ] {
        let (left, result, _) = one_failing_wave(kind, policy).await;
        assert_eq!(left, vec![0, 1, 2], "{kind:?} {policy:?}");
        let err = result.expect_err("the caller hears of it");
        assert_eq!(err.failure_kind(), Some(kind));
    }
}

/// The periodic commit runs a transaction only when the committable offset moved past the last landed
/// commit: an idle partition commits nothing, while a handover's flush always commits.
#[tokio::test]
async fn an_unmoved_offset_is_not_committed_again() {
    let (lane, transactions) = lane(0, Duration::ZERO, false, 4);
    persist_lane(&Count, &lane).await.unwrap();
    let after_persist = transactions.load(Ordering::Relaxed);
    commit_lane(&lane, CommitWhen::Moved).await.unwrap();
    assert_eq!(transactions.load(Ordering::Relaxed), after_persist + 1);
    assert_eq!(lane.core().poll_commit(), None);
    commit_lane(&lane, CommitWhen::Moved).await.unwrap();
    assert_eq!(
        transactions.load(Ordering::Relaxed),
        after_persist + 1,
        "nothing moved, nothing committed"
    );
    commit_lane(&lane, CommitWhen::Always).await.unwrap();
    assert_eq!(transactions.load(Ordering::Relaxed), after_persist + 2);
}
