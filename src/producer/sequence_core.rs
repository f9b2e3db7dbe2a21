//! Idempotence bookkeeping: per-partition sequence numbers and the window of batches in flight.
//!
//! # Method kinds and call order
//! Called by the producer core only: `assign` when a new batch leaves the accumulator (`can_send_new`
//! first), `poll_resend` for what must go again, `handle_outcome` with every answer (or its lack),
//! `give_up` when a batch's delivery timeout passes; `resolved_broken` / `take_requeue` /
//! `bump_local_epoch` / `adopt` / `reset` when the epoch changes.
//!
//! The broker deduplicates a producer's writes per partition by (producer id, epoch, sequence) and
//! remembers the last five batches, so the producer keeps at most five batches in flight per partition,
//! and a retry resends the very same bytes with the very same sequence: if the first attempt was written,
//! the retry is acknowledged as a duplicate; if not, it is written now. Either way exactly once.
//!
//! The hard part is to keep "the broker may have written it" apart from "the broker did not write it":
//!
//! - A batch whose request got no answer (timeout, dropped connection) *may* have been written. It is
//!   resent as is. If the producer has to give up on it, its outcome is unknown, never "failed".
//! - A batch answered with a definite error (too large, invalid) was not written, and because sequences
//!   must be contiguous, nothing behind it in the window can be written either: the partition's sequence
//!   is *broken* until an epoch bump starts it again at 0.
//! - OUT_OF_ORDER_SEQUENCE_NUMBER / UNKNOWN_PRODUCER_ID on the *first* batch in flight, for an attempt
//!   that was sent when it already was the first, is a real gap (the broker's last sequence is not the
//!   one before it). On a later batch, or on an attempt sent while a predecessor was still out (up to
//!   five requests per partition are in flight, and a predecessor's retry may be answered first over a
//!   new connection), it only means a predecessor had not landed yet, so that batch is retried too.
//!
//! - The broker enforces all of this only once it keeps state for the producer id on the partition.
//!   Without state (a producer it has never seen there, or one whose state expired or went with the
//!   log's segments) it takes the first batch at *any* sequence. If that batch is refused for a passing
//!   reason (not enough replicas, a leader not yet ready) and the one behind it arrives next, the second
//!   is written first and the pair is out of order for good. So a partition sends one batch at a time
//!   until the broker has acknowledged one of this producer id's batches there (and again after
//!   [`CONFIRMATION_TTL`] without an acknowledgement); only then are up to five in flight.
//! - Should the broker lose that state anyway and write a later batch ahead of an earlier one, the
//!   earlier one comes back OUT_OF_ORDER with a later batch already acknowledged. Resending it under a
//!   new epoch would write it after its successor, so it fails instead ([`Resolution::OrderLost`]).
//!
//! Once a broken partition has heard back about every batch in its window, the batches known not to be
//! written are handed back to be re-sequenced under a new epoch (the idempotent producer bumps its epoch
//! itself; a transactional one aborts and bumps through InitProducerId, KIP-360). Partitions that were
//! not broken keep their old epoch until their window drains, then start at 0 under the new one, so a
//! partition never has two epochs in flight.
//!
//! # References
//! - KIP-98 (idempotent producer: producer id, epoch, sequence; five batches remembered)
//! - KIP-360 (UNKNOWN_PRODUCER_ID handling, epoch bumps)
//! - Message format v2: `baseSequence` wraps from `i32::MAX` to 0

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::TopicPartition;

/// A producer id and epoch: the identity the broker deduplicates and fences by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProducerIdEpoch {
    /// The producer id.
    pub id: i64,
    /// The producer epoch.
    pub epoch: i16,
}

impl std::fmt::Display for ProducerIdEpoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.id, self.epoch)
    }
}

/// The most batches in flight per partition the broker's duplicate detection covers.
pub(crate) const MAX_IN_FLIGHT: usize = 5;

/// How long the broker's state for this producer on a partition is trusted after its last
/// acknowledgement there. Kafka drops an idle producer's state after `producer.id.expiration.ms`
/// (a day by default); past this much quiet a partition sends one batch alone again, which costs one
/// round trip and nothing else.
pub(crate) const CONFIRMATION_TTL: Duration = Duration::from_secs(300);

/// The producer's handle on one batch, stable across retries.
pub(crate) type BatchId = u64;

/// `seq + n` in the sequence space, which wraps from `i32::MAX` to 0.
pub(crate) fn seq_add(seq: i32, n: i32) -> i32 {
    debug_assert!(seq >= 0 && n >= 0);
    ((i64::from(seq) + i64::from(n)) % (i64::from(i32::MAX) + 1)) as i32
}

/// What came back for one attempt of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Written (or acknowledged as a duplicate of a written batch).
    Acked,
    /// A definite, transient error: not written by this attempt.
    Retriable,
    /// No answer: this attempt may have been written.
    NoAnswer,
    /// OUT_OF_ORDER_SEQUENCE_NUMBER or UNKNOWN_PRODUCER_ID.
    SequenceBroken,
    /// INVALID_PRODUCER_EPOCH: the partition has a newer epoch; not written.
    StaleEpoch,
    /// A definite, permanent error: not written, never will be.
    Rejected,
}

/// What the producer must do with the batch after an [`Outcome`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resolution {
    /// Complete the batch successfully.
    Done,
    /// Resend the same bytes (the batch will come out of [`Sequencer::poll_resend`]).
    Resend,
    /// Fail the batch: it was not written.
    Failed,
    /// Fail the batch: it was not written, and a later batch of its partition already was (the broker
    /// had lost its state for this producer and took the later one first). Written now it would land
    /// out of order, so it is not retried.
    OrderLost,
    /// Fail the batch as outcome-unknown: it may have been written and cannot be retried safely.
    Unknown,
    /// Not written, and it can be re-sequenced under a new epoch once the partition is resolved; keep it.
    Held,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EntryState {
    /// Sent; waiting for the answer.
    InFlight,
    /// Waiting to be resent with its sequence.
    Resend,
    /// Known not written; waiting for the epoch bump.
    NotWritten,
}

#[derive(Debug, Clone)]
struct Entry {
    id: BatchId,
    base_seq: i32,
    count: i32,
    state: EntryState,
    /// Some attempt went unanswered, so the broker may hold it.
    maybe_written: bool,
    /// The latest attempt left while an older batch of the partition was still unacknowledged. Its
    /// OUT_OF_ORDER answer may then be about that predecessor not having landed *yet* (its answer, or
    /// its retry's, can arrive first over another connection), so it is never read as a gap.
    sent_behind: bool,
    /// A later batch of the partition was acknowledged while this one was not.
    later_acked: bool,
}

#[derive(Debug, Clone)]
struct PartitionSeq {
    /// The ids this partition's sequences belong to.
    ids: ProducerIdEpoch,
    next_seq: i32,
    /// In sequence order.
    window: VecDeque<Entry>,
    /// A gap or a stale epoch: nothing new goes out until an epoch bump.
    broken: Option<ProducerIdEpoch>,
    /// When the broker last acknowledged a batch of this producer id here: it keeps state for the
    /// producer and enforces the sequence, so more than one batch may be in flight.
    confirmed: Option<(i64, Instant)>,
}

/// A batch the sequencer hands back after a partition was resolved, to be re-sequenced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Requeue {
    pub(crate) partition: TopicPartition,
    /// In their original order.
    pub(crate) batches: Vec<BatchId>,
}

/// Sequence numbers and in-flight windows for every partition of one producer.
#[derive(Debug, Clone)]
pub(crate) struct Sequencer {
    ids: ProducerIdEpoch,
    max_in_flight: usize,
    partitions: HashMap<TopicPartition, PartitionSeq>,
    /// Whether a partition sends one batch alone until the broker has acknowledged one (always, but
    /// the window tests below switch it off to look at the window rules by themselves).
    confirm_first: bool,
}

impl Sequencer {
    pub(crate) fn new(ids: ProducerIdEpoch, max_in_flight: usize) -> Self {
        Sequencer {
            ids,
            max_in_flight: max_in_flight.clamp(1, MAX_IN_FLIGHT),
            partitions: HashMap::new(),
            confirm_first: true,
        }
    }

    /// The producer's current ids.
    pub(crate) fn ids(&self) -> ProducerIdEpoch {
        self.ids
    }

    fn part(&mut self, tp: &TopicPartition) -> &mut PartitionSeq {
        let ids = self.ids;
        self.partitions
            .entry(tp.clone())
            .or_insert_with(|| PartitionSeq {
                ids,
                next_seq: 0,
                window: VecDeque::new(),
                broken: None,
                confirmed: None,
            })
    }

    /// Whether a new batch may be sequenced for `tp` now: the window has room, no retry is waiting (retries
    /// go first, in order), the sequence is not broken, and the partition is on the current epoch or can
    /// move to it because nothing is in flight; beyond the first batch in flight, the broker must be
    /// known to keep state for this producer here (see the module docs).
    pub(crate) fn can_send_new(&self, tp: &TopicPartition, now: Instant) -> bool {
        let Some(p) = self.partitions.get(tp) else {
            return true;
        };
        if p.broken.is_some() {
            return false;
        }
        if p.ids != self.ids {
            return p.window.is_empty();
        }
        let trusted = !self.confirm_first
            || p.confirmed.is_some_and(|(id, at)| {
                id == self.ids.id && now.saturating_duration_since(at) < CONFIRMATION_TTL
            });
        let room = if trusted { self.max_in_flight } else { 1 };
        p.window.len() < room && p.window.iter().all(|e| e.state == EntryState::InFlight)
    }

    /// Gives a new batch of `count` records its sequence and marks it in flight. Call only when
    /// [`Sequencer::can_send_new`] says so. Returns the ids and base sequence to write into the batch.
    pub(crate) fn assign(
        &mut self,
        tp: &TopicPartition,
        id: BatchId,
        count: i32,
    ) -> (ProducerIdEpoch, i32) {
        debug_assert!(count > 0);
        let ids = self.ids;
        let p = self.part(tp);
        if p.ids != ids && p.window.is_empty() {
            p.ids = ids;
            p.next_seq = 0;
        }
        let base = p.next_seq;
        p.next_seq = seq_add(base, count);
        let sent_behind = !p.window.is_empty();
        p.window.push_back(Entry {
            id,
            base_seq: base,
            count,
            state: EntryState::InFlight,
            maybe_written: false,
            sent_behind,
            later_acked: false,
        });
        (p.ids, base)
    }

    /// The next batch to resend on `tp`, in sequence order, marked in flight again. Nothing is resent on
    /// a broken partition: its fate is decided by the epoch bump.
    pub(crate) fn poll_resend(&mut self, tp: &TopicPartition) -> Option<BatchId> {
        let p = self.partitions.get_mut(tp)?;
        if p.broken.is_some() {
            return None;
        }
        let pos = p
            .window
            .iter()
            .position(|e| e.state != EntryState::InFlight)?;
        let e = &mut p.window[pos];
        if e.state != EntryState::Resend {
            return None;
        }
        e.state = EntryState::InFlight;
        e.sent_behind = pos > 0;
        Some(e.id)
    }

    /// Records what came back for an attempt of batch `id` and says what to do with it.
    pub(crate) fn handle_outcome(
        &mut self,
        tp: &TopicPartition,
        id: BatchId,
        outcome: Outcome,
        now: Instant,
    ) -> Resolution {
        let ids = self.ids;
        let p = self.part(tp);
        let Some(pos) = p.window.iter().position(|e| e.id == id) else {
            // Not ours any more (the window was reset by an epoch change); nothing to decide.
            return Resolution::Failed;
        };
        // Only an attempt that left as the oldest unacknowledged batch can prove a gap: everything before
        // it had been acknowledged when it was sent, so the broker's refusal is about the log itself.
        let first = pos == 0 && !p.window[pos].sent_behind;
        let broken = p.broken.is_some();
        let entry = &mut p.window[pos];
        match outcome {
            Outcome::Acked => {
                p.window.remove(pos);
                for earlier in p.window.range_mut(..pos) {
                    earlier.later_acked = true;
                }
                p.confirmed = Some((p.ids.id, now));
                Resolution::Done
            }
            Outcome::Retriable | Outcome::NoAnswer => {
                if outcome == Outcome::NoAnswer {
                    entry.maybe_written = true;
                }
                if broken {
                    // Behind a gap nothing can have been written in this epoch... unless an earlier
                    // attempt went unanswered, in which case it may have landed before the gap.
                    Self::hold_or_unknown(p, pos)
                } else {
                    entry.state = EntryState::Resend;
                    Resolution::Resend
                }
            }
            Outcome::SequenceBroken if entry.later_acked => {
                // Refused as out of order although a later batch was written: the broker took that
                // one first. There is no gap to close, only a batch that can no longer be in order.
                p.window.remove(pos);
                Resolution::OrderLost
            }
            Outcome::SequenceBroken if !first && !broken => {
                // A predecessor is still in flight or being retried: this is the broker refusing to skip
                // ahead, not a gap. Resend after it.
                entry.state = EntryState::Resend;
                Resolution::Resend
            }
            Outcome::SequenceBroken | Outcome::StaleEpoch => {
                p.broken.get_or_insert(ids);
                Self::hold_or_unknown(p, pos)
            }
            Outcome::Rejected => {
                let e = p.window.remove(pos).expect("position is in range");
                Self::close_hole(p, &e, ids);
                Resolution::Failed
            }
        }
    }

    /// A batch known not written left the window. If it was the newest, the broker's next expected
    /// sequence is simply its base again; otherwise everything behind it sits after a gap.
    fn close_hole(p: &mut PartitionSeq, gone: &Entry, ids: ProducerIdEpoch) {
        let newest = seq_add(gone.base_seq, gone.count) == p.next_seq;
        if newest && p.broken.is_none() {
            p.next_seq = gone.base_seq;
        } else {
            p.broken.get_or_insert(ids);
        }
    }

    fn hold_or_unknown(p: &mut PartitionSeq, pos: usize) -> Resolution {
        if p.window[pos].maybe_written {
            p.window.remove(pos);
            Resolution::Unknown
        } else {
            p.window[pos].state = EntryState::NotWritten;
            Resolution::Held
        }
    }

    /// The producer gives up on batch `id` between attempts (its delivery timeout passed). Returns
    /// `Unknown` if any attempt may have been written, `Failed` otherwise. Either way the sequence now has
    /// a hole, so the partition is broken until the next epoch.
    pub(crate) fn give_up(&mut self, tp: &TopicPartition, id: BatchId) -> Resolution {
        let ids = self.ids;
        let p = self.part(tp);
        let Some(pos) = p.window.iter().position(|e| e.id == id) else {
            return Resolution::Failed;
        };
        let e = p.window.remove(pos).expect("position is in range");
        if e.maybe_written || e.state == EntryState::InFlight {
            // It may be in the log: the sequence after it is unknowable until an epoch bump.
            p.broken.get_or_insert(ids);
            Resolution::Unknown
        } else {
            Self::close_hole(p, &e, ids);
            Resolution::Failed
        }
    }

    /// Whether `tp` is broken and still waiting for answers before it can be resolved.
    pub(crate) fn is_broken(&self, tp: &TopicPartition) -> bool {
        self.partitions.get(tp).is_some_and(|p| p.broken.is_some())
    }

    /// Whether any partition's sequence is broken.
    pub(crate) fn any_broken(&self) -> bool {
        self.partitions.values().any(|p| p.broken.is_some())
    }

    /// Broken partitions whose every batch has been heard back about. For each, whether the producer
    /// epoch must still be bumped for it (no bump happened since it broke).
    pub(crate) fn resolved_broken(&self) -> Vec<(TopicPartition, bool)> {
        let mut out: Vec<_> = self
            .partitions
            .iter()
            .filter_map(|(tp, p)| {
                let broke_at = p.broken?;
                let settled = p.window.iter().all(|e| e.state == EntryState::NotWritten);
                settled.then(|| (tp.clone(), broke_at == self.ids))
            })
            .collect();
        out.sort();
        out
    }

    /// Bumps the epoch locally, as the idempotent producer may (the broker accepts a higher epoch starting
    /// at sequence 0). Returns `false` when the epoch is exhausted and a new producer id must be fetched.
    pub(crate) fn bump_local_epoch(&mut self) -> bool {
        if self.ids.epoch == i16::MAX {
            return false;
        }
        self.ids.epoch += 1;
        true
    }

    /// Adopts new ids (from an epoch bump, InitProducerId, or a TV2 EndTxn). Partitions with nothing in
    /// flight start at 0 now; the rest keep their old epoch until their window drains.
    pub(crate) fn adopt(&mut self, ids: ProducerIdEpoch) {
        self.ids = ids;
        for p in self.partitions.values_mut() {
            if p.window.is_empty() && p.broken.is_none() {
                p.ids = ids;
                p.next_seq = 0;
            }
        }
    }

    /// After a bump, takes a resolved broken partition's not-written batches back (in order) for
    /// re-sequencing under the new ids, and clears the partition.
    pub(crate) fn take_requeue(&mut self, tp: &TopicPartition) -> Requeue {
        let ids = self.ids;
        let p = self.part(tp);
        debug_assert!(p.broken.is_some_and(|b| b != ids));
        let batches = p
            .window
            .drain(..)
            .filter(|e| e.state == EntryState::NotWritten)
            .map(|e| e.id)
            .collect();
        p.broken = None;
        p.ids = ids;
        p.next_seq = 0;
        Requeue {
            partition: tp.clone(),
            batches,
        }
    }

    /// Forgets every partition and adopts `ids`: after a transactional abort every batch has been
    /// completed, and InitProducerId (or EndTxn v5) has handed out a fresh epoch.
    pub(crate) fn reset(&mut self, ids: ProducerIdEpoch) {
        self.ids = ids;
        self.partitions.clear();
    }

    /// Batches in flight or waiting on `tp`.
    #[cfg(test)]
    pub(crate) fn in_window(&self, tp: &TopicPartition) -> usize {
        self.partitions.get(tp).map_or(0, |p| p.window.len())
    }

    /// The sequence the next new batch on `tp` will get (for tests and diagnostics).
    #[cfg(test)]
    pub(crate) fn next_seq(&self, tp: &TopicPartition) -> i32 {
        self.partitions.get(tp).map_or(0, |p| p.next_seq)
    }

    /// The base sequence of batch `id` on `tp`, if it is in the window.
    #[cfg(test)]
    pub(crate) fn base_seq(&self, tp: &TopicPartition, id: BatchId) -> Option<i32> {
        self.partitions
            .get(tp)?
            .window
            .iter()
            .find(|e| e.id == id)
            .map(|e| e.base_seq)
    }

    /// The record count of batch `id` on `tp`, if it is in the window.
    #[cfg(test)]
    pub(crate) fn count(&self, tp: &TopicPartition, id: BatchId) -> Option<i32> {
        self.partitions
            .get(tp)?
            .window
            .iter()
            .find(|e| e.id == id)
            .map(|e| e.count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(epoch: i16) -> ProducerIdEpoch {
        ProducerIdEpoch { id: 7, epoch }
    }

    fn tp() -> TopicPartition {
        TopicPartition::new("t", 0)
    }

    fn now() -> Instant {
        Instant::now()
    }

    /// A sequencer that trusts the broker to keep state for the producer from the first batch on, so
    /// the window rules can be looked at by themselves.
    fn trusting(ids: ProducerIdEpoch, max_in_flight: usize) -> Sequencer {
        let mut s = Sequencer::new(ids, max_in_flight);
        s.confirm_first = false;
        s
    }

    /// Each partition numbers its records contiguously from 0, independently of the others, and an
    /// acknowledgement never makes a sequence number be handed out twice.
    #[test]
    fn sequences_are_contiguous_per_partition() {
        let mut s = trusting(ids(0), 5);
        let other = TopicPartition::new("t", 1);
        assert_eq!(s.assign(&tp(), 1, 3), (ids(0), 0));
        assert_eq!(s.assign(&tp(), 2, 2), (ids(0), 3));
        assert_eq!(s.assign(&other, 3, 4), (ids(0), 0));
        assert_eq!(s.next_seq(&tp()), 5);
        assert_eq!(
            s.handle_outcome(&tp(), 1, Outcome::Acked, now()),
            Resolution::Done
        );
        assert_eq!(s.assign(&tp(), 4, 1), (ids(0), 5));
    }

    /// The broker remembers only five batches per producer and partition, so a sixth must wait.
    #[test]
    fn at_most_five_in_flight() {
        let mut s = trusting(ids(0), 5);
        for i in 0..5 {
            assert!(s.can_send_new(&tp(), now()));
            s.assign(&tp(), i, 1);
        }
        assert!(!s.can_send_new(&tp(), now()));
        s.handle_outcome(&tp(), 0, Outcome::Acked, now());
        assert!(s.can_send_new(&tp(), now()));
        // A configured window above five is clamped to five.
        let s = trusting(ids(0), 50);
        assert_eq!(s.max_in_flight, 5);
    }

    /// Until the broker has acknowledged one of the producer's batches on a partition it keeps no state
    /// for it there and would take any sequence first, so the partition sends one batch at a time; after
    /// that acknowledgement the window opens to five, and it closes to one again after a long quiet or
    /// under a new producer id.
    #[test]
    fn one_batch_alone_until_the_broker_knows_the_producer() {
        let t0 = now();
        let mut s = Sequencer::new(ids(0), 5);
        assert!(s.can_send_new(&tp(), t0));
        s.assign(&tp(), 1, 1);
        assert!(
            !s.can_send_new(&tp(), t0),
            "a second batch before any acknowledgement could be written first"
        );
        // A passing refusal leaves the partition unconfirmed: still one at a time.
        assert_eq!(
            s.handle_outcome(&tp(), 1, Outcome::Retriable, t0),
            Resolution::Resend
        );
        assert_eq!(s.poll_resend(&tp()), Some(1));
        assert!(!s.can_send_new(&tp(), t0));
        assert_eq!(
            s.handle_outcome(&tp(), 1, Outcome::Acked, t0),
            Resolution::Done
        );
        for id in 2..7 {
            assert!(s.can_send_new(&tp(), t0), "batch {id} may join the window");
            s.assign(&tp(), id, 1);
        }
        assert!(!s.can_send_new(&tp(), t0), "five is the most");
        for id in 2..7 {
            assert_eq!(
                s.handle_outcome(&tp(), id, Outcome::Acked, t0),
                Resolution::Done
            );
        }
        // Quiet for longer than the broker's state is trusted: one alone again.
        let later = t0 + CONFIRMATION_TTL;
        s.assign(&tp(), 7, 1);
        assert!(!s.can_send_new(&tp(), later));
        assert_eq!(
            s.handle_outcome(&tp(), 7, Outcome::Acked, later),
            Resolution::Done
        );
        // An epoch bump keeps the producer id, and the broker's state with it.
        s.adopt(ids(1));
        s.assign(&tp(), 8, 1);
        assert!(s.can_send_new(&tp(), later));
        assert_eq!(
            s.handle_outcome(&tp(), 8, Outcome::Acked, later),
            Resolution::Done
        );
        // A new producer id is unknown to the broker.
        s.adopt(ProducerIdEpoch { id: 8, epoch: 0 });
        s.assign(&tp(), 9, 1);
        assert!(!s.can_send_new(&tp(), later));
    }

    /// A broker that lost its state for the producer took batch 2 while it refused batch 1 for a passing
    /// reason: 1's resend is refused as out of order behind an acknowledged successor. Written under a new
    /// epoch it would land after 2, so it fails as `OrderLost`, and the partition goes on (it has no gap:
    /// the broker continues from 2).
    #[test]
    fn a_batch_overtaken_by_an_acknowledged_successor_fails_rather_than_land_out_of_order() {
        let mut s = trusting(ids(0), 5);
        s.assign(&tp(), 1, 1);
        s.assign(&tp(), 2, 1);
        assert_eq!(
            s.handle_outcome(&tp(), 1, Outcome::Retriable, now()),
            Resolution::Resend
        );
        assert_eq!(
            s.handle_outcome(&tp(), 2, Outcome::Acked, now()),
            Resolution::Done
        );
        assert_eq!(s.poll_resend(&tp()), Some(1));
        assert_eq!(
            s.handle_outcome(&tp(), 1, Outcome::SequenceBroken, now()),
            Resolution::OrderLost
        );
        assert!(!s.is_broken(&tp()));
        assert_eq!(s.in_window(&tp()), 0);
        assert!(s.can_send_new(&tp(), now()));
        assert_eq!(s.assign(&tp(), 3, 1), (ids(0), 2));
        // Its answer lost rather than refused, batch 1 may have landed before 2: a resend of it is
        // acknowledged as a duplicate, as usual.
        let mut s = trusting(ids(0), 5);
        s.assign(&tp(), 1, 1);
        s.assign(&tp(), 2, 1);
        s.handle_outcome(&tp(), 1, Outcome::NoAnswer, now());
        s.handle_outcome(&tp(), 2, Outcome::Acked, now());
        assert_eq!(s.poll_resend(&tp()), Some(1));
        assert_eq!(
            s.handle_outcome(&tp(), 1, Outcome::Acked, now()),
            Resolution::Done
        );
    }

    /// A retry keeps its sequence (so the broker can deduplicate it), and goes before new batches.
    #[test]
    fn retries_keep_their_sequence_and_go_first() {
        let mut s = trusting(ids(0), 5);
        s.assign(&tp(), 1, 2);
        s.assign(&tp(), 2, 2);
        assert_eq!(
            s.handle_outcome(&tp(), 1, Outcome::NoAnswer, now()),
            Resolution::Resend
        );
        // The second batch is refused as out of order while the first is being retried: not a gap.
        assert_eq!(
            s.handle_outcome(&tp(), 2, Outcome::SequenceBroken, now()),
            Resolution::Resend
        );
        assert!(
            !s.can_send_new(&tp(), now()),
            "new data must wait behind retries"
        );
        assert_eq!(s.poll_resend(&tp()), Some(1));
        assert_eq!(s.base_seq(&tp(), 1), Some(0));
        assert_eq!(s.poll_resend(&tp()), Some(2));
        assert_eq!(s.base_seq(&tp(), 2), Some(2));
        assert_eq!(s.poll_resend(&tp()), None);
        assert_eq!(
            s.handle_outcome(&tp(), 1, Outcome::Acked, now()),
            Resolution::Done
        );
        assert_eq!(
            s.handle_outcome(&tp(), 2, Outcome::Acked, now()),
            Resolution::Done
        );
        assert_eq!(s.assign(&tp(), 3, 1).1, 4);
    }

    /// An OUT_OF_ORDER answer to an attempt sent while a predecessor was unacknowledged is never a gap,
    /// even when the predecessor's retry was acknowledged first and made it the oldest batch: with several
    /// requests in flight, that answer only says the predecessor had not landed yet.
    #[test]
    fn out_of_order_sent_behind_a_predecessor_is_retried_not_a_gap() {
        let mut s = trusting(ids(0), 5);
        s.assign(&tp(), 1, 1);
        s.assign(&tp(), 2, 1);
        // 1's request is lost (its connection reset) and 1 is resent while 2's first attempt is still out.
        assert_eq!(
            s.handle_outcome(&tp(), 1, Outcome::NoAnswer, now()),
            Resolution::Resend
        );
        assert_eq!(s.poll_resend(&tp()), Some(1));
        assert_eq!(
            s.handle_outcome(&tp(), 1, Outcome::Acked, now()),
            Resolution::Done
        );
        // 2's old attempt is answered last: it reached the broker before 1 did.
        assert_eq!(
            s.handle_outcome(&tp(), 2, Outcome::SequenceBroken, now()),
            Resolution::Resend
        );
        assert!(!s.is_broken(&tp()));
        assert_eq!(s.poll_resend(&tp()), Some(2));
        // Resent as the oldest batch, the same answer now is a real gap.
        assert_eq!(
            s.handle_outcome(&tp(), 2, Outcome::SequenceBroken, now()),
            Resolution::Held
        );
        assert!(s.is_broken(&tp()));
    }

    /// OUT_OF_ORDER on the first batch in flight is a real gap: the partition stops until an epoch bump,
    /// and the not-written batches come back, in order, to be re-sequenced from 0.
    #[test]
    fn gap_on_first_batch_breaks_partition_and_requeues_after_bump() {
        let mut s = trusting(ids(0), 5);
        s.assign(&tp(), 1, 1);
        s.assign(&tp(), 2, 1);
        s.assign(&tp(), 3, 1);
        assert_eq!(
            s.handle_outcome(&tp(), 1, Outcome::SequenceBroken, now()),
            Resolution::Held
        );
        assert!(s.is_broken(&tp()));
        assert!(!s.can_send_new(&tp(), now()));
        assert!(
            s.resolved_broken().is_empty(),
            "2 and 3 are still in flight"
        );
        assert_eq!(
            s.handle_outcome(&tp(), 2, Outcome::SequenceBroken, now()),
            Resolution::Held
        );
        // A transient error behind the gap: not written (nothing after a gap is).
        assert_eq!(
            s.handle_outcome(&tp(), 3, Outcome::Retriable, now()),
            Resolution::Held
        );
        assert_eq!(s.resolved_broken(), vec![(tp(), true)]);
        assert!(s.bump_local_epoch());
        assert_eq!(s.ids(), ids(1));
        assert_eq!(s.resolved_broken(), vec![(tp(), false)]);
        let rq = s.take_requeue(&tp());
        assert_eq!(rq.batches, vec![1, 2, 3]);
        assert!(!s.is_broken(&tp()));
        assert_eq!(s.assign(&tp(), 1, 1), (ids(1), 0));
    }

    /// A batch that may have been written is never re-sequenced (that could write it twice): it fails as
    /// outcome-unknown instead.
    #[test]
    fn maybe_written_batch_is_never_requeued() {
        let mut s = trusting(ids(0), 5);
        s.assign(&tp(), 1, 1);
        s.assign(&tp(), 2, 1);
        assert_eq!(
            s.handle_outcome(&tp(), 2, Outcome::NoAnswer, now()),
            Resolution::Resend
        );
        assert_eq!(
            s.handle_outcome(&tp(), 1, Outcome::SequenceBroken, now()),
            Resolution::Held
        );
        assert_eq!(
            s.poll_resend(&tp()),
            None,
            "broken partitions resend nothing"
        );
        // Batch 2 is waiting to be resent and is now behind a gap; when it is given up it is unknown.
        assert_eq!(s.give_up(&tp(), 2), Resolution::Unknown);
        s.bump_local_epoch();
        assert_eq!(s.take_requeue(&tp()).batches, vec![1]);
    }

    /// A batch that may have been written (an attempt went unanswered) and is then answered with a
    /// broken sequence ends outcome unknown, never failed or re-sequenced.
    #[test]
    fn maybe_written_then_gap_is_unknown() {
        let mut s = trusting(ids(0), 5);
        s.assign(&tp(), 1, 1);
        assert_eq!(
            s.handle_outcome(&tp(), 1, Outcome::NoAnswer, now()),
            Resolution::Resend
        );
        assert_eq!(s.poll_resend(&tp()), Some(1));
        assert_eq!(
            s.handle_outcome(&tp(), 1, Outcome::SequenceBroken, now()),
            Resolution::Unknown
        );
        assert_eq!(s.in_window(&tp()), 0);
    }

    /// A definite rejection fails only that batch ("not written"), and breaks the sequence behind it.
    #[test]
    fn rejected_batch_fails_and_breaks_the_rest() {
        let mut s = trusting(ids(0), 5);
        s.assign(&tp(), 1, 1);
        s.assign(&tp(), 2, 1);
        assert_eq!(
            s.handle_outcome(&tp(), 1, Outcome::Rejected, now()),
            Resolution::Failed
        );
        assert!(s.is_broken(&tp()));
        assert_eq!(
            s.handle_outcome(&tp(), 2, Outcome::SequenceBroken, now()),
            Resolution::Held
        );
        assert_eq!(s.resolved_broken(), vec![(tp(), true)]);
    }

    /// Rejecting the newest batch leaves no gap: its sequence is simply reused, no epoch bump needed.
    #[test]
    fn rejected_newest_batch_reuses_its_sequence() {
        let mut s = trusting(ids(0), 5);
        s.assign(&tp(), 1, 2);
        s.assign(&tp(), 2, 3);
        assert_eq!(
            s.handle_outcome(&tp(), 2, Outcome::Rejected, now()),
            Resolution::Failed
        );
        assert!(!s.is_broken(&tp()));
        assert_eq!(s.next_seq(&tp()), 2);
        assert_eq!(s.assign(&tp(), 3, 1), (ids(0), 2));
    }

    /// Giving up between attempts: unknown if an attempt went unanswered, failed if every attempt was
    /// answered with a definite error.
    #[test]
    fn give_up_distinguishes_maybe_written() {
        let mut s = trusting(ids(0), 5);
        s.assign(&tp(), 1, 1);
        s.handle_outcome(&tp(), 1, Outcome::Retriable, now());
        assert_eq!(s.give_up(&tp(), 1), Resolution::Failed);
        let mut s = trusting(ids(0), 5);
        s.assign(&tp(), 1, 1);
        s.handle_outcome(&tp(), 1, Outcome::NoAnswer, now());
        assert_eq!(s.give_up(&tp(), 1), Resolution::Unknown);
        assert!(s.is_broken(&tp()));
    }

    /// A partition never mixes epochs: after new ids arrive, one with batches in flight keeps the old
    /// epoch until they drain, then starts at 0 under the new one.
    #[test]
    fn adoption_waits_for_the_window_to_drain() {
        let mut s = trusting(ids(0), 5);
        let idle = TopicPartition::new("t", 1);
        s.assign(&idle, 9, 4);
        s.handle_outcome(&idle, 9, Outcome::Acked, now());
        s.assign(&tp(), 1, 1);
        s.adopt(ids(1));
        assert!(!s.can_send_new(&tp(), now()));
        assert_eq!(s.assign(&idle, 10, 1), (ids(1), 0));
        s.handle_outcome(&tp(), 1, Outcome::Acked, now());
        assert!(s.can_send_new(&tp(), now()));
        assert_eq!(s.assign(&tp(), 2, 1), (ids(1), 0));
    }

    /// Sequence numbers wrap from i32::MAX to 0, as the broker expects.
    #[test]
    fn sequences_wrap_at_i32_max() {
        assert_eq!(seq_add(i32::MAX, 1), 0);
        assert_eq!(seq_add(i32::MAX - 1, 3), 1);
        assert_eq!(seq_add(5, 3), 8);
    }

    /// At the last epoch the producer cannot bump locally and needs a new producer id, under which
    /// sequences start again at 0.
    #[test]
    fn epoch_exhaustion_needs_a_new_id() {
        let mut s = trusting(
            ProducerIdEpoch {
                id: 1,
                epoch: i16::MAX,
            },
            5,
        );
        assert!(!s.bump_local_epoch());
        s.reset(ProducerIdEpoch { id: 2, epoch: 0 });
        assert_eq!(
            s.assign(&tp(), 1, 1),
            (ProducerIdEpoch { id: 2, epoch: 0 }, 0)
        );
        assert_eq!(s.count(&tp(), 1), Some(1));
    }

    /// An INVALID_PRODUCER_EPOCH answer: the batch was not written and the partition needs the new epoch.
    #[test]
    fn stale_epoch_holds_the_batch() {
        let mut s = trusting(ids(0), 5);
        s.assign(&tp(), 1, 2);
        assert_eq!(
            s.handle_outcome(&tp(), 1, Outcome::StaleEpoch, now()),
            Resolution::Held
        );
        assert!(s.any_broken());
    }
}
