//! Decoding record batches (magic 2) and their records, zero-copy over the fetched `Bytes`.
//!
//! # References
//! - Kafka protocol guide, "Record Batch" and "Record" (message format v2, KIP-98)
//! - KIP-32 (timestamp types), KIP-534 (delete horizon, attribute bit 6)
//! - KIP-98 control records: key `(version i16, type i16)`, transaction marker value
//!   `(version i16, coordinator epoch i32)`; KRaft (KIP-595, KIP-630) adds further control types

use bytes::Bytes;

use super::compression::{self, Compression, DEFAULT_MAX_DECOMPRESSED};
use super::error::DecodeError;

/// Bytes in front of the batch length field's coverage: base offset (8) + batch length (4).
pub(crate) const LOG_OVERHEAD: usize = 12;
/// The fixed batch header, base offset through record count.
pub(crate) const HEADER_LEN: usize = 61;
/// The smallest legal batch length: the header after the length field.
pub(crate) const MIN_BATCH_LENGTH: i32 = (HEADER_LEN - LOG_OVERHEAD) as i32;
/// Where the magic byte sits, in magic 2 batches and in magic 0/1 message sets alike.
const MAGIC_OFFSET: usize = 16;
/// The CRC covers attributes (byte 21) to the end of the batch.
pub(crate) const CRC_START: usize = 21;
/// The smallest encoded record: a length prefix and six one-byte fields.
pub(crate) const MIN_RECORD_LEN: usize = 7;

/// How a batch's timestamps were assigned (attribute bit 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TimestampType {
    /// The producer's timestamps.
    CreateTime,
    /// The broker's append time (`message.timestamp.type=LogAppendTime`): every record carries the
    /// batch's max timestamp.
    LogAppendTime,
}

/// The batch attributes field (int16 at byte 21).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BatchAttributes(pub i16);

impl BatchAttributes {
    /// The codec id, bits 0-2 (see [`Compression::from_id`]).
    pub fn codec_id(self) -> u8 {
        (self.0 & 0x07) as u8
    }
    /// Bit 3.
    pub fn timestamp_type(self) -> TimestampType {
        if self.0 & 0x08 != 0 {
            TimestampType::LogAppendTime
        } else {
            TimestampType::CreateTime
        }
    }
    /// Bit 4: the batch belongs to a transaction.
    pub fn is_transactional(self) -> bool {
        self.0 & 0x10 != 0
    }
    /// Bit 5: the batch holds a control record (transaction marker or KRaft control record).
    pub fn is_control(self) -> bool {
        self.0 & 0x20 != 0
    }
    /// Bit 6: the base timestamp field holds the delete horizon set by the log cleaner (KIP-534).
    pub fn has_delete_horizon(self) -> bool {
        self.0 & 0x40 != 0
    }
}

/// What a control batch says.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ControlMarker {
    /// The producer's transaction in this partition was aborted.
    Abort {
        /// The transaction coordinator's epoch when it wrote the marker.
        coordinator_epoch: i32,
    },
    /// The producer's transaction in this partition was committed.
    Commit {
        /// The transaction coordinator's epoch when it wrote the marker.
        coordinator_epoch: i32,
    },
    /// Any other control type (KRaft leader change, snapshot header/footer, ...): not a record and not a
    /// transaction boundary, so readers skip it.
    Other {
        /// The control type from the record key.
        kind: i16,
    },
}

/// One decoded batch header plus its (still encoded) record section.
///
/// Produced by [`decode_batches`]; the CRC has been checked. Records are decoded lazily by
/// [`RecordBatch::records`].
#[derive(Debug, Clone)]
pub struct RecordBatch {
    pub(crate) base_offset: i64,
    pub(crate) batch_length: i32,
    pub(crate) partition_leader_epoch: i32,
    pub(crate) crc: u32,
    pub(crate) attributes: BatchAttributes,
    pub(crate) compression: Compression,
    pub(crate) last_offset_delta: i32,
    pub(crate) base_timestamp: i64,
    pub(crate) max_timestamp: i64,
    pub(crate) producer_id: i64,
    pub(crate) producer_epoch: i16,
    pub(crate) base_sequence: i32,
    pub(crate) record_count: i32,
    pub(crate) records: Bytes,
}

impl RecordBatch {
    /// The offset of the first record the batch was written with.
    pub fn base_offset(&self) -> i64 {
        self.base_offset
    }
    /// The batch length field: bytes after the length field.
    pub fn batch_length(&self) -> i32 {
        self.batch_length
    }
    /// The partition leader epoch the broker stamped on append (not covered by the CRC).
    pub fn partition_leader_epoch(&self) -> i32 {
        self.partition_leader_epoch
    }
    /// Always 2.
    pub fn magic(&self) -> i8 {
        2
    }
    /// The stored (and verified) CRC-32C.
    pub fn crc(&self) -> u32 {
        self.crc
    }
    /// The raw attributes.
    pub fn attributes(&self) -> BatchAttributes {
        self.attributes
    }
    /// The record section's codec.
    pub fn compression(&self) -> Compression {
        self.compression
    }
    /// The offset of the last record the batch was written with, minus the base offset. Compaction may
    /// remove records but keeps this, so the batch still spans `base_offset..=last_offset`.
    pub fn last_offset_delta(&self) -> i32 {
        self.last_offset_delta
    }
    /// `base_offset + last_offset_delta` (checked not to overflow at decode).
    pub fn last_offset(&self) -> i64 {
        self.base_offset + i64::from(self.last_offset_delta)
    }
    /// The offset after this batch: where a reader continues.
    pub fn next_offset(&self) -> i64 {
        self.last_offset() + 1
    }
    /// The first timestamp (or the delete horizon, see [`BatchAttributes::has_delete_horizon`]).
    pub fn base_timestamp(&self) -> i64 {
        self.base_timestamp
    }
    /// The largest record timestamp (the append time under `LogAppendTime`).
    pub fn max_timestamp(&self) -> i64 {
        self.max_timestamp
    }
    /// The producer id, or -1 for a producer that is neither idempotent nor transactional.
    pub fn producer_id(&self) -> i64 {
        self.producer_id
    }
    /// The producer epoch, or -1.
    pub fn producer_epoch(&self) -> i16 {
        self.producer_epoch
    }
    /// The sequence number of the first record, or -1.
    pub fn base_sequence(&self) -> i32 {
        self.base_sequence
    }
    /// How many records the batch holds (fewer than `last_offset_delta + 1` after compaction).
    pub fn record_count(&self) -> i32 {
        self.record_count
    }
    /// Bit 4 of the attributes.
    pub fn is_transactional(&self) -> bool {
        self.attributes.is_transactional()
    }
    /// Bit 5 of the attributes.
    pub fn is_control(&self) -> bool {
        self.attributes.is_control()
    }
    /// The record section exactly as received (compressed if the batch is).
    pub fn raw_records(&self) -> &Bytes {
        &self.records
    }

    /// The records, decompressing with the [default cap](DEFAULT_MAX_DECOMPRESSED).
    ///
    /// For an uncompressed batch this allocates nothing: keys, values and header values are slices of the
    /// fetched buffer. A compressed batch is decompressed here, once per call.
    pub fn records(&self) -> Result<Records, DecodeError> {
        self.records_with_limit(DEFAULT_MAX_DECOMPRESSED)
    }

    /// [`records`](Self::records) with a caller-chosen cap on the decompressed record section.
    pub fn records_with_limit(&self, limit: usize) -> Result<Records, DecodeError> {
        Ok(Records {
            data: self.record_data(limit)?,
            pos: 0,
            left: self.record_count,
            ctx: self.context(),
            done: false,
        })
    }

    /// The control marker of a control batch, `None` for a data batch and for an emptied control batch.
    ///
    /// Only the first record counts: a marker batch holds exactly one. A control batch with no record
    /// is what the log cleaner leaves where it removed a marker past `delete.retention.ms` (it keeps
    /// the empty batch header for the producer's state, as it does for data batches): it marks nothing,
    /// and a reader of a cleaned compacted topic meets it (found by the flow's delete test).
    pub fn control(&self) -> Result<Option<ControlMarker>, DecodeError> {
        if !self.is_control() {
            return Ok(None);
        }
        let bad = |reason| DecodeError::BadControlRecord { reason };
        // Markers are read for every transaction boundary; parse the one record in place rather than
        // building an owned Record.
        if self.record_count < 1 {
            return Ok(None);
        }
        let data = self.record_data(DEFAULT_MAX_DECOMPRESSED)?;
        let (record, _) = parse_record(&data, 0, &self.context())?;
        let key = record
            .key
            .get(&data)
            .ok_or(bad("control record without a key"))?;
        let key: &[u8; 4] = key
            .get(..4)
            .and_then(|k| k.try_into().ok())
            .ok_or(bad("control record key shorter than 4 bytes"))?;
        // Key version 0 is the only one defined; later versions promise to keep the type in place.
        let kind = i16::from_be_bytes([key[2], key[3]]);
        let epoch = || -> Result<i32, DecodeError> {
            let value = record
                .value
                .get(&data)
                .ok_or(bad("transaction marker without a value"))?;
            let v: &[u8; 6] = value
                .get(..6)
                .and_then(|v| v.try_into().ok())
                .ok_or(bad("transaction marker value shorter than 6 bytes"))?;
            Ok(i32::from_be_bytes([v[2], v[3], v[4], v[5]]))
        };
        Ok(Some(match kind {
            0 => ControlMarker::Abort {
                coordinator_epoch: epoch()?,
            },
            1 => ControlMarker::Commit {
                coordinator_epoch: epoch()?,
            },
            kind => ControlMarker::Other { kind },
        }))
    }
}

fn check_record_count(offset: i64, count: i32, bytes: usize) -> Result<(), DecodeError> {
    // Every record takes at least MIN_RECORD_LEN bytes, so a count the bytes cannot hold is rejected before
    // anything is sized by it.
    match usize::try_from(count) {
        Ok(n) if n <= bytes / MIN_RECORD_LEN => Ok(()),
        _ => Err(DecodeError::BadRecordCount {
            offset,
            count,
            bytes,
        }),
    }
}

/// Decodes the record batches of one partition's fetched `records` bytes.
///
/// The iterator yields each complete batch (CRC checked) and stops cleanly at a partial trailing batch,
/// which brokers send routinely when a fetch's byte budget ends mid-batch; [`Batches::next_offset`] then
/// says how far the complete batches reached. After the first error it yields nothing more.
pub fn decode_batches(records: Bytes) -> Batches {
    Batches {
        buf: records,
        pos: 0,
        failed: false,
        next_offset: None,
    }
}

/// The iterator returned by [`decode_batches`].
#[derive(Debug, Clone)]
pub struct Batches {
    buf: Bytes,
    pos: usize,
    failed: bool,
    next_offset: Option<i64>,
}

impl Batches {
    /// The offset after the last complete batch yielded so far, `None` before the first.
    pub fn next_offset(&self) -> Option<i64> {
        self.next_offset
    }
    /// Bytes not yet consumed; once iteration has ended without error, the partial trailing batch.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn decode_next(&mut self) -> Result<Option<RecordBatch>, DecodeError> {
        let rest = &self.buf[self.pos..];
        if rest.len() <= MAGIC_OFFSET {
            return Ok(None);
        }
        let base_offset = be_i64(rest, 0);
        let length = be_i32(rest, 8);
        let magic = rest[MAGIC_OFFSET] as i8;
        match magic {
            2 => {}
            0 | 1 => {
                return Err(DecodeError::LegacyMessageSet {
                    magic,
                    offset: base_offset,
                })
            }
            _ => {
                return Err(DecodeError::UnknownMagic {
                    magic,
                    offset: base_offset,
                })
            }
        }
        if length < MIN_BATCH_LENGTH {
            return Err(DecodeError::BatchLengthTooSmall {
                offset: base_offset,
                length,
            });
        }
        // length >= 49 here, so the cast is lossless; compare without adding to avoid overflow on 32-bit.
        let length_usize = length as usize;
        if rest.len() - LOG_OVERHEAD < length_usize {
            return Ok(None);
        }
        let total = LOG_OVERHEAD + length_usize;
        let batch = &rest[..total];
        let stored = be_u32(batch, 17);
        let computed = crc32c::crc32c(&batch[CRC_START..]);
        if stored != computed {
            return Err(DecodeError::CrcMismatch {
                offset: base_offset,
                stored,
                computed,
            });
        }
        let attributes = BatchAttributes(be_i16(batch, 21));
        let compression =
            Compression::from_id(attributes.codec_id()).ok_or(DecodeError::UnknownCompression {
                offset: base_offset,
                codec: attributes.codec_id(),
            })?;
        let last_offset_delta = be_i32(batch, 23);
        if last_offset_delta < 0 {
            return Err(DecodeError::NegativeLastOffsetDelta {
                offset: base_offset,
                delta: last_offset_delta,
            });
        }
        // The offset after the batch must be representable too, since readers continue from it.
        if base_offset
            .checked_add(i64::from(last_offset_delta) + 1)
            .is_none()
        {
            return Err(DecodeError::OffsetOverflow {
                offset: base_offset,
                delta: last_offset_delta,
            });
        }
        let record_count = be_i32(batch, 57);
        let section_len = total - HEADER_LEN;
        if compression == Compression::None {
            check_record_count(base_offset, record_count, section_len)?;
        } else if record_count < 0 {
            return Err(DecodeError::BadRecordCount {
                offset: base_offset,
                count: record_count,
                bytes: section_len,
            });
        }
        let start = self.pos;
        self.pos += total;
        let out = RecordBatch {
            base_offset,
            batch_length: length,
            partition_leader_epoch: be_i32(batch, 12),
            crc: stored,
            attributes,
            compression,
            last_offset_delta,
            base_timestamp: be_i64(batch, 27),
            max_timestamp: be_i64(batch, 35),
            producer_id: be_i64(batch, 43),
            producer_epoch: be_i16(batch, 51),
            base_sequence: be_i32(batch, 53),
            record_count,
            records: self.buf.slice(start + HEADER_LEN..start + total),
        };
        self.next_offset = Some(out.next_offset());
        Ok(Some(out))
    }
}

impl Iterator for Batches {
    type Item = Result<RecordBatch, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        match self.decode_next() {
            Ok(b) => b.map(Ok),
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

// Callers have checked `at + N <= buf.len()`; the fixed-size reads below index within that.
fn be_i64(buf: &[u8], at: usize) -> i64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&buf[at..at + 8]);
    i64::from_be_bytes(b)
}
fn be_i32(buf: &[u8], at: usize) -> i32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&buf[at..at + 4]);
    i32::from_be_bytes(b)
}
fn be_u32(buf: &[u8], at: usize) -> u32 {
    be_i32(buf, at) as u32
}
fn be_i16(buf: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([buf[at], buf[at + 1]])
}

/// One record header, as a producer writes it and a consumer reads it back (also
/// `snapfence::producer::Header`). Kafka allows repeated keys and a null value. Keys are UTF-8 by the
/// Java client's convention; they are kept as bytes here so decoding never fails or copies on them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Header {
    /// The header key.
    pub key: Bytes,
    /// The header value, `None` for null.
    pub value: Option<Bytes>,
}

/// One data record, owning (zero-copy) slices of the fetched buffer.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Record {
    /// The record's offset in the partition.
    pub offset: i64,
    /// The record's timestamp (the batch's max timestamp under `LogAppendTime`).
    pub timestamp: i64,
    /// How the timestamp was assigned.
    pub timestamp_type: TimestampType,
    /// The key, `None` for null.
    pub key: Option<Bytes>,
    /// The value, `None` for null (a tombstone in a compacted topic).
    pub value: Option<Bytes>,
    /// The headers; empty without allocating when the record has none.
    pub headers: Vec<Header>,
}

/// A byte range inside a record section; `len == -1` is null.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Span {
    pub(crate) start: u32,
    pub(crate) len: i32,
}

impl Span {
    const NULL: Span = Span { start: 0, len: -1 };

    pub(crate) fn get<'a>(&self, data: &'a [u8]) -> Option<&'a [u8]> {
        let len = usize::try_from(self.len).ok()?;
        let start = self.start as usize;
        data.get(start..start + len)
    }

    pub(crate) fn slice(&self, data: &Bytes) -> Option<Bytes> {
        let len = usize::try_from(self.len).ok()?;
        let start = self.start as usize;
        (start + len <= data.len()).then(|| data.slice(start..start + len))
    }
}

/// A decoded record as positions into its record section: what the engine stores per record, so
/// delivering a record costs no allocation and no reference count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct RawRecord {
    pub(crate) offset: i64,
    pub(crate) timestamp: i64,
    pub(crate) key: Span,
    pub(crate) value: Span,
    /// The headers' bytes (already validated) and how many there are.
    pub(crate) headers: Span,
    pub(crate) header_count: u32,
}

impl RawRecord {
    pub(crate) fn to_record(self, data: &Bytes, timestamp_type: TimestampType) -> Record {
        Record {
            offset: self.offset,
            timestamp: self.timestamp,
            timestamp_type,
            key: self.key.slice(data),
            value: self.value.slice(data),
            headers: if self.header_count == 0 {
                Vec::new()
            } else {
                HeaderIter::new(data, self.headers)
                    .map(|(k, v)| Header {
                        key: slice_of(data, k),
                        value: v.map(|v| slice_of(data, v)),
                    })
                    .collect()
            },
        }
    }
}

/// `part` is a subslice of `data`; turn it back into a zero-copy `Bytes`.
fn slice_of(data: &Bytes, part: &[u8]) -> Bytes {
    data.slice_ref(part)
}

/// The headers of a record, borrowed from its record section.
#[derive(Debug, Clone)]
pub struct HeaderIter<'a> {
    cur: Cursor<'a>,
}

impl<'a> HeaderIter<'a> {
    /// The headers whose encoded bytes (after the header count) are `headers` within `data`. The record
    /// decoder checked that they fill the span exactly, so iterating to its end yields all of them.
    pub(crate) fn new(data: &'a [u8], headers: Span) -> HeaderIter<'a> {
        let start = headers.start as usize;
        let end = start + headers.len.max(0) as usize;
        HeaderIter {
            cur: Cursor {
                buf: data.get(..end).unwrap_or(&[]),
                pos: start,
            },
        }
    }
}

impl<'a> Iterator for HeaderIter<'a> {
    /// `(key, value)`; a null value is `None`.
    type Item = (&'a [u8], Option<&'a [u8]>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.cur.pos >= self.cur.buf.len() {
            return None;
        }
        // The bytes were validated when the record was decoded, so these reads succeed; should they not,
        // the iterator just ends.
        let key = self.cur.nullable("header key").ok()??;
        let value = self.cur.nullable("header value").ok()?;
        Some((key, value))
    }
}

/// What record decoding needs from the batch header.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecordContext {
    pub(crate) base_offset: i64,
    pub(crate) base_timestamp: i64,
    pub(crate) max_timestamp: i64,
    pub(crate) timestamp_type: TimestampType,
    pub(crate) last_offset_delta: i32,
}

impl RecordBatch {
    pub(crate) fn context(&self) -> RecordContext {
        RecordContext {
            base_offset: self.base_offset,
            base_timestamp: self.base_timestamp,
            max_timestamp: self.max_timestamp,
            timestamp_type: self.attributes.timestamp_type(),
            last_offset_delta: self.last_offset_delta,
        }
    }

    /// The record section to parse: the raw one, or the decompressed one, with its count checked.
    pub(crate) fn record_data(&self, limit: usize) -> Result<Bytes, DecodeError> {
        // Spans are u32 positions; no record section may outgrow them.
        let limit = limit.min(u32::MAX as usize);
        let data = match self.compression {
            Compression::None => self.records.clone(),
            codec => Bytes::from(compression::decompress(codec, &self.records, limit)?),
        };
        check_record_count(self.base_offset, self.record_count, data.len())?;
        Ok(data)
    }

    /// [`record_data`](Self::record_data), moving an uncompressed section out of the batch (which is
    /// left without records).
    pub(crate) fn take_record_data(&mut self, limit: usize) -> Result<Bytes, DecodeError> {
        if self.compression != Compression::None {
            return self.record_data(limit);
        }
        check_record_count(self.base_offset, self.record_count, self.records.len())?;
        Ok(std::mem::take(&mut self.records))
    }
}

/// Decodes one record starting at `pos` of `data` (a record section of at most u32::MAX bytes).
/// Returns the record and the position after it.
#[inline]
pub(crate) fn parse_record(
    data: &[u8],
    pos: usize,
    ctx: &RecordContext,
) -> Result<(RawRecord, usize), DecodeError> {
    let mut cur = Cursor { buf: data, pos };
    let len = cur.length("record")?.ok_or(DecodeError::NegativeLength {
        field: "record",
        length: -1,
    })?;
    let body_start = cur.pos;
    if len > data.len() - body_start {
        return Err(DecodeError::Overrun { field: "record" });
    }
    let end = body_start + len;
    // Bound every field read by the record's own length, not the section's.
    let mut cur = Cursor {
        buf: &data[..end],
        pos: body_start,
    };
    // Attributes, then the timestamp delta, offset delta and key length are one byte each in nearly every
    // record (deltas below 64, keys shorter than 64 bytes): take them in one bounds check. Otherwise,
    // field by field.
    let (ts_delta, offset_delta, key) = match cur.buf.get(cur.pos..cur.pos + 4) {
        Some(&[_, t, o, k]) if (t | o | k) < 0x80 => {
            cur.pos += 4;
            let key = match unzigzag32(k) {
                -1 => Span::NULL,
                n if n < 0 => {
                    return Err(DecodeError::NegativeLength {
                        field: "record key",
                        length: n,
                    })
                }
                n => {
                    let len = n as usize;
                    if len > cur.buf.len() - cur.pos {
                        return Err(DecodeError::Overrun {
                            field: "record key",
                        });
                    }
                    let start = cur.pos;
                    cur.pos += len;
                    Span {
                        start: start as u32,
                        len: n,
                    }
                }
            };
            (i64::from(unzigzag32(t)), unzigzag32(o), key)
        }
        _ => {
            let _attributes = cur.u8("record attributes")?;
            let ts_delta = cur.varlong()?;
            let offset_delta = cur.varint()?;
            (ts_delta, offset_delta, cur.span("record key")?)
        }
    };
    if !(0..=ctx.last_offset_delta).contains(&offset_delta) {
        return Err(DecodeError::OffsetDeltaOutOfRange {
            delta: offset_delta,
            last_offset_delta: ctx.last_offset_delta,
        });
    }
    let value = cur.span("record value")?;
    let header_count = cur.varint()?;
    let headers_start = cur.pos;
    if header_count != 0 {
        let n = u32::try_from(header_count).map_err(|_| DecodeError::NegativeLength {
            field: "header count",
            length: header_count,
        })?;
        // Each header takes at least two bytes; a count the record cannot hold is rejected up front.
        if n as usize > (end - cur.pos) / 2 {
            return Err(DecodeError::Overrun { field: "headers" });
        }
        for _ in 0..n {
            if cur.span("header key")?.len < 0 {
                return Err(DecodeError::NegativeLength {
                    field: "header key",
                    length: -1,
                });
            }
            cur.span("header value")?;
        }
    }
    if cur.pos != end {
        return Err(DecodeError::RecordLengthMismatch {
            declared: len,
            read: cur.pos - body_start,
        });
    }
    let timestamp = match ctx.timestamp_type {
        TimestampType::CreateTime => ctx.base_timestamp.wrapping_add(ts_delta),
        TimestampType::LogAppendTime => ctx.max_timestamp,
    };
    Ok((
        RawRecord {
            // Cannot overflow: the batch decoder checked base_offset + last_offset_delta + 1.
            offset: ctx.base_offset + i64::from(offset_delta),
            timestamp,
            key,
            value,
            headers: Span {
                start: headers_start as u32,
                len: (end - headers_start) as i32,
            },
            header_count: header_count.max(0) as u32,
        },
        end,
    ))
}

/// A lazy iterator over one batch's records, from [`RecordBatch::records`].
///
/// Yields at most `record_count` records, then an error if bytes are left over; nothing after an error.
#[derive(Debug, Clone)]
pub struct Records {
    pub(crate) data: Bytes,
    pub(crate) pos: usize,
    pub(crate) left: i32,
    pub(crate) ctx: RecordContext,
    pub(crate) done: bool,
}

impl Records {
    /// Records not yet yielded, by the batch's count.
    pub fn remaining(&self) -> usize {
        self.left.max(0) as usize
    }

    /// Decodes the next record's positions, or `None` after the last one.
    #[inline]
    pub(crate) fn next_raw(&mut self) -> Result<Option<RawRecord>, DecodeError> {
        if self.left <= 0 {
            if self.pos != self.data.len() {
                return Err(DecodeError::TrailingBytes {
                    bytes: self.data.len() - self.pos,
                });
            }
            return Ok(None);
        }
        let (raw, end) = parse_record(&self.data, self.pos, &self.ctx)?;
        self.pos = end;
        self.left -= 1;
        Ok(Some(raw))
    }
}

impl Iterator for Records {
    type Item = Result<Record, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.next_raw() {
            Ok(Some(r)) => Some(Ok(r.to_record(&self.data, self.ctx.timestamp_type))),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.remaining() + 1))
    }
}

/// Zigzag-decodes a one-byte varint.
#[inline(always)]
fn unzigzag32(b: u8) -> i32 {
    let u = u32::from(b);
    (u >> 1) as i32 ^ -((u & 1) as i32)
}

/// A bounds-checked reader over one record: every read checks what is left first.
#[derive(Debug, Clone)]
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        let b = *self
            .buf
            .get(self.pos)
            .ok_or(DecodeError::Overrun { field })?;
        self.pos += 1;
        Ok(b)
    }

    /// An unsigned LEB128 of at most `max_bytes` bytes whose value fits `bits` bits.
    #[inline(always)]
    fn uvarint(&mut self, max_bytes: usize, bits: u32) -> Result<u64, DecodeError> {
        // Nearly every varint in a record is one or two bytes (lengths up to 8 KiB); keep those short.
        if let Some(&b) = self.buf.get(self.pos) {
            if b < 0x80 {
                self.pos += 1;
                return Ok(u64::from(b));
            }
            if let Some(&c) = self.buf.get(self.pos + 1) {
                if c < 0x80 {
                    self.pos += 2;
                    return Ok(u64::from(b & 0x7f) | u64::from(c) << 7);
                }
            }
        }
        self.uvarint_slow(max_bytes, bits)
    }

    #[inline(never)]
    fn uvarint_slow(&mut self, max_bytes: usize, bits: u32) -> Result<u64, DecodeError> {
        let mut value = 0u64;
        for i in 0..max_bytes {
            let b = *self
                .buf
                .get(self.pos)
                .ok_or(DecodeError::Overrun { field: "varint" })?;
            self.pos += 1;
            let shift = 7 * i as u32;
            let part = u64::from(b & 0x7f);
            // The last allowed byte may only carry the bits that remain of the width.
            if i == max_bytes - 1 && (b & 0x80 != 0 || part >> (bits - shift) != 0) {
                return Err(DecodeError::VarintOverflow);
            }
            value |= part << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(DecodeError::VarintOverflow)
    }

    /// A zigzag varint (i32, at most 5 bytes).
    #[inline(always)]
    fn varint(&mut self) -> Result<i32, DecodeError> {
        let u = self.uvarint(5, 32)? as u32;
        Ok((u >> 1) as i32 ^ -((u & 1) as i32))
    }

    /// A zigzag varlong (i64, at most 10 bytes).
    #[inline(always)]
    fn varlong(&mut self) -> Result<i64, DecodeError> {
        let u = self.uvarint(10, 64)?;
        Ok((u >> 1) as i64 ^ -((u & 1) as i64))
    }

    /// A varint length: `None` for -1, an error for other negatives.
    #[inline(always)]
    fn length(&mut self, field: &'static str) -> Result<Option<usize>, DecodeError> {
        match self.varint()? {
            -1 => Ok(None),
            n if n < 0 => Err(DecodeError::NegativeLength { field, length: n }),
            n => Ok(Some(n as usize)),
        }
    }

    /// Length-prefixed bytes as a span of the buffer (whose positions fit u32).
    #[inline(always)]
    fn span(&mut self, field: &'static str) -> Result<Span, DecodeError> {
        let Some(len) = self.length(field)? else {
            return Ok(Span::NULL);
        };
        if len > self.buf.len() - self.pos {
            return Err(DecodeError::Overrun { field });
        }
        let start = self.pos;
        self.pos += len;
        Ok(Span {
            start: start as u32,
            len: len as i32,
        })
    }

    /// Length-prefixed bytes borrowed from the buffer.
    fn nullable(&mut self, field: &'static str) -> Result<Option<&'a [u8]>, DecodeError> {
        let span = self.span(field)?;
        Ok(span.get(self.buf))
    }
}
