//! Sends the membership machines' requests with the net layer and strips the answers back to what the
//! machines read. All wire-version differences of the group APIs live here.
//!
//! # References
//! - FindCoordinator, Metadata, JoinGroup v0-v9, SyncGroup v0-v5, Heartbeat v0-v4, LeaveGroup v0-v5,
//!   ConsumerGroupHeartbeat v0-v1

use std::collections::BTreeMap;

use kafka_protocol::messages::consumer_group_heartbeat_request::TopicPartitions as HbTopicPartitions;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::{
    ConsumerGroupHeartbeatRequest, GroupId, HeartbeatRequest, JoinGroupRequest, LeaveGroupRequest,
    SyncGroupRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use super::membership::{
    ConsumerHeartbeat, Destination, JoinedMember, Request, Response, TopicMetadata, Transmit,
};
use super::TopicId;
use crate::net::{CallOptions, Client, CoordinatorKind, NetError, Target, Verdict};
use crate::wire::ErrorCode;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn opt(v: &Option<String>) -> Option<StrBytes> {
    v.as_deref().map(s)
}

fn string(v: StrBytes) -> String {
    v.to_string()
}

/// Sends one request and returns the machine's view of the answer.
///
/// Requests to the coordinator are sent to the node the machine discovered, at most twice: a failure
/// goes back to the machine, which decides whether to rediscover the coordinator or rejoin.
pub(crate) async fn execute(
    client: &Client,
    group_id: &str,
    t: Transmit,
) -> Result<Response, NetError> {
    let target = match t.to {
        Destination::AnyBroker => Target::Any,
        Destination::Coordinator(node) => Target::Broker(node),
    };
    let options = CallOptions {
        timeout: t.timeout,
        max_retries: Some(1),
        ..CallOptions::default()
    };
    let group = || GroupId(s(group_id));
    match t.request {
        Request::FindCoordinator => {
            client.invalidate_coordinator(CoordinatorKind::Group, group_id);
            let node = client.coordinator(CoordinatorKind::Group, group_id).await?;
            Ok(Response::Coordinator { node })
        }
        Request::Metadata { topics } => {
            let names: Vec<&str> = topics.iter().map(String::as_str).collect();
            let md = client.metadata(&names).await?;
            Ok(Response::Metadata {
                topics: topics
                    .iter()
                    .map(|name| {
                        let t = md.topics.get(name);
                        TopicMetadata {
                            name: name.clone(),
                            id: t.filter(|t| !t.id.is_zero()).map(|t| TopicId(t.id.0)),
                            partitions: t
                                .filter(|t| t.error.is_ok())
                                .map(|t| t.partitions.len() as i32),
                        }
                    })
                    .collect(),
            })
        }
        Request::JoinGroup {
            protocol_type,
            member_id,
            group_instance_id,
            session_timeout_ms,
            rebalance_timeout_ms,
            protocols,
            reason,
        } => {
            let min_version = if group_instance_id.is_some() {
                crate::wire::JOIN_GROUP_MIN_STATIC
            } else {
                0
            };
            let options = CallOptions {
                min_version: Some(min_version),
                ..options
            };
            let (r, _) = client
                .call(
                    target,
                    &options,
                    |version| {
                        JoinGroupRequest::default()
                            .with_group_id(group())
                            .with_session_timeout_ms(session_timeout_ms)
                            .with_rebalance_timeout_ms(rebalance_timeout_ms)
                            .with_member_id(s(&member_id))
                            .with_group_instance_id(opt(&group_instance_id))
                            .with_protocol_type(s(protocol_type))
                            .with_protocols(
                                protocols
                                    .iter()
                                    .map(|(name, metadata)| {
                                        JoinGroupRequestProtocol::default()
                                            .with_name(s(name))
                                            .with_metadata(metadata.clone())
                                    })
                                    .collect(),
                            )
                            .with_reason(if version >= 8 { opt(&reason) } else { None })
                    },
                    |r, v| Verdict::Done((r, v)),
                )
                .await?;
            Ok(Response::JoinGroup {
                error: ErrorCode::from_code(r.error_code),
                generation_id: r.generation_id,
                protocol_name: r.protocol_name.map(string),
                leader: string(r.leader),
                member_id: string(r.member_id),
                skip_assignment: r.skip_assignment,
                members: r
                    .members
                    .into_iter()
                    .map(|m| JoinedMember {
                        member_id: string(m.member_id),
                        group_instance_id: m.group_instance_id.map(string),
                        metadata: m.metadata,
                    })
                    .collect(),
            })
        }
        Request::SyncGroup {
            protocol_type,
            generation_id,
            member_id,
            group_instance_id,
            protocol_name,
            assignments,
        } => {
            let (r, _) = client
                .call(
                    target,
                    &options,
                    |version| {
                        let mut req = SyncGroupRequest::default()
                            .with_group_id(group())
                            .with_generation_id(generation_id)
                            .with_member_id(s(&member_id))
                            .with_group_instance_id(opt(&group_instance_id))
                            .with_assignments(
                                assignments
                                    .iter()
                                    .map(|(m, a)| {
                                        SyncGroupRequestAssignment::default()
                                            .with_member_id(s(m))
                                            .with_assignment(a.clone())
                                    })
                                    .collect(),
                            );
                        if version >= 5 {
                            req = req
                                .with_protocol_type(Some(s(protocol_type)))
                                .with_protocol_name(Some(s(&protocol_name)));
                        }
                        req
                    },
                    |r, v| Verdict::Done((r, v)),
                )
                .await?;
            Ok(Response::SyncGroup {
                error: ErrorCode::from_code(r.error_code),
                protocol_name: r.protocol_name.map(string),
                assignment: r.assignment,
            })
        }
        Request::Heartbeat {
            generation_id,
            member_id,
            group_instance_id,
        } => {
            let (r, _) = client
                .call(
                    target,
                    &options,
                    |_| {
                        HeartbeatRequest::default()
                            .with_group_id(group())
                            .with_generation_id(generation_id)
                            .with_member_id(s(&member_id))
                            .with_group_instance_id(opt(&group_instance_id))
                    },
                    |r, v| Verdict::Done((r, v)),
                )
                .await?;
            Ok(Response::Heartbeat {
                error: ErrorCode::from_code(r.error_code),
            })
        }
        Request::LeaveGroup {
            member_id,
            group_instance_id,
            reason,
        } => {
            let (r, _) = client
                .call(
                    target,
                    &options,
                    |version| {
                        let req = LeaveGroupRequest::default().with_group_id(group());
                        if version >= 3 {
                            req.with_members(vec![MemberIdentity::default()
                                .with_member_id(s(&member_id))
                                .with_group_instance_id(opt(&group_instance_id))
                                .with_reason(if version >= 5 { opt(&reason) } else { None })])
                        } else {
                            req.with_member_id(s(&member_id))
                        }
                    },
                    |r, v| Verdict::Done((r, v)),
                )
                .await?;
            let member_error = r.members.first().map(|m| m.error_code).unwrap_or(0);
            let code = if r.error_code != 0 {
                r.error_code
            } else {
                member_error
            };
            Ok(Response::LeaveGroup {
                error: ErrorCode::from_code(code),
            })
        }
        Request::ConsumerGroupHeartbeat(hb) => {
            consumer_heartbeat(client, target, &options, group_id, hb).await
        }
    }
}

async fn consumer_heartbeat(
    client: &Client,
    target: Target,
    options: &CallOptions,
    group_id: &str,
    hb: ConsumerHeartbeat,
) -> Result<Response, NetError> {
    let (r, _) = client
        .call(
            target,
            options,
            |_| {
                ConsumerGroupHeartbeatRequest::default()
                    .with_group_id(GroupId(s(group_id)))
                    .with_member_id(s(&hb.member_id))
                    .with_member_epoch(hb.member_epoch)
                    .with_instance_id(opt(&hb.instance_id))
                    .with_rack_id(opt(&hb.rack_id))
                    .with_rebalance_timeout_ms(hb.rebalance_timeout_ms)
                    .with_subscribed_topic_names(
                        hb.subscribed_topic_names
                            .as_ref()
                            .map(|ts| ts.iter().map(|t| TopicName(s(t))).collect()),
                    )
                    .with_server_assignor(opt(&hb.server_assignor))
                    .with_topic_partitions(hb.owned.as_ref().map(|owned| {
                        owned
                            .iter()
                            .map(|(id, ps)| {
                                HbTopicPartitions::default()
                                    .with_topic_id(uuid::Uuid::from_bytes(id.0))
                                    .with_partitions(ps.clone())
                            })
                            .collect()
                    }))
            },
            |r, v| Verdict::Done((r, v)),
        )
        .await?;
    Ok(Response::ConsumerGroupHeartbeat {
        error: ErrorCode::from_code(r.error_code),
        message: r.error_message.map(string),
        member_id: r.member_id.map(string),
        member_epoch: r.member_epoch,
        heartbeat_interval_ms: r.heartbeat_interval_ms,
        assignment: r.assignment.map(|a| {
            let mut out: BTreeMap<TopicId, Vec<i32>> = BTreeMap::new();
            for tp in a.topic_partitions {
                out.entry(TopicId(*tp.topic_id.as_bytes()))
                    .or_default()
                    .extend(tp.partitions);
            }
            out
        }),
    })
}
