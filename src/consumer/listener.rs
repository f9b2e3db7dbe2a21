//! The rebalance listener: where the application learns which partitions it holds, and where it tears
//! down what it built for a partition before the group may hand that partition to another member.
//!
//! # The contract
//!
//! The handlers run on the poll path, inside the consumer's `poll`, never concurrently
//! with each other or with the application's record processing. The consumer awaits each returned
//! future, and only then lets the group move on:
//!
//! | protocol | revoke handler runs | the group waits for it before |
//! |---|---|---|
//! | classic eager | when a rebalance starts, for every owned partition | this member's JoinGroup, so the round (and any new owner) cannot complete |
//! | classic cooperative | after SyncGroup, for the partitions the new assignment leaves out | the follow-up JoinGroup, the only round that can hand them out |
//! | consumer (KIP-848) | when a heartbeat response leaves partitions out | the heartbeat that acknowledges the revocation, which is what releases them |
//!
//! So while a revoke handler runs, no other member owns the partitions being revoked. During the
//! handler the group metadata for this member is still valid for them: under eager and KIP-848 it is
//! unchanged, under cooperative it is the new generation, which the consumer publishes before calling
//! the handler, so a final commit made from inside the handler is accepted, not spuriously fenced.
//!
//! The one way out is eviction: a handler (or the poll loop) stalling past `max_poll_interval` makes
//! the member leave, and the coordinator may then hand the partitions out. The consumer reports that
//! as [`on_partitions_lost`](RebalanceListener::on_partitions_lost) with
//! [`LostReason::PollIntervalExceeded`], and a commit made with the old metadata is rejected by the
//! coordinator (`ILLEGAL_GENERATION` / `UNKNOWN_MEMBER_ID`), so the stale owner cannot write.
//!
//! # Cancellation
//!
//! If the `poll` future is dropped while a handler runs, the handler's future is dropped with it and
//! the group is not told the revocation is done. The next `poll` calls the handler again with the same
//! partitions. Handlers must therefore tolerate being called twice for the same partitions.

use std::future::Future;

use super::{LostReason, TopicPartition};

/// Callbacks for partition ownership changes. All methods have no-op defaults (lost delegates to
/// revoked, as in Java).
///
/// Implement with `async fn` in the impl block or by returning an `async move` block.
pub trait RebalanceListener: Send {
    /// These partitions are being taken away. The group does not move on until the returned future
    /// completes (see the module docs for exactly what waits). Tear down per-partition state here
    /// and, if needed, make a final commit: it is still accepted.
    fn on_partitions_revoked(
        &mut self,
        partitions: &[TopicPartition],
    ) -> impl Future<Output = ()> + Send {
        let _ = partitions;
        async {}
    }

    /// These partitions are now this member's. Called after any revocation of the same rebalance.
    fn on_partitions_assigned(
        &mut self,
        partitions: &[TopicPartition],
    ) -> impl Future<Output = ()> + Send {
        let _ = partitions;
        async {}
    }

    /// These partitions were taken away without a revocation: the member was fenced or evicted, and
    /// another member may own them already. A commit for them will be refused. The member rejoins
    /// only after the returned future completes.
    fn on_partitions_lost(
        &mut self,
        partitions: &[TopicPartition],
        reason: LostReason,
    ) -> impl Future<Output = ()> + Send {
        let _ = reason;
        self.on_partitions_revoked(partitions)
    }
}

/// The listener that does nothing.
impl RebalanceListener for () {}
