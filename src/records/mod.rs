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
}

#[cfg(test)]
mod tests;
