//! OffsetCommit and OffsetFetch for the default (non-transactional) mode.
//!
//! A commit carries the member's group metadata; the coordinator refuses it from a member that is not
//! (or no longer) the member it claims to be at that generation or epoch. Those refusals come back as
//! [`ConsumerError::CommitFenced`], distinct from transport failures, because the caller must react
//! differently: fenced means the partitions are someone else's now.
//!
//! # References
//! - OffsetCommit v2-v9 (v7 group instance id; v9 member epoch for the consumer protocol, KIP-848)
//! - OffsetFetch v1-v9 (v7 require_stable, KIP-447; v8 batched groups)

use std::collections::BTreeMap;
use std::sync::Arc;

use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::{
    GroupId, OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use super::{ConsumerError, TopicPartition};
use crate::net::{CallOptions, Client, Target, Verdict};
use crate::wire::{
    ErrorCode, OFFSET_COMMIT_MAX, OFFSET_COMMIT_MIN, OFFSET_COMMIT_MIN_STATIC, OFFSET_FETCH_MAX,
    OFFSET_FETCH_MIN,
};
use crate::GroupMetadata;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn by_topic<T: Copy>(items: &BTreeMap<TopicPartition, T>) -> BTreeMap<Arc<str>, Vec<(i32, T)>> {
    let mut out: BTreeMap<Arc<str>, Vec<(i32, T)>> = BTreeMap::new();
    for (tp, v) in items {
        out.entry(tp.topic.clone())
            .or_default()
            .push((tp.partition, *v));
    }
    out
}

/// Whether a commit error says the committer is not the member it claims to be.
pub(crate) fn is_fencing(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::IllegalGeneration
            | ErrorCode::UnknownMemberId
            | ErrorCode::FencedInstanceId
            | ErrorCode::StaleMemberEpoch
            | ErrorCode::FencedMemberEpoch
    )
}

/// Commits `offsets` (the next offset to read, per partition) for `metadata`'s group as `metadata`'s
/// member at its generation or member epoch.
///
/// Not cancel-safe in outcome: if dropped after the request was written, the commit may or may not
/// have happened. (Committing the same offsets again is harmless.)
pub async fn commit_offsets(
    client: &Client,
    metadata: &GroupMetadata,
    offsets: &BTreeMap<TopicPartition, i64>,
) -> Result<(), ConsumerError> {
    let offsets = offsets
        .iter()
        .map(|(tp, o)| (tp.clone(), (*o, None)))
        .collect();
    commit_offsets_with_metadata(client, metadata, &offsets).await
}

/// [`commit_offsets`], each offset with the metadata string stored beside it (`None`: none).
pub(crate) async fn commit_offsets_with_metadata(
    client: &Client,
    metadata: &GroupMetadata,
    offsets: &BTreeMap<TopicPartition, (i64, Option<&str>)>,
) -> Result<(), ConsumerError> {
    if offsets.is_empty() {
        return Ok(());
    }
    let topics = by_topic(offsets);
    let build = |version: i16| {
        OffsetCommitRequest::default()
            .with_group_id(GroupId(s(metadata.group_id())))
            .with_generation_id_or_member_epoch(metadata.generation_id())
            .with_member_id(s(metadata.member_id()))
            .with_group_instance_id(if version >= OFFSET_COMMIT_MIN_STATIC {
                metadata.group_instance_id().map(s)
            } else {
                None
            })
            .with_retention_time_ms(-1)
            .with_topics(
                topics
                    .iter()
                    .map(|(t, ps)| {
                        OffsetCommitRequestTopic::default()
                            .with_name(TopicName(s(t)))
                            .with_partitions(
                                ps.iter()
                                    .map(|(p, (o, m))| {
                                        OffsetCommitRequestPartition::default()
                                            .with_partition_index(*p)
                                            .with_committed_offset(*o)
                                            .with_committed_leader_epoch(-1)
                                            .with_committed_metadata(m.map(s))
                                    })
                                    .collect(),
                            )
                    })
                    .collect(),
            )
    };
    let min_version = if metadata.group_instance_id().is_some() {
        OFFSET_COMMIT_MIN_STATIC
    } else {
        OFFSET_COMMIT_MIN
    };
    let response: OffsetCommitResponse = client
        .call(
            Target::group(metadata.group_id()),
            &CallOptions {
                min_version: Some(min_version),
                max_version: Some(OFFSET_COMMIT_MAX),
                ..CallOptions::default()
            },
            build,
            |r: OffsetCommitResponse, _| {
                // Coordinator moves and loading are per-partition codes here; route them like a
                // top-level code so `call` rediscovers the coordinator and retries.
                let first = r
                    .topics
                    .iter()
                    .flat_map(|t| t.partitions.iter())
                    .map(|p| p.error_code)
                    .find(|c| *c != 0)
                    .unwrap_or(0);
                match ErrorCode::from_code(first) {
                    ErrorCode::NotCoordinator
                    | ErrorCode::CoordinatorNotAvailable
                    | ErrorCode::CoordinatorLoadInProgress => Verdict::from_code(first, r),
                    _ => Verdict::Done(r),
                }
            },
        )
        .await?;
    for t in &response.topics {
        for p in &t.partitions {
            let code = ErrorCode::from_code(p.error_code);
            if code.is_ok() {
                continue;
            }
            if is_fencing(code) {
                return Err(ConsumerError::CommitFenced {
                    group: metadata.group_id().to_string(),
                    code,
                });
            }
            return Err(ConsumerError::Partition {
                partition: TopicPartition::new(&*t.name.0, p.partition_index),
                code,
            });
        }
    }
    Ok(())
}

/// The committed offsets of `group_id` for `partitions` (`None`: nothing committed). Waits out
/// offsets pending in an open transaction (`require_stable`), so a transactional commit in flight is
/// never read as "nothing committed".
///
/// Cancel-safe: it only reads.
pub async fn committed_offsets(
    client: &Client,
    group_id: &str,
    partitions: &[TopicPartition],
) -> Result<BTreeMap<TopicPartition, Option<i64>>, ConsumerError> {
    Ok(committed_offsets_and_metadata(client, group_id, partitions)
        .await?
        .into_iter()
        .map(|(tp, c)| (tp, c.map(|(offset, _)| offset)))
        .collect())
}

/// [`committed_offsets`] with the metadata string each offset was committed with (`None` when it
/// was committed without one).
///
/// Cancel-safe: it only reads.
pub async fn committed_offsets_and_metadata(
    client: &Client,
    group_id: &str,
    partitions: &[TopicPartition],
) -> Result<BTreeMap<TopicPartition, Option<(i64, Option<String>)>>, ConsumerError> {
    if partitions.is_empty() {
        return Ok(BTreeMap::new());
    }
    let mut topics: BTreeMap<Arc<str>, Vec<i32>> = BTreeMap::new();
    for tp in partitions {
        topics
            .entry(tp.topic.clone())
            .or_default()
            .push(tp.partition);
    }
    let build = |version: i16| {
        let req = OffsetFetchRequest::default().with_require_stable(version >= 7);
        if version >= 8 {
            req.with_groups(vec![OffsetFetchRequestGroup::default()
                .with_group_id(GroupId(s(group_id)))
                .with_member_epoch(-1)
                .with_topics(Some(
                    topics
                        .iter()
                        .map(|(t, ps)| {
                            OffsetFetchRequestTopics::default()
                                .with_name(TopicName(s(t)))
                                .with_partition_indexes(ps.clone())
                        })
                        .collect(),
                ))])
        } else {
            req.with_group_id(GroupId(s(group_id))).with_topics(Some(
                topics
                    .iter()
                    .map(|(t, ps)| {
                        OffsetFetchRequestTopic::default()
                            .with_name(TopicName(s(t)))
                            .with_partition_indexes(ps.clone())
                    })
                    .collect(),
            ))
        }
    };
    let rows = client
        .call(
            Target::group(group_id),
            &CallOptions {
                min_version: Some(OFFSET_FETCH_MIN),
                max_version: Some(OFFSET_FETCH_MAX),
                ..CallOptions::default()
            },
            build,
            |r, version| {
                let mut rows: Vec<(String, i32, i64, Option<String>, i16)> = Vec::new();
                let top = if version >= 8 {
                    let Some(g) = r.groups.first() else {
                        return Verdict::Done(Err(ErrorCode::InvalidRequest));
                    };
                    for t in &g.topics {
                        for p in &t.partitions {
                            rows.push((
                                t.name.0.to_string(),
                                p.partition_index,
                                p.committed_offset,
                                p.metadata.as_ref().map(|m| m.to_string()),
                                p.error_code,
                            ));
                        }
                    }
                    g.error_code
                } else {
                    for t in &r.topics {
                        for p in &t.partitions {
                            rows.push((
                                t.name.0.to_string(),
                                p.partition_index,
                                p.committed_offset,
                                p.metadata.as_ref().map(|m| m.to_string()),
                                p.error_code,
                            ));
                        }
                    }
                    r.error_code
                };
                // UNSTABLE_OFFSET_COMMIT: a transaction with offsets for these partitions is open;
                // retried like the coordinator codes until it resolves.
                let worst = std::iter::once(top)
                    .chain(rows.iter().map(|r| r.4))
                    .find(|c| *c != 0)
                    .unwrap_or(0);
                match Verdict::from_code(worst, ()) {
                    Verdict::Done(()) if worst != 0 => {
                        Verdict::Done(Err(ErrorCode::from_code(worst)))
                    }
                    Verdict::Done(()) => Verdict::Done(Ok(rows)),
                    Verdict::Reroute(c) => Verdict::Reroute(c),
                    Verdict::Retry(c) => Verdict::Retry(c),
                }
            },
        )
        .await?
        .map_err(|code| ConsumerError::Refused {
            group: group_id.to_string(),
            request: "OffsetFetch",
            code,
        })?;
    let mut out: BTreeMap<TopicPartition, Option<(i64, Option<String>)>> =
        partitions.iter().map(|tp| (tp.clone(), None)).collect();
    for (topic, partition, offset, metadata, _) in rows {
        let tp = TopicPartition::new(topic, partition);
        if let Some(slot) = out.get_mut(&tp) {
            *slot = (offset >= 0).then_some((offset, metadata));
        }
    }
    Ok(out)
}
