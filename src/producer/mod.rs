//! The idempotent and transactional producer.
//!
//! The logic lives in sans-IO cores that take `now` and answers in and hand requests out, so that it is
//! tested without a broker:
//!
//! - `txn`: the transaction state machine (TV1 and TV2), which request comes next;
//! - `classify`: the one table of what an error code means for the request that returned it;
//! - `sequence`: per-partition sequence numbers and the in-flight window (idempotence);
//! - `accumulator`: per-partition batching with a linger, a size bound and a memory bound.
//!
//! Errors come in classes the caller acts on: see [`ErrorClass`] and [`ProducerError`].
//!
//! # References
//! - KIP-98 (idempotence and transactions), KIP-360, KIP-447, KIP-588, KIP-890 (parts 1 and 2),
//!   KIP-939 (two-phase commit: `two_phase`)
//! - Message specs: Produce v3-13, InitProducerId v0-6, AddPartitionsToTxn v0-5, AddOffsetsToTxn v0-4,
//!   TxnOffsetCommit v0-5, EndTxn v0-5

mod accumulator;
mod budget;
mod classify;
mod config;
mod driver;
mod encoder;
mod error;
mod idempotent;
mod messages;
#[cfg(test)]
mod paused_tests;
mod produce_core;
mod record;
pub(crate) use record::partition_for_key;

/// The partition Kafka's default partitioner gives a record with key `key` among `partitions`
/// (murmur2 of the key, as the Java producer and this crate's [`Producer`] choose for a keyed record
/// without a partition): which input partition, and so which flow member, holds a key's state. A count
/// below 1 is taken as 1.
pub fn default_partition(key: &[u8], partitions: i32) -> i32 {
    partition_for_key(key, partitions.max(1))
}
mod sequence_core;
mod transactional;
mod two_phase;
mod txn;

pub use config::{ProducerConfig, TransactionalConfig};
pub use driver::Delivery;
pub use error::{ErrorClass, ProducerError};
pub use idempotent::Producer;
pub use record::{Header, OffsetAndMetadata, ProducerRecord, RecordMetadata, TopicPartition};
pub use sequence_core::ProducerIdEpoch;
pub use transactional::TransactionalProducer;
pub use two_phase::{Completion, ParsePreparedTxnError, PreparedTxn, TwoPhaseCommitRefusal};
pub use txn::TransactionState;
