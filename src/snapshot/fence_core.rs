//! What the flow does after a refused or failed commit: the I/O-free decisions of the spurious-fence
//! recovery, read from the one table ([`FailureKind::response`](super::FailureKind::response)).
//!
//! The flow's driver reports each failure of a partition's write, commit, acquisition or revoke-time
//! flush here, with the failure's [`Response`], and carries the verdict out: drop one lane, drop them
//! all and rejoin, count and go on, or stop. Before each poll it asks which dropped partitions to
//! acquire again, given what the consumer holds. Nothing here touches a socket or a clock, so every
//! ordering (a fence while a revoke is pending, a fence on a partition that is then lost, two fences
//! in a row, a fence during a rejoin) is a scripted test below.
//!
//! See docs/fencing.md, "A spurious fence survived in place", for why each answer is safe.
//!
//! # Method kinds and call order
//! - **`handle_*`**, input: `handle_failure` (a failure and where it happened; answers a [`Verdict`]),
//!   `handle_rebalance`, `handle_reacquired`, `handle_released`;
//! - **`poll_*`**, output, asked before each poll: `poll_rejoin` (the member must rejoin), then
//!   `poll_reacquire` (the dropped partitions to acquire again, of those the consumer holds).

use std::collections::BTreeSet;

use super::error::Response;

/// What a [`Flow`](super::Flow) does when the group coordinator or the transaction coordinator
/// refuses one of its commits ([`FlowConfig::fence_policy`](super::FlowConfig::fence_policy)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FencePolicy {
    /// Recover without leaving the process (the default), as [`FailureKind::response`] says:
    ///
    /// - `RecoverInPlace` (a generation or member-epoch fence, which a valid owner gets when its
    ///   flush races a rebalance; a commit whose outcome is unknown): that partition's in-memory state
    ///   is dropped unflushed and, as soon as a poll shows the member still owns it, it is acquired
    ///   again (InitProducerId, recovery read, committed offset) and its input re-read from there.
    /// - `Rejoin` (the coordinator no longer knows the member; a newer owner fenced the producer):
    ///   every partition is dropped unflushed and the member joins the group again as a new one.
    /// - A flush refused at revoke time is expected (the next owner replays): counted, not an error.
    ///
    /// Nothing is returned to the caller for these; [`Flow::stats`](super::Flow::stats) counts them.
    /// `Stop` failures (another process holds the static member id; a fatal producer error) still
    /// end [`persist`](super::Flow::persist), [`commit`](super::Flow::commit) and
    /// [`run`](super::Flow::run) with the error.
    ///
    /// [`FailureKind::response`]: super::FailureKind::response
    #[default]
    Recover,
    /// Every refused commit ends `persist`, `commit` and `run` with the error (what kafka-flow does):
    /// the application restarts the member itself. Each restart is a rebalance, which can refuse
    /// another member's flush: the cascade the default avoids.
    Stop,
}

/// Counters of a flow's fence handling, from [`Flow::stats`](super::Flow::stats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FlowStats {
    /// Partitions dropped after a `RecoverInPlace` failure (a spurious fence, or an unknown outcome),
    /// to be acquired again in place.
    pub fences_recovered: u64,
    /// Dropped partitions acquired again because a poll showed the member still owns them.
    pub reacquisitions: u64,
    /// Dropped partitions that were revoked or lost before they could be acquired again.
    pub forgotten: u64,
    /// Times the member gave its membership up and joined again as a new member.
    pub rejoins: u64,
    /// Revoke-time (or close-time) flushes refused by a fence: nothing of them landed, the next owner
    /// replays from the committed offset.
    pub revoke_flushes_refused: u64,
    /// Rebalance handler calls the flow ran (assignments, revocations and losses with partitions).
    pub rebalance_events: u64,
}

/// Where a failure happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Site {
    /// A persist wave or an offset commit of a held partition.
    Held,
    /// Acquiring a partition (on assignment or in place).
    Acquire,
    /// The flush of a partition being revoked or closed.
    Release,
}

/// What the driver does about one failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Return the error to the caller.
    Fail,
    /// Drop this partition's lane unflushed; it is re-acquired when a poll shows it still owned.
    DropLane,
    /// Drop every lane unflushed and rejoin the group as a new member before the next poll.
    DropAll,
    /// Expected (a refused revoke-time flush): counted, nothing to do.
    Expected,
}

/// The fence bookkeeping of one flow.
#[derive(Debug)]
pub(crate) struct FenceCore {
    policy: FencePolicy,
    /// Partitions dropped in place, waiting for a poll to show whether the member still owns them.
    dropped: BTreeSet<i32>,
    /// A rejoin decided and not yet handed to the consumer, with its reason.
    rejoin: Option<String>,
    stats: FlowStats,
}

impl FenceCore {
    pub(crate) fn new(policy: FencePolicy) -> Self {
        FenceCore {
            policy,
            dropped: BTreeSet::new(),
            rejoin: None,
            stats: FlowStats::default(),
        }
    }

    pub(crate) fn stats(&self) -> FlowStats {
        self.stats
    }

    /// `partition` failed at `site` with a failure whose answer is `response` (`None`: not a failed
    /// commit, e.g. a network error reading the committed offset).
    pub(crate) fn handle_failure(
        &mut self,
        partition: i32,
        response: Option<Response>,
        site: Site,
    ) -> Verdict {
        if self.policy == FencePolicy::Stop {
            return Verdict::Fail;
        }
        let Some(response) = response else {
            return Verdict::Fail;
        };
        match (response, site) {
            // Retry never surfaces unless the group commit gave up; Stop is Stop.
            (Response::Retry | Response::Stop, _) => Verdict::Fail,
            // The partition is being handed on: whatever refused the flush (the generation already
            // moved, the coordinator forgot the member, the new owner initialised the producer), nothing
            // of it landed and the next owner replays. An eviction shows up in the membership on its own.
            (_, Site::Release) => {
                self.stats.revoke_flushes_refused += 1;
                Verdict::Expected
            }
            (Response::RecoverInPlace, _) => {
                self.stats.fences_recovered += 1;
                if self.rejoin.is_none() {
                    self.dropped.insert(partition);
                }
                Verdict::DropLane
            }
            (Response::Rejoin, _) => {
                if self.rejoin.is_none() {
                    self.stats.rejoins += 1;
                    self.rejoin = Some(format!("a commit of partition {partition} was refused"));
                }
                // The rejoin hands every partition out as lost; none is re-acquired in place.
                self.dropped.clear();
                Verdict::DropAll
            }
        }
    }

    /// A rebalance handler ran.
    pub(crate) fn handle_rebalance(&mut self) {
        self.stats.rebalance_events += 1;
    }

    /// The rejoin to hand to the consumer before the next poll, once.
    pub(crate) fn poll_rejoin(&mut self) -> Option<String> {
        self.rejoin.take()
    }

    /// Whether `partition` was dropped in place and waits for re-acquisition.
    pub(crate) fn is_dropped(&self, partition: i32) -> bool {
        self.dropped.contains(&partition)
    }

    /// Before a poll: which dropped partitions to acquire again, given the partitions the consumer
    /// holds (its listener was told, and no revocation was handled since). Dropped partitions it no
    /// longer holds are forgotten. Nothing while a rejoin is pending.
    pub(crate) fn poll_reacquire(&mut self, owned: &BTreeSet<i32>) -> Vec<i32> {
        if self.rejoin.is_some() {
            return Vec::new();
        }
        let gone: Vec<i32> = self.dropped.difference(owned).copied().collect();
        for p in gone {
            self.dropped.remove(&p);
            self.stats.forgotten += 1;
        }
        self.dropped.iter().copied().collect()
    }

    /// `partition` was acquired again in place.
    pub(crate) fn handle_reacquired(&mut self, partition: i32) {
        if self.dropped.remove(&partition) {
            self.stats.reacquisitions += 1;
        }
    }

    /// `partitions` were revoked or lost: a dropped one is not this member's to acquire any more.
    pub(crate) fn handle_released(&mut self, partitions: impl IntoIterator<Item = i32>) {
        for p in partitions {
            if self.dropped.remove(&p) {
                self.stats.forgotten += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned(ps: &[i32]) -> BTreeSet<i32> {
        ps.iter().copied().collect()
    }

    /// A spurious fence drops one lane, and the next poll that shows the partition owned acquires it
    /// again; the others are untouched.
    #[test]
    fn a_fence_drops_one_lane_and_the_next_poll_reacquires_it() {
        let mut c = FenceCore::new(FencePolicy::Recover);
        assert_eq!(
            c.handle_failure(1, Some(Response::RecoverInPlace), Site::Held),
            Verdict::DropLane
        );
        assert!(c.is_dropped(1) && !c.is_dropped(0));
        assert_eq!(c.poll_reacquire(&owned(&[0, 1, 2])), vec![1]);
        c.handle_reacquired(1);
        assert_eq!(c.poll_reacquire(&owned(&[0, 1, 2])), Vec::<i32>::new());
        let s = c.stats();
        assert_eq!(
            (s.fences_recovered, s.reacquisitions, s.forgotten),
            (1, 1, 0)
        );
    }

    /// A fence while the partition's revocation is pending: the revoke handler releases it, so it is
    /// forgotten, never acquired again.
    #[test]
    fn a_fence_then_a_revoke_forgets_the_partition() {
        let mut c = FenceCore::new(FencePolicy::Recover);
        c.handle_failure(3, Some(Response::RecoverInPlace), Site::Held);
        c.handle_released([3]);
        assert_eq!(c.poll_reacquire(&owned(&[0])), Vec::<i32>::new());
        assert_eq!(c.stats().forgotten, 1);
        assert_eq!(c.stats().reacquisitions, 0);
    }

    /// A fenced partition that a poll no longer shows owned (lost, or moved in a round the member
    /// has not handled as a revoke) is forgotten at the plan.
    #[test]
    fn a_fenced_partition_no_longer_owned_is_forgotten() {
        let mut c = FenceCore::new(FencePolicy::Recover);
        c.handle_failure(2, Some(Response::RecoverInPlace), Site::Held);
        assert_eq!(c.poll_reacquire(&owned(&[0, 1])), Vec::<i32>::new());
        assert!(!c.is_dropped(2));
        assert_eq!(c.stats().forgotten, 1);
    }

    /// Two fences in a row (the re-acquisition's own first commit is refused too): each is counted,
    /// and the partition stays waiting until an acquisition holds.
    #[test]
    fn two_fences_in_a_row() {
        let mut c = FenceCore::new(FencePolicy::Recover);
        c.handle_failure(0, Some(Response::RecoverInPlace), Site::Held);
        assert_eq!(c.poll_reacquire(&owned(&[0])), vec![0]);
        assert_eq!(
            c.handle_failure(0, Some(Response::RecoverInPlace), Site::Acquire),
            Verdict::DropLane
        );
        assert_eq!(c.poll_reacquire(&owned(&[0])), vec![0]);
        c.handle_reacquired(0);
        let s = c.stats();
        assert_eq!((s.fences_recovered, s.reacquisitions), (2, 1));
    }

    /// An eviction or a producer fence drops everything and rejoins once, even when several
    /// partitions report it; nothing is re-acquired in place meanwhile, and a fence that arrives
    /// during the rejoin does not queue a re-acquisition.
    #[test]
    fn a_rejoin_drops_everything_once() {
        let mut c = FenceCore::new(FencePolicy::Recover);
        c.handle_failure(1, Some(Response::RecoverInPlace), Site::Held);
        assert_eq!(
            c.handle_failure(0, Some(Response::Rejoin), Site::Held),
            Verdict::DropAll
        );
        assert_eq!(
            c.handle_failure(2, Some(Response::Rejoin), Site::Held),
            Verdict::DropAll
        );
        c.handle_failure(3, Some(Response::RecoverInPlace), Site::Held);
        assert_eq!(c.poll_reacquire(&owned(&[0, 1, 2, 3])), Vec::<i32>::new());
        assert!(c.poll_rejoin().is_some());
        assert!(c.poll_rejoin().is_none());
        assert_eq!(c.stats().rejoins, 1);
        assert_eq!(c.poll_reacquire(&owned(&[0, 1, 2, 3])), Vec::<i32>::new());
    }

    /// A flush refused at revoke time is expected whatever refused it; a stopping failure still stops.
    #[test]
    fn a_refused_revoke_flush_is_expected() {
        let mut c = FenceCore::new(FencePolicy::Recover);
        for r in [Response::RecoverInPlace, Response::Rejoin] {
            assert_eq!(
                c.handle_failure(0, Some(r), Site::Release),
                Verdict::Expected
            );
        }
        assert_eq!(
            c.handle_failure(0, Some(Response::Stop), Site::Release),
            Verdict::Fail
        );
        assert_eq!(c.handle_failure(0, None, Site::Release), Verdict::Fail);
        assert_eq!(c.stats().revoke_flushes_refused, 2);
        assert_eq!(c.stats().rejoins, 0);
        assert!(c.poll_rejoin().is_none());
    }

    /// The stopping mode fails on everything, as kafka-flow does, and counts nothing.
    #[test]
    fn the_stopping_mode_fails_on_every_fence() {
        let mut c = FenceCore::new(FencePolicy::Stop);
        for (r, site) in [
            (Response::RecoverInPlace, Site::Held),
            (Response::Rejoin, Site::Held),
            (Response::RecoverInPlace, Site::Release),
            (Response::RecoverInPlace, Site::Acquire),
        ] {
            assert_eq!(c.handle_failure(0, Some(r), site), Verdict::Fail);
        }
        assert_eq!(c.stats(), FlowStats::default());
        assert!(c.poll_rejoin().is_none());
    }

    /// Failures that are not refused commits, or that say stop, fail in the tolerant mode too.
    #[test]
    fn other_failures_still_fail() {
        let mut c = FenceCore::new(FencePolicy::Recover);
        assert_eq!(c.handle_failure(0, None, Site::Held), Verdict::Fail);
        assert_eq!(
            c.handle_failure(0, Some(Response::Stop), Site::Held),
            Verdict::Fail
        );
        assert_eq!(
            c.handle_failure(0, Some(Response::Retry), Site::Acquire),
            Verdict::Fail
        );
        assert_eq!(c.stats(), FlowStats::default());
    }
}
