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
//! What a fold emits ([`Outputs`](super::Outputs)) rides in the transaction of the key's next snapshot,
//! so it commits exactly once in the fenced modes (docs/fencing.md, "Outputs").
//!
//! # References
//! - KIP-447 (the fence), seed design "Kafka single-writer design"

mod acquire;
mod handle;
mod lane;
mod local;
mod merge;
mod shared;
mod writer;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

pub use self::handle::{
    FlowClosed, FlowHandle, Lookup, LookupError, PartitionReadiness, Readiness,
};
use self::lane::{commit_lane, each_lane, emit_immediate, persist_lane, CommitWhen, FlowLane};
pub use self::local::{DiskState, DiskStats, StateConfig};
use self::merge::Step;
use self::shared::{Listener, MarkClosed, ReadyState, Shared};
use self::writer::Sink;
use super::error::{FailureKind, Response, SnapshotError};
use super::fence_core::{FenceCore, FencePolicy, FlowStats, Site};
use super::fold::{Clock, Fold, SystemClock};
use super::fold_core::Folded;
use super::recovery::RecoveryConfig;
use super::shared_log::SharedLogs;
use super::store::SnapshotConfig;
use super::topic::{self, MissingSnapshotTopic, SnapshotTopicError};
use crate::consumer::{
    ConsumerError, GroupConsumer, GroupConsumerConfig, GroupMetadataHandle, OffsetReset,
    PartitionRecords, ReaderConfig, StartAt, TopicPartition,
};
use crate::net::Client;
use crate::producer::ProducerError;
use crate::records::{IsolationLevel, Record};

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
    /// Further input topics, co-partitioned with `input_topic` (default none). Partition N of every
    /// input belongs to the same keys and the same snapshot partition: their events are merged into
    /// one sequence per partition (by record timestamp, ties in this order after `input_topic`) and
    /// folded into one state, and one transaction commits every input's offset (docs/fencing.md,
    /// "Several inputs"). [`Flow::start`] checks the inputs' partition counts and refuses an assignment
    /// that could split partition N of two inputs between members: the classic protocol needs
    /// [`Assignor::Range`](crate::consumer::Assignor::Range) alone, the KIP-848 protocol the server's
    /// `range` assignor. The order is part of every snapshot's envelope: changing it, or the number of
    /// inputs, needs every member stopped and the snapshots reset (`snapfence reset`). Not available on
    /// the PostgreSQL store yet.
    pub more_input_topics: Vec<String>,
    /// The snapshot store settings. [`Flow::start`] checks the snapshot topic: it must exist (see
    /// [`missing_snapshot_topic`](Self::missing_snapshot_topic)), be compacted, and have the input's
    /// partition count.
    pub snapshots: SnapshotConfig,
    /// Fenced or not.
    pub mode: PersistenceMode,
    /// Where the per-key state lives: in memory, read whole from the snapshot partition at every
    /// acquisition (the default), or with the `disk-state` feature in an image per partition on local
    /// disk whose checkpoint lets an acquisition read only what was written since
    /// (`StateConfig::Disk`, docs/fencing.md "On-disk state"). The snapshot topic stays the truth
    /// either way: an image that cannot be trusted is discarded and the partition read whole. Not
    /// available on the PostgreSQL store.
    pub state: StateConfig,
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
    /// Bytes of outputs (see [`Outputs`](super::Outputs)) one partition may hold in memory before it
    /// is persisted early, ahead of [`persist_every`](Self::persist_every): outputs ride with their
    /// keys' snapshots, so until a persist they are held. Default 16 MiB.
    pub max_output_bytes_per_partition: usize,
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
    /// Every input topic, `input_topic` first, in the order the merge breaks timestamp ties by.
    pub fn input_topics(&self) -> Vec<String> {
        std::iter::once(self.input_topic.clone())
            .chain(self.more_input_topics.iter().cloned())
            .collect()
    }

    /// Places the flow in `rack` (an availability zone): its input fetches and recovery reads go to
    /// the same-rack replica the leader names (KIP-392, `ReaderConfig::client_rack`), and the group
    /// learns the rack for rack-aware assignment (`GroupConfig::rack_id`).
    pub fn set_rack(&mut self, rack: impl Into<String>) {
        let rack = rack.into();
        self.consumer.reader.client_rack = Some(rack.clone());
        self.recovery_reader.client_rack = Some(rack.clone());
        self.consumer.group.rack_id = Some(rack);
    }

    /// Defaults for a flow over `input_topic` in `consumer`'s group, persisting to `snapshots`.
    pub fn new(
        consumer: GroupConsumerConfig,
        input_topic: impl Into<String>,
        snapshots: SnapshotConfig,
    ) -> Self {
        FlowConfig {
            consumer,
            input_topic: input_topic.into(),
            more_input_topics: Vec::new(),
            snapshots,
            mode: PersistenceMode::Transactional,
            state: StateConfig::Memory,
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
            max_output_bytes_per_partition: 16 << 20,
            #[cfg(feature = "postgres")]
            postgres: None,
        }
    }
}

/// Refuses a flow with several inputs whose assignment could split partition N of two inputs between
/// members (both would then take `<prefix>-N` over and pass the generation fence), too many inputs, or
/// an input named twice.
fn check_co_partitioning(config: &FlowConfig) -> Result<(), SnapshotError> {
    use crate::consumer::{Assignor, GroupProtocol};
    let bad = |why: String| Err(SnapshotError::Config(why));
    let topics = config.input_topics();
    if topics.len() > crate::snapshot::fold_core::MAX_INPUTS {
        return bad(format!(
            "a flow folds at most {} input topics",
            crate::snapshot::fold_core::MAX_INPUTS
        ));
    }
    let distinct: std::collections::BTreeSet<&String> = topics.iter().collect();
    if distinct.len() != topics.len() {
        return bad(format!("an input topic is named twice in {topics:?}"));
    }
    match &config.consumer.group.protocol {
        GroupProtocol::Classic { assignors } if assignors[..] == [Assignor::Range] => Ok(()),
        GroupProtocol::Classic { assignors } => bad(format!(
            "several input topics need an assignment that gives partition N of every input to one \
             member: the classic protocol's assignors must be [Assignor::Range] alone, not \
             {assignors:?} (cooperative-sticky and round-robin place each topic's partitions on \
             their own)"
        )),
        GroupProtocol::Consumer { server_assignor }
            if server_assignor.as_deref() == Some("range") =>
        {
            Ok(())
        }
        GroupProtocol::Consumer { server_assignor } => bad(format!(
            "several input topics need an assignment that gives partition N of every input to one \
             member: under the KIP-848 protocol ask for the server's \"range\" assignor, not {:?} \
             (\"uniform\", the default, places each topic's partitions on their own)",
            server_assignor.as_deref().unwrap_or("the broker's default")
        )),
    }
}

/// The most records a merge keeps buffered per input while it waits for another input.
const MAX_MERGE_BUFFER: usize = 20_000;

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
    /// The on-disk state of a partition could not be read or written (the `disk-state` feature). A
    /// corrupt image never gets here: it is discarded and the partition read whole.
    #[cfg(feature = "disk-state")]
    #[error("partition {partition}: {source}")]
    State {
        /// The partition.
        partition: i32,
        /// What failed.
        #[source]
        source: Arc<crate::snapshot::disk::StateError>,
    },
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
/// # use snapfence::snapshot::{BoxError, Change, Fold, Outputs};
/// # use snapfence::Bytes;
/// # struct Balances;
/// # impl Fold for Balances {
/// #     type State = i64;
/// #     fn fold(&self, _: &Bytes, s: &mut Option<i64>, _: &Record, _out: &mut Outputs) -> Change {
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
    /// Tells handles the flow is gone when it is closed or dropped.
    _closed: MarkClosed<F>,
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
        if !config.more_input_topics.is_empty() {
            check_co_partitioning(&config)?;
        }
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
        if !config.more_input_topics.is_empty() {
            topic::check_more_inputs(&client, &config.input_topic, &config.more_input_topics)
                .await?;
        }
        let sink = Sink::new(&client, &config).await?;
        // For lookups' default partition; the snapshot topic check above read it too (and it is cached).
        let input_partitions = client
            .metadata(&[config.input_topic.as_str()])
            .await
            .ok()
            .and_then(|m| {
                m.topics
                    .get(config.input_topic.as_str())
                    .map(|t| t.partitions.len())
            })
            .and_then(|n| i32::try_from(n).ok())
            .unwrap_or(0);
        let shared = Arc::new(Shared {
            fold: Arc::new(fold),
            client: client.clone(),
            config: config.clone(),
            metadata: Mutex::new(None),
            sink,
            lanes: Mutex::new(BTreeMap::new()),
            failure: Mutex::new(None),
            null_keys: AtomicU64::new(0),
            fence: Mutex::new(FenceCore::new(config.fence_policy)),
            recovery_reads: SharedLogs::new(
                client.clone(),
                &config.snapshots.snapshot_topic,
                config.recovery_reader.clone(),
            ),
            assigned: Mutex::new(Default::default()),
            ready: tokio::sync::watch::Sender::new(ReadyState::Unready),
            ready_partitions: AtomicUsize::new(0),
            input_partitions: AtomicI32::new(input_partitions),
            disk_stats: Mutex::new(DiskStats::default()),
            #[cfg(feature = "disk-state")]
            warm: Mutex::new(HashMap::new()),
        });
        crate::telemetry::flow_readiness(&config.consumer.group.group_id, false, 0);
        let consumer = GroupConsumer::subscribe(
            client,
            config.consumer.clone(),
            config.input_topics(),
            Listener(Arc::clone(&shared)),
        )
        .await?;
        *shared.metadata.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(consumer.group_metadata());
        let _closed = MarkClosed(Arc::clone(&shared));
        Ok(Flow {
            shared,
            consumer,
            _closed,
        })
    }

    /// A handle for readiness, lookups and counters, usable from other tasks while [`run`](Self::run)
    /// owns the flow (a Kubernetes readiness probe, a query endpoint). See [`FlowHandle`].
    pub fn handle(&self) -> FlowHandle<F> {
        FlowHandle {
            shared: Arc::clone(&self.shared),
        }
    }

    /// The live group metadata this flow binds into every commit.
    pub fn group_metadata(&self) -> GroupMetadataHandle {
        self.consumer.group_metadata()
    }

    /// The partitions this flow currently holds.
    pub fn partitions(&self) -> Vec<i32> {
        self.shared.held_partitions()
    }

    /// One poll: runs rebalance handlers (recovery on assignment, flush on revocation), then folds the
    /// events fetched. Returns how many events were folded.
    ///
    /// It neither persists, commits nor fires timers (only a revocation inside it flushes the revoked
    /// partitions, and a partition whose held outputs reached
    /// [`FlowConfig::max_output_bytes_per_partition`] is persisted): `persist_every`, `commit_offsets_interval` and `timer_every` apply only inside
    /// [`run`](Self::run). A loop built on `poll_once` calls [`persist`](Self::persist),
    /// [`commit`](Self::commit) and [`tick`](Self::tick) when it chooses.
    ///
    /// Cancel safety: as the consumer's `poll`; events already returned are folded before this returns.
    pub async fn poll_once(&mut self, timeout: Duration) -> Result<usize, FlowError> {
        self.before_poll().await?;
        let batches = self.poll_consumer(timeout).await?;
        let folded = self.fold_batches(batches).await?;
        self.persist_over_budget().await?;
        Ok(folded)
    }

    /// Persists every partition whose held outputs reached
    /// [`FlowConfig::max_output_bytes_per_partition`], so outputs never pile up in memory without
    /// bound between persist intervals.
    async fn persist_over_budget(&self) -> Result<(), FlowError> {
        let budget = self.shared.config.max_output_bytes_per_partition;
        let full: Vec<_> = self
            .shared
            .all_lanes()
            .into_iter()
            .filter(|lane| {
                let core = lane.core();
                core.held_output_bytes() >= budget || core.wants_persist()
            })
            .collect();
        if full.is_empty() {
            return Ok(());
        }
        self.persist_lanes(full).await
    }

    /// Persists `lanes`, each on its own, and settles their failures.
    async fn persist_lanes(&self, lanes: Vec<Arc<FlowLane<F>>>) -> Result<(), FlowError> {
        let fold = Arc::clone(&self.shared.fold);
        let failures = each_lane(
            lanes,
            self.shared.config.max_concurrent_partitions,
            move |lane| {
                let fold = Arc::clone(&fold);
                async move { persist_lane(&*fold, &lane).await }
            },
        )
        .await;
        self.shared.settle(failures, Site::Held).await
    }

    /// The fence handling's counters: spurious fences recovered in place, re-acquisitions, rejoins,
    /// refused revoke-time flushes (see [`FencePolicy`]).
    pub fn stats(&self) -> FlowStats {
        self.shared.fence().stats()
    }

    /// What the on-disk state's acquisitions did: how many resumed from a checkpoint, how many read
    /// the partition whole and why, and how many snapshot records were read into images. All zero with
    /// [`StateConfig::Memory`].
    pub fn disk_stats(&self) -> DiskStats {
        #[allow(unused_mut)]
        let mut stats = self
            .shared
            .disk_stats
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        #[cfg(feature = "disk-state")]
        for lane in self.shared.all_lanes() {
            if let Some(lazy) = lane.core().lazy_stats() {
                stats.keys_loaded += lazy.loaded;
                stats.keys_evicted += lazy.evicted;
                stats.keys_in_memory += lazy.in_memory;
            }
        }
        stats
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
                if self
                    .shared
                    .config
                    .input_topics()
                    .iter()
                    .any(|t| t == partition.topic.as_ref())
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
        let rejoin = self.shared.fence().poll_rejoin();
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
        let plan = self.shared.fence().poll_reacquire(&owned);
        if plan.is_empty() {
            return Ok(());
        }
        let mut again = Vec::new();
        for partition in plan {
            if self.shared.lanes().contains_key(&partition) {
                self.shared.fence().handle_reacquired(partition);
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
                    let positions = lane.core().positions();
                    self.shared.lanes().insert(partition, Arc::new(lane));
                    self.shared.fence().handle_reacquired(partition);
                    // Every input back to where the new lane starts (with several inputs the
                    // merge moves them again before its first batch; see `fold_merged`).
                    for (tp, at) in self
                        .shared
                        .input_partitions(partition)
                        .iter()
                        .zip(positions)
                    {
                        self.consumer.seek(tp, StartAt::Offset(at));
                    }
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
            self.shared.refresh_ready();
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
    ///
    /// In the unfenced mode, what the folds emitted is produced right after each partition's batch (at
    /// least once; see [`Outputs`](crate::snapshot::Outputs)).
    async fn fold_batches(&mut self, batches: Vec<PartitionRecords>) -> Result<usize, FlowError> {
        if let Some(e) = self.shared.take_failure() {
            return Err(e);
        }
        if !self.shared.config.more_input_topics.is_empty() {
            return self.fold_merged(batches).await;
        }
        let mut folded = 0;
        let mut failures = Vec::new();
        for batch in batches {
            let lane = self.shared.lanes().get(&batch.partition.partition).cloned();
            let Some(lane) = lane else { continue };
            let mut from = 0;
            loop {
                let (n, stopped) = self.fold_batch(&lane, &batch, from);
                folded += n;
                if let Err(e) = emit_immediate(&lane).await {
                    failures.push((lane.partition, e));
                }
                // A partition under a memory budget whose changed keys outgrew it persists before
                // folding on, so they become clean and can be dropped.
                let Some(next) = stopped else { break };
                self.persist_lanes(vec![Arc::clone(&lane)]).await?;
                let held = self
                    .shared
                    .lanes()
                    .get(&lane.partition)
                    .is_some_and(|l| Arc::ptr_eq(l, &lane));
                if !held {
                    // The persist's failure dropped the partition; it is acquired again and replays.
                    break;
                }
                from = next;
            }
        }
        if !failures.is_empty() {
            self.shared.settle(failures, Site::Held).await?;
        }
        Ok(folded)
    }

    /// [`fold_batches`](Self::fold_batches) of a flow with several inputs: each batch goes to its
    /// partition's merge, and each lane folds what its merge hands out (docs/fencing.md, "Several
    /// inputs").
    async fn fold_merged(&mut self, batches: Vec<PartitionRecords>) -> Result<usize, FlowError> {
        let topics = self.shared.config.input_topics();
        let lanes = self.shared.all_lanes();
        // A lane acquired in this poll's rebalance handlers starts where its merge starts, and the
        // consumer may stand elsewhere on an input it already held (the KIP-848 protocol hands a
        // partition's inputs over one at a time, and the events of an input whose partner was not
        // assigned yet were fetched and dropped). Move it there, and drop what this poll fetched.
        let mut fresh = BTreeSet::new();
        for lane in &lanes {
            if lane.take_unsynced() {
                let positions = lane.core().positions();
                for (tp, p) in self
                    .shared
                    .input_partitions(lane.partition)
                    .iter()
                    .zip(positions)
                {
                    self.consumer.seek(tp, StartAt::Offset(p));
                }
                fresh.insert(lane.partition);
            }
        }
        let committed_reads =
            self.shared.config.consumer.reader.isolation == IsolationLevel::ReadCommitted;
        for batch in batches {
            let p = batch.partition.partition;
            if fresh.contains(&p) {
                continue;
            }
            let Some(lane) = self.shared.lanes().get(&p).cloned() else {
                continue;
            };
            let topic = batch.partition.topic.as_ref();
            let Some(i) = topics.iter().position(|t| t == topic) else {
                continue;
            };
            let end = if committed_reads && batch.last_stable_offset >= 0 {
                batch.last_stable_offset
            } else {
                batch.high_watermark
            };
            if let Some(mut merge) = lane.merge() {
                merge.handle_batch(i, batch.records, batch.next_offset, end);
            };
        }
        // Invisible records (aborted, markers) and compacted gaps move the consumer's position
        // without a batch.
        for lane in &lanes {
            let tps = self.shared.input_partitions(lane.partition);
            if let Some(mut merge) = lane.merge() {
                for (i, tp) in tps.iter().enumerate() {
                    if let Some(at) = self.consumer.position(tp) {
                        merge.handle_fetched_to(i, at);
                    }
                }
            }
        }
        let mut folded = self.drain_merges(&lanes).await?;
        // An input the merge would pass over (nothing fetched, at its end) whose end was seen before
        // another input's records came is read again: one ListOffsets for all of them, then the
        // merges go on. A record it got meanwhile is then waited for, not overtaken.
        let stale: Vec<(Arc<FlowLane<F>>, usize, TopicPartition)> = lanes
            .iter()
            .flat_map(|lane| {
                let tps = self.shared.input_partitions(lane.partition);
                let stale = lane.merge().map(|m| m.stale_ends()).unwrap_or_default();
                stale
                    .into_iter()
                    .map(|i| (Arc::clone(lane), i, tps[i].clone()))
                    .collect::<Vec<_>>()
            })
            .collect();
        if !stale.is_empty() {
            let tps: Vec<TopicPartition> = stale.iter().map(|(_, _, tp)| tp.clone()).collect();
            let ends = match crate::consumer::list_offsets(
                &self.shared.client,
                &tps,
                crate::consumer::OffsetSpec::Latest,
                self.shared.config.consumer.reader.isolation,
            )
            .await
            {
                Ok(ends) => ends,
                Err(e) => {
                    // The merges wait; the next poll asks again.
                    tracing::debug!(error = %e, "reading idle inputs' ends failed");
                    return Ok(folded);
                }
            };
            for (lane, i, tp) in &stale {
                if let (Some(end), Some(mut merge)) = (ends.get(tp), lane.merge()) {
                    merge.handle_end(*i, *end);
                }
            }
            folded += self.drain_merges(&lanes).await?;
        }
        Ok(folded)
    }

    /// Folds what every lane's merge hands out now, bounds what the merges keep buffered, and checks
    /// readiness; returns how many events were folded.
    async fn drain_merges(&mut self, lanes: &[Arc<FlowLane<F>>]) -> Result<usize, FlowError> {
        let mut folded = 0;
        let mut failures = Vec::new();
        let mut seeks = Vec::new();
        for lane in lanes {
            let tps = self.shared.input_partitions(lane.partition);
            {
                let Some(mut merge) = lane.merge() else {
                    continue;
                };
                let mut core = lane.core();
                while let Some(step) = merge.poll_step() {
                    match step {
                        Step::Event(i, event) => {
                            let f = core.handle_event_from(&*self.shared.fold, i, &event);
                            folded += self.count_folded(f, &tps[i], &event);
                        }
                        Step::ReadTo(i, next) => core.handle_read_to_from(i, next),
                    }
                }
                drop(core);
                // While the merge waits for one input, another's records pile up: keep a bounded
                // number and fetch the rest again later.
                for (i, tp) in tps.iter().enumerate() {
                    if let Some(from) = merge.trim(i, MAX_MERGE_BUFFER) {
                        seeks.push((tp.clone(), from));
                    }
                }
            }
            if !lane.catch_up.is_reached()
                && lane.catch_up.check(|| lane.progress()) == PartitionReadiness::Ready
            {
                self.shared.refresh_ready();
            }
            if let Err(e) = emit_immediate(lane).await {
                failures.push((lane.partition, e));
            }
        }
        for (tp, from) in seeks {
            self.consumer.seek(&tp, StartAt::Offset(from));
        }
        if !failures.is_empty() {
            self.shared.settle(failures, Site::Held).await?;
        }
        Ok(folded)
    }

    /// Counts one folded event (and warns once about null keys).
    fn count_folded(&self, folded: Folded, tp: &TopicPartition, event: &Record) -> usize {
        match folded {
            Folded::NullKey => {
                if self.shared.null_keys.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::warn!(
                        topic = %tp.topic,
                        partition = tp.partition,
                        offset = event.offset,
                        "skipping input events with a null key: a fold is per key (counted in \
                         Flow::null_key_events)"
                    );
                }
                0
            }
            Folded::Skipped => 0,
            Folded::Kept | Folded::Changed => 1,
        }
    }

    /// Folds one partition's batch under its core's lock, from its `from`-th event. Returns how many were folded, and where it stopped
    /// when the partition's changed keys outgrew its memory budget (`PartitionCore::wants_persist`)
    /// before the batch's end.
    fn fold_batch(
        &self,
        lane: &FlowLane<F>,
        batch: &PartitionRecords,
        from: usize,
    ) -> (usize, Option<usize>) {
        let mut folded = 0;
        {
            let mut core = lane.core();
            for (i, event) in batch.records.iter().enumerate().skip(from) {
                // At least one event per call, so a persist that made no room cannot stall the fold.
                if i > from && core.wants_persist() {
                    return (folded, Some(i));
                }
                match core.handle_event(&*self.shared.fold, event) {
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
            core.handle_read_to(batch.next_offset);
            if !lane.catch_up.is_reached() {
                let position = core.position();
                if lane.catch_up.check(|| position) == PartitionReadiness::Ready {
                    drop(core);
                    self.shared.refresh_ready();
                }
            }
        }
        (folded, None)
    }

    /// Fires every timer due on [`FlowConfig::clock`] in every held partition (see [`Fold::deadline`]),
    /// and returns how many fired. Timers on stream time ([`TimerClock::Stream`](super::TimerClock::Stream))
    /// fire as events move it, not here. Their changes are persisted by the next [`persist`](Self::persist),
    /// fenced like an event's.
    pub fn tick(&self) -> usize {
        let now = self.shared.config.clock.now_ms();
        self.shared
            .all_lanes()
            .iter()
            .map(|lane| lane.core().handle_timeout(&*self.shared.fold, now))
            .sum()
    }

    /// The earliest timer deadline over the held partitions (milliseconds on [`FlowConfig::clock`]): when
    /// a loop built on [`poll_once`](Self::poll_once) should call [`tick`](Self::tick) next.
    pub fn next_deadline(&self) -> Option<i64> {
        self.shared
            .all_lanes()
            .iter()
            .filter_map(|lane| lane.core().poll_timeout())
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
        self.persist_lanes(self.shared.all_lanes()).await
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
    /// A clone of the whole partition's map: to answer queries for single keys, use
    /// [`FlowHandle::get`].
    pub fn state(&self, partition: i32) -> Option<HashMap<Bytes, F::State>> {
        self.shared.partition_state(partition)
    }

    /// The next input offset of `partition` this flow will fold (the assigned offset until events arrive),
    /// if held: how a caller knows the flow has caught up with an input end it read elsewhere.
    pub fn position(&self, partition: i32) -> Option<i64> {
        self.shared.position(partition)
    }

    /// The next offset of each input topic of `partition` this flow will fold, if held, in the order
    /// [`FlowConfig::input_topics`] lists them.
    pub fn positions(&self, partition: i32) -> Option<Vec<i64>> {
        self.shared.positions(partition)
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
                        Ok(batches) => self.fold_batches(batches).await,
                        Err(e) => Err(e),
                    };
                    if let Err(e) = folded { break Err(e) }
                }
            }
            if let Err(e) = self.persist_over_budget().await {
                break Err(e);
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
        let Flow {
            shared,
            consumer,
            _closed,
        } = self;
        // Runs the revocation handler for every held partition (flush, commit, close the store) before
        // the leave request goes out, while the generation still accepts the commits.
        let left = consumer.close(LEAVE_TIMEOUT).await;
        let flushed = shared.take_failure();
        shared.sink.close().await;
        if let Some(e) = flushed {
            return Err(e);
        }
        left?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::snapshot::fold_core::{envelope, grave, open_envelope, Opened};

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
mod driver_tests;
