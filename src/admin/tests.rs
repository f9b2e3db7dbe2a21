//! The admin functions' reading of decoded answers into snapfence's own types, against a loopback stub
//! that answers with fixed responses. The stub claims nothing about how a broker behaves (the
//! protocol-tests crate and the CLI's find-hanging test check that against real brokers); it only
//! pins the mapping from kafka-protocol's structs to the public types.

use std::net::SocketAddr;
use std::time::Duration;

use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult,
};
use kafka_protocol::messages::describe_producers_response::{
    PartitionResponse, ProducerState as WireProducer, TopicResponse,
};
use kafka_protocol::messages::{
    DescribeConfigsResponse, DescribeProducersResponse, ProducerId, TopicName,
};

use super::{describe_configs, describe_producers_on, ConfigResource, ConfigSource};
use crate::net::testing::{api_versions, loopback, one_node_metadata, Peer};
use crate::{Client, ClientConfig, ErrorCode};

async fn stub() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    loopback(serve).await
}

async fn serve(mut peer: Peer, addr: SocketAddr) {
    while let Some(request) = peer.next_request().await {
        let id = request.header.correlation_id;
        let version = request.header.request_api_version;
        match request.header.request_api_key {
            18 => {
                let answer = api_versions(&[(18, 0, 3), (3, 1, 12), (32, 1, 4), (61, 0, 0)]);
                peer.respond(id, &answer, version.min(3)).await;
            }
            3 => {
                let answer = one_node_metadata(addr, &[("t", 2)]);
                peer.respond(id, &answer, version).await;
            }
            32 => {
                let entry = |n: &str, v: &str, source| {
                    DescribeConfigsResourceResult::default()
                        .with_name(n.to_owned().into())
                        .with_value(Some(v.to_owned().into()))
                        .with_config_source(source)
                };
                let answer = DescribeConfigsResponse::default().with_results(vec![
                    DescribeConfigsResult::default()
                        .with_resource_type(2)
                        .with_resource_name("t".into())
                        .with_configs(vec![
                            entry("cleanup.policy", "compact", 1),
                            // Not asked for: a broker that says more must not widen the answer.
                            entry("retention.ms", "1000", 5),
                        ]),
                ]);
                peer.respond(id, &answer, version).await;
            }
            61 => {
                let open = WireProducer::default()
                    .with_producer_id(ProducerId(42))
                    .with_producer_epoch(3)
                    .with_last_sequence(9)
                    .with_last_timestamp(1_000)
                    .with_coordinator_epoch(-1)
                    .with_current_txn_start_offset(17);
                let answer =
                    DescribeProducersResponse::default().with_topics(vec![TopicResponse::default(
                    )
                    .with_name(TopicName("t".into()))
                    .with_partitions(vec![
                        PartitionResponse::default()
                            .with_partition_index(0)
                            .with_active_producers(vec![open]),
                        PartitionResponse::default()
                            .with_partition_index(1)
                            .with_error_code(ErrorCode::NotLeaderOrFollower.code()),
                    ])]);
                peer.respond(id, &answer, version).await;
            }
            other => panic!("the stub does not serve api key {other}"),
        }
    }
}

async fn client(addr: SocketAddr) -> Client {
    let config = ClientConfig {
        bootstrap: vec![addr.to_string()],
        request_timeout: Duration::from_secs(10),
        retry_backoff: Duration::from_millis(10),
        ..ClientConfig::default()
    };
    Client::connect(config).await.unwrap()
}

/// A topic's configuration comes back in snapfence's types, filtered to the names asked for.
#[tokio::test]
async fn describe_configs_maps_entries_and_keeps_to_the_names_asked() {
    let (addr, task) = stub().await;
    let c = client(addr).await;
    let configs = describe_configs(&c, &ConfigResource::Topic("t".into()), &["cleanup.policy"])
        .await
        .unwrap();
    assert_eq!(configs.len(), 1, "{configs:?}");
    let policy = &configs["cleanup.policy"];
    assert_eq!(policy.value.as_deref(), Some("compact"));
    assert_eq!(policy.source, ConfigSource::Topic);
    task.abort();
}

/// A batched DescribeProducers keeps each partition's own outcome: producers for one, the error code
/// for the other, so a caller can retry only the partition that moved.
#[tokio::test]
async fn describe_producers_on_keeps_per_partition_outcomes() {
    let (addr, task) = stub().await;
    let c = client(addr).await;
    let asked = [("t".to_owned(), 0), ("t".to_owned(), 1)];
    let answers = describe_producers_on(&c, 1, &asked).await.unwrap();
    let open = answers[&asked[0]].as_ref().unwrap();
    assert_eq!(open.len(), 1);
    assert!(open[0].has_open_transaction());
    assert_eq!(open[0].txn_start_offset, 17);
    assert_eq!(open[0].abort_marker().producer_id, 42);
    let moved = answers[&asked[1]].as_ref().unwrap_err();
    assert_eq!(moved.error_code(), Some(ErrorCode::NotLeaderOrFollower));
    task.abort();
}
