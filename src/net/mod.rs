//! Connections, version negotiation, cluster metadata and request routing.
//!
//! [`Client`] is the entry point for every layer above: it keeps one connection per broker, negotiates
//! API versions on each (ApiVersions), caches metadata and coordinators, and routes each request to a
//! target (any broker, one broker, a partition leader, a coordinator), retrying with a bounded
//! [`Backoff`] when the target moved or the connection failed.
//!
//! # Stability
//!
//! [`Client`] (connect, metadata, leaders, coordinators, features), [`ClientConfig`], the security
//! settings, the [`Dialer`] hook (how a connection's byte stream is opened: a tunnel, a proxy) and the
//! error types are stable. Sending a raw kafka-protocol request (`Client::send`,
//! `send_once`, `call`, with `Target` routing and `Verdict` handlers) and reading a broker's
//! version table are available only with the `unstable-protocol` feature: those signatures carry
//! kafka-protocol's types, which may change with any release. Administrative calls live in
//! [`crate::admin`] with snapfence's own types.
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
//! - KIP-43/KIP-152 (SASL handshake and authenticate), KIP-84 (SCRAM), KIP-255/RFC 7628 (OAUTHBEARER),
//!   KIP-342 (SASL extensions), KIP-368 (SASL session lifetime);
//!   TLS with rustls behind the `tls` feature

mod broker;
mod client;
mod config;
mod conn;
mod dial;
mod error;
mod metadata;
#[cfg(feature = "aws-msk-iam")]
mod msk_iam;
mod oauth;
mod retry;
mod sasl;
#[cfg(feature = "tls")]
mod tls;

#[cfg(test)]
mod conn_tests;
#[cfg(test)]
mod metrics_tests;
#[cfg(test)]
mod stub_tests;
#[cfg(test)]
pub(crate) mod testing;

pub use crate::wire::{Features, WireError};
pub use client::{Client, CoordinatorKind};
pub use config::{default_client_id, ClientConfig};
pub use dial::{DialFuture, DialedStream, Dialer, TcpDialer};
pub use error::{ConnectionFailure, NetError};
pub use metadata::{
    BrokerInfo, ClusterMetadata, LeaderInfo, PartitionMetadata, TopicId, TopicMetadata,
    TopicPartition,
};
#[cfg(feature = "aws-msk-iam")]
pub use msk_iam::{
    msk_iam_token, user_agent as msk_iam_user_agent, AwsCredentials, AwsCredentialsProvider,
    CredentialsFuture, TOKEN_LIFETIME as MSK_IAM_TOKEN_LIFETIME,
};
pub use oauth::{OAuthBearer, OAuthBearerToken, TokenError, TokenFuture, TokenProvider};
pub use retry::Backoff;
pub use sasl::{AuthFailure, SaslConfig, SaslMechanism, TokenRefusal};
#[cfg(feature = "tls")]
pub use tls::TlsConfig;

// The request-level API: raw kafka-protocol requests routed by hand, and the version tables. Stable
// code above this layer uses it inside the crate; outside, only behind `unstable-protocol`.
unstable_pub! {
    /// One broker's advertised API version ranges (unstable: `unstable-protocol`).
    pub use crate::wire::BrokerApiVersions;
}
unstable_pub! {
    /// Routing targets and per-call options of [`Client::call`] (unstable: `unstable-protocol`).
    pub use client::{connection_of_key, connection_of_partition, CallOptions, Target};
}
unstable_pub! {
    /// How a response handler tells the routing loop to finish, re-route or retry (unstable:
    /// `unstable-protocol`).
    pub use retry::{retry_action, RetryAction, Verdict};
}
