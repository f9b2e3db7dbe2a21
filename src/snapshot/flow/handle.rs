//! What a service asks of a running flow from outside its loop: whether it is ready (readiness), one
//! key's state (lookups), and the fence counters. [`FlowHandle`] is cheap to clone and stays usable
//! while [`Flow::run`](super::Flow::run) owns the flow.
//!
//! # Readiness
//! A held partition is *ready* once it is recovered and its position reached the input's end as it was
//! when the partition was acquired (the high watermark, or the last stable offset when the input is read
//! at read_committed). The flow is ready when the member has had its first assignment and every input
//! partition it is assigned is ready. A partition acquired again (a rebalance that assigns it, a refused
//! commit recovered in place) is not ready until it catches up again, so a Kubernetes readiness probe
//! sees a member as unready exactly while it has state it has not rebuilt. A ready partition that later
//! falls behind a burst of input stays ready: readiness is about recovery, lag is what
//! `snapfence_consumer_lag` measures.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use super::shared::{ReadyState, Shared};
use crate::snapshot::fence_core::FlowStats;
use crate::snapshot::fold::Fold;

/// How far one assigned input partition is on its way to ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PartitionReadiness {
    /// Assigned, and being taken over: its snapshots are being read (or it waits to be acquired
    /// again after a refused commit).
    Recovering,
    /// Recovered, and folding the input that was there when it was acquired.
    CatchingUp {
        /// The next input offset to fold (with several input topics: the sum over them of the next
        /// offset, each counted at most up to its end at acquisition).
        position: i64,
        /// The input's end when the partition was acquired (with several: the sum of their ends);
        /// ready at it.
        target: i64,
    },
    /// Recovered and caught up with the input's end as seen at acquisition.
    Ready,
}

/// A flow's readiness: each assigned input partition's, and the whole flow's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    /// Whether the member has had its first assignment (possibly of no partitions: a group with more
    /// members than partitions). Before it, the flow is not ready.
    pub joined: bool,
    /// Each input partition assigned to this member.
    pub partitions: BTreeMap<i32, PartitionReadiness>,
}

impl Readiness {
    /// Joined, and every assigned partition ready.
    pub fn is_ready(&self) -> bool {
        self.joined
            && self
                .partitions
                .values()
                .all(|p| *p == PartitionReadiness::Ready)
    }

    /// How many assigned partitions are ready.
    pub fn ready_partitions(&self) -> usize {
        self.partitions
            .values()
            .filter(|p| **p == PartitionReadiness::Ready)
            .count()
    }
}

/// One lane's progress towards ready: the input's end at acquisition, and a latch set once the position
/// reached it.
#[derive(Debug)]
pub(super) struct CatchUp {
    target: AtomicI64,
    reached: AtomicBool,
}

impl Default for CatchUp {
    fn default() -> Self {
        CatchUp {
            // Until a target is set, a lane is caught up at any position.
            target: AtomicI64::new(i64::MIN),
            reached: AtomicBool::new(false),
        }
    }
}

impl CatchUp {
    pub(super) fn set_target(&self, target: i64) {
        self.target.store(target, Ordering::Relaxed);
    }

    /// The readiness of a lane at `position` (read only when the latch is not set yet), setting the
    /// latch when it has caught up.
    pub(super) fn check(&self, position: impl FnOnce() -> i64) -> PartitionReadiness {
        if self.reached.load(Ordering::Relaxed) {
            return PartitionReadiness::Ready;
        }
        let (position, target) = (position(), self.target.load(Ordering::Relaxed));
        if position >= target {
            self.reached.store(true, Ordering::Relaxed);
            PartitionReadiness::Ready
        } else {
            PartitionReadiness::CatchingUp { position, target }
        }
    }

    pub(super) fn is_reached(&self) -> bool {
        self.reached.load(Ordering::Relaxed)
    }
}

/// One key's state as a lookup found it in the partition that holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup<S> {
    /// The input partition the key belongs to.
    pub partition: i32,
    /// The key's state, or `None` when the key has none (never seen, or deleted).
    pub state: Option<S>,
    /// The partition's position when the state was read: the state folds every event of the key
    /// before this input offset that the flow has folded (events fetched but not yet folded are not in
    /// it). With several input topics, the sum of their positions (see [`FlowHandle::positions`]).
    pub position: i64,
    /// The group generation (classic protocol) or member epoch (KIP-848) this member held when the
    /// state was read. A lookup that must not be answered by a member that has since lost the
    /// partition compares it with a later lookup's, or with the group's.
    pub generation: i32,
    /// Whether the partition had caught up with the input's end as seen at its acquisition (see
    /// [`PartitionReadiness::Ready`]); a state read before that may be far behind the input.
    pub caught_up: bool,
}

/// Why a lookup found no state to answer with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LookupError {
    /// The key's partition is not held by this member (another member owns it, or it is being
    /// recovered here): ask the owner, or ask again once this member is ready.
    #[error("input partition {partition} is not held by this member")]
    NotHeld {
        /// The key's input partition.
        partition: i32,
    },
    /// The flow has not learned the input topic's partition count, so it cannot tell a key's
    /// partition (use [`FlowHandle::get_in`] with the partition the producer chose).
    #[error("the input topic's partition count is not known")]
    NoPartitionCount,
    /// The key is not in memory and the partition's on-disk state could not be read (the
    /// `disk-state` feature with a memory budget): the flow stops the partition on the same failure.
    #[error("the on-disk state of partition {partition} could not be read: {detail}")]
    Unreadable {
        /// The key's input partition.
        partition: i32,
        /// What failed.
        detail: String,
    },
}

/// The flow a [`FlowHandle`] waited on was closed or dropped before it was ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the flow was closed before it was ready")]
pub struct FlowClosed;

/// A handle on a running flow, for readiness, lookups and counters. Cheap to clone; every method is
/// synchronous and takes only short locks (a lookup locks the key's partition core while it clones the
/// key's state, as long as folding one event).
pub struct FlowHandle<F: Fold> {
    pub(super) shared: Arc<Shared<F>>,
}

impl<F: Fold> Clone for FlowHandle<F> {
    fn clone(&self) -> Self {
        FlowHandle {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<F: Fold> std::fmt::Debug for FlowHandle<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlowHandle")
            .field("input_topic", &self.shared.config.input_topic)
            .finish()
    }
}

impl<F: Fold> FlowHandle<F> {
    /// Each assigned partition's readiness, and whether the member has joined.
    pub fn readiness(&self) -> Readiness {
        self.shared.readiness()
    }

    /// Whether the flow is ready (see [`Readiness::is_ready`]), as last judged: after each poll and
    /// each rebalance handler.
    pub fn is_ready(&self) -> bool {
        *self.shared.ready.borrow() == ReadyState::Ready
    }

    /// Completes once the flow is ready (at once if it is), or fails with [`FlowClosed`] once the flow
    /// is closed or dropped (at once if it is): a waiter never outlives the flow. Readiness moves only
    /// while the flow is being polled ([`Flow::run`](super::Flow::run) or a
    /// [`poll_once`](super::Flow::poll_once) loop). Cancel-safe.
    pub async fn ready(&self) -> Result<(), FlowClosed> {
        let mut rx = self.shared.ready.subscribe();
        let state = rx
            .wait_for(|s| *s != ReadyState::Unready)
            .await
            .map(|s| *s)
            .unwrap_or(ReadyState::Closed);
        match state {
            ReadyState::Ready => Ok(()),
            _ => Err(FlowClosed),
        }
    }

    /// The state of `key`, from the input partition Kafka's default partitioner puts it in (murmur2 of
    /// the key, as the Java producer and snapfence's producer choose): fails with
    /// [`LookupError::NotHeld`] when that partition is not held here. Clones only this key's state.
    pub fn get(&self, key: &[u8]) -> Result<Lookup<F::State>, LookupError> {
        let partitions = self.shared.input_partitions.load(Ordering::Relaxed);
        if partitions <= 0 {
            return Err(LookupError::NoPartitionCount);
        }
        self.get_in(crate::producer::partition_for_key(key, partitions), key)
    }

    /// The state of `key` in input partition `partition`, for input written with a partitioner other
    /// than the default.
    pub fn get_in(&self, partition: i32, key: &[u8]) -> Result<Lookup<F::State>, LookupError> {
        let mut found = self.get_many_in(partition, [key])?;
        Ok(found.remove(0))
    }

    /// The states of `keys`, each from its default partition (as [`get`](Self::get)); a partition's
    /// core is locked once for all of its keys. The answers come in the order of `keys`.
    pub fn get_many<'k>(
        &self,
        keys: impl IntoIterator<Item = &'k [u8]>,
    ) -> Vec<Result<Lookup<F::State>, LookupError>> {
        let partitions = self.shared.input_partitions.load(Ordering::Relaxed);
        let keys: Vec<&[u8]> = keys.into_iter().collect();
        if partitions <= 0 {
            return keys
                .iter()
                .map(|_| Err(LookupError::NoPartitionCount))
                .collect();
        }
        let mut by_partition: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
        for (i, key) in keys.iter().enumerate() {
            let p = crate::producer::partition_for_key(key, partitions);
            by_partition.entry(p).or_default().push(i);
        }
        let mut out: Vec<Option<Result<Lookup<F::State>, LookupError>>> =
            keys.iter().map(|_| None).collect();
        for (partition, indices) in by_partition {
            match self.get_many_in(partition, indices.iter().map(|&i| keys[i])) {
                Ok(found) => {
                    for (i, lookup) in indices.into_iter().zip(found) {
                        out[i] = Some(Ok(lookup));
                    }
                }
                Err(e) => {
                    for i in indices {
                        out[i] = Some(Err(e.clone()));
                    }
                }
            }
        }
        out.into_iter()
            .map(|o| o.unwrap_or(Err(LookupError::NoPartitionCount)))
            .collect()
    }

    /// The states of `keys` in input partition `partition`, read under one lock of its core.
    pub fn get_many_in<'k>(
        &self,
        partition: i32,
        keys: impl IntoIterator<Item = &'k [u8]>,
    ) -> Result<Vec<Lookup<F::State>>, LookupError> {
        let lane = self
            .shared
            .lanes()
            .get(&partition)
            .cloned()
            .ok_or(LookupError::NotHeld { partition })?;
        let generation = self
            .shared
            .metadata_handle()
            .and_then(|h| h.current())
            .map_or(-1, |m| m.generation_id());
        let core = lane.core();
        let position = core.position();
        let caught_up = lane.catch_up.is_reached();
        keys.into_iter()
            .map(|key| {
                #[cfg(feature = "disk-state")]
                let state =
                    core.lookup(&*self.shared.fold, key)
                        .map_err(|e| LookupError::Unreadable {
                            partition,
                            detail: super::local::load_failure(partition, e).to_string(),
                        })?;
                #[cfg(not(feature = "disk-state"))]
                let state = core.state_of(key).cloned();
                Ok(Lookup {
                    partition,
                    state,
                    position,
                    generation,
                    caught_up,
                })
            })
            .collect()
    }

    /// The current state of every live key of `partition`, if held (a clone of the whole partition's
    /// map: prefer [`get`](Self::get) to answer queries).
    pub fn state(&self, partition: i32) -> Option<std::collections::HashMap<Bytes, F::State>> {
        self.shared.partition_state(partition)
    }

    /// The partitions this member holds (recovered; see [`readiness`](Self::readiness) for those still
    /// recovering).
    pub fn partitions(&self) -> Vec<i32> {
        self.shared.held_partitions()
    }

    /// The next input offset `partition` will fold, if held. With several input topics, the sum of
    /// their next offsets (a number that only grows as the partition folds); see
    /// [`positions`](Self::positions).
    pub fn position(&self, partition: i32) -> Option<i64> {
        self.shared.position(partition)
    }

    /// The next offset of each input topic `partition` will fold, if held, in the order
    /// [`FlowConfig::input_topics`](super::FlowConfig::input_topics) lists them.
    pub fn positions(&self, partition: i32) -> Option<Vec<i64>> {
        self.shared.positions(partition)
    }

    /// The stream time `partition` has reached, if held and its fold's timers are on stream time
    /// ([`TimerClock::Stream`](crate::snapshot::TimerClock::Stream)) and an event has shown one.
    pub fn stream_time(&self, partition: i32) -> Option<i64> {
        let lane = self.shared.lanes().get(&partition).cloned()?;
        let st = lane.core().stream_time();
        st
    }

    /// The fence handling's counters, as [`Flow::stats`](super::Flow::stats).
    pub fn stats(&self) -> FlowStats {
        self.shared.fence().stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lane is catching up below its target, ready at it, and stays ready (the latch) when asked
    /// again whatever the position; before a target is set it is ready at any position.
    #[test]
    fn catch_up_latches_at_the_target() {
        let c = CatchUp::default();
        c.set_target(10);
        assert_eq!(
            c.check(|| 4),
            PartitionReadiness::CatchingUp {
                position: 4,
                target: 10
            }
        );
        assert!(!c.is_reached());
        assert_eq!(c.check(|| 10), PartitionReadiness::Ready);
        assert!(c.is_reached());
        assert_eq!(
            c.check(|| panic!("the latch does not read the position")),
            PartitionReadiness::Ready
        );
        assert_eq!(CatchUp::default().check(|| -1), PartitionReadiness::Ready);
    }

    /// Ready means joined and every assigned partition ready; a member assigned nothing is ready once
    /// it has joined.
    #[test]
    fn a_flow_is_ready_when_joined_and_every_partition_is() {
        let mut r = Readiness {
            joined: false,
            partitions: BTreeMap::new(),
        };
        assert!(!r.is_ready());
        r.joined = true;
        assert!(r.is_ready());
        r.partitions.insert(0, PartitionReadiness::Ready);
        r.partitions.insert(1, PartitionReadiness::Recovering);
        assert!(!r.is_ready());
        assert_eq!(r.ready_partitions(), 1);
        r.partitions.insert(1, PartitionReadiness::Ready);
        assert!(r.is_ready());
    }
}
