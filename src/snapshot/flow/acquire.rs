//! Taking a partition over: where it starts, its writer (the takeover that fences the previous
//! owner), its recovered state, and the first commit of a fresh partition.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

use super::lane::{commit_lane, fan_out, CommitWhen, FlowLane, Lane};
use super::shared::Shared;
use super::writer::{PlainOffsets, PlainWriter, Sink, Writer};
use super::FlowError;
use crate::consumer::{
    committed_offsets_and_metadata, list_offsets, ConsumerError, OffsetReset, OffsetSpec,
    TopicPartition,
};
use crate::net::Client;
use crate::records::IsolationLevel;
use crate::snapshot::error::SnapshotError;
use crate::snapshot::fold::Fold;
use crate::snapshot::fold::TimerClock;
use crate::snapshot::fold_core::PartitionCore;
use crate::snapshot::recovery::{recover, RecoveryConfig};
use crate::snapshot::runner::parse_stream_time;
use crate::snapshot::state::RecoveredState;
use crate::snapshot::store::SnapshotStore;

/// Where an acquired partition starts folding.
#[derive(Debug, Clone)]
struct Start {
    /// The input offset of the first event to fold (with several inputs, the coordinate of `offsets`
    /// on their merge: their sum).
    offset: i64,
    /// Every input's offset, in the flow's order (one with one input).
    offsets: Vec<i64>,
    /// The group had no offset committed for the partition: the flow commits `offset` for it before
    /// anything is fetched (see [`FlowConfig`](super::FlowConfig)).
    fresh: bool,
    /// The stream time the committed offset's metadata carries (timers on stream time), if any.
    stream_time: Option<i64>,
}

impl<F: Fold> Shared<F> {
    /// The partition `partition` of every input, in the flow's order.
    pub(super) fn input_partitions(&self, partition: i32) -> Vec<TopicPartition> {
        self.config
            .input_topics()
            .into_iter()
            .map(|t| TopicPartition::new(t, partition))
            .collect()
    }

    /// Where `tp`'s partition starts (see [`Start`]): per input, the group's committed offset, else per
    /// `initial_offset`. This is the only place that decides where a partition without a committed
    /// offset starts. With several inputs the partition is fresh when any input has none.
    async fn assigned_offset(&self, tp: &TopicPartition) -> Result<Start, ConsumerError> {
        let tps = self.input_partitions(tp.partition);
        let mut committed = committed_offsets_and_metadata(
            &self.client,
            &self.config.consumer.group.group_id,
            &tps,
        )
        .await?;
        let mut offsets = Vec::with_capacity(tps.len());
        let mut missing = Vec::new();
        let mut stream_time = None;
        for (i, tp) in tps.iter().enumerate() {
            match committed.remove(tp).flatten() {
                Some((offset, metadata)) => {
                    offsets.push(offset);
                    if i == 0 {
                        stream_time = metadata.as_deref().and_then(parse_stream_time);
                    }
                }
                None => {
                    offsets.push(0);
                    missing.push(i);
                }
            }
        }
        let fresh = !missing.is_empty();
        if fresh {
            let spec = match self.config.initial_offset {
                OffsetReset::Earliest => OffsetSpec::Earliest,
                OffsetReset::Latest => OffsetSpec::Latest,
                _ => {
                    return Err(ConsumerError::NoCommittedOffset {
                        partition: tps[missing[0]].clone(),
                    })
                }
            };
            let lookup: Vec<TopicPartition> = missing.iter().map(|i| tps[*i].clone()).collect();
            let found =
                list_offsets(&self.client, &lookup, spec, IsolationLevel::ReadUncommitted).await?;
            for i in &missing {
                offsets[*i] = found.get(&tps[*i]).copied().unwrap_or(0);
            }
            if missing.contains(&0) {
                stream_time = None;
            }
        }
        Ok(Start {
            offset: offsets.iter().sum(),
            offsets,
            fresh,
            stream_time,
        })
    }

    /// The client a partition's snapshot producer talks through: its own, with the client id
    /// `<client_id>-p<partition>`, or the flow's (see [`FlowConfig::partition_client_ids`](super::FlowConfig::partition_client_ids)).
    async fn partition_client(&self, partition: i32) -> Result<Client, SnapshotError> {
        if !self.config.partition_client_ids {
            return Ok(self.client.clone());
        }
        let mut config = self.client.config().clone();
        config.client_id = format!("{}-p{partition}", config.client_id);
        Client::connect(config)
            .await
            .map_err(|e| SnapshotError::Net {
                partition,
                source: Arc::new(e),
            })
    }

    /// Acquires `partitions` together, at most [`FlowConfig::max_concurrent_partitions`](super::FlowConfig::max_concurrent_partitions) at once, each on
    /// its own task ([`fan_out`]): a takeover of many partitions costs about as long as its slowest
    /// acquisition, not the sum of them (each waits on its own InitProducerId, committed-offset read and
    /// recovery read). Returns each partition's outcome, in the order given; a task that panicked yields
    /// [`SnapshotError::PartitionTask`]. Dropping the future aborts the tasks (acquisition is
    /// cancel-safe: at most a bumped producer epoch is left behind).
    pub(super) async fn acquire_all(
        self: &Arc<Self>,
        partitions: Vec<TopicPartition>,
    ) -> Vec<(TopicPartition, Result<FlowLane<F>, FlowError>)> {
        let by_partition: HashMap<i32, TopicPartition> = partitions
            .iter()
            .map(|tp| (tp.partition, tp.clone()))
            .collect();
        let items = partitions
            .into_iter()
            .map(|tp| (tp.partition, tp))
            .collect();
        let outcomes = fan_out(items, self.config.max_concurrent_partitions, |tp| {
            let shared = Arc::clone(self);
            async move { shared.acquire(&tp).await }
        })
        .await;
        outcomes
            .into_iter()
            .filter_map(|(p, outcome)| by_partition.get(&p).map(|tp| (tp.clone(), outcome)))
            .collect()
    }

    /// Opens the partition's writer of the flow's [`Sink`]: takes the partition over in the fenced modes
    /// (the producer's init, and for PostgreSQL the fencing row) and reads where it starts. Returns the
    /// writer and where the partition starts.
    async fn open_writer(&self, tp: &TopicPartition) -> Result<(Writer, Start), FlowError> {
        let partition = tp.partition;
        let plain_offsets = || PlainOffsets {
            client: self.client.clone(),
            input: tp.clone(),
            more: self.input_partitions(partition).split_off(1),
            metadata: self.metadata_handle(),
        };
        match &self.sink {
            Sink::PlainTopic(producer) => {
                let start = self.assigned_offset(tp).await?;
                let writer = Writer::Plain(PlainWriter {
                    producer: Arc::clone(producer),
                    offsets: plain_offsets(),
                    snapshot_topic: Arc::from(self.config.snapshots.snapshot_topic.as_str()),
                    pending: std::sync::Mutex::new(Vec::new()),
                });
                Ok((writer, start))
            }
            Sink::Topic => {
                // Take the partition over first, then read its committed offset: a crashed owner's open
                // transaction may hold a pending offset commit, and the stable read waits for it until
                // the takeover aborts it (see SnapshotStore::acquire_then).
                let (store, start) = SnapshotStore::take_over(
                    self.partition_client(partition).await?,
                    self.config.snapshots.clone(),
                    tp.clone(),
                    self.metadata_source(),
                    self.assigned_offset_after_takeover(tp),
                )
                .await?;
                let start = Start {
                    offset: store.committed_offset(),
                    ..start
                };
                if start.offsets.len() > 1 {
                    // Its commits carry every input's offset.
                    let more = self.input_partitions(partition).split_off(1);
                    store.set_more_inputs(more, start.offsets.clone());
                }
                Ok((Writer::Fenced(store), start))
            }
            #[cfg(feature = "postgres")]
            Sink::PlainPg(pg) => {
                let prefix = &self.config.snapshots.transactional_id_prefix;
                let rows = crate::snapshot::postgres::PgPlainWriter::connect(pg, prefix, partition)
                    .await?;
                let start = self.assigned_offset(tp).await?;
                Ok((Writer::PgPlain(Box::new(rows), plain_offsets()), start))
            }
            #[cfg(feature = "postgres")]
            Sink::Pg(pg) => {
                use crate::snapshot::postgres::{PgSnapshotStore, Position};
                let assigned = async {
                    let (_, start) = self.assigned_offset_after_takeover(tp).await?;
                    let at = Position {
                        offsets: start.offsets.clone(),
                        stream_time: start.stream_time,
                    };
                    Ok((at, start))
                };
                let (store, start) = PgSnapshotStore::take_over(
                    self.partition_client(partition).await?,
                    &self.config.snapshots,
                    pg,
                    self.input_partitions(partition),
                    self.fold.timer_clock() == TimerClock::Stream,
                    self.metadata_source(),
                    assigned,
                )
                .await?;
                // Per input, the later of the fencing row's offset and the group's, and the stream
                // time that goes with them.
                let start = Start {
                    offset: store.committed_offset(),
                    offsets: store.committed_offsets(),
                    stream_time: store.committed_stream_time(),
                    ..start
                };
                Ok((Writer::Pg(Box::new(store)), start))
            }
        }
    }

    /// [`assigned_offset`](Self::assigned_offset) in the snapshot layer's error, as a fenced store's
    /// takeover awaits it once the previous owner is fenced: the offset for the store, and the whole
    /// [`Start`] handed back with the store.
    async fn assigned_offset_after_takeover(
        &self,
        tp: &TopicPartition,
    ) -> Result<(i64, Start), SnapshotError> {
        let start = self
            .assigned_offset(tp)
            .await
            .map_err(|e| SnapshotError::Consumer {
                partition: tp.partition,
                source: Arc::new(e),
            })?;
        Ok((start.offset, start.clone()))
    }

    /// Every input's end now, at the isolation level the input is read at (the high watermark, or the
    /// last stable offset at read_committed): where an acquired partition becomes ready, and (with
    /// several inputs) how far the merge waits for each.
    async fn input_ends(&self, tp: &TopicPartition) -> Result<Vec<i64>, FlowError> {
        let tps = self.input_partitions(tp.partition);
        let ends = list_offsets(
            &self.client,
            &tps,
            OffsetSpec::Latest,
            self.config.consumer.reader.isolation,
        )
        .await?;
        Ok(tps
            .iter()
            .map(|tp| ends.get(tp).copied().unwrap_or(0))
            .collect())
    }

    pub(super) async fn acquire(&self, tp: &TopicPartition) -> Result<FlowLane<F>, FlowError> {
        // The end is read as the takeover begins, beside it: the partition is ready once it folded the
        // input that was there when it was assigned.
        let began = std::time::Instant::now();
        let (opened, end) = tokio::join!(self.open_writer(tp), self.input_ends(tp));
        let writer_for = began.elapsed();
        let (writer, start) = opened?;
        let end = match end {
            Ok(end) => end,
            Err(e) => {
                writer.close().await;
                return Err(e);
            }
        };
        let fresh = start.fresh;
        let phase = std::time::Instant::now();
        let recovered = self.recover(tp, start, &writer).await;
        let recovered_for = phase.elapsed();
        let core = match recovered {
            Ok(core) => core,
            Err(e) => {
                writer.close().await;
                return Err(e);
            }
        };
        let behind = writer.group_offset_behind();
        let lane = Lane::new(tp.partition, core, writer);
        lane.set_targets(end);
        if fresh || behind {
            // Record the start for the group before anything is fetched: the consumer starts the
            // partition at the committed offset, so it now reads from exactly where this flow
            // counts from, and a restart before the first periodic commit starts there again
            // instead of re-resolving "earliest" or "latest" against a log that has moved. (Behind: a
            // PostgreSQL flush's rows committed, its Kafka side aborted at the takeover.)
            if let Err(e) = commit_lane(&lane, CommitWhen::Always).await {
                lane.writer.close().await;
                return Err(e);
            }
        }
        // Timers that fell due while nobody owned the partition fire before any event is folded, as
        // they would have on a live owner that ticked.
        let fired = lane
            .core()
            .handle_timeout(&*self.fold, self.config.clock.now_ms());
        if fired > 0 {
            tracing::info!(
                partition = tp.partition,
                fired,
                "overdue timers fired at takeover"
            );
        }
        tracing::info!(
            partition = tp.partition,
            elapsed = ?began.elapsed(),
            // The producer's takeover and the input's committed offset and end, read together.
            writer = ?writer_for,
            recovered = ?recovered_for,
            "partition acquired"
        );
        Ok(lane)
    }

    /// Eager recovery: every key of the partition, before any event is folded.
    async fn recover(
        &self,
        tp: &TopicPartition,
        start: Start,
        writer: &Writer,
    ) -> Result<PartitionCore<F::State>, FlowError> {
        let assigned_offset = start.offset;
        let offsets = start.offsets.clone();
        let began = std::time::Instant::now();
        #[cfg(feature = "disk-state")]
        let mut lazy_image = None;
        let recovered = match writer {
            #[cfg(feature = "postgres")]
            Writer::Pg(store) => store.read_state().await?,
            #[cfg(feature = "postgres")]
            Writer::PgPlain(rows, _) => rows.read_state().await?,
            #[cfg(feature = "disk-state")]
            _ if matches!(self.config.state, super::StateConfig::Disk(_)) => {
                let super::StateConfig::Disk(disk) = &self.config.state else {
                    unreachable!("matched above")
                };
                super::local::stop_following(self, tp.partition).await;
                match super::local::open_partition_image(self, disk, tp).await? {
                    super::local::Taken::Whole(recovered) => recovered,
                    // Lazily: the image stays open for the core, and no key is loaded now.
                    super::local::Taken::Lazy(image, budget) => {
                        lazy_image = Some((image, budget));
                        RecoveredState::new()
                    }
                }
            }
            _ => self.read_snapshot_log(tp).await?,
        };
        let read_for = began.elapsed();
        let phase = std::time::Instant::now();
        let mut core = if offsets.len() > 1 {
            PartitionCore::new_inputs(&offsets)
        } else {
            // One input: the store's word (the PostgreSQL store's takeover may start past the group's).
            PartitionCore::new(assigned_offset)
        };
        if self.fold.timer_clock() == TimerClock::Stream {
            core = core.stream_timers(start.stream_time);
        }
        if !self.sink.fenced() {
            // Unfenced, outputs are produced at once (at least once) instead of riding with snapshots.
            core = core.emit_at_once();
        }
        let mut graves = 0usize;
        for (key, value) in &recovered {
            let key = Bytes::copy_from_slice(key);
            let grave = core
                .restore_envelope(&*self.fold, key.clone(), value)
                .map_err(|reason| FlowError::BadSnapshot {
                    partition: tp.partition,
                    key,
                    reason,
                })?;
            graves += usize::from(grave);
        }
        let restored = phase.elapsed();
        let phase = std::time::Instant::now();
        #[allow(unused_mut)]
        let mut lazily = false;
        #[cfg(feature = "disk-state")]
        if let Some((image, budget)) = lazy_image {
            lazily = true;
            let budget = usize::try_from(budget).unwrap_or(usize::MAX);
            core = core
                .load_lazily(&*self.fold, image, budget)
                .map_err(|e| super::local::load_failure(tp.partition, e))?;
        }
        let elapsed = began.elapsed();
        tracing::info!(
            partition = tp.partition,
            keys = recovered.len(),
            graves,
            // Keys are loaded as they are needed (a memory budget): `keys` counts none of them.
            lazily,
            ?elapsed,
            // Reading the state (the store, or the image and what was written since), building the
            // keys from it, and with a memory budget handing the image to the partition.
            read = ?read_for,
            ?restored,
            handed_over = ?phase.elapsed(),
            assigned_offset,
            ?offsets,
            "partition recovered"
        );
        Ok(core)
    }

    /// The recovery read of the partition's snapshot topic partition, through the flow's shared reader.
    async fn read_snapshot_log(&self, tp: &TopicPartition) -> Result<RecoveredState, FlowError> {
        let mut log = self.recovery_reads.log(tp.partition);
        let recovery = self.recovery_config();
        let (recovered, _stats) = recover(&mut log, tp.partition, &recovery).await?;
        Ok(recovered)
    }

    /// How the flow's recovery reads behave: the stall deadline only in the fenced modes (see
    /// [`RecoveryConfig::stall_timeout`]).
    pub(super) fn recovery_config(&self) -> RecoveryConfig {
        RecoveryConfig {
            stall_timeout: if self.sink.fenced() {
                self.config.snapshots.recovery_stall_timeout
            } else {
                None
            },
            fetch_wait: self.config.recovery_fetch_wait,
            progress_every: self.config.recovery_progress_every,
        }
    }
}
