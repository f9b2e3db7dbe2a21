//! The classic group membership protocol as a sans-IO state machine.
//!
//! ```text
//!            FindCoordinator
//!                  |
//!   Unjoined --JoinGroup--> Joining --(leader: Metadata, assign)--> Syncing --SyncGroup--> Stable
//!      ^   MEMBER_ID_REQUIRED: retry with the id   |                                    |
//!      |                                           '--REBALANCE_IN_PROGRESS-------------+ heartbeats
//!      '------ rejoin (REBALANCE_IN_PROGRESS, cooperative follow-up round, subscription change,
//!              ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID reset, poll after a poll-interval expiry)
//! ```
//!
//! Revocation and loss are synchronous (see the parent module): an eager member hands out
//! `Revoke(everything)` when it learns of the rebalance and sends JoinGroup only after the
//! acknowledgement; a cooperative member keeps its partitions through the join, revokes what the new
//! assignment leaves out, and sends the follow-up JoinGroup only after that acknowledgement. While the
//! application works through a revocation the member keeps heartbeating at its current generation, so
//! the coordinator does not evict it before the rebalance timeout.
//!
//! # Interleaving of a cooperative move of partition P from member A to member B
//!
//! 1. B joins; the coordinator asks every member to rejoin (A sees REBALANCE_IN_PROGRESS on a heartbeat).
//! 2. A rejoins claiming P (subscription `owned_partitions`); the leader's cooperative-sticky plan moves
//!    P to B, so P is in nobody's assignment this round. SyncGroup: A at generation n+1 without P.
//! 3. A hands out `Revoke([P])` and stops there. A's flow for P is torn down by the application. P is
//!    still owned by nobody else, because only a new round can hand it out and that round cannot
//!    complete without A rejoining.
//! 4. The application acknowledges. Only now does A send JoinGroup (claiming its remaining partitions).
//! 5. Round n+2: P is unclaimed, the plan gives it to B. B's `Assign([P])`.
//!
//! # References
//! - JoinGroup v0-v9 (v4 MEMBER_ID_REQUIRED, KIP-394; v5 group instance id, KIP-345; v8 reason, KIP-800)
//! - SyncGroup v0-v5 (v5 protocol type/name), Heartbeat v0-v4, LeaveGroup v0-v5 (v3 batch, KIP-345)
//! - KIP-62 (rebalance timeout = max poll interval), KIP-429 (incremental cooperative rebalancing)

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{
    by_topic, millis_i32, Destination, Events, Fatal, JoinedMember, LostReason, MemberEvent,
    Request, RequestId, Response, Transmit,
};
use crate::consumer::assignor::{Assignor, MemberSubscription, RebalanceProtocol};
use crate::consumer::protocol::{self, Assignment, Subscription};
use crate::consumer::{ConsumerError, GroupConfig, GroupProtocol, TopicPartition};
use crate::wire::ErrorCode;
use crate::GroupMetadata;

/// A generation this member completed (SyncGroup succeeded).
#[derive(Debug, Clone, PartialEq)]
struct Generation {
    id: i32,
    member_id: String,
}

/// One join round between the JoinGroup and SyncGroup responses.
#[derive(Debug, Clone, PartialEq)]
struct Round {
    generation: i32,
    protocol: String,
    /// Leader only: the members and, once computed, their encoded assignments.
    members: Vec<JoinedMember>,
    assignments: Vec<(String, Bytes)>,
    /// Leader only: every member's topics with the partition count the assignment used (`None`: the
    /// topic did not exist).
    topics: BTreeMap<String, Option<i32>>,
    leader: bool,
    /// KIP-814: a rejoining static leader keeps the coordinator's assignment; it only re-reads the
    /// partition counts it monitors.
    skip_assignment: bool,
}

#[derive(Debug, Clone, PartialEq)]
enum Phase {
    /// Not in a round. Joins when `rejoin` is set, the coordinator is known, every revocation is
    /// acknowledged and the backoff has passed. May still hold the previous generation (it heartbeats
    /// with it while the application revokes).
    Unjoined,
    /// JoinGroup in flight.
    Joining,
    /// Leader: Metadata for the members' topics to send or in flight.
    AwaitingMetadata(Box<Round>),
    /// SyncGroup to send or in flight.
    Syncing(Box<Round>),
    Stable,
    /// Left the group because the application stopped polling; rejoins on the next poll.
    Dormant,
    /// Revoking before LeaveGroup, or LeaveGroup in flight.
    Leaving,
    Closed,
    Failed,
}

/// What a main (non-heartbeat) request in flight was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MainKind {
    Join,
    Metadata,
    Sync,
    Leave,
}

/// A LeaveGroup for a membership this member has given up.
#[derive(Debug, Clone, PartialEq)]
struct Farewell {
    member_id: String,
    reason: String,
    /// Sent only once every revocation and loss is acknowledged: a rejoin asked for while a revoke
    /// handler runs must not let the coordinator hand those partitions on before the handler is done.
    /// A poll-interval expiry does not wait (the application is stuck; waiting would defeat it).
    after_ack: bool,
}

/// A classic-protocol consumer group member.
#[derive(Debug)]
pub(crate) struct ClassicMember {
    group_id: String,
    instance_id: Option<String>,
    assignors: Vec<Assignor>,
    rebalance: RebalanceProtocol,
    session_timeout: Duration,
    heartbeat_interval: Duration,
    rebalance_timeout: Duration,
    retry_backoff: Duration,
    metadata_max_age: Duration,
    rack_id: Option<String>,

    topics: BTreeSet<String>,

    phase: Phase,
    member_id: String,
    generation: Option<Generation>,
    owned: BTreeSet<TopicPartition>,
    rejoin: Option<String>,
    /// Set while this member is the leader of the current generation: the partition counts it
    /// assigned with, re-read every `metadata_max_age` so a change triggers a rebalance.
    leader_topics: Option<BTreeMap<String, Option<i32>>>,

    coordinator: Option<i32>,
    find_inflight: Option<RequestId>,
    coordinator_retry_at: Instant,

    main_inflight: Option<(RequestId, MainKind)>,
    retry_at: Instant,

    heartbeat_inflight: Option<(RequestId, i32)>,
    next_heartbeat: Instant,
    last_heartbeat_ok: Instant,

    metadata_check_inflight: Option<RequestId>,
    next_metadata_check: Instant,

    /// A LeaveGroup to send without waiting for its answer (after a poll-interval expiry or a rejoin
    /// as a new member).
    farewell: Option<Farewell>,

    last_poll: Instant,
    events: Events,
    next_id: u64,
}

impl ClassicMember {
    /// A member of `config.group_id` subscribed to `topics`, starting to join at `now`.
    pub(crate) fn new(
        config: &GroupConfig,
        topics: impl IntoIterator<Item = String>,
        now: Instant,
    ) -> Result<Self, ConsumerError> {
        config.validate()?;
        let GroupProtocol::Classic { assignors } = &config.protocol else {
            return Err(ConsumerError::InvalidConfig(
                "a classic member needs GroupProtocol::Classic".into(),
            ));
        };
        Ok(ClassicMember {
            group_id: config.group_id.clone(),
            instance_id: config.group_instance_id.clone(),
            assignors: assignors.clone(),
            rebalance: Assignor::protocol_for(assignors),
            session_timeout: config.session_timeout,
            heartbeat_interval: config.heartbeat_interval,
            rebalance_timeout: config.max_poll_interval,
            retry_backoff: config.retry_backoff,
            metadata_max_age: config.metadata_max_age,
            rack_id: config.rack_id.clone(),
            topics: topics.into_iter().collect(),
            phase: Phase::Unjoined,
            member_id: String::new(),
            generation: None,
            owned: BTreeSet::new(),
            rejoin: Some("initial join".into()),
            leader_topics: None,
            coordinator: None,
            find_inflight: None,
            coordinator_retry_at: now,
            main_inflight: None,
            retry_at: now,
            heartbeat_inflight: None,
            next_heartbeat: now,
            last_heartbeat_ok: now,
            metadata_check_inflight: None,
            next_metadata_check: now,
            farewell: None,
            last_poll: now,
            events: Events::default(),
            next_id: 0,
        })
    }

    // ---------------------------------------------------------------- application-facing

    /// The fencing token for commits: the last completed generation, while this member holds it.
    pub(crate) fn group_metadata(&self) -> Option<GroupMetadata> {
        let g = self.generation.as_ref()?;
        GroupMetadata::new(
            self.group_id.clone(),
            g.id,
            g.member_id.clone(),
            self.instance_id.clone(),
        )
        .ok()
    }

    /// The partitions assigned and not yet handed out for revocation or loss.
    /// The machine's view; the application's is the poll path's held set.
    #[cfg(test)]
    pub(crate) fn assignment(&self) -> &BTreeSet<TopicPartition> {
        &self.owned
    }

    pub(crate) fn poll_event(&mut self) -> Option<MemberEvent> {
        self.events.poll()
    }

    pub(crate) fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// The application finished handling the oldest outstanding `Revoke` or `Lost`.
    pub(crate) fn ack(&mut self, _now: Instant) {
        if !self.events.ack() {
            tracing::warn!(group = %self.group_id, "revocation acknowledged twice");
        }
    }

    /// The application polled: the member is alive. A member that left after a poll-interval expiry
    /// rejoins now.
    /// Records a poll. Returns whether the driver has something new to send (a member that had left
    /// for exceeding the poll interval rejoins); an ordinary poll only moves the poll-interval deadline,
    /// which the driver reads the next time it wakes anyway.
    pub(crate) fn handle_poll(&mut self, now: Instant) -> bool {
        self.last_poll = now;
        if self.phase == Phase::Dormant {
            self.phase = Phase::Unjoined;
            self.rejoin = Some("polled again after the poll interval expired".into());
            return true;
        }
        false
    }

    /// Changes the subscription; a change triggers a rebalance.
    pub(crate) fn subscribe(&mut self, topics: impl IntoIterator<Item = String>) {
        let topics: BTreeSet<String> = topics.into_iter().collect();
        if topics != self.topics {
            self.topics = topics;
            self.request_rejoin("subscription changed");
        }
    }

    /// Leaves the group: revokes everything (acknowledge as usual), then sends LeaveGroup unless the
    /// member is static (a static member's session simply times out, so a restart can resume it).
    pub(crate) fn leave(&mut self) {
        if matches!(self.phase, Phase::Closed | Phase::Failed | Phase::Leaving) {
            return;
        }
        // Only a member holding a generation owns anything (a reset hands everything out as lost).
        let held = std::mem::take(&mut self.owned);
        self.events
            .push(MemberEvent::Revoke(held.into_iter().collect()));
        self.main_inflight = None;
        self.heartbeat_inflight = None;
        self.phase = Phase::Leaving;
    }

    pub(crate) fn is_closed(&self) -> bool {
        matches!(self.phase, Phase::Closed | Phase::Failed)
    }

    /// Gives up this membership and joins again as a new member, on the application's word (the
    /// snapshot runtime learnt it was evicted, or that a newer owner fenced its producer): everything
    /// owned is reported [`LostReason::Rejoined`] (never revoked: nothing may be written from the old
    /// membership), the generation is dropped at once (so no commit carries it any more), a dynamic
    /// member forgets its member id and says goodbye with a LeaveGroup it does not wait for (so the next
    /// round need not wait out the old id's session), and the join goes out once the loss is
    /// acknowledged. A static member keeps its id: its instance id names it, and the coordinator
    /// replaces the old incarnation on the join. Does nothing on a member that is closing or closed.
    pub(crate) fn rejoin_as_new(&mut self, now: Instant, reason: &str) {
        match self.phase {
            Phase::Closed | Phase::Failed | Phase::Leaving => return,
            // Already out of the group with its partitions reported lost; the next poll rejoins.
            Phase::Dormant => return,
            _ => {}
        }
        tracing::info!(group = %self.group_id, member = %self.member_id, reason, "rejoining as a new member");
        if self.instance_id.is_none() && !self.member_id.is_empty() {
            self.farewell = Some(Farewell {
                member_id: self.member_id.clone(),
                reason: format!("rejoining as a new member: {reason}"),
                after_ack: true,
            });
            self.member_id.clear();
        }
        self.generation = None;
        self.leader_topics = None;
        let lost = std::mem::take(&mut self.owned);
        self.events.push(MemberEvent::Lost {
            partitions: lost.into_iter().collect(),
            reason: LostReason::Rejoined,
        });
        self.main_inflight = None;
        self.heartbeat_inflight = None;
        self.phase = Phase::Unjoined;
        self.rejoin = Some(format!("rejoining as a new member: {reason}"));
        self.retry_at = now;
    }

    // ---------------------------------------------------------------- driver-facing

    /// The next request to send, if any is due at `now`. Call until it returns `None`.
    pub(crate) fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        self.handle_timeout(now);
        let farewell_due = self
            .farewell
            .as_ref()
            .is_some_and(|f| !f.after_ack || !self.events.blocking());
        if farewell_due {
            if let (Some(node), Some(f)) = (self.coordinator, self.farewell.take()) {
                return Some(self.transmit(
                    Destination::Coordinator(node),
                    None,
                    Request::LeaveGroup {
                        member_id: f.member_id,
                        group_instance_id: None,
                        reason: Some(f.reason),
                    },
                ));
            }
        }
        match self.phase {
            Phase::Closed | Phase::Failed | Phase::Dormant => return None,
            Phase::Leaving => return self.poll_leave(),
            _ => {}
        }
        if self.coordinator.is_none() {
            // The leader's Metadata does not need the coordinator; everything else waits for it.
            if let Phase::AwaitingMetadata(_) = self.phase {
                if let Some(t) = self.poll_main(now) {
                    return Some(t);
                }
            }
            if self.find_inflight.is_none() && now >= self.coordinator_retry_at {
                let t = self.transmit(Destination::AnyBroker, None, Request::FindCoordinator);
                self.find_inflight = Some(t.id);
                return Some(t);
            }
            return None;
        }
        if let Some(t) = self.poll_main(now) {
            return Some(t);
        }
        if let Some(t) = self.poll_metadata_check(now) {
            return Some(t);
        }
        self.poll_heartbeat(now)
    }

    /// When the member next needs `handle_timeout`/`poll_transmit`, if ever.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        if self.is_closed() {
            return None;
        }
        let mut t: Option<Instant> = None;
        let mut at = |i: Instant| t = Some(t.map_or(i, |t| t.min(i)));
        if self.phase == Phase::Dormant {
            return None;
        }
        if self.phase != Phase::Leaving {
            at(self.last_poll + self.rebalance_timeout);
        }
        if self.coordinator.is_none() {
            if self.find_inflight.is_none() {
                at(self.coordinator_retry_at);
            }
        } else {
            if self.main_inflight.is_none() && self.wants_main() {
                at(self.retry_at);
            }
            if self.heartbeat_generation().is_some() {
                if self.heartbeat_inflight.is_none() {
                    at(self.next_heartbeat);
                }
                at(self.last_heartbeat_ok + self.session_timeout);
            }
            if self.is_stable_leader() && self.metadata_check_inflight.is_none() {
                at(self.next_metadata_check);
            }
        }
        t
    }

    /// Checks the poll interval and the session: call when `poll_timeout` passes (`poll_transmit` also
    /// calls it).
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        if matches!(
            self.phase,
            Phase::Closed | Phase::Failed | Phase::Dormant | Phase::Leaving
        ) {
            return;
        }
        if now >= self.last_poll + self.rebalance_timeout {
            self.poll_interval_expired();
            return;
        }
        if self.coordinator.is_some()
            && self.heartbeat_generation().is_some()
            && now >= self.last_heartbeat_ok + self.session_timeout
        {
            // No heartbeat got through for a whole session: the coordinator has probably moved or
            // died. Rediscover it; if it evicted us meanwhile, the next heartbeat says so.
            tracing::warn!(group = %self.group_id, "no successful heartbeat for a session timeout; rediscovering the coordinator");
            self.last_heartbeat_ok = now;
            self.coordinator_unknown(now);
        }
    }

    /// A request failed without a response (the transport gave up on it).
    pub(crate) fn handle_failure(&mut self, now: Instant, id: RequestId) {
        if self.find_inflight == Some(id) {
            self.find_inflight = None;
            self.coordinator_retry_at = now + self.retry_backoff;
        } else if self.metadata_check_inflight == Some(id) {
            self.metadata_check_inflight = None;
            self.next_metadata_check = now + self.retry_backoff;
        } else if self.heartbeat_inflight.map(|h| h.0) == Some(id) {
            self.heartbeat_inflight = None;
            self.coordinator_unknown(now);
        } else if let Some((mid, kind)) = self.main_inflight {
            if mid != id {
                return;
            }
            self.main_inflight = None;
            match kind {
                MainKind::Metadata => self.retry_at = now + self.retry_backoff,
                MainKind::Leave => self.phase = Phase::Closed,
                MainKind::Join | MainKind::Sync => self.coordinator_unknown(now),
            }
        }
    }

    pub(crate) fn handle_response(&mut self, now: Instant, id: RequestId, response: Response) {
        if self.find_inflight == Some(id) {
            self.find_inflight = None;
            if let Response::Coordinator { node } = response {
                self.coordinator = Some(node);
                self.last_heartbeat_ok = now;
            }
            return;
        }
        if self.metadata_check_inflight == Some(id) {
            self.metadata_check_inflight = None;
            self.next_metadata_check = now + self.metadata_max_age;
            if let Response::Metadata { topics } = response {
                self.check_partition_counts(&topics);
            }
            return;
        }
        if let Some((hid, generation)) = self.heartbeat_inflight {
            if hid == id {
                self.heartbeat_inflight = None;
                if let Response::Heartbeat { error } = response {
                    self.on_heartbeat(now, generation, error);
                }
                return;
            }
        }
        let Some((mid, kind)) = self.main_inflight else {
            return;
        };
        if mid != id {
            return;
        }
        self.main_inflight = None;
        match (kind, response) {
            (
                MainKind::Join,
                Response::JoinGroup {
                    error,
                    generation_id,
                    protocol_name,
                    leader,
                    member_id,
                    members,
                    skip_assignment,
                },
            ) => self.on_join(
                now,
                error,
                generation_id,
                protocol_name,
                (leader, skip_assignment),
                member_id,
                members,
            ),
            (MainKind::Metadata, Response::Metadata { topics }) => self.on_metadata(now, topics),
            (
                MainKind::Sync,
                Response::SyncGroup {
                    error,
                    protocol_name,
                    assignment,
                },
            ) => self.on_sync(now, error, protocol_name, assignment),
            (MainKind::Leave, Response::LeaveGroup { error }) => {
                if !error.is_ok() {
                    tracing::info!(group = %self.group_id, %error, "LeaveGroup refused; the session will expire instead");
                }
                self.phase = Phase::Closed;
            }
            (kind, other) => {
                tracing::error!(?kind, ?other, "response does not match the request");
                self.handle_failure(now, id);
            }
        }
    }

    // ---------------------------------------------------------------- sending

    fn transmit(
        &mut self,
        to: Destination,
        timeout: Option<Duration>,
        request: Request,
    ) -> Transmit {
        self.next_id += 1;
        Transmit {
            id: RequestId(self.next_id),
            to,
            timeout,
            request,
        }
    }

    fn coordinator_dest(&self) -> Destination {
        Destination::Coordinator(self.coordinator.expect("checked by the caller"))
    }

    fn wants_main(&self) -> bool {
        match &self.phase {
            Phase::Unjoined => self.rejoin.is_some() && !self.events.blocking(),
            Phase::AwaitingMetadata(_) | Phase::Syncing(_) => true,
            _ => false,
        }
    }

    fn is_stable_leader(&self) -> bool {
        self.phase == Phase::Stable && self.leader_topics.is_some()
    }

    /// The generation and member id a heartbeat carries now, if the member should heartbeat.
    fn heartbeat_generation(&self) -> Option<(i32, String)> {
        match &self.phase {
            // Between JoinGroup and SyncGroup the group is already at the round's generation.
            Phase::Syncing(round) | Phase::AwaitingMetadata(round) => {
                Some((round.generation, self.member_id.clone()))
            }
            Phase::Stable | Phase::Unjoined => self
                .generation
                .as_ref()
                .map(|g| (g.id, g.member_id.clone())),
            _ => None,
        }
    }

    fn poll_main(&mut self, now: Instant) -> Option<Transmit> {
        if self.main_inflight.is_some() || now < self.retry_at {
            return None;
        }
        match self.phase.clone() {
            Phase::Unjoined => {
                if self.rejoin.is_none() || self.events.blocking() {
                    return None;
                }
                if self.prepare_join() {
                    // Revocations were just handed out; JoinGroup waits for their acknowledgement.
                    return None;
                }
                let t = self.join_request();
                self.main_inflight = Some((t.id, MainKind::Join));
                self.phase = Phase::Joining;
                Some(t)
            }
            Phase::AwaitingMetadata(round) => {
                let topics: BTreeSet<String> = round
                    .members
                    .iter()
                    .filter_map(|m| Subscription::decode(m.metadata.clone()).ok())
                    .flat_map(|s| s.topics)
                    .collect();
                let t = self.transmit(
                    Destination::AnyBroker,
                    None,
                    Request::Metadata {
                        topics: topics.into_iter().collect(),
                    },
                );
                self.main_inflight = Some((t.id, MainKind::Metadata));
                Some(t)
            }
            Phase::Syncing(round) => {
                let t = self.transmit(
                    self.coordinator_dest(),
                    None,
                    Request::SyncGroup {
                        protocol_type: protocol::PROTOCOL_TYPE,
                        generation_id: round.generation,
                        member_id: self.member_id.clone(),
                        group_instance_id: self.instance_id.clone(),
                        protocol_name: round.protocol.clone(),
                        assignments: round.assignments.clone(),
                    },
                );
                self.main_inflight = Some((t.id, MainKind::Sync));
                Some(t)
            }
            _ => None,
        }
    }

    /// Hands out what must be revoked before this member may send JoinGroup. Returns whether it did.
    fn prepare_join(&mut self) -> bool {
        let revoke: BTreeSet<TopicPartition> = match self.rebalance {
            // Eager: everything goes back before the join, so the leader starts from nothing.
            RebalanceProtocol::Eager => std::mem::take(&mut self.owned),
            // Cooperative: keep what is still subscribed; the assignment decides the rest.
            RebalanceProtocol::Cooperative => {
                let gone: BTreeSet<_> = self
                    .owned
                    .iter()
                    .filter(|tp| !self.topics.contains(&*tp.topic))
                    .cloned()
                    .collect();
                self.owned.retain(|tp| !gone.contains(tp));
                gone
            }
        };
        if revoke.is_empty() {
            return false;
        }
        self.events
            .push(MemberEvent::Revoke(revoke.into_iter().collect()));
        true
    }

    fn join_request(&mut self) -> Transmit {
        let generation = self.generation.as_ref().map_or(-1, |g| g.id);
        let subscription = Subscription {
            topics: self.topics.iter().cloned().collect(),
            user_data: None,
            owned_partitions: by_topic(&self.owned),
            generation_id: generation,
            rack_id: self.rack_id.clone(),
        }
        .encode(protocol::HIGHEST_VERSION);
        let protocols = self
            .assignors
            .iter()
            .map(|a| (a.name().to_string(), subscription.clone()))
            .collect();
        let request = Request::JoinGroup {
            protocol_type: protocol::PROTOCOL_TYPE,
            member_id: self.member_id.clone(),
            group_instance_id: self.instance_id.clone(),
            session_timeout_ms: millis_i32(self.session_timeout),
            rebalance_timeout_ms: millis_i32(self.rebalance_timeout),
            protocols,
            reason: self.rejoin.clone(),
        };
        // The coordinator holds JoinGroup until every member has joined or the rebalance timeout
        // passes; the transport must wait at least that long.
        let timeout = Some(self.rebalance_timeout + Duration::from_secs(5));
        self.transmit(self.coordinator_dest(), timeout, request)
    }

    fn poll_heartbeat(&mut self, now: Instant) -> Option<Transmit> {
        if self.heartbeat_inflight.is_some() || now < self.next_heartbeat {
            return None;
        }
        let (generation_id, member_id) = self.heartbeat_generation()?;
        let t = self.transmit(
            self.coordinator_dest(),
            None,
            Request::Heartbeat {
                generation_id,
                member_id,
                group_instance_id: self.instance_id.clone(),
            },
        );
        self.heartbeat_inflight = Some((t.id, generation_id));
        self.next_heartbeat = now + self.heartbeat_interval;
        Some(t)
    }

    fn poll_metadata_check(&mut self, now: Instant) -> Option<Transmit> {
        if !self.is_stable_leader()
            || self.metadata_check_inflight.is_some()
            || now < self.next_metadata_check
        {
            return None;
        }
        let topics = self.leader_topics.as_ref()?.keys().cloned().collect();
        let t = self.transmit(Destination::AnyBroker, None, Request::Metadata { topics });
        self.metadata_check_inflight = Some(t.id);
        Some(t)
    }

    fn poll_leave(&mut self) -> Option<Transmit> {
        if self.events.blocking() || self.main_inflight.is_some() {
            return None;
        }
        let dynamic = self.instance_id.is_none();
        match self.coordinator {
            Some(node) if dynamic && !self.member_id.is_empty() => {
                let t = self.transmit(
                    Destination::Coordinator(node),
                    None,
                    Request::LeaveGroup {
                        member_id: self.member_id.clone(),
                        group_instance_id: None,
                        reason: Some("the consumer is being closed".into()),
                    },
                );
                self.main_inflight = Some((t.id, MainKind::Leave));
                Some(t)
            }
            _ => {
                self.phase = Phase::Closed;
                None
            }
        }
    }

    // ---------------------------------------------------------------- state changes

    fn request_rejoin(&mut self, reason: &str) {
        if self.rejoin.is_none() {
            self.rejoin = Some(reason.to_string());
        }
        if self.phase == Phase::Stable {
            self.phase = Phase::Unjoined;
        }
    }

    fn coordinator_unknown(&mut self, now: Instant) {
        if self.coordinator.take().is_some() {
            tracing::info!(group = %self.group_id, "group coordinator unknown; rediscovering");
        }
        self.coordinator_retry_at = now + self.retry_backoff;
        self.heartbeat_inflight = None;
        self.next_heartbeat = now;
        match self.phase {
            Phase::Joining | Phase::Syncing(_) => {
                self.main_inflight = None;
                self.phase = Phase::Unjoined;
                if self.rejoin.is_none() {
                    self.rejoin = Some("coordinator changed during the join".into());
                }
            }
            Phase::Leaving => {
                self.main_inflight = None;
                self.phase = Phase::Closed;
            }
            _ => {}
        }
    }

    /// The coordinator no longer knows this member at its generation: whatever it held is lost.
    fn reset_generation(&mut self, now: Instant, code: ErrorCode, forget_member_id: bool) {
        tracing::warn!(group = %self.group_id, %code, "membership reset; partitions lost");
        self.generation = None;
        if forget_member_id {
            self.member_id.clear();
        }
        let lost = std::mem::take(&mut self.owned);
        self.events.push(MemberEvent::Lost {
            partitions: lost.into_iter().collect(),
            reason: LostReason::Fenced(code),
        });
        self.main_inflight = None;
        self.heartbeat_inflight = None;
        self.phase = Phase::Unjoined;
        self.rejoin = Some(format!("membership reset by {}", code.name()));
        self.retry_at = now;
    }

    fn fail(&mut self, code: ErrorCode, request: &'static str, message: Option<String>) {
        tracing::error!(group = %self.group_id, %code, request, "fatal group error");
        self.phase = Phase::Failed;
        self.main_inflight = None;
        self.heartbeat_inflight = None;
        self.events.push(MemberEvent::Fatal(Fatal {
            code,
            request,
            message,
        }));
    }

    fn poll_interval_expired(&mut self) {
        tracing::warn!(group = %self.group_id, timeout = ?self.rebalance_timeout,
            "no poll within the max poll interval; leaving the group, partitions lost");
        let lost = std::mem::take(&mut self.owned);
        self.events.push(MemberEvent::Lost {
            partitions: lost.into_iter().collect(),
            reason: LostReason::PollIntervalExceeded,
        });
        if self.instance_id.is_none() && !self.member_id.is_empty() {
            self.farewell = Some(Farewell {
                member_id: self.member_id.clone(),
                reason: "consumer poll interval expired".into(),
                after_ack: false,
            });
        }
        self.generation = None;
        self.member_id.clear();
        self.main_inflight = None;
        self.heartbeat_inflight = None;
        self.rejoin = None;
        self.phase = Phase::Dormant;
    }

    /// Codes every group request handles the same way. Returns true when handled.
    fn common_error(&mut self, now: Instant, error: ErrorCode, request: &'static str) -> bool {
        match error {
            ErrorCode::CoordinatorNotAvailable | ErrorCode::NotCoordinator => {
                self.coordinator_unknown(now);
                true
            }
            ErrorCode::GroupAuthorizationFailed
            | ErrorCode::FencedInstanceId
            | ErrorCode::InconsistentGroupProtocol
            | ErrorCode::InvalidSessionTimeout
            | ErrorCode::InvalidGroupId
            | ErrorCode::GroupMaxSizeReached
            | ErrorCode::UnsupportedVersion => {
                self.fail(error, request, None);
                true
            }
            _ => false,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_join(
        &mut self,
        now: Instant,
        error: ErrorCode,
        generation_id: i32,
        protocol_name: Option<String>,
        (leader, skip_assignment): (String, bool),
        member_id: String,
        members: Vec<JoinedMember>,
    ) {
        self.phase = Phase::Unjoined;
        match error {
            ErrorCode::None => {}
            ErrorCode::MemberIdRequired => {
                // KIP-394: the coordinator hands out the id first so a member that never gets the
                // answer does not leave a ghost; join again with it right away.
                self.member_id = member_id;
                self.retry_at = now;
                return;
            }
            ErrorCode::UnknownMemberId => return self.reset_generation(now, error, true),
            ErrorCode::IllegalGeneration => return self.reset_generation(now, error, false),
            ErrorCode::CoordinatorLoadInProgress | ErrorCode::RebalanceInProgress => {
                self.retry_at = now + self.retry_backoff;
                return;
            }
            e if self.common_error(now, e, "JoinGroup") => return,
            e if e.is_retriable() => {
                self.retry_at = now + self.retry_backoff;
                return;
            }
            e => return self.fail(e, "JoinGroup", None),
        }
        let Some(protocol) = protocol_name.filter(|p| Assignor::from_name(p).is_some()) else {
            return self.fail(
                ErrorCode::InconsistentGroupProtocol,
                "JoinGroup",
                Some("the coordinator chose an assignor this member did not offer".into()),
            );
        };
        self.member_id = member_id;
        let is_leader = leader == self.member_id;
        let round = Box::new(Round {
            generation: generation_id,
            protocol,
            members,
            assignments: Vec::new(),
            topics: BTreeMap::new(),
            leader: is_leader,
            skip_assignment,
        });
        self.phase = if is_leader {
            Phase::AwaitingMetadata(round)
        } else {
            Phase::Syncing(round)
        };
        // The answer proves the session alive; the round's heartbeats start from here.
        self.last_heartbeat_ok = now;
        self.next_heartbeat = now + self.heartbeat_interval;
        self.retry_at = now;
    }

    fn on_metadata(&mut self, now: Instant, topics: Vec<super::TopicMetadata>) {
        let Phase::AwaitingMetadata(mut round) =
            std::mem::replace(&mut self.phase, Phase::Unjoined)
        else {
            return;
        };
        let counts: BTreeMap<String, i32> = topics
            .iter()
            .filter_map(|t| t.partitions.map(|n| (t.name.clone(), n)))
            .collect();
        let subscriptions: Vec<MemberSubscription> = round
            .members
            .iter()
            .map(|m| {
                let s = Subscription::decode(m.metadata.clone()).unwrap_or_else(|e| {
                    // A member we cannot read gets nothing rather than breaking the round for all.
                    tracing::warn!(member = %m.member_id, error = %e, "unreadable subscription; assigning it nothing");
                    Subscription::default()
                });
                MemberSubscription {
                    member_id: m.member_id.clone(),
                    group_instance_id: m.group_instance_id.clone(),
                    topics: s.topics.into_iter().collect(),
                    owned: s
                        .owned_partitions
                        .into_iter()
                        .flat_map(|tp| {
                            let topic: std::sync::Arc<str> = tp.topic.into();
                            tp.partitions
                                .into_iter()
                                .map(move |p| TopicPartition::new(topic.clone(), p))
                        })
                        .collect(),
                    generation: s.generation_id,
                }
            })
            .collect();
        let assignor = Assignor::from_name(&round.protocol).expect("checked at join");
        let plan = if round.skip_assignment {
            BTreeMap::new()
        } else {
            assignor.assign(&subscriptions, &counts)
        };
        round.assignments = plan
            .into_iter()
            .map(|(member, set)| {
                let a = Assignment {
                    assigned_partitions: by_topic(&set),
                    user_data: None,
                };
                (member, a.encode(protocol::HIGHEST_VERSION))
            })
            .collect();
        round.topics = topics.into_iter().map(|t| (t.name, t.partitions)).collect();
        self.phase = Phase::Syncing(round);
        self.retry_at = now;
    }

    fn on_sync(
        &mut self,
        now: Instant,
        error: ErrorCode,
        protocol_name: Option<String>,
        assignment: Bytes,
    ) {
        let Phase::Syncing(round) = std::mem::replace(&mut self.phase, Phase::Unjoined) else {
            return;
        };
        match error {
            ErrorCode::None => {}
            ErrorCode::UnknownMemberId => return self.reset_generation(now, error, true),
            ErrorCode::IllegalGeneration => return self.reset_generation(now, error, false),
            ErrorCode::RebalanceInProgress => {
                self.rejoin = Some("rebalance restarted during SyncGroup".into());
                self.retry_at = now;
                return;
            }
            e if self.common_error(now, e, "SyncGroup") => return,
            e if e.is_retriable() => {
                self.rejoin = Some(format!("SyncGroup failed with {}", e.name()));
                self.retry_at = now + self.retry_backoff;
                return;
            }
            e => return self.fail(e, "SyncGroup", None),
        }
        if let Some(p) = protocol_name {
            if p != round.protocol {
                return self.fail(
                    ErrorCode::InconsistentGroupProtocol,
                    "SyncGroup",
                    Some(format!("joined with {}, synced with {p}", round.protocol)),
                );
            }
        }
        let assigned: BTreeSet<TopicPartition> = match Assignment::decode(assignment) {
            Ok(a) => a
                .assigned_partitions
                .into_iter()
                .flat_map(|tp| {
                    let topic: std::sync::Arc<str> = tp.topic.into();
                    tp.partitions
                        .into_iter()
                        .map(move |p| TopicPartition::new(topic.clone(), p))
                })
                .collect(),
            Err(e) => {
                return self.fail(
                    ErrorCode::InconsistentGroupProtocol,
                    "SyncGroup",
                    Some(e.to_string()),
                )
            }
        };

        self.generation = Some(Generation {
            id: round.generation,
            member_id: self.member_id.clone(),
        });
        self.leader_topics = round.leader.then(|| round.topics.clone());
        self.next_metadata_check = now + self.metadata_max_age;
        self.rejoin = None;
        self.phase = Phase::Stable;
        self.last_heartbeat_ok = now;
        self.next_heartbeat = now + self.heartbeat_interval;

        let revoked: Vec<TopicPartition> = self.owned.difference(&assigned).cloned().collect();
        let added: Vec<TopicPartition> = assigned.difference(&self.owned).cloned().collect();
        self.owned = assigned;
        if !revoked.is_empty() {
            // Cooperative: the leader left these out because they move. Give them up, then rejoin so
            // the next round can hand them to their new owner (the rejoin waits for the ack).
            self.events.push(MemberEvent::Revoke(revoked));
            self.request_rejoin("revoked partitions for a cooperative follow-up round");
        }
        self.events.push(MemberEvent::Assign(added));
    }

    fn on_heartbeat(&mut self, now: Instant, sent_generation: i32, error: ErrorCode) {
        let current = self.heartbeat_generation().map(|g| g.0);
        match error {
            ErrorCode::None => self.last_heartbeat_ok = now,
            ErrorCode::RebalanceInProgress => {
                self.last_heartbeat_ok = now;
                if self.phase == Phase::Stable {
                    self.request_rejoin("the coordinator started a rebalance");
                }
            }
            // An answer about a generation we have already left behind says nothing about this one.
            ErrorCode::IllegalGeneration if current == Some(sent_generation) => {
                self.reset_generation(now, error, false)
            }
            ErrorCode::UnknownMemberId if current == Some(sent_generation) => {
                self.reset_generation(now, error, true)
            }
            ErrorCode::IllegalGeneration | ErrorCode::UnknownMemberId => {}
            e if self.common_error(now, e, "Heartbeat") => {}
            e if e.is_retriable() => self.next_heartbeat = now + self.retry_backoff,
            e => self.fail(e, "Heartbeat", None),
        }
    }

    fn check_partition_counts(&mut self, topics: &[super::TopicMetadata]) {
        let Some(before) = &self.leader_topics else {
            return;
        };
        let changed = topics
            .iter()
            .any(|t| before.get(&t.name).is_some_and(|n| *n != t.partitions));
        if changed && self.phase == Phase::Stable {
            self.request_rejoin("partition counts changed");
        }
    }
}

#[cfg(test)]
#[path = "classic_tests.rs"]
mod tests;
