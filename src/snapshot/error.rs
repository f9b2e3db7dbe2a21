//! The snapshot layer's errors.

use std::sync::Arc;

/// Why a transaction that carried snapshot writes did not commit.
///
/// The classes decide what the owner of the partition does next:
/// - [`FailureKind::Fenced`]: the group coordinator refused the offset commit (stale generation or member
///   epoch, unknown member, fenced static instance). This owner is stale and must stop; the transaction was
///   aborted and none of its writes landed.
/// - [`FailureKind::Fatal`]: the producer is unusable (producer fenced by a newer owner's init, authorization,
///   unsupported version). The store is closed; a new acquisition is needed.
/// - [`FailureKind::Aborted`]: the transaction was aborted and nothing in it landed; retrying is safe.
/// - [`FailureKind::OutcomeUnknown`]: a commit was sent and no answer came. The writes may or may not be
///   visible. The store is closed: re-acquiring (InitProducerId) settles the outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailureKind {
    /// The consumer-group fence rejected the commit.
    Fenced,
    /// The producer can no longer be used.
    Fatal,
    /// Aborted; nothing landed; safe to retry.
    Aborted,
    /// Sent, unanswered: it may have committed.
    OutcomeUnknown,
}

/// A transaction failure, shared by every write that rode in the transaction (hence `Clone`).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{kind:?}: {source}")]
pub struct TxnFailure {
    /// What the caller must do about it.
    pub kind: FailureKind,
    /// The underlying cause.
    #[source]
    pub source: Arc<dyn std::error::Error + Send + Sync>,
}

impl TxnFailure {
    /// Wraps a cause with its class.
    pub fn new(
        kind: FailureKind,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        TxnFailure {
            kind,
            source: Arc::from(source.into()),
        }
    }
}

/// What a recovery read that stopped advancing found when it re-read the log end.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StallDiagnosis {
    /// The log end is now below the captured target: acknowledged snapshot records were lost (an unclean
    /// leader election or a disk loss). Recovery cannot complete as captured; an operator must decide between
    /// an offset reset and a restore.
    Truncated {
        /// The log end found by the re-read.
        log_end: i64,
    },
    /// The log end is at or above the target, so the records exist but read_committed may not pass them: an
    /// open transaction pins the last stable offset. Either a hanging transaction (find and abort it with
    /// `snapfence find-hanging`) or one whose timeout exceeds the stall deadline (it heals by itself).
    OpenTransaction {
        /// The log end found by the re-read.
        log_end: i64,
        /// The last stable offset, when the re-read could get it.
        last_stable_offset: Option<i64>,
    },
    /// The re-read failed, so the cause could not be determined.
    Undetermined {
        /// Why the re-read failed.
        reason: String,
    },
}

impl std::fmt::Display for StallDiagnosis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StallDiagnosis::Truncated { log_end } => write!(
                f,
                "the log was truncated to {log_end}, below the captured target: snapshot records were lost; \
                 an operator must decide between an offset reset and a restore"
            ),
            StallDiagnosis::OpenTransaction {
                log_end,
                last_stable_offset,
            } => {
                write!(f, "the log end {log_end} is at or above the target, so an open transaction pins the read")?;
                if let Some(lso) = last_stable_offset {
                    write!(f, " (last stable offset {lso})")?;
                }
                write!(
                    f,
                    ": a hanging transaction (see `snapfence find-hanging`) or one whose timeout exceeds the stall deadline"
                )
            }
            StallDiagnosis::Undetermined { reason } => {
                write!(f, "the cause could not be determined: re-reading the log end failed: {reason}")
            }
        }
    }
}

/// Errors of the snapshot layer.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// The transaction carrying this write (or offset) did not commit.
    #[error("snapshot partition {partition}: transaction failed: {failure}")]
    Transaction {
        /// The snapshot (= input) partition.
        partition: i32,
        /// The shared failure.
        #[source]
        failure: TxnFailure,
    },
    /// No live group metadata: the consumer has not completed a join (or has left). Nothing was sent: a
    /// commit without a generation would skip the coordinator's fence.
    #[error("snapshot partition {partition}: no live consumer group metadata; refusing to commit ungated")]
    MissingGroupMetadata {
        /// The snapshot partition.
        partition: i32,
    },
    /// The recovery read stopped advancing for longer than the stall deadline.
    #[error(
        "snapshot partition {partition}: recovery read stalled at offset {position} for {stalled_for:?} \
         (target {target}): {diagnosis}"
    )]
    RecoveryStalled {
        /// The snapshot partition.
        partition: i32,
        /// The read_committed position reached.
        position: i64,
        /// The high watermark captured at the start of the read.
        target: i64,
        /// How long the position had not moved.
        stalled_for: std::time::Duration,
        /// What the re-read of the log end says.
        diagnosis: StallDiagnosis,
    },
    /// The store was closed (revoked or failed fatally) before this call could be served.
    #[error("snapshot partition {partition}: the store is closed")]
    Closed {
        /// The snapshot partition.
        partition: i32,
    },
    /// The task that runs the partition's group-commit transactions died (it panicked). Every write and
    /// offset commit waiting on it fails with this, and the store refuses new ones: the producer's state
    /// after the panic is unknown, so nothing more is sent on it. Whether the transaction in flight
    /// committed is unknown too (as for [`FailureKind::OutcomeUnknown`]): acquire the partition again.
    #[error("snapshot partition {partition}: the group-commit task died: {message}")]
    DrainDied {
        /// The snapshot partition.
        partition: i32,
        /// The panic message.
        message: String,
    },
    /// Invalid configuration.
    #[error("invalid snapshot configuration: {0}")]
    Config(String),
    /// An error from the layers below (reading, the broker, the consumer).
    #[error("snapshot partition {partition}: {source}")]
    Io {
        /// The snapshot partition.
        partition: i32,
        /// The cause.
        #[source]
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
}

impl SnapshotError {
    /// `true` when the consumer-group fence rejected this owner's commit: the owner is stale and must stop.
    pub fn is_fenced(&self) -> bool {
        matches!(self, SnapshotError::Transaction { failure, .. } if failure.kind == FailureKind::Fenced)
    }

    /// `true` when the transaction failed because the partition's producer was fenced by a newer epoch
    /// on its transactional id (`PRODUCER_FENCED` / `INVALID_PRODUCER_EPOCH`): a newer owner's acquire
    /// came first, or the coordinator timed the transaction out. Either way the store is closed and this
    /// owner must stop writing; a later owner re-acquires. [`SnapshotError::is_fenced`] is the other fence.
    pub fn is_producer_fenced(&self) -> bool {
        matches!(
            self,
            SnapshotError::Transaction { failure, .. }
                if matches!(
                    failure.source.downcast_ref::<crate::producer::ProducerError>(),
                    Some(crate::producer::ProducerError::Fenced { .. })
                )
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::producer::ProducerError;
    use crate::wire::ErrorCode;

    fn failed(kind: FailureKind, cause: ProducerError) -> SnapshotError {
        SnapshotError::Transaction {
            partition: 0,
            failure: TxnFailure::new(kind, cause),
        }
    }

    /// A zombie refused by a newer owner's producer epoch is recognisable as such, and stays distinct from
    /// the group coordinator's fence.
    #[test]
    fn the_two_fences_are_told_apart() {
        let epoch = failed(
            FailureKind::Fatal,
            ProducerError::Fenced {
                transactional_id: "t-0".into(),
                code: ErrorCode::InvalidProducerEpoch,
            },
        );
        assert!(epoch.is_producer_fenced() && !epoch.is_fenced());
        let generation = failed(
            FailureKind::Fenced,
            ProducerError::CommitFenced {
                group_id: "g".into(),
                code: ErrorCode::IllegalGeneration,
            },
        );
        assert!(generation.is_fenced() && !generation.is_producer_fenced());
        assert!(!failed(FailureKind::Fatal, ProducerError::Closed).is_producer_fenced());
    }
}
