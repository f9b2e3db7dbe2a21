//! The group commit's transaction, run by the transactional producer.

use std::sync::Arc;

use super::error::{FailureKind, TxnFailure};
use super::group_commit::{TransactionRunner, TxnBatch};
use crate::producer::{
    ErrorClass, ProducerError, ProducerRecord, TopicPartition, TransactionalProducer,
};

/// Runs each [`TxnBatch`] as one Kafka transaction of a snapshot partition's transactional producer:
/// begin; send every write to the snapshot partition; TxnOffsetCommit of the input partition's offset with
/// the batch's group metadata (the fence); commit. Any failure before the commit aborts.
pub(crate) struct ProducerRunner {
    pub(crate) producer: TransactionalProducer,
    pub(crate) snapshot_topic: Arc<str>,
    pub(crate) partition: i32,
    pub(crate) input: TopicPartition,
}

impl ProducerRunner {
    async fn attempt(&mut self, batch: &TxnBatch) -> Result<(), ProducerError> {
        self.producer.begin()?;
        let mut deliveries = Vec::with_capacity(batch.writes.len());
        for w in &batch.writes {
            let record = ProducerRecord::new(Arc::clone(&self.snapshot_topic), w.value.clone())
                .key(w.key.clone())
                .partition(self.partition);
            deliveries.push(self.producer.send(record).await?);
        }
        // Every write of the transaction is queued: lingering would only hold the last, partly filled
        // batch back (by `linger`, 5 ms by default, per transaction: a fifth of a 2.6 MB transaction's
        // time on one local broker).
        self.producer.send_buffered();
        // The fence: the group coordinator checks generation (or member epoch) and member id here. It runs
        // while the records are in flight, so it costs no extra round trip on the critical path.
        self.producer
            .send_offsets([(self.input.clone(), batch.offset.into())], &batch.metadata)
            .await?;
        self.producer.commit().await?;
        // Commit waited for every acknowledgement; a failed record would have failed the commit, so these
        // are settled. Checked anyway so a lost record can never be reported as committed.
        for d in deliveries {
            d.await?;
        }
        Ok(())
    }
}

fn kind_of(e: &ProducerError) -> FailureKind {
    if e.is_commit_fenced() {
        return FailureKind::Fenced;
    }
    match e.class() {
        ErrorClass::Fatal => FailureKind::Fatal,
        ErrorClass::OutcomeUnknown => FailureKind::OutcomeUnknown,
        _ => FailureKind::Aborted,
    }
}

impl TransactionRunner for ProducerRunner {
    async fn run(&mut self, batch: TxnBatch) -> Result<(), TxnFailure> {
        let err = match self.attempt(&batch).await {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        let kind = kind_of(&err);
        if matches!(kind, FailureKind::Fenced | FailureKind::Aborted) {
            // Nothing of the transaction may land: abort it. If the abort itself fails the producer's
            // state is unknown, so the failure is escalated and the store closes.
            if let Err(abort_err) = self.producer.abort().await {
                tracing::warn!(partition = self.partition, error = %abort_err, cause = %err, "abort after a failed snapshot transaction failed");
                return Err(TxnFailure::new(FailureKind::Fatal, abort_err));
            }
        }
        if kind == FailureKind::Fenced {
            tracing::warn!(
                partition = self.partition,
                group = batch.metadata.group_id(),
                generation = batch.metadata.generation_id(),
                member = batch.metadata.member_id(),
                "snapshot transaction fenced by the group coordinator: this owner is stale; nothing was written"
            );
        }
        Err(TxnFailure::new(kind, err))
    }
}
