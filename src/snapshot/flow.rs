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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::task::JoinSet;

use super::error::SnapshotError;
use super::group_commit::MetadataSource;
use super::log::PartitionLog;
use super::recovery::{recover, RecoveryConfig};
use super::store::{SnapshotConfig, SnapshotStore};
use super::topic::{self, MissingSnapshotTopic, SnapshotTopicError};
use crate::consumer::{
    commit_offsets, committed_offsets, list_offsets, ConsumerError, GroupConsumer,
    GroupConsumerConfig, GroupMetadataHandle, LostReason, OffsetReset, OffsetSpec,
    PartitionRecords, RebalanceListener, TopicPartition,
};
use crate::net::Client;
use crate::producer::{Producer, ProducerConfig, ProducerError, ProducerRecord};
use crate::records::{IsolationLevel, Record};

/// A boxed error from user code (decoding a snapshot).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The application's fold: per-key state, events in, new state out, and the state's snapshot encoding.
///
/// The flow calls [`fold`](Fold::fold) once per input event, in offset order within a partition, with
/// the key's current state. It persists [`encode`](Fold::encode)d states as snapshots (inside an
/// envelope that also records the key's last folded offset) and [`decode`](Fold::decode)s them when a
/// partition is recovered; a snapshot that does not decode stops the flow with
/// [`FlowError::BadSnapshot`], so keep `decode` able to read every encoding you ever wrote.
///
/// Events with a null key are not folded: state is per key, and a null key names none. They are skipped
/// (their offsets still advance the partition, so they are not re-read) and counted in
/// [`Flow::null_key_events`]; the first one is logged at warn level.
///
/// `fold` must be deterministic: an event may be folded again after a crash (into the state recovered
/// from before it), and must produce the same state.
///
/// ```
/// use snapfence::records::Record;
/// use snapfence::snapshot::{BoxError, Fold};
/// use snapfence::Bytes;
///
/// /// Account balances: each event's value is a signed amount in ASCII ("+25", "-10").
/// struct Balances;
///
/// impl Fold for Balances {
///     type State = i64;
///
///     fn fold(&self, _account: &Bytes, balance: Option<i64>, event: &Record) -> i64 {
///         let amount = event
///             .value
///             .as_ref()
///             .and_then(|v| std::str::from_utf8(v).ok())
///             .and_then(|v| v.parse::<i64>().ok())
///             .unwrap_or(0); // a malformed event changes nothing
///         balance.unwrap_or(0) + amount
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
    /// Folds one input event into the key's state (`None` before the key's first event).
    fn fold(&self, key: &Bytes, state: Option<Self::State>, event: &Record) -> Self::State;
    /// Encodes a state as snapshot bytes.
    fn encode(&self, state: &Self::State) -> Bytes;
    /// Decodes snapshot bytes written by [`Fold::encode`].
    fn decode(&self, bytes: &[u8]) -> Result<Self::State, BoxError>;
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
    /// `true` when the group coordinator fenced this owner: it is stale and must stop.
    pub fn is_fenced(&self) -> bool {
        match self {
            FlowError::Snapshot(e) => e.is_fenced(),
            FlowError::Consumer(ConsumerError::CommitFenced { .. }) => true,
            _ => false,
        }
    }

    /// `true` when the partition's producer was fenced by a newer epoch on its transactional id (see
    /// [`SnapshotError::is_producer_fenced`]): this owner must stop writing the partition.
    pub fn is_producer_fenced(&self) -> bool {
        matches!(self, FlowError::Snapshot(e) if e.is_producer_fenced())
    }
}

const ENVELOPE_V1: u8 = 1;

/// `[version u8][last folded offset i64 BE][user bytes]`.
fn envelope(offset: i64, payload: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(9 + payload.len());
    b.put_u8(ENVELOPE_V1);
    b.put_i64(offset);
    b.put_slice(payload);
    b.freeze()
}

fn open_envelope(bytes: &[u8]) -> Result<(i64, &[u8]), String> {
    match bytes {
        [ENVELOPE_V1, rest @ ..] if rest.len() >= 8 => {
            let (off, payload) = rest.split_at(8);
            let mut o = [0u8; 8];
            o.copy_from_slice(off);
            Ok((i64::from_be_bytes(o), payload))
        }
        [v, ..] if *v != ENVELOPE_V1 => Err(format!("unknown snapshot envelope version {v}")),
        _ => Err("snapshot shorter than its envelope".into()),
    }
}

struct KeyState<S> {
    state: S,
    /// The offset of the last event folded in; replayed events at or below it are skipped.
    last_offset: i64,
    /// The first event folded since the last persisted snapshot, if any: the key holds the committable
    /// offset at or below it.
    held: Option<i64>,
}

enum Writer {
    Fenced(Arc<SnapshotStore>),
    Plain(Arc<Producer>),
}

struct PartitionFlow<S> {
    writer: Writer,
    keys: HashMap<Bytes, KeyState<S>>,
    /// The next input offset to fold.
    position: i64,
}

impl<S> PartitionFlow<S> {
    fn committable(&self) -> i64 {
        self.keys
            .values()
            .filter_map(|k| k.held)
            .fold(self.position, i64::min)
    }
}

struct Shared<F: Fold> {
    fold: Arc<F>,
    client: Client,
    config: FlowConfig,
    metadata: Mutex<Option<GroupMetadataHandle>>,
    plain: Option<Arc<Producer>>,
    partitions: tokio::sync::Mutex<BTreeMap<i32, PartitionFlow<F::State>>>,
    /// The first error a rebalance handler hit; the poll loop returns it.
    failure: Mutex<Option<FlowError>>,
    /// Input events skipped for having no key.
    null_keys: AtomicU64,
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

    fn metadata_source(&self) -> Arc<dyn MetadataSource> {
        let handle = self
            .metadata
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        match handle {
            Some(h) => Arc::new(h),
            None => Arc::new(|| None),
        }
    }

    /// The offset `tp` is assigned at, and whether the group had none committed (then the caller commits
    /// it, see [`FlowConfig`]): the group's committed offset, else per `initial_offset`. This is the
    /// only place that decides where a partition without a committed offset starts.
    async fn assigned_offset(&self, tp: &TopicPartition) -> Result<(i64, bool), FlowError> {
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
                        }
                        .into())
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

    async fn acquire(&self, tp: &TopicPartition) -> Result<PartitionFlow<F::State>, FlowError> {
        let (writer, (assigned_offset, fresh)) = match (self.config.mode, &self.plain) {
            (PersistenceMode::NonTransactional, Some(p)) => (
                Writer::Plain(Arc::clone(p)),
                self.assigned_offset(tp).await?,
            ),
            _ => {
                // Take the partition over first, then read its committed offset: a crashed owner's open
                // transaction may hold a pending offset commit, and the stable read waits for it until
                // the takeover aborts it (see SnapshotStore::acquire_then).
                let partition = tp.partition;
                let fresh = std::sync::atomic::AtomicBool::new(false);
                let offset = async {
                    let (offset, was_fresh) =
                        self.assigned_offset(tp)
                            .await
                            .map_err(|e| SnapshotError::Io {
                                partition,
                                source: Arc::new(e),
                            })?;
                    fresh.store(was_fresh, Ordering::Relaxed);
                    Ok(offset)
                };
                let store = SnapshotStore::acquire_then(
                    self.client.clone(),
                    self.config.snapshots.clone(),
                    tp.clone(),
                    self.metadata_source(),
                    offset,
                )
                .await?;
                let offset = store.committed_offset();
                (
                    Writer::Fenced(Arc::new(store)),
                    (offset, fresh.load(Ordering::Relaxed)),
                )
            }
        };
        // Eager recovery: every key of the partition, before any event is folded.
        let mut log = PartitionLog::new(
            self.client.clone(),
            &self.config.snapshots.snapshot_topic,
            tp.partition,
        );
        let recovery = RecoveryConfig {
            stall_timeout: match self.config.mode {
                PersistenceMode::Transactional => self.config.snapshots.recovery_stall_timeout,
                PersistenceMode::NonTransactional => None,
            },
            ..RecoveryConfig::default()
        };
        let (recovered, stats) = recover(&mut log, tp.partition, &recovery).await?;
        let mut keys = HashMap::with_capacity(recovered.len());
        for (key, value) in &recovered {
            let key = Bytes::copy_from_slice(key);
            let bad = |reason: String| FlowError::BadSnapshot {
                partition: tp.partition,
                key: key.clone(),
                reason,
            };
            let (last_offset, payload) = open_envelope(value).map_err(bad)?;
            let state = self.fold.decode(payload).map_err(|e| bad(e.to_string()))?;
            keys.insert(
                key,
                KeyState {
                    state,
                    last_offset,
                    held: None,
                },
            );
        }
        tracing::info!(partition = tp.partition, keys = keys.len(), ?stats.elapsed, assigned_offset, fresh, "partition recovered");
        let flow = PartitionFlow {
            writer,
            keys,
            position: assigned_offset,
        };
        if fresh {
            // Record the start for the group before anything is fetched: the consumer starts the
            // partition at the committed offset, so it now reads from exactly where this flow
            // counts from, and a restart before the first periodic commit starts there again
            // instead of re-resolving "earliest" or "latest" against a log that has moved.
            if let Err(e) = self.commit(tp, &flow).await {
                if let Writer::Fenced(store) = flow.writer {
                    if let Ok(store) = Arc::try_unwrap(store) {
                        store.close().await;
                    }
                }
                return Err(e);
            }
        }
        Ok(flow)
    }

    /// Persists every dirty key of `flow`, concurrently, so the group commit batches them.
    async fn persist(
        &self,
        partition: i32,
        flow: &mut PartitionFlow<F::State>,
    ) -> Result<(), FlowError> {
        let dirty: Vec<(Bytes, Bytes)> = flow
            .keys
            .iter()
            .filter(|(_, k)| k.held.is_some())
            .map(|(key, k)| {
                (
                    key.clone(),
                    envelope(k.last_offset, &self.fold.encode(&k.state)),
                )
            })
            .collect();
        if dirty.is_empty() {
            return Ok(());
        }
        match &flow.writer {
            Writer::Fenced(store) => {
                let mut set = JoinSet::new();
                for (key, value) in dirty.iter().cloned() {
                    let store = Arc::clone(store);
                    set.spawn(async move { store.write(key, Some(value)).await });
                }
                let mut first_err = None;
                while let Some(r) = set.join_next().await {
                    let r = r.unwrap_or_else(|e| {
                        Err(SnapshotError::Io {
                            partition,
                            source: Arc::new(e),
                        })
                    });
                    if let Err(e) = r {
                        first_err.get_or_insert(e);
                    }
                }
                if let Some(e) = first_err {
                    return Err(e.into());
                }
            }
            Writer::Plain(producer) => {
                let mut deliveries = Vec::with_capacity(dirty.len());
                for (key, value) in dirty.iter().cloned() {
                    let record = ProducerRecord::new(
                        self.config.snapshots.snapshot_topic.as_str(),
                        Some(value),
                    )
                    .key(key)
                    .partition(partition);
                    deliveries.push(producer.send(record).await?);
                }
                for d in deliveries {
                    d.await?;
                }
            }
        }
        for (key, _) in dirty {
            if let Some(k) = flow.keys.get_mut(&key) {
                k.held = None;
            }
        }
        Ok(())
    }

    async fn commit(
        &self,
        tp: &TopicPartition,
        flow: &PartitionFlow<F::State>,
    ) -> Result<(), FlowError> {
        let offset = flow.committable();
        match &flow.writer {
            Writer::Fenced(store) => store.commit_offset(offset).await?,
            Writer::Plain(_) => {
                let handle = self
                    .metadata
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone();
                let token = handle
                    .ok_or(SnapshotError::MissingGroupMetadata {
                        partition: tp.partition,
                    })?
                    .require()?;
                commit_offsets(
                    &self.client,
                    &token,
                    &BTreeMap::from([(tp.clone(), offset)]),
                )
                .await?;
            }
        }
        Ok(())
    }

    async fn release(&self, tp: &TopicPartition, flush: bool) {
        let flow = self.partitions.lock().await.remove(&tp.partition);
        let Some(mut flow) = flow else { return };
        if flush {
            let persisted = self.persist(tp.partition, &mut flow).await;
            let committed = match persisted {
                Ok(()) => self.commit(tp, &flow).await,
                Err(e) => Err(e),
            };
            if let Err(e) = committed {
                tracing::warn!(partition = tp.partition, error = %e, "flush on revoke failed");
                self.fail(e);
            }
        }
        if let Writer::Fenced(store) = flow.writer {
            if let Ok(store) = Arc::try_unwrap(store) {
                store.close().await;
            }
        }
    }
}

/// The rebalance listener that builds and tears down partition flows.
struct Listener<F: Fold>(Arc<Shared<F>>);

impl<F: Fold> RebalanceListener for Listener<F> {
    async fn on_partitions_assigned(&mut self, partitions: &[TopicPartition]) {
        for tp in partitions {
            if self.0.partitions.lock().await.contains_key(&tp.partition) {
                continue;
            }
            match self.0.acquire(tp).await {
                Ok(flow) => {
                    self.0.partitions.lock().await.insert(tp.partition, flow);
                }
                Err(e) => {
                    tracing::warn!(partition = tp.partition, error = %e, "acquiring a partition failed");
                    self.0.fail(e);
                }
            }
        }
    }

    /// Synchronous teardown: flush, commit, close, before the group may hand the partition on.
    async fn on_partitions_revoked(&mut self, partitions: &[TopicPartition]) {
        for tp in partitions {
            self.0.release(tp, true).await;
        }
    }

    /// Lost (evicted or fenced): another member may own these already; writing would be fenced (or, in the
    /// unfenced mode, corrupt), so nothing is flushed.
    async fn on_partitions_lost(&mut self, partitions: &[TopicPartition], reason: LostReason) {
        tracing::warn!(
            ?reason,
            ?partitions,
            "partitions lost without revocation; dropping their flows unflushed"
        );
        for tp in partitions {
            self.0.release(tp, false).await;
        }
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
/// # use snapfence::snapshot::{BoxError, Fold};
/// # use snapfence::Bytes;
/// # struct Balances;
/// # impl Fold for Balances {
/// #     type State = i64;
/// #     fn fold(&self, _: &Bytes, s: Option<i64>, _: &Record) -> i64 { s.unwrap_or(0) + 1 }
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
/// // fenced (stale) owner stops with an error for which `FlowError::is_fenced` is true.
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
        topic::ensure(
            &client,
            &config.snapshots.snapshot_topic,
            &config.input_topic,
            config.missing_snapshot_topic,
        )
        .await?;
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
            partitions: tokio::sync::Mutex::new(BTreeMap::new()),
            failure: Mutex::new(None),
            null_keys: AtomicU64::new(0),
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
        self.shared
            .partitions
            .lock()
            .await
            .keys()
            .copied()
            .collect()
    }

    /// One poll: runs rebalance handlers (recovery on assignment, flush on revocation), then folds the
    /// events fetched. Returns how many events were folded.
    ///
    /// It neither persists nor commits (only a revocation inside it flushes the revoked partitions):
    /// `persist_every` and `commit_offsets_interval` apply only inside [`run`](Self::run). A loop built
    /// on `poll_once` calls [`persist`](Self::persist) and [`commit`](Self::commit) when it chooses.
    ///
    /// Cancel safety: as the consumer's `poll`; events already returned are folded before this returns.
    pub async fn poll_once(&mut self, timeout: Duration) -> Result<usize, FlowError> {
        let batches = self.poll_consumer(timeout).await?;
        self.fold_batches(batches).await
    }

    /// The consumer's poll, with a rebalance handler's failure preferred over the consumer error it
    /// causes (a partition whose acquisition failed shows up as the consumer's NoCommittedOffset).
    async fn poll_consumer(
        &mut self,
        timeout: Duration,
    ) -> Result<Vec<PartitionRecords>, FlowError> {
        match self.consumer.poll(timeout).await {
            Ok(batches) => Ok(batches),
            Err(e) => Err(self.shared.take_failure().unwrap_or(e.into())),
        }
    }

    /// How many input events this flow skipped because they had no key (see [`Fold`]).
    pub fn null_key_events(&self) -> u64 {
        self.shared.null_keys.load(Ordering::Relaxed)
    }

    /// Folds fetched events into their keys' state, after surfacing any failure of a rebalance handler.
    async fn fold_batches(&self, batches: Vec<PartitionRecords>) -> Result<usize, FlowError> {
        if let Some(e) = self.shared.take_failure() {
            return Err(e);
        }
        let mut folded = 0;
        let mut flows = self.shared.partitions.lock().await;
        for batch in batches {
            let Some(flow) = flows.get_mut(&batch.partition.partition) else {
                continue;
            };
            for event in &batch.records {
                flow.position = flow.position.max(event.offset + 1);
                let Some(key) = &event.key else {
                    if self.shared.null_keys.fetch_add(1, Ordering::Relaxed) == 0 {
                        tracing::warn!(
                            partition = batch.partition.partition,
                            offset = event.offset,
                            "skipping input events with a null key: a fold is per key (counted in \
                             Flow::null_key_events)"
                        );
                    }
                    continue;
                };
                match flow.keys.get_mut(key) {
                    // Already folded into the recovered snapshot: replay after a takeover skips it.
                    Some(k) if event.offset <= k.last_offset => {}
                    Some(k) => {
                        k.state = self.shared.fold.fold(key, Some(k.state.clone()), event);
                        k.last_offset = event.offset;
                        k.held.get_or_insert(event.offset);
                        folded += 1;
                    }
                    None => {
                        let state = self.shared.fold.fold(key, None, event);
                        flow.keys.insert(
                            key.clone(),
                            KeyState {
                                state,
                                last_offset: event.offset,
                                held: Some(event.offset),
                            },
                        );
                        folded += 1;
                    }
                }
            }
            flow.position = flow.position.max(batch.next_offset);
        }
        Ok(folded)
    }

    /// Persists every key folded since its last snapshot, in every held partition (concurrently per
    /// partition, so the group commit batches them). In the transactional mode each write is fenced by
    /// the group generation; a stale owner gets an error for which [`FlowError::is_fenced`] is true.
    ///
    /// Not cancel-safe in outcome: if dropped, some snapshots may have been written; they are written
    /// again by the next call.
    pub async fn persist(&self) -> Result<(), FlowError> {
        let mut flows = self.shared.partitions.lock().await;
        for (p, flow) in flows.iter_mut() {
            self.shared.persist(*p, flow).await?;
        }
        Ok(())
    }

    /// Commits every held partition's committable offset: the first event not yet in a persisted
    /// snapshot, so a commit never passes state that exists only in memory. Call
    /// [`persist`](Self::persist) first to move it as far as the folding went.
    ///
    /// Not cancel-safe in outcome: if dropped, the commit may or may not have happened.
    pub async fn commit(&self) -> Result<(), FlowError> {
        let flows = self.shared.partitions.lock().await;
        for (p, flow) in flows.iter() {
            let tp = TopicPartition::new(self.shared.config.input_topic.as_str(), *p);
            self.shared.commit(&tp, flow).await?;
        }
        Ok(())
    }

    /// The current state of every key of `partition`, if held.
    pub async fn state(&self, partition: i32) -> Option<HashMap<Bytes, F::State>> {
        let flows = self.shared.partitions.lock().await;
        flows.get(&partition).map(|f| {
            f.keys
                .iter()
                .map(|(k, s)| (k.clone(), s.state.clone()))
                .collect()
        })
    }

    /// The next input offset of `partition` this flow will fold (the assigned offset until events arrive),
    /// if held: how a caller knows the flow has caught up with an input end it read elsewhere.
    pub async fn position(&self, partition: i32) -> Option<i64> {
        let flows = self.shared.partitions.lock().await;
        flows.get(&partition).map(|f| f.position)
    }

    /// Polls, persisting every `persist_every` and committing every `commit_offsets_interval`, until
    /// `stop` completes or an error (a fence stops a stale owner here). Then [`close`](Self::close)s the
    /// flow; the loop's error, if any, is returned before close's.
    ///
    /// Not cancel-safe: dropping the future is dropping the flow (see [`Flow`]).
    pub async fn run(
        mut self,
        stop: impl std::future::Future<Output = ()>,
    ) -> Result<(), FlowError> {
        tokio::pin!(stop);
        let mut persist = tokio::time::interval(self.shared.config.persist_every);
        let mut commit = tokio::time::interval(self.shared.config.commit_offsets_interval);
        persist.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        commit.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let result = loop {
            tokio::select! {
                biased;
                _ = &mut stop => break Ok(()),
                _ = persist.tick() => {
                    if let Err(e) = self.persist().await { break Err(e) }
                }
                _ = commit.tick() => {
                    if let Err(e) = self.persist().await { break Err(e) }
                    if let Err(e) = self.commit().await { break Err(e) }
                }
                r = self.poll_consumer(Duration::from_millis(200)) => {
                    let folded = match r {
                        Ok(batches) => self.fold_batches(batches).await,
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
    /// The rule: every held partition is flushed as on a revocation — every key folded since its last
    /// snapshot is persisted, then the partition's committable offset is committed (which, after that
    /// persist, is the position: everything folded is durable), then its snapshot producer is closed.
    /// Then the member leaves (LeaveGroup under the classic protocol, a leave heartbeat under KIP-848;
    /// a static member, `group_instance_id` set, does not leave and keeps its partitions until its
    /// session expires), waiting at most 10 s for the coordinator, and the unfenced mode's shared
    /// producer is flushed and closed. Events fetched but not yet folded are not folded.
    ///
    /// The leave happens even when a flush fails; the first flush failure is returned (a stale owner's
    /// flush is refused by the fence, and nothing of it lands). Partitions lost before the close are not
    /// flushed: another member may own them already.
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

    /// The envelope carries the last folded offset so replay never double-folds; a foreign or truncated
    /// value is a typed error, not a panic.
    #[test]
    fn envelope_round_trips_and_rejects_garbage() {
        let e = envelope(42, b"state");
        assert_eq!(open_envelope(&e).unwrap(), (42, &b"state"[..]));
        assert!(open_envelope(b"").is_err());
        assert!(open_envelope(&[1, 0, 0]).is_err());
        assert!(open_envelope(&[9, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
    }
}
