//! The one table that says what an error code means for the request that returned it.
//!
//! `ErrorCode::is_retriable` answers "may the same request succeed later"; that is not enough for a
//! producer, because the same code means different things on different requests: `INVALID_PRODUCER_EPOCH`
//! from a Produce is an abortable transaction timeout (KIP-588), from EndTxn it is a fence. Every response
//! handler in the producer goes through [`classify`], so the classification lives in one place and is
//! tested as a table. Where one request gets several answers (one per partition), [`Action::severity`]
//! says which of them decides, again in one place.
//!
//! # References
//! - KIP-98 (transaction APIs), KIP-360, KIP-447, KIP-588, KIP-890 (TRANSACTION_ABORTABLE, v11/v12 Produce)
//! - The error lists in Kafka's message JSON specs for Produce, InitProducerId, AddPartitionsToTxn,
//!   AddOffsetsToTxn, TxnOffsetCommit and EndTxn

use crate::wire::ErrorCode;

/// The producer-side requests whose answers are classified here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Api {
    InitProducerId,
    AddPartitionsToTxn,
    AddOffsetsToTxn,
    TxnOffsetCommit,
    EndTxn,
    Produce,
}

impl Api {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Api::InitProducerId => "InitProducerId",
            Api::AddPartitionsToTxn => "AddPartitionsToTxn",
            Api::AddOffsetsToTxn => "AddOffsetsToTxn",
            Api::TxnOffsetCommit => "TxnOffsetCommit",
            Api::EndTxn => "EndTxn",
            Api::Produce => "Produce",
        }
    }
}

/// What to refresh before a retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refresh {
    /// Nothing; back off and resend.
    Nothing,
    /// The coordinator the request went to (transaction or group) moved or is not ready.
    Coordinator,
    /// The partition's leader moved.
    Leader,
}

/// The meaning of an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Success.
    Ok,
    /// Transient: resend the same request (a Produce keeps its sequence and bytes) after the refresh.
    Retry(Refresh),
    /// The producer's epoch lost to a newer owner of the transactional id. Fatal.
    Fenced,
    /// The producer is unusable for any other reason (authorisation, protocol, unexpected state).
    Fatal,
    /// The transaction cannot commit; abort it.
    Abortable,
    /// TxnOffsetCommit only: the group's generation fence rejected the commit (abortable).
    CommitFenced,
    /// Produce only: the broker did not write this batch and never will (too large, invalid, not
    /// authorised for the topic). Abortable inside a transaction; without one, the record fails.
    Rejected,
    /// Produce only: the batch was already written (a retry of an acknowledged batch).
    Duplicate,
    /// Produce only: the partition's sequence state is broken (OUT_OF_ORDER_SEQUENCE_NUMBER,
    /// UNKNOWN_PRODUCER_ID). Whether that is a real gap or just a predecessor being retried is for the
    /// sequence bookkeeping to decide; if real, it needs an epoch bump (KIP-360).
    SequenceBroken,
    /// Produce only: the batch carried an epoch older than the partition's (KIP-588). Inside a
    /// transaction this is the coordinator having timed the transaction out (or a fence, which the abort's
    /// epoch bump will reveal): abortable. Without a transaction, the batch was not written.
    StaleEpoch,
}

impl Action {
    /// How much the answer weighs when one request gets several (AddPartitionsToTxn and
    /// TxnOffsetCommit answer per partition) and the heaviest decides for the whole request. A fence
    /// outweighs everything, because nothing the producer does afterwards can succeed; a fatal
    /// answer outweighs an abortable one for the same reason, one step down; and a retry that must
    /// first look the coordinator or leader up outweighs a plain one, so the lookup is not lost.
    /// The Produce-only answers never come from the requests that rank them, and count as fatal.
    pub(crate) fn severity(self) -> u8 {
        match self {
            Action::Ok => 0,
            Action::Retry(Refresh::Nothing) => 1,
            Action::Retry(Refresh::Coordinator | Refresh::Leader) => 2,
            Action::Abortable => 3,
            Action::CommitFenced => 4,
            Action::Fatal
            | Action::Rejected
            | Action::Duplicate
            | Action::SequenceBroken
            | Action::StaleEpoch => 5,
            Action::Fenced => 6,
        }
    }
}

/// What `code` means as the answer to `api`. `transactional` distinguishes a transactional producer's
/// Produce from an idempotent one's where Kafka treats them differently.
pub(crate) fn classify(api: Api, code: ErrorCode) -> Action {
    use Action::*;
    use ErrorCode as E;
    if code == E::None {
        return Ok;
    }
    // Answers that mean the same on every producer request.
    match code {
        E::ProducerFenced => return Fenced,
        E::TransactionalIdAuthorizationFailed
        | E::ClusterAuthorizationFailed
        | E::UnsupportedVersion
        | E::UnsupportedForMessageFormat => return Fatal,
        E::TransactionAbortable => return Abortable,
        _ => {}
    }
    match api {
        Api::InitProducerId => match code {
            // NETWORK_EXCEPTION: the driver's stand-in for a transport failure before anything was
            // sent (the coordinator's node unreachable), so look the coordinator up again.
            E::NotCoordinator | E::CoordinatorNotAvailable | E::NetworkException => {
                Retry(Refresh::Coordinator)
            }
            E::CoordinatorLoadInProgress | E::ConcurrentTransactions | E::RequestTimedOut => {
                Retry(Refresh::Nothing)
            }
            // With KIP-360 current ids, a newer owner shows up as INVALID_PRODUCER_EPOCH.
            E::InvalidProducerEpoch => Fenced,
            E::InvalidTransactionTimeout | E::InvalidRequest | E::InvalidProducerIdMapping => Fatal,
            c if c.is_retriable() => Retry(Refresh::Nothing),
            _ => Fatal,
        },
        Api::AddPartitionsToTxn => match code {
            E::NotCoordinator | E::CoordinatorNotAvailable | E::NetworkException => {
                Retry(Refresh::Coordinator)
            }
            E::CoordinatorLoadInProgress
            | E::ConcurrentTransactions
            | E::UnknownTopicOrPartition
            // Another partition in the same request failed; this one was not tried.
            | E::OperationNotAttempted => Retry(Refresh::Nothing),
            E::InvalidProducerEpoch => Fenced,
            E::TopicAuthorizationFailed => Abortable,
            E::InvalidProducerIdMapping | E::InvalidTxnState | E::UnknownProducerId => Fatal,
            c if c.is_retriable() => Retry(Refresh::Nothing),
            _ => Fatal,
        },
        Api::AddOffsetsToTxn => match code {
            E::NotCoordinator | E::CoordinatorNotAvailable | E::NetworkException => {
                Retry(Refresh::Coordinator)
            }
            E::CoordinatorLoadInProgress | E::ConcurrentTransactions => Retry(Refresh::Nothing),
            E::InvalidProducerEpoch => Fenced,
            E::GroupAuthorizationFailed => Abortable,
            E::InvalidProducerIdMapping | E::InvalidTxnState | E::UnknownProducerId => Fatal,
            c if c.is_retriable() => Retry(Refresh::Nothing),
            _ => Fatal,
        },
        Api::TxnOffsetCommit => match code {
            E::NotCoordinator | E::CoordinatorNotAvailable | E::NetworkException => {
                Retry(Refresh::Coordinator)
            }
            // CONCURRENT_TRANSACTIONS: under TV2 the implicit enrolment of __consumer_offsets is still
            // completing the previous transaction.
            E::CoordinatorLoadInProgress
            | E::UnknownTopicOrPartition
            | E::RequestTimedOut
            | E::ConcurrentTransactions => Retry(Refresh::Nothing),
            E::IllegalGeneration
            | E::UnknownMemberId
            | E::FencedInstanceId
            | E::FencedMemberEpoch
            | E::StaleMemberEpoch => CommitFenced,
            E::InvalidProducerEpoch => Fenced,
            E::GroupAuthorizationFailed
            | E::TopicAuthorizationFailed
            | E::OffsetMetadataTooLarge
            | E::InvalidCommitOffsetSize
            | E::RebalanceInProgress => Abortable,
            E::InvalidProducerIdMapping | E::InvalidTxnState | E::UnknownProducerId => Fatal,
            c if c.is_retriable() => Retry(Refresh::Nothing),
            _ => Fatal,
        },
        Api::EndTxn => match code {
            E::NotCoordinator | E::CoordinatorNotAvailable | E::NetworkException => {
                Retry(Refresh::Coordinator)
            }
            E::CoordinatorLoadInProgress | E::ConcurrentTransactions => Retry(Refresh::Nothing),
            E::InvalidProducerEpoch => Fenced,
            E::InvalidTxnState | E::InvalidProducerIdMapping | E::UnknownProducerId => Fatal,
            c if c.is_retriable() => Retry(Refresh::Nothing),
            _ => Fatal,
        },
        Api::Produce => match code {
            E::DuplicateSequenceNumber => Duplicate,
            E::OutOfOrderSequenceNumber | E::UnknownProducerId => SequenceBroken,
            E::InvalidProducerEpoch => StaleEpoch,
            E::NotLeaderOrFollower
            | E::LeaderNotAvailable
            | E::UnknownTopicOrPartition
            | E::FencedLeaderEpoch
            | E::UnknownLeaderEpoch
            | E::KafkaStorageError
            | E::UnknownTopicId => Retry(Refresh::Leader),
            // Under TV2 a Produce that enrols its partition can race the end of the previous transaction.
            E::ConcurrentTransactions => Retry(Refresh::Nothing),
            // Verification (KIP-890 part 1) found the partition not in the transaction: the producer's
            // view of its own transaction is wrong, which no abort repairs.
            E::InvalidTxnState | E::InvalidProducerIdMapping => Fatal,
            c if c.is_retriable() => Retry(Refresh::Nothing),
            _ => Rejected,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ErrorCode as E;

    /// The issue's classification, row by row: every code it names lands in the class it names.
    #[test]
    fn table_matches_the_issue() {
        let fatal_everywhere = [
            E::ProducerFenced,
            E::TransactionalIdAuthorizationFailed,
            E::ClusterAuthorizationFailed,
            E::UnsupportedVersion,
        ];
        let txn_apis = [
            Api::InitProducerId,
            Api::AddPartitionsToTxn,
            Api::AddOffsetsToTxn,
            Api::TxnOffsetCommit,
            Api::EndTxn,
        ];
        for api in txn_apis.iter().copied().chain([Api::Produce]) {
            for code in fatal_everywhere {
                let a = classify(api, code);
                assert!(
                    matches!(a, Action::Fenced | Action::Fatal),
                    "{api:?} {code}: {a:?}"
                );
            }
            assert_eq!(classify(api, E::TransactionAbortable), Action::Abortable);
            assert_eq!(classify(api, E::None), Action::Ok);
        }
        // INVALID_PRODUCER_EPOCH is a fence on transaction APIs, abortable (stale epoch) on Produce.
        for api in txn_apis {
            assert_eq!(
                classify(api, E::InvalidProducerEpoch),
                Action::Fenced,
                "{api:?}"
            );
        }
        assert_eq!(
            classify(Api::Produce, E::InvalidProducerEpoch),
            Action::StaleEpoch
        );
        for api in [Api::AddPartitionsToTxn, Api::AddOffsetsToTxn, Api::EndTxn] {
            assert_eq!(classify(api, E::InvalidProducerIdMapping), Action::Fatal);
        }
        // The KIP-447 fence on TxnOffsetCommit is its own, abortable, action.
        for code in [
            E::IllegalGeneration,
            E::UnknownMemberId,
            E::FencedInstanceId,
        ] {
            assert_eq!(classify(Api::TxnOffsetCommit, code), Action::CommitFenced);
        }
    }

    /// Where a request has several answers, the heaviest decides, in one order for every request.
    #[test]
    fn severity_orders_fence_over_fatal_over_abortable_over_retry() {
        let order = [
            Action::Ok,
            Action::Retry(Refresh::Nothing),
            Action::Retry(Refresh::Coordinator),
            Action::Abortable,
            Action::CommitFenced,
            Action::Fatal,
            Action::Fenced,
        ];
        for pair in order.windows(2) {
            assert!(pair[0].severity() < pair[1].severity(), "{pair:?}");
        }
    }

    /// init retries exactly the coordinator-is-busy codes the issue lists, re-finding it on NOT_COORDINATOR.
    #[test]
    fn init_retries_coordinator_trouble() {
        assert_eq!(
            classify(Api::InitProducerId, E::NotCoordinator),
            Action::Retry(Refresh::Coordinator)
        );
        assert_eq!(
            classify(Api::InitProducerId, E::CoordinatorNotAvailable),
            Action::Retry(Refresh::Coordinator)
        );
        for code in [E::CoordinatorLoadInProgress, E::ConcurrentTransactions] {
            assert_eq!(
                classify(Api::InitProducerId, code),
                Action::Retry(Refresh::Nothing)
            );
        }
        assert_eq!(
            classify(Api::InitProducerId, E::InvalidTransactionTimeout),
            Action::Fatal
        );
    }

    /// A Produce error code maps to the action its meaning calls for: a moved leader refreshes, a
    /// sequence gap breaks the sequence, a duplicate counts as written, and anything unexpected rejects
    /// the batch.
    #[test]
    fn produce_codes() {
        assert_eq!(
            classify(Api::Produce, E::NotLeaderOrFollower),
            Action::Retry(Refresh::Leader)
        );
        assert_eq!(
            classify(Api::Produce, E::NotEnoughReplicas),
            Action::Retry(Refresh::Nothing)
        );
        assert_eq!(
            classify(Api::Produce, E::OutOfOrderSequenceNumber),
            Action::SequenceBroken
        );
        assert_eq!(
            classify(Api::Produce, E::UnknownProducerId),
            Action::SequenceBroken
        );
        assert_eq!(
            classify(Api::Produce, E::DuplicateSequenceNumber),
            Action::Duplicate
        );
        for code in [
            E::MessageTooLarge,
            E::RecordListTooLarge,
            E::InvalidRecord,
            E::TopicAuthorizationFailed,
            E::UnknownServerError,
            E::Unknown(9999),
        ] {
            assert_eq!(classify(Api::Produce, code), Action::Rejected, "{code}");
        }
    }

    /// An unexpected code on a transaction API must never be taken as success or silently retried forever.
    #[test]
    fn unknown_codes_on_transaction_apis_are_fatal() {
        for api in [
            Api::InitProducerId,
            Api::AddPartitionsToTxn,
            Api::AddOffsetsToTxn,
            Api::TxnOffsetCommit,
            Api::EndTxn,
        ] {
            assert_eq!(classify(api, E::Unknown(31337)), Action::Fatal);
            assert_eq!(
                classify(api, E::CoordinatorNotAvailable),
                Action::Retry(Refresh::Coordinator)
            );
            // A coordinator that could not be reached is looked up again, as one that moved.
            assert_eq!(
                classify(api, E::NetworkException),
                Action::Retry(Refresh::Coordinator)
            );
        }
    }
}
