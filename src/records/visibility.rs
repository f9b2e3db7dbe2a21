//! Which records a reader may see: the read_committed filter, and the log's open transactions and LSO.
//!
//! Every reader in the crate (the partition reader, the group consumer, the recovery read, the CLI) goes
//! through [`visible`], so transaction visibility is decided in exactly one place.
//!
//! # References
//! - KIP-98 (transactions, control records, aborted transactions in FetchResponse v4+, LSO)
//! - KIP-447 (the fence this crate's snapshot layer builds on reads with read_committed)
//! - The Java consumer's fetch processing: aborted producer ids collected in first-offset order up to each
//!   batch's last offset, and released by that producer's ABORT marker

use std::collections::{BTreeMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

use bytes::Bytes;

use super::batch::{
    decode_batches, parse_record, ControlMarker, Header, HeaderIter, Record, RecordBatch, Span,
    TimestampType, MIN_RECORD_LEN,
};
use super::compression::{Compression, DEFAULT_MAX_DECOMPRESSED};
use super::error::DecodeError;

/// The isolation level of a read (FetchRequest `isolation_level`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum IsolationLevel {
    /// Every data record up to the high watermark, aborted and unfinished transactions included.
    #[default]
    ReadUncommitted,
    /// Only committed and non-transactional records, up to the last stable offset.
    ReadCommitted,
}

impl IsolationLevel {
    /// The FetchRequest field value (0 or 1).
    pub fn as_i8(self) -> i8 {
        match self {
            IsolationLevel::ReadUncommitted => 0,
            IsolationLevel::ReadCommitted => 1,
        }
    }
}

/// One entry of a FetchResponse partition's `aborted_transactions`: an aborted transaction of
/// `producer_id` that overlaps the fetched range and began at `first_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AbortedTransaction {
    /// The producer whose transaction was aborted.
    pub producer_id: i64,
    /// The offset of that transaction's first batch in this partition.
    pub first_offset: i64,
}

/// What a reader may deliver from one fetched partition: the records, in offset order, none below the
/// fetch offset, and where the next fetch starts.
///
/// The records are kept as positions into the fetched (or decompressed) buffers, so delivering one costs
/// neither an allocation nor a reference count. Read them borrowed with [`iter`](Self::iter) (keys and
/// values as `&[u8]`, or as zero-copy `Bytes` on request), or take owned [`Record`]s with
/// [`into_records`](Self::into_records).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Visible {
    /// Where the next fetch starts: past every complete batch examined, delivered or skipped (aborted
    /// batches and markers included), and never below the fetch offset.
    pub next_offset: i64,
    /// One record section per batch that delivered records.
    buffers: Vec<Buffer>,
    records: Vec<Indexed>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Buffer {
    data: Bytes,
    base_offset: i64,
    timestamp_type: TimestampType,
}

/// One delivered record in 40 bytes: the output of a large fetch is written once and read once, so its
/// size is a good part of the engine's cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Indexed {
    timestamp: i64,
    key: Span,
    value: Span,
    headers: Span,
    offset_delta: u32,
    buffer: u32,
}

impl Visible {
    /// Nothing to deliver; the next fetch starts at `next_offset`.
    pub fn empty(next_offset: i64) -> Visible {
        Visible {
            next_offset,
            buffers: Vec::new(),
            records: Vec::new(),
        }
    }

    /// How many records there are.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The `i`-th record.
    pub fn get(&self, i: usize) -> Option<RecordRef<'_>> {
        self.records.get(i).map(|r| self.view(r))
    }

    /// The records, borrowed.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = RecordRef<'_>> + '_ {
        self.records.iter().map(|r| self.view(r))
    }

    /// The records as owned values (keys, values and headers still slices of the fetched buffers).
    pub fn into_records(self) -> Vec<Record> {
        self.iter().map(|r| r.to_record()).collect()
    }

    fn view<'a>(&'a self, r: &'a Indexed) -> RecordRef<'a> {
        RecordRef {
            buffer: &self.buffers[r.buffer as usize],
            record: r,
        }
    }
}

/// A delivered record, borrowed from a [`Visible`].
#[derive(Debug, Clone, Copy)]
pub struct RecordRef<'a> {
    buffer: &'a Buffer,
    record: &'a Indexed,
}

impl<'a> RecordRef<'a> {
    /// The record's offset.
    pub fn offset(&self) -> i64 {
        self.buffer.base_offset + i64::from(self.record.offset_delta)
    }
    /// The record's timestamp (the batch's max timestamp under `LogAppendTime`).
    pub fn timestamp(&self) -> i64 {
        self.record.timestamp
    }
    /// How the timestamp was assigned.
    pub fn timestamp_type(&self) -> TimestampType {
        self.buffer.timestamp_type
    }
    /// The key, `None` for null.
    pub fn key(&self) -> Option<&'a [u8]> {
        self.record.key.get(&self.buffer.data)
    }
    /// The value, `None` for null.
    pub fn value(&self) -> Option<&'a [u8]> {
        self.record.value.get(&self.buffer.data)
    }
    /// The key as a zero-copy slice of the fetched buffer.
    pub fn key_bytes(&self) -> Option<Bytes> {
        self.record.key.slice(&self.buffer.data)
    }
    /// The value as a zero-copy slice of the fetched buffer.
    pub fn value_bytes(&self) -> Option<Bytes> {
        self.record.value.slice(&self.buffer.data)
    }
    /// The headers, `(key, value)`.
    pub fn headers(&self) -> HeaderIter<'a> {
        HeaderIter::new(&self.buffer.data, self.record.headers)
    }
    /// An owned copy of the record's fields (the bytes themselves are shared, not copied).
    pub fn to_record(&self) -> Record {
        let data = &self.buffer.data;
        Record {
            offset: self.offset(),
            timestamp: self.timestamp(),
            timestamp_type: self.timestamp_type(),
            key: self.key_bytes(),
            value: self.value_bytes(),
            headers: self
                .headers()
                .map(|(k, v)| Header {
                    key: data.slice_ref(k),
                    value: v.map(|v| data.slice_ref(v)),
                })
                .collect(),
        }
    }
}

/// The visibility engine: the records of one partition's fetched batches a reader at `isolation` may
/// deliver, starting at `fetch_offset`, and the next fetch offset.
///
/// - Records below `fetch_offset` (the broker returns whole batches, so the first batch may start
///   earlier) are not delivered.
/// - Control batches are never delivered.
/// - At read_committed, a transactional batch is dropped if its producer has an aborted transaction that
///   began at or before the batch and whose ABORT marker has not been passed. `aborted` is the broker's
///   list for this fetch, in any order; a transaction that began before `fetch_offset` is in it too, so
///   it still hides that producer's later records. The batches must come from a read_committed fetch,
///   which the broker bounds by the LSO: every transaction in them has its fate decided.
///
/// Errors: a batch whose records cannot be decoded (the caller stops at that batch; nothing is
/// delivered from this call).
pub fn visible(
    batches: &[RecordBatch],
    aborted: &[AbortedTransaction],
    isolation: IsolationLevel,
    fetch_offset: i64,
) -> Result<Visible, DecodeError> {
    let capacity = batches
        .iter()
        .filter(|b| !b.is_control())
        .map(|b| estimated_records(b.compression(), b.record_count(), b.raw_records().len()))
        .sum();
    let mut engine = Engine::new(aborted, isolation, fetch_offset, capacity);
    for batch in batches {
        engine.push(&mut batch.clone())?;
    }
    Ok(engine.out)
}

/// [`visible`] over the raw `records` bytes of a fetched partition: decodes the complete batches (a
/// partial trailing batch ends them) and filters them.
///
/// Prefer this to decoding first and calling [`visible`]: each batch is checked and filtered while its
/// bytes are still in the CPU cache, which is most of the cost of a large fetch.
pub fn visible_in(
    records: Bytes,
    aborted: &[AbortedTransaction],
    isolation: IsolationLevel,
    fetch_offset: i64,
) -> Result<Visible, DecodeError> {
    // No pre-pass to size the output: reading every batch header ahead of the CRC pass costs a cache miss
    // per batch, more than letting the Vec grow batch by batch.
    let mut engine = Engine::new(aborted, isolation, fetch_offset, 0);
    for batch in decode_batches(records) {
        let mut batch = batch?;
        engine.push(&mut batch)?;
    }
    Ok(engine.out)
}

/// How many records the output will hold at most, bounded by the bytes received rather than by the
/// (untrusted until decoded) record count alone.
fn estimated_records(compression: Compression, record_count: i32, section_len: usize) -> usize {
    let by_bytes = match compression {
        Compression::None => section_len / MIN_RECORD_LEN,
        // Compressed sections expand; guess modestly and let the Vec grow past it.
        _ => section_len * 2 / MIN_RECORD_LEN,
    };
    (record_count.max(0) as usize).min(by_bytes)
}

/// The engine's state across one fetch's batches, fed in offset order.
struct Engine {
    out: Visible,
    filter: Option<AbortFilter>,
    fetch_offset: i64,
}

impl Engine {
    fn new(
        aborted: &[AbortedTransaction],
        isolation: IsolationLevel,
        fetch_offset: i64,
        capacity: usize,
    ) -> Engine {
        Engine {
            out: Visible {
                next_offset: fetch_offset,
                buffers: Vec::new(),
                records: Vec::with_capacity(capacity),
            },
            filter: match isolation {
                IsolationLevel::ReadCommitted => Some(AbortFilter::new(aborted)),
                IsolationLevel::ReadUncommitted => None,
            },
            fetch_offset,
        }
    }

    /// Takes `batch` into account, moving its record section into the output if it delivers records
    /// (moving rather than sharing saves two reference-count updates per batch).
    fn push(&mut self, batch: &mut RecordBatch) -> Result<(), DecodeError> {
        let out = &mut self.out;
        out.next_offset = out.next_offset.max(batch.next_offset());
        if let Some(filter) = self.filter.as_mut() {
            if filter.skip(batch)? {
                return Ok(());
            }
        }
        if batch.is_control() || batch.last_offset() < self.fetch_offset {
            return Ok(());
        }
        let ctx = batch.context();
        let data = batch.take_record_data(DEFAULT_MAX_DECOMPRESSED)?;
        let buffer = out.buffers.len() as u32;
        let before = out.records.len();
        // Bounded: record_data checked the count against the bytes.
        out.records.reserve(batch.record_count() as usize);
        let mut pos = 0;
        // record_data checked the count against the bytes, so this loop is bounded by them.
        for _ in 0..batch.record_count() {
            let (raw, end) = parse_record(&data, pos, &ctx)?;
            pos = end;
            if raw.offset >= self.fetch_offset {
                out.records.push(Indexed {
                    timestamp: raw.timestamp,
                    key: raw.key,
                    value: raw.value,
                    headers: raw.headers,
                    // Within 0..=last_offset_delta, checked by the record decoder.
                    offset_delta: (raw.offset - ctx.base_offset) as u32,
                    buffer,
                });
            }
        }
        if pos != data.len() {
            // Undo this batch's records: the call fails as a whole.
            out.records.truncate(before);
            return Err(DecodeError::TrailingBytes {
                bytes: data.len() - pos,
            });
        }
        if out.records.len() > before {
            out.buffers.push(Buffer {
                data,
                base_offset: ctx.base_offset,
                timestamp_type: ctx.timestamp_type,
            });
        }
        Ok(())
    }
}

/// The read_committed state while walking a partition's batches in offset order.
struct AbortFilter {
    /// The broker's list, sorted by first offset, consumed from the front.
    pending: Vec<AbortedTransaction>,
    next: usize,
    /// Producers whose aborted transaction has begun and whose ABORT marker is still ahead.
    aborting: HashSet<i64, BuildHasherDefault<ProducerIdHasher>>,
}

impl AbortFilter {
    fn new(aborted: &[AbortedTransaction]) -> AbortFilter {
        let mut pending = aborted.to_vec();
        // The protocol does not promise an order; the walk below needs first-offset order.
        pending.sort_unstable_by_key(|t| (t.first_offset, t.producer_id));
        AbortFilter {
            pending,
            next: 0,
            aborting: HashSet::default(),
        }
    }

    /// Whether read_committed drops `batch` (aborted data or any control batch is dropped by the caller
    /// anyway; this also keeps the abort state up to date).
    fn skip(&mut self, batch: &RecordBatch) -> Result<bool, DecodeError> {
        if batch.producer_id() < 0 {
            return Ok(false);
        }
        // Every aborted transaction that began at or before this batch's end is in force from here on.
        while let Some(t) = self.pending.get(self.next) {
            if t.first_offset > batch.last_offset() {
                break;
            }
            self.aborting.insert(t.producer_id);
            self.next += 1;
        }
        if batch.is_control() {
            // The producer's ABORT ends its aborted range; its next batch starts a fresh transaction.
            // A duplicate marker finds nothing to remove.
            if let Some(ControlMarker::Abort { .. }) = batch.control()? {
                self.aborting.remove(&batch.producer_id());
            }
            return Ok(true);
        }
        Ok(batch.is_transactional()
            && !self.aborting.is_empty()
            && self.aborting.contains(&batch.producer_id()))
    }
}

/// Hashes a producer id with one multiply: SipHash's protection against chosen keys buys nothing here,
/// since the set holds at most the broker's aborted list for one fetch, and it costs a lookup per batch.
#[derive(Default)]
struct ProducerIdHasher(u64);

impl Hasher for ProducerIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_i64(&mut self, v: i64) {
        self.0 = (v as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A transaction seen begun but not ended in a scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpenTransaction {
    /// The offset of the transaction's first batch seen by the scan.
    pub first_offset: i64,
    /// The producer.
    pub producer_id: i64,
}

/// Which transactions are open in a partition, and its last stable offset, from a read_uncommitted scan
/// of its batches alone, without the broker's help.
///
/// Feed it every batch in offset order ([`observe`](Self::observe)), markers included: a transactional
/// data batch opens its producer's transaction if none is open, an ABORT or COMMIT marker of that
/// producer closes it.
///
/// # Limit: transactions begun before the scan start are invisible
///
/// The log only says a transaction began by its first batch. If the scan starts after that batch, the
/// transaction is either missed (no later batch of it in the scan) or seen as beginning at its first
/// batch inside the scan, too late. So the open set and the LSO are exact only for a scan that starts at
/// or below the partition's true LSO (the log start offset always qualifies); from anywhere else they
/// describe only transactions begun inside the scan, and the LSO computed is an upper bound.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogState {
    /// producer id -> first offset of its open transaction.
    open: BTreeMap<i64, i64>,
}

impl LogState {
    /// An empty state, before any batch.
    pub fn new() -> LogState {
        LogState::default()
    }

    /// A state from scanning `batches`, in offset order.
    pub fn scan<'a>(
        batches: impl IntoIterator<Item = &'a RecordBatch>,
    ) -> Result<LogState, DecodeError> {
        let mut state = LogState::new();
        for b in batches {
            state.observe(b)?;
        }
        Ok(state)
    }

    /// Takes the next batch of the partition into account.
    pub fn observe(&mut self, batch: &RecordBatch) -> Result<(), DecodeError> {
        if !batch.is_transactional() {
            return Ok(());
        }
        if batch.is_control() {
            if let Some(ControlMarker::Abort { .. } | ControlMarker::Commit { .. }) =
                batch.control()?
            {
                self.open.remove(&batch.producer_id());
            }
        } else {
            self.open
                .entry(batch.producer_id())
                .or_insert(batch.base_offset());
        }
        Ok(())
    }

    /// The open transactions, earliest first.
    pub fn open_transactions(&self) -> Vec<OpenTransaction> {
        let mut v: Vec<_> = self
            .open
            .iter()
            .map(|(&producer_id, &first_offset)| OpenTransaction {
                first_offset,
                producer_id,
            })
            .collect();
        v.sort_unstable();
        v
    }

    /// The first offset of `producer_id`'s open transaction, if it has one.
    pub fn open_transaction_of(&self, producer_id: i64) -> Option<i64> {
        self.open.get(&producer_id).copied()
    }

    /// The last stable offset: the first offset of the earliest transaction still open, or
    /// `high_watermark` if none is open (or all open ones began at or past it).
    pub fn last_stable_offset(&self, high_watermark: i64) -> i64 {
        self.open
            .values()
            .copied()
            .min()
            .map_or(high_watermark, |first| first.min(high_watermark))
    }
}
