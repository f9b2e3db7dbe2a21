//! The transaction state machine: which request comes next, and what an answer does to the state.
//!
//! Sans-IO: every entry point takes `now` and answers with a [`Step`] (send this request, back off and
//! send it, done, failed); the async driver owns the sockets and the timers. Each user operation (`init`,
//! `send_offsets`, `commit`, `abort`) is a short sequence of steps; enrolling partitions in a TV1
//! transaction runs beside the produce path through [`TxnMachine::poll_add_partitions`].
//!
//! ```text
//!                 init                       begin
//!  Uninitialized ──────▶ Initializing ──ok──▶ Ready ◀──────────────┐
//!        ▲                    │                 │ begin             │ EndTxn ok (TV2: adopt the
//!        └──── timeout ───────┘                 ▼                   │ returned id/epoch); or
//!                                         InTransaction ─commit──▶ Committing ──no answer by
//!                                           │   │   ▲                   │        the deadline──▶ CommitOutcomeUnknown
//!                               produce/    │   │   │ send_offsets      │                         │ commit again ─▶ Committing
//!                               offsets err │   │   └─(stays)           │                         │ init ─▶ Initializing
//!                                           ▼   │ abort                 │
//!                                  AbortableError ──abort──▶ Aborting ──EndTxn ok──▶ Ready
//!                                                                  (TV1 after a sequence/epoch error:
//!                                                                   InitProducerId with current ids
//!                                                                   first, KIP-360)
//!  any state ── fenced / unauthorised / unsupported ──▶ FatalError (terminal)
//!
//!  two-phase commit (KIP-939):  InTransaction ──prepare──▶ Prepared ──commit/abort/complete──▶ Committing / Aborting
//!                               Initializing ──ok, KeepPreparedTxn found one open──▶ Prepared
//! ```
//!
//! Transaction versions:
//! - **TV1**: a partition is enrolled with AddPartitionsToTxn (v3 at most: v4+ is broker-to-broker)
//!   before the first produce to it (Produce at most v11); offsets go through AddOffsetsToTxn then
//!   TxnOffsetCommit (at most v4) to the group coordinator; EndTxn (at most v4). After an abort caused
//!   by a sequence or epoch error, InitProducerId v3+ with the current id and epoch bumps the epoch.
//! - **TV2** (KIP-890 part 2; the broker finalises `transaction.version` >= 2 and supports Produce v12,
//!   TxnOffsetCommit v5, EndTxn v5): Produce v12 enrols its partition itself; TxnOffsetCommit v5 needs
//!   no AddOffsetsToTxn; EndTxn v5 bumps the epoch on every transaction and answers with the id and epoch
//!   the producer continues with (its sequences restart at 0).
//!
//! With either version an EndTxn is skipped when nothing of the transaction reached a broker: the
//! coordinator does not know the transaction, and under TV2 nothing would be fenced by a bump.
//!
//! A commit that was sent and never answered is *outcome unknown*: the transaction may be committed.
//! Aborting it is refused (the commit could still land, and an abort would only mislead the caller);
//! the caller retries the commit (the coordinator answers a retry of a finished commit with success) or
//! re-initialises (InitProducerId completes or aborts whatever is pending), and learns the outcome by
//! reading.
//!
//! With two-phase commit (`TransactionalConfig::two_phase_commit`) every InitProducerId is v6 with
//! `Enable2Pc`; `prepare` moves a flushed TV2 transaction to `Prepared`, which takes only commit or
//! abort; an init with `KeepPreparedTxn` that finds a transaction open lands there too, holding the
//! predecessor's ids as the transaction's name (see `producer::two_phase`).
//!
//! The files: `machine.rs` is the machine; `state.rs` its one state enum, whose variants carry what
//! is valid only in them (the producer id from the first init on, the open transaction's
//! bookkeeping, the operation under way with its deadline, the cause of an error state), so no state
//! can lack what it needs; `version.rs` decides TV1 or TV2 from the broker's capabilities and caps
//! the transactional requests' versions; `request.rs` holds the requests, answers and steps traded
//! with the driver. Retry delays come from [`crate::net::Backoff`], the crate's one back-off;
//! `tests.rs` drives it all without a broker.
//!
//! # References
//! - KIP-98 (transactions), KIP-360 (InitProducerId v3 epoch bump), KIP-447 (TxnOffsetCommit v3 group
//!   metadata), KIP-588 (recovering from transaction timeouts), KIP-890 parts 1 and 2, KIP-939 (2PC)
//! - Message specs: InitProducerId v0-6, AddPartitionsToTxn v0-5, AddOffsetsToTxn v0-4,
//!   TxnOffsetCommit v0-5, EndTxn v0-5, Produce v3-13

mod machine;
mod request;
mod state;
mod version;

pub(crate) use machine::TxnMachine;
pub(crate) use request::{Coordinator, Step, TxnRequest, TxnResponse};
pub(crate) use version::{BrokerCaps, TxnVersion};

/// Where a transactional producer stands. [`TransactionState::name`] is what error messages print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TransactionState {
    /// `init` has not completed.
    Uninitialized,
    /// InitProducerId is under way (first init, re-init, or the epoch bump after an abort).
    Initializing,
    /// Initialised, no transaction open.
    Ready,
    /// A transaction is open.
    InTransaction,
    /// EndTxn(commit) is under way.
    Committing,
    /// EndTxn(abort) is under way.
    Aborting,
    /// The transaction cannot commit; only `abort` is accepted.
    AbortableError,
    /// The producer is unusable.
    FatalError,
    /// A commit was sent and never answered: retry the commit or re-initialise; never abort.
    CommitOutcomeUnknown,
    /// Two-phase commit: the transaction is prepared and waits for the outside decision (commit,
    /// abort or complete).
    Prepared,
}

impl TransactionState {
    /// A lower-case name for messages.
    pub fn name(self) -> &'static str {
        match self {
            TransactionState::Uninitialized => "uninitialized",
            TransactionState::Initializing => "initializing",
            TransactionState::Ready => "ready",
            TransactionState::InTransaction => "in a transaction",
            TransactionState::Committing => "committing",
            TransactionState::Aborting => "aborting",
            TransactionState::AbortableError => "in an abortable error",
            TransactionState::FatalError => "in a fatal error",
            TransactionState::CommitOutcomeUnknown => "waiting on a commit of unknown outcome",
            TransactionState::Prepared => "holding a prepared transaction",
        }
    }
}

#[cfg(test)]
mod tests;
