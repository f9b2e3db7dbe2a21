//! The visibility engine and LogState on hand-built logs, including seed 003's worked trace and the
//! mistakes it warns about.

use super::*;

use IsolationLevel::{ReadCommitted, ReadUncommitted};

const P7: i64 = 7;
const P8: i64 = 8;

fn at(producer_id: i64, first_offset: i64) -> AbortedTransaction {
    AbortedTransaction {
        producer_id,
        first_offset,
    }
}

/// Seed 003's log before P7's abort: 0 P7 x, 1 P8 y, 2 plain z, 3 P8 COMMIT, 4 P7 w, 5 plain u; HW 6.
fn seed_003_log() -> Log {
    let mut log = Log::new();
    log.txn(P7, &["x"]);
    log.txn(P8, &["y"]);
    log.plain(&["z"]);
    log.marker(P8, true);
    log.txn(P7, &["w"]);
    log.plain(&["u"]);
    log
}

/// An open transaction pins the last stable offset at its first offset: read_uncommitted sees every data
/// record, read_committed sees nothing past the LSO.
#[test]
fn seed_003_open_transaction_pins_the_lso_at_zero() {
    let log = seed_003_log();
    let state = LogState::scan(&log.batches()).unwrap();
    assert_eq!(
        state.open_transactions(),
        vec![OpenTransaction {
            first_offset: 0,
            producer_id: P7
        }]
    );
    assert_eq!(state.last_stable_offset(6), 0);
    // read_uncommitted sees every data record.
    let v = visible(&log.batches(), &[], ReadUncommitted, 0).unwrap();
    let got: Vec<_> = offsets_values(&v).into_iter().map(|(_, s)| s).collect();
    assert_eq!(got, ["x", "y", "z", "w", "u"]);
    assert_eq!(v.next_offset, 6);
    // A read_committed fetch is bounded by the LSO (0): the broker returns no batch, nothing is seen.
    let v = visible(&[], &[], ReadCommitted, 0).unwrap();
    assert!(v.is_empty());
    assert_eq!(v.next_offset, 0);
}

/// Once the abort marker is written the LSO reaches the high watermark, and read_committed hides the
/// aborted producer's records while keeping everyone else's.
#[test]
fn seed_003_after_the_abort() {
    let mut log = seed_003_log();
    log.marker(P7, false);
    assert_eq!(log.end, 7);
    let state = LogState::scan(&log.batches()).unwrap();
    assert!(state.open_transactions().is_empty());
    assert_eq!(state.last_stable_offset(7), 7);
    let v = visible(&log.batches(), &[at(P7, 0)], ReadCommitted, 0).unwrap();
    assert_eq!(
        offsets_values(&v),
        vec![(1, "y".into()), (2, "z".into()), (5, "u".into())]
    );
    assert_eq!(v.next_offset, 7);
}

/// Mistake: showing a transactional batch because a COMMIT appears somewhere. The COMMIT of another
/// producer does not decide P7's records.
#[test]
fn a_commit_of_another_producer_does_not_commit_this_one() {
    let mut log = Log::new();
    log.txn(P7, &["a"]); // 0, aborted below
    log.txn(P8, &["b"]); // 1
    log.marker(P8, true); // 2
    log.marker(P7, false); // 3
    let v = visible(&log.batches(), &[at(P7, 0)], ReadCommitted, 0).unwrap();
    assert_eq!(offsets_values(&v), vec![(1, "b".into())]);
    assert_eq!(v.next_offset, 4);
}

/// Mistake: forgetting that a transaction that began before the fetch offset still decides the fate of
/// records after it.
#[test]
fn a_transaction_begun_before_the_fetch_offset_still_hides_its_later_records() {
    let mut log = Log::new();
    log.txn(P7, &["a"]); // 0
    log.plain(&["b"]); // 1
    log.txn(P7, &["c"]); // 2
    log.plain(&["d"]); // 3
    log.marker(P7, false); // 4
    log.plain(&["e"]); // 5
                       // A fetch at 1 gets batches from offset 1 on; the broker's list still names P7's transaction at 0.
    let batches: Vec<_> = log
        .batches()
        .into_iter()
        .filter(|b| b.last_offset() >= 1)
        .collect();
    let v = visible(&batches, &[at(P7, 0)], ReadCommitted, 1).unwrap();
    assert_eq!(
        offsets_values(&v),
        vec![(1, "b".into()), (3, "d".into()), (5, "e".into())]
    );
    assert_eq!(v.next_offset, 6);
}

/// Mistake: taking the LSO from the first transactional batch rather than the earliest *open* one.
#[test]
fn lso_is_the_earliest_open_transaction_not_the_first_transactional_batch() {
    let mut log = Log::new();
    log.txn(P8, &["a"]); // 0: committed below
    log.plain(&["b"]); // 1
    log.txn(P7, &["c"]); // 2: open
    log.marker(P8, true); // 3
    log.txn(P8, &["d"]); // 4: P8's second transaction, open
    let state = LogState::scan(&log.batches()).unwrap();
    assert_eq!(state.last_stable_offset(5), 2);
    assert_eq!(state.open_transaction_of(P7), Some(2));
    assert_eq!(state.open_transaction_of(P8), Some(4));
    assert_eq!(
        state.open_transactions(),
        vec![
            OpenTransaction {
                first_offset: 2,
                producer_id: P7
            },
            OpenTransaction {
                first_offset: 4,
                producer_id: P8
            }
        ]
    );
    // With nothing open the LSO is the high watermark.
    assert_eq!(LogState::new().last_stable_offset(42), 42);
}

/// LogState's documented limit: a transaction begun before the scan start is seen only from its first
/// batch inside the scan.
#[test]
fn log_state_only_sees_transactions_begun_inside_the_scan() {
    let mut log = Log::new();
    log.txn(P7, &["a"]); // 0: open, begun before the scan start below
    log.plain(&["b"]); // 1
    log.txn(P7, &["c"]); // 2
    let from_start = LogState::scan(&log.batches()).unwrap();
    assert_eq!(from_start.last_stable_offset(3), 0);
    let later = log.batches();
    let from_one = LogState::scan(&later[1..]).unwrap();
    assert_eq!(
        from_one.last_stable_offset(3),
        2,
        "an upper bound, as documented"
    );
}

/// The broker's aborted-transaction list decides the same records whatever order it comes in.
#[test]
fn unsorted_aborted_list_is_tolerated() {
    let mut log = Log::new();
    log.txn(P7, &["a"]); // 0
    log.marker(P7, false); // 1
    log.txn(P8, &["b"]); // 2
    log.txn(P7, &["c"]); // 3
    log.marker(P8, false); // 4
    log.marker(P7, true); // 5
    log.txn(P7, &["d"]); // 6
    log.marker(P7, false); // 7
    log.plain(&["e"]); // 8
    let sorted = [at(P7, 0), at(P8, 2), at(P7, 6)];
    let mut reversed = sorted;
    reversed.reverse();
    for list in [
        &sorted[..],
        &reversed[..],
        &[at(P8, 2), at(P7, 6), at(P7, 0)][..],
    ] {
        let v = visible(&log.batches(), list, ReadCommitted, 0).unwrap();
        assert_eq!(offsets_values(&v), vec![(3, "c".into()), (8, "e".into())]);
        assert_eq!(v.next_offset, 9);
    }
}

/// A repeated abort marker neither hides the producer's next, committed transaction nor holds back the
/// LSO.
#[test]
fn duplicate_abort_markers_are_harmless() {
    let mut log = Log::new();
    log.txn(P7, &["a"]); // 0
    log.marker(P7, false); // 1
    log.marker(P7, false); // 2: a duplicate (coordinator retried the marker)
    log.txn(P7, &["b"]); // 3: a fresh transaction, committed
    log.marker(P7, true); // 4
    let v = visible(&log.batches(), &[at(P7, 0)], ReadCommitted, 0).unwrap();
    assert_eq!(offsets_values(&v), vec![(3, "b".into())]);
    assert_eq!(v.next_offset, 5);
    assert_eq!(
        LogState::scan(&log.batches())
            .unwrap()
            .last_stable_offset(5),
        5
    );
}

/// After a marker, the same producer starts a fresh transaction with its next batch.
#[test]
fn a_producer_aborts_then_commits() {
    let mut log = Log::new();
    log.txn(P7, &["a", "b"]); // 0-1
    log.marker(P7, false); // 2
    log.txn(P7, &["c"]); // 3
    log.marker(P7, true); // 4
    let v = visible(&log.batches(), &[at(P7, 0)], ReadCommitted, 0).unwrap();
    assert_eq!(offsets_values(&v), vec![(3, "c".into())]);
}

/// Records of the first batch below the fetch offset are never delivered, at either isolation level.
#[test]
fn records_below_the_fetch_offset_in_the_first_batch_are_skipped() {
    let mut log = Log::new();
    log.plain(&["a", "b", "c", "d"]); // 0-3
    log.plain(&["e"]); // 4
    for isolation in [ReadCommitted, ReadUncommitted] {
        let v = visible(&log.batches(), &[], isolation, 2).unwrap();
        assert_eq!(
            offsets_values(&v),
            vec![(2, "c".into()), (3, "d".into()), (4, "e".into())]
        );
        assert_eq!(v.next_offset, 5);
    }
}

/// Control records are never delivered as data, yet the next offset moves past them, even in a fetch
/// that holds only a marker.
#[test]
fn markers_are_never_delivered_and_move_the_next_offset() {
    let mut log = Log::new();
    log.txn(P7, &["a"]); // 0
    log.marker(P7, true); // 1
    log.control(-1, ControlMarker::Other { kind: 2 }); // 2: a KRaft-style control record
    for isolation in [ReadCommitted, ReadUncommitted] {
        let v = visible(&log.batches(), &[], isolation, 0).unwrap();
        assert_eq!(offsets_values(&v), vec![(0, "a".into())]);
        assert_eq!(v.next_offset, 3);
    }
    // A fetch holding only a marker still moves past it.
    let v = visible(&log.batches()[1..], &[], ReadCommitted, 1).unwrap();
    assert!(v.is_empty());
    assert_eq!(v.next_offset, 3);
}

/// read_uncommitted delivers aborted records, ignoring the aborted list.
#[test]
fn read_uncommitted_delivers_aborted_records() {
    let mut log = Log::new();
    log.txn(P7, &["a"]);
    log.marker(P7, false);
    let v = visible(&log.batches(), &[at(P7, 0)], ReadUncommitted, 0).unwrap();
    assert_eq!(offsets_values(&v), vec![(0, "a".into())]);
    assert_eq!(v.next_offset, 2);
}

/// An idempotent (non-transactional) batch of a producer that also has an aborted transaction is not
/// hidden: only transactional batches are.
#[test]
fn idempotent_batches_are_not_hidden_by_aborts() {
    let mut log = Log::new();
    log.txn(P7, &["a"]); // 0
    log.data(Some((P7, false)), Compression::None, &["b"]); // 1
    log.marker(P7, false); // 2
    let v = visible(&log.batches(), &[at(P7, 0)], ReadCommitted, 0).unwrap();
    assert_eq!(offsets_values(&v), vec![(1, "b".into())]);
}

/// A partial batch at the end of a fetch is not an error: reading stops before it and the next offset
/// points at it.
#[test]
fn visible_in_stops_at_a_partial_trailing_batch() {
    let mut log = Log::new();
    log.plain(&["a"]);
    log.plain(&["b"]);
    let bytes = log.bytes();
    let cut = bytes.slice(..bytes.len() - 3);
    let v = visible_in(cut, &[], ReadCommitted, 0).unwrap();
    assert_eq!(offsets_values(&v), vec![(0, "a".into())]);
    assert_eq!(v.next_offset, 1);
}

/// A fetch with no batches leaves the next offset at the fetch offset.
#[test]
fn an_empty_fetch_keeps_the_fetch_offset() {
    let v = visible(&[], &[at(P7, 0)], ReadCommitted, 17).unwrap();
    assert_eq!(v.next_offset, 17);
    assert!(v.is_empty());
}
