//! What a flow's parts share ([`Shared`]): the held lanes, the fence handling, the first failure of a
//! rebalance handler; how a failure of held partitions' work is judged and carried out; and the
//! rebalance listener that acquires and releases partitions. Acquisition itself is in `acquire.rs`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::handle::{PartitionReadiness, Readiness};
use super::lane::{close_lanes, each_lane, flush_lane, FlowLane, Lane, LaneMap};
use super::writer::Sink;
use super::{FlowConfig, FlowError};
use crate::consumer::{GroupMetadataHandle, LostReason, RebalanceListener, TopicPartition};
use crate::net::Client;
use crate::snapshot::error::Response;
use crate::snapshot::fence_core::{FenceCore, Site, Verdict};
use crate::snapshot::fold::Fold;
use crate::snapshot::group_commit::MetadataSource;
use crate::snapshot::shared_log::SharedLogs;

/// What a flow's driver, its rebalance listener and its partitions' tasks share.
pub(super) struct Shared<F: Fold> {
    pub(super) fold: Arc<F>,
    pub(super) client: Client,
    pub(super) config: FlowConfig,
    pub(super) metadata: Mutex<Option<GroupMetadataHandle>>,
    /// Which kind of writer each acquired partition gets, fixed when the flow starts.
    pub(super) sink: Sink,
    /// The held partitions. A plain lock, taken only to look a lane up or insert or remove one.
    pub(super) lanes: Mutex<BTreeMap<i32, Arc<FlowLane<F>>>>,
    /// The first error a rebalance handler hit; the poll loop returns it.
    pub(super) failure: Mutex<Option<FlowError>>,
    /// Input events skipped for having no key.
    pub(super) null_keys: AtomicU64,
    /// The fence handling's decisions and counters (see `fence_core`). A plain lock, never held
    /// across an await.
    pub(super) fence: Mutex<FenceCore>,
    /// The recovery reads of every partition taken over, sharing one Fetch per broker.
    pub(super) recovery_reads: SharedLogs,
    /// The input partitions assigned to this member (held, or being acquired), and whether it has had
    /// an assignment yet: what readiness is judged over.
    pub(super) assigned: Mutex<Assigned>,
    /// Whether the flow is ready, as last judged (see `handle.rs`); lookups' and waiters' view.
    pub(super) ready: tokio::sync::watch::Sender<ReadyState>,
    /// How many assigned partitions were ready when readiness was last published.
    pub(super) ready_partitions: AtomicUsize,
    /// The input topic's partition count at start, for a key's default partition in lookups.
    pub(super) input_partitions: AtomicI32,
    /// What the on-disk state did (`StateConfig::Disk`).
    pub(super) disk_stats: Mutex<super::DiskStats>,
    /// The warm followers of released partitions, by partition (`DiskState::warm_for`).
    #[cfg(feature = "disk-state")]
    pub(super) warm: Mutex<HashMap<i32, tokio::task::JoinHandle<()>>>,
}

/// The flow's readiness as published to handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReadyState {
    Unready,
    Ready,
    /// The flow closed or was dropped: it will never be ready again.
    Closed,
}

/// Publishes [`ReadyState::Closed`] when the flow goes, however it goes (closed, or dropped), so no
/// handle waits for readiness forever.
pub(super) struct MarkClosed<F: Fold>(pub(super) Arc<Shared<F>>);

impl<F: Fold> Drop for MarkClosed<F> {
    fn drop(&mut self) {
        #[cfg(feature = "disk-state")]
        super::local::stop_following_all(&self.0);
        self.0.ready.send_replace(ReadyState::Closed);
        crate::telemetry::flow_readiness(&self.0.config.consumer.group.group_id, false, 0);
    }
}

/// The input partitions assigned to a member, and whether it has had its first assignment.
#[derive(Debug, Default)]
pub(super) struct Assigned {
    pub(super) joined: bool,
    pub(super) partitions: BTreeSet<i32>,
    /// Every input partition assigned (of every input topic).
    pub(super) inputs: BTreeSet<TopicPartition>,
}

impl<F: Fold> Shared<F> {
    fn assigned(&self) -> std::sync::MutexGuard<'_, Assigned> {
        self.assigned.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forgets `partitions` as assigned inputs.
    fn unassign(&self, partitions: &[TopicPartition]) {
        let mut assigned = self.assigned();
        for tp in partitions {
            assigned.inputs.remove(tp);
        }
    }

    /// Each assigned partition's readiness (see `handle.rs`).
    pub(super) fn readiness(&self) -> Readiness {
        let (joined, assigned) = {
            let a = self.assigned();
            (a.joined, a.partitions.clone())
        };
        let partitions = assigned
            .into_iter()
            .map(|p| {
                let lane = self.lanes().get(&p).cloned();
                let readiness = match lane {
                    None => PartitionReadiness::Recovering,
                    Some(lane) => lane.catch_up.check(|| lane.progress()),
                };
                (p, readiness)
            })
            .collect();
        Readiness { joined, partitions }
    }

    /// Judges readiness again and publishes it (the watch, and the gauges) when it changed.
    pub(super) fn refresh_ready(&self) {
        let readiness = self.readiness();
        let ready = readiness.is_ready();
        let now = if ready {
            ReadyState::Ready
        } else {
            ReadyState::Unready
        };
        let changed = self.ready.send_if_modified(|was| {
            // A closed flow stays closed.
            let changed = *was != now && *was != ReadyState::Closed;
            if changed {
                *was = now;
            }
            changed
        });
        let count = readiness.ready_partitions();
        let count_changed = self.ready_partitions.swap(count, Ordering::Relaxed) != count;
        if changed || count_changed {
            crate::telemetry::flow_readiness(&self.config.consumer.group.group_id, ready, count);
        }
        if changed {
            tracing::info!(
                ready,
                partitions = readiness.partitions.len(),
                "flow readiness changed"
            );
        }
    }

    /// The partitions held (recovered; those still recovering are in `assigned`).
    pub(super) fn held_partitions(&self) -> Vec<i32> {
        self.lanes().keys().copied().collect()
    }

    /// The next input offset `partition` will fold, if held.
    pub(super) fn position(&self, partition: i32) -> Option<i64> {
        let lane = self.lanes().get(&partition).cloned()?;
        let position = lane.core().position();
        Some(position)
    }

    /// Every input's next offset in `partition`, if held (in the flow's input order).
    pub(super) fn positions(&self, partition: i32) -> Option<Vec<i64>> {
        let lane = self.lanes().get(&partition).cloned()?;
        let positions = lane.core().positions();
        Some(positions)
    }

    /// A clone of every live key's state in `partition`, if held.
    pub(super) fn partition_state(&self, partition: i32) -> Option<HashMap<Bytes, F::State>> {
        let lane = self.lanes().get(&partition).cloned()?;
        let core = lane.core();
        #[cfg(feature = "disk-state")]
        match core.all_states(&*self.fold) {
            Ok(states) => Some(states),
            Err(e) => {
                let e = super::local::load_failure(partition, e);
                tracing::warn!(partition, error = %e, "the partition's state could not be read from disk");
                None
            }
        }
        #[cfg(not(feature = "disk-state"))]
        Some(core.states().map(|(k, s)| (k.clone(), s.clone())).collect())
    }

    pub(super) fn take_failure(&self) -> Option<FlowError> {
        self.failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    pub(super) fn fail(&self, e: FlowError) {
        let mut f = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_none() {
            *f = Some(e);
        }
    }

    pub(super) fn fence(&self) -> std::sync::MutexGuard<'_, FenceCore> {
        self.fence.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Carries out the fence handling's verdict on each failure of held partitions' work: drops the
    /// lanes to recover in place, drops all of them for a rejoin, and returns the first failure the
    /// verdict says to stop on.
    pub(super) async fn settle(
        &self,
        failures: Vec<(i32, FlowError)>,
        site: Site,
    ) -> Result<(), FlowError> {
        let judged = judge(&self.lanes, &self.fence, failures, site);
        let dropped = !judged.dropped.is_empty();
        close_lanes(judged.dropped).await;
        if dropped {
            self.refresh_ready();
        }
        judged.result
    }

    pub(super) fn lanes(&self) -> std::sync::MutexGuard<'_, BTreeMap<i32, Arc<FlowLane<F>>>> {
        self.lanes.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn all_lanes(&self) -> Vec<Arc<FlowLane<F>>> {
        self.lanes().values().cloned().collect()
    }

    pub(super) fn metadata_handle(&self) -> Option<GroupMetadataHandle> {
        self.metadata
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(super) fn metadata_source(&self) -> Arc<dyn MetadataSource> {
        match self.metadata_handle() {
            Some(h) => Arc::new(h),
            None => Arc::new(|| None),
        }
    }

    /// Drops `partitions`' lanes; with `flush`, first flushes them (as [`flush_lane`]), each on its own,
    /// so one slow partition does not lengthen the others' handover. Then closes their stores.
    pub(super) async fn release(&self, partitions: &[TopicPartition], flush: bool) {
        self.fence()
            .handle_released(partitions.iter().map(|tp| tp.partition));
        {
            let mut assigned = self.assigned();
            for tp in partitions {
                assigned.partitions.remove(&tp.partition);
            }
        }
        self.refresh_ready();
        let lanes: Vec<_> = {
            let mut held = self.lanes();
            partitions
                .iter()
                .filter_map(|tp| held.remove(&tp.partition))
                .collect()
        };
        if flush {
            let fold = Arc::clone(&self.fold);
            let failures = each_lane(
                lanes.clone(),
                self.config.max_concurrent_partitions,
                move |lane| {
                    let fold = Arc::clone(&fold);
                    async move { flush_lane(&*fold, &lane).await }
                },
            )
            .await;
            for (partition, e) in failures {
                let verdict = self
                    .fence()
                    .handle_failure(partition, e.response(), Site::Release);
                match verdict {
                    Verdict::Expected => {
                        tracing::info!(partition, error = %e, "flush on revoke refused; the next owner replays")
                    }
                    _ => {
                        tracing::warn!(partition, error = %e, "flush on revoke failed");
                        self.fail(e);
                    }
                }
            }
        }
        close_lanes(lanes).await;
        #[cfg(feature = "disk-state")]
        if let (true, super::StateConfig::Disk(disk)) = (flush, &self.config.state) {
            // Warm followers bring the images up to date on their own, right away.
            if disk.warm_for.is_zero() {
                let released: Vec<i32> = partitions.iter().map(|tp| tp.partition).collect();
                super::local::catch_up_images(self, disk, &released).await;
            }
        }
    }
}

/// The fence handling's verdict on each failure of `held` lanes' work at `site`, carried out on the
/// lane map: the lanes to drop unflushed (one, to recover in place; all, for a rejoin) are removed
/// from it and returned for closing, with the first failure the verdict says to stop on. Their
/// in-memory state goes with them; the consumer keeps the partitions until the fence handling's plan
/// (before the next poll) acquires them again or forgets them.
pub(super) fn judge<S, W>(
    held: &Mutex<LaneMap<S, W>>,
    fence: &Mutex<FenceCore>,
    failures: Vec<(i32, FlowError)>,
    site: Site,
) -> Judged<S, W> {
    let mut first_err = None;
    let mut drop = Vec::new();
    let mut drop_all = false;
    for (partition, e) in failures {
        let replay = held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&partition)
            .is_some_and(|lane| lane.core().needs_replay());
        let verdict = fence
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .handle_failure(partition, replay_response(e.response(), replay), site);
        match verdict {
            Verdict::Fail => {
                first_err.get_or_insert(e);
            }
            Verdict::DropLane => {
                tracing::info!(partition, error = %e, "commit refused; dropping the partition's state to acquire it again in place");
                drop.push(partition);
            }
            Verdict::DropAll => {
                tracing::warn!(partition, error = %e, "commit refused for the membership or the producer; dropping every partition to rejoin as a new member");
                drop_all = true;
            }
            Verdict::Expected => {
                tracing::info!(partition, error = %e, "flush refused at revocation; the next owner replays");
            }
        }
    }
    let mut held = held.lock().unwrap_or_else(|p| p.into_inner());
    if drop_all {
        drop = held.keys().copied().collect();
    }
    Judged {
        dropped: drop.iter().filter_map(|p| held.remove(p)).collect(),
        result: first_err.map_or(Ok(()), Err),
    }
}

/// The response to a failure of a lane that may need its input replayed: a write carrying outputs
/// that did not land for sure is never retried in place (the outputs may have committed), so a
/// failure that would be retried becomes a recovery in place: the lane is dropped and acquired again,
/// and the replay from the committed offset decides (docs/fencing.md, "Outputs"). A rejoin or a stop
/// stays what it is; a failure that is not a failed commit (a configuration error) still stops.
fn replay_response(response: Option<Response>, replay: bool) -> Option<Response> {
    match response {
        Some(Response::Retry) if replay => Some(Response::RecoverInPlace),
        other => other,
    }
}

/// What [`judge`] decided: the lanes it removed (to close) and what the caller is told.
pub(super) struct Judged<S, W> {
    pub(super) dropped: Vec<Arc<Lane<S, W>>>,
    pub(super) result: Result<(), FlowError>,
}

/// The rebalance listener that builds and tears down partition flows.
pub(super) struct Listener<F: Fold>(pub(super) Arc<Shared<F>>);

impl<F: Fold> RebalanceListener for Listener<F> {
    async fn on_partitions_assigned(&mut self, partitions: &[TopicPartition]) {
        self.0.fence().handle_rebalance();
        {
            let mut assigned = self.0.assigned();
            assigned.joined = true;
            assigned.inputs.extend(partitions.iter().cloned());
            // A partition counts once every input's partition of its number is here.
            let complete: Vec<i32> = partitions
                .iter()
                .map(|tp| tp.partition)
                .filter(|p| {
                    self.0
                        .input_partitions(*p)
                        .iter()
                        .all(|tp| assigned.inputs.contains(tp))
                })
                .collect();
            assigned.partitions.extend(complete);
        }
        // Unready from here until the new partitions are recovered and caught up.
        self.0.refresh_ready();
        // A partition is taken over once every input's partition of that number is assigned here
        // (with one input, at once). With several, the assignor gives them together; should they
        // arrive one at a time, the first waits for the rest, and no other member can hold them all.
        let new: Vec<TopicPartition> = {
            let lanes = self.0.lanes();
            let assigned = self.0.assigned();
            let numbers: BTreeSet<i32> = partitions.iter().map(|tp| tp.partition).collect();
            numbers
                .into_iter()
                .filter(|p| !lanes.contains_key(p))
                .map(|p| self.0.input_partitions(p))
                .filter(|tps| tps.iter().all(|tp| assigned.inputs.contains(tp)))
                .filter_map(|tps| tps.into_iter().next())
                .collect()
        };
        let mut failures = Vec::new();
        for (tp, outcome) in self.0.acquire_all(new).await {
            match outcome {
                Ok(lane) => {
                    self.0.lanes().insert(tp.partition, Arc::new(lane));
                }
                Err(e) => {
                    tracing::warn!(partition = tp.partition, error = %e, "acquiring a partition failed");
                    failures.push((tp.partition, e));
                }
            }
        }
        // A refused first commit is handled like any refused commit: the partition waits to be
        // acquired again in place (or the member rejoins).
        if !failures.is_empty() {
            if let Err(e) = self.0.settle(failures, Site::Acquire).await {
                self.0.fail(e);
            }
        }
        self.0.refresh_ready();
    }

    /// Synchronous teardown: flush, commit, close, before the group may hand the partition on.
    async fn on_partitions_revoked(&mut self, partitions: &[TopicPartition]) {
        self.0.fence().handle_rebalance();
        self.0.unassign(partitions);
        self.0.release(partitions, true).await;
        self.follow(partitions);
    }

    /// Lost (evicted or fenced): another member may own these already; writing would be fenced (or, in the
    /// unfenced mode, corrupt), so nothing is flushed.
    async fn on_partitions_lost(&mut self, partitions: &[TopicPartition], reason: LostReason) {
        tracing::warn!(
            ?reason,
            ?partitions,
            "partitions lost without revocation; dropping their flows unflushed"
        );
        self.0.fence().handle_rebalance();
        self.0.unassign(partitions);
        self.0.release(partitions, false).await;
        self.follow(partitions);
    }
}

impl<F: Fold> Listener<F> {
    /// Warm takeovers: keeps following the partitions just given up (`DiskState::warm_for`).
    fn follow(&self, partitions: &[TopicPartition]) {
        #[cfg(feature = "disk-state")]
        if let super::StateConfig::Disk(disk) = &self.0.config.state {
            if !disk.warm_for.is_zero() {
                let released: Vec<i32> = partitions.iter().map(|tp| tp.partition).collect();
                super::local::follow_released(&self.0, disk, &released);
            }
        }
        #[cfg(not(feature = "disk-state"))]
        let _ = partitions;
    }
}
