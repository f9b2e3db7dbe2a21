//! The transaction machine itself: what each call and each answer does to the state (`state.rs`).
//!
//! # Method kinds and call order
//! As every I/O-free machine here (quinn-proto's vocabulary), all taking `now` where time matters:
//! - **commands** from the application: `start_init`, `begin`, `start_send_offsets`, `prepare`,
//!   `start_commit`, `start_abort`; each answers with the first [`Step`] of its operation;
//! - **`handle_*`**, input: `handle_response` (the answer to the last `Step::Send`),
//!   `handle_add_partitions` (a TV1 enrolment's answer), and what the produce path reports:
//!   `handle_append`, `handle_produce_sent`, `handle_produce_error`;
//! - **`poll_*`**, output: `poll_add_partitions` (the enrolment to send now), `poll_timeout` (when to
//!   ask `poll_add_partitions` again).
//!
//! The transactional driver runs one operation at a time: a command, then `handle_response` for each
//! `Step::Send` until a terminal step. The produce driver calls `handle_append` before buffering a
//! record, asks `can_produce` before letting a batch out, and polls the enrolment on each pass.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Span;

use super::super::classify::{classify, Action, Api, Refresh};
use super::super::{
    OffsetAndMetadata, ProducerError, ProducerIdEpoch, TopicPartition, TwoPhaseCommitRefusal,
};
use super::state::{Attempts, EndOp, InitOp, OffsetsOp, OffsetsStage, Origin, State, Txn};
use super::{BrokerCaps, Step, TransactionState, TxnRequest, TxnResponse, TxnVersion};
use crate::net::Backoff;
use crate::wire::ErrorCode;
use crate::GroupMetadata;

/// The first retry delay after CONCURRENT_TRANSACTIONS (see [`concurrent_delay`]). The Java
/// client waits 20 ms after a first AddPartitionsToTxn answered so, but its full `retry.backoff.ms` after
/// an AddOffsetsToTxn or TxnOffsetCommit answered so: the offset commit that opens a transaction costs it
/// 100 ms whenever it races the previous transaction's markers (docs/transactions.md, "Latency").
pub(crate) const CONCURRENT_RETRY: Duration = Duration::from_millis(2);

/// How many CONCURRENT_TRANSACTIONS retries wait [`CONCURRENT_RETRY`] before the delay starts doubling
/// (see [`concurrent_delay`]): ~20 ms of waiting, round trips aside.
pub(crate) const CONCURRENT_FLAT_ATTEMPTS: u32 = 10;

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
pub(crate) fn concurrent_delay(backoff: &Backoff, attempt: u32) -> Duration {
    let doublings = attempt.saturating_sub(CONCURRENT_FLAT_ATTEMPTS - 1).min(16);
    let factor = 1u32.checked_shl(doublings).unwrap_or(u32::MAX);
    CONCURRENT_RETRY
        .saturating_mul(factor)
        .min(backoff.delay(attempt))
}

/// The delay before resending a request of `api` for the `retries`-th time: the short one while the
/// coordinator is only `busy` with this id (see [`concurrent_delay`]), else the ordinary back-off.
/// Enrolment has no deadline of its own, so it takes this half of the rule alone.
fn retry_delay(backoff: &Backoff, api: Api, busy: bool, retries: u32) -> Duration {
    if busy {
        concurrent_retry(api);
        concurrent_delay(backoff, retries)
    } else {
        backoff.delay(retries)
    }
}

/// What an answer of "not now" does to an operation, as [`TxnMachine::retry_or_timeout`] decides.
enum NotNow {
    /// Resend after `delay`, with the operation's budget now `attempts`.
    Retry { delay: Duration, attempts: Attempts },
    /// The deadline has passed: the operation ends, `elapsed` after it started.
    TimedOut { elapsed: Duration },
}

/// What happened to an AddPartitionsToTxn answer.
#[derive(Debug, Clone)]
pub(crate) struct AddPartitionsOutcome {
    /// Look the transaction coordinator up again before the retry.
    pub(crate) refresh_coordinator: bool,
    /// The transaction (or the producer) failed; the state says which.
    pub(crate) error: Option<ProducerError>,
}

/// The transactional producer's state machine. See the [module docs](super).
#[derive(Debug)]
pub(crate) struct TxnMachine {
    transactional_id: String,
    transaction_timeout: Duration,
    backoff: Backoff,
    caps: BrokerCaps,
    state: State,
    /// TV1: the next abort must be followed by an epoch bump (a sequence or epoch error happened).
    /// Set from any state (a late produce answer), so it lives beside the state, not in it.
    bump_after_abort: bool,
    /// Two-phase commit (KIP-939): every init says `Enable2Pc`, and `prepare` is allowed.
    two_phase: bool,
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
            state: State::Uninitialized,
            bump_after_abort: false,
            two_phase: false,
        }
    }

    /// A machine whose producer takes part in two-phase commits (KIP-939).
    pub(crate) fn with_two_phase(mut self, on: bool) -> Self {
        self.two_phase = on;
        self
    }

    fn refused_2pc(&self, refusal: TwoPhaseCommitRefusal) -> ProducerError {
        ProducerError::TwoPhaseCommitRefused {
            transactional_id: self.transactional_id.clone(),
            refusal,
        }
    }

    pub(crate) fn state(&self) -> TransactionState {
        self.state.public()
    }

    pub(crate) fn ids(&self) -> Option<ProducerIdEpoch> {
        self.state.ids()
    }

    /// The transactional id the machine runs transactions for.
    pub(crate) fn transactional_id(&self) -> &str {
        &self.transactional_id
    }

    /// The protocol of the open transaction (or the one the next would use).
    pub(crate) fn txn_version(&self) -> TxnVersion {
        self.tv_of(self.state.txn())
    }

    fn tv_of(&self, txn: Option<&Txn>) -> TxnVersion {
        txn.map_or_else(|| self.caps.txn_version(), |t| t.tv)
    }

    /// The broker's capabilities changed (a reconnect, a feature upgrade). Takes effect at the next
    /// `begin`; an open transaction keeps its protocol.
    pub(crate) fn set_caps(&mut self, caps: BrokerCaps) {
        self.caps = caps;
    }

    /// Takes the state out to move its data into the next one. Every caller puts a state back before
    /// it returns.
    fn take_state(&mut self) -> State {
        std::mem::replace(&mut self.state, State::Uninitialized)
    }

    /// The error to refuse an operation with in the current state, if any.
    fn refusal(&self, op: &'static str) -> ProducerError {
        match &self.state {
            State::FatalError { cause, .. } => ProducerError::Defunct {
                cause: cause.clone(),
            },
            State::AbortableError { cause, .. } => ProducerError::MustAbort {
                cause: cause.clone(),
            },
            state => ProducerError::IllegalState {
                op,
                state: state.public().name(),
            },
        }
    }

    fn fail_fatal(&mut self, err: ProducerError) -> ProducerError {
        let state = self.take_state();
        self.state = state.into_fatal(&err);
        err
    }

    fn fail_abortable(&mut self, err: ProducerError) -> ProducerError {
        let state = self.take_state();
        self.state = state.into_abortable(&err);
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
            class: super::super::ErrorClass::Fatal,
        }
    }

    /// The one rule for an answer of "not now" to InitProducerId, `send_offsets` or EndTxn: once the
    /// deadline has passed the operation ends (each caller decides into which state), otherwise it
    /// is resent after [`retry_delay`]. `busy` says every code that asked for the retry
    /// was CONCURRENT_TRANSACTIONS.
    fn retry_or_timeout(&self, api: Api, attempts: Attempts, busy: bool, now: Instant) -> NotNow {
        if now >= attempts.deadline {
            return NotNow::TimedOut {
                elapsed: now.saturating_duration_since(attempts.started),
            };
        }
        NotNow::Retry {
            delay: retry_delay(&self.backoff, api, busy, attempts.retries),
            attempts: attempts.retried(),
        }
    }

    fn init_request(&self, current: Option<ProducerIdEpoch>, keep_prepared: bool) -> TxnRequest {
        TxnRequest::InitProducerId {
            transactional_id: self.transactional_id.clone(),
            timeout_ms: duration_ms_i32(self.transaction_timeout),
            current,
            enable_2pc: self.two_phase,
            keep_prepared,
        }
    }

    // ---------------------------------------------------------------------------------------------
    // init

    /// Starts (or resumes) `init`: InitProducerId with the transactional id. Allowed before the first
    /// init, to resume an interrupted one, and after a commit of unknown outcome (re-initialising
    /// completes or aborts whatever the coordinator holds). With `keep_prepared` (two-phase commit
    /// only) a transaction the predecessor left open is kept, not aborted, and the machine lands in
    /// `Prepared` holding its name.
    pub(crate) fn start_init(
        &mut self,
        now: Instant,
        timeout: Duration,
        keep_prepared: bool,
    ) -> Step {
        if keep_prepared && !self.two_phase {
            return Step::Failed(ProducerError::IllegalState {
                op: "init_keeping_prepared",
                state: "not configured for two-phase commit",
            });
        }
        if self.two_phase && self.caps.init_producer_id.is_some_and(|v| v < 6) {
            // The coordinator's versions are known and v6 is not among them: say so now rather than
            // fail the request on encoding.
            return Step::Failed(
                self.fail_fatal(self.refused_2pc(TwoPhaseCommitRefusal::NotSpoken)),
            );
        }
        let origin = match self.take_state() {
            State::Uninitialized => Origin::Uninitialized,
            State::CommitOutcomeUnknown { ids, txn } => {
                if let Some(t) = txn {
                    close_txn(t, "unknown", now);
                }
                Origin::CommitOutcomeUnknown { ids }
            }
            State::Initializing(op) => {
                // Resumed after the caller dropped the future: send again, it is idempotent.
                let request = op.request.clone();
                self.state = State::Initializing(InitOp {
                    attempts: Attempts::start(now, timeout),
                    request: op.request,
                    origin: op.origin,
                });
                return Step::Send(request);
            }
            other => {
                self.state = other;
                return Step::Failed(self.refusal("init"));
            }
        };
        let request = self.init_request(None, keep_prepared);
        self.state = State::Initializing(InitOp {
            attempts: Attempts::start(now, timeout),
            request: request.clone(),
            origin,
        });
        Step::Send(request)
    }

    /// The epoch bump that follows a TV1 abort after a sequence or epoch error (KIP-360). The
    /// transaction is closed by now; `ids` are the ones to bump.
    fn start_bump(&mut self, ids: ProducerIdEpoch, now: Instant, timeout: Duration) -> Step {
        if !self.caps.kip360() {
            let err = ProducerError::Unsupported {
                what: "InitProducerId v3 (KIP-360), needed to recover the producer epoch".into(),
            };
            self.state = State::FatalError {
                ids: Some(ids),
                txn: None,
                cause: Arc::new(err.clone()),
            };
            return Step::Failed(err);
        }
        let request = self.init_request(Some(ids), false);
        self.state = State::Initializing(InitOp {
            attempts: Attempts::start(now, timeout),
            request: request.clone(),
            origin: Origin::AbortableError { ids },
        });
        Step::Send(request)
    }

    // ---------------------------------------------------------------------------------------------
    // begin and the produce path

    /// Opens a transaction. No request: the coordinator learns of it with the first enrolment.
    pub(crate) fn begin(&mut self, now: Instant) -> Result<(), ProducerError> {
        let State::Ready { ids } = self.state else {
            return Err(self.refusal("begin"));
        };
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
        let txn = Txn {
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
        };
        self.state = State::InTransaction {
            ids,
            txn,
            offsets: None,
        };
        Ok(())
    }

    /// The span of the open transaction, for the driver to enter around its requests.
    /// When the operation under way must end: the driver ends an attempt still out at that instant
    /// as unanswered, so no operation overruns its timeout by a request timeout.
    pub(crate) fn op_deadline(&self) -> Option<Instant> {
        self.state.op_deadline()
    }

    pub(crate) fn span(&self) -> Option<&Span> {
        self.state.txn().map(|t| &t.span)
    }

    /// A record for `tp` is being accepted into the transaction. Refuses outside an open, healthy
    /// transaction. Under TV1 a partition seen for the first time is queued for AddPartitionsToTxn.
    pub(crate) fn handle_append(&mut self, tp: &TopicPartition) -> Result<(), ProducerError> {
        let State::InTransaction { txn, .. } = &mut self.state else {
            return Err(self.refusal("send"));
        };
        if txn.tv == TxnVersion::V1 && !txn.partitions.contains(tp) && !txn.adding.contains(tp) {
            txn.pending.insert(tp.clone());
        }
        Ok(())
    }

    /// Whether a batch for `tp` may be sent now: under TV1 only once the coordinator has enrolled the
    /// partition; under TV2 always (Produce v12 enrols it).
    pub(crate) fn can_produce(&self, tp: &TopicPartition) -> bool {
        match &self.state {
            State::InTransaction { txn, .. } => {
                txn.tv == TxnVersion::V2 || txn.partitions.contains(tp)
            }
            _ => false,
        }
    }

    /// A Produce carrying a batch for `tp` is going out. Under TV2 that enrols the partition, so from
    /// here on the transaction must be ended with EndTxn.
    pub(crate) fn handle_produce_sent(&mut self, tp: &TopicPartition) {
        if let Some(t) = self.state.txn_mut() {
            t.reached_broker = true;
            if t.tv == TxnVersion::V2 {
                t.partitions.insert(tp.clone());
            }
        }
    }

    /// TV1: the AddPartitionsToTxn to send now, if partitions wait for enrolment and none is in flight.
    pub(crate) fn poll_add_partitions(&mut self, now: Instant) -> Option<TxnRequest> {
        let State::InTransaction { ids, txn, .. } = &mut self.state else {
            return None;
        };
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
            ids: *ids,
            partitions: txn.adding.iter().cloned().collect(),
        })
    }

    /// When the next AddPartitionsToTxn may go out after a backoff.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.state.txn().and_then(|t| t.add_not_before)
    }

    /// Whether TV1 enrolment is still pending or in flight (a commit must wait for it).
    #[cfg(test)]
    pub(crate) fn enrolment_pending(&self) -> bool {
        self.state
            .txn()
            .is_some_and(|t| !t.pending.is_empty() || !t.adding.is_empty())
    }

    /// The answer to the AddPartitionsToTxn from [`TxnMachine::poll_add_partitions`].
    pub(crate) fn handle_add_partitions(
        &mut self,
        response: TxnResponse,
        now: Instant,
    ) -> AddPartitionsOutcome {
        // The transaction's bookkeeping, in whatever state holds it (an answer may come back after the
        // transaction failed; its enrolments are still recorded).
        let Some(txn) = self.state.txn_mut() else {
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
        // this id for a moment (see `concurrent_delay`).
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
                    if worst.is_none_or(|(w, _)| action.severity() > w.severity()) {
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
        if worst.is_none() {
            if retry.is_empty() {
                txn.add_attempts = 0;
                txn.add_not_before = None;
            } else {
                txn.pending.extend(retry);
                let delay = retry_delay(
                    &self.backoff,
                    Api::AddPartitionsToTxn,
                    busy,
                    txn.add_attempts,
                );
                tracing::debug!(
                    api = Api::AddPartitionsToTxn.name(),
                    delay_ms = delay.as_secs_f64() * 1e3,
                    concurrent_transactions = busy,
                    "enrolment answered \"not now\": retrying"
                );
                txn.add_not_before = Some(now + delay);
                txn.add_attempts += 1;
            }
        }
        if let Some((action, code)) = worst {
            let err = match action {
                Action::Fenced => return self.add_failed(self.fenced(code), true),
                Action::Fatal => self.fatal_refusal(Api::AddPartitionsToTxn, code),
                _ => ProducerError::Broker {
                    api: Api::AddPartitionsToTxn.name(),
                    code,
                    class: super::super::ErrorClass::Abortable,
                },
            };
            let fatal = action == Action::Fatal;
            return self.add_failed(err, fatal);
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
    pub(crate) fn handle_produce_error(&mut self, err: ProducerError, needs_bump: bool) {
        if needs_bump {
            self.bump_after_abort = true;
        }
        if err.is_fatal() {
            self.fail_fatal(err);
        } else if matches!(
            self.state,
            State::InTransaction { .. } | State::AbortableError { .. }
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
        if !matches!(self.state, State::InTransaction { .. }) {
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
        let State::InTransaction {
            ids,
            txn,
            offsets: op,
        } = &mut self.state
        else {
            return Step::Failed(self.refusal("send_offsets"));
        };
        let stage = if txn.tv == TxnVersion::V1 && !txn.groups.contains(group.group_id()) {
            OffsetsStage::AddOffsets
        } else {
            OffsetsStage::Commit
        };
        txn.reached_broker = true;
        let started = OffsetsOp {
            attempts: Attempts::start(now, timeout),
            group: group.clone(),
            offsets,
            stage,
        };
        let request = started.request(&self.transactional_id, *ids, txn.tv);
        *op = Some(started);
        Step::Send(request)
    }

    // ---------------------------------------------------------------------------------------------
    // prepare (two-phase commit)

    /// Prepares the open transaction for an outside decision (KIP-939) and returns its name. No
    /// request: the driver has flushed the transaction (every record acknowledged) first, and the
    /// coordinator holds the transaction open, never timing it out, until EndTxn. Refused unless the
    /// producer is a two-phase one, the transaction is healthy with no `send_offsets` or enrolment under
    /// way, and it runs under TV2 (under TV1 the ids do not name one transaction).
    pub(crate) fn prepare(&mut self) -> Result<ProducerIdEpoch, ProducerError> {
        if !self.two_phase {
            return Err(ProducerError::IllegalState {
                op: "prepare",
                state: "not configured for two-phase commit",
            });
        }
        match self.take_state() {
            State::InTransaction {
                ids,
                txn,
                offsets: None,
            } if txn.pending.is_empty() && txn.adding.is_empty() => {
                if txn.tv != TxnVersion::V2 {
                    self.state = State::InTransaction {
                        ids,
                        txn,
                        offsets: None,
                    };
                    return Err(self.refused_2pc(TwoPhaseCommitRefusal::NeedsTransactionVersion2));
                }
                txn.span.record("outcome", "prepared");
                self.state = State::Prepared {
                    ids,
                    prepared: ids,
                    txn: Some(txn),
                };
                Ok(ids)
            }
            other => {
                self.state = other;
                Err(self.refusal("prepare"))
            }
        }
    }

    /// The name of the prepared transaction, when the machine holds one.
    pub(crate) fn prepared(&self) -> Option<ProducerIdEpoch> {
        match self.state {
            State::Prepared { prepared, .. } => Some(prepared),
            _ => None,
        }
    }

    // ---------------------------------------------------------------------------------------------
    // commit and abort

    /// Starts (or resumes) `commit`. The driver must have flushed the transaction's batches, waited for
    /// every Produce answer and for TV1 enrolment first.
    pub(crate) fn start_commit(&mut self, now: Instant, timeout: Duration) -> Step {
        match self.take_state() {
            State::InTransaction { ids, txn, offsets } => {
                if offsets.is_some() {
                    // send_offsets was dropped mid-way: whether the group fence ran is unknown, and
                    // committing without it would let a stale owner's writes land. Never commit that.
                    self.state = State::InTransaction { ids, txn, offsets };
                    let cause = self.fail_abortable(ProducerError::IllegalState {
                        op: "commit",
                        state: "after an interrupted send_offsets",
                    });
                    return Step::Failed(ProducerError::MustAbort {
                        cause: Arc::new(cause),
                    });
                }
                if !txn.pending.is_empty() || !txn.adding.is_empty() {
                    self.state = State::InTransaction { ids, txn, offsets };
                    return Step::Failed(ProducerError::IllegalState {
                        op: "commit",
                        state: "still enrolling partitions",
                    });
                }
                if !txn.reached_broker {
                    self.state = State::Ready { ids };
                    close_txn(txn, "committed-empty", now);
                    return Step::Done;
                }
                self.start_end(true, false, ids, Some(txn), now, timeout)
            }
            State::Committing { ids, txn, .. } | State::CommitOutcomeUnknown { ids, txn } => {
                self.start_end(true, true, ids, txn, now, timeout)
            }
            State::Prepared { ids, txn, .. } => match txn {
                Some(t) if !t.reached_broker => {
                    close_txn(t, "committed-empty", now);
                    self.state = State::Ready { ids };
                    Step::Done
                }
                txn => self.start_end(true, false, ids, txn, now, timeout),
            },
            other => {
                self.state = other;
                Step::Failed(self.refusal("commit"))
            }
        }
    }

    /// Starts (or resumes) `abort`. The driver must have dropped the transaction's unsent batches and
    /// waited for every Produce in flight to be answered or given up (so no write lands after the
    /// markers).
    pub(crate) fn start_abort(&mut self, now: Instant, timeout: Duration) -> Step {
        match self.take_state() {
            State::InTransaction { ids, txn, .. } => {
                if !txn.reached_broker {
                    close_txn(txn, "aborted-empty", now);
                    return self.after_abort(ids, now, timeout);
                }
                self.start_end(false, false, ids, Some(txn), now, timeout)
            }
            State::AbortableError { ids, txn, .. } => match txn {
                Some(txn) if txn.reached_broker => {
                    self.start_end(false, false, ids, Some(txn), now, timeout)
                }
                txn => {
                    if let Some(t) = txn {
                        close_txn(t, "aborted-empty", now);
                    }
                    self.after_abort(ids, now, timeout)
                }
            },
            State::Aborting { ids, txn, .. } => self.start_end(false, true, ids, txn, now, timeout),
            State::Prepared { ids, txn, .. } => match txn {
                Some(t) if !t.reached_broker => {
                    close_txn(t, "aborted-empty", now);
                    self.after_abort(ids, now, timeout)
                }
                txn => self.start_end(false, false, ids, txn, now, timeout),
            },
            State::Initializing(InitOp {
                origin: Origin::AbortableError { ids },
                ..
            }) => {
                // The bump after an abort was interrupted; resume it.
                self.start_bump(ids, now, timeout)
            }
            other @ (State::Committing { .. } | State::CommitOutcomeUnknown { .. }) => {
                self.state = other;
                Step::Failed(ProducerError::IllegalState {
                    op: "abort",
                    state: "committing (the commit may land: retry commit or re-initialise)",
                })
            }
            other => {
                self.state = other;
                Step::Failed(self.refusal("abort"))
            }
        }
    }

    /// Sends EndTxn for the transaction: the first attempt, or the first of a resumed operation (then
    /// some attempt may have reached the coordinator already: `resumed` marks the outcome in doubt).
    fn start_end(
        &mut self,
        commit: bool,
        resumed: bool,
        ids: ProducerIdEpoch,
        txn: Option<Txn>,
        now: Instant,
        timeout: Duration,
    ) -> Step {
        let end = EndOp {
            attempts: Attempts::start(now, timeout),
            in_doubt: resumed,
            timeout,
        };
        let request = self.end_request(ids, commit, self.tv_of(txn.as_ref()));
        self.state = State::ending(commit, ids, txn, end);
        Step::Send(request)
    }

    fn end_request(&self, ids: ProducerIdEpoch, commit: bool, tv: TxnVersion) -> TxnRequest {
        TxnRequest::EndTxn {
            transactional_id: self.transactional_id.clone(),
            ids,
            commit,
            tv,
        }
    }

    /// After a successful (or skipped) abort: ready, unless TV1 needs the epoch bump first.
    fn after_abort(&mut self, ids: ProducerIdEpoch, now: Instant, timeout: Duration) -> Step {
        if self.bump_after_abort {
            return self.start_bump(ids, now, timeout);
        }
        self.state = State::Ready { ids };
        Step::Done
    }

    // ---------------------------------------------------------------------------------------------
    // answers

    /// Feeds the answer to the last [`Step::Send`] of the operation in progress.
    pub(crate) fn handle_response(&mut self, response: TxnResponse, now: Instant) -> Step {
        match self.take_state() {
            State::Initializing(op) => self.on_init(response, now, op),
            State::InTransaction {
                ids,
                txn,
                offsets: Some(op),
            } => self.on_offsets(response, now, ids, txn, op),
            State::Committing { ids, txn, end } => self.on_end(response, now, true, ids, txn, end),
            State::Aborting { ids, txn, end } => self.on_end(response, now, false, ids, txn, end),
            // The operation was cut short (a fatal error from the produce path, say): report why.
            other => {
                self.state = other;
                Step::Failed(self.refusal("handle_response"))
            }
        }
    }

    /// An answer to InitProducerId: success ends `init`, anything else goes to [`Self::init_failed`].
    fn on_init(&mut self, response: TxnResponse, now: Instant, op: InitOp) -> Step {
        let code = match response {
            TxnResponse::InitProducerId(Ok(ids)) => return self.init_succeeded(ids, None, &op),
            TxnResponse::InitKept { ids, ongoing } if op.keeps_prepared() => {
                return self.init_succeeded(ids, Some(ongoing), &op)
            }
            TxnResponse::InitProducerId(Err(code)) => code,
            TxnResponse::NoAnswer(_) => ErrorCode::RequestTimedOut,
            _ => {
                self.state = State::Initializing(op);
                return self.mismatch("init");
            }
        };
        self.init_failed(code, now, op)
    }

    /// Init step, success: the producer is ready, or holds the predecessor's prepared transaction.
    fn init_succeeded(
        &mut self,
        ids: ProducerIdEpoch,
        kept: Option<ProducerIdEpoch>,
        op: &InitOp,
    ) -> Step {
        // InitProducerId has just bumped the epoch: the bump a broken sequence asked for is done.
        self.bump_after_abort = false;
        match kept {
            Some(prepared) => {
                tracing::info!(
                    transactional_id = %self.transactional_id,
                    producer_id = ids.id,
                    producer_epoch = ids.epoch,
                    prepared = %super::super::PreparedTxn::from(prepared),
                    "producer initialised, keeping the predecessor's prepared transaction"
                );
                self.state = State::Prepared {
                    ids,
                    prepared,
                    txn: None,
                };
            }
            None => {
                tracing::info!(
                    transactional_id = %self.transactional_id,
                    producer_id = ids.id,
                    producer_epoch = ids.epoch,
                    two_phase = op.enables_2pc(),
                    "producer initialised"
                );
                self.state = State::Ready { ids };
            }
        }
        Step::Done
    }

    /// Init step, an error code: a two-phase refusal, a retry, or the end of the producer.
    fn init_failed(&mut self, code: ErrorCode, now: Instant, op: InitOp) -> Step {
        if let Some(refusal) = two_phase_refusal(code, &op) {
            self.state = State::Initializing(op);
            return Step::Failed(self.fail_fatal(self.refused_2pc(refusal)));
        }
        match classify(Api::InitProducerId, code) {
            Action::Retry(refresh) => self.init_not_now(code, refresh, now, op),
            // An abortable answer to InitProducerId leaves nothing to abort: try again.
            Action::Abortable => self.init_not_now(code, Refresh::Nothing, now, op),
            // Success carries ids, so a bare "no error" is not something the driver builds from an
            // answer.
            Action::Ok => {
                self.state = State::Initializing(op);
                self.mismatch("init")
            }
            Action::Fenced => {
                self.state = State::Initializing(op);
                Step::Failed(self.fail_fatal(self.fenced(code)))
            }
            _ => {
                self.state = State::Initializing(op);
                Step::Failed(self.fail_fatal(self.fatal_refusal(Api::InitProducerId, code)))
            }
        }
    }

    /// Init step, "not now": resend, or past the deadline fall back to where the init started.
    fn init_not_now(
        &mut self,
        code: ErrorCode,
        refresh: Refresh,
        now: Instant,
        op: InitOp,
    ) -> Step {
        let busy = code == ErrorCode::ConcurrentTransactions;
        match self.retry_or_timeout(Api::InitProducerId, op.attempts, busy, now) {
            NotNow::TimedOut { elapsed } => {
                self.state = op.origin.timed_out(elapsed, code);
                Step::Failed(ProducerError::Timeout {
                    op: "init",
                    elapsed,
                    class: super::super::ErrorClass::Retriable,
                    last_error: Some(code),
                })
            }
            NotNow::Retry { delay, attempts } => {
                let request = op.request.clone();
                self.state = State::Initializing(InitOp { attempts, ..op });
                retry(code, delay, refresh, request)
            }
        }
    }

    fn on_offsets(
        &mut self,
        response: TxnResponse,
        now: Instant,
        ids: ProducerIdEpoch,
        mut txn: Txn,
        op: OffsetsOp,
    ) -> Step {
        let (api, codes): (Api, Vec<ErrorCode>) = match (op.stage, response) {
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
            _ => {
                self.state = State::InTransaction {
                    ids,
                    txn,
                    offsets: None,
                };
                return self.mismatch("send_offsets");
            }
        };
        // The most severe answer decides (`Action::severity`).
        let mut decided = Action::Ok;
        let mut decided_code = ErrorCode::None;
        // A short retry only if every partition to retry was answered CONCURRENT_TRANSACTIONS.
        let mut busy = true;
        for code in codes {
            let a = classify(api, code);
            if matches!(a, Action::Retry(_)) {
                busy &= code == ErrorCode::ConcurrentTransactions;
            }
            if a.severity() > decided.severity() {
                decided = a;
                decided_code = code;
            }
        }
        // Every outcome but a retry or the step to TxnOffsetCommit ends the operation.
        let mut next_op = None;
        let step = match decided {
            Action::Ok => match op.stage {
                OffsetsStage::AddOffsets => {
                    txn.groups.insert(op.group.group_id().to_owned());
                    let commit = OffsetsOp {
                        attempts: op.attempts.next_request(),
                        stage: OffsetsStage::Commit,
                        ..op
                    };
                    let request = commit.request(&self.transactional_id, ids, txn.tv);
                    next_op = Some(commit);
                    Step::Send(request)
                }
                OffsetsStage::Commit => Step::Done,
            },
            Action::Retry(refresh) => match self.retry_or_timeout(api, op.attempts, busy, now) {
                NotNow::Retry { delay, attempts } => {
                    let again = OffsetsOp { attempts, ..op };
                    let request = again.request(&self.transactional_id, ids, txn.tv);
                    next_op = Some(again);
                    retry(decided_code, delay, refresh, request)
                }
                NotNow::TimedOut { elapsed } => {
                    self.state = State::InTransaction {
                        ids,
                        txn,
                        offsets: None,
                    };
                    return Step::Failed(self.fail_abortable(ProducerError::Timeout {
                        op: "send_offsets",
                        elapsed,
                        class: super::super::ErrorClass::Abortable,
                        last_error: Some(decided_code),
                    }));
                }
            },
            _ => {
                self.state = State::InTransaction {
                    ids,
                    txn,
                    offsets: None,
                };
                return self.offsets_failed(api, decided, decided_code, &op);
            }
        };
        self.state = State::InTransaction {
            ids,
            txn,
            offsets: next_op,
        };
        step
    }

    /// The failure an offsets answer other than success or "not now" ends `send_offsets` with.
    fn offsets_failed(
        &mut self,
        api: Api,
        decided: Action,
        code: ErrorCode,
        op: &OffsetsOp,
    ) -> Step {
        match decided {
            Action::CommitFenced => {
                tracing::warn!(
                    group_id = op.group.group_id(),
                    generation = op.group.generation_id(),
                    code = %code,
                    "offset commit fenced by the group coordinator"
                );
                Step::Failed(self.fail_abortable(ProducerError::CommitFenced {
                    group_id: op.group.group_id().to_owned(),
                    code,
                }))
            }
            Action::Fenced => Step::Failed(self.fail_fatal(self.fenced(code))),
            Action::Abortable => Step::Failed(self.fail_abortable(ProducerError::Broker {
                api: api.name(),
                code,
                class: super::super::ErrorClass::Abortable,
            })),
            _ => Step::Failed(self.fail_fatal(self.fatal_refusal(api, code))),
        }
    }

    fn on_end(
        &mut self,
        response: TxnResponse,
        now: Instant,
        commit: bool,
        ids: ProducerIdEpoch,
        txn: Option<Txn>,
        end: EndOp,
    ) -> Step {
        let (code, next, no_answer) = match response {
            TxnResponse::EndTxn { code, next } => (code, next, None),
            TxnResponse::NoAnswer(reason) => (ErrorCode::RequestTimedOut, None, Some(reason)),
            _ => {
                self.state = State::ending(commit, ids, txn, end);
                return self.mismatch("commit/abort");
            }
        };
        let in_doubt = end.in_doubt || no_answer.is_some();
        match classify(Api::EndTxn, code) {
            Action::Ok => {
                let mut ids = ids;
                if self.tv_of(txn.as_ref()) == TxnVersion::V2 {
                    if let Some(next) = next.filter(|n| n.id >= 0 && n.epoch >= 0) {
                        ids = next;
                    }
                    // EndTxn v5 bumped the epoch: nothing late can land in the next transaction.
                    self.bump_after_abort = false;
                }
                if let Some(t) = txn {
                    close_txn(t, if commit { "committed" } else { "aborted" }, now);
                }
                if commit {
                    self.state = State::Ready { ids };
                    Step::Done
                } else {
                    self.after_abort(ids, now, end.timeout)
                }
            }
            Action::Retry(refresh) => {
                let busy = code == ErrorCode::ConcurrentTransactions;
                match self.retry_or_timeout(Api::EndTxn, end.attempts, busy, now) {
                    NotNow::TimedOut { elapsed } => {
                        if commit && in_doubt {
                            if let Some(t) = &txn {
                                t.span.record("outcome", "unknown");
                            }
                            self.state = State::CommitOutcomeUnknown { ids, txn };
                            return Step::Failed(ProducerError::CommitOutcomeUnknown {
                                transactional_id: self.transactional_id.clone(),
                                reason: no_answer.unwrap_or_else(|| {
                                    format!("no answer to an earlier attempt; last answer {code}")
                                }),
                            });
                        }
                        // Every attempt was answered "not now": nothing was applied. The transaction is
                        // still open at the coordinator; aborting it is safe.
                        let err = ProducerError::Timeout {
                            op: if commit { "commit" } else { "abort" },
                            elapsed,
                            class: super::super::ErrorClass::Abortable,
                            last_error: Some(code),
                        };
                        self.state = State::AbortableError {
                            ids,
                            txn,
                            cause: Arc::new(err.clone()),
                        };
                        Step::Failed(err)
                    }
                    NotNow::Retry { delay, attempts } => {
                        let request = self.end_request(ids, commit, self.tv_of(txn.as_ref()));
                        let end = EndOp {
                            attempts,
                            in_doubt,
                            ..end
                        };
                        self.state = State::ending(commit, ids, txn, end);
                        retry(code, delay, refresh, request)
                    }
                }
            }
            action => {
                self.state = State::ending(commit, ids, txn, end);
                Step::Failed(match action {
                    Action::Fenced => self.fail_fatal(self.fenced(code)),
                    Action::Abortable => self.fail_abortable(ProducerError::Broker {
                        api: Api::EndTxn.name(),
                        code,
                        class: super::super::ErrorClass::Abortable,
                    }),
                    _ => self.fail_fatal(ProducerError::Broker {
                        api: Api::EndTxn.name(),
                        code,
                        class: super::super::ErrorClass::Fatal,
                    }),
                })
            }
        }
    }

    /// Whether an operation is under way (or was interrupted by a dropped future and awaits resumption).
    #[cfg(test)]
    pub(crate) fn op_in_progress(&self) -> bool {
        matches!(
            self.state,
            State::Initializing(_)
                | State::InTransaction {
                    offsets: Some(_),
                    ..
                }
                | State::Committing { .. }
                | State::Aborting { .. }
        )
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

/// A two-phase init refused, said in KIP-939's terms. The broker answers
/// TRANSACTIONAL_ID_AUTHORIZATION_FAILED both for a missing TWO_PHASE_COMMIT ACL and for 2PC switched
/// off on the broker; UNSUPPORTED_VERSION to KeepPreparedTxn (Kafka 4.4.0, always) or to a v6 it does
/// not speak. Without this the caller would read a bare authorisation or version error.
fn two_phase_refusal(code: ErrorCode, op: &InitOp) -> Option<TwoPhaseCommitRefusal> {
    match code {
        ErrorCode::TransactionalIdAuthorizationFailed if op.enables_2pc() => {
            Some(TwoPhaseCommitRefusal::NotAuthorizedOrDisabled)
        }
        ErrorCode::UnsupportedVersion if op.keeps_prepared() => {
            Some(TwoPhaseCommitRefusal::KeepPreparedUnsupported)
        }
        ErrorCode::UnsupportedVersion if op.enables_2pc() => Some(TwoPhaseCommitRefusal::NotSpoken),
        _ => None,
    }
}

/// Records a transaction's end on its span and in the debug log.
fn close_txn(t: Txn, outcome: &'static str, now: Instant) {
    let parts: Vec<String> = t.partitions.iter().map(ToString::to_string).collect();
    t.span.record("partitions", parts.join(",").as_str());
    t.span.record(
        "duration_ms",
        now.saturating_duration_since(t.started_at).as_millis() as u64,
    );
    t.span.record("outcome", outcome);
    tracing::debug!(parent: &t.span, outcome, "transaction ended");
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
