//! The partition reader's bookkeeping as a sans-IO core: positions, which partitions to fetch from
//! which leader, what to do with each partition's answer.
//!
//! The async partition reader owns the I/O: it asks [`Fetcher::poll_plan`] for
//! the requests to send (Fetch per leader, ListOffsets for partitions whose position must be reset),
//! turns the records of each fetched partition into deliverable records through the records layer's
//! visibility engine, and reports each partition's outcome back here.
//!
//! # Method kinds and call order
//! - **commands**: `assign`, `unassign`, `seek`, `set_paused`;
//! - **`poll_*`**, output: `poll_plan` (per leader, what to fetch and which offsets to list; each
//!   planned partition is owed exactly one answer), `poll_timeout` (when a backoff ends);
//! - **`handle_*`**, input, one per planned partition: `handle_fetched`, `handle_listed`,
//!   `handle_failed` (no answer: back off), `handle_unplanned` (put back untouched).
//!
//! Rules kept here:
//! - a position only moves forward through a fetch that started at it: an answer for an offset the
//!   application has since moved away from (seek, reassign) is dropped;
//! - OFFSET_OUT_OF_RANGE follows the configured [`OffsetReset`] and never silently picks one;
//! - leader epochs (KIP-320): every Fetch and ListOffsets carries the leader epoch from metadata, so a
//!   broker that is no longer leader (or a reader with stale metadata) is fenced instead of served;
//!   the epoch of the last consumed batch goes out as `last_fetched_epoch` (Fetch v12+) so the leader
//!   can report a log that diverged (truncated) after a leader change, and the position moves back to
//!   the end of the diverging epoch;
//! - a partition whose leader errored backs off and asks for a metadata refresh, without holding up
//!   the other partitions;
//! - fetch from follower (KIP-392): when the leader names a preferred read replica (the reader sent
//!   its rack), the partition is fetched from it from then on. The leader stays the judge: a follower's
//!   error (OFFSET_OUT_OF_RANGE included, which the reset policy must not act on until the leader
//!   confirms it), a failed request to it, or a follower that delivers nothing for
//!   [`FollowerLimits::idle`] sends the partition back to the leader, whose choice is then ignored for
//!   [`FollowerLimits::cooldown`]. ListOffsets always go to the leader.
//!
//! # References
//! - Fetch v4+ (v4 isolation level and aborted transactions, KIP-98; v9 current leader epoch,
//!   KIP-320; v12 last fetched epoch and diverging epoch, KIP-595; v13 topic ids, KIP-516:
//!   UNKNOWN_TOPIC_ID and INCONSISTENT_TOPIC_ID refresh metadata, and persist into an error)
//! - ListOffsets v2+ (isolation level: latest is the LSO under read_committed), v4 current leader epoch
//! - KIP-392 (Fetch v11+ `rack_id` and `preferred_read_replica`)

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::{TopicId, TopicPartition};
use crate::wire::ErrorCode;

/// Consecutive UNKNOWN_TOPIC_ID / INCONSISTENT_TOPIC_ID answers for one partition (each followed by a
/// metadata refresh) after which the error reaches the application: the topic was deleted, or
/// recreated under the same name, and no refresh will make the id we hold right.
const TOPIC_ID_ERROR_LIMIT: u32 = 5;

/// What to do when the position of a partition is out of the log's range (or there is none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OffsetReset {
    /// Move to the log start offset.
    Earliest,
    /// Move to the end: the high watermark at read_uncommitted, the last stable offset at
    /// read_committed.
    Latest,
    /// Fail with [`ConsumerError::OffsetOutOfRange`](super::ConsumerError::OffsetOutOfRange) and stop
    /// fetching the partition until the application seeks.
    Fail,
}

/// Where to start reading a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StartAt {
    /// At this offset.
    Offset(i64),
    /// At the log start offset.
    Earliest,
    /// At the end (HW or LSO by isolation level): only records written from now on.
    Latest,
}

/// The ListOffsets timestamps for earliest and latest.
pub(crate) const EARLIEST_TIMESTAMP: i64 = -2;
pub(crate) const LATEST_TIMESTAMP: i64 = -1;

#[derive(Debug, Clone, PartialEq)]
struct PartitionState {
    /// `None` while a reset is pending.
    position: Option<i64>,
    reset_to: Option<i64>,
    /// The leader epoch of the last batch consumed (for truncation detection).
    last_fetched_epoch: Option<i32>,
    high_watermark: Option<i64>,
    last_stable_offset: Option<i64>,
    log_start_offset: Option<i64>,
    /// Out of range under `OffsetReset::Fail`: not fetched until the application seeks.
    failed: bool,
    paused: bool,
    inflight: bool,
    backoff_until: Option<Instant>,
    /// Topic-id errors in a row (see [`TOPIC_ID_ERROR_LIMIT`]).
    topic_id_errors: u32,
    /// The replica the leader named for this reader's rack (KIP-392), fetched from instead of it.
    read_replica: Option<ReadReplica>,
    /// Until then the leader's choice of a replica is not followed (a follower failed or stalled).
    leader_only_until: Option<Instant>,
    /// The follower the fetch in flight went to (`None`: the leader).
    fetching_from: Option<i32>,
}

/// A follower a partition is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ReadReplica {
    node: i32,
    /// When it last delivered progress (or was chosen).
    progress_at: Instant,
}

/// How long a partition follows a leader's choice of follower (KIP-392) without progress, and how long
/// it then stays with the leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FollowerLimits {
    /// A follower that delivers nothing for this long sends the partition back to the leader: it may
    /// have fallen behind the leader's high watermark (or the partition is quiet; the leader then
    /// answers as little).
    pub idle: Duration,
    /// How long the leader's choice of follower is then ignored.
    pub cooldown: Duration,
}

impl Default for FollowerLimits {
    fn default() -> Self {
        FollowerLimits {
            idle: Duration::from_secs(5),
            cooldown: Duration::from_secs(60),
        }
    }
}

impl PartitionState {
    fn new(start: StartAt) -> Self {
        let (position, reset_to) = match start {
            StartAt::Offset(o) => (Some(o), None),
            StartAt::Earliest => (None, Some(EARLIEST_TIMESTAMP)),
            StartAt::Latest => (None, Some(LATEST_TIMESTAMP)),
        };
        PartitionState {
            position,
            reset_to,
            last_fetched_epoch: None,
            high_watermark: None,
            last_stable_offset: None,
            log_start_offset: None,
            failed: false,
            paused: false,
            inflight: false,
            backoff_until: None,
            topic_id_errors: 0,
            read_replica: None,
            leader_only_until: None,
            fetching_from: None,
        }
    }

    /// Back to the leader: the follower is forgotten and the leader's choices ignored for `cooldown`.
    fn back_to_leader(&mut self, now: Instant, cooldown: Duration) {
        self.read_replica = None;
        self.leader_only_until = Some(now + cooldown);
    }
}

/// One partition in a planned Fetch.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FetchPartition {
    pub tp: TopicPartition,
    /// From metadata (the driver fills it in); all zeros when unknown, and then the Fetch goes by name.
    pub topic_id: TopicId,
    pub fetch_offset: i64,
    /// From metadata; -1 when unknown.
    pub current_leader_epoch: i32,
    /// -1 when nothing was consumed yet.
    pub last_fetched_epoch: i32,
    pub log_start_offset: i64,
}

/// One partition in a planned ListOffsets.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ListPartition {
    pub tp: TopicPartition,
    pub timestamp: i64,
    pub current_leader_epoch: i32,
}

/// Requests for one leader.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Plan {
    pub fetch: BTreeMap<i32, Vec<FetchPartition>>,
    pub list: BTreeMap<i32, Vec<ListPartition>>,
    /// Partitions with no known leader: the driver refreshes metadata for them.
    pub leaderless: Vec<TopicPartition>,
}

/// A partition's part of a Fetch response, after the records went through the visibility engine.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Fetched {
    pub error: ErrorCode,
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    pub log_start_offset: i64,
    /// From the visibility engine: where the next fetch starts (past every complete batch examined).
    pub next_offset: i64,
    /// The partition leader epoch of the last complete batch examined, if any.
    pub last_batch_epoch: Option<i32>,
    /// Fetch v12+: the leader's log diverged from what this reader consumed; (epoch, end offset).
    pub diverging: Option<(i32, i64)>,
    /// Fetch v11+: the replica the leader wants this reader to fetch from (-1: none, or itself).
    pub preferred_read_replica: i32,
}

/// What the driver must do after a partition's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Deliver the records; the position moved.
    Deliver,
    /// The answer was for an offset no longer current; drop its records.
    Stale,
    /// The leader moved or is unavailable: refresh its metadata. Nothing to deliver.
    RefreshLeader,
    /// Retry later; nothing to deliver.
    Retry,
    /// The log was truncated below this reader's position (a leader change lost records); the
    /// position moved back to `to`. Nothing to deliver from this answer.
    Truncated { from: i64, to: i64 },
    /// Out of range and the policy is to fail.
    OutOfRange { offset: i64 },
    /// Out of range; a reset to earliest/latest is pending.
    Reset,
    /// An error the application must see.
    Fatal(ErrorCode),
}

/// Positions and fetch state of the assigned partitions.
#[derive(Debug)]
pub(crate) struct Fetcher {
    reset: OffsetReset,
    retry_backoff: Duration,
    follower: FollowerLimits,
    partitions: BTreeMap<TopicPartition, PartitionState>,
}

impl Fetcher {
    pub(crate) fn new(reset: OffsetReset, retry_backoff: Duration) -> Self {
        Fetcher {
            reset,
            retry_backoff,
            follower: FollowerLimits::default(),
            partitions: BTreeMap::new(),
        }
    }

    /// The fetcher with other limits on following a leader's choice of replica.
    #[cfg(test)]
    pub(crate) fn with_follower_limits(mut self, limits: FollowerLimits) -> Self {
        self.follower = limits;
        self
    }

    /// The follower `tp` is read from, if it is read from one (KIP-392).
    pub(crate) fn read_replica(&self, tp: &TopicPartition) -> Option<i32> {
        self.partitions.get(tp)?.read_replica.map(|r| r.node)
    }

    /// Starts (or restarts) reading `tp` at `start`.
    pub(crate) fn assign(&mut self, tp: TopicPartition, start: StartAt) {
        self.partitions.insert(tp, PartitionState::new(start));
    }

    pub(crate) fn unassign(&mut self, tp: &TopicPartition) -> bool {
        self.partitions.remove(tp).is_some()
    }

    pub(crate) fn assigned(&self) -> impl Iterator<Item = &TopicPartition> {
        self.partitions.keys()
    }

    /// Moves the position; answers still in flight for the old position will be dropped.
    pub(crate) fn seek(&mut self, tp: &TopicPartition, start: StartAt) -> bool {
        match self.partitions.get_mut(tp) {
            Some(p) => {
                let paused = p.paused;
                *p = PartitionState::new(start);
                p.paused = paused;
                true
            }
            None => false,
        }
    }

    pub(crate) fn position(&self, tp: &TopicPartition) -> Option<i64> {
        self.partitions.get(tp)?.position
    }

    pub(crate) fn high_watermark(&self, tp: &TopicPartition) -> Option<i64> {
        self.partitions.get(tp)?.high_watermark
    }

    pub(crate) fn last_stable_offset(&self, tp: &TopicPartition) -> Option<i64> {
        self.partitions.get(tp)?.last_stable_offset
    }

    pub(crate) fn set_paused(&mut self, tp: &TopicPartition, paused: bool) {
        if let Some(p) = self.partitions.get_mut(tp) {
            p.paused = paused;
        }
    }

    /// The requests to send now. Partitions planned are marked in flight until their answer (or
    /// failure) is reported.
    pub(crate) fn poll_plan(
        &mut self,
        now: Instant,
        mut leader: impl FnMut(&TopicPartition) -> Option<(i32, i32)>,
    ) -> Plan {
        let mut plan = Plan::default();
        for (tp, p) in &mut self.partitions {
            if p.inflight || p.paused || p.failed || p.backoff_until.is_some_and(|t| now < t) {
                continue;
            }
            let Some((leader_node, epoch)) = leader(tp) else {
                plan.leaderless.push(tp.clone());
                continue;
            };
            p.inflight = true;
            let node = match p.read_replica {
                Some(r) if r.node != leader_node => r.node,
                _ => leader_node,
            };
            p.fetching_from = None;
            match (p.position, p.reset_to) {
                (Some(offset), _) => {
                    p.fetching_from = (node != leader_node).then_some(node);
                    plan.fetch.entry(node).or_default().push(FetchPartition {
                        tp: tp.clone(),
                        topic_id: TopicId::default(),
                        fetch_offset: offset,
                        current_leader_epoch: epoch,
                        last_fetched_epoch: p.last_fetched_epoch.unwrap_or(-1),
                        log_start_offset: -1,
                    })
                }
                (None, Some(timestamp)) => {
                    plan.list
                        .entry(leader_node)
                        .or_default()
                        .push(ListPartition {
                            tp: tp.clone(),
                            timestamp,
                            current_leader_epoch: epoch,
                        })
                }
                (None, None) => p.inflight = false,
            }
        }
        plan
    }

    /// A Fetch or ListOffsets that included `tp` failed as a whole (transport): retry after backoff,
    /// or at once from the leader when the request went to a follower.
    pub(crate) fn handle_failed(&mut self, now: Instant, tp: &TopicPartition) {
        let cooldown = self.follower.cooldown;
        if let Some(p) = self.partitions.get_mut(tp) {
            p.inflight = false;
            if let Some(node) = p.fetching_from.take() {
                tracing::debug!(%tp, node, "fetch from follower failed; back to the leader");
                p.back_to_leader(now, cooldown);
                return;
            }
            p.backoff_until = Some(now + self.retry_backoff);
        }
    }

    /// The partition was planned but the driver did not send it (e.g. the fetch was cancelled).
    pub(crate) fn handle_unplanned(&mut self, tp: &TopicPartition) {
        if let Some(p) = self.partitions.get_mut(tp) {
            p.inflight = false;
            p.fetching_from = None;
        }
    }

    /// A Fetch answer for `tp` that was sent at `fetch_offset`.
    pub(crate) fn handle_fetched(
        &mut self,
        now: Instant,
        tp: &TopicPartition,
        fetch_offset: i64,
        f: &Fetched,
    ) -> Outcome {
        let reset = self.reset;
        let backoff = self.retry_backoff;
        let limits = self.follower;
        let Some(p) = self.partitions.get_mut(tp) else {
            return Outcome::Stale;
        };
        p.inflight = false;
        let follower = p.fetching_from.take();
        if p.position != Some(fetch_offset) {
            return Outcome::Stale;
        }
        if let Some(node) = follower {
            if !f.error.is_ok() {
                // The leader judges: an out-of-range offset (or any error) from a follower is asked of
                // it before the reset policy acts.
                tracing::debug!(%tp, node, error = %f.error, "follower refused the fetch; back to the leader");
                p.back_to_leader(now, limits.cooldown);
                return Outcome::Retry;
            }
            let progressed = f.next_offset > fetch_offset || f.diverging.is_some();
            if let Some(r) = p.read_replica.as_mut() {
                if progressed {
                    r.progress_at = now;
                } else if now.duration_since(r.progress_at) >= limits.idle {
                    tracing::debug!(%tp, node, "follower delivered nothing for a while; back to the leader");
                    p.back_to_leader(now, limits.cooldown);
                }
            }
        } else if f.error.is_ok() && f.preferred_read_replica >= 0 {
            let cooling = p.leader_only_until.is_some_and(|t| now < t);
            if !cooling && p.read_replica.map(|r| r.node) != Some(f.preferred_read_replica) {
                tracing::debug!(%tp, node = f.preferred_read_replica, "the leader names a replica in this rack; fetching from it");
                p.read_replica = Some(ReadReplica {
                    node: f.preferred_read_replica,
                    progress_at: now,
                });
            }
        }
        match f.error {
            ErrorCode::None => {}
            ErrorCode::OffsetOutOfRange => {
                return match reset {
                    OffsetReset::Fail => {
                        p.failed = true;
                        Outcome::OutOfRange {
                            offset: fetch_offset,
                        }
                    }
                    OffsetReset::Earliest | OffsetReset::Latest => {
                        tracing::warn!(%tp, offset = fetch_offset, policy = ?reset, "fetch offset out of range; resetting");
                        p.position = None;
                        p.last_fetched_epoch = None;
                        p.reset_to = Some(if reset == OffsetReset::Earliest {
                            EARLIEST_TIMESTAMP
                        } else {
                            LATEST_TIMESTAMP
                        });
                        Outcome::Reset
                    }
                };
            }
            ErrorCode::UnknownTopicId | ErrorCode::InconsistentTopicId => {
                // The id we sent is not the one the broker has for this partition (Fetch v13+): the
                // metadata refresh brings the current id, unless the topic is gone for good.
                p.topic_id_errors += 1;
                p.backoff_until = Some(now + backoff);
                if p.topic_id_errors >= TOPIC_ID_ERROR_LIMIT {
                    p.topic_id_errors = 0;
                    return Outcome::Fatal(f.error);
                }
                return Outcome::RefreshLeader;
            }
            ErrorCode::NotLeaderOrFollower
            | ErrorCode::FencedLeaderEpoch
            | ErrorCode::LeaderNotAvailable
            | ErrorCode::UnknownTopicOrPartition
            | ErrorCode::KafkaStorageError
            | ErrorCode::ReplicaNotAvailable
            | ErrorCode::OffsetNotAvailable => {
                p.backoff_until = Some(now + backoff);
                return Outcome::RefreshLeader;
            }
            ErrorCode::UnknownLeaderEpoch => {
                // The broker has not caught up with the epoch our metadata has; ask again shortly.
                p.backoff_until = Some(now + backoff);
                return Outcome::Retry;
            }
            e if e.is_retriable() => {
                p.backoff_until = Some(now + backoff);
                return Outcome::Retry;
            }
            e => return Outcome::Fatal(e),
        }
        p.topic_id_errors = 0;
        p.high_watermark = Some(f.high_watermark);
        if f.last_stable_offset >= 0 {
            p.last_stable_offset = Some(f.last_stable_offset);
        }
        if f.log_start_offset >= 0 {
            p.log_start_offset = Some(f.log_start_offset);
        }
        if let Some((epoch, end)) = f.diverging {
            let from = fetch_offset;
            let to = end.min(fetch_offset);
            tracing::warn!(%tp, from, to, epoch, "log diverged after a leader change; moving the position back");
            p.position = Some(to);
            p.last_fetched_epoch = Some(epoch);
            return Outcome::Truncated { from, to };
        }
        if f.next_offset > fetch_offset {
            p.position = Some(f.next_offset);
            if let Some(e) = f.last_batch_epoch {
                p.last_fetched_epoch = Some(e);
            }
        }
        Outcome::Deliver
    }

    /// A ListOffsets answer for a pending reset of `tp`.
    pub(crate) fn handle_listed(
        &mut self,
        now: Instant,
        tp: &TopicPartition,
        error: ErrorCode,
        offset: i64,
        leader_epoch: i32,
    ) -> Outcome {
        let backoff = self.retry_backoff;
        let Some(p) = self.partitions.get_mut(tp) else {
            return Outcome::Stale;
        };
        p.inflight = false;
        if p.position.is_some() {
            return Outcome::Stale;
        }
        match error {
            ErrorCode::None if offset >= 0 => {
                p.position = Some(offset);
                p.reset_to = None;
                p.last_fetched_epoch = (leader_epoch >= 0).then_some(leader_epoch);
                Outcome::Deliver
            }
            ErrorCode::None => {
                p.backoff_until = Some(now + backoff);
                Outcome::Retry
            }
            ErrorCode::NotLeaderOrFollower
            | ErrorCode::FencedLeaderEpoch
            | ErrorCode::LeaderNotAvailable
            | ErrorCode::UnknownTopicOrPartition
            | ErrorCode::ReplicaNotAvailable
            | ErrorCode::OffsetNotAvailable => {
                p.backoff_until = Some(now + backoff);
                Outcome::RefreshLeader
            }
            e if e.is_retriable() => {
                p.backoff_until = Some(now + backoff);
                Outcome::Retry
            }
            e => Outcome::Fatal(e),
        }
    }

    /// The earliest backoff that ends after `now`, so a caller with nothing to fetch knows when to
    /// look again.
    pub(crate) fn poll_timeout(&self, now: Instant) -> Option<Instant> {
        self.partitions
            .values()
            .filter_map(|p| p.backoff_until)
            .filter(|t| *t > now)
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(p: i32) -> TopicPartition {
        TopicPartition::new("t", p)
    }

    fn ok(next: i64, hw: i64) -> Fetched {
        Fetched {
            error: ErrorCode::None,
            high_watermark: hw,
            last_stable_offset: hw,
            log_start_offset: 0,
            next_offset: next,
            last_batch_epoch: Some(3),
            diverging: None,
            preferred_read_replica: -1,
        }
    }

    fn fetcher(reset: OffsetReset) -> Fetcher {
        Fetcher::new(reset, Duration::from_millis(100))
    }

    /// Partitions are grouped by leader, with the leader epoch from metadata, and one fetch per
    /// partition is in flight at a time.
    #[test]
    fn plans_by_leader_one_inflight_per_partition() {
        let now = Instant::now();
        let mut f = fetcher(OffsetReset::Fail);
        for p in 0..4 {
            f.assign(tp(p), StartAt::Offset(10 * p as i64));
        }
        let leaders = |t: &TopicPartition| Some((t.partition % 2, 5));
        let plan = f.poll_plan(now, leaders);
        assert_eq!(plan.fetch.len(), 2);
        assert_eq!(
            plan.fetch[&0]
                .iter()
                .map(|p| p.tp.partition)
                .collect::<Vec<_>>(),
            vec![0, 2]
        );
        assert_eq!(plan.fetch[&1][1].fetch_offset, 30);
        assert!(plan.fetch[&1]
            .iter()
            .all(|p| p.current_leader_epoch == 5 && p.last_fetched_epoch == -1));
        assert_eq!(f.poll_plan(now, leaders), Plan::default(), "all in flight");
        assert_eq!(
            f.handle_fetched(now, &tp(0), 0, &ok(4, 9)),
            Outcome::Deliver
        );
        assert_eq!(f.position(&tp(0)), Some(4));
        let plan = f.poll_plan(now, leaders);
        assert_eq!(plan.fetch[&0][0].fetch_offset, 4);
        assert_eq!(plan.fetch[&0][0].last_fetched_epoch, 3);
    }

    /// An answer for an offset the application has since moved away from is dropped.
    #[test]
    fn stale_answers_are_dropped() {
        let now = Instant::now();
        let mut f = fetcher(OffsetReset::Fail);
        f.assign(tp(0), StartAt::Offset(0));
        f.poll_plan(now, |_| Some((1, 0)));
        f.seek(&tp(0), StartAt::Offset(100));
        assert_eq!(
            f.handle_fetched(now, &tp(0), 0, &ok(50, 60)),
            Outcome::Stale
        );
        assert_eq!(f.position(&tp(0)), Some(100));
    }

    /// OFFSET_OUT_OF_RANGE with the Fail policy stops the partition until a seek; never a silent reset.
    #[test]
    fn out_of_range_fail_policy_stops_until_seek() {
        let now = Instant::now();
        let mut f = fetcher(OffsetReset::Fail);
        f.assign(tp(0), StartAt::Offset(500));
        f.poll_plan(now, |_| Some((1, 0)));
        let mut e = ok(0, 10);
        e.error = ErrorCode::OffsetOutOfRange;
        assert_eq!(
            f.handle_fetched(now, &tp(0), 500, &e),
            Outcome::OutOfRange { offset: 500 }
        );
        assert_eq!(f.position(&tp(0)), Some(500));
        assert_eq!(f.poll_plan(now, |_| Some((1, 0))), Plan::default());
        f.seek(&tp(0), StartAt::Offset(3));
        assert_eq!(
            f.poll_plan(now, |_| Some((1, 0))).fetch[&1][0].fetch_offset,
            3
        );
    }

    /// OFFSET_OUT_OF_RANGE with a reset policy lists the offset and continues from it.
    #[test]
    fn out_of_range_resets_by_policy() {
        for (policy, ts) in [
            (OffsetReset::Earliest, EARLIEST_TIMESTAMP),
            (OffsetReset::Latest, LATEST_TIMESTAMP),
        ] {
            let now = Instant::now();
            let mut f = fetcher(policy);
            f.assign(tp(0), StartAt::Offset(500));
            f.poll_plan(now, |_| Some((1, 0)));
            let mut e = ok(0, 10);
            e.error = ErrorCode::OffsetOutOfRange;
            assert_eq!(f.handle_fetched(now, &tp(0), 500, &e), Outcome::Reset);
            assert_eq!(f.position(&tp(0)), None);
            let plan = f.poll_plan(now, |_| Some((1, 4)));
            assert!(plan.fetch.is_empty());
            assert_eq!(
                plan.list[&1],
                vec![ListPartition {
                    tp: tp(0),
                    timestamp: ts,
                    current_leader_epoch: 4
                }]
            );
            assert_eq!(
                f.handle_listed(now, &tp(0), ErrorCode::None, 7, 4),
                Outcome::Deliver
            );
            assert_eq!(f.position(&tp(0)), Some(7));
        }
    }

    /// A leader error backs off only that partition and asks for a metadata refresh.
    #[test]
    fn leader_errors_back_off_one_partition() {
        for code in [ErrorCode::NotLeaderOrFollower, ErrorCode::FencedLeaderEpoch] {
            let now = Instant::now();
            let mut f = fetcher(OffsetReset::Fail);
            f.assign(tp(0), StartAt::Offset(0));
            f.assign(tp(1), StartAt::Offset(0));
            f.poll_plan(now, |_| Some((1, 0)));
            let mut e = ok(0, 0);
            e.error = code;
            assert_eq!(f.handle_fetched(now, &tp(0), 0, &e), Outcome::RefreshLeader);
            assert_eq!(
                f.handle_fetched(now, &tp(1), 0, &ok(2, 2)),
                Outcome::Deliver
            );
            let plan = f.poll_plan(now, |_| Some((2, 1)));
            assert_eq!(
                plan.fetch[&2].len(),
                1,
                "only the healthy partition: {plan:?}"
            );
            assert_eq!(plan.fetch[&2][0].tp, tp(1));
            let plan = f.poll_plan(now + Duration::from_millis(100), |_| Some((2, 1)));
            assert_eq!(
                plan.fetch[&2][0].tp,
                tp(0),
                "after the backoff, at the new leader"
            );
            assert_eq!(plan.fetch[&2][0].current_leader_epoch, 1);
            assert_eq!(
                f.position(&tp(0)),
                Some(0),
                "errors never move the position"
            );
        }
    }

    /// A diverging epoch (the new leader's log is shorter) moves the position back to the divergence
    /// point and reports the truncation; nothing from that answer is delivered.
    #[test]
    fn diverging_epoch_moves_position_back() {
        let now = Instant::now();
        let mut f = fetcher(OffsetReset::Fail);
        f.assign(tp(0), StartAt::Offset(0));
        f.poll_plan(now, |_| Some((1, 3)));
        f.handle_fetched(now, &tp(0), 0, &ok(100, 100));
        f.poll_plan(now, |_| Some((2, 4)));
        let mut d = ok(100, 90);
        d.diverging = Some((3, 90));
        assert_eq!(
            f.handle_fetched(now, &tp(0), 100, &d),
            Outcome::Truncated { from: 100, to: 90 }
        );
        assert_eq!(f.position(&tp(0)), Some(90));
        let plan = f.poll_plan(now, |_| Some((2, 4)));
        assert_eq!(plan.fetch[&2][0].last_fetched_epoch, 3);
    }

    /// A topic-id error asks for a metadata refresh, and reaches the application only once it
    /// persists; a good answer in between starts the count again.
    #[test]
    fn persistent_topic_id_errors_become_fatal() {
        let mut now = Instant::now();
        let mut f = fetcher(OffsetReset::Fail);
        f.assign(tp(0), StartAt::Offset(0));
        let mut round = |f: &mut Fetcher, error: ErrorCode| {
            now += Duration::from_secs(1);
            let plan = f.poll_plan(now, |_| Some((1, 0)));
            assert_eq!(plan.fetch[&1].len(), 1, "fetched again after the backoff");
            let mut a = ok(0, 0);
            a.error = error;
            f.handle_fetched(now, &tp(0), 0, &a)
        };
        for _ in 0..TOPIC_ID_ERROR_LIMIT - 1 {
            let outcome = round(&mut f, ErrorCode::InconsistentTopicId);
            assert_eq!(outcome, Outcome::RefreshLeader);
        }
        assert_eq!(round(&mut f, ErrorCode::None), Outcome::Deliver);
        for i in 1..=TOPIC_ID_ERROR_LIMIT {
            let outcome = round(&mut f, ErrorCode::UnknownTopicId);
            if i < TOPIC_ID_ERROR_LIMIT {
                assert_eq!(outcome, Outcome::RefreshLeader);
            } else {
                assert_eq!(outcome, Outcome::Fatal(ErrorCode::UnknownTopicId));
            }
        }
        assert_eq!(f.position(&tp(0)), Some(0));
    }

    /// A partition without a known leader is reported so the driver can refresh metadata.
    #[test]
    fn leaderless_partitions_are_reported() {
        let now = Instant::now();
        let mut f = fetcher(OffsetReset::Fail);
        f.assign(tp(0), StartAt::Latest);
        let plan = f.poll_plan(now, |_| None);
        assert_eq!(plan.leaderless, vec![tp(0)]);
        assert!(
            f.poll_plan(now, |_| Some((1, 0))).list.contains_key(&1),
            "not left in flight"
        );
    }

    /// Paused partitions are not fetched; the HW and LSO of the last answer are kept.
    #[test]
    fn paused_and_watermarks() {
        let now = Instant::now();
        let mut f = fetcher(OffsetReset::Fail);
        f.assign(tp(0), StartAt::Offset(0));
        f.poll_plan(now, |_| Some((1, 0)));
        let mut a = ok(5, 12);
        a.last_stable_offset = 7;
        f.handle_fetched(now, &tp(0), 0, &a);
        assert_eq!(
            (f.high_watermark(&tp(0)), f.last_stable_offset(&tp(0))),
            (Some(12), Some(7))
        );
        f.set_paused(&tp(0), true);
        assert_eq!(f.poll_plan(now, |_| Some((1, 0))), Plan::default());
        f.set_paused(&tp(0), false);
        assert_eq!(
            f.poll_plan(now, |_| Some((1, 0))).fetch[&1][0].fetch_offset,
            5
        );
    }

    /// KIP-392: the leader's named replica is fetched from (ListOffsets still go to the leader); a
    /// follower's out-of-range answer goes back to the leader before the reset policy acts; a failed
    /// request to a follower and a follower idle past the limit go back too; and the leader's choice is
    /// ignored until the cooldown ends.
    #[test]
    fn a_named_follower_is_followed_while_it_behaves() {
        let limits = FollowerLimits {
            idle: Duration::from_secs(5),
            cooldown: Duration::from_secs(60),
        };
        let mut f = Fetcher::new(OffsetReset::Earliest, Duration::from_millis(100))
            .with_follower_limits(limits);
        let t0 = Instant::now();
        let leader = |_: &TopicPartition| Some((1, 7));
        f.assign(tp(0), StartAt::Offset(10));
        assert!(f.poll_plan(t0, leader).fetch.contains_key(&1));
        // The leader answers with no records and names broker 2.
        let named = Fetched {
            preferred_read_replica: 2,
            ..ok(10, 50)
        };
        assert_eq!(f.handle_fetched(t0, &tp(0), 10, &named), Outcome::Deliver);
        assert_eq!(f.read_replica(&tp(0)), Some(2));
        let plan = f.poll_plan(t0, leader);
        let sent = &plan.fetch[&2][0];
        assert_eq!(
            (sent.fetch_offset, sent.current_leader_epoch),
            (10, 7),
            "to the follower, with the leader's epoch"
        );
        assert_eq!(
            f.handle_fetched(t0, &tp(0), 10, &ok(20, 50)),
            Outcome::Deliver
        );
        assert_eq!(f.position(&tp(0)), Some(20));

        // Out of range from the follower: no reset, the leader is asked.
        f.poll_plan(t0, leader);
        let oor = Fetched {
            error: ErrorCode::OffsetOutOfRange,
            ..ok(20, 50)
        };
        assert_eq!(f.handle_fetched(t0, &tp(0), 20, &oor), Outcome::Retry);
        assert_eq!(f.position(&tp(0)), Some(20), "the position stands");
        assert_eq!(f.read_replica(&tp(0)), None);
        let plan = f.poll_plan(t0, leader);
        assert!(
            plan.fetch.contains_key(&1) && plan.list.is_empty(),
            "{plan:?}"
        );
        // During the cooldown the leader's choice is not followed.
        assert_eq!(f.handle_fetched(t0, &tp(0), 20, &named), Outcome::Deliver);
        assert_eq!(f.read_replica(&tp(0)), None);
        // After it, it is.
        let later = t0 + Duration::from_secs(61);
        f.poll_plan(later, leader);
        f.handle_fetched(later, &tp(0), 20, &named);
        assert_eq!(f.read_replica(&tp(0)), Some(2));

        // A failed request to the follower: back to the leader at once, no back-off.
        let plan = f.poll_plan(later, leader);
        assert!(plan.fetch.contains_key(&2));
        f.handle_failed(later, &tp(0));
        assert_eq!(f.read_replica(&tp(0)), None);
        assert!(
            f.poll_plan(later, leader).fetch.contains_key(&1),
            "no back-off"
        );

        // A follower that delivers nothing past the idle limit.
        let again = later + Duration::from_secs(61);
        f.handle_fetched(again, &tp(0), 20, &named);
        assert_eq!(f.read_replica(&tp(0)), Some(2));
        f.poll_plan(again, leader);
        assert_eq!(
            f.handle_fetched(again + Duration::from_secs(4), &tp(0), 20, &ok(20, 50)),
            Outcome::Deliver
        );
        assert_eq!(f.read_replica(&tp(0)), Some(2), "idle, not for long yet");
        f.poll_plan(again, leader);
        f.handle_fetched(again + Duration::from_secs(6), &tp(0), 20, &ok(20, 50));
        assert_eq!(f.read_replica(&tp(0)), None, "idle past the limit");

        // A reset goes to the leader even while a follower is named.
        let mut g = Fetcher::new(OffsetReset::Earliest, Duration::from_millis(100));
        g.assign(tp(1), StartAt::Offset(0));
        g.poll_plan(t0, leader);
        g.handle_fetched(t0, &tp(1), 0, &named);
        g.seek(&tp(1), StartAt::Earliest);
        assert_eq!(g.read_replica(&tp(1)), None, "a seek starts over");
    }
}
