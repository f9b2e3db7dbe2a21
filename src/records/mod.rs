//! Record batches (magic 2): decoding, encoding, compression, and read_committed visibility.
//!
//! The layer is pure: bytes in, batches and records out, and back.
//!
//! - Readers hand a fetched partition's `records` bytes and aborted-transaction list to [`visible_in`]
//!   (or decode with [`decode_batches`] and call [`visible`]): the one place that decides which records
//!   a reader may deliver, at either [`IsolationLevel`], and where the next fetch starts. [`LogState`]
//!   finds open transactions and the LSO from a read_uncommitted scan alone.
//! - The producer fills a [`BatchBuilder`] and seals it into a [`SealedBatch`] whose bytes every retry
//!   resends.
//!
//! Decoding is zero-copy for uncompressed batches: keys, values and header values are slices of the
//! fetched buffer ([`RecordRef`] borrows them, [`Record`] holds them as `Bytes`). Every batch's CRC-32C is
//! checked. Every malformation is a [`DecodeError`]; nothing panics on input and nothing is allocated
//! from a length before it is checked against the bytes left. Compressed sections (gzip, snappy, lz4,
//! zstd, all pure Rust) are decompressed under a cap, so a decompression bomb is an error too.
//!
//! # References
//! - Kafka protocol guide, "Record Batch" (message format v2, KIP-98)
//! - KIP-98 (transactions, control records, LSO), KIP-110 (zstd), KIP-534 (delete horizon)

mod batch;
mod builder;
mod compression;
mod error;
mod visibility;

pub use batch::{
    decode_batches, BatchAttributes, Batches, ControlMarker, Header, HeaderIter, Record,
    RecordBatch, Records, TimestampType,
};
pub(crate) use builder::encoded_record_size;
pub use builder::{control_batch, BatchBuilder, NewRecord, ProducerStamp, SealedBatch};
pub use compression::{Compression, DEFAULT_MAX_DECOMPRESSED};
pub use error::{DecodeError, EncodeError};
pub use visibility::{
    visible, visible_in, AbortedTransaction, IsolationLevel, LogState, OpenTransaction, RecordRef,
    Visible,
};

/// Internals the fuzz targets drive directly; not part of the public API.
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing {
    use super::{Compression, DecodeError, EncodeError};

    /// Decompresses `input` as `codec` with an output cap.
    pub fn decompress(
        codec: Compression,
        input: &[u8],
        limit: usize,
    ) -> Result<Vec<u8>, DecodeError> {
        super::compression::decompress(codec, input, limit)
    }

    /// Compresses `input` as `codec`.
    pub fn compress(codec: Compression, input: &[u8]) -> Result<Vec<u8>, EncodeError> {
        super::compression::compress(codec, input)
    }

    /// Recomputes a batch's CRC-32C after its covered bytes (attributes onwards) were edited.
    pub fn fix_crc(raw: &mut [u8]) {
        let crc = crc32c::crc32c(&raw[21..]);
        raw[17..21].copy_from_slice(&crc.to_be_bytes());
    }

    /// A magic-2 batch at `base_offset` from `producer_id` around a hand-made record `section`, with
    /// a correct length and CRC and everything else zero, so tests and fuzzers can put any bytes
    /// past the CRC check.
    pub fn raw_batch(
        base_offset: i64,
        producer_id: i64,
        attributes: i16,
        last_offset_delta: i32,
        count: i32,
        section: &[u8],
    ) -> Vec<u8> {
        let mut raw = vec![0u8; 61];
        raw[..8].copy_from_slice(&base_offset.to_be_bytes());
        raw[8..12].copy_from_slice(&((49 + section.len()) as i32).to_be_bytes());
        raw[16] = 2;
        raw[21..23].copy_from_slice(&attributes.to_be_bytes());
        raw[23..27].copy_from_slice(&last_offset_delta.to_be_bytes());
        raw[43..51].copy_from_slice(&producer_id.to_be_bytes());
        raw[57..61].copy_from_slice(&count.to_be_bytes());
        raw.extend_from_slice(section);
        fix_crc(&mut raw);
        raw
    }
}

#[cfg(test)]
pub(crate) mod tests;
