//! The records layer's errors: one for bytes that cannot be read, one for batches that cannot be built.

use super::Compression;

/// Why bytes could not be decoded as record batches.
///
/// Every variant is a property of the input, never of this process: the same bytes always give the same
/// error. A partial trailing batch is not an error (see [`Batches`](super::Batches)).
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// A magic 0 or 1 message set (Kafka before 0.11); this client reads magic 2 only.
    #[error("legacy message set with magic {magic} at offset {offset}; only magic 2 is supported")]
    LegacyMessageSet {
        /// The magic byte found.
        magic: i8,
        /// The offset field in front of the message set.
        offset: i64,
    },
    /// A magic byte that no Kafka version writes.
    #[error("unknown magic {magic} at offset {offset}")]
    UnknownMagic {
        /// The magic byte found.
        magic: i8,
        /// The base offset field of the batch.
        offset: i64,
    },
    /// The batch length field is smaller than the fixed batch header.
    #[error("batch at offset {offset} declares length {length}, below the 49-byte header")]
    BatchLengthTooSmall {
        /// The base offset field of the batch.
        offset: i64,
        /// The declared batch length.
        length: i32,
    },
    /// The CRC-32C over attributes..end does not match the one stored in the header.
    #[error("batch at offset {offset}: CRC-32C mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    CrcMismatch {
        /// The base offset field of the batch.
        offset: i64,
        /// The CRC stored in the batch header.
        stored: u32,
        /// The CRC of the bytes received.
        computed: u32,
    },
    /// Attribute bits 0-2 name a codec Kafka does not define (5, 6 or 7).
    #[error("batch at offset {offset}: unknown compression codec {codec}")]
    UnknownCompression {
        /// The base offset field of the batch.
        offset: i64,
        /// The codec id from the attributes.
        codec: u8,
    },
    /// The header's last offset delta is negative.
    #[error("batch at offset {offset}: negative last offset delta {delta}")]
    NegativeLastOffsetDelta {
        /// The base offset field of the batch.
        offset: i64,
        /// The declared last offset delta.
        delta: i32,
    },
    /// The record count is negative, or more records than the bytes that remain could hold.
    #[error("batch at offset {offset}: record count {count} impossible in {bytes} bytes")]
    BadRecordCount {
        /// The base offset field of the batch.
        offset: i64,
        /// The declared record count.
        count: i32,
        /// The bytes available for the records (after decompression, for compressed batches).
        bytes: usize,
    },
    /// A varint ran past 5 bytes (10 for a varlong) or set bits beyond its width.
    #[error("varint overflow")]
    VarintOverflow,
    /// The bytes ended in the middle of a field inside a complete batch.
    #[error("{field} runs past the end of its record or batch")]
    Overrun {
        /// The field being read.
        field: &'static str,
    },
    /// A length other than -1 (null) was negative.
    #[error("negative length {length} for {field}")]
    NegativeLength {
        /// The field whose length was negative.
        field: &'static str,
        /// The length read.
        length: i32,
    },
    /// A record's offset delta lies outside `0..=last_offset_delta` of its batch.
    #[error("record offset delta {delta} outside 0..={last_offset_delta}")]
    OffsetDeltaOutOfRange {
        /// The record's offset delta.
        delta: i32,
        /// The batch's last offset delta.
        last_offset_delta: i32,
    },
    /// `base_offset + last_offset_delta` does not fit an i64.
    #[error("batch at offset {offset}: last offset delta {delta} overflows the offset space")]
    OffsetOverflow {
        /// The base offset field of the batch.
        offset: i64,
        /// The declared last offset delta.
        delta: i32,
    },
    /// A record's fields ended before (or ran past) the length its length prefix declared.
    #[error("record declares {declared} bytes but its fields span {read}")]
    RecordLengthMismatch {
        /// The length prefix.
        declared: usize,
        /// The bytes its fields took.
        read: usize,
    },
    /// The record section had bytes left after the declared number of records.
    #[error("{bytes} bytes left after the last declared record")]
    TrailingBytes {
        /// How many bytes were left.
        bytes: usize,
    },
    /// A control batch whose record is not a control record (key shorter than 4 bytes, missing value, or
    /// a transaction marker value shorter than 6 bytes).
    #[error("malformed control record: {reason}")]
    BadControlRecord {
        /// What was wrong.
        reason: &'static str,
    },
    /// A compressed record section that the codec rejects.
    #[error("{codec:?} decompression failed: {message}")]
    Decompress {
        /// The codec of the batch.
        codec: Compression,
        /// The codec library's explanation.
        message: String,
    },
    /// A compressed record section that expands past the output cap (a decompression bomb, or a batch
    /// larger than this reader accepts).
    #[error("{codec:?} record section expands past the {limit}-byte cap")]
    DecompressedTooLarge {
        /// The codec of the batch.
        codec: Compression,
        /// The cap in bytes.
        limit: usize,
    },
}

/// Why a batch could not be built.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// A key, value, header or the whole record does not fit the protocol's i32 lengths.
    #[error("{field} of {len} bytes exceeds the protocol's i32 length")]
    TooLong {
        /// The field.
        field: &'static str,
        /// Its length.
        len: usize,
    },
    /// A record's timestamp is so far from the batch's first timestamp that the delta overflows i64.
    #[error("timestamp {timestamp} too far from the batch base timestamp {base}")]
    TimestampOutOfRange {
        /// The record's timestamp.
        timestamp: i64,
        /// The batch's base timestamp.
        base: i64,
    },
    /// A batch must hold at least one record.
    #[error("cannot seal a batch without records")]
    EmptyBatch,
    /// The batch already holds `i32::MAX` records.
    #[error("batch holds the maximum number of records")]
    TooManyRecords,
    /// The codec failed to compress (the pure-Rust encoders only fail on I/O to memory, so this is a bug).
    #[error("{codec:?} compression failed: {message}")]
    Compress {
        /// The codec.
        codec: Compression,
        /// The codec library's explanation.
        message: String,
    },
}
