//! The group-commit queue as a state machine without I/O: writes and offset commits in, the steps of the
//! next transaction out, its outcome in, one outcome per waiter out.
//!
//! It never touches a producer, a lock, a task or a clock, so every interleaving of writes, offset
//! commits and outcomes is a plain sequence of calls (see the tests at the end of this file). The driver
//! in the parent module owns the producer and the waiters' channels; the `T` it hands in with each write
//! or offset commit is that waiter's ticket, and comes back with its outcome.
//!
//! # Method kinds and call order
//! - **`handle_*`**, input: `handle_write` and `handle_offset` (a waiter's request, with its ticket),
//!   `handle_outcome` (how the open transaction ended); `close` and `fail_all` end the queue;
//! - **`poll_*`**, output: `poll_begin` (start a transaction with what is queued), `poll_step` (its
//!   next step), `poll_outcome` (one waiter's outcome at a time, to deliver).
//!
//! # One transaction
//!
//! ```text
//!   Idle ──poll_begin──▶ Producing ──poll_step: Send(writes) or Settle──┐
//!    ▲                      │  ▲                                        │  (writes queued meanwhile
//!    │                      │  └────────────────────────────────────────┘   join, up to the cap)
//!    │                      │ poll_step: nothing left to join
//!    │                      ▼
//!    └──handle_outcome── Sealed { offset }   (TxnOffsetCommit + EndTxn in flight; nothing joins)
//! ```
//!
//! `handle_outcome` is also accepted while `Producing` (a send failed before the offset was fixed).
//!
//! # When to seal
//!
//! A transaction is sealed when nothing is left to join, with one refinement that keeps a burst in one
//! transaction without delaying a lone write. If writes joined after the transaction's first step (a
//! burst is arriving), finding the queue empty does not seal it at once: the step is
//! [`Step::Settle`], and the driver waits until what the transaction has sent so far is acknowledged
//! before polling again. Those records are in flight anyway and the commit waits for their
//! acknowledgements regardless, so the wait costs at most the offset commit's overlap with the last
//! produce; meanwhile the rest of the burst queues and joins. The transaction is sealed once a settle
//! finds nothing new, or at the cap. A lone write (nothing joined after the first step) is sealed as soon
//! as it is sent.
//!
//! # The offset rule
//!
//! Every transaction commits an input offset, so every write is fenced by the generation. Which offset:
//! an offset commit request covers the writes queued before it (the caller scheduled it after their
//! snapshots were taken). It rides in a transaction only when no write queued before it is left behind
//! in the queue, so it never lands ahead of a write it covers. Writes join the open transaction in queue
//! order, so "left behind" is just "the oldest write still queued is older than the request". The
//! offset is fixed when the transaction is sealed, and a write that arrives after the seal waits for
//! the next transaction, which commits the offset again (at least the last one committed): a write is
//! always covered by the offset commit of its own transaction, and a request queued after the seal is
//! never folded into an offset that was already sent.
//!
//! Offset commits ride free: they never count against the cap, so a transaction of exactly `cap`
//! writes still carries the offset requested after them.
//!
//! # Entries and the byte cap
//!
//! What is queued is an [`Entry`]: a key's snapshot write and the outputs its fold emitted since its
//! last write. An entry is never split: its outputs are sent in the same transaction as its snapshot,
//! right after it. Besides the count cap, a transaction takes entries only while their bytes stay
//! within `max_bytes` (the first entry always goes, however large), so a wave of large outputs runs
//! as several transactions, each short against the transaction timeout.
//!
//! When a transaction fails, its writes did not land. An offset request still queued that was queued
//! after one of those writes would cover a write that is not there, so it fails with the same cause
//! instead of riding in the next transaction. (A request queued after the failure was delivered is the
//! caller's decision again.)

use std::collections::VecDeque;

use super::Entry;
use crate::snapshot::error::SnapshotError;

/// What the driver does next in the open transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Add these entries to the open transaction (in this order), then poll again.
    Send(Vec<Entry>),
    /// Writes are still arriving: wait until what the transaction sent so far is acknowledged, then
    /// poll again.
    Settle,
    /// Nothing more joins: commit `offset` for the input partition (the fence), then the transaction.
    Commit { offset: i64 },
}

/// Where the queue's transaction is; the states carry what belongs to them.
enum Txn<T> {
    Idle,
    Producing {
        /// Tickets of the writes handed out so far, in queue order.
        joined: Vec<T>,
        /// Bytes of the entries handed out so far.
        bytes: usize,
        /// Sequence number of the first joined write, if any joined.
        first_seq: Option<u64>,
        /// Writes joined after the first step and since the last settle.
        grew: bool,
    },
    Sealed {
        joined: Vec<T>,
        first_seq: Option<u64>,
        /// Tickets of the offset requests that ride in this transaction.
        riding: Vec<T>,
        offset: i64,
    },
}

/// The phase a test can look at.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Idle,
    Producing,
    Sealed,
}

struct Queued<V, T> {
    seq: u64,
    value: V,
    ticket: T,
}

/// The group-commit queue of one partition. `T` is the driver's per-waiter ticket.
pub(crate) struct Queue<T> {
    cap: usize,
    max_bytes: usize,
    next_seq: u64,
    writes: VecDeque<Queued<Entry, T>>,
    offsets: VecDeque<Queued<i64, T>>,
    /// The offset the next transaction commits unless a riding request moves it: seeded with the
    /// assigned offset, then the last offset a transaction committed.
    committed: i64,
    txn: Txn<T>,
    /// Set once the queue refuses new work: closed by its owner, or a failure left the producer unusable.
    closed: Option<SnapshotError>,
    outcomes: VecDeque<(T, Result<(), SnapshotError>)>,
    /// Transactions begun so far.
    begun: u64,
}

impl<T> Queue<T> {
    /// `cap` (at least 1) bounds the writes of one transaction; `assigned_offset` is what the first
    /// transaction commits.
    pub(crate) fn new(cap: usize, assigned_offset: i64) -> Self {
        debug_assert!(cap >= 1);
        Queue {
            cap: cap.max(1),
            max_bytes: usize::MAX,
            next_seq: 0,
            writes: VecDeque::new(),
            offsets: VecDeque::new(),
            committed: assigned_offset,
            txn: Txn::Idle,
            closed: None,
            outcomes: VecDeque::new(),
            begun: 0,
        }
    }

    /// Bounds the bytes of the entries one transaction takes (see "Entries and the byte cap"); at
    /// least one entry always goes.
    pub(crate) fn set_max_bytes(&mut self, max_bytes: usize) {
        self.max_bytes = max_bytes.max(1);
    }

    /// Queues a write (with its outputs, if any). Refused (and `ticket` dropped) once the queue is
    /// closed.
    pub(crate) fn handle_write(
        &mut self,
        write: impl Into<Entry>,
        ticket: T,
    ) -> Result<(), SnapshotError> {
        if let Some(err) = &self.closed {
            return Err(err.clone());
        }
        let seq = self.seq();
        self.writes.push_back(Queued {
            seq,
            value: write.into(),
            ticket,
        });
        Ok(())
    }

    /// Queues an offset commit request. Refused (and `ticket` dropped) once the queue is closed.
    pub(crate) fn handle_offset(&mut self, offset: i64, ticket: T) -> Result<(), SnapshotError> {
        if let Some(err) = &self.closed {
            return Err(err.clone());
        }
        let seq = self.seq();
        self.offsets.push_back(Queued {
            seq,
            value: offset,
            ticket,
        });
        Ok(())
    }

    /// Begins a transaction if none is open and something is queued, and returns its first step (so a
    /// transaction never begins empty). `None`: nothing to do.
    pub(crate) fn poll_begin(&mut self) -> Option<Step> {
        if !matches!(self.txn, Txn::Idle)
            || self.closed.is_some()
            || (self.writes.is_empty() && self.offsets.is_empty())
        {
            return None;
        }
        self.begun += 1;
        self.txn = Txn::Producing {
            joined: Vec::new(),
            bytes: 0,
            first_seq: None,
            grew: false,
        };
        let first = self.poll_step();
        if let Txn::Producing { grew, .. } = &mut self.txn {
            // The first step is the transaction's own start, not writes arriving behind it.
            *grew = false;
        }
        first
    }

    /// The next step of the open transaction: the writes that joined since the last step (up to the
    /// cap), or, when none can join, the seal with the offset to commit. `None` unless producing.
    pub(crate) fn poll_step(&mut self) -> Option<Step> {
        let Txn::Producing {
            joined,
            bytes,
            first_seq,
            grew,
        } = &mut self.txn
        else {
            return None;
        };
        let mut room = self.cap - joined.len();
        // Entries that fit: within the count cap and the byte cap, and always the first.
        let mut n = 0;
        let mut taken = *bytes;
        for q in self.writes.iter().take(room) {
            let size = q.value.bytes();
            if (joined.len() + n) > 0 && taken.saturating_add(size) > self.max_bytes {
                // The next entry would overflow: nothing more joins this transaction.
                room = 0;
                break;
            }
            taken = taken.saturating_add(size);
            n += 1;
        }
        if n > 0 {
            let mut out = Vec::with_capacity(n);
            for q in self.writes.drain(..n) {
                first_seq.get_or_insert(q.seq);
                joined.push(q.ticket);
                out.push(q.value);
            }
            *bytes = taken;
            *grew = true;
            return Some(Step::Send(out));
        }
        if room > 0 && *grew {
            *grew = false;
            return Some(Step::Settle);
        }
        // Seal. A request rides only if every write queued before it is in this transaction (or settled
        // earlier): the oldest write still queued bounds which ones may.
        let oldest_left = self.writes.front().map_or(u64::MAX, |w| w.seq);
        let rides = self
            .offsets
            .iter()
            .take_while(|o| o.seq < oldest_left)
            .count();
        let mut riding = Vec::with_capacity(rides);
        let mut offset = self.committed;
        for o in self.offsets.drain(..rides) {
            offset = offset.max(o.value);
            riding.push(o.ticket);
        }
        let joined = std::mem::take(joined);
        let first_seq = *first_seq;
        self.txn = Txn::Sealed {
            joined,
            first_seq,
            riding,
            offset,
        };
        Some(Step::Commit { offset })
    }

    /// The open transaction ended with `outcome`: every write in it and every request riding in it get
    /// that outcome. Ignored when no transaction is open.
    ///
    /// `Ok` says the transaction committed. The driver commits only after the seal (so the offset rides
    /// along); an `Ok` while producing would be its bug (a debug build stops there), and is taken at
    /// its word: the writes committed, no offset rode, and the committed offset stays where it was.
    pub(crate) fn handle_outcome(&mut self, outcome: Result<(), SnapshotError>) {
        let (joined, first_seq, riding, offset) = match std::mem::replace(&mut self.txn, Txn::Idle)
        {
            Txn::Idle => return,
            Txn::Producing {
                joined, first_seq, ..
            } => {
                debug_assert!(
                    outcome.is_err(),
                    "a transaction committed before its offset"
                );
                (joined, first_seq, Vec::new(), None)
            }
            Txn::Sealed {
                joined,
                first_seq,
                riding,
                offset,
            } => (joined, first_seq, riding, Some(offset)),
        };
        if let (Ok(()), Some(offset)) = (&outcome, offset) {
            self.committed = offset;
        }
        for t in joined.into_iter().chain(riding) {
            self.outcomes.push_back((t, outcome.clone()));
        }
        let Err(err) = outcome else { return };
        if let Some(first) = first_seq {
            // Requests queued after a write that did not land would cover it: they fail with it.
            let (failed, kept): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut self.offsets)
                .into_iter()
                .partition(|o| o.seq > first);
            self.offsets = kept;
            for o in failed {
                self.outcomes.push_back((o.ticket, Err(err.clone())));
            }
        }
        if closes(&err) {
            // The producer is unusable (or a commit's fate is unknown): nothing more may be sent on it.
            self.close(err);
        }
    }

    /// Refuses new work from now on and fails everything still queued with `error`. A transaction in
    /// flight goes on to its outcome. The first reason to close is kept.
    pub(crate) fn close(&mut self, error: SnapshotError) {
        let error = self.closed.get_or_insert(error).clone();
        for w in std::mem::take(&mut self.writes) {
            self.outcomes.push_back((w.ticket, Err(error.clone())));
        }
        for o in std::mem::take(&mut self.offsets) {
            self.outcomes.push_back((o.ticket, Err(error.clone())));
        }
    }

    /// The driver is gone (its task died): fails every waiter, the transaction in flight included, and
    /// refuses new work with `error`.
    pub(crate) fn fail_all(&mut self, error: SnapshotError) {
        self.closed = Some(error.clone());
        self.handle_outcome(Err(error.clone()));
        self.close(error);
    }

    /// The next waiter's outcome, to be delivered.
    pub(crate) fn poll_outcome(&mut self) -> Option<(T, Result<(), SnapshotError>)> {
        self.outcomes.pop_front()
    }

    /// The offset the last committed transaction committed (the assigned offset before any).
    pub(crate) fn committed(&self) -> i64 {
        self.committed
    }

    /// Transactions begun so far.
    pub(crate) fn transactions(&self) -> u64 {
        self.begun
    }

    /// Writes queued and not yet in a transaction.
    #[cfg(test)]
    pub(crate) fn queued_writes(&self) -> usize {
        self.writes.len()
    }

    /// Offset requests queued and not yet riding.
    #[cfg(test)]
    pub(crate) fn queued_offsets(&self) -> usize {
        self.offsets.len()
    }

    #[cfg(test)]
    pub(crate) fn phase(&self) -> Phase {
        match self.txn {
            Txn::Idle => Phase::Idle,
            Txn::Producing { .. } => Phase::Producing,
            Txn::Sealed { .. } => Phase::Sealed,
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.is_some()
    }

    /// Why new work is refused, once it is.
    pub(crate) fn refusal(&self) -> Option<SnapshotError> {
        self.closed.clone()
    }

    fn seq(&mut self) -> u64 {
        let s = self.next_seq;
        self.next_seq += 1;
        s
    }
}

/// Whether a transaction failure leaves the producer unusable, so the queue must close.
fn closes(err: &SnapshotError) -> bool {
    match err {
        SnapshotError::Transaction { failure, .. } => failure.kind.closes_store(),
        SnapshotError::DrainDied { .. } | SnapshotError::Closed { .. } => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::error::{FailureKind, TxnFailure};
    use crate::snapshot::group_commit::SnapshotWrite;
    use bytes::Bytes;
    use std::collections::BTreeMap;

    type Q = Queue<&'static str>;

    fn w(key: &'static str) -> SnapshotWrite {
        SnapshotWrite {
            key: Bytes::from_static(key.as_bytes()),
            value: Some(Bytes::from_static(b"v")),
        }
    }

    fn failed(kind: FailureKind) -> SnapshotError {
        SnapshotError::Transaction {
            partition: 0,
            failure: TxnFailure::scripted(kind),
        }
    }

    fn kind(r: &Result<(), SnapshotError>) -> Result<(), Option<FailureKind>> {
        match r {
            Ok(()) => Ok(()),
            Err(SnapshotError::Transaction { failure, .. }) => Err(Some(failure.kind)),
            Err(_) => Err(None),
        }
    }

    fn sent(keys: &[&'static str]) -> Option<Step> {
        Some(Step::Send(keys.iter().map(|k| w(k).into()).collect()))
    }

    fn commit(offset: i64) -> Option<Step> {
        Some(Step::Commit { offset })
    }

    /// Every outcome delivered so far, by ticket.
    fn outcomes(q: &mut Q) -> BTreeMap<&'static str, Result<(), Option<FailureKind>>> {
        let mut out = BTreeMap::new();
        while let Some((t, r)) = q.poll_outcome() {
            assert!(out.insert(t, kind(&r)).is_none(), "{t} got two outcomes");
        }
        out
    }

    /// A lone write begins its transaction at once and commits the seeded (assigned) offset: the first write
    /// is already gated by the generation.
    #[test]
    fn lone_write_begins_at_once_with_the_seeded_offset() {
        let mut q = Q::new(256, 42);
        q.handle_write(w("a"), "a").unwrap();
        assert_eq!(q.poll_begin(), sent(&["a"]));
        assert_eq!(q.poll_begin(), None, "one transaction at a time");
        assert_eq!(q.poll_step(), commit(42));
        assert_eq!(q.phase(), Phase::Sealed);
        q.handle_outcome(Ok(()));
        assert_eq!(outcomes(&mut q), BTreeMap::from([("a", Ok(()))]));
        assert_eq!(
            (q.phase(), q.poll_begin(), q.transactions()),
            (Phase::Idle, None, 1)
        );
    }

    /// With nothing queued, an offset commit is an offset-only transaction; the next write re-commits it and
    /// never advances it.
    #[test]
    fn offset_only_transaction_then_a_write_recommits_it() {
        let mut q = Q::new(256, 10);
        q.handle_offset(25, "o").unwrap();
        assert_eq!(q.poll_begin(), commit(25));
        q.handle_outcome(Ok(()));
        assert_eq!(q.committed(), 25);
        q.handle_write(w("a"), "a").unwrap();
        assert_eq!(q.poll_begin(), sent(&["a"]));
        assert_eq!(q.poll_step(), commit(25));
        q.handle_offset(20, "lower").unwrap();
        q.handle_outcome(Ok(()));
        assert_eq!(
            q.poll_begin(),
            commit(25),
            "the offset never moves backwards"
        );
    }

    /// Offset commits ride free of the cap: a transaction of exactly `cap` writes still carries the offset
    /// requested after them, whether they were queued before it began or joined while it was producing.
    #[test]
    fn an_offset_rides_free_of_the_cap() {
        let mut q = Q::new(3, 0);
        for k in ["a", "b", "c"] {
            q.handle_write(w(k), k).unwrap();
        }
        q.handle_offset(50, "o").unwrap();
        assert_eq!(q.poll_begin(), sent(&["a", "b", "c"]));
        assert_eq!(q.poll_step(), commit(50));
        q.handle_outcome(Ok(()));
        assert_eq!(outcomes(&mut q).len(), 4);

        q.handle_write(w("d"), "d").unwrap();
        assert_eq!(q.poll_begin(), sent(&["d"]));
        q.handle_write(w("e"), "e").unwrap();
        q.handle_write(w("f"), "f").unwrap();
        q.handle_offset(60, "o2").unwrap();
        assert_eq!(q.poll_step(), sent(&["e", "f"]));
        assert_eq!(q.poll_step(), commit(60));
    }

    /// An offset commit never rides in a transaction that leaves a write queued before it behind: it waits
    /// for the transaction that carries that write.
    #[test]
    fn an_offset_never_rides_ahead_of_a_write_left_behind() {
        let mut q = Q::new(2, 0);
        for k in ["a", "b", "c"] {
            q.handle_write(w(k), k).unwrap();
        }
        q.handle_offset(99, "o").unwrap();
        assert_eq!(q.poll_begin(), sent(&["a", "b"]));
        assert_eq!(
            q.poll_step(),
            commit(0),
            "c is left behind, so o may not ride"
        );
        q.handle_outcome(Ok(()));
        assert_eq!(q.poll_begin(), sent(&["c"]));
        assert_eq!(q.poll_step(), commit(99));
        q.handle_outcome(Ok(()));
        assert!(outcomes(&mut q).values().all(Result::is_ok));
    }

    /// Writes that arrive while a transaction is producing join it up to the cap; once it is sealed nothing
    /// joins, and a write after the seal (with the offset requested after it) goes in the next transaction,
    /// whose offset commit covers it: a sent offset never covers a write that was not in its transaction.
    #[test]
    fn writes_join_until_the_seal_and_later_ones_wait_for_the_next_commit() {
        let mut q = Q::new(4, 0);
        q.handle_write(w("a"), "a").unwrap();
        assert_eq!(q.poll_begin(), sent(&["a"]));
        for k in ["b", "c", "d", "e"] {
            q.handle_write(w(k), k).unwrap();
        }
        q.handle_offset(5, "o5").unwrap();
        assert_eq!(q.poll_step(), sent(&["b", "c", "d"]), "up to the cap of 4");
        assert_eq!(
            q.poll_step(),
            commit(0),
            "e is left behind, so o5 may not ride"
        );
        q.handle_write(w("f"), "f").unwrap();
        q.handle_offset(7, "o7").unwrap();
        assert_eq!(q.poll_step(), None, "sealed: nothing joins");
        q.handle_outcome(Ok(()));
        let first = outcomes(&mut q);
        assert_eq!(
            first.keys().copied().collect::<Vec<_>>(),
            ["a", "b", "c", "d"]
        );
        assert_eq!(q.poll_begin(), sent(&["e", "f"]));
        assert_eq!(q.poll_step(), commit(7));
        q.handle_outcome(Ok(()));
        assert_eq!(q.committed(), 7);
        assert_eq!(outcomes(&mut q).len(), 4);
    }

    /// A lone write is sealed as soon as it is sent, but a transaction that writes keep joining waits for
    /// its acknowledgements (settles) before it seals, so a burst's stragglers still join it; it seals
    /// once a settle finds nothing new, or at once when the cap is reached.
    #[test]
    fn a_growing_transaction_settles_before_it_seals() {
        let mut q = Q::new(4, 0);
        q.handle_write(w("a"), "a").unwrap();
        q.handle_write(w("b"), "b").unwrap();
        assert_eq!(q.poll_begin(), sent(&["a", "b"]));
        q.handle_write(w("c"), "c").unwrap();
        assert_eq!(q.poll_step(), sent(&["c"]));
        assert_eq!(q.poll_step(), Some(Step::Settle));
        assert_eq!(
            q.poll_step(),
            commit(0),
            "a settle that found nothing new seals"
        );
        q.handle_outcome(Ok(()));

        q.handle_write(w("d"), "d").unwrap();
        assert_eq!(q.poll_begin(), sent(&["d"]));
        q.handle_write(w("e"), "e").unwrap();
        assert_eq!(q.poll_step(), sent(&["e"]));
        assert_eq!(q.poll_step(), Some(Step::Settle));
        for k in ["f", "g", "h"] {
            q.handle_write(w(k), k).unwrap();
        }
        assert_eq!(q.poll_step(), sent(&["f", "g"]), "up to the cap");
        assert_eq!(
            q.poll_step(),
            commit(0),
            "at the cap it seals without settling"
        );
    }

    /// An offset requested after a write that already joined the open transaction rides in it: everything
    /// it covers is in that transaction.
    #[test]
    fn an_offset_after_joined_writes_rides_in_their_transaction() {
        let mut q = Q::new(256, 0);
        q.handle_write(w("a"), "a").unwrap();
        assert_eq!(q.poll_begin(), sent(&["a"]));
        q.handle_offset(5, "o").unwrap();
        assert_eq!(q.poll_step(), commit(5));
        q.handle_outcome(Ok(()));
        assert_eq!(
            outcomes(&mut q),
            BTreeMap::from([("a", Ok(())), ("o", Ok(()))])
        );
    }

    /// An entry's outputs are never split from its snapshot, and the byte cap ends a transaction between
    /// entries: entries of 100 bytes under a 250-byte cap go two to a transaction, and one entry larger
    /// than the cap still goes, alone.
    #[test]
    fn the_byte_cap_splits_between_entries_never_inside_one() {
        use crate::producer::ProducerRecord;
        let entry = |key: &'static str, out_bytes: usize| Entry {
            write: SnapshotWrite {
                key: Bytes::from_static(key.as_bytes()),
                value: None,
            },
            // A one-byte topic name and the fixed framing count too: pad the value to the size asked.
            outputs: vec![ProducerRecord::new(
                "o",
                Some(Bytes::from(vec![0u8; out_bytes - 25 - key.len()])),
            )],
        };
        assert_eq!(entry("a", 100).bytes(), 100);
        let mut q: Q = Queue::new(256, 0);
        q.set_max_bytes(250);
        for k in ["a", "b", "c"] {
            q.handle_write(entry(k, 100), k).unwrap();
        }
        q.handle_write(entry("d", 900), "d").unwrap();
        let mut shapes = Vec::new();
        while let Some(mut step) = q.poll_begin() {
            let mut keys = Vec::new();
            loop {
                match step {
                    Step::Send(entries) => {
                        for e in entries {
                            assert_eq!(e.outputs.len(), 1, "an entry keeps its outputs");
                            keys.push(String::from_utf8(e.write.key.to_vec()).unwrap());
                        }
                    }
                    Step::Settle => {}
                    Step::Commit { .. } => break,
                }
                step = q.poll_step().unwrap();
            }
            q.handle_outcome(Ok(()));
            shapes.push(keys);
        }
        assert_eq!(shapes, vec![vec!["a", "b"], vec!["c"], vec!["d"]]);
    }

    /// A burst whose first write begins the transaction before the rest are queued runs ceil(n / cap)
    /// transactions, not one more: the rest join the transaction the first write began.
    #[test]
    fn a_burst_runs_ceil_n_over_cap_transactions() {
        for (cap, n) in [(1usize, 5usize), (16, 500), (256, 2000), (2000, 2000)] {
            let mut q: Queue<usize> = Queue::new(cap, 0);
            let mut sizes = Vec::new();
            let mut current = 0usize;
            let mut pushed = 0usize;
            let mut done = 0usize;
            // The writer pushes one write per drain step; the drain begins as soon as the first is queued
            // and commits whenever it seals.
            while done < n {
                if pushed < n {
                    q.handle_write(w("k"), pushed).unwrap();
                    pushed += 1;
                }
                let step = match q.phase() {
                    Phase::Idle => q.poll_begin(),
                    Phase::Producing => q.poll_step(),
                    Phase::Sealed => {
                        q.handle_outcome(Ok(()));
                        sizes.push(std::mem::take(&mut current));
                        while q.poll_outcome().is_some() {
                            done += 1;
                        }
                        continue;
                    }
                };
                if let Some(Step::Send(ws)) = step {
                    current += ws.len();
                }
            }
            assert_eq!(sizes.len(), n.div_ceil(cap), "cap {cap}: {sizes:?}");
            assert!(sizes.iter().all(|&s| s <= cap && s > 0), "cap {cap}");
            assert_eq!(q.transactions(), n.div_ceil(cap) as u64);
        }
    }

    /// A fenced or aborted transaction fails only its own waiters and leaves the queue usable; a fatal or
    /// outcome-unknown one closes it, failing what is queued and refusing new work with the same cause.
    #[test]
    fn fenced_leaves_the_queue_usable_fatal_and_unknown_close_it() {
        for k in [FailureKind::Fenced, FailureKind::Aborted] {
            let mut q = Q::new(256, 3);
            q.handle_write(w("a"), "a").unwrap();
            q.poll_begin();
            q.poll_step();
            q.handle_outcome(Err(failed(k)));
            assert_eq!(outcomes(&mut q), BTreeMap::from([("a", Err(Some(k)))]));
            assert_eq!(q.committed(), 3, "a failed transaction commits no offset");
            q.handle_write(w("b"), "b").unwrap();
            assert_eq!(q.poll_begin(), sent(&["b"]));
        }
        for k in [FailureKind::Fatal, FailureKind::OutcomeUnknown] {
            let mut q = Q::new(256, 3);
            q.handle_write(w("a"), "a").unwrap();
            q.poll_begin();
            q.poll_step();
            q.handle_write(w("b"), "b").unwrap();
            q.handle_outcome(Err(failed(k)));
            assert_eq!(
                outcomes(&mut q),
                BTreeMap::from([("a", Err(Some(k))), ("b", Err(Some(k)))])
            );
            let refused = q.handle_write(w("c"), "c").unwrap_err();
            assert_eq!(kind(&Err(refused)), Err(Some(k)));
            assert_eq!(
                q.poll_begin(),
                None,
                "nothing more is sent on a dead producer"
            );
        }
    }

    /// A transaction that fails while still producing (a send failed) fails the writes that joined it, and
    /// the offset requests queued after them (they would cover writes that did not land); a request queued
    /// before those writes still rides in the next transaction.
    #[test]
    fn a_failure_while_producing_fails_the_offsets_that_would_cover_it() {
        let mut q = Q::new(256, 0);
        q.handle_offset(4, "before").unwrap();
        q.handle_write(w("a"), "a").unwrap();
        q.handle_offset(9, "after").unwrap();
        // The transaction begins with `a` (writes first), so `before` has not ridden yet.
        assert_eq!(q.poll_begin(), sent(&["a"]));
        q.handle_outcome(Err(failed(FailureKind::Aborted)));
        assert_eq!(
            outcomes(&mut q),
            BTreeMap::from([
                ("a", Err(Some(FailureKind::Aborted))),
                ("after", Err(Some(FailureKind::Aborted)))
            ])
        );
        assert_eq!(q.poll_begin(), commit(4));
        q.handle_outcome(Ok(()));
        assert_eq!((q.committed(), q.queued_offsets()), (4, 0));
    }

    /// When the driver dies, every waiter hears it, the transaction in flight included, and the queue
    /// refuses new work with the same cause; closing fails only what is queued and lets the transaction
    /// in flight finish.
    #[test]
    fn fail_all_reaches_every_waiter_close_only_the_queued() {
        let died = SnapshotError::DrainDied {
            partition: 0,
            message: "boom".into(),
        };
        let mut q = Q::new(256, 0);
        q.handle_write(w("a"), "a").unwrap();
        q.poll_begin();
        q.handle_write(w("b"), "b").unwrap();
        q.handle_offset(3, "o").unwrap();
        q.fail_all(died.clone());
        assert_eq!(outcomes(&mut q).len(), 3);
        assert!(matches!(
            q.handle_write(w("c"), "c"),
            Err(SnapshotError::DrainDied { .. })
        ));

        let mut q = Q::new(256, 0);
        q.handle_write(w("a"), "a").unwrap();
        q.poll_begin();
        q.handle_write(w("b"), "b").unwrap();
        q.close(SnapshotError::Closed { partition: 0 });
        assert_eq!(outcomes(&mut q).keys().copied().collect::<Vec<_>>(), ["b"]);
        assert_eq!(q.poll_step(), commit(0), "the open transaction goes on");
        q.handle_outcome(Ok(()));
        assert_eq!(outcomes(&mut q), BTreeMap::from([("a", Ok(()))]));
        assert!(q.handle_offset(1, "late").is_err());
    }

    /// What one scripted run saw.
    #[derive(Default, Debug)]
    struct Run {
        /// Per transaction: the writes in it, the offset it sealed with (if it did), the tick it sealed at,
        /// and whether it was the fenced one.
        txns: Vec<(Vec<String>, Option<i64>, usize)>,
        pushed_at: BTreeMap<&'static str, usize>,
        outcome_at: BTreeMap<&'static str, (usize, Result<(), Option<FailureKind>>)>,
    }

    /// Runs `timeline` (pushes at ticks) against a drain that takes one step per tick; transaction number
    /// `fence` (1-based) ends fenced, every other one commits. Then drains to quiescence.
    fn script(cap: usize, events: &[(usize, &'static str)], fence: Option<usize>) -> (Run, Q) {
        let mut q = Q::new(cap, 0);
        let mut run = Run::default();
        let last = events.iter().map(|e| e.0).max().unwrap_or(0);
        let mut tick = 0;
        loop {
            for &(_, name) in events.iter().filter(|e| e.0 == tick) {
                run.pushed_at.insert(name, tick);
                if name.starts_with('o') {
                    q.handle_offset(100, name).unwrap();
                } else {
                    q.handle_write(w(name), name).unwrap();
                }
            }
            let step = match q.phase() {
                Phase::Idle => {
                    let s = q.poll_begin();
                    if s.is_some() {
                        run.txns.push((Vec::new(), None, 0));
                    }
                    s
                }
                Phase::Producing => q.poll_step(),
                Phase::Sealed => {
                    let fenced = fence == Some(run.txns.len());
                    q.handle_outcome(if fenced {
                        Err(failed(FailureKind::Fenced))
                    } else {
                        Ok(())
                    });
                    None
                }
            };
            let txn = run.txns.last_mut();
            match (step, txn) {
                (Some(Step::Send(ws)), Some(t)) => t.0.extend(
                    ws.iter()
                        .map(|w| String::from_utf8(w.write.key.to_vec()).unwrap()),
                ),
                (Some(Step::Commit { offset }), Some(t)) => {
                    t.1 = Some(offset);
                    t.2 = tick;
                }
                _ => {}
            }
            while let Some((t, r)) = q.poll_outcome() {
                assert!(
                    run.outcome_at.insert(t, (tick, kind(&r))).is_none(),
                    "{t} twice"
                );
            }
            tick += 1;
            if tick > last
                && q.phase() == Phase::Idle
                && q.queued_writes() + q.queued_offsets() == 0
            {
                break;
            }
            assert!(tick < 100, "the queue never settled");
        }
        (run, q)
    }

    /// Every ordering of a write, an offset commit and a fence, behind an earlier write that may be idle,
    /// producing or sealed when they arrive: every waiter gets exactly one outcome; a committed offset
    /// covers only writes that committed no later than it (never one left behind or fenced); an offset
    /// requested after a write that was fenced before the request was answered fails too; a fence fails
    /// exactly the waiters of its own transaction; and writes join only before their transaction's seal.
    #[test]
    fn every_ordering_of_a_write_an_offset_commit_and_a_fence() {
        let mut runs = 0;
        for cap in [1usize, 2, 256] {
            for fence in [None, Some(1), Some(2), Some(3)] {
                for tw in 0..6 {
                    for to in 0..6 {
                        for w_first in [true, false] {
                            let mut events = vec![(0, "w0")];
                            if w_first {
                                events.extend([(tw, "w"), (to, "o")]);
                            } else {
                                events.extend([(to, "o"), (tw, "w")]);
                            }
                            let (run, q) = script(cap, &events, fence);
                            check(&run, &q, &events, fence);
                            runs += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(runs, 3 * 4 * 6 * 6 * 2);
    }

    fn check(run: &Run, q: &Q, events: &[(usize, &'static str)], fence: Option<usize>) {
        let ctx = format!("{events:?} fence {fence:?}: {run:?}");
        // Queue order: by tick, then by position in `events` (pushes of one tick go in listed order).
        let order: Vec<&str> = {
            let mut e: Vec<(usize, usize, &str)> = events
                .iter()
                .enumerate()
                .map(|(i, (t, n))| (*t, i, *n))
                .collect();
            e.sort();
            e.into_iter().map(|(_, _, n)| n).collect()
        };
        let pos = |n: &str| order.iter().position(|x| *x == n).unwrap();
        assert_eq!(
            run.outcome_at.len(),
            events.len(),
            "one outcome each: {ctx}"
        );
        let txn_of = |n: &str| run.txns.iter().position(|t| t.0.iter().any(|k| k == n));
        let fenced_txn = fence.map(|f| f - 1);
        for (name, (_, r)) in &run.outcome_at {
            if name.starts_with('w') {
                let t = txn_of(name).expect("every write ran");
                let want = if Some(t) == fenced_txn {
                    Err(Some(FailureKind::Fenced))
                } else {
                    Ok(())
                };
                assert_eq!(*r, want, "{name}: {ctx}");
                assert!(
                    run.pushed_at[name] <= run.txns[t].2,
                    "{name} joined after the seal: {ctx}"
                );
                assert!(run.txns[t].0.len() <= q.cap, "{ctx}");
            }
        }
        let o_ok = run.outcome_at["o"].1.is_ok();
        // The transaction that committed the offset: the first committed one sealed with it.
        let committed_with_o = run
            .txns
            .iter()
            .enumerate()
            .position(|(i, t)| t.1 == Some(100) && Some(i) != fenced_txn);
        for wname in order.iter().filter(|n| n.starts_with('w')) {
            if pos(wname) > pos("o") {
                continue;
            }
            let (w_at, w_r) = &run.outcome_at[wname];
            if o_ok {
                let k = committed_with_o.expect("an ok offset was committed by some transaction");
                let t = txn_of(wname).unwrap();
                if w_r.is_err() {
                    // Only a request made after the failure was answered is the caller's own choice.
                    assert!(
                        run.pushed_at["o"] > *w_at,
                        "o committed over failed {wname}: {ctx}"
                    );
                } else {
                    assert!(t <= k, "o committed ahead of {wname}: {ctx}");
                }
            } else if w_r.is_ok() {
                // o failed although every write before it committed: only its own transaction's fence
                // may do that.
                let (o_at, o_r) = &run.outcome_at["o"];
                assert_eq!(*o_r, Err(Some(FailureKind::Fenced)), "{ctx}");
                let _ = (o_at, w_at);
            } else {
                // The covered write failed: o must fail unless it was requested after that failure was
                // delivered.
                assert!(run.pushed_at["o"] <= *w_at, "{ctx}");
            }
        }
        assert_eq!(q.committed(), if o_ok { 100 } else { 0 }, "{ctx}");
        assert_eq!(q.queued_writes() + q.queued_offsets(), 0, "{ctx}");
    }
}
