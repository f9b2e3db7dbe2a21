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
        self.producer
            .send_offsets([(self.input.clone(), offset.into())], metadata)
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
