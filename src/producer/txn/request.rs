//! The requests the machine asks for, the answers it is fed, and the steps it hands the driver.

use std::time::Duration;

use super::super::classify::Api;
use super::super::{OffsetAndMetadata, ProducerError, ProducerIdEpoch, TopicPartition};
use super::version::{version_cap, TxnVersion};
use crate::wire::ErrorCode;
use crate::GroupMetadata;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Coordinator {
    Transaction(String),
    Group(String),
}

/// A request the machine wants sent, with everything needed to build it at any version.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum TxnRequest {
    InitProducerId {
        transactional_id: String,
        timeout_ms: i32,
        /// KIP-360: bump this id's epoch instead of starting over.
        current: Option<ProducerIdEpoch>,
        /// KIP-939 (v6): this producer takes part in two-phase commits.
        enable_2pc: bool,
        /// KIP-939 (v6): keep the transaction a predecessor prepared instead of aborting it.
        keep_prepared: bool,
    },
    AddPartitions {
        transactional_id: String,
        ids: ProducerIdEpoch,
        partitions: Vec<TopicPartition>,
    },
    AddOffsets {
        transactional_id: String,
        ids: ProducerIdEpoch,
        group_id: String,
    },
    TxnOffsetCommit {
        transactional_id: String,
        ids: ProducerIdEpoch,
        group: GroupMetadata,
        offsets: Vec<(TopicPartition, OffsetAndMetadata)>,
        tv: TxnVersion,
    },
    EndTxn {
        transactional_id: String,
        ids: ProducerIdEpoch,
        commit: bool,
        tv: TxnVersion,
    },
}

impl TxnRequest {
    pub(crate) fn api(&self) -> Api {
        match self {
            TxnRequest::InitProducerId { .. } => Api::InitProducerId,
            TxnRequest::AddPartitions { .. } => Api::AddPartitionsToTxn,
            TxnRequest::AddOffsets { .. } => Api::AddOffsetsToTxn,
            TxnRequest::TxnOffsetCommit { .. } => Api::TxnOffsetCommit,
            TxnRequest::EndTxn { .. } => Api::EndTxn,
        }
    }

    pub(crate) fn coordinator(&self) -> Coordinator {
        match self {
            TxnRequest::TxnOffsetCommit { group, .. } => {
                Coordinator::Group(group.group_id().to_owned())
            }
            TxnRequest::InitProducerId {
                transactional_id, ..
            }
            | TxnRequest::AddPartitions {
                transactional_id, ..
            }
            | TxnRequest::AddOffsets {
                transactional_id, ..
            }
            | TxnRequest::EndTxn {
                transactional_id, ..
            } => Coordinator::Transaction(transactional_id.clone()),
        }
    }

    /// The lowest version this request may go out at: v6 for a two-phase-commit init (below it the
    /// request cannot say so), none otherwise.
    pub(crate) fn min_version(&self) -> Option<i16> {
        match self {
            TxnRequest::InitProducerId {
                enable_2pc: true, ..
            }
            | TxnRequest::InitProducerId {
                keep_prepared: true,
                ..
            } => Some(crate::wire::INIT_PRODUCER_ID_MIN_2PC),
            _ => None,
        }
    }

    /// The highest version this request may go out at.
    pub(crate) fn max_version(&self) -> i16 {
        match self {
            TxnRequest::TxnOffsetCommit { tv, .. } | TxnRequest::EndTxn { tv, .. } => {
                version_cap(self.api(), *tv)
            }
            other => version_cap(other.api(), TxnVersion::V1),
        }
    }
}

impl TxnRequest {
    /// The answer this request would get if the broker answered `code` for all of it: how a request
    /// that never left (no coordinator, no connection) is fed back to the machine.
    pub(crate) fn answered_with(&self, code: ErrorCode) -> TxnResponse {
        match self {
            TxnRequest::InitProducerId { .. } => TxnResponse::InitProducerId(Err(code)),
            TxnRequest::AddPartitions { partitions, .. } => {
                TxnResponse::AddPartitions(partitions.iter().map(|tp| (tp.clone(), code)).collect())
            }
            TxnRequest::AddOffsets { .. } => TxnResponse::AddOffsets(code),
            TxnRequest::TxnOffsetCommit { offsets, .. } => TxnResponse::TxnOffsetCommit(
                offsets.iter().map(|(tp, _)| (tp.clone(), code)).collect(),
            ),
            TxnRequest::EndTxn { .. } => TxnResponse::EndTxn { code, next: None },
        }
    }
}

/// An answer to a [`TxnRequest`], reduced to what the machine needs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum TxnResponse {
    InitProducerId(Result<ProducerIdEpoch, ErrorCode>),
    /// InitProducerId v6 with `KeepPreparedTxn` answered with a transaction still open: the ids this
    /// producer continues with, and those the kept transaction runs under (its name, KIP-939).
    InitKept {
        ids: ProducerIdEpoch,
        ongoing: ProducerIdEpoch,
    },
    AddPartitions(Vec<(TopicPartition, ErrorCode)>),
    AddOffsets(ErrorCode),
    TxnOffsetCommit(Vec<(TopicPartition, ErrorCode)>),
    EndTxn {
        code: ErrorCode,
        /// EndTxn v5: the id and epoch to continue with.
        next: Option<ProducerIdEpoch>,
    },
    /// No answer: timeout, dropped connection, or the network layer gave up.
    NoAnswer(String),
}

/// What the driver does next for an operation.
#[derive(Debug, Clone)]
pub(crate) enum Step {
    /// Send this request now and feed the answer to [`TxnMachine::handle_response`](super::TxnMachine::handle_response).
    Send(TxnRequest),
    /// Wait `delay`; if `refresh`, look the request's coordinator up again; then send `request`.
    Backoff {
        delay: Duration,
        refresh: bool,
        request: TxnRequest,
    },
    /// The operation completed.
    Done,
    /// The operation failed; the machine's state already says what is allowed next.
    Failed(ProducerError),
}

// Errors carry no equality of their own (they will wrap transport errors); tests compare steps, and a
// failure's message identifies it well enough there.
#[cfg(test)]
impl PartialEq for Step {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Step::Send(a), Step::Send(b)) => a == b,
            (
                Step::Backoff {
                    delay: d1,
                    refresh: r1,
                    request: q1,
                },
                Step::Backoff {
                    delay: d2,
                    refresh: r2,
                    request: q2,
                },
            ) => d1 == d2 && r1 == r2 && q1 == q2,
            (Step::Done, Step::Done) => true,
            (Step::Failed(a), Step::Failed(b)) => a.to_string() == b.to_string(),
            _ => false,
        }
    }
}
