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
    /// A flow with several inputs: the other inputs' partitions and the offsets each commit carries.
    pub(crate) inputs: Arc<InputOffsetNotes>,
}

/// What a commit of a several-input partition sends: the first input's offset, then the other inputs'
/// partitions with theirs.
type CommitOffsets = (i64, Vec<(TopicPartition, i64)>);

/// For a flow with several inputs (docs/fencing.md, "Several inputs"): the group commit's queue
/// orders commits by one number, the partition's coordinate on the merge of its inputs; this says
/// which offset of each input a commit of a coordinate carries. Noted by the flow when it asks for a
/// commit, read by the runner when the transaction commits it.
#[derive(Debug, Default)]
pub(crate) struct InputOffsetNotes(std::sync::Mutex<InputNotesInner>);

#[derive(Debug, Default)]
struct InputNotesInner {
    /// The inputs after the first, in the flow's order (empty: one input, nothing noted).
    more: Vec<TopicPartition>,
    /// Per coordinate asked for, every input's offset.
    notes: std::collections::BTreeMap<i64, Box<[i64]>>,
    /// The offsets of the last commit the runner sent (what a transaction that carries no newer
    /// request commits again).
    last: Option<(i64, Box<[i64]>)>,
}

impl InputOffsetNotes {
    /// A bound on notes not yet committed past (the flow asks for one commit per partition at a time,
    /// and each is sent by the next transaction; notes below a sent commit are dropped).
    const KEPT: usize = 1024;

    /// The other inputs' partitions, and the offsets the partition was assigned at (coordinate
    /// `assigned`, their sum).
    pub(crate) fn set_inputs(&self, more: Vec<TopicPartition>, assigned: i64, offsets: Vec<i64>) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.more = more;
        m.last = Some((assigned, offsets.into()));
    }

    /// Notes that a commit of `coordinate` carries `offsets`.
    pub(crate) fn note(&self, coordinate: i64, offsets: Vec<i64>) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if m.more.is_empty() {
            return;
        }
        m.notes.insert(coordinate, offsets.into());
        while m.notes.len() > Self::KEPT {
            m.notes.pop_first();
        }
    }

    /// What a commit of `coordinate` sends: `(first input's offset, the other inputs with theirs)`,
    /// or `None` with one input. Only the offsets noted for exactly this coordinate (or those of the
    /// last commit sent, when it was this coordinate) will do: an earlier point of the merge would
    /// commit less than the flow is told landed, and a grave's tombstone could then go too early.
    fn offsets_for(&self, coordinate: i64) -> Result<Option<CommitOffsets>, ProducerError> {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if m.more.is_empty() {
            return Ok(None);
        }
        let vector: Box<[i64]> = match (m.notes.get(&coordinate), &m.last) {
            (Some(v), _) => v.clone(),
            (None, Some((c, v))) if *c == coordinate => v.clone(),
            _ => {
                return Err(ProducerError::IllegalState {
                    op: "send_offsets",
                    state: "without the inputs' offsets for the commit asked for",
                })
            }
        };
        m.notes = m.notes.split_off(&coordinate);
        m.last = Some((coordinate, vector.clone()));
        let first = vector.first().copied().unwrap_or(coordinate);
        let more = m
            .more
            .iter()
            .cloned()
            .zip(vector.iter().skip(1).copied())
            .collect();
        Ok(Some((first, more)))
    }
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
            inputs: Arc::default(),
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
        let note = self.stream_times.at(offset).map(stream_time_metadata);
        let at = |offset: i64| crate::producer::OffsetAndMetadata {
            offset,
            leader_epoch: None,
            metadata: note.clone(),
        };
        match self.inputs.offsets_for(offset)? {
            None => {
                self.producer
                    .send_offsets([(self.input.clone(), at(offset))], metadata)
                    .await?
            }
            // Several inputs: every input's offset, in the one TxnOffsetCommit (the same fence).
            Some((first, more)) => {
                let all = std::iter::once((self.input.clone(), at(first)))
                    .chain(more.into_iter().map(|(tp, o)| (tp, at(o))))
                    .collect::<Vec<_>>();
                self.producer.send_offsets(all, metadata).await?
            }
        }
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
