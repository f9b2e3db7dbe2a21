//! Group commit: many concurrent snapshot writes of one partition share one transaction.
//!
//! A producer runs one transaction at a time, while a flow flushes a partition's keys concurrently. So a
//! write is queued, and whoever finds no transaction running starts a drain task. The drain begins a
//! transaction with whatever is queued, and while that transaction is still producing, writes that arrive
//! join it, up to `max_writes_per_transaction`. When nothing more can join, the transaction is sealed: it
//! commits the partition's committable offset with the consumer's group metadata read *at that moment*
//! (the fence), then commits, and every waiter in it gets the outcome. Offset commits ride along without
//! counting against the cap. The drain then begins the next transaction, until the queue is empty.
//!
//! There is no batching delay: a lone write begins its transaction at once and seals it as soon as it is
//! sent. A burst fills the transaction it started, instead of leaving it with one write and queueing the
//! rest behind it (which cost one transaction more per burst than the cap requires): while writes keep
//! joining, the transaction waits for what it has sent to be acknowledged before it fixes its offset
//! (the commit waits for those acknowledgements anyway), so a burst's stragglers still join.
//!
//! What goes into which transaction, and which offset each commits, is decided by [`queue_core::Queue`], a
//! state machine without I/O; this module is its driver: the public handle, the drain loop that feeds the
//! queue's steps to a [`TransactionRunner`], and the supervision of that loop.
//!
//! Only one drain runs per partition. The "is a drain running" flag lives under the same lock as the queue,
//! so the drain's final "queue empty, stop" and a writer's "queue a write, is someone draining?" cannot
//! interleave into a stranded write:
//!
//! 1. drain: lock, nothing to begin → clear flag, unlock, exit.
//! 2. writer: lock, push, flag clear → set flag, spawn a drain, unlock.
//!
//! Either the drain sees the write (step 2 happened first) or the writer sees the cleared flag. The same
//! lock makes "join the open transaction" and "seal it" atomic against a writer's push: a write is either
//! in the transaction before its offset is fixed, or queued for the next one.
//!
//! The drain runs under [`crate::supervise`]: if it panics, every waiter (the transaction in flight
//! included) fails with [`SnapshotError::DrainDied`] and the queue closes, so no later write waits for a
//! drain that is gone.
//!
//! # References
//! - KIP-98 (transactions), KIP-447 (TxnOffsetCommit carries the consumer's generation and member id)

mod queue_core;

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tracing::Instrument;

use super::error::{FailureKind, SnapshotError, TxnFailure};
use crate::producer::ProducerRecord;
use crate::telemetry::TxnMetrics;
use crate::GroupMetadata;
use queue_core::{Queue, Step};

/// One snapshot write: a key and its new snapshot, or `None` to delete the key (a tombstone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotWrite {
    /// The state key.
    pub key: Bytes,
    /// The encoded snapshot, or `None` for a tombstone.
    pub value: Option<Bytes>,
}

/// One queued entry: a snapshot write and the outputs its fold emitted since the key's last write. The
/// group commit never splits an entry across transactions: the outputs are sent right after the
/// snapshot, in its transaction, so both commit or neither does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) write: SnapshotWrite,
    pub(crate) outputs: Vec<ProducerRecord>,
}

impl Entry {
    /// What the entry counts toward a transaction's byte cap: the snapshot's key and value, and the
    /// outputs as [`Outputs::bytes`](super::Outputs::bytes) counts them.
    pub(crate) fn bytes(&self) -> usize {
        let snapshot = self.write.key.len() + self.write.value.as_ref().map_or(0, |v| v.len());
        self.outputs
            .iter()
            .map(super::fold::output_size)
            .fold(snapshot, usize::saturating_add)
    }
}

impl From<SnapshotWrite> for Entry {
    fn from(write: SnapshotWrite) -> Self {
        Entry {
            write,
            outputs: Vec::new(),
        }
    }
}

/// The producer side of the group commit: the steps of one transaction, driven one at a time.
///
/// The group commit calls, for each transaction: [`begin`](Self::begin); [`send`](Self::send) for every
/// write, in queue order, including writes that joined after the transaction began, with
/// [`settle`](Self::settle) in between while a burst is still arriving; then once
/// [`commit`](Self::commit) with the offset and the group metadata (the fence). When a step fails with
/// [`FailureKind::Fenced`] or [`FailureKind::Aborted`], or the group metadata is gone at the seal, it calls
/// [`abort`](Self::abort); after [`FailureKind::Fatal`] or [`FailureKind::OutcomeUnknown`] it calls nothing
/// more. Never two calls at once.
///
/// Implemented over the transactional producer behind [`SnapshotStore`](super::SnapshotStore); tests use a
/// recording fake.
pub(crate) trait TransactionRunner: Send + 'static {
    /// Opens a transaction. Sends nothing.
    fn begin(&mut self) -> Result<(), TxnFailure>;

    /// Adds one entry to the open transaction (its snapshot, then its outputs); returns once all of it
    /// is buffered (the acknowledgements are [`commit`](Self::commit)'s to check).
    fn send(&mut self, entry: Entry) -> impl Future<Output = Result<(), TxnFailure>> + Send;

    /// Waits until every write sent so far in the transaction is acknowledged by the broker (sending
    /// what lingers in the buffer at once). Called while a burst's writes are still joining, so the rest
    /// of the burst can queue instead of starting a transaction of its own.
    fn settle(&mut self) -> impl Future<Output = Result<(), TxnFailure>> + Send;

    /// Commits `offset` for the input partition with `metadata` (TxnOffsetCommit, where the group
    /// coordinator checks the generation), then the transaction. Succeeds only if every write sent in
    /// the transaction was acknowledged and the transaction committed.
    fn commit(
        &mut self,
        offset: i64,
        metadata: GroupMetadata,
    ) -> impl Future<Output = Result<(), TxnFailure>> + Send;

    /// Aborts the open transaction: nothing of it lands. An error here leaves the producer's state unknown
    /// and closes the queue.
    fn abort(&mut self) -> impl Future<Output = Result<(), TxnFailure>> + Send;
}

/// A live reader of the consumer's group metadata, consulted when a transaction begins (to send nothing
/// without it) and when it is sealed (the token its offset commit carries).
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

/// A waiter: where its outcome goes, and (for a write) its place in the bounded queue, given back when
/// the ticket is dropped with the outcome.
struct Ticket {
    reply: oneshot::Sender<Result<(), SnapshotError>>,
    _slot: Option<OwnedSemaphorePermit>,
}

struct Shared {
    queue: Queue<Ticket>,
    /// A drain task is running (or about to).
    draining: bool,
    /// When each write still in the queue was queued, oldest first: the queue hands writes out in queue
    /// order, so the front `n` are the `n` writes a step takes. The queue itself reads no clock.
    queued_at: VecDeque<Instant>,
}

impl Shared {
    fn deliver(&mut self) {
        while let Some((ticket, outcome)) = self.queue.poll_outcome() {
            let _ = ticket.reply.send(outcome);
        }
    }

    /// A step took `n` writes out of the queue into the transaction: records how long each waited.
    fn took(&mut self, metrics: &TxnMetrics, n: usize) {
        let now = Instant::now();
        for at in self.queued_at.drain(..n.min(self.queued_at.len())) {
            metrics.waited(now.saturating_duration_since(at));
        }
        metrics.queue_depth(self.queued_at.len());
    }

    /// The queue failed or closed, dropping every queued write: nothing waits any more.
    fn emptied(&mut self, metrics: &TxnMetrics) {
        self.queued_at.clear();
        metrics.queue_depth(0);
    }
}

struct Inner<R> {
    partition: i32,
    shared: Mutex<Shared>,
    runner: tokio::sync::Mutex<R>,
    metadata: Arc<dyn MetadataSource>,
    slots: Arc<Semaphore>,
    metrics: TxnMetrics,
}

impl<R> Inner<R> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        // The queue does no I/O and calls nothing foreign under this lock, so a panic while it is held is a
        // bug in the queue; its fields hold their invariants between statements, so going on is sound.
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn closed_error(&self) -> SnapshotError {
        SnapshotError::Closed {
            partition: self.partition,
        }
    }
}

/// The group-commit queue of one snapshot partition. Cheap to clone; clones share the queue.
pub(crate) struct GroupCommit<R> {
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
                shared: Mutex::new(Shared {
                    queue: Queue::new(max_writes_per_transaction, assigned_offset),
                    draining: false,
                    queued_at: VecDeque::new(),
                }),
                runner: tokio::sync::Mutex::new(runner),
                metadata,
                slots: Arc::new(Semaphore::new(max_queued)),
                metrics: TxnMetrics::new(partition),
            }),
        })
    }

    /// Bounds the bytes one transaction carries (snapshots and outputs; at least one entry always
    /// goes), so a wave of large outputs runs as several transactions, each short against the
    /// transaction timeout.
    pub(crate) fn with_max_bytes(self, max_bytes_per_transaction: usize) -> Self {
        self.inner
            .lock()
            .queue
            .set_max_bytes(max_bytes_per_transaction);
        self
    }

    /// The offset the last successful transaction committed (or the assigned offset before any).
    pub fn committed_offset(&self) -> i64 {
        self.inner.lock().queue.committed()
    }

    /// How many transactions this queue has begun (committed, failed or in flight).
    pub fn transactions(&self) -> u64 {
        self.inner.lock().queue.transactions()
    }

    /// Queues a write and waits until the transaction carrying it has committed or failed.
    ///
    /// Waits for queue space first when `max_queued` writes are already waiting.
    ///
    /// Cancel safety: dropping the future before it returns may or may not withdraw the write: once queued,
    /// it rides in a transaction regardless, and only its outcome is lost to the caller.
    pub async fn write(&self, key: Bytes, value: Option<Bytes>) -> Result<(), SnapshotError> {
        let slot = Arc::clone(&self.inner.slots)
            .acquire_owned()
            .await
            .map_err(|_| self.refused())?;
        self.enqueue_write(SnapshotWrite { key, value }.into(), slot)?
            .await
            .unwrap_or_else(|_| Err(self.refused()))
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
        self.try_enqueue(SnapshotWrite { key, value }.into())
            .map_err(|e| match e {
                TryEnqueueError::Full(entry) => TryWriteError::Full(entry.write),
                TryEnqueueError::Failed(e) => TryWriteError::Failed(e),
            })
    }

    /// [`try_write`](Self::try_write) of a whole entry (a snapshot write and its outputs), handed back
    /// whole when the queue is full.
    pub(crate) fn try_enqueue(
        &self,
        entry: Entry,
    ) -> Result<impl Future<Output = Result<(), SnapshotError>> + Send + 'static, TryEnqueueError>
    {
        let slot = match Arc::clone(&self.inner.slots).try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                if self.inner.lock().queue.is_closed() {
                    return Err(TryEnqueueError::Failed(self.refused()));
                }
                return Err(TryEnqueueError::Full(entry));
            }
        };
        let rx = self
            .enqueue_write(entry, slot)
            .map_err(TryEnqueueError::Failed)?;
        let this = self.clone();
        Ok(async move { rx.await.unwrap_or_else(|_| Err(this.refused())) })
    }

    /// Schedules `offset` as the partition's committable offset and waits until a transaction has committed
    /// it. It rides with the writes queued before it (joining the open transaction if all of them are in
    /// it); with none queued it is an offset-only transaction. It never rides in a transaction that leaves
    /// a write queued before it behind, and it fails if such a write's transaction failed.
    ///
    /// The offset never moves backwards: a lower value than one already committed is kept at the higher.
    ///
    /// Cancel safety: as [`Self::write`].
    pub async fn commit_offset(&self, offset: i64) -> Result<(), SnapshotError> {
        let (reply, rx) = oneshot::channel();
        {
            let mut s = self.inner.lock();
            s.queue
                .handle_offset(offset, Ticket { reply, _slot: None })?;
            self.start_drain_locked(&mut s);
        }
        rx.await.unwrap_or_else(|_| Err(self.refused()))
    }

    /// Refuses new writes and waits for the transaction in flight (if any) to finish. Writes still queued
    /// are failed with [`SnapshotError::Closed`].
    ///
    /// Cancel-safe: the queue is closed from the first poll on; dropping the future only stops the
    /// wait for the transaction in flight.
    pub async fn close(&self) {
        {
            let mut s = self.inner.lock();
            s.queue.close(self.inner.closed_error());
            s.emptied(&self.inner.metrics);
            s.deliver();
        }
        self.inner.slots.close();
        // The drain holds the runner for the whole transaction; taking it waits that transaction out.
        drop(self.inner.runner.lock().await);
    }

    /// Why the queue refuses work: the cause it closed with (a dead drain, a fatal failure), else Closed.
    fn refused(&self) -> SnapshotError {
        let s = self.inner.lock();
        let probe = s.queue.refusal();
        probe.unwrap_or_else(|| self.inner.closed_error())
    }

    fn enqueue_write(
        &self,
        write: Entry,
        slot: OwnedSemaphorePermit,
    ) -> Result<oneshot::Receiver<Result<(), SnapshotError>>, SnapshotError> {
        let (reply, rx) = oneshot::channel();
        let mut s = self.inner.lock();
        s.queue.handle_write(
            write,
            Ticket {
                reply,
                _slot: Some(slot),
            },
        )?;
        s.queued_at.push_back(Instant::now());
        self.inner.metrics.queue_depth(s.queued_at.len());
        self.start_drain_locked(&mut s);
        Ok(rx)
    }

    fn start_drain_locked(&self, s: &mut Shared) {
        if !s.draining {
            s.draining = true;
            supervise(Arc::clone(&self.inner));
        }
    }
}

/// Why [`SnapshotStore::try_write`](super::SnapshotStore::try_write) did not queue a write.
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

/// Why [`GroupCommit::try_enqueue`] did not queue an entry.
pub(crate) enum TryEnqueueError {
    /// The queue is full; the entry is handed back.
    Full(Entry),
    /// The queue refused it (closed).
    Failed(SnapshotError),
}

/// Spawns the drain under [`crate::supervise`]: if it panics (or its task is dropped unfinished), every
/// waiter, the transaction in flight included, fails with [`SnapshotError::DrainDied`] and the queue is
/// closed, so no later write waits for a drain that is gone.
///
/// Spawning from a worker puts the task in that worker's LIFO slot, which other workers cannot steal: so
/// the drain starts when the writer that spawned it yields, on its worker, not at once on an idle one. A
/// caller queueing a burst with `try_write` in a loop has queued all of it by then, and the burst begins
/// as one transaction; a lone `write` yields at once (it awaits its outcome), so it waits for nothing.
fn supervise<R: TransactionRunner>(inner: Arc<Inner<R>>) {
    let watched = Arc::clone(&inner);
    crate::supervise::spawn(drain(inner), move |failure| {
        let message = match failure {
            crate::supervise::Failure::Panicked(message) => message,
            cancelled => cancelled.to_string(),
        };
        tracing::error!(partition = watched.partition, %message, "the group-commit drain task died; the snapshot store is closed");
        watched.slots.close();
        // The queue lock is never held across a panic: the guard is dropped while unwinding, before this
        // report runs.
        let mut s = watched.lock();
        s.queue.fail_all(SnapshotError::DrainDied {
            partition: watched.partition,
            message,
        });
        s.emptied(&watched.metrics);
        s.deliver();
        s.draining = false;
    });
}

/// Runs transactions until the queue has nothing to begin.
async fn drain<R: TransactionRunner>(inner: Arc<Inner<R>>) {
    let mut runner = inner.runner.lock().await;
    loop {
        let first = {
            let mut s = inner.lock();
            match s.queue.poll_begin() {
                Some(step) => {
                    s.took(&inner.metrics, sent(&step));
                    step
                }
                None => {
                    s.draining = false;
                    return;
                }
            }
        };
        // One span per transaction, so one can be followed through the logs: the group commit fills in
        // the generation (or member epoch) its fence carries, the runner the producer's identity.
        let span = tracing::info_span!(
            "snapshot_transaction",
            partition = inner.partition,
            generation = tracing::field::Empty,
            transactional_id = tracing::field::Empty,
            producer_id = tracing::field::Empty,
            producer_epoch = tracing::field::Empty,
        );
        let outcome = transaction(&inner, &mut *runner, first)
            .instrument(span)
            .await;
        let mut s = inner.lock();
        s.queue.handle_outcome(outcome);
        if s.queue.is_closed() {
            s.emptied(&inner.metrics);
        }
        s.deliver();
    }
}

/// One transaction: begin, feed it the queue's steps, commit; abort what failed abortably.
async fn transaction<R: TransactionRunner>(
    inner: &Inner<R>,
    runner: &mut R,
    first: Step,
) -> Result<(), SnapshotError> {
    let partition = inner.partition;
    // Without a generation nothing is sent: a commit without one would skip the coordinator's fence.
    let Some(metadata) = inner.metadata.current() else {
        return Err(SnapshotError::MissingGroupMetadata { partition });
    };
    tracing::Span::current().record("generation", metadata.generation_id());
    let began = Instant::now();
    let mut writes = 0;
    let outcome = run(inner, runner, first, &mut writes).await;
    let seen = match &outcome {
        Ok(()) => Ok(()),
        Err(SnapshotError::Transaction { failure, .. }) => Err(Some(failure.kind)),
        Err(_) => Err(None),
    };
    inner.metrics.ended(began.elapsed(), writes, seen);
    outcome
}

/// The begun transaction: produce and commit; abort what failed abortably. `writes` counts what it
/// sent.
async fn run<R: TransactionRunner>(
    inner: &Inner<R>,
    runner: &mut R,
    first: Step,
    writes: &mut usize,
) -> Result<(), SnapshotError> {
    let partition = inner.partition;
    let failure = match produce(inner, runner, first, writes).await {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(missing)) => {
            // The metadata went away between begin and seal: the writes are sent but not committed.
            if let Err(f) = runner.abort().await {
                return Err(escalate(partition, f));
            }
            return Err(missing);
        }
        Err(f) => f,
    };
    if failure.kind.aborts() {
        // Nothing of the transaction may land: abort it. If the abort itself fails the producer's state is
        // unknown, so the failure is escalated and the queue closes.
        if let Err(abort) = runner.abort().await {
            tracing::warn!(partition, error = %abort, cause = %failure, "abort after a failed snapshot transaction failed");
            return Err(escalate(partition, abort));
        }
    }
    Err(SnapshotError::Transaction { partition, failure })
}

/// The producing part: sends what the queue hands out until it seals, then commits. The outer `Err` is a
/// runner failure, the inner one metadata that vanished before the seal.
async fn produce<R: TransactionRunner>(
    inner: &Inner<R>,
    runner: &mut R,
    first: Step,
    sent: &mut usize,
) -> Result<Result<(), SnapshotError>, TxnFailure> {
    runner.begin()?;
    let mut step = first;
    let offset = loop {
        match step {
            Step::Send(writes) => {
                *sent += writes.len();
                for w in writes {
                    runner.send(w).await?;
                }
            }
            Step::Settle => runner.settle().await?,
            Step::Commit { offset } => break offset,
        }
        // One pass of the scheduler (not a timer): writers that are ready to run on this worker queue
        // their writes now and join, instead of waiting out the whole transaction.
        tokio::task::yield_now().await;
        step = {
            let mut s = inner.lock();
            let step = s
                .queue
                .poll_step()
                .expect("the drain's transaction is open until it reports the outcome");
            s.took(&inner.metrics, self::sent(&step));
            step
        };
    };
    let Some(metadata) = inner.metadata.current() else {
        return Ok(Err(SnapshotError::MissingGroupMetadata {
            partition: inner.partition,
        }));
    };
    tracing::Span::current().record("generation", metadata.generation_id());
    tracing::debug!(
        writes = *sent,
        offset,
        generation = metadata.generation_id(),
        "group commit sealed"
    );
    runner.commit(offset, metadata).await?;
    Ok(Ok(()))
}

/// How many queued writes a step takes into the transaction.
fn sent(step: &Step) -> usize {
    match step {
        Step::Send(writes) => writes.len(),
        Step::Settle | Step::Commit { .. } => 0,
    }
}

/// A failed abort leaves the producer in an unknown state: fatal, unless the abort was refused because a
/// newer producer epoch fenced this one (then the newer owner is the news).
fn escalate(partition: i32, abort: TxnFailure) -> SnapshotError {
    let kind = match abort.kind {
        FailureKind::ProducerFenced => FailureKind::ProducerFenced,
        _ => FailureKind::Fatal,
    };
    SnapshotError::Transaction {
        partition,
        failure: TxnFailure {
            kind,
            source: abort.source,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicI32, Ordering};
    use std::time::Duration;

    #[derive(Debug, Clone, PartialEq)]
    enum Call {
        Begin,
        Send(Bytes),
        Settle,
        Commit { offset: i64, generation: i32 },
        Abort,
    }

    /// A recording fake producer. It can hold a transaction at its sends or at its commit until the test
    /// releases it (so writes pile up behind it), fail commits with a scripted class, fail its abort, or
    /// panic at a step.
    #[derive(Clone, Default)]
    struct Recorder {
        calls: Arc<Mutex<Vec<Call>>>,
        hold_send: Option<Arc<Semaphore>>,
        hold_settle: Option<Arc<Semaphore>>,
        hold_commit: Option<Arc<Semaphore>>,
        /// Outcome of each commit in order; `None` or an exhausted script means success.
        script: Arc<Mutex<VecDeque<Option<FailureKind>>>>,
        abort_fails: bool,
        panic_at: Option<&'static str>,
    }

    /// One transaction as the recorder saw it.
    #[derive(Debug, Clone, PartialEq)]
    struct Seen {
        writes: Vec<Bytes>,
        commit: Option<(i64, i32)>,
        aborted: bool,
    }

    impl Recorder {
        fn record(&self, call: Call) {
            self.calls.lock().unwrap().push(call);
        }

        fn txns(&self) -> Vec<Seen> {
            let mut out: Vec<Seen> = Vec::new();
            for c in self.calls.lock().unwrap().iter() {
                match c {
                    Call::Begin => out.push(Seen {
                        writes: Vec::new(),
                        commit: None,
                        aborted: false,
                    }),
                    Call::Send(k) => out.last_mut().unwrap().writes.push(k.clone()),
                    Call::Commit { offset, generation } => {
                        out.last_mut().unwrap().commit = Some((*offset, *generation))
                    }
                    Call::Abort => out.last_mut().unwrap().aborted = true,
                    Call::Settle => {}
                }
            }
            out
        }

        /// (writes, committed offset) of each transaction.
        fn shape(&self) -> Vec<(usize, Option<i64>)> {
            self.txns()
                .iter()
                .map(|t| (t.writes.len(), t.commit.map(|c| c.0)))
                .collect()
        }
    }

    impl TransactionRunner for Recorder {
        fn begin(&mut self) -> Result<(), TxnFailure> {
            self.record(Call::Begin);
            Ok(())
        }

        async fn send(&mut self, entry: Entry) -> Result<(), TxnFailure> {
            // Recorded on entry, so a send held in flight is already visible to the test.
            self.record(Call::Send(entry.write.key));
            if self.panic_at == Some("send") {
                panic!("scripted panic in send");
            }
            if let Some(hold) = &self.hold_send {
                hold.acquire().await.unwrap().forget();
            }
            Ok(())
        }

        async fn settle(&mut self) -> Result<(), TxnFailure> {
            self.record(Call::Settle);
            if let Some(hold) = &self.hold_settle {
                hold.acquire().await.unwrap().forget();
            }
            Ok(())
        }

        async fn commit(&mut self, offset: i64, metadata: GroupMetadata) -> Result<(), TxnFailure> {
            self.record(Call::Commit {
                offset,
                generation: metadata.generation_id(),
            });
            if let Some(hold) = &self.hold_commit {
                hold.acquire().await.unwrap().forget();
            }
            if self.panic_at == Some("commit") {
                panic!("scripted panic in commit");
            }
            match self.script.lock().unwrap().pop_front().flatten() {
                Some(kind) => Err(TxnFailure::scripted(kind)),
                None => Ok(()),
            }
        }

        async fn abort(&mut self) -> Result<(), TxnFailure> {
            self.record(Call::Abort);
            if self.abort_fails {
                return Err(TxnFailure::scripted(FailureKind::Aborted));
            }
            Ok(())
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

    fn gen1() -> Arc<dyn MetadataSource> {
        live(Arc::new(AtomicI32::new(1)))
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

    fn queued<R>(gc: &GroupCommit<R>) -> (usize, usize) {
        let s = gc.inner.lock();
        (s.queue.queued_writes(), s.queue.queued_offsets())
    }

    fn spawn_writes(
        gc: &GroupCommit<Recorder>,
        range: std::ops::Range<usize>,
    ) -> Vec<tokio::task::JoinHandle<Result<(), SnapshotError>>> {
        range
            .map(|i| {
                let gc = gc.clone();
                tokio::spawn(async move { gc.write(key(i), None).await })
            })
            .collect()
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
        assert_eq!(
            rec.txns(),
            vec![Seen {
                writes: vec![key(1)],
                commit: Some((42, 7)),
                aborted: false
            }]
        );
        assert_eq!(gc.transactions(), 1);
    }

    /// A burst joins the transaction its first write began: writes queued while it is still producing
    /// are sent in it, up to the cap, so the burst runs ceil(n / cap) transactions and not one more.
    #[tokio::test]
    async fn a_burst_joins_the_transaction_its_first_write_began() {
        for (cap, n) in [(1usize, 40usize), (16, 500), (256, 2000), (2000, 2000)] {
            let hold = Arc::new(Semaphore::new(0));
            let rec = Recorder {
                hold_send: Some(hold.clone()),
                ..Default::default()
            };
            let gc = GroupCommit::new(0, rec.clone(), gen1(), 0, cap, 10_000).unwrap();
            // The first write begins a transaction and is held in its send; the rest queue meanwhile.
            let first = spawn_writes(&gc, 0..1);
            until(|| rec.calls.lock().unwrap().len() == 2).await;
            let rest = spawn_writes(&gc, 1..n);
            until(|| queued(&gc).0 == n - 1).await;
            hold.add_permits(n);
            for t in first.into_iter().chain(rest) {
                t.await.unwrap().unwrap();
            }
            let txns = rec.txns();
            assert_eq!(txns.len(), n.div_ceil(cap), "cap {cap}");
            assert_eq!(gc.transactions(), n.div_ceil(cap) as u64);
            assert!(txns
                .iter()
                .all(|t| !t.writes.is_empty() && t.writes.len() <= cap));
            let mut keys: Vec<Bytes> = txns.iter().flat_map(|t| t.writes.clone()).collect();
            keys.sort();
            let mut want: Vec<Bytes> = (0..n).map(key).collect();
            want.sort();
            assert_eq!(keys, want, "every write is sent exactly once; cap {cap}");
        }
    }

    /// Writes that arrive while a burst's transaction waits for its acknowledgements (settles) still join
    /// it: the burst is one transaction, sealed only once a settle finds nothing new.
    #[tokio::test]
    async fn writes_arriving_while_a_burst_settles_join_it() {
        let send = Arc::new(Semaphore::new(0));
        let settle = Arc::new(Semaphore::new(0));
        let rec = Recorder {
            hold_send: Some(send.clone()),
            hold_settle: Some(settle.clone()),
            ..Default::default()
        };
        let gc = GroupCommit::new(0, rec.clone(), gen1(), 0, 256, 64).unwrap();
        let calls = |rec: &Recorder| rec.calls.lock().unwrap().clone();
        let mut tasks = spawn_writes(&gc, 0..1);
        until(|| calls(&rec).len() == 2).await;
        tasks.extend(spawn_writes(&gc, 1..2));
        until(|| queued(&gc).0 == 1).await;
        send.add_permits(100);
        until(|| calls(&rec).last() == Some(&Call::Settle)).await;
        tasks.extend(spawn_writes(&gc, 2..6));
        until(|| queued(&gc).0 == 4).await;
        settle.add_permits(100);
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        let want: Vec<Call> = [
            Call::Begin,
            Call::Send(key(0)),
            Call::Send(key(1)),
            Call::Settle,
        ]
        .into_iter()
        .chain((2..6).map(|i| Call::Send(key(i))))
        .chain([
            Call::Settle,
            Call::Commit {
                offset: 0,
                generation: 1,
            },
        ])
        .collect();
        assert_eq!(calls(&rec), want);
    }

    /// With nothing queued, an offset commit is an offset-only transaction; the next write re-commits it.
    #[tokio::test]
    async fn offset_only_transaction_then_write_recommits() {
        let rec = Recorder::default();
        let gc = GroupCommit::new(0, rec.clone(), gen1(), 10, 256, 64).unwrap();
        gc.commit_offset(25).await.unwrap();
        assert_eq!(gc.committed_offset(), 25);
        gc.write(key(0), None).await.unwrap();
        assert_eq!(
            rec.shape(),
            vec![(0, Some(25)), (1, Some(25))],
            "a write re-commits the current offset, it never advances it"
        );
    }

    /// An offset commit rides along free of the cap (a transaction of exactly `cap` writes carries it),
    /// and never rides ahead of a write queued before it.
    #[tokio::test]
    async fn offset_rides_along_but_never_ahead_of_earlier_writes() {
        let hold = Arc::new(Semaphore::new(0));
        let rec = Recorder {
            hold_commit: Some(hold.clone()),
            ..Default::default()
        };
        let gc = GroupCommit::new(0, rec.clone(), gen1(), 0, 2, 64).unwrap();
        // w0 begins a transaction and seals it at once (nothing else queued); the fake holds its commit,
        // and w1..w3 and then the offset queue behind it.
        let mut tasks = spawn_writes(&gc, 0..1);
        until(|| rec.shape() == vec![(1, Some(0))]).await;
        for i in 1..4 {
            tasks.extend(spawn_writes(&gc, i..i + 1));
            until(|| queued(&gc).0 == i).await;
        }
        let off = {
            let gc = gc.clone();
            tokio::spawn(async move { gc.commit_offset(99).await })
        };
        until(|| queued(&gc).1 == 1).await;
        hold.add_permits(10);
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        off.await.unwrap().unwrap();
        // [w0], then [w1, w2] (w3 left behind, so the offset may not ride), then [w3] + 99.
        assert_eq!(rec.shape(), vec![(1, Some(0)), (2, Some(0)), (1, Some(99))]);
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
        let gens: Vec<i32> = rec.txns().iter().map(|t| t.commit.unwrap().1).collect();
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
        assert!(rec.calls.lock().unwrap().is_empty());
        let err = gc.commit_offset(5).await.unwrap_err();
        assert!(matches!(err, SnapshotError::MissingGroupMetadata { .. }));
        assert_eq!(gc.committed_offset(), 0, "a refused commit moves nothing");
    }

    /// Group metadata that vanishes while the transaction is producing (the consumer left) aborts it at
    /// the seal: the writes were sent but nothing is committed without a generation.
    #[tokio::test]
    async fn metadata_gone_at_the_seal_aborts() {
        let hold = Arc::new(Semaphore::new(0));
        let rec = Recorder {
            hold_send: Some(hold.clone()),
            ..Default::default()
        };
        let generation = Arc::new(AtomicI32::new(3));
        let gc = GroupCommit::new(0, rec.clone(), live(generation.clone()), 0, 256, 64).unwrap();
        let w = spawn_writes(&gc, 0..1);
        until(|| rec.calls.lock().unwrap().len() == 2).await;
        generation.store(-1, Ordering::SeqCst);
        hold.add_permits(1);
        let err = w.into_iter().next().unwrap().await.unwrap().unwrap_err();
        assert!(
            matches!(err, SnapshotError::MissingGroupMetadata { .. }),
            "{err}"
        );
        assert_eq!(
            *rec.calls.lock().unwrap(),
            vec![Call::Begin, Call::Send(key(0)), Call::Abort]
        );
    }

    /// A fenced or aborted transaction is aborted and fails only its own waiters, leaving the queue usable;
    /// a fatal one closes the queue, so later writes are refused with the same cause instead of reaching a
    /// dead producer.
    #[tokio::test]
    async fn fenced_leaves_queue_usable_fatal_closes_it() {
        let rec = Recorder::default();
        rec.script.lock().unwrap().extend([
            Some(FailureKind::Fenced),
            None,
            Some(FailureKind::Fatal),
        ]);
        let gc = GroupCommit::new(0, rec.clone(), gen1(), 0, 256, 64).unwrap();
        let e = gc.write(key(0), None).await.unwrap_err();
        assert!(e.is_fenced(), "{e}");
        assert_eq!(
            gc.committed_offset(),
            0,
            "a fenced transaction commits no offset"
        );
        gc.write(key(1), None).await.unwrap();
        let e = gc.write(key(2), None).await.unwrap_err();
        let fatal = |e: &SnapshotError| matches!(e, SnapshotError::Transaction { failure, .. } if failure.kind == FailureKind::Fatal);
        assert!(fatal(&e), "{e}");
        let again = gc.write(key(3), None).await.unwrap_err();
        assert!(fatal(&again), "{again}");
        let txns = rec.txns();
        assert_eq!(txns.len(), 3, "nothing is sent after the fatal failure");
        let aborted: Vec<bool> = txns.iter().map(|t| t.aborted).collect();
        assert_eq!(
            aborted,
            vec![true, false, false],
            "only the fenced one is aborted"
        );
    }

    /// An abort that fails leaves the producer's state unknown: the failure becomes fatal and the queue
    /// closes.
    #[tokio::test]
    async fn a_failed_abort_closes_the_queue() {
        let rec = Recorder {
            abort_fails: true,
            ..Default::default()
        };
        rec.script
            .lock()
            .unwrap()
            .push_back(Some(FailureKind::Aborted));
        let gc = GroupCommit::new(0, rec.clone(), gen1(), 0, 256, 64).unwrap();
        let e = gc.write(key(0), None).await.unwrap_err();
        assert!(
            matches!(&e, SnapshotError::Transaction { failure, .. } if failure.kind == FailureKind::Fatal),
            "{e}"
        );
        assert!(gc.write(key(1), None).await.is_err());
        assert_eq!(rec.txns().len(), 1);
    }

    /// Every write that rode in a failed transaction gets the failure; writes in other transactions do not.
    #[tokio::test]
    async fn a_failed_batch_fails_all_its_writes() {
        let hold = Arc::new(Semaphore::new(0));
        let rec = Recorder {
            hold_commit: Some(hold.clone()),
            ..Default::default()
        };
        // The first transaction (w0 alone, sealed at once) commits; the second (w1..w3, queued behind it)
        // aborts.
        rec.script
            .lock()
            .unwrap()
            .extend([None, Some(FailureKind::Aborted)]);
        let gc = GroupCommit::new(0, rec.clone(), gen1(), 0, 256, 64).unwrap();
        let mut tasks = spawn_writes(&gc, 0..1);
        until(|| rec.shape() == vec![(1, Some(0))]).await;
        tasks.extend(spawn_writes(&gc, 1..4));
        until(|| queued(&gc).0 == 3).await;
        hold.add_permits(10);
        let mut outcomes = Vec::new();
        for t in tasks {
            outcomes.push(t.await.unwrap().map_err(|e| match e {
                SnapshotError::Transaction { failure, .. } => failure.kind,
                other => panic!("unexpected {other}"),
            }));
        }
        assert_eq!(rec.shape(), vec![(1, Some(0)), (3, Some(0))]);
        let aborted = Err(FailureKind::Aborted);
        assert_eq!(outcomes, vec![Ok(()), aborted, aborted, aborted]);
    }

    /// A drain that panics reaches its waiters as a typed error with the panic message, the transaction
    /// in flight and the writes queued behind it alike, and no later write or offset commit waits for it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panicking_runner_fails_every_waiter_and_nothing_waits_forever() {
        for at in ["send", "commit"] {
            let hold = Arc::new(Semaphore::new(0));
            let rec = Recorder {
                hold_commit: Some(hold.clone()),
                panic_at: Some(at),
                ..Default::default()
            };
            let gc = GroupCommit::new(2, rec.clone(), gen1(), 0, 256, 64).unwrap();
            let mut tasks = spawn_writes(&gc, 0..1);
            if at == "commit" {
                // The first transaction is held at its commit while more writes queue behind it.
                until(|| rec.shape() == vec![(1, Some(0))]).await;
                tasks.extend(spawn_writes(&gc, 1..4));
                until(|| queued(&gc).0 == 3).await;
            }
            hold.add_permits(10);
            let within = Duration::from_secs(10);
            for t in tasks {
                let e = tokio::time::timeout(within, t)
                    .await
                    .unwrap()
                    .unwrap()
                    .unwrap_err();
                match e {
                    SnapshotError::DrainDied { partition, message } => {
                        assert_eq!(partition, 2);
                        assert!(
                            message.contains(&format!("scripted panic in {at}")),
                            "{message}"
                        );
                    }
                    other => panic!("{at}: unexpected {other}"),
                }
            }
            let later = tokio::time::timeout(within, gc.write(key(9), None))
                .await
                .unwrap();
            assert!(
                matches!(later, Err(SnapshotError::DrainDied { .. })),
                "{later:?}"
            );
            let off = tokio::time::timeout(within, gc.commit_offset(5))
                .await
                .unwrap();
            assert!(
                matches!(off, Err(SnapshotError::DrainDied { .. })),
                "{off:?}"
            );
            assert!(matches!(
                gc.try_write(key(10), None),
                Err(TryWriteError::Failed(SnapshotError::DrainDied { .. }))
            ));
            tokio::time::timeout(within, gc.close()).await.unwrap();
        }
    }

    /// Closing fails the writes still queued and waits for the transaction in flight, which completes.
    #[tokio::test]
    async fn close_fails_the_queued_and_waits_for_the_one_in_flight() {
        let hold = Arc::new(Semaphore::new(0));
        let rec = Recorder {
            hold_commit: Some(hold.clone()),
            ..Default::default()
        };
        let gc = GroupCommit::new(4, rec.clone(), gen1(), 0, 256, 64).unwrap();
        let first = spawn_writes(&gc, 0..1);
        until(|| rec.shape() == vec![(1, Some(0))]).await;
        let second = spawn_writes(&gc, 1..2);
        until(|| queued(&gc).0 == 1).await;
        let closing = {
            let gc = gc.clone();
            tokio::spawn(async move { gc.close().await })
        };
        let e = second
            .into_iter()
            .next()
            .unwrap()
            .await
            .unwrap()
            .unwrap_err();
        assert!(matches!(e, SnapshotError::Closed { partition: 4 }), "{e}");
        assert!(!closing.is_finished());
        hold.add_permits(1);
        closing.await.unwrap();
        first.into_iter().next().unwrap().await.unwrap().unwrap();
        assert!(matches!(
            gc.write(key(5), None).await,
            Err(SnapshotError::Closed { .. })
        ));
    }

    /// A cap below 1 or a negative assigned offset is refused up front, never discovered by a transaction.
    #[tokio::test]
    async fn configuration_is_checked() {
        let m = gen1();
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
            hold_commit: Some(hold.clone()),
            ..Default::default()
        };
        let gc = GroupCommit::new(0, rec.clone(), gen1(), 0, 256, 2).unwrap();
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

    mod telemetry {
        use super::*;
        use crate::telemetry::capture::capture;
        use crate::telemetry::recording::Recording;
        use crate::telemetry::{
            GROUP_COMMIT_QUEUED, GROUP_COMMIT_WAIT, TRANSACTIONS_ABORTED, TRANSACTIONS_COMMITTED,
            TRANSACTION_DURATION, TRANSACTION_FENCES, TRANSACTION_WRITES,
        };

        /// Every way a transaction ends lands in its own series: a commit in the commits, each failure
        /// in the aborts under its class and, for a fence, in the fences under its kind, as read off
        /// [`FailureKind`] (the one classification), on the partition's labels.
        #[test]
        fn each_outcome_moves_its_counter() {
            let m = Recording::default();
            m.run(async {
                let rec = Recorder::default();
                rec.script.lock().unwrap().extend([
                    Some(FailureKind::Fenced),
                    None,
                    Some(FailureKind::Evicted),
                    Some(FailureKind::InstanceFenced),
                    Some(FailureKind::Aborted),
                    Some(FailureKind::ProducerFenced),
                ]);
                let gc = GroupCommit::new(5, rec.clone(), gen1(), 0, 256, 64).unwrap();
                for i in 0..6 {
                    let _ = gc.write(key(i), None).await;
                }
                // Outcome unknown and fatal close their stores too: one store each.
                for (p, kind) in [(6, FailureKind::OutcomeUnknown), (7, FailureKind::Fatal)] {
                    let rec = Recorder::default();
                    rec.script.lock().unwrap().push_back(Some(kind));
                    let gc = GroupCommit::new(p, rec, gen1(), 0, 256, 64).unwrap();
                    gc.write(key(0), None).await.unwrap_err();
                }
            });
            let p = |p| [("partition", p)];
            let class = |p, c| [("partition", p), ("class", c)];
            let fence = |p, k| [("partition", p), ("kind", k)];
            assert_eq!(m.counter(TRANSACTIONS_COMMITTED.name, &p("5")), 1);
            assert_eq!(
                m.counter(TRANSACTIONS_ABORTED.name, &class("5", "abortable")),
                4
            );
            assert_eq!(
                m.counter(TRANSACTIONS_ABORTED.name, &class("5", "fatal")),
                1
            );
            assert_eq!(
                m.counter(TRANSACTIONS_ABORTED.name, &class("6", "outcome_unknown")),
                1
            );
            assert_eq!(
                m.counter(TRANSACTIONS_ABORTED.name, &class("7", "fatal")),
                1
            );
            assert_eq!(
                m.counter(TRANSACTION_FENCES.name, &fence("5", "generation")),
                1
            );
            assert_eq!(m.counter(TRANSACTION_FENCES.name, &fence("5", "member")), 2);
            assert_eq!(
                m.counter(TRANSACTION_FENCES.name, &fence("5", "producer_epoch")),
                1
            );
            for p in ["6", "7"] {
                for k in ["generation", "member", "producer_epoch"] {
                    assert_eq!(
                        m.counter(TRANSACTION_FENCES.name, &fence(p, k)),
                        0,
                        "{p} {k}"
                    );
                }
            }
            assert_eq!(m.samples(TRANSACTION_DURATION.name, &p("5")).len(), 6);
            assert_eq!(m.samples(TRANSACTION_WRITES.name, &p("5")), vec![1.0; 6]);
        }

        /// An offset-only transaction is a transaction of no writes; a transaction refused before it
        /// began (no group metadata yet) is none at all.
        #[test]
        fn writes_per_transaction_and_unbegun_ones() {
            let m = Recording::default();
            m.run(async {
                let generation = Arc::new(AtomicI32::new(1));
                let gc =
                    GroupCommit::new(0, Recorder::default(), live(generation.clone()), 0, 2, 64)
                        .unwrap();
                gc.commit_offset(3).await.unwrap();
                let writes: Vec<_> = (0..5)
                    .map(|i| gc.try_write(key(i), None).ok().unwrap())
                    .collect();
                for w in writes {
                    w.await.unwrap();
                }
                generation.store(-1, Ordering::SeqCst);
                gc.write(key(9), None).await.unwrap_err();
            });
            let p = [("partition", "0")];
            let mut writes = m.samples(TRANSACTION_WRITES.name, &p);
            writes.sort_by(f64::total_cmp);
            assert_eq!(writes, vec![0.0, 1.0, 2.0, 2.0], "cap 2: 5 writes in three");
            assert_eq!(m.counter(TRANSACTIONS_COMMITTED.name, &p), 4);
            for c in ["abortable", "fatal", "outcome_unknown"] {
                let labels = [("partition", "0"), ("class", c)];
                assert_eq!(m.counter(TRANSACTIONS_ABORTED.name, &labels), 0, "{c}");
            }
        }

        /// The queue's depth follows writes in and out, and the time each write waited behind a
        /// transaction in flight is what the clock says it waited.
        #[test]
        fn queue_depth_and_wait() {
            let m = Recording::default();
            m.run(async {
                tokio::time::pause();
                let hold = Arc::new(Semaphore::new(0));
                let rec = Recorder {
                    hold_commit: Some(hold.clone()),
                    ..Default::default()
                };
                let gc = GroupCommit::new(1, rec.clone(), gen1(), 0, 256, 64).unwrap();
                let first = spawn_writes(&gc, 0..1);
                until(|| {
                    rec.calls.lock().unwrap().contains(&Call::Commit {
                        offset: 0,
                        generation: 1,
                    })
                })
                .await;
                let depth = || m.gauge_at(GROUP_COMMIT_QUEUED.name, &[("partition", "1")]);
                assert_eq!(depth(), 0.0, "the first write is in the transaction");
                let rest = spawn_writes(&gc, 1..4);
                until(|| queued(&gc).0 == 3).await;
                assert_eq!(depth(), 3.0);
                tokio::time::advance(Duration::from_secs(2)).await;
                hold.add_permits(2);
                for t in first.into_iter().chain(rest) {
                    t.await.unwrap().unwrap();
                }
                assert_eq!(depth(), 0.0);
            });
            let waits = m.samples(GROUP_COMMIT_WAIT.name, &[("partition", "1")]);
            assert_eq!(waits.len(), 4);
            assert!(
                waits[0] < 0.5,
                "the first write began its own transaction: {waits:?}"
            );
            assert!(
                waits[1..].iter().all(|&w| (2.0..2.5).contains(&w)),
                "three writes waited out the 2 s commit: {waits:?}"
            );
        }

        /// One span per transaction carries the partition and the generation its fence carries, and the
        /// events of the transaction happen inside it.
        #[test]
        fn a_transaction_runs_in_its_span() {
            let ((), lines) = capture(|| {
                Recording::default().run(async {
                    let gc = GroupCommit::new(
                        4,
                        Recorder::default(),
                        live(Arc::new(AtomicI32::new(9))),
                        0,
                        256,
                        8,
                    )
                    .unwrap();
                    gc.write(key(0), None).await.unwrap();
                })
            });
            let sealed = lines.containing("group commit sealed");
            assert_eq!(sealed.len(), 1);
            let span = sealed[0]
                .span("snapshot_transaction")
                .expect("the seal happens in the transaction's span");
            assert_eq!(span.get("partition").map(String::as_str), Some("4"));
            assert_eq!(span.get("generation").map(String::as_str), Some("9"));
        }
    }
}
