//! The per-key fold runtime: a group consumer over an input topic, per-key state folded from its events,
//! persisted as snapshots through the fenced store, and offsets committed only as far as the snapshots go.
//!
//! Each key's state is snapshotted with the offset of the last event folded into it (an envelope around the
//! user's encoding). Recovery restores that offset per key, and replay skips events a key has already
//! folded, so replaying from the committable offset never folds an event twice. The committable offset of
//! a partition is the minimum, over its keys, of the first event folded since the key's last persisted
//! snapshot (or the position when every key is persisted): it never passes an event whose effect exists only
//! in memory.
//!
//! Output the application produces from its fold is outside the transaction and stays at-least-once.
//!
//! # References
//! - KIP-447 (the fence), seed design "Kafka single-writer design"

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::task::JoinSet;

use super::error::{FailureKind, Response, SnapshotError};
use super::fence_core::{FenceCore, FencePolicy, FlowStats, Site, Verdict};
#[cfg(test)]
use super::fold_core::{envelope, open_envelope, Opened};
#[cfg(not(test))]
use super::fold_core::{open_envelope, Opened};
use super::fold_core::{Folded, Landing, PartitionCore};
use super::group_commit::{GroupCommit, MetadataSource, TransactionRunner, TryWriteError};
use super::recovery::{recover, RecoveryConfig};
use super::shared_log::SharedLogs;
use super::state::RecoveredState;
use super::store::{SnapshotConfig, SnapshotStore};
use super::topic::{self, MissingSnapshotTopic, SnapshotTopicError};
use crate::consumer::{
    commit_offsets, committed_offsets, list_offsets, ConsumerError, GroupConsumer,
    GroupConsumerConfig, GroupMetadataHandle, LostReason, OffsetReset, OffsetSpec,
    PartitionRecords, ReaderConfig, RebalanceListener, StartAt, TopicPartition,
};
use crate::net::Client;
use crate::producer::{Producer, ProducerConfig, ProducerError, ProducerRecord};
use crate::records::{IsolationLevel, Record};

/// A boxed error from user code (decoding a snapshot).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a fold did to a key's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Nothing changed: the runtime writes nothing and holds no offset for it. A fold that mutated the
    /// state anyway may lose that mutation at the next restart.
    Keep,
    /// The state changed and is persisted with the next snapshot wave. An `Update` that leaves the state
    /// `None` is a delete.
    Update,
    /// The key goes away: the runtime clears the state and writes a tombstone, fenced like a snapshot
    /// (see docs/fencing.md, "Deletes", for why a short-lived grave precedes it).
    Delete,
}

/// The application's fold: per-key state changed in place by events and timers, and the state's
/// snapshot encoding.
///
/// The flow calls [`fold`](Fold::fold) once per input event, in offset order within a partition, with
/// the key's current state (`None` before its first event or after a delete), which the fold changes in
/// place: no state is copied per event. It persists [`encode`](Fold::encode)d states as snapshots
/// (inside an envelope that also records the key's last folded offset) and [`decode`](Fold::decode)s
/// them when a partition is recovered; a snapshot that does not decode stops the flow with
/// [`FlowError::BadSnapshot`], so keep `decode` able to read every encoding you ever wrote.
///
/// **Timers.** A key's [`deadline`](Fold::deadline) is derived from its state, so it is persisted with
/// the state and a new owner recovers the schedule with it. When the flow's clock
/// ([`FlowConfig::clock`]) reaches it, [`on_deadline`](Fold::on_deadline) runs and may update or delete
/// the key; that change is persisted and fenced like an event's. Both default to "no timer".
///
/// Events with a null key are not folded: state is per key, and a null key names none. They are skipped
/// (their offsets still advance the partition, so they are not re-read) and counted in
/// [`Flow::null_key_events`]; the first one is logged at warn level.
///
/// `fold` must be deterministic: an event may be folded again after a crash (into the state recovered
/// from before it), and must produce the same state. A timer may fire again after a crash too.
///
/// ```
/// use snapfence::records::Record;
/// use snapfence::snapshot::{BoxError, Change, Fold};
/// use snapfence::Bytes;
///
/// /// Account balances: each event's value is a signed amount in ASCII ("+25", "-10"); an account
/// /// that reaches zero is closed (deleted).
/// struct Balances;
///
/// impl Fold for Balances {
///     type State = i64;
///
///     fn fold(&self, _account: &Bytes, balance: &mut Option<i64>, event: &Record) -> Change {
///         let amount = event
///             .value
///             .as_ref()
///             .and_then(|v| std::str::from_utf8(v).ok())
///             .and_then(|v| v.parse::<i64>().ok());
///         let Some(amount) = amount else { return Change::Keep }; // malformed: nothing changes
///         let balance = balance.get_or_insert(0);
///         *balance += amount;
///         if *balance == 0 { Change::Delete } else { Change::Update }
///     }
///
///     fn encode(&self, balance: &i64) -> Bytes {
///         Bytes::copy_from_slice(&balance.to_be_bytes())
///     }
///
///     fn decode(&self, bytes: &[u8]) -> Result<i64, BoxError> {
///         Ok(i64::from_be_bytes(bytes.try_into()?))
///     }
/// }
/// # let _ = Balances;
/// ```
pub trait Fold: Send + Sync + 'static {
    /// The per-key state.
    type State: Clone + Send + Sync + 'static;
    /// Folds one input event into the key's state, in place (`None` before the key's first event and
    /// after a delete), and says what changed.
    fn fold(&self, key: &Bytes, state: &mut Option<Self::State>, event: &Record) -> Change;
    /// Encodes a state as snapshot bytes.
    fn encode(&self, state: &Self::State) -> Bytes;
    /// Decodes snapshot bytes written by [`Fold::encode`].
    fn decode(&self, bytes: &[u8]) -> Result<Self::State, BoxError>;
    /// When the key's timer fires, in milliseconds since the Unix epoch on [`FlowConfig::clock`], or
    /// `None` for no timer. Asked after every change and at recovery; derive it from the state only.
    fn deadline(&self, _key: &Bytes, _state: &Self::State) -> Option<i64> {
        None
    }
    /// The key's deadline passed (`now` is the clock's reading): change the state in place, delete it,
    /// or keep it (then the deadline is asked again; one still at or before `now` is dropped until
    /// the next change).
    fn on_deadline(&self, _key: &Bytes, _state: &mut Self::State, _now: i64) -> Change {
        Change::Keep
    }
}

/// The flow's source of time for timers: milliseconds since the Unix epoch. Inject your own to drive
/// timers in tests.
pub trait Clock: std::fmt::Debug + Send + Sync + 'static {
    /// The current time in milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    }
}

/// How snapshots are persisted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PersistenceMode {
    /// Fenced: every snapshot write rides in a transaction with a generation-checked offset commit.
    Transactional,
    /// Unfenced: one shared idempotent producer, offsets committed by the consumer. A stale owner's late
    /// write lands. It exists to show that, and for users who do not need the fence.
    NonTransactional,
}

/// Settings of a [`Flow`].
///
/// Where a partition starts: at the group's committed offset if it has one; otherwise at
/// [`initial_offset`](Self::initial_offset) (earliest by default), which the flow then commits for the
/// group before folding anything, so the consumer and the flow start from the same, recorded offset.
/// `consumer.reader.reset` is consulted only when a committed position is out of range (retention
/// deleted input the group had not folded yet); its default, `Fail`, stops the flow with an error there
/// rather than skip events silently.
///
/// ```
/// use std::time::Duration;
/// use snapfence::consumer::{GroupConfig, GroupConsumerConfig};
/// use snapfence::snapshot::{FlowConfig, MissingSnapshotTopic, SnapshotConfig};
///
/// let consumer = GroupConsumerConfig::new(GroupConfig::new("balances"));
/// let snapshots = SnapshotConfig::new("balances-snapshots", "balances");
/// let mut config = FlowConfig::new(consumer, "payments", snapshots);
/// // Create the compacted snapshot topic on first start instead of failing.
/// config.missing_snapshot_topic = MissingSnapshotTopic::Create { replication_factor: Some(3) };
/// config.persist_every = Duration::from_millis(500); // used by Flow::run
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct FlowConfig {
    /// The group consumer over the input topic. Auto-commit is forced off: offsets are committed by the
    /// flow, never ahead of the snapshots.
    pub consumer: GroupConsumerConfig,
    /// The input topic.
    pub input_topic: String,
    /// The snapshot store settings. [`Flow::start`] checks the snapshot topic: it must exist (see
    /// [`missing_snapshot_topic`](Self::missing_snapshot_topic)), be compacted, and have the input's
    /// partition count.
    pub snapshots: SnapshotConfig,
    /// Fenced or not.
    pub mode: PersistenceMode,
    /// Where a partition the group has never committed starts: `Earliest` (the default: every input
    /// event is folded), `Latest` (only events written after the partition is first assigned), or
    /// `Fail` (assignment fails with [`ConsumerError::NoCommittedOffset`]: an operator must commit a
    /// start first). See the type's docs for how this relates to `consumer.reader.reset`.
    pub initial_offset: OffsetReset,
    /// What [`Flow::start`] does when the snapshot topic does not exist. Default
    /// [`MissingSnapshotTopic::Fail`].
    pub missing_snapshot_topic: MissingSnapshotTopic,
    /// How often [`Flow::run`] persists the keys folded since their last snapshot. Default 1 s.
    ///
    /// Only `run` reads it: a caller driving the flow with [`Flow::poll_once`] persists by calling
    /// [`Flow::persist`] itself (until then, folded state lives only in memory and is re-folded from
    /// the committed offset after a crash).
    pub persist_every: Duration,
    /// How often [`Flow::run`] commits the committable offset (persisting first). Default 5 s.
    ///
    /// Only `run` reads it: with [`Flow::poll_once`], call [`Flow::commit`] yourself (the committed
    /// offset stays where it was until then, so a restart re-reads more input, but loses nothing).
    pub commit_offsets_interval: Duration,
    /// How often [`Flow::run`] fires due timers ([`Fold::deadline`]). Default 1 s. With
    /// [`Flow::poll_once`], call [`Flow::tick`] yourself.
    pub timer_every: Duration,
    /// The clock timers are read against. Default [`SystemClock`]; tests inject their own.
    pub clock: Arc<dyn Clock>,
    /// How many partitions [`Flow::persist`] and [`Flow::commit`] work on at once. Each partition
    /// writes and commits on its own (a slow or fenced partition does not hold the others); this bounds
    /// how many do so together. Default 8; 0 counts as 1.
    pub max_concurrent_partitions: usize,
    /// The recovery reader's fetch settings (sizes, waits, backoff). One reader serves the recovery
    /// reads of every partition the flow takes over ([`SharedLogs`](super::SharedLogs)), so
    /// `partition_max_bytes` bounds each partition's chunk and `max_bytes` each Fetch of all of them.
    /// Its isolation is always read_committed, whatever is set here. Default
    /// [`ReaderConfig::default`].
    pub recovery_reader: ReaderConfig,
    /// How long each recovery fetch lets the broker wait for data. Default 500 ms.
    pub recovery_fetch_wait: Duration,
    /// How often a stalled recovery read logs its progress. Default 5 s.
    pub recovery_progress_every: Duration,
    /// Give each partition's snapshot producer its own connections with the client id
    /// `<client_id>-p<partition>`, so broker-side logs and quotas tell the partitions apart. Default
    /// `false`: every partition's producer shares the flow's client, so a member holding 1 024
    /// partitions keeps one connection set (3 sockets on one node) instead of 1 024, and measured no
    /// slower (docs/benchmarks.md, "Scale"). The transactional mode only.
    pub partition_client_ids: bool,
    /// What a refused commit does: recover in place, rejoin, or go on, as the one table says
    /// ([`FencePolicy::Recover`], the default), or stop the flow with the error
    /// ([`FencePolicy::Stop`], kafka-flow's behaviour). See docs/fencing.md.
    pub fence_policy: FencePolicy,
    /// Keep the snapshots in PostgreSQL instead of the snapshot topic (the `postgres` feature).
    /// Fenced mode: each flush is a prepared Kafka transaction with the generation-fenced offset
    /// commit, then a PostgreSQL transaction checked against the partition's fencing row, then the
    /// Kafka commit (see [`postgres`](super::postgres)); `snapshots.transactional_id_prefix` names the
    /// producers and the flow's rows, and `snapshots.snapshot_topic` is not used (nor checked). Unfenced
    /// mode: plain upserts, offsets committed by the consumer. Default `None`.
    #[cfg(feature = "postgres")]
    pub postgres: Option<super::postgres::PgStoreConfig>,
}

impl FlowConfig {
    /// Defaults for a flow over `input_topic` in `consumer`'s group, persisting to `snapshots`.
    pub fn new(
        consumer: GroupConsumerConfig,
        input_topic: impl Into<String>,
        snapshots: SnapshotConfig,
    ) -> Self {
        FlowConfig {
            consumer,
            input_topic: input_topic.into(),
            snapshots,
            mode: PersistenceMode::Transactional,
            initial_offset: OffsetReset::Earliest,
            missing_snapshot_topic: MissingSnapshotTopic::Fail,
            persist_every: Duration::from_secs(1),
            commit_offsets_interval: Duration::from_secs(5),
            timer_every: Duration::from_secs(1),
            clock: Arc::new(SystemClock),
            max_concurrent_partitions: 8,
            recovery_reader: ReaderConfig::default(),
            recovery_fetch_wait: RecoveryConfig::default().fetch_wait,
            recovery_progress_every: RecoveryConfig::default().progress_every,
            partition_client_ids: false,
            fence_policy: FencePolicy::default(),
            #[cfg(feature = "postgres")]
            postgres: None,
        }
    }
}

/// Errors of the flow runtime.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FlowError {
    /// Persisting or committing failed; [`SnapshotError::is_fenced`] says this owner is stale.
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    /// The consumer failed.
    #[error(transparent)]
    Consumer(#[from] ConsumerError),
    /// The unfenced producer failed.
    #[error(transparent)]
    Producer(#[from] ProducerError),
    /// The snapshot topic is missing or set up so that state would be lost; the message says what to
    /// change. Returned by [`Flow::start`] before it joins the group.
    #[error(transparent)]
    SnapshotTopic(#[from] SnapshotTopicError),
    /// A snapshot could not be decoded.
    #[error("partition {partition}: snapshot of key {key:?} is not decodable: {reason}")]
    BadSnapshot {
        /// The partition.
        partition: i32,
        /// The key.
        key: Bytes,
        /// Why.
        reason: String,
    },
}

impl FlowError {
    /// The class of a failed commit (a snapshot transaction's, or the consumer's fenced offset commit),
    /// `None` for the other errors. Classified once, by [`FailureKind::of`] and
    /// [`FailureKind::of_group_fence`].
    pub fn failure_kind(&self) -> Option<FailureKind> {
        match self {
            FlowError::Snapshot(e) => e.failure_kind(),
            FlowError::Consumer(ConsumerError::CommitFenced { code, .. }) => {
                Some(FailureKind::of_group_fence(*code))
            }
            _ => None,
        }
    }

    /// What the runtime does about this error ([`FailureKind::response`]), `None` when it is not a
    /// failed commit.
    pub fn response(&self) -> Option<Response> {
        self.failure_kind().map(FailureKind::response)
    }

    /// `true` when the group coordinator fenced this owner's commit: nothing of it landed, and this
    /// owner is stale (see [`FlowError::response`] for whether it may recover in place).
    pub fn is_fenced(&self) -> bool {
        self.failure_kind().is_some_and(FailureKind::is_group_fence)
    }

    /// `true` when the partition's producer was fenced by a newer epoch on its transactional id (see
    /// [`SnapshotError::is_producer_fenced`]): this owner must stop writing the partition.
    pub fn is_producer_fenced(&self) -> bool {
        self.failure_kind() == Some(FailureKind::ProducerFenced)
    }
}

/// Where one partition's snapshot writes and offset commits go: what the driver needs of a store.
///
/// Implemented by the fenced [`SnapshotStore`], the unfenced producer, and (for tests and the benchmark)
/// a bare [`GroupCommit`] over any runner.
pub(crate) trait Writes: Send + Sync + 'static {
    /// Writes every `(key, value)` (a `None` value is a tombstone) and waits until all have committed
    /// or one failed.
    fn write_all(
        &self,
        writes: Vec<(Bytes, Option<Bytes>)>,
    ) -> impl Future<Output = Result<(), FlowError>> + Send;
    /// Commits `offset` as the input partition's committed offset.
    fn commit_offset(&self, offset: i64) -> impl Future<Output = Result<(), FlowError>> + Send;
}

/// Queues every write through `try_write` (so the group commit sees the whole wave at once and batches
/// it, with no task per write), then waits for all outcomes. When the queue is full, waits for the
/// writes this wave already queued (which frees room) before queueing more.
async fn write_batched<Fut>(
    writes: Vec<(Bytes, Option<Bytes>)>,
    try_write: impl Fn(Bytes, Option<Bytes>) -> Result<Fut, TryWriteError>,
) -> Result<(), SnapshotError>
where
    Fut: Future<Output = Result<(), SnapshotError>>,
{
    let mut queued = Vec::with_capacity(writes.len());
    let mut first_err = None;
    for (key, value) in writes {
        let mut next = (key, value);
        loop {
            match try_write(next.0, next.1) {
                Ok(outcome) => {
                    queued.push(outcome);
                    break;
                }
                Err(TryWriteError::Full(back)) => {
                    if queued.is_empty() {
                        // Full with writes of others: give the drain a moment.
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    for outcome in queued.drain(..) {
                        if let Err(e) = outcome.await {
                            first_err.get_or_insert(e);
                        }
                    }
                    next = (back.key, back.value);
                }
                Err(TryWriteError::Failed(e)) => return Err(e),
            }
        }
    }
    for outcome in queued {
        if let Err(e) = outcome.await {
            first_err.get_or_insert(e);
        }
    }
    first_err.map_or(Ok(()), Err)
}

impl<R: TransactionRunner> Writes for GroupCommit<R> {
    async fn write_all(&self, writes: Vec<(Bytes, Option<Bytes>)>) -> Result<(), FlowError> {
        Ok(write_batched(writes, |k, v| self.try_write(k, v)).await?)
    }

    async fn commit_offset(&self, offset: i64) -> Result<(), FlowError> {
        Ok(GroupCommit::commit_offset(self, offset).await?)
    }
}

/// The unfenced mode's writer: the shared idempotent producer, offsets committed by the consumer API.
struct PlainWriter {
    producer: Arc<Producer>,
    offsets: PlainOffsets,
    snapshot_topic: Arc<str>,
}

/// Where the unfenced mode commits offsets: the consumer's OffsetCommit, checked only against the
/// group's current generation at the time (no transaction binds it to the writes).
struct PlainOffsets {
    client: Client,
    input: TopicPartition,
    metadata: Option<GroupMetadataHandle>,
}

impl PlainOffsets {
    async fn commit(&self, offset: i64) -> Result<(), FlowError> {
        let token = self
            .metadata
            .as_ref()
            .ok_or(SnapshotError::MissingGroupMetadata {
                partition: self.input.partition,
            })?
            .require()?;
        commit_offsets(
            &self.client,
            &token,
            &BTreeMap::from([(self.input.clone(), offset)]),
        )
        .await?;
        Ok(())
    }
}

enum Writer {
    Fenced(SnapshotStore),
    Plain(PlainWriter),
    /// The PostgreSQL store, fenced.
    #[cfg(feature = "postgres")]
    Pg(super::postgres::PgSnapshotStore),
    /// Rows to PostgreSQL, unfenced.
    #[cfg(feature = "postgres")]
    PgPlain(super::postgres::PgPlainWriter, PlainOffsets),
}

impl Writer {
    /// Closes the store behind the writer (the fenced ones hold a producer and a connection).
    async fn close(self) {
        match self {
            Writer::Fenced(store) => store.close().await,
            #[cfg(feature = "postgres")]
            Writer::Pg(store) => store.close().await,
            _ => {}
        }
    }

    /// Whether the group's committed offset must be moved up to where the store stands before input is
    /// read (a PostgreSQL flush whose Kafka side was aborted after its rows committed).
    fn group_offset_behind(&self) -> bool {
        match self {
            #[cfg(feature = "postgres")]
            Writer::Pg(store) => store.kafka_behind(),
            _ => false,
        }
    }
}

impl Writes for Writer {
    async fn write_all(&self, writes: Vec<(Bytes, Option<Bytes>)>) -> Result<(), FlowError> {
        match self {
            Writer::Fenced(store) => Ok(write_batched(writes, |k, v| store.try_write(k, v)).await?),
            Writer::Plain(plain) => {
                let mut deliveries = Vec::with_capacity(writes.len());
                for (key, value) in writes {
                    let record = ProducerRecord::new(Arc::clone(&plain.snapshot_topic), value)
                        .key(key)
                        .partition(plain.offsets.input.partition);
                    deliveries.push(plain.producer.send(record).await?);
                }
                for d in deliveries {
                    d.await?;
                }
                Ok(())
            }
            #[cfg(feature = "postgres")]
            Writer::Pg(store) => Ok(store.write_all(writes).await?),
            #[cfg(feature = "postgres")]
            Writer::PgPlain(rows, _) => Ok(rows.write_all(writes).await?),
        }
    }

    async fn commit_offset(&self, offset: i64) -> Result<(), FlowError> {
        match self {
            Writer::Fenced(store) => Ok(store.commit_offset(offset).await?),
            Writer::Plain(plain) => plain.offsets.commit(offset).await,
            #[cfg(feature = "postgres")]
            Writer::Pg(store) => Ok(store.commit_offset(offset).await?),
            #[cfg(feature = "postgres")]
            Writer::PgPlain(_, offsets) => offsets.commit(offset).await,
        }
    }
}

/// One held partition: its I/O-free core and its writer. The core's lock is never held across an await;
/// `turn` orders this partition's own waves and commits and is never taken for another partition.
struct Lane<S, W> {
    partition: i32,
    core: Mutex<PartitionCore<S>>,
    writer: W,
    turn: tokio::sync::Mutex<()>,
}

impl<S, W> Lane<S, W> {
    fn new(partition: i32, core: PartitionCore<S>, writer: W) -> Self {
        Lane {
            partition,
            core: Mutex::new(core),
            writer,
            turn: tokio::sync::Mutex::new(()),
        }
    }

    fn core(&self) -> std::sync::MutexGuard<'_, PartitionCore<S>> {
        // The core's invariants hold between its method calls, and no user code that could panic runs
        // half-way through one except fold/encode, after which the core is still consistent.
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Reports a wave that never finished (its future was dropped) as failed, so the partition does not
/// wait forever for an outcome: every key it carried stays held and is written again.
struct WaveGuard<'a, S, W> {
    lane: &'a Lane<S, W>,
    id: u64,
    done: bool,
}

impl<S, W> Drop for WaveGuard<'_, S, W> {
    fn drop(&mut self) {
        if !self.done {
            self.lane.core().wave_done(self.id, Landing::Failed);
        }
    }
}

fn landing(result: &Result<(), FlowError>) -> Landing {
    match result {
        Ok(()) => Landing::Landed,
        Err(e) if e.is_fenced() || e.is_producer_fenced() => Landing::Fenced,
        Err(_) => Landing::Failed,
    }
}

/// Writes one wave of `lane`: every key changed since its last write, and the tombstones now due.
async fn persist_lane<F: Fold, W: Writes>(
    fold: &F,
    lane: &Lane<F::State, W>,
) -> Result<(), FlowError> {
    let _turn = lane.turn.lock().await;
    let Some(wave) = lane.core().begin_wave(fold) else {
        return Ok(());
    };
    let mut guard = WaveGuard {
        lane,
        id: wave.id,
        done: false,
    };
    let result = lane.writer.write_all(wave.writes).await;
    guard.done = true;
    lane.core().wave_done(wave.id, landing(&result));
    result
}

/// Commits `lane`'s committable offset.
async fn commit_lane<S, W: Writes>(lane: &Lane<S, W>, when: CommitWhen) -> Result<(), FlowError> {
    let _turn = lane.turn.lock().await;
    let offset = {
        let core = lane.core();
        if core.is_fenced() {
            return Ok(());
        }
        match when {
            CommitWhen::Always => core.committable(),
            CommitWhen::Moved => match core.commit_due() {
                Some(offset) => offset,
                None => return Ok(()),
            },
        }
    };
    let result = lane.writer.commit_offset(offset).await;
    match landing(&result) {
        Landing::Landed => lane.core().commit_landed(offset),
        Landing::Fenced => lane.core().fence(),
        Landing::Failed => {}
    }
    result
}

/// Whether [`commit_lane`] commits an offset the group already has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CommitWhen {
    /// Only when the committable offset moved past the last landed commit: the periodic commit. An
    /// idle partition then runs no transaction at all (offset-only transactions on 3.7-3.9's preview
    /// group coordinator are also what sets off KAFKA-17877, docs/reliability.md).
    Moved,
    /// Always: the first commit of a fresh partition (recording its start for the group) and a
    /// handover's flush.
    Always,
}

/// A revocation's or close's flush: persist, commit, and once more if the commit made tombstones due,
/// so deletes are not left as graves for the next owner.
async fn flush_lane<F: Fold, W: Writes>(
    fold: &F,
    lane: &Lane<F::State, W>,
) -> Result<(), FlowError> {
    persist_lane(fold, lane).await?;
    let (fenced, offset) = {
        let core = lane.core();
        (core.is_fenced(), core.committable())
    };
    if !fenced {
        tracing::info!(partition = lane.partition, offset, "committing on revoke");
    }
    commit_lane(lane, CommitWhen::Always).await?;
    let due = lane.core().tombstones_due();
    if due {
        persist_lane(fold, lane).await?;
    }
    Ok(())
}

#[cfg(test)]
#[path = "flow_revoke_log_tests.rs"]
mod revoke_log_tests;

/// Runs `op` on every lane, at most `limit` at once, each on its own task (one per partition, never one
/// per key) so a slow partition holds up nobody but itself; waits for all, and returns every failure
/// with its partition (the fence handling decides per partition).
async fn each_lane<S, W, Fut>(
    lanes: Vec<Arc<Lane<S, W>>>,
    limit: usize,
    op: impl Fn(Arc<Lane<S, W>>) -> Fut,
) -> Vec<(i32, FlowError)>
where
    S: Send + 'static,
    W: Send + Sync + 'static,
    Fut: Future<Output = Result<(), FlowError>> + Send + 'static,
{
    let permits = Arc::new(tokio::sync::Semaphore::new(limit.max(1)));
    let mut set = JoinSet::new();
    let mut partitions = HashMap::with_capacity(lanes.len());
    for lane in lanes {
        let partition = lane.partition;
        let permits = Arc::clone(&permits);
        let work = op(lane);
        let handle = set.spawn(async move {
            let _permit = permits.acquire_owned().await;
            work.await
        });
        partitions.insert(handle.id(), partition);
    }
    let mut failures = Vec::new();
    while let Some(joined) = set.join_next_with_id().await {
        let (id, result) = match joined {
            Ok((id, result)) => (id, result),
            Err(e) => (
                e.id(),
                Err(SnapshotError::PartitionTask {
                    partition: partitions.get(&e.id()).copied().unwrap_or(-1),
                    source: Arc::new(e),
                }
                .into()),
            ),
        };
        if let Err(e) = result {
            failures.push((partitions.get(&id).copied().unwrap_or(-1), e));
        }
    }
    failures.sort_by_key(|(p, _)| *p);
    failures
}

type FlowLane<F> = Lane<<F as Fold>::State, Writer>;

struct Shared<F: Fold> {
    fold: Arc<F>,
    client: Client,
    config: FlowConfig,
    metadata: Mutex<Option<GroupMetadataHandle>>,
    plain: Option<Arc<Producer>>,
    /// The held partitions. A plain lock, taken only to look a lane up or insert or remove one.
    lanes: Mutex<BTreeMap<i32, Arc<FlowLane<F>>>>,
    /// The first error a rebalance handler hit; the poll loop returns it.
    failure: Mutex<Option<FlowError>>,
    /// Input events skipped for having no key.
    null_keys: AtomicU64,
    /// The fence handling's decisions and counters (see `fence_core`). A plain lock, never held
    /// across an await.
    fence: Mutex<FenceCore>,
    /// The recovery reads of every partition taken over, sharing one Fetch per broker.
    recovery_reads: SharedLogs,
}

impl<F: Fold> Shared<F> {
    fn take_failure(&self) -> Option<FlowError> {
        self.failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    fn fail(&self, e: FlowError) {
        let mut f = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_none() {
            *f = Some(e);
        }
    }

    fn fence(&self) -> std::sync::MutexGuard<'_, FenceCore> {
        self.fence.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Carries out the fence handling's verdict on each failure of held partitions' work: drops the
    /// lanes to recover in place, drops all of them for a rejoin, and returns the first failure the
    /// verdict says to stop on.
    async fn settle(&self, failures: Vec<(i32, FlowError)>, site: Site) -> Result<(), FlowError> {
        let judged = judge(&self.lanes, &self.fence, failures, site);
        close_lanes(judged.dropped).await;
        judged.result
    }

    fn lanes(&self) -> std::sync::MutexGuard<'_, BTreeMap<i32, Arc<FlowLane<F>>>> {
        self.lanes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn all_lanes(&self) -> Vec<Arc<FlowLane<F>>> {
        self.lanes().values().cloned().collect()
    }

    fn metadata_handle(&self) -> Option<GroupMetadataHandle> {
        self.metadata
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn metadata_source(&self) -> Arc<dyn MetadataSource> {
        match self.metadata_handle() {
            Some(h) => Arc::new(h),
            None => Arc::new(|| None),
        }
    }

    /// The offset `tp` is assigned at, and whether the group had none committed (then the caller commits
    /// it, see [`FlowConfig`]): the group's committed offset, else per `initial_offset`. This is the
    /// only place that decides where a partition without a committed offset starts.
    async fn assigned_offset(&self, tp: &TopicPartition) -> Result<(i64, bool), ConsumerError> {
        let committed = committed_offsets(
            &self.client,
            &self.config.consumer.group.group_id,
            std::slice::from_ref(tp),
        )
        .await?
        .get(tp)
        .copied()
        .flatten();
        Ok(match committed {
            Some(o) => (o, false),
            None => {
                let spec = match self.config.initial_offset {
                    OffsetReset::Earliest => OffsetSpec::Earliest,
                    OffsetReset::Latest => OffsetSpec::Latest,
                    _ => {
                        return Err(ConsumerError::NoCommittedOffset {
                            partition: tp.clone(),
                        })
                    }
                };
                let offset = list_offsets(
                    &self.client,
                    std::slice::from_ref(tp),
                    spec,
                    IsolationLevel::ReadUncommitted,
                )
                .await?
                .get(tp)
                .copied()
                .unwrap_or(0);
                (offset, true)
            }
        })
    }

    /// The client a partition's snapshot producer talks through: its own, with the client id
    /// `<client_id>-p<partition>`, or the flow's (see [`FlowConfig::partition_client_ids`]).
    async fn partition_client(&self, partition: i32) -> Result<Client, SnapshotError> {
        if !self.config.partition_client_ids {
            return Ok(self.client.clone());
        }
        let mut config = self.client.config().clone();
        config.client_id = format!("{}-p{partition}", config.client_id);
        Client::connect(config)
            .await
            .map_err(|e| SnapshotError::Net {
                partition,
                source: Arc::new(e),
            })
    }

    /// Acquires `partitions` together, at most [`FlowConfig::max_concurrent_partitions`] at once, each on
    /// its own task: a takeover of many partitions costs about as long as its slowest acquisition, not
    /// the sum of them (each waits on its own InitProducerId, committed-offset read and recovery read).
    /// Returns each partition's outcome, in the order given; a task that panicked yields
    /// [`SnapshotError::PartitionTask`]. Dropping the future aborts the tasks (acquisition is
    /// cancel-safe: at most a bumped producer epoch is left behind).
    async fn acquire_all(
        self: &Arc<Self>,
        partitions: Vec<TopicPartition>,
    ) -> Vec<(TopicPartition, Result<FlowLane<F>, FlowError>)> {
        if let [tp] = partitions.as_slice() {
            // One partition (the common case after a cooperative rebalance): no task needed.
            let result = self.acquire(tp).await;
            return vec![(tp.clone(), result)];
        }
        let permits = Arc::new(tokio::sync::Semaphore::new(
            self.config.max_concurrent_partitions.max(1),
        ));
        let mut set = JoinSet::new();
        let mut index = HashMap::with_capacity(partitions.len());
        for (i, tp) in partitions.iter().enumerate() {
            let shared = Arc::clone(self);
            let permits = Arc::clone(&permits);
            let tp = tp.clone();
            let handle = set.spawn(async move {
                let _permit = permits.acquire_owned().await;
                shared.acquire(&tp).await
            });
            index.insert(handle.id(), i);
        }
        let mut outcomes: Vec<Option<Result<FlowLane<F>, FlowError>>> =
            partitions.iter().map(|_| None).collect();
        while let Some(joined) = set.join_next_with_id().await {
            let (id, result) = match joined {
                Ok((id, result)) => (id, result),
                Err(e) => {
                    let id = e.id();
                    let partition = index
                        .get(&id)
                        .map(|&i| partitions[i].partition)
                        .unwrap_or(-1);
                    let error = SnapshotError::PartitionTask {
                        partition,
                        source: Arc::new(e),
                    };
                    (id, Err(error.into()))
                }
            };
            if let Some(&i) = index.get(&id) {
                outcomes[i] = Some(result);
            }
        }
        partitions
            .into_iter()
            .zip(outcomes)
            .filter_map(|(tp, outcome)| outcome.map(|o| (tp, o)))
            .collect()
    }

    /// Opens the partition's writer: takes the partition over in the fenced modes (the producer's init,
    /// and for PostgreSQL the fencing row) and reads where it starts. Returns the writer, the offset
    /// the partition starts at, and whether the group had none committed.
    async fn open_writer(&self, tp: &TopicPartition) -> Result<(Writer, i64, bool), FlowError> {
        let partition = tp.partition;
        let plain_offsets = || PlainOffsets {
            client: self.client.clone(),
            input: tp.clone(),
            metadata: self.metadata_handle(),
        };
        #[cfg(feature = "postgres")]
        if let Some(pg) = &self.config.postgres {
            if self.config.mode == PersistenceMode::NonTransactional {
                let prefix = &self.config.snapshots.transactional_id_prefix;
                let rows = super::postgres::PgPlainWriter::connect(pg, prefix, partition).await?;
                let (offset, fresh) = self.assigned_offset(tp).await?;
                return Ok((Writer::PgPlain(rows, plain_offsets()), offset, fresh));
            }
            let fresh = std::sync::atomic::AtomicBool::new(false);
            let store = super::postgres::PgSnapshotStore::acquire(
                self.partition_client(partition).await?,
                &self.config.snapshots,
                pg,
                tp.clone(),
                self.metadata_source(),
                self.assigned_offset_after_takeover(tp, &fresh),
            )
            .await?;
            let offset = store.committed_offset();
            return Ok((Writer::Pg(store), offset, fresh.load(Ordering::Relaxed)));
        }
        match (self.config.mode, &self.plain) {
            (PersistenceMode::NonTransactional, Some(p)) => {
                let (offset, fresh) = self.assigned_offset(tp).await?;
                let writer = Writer::Plain(PlainWriter {
                    producer: Arc::clone(p),
                    offsets: plain_offsets(),
                    snapshot_topic: Arc::from(self.config.snapshots.snapshot_topic.as_str()),
                });
                Ok((writer, offset, fresh))
            }
            _ => {
                // Take the partition over first, then read its committed offset: a crashed owner's open
                // transaction may hold a pending offset commit, and the stable read waits for it until
                // the takeover aborts it (see SnapshotStore::acquire_then).
                let fresh = std::sync::atomic::AtomicBool::new(false);
                let store = SnapshotStore::acquire_then(
                    self.partition_client(partition).await?,
                    self.config.snapshots.clone(),
                    tp.clone(),
                    self.metadata_source(),
                    self.assigned_offset_after_takeover(tp, &fresh),
                )
                .await?;
                let offset = store.committed_offset();
                Ok((Writer::Fenced(store), offset, fresh.load(Ordering::Relaxed)))
            }
        }
    }

    /// [`assigned_offset`](Self::assigned_offset) in the snapshot layer's error, noting in `fresh`
    /// whether the group had none committed: what a fenced store awaits once it has taken over.
    async fn assigned_offset_after_takeover(
        &self,
        tp: &TopicPartition,
        fresh: &std::sync::atomic::AtomicBool,
    ) -> Result<i64, SnapshotError> {
        let (offset, was_fresh) =
            self.assigned_offset(tp)
                .await
                .map_err(|e| SnapshotError::Consumer {
                    partition: tp.partition,
                    source: Arc::new(e),
                })?;
        fresh.store(was_fresh, Ordering::Relaxed);
        Ok(offset)
    }

    async fn acquire(&self, tp: &TopicPartition) -> Result<FlowLane<F>, FlowError> {
        let (writer, assigned_offset, fresh) = self.open_writer(tp).await?;
        let recovered = self.recover(tp, assigned_offset, &writer).await;
        let core = match recovered {
            Ok(core) => core,
            Err(e) => {
                writer.close().await;
                return Err(e);
            }
        };
        let behind = writer.group_offset_behind();
        let lane = Lane::new(tp.partition, core, writer);
        if fresh || behind {
            // Record the start for the group before anything is fetched: the consumer starts the
            // partition at the committed offset, so it now reads from exactly where this flow
            // counts from, and a restart before the first periodic commit starts there again
            // instead of re-resolving "earliest" or "latest" against a log that has moved. (Behind: a
            // PostgreSQL flush's rows committed, its Kafka side aborted at the takeover.)
            if let Err(e) = commit_lane(&lane, CommitWhen::Always).await {
                lane.writer.close().await;
                return Err(e);
            }
        }
        // Timers that fell due while nobody owned the partition fire before any event is folded, as
        // they would have on a live owner that ticked.
        let fired = lane.core().tick(&*self.fold, self.config.clock.now_ms());
        if fired > 0 {
            tracing::info!(
                partition = tp.partition,
                fired,
                "overdue timers fired at takeover"
            );
        }
        Ok(lane)
    }

    /// Eager recovery: every key of the partition, before any event is folded.
    async fn recover(
        &self,
        tp: &TopicPartition,
        assigned_offset: i64,
        writer: &Writer,
    ) -> Result<PartitionCore<F::State>, FlowError> {
        let began = std::time::Instant::now();
        let recovered = match writer {
            #[cfg(feature = "postgres")]
            Writer::Pg(store) => store.read_state().await?,
            #[cfg(feature = "postgres")]
            Writer::PgPlain(rows, _) => rows.read_state().await?,
            _ => self.read_snapshot_log(tp).await?,
        };
        let mut core = PartitionCore::new(assigned_offset);
        let mut graves = 0usize;
        for (key, value) in &recovered {
            let key = Bytes::copy_from_slice(key);
            let bad = |reason: String| FlowError::BadSnapshot {
                partition: tp.partition,
                key: key.clone(),
                reason,
            };
            match open_envelope(value).map_err(bad)? {
                Opened::Live(last_offset, payload) => {
                    let state = self.fold.decode(payload).map_err(|e| bad(e.to_string()))?;
                    core.restore(&*self.fold, key, Some(state), last_offset);
                }
                Opened::Grave(last_offset) => {
                    graves += 1;
                    core.restore(&*self.fold, key, None, last_offset);
                }
            }
        }
        let elapsed = began.elapsed();
        tracing::info!(
            partition = tp.partition,
            keys = recovered.len(),
            graves,
            ?elapsed,
            assigned_offset,
            "partition recovered"
        );
        Ok(core)
    }

    /// The recovery read of the partition's snapshot topic partition, through the flow's shared reader.
    async fn read_snapshot_log(&self, tp: &TopicPartition) -> Result<RecoveredState, FlowError> {
        let mut log = self.recovery_reads.log(tp.partition);
        let recovery = RecoveryConfig {
            stall_timeout: match self.config.mode {
                PersistenceMode::Transactional => self.config.snapshots.recovery_stall_timeout,
                PersistenceMode::NonTransactional => None,
            },
            fetch_wait: self.config.recovery_fetch_wait,
            progress_every: self.config.recovery_progress_every,
        };
        let (recovered, _stats) = recover(&mut log, tp.partition, &recovery).await?;
        Ok(recovered)
    }

    /// Drops `partitions`' lanes; with `flush`, first flushes them (as [`flush_lane`]), each on its own,
    /// so one slow partition does not lengthen the others' handover. Then closes their stores.
    async fn release(&self, partitions: &[TopicPartition], flush: bool) {
        self.fence()
            .released(partitions.iter().map(|tp| tp.partition));
        let lanes: Vec<_> = {
            let mut held = self.lanes();
            partitions
                .iter()
                .filter_map(|tp| held.remove(&tp.partition))
                .collect()
        };
        if flush {
            let fold = Arc::clone(&self.fold);
            let failures = each_lane(
                lanes.clone(),
                self.config.max_concurrent_partitions,
                move |lane| {
                    let fold = Arc::clone(&fold);
                    async move { flush_lane(&*fold, &lane).await }
                },
            )
            .await;
            for (partition, e) in failures {
                let verdict = self
                    .fence()
                    .on_failure(partition, e.response(), Site::Release);
                match verdict {
                    Verdict::Expected => {
                        tracing::info!(partition, error = %e, "flush on revoke refused; the next owner replays")
                    }
                    _ => {
                        tracing::warn!(partition, error = %e, "flush on revoke failed");
                        self.fail(e);
                    }
                }
            }
        }
        close_lanes(lanes).await;
    }
}

/// The fence handling's verdict on each failure of `held` lanes' work at `site`, carried out on the
/// lane map: the lanes to drop unflushed (one, to recover in place; all, for a rejoin) are removed
/// from it and returned for closing, with the first failure the verdict says to stop on. Their
/// in-memory state goes with them; the consumer keeps the partitions until the fence handling's plan
/// (before the next poll) acquires them again or forgets them.
fn judge<S, W>(
    held: &Mutex<LaneMap<S, W>>,
    fence: &Mutex<FenceCore>,
    failures: Vec<(i32, FlowError)>,
    site: Site,
) -> Judged<S, W> {
    let mut first_err = None;
    let mut drop = Vec::new();
    let mut drop_all = false;
    for (partition, e) in failures {
        let verdict = fence.lock().unwrap_or_else(|p| p.into_inner()).on_failure(
            partition,
            e.response(),
            site,
        );
        match verdict {
            Verdict::Fail => {
                first_err.get_or_insert(e);
            }
            Verdict::DropLane => {
                tracing::info!(partition, error = %e, "commit refused; dropping the partition's state to acquire it again in place");
                drop.push(partition);
            }
            Verdict::DropAll => {
                tracing::warn!(partition, error = %e, "commit refused for the membership or the producer; dropping every partition to rejoin as a new member");
                drop_all = true;
            }
            Verdict::Expected => {
                tracing::info!(partition, error = %e, "flush refused at revocation; the next owner replays");
            }
        }
    }
    let mut held = held.lock().unwrap_or_else(|p| p.into_inner());
    if drop_all {
        drop = held.keys().copied().collect();
    }
    Judged {
        dropped: drop.iter().filter_map(|p| held.remove(p)).collect(),
        result: first_err.map_or(Ok(()), Err),
    }
}

/// What [`judge`] decided: the lanes it removed (to close) and what the caller is told.
struct Judged<S, W> {
    dropped: Vec<Arc<Lane<S, W>>>,
    result: Result<(), FlowError>,
}

/// The held partitions' lanes, by partition.
type LaneMap<S, W> = BTreeMap<i32, Arc<Lane<S, W>>>;

/// Closes released or dropped lanes' stores.
async fn close_lanes<S>(lanes: Vec<Arc<Lane<S, Writer>>>) {
    for lane in lanes {
        let partition = lane.partition;
        match Arc::try_unwrap(lane) {
            Ok(lane) => lane.writer.close().await,
            Err(_) => tracing::warn!(
                partition,
                "a persist of the released partition is still running; its store closes when it ends"
            ),
        }
    }
}

/// The rebalance listener that builds and tears down partition flows.
struct Listener<F: Fold>(Arc<Shared<F>>);

impl<F: Fold> RebalanceListener for Listener<F> {
    async fn on_partitions_assigned(&mut self, partitions: &[TopicPartition]) {
        self.0.fence().on_rebalance_event();
        let new: Vec<TopicPartition> = {
            let lanes = self.0.lanes();
            partitions
                .iter()
                .filter(|tp| !lanes.contains_key(&tp.partition))
                .cloned()
                .collect()
        };
        let mut failures = Vec::new();
        for (tp, outcome) in self.0.acquire_all(new).await {
            match outcome {
                Ok(lane) => {
                    self.0.lanes().insert(tp.partition, Arc::new(lane));
                }
                Err(e) => {
                    tracing::warn!(partition = tp.partition, error = %e, "acquiring a partition failed");
                    failures.push((tp.partition, e));
                }
            }
        }
        // A refused first commit is handled like any refused commit: the partition waits to be
        // acquired again in place (or the member rejoins).
        if !failures.is_empty() {
            if let Err(e) = self.0.settle(failures, Site::Acquire).await {
                self.0.fail(e);
            }
        }
    }

    /// Synchronous teardown: flush, commit, close, before the group may hand the partition on.
    async fn on_partitions_revoked(&mut self, partitions: &[TopicPartition]) {
        self.0.fence().on_rebalance_event();
        self.0.release(partitions, true).await;
    }

    /// Lost (evicted or fenced): another member may own these already; writing would be fenced (or, in the
    /// unfenced mode, corrupt), so nothing is flushed.
    async fn on_partitions_lost(&mut self, partitions: &[TopicPartition], reason: LostReason) {
        tracing::warn!(
            ?reason,
            ?partitions,
            "partitions lost without revocation; dropping their flows unflushed"
        );
        self.0.fence().on_rebalance_event();
        self.0.release(partitions, false).await;
    }
}

/// Reads a flow's [`FlowStats`] while something else owns the flow (see [`Flow::stats_handle`]).
#[derive(Clone)]
pub struct StatsHandle(Arc<dyn Fn() -> FlowStats + Send + Sync>);

impl StatsHandle {
    /// The counters now.
    pub fn get(&self) -> FlowStats {
        (self.0)()
    }
}

impl std::fmt::Debug for StatsHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("StatsHandle").field(&self.get()).finish()
    }
}

/// How long [`Flow::close`] waits for the coordinator to acknowledge the leave.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(10);

/// A running flow: one group member folding its assigned partitions.
///
/// What a user does: implement [`Fold`], build a [`FlowConfig`], [`start`](Flow::start) the flow, then
/// either hand it to [`run`](Flow::run) (polls, persists every `persist_every`, commits every
/// `commit_offsets_interval`, closes when told to stop) or drive it yourself with
/// [`poll_once`](Flow::poll_once), [`persist`](Flow::persist) and [`commit`](Flow::commit) and end
/// with [`close`](Flow::close).
///
/// End a flow with `close` (or let `run` return). Dropping it instead stops its heartbeats without
/// leaving the group: the coordinator keeps the dead member until its session timeout (45 s by
/// default) and only then gives its partitions to someone else, state folded since the last
/// [`persist`](Flow::persist) is not written (the next owner folds those events again from the
/// committed offset: time lost, not state), and a transaction in flight is left open until the next
/// owner's takeover aborts it.
///
/// ```no_run
/// # use snapfence::records::Record;
/// # use snapfence::snapshot::{BoxError, Change, Fold};
/// # use snapfence::Bytes;
/// # struct Balances;
/// # impl Fold for Balances {
/// #     type State = i64;
/// #     fn fold(&self, _: &Bytes, s: &mut Option<i64>, _: &Record) -> Change {
/// #         *s.get_or_insert(0) += 1;
/// #         Change::Update
/// #     }
/// #     fn encode(&self, s: &i64) -> Bytes { Bytes::copy_from_slice(&s.to_be_bytes()) }
/// #     fn decode(&self, b: &[u8]) -> Result<i64, BoxError> { Ok(i64::from_be_bytes(b.try_into()?)) }
/// # }
/// use snapfence::consumer::{GroupConfig, GroupConsumerConfig};
/// use snapfence::net::{Client, ClientConfig};
/// use snapfence::snapshot::{Flow, FlowConfig, MissingSnapshotTopic, SnapshotConfig};
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let client = Client::connect(ClientConfig::new("localhost:9092")).await?;
/// let mut config = FlowConfig::new(
///     GroupConsumerConfig::new(GroupConfig::new("balances")),
///     "payments",
///     SnapshotConfig::new("balances-snapshots", "balances"),
/// );
/// config.missing_snapshot_topic = MissingSnapshotTopic::Create { replication_factor: None };
/// // Fails fast if the snapshot topic is missing, not compacted, or sized unlike "payments".
/// let flow = Flow::start(client, config, Balances).await?;
/// // Fold until told to stop (send on, or drop, `stop`), then flush, commit and leave the group. A
/// // refused commit is recovered in place (see `FencePolicy`); `Flow::stats` counts it.
/// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
/// # drop(stop);
/// flow.run(async {
///     let _ = stopped.await;
/// })
/// .await?;
/// # Ok(())
/// # }
/// ```
pub struct Flow<F: Fold> {
    shared: Arc<Shared<F>>,
    consumer: GroupConsumer<Listener<F>>,
}

impl<F: Fold> std::fmt::Debug for Flow<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Flow")
            .field("input_topic", &self.shared.config.input_topic)
            .finish()
    }
}

impl<F: Fold> Flow<F> {
    /// Checks the snapshot topic (creating it if [`FlowConfig::missing_snapshot_topic`] says so), then
    /// joins the group and subscribes to the input topic. Partitions are recovered as they are
    /// assigned, inside the polls.
    ///
    /// Fails before joining, in a few round trips, with [`FlowError::SnapshotTopic`] when the input
    /// or the snapshot topic is missing, the snapshot topic's `cleanup.policy` could delete snapshots,
    /// or its partition count differs from the input's; and with [`SnapshotError::Config`] for
    /// unworkable snapshot settings.
    ///
    /// Cancel-safe: dropping it before it returns leaves at most a created snapshot topic behind.
    pub async fn start(client: Client, mut config: FlowConfig, fold: F) -> Result<Self, FlowError> {
        config.consumer.auto_commit_interval = None;
        config.snapshots.validate()?;
        #[cfg(feature = "postgres")]
        let on_topic = config.postgres.is_none();
        #[cfg(not(feature = "postgres"))]
        let on_topic = true;
        if on_topic {
            topic::ensure(
                &client,
                &config.snapshots.snapshot_topic,
                &config.input_topic,
                config.missing_snapshot_topic,
            )
            .await?;
        }
        let plain = match config.mode {
            PersistenceMode::NonTransactional => Some(Arc::new(
                Producer::new(client.clone(), ProducerConfig::default()).await?,
            )),
            PersistenceMode::Transactional => None,
        };
        let shared = Arc::new(Shared {
            fold: Arc::new(fold),
            client: client.clone(),
            config: config.clone(),
            metadata: Mutex::new(None),
            plain,
            lanes: Mutex::new(BTreeMap::new()),
            failure: Mutex::new(None),
            null_keys: AtomicU64::new(0),
            fence: Mutex::new(FenceCore::new(config.fence_policy)),
            recovery_reads: SharedLogs::new(
                client.clone(),
                &config.snapshots.snapshot_topic,
                config.recovery_reader.clone(),
            ),
        });
        let consumer = GroupConsumer::subscribe(
            client,
            config.consumer.clone(),
            [config.input_topic.clone()],
            Listener(Arc::clone(&shared)),
        )
        .await?;
        *shared.metadata.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(consumer.group_metadata());
        Ok(Flow { shared, consumer })
    }

    /// The live group metadata this flow binds into every commit.
    pub fn group_metadata(&self) -> GroupMetadataHandle {
        self.consumer.group_metadata()
    }

    /// The partitions this flow currently holds.
    pub async fn partitions(&self) -> Vec<i32> {
        self.shared.lanes().keys().copied().collect()
    }

    /// One poll: runs rebalance handlers (recovery on assignment, flush on revocation), then folds the
    /// events fetched. Returns how many events were folded.
    ///
    /// It neither persists, commits nor fires timers (only a revocation inside it flushes the revoked
    /// partitions): `persist_every`, `commit_offsets_interval` and `timer_every` apply only inside
    /// [`run`](Self::run). A loop built on `poll_once` calls [`persist`](Self::persist),
    /// [`commit`](Self::commit) and [`tick`](Self::tick) when it chooses.
    ///
    /// Cancel safety: as the consumer's `poll`; events already returned are folded before this returns.
    pub async fn poll_once(&mut self, timeout: Duration) -> Result<usize, FlowError> {
        self.before_poll().await?;
        let batches = self.poll_consumer(timeout).await?;
        self.fold_batches(batches)
    }

    /// The fence handling's counters: spurious fences recovered in place, re-acquisitions, rejoins,
    /// refused revoke-time flushes (see [`FencePolicy`]).
    pub fn stats(&self) -> FlowStats {
        self.shared.fence().stats()
    }

    /// A handle that reads [`stats`](Self::stats) from anywhere, also while [`run`](Self::run) owns
    /// the flow.
    pub fn stats_handle(&self) -> StatsHandle {
        let shared = Arc::clone(&self.shared);
        StatsHandle(Arc::new(move || shared.fence().stats()))
    }

    /// The consumer's poll, with a rebalance handler's failure preferred over the consumer error it
    /// causes (a partition whose acquisition failed shows up as the consumer's NoCommittedOffset).
    async fn poll_consumer(
        &mut self,
        timeout: Duration,
    ) -> Result<Vec<PartitionRecords>, FlowError> {
        match self.consumer.poll(timeout).await {
            Ok(batches) => Ok(batches),
            // A partition whose first commit was refused has no committed offset yet; it is
            // acquired again (and its start committed) before the next poll.
            Err(ConsumerError::NoCommittedOffset { partition })
                if partition.topic.as_ref() == self.shared.config.input_topic.as_str()
                    && self.shared.fence().is_dropped(partition.partition) =>
            {
                Ok(Vec::new())
            }
            Err(e) => Err(self.shared.take_failure().unwrap_or(e.into())),
        }
    }

    /// Carries out the fence handling's pending decisions before a poll. A rejoin goes to the consumer
    /// (its lanes are already gone; the poll hands the partitions out as lost and joins again).
    /// Otherwise every partition dropped in place that the consumer still holds is acquired again
    /// (InitProducerId, recovery read, committed offset), and the consumer's position is moved back to
    /// the offset the new lane starts at: the events after it, including any fetched for the dropped
    /// lane and skipped unfolded, are fetched again. A partition no longer held is forgotten.
    async fn before_poll(&mut self) -> Result<(), FlowError> {
        let rejoin = self.shared.fence().take_rejoin();
        if let Some(reason) = rejoin {
            self.consumer.rejoin(&reason);
            return Ok(());
        }
        let owned: std::collections::BTreeSet<i32> = self
            .consumer
            .assignment()
            .into_iter()
            .filter(|tp| tp.topic.as_ref() == self.shared.config.input_topic.as_str())
            .map(|tp| tp.partition)
            .collect();
        let plan = self.shared.fence().plan(&owned);
        let mut again = Vec::new();
        for partition in plan {
            if self.shared.lanes().contains_key(&partition) {
                self.shared.fence().reacquired(partition);
            } else {
                let topic = self.shared.config.input_topic.as_str();
                again.push(TopicPartition::new(topic, partition));
            }
        }
        let mut failures = Vec::new();
        for (tp, outcome) in self.shared.acquire_all(again).await {
            let partition = tp.partition;
            match outcome {
                Ok(lane) => {
                    let start = lane.core().position();
                    self.shared.lanes().insert(partition, Arc::new(lane));
                    self.shared.fence().reacquired(partition);
                    self.consumer.seek(&tp, StartAt::Offset(start));
                    tracing::info!(
                        partition,
                        start,
                        "partition acquired again in place after a refused commit"
                    );
                }
                Err(e) => failures.push((partition, e)),
            }
        }
        if failures.is_empty() {
            return Ok(());
        }
        self.shared.settle(failures, Site::Acquire).await
    }

    /// How many input events this flow skipped because they had no key (see [`Fold`]).
    pub fn null_key_events(&self) -> u64 {
        self.shared.null_keys.load(Ordering::Relaxed)
    }

    /// Folds fetched events into their keys' state, after surfacing any failure of a rebalance handler.
    /// Each partition's core is locked only while its own batch folds: a persist in flight on it (or on
    /// any other partition) does not hold folding up.
    fn fold_batches(&self, batches: Vec<PartitionRecords>) -> Result<usize, FlowError> {
        if let Some(e) = self.shared.take_failure() {
            return Err(e);
        }
        let mut folded = 0;
        for batch in batches {
            let lane = self.shared.lanes().get(&batch.partition.partition).cloned();
            let Some(lane) = lane else { continue };
            let mut core = lane.core();
            for event in &batch.records {
                match core.fold_event(&*self.shared.fold, event) {
                    Folded::NullKey => {
                        if self.shared.null_keys.fetch_add(1, Ordering::Relaxed) == 0 {
                            tracing::warn!(
                                partition = batch.partition.partition,
                                offset = event.offset,
                                "skipping input events with a null key: a fold is per key (counted \
                                 in Flow::null_key_events)"
                            );
                        }
                    }
                    Folded::Skipped => {}
                    Folded::Kept | Folded::Changed => folded += 1,
                }
            }
            core.advance(batch.next_offset);
        }
        Ok(folded)
    }

    /// Fires every timer due on [`FlowConfig::clock`] in every held partition (see [`Fold::deadline`]),
    /// and returns how many fired. Their changes are persisted by the next [`persist`](Self::persist),
    /// fenced like an event's.
    pub fn tick(&self) -> usize {
        let now = self.shared.config.clock.now_ms();
        self.shared
            .all_lanes()
            .iter()
            .map(|lane| lane.core().tick(&*self.shared.fold, now))
            .sum()
    }

    /// The earliest timer deadline over the held partitions (milliseconds on [`FlowConfig::clock`]): when
    /// a loop built on [`poll_once`](Self::poll_once) should call [`tick`](Self::tick) next.
    pub fn next_deadline(&self) -> Option<i64> {
        self.shared
            .all_lanes()
            .iter()
            .filter_map(|lane| lane.core().next_deadline())
            .min()
    }

    /// Persists every key changed since its last snapshot (updates as snapshots, deletes as graves or
    /// tombstones), in every held partition. Partitions persist independently and concurrently, at most
    /// [`FlowConfig::max_concurrent_partitions`] at once; within one, the whole wave is queued at once
    /// so the group commit batches it. In the transactional mode each write is fenced by the group
    /// generation. A refused write is handled by [`FlowConfig::fence_policy`]: by default the partition
    /// is dropped and acquired again before the next poll (or, after an eviction or a producer fence,
    /// the member rejoins), and nothing is returned; with [`FencePolicy::Stop`] the error, for which
    /// [`FlowError::is_fenced`] or [`FlowError::is_producer_fenced`] is true, is. Returns after every
    /// partition finished, with the first error the policy does not absorb.
    ///
    /// Not cancel-safe in outcome: if dropped, some snapshots may have been written; they are written
    /// again by the next call.
    pub async fn persist(&self) -> Result<(), FlowError> {
        let fold = Arc::clone(&self.shared.fold);
        let failures = each_lane(
            self.shared.all_lanes(),
            self.shared.config.max_concurrent_partitions,
            move |lane| {
                let fold = Arc::clone(&fold);
                async move { persist_lane(&*fold, &lane).await }
            },
        )
        .await;
        self.shared.settle(failures, Site::Held).await
    }

    /// Commits every held partition's committable offset: the first change not yet in a landed
    /// snapshot write, so a commit never passes state that exists only in memory. Call
    /// [`persist`](Self::persist) first to move it as far as the folding went. Partitions commit
    /// independently, as in `persist`. A partition whose committable offset has not moved past its
    /// last landed commit commits nothing (no transaction).
    ///
    /// Not cancel-safe in outcome: if dropped, the commit may or may not have happened.
    pub async fn commit(&self) -> Result<(), FlowError> {
        let failures = each_lane(
            self.shared.all_lanes(),
            self.shared.config.max_concurrent_partitions,
            |lane| async move { commit_lane(&lane, CommitWhen::Moved).await },
        )
        .await;
        self.shared.settle(failures, Site::Held).await
    }

    /// The current state of every live key of `partition`, if held.
    pub async fn state(&self, partition: i32) -> Option<HashMap<Bytes, F::State>> {
        let lane = self.shared.lanes().get(&partition).cloned()?;
        let core = lane.core();
        Some(core.states().map(|(k, s)| (k.clone(), s.clone())).collect())
    }

    /// The next input offset of `partition` this flow will fold (the assigned offset until events arrive),
    /// if held: how a caller knows the flow has caught up with an input end it read elsewhere.
    pub async fn position(&self, partition: i32) -> Option<i64> {
        let lane = self.shared.lanes().get(&partition).cloned()?;
        let position = lane.core().position();
        Some(position)
    }

    /// Polls, persisting every `persist_every`, committing every `commit_offsets_interval` and firing
    /// timers every `timer_every`, until `stop` completes or an error (a refused commit only with
    /// [`FencePolicy::Stop`]; by default it is recovered in place, between polls). Then
    /// [`close`](Self::close)s the flow; the loop's error, if any, is returned before close's.
    ///
    /// The periodic work runs between polls and never interrupts one: a rebalance handler inside a poll
    /// (a partition's acquisition and recovery read) runs to its end however long it takes, and a
    /// persist or commit falls due late by at most that long.
    ///
    /// Not cancel-safe: dropping the future is dropping the flow (see [`Flow`]).
    pub async fn run(
        mut self,
        stop: impl std::future::Future<Output = ()>,
    ) -> Result<(), FlowError> {
        tokio::pin!(stop);
        let persist_every = self.shared.config.persist_every;
        let commit_every = self.shared.config.commit_offsets_interval;
        let timer_every = self.shared.config.timer_every;
        let began = tokio::time::Instant::now();
        let (mut next_persist, mut next_commit, mut next_timers) = (
            began + persist_every,
            began + commit_every,
            began + timer_every,
        );
        let result = loop {
            // Outside the select: an acquisition must not be cancelled by a persist tick.
            if let Err(e) = self.before_poll().await {
                break Err(e);
            }
            // The periodic work runs between polls, never by cancelling one: a poll may be running a
            // rebalance handler (a partition's acquisition and recovery read, however long it takes),
            // which a cancelled poll would start again from nothing.
            let now = tokio::time::Instant::now();
            if now >= next_commit {
                next_commit = now + commit_every;
                next_persist = now + persist_every;
                if let Err(e) = self.persist().await {
                    break Err(e);
                }
                if let Err(e) = self.commit().await {
                    break Err(e);
                }
            } else if now >= next_persist {
                next_persist = now + persist_every;
                if let Err(e) = self.persist().await {
                    break Err(e);
                }
            }
            if now >= next_timers {
                next_timers = now + timer_every;
                self.tick();
            }
            let wait = next_persist
                .min(next_commit)
                .min(next_timers)
                .saturating_duration_since(tokio::time::Instant::now())
                .clamp(Duration::from_millis(1), Duration::from_millis(200));
            tokio::select! {
                biased;
                _ = &mut stop => break Ok(()),
                r = self.poll_consumer(wait) => {
                    let folded = match r {
                        Ok(batches) => self.fold_batches(batches),
                        Err(e) => Err(e),
                    };
                    if let Err(e) = folded { break Err(e) }
                }
            }
        };
        let closed = self.close().await;
        result?;
        closed
    }

    /// Stops folding and leaves the group, so a new member takes the partitions over at once instead of
    /// waiting out this member's session timeout.
    ///
    /// The rule: every held partition is flushed as on a revocation — every key changed since its last
    /// snapshot is persisted, then the partition's committable offset is committed (which, after that
    /// persist, is the position: everything folded is durable), then the tombstones that commit made due
    /// are written, then its snapshot producer is closed. Then the member leaves (LeaveGroup under the
    /// classic protocol, a leave heartbeat under KIP-848; a static member, `group_instance_id` set, does
    /// not leave and keeps its partitions until its session expires), waiting at most 10 s for the
    /// coordinator, and the unfenced mode's shared producer is flushed and closed. Events fetched but
    /// not yet folded are not folded.
    ///
    /// The leave happens even when a flush fails; the first flush failure is returned (a stale owner's
    /// flush is refused by the fence, and nothing of it lands; by default, see [`FencePolicy`], a
    /// refused flush is counted instead, as the next owner replays). Partitions lost before the close
    /// are not flushed: another member may own them already.
    ///
    /// Not cancel-safe: dropping the future mid-way is dropping the flow (see [`Flow`]).
    pub async fn close(self) -> Result<(), FlowError> {
        let Flow { shared, consumer } = self;
        // Runs the revocation handler for every held partition (flush, commit, close the store) before
        // the leave request goes out, while the generation still accepts the commits.
        let left = consumer.close(LEAVE_TIMEOUT).await;
        let flushed = shared.take_failure();
        if let Some(producer) = &shared.plain {
            Producer::clone(producer).close().await;
        }
        if let Some(e) = flushed {
            return Err(e);
        }
        left?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::fold_core::grave;

    /// The envelope carries the last folded offset so replay never double-folds, and a grave carries the
    /// delete's; a foreign or truncated value is a typed error, not a panic.
    #[test]
    fn envelope_round_trips_and_rejects_garbage() {
        let e = envelope(42, b"state");
        assert_eq!(open_envelope(&e).unwrap(), Opened::Live(42, &b"state"[..]));
        assert_eq!(open_envelope(&grave(7)).unwrap(), Opened::Grave(7));
        assert!(open_envelope(b"").is_err());
        assert!(open_envelope(&[1, 0, 0]).is_err());
        assert!(open_envelope(&[2, 0, 0, 0, 0, 0, 0, 0, 0, 1]).is_err());
        assert!(open_envelope(&[9, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
    }
}

#[cfg(test)]
#[path = "flow_tests.rs"]
mod driver_tests;
