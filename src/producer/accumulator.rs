//! Per-partition batching with a linger and a size bound, inside a bounded amount of memory.
//!
//! Records wait here until their partition's batch is full, its linger has passed, or a flush asks for
//! everything now. Memory is reserved when a record is appended and given back only when its batch is
//! completed (acknowledged or failed), not when it is drained into a request: a batch in flight still
//! occupies memory, and so the buffer bound covers everything the producer holds, which is what makes
//! `send` back-pressure real.
//!
//! No I/O, no clock: `now` comes in, the next instant something becomes ready goes out.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use super::sequence_core::BatchId;
use super::{ProducerRecord, TopicPartition};

/// Bytes a v2 record batch spends on its header, whatever its records.
pub(crate) const BATCH_OVERHEAD: usize = 61;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AccumulatorConfig {
    /// A batch closes once it holds this many bytes (a single larger record gets a batch of its own).
    pub(crate) batch_size: usize,
    /// How long a batch waits for company before it is ready.
    pub(crate) linger: Duration,
    /// All records held, batched or in flight, stay under this many bytes.
    pub(crate) buffer_memory: usize,
    /// No single batch may exceed this (the request size the broker accepts).
    pub(crate) max_request_size: usize,
}

/// One batch of records for one partition.
#[derive(Debug)]
pub(crate) struct Batch<T> {
    pub(crate) id: BatchId,
    pub(crate) partition: TopicPartition,
    /// Records in append order, each with whatever the producer uses to report its outcome.
    pub(crate) records: Vec<(ProducerRecord, T)>,
    /// Bytes reserved for this batch; give them back with [`Accumulator::release`].
    pub(crate) reserved: usize,
    /// The first record's timestamp, from which the others' are encoded as deltas.
    base_timestamp: i64,
    pub(crate) created: Instant,
    /// Closed batches take no more records (full, or handed back for re-sequencing).
    closed: bool,
}

impl<T> Batch<T> {
    pub(crate) fn len(&self) -> usize {
        self.records.len()
    }
}

/// Why a record was not appended. The record and its completion come back with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AppendError {
    /// Not enough free memory now; retry after some is released.
    Full { requested: usize, available: usize },
    /// The record will never fit.
    TooLarge { size: usize, limit: usize },
}

#[derive(Debug)]
pub(crate) struct Accumulator<T> {
    config: AccumulatorConfig,
    queues: BTreeMap<TopicPartition, VecDeque<Batch<T>>>,
    used: usize,
    next_id: BatchId,
    /// Every batch with an id up to this one is ready regardless of linger.
    flush_upto: Option<BatchId>,
}

impl<T> Accumulator<T> {
    pub(crate) fn new(config: AccumulatorConfig) -> Self {
        Accumulator {
            config,
            queues: BTreeMap::new(),
            used: 0,
            next_id: 1,
            flush_upto: None,
        }
    }

    /// Bytes reserved now.
    #[cfg(test)]
    pub(crate) fn used(&self) -> usize {
        self.used
    }

    /// Appends `record` (its partition already chosen) to `tp`'s open batch or a new one. On failure the
    /// record and completion come back untouched, so a waiting `send` can try again later.
    // The record comes back by value on the (rare) full path so a waiting send retries without a copy.
    #[allow(clippy::type_complexity, clippy::result_large_err)]
    pub(crate) fn append(
        &mut self,
        tp: &TopicPartition,
        record: ProducerRecord,
        completion: T,
        now: Instant,
    ) -> Result<BatchId, (AppendError, ProducerRecord, T)> {
        // Sizes are exact (as the encoder will write the record: its offset and timestamp deltas depend
        // on the batch), so a batch fills up to `batch_size` and memory accounting matches the bytes.
        let timestamp = record.timestamp.unwrap_or(0);
        let alone = record.encoded_size(0, timestamp);
        let limit = self.config.buffer_memory.min(self.config.max_request_size);
        if alone + BATCH_OVERHEAD > limit {
            return Err((
                AppendError::TooLarge {
                    size: alone + BATCH_OVERHEAD,
                    limit,
                },
                record,
                completion,
            ));
        }
        let queue = self.queues.entry(tp.clone()).or_default();
        let in_open = queue
            .back()
            .filter(|b| !b.closed)
            .map(|b| {
                (
                    b.reserved,
                    record.encoded_size(b.records.len(), b.base_timestamp),
                )
            })
            .filter(|(reserved, size)| {
                reserved + size <= self.config.batch_size
                    && reserved + size <= self.config.max_request_size
            });
        let fits_open = in_open.is_some();
        let size = in_open.map_or(alone, |(_, size)| size);
        let needed = if fits_open {
            size
        } else {
            size + BATCH_OVERHEAD
        };
        let available = self.config.buffer_memory.saturating_sub(self.used);
        if needed > available {
            if queue.is_empty() {
                self.queues.remove(tp);
            }
            return Err((
                AppendError::Full {
                    requested: needed,
                    available,
                },
                record,
                completion,
            ));
        }
        self.used += needed;
        if !fits_open {
            if let Some(open) = queue.back_mut() {
                open.closed = true;
            }
            queue.push_back(Batch {
                id: self.next_id,
                partition: tp.clone(),
                records: Vec::new(),
                reserved: BATCH_OVERHEAD,
                base_timestamp: timestamp,
                created: now,
                closed: false,
            });
            self.next_id += 1;
        }
        let batch = queue.back_mut().expect("a batch was just ensured");
        batch.reserved += size;
        batch.records.push((record, completion));
        // Full once another record like this one would not fit: ready now rather than at its linger.
        if batch.reserved + size > self.config.batch_size {
            batch.closed = true;
        }
        Ok(batch.id)
    }

    fn head_ready(&self, b: &Batch<T>, now: Instant) -> bool {
        b.closed
            || now >= b.created + self.config.linger
            || self.flush_upto.is_some_and(|f| b.id <= f)
    }

    /// Partitions whose oldest batch may be sent now.
    pub(crate) fn ready(&self, now: Instant) -> Vec<TopicPartition> {
        self.queues
            .iter()
            .filter(|(_, q)| q.front().is_some_and(|b| self.head_ready(b, now)))
            .map(|(tp, _)| tp.clone())
            .collect()
    }

    /// When the next not-yet-ready batch becomes ready by linger, if any.
    pub(crate) fn next_ready_at(&self, now: Instant) -> Option<Instant> {
        self.queues
            .values()
            .filter_map(|q| q.front())
            .filter(|b| !self.head_ready(b, now))
            .map(|b| b.created + self.config.linger)
            .min()
    }

    /// The bytes reserved for `tp`'s oldest batch, if it has one.
    pub(crate) fn head_bytes(&self, tp: &TopicPartition) -> Option<usize> {
        self.queues.get(tp)?.front().map(|b| b.reserved)
    }

    /// Whether `tp`'s oldest batch may be sent now.
    pub(crate) fn is_ready(&self, tp: &TopicPartition, now: Instant) -> bool {
        self.queues
            .get(tp)
            .and_then(VecDeque::front)
            .is_some_and(|b| self.head_ready(b, now))
    }

    /// Takes out the batches, oldest first per partition, created at or before `cutoff` (their delivery
    /// time ran out before they were ever sent).
    pub(crate) fn take_created_before(&mut self, cutoff: Instant) -> Vec<Batch<T>> {
        let mut out = Vec::new();
        self.queues.retain(|_, q| {
            while q.front().is_some_and(|b| b.created <= cutoff) {
                out.extend(q.pop_front());
            }
            !q.is_empty()
        });
        out
    }

    /// The creation time of the oldest waiting batch.
    pub(crate) fn oldest_created(&self) -> Option<Instant> {
        self.queues
            .values()
            .filter_map(|q| q.front().map(|b| b.created))
            .min()
    }

    /// Whether any waiting batch has an id at or below `id`.
    pub(crate) fn holds_batch_up_to(&self, id: BatchId) -> bool {
        self.queues.values().flatten().any(|b| b.id <= id)
    }

    /// Takes `tp`'s oldest batch (ready or not: the caller decides). Its memory stays reserved.
    pub(crate) fn drain(&mut self, tp: &TopicPartition) -> Option<Batch<T>> {
        let q = self.queues.get_mut(tp)?;
        let b = q.pop_front();
        if q.is_empty() {
            self.queues.remove(tp);
        }
        b
    }

    /// Puts batches back at the front of their partition's queue, in the given order, closed: they are
    /// to be re-sequenced and sent before anything appended after them.
    pub(crate) fn requeue_front(&mut self, batches: Vec<Batch<T>>) {
        for mut b in batches.into_iter().rev() {
            b.closed = true;
            self.queues
                .entry(b.partition.clone())
                .or_default()
                .push_front(b);
        }
    }

    /// Gives back the memory of a completed batch.
    pub(crate) fn release(&mut self, reserved: usize) {
        debug_assert!(reserved <= self.used);
        self.used = self.used.saturating_sub(reserved);
    }

    /// Makes every batch that exists now ready, whatever its linger. Returns the newest such batch id, so
    /// the caller can tell when the flush is complete (every batch up to it completed).
    pub(crate) fn flush(&mut self) -> Option<BatchId> {
        let newest = self.next_id.checked_sub(1).filter(|&id| id > 0)?;
        self.flush_upto = Some(newest);
        Some(newest)
    }

    /// Takes every batch out (for a transaction abort or a fatal error). Memory stays reserved until
    /// each is released.
    pub(crate) fn take_all(&mut self) -> Vec<Batch<T>> {
        std::mem::take(&mut self.queues)
            .into_values()
            .flatten()
            .collect()
    }

    /// Whether no batch is waiting.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.queues.is_empty()
    }

    /// Batches waiting (not yet drained).
    #[cfg(test)]
    pub(crate) fn batches_waiting(&self) -> usize {
        self.queues.values().map(VecDeque::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn cfg() -> AccumulatorConfig {
        AccumulatorConfig {
            batch_size: 1000,
            linger: Duration::from_millis(10),
            buffer_memory: 4000,
            max_request_size: 2000,
        }
    }

    fn rec(n: usize) -> ProducerRecord {
        ProducerRecord::new("t", Some(Bytes::from(vec![b'x'; n])))
    }

    fn tp(p: i32) -> TopicPartition {
        TopicPartition::new("t", p)
    }

    /// Records for one partition share a batch until the next would overflow batch_size; the full batch
    /// is ready at once while the new one waits out its linger.
    #[test]
    fn records_share_a_batch_until_it_is_full() {
        let t0 = Instant::now();
        let mut acc = Accumulator::new(cfg());
        let a = acc.append(&tp(0), rec(400), 1, t0).unwrap();
        let b = acc.append(&tp(0), rec(400), 2, t0).unwrap();
        assert_eq!(a, b);
        // The third no longer fits under batch_size: a new batch, and the first one is ready at once.
        let c = acc.append(&tp(0), rec(400), 3, t0).unwrap();
        assert_ne!(a, c);
        assert_eq!(acc.ready(t0), vec![tp(0)]);
        let first = acc.drain(&tp(0)).unwrap();
        assert_eq!(first.len(), 2);
        assert_eq!(
            first.records.iter().map(|(_, c)| *c).collect::<Vec<_>>(),
            vec![1, 2]
        );
        // The open second batch waits for its linger.
        assert!(acc.ready(t0).is_empty());
        assert_eq!(acc.next_ready_at(t0), Some(t0 + Duration::from_millis(10)));
        assert_eq!(acc.ready(t0 + Duration::from_millis(10)), vec![tp(0)]);
    }

    /// What a batch reserves is what the encoder writes, whatever the records' offset and timestamp
    /// deltas, keys and headers: a batch fills up to `batch_size`, not to a bound below it.
    #[test]
    fn a_batch_reserves_exactly_the_bytes_it_encodes_to() {
        use crate::producer::encoder::RecordsEncoder;
        use crate::producer::produce_core::BatchEncoder;
        let t0 = Instant::now();
        let mut acc = Accumulator::new(AccumulatorConfig {
            batch_size: 64 * 1024,
            linger: Duration::from_millis(10),
            buffer_memory: 1 << 20,
            max_request_size: 1 << 20,
        });
        let mut ids = Vec::new();
        for i in 0..300u32 {
            let mut r = rec((i as usize * 37) % 700)
                .timestamp(1_700_000_000_000 + i64::from(i) * 97 - 5_000);
            if i % 3 == 0 {
                r = r.key(vec![b'k'; (i as usize) % 200]);
            }
            if i % 5 == 0 {
                r = r.header("h", Some(Bytes::from(vec![b'v'; (i as usize) % 50])));
                r = r.header("empty", None);
            }
            ids.push(acc.append(&tp(0), r, i, t0).unwrap());
        }
        ids.dedup();
        assert!(ids.len() > 1, "the records spread over several batches");
        let mut encoder = RecordsEncoder {
            compression: crate::records::Compression::None,
        };
        while let Some(batch) = acc.drain(&tp(0)) {
            let records: Vec<&ProducerRecord> = batch.records.iter().map(|(r, _)| r).collect();
            let ids = crate::producer::ProducerIdEpoch { id: 1, epoch: 0 };
            let bytes = encoder.encode(&records, ids, 0, false).unwrap();
            assert_eq!(batch.reserved, bytes.len(), "batch {}", batch.id);
            assert!(batch.reserved <= 64 * 1024);
        }
    }

    /// Linger counts from each batch's first record, so one partition's batch never hurries or holds up
    /// another's.
    #[test]
    fn linger_is_per_batch_and_partitions_are_independent() {
        let t0 = Instant::now();
        let mut acc = Accumulator::new(cfg());
        acc.append(&tp(0), rec(10), (), t0).unwrap();
        acc.append(&tp(1), rec(10), (), t0 + Duration::from_millis(5))
            .unwrap();
        assert!(acc.ready(t0 + Duration::from_millis(9)).is_empty());
        assert_eq!(acc.ready(t0 + Duration::from_millis(10)), vec![tp(0)]);
        assert_eq!(
            acc.next_ready_at(t0 + Duration::from_millis(10)),
            Some(t0 + Duration::from_millis(15))
        );
    }

    /// The buffer bound is what back-pressures `send`: a full buffer refuses, hands the record back, and
    /// accepts again only once a completed batch gives its memory back (not when it is merely drained).
    #[test]
    fn memory_is_bounded_until_batches_complete() {
        let t0 = Instant::now();
        let mut acc = Accumulator::new(cfg());
        let mut appended = 0;
        let err = loop {
            match acc.append(&tp(appended % 4), rec(900), appended, t0) {
                Ok(_) => appended += 1,
                Err(e) => break e,
            }
        };
        assert_eq!(appended, 4);
        let (
            AppendError::Full {
                requested,
                available,
            },
            back,
            completion,
        ) = err
        else {
            panic!("expected Full, got {err:?}");
        };
        assert!(requested > available);
        assert_eq!(completion, 4);
        assert_eq!(back.value.as_ref().map(Bytes::len), Some(900));
        assert!(acc.used() <= 4000);
        // Draining alone frees nothing.
        let b = acc.drain(&tp(0)).unwrap();
        assert!(acc.append(&tp(0), rec(900), 9, t0).is_err());
        acc.release(b.reserved);
        assert!(acc.append(&tp(0), rec(900), 9, t0).is_ok());
    }

    /// A record larger than a request can carry is refused as too large and reserves no memory.
    #[test]
    fn a_record_that_can_never_fit_is_too_large() {
        let mut acc = Accumulator::<()>::new(cfg());
        let Err((e, _, _)) = acc.append(&tp(0), rec(2500), (), Instant::now()) else {
            panic!("a 2500-byte record cannot fit a 2000-byte request");
        };
        assert!(matches!(e, AppendError::TooLarge { limit: 2000, .. }));
        assert!(acc.is_empty());
        assert_eq!(acc.used(), 0);
    }

    /// A record larger than batch_size but within the request limit is sent in a batch of its own, and
    /// the records after it start a new one.
    #[test]
    fn an_oversized_record_gets_a_batch_of_its_own() {
        let t0 = Instant::now();
        let mut acc = Accumulator::new(cfg());
        let a = acc.append(&tp(0), rec(10), 0, t0).unwrap();
        let b = acc.append(&tp(0), rec(1500), 1, t0).unwrap();
        let c = acc.append(&tp(0), rec(10), 2, t0).unwrap();
        assert!(a != b && b != c);
        assert_eq!(acc.batches_waiting(), 3);
    }

    /// Flush makes every existing batch ready without waiting for its linger, but not batches created
    /// after it.
    #[test]
    fn flush_makes_existing_batches_ready_now() {
        let t0 = Instant::now();
        let mut acc = Accumulator::new(cfg());
        acc.append(&tp(0), rec(10), (), t0).unwrap();
        acc.append(&tp(1), rec(10), (), t0).unwrap();
        assert!(acc.ready(t0).is_empty());
        let upto = acc.flush().unwrap();
        assert_eq!(acc.ready(t0), vec![tp(0), tp(1)]);
        assert_eq!(upto, 2);
        // A batch created after the flush lingers as usual.
        acc.drain(&tp(0));
        acc.drain(&tp(1));
        acc.append(&tp(0), rec(10), (), t0).unwrap();
        assert!(acc.ready(t0).is_empty());
    }

    /// A requeued batch goes out before newer batches without lingering, and later appends never join
    /// it.
    #[test]
    fn requeued_batches_go_first_and_closed() {
        let t0 = Instant::now();
        let mut acc = Accumulator::new(cfg());
        acc.append(&tp(0), rec(10), 1, t0).unwrap();
        let b1 = acc.drain(&tp(0)).unwrap();
        acc.append(&tp(0), rec(10), 2, t0).unwrap();
        acc.requeue_front(vec![b1]);
        assert_eq!(
            acc.ready(t0),
            vec![tp(0)],
            "a requeued batch does not linger"
        );
        let again = acc.drain(&tp(0)).unwrap();
        assert_eq!(again.records[0].1, 1);
        // Appends do not join a requeued batch.
        acc.requeue_front(vec![again]);
        acc.append(&tp(0), rec(10), 3, t0).unwrap();
        let all = acc.take_all();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].len(), 1);
        assert_eq!(all[1].len(), 2);
    }
}
