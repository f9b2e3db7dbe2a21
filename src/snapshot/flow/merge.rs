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
    records: VecDeque<Record>,
    /// The position after everything handed out or buffered: where the next fetched record can start.
    fetched_to: i64,
    /// The position after everything handed out.
    handed_to: i64,
    /// The input's end (high watermark or last stable offset, as its isolation reads) as last seen;
    /// `None` until one is known.
    end: Option<i64>,
}

impl Input {
    fn caught_up(&self) -> bool {
        self.records.is_empty() && self.end.is_some_and(|end| self.fetched_to >= end)
    }
}

/// The merge of one partition's inputs.
#[derive(Debug)]
pub(crate) struct Merge {
    inputs: Vec<Input>,
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
        for r in records {
            if r.offset >= i.fetched_to {
                i.fetched_to = r.offset + 1;
                i.records.push_back(r);
            }
        }
        i.fetched_to = i.fetched_to.max(next_offset);
        i.end = Some(i.end.map_or(end, |e| e.max(end)));
    }

    /// The consumer's fetch position of input `input` moved to `next_offset` without delivering.
    pub(crate) fn handle_fetched_to(&mut self, input: usize, next_offset: i64) {
        if let Some(i) = self.inputs.get_mut(input) {
            i.fetched_to = i.fetched_to.max(next_offset);
        }
    }

    /// Input `input`'s end, read outside a fetch (a ListOffsets at takeover).
    pub(crate) fn handle_end(&mut self, input: usize, end: i64) {
        if let Some(i) = self.inputs.get_mut(input) {
            i.end = Some(i.end.map_or(end, |e| e.max(end)));
        }
    }

    /// Drops input `input`'s buffered records from offset `from` on (to bound memory while another
    /// input is awaited; the caller fetches them again from `from`).
    pub(crate) fn handle_unfetch(&mut self, input: usize, from: i64) {
        if let Some(i) = self.inputs.get_mut(input) {
            while i.records.back().is_some_and(|r| r.offset >= from) {
                i.records.pop_back();
            }
            i.fetched_to = i.fetched_to.min(from).max(i.handed_to);
        }
    }

    /// Records buffered for input `input`.
    pub(crate) fn buffered(&self, input: usize) -> usize {
        self.inputs.get(input).map_or(0, |i| i.records.len())
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
        let mut best: Option<(i64, usize)> = None;
        for (n, i) in self.inputs.iter().enumerate() {
            match i.records.front() {
                Some(r) => {
                    if best.is_none_or(|(t, _)| r.timestamp < t) {
                        best = Some((r.timestamp, n));
                    }
                }
                None if i.caught_up() => {}
                None => return None,
            }
        }
        let (_, n) = best?;
        let i = &mut self.inputs[n];
        let r = i.records.pop_front()?;
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
        assert_eq!(drain(&mut m), [(1, 0), (0, 0), (1, 2)]);
        // Input 0 is caught up now: input 1's later records go without it.
        m.handle_batch(1, [rec(3, 11)], 4, 4);
        assert_eq!(drain(&mut m), [(1, 3)]);
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
        assert_eq!(drain(&mut m), [(0, 0)]);
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
            drain(&mut m),
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
                    out.extend(drain(&mut m));
                    let open: Vec<usize> = (0..logs.len()).filter(|i| at[*i] < logs[*i].len()).collect();
                    if open.is_empty() {
                        out.extend(drain(&mut m));
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
            assert_eq!(whole, run(&[0, 0, 0], &mut next), "same logs, other batches");
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
