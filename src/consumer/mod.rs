//! The partition reader and the group consumer.

mod group_metadata;

pub use group_metadata::{GroupMetadata, NotJoined};
