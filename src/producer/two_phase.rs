//! Two-phase commit (KIP-939): the transactional producer as a participant in a commit another system
//! coordinates.
//!
//! A producer built with [`TransactionalConfig::two_phase_commit`](super::TransactionalConfig) asks the
//! coordinator, at `init`, to let its transactions wait for an outside decision (`Enable2Pc`:
//! InitProducerId v6): they never time out, so a transaction can stay open while another store commits
//! its side. [`prepare`](super::TransactionalProducer::prepare) flushes the transaction (records and
//! offsets acknowledged) and returns a [`PreparedTxn`], the transaction's name that the other store
//! records in its own commit. Whoever finishes the transaction later compares: if the other store
//! committed this very `PreparedTxn`, commit; otherwise abort
//! ([`complete`](super::TransactionalProducer::complete)).
//!
//! A new producer of the same transactional id may ask to *keep* a transaction its predecessor prepared
//! (`KeepPreparedTxn`) instead of aborting it, and is told its name
//! ([`init_keeping_prepared`](super::TransactionalProducer::init_keeping_prepared)). Kafka 4.4.0
//! refuses that request (UNSUPPORTED_VERSION, KAFKA-20739); it answers
//! [`TwoPhaseCommitRefusal::KeepPreparedUnsupported`], and the caller's fallback is an ordinary 2PC
//! init, which aborts the predecessor's transaction.
//!
//! The name of a transaction is its producer id and epoch, which identifies one transaction only under
//! transaction version 2, where every transaction ends with a new epoch (KIP-890). `prepare` refuses a
//! transaction version 1 transaction.
//!
//! # References
//! - KIP-939 (participation in 2PC), KIP-890 part 2 (epoch bump per transaction)
//! - InitProducerIdRequest.json v6 in kafka-clients 4.4.0 (`Enable2Pc`, `KeepPreparedTxn`; the version
//!   is marked unstable: brokers advertise it with `unstable.api.versions.enable=true`)

use std::fmt;
use std::str::FromStr;

use super::ProducerIdEpoch;

/// The name of a prepared transaction: the producer id and epoch it runs under. The other store records
/// it with its side of the commit; [`complete`](super::TransactionalProducer::complete) commits the Kafka
/// side only if the recorded name is this transaction's.
///
/// Its text form is `<producer id>:<epoch>` (what [`Display`](fmt::Display) writes and [`FromStr`]
/// reads).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PreparedTxn {
    /// The producer id.
    pub producer_id: i64,
    /// The producer epoch.
    pub producer_epoch: i16,
}

impl From<ProducerIdEpoch> for PreparedTxn {
    fn from(ids: ProducerIdEpoch) -> Self {
        PreparedTxn {
            producer_id: ids.id,
            producer_epoch: ids.epoch,
        }
    }
}

impl fmt::Display for PreparedTxn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.producer_id, self.producer_epoch)
    }
}

/// A [`PreparedTxn`]'s text form did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a prepared transaction (`<producer id>:<epoch>`): {0:?}")]
pub struct ParsePreparedTxnError(String);

impl FromStr for PreparedTxn {
    type Err = ParsePreparedTxnError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ParsePreparedTxnError(s.chars().take(64).collect());
        let (id, epoch) = s.split_once(':').ok_or_else(bad)?;
        let producer_id: i64 = id.parse().map_err(|_| bad())?;
        let producer_epoch: i16 = epoch.parse().map_err(|_| bad())?;
        if producer_id < 0 || producer_epoch < 0 {
            return Err(bad());
        }
        Ok(PreparedTxn {
            producer_id,
            producer_epoch,
        })
    }
}

/// How [`complete`](super::TransactionalProducer::complete) ended the prepared transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Completion {
    /// The other store had committed this transaction: it is committed.
    Committed,
    /// The other store had not: it is aborted.
    Aborted,
}

/// Why the broker or the producer would not run a two-phase commit. See
/// [`ProducerError::TwoPhaseCommitRefused`](super::ProducerError::TwoPhaseCommitRefused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TwoPhaseCommitRefusal {
    /// The transaction coordinator does not speak InitProducerId v6: a broker older than Kafka 4.4, or a
    /// 4.4 broker without `unstable.api.versions.enable=true` (the version is marked unstable there).
    NotSpoken,
    /// The coordinator answered TRANSACTIONAL_ID_AUTHORIZATION_FAILED to a 2PC init. Kafka gives that
    /// answer both when the principal lacks the TWO_PHASE_COMMIT (or WRITE) ACL on the transactional
    /// id and when the broker has `transaction.two.phase.commit.enable=false`; the producer cannot tell
    /// which. [`admin::two_phase_commit_enabled`](crate::admin::two_phase_commit_enabled) reads the
    /// broker's setting, and the snapshot layer uses it to report one of the next two.
    NotAuthorizedOrDisabled,
    /// The principal lacks the TWO_PHASE_COMMIT ACL operation (or WRITE) on the transactional id.
    NotAuthorized,
    /// The broker runs with `transaction.two.phase.commit.enable=false` (the default).
    DisabledOnBroker,
    /// The coordinator refused `KeepPreparedTxn` (UNSUPPORTED_VERSION; Kafka 4.4.0 refuses it in every
    /// case, KAFKA-20739). Nothing was changed; an init without it aborts the transaction instead.
    KeepPreparedUnsupported,
    /// `prepare` on a transaction under transaction version 1, where the producer id and epoch stay the
    /// same from one transaction to the next and so cannot name the prepared one.
    NeedsTransactionVersion2,
    /// A 2PC producer's transactions never time out; a `transaction_timeout` other than the default is
    /// refused, as the Java client refuses `transaction.timeout.ms` with
    /// `transaction.two.phase.commit.enable`.
    TimeoutSet,
}

impl TwoPhaseCommitRefusal {
    /// What to change, in a sentence.
    pub fn remedy(self) -> &'static str {
        match self {
            TwoPhaseCommitRefusal::NotSpoken => {
                "the transaction coordinator does not speak InitProducerId v6 (KIP-939): run Kafka 4.4 or newer with unstable.api.versions.enable=true"
            }
            TwoPhaseCommitRefusal::NotAuthorizedOrDisabled => {
                "refused with TRANSACTIONAL_ID_AUTHORIZATION_FAILED: either the principal lacks the TWO_PHASE_COMMIT (or WRITE) ACL on the transactional id, or the broker has transaction.two.phase.commit.enable=false"
            }
            TwoPhaseCommitRefusal::NotAuthorized => {
                "the principal lacks the TWO_PHASE_COMMIT (or WRITE) ACL operation on the transactional id: grant it"
            }
            TwoPhaseCommitRefusal::DisabledOnBroker => {
                "the broker has transaction.two.phase.commit.enable=false: set it to true on every broker"
            }
            TwoPhaseCommitRefusal::KeepPreparedUnsupported => {
                "the transaction coordinator refuses KeepPreparedTxn (Kafka 4.4.0 always does, KAFKA-20739)"
            }
            TwoPhaseCommitRefusal::NeedsTransactionVersion2 => {
                "two-phase commit needs transaction.version 2 (KIP-890): under version 1 the producer id and epoch do not name one transaction"
            }
            TwoPhaseCommitRefusal::TimeoutSet => {
                "a two-phase-commit producer's transactions never expire: leave transaction_timeout at its default"
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A prepared transaction's "id:epoch" text parses back to the same ids, and any other shape or an
    /// out-of-range number is refused rather than read as some other transaction.
    #[test]
    fn prepared_txn_text_round_trips_and_rejects_garbage() {
        let p = PreparedTxn {
            producer_id: 4_000_000_000,
            producer_epoch: 7,
        };
        assert_eq!(p.to_string(), "4000000000:7");
        assert_eq!("4000000000:7".parse::<PreparedTxn>(), Ok(p));
        for bad in [
            "", "1", "1:", ":2", "a:1", "1:70000", "-1:2", "1:-2", "1:2:3",
        ] {
            assert!(bad.parse::<PreparedTxn>().is_err(), "{bad:?} parsed");
        }
    }
}
