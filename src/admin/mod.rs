//! Administrative calls: topics, configuration, and the KIP-664 transaction tools.
//!
//! Each is a function over a connected [`Client`](crate::Client) that speaks one kind of request and
//! answers in snapfence's own types, so nothing here ties a caller to the protocol library's structs.
//! The layer sits on `net`, beside `producer` and `consumer`; it calls only downward.
//!
//! - Topics: [`create_topic`], [`delete_topic`].
//! - Configuration: [`describe_configs`] for a topic or a broker, [`topic_config`] for one setting
//!   (such as a snapshot topic's `cleanup.policy`); [`two_phase_commit_enabled`] for the
//!   transaction coordinator's KIP-939 switch.
//! - Hanging transactions (KIP-664): [`describe_producers`] / [`describe_producers_on`],
//!   [`list_transactions`], [`describe_transaction`], and [`write_abort_marker`] to end one that no
//!   coordinator will.
//!
//! Errors are [`NetError`](crate::NetError)s; an error code the broker answered with is
//! [`NetError::error_code`](crate::NetError::error_code).
//!
//! # References
//! - CreateTopics (19), DeleteTopics (20), DescribeConfigs (32)
//! - KIP-664: DescribeProducers (61), DescribeTransactions (65), ListTransactions (66), WriteTxnMarkers
//!   (27)

mod configs;
mod topics;
mod transactions;

#[cfg(test)]
mod tests;

pub use configs::{
    describe_configs, topic_config, two_phase_commit_enabled, ConfigEntry, ConfigResource,
    ConfigSource,
};
pub use topics::{create_topic, delete_topic};
pub use transactions::{
    describe_producers, describe_producers_on, describe_transaction, list_transactions,
    write_abort_marker, AbortMarker, PartitionProducers, ProducerState, TransactionDescription,
    TransactionListing,
};
