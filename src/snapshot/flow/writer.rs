//! Where a flow's partitions write: the [`Writes`] a lane needs of a store, the [`Writer`] each
//! partition holds, and the [`Sink`] that says, once per flow, which kind of writer a partition gets.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "postgres")]
use bytes::Bytes;

use super::{FlowConfig, FlowError, PersistenceMode};
use crate::consumer::{commit_offsets_with_metadata, GroupMetadataHandle, TopicPartition};
use crate::net::Client;
use crate::producer::{Delivery, Producer, ProducerConfig, ProducerRecord};
use crate::snapshot::error::SnapshotError;
use crate::snapshot::fold_core::WaveWrite;
use crate::snapshot::group_commit::{
    Entry, GroupCommit, SnapshotWrite, TransactionRunner, TryEnqueueError,
};
use crate::snapshot::store::SnapshotStore;

/// Where one partition's snapshot writes and offset commits go: what the driver needs of a store.
///
/// Implemented by the fenced [`SnapshotStore`], the unfenced producer, and (for tests and the benchmark)
/// a bare [`GroupCommit`] over any runner.
pub(crate) trait Writes: Send + Sync + 'static {
    /// Writes every key's snapshot (a `None` value is a tombstone) with the outputs riding with it,
    /// and waits until each has committed or failed; says which landed for sure.
    fn write_all(&self, writes: Vec<WaveWrite>) -> impl Future<Output = WaveResult> + Send;
    /// Commits `offset` as the input partition's committed offset, with `stream_time` (the stream time
    /// just before it, for timers on stream time) in its metadata where the store keeps it. `inputs` is
    /// the offset of every input the commit stands for, in the flow's order: `[offset]` with one input;
    /// with several, `offset` is the partition's coordinate on their merge and `inputs` what is
    /// committed.
    fn commit_offset(
        &self,
        offset: i64,
        inputs: Vec<i64>,
        stream_time: Option<i64>,
    ) -> impl Future<Output = Result<(), FlowError>> + Send;
    /// Waits until every output produced at once (the unfenced mode) is acknowledged; an error means
    /// some was not, and the partition must replay. Nothing to wait for where outputs ride with their
    /// keys' writes.
    fn confirm_outputs(&self) -> impl Future<Output = Result<(), FlowError>> + Send {
        std::future::ready(Ok(()))
    }
    /// Produces `outputs` now, without a transaction (the unfenced mode's emitting path); refused
    /// where outputs ride with their keys' writes.
    fn emit_now(
        &self,
        outputs: Vec<ProducerRecord>,
    ) -> impl Future<Output = Result<(), FlowError>> + Send {
        let _ = outputs;
        std::future::ready(Err(SnapshotError::Config(
            "outputs produced at once need the unfenced snapshot-topic mode".into(),
        )
        .into()))
    }
}

/// How a wave's writes ended.
#[derive(Debug)]
pub(crate) struct WaveResult {
    /// Per write, in the wave's order: whether it committed for sure (its transaction's outcome; a
    /// write whose outcome never came back counts as not landed).
    pub(crate) landed: Vec<bool>,
    /// The first failure, if any write failed.
    pub(crate) result: Result<(), FlowError>,
}

impl WaveResult {
    /// Every one of `n` writes ended as `result` says.
    #[cfg(feature = "postgres")]
    fn uniform(n: usize, result: Result<(), FlowError>) -> Self {
        WaveResult {
            landed: vec![result.is_ok(); n],
            result,
        }
    }
}

/// Queues every entry through `try_enqueue` (so the group commit sees the whole wave at once and
/// batches it, with no task per write), then waits for all outcomes. When the queue is full, waits for
/// the entries this wave already queued (which frees room) before queueing more. Each entry's outcome is
/// its transaction's, so landing is known per transaction.
async fn write_batched<Fut>(
    writes: Vec<WaveWrite>,
    try_enqueue: impl Fn(Entry) -> Result<Fut, TryEnqueueError>,
) -> WaveResult
where
    Fut: Future<Output = Result<(), SnapshotError>>,
{
    let mut landed = vec![false; writes.len()];
    let mut queued = Vec::with_capacity(writes.len());
    let mut first_err = None;
    async fn settle<Fut: Future<Output = Result<(), SnapshotError>>>(
        queued: &mut Vec<(usize, Fut)>,
        landed: &mut [bool],
        first_err: &mut Option<SnapshotError>,
    ) {
        for (i, outcome) in queued.drain(..) {
            match outcome.await {
                Ok(()) => landed[i] = true,
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
    }
    for (i, w) in writes.into_iter().enumerate() {
        let mut next = Entry {
            write: SnapshotWrite {
                key: w.key,
                value: w.value,
            },
            outputs: w.outputs,
        };
        loop {
            match try_enqueue(next) {
                Ok(outcome) => {
                    queued.push((i, outcome));
                    break;
                }
                Err(TryEnqueueError::Full(back)) => {
                    if queued.is_empty() {
                        // Full with writes of others: give the drain a moment.
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    settle(&mut queued, &mut landed, &mut first_err).await;
                    next = back;
                }
                Err(TryEnqueueError::Failed(e)) => {
                    // The queue closed: what it already took still ends (and says how); the rest of
                    // the wave was never sent.
                    settle(&mut queued, &mut landed, &mut first_err).await;
                    return WaveResult {
                        landed,
                        result: Err(first_err.unwrap_or(e).into()),
                    };
                }
            }
        }
    }
    settle(&mut queued, &mut landed, &mut first_err).await;
    WaveResult {
        landed,
        result: first_err.map_or(Ok(()), |e| Err(e.into())),
    }
}

impl<R: TransactionRunner> Writes for GroupCommit<R> {
    async fn write_all(&self, writes: Vec<WaveWrite>) -> WaveResult {
        write_batched(writes, |e| self.try_enqueue(e)).await
    }

    /// A bare queue (tests, the benchmark) keeps no stream time.
    async fn commit_offset(
        &self,
        offset: i64,
        _inputs: Vec<i64>,
        _stream_time: Option<i64>,
    ) -> Result<(), FlowError> {
        Ok(GroupCommit::commit_offset(self, offset).await?)
    }
}

/// The unfenced mode's writer: the shared idempotent producer, offsets committed by the consumer API.
pub(super) struct PlainWriter {
    pub(super) producer: Arc<Producer>,
    pub(super) offsets: PlainOffsets,
    pub(super) snapshot_topic: Arc<str>,
    /// Deliveries of outputs produced at once, not yet confirmed.
    pub(super) pending: std::sync::Mutex<Vec<Delivery>>,
}

impl PlainWriter {
    /// Produces `outputs` now, without a transaction; their deliveries are confirmed before the
    /// partition's next write or commit.
    async fn emit_now(&self, outputs: Vec<ProducerRecord>) -> Result<(), FlowError> {
        let mut sent = Vec::with_capacity(outputs.len());
        let mut result = Ok(());
        for record in outputs {
            match self.producer.send(record).await {
                Ok(delivery) => sent.push(delivery),
                Err(e) => {
                    result = Err(e.into());
                    break;
                }
            }
        }
        // Once per batch, not per record; what was sent before a refusal is still confirmed.
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .append(&mut sent);
        result
    }

    /// Waits for every pending output delivery; the first failure is returned.
    async fn confirm(&self) -> Result<(), FlowError> {
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
        let mut first_err = None;
        for d in pending {
            if let Err(e) = d.await {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), |e| Err(e.into()))
    }

    /// Sends every snapshot and its outputs without a transaction, then waits for every delivery: a
    /// write landed when its snapshot and all its outputs were acknowledged. At least once: a retry
    /// after a crash sends again what was acknowledged but not committed as an offset.
    async fn write_all(&self, writes: Vec<WaveWrite>) -> WaveResult {
        let n = writes.len();
        let mut landed = vec![false; n];
        let mut deliveries = Vec::with_capacity(n);
        let mut first_err: Option<FlowError> = None;
        for (i, w) in writes.into_iter().enumerate() {
            let record = ProducerRecord::new(Arc::clone(&self.snapshot_topic), w.value)
                .key(w.key)
                .partition(self.offsets.input.partition);
            let mut sent = Vec::with_capacity(1 + w.outputs.len());
            for record in std::iter::once(record).chain(w.outputs) {
                match self.producer.send(record).await {
                    Ok(d) => sent.push(d),
                    Err(e) => {
                        first_err.get_or_insert(e.into());
                        break;
                    }
                }
            }
            deliveries.push((i, sent));
            if first_err.is_some() {
                break;
            }
        }
        for (i, sent) in deliveries {
            let mut ok = true;
            for d in sent {
                if let Err(e) = d.await {
                    ok = false;
                    first_err.get_or_insert(e.into());
                }
            }
            landed[i] = ok && first_err.is_none();
        }
        WaveResult {
            landed,
            result: first_err.map_or(Ok(()), Err),
        }
    }
}

/// The rows the unfenced PostgreSQL store writes: a wave's snapshots. It has no producer for outputs
/// (the unfenced topic mode produces them at once on its shared producer), so a fold that emits is
/// refused there.
#[cfg(feature = "postgres")]
fn pg_rows(writes: Vec<WaveWrite>) -> Result<Vec<(Bytes, Option<Bytes>)>, FlowError> {
    if writes.iter().any(|w| !w.outputs.is_empty()) {
        return Err(unfenced_pg_outputs());
    }
    Ok(writes.into_iter().map(|w| (w.key, w.value)).collect())
}

/// The refusal of outputs by the unfenced PostgreSQL store.
fn unfenced_pg_outputs() -> FlowError {
    SnapshotError::Config(
        "a fold that emits outputs cannot use the unfenced PostgreSQL store (docs/fencing.md, \
         \"Outputs and the PostgreSQL store\")"
            .into(),
    )
    .into()
}

/// Where the unfenced mode commits offsets: the consumer's OffsetCommit, checked only against the
/// group's current generation at the time (no transaction binds it to the writes).
pub(super) struct PlainOffsets {
    pub(super) client: Client,
    pub(super) input: TopicPartition,
    /// The other inputs' partitions of a flow with several (in the flow's order).
    pub(super) more: Vec<TopicPartition>,
    pub(super) metadata: Option<GroupMetadataHandle>,
}

impl PlainOffsets {
    /// Commits `inputs`: the first input's offset, then the others' (one OffsetCommit).
    async fn commit(&self, inputs: &[i64], stream_time: Option<i64>) -> Result<(), FlowError> {
        let token = self
            .metadata
            .as_ref()
            .ok_or(SnapshotError::MissingGroupMetadata {
                partition: self.input.partition,
            })?
            .require()?;
        let note = stream_time.map(crate::snapshot::runner::stream_time_metadata);
        let offsets: BTreeMap<TopicPartition, (i64, Option<&str>)> = std::iter::once(&self.input)
            .chain(&self.more)
            .zip(inputs)
            .map(|(tp, o)| (tp.clone(), (*o, note.as_deref())))
            .collect();
        commit_offsets_with_metadata(&self.client, &token, &offsets).await?;
        Ok(())
    }
}

/// One partition's writer, of the kind the flow's [`Sink`] names.
pub(super) enum Writer {
    Fenced(SnapshotStore),
    Plain(PlainWriter),
    /// The PostgreSQL store, fenced.
    #[cfg(feature = "postgres")]
    Pg(Box<crate::snapshot::postgres::PgSnapshotStore>),
    /// Rows to PostgreSQL, unfenced.
    #[cfg(feature = "postgres")]
    PgPlain(Box<crate::snapshot::postgres::PgPlainWriter>, PlainOffsets),
}

impl Writer {
    /// Closes the store behind the writer (the fenced ones hold a producer and a connection).
    pub(super) async fn close(self) {
        match self {
            Writer::Fenced(store) => store.close().await,
            #[cfg(feature = "postgres")]
            Writer::Pg(store) => store.close().await,
            _ => {}
        }
    }

    /// Whether the group's committed offset must be moved up to where the store stands before input is
    /// read (a PostgreSQL flush whose Kafka side was aborted after its rows committed).
    pub(super) fn group_offset_behind(&self) -> bool {
        match self {
            #[cfg(feature = "postgres")]
            Writer::Pg(store) => store.kafka_behind(),
            _ => false,
        }
    }
}

impl Writes for Writer {
    async fn write_all(&self, writes: Vec<WaveWrite>) -> WaveResult {
        match self {
            Writer::Fenced(store) => write_batched(writes, |e| store.try_enqueue(e)).await,
            Writer::Plain(plain) => plain.write_all(writes).await,
            #[cfg(feature = "postgres")]
            Writer::Pg(store) => {
                // One flush: its rows and outputs land together or not at all.
                let n = writes.len();
                let mut rows = Vec::with_capacity(n);
                let mut outputs = Vec::new();
                for w in writes {
                    rows.push((w.key, w.value));
                    outputs.extend(w.outputs);
                }
                let result = store
                    .write_with_outputs(rows, outputs)
                    .await
                    .map_err(FlowError::from);
                WaveResult::uniform(n, result)
            }
            #[cfg(feature = "postgres")]
            Writer::PgPlain(rows, _) => {
                let n = writes.len();
                let result = match pg_rows(writes) {
                    Ok(writes) => rows.write_all(writes).await.map_err(FlowError::from),
                    Err(e) => Err(e),
                };
                WaveResult::uniform(n, result)
            }
        }
    }

    async fn confirm_outputs(&self) -> Result<(), FlowError> {
        match self {
            Writer::Plain(plain) => plain.confirm().await,
            _ => Ok(()),
        }
    }

    /// On the snapshot topic's shared producer; the unfenced PostgreSQL store has none.
    async fn emit_now(&self, outputs: Vec<ProducerRecord>) -> Result<(), FlowError> {
        match self {
            Writer::Plain(plain) => plain.emit_now(outputs).await,
            _ => Err(unfenced_pg_outputs()),
        }
    }

    async fn commit_offset(
        &self,
        offset: i64,
        inputs: Vec<i64>,
        stream_time: Option<i64>,
    ) -> Result<(), FlowError> {
        match self {
            Writer::Fenced(store) if inputs.len() > 1 => {
                Ok(store.commit_offsets_at(offset, inputs, stream_time).await?)
            }
            Writer::Fenced(store) => Ok(store.commit_offset_at(offset, stream_time).await?),
            Writer::Plain(plain) => plain.offsets.commit(&inputs, stream_time).await,
            // The metadata names the flush, then the stream time. With several inputs `offset` is
            // their sum, and `inputs` says what it stands for.
            #[cfg(feature = "postgres")]
            Writer::Pg(store) => Ok(store.commit_offsets_at(inputs, stream_time).await?),
            #[cfg(feature = "postgres")]
            Writer::PgPlain(_, offsets) => offsets.commit(&inputs, stream_time).await,
        }
    }
}

/// The kind of writer a flow opens for each partition it takes over: decided once, from
/// [`FlowConfig::mode`] (and, with the `postgres` feature, `FlowConfig::postgres`), when the flow
/// starts, so a partition's writer can never disagree with the mode.
pub(super) enum Sink {
    /// Fenced snapshots in the snapshot topic: a [`SnapshotStore`] (its own transactional producer)
    /// per partition.
    Topic,
    /// Unfenced snapshots in the snapshot topic, through one idempotent producer every partition
    /// shares.
    PlainTopic(Arc<Producer>),
    /// Fenced snapshots in PostgreSQL.
    #[cfg(feature = "postgres")]
    Pg(crate::snapshot::postgres::PgStoreConfig),
    /// Unfenced rows in PostgreSQL.
    #[cfg(feature = "postgres")]
    PlainPg(crate::snapshot::postgres::PgStoreConfig),
}

impl Sink {
    /// The sink `config` names; the unfenced topic sink starts its shared producer here.
    pub(super) async fn new(client: &Client, config: &FlowConfig) -> Result<Sink, FlowError> {
        let fenced = config.mode == PersistenceMode::Transactional;
        #[cfg(feature = "postgres")]
        if let Some(pg) = &config.postgres {
            return Ok(if fenced {
                Sink::Pg(pg.clone())
            } else {
                Sink::PlainPg(pg.clone())
            });
        }
        Ok(if fenced {
            Sink::Topic
        } else {
            let producer = Producer::new(client.clone(), ProducerConfig::default()).await?;
            Sink::PlainTopic(Arc::new(producer))
        })
    }

    /// Whether writes are fenced (then a recovery read has a stall deadline: a hanging transaction
    /// can only come from a fenced writer).
    pub(super) fn fenced(&self) -> bool {
        match self {
            Sink::Topic => true,
            Sink::PlainTopic(_) => false,
            #[cfg(feature = "postgres")]
            Sink::Pg(_) => true,
            #[cfg(feature = "postgres")]
            Sink::PlainPg(_) => false,
        }
    }

    /// Flushes and closes what the sink itself holds (the unfenced topic sink's shared producer); a
    /// partition's own store is closed with its writer.
    pub(super) async fn close(&self) {
        if let Sink::PlainTopic(producer) = self {
            Producer::clone(producer).close().await;
        }
    }
}
