//! The snapshot topic's preconditions, checked by [`Flow::start`](super::Flow::start) before it joins
//! the group: the topic exists (or is created), it keeps every key's last snapshot forever, and it has
//! one partition per input partition.
//!
//! Why each matters:
//! - missing: every snapshot write would retry UNKNOWN_TOPIC_OR_PARTITION until its deadline (tens of
//!   seconds) and only then fail, far from the cause;
//! - not compacted, or compacted with deletion after a retention: a key's only snapshot is deleted
//!   when it ages out while the input offset that depends on it stays committed, so the next recovery
//!   starts that key from nothing and never re-reads the events it had folded (state lost, silently);
//! - partition count: snapshot partition N holds input partition N's state, and each is fenced by the
//!   group that owns input partition N; another count leaves partitions without snapshots (writes fail)
//!   or maps two owners' keys apart from their input.
//!
//! The decision is one pure function ([`check`]) over what the cluster reported, so it is tested
//! without a broker; [`ensure`] gathers the facts (Metadata, DescribeConfigs) and creates the topic
//! when asked to.
//!
//! # References
//! - Metadata (key 3), DescribeConfigs (key 32), CreateTopics (key 19)
//! - Kafka topic configs `cleanup.policy`, `retention.ms`, `retention.bytes`

use crate::admin;
use crate::net::{Client, NetError};
use crate::wire::ErrorCode;

/// What [`Flow::start`](super::Flow::start) does when the snapshot topic does not exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingSnapshotTopic {
    /// Fail with [`SnapshotTopicError::Missing`]: the topic is an operator's to create (the default,
    /// because its replication and `min.insync.replicas` decide how much a broker failure can lose).
    Fail,
    /// Create it: `cleanup.policy=compact`, the input topic's partition count, and this replication
    /// factor (`None`: the broker's `default.replication.factor`).
    Create {
        /// Replicas per partition, or `None` for the broker default.
        replication_factor: Option<i16>,
    },
}

/// Why the snapshot topic cannot be used. Each message names the fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotTopicError {
    /// The snapshot topic does not exist.
    #[error(
        "snapshot topic {topic:?} does not exist: create it with cleanup.policy=compact and \
         {partitions} partitions (as many as input topic {input_topic:?}), or set \
         FlowConfig::missing_snapshot_topic to MissingSnapshotTopic::Create"
    )]
    Missing {
        /// The snapshot topic.
        topic: String,
        /// The input topic.
        input_topic: String,
        /// The partition count it needs (the input's).
        partitions: i32,
    },
    /// The input topic does not exist, so there is nothing to fold and no partition count to match.
    #[error("input topic {topic:?} does not exist: create it before starting the flow")]
    InputMissing {
        /// The input topic.
        topic: String,
    },
    /// The snapshot topic's cleanup policy would delete snapshots.
    #[error(
        "snapshot topic {topic:?} has cleanup.policy={policy}{retention}: snapshots would be \
         deleted once they age out while their input offsets stay committed, losing state; set \
         cleanup.policy=compact (or keep delete with retention.ms=-1 and retention.bytes=-1)",
        policy = cleanup_policy.as_deref().unwrap_or("(unreported)"),
        retention = retention.as_deref().map(|r| format!(" and {r}")).unwrap_or_default()
    )]
    NotCompacted {
        /// The snapshot topic.
        topic: String,
        /// Its `cleanup.policy` as reported (`None`: not reported).
        cleanup_policy: Option<String>,
        /// The finite retention that makes a `compact,delete` policy delete snapshots, if that is why.
        retention: Option<String>,
    },
    /// The snapshot topic's partition count differs from the input's.
    #[error(
        "snapshot topic {topic:?} has {partitions} partitions but input topic {input_topic:?} has \
         {input_partitions}: snapshot partition N holds input partition N's state, so they must match; \
         recreate the snapshot topic (or add partitions to it) with {input_partitions}"
    )]
    PartitionMismatch {
        /// The snapshot topic.
        topic: String,
        /// Its partition count.
        partitions: i32,
        /// The input topic.
        input_topic: String,
        /// The input's partition count.
        input_partitions: i32,
    },
    /// Two input topics of one flow have different partition counts: partition N of every input
    /// belongs to the same key space and the same snapshot partition, so they must match.
    #[error(
        "input topic {topic:?} has {partitions} partitions but input topic {first_topic:?} has \
         {first_partitions}: a flow's inputs must be co-partitioned (equal partition counts, keys \
         partitioned the same way)"
    )]
    InputPartitionMismatch {
        /// The further input topic.
        topic: String,
        /// Its partition count.
        partitions: i32,
        /// The flow's first input topic.
        first_topic: String,
        /// Its partition count.
        first_partitions: i32,
    },
    /// The cluster could not be asked (metadata, DescribeConfigs or CreateTopics failed).
    #[error("checking snapshot topic {topic:?}: {source}")]
    Unreachable {
        /// The snapshot topic.
        topic: String,
        /// The failure.
        #[source]
        source: NetError,
    },
}

/// What the cluster reported about the snapshot topic and its input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TopicFacts<'a> {
    pub(crate) topic: &'a str,
    pub(crate) input_topic: &'a str,
    /// The input's partition count, `None` when it does not exist.
    pub(crate) input_partitions: Option<i32>,
    /// The snapshot topic's partition count, `None` when it does not exist.
    pub(crate) partitions: Option<i32>,
    /// `cleanup.policy`, `retention.ms` and `retention.bytes` as DescribeConfigs reported them.
    pub(crate) cleanup_policy: Option<String>,
    pub(crate) retention_ms: Option<String>,
    pub(crate) retention_bytes: Option<String>,
}

/// The configuration keys [`check`] reads.
pub(crate) const CONFIG_KEYS: [&str; 3] = ["cleanup.policy", "retention.ms", "retention.bytes"];

/// Decides whether the snapshot topic can be used. The rule: the input and the snapshot topic exist,
/// their partition counts are equal, and `cleanup.policy` contains `compact` and, if it also contains
/// `delete`, neither retention is finite (a key no event rewrites within the retention would lose its
/// only snapshot).
pub(crate) fn check(facts: &TopicFacts<'_>) -> Result<(), SnapshotTopicError> {
    let Some(input_partitions) = facts.input_partitions else {
        return Err(SnapshotTopicError::InputMissing {
            topic: facts.input_topic.to_owned(),
        });
    };
    let Some(partitions) = facts.partitions else {
        return Err(SnapshotTopicError::Missing {
            topic: facts.topic.to_owned(),
            input_topic: facts.input_topic.to_owned(),
            partitions: input_partitions,
        });
    };
    let policies: Vec<&str> = facts
        .cleanup_policy
        .as_deref()
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .collect();
    let not_compacted = |retention: Option<String>| SnapshotTopicError::NotCompacted {
        topic: facts.topic.to_owned(),
        cleanup_policy: facts.cleanup_policy.clone(),
        retention,
    };
    if !policies.contains(&"compact") {
        return Err(not_compacted(None));
    }
    if policies.contains(&"delete") {
        // An unreported retention is read as finite: the check must not pass on what it cannot see.
        for (key, value) in [
            ("retention.ms", &facts.retention_ms),
            ("retention.bytes", &facts.retention_bytes),
        ] {
            if value.as_deref().map(str::trim) != Some("-1") {
                let shown = value.as_deref().unwrap_or("unreported");
                return Err(not_compacted(Some(format!("{key}={shown}"))));
            }
        }
    }
    if partitions != input_partitions {
        return Err(SnapshotTopicError::PartitionMismatch {
            topic: facts.topic.to_owned(),
            partitions,
            input_topic: facts.input_topic.to_owned(),
            input_partitions,
        });
    }
    Ok(())
}

/// The partition count of each of `topics` (`None`: it does not exist), from one Metadata request.
/// Checks a flow's further input topics against its first: each exists and has the first's partition
/// count.
pub(crate) async fn check_more_inputs(
    client: &Client,
    first: &str,
    more: &[String],
) -> Result<(), SnapshotTopicError> {
    let [first_partitions] = partition_counts(client, [first]).await.map_err(|source| {
        SnapshotTopicError::Unreachable {
            topic: first.to_owned(),
            source,
        }
    })?;
    let first_partitions = first_partitions.ok_or_else(|| SnapshotTopicError::InputMissing {
        topic: first.to_owned(),
    })?;
    for topic in more {
        let [partitions] = partition_counts(client, [topic.as_str()])
            .await
            .map_err(|source| SnapshotTopicError::Unreachable {
                topic: topic.clone(),
                source,
            })?;
        match partitions {
            None => {
                return Err(SnapshotTopicError::InputMissing {
                    topic: topic.clone(),
                })
            }
            Some(n) if n != first_partitions => {
                return Err(SnapshotTopicError::InputPartitionMismatch {
                    topic: topic.clone(),
                    partitions: n,
                    first_topic: first.to_owned(),
                    first_partitions,
                })
            }
            Some(_) => {}
        }
    }
    Ok(())
}

async fn partition_counts<const N: usize>(
    client: &Client,
    topics: [&str; N],
) -> Result<[Option<i32>; N], NetError> {
    let metadata = client.metadata(&topics).await?;
    let mut out = [None; N];
    for (slot, name) in out.iter_mut().zip(topics) {
        *slot = match metadata.topics.get(name) {
            None => None,
            Some(t) if t.error == ErrorCode::UnknownTopicOrPartition => None,
            Some(t) if t.error.is_ok() || t.error == ErrorCode::LeaderNotAvailable => {
                Some(t.partitions.len() as i32)
            }
            // Not authorized, or an invalid name: say so instead of guessing a count.
            Some(t) => {
                return Err(NetError::broker(
                    t.error,
                    None,
                    format!("metadata of {name}"),
                ))
            }
        };
    }
    Ok(out)
}

/// Checks the snapshot topic of a flow over `input_topic`, creating it first when it is missing and
/// `missing` says so. Fails fast (a few round trips) with the reason and the fix.
pub(crate) async fn ensure(
    client: &Client,
    topic: &str,
    input_topic: &str,
    missing: MissingSnapshotTopic,
) -> Result<(), SnapshotTopicError> {
    let unreachable = |source: NetError| SnapshotTopicError::Unreachable {
        topic: topic.to_owned(),
        source,
    };
    let [mut partitions, input_partitions] = partition_counts(client, [topic, input_topic])
        .await
        .map_err(unreachable)?;
    if let (None, Some(n), MissingSnapshotTopic::Create { replication_factor }) =
        (partitions, input_partitions, missing)
    {
        let created = admin::create_topic(
            client,
            topic,
            n,
            replication_factor.unwrap_or(-1),
            &[("cleanup.policy", "compact")],
        )
        .await;
        match created {
            Ok(()) => tracing::info!(topic, partitions = n, "created the snapshot topic"),
            // Another member starting at the same time created it: check what it made.
            Err(e) if e.error_code() == Some(ErrorCode::TopicAlreadyExists) => {}
            Err(e) => return Err(unreachable(e)),
        }
        [partitions] = partition_counts(client, [topic])
            .await
            .map_err(unreachable)?;
    }
    let configs = match partitions {
        Some(_) => admin::describe_configs(
            client,
            &admin::ConfigResource::Topic(topic.to_owned()),
            &CONFIG_KEYS,
        )
        .await
        .map_err(unreachable)?,
        None => Default::default(),
    };
    let get = |key: &str| configs.get(key).and_then(|e| e.value.clone());
    check(&TopicFacts {
        topic,
        input_topic,
        input_partitions,
        partitions,
        cleanup_policy: get("cleanup.policy"),
        retention_ms: get("retention.ms"),
        retention_bytes: get("retention.bytes"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(policy: &str) -> TopicFacts<'static> {
        TopicFacts {
            topic: "snap",
            input_topic: "in",
            input_partitions: Some(4),
            partitions: Some(4),
            cleanup_policy: Some(policy.into()),
            retention_ms: Some("604800000".into()),
            retention_bytes: Some("-1".into()),
        }
    }

    /// A snapshot topic that would delete snapshots on retention is refused: offsets stay committed
    /// while the state they depend on vanishes.
    #[test]
    fn only_a_policy_that_keeps_every_key_forever_passes() {
        assert!(check(&facts("compact")).is_ok());
        assert!(matches!(
            check(&facts("delete")),
            Err(SnapshotTopicError::NotCompacted {
                retention: None,
                ..
            })
        ));
        // Compacted and deleted: a key idle for a week loses its only snapshot.
        let err = check(&facts("compact,delete")).unwrap_err();
        assert!(
            matches!(&err, SnapshotTopicError::NotCompacted { retention: Some(r), .. }
                if r == "retention.ms=604800000"),
            "{err:?}"
        );
        // ... unless neither retention is finite.
        let mut forever = facts("delete, compact");
        forever.retention_ms = Some("-1".into());
        assert!(check(&forever).is_ok());
        // What the broker did not report is not assumed safe.
        forever.retention_bytes = None;
        assert!(check(&forever).is_err());
        let mut unreported = facts("compact");
        unreported.cleanup_policy = None;
        assert!(check(&unreported).is_err());
    }

    /// A missing snapshot or input topic, or a snapshot topic whose partition count differs from the
    /// input's, is a typed error naming the topics and counts and how to create the topic.
    #[test]
    fn missing_topics_and_partition_mismatch_are_named() {
        let mut f = facts("compact");
        f.partitions = None;
        let err = check(&f).unwrap_err();
        assert!(
            matches!(&err, SnapshotTopicError::Missing { topic, input_topic, partitions: 4 }
                if topic == "snap" && input_topic == "in"),
            "{err:?}"
        );
        assert!(err.to_string().contains("MissingSnapshotTopic::Create"));
        f.input_partitions = None;
        assert!(matches!(
            check(&f),
            Err(SnapshotTopicError::InputMissing { .. })
        ));
        let mut f = facts("compact");
        f.partitions = Some(1);
        let err = check(&f).unwrap_err();
        assert!(matches!(
            err,
            SnapshotTopicError::PartitionMismatch {
                partitions: 1,
                input_partitions: 4,
                ..
            }
        ));
        assert!(err.to_string().contains("has 1 partitions but input topic"));
    }
}
