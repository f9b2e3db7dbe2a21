//! Every test of snapfence that talks to a real Kafka broker, and the pieces they share: the fenced fold
//! the flow tests and the fault campaign check against ([`tally`]), flow members run as processes of their
//! own ([`member`]), the campaign itself ([`campaign`]) and a raw classic-group join ([`join_classic`]).
//!
//! The broker comes from the [`kafka_fixture`] crate (re-exported here whole, so a test writes
//! `protocol_tests::cluster(...)`): a real Apache Kafka run from Maven Central jars, no Docker.
//!
//! ```no_run
//! # async fn demo() {
//! use protocol_tests::{cluster, unique, ClusterSpec};
//! let kafka = cluster(ClusterSpec::kafka4()).await; // shared by every test in this binary
//! let topic = unique("orders"); // tests share the cluster, so names must not collide
//! println!("{} runs Kafka {} at {}", topic, kafka.version(), kafka.bootstrap());
//! # }
//! ```
#![deny(missing_docs)]

pub use kafka_fixture::*;

pub mod campaign;
mod group;
pub mod member;
pub mod tally;

pub use group::join_classic;

/// A Fetch of one partition by topic name (v12 and below, which every 3.9 and 4.x broker speaks) from
/// `offset` at `isolation`, up to 8 MiB: what the tests that read a log back by hand send, sessionless.
pub fn fetch_by_name(
    topic: &str,
    partition: i32,
    offset: i64,
    isolation: snapfence::records::IsolationLevel,
) -> kafka_protocol::messages::FetchRequest {
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::{FetchRequest, TopicName};
    use kafka_protocol::protocol::StrBytes;
    FetchRequest::default()
        .with_replica_id((-1).into())
        .with_max_wait_ms(50)
        .with_min_bytes(1)
        .with_max_bytes(16 << 20)
        .with_isolation_level(isolation.as_i8())
        .with_session_epoch(-1)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(StrBytes::from_string(topic.to_owned())))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(partition)
                .with_fetch_offset(offset)
                .with_log_start_offset(-1)
                .with_current_leader_epoch(-1)
                .with_partition_max_bytes(8 << 20)])])
}
