//! The recovery read: everything committed to a snapshot partition, folded into per-key state.
//!
//! The read's target is the high watermark, captured once at the start by a read_uncommitted ListOffsets.
//! The read itself runs at read_committed from the log start until its position reaches that target. It must
//! not stop at the last stable offset: an open transaction pins the LSO below committed snapshots written
//! after it, and a read that stopped there would complete while silently missing them (KAFKA-10167 is the
//! same under-read in Kafka Streams' restore). So an open transaction makes the read *wait*.
//!
//! The wait is normally short (the partition's own unfinished transactions are aborted when the new owner's
//! producer initialises, before recovery starts) and otherwise bounded by the pinning producer's transaction
//! timeout. Two failures can make it endless: the log was truncated below the target (lost records), or a
//! transaction hangs. A no-progress deadline, reset by every advance of the position, turns those into an
//! error naming which of the two it is, found by re-reading the log end: below the target is truncation, at
//! or above it is an open transaction.
//!
//! # References
//! - KIP-98 (read_committed, LSO), KIP-664 (hanging transactions), KIP-890 (prevention since Kafka 3.6)

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use tracing::Instrument;

use super::error::{SnapshotError, StallDiagnosis};
use super::state::RecoveredState;
use crate::telemetry::RecoveryMetrics;

/// Why reading the snapshot log failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    /// The consumer's read or offset lookup failed.
    #[error(transparent)]
    Consumer(#[from] crate::consumer::ConsumerError),
    /// The broker's offset answer left the partition out.
    #[error("no offset returned for {0}")]
    NoOffset(crate::producer::TopicPartition),
    /// The shared reader's Fetch failed (see [`SharedLogs`](super::SharedLogs)); shared because one
    /// Fetch's failure can reach every read waiting on it.
    #[error("shared recovery read: {0}")]
    SharedFetch(std::sync::Arc<crate::consumer::ConsumerError>),
    /// The shared reader's task ended (how, if it died) before answering.
    #[error("the shared recovery reader {0}")]
    ReaderGone(String),
}

/// What one read_committed fetch delivered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogChunk {
    /// The committed records, as (key, value); markers and aborted records already removed. They may be
    /// slices of the fetch buffer (as [`PartitionLog`](super::PartitionLog)'s are): keeping one keeps the
    /// whole buffer alive.
    pub records: Vec<(Option<Bytes>, Option<Bytes>)>,
    /// The offset the next fetch starts at (past skipped aborted batches and markers too).
    pub next_offset: i64,
}

/// The snapshot partition as the recovery read sees it. Implemented over the consumer's partition reader;
/// tests use a scripted fake.
pub trait SnapshotLog: Send {
    /// The high watermark (ListOffsets latest at read_uncommitted).
    fn high_watermark(&mut self) -> impl Future<Output = Result<i64, LogError>> + Send;
    /// The last stable offset (ListOffsets latest at read_committed).
    fn last_stable_offset(&mut self) -> impl Future<Output = Result<i64, LogError>> + Send;
    /// The log start offset (ListOffsets earliest).
    fn log_start(&mut self) -> impl Future<Output = Result<i64, LogError>> + Send;
    /// One read_committed fetch from `offset`, letting the broker wait up to `max_wait` for data.
    fn fetch(
        &mut self,
        offset: i64,
        max_wait: Duration,
    ) -> impl Future<Output = Result<LogChunk, LogError>> + Send;
}

/// How the recovery read behaves.
#[derive(Debug, Clone)]
pub struct RecoveryConfig {
    /// Fail when the position has not advanced for this long. `None` waits forever (the non-transactional
    /// mode: only the transactional mode carries the designed wait).
    pub stall_timeout: Option<Duration>,
    /// While stalled, log progress this often.
    pub progress_every: Duration,
    /// How long each fetch lets the broker wait for data.
    pub fetch_wait: Duration,
}

impl Default for RecoveryConfig {
    fn default() -> Self {
        RecoveryConfig {
            stall_timeout: Some(Duration::from_secs(180)),
            progress_every: Duration::from_secs(5),
            fetch_wait: Duration::from_millis(500),
        }
    }
}

/// What a completed recovery read did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryStats {
    /// Where the read started: the log start, or the checkpoint an on-disk state resumed from.
    pub start: i64,
    /// The captured high watermark the read drained to.
    pub target: i64,
    /// The position the read ended at (at or past the target).
    pub end: i64,
    /// Records folded.
    pub records: u64,
    /// Key and value bytes folded.
    pub bytes: u64,
    /// Whether the LSO sat below the target when the read began (it had to wait for open transactions).
    pub waited_for_open_transactions: bool,
    /// Wall time of the read.
    pub elapsed: Duration,
}

/// Reads a snapshot partition to its captured high watermark at read_committed and folds it: a value puts
/// the key, a null value (tombstone) removes it, a record without a key is ignored.
///
/// Each record is copied into the state's arena as it is folded, so a fetch buffer is freed as soon as its
/// records are folded, and the state costs its live bytes plus a small index (see [`RecoveredState`]).
///
/// Cancel safety: cancel-safe in the sense that dropping the future leaves nothing behind (the read has no
/// side effects); the partial state is lost.
pub async fn recover<L: SnapshotLog>(
    log: &mut L,
    partition: i32,
    config: &RecoveryConfig,
) -> Result<(RecoveredState, RecoveryStats), SnapshotError> {
    let mut state = RecoveredState::new();
    let stats = read_to_target(log, partition, config, |key, value| match value {
        Some(v) => {
            state.insert(key, v);
        }
        None => {
            state.remove(key);
        }
    })
    .await?;
    Ok((state, stats))
}

/// The read loop behind [`recover`], handing each keyed record to `fold` in log order.
///
/// The key and value are lent for the call only: they point into the fetch buffer, which is freed once
/// its records are folded. A fold that keeps them copies them (`Bytes::copy_from_slice`), so it holds its
/// data and not every buffer a kept record came from.
///
/// Cancel safety: as [`recover`].
pub async fn read_to_target<L: SnapshotLog>(
    log: &mut L,
    partition: i32,
    config: &RecoveryConfig,
    mut fold: impl FnMut(&[u8], Option<&[u8]>),
) -> Result<RecoveryStats, SnapshotError> {
    // One span per read: its lines (the wait warning, progress, completion) say which read they are.
    let span = tracing::info_span!(
        "recovery_read",
        partition,
        target = tracing::field::Empty,
        start = tracing::field::Empty,
    );
    read(
        log,
        partition,
        config,
        None,
        None,
        |key, value| fold(key, value),
        |_| Ok(()),
    )
    .instrument(span)
    .await
}

/// [`read_to_target`] from `from` (or the log start, when that is later) instead of the log start,
/// calling `chunk` with the position after each fetch's records were handed to `fold`: the on-disk
/// state applies them there (an error from `chunk` ends the read). `bounds`, when the caller has just
/// read them, are the log start and the high watermark (the target), which are then not asked again.
/// The key is lent as the fetch buffer's own `Bytes`, so a fold that needs one does not copy it.
#[cfg(feature = "disk-state")]
pub(crate) async fn read_from<L: SnapshotLog>(
    log: &mut L,
    partition: i32,
    config: &RecoveryConfig,
    from: i64,
    bounds: Option<(i64, i64)>,
    fold: impl FnMut(&Bytes, Option<&[u8]>),
    chunk: impl FnMut(i64) -> Result<(), SnapshotError>,
) -> Result<RecoveryStats, SnapshotError> {
    let span = tracing::info_span!(
        "recovery_read",
        partition,
        from,
        target = tracing::field::Empty,
        start = tracing::field::Empty,
    );
    read(log, partition, config, Some(from), bounds, fold, chunk)
        .instrument(span)
        .await
}

async fn read<L: SnapshotLog>(
    log: &mut L,
    partition: i32,
    config: &RecoveryConfig,
    from: Option<i64>,
    bounds: Option<(i64, i64)>,
    mut fold: impl FnMut(&Bytes, Option<&[u8]>),
    mut chunk_done: impl FnMut(i64) -> Result<(), SnapshotError>,
) -> Result<RecoveryStats, SnapshotError> {
    let io = |e: LogError| SnapshotError::Read {
        partition,
        source: std::sync::Arc::new(e),
    };
    let metrics = RecoveryMetrics::new(partition);
    let began = Instant::now();
    let (log_start, target) = match bounds {
        Some(bounds) => bounds,
        None => {
            let target = log.high_watermark().await.map_err(io)?;
            (log.log_start().await.map_err(io)?, target)
        }
    };
    let start = from.map_or(log_start, |from| from.max(log_start));
    let span = tracing::Span::current();
    span.record("target", target);
    span.record("start", start);
    let lso = log.last_stable_offset().await;
    metrics.started(target, lso.as_ref().ok().copied());
    let waited = match lso {
        Ok(lso) if lso < target => {
            tracing::warn!(
                partition,
                lso,
                target,
                "recovery waits for open transactions on the snapshot partition: the last stable offset is below \
                 the high watermark"
            );
            true
        }
        Ok(_) => false,
        Err(e) => {
            tracing::debug!(partition, error = %e, "could not read the last stable offset before recovery");
            false
        }
    };

    let mut position = start;
    let mut watch = StallWatch::new(position, began, config.stall_timeout, config.progress_every);
    let (mut records, mut bytes) = (0u64, 0u64);
    // A stall is counted once, at its first progress line, however many lines it takes.
    let mut reported_this_stall = false;
    while position < target {
        let chunk = log.fetch(position, config.fetch_wait).await.map_err(io)?;
        for (key, value) in chunk.records {
            let Some(key) = key else { continue };
            records += 1;
            bytes += (key.len() + value.as_ref().map_or(0, Bytes::len)) as u64;
            fold(&key, value.as_deref());
        }
        // A broker never moves a consumer backwards; a fetch answer that claims to is ignored.
        position = position.max(chunk.next_offset);
        chunk_done(position)?;
        match watch.observe(position, Instant::now()) {
            Watch::Advanced => reported_this_stall = false,
            Watch::Waiting {
                stalled_for,
                report,
            } => {
                if report {
                    if !reported_this_stall {
                        reported_this_stall = true;
                        metrics.stalled();
                    }
                    tracing::warn!(
                        partition,
                        position,
                        target,
                        ?stalled_for,
                        "recovery read is waiting"
                    );
                }
            }
            Watch::Expired { stalled_for } => {
                let diagnosis = diagnose(log, target).await;
                return Err(SnapshotError::RecoveryStalled {
                    partition,
                    position,
                    target,
                    stalled_for,
                    diagnosis,
                });
            }
        }
    }
    let elapsed = began.elapsed();
    metrics.completed(elapsed, records, bytes);
    tracing::info!(
        partition,
        keys = records,
        bytes,
        end = position,
        ?elapsed,
        "recovery read complete"
    );
    Ok(RecoveryStats {
        start,
        target,
        end: position,
        records,
        bytes,
        waited_for_open_transactions: waited,
        elapsed,
    })
}

/// Re-reads the log end to tell truncation from an open transaction.
async fn diagnose<L: SnapshotLog>(log: &mut L, target: i64) -> StallDiagnosis {
    match log.high_watermark().await {
        Err(e) => StallDiagnosis::Undetermined {
            reason: e.to_string(),
        },
        Ok(log_end) if log_end < target => StallDiagnosis::Truncated { log_end },
        Ok(log_end) => StallDiagnosis::OpenTransaction {
            log_end,
            last_stable_offset: log.last_stable_offset().await.ok(),
        },
    }
}

/// The no-progress clock, without I/O: fed positions and times, it says whether the deadline has passed.
#[derive(Debug)]
pub(crate) struct StallWatch {
    deadline: Option<Duration>,
    report_every: Duration,
    position: i64,
    since: Instant,
    last_report: Instant,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Watch {
    Advanced,
    Waiting { stalled_for: Duration, report: bool },
    Expired { stalled_for: Duration },
}

impl StallWatch {
    pub(crate) fn new(
        position: i64,
        now: Instant,
        deadline: Option<Duration>,
        report_every: Duration,
    ) -> Self {
        StallWatch {
            deadline,
            report_every,
            position,
            since: now,
            last_report: now,
        }
    }

    pub(crate) fn observe(&mut self, position: i64, now: Instant) -> Watch {
        if position > self.position {
            self.position = position;
            self.since = now;
            self.last_report = now;
            return Watch::Advanced;
        }
        let stalled_for = now.saturating_duration_since(self.since);
        if self.deadline.is_some_and(|d| stalled_for >= d) {
            return Watch::Expired { stalled_for };
        }
        let report = now.saturating_duration_since(self.last_report) >= self.report_every;
        if report {
            self.last_report = now;
        }
        Watch::Waiting {
            stalled_for,
            report,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A scripted snapshot partition: committed records below `lso` are visible; the test moves `lso` and
    /// `hw` to model transactions resolving and the log being truncated.
    #[derive(Default)]
    struct World {
        records: Vec<(i64, Option<Bytes>, Option<Bytes>)>,
        hw: i64,
        lso: i64,
        start: i64,
        hw_reads: u32,
        /// Fail every high-watermark read after the first `n` (the re-read in the diagnosis).
        fail_hw_after: Option<u32>,
        /// Visible records per fetch, to make a slow but progressing read.
        per_fetch: Option<usize>,
    }

    #[derive(Clone, Default)]
    struct FakeLog(Arc<Mutex<World>>);

    impl FakeLog {
        fn with(records: &[(&str, Option<&str>)], hw: i64, lso: i64) -> Self {
            let w = World {
                records: records
                    .iter()
                    .enumerate()
                    .map(|(i, (k, v))| {
                        (
                            i as i64,
                            Some(Bytes::copy_from_slice(k.as_bytes())),
                            v.map(|v| Bytes::copy_from_slice(v.as_bytes())),
                        )
                    })
                    .collect(),
                hw,
                lso,
                ..Default::default()
            };
            FakeLog(Arc::new(Mutex::new(w)))
        }
    }

    impl SnapshotLog for FakeLog {
        async fn high_watermark(&mut self) -> Result<i64, LogError> {
            let mut w = self.0.lock().unwrap();
            w.hw_reads += 1;
            if w.fail_hw_after.is_some_and(|n| w.hw_reads > n) {
                return Err(LogError::Consumer(crate::consumer::ConsumerError::Net(
                    crate::net::NetError::Config("broker unreachable".into()),
                )));
            }
            Ok(w.hw)
        }
        async fn last_stable_offset(&mut self) -> Result<i64, LogError> {
            Ok(self.0.lock().unwrap().lso)
        }
        async fn log_start(&mut self) -> Result<i64, LogError> {
            Ok(self.0.lock().unwrap().start)
        }
        async fn fetch(&mut self, offset: i64, max_wait: Duration) -> Result<LogChunk, LogError> {
            let chunk = {
                let w = self.0.lock().unwrap();
                let limit = w.lso.min(w.hw);
                let mut recs: Vec<_> = w
                    .records
                    .iter()
                    .filter(|r| r.0 >= offset && r.0 < limit)
                    .cloned()
                    .collect();
                if let Some(n) = w.per_fetch {
                    recs.truncate(n);
                }
                let next = recs.last().map(|r| r.0 + 1).unwrap_or(offset.max(offset));
                LogChunk {
                    next_offset: if w.per_fetch.is_some() {
                        next
                    } else {
                        limit.max(offset)
                    },
                    records: recs.into_iter().map(|r| (r.1, r.2)).collect(),
                }
            };
            if chunk.next_offset == offset {
                tokio::time::sleep(max_wait).await;
            }
            Ok(chunk)
        }
    }

    fn cfg(stall: Option<u64>) -> RecoveryConfig {
        RecoveryConfig {
            stall_timeout: stall.map(Duration::from_secs),
            progress_every: Duration::from_secs(5),
            fetch_wait: Duration::from_millis(500),
        }
    }

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    /// Folding: a value puts, a tombstone removes, a keyless record is ignored; later snapshots win.
    #[tokio::test(start_paused = true)]
    async fn folds_puts_tombstones_and_skips_keyless() {
        let log = FakeLog::with(
            &[
                ("a", Some("1")),
                ("b", Some("2")),
                ("a", Some("3")),
                ("b", None),
            ],
            4,
            4,
        );
        log.0.lock().unwrap().records.push((4, None, Some(b("x"))));
        log.0.lock().unwrap().hw = 5;
        log.0.lock().unwrap().lso = 5;
        let (state, stats) = recover(&mut log.clone(), 0, &cfg(Some(180))).await.unwrap();
        assert_eq!(state, [("a", "3")].into_iter().collect());
        assert_eq!((stats.target, stats.end, stats.records), (5, 5, 4));
        assert!(!stats.waited_for_open_transactions);
    }

    /// The read drains to the captured high watermark, not to the LSO: an open transaction below committed
    /// snapshots makes it wait, and the snapshots above the pin are recovered once it resolves.
    #[tokio::test(start_paused = true)]
    async fn drains_to_high_watermark_not_lso() {
        let log = FakeLog::with(
            &[("a", Some("old")), ("b", Some("1")), ("a", Some("new"))],
            3,
            1,
        );
        let world = log.0.clone();
        let resolver = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(20)).await;
            world.lock().unwrap().lso = 3;
        });
        let began = Instant::now();
        let (state, stats) = recover(&mut log.clone(), 0, &cfg(Some(60))).await.unwrap();
        resolver.await.unwrap();
        assert!(
            began.elapsed() >= Duration::from_secs(20),
            "the read waited for the transaction"
        );
        assert_eq!(
            state.get("a"),
            Some(&b"new"[..]),
            "a read bounded by the LSO would have kept 'old'"
        );
        assert_eq!(state.get("b"), Some(&b"1"[..]));
        assert!(stats.waited_for_open_transactions);
    }

    /// A log truncated below the captured target can never be drained: the deadline fails the read and the
    /// diagnosis says truncation, with the new log end.
    #[tokio::test(start_paused = true)]
    async fn stall_diagnosed_as_truncation() {
        let log = FakeLog::with(&[("a", Some("1")), ("b", Some("2"))], 10, 2);
        let world = log.0.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            world.lock().unwrap().hw = 2;
        });
        let err = recover(&mut log.clone(), 7, &cfg(Some(30)))
            .await
            .unwrap_err();
        match err {
            SnapshotError::RecoveryStalled {
                partition,
                position,
                target,
                stalled_for,
                diagnosis,
            } => {
                assert_eq!((partition, position, target), (7, 2, 10));
                assert!(stalled_for >= Duration::from_secs(30));
                assert_eq!(diagnosis, StallDiagnosis::Truncated { log_end: 2 });
            }
            other => panic!("expected a stall, got {other}"),
        }
    }

    /// An LSO pinned below the target past the deadline is diagnosed as an open transaction.
    #[tokio::test(start_paused = true)]
    async fn stall_diagnosed_as_open_transaction() {
        let log = FakeLog::with(
            &[("a", Some("1")), ("b", Some("2")), ("c", Some("3"))],
            3,
            1,
        );
        let err = recover(&mut log.clone(), 0, &cfg(Some(30)))
            .await
            .unwrap_err();
        let SnapshotError::RecoveryStalled {
            diagnosis,
            position,
            ..
        } = &err
        else {
            panic!("{err}")
        };
        assert_eq!(*position, 1);
        assert_eq!(
            *diagnosis,
            StallDiagnosis::OpenTransaction {
                log_end: 3,
                last_stable_offset: Some(1)
            }
        );
        assert!(
            err.to_string().contains("find-hanging"),
            "the message names the next step: {err}"
        );
    }

    /// When the diagnostic re-read itself fails, the error says the cause is undetermined rather than
    /// guessing, and the stall is still reported.
    #[tokio::test(start_paused = true)]
    async fn failed_reread_is_undetermined() {
        let log = FakeLog::with(&[("a", Some("1"))], 5, 1);
        log.0.lock().unwrap().fail_hw_after = Some(1);
        let err = recover(&mut log.clone(), 0, &cfg(Some(10)))
            .await
            .unwrap_err();
        let SnapshotError::RecoveryStalled { diagnosis, .. } = err else {
            panic!()
        };
        assert!(
            matches!(diagnosis, StallDiagnosis::Undetermined { reason } if reason.contains("unreachable"))
        );
    }

    /// A slow read that keeps advancing outlives the deadline: only a lack of progress fails it.
    #[tokio::test(start_paused = true)]
    async fn progressing_read_outlives_deadline() {
        let keys: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
        let recs: Vec<(&str, Option<&str>)> =
            keys.iter().map(|k| (k.as_str(), Some("v"))).collect();
        let log = FakeLog::with(&recs, 40, 0);
        log.0.lock().unwrap().per_fetch = Some(1);
        let world = log.0.clone();
        // The LSO creeps up one record every 2 s: 80 s in total against a 10 s deadline.
        tokio::spawn(async move {
            for lso in 1..=40 {
                tokio::time::sleep(Duration::from_secs(2)).await;
                world.lock().unwrap().lso = lso;
            }
        });
        let began = Instant::now();
        let (state, _) = recover(&mut log.clone(), 0, &cfg(Some(10))).await.unwrap();
        assert_eq!(state.len(), 40);
        assert!(began.elapsed() >= Duration::from_secs(80));
    }

    /// Without a deadline the read waits, however long the pin lasts.
    #[tokio::test(start_paused = true)]
    async fn no_deadline_waits() {
        let log = FakeLog::with(&[("a", Some("1")), ("b", Some("2"))], 2, 0);
        let mut reader = log.clone();
        let read = tokio::spawn(async move { recover(&mut reader, 0, &cfg(None)).await });
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(
            !read.is_finished(),
            "an hour of pinned LSO and the read still waits"
        );
        log.0.lock().unwrap().lso = 2;
        let (state, _) = read.await.unwrap().unwrap();
        assert_eq!(state.len(), 2);
    }

    /// The lines an operator reads during a recovery that waits for an open transaction: the warning that
    /// the target is above the LSO once, a progress line every `progress_every` while nothing moves,
    /// and the completion with keys and bytes, all in the read's span; and the metrics of the same read.
    #[test]
    fn a_waiting_read_warns_once_reports_progress_and_completes() {
        use crate::telemetry::capture::capture;
        use crate::telemetry::recording::Recording;
        use crate::telemetry::{
            RECOVERY_BYTES, RECOVERY_DURATION, RECOVERY_KEYS, RECOVERY_LSO_GAP, RECOVERY_STALLS,
            RECOVERY_WAITED,
        };
        let rec = Recording::default();
        let ((), lines) = capture(|| {
            rec.run(async {
                tokio::time::pause();
                let log = FakeLog::with(
                    &[("a", Some("old")), ("b", Some("1")), ("a", Some("new"))],
                    3,
                    1,
                );
                let world = log.0.clone();
                // Off the fetches' 500 ms grid, so no two timers tie.
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(22_250)).await;
                    world.lock().unwrap().lso = 3;
                });
                let (_, stats) = recover(&mut log.clone(), 2, &cfg(Some(60))).await.unwrap();
                assert_eq!((stats.records, stats.bytes), (3, 10));
            })
        });
        let warned = lines.containing("recovery waits for open transactions");
        assert_eq!(warned.len(), 1, "once per read");
        assert_eq!(warned[0].level, tracing::Level::WARN);
        assert_eq!(
            (warned[0].field("lso"), warned[0].field("target")),
            (Some("1"), Some("3"))
        );
        let progress = lines.containing("recovery read is waiting");
        assert_eq!(progress.len(), 4, "at 5, 10, 15 and 20 s of the 22 s wait");
        assert!(progress.iter().all(|l| l.field("position") == Some("1")));
        let done = lines.containing("recovery read complete");
        assert_eq!(done.len(), 1);
        assert_eq!(
            (done[0].field("keys"), done[0].field("bytes")),
            (Some("3"), Some("10"))
        );
        for line in warned.iter().chain(&progress).chain(&done) {
            let span = line.span("recovery_read").expect("inside the read's span");
            assert_eq!(span.get("partition").map(String::as_str), Some("2"));
            assert_eq!(span.get("target").map(String::as_str), Some("3"));
        }
        let p = [("partition", "2")];
        assert_eq!(rec.counter(RECOVERY_KEYS.name, &p), 3);
        assert_eq!(rec.counter(RECOVERY_BYTES.name, &p), 10);
        assert_eq!(rec.counter(RECOVERY_WAITED.name, &p), 1);
        assert_eq!(
            rec.counter(RECOVERY_STALLS.name, &p),
            1,
            "one stall, four lines"
        );
        assert_eq!(rec.gauge_at(RECOVERY_LSO_GAP.name, &p), 2.0);
        let took = rec.samples(RECOVERY_DURATION.name, &p);
        assert_eq!(took.len(), 1);
        assert!((22.0..24.0).contains(&took[0]), "{took:?}");
    }

    /// A read with nothing open prints no warning and no progress, and counts no wait and no stall;
    /// two stalls of one read count twice.
    #[test]
    fn stalls_and_waits_are_counted_only_when_they_happen() {
        use crate::telemetry::capture::capture;
        use crate::telemetry::recording::Recording;
        use crate::telemetry::{RECOVERY_LSO_GAP, RECOVERY_STALLS, RECOVERY_WAITED};
        let rec = Recording::default();
        let ((), lines) = capture(|| {
            rec.run(async {
                tokio::time::pause();
                let log = FakeLog::with(&[("a", Some("1")), ("b", Some("2"))], 2, 2);
                recover(&mut log.clone(), 0, &cfg(Some(60))).await.unwrap();

                let log = FakeLog::with(&[("a", Some("1")), ("b", Some("2")), ("c", None)], 3, 1);
                let world = log.0.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(6_250)).await;
                    world.lock().unwrap().lso = 2;
                    tokio::time::sleep(Duration::from_secs(6)).await;
                    world.lock().unwrap().lso = 3;
                });
                recover(&mut log.clone(), 1, &cfg(Some(60))).await.unwrap();
            })
        });
        let quiet = [("partition", "0")];
        assert_eq!(rec.counter(RECOVERY_WAITED.name, &quiet), 0);
        assert_eq!(rec.counter(RECOVERY_STALLS.name, &quiet), 0);
        assert_eq!(rec.gauge_at(RECOVERY_LSO_GAP.name, &quiet), 0.0);
        let stalled = [("partition", "1")];
        assert_eq!(rec.counter(RECOVERY_STALLS.name, &stalled), 2);
        let warned = lines.containing("recovery waits for open transactions");
        assert_eq!(warned.len(), 1);
        assert_eq!(warned[0].span("recovery_read").unwrap()["partition"], "1");
        assert_eq!(lines.containing("recovery read complete").len(), 2);
    }

    /// Recovery waiting on an open transaction reports at most once per reporting interval, any progress
    /// restarts the stall clock, and only an unbroken stall past the limit expires.
    #[test]
    fn stall_watch_resets_on_progress_and_reports_periodically() {
        let t0 = Instant::now();
        let mut w = StallWatch::new(0, t0, Some(Duration::from_secs(10)), Duration::from_secs(3));
        assert_eq!(
            w.observe(0, t0 + Duration::from_secs(2)),
            Watch::Waiting {
                stalled_for: Duration::from_secs(2),
                report: false
            }
        );
        assert!(matches!(
            w.observe(0, t0 + Duration::from_secs(4)),
            Watch::Waiting { report: true, .. }
        ));
        assert_eq!(w.observe(5, t0 + Duration::from_secs(9)), Watch::Advanced);
        assert!(matches!(
            w.observe(5, t0 + Duration::from_secs(18)),
            Watch::Waiting { .. }
        ));
        assert_eq!(
            w.observe(5, t0 + Duration::from_secs(19)),
            Watch::Expired {
                stalled_for: Duration::from_secs(10)
            }
        );
    }
}
