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

pub mod acl;
pub mod campaign;
mod group;
pub mod member;
pub mod oauth;
pub mod raw;
pub mod tally;

pub use group::{describe_group, join_classic, GroupDescription};

pub use raw::{fetch_by_name, flow_topics};
