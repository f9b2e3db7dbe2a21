//! Where a flow keeps its state ([`StateConfig`]), and with the `disk-state` feature the acquisition of a
//! partition from its on-disk image: the checkpoint judged against the cluster, the recovery read from
//! the checkpoint (or, on any doubt, from the log start into a fresh image), and the image brought to
//! the high watermark under a new checkpoint.
//!
//! The image is written only from read_committed reads of the snapshot partition, never from this
//! member's own writes: what it holds is what the log committed, and the checkpoint is where that read
//! stands, so it never passes the last stable offset and never covers a transaction of unknown outcome
//! (docs/fencing.md, "On-disk state").

use std::path::PathBuf;

/// Where a flow keeps its per-key state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum StateConfig {
    /// Every key in memory, recovered by reading the whole snapshot partition at each acquisition (the
    /// default).
    #[default]
    Memory,
    /// An image of each partition on local disk with a checkpoint, so an acquisition reads only what
    /// was written since (the `disk-state` feature).
    #[cfg(feature = "disk-state")]
    #[cfg_attr(docsrs, doc(cfg(feature = "disk-state")))]
    Disk(DiskState),
}

/// The on-disk state's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DiskState {
    /// The directory the images live under, one subdirectory per snapshot partition
    /// (`<snapshot topic>-<partition>`). One member per directory: a second process opening the same
    /// partition's image is refused by the store's lock.
    pub dir: PathBuf,
    /// The version of the fold's state encoding. Change it whenever [`Fold::decode`](crate::snapshot::Fold::decode)
    /// would read old bytes differently: an image written under another version is not used.
    pub state_version: u32,
    /// The block cache of each partition's store, bytes. Default 8 MiB.
    pub cache_bytes: u64,
    /// Warm takeovers: for this long after the member gives a partition up (revoked or lost), it keeps
    /// following the partition's snapshots, read_committed, into its image, so that the partition,
    /// should it come back (a rolling deploy moves partitions away and back), is taken over from near
    /// the tail. Zero (the default) follows no partition; the image is then brought up to date once,
    /// when the partition is released with a flush.
    pub warm_for: std::time::Duration,
    /// How often a followed partition's image is brought up to date. Default 1 s.
    pub warm_every: std::time::Duration,
    /// The memory the keys of each held partition may take, bytes (estimated from their snapshots'
    /// sizes, plus a fixed share per key). `None` (the default): every key of a partition is loaded
    /// into memory at its acquisition. With a budget, an acquisition loads no key but the graves: a
    /// key is read from the image when an event, a timer or a lookup needs it, and keys whose every
    /// change has landed are dropped again, oldest first, once the partition's keys exceed the budget
    /// (a dropped key's timer is kept in an index on disk). Keys with a change not yet landed, outputs
    /// waiting, a grave or a timer already due stay in memory whatever the budget; when changed keys
    /// outgrow it, the partition persists before folding on. The estimate counts each key's key and
    /// snapshot plus a fixed share, and the key table's slots and index with their spare room; the
    /// process's memory beside it (the store's
    /// memtables and block cache, fetches, the allocator) is measured in docs/benchmarks.md.
    pub memory_budget: Option<u64>,
    /// Kept back from the snapshot topic's `delete.retention.ms` when judging whether a checkpoint is
    /// too old to resume from: an image is read from its checkpoint only while the checkpoint's age,
    /// on this member's wall clock, plus this allowance is under the retention. It covers what the
    /// age cannot see: a wall clock stepped forward or back (NTP, a restored VM), the image's
    /// directory moved to a host whose clock differs, a broker clock stepped forward (the cleaner
    /// then drops tombstones early). Default 10 s; docs/fencing.md ("The clock of check 5") argues it.
    pub clock_allowance: std::time::Duration,
}

impl DiskState {
    /// Images under `dir`, state encoding version `state_version`, defaults otherwise.
    pub fn new(dir: impl Into<PathBuf>, state_version: u32) -> Self {
        DiskState {
            dir: dir.into(),
            state_version,
            cache_bytes: 8 << 20,
            warm_for: std::time::Duration::ZERO,
            warm_every: std::time::Duration::from_secs(1),
            memory_budget: None,
            clock_allowance: std::time::Duration::from_secs(10),
        }
    }
}

/// What the on-disk state's acquisitions and catch-ups did, since the flow started
/// ([`Flow::disk_stats`](super::Flow::disk_stats)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DiskStats {
    /// Reads of an image that resumed from its checkpoint: at acquisitions, and when a partition given
    /// up is brought up to date (at its release, and by warm followers).
    pub resumed: u64,
    /// Reads of an image that discarded it and read the partition whole, at the same moments, by
    /// reason (the labels of
    /// `snapfence_state_fallbacks_total`: `no_checkpoint`, `corrupt`, `identity`, `ahead_of_log`,
    /// `log_start_passed`, `diverged`, `too_old`).
    pub fallbacks: std::collections::BTreeMap<&'static str, u64>,
    /// Snapshot records read into images at acquisitions.
    pub records_read: u64,
    /// Snapshot records read into the images of partitions this member gave up: at their release, and
    /// by warm followers ([`DiskState::warm_for`]).
    pub followed_records: u64,
    /// Times a followed partition's image could not be brought up to date (the next try, or the next
    /// acquisition, reads on from its checkpoint).
    pub follow_failures: u64,
    /// With a memory budget ([`DiskState::memory_budget`]), over the partitions held now (since each
    /// was acquired): keys read from disk into memory.
    pub keys_loaded: u64,
    /// Keys dropped from memory under the budget, over the partitions held now.
    pub keys_evicted: u64,
    /// Keys in memory now, over the partitions held now.
    pub keys_in_memory: u64,
}

#[cfg(feature = "disk-state")]
pub(super) use self::disk::{
    catch_up_images, follow_released, load_failure, open_partition_image, stop_following,
    stop_following_all, Taken,
};

#[cfg(feature = "disk-state")]
mod disk {
    use std::sync::Arc;

    use bytes::Bytes;

    use super::super::shared::Shared;
    use super::super::FlowError;
    use super::DiskState;
    use crate::consumer::reader::offset_and_epoch;
    use crate::consumer::{epoch_end_offset, OffsetSpec, TopicPartition};
    use crate::records::IsolationLevel;
    use crate::snapshot::checkpoint::{judge, Checkpoint, Fallback, Identity, Judgement, Observed};
    use crate::snapshot::disk::{
        remove_image, PartitionImage, Put, StateError, GRAVE, NO_DEADLINE,
    };
    use crate::snapshot::error::SnapshotError;
    use crate::snapshot::fold::Fold;
    use crate::snapshot::fold_core::lazy::LoadFailure;
    use crate::snapshot::fold_core::{open_envelope, Opened};
    use crate::snapshot::recovery::read_from;
    use crate::snapshot::state::RecoveredState;

    /// How long an acquisition waits for a locked image to be let go (a partition acquired again in
    /// place while its previous core is still being dropped) before failing with `Locked`.
    const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

    /// The topic's `delete.retention.ms` when the broker reports none: Kafka's default, one day.
    const DEFAULT_DELETE_RETENTION_MS: i64 = 86_400_000;

    /// Why an image is brought up to date.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Read {
        /// The partition is being taken over.
        Acquire,
        /// The member gave the partition up and follows it.
        Follow,
    }

    /// Starts following `partitions`, just released, for [`DiskState::warm_for`]: a task per partition
    /// brings its image up to date at once and then every [`DiskState::warm_every`]. An acquisition of
    /// the partition stops its task first ([`stop_following`]), and so does the flow's end. A failed
    /// catch-up is logged and counted (`DiskStats::follow_failures`) and the task goes on; a task that
    /// panics or is cancelled is logged and counted the same way, and the partition is simply no longer
    /// followed: nothing waits on these tasks.
    pub(in super::super) fn follow_released<F: Fold>(
        shared: &Arc<Shared<F>>,
        disk: &DiskState,
        partitions: &[i32],
    ) {
        let until = tokio::time::Instant::now() + disk.warm_for;
        let mut warm = lock(&shared.warm);
        for &partition in partitions {
            let task = {
                let shared = Arc::clone(shared);
                let disk = disk.clone();
                async move {
                    loop {
                        catch_up_images(&shared, &disk, &[partition]).await;
                        if tokio::time::Instant::now() + disk.warm_every >= until {
                            break;
                        }
                        tokio::time::sleep(disk.warm_every).await;
                    }
                }
            };
            let report = {
                let shared = Arc::downgrade(shared);
                move |failure: crate::supervise::Failure| {
                    if failure == crate::supervise::Failure::Cancelled {
                        // Stopped for an acquisition or the flow's end: what it is for.
                        return;
                    }
                    tracing::warn!(partition, %failure, "a warm follower of a released partition ended");
                    if let Some(shared) = shared.upgrade() {
                        disk_stats(&shared).follow_failures += 1;
                    }
                }
            };
            if let Some(old) = warm.insert(partition, crate::supervise::spawn(task, report)) {
                old.abort();
            }
        }
    }

    /// Stops following `partition` (before it is acquired: its image is then free to open) and waits
    /// until the follower has let go of the image.
    pub(in super::super) async fn stop_following<F: Fold>(shared: &Shared<F>, partition: i32) {
        let task = lock(&shared.warm).remove(&partition);
        if let Some(task) = task {
            task.abort();
            // Aborted or finished; either way the image is closed once the task is gone.
            let _ = task.await;
        }
    }

    /// Stops every follower (the flow ends), without waiting.
    pub(in super::super) fn stop_following_all<F: Fold>(shared: &Shared<F>) {
        for (_, task) in lock(&shared.warm).drain() {
            task.abort();
        }
    }

    /// The partition's directory under `dir`.
    fn partition_dir(disk: &DiskState, topic: &str, partition: i32) -> std::path::PathBuf {
        disk.dir.join(format!("{topic}-{partition}"))
    }

    /// What an acquisition takes from the image.
    pub(in super::super) enum Taken {
        /// Every key (no memory budget).
        Whole(RecoveredState),
        /// The image itself, open, to load keys from as they are needed (a memory budget of so many
        /// bytes).
        Lazy(PartitionImage, u64),
    }

    /// Brings `tp`'s image up to the snapshot partition's high watermark (see [`bring_up_to_date`])
    /// and takes from it what the acquisition needs: every key, or, with a memory budget, the image
    /// itself once its graves and deadline index read cleanly. A corrupt block met in these reads
    /// reads the partition whole into a fresh image; one met later, while keys load, stops the flow
    /// ([`load_failure`]).
    pub(in super::super) async fn open_partition_image<F: Fold>(
        shared: &Shared<F>,
        disk: &DiskState,
        tp: &TopicPartition,
    ) -> Result<Taken, FlowError> {
        let take = |image: PartitionImage| match disk.memory_budget {
            None => image.load_all().map(Taken::Whole),
            Some(budget) => {
                image.graves()?;
                image.next_due_after(i64::MIN)?;
                Ok(Taken::Lazy(image, budget))
            }
        };
        bring_up_to_date(shared, disk, tp.partition, Read::Acquire, take).await
    }

    /// The flow's error for a lazily loaded partition that stopped on its image. A corrupt image was
    /// condemned on disk before (the next acquisition reads whole).
    pub(in super::super) fn load_failure(partition: i32, failure: LoadFailure) -> FlowError {
        match failure {
            LoadFailure::State(e) => FlowError::State {
                partition,
                source: Arc::new(e),
            },
            LoadFailure::BadSnapshot { key, reason } => FlowError::BadSnapshot {
                partition,
                key,
                reason,
            },
        }
    }

    /// Brings the image of `partition` to the high watermark ([`read_into_image`]) and hands it to
    /// `then`. A block that fails its checksum on the way, in the read or in `then`, discards the image
    /// and reads the partition whole into a fresh one, once: at acquisitions and for partitions given
    /// up alike.
    async fn bring_up_to_date<F: Fold, T>(
        shared: &Shared<F>,
        disk: &DiskState,
        partition: i32,
        read: Read,
        then: impl Fn(PartitionImage) -> Result<T, StateError>,
    ) -> Result<T, FlowError> {
        let state_err = |e: StateError| FlowError::State {
            partition,
            source: Arc::new(e),
        };
        let attempt = || async {
            let image = read_into_image(shared, disk, partition, read).await?;
            then(image).map_err(state_err)
        };
        let corrupt = match attempt().await {
            Err(FlowError::State { source, .. }) if source.is_corrupt() => source,
            done => return done,
        };
        let dir = partition_dir(disk, &shared.config.snapshots.snapshot_topic, partition);
        fell_back(
            shared,
            partition,
            &dir,
            &Fallback::Corrupt(corrupt.to_string()),
        );
        remove_image(&dir).map_err(state_err)?;
        attempt().await
    }

    /// Reports a fall-back to a full read: the metric, the flow's [`DiskStats`](super::DiskStats),
    /// and (except for a partition that never had an image) a log line naming why.
    fn fell_back<F: Fold>(
        shared: &Shared<F>,
        partition: i32,
        dir: &std::path::Path,
        why: &Fallback,
    ) {
        crate::telemetry::state_fallback(partition, why.label());
        *disk_stats(shared).fallbacks.entry(why.label()).or_default() += 1;
        if *why != Fallback::NoCheckpoint {
            tracing::warn!(
                partition,
                dir = %dir.display(),
                reason = why.label(),
                detail = ?why,
                "the on-disk state is not used: reading the snapshot partition whole"
            );
        }
    }

    /// After `partitions` were released with a flush: brings their images up to the high watermark,
    /// so that this member, acquiring one again (a restart on the same directory, or the partition
    /// moving back), reads only what was written after now. A failure is logged, not returned: the
    /// image stays at its previous checkpoint, which the next acquisition reads on from.
    pub(in super::super) async fn catch_up_images<F: Fold>(
        shared: &Shared<F>,
        disk: &DiskState,
        partitions: &[i32],
    ) {
        for &partition in partitions {
            if let Err(e) =
                bring_up_to_date(shared, disk, partition, Read::Follow, |_| Ok(())).await
            {
                disk_stats(shared).follow_failures += 1;
                tracing::warn!(partition, error = %e, "the on-disk state was not brought up to date on release");
            }
        }
    }

    /// Brings the image of snapshot partition `partition` to the high watermark: reading from its
    /// checkpoint when the checkpoint holds, else, after a log line and a metric naming why, from the
    /// log start into a fresh image. Ends with a new checkpoint where the read ended.
    async fn read_into_image<F: Fold>(
        shared: &Shared<F>,
        disk: &DiskState,
        partition: i32,
        read: Read,
    ) -> Result<PartitionImage, FlowError> {
        let topic = shared.config.snapshots.snapshot_topic.clone();
        let snapshot_tp = TopicPartition::new(topic.clone(), partition);
        let dir = partition_dir(disk, &topic, partition);
        let state_err = |e: StateError| FlowError::State {
            partition,
            source: Arc::new(e),
        };
        let consumer_err = |e: crate::consumer::ConsumerError| SnapshotError::Consumer {
            partition,
            source: Arc::new(e),
        };
        // The clock the checkpoint's age is measured on, read before the high watermark the read
        // drains to: every record past the checkpoint this read ends at was committed after it
        // (docs/fencing.md, "On-disk state").
        let read_began_ms = wall_clock_ms();
        // Each phase's time goes in the log line at the end (docs/benchmarks.md reads them).
        let phase = std::time::Instant::now();
        let identity = identity_of(shared, disk, &topic, partition).await?;
        let identified = phase.elapsed();
        let phase = std::time::Instant::now();
        let opened = PartitionImage::open_when_free(&dir, disk.cache_bytes, LOCK_WAIT).await;
        let (image, checkpoint) = match opened {
            Ok(image) => match image.checkpoint() {
                Ok(c) => (Some(image), Ok(c)),
                Err(e) => (Some(image), Err(e)),
            },
            Err(e) => (None, Err(e)),
        };
        // A read that found the image corrupt while the partition was held condemned it.
        let checkpoint = match (&image, checkpoint) {
            (Some(image), Ok(c)) => match image.condemned() {
                Ok(Some(why)) => Err(StateError::Corrupt {
                    dir: dir.clone(),
                    detail: format!("condemned while in use: {why}"),
                }),
                Ok(None) => Ok(c),
                Err(e) => Err(e),
            },
            (_, c) => c,
        };
        let opened = phase.elapsed();
        let phase = std::time::Instant::now();
        // The log's bounds the judgement read are the read's too: its start, and the high watermark
        // it drains to.
        let (judgement, bounds) = match checkpoint {
            Err(e) if e.is_corrupt() => {
                (Judgement::FullRead(Fallback::Corrupt(e.to_string())), None)
            }
            Err(e) => return Err(state_err(e)),
            Ok(checkpoint) => {
                let seen = observe(
                    shared,
                    disk,
                    &snapshot_tp,
                    identity.clone(),
                    checkpoint.as_ref(),
                )
                .await?;
                let bounds = Some((seen.log_start, seen.high_watermark));
                (judge(checkpoint.as_ref(), &seen), bounds)
            }
        };
        let (image, from) = match judgement {
            Judgement::Resume { from } => match image {
                Some(image) => {
                    disk_stats(shared).resumed += 1;
                    (image, from)
                }
                None => return Err(unreachable_image(&dir, partition)),
            },
            Judgement::FullRead(why) => {
                fell_back(shared, partition, &dir, &why);
                drop(image);
                remove_image(&dir).map_err(state_err)?;
                let fresh = PartitionImage::open_when_free(&dir, disk.cache_bytes, LOCK_WAIT)
                    .await
                    .map_err(state_err)?;
                (fresh, 0)
            }
        };
        let judged = phase.elapsed();
        let began = std::time::Instant::now();
        let mut log = shared.recovery_reads.log(partition);
        let recovery = shared.recovery_config();
        let fold = &*shared.fold;
        // Each fetch's records are applied as one batch once the fetch is handed over; the checkpoint
        // moves only at the end, so a crash mid-read resumes from the previous one and applies the
        // same records again, which leaves each key as the log has it.
        let puts: std::sync::Mutex<Vec<Put>> = Default::default();
        let mut failed: Option<StateError> = None;
        let stats = {
            let image = &image;
            let failed = &mut failed;
            let puts = &puts;
            read_from(
                &mut log,
                partition,
                &recovery,
                from,
                bounds,
                |key, value| lock(puts).push(put_of(fold, key, value)),
                |_position| {
                    let batch = std::mem::take(&mut *lock(puts));
                    match image.apply(batch, None, false) {
                        Ok(()) => Ok(()),
                        Err(e) => {
                            *failed = Some(e);
                            Err(SnapshotError::Config(
                                "the on-disk state could not be written".into(),
                            ))
                        }
                    }
                },
            )
            .await
        };
        let stats = match (stats, failed) {
            (_, Some(e)) => return Err(state_err(e)),
            (stats, None) => stats?,
        };
        match read {
            Read::Acquire => disk_stats(shared).records_read += stats.records,
            Read::Follow => disk_stats(shared).followed_records += stats.records,
        }
        let read_for = began.elapsed();
        let phase = std::time::Instant::now();
        // The checkpoint: where the read ended, under the leader epoch now (at or above the epoch of
        // every record read), and the clock read before the read's target was taken.
        let (_, epoch) = offset_and_epoch(
            &shared.client,
            &snapshot_tp,
            OffsetSpec::Latest,
            IsolationLevel::ReadCommitted,
        )
        .await
        .map_err(consumer_err)?;
        let checkpoint = Checkpoint {
            identity,
            offset: stats.end,
            leader_epoch: epoch,
            time_ms: read_began_ms,
        };
        image
            .apply(Vec::new(), Some(&checkpoint), true)
            .map_err(state_err)?;
        // The checkpoint is durable in the journal already (synced above). Waiting for the tables
        // only keeps a reopen from replaying the journal; an acquisition does not wait for it (it
        // was ~0.9 s of a 1.0 s resume at 10^7 keys, the worker busy compacting what the read
        // wrote), a partition given up does, since nothing waits on it and its image may sit closed.
        match read {
            Read::Acquire => image.seal_all().map_err(state_err)?,
            Read::Follow => image.flush().map_err(state_err)?,
        }
        tracing::info!(
            partition,
            from,
            end = stats.end,
            records = stats.records,
            elapsed = ?began.elapsed(),
            // Before the read: the metadata naming the checkpoint's owner, opening the image, and the
            // requests judging its checkpoint; the read itself; then the new checkpoint written.
            ?identified,
            ?opened,
            ?judged,
            read = ?read_for,
            checkpointed = ?phase.elapsed(),
            "on-disk state brought to the high watermark"
        );
        Ok(image)
    }

    /// `judge` resumes only from a checkpoint, which only an open image yields; should that ever not
    /// hold, the acquisition fails rather than read from nowhere.
    fn unreachable_image(dir: &std::path::Path, partition: i32) -> FlowError {
        FlowError::State {
            partition,
            source: Arc::new(StateError::Io {
                dir: dir.to_path_buf(),
                detail: "a checkpoint was judged without an open image".into(),
            }),
        }
    }

    /// One record of the snapshot partition as a change of the image, with the deadline of its state
    /// (none when the state does not decode: the final value is decoded again, and refused, when the
    /// partition is restored).
    fn put_of<F: Fold>(fold: &F, key: &Bytes, value: Option<&[u8]>) -> Put {
        let Some(value) = value else {
            return Put::remove(key);
        };
        let deadline = match open_envelope(value) {
            Ok(Opened::Live(_, payload)) | Ok(Opened::LiveInputs(_, payload)) => fold
                .decode(payload)
                .ok()
                .and_then(|state| fold.deadline(key, &state))
                .unwrap_or(NO_DEADLINE),
            Ok(Opened::Grave(_)) | Ok(Opened::GraveInputs(_)) => GRAVE,
            Err(_) => NO_DEADLINE,
        };
        Put::value(key, value, deadline)
    }

    /// What this acquisition's checkpoint must belong to.
    async fn identity_of<F: Fold>(
        shared: &Shared<F>,
        disk: &DiskState,
        topic: &str,
        partition: i32,
    ) -> Result<Identity, FlowError> {
        let metadata = shared
            .client
            .metadata(&[topic])
            .await
            .map_err(|e| SnapshotError::Net {
                partition,
                source: Arc::new(e),
            })?;
        let (topic_id, partition_count) = metadata
            .topics
            .get(topic)
            .map(|t| {
                (
                    t.id.0,
                    i32::try_from(t.partitions.len()).unwrap_or(i32::MAX),
                )
            })
            .unwrap_or(([0; 16], 0));
        Ok(Identity {
            cluster_id: metadata.cluster_id.clone().unwrap_or_default(),
            topic_id,
            partition,
            partition_count,
            transactional_prefix: shared.config.snapshots.transactional_id_prefix.clone(),
            group: shared.config.consumer.group.group_id.clone(),
            state_version: disk.state_version,
        })
    }

    /// What the checkpoint is judged by: the log's start and end, the checkpoint epoch's end on the
    /// leader, the topic's `delete.retention.ms` now, and the clock.
    async fn observe<F: Fold>(
        shared: &Shared<F>,
        disk: &DiskState,
        tp: &TopicPartition,
        identity: Identity,
        checkpoint: Option<&Checkpoint>,
    ) -> Result<Observed, FlowError> {
        let partition = tp.partition;
        let consumer_err = |e: crate::consumer::ConsumerError| SnapshotError::Consumer {
            partition,
            source: Arc::new(e),
        };
        let client = &shared.client;
        let (log_start, _) = offset_and_epoch(
            client,
            tp,
            OffsetSpec::Earliest,
            IsolationLevel::ReadUncommitted,
        )
        .await
        .map_err(consumer_err)?;
        let (high_watermark, _) = offset_and_epoch(
            client,
            tp,
            OffsetSpec::Latest,
            IsolationLevel::ReadUncommitted,
        )
        .await
        .map_err(consumer_err)?;
        let epoch_end = match checkpoint {
            Some(c) if c.offset > 0 => Some(
                epoch_end_offset(client, tp, c.leader_epoch)
                    .await
                    .map_err(consumer_err)?,
            ),
            _ => None,
        };
        let retention = crate::admin::topic_config(client, &tp.topic, "delete.retention.ms")
            .await
            .map_err(|e| SnapshotError::Net {
                partition,
                source: Arc::new(e),
            })?;
        let delete_retention_ms = retention
            .and_then(|v| v.trim().parse::<i64>().ok())
            .unwrap_or(DEFAULT_DELETE_RETENTION_MS);
        Ok(Observed {
            identity,
            log_start,
            high_watermark,
            epoch_end,
            now_ms: wall_clock_ms(),
            delete_retention_ms,
            clock_allowance_ms: i64::try_from(disk.clock_allowance.as_millis()).unwrap_or(i64::MAX),
        })
    }

    fn disk_stats<F: Fold>(shared: &Shared<F>) -> std::sync::MutexGuard<'_, super::DiskStats> {
        lock(&shared.disk_stats)
    }

    fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn wall_clock_ms() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }
}
