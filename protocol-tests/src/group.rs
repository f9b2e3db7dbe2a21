//! A classic consumer-group member made of raw JoinGroup/SyncGroup requests, for tests and benchmarks that
//! need a real generation to fence transactional offset commits with, and nothing else of a consumer.
//!
//! # References
//! - JoinGroup v0-9, SyncGroup v0-5; KIP-394 (MEMBER_ID_REQUIRED on the first join)

use bytes::Bytes;
use kafka_protocol::messages::join_group_request::{JoinGroupRequest, JoinGroupRequestProtocol};
use kafka_protocol::messages::sync_group_request::SyncGroupRequest;
use kafka_protocol::messages::GroupId;
use kafka_protocol::protocol::StrBytes;
use snapfence::net::{CallOptions, Client, Target, Verdict};
use snapfence::ErrorCode;
use snapfence::GroupMetadata;

/// Joins (or, with its member id, rejoins) `group` as a classic consumer and syncs; returns the metadata
/// after the sync. The member never heartbeats, so it stays in the group for `session_timeout_ms` (the
/// broker caps it at `group.max.session.timeout.ms`, 30 minutes by default).
///
/// Cancel-safe: a dropped call leaves at most a member that expires with its session.
pub async fn join_classic(
    client: &Client,
    group: &str,
    member: &str,
    session_timeout_ms: i32,
) -> Result<GroupMetadata, String> {
    let mut member_id = member.to_owned();
    // A first join without a member id is answered MEMBER_ID_REQUIRED with the id to use.
    for _ in 0..3 {
        let m = member_id.clone();
        let build = |_v: i16| {
            JoinGroupRequest::default()
                .with_group_id(GroupId(StrBytes::from_string(group.to_owned())))
                .with_session_timeout_ms(session_timeout_ms)
                .with_rebalance_timeout_ms(10_000)
                .with_member_id(StrBytes::from_string(m.clone()))
                .with_protocol_type(StrBytes::from_static_str("consumer"))
                .with_protocols(vec![JoinGroupRequestProtocol::default()
                    .with_name(StrBytes::from_static_str("range"))
                    .with_metadata(Bytes::new())])
        };
        let resp = client
            .call(
                Target::group(group),
                &CallOptions::default(),
                build,
                |r, _| Verdict::Done(r),
            )
            .await
            .map_err(|e| format!("join {group}: {e}"))?;
        match ErrorCode::from_code(resp.error_code) {
            ErrorCode::MemberIdRequired => member_id = resp.member_id.to_string(),
            ErrorCode::None => {
                let generation = resp.generation_id;
                let mid = resp.member_id.to_string();
                let sync = |_v: i16| {
                    SyncGroupRequest::default()
                        .with_group_id(GroupId(StrBytes::from_string(group.to_owned())))
                        .with_generation_id(generation)
                        .with_member_id(StrBytes::from_string(mid.clone()))
                        .with_protocol_type(Some(StrBytes::from_static_str("consumer")))
                        .with_protocol_name(Some(StrBytes::from_static_str("range")))
                };
                let s = client
                    .call(
                        Target::group(group),
                        &CallOptions::default(),
                        sync,
                        |r, _| Verdict::Done(r),
                    )
                    .await
                    .map_err(|e| format!("sync {group}: {e}"))?;
                let code = ErrorCode::from_code(s.error_code);
                if code != ErrorCode::None {
                    return Err(format!("sync {group}: {code}"));
                }
                return GroupMetadata::new(group, generation, mid, None)
                    .map_err(|e| format!("join {group}: {e}"));
            }
            other => return Err(format!("join {group}: {other}")),
        }
    }
    Err(format!("join {group}: no member id after three tries"))
}

/// A classic group's state and its members as the coordinator lists them (DescribeGroups).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDescription {
    /// `Empty`, `Stable`, `PreparingRebalance`, ...
    pub state: String,
    /// Each member's client id, in the coordinator's order.
    pub client_ids: Vec<String>,
}

/// Describes classic group `group` (DescribeGroups).
pub async fn describe_group(client: &Client, group: &str) -> Result<GroupDescription, String> {
    use kafka_protocol::messages::DescribeGroupsRequest;
    let resp = client
        .call(
            Target::group(group),
            &CallOptions::default(),
            |_| {
                DescribeGroupsRequest::default()
                    .with_groups(vec![GroupId(StrBytes::from_string(group.to_owned()))])
            },
            |r, _| Verdict::Done(r),
        )
        .await
        .map_err(|e| format!("describe {group}: {e}"))?;
    let g = resp
        .groups
        .into_iter()
        .find(|g| g.group_id.0.as_str() == group)
        .ok_or_else(|| format!("describe {group}: not in the answer"))?;
    let code = ErrorCode::from_code(g.error_code);
    if !code.is_ok() {
        return Err(format!("describe {group}: {code:?}"));
    }
    Ok(GroupDescription {
        state: g.group_state.to_string(),
        client_ids: g.members.iter().map(|m| m.client_id.to_string()).collect(),
    })
}
