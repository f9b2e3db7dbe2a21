//! Several members against a small in-memory model of the classic group coordinator, checking the
//! invariant the snapshot layer relies on: no partition is ever held by two members' applications at
//! once (held = from its Assign until its Revoke/Lost is acknowledged), and once the group settles,
//! every partition is held by exactly one member.
//!
//! The model keeps only what the invariant depends on: JoinGroup answered when every known member has
//! rejoined, the leader's SyncGroup distributing assignments, REBALANCE_IN_PROGRESS on heartbeats
//! while a round is open, MEMBER_ID_REQUIRED for new members, LeaveGroup. It is a fake for testing the
//! state machines, never evidence of broker behaviour (the real-broker tests are in protocol-tests).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::classic::ClassicMember;
use super::*;
use crate::consumer::assignor::Assignor;
use crate::consumer::{GroupConfig, GroupProtocol};

#[derive(Debug, PartialEq)]
enum GroupState {
    Stable,
    Preparing,
    Completing,
}

struct Joined {
    protocols: Vec<(String, Bytes)>,
}

/// The coordinator model.
struct Coordinator {
    generation: i32,
    state: GroupState,
    members: BTreeMap<String, Joined>,
    /// JoinGroup requests held until the round completes: member id → (member index, request id).
    pending_joins: BTreeMap<String, (usize, RequestId)>,
    pending_syncs: BTreeMap<String, (usize, RequestId)>,
    leader: String,
    protocol: String,
    assignments: Option<BTreeMap<String, Bytes>>,
    next_member: u32,
}

impl Coordinator {
    fn new() -> Self {
        Coordinator {
            generation: 0,
            state: GroupState::Stable,
            members: BTreeMap::new(),
            pending_joins: BTreeMap::new(),
            pending_syncs: BTreeMap::new(),
            leader: String::new(),
            protocol: String::new(),
            assignments: None,
            next_member: 0,
        }
    }

    /// Handles one request; returns immediate answers and answers released to other members.
    fn handle(&mut self, from: usize, t: &Transmit) -> Vec<(usize, RequestId, Response)> {
        let mut out = Vec::new();
        match &t.request {
            Request::FindCoordinator => out.push((from, t.id, Response::Coordinator { node: 1 })),
            Request::JoinGroup {
                member_id,
                protocols,
                ..
            } => {
                if member_id.is_empty() {
                    self.next_member += 1;
                    out.push((
                        from,
                        t.id,
                        Response::JoinGroup {
                            skip_assignment: false,
                            error: ErrorCode::MemberIdRequired,
                            generation_id: -1,
                            protocol_name: None,
                            leader: String::new(),
                            member_id: format!("member-{:02}", self.next_member),
                            members: vec![],
                        },
                    ));
                    return out;
                }
                self.members.insert(
                    member_id.clone(),
                    Joined {
                        protocols: protocols.clone(),
                    },
                );
                self.pending_joins.insert(member_id.clone(), (from, t.id));
                self.state = GroupState::Preparing;
                self.assignments = None;
                out.extend(self.maybe_complete_join());
            }
            Request::SyncGroup {
                member_id,
                generation_id,
                assignments,
                ..
            } => {
                if *generation_id != self.generation || !self.members.contains_key(member_id) {
                    out.push((
                        from,
                        t.id,
                        Response::SyncGroup {
                            error: ErrorCode::IllegalGeneration,
                            protocol_name: None,
                            assignment: Bytes::new(),
                        },
                    ));
                    return out;
                }
                if self.state == GroupState::Preparing {
                    out.push((
                        from,
                        t.id,
                        Response::SyncGroup {
                            error: ErrorCode::RebalanceInProgress,
                            protocol_name: None,
                            assignment: Bytes::new(),
                        },
                    ));
                    return out;
                }
                if *member_id == self.leader {
                    self.assignments = Some(assignments.iter().cloned().collect());
                }
                self.pending_syncs.insert(member_id.clone(), (from, t.id));
                if let Some(a) = &self.assignments {
                    for (m, (idx, id)) in std::mem::take(&mut self.pending_syncs) {
                        out.push((
                            idx,
                            id,
                            Response::SyncGroup {
                                error: ErrorCode::None,
                                protocol_name: Some(self.protocol.clone()),
                                assignment: a.get(&m).cloned().unwrap_or_default(),
                            },
                        ));
                    }
                    self.state = GroupState::Stable;
                }
            }
            Request::Heartbeat {
                member_id,
                generation_id,
                ..
            } => {
                let error = if !self.members.contains_key(member_id) {
                    ErrorCode::UnknownMemberId
                } else if self.state == GroupState::Preparing {
                    ErrorCode::RebalanceInProgress
                } else if *generation_id != self.generation {
                    ErrorCode::IllegalGeneration
                } else {
                    ErrorCode::None
                };
                out.push((from, t.id, Response::Heartbeat { error }));
            }
            Request::LeaveGroup { member_id, .. } => {
                self.members.remove(member_id);
                self.pending_joins.remove(member_id);
                out.push((
                    from,
                    t.id,
                    Response::LeaveGroup {
                        error: ErrorCode::None,
                    },
                ));
                if !self.members.is_empty() {
                    self.state = GroupState::Preparing;
                    out.extend(self.maybe_complete_join());
                }
            }
            Request::Metadata { topics } => out.push((
                from,
                t.id,
                Response::Metadata {
                    topics: topics
                        .iter()
                        .map(|n| TopicMetadata {
                            name: n.clone(),
                            id: None,
                            partitions: Some(PARTITIONS),
                        })
                        .collect(),
                },
            )),
            other => panic!("unexpected {other:?}"),
        }
        out
    }

    /// The round completes once every known member has rejoined.
    fn maybe_complete_join(&mut self) -> Vec<(usize, RequestId, Response)> {
        if self.state != GroupState::Preparing
            || self
                .members
                .keys()
                .any(|m| !self.pending_joins.contains_key(m))
        {
            return Vec::new();
        }
        self.generation += 1;
        self.state = GroupState::Completing;
        self.leader = self.members.keys().next().unwrap().clone();
        self.protocol = self.members[&self.leader].protocols[0].0.clone();
        let members: Vec<JoinedMember> = self
            .members
            .iter()
            .map(|(id, j)| JoinedMember {
                member_id: id.clone(),
                group_instance_id: None,
                metadata: j
                    .protocols
                    .iter()
                    .find(|p| p.0 == self.protocol)
                    .unwrap()
                    .1
                    .clone(),
            })
            .collect();
        std::mem::take(&mut self.pending_joins)
            .into_iter()
            .map(|(m, (idx, id))| {
                (
                    idx,
                    id,
                    Response::JoinGroup {
                        skip_assignment: false,
                        error: ErrorCode::None,
                        generation_id: self.generation,
                        protocol_name: Some(self.protocol.clone()),
                        leader: self.leader.clone(),
                        member_id: m.clone(),
                        members: if m == self.leader {
                            members.clone()
                        } else {
                            vec![]
                        },
                    },
                )
            })
            .collect()
    }
}

const PARTITIONS: i32 = 6;

struct App {
    member: ClassicMember,
    held: BTreeSet<TopicPartition>,
    /// A revocation being handled: acknowledged after `REVOKE_STEPS` steps.
    revoking: Option<(Vec<TopicPartition>, u32)>,
    alive: bool,
}

const REVOKE_STEPS: u32 = 4;

struct Sim {
    coordinator: Coordinator,
    apps: Vec<App>,
    now: Instant,
    config: GroupConfig,
}

impl Sim {
    fn new(assignor: Assignor) -> Sim {
        let mut config = GroupConfig::new("g");
        config.protocol = GroupProtocol::Classic {
            assignors: vec![assignor],
        };
        config.session_timeout = Duration::from_secs(10);
        config.heartbeat_interval = Duration::from_millis(300);
        config.max_poll_interval = Duration::from_secs(60);
        Sim {
            coordinator: Coordinator::new(),
            apps: Vec::new(),
            now: Instant::now(),
            config,
        }
    }

    fn add_member(&mut self) {
        self.apps.push(App {
            member: ClassicMember::new(&self.config, ["t".to_string()], self.now).unwrap(),
            held: BTreeSet::new(),
            revoking: None,
            alive: true,
        });
    }

    /// One 100 ms step: every member sends what it wants, the coordinator answers, every application
    /// handles its events. Panics on an ownership overlap.
    fn step(&mut self) {
        self.now += Duration::from_millis(100);
        for i in 0..self.apps.len() {
            if !self.apps[i].alive {
                continue;
            }
            self.apps[i].member.handle_poll(self.now);
            while let Some(t) = self.apps[i].member.poll_transmit(self.now) {
                for (idx, id, response) in self.coordinator.handle(i, &t) {
                    self.apps[idx]
                        .member
                        .handle_response(self.now, id, response);
                }
            }
            self.handle_events(i);
        }
    }

    fn handle_events(&mut self, i: usize) {
        if let Some((ps, left)) = self.apps[i].revoking.take() {
            if left == 0 {
                for p in &ps {
                    self.apps[i].held.remove(p);
                }
                self.apps[i].member.ack(self.now);
            } else {
                self.apps[i].revoking = Some((ps, left - 1));
                return;
            }
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
                MemberEvent::Revoke(ps) => self.apps[i].revoking = Some((ps, REVOKE_STEPS)),
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

    fn settle(&mut self) {
        for _ in 0..200 {
            self.step();
        }
        let mut all = BTreeSet::new();
        for (i, app) in self.apps.iter().enumerate().filter(|(_, a)| a.alive) {
            assert_eq!(&app.held, app.member.assignment(), "member {i}");
            for p in &app.held {
                assert!(all.insert(p.clone()), "{p} held twice");
            }
            let gm = app
                .member
                .group_metadata()
                .expect("settled members hold a generation");
            assert_eq!(gm.generation_id(), self.coordinator.generation);
        }
        assert_eq!(
            all.len(),
            PARTITIONS as usize,
            "every partition held once: {all:?}"
        );
        let loads: Vec<usize> = self
            .apps
            .iter()
            .filter(|a| a.alive)
            .map(|a| a.held.len())
            .collect();
        assert!(
            loads.iter().max().unwrap() - loads.iter().min().unwrap() <= 1,
            "{loads:?}"
        );
    }

    fn stop_member(&mut self, i: usize) {
        self.apps[i].member.leave();
        for _ in 0..(REVOKE_STEPS + 10) {
            self.handle_events(i);
            while let Some(t) = self.apps[i].member.poll_transmit(self.now) {
                for (idx, id, response) in self.coordinator.handle(i, &t) {
                    self.apps[idx]
                        .member
                        .handle_response(self.now, id, response);
                }
            }
        }
        assert!(self.apps[i].member.is_closed());
        assert!(self.apps[i].held.is_empty());
        self.apps[i].alive = false;
    }
}

impl Sim {
    /// Member `i` gives its membership up and joins as a new member; returns its old member id. The
    /// old generation is withdrawn at once.
    fn rejoin_member(&mut self, i: usize) -> String {
        let old = self.apps[i]
            .member
            .group_metadata()
            .expect("joined")
            .member_id()
            .to_string();
        self.apps[i].member.rejoin_as_new(self.now, "scripted");
        assert!(
            self.apps[i].member.group_metadata().is_none(),
            "no commit may carry the old generation"
        );
        old
    }
}

/// A rejoin as a new member loses every partition, leaves under the old id, joins under a new one,
/// and the group settles with every partition held once: the old membership is gone from the
/// coordinator rather than waited out.
fn rejoin_scenario(assignor: Assignor) {
    let mut sim = Sim::new(assignor);
    for _ in 0..3 {
        sim.add_member();
        sim.settle();
    }
    for round in 0..2 {
        let old = sim.rejoin_member(1);
        sim.settle();
        let new = sim.apps[1]
            .member
            .group_metadata()
            .unwrap()
            .member_id()
            .to_string();
        assert_ne!(old, new, "round {round}: a new member");
        assert!(
            !sim.coordinator.members.contains_key(&old),
            "round {round}: the old member left"
        );
        assert_eq!(sim.coordinator.members.len(), 3, "round {round}");
        assert!(
            !sim.apps[1].held.is_empty(),
            "round {round}: it got partitions back"
        );
    }
}

/// Eager: a rejoin as a new member settles without overlap.
#[test]
fn eager_rejoin_as_new_member() {
    rejoin_scenario(Assignor::Range);
}

/// Cooperative: same.
#[test]
fn cooperative_rejoin_as_new_member() {
    rejoin_scenario(Assignor::CooperativeSticky);
}

/// A rejoin asked for in the middle of a revocation still hands the loss out after the revocation,
/// and a rejoin on a closed member does nothing.
#[test]
fn rejoin_during_a_revocation_and_after_close() {
    let mut sim = Sim::new(Assignor::CooperativeSticky);
    sim.add_member();
    sim.settle();
    sim.add_member();
    // Step until member 0 is revoking for the newcomer, then rejoin it.
    let mut rejoined = false;
    for _ in 0..200 {
        sim.step();
        if sim.apps[0].revoking.is_some() && !rejoined {
            sim.apps[0].member.rejoin_as_new(sim.now, "during revoke");
            rejoined = true;
        }
    }
    assert!(rejoined, "member 0 never revoked");
    sim.settle();
    sim.stop_member(1);
    sim.apps[1].member.rejoin_as_new(sim.now, "after close");
    assert!(sim.apps[1].member.is_closed());
    assert!(sim.apps[1].member.poll_event().is_none());
}

fn scenario(assignor: Assignor) {
    let mut sim = Sim::new(assignor);
    sim.add_member();
    sim.settle();
    sim.add_member();
    sim.settle();
    sim.add_member();
    sim.settle();
    sim.stop_member(1);
    sim.settle();
    sim.add_member();
    sim.settle();
}

/// Eager range: members joining and leaving never make two applications hold one partition.
#[test]
fn eager_range_never_overlaps() {
    scenario(Assignor::Range);
}

/// Eager round robin, same invariant.
#[test]
fn eager_round_robin_never_overlaps() {
    scenario(Assignor::RoundRobin);
}

/// Cooperative-sticky: partitions move in two rounds, and a partition is handed over only after the
/// previous holder's revoke handler finished.
#[test]
fn cooperative_never_overlaps() {
    scenario(Assignor::CooperativeSticky);
}
