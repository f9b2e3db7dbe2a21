//! The partition reader and the group consumer.

mod assignor;
mod config;
mod error;
#[allow(dead_code)] // driven by the partition reader, which lands with the net layer
mod fetcher;
mod group_metadata;
mod listener;
mod live;
#[allow(dead_code)] // driven by the async group consumer, which lands with the net layer
mod membership;
mod protocol;
#[allow(dead_code)] // idem
mod rebalance;
mod types;

pub use assignor::{Assignor, RebalanceProtocol};
pub use config::{GroupConfig, GroupProtocol};
pub use error::ConsumerError;
pub use fetcher::{OffsetReset, StartAt};
pub use group_metadata::{GroupMetadata, NotJoined};
pub use listener::RebalanceListener;
pub use live::GroupMetadataHandle;
pub use membership::LostReason;
pub use types::{TopicId, TopicPartition};
