//! Client-side partition assignors for the classic protocol, as pure functions of the members'
//! subscriptions and the partition counts.
//!
//! The group leader runs one of these after JoinGroup and hands each member its share through
//! SyncGroup. The names are Java's, so a group can mix Java and snapfence members: the coordinator picks
//! a protocol name every member listed, and whichever member is leader runs that assignor.
//!
//! - `range`: per topic, contiguous ranges over the members subscribed to it (eager).
//! - `roundrobin`: all partitions in (topic, partition) order dealt round the members (eager).
//! - `cooperative-sticky`: keeps partitions where they are, balances, and never hands a partition to a
//!   new owner in the same round another member still claims it: the claimant is told to give it up
//!   (its assignment leaves it out), revokes it, rejoins, and the partition is handed out in the next
//!   round. That two-phase move is what makes incremental rebalancing safe.
//!
//! Members are ordered as Java orders them (static members by instance id first, then the rest by
//! member id), so a round-robin or range assignment does not depend on which client is leader.
//!
//! # References
//! - KIP-429 (incremental cooperative rebalancing, the cooperative-sticky assignor)
//! - KIP-341 / KIP-792 (generation in the subscription to resolve conflicting ownership claims)
//! - KIP-345 (static members sort by group instance id)

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::TopicPartition;

/// A classic-protocol assignor the group leader can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Assignor {
    /// Java's `RangeAssignor` (`range`): eager.
    Range,
    /// Java's `RoundRobinAssignor` (`roundrobin`): eager.
    RoundRobin,
    /// Java's `CooperativeStickyAssignor` (`cooperative-sticky`): incremental, two-phase moves.
    CooperativeSticky,
}

/// How members give partitions up during a classic rebalance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RebalanceProtocol {
    /// Every member revokes everything before it rejoins; the new assignment starts from nothing.
    Eager,
    /// Members keep their partitions through the join and revoke only what the new assignment takes
    /// away, after the round; moved partitions are handed out in a follow-up round.
    Cooperative,
}

impl Assignor {
    /// The protocol name in JoinGroup, identical to Java's.
    pub fn name(self) -> &'static str {
        match self {
            Assignor::Range => "range",
            Assignor::RoundRobin => "roundrobin",
            Assignor::CooperativeSticky => "cooperative-sticky",
        }
    }

    /// The assignor with this JoinGroup protocol name, if this crate implements it.
    pub fn from_name(name: &str) -> Option<Assignor> {
        [
            Assignor::Range,
            Assignor::RoundRobin,
            Assignor::CooperativeSticky,
        ]
        .into_iter()
        .find(|a| a.name() == name)
    }

    /// Whether the assignor can run under the cooperative protocol.
    pub fn supports_cooperative(self) -> bool {
        matches!(self, Assignor::CooperativeSticky)
    }

    /// The rebalance protocol a member configured with `assignors` follows: cooperative only when every
    /// one of them supports it, because the coordinator may pick any of them and an eager assignor's
    /// output is only safe if everyone revoked first. (Java decides the same way.)
    pub fn protocol_for(assignors: &[Assignor]) -> RebalanceProtocol {
        if !assignors.is_empty() && assignors.iter().all(|a| a.supports_cooperative()) {
            RebalanceProtocol::Cooperative
        } else {
            RebalanceProtocol::Eager
        }
    }

    /// Runs the assignor. Every member gets an entry (possibly empty). Partitions of topics no member
    /// subscribes to, and topics missing from `partitions_per_topic`, are not assigned.
    pub(crate) fn assign(
        self,
        members: &[MemberSubscription],
        partitions_per_topic: &BTreeMap<String, i32>,
    ) -> BTreeMap<String, BTreeSet<TopicPartition>> {
        match self {
            Assignor::Range => range(members, partitions_per_topic),
            Assignor::RoundRobin => round_robin(members, partitions_per_topic),
            Assignor::CooperativeSticky => cooperative_sticky(members, partitions_per_topic),
        }
    }
}

/// One member as the leader sees it in the JoinGroup response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MemberSubscription {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub topics: BTreeSet<String>,
    /// The partitions the member says it owns (subscription v1+; empty for eager members).
    pub owned: Vec<TopicPartition>,
    /// The generation those were owned at, `-1` when unknown.
    pub generation: i32,
}

/// Java's member order: static members first, by instance id; then dynamic members by member id.
fn member_order(a: &MemberSubscription, b: &MemberSubscription) -> Ordering {
    match (&a.group_instance_id, &b.group_instance_id) {
        (Some(x), Some(y)) => x.cmp(y).then_with(|| a.member_id.cmp(&b.member_id)),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => a.member_id.cmp(&b.member_id),
    }
}

fn sorted_members(members: &[MemberSubscription]) -> Vec<&MemberSubscription> {
    let mut v: Vec<_> = members.iter().collect();
    v.sort_by(|a, b| member_order(a, b));
    v
}

fn empty_assignment(members: &[MemberSubscription]) -> BTreeMap<String, BTreeSet<TopicPartition>> {
    members
        .iter()
        .map(|m| (m.member_id.clone(), BTreeSet::new()))
        .collect()
}

/// Topics with a known positive partition count that at least one member subscribes to, each name
/// interned once.
fn subscribed_topics(
    members: &[MemberSubscription],
    partitions_per_topic: &BTreeMap<String, i32>,
) -> BTreeMap<Arc<str>, i32> {
    members
        .iter()
        .flat_map(|m| m.topics.iter())
        .filter_map(|t| {
            partitions_per_topic
                .get(t)
                .filter(|n| **n > 0)
                .map(|n| (Arc::<str>::from(t.as_str()), *n))
        })
        .collect()
}

fn range(
    members: &[MemberSubscription],
    partitions_per_topic: &BTreeMap<String, i32>,
) -> BTreeMap<String, BTreeSet<TopicPartition>> {
    let mut out = empty_assignment(members);
    let order = sorted_members(members);
    for (topic, count) in subscribed_topics(members, partitions_per_topic) {
        let consumers: Vec<_> = order
            .iter()
            .filter(|m| m.topics.contains(&*topic))
            .collect();
        let n = consumers.len() as i32;
        let (per, extra) = (count / n, count % n);
        for (i, m) in consumers.iter().enumerate() {
            let i = i as i32;
            let start = per * i + i.min(extra);
            let len = per + i32::from(i < extra);
            let set = out
                .get_mut(&m.member_id)
                .expect("every member has an entry");
            set.extend((start..start + len).map(|p| TopicPartition::new(topic.clone(), p)));
        }
    }
    out
}

fn round_robin(
    members: &[MemberSubscription],
    partitions_per_topic: &BTreeMap<String, i32>,
) -> BTreeMap<String, BTreeSet<TopicPartition>> {
    let mut out = empty_assignment(members);
    let order = sorted_members(members);
    if order.is_empty() {
        return out;
    }
    let mut next = 0usize;
    for (topic, count) in subscribed_topics(members, partitions_per_topic) {
        for p in 0..count {
            // Some member subscribes to `topic` (that is how it got into the list), so this stops
            // within one lap.
            while !order[next % order.len()].topics.contains(&*topic) {
                next += 1;
            }
            let m = order[next % order.len()];
            next += 1;
            out.get_mut(&m.member_id)
                .expect("every member has an entry")
                .insert(TopicPartition::new(topic.clone(), p));
        }
    }
    out
}

/// Who really owns each claimed partition: the member that claimed it at the highest generation, when
/// exactly one did. Claims for partitions that no longer exist or that the claimant no longer subscribes
/// to are dropped (the claimant is told to revoke them by their absence).
fn resolve_claims(
    members: &[&MemberSubscription],
    topics: &BTreeMap<Arc<str>, i32>,
) -> (BTreeMap<TopicPartition, usize>, BTreeSet<TopicPartition>) {
    let mut best: BTreeMap<TopicPartition, (i32, Vec<usize>)> = BTreeMap::new();
    let mut claimed = BTreeSet::new();
    for (i, m) in members.iter().enumerate() {
        for tp in &m.owned {
            claimed.insert(tp.clone());
            let exists = topics
                .get(&tp.topic)
                .is_some_and(|n| tp.partition >= 0 && tp.partition < *n);
            if !exists || !m.topics.contains(&*tp.topic) {
                continue;
            }
            let entry = best.entry(tp.clone()).or_insert((m.generation, Vec::new()));
            match m.generation.cmp(&entry.0) {
                Ordering::Greater => *entry = (m.generation, vec![i]),
                Ordering::Equal => entry.1.push(i),
                Ordering::Less => {}
            }
        }
    }
    let owners = best
        .into_iter()
        .filter_map(|(tp, (_, who))| (who.len() == 1).then(|| (tp, who[0])))
        .collect();
    (owners, claimed)
}

fn cooperative_sticky(
    members: &[MemberSubscription],
    partitions_per_topic: &BTreeMap<String, i32>,
) -> BTreeMap<String, BTreeSet<TopicPartition>> {
    let order = sorted_members(members);
    let topics = subscribed_topics(members, partitions_per_topic);
    let (owners, claimed) = resolve_claims(&order, &topics);

    // The plan: where every partition should end up, starting from where it is.
    let mut plan: Vec<BTreeSet<TopicPartition>> = vec![BTreeSet::new(); order.len()];
    for (tp, &i) in &owners {
        plan[i].insert(tp.clone());
    }
    let eligible = |i: usize, topic: &str| order[i].topics.contains(topic);
    for (topic, &count) in &topics {
        for p in 0..count {
            let tp = TopicPartition::new(topic.clone(), p);
            if owners.contains_key(&tp) {
                continue;
            }
            let target = (0..order.len())
                .filter(|&i| eligible(i, topic))
                .min_by_key(|&i| (plan[i].len(), i));
            if let Some(i) = target {
                plan[i].insert(tp);
            }
        }
    }

    // Balance: move one partition at a time from a member to an eligible member holding at least two
    // fewer. Each move lowers the sum of squared loads, so this terminates; partitions that did not
    // stay with an owner move first, so stickiness is only given up where balance needs it.
    loop {
        let mut by_load: Vec<usize> = (0..order.len()).collect();
        by_load.sort_by_key(|&i| (std::cmp::Reverse(plan[i].len()), i));
        let mut moved = false;
        'search: for &a in &by_load {
            let mut receivers: Vec<usize> = (0..order.len())
                .filter(|&b| plan[b].len() + 2 <= plan[a].len())
                .collect();
            if receivers.is_empty() {
                continue;
            }
            receivers.sort_by_key(|&b| (plan[b].len(), b));
            let mut candidates: Vec<&TopicPartition> = plan[a].iter().collect();
            // Unowned-by-`a` first, then the highest partitions first: a stable, deterministic order.
            candidates.sort_by_key(|tp| (owners.get(*tp) == Some(&a), std::cmp::Reverse(*tp)));
            for tp in candidates {
                if let Some(&b) = receivers.iter().find(|&&b| eligible(b, &tp.topic)) {
                    let tp = tp.clone();
                    plan[a].remove(&tp);
                    plan[b].insert(tp);
                    moved = true;
                    break 'search;
                }
            }
        }
        if !moved {
            break;
        }
    }

    // The cooperative rule: a partition goes to a member only if no other member claims it. A
    // partition moving away from its owner is left out of everyone's assignment this round; the owner
    // sees it missing, revokes it and rejoins, and the next round hands it out unclaimed.
    let mut out = empty_assignment(members);
    for (i, set) in plan.into_iter().enumerate() {
        let entry = out
            .get_mut(&order[i].member_id)
            .expect("every member has an entry");
        for tp in set {
            let mine = owners.get(&tp) == Some(&i);
            if mine || !claimed.contains(&tp) {
                entry.insert(tp);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn member(id: &str, topics: &[&str]) -> MemberSubscription {
        MemberSubscription {
            member_id: id.into(),
            group_instance_id: None,
            topics: topics.iter().map(|t| t.to_string()).collect(),
            owned: Vec::new(),
            generation: -1,
        }
    }

    fn tps(topic: &str, ps: &[i32]) -> BTreeSet<TopicPartition> {
        ps.iter().map(|p| TopicPartition::new(topic, *p)).collect()
    }

    fn counts(c: &[(&str, i32)]) -> BTreeMap<String, i32> {
        c.iter().map(|(t, n)| (t.to_string(), *n)).collect()
    }

    /// Java's range layout: the first `count % members` members get one extra partition.
    #[test]
    fn range_matches_java_layout() {
        let members = [
            member("b", &["t"]),
            member("a", &["t"]),
            member("c", &["t"]),
        ];
        let out = Assignor::Range.assign(&members, &counts(&[("t", 7)]));
        assert_eq!(out["a"], tps("t", &[0, 1, 2]));
        assert_eq!(out["b"], tps("t", &[3, 4]));
        assert_eq!(out["c"], tps("t", &[5, 6]));
    }

    /// Static members sort before dynamic ones, by instance id, as in Java.
    #[test]
    fn static_members_sort_first() {
        let mut z = member("a-dynamic", &["t"]);
        z.group_instance_id = None;
        let mut s = member("zzz", &["t"]);
        s.group_instance_id = Some("instance-1".into());
        let out = Assignor::Range.assign(&[z, s], &counts(&[("t", 2)]));
        assert_eq!(out["zzz"], tps("t", &[0]));
        assert_eq!(out["a-dynamic"], tps("t", &[1]));
    }

    /// Round robin skips members not subscribed to the partition's topic.
    #[test]
    fn round_robin_respects_subscriptions() {
        let members = [member("a", &["t", "u"]), member("b", &["u"])];
        let out = Assignor::RoundRobin.assign(&members, &counts(&[("t", 2), ("u", 2)]));
        assert_eq!(out["a"], &tps("t", &[0, 1]) | &tps("u", &[1]));
        assert_eq!(out["b"], tps("u", &[0]));
    }

    /// A partition moving from its owner is withheld for one round, then handed out.
    #[test]
    fn cooperative_moves_in_two_rounds() {
        let mut a = member("a", &["t"]);
        a.owned = tps("t", &[0, 1, 2, 3]).into_iter().collect();
        a.generation = 4;
        let b = member("b", &["t"]);
        let out = Assignor::CooperativeSticky.assign(&[a.clone(), b.clone()], &counts(&[("t", 4)]));
        assert_eq!(out["a"].len(), 2, "a keeps half: {out:?}");
        assert!(
            out["b"].is_empty(),
            "nothing moves to b while a still claims it"
        );

        a.owned = out["a"].iter().cloned().collect();
        let out2 = Assignor::CooperativeSticky.assign(&[a, b], &counts(&[("t", 4)]));
        assert_eq!(out2["a"], out["a"], "a keeps what it kept");
        assert_eq!(out2["b"].len(), 2);
    }

    /// Of two members claiming one partition, the higher generation keeps it; a tie leaves it with
    /// neither this round.
    #[test]
    fn conflicting_claims_resolve_by_generation() {
        let mut a = member("a", &["t"]);
        a.owned = vec![TopicPartition::new("t", 0)];
        a.generation = 5;
        let mut b = member("b", &["t"]);
        b.owned = vec![TopicPartition::new("t", 0)];
        b.generation = 3;
        let out = Assignor::CooperativeSticky.assign(&[a.clone(), b.clone()], &counts(&[("t", 2)]));
        assert!(out["a"].contains(&TopicPartition::new("t", 0)));
        assert!(!out["b"].contains(&TopicPartition::new("t", 0)));

        b.generation = 5;
        let out = Assignor::CooperativeSticky.assign(&[a, b], &counts(&[("t", 2)]));
        assert!(!out["a"].contains(&TopicPartition::new("t", 0)));
        assert!(!out["b"].contains(&TopicPartition::new("t", 0)));
    }

    /// Every assignor's name parses back to it, and a member rebalances cooperatively only when every
    /// assignor it offers is cooperative; otherwise, or with none, it is eager.
    #[test]
    fn names_round_trip_and_protocol_choice() {
        for a in [
            Assignor::Range,
            Assignor::RoundRobin,
            Assignor::CooperativeSticky,
        ] {
            assert_eq!(Assignor::from_name(a.name()), Some(a));
        }
        assert_eq!(
            Assignor::protocol_for(&[Assignor::CooperativeSticky]),
            RebalanceProtocol::Cooperative
        );
        assert_eq!(
            Assignor::protocol_for(&[Assignor::Range, Assignor::CooperativeSticky]),
            RebalanceProtocol::Eager
        );
        assert_eq!(Assignor::protocol_for(&[]), RebalanceProtocol::Eager);
    }

    // ---- properties ----

    const TOPICS: [&str; 3] = ["t0", "t1", "t2"];

    fn group() -> impl Strategy<Value = (Vec<MemberSubscription>, BTreeMap<String, i32>)> {
        let counts = prop::collection::vec(0i32..12, TOPICS.len());
        let members = prop::collection::vec(
            (
                prop::collection::btree_set(prop::sample::select(TOPICS.to_vec()), 1..=3),
                any::<bool>(),
            ),
            1..7,
        );
        (members, counts).prop_map(|(ms, cs)| {
            let members = ms
                .into_iter()
                .enumerate()
                .map(|(i, (topics, is_static))| MemberSubscription {
                    member_id: format!("m{i:02}"),
                    group_instance_id: is_static.then(|| format!("s{}", 9 - i)),
                    topics: topics.into_iter().map(String::from).collect(),
                    owned: Vec::new(),
                    generation: -1,
                })
                .collect();
            let counts = TOPICS
                .iter()
                .zip(cs)
                .map(|(t, n)| (t.to_string(), n))
                .collect();
            (members, counts)
        })
    }

    /// Checks the invariant every assignment must keep: no partition to two members, only existing
    /// partitions, only to members subscribed to the topic.
    fn check_disjoint_and_valid(
        members: &[MemberSubscription],
        counts: &BTreeMap<String, i32>,
        out: &BTreeMap<String, BTreeSet<TopicPartition>>,
    ) -> Result<(), TestCaseError> {
        let mut seen = BTreeSet::new();
        prop_assert_eq!(out.len(), members.len());
        for m in members {
            for tp in &out[&m.member_id] {
                prop_assert!(seen.insert(tp.clone()), "{} assigned twice", tp);
                prop_assert!(m.topics.contains(&*tp.topic), "{} not subscribed", tp);
                prop_assert!(tp.partition < counts[&*tp.topic]);
            }
        }
        Ok(())
    }

    /// Every partition of a subscribed topic is assigned (exactly once, with the check above).
    fn check_complete(
        members: &[MemberSubscription],
        counts: &BTreeMap<String, i32>,
        out: &BTreeMap<String, BTreeSet<TopicPartition>>,
    ) -> Result<(), TestCaseError> {
        let assigned: usize = out.values().map(|s| s.len()).sum();
        let expected: i32 = counts
            .iter()
            .filter(|(t, _)| members.iter().any(|m| m.topics.contains(*t)))
            .map(|(_, n)| *n)
            .sum();
        prop_assert_eq!(assigned, expected as usize);
        Ok(())
    }

    /// Loads differ by at most one among members with identical subscriptions.
    fn check_balanced_when_uniform(
        members: &[MemberSubscription],
        out: &BTreeMap<String, BTreeSet<TopicPartition>>,
    ) -> Result<(), TestCaseError> {
        if members.iter().all(|m| m.topics == members[0].topics) {
            let loads: Vec<usize> = out.values().map(|s| s.len()).collect();
            let (min, max) = (loads.iter().min().unwrap(), loads.iter().max().unwrap());
            prop_assert!(max - min <= 1, "unbalanced {:?}", loads);
        }
        Ok(())
    }

    proptest! {
        /// Eager assignors: every partition of a subscribed topic is owned by exactly one subscribed member.
        #[test]
        fn eager_assignors_own_each_partition_once((members, counts) in group()) {
            for a in [Assignor::Range, Assignor::RoundRobin] {
                let out = a.assign(&members, &counts);
                check_disjoint_and_valid(&members, &counts, &out)?;
                check_complete(&members, &counts, &out)?;
            }
        }

        /// Round robin with identical subscriptions is balanced.
        #[test]
        fn round_robin_balances_uniform_groups((members, counts) in group()) {
            let out = Assignor::RoundRobin.assign(&members, &counts);
            check_balanced_when_uniform(&members, &out)?;
        }

        /// Cooperative-sticky over a sequence of membership changes: in every round no partition is
        /// given to a member while another member still claims it; once members apply their assignments
        /// and rejoin, the group settles (within two rounds) on an assignment that owns every partition
        /// exactly once and is balanced when subscriptions are uniform.
        #[test]
        fn cooperative_never_hands_over_a_claimed_partition(
            (members, counts) in group(),
            churn in prop::collection::vec((any::<bool>(), 0usize..7), 1..5),
        ) {
            let mut live: Vec<MemberSubscription> = members.clone();
            let mut generation = 1;
            let mut next_id = live.len();
            for (join, idx) in churn {
                // Membership change: a new member joins, or one leaves (its claims vanish with it).
                if join || live.len() == 1 {
                    let mut m = members[idx % members.len()].clone();
                    m.member_id = format!("m{next_id:02}");
                    m.owned.clear();
                    m.generation = -1;
                    next_id += 1;
                    live.push(m);
                } else {
                    live.remove(idx % live.len());
                }
                // Rounds until stable: each member revokes what its assignment left out and claims the rest.
                let mut settled = false;
                for _round in 0..3 {
                    let out = Assignor::CooperativeSticky.assign(&live, &counts);
                    check_disjoint_and_valid(&live, &counts, &out)?;
                    for m in &live {
                        for tp in &out[&m.member_id] {
                            for other in live.iter().filter(|o| o.member_id != m.member_id) {
                                prop_assert!(
                                    !other.owned.contains(tp) || m.owned.contains(tp),
                                    "{} handed to {} while {} still claims it", tp, m.member_id, other.member_id
                                );
                            }
                        }
                    }
                    let revoked_any = live.iter().any(|m| {
                        m.owned.iter().any(|tp| !out[&m.member_id].contains(tp))
                    });
                    generation += 1;
                    for m in live.iter_mut() {
                        m.owned = out[&m.member_id].iter().cloned().collect();
                        m.generation = generation;
                    }
                    if !revoked_any {
                        check_complete(&live, &counts, &out)?;
                        check_balanced_when_uniform(&live, &out)?;
                        settled = true;
                        break;
                    }
                }
                prop_assert!(settled, "cooperative rebalance did not settle in 3 rounds");
            }
        }
    }
}
