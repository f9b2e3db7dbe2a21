//! Snapshots in PostgreSQL, under the same generation fence (the `postgres` feature).
//!
//! The snapshot topic's guarantee, carried to a table: a stale owner's late write never lands. Every
//! flush of a partition is two transactions bound by Kafka's two-phase commit (KIP-939):
//!
//! 1. **Kafka, prepared.** A transaction of the partition's 2PC producer (`<prefix>-<partition>`, as for
//!    the topic store) carrying only the TxnOffsetCommit of the committable input offset with the
//!    consumer's live group metadata: the group coordinator's generation fence. `prepare` flushes it and
//!    names it (producer id and epoch).
//! 2. **PostgreSQL.** One transaction: a compare-and-set on the partition's fencing row (its
//!    `owner_epoch` must still be the one this store took over with; the update holds the row's lock),
//!    recording the offset and the prepared Kafka transaction's name, then the snapshot rows.
//!    `COMMIT`.
//! 3. **Kafka, committed.** EndTxn(commit) of the prepared transaction.
//!
//! A takeover inits the producer (fencing the previous one; asking to keep a prepared transaction),
//! bumps the fencing row's epoch (waiting for the lock a stale flush holds, if one is mid-way), then
//! resolves whatever Kafka kept by what PostgreSQL recorded: commit if the row names it, abort
//! otherwise. Kafka 4.4.0 refuses to keep a prepared transaction (KAFKA-20739): the init then aborts it,
//! and the offset the fencing row recorded, committed with the rows, is the one the partition resumes
//! from. docs/fencing.md walks through every interleaving.
//!
//! A flow with several co-partitioned inputs ([`PgSnapshotStore::acquire_inputs`]) commits every
//! input's offset in step 1's one TxnOffsetCommit, records them all on the fencing row
//! (`input_offsets`) in step 2, and resumes each input at the later of the row's offset and the
//! group's (docs/fencing.md, "Several inputs on the PostgreSQL store").
//!
//! # Outputs
//!
//! A flush can carry outputs (what a [`Fold`](super::Fold) emitted): they are produced in the prepared
//! Kafka transaction of step 1, after the offset commit, whose metadata names the flush
//! (`snapfence-flush <owner epoch>.<n>`), and step 2 keeps them in `<table_prefix>_outputs`, replacing
//! the previous flush's. Kafka then commits them with the offset or not at all. The one gap is the one
//! the rows have too: the rows committed and the Kafka side was aborted by a takeover (4.4.0 cannot
//! keep it). The takeover closes it: when the group's committed offset metadata does not name the flush
//! whose outputs PostgreSQL holds, that flush never committed in Kafka, and the new owner sends its
//! outputs again in its first flush (which [`PgSnapshotStore::kafka_behind`] asks for). A prepared
//! transaction never times out: until a takeover, a dead owner's prepared outputs hold back the LSO of
//! every output partition they went to, other producers' data included (docs/fencing.md).
//!
//! [`PgSnapshotStore`] is one partition's store; a [`Flow`](super::Flow) uses it when
//! [`FlowConfig::postgres`](super::FlowConfig) is set.
//!
//! # References
//! - KIP-939 (two-phase commit participation), KIP-447 (generation-fenced TxnOffsetCommit)
//! - Seed 002, "Exactly-once into a database": database-side fencing with a compare-and-set

mod plain;
mod reset;
mod sql;
mod store;

use std::sync::Arc;
use std::time::Duration;

pub(crate) use plain::PgPlainWriter;
pub use reset::{
    inspect_partition, reset_partition, reset_partition_inputs, PgPartitionReset, PgPartitionView,
};
pub(crate) use store::Position;
pub use store::{KafkaPrepared, PgSnapshotStore, RowsCommitted, RowsWritten};

/// Where and how snapshots are kept in PostgreSQL.
#[derive(Clone)]
#[non_exhaustive]
pub struct PgStoreConfig {
    /// A connection string tokio-postgres accepts: a URL (`postgres://user:pass@host:5432/db`) or
    /// key-value pairs (`host=... user=...`). Plaintext: the feature links no TLS library.
    pub url: String,
    /// The tables are `<table_prefix>_snapshots`, `<table_prefix>_owners` and `<table_prefix>_outputs`. A plain identifier
    /// (`[a-z_][a-z0-9_]*`, at most 40 characters). Default `snapfence`.
    pub table_prefix: String,
    /// Create the tables when they are missing. Default `true`; without it a missing table fails the
    /// acquisition.
    pub create_tables: bool,
    /// How long connecting may take. Default 10 s.
    pub connect_timeout: Duration,
}

impl PgStoreConfig {
    /// Defaults for the database at `url`.
    pub fn new(url: impl Into<String>) -> Self {
        PgStoreConfig {
            url: url.into(),
            table_prefix: "snapfence".into(),
            create_tables: true,
            connect_timeout: Duration::from_secs(10),
        }
    }

    /// The SQL that creates the store's two tables (`CREATE TABLE IF NOT EXISTS`), for an operator who
    /// creates them ahead and runs with [`create_tables`](Self::create_tables) off. `None` when
    /// `table_prefix` is not a plain identifier.
    pub fn schema_sql(&self) -> Option<String> {
        sql::valid_prefix(&self.table_prefix)
            .then(|| sql::Statements::new(&self.table_prefix).create)
    }

    pub(crate) fn validate(&self) -> Result<(), super::SnapshotError> {
        if !sql::valid_prefix(&self.table_prefix) {
            return Err(super::SnapshotError::Config(format!(
                "table_prefix {:?} is not a plain identifier ([a-z_][a-z0-9_]*, at most 40 characters)",
                self.table_prefix
            )));
        }
        Ok(())
    }
}

impl std::fmt::Debug for PgStoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStoreConfig")
            .field("url", &redacted(&self.url))
            .field("table_prefix", &self.table_prefix)
            .field("create_tables", &self.create_tables)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

/// The URL with any password replaced, for logs and `Debug`.
fn redacted(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://") {
        if let Some((auth, host)) = rest.split_once('@') {
            if let Some((user, _)) = auth.split_once(':') {
                return format!("{scheme}://{user}:***@{host}");
            }
        }
        return url.to_owned();
    }
    // key=value form: hide the password's value.
    url.split_whitespace()
        .map(|kv| match kv.split_once('=') {
            Some(("password", _)) => "password=***".to_owned(),
            _ => kv.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// What went wrong with PostgreSQL. Carried by
/// [`SnapshotError::Store`](super::SnapshotError::Store) together with the failure's kind.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum PgError {
    /// Connecting failed or took longer than `connect_timeout`.
    #[error("connecting to PostgreSQL at {url}: {reason}")]
    Connect {
        /// The connection string, password hidden.
        url: String,
        /// Why.
        reason: String,
    },
    /// A statement failed; `step` says which part of the protocol it belonged to.
    #[error("PostgreSQL {step}: {source}")]
    Statement {
        /// The step: `create tables`, `takeover`, `record the flush`, `write snapshots`, `commit`, ...
        step: &'static str,
        /// tokio-postgres's error.
        #[source]
        source: Arc<tokio_postgres::Error>,
    },
    /// The fencing row's epoch moved on: a newer owner took the partition over after this store did.
    /// The flush's PostgreSQL transaction was rolled back and its Kafka transaction aborted; nothing
    /// of it landed.
    #[error("stale owner: the fencing row of partition {partition} is at owner epoch {current:?}, this store took over at {ours}")]
    Fenced {
        /// The partition.
        partition: i32,
        /// The epoch this store took over with.
        ours: i64,
        /// The row's epoch now (`None`: the row is gone).
        current: Option<i64>,
    },
    /// The connection's background task ended (the server closed it, or the task panicked).
    #[error("the PostgreSQL connection is gone: {0}")]
    ConnectionLost(String),
    /// The table prefix is not a plain identifier, so it cannot be spliced into a statement.
    #[error(
        "table prefix {0:?} is not a plain identifier ([a-z_][a-z0-9_]*, at most 40 characters)"
    )]
    InvalidTablePrefix(String),
    /// A reset names another number of input offsets than the partition's fencing row or one of its
    /// snapshot rows accounts for (a flow's inputs are all reset together). Nothing was changed.
    #[error(
        "partition {partition}: {what} accounts for {recorded} input topic(s), and the reset names {named}"
    )]
    InputCount {
        /// The partition.
        partition: i32,
        /// `the fencing row`, or `the snapshot row of key ...`.
        what: String,
        /// How many inputs it accounts for.
        recorded: usize,
        /// How many offsets the reset named.
        named: usize,
    },
    /// A row PostgreSQL returned does not hold what the store wrote (a prepared-transaction name that
    /// does not parse).
    #[error("unexpected data in the fencing row of partition {partition}: {detail}")]
    BadRow {
        /// The partition.
        partition: i32,
        /// What is wrong.
        detail: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A PostgreSQL password never appears in Debug output, in URL or key=value form, and a table prefix
    /// that is not a plain identifier is refused.
    #[test]
    fn passwords_never_reach_debug_output() {
        let c = PgStoreConfig::new("postgres://app:s3cret@db:5432/x");
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("s3cret") && shown.contains("app:***@db"),
            "{shown}"
        );
        assert_eq!(
            redacted("host=db password=s3cret user=app"),
            "host=db password=*** user=app"
        );
        assert_eq!(redacted("postgres://app@db/x"), "postgres://app@db/x");
        let mut bad = PgStoreConfig::new("x");
        bad.table_prefix = "x; drop table y".into();
        assert!(bad.validate().is_err());
    }
}
