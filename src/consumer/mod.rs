//! The partition reader and the group consumer.
//!
//! - [`PartitionReader`]: reads assigned partitions at read_uncommitted or read_committed (through the
//!   records layer's visibility engine), tracks positions, bounds memory with `max_bytes`, follows
//!   leader changes with leader epochs, and resets out-of-range positions only by an explicit
//!   [`OffsetReset`]. [`list_offsets`] gives earliest and end offsets (the end is the high watermark at
//!   read_uncommitted and the last stable offset at read_committed).
//! - [`GroupConsumer`]: a consumer group member under the classic protocol (eager `range` /
//!   `roundrobin`, or `cooperative-sticky`; optional static membership) or the KIP-848 consumer
//!   protocol. Rebalance handlers ([`RebalanceListener`]) are awaited before the group may move on;
//!   the fencing token is a live [`GroupMetadataHandle`] published on the poll path.
//! - [`commit_offsets`] / [`committed_offsets`]: OffsetCommit and OffsetFetch for the default,
//!   non-transactional mode (auto-commit is off unless configured).
//!
//! The membership protocols are sans-IO state machines (`membership/`), driven by one background
//! task per consumer; `docs/consumer.md` walks through the revocation interleavings.
//!
//! # References
//! - KIP-98 / KIP-447 (transactions, read_committed, the fencing token in offset commits)
//! - KIP-320 (leader epochs in Fetch and ListOffsets), KIP-74 (fetch size bounds)
//! - KIP-62, KIP-345, KIP-394, KIP-429 (classic: rebalance timeout, static membership, member id
//!   required, cooperative rebalancing)
//! - KIP-848, KIP-1082 (the consumer protocol, client-generated member ids)

mod assignor;
mod config;
mod error;
mod exec;
mod fetch_core;
mod group;
mod listener;
mod live;
mod membership;
mod offsets;
mod protocol;
pub(crate) mod reader;
mod rebalance;
mod session_core;
mod types;

#[cfg(test)]
mod idle_tests;
#[cfg(test)]
pub(crate) mod supervise_tests;

pub use assignor::{Assignor, RebalanceProtocol};
pub use config::{GroupConfig, GroupProtocol};
pub use error::ConsumerError;
pub use fetch_core::{OffsetReset, StartAt};
pub use group::{GroupConsumer, GroupConsumerConfig};
pub use listener::RebalanceListener;
pub use live::GroupMetadataHandle;
pub use membership::LostReason;
pub(crate) use offsets::commit_offsets_with_metadata;
pub use offsets::{commit_offsets, committed_offsets, committed_offsets_and_metadata};
pub use reader::{
    epoch_end_offset, list_offsets, FetchStats, OffsetSpec, PartitionReader, PartitionRecords,
    ReaderConfig,
};
pub use types::{TopicId, TopicPartition};

/// Internals the cargo-fuzz targets drive directly; not part of the public API.
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing {
    use bytes::Bytes;

    use super::protocol::{Assignment, Subscription, HIGHEST_VERSION};
    use super::ConsumerError;

    /// Decodes a JoinGroup subscription blob; a blob that decodes must survive a round trip through
    /// the encoder at the highest version unchanged (`Ok(false)` otherwise).
    pub fn subscription_round_trips(blob: Bytes) -> Result<bool, ConsumerError> {
        let s = Subscription::decode(blob)?;
        Ok(Subscription::decode(s.encode(HIGHEST_VERSION))? == s)
    }

    /// The same for a SyncGroup assignment blob.
    pub fn assignment_round_trips(blob: Bytes) -> Result<bool, ConsumerError> {
        let a = Assignment::decode(blob)?;
        Ok(Assignment::decode(a.encode(HIGHEST_VERSION))? == a)
    }
}
