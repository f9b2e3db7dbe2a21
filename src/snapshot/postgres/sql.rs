//! The two tables and every statement the store sends, as text built once per store from the configured
//! table prefix. Pure: nothing here touches a connection.
//!
//! - `<prefix>_snapshots (prefix, partition, key, value)`: the snapshot of every live key of every
//!   partition of every flow, keyed by the flow's transactional-id prefix and the input partition; the
//!   value is the same envelope the snapshot topic holds (last folded offset, then the user's bytes).
//! - `<prefix>_owners (prefix, partition, owner_epoch, committed_offset, prepared_txn, input_offsets,
//!   stream_time)`: one fencing row per partition. `owner_epoch` is bumped by every takeover; a flush
//!   commits only while it still holds the epoch its store took over with (a compare-and-set under the
//!   row's lock), and records the input offset its snapshots cover and the Kafka transaction it
//!   prepared. A flow with several inputs records every input's offset in `input_offsets`
//!   (`committed_offset` is the first input's), and a fold with timers on stream time the stream time
//!   just before them in `stream_time`. Other flows never name those two columns, so tables made
//!   before they existed keep working for them.
//! - `<prefix>_outputs (prefix, partition, seq, flush_id, topic, target, key, value, headers, ts)`: the
//!   outputs of the partition's last flush that carried any (every flush replaces them), kept so the
//!   next owner can send them again when that flush's Kafka side did not commit (the group's committed
//!   offset metadata names the last flush that did).

/// A table prefix that is a plain SQL identifier: it is spliced into statements, never quoted.
pub(crate) fn valid_prefix(prefix: &str) -> bool {
    let mut chars = prefix.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && prefix.len() <= 40
}

/// Every statement, with the tables' names filled in.
#[derive(Debug, Clone)]
pub(crate) struct Statements {
    pub(crate) create: String,
    /// The takeover: bump (or create) the partition's fencing row and return what the last flush
    /// recorded (every column, read by name: `input_offsets` is missing from older tables).
    /// $1 prefix, $2 partition.
    pub(crate) bump: String,
    /// The fence inside a flush: record the flush on the row only if the epoch is still ours. Takes the
    /// row's lock. $1 prefix, $2 partition, $3 owner epoch, $4 committed offset, $5 prepared txn.
    pub(crate) record: String,
    /// [`record`](Self::record) of a flow with several inputs or timers on stream time. $6 every
    /// input's offset (int8[], null with one input), $7 the stream time (int8, null without).
    pub(crate) record_all: String,
    /// Adds the `input_offsets` and `stream_time` columns to a fencing table made before they existed.
    pub(crate) add_columns: String,
    /// Insert or replace snapshots. $1 prefix, $2 partition, $3 keys (bytea[]), $4 values (bytea[]).
    pub(crate) upsert: String,
    /// Remove keys (tombstones). $1 prefix, $2 partition, $3 keys (bytea[]).
    pub(crate) delete: String,
    /// Every snapshot of a partition. $1 prefix, $2 partition.
    pub(crate) read: String,
    /// The fencing row as it stands (every column, as `bump`). $1 prefix, $2 partition.
    pub(crate) owner: String,
    /// An operator's reset: the row's offset set, no prepared transaction. $1 prefix, $2 partition,
    /// $3 committed offset.
    pub(crate) reset_row: String,
    /// [`reset_row`](Self::reset_row) on a table with `input_offsets` and `stream_time`: $4 every
    /// input's offset (int8[], null with one input); the stream time is forgotten.
    pub(crate) reset_row_all: String,
    /// Forget the partition's stored outputs. $1 prefix, $2 partition.
    pub(crate) outputs_clear: String,
    /// Store a flush's outputs. $1 prefix, $2 partition, $3 flush id, $4 seqs (int4[]), $5 topics
    /// (text[]), $6 target partitions (int4[], -1: the partitioner's choice), $7 keys, $8 values,
    /// $9 headers (bytea[], nulls allowed), $10 timestamps (int8[], -1: none).
    pub(crate) outputs_insert: String,
    /// The partition's stored outputs in order. $1 prefix, $2 partition.
    pub(crate) outputs_read: String,
}

impl Statements {
    /// The statements for tables named `<table_prefix>_snapshots` and `<table_prefix>_owners`.
    /// `table_prefix` must pass [`valid_prefix`].
    pub(crate) fn new(table_prefix: &str) -> Statements {
        let snapshots = format!("{table_prefix}_snapshots");
        let owners = format!("{table_prefix}_owners");
        let outputs = format!("{table_prefix}_outputs");
        Statements {
            create: format!(
                "CREATE TABLE IF NOT EXISTS {snapshots} (\
                   prefix text NOT NULL, partition integer NOT NULL, key bytea NOT NULL, value bytea NOT NULL, \
                   PRIMARY KEY (prefix, partition, key)); \
                 CREATE TABLE IF NOT EXISTS {owners} (\
                   prefix text NOT NULL, partition integer NOT NULL, owner_epoch bigint NOT NULL, \
                   committed_offset bigint, prepared_txn text, input_offsets bigint[], \
                   stream_time bigint, PRIMARY KEY (prefix, partition)); \
                 CREATE TABLE IF NOT EXISTS {outputs} (\
                   prefix text NOT NULL, partition integer NOT NULL, seq integer NOT NULL, \
                   flush_id text NOT NULL, topic text NOT NULL, target integer NOT NULL, key bytea, \
                   value bytea, headers bytea, ts bigint NOT NULL, \
                   PRIMARY KEY (prefix, partition, seq));"
            ),
            bump: format!(
                "INSERT INTO {owners} AS o (prefix, partition, owner_epoch) VALUES ($1, $2, 1) \
                 ON CONFLICT (prefix, partition) DO UPDATE SET owner_epoch = o.owner_epoch + 1 \
                 RETURNING *"
            ),
            record: format!(
                "UPDATE {owners} SET committed_offset = $4, prepared_txn = $5 \
                 WHERE prefix = $1 AND partition = $2 AND owner_epoch = $3"
            ),
            record_all: format!(
                "UPDATE {owners} SET committed_offset = $4, prepared_txn = $5, input_offsets = $6, \
                 stream_time = $7 WHERE prefix = $1 AND partition = $2 AND owner_epoch = $3"
            ),
            add_columns: format!(
                "ALTER TABLE {owners} ADD COLUMN IF NOT EXISTS input_offsets bigint[], \
                 ADD COLUMN IF NOT EXISTS stream_time bigint"
            ),
            upsert: format!(
                "INSERT INTO {snapshots} (prefix, partition, key, value) \
                 SELECT $1, $2, k, v FROM unnest($3::bytea[], $4::bytea[]) AS t(k, v) \
                 ON CONFLICT (prefix, partition, key) DO UPDATE SET value = EXCLUDED.value"
            ),
            delete: format!(
                "DELETE FROM {snapshots} WHERE prefix = $1 AND partition = $2 AND key = ANY($3::bytea[])"
            ),
            read: format!("SELECT key, value FROM {snapshots} WHERE prefix = $1 AND partition = $2"),
            owner: format!("SELECT * FROM {owners} WHERE prefix = $1 AND partition = $2"),
            reset_row: format!(
                "UPDATE {owners} SET committed_offset = $3, prepared_txn = NULL \
                 WHERE prefix = $1 AND partition = $2"
            ),
            reset_row_all: format!(
                "UPDATE {owners} SET committed_offset = $3, prepared_txn = NULL, input_offsets = $4, \
                 stream_time = NULL WHERE prefix = $1 AND partition = $2"
            ),
            outputs_clear: format!("DELETE FROM {outputs} WHERE prefix = $1 AND partition = $2"),
            outputs_insert: format!(
                "INSERT INTO {outputs} (prefix, partition, seq, flush_id, topic, target, key, value, \
                   headers, ts) \
                 SELECT $1, $2, q, $3, t, p, k, v, h, ts FROM unnest($4::int4[], $5::text[], \
                   $6::int4[], $7::bytea[], $8::bytea[], $9::bytea[], $10::int8[]) AS u(q, t, p, k, v, h, ts)"
            ),
            outputs_read: format!(
                "SELECT flush_id, topic, target, key, value, headers, ts FROM {outputs} \
                 WHERE prefix = $1 AND partition = $2 ORDER BY seq"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a plain identifier (lower-case ASCII letters, digits and '_', no leading digit, at most 40
    /// characters) is spliced into SQL as a table prefix, so a prefix can never inject a statement.
    #[test]
    fn only_plain_identifiers_are_spliced() {
        for ok in ["snapfence", "_x", "a1_b2", &"a".repeat(40)] {
            assert!(valid_prefix(ok), "{ok}");
        }
        for bad in [
            "",
            "1a",
            "A",
            "a-b",
            "a;drop table x",
            "a b",
            "é",
            &"a".repeat(41),
        ] {
            assert!(!valid_prefix(bad), "{bad}");
        }
        let s = Statements::new("sf");
        assert!(s.create.contains("sf_snapshots") && s.create.contains("sf_owners"));
        assert!(s.create.contains("sf_outputs") && s.outputs_read.contains("ORDER BY seq"));
        assert!(s.record.contains("owner_epoch = $3"));
        assert!(s.record_all.contains("owner_epoch = $3") && s.record_all.contains("$7"));
        assert!(!s.record.contains("input_offsets") && !s.record.contains("stream_time"));
    }
}
