//! The partition reader and the group consumer.

mod assignor;
mod config;
mod error;
mod exec;
mod fetcher;
mod group;
mod group_metadata;
mod listener;
mod live;
mod membership;
mod offsets;
mod protocol;
mod reader;
mod rebalance;
mod types;

pub use assignor::{Assignor, RebalanceProtocol};
pub use config::{GroupConfig, GroupProtocol};
pub use error::ConsumerError;
pub use fetcher::{OffsetReset, StartAt};
pub use group::{GroupConsumer, GroupConsumerConfig};
pub use group_metadata::{GroupMetadata, NotJoined};
pub use listener::RebalanceListener;
pub use live::GroupMetadataHandle;
pub use membership::LostReason;
pub use offsets::{commit_offsets, committed_offsets};
pub use reader::{list_offsets, OffsetSpec, PartitionReader, PartitionRecords, ReaderConfig};
pub use types::{TopicId, TopicPartition};
