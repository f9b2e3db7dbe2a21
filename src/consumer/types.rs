//! Small value types the consumer's public API speaks in. They are the net layer's, shared with the
//! producer, so an assignment's partitions go into a transactional offset commit without conversion.

pub use crate::net::{TopicId, TopicPartition};
