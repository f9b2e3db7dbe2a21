//! The poll path's half of group membership: runs the membership machine's events through the
//! application's [`RebalanceListener`], acknowledges revocations when their handlers finish, and
//! publishes the group metadata.
//!
//! The machine lives behind a mutex shared with the background task that sends heartbeats; the lock is
//! never held across an await. The background task keeps heartbeating while a handler runs (so the
//! member is not evicted for being slow to revoke, up to the rebalance timeout), but the machine will
//! not send the request that lets the group move on until [`PollPath::drive`] acknowledges.

use std::collections::BTreeSet;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::Notify;

use super::live::{GroupMetadataHandle, GroupMetadataPublisher};
use super::membership::classic::ClassicMember;
use super::membership::kip848::ConsumerMember;
use super::membership::{MemberEvent, RequestId, Response, Transmit};
use super::{ConsumerError, RebalanceListener, TopicPartition};
use crate::GroupMetadata;

/// Either membership machine, behind one interface.
#[derive(Debug)]
pub(crate) enum Member {
    Classic(ClassicMember),
    Consumer(ConsumerMember),
}

macro_rules! both {
    ($self:ident, $m:ident => $e:expr) => {
        match $self {
            Member::Classic($m) => $e,
            Member::Consumer($m) => $e,
        }
    };
}

impl Member {
    pub(crate) fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        both!(self, m => m.poll_transmit(now))
    }
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        both!(self, m => m.poll_timeout())
    }
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        both!(self, m => m.handle_timeout(now))
    }
    pub(crate) fn handle_response(&mut self, now: Instant, id: RequestId, response: Response) {
        both!(self, m => m.handle_response(now, id, response))
    }
    pub(crate) fn handle_failure(&mut self, now: Instant, id: RequestId) {
        both!(self, m => m.handle_failure(now, id))
    }
    pub(crate) fn poll_event(&mut self) -> Option<MemberEvent> {
        both!(self, m => m.poll_event())
    }
    /// Whether events wait for the poll path.
    pub(crate) fn has_events(&self) -> bool {
        both!(self, m => m.has_events())
    }
    pub(crate) fn ack(&mut self, now: Instant) {
        both!(self, m => m.ack(now))
    }
    /// Records a poll; true when the driver must be woken to act on it.
    pub(crate) fn handle_poll(&mut self, now: Instant) -> bool {
        both!(self, m => m.handle_poll(now))
    }
    pub(crate) fn subscribe(&mut self, topics: impl IntoIterator<Item = String>) {
        both!(self, m => m.subscribe(topics))
    }
    pub(crate) fn leave(&mut self) {
        both!(self, m => m.leave())
    }
    /// Gives the membership up and joins again as a new member (see the machines' `rejoin_as_new`).
    pub(crate) fn rejoin_as_new(&mut self, now: Instant, reason: &str) {
        both!(self, m => m.rejoin_as_new(now, reason))
    }
    pub(crate) fn is_closed(&self) -> bool {
        both!(self, m => m.is_closed())
    }
    pub(crate) fn group_metadata(&self) -> Option<GroupMetadata> {
        both!(self, m => m.group_metadata())
    }
    /// The machine's view; the application's is the poll path's held set.
    #[cfg(test)]
    pub(crate) fn assignment(&self) -> BTreeSet<TopicPartition> {
        match self {
            Member::Classic(m) => m.assignment().clone(),
            Member::Consumer(m) => m.assignment(),
        }
    }
}

/// The machine and the wake-up for the task that drives its I/O.
#[derive(Debug)]
pub(crate) struct Shared {
    member: Mutex<Member>,
    /// Signalled whenever the poll path changed something the driver must act on (an
    /// acknowledgement, a poll after a poll-interval expiry, a leave).
    pub(crate) wake: Notify,
    /// Signalled by the driver when the machine has something for the poll path (a completed join, a
    /// pending revocation, a fatal error) or closed, so a poll waiting with nothing to fetch notices it
    /// without sleeping out its timeout. Never on a pass that changed nothing the application sees.
    pub(crate) app_wake: Notify,
    /// How the driver task died, once it has: set by its supervisor (a panic or a cancellation), read by
    /// every later poll, which fails with [`ConsumerError::TaskFailed`] instead of waiting for a driver
    /// that is gone.
    driver_failure: std::sync::OnceLock<crate::supervise::Failure>,
    /// How many passes the driver loop made: an idle member must make few.
    #[cfg(test)]
    pub(crate) driver_passes: std::sync::atomic::AtomicU64,
    /// Points inside the driver and its request tasks that a test can make panic.
    #[cfg(test)]
    pub(crate) faults: crate::supervise::Faults,
}

impl Shared {
    pub(crate) fn new(member: Member) -> Self {
        Shared {
            member: Mutex::new(member),
            wake: Notify::new(),
            app_wake: Notify::new(),
            driver_failure: std::sync::OnceLock::new(),
            #[cfg(test)]
            driver_passes: std::sync::atomic::AtomicU64::new(0),
            #[cfg(test)]
            faults: crate::supervise::Faults::default(),
        }
    }

    /// Records that the driver task died and wakes a poll waiting on it.
    pub(crate) fn driver_failed(&self, failure: crate::supervise::Failure) {
        tracing::error!(%failure, "group membership task died");
        let _ = self.driver_failure.set(failure);
        self.app_wake.notify_one();
    }

    /// The error every poll returns once the driver task has died.
    pub(crate) fn driver_error(&self) -> Option<ConsumerError> {
        self.driver_failure
            .get()
            .map(|failure| ConsumerError::TaskFailed {
                task: "group membership".into(),
                failure: failure.to_string(),
            })
    }

    /// Locks the machine. A panic while holding the lock cannot leave it half-updated in a way that
    /// matters more than stopping, so a poisoned lock is taken over rather than propagated.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Member> {
        self.member.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The current instant on tokio's clock (so tests with a paused clock drive the machines too): the
/// crate's one clock, under the name the consumer's drivers call it by.
pub(crate) use crate::clock::now;

/// The poll path's state: the handler in progress (so a dropped `poll` resumes it) and the publisher.
#[derive(Debug)]
pub(crate) struct PollPath {
    group_id: String,
    /// What the application holds: partitions whose assign handler ran and whose revoke or lost
    /// handler has not. Lags the machine on purpose: nothing is fetched for a partition before the
    /// application was told it has it, and until its revocation is handled it still has it.
    held: BTreeSet<TopicPartition>,
    in_progress: Option<MemberEvent>,
    fatal: Option<super::membership::Fatal>,
    publisher: GroupMetadataPublisher,
    /// Since when the application has held no partition (`None` while it holds some), for the
    /// time-without-assignment metric.
    unassigned_since: Option<Instant>,
}

impl PollPath {
    pub(crate) fn new(group_id: &str) -> (Self, GroupMetadataHandle) {
        let (publisher, handle) = GroupMetadataPublisher::new(group_id);
        (
            PollPath {
                group_id: group_id.to_string(),
                held: BTreeSet::new(),
                in_progress: None,
                fatal: None,
                publisher,
                unassigned_since: Some(now()),
            },
            handle,
        )
    }

    pub(crate) fn handle(&self) -> GroupMetadataHandle {
        self.publisher.handle(&self.group_id)
    }

    /// The partitions the application holds (see the field).
    pub(crate) fn held(&self) -> &BTreeSet<TopicPartition> {
        &self.held
    }

    /// Marks the member alive, runs every pending rebalance event through `listener` in order,
    /// acknowledging each revocation or loss once its handler completes, and publishes the group
    /// metadata before each handler and at the end.
    ///
    /// Not cancel-safe in the strict sense: if dropped while a handler runs, that handler runs again
    /// (with the same partitions) on the next call; nothing is lost and nothing is acknowledged early.
    pub(crate) async fn drive<L: RebalanceListener>(
        &mut self,
        shared: &Shared,
        listener: &mut L,
    ) -> Result<(), ConsumerError> {
        if let Some(f) = &self.fatal {
            return Err(self.fatal_error(f.clone()));
        }
        // Waking the driver on every poll made an idle member spin: the driver's pass woke the poll
        // waiting for a join, whose next pass woke the driver. Only a poll that changed what the driver
        // must send wakes it.
        if shared.lock().handle_poll(now()) {
            shared.wake.notify_one();
        }
        loop {
            let event = match self.in_progress.clone() {
                Some(e) => e,
                None => {
                    let mut m = shared.lock();
                    // Published before each handler: under the cooperative protocol a revoke handler
                    // runs after the member moved to the new generation, and its final commit must
                    // carry that generation to be accepted.
                    self.publisher.publish(m.group_metadata());
                    match m.poll_event() {
                        Some(e) => e,
                        None => break,
                    }
                }
            };
            self.in_progress = Some(event.clone());
            match event {
                MemberEvent::Revoke(partitions) => {
                    listener.on_partitions_revoked(&partitions).await;
                    self.release(&partitions);
                    self.handled("revoke");
                    self.acknowledge(shared);
                }
                MemberEvent::Lost { partitions, reason } => {
                    listener.on_partitions_lost(&partitions, reason).await;
                    self.release(&partitions);
                    self.handled("lost");
                    self.acknowledge(shared);
                }
                MemberEvent::Assign(partitions) => {
                    listener.on_partitions_assigned(&partitions).await;
                    self.held.extend(partitions);
                    self.handled("assign");
                    self.in_progress = None;
                }
                MemberEvent::Fatal(f) => {
                    self.in_progress = None;
                    self.fatal = Some(f.clone());
                    return Err(self.fatal_error(f));
                }
            }
        }
        Ok(())
    }

    /// Publishes the member's current group metadata at the end of a poll, unless rebalance events
    /// are waiting: then the next poll publishes it just before handing them to the listener, so that
    /// between polls the published generation and the held partitions always belong together (an
    /// eager member never shows the new generation with the old, already revoked, assignment).
    pub(crate) fn publish(&self, shared: &Shared) {
        let m = shared.lock();
        if !m.has_events() {
            self.publisher.publish(m.group_metadata());
        }
    }

    /// Records a handled rebalance event, and the start or end of a time without partitions.
    fn handled(&mut self, event: &'static str) {
        crate::telemetry::rebalance_event(&self.group_id, event, self.held.len());
        match (self.held.is_empty(), self.unassigned_since) {
            (true, None) => self.unassigned_since = Some(now()),
            (false, Some(since)) => {
                self.unassigned_since = None;
                crate::telemetry::assigned_after(
                    &self.group_id,
                    now().saturating_duration_since(since),
                );
            }
            _ => {}
        }
    }

    /// Withdraws the published group metadata at once (the member gave its membership up to rejoin):
    /// no commit may carry the old generation or epoch, even before the next poll.
    pub(crate) fn withdraw(&self) {
        self.publisher.publish(None);
    }

    fn release(&mut self, partitions: &[TopicPartition]) {
        for p in partitions {
            self.held.remove(p);
        }
    }

    fn acknowledge(&mut self, shared: &Shared) {
        self.in_progress = None;
        shared.lock().ack(now());
        shared.wake.notify_one();
    }

    fn fatal_error(&self, f: super::membership::Fatal) -> ConsumerError {
        ConsumerError::GroupFatal {
            group: self.group_id.clone(),
            code: f.code,
            request: f.request,
            message: f.message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consumer::assignor::Assignor;
    use crate::consumer::membership::{Destination, Request};
    use crate::consumer::protocol::Assignment;
    use crate::consumer::{GroupConfig, GroupProtocol, LostReason};
    use crate::wire::ErrorCode;
    use std::sync::Arc;
    use std::time::Duration;

    /// Plays the coordinator for one member: answers each request with a scripted response.
    fn answer(
        shared: &Shared,
        script: &mut dyn FnMut(&Request) -> Option<Response>,
    ) -> Vec<&'static str> {
        let mut sent = Vec::new();
        loop {
            let t = {
                let mut m = shared.lock();
                match m.poll_transmit(now()) {
                    Some(t) => t,
                    None => return sent,
                }
            };
            sent.push(t.request.name());
            if let Some(r) = script(&t.request) {
                shared.lock().handle_response(now(), t.id, r);
            }
        }
    }

    fn classic(assignors: Vec<Assignor>) -> Arc<Shared> {
        let mut c = GroupConfig::new("g");
        c.protocol = GroupProtocol::Classic { assignors };
        c.session_timeout = Duration::from_secs(10);
        c.heartbeat_interval = Duration::from_secs(1);
        c.max_poll_interval = Duration::from_secs(30);
        Arc::new(Shared::new(Member::Classic(
            ClassicMember::new(&c, ["t".to_string()], now()).unwrap(),
        )))
    }

    fn assignment(ps: &[i32]) -> bytes::Bytes {
        Assignment {
            assigned_partitions: vec![crate::consumer::protocol::TopicPartitions {
                topic: "t".into(),
                partitions: ps.to_vec(),
            }],
            user_data: None,
        }
        .encode(3)
    }

    /// A coordinator script: joins as a follower at `generation` with `ps`.
    fn coordinator(
        generation: i32,
        ps: &'static [i32],
        protocol: &'static str,
    ) -> impl FnMut(&Request) -> Option<Response> {
        move |r| match r {
            Request::FindCoordinator => Some(Response::Coordinator { node: 1 }),
            Request::JoinGroup { .. } => Some(Response::JoinGroup {
                skip_assignment: false,
                error: ErrorCode::None,
                generation_id: generation,
                protocol_name: Some(protocol.into()),
                leader: "other".into(),
                member_id: "me".into(),
                members: vec![],
            }),
            Request::SyncGroup { .. } => Some(Response::SyncGroup {
                error: ErrorCode::None,
                protocol_name: Some(protocol.into()),
                assignment: assignment(ps),
            }),
            Request::Heartbeat { .. } => Some(Response::Heartbeat {
                error: ErrorCode::RebalanceInProgress,
            }),
            _ => None,
        }
    }

    #[derive(Default)]
    struct Recorder {
        calls: Vec<String>,
        shared: Option<Arc<Shared>>,
        handle: Option<GroupMetadataHandle>,
        /// Requests the machine wanted to send while the revoke handler ran.
        sent_during_revoke: Vec<&'static str>,
        generation_seen_in_revoke: Option<i32>,
    }

    impl RebalanceListener for Recorder {
        async fn on_partitions_revoked(&mut self, partitions: &[TopicPartition]) {
            self.calls.push(format!("revoke {partitions:?}"));
            self.generation_seen_in_revoke = self
                .handle
                .as_ref()
                .and_then(|h| h.current())
                .map(|g| g.generation_id());
            // The handler takes a while; meanwhile the background keeps the member alive.
            let shared = self.shared.clone().unwrap();
            for _ in 0..3 {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let sent = answer(&shared, &mut |r| match r {
                    Request::Heartbeat { .. } => Some(Response::Heartbeat {
                        error: ErrorCode::RebalanceInProgress,
                    }),
                    _ => None,
                });
                self.sent_during_revoke.extend(sent);
            }
        }
        async fn on_partitions_assigned(&mut self, partitions: &[TopicPartition]) {
            self.calls.push(format!("assign {partitions:?}"));
        }
        async fn on_partitions_lost(&mut self, partitions: &[TopicPartition], reason: LostReason) {
            self.calls.push(format!("lost {partitions:?} {reason:?}"));
        }
    }

    /// Eager: while the revoke handler runs, the member heartbeats but never sends JoinGroup; the
    /// JoinGroup goes out only after `drive` has awaited the handler.
    #[tokio::test(start_paused = true)]
    async fn eager_join_waits_for_the_revoke_handler() {
        let shared = classic(vec![Assignor::Range]);
        let (mut path, handle) = PollPath::new("g");
        let mut l = Recorder {
            shared: Some(shared.clone()),
            handle: Some(handle.clone()),
            ..Default::default()
        };
        answer(&shared, &mut coordinator(1, &[0, 1], "range"));
        path.drive(&shared, &mut l).await.unwrap();
        assert_eq!(
            l.calls,
            vec![
                r#"assign [TopicPartition { topic: "t", partition: 0 }, TopicPartition { topic: "t", partition: 1 }]"#
            ]
        );
        assert_eq!(
            handle.current().unwrap().generation_id(),
            1,
            "published after the poll"
        );

        // A rebalance starts: the heartbeat says so.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let sent = answer(&shared, &mut coordinator(2, &[0], "range"));
        assert_eq!(
            sent,
            vec!["Heartbeat"],
            "no JoinGroup before the revoke handler"
        );

        path.drive(&shared, &mut l).await.unwrap();
        assert!(l.calls[1].starts_with("revoke"), "{:?}", l.calls);
        assert!(
            !l.sent_during_revoke.is_empty(),
            "heartbeats continued during the handler"
        );
        assert!(
            l.sent_during_revoke.iter().all(|r| *r == "Heartbeat"),
            "{:?}",
            l.sent_during_revoke
        );
        assert_eq!(l.generation_seen_in_revoke, Some(1));

        let sent = answer(&shared, &mut coordinator(2, &[0], "range"));
        assert_eq!(
            sent[0], "JoinGroup",
            "the join goes out once the handler returned"
        );
        path.drive(&shared, &mut l).await.unwrap();
        assert!(l.calls[2].starts_with("assign"));
        assert_eq!(handle.current().unwrap().generation_id(), 2);
    }

    /// Cooperative: the revoke handler already sees the new generation published (its final commit is
    /// accepted), and the follow-up JoinGroup waits for the handler.
    #[tokio::test(start_paused = true)]
    async fn cooperative_publishes_new_generation_before_revoke_handler() {
        let shared = classic(vec![Assignor::CooperativeSticky]);
        let (mut path, handle) = PollPath::new("g");
        let mut l = Recorder {
            shared: Some(shared.clone()),
            handle: Some(handle.clone()),
            ..Default::default()
        };
        answer(&shared, &mut coordinator(1, &[0, 1], "cooperative-sticky"));
        path.drive(&shared, &mut l).await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        // Heartbeat → REBALANCE_IN_PROGRESS → JoinGroup (cooperative keeps partitions) → SyncGroup
        // at generation 2 without partition 1.
        let sent = answer(&shared, &mut coordinator(2, &[0], "cooperative-sticky"));
        assert_eq!(sent, vec!["Heartbeat", "JoinGroup", "SyncGroup"]);
        path.drive(&shared, &mut l).await.unwrap();
        assert!(
            l.calls[1].contains("revoke") && l.calls[1].contains("partition: 1"),
            "{:?}",
            l.calls
        );
        assert_eq!(l.generation_seen_in_revoke, Some(2));
        assert!(
            !l.sent_during_revoke.contains(&"JoinGroup"),
            "{:?}",
            l.sent_during_revoke
        );
        let sent = answer(&shared, &mut coordinator(3, &[0], "cooperative-sticky"));
        assert!(
            sent.contains(&"JoinGroup"),
            "follow-up round after the handler: {sent:?}"
        );
    }

    /// The group's metrics follow the handlers: each event handed to the listener is counted by kind,
    /// the held partitions are a gauge, every new generation is counted once, and a time without
    /// partitions (from subscribing, or from the revoke that gave the last one back) is recorded when
    /// the next assignment arrives.
    #[test]
    fn rebalance_metrics_follow_the_handlers() {
        use crate::telemetry::recording::Recording;
        use crate::telemetry::{ASSIGNED_PARTITIONS, GENERATION_CHANGES, REBALANCES, UNASSIGNED};
        let rec = Recording::default();
        rec.run(async {
            tokio::time::pause();
            let shared = classic(vec![Assignor::Range]);
            let (mut path, _handle) = PollPath::new("g");
            let mut l = Recorder {
                shared: Some(shared.clone()),
                ..Default::default()
            };
            tokio::time::sleep(Duration::from_secs(2)).await;
            answer(&shared, &mut coordinator(1, &[0, 1], "range"));
            path.drive(&shared, &mut l).await.unwrap();
            tokio::time::sleep(Duration::from_secs(1)).await;
            answer(&shared, &mut coordinator(2, &[0], "range"));
            // The revoke handler takes 3 s, the member holds nothing after it, and the join answered
            // right after hands it partition 0 back.
            path.drive(&shared, &mut l).await.unwrap();
            tokio::time::sleep(Duration::from_millis(500)).await;
            answer(&shared, &mut coordinator(2, &[0], "range"));
            path.drive(&shared, &mut l).await.unwrap();
        });
        let g = [("group", "g")];
        let event = |e| rec.counter(REBALANCES.name, &[("group", "g"), ("event", e)]);
        assert_eq!((event("assign"), event("revoke"), event("lost")), (2, 1, 0));
        assert_eq!(rec.gauge_at(ASSIGNED_PARTITIONS.name, &g), 1.0);
        assert_eq!(rec.counter(GENERATION_CHANGES.name, &g), 2);
        // The timer wheel rounds each sleep up to its next millisecond.
        let took = rec.samples(UNASSIGNED.name, &g);
        assert_eq!(took.len(), 2, "{took:?}");
        assert!(
            (2.0..2.01).contains(&took[0]) && (0.5..0.51).contains(&took[1]),
            "2 s before the first join, 0.5 s between the revoke and the next assignment: {took:?}"
        );
    }

    /// A `poll` dropped mid-handler re-runs the handler on the next poll and acknowledges only then.
    #[tokio::test(start_paused = true)]
    async fn dropped_poll_reruns_the_handler() {
        let shared = classic(vec![Assignor::Range]);
        let (mut path, _handle) = PollPath::new("g");
        let mut l = Recorder {
            shared: Some(shared.clone()),
            ..Default::default()
        };
        answer(&shared, &mut coordinator(1, &[0], "range"));
        path.drive(&shared, &mut l).await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        answer(&shared, &mut coordinator(2, &[0], "range"));
        // Cancel the poll half-way through the revoke handler.
        let r =
            tokio::time::timeout(Duration::from_millis(1500), path.drive(&shared, &mut l)).await;
        assert!(r.is_err(), "the handler was still running");
        let sent = answer(&shared, &mut |_| None);
        assert!(!sent.contains(&"JoinGroup"), "not acknowledged: {sent:?}");
        path.drive(&shared, &mut l).await.unwrap();
        let revokes = l.calls.iter().filter(|c| c.starts_with("revoke")).count();
        assert_eq!(revokes, 2, "{:?}", l.calls);
        let sent = answer(&shared, &mut coordinator(2, &[0], "range"));
        assert_eq!(sent[0], "JoinGroup");
    }

    /// The held set follows the handlers, not the machine: a partition the machine already assigned
    /// is not held until its assign handler ran, and a revoked one stays held until its revoke
    /// handler returned.
    #[tokio::test(start_paused = true)]
    async fn held_follows_the_handlers() {
        let shared = classic(vec![Assignor::Range]);
        let (mut path, _h) = PollPath::new("g");
        let mut l = Recorder {
            shared: Some(shared.clone()),
            ..Default::default()
        };
        answer(&shared, &mut coordinator(1, &[0, 1], "range"));
        assert_eq!(shared.lock().assignment().len(), 2, "the machine knows");
        assert!(path.held().is_empty(), "the application was not told yet");
        path.drive(&shared, &mut l).await.unwrap();
        assert_eq!(path.held().len(), 2);
        tokio::time::sleep(Duration::from_secs(1)).await;
        answer(&shared, &mut coordinator(2, &[0], "range"));
        assert!(
            shared.lock().assignment().is_empty(),
            "eager: the machine gave everything back"
        );
        assert_eq!(
            path.held().len(),
            2,
            "still held until the revoke handler ran"
        );
        path.drive(&shared, &mut l).await.unwrap();
        assert!(path.held().is_empty());
    }

    /// A fatal group error surfaces from every later poll.
    #[tokio::test(start_paused = true)]
    async fn fatal_is_sticky() {
        let shared = classic(vec![Assignor::Range]);
        let (mut path, _h) = PollPath::new("g");
        answer(&shared, &mut |r| match r {
            Request::FindCoordinator => Some(Response::Coordinator { node: 1 }),
            Request::JoinGroup { .. } => Some(Response::JoinGroup {
                skip_assignment: false,
                error: ErrorCode::GroupAuthorizationFailed,
                generation_id: -1,
                protocol_name: None,
                leader: String::new(),
                member_id: String::new(),
                members: vec![],
            }),
            _ => None,
        });
        for _ in 0..2 {
            let e = path.drive(&shared, &mut ()).await.unwrap_err();
            assert!(
                matches!(
                    e,
                    ConsumerError::GroupFatal {
                        code: ErrorCode::GroupAuthorizationFailed,
                        ..
                    }
                ),
                "{e:?}"
            );
        }
    }

    /// Only coordinator discovery goes to any broker; once the coordinator is known, group requests go
    /// to it.
    #[test]
    fn destination_is_coordinator_after_discovery() {
        let shared = classic(vec![Assignor::Range]);
        let t = shared.lock().poll_transmit(now()).unwrap();
        assert_eq!(t.to, Destination::AnyBroker);
        shared
            .lock()
            .handle_response(now(), t.id, Response::Coordinator { node: 4 });
        let t = shared.lock().poll_transmit(now()).unwrap();
        assert_eq!(t.to, Destination::Coordinator(4));
    }
}
