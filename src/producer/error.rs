//! The producer's error type and the three classes a caller must tell apart.
//!
//! Every [`ProducerError`] answers one question through [`ProducerError::class`]: what must the caller do
//! now? The answer decides correctness, so the classes are kept apart even where Kafka's own errors blur
//! them:
//!
//! - [`ErrorClass::Fatal`]: the producer is unusable (fenced by a newer instance, not authorised, the
//!   broker lacks a needed protocol version). Drop it; a new one must `init` again.
//! - [`ErrorClass::Abortable`]: this transaction cannot commit and nothing of it became visible. Call
//!   `abort()` and go on. For the idempotent producer (no transaction) it means the record was not written.
//! - [`ErrorClass::OutcomeUnknown`]: the broker may or may not have applied it. For a commit, never abort:
//!   a late EndTxn(commit) could still be applied, and aborting first would not stop it. Retry the commit
//!   or re-initialise, then find out what happened by reading.
//!
//! Two more classes never change what is on the broker: [`ErrorClass::Retriable`] (the same call may simply
//! be repeated: a full buffer, a timed-out `init`) and [`ErrorClass::Refused`] (the call was not allowed in
//! the producer's state, or its arguments were invalid; nothing was sent).
//!
//! # References
//! - KIP-98 (transactions), KIP-360 (epoch bump on unknown producer), KIP-588 (INVALID_PRODUCER_EPOCH from
//!   Produce is abortable), KIP-447 (fenced TxnOffsetCommit), KIP-890 (TRANSACTION_ABORTABLE)

use std::sync::Arc;
use std::time::Duration;

use crate::wire::ErrorCode;

/// What the caller must do after an error. See the [module docs](crate::producer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorClass {
    /// The producer is unusable. Drop it.
    Fatal,
    /// The current transaction cannot commit; nothing of it is visible. Abort and go on.
    Abortable,
    /// It may or may not have happened. Do not abort a commit in this state: retry it or re-initialise.
    OutcomeUnknown,
    /// Nothing happened that matters; the same call may be repeated.
    Retriable,
    /// The call was refused before anything was sent; fix the call or the order of calls.
    Refused,
}

/// An error from the producer. Match on [`ProducerError::class`] to decide what to do; match on the
/// variant for detail.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ProducerError {
    /// The coordinator rejected this producer's epoch: another producer initialised with the same
    /// transactional id, or the coordinator timed the transaction out and bumped the epoch itself (the
    /// two look the same from here). Fatal.
    #[error("producer fenced: transactional id {transactional_id:?} moved to a newer epoch (a newer producer, or a transaction timeout) ({code})")]
    Fenced {
        /// The transactional id.
        transactional_id: String,
        /// The code the broker answered (`PRODUCER_FENCED` or `INVALID_PRODUCER_EPOCH`).
        code: ErrorCode,
    },

    /// The group coordinator rejected the transaction's offset commit because the group metadata no
    /// longer matches the group (a newer generation, an unknown member, a fenced static instance): the
    /// KIP-447 fence held. Abortable: the transaction must be aborted and none of it becomes visible.
    #[error("offset commit for group {group_id:?} fenced by the group coordinator ({code})")]
    CommitFenced {
        /// The group whose commit was rejected.
        group_id: String,
        /// `ILLEGAL_GENERATION`, `UNKNOWN_MEMBER_ID`, `FENCED_INSTANCE_ID` (or a KIP-848 member-epoch code).
        code: ErrorCode,
    },

    /// The commit was sent and no answer came back in time. The transaction may have committed.
    #[error("commit of transaction {transactional_id:?} has an unknown outcome: {reason}")]
    CommitOutcomeUnknown {
        /// The transactional id.
        transactional_id: String,
        /// Why the answer is missing.
        reason: String,
    },

    /// A batch was sent and its fate never came back before its delivery timeout: the broker may have
    /// written it. Outcome-unknown for the idempotent producer; abortable inside a transaction (the
    /// abort makes it invisible whether it was written or not).
    #[error("delivery to {topic_partition} has an unknown outcome: {reason}")]
    DeliveryOutcomeUnknown {
        /// Where the batch was going.
        topic_partition: crate::producer::TopicPartition,
        /// Why the answer is missing.
        reason: String,
        /// Whether the record belonged to a transaction.
        transactional: bool,
    },

    /// The batch was not written, and a later batch of the same partition already was: the broker had
    /// lost its state for this producer (expired after a long idle, or removed with the log's segments)
    /// and took the later batch first. Writing this one now would put it out of order, so it is not
    /// retried. Abortable inside a transaction; for the idempotent producer the records are lost and
    /// the caller decides whether sending them again, after their successors, is acceptable.
    #[error("delivery to {topic_partition} failed: a later batch was written first, so this one can no longer land in order")]
    OrderLost {
        /// Where the batch was going.
        topic_partition: crate::producer::TopicPartition,
    },

    /// A broker answered with an error code; `class` says what it means for this request.
    #[error("{api} failed: {code}")]
    Broker {
        /// The request that failed.
        api: &'static str,
        /// The code.
        code: ErrorCode,
        /// What the caller must do.
        class: ErrorClass,
    },

    /// The broker's authorizer refused the producer access to a resource (missing ACL). Fatal: an
    /// operator must grant the permission; retrying cannot help.
    #[error("not authorized: {api} on {resource} was refused ({code}); grant the principal access to it")]
    NotAuthorized {
        /// The request that was refused.
        api: &'static str,
        /// The resource named by the refusal, e.g. `transactional id "flow-0"`.
        resource: String,
        /// The authorization error code.
        code: ErrorCode,
    },

    /// An earlier error put the transaction into the abortable state; everything but `abort()` is refused
    /// until the abort.
    #[error("the transaction must be aborted: {cause}")]
    MustAbort {
        /// The error that made the transaction abortable.
        cause: Arc<ProducerError>,
    },

    /// An earlier fatal error made the producer unusable.
    #[error("the producer is unusable: {cause}")]
    Defunct {
        /// The fatal error.
        cause: Arc<ProducerError>,
    },

    /// The call is not allowed in the producer's current state (e.g. `commit()` without `begin()`).
    #[error("{op}() is not allowed while the producer is {state}")]
    IllegalState {
        /// The refused call.
        op: &'static str,
        /// The state it was refused in.
        state: &'static str,
    },

    /// `try_send` found no room in the producer's buffer.
    #[error("producer buffer full: {requested} bytes requested, {available} available")]
    BufferFull {
        /// The bytes the record needs.
        requested: usize,
        /// The bytes free.
        available: usize,
    },

    /// The record can never be sent: it is larger than the buffer or the largest request allowed.
    #[error("record of {size} bytes exceeds the limit of {limit} bytes")]
    RecordTooLarge {
        /// The record's size bound.
        size: usize,
        /// The limit it exceeds.
        limit: usize,
    },

    /// An operation ran out of time without reaching an outcome that needs one of the other variants.
    #[error("{op} timed out after {elapsed:?}{}", last_error.map(|c| format!(" (last answer {c})")).unwrap_or_default())]
    Timeout {
        /// The operation.
        op: &'static str,
        /// How long it ran.
        elapsed: Duration,
        /// What the caller must do.
        class: ErrorClass,
        /// The last error the broker answered before time ran out, when the operation was being retried
        /// on one: CONCURRENT_TRANSACTIONS for an init, for instance, says the coordinator never finished
        /// aborting the previous owner's transaction.
        last_error: Option<ErrorCode>,
    },

    /// A two-phase commit (KIP-939) was refused; `refusal` says by whom and why, and
    /// [`TwoPhaseCommitRefusal::remedy`](super::TwoPhaseCommitRefusal::remedy) what to change. Refused
    /// (nothing happened) for a `prepare` under transaction version 1 and for a configuration the
    /// producer will not start with; fatal otherwise (drop the producer: the broker did nothing for the
    /// refused request).
    #[error("two-phase commit refused for transactional id {transactional_id:?}: {}", refusal.remedy())]
    TwoPhaseCommitRefused {
        /// The transactional id.
        transactional_id: String,
        /// Why.
        refusal: super::TwoPhaseCommitRefusal,
    },

    /// The broker lacks a protocol version this producer needs.
    #[error("the broker does not support {what}")]
    Unsupported {
        /// What is missing.
        what: String,
    },

    /// The record's transaction was aborted before the record was sent. Nothing of it was written.
    #[error("the record's transaction was aborted before it was sent")]
    TransactionAborted,

    /// The topic (or the partition the record names) is not in the cluster's metadata.
    #[error("topic {topic:?} has no partition {partition:?} in the cluster metadata")]
    UnknownPartition {
        /// The topic.
        topic: String,
        /// The partition asked for, if the record named one.
        partition: Option<i32>,
    },

    /// The network layer failed in a way that leaves nothing more specific to say.
    #[error("network: {source}")]
    Net {
        /// What the network layer reported.
        #[source]
        source: Arc<crate::net::NetError>,
        /// What the caller must do.
        class: ErrorClass,
    },

    /// One of the producer's background tasks (the driver, a broker's sender, a leader lookup, a
    /// partition enrolment, a producer-id fetch) panicked or was cancelled. Fatal. The records that task carried
    /// fail with this error although a request for them may have reached the broker (their outcome is
    /// unknown); every unsent record fails with it too, and later calls are refused.
    #[error("producer task {task:?} failed: {failure}")]
    TaskFailed {
        /// Which task: `driver`, `sender to broker <node id>`, `leader lookup`, `add partitions`,
        /// `producer id`.
        task: String,
        /// How it ended: the panic's message, or that it was cancelled.
        failure: String,
    },

    /// The producer was closed.
    #[error("the producer is closed")]
    Closed,
}

impl ProducerError {
    /// What the caller must do about this error.
    pub fn class(&self) -> ErrorClass {
        match self {
            ProducerError::Fenced { .. } | ProducerError::Unsupported { .. } => ErrorClass::Fatal,
            ProducerError::Defunct { .. } | ProducerError::Closed => ErrorClass::Fatal,
            ProducerError::TaskFailed { .. } => ErrorClass::Fatal,
            ProducerError::NotAuthorized { .. } => ErrorClass::Fatal,
            ProducerError::TwoPhaseCommitRefused { refusal, .. } => match refusal {
                super::TwoPhaseCommitRefusal::NeedsTransactionVersion2
                | super::TwoPhaseCommitRefusal::TimeoutSet => ErrorClass::Refused,
                _ => ErrorClass::Fatal,
            },
            ProducerError::CommitFenced { .. } | ProducerError::MustAbort { .. } => {
                ErrorClass::Abortable
            }
            ProducerError::CommitOutcomeUnknown { .. } => ErrorClass::OutcomeUnknown,
            ProducerError::DeliveryOutcomeUnknown { transactional, .. } => {
                if *transactional {
                    ErrorClass::Abortable
                } else {
                    ErrorClass::OutcomeUnknown
                }
            }
            ProducerError::Broker { class, .. }
            | ProducerError::Timeout { class, .. }
            | ProducerError::Net { class, .. } => *class,
            ProducerError::TransactionAborted | ProducerError::OrderLost { .. } => {
                ErrorClass::Abortable
            }
            ProducerError::UnknownPartition { .. } => ErrorClass::Refused,
            ProducerError::BufferFull { .. } => ErrorClass::Retriable,
            ProducerError::IllegalState { .. } | ProducerError::RecordTooLarge { .. } => {
                ErrorClass::Refused
            }
        }
    }

    /// The producer is unusable; drop it.
    pub fn is_fatal(&self) -> bool {
        self.class() == ErrorClass::Fatal
    }

    /// The transaction must be aborted (or, without a transaction, the record was not written).
    pub fn is_abortable(&self) -> bool {
        self.class() == ErrorClass::Abortable
    }

    /// It may or may not have been applied. Never abort a commit that failed this way.
    pub fn is_outcome_unknown(&self) -> bool {
        self.class() == ErrorClass::OutcomeUnknown
    }

    /// Nothing changed on the broker; the same call may be repeated.
    pub fn is_retriable(&self) -> bool {
        self.class() == ErrorClass::Retriable
    }

    /// The two-phase-commit refusal this error carries, directly or as the cause of the fatal state.
    pub fn two_phase_refusal(&self) -> Option<super::TwoPhaseCommitRefusal> {
        match self {
            ProducerError::TwoPhaseCommitRefused { refusal, .. } => Some(*refusal),
            ProducerError::Defunct { cause } => cause.two_phase_refusal(),
            _ => None,
        }
    }

    /// The transaction's offset commit was rejected by the group's generation fence (KIP-447), directly or
    /// as the cause of the abortable state. This is the stale-owner signal the snapshot layer acts on.
    pub fn is_commit_fenced(&self) -> bool {
        match self {
            ProducerError::CommitFenced { .. } => true,
            ProducerError::MustAbort { cause } => cause.is_commit_fenced(),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::producer::TopicPartition;

    /// Each error's class (fatal, abortable, outcome unknown, retriable, refused) follows from its
    /// variant, and a commit fence stays visible through the abortable error that wraps it.
    #[test]
    fn classes_follow_the_variant() {
        let fenced = ProducerError::Fenced {
            transactional_id: "t".into(),
            code: ErrorCode::ProducerFenced,
        };
        assert!(fenced.is_fatal());
        let commit = ProducerError::CommitFenced {
            group_id: "g".into(),
            code: ErrorCode::IllegalGeneration,
        };
        assert!(commit.is_abortable() && commit.is_commit_fenced());
        let wrapped = ProducerError::MustAbort {
            cause: Arc::new(commit),
        };
        assert!(wrapped.is_abortable() && wrapped.is_commit_fenced());
        let unknown = ProducerError::CommitOutcomeUnknown {
            transactional_id: "t".into(),
            reason: "timeout".into(),
        };
        assert!(unknown.is_outcome_unknown() && !unknown.is_abortable());
        let tp = TopicPartition::new("t", 0);
        let idem = ProducerError::DeliveryOutcomeUnknown {
            topic_partition: tp.clone(),
            reason: "x".into(),
            transactional: false,
        };
        assert!(idem.is_outcome_unknown());
        let txn = ProducerError::DeliveryOutcomeUnknown {
            topic_partition: tp,
            reason: "x".into(),
            transactional: true,
        };
        assert!(txn.is_abortable());
        assert!(ProducerError::BufferFull {
            requested: 1,
            available: 0
        }
        .is_retriable());
        assert_eq!(
            ProducerError::IllegalState {
                op: "commit",
                state: "ready"
            }
            .class(),
            ErrorClass::Refused
        );
        assert!(!fenced.is_commit_fenced());
    }
}
