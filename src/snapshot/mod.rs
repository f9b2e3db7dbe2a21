//! Generation-fenced snapshot persistence: group-committed transactional writes, the recovery read with
//! its stall deadline, and the per-key fold runtime.
//!
//! # References
//! - KIP-98 (transactions), KIP-447 (generation-fenced TxnOffsetCommit), KIP-848 (member epoch),
//!   KIP-664 (hanging transactions), KIP-890 (transaction server-side defence)

mod error;
mod flow;
mod group_commit;
mod log;
mod recovery;
mod runner;
mod state;
mod store;

pub use error::{FailureKind, SnapshotError, StallDiagnosis, TxnFailure};
pub use flow::{BoxError, Flow, FlowConfig, FlowError, Fold, PersistenceMode};
pub use group_commit::{
    GroupCommit, MetadataSource, SnapshotWrite, TransactionRunner, TryWriteError, TxnBatch,
};
pub use log::PartitionLog;
pub use recovery::{
    read_to_target, recover, LogChunk, LogError, RecoveryConfig, RecoveryStats, SnapshotLog,
};
pub use state::{RecoveredIter, RecoveredState};
pub use store::{Assignment, SnapshotConfig, SnapshotStore};
