//! The unfenced PostgreSQL writer: the flow's `NonTransactional` mode on the PostgreSQL store. Rows are
//! upserted with no fencing row and no Kafka transaction; offsets are committed by the consumer. A stale
//! owner's late write lands, exactly as on the snapshot topic without the fence: it exists to show that,
//! and for users who do not need the fence.

use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::sql::Statements;
use super::store::{connect, create_tables, read_rows, upsert_rows};
use super::{PgError, PgStoreConfig};
use crate::snapshot::error::{FailureKind, SnapshotError};
use crate::snapshot::RecoveredState;

/// One partition's unfenced PostgreSQL writer.
pub(crate) struct PgPlainWriter {
    pg: tokio_postgres::Client,
    lost: Arc<Mutex<Option<String>>>,
    statements: Statements,
    prefix: String,
    partition: i32,
}

impl PgPlainWriter {
    pub(crate) async fn connect(
        config: &PgStoreConfig,
        prefix: &str,
        partition: i32,
    ) -> Result<Self, SnapshotError> {
        config.validate()?;
        let (pg, lost) = connect(config).await.map_err(|e| error(partition, e))?;
        let statements = Statements::new(&config.table_prefix);
        let w = PgPlainWriter {
            pg,
            lost,
            statements,
            prefix: prefix.to_owned(),
            partition,
        };
        if config.create_tables {
            create_tables(&w.pg, &w.statements)
                .await
                .map_err(|e| w.failed("create tables", e))?;
        }
        Ok(w)
    }

    fn failed(&self, step: &'static str, e: tokio_postgres::Error) -> SnapshotError {
        let err = if self.pg.is_closed() {
            PgError::ConnectionLost(
                super::store::lock(&self.lost)
                    .clone()
                    .unwrap_or_else(|| e.to_string()),
            )
        } else {
            PgError::Statement {
                step,
                source: Arc::new(e),
            }
        };
        error(self.partition, err)
    }

    pub(crate) async fn write_all(
        &self,
        writes: Vec<(Bytes, Option<Bytes>)>,
    ) -> Result<(), SnapshotError> {
        upsert_rows(
            &self.pg,
            &self.statements,
            &self.prefix,
            self.partition,
            writes,
        )
        .await
        .map_err(|e| self.failed("write snapshots", e))
    }

    pub(crate) async fn read_state(&self) -> Result<RecoveredState, SnapshotError> {
        read_rows(&self.pg, &self.statements, &self.prefix, self.partition)
            .await
            .map_err(|e| self.failed("read snapshots", e))
    }
}

fn error(partition: i32, source: PgError) -> SnapshotError {
    SnapshotError::Store {
        partition,
        kind: FailureKind::Aborted,
        source: Arc::new(source),
    }
}
