//! Broker-free tests of the transaction state machine: the request sequences of TV1 and TV2, every
//! transition the issue names, and the refusals.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use super::machine::{concurrent_delay, CONCURRENT_RETRY};
use super::version::version_cap;
use super::*;
use crate::net::Backoff;
use crate::producer::classify::Api;
use crate::producer::{
    ErrorClass, OffsetAndMetadata, ProducerError, ProducerIdEpoch, TopicPartition,
};
use crate::wire::ErrorCode;
use crate::GroupMetadata;

const IDS: ProducerIdEpoch = ProducerIdEpoch { id: 1000, epoch: 4 };
const OP: Duration = Duration::from_secs(10);

fn caps(tv: i16) -> BrokerCaps {
    BrokerCaps {
        transaction_version: tv,
        produce: Some(if tv >= 2 { 12 } else { 11 }),
        init_producer_id: Some(5),
        txn_offset_commit: Some(if tv >= 2 { 5 } else { 4 }),
        end_txn: Some(if tv >= 2 { 5 } else { 4 }),
    }
}

fn backoff() -> Backoff {
    Backoff::exponential(Duration::from_millis(100), Duration::from_secs(1))
}

fn machine(tv: i16) -> TxnMachine {
    TxnMachine::new("tx-1", Duration::from_secs(60), backoff(), caps(tv))
}

/// A machine that has completed init.
fn ready(tv: i16, t0: Instant) -> TxnMachine {
    let mut m = machine(tv);
    let step = m.start_init(t0, OP, false);
    assert!(matches!(
        step,
        Step::Send(TxnRequest::InitProducerId { current: None, .. })
    ));
    assert_eq!(
        m.handle_response(TxnResponse::InitProducerId(Ok(IDS)), t0),
        Step::Done
    );
    assert_eq!(m.state(), TransactionState::Ready);
    m
}

fn tp(p: i32) -> TopicPartition {
    TopicPartition::new("out", p)
}

fn group() -> GroupMetadata {
    GroupMetadata::new("g", 5, "m-1", None).unwrap()
}

fn offsets() -> Vec<(TopicPartition, OffsetAndMetadata)> {
    vec![(TopicPartition::new("in", 0), 42.into())]
}

fn sent(step: Step) -> TxnRequest {
    match step {
        Step::Send(r) => r,
        other => panic!("expected a request, got {other:?}"),
    }
}

fn failed(step: Step) -> ProducerError {
    match step {
        Step::Failed(e) => e,
        other => panic!("expected a failure, got {other:?}"),
    }
}

fn end_ok(next: Option<ProducerIdEpoch>) -> TxnResponse {
    TxnResponse::EndTxn {
        code: ErrorCode::None,
        next,
    }
}

// ------------------------------------------------------------------------------------------------
// version negotiation

/// TV2 is chosen only when the broker finalises the transaction.version feature and speaks every request
/// version TV2 needs; either one alone keeps the producer on TV1.
#[test]
fn tv2_needs_the_feature_and_every_request_version() {
    assert_eq!(caps(2).txn_version(), TxnVersion::V2);
    assert_eq!(caps(1).txn_version(), TxnVersion::V1);
    assert_eq!(caps(0).txn_version(), TxnVersion::V1);
    // The feature alone is not enough: a broker lacking one of the versions stays on TV1.
    for strip in 0..3 {
        let mut c = caps(2);
        match strip {
            0 => c.produce = Some(11),
            1 => c.txn_offset_commit = Some(4),
            _ => c.end_txn = Some(4),
        }
        assert_eq!(c.txn_version(), TxnVersion::V1, "strip {strip}");
    }
    // And the versions alone are not enough without the finalised feature.
    let mut c = caps(2);
    c.transaction_version = 1;
    assert_eq!(c.txn_version(), TxnVersion::V1);
}

/// Under TV1 the versions that mean "TV2" must never be used inside a transaction.
#[test]
fn version_caps_per_transaction_version() {
    assert_eq!(version_cap(Api::Produce, TxnVersion::V1), 11);
    assert_eq!(version_cap(Api::TxnOffsetCommit, TxnVersion::V1), 4);
    assert_eq!(version_cap(Api::EndTxn, TxnVersion::V1), 4);
    assert_eq!(version_cap(Api::AddPartitionsToTxn, TxnVersion::V1), 3);
    assert_eq!(version_cap(Api::AddPartitionsToTxn, TxnVersion::V2), 3);
    assert!(version_cap(Api::Produce, TxnVersion::V2) >= 12);
    assert_eq!(version_cap(Api::TxnOffsetCommit, TxnVersion::V2), 5);
    assert_eq!(version_cap(Api::EndTxn, TxnVersion::V2), 5);
}

// ------------------------------------------------------------------------------------------------
// init

/// Init retries a loading, moved, busy or silent coordinator with a doubling backoff, refreshing the
/// coordinator only when told it moved, and still ends Ready with the granted ids.
#[test]
fn init_retries_busy_coordinators_then_succeeds() {
    let t0 = Instant::now();
    let mut m = machine(2);
    let req = sent(m.start_init(t0, OP, false));
    assert_eq!(req.coordinator(), Coordinator::Transaction("tx-1".into()));
    assert_eq!(
        req,
        TxnRequest::InitProducerId {
            transactional_id: "tx-1".into(),
            timeout_ms: 60_000,
            current: None,
            enable_2pc: false,
            keep_prepared: false,
        }
    );
    assert_eq!(m.state(), TransactionState::Initializing);
    let step = m.handle_response(
        TxnResponse::InitProducerId(Err(ErrorCode::CoordinatorLoadInProgress)),
        t0,
    );
    assert_eq!(
        step,
        Step::Backoff {
            delay: Duration::from_millis(100),
            refresh: false,
            request: req.clone()
        }
    );
    let step = m.handle_response(
        TxnResponse::InitProducerId(Err(ErrorCode::NotCoordinator)),
        t0,
    );
    assert_eq!(
        step,
        Step::Backoff {
            delay: Duration::from_millis(200),
            refresh: true,
            request: req.clone()
        }
    );
    let step = m.handle_response(
        TxnResponse::InitProducerId(Err(ErrorCode::ConcurrentTransactions)),
        t0,
    );
    assert!(matches!(step, Step::Backoff { refresh: false, .. }));
    assert_eq!(
        m.handle_response(TxnResponse::NoAnswer("eof".into()), t0),
        Step::Backoff {
            delay: Duration::from_millis(800),
            refresh: false,
            request: req
        }
    );
    assert_eq!(
        m.handle_response(TxnResponse::InitProducerId(Ok(IDS)), t0),
        Step::Done
    );
    assert_eq!(m.state(), TransactionState::Ready);
    assert_eq!(m.ids(), Some(IDS));
}

/// An init that runs out of time fails retriable and leaves the producer uninitialised, so init can be
/// called again.
#[test]
fn init_gives_up_at_its_deadline_and_can_be_called_again() {
    let t0 = Instant::now();
    let mut m = machine(2);
    sent(m.start_init(t0, OP, false));
    let err = failed(m.handle_response(
        TxnResponse::InitProducerId(Err(ErrorCode::CoordinatorNotAvailable)),
        t0 + OP,
    ));
    assert!(err.is_retriable(), "{err}");
    assert_eq!(m.state(), TransactionState::Uninitialized);
    sent(m.start_init(t0 + OP, OP, false));
}

/// A fenced, unauthorised or invalid-timeout answer to init is fatal and terminal: every later call is
/// refused as defunct.
#[test]
fn init_fenced_or_unauthorised_is_fatal() {
    let t0 = Instant::now();
    for code in [
        ErrorCode::ProducerFenced,
        ErrorCode::TransactionalIdAuthorizationFailed,
        ErrorCode::ClusterAuthorizationFailed,
        ErrorCode::InvalidTransactionTimeout,
    ] {
        let mut m = machine(2);
        sent(m.start_init(t0, OP, false));
        let err = failed(m.handle_response(TxnResponse::InitProducerId(Err(code)), t0));
        assert!(err.is_fatal(), "{code}: {err}");
        if code == ErrorCode::TransactionalIdAuthorizationFailed {
            // The operator must learn which ACL is missing: the error names the transactional id.
            assert!(
                matches!(&err, ProducerError::NotAuthorized { resource, .. } if resource.contains("transactional id")),
                "{err}"
            );
        }
        assert_eq!(m.state(), TransactionState::FatalError);
        let again = m.begin(t0).unwrap_err();
        assert!(matches!(again, ProducerError::Defunct { .. }), "{again}");
        assert!(again.is_fatal());
    }
}

/// init is cancel-safe: a dropped init resumes by sending InitProducerId again.
#[test]
fn interrupted_init_resumes() {
    let t0 = Instant::now();
    let mut m = machine(1);
    let first = sent(m.start_init(t0, OP, false));
    // The future was dropped here; no answer was fed.
    assert!(m.op_in_progress());
    assert_eq!(sent(m.start_init(t0, OP, false)), first);
    assert_eq!(
        m.handle_response(TxnResponse::InitProducerId(Ok(IDS)), t0),
        Step::Done
    );
}

// ------------------------------------------------------------------------------------------------
// refusals

/// A call the current state does not allow is refused, and the refusal leaves the state unchanged.
#[test]
fn illegal_transitions_are_refused_without_changing_state() {
    let t0 = Instant::now();
    let mut m = machine(2);
    assert!(matches!(
        m.begin(t0),
        Err(ProducerError::IllegalState { op: "begin", .. })
    ));
    assert_eq!(failed(m.start_commit(t0, OP)).class(), ErrorClass::Refused);
    assert_eq!(failed(m.start_abort(t0, OP)).class(), ErrorClass::Refused);
    assert_eq!(m.state(), TransactionState::Uninitialized);

    let mut m = ready(2, t0);
    assert!(
        m.handle_append(&tp(0)).is_err(),
        "send outside a transaction"
    );
    assert_eq!(
        failed(m.start_send_offsets(&group(), offsets(), t0, OP)).class(),
        ErrorClass::Refused
    );
    assert_eq!(failed(m.start_commit(t0, OP)).class(), ErrorClass::Refused);
    assert_eq!(failed(m.start_abort(t0, OP)).class(), ErrorClass::Refused);
    assert_eq!(
        failed(m.start_init(t0, OP, false)).class(),
        ErrorClass::Refused
    );
    m.begin(t0).unwrap();
    assert!(m.begin(t0).is_err(), "begin twice");
    assert_eq!(m.state(), TransactionState::InTransaction);
}

// ------------------------------------------------------------------------------------------------
// TV1

/// TV1: AddPartitionsToTxn before the first produce to a partition, AddOffsetsToTxn then
/// TxnOffsetCommit (v4 at most), EndTxn (v4 at most); the ids survive the commit.
#[test]
fn tv1_request_sequence() {
    let t0 = Instant::now();
    let mut m = ready(1, t0);
    m.begin(t0).unwrap();
    m.handle_append(&tp(0)).unwrap();
    m.handle_append(&tp(1)).unwrap();
    m.handle_append(&tp(0)).unwrap();
    assert!(!m.can_produce(&tp(0)), "not enrolled yet");
    let add = m.poll_add_partitions(t0).expect("enrolment request");
    assert_eq!(
        add,
        TxnRequest::AddPartitions {
            transactional_id: "tx-1".into(),
            ids: IDS,
            partitions: vec![tp(0), tp(1)]
        }
    );
    assert_eq!(add.max_version(), 3);
    assert!(
        m.poll_add_partitions(t0).is_none(),
        "one in flight at a time"
    );
    // A partition appearing while the first request is in flight waits for the next one.
    m.handle_append(&tp(2)).unwrap();
    let out = m.handle_add_partitions(
        TxnResponse::AddPartitions(vec![(tp(0), ErrorCode::None), (tp(1), ErrorCode::None)]),
        t0,
    );
    assert!(out.error.is_none());
    assert!(m.can_produce(&tp(0)) && m.can_produce(&tp(1)));
    assert!(!m.can_produce(&tp(2)));
    let add2 = m.poll_add_partitions(t0).unwrap();
    assert!(
        matches!(add2, TxnRequest::AddPartitions { ref partitions, .. } if partitions == &vec![tp(2)])
    );
    m.handle_add_partitions(
        TxnResponse::AddPartitions(vec![(tp(2), ErrorCode::None)]),
        t0,
    );
    assert!(!m.enrolment_pending());

    let req = sent(m.start_send_offsets(&group(), offsets(), t0, OP));
    assert_eq!(
        req,
        TxnRequest::AddOffsets {
            transactional_id: "tx-1".into(),
            ids: IDS,
            group_id: "g".into()
        }
    );
    let req = sent(m.handle_response(TxnResponse::AddOffsets(ErrorCode::None), t0));
    assert!(matches!(
        req,
        TxnRequest::TxnOffsetCommit {
            tv: TxnVersion::V1,
            ..
        }
    ));
    assert_eq!(req.max_version(), 4);
    assert_eq!(req.coordinator(), Coordinator::Group("g".into()));
    assert_eq!(
        m.handle_response(
            TxnResponse::TxnOffsetCommit(vec![(TopicPartition::new("in", 0), ErrorCode::None)]),
            t0
        ),
        Step::Done
    );
    // A second send_offsets for the same group needs no second AddOffsetsToTxn.
    let again = sent(m.start_send_offsets(&group(), offsets(), t0, OP));
    assert!(matches!(again, TxnRequest::TxnOffsetCommit { .. }));
    m.handle_response(TxnResponse::TxnOffsetCommit(vec![]), t0);

    let end = sent(m.start_commit(t0, OP));
    assert_eq!(
        end,
        TxnRequest::EndTxn {
            transactional_id: "tx-1".into(),
            ids: IDS,
            commit: true,
            tv: TxnVersion::V1
        }
    );
    assert_eq!(end.max_version(), 4);
    assert_eq!(m.state(), TransactionState::Committing);
    // A TV1 EndTxn answer carries no ids (v4 and below); even if one did, TV1 keeps its epoch.
    assert_eq!(
        m.handle_response(end_ok(Some(ProducerIdEpoch { id: 1, epoch: 1 })), t0),
        Step::Done
    );
    assert_eq!(m.state(), TransactionState::Ready);
    assert_eq!(m.ids(), Some(IDS));
}

/// Under TV1 a partition left unenrolled by a retriable or missing answer is re-sent after the backoff,
/// while an authorisation failure makes the transaction abortable and stops further sends.
#[test]
fn tv1_add_partitions_retries_and_errors() {
    let t0 = Instant::now();
    let mut m = ready(1, t0);
    m.begin(t0).unwrap();
    m.handle_append(&tp(0)).unwrap();
    m.handle_append(&tp(1)).unwrap();
    m.poll_add_partitions(t0).unwrap();
    let out = m.handle_add_partitions(
        TxnResponse::AddPartitions(vec![
            (tp(0), ErrorCode::None),
            (tp(1), ErrorCode::NotCoordinator),
        ]),
        t0,
    );
    assert!(out.refresh_coordinator && out.error.is_none());
    assert!(m.can_produce(&tp(0)));
    assert!(m.enrolment_pending());
    // Backed off: not before the delay.
    assert!(m.poll_add_partitions(t0).is_none());
    let at = m.poll_timeout().unwrap();
    assert_eq!(at, t0 + Duration::from_millis(100));
    let retry = m.poll_add_partitions(at).unwrap();
    assert!(
        matches!(retry, TxnRequest::AddPartitions { ref partitions, .. } if partitions == &vec![tp(1)])
    );
    // No answer at all: retried like a transient error.
    let out = m.handle_add_partitions(TxnResponse::NoAnswer("timeout".into()), at);
    assert!(out.error.is_none());
    assert!(m.enrolment_pending());
    let later = m.poll_timeout().unwrap();
    m.poll_add_partitions(later).unwrap();
    // One partition not authorised, the other not attempted: the transaction is abortable.
    let out = m.handle_add_partitions(
        TxnResponse::AddPartitions(vec![
            (tp(1), ErrorCode::TopicAuthorizationFailed),
            (tp(3), ErrorCode::OperationNotAttempted),
        ]),
        later,
    );
    assert!(out.error.as_ref().is_some_and(ProducerError::is_abortable));
    assert_eq!(m.state(), TransactionState::AbortableError);
    assert!(!m.can_produce(&tp(0)));
    let refused = m.handle_append(&tp(0)).unwrap_err();
    assert!(matches!(refused, ProducerError::MustAbort { .. }));
}

/// CONCURRENT_TRANSACTIONS on an enrolment is retried on the short doubling schedule, first
/// enrolment or not; any other retriable answer in the same response gets the ordinary backoff.
#[test]
fn tv1_enrolment_answered_concurrent_transactions_retries_quickly() {
    let t0 = Instant::now();
    let slow = Backoff::exponential(Duration::from_millis(500), Duration::from_secs(1));
    let mut m = TxnMachine::new("tx-1", Duration::from_secs(60), slow, caps(1));
    sent(m.start_init(t0, OP, false));
    m.handle_response(TxnResponse::InitProducerId(Ok(IDS)), t0);
    m.begin(t0).unwrap();
    m.handle_append(&tp(0)).unwrap();
    m.poll_add_partitions(t0).unwrap();
    let busy = |p| TxnResponse::AddPartitions(vec![(tp(p), ErrorCode::ConcurrentTransactions)]);
    m.handle_add_partitions(busy(0), t0);
    assert_eq!(m.poll_timeout(), Some(t0 + CONCURRENT_RETRY));
    let t1 = t0 + CONCURRENT_RETRY;
    assert!(m
        .poll_add_partitions(t1 - Duration::from_micros(1))
        .is_none());
    m.poll_add_partitions(t1).unwrap();
    m.handle_add_partitions(busy(0), t1);
    assert_eq!(
        m.poll_timeout(),
        Some(t1 + CONCURRENT_RETRY),
        "the short delay holds for the first retries"
    );
    let t2 = t1 + CONCURRENT_RETRY;
    m.poll_add_partitions(t2).unwrap();
    m.handle_add_partitions(
        TxnResponse::AddPartitions(vec![(tp(0), ErrorCode::None)]),
        t2,
    );
    // A later enrolment answered so (an AddOffsetsToTxn's log append in progress) is just as short.
    m.handle_append(&tp(1)).unwrap();
    m.poll_add_partitions(t2).unwrap();
    m.handle_add_partitions(busy(1), t2);
    assert_eq!(m.poll_timeout(), Some(t2 + CONCURRENT_RETRY));
    let t3 = t2 + CONCURRENT_RETRY;
    m.handle_append(&tp(2)).unwrap();
    m.poll_add_partitions(t3).unwrap();
    m.handle_add_partitions(
        TxnResponse::AddPartitions(vec![
            (tp(1), ErrorCode::ConcurrentTransactions),
            (tp(2), ErrorCode::CoordinatorLoadInProgress),
        ]),
        t3,
    );
    assert_eq!(
        m.poll_timeout(),
        Some(t3 + Duration::from_secs(1)),
        "a loading coordinator gets the ordinary backoff (attempt 1: 500 ms doubled)"
    );
}

/// The short schedule stays at CONCURRENT_RETRY for the flat attempts, then doubles, and never exceeds
/// the ordinary delay.
#[test]
fn concurrent_delay_doubles_from_the_short_base_under_the_ordinary_delay() {
    let b = backoff();
    let expected = [
        2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000, 1000,
    ];
    for (attempt, ms) in expected.into_iter().enumerate() {
        assert_eq!(
            concurrent_delay(&b, attempt as u32),
            Duration::from_millis(ms),
            "attempt {attempt}"
        );
    }
    let tiny = Backoff::exponential(Duration::from_millis(1), Duration::from_millis(3));
    assert_eq!(concurrent_delay(&tiny, 0), Duration::from_millis(1));
    assert_eq!(concurrent_delay(&tiny, 5), Duration::from_millis(2));
    assert_eq!(concurrent_delay(&tiny, 12), Duration::from_millis(3));
}

/// The offset commit that opens a transaction races the previous transaction's markers: under TV1 its
/// AddOffsetsToTxn, under TV2 the TxnOffsetCommit itself is answered CONCURRENT_TRANSACTIONS. Neither
/// may wait the ordinary 100 ms (the Java client does, and it is most of a small transaction's time).
#[test]
fn offsets_answered_concurrent_transactions_retry_quickly() {
    let t0 = Instant::now();
    let busy = |p: i32| {
        (
            TopicPartition::new("in", p),
            ErrorCode::ConcurrentTransactions,
        )
    };
    for tv in [1, 2] {
        let mut m = ready(tv, t0);
        m.begin(t0).unwrap();
        let first = sent(m.start_send_offsets(&group(), offsets(), t0, OP));
        let answer = if tv == 1 {
            assert!(matches!(first, TxnRequest::AddOffsets { .. }), "TV{tv}");
            TxnResponse::AddOffsets(ErrorCode::ConcurrentTransactions)
        } else {
            assert!(
                matches!(first, TxnRequest::TxnOffsetCommit { .. }),
                "TV{tv}"
            );
            TxnResponse::TxnOffsetCommit(vec![busy(0)])
        };
        for attempt in 0..3 {
            assert_eq!(
                m.handle_response(answer.clone(), t0),
                Step::Backoff {
                    delay: CONCURRENT_RETRY,
                    refresh: false,
                    request: first.clone()
                },
                "TV{tv} attempt {attempt}"
            );
        }
    }
    // A TxnOffsetCommit with another retriable answer beside it waits the ordinary delay.
    let mut m = ready(2, t0);
    m.begin(t0).unwrap();
    let req = sent(m.start_send_offsets(&group(), offsets(), t0, OP));
    let mixed = TxnResponse::TxnOffsetCommit(vec![
        busy(0),
        (
            TopicPartition::new("in", 1),
            ErrorCode::CoordinatorLoadInProgress,
        ),
    ]);
    assert_eq!(
        m.handle_response(mixed, t0),
        Step::Backoff {
            delay: Duration::from_millis(100),
            refresh: false,
            request: req
        }
    );
}

/// EndTxn and InitProducerId answered CONCURRENT_TRANSACTIONS (a state change of the id in progress)
/// also retry on the short schedule; a loading coordinator still gets the ordinary one.
#[test]
fn end_and_init_answered_concurrent_transactions_retry_quickly() {
    let t0 = Instant::now();
    let mut m = ready(1, t0);
    m.begin(t0).unwrap();
    m.handle_produce_sent(&tp(0));
    let end = sent(m.start_commit(t0, OP));
    let busy = TxnResponse::EndTxn {
        code: ErrorCode::ConcurrentTransactions,
        next: None,
    };
    assert_eq!(
        m.handle_response(busy, t0),
        Step::Backoff {
            delay: CONCURRENT_RETRY,
            refresh: false,
            request: end.clone()
        }
    );
    let loading = TxnResponse::EndTxn {
        code: ErrorCode::CoordinatorLoadInProgress,
        next: None,
    };
    assert_eq!(
        m.handle_response(loading, t0),
        Step::Backoff {
            delay: Duration::from_millis(200),
            refresh: false,
            request: end
        }
    );

    let mut m = machine(1);
    let init = sent(m.start_init(t0, OP, false));
    assert_eq!(
        m.handle_response(
            TxnResponse::InitProducerId(Err(ErrorCode::ConcurrentTransactions)),
            t0
        ),
        Step::Backoff {
            delay: CONCURRENT_RETRY,
            refresh: false,
            request: init
        }
    );
}

/// A TV1 enrolment answered with a fenced epoch is fatal.
#[test]
fn tv1_add_partitions_fenced_is_fatal() {
    let t0 = Instant::now();
    let mut m = ready(1, t0);
    m.begin(t0).unwrap();
    m.handle_append(&tp(0)).unwrap();
    m.poll_add_partitions(t0).unwrap();
    let out = m.handle_add_partitions(
        TxnResponse::AddPartitions(vec![(tp(0), ErrorCode::InvalidProducerEpoch)]),
        t0,
    );
    let err = out.error.unwrap();
    assert!(matches!(err, ProducerError::Fenced { .. }), "{err}");
    assert_eq!(m.state(), TransactionState::FatalError);
}

// ------------------------------------------------------------------------------------------------
// TV2

/// TV2: no AddPartitionsToTxn (Produce v12 enrols), TxnOffsetCommit v5 with no AddOffsetsToTxn, EndTxn
/// v5 whose answer's id and epoch the producer adopts.
#[test]
fn tv2_request_sequence_and_epoch_adoption() {
    let t0 = Instant::now();
    let mut m = ready(2, t0);
    m.begin(t0).unwrap();
    m.handle_append(&tp(0)).unwrap();
    assert!(
        m.can_produce(&tp(0)),
        "Produce v12 enrols the partition itself"
    );
    assert!(m.poll_add_partitions(t0).is_none());
    m.handle_produce_sent(&tp(0));
    let req = sent(m.start_send_offsets(&group(), offsets(), t0, OP));
    assert!(matches!(
        req,
        TxnRequest::TxnOffsetCommit {
            tv: TxnVersion::V2,
            ..
        }
    ));
    assert_eq!(req.max_version(), 5);
    assert_eq!(
        m.handle_response(TxnResponse::TxnOffsetCommit(vec![]), t0),
        Step::Done
    );
    let end = sent(m.start_commit(t0, OP));
    assert!(matches!(
        end,
        TxnRequest::EndTxn {
            tv: TxnVersion::V2,
            commit: true,
            ids: IDS,
            ..
        }
    ));
    assert_eq!(end.max_version(), 5);
    let next = ProducerIdEpoch {
        id: IDS.id,
        epoch: IDS.epoch + 1,
    };
    assert_eq!(m.handle_response(end_ok(Some(next)), t0), Step::Done);
    assert_eq!(m.ids(), Some(next), "the bumped epoch is adopted");
    // The next transaction runs under it.
    m.begin(t0).unwrap();
    m.handle_produce_sent(&tp(0));
    let end = sent(m.start_commit(t0, OP));
    assert!(matches!(end, TxnRequest::EndTxn { ids, .. } if ids == next));
    // Epoch exhausted: the coordinator hands out a new producer id at epoch 0.
    let fresh = ProducerIdEpoch { id: 2000, epoch: 0 };
    m.handle_response(end_ok(Some(fresh)), t0);
    assert_eq!(m.ids(), Some(fresh));
}

/// An offsets-only transaction reached the coordinator and must be ended.
#[test]
fn tv2_offsets_only_transaction_is_ended() {
    let t0 = Instant::now();
    let mut m = ready(2, t0);
    m.begin(t0).unwrap();
    sent(m.start_send_offsets(&group(), offsets(), t0, OP));
    m.handle_response(TxnResponse::TxnOffsetCommit(vec![]), t0);
    assert!(matches!(
        sent(m.start_commit(t0, OP)),
        TxnRequest::EndTxn { .. }
    ));
}

/// With nothing sent, EndTxn is skipped: the coordinator never heard of the transaction.
#[test]
fn empty_transactions_skip_end_txn() {
    let t0 = Instant::now();
    for tv in [1, 2] {
        let mut m = ready(tv, t0);
        m.begin(t0).unwrap();
        assert_eq!(m.start_commit(t0, OP), Step::Done, "tv{tv} commit");
        assert_eq!(m.state(), TransactionState::Ready);
        m.begin(t0).unwrap();
        assert_eq!(m.start_abort(t0, OP), Step::Done, "tv{tv} abort");
        assert_eq!(m.state(), TransactionState::Ready);
        assert_eq!(m.ids(), Some(IDS));
        // Empty offsets do not count as reaching the broker.
        m.begin(t0).unwrap();
        assert_eq!(m.start_send_offsets(&group(), vec![], t0, OP), Step::Done);
        assert_eq!(m.start_commit(t0, OP), Step::Done);
    }
}

/// Under TV1 an AddPartitionsToTxn that went out means the coordinator may know the transaction.
#[test]
fn tv1_enrolment_sent_means_end_txn_is_needed() {
    let t0 = Instant::now();
    let mut m = ready(1, t0);
    m.begin(t0).unwrap();
    m.handle_append(&tp(0)).unwrap();
    m.poll_add_partitions(t0).unwrap();
    m.handle_add_partitions(TxnResponse::NoAnswer("lost".into()), t0);
    // The partition could not be enrolled; abort still has to tell the coordinator.
    assert!(matches!(
        sent(m.start_abort(t0, OP)),
        TxnRequest::EndTxn { commit: false, .. }
    ));
}

/// Under TV1 commit is refused while a partition is still waiting for enrolment, and the transaction
/// stays open.
#[test]
fn commit_waits_for_enrolment() {
    let t0 = Instant::now();
    let mut m = ready(1, t0);
    m.begin(t0).unwrap();
    m.handle_append(&tp(0)).unwrap();
    let err = failed(m.start_commit(t0, OP));
    assert_eq!(err.class(), ErrorClass::Refused);
    assert_eq!(m.state(), TransactionState::InTransaction);
}

// ------------------------------------------------------------------------------------------------
// outcome unknown

/// A commit that is never answered ends outcome-unknown; abort is refused; commit can be retried and
/// init re-initialises.
#[test]
fn unanswered_commit_is_outcome_unknown_and_never_aborted() {
    let t0 = Instant::now();
    let mut m = ready(2, t0);
    m.begin(t0).unwrap();
    m.handle_produce_sent(&tp(0));
    let end = sent(m.start_commit(t0, OP));
    let step = m.handle_response(TxnResponse::NoAnswer("request timed out".into()), t0);
    assert_eq!(
        step,
        Step::Backoff {
            delay: Duration::from_millis(100),
            refresh: false,
            request: end.clone()
        }
    );
    // A later attempt is answered "try again" but the first one's fate is still unknown.
    let err = failed(m.handle_response(
        TxnResponse::EndTxn {
            code: ErrorCode::CoordinatorLoadInProgress,
            next: None,
        },
        t0 + OP,
    ));
    assert!(err.is_outcome_unknown(), "{err}");
    assert!(!err.is_abortable());
    assert_eq!(m.state(), TransactionState::CommitOutcomeUnknown);

    let refused = failed(m.start_abort(t0 + OP, OP));
    assert!(matches!(
        refused,
        ProducerError::IllegalState { op: "abort", .. }
    ));
    assert!(m.begin(t0 + OP).is_err());
    assert!(m.handle_append(&tp(0)).is_err());

    // Retrying the commit resends the same EndTxn (same ids: the coordinator recognises the retry).
    assert_eq!(sent(m.start_commit(t0 + OP, OP)), end);
    assert_eq!(m.handle_response(end_ok(None), t0 + OP), Step::Done);
    assert_eq!(m.state(), TransactionState::Ready);
}

/// After a commit whose outcome is unknown, init re-initialises from scratch and adopts the new epoch.
#[test]
fn reinit_after_unknown_commit() {
    let t0 = Instant::now();
    let mut m = ready(1, t0);
    m.begin(t0).unwrap();
    m.handle_produce_sent(&tp(0));
    sent(m.start_commit(t0, OP));
    let err = failed(m.handle_response(TxnResponse::NoAnswer("eof".into()), t0 + OP));
    assert!(err.is_outcome_unknown());
    let req = sent(m.start_init(t0 + OP, OP, false));
    assert!(matches!(
        req,
        TxnRequest::InitProducerId { current: None, .. }
    ));
    let new = ProducerIdEpoch {
        id: IDS.id,
        epoch: IDS.epoch + 1,
    };
    m.handle_response(TxnResponse::InitProducerId(Ok(new)), t0 + OP);
    assert_eq!(m.state(), TransactionState::Ready);
    assert_eq!(m.ids(), Some(new));
}

/// Every attempt answered "not now" means nothing was applied: abortable, not unknown.
#[test]
fn commit_refused_until_deadline_is_abortable() {
    let t0 = Instant::now();
    let mut m = ready(1, t0);
    m.begin(t0).unwrap();
    m.handle_produce_sent(&tp(0));
    sent(m.start_commit(t0, OP));
    let busy = TxnResponse::EndTxn {
        code: ErrorCode::ConcurrentTransactions,
        next: None,
    };
    assert!(matches!(
        m.handle_response(busy.clone(), t0),
        Step::Backoff { .. }
    ));
    let err = failed(m.handle_response(busy, t0 + OP));
    assert!(err.is_abortable(), "{err}");
    assert_eq!(m.state(), TransactionState::AbortableError);
    assert!(matches!(
        sent(m.start_abort(t0 + OP, OP)),
        TxnRequest::EndTxn { commit: false, .. }
    ));
}

/// commit is resumable after its future is dropped, and a resumed commit is in doubt: the dropped
/// attempt may have reached the coordinator.
#[test]
fn interrupted_commit_resumes_in_doubt() {
    let t0 = Instant::now();
    let mut m = ready(2, t0);
    m.begin(t0).unwrap();
    m.handle_produce_sent(&tp(0));
    let end = sent(m.start_commit(t0, OP));
    // Dropped. Abort is refused: the commit may land.
    assert!(failed(m.start_abort(t0, OP)).class() == ErrorClass::Refused);
    assert_eq!(sent(m.start_commit(t0, OP)), end);
    let err = failed(m.handle_response(
        TxnResponse::EndTxn {
            code: ErrorCode::NotCoordinator,
            next: None,
        },
        t0 + OP,
    ));
    assert!(err.is_outcome_unknown(), "{err}");
}

/// An EndTxn answered with a fenced or invalid epoch is fatal.
#[test]
fn end_txn_fenced_is_fatal() {
    let t0 = Instant::now();
    for code in [ErrorCode::ProducerFenced, ErrorCode::InvalidProducerEpoch] {
        let mut m = ready(1, t0);
        m.begin(t0).unwrap();
        m.handle_produce_sent(&tp(0));
        sent(m.start_commit(t0, OP));
        let err = failed(m.handle_response(TxnResponse::EndTxn { code, next: None }, t0));
        assert!(matches!(err, ProducerError::Fenced { .. }), "{err}");
        assert_eq!(m.state(), TransactionState::FatalError);
    }
}

// ------------------------------------------------------------------------------------------------
// KIP-447

/// A stale generation, an unknown member or a fenced static instance rejects the offset commit: the
/// caller gets a commit-fenced, abortable error and the transaction can only be aborted.
#[test]
fn fenced_offset_commit_is_abortable_and_blocks_commit() {
    let t0 = Instant::now();
    for tv in [1, 2] {
        for code in [
            ErrorCode::IllegalGeneration,
            ErrorCode::UnknownMemberId,
            ErrorCode::FencedInstanceId,
        ] {
            let mut m = ready(tv, t0);
            m.begin(t0).unwrap();
            m.handle_produce_sent(&tp(0));
            let mut req = sent(m.start_send_offsets(&group(), offsets(), t0, OP));
            if matches!(req, TxnRequest::AddOffsets { .. }) {
                req = sent(m.handle_response(TxnResponse::AddOffsets(ErrorCode::None), t0));
            }
            let TxnRequest::TxnOffsetCommit { group: g, .. } = &req else {
                panic!("expected TxnOffsetCommit, got {req:?}");
            };
            assert_eq!(g.generation_id(), 5);
            let err = failed(m.handle_response(
                TxnResponse::TxnOffsetCommit(vec![(TopicPartition::new("in", 0), code)]),
                t0,
            ));
            assert!(
                err.is_commit_fenced() && err.is_abortable(),
                "{code}: {err}"
            );
            assert_eq!(m.state(), TransactionState::AbortableError);
            let refused = failed(m.start_commit(t0, OP));
            assert!(
                refused.is_commit_fenced(),
                "commit refused with the fence as cause"
            );
            let abort = sent(m.start_abort(t0, OP));
            assert!(matches!(abort, TxnRequest::EndTxn { commit: false, .. }));
            m.handle_response(end_ok(None), t0);
            assert_eq!(m.state(), TransactionState::Ready, "tv{tv} {code}");
        }
    }
}

/// A TxnOffsetCommit whose group coordinator moved is retried after a refresh, and when the answers
/// differ the worst one decides: a fence among retriable answers is a fence.
#[test]
fn offset_commit_retries_coordinator_moves() {
    let t0 = Instant::now();
    let mut m = ready(2, t0);
    m.begin(t0).unwrap();
    let req = sent(m.start_send_offsets(&group(), offsets(), t0, OP));
    let step = m.handle_response(
        TxnResponse::TxnOffsetCommit(vec![(
            TopicPartition::new("in", 0),
            ErrorCode::NotCoordinator,
        )]),
        t0,
    );
    assert_eq!(
        step,
        Step::Backoff {
            delay: Duration::from_millis(100),
            refresh: true,
            request: req
        }
    );
    // The worst answer decides: a fence among retriable answers is a fence.
    let err = failed(m.handle_response(
        TxnResponse::TxnOffsetCommit(vec![
            (
                TopicPartition::new("in", 0),
                ErrorCode::CoordinatorLoadInProgress,
            ),
            (TopicPartition::new("in", 1), ErrorCode::IllegalGeneration),
        ]),
        t0,
    ));
    assert!(err.is_commit_fenced());
}

/// send_offsets dropped mid-way: the fence's outcome is unknown, so the transaction must not commit.
#[test]
fn commit_after_interrupted_send_offsets_is_refused() {
    let t0 = Instant::now();
    let mut m = ready(2, t0);
    m.begin(t0).unwrap();
    m.handle_produce_sent(&tp(0));
    sent(m.start_send_offsets(&group(), offsets(), t0, OP));
    // Dropped before the answer.
    let err = failed(m.start_commit(t0, OP));
    assert!(err.is_abortable(), "{err}");
    assert_eq!(m.state(), TransactionState::AbortableError);
    assert!(matches!(
        sent(m.start_abort(t0, OP)),
        TxnRequest::EndTxn { commit: false, .. }
    ));
}

/// A broker without KIP-447 TxnOffsetCommit (v3 and up) cannot fence zombies, so send_offsets is refused
/// as unsupported and fatal.
#[test]
fn offset_commit_needs_kip447() {
    let t0 = Instant::now();
    let mut m = machine(1);
    m.set_caps(BrokerCaps {
        txn_offset_commit: Some(2),
        ..caps(1)
    });
    sent(m.start_init(t0, OP, false));
    m.handle_response(TxnResponse::InitProducerId(Ok(IDS)), t0);
    m.begin(t0).unwrap();
    let err = failed(m.start_send_offsets(&group(), offsets(), t0, OP));
    assert!(matches!(err, ProducerError::Unsupported { .. }) && err.is_fatal());
}

// ------------------------------------------------------------------------------------------------
// abortable produce errors and the epoch bump

/// TV1: after a sequence or epoch error the abort is followed by InitProducerId with the current id and
/// epoch (KIP-360), whose answer becomes the new epoch.
#[test]
fn tv1_abort_after_sequence_error_bumps_the_epoch() {
    let t0 = Instant::now();
    let mut m = ready(1, t0);
    m.begin(t0).unwrap();
    m.handle_append(&tp(0)).unwrap();
    m.poll_add_partitions(t0).unwrap();
    m.handle_add_partitions(
        TxnResponse::AddPartitions(vec![(tp(0), ErrorCode::None)]),
        t0,
    );
    m.handle_produce_sent(&tp(0));
    m.handle_produce_error(
        ProducerError::Broker {
            api: "Produce",
            code: ErrorCode::OutOfOrderSequenceNumber,
            class: ErrorClass::Abortable,
        },
        true,
    );
    assert_eq!(m.state(), TransactionState::AbortableError);
    assert!(matches!(
        sent(m.start_abort(t0, OP)),
        TxnRequest::EndTxn {
            commit: false,
            tv: TxnVersion::V1,
            ..
        }
    ));
    let bump = sent(m.handle_response(end_ok(None), t0));
    assert_eq!(
        bump,
        TxnRequest::InitProducerId {
            transactional_id: "tx-1".into(),
            timeout_ms: 60_000,
            current: Some(IDS),
            enable_2pc: false,
            keep_prepared: false,
        }
    );
    let bumped = ProducerIdEpoch {
        id: IDS.id,
        epoch: IDS.epoch + 1,
    };
    assert_eq!(
        m.handle_response(TxnResponse::InitProducerId(Ok(bumped)), t0),
        Step::Done
    );
    assert_eq!(m.state(), TransactionState::Ready);
    assert_eq!(m.ids(), Some(bumped));
    // The bump is not repeated after the next, clean, abort.
    m.begin(t0).unwrap();
    m.handle_produce_sent(&tp(0));
    sent(m.start_abort(t0, OP));
    assert_eq!(m.handle_response(end_ok(None), t0), Step::Done);
}

/// If another producer took the id meanwhile, the bump is answered as a fence.
#[test]
fn tv1_bump_fenced_is_fatal() {
    let t0 = Instant::now();
    let mut m = ready(1, t0);
    m.begin(t0).unwrap();
    m.handle_produce_sent(&tp(0));
    m.handle_produce_error(
        ProducerError::Broker {
            api: "Produce",
            code: ErrorCode::InvalidProducerEpoch,
            class: ErrorClass::Abortable,
        },
        true,
    );
    sent(m.start_abort(t0, OP));
    sent(m.handle_response(end_ok(None), t0));
    let err = failed(m.handle_response(
        TxnResponse::InitProducerId(Err(ErrorCode::ProducerFenced)),
        t0,
    ));
    assert!(err.is_fatal());
}

/// Under TV1 an abort that needs an epoch bump is fatal when the broker lacks KIP-360 InitProducerId.
#[test]
fn tv1_bump_without_kip360_is_fatal() {
    let t0 = Instant::now();
    let mut m = machine(1);
    m.set_caps(BrokerCaps {
        init_producer_id: Some(2),
        ..caps(1)
    });
    sent(m.start_init(t0, OP, false));
    m.handle_response(TxnResponse::InitProducerId(Ok(IDS)), t0);
    m.begin(t0).unwrap();
    m.handle_produce_sent(&tp(0));
    m.handle_produce_error(
        ProducerError::Broker {
            api: "Produce",
            code: ErrorCode::UnknownProducerId,
            class: ErrorClass::Abortable,
        },
        true,
    );
    sent(m.start_abort(t0, OP));
    let err = failed(m.handle_response(end_ok(None), t0));
    assert!(matches!(err, ProducerError::Unsupported { .. }));
    assert_eq!(m.state(), TransactionState::FatalError);
}

/// An interrupted bump is resumed by calling abort again.
#[test]
fn interrupted_bump_resumes_on_abort() {
    let t0 = Instant::now();
    let mut m = ready(1, t0);
    m.begin(t0).unwrap();
    m.handle_produce_sent(&tp(0));
    m.handle_produce_error(
        ProducerError::Broker {
            api: "Produce",
            code: ErrorCode::OutOfOrderSequenceNumber,
            class: ErrorClass::Abortable,
        },
        true,
    );
    sent(m.start_abort(t0, OP));
    let bump = sent(m.handle_response(end_ok(None), t0));
    // Dropped here.
    assert_eq!(m.state(), TransactionState::Initializing);
    assert!(m.begin(t0).is_err());
    assert_eq!(sent(m.start_abort(t0, OP)), bump);
}

/// TV2: EndTxn v5 bumps the epoch itself, so no InitProducerId follows the abort.
#[test]
fn tv2_abort_after_sequence_error_adopts_end_txn_epoch() {
    let t0 = Instant::now();
    let mut m = ready(2, t0);
    m.begin(t0).unwrap();
    m.handle_produce_sent(&tp(0));
    m.handle_produce_error(
        ProducerError::Broker {
            api: "Produce",
            code: ErrorCode::OutOfOrderSequenceNumber,
            class: ErrorClass::Abortable,
        },
        true,
    );
    sent(m.start_abort(t0, OP));
    let next = ProducerIdEpoch {
        id: IDS.id,
        epoch: IDS.epoch + 1,
    };
    assert_eq!(m.handle_response(end_ok(Some(next)), t0), Step::Done);
    assert_eq!(m.ids(), Some(next));
    assert_eq!(m.state(), TransactionState::Ready);
}

/// A fatal produce error poisons the producer: abort and commit are refused from then on.
#[test]
fn fatal_produce_error_poisons_the_producer() {
    let t0 = Instant::now();
    let mut m = ready(2, t0);
    m.begin(t0).unwrap();
    m.handle_produce_error(
        ProducerError::Fenced {
            transactional_id: "tx-1".into(),
            code: ErrorCode::ProducerFenced,
        },
        false,
    );
    assert_eq!(m.state(), TransactionState::FatalError);
    let err = failed(m.start_abort(t0, OP));
    assert!(matches!(err, ProducerError::Defunct { .. }));
    assert!(failed(m.start_commit(t0, OP)).is_fatal());
}

/// A mismatched answer is a driver bug: the machine refuses to guess and becomes fatal, never panics.
#[test]
fn mismatched_answer_is_fatal_not_a_panic() {
    let t0 = Instant::now();
    let mut m = machine(2);
    sent(m.start_init(t0, OP, false));
    let err = failed(m.handle_response(TxnResponse::AddOffsets(ErrorCode::None), t0));
    assert!(err.is_fatal());
    let mut m = ready(2, t0);
    assert!(matches!(
        m.handle_response(end_ok(None), t0),
        Step::Failed(ProducerError::IllegalState { .. })
    ));
}

/// A success without ids is a driver bug, never broker input: the machine fails typed and stops
/// instead of panicking.
#[test]
fn init_success_without_ids_is_a_typed_driver_bug() {
    let t0 = Instant::now();
    let mut m = machine(1);
    sent(m.start_init(t0, OP, false));
    let err = failed(m.handle_response(TxnResponse::InitProducerId(Err(ErrorCode::None)), t0));
    assert!(matches!(err, ProducerError::Defunct { .. }), "{err:?}");
    assert_eq!(m.state(), TransactionState::FatalError);
    assert!(!m.op_in_progress());
}

// ------------------------------------------------------------------------------------------------
// random walks

mod walk {
    //! Random interleavings of calls, answers, dropped futures and passing time, checked against the
    //! invariants the caller relies on.

    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone, Copy)]
    enum Answer {
        Ok,
        Retry,
        MovedCoordinator,
        Lost,
        Fenced,
        CommitFenced,
        Abortable,
    }

    #[derive(Debug, Clone)]
    enum Cmd {
        Init,
        Begin,
        Append(i32),
        PollAdd,
        AnswerAdd(bool),
        ProduceSent(i32),
        ProduceError {
            fatal: bool,
            bump: bool,
        },
        SendOffsets,
        Commit,
        Abort,
        Answer(Answer),
        /// Time passes beyond every deadline.
        Wait,
    }

    fn answer() -> impl Strategy<Value = Answer> {
        prop_oneof![
            4 => Just(Answer::Ok),
            2 => Just(Answer::Retry),
            1 => Just(Answer::MovedCoordinator),
            3 => Just(Answer::Lost),
            1 => Just(Answer::Fenced),
            1 => Just(Answer::CommitFenced),
            1 => Just(Answer::Abortable),
        ]
    }

    fn cmd() -> impl Strategy<Value = Cmd> {
        prop_oneof![
            1 => Just(Cmd::Init),
            2 => Just(Cmd::Begin),
            2 => (0..3i32).prop_map(Cmd::Append),
            1 => Just(Cmd::PollAdd),
            1 => any::<bool>().prop_map(Cmd::AnswerAdd),
            2 => (0..3i32).prop_map(Cmd::ProduceSent),
            1 => (any::<bool>(), any::<bool>())
                .prop_map(|(fatal, bump)| Cmd::ProduceError { fatal: fatal && bump, bump }),
            1 => Just(Cmd::SendOffsets),
            2 => Just(Cmd::Commit),
            2 => Just(Cmd::Abort),
            6 => answer().prop_map(Cmd::Answer),
            2 => Just(Cmd::Wait),
        ]
    }

    fn response(req: &TxnRequest, a: Answer) -> TxnResponse {
        let code = match a {
            Answer::Ok => ErrorCode::None,
            Answer::Retry => ErrorCode::ConcurrentTransactions,
            Answer::MovedCoordinator => ErrorCode::NotCoordinator,
            Answer::Lost => return TxnResponse::NoAnswer("lost".into()),
            Answer::Fenced => ErrorCode::ProducerFenced,
            Answer::CommitFenced => ErrorCode::IllegalGeneration,
            Answer::Abortable => ErrorCode::TransactionAbortable,
        };
        match req {
            TxnRequest::InitProducerId { current, .. } => {
                TxnResponse::InitProducerId(if code.is_ok() {
                    Ok(current.map_or(IDS, |c| ProducerIdEpoch {
                        id: c.id,
                        epoch: c.epoch + 1,
                    }))
                } else {
                    Err(code)
                })
            }
            TxnRequest::AddPartitions { partitions, .. } => {
                TxnResponse::AddPartitions(partitions.iter().map(|tp| (tp.clone(), code)).collect())
            }
            TxnRequest::AddOffsets { .. } => TxnResponse::AddOffsets(code),
            TxnRequest::TxnOffsetCommit { offsets, .. } => TxnResponse::TxnOffsetCommit(
                offsets.iter().map(|(tp, _)| (tp.clone(), code)).collect(),
            ),
            TxnRequest::EndTxn { ids, tv, .. } => TxnResponse::EndTxn {
                code,
                next: (*tv == TxnVersion::V2 && code.is_ok()).then_some(ProducerIdEpoch {
                    id: ids.id,
                    epoch: ids.epoch + 1,
                }),
            },
        }
    }

    /// What the walk knows about the open transaction, independent of the machine.
    #[derive(Default)]
    struct Model {
        /// Something of the transaction was put on the wire.
        reached: bool,
        /// A TxnOffsetCommit went out and its answer was never fed.
        offsets_in_doubt: bool,
        /// Partitions whose AddPartitionsToTxn was answered with success.
        enrolled: BTreeSet<TopicPartition>,
    }

    fn check_error(m: &TxnMachine, e: &ProducerError) {
        if e.is_fatal() {
            assert_eq!(m.state(), TransactionState::FatalError, "{e}");
        }
        if e.is_outcome_unknown() {
            assert_eq!(m.state(), TransactionState::CommitOutcomeUnknown, "{e}");
        }
        if e.is_abortable() {
            assert!(
                matches!(
                    m.state(),
                    TransactionState::AbortableError | TransactionState::FatalError
                ),
                "{e} in {:?}",
                m.state()
            );
        }
    }

    fn run(tv: i16, cmds: Vec<Cmd>) {
        let t0 = Instant::now();
        let mut now = t0;
        let mut m = machine(tv);
        let mut outstanding: Option<TxnRequest> = None;
        let mut add_outstanding: Option<TxnRequest> = None;
        let mut model = Model::default();
        for cmd in cmds {
            let before = m.state();
            let fatal_before = before == TransactionState::FatalError;
            let dropped_offsets = matches!(outstanding, Some(TxnRequest::TxnOffsetCommit { .. }));
            let mut step = None;
            match cmd {
                Cmd::Init => step = Some(m.start_init(now, OP, false)),
                Cmd::Begin => {
                    if m.begin(now).is_ok() {
                        model = Model::default();
                        add_outstanding = None;
                    }
                }
                Cmd::Append(p) => {
                    let _ = m.handle_append(&tp(p));
                }
                Cmd::PollAdd => {
                    if add_outstanding.is_none() {
                        if let Some(r) = m.poll_add_partitions(now) {
                            model.reached = true;
                            add_outstanding = Some(r);
                        }
                    }
                }
                Cmd::AnswerAdd(ok) => {
                    if let Some(req) = add_outstanding.take() {
                        let resp = response(&req, if ok { Answer::Ok } else { Answer::Retry });
                        if let (true, TxnRequest::AddPartitions { partitions, .. }) = (ok, &req) {
                            model.enrolled.extend(partitions.iter().cloned());
                        }
                        if let Some(e) = m.handle_add_partitions(resp, now).error {
                            check_error(&m, &e);
                        }
                    }
                }
                Cmd::ProduceSent(p) => {
                    if m.can_produce(&tp(p)) {
                        if m.txn_version() == TxnVersion::V1 {
                            assert!(
                                model.enrolled.contains(&tp(p)),
                                "TV1 produce before enrolment"
                            );
                        }
                        model.reached = true;
                        m.handle_produce_sent(&tp(p));
                    }
                }
                Cmd::ProduceError { fatal, bump } => {
                    let err = if fatal {
                        ProducerError::Fenced {
                            transactional_id: "tx-1".into(),
                            code: ErrorCode::ProducerFenced,
                        }
                    } else {
                        ProducerError::Broker {
                            api: "Produce",
                            code: ErrorCode::OutOfOrderSequenceNumber,
                            class: ErrorClass::Abortable,
                        }
                    };
                    m.handle_produce_error(err, bump);
                }
                Cmd::SendOffsets => step = Some(m.start_send_offsets(&group(), offsets(), now, OP)),
                Cmd::Commit => step = Some(m.start_commit(now, OP)),
                Cmd::Abort => step = Some(m.start_abort(now, OP)),
                Cmd::Answer(a) => {
                    if let Some(req) = outstanding.take() {
                        let s = m.handle_response(response(&req, a), now);
                        // A later send_offsets that completed ran the fence for the offsets that count
                        // (requests to one coordinator are processed in order).
                        if matches!(req, TxnRequest::TxnOffsetCommit { .. })
                            && matches!(s, Step::Done)
                        {
                            model.offsets_in_doubt = false;
                        }
                        step = Some(s);
                    }
                }
                Cmd::Wait => now += OP * 2,
            }
            if let Some(step) = step {
                if !matches!(cmd, Cmd::Answer(_)) && dropped_offsets {
                    model.offsets_in_doubt = true;
                }
                match step {
                    Step::Send(req) | Step::Backoff { request: req, .. } => {
                        if let TxnRequest::EndTxn { commit, .. } = &req {
                            if *commit {
                                assert!(
                                    !model.offsets_in_doubt,
                                    "commit after an interrupted send_offsets"
                                );
                            } else {
                                assert!(
                                    !matches!(
                                        before,
                                        TransactionState::Committing
                                            | TransactionState::CommitOutcomeUnknown
                                    ),
                                    "abort of a commit that may land"
                                );
                            }
                        }
                        if matches!(
                            req,
                            TxnRequest::TxnOffsetCommit { .. } | TxnRequest::AddOffsets { .. }
                        ) {
                            model.reached = true;
                        }
                        assert!(!fatal_before, "a request after a fatal error: {req:?}");
                        outstanding = Some(req);
                    }
                    Step::Done => {
                        if matches!(cmd, Cmd::Commit | Cmd::Abort)
                            && before == TransactionState::InTransaction
                        {
                            assert!(
                                !model.reached,
                                "EndTxn skipped for a transaction on the wire"
                            );
                        }
                    }
                    Step::Failed(e) => {
                        check_error(&m, &e);
                        if fatal_before {
                            assert!(e.is_fatal(), "{e}");
                        }
                    }
                }
            }
            if fatal_before {
                assert_eq!(m.state(), TransactionState::FatalError, "fatal is terminal");
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        /// Under TV1, no sequence of calls, answers, dropped futures and timeouts produces before
        /// enrolment, commits after an interrupted send_offsets, aborts a commit that may land, skips
        /// EndTxn for a transaction on the wire, or sends after a fatal error.
        #[test]
        fn tv1_walks_keep_the_invariants(cmds in proptest::collection::vec(cmd(), 1..60)) {
            run(1, cmds);
        }

        /// Under TV2, no sequence of calls, answers, dropped futures and timeouts commits after an
        /// interrupted send_offsets, aborts a commit that may land, skips EndTxn for a transaction on
        /// the wire, or sends after a fatal error.
        #[test]
        fn tv2_walks_keep_the_invariants(cmds in proptest::collection::vec(cmd(), 1..60)) {
            run(2, cmds);
        }
    }
}

/// An init that runs out of time says what the coordinator kept answering: a takeover stuck behind an
/// abort the coordinator never finishes (CONCURRENT_TRANSACTIONS) must be told from a lost coordinator.
#[test]
fn an_init_timeout_names_the_last_answer() {
    let t0 = Instant::now();
    let mut m = machine(1);
    sent(m.start_init(t0, OP, false));
    let mut now = t0;
    let failed = loop {
        match m.handle_response(
            TxnResponse::InitProducerId(Err(ErrorCode::ConcurrentTransactions)),
            now,
        ) {
            Step::Backoff { delay, .. } => now += delay,
            Step::Failed(e) => break e,
            other => panic!("unexpected {other:?}"),
        }
        assert!(now < t0 + OP * 2, "the init never timed out");
    };
    assert!(
        matches!(
            failed,
            ProducerError::Timeout {
                op: "init",
                last_error: Some(ErrorCode::ConcurrentTransactions),
                ..
            }
        ),
        "{failed:?}"
    );
    assert!(
        failed
            .to_string()
            .contains("last answer CONCURRENT_TRANSACTIONS"),
        "{failed}"
    );
}

/// Every retry after CONCURRENT_TRANSACTIONS is counted under the API that was answered so, and a retry
/// for another reason is not, even with CONCURRENT_TRANSACTIONS beside it in the same answer.
#[test]
fn concurrent_transactions_retries_are_counted_per_api() {
    use crate::telemetry::recording::Recording;
    use crate::telemetry::CONCURRENT_TRANSACTIONS_RETRIES as RETRIES;
    let rec = Recording::default();
    rec.run(async {
        let t0 = Instant::now();
        let busy = ErrorCode::ConcurrentTransactions;
        let mut m = machine(1);
        sent(m.start_init(t0, OP, false));
        m.handle_response(TxnResponse::InitProducerId(Err(busy)), t0);
        m.handle_response(TxnResponse::InitProducerId(Err(busy)), t0);
        m.handle_response(TxnResponse::InitProducerId(Ok(IDS)), t0);
        m.begin(t0).unwrap();
        m.handle_append(&tp(0)).unwrap();
        m.poll_add_partitions(t0).unwrap();
        m.handle_add_partitions(TxnResponse::AddPartitions(vec![(tp(0), busy)]), t0);
        sent(m.start_send_offsets(&group(), offsets(), t0, OP));
        m.handle_response(TxnResponse::AddOffsets(busy), t0);
        m.handle_produce_sent(&tp(0));

        let mut m = ready(2, t0);
        m.begin(t0).unwrap();
        sent(m.start_send_offsets(&group(), offsets(), t0, OP));
        let in0 = TopicPartition::new("in", 0);
        let in1 = TopicPartition::new("in", 1);
        m.handle_response(TxnResponse::TxnOffsetCommit(vec![(in0.clone(), busy)]), t0);
        // Beside a loading coordinator it is an ordinary retry.
        let mixed = vec![(in0, busy), (in1, ErrorCode::CoordinatorLoadInProgress)];
        m.handle_response(TxnResponse::TxnOffsetCommit(mixed), t0);

        let mut m = ready(1, t0);
        m.begin(t0).unwrap();
        m.handle_produce_sent(&tp(0));
        sent(m.start_commit(t0, OP));
        m.handle_response(
            TxnResponse::EndTxn {
                code: busy,
                next: None,
            },
            t0,
        );
        let loading = ErrorCode::CoordinatorLoadInProgress;
        m.handle_response(
            TxnResponse::EndTxn {
                code: loading,
                next: None,
            },
            t0,
        );
    });
    let count = |api| rec.counter(RETRIES.name, &[("api", api)]);
    assert_eq!(count("InitProducerId"), 2);
    assert_eq!(count("AddPartitionsToTxn"), 1);
    assert_eq!(count("AddOffsetsToTxn"), 1);
    assert_eq!(count("TxnOffsetCommit"), 1);
    assert_eq!(count("EndTxn"), 1);
}

// ------------------------------------------------------------------------------------------------
// two-phase commit (KIP-939)

fn caps_2pc() -> BrokerCaps {
    BrokerCaps {
        init_producer_id: Some(6),
        ..caps(2)
    }
}

fn machine_2pc() -> TxnMachine {
    TxnMachine::new("tx-1", Duration::from_secs(60), backoff(), caps_2pc()).with_two_phase(true)
}

/// A two-phase machine after init, with a TV2 transaction open that reached the broker and carried its
/// offsets.
fn open_2pc(t0: Instant) -> TxnMachine {
    let mut m = machine_2pc();
    let init = sent(m.start_init(t0, OP, false));
    assert!(matches!(
        init,
        TxnRequest::InitProducerId {
            enable_2pc: true,
            keep_prepared: false,
            ..
        }
    ));
    assert_eq!(init.min_version(), Some(6), "v6 or nothing");
    assert_eq!(
        m.handle_response(TxnResponse::InitProducerId(Ok(IDS)), t0),
        Step::Done
    );
    m.begin(t0).unwrap();
    m.handle_append(&tp(0)).unwrap();
    m.handle_produce_sent(&tp(0));
    sent(m.start_send_offsets(&group(), offsets(), t0, OP));
    assert_eq!(
        m.handle_response(TxnResponse::TxnOffsetCommit(vec![]), t0),
        Step::Done
    );
    m
}

/// A prepared transaction accepts nothing but commit or abort, is named by the ids it runs under, and
/// either end adopts the bumped epoch.
#[test]
fn a_prepared_transaction_takes_only_commit_or_abort() {
    let t0 = Instant::now();
    for commit in [true, false] {
        let mut m = open_2pc(t0);
        assert_eq!(m.prepare().unwrap(), IDS, "named by the ids it runs under");
        assert_eq!(m.state(), TransactionState::Prepared);
        assert_eq!(m.prepared(), Some(IDS));
        // Nothing more joins a prepared transaction, and it cannot be prepared twice.
        assert_eq!(
            m.handle_append(&tp(1)).unwrap_err().class(),
            ErrorClass::Refused
        );
        assert_eq!(
            failed(m.start_send_offsets(&group(), offsets(), t0, OP)).class(),
            ErrorClass::Refused
        );
        assert_eq!(m.prepare().unwrap_err().class(), ErrorClass::Refused);
        let end = if commit {
            sent(m.start_commit(t0, OP))
        } else {
            sent(m.start_abort(t0, OP))
        };
        assert!(
            matches!(end, TxnRequest::EndTxn { commit: c, ids: IDS, .. } if c == commit),
            "{end:?}"
        );
        let next = ProducerIdEpoch {
            id: IDS.id,
            epoch: IDS.epoch + 1,
        };
        assert_eq!(m.handle_response(end_ok(Some(next)), t0), Step::Done);
        assert_eq!(m.state(), TransactionState::Ready);
        assert_eq!(m.prepared(), None);
        assert_eq!(m.ids(), Some(next));
    }
}

/// Prepare is refused, with nothing changed, under TV1, on a producer not built for two-phase commit,
/// and while a send_offsets is still in flight.
#[test]
fn prepare_is_refused_under_tv1_without_two_phase_and_mid_offsets() {
    let t0 = Instant::now();
    // TV1: the ids stay the same from one transaction to the next, so they name none.
    let mut m = TxnMachine::new(
        "tx-1",
        Duration::from_secs(60),
        backoff(),
        BrokerCaps {
            init_producer_id: Some(6),
            ..caps(1)
        },
    )
    .with_two_phase(true);
    sent(m.start_init(t0, OP, false));
    m.handle_response(TxnResponse::InitProducerId(Ok(IDS)), t0);
    m.begin(t0).unwrap();
    let e = m.prepare().unwrap_err();
    assert_eq!(
        e.two_phase_refusal(),
        Some(crate::producer::TwoPhaseCommitRefusal::NeedsTransactionVersion2)
    );
    assert_eq!(e.class(), ErrorClass::Refused);
    assert_eq!(
        m.state(),
        TransactionState::InTransaction,
        "nothing changed"
    );
    // Not a two-phase producer.
    let mut plain = ready(2, t0);
    plain.begin(t0).unwrap();
    assert!(matches!(
        plain.prepare(),
        Err(ProducerError::IllegalState { op: "prepare", .. })
    ));
    // A send_offsets under way: whether the fence ran is not known yet.
    let mut m = machine_2pc();
    sent(m.start_init(t0, OP, false));
    m.handle_response(TxnResponse::InitProducerId(Ok(IDS)), t0);
    m.begin(t0).unwrap();
    sent(m.start_send_offsets(&group(), offsets(), t0, OP));
    assert_eq!(m.prepare().unwrap_err().class(), ErrorClass::Refused);
}

/// An init that keeps a predecessor's prepared transaction comes back Prepared under the predecessor's
/// ids and ends it under its own; only a two-phase producer may ask to keep one.
#[test]
fn a_kept_transaction_is_prepared_under_the_predecessors_name() {
    let t0 = Instant::now();
    let mut m = machine_2pc();
    let init = sent(m.start_init(t0, OP, true));
    assert!(matches!(
        init,
        TxnRequest::InitProducerId {
            enable_2pc: true,
            keep_prepared: true,
            ..
        }
    ));
    let ongoing = ProducerIdEpoch { id: 77, epoch: 3 };
    let ids = ProducerIdEpoch { id: 77, epoch: 4 };
    assert_eq!(
        m.handle_response(TxnResponse::InitKept { ids, ongoing }, t0),
        Step::Done
    );
    assert_eq!(m.state(), TransactionState::Prepared);
    assert_eq!(m.prepared(), Some(ongoing));
    assert_eq!(m.ids(), Some(ids));
    // It is ended under the ids this producer holds: the coordinator completes the kept one.
    let end = sent(m.start_commit(t0, OP));
    assert!(matches!(end, TxnRequest::EndTxn { commit: true, ids: i, .. } if i == ids));
    m.handle_response(end_ok(None), t0);
    assert_eq!(m.state(), TransactionState::Ready);
    // Nothing open: an ordinary success, and the machine is ready.
    let mut m = machine_2pc();
    sent(m.start_init(t0, OP, true));
    m.handle_response(TxnResponse::InitProducerId(Ok(IDS)), t0);
    assert_eq!(m.state(), TransactionState::Ready);
    // Only a two-phase producer may ask.
    assert!(matches!(
        machine(2).start_init(t0, OP, true),
        Step::Failed(ProducerError::IllegalState { .. })
    ));
}

/// A refused two-phase init is fatal and says why (no ACL or disabled, keep-prepared unsupported, or v6
/// not spoken), while a plain producer gets the ordinary missing-ACL error.
#[test]
fn refused_two_phase_inits_say_why() {
    use crate::producer::TwoPhaseCommitRefusal as R;
    let t0 = Instant::now();
    let cases = [
        (
            false,
            ErrorCode::TransactionalIdAuthorizationFailed,
            R::NotAuthorizedOrDisabled,
        ),
        (
            true,
            ErrorCode::UnsupportedVersion,
            R::KeepPreparedUnsupported,
        ),
        (false, ErrorCode::UnsupportedVersion, R::NotSpoken),
    ];
    for (keep, code, want) in cases {
        let mut m = machine_2pc();
        sent(m.start_init(t0, OP, keep));
        let e = failed(m.handle_response(TxnResponse::InitProducerId(Err(code)), t0));
        assert_eq!(e.two_phase_refusal(), Some(want), "{code}");
        assert!(e.is_fatal());
        assert_eq!(m.state(), TransactionState::FatalError);
    }
    // A coordinator known not to speak v6: refused before anything is sent.
    let mut m =
        TxnMachine::new("tx-1", Duration::from_secs(60), backoff(), caps(2)).with_two_phase(true);
    assert_eq!(
        failed(m.start_init(t0, OP, false)).two_phase_refusal(),
        Some(R::NotSpoken)
    );
    // Without two-phase commit, the same code is the ordinary missing-ACL refusal.
    let mut m = machine(2);
    sent(m.start_init(t0, OP, false));
    let e = failed(m.handle_response(
        TxnResponse::InitProducerId(Err(ErrorCode::TransactionalIdAuthorizationFailed)),
        t0,
    ));
    assert!(matches!(e, ProducerError::NotAuthorized { .. }), "{e:?}");
}
