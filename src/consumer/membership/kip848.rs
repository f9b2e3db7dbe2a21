//! The KIP-848 consumer group protocol (`group.protocol=consumer`) as a sans-IO state machine.
//!
//! One request, ConsumerGroupHeartbeat, does everything: join (member epoch 0), stay alive, report the
//! partitions owned, receive the assignment the coordinator computed, and leave (epoch -1, or -2 for a
//! static member that will come back).
//!
//! # Reconciliation, and why the revoke handler gates the acknowledgement
//!
//! The coordinator never hands a member a partition another member still owns. When the target
//! assignment moves P from A to B:
//!
//! 1. A's heartbeat response carries its assignment without P; A's epoch stays where it was.
//! 2. A hands out `Revoke([P])` and keeps heartbeating with its owned set unchanged (it still owns P:
//!    commits at its current epoch are accepted).
//! 3. The application tears P's flow down and acknowledges.
//! 4. Only now does A send the heartbeat whose owned set leaves P out: that is the acknowledgement.
//! 5. The coordinator bumps A's epoch and releases P; a later heartbeat response gives P to B.
//!
//! An epoch bump that changes nothing in this member's assignment arrives as a response with a new
//! epoch and a null (unchanged) assignment: no event, only `group_metadata()`
//! changes, which is why the group metadata is read after every poll and not captured in a callback.
//!
//! # References
//! - KIP-848 (the next generation consumer rebalance protocol), ConsumerGroupHeartbeat v0-v1
//! - KIP-1082 (v1: the client generates its member id)
//! - KIP-1251 (brokers 4.3+: a commit at a lagging epoch is accepted for partitions still owned)

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{
    millis_i32, ConsumerHeartbeat, Destination, Events, Fatal, LostReason, MemberEvent, Request,
    RequestId, Response, TopicMetadata, Transmit,
};
use crate::consumer::{ConsumerError, GroupConfig, GroupProtocol, TopicId, TopicPartition};
use crate::wire::ErrorCode;
use crate::GroupMetadata;

/// Epoch that leaves the group for good.
const LEAVE_EPOCH: i32 = -1;
/// Epoch a static member leaves with when it means to come back (its partitions wait for it until the
/// session times out).
const LEAVE_STATIC_EPOCH: i32 = -2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Joining at epoch 0 (first join, or after being fenced once the loss is acknowledged).
    Joining,
    /// In the group; reconciles whenever a new target arrives.
    Stable,
    /// Left the group because the application stopped polling; rejoins on the next poll.
    Dormant,
    /// Revoking before leaving, or the leave heartbeat in flight.
    Leaving,
    Closed,
    Failed,
}

/// Why the member is leaving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LeaveKind {
    /// The application closes the consumer: revoke first, then leave, then closed.
    Close,
    /// The poll interval expired: leave at once (the application is stuck, so waiting for its
    /// acknowledgement would defeat the point), then wait for the next poll.
    PollTimeout,
    /// The application asked to join again as a new member: leave at once (the partitions are already
    /// reported lost), then join at epoch 0.
    Rejoin,
}

/// What the coordinator has confirmed seeing, so unchanged fields can be sent as null.
#[derive(Debug, Clone, PartialEq)]
struct Sent {
    topics: BTreeSet<String>,
    owned: BTreeSet<(TopicId, i32)>,
}

/// A reconciliation waiting for its revocation to be acknowledged.
#[derive(Debug, Clone, PartialEq)]
struct Reconciling {
    target: BTreeSet<(TopicId, i32)>,
}

/// A consumer-protocol group member.
#[derive(Debug)]
pub(crate) struct ConsumerMember {
    group_id: String,
    instance_id: Option<String>,
    rack_id: Option<String>,
    server_assignor: Option<String>,
    rebalance_timeout: Duration,
    retry_backoff: Duration,

    topics: BTreeSet<String>,
    topic_names: BTreeMap<TopicId, Arc<str>>,

    phase: Phase,
    member_id: String,
    /// Whether the member id is ours (v1) and survives fencing, or the coordinator's (v0).
    own_member_id: bool,
    member_epoch: i32,
    heartbeat_interval: Duration,

    owned: BTreeMap<(TopicId, i32), TopicPartition>,
    /// The latest assignment from the coordinator not yet reconciled.
    target: Option<BTreeSet<(TopicId, i32)>>,
    reconciling: Option<Reconciling>,
    /// Send a heartbeat as soon as possible (join, acknowledgement, leave).
    send_now: bool,
    sent: Option<Sent>,

    coordinator: Option<i32>,
    find_inflight: Option<RequestId>,
    coordinator_retry_at: Instant,
    inflight: Option<(RequestId, Option<Sent>, i32)>,
    next_heartbeat: Instant,
    metadata_inflight: Option<RequestId>,
    metadata_retry_at: Instant,

    leave_kind: Option<LeaveKind>,
    last_poll: Instant,
    events: Events,
    next_id: u64,
}

impl ConsumerMember {
    /// A member of `config.group_id` subscribed to `topics`, with the member id this process generated
    /// (KIP-1082: it must stay the same for the life of the process).
    pub(crate) fn new(
        config: &GroupConfig,
        topics: impl IntoIterator<Item = String>,
        member_id: String,
        now: Instant,
    ) -> Result<Self, ConsumerError> {
        config.validate()?;
        let GroupProtocol::Consumer { server_assignor } = &config.protocol else {
            return Err(ConsumerError::InvalidConfig(
                "a consumer-protocol member needs GroupProtocol::Consumer".into(),
            ));
        };
        Ok(ConsumerMember {
            group_id: config.group_id.clone(),
            instance_id: config.group_instance_id.clone(),
            rack_id: config.rack_id.clone(),
            server_assignor: server_assignor.clone(),
            rebalance_timeout: config.max_poll_interval,
            retry_backoff: config.retry_backoff,
            topics: topics.into_iter().collect(),
            topic_names: BTreeMap::new(),
            phase: Phase::Joining,
            own_member_id: !member_id.is_empty(),
            member_id,
            member_epoch: 0,
            heartbeat_interval: config.heartbeat_interval,
            owned: BTreeMap::new(),
            target: None,
            reconciling: None,
            send_now: true,
            sent: None,
            coordinator: None,
            find_inflight: None,
            coordinator_retry_at: now,
            inflight: None,
            next_heartbeat: now,
            metadata_inflight: None,
            metadata_retry_at: now,
            leave_kind: None,
            last_poll: now,
            events: Events::default(),
            next_id: 0,
        })
    }

    // ---------------------------------------------------------------- application-facing

    /// The fencing token: this member's id at its current epoch, once it has joined (epoch > 0).
    pub(crate) fn group_metadata(&self) -> Option<GroupMetadata> {
        if self.member_epoch <= 0 || !matches!(self.phase, Phase::Stable | Phase::Leaving) {
            return None;
        }
        GroupMetadata::new(
            self.group_id.clone(),
            self.member_epoch,
            self.member_id.clone(),
            self.instance_id.clone(),
        )
        .ok()
    }

    /// The machine's view; the application's is the poll path's held set.
    #[cfg(test)]
    pub(crate) fn assignment(&self) -> BTreeSet<TopicPartition> {
        self.owned.values().cloned().collect()
    }

    pub(crate) fn poll_event(&mut self) -> Option<MemberEvent> {
        self.events.poll()
    }

    pub(crate) fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// The application finished handling the oldest outstanding `Revoke` or `Lost`.
    pub(crate) fn ack(&mut self, now: Instant) {
        if !self.events.ack() {
            tracing::warn!(group = %self.group_id, "revocation acknowledged twice");
        }
        if !self.events.blocking() {
            self.finish_reconciliation();
            // A target that arrived while the revocation was handled is reconciled now.
            self.reconcile(now);
        }
    }

    /// Records a poll. Returns whether the driver has something new to send (a member that had left
    /// for exceeding the poll interval rejoins); see the classic machine's `handle_poll`.
    pub(crate) fn handle_poll(&mut self, now: Instant) -> bool {
        self.last_poll = now;
        if self.phase == Phase::Dormant {
            self.rejoin();
            return true;
        }
        false
    }

    /// Changes the subscription; the next heartbeat carries it.
    pub(crate) fn subscribe(&mut self, topics: impl IntoIterator<Item = String>) {
        self.topics = topics.into_iter().collect();
        self.send_now = true;
    }

    /// Leaves: revokes everything (acknowledge as usual), then heartbeats with epoch -1 (or -2 for a
    /// static member, whose partitions then wait for it until its session times out).
    pub(crate) fn leave(&mut self) {
        if self.phase == Phase::Leaving && self.leave_kind == Some(LeaveKind::Rejoin) {
            // Leaving to rejoin, and now closing: the leave in progress ends the membership instead.
            self.leave_kind = Some(LeaveKind::Close);
            return;
        }
        if matches!(self.phase, Phase::Closed | Phase::Failed | Phase::Leaving) {
            return;
        }
        let was_member = self.member_epoch > 0 && self.phase == Phase::Stable;
        let held: Vec<TopicPartition> = std::mem::take(&mut self.owned).into_values().collect();
        self.events.push(MemberEvent::Revoke(held));
        self.target = None;
        self.reconciling = None;
        self.inflight = None;
        self.phase = if was_member {
            self.send_now = true;
            self.leave_kind = Some(LeaveKind::Close);
            Phase::Leaving
        } else {
            Phase::Closed
        };
    }

    pub(crate) fn is_closed(&self) -> bool {
        matches!(self.phase, Phase::Closed | Phase::Failed)
    }

    /// Gives up this membership and joins again as a new member, on the application's word (see the
    /// classic machine's `rejoin_as_new`): everything owned is reported [`LostReason::Rejoined`], the
    /// epoch drops to 0 at once (no commit carries the old one), and a joined member sends its leave
    /// heartbeat (epoch -1, or -2 when static) before it joins again at epoch 0, so the coordinator
    /// frees the old membership's partitions at once instead of after its session. The leave, and so
    /// the join, wait for the loss (and any revocation in progress) to be acknowledged. Does nothing on a member that is closing or closed.
    pub(crate) fn rejoin_as_new(&mut self, _now: Instant, reason: &str) {
        match self.phase {
            Phase::Closed | Phase::Failed | Phase::Leaving | Phase::Dormant => return,
            Phase::Joining | Phase::Stable => {}
        }
        tracing::info!(group = %self.group_id, member = %self.member_id, epoch = self.member_epoch, reason, "rejoining as a new member");
        let lost: Vec<TopicPartition> = std::mem::take(&mut self.owned).into_values().collect();
        self.events.push(MemberEvent::Lost {
            partitions: lost,
            reason: LostReason::Rejoined,
        });
        let joined = self.member_epoch > 0;
        self.target = None;
        self.reconciling = None;
        self.inflight = None;
        if joined {
            self.member_epoch = 0;
            self.phase = Phase::Leaving;
            self.leave_kind = Some(LeaveKind::Rejoin);
            self.send_now = true;
        } else {
            self.rejoin();
        }
    }

    // ---------------------------------------------------------------- driver-facing

    pub(crate) fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        self.handle_timeout(now);
        if matches!(self.phase, Phase::Closed | Phase::Failed | Phase::Dormant) {
            return None;
        }
        if let Some(t) = self.poll_metadata(now) {
            return Some(t);
        }
        let Some(node) = self.coordinator else {
            if self.find_inflight.is_none() && now >= self.coordinator_retry_at {
                let t = self.transmit(Destination::AnyBroker, Request::FindCoordinator);
                self.find_inflight = Some(t.id);
                return Some(t);
            }
            return None;
        };
        if self.inflight.is_some() {
            return None;
        }
        if self.phase == Phase::Leaving {
            // Closing or rejoining: the coordinator frees the partitions on the leave, so it waits for
            // the application to have let them go. A poll-interval expiry leaves at once.
            if self.leave_kind != Some(LeaveKind::PollTimeout) && self.events.blocking() {
                return None;
            }
            let epoch = if self.instance_id.is_some() {
                LEAVE_STATIC_EPOCH
            } else {
                LEAVE_EPOCH
            };
            let hb = ConsumerHeartbeat {
                member_id: self.member_id.clone(),
                member_epoch: epoch,
                instance_id: self.instance_id.clone(),
                rack_id: None,
                rebalance_timeout_ms: -1,
                subscribed_topic_names: None,
                server_assignor: None,
                owned: None,
            };
            let t = self.transmit(
                Destination::Coordinator(node),
                Request::ConsumerGroupHeartbeat(hb),
            );
            self.inflight = Some((t.id, None, epoch));
            return Some(t);
        }
        if self.phase == Phase::Joining && self.events.blocking() {
            // A fenced member rejoins only after its lost partitions are torn down.
            return None;
        }
        if !self.send_now && now < self.next_heartbeat {
            return None;
        }
        let hb = self.heartbeat();
        let sent = Sent {
            topics: self.topics.clone(),
            owned: self.owned.keys().copied().collect(),
        };
        let epoch = hb.member_epoch;
        let t = self.transmit(
            Destination::Coordinator(node),
            Request::ConsumerGroupHeartbeat(hb),
        );
        self.inflight = Some((t.id, Some(sent), epoch));
        self.send_now = false;
        self.next_heartbeat = now + self.heartbeat_interval;
        Some(t)
    }

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        if matches!(self.phase, Phase::Closed | Phase::Failed | Phase::Dormant) {
            return None;
        }
        let mut t = self.last_poll + self.rebalance_timeout;
        if self.coordinator.is_none() {
            if self.find_inflight.is_none() {
                t = t.min(self.coordinator_retry_at);
            }
        } else if self.inflight.is_none() {
            t = t.min(self.next_heartbeat);
        }
        if self.metadata_wanted() && self.metadata_inflight.is_none() {
            t = t.min(self.metadata_retry_at);
        }
        Some(t)
    }

    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        if !matches!(self.phase, Phase::Joining | Phase::Stable) {
            return;
        }
        if now >= self.last_poll + self.rebalance_timeout {
            tracing::warn!(group = %self.group_id, timeout = ?self.rebalance_timeout,
                "no poll within the max poll interval; leaving the group, partitions lost");
            let lost: Vec<TopicPartition> = std::mem::take(&mut self.owned).into_values().collect();
            self.events.push(MemberEvent::Lost {
                partitions: lost,
                reason: LostReason::PollIntervalExceeded,
            });
            let joined = self.member_epoch > 0;
            self.target = None;
            self.reconciling = None;
            self.inflight = None;
            if joined {
                // Leave now (Java does the same), so the group rebalances without waiting for the
                // session to expire; the member rejoins when the application polls again.
                self.phase = Phase::Leaving;
                self.send_now = true;
                self.member_epoch = 0;
                self.leave_kind = Some(LeaveKind::PollTimeout);
            } else {
                self.phase = Phase::Dormant;
            }
        }
    }

    pub(crate) fn handle_failure(&mut self, now: Instant, id: RequestId) {
        if self.find_inflight == Some(id) {
            self.find_inflight = None;
            self.coordinator_retry_at = now + self.retry_backoff;
        } else if self.metadata_inflight == Some(id) {
            self.metadata_inflight = None;
            self.metadata_retry_at = now + self.retry_backoff;
        } else if self.inflight.as_ref().map(|i| i.0) == Some(id) {
            let (_, _, epoch) = self.inflight.take().expect("checked");
            if epoch < 0 {
                self.after_leave();
            } else {
                self.coordinator_unknown(now);
            }
        }
    }

    pub(crate) fn handle_response(&mut self, now: Instant, id: RequestId, response: Response) {
        if self.find_inflight == Some(id) {
            self.find_inflight = None;
            if let Response::Coordinator { node } = response {
                self.coordinator = Some(node);
            }
            return;
        }
        if self.metadata_inflight == Some(id) {
            self.metadata_inflight = None;
            if let Response::Metadata { topics } = response {
                self.on_metadata(now, topics);
            }
            return;
        }
        let Some((hid, sent, epoch)) = self.inflight.clone() else {
            return;
        };
        if hid != id {
            return;
        }
        self.inflight = None;
        let Response::ConsumerGroupHeartbeat {
            error,
            message,
            member_id,
            member_epoch,
            heartbeat_interval_ms,
            assignment,
        } = response
        else {
            tracing::error!(?response, "response does not match ConsumerGroupHeartbeat");
            return self.handle_failure(now, id);
        };
        if epoch < 0 {
            if !error.is_ok() {
                tracing::info!(group = %self.group_id, %error, "leave heartbeat refused; the session will expire instead");
            }
            return self.after_leave();
        }
        match error {
            ErrorCode::None => {}
            ErrorCode::FencedMemberEpoch | ErrorCode::UnknownMemberId => {
                return self.fenced(error);
            }
            ErrorCode::CoordinatorNotAvailable | ErrorCode::NotCoordinator => {
                return self.coordinator_unknown(now);
            }
            ErrorCode::CoordinatorLoadInProgress => {
                self.sent = None;
                self.send_now = false;
                self.next_heartbeat = now + self.retry_backoff;
                return;
            }
            e if e.is_retriable() => {
                self.sent = None;
                self.next_heartbeat = now + self.retry_backoff;
                return;
            }
            e => return self.fail(e, message),
        }
        if let Some(id) = member_id.filter(|m| !m.is_empty()) {
            if id != self.member_id {
                if self.own_member_id {
                    tracing::warn!(ours = %self.member_id, theirs = %id, "coordinator renamed this member");
                }
                self.member_id = id;
            }
        }
        self.sent = sent;
        if member_epoch != self.member_epoch {
            tracing::debug!(group = %self.group_id, from = self.member_epoch, to = member_epoch, "member epoch");
        }
        self.member_epoch = member_epoch;
        if heartbeat_interval_ms > 0 {
            self.heartbeat_interval = Duration::from_millis(heartbeat_interval_ms as u64);
            self.next_heartbeat = now + self.heartbeat_interval;
        }
        if self.phase == Phase::Joining {
            self.phase = Phase::Stable;
        }
        if let Some(a) = assignment {
            self.target = Some(
                a.into_iter()
                    .flat_map(|(id, ps)| ps.into_iter().map(move |p| (id, p)))
                    .collect(),
            );
        }
        self.reconcile(now);
    }

    // ---------------------------------------------------------------- internals

    fn transmit(&mut self, to: Destination, request: Request) -> Transmit {
        self.next_id += 1;
        Transmit {
            id: RequestId(self.next_id),
            to,
            timeout: None,
            request,
        }
    }

    /// The heartbeat for the current state: full on join or after anything went wrong, otherwise only
    /// what changed since the coordinator last confirmed.
    fn heartbeat(&self) -> ConsumerHeartbeat {
        let full = self.member_epoch == 0 || self.sent.is_none();
        let sent = self.sent.as_ref();
        let owned: BTreeSet<(TopicId, i32)> = self.owned.keys().copied().collect();
        let owned_changed = full || sent.is_some_and(|s| s.owned != owned);
        let topics_changed = full || sent.is_some_and(|s| s.topics != self.topics);
        let mut by_topic: BTreeMap<TopicId, Vec<i32>> = BTreeMap::new();
        for (id, p) in &owned {
            by_topic.entry(*id).or_default().push(*p);
        }
        ConsumerHeartbeat {
            member_id: self.member_id.clone(),
            member_epoch: self.member_epoch,
            instance_id: if full { self.instance_id.clone() } else { None },
            rack_id: if full { self.rack_id.clone() } else { None },
            rebalance_timeout_ms: if full {
                millis_i32(self.rebalance_timeout)
            } else {
                -1
            },
            subscribed_topic_names: topics_changed.then(|| self.topics.iter().cloned().collect()),
            server_assignor: if full {
                self.server_assignor.clone()
            } else {
                None
            },
            owned: owned_changed.then_some(by_topic),
        }
    }

    /// Starts reconciling the latest target, unless a revocation is still being handled.
    fn reconcile(&mut self, now: Instant) {
        if self.phase != Phase::Stable || self.reconciling.is_some() || self.events.blocking() {
            return;
        }
        let Some(target) = self.target.take() else {
            return;
        };
        let unresolved: BTreeSet<TopicId> = target
            .iter()
            .map(|(id, _)| *id)
            .filter(|id| !self.topic_names.contains_key(id))
            .collect();
        if !unresolved.is_empty() {
            // Take what can be named now; keep the target so the rest is taken once Metadata names
            // them (Java reconciles the same way).
            self.target = Some(target.clone());
            if self.metadata_inflight.is_none() {
                self.metadata_retry_at = self.metadata_retry_at.max(now);
            }
        }
        let resolved: BTreeSet<(TopicId, i32)> = target
            .into_iter()
            .filter(|(id, _)| self.topic_names.contains_key(id))
            .collect();
        let current: BTreeSet<(TopicId, i32)> = self.owned.keys().copied().collect();
        if resolved == current {
            return;
        }
        let revoke: Vec<TopicPartition> = current
            .difference(&resolved)
            .map(|k| self.owned[k].clone())
            .collect();
        self.reconciling = Some(Reconciling { target: resolved });
        if revoke.is_empty() {
            self.finish_reconciliation();
        } else {
            self.events.push(MemberEvent::Revoke(revoke));
        }
    }

    /// The revocation (if any) is acknowledged: take the new partitions and acknowledge to the
    /// coordinator with the new owned set.
    fn finish_reconciliation(&mut self) {
        let Some(Reconciling { target }) = self.reconciling.take() else {
            return;
        };
        if self.phase != Phase::Stable {
            return;
        }
        let mut added = Vec::new();
        let mut next = BTreeMap::new();
        for key in target {
            let tp = match self.owned.remove(&key) {
                Some(tp) => tp,
                None => {
                    let tp = TopicPartition::new(self.topic_names[&key.0].clone(), key.1);
                    added.push(tp.clone());
                    tp
                }
            };
            next.insert(key, tp);
        }
        self.owned = next;
        self.events.push(MemberEvent::Assign(added));
        self.send_now = true;
    }

    fn metadata_wanted(&self) -> bool {
        self.target
            .as_ref()
            .is_some_and(|t| t.iter().any(|(id, _)| !self.topic_names.contains_key(id)))
    }

    fn poll_metadata(&mut self, now: Instant) -> Option<Transmit> {
        if !self.metadata_wanted()
            || self.metadata_inflight.is_some()
            || now < self.metadata_retry_at
        {
            return None;
        }
        let t = self.transmit(
            Destination::AnyBroker,
            Request::Metadata {
                topics: self.topics.iter().cloned().collect(),
            },
        );
        self.metadata_inflight = Some(t.id);
        Some(t)
    }

    fn on_metadata(&mut self, now: Instant, topics: Vec<TopicMetadata>) {
        for t in topics {
            if let Some(id) = t.id {
                self.topic_names.insert(id, Arc::from(t.name.as_str()));
            }
        }
        if self.metadata_wanted() {
            // The coordinator assigned a topic this broker cannot name yet (metadata propagation);
            // ask again shortly.
            self.metadata_retry_at = now + self.retry_backoff;
        }
        self.reconcile(now);
    }

    fn fenced(&mut self, code: ErrorCode) {
        tracing::warn!(group = %self.group_id, %code, epoch = self.member_epoch, "fenced; partitions lost, rejoining");
        let lost: Vec<TopicPartition> = std::mem::take(&mut self.owned).into_values().collect();
        self.events.push(MemberEvent::Lost {
            partitions: lost,
            reason: LostReason::Fenced(code),
        });
        self.rejoin();
    }

    fn rejoin(&mut self) {
        if !self.own_member_id {
            self.member_id.clear();
        }
        self.member_epoch = 0;
        self.target = None;
        self.reconciling = None;
        self.sent = None;
        self.send_now = true;
        self.phase = Phase::Joining;
    }

    fn after_leave(&mut self) {
        self.sent = None;
        match self.leave_kind.take() {
            Some(LeaveKind::PollTimeout) => self.phase = Phase::Dormant,
            Some(LeaveKind::Rejoin) => self.rejoin(),
            _ => self.phase = Phase::Closed,
        }
    }

    fn coordinator_unknown(&mut self, now: Instant) {
        if self.coordinator.take().is_some() {
            tracing::info!(group = %self.group_id, "group coordinator unknown; rediscovering");
        }
        self.coordinator_retry_at = now + self.retry_backoff;
        self.inflight = None;
        self.sent = None;
        self.send_now = true;
    }

    fn fail(&mut self, code: ErrorCode, message: Option<String>) {
        tracing::error!(group = %self.group_id, %code, ?message, "fatal group error");
        self.phase = Phase::Failed;
        self.inflight = None;
        self.events.push(MemberEvent::Fatal(Fatal {
            code,
            request: "ConsumerGroupHeartbeat",
            message,
        }));
    }
}

#[cfg(test)]
#[path = "kip848_tests.rs"]
mod tests;
