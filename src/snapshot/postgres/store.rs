//! One partition's PostgreSQL snapshot store: the takeover, the staged flush, the recovery read.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::OwnedMutexGuard;
use tokio_postgres::NoTls;

use super::sql::Statements;
use super::{redacted, PgError, PgStoreConfig};
use crate::consumer::committed_offsets_and_metadata;
use crate::net::Client;
use crate::producer::{
    Completion, OffsetAndMetadata, PreparedTxn, ProducerError, ProducerRecord, TopicPartition,
    TransactionState, TransactionalConfig, TransactionalProducer, TwoPhaseCommitRefusal,
};
use crate::records::Header;
use crate::snapshot::error::{FailureKind, SnapshotError};
use crate::snapshot::group_commit::MetadataSource;
use crate::snapshot::{RecoveredState, SnapshotConfig};

/// The connection and the producer, used by one flush at a time.
struct Lane {
    pg: tokio_postgres::Client,
    /// Why the connection's task ended, once it has.
    lost: Arc<Mutex<Option<String>>>,
    producer: TransactionalProducer,
    /// A PostgreSQL transaction of an abandoned flush may still be open: roll back before the next.
    pg_txn_open: bool,
    /// A fatal failure (or `close`): refuse everything from here on.
    closed: bool,
}

impl Lane {
    fn statement_error(&self, step: &'static str, e: tokio_postgres::Error) -> PgError {
        if self.pg.is_closed() {
            let why = lock(&self.lost).clone().unwrap_or_else(|| e.to_string());
            return PgError::ConnectionLost(why);
        }
        PgError::Statement {
            step,
            source: Arc::new(e),
        }
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The PostgreSQL snapshot store of one assigned input partition, fenced like the topic store: every
/// flush rides in a prepared Kafka transaction with the generation-checked offset commit, and commits in
/// PostgreSQL only while the partition's fencing row still carries the epoch this store took over with.
/// See the [module docs](super) for the protocol.
///
/// [`write_all`](Self::write_all) and [`commit_offset`](Self::commit_offset) run a whole flush;
/// [`begin_flush`](Self::begin_flush) runs it step by step (for tests that stop an owner between two
/// steps, and for callers that want to see each step's outcome). One flush runs at a time.
pub struct PgSnapshotStore {
    partition: i32,
    prefix: Arc<str>,
    /// The input partitions, in the flow's order (one, or every input of a flow with several).
    inputs: Arc<[TopicPartition]>,
    statements: Arc<Statements>,
    metadata: Arc<dyn MetadataSource>,
    owner_epoch: i64,
    /// Every input's committed offset and the stream time before them. Shared with the flush steps,
    /// the last of which moves it.
    committed: Arc<Mutex<Position>>,
    /// Flushes record `input_offsets` and `stream_time` on the fencing row (several inputs, or timers
    /// on stream time).
    extended: bool,
    /// Whether the group's committed offset in Kafka was behind the fencing row's at takeover.
    behind_at_takeover: bool,
    /// Outputs of the previous owner's last flush whose rows committed and whose Kafka side did not:
    /// sent again by this store's next flush, and forgotten once that flush's rows commit.
    resend: Arc<Mutex<Vec<ProducerRecord>>>,
    /// Whether the outputs table may hold rows of this partition (a flush then clears them).
    outputs_stored: Arc<AtomicBool>,
    flushes: AtomicU64,
    acquired_in: Duration,
    lane: Arc<tokio::sync::Mutex<Lane>>,
}

impl std::fmt::Debug for PgSnapshotStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgSnapshotStore")
            .field("prefix", &self.prefix)
            .field("partition", &self.partition)
            .field("owner_epoch", &self.owner_epoch)
            .field("committed_offsets", &self.committed_offsets())
            .finish()
    }
}

/// A failure of a store step, in the snapshot layer's terms.
fn store_error(partition: i32, kind: FailureKind, source: PgError) -> SnapshotError {
    SnapshotError::Store {
        partition,
        kind,
        source: Arc::new(source),
    }
}

/// The fencing row as a takeover reads it, by column name: tables made before flows had several inputs
/// have no `input_offsets` column.
pub(crate) struct FencingRow {
    pub(crate) owner_epoch: i64,
    /// The (first) input's offset the last flush recorded.
    pub(crate) committed_offset: Option<i64>,
    pub(crate) prepared_txn: Option<String>,
    /// Whether the table has the `input_offsets` and `stream_time` columns.
    pub(crate) has_extended_columns: bool,
    /// Every input's offset, recorded by a flow with several inputs.
    pub(crate) input_offsets: Option<Vec<i64>>,
    /// The stream time before the recorded offsets, recorded by a fold with timers on stream time.
    pub(crate) stream_time: Option<i64>,
}

impl FencingRow {
    pub(crate) fn of(row: &tokio_postgres::Row) -> Result<FencingRow, String> {
        let has = |name: &str| row.columns().iter().any(|c| c.name() == name);
        let has_extended_columns = has("input_offsets") && has("stream_time");
        let column = |e: tokio_postgres::Error| format!("the fencing row: {e}");
        let (input_offsets, stream_time) = if has_extended_columns {
            (
                row.try_get("input_offsets").map_err(column)?,
                row.try_get("stream_time").map_err(column)?,
            )
        } else {
            (None, None)
        };
        Ok(FencingRow {
            owner_epoch: row.try_get("owner_epoch").map_err(column)?,
            committed_offset: row.try_get("committed_offset").map_err(column)?,
            prepared_txn: row.try_get("prepared_txn").map_err(column)?,
            has_extended_columns,
            input_offsets,
            stream_time,
        })
    }

    /// Every input's offset the row vouches for, for a flow of `inputs` inputs (`None`: nothing
    /// recorded for that input). `input_offsets` counts only while its first entry is the row's
    /// `committed_offset`: a flow of one input records that column alone, so a vector left by an
    /// earlier run with several inputs is stale once they differ, and then only the first input's
    /// offset is known. A current vector of another length means the flow's inputs changed.
    pub(crate) fn recorded(&self, inputs: usize) -> Result<Vec<Option<i64>>, String> {
        let mut out = vec![None; inputs];
        let Some(first) = self.committed_offset else {
            return Ok(out);
        };
        out[0] = Some(first);
        if inputs == 1 {
            return Ok(out);
        }
        match &self.input_offsets {
            Some(v) if v.first() == Some(&first) => {
                if v.len() != inputs {
                    return Err(format!(
                        "the fencing row records offsets of {} inputs and this flow has {inputs}: the \
                         inputs' number changed",
                        v.len()
                    ));
                }
                Ok(v.iter().copied().map(Some).collect())
            }
            _ => Ok(out),
        }
    }
}

/// Where a partition stands: every input's offset (in the store's order) and the stream time just
/// before them (timers on stream time; `None` without).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Position {
    pub(crate) offsets: Vec<i64>,
    pub(crate) stream_time: Option<i64>,
}

/// Where a takeover starts each input, and whether the group's committed offsets are behind it: per
/// input, the later of the fencing row's offset and the group's (`assigned`). The row runs ahead of the
/// group only when a flush's rows committed and its Kafka side did not; then every input's row offset
/// is at or past the group's, so the result is the row's vector, a point the previous owner's merge
/// passed, not a mix of two. The stream time goes with it: the row's when the row is ahead (the later
/// of the two, as stream time never falls along the input), the group's otherwise.
pub(crate) fn resume_from(
    row: &FencingRow,
    assigned: &Position,
) -> Result<(Position, bool), String> {
    let recorded = row.recorded(assigned.offsets.len())?;
    let mut behind = false;
    let offsets = recorded
        .iter()
        .zip(&assigned.offsets)
        .map(|(r, g)| match r {
            Some(r) if r > g => {
                behind = true;
                *r
            }
            _ => *g,
        })
        .collect();
    let stream_time = if behind {
        row.stream_time.max(assigned.stream_time)
    } else {
        assigned.stream_time
    };
    Ok((
        Position {
            offsets,
            stream_time,
        },
        behind,
    ))
}

/// The flush id a committed offset's metadata names (without the stream time a flush may add).
fn flush_id_of(metadata: &str) -> &str {
    metadata.split_once(" st=").map_or(metadata, |(id, _)| id)
}

impl PgSnapshotStore {
    /// Takes a partition over: inits its two-phase producer (`<prefix>-<partition>`: fencing the
    /// previous owner's, asking to keep a transaction it prepared), connects, bumps the partition's
    /// fencing row (this waits for a stale owner's flush that holds the row's lock, then makes every
    /// later flush of that owner fail its compare-and-set), and finishes the kept Kafka transaction by
    /// what the row recorded: commit if the row names it, abort otherwise. Then awaits
    /// `assigned_offset` (the group's committed offset, read only now: a kept transaction holds its
    /// offset commit pending until then) and starts at the later of it and the offset the row recorded.
    ///
    /// Refusals of the two-phase init say which: the broker does not speak it, has it off, or the
    /// principal lacks the TWO_PHASE_COMMIT ACL ([`TwoPhaseCommitRefusal`]).
    ///
    /// Cancel-safe: dropping the future leaves at most a bumped producer epoch and fencing row behind.
    pub async fn acquire(
        client: Client,
        snapshots: &SnapshotConfig,
        config: &PgStoreConfig,
        input: TopicPartition,
        metadata: Arc<dyn MetadataSource>,
        assigned_offset: impl Future<Output = Result<i64, SnapshotError>>,
    ) -> Result<Self, SnapshotError> {
        let start = async {
            let at = Position {
                offsets: vec![assigned_offset.await?],
                stream_time: None,
            };
            Ok((at, ()))
        };
        let (store, ()) = Self::take_over(
            client,
            snapshots,
            config,
            vec![input],
            false,
            metadata,
            start,
        )
        .await?;
        Ok(store)
    }

    /// [`acquire`](Self::acquire) for a flow with several co-partitioned inputs: `inputs` is
    /// partition N of each, in the flow's order (the first names the store's partition), and
    /// `assigned_offsets` resolves to the group's committed offset of each, in that order. The
    /// fencing row then records every input's offset, every flush's offset commit carries them all,
    /// and the takeover starts each input at the later of the row's offset and the group's
    /// (docs/fencing.md, "Several inputs on the PostgreSQL store").
    ///
    /// Refused with [`SnapshotError::Config`] when `inputs` is empty or longer than 255, or the
    /// offsets are not one per input.
    ///
    /// Cancel-safe, as [`acquire`](Self::acquire).
    pub async fn acquire_inputs(
        client: Client,
        snapshots: &SnapshotConfig,
        config: &PgStoreConfig,
        inputs: Vec<TopicPartition>,
        metadata: Arc<dyn MetadataSource>,
        assigned_offsets: impl Future<Output = Result<Vec<i64>, SnapshotError>>,
    ) -> Result<Self, SnapshotError> {
        let start = async {
            let at = Position {
                offsets: assigned_offsets.await?,
                stream_time: None,
            };
            Ok((at, ()))
        };
        let (store, ()) =
            Self::take_over(client, snapshots, config, inputs, false, metadata, start).await?;
        Ok(store)
    }

    /// [`acquire_inputs`](Self::acquire_inputs) whose `start` hands back, beside the assigned
    /// offsets and the stream time their commit carries, what else it learned on the way (the flow:
    /// whether the group had an offset committed), returned with the store. `stream_time`: the fold
    /// keeps timers on stream time, which every flush records.
    pub(crate) async fn take_over<T>(
        client: Client,
        snapshots: &SnapshotConfig,
        config: &PgStoreConfig,
        inputs: Vec<TopicPartition>,
        stream_time: bool,
        metadata: Arc<dyn MetadataSource>,
        start: impl Future<Output = Result<(Position, T), SnapshotError>>,
    ) -> Result<(Self, T), SnapshotError> {
        snapshots.validate()?;
        config.validate()?;
        let Some(partition) = inputs.first().map(|tp| tp.partition) else {
            return Err(SnapshotError::Config(
                "a PostgreSQL store needs at least one input partition".into(),
            ));
        };
        if inputs.len() > crate::snapshot::fold_core::MAX_INPUTS {
            return Err(SnapshotError::Config(format!(
                "a flow folds at most {} input topics",
                crate::snapshot::fold_core::MAX_INPUTS
            )));
        }
        let inputs: Arc<[TopicPartition]> = inputs.into();
        let began = tokio::time::Instant::now();
        let producer = two_phase_producer(&client, snapshots, partition).await?;
        let (pg, lost) = connect(config)
            .await
            .map_err(|e| store_error(partition, FailureKind::Fatal, e))?;
        let statements = Arc::new(Statements::new(&config.table_prefix));
        let mut lane = Lane {
            pg,
            lost,
            producer,
            pg_txn_open: false,
            closed: false,
        };
        let fail = |lane: &Lane, step, e| {
            store_error(partition, FailureKind::Fatal, lane.statement_error(step, e))
        };
        if config.create_tables {
            create_tables(&lane.pg, &statements)
                .await
                .map_err(|e| fail(&lane, "create tables", e))?;
        }
        let prefix: Arc<str> = Arc::from(snapshots.transactional_id_prefix.as_str());
        let row = lane
            .pg
            .query_one(&statements.bump, &[&&*prefix, &partition])
            .await
            .map_err(|e| fail(&lane, "takeover (bump the fencing row)", e))?;
        let bad_row = |detail: String| {
            store_error(
                partition,
                FailureKind::Fatal,
                PgError::BadRow { partition, detail },
            )
        };
        let row = FencingRow::of(&row).map_err(bad_row)?;
        let extended = inputs.len() > 1 || stream_time;
        if extended && !row.has_extended_columns {
            // A table made before flows had several inputs and stream time: the columns are added once
            // (this waits for flushes in flight on every partition, which hold the table's lock).
            if !config.create_tables {
                return Err(bad_row(format!(
                    "the fencing table lacks the input_offsets and stream_time columns, which a flow \
                     with several inputs or timers on stream time needs; add them: {}",
                    statements.add_columns
                )));
            }
            lane.pg
                .batch_execute(&statements.add_columns)
                .await
                .map_err(|e| fail(&lane, "add the input_offsets and stream_time columns", e))?;
        }
        let owner_epoch = row.owner_epoch;
        let recorded: Option<PreparedTxn> = match &row.prepared_txn {
            None => None,
            Some(text) => Some(
                text.parse()
                    .map_err(|e| bad_row(format!("prepared_txn: {e}")))?,
            ),
        };
        if let Some(kept) = lane.producer.prepared() {
            let outcome = lane
                .producer
                .complete(recorded)
                .await
                .map_err(|source| SnapshotError::Acquire { partition, source })?;
            tracing::info!(
                partition,
                kept = %kept,
                recorded = ?recorded.map(|r| r.to_string()),
                ?outcome,
                "the previous owner's prepared transaction finished by what PostgreSQL recorded"
            );
        }
        let (assigned, learned) = start.await?;
        if assigned.offsets.len() != inputs.len() {
            return Err(SnapshotError::Config(format!(
                "{} assigned offsets for {} inputs",
                assigned.offsets.len(),
                inputs.len()
            )));
        }
        let (committed, behind_at_takeover) = resume_from(&row, &assigned).map_err(bad_row)?;
        let stored = read_outputs(&lane.pg, &statements, &prefix, partition)
            .await
            .map_err(|e| store_error(partition, kind_of(&e), e))?;
        let outputs_stored = !stored.is_empty();
        let resend = match stored.first() {
            None => Vec::new(),
            Some((flush_id, _)) => {
                let landed = kafka_flush_id(&client, &*metadata, &inputs[0]).await?;
                if landed.as_deref().map(flush_id_of) == Some(flush_id.as_str()) {
                    Vec::new()
                } else {
                    crate::telemetry::outputs_resent(partition, stored.len());
                    tracing::info!(
                        partition,
                        flush_id,
                        outputs = stored.len(),
                        kafka_committed = ?landed,
                        "the last flush's rows committed but its Kafka side did not: its outputs go out again"
                    );
                    stored.into_iter().map(|(_, record)| record).collect()
                }
            }
        };
        let acquired_in = began.elapsed();
        tracing::info!(
            partition,
            owner_epoch,
            ?committed,
            kafka_committed = ?assigned,
            ?acquired_in,
            "PostgreSQL snapshot partition acquired: the fencing row is ours, the previous owner's producer fenced"
        );
        let store = PgSnapshotStore {
            partition,
            prefix,
            inputs,
            statements,
            metadata,
            owner_epoch,
            committed: Arc::new(Mutex::new(committed)),
            extended,
            behind_at_takeover,
            resend: Arc::new(Mutex::new(resend)),
            outputs_stored: Arc::new(AtomicBool::new(outputs_stored)),
            flushes: AtomicU64::new(0),
            acquired_in,
            lane: Arc::new(tokio::sync::Mutex::new(lane)),
        };
        Ok((store, learned))
    }

    /// The snapshot (= input) partition.
    pub fn partition(&self) -> i32 {
        self.partition
    }

    /// The fencing row's epoch this store took over with.
    pub fn owner_epoch(&self) -> i64 {
        self.owner_epoch
    }

    /// How long the takeover took.
    pub fn acquired_in(&self) -> Duration {
        self.acquired_in
    }

    /// The input offset the last successful flush recorded (at takeover: the later of the fencing row's
    /// and the group's committed offset). With several inputs, the sum of
    /// [`committed_offsets`](Self::committed_offsets): the partition's coordinate on their merge.
    pub fn committed_offset(&self) -> i64 {
        lock(&self.committed).offsets.iter().sum()
    }

    /// Every input's offset the last successful flush recorded, in the order the store was acquired
    /// with (at takeover: per input, the later of the fencing row's and the group's).
    pub fn committed_offsets(&self) -> Vec<i64> {
        lock(&self.committed).offsets.clone()
    }

    /// The stream time the last successful flush recorded with its offsets (at takeover: the one
    /// that goes with where the partition starts). `None` unless the flow's fold keeps timers on
    /// stream time.
    pub(crate) fn committed_stream_time(&self) -> Option<i64> {
        lock(&self.committed).stream_time
    }

    /// Whether the group's committed offset in Kafka was behind the offset PostgreSQL recorded when this
    /// store took over: a flush whose Kafka side was aborted after its rows committed (a crash between
    /// the two; Kafka 4.4.0 cannot keep the prepared transaction). The owner should commit
    /// [`committed_offset`](Self::committed_offset) before it reads input, so the consumer starts there.
    ///
    /// Also true when the previous owner's last flush carried outputs that never committed in Kafka:
    /// the next flush sends them again, with the offset commit.
    pub fn kafka_behind(&self) -> bool {
        self.behind_at_takeover || !lock(&self.resend).is_empty()
    }

    /// Flushes begun (committed, failed or in flight).
    pub fn flushes(&self) -> u64 {
        self.flushes.load(Ordering::Relaxed)
    }

    /// Every snapshot of the partition, as the recovery read of the topic store returns them.
    ///
    /// Cancel-safe: it only reads.
    pub async fn read_state(&self) -> Result<RecoveredState, SnapshotError> {
        let lane = self.lane.lock().await;
        read_rows(&lane.pg, &self.statements, &self.prefix, self.partition)
            .await
            .map_err(|e| {
                let err = lane.statement_error("read snapshots", e);
                store_error(self.partition, kind_of(&err), err)
            })
    }

    /// Writes `writes` (a `None` value deletes the key) and the current committed offset as one flush,
    /// and waits for its outcome.
    ///
    /// Not cancel-safe in outcome: dropped part-way, the flush is abandoned as a dropped step is (see
    /// the steps' docs): its rows are rolled back unless step 3 committed them.
    pub async fn write_all(
        &self,
        writes: Vec<(Bytes, Option<Bytes>)>,
    ) -> Result<(), SnapshotError> {
        let at = lock(&self.committed).clone();
        self.flush(writes, Vec::new(), at).await
    }

    /// [`write_all`](Self::write_all) with outputs: they are produced in the flush's prepared Kafka
    /// transaction and kept in PostgreSQL with the rows, so that if the Kafka side never commits the
    /// next owner sends them again (see the module docs, "Outputs").
    ///
    /// Not cancel-safe in outcome, as [`write_all`](Self::write_all).
    pub async fn write_with_outputs(
        &self,
        writes: Vec<(Bytes, Option<Bytes>)>,
        outputs: Vec<ProducerRecord>,
    ) -> Result<(), SnapshotError> {
        let at = lock(&self.committed).clone();
        self.flush(writes, outputs, at).await
    }

    /// Records `offset` as the input partition's committed offset (a flush without rows). A store of
    /// several inputs refuses it ([`SnapshotError::Config`]): see
    /// [`commit_offsets`](Self::commit_offsets).
    ///
    /// Not cancel-safe in outcome, as [`write_all`](Self::write_all).
    pub async fn commit_offset(&self, offset: i64) -> Result<(), SnapshotError> {
        self.commit_offsets(vec![offset]).await
    }

    /// Records `offsets` (one per input, in the store's order) as the inputs' committed offsets (a
    /// flush without rows), in one fenced offset commit.
    ///
    /// Not cancel-safe in outcome, as [`write_all`](Self::write_all).
    pub async fn commit_offsets(&self, offsets: Vec<i64>) -> Result<(), SnapshotError> {
        self.commit_offsets_at(offsets, None).await
    }

    /// [`commit_offsets`](Self::commit_offsets) with the stream time just before them, which the
    /// offset commit's metadata carries (`st=<ms>`, after the flush id) and the fencing row records.
    pub(crate) async fn commit_offsets_at(
        &self,
        offsets: Vec<i64>,
        stream_time: Option<i64>,
    ) -> Result<(), SnapshotError> {
        let at = Position {
            offsets,
            stream_time,
        };
        self.flush(Vec::new(), Vec::new(), at).await
    }

    /// A whole flush: its four steps one after the other.
    async fn flush(
        &self,
        writes: Vec<(Bytes, Option<Bytes>)>,
        outputs: Vec<ProducerRecord>,
        at: Position,
    ) -> Result<(), SnapshotError> {
        self.begin(writes, outputs, at)
            .await?
            .write_rows()
            .await?
            .commit_rows()
            .await?
            .commit_kafka()
            .await
    }

    /// Step 1 of a flush: a Kafka transaction with the fenced offset commit of `offset`, prepared. A
    /// stale generation fails here ([`SnapshotError::is_fenced`]) and nothing was written.
    ///
    /// Cancel-safe: nothing reaches PostgreSQL in this step; a Kafka transaction left open by a dropped
    /// future is aborted by the next flush or the next owner's init.
    pub async fn begin_flush(
        &self,
        writes: Vec<(Bytes, Option<Bytes>)>,
        offset: i64,
    ) -> Result<KafkaPrepared, SnapshotError> {
        self.begin_flush_with_outputs(writes, Vec::new(), offset)
            .await
    }

    /// [`begin_flush`](Self::begin_flush) with outputs, produced in the prepared transaction after the
    /// offset commit (and after any outputs of the previous owner's flush this store sends again). The
    /// offset commit's metadata names the flush, so a later takeover can tell whether its Kafka side
    /// committed.
    ///
    /// Cancel-safe, as [`begin_flush`](Self::begin_flush).
    pub async fn begin_flush_with_outputs(
        &self,
        writes: Vec<(Bytes, Option<Bytes>)>,
        outputs: Vec<ProducerRecord>,
        offset: i64,
    ) -> Result<KafkaPrepared, SnapshotError> {
        self.begin_flush_inputs(writes, outputs, vec![offset]).await
    }

    /// [`begin_flush_with_outputs`](Self::begin_flush_with_outputs) of a store of several inputs:
    /// `offsets` holds one per input, in the store's order, all committed in the one fenced offset
    /// commit. Refused with [`SnapshotError::Config`] when they are not one per input.
    ///
    /// Cancel-safe, as [`begin_flush`](Self::begin_flush).
    pub async fn begin_flush_inputs(
        &self,
        writes: Vec<(Bytes, Option<Bytes>)>,
        outputs: Vec<ProducerRecord>,
        offsets: Vec<i64>,
    ) -> Result<KafkaPrepared, SnapshotError> {
        let at = Position {
            offsets,
            stream_time: None,
        };
        self.begin(writes, outputs, at).await
    }

    /// Step 1 of a flush that leaves the partition at `at`.
    async fn begin(
        &self,
        writes: Vec<(Bytes, Option<Bytes>)>,
        outputs: Vec<ProducerRecord>,
        at: Position,
    ) -> Result<KafkaPrepared, SnapshotError> {
        let partition = self.partition;
        let offsets = &at.offsets;
        if offsets.len() != self.inputs.len() {
            return Err(SnapshotError::Config(format!(
                "a flush of partition {partition} carries {} offsets for {} inputs",
                offsets.len(),
                self.inputs.len()
            )));
        }
        let mut lane = self.lane.clone().lock_owned().await;
        if lane.closed {
            return Err(SnapshotError::Closed { partition });
        }
        let flush = self.flushes.fetch_add(1, Ordering::Relaxed);
        // Unique per flush of the partition: the epoch is unique per takeover.
        let flush_id = format!("snapfence-flush {}.{flush}", self.owner_epoch);
        let mut outputs_all = lock(&self.resend).clone();
        outputs_all.extend(outputs);
        clean_up(&mut lane, partition).await?;
        let Some(group) = self.metadata.current() else {
            return Err(SnapshotError::MissingGroupMetadata { partition });
        };
        let failed = |lane: &mut Lane, e: ProducerError| {
            let kind = FailureKind::of(&e);
            if kind.closes_store() {
                lane.closed = true;
            }
            SnapshotError::Transaction {
                partition,
                failure: e.into(),
            }
        };
        if let Err(e) = lane.producer.begin() {
            return Err(failed(&mut lane, e));
        }
        // Every input's offset in one TxnOffsetCommit, each naming the flush (and the stream time
        // before them, which a takeover reads back from the first input's).
        let metadata = match at.stream_time {
            Some(st) => format!("{flush_id} st={st}"),
            None => flush_id.clone(),
        };
        let commits: Vec<(TopicPartition, OffsetAndMetadata)> = self
            .inputs
            .iter()
            .zip(offsets)
            .map(|(tp, offset)| {
                let commit = OffsetAndMetadata {
                    offset: *offset,
                    leader_epoch: None,
                    metadata: Some(metadata.clone()),
                };
                (tp.clone(), commit)
            })
            .collect();
        let fenced = lane.producer.send_offsets(commits, &group).await;
        if let Err(e) = fenced {
            let err = failed(&mut lane, e);
            abort_quietly(&mut lane, partition).await;
            return Err(err);
        }
        // A failed output makes the transaction abortable and `prepare` fails with it.
        for record in outputs_all.iter().cloned() {
            if let Err(e) = lane.producer.send(record).await {
                let err = failed(&mut lane, e);
                abort_quietly(&mut lane, partition).await;
                return Err(err);
            }
        }
        let prepared = match lane.producer.prepare().await {
            Ok(p) => p,
            Err(e) => {
                let err = failed(&mut lane, e);
                abort_quietly(&mut lane, partition).await;
                return Err(err);
            }
        };
        Ok(KafkaPrepared(Stage {
            lane: Some(lane),
            store: self.handle(),
            writes,
            outputs: outputs_all,
            flush_id,
            at,
            prepared,
        }))
    }

    fn handle(&self) -> Handle {
        Handle {
            extended: self.extended,
            partition: self.partition,
            prefix: self.prefix.clone(),
            statements: self.statements.clone(),
            owner_epoch: self.owner_epoch,
            committed: self.committed.clone(),
            resend: self.resend.clone(),
            outputs_stored: self.outputs_stored.clone(),
        }
    }

    /// Stops the store: refuses new flushes, waits for the one in flight, rolls back an abandoned
    /// PostgreSQL transaction, and closes the producer (an open Kafka transaction is left to the next
    /// owner's init).
    ///
    /// Cancel-safe: dropping the future leaves the store as it was, or closed; an abandoned
    /// PostgreSQL transaction is rolled back by its step's drop either way.
    pub async fn close(self) {
        let mut lane = self.lane.lock().await;
        lane.closed = true;
        if lane.pg_txn_open {
            let _ = lane.pg.batch_execute("ROLLBACK").await;
            lane.pg_txn_open = false;
        }
        drop(lane);
        if let Ok(lane) = Arc::try_unwrap(self.lane) {
            lane.into_inner().producer.close().await;
        }
    }
}

/// What the flush steps need of their store.
struct Handle {
    /// Flushes record `input_offsets` and `stream_time` (see [`PgSnapshotStore`]'s field).
    extended: bool,
    partition: i32,
    prefix: Arc<str>,
    statements: Arc<Statements>,
    owner_epoch: i64,
    committed: Arc<Mutex<Position>>,
    resend: Arc<Mutex<Vec<ProducerRecord>>>,
    outputs_stored: Arc<AtomicBool>,
}

/// A flush under way: the lane it holds (one flush at a time), what it writes, and the Kafka
/// transaction it prepared.
struct Stage {
    /// `None` once the flush has ended (the lane is released).
    lane: Option<OwnedMutexGuard<Lane>>,
    store: Handle,
    writes: Vec<(Bytes, Option<Bytes>)>,
    /// The outputs the prepared transaction carries, kept in PostgreSQL with the rows.
    outputs: Vec<ProducerRecord>,
    /// What the flush's offset commit carries as metadata.
    flush_id: String,
    /// Where the flush leaves the partition: every input's offset, in the store's order, and the
    /// stream time before them.
    at: Position,
    prepared: PreparedTxn,
}

impl Stage {
    fn lane(&mut self) -> &mut Lane {
        self.lane
            .as_deref_mut()
            .expect("a flush step holds its lane until it ends")
    }

    fn error(&mut self, kind: FailureKind, source: PgError) -> SnapshotError {
        if kind.closes_store() {
            self.lane().closed = true;
        }
        store_error(self.store.partition, kind, source)
    }

    /// Ends the flush here: the PostgreSQL transaction rolled back (when open) and the Kafka one aborted.
    /// What fails in doing so is logged: the flush has failed already, and the next one cleans up again.
    async fn unwind(&mut self) {
        let partition = self.store.partition;
        let lane = self.lane();
        if lane.pg_txn_open {
            match lane.pg.batch_execute("ROLLBACK").await {
                Ok(()) => lane.pg_txn_open = false,
                Err(e) => tracing::warn!(partition, error = %e, "rolling back a failed flush"),
            }
        }
        abort_quietly(lane, partition).await;
    }
}

impl Drop for Stage {
    /// A flush abandoned between its steps (its future dropped, or a test holding a step): the open
    /// PostgreSQL transaction is rolled back at once, off this thread, so it does not hold the fencing
    /// row's lock against a takeover; the Kafka transaction is aborted by the next flush (or the next
    /// owner's init).
    fn drop(&mut self) {
        let Some(mut lane) = self.lane.take() else {
            return;
        };
        if !lane.pg_txn_open {
            return;
        }
        if tokio::runtime::Handle::try_current().is_ok() {
            let partition = self.store.partition;
            // Supervised like every task: a rollback that panics or is cancelled leaves the lane
            // marked with its transaction open, exactly as a failed rollback does, and its report
            // says so in the log as that one does.
            crate::supervise::spawn(
                async move {
                    if lane.pg.batch_execute("ROLLBACK").await.is_ok() {
                        lane.pg_txn_open = false;
                    } else {
                        tracing::warn!(
                            partition,
                            "rolling back an abandoned flush failed; the next flush tries again"
                        );
                    }
                },
                move |failure| {
                    tracing::warn!(
                        partition,
                        %failure,
                        "rolling back an abandoned flush did not finish; the next flush tries again"
                    );
                },
            );
        }
    }
}

/// Step 1 done: the Kafka transaction carrying the fenced offset commit is prepared.
pub struct KafkaPrepared(Stage);

/// Step 2 done: the PostgreSQL transaction holds the fencing row (its compare-and-set passed) and the
/// rows, not yet committed.
pub struct RowsWritten(Stage);

/// Step 3 done: the rows and the fencing row's record are committed in PostgreSQL; the Kafka
/// transaction is still prepared.
pub struct RowsCommitted(Stage);

impl KafkaPrepared {
    /// The prepared Kafka transaction's name, which step 2 records on the fencing row.
    pub fn prepared(&self) -> PreparedTxn {
        self.0.prepared
    }

    /// Step 2: `BEGIN`; the compare-and-set on the fencing row (it must still carry this store's epoch;
    /// the update takes the row's lock until the transaction ends), recording the offset and the
    /// prepared transaction's name; the snapshot rows (deletes for `None` values; the last write of a
    /// key wins). A newer owner's epoch fails it with [`PgError::Fenced`]: rolled back, the Kafka
    /// transaction aborted, the store closed.
    ///
    /// Cancel-safe in the sense of the steps: dropping the future drops the step, which rolls the open
    /// PostgreSQL transaction back; the prepared Kafka transaction is aborted by the next flush or
    /// the next owner's init.
    pub async fn write_rows(self) -> Result<RowsWritten, SnapshotError> {
        let KafkaPrepared(mut stage) = self;
        let s = &mut stage;
        let (partition, epoch) = (s.store.partition, s.store.owner_epoch);
        let offsets = s.at.offsets.clone();
        let stream_time = s.at.stream_time;
        let extended = s.store.extended;
        let first = offsets[0];
        let several = (offsets.len() > 1).then_some(&offsets);
        let prefix = s.store.prefix.clone();
        let statements = s.store.statements.clone();
        let prepared = s.prepared.to_string();
        let writes = std::mem::take(&mut s.writes);
        let lane = s.lane();
        lane.pg_txn_open = true;
        let begun = lane.pg.batch_execute("BEGIN").await;
        let recorded = match begun {
            Ok(()) if extended => {
                lane.pg
                    .execute(
                        &statements.record_all,
                        &[
                            &&*prefix,
                            &partition,
                            &epoch,
                            &first,
                            &prepared,
                            &several,
                            &stream_time,
                        ],
                    )
                    .await
            }
            Ok(()) => {
                lane.pg
                    .execute(
                        &statements.record,
                        &[&&*prefix, &partition, &epoch, &first, &prepared],
                    )
                    .await
            }
            Err(e) => Err(e),
        };
        let recorded = match recorded {
            Ok(n) => n,
            Err(e) => {
                let err = lane.statement_error("record the flush", e);
                s.unwind().await;
                return Err(s.error(kind_of(&err), err));
            }
        };
        if recorded != 1 {
            s.unwind().await;
            let lane = s.lane();
            let current = match lane
                .pg
                .query_opt(&statements.owner, &[&&*prefix, &partition])
                .await
            {
                Ok(row) => row.and_then(|r| r.try_get::<_, i64>("owner_epoch").ok()),
                Err(_) => None,
            };
            tracing::warn!(
                partition,
                ours = epoch,
                ?current,
                "flush refused by the fencing row: a newer owner took the partition over; nothing of it landed"
            );
            return Err(s.error(
                FailureKind::ProducerFenced,
                PgError::Fenced {
                    partition,
                    ours: epoch,
                    current,
                },
            ));
        }
        let outputs = std::mem::take(&mut s.outputs);
        let stored_before = s.store.outputs_stored.load(Ordering::SeqCst);
        let flush_id = s.flush_id.clone();
        let lane = s.lane();
        let mut result = upsert_rows(&lane.pg, &statements, &prefix, partition, writes).await;
        if result.is_ok() && (stored_before || !outputs.is_empty()) {
            // Every flush replaces the stored outputs: the last one that committed in Kafka (named by
            // the group's offset metadata) needs none of them again.
            result = store_outputs(
                &lane.pg,
                &statements,
                &prefix,
                partition,
                &flush_id,
                &outputs,
            )
            .await;
        }
        if let Err(e) = result {
            let err = lane.statement_error("write snapshots", e);
            s.unwind().await;
            return Err(s.error(kind_of(&err), err));
        }
        s.outputs = outputs;
        Ok(RowsWritten(stage))
    }
}

impl RowsWritten {
    /// Step 3: `COMMIT`. An answer lost with the connection leaves the outcome unknown: the Kafka side
    /// is left prepared and the store closed, for the next takeover to settle by what the fencing row
    /// says.
    ///
    /// Not cancel-safe in outcome: dropped while `COMMIT` is out, whether the rows landed is unknown,
    /// as with a lost connection; the next takeover settles the Kafka side by the fencing row.
    pub async fn commit_rows(self) -> Result<RowsCommitted, SnapshotError> {
        let RowsWritten(mut stage) = self;
        let s = &mut stage;
        let lane = s.lane();
        match lane.pg.batch_execute("COMMIT").await {
            Ok(()) => {
                lane.pg_txn_open = false;
                // The outputs (the previous owner's included) are in PostgreSQL as this flush's now.
                s.store
                    .outputs_stored
                    .store(!s.outputs.is_empty(), Ordering::SeqCst);
                lock(&s.store.resend).clear();
                Ok(RowsCommitted(stage))
            }
            Err(e) => {
                let err = lane.statement_error("commit", e);
                if matches!(err, PgError::ConnectionLost(_)) {
                    // Whether the server committed is unknown; the Kafka side stays prepared.
                    lane.pg_txn_open = false;
                    return Err(s.error(FailureKind::OutcomeUnknown, err));
                }
                // The server answered with an error: it rolled back.
                lane.pg_txn_open = false;
                s.unwind().await;
                Err(s.error(FailureKind::Aborted, err))
            }
        }
    }
}

impl RowsCommitted {
    /// Step 4: commits the prepared Kafka transaction (the group's committed offset moves). The rows
    /// have landed whatever happens here: a failure (fenced by a newer owner, an unknown outcome) is
    /// reported with its kind, and the next takeover finishes the Kafka side by the fencing row.
    ///
    /// Not cancel-safe in outcome: the rows have landed, but whether the Kafka commit did is unknown to
    /// a caller that dropped the future; the next takeover finishes the Kafka side by the fencing row.
    pub async fn commit_kafka(self) -> Result<(), SnapshotError> {
        let RowsCommitted(mut stage) = self;
        let s = &mut stage;
        let (partition, prepared) = (s.store.partition, s.prepared);
        {
            // Never backwards, input by input.
            let mut committed = lock(&s.store.committed);
            for (c, o) in committed.offsets.iter_mut().zip(&s.at.offsets) {
                *c = (*c).max(*o);
            }
            committed.stream_time = committed.stream_time.max(s.at.stream_time);
        }
        let lane = s.lane();
        let outcome = lane.producer.complete(Some(prepared)).await;
        let result = match outcome {
            Ok(Completion::Committed) => Ok(()),
            Ok(Completion::Aborted) => unreachable_abort(partition),
            Err(e) => {
                // Whatever the kind: the rows (and the outputs stored with them) have landed, and only
                // a takeover can tell whether the Kafka side did; a next flush of this store would
                // replace the stored outputs before anyone sent them again.
                lane.closed = true;
                Err(SnapshotError::Transaction {
                    partition,
                    failure: e.into(),
                })
            }
        };
        s.lane = None;
        result
    }
}

/// `complete` with the prepared transaction's own name commits; an abort there would be a bug in the
/// producer, reported as a fatal failure rather than a panic.
fn unreachable_abort(partition: i32) -> Result<(), SnapshotError> {
    Err(store_error(
        partition,
        FailureKind::Fatal,
        PgError::BadRow {
            partition,
            detail: "the prepared transaction was aborted although it was named".into(),
        },
    ))
}

/// A lost connection ends the store (fatal); a statement the server refused aborts only the flush.
fn kind_of(e: &PgError) -> FailureKind {
    match e {
        PgError::ConnectionLost(_) => FailureKind::Fatal,
        _ => FailureKind::Aborted,
    }
}

/// Before a flush: whatever an abandoned one left behind is ended.
async fn clean_up(lane: &mut Lane, partition: i32) -> Result<(), SnapshotError> {
    if lane.pg_txn_open {
        if let Err(e) = lane.pg.batch_execute("ROLLBACK").await {
            let err = lane.statement_error("roll back an abandoned flush", e);
            lane.closed = true;
            return Err(store_error(partition, FailureKind::Fatal, err));
        }
        lane.pg_txn_open = false;
    }
    if matches!(
        lane.producer.state(),
        TransactionState::InTransaction
            | TransactionState::Prepared
            | TransactionState::AbortableError
    ) {
        if let Err(e) = lane.producer.abort().await {
            let kind = FailureKind::of(&e);
            if kind.closes_store() {
                lane.closed = true;
            }
            return Err(SnapshotError::Transaction {
                partition,
                failure: e.into(),
            });
        }
    }
    Ok(())
}

/// Aborts the open Kafka transaction of a failed flush; a failure to do so is logged (a fenced producer
/// cannot abort, and need not: the newer owner's init did).
async fn abort_quietly(lane: &mut Lane, partition: i32) {
    if let Err(e) = lane.producer.abort().await {
        if FailureKind::of(&e).closes_store() {
            lane.closed = true;
        }
        tracing::debug!(partition, error = %e, "aborting a failed flush's Kafka transaction");
    }
}

/// Connects, and watches the connection's task: its end (an error, or a panic) is kept for the next
/// statement's error.
pub(crate) async fn connect(
    config: &PgStoreConfig,
) -> Result<(tokio_postgres::Client, Arc<Mutex<Option<String>>>), PgError> {
    let url = redacted(&config.url);
    let (client, connection) = tokio::time::timeout(
        config.connect_timeout,
        tokio_postgres::connect(&config.url, NoTls),
    )
    .await
    .map_err(|_| PgError::Connect {
        url: url.clone(),
        reason: format!("no connection within {:?}", config.connect_timeout),
    })?
    .map_err(|e| PgError::Connect {
        url: url.clone(),
        reason: e.to_string(),
    })?;
    let lost = Arc::new(Mutex::new(None));
    let (ended, failed) = (lost.clone(), lost.clone());
    crate::supervise::spawn(
        async move {
            let why = match connection.await {
                Ok(()) => "closed".to_owned(),
                Err(e) => e.to_string(),
            };
            *lock(&ended) = Some(why);
        },
        move |failure| *lock(&failed) = Some(format!("the connection task {failure}")),
    );
    Ok((client, lost))
}

/// The partition's two-phase producer: kept prepared transaction if the broker allows it, the
/// ordinary two-phase init (which aborts it) if the broker refuses to keep one. A refusal
/// TRANSACTIONAL_ID_AUTHORIZATION_FAILED is told apart by the broker's setting (when the principal may
/// read it: DESCRIBE_CONFIGS on the cluster; otherwise the refusal names both causes). A cluster at
/// transaction version 1 is refused.
async fn two_phase_producer(
    client: &Client,
    snapshots: &SnapshotConfig,
    partition: i32,
) -> Result<TransactionalProducer, SnapshotError> {
    let id = snapshots.transactional_id(partition);
    let mut config = TransactionalConfig::new(id.clone());
    config.two_phase_commit = true;
    config.producer = snapshots.producer.clone();
    let acquire = |source| SnapshotError::Acquire { partition, source };
    let first = TransactionalProducer::init_keeping_prepared(client.clone(), config.clone()).await;
    let result = match first {
        Ok((producer, _)) => Ok(producer),
        Err(e) if e.two_phase_refusal() == Some(TwoPhaseCommitRefusal::KeepPreparedUnsupported) => {
            tracing::debug!(
                partition,
                "the broker cannot keep a prepared transaction (KAFKA-20739); initialising without: an open one is aborted"
            );
            TransactionalProducer::init(client.clone(), config).await
        }
        Err(e) => Err(e),
    };
    match result {
        // A flush names its Kafka transaction by producer id and epoch, which only transaction version
        // 2 changes with every transaction: refuse a TV1 cluster now, not at every flush.
        Ok(p) if p.transaction_version() < 2 => {
            p.close().await;
            Err(acquire(ProducerError::TwoPhaseCommitRefused {
                transactional_id: id,
                refusal: TwoPhaseCommitRefusal::NeedsTransactionVersion2,
            }))
        }
        Ok(p) => Ok(p),
        Err(e) if e.two_phase_refusal() == Some(TwoPhaseCommitRefusal::NotAuthorizedOrDisabled) => {
            let refusal = match crate::admin::two_phase_commit_enabled(client, &id).await {
                Ok(Some(false)) => TwoPhaseCommitRefusal::DisabledOnBroker,
                Ok(Some(true)) => TwoPhaseCommitRefusal::NotAuthorized,
                _ => TwoPhaseCommitRefusal::NotAuthorizedOrDisabled,
            };
            Err(acquire(ProducerError::TwoPhaseCommitRefused {
                transactional_id: id,
                refusal,
            }))
        }
        Err(e) => Err(acquire(e)),
    }
}

/// `CREATE TABLE IF NOT EXISTS` of the store's tables. Stores of partitions acquired together create
/// them at once and may race on the catalog (a duplicate `pg_type` name); one retry settles it.
pub(crate) async fn create_tables(
    pg: &tokio_postgres::Client,
    statements: &Statements,
) -> Result<(), tokio_postgres::Error> {
    if let Err(e) = pg.batch_execute(&statements.create).await {
        tracing::debug!(error = %e, "creating the snapshot tables; once more");
        pg.batch_execute(&statements.create).await?;
    }
    Ok(())
}

/// Every row of `partition`, streamed into a [`RecoveredState`].
pub(crate) async fn read_rows(
    pg: &tokio_postgres::Client,
    statements: &Statements,
    prefix: &str,
    partition: i32,
) -> Result<RecoveredState, tokio_postgres::Error> {
    use futures_util::TryStreamExt as _;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&prefix, &partition];
    let rows = pg.query_raw(&statements.read, params).await?;
    futures_util::pin_mut!(rows);
    let mut state = RecoveredState::new();
    while let Some(row) = rows.try_next().await? {
        let key: &[u8] = row.get(0);
        let value: &[u8] = row.get(1);
        state.insert(key, value);
    }
    Ok(state)
}

/// Writes `writes` into `partition`'s rows: one upsert of every value, one delete of every key whose
/// value is `None`. The last write of a key wins (a key may not appear twice in one upsert).
pub(crate) async fn upsert_rows(
    pg: &tokio_postgres::Client,
    statements: &Statements,
    prefix: &str,
    partition: i32,
    writes: Vec<(Bytes, Option<Bytes>)>,
) -> Result<(), tokio_postgres::Error> {
    let mut last: HashMap<Bytes, Option<Bytes>> = HashMap::with_capacity(writes.len());
    for (k, v) in writes {
        last.insert(k, v);
    }
    let mut keys: Vec<&[u8]> = Vec::new();
    let mut values: Vec<&[u8]> = Vec::new();
    let mut deletes: Vec<&[u8]> = Vec::new();
    for (k, v) in &last {
        match v {
            Some(v) => {
                keys.push(k);
                values.push(v);
            }
            None => deletes.push(k),
        }
    }
    if !keys.is_empty() {
        pg.execute(&statements.upsert, &[&prefix, &partition, &keys, &values])
            .await?;
    }
    if !deletes.is_empty() {
        pg.execute(&statements.delete, &[&prefix, &partition, &deletes])
            .await?;
    }
    Ok(())
}

/// The metadata of the group's committed offset for `input`: the id of the last flush whose Kafka side
/// committed (`None`: no flush committed, or no group yet).
async fn kafka_flush_id(
    client: &Client,
    metadata: &dyn MetadataSource,
    input: &TopicPartition,
) -> Result<Option<String>, SnapshotError> {
    let partition = input.partition;
    let Some(group) = metadata.current() else {
        return Err(SnapshotError::MissingGroupMetadata { partition });
    };
    let committed =
        committed_offsets_and_metadata(client, group.group_id(), std::slice::from_ref(input))
            .await
            .map_err(|e| SnapshotError::Consumer {
                partition,
                source: Arc::new(e),
            })?;
    Ok(committed.get(input).cloned().flatten().and_then(|(_, m)| m))
}

/// Replaces `partition`'s stored outputs with `outputs` of flush `flush_id` (none: just clears).
async fn store_outputs(
    pg: &tokio_postgres::Client,
    statements: &Statements,
    prefix: &str,
    partition: i32,
    flush_id: &str,
    outputs: &[ProducerRecord],
) -> Result<(), tokio_postgres::Error> {
    pg.execute(&statements.outputs_clear, &[&prefix, &partition])
        .await?;
    if outputs.is_empty() {
        return Ok(());
    }
    let seqs: Vec<i32> = (0..outputs.len())
        .map(|i| i32::try_from(i).unwrap_or(i32::MAX))
        .collect();
    let topics: Vec<&str> = outputs.iter().map(|o| &*o.topic).collect();
    let targets: Vec<i32> = outputs.iter().map(|o| o.partition.unwrap_or(-1)).collect();
    let keys: Vec<Option<&[u8]>> = outputs.iter().map(|o| o.key.as_deref()).collect();
    let values: Vec<Option<&[u8]>> = outputs.iter().map(|o| o.value.as_deref()).collect();
    let headers: Vec<Option<Vec<u8>>> = outputs
        .iter()
        .map(|o| (!o.headers.is_empty()).then(|| encode_headers(&o.headers)))
        .collect();
    let timestamps: Vec<i64> = outputs.iter().map(|o| o.timestamp.unwrap_or(-1)).collect();
    pg.execute(
        &statements.outputs_insert,
        &[
            &prefix,
            &partition,
            &flush_id,
            &seqs,
            &topics,
            &targets,
            &keys,
            &values,
            &headers,
            &timestamps,
        ],
    )
    .await?;
    Ok(())
}

/// `partition`'s stored outputs in order, each with the id of the flush that stored it.
async fn read_outputs(
    pg: &tokio_postgres::Client,
    statements: &Statements,
    prefix: &str,
    partition: i32,
) -> Result<Vec<(String, ProducerRecord)>, PgError> {
    let rows = pg
        .query(&statements.outputs_read, &[&prefix, &partition])
        .await
        .map_err(|e| PgError::Statement {
            step: "read stored outputs",
            source: Arc::new(e),
        })?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let flush_id: String = row.get(0);
        let topic: String = row.get(1);
        let target: i32 = row.get(2);
        let key: Option<Vec<u8>> = row.get(3);
        let value: Option<Vec<u8>> = row.get(4);
        let headers: Option<Vec<u8>> = row.get(5);
        let ts: i64 = row.get(6);
        let mut record = ProducerRecord::new(topic, value.map(Bytes::from));
        record.key = key.map(Bytes::from);
        record.partition = (target >= 0).then_some(target);
        record.timestamp = (ts >= 0).then_some(ts);
        if let Some(h) = headers {
            record.headers = decode_headers(&h).ok_or(PgError::BadRow {
                partition,
                detail: "stored output headers do not decode".into(),
            })?;
        }
        out.push((flush_id, record));
    }
    Ok(out)
}

/// Headers as bytes: per header, the key's length (u32 BE) and bytes, then the value's length (i32 BE,
/// -1 for null) and bytes.
fn encode_headers(headers: &[Header]) -> Vec<u8> {
    let mut out = Vec::new();
    for h in headers {
        out.extend_from_slice(&u32::try_from(h.key.len()).unwrap_or(u32::MAX).to_be_bytes());
        out.extend_from_slice(&h.key);
        match &h.value {
            Some(v) => {
                out.extend_from_slice(&i32::try_from(v.len()).unwrap_or(i32::MAX).to_be_bytes());
                out.extend_from_slice(v);
            }
            None => out.extend_from_slice(&(-1i32).to_be_bytes()),
        }
    }
    out
}

/// The inverse of [`encode_headers`]; `None` when the bytes are not such an encoding (every length is
/// checked against what is left before anything is taken).
fn decode_headers(mut bytes: &[u8]) -> Option<Vec<Header>> {
    fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        if bytes.len() < n {
            return None;
        }
        let (head, rest) = bytes.split_at(n);
        *bytes = rest;
        Some(head)
    }
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let key_len = u32::from_be_bytes(take(&mut bytes, 4)?.try_into().ok()?);
        let key = Bytes::copy_from_slice(take(&mut bytes, usize::try_from(key_len).ok()?)?);
        let value_len = i32::from_be_bytes(take(&mut bytes, 4)?.try_into().ok()?);
        let value = match value_len {
            -1 => None,
            n if n >= 0 => Some(Bytes::copy_from_slice(take(
                &mut bytes,
                usize::try_from(n).ok()?,
            )?)),
            _ => return None,
        };
        out.push(Header { key, value });
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(committed: Option<i64>, inputs: Option<Vec<i64>>) -> FencingRow {
        FencingRow {
            owner_epoch: 7,
            committed_offset: committed,
            prepared_txn: None,
            has_extended_columns: true,
            input_offsets: inputs,
            stream_time: None,
        }
    }

    /// `resume_from` without stream time: the offsets and whether the group is behind.
    fn resume(row: &FencingRow, assigned: &[i64]) -> Result<(Vec<i64>, bool), String> {
        let at = Position {
            offsets: assigned.to_vec(),
            stream_time: None,
        };
        resume_from(row, &at).map(|(p, behind)| (p.offsets, behind))
    }

    /// A takeover starts every input at the later of the fencing row's offset and the group's, and
    /// calls the group behind when the row is ahead on any input. One input reads only
    /// `committed_offset`; several read the vector while it is current (its first entry is
    /// `committed_offset`), and only the first input's offset when a later one-input flush left it
    /// stale. A current vector of another length is refused: the flow's inputs changed.
    #[test]
    fn a_takeover_resumes_each_input_at_the_later_of_row_and_group() {
        // Nothing recorded: the group's word.
        assert_eq!(resume(&row(None, None), &[5, 9]), Ok((vec![5, 9], false)));
        // One input.
        assert_eq!(resume(&row(Some(12), None), &[10]), Ok((vec![12], true)));
        assert_eq!(resume(&row(Some(8), None), &[10]), Ok((vec![10], false)));
        assert_eq!(
            resume(&row(Some(8), Some(vec![8, 3])), &[10]),
            Ok((vec![10], false)),
            "one input ignores a vector"
        );
        // Several: a flush whose rows committed and whose Kafka side did not.
        assert_eq!(
            resume(&row(Some(12), Some(vec![12, 40])), &[10, 31]),
            Ok((vec![12, 40], true))
        );
        // The row ahead on one input only (the other input had nothing new): still behind.
        assert_eq!(
            resume(&row(Some(10), Some(vec![10, 40])), &[10, 31]),
            Ok((vec![10, 40], true))
        );
        // Row and group agree.
        assert_eq!(
            resume(&row(Some(10), Some(vec![10, 31])), &[10, 31]),
            Ok((vec![10, 31], false))
        );
        // A stale vector (a one-input flush moved committed_offset on since): the first input only.
        assert_eq!(
            resume(&row(Some(20), Some(vec![10, 40])), &[15, 31]),
            Ok((vec![20, 31], true))
        );
        // Written before the flow had several inputs: the first input only.
        assert_eq!(
            resume(&row(Some(20), None), &[15, 31]),
            Ok((vec![20, 31], true))
        );
        // A current vector of another length: the inputs' number changed.
        let e = resume(&row(Some(10), Some(vec![10, 40, 2])), &[10, 31]).unwrap_err();
        assert!(e.contains("3 inputs") && e.contains("has 2"), "{e}");
    }

    /// The stream time goes with the offsets a takeover starts at: the row's when the row is ahead
    /// (never below the group's), the group's otherwise, even when the row holds a later one (a
    /// stale one from an earlier run, since the row is not ahead). A flush id is read back from the
    /// metadata with or without a stream time after it.
    #[test]
    fn the_stream_time_goes_with_the_offsets_resumed_from() {
        let at = |offset: i64, st: Option<i64>| Position {
            offsets: vec![offset],
            stream_time: st,
        };
        let mut ahead = row(Some(12), None);
        ahead.stream_time = Some(5_000);
        assert_eq!(
            resume_from(&ahead, &at(10, Some(4_000))),
            Ok((at(12, Some(5_000)), true))
        );
        assert_eq!(
            resume_from(&ahead, &at(10, None)),
            Ok((at(12, Some(5_000)), true))
        );
        // A row ahead whose stream time lags the group's (left by a run without stream time).
        ahead.stream_time = Some(100);
        assert_eq!(
            resume_from(&ahead, &at(10, Some(4_000))),
            Ok((at(12, Some(4_000)), true))
        );
        let mut level = row(Some(12), None);
        level.stream_time = Some(9_000);
        assert_eq!(
            resume_from(&level, &at(12, Some(5_000))),
            Ok((at(12, Some(5_000)), false))
        );
        assert_eq!(
            flush_id_of("snapfence-flush 3.7 st=1700"),
            "snapfence-flush 3.7"
        );
        assert_eq!(flush_id_of("snapfence-flush 3.7"), "snapfence-flush 3.7");
    }

    /// Stored output headers round-trip (null values and empty keys included), and bytes that are not
    /// such an encoding (a length past the end, a negative length other than -1) are refused, never
    /// read past.
    #[test]
    fn headers_round_trip_and_bad_bytes_are_refused() {
        let headers = vec![
            Header {
                key: Bytes::from_static(b"schema"),
                value: Some(Bytes::from_static(b"v2")),
            },
            Header {
                key: Bytes::new(),
                value: None,
            },
        ];
        let bytes = encode_headers(&headers);
        assert_eq!(decode_headers(&bytes), Some(headers));
        assert_eq!(decode_headers(&[]), Some(Vec::new()));
        assert_eq!(decode_headers(&[0, 0, 0, 9, b'a']), None);
        assert_eq!(decode_headers(&[0, 0, 0, 0, 0xff, 0xff, 0xff, 0xfe]), None);
        assert_eq!(decode_headers(&[0, 0, 0]), None);
    }
}
