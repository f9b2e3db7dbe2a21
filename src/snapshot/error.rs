//! The snapshot layer's errors, and the one mapping from a failed transaction to what the runtime does.

use std::sync::Arc;

use crate::producer::{ErrorClass, ProducerError};
use crate::wire::ErrorCode;

/// Why a transaction that carried snapshot writes did not commit.
///
/// [`FailureKind::of`] is the only place a [`ProducerError`] is classified for the snapshot layer, and
/// [`FailureKind::response`] the only place a class is turned into what the runtime does about it. The
/// group commit reads [`FailureKind::aborts`] and [`FailureKind::closes_store`]; the flow's
/// [`is_fenced`](SnapshotError::is_fenced) and [`is_producer_fenced`](SnapshotError::is_producer_fenced)
/// are views of the same kinds. Nothing else looks at the producer's error to decide.
///
/// - [`FailureKind::Fenced`]: the group coordinator refused the offset commit for a stale generation or
///   member epoch (`ILLEGAL_GENERATION`, `FENCED_MEMBER_EPOCH`, `STALE_MEMBER_EPOCH`). The transaction was
///   aborted and nothing landed; the member may still own the partition (a rebalance it has not seen yet).
/// - [`FailureKind::Evicted`]: the coordinator no longer knows the member (`UNKNOWN_MEMBER_ID`). Aborted,
///   nothing landed; the member must rejoin as a new one.
/// - [`FailureKind::InstanceFenced`]: another process joined with this static member's instance id
///   (`FENCED_INSTANCE_ID`). Aborted, nothing landed; rejoining would fence the other process back, so stop.
/// - [`FailureKind::ProducerFenced`]: the partition's producer was fenced by a newer epoch on its
///   transactional id (`PRODUCER_FENCED`, `INVALID_PRODUCER_EPOCH`): a newer owner acquired the partition,
///   or the coordinator timed the transaction out. The store is closed.
/// - [`FailureKind::Fatal`]: the producer is unusable for another reason (authorization, unsupported
///   version, a failed abort). The store is closed.
/// - [`FailureKind::Aborted`]: the transaction was aborted and nothing in it landed; retrying is safe.
/// - [`FailureKind::OutcomeUnknown`]: a commit was sent and no answer came. The writes may or may not be
///   visible. The store is closed: re-acquiring (InitProducerId) settles the outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailureKind {
    /// The group coordinator refused the commit for a stale generation or member epoch.
    Fenced,
    /// The group coordinator does not know the member any more.
    Evicted,
    /// Another process took this static member's instance id.
    InstanceFenced,
    /// A newer producer epoch on the transactional id fenced this one.
    ProducerFenced,
    /// The producer can no longer be used.
    Fatal,
    /// Aborted; nothing landed; safe to retry.
    Aborted,
    /// Sent, unanswered: it may have committed.
    OutcomeUnknown,
}

/// What the runtime does after a failed snapshot transaction: the answer to [`FailureKind::response`].
///
/// This is the one place the recovery after a fence reads from: a refused transaction wrote nothing, so
/// a member that still owns its partition may re-acquire it in place; a member that was evicted, or whose
/// producer a newer owner fenced, rejoins as a new member; a fatal failure stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Response {
    /// Nothing landed and the store is still usable: the group commit retries on its own.
    Retry,
    /// The partition's store must be acquired again (InitProducerId, recovery read) by the same member,
    /// if the member still owns the partition after its next heartbeat: a generation fence the member may
    /// not have seen yet (spurious), or a commit whose outcome the new acquisition settles.
    RecoverInPlace,
    /// The member is gone or superseded: leave the group and join again as a new member.
    Rejoin,
    /// Stop: retrying cannot help or would fight another owner.
    Stop,
}

impl FailureKind {
    /// The snapshot layer's class of a producer error: the one mapping from [`ErrorClass`] (and the
    /// fence's error code) to a [`FailureKind`].
    pub fn of(e: &ProducerError) -> FailureKind {
        match e {
            ProducerError::CommitFenced { code, .. } => FailureKind::of_group_fence(*code),
            ProducerError::Fenced { .. } => FailureKind::ProducerFenced,
            // The state an earlier error left the producer in: a fence behind it is the news (a
            // transaction made abortable by the group's fence, a producer made unusable by a newer
            // epoch); otherwise the state's own class decides.
            ProducerError::MustAbort { cause } => match FailureKind::of(cause) {
                kind if kind.is_group_fence() => kind,
                _ => FailureKind::of_class(e),
            },
            ProducerError::Defunct { cause } => match FailureKind::of(cause) {
                FailureKind::ProducerFenced => FailureKind::ProducerFenced,
                _ => FailureKind::of_class(e),
            },
            _ => FailureKind::of_class(e),
        }
    }

    /// The kind of a commit the group coordinator fenced with `code`, in a transaction or (for the
    /// flow's unfenced commits) on the consumer's OffsetCommit.
    pub fn of_group_fence(code: ErrorCode) -> FailureKind {
        match code {
            ErrorCode::UnknownMemberId => FailureKind::Evicted,
            ErrorCode::FencedInstanceId => FailureKind::InstanceFenced,
            // ILLEGAL_GENERATION, FENCED_MEMBER_EPOCH, STALE_MEMBER_EPOCH and anything else the
            // coordinator fences a commit with: the member may still own the partition.
            _ => FailureKind::Fenced,
        }
    }

    fn of_class(e: &ProducerError) -> FailureKind {
        match e.class() {
            ErrorClass::Fatal => FailureKind::Fatal,
            ErrorClass::OutcomeUnknown => FailureKind::OutcomeUnknown,
            _ => FailureKind::Aborted,
        }
    }

    /// What the runtime does about a failure of this kind.
    pub fn response(self) -> Response {
        match self {
            FailureKind::Aborted => Response::Retry,
            FailureKind::Fenced | FailureKind::OutcomeUnknown => Response::RecoverInPlace,
            FailureKind::Evicted | FailureKind::ProducerFenced => Response::Rejoin,
            FailureKind::InstanceFenced | FailureKind::Fatal => Response::Stop,
        }
    }

    /// Whether the group commit aborts the failed transaction: the producer is still usable and nothing
    /// of the transaction may land.
    pub fn aborts(self) -> bool {
        matches!(
            self,
            FailureKind::Fenced
                | FailureKind::Evicted
                | FailureKind::InstanceFenced
                | FailureKind::Aborted
        )
    }

    /// Whether the producer is unusable after this failure, so the store closes (the complement of
    /// [`aborts`](Self::aborts)).
    pub fn closes_store(self) -> bool {
        !self.aborts()
    }

    /// Whether the group coordinator's fence refused the commit (any of its three kinds).
    pub fn is_group_fence(self) -> bool {
        matches!(
            self,
            FailureKind::Fenced | FailureKind::Evicted | FailureKind::InstanceFenced
        )
    }
}

/// A transaction failure, shared by every write that rode in the transaction (hence `Clone`, and the
/// cause behind an `Arc`).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{kind:?}: {source}")]
pub struct TxnFailure {
    /// What the caller must do about it.
    pub kind: FailureKind,
    /// The producer's error.
    #[source]
    pub source: Arc<ProducerError>,
}

impl TxnFailure {
    /// Wraps a cause with a class chosen by the caller (e.g. a failed abort, which is fatal whatever the
    /// producer said). Most failures come through `From<ProducerError>`, which classifies with
    /// [`FailureKind::of`].
    pub fn new(kind: FailureKind, source: ProducerError) -> Self {
        TxnFailure {
            kind,
            source: Arc::new(source),
        }
    }

    /// The broker's error code behind a fence, when the failure is one.
    pub fn fence_code(&self) -> Option<ErrorCode> {
        fence_code(&self.source)
    }
}

fn fence_code(e: &ProducerError) -> Option<ErrorCode> {
    match e {
        ProducerError::CommitFenced { code, .. } | ProducerError::Fenced { code, .. } => {
            Some(*code)
        }
        ProducerError::MustAbort { cause } | ProducerError::Defunct { cause } => fence_code(cause),
        _ => None,
    }
}

impl From<ProducerError> for TxnFailure {
    fn from(e: ProducerError) -> Self {
        TxnFailure::new(FailureKind::of(&e), e)
    }
}

/// A producer error of each kind, for scripted runners in tests: `FailureKind::of` gives `kind` back.
#[cfg(test)]
pub(crate) fn example(kind: FailureKind) -> ProducerError {
    let commit_fenced = |code| ProducerError::CommitFenced {
        group_id: "g".into(),
        code,
    };
    match kind {
        FailureKind::Fenced => commit_fenced(ErrorCode::IllegalGeneration),
        FailureKind::Evicted => commit_fenced(ErrorCode::UnknownMemberId),
        FailureKind::InstanceFenced => commit_fenced(ErrorCode::FencedInstanceId),
        FailureKind::ProducerFenced => ProducerError::Fenced {
            transactional_id: "t-0".into(),
            code: ErrorCode::ProducerFenced,
        },
        FailureKind::Fatal => ProducerError::Closed,
        FailureKind::Aborted => ProducerError::TransactionAborted,
        FailureKind::OutcomeUnknown => ProducerError::CommitOutcomeUnknown {
            transactional_id: "t-0".into(),
            reason: "scripted".into(),
        },
    }
}

#[cfg(test)]
impl TxnFailure {
    /// A failure of `kind` with a matching producer error, for scripted runners.
    pub(crate) fn scripted(kind: FailureKind) -> Self {
        TxnFailure::new(kind, example(kind))
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
    /// Taking the partition over (the transactional producer's init) failed.
    #[error("snapshot partition {partition}: {source}")]
    Acquire {
        /// The snapshot partition.
        partition: i32,
        /// The producer's error.
        #[source]
        source: ProducerError,
    },
    /// Reading the snapshot log (the recovery read) failed.
    #[error("snapshot partition {partition}: {source}")]
    Read {
        /// The snapshot partition.
        partition: i32,
        /// The read's error (shared: the snapshot errors are `Clone`).
        #[source]
        source: Arc<crate::snapshot::LogError>,
    },
    /// Looking up the partition's starting offset failed.
    #[error("snapshot partition {partition}: {source}")]
    Consumer {
        /// The snapshot partition.
        partition: i32,
        /// The consumer's error.
        #[source]
        source: Arc<crate::consumer::ConsumerError>,
    },
    /// Connecting the partition's own client failed.
    #[error("snapshot partition {partition}: {source}")]
    Net {
        /// The snapshot partition.
        partition: i32,
        /// The network layer's error.
        #[source]
        source: Arc<crate::net::NetError>,
    },
    /// A step of the PostgreSQL store failed (the `postgres` feature); `kind` classifies it like a failed
    /// transaction ([`PgError::Fenced`](crate::snapshot::postgres::PgError::Fenced) is
    /// [`FailureKind::ProducerFenced`]: a newer owner took the partition over).
    #[cfg(feature = "postgres")]
    #[error("snapshot partition {partition}: {source}")]
    Store {
        /// The snapshot partition.
        partition: i32,
        /// What the failure means for the runtime.
        kind: FailureKind,
        /// What PostgreSQL (or the store's protocol) reported.
        #[source]
        source: Arc<crate::snapshot::postgres::PgError>,
    },
    /// The task serving the partition panicked or was cancelled.
    #[error("snapshot partition {partition}: {source}")]
    PartitionTask {
        /// The snapshot partition (-1 when it is not known).
        partition: i32,
        /// How the task ended.
        #[source]
        source: Arc<tokio::task::JoinError>,
    },
}

impl SnapshotError {
    /// The class of a failed transaction, `None` for the other errors.
    pub fn failure_kind(&self) -> Option<FailureKind> {
        match self {
            SnapshotError::Transaction { failure, .. } => Some(failure.kind),
            #[cfg(feature = "postgres")]
            SnapshotError::Store { kind, .. } => Some(*kind),
            _ => None,
        }
    }

    /// What the runtime does about a failed transaction ([`FailureKind::response`]), `None` for the other
    /// errors.
    pub fn response(&self) -> Option<Response> {
        self.failure_kind().map(FailureKind::response)
    }

    /// `true` when the consumer-group fence rejected this owner's commit (a stale generation or member
    /// epoch, an unknown member, a fenced static instance): nothing of the transaction landed.
    pub fn is_fenced(&self) -> bool {
        self.failure_kind().is_some_and(FailureKind::is_group_fence)
    }

    /// `true` when the transaction failed because the partition's producer was fenced by a newer epoch
    /// on its transactional id (`PRODUCER_FENCED` / `INVALID_PRODUCER_EPOCH`): a newer owner's acquire
    /// came first, or the coordinator timed the transaction out. Either way the store is closed and this
    /// owner must stop writing; a later owner re-acquires. [`SnapshotError::is_fenced`] is the other fence.
    pub fn is_producer_fenced(&self) -> bool {
        self.failure_kind() == Some(FailureKind::ProducerFenced)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(cause: ProducerError) -> SnapshotError {
        SnapshotError::Transaction {
            partition: 0,
            failure: cause.into(),
        }
    }

    /// The one mapping, row by row: the producer's error (and the fence's code) to the snapshot layer's
    /// kind, to what the runtime does, to what the group commit does with the transaction.
    #[test]
    fn the_mapping_table() {
        use FailureKind as K;
        use Response as R;
        let commit_fenced = |code| ProducerError::CommitFenced {
            group_id: "g".into(),
            code,
        };
        let producer_fenced = |code| ProducerError::Fenced {
            transactional_id: "t-0".into(),
            code,
        };
        let broker = |class| ProducerError::Broker {
            api: "EndTxn",
            code: ErrorCode::UnknownServerError,
            class,
        };
        let rows: Vec<(&str, ProducerError, K, R, bool)> = vec![
            (
                "ILLEGAL_GENERATION",
                commit_fenced(ErrorCode::IllegalGeneration),
                K::Fenced,
                R::RecoverInPlace,
                true,
            ),
            (
                "must abort after UNKNOWN_MEMBER_ID",
                ProducerError::MustAbort {
                    cause: Arc::new(commit_fenced(ErrorCode::UnknownMemberId)),
                },
                K::Evicted,
                R::Rejoin,
                true,
            ),
            (
                "defunct after an unsupported version",
                ProducerError::Defunct {
                    cause: Arc::new(ProducerError::Unsupported {
                        what: "TxnOffsetCommit v3".into(),
                    }),
                },
                K::Fatal,
                R::Stop,
                false,
            ),
            (
                "FENCED_MEMBER_EPOCH",
                commit_fenced(ErrorCode::FencedMemberEpoch),
                K::Fenced,
                R::RecoverInPlace,
                true,
            ),
            (
                "STALE_MEMBER_EPOCH",
                commit_fenced(ErrorCode::StaleMemberEpoch),
                K::Fenced,
                R::RecoverInPlace,
                true,
            ),
            (
                "UNKNOWN_MEMBER_ID",
                commit_fenced(ErrorCode::UnknownMemberId),
                K::Evicted,
                R::Rejoin,
                true,
            ),
            (
                "FENCED_INSTANCE_ID",
                commit_fenced(ErrorCode::FencedInstanceId),
                K::InstanceFenced,
                R::Stop,
                true,
            ),
            (
                "must abort after ILLEGAL_GENERATION",
                ProducerError::MustAbort {
                    cause: Arc::new(commit_fenced(ErrorCode::IllegalGeneration)),
                },
                K::Fenced,
                R::RecoverInPlace,
                true,
            ),
            (
                "PRODUCER_FENCED",
                producer_fenced(ErrorCode::ProducerFenced),
                K::ProducerFenced,
                R::Rejoin,
                false,
            ),
            (
                "INVALID_PRODUCER_EPOCH",
                producer_fenced(ErrorCode::InvalidProducerEpoch),
                K::ProducerFenced,
                R::Rejoin,
                false,
            ),
            (
                "defunct after PRODUCER_FENCED",
                ProducerError::Defunct {
                    cause: Arc::new(producer_fenced(ErrorCode::ProducerFenced)),
                },
                K::ProducerFenced,
                R::Rejoin,
                false,
            ),
            (
                "fatal class",
                broker(ErrorClass::Fatal),
                K::Fatal,
                R::Stop,
                false,
            ),
            ("closed", ProducerError::Closed, K::Fatal, R::Stop, false),
            (
                "abortable class",
                broker(ErrorClass::Abortable),
                K::Aborted,
                R::Retry,
                true,
            ),
            (
                "transaction aborted",
                ProducerError::TransactionAborted,
                K::Aborted,
                R::Retry,
                true,
            ),
            (
                "must abort after an abortable error",
                ProducerError::MustAbort {
                    cause: Arc::new(ProducerError::TransactionAborted),
                },
                K::Aborted,
                R::Retry,
                true,
            ),
            (
                "retriable class",
                broker(ErrorClass::Retriable),
                K::Aborted,
                R::Retry,
                true,
            ),
            (
                "refused class",
                broker(ErrorClass::Refused),
                K::Aborted,
                R::Retry,
                true,
            ),
            (
                "outcome unknown class",
                broker(ErrorClass::OutcomeUnknown),
                K::OutcomeUnknown,
                R::RecoverInPlace,
                false,
            ),
            (
                "commit outcome unknown",
                ProducerError::CommitOutcomeUnknown {
                    transactional_id: "t-0".into(),
                    reason: "timeout".into(),
                },
                K::OutcomeUnknown,
                R::RecoverInPlace,
                false,
            ),
        ];
        for (name, cause, kind, response, aborts) in rows {
            assert_eq!(FailureKind::of(&cause), kind, "{name}");
            assert_eq!(kind.response(), response, "{name}");
            assert_eq!(kind.aborts(), aborts, "{name}");
            assert_eq!(kind.closes_store(), !aborts, "{name}");
            let err = failed(cause);
            assert_eq!(err.response(), Some(response), "{name}");
            assert_eq!(err.is_fenced(), kind.is_group_fence(), "{name}");
            assert_eq!(
                err.is_producer_fenced(),
                kind == K::ProducerFenced,
                "{name}"
            );
        }
        for kind in [
            K::Fenced,
            K::Evicted,
            K::InstanceFenced,
            K::ProducerFenced,
            K::Fatal,
            K::Aborted,
            K::OutcomeUnknown,
        ] {
            assert_eq!(
                FailureKind::of(&example(kind)),
                kind,
                "the scripted example of {kind:?}"
            );
        }
    }

    /// A zombie refused by a newer owner's producer epoch is recognisable as such, and stays distinct from
    /// the group coordinator's fence; the code behind either is read from the typed source.
    #[test]
    fn the_two_fences_are_told_apart() {
        let epoch = failed(ProducerError::Fenced {
            transactional_id: "t-0".into(),
            code: ErrorCode::InvalidProducerEpoch,
        });
        assert!(epoch.is_producer_fenced() && !epoch.is_fenced());
        let generation = failed(ProducerError::CommitFenced {
            group_id: "g".into(),
            code: ErrorCode::IllegalGeneration,
        });
        assert!(generation.is_fenced() && !generation.is_producer_fenced());
        assert!(!failed(ProducerError::Closed).is_producer_fenced());
        let SnapshotError::Transaction { failure, .. } = &generation else {
            unreachable!()
        };
        assert_eq!(failure.fence_code(), Some(ErrorCode::IllegalGeneration));
    }
}
