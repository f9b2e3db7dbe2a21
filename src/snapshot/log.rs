//! The recovery read's view of a snapshot partition, over the consumer's partition reader.

use std::time::Duration;

use super::recovery::{LogChunk, LogError, SnapshotLog};
use crate::consumer::{
    list_offsets, FetchStats, OffsetSpec, PartitionReader, ReaderConfig, StartAt, TopicPartition,
};
use crate::net::Client;
use crate::records::IsolationLevel;

/// A snapshot partition read at read_committed by a group-less [`PartitionReader`]: no committed offset
/// can ever shorten the read, and no group membership can be lost while it runs.
#[derive(Debug)]
pub struct PartitionLog {
    client: Client,
    reader: PartitionReader,
    partition: TopicPartition,
}

impl PartitionLog {
    /// A read_committed reader of `topic`'s `partition`.
    pub fn new(client: Client, topic: &str, partition: i32) -> Self {
        Self::with_reader(client, topic, partition, ReaderConfig::default())
    }

    /// A reader of `topic`'s `partition` with `config`'s fetch settings. The isolation is always
    /// read_committed, whatever `config` says: recovery must never see an aborted snapshot.
    pub fn with_reader(client: Client, topic: &str, partition: i32, config: ReaderConfig) -> Self {
        let config = ReaderConfig {
            isolation: IsolationLevel::ReadCommitted,
            ..config
        };
        let partition = TopicPartition::new(topic, partition);
        // Sessionless: a session saves a reader of one partition read to an end nothing (every answer
        // moves its position, so every request carries it again) and would take a broker session slot.
        let mut reader = PartitionReader::sessionless(client.clone(), config);
        reader.assign(partition.clone(), StartAt::Earliest);
        PartitionLog {
            client,
            reader,
            partition,
        }
    }

    /// What this log's Fetch requests carried so far.
    pub fn fetch_stats(&self) -> FetchStats {
        self.reader.fetch_stats()
    }

    async fn offset(&self, spec: OffsetSpec, isolation: IsolationLevel) -> Result<i64, LogError> {
        offset_of(&self.client, &self.partition, spec, isolation).await
    }
}

/// `partition`'s offset that `spec` names, as `isolation` sees it.
pub(super) async fn offset_of(
    client: &Client,
    partition: &TopicPartition,
    spec: OffsetSpec,
    isolation: IsolationLevel,
) -> Result<i64, LogError> {
    let offsets = list_offsets(client, std::slice::from_ref(partition), spec, isolation).await?;
    offsets
        .get(partition)
        .copied()
        .ok_or_else(|| LogError::NoOffset(partition.clone()))
}

impl SnapshotLog for PartitionLog {
    async fn high_watermark(&mut self) -> Result<i64, LogError> {
        self.offset(OffsetSpec::Latest, IsolationLevel::ReadUncommitted)
            .await
    }

    async fn last_stable_offset(&mut self) -> Result<i64, LogError> {
        self.offset(OffsetSpec::Latest, IsolationLevel::ReadCommitted)
            .await
    }

    async fn log_start(&mut self) -> Result<i64, LogError> {
        self.offset(OffsetSpec::Earliest, IsolationLevel::ReadUncommitted)
            .await
    }

    async fn fetch(&mut self, offset: i64, max_wait: Duration) -> Result<LogChunk, LogError> {
        if self.reader.position(&self.partition) != Some(offset) {
            self.reader.seek(&self.partition, StartAt::Offset(offset));
        }
        let fetched = self.reader.fetch_for(max_wait).await?;
        let mut records = Vec::new();
        for part in fetched {
            // Slices of the fetch buffer, not copies: a copy here would be one allocation per key and per
            // value. Nothing downstream keeps them: `read_to_target` lends them to its fold and drops the
            // chunk, and `recover` copies into its arena, so each buffer is freed once folded.
            records.extend(part.records.into_iter().map(|r| (r.key, r.value)));
        }
        let next_offset = self.reader.position(&self.partition).unwrap_or(offset);
        Ok(LogChunk {
            records,
            next_offset,
        })
    }
}
