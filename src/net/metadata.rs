//! The client's view of the cluster: brokers, topics, partition leaders and their epochs.
//!
//! # References
//! - Metadata API (key 3): leader epochs from v7 (KIP-320), topic ids from v10 (KIP-516)

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use kafka_protocol::messages::MetadataResponse;

use crate::wire::ErrorCode;

/// A broker as the cluster advertises it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerInfo {
    /// The broker's node id.
    pub node_id: i32,
    /// Advertised host.
    pub host: String,
    /// Advertised port.
    pub port: i32,
    /// Rack, if configured.
    pub rack: Option<String>,
}

impl BrokerInfo {
    /// `host:port`.
    pub fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// One partition of one topic: the address every layer above speaks in.
///
/// The topic name is an `Arc<str>` so the many copies a client keeps (assignments, positions, in-flight
/// batches, handler arguments) share one allocation per topic.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicPartition {
    /// The topic name.
    pub topic: Arc<str>,
    /// The partition index.
    pub partition: i32,
}

impl TopicPartition {
    /// A partition of `topic`.
    pub fn new(topic: impl Into<Arc<str>>, partition: i32) -> Self {
        TopicPartition {
            topic: topic.into(),
            partition,
        }
    }
}

impl fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}

/// A topic's id (KIP-516), as its 16 raw bytes. All zeros when the broker did not send one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct TopicId(pub [u8; 16]);

impl TopicId {
    /// Whether this is the all-zero "no id" value.
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }
}

impl fmt::Display for TopicId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// One partition's placement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionMetadata {
    /// The partition index.
    pub partition: i32,
    /// The leader's node id, or -1 while there is none.
    pub leader: i32,
    /// The leader epoch, or -1 if the broker does not report it (Metadata below v7).
    pub leader_epoch: i32,
    /// All replicas.
    pub replicas: Vec<i32>,
    /// In-sync replicas.
    pub isr: Vec<i32>,
    /// Replicas that are offline.
    pub offline_replicas: Vec<i32>,
    /// The partition-level error (e.g. LEADER_NOT_AVAILABLE).
    pub error: ErrorCode,
}

/// One topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicMetadata {
    /// The topic's name.
    pub name: String,
    /// The topic's id.
    pub id: TopicId,
    /// Whether this is an internal topic (`__consumer_offsets`, `__transaction_state`).
    pub is_internal: bool,
    /// The topic-level error (e.g. UNKNOWN_TOPIC_OR_PARTITION).
    pub error: ErrorCode,
    /// Partitions by index.
    pub partitions: BTreeMap<i32, PartitionMetadata>,
}

/// Where a partition's leader is, and at which epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaderInfo {
    /// The leader's node id.
    pub node: i32,
    /// Its leader epoch (-1 if unknown). Send it in Fetch/ListOffsets/OffsetForLeaderEpoch so the
    /// broker can fence a client holding stale metadata (KIP-320).
    pub epoch: i32,
}

/// A snapshot of what the client knows about the cluster. Immutable; the client swaps in a new one on
/// every refresh.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterMetadata {
    /// The cluster id.
    pub cluster_id: Option<String>,
    /// The controller's node id as the broker reports it (in KRaft mode, a broker that forwards admin
    /// requests to the active controller), or -1.
    pub controller_id: i32,
    /// Brokers by node id.
    pub brokers: BTreeMap<i32, BrokerInfo>,
    /// Topics by name: only those this client asked about, as of their last refresh.
    pub topics: BTreeMap<String, TopicMetadata>,
}

impl ClusterMetadata {
    /// The leader of `topic`/`partition`, if known.
    ///
    /// A partition error does not hide a leader that is there: REPLICA_NOT_AVAILABLE, for one, comes
    /// with a valid leader, and the broker reports "no leader" as leader -1.
    pub fn leader(&self, topic: &str, partition: i32) -> Option<LeaderInfo> {
        let p = self.topics.get(topic)?.partitions.get(&partition)?;
        (p.leader >= 0).then_some(LeaderInfo {
            node: p.leader,
            epoch: p.leader_epoch,
        })
    }

    /// A copy with `response` folded in: the broker list is replaced (it is always complete), the topics
    /// it describes are replaced, and other cached topics are kept.
    pub(crate) fn merged(&self, response: &MetadataResponse) -> ClusterMetadata {
        let mut next = self.clone();
        next.cluster_id = response.cluster_id.as_ref().map(|c| c.to_string());
        next.controller_id = response.controller_id.0;
        next.brokers = response
            .brokers
            .iter()
            .map(|b| {
                let info = BrokerInfo {
                    node_id: b.node_id.0,
                    host: b.host.to_string(),
                    port: b.port,
                    rack: b.rack.as_ref().map(|r| r.to_string()),
                };
                (info.node_id, info)
            })
            .collect();
        for t in &response.topics {
            let Some(name) = t.name.as_ref().map(|n| n.0.to_string()) else {
                continue;
            };
            let error = ErrorCode::from_code(t.error_code);
            let topic = TopicMetadata {
                name: name.clone(),
                id: TopicId(*t.topic_id.as_bytes()),
                is_internal: t.is_internal,
                error,
                partitions: t
                    .partitions
                    .iter()
                    .map(|p| {
                        let meta = PartitionMetadata {
                            partition: p.partition_index,
                            leader: p.leader_id.0,
                            leader_epoch: p.leader_epoch,
                            replicas: p.replica_nodes.iter().map(|n| n.0).collect(),
                            isr: p.isr_nodes.iter().map(|n| n.0).collect(),
                            offline_replicas: p.offline_replicas.iter().map(|n| n.0).collect(),
                            error: ErrorCode::from_code(p.error_code),
                        };
                        (meta.partition, meta)
                    })
                    .collect(),
            };
            next.topics.insert(name, topic);
        }
        next
    }

    /// A copy without `topic`, so the next lookup refreshes it.
    pub(crate) fn without_topic(&self, topic: &str) -> Option<ClusterMetadata> {
        self.topics.contains_key(topic).then(|| {
            let mut next = self.clone();
            next.topics.remove(topic);
            next
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::metadata_response::{
        MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
    };
    use kafka_protocol::messages::{BrokerId, TopicName};

    fn response(topic: &str, leader: i32, epoch: i32) -> MetadataResponse {
        MetadataResponse::default()
            .with_cluster_id(Some("c".into()))
            .with_controller_id(BrokerId(1))
            .with_brokers(vec![MetadataResponseBroker::default()
                .with_node_id(BrokerId(1))
                .with_host("h".into())
                .with_port(9)])
            .with_topics(vec![MetadataResponseTopic::default()
                .with_name(Some(TopicName(topic.to_owned().into())))
                .with_partitions(vec![MetadataResponsePartition::default()
                    .with_partition_index(0)
                    .with_leader_id(BrokerId(leader))
                    .with_leader_epoch(epoch)])])
    }

    /// Merging a metadata answer replaces only the topics it describes and keeps the rest, and a removed
    /// topic no longer routes.
    #[test]
    fn merge_keeps_other_topics_and_replaces_described_ones() {
        let m = ClusterMetadata::default().merged(&response("a", 1, 5));
        let m = m.merged(&response("b", 1, 2));
        assert_eq!(m.leader("a", 0), Some(LeaderInfo { node: 1, epoch: 5 }));
        let m = m.merged(&response("a", 1, 6));
        assert_eq!(m.leader("a", 0), Some(LeaderInfo { node: 1, epoch: 6 }));
        assert_eq!(m.leader("b", 0).map(|l| l.epoch), Some(2));
        assert_eq!(m.brokers[&1].addr(), "h:9");
        let m = m.without_topic("a").unwrap();
        assert_eq!(m.leader("a", 0), None);
        assert!(m.without_topic("a").is_none());
    }

    /// A partition with no leader (-1), or one not described, has no leader to route to.
    #[test]
    fn no_leader_means_none() {
        let m = ClusterMetadata::default().merged(&response("a", -1, 0));
        assert_eq!(m.leader("a", 0), None);
        assert_eq!(m.leader("a", 1), None);
    }

    /// A partition error that comes with a leader (REPLICA_NOT_AVAILABLE) must not stop routing to it.
    #[test]
    fn partition_error_with_a_leader_still_routes() {
        let mut r = response("a", 1, 3);
        r.topics[0].partitions[0].error_code = ErrorCode::ReplicaNotAvailable.code();
        let m = ClusterMetadata::default().merged(&r);
        assert_eq!(m.leader("a", 0), Some(LeaderInfo { node: 1, epoch: 3 }));
    }

    /// A topic id prints as a hyphenated UUID, the way Kafka's tools show it, and the all-zero id reads
    /// as no id.
    #[test]
    fn topic_id_displays_like_a_uuid() {
        let id = TopicId([0x12; 16]);
        assert_eq!(id.to_string(), "12121212-1212-1212-1212-121212121212");
        assert!(TopicId::default().is_zero());
    }
}
