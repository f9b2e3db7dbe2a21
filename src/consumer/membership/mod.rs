//! Group membership as sans-IO state machines: no sockets, no clock, no tasks.
//!
//! A machine takes the current time and the coordinator's answers in, and hands out the next request
//! to send, the next instant it wants to be woken, and events for the application (partitions to
//! revoke, partitions lost, partitions assigned). One small async driver owns the I/O and the timers.
//! That keeps the hard part (who owns what, at which generation, and when the group may move on)
//! deterministic and testable with scripted responses.
//!
//! The shape follows quinn-proto: `poll_transmit`, `handle_response` / `handle_failure`,
//! `handle_timeout`, `poll_timeout`, `poll_event`, plus `ack` for the application's side.
//!
//! # Synchronous revocation
//!
//! A [`MemberEvent::Revoke`] or [`MemberEvent::Lost`] must be acknowledged with `ack` once the
//! application has torn down what it held for those partitions. Until then the machine does not let the
//! group move on past the point where another member could be handed the partitions:
//!
//! - classic eager: no JoinGroup is sent (the coordinator cannot finish the round without us, so no new
//!   owner exists until the rebalance timeout evicts us);
//! - classic cooperative: the rejoin that would let the next round hand the revoked partitions out is
//!   not sent;
//! - consumer protocol: the heartbeat that acknowledges the revocation (the owned set without the
//!   revoked partitions) is not sent; the coordinator keeps the partitions with us until it sees it.
//!
//! A `Lost` event also blocks the rejoin, so a member never holds flows from its old membership
//! while it takes partitions in a new one.
//!
//! The events queue is bounded by construction: a machine only emits a `Revoke` or `Lost` at a step
//! that then waits for its acknowledgement, and consecutive `Assign`s are merged, so at most a handful
//! of events are ever queued.

pub(crate) mod classic;
pub(crate) mod kip848;
#[cfg(test)]
mod sim848_tests;
#[cfg(test)]
mod sim_tests;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use bytes::Bytes;

use super::{TopicId, TopicPartition};
use crate::wire::ErrorCode;

/// Why a member lost its partitions without revoking them first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// The coordinator no longer accepts this member at its generation or epoch
    /// (`ILLEGAL_GENERATION`, `UNKNOWN_MEMBER_ID`, `FENCED_MEMBER_EPOCH`): it was evicted, typically
    /// because its heartbeats stopped for longer than the session timeout or a rebalance handler ran
    /// past the rebalance timeout. The partitions may already have a new owner.
    Fenced(ErrorCode),
    /// The application did not poll within `max_poll_interval` (or a rebalance handler took that
    /// long), so the member left the group on its own, as Java's consumer does. It rejoins on the next
    /// poll.
    PollIntervalExceeded,
    /// The application gave the membership up to join again as a new member (the snapshot runtime
    /// does after an eviction or a producer fence it saw on a commit): nothing may be written from the
    /// old membership, so its partitions are reported lost, not revoked.
    Rejoined,
}

/// What a membership machine asks of the application.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum MemberEvent {
    /// Give these partitions up; acknowledge when done. The member still owns them (commits with the
    /// current group metadata succeed) until it acknowledges.
    Revoke(Vec<TopicPartition>),
    /// These partitions are gone already; acknowledge once their flows are torn down.
    Lost {
        partitions: Vec<TopicPartition>,
        reason: LostReason,
    },
    /// Newly assigned partitions. Needs no acknowledgement.
    Assign(Vec<TopicPartition>),
    /// The member stopped for good.
    Fatal(Fatal),
}

impl MemberEvent {
    fn needs_ack(&self) -> bool {
        matches!(self, MemberEvent::Revoke(_) | MemberEvent::Lost { .. })
    }
}

/// A group error that ends the membership.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Fatal {
    pub code: ErrorCode,
    pub request: &'static str,
    pub message: Option<String>,
}

/// Matches a response to the request it answers; responses to requests a machine has since given up on
/// are dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct RequestId(pub u64);

/// Where a request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Destination {
    /// Any broker (FindCoordinator, Metadata).
    AnyBroker,
    /// The group coordinator, as last discovered.
    Coordinator(i32),
}

/// A request a machine wants sent.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Transmit {
    pub id: RequestId,
    pub to: Destination,
    /// A request the coordinator may legitimately hold longer than the ordinary request timeout
    /// (JoinGroup waits for the whole round, up to the rebalance timeout).
    pub timeout: Option<Duration>,
    pub request: Request,
}

/// Group requests, independent of wire versions; the driver builds the versioned message.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Request {
    FindCoordinator,
    Metadata {
        topics: Vec<String>,
    },
    JoinGroup {
        /// Always `consumer` here; the coordinator only groups members of one protocol type.
        protocol_type: &'static str,
        member_id: String,
        group_instance_id: Option<String>,
        session_timeout_ms: i32,
        rebalance_timeout_ms: i32,
        /// (assignor name, encoded subscription), in order of preference.
        protocols: Vec<(String, Bytes)>,
        reason: Option<String>,
    },
    SyncGroup {
        protocol_type: &'static str,
        generation_id: i32,
        member_id: String,
        group_instance_id: Option<String>,
        protocol_name: String,
        /// Leader only: (member id, encoded assignment).
        assignments: Vec<(String, Bytes)>,
    },
    Heartbeat {
        generation_id: i32,
        member_id: String,
        group_instance_id: Option<String>,
    },
    LeaveGroup {
        member_id: String,
        group_instance_id: Option<String>,
        reason: Option<String>,
    },
    ConsumerGroupHeartbeat(ConsumerHeartbeat),
}

impl Request {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Request::FindCoordinator => "FindCoordinator",
            Request::Metadata { .. } => "Metadata",
            Request::JoinGroup { .. } => "JoinGroup",
            Request::SyncGroup { .. } => "SyncGroup",
            Request::Heartbeat { .. } => "Heartbeat",
            Request::LeaveGroup { .. } => "LeaveGroup",
            Request::ConsumerGroupHeartbeat(_) => "ConsumerGroupHeartbeat",
        }
    }
}

/// A KIP-848 heartbeat. `None` fields mean "unchanged since the last heartbeat the coordinator saw".
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ConsumerHeartbeat {
    pub member_id: String,
    pub member_epoch: i32,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    /// -1 when unchanged.
    pub rebalance_timeout_ms: i32,
    pub subscribed_topic_names: Option<Vec<String>>,
    pub server_assignor: Option<String>,
    pub owned: Option<BTreeMap<TopicId, Vec<i32>>>,
}

/// A joined member as the JoinGroup response lists it (leader only).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct JoinedMember {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub metadata: Bytes,
}

/// One topic in a Metadata response.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TopicMetadata {
    pub name: String,
    pub id: Option<TopicId>,
    /// `None` when the broker answered with an error for the topic (it does not exist yet).
    pub partitions: Option<i32>,
}

/// Responses, already decoded and stripped to what the machines read.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Response {
    Coordinator {
        node: i32,
    },
    Metadata {
        topics: Vec<TopicMetadata>,
    },
    JoinGroup {
        error: ErrorCode,
        generation_id: i32,
        protocol_name: Option<String>,
        leader: String,
        member_id: String,
        members: Vec<JoinedMember>,
        /// KIP-814: a static leader rejoined; it must not compute a new assignment (the coordinator
        /// keeps the current one), only resume monitoring the group's topics.
        skip_assignment: bool,
    },
    SyncGroup {
        error: ErrorCode,
        protocol_name: Option<String>,
        assignment: Bytes,
    },
    Heartbeat {
        error: ErrorCode,
    },
    LeaveGroup {
        error: ErrorCode,
    },
    ConsumerGroupHeartbeat {
        error: ErrorCode,
        message: Option<String>,
        member_id: Option<String>,
        member_epoch: i32,
        heartbeat_interval_ms: i32,
        assignment: Option<BTreeMap<TopicId, Vec<i32>>>,
    },
}

/// The application-facing event queue and acknowledgement count both machines share.
#[derive(Debug, Default)]
pub(crate) struct Events {
    queue: VecDeque<MemberEvent>,
    /// Revoke/Lost events handed out by `poll` and not yet acknowledged.
    outstanding: usize,
}

impl Events {
    fn push(&mut self, event: MemberEvent) {
        match (&event, self.queue.back_mut()) {
            (MemberEvent::Assign(more), Some(MemberEvent::Assign(queued))) => {
                queued.extend(more.iter().cloned());
                queued.sort();
                queued.dedup();
            }
            (MemberEvent::Revoke(ps) | MemberEvent::Assign(ps), _) if ps.is_empty() => {}
            (MemberEvent::Lost { partitions, .. }, _) if partitions.is_empty() => {}
            _ => self.queue.push_back(event),
        }
        debug_assert!(self.queue.len() <= 8, "event queue grew: {:?}", self.queue);
    }

    fn poll(&mut self) -> Option<MemberEvent> {
        let event = self.queue.pop_front()?;
        if event.needs_ack() {
            self.outstanding += 1;
        }
        Some(event)
    }

    /// Returns whether an acknowledgement was expected.
    fn ack(&mut self) -> bool {
        if self.outstanding == 0 {
            return false;
        }
        self.outstanding -= 1;
        true
    }

    fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Whether some revocation or loss has not been acknowledged yet (handed out or still queued).
    fn blocking(&self) -> bool {
        self.outstanding > 0 || self.queue.iter().any(MemberEvent::needs_ack)
    }
}

/// Groups partitions by topic, sorted, the way the embedded protocol lists them.
pub(crate) fn by_topic(
    partitions: &BTreeSet<TopicPartition>,
) -> Vec<super::protocol::TopicPartitions> {
    let mut out: Vec<super::protocol::TopicPartitions> = Vec::new();
    for tp in partitions {
        match out.last_mut() {
            Some(last) if *last.topic == *tp.topic => last.partitions.push(tp.partition),
            _ => out.push(super::protocol::TopicPartitions {
                topic: tp.topic.to_string(),
                partitions: vec![tp.partition],
            }),
        }
    }
    out
}

fn millis_i32(d: Duration) -> i32 {
    d.as_millis().min(i32::MAX as u128) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Empty revocations are not events, consecutive assignments merge, and only Revoke/Lost block.
    #[test]
    fn events_merge_and_block_only_on_revocations() {
        let mut e = Events::default();
        e.push(MemberEvent::Revoke(vec![]));
        e.push(MemberEvent::Assign(vec![TopicPartition::new("t", 1)]));
        e.push(MemberEvent::Assign(vec![
            TopicPartition::new("t", 0),
            TopicPartition::new("t", 1),
        ]));
        assert!(!e.blocking());
        assert_eq!(
            e.poll(),
            Some(MemberEvent::Assign(vec![
                TopicPartition::new("t", 0),
                TopicPartition::new("t", 1)
            ]))
        );
        e.push(MemberEvent::Revoke(vec![TopicPartition::new("t", 0)]));
        assert!(e.blocking());
        assert!(!e.ack(), "nothing handed out yet");
        assert!(matches!(e.poll(), Some(MemberEvent::Revoke(_))));
        assert!(e.blocking());
        assert!(e.ack());
        assert!(!e.blocking());
    }
}
