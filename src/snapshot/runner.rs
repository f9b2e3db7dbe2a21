//! The group commit's transactions, run by the transactional producer.

use std::sync::Arc;

use super::error::TxnFailure;
use super::group_commit::{Entry, TransactionRunner};
use crate::producer::{
    Delivery, ProducerError, ProducerRecord, TopicPartition, TransactionalProducer,
};
use crate::GroupMetadata;

/// Runs the group commit's transactions on a snapshot partition's transactional producer: begin; send
/// every write to the snapshot partition; TxnOffsetCommit of the input partition's offset with the group
/// metadata (the fence); commit. The group commit aborts after an abortable failure.
pub(crate) struct ProducerRunner {
    pub(crate) producer: TransactionalProducer,
    pub(crate) snapshot_topic: Arc<str>,
    pub(crate) partition: i32,
    pub(crate) input: TopicPartition,
    /// The deliveries of the open transaction's records, checked once it committed.
    pub(crate) deliveries: Vec<Delivery>,
    /// The stream times noted for the offsets this partition commits, carried in the commit's metadata.
    pub(crate) stream_times: Arc<StreamTimes>,
}

/// The stream time just before each offset a flow asked to commit (timers on stream time), shared by
/// the store that notes them and the runner whose TxnOffsetCommit carries them as the offset's metadata
/// (`snapfence st=<ms>`, see [`stream_time_metadata`]).
#[derive(Debug, Default)]
pub(crate) struct StreamTimes(std::sync::Mutex<std::collections::BTreeMap<i64, i64>>);

impl StreamTimes {
    /// How many noted offsets are kept: a transaction commits either an offset asked for recently or
    /// the last one committed.
    const KEPT: usize = 64;

    /// Notes that a replay from `offset` starts at stream time `stream_time`.
    pub(crate) fn note(&self, offset: i64, stream_time: i64) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.insert(offset, stream_time);
        while m.len() > Self::KEPT {
            m.pop_first();
        }
    }

    /// The stream time for a commit of `offset`: the one noted for it, or for the nearest offset
    /// below (stream time never decreases along the input, so that is a lower bound).
    pub(crate) fn at(&self, offset: i64) -> Option<i64> {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.range(..=offset).next_back().map(|(_, st)| *st)
    }
}

/// The committed offset's metadata that carries a stream time.
pub(crate) fn stream_time_metadata(stream_time: i64) -> String {
    format!("snapfence st={stream_time}")
}

/// The stream time a committed offset's metadata carries, if it carries one (a `st=<ms>` word).
pub(crate) fn parse_stream_time(metadata: &str) -> Option<i64> {
    metadata
        .split_whitespace()
        .find_map(|w| w.strip_prefix("st="))
        .and_then(|v| v.parse().ok())
}

impl ProducerRunner {
    pub(crate) fn new(
        producer: TransactionalProducer,
        snapshot_topic: Arc<str>,
        partition: i32,
        input: TopicPartition,
    ) -> Self {
        ProducerRunner {
            producer,
            snapshot_topic,
            partition,
            input,
            deliveries: Vec::new(),
            stream_times: Arc::default(),
        }
    }

    async fn attempt_commit(
        &mut self,
        offset: i64,
        metadata: &GroupMetadata,
    ) -> Result<(), ProducerError> {
        // Every write of the transaction is queued: lingering would only hold the last, partly filled
        // batch back (by `linger`, 5 ms by default, per transaction: a fifth of a 2.6 MB transaction's
        // time on one local broker).
        self.producer.send_buffered();
        // The fence: the group coordinator checks generation (or member epoch) and member id here. It runs
        // while the records are in flight, so it costs no extra round trip on the critical path.
        let committed = crate::producer::OffsetAndMetadata {
            offset,
            leader_epoch: None,
            metadata: self.stream_times.at(offset).map(stream_time_metadata),
        };
        self.producer
            .send_offsets([(self.input.clone(), committed)], metadata)
            .await?;
        self.producer.commit().await?;
        // Commit waited for every acknowledgement; a failed record would have failed the commit, so these
        // are settled. Checked anyway so a lost record can never be reported as committed.
        for d in std::mem::take(&mut self.deliveries) {
            d.await?;
        }
        Ok(())
    }
}

/// Classifies with the one mapping, [`FailureKind::of`](super::FailureKind::of).
fn failure(e: ProducerError) -> TxnFailure {
    TxnFailure::from(e)
}

impl TransactionRunner for ProducerRunner {
    fn begin(&mut self) -> Result<(), TxnFailure> {
        self.deliveries.clear();
        self.producer.begin().map_err(failure)?;
        // The group commit's span of this transaction carries the producer's identity (declared there,
        // filled here: only the runner knows it). Under TV2 the epoch moves with every transaction.
        let span = tracing::Span::current();
        span.record("transactional_id", self.producer.transactional_id());
        if let Some(ids) = self.producer.producer_id_and_epoch() {
            span.record("producer_id", ids.id);
            span.record("producer_epoch", ids.epoch);
        }
        Ok(())
    }

    async fn send(&mut self, entry: Entry) -> Result<(), TxnFailure> {
        let record = ProducerRecord::new(Arc::clone(&self.snapshot_topic), entry.write.value)
            .key(entry.write.key)
            .partition(self.partition);
        let delivery = self.producer.send(record).await.map_err(failure)?;
        self.deliveries.push(delivery);
        // The outputs ride in the same transaction: the producer adds their partitions to it.
        for output in entry.outputs {
            let delivery = self.producer.send(output).await.map_err(failure)?;
            self.deliveries.push(delivery);
        }
        Ok(())
    }

    async fn settle(&mut self) -> Result<(), TxnFailure> {
        self.producer.send_buffered();
        for d in std::mem::take(&mut self.deliveries) {
            d.await.map_err(failure)?;
        }
        Ok(())
    }

    async fn commit(&mut self, offset: i64, metadata: GroupMetadata) -> Result<(), TxnFailure> {
        let result = self.attempt_commit(offset, &metadata).await;
        self.deliveries.clear();
        result.map_err(|e| {
            if e.is_commit_fenced() {
                tracing::warn!(
                    partition = self.partition,
                    group = metadata.group_id(),
                    generation = metadata.generation_id(),
                    member = metadata.member_id(),
                    "snapshot transaction fenced by the group coordinator: this owner is stale; nothing was written"
                );
            }
            failure(e)
        })
    }

    async fn abort(&mut self) -> Result<(), TxnFailure> {
        self.deliveries.clear();
        self.producer
            .abort()
            .await
            // Classified like any other failure; the group commit escalates a failed abort (see
            // `escalate`).
            .map_err(failure)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A commit carries the stream time noted for its offset, or the nearest below; the metadata round
    /// trips, and foreign metadata carries none.
    #[test]
    fn stream_times_are_noted_found_and_parsed() {
        let t = StreamTimes::default();
        assert_eq!(t.at(10), None);
        t.note(10, 1_000);
        t.note(20, 2_000);
        assert_eq!(t.at(10), Some(1_000));
        assert_eq!(t.at(15), Some(1_000));
        assert_eq!(t.at(25), Some(2_000));
        assert_eq!(t.at(9), None);
        for i in 0..200 {
            t.note(100 + i, 5_000 + i);
        }
        assert_eq!(t.at(299), Some(5_199));
        assert_eq!(parse_stream_time(&stream_time_metadata(-5)), Some(-5));
        assert_eq!(parse_stream_time("snapfence-flush 3.4 st=77"), Some(77));
        assert_eq!(parse_stream_time("snapfence-flush 3.4"), None);
        assert_eq!(parse_stream_time("st=x"), None);
        assert_eq!(parse_stream_time(""), None);
    }
}
