//! Connections, version negotiation, cluster metadata and request routing.
//!
//! [`Client`] is the entry point for every layer above: it keeps one connection per broker, negotiates
//! API versions on each (ApiVersions), caches metadata and coordinators, and routes each request to a
//! [`Target`] (any broker, one broker, a partition leader, a coordinator), retrying with a bounded
//! [`Backoff`] when the target moved or the connection failed.
//!
//! Frames are bounded by [`ClientConfig::max_frame_size`], and counts inside a frame by the frame: every
//! response is decoded by `snapfence-kafka-protocol`, a copy of kafka-protocol 0.18.0 that rejects an
//! array or byte-string length larger than the bytes left before allocating for it (0.18.0 did not; see
//! `vendor/kafka-protocol/README.md`). It is a normal dependency of this crate, not a workspace
//! `[patch]`, so the check holds in every program that links snapfence, whether by path, git or
//! registry; `scripts/check-dependent.sh` proves it from a crate outside the workspace.
//!
//! # References
//! - Kafka protocol guide: <https://kafka.apache.org/protocol.html>
//! - KIP-35 / KIP-511 (ApiVersions), KIP-584 (features), KIP-320 (leader epochs), KIP-516 (topic ids),
//!   KIP-699 (batched FindCoordinator), KIP-590 (admin request forwarding in KRaft), KIP-580 (back-off)
//! - KIP-43/KIP-152 (SASL handshake and authenticate), KIP-84 (SCRAM), KIP-368 (SASL session lifetime);
//!   TLS with rustls behind the `tls` feature

mod broker;
mod client;
mod config;
mod conn;
mod error;
mod metadata;
mod retry;
mod sasl;
#[cfg(feature = "tls")]
mod tls;
mod topic_config;

#[cfg(test)]
mod conn_tests;
#[cfg(test)]
mod stub_tests;
#[cfg(test)]
pub(crate) mod testing;

pub use crate::wire::{BrokerApiVersions, Features};
pub use client::{CallOptions, Client, CoordinatorKind, Target};
pub use config::ClientConfig;
pub use error::{ConnectionFailure, NetError};
pub use metadata::{
    BrokerInfo, ClusterMetadata, LeaderInfo, PartitionMetadata, TopicId, TopicMetadata,
    TopicPartition,
};
pub use retry::{retry_action, Backoff, RetryAction, Verdict};
pub use sasl::{AuthFailure, SaslConfig, SaslMechanism};
#[cfg(feature = "tls")]
pub use tls::TlsConfig;
