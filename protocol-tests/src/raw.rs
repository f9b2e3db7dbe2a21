//! Requests the broker tests build by hand, shared so each file does not keep its own copy: a client on
//! the fixture, a fresh topic, a record batch, a Produce of one batch, a Fetch of one partition by name.
//!
//! Produce and Fetch are sent at v12 at most: they name topics, and v13 addresses them by id.

use std::time::Duration;

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{FetchRequest, ProduceRequest, TopicName, TransactionalId};
use kafka_protocol::protocol::StrBytes;
use snapfence::consumer::ReaderConfig;
use snapfence::net::{CallOptions, Client, ClientConfig, Target, Verdict};
use snapfence::records::{BatchBuilder, Compression, IsolationLevel, NewRecord, ProducerStamp};
use snapfence::ErrorCode;

use crate::{unique, KafkaCluster};

/// The newest Produce and Fetch that name topics.
pub const BY_NAME: i16 = 12;

/// A client on the fixture's bootstrap address.
pub async fn connect(kafka: &KafkaCluster) -> Client {
    Client::connect(ClientConfig::new(kafka.bootstrap()))
        .await
        .expect("connect")
}

/// A new topic named from `prefix`, with `partitions` partitions and one replica.
pub async fn new_topic(client: &Client, prefix: &str, partitions: i32) -> String {
    let name = unique(prefix);
    snapfence::admin::create_topic(client, &name, partitions, 1, &[])
        .await
        .expect("create topic");
    name
}

/// One uncompressed batch of `values` (no keys, timestamp 0) sealed with `stamp`.
pub fn batch<S: AsRef<str>>(values: &[S], stamp: ProducerStamp) -> bytes::Bytes {
    let mut b = BatchBuilder::new(Compression::None, 1 << 20);
    for v in values {
        let appended = b
            .try_append(&NewRecord {
                timestamp: 0,
                key: None,
                value: Some(v.as_ref().as_bytes()),
                headers: &[],
            })
            .expect("encode");
        assert!(appended);
    }
    b.seal(stamp).expect("seal").bytes().clone()
}

/// A Produce (acks=all) of one batch to `topic`'s `partition`, retried while the answer is retriable;
/// panics on any other error. Returns the base offset.
pub async fn produce_raw(
    client: &Client,
    topic: &str,
    partition: i32,
    records: bytes::Bytes,
    transactional_id: Option<&str>,
) -> i64 {
    let (code, offset) = client
        .call(
            Target::leader(topic, partition),
            &CallOptions {
                max_version: Some(BY_NAME),
                ..CallOptions::default()
            },
            |_| {
                ProduceRequest::default()
                    .with_transactional_id(
                        transactional_id
                            .map(|id| TransactionalId(StrBytes::from_string(id.to_owned()))),
                    )
                    .with_acks(-1)
                    .with_timeout_ms(30_000)
                    .with_topic_data(vec![TopicProduceData::default()
                        .with_name(TopicName(StrBytes::from_string(topic.to_owned())))
                        .with_partition_data(vec![PartitionProduceData::default()
                            .with_index(partition)
                            .with_records(Some(records.clone()))])])
            },
            |r, _| {
                let p = &r.responses[0].partition_responses[0];
                Verdict::from_code(p.error_code, (p.error_code, p.base_offset))
            },
        )
        .await
        .expect("produce");
    assert_eq!(code, 0, "produce error {}", ErrorCode::from_code(code));
    offset
}

/// [`produce_raw`] of `values` as one non-transactional batch.
pub async fn produce<S: AsRef<str>>(
    client: &Client,
    topic: &str,
    partition: i32,
    values: &[S],
) -> i64 {
    produce_raw(
        client,
        topic,
        partition,
        batch(values, ProducerStamp::NONE),
        None,
    )
    .await
}

/// A Fetch of one partition by topic name from `offset` at `isolation`, up to 8 MiB, sessionless:
/// what the tests that read a log back by hand send.
pub fn fetch_by_name(
    topic: &str,
    partition: i32,
    offset: i64,
    isolation: IsolationLevel,
) -> FetchRequest {
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

/// A reader at `isolation` that waits at most 100 ms per fetch, so tests notice the end quickly.
pub fn reader_config(isolation: IsolationLevel) -> ReaderConfig {
    let mut c = ReaderConfig::default();
    c.isolation = isolation;
    c.max_wait = Duration::from_millis(100);
    c
}

/// A flow's two topics, named from `prefix`: an input of `partitions` partitions and a compacted snapshot
/// topic of as many, both at the broker's default replication. Returns (input, snapshots).
pub async fn flow_topics(client: &Client, prefix: &str, partitions: i32) -> (String, String) {
    let (input, snapshots) = (
        unique(&format!("{prefix}-in")),
        unique(&format!("{prefix}-snaps")),
    );
    snapfence::admin::create_topic(client, &input, partitions, -1, &[])
        .await
        .expect("create the input topic");
    let compact = [("cleanup.policy", "compact")];
    snapfence::admin::create_topic(client, &snapshots, partitions, -1, &compact)
        .await
        .expect("create the snapshot topic");
    (input, snapshots)
}
