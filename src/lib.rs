//! # snapfence
//!
//! A pure-Rust Kafka client, written from the wire protocol up, for stream processors that keep per-key
//! state as snapshots in a compacted Kafka topic and must never let a stale owner overwrite that state.
//!
//! When a consumer group moves input partition P from owner A to owner B while A is still running (a GC
//! pause, a slow poll, a network blip), A can write one more snapshot after B's; on a last-write-wins
//! topic that stale snapshot wins, and the next recovery folds new input onto old state. snapfence writes
//! every snapshot inside a Kafka transaction together with the input offset it covers, committed with the
//! consumer group's generation (KIP-447), so the group coordinator refuses the stale write and nothing of
//! it lands.
//!
//! Start with [`snapshot::Flow`]: give it a [`snapshot::Fold`] (how one event changes one key's state)
//! and it runs the fenced fold for you: group membership, recovery of each assigned partition,
//! group-committed transactional snapshot writes. The repository's `examples/` hold short programs
//! (`balances`, `transform`, `recover`, `codec`), each run against a real broker by the tests.
//!
//! The crate is layered; every layer only calls the ones below it:
//!
//! | module | what it owns |
//! |---|---|
//! | [`records`] | record batches: bytes ↔ batches, compression, read_committed visibility ([`records::visible`]), the LSO from a log |
//! | `wire` (private) | frames, request/response headers, API versions, the Kafka error-code table |
//! | [`net`] | [`Client`]: connections, ApiVersions negotiation, metadata, routing to leaders and coordinators |
//! | [`admin`] | create and delete topics, read configuration, the KIP-664 hanging-transaction requests |
//! | [`producer`] | the idempotent and transactional producer (transaction versions 1 and 2) |
//! | [`consumer`] | the partition reader and the group consumer (classic and KIP-848) |
//! | [`snapshot`] | group-committed fenced snapshot writes, the recovery read, the per-key fold runtime |
//!
//! No C is linked in the default build: compression, checksums and the protocol are pure Rust.
//!
//! Metrics go through the [`metrics`](https://docs.rs/metrics) facade: install any exporter before
//! connecting, and call [`describe_metrics`] for the descriptions; the names are listed in
//! `docs/metrics.md`. With no exporter installed, nothing is recorded.
//!
//! # What is stable
//!
//! Everything reachable without a feature flag is the public API, and follows semantic versioning:
//!
//! - at the root: [`Client`], [`ClientConfig`], [`NetError`], [`ErrorCode`], [`Bytes`],
//!   [`describe_metrics`] (the metric names of `docs/metrics.md` are stable too),
//!   [`shutdown_signal`] (SIGTERM or SIGINT, for [`Flow::run`](snapshot::Flow::run)), and
//!   [`GroupMetadata`]
//!   (with [`NotJoined`]), the fencing token the consumer hands the transactional producer;
//! - the modules [`snapshot`], [`producer`], [`consumer`], [`admin`], [`records`] (the batch codec and
//!   the `visible` filter are a user feature, for readers of raw fetched bytes) and [`net`] (the
//!   client's configuration, security settings, metadata types and errors).
//!
//! No stable signature names a kafka-protocol type: that crate's versions are not snapfence's to
//! promise. The protocol layer is not stable: the `wire` module (request traits, frames, version
//! tables) and the raw-request calls on [`Client`] (`send`, `send_once`, `call`, with `Target`,
//! `CallOptions` and `Verdict`, plus the per-broker version queries) exist for the crate's own layers
//! and are public only with the **`unstable-protocol`** cargo feature, which carries no stability
//! promise at all. The snapfence CLI and the protocol tests enable it to send hand-built requests;
//! an application that needs one of those calls should ask for a typed function instead.
//!
//! Other features: `tls` (rustls; opt-in because its ring provider builds C) and `fuzzing` (decoder
//! internals for the cargo-fuzz targets, hidden and never part of the API).
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
/// The monotonic clock the drivers read (tokio's, so paused-time tests drive every deadline).
mod clock;
pub mod consumer;
mod group_metadata;
pub mod net;
pub mod producer;
pub mod records;
pub mod snapshot;
mod telemetry;

#[cfg(feature = "unstable-protocol")]
#[cfg_attr(docsrs, doc(cfg(feature = "unstable-protocol")))]
pub mod wire;
#[cfg(not(feature = "unstable-protocol"))]
#[allow(dead_code, unused_imports)]
pub(crate) mod wire;

mod shutdown;

/// Spawned tasks whose panics and cancellations are reported to their owners (crate-internal).
mod supervise;

#[doc(no_inline)]
pub use bytes::Bytes;
pub use group_metadata::{GroupMetadata, NotJoined};
pub use net::{Client, ClientConfig, NetError};
pub use shutdown::{shutdown_signal, ShutdownSignal};
pub use telemetry::describe_metrics;
pub use wire::ErrorCode;

/// The fuzz targets' bodies, for cargo-fuzz and for replaying reproducers; not part of the public API.
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzz_harness;

#[cfg(test)]
mod bad_input_tests;

// The README's Rust examples compile as doctests, so the first code a user copies cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExamples;
