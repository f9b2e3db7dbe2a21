//! Group commit: many concurrent snapshot writes of one partition share one transaction.
//!
//! A producer runs one transaction at a time, while a flow flushes a partition's keys concurrently. So a
//! write is queued, and whoever finds no transaction running starts a drain: it takes up to
//! `max_writes_per_transaction` queued writes (offset commits ride along without counting against the cap),
//! runs them as one transaction that also commits the partition's committable offset with the consumer's
//! group metadata read *at that moment*, and hands the outcome to every waiter in the batch. It then drains
//! again until the queue is empty. There is no batching delay: a lone write commits at once, and a batch is
//! whatever queued up while the previous transaction was in flight.
//!
//! Only one drain runs per partition. The "is a drain running" flag lives under the same lock as the queue,
//! so the drain's final "queue empty, stop" and a writer's "queue a write, is someone draining?" cannot
//! interleave into a stranded write:
//!
//! 1. drain: lock, queue empty → clear flag, unlock, exit.
//! 2. writer: lock, push, flag clear → set flag, spawn a drain, unlock.
//!
//! Either the drain sees the write (step 2 happened first) or the writer sees the cleared flag.
//!
//! The offset committed by a transaction is the committable offset the flow scheduled, seeded with the
//! offset the partition was assigned at, so the very first write is already gated by the generation.
//! An offset commit scheduled after some writes rides only in a transaction that carries all of those
//! writes, so the committed offset never gets ahead of writes queued before it.
//!
//! # References
//! - KIP-98 (transactions), KIP-447 (TxnOffsetCommit carries the consumer's generation and member id)

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};
use tracing::Instrument;

use super::error::{FailureKind, SnapshotError, TxnFailure};
use crate::GroupMetadata;

/// One snapshot write: a key and its new snapshot, or `None` to delete the key (a tombstone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotWrite {
    /// The state key.
    pub key: Bytes,
    /// The encoded snapshot, or `None` for a tombstone.
    pub value: Option<Bytes>,
}

/// What one transaction must carry: the writes, the input offset to commit and the fencing token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnBatch {
    /// The snapshot writes, in queue order (at most the cap).
    pub writes: Vec<SnapshotWrite>,
    /// The input partition's committable offset (the next offset to consume).
    pub offset: i64,
    /// The group metadata read for this transaction.
    pub metadata: GroupMetadata,
}

/// Runs one transaction: begin, send every write and await their acknowledgements, commit `offset` for the
/// input partition with `metadata` (TxnOffsetCommit), commit; on any failure abort and report the class.
///
/// Implemented over the transactional producer behind [`SnapshotStore`](super::SnapshotStore); tests use a recording fake.
pub trait TransactionRunner: Send + 'static {
    /// Runs `batch` as one transaction. Must leave no transaction open when it returns an error other
    /// than [`FailureKind::OutcomeUnknown`] or [`FailureKind::Fatal`].
    fn run(&mut self, batch: TxnBatch) -> impl Future<Output = Result<(), TxnFailure>> + Send;
}

/// A live reader of the consumer's group metadata, consulted once per transaction.
pub trait MetadataSource: Send + Sync + 'static {
    /// The metadata as of the consumer's latest poll, or `None` before the first join completes.
    fn current(&self) -> Option<GroupMetadata>;
}

impl<F> MetadataSource for F
where
    F: Fn() -> Option<GroupMetadata> + Send + Sync + 'static,
{
    fn current(&self) -> Option<GroupMetadata> {
        self()
    }
}

impl MetadataSource for crate::consumer::GroupMetadataHandle {
    fn current(&self) -> Option<GroupMetadata> {
        crate::consumer::GroupMetadataHandle::current(self)
    }
}

type Reply = oneshot::Sender<Result<(), SnapshotError>>;

struct QueuedWrite {
    seq: u64,
    write: SnapshotWrite,
    reply: Reply,
    _slot: OwnedSemaphorePermit,
}

struct QueuedOffset {
    seq: u64,
    offset: i64,
    reply: Reply,
}

struct Queue {
    writes: VecDeque<QueuedWrite>,
    offsets: VecDeque<QueuedOffset>,
    next_seq: u64,
    draining: bool,
    /// The offset the next transaction commits unless a queued offset commit moves it: seeded with the
    /// assigned offset, then the last offset a transaction committed.
    committed: i64,
    /// Set once a fatal or outcome-unknown failure makes the producer unusable.
    closed: Option<SnapshotError>,
}

struct Inner<R> {
    partition: i32,
    cap: usize,
    queue: Mutex<Queue>,
    runner: tokio::sync::Mutex<R>,
    metadata: Arc<dyn MetadataSource>,
    slots: Arc<Semaphore>,
}

/// The group-commit queue of one snapshot partition. Cheap to clone; clones share the queue.
pub struct GroupCommit<R> {
    inner: Arc<Inner<R>>,
}

impl<R> Clone for GroupCommit<R> {
    fn clone(&self) -> Self {
        GroupCommit {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<R: TransactionRunner> GroupCommit<R> {
    /// A queue for `partition` whose first transaction commits `assigned_offset`.
    ///
    /// `max_queued` bounds the writes waiting for a transaction (back-pressure for [`Self::write`],
    /// refusal for [`Self::try_write`]). `max_writes_per_transaction` below 1 is a configuration error.
    pub fn new(
        partition: i32,
        runner: R,
        metadata: Arc<dyn MetadataSource>,
        assigned_offset: i64,
        max_writes_per_transaction: usize,
        max_queued: usize,
    ) -> Result<Self, SnapshotError> {
        if max_writes_per_transaction < 1 {
            return Err(SnapshotError::Config(
                "max_writes_per_transaction must be at least 1".into(),
            ));
        }
        if max_queued < 1 {
            return Err(SnapshotError::Config(
                "the write queue bound must be at least 1".into(),
            ));
        }
        if assigned_offset < 0 {
            return Err(SnapshotError::Config(format!(
                "the assigned offset must be a real offset, got {assigned_offset}"
            )));
        }
        Ok(GroupCommit {
            inner: Arc::new(Inner {
                partition,
                cap: max_writes_per_transaction,
                queue: Mutex::new(Queue {
                    writes: VecDeque::new(),
                    offsets: VecDeque::new(),
                    next_seq: 0,
                    draining: false,
                    committed: assigned_offset,
                    closed: None,
                }),
                runner: tokio::sync::Mutex::new(runner),
                metadata,
                slots: Arc::new(Semaphore::new(max_queued)),
            }),
        })
    }

    /// The partition this queue writes.
    pub fn partition(&self) -> i32 {
        self.inner.partition
    }

    /// The offset the last successful transaction committed (or the assigned offset before any).
    pub fn committed_offset(&self) -> i64 {
        self.lock().committed
    }

    /// Queues a write and waits until the transaction carrying it has committed or failed.
    ///
    /// Waits for queue space first when `max_queued` writes are already waiting.
    ///
    /// Cancel safety: dropping the future before it returns may or may not withdraw the write: once queued,
    /// it rides in the next transaction regardless, and only its outcome is lost to the caller.
    pub async fn write(&self, key: Bytes, value: Option<Bytes>) -> Result<(), SnapshotError> {
        let slot = Arc::clone(&self.inner.slots)
            .acquire_owned()
            .await
            .map_err(|_| self.closed_error())?;
        self.enqueue_write(SnapshotWrite { key, value }, slot)?
            .await
            .unwrap_or_else(|_| Err(self.closed_error()))
    }

    /// Like [`Self::write`] but fails at once, handing the write back, when the queue is full.
    ///
    /// The returned future is the outcome; the write is queued before this returns.
    pub fn try_write(
        &self,
        key: Bytes,
        value: Option<Bytes>,
    ) -> Result<impl Future<Output = Result<(), SnapshotError>> + Send + 'static, TryWriteError>
    {
        let write = SnapshotWrite { key, value };
        let slot = match Arc::clone(&self.inner.slots).try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => return Err(TryWriteError::Full(write)),
        };
        let rx = self
            .enqueue_write(write, slot)
            .map_err(TryWriteError::Failed)?;
        let partition = self.inner.partition;
        Ok(async move { rx.await.unwrap_or(Err(SnapshotError::Closed { partition })) })
    }

    /// Schedules `offset` as the partition's committable offset and waits until a transaction has committed
    /// it. It rides with whatever writes are queued; with none queued it is an offset-only transaction.
    ///
    /// The offset never moves backwards: a lower value than one already scheduled is kept at the higher.
    ///
    /// Cancel safety: as [`Self::write`].
    pub async fn commit_offset(&self, offset: i64) -> Result<(), SnapshotError> {
        let (reply, rx) = oneshot::channel();
        {
            let mut q = self.lock();
            if let Some(err) = &q.closed {
                return Err(err.clone());
            }
            let seq = q.next_seq;
            q.next_seq += 1;
            q.offsets.push_back(QueuedOffset { seq, offset, reply });
            self.start_drain_locked(&mut q);
        }
        rx.await.unwrap_or_else(|_| Err(self.closed_error()))
    }

    /// Refuses new writes and waits for the transaction in flight (if any) to finish. Writes still queued
    /// are failed with [`SnapshotError::Closed`].
    pub async fn close(&self) {
        let pending = {
            let mut q = self.lock();
            if q.closed.is_none() {
                q.closed = Some(self.closed_error());
            }
            (
                std::mem::take(&mut q.writes),
                std::mem::take(&mut q.offsets),
            )
        };
        for w in pending.0 {
            let _ = w.reply.send(Err(self.closed_error()));
        }
        for o in pending.1 {
            let _ = o.reply.send(Err(self.closed_error()));
        }
        self.inner.slots.close();
        // The drain holds the runner for the whole transaction; taking it waits that transaction out.
        drop(self.inner.runner.lock().await);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        // A panic while holding this lock can only come from a bug in this module; the queue's invariants
        // hold between statements, so continuing with the inner value is sound.
        self.inner.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn closed_error(&self) -> SnapshotError {
        SnapshotError::Closed {
            partition: self.inner.partition,
        }
    }

    fn enqueue_write(
        &self,
        write: SnapshotWrite,
        slot: OwnedSemaphorePermit,
    ) -> Result<oneshot::Receiver<Result<(), SnapshotError>>, SnapshotError> {
        let (reply, rx) = oneshot::channel();
        let mut q = self.lock();
        if let Some(err) = &q.closed {
            return Err(err.clone());
        }
        let seq = q.next_seq;
        q.next_seq += 1;
        q.writes.push_back(QueuedWrite {
            seq,
            write,
            reply,
            _slot: slot,
        });
        self.start_drain_locked(&mut q);
        Ok(rx)
    }

    fn start_drain_locked(&self, q: &mut Queue) {
        if !q.draining {
            q.draining = true;
            tokio::spawn(drain(Arc::clone(&self.inner)));
        }
    }
}

/// The writes handed back by [`GroupCommit::try_write`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TryWriteError {
    /// The queue is full; the write was not queued.
    #[error("the snapshot write queue is full")]
    Full(SnapshotWrite),
    /// The store refused the write (closed).
    #[error(transparent)]
    Failed(SnapshotError),
}

struct Drained {
    writes: Vec<QueuedWrite>,
    offsets: Vec<QueuedOffset>,
    offset: i64,
}

/// Takes the next batch, or clears the draining flag and returns `None` when there is nothing to do.
fn take_batch(q: &mut Queue, cap: usize) -> Option<Drained> {
    if q.closed.is_some() || (q.writes.is_empty() && q.offsets.is_empty()) {
        q.draining = false;
        return None;
    }
    let n = q.writes.len().min(cap);
    let writes: Vec<QueuedWrite> = q.writes.drain(..n).collect();
    // An offset commit may ride only if no write queued before it is left behind.
    let oldest_left = q.writes.front().map(|w| w.seq).unwrap_or(u64::MAX);
    let mut offsets = Vec::new();
    while q.offsets.front().is_some_and(|o| o.seq < oldest_left) {
        offsets.extend(q.offsets.pop_front());
    }
    let offset = offsets.iter().map(|o| o.offset).fold(q.committed, i64::max);
    Some(Drained {
        writes,
        offsets,
        offset,
    })
}

async fn drain<R: TransactionRunner>(inner: Arc<Inner<R>>) {
    let mut runner = inner.runner.lock().await;
    loop {
        let batch = {
            let mut q = inner.queue.lock().unwrap_or_else(|e| e.into_inner());
            match take_batch(&mut q, inner.cap) {
                Some(b) => b,
                None => return,
            }
        };
        let outcome = match inner.metadata.current() {
            None => Err(SnapshotError::MissingGroupMetadata {
                partition: inner.partition,
            }),
            Some(metadata) => {
                let txn = TxnBatch {
                    writes: batch.writes.iter().map(|w| w.write.clone()).collect(),
                    offset: batch.offset,
                    metadata,
                };
                let span = tracing::debug_span!(
                    "group_commit",
                    partition = inner.partition,
                    writes = txn.writes.len(),
                    offsets = batch.offsets.len(),
                    offset = txn.offset
                );
                runner.run(txn).instrument(span).await.map_err(|failure| {
                    SnapshotError::Transaction {
                        partition: inner.partition,
                        failure,
                    }
                })
            }
        };
        {
            let mut q = inner.queue.lock().unwrap_or_else(|e| e.into_inner());
            match &outcome {
                Ok(()) => q.committed = batch.offset,
                Err(SnapshotError::Transaction { failure, .. })
                    if matches!(
                        failure.kind,
                        FailureKind::Fatal | FailureKind::OutcomeUnknown
                    ) =>
                {
                    // The producer is unusable (or the commit's fate unknown): nothing more may be sent on
                    // it. Fail everything queued with the same cause.
                    q.closed = Some(outcome.clone().unwrap_err());
                    let err = outcome.clone().unwrap_err();
                    for w in q.writes.drain(..) {
                        let _ = w.reply.send(Err(err.clone()));
                    }
                    for o in q.offsets.drain(..) {
                        let _ = o.reply.send(Err(err.clone()));
                    }
                }
                Err(_) => {}
            }
        }
        for w in batch.writes {
            let _ = w.reply.send(outcome.clone());
        }
        for o in batch.offsets {
            let _ = o.reply.send(outcome.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicI32, Ordering};

    /// A recording fake producer: every transaction it is asked to run, optionally held open until the test
    /// releases it (so writes pile up behind it) and optionally failing with a scripted class.
    #[derive(Clone, Default)]
    struct Recorder {
        runs: Arc<Mutex<Vec<TxnBatch>>>,
        hold: Option<Arc<Semaphore>>,
        /// Outcome of each run in order; `None` or an exhausted script means success.
        script: Arc<Mutex<VecDeque<Option<FailureKind>>>>,
    }

    impl TransactionRunner for Recorder {
        async fn run(&mut self, batch: TxnBatch) -> Result<(), TxnFailure> {
            // Recorded on entry, so a transaction held in flight is already visible to the test.
            self.runs.lock().unwrap().push(batch);
            if let Some(hold) = &self.hold {
                hold.acquire().await.unwrap().forget();
            }
            match self.script.lock().unwrap().pop_front().flatten() {
                Some(kind) => Err(TxnFailure::new(kind, "scripted failure")),
                None => Ok(()),
            }
        }
    }

    fn meta(generation: i32) -> GroupMetadata {
        GroupMetadata::new("g", generation, "member-1", None).unwrap()
    }

    fn live(generation: Arc<AtomicI32>) -> Arc<dyn MetadataSource> {
        Arc::new(move || {
            let g = generation.load(Ordering::SeqCst);
            (g >= 0).then(|| meta(g))
        })
    }

    /// Yields until `cond` holds; fails the test instead of spinning forever.
    async fn until(mut cond: impl FnMut() -> bool) {
        for _ in 0..100_000 {
            if cond() {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("condition never became true");
    }

    fn key(i: usize) -> Bytes {
        Bytes::from(format!("k{i}"))
    }

    /// A lone write commits at once, carrying the seeded (assigned) offset: the first write is gated.
    #[tokio::test]
    async fn lone_write_commits_with_seeded_offset() {
        let rec = Recorder::default();
        let gc = GroupCommit::new(
            3,
            rec.clone(),
            live(Arc::new(AtomicI32::new(7))),
            42,
            256,
            1024,
        )
        .unwrap();
        gc.write(key(1), Some(Bytes::from_static(b"v")))
            .await
            .unwrap();
        let runs = rec.runs.lock().unwrap().clone();
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].offset, 42);
        assert_eq!(runs[0].metadata.generation_id(), 7);
        assert_eq!(
            runs[0].writes,
            vec![SnapshotWrite {
                key: key(1),
                value: Some(Bytes::from_static(b"v"))
            }]
        );
    }

    async fn burst(cap: usize, n: usize) -> Vec<TxnBatch> {
        let hold = Arc::new(Semaphore::new(0));
        let rec = Recorder {
            hold: Some(hold.clone()),
            ..Default::default()
        };
        let gc = GroupCommit::new(
            0,
            rec.clone(),
            live(Arc::new(AtomicI32::new(1))),
            0,
            cap,
            10_000,
        )
        .unwrap();
        let mut tasks = Vec::new();
        for i in 0..n {
            let gc = gc.clone();
            tasks.push(tokio::spawn(async move {
                gc.write(key(i), Some(Bytes::new())).await
            }));
        }
        // Let every writer queue, then let transactions run one by one.
        until(|| {
            gc.lock().writes.len()
                + rec
                    .runs
                    .lock()
                    .unwrap()
                    .iter()
                    .map(|b| b.writes.len())
                    .sum::<usize>()
                == n
        })
        .await;
        hold.add_permits(n + 1);
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        let runs = rec.runs.lock().unwrap().clone();
        runs
    }

    /// Every write is committed exactly once, and no transaction carries more than the cap.
    #[tokio::test]
    async fn burst_respects_cap_and_commits_each_write_once() {
        for (cap, n) in [(1usize, 40usize), (16, 500), (256, 500)] {
            let runs = burst(cap, n).await;
            assert!(
                runs.iter()
                    .all(|b| !b.writes.is_empty() && b.writes.len() <= cap),
                "cap {cap}"
            );
            let mut keys: Vec<Bytes> = runs
                .iter()
                .flat_map(|b| b.writes.iter().map(|w| w.key.clone()))
                .collect();
            keys.sort();
            let mut want: Vec<Bytes> = (0..n).map(key).collect();
            want.sort();
            assert_eq!(keys, want, "cap {cap}");
            // All writes were queued before the first transaction ran, so the batches are as full as allowed.
            assert_eq!(runs.len(), n.div_ceil(cap), "cap {cap}");
        }
    }

    /// With nothing queued, an offset commit is an offset-only transaction; the next write re-commits it.
    #[tokio::test]
    async fn offset_only_transaction_then_write_recommits() {
        let rec = Recorder::default();
        let gc = GroupCommit::new(
            0,
            rec.clone(),
            live(Arc::new(AtomicI32::new(1))),
            10,
            256,
            64,
        )
        .unwrap();
        gc.commit_offset(25).await.unwrap();
        assert_eq!(gc.committed_offset(), 25);
        gc.write(key(0), None).await.unwrap();
        let runs = rec.runs.lock().unwrap().clone();
        assert_eq!(runs.len(), 2);
        assert!(runs[0].writes.is_empty());
        assert_eq!(runs[0].offset, 25);
        assert_eq!(
            runs[1].offset, 25,
            "a write re-commits the current offset, it never advances it"
        );
        assert_eq!(
            runs[1].writes[0].value, None,
            "a tombstone stays a tombstone"
        );
    }

    /// An offset commit rides along free: it neither counts against the cap nor waits for its own transaction,
    /// and it never rides ahead of a write queued before it.
    #[tokio::test]
    async fn offset_rides_along_but_never_ahead_of_earlier_writes() {
        let hold = Arc::new(Semaphore::new(0));
        let rec = Recorder {
            hold: Some(hold.clone()),
            ..Default::default()
        };
        let gc =
            GroupCommit::new(0, rec.clone(), live(Arc::new(AtomicI32::new(1))), 0, 2, 64).unwrap();
        // w0 starts a transaction that the fake holds open; w1..w3 and then the offset queue behind it.
        let mut tasks = Vec::new();
        for i in 0..4 {
            let gc = gc.clone();
            tasks.push(tokio::spawn(async move { gc.write(key(i), None).await }));
            tokio::task::yield_now().await;
        }
        let off = {
            let gc = gc.clone();
            tokio::spawn(async move { gc.commit_offset(99).await })
        };
        until(|| !gc.lock().offsets.is_empty()).await;
        hold.add_permits(10);
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        off.await.unwrap().unwrap();
        let runs = rec.runs.lock().unwrap().clone();
        let shape: Vec<(usize, i64)> = runs.iter().map(|b| (b.writes.len(), b.offset)).collect();
        // [w0] then [w1,w2] (w3 left behind, so the offset may not ride), then [w3] + offset 99.
        assert_eq!(shape, vec![(1, 0), (2, 0), (1, 99)]);
    }

    /// The group metadata is read for each transaction, never cached: a generation bump between two
    /// transactions shows in the second.
    #[tokio::test]
    async fn metadata_is_read_live_per_transaction() {
        let rec = Recorder::default();
        let generation = Arc::new(AtomicI32::new(4));
        let gc = GroupCommit::new(0, rec.clone(), live(generation.clone()), 0, 256, 64).unwrap();
        gc.write(key(0), None).await.unwrap();
        generation.store(5, Ordering::SeqCst);
        gc.write(key(1), None).await.unwrap();
        let gens: Vec<i32> = rec
            .runs
            .lock()
            .unwrap()
            .iter()
            .map(|b| b.metadata.generation_id())
            .collect();
        assert_eq!(gens, vec![4, 5]);
    }

    /// Without group metadata nothing is sent: a commit without a generation would land unfenced.
    #[tokio::test]
    async fn missing_metadata_fails_loudly_and_sends_nothing() {
        let rec = Recorder::default();
        let gc = GroupCommit::new(
            6,
            rec.clone(),
            live(Arc::new(AtomicI32::new(-1))),
            0,
            256,
            64,
        )
        .unwrap();
        let err = gc.write(key(0), None).await.unwrap_err();
        assert!(
            matches!(err, SnapshotError::MissingGroupMetadata { partition: 6 }),
            "{err}"
        );
        assert!(rec.runs.lock().unwrap().is_empty());
        let err = gc.commit_offset(5).await.unwrap_err();
        assert!(matches!(err, SnapshotError::MissingGroupMetadata { .. }));
        assert_eq!(gc.committed_offset(), 0, "a refused commit moves nothing");
    }

    /// A fenced or aborted transaction fails only its own waiters and leaves the queue usable; a fatal one
    /// closes the queue, so later writes are refused with the same cause instead of reaching a dead producer.
    #[tokio::test]
    async fn fenced_leaves_queue_usable_fatal_closes_it() {
        let rec = Recorder::default();
        rec.script.lock().unwrap().extend([
            Some(FailureKind::Fenced),
            None,
            Some(FailureKind::Fatal),
        ]);
        let gc = GroupCommit::new(
            0,
            rec.clone(),
            live(Arc::new(AtomicI32::new(1))),
            0,
            256,
            64,
        )
        .unwrap();
        let e = gc.write(key(0), None).await.unwrap_err();
        assert!(e.is_fenced(), "{e}");
        assert_eq!(
            gc.committed_offset(),
            0,
            "a fenced transaction commits no offset"
        );
        gc.write(key(1), None).await.unwrap();
        let e = gc.write(key(2), None).await.unwrap_err();
        assert!(
            matches!(&e, SnapshotError::Transaction { failure, .. } if failure.kind == FailureKind::Fatal)
        );
        let again = gc.write(key(3), None).await.unwrap_err();
        assert!(
            matches!(&again, SnapshotError::Transaction { failure, .. } if failure.kind == FailureKind::Fatal)
        );
        assert_eq!(
            rec.runs.lock().unwrap().len(),
            3,
            "nothing is sent after the fatal failure"
        );
    }

    /// Every write that rode in a failed transaction gets the failure; writes in other transactions do not.
    #[tokio::test]
    async fn a_failed_batch_fails_all_its_writes() {
        let hold = Arc::new(Semaphore::new(0));
        let rec = Recorder {
            hold: Some(hold.clone()),
            ..Default::default()
        };
        // The first transaction (w0 alone) commits; the second (w1..w3, queued behind it) aborts.
        rec.script
            .lock()
            .unwrap()
            .extend([None, Some(FailureKind::Aborted)]);
        let gc = GroupCommit::new(
            0,
            rec.clone(),
            live(Arc::new(AtomicI32::new(1))),
            0,
            256,
            64,
        )
        .unwrap();
        let mut tasks = Vec::new();
        for i in 0..4 {
            let gc = gc.clone();
            tasks.push(tokio::spawn(async move { gc.write(key(i), None).await }));
            tokio::task::yield_now().await;
        }
        until(|| gc.lock().writes.len() == 3).await;
        hold.add_permits(10);
        let mut outcomes = Vec::new();
        for t in tasks {
            outcomes.push(t.await.unwrap().map_err(|e| match e {
                SnapshotError::Transaction { failure, .. } => failure.kind,
                other => panic!("unexpected {other}"),
            }));
        }
        let shape: Vec<usize> = rec
            .runs
            .lock()
            .unwrap()
            .iter()
            .map(|b| b.writes.len())
            .collect();
        assert_eq!(shape, vec![1, 3]);
        let aborted = Err(FailureKind::Aborted);
        assert_eq!(outcomes, vec![Ok(()), aborted, aborted, aborted]);
    }

    #[tokio::test]
    async fn configuration_is_checked() {
        let m = live(Arc::new(AtomicI32::new(1)));
        assert!(matches!(
            GroupCommit::new(0, Recorder::default(), m.clone(), 0, 0, 8),
            Err(SnapshotError::Config(_))
        ));
        assert!(matches!(
            GroupCommit::new(0, Recorder::default(), m.clone(), -1, 1, 8),
            Err(SnapshotError::Config(_))
        ));
        assert!(GroupCommit::new(0, Recorder::default(), m, 0, 1, 8).is_ok());
    }

    /// try_write refuses at once when the queue is full, handing the write back.
    #[tokio::test]
    async fn try_write_fails_fast_when_full() {
        let hold = Arc::new(Semaphore::new(0));
        let rec = Recorder {
            hold: Some(hold.clone()),
            ..Default::default()
        };
        let gc =
            GroupCommit::new(0, rec.clone(), live(Arc::new(AtomicI32::new(1))), 0, 256, 2).unwrap();
        let a = gc.try_write(key(0), None).ok().unwrap();
        let b = gc.try_write(key(1), None).ok().unwrap();
        match gc.try_write(key(2), None) {
            Err(TryWriteError::Full(w)) => assert_eq!(w.key, key(2)),
            _ => panic!("expected Full"),
        }
        hold.add_permits(10);
        a.await.unwrap();
        b.await.unwrap();
        assert!(
            gc.try_write(key(3), None).is_ok(),
            "slots are returned once writes complete"
        );
    }
}
