//! The machine's states, each with the data valid only in it, and the operations a state runs.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Span;

use super::super::{ErrorClass, OffsetAndMetadata, ProducerError, ProducerIdEpoch, TopicPartition};
use super::{TransactionState, TxnRequest, TxnVersion};
use crate::wire::ErrorCode;
use crate::GroupMetadata;

/// Which request of `send_offsets` is under way.
#[derive(Debug, Clone, Copy)]
pub(super) enum OffsetsStage {
    AddOffsets,
    Commit,
}

/// The time budget of an operation under way and how often it has been resent. InitProducerId,
/// `send_offsets` and EndTxn each keep one, so that a single rule (`TxnMachine::retry_or_timeout`)
/// decides for all three whether an answer of "not now" is retried or ends the operation.
#[derive(Debug, Clone, Copy)]
pub(super) struct Attempts {
    pub(super) started: Instant,
    pub(super) deadline: Instant,
    /// Resends so far: the back-off grows with it.
    pub(super) retries: u32,
}

impl Attempts {
    /// The budget of an operation starting (or resumed) at `now`: a resumed operation gets its
    /// caller's new timeout, not what was left of the old one.
    pub(super) fn start(now: Instant, timeout: Duration) -> Self {
        Attempts {
            started: now,
            deadline: now + timeout,
            retries: 0,
        }
    }

    /// The same budget after one more resend.
    pub(super) fn retried(self) -> Self {
        Attempts {
            retries: self.retries + 1,
            ..self
        }
    }

    /// The budget for the next request of the same operation: its deadline still binds, but the
    /// back-off starts over, since the earlier request's trouble says nothing about this one.
    pub(super) fn next_request(self) -> Self {
        Attempts { retries: 0, ..self }
    }
}

/// An `init` (or the epoch bump after an abort) under way.
#[derive(Debug, Clone)]
pub(super) struct InitOp {
    pub(super) attempts: Attempts,
    pub(super) request: TxnRequest,
    /// The state to fall back to if the operation times out.
    pub(super) origin: Origin,
}

impl InitOp {
    /// Whether the request asks for two-phase commit (KIP-939).
    pub(super) fn enables_2pc(&self) -> bool {
        matches!(
            self.request,
            TxnRequest::InitProducerId {
                enable_2pc: true,
                ..
            }
        )
    }

    /// Whether the request asks to keep a prepared transaction the predecessor left open.
    pub(super) fn keeps_prepared(&self) -> bool {
        matches!(
            self.request,
            TxnRequest::InitProducerId {
                keep_prepared: true,
                ..
            }
        )
    }
}

/// Where an InitProducerId started from: what it falls back to when it times out, with the ids that
/// state holds.
#[derive(Debug, Clone, Copy)]
pub(super) enum Origin {
    Uninitialized,
    CommitOutcomeUnknown {
        ids: ProducerIdEpoch,
    },
    /// The epoch bump after an abort (KIP-360).
    AbortableError {
        ids: ProducerIdEpoch,
    },
}

impl Origin {
    pub(super) fn ids(self) -> Option<ProducerIdEpoch> {
        match self {
            Origin::Uninitialized => None,
            Origin::CommitOutcomeUnknown { ids } | Origin::AbortableError { ids } => Some(ids),
        }
    }

    /// The state an init that ran out of time returns to, `elapsed` after it started, having last
    /// been answered `code`. The origin's transaction was closed before the init began (by the
    /// abort, or as one of unknown outcome), so none comes back with it.
    pub(super) fn timed_out(self, elapsed: Duration, code: ErrorCode) -> State {
        match self {
            Origin::Uninitialized => State::Uninitialized,
            Origin::CommitOutcomeUnknown { ids } => State::CommitOutcomeUnknown { ids, txn: None },
            Origin::AbortableError { ids } => State::AbortableError {
                ids,
                txn: None,
                cause: Arc::new(ProducerError::Timeout {
                    op: "epoch bump after abort",
                    elapsed,
                    class: ErrorClass::Abortable,
                    last_error: Some(code),
                }),
            },
        }
    }
}

/// A `send_offsets` under way.
#[derive(Debug, Clone)]
pub(super) struct OffsetsOp {
    pub(super) attempts: Attempts,
    pub(super) group: GroupMetadata,
    pub(super) offsets: Vec<(TopicPartition, OffsetAndMetadata)>,
    pub(super) stage: OffsetsStage,
}

impl OffsetsOp {
    pub(super) fn request(
        &self,
        transactional_id: &str,
        ids: ProducerIdEpoch,
        tv: TxnVersion,
    ) -> TxnRequest {
        match self.stage {
            OffsetsStage::AddOffsets => TxnRequest::AddOffsets {
                transactional_id: transactional_id.to_owned(),
                ids,
                group_id: self.group.group_id().to_owned(),
            },
            OffsetsStage::Commit => TxnRequest::TxnOffsetCommit {
                transactional_id: transactional_id.to_owned(),
                ids,
                group: self.group.clone(),
                offsets: self.offsets.clone(),
                tv,
            },
        }
    }
}

/// An EndTxn (commit or abort: the state says which) under way.
#[derive(Debug, Clone, Copy)]
pub(super) struct EndOp {
    pub(super) attempts: Attempts,
    /// Some attempt may have reached the coordinator without its answer reaching us.
    pub(super) in_doubt: bool,
    /// The caller's budget for the operation, reused for the epoch bump after an abort.
    pub(super) timeout: Duration,
}

/// Where the machine stands, each state with what is valid only there (quinn-proto's `State`): the
/// producer id exists from the first successful init on, the transaction's bookkeeping while one is
/// open (or its end is undecided), the operation under way in the state that runs it, and the cause
/// in the error states. [`TransactionState`] is its public, data-free name.
///
/// A transaction of unknown outcome, or one being committed after an `init` timed out on it, may have
/// no bookkeeping left (`txn: None`): re-initialising closed it, and the commit retried then uses the
/// broker's current protocol.
#[derive(Debug)]
pub(super) enum State {
    Uninitialized,
    Initializing(InitOp),
    Ready {
        ids: ProducerIdEpoch,
    },
    InTransaction {
        ids: ProducerIdEpoch,
        txn: Txn,
        /// A `send_offsets` under way, or interrupted by a dropped future (then a commit is refused).
        offsets: Option<OffsetsOp>,
    },
    Committing {
        ids: ProducerIdEpoch,
        txn: Option<Txn>,
        end: EndOp,
    },
    Aborting {
        ids: ProducerIdEpoch,
        txn: Option<Txn>,
        end: EndOp,
    },
    AbortableError {
        ids: ProducerIdEpoch,
        txn: Option<Txn>,
        cause: Arc<ProducerError>,
    },
    CommitOutcomeUnknown {
        ids: ProducerIdEpoch,
        txn: Option<Txn>,
    },
    /// Two-phase commit (KIP-939): the transaction is flushed and waits for the outside decision; only
    /// commit, abort or complete go on from here. `prepared` names it: this producer's ids when it
    /// prepared the transaction itself (then `txn` is its bookkeeping), or the predecessor's, kept by
    /// an `init` with `KeepPreparedTxn` (then `txn` is `None`).
    Prepared {
        ids: ProducerIdEpoch,
        prepared: ProducerIdEpoch,
        txn: Option<Txn>,
    },
    /// Terminal. Keeps the ids and the transaction's span for the driver's logs.
    FatalError {
        ids: Option<ProducerIdEpoch>,
        txn: Option<Txn>,
        cause: Arc<ProducerError>,
    },
}

impl State {
    /// The state an EndTxn under way is in.
    pub(super) fn ending(
        commit: bool,
        ids: ProducerIdEpoch,
        txn: Option<Txn>,
        end: EndOp,
    ) -> State {
        if commit {
            State::Committing { ids, txn, end }
        } else {
            State::Aborting { ids, txn, end }
        }
    }

    /// When the operation under way must end, if one is.
    pub(super) fn op_deadline(&self) -> Option<Instant> {
        match self {
            State::Initializing(op) => Some(op.attempts.deadline),
            State::InTransaction {
                offsets: Some(op), ..
            } => Some(op.attempts.deadline),
            State::Committing { end, .. } | State::Aborting { end, .. } => {
                Some(end.attempts.deadline)
            }
            _ => None,
        }
    }

    pub(super) fn public(&self) -> TransactionState {
        match self {
            State::Uninitialized => TransactionState::Uninitialized,
            State::Initializing(_) => TransactionState::Initializing,
            State::Ready { .. } => TransactionState::Ready,
            State::InTransaction { .. } => TransactionState::InTransaction,
            State::Committing { .. } => TransactionState::Committing,
            State::Aborting { .. } => TransactionState::Aborting,
            State::AbortableError { .. } => TransactionState::AbortableError,
            State::CommitOutcomeUnknown { .. } => TransactionState::CommitOutcomeUnknown,
            State::Prepared { .. } => TransactionState::Prepared,
            State::FatalError { .. } => TransactionState::FatalError,
        }
    }

    pub(super) fn ids(&self) -> Option<ProducerIdEpoch> {
        match self {
            State::Uninitialized => None,
            State::Initializing(op) => op.origin.ids(),
            State::Ready { ids }
            | State::InTransaction { ids, .. }
            | State::Committing { ids, .. }
            | State::Aborting { ids, .. }
            | State::AbortableError { ids, .. }
            | State::CommitOutcomeUnknown { ids, .. }
            | State::Prepared { ids, .. } => Some(*ids),
            State::FatalError { ids, .. } => *ids,
        }
    }

    pub(super) fn txn(&self) -> Option<&Txn> {
        match self {
            State::InTransaction { txn, .. } => Some(txn),
            State::Committing { txn, .. }
            | State::Aborting { txn, .. }
            | State::AbortableError { txn, .. }
            | State::CommitOutcomeUnknown { txn, .. }
            | State::Prepared { txn, .. }
            | State::FatalError { txn, .. } => txn.as_ref(),
            State::Uninitialized | State::Initializing(_) | State::Ready { .. } => None,
        }
    }

    pub(super) fn txn_mut(&mut self) -> Option<&mut Txn> {
        match self {
            State::InTransaction { txn, .. } => Some(txn),
            State::Committing { txn, .. }
            | State::Aborting { txn, .. }
            | State::AbortableError { txn, .. }
            | State::CommitOutcomeUnknown { txn, .. }
            | State::Prepared { txn, .. }
            | State::FatalError { txn, .. } => txn.as_mut(),
            State::Uninitialized | State::Initializing(_) | State::Ready { .. } => None,
        }
    }

    pub(super) fn into_txn(self) -> Option<Txn> {
        match self {
            State::InTransaction { txn, .. } => Some(txn),
            State::Committing { txn, .. }
            | State::Aborting { txn, .. }
            | State::AbortableError { txn, .. }
            | State::CommitOutcomeUnknown { txn, .. }
            | State::Prepared { txn, .. }
            | State::FatalError { txn, .. } => txn,
            State::Uninitialized | State::Initializing(_) | State::Ready { .. } => None,
        }
    }

    /// FatalError, keeping the ids and the transaction (its span records the outcome); a fatal
    /// state keeps its first cause.
    pub(super) fn into_fatal(self, err: &ProducerError) -> State {
        if let State::FatalError { .. } = self {
            return self;
        }
        let ids = self.ids();
        let txn = self.into_txn();
        if let Some(t) = &txn {
            t.span.record("outcome", "fatal");
        }
        State::FatalError {
            ids,
            txn,
            cause: Arc::new(err.clone()),
        }
    }

    /// AbortableError, dropping the operation under way; the error states keep theirs. Only a state
    /// with a producer id has a transaction to abort: without one the error leaves nothing to recover,
    /// and the machine stops instead.
    pub(super) fn into_abortable(self, err: &ProducerError) -> State {
        match self {
            State::FatalError { .. } | State::AbortableError { .. } => self,
            other => match other.ids() {
                Some(ids) => State::AbortableError {
                    ids,
                    txn: other.into_txn(),
                    cause: Arc::new(err.clone()),
                },
                None => other.into_fatal(err),
            },
        }
    }
}

/// The current transaction's bookkeeping.
#[derive(Debug)]
pub(super) struct Txn {
    pub(super) started_at: Instant,
    pub(super) tv: TxnVersion,
    /// Partitions the coordinator knows are in the transaction.
    pub(super) partitions: BTreeSet<TopicPartition>,
    /// TV1: partitions to enrol, not yet requested.
    pub(super) pending: BTreeSet<TopicPartition>,
    /// TV1: partitions in an AddPartitionsToTxn awaiting its answer.
    pub(super) adding: BTreeSet<TopicPartition>,
    pub(super) add_attempts: u32,
    pub(super) add_not_before: Option<Instant>,
    /// TV1: groups enrolled with AddOffsetsToTxn.
    pub(super) groups: BTreeSet<String>,
    /// Something of this transaction may have reached a broker, so it must be ended with EndTxn.
    pub(super) reached_broker: bool,
    pub(super) span: Span,
}
