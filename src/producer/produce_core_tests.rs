//! Broker-free tests of the produce path: batching, sequences, retries, epoch bumps and back-pressure.

use super::*;

const IDS: ProducerIdEpoch = ProducerIdEpoch { id: 77, epoch: 0 };
const LINGER: Duration = Duration::from_millis(10);

/// Records every encode call and returns bytes naming the batch's identity, so a test can tell a
/// resend of the same bytes from a re-encode.
#[derive(Default)]
struct FakeEncoder {
    calls: Vec<(ProducerIdEpoch, i32, usize, bool)>,
    fail: bool,
}

impl BatchEncoder for FakeEncoder {
    fn encode(
        &mut self,
        records: &[&ProducerRecord],
        ids: ProducerIdEpoch,
        base_sequence: i32,
        transactional: bool,
    ) -> Result<Bytes, String> {
        if self.fail {
            return Err("boom".into());
        }
        self.calls
            .push((ids, base_sequence, records.len(), transactional));
        Ok(Bytes::from(format!(
            "{}:{}:{}:{}",
            ids.id,
            ids.epoch,
            base_sequence,
            records.len()
        )))
    }
}

fn config() -> ProducerConfig {
    ProducerConfig {
        linger: LINGER,
        batch_size: 1000,
        buffer_memory: 10_000,
        max_request_size: 5000,
        delivery_timeout: Duration::from_secs(5),
        ..ProducerConfig::default()
    }
}

fn core(transactional: bool) -> ProducerCore<u32> {
    let mut c = ProducerCore::new(&config(), transactional);
    c.set_ids(IDS);
    c
}

fn tp(p: i32) -> TopicPartition {
    TopicPartition::new("t", p)
}

fn rec(n: usize) -> ProducerRecord {
    ProducerRecord::new("t", Some(Bytes::from(vec![b'v'; n]))).timestamp(1_000)
}

fn ok(base_offset: i64) -> ProduceAnswer {
    ProduceAnswer::Partition(PartitionAnswer {
        code: ErrorCode::None,
        base_offset,
        log_append_time_ms: -1,
    })
}

fn err(code: ErrorCode) -> ProduceAnswer {
    ProduceAnswer::Partition(PartitionAnswer {
        code,
        base_offset: -1,
        log_append_time_ms: -1,
    })
}

fn all(_: &TopicPartition, _: usize) -> bool {
    true
}

fn send(c: &mut ProducerCore<u32>, now: Instant, enc: &mut FakeEncoder) -> Vec<ToSend> {
    let (out, fx) = c.poll_send(now, &mut all, enc);
    assert!(fx.completions.is_empty());
    out
}

/// A pass that lets out only some of the ready partitions (a broker with room for one request) starts
/// the next pass after the last partition it took, so every partition gets its turn, and `allow` is
/// told each batch's bytes.
#[test]
fn a_pass_starts_after_the_partition_the_last_one_took() {
    let t0 = Instant::now();
    let mut c = core(false);
    let mut enc = FakeEncoder::default();
    for p in 0..4 {
        one_per_batch(&mut c, p, 2, t0);
    }
    c.flush();
    let mut taken = Vec::new();
    for _ in 0..4 {
        let mut asked = Vec::new();
        let mut two = |_: &TopicPartition, bytes: usize| {
            asked.push(bytes);
            asked.len() <= 2
        };
        let (out, _) = c.poll_send(t0, &mut two, &mut enc);
        assert!(
            asked.iter().all(|&b| b > 600),
            "allow is told each batch's bytes: {asked:?}"
        );
        taken.push(
            out.iter()
                .map(|b| b.partition.partition)
                .collect::<Vec<_>>(),
        );
        for b in out {
            c.handle_answer(b.id, ok(0), t0);
        }
    }
    assert_eq!(taken, [vec![0, 1], vec![2, 3], vec![0, 1], vec![2, 3]]);
}

/// One record per batch: a batch size the second record does not fit.
fn one_per_batch(c: &mut ProducerCore<u32>, part: i32, n: u32, now: Instant) {
    for i in 0..n {
        c.append(&tp(part), rec(600), i, now).unwrap();
    }
}

/// Records appended to one partition linger together into one batch, encoded once, and each completes
/// with its own offset counted from the batch's base offset, freeing the buffer.
#[test]
fn records_batch_linger_and_complete_with_offsets() {
    let t0 = Instant::now();
    let mut c = core(false);
    let mut enc = FakeEncoder::default();
    for i in 0..3 {
        c.append(&tp(0), rec(10), i, t0).unwrap();
    }
    assert!(send(&mut c, t0, &mut enc).is_empty(), "lingering");
    assert_eq!(c.poll_timeout(t0), Some(t0 + LINGER));
    let out = send(&mut c, t0 + LINGER, &mut enc);
    assert_eq!(out.len(), 1);
    assert_eq!(
        (out[0].ids, out[0].base_sequence, out[0].attempt),
        (IDS, 0, 0)
    );
    assert_eq!(enc.calls, vec![(IDS, 0, 3, false)]);
    let fx = c.handle_answer(out[0].id, ok(100), t0 + LINGER);
    assert!(fx.memory_freed);
    let mut got: Vec<_> = fx
        .completions
        .into_iter()
        .map(|c| (c.completion, c.result.unwrap().offset))
        .collect();
    got.sort();
    assert_eq!(got, vec![(0, Some(100)), (1, Some(101)), (2, Some(102))]);
    assert!(c.is_idle());
    assert_eq!(c.acc.used(), 0);
}

/// A retry resends exactly the bytes of the first attempt (same sequence), after a backoff, without
/// encoding again: that is what lets the broker drop a duplicate.
#[test]
fn retries_resend_the_same_bytes_and_sequence() {
    let t0 = Instant::now();
    let mut c = core(false);
    let mut enc = FakeEncoder::default();
    c.append(&tp(0), rec(10), 1, t0).unwrap();
    c.flush();
    let first = send(&mut c, t0, &mut enc).remove(0);
    let fx = c.handle_answer(first.id, ProduceAnswer::NoAnswer("timeout".into()), t0);
    assert_eq!(fx.refresh_leader, vec![tp(0)]);
    assert!(fx.completions.is_empty());
    assert!(send(&mut c, t0, &mut enc).is_empty(), "backing off");
    let at = c.poll_timeout(t0).unwrap();
    assert_eq!(at, t0 + Duration::from_millis(100));
    let again = send(&mut c, at, &mut enc).remove(0);
    assert_eq!(again.records, first.records);
    assert_eq!(again.base_sequence, first.base_sequence);
    assert_eq!(again.attempt, 1);
    assert_eq!(enc.calls.len(), 1, "never re-encoded");
    let fx = c.handle_answer(again.id, err(ErrorCode::NotLeaderOrFollower), at);
    assert_eq!(fx.refresh_leader, vec![tp(0)]);
    let at2 = c.poll_timeout(at).unwrap();
    assert_eq!(at2, at + Duration::from_millis(200), "backoff doubles");
    let third = send(&mut c, at2, &mut enc).remove(0);
    // Acknowledged as a duplicate of an earlier attempt: success, offset unknown.
    let fx = c.handle_answer(third.id, err(ErrorCode::DuplicateSequenceNumber), at2);
    let m = fx.completions[0].result.as_ref().unwrap();
    assert_eq!(m.offset, None);
}

/// A partition sends one batch alone until the broker has acknowledged one (before that the broker
/// has no state for the producer and would take a later batch first); then up to five are in flight.
#[test]
fn at_most_five_batches_in_flight_per_partition() {
    let t0 = Instant::now();
    let mut c = core(false);
    let mut enc = FakeEncoder::default();
    one_per_batch(&mut c, 0, 8, t0);
    c.append(&tp(1), rec(10), 100, t0).unwrap();
    c.flush();
    let seqs_of = |out: &[ToSend], p: i32| -> Vec<i32> {
        out.iter()
            .filter(|s| s.partition == tp(p))
            .map(|s| s.base_sequence)
            .collect()
    };
    let out = send(&mut c, t0, &mut enc);
    assert_eq!(
        seqs_of(&out, 0),
        vec![0],
        "one alone before any acknowledgement"
    );
    assert!(
        out.iter().any(|s| s.partition == tp(1)),
        "other partitions are not held up"
    );
    assert!(send(&mut c, t0, &mut enc).is_empty());
    c.handle_answer(out[0].id, ok(0), t0);
    let out = send(&mut c, t0, &mut enc);
    assert_eq!(seqs_of(&out, 0), vec![1, 2, 3, 4, 5]);
    assert!(send(&mut c, t0, &mut enc).is_empty());
    c.handle_answer(out[0].id, ok(1), t0);
    let next = send(&mut c, t0, &mut enc);
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].base_sequence, 6);
}

/// OUT_OF_ORDER_SEQUENCE_NUMBER on the first batch in flight: a real gap. The idempotent producer
/// bumps its epoch and re-sequences the unwritten batches from 0, in their original order.
#[test]
fn idempotent_gap_bumps_epoch_and_resequences() {
    let t0 = Instant::now();
    let mut c = core(false);
    let mut enc = FakeEncoder::default();
    one_per_batch(&mut c, 0, 4, t0);
    c.flush();
    // The first batch goes alone and is written: the broker knows the producer.
    let known = send(&mut c, t0, &mut enc).remove(0);
    c.handle_answer(known.id, ok(0), t0);
    let out = send(&mut c, t0, &mut enc);
    assert_eq!(out.len(), 3);
    let fx = c.handle_answer(out[0].id, err(ErrorCode::OutOfOrderSequenceNumber), t0);
    assert!(fx.completions.is_empty(), "held, not failed");
    c.handle_answer(out[1].id, err(ErrorCode::OutOfOrderSequenceNumber), t0);
    assert_eq!(
        c.ids(),
        Some(IDS),
        "no bump until every batch is heard from"
    );
    c.handle_answer(out[2].id, err(ErrorCode::OutOfOrderSequenceNumber), t0);
    let bumped = ProducerIdEpoch {
        id: IDS.id,
        epoch: 1,
    };
    assert_eq!(c.ids(), Some(bumped));
    let again = send(&mut c, t0, &mut enc);
    let seqs: Vec<_> = again
        .iter()
        .map(|s| (s.ids, s.base_sequence, s.id))
        .collect();
    assert_eq!(
        seqs,
        vec![
            (bumped, 0, out[0].id),
            (bumped, 1, out[1].id),
            (bumped, 2, out[2].id)
        ]
    );
    assert_ne!(
        again[0].records, out[0].records,
        "re-encoded under the new epoch"
    );
    for s in &again {
        let fx = c.handle_answer(s.id, ok(10), t0);
        assert!(fx.completions.iter().all(|c| c.result.is_ok()));
    }
    assert!(c.is_idle());
}

/// A batch that may have been written is never re-sequenced: it fails as outcome-unknown.
#[test]
fn maybe_written_batch_fails_as_unknown_never_duplicated() {
    let t0 = Instant::now();
    let mut c = core(false);
    let mut enc = FakeEncoder::default();
    c.append(&tp(0), rec(10), 1, t0).unwrap();
    c.flush();
    let s = send(&mut c, t0, &mut enc).remove(0);
    c.handle_answer(s.id, ProduceAnswer::NoAnswer("eof".into()), t0);
    let at = c.poll_timeout(t0).unwrap();
    let s = send(&mut c, at, &mut enc).remove(0);
    let fx = c.handle_answer(s.id, err(ErrorCode::UnknownProducerId), at);
    let e = fx.completions[0].result.as_ref().unwrap_err();
    assert!(e.is_outcome_unknown(), "{e}");
    assert_eq!(enc.calls.len(), 1, "not re-encoded");
}

/// Out of delivery time while waiting to retry: unknown if an attempt went unanswered.
#[test]
fn delivery_timeout_while_retrying_is_unknown() {
    let t0 = Instant::now();
    let mut c = core(false);
    let mut enc = FakeEncoder::default();
    c.append(&tp(0), rec(10), 1, t0).unwrap();
    c.flush();
    let s = send(&mut c, t0, &mut enc).remove(0);
    c.handle_answer(s.id, ProduceAnswer::NoAnswer("eof".into()), t0);
    let fx = c.handle_timeout(t0 + Duration::from_secs(5));
    let e = fx.completions[0].result.as_ref().unwrap_err();
    assert!(e.is_outcome_unknown(), "{e}");
    assert!(c.is_idle());
}

/// An answer arriving after the delivery deadline with "retry" gives up instead of retrying.
#[test]
fn late_retriable_answer_gives_up() {
    let t0 = Instant::now();
    let mut c = core(false);
    let mut enc = FakeEncoder::default();
    c.append(&tp(0), rec(10), 1, t0).unwrap();
    c.flush();
    let s = send(&mut c, t0, &mut enc).remove(0);
    let fx = c.handle_answer(
        s.id,
        err(ErrorCode::NotEnoughReplicas),
        t0 + Duration::from_secs(6),
    );
    let e = fx.completions[0].result.as_ref().unwrap_err();
    // Every attempt was answered with a definite error: not written.
    assert!(e.is_abortable() && !e.is_outcome_unknown(), "{e}");
}

/// REQUEST_TIMED_OUT and NOT_ENOUGH_REPLICAS_AFTER_APPEND come after the leader appended: a batch that
/// runs out of delivery time after one is reported as outcome unknown, never as not written.
#[test]
fn answers_given_after_the_append_leave_the_outcome_unknown() {
    for code in [
        ErrorCode::RequestTimedOut,
        ErrorCode::NotEnoughReplicasAfterAppend,
    ] {
        let t0 = Instant::now();
        let mut c = core(false);
        let mut enc = FakeEncoder::default();
        c.append(&tp(0), rec(10), 1, t0).unwrap();
        c.flush();
        let s = send(&mut c, t0, &mut enc).remove(0);
        let fx = c.handle_answer(s.id, err(code), t0 + Duration::from_secs(6));
        let e = fx.completions[0].result.as_ref().unwrap_err();
        assert!(e.is_outcome_unknown(), "{code:?}: {e}");
    }
}

/// A batch that never left the producer expires at its delivery deadline as a timeout that says not
/// written (abortable), never as outcome unknown.
#[test]
fn never_sent_batches_expire_as_not_written() {
    let t0 = Instant::now();
    let mut c = core(false);
    c.append(&tp(0), rec(10), 1, t0).unwrap();
    assert!(c
        .handle_timeout(t0 + Duration::from_secs(4))
        .completions
        .is_empty());
    // Once ready, only the delivery deadline is left to wake up for (sending is driven by poll_send).
    assert_eq!(
        c.poll_timeout(t0 + LINGER),
        Some(t0 + Duration::from_secs(5))
    );
    let fx = c.handle_timeout(t0 + Duration::from_secs(5));
    let e = fx.completions[0].result.as_ref().unwrap_err();
    assert!(matches!(e, ProducerError::Timeout { .. }) && e.is_abortable());
    assert!(c.is_idle());
}

/// A definite rejection fails only that batch as not written; the next batch reuses its sequence.
#[test]
fn rejected_batch_fails_alone() {
    let t0 = Instant::now();
    let mut c = core(false);
    let mut enc = FakeEncoder::default();
    c.append(&tp(0), rec(10), 1, t0).unwrap();
    c.flush();
    let s = send(&mut c, t0, &mut enc).remove(0);
    let fx = c.handle_answer(s.id, err(ErrorCode::MessageTooLarge), t0);
    let e = fx.completions[0].result.as_ref().unwrap_err();
    assert!(e.is_abortable() && !e.is_fatal());
    assert!(fx.txn_error.is_none() && fx.fatal.is_none());
    c.append(&tp(0), rec(10), 2, t0).unwrap();
    c.flush();
    let s = send(&mut c, t0, &mut enc).remove(0);
    assert_eq!((s.ids, s.base_sequence), (IDS, 0));
}

/// A fatal produce answer (cluster authorisation failed) stops the producer: every later append is
/// refused as defunct.
#[test]
fn fatal_produce_error_stops_the_producer() {
    let t0 = Instant::now();
    let mut c = core(false);
    let mut enc = FakeEncoder::default();
    c.append(&tp(0), rec(10), 1, t0).unwrap();
    c.flush();
    let s = send(&mut c, t0, &mut enc).remove(0);
    let fx = c.handle_answer(s.id, err(ErrorCode::ClusterAuthorizationFailed), t0);
    assert!(fx.fatal.as_ref().is_some_and(ProducerError::is_fatal));
    let (e, _, _) = c.append(&tp(0), rec(10), 2, t0).unwrap_err();
    assert!(matches!(e, ProducerError::Defunct { .. }));
}

/// The buffer bound back-pressures appends and frees only when batches complete.
#[test]
fn back_pressure_until_completion() {
    let t0 = Instant::now();
    let mut c = core(false);
    let mut enc = FakeEncoder::default();
    let mut n = 0;
    let refused = loop {
        match c.append(&tp(n as i32 % 3), rec(900), n, t0) {
            Ok(_) => n += 1,
            Err((e, r, back)) => break (e, r, back),
        }
    };
    assert!(refused.0.is_retriable(), "{}", refused.0);
    assert_eq!(refused.2, n, "the completion comes back");
    c.flush();
    let out = send(&mut c, t0, &mut enc);
    // In flight still holds memory.
    assert!(c.append(&tp(0), refused.1.clone(), n, t0).is_err());
    let fx = c.handle_answer(out[0].id, ok(0), t0);
    assert!(fx.memory_freed);
    assert!(c.append(&tp(0), refused.1, n, t0).is_ok());
}

/// A record larger than the maximum request size is refused at append, before it takes buffer space.
#[test]
fn records_too_large_are_refused() {
    let mut c = core(false);
    let (e, _, _) = c.append(&tp(0), rec(6000), 0, Instant::now()).unwrap_err();
    assert!(matches!(e, ProducerError::RecordTooLarge { .. }));
    assert_eq!(e.class(), ErrorClass::Refused);
}

/// A flush waits only for what was appended before it: the marker is done once those batches are
/// answered, whatever was appended since.
#[test]
fn flush_marker_tracks_completion() {
    let t0 = Instant::now();
    let mut c = core(false);
    let mut enc = FakeEncoder::default();
    c.append(&tp(0), rec(10), 1, t0).unwrap();
    let marker = c.flush();
    assert!(!c.flushed(marker));
    let s = send(&mut c, t0, &mut enc).remove(0);
    assert!(!c.flushed(marker), "in flight");
    c.append(&tp(0), rec(10), 2, t0).unwrap();
    c.handle_answer(s.id, ok(0), t0);
    assert!(c.flushed(marker), "later appends do not hold the flush");
    assert!(c.flushed(None));
}

/// When the broker stamps log-append time, the record's delivery reports the broker's timestamp, not the
/// one it was sent with.
#[test]
fn log_append_time_is_reported() {
    let t0 = Instant::now();
    let mut c = core(false);
    let mut enc = FakeEncoder::default();
    c.append(&tp(0), rec(10), 1, t0).unwrap();
    c.flush();
    let s = send(&mut c, t0, &mut enc).remove(0);
    let fx = c.handle_answer(
        s.id,
        ProduceAnswer::Partition(PartitionAnswer {
            code: ErrorCode::None,
            base_offset: 5,
            log_append_time_ms: 42,
        }),
        t0,
    );
    assert_eq!(fx.completions[0].result.as_ref().unwrap().timestamp, 42);
}

/// A batch that fails to encode fails its records without being sent, and its sequence numbers go to the
/// next batch so no gap is left.
#[test]
fn encode_failure_fails_the_batch_and_frees_the_sequence() {
    let t0 = Instant::now();
    let mut c = core(false);
    let mut enc = FakeEncoder {
        fail: true,
        ..FakeEncoder::default()
    };
    c.append(&tp(0), rec(10), 1, t0).unwrap();
    c.flush();
    let (out, fx) = c.poll_send(t0, &mut all, &mut enc);
    assert!(out.is_empty());
    assert!(fx.completions[0].result.is_err());
    enc.fail = false;
    c.append(&tp(0), rec(10), 2, t0).unwrap();
    c.flush();
    assert_eq!(send(&mut c, t0, &mut enc)[0].base_sequence, 0);
}

/// Idempotent producer at the last epoch: a new producer id is needed before re-sequencing.
#[test]
fn exhausted_epoch_asks_for_a_new_id() {
    let t0 = Instant::now();
    let last = ProducerIdEpoch {
        id: 5,
        epoch: i16::MAX,
    };
    let mut c: ProducerCore<u32> = ProducerCore::new(&config(), false);
    c.set_ids(last);
    let mut enc = FakeEncoder::default();
    c.append(&tp(0), rec(10), 1, t0).unwrap();
    c.flush();
    let s = send(&mut c, t0, &mut enc).remove(0);
    let fx = c.handle_answer(s.id, err(ErrorCode::OutOfOrderSequenceNumber), t0);
    assert!(fx.need_new_id);
    let fresh = ProducerIdEpoch { id: 6, epoch: 0 };
    c.set_ids(fresh);
    c.resume_after_new_id();
    let s = send(&mut c, t0, &mut enc).remove(0);
    assert_eq!((s.ids, s.base_sequence), (fresh, 0));
}

// ------------------------------------------------------------------------------------------------
// transactional

/// TV1 gating: nothing goes out for a partition the coordinator has not enrolled.
#[test]
fn transactional_batches_wait_for_enrolment() {
    let t0 = Instant::now();
    let mut c = core(true);
    let mut enc = FakeEncoder::default();
    c.append(&tp(0), rec(10), 1, t0).unwrap();
    c.append(&tp(1), rec(10), 2, t0).unwrap();
    c.flush();
    let mut enrolled = |tp: &TopicPartition, _: usize| tp.partition == 1;
    let (out, _) = c.poll_send(t0, &mut enrolled, &mut enc);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].partition, tp(1));
    assert!(enc.calls[0].3, "encoded as transactional");
}

/// Inside a transaction a sequence gap is not repaired locally: the batch fails abortable and the
/// transaction learns that its abort must bump the epoch.
#[test]
fn transactional_gap_is_abortable_with_bump() {
    let t0 = Instant::now();
    let mut c = core(true);
    let mut enc = FakeEncoder::default();
    c.append(&tp(0), rec(10), 1, t0).unwrap();
    c.flush();
    let s = send(&mut c, t0, &mut enc).remove(0);
    let fx = c.handle_answer(s.id, err(ErrorCode::OutOfOrderSequenceNumber), t0);
    let (e, bump) = fx.txn_error.expect("transaction error");
    assert!(e.is_abortable() && bump);
    assert!(fx.completions[0]
        .result
        .as_ref()
        .unwrap_err()
        .is_abortable());
    assert_eq!(c.ids(), Some(IDS), "no local bump in a transaction");
}

/// In a transaction a stale epoch is abortable with an epoch bump and TRANSACTION_ABORTABLE is abortable
/// without one, while PRODUCER_FENCED on a produce is fatal.
#[test]
fn transactional_stale_epoch_and_abortable_answers() {
    let t0 = Instant::now();
    for (code, bump) in [
        (ErrorCode::InvalidProducerEpoch, true),
        (ErrorCode::TransactionAbortable, false),
    ] {
        let mut c = core(true);
        let mut enc = FakeEncoder::default();
        c.append(&tp(0), rec(10), 1, t0).unwrap();
        c.flush();
        let s = send(&mut c, t0, &mut enc).remove(0);
        let fx = c.handle_answer(s.id, err(code), t0);
        let (e, b) = fx.txn_error.expect("transaction error");
        assert!(e.is_abortable(), "{code}: {e}");
        assert_eq!(b, bump, "{code}");
    }
    // PRODUCER_FENCED on a Produce is fatal.
    let mut c = core(true);
    let mut enc = FakeEncoder::default();
    c.append(&tp(0), rec(10), 1, t0).unwrap();
    c.flush();
    let s = send(&mut c, t0, &mut enc).remove(0);
    let fx = c.handle_answer(s.id, err(ErrorCode::ProducerFenced), t0);
    assert!(fx.fatal.is_some());
}

/// A transactional record that timed out in flight is abortable (the abort hides it either way).
#[test]
fn transactional_unknown_delivery_is_abortable() {
    let t0 = Instant::now();
    let mut c = core(true);
    let mut enc = FakeEncoder::default();
    c.append(&tp(0), rec(10), 1, t0).unwrap();
    c.flush();
    let s = send(&mut c, t0, &mut enc).remove(0);
    c.handle_answer(s.id, ProduceAnswer::NoAnswer("eof".into()), t0);
    let fx = c.handle_timeout(t0 + Duration::from_secs(5));
    let e = fx.completions[0].result.as_ref().unwrap_err();
    assert!(e.is_abortable() && !e.is_outcome_unknown(), "{e}");
    assert!(fx.txn_error.is_some_and(|(_, bump)| bump));
}

/// Abort fails everything unsent; a retry given up there leaves the sequence in doubt, so the abort
/// must bump the epoch. Batches with a request out are left for their answers.
#[test]
fn fail_unsent_on_abort() {
    let t0 = Instant::now();
    let mut c = core(true);
    let mut enc = FakeEncoder::default();
    c.append(&tp(0), rec(10), 1, t0).unwrap();
    c.append(&tp(1), rec(10), 2, t0).unwrap();
    c.flush();
    let out = send(&mut c, t0, &mut enc);
    c.handle_answer(out[0].id, ProduceAnswer::NoAnswer("eof".into()), t0);
    c.append(&tp(2), rec(10), 3, t0).unwrap();
    let abort = ProducerError::IllegalState {
        op: "send",
        state: "aborting",
    };
    let fx = c.fail_unsent(&abort);
    let mut failed: Vec<u32> = fx.completions.iter().map(|c| c.completion).collect();
    failed.sort();
    assert_eq!(failed, vec![1, 3]);
    assert!(fx.txn_error.is_some_and(|(_, bump)| bump));
    assert_eq!(c.sending(), 1);
    c.handle_answer(out[1].id, ok(0), t0);
    assert!(c.is_idle());
}

/// New ids reset a transactional producer's sequences; unchanged ids (a TV1 commit) keep them going.
#[test]
fn transactional_sequences_follow_the_ids() {
    let t0 = Instant::now();
    let mut c = core(true);
    let mut enc = FakeEncoder::default();
    c.append(&tp(0), rec(10), 1, t0).unwrap();
    c.flush();
    let s = send(&mut c, t0, &mut enc).remove(0);
    c.handle_answer(s.id, ok(0), t0);
    c.set_ids(IDS);
    c.append(&tp(0), rec(10), 2, t0).unwrap();
    c.flush();
    let s = send(&mut c, t0, &mut enc).remove(0);
    assert_eq!(
        s.base_sequence, 1,
        "TV1 carries sequences across transactions"
    );
    c.handle_answer(s.id, ok(1), t0);
    let next = ProducerIdEpoch { id: 77, epoch: 1 };
    c.set_ids(next);
    c.append(&tp(0), rec(10), 3, t0).unwrap();
    c.flush();
    let s = send(&mut c, t0, &mut enc).remove(0);
    assert_eq!(
        (s.ids, s.base_sequence),
        (next, 0),
        "TV2 epoch: start again"
    );
}
