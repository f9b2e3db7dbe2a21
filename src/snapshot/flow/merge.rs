//! The merge of one partition's co-partitioned inputs into the single sequence its fold core folds,
//! with no I/O and no clock.
//!
//! # Method kinds and call order
//! - **`handle_*`**, input: `handle_batch` (records fetched from one input, with its end as the fetch
//!   saw it), `handle_fetched_to` (the consumer's fetch position of an input that delivered nothing:
//!   invisible records, markers and compacted gaps move it without a batch), `handle_end` (an input's
//!   end read some other way, as at takeover);
//! - **`poll_*`**, output: `poll_step` (the next event or position move, or `None` while the merge must
//!   wait for an input's records);
//! - **queries**: `buffered`.
//!
//! # The order
//! The next event is the head with the smallest `(timestamp, input index)` among the inputs' heads, as
//! Kafka Streams picks among a task's partitions. The choice depends only on the heads, so the merge
//! from a given vector of positions is one fixed sequence, whatever the fetches' sizes and timing, as
//! long as it never chooses while an input's head is missing. It waits for an input with no record
//! buffered unless that input is *caught up*: its fetch position has reached its end as last seen. A
//! caught-up input is passed over; if a record it receives later is older than events already merged,
//! a replay from before that point orders them differently (docs/fencing.md, "Several inputs").
//!
//! A replay starts from committed offsets that are a point on the merge (the core commits only the
//! positions some held change started at, or its current positions), so with every input's records
//! present it walks the same sequence.

use std::collections::VecDeque;

use crate::records::Record;

/// One step of the merged sequence.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Step {
    /// Fold this record of input `.0`.
    Event(usize, Record),
    /// Input `.0` has nothing visible below `.1`: move its position there.
    ReadTo(usize, i64),
}

#[derive(Debug, Default)]
struct Input {
    /// Fetched records not handed out yet, each with the number of the batch that brought it.
    records: VecDeque<(u64, Record)>,
    /// The position after everything handed out or buffered: where the next fetched record can start.
    fetched_to: i64,
    /// The position after everything handed out.
    handed_to: i64,
    /// The input's end (high watermark or last stable offset, as its isolation reads) as last seen;
    /// `None` until one is known.
    end: Option<i64>,
    /// The batch count when `end` was learnt: an end read before another input's records were fetched
    /// may be stale by the time they are merged.
    end_seen: u64,
}

impl Input {
    /// Nothing buffered, and fetched up to its end as last seen no earlier than batch `since`.
    fn caught_up_since(&self, since: u64) -> bool {
        self.records.is_empty()
            && self.end_seen >= since
            && self.end.is_some_and(|end| self.fetched_to >= end)
    }
}

/// The merge of one partition's inputs.
#[derive(Debug)]
pub(crate) struct Merge {
    inputs: Vec<Input>,
    /// Batches handled so far.
    batches: u64,
}

impl Merge {
    /// Inputs starting at `positions` (in the flow's input order).
    pub(crate) fn new(positions: &[i64]) -> Self {
        Merge {
            inputs: positions
                .iter()
                .map(|p| Input {
                    fetched_to: *p,
                    handed_to: *p,
                    ..Input::default()
                })
                .collect(),
            batches: 0,
        }
    }

    /// Records fetched from input `input`, in offset order, then the position after them and the
    /// input's end as that fetch saw it. Records below what is already buffered are ignored.
    pub(crate) fn handle_batch(
        &mut self,
        input: usize,
        records: impl IntoIterator<Item = Record>,
        next_offset: i64,
        end: i64,
    ) {
        let Some(i) = self.inputs.get_mut(input) else {
            return;
        };
        self.batches += 1;
        for r in records {
            if r.offset >= i.fetched_to {
                i.fetched_to = r.offset + 1;
                i.records.push_back((self.batches, r));
            }
        }
        i.fetched_to = i.fetched_to.max(next_offset);
        i.end = Some(i.end.map_or(end, |e| e.max(end)));
        i.end_seen = self.batches;
    }

    /// The consumer's fetch position of input `input` moved to `next_offset` without delivering.
    pub(crate) fn handle_fetched_to(&mut self, input: usize, next_offset: i64) {
        if let Some(i) = self.inputs.get_mut(input) {
            i.fetched_to = i.fetched_to.max(next_offset);
        }
    }

    /// Input `input`'s end, read outside a fetch (a ListOffsets, at takeover or asked for by
    /// [`stale_ends`](Self::stale_ends)) after every batch handled so far was fetched.
    pub(crate) fn handle_end(&mut self, input: usize, end: i64) {
        if let Some(i) = self.inputs.get_mut(input) {
            i.end = Some(i.end.map_or(end, |e| e.max(end)));
            i.end_seen = self.batches;
        }
    }

    /// The inputs the merge waits on only because their end may be stale: nothing buffered, fetched up
    /// to their end as last seen, but that end was seen before the newest record another input has
    /// buffered was fetched. The driver reads their ends again ([`handle_end`](Self::handle_end)).
    pub(crate) fn stale_ends(&self) -> Vec<usize> {
        let newest = self.newest_head();
        if newest == 0 {
            return Vec::new();
        }
        self.inputs
            .iter()
            .enumerate()
            .filter(|(_, i)| {
                i.records.is_empty()
                    && i.end_seen < newest
                    && i.end.is_none_or(|end| i.fetched_to >= end)
            })
            .map(|(n, _)| n)
            .collect()
    }

    /// The batch number of the newest head record (0 when nothing is buffered).
    fn newest_head(&self) -> u64 {
        self.inputs
            .iter()
            .filter_map(|i| i.records.front().map(|(seen, _)| *seen))
            .max()
            .unwrap_or(0)
    }

    /// Drops input `input`'s buffered records from offset `from` on (to bound memory while another
    /// input is awaited; the caller fetches them again from `from`).
    pub(crate) fn handle_unfetch(&mut self, input: usize, from: i64) {
        if let Some(i) = self.inputs.get_mut(input) {
            while i.records.back().is_some_and(|(_, r)| r.offset >= from) {
                i.records.pop_back();
            }
            i.fetched_to = i.fetched_to.min(from).max(i.handed_to);
        }
    }

    /// Records buffered for input `input`.
    #[cfg(test)]
    pub(crate) fn buffered(&self, input: usize) -> usize {
        self.inputs.get(input).map_or(0, |i| i.records.len())
    }

    /// When input `input` has more than `keep` records buffered, drops the rest and returns the offset
    /// to fetch them again from.
    pub(crate) fn trim(&mut self, input: usize, keep: usize) -> Option<i64> {
        let from = self.inputs.get(input)?.records.get(keep)?.1.offset;
        self.handle_unfetch(input, from);
        Some(from)
    }

    /// The next step, or `None` while an input that is not caught up has no record buffered (or there
    /// is nothing at all).
    pub(crate) fn poll_step(&mut self) -> Option<Step> {
        // Positions first: an input with nothing buffered can move to where its fetch reached.
        for (n, i) in self.inputs.iter_mut().enumerate() {
            if i.records.is_empty() && i.fetched_to > i.handed_to {
                i.handed_to = i.fetched_to;
                return Some(Step::ReadTo(n, i.fetched_to));
            }
        }
        let newest = self.newest_head();
        let mut best: Option<(i64, usize)> = None;
        for (n, i) in self.inputs.iter().enumerate() {
            match i.records.front() {
                Some((_, r)) => {
                    if best.is_none_or(|(t, _)| r.timestamp < t) {
                        best = Some((r.timestamp, n));
                    }
                }
                // Passed over only when its end was seen after the records it is passed over for
                // were fetched: a record it got meanwhile would be waited for.
                None if i.caught_up_since(newest) => {}
                None => return None,
            }
        }
        let (_, n) = best?;
        let i = &mut self.inputs[n];
        let (_, r) = i.records.pop_front()?;
        i.handed_to = r.offset + 1;
        Some(Step::Event(n, r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn rec(offset: i64, ts: i64) -> Record {
        Record {
            offset,
            timestamp: ts,
            timestamp_type: crate::records::TimestampType::CreateTime,
            key: Some(Bytes::from_static(b"k")),
            value: None,
            headers: Vec::new(),
        }
    }

    fn drain(m: &mut Merge) -> Vec<(usize, i64)> {
        let mut out = Vec::new();
        while let Some(s) = m.poll_step() {
            if let Step::Event(i, r) = s {
                out.push((i, r.offset));
            }
        }
        out
    }

    /// [`drain`], reading the ends the merge asks for again from `ends` (as the driver's ListOffsets
    /// does) whenever it stops on them.
    fn drain_with(m: &mut Merge, ends: &[i64]) -> Vec<(usize, i64)> {
        let mut out = drain(m);
        loop {
            let stale = m.stale_ends();
            if stale.is_empty() {
                return out;
            }
            for i in stale {
                m.handle_end(i, ends[i]);
            }
            out.extend(drain(m));
        }
    }

    #[test]
    fn picks_the_oldest_head_and_breaks_ties_by_input_order() {
        let mut m = Merge::new(&[0, 0]);
        m.handle_batch(0, [rec(0, 5), rec(1, 7)], 2, 2);
        m.handle_batch(1, [rec(0, 5), rec(1, 6)], 2, 2);
        assert_eq!(drain(&mut m), [(0, 0), (1, 0), (1, 1), (0, 1)]);
    }

    #[test]
    fn waits_for_an_input_that_is_behind_and_passes_over_one_caught_up() {
        let mut m = Merge::new(&[0, 0]);
        m.handle_end(1, 3);
        m.handle_batch(0, [rec(0, 9)], 1, 1);
        assert_eq!(m.poll_step(), None, "input 1 has records not fetched yet");
        m.handle_batch(1, [rec(0, 1), rec(2, 10)], 3, 3);
        // Input 0's end was seen before input 1's records came: read again, it is still 1.
        assert_eq!(drain(&mut m), [(1, 0), (0, 0)]);
        assert_eq!(m.stale_ends(), [0]);
        m.handle_end(0, 1);
        assert_eq!(drain(&mut m), [(1, 2)]);
        // Input 0 is caught up: input 1's later records go without it, once its end is confirmed.
        m.handle_batch(1, [rec(3, 11)], 4, 4);
        assert_eq!(drain_with(&mut m, &[1, 4]), [(1, 3)]);
        // And it is waited for when the end read again shows more.
        m.handle_batch(1, [rec(4, 12)], 5, 5);
        assert_eq!(drain(&mut m), []);
        m.handle_end(0, 2);
        assert_eq!(drain(&mut m), []);
        m.handle_batch(0, [rec(1, 11)], 2, 2);
        assert_eq!(drain(&mut m), [(0, 1), (1, 4)]);
    }

    #[test]
    fn an_input_with_no_known_end_is_waited_for() {
        let mut m = Merge::new(&[0, 0]);
        m.handle_batch(0, [rec(0, 1)], 1, 1);
        assert_eq!(m.poll_step(), None);
        m.handle_end(1, 0);
        assert_eq!(drain(&mut m), [(0, 0)]);
    }

    #[test]
    fn invisible_records_move_a_position_without_a_batch() {
        let mut m = Merge::new(&[0, 0]);
        m.handle_end(1, 5);
        m.handle_batch(0, [rec(0, 1)], 1, 1);
        assert_eq!(m.poll_step(), None);
        m.handle_fetched_to(1, 5);
        assert_eq!(m.poll_step(), Some(Step::ReadTo(1, 5)));
        assert_eq!(drain_with(&mut m, &[1, 5]), [(0, 0)]);
    }

    #[test]
    fn records_dropped_to_bound_memory_come_back_in_place() {
        let mut m = Merge::new(&[0, 0]);
        m.handle_end(1, 1);
        m.handle_batch(0, (0..10).map(|o| rec(o, o)), 10, 10);
        m.handle_unfetch(0, 4);
        assert_eq!(m.buffered(0), 4);
        m.handle_batch(1, [rec(0, 6)], 1, 1);
        // Input 0's records from 4 on must be fetched again before it counts as caught up.
        let first = drain(&mut m);
        assert_eq!(first, [(0, 0), (0, 1), (0, 2), (0, 3)]);
        m.handle_batch(0, (4..10).map(|o| rec(o, o)), 10, 10);
        // Input 1's record ties with input 0's offset 6 (timestamp 6): input order breaks the tie.
        assert_eq!(
            drain_with(&mut m, &[10, 1]),
            [(0, 4), (0, 5), (0, 6), (1, 0), (0, 7), (0, 8), (0, 9)]
        );
    }

    /// Whatever the batch sizes and the order in which inputs are fetched, the merge of complete logs
    /// is one sequence, and starting it at any point of that sequence gives the rest of it.
    #[test]
    fn the_merged_order_depends_on_the_logs_alone() {
        let mut seed = 0x5eed_u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for _ in 0..200 {
            let logs: Vec<Vec<Record>> = (0..3)
                .map(|_| {
                    let len = next(12) as i64;
                    (0..len).map(|o| rec(o * 2, next(20) as i64 - 1)).collect()
                })
                .collect();
            let ends: Vec<i64> = logs.iter().map(|l| l.len() as i64 * 2).collect();
            let run = |start: &[i64], next: &mut dyn FnMut(u64) -> u64| {
                let mut m = Merge::new(start);
                let mut at: Vec<usize> = logs
                    .iter()
                    .zip(start)
                    .map(|(l, s)| l.iter().take_while(|r| r.offset < *s).count())
                    .collect();
                for (i, end) in ends.iter().enumerate() {
                    m.handle_end(i, *end);
                    if at[i] == logs[i].len() {
                        // Nothing left to fetch: the consumer's position moves to the end unseen.
                        m.handle_fetched_to(i, *end);
                    }
                }
                let mut out = Vec::new();
                loop {
                    out.extend(drain_with(&mut m, &ends));
                    let open: Vec<usize> = (0..logs.len())
                        .filter(|i| at[*i] < logs[*i].len())
                        .collect();
                    if open.is_empty() {
                        out.extend(drain_with(&mut m, &ends));
                        return out;
                    }
                    let i = open[next(open.len() as u64) as usize];
                    let take = 1 + next(4) as usize;
                    let batch: Vec<Record> = logs[i][at[i]..].iter().take(take).cloned().collect();
                    at[i] += batch.len();
                    let next_offset = logs[i].get(at[i]).map_or(ends[i], |r| r.offset);
                    m.handle_batch(i, batch, next_offset, ends[i]);
                }
            };
            let whole = run(&[0, 0, 0], &mut next);
            assert_eq!(whole.len(), logs.iter().map(Vec::len).sum::<usize>());
            assert_eq!(
                whole,
                run(&[0, 0, 0], &mut next),
                "same logs, other batches"
            );
            // From the positions after any prefix of the sequence, the rest of it.
            let cut = next(whole.len() as u64 + 1) as usize;
            let mut start = vec![0i64; 3];
            for (i, o) in &whole[..cut] {
                start[*i] = o + 1;
            }
            assert_eq!(run(&start, &mut next), whole[cut..]);
        }
    }
}

/// The merge and the fold core together, as a several-input partition runs them: whatever the fetches,
/// waves, commits and crashes, an owner that recovers from the snapshots and replays from the committed
/// offsets ends with each key's fold of its events in the merged order of the complete logs. The fold
/// is a hash chain over the events it sees, so an event folded twice, lost or folded out of that order
/// shows.
#[cfg(test)]
mod simulation {
    use std::collections::HashMap;

    use bytes::{BufMut, Bytes, BytesMut};

    use super::{Merge, Step};
    use crate::records::{Record, TimestampType};
    use crate::snapshot::fold::{Change, Fold, Outputs};
    use crate::snapshot::fold_core::tests::Rng;
    use crate::snapshot::fold_core::{open_envelope, Landing, Opened, PartitionCore, Wave};

    struct Chain;

    impl Fold for Chain {
        type State = u64;
        fn fold(&self, _: &Bytes, state: &mut Option<u64>, e: &Record, _: &mut Outputs) -> Change {
            match e.value.as_deref() {
                // The delete depends on the state, so a replay onto a wrong state shows.
                Some(b"del") if state.is_some_and(|h| h % 3 != 0) => Change::Delete,
                Some(b"del") if state.is_none() => Change::Keep,
                v => {
                    let h = state.get_or_insert(7);
                    for b in v.unwrap_or_default() {
                        *h = h.wrapping_mul(0x100_0000_01b3) ^ u64::from(*b);
                    }
                    Change::Update
                }
            }
        }
        fn encode(&self, s: &u64) -> Bytes {
            let mut b = BytesMut::new();
            b.put_u64(*s);
            b.freeze()
        }
        fn decode(&self, b: &[u8]) -> Result<u64, crate::snapshot::BoxError> {
            Ok(u64::from_be_bytes(b.try_into()?))
        }
    }

    fn logs(rng: &mut Rng, inputs: usize) -> Vec<Vec<Record>> {
        (0..inputs)
            .map(|i| {
                let mut offset = 0;
                (0..rng.below(25))
                    .map(|_| {
                        // Gaps, as aborted batches, markers and compaction leave.
                        offset += 1 + rng.below(3) as i64;
                        let key = ["a", "b", "c"][rng.below(3) as usize];
                        let value = if rng.below(5) == 0 {
                            "del".to_owned()
                        } else {
                            format!("{i}:{offset}")
                        };
                        Record {
                            offset,
                            timestamp: rng.below(30) as i64 - 2,
                            timestamp_type: TimestampType::CreateTime,
                            key: Some(Bytes::copy_from_slice(key.as_bytes())),
                            value: Some(value.into()),
                            headers: Vec::new(),
                        }
                    })
                    .collect()
            })
            .collect()
    }

    fn end_of(log: &[Record]) -> i64 {
        log.last().map_or(0, |r| r.offset + 1 + 2)
    }

    /// The snapshots that landed and the committed offsets.
    struct Durable {
        log: HashMap<Bytes, Option<Bytes>>,
        committed: Vec<i64>,
    }

    impl Durable {
        fn apply(&mut self, wave: &Wave) {
            for w in &wave.writes {
                self.log.insert(w.key.clone(), w.value.clone());
            }
        }

        fn recover(&self) -> PartitionCore<u64> {
            let mut core = PartitionCore::new_inputs(&self.committed);
            for (k, v) in &self.log {
                let Some(v) = v else { continue };
                match open_envelope(v).unwrap() {
                    Opened::LiveInputs(o, p) => core.restore_inputs(
                        &Chain,
                        k.clone(),
                        Some(Chain.decode(p).unwrap()),
                        &o.iter().collect::<Vec<_>>(),
                    ),
                    Opened::GraveInputs(o) => {
                        core.restore_inputs(&Chain, k.clone(), None, &o.iter().collect::<Vec<_>>())
                    }
                    other => panic!("a several-input core wrote {other:?}"),
                }
            }
            core
        }

        fn states(&self) -> Vec<(Bytes, u64)> {
            let core = self.recover();
            let mut s: Vec<(Bytes, u64)> = core.states().map(|(k, v)| (k.clone(), *v)).collect();
            s.sort();
            s
        }
    }

    /// A member's reading side: where it has fetched each input to, and its merge.
    struct Reading {
        merge: Merge,
        fetched: Vec<usize>,
    }

    impl Reading {
        fn at(logs: &[Vec<Record>], positions: &[i64]) -> Reading {
            let mut merge = Merge::new(positions);
            let fetched = logs
                .iter()
                .zip(positions)
                .map(|(l, p)| l.iter().take_while(|r| r.offset < *p).count())
                .collect();
            for (i, l) in logs.iter().enumerate() {
                merge.handle_end(i, end_of(l));
            }
            Reading { merge, fetched }
        }

        fn fetch(&mut self, logs: &[Vec<Record>], i: usize, n: usize) {
            let log = &logs[i];
            let batch: Vec<Record> = log[self.fetched[i]..].iter().take(n).cloned().collect();
            self.fetched[i] += batch.len();
            let next = log.get(self.fetched[i]).map_or(end_of(log), |r| r.offset);
            if batch.is_empty() {
                self.merge.handle_fetched_to(i, next);
            } else {
                self.merge.handle_batch(i, batch, next, end_of(log));
            }
        }

        fn step(&mut self, logs: &[Vec<Record>], core: &mut PartitionCore<u64>) -> bool {
            // The driver reads an end again when the merge stops on it.
            for i in self.merge.stale_ends() {
                self.merge.handle_end(i, end_of(&logs[i]));
            }
            match self.merge.poll_step() {
                Some(Step::Event(i, r)) => {
                    core.handle_event_from(&Chain, i, &r);
                    true
                }
                Some(Step::ReadTo(i, next)) => {
                    core.handle_read_to_from(i, next);
                    true
                }
                None => false,
            }
        }
    }

    fn expected(logs: &[Vec<Record>]) -> Vec<(Bytes, u64)> {
        let mut r = Reading::at(logs, &vec![0; logs.len()]);
        for i in 0..logs.len() {
            r.fetch(logs, i, usize::MAX);
        }
        let mut states: HashMap<Bytes, Option<u64>> = HashMap::new();
        for (i, log) in logs.iter().enumerate() {
            r.merge.handle_end(i, end_of(log));
        }
        while let Some(step) = r.merge.poll_step() {
            if let Step::Event(_, e) = step {
                let key = e.key.clone().unwrap();
                let s = states.entry(key).or_default();
                if Chain.fold(&e.key.clone().unwrap(), s, &e, &mut Outputs::default())
                    == Change::Delete
                {
                    *s = None;
                }
            }
        }
        let mut s: Vec<(Bytes, u64)> = states
            .into_iter()
            .filter_map(|(k, v)| Some((k, v?)))
            .collect();
        s.sort();
        s
    }

    fn event(offset: i64, key: &str, value: &str) -> Record {
        Record {
            offset,
            timestamp: offset,
            timestamp_type: TimestampType::CreateTime,
            key: Some(Bytes::copy_from_slice(key.as_bytes())),
            value: Some(Bytes::copy_from_slice(value.as_bytes())),
            headers: Vec::new(),
        }
    }

    /// A grave written past the committed offsets is recovered with its per-input offsets: its replayed
    /// events are skipped, and its tombstone waits until every input is committed past them (a
    /// tombstone before that would let a second restart replay the key's events onto nothing).
    #[test]
    fn a_recovered_grave_waits_for_every_input_to_be_committed_past_it() {
        let k = Bytes::from_static(b"k");
        let mut durable = Durable {
            log: HashMap::new(),
            committed: vec![0, 0],
        };
        let mut core = durable.recover();
        assert_eq!(
            core.handle_event_from(&Chain, 0, &event(0, "k", "x")),
            crate::snapshot::fold_core::Folded::Changed
        );
        core.handle_event_from(&Chain, 1, &event(0, "other", "y"));
        core.handle_event_from(&Chain, 0, &event(1, "k", "del"));
        assert!(core.state_of(&k).is_none(), "deleted");
        let w = core.poll_wave(&Chain).unwrap();
        durable.apply(&w);
        // Crash before any commit: the grave accounts for input 0 to 1 and input 1 to 0.
        let mut core = durable.recover();
        assert_eq!(core.position(), 0);
        let w = core.poll_wave(&Chain);
        assert!(
            w.is_none_or(|w| w.writes.iter().all(|x| x.key != k)),
            "no tombstone before a commit passes the grave"
        );
        core.handle_event_from(&Chain, 0, &event(0, "k", "x"));
        // Committed past input 0's first event only: still no tombstone.
        let offset = core.committable();
        assert_eq!(core.commit_offsets(offset), vec![1, 0]);
        core.handle_commit_landed(offset);
        assert!(!core.tombstones_due());
        core.handle_event_from(&Chain, 1, &event(0, "other", "y"));
        core.handle_event_from(&Chain, 0, &event(1, "k", "del"));
        assert!(
            core.state_of(&k).is_none(),
            "the replay skipped what the grave covers"
        );
        let offset = core.committable();
        assert_eq!(core.commit_offsets(offset), vec![2, 1]);
        core.handle_commit_landed(offset);
        assert!(core.tombstones_due());
        let w = core.poll_wave(&Chain).unwrap();
        assert!(w.writes.iter().any(|x| x.key == k && x.value.is_none()));
    }

    /// A commit asked for at one point of the merge that lands after the member folded on records the
    /// offsets it carried, not where the inputs stand at its landing: a recovered grave's tombstone
    /// waits for what the group really has.
    #[test]
    fn a_commit_that_lands_after_more_folding_counts_what_it_carried() {
        let k = Bytes::from_static(b"k");
        let mut durable = Durable {
            log: HashMap::new(),
            committed: vec![0, 0],
        };
        let mut core = durable.recover();
        core.handle_event_from(&Chain, 0, &event(0, "k", "x"));
        core.handle_event_from(&Chain, 0, &event(1, "k", "del"));
        let w = core.poll_wave(&Chain).unwrap();
        durable.apply(&w);
        // Crash before any commit: the grave accounts for input 0 to 1.
        let mut core = durable.recover();
        core.handle_event_from(&Chain, 0, &event(0, "k", "x"));
        let asked = core.committable();
        let carried = core.commit_offsets(asked);
        assert_eq!(carried, vec![1, 0]);
        // The member folds on while the commit is in flight, past the grave.
        core.handle_event_from(&Chain, 0, &event(1, "k", "del"));
        core.handle_event_from(&Chain, 1, &event(0, "other", "y"));
        core.handle_commit_landed(asked);
        assert!(
            !core.tombstones_due(),
            "the group has [1, 0]: a replay from there still reaches the key's delete"
        );
        let w = core.poll_wave(&Chain);
        assert!(w.is_none_or(|w| w.writes.iter().all(|x| x.key != k)));
        // Held: `other`'s change at input 1's first event, so the commit stops there.
        let offset = core.committable();
        assert_eq!(core.commit_offsets(offset), vec![2, 0]);
        core.handle_commit_landed(offset);
        assert!(core.tombstones_due());
    }

    #[test]
    fn crashes_and_replays_recover_the_merged_fold_of_every_input() {
        for seed in 1..=400u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let inputs = 2 + rng.below(2) as usize;
            let logs = logs(&mut rng, inputs);
            let mut durable = Durable {
                log: HashMap::new(),
                committed: vec![0; inputs],
            };
            let mut core = durable.recover();
            let mut reading = Reading::at(&logs, &durable.committed);
            let mut wave: Option<Wave> = None;
            let mut commit: Option<(i64, Vec<i64>)> = None;
            for _ in 0..300 {
                match rng.below(9) {
                    0 | 1 => {
                        let i = rng.below(inputs as u64) as usize;
                        let n = rng.below(5) as usize;
                        reading.fetch(&logs, i, n);
                    }
                    2 | 3 => {
                        reading.step(&logs, &mut core);
                    }
                    4 => {
                        if wave.is_none() {
                            wave = core.poll_wave(&Chain);
                        }
                    }
                    5 => {
                        if let Some(w) = wave.take() {
                            let (landed, told) = match rng.below(4) {
                                0 => (false, Landing::Failed),
                                1 => (true, Landing::Failed),
                                _ => (true, Landing::Landed),
                            };
                            if landed {
                                durable.apply(&w);
                            }
                            core.handle_wave_outcome(w.id, told);
                        }
                    }
                    // A commit is asked for, and lands later: the member may fold on meanwhile.
                    6 => {
                        if commit.is_none() {
                            let offset = core.committable();
                            commit = Some((offset, core.commit_offsets(offset)));
                        }
                    }
                    7 => {
                        if let Some((offset, vector)) = commit.take() {
                            // Commits only move forward on every input.
                            for (d, v) in durable.committed.iter_mut().zip(&vector) {
                                assert!(*v >= *d, "seed {seed}: commit {vector:?} goes back");
                                *d = *v;
                            }
                            core.handle_commit_landed(offset);
                        }
                    }
                    _ => {
                        if let Some(w) = wave.take() {
                            if rng.below(2) == 0 {
                                durable.apply(&w);
                            }
                        }
                        if let Some((_, vector)) = commit.take() {
                            if rng.below(2) == 0 {
                                durable.committed = vector;
                            }
                        }
                        core = durable.recover();
                        reading = Reading::at(&logs, &durable.committed);
                    }
                }
            }
            if let Some(w) = wave.take() {
                core.handle_wave_outcome(w.id, Landing::Failed);
            }
            drop(commit);
            for i in 0..inputs {
                reading.fetch(&logs, i, usize::MAX);
                reading.fetch(&logs, i, usize::MAX);
            }
            while reading.step(&logs, &mut core) {}
            for _ in 0..2 {
                if let Some(w) = core.poll_wave(&Chain) {
                    durable.apply(&w);
                    core.handle_wave_outcome(w.id, Landing::Landed);
                }
                let offset = core.committable();
                durable.committed = core.commit_offsets(offset);
                core.handle_commit_landed(offset);
            }
            let ends: Vec<i64> = logs.iter().map(|l| end_of(l)).collect();
            assert_eq!(durable.committed, ends, "seed {seed}");
            assert_eq!(durable.states(), expected(&logs), "seed {seed}");
        }
    }
}
