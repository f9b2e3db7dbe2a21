//! # snapfence
//!
//! A Kafka client written from the wire protocol up, for stream processors that keep per-key state as
//! snapshots in a compacted topic and must never let a stale owner overwrite that state.
//!
//! The crate is layered; every layer only calls the ones below it:
//!
//! | layer | what it owns |
//! |---|---|
//! | [`records`] | record batches: bytes ↔ batches, compression, read_committed visibility, the LSO from a log |
//! | [`wire`] | frames, request/response headers, API versions, the Kafka error-code table |
//! | [`net`] | connections, ApiVersions negotiation, metadata, routing to leaders and coordinators |
//! | [`producer`] | the idempotent and transactional producer (transaction versions 1 and 2) |
//! | [`consumer`] | the partition reader and the group consumer (classic and KIP-848) |
//! | [`snapshot`] | group-committed fenced snapshot writes, the recovery read, the per-key fold runtime |
//!
//! No C is linked in the default build: compression, checksums and the protocol are pure Rust.
#![deny(missing_docs)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

/// Declares an item `pub` when the `unstable-protocol` feature is on and `pub(crate)` otherwise, so the
/// protocol-level entry points (raw request structs in, raw responses out) are one declaration with two
/// visibilities instead of two copies.
macro_rules! unstable_pub {
    ($(#[$meta:meta])* pub $($item:tt)*) => {
        #[cfg(feature = "unstable-protocol")]
        #[cfg_attr(docsrs, doc(cfg(feature = "unstable-protocol")))]
        $(#[$meta])*
        pub $($item)*

        #[cfg(not(feature = "unstable-protocol"))]
        #[allow(dead_code, unused_imports)]
        $(#[$meta])*
        pub(crate) $($item)*
    };
}

pub mod admin;
pub mod consumer;
mod group_metadata;
pub mod net;
pub mod producer;
pub mod records;
pub mod snapshot;

#[cfg(feature = "unstable-protocol")]
#[cfg_attr(docsrs, doc(cfg(feature = "unstable-protocol")))]
pub mod wire;
#[cfg(not(feature = "unstable-protocol"))]
#[allow(dead_code, unused_imports)]
pub(crate) mod wire;

pub use group_metadata::{GroupMetadata, NotJoined};
pub use net::{Client, ClientConfig, NetError};
pub use wire::ErrorCode;

/// The fuzz targets' bodies, for cargo-fuzz and for replaying reproducers; not part of the public API.
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzz_harness;

#[cfg(test)]
mod bad_input_tests;
