//! A held partition (a [`Lane`]: its fold core and its writer), the three things done to one (persist a
//! wave, commit its offset, flush it on a handover), and the one fan-out that runs work on many lanes
//! at once.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::task::JoinSet;

use super::merge::Merge;
use super::writer::{Writer, Writes};
use super::FlowError;
use crate::snapshot::error::SnapshotError;
use crate::snapshot::fold::Fold;
use crate::snapshot::fold_core::{Landing, PartitionCore};

/// One held partition: its I/O-free core and its writer. The core's lock is never held across an await;
/// `turn` orders this partition's own waves and commits and is never taken for another partition.
pub(super) struct Lane<S, W> {
    pub(super) partition: i32,
    core: Mutex<PartitionCore<S>>,
    pub(super) writer: W,
    turn: tokio::sync::Mutex<()>,
    /// How far the partition is on its way to ready (see `handle.rs`).
    pub(super) catch_up: super::handle::CatchUp,
    /// Several inputs: their merge into the sequence the core folds. Locked before the core when both
    /// are.
    merge: Option<Mutex<Merge>>,
    /// The inputs' ends at acquisition.
    ends: Mutex<Vec<i64>>,
    /// Several inputs: the consumer has not been moved to where the merge starts yet.
    unsynced: std::sync::atomic::AtomicBool,
}

impl<S, W> Lane<S, W> {
    pub(super) fn new(partition: i32, core: PartitionCore<S>, writer: W) -> Self {
        let merge = (core.input_count() > 1).then(|| Mutex::new(Merge::new(&core.positions())));
        Lane {
            partition,
            core: Mutex::new(core),
            writer,
            turn: tokio::sync::Mutex::new(()),
            catch_up: Default::default(),
            unsynced: std::sync::atomic::AtomicBool::new(merge.is_some()),
            merge,
            ends: Mutex::new(Vec::new()),
        }
    }

    /// Whether the consumer still has to be moved to where this lane's merge starts (once: it says
    /// `true` at most once).
    pub(super) fn take_unsynced(&self) -> bool {
        self.unsynced
            .swap(false, std::sync::atomic::Ordering::Relaxed)
    }

    /// The inputs' ends at acquisition: where the lane is caught up, and (with several inputs) what the
    /// merge waits for before it passes over an input with nothing fetched.
    pub(super) fn set_targets(&self, ends: Vec<i64>) {
        self.catch_up.set_target(ends.iter().sum());
        if let Some(merge) = self.merge.as_ref() {
            let mut merge = merge.lock().unwrap_or_else(|p| p.into_inner());
            for (i, end) in ends.iter().enumerate() {
                merge.handle_end(i, *end);
            }
        }
        *self.ends.lock().unwrap_or_else(|p| p.into_inner()) = ends;
    }

    /// How far the lane is towards its catch-up target: its position with one input; with several,
    /// the sum over inputs of the position capped at that input's end, which reaches the target only
    /// when every input has.
    pub(super) fn progress(&self) -> i64 {
        let ends = self.ends.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let core = self.core();
        if ends.len() < 2 {
            return core.position();
        }
        core.positions()
            .iter()
            .zip(&ends)
            .map(|(p, e)| (*p).min(*e))
            .sum()
    }

    /// The merge of a lane with several inputs (`None` with one).
    pub(super) fn merge(&self) -> Option<std::sync::MutexGuard<'_, Merge>> {
        self.merge
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub(super) fn core(&self) -> std::sync::MutexGuard<'_, PartitionCore<S>> {
        // The core's invariants hold between its method calls, and no user code that could panic runs
        // half-way through one except fold/encode, after which the core is still consistent.
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Reports a wave that never finished (its future was dropped) as failed, so the partition does not
/// wait forever for an outcome: every key it carried stays held and is written again.
struct WaveGuard<'a, S, W> {
    lane: &'a Lane<S, W>,
    id: u64,
    done: bool,
}

impl<S, W> Drop for WaveGuard<'_, S, W> {
    fn drop(&mut self) {
        if !self.done {
            self.lane
                .core()
                .handle_wave_outcome(self.id, Landing::Failed);
        }
    }
}

pub(super) fn landing(result: &Result<(), FlowError>) -> Landing {
    match result {
        Ok(()) => Landing::Landed,
        Err(e) if e.is_fenced() || e.is_producer_fenced() => Landing::Fenced,
        Err(_) => Landing::Failed,
    }
}

/// Writes every key of `lane` changed since its last write, and the tombstones now due: in as many
/// waves as the limit on a wave's keys needs (counted before the first, so events folded meanwhile
/// wait for the next persist).
pub(super) async fn persist_lane<F: Fold, W: Writes>(
    fold: &F,
    lane: &Lane<F::State, W>,
) -> Result<(), FlowError> {
    let _turn = lane.turn.lock().await;
    let waves = lane.core().waves_owed();
    for _ in 0..waves {
        if !write_wave(fold, lane).await? {
            break;
        }
    }
    Ok(())
}

/// Writes the next wave of `lane` (the caller holds its turn); `false` when there was nothing to
/// write.
async fn write_wave<F: Fold, W: Writes>(
    fold: &F,
    lane: &Lane<F::State, W>,
) -> Result<bool, FlowError> {
    // Outputs produced at once since the last wave are confirmed before a write could pass them.
    confirm_outputs(lane).await?;
    let Some(wave) = lane.core().poll_wave(fold) else {
        return Ok(false);
    };
    let mut guard = WaveGuard {
        lane,
        id: wave.id,
        done: false,
    };
    let written = lane.writer.write_all(wave.writes).await;
    guard.done = true;
    let landed = &written.landed;
    lane.core()
        .handle_wave_landings(wave.id, landing(&written.result), |i| {
            landed.get(i).copied().unwrap_or(false)
        });
    written.result.map(|()| true)
}

/// Confirms the outputs `lane` produced at once (the unfenced mode) before a write or commit could pass
/// them; when one was not acknowledged, the partition stops for a replay.
async fn confirm_outputs<S, W: Writes>(lane: &Lane<S, W>) -> Result<(), FlowError> {
    // A lazily loaded partition that could not read its image stopped folding; the failure stops
    // the flow here, before anything is written or committed.
    #[cfg(feature = "disk-state")]
    if let Some(failure) = lane.core().take_load_failure() {
        return Err(super::local::load_failure(lane.partition, failure));
    }
    emit_immediate(lane).await?;
    let confirmed = lane.writer.confirm_outputs().await;
    if confirmed.is_err() {
        lane.core().handle_outputs_lost();
    }
    confirmed
}

/// Produces what `lane`'s core emitted for at once (the unfenced mode) and has not handed out yet;
/// when the producer refuses, the partition stops for a replay (the outputs are gone from memory).
pub(super) async fn emit_immediate<S, W: Writes>(lane: &Lane<S, W>) -> Result<(), FlowError> {
    let outputs = lane.core().take_immediate();
    if outputs.is_empty() {
        return Ok(());
    }
    let sent = lane.writer.emit_now(outputs).await;
    if sent.is_err() {
        lane.core().handle_outputs_lost();
    }
    sent
}

/// Commits `lane`'s committable offset.
pub(super) async fn commit_lane<S, W: Writes>(
    lane: &Lane<S, W>,
    when: CommitWhen,
) -> Result<(), FlowError> {
    let _turn = lane.turn.lock().await;
    confirm_outputs(lane).await?;
    let (offset, inputs, stream_time) = {
        let mut core = lane.core();
        if core.is_fenced() || core.needs_replay() {
            return Ok(());
        }
        let offset = match when {
            CommitWhen::Always => core.committable(),
            CommitWhen::Moved => match core.poll_commit() {
                Some(offset) => offset,
                None => return Ok(()),
            },
        };
        (
            offset,
            core.commit_offsets(offset),
            core.stream_time_at(offset),
        )
    };
    let result = lane.writer.commit_offset(offset, inputs, stream_time).await;
    match landing(&result) {
        Landing::Landed => lane.core().handle_commit_landed(offset),
        Landing::Fenced => lane.core().handle_fenced(),
        Landing::Failed => {}
    }
    result
}

/// Whether [`commit_lane`] commits an offset the group already has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CommitWhen {
    /// Only when the committable offset moved past the last landed commit: the periodic commit. An
    /// idle partition then runs no transaction at all (offset-only transactions on 3.7-3.9's preview
    /// group coordinator are also what sets off KAFKA-17877, docs/reliability.md).
    Moved,
    /// Always: the first commit of a fresh partition (recording its start for the group) and a
    /// handover's flush.
    Always,
}

/// A revocation's or close's flush: persist, commit, and once more if the commit made tombstones due,
/// so deletes are not left as graves for the next owner.
pub(super) async fn flush_lane<F: Fold, W: Writes>(
    fold: &F,
    lane: &Lane<F::State, W>,
) -> Result<(), FlowError> {
    persist_lane(fold, lane).await?;
    let (fenced, offset) = {
        let core = lane.core();
        (core.is_fenced(), core.committable())
    };
    if !fenced {
        tracing::info!(partition = lane.partition, offset, "committing on revoke");
    }
    commit_lane(lane, CommitWhen::Always).await?;
    let due = lane.core().tombstones_due();
    if due {
        persist_lane(fold, lane).await?;
    }
    Ok(())
}

#[cfg(test)]
#[path = "revoke_log_tests.rs"]
mod revoke_log_tests;

/// The held partitions' lanes, by partition.
pub(super) type LaneMap<S, W> = BTreeMap<i32, Arc<Lane<S, W>>>;

/// A flow's lane: the fold's state and the writer of the flow's sink.
pub(super) type FlowLane<F> = Lane<<F as Fold>::State, Writer>;

/// Runs `op` on every item, each on its own task (one per partition, never one per key) and at most
/// `limit` at once, so a slow partition holds up nobody but itself; waits for all of them. Returns
/// every item's outcome with its partition, in the order given; a task that panicked (or was
/// cancelled) is [`SnapshotError::PartitionTask`]. Dropping the future aborts the tasks.
///
/// The flow's only fan-out: persist, commit and flush run it over lanes ([`each_lane`]), and a
/// takeover over the partitions it acquires.
pub(super) async fn fan_out<I, T, Fut>(
    items: Vec<(i32, I)>,
    limit: usize,
    op: impl Fn(I) -> Fut,
) -> Vec<(i32, Result<T, FlowError>)>
where
    T: Send + 'static,
    Fut: Future<Output = Result<T, FlowError>> + Send + 'static,
{
    let permits = Arc::new(tokio::sync::Semaphore::new(limit.max(1)));
    let mut set = JoinSet::new();
    let mut slot = HashMap::with_capacity(items.len());
    let mut partitions = Vec::with_capacity(items.len());
    for (i, (partition, item)) in items.into_iter().enumerate() {
        let permits = Arc::clone(&permits);
        let work = op(item);
        let handle = set.spawn(async move {
            let _permit = permits.acquire_owned().await;
            work.await
        });
        slot.insert(handle.id(), i);
        partitions.push(partition);
    }
    let mut outcomes: Vec<Option<Result<T, FlowError>>> = partitions.iter().map(|_| None).collect();
    while let Some(joined) = set.join_next_with_id().await {
        let (id, outcome) = match joined {
            Ok((id, outcome)) => (id, outcome),
            Err(e) => {
                let id = e.id();
                let partition = slot.get(&id).map_or(-1, |&i| partitions[i]);
                let error = SnapshotError::PartitionTask {
                    partition,
                    source: Arc::new(e),
                };
                (id, Err(error.into()))
            }
        };
        if let Some(&i) = slot.get(&id) {
            outcomes[i] = Some(outcome);
        }
    }
    // Every task is joined exactly once and every id was recorded, so every slot is filled.
    partitions
        .into_iter()
        .zip(outcomes)
        .filter_map(|(partition, outcome)| outcome.map(|o| (partition, o)))
        .collect()
}

/// [`fan_out`] of `op` over `lanes`, keeping only the failures, by partition (the fence handling
/// decides per partition).
pub(super) async fn each_lane<S, W, Fut>(
    lanes: Vec<Arc<Lane<S, W>>>,
    limit: usize,
    op: impl Fn(Arc<Lane<S, W>>) -> Fut,
) -> Vec<(i32, FlowError)>
where
    Fut: Future<Output = Result<(), FlowError>> + Send + 'static,
{
    let items = lanes
        .into_iter()
        .map(|lane| (lane.partition, lane))
        .collect();
    let mut failures: Vec<(i32, FlowError)> = fan_out(items, limit, op)
        .await
        .into_iter()
        .filter_map(|(partition, outcome)| outcome.err().map(|e| (partition, e)))
        .collect();
    failures.sort_by_key(|(p, _)| *p);
    failures
}

/// Closes released or dropped lanes' stores.
pub(super) async fn close_lanes<S>(lanes: Vec<Arc<Lane<S, Writer>>>) {
    for lane in lanes {
        let partition = lane.partition;
        match Arc::try_unwrap(lane) {
            Ok(lane) => lane.writer.close().await,
            Err(_) => tracing::warn!(
                partition,
                "a persist of the released partition is still running; its store closes when it ends"
            ),
        }
    }
}
