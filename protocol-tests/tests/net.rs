//! The net layer against real Kafka brokers started by the fixture: version negotiation and features as
//! each release really reports them, topic creation, coordinator lookup, and re-routing after the leader
//! of a partition dies.

use std::time::{Duration, Instant};

use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{BrokerId, ListOffsetsRequest, ListOffsetsResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use protocol_tests::{cluster, dedicated, unique, ClusterSpec, KafkaCluster};
use snapfence::net::{CallOptions, Client, ClientConfig, CoordinatorKind, Target, Verdict};
use snapfence::ErrorCode;

// API keys used below.
const PRODUCE: i16 = 0;
const METADATA: i16 = 3;
const FIND_COORDINATOR: i16 = 10;
const API_VERSIONS: i16 = 18;
const END_TXN: i16 = 26;
const TXN_OFFSET_COMMIT: i16 = 28;

async fn client(cluster: &KafkaCluster) -> Client {
    Client::connect(ClientConfig::new(cluster.bootstrap()))
        .await
        .expect("connect to the fixture cluster")
}

/// Prints what a broker reported, so a run's log shows the real tables behind the assertions.
fn report(cluster: &KafkaCluster, client: &Client, node: i32) {
    let f = client.features();
    eprintln!(
        "kafka {}: finalized features {:?} (epoch {}); negotiated Produce v{:?}, EndTxn v{:?}, \
         TxnOffsetCommit v{:?}, Metadata v{:?}, FindCoordinator v{:?}",
        cluster.version(),
        f.finalized,
        f.epoch,
        client.api_version(node, PRODUCE),
        client.api_version(node, END_TXN),
        client.api_version(node, TXN_OFFSET_COMMIT),
        client.api_version(node, METADATA),
        client.api_version(node, FIND_COORDINATOR),
    );
}

/// Kafka 4.x with its default features has transaction version 2 finalized, and speaks the versions the
/// TV2 transaction path needs (Produce v12, EndTxn v5, TxnOffsetCommit v5).
#[tokio::test]
async fn kafka4_reports_transaction_version_2() {
    let cluster = cluster(ClusterSpec::kafka4()).await;
    let client = client(&cluster).await;
    let node = cluster.node_ids()[0];
    let versions = client.broker_versions(node).await.unwrap();
    report(&cluster, &client, node);
    assert!(versions.broker_range(API_VERSIONS).unwrap().1 >= 3);
    if cluster.is_external() {
        return;
    }
    let f = client.features();
    assert_eq!(f.transaction_version, 2, "{f:?}");
    assert_eq!(f.group_version, 1, "{f:?}");
    assert!(f.metadata_version.is_some(), "{f:?}");
    assert!(f.epoch >= 0);
    assert!(client.supports(node, PRODUCE, 12).await.unwrap());
    assert!(client.supports(node, END_TXN, 5).await.unwrap());
    assert!(client.supports(node, TXN_OFFSET_COMMIT, 5).await.unwrap());
    // Produce v13 (topics by id, KIP-516) is what the idempotent and TV2 producers send here, so every
    // producer test on this release writes by topic id.
    assert_eq!(client.api_version(node, PRODUCE), Some(13));
}

/// The same 4.x release formatted with transaction.version=1 reports level 1: the difference between
/// the two lives in the finalized features, not in the API versions the broker software supports.
#[tokio::test]
async fn kafka4_formatted_tv1_reports_transaction_version_1() {
    let cluster = cluster(ClusterSpec::kafka4_tv1()).await;
    if cluster.is_external() {
        return;
    }
    let client = client(&cluster).await;
    let node = cluster.node_ids()[0];
    let versions = client.broker_versions(node).await.unwrap();
    report(&cluster, &client, node);
    let f = client.features();
    assert_eq!(f.transaction_version, 1, "{f:?}");
    assert_eq!(f.level("transaction.version"), Some(1));
    // The software still has the TV2 request versions; the feature level is what gates their use.
    assert!(versions.usable_at_least(END_TXN, 5).is_some());
    let supported = f.supported.get("transaction.version").copied();
    assert!(
        supported.is_some_and(|(_, max)| max >= 2),
        "supported: {supported:?}"
    );
}

/// Kafka 3.9 predates transaction version 2: no TV2 finalized and no EndTxn v5 / Produce v12.
#[tokio::test]
async fn kafka39_has_no_transaction_version_2() {
    let cluster = cluster(ClusterSpec::kafka39()).await;
    if cluster.is_external() {
        return;
    }
    let client = client(&cluster).await;
    let node = cluster.node_ids()[0];
    let versions = client.broker_versions(node).await.unwrap();
    report(&cluster, &client, node);
    let f = client.features();
    assert!(f.transaction_version < 2, "{f:?}");
    assert!(f.metadata_version.is_some(), "{f:?}");
    assert!(versions.broker_range(END_TXN).unwrap().1 < 5);
    assert!(!client.supports(node, END_TXN, 5).await.unwrap());
    assert!(!client.supports(node, PRODUCE, 12).await.unwrap());
    // The handshake still used ApiVersions v3+, so features were reported at all.
    assert!(f.epoch >= 0);
}

/// A created topic has a leader for every partition as soon as create_topic returns, and a request
/// routed to that leader is served by it.
#[tokio::test]
async fn create_topic_then_route_to_its_leaders() {
    for spec in [ClusterSpec::kafka4(), ClusterSpec::kafka39()] {
        let cluster = cluster(spec).await;
        let client = client(&cluster).await;
        let topic = unique("net-create");
        snapfence::admin::create_topic(&client, &topic, 3, 1, &[("cleanup.policy", "compact")])
            .await
            .unwrap();
        let metadata = client.cached_metadata();
        let t = &metadata.topics[&topic];
        assert!(!t.id.is_zero(), "topic id from Metadata v10+");
        assert_eq!(t.partitions.len(), 3);
        for p in 0..3 {
            let leader = client.leader(&topic, p).await.unwrap();
            assert!(cluster.node_ids().contains(&leader.node), "{leader:?}");
            assert!(leader.epoch >= 0, "{leader:?}");
            let offset = latest_offset(&client, &topic, p).await;
            assert_eq!(offset, 0, "a new partition is empty");
        }

        let again = snapfence::admin::create_topic(&client, &topic, 3, 1, &[])
            .await
            .unwrap_err();
        assert_eq!(again.error_code(), Some(ErrorCode::TopicAlreadyExists));

        snapfence::admin::delete_topic(&client, &topic)
            .await
            .unwrap();
        let gone = client.metadata(&[&topic]).await.unwrap();
        assert_eq!(
            gone.topics.get(&topic).map(|t| t.error),
            Some(ErrorCode::UnknownTopicOrPartition)
        );
    }
}

/// FindCoordinator answers for a group and for a transactional id, singly and batched.
#[tokio::test]
async fn find_group_and_transaction_coordinators() {
    for spec in [ClusterSpec::kafka4(), ClusterSpec::kafka39()] {
        let cluster = cluster(spec).await;
        let client = client(&cluster).await;
        let nodes = cluster.node_ids();
        let group = client
            .coordinator(CoordinatorKind::Group, &unique("net-group"))
            .await
            .unwrap();
        assert!(nodes.contains(&group));
        let txn = client
            .coordinator(CoordinatorKind::Transaction, &unique("net-txn"))
            .await
            .unwrap();
        assert!(nodes.contains(&txn));

        let keys: Vec<String> = (0..5).map(|i| unique(&format!("net-batch-{i}"))).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let found = client
            .coordinators(CoordinatorKind::Transaction, &refs)
            .await
            .unwrap();
        assert_eq!(found.len(), keys.len());
        assert!(found.values().all(|n| nodes.contains(n)));
        let v = client.api_version(nodes[0], FIND_COORDINATOR).unwrap();
        eprintln!(
            "kafka {}: FindCoordinator v{v} (batched from v4)",
            cluster.version()
        );
    }
}

/// After the leader of a partition is killed, a request with `Target::Leader` reaches the new leader:
/// the client notices the dead connection, refreshes metadata until the controller has moved the
/// leadership, and retries.
#[tokio::test]
async fn request_to_a_killed_leader_is_rerouted_to_the_new_one() {
    let cluster = dedicated(ClusterSpec::three_nodes()).await;
    if cluster.is_external() {
        return;
    }
    let client = Client::connect(ClientConfig {
        max_retries: 60,
        request_timeout: Duration::from_secs(10),
        ..ClientConfig::new(cluster.bootstrap())
    })
    .await
    .unwrap();
    let topic = unique("net-failover");
    snapfence::admin::create_topic(&client, &topic, 1, 3, &[])
        .await
        .unwrap();
    let old = client.leader(&topic, 0).await.unwrap();
    assert_eq!(latest_offset(&client, &topic, 0).await, 0);

    cluster.kill(old.node);
    let started = Instant::now();
    let offset = latest_offset(&client, &topic, 0).await;
    assert_eq!(offset, 0);
    let new = client.leader(&topic, 0).await.unwrap();
    eprintln!(
        "leader moved from node {} (epoch {}) to node {} (epoch {}); rerouted in {:?}",
        old.node,
        old.epoch,
        new.node,
        new.epoch,
        started.elapsed()
    );
    assert_ne!(new.node, old.node);
    assert!(new.epoch > old.epoch);
}

/// ListOffsets(latest) for one partition, sent to its leader. A partition-level routing error (a
/// non-leader answers NOT_LEADER_OR_FOLLOWER) is handed back as a verdict, so the client re-routes.
async fn latest_offset(client: &Client, topic: &str, partition: i32) -> i64 {
    client
        .call(
            Target::leader(topic, partition),
            &CallOptions::default(),
            |_| {
                ListOffsetsRequest::default()
                    .with_replica_id(BrokerId(-1))
                    .with_topics(vec![ListOffsetsTopic::default()
                        .with_name(TopicName(StrBytes::from_string(topic.to_owned())))
                        .with_partitions(vec![ListOffsetsPartition::default()
                            .with_partition_index(partition)
                            .with_current_leader_epoch(-1)
                            .with_timestamp(-1)])])
            },
            |response: ListOffsetsResponse, _| {
                let p = &response.topics[0].partitions[0];
                Verdict::from_code(p.error_code, (p.error_code, p.offset))
            },
        )
        .await
        .map(|(code, offset)| {
            assert_eq!(ErrorCode::from_code(code), ErrorCode::None);
            offset
        })
        .unwrap()
}
