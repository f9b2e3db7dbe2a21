//! Where a flow's partitions write: the [`Writes`] a lane needs of a store, the [`Writer`] each
//! partition holds, and the [`Sink`] that says, once per flow, which kind of writer a partition gets.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::{FlowConfig, FlowError, PersistenceMode};
use crate::consumer::{commit_offsets, GroupMetadataHandle, TopicPartition};
use crate::net::Client;
use crate::producer::{Producer, ProducerConfig, ProducerRecord};
use crate::snapshot::error::SnapshotError;
use crate::snapshot::group_commit::{GroupCommit, TransactionRunner, TryWriteError};
use crate::snapshot::store::SnapshotStore;

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
pub(super) struct PlainWriter {
    pub(super) producer: Arc<Producer>,
    pub(super) offsets: PlainOffsets,
    pub(super) snapshot_topic: Arc<str>,
}

/// Where the unfenced mode commits offsets: the consumer's OffsetCommit, checked only against the
/// group's current generation at the time (no transaction binds it to the writes).
pub(super) struct PlainOffsets {
    pub(super) client: Client,
    pub(super) input: TopicPartition,
    pub(super) metadata: Option<GroupMetadataHandle>,
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

/// One partition's writer, of the kind the flow's [`Sink`] names.
pub(super) enum Writer {
    Fenced(SnapshotStore),
    Plain(PlainWriter),
    /// The PostgreSQL store, fenced.
    #[cfg(feature = "postgres")]
    Pg(crate::snapshot::postgres::PgSnapshotStore),
    /// Rows to PostgreSQL, unfenced.
    #[cfg(feature = "postgres")]
    PgPlain(crate::snapshot::postgres::PgPlainWriter, PlainOffsets),
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
