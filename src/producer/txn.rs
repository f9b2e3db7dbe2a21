//! The transaction state machine: which request comes next, and what an answer does to the state.
//!
//! Sans-IO: every entry point takes `now` and answers with a [`Step`] (send this request, back off and
//! send it, done, failed); the async driver owns the sockets and the timers. Each user operation (`init`,
//! `send_offsets`, `commit`, `abort`) is a short sequence of steps; enrolling partitions in a TV1
//! transaction runs beside the produce path through [`TxnMachine::poll_add_partitions`].
//!
//! ```text
//!                 init                       begin
//!  Uninitialized ──────▶ Initializing ──ok──▶ Ready ◀──────────────┐
//!        ▲                    │                 │ begin             │ EndTxn ok (TV2: adopt the
//!        └──── timeout ───────┘                 ▼                   │ returned id/epoch); or
//!                                         InTransaction ─commit──▶ Committing ──no answer by
//!                                           │   │   ▲                   │        the deadline──▶ CommitOutcomeUnknown
//!                               produce/    │   │   │ send_offsets      │                         │ commit again ─▶ Committing
//!                               offsets err │   │   └─(stays)           │                         │ init ─▶ Initializing
//!                                           ▼   │ abort                 │
//!                                  AbortableError ──abort──▶ Aborting ──EndTxn ok──▶ Ready
//!                                                                  (TV1 after a sequence/epoch error:
//!                                                                   InitProducerId with current ids
//!                                                                   first, KIP-360)
//!  any state ── fenced / unauthorised / unsupported ──▶ FatalError (terminal)
//! ```
//!
//! Transaction versions:
//! - **TV1**: a partition is enrolled with AddPartitionsToTxn (v3 at most: v4+ is broker-to-broker)
//!   before the first produce to it (Produce at most v11); offsets go through AddOffsetsToTxn then
//!   TxnOffsetCommit (at most v4) to the group coordinator; EndTxn (at most v4). After an abort caused
//!   by a sequence or epoch error, InitProducerId v3+ with the current id and epoch bumps the epoch.
//! - **TV2** (KIP-890 part 2; the broker finalises `transaction.version` >= 2 and supports Produce v12,
//!   TxnOffsetCommit v5, EndTxn v5): Produce v12 enrols its partition itself; TxnOffsetCommit v5 needs
//!   no AddOffsetsToTxn; EndTxn v5 bumps the epoch on every transaction and answers with the id and epoch
//!   the producer continues with (its sequences restart at 0).
//!
//! With either version an EndTxn is skipped when nothing of the transaction reached a broker: the
//! coordinator does not know the transaction, and under TV2 nothing would be fenced by a bump.
//!
//! A commit that was sent and never answered is *outcome unknown*: the transaction may be committed.
//! Aborting it is refused (the commit could still land, and an abort would only mislead the caller);
//! the caller retries the commit (the coordinator answers a retry of a finished commit with success) or
//! re-initialises (InitProducerId completes or aborts whatever is pending), and learns the outcome by
//! reading.
//!
//! # References
//! - KIP-98 (transactions), KIP-360 (InitProducerId v3 epoch bump), KIP-447 (TxnOffsetCommit v3 group
//!   metadata), KIP-588 (recovering from transaction timeouts), KIP-890 parts 1 and 2
//! - Message specs: InitProducerId v0-6, AddPartitionsToTxn v0-5, AddOffsetsToTxn v0-4,
//!   TxnOffsetCommit v0-5, EndTxn v0-5, Produce v3-13

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Span;

use super::classify::{classify, Action, Api, Refresh};
use super::{OffsetAndMetadata, ProducerError, ProducerIdEpoch, TopicPartition};
use crate::wire::ErrorCode;
use crate::GroupMetadata;

/// Where a transactional producer stands. [`TransactionState::name`] is what error messages print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TransactionState {
    /// `init` has not completed.
    Uninitialized,
    /// InitProducerId is under way (first init, re-init, or the epoch bump after an abort).
    Initializing,
    /// Initialised, no transaction open.
    Ready,
    /// A transaction is open.
    InTransaction,
    /// EndTxn(commit) is under way.
    Committing,
    /// EndTxn(abort) is under way.
    Aborting,
    /// The transaction cannot commit; only `abort` is accepted.
    AbortableError,
    /// The producer is unusable.
    FatalError,
    /// A commit was sent and never answered: retry the commit or re-initialise; never abort.
    CommitOutcomeUnknown,
}

impl TransactionState {
    /// A lower-case name for messages.
    pub fn name(self) -> &'static str {
        match self {
            TransactionState::Uninitialized => "uninitialized",
            TransactionState::Initializing => "initializing",
            TransactionState::Ready => "ready",
            TransactionState::InTransaction => "in a transaction",
            TransactionState::Committing => "committing",
            TransactionState::Aborting => "aborting",
            TransactionState::AbortableError => "in an abortable error",
            TransactionState::FatalError => "in a fatal error",
            TransactionState::CommitOutcomeUnknown => "waiting on a commit of unknown outcome",
        }
    }
}

/// The transaction protocol in use for a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum TxnVersion {
    V1,
    V2,
}

/// What the broker offers that decides the protocol: the finalised `transaction.version` feature and the
/// highest version of each API the broker supports (`None`: not supported at all).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct BrokerCaps {
    pub(crate) transaction_version: i16,
    pub(crate) produce: Option<i16>,
    pub(crate) init_producer_id: Option<i16>,
    pub(crate) txn_offset_commit: Option<i16>,
    pub(crate) end_txn: Option<i16>,
}

impl BrokerCaps {
    /// TV2 needs the feature finalised at 2 or more *and* the request versions that carry it.
    pub(crate) fn txn_version(&self) -> TxnVersion {
        let at_least = |v: Option<i16>, min: i16| v.is_some_and(|v| v >= min);
        if self.transaction_version >= 2
            && at_least(self.produce, 12)
            && at_least(self.txn_offset_commit, 5)
            && at_least(self.end_txn, 5)
        {
            TxnVersion::V2
        } else {
            TxnVersion::V1
        }
    }

    /// Whether InitProducerId can bump an epoch with the current id and epoch (KIP-360, v3+).
    pub(crate) fn kip360(&self) -> bool {
        self.init_producer_id.is_some_and(|v| v >= 3)
    }
}

/// The highest version of `api` this producer may send under transaction version `tv`. Under TV1 the
/// versions that mean "TV2" must not be used inside a transaction, and AddPartitionsToTxn v4+ belongs to
/// brokers.
pub(crate) fn version_cap(api: Api, tv: TxnVersion) -> i16 {
    match (api, tv) {
        (Api::Produce, TxnVersion::V1) => crate::wire::PRODUCE_MAX_TV1,
        (Api::Produce, TxnVersion::V2) => crate::wire::PRODUCE_MAX,
        (Api::TxnOffsetCommit, TxnVersion::V1) => 4,
        (Api::TxnOffsetCommit, TxnVersion::V2) => 5,
        (Api::EndTxn, TxnVersion::V1) => 4,
        (Api::EndTxn, TxnVersion::V2) => 5,
        (Api::AddPartitionsToTxn, _) => 3,
        (Api::AddOffsetsToTxn, _) => i16::MAX,
        (Api::InitProducerId, _) => i16::MAX,
    }
}

/// The coordinator a transaction request goes to.
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
    /// Send this request now and feed the answer to [`TxnMachine::on_response`].
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

/// Exponential backoff without jitter (the machine reads no randomness either).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Backoff {
    pub(crate) base: Duration,
    pub(crate) max: Duration,
}

impl Backoff {
    pub(crate) fn delay(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(16)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.max)
    }

    /// The delay after CONCURRENT_TRANSACTIONS: [`CONCURRENT_RETRY`] for the first
    /// [`CONCURRENT_FLAT_ATTEMPTS`] retries, then doubling from there (never above the ordinary delay). The coordinator gives that answer while a state change of this very
    /// transactional id is in progress: the previous transaction's markers being written (a first
    /// enrolment sent right after a commit often races them), or the log append of an enrolment sent
    /// alongside.
    /// Both finish within milliseconds on a healthy cluster, so the ordinary delay (100 ms by default)
    /// would be most of a small transaction's time. The flat start follows the marker round closely
    /// (measured at 10-25 ms on a loaded one-node broker, docs/benchmarks.md): doubling from the first
    /// retry would overshoot its end by up to its own length (2+4+8 ms, then 16 more). The doubling
    /// after it still backs off from a coordinator whose markers are stuck.
    pub(crate) fn concurrent_delay(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(CONCURRENT_FLAT_ATTEMPTS - 1).min(16);
        let factor = 1u32.checked_shl(doublings).unwrap_or(u32::MAX);
        CONCURRENT_RETRY
            .saturating_mul(factor)
            .min(self.delay(attempt))
    }

    /// The delay before resending a request answered `code`.
    fn after(&self, code: ErrorCode, attempt: u32) -> Duration {
        if code == ErrorCode::ConcurrentTransactions {
            self.concurrent_delay(attempt)
        } else {
            self.delay(attempt)
        }
    }
}

#[derive(Debug, Clone)]
enum OffsetsStage {
    AddOffsets,
    Commit,
}

#[derive(Debug, Clone)]
enum Op {
    Init {
        started: Instant,
        deadline: Instant,
        attempts: u32,
        request: TxnRequest,
        /// The state to fall back to if the operation times out.
        origin: TransactionState,
    },
    Offsets {
        started: Instant,
        deadline: Instant,
        attempts: u32,
        group: GroupMetadata,
        offsets: Vec<(TopicPartition, OffsetAndMetadata)>,
        stage: OffsetsStage,
    },
    End {
        started: Instant,
        deadline: Instant,
        attempts: u32,
        commit: bool,
        /// Some attempt may have reached the coordinator without its answer reaching us.
        in_doubt: bool,
        /// The caller's budget for the operation, reused for the epoch bump after an abort.
        timeout: Duration,
    },
}

/// The current transaction's bookkeeping.
#[derive(Debug)]
struct Txn {
    started_at: Instant,
    tv: TxnVersion,
    /// Partitions the coordinator knows are in the transaction.
    partitions: BTreeSet<TopicPartition>,
    /// TV1: partitions to enrol, not yet requested.
    pending: BTreeSet<TopicPartition>,
    /// TV1: partitions in an AddPartitionsToTxn awaiting its answer.
    adding: BTreeSet<TopicPartition>,
    add_attempts: u32,
    add_not_before: Option<Instant>,
    /// TV1: groups enrolled with AddOffsetsToTxn.
    groups: BTreeSet<String>,
    /// Something of this transaction may have reached a broker, so it must be ended with EndTxn.
    reached_broker: bool,
    span: Span,
}

/// The first retry delay after CONCURRENT_TRANSACTIONS (see [`Backoff::concurrent_delay`]). The Java
/// client waits 20 ms after a first AddPartitionsToTxn answered so, but its full `retry.backoff.ms` after
/// an AddOffsetsToTxn or TxnOffsetCommit answered so: the offset commit that opens a transaction costs it
/// 100 ms whenever it races the previous transaction's markers (docs/transactions.md, "Latency").
pub(crate) const CONCURRENT_RETRY: Duration = Duration::from_millis(2);

/// How many CONCURRENT_TRANSACTIONS retries wait [`CONCURRENT_RETRY`] before the delay starts doubling
/// (see [`Backoff::concurrent_delay`]): ~20 ms of waiting, round trips aside.
pub(crate) const CONCURRENT_FLAT_ATTEMPTS: u32 = 10;

/// What happened to an AddPartitionsToTxn answer.
#[derive(Debug, Clone)]
pub(crate) struct AddPartitionsOutcome {
    /// Look the transaction coordinator up again before the retry.
    pub(crate) refresh_coordinator: bool,
    /// The transaction (or the producer) failed; the state says which.
    pub(crate) error: Option<ProducerError>,
}

/// The transactional producer's state machine. See the [module docs](self).
#[derive(Debug)]
pub(crate) struct TxnMachine {
    transactional_id: String,
    transaction_timeout: Duration,
    backoff: Backoff,
    caps: BrokerCaps,
    state: TransactionState,
    ids: Option<ProducerIdEpoch>,
    txn: Option<Txn>,
    /// TV1: the next abort must be followed by an epoch bump (a sequence or epoch error happened).
    bump_after_abort: bool,
    op: Option<Op>,
    /// Why the machine is in AbortableError or FatalError.
    cause: Option<Arc<ProducerError>>,
}

impl TxnMachine {
    pub(crate) fn new(
        transactional_id: impl Into<String>,
        transaction_timeout: Duration,
        backoff: Backoff,
        caps: BrokerCaps,
    ) -> Self {
        TxnMachine {
            transactional_id: transactional_id.into(),
            transaction_timeout,
            backoff,
            caps,
            state: TransactionState::Uninitialized,
            ids: None,
            txn: None,
            bump_after_abort: false,
            op: None,
            cause: None,
        }
    }

    pub(crate) fn state(&self) -> TransactionState {
        self.state
    }

    pub(crate) fn ids(&self) -> Option<ProducerIdEpoch> {
        self.ids
    }

    /// The protocol of the open transaction (or the one the next would use).
    pub(crate) fn txn_version(&self) -> TxnVersion {
        self.txn
            .as_ref()
            .map_or_else(|| self.caps.txn_version(), |t| t.tv)
    }

    /// The broker's capabilities changed (a reconnect, a feature upgrade). Takes effect at the next
    /// `begin`; an open transaction keeps its protocol.
    pub(crate) fn set_caps(&mut self, caps: BrokerCaps) {
        self.caps = caps;
    }

    /// The error to refuse an operation with in the current state, if any.
    fn refusal(&self, op: &'static str) -> ProducerError {
        match (self.state, &self.cause) {
            (TransactionState::FatalError, Some(cause)) => ProducerError::Defunct {
                cause: cause.clone(),
            },
            (TransactionState::AbortableError, Some(cause)) => ProducerError::MustAbort {
                cause: cause.clone(),
            },
            (state, _) => ProducerError::IllegalState {
                op,
                state: state.name(),
            },
        }
    }

    fn fail_fatal(&mut self, err: ProducerError) -> ProducerError {
        if self.state != TransactionState::FatalError {
            self.state = TransactionState::FatalError;
            self.cause = Some(Arc::new(err.clone()));
            self.op = None;
            self.finish_span("fatal");
        }
        err
    }

    fn fail_abortable(&mut self, err: ProducerError) -> ProducerError {
        match self.state {
            TransactionState::FatalError => {}
            TransactionState::AbortableError => {}
            _ => {
                self.state = TransactionState::AbortableError;
                self.cause = Some(Arc::new(err.clone()));
            }
        }
        self.op = None;
        err
    }

    fn fenced(&self, code: ErrorCode) -> ProducerError {
        ProducerError::Fenced {
            transactional_id: self.transactional_id.clone(),
            code,
        }
    }

    /// A fatal refusal of a transactional request. A missing transactional-id ACL names the id, so the
    /// operator knows which permission to grant.
    fn fatal_refusal(&self, api: Api, code: ErrorCode) -> ProducerError {
        if code == ErrorCode::TransactionalIdAuthorizationFailed {
            return ProducerError::NotAuthorized {
                api: api.name(),
                resource: format!("transactional id {:?}", self.transactional_id),
                code,
            };
        }
        ProducerError::Broker {
            api: api.name(),
            code,
            class: super::ErrorClass::Fatal,
        }
    }

    fn finish_span(&mut self, outcome: &'static str) {
        if let Some(t) = &self.txn {
            t.span.record("outcome", outcome);
        }
    }

    fn close_txn(&mut self, outcome: &'static str, now: Instant) {
        if let Some(t) = self.txn.take() {
            let parts: Vec<String> = t.partitions.iter().map(ToString::to_string).collect();
            t.span.record("partitions", parts.join(",").as_str());
            t.span.record(
                "duration_ms",
                now.saturating_duration_since(t.started_at).as_millis() as u64,
            );
            t.span.record("outcome", outcome);
            tracing::debug!(parent: &t.span, outcome, "transaction ended");
        }
    }

    // ---------------------------------------------------------------------------------------------
    // init

    /// Starts (or resumes) `init`: InitProducerId with the transactional id. Allowed before the first
    /// init, to resume an interrupted one, and after a commit of unknown outcome (re-initialising
    /// completes or aborts whatever the coordinator holds).
    pub(crate) fn start_init(&mut self, now: Instant, timeout: Duration) -> Step {
        let origin = match self.state {
            TransactionState::Uninitialized | TransactionState::CommitOutcomeUnknown => self.state,
            TransactionState::Initializing => match &self.op {
                Some(Op::Init {
                    request, origin, ..
                }) => {
                    // Resumed after the caller dropped the future: send again, it is idempotent.
                    let request = request.clone();
                    let origin = *origin;
                    self.op = Some(Op::Init {
                        started: now,
                        deadline: now + timeout,
                        attempts: 0,
                        request: request.clone(),
                        origin,
                    });
                    return Step::Send(request);
                }
                _ => TransactionState::Uninitialized,
            },
            _ => return Step::Failed(self.refusal("init")),
        };
        let request = TxnRequest::InitProducerId {
            transactional_id: self.transactional_id.clone(),
            timeout_ms: duration_ms_i32(self.transaction_timeout),
            current: None,
        };
        self.close_txn("unknown", now);
        self.state = TransactionState::Initializing;
        self.op = Some(Op::Init {
            started: now,
            deadline: now + timeout,
            attempts: 0,
            request: request.clone(),
            origin,
        });
        Step::Send(request)
    }

    /// The epoch bump that follows a TV1 abort after a sequence or epoch error (KIP-360).
    fn start_bump(&mut self, now: Instant, timeout: Duration) -> Step {
        let Some(ids) = self.ids else {
            return Step::Failed(self.fail_fatal(ProducerError::IllegalState {
                op: "abort",
                state: "without a producer id",
            }));
        };
        if !self.caps.kip360() {
            return Step::Failed(self.fail_fatal(ProducerError::Unsupported {
                what: "InitProducerId v3 (KIP-360), needed to recover the producer epoch".into(),
            }));
        }
        let request = TxnRequest::InitProducerId {
            transactional_id: self.transactional_id.clone(),
            timeout_ms: duration_ms_i32(self.transaction_timeout),
            current: Some(ids),
        };
        self.state = TransactionState::Initializing;
        self.op = Some(Op::Init {
            started: now,
            deadline: now + timeout,
            attempts: 0,
            request: request.clone(),
            origin: TransactionState::AbortableError,
        });
        Step::Send(request)
    }

    // ---------------------------------------------------------------------------------------------
    // begin and the produce path

    /// Opens a transaction. No request: the coordinator learns of it with the first enrolment.
    pub(crate) fn begin(&mut self, now: Instant) -> Result<(), ProducerError> {
        if self.state != TransactionState::Ready {
            return Err(self.refusal("begin"));
        }
        let ids = self.ids.expect("Ready implies ids");
        let tv = self.caps.txn_version();
        let span = tracing::info_span!(
            "transaction",
            transactional_id = %self.transactional_id,
            producer_id = ids.id,
            producer_epoch = ids.epoch,
            tv = if tv == TxnVersion::V2 { 2 } else { 1 },
            partitions = tracing::field::Empty,
            duration_ms = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        self.txn = Some(Txn {
            started_at: now,
            tv,
            partitions: BTreeSet::new(),
            pending: BTreeSet::new(),
            adding: BTreeSet::new(),
            add_attempts: 0,
            add_not_before: None,
            groups: BTreeSet::new(),
            reached_broker: false,
            span,
        });
        self.state = TransactionState::InTransaction;
        Ok(())
    }

    /// The span of the open transaction, for the driver to enter around its requests.
    pub(crate) fn span(&self) -> Option<&Span> {
        self.txn.as_ref().map(|t| &t.span)
    }

    /// A record for `tp` is being accepted into the transaction. Refuses outside an open, healthy
    /// transaction. Under TV1 a partition seen for the first time is queued for AddPartitionsToTxn.
    pub(crate) fn on_append(&mut self, tp: &TopicPartition) -> Result<(), ProducerError> {
        if self.state != TransactionState::InTransaction {
            return Err(self.refusal("send"));
        }
        let txn = self.txn.as_mut().expect("InTransaction implies a txn");
        if txn.tv == TxnVersion::V1 && !txn.partitions.contains(tp) && !txn.adding.contains(tp) {
            txn.pending.insert(tp.clone());
        }
        Ok(())
    }

    /// Whether a batch for `tp` may be sent now: under TV1 only once the coordinator has enrolled the
    /// partition; under TV2 always (Produce v12 enrols it).
    pub(crate) fn can_produce(&self, tp: &TopicPartition) -> bool {
        match (&self.txn, self.state) {
            (Some(t), TransactionState::InTransaction) => {
                t.tv == TxnVersion::V2 || t.partitions.contains(tp)
            }
            _ => false,
        }
    }

    /// A Produce carrying a batch for `tp` is going out. Under TV2 that enrols the partition, so from
    /// here on the transaction must be ended with EndTxn.
    pub(crate) fn on_produce_sent(&mut self, tp: &TopicPartition) {
        if let Some(t) = self.txn.as_mut() {
            t.reached_broker = true;
            if t.tv == TxnVersion::V2 {
                t.partitions.insert(tp.clone());
            }
        }
    }

    /// TV1: the AddPartitionsToTxn to send now, if partitions wait for enrolment and none is in flight.
    pub(crate) fn poll_add_partitions(&mut self, now: Instant) -> Option<TxnRequest> {
        if self.state != TransactionState::InTransaction {
            return None;
        }
        let ids = self.ids?;
        let txn = self.txn.as_mut()?;
        if txn.tv != TxnVersion::V1
            || txn.pending.is_empty()
            || !txn.adding.is_empty()
            || txn.add_not_before.is_some_and(|t| now < t)
        {
            return None;
        }
        txn.adding = std::mem::take(&mut txn.pending);
        txn.reached_broker = true;
        Some(TxnRequest::AddPartitions {
            transactional_id: self.transactional_id.clone(),
            ids,
            partitions: txn.adding.iter().cloned().collect(),
        })
    }

    /// When the next AddPartitionsToTxn may go out after a backoff.
    pub(crate) fn add_partitions_not_before(&self) -> Option<Instant> {
        self.txn.as_ref().and_then(|t| t.add_not_before)
    }

    /// Whether TV1 enrolment is still pending or in flight (a commit must wait for it).
    #[cfg(test)]
    pub(crate) fn enrolment_pending(&self) -> bool {
        self.txn
            .as_ref()
            .is_some_and(|t| !t.pending.is_empty() || !t.adding.is_empty())
    }

    /// The answer to the AddPartitionsToTxn from [`TxnMachine::poll_add_partitions`].
    pub(crate) fn on_add_partitions(
        &mut self,
        response: TxnResponse,
        now: Instant,
    ) -> AddPartitionsOutcome {
        let Some(txn) = self.txn.as_mut() else {
            return AddPartitionsOutcome {
                refresh_coordinator: false,
                error: None,
            };
        };
        let adding = std::mem::take(&mut txn.adding);
        let results = match response {
            TxnResponse::AddPartitions(r) => r,
            // Enrolment is idempotent: resend after a backoff.
            TxnResponse::NoAnswer(_) => adding
                .iter()
                .map(|tp| (tp.clone(), ErrorCode::RequestTimedOut))
                .collect(),
            _ => {
                let cause = ProducerError::IllegalState {
                    op: "add_partitions",
                    state: "fed an answer of the wrong kind (driver bug)",
                };
                let err = ProducerError::Defunct {
                    cause: Arc::new(cause),
                };
                return self.add_failed(err, true);
            }
        };
        let mut refresh = false;
        let mut retry = BTreeSet::new();
        let mut worst: Option<(Action, ErrorCode)> = None;
        // Every partition to retry was answered CONCURRENT_TRANSACTIONS: the coordinator is busy with
        // this id for a moment (see `Backoff::concurrent_delay`).
        let mut busy = true;
        for (tp, code) in results {
            match classify(Api::AddPartitionsToTxn, code) {
                Action::Ok => {
                    txn.partitions.insert(tp);
                }
                Action::Retry(r) => {
                    refresh |= r == Refresh::Coordinator;
                    busy &= code == ErrorCode::ConcurrentTransactions;
                    retry.insert(tp);
                }
                action => {
                    let rank = |a: Action| match a {
                        Action::Fenced => 3,
                        Action::Fatal => 2,
                        _ => 1,
                    };
                    if worst.is_none_or(|(w, _)| rank(action) > rank(w)) {
                        worst = Some((action, code));
                    }
                }
            }
        }
        // A partition the answer did not mention was not enrolled.
        for tp in adding {
            if !txn.partitions.contains(&tp) && retry.insert(tp) {
                busy = false;
            }
        }
        if let Some((action, code)) = worst {
            let err = match action {
                Action::Fenced => return self.add_failed(self.fenced(code), true),
                Action::Fatal => self.fatal_refusal(Api::AddPartitionsToTxn, code),
                _ => ProducerError::Broker {
                    api: Api::AddPartitionsToTxn.name(),
                    code,
                    class: super::ErrorClass::Abortable,
                },
            };
            let fatal = action == Action::Fatal;
            return self.add_failed(err, fatal);
        }
        let txn = self.txn.as_mut().expect("checked above");
        if retry.is_empty() {
            txn.add_attempts = 0;
            txn.add_not_before = None;
        } else {
            txn.pending.extend(retry);
            let delay = if busy {
                concurrent_retry(Api::AddPartitionsToTxn);
                self.backoff.concurrent_delay(txn.add_attempts)
            } else {
                self.backoff.delay(txn.add_attempts)
            };
            tracing::debug!(
                api = Api::AddPartitionsToTxn.name(),
                delay_ms = delay.as_secs_f64() * 1e3,
                concurrent_transactions = busy,
                "enrolment answered \"not now\": retrying"
            );
            txn.add_not_before = Some(now + delay);
            txn.add_attempts += 1;
        }
        AddPartitionsOutcome {
            refresh_coordinator: refresh,
            error: None,
        }
    }

    fn add_failed(&mut self, err: ProducerError, fatal: bool) -> AddPartitionsOutcome {
        let err = if fatal {
            self.fail_fatal(err)
        } else {
            self.fail_abortable(err)
        };
        AddPartitionsOutcome {
            refresh_coordinator: false,
            error: Some(err),
        }
    }

    /// A batch of the transaction failed. `err` carries the class; `needs_bump` says the partition's
    /// sequence or epoch is broken, so under TV1 the abort must be followed by an epoch bump.
    pub(crate) fn on_produce_error(&mut self, err: ProducerError, needs_bump: bool) {
        if needs_bump {
            self.bump_after_abort = true;
        }
        if err.is_fatal() {
            self.fail_fatal(err);
        } else if matches!(
            self.state,
            TransactionState::InTransaction | TransactionState::AbortableError
        ) {
            self.fail_abortable(err);
        }
    }

    // ---------------------------------------------------------------------------------------------
    // send_offsets

    /// Starts `send_offsets`: commit `offsets` for `group` inside the transaction, fenced by the group's
    /// generation (TxnOffsetCommit v3+, KIP-447). An empty offset set completes at once.
    pub(crate) fn start_send_offsets(
        &mut self,
        group: &GroupMetadata,
        offsets: Vec<(TopicPartition, OffsetAndMetadata)>,
        now: Instant,
        timeout: Duration,
    ) -> Step {
        if self.state != TransactionState::InTransaction {
            return Step::Failed(self.refusal("send_offsets"));
        }
        if self.caps.txn_offset_commit.is_none_or(|v| v < 3) {
            return Step::Failed(self.fail_fatal(ProducerError::Unsupported {
                what: "TxnOffsetCommit v3 (KIP-447), the generation fence".into(),
            }));
        }
        if offsets.is_empty() {
            return Step::Done;
        }
        let txn = self.txn.as_mut().expect("InTransaction implies a txn");
        let stage = if txn.tv == TxnVersion::V1 && !txn.groups.contains(group.group_id()) {
            OffsetsStage::AddOffsets
        } else {
            OffsetsStage::Commit
        };
        txn.reached_broker = true;
        self.op = Some(Op::Offsets {
            started: now,
            deadline: now + timeout,
            attempts: 0,
            group: group.clone(),
            offsets,
            stage,
        });
        Step::Send(self.offsets_request())
    }

    fn offsets_request(&self) -> TxnRequest {
        let Some(Op::Offsets {
            group,
            offsets,
            stage,
            ..
        }) = &self.op
        else {
            unreachable!("offsets_request outside an offsets op")
        };
        let ids = self.ids.expect("in a transaction");
        match stage {
            OffsetsStage::AddOffsets => TxnRequest::AddOffsets {
                transactional_id: self.transactional_id.clone(),
                ids,
                group_id: group.group_id().to_owned(),
            },
            OffsetsStage::Commit => TxnRequest::TxnOffsetCommit {
                transactional_id: self.transactional_id.clone(),
                ids,
                group: group.clone(),
                offsets: offsets.clone(),
                tv: self.txn_version(),
            },
        }
    }

    // ---------------------------------------------------------------------------------------------
    // commit and abort

    /// Starts (or resumes) `commit`. The driver must have flushed the transaction's batches, waited for
    /// every Produce answer and for TV1 enrolment first.
    pub(crate) fn start_commit(&mut self, now: Instant, timeout: Duration) -> Step {
        match self.state {
            TransactionState::InTransaction => {
                if let Some(Op::Offsets { .. }) = self.op {
                    // send_offsets was dropped mid-way: whether the group fence ran is unknown, and
                    // committing without it would let a stale owner's writes land. Never commit that.
                    let cause = self.fail_abortable(ProducerError::IllegalState {
                        op: "commit",
                        state: "after an interrupted send_offsets",
                    });
                    return Step::Failed(ProducerError::MustAbort {
                        cause: Arc::new(cause),
                    });
                }
                let txn = self.txn.as_ref().expect("InTransaction implies a txn");
                if !txn.pending.is_empty() || !txn.adding.is_empty() {
                    return Step::Failed(ProducerError::IllegalState {
                        op: "commit",
                        state: "still enrolling partitions",
                    });
                }
                if !txn.reached_broker {
                    self.state = TransactionState::Ready;
                    self.close_txn("committed-empty", now);
                    return Step::Done;
                }
                self.start_end(true, false, now, timeout)
            }
            TransactionState::Committing => self.start_end(true, true, now, timeout),
            TransactionState::CommitOutcomeUnknown => self.start_end(true, true, now, timeout),
            _ => Step::Failed(self.refusal("commit")),
        }
    }

    /// Starts (or resumes) `abort`. The driver must have dropped the transaction's unsent batches and
    /// waited for every Produce in flight to be answered or given up (so no write lands after the
    /// markers).
    pub(crate) fn start_abort(&mut self, now: Instant, timeout: Duration) -> Step {
        match self.state {
            TransactionState::InTransaction | TransactionState::AbortableError => {
                self.op = None;
                let reached = self.txn.as_ref().is_some_and(|t| t.reached_broker);
                if !reached {
                    self.close_txn("aborted-empty", now);
                    return self.after_abort(now, timeout);
                }
                self.start_end(false, false, now, timeout)
            }
            TransactionState::Aborting => self.start_end(false, true, now, timeout),
            TransactionState::Initializing
                if matches!(
                    self.op,
                    Some(Op::Init {
                        origin: TransactionState::AbortableError,
                        ..
                    })
                ) =>
            {
                // The bump after an abort was interrupted; resume it.
                self.start_bump(now, timeout)
            }
            TransactionState::Committing | TransactionState::CommitOutcomeUnknown => {
                Step::Failed(ProducerError::IllegalState {
                    op: "abort",
                    state: "committing (the commit may land: retry commit or re-initialise)",
                })
            }
            _ => Step::Failed(self.refusal("abort")),
        }
    }

    fn start_end(&mut self, commit: bool, resumed: bool, now: Instant, timeout: Duration) -> Step {
        let in_doubt = resumed
            || matches!(self.op, Some(Op::End { in_doubt: true, .. }))
            || self.state == TransactionState::CommitOutcomeUnknown;
        self.state = if commit {
            TransactionState::Committing
        } else {
            TransactionState::Aborting
        };
        self.op = Some(Op::End {
            started: now,
            deadline: now + timeout,
            attempts: 0,
            commit,
            in_doubt,
            timeout,
        });
        Step::Send(self.end_request(commit))
    }

    fn end_request(&self, commit: bool) -> TxnRequest {
        TxnRequest::EndTxn {
            transactional_id: self.transactional_id.clone(),
            ids: self.ids.expect("ending a transaction implies ids"),
            commit,
            tv: self.txn_version(),
        }
    }

    /// After a successful (or skipped) abort: ready, unless TV1 needs the epoch bump first.
    fn after_abort(&mut self, now: Instant, timeout: Duration) -> Step {
        self.cause = None;
        if self.bump_after_abort {
            return self.start_bump(now, timeout);
        }
        self.state = TransactionState::Ready;
        self.op = None;
        Step::Done
    }

    // ---------------------------------------------------------------------------------------------
    // answers

    /// Feeds the answer to the last [`Step::Send`] of the operation in progress.
    pub(crate) fn on_response(&mut self, response: TxnResponse, now: Instant) -> Step {
        match self.op.take() {
            Some(Op::Init {
                started,
                deadline,
                attempts,
                request,
                origin,
            }) => self.on_init(response, now, started, deadline, attempts, request, origin),
            Some(Op::Offsets {
                started,
                deadline,
                attempts,
                group,
                offsets,
                stage,
                ..
            }) => self.on_offsets(
                response, now, started, deadline, attempts, group, offsets, stage,
            ),
            Some(Op::End {
                started,
                deadline,
                attempts,
                commit,
                in_doubt,
                timeout,
            }) => self.on_end(
                response, now, started, deadline, attempts, commit, in_doubt, timeout,
            ),
            // The operation was cut short (a fatal error from the produce path, say): report why.
            None => Step::Failed(self.refusal("on_response")),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_init(
        &mut self,
        response: TxnResponse,
        now: Instant,
        started: Instant,
        deadline: Instant,
        attempts: u32,
        request: TxnRequest,
        origin: TransactionState,
    ) -> Step {
        let (code, ids) = match response {
            TxnResponse::InitProducerId(Ok(ids)) => (ErrorCode::None, Some(ids)),
            TxnResponse::InitProducerId(Err(code)) => (code, None),
            TxnResponse::NoAnswer(_) => (ErrorCode::RequestTimedOut, None),
            _ => return self.mismatch("init"),
        };
        let action = match classify(Api::InitProducerId, code) {
            // An abortable answer to InitProducerId leaves nothing to abort: try again.
            Action::Abortable => Action::Retry(Refresh::Nothing),
            a => a,
        };
        match action {
            Action::Ok => {
                let ids = ids.expect("ok implies ids");
                self.ids = Some(ids);
                self.state = TransactionState::Ready;
                self.bump_after_abort = false;
                self.cause = None;
                tracing::info!(
                    transactional_id = %self.transactional_id,
                    producer_id = ids.id,
                    producer_epoch = ids.epoch,
                    "producer initialised"
                );
                Step::Done
            }
            Action::Retry(refresh) => {
                if now >= deadline {
                    self.state = origin;
                    if origin == TransactionState::AbortableError && self.cause.is_none() {
                        self.cause = Some(Arc::new(ProducerError::Timeout {
                            op: "epoch bump after abort",
                            elapsed: now.saturating_duration_since(started),
                            class: super::ErrorClass::Abortable,
                            last_error: Some(code),
                        }));
                    }
                    return Step::Failed(ProducerError::Timeout {
                        op: "init",
                        elapsed: now.saturating_duration_since(started),
                        class: super::ErrorClass::Retriable,
                        last_error: Some(code),
                    });
                }
                self.op = Some(Op::Init {
                    started,
                    deadline,
                    attempts: attempts + 1,
                    request: request.clone(),
                    origin,
                });
                if code == ErrorCode::ConcurrentTransactions {
                    concurrent_retry(Api::InitProducerId);
                }
                retry(code, self.backoff.after(code, attempts), refresh, request)
            }
            Action::Fenced => Step::Failed(self.fail_fatal(self.fenced(code))),
            _ => Step::Failed(self.fail_fatal(self.fatal_refusal(Api::InitProducerId, code))),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_offsets(
        &mut self,
        response: TxnResponse,
        now: Instant,
        started: Instant,
        deadline: Instant,
        attempts: u32,
        group: GroupMetadata,
        offsets: Vec<(TopicPartition, OffsetAndMetadata)>,
        stage: OffsetsStage,
    ) -> Step {
        let (api, codes): (Api, Vec<ErrorCode>) = match (&stage, response) {
            (OffsetsStage::AddOffsets, TxnResponse::AddOffsets(code)) => {
                (Api::AddOffsetsToTxn, vec![code])
            }
            (OffsetsStage::Commit, TxnResponse::TxnOffsetCommit(results)) => (
                Api::TxnOffsetCommit,
                results.into_iter().map(|(_, c)| c).collect(),
            ),
            (OffsetsStage::AddOffsets, TxnResponse::NoAnswer(_)) => {
                (Api::AddOffsetsToTxn, vec![ErrorCode::RequestTimedOut])
            }
            (OffsetsStage::Commit, TxnResponse::NoAnswer(_)) => {
                (Api::TxnOffsetCommit, vec![ErrorCode::RequestTimedOut])
            }
            _ => return self.mismatch("send_offsets"),
        };
        // The most severe answer decides: a fence beats a commit fence beats abortable beats retry.
        let mut decided = Action::Ok;
        let mut decided_code = ErrorCode::None;
        // A short retry only if every partition to retry was answered CONCURRENT_TRANSACTIONS.
        let mut busy = true;
        let rank = |a: Action| match a {
            Action::Ok => 0,
            Action::Retry(Refresh::Nothing) => 1,
            Action::Retry(_) => 2,
            Action::Abortable => 3,
            Action::CommitFenced => 4,
            Action::Fatal => 5,
            Action::Fenced => 6,
            _ => 5,
        };
        for code in codes {
            let a = classify(api, code);
            if matches!(a, Action::Retry(_)) {
                busy &= code == ErrorCode::ConcurrentTransactions;
            }
            if rank(a) > rank(decided) {
                decided = a;
                decided_code = code;
            }
        }
        let op_again = |attempts, stage| Op::Offsets {
            started,
            deadline,
            attempts,
            group: group.clone(),
            offsets: offsets.clone(),
            stage,
        };
        match decided {
            Action::Ok => match stage {
                OffsetsStage::AddOffsets => {
                    if let Some(t) = self.txn.as_mut() {
                        t.groups.insert(group.group_id().to_owned());
                    }
                    self.op = Some(op_again(0, OffsetsStage::Commit));
                    Step::Send(self.offsets_request())
                }
                OffsetsStage::Commit => Step::Done,
            },
            Action::Retry(refresh) => {
                if now >= deadline {
                    return Step::Failed(self.fail_abortable(ProducerError::Timeout {
                        op: "send_offsets",
                        elapsed: now.saturating_duration_since(started),
                        class: super::ErrorClass::Abortable,
                        last_error: Some(decided_code),
                    }));
                }
                self.op = Some(op_again(attempts + 1, stage));
                let delay = if busy {
                    concurrent_retry(api);
                    self.backoff.concurrent_delay(attempts)
                } else {
                    self.backoff.delay(attempts)
                };
                retry(decided_code, delay, refresh, self.offsets_request())
            }
            Action::CommitFenced => {
                tracing::warn!(
                    group_id = group.group_id(),
                    generation = group.generation_id(),
                    code = %decided_code,
                    "offset commit fenced by the group coordinator"
                );
                Step::Failed(self.fail_abortable(ProducerError::CommitFenced {
                    group_id: group.group_id().to_owned(),
                    code: decided_code,
                }))
            }
            Action::Fenced => Step::Failed(self.fail_fatal(self.fenced(decided_code))),
            Action::Abortable => Step::Failed(self.fail_abortable(ProducerError::Broker {
                api: api.name(),
                code: decided_code,
                class: super::ErrorClass::Abortable,
            })),
            _ => Step::Failed(self.fail_fatal(self.fatal_refusal(api, decided_code))),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_end(
        &mut self,
        response: TxnResponse,
        now: Instant,
        started: Instant,
        deadline: Instant,
        attempts: u32,
        commit: bool,
        mut in_doubt: bool,
        timeout: Duration,
    ) -> Step {
        let (code, next, no_answer) = match response {
            TxnResponse::EndTxn { code, next } => (code, next, None),
            TxnResponse::NoAnswer(reason) => (ErrorCode::RequestTimedOut, None, Some(reason)),
            _ => return self.mismatch("commit/abort"),
        };
        if no_answer.is_some() {
            in_doubt = true;
        }
        match classify(Api::EndTxn, code) {
            Action::Ok => {
                let tv = self.txn_version();
                if tv == TxnVersion::V2 {
                    if let Some(next) = next.filter(|n| n.id >= 0 && n.epoch >= 0) {
                        self.ids = Some(next);
                    }
                    // EndTxn v5 bumped the epoch: nothing late can land in the next transaction.
                    self.bump_after_abort = false;
                }
                self.close_txn(if commit { "committed" } else { "aborted" }, now);
                if commit {
                    self.state = TransactionState::Ready;
                    Step::Done
                } else {
                    self.after_abort(now, timeout)
                }
            }
            Action::Retry(refresh) => {
                if now >= deadline {
                    let elapsed = now.saturating_duration_since(started);
                    if commit && in_doubt {
                        self.state = TransactionState::CommitOutcomeUnknown;
                        self.finish_span("unknown");
                        return Step::Failed(ProducerError::CommitOutcomeUnknown {
                            transactional_id: self.transactional_id.clone(),
                            reason: no_answer.unwrap_or_else(|| {
                                format!("no answer to an earlier attempt; last answer {code}")
                            }),
                        });
                    }
                    // Every attempt was answered "not now": nothing was applied. The transaction is
                    // still open at the coordinator; aborting it is safe.
                    self.state = TransactionState::AbortableError;
                    let err = ProducerError::Timeout {
                        op: if commit { "commit" } else { "abort" },
                        elapsed,
                        class: super::ErrorClass::Abortable,
                        last_error: Some(code),
                    };
                    self.cause = Some(Arc::new(err.clone()));
                    return Step::Failed(err);
                }
                self.op = Some(Op::End {
                    started,
                    deadline,
                    attempts: attempts + 1,
                    commit,
                    in_doubt,
                    timeout,
                });
                if code == ErrorCode::ConcurrentTransactions {
                    concurrent_retry(Api::EndTxn);
                }
                retry(
                    code,
                    self.backoff.after(code, attempts),
                    refresh,
                    self.end_request(commit),
                )
            }
            Action::Fenced => Step::Failed(self.fail_fatal(self.fenced(code))),
            Action::Abortable => Step::Failed(self.fail_abortable(ProducerError::Broker {
                api: Api::EndTxn.name(),
                code,
                class: super::ErrorClass::Abortable,
            })),
            _ => Step::Failed(self.fail_fatal(ProducerError::Broker {
                api: Api::EndTxn.name(),
                code,
                class: super::ErrorClass::Fatal,
            })),
        }
    }

    /// Whether an operation is under way (or was interrupted by a dropped future and awaits resumption).
    #[cfg(test)]
    pub(crate) fn op_in_progress(&self) -> bool {
        self.op.is_some()
    }

    /// An answer of the wrong kind: a bug in the driver, never broker input. The producer cannot trust its
    /// own view of the transaction any more.
    fn mismatch(&mut self, op: &'static str) -> Step {
        let cause = self.fail_fatal(ProducerError::IllegalState {
            op,
            state: "fed an answer of the wrong kind (driver bug)",
        });
        Step::Failed(ProducerError::Defunct {
            cause: Arc::new(cause),
        })
    }
}

/// A retry of `request` after `delay`, told to the debug log with the answer that caused it: where a
/// transaction's time goes is mostly in these waits.
fn retry(code: ErrorCode, delay: Duration, refresh: Refresh, request: TxnRequest) -> Step {
    tracing::debug!(
        api = request.api().name(),
        %code,
        delay_ms = delay.as_secs_f64() * 1e3,
        "transaction request answered \"not now\": retrying"
    );
    Step::Backoff {
        delay,
        refresh: refresh == Refresh::Coordinator,
        request,
    }
}

/// Counts a retry after CONCURRENT_TRANSACTIONS. A counter is a side channel like the debug line next to
/// each call: it sends nothing and reads no clock, so the machine stays free of I/O.
fn concurrent_retry(api: Api) {
    crate::telemetry::count(
        &crate::telemetry::CONCURRENT_TRANSACTIONS_RETRIES,
        Some(api.name()),
    );
}

fn duration_ms_i32(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests;
