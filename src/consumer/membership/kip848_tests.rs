//! Scripted-response tests of the consumer-protocol (KIP-848) member.

use super::*;

const COORD: i32 = 3;
const T: TopicId = TopicId([1; 16]);
const U: TopicId = TopicId([2; 16]);

fn config() -> GroupConfig {
    let mut c = GroupConfig::new("g");
    c.protocol = GroupProtocol::Consumer {
        server_assignor: Some("uniform".into()),
    };
    c.max_poll_interval = Duration::from_secs(30);
    c.heartbeat_interval = Duration::from_secs(5);
    c.retry_backoff = Duration::from_millis(100);
    c
}

fn tps(t: &str, ps: &[i32]) -> Vec<TopicPartition> {
    ps.iter().map(|p| TopicPartition::new(t, *p)).collect()
}

fn owned(entries: &[(TopicId, &[i32])]) -> BTreeMap<TopicId, Vec<i32>> {
    entries.iter().map(|(t, ps)| (*t, ps.to_vec())).collect()
}

fn ok(epoch: i32, assignment: Option<BTreeMap<TopicId, Vec<i32>>>) -> Response {
    Response::ConsumerGroupHeartbeat {
        error: ErrorCode::None,
        message: None,
        member_id: None,
        member_epoch: epoch,
        heartbeat_interval_ms: 1000,
        assignment,
    }
}

fn err(error: ErrorCode) -> Response {
    Response::ConsumerGroupHeartbeat {
        error,
        message: Some("scripted".into()),
        member_id: None,
        member_epoch: -1,
        heartbeat_interval_ms: 0,
        assignment: None,
    }
}

struct H {
    m: ConsumerMember,
    now: Instant,
}

impl H {
    fn with(config: GroupConfig) -> H {
        let now = Instant::now();
        H {
            m: ConsumerMember::new(
                &config,
                ["t".to_string(), "u".to_string()],
                "client-made-id".into(),
                now,
            )
            .unwrap(),
            now,
        }
    }

    fn new() -> H {
        H::with(config())
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
    fn hb(&mut self) -> (Transmit, ConsumerHeartbeat) {
        let t = self.expect("ConsumerGroupHeartbeat");
        let Request::ConsumerGroupHeartbeat(hb) = t.request.clone() else {
            unreachable!()
        };
        (t, hb)
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

    fn advance_polling(&mut self, d: Duration) {
        self.now += d;
        self.m.handle_poll(self.now);
        self.m.handle_timeout(self.now);
    }

    fn events(&mut self) -> Vec<MemberEvent> {
        std::iter::from_fn(|| self.m.poll_event()).collect()
    }

    fn names(&mut self) {
        let md = self.expect("Metadata");
        self.reply(
            &md,
            Response::Metadata {
                topics: vec![
                    TopicMetadata {
                        name: "t".into(),
                        id: Some(T),
                        partitions: Some(4),
                    },
                    TopicMetadata {
                        name: "u".into(),
                        id: Some(U),
                        partitions: Some(2),
                    },
                ],
            },
        );
    }

    /// Joins and takes `t` partitions `ps` at `epoch`; the acknowledgement is answered too.
    fn join(&mut self, epoch: i32, ps: &[i32]) {
        let t = self.expect("FindCoordinator");
        self.reply(&t, Response::Coordinator { node: COORD });
        let (t, hb) = self.hb();
        assert_eq!(hb.member_epoch, 0);
        self.reply(&t, ok(epoch, Some(owned(&[(T, ps)]))));
        self.names();
        assert_eq!(self.events(), vec![MemberEvent::Assign(tps("t", ps))]);
        let (t, hb) = self.hb();
        assert_eq!(hb.owned, Some(owned(&[(T, ps)])));
        self.reply(&t, ok(epoch, None));
    }
}

/// The join: epoch 0 with the full subscription, the assignment by topic id resolved to names, then
/// the acknowledgement heartbeat right away.
#[test]
fn join_resolves_topic_ids_and_acknowledges() {
    let mut h = H::new();
    assert_eq!(h.m.group_metadata(), None);
    let t = h.expect("FindCoordinator");
    h.reply(&t, Response::Coordinator { node: COORD });
    let (t, hb) = h.hb();
    assert_eq!(t.to, Destination::Coordinator(COORD));
    assert_eq!(
        hb,
        ConsumerHeartbeat {
            member_id: "client-made-id".into(),
            member_epoch: 0,
            instance_id: None,
            rack_id: None,
            rebalance_timeout_ms: 30_000,
            subscribed_topic_names: Some(vec!["t".into(), "u".into()]),
            server_assignor: Some("uniform".into()),
            owned: Some(BTreeMap::new()),
        }
    );
    h.reply(&t, ok(1, Some(owned(&[(T, &[0, 1]), (U, &[1])]))));
    assert_eq!(h.m.group_metadata().unwrap().generation_id(), 1);
    assert_eq!(
        h.events(),
        vec![],
        "nothing is assigned before the topic ids have names"
    );
    h.names();
    assert_eq!(
        h.events(),
        vec![MemberEvent::Assign(vec![
            TopicPartition::new("t", 0),
            TopicPartition::new("t", 1),
            TopicPartition::new("u", 1)
        ])]
    );
    let (_, ack) = h.hb();
    assert_eq!(ack.member_epoch, 1);
    assert_eq!(ack.owned, Some(owned(&[(T, &[0, 1]), (U, &[1])])));
    assert_eq!(
        ack.subscribed_topic_names, None,
        "unchanged fields are sent as null"
    );
    assert_eq!(ack.rebalance_timeout_ms, -1);
}

/// Revocation: the member keeps heartbeating with its owned set unchanged while the revoke handler
/// runs, and acknowledges (owned set without the revoked partitions) only after the handler is done.
#[test]
fn revocation_gates_the_acknowledgement() {
    let mut h = H::new();
    h.join(1, &[0, 1, 2]);
    h.advance_polling(Duration::from_secs(1));
    let (t, _) = h.hb();
    h.reply(&t, ok(1, Some(owned(&[(T, &[0])]))));
    assert_eq!(h.events(), vec![MemberEvent::Revoke(tps("t", &[1, 2]))]);
    assert_eq!(
        h.m.group_metadata().unwrap().generation_id(),
        1,
        "epoch unchanged while revoking"
    );
    // The handler is slow; regular heartbeats go on without reporting a new owned set.
    for _ in 0..3 {
        h.nothing();
        h.advance_polling(Duration::from_secs(1));
        let (t, hb) = h.hb();
        assert_eq!(
            hb.owned, None,
            "nothing acknowledged while the handler runs"
        );
        assert_eq!(hb.member_epoch, 1);
        h.reply(&t, ok(1, None));
        assert_eq!(h.events(), vec![]);
    }
    h.m.ack(h.now);
    let (t, hb) = h.hb();
    assert_eq!(hb.owned, Some(owned(&[(T, &[0])])), "the acknowledgement");
    // The coordinator bumps the epoch and hands out a released partition.
    h.reply(&t, ok(2, Some(owned(&[(T, &[0, 3])]))));
    assert_eq!(h.events(), vec![MemberEvent::Assign(tps("t", &[3]))]);
    assert_eq!(h.m.group_metadata().unwrap().generation_id(), 2);
    let (_, hb) = h.hb();
    assert_eq!(hb.owned, Some(owned(&[(T, &[0, 3])])));
    assert_eq!(h.m.assignment(), tps("t", &[0, 3]).into_iter().collect());
}

/// An epoch bump with the assignment unchanged (null) fires nothing but moves the group metadata.
#[test]
fn silent_epoch_bump_updates_group_metadata() {
    let mut h = H::new();
    h.join(1, &[0]);
    h.advance_polling(Duration::from_secs(1));
    let (t, _) = h.hb();
    h.reply(&t, ok(7, None));
    assert_eq!(h.events(), vec![]);
    assert_eq!(h.m.group_metadata().unwrap().generation_id(), 7);
    // An assignment equal to what is owned is no event either.
    h.advance_polling(Duration::from_secs(1));
    let (t, _) = h.hb();
    h.reply(&t, ok(8, Some(owned(&[(T, &[0])]))));
    assert_eq!(h.events(), vec![]);
    assert_eq!(h.m.group_metadata().unwrap().generation_id(), 8);
}

/// The heartbeat interval comes from the coordinator's response.
#[test]
fn heartbeat_interval_from_the_response() {
    let mut h = H::new();
    h.join(1, &[0]);
    h.now += Duration::from_millis(999);
    h.m.handle_poll(h.now);
    h.nothing();
    h.now += Duration::from_millis(1);
    h.hb();
}

/// FENCED_MEMBER_EPOCH: partitions lost; the member rejoins at epoch 0 with the same (client-made)
/// member id, and only after the loss is acknowledged.
#[test]
fn fenced_rejoins_at_epoch_zero_after_ack() {
    for code in [ErrorCode::FencedMemberEpoch, ErrorCode::UnknownMemberId] {
        let mut h = H::new();
        h.join(4, &[0, 1]);
        h.advance_polling(Duration::from_secs(1));
        let (t, _) = h.hb();
        h.reply(&t, err(code));
        assert_eq!(
            h.events(),
            vec![MemberEvent::Lost {
                partitions: tps("t", &[0, 1]),
                reason: LostReason::Fenced(code)
            }]
        );
        assert_eq!(h.m.group_metadata(), None);
        h.nothing();
        h.m.ack(h.now);
        let (_, hb) = h.hb();
        assert_eq!(hb.member_epoch, 0);
        assert_eq!(hb.member_id, "client-made-id");
        assert_eq!(hb.owned, Some(BTreeMap::new()));
        assert!(hb.subscribed_topic_names.is_some());
    }
}

/// Fenced while a revocation is being handled: both the revocation and the loss are acknowledged
/// before the member rejoins.
#[test]
fn fenced_during_revocation_waits_for_both() {
    let mut h = H::new();
    h.join(1, &[0, 1]);
    h.advance_polling(Duration::from_secs(1));
    let (t, _) = h.hb();
    h.reply(&t, ok(1, Some(owned(&[(T, &[0])]))));
    assert_eq!(h.events(), vec![MemberEvent::Revoke(tps("t", &[1]))]);
    h.advance_polling(Duration::from_secs(1));
    let (t, _) = h.hb();
    h.reply(&t, err(ErrorCode::FencedMemberEpoch));
    assert_eq!(
        h.events(),
        vec![MemberEvent::Lost {
            partitions: tps("t", &[0, 1]),
            reason: LostReason::Fenced(ErrorCode::FencedMemberEpoch)
        }]
    );
    h.m.ack(h.now);
    h.nothing();
    h.m.ack(h.now);
    assert_eq!(h.hb().1.member_epoch, 0);
}

/// A newer target arriving while a revocation is handled is reconciled after the acknowledgement.
#[test]
fn newer_target_during_revocation_is_reconciled_after() {
    let mut h = H::new();
    h.join(1, &[0, 1, 2]);
    h.advance_polling(Duration::from_secs(1));
    let (t, _) = h.hb();
    h.reply(&t, ok(1, Some(owned(&[(T, &[0, 1])]))));
    assert_eq!(h.events(), vec![MemberEvent::Revoke(tps("t", &[2]))]);
    h.advance_polling(Duration::from_secs(1));
    let (t, _) = h.hb();
    h.reply(&t, ok(1, Some(owned(&[(T, &[0])]))));
    assert_eq!(h.events(), vec![]);
    h.m.ack(h.now);
    // The first reconciliation completes (owned {0,1}) and the second starts: revoke 1.
    assert_eq!(h.events(), vec![MemberEvent::Revoke(tps("t", &[1]))]);
    h.m.ack(h.now);
    let (_, hb) = h.hb();
    assert_eq!(hb.owned, Some(owned(&[(T, &[0])])));
}

/// Leave: revoke, acknowledge, heartbeat at epoch -1, closed.
#[test]
fn leave_revokes_then_leaves_with_epoch_minus_one() {
    let mut h = H::new();
    h.join(2, &[0]);
    h.m.leave();
    assert_eq!(h.events(), vec![MemberEvent::Revoke(tps("t", &[0]))]);
    h.nothing();
    h.m.ack(h.now);
    let (t, hb) = h.hb();
    assert_eq!(hb.member_epoch, -1);
    h.reply(&t, ok(-1, None));
    assert!(h.m.is_closed());
    h.nothing();
}

/// A static member leaves with epoch -2 (it will be back; its partitions wait for the session).
#[test]
fn static_member_leaves_with_epoch_minus_two() {
    let mut c = config();
    c.group_instance_id = Some("instance-1".into());
    let mut h = H::with(c);
    let t = h.expect("FindCoordinator");
    h.reply(&t, Response::Coordinator { node: COORD });
    let (t, hb) = h.hb();
    assert_eq!(hb.instance_id.as_deref(), Some("instance-1"));
    h.reply(&t, ok(1, Some(BTreeMap::new())));
    assert_eq!(
        h.m.group_metadata().unwrap().group_instance_id(),
        Some("instance-1")
    );
    h.m.leave();
    let (_, hb) = h.hb();
    assert_eq!(hb.member_epoch, -2);
}

/// Poll interval expiry: partitions reported lost, the member leaves at once (without waiting for the
/// stuck application), and rejoins at epoch 0 when polled again.
#[test]
fn poll_interval_expiry_leaves_and_rejoins_on_poll() {
    let mut h = H::new();
    h.join(3, &[0]);
    for _ in 0..29 {
        h.now += Duration::from_secs(1);
        h.m.handle_timeout(h.now);
        while let Some(t) = h.tx() {
            h.reply(&t, ok(3, None));
        }
    }
    h.now += Duration::from_secs(1);
    h.m.handle_timeout(h.now);
    assert_eq!(
        h.events(),
        vec![MemberEvent::Lost {
            partitions: tps("t", &[0]),
            reason: LostReason::PollIntervalExceeded
        }]
    );
    let (t, hb) = h.hb();
    assert_eq!(
        hb.member_epoch, -1,
        "leaves without waiting for the acknowledgement"
    );
    h.reply(&t, ok(-1, None));
    h.nothing();
    assert_eq!(h.m.poll_timeout(), None);
    h.m.ack(h.now);
    h.m.handle_poll(h.now);
    assert_eq!(h.hb().1.member_epoch, 0);
}

/// NOT_COORDINATOR: rediscover, then send the full heartbeat again.
#[test]
fn coordinator_moved_resends_full_heartbeat() {
    let mut h = H::new();
    h.join(1, &[0]);
    h.advance_polling(Duration::from_secs(1));
    let (t, _) = h.hb();
    h.reply(&t, err(ErrorCode::NotCoordinator));
    h.nothing();
    h.advance_polling(Duration::from_millis(100));
    let t = h.expect("FindCoordinator");
    h.reply(&t, Response::Coordinator { node: 9 });
    let (t, hb) = h.hb();
    assert_eq!(t.to, Destination::Coordinator(9));
    assert_eq!(hb.member_epoch, 1);
    assert_eq!(hb.owned, Some(owned(&[(T, &[0])])));
    assert!(hb.subscribed_topic_names.is_some());
    assert_eq!(hb.rebalance_timeout_ms, 30_000);
}

/// Errors that rejoining cannot fix stop the member.
#[test]
fn fatal_errors_stop_the_member() {
    for code in [
        ErrorCode::GroupAuthorizationFailed,
        ErrorCode::UnsupportedAssignor,
        ErrorCode::GroupMaxSizeReached,
        ErrorCode::UnreleasedInstanceId,
    ] {
        let mut h = H::new();
        let t = h.expect("FindCoordinator");
        h.reply(&t, Response::Coordinator { node: COORD });
        let (t, _) = h.hb();
        h.reply(&t, err(code));
        assert!(matches!(&h.events()[..], [MemberEvent::Fatal(f)] if f.code == code));
        assert!(h.m.is_closed());
        h.nothing();
    }
}

/// A v0 coordinator names the member; the member adopts that id.
#[test]
fn coordinator_assigned_member_id_is_adopted() {
    let now = Instant::now();
    let mut m = ConsumerMember::new(&config(), ["t".to_string()], String::new(), now).unwrap();
    let t = m.poll_transmit(now).unwrap();
    m.handle_response(now, t.id, Response::Coordinator { node: 1 });
    let t = m.poll_transmit(now).unwrap();
    m.handle_response(
        now,
        t.id,
        Response::ConsumerGroupHeartbeat {
            error: ErrorCode::None,
            message: None,
            member_id: Some("from-coordinator".into()),
            member_epoch: 1,
            heartbeat_interval_ms: 1000,
            assignment: None,
        },
    );
    assert_eq!(m.group_metadata().unwrap().member_id(), "from-coordinator");
}

/// A topic id the broker cannot name yet is asked for again after the backoff; the nameable part of
/// the assignment is taken meanwhile.
#[test]
fn unresolvable_topic_ids_are_retried() {
    let mut h = H::new();
    let t = h.expect("FindCoordinator");
    h.reply(&t, Response::Coordinator { node: COORD });
    let (t, _) = h.hb();
    h.reply(&t, ok(1, Some(owned(&[(T, &[0])]))));
    let md = h.expect("Metadata");
    h.reply(&md, Response::Metadata { topics: vec![] });
    h.nothing_but_heartbeats();
    h.advance_polling(Duration::from_millis(100));
    h.names();
    assert_eq!(h.events(), vec![MemberEvent::Assign(tps("t", &[0]))]);
}

impl H {
    fn nothing_but_heartbeats(&mut self) {
        while let Some(t) = self.tx() {
            assert_eq!(t.request.name(), "ConsumerGroupHeartbeat", "{t:?}");
            self.reply(&t, ok(1, None));
        }
    }
}
