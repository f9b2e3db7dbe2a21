//! The partition reader and the group consumer.

// The classic member that drives these lands in the next commits.
#[allow(dead_code)]
mod assignor;
mod error;
mod group_metadata;
#[allow(dead_code)]
mod protocol;
mod types;

pub use assignor::{Assignor, RebalanceProtocol};
pub use error::ConsumerError;
pub use group_metadata::{GroupMetadata, NotJoined};
pub use types::{TopicId, TopicPartition};
