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
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::task::JoinSet;

use super::error::SnapshotError;
use super::group_commit::MetadataSource;
use super::log::PartitionLog;
use super::recovery::{recover, RecoveryConfig};
use super::store::{SnapshotConfig, SnapshotStore};
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
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct FlowConfig {
    /// The group consumer over the input topic. Auto-commit is forced off: offsets are committed by the
    /// flow, never ahead of the snapshots.
    pub consumer: GroupConsumerConfig,
    /// The input topic.
    pub input_topic: String,
    /// The snapshot store settings (the snapshot topic has the input's partition count).
    pub snapshots: SnapshotConfig,
    /// Fenced or not.
    pub mode: PersistenceMode,
    /// How often dirty keys are persisted. Default 1 s.
    pub persist_every: Duration,
    /// How often the committable offset is committed. Default 5 s.
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
}

impl<F: Fold> Shared<F> {
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

    /// The offset `tp` is assigned at: the group's committed offset, else the reset position.
    async fn assigned_offset(&self, tp: &TopicPartition) -> Result<i64, FlowError> {
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
            Some(o) => o,
            None => {
                let spec = match self.config.consumer.reader.reset {
                    OffsetReset::Latest => OffsetSpec::Latest,
                    _ => OffsetSpec::Earliest,
                };
                list_offsets(
                    &self.client,
                    std::slice::from_ref(tp),
                    spec,
                    IsolationLevel::ReadUncommitted,
                )
                .await?
                .get(tp)
                .copied()
                .unwrap_or(0)
            }
        })
    }

    async fn acquire(&self, tp: &TopicPartition) -> Result<PartitionFlow<F::State>, FlowError> {
        let (writer, assigned_offset) = match (self.config.mode, &self.plain) {
            (PersistenceMode::NonTransactional, Some(p)) => (
                Writer::Plain(Arc::clone(p)),
                self.assigned_offset(tp).await?,
            ),
            _ => {
                // Take the partition over first, then read its committed offset: a crashed owner's open
                // transaction may hold a pending offset commit, and the stable read waits for it until
                // the takeover aborts it (see SnapshotStore::acquire_then).
                let partition = tp.partition;
                let offset = async {
                    self.assigned_offset(tp)
                        .await
                        .map_err(|e| SnapshotError::Io {
                            partition,
                            source: Arc::new(e),
                        })
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
                (Writer::Fenced(Arc::new(store)), offset)
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
        tracing::info!(partition = tp.partition, keys = keys.len(), ?stats.elapsed, assigned_offset, "partition recovered");
        Ok(PartitionFlow {
            writer,
            keys,
            position: assigned_offset,
        })
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

/// A running flow: one group member folding its assigned partitions.
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
    /// Joins the group and subscribes to the input topic. Partitions are recovered as they are assigned,
    /// inside the polls.
    pub async fn start(client: Client, mut config: FlowConfig, fold: F) -> Result<Self, FlowError> {
        config.consumer.auto_commit_interval = None;
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
    /// Cancel safety: as the consumer's `poll`; events already returned are folded before this returns.
    pub async fn poll_once(&mut self, timeout: Duration) -> Result<usize, FlowError> {
        let batches = self.consumer.poll(timeout).await?;
        self.fold_batches(batches).await
    }

    /// Folds fetched events into their keys' state, after surfacing any failure of a rebalance handler.
    async fn fold_batches(&self, batches: Vec<PartitionRecords>) -> Result<usize, FlowError> {
        if let Some(e) = self
            .shared
            .failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
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
                let Some(key) = &event.key else { continue };
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

    /// Persists every dirty key of every held partition (concurrently per partition).
    pub async fn persist(&self) -> Result<(), FlowError> {
        let mut flows = self.shared.partitions.lock().await;
        for (p, flow) in flows.iter_mut() {
            self.shared.persist(*p, flow).await?;
        }
        Ok(())
    }

    /// Commits every held partition's committable offset.
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
    /// `stop` completes or an error (a fence stops a stale owner here). Then leaves the group, flushing
    /// through the revocation.
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
                r = self.consumer.poll(Duration::from_millis(200)) => {
                    let folded = match r {
                        Ok(batches) => self.fold_batches(batches).await,
                        Err(e) => Err(e.into()),
                    };
                    if let Err(e) = folded { break Err(e) }
                }
            }
        };
        let closed = self.consumer.close(Duration::from_secs(10)).await;
        result?;
        closed?;
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
