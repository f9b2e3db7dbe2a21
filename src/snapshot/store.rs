//! The snapshot store of one assigned input partition.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::error::SnapshotError;
use super::group_commit::{Entry, GroupCommit, MetadataSource, TryEnqueueError, TryWriteError};
use super::runner::ProducerRunner;
use crate::net::Client;
use crate::producer::{ProducerConfig, TopicPartition, TransactionalConfig, TransactionalProducer};

/// How snapshots of one flow are stored.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SnapshotConfig {
    /// The compacted snapshot topic. It has as many partitions as the input topic: snapshot partition N
    /// holds the state of input partition N.
    pub snapshot_topic: String,
    /// Prefix of the per-partition transactional ids, `<prefix>-<partition>`. Cluster-scoped like a group
    /// id: one prefix per flow, or flows fence each other's producers.
    pub transactional_id_prefix: String,
    /// Writes drained into one transaction at most. Default 256; below 1 is a configuration error.
    pub max_writes_per_transaction: usize,
    /// Bytes (snapshots and the outputs riding with them) drained into one transaction at most; one
    /// write with its outputs always goes, however large. Default 8 MiB: a transaction's records are
    /// produced in well under a second even at a few MB/s, far inside the 1-minute transaction timeout,
    /// so a wave of large outputs never runs one transaction into the coordinator's abort. Raise it
    /// with the transaction timeout, never past it.
    pub max_bytes_per_transaction: usize,
    /// Writes that may wait for a transaction before `write` waits for room. Default 65 536.
    pub max_queued_writes: usize,
    /// How long the recovery read may make no progress before it fails with a diagnosis.
    /// Default 3 minutes; `None` waits forever.
    pub recovery_stall_timeout: Option<Duration>,
    /// The snapshot producer's transaction timeout. Default 1 minute.
    pub transaction_timeout: Duration,
    /// Producer batching and retry settings.
    pub producer: ProducerConfig,
}

impl SnapshotConfig {
    /// Defaults for `snapshot_topic` with transactional ids `<prefix>-<partition>`.
    pub fn new(
        snapshot_topic: impl Into<String>,
        transactional_id_prefix: impl Into<String>,
    ) -> Self {
        SnapshotConfig {
            snapshot_topic: snapshot_topic.into(),
            transactional_id_prefix: transactional_id_prefix.into(),
            max_writes_per_transaction: 256,
            max_bytes_per_transaction: 8 << 20,
            max_queued_writes: 65_536,
            recovery_stall_timeout: Some(Duration::from_secs(180)),
            transaction_timeout: Duration::from_secs(60),
            producer: ProducerConfig::default(),
        }
    }

    /// The transactional id of a snapshot partition's producer.
    pub fn transactional_id(&self, partition: i32) -> String {
        format!("{}-{}", self.transactional_id_prefix, partition)
    }

    pub(crate) fn validate(&self) -> Result<(), SnapshotError> {
        if self.max_writes_per_transaction < 1 {
            return Err(SnapshotError::Config(
                "max_writes_per_transaction must be at least 1".into(),
            ));
        }
        if self.snapshot_topic.is_empty() || self.transactional_id_prefix.is_empty() {
            return Err(SnapshotError::Config(
                "the snapshot topic and the transactional id prefix must not be empty".into(),
            ));
        }
        Ok(())
    }
}

/// What the consumer's assignment supplies for one partition; never configured by hand.
#[derive(Clone)]
pub struct Assignment {
    /// The input partition (its number is also the snapshot partition's).
    pub input: TopicPartition,
    /// The input offset the partition was assigned at (the committed offset, or the reset position):
    /// every transaction commits at least this, so the first write is already fenced.
    pub assigned_offset: i64,
    /// The consumer's live group metadata, read once per transaction.
    pub metadata: Arc<dyn MetadataSource>,
}

impl std::fmt::Debug for Assignment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Assignment")
            .field("input", &self.input)
            .field("assigned_offset", &self.assigned_offset)
            .field("metadata", &self.metadata.current())
            .finish()
    }
}

/// The transactional, generation-fenced snapshot store of one assigned partition.
///
/// The layer under [`Flow`](super::Flow), for an application that keeps its own state: acquire the
/// store when the group assigns you an input partition, write snapshots and commit input offsets
/// through it (each transaction carries the group generation, so a stale owner's write never lands),
/// and close it on revocation. The snapshot topic must already exist, compacted, with the input's
/// partition count (`Flow::start` checks that; this type does not).
///
/// ```no_run
/// use std::sync::Arc;
/// use snapfence::consumer::{GroupConfig, GroupConsumer, GroupConsumerConfig};
/// use snapfence::net::Client;
/// use snapfence::producer::TopicPartition;
/// use snapfence::snapshot::{Assignment, SnapshotConfig, SnapshotStore};
/// use snapfence::Bytes;
///
/// # async fn demo(client: Client) -> Result<(), Box<dyn std::error::Error>> {
/// let group = GroupConsumerConfig::new(GroupConfig::new("balances"));
/// let consumer = GroupConsumer::subscribe(client.clone(), group, ["payments"], ()).await?;
/// // ... later, in the assignment handler: input partition 0, committed offset 42.
/// let assignment = Assignment {
///     input: TopicPartition::new("payments", 0),
///     assigned_offset: 42,
///     metadata: Arc::new(consumer.group_metadata()),
/// };
/// let config = SnapshotConfig::new("balances-snapshots", "balances");
/// let store = SnapshotStore::acquire(client, config, assignment).await?;
/// store.write(Bytes::from_static(b"alice"), Some(Bytes::from_static(b"100"))).await?;
/// store.commit_offset(43).await?; // the input offset after the events alice's snapshot covers
/// store.close().await; // on revocation
/// # Ok(())
/// # }
/// ```
pub struct SnapshotStore {
    config: SnapshotConfig,
    partition: i32,
    commits: GroupCommit<ProducerRunner>,
    acquired_in: Duration,
    /// Shared with the runner: the stream time each committed offset's metadata carries.
    stream_times: Arc<crate::snapshot::runner::StreamTimes>,
    inputs: Arc<crate::snapshot::runner::InputOffsetNotes>,
}

impl std::fmt::Debug for SnapshotStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotStore")
            .field("snapshot_topic", &self.config.snapshot_topic)
            .field("partition", &self.partition)
            .field("committed_offset", &self.commits.committed_offset())
            .finish()
    }
}

impl SnapshotStore {
    /// Takes ownership of a snapshot partition: initialises its transactional producer with the stable id
    /// `<prefix>-<partition>`. That init fences the previous owner's producer and aborts any transaction it
    /// left open, so the recovery read that follows does not wait for it.
    ///
    /// Cancel-safe: dropping the future leaves at most a bumped producer epoch behind.
    pub async fn acquire(
        client: Client,
        config: SnapshotConfig,
        assignment: Assignment,
    ) -> Result<Self, SnapshotError> {
        let offset = assignment.assigned_offset;
        Self::acquire_then(
            client,
            config,
            assignment.input,
            assignment.metadata,
            async move { Ok(offset) },
        )
        .await
    }

    /// [`acquire`](Self::acquire) for a caller that learns the assigned offset only after the takeover:
    /// the producer is initialised first (fencing the previous owner and aborting its open transaction,
    /// offsets it had pending in it included), and only then is `assigned_offset` awaited.
    ///
    /// The order matters when the assigned offset is the group's committed offset: a committed-offset
    /// read that waits for stable offsets (OffsetFetch `require_stable`, KIP-447) answers
    /// UNSTABLE_OFFSET_COMMIT for as long as a crashed owner's transaction holds a pending offset commit
    /// for the partition. Read before the takeover, it would wait for that transaction's timeout; read
    /// after, it answers at once.
    ///
    /// Cancel-safe: dropping the future leaves at most a bumped producer epoch behind.
    pub async fn acquire_then(
        client: Client,
        config: SnapshotConfig,
        input: TopicPartition,
        metadata: Arc<dyn MetadataSource>,
        assigned_offset: impl std::future::Future<Output = Result<i64, SnapshotError>>,
    ) -> Result<Self, SnapshotError> {
        let start = async { Ok((assigned_offset.await?, ())) };
        let (store, ()) = Self::take_over(client, config, input, metadata, start).await?;
        Ok(store)
    }

    /// [`acquire_then`](Self::acquire_then) whose `start` hands back, beside the assigned offset, what
    /// else it learned on the way (the flow: whether the group had an offset committed), returned
    /// with the store.
    pub(crate) async fn take_over<T>(
        client: Client,
        config: SnapshotConfig,
        input: TopicPartition,
        metadata: Arc<dyn MetadataSource>,
        start: impl std::future::Future<Output = Result<(i64, T), SnapshotError>>,
    ) -> Result<(Self, T), SnapshotError> {
        config.validate()?;
        let partition = input.partition;
        let began = tokio::time::Instant::now();
        let mut txn = TransactionalConfig::new(config.transactional_id(partition));
        txn.transaction_timeout = config.transaction_timeout;
        txn.producer = config.producer.clone();
        let producer = TransactionalProducer::init(client, txn)
            .await
            .map_err(|source| SnapshotError::Acquire { partition, source })?;
        let acquired_in = began.elapsed();
        tracing::info!(
            partition,
            transactional_id = %config.transactional_id(partition),
            ?acquired_in,
            "snapshot partition acquired: the previous owner's producer is fenced and its open transaction aborted"
        );
        let (assigned_offset, learned) = match start.await {
            Ok(o) => o,
            Err(e) => {
                producer.close().await;
                return Err(e);
            }
        };
        let runner = ProducerRunner::new(
            producer,
            Arc::from(config.snapshot_topic.as_str()),
            partition,
            input.clone(),
        );
        let stream_times = Arc::clone(&runner.stream_times);
        let inputs = Arc::clone(&runner.inputs);
        let commits = GroupCommit::new(
            partition,
            runner,
            metadata,
            assigned_offset,
            config.max_writes_per_transaction,
            config.max_queued_writes,
        )?
        .with_max_bytes(config.max_bytes_per_transaction);
        let store = SnapshotStore {
            config,
            partition,
            commits,
            acquired_in,
            stream_times,
            inputs,
        };
        Ok((store, learned))
    }

    /// The snapshot (= input) partition.
    pub fn partition(&self) -> i32 {
        self.partition
    }

    /// How long the producer's initialisation (the takeover) took.
    pub fn acquired_in(&self) -> Duration {
        self.acquired_in
    }

    /// The configuration.
    pub fn config(&self) -> &SnapshotConfig {
        &self.config
    }

    /// The input offset the last successful transaction committed (the assigned offset before any).
    pub fn committed_offset(&self) -> i64 {
        self.commits.committed_offset()
    }

    /// How many transactions the store has begun (committed, failed or in flight). A burst of writes
    /// issued together runs as ceil(writes / `max_writes_per_transaction`) of them.
    pub fn transactions(&self) -> u64 {
        self.commits.transactions()
    }

    /// Writes a snapshot (`Some`) or deletes the key (`None`), and waits until the transaction carrying it
    /// committed, fenced by the consumer's generation. Writes queued while a transaction is producing
    /// join it, up to `max_writes_per_transaction`; with `max_queued_writes` already waiting, this waits
    /// for room first ([`try_write`](Self::try_write) fails instead).
    ///
    /// Cancel safety: dropping the future may or may not withdraw the write: once queued, it rides in a
    /// transaction regardless, and only its outcome is lost to the caller.
    pub async fn write(&self, key: Bytes, value: Option<Bytes>) -> Result<(), SnapshotError> {
        self.commits.write(key, value).await
    }

    /// Commits `offset` as the input partition's committable offset, and waits until a transaction has
    /// committed it. It rides with the writes queued before it (joining the open transaction if all of
    /// them are in it); with none queued it is an offset-only transaction. It never rides in a
    /// transaction that leaves a write queued before it behind, and it fails if such a write's
    /// transaction failed. The committed offset never moves backwards.
    ///
    /// Cancel safety: as [`write`](Self::write).
    pub async fn commit_offset(&self, offset: i64) -> Result<(), SnapshotError> {
        self.commits.commit_offset(offset).await
    }

    /// [`commit_offset`](Self::commit_offset), with the committed offset's metadata carrying
    /// `stream_time` (the stream time just before `offset`; see
    /// [`TimerClock::Stream`](crate::snapshot::TimerClock::Stream)). Every later transaction that
    /// commits this offset again carries it too.
    pub(crate) async fn commit_offset_at(
        &self,
        offset: i64,
        stream_time: Option<i64>,
    ) -> Result<(), SnapshotError> {
        if let Some(st) = stream_time {
            self.stream_times.note(offset, st);
        }
        self.commits.commit_offset(offset).await
    }

    /// A flow with several inputs: the other inputs' partitions (in the flow's order) and the offsets
    /// of every input the partition was assigned at. Commits then carry every input's offset.
    pub(crate) fn set_more_inputs(&self, more: Vec<TopicPartition>, assigned: Vec<i64>) {
        self.inputs
            .set_inputs(more, self.committed_offset(), assigned);
    }

    /// [`commit_offset_at`](Self::commit_offset_at) of a flow with several inputs: `offset` is the
    /// partition's coordinate on the merge, `inputs` the offset of every input it stands for.
    pub(crate) async fn commit_offsets_at(
        &self,
        offset: i64,
        inputs: Vec<i64>,
        stream_time: Option<i64>,
    ) -> Result<(), SnapshotError> {
        self.inputs.note(offset, inputs);
        self.commit_offset_at(offset, stream_time).await
    }

    /// Like [`write`](Self::write) but fails at once, handing the write back, when the queue is full.
    /// The write is queued before this returns; the future is its outcome.
    pub fn try_write(
        &self,
        key: Bytes,
        value: Option<Bytes>,
    ) -> Result<
        impl std::future::Future<Output = Result<(), SnapshotError>> + Send + 'static,
        TryWriteError,
    > {
        self.commits.try_write(key, value)
    }

    /// [`try_write`](Self::try_write) of a snapshot write with the outputs that commit with it.
    pub(crate) fn try_enqueue(
        &self,
        entry: Entry,
    ) -> Result<
        impl std::future::Future<Output = Result<(), SnapshotError>> + Send + 'static,
        TryEnqueueError,
    > {
        self.commits.try_enqueue(entry)
    }

    /// Stops accepting writes and waits for the transaction in flight. The producer is closed with it.
    ///
    /// Cancel-safe: the store refuses writes from the first poll on; dropping the future only stops
    /// the wait, and the transaction in flight ends on its own.
    pub async fn close(self) {
        self.commits.close().await;
    }
}
