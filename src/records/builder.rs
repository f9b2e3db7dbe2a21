//! Building magic 2 batches for the producer.
//!
//! The producer appends records into a [`BatchBuilder`] until it is full, then seals it into a
//! [`SealedBatch`] with the producer id, epoch and base sequence it holds at drain time. The sealed bytes
//! are what every retry resends: the broker deduplicates retries by (producer id, epoch, sequence), which
//! only works if a retry carries the very same batch.
//!
//! # References
//! - Kafka protocol guide, "Record Batch" (message format v2, KIP-98)
//! - KIP-98 (idempotent and transactional fields), KIP-360 (re-sequencing after an epoch bump)

use bytes::{BufMut, Bytes, BytesMut};

use super::batch::{ControlMarker, CRC_START, HEADER_LEN, LOG_OVERHEAD};
use super::compression::{self, Compression};
use super::error::EncodeError;

/// A record to append, borrowed from the caller.
#[derive(Debug, Clone, Copy, Default)]
pub struct NewRecord<'a> {
    /// The create time in milliseconds.
    pub timestamp: i64,
    /// The key, `None` for null.
    pub key: Option<&'a [u8]>,
    /// The value, `None` for null (a tombstone).
    pub value: Option<&'a [u8]>,
    /// The headers, `(key, value)`. Kafka clients write keys as UTF-8; the keys are bytes here as they
    /// are in a decoded [`Header`](super::Header), so whatever a record carries can be written back.
    pub headers: &'a [(&'a [u8], Option<&'a [u8]>)],
}

/// The producer's identity stamped on a batch when it is sealed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProducerStamp {
    /// The producer id, -1 for a plain producer.
    pub producer_id: i64,
    /// The producer epoch, -1 for a plain producer.
    pub producer_epoch: i16,
    /// The sequence number of the batch's first record, -1 for a plain producer.
    pub base_sequence: i32,
    /// Whether the batch belongs to a transaction (attribute bit 4).
    pub transactional: bool,
}

impl ProducerStamp {
    /// A producer that is neither idempotent nor transactional.
    pub const NONE: ProducerStamp = ProducerStamp {
        producer_id: -1,
        producer_epoch: -1,
        base_sequence: -1,
        transactional: false,
    };
}

/// Accumulates records for one partition, bounded by a byte budget.
///
/// Records are encoded as they are appended (uncompressed; compression happens once, at
/// [`seal`](Self::seal)). The budget bounds the uncompressed batch, as the Java producer's `batch.size`
/// does before compression is known.
#[derive(Debug)]
pub struct BatchBuilder {
    compression: Compression,
    max_bytes: usize,
    /// The header's space (zeroed until sealing) followed by the encoded records, so an uncompressed
    /// batch is sealed in place without a copy.
    buf: BytesMut,
    count: i32,
    base_timestamp: i64,
    max_timestamp: i64,
}

impl BatchBuilder {
    /// A builder whose batches stay within `max_bytes` (whole batch, header included), except that the
    /// first record is always accepted so an oversized record still gets a batch of its own.
    pub fn new(compression: Compression, max_bytes: usize) -> BatchBuilder {
        let mut buf = BytesMut::with_capacity(max_bytes.clamp(HEADER_LEN, 1 << 20));
        buf.put_bytes(0, HEADER_LEN);
        BatchBuilder {
            compression,
            max_bytes,
            buf,
            count: 0,
            base_timestamp: 0,
            max_timestamp: i64::MIN,
        }
    }

    /// How many records have been appended.
    pub fn record_count(&self) -> usize {
        self.count as usize
    }

    /// Whether no record has been appended.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The size of the batch so far, uncompressed, header included.
    pub fn size(&self) -> usize {
        self.buf.len()
    }

    /// The codec this batch will be sealed with.
    pub fn compression(&self) -> Compression {
        self.compression
    }

    /// The encoded size `record` would add.
    pub fn record_size(&self, record: &NewRecord<'_>) -> Result<usize, EncodeError> {
        let base = if self.count == 0 {
            record.timestamp
        } else {
            self.base_timestamp
        };
        encoded_record_size(record, self.count, base)
    }

    /// Appends `record` if the batch stays within its budget (or is empty). Returns `Ok(false)`, leaving
    /// the builder unchanged, when the record does not fit: seal this batch and start another.
    pub fn try_append(&mut self, record: &NewRecord<'_>) -> Result<bool, EncodeError> {
        if self.count == i32::MAX {
            return Err(EncodeError::TooManyRecords);
        }
        let base = if self.count == 0 {
            record.timestamp
        } else {
            self.base_timestamp
        };
        let body = body_size(record, self.count, base)?;
        // body_size checked that the record with its prefix fits an i32.
        let size = varint_len(zigzag32(body as i32)) + body;
        if self.count > 0 && self.buf.len() + size > self.max_bytes {
            return Ok(false);
        }
        self.base_timestamp = base;
        let ts_delta = timestamp_delta(record.timestamp, base)?;
        let before = self.buf.len();
        self.buf.reserve(size);
        put_varint(&mut self.buf, zigzag32(body as i32));
        self.buf.put_u8(0); // record attributes: unused
        put_varint(&mut self.buf, zigzag64(ts_delta));
        put_varint(&mut self.buf, zigzag32(self.count));
        put_nullable(&mut self.buf, record.key);
        put_nullable(&mut self.buf, record.value);
        put_varint(&mut self.buf, zigzag32(record.headers.len() as i32));
        for (k, v) in record.headers {
            put_nullable(&mut self.buf, Some(k));
            put_nullable(&mut self.buf, *v);
        }
        debug_assert_eq!(self.buf.len() - before, size);
        self.count += 1;
        self.max_timestamp = self.max_timestamp.max(record.timestamp);
        Ok(true)
    }

    /// Compresses the records and writes the header with `stamp`, base offset 0 (the broker assigns
    /// offsets) and the CRC.
    pub fn seal(self, stamp: ProducerStamp) -> Result<SealedBatch, EncodeError> {
        if self.count == 0 {
            return Err(EncodeError::EmptyBatch);
        }
        let header = Header {
            codec: self.compression.id(),
            control: false,
            last_offset_delta: self.count - 1,
            base_timestamp: self.base_timestamp,
            max_timestamp: self.max_timestamp,
            record_count: self.count,
        };
        let buf = match self.compression {
            Compression::None => self.buf,
            codec => {
                let compressed = compression::compress(codec, &self.buf[HEADER_LEN..])?;
                let mut buf = BytesMut::with_capacity(HEADER_LEN + compressed.len());
                buf.put_bytes(0, HEADER_LEN);
                buf.extend_from_slice(&compressed);
                buf
            }
        };
        let length = buf.len() - LOG_OVERHEAD;
        let length = i32::try_from(length).map_err(|_| EncodeError::TooLong {
            field: "batch",
            len: length,
        })?;
        let mut buf = buf;
        header.write(&mut buf, length, stamp);
        Ok(SealedBatch {
            bytes: buf.freeze(),
            record_count: self.count,
            stamp,
        })
    }
}

/// A finished batch: the exact bytes to produce (and to resend on every retry).
#[derive(Debug, Clone)]
pub struct SealedBatch {
    bytes: Bytes,
    record_count: i32,
    stamp: ProducerStamp,
}

impl SealedBatch {
    /// The batch bytes, ready to go into a ProduceRequest's `records` field.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }
    /// How many records the batch holds.
    pub fn record_count(&self) -> usize {
        self.record_count as usize
    }
    /// The stamp the batch carries.
    pub fn stamp(&self) -> ProducerStamp {
        self.stamp
    }

    /// Rewrites the producer fields and the CRC, for the one case where a batch must change identity:
    /// an idempotent producer whose epoch was bumped (KIP-360) re-sequences its unacknowledged batches.
    /// Copies the bytes if a previous send still holds them.
    pub fn restamp(&mut self, stamp: ProducerStamp) {
        let mut buf = BytesMut::from(std::mem::take(&mut self.bytes));
        let attributes = i16::from_be_bytes([buf[21], buf[22]]);
        let attributes = if stamp.transactional {
            attributes | 0x10
        } else {
            attributes & !0x10
        };
        buf[21..23].copy_from_slice(&attributes.to_be_bytes());
        buf[43..51].copy_from_slice(&stamp.producer_id.to_be_bytes());
        buf[51..53].copy_from_slice(&stamp.producer_epoch.to_be_bytes());
        buf[53..57].copy_from_slice(&stamp.base_sequence.to_be_bytes());
        let crc = crc32c::crc32c(&buf[CRC_START..]);
        buf[17..21].copy_from_slice(&crc.to_be_bytes());
        self.bytes = buf.freeze();
        self.stamp = stamp;
    }

    /// The batch as a broker would store it at `base_offset`: only the base offset changes, and the CRC
    /// does not cover it. For tests and tools that assemble logs.
    pub fn at_offset(&self, base_offset: i64) -> Bytes {
        let mut buf = BytesMut::from(&self.bytes[..]);
        buf[..8].copy_from_slice(&base_offset.to_be_bytes());
        buf.freeze()
    }
}

/// A transaction marker batch as the broker writes it: one control record, uncompressed, transactional.
///
/// Producers never write these; tests and tools that assemble logs do.
pub fn control_batch(
    base_offset: i64,
    producer_id: i64,
    producer_epoch: i16,
    marker: ControlMarker,
    timestamp: i64,
) -> Bytes {
    let (kind, value): (i16, Option<[u8; 6]>) = match marker {
        ControlMarker::Abort { coordinator_epoch } => (0, Some(marker_value(coordinator_epoch))),
        ControlMarker::Commit { coordinator_epoch } => (1, Some(marker_value(coordinator_epoch))),
        ControlMarker::Other { kind } => (kind, None),
    };
    let mut key = [0u8; 4];
    key[2..].copy_from_slice(&kind.to_be_bytes());
    let record = NewRecord {
        timestamp,
        key: Some(&key),
        value: value.as_ref().map(|v| &v[..]),
        headers: &[],
    };
    let mut b = BatchBuilder::new(Compression::None, 128);
    // A 10-byte control record always fits an empty builder.
    let appended = b.try_append(&record).unwrap_or(false);
    debug_assert!(appended);
    let length = (b.buf.len() - LOG_OVERHEAD) as i32;
    let mut buf = b.buf;
    Header {
        codec: 0,
        control: true,
        last_offset_delta: 0,
        base_timestamp: timestamp,
        max_timestamp: timestamp,
        record_count: 1,
    }
    .write(
        &mut buf,
        length,
        ProducerStamp {
            producer_id,
            producer_epoch,
            base_sequence: -1,
            transactional: true,
        },
    );
    buf[..8].copy_from_slice(&base_offset.to_be_bytes());
    buf.freeze()
}

fn marker_value(coordinator_epoch: i32) -> [u8; 6] {
    let mut v = [0u8; 6];
    v[2..].copy_from_slice(&coordinator_epoch.to_be_bytes());
    v
}

struct Header {
    codec: u8,
    control: bool,
    last_offset_delta: i32,
    base_timestamp: i64,
    max_timestamp: i64,
    record_count: i32,
}

impl Header {
    /// Fills the zeroed header space at the front of `buf` and computes the CRC last, over attributes..end.
    fn write(&self, buf: &mut [u8], length: i32, stamp: ProducerStamp) {
        let mut attributes = i16::from(self.codec);
        if stamp.transactional {
            attributes |= 0x10;
        }
        if self.control {
            attributes |= 0x20;
        }
        buf[0..8].copy_from_slice(&0i64.to_be_bytes());
        buf[8..12].copy_from_slice(&length.to_be_bytes());
        // Partition leader epoch: the broker sets it on append.
        buf[12..16].copy_from_slice(&(-1i32).to_be_bytes());
        buf[16] = 2;
        buf[21..23].copy_from_slice(&attributes.to_be_bytes());
        buf[23..27].copy_from_slice(&self.last_offset_delta.to_be_bytes());
        buf[27..35].copy_from_slice(&self.base_timestamp.to_be_bytes());
        buf[35..43].copy_from_slice(&self.max_timestamp.to_be_bytes());
        buf[43..51].copy_from_slice(&stamp.producer_id.to_be_bytes());
        buf[51..53].copy_from_slice(&stamp.producer_epoch.to_be_bytes());
        buf[53..57].copy_from_slice(&stamp.base_sequence.to_be_bytes());
        buf[57..61].copy_from_slice(&self.record_count.to_be_bytes());
        let crc = crc32c::crc32c(&buf[CRC_START..]);
        buf[17..21].copy_from_slice(&crc.to_be_bytes());
    }
}

fn timestamp_delta(timestamp: i64, base: i64) -> Result<i64, EncodeError> {
    timestamp
        .checked_sub(base)
        .ok_or(EncodeError::TimestampOutOfRange { timestamp, base })
}

fn len_i32(field: &'static str, len: usize) -> Result<i32, EncodeError> {
    i32::try_from(len).map_err(|_| EncodeError::TooLong { field, len })
}

fn nullable_len(field: &'static str, b: Option<&[u8]>) -> Result<usize, EncodeError> {
    Ok(match b {
        None => 1,
        Some(b) => varint_len(zigzag32(len_i32(field, b.len())?)) + b.len(),
    })
}

/// The bytes `record` takes in a v2 batch, length prefix included, as the record at `offset_delta` of a
/// batch whose base timestamp is `base`.
pub(crate) fn encoded_record_size(
    record: &NewRecord<'_>,
    offset_delta: i32,
    base: i64,
) -> Result<usize, EncodeError> {
    let body = body_size(record, offset_delta, base)?;
    // body_size checked that the record with its prefix fits an i32.
    Ok(varint_len(zigzag32(body as i32)) + body)
}

/// The record's size after its length prefix.
fn body_size(record: &NewRecord<'_>, offset_delta: i32, base: i64) -> Result<usize, EncodeError> {
    let ts_delta = timestamp_delta(record.timestamp, base)?;
    let header_count = len_i32("header count", record.headers.len())?;
    let mut n = 1
        + varint_len(zigzag64(ts_delta))
        + varint_len(zigzag32(offset_delta))
        + nullable_len("key", record.key)?
        + nullable_len("value", record.value)?
        + varint_len(zigzag32(header_count));
    for (k, v) in record.headers {
        n = n
            .checked_add(nullable_len("header key", Some(k))? + nullable_len("header value", *v)?)
            .ok_or(EncodeError::TooLong {
                field: "record",
                len: usize::MAX,
            })?;
    }
    // The whole record (with its prefix) must fit an i32 too.
    len_i32("record", n + 5)?;
    Ok(n)
}

fn zigzag32(v: i32) -> u64 {
    u64::from(((v << 1) ^ (v >> 31)) as u32)
}

fn zigzag64(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn varint_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

fn put_varint(buf: &mut BytesMut, mut v: u64) {
    while v >= 0x80 {
        buf.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    buf.put_u8(v as u8);
}

fn put_nullable(buf: &mut BytesMut, b: Option<&[u8]>) {
    match b {
        None => put_varint(buf, zigzag32(-1)),
        Some(b) => {
            put_varint(buf, zigzag32(b.len() as i32));
            buf.extend_from_slice(b);
        }
    }
}
