//! Record batches (magic 2): decoding, encoding, compression, and read_committed visibility.
//!
//! # References
//! - Kafka protocol guide, "Record Batch" (message format v2, KIP-98)
