//! Scripted-response tests of the classic member: every coordinator answer is written out by the test.

use super::*;
use crate::consumer::membership::TopicMetadata;

const COORD: i32 = 7;

fn config(assignors: Vec<Assignor>) -> GroupConfig {
    let mut c = GroupConfig::new("g");
    c.protocol = GroupProtocol::Classic { assignors };
    c.session_timeout = Duration::from_secs(10);
    c.heartbeat_interval = Duration::from_secs(1);
    c.max_poll_interval = Duration::from_secs(30);
    c.retry_backoff = Duration::from_millis(100);
    c.metadata_max_age = Duration::from_secs(60);
    c
}

fn tp(t: &str, p: i32) -> TopicPartition {
    TopicPartition::new(t, p)
}

fn tps(t: &str, ps: &[i32]) -> Vec<TopicPartition> {
    ps.iter().map(|p| tp(t, *p)).collect()
}

fn assignment_bytes(parts: &[TopicPartition]) -> Bytes {
    Assignment {
        assigned_partitions: by_topic(&parts.iter().cloned().collect()),
        user_data: None,
    }
    .encode(3)
}

struct H {
    m: ClassicMember,
    now: Instant,
}

impl H {
    fn new(config: GroupConfig) -> H {
        let now = Instant::now();
        H {
            m: ClassicMember::new(&config, ["t".to_string()], now).unwrap(),
            now,
        }
    }

    fn tx(&mut self) -> Option<Transmit> {
        self.m.poll_transmit(self.now)
    }

    #[track_caller]
    fn expect(&mut self, name: &str) -> Transmit {
        let t = self
            .tx()
            .unwrap_or_else(|| panic!("expected {name}, nothing to send"));
        assert_eq!(t.request.name(), name, "{t:?}");
        t
    }

    #[track_caller]
    fn nothing(&mut self) {
        if let Some(t) = self.tx() {
            panic!("expected nothing to send, got {t:?}");
        }
    }

    fn reply(&mut self, t: &Transmit, r: Response) {
        self.m.handle_response(self.now, t.id, r);
    }

    fn advance(&mut self, d: Duration) {
        self.now += d;
        self.m.handle_timeout(self.now);
    }

    /// Advances time, polling as a live application does.
    fn advance_polling(&mut self, d: Duration) {
        self.now += d;
        self.m.handle_poll(self.now);
        self.m.handle_timeout(self.now);
    }

    fn events(&mut self) -> Vec<MemberEvent> {
        std::iter::from_fn(|| self.m.poll_event()).collect()
    }

    fn find_coordinator(&mut self) {
        let t = self.expect("FindCoordinator");
        assert_eq!(t.to, Destination::AnyBroker);
        self.reply(&t, Response::Coordinator { node: COORD });
    }

    fn join_response(error: ErrorCode, generation: i32, leader: &str, member: &str) -> Response {
        Response::JoinGroup {
            skip_assignment: false,
            error,
            generation_id: generation,
            protocol_name: Some("cooperative-sticky".into()),
            leader: leader.into(),
            member_id: member.into(),
            members: vec![],
        }
    }

    /// Joins as a follower at `generation` and syncs to `assigned`; returns the JoinGroup sent.
    fn join_as_follower(&mut self, generation: i32, assigned: &[TopicPartition]) -> Transmit {
        let join = self.expect("JoinGroup");
        let protocol = match &join.request {
            Request::JoinGroup { protocols, .. } => protocols[0].0.clone(),
            _ => unreachable!(),
        };
        self.reply(
            &join,
            Response::JoinGroup {
                skip_assignment: false,
                error: ErrorCode::None,
                generation_id: generation,
                protocol_name: Some(protocol.clone()),
                leader: "someone-else".into(),
                member_id: "m-1".into(),
                members: vec![],
            },
        );
        let sync = self.expect("SyncGroup");
        match &sync.request {
            Request::SyncGroup {
                generation_id,
                member_id,
                assignments,
                ..
            } => {
                assert_eq!(*generation_id, generation);
                assert_eq!(member_id, "m-1");
                assert!(assignments.is_empty(), "a follower sends no assignments");
            }
            _ => unreachable!(),
        }
        self.reply(
            &sync,
            Response::SyncGroup {
                error: ErrorCode::None,
                protocol_name: Some(protocol),
                assignment: assignment_bytes(assigned),
            },
        );
        join
    }

    fn join_subscription(t: &Transmit) -> Subscription {
        match &t.request {
            Request::JoinGroup { protocols, .. } => {
                Subscription::decode(protocols[0].1.clone()).unwrap()
            }
            other => panic!("not a JoinGroup: {other:?}"),
        }
    }

    fn heartbeat_reply(&mut self, error: ErrorCode) -> Transmit {
        let hb = self.expect("Heartbeat");
        self.reply(&hb, Response::Heartbeat { error });
        hb
    }
}

/// The full first join as leader: coordinator, MEMBER_ID_REQUIRED retry, metadata, assignment, sync.
#[test]
fn first_join_as_leader() {
    let mut h = H::new(config(vec![Assignor::Range]));
    assert_eq!(h.m.group_metadata(), None, "no token before the first join");
    h.find_coordinator();

    let join = h.expect("JoinGroup");
    assert_eq!(join.to, Destination::Coordinator(COORD));
    assert!(
        join.timeout.unwrap() > Duration::from_secs(30),
        "JoinGroup outlives the rebalance timeout"
    );
    match &join.request {
        Request::JoinGroup {
            member_id,
            protocols,
            rebalance_timeout_ms,
            session_timeout_ms,
            ..
        } => {
            assert_eq!(member_id, "");
            assert_eq!(protocols[0].0, "range");
            assert_eq!(*rebalance_timeout_ms, 30_000);
            assert_eq!(*session_timeout_ms, 10_000);
        }
        _ => unreachable!(),
    }
    let metadata = match &join.request {
        Request::JoinGroup { protocols, .. } => protocols[0].1.clone(),
        _ => unreachable!(),
    };
    h.reply(
        &join,
        H::join_response(ErrorCode::MemberIdRequired, -1, "", "m-1"),
    );

    let join2 = h.expect("JoinGroup");
    match &join2.request {
        Request::JoinGroup { member_id, .. } => assert_eq!(member_id, "m-1"),
        _ => unreachable!(),
    }
    h.reply(
        &join2,
        Response::JoinGroup {
            skip_assignment: false,
            error: ErrorCode::None,
            generation_id: 1,
            protocol_name: Some("range".into()),
            leader: "m-1".into(),
            member_id: "m-1".into(),
            members: vec![
                JoinedMember {
                    member_id: "m-1".into(),
                    group_instance_id: None,
                    metadata: metadata.clone(),
                },
                JoinedMember {
                    member_id: "m-2".into(),
                    group_instance_id: None,
                    metadata,
                },
            ],
        },
    );
    let md = h.expect("Metadata");
    assert_eq!(
        md.request,
        Request::Metadata {
            topics: vec!["t".into()]
        }
    );
    h.reply(
        &md,
        Response::Metadata {
            topics: vec![TopicMetadata {
                name: "t".into(),
                id: None,
                partitions: Some(4),
            }],
        },
    );
    let sync = h.expect("SyncGroup");
    let mine = match &sync.request {
        Request::SyncGroup {
            assignments,
            generation_id,
            ..
        } => {
            assert_eq!(*generation_id, 1);
            assert_eq!(assignments.len(), 2);
            let get = |m: &str| {
                Assignment::decode(assignments.iter().find(|a| a.0 == m).unwrap().1.clone())
                    .unwrap()
            };
            assert_eq!(get("m-2").assigned_partitions[0].partitions, vec![2, 3]);
            assignments.iter().find(|a| a.0 == "m-1").unwrap().1.clone()
        }
        _ => unreachable!(),
    };
    assert_eq!(
        h.m.group_metadata(),
        None,
        "not a member of generation 1 until SyncGroup completes"
    );
    h.reply(
        &sync,
        Response::SyncGroup {
            error: ErrorCode::None,
            protocol_name: Some("range".into()),
            assignment: mine,
        },
    );
    assert_eq!(h.events(), vec![MemberEvent::Assign(tps("t", &[0, 1]))]);
    let gm = h.m.group_metadata().unwrap();
    assert_eq!((gm.generation_id(), gm.member_id()), (1, "m-1"));
    assert_eq!(h.m.assignment(), &tps("t", &[0, 1]).into_iter().collect());

    // Heartbeats start one interval later, at the new generation.
    h.nothing();
    h.advance_polling(Duration::from_secs(1));
    let hb = h.expect("Heartbeat");
    assert_eq!(
        hb.request,
        Request::Heartbeat {
            generation_id: 1,
            member_id: "m-1".into(),
            group_instance_id: None
        }
    );
}

/// Eager: the member revokes everything and sends JoinGroup only once the revocation is
/// acknowledged; it keeps heartbeating at its generation meanwhile.
#[test]
fn eager_revokes_before_rejoining() {
    let mut h = H::new(config(vec![Assignor::Range]));
    h.find_coordinator();
    h.join_as_follower(1, &tps("t", &[0, 1]));
    assert_eq!(h.events(), vec![MemberEvent::Assign(tps("t", &[0, 1]))]);

    h.advance_polling(Duration::from_secs(1));
    h.heartbeat_reply(ErrorCode::RebalanceInProgress);
    h.nothing();
    assert_eq!(h.events(), vec![MemberEvent::Revoke(tps("t", &[0, 1]))]);
    // The revoke handler runs for a while: no JoinGroup, but heartbeats at generation 1 go on.
    for _ in 0..3 {
        h.advance_polling(Duration::from_secs(1));
        let hb = h.heartbeat_reply(ErrorCode::RebalanceInProgress);
        assert!(matches!(
            hb.request,
            Request::Heartbeat {
                generation_id: 1,
                ..
            }
        ));
        h.nothing();
    }
    assert_eq!(
        h.m.group_metadata().unwrap().generation_id(),
        1,
        "still the generation-1 member while revoking"
    );
    h.m.ack(h.now);
    let join = h.expect("JoinGroup");
    let sub = H::join_subscription(&join);
    assert!(
        sub.owned_partitions.is_empty(),
        "eager members claim nothing"
    );
    assert_eq!(sub.generation_id, 1);
}

/// Cooperative: keeps its partitions through the join, revokes only what the assignment leaves out,
/// and sends the follow-up JoinGroup only after that revocation is acknowledged.
#[test]
fn cooperative_revokes_after_sync_and_rejoins_after_ack() {
    let mut h = H::new(config(vec![Assignor::CooperativeSticky]));
    h.find_coordinator();
    h.join_as_follower(1, &tps("t", &[0, 1, 2, 3]));
    h.events();

    h.advance_polling(Duration::from_secs(1));
    h.heartbeat_reply(ErrorCode::RebalanceInProgress);
    assert_eq!(
        h.events(),
        vec![],
        "cooperative members revoke nothing up front"
    );
    let join = h.join_as_follower(2, &tps("t", &[0, 1]));
    let sub = H::join_subscription(&join);
    assert_eq!(sub.owned_partitions[0].partitions, vec![0, 1, 2, 3]);
    assert_eq!(sub.generation_id, 1);

    assert_eq!(h.events(), vec![MemberEvent::Revoke(tps("t", &[2, 3]))]);
    // The member is at generation 2 already (the group moved on at SyncGroup), so a commit made by the
    // revoke handler with the freshly published token is accepted.
    assert_eq!(h.m.group_metadata().unwrap().generation_id(), 2);
    h.advance_polling(Duration::from_secs(1));
    h.heartbeat_reply(ErrorCode::None);
    h.nothing();
    h.m.ack(h.now);
    let join = h.expect("JoinGroup");
    let sub = H::join_subscription(&join);
    assert_eq!(sub.owned_partitions[0].partitions, vec![0, 1]);
    assert_eq!(sub.generation_id, 2);
}

/// A generation bump that changes nothing for this member fires no event, yet the group metadata
/// moves to the new generation.
#[test]
fn silent_generation_bump_updates_group_metadata() {
    let mut h = H::new(config(vec![Assignor::CooperativeSticky]));
    h.find_coordinator();
    h.join_as_follower(4, &tps("t", &[0]));
    h.events();
    h.advance_polling(Duration::from_secs(1));
    h.heartbeat_reply(ErrorCode::RebalanceInProgress);
    h.join_as_follower(5, &tps("t", &[0]));
    assert_eq!(h.events(), vec![]);
    assert_eq!(h.m.group_metadata().unwrap().generation_id(), 5);
}

/// ILLEGAL_GENERATION loses the partitions (no revoke: someone else may own them now) and rejoins
/// with the same member id, after the loss is acknowledged.
#[test]
fn illegal_generation_resets_and_rejoins() {
    let mut h = H::new(config(vec![Assignor::CooperativeSticky]));
    h.find_coordinator();
    h.join_as_follower(3, &tps("t", &[0, 1]));
    h.events();
    h.advance_polling(Duration::from_secs(1));
    h.heartbeat_reply(ErrorCode::IllegalGeneration);
    assert_eq!(
        h.events(),
        vec![MemberEvent::Lost {
            partitions: tps("t", &[0, 1]),
            reason: LostReason::Fenced(ErrorCode::IllegalGeneration)
        }]
    );
    assert_eq!(h.m.group_metadata(), None);
    assert!(h.m.assignment().is_empty());
    h.nothing();
    h.m.ack(h.now);
    let join = h.expect("JoinGroup");
    match &join.request {
        Request::JoinGroup { member_id, .. } => assert_eq!(member_id, "m-1"),
        _ => unreachable!(),
    }
    assert!(H::join_subscription(&join).owned_partitions.is_empty());
}

/// UNKNOWN_MEMBER_ID forgets the member id as well.
#[test]
fn unknown_member_id_rejoins_from_scratch() {
    let mut h = H::new(config(vec![Assignor::Range]));
    h.find_coordinator();
    h.join_as_follower(3, &tps("t", &[0]));
    h.events();
    h.advance_polling(Duration::from_secs(1));
    h.heartbeat_reply(ErrorCode::UnknownMemberId);
    assert!(matches!(
        h.events()[..],
        [MemberEvent::Lost {
            reason: LostReason::Fenced(ErrorCode::UnknownMemberId),
            ..
        }]
    ));
    h.m.ack(h.now);
    match &h.expect("JoinGroup").request {
        Request::JoinGroup { member_id, .. } => assert_eq!(member_id, ""),
        _ => unreachable!(),
    }
}

/// An ILLEGAL_GENERATION answering a heartbeat of a generation already left behind is ignored.
#[test]
fn stale_heartbeat_errors_are_ignored() {
    let mut h = H::new(config(vec![Assignor::CooperativeSticky]));
    h.find_coordinator();
    h.join_as_follower(1, &tps("t", &[0]));
    h.events();
    h.advance_polling(Duration::from_secs(1));
    let old_hb = h.expect("Heartbeat");
    // Meanwhile a rebalance completes (e.g. triggered by a subscription change).
    h.m.subscribe(["t".to_string(), "u".to_string()]);
    h.join_as_follower(2, &tps("t", &[0]));
    h.reply(
        &old_hb,
        Response::Heartbeat {
            error: ErrorCode::IllegalGeneration,
        },
    );
    assert_eq!(h.events(), vec![]);
    assert_eq!(h.m.group_metadata().unwrap().generation_id(), 2);
}

/// A member that is not polled within the max poll interval reports its partitions lost, leaves the
/// group, and rejoins as a new member only when polled again.
#[test]
fn poll_interval_expiry_is_reported_and_leaves() {
    let mut h = H::new(config(vec![Assignor::Range]));
    h.find_coordinator();
    h.join_as_follower(1, &tps("t", &[0]));
    h.events();
    // Heartbeats keep the session alive, but nobody polls.
    for _ in 0..29 {
        h.advance(Duration::from_secs(1));
        h.heartbeat_reply(ErrorCode::None);
    }
    h.advance(Duration::from_secs(1));
    assert_eq!(
        h.events(),
        vec![MemberEvent::Lost {
            partitions: tps("t", &[0]),
            reason: LostReason::PollIntervalExceeded
        }]
    );
    let leave = h.expect("LeaveGroup");
    match &leave.request {
        Request::LeaveGroup { member_id, .. } => assert_eq!(member_id, "m-1"),
        _ => unreachable!(),
    }
    h.nothing();
    assert_eq!(h.m.poll_timeout(), None, "dormant until polled");
    h.m.ack(h.now);
    h.nothing();
    h.m.handle_poll(h.now);
    match &h.expect("JoinGroup").request {
        Request::JoinGroup { member_id, .. } => assert_eq!(member_id, ""),
        _ => unreachable!(),
    }
}

/// A slow revoke handler is the same stall: past the max poll interval the member leaves and reports
/// the rest of its partitions lost, rather than being silently evicted.
#[test]
fn revoke_handler_stalling_past_the_rebalance_timeout_is_reported() {
    let mut h = H::new(config(vec![Assignor::Range]));
    h.find_coordinator();
    h.join_as_follower(1, &tps("t", &[0]));
    h.events();
    h.advance_polling(Duration::from_secs(1));
    h.heartbeat_reply(ErrorCode::RebalanceInProgress);
    h.nothing();
    assert_eq!(h.events(), vec![MemberEvent::Revoke(tps("t", &[0]))]);
    // The handler never returns; heartbeats continue until the poll interval runs out.
    for _ in 0..30 {
        h.advance(Duration::from_secs(1));
        if let Some(t) = h.tx() {
            assert!(
                matches!(
                    t.request,
                    Request::Heartbeat { .. } | Request::LeaveGroup { .. }
                ),
                "{t:?}"
            );
            if let Request::Heartbeat { .. } = t.request {
                h.reply(
                    &t,
                    Response::Heartbeat {
                        error: ErrorCode::RebalanceInProgress,
                    },
                );
            }
        }
    }
    assert_eq!(h.m.group_metadata(), None);
    assert!(h.m.phase == Phase::Dormant, "{:?}", h.m.phase);
}

/// Static members send their instance id and never LeaveGroup (their session decides).
#[test]
fn static_member_never_sends_leave_group() {
    let mut c = config(vec![Assignor::Range]);
    c.group_instance_id = Some("instance-a".into());
    let mut h = H::new(c);
    h.find_coordinator();
    let join = h.join_as_follower(1, &tps("t", &[0]));
    match &join.request {
        Request::JoinGroup {
            group_instance_id, ..
        } => assert_eq!(group_instance_id.as_deref(), Some("instance-a")),
        _ => unreachable!(),
    }
    assert_eq!(
        h.m.group_metadata().unwrap().group_instance_id(),
        Some("instance-a")
    );
    h.events();
    h.m.leave();
    assert_eq!(h.events(), vec![MemberEvent::Revoke(tps("t", &[0]))]);
    h.m.ack(h.now);
    h.nothing();
    assert!(h.m.is_closed());
}

/// A dynamic member revokes, then sends LeaveGroup, then is closed.
#[test]
fn leave_revokes_then_sends_leave_group() {
    let mut h = H::new(config(vec![Assignor::Range]));
    h.find_coordinator();
    h.join_as_follower(1, &tps("t", &[0]));
    h.events();
    h.m.leave();
    assert_eq!(h.events(), vec![MemberEvent::Revoke(tps("t", &[0]))]);
    h.nothing();
    h.m.ack(h.now);
    let leave = h.expect("LeaveGroup");
    assert!(!h.m.is_closed());
    h.reply(
        &leave,
        Response::LeaveGroup {
            error: ErrorCode::None,
        },
    );
    assert!(h.m.is_closed());
    h.nothing();
}

/// NOT_COORDINATOR mid-join rediscovers the coordinator (after the backoff) and joins again.
#[test]
fn not_coordinator_rediscovers_and_rejoins() {
    let mut h = H::new(config(vec![Assignor::Range]));
    h.find_coordinator();
    let join = h.expect("JoinGroup");
    h.reply(
        &join,
        H::join_response(ErrorCode::NotCoordinator, -1, "", ""),
    );
    h.nothing();
    h.advance_polling(Duration::from_millis(100));
    h.find_coordinator();
    h.expect("JoinGroup");
}

/// A heartbeat lost in transport marks the coordinator unknown; the member stays in its generation.
#[test]
fn heartbeat_transport_failure_keeps_generation() {
    let mut h = H::new(config(vec![Assignor::Range]));
    h.find_coordinator();
    h.join_as_follower(1, &tps("t", &[0]));
    h.events();
    h.advance_polling(Duration::from_secs(1));
    let hb = h.expect("Heartbeat");
    h.m.handle_failure(h.now, hb.id);
    h.advance_polling(Duration::from_millis(100));
    h.find_coordinator();
    let hb = h.heartbeat_reply(ErrorCode::None);
    assert!(matches!(
        hb.request,
        Request::Heartbeat {
            generation_id: 1,
            ..
        }
    ));
    assert_eq!(h.events(), vec![]);
}

/// No heartbeat through for a session timeout: rediscover the coordinator rather than trust it.
#[test]
fn session_expiry_rediscovers_coordinator() {
    let mut h = H::new(config(vec![Assignor::Range]));
    h.find_coordinator();
    h.join_as_follower(1, &tps("t", &[0]));
    h.events();
    h.advance_polling(Duration::from_secs(1));
    let _unanswered = h.expect("Heartbeat");
    h.advance_polling(Duration::from_secs(9));
    h.nothing();
    h.advance_polling(Duration::from_millis(100));
    h.expect("FindCoordinator");
}

/// Fatal errors stop the member and say which request failed.
#[test]
fn fatal_errors_stop_the_member() {
    let mut h = H::new(config(vec![Assignor::Range]));
    h.find_coordinator();
    let join = h.expect("JoinGroup");
    h.reply(
        &join,
        H::join_response(ErrorCode::GroupAuthorizationFailed, -1, "", ""),
    );
    match &h.events()[..] {
        [MemberEvent::Fatal(f)] => {
            assert_eq!(f.code, ErrorCode::GroupAuthorizationFailed);
            assert_eq!(f.request, "JoinGroup");
        }
        other => panic!("{other:?}"),
    }
    assert!(h.m.is_closed());
    h.advance(Duration::from_secs(5));
    h.nothing();
}

/// FENCED_INSTANCE_ID: another process took this static member's identity; stop, do not fight it.
#[test]
fn fenced_instance_id_is_fatal() {
    let mut c = config(vec![Assignor::Range]);
    c.group_instance_id = Some("i".into());
    let mut h = H::new(c);
    h.find_coordinator();
    h.join_as_follower(1, &tps("t", &[0]));
    h.events();
    h.advance_polling(Duration::from_secs(1));
    h.heartbeat_reply(ErrorCode::FencedInstanceId);
    assert!(
        matches!(h.events().last(), Some(MemberEvent::Fatal(f)) if f.code == ErrorCode::FencedInstanceId)
    );
}

/// SyncGroup answered REBALANCE_IN_PROGRESS: another round started; join it.
#[test]
fn sync_rebalance_in_progress_rejoins() {
    let mut h = H::new(config(vec![Assignor::Range]));
    h.find_coordinator();
    let join = h.expect("JoinGroup");
    h.reply(&join, H::join_response(ErrorCode::None, 1, "other", "m-1"));
    let sync = h.expect("SyncGroup");
    h.reply(
        &sync,
        Response::SyncGroup {
            error: ErrorCode::RebalanceInProgress,
            protocol_name: None,
            assignment: Bytes::new(),
        },
    );
    h.expect("JoinGroup");
}

/// The leader re-reads partition counts and rebalances when a topic grows.
#[test]
fn leader_rebalances_when_partitions_are_added() {
    let mut h = H::new(config(vec![Assignor::Range]));
    h.find_coordinator();
    let join = h.expect("JoinGroup");
    let metadata = match &join.request {
        Request::JoinGroup { protocols, .. } => protocols[0].1.clone(),
        _ => unreachable!(),
    };
    h.reply(
        &join,
        Response::JoinGroup {
            skip_assignment: false,
            error: ErrorCode::None,
            generation_id: 1,
            protocol_name: Some("range".into()),
            leader: "m-1".into(),
            member_id: "m-1".into(),
            members: vec![JoinedMember {
                member_id: "m-1".into(),
                group_instance_id: None,
                metadata,
            }],
        },
    );
    let md = h.expect("Metadata");
    let meta = |n| Response::Metadata {
        topics: vec![TopicMetadata {
            name: "t".into(),
            id: None,
            partitions: Some(n),
        }],
    };
    h.reply(&md, meta(2));
    let sync = h.expect("SyncGroup");
    h.reply(
        &sync,
        Response::SyncGroup {
            error: ErrorCode::None,
            protocol_name: Some("range".into()),
            assignment: assignment_bytes(&tps("t", &[0, 1])),
        },
    );
    h.events();
    // Sixty seconds of healthy heartbeats, then the periodic check finds 3 partitions.
    let mut check = None;
    for _ in 0..60 {
        h.advance_polling(Duration::from_secs(1));
        while let Some(t) = h.tx() {
            match t.request {
                Request::Heartbeat { .. } => h.reply(
                    &t,
                    Response::Heartbeat {
                        error: ErrorCode::None,
                    },
                ),
                Request::Metadata { .. } => check = Some(t),
                _ => panic!("{t:?}"),
            }
        }
    }
    let check = check.expect("the leader re-read the partition counts");
    h.reply(&check, meta(2));
    h.nothing();
    let mut rejoined = false;
    'outer: for _ in 0..70 {
        h.advance_polling(Duration::from_secs(1));
        while let Some(t) = h.tx() {
            match t.request {
                Request::Heartbeat { .. } => h.reply(
                    &t,
                    Response::Heartbeat {
                        error: ErrorCode::None,
                    },
                ),
                Request::Metadata { .. } => h.reply(&t, meta(3)),
                Request::JoinGroup { .. } => {
                    rejoined = true;
                    break 'outer;
                }
                _ => panic!("{t:?}"),
            }
        }
        // Eager: the rebalance starts with revoking everything.
        for e in h.events() {
            assert_eq!(e, MemberEvent::Revoke(tps("t", &[0, 1])));
            h.m.ack(h.now);
        }
    }
    assert!(rejoined, "a partition count change triggers a rebalance");
}

/// Nothing is sent, and no time is asked for, once the member is closed.
#[test]
fn closed_member_is_quiet() {
    let mut h = H::new(config(vec![Assignor::Range]));
    h.m.leave();
    h.nothing();
    assert!(h.m.is_closed());
    assert_eq!(h.m.poll_timeout(), None);
}

/// The wake-up time always covers the next due heartbeat, so a driver sleeping until
/// `poll_timeout` never misses one.
#[test]
fn poll_timeout_covers_the_next_heartbeat() {
    let mut h = H::new(config(vec![Assignor::Range]));
    h.find_coordinator();
    h.join_as_follower(1, &tps("t", &[0]));
    let wake = h.m.poll_timeout().unwrap();
    assert!(wake <= h.now + Duration::from_secs(1));
    h.now = wake;
    h.m.handle_poll(h.now);
    h.expect("Heartbeat");
}

/// KIP-814: a static leader that rejoins is told to skip the assignment; it sends SyncGroup without
/// assignments (the coordinator keeps the current ones) and still re-reads the partition counts it
/// monitors.
#[test]
fn static_leader_rejoin_skips_the_assignment() {
    let mut c = config(vec![Assignor::Range]);
    c.group_instance_id = Some("instance-a".into());
    let mut h = H::new(c);
    h.find_coordinator();
    let join = h.expect("JoinGroup");
    let metadata = match &join.request {
        Request::JoinGroup { protocols, .. } => protocols[0].1.clone(),
        _ => unreachable!(),
    };
    h.reply(
        &join,
        Response::JoinGroup {
            skip_assignment: true,
            error: ErrorCode::None,
            generation_id: 7,
            protocol_name: Some("range".into()),
            leader: "m-9".into(),
            member_id: "m-9".into(),
            members: vec![JoinedMember {
                member_id: "m-9".into(),
                group_instance_id: Some("instance-a".into()),
                metadata,
            }],
        },
    );
    let md = h.expect("Metadata");
    h.reply(
        &md,
        Response::Metadata {
            topics: vec![TopicMetadata {
                name: "t".into(),
                id: None,
                partitions: Some(2),
            }],
        },
    );
    let sync = h.expect("SyncGroup");
    match &sync.request {
        Request::SyncGroup {
            assignments,
            generation_id,
            ..
        } => {
            assert!(assignments.is_empty(), "no new assignment computed");
            assert_eq!(*generation_id, 7);
        }
        _ => unreachable!(),
    }
    h.reply(
        &sync,
        Response::SyncGroup {
            error: ErrorCode::None,
            protocol_name: Some("range".into()),
            assignment: assignment_bytes(&tps("t", &[0, 1])),
        },
    );
    assert_eq!(h.events(), vec![MemberEvent::Assign(tps("t", &[0, 1]))]);
    assert_eq!(h.m.group_metadata().unwrap().generation_id(), 7);
}
