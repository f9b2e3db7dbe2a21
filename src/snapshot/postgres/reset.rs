//! An operator's reset of one partition of the PostgreSQL store (what `snapfence reset --postgres` runs):
//! the rows and the fencing row, moved together to a new input position (every input's, for a flow with
//! several).
//!
//! A takeover starts at the later of the fencing row's `committed_offset` and the group's committed
//! offset, so moving only the group's offset back would be undone silently by the row. A reset
//! therefore records the new offset on the row too, and deletes the snapshot rows that would contradict
//! it: every row whose envelope offset (the last input event folded into its key) is at or past it, for
//! the reason the topic's reset gives (docs/cli.md, "reset").

use super::sql::Statements;
use super::store::{connect, read_rows, FencingRow};
use super::{PgError, PgStoreConfig};
use crate::snapshot::{open_snapshot_value, RecoveredState};

/// One partition of the store as it stands, read without taking anything over.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PgPartitionView {
    /// The fencing row's owner epoch (`None`: no owner ever took the partition).
    pub owner_epoch: Option<i64>,
    /// The input offset the last flush recorded (`None`: none yet); of the first input, for a flow with
    /// several.
    pub committed_offset: Option<i64>,
    /// Every input's offset the last flush of a flow with several inputs recorded (`None`: a flow of
    /// one input, or a vector a later one-input flush left stale).
    pub input_offsets: Option<Vec<i64>>,
    /// Every snapshot row's key and value (the envelope included, as on the snapshot topic).
    pub snapshots: RecoveredState,
}

/// What [`reset_partition`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PgPartitionReset {
    /// The fencing row's owner epoch after the reset's bump: every flush of an owner that took over
    /// before it fails its compare-and-set.
    pub owner_epoch: i64,
    /// Snapshot rows deleted (envelope offset at or past the new offset).
    pub deleted: usize,
    /// Snapshot rows kept.
    pub kept: usize,
}

/// Reads `partition`'s fencing row and snapshot rows for the flow whose transactional id prefix is
/// `prefix`. Changes nothing.
///
/// Cancel-safe: it only reads.
pub async fn inspect_partition(
    config: &PgStoreConfig,
    prefix: &str,
    partition: i32,
) -> Result<PgPartitionView, PgError> {
    let (statements, pg, lost) = open(config).await?;
    let failed = |step, e| statement_error(&pg, &lost, step, e);
    let row = pg
        .query_opt(&statements.owner, &[&prefix, &partition])
        .await
        .map_err(|e| failed("read the fencing row", e))?
        .map(|r| FencingRow::of(&r))
        .transpose()
        .map_err(|detail| PgError::BadRow { partition, detail })?;
    let snapshots = read_rows(&pg, &statements, prefix, partition)
        .await
        .map_err(|e| failed("read snapshots", e))?;
    Ok(PgPartitionView {
        owner_epoch: row.as_ref().map(|r| r.owner_epoch),
        committed_offset: row.as_ref().and_then(|r| r.committed_offset),
        input_offsets: row.as_ref().and_then(several_inputs),
        snapshots,
    })
}

/// The row's vector of input offsets, when it is current and counts more than one input.
fn several_inputs(row: &FencingRow) -> Option<Vec<i64>> {
    let n = row.input_offsets.as_ref()?.len();
    let recorded = row.recorded(n).ok()?;
    (n > 1 && recorded.iter().all(Option::is_some))
        .then(|| recorded.into_iter().flatten().collect())
}

/// [`reset_partition_inputs`] of a flow with one input.
///
/// Not cancel-safe in outcome, as [`reset_partition_inputs`].
pub async fn reset_partition(
    config: &PgStoreConfig,
    prefix: &str,
    partition: i32,
    offset: i64,
) -> Result<PgPartitionReset, PgError> {
    reset_partition_inputs(config, prefix, partition, &[offset]).await
}

/// Resets `partition` of the flow whose transactional id prefix is `prefix` to input offsets `offsets`
/// (one per input, in the flow's order),
/// in one PostgreSQL transaction: bumps the fencing row's owner epoch (waiting for a flush that holds
/// the row's lock, then failing every later flush of every earlier owner), deletes each snapshot row
/// that accounts for an event at or past the new offset of any input
/// ([`SnapshotValue::reaches`](crate::snapshot::SnapshotValue::reaches)), forgets the outputs stored
/// for a resend (they belong to a flush the reset discards), and records the offsets on the row with no
/// prepared transaction and no stream time. Nothing changes when a row holds a value that is no
/// snapshot envelope ([`PgError::BadRow`]), or when the fencing row or a snapshot row accounts for
/// another number of inputs ([`PgError::InputCount`]).
///
/// Move the group's committed offset first: stopped between the two, the row still holds the old
/// offset and a takeover resumes there, with the snapshots that match it.
///
/// Not cancel-safe in outcome: dropped after the `COMMIT` was sent, the reset may or may not have
/// happened (running it again is harmless).
pub async fn reset_partition_inputs(
    config: &PgStoreConfig,
    prefix: &str,
    partition: i32,
    offsets: &[i64],
) -> Result<PgPartitionReset, PgError> {
    let Some(&offset) = offsets.first() else {
        return Err(PgError::InputCount {
            partition,
            what: "the reset".into(),
            recorded: 0,
            named: 0,
        });
    };
    let (statements, pg, lost) = open(config).await?;
    let failed = |step, e| statement_error(&pg, &lost, step, e);
    pg.batch_execute("BEGIN")
        .await
        .map_err(|e| failed("begin the reset", e))?;
    let outcome = async {
        let row = pg
            .query_one(&statements.bump, &[&prefix, &partition])
            .await
            .map_err(|e| failed("reset (bump the fencing row)", e))?;
        let row = FencingRow::of(&row).map_err(|detail| PgError::BadRow { partition, detail })?;
        let recorded = several_inputs(&row).map_or(1, |v| v.len());
        if recorded != offsets.len() && recorded > 1 {
            return Err(PgError::InputCount {
                partition,
                what: "the fencing row".into(),
                recorded,
                named: offsets.len(),
            });
        }
        let owner_epoch = row.owner_epoch;
        let rows = read_rows(&pg, &statements, prefix, partition)
            .await
            .map_err(|e| failed("read snapshots", e))?;
        let mut doomed: Vec<&[u8]> = Vec::new();
        for (key, value) in &rows {
            let opened = open_snapshot_value(value).map_err(|e| PgError::BadRow {
                partition,
                detail: format!(
                    "the snapshot row of key {key:02x?} is not a snapshot envelope: {e}"
                ),
            })?;
            match opened.reaches(offsets) {
                Some(true) => doomed.push(key),
                Some(false) => {}
                None => {
                    return Err(PgError::InputCount {
                        partition,
                        what: format!("the snapshot row of key {key:02x?}"),
                        recorded: opened.input_offsets().len(),
                        named: offsets.len(),
                    })
                }
            }
        }
        pg.execute(&statements.delete, &[&prefix, &partition, &doomed])
            .await
            .map_err(|e| failed("reset (delete snapshots)", e))?;
        pg.execute(&statements.outputs_clear, &[&prefix, &partition])
            .await
            .map_err(|e| failed("reset (forget stored outputs)", e))?;
        if row.has_extended_columns {
            let several = (offsets.len() > 1).then_some(offsets);
            pg.execute(
                &statements.reset_row_all,
                &[&prefix, &partition, &offset, &several],
            )
            .await
            .map_err(|e| failed("reset (record the offsets)", e))?;
        } else {
            // No flow with several inputs or stream time ever ran on this table; a takeover of one
            // with several inputs reads the first input's offset from the row and the others' from
            // the group.
            pg.execute(&statements.reset_row, &[&prefix, &partition, &offset])
                .await
                .map_err(|e| failed("reset (record the offset)", e))?;
        }
        Ok(PgPartitionReset {
            owner_epoch,
            deleted: doomed.len(),
            kept: rows.len() - doomed.len(),
        })
    }
    .await;
    match outcome {
        Ok(done) => {
            pg.batch_execute("COMMIT")
                .await
                .map_err(|e| failed("commit the reset", e))?;
            Ok(done)
        }
        Err(e) => {
            // Best effort: a dropped connection rolls back by itself.
            let _ = pg.batch_execute("ROLLBACK").await;
            Err(e)
        }
    }
}

type Lost = std::sync::Arc<std::sync::Mutex<Option<String>>>;

async fn open(
    config: &PgStoreConfig,
) -> Result<(Statements, tokio_postgres::Client, Lost), PgError> {
    if !super::sql::valid_prefix(&config.table_prefix) {
        return Err(PgError::InvalidTablePrefix(config.table_prefix.clone()));
    }
    let (pg, lost) = connect(config).await?;
    Ok((Statements::new(&config.table_prefix), pg, lost))
}

fn statement_error(
    pg: &tokio_postgres::Client,
    lost: &Lost,
    step: &'static str,
    e: tokio_postgres::Error,
) -> PgError {
    if pg.is_closed() {
        let why = lost
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .unwrap_or_else(|| e.to_string());
        return PgError::ConnectionLost(why);
    }
    PgError::Statement {
        step,
        source: std::sync::Arc::new(e),
    }
}
