//! Generation-fenced snapshot persistence: group-committed transactional writes, the recovery read with
//! its stall deadline, and the per-key fold runtime.
//!
//! # Where to start
//! 1. Create the input topic, and a snapshot topic with `cleanup.policy=compact` and as many partitions
//!    (or let [`Flow::start`] create it: [`FlowConfig::missing_snapshot_topic`]).
//! 2. Implement [`Fold`] for your per-key state: how an event changes it, and its bytes.
//! 3. Build a [`FlowConfig`] (group, input topic, [`SnapshotConfig`]) and call [`Flow::start`], then
//!    [`Flow::run`] until you stop it. A commit the fence refuses wrote nothing; by default the flow
//!    recovers from it by itself (acquiring the partition again, or rejoining the group as a new
//!    member: [`FencePolicy`]) and counts it in [`Flow::stats`]; with [`FencePolicy::Stop`] it ends
//!    with an error for which [`FlowError::is_fenced`] is true.
//!
//! [`SnapshotStore`] is the layer below `Flow`, for applications that keep their own state and only want
//! fenced snapshot writes of one assigned partition; [`recover`] reads a snapshot partition back.
//!
//! # References
//! - KIP-98 (transactions), KIP-447 (generation-fenced TxnOffsetCommit), KIP-848 (member epoch),
//!   KIP-664 (hanging transactions), KIP-890 (transaction server-side defence)

#[cfg(feature = "disk-state")]
mod checkpoint;
#[cfg(feature = "disk-state")]
mod disk;
mod error;
mod fence_core;
mod flow;
mod fold;
mod fold_core;
mod group_commit;
mod log;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
mod recovery;
mod runner;
mod shared_log;
#[cfg(test)]
mod shared_log_tests;
mod state;
mod store;
mod topic;

#[cfg(feature = "disk-state")]
#[cfg_attr(docsrs, doc(cfg(feature = "disk-state")))]
pub use disk::StateError;
pub use error::{FailureKind, Response, SnapshotError, StallDiagnosis, TxnFailure};
pub use fence_core::{FencePolicy, FlowStats};
pub use flow::{
    DiskState, DiskStats, Flow, FlowClosed, FlowConfig, FlowError, FlowHandle, Lookup, LookupError,
    PartitionReadiness, PersistenceMode, Readiness, StateConfig, StatsHandle,
};
pub use fold::{BoxError, Change, Clock, Fold, Outputs, SystemClock, TimerClock};
pub use fold_core::{open_snapshot_value, ForeignSnapshotValue, InputOffsets, SnapshotValue};
pub use group_commit::{MetadataSource, SnapshotWrite, TryWriteError};
pub use log::PartitionLog;
pub use recovery::{
    read_to_target, recover, LogChunk, LogError, RecoveryConfig, RecoveryStats, SnapshotLog,
};
pub use shared_log::{SharedLogs, SharedPartitionLog};
pub use state::{RecoveredIter, RecoveredState};
pub use store::{Assignment, SnapshotConfig, SnapshotStore};
pub use topic::{MissingSnapshotTopic, SnapshotTopicError};

/// Internals the cargo-fuzz targets drive directly; not part of the public API.
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing {
    use super::fold_core::{envelope, envelope_inputs, grave, grave_inputs};
    use super::{open_snapshot_value, SnapshotValue};

    /// Opens a stored snapshot value; one that opens must be exactly what the runtime would write for
    /// what it says (`Some(false)` otherwise; `None` when it does not open).
    pub fn envelope_round_trips(stored: &[u8]) -> Option<bool> {
        let again = match open_snapshot_value(stored).ok()? {
            SnapshotValue::Live { last_offset, state } => envelope(last_offset, state),
            SnapshotValue::Grave { offset } => grave(offset),
            SnapshotValue::LiveInputs {
                last_offsets,
                state,
            } => envelope_inputs(&last_offsets.iter().collect::<Vec<_>>(), state),
            SnapshotValue::GraveInputs { offsets } => {
                grave_inputs(&offsets.iter().collect::<Vec<_>>())
            }
        };
        Some(again[..] == *stored)
    }
}
