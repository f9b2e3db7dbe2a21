//! Several consumer-protocol members against a small model of the KIP-848 coordinator, checking that
//! no partition is ever held by two members' applications at once and that the group settles with
//! every partition held exactly once.
//!
//! The model follows the coordinator's reconciliation rules that the invariant rests on: a member
//! keeps its epoch until it reports (in its owned set) that the partitions being revoked are gone; a
//! partition is handed to a member only once no other member holds it or is still revoking it. It is a
//! fake for testing the member, not evidence of broker behaviour.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::kip848::ConsumerMember;
use super::*;
use crate::consumer::{GroupConfig, GroupProtocol};

const T: TopicId = TopicId([7; 16]);
const PARTITIONS: i32 = 6;

#[derive(Debug, Default)]
struct ModelMember {
    epoch: i32,
    assigned: BTreeSet<i32>,
    revoking: BTreeSet<i32>,
    last_sent: Option<BTreeSet<i32>>,
}

#[derive(Default)]
struct Coordinator {
    group_epoch: i32,
    members: BTreeMap<String, ModelMember>,
    target: BTreeMap<String, BTreeSet<i32>>,
}

impl Coordinator {
    fn recompute(&mut self) {
        self.group_epoch += 1;
        let ids: Vec<String> = self.members.keys().cloned().collect();
        self.target = ids.iter().map(|m| (m.clone(), BTreeSet::new())).collect();
        for p in 0..PARTITIONS {
            if !ids.is_empty() {
                let m = &ids[p as usize % ids.len()];
                self.target.get_mut(m).unwrap().insert(p);
            }
        }
    }

    /// Whether a member other than `me` still holds or is revoking `p`.
    fn unreleased(&self, me: &str, p: i32) -> bool {
        self.members
            .iter()
            .any(|(id, m)| id != me && (m.assigned.contains(&p) || m.revoking.contains(&p)))
    }

    fn heartbeat(&mut self, hb: &ConsumerHeartbeat) -> Response {
        let id = hb.member_id.clone();
        let fenced = |code| Response::ConsumerGroupHeartbeat {
            error: code,
            message: None,
            member_id: None,
            member_epoch: -1,
            heartbeat_interval_ms: 0,
            assignment: None,
        };
        if hb.member_epoch < 0 {
            self.members.remove(&id);
            self.recompute();
            return Response::ConsumerGroupHeartbeat {
                error: ErrorCode::None,
                message: None,
                member_id: None,
                member_epoch: hb.member_epoch,
                heartbeat_interval_ms: 0,
                assignment: None,
            };
        }
        if hb.member_epoch == 0 {
            self.members.insert(id.clone(), ModelMember::default());
            self.recompute();
        } else {
            match self.members.get(&id) {
                None => return fenced(ErrorCode::UnknownMemberId),
                Some(m) if m.epoch != hb.member_epoch => {
                    return fenced(ErrorCode::FencedMemberEpoch)
                }
                _ => {}
            }
        }
        let reported: Option<BTreeSet<i32>> = hb
            .owned
            .as_ref()
            .map(|o| o.get(&T).cloned().unwrap_or_default().into_iter().collect());
        let target = self.target[&id].clone();
        let group_epoch = self.group_epoch;
        // Revocation acknowledged: the reported owned set no longer has the revoked partitions.
        {
            let m = self.members.get_mut(&id).unwrap();
            if let Some(r) = &reported {
                if !m.revoking.is_empty() && m.revoking.is_disjoint(r) {
                    m.revoking.clear();
                }
            }
        }
        let m = &self.members[&id];
        let (epoch, revoking, assigned) = if !m.revoking.is_empty() {
            (m.epoch, m.revoking.clone(), m.assigned.clone())
        } else {
            let revoke: BTreeSet<i32> = m.assigned.difference(&target).copied().collect();
            if !revoke.is_empty() {
                let keep: BTreeSet<i32> = m.assigned.intersection(&target).copied().collect();
                (m.epoch, revoke, keep)
            } else {
                let free: BTreeSet<i32> = target
                    .iter()
                    .copied()
                    .filter(|p| m.assigned.contains(p) || !self.unreleased(&id, *p))
                    .collect();
                (group_epoch, BTreeSet::new(), free)
            }
        };
        let m = self.members.get_mut(&id).unwrap();
        m.epoch = epoch;
        m.revoking = revoking;
        m.assigned = assigned.clone();
        let assignment = (m.last_sent.as_ref() != Some(&assigned)).then(|| {
            m.last_sent = Some(assigned.clone());
            BTreeMap::from([(T, assigned.into_iter().collect())])
        });
        Response::ConsumerGroupHeartbeat {
            error: ErrorCode::None,
            message: None,
            member_id: None,
            member_epoch: epoch,
            heartbeat_interval_ms: 200,
            assignment,
        }
    }
}

struct App {
    member: ConsumerMember,
    held: BTreeSet<TopicPartition>,
    revoking: Option<u32>,
    alive: bool,
}

const REVOKE_STEPS: u32 = 5;

struct Sim {
    coordinator: Coordinator,
    apps: Vec<App>,
    now: Instant,
    config: GroupConfig,
    /// Partitions whose revoke handler is running, released when it acknowledges.
    removals: BTreeMap<usize, Vec<TopicPartition>>,
}

impl Sim {
    fn new() -> Sim {
        let mut config = GroupConfig::new("g");
        config.protocol = GroupProtocol::Consumer {
            server_assignor: None,
        };
        config.max_poll_interval = Duration::from_secs(60);
        Sim {
            coordinator: Coordinator::default(),
            apps: Vec::new(),
            now: Instant::now(),
            config,
            removals: BTreeMap::new(),
        }
    }

    fn add_member(&mut self) {
        let id = format!("member-{}", self.apps.len());
        self.apps.push(App {
            member: ConsumerMember::new(&self.config, ["t".to_string()], id, self.now).unwrap(),
            held: BTreeSet::new(),
            revoking: None,
            alive: true,
        });
    }

    fn exchange(&mut self, i: usize) {
        while let Some(t) = self.apps[i].member.poll_transmit(self.now) {
            let response = match &t.request {
                Request::FindCoordinator => Response::Coordinator { node: 1 },
                Request::Metadata { .. } => Response::Metadata {
                    topics: vec![TopicMetadata {
                        name: "t".into(),
                        id: Some(T),
                        partitions: Some(PARTITIONS),
                    }],
                },
                Request::ConsumerGroupHeartbeat(hb) => self.coordinator.heartbeat(hb),
                other => panic!("unexpected {other:?}"),
            };
            self.apps[i]
                .member
                .handle_response(self.now, t.id, response);
        }
    }

    fn handle_events(&mut self, i: usize) {
        if let Some(left) = self.apps[i].revoking.take() {
            if left > 0 {
                self.apps[i].revoking = Some(left - 1);
                return;
            }
            // The handler finished: its partitions are released, then the revocation acknowledged.
            for p in self.removals.remove(&i).unwrap_or_default() {
                self.apps[i].held.remove(&p);
            }
            self.apps[i].member.ack(self.now);
        }
        while self.apps[i].revoking.is_none() {
            let Some(e) = self.apps[i].member.poll_event() else {
                break;
            };
            match e {
                MemberEvent::Assign(ps) => {
                    for p in ps {
                        for (j, other) in self.apps.iter().enumerate() {
                            assert!(
                                j == i || !other.held.contains(&p),
                                "{p} assigned to member {i} while member {j} still holds it"
                            );
                        }
                        self.apps[i].held.insert(p);
                    }
                }
                MemberEvent::Revoke(ps) => {
                    // The handler tears the partitions down over the next steps; they count as held
                    // until it acknowledges.
                    self.apps[i].revoking = Some(REVOKE_STEPS);
                    self.pending_removal(i, ps);
                }
                // The application asked to rejoin and had already let its partitions go.
                MemberEvent::Lost {
                    partitions,
                    reason: LostReason::Rejoined,
                } => {
                    for p in &partitions {
                        self.apps[i].held.remove(p);
                    }
                    self.apps[i].member.ack(self.now);
                }
                MemberEvent::Lost { partitions, reason } => {
                    panic!("member {i} lost {partitions:?} ({reason:?}) in a healthy group")
                }
                MemberEvent::Fatal(f) => panic!("member {i}: {f:?}"),
            }
        }
    }

    fn pending_removal(&mut self, i: usize, ps: Vec<TopicPartition>) {
        self.removals.entry(i).or_default().extend(ps);
    }

    fn step(&mut self) {
        self.now += Duration::from_millis(100);
        for i in 0..self.apps.len() {
            if !self.apps[i].alive {
                continue;
            }
            self.apps[i].member.handle_poll(self.now);
            self.handle_events(i);
            self.exchange(i);
            self.handle_events(i);
        }
    }

    fn settle(&mut self) {
        for _ in 0..200 {
            self.step();
        }
        let mut all = BTreeSet::new();
        for (i, app) in self.apps.iter().enumerate().filter(|(_, a)| a.alive) {
            assert_eq!(app.held, app.member.assignment(), "member {i}");
            for p in &app.held {
                assert!(all.insert(p.clone()), "{p} held twice");
            }
            let gm = app
                .member
                .group_metadata()
                .expect("settled members hold an epoch");
            assert_eq!(gm.generation_id(), self.coordinator.group_epoch);
        }
        assert_eq!(all.len(), PARTITIONS as usize, "{all:?}");
    }

    fn stop_member(&mut self, i: usize) {
        self.apps[i].member.leave();
        for _ in 0..(REVOKE_STEPS + 5) {
            self.handle_events(i);
            self.exchange(i);
        }
        assert!(self.apps[i].member.is_closed());
        assert!(self.apps[i].held.is_empty());
        self.apps[i].alive = false;
    }
}

/// Members joining and leaving under the consumer protocol never make two applications hold one
/// partition, and every settled member's group metadata carries the group's epoch.
#[test]
fn consumer_protocol_never_overlaps() {
    let mut sim = Sim::new();
    sim.add_member();
    sim.settle();
    sim.add_member();
    sim.settle();
    sim.add_member();
    sim.settle();
    sim.stop_member(0);
    sim.settle();
    sim.add_member();
    sim.settle();
}

/// A rejoin as a new member under the consumer protocol: everything is lost at once, the epoch drops
/// to 0 (the old one is withdrawn), the leave heartbeat goes out before the epoch-0 join, and the group
/// settles with every partition held once.
#[test]
fn consumer_protocol_rejoin_as_new_member() {
    let mut sim = Sim::new();
    for _ in 0..3 {
        sim.add_member();
        sim.settle();
    }
    for _ in 0..2 {
        sim.apps[2].member.rejoin_as_new(sim.now, "scripted");
        assert!(sim.apps[2].member.group_metadata().is_none());
        // Nothing goes out before the loss is acknowledged: the leave frees the partitions.
        assert!(sim.apps[2].member.poll_transmit(sim.now).is_none());
        sim.handle_events(2);
        assert!(sim.apps[2].held.is_empty());
        let leave = sim.apps[2].member.poll_transmit(sim.now);
        let Some(Transmit {
            request: Request::ConsumerGroupHeartbeat(hb),
            id,
            ..
        }) = leave
        else {
            panic!("expected the leave heartbeat first: {leave:?}");
        };
        assert_eq!(hb.member_epoch, -1);
        let response = sim.coordinator.heartbeat(&hb);
        sim.apps[2].member.handle_response(sim.now, id, response);
        let join = sim.apps[2].member.poll_transmit(sim.now);
        assert!(
            matches!(&join, Some(Transmit { request: Request::ConsumerGroupHeartbeat(hb), .. }) if hb.member_epoch == 0),
            "then the join at epoch 0: {join:?}"
        );
        sim.apps[2]
            .member
            .handle_failure(sim.now, join.map(|t| t.id).unwrap_or(RequestId(0)));
        sim.settle();
        assert!(!sim.apps[2].held.is_empty());
    }
}
