//! Recovery reads of many snapshot partitions sharing one reader, so that a member taking over N
//! partitions sends one Fetch per broker per round instead of one per partition.
//!
//! [`SharedLogs`] owns a read_committed [`PartitionReader`] in a supervised driver task; each
//! [`SharedPartitionLog`] it hands out is a [`SnapshotLog`] whose `fetch` is a command to that task.
//! The decisions live in [`Core`], which does no I/O: which partitions the next Fetch carries, where
//! each must seek, which chunk answers which waiting read. The task is a small loop that applies the
//! core's plan to the reader, fetches, and hands the answers back.
//!
//! - **One room per partition.** After a partition's chunk is delivered, the next Fetch reads its
//!   following chunk ahead into the partition's room, so the recovery folds one chunk while the next is
//!   on the wire. A partition at the end the broker last reported is not read ahead, and a Fetch that
//!   only reads ahead does not wait at the broker: a long poll would hold the connection, which the
//!   flow's other requests share. A partition whose room is full is paused: memory is bounded by one chunk
//!   (`partition_max_bytes`) per partition plus what one Fetch per broker carries.
//! - **Fetches in step.** Before each Fetch the driver gives the reads up to a few milliseconds to
//!   take the chunks waiting in their rooms, so the Fetch carries every partition rather than the few
//!   whose rooms happened to be empty when it left.
//! - **Seeks wait for the Fetch in flight.** A read that joins (a new partition) or asks for an offset
//!   other than the one read ahead needs the reader, and is applied once the Fetch in flight is
//!   answered: at once if any partition it carries has data, else by the first waiting read's
//!   deadline. Cancelling the Fetch would not be sooner (a broker answers one connection's requests in
//!   order, so the next request would wait behind the dropped one) and would waste its answer. A
//!   closed partition is unassigned before the next Fetch.
//! - **An empty chunk after `max_wait`.** A read whose partition has nothing new gets an empty chunk at
//!   its own deadline, as a read of its own would, so the recovery's stall watch runs as before.
//! - **Failures are typed.** A partition-level error of the reader goes to that partition's read only
//!   ([`LogError::SharedFetch`]); any other failure of a Fetch goes to every read waiting on it. If
//!   the task dies, every waiting read ends with [`LogError::ReaderGone`] naming how, and the next
//!   read starts a new task.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use super::log::offset_of;
use super::recovery::{LogChunk, LogError, SnapshotLog};
use crate::consumer::{
    ConsumerError, OffsetSpec, PartitionReader, ReaderConfig, StartAt, TopicPartition,
};
use crate::net::Client;
use crate::records::IsolationLevel;
use crate::supervise::Failure;

/// How long the driver waits for reads to take the chunks read ahead before it sends the next Fetch
/// without them: about one chunk's fold.
const GATHER: Duration = Duration::from_millis(5);

/// The reply to one read: its chunk or why there is none.
type Reply = oneshot::Sender<Result<LogChunk, LogError>>;

/// Recovery reads of one snapshot topic's partitions through one shared read_committed reader.
///
/// Cheap to clone; clones share the reader. The driver task starts with the first fetch and ends when
/// this and every log it handed out are dropped.
#[derive(Debug, Clone)]
pub struct SharedLogs {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    client: Client,
    topic: Arc<str>,
    config: ReaderConfig,
    /// The running driver, if any. Taken only to read or replace it, never across an await.
    driver: Mutex<Option<Driver>>,
    /// Fetch requests answered, over every driver this has run.
    requests: Arc<AtomicU64>,
    /// Points inside the driver (and its reader's tasks) that a test can make panic.
    #[cfg(test)]
    faults: Arc<crate::supervise::Faults>,
}

/// A handle on one driver task.
#[derive(Debug, Clone)]
struct Driver {
    commands: mpsc::UnboundedSender<Command>,
    /// How the task ended, if it died; set by its supervisor before its channels close.
    failure: Arc<Mutex<Option<Failure>>>,
}

#[derive(Debug)]
enum Command {
    Want {
        partition: TopicPartition,
        offset: i64,
        deadline: Instant,
        reply: Reply,
    },
    Close(TopicPartition),
}

impl SharedLogs {
    /// Reads of `topic`'s partitions with `config`'s fetch settings. The isolation is always
    /// read_committed, whatever `config` says: recovery must never see an aborted snapshot.
    pub fn new(client: Client, topic: &str, config: ReaderConfig) -> Self {
        let config = ReaderConfig {
            isolation: IsolationLevel::ReadCommitted,
            ..config
        };
        SharedLogs {
            inner: Arc::new(Inner {
                client,
                topic: Arc::from(topic),
                config,
                driver: Mutex::new(None),
                requests: Arc::default(),
                #[cfg(test)]
                faults: Arc::default(),
            }),
        }
    }

    /// A log of `partition`, read from the log start by the shared reader.
    pub fn log(&self, partition: i32) -> SharedPartitionLog {
        SharedPartitionLog {
            logs: self.clone(),
            partition: TopicPartition::new(&*self.inner.topic, partition),
            driver: None,
        }
    }

    /// Fetch requests the shared reader has had answered so far, all partitions and brokers together.
    pub fn fetch_requests(&self) -> u64 {
        self.inner.requests.load(Ordering::Relaxed)
    }

    #[cfg(test)]
    pub(super) fn inner_faults(&self) -> &crate::supervise::Faults {
        &self.inner.faults
    }

    /// The running driver, started if there is none or the last one has died. Must be called within a
    /// tokio runtime.
    fn driver(&self) -> Driver {
        let mut slot = self.inner.driver.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(d) = slot.as_ref().filter(|d| !d.commands.is_closed()) {
            return d.clone();
        }
        let (commands, rx) = mpsc::unbounded_channel();
        let failure = Arc::new(Mutex::new(None));
        #[allow(unused_mut)]
        let mut reader =
            PartitionReader::sessionless(self.inner.client.clone(), self.inner.config.clone());
        #[cfg(test)]
        {
            reader.faults = self.inner.faults.clone();
        }
        let task = drive(
            reader,
            rx,
            self.inner.requests.clone(),
            #[cfg(test)]
            self.inner.faults.clone(),
        );
        let record = failure.clone();
        crate::supervise::spawn(task, move |f| {
            tracing::error!(failure = %f, "the shared recovery reader died");
            *record.lock().unwrap_or_else(|p| p.into_inner()) = Some(f);
        });
        let d = Driver { commands, failure };
        *slot = Some(d.clone());
        d
    }
}

/// One snapshot partition read through [`SharedLogs`]. Dropping it tells the reader to let the
/// partition go.
#[derive(Debug)]
pub struct SharedPartitionLog {
    logs: SharedLogs,
    partition: TopicPartition,
    /// The driver this log's partition was last sent to, to close it there.
    driver: Option<Driver>,
}

impl SharedPartitionLog {
    async fn offset(&self, spec: OffsetSpec, isolation: IsolationLevel) -> Result<i64, LogError> {
        offset_of(&self.logs.inner.client, &self.partition, spec, isolation).await
    }
}

impl SnapshotLog for SharedPartitionLog {
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
        let driver = self.logs.driver();
        let (reply, answer) = oneshot::channel();
        let want = Command::Want {
            partition: self.partition.clone(),
            offset,
            deadline: crate::clock::now() + max_wait,
            reply,
        };
        // A send to a driver that just died fails like a reply that never comes: both are ReaderGone.
        let _ = driver.commands.send(want);
        self.driver = Some(driver.clone());
        match answer.await {
            Ok(result) => result,
            Err(_) => {
                let failure = driver
                    .failure
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone();
                Err(LogError::ReaderGone(
                    failure.map_or_else(|| "ended".to_string(), |f| f.to_string()),
                ))
            }
        }
    }
}

impl Drop for SharedPartitionLog {
    fn drop(&mut self) {
        if let Some(d) = &self.driver {
            let _ = d.commands.send(Command::Close(self.partition.clone()));
        }
    }
}

/// The driver task: applies the core's plan to the reader, fetches, and answers the reads.
async fn drive(
    mut reader: PartitionReader,
    mut commands: mpsc::UnboundedReceiver<Command>,
    requests: Arc<AtomicU64>,
    #[cfg(test)] faults: Arc<crate::supervise::Faults>,
) {
    let mut core: Core<Reply> = Core::default();
    let idle_wait = reader.config().max_wait;
    let mut open = true;
    let mut gathered = false;
    loop {
        #[cfg(test)]
        faults.hit("shared read");
        core.poll_fetch().apply(&mut reader);
        if !core.fetching() {
            if !open {
                return;
            }
            match commands.recv().await {
                Some(c) => deliver(core.command(c)),
                None => open = false,
            }
            continue;
        }
        if !gathered && open && core.holds_chunks() {
            // Chunks read ahead are being taken: let their reads empty the rooms before the next Fetch,
            // so that it carries those partitions too instead of leaving them for the one after. Without
            // this the partitions drift apart and each Fetch carries one or two of them.
            let until = tokio::time::Instant::now() + GATHER;
            while core.holds_chunks() {
                match tokio::time::timeout_at(until, commands.recv()).await {
                    Ok(Some(c)) => deliver(core.command(c)),
                    Ok(None) => open = false,
                    Err(_) => {}
                }
                if !open || tokio::time::Instant::now() >= until {
                    break;
                }
            }
            gathered = true;
            continue;
        }
        gathered = false;
        let wait = core.poll_timeout(crate::clock::now(), idle_wait);
        let before = reader.fetch_stats().requests;
        let result = {
            let fetch = reader.fetch_for(wait);
            tokio::pin!(fetch);
            loop {
                tokio::select! {
                    r = &mut fetch => break r,
                    c = commands.recv(), if open => match c {
                        Some(c) => deliver(core.command(c)),
                        None => open = false,
                    },
                }
            }
        };
        requests.fetch_add(
            reader.fetch_stats().requests.saturating_sub(before),
            Ordering::Relaxed,
        );
        let now = crate::clock::now();
        match result {
            Ok(parts) => {
                let delivered = parts
                    .into_iter()
                    .map(|p| {
                        // Slices of the fetch buffer, not copies (see `PartitionLog::fetch`).
                        let records = p.records.into_iter().map(|r| (r.key, r.value)).collect();
                        (p.partition, records)
                    })
                    .collect();
                deliver(core.handle_fetched(now, delivered, |tp| {
                    let (high_watermark, last_stable) = reader.watermarks(tp);
                    let end = last_stable.filter(|&o| o >= 0).or(high_watermark);
                    (reader.position(tp), end)
                }));
            }
            Err(e) => deliver(core.handle_failed(now, Arc::new(e))),
        }
    }
}

fn deliver(replies: Vec<(Reply, Result<LogChunk, LogError>)>) {
    for (reply, result) in replies {
        // A read that gave up (its future dropped) no longer wants the answer.
        let _ = reply.send(result);
    }
}

/// Records of one chunk, as (key, value).
type Records = Vec<(Option<Bytes>, Option<Bytes>)>;

/// What the shared reader knows of one partition.
#[derive(Debug)]
struct Part<R> {
    /// Where the reader's next chunk of this partition starts, as last applied to the reader; `None`
    /// until the partition is assigned to it.
    reader_at: Option<i64>,
    /// A position the reader must seek to before its next Fetch.
    seek: Option<i64>,
    /// The chunk read ahead, with the offset it starts at.
    room: Option<(i64, LogChunk)>,
    /// The read waiting for a chunk.
    want: Option<Want<R>>,
    /// The reader's position had reached the end the last answer reported (the last stable offset):
    /// nothing to read ahead, so only a waiting read makes the partition worth a Fetch.
    at_end: bool,
}

impl<R> Part<R> {
    /// Whether the next Fetch should carry this partition.
    fn fetchable(&self) -> bool {
        self.room.is_none() && (self.want.is_some() || self.seek.is_some() || !self.at_end)
    }
}

#[derive(Debug)]
struct Want<R> {
    offset: i64,
    deadline: Instant,
    reply: R,
}

/// The shared reader's decisions, without I/O: generic over the reply handle so tests can see what
/// went where.
///
/// Method kinds, as the other I/O-free machines: `handle_read` (a partition's read wants its next
/// chunk) and `close` are input from the logs; the driver asks `poll_fetch` for what the next Fetch
/// carries, reports it with `handle_fetched` or `handle_failed`, fires `handle_timeout` for reads past
/// their deadline, and sleeps at most `poll_timeout`.
#[derive(Debug)]
pub(super) struct Core<R> {
    parts: BTreeMap<TopicPartition, Part<R>>,
    /// Partitions to unassign before the next Fetch.
    closed: Vec<TopicPartition>,
}

impl<R> Default for Core<R> {
    fn default() -> Self {
        Core {
            parts: BTreeMap::new(),
            closed: Vec::new(),
        }
    }
}

/// What the reader must do before the next Fetch.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Plan {
    assign: Vec<(TopicPartition, i64)>,
    seek: Vec<(TopicPartition, i64)>,
    unassign: Vec<TopicPartition>,
    pause: Vec<TopicPartition>,
    resume: Vec<TopicPartition>,
}

impl Plan {
    fn apply(self, reader: &mut PartitionReader) {
        for tp in &self.unassign {
            reader.unassign(tp);
        }
        for (tp, offset) in self.assign {
            reader.assign(tp, StartAt::Offset(offset));
        }
        for (tp, offset) in &self.seek {
            reader.seek(tp, StartAt::Offset(*offset));
        }
        for tp in &self.pause {
            reader.pause(tp);
        }
        for tp in &self.resume {
            reader.resume(tp);
        }
    }
}

impl Core<Reply> {
    /// Takes a command; returns the reads it answers at once (from a room).
    fn command(&mut self, command: Command) -> Vec<(Reply, Result<LogChunk, LogError>)> {
        match command {
            Command::Want {
                partition,
                offset,
                deadline,
                reply,
            } => self
                .handle_read(partition, offset, deadline, reply)
                .map(|(r, chunk)| (r, Ok(chunk)))
                .into_iter()
                .collect(),
            Command::Close(partition) => {
                self.close(&partition);
                Vec::new()
            }
        }
    }
}

impl<R> Core<R> {
    /// A read of `partition` from `offset`: answered now if its room holds the chunk that starts
    /// there, else waited for (with a seek first if the reader is not at `offset`). A read that
    /// replaces one still waiting drops the earlier reply.
    pub(super) fn handle_read(
        &mut self,
        partition: TopicPartition,
        offset: i64,
        deadline: Instant,
        reply: R,
    ) -> Option<(R, LogChunk)> {
        self.closed.retain(|tp| *tp != partition);
        let part = self.parts.entry(partition).or_insert(Part {
            reader_at: None,
            seek: None,
            room: None,
            want: None,
            at_end: false,
        });
        match part.room.take() {
            Some((start, chunk)) if start == offset => return Some((reply, chunk)),
            Some(_) => part.seek = Some(offset),
            None if part.seek.or(part.reader_at) != Some(offset) => part.seek = Some(offset),
            None => {}
        }
        part.want = Some(Want {
            offset,
            deadline,
            reply,
        });
        None
    }

    /// The partition's reads are over: forget it, and unassign it before the next Fetch.
    pub(super) fn close(&mut self, partition: &TopicPartition) {
        if let Some(part) = self.parts.remove(partition) {
            if part.reader_at.is_some() {
                self.closed.push(partition.clone());
            }
        }
    }

    /// Whether the next Fetch has a partition to carry: a waiting read, or an empty room to read ahead
    /// into with more to read.
    pub(super) fn fetching(&self) -> bool {
        self.parts.values().any(Part::fetchable)
    }

    /// Whether a chunk read ahead waits in a room for its read.
    pub(super) fn holds_chunks(&self) -> bool {
        self.parts.values().any(|p| p.room.is_some())
    }

    /// How long the next Fetch may wait: until the first waiting read's deadline, at most `idle`; not
    /// at all when it only reads ahead (a long poll would hold the connection, which other requests
    /// share, for nobody).
    pub(super) fn poll_timeout(&self, now: Instant, idle: Duration) -> Duration {
        self.parts
            .values()
            .filter(|p| p.fetchable())
            .filter_map(|p| p.want.as_ref())
            .map(|w| w.deadline.saturating_duration_since(now).min(idle))
            .min()
            .unwrap_or(Duration::ZERO)
    }

    /// The reader changes due before the next Fetch; the core then counts them as done.
    pub(super) fn poll_fetch(&mut self) -> Plan {
        let mut plan = Plan {
            unassign: std::mem::take(&mut self.closed),
            ..Plan::default()
        };
        for (tp, part) in &mut self.parts {
            if let Some(offset) = part.seek.take() {
                match part.reader_at {
                    None => plan.assign.push((tp.clone(), offset)),
                    Some(_) => plan.seek.push((tp.clone(), offset)),
                }
                part.reader_at = Some(offset);
                part.at_end = false;
            }
            if part.fetchable() {
                plan.resume.push(tp.clone());
            } else {
                plan.pause.push(tp.clone());
            }
        }
        plan
    }

    /// A Fetch answered with `delivered` records per partition; `reader` gives each partition's
    /// position after it and the end the answer reported (the last stable offset), if any. Fills rooms,
    /// answers reads, and gives an empty chunk to every read whose deadline has passed.
    pub(super) fn handle_fetched(
        &mut self,
        now: Instant,
        mut delivered: BTreeMap<TopicPartition, Records>,
        reader: impl Fn(&TopicPartition) -> (Option<i64>, Option<i64>),
    ) -> Vec<(R, Result<LogChunk, LogError>)> {
        let mut out = Vec::new();
        for (tp, part) in &mut self.parts {
            let Some(start) = part.reader_at else {
                continue;
            };
            let records = delivered.remove(tp).unwrap_or_default();
            let (position, end) = reader(tp);
            let next = position.unwrap_or(start);
            part.at_end = end.is_some_and(|end| next >= end);
            if records.is_empty() && next == start {
                continue;
            }
            part.reader_at = Some(next);
            if part.seek.is_some() {
                // Read from where nobody wants any more: the seek reads it again from the right place.
                continue;
            }
            let chunk = LogChunk {
                records,
                next_offset: next,
            };
            if part.room.is_some() {
                // Paused partitions are not fetched; should one be, re-read this chunk later rather
                // than keep two.
                part.seek = Some(start);
                continue;
            }
            match part.want.take() {
                Some(w) if w.offset == start => out.push((w.reply, Ok(chunk))),
                other => {
                    part.want = other;
                    part.room = Some((start, chunk));
                }
            }
        }
        out.extend(self.handle_timeout(now));
        out
    }

    /// A Fetch failed. A partition-level error goes to that partition's read, and the partition is
    /// let go (a later read assigns it afresh); any other error goes to every waiting read.
    pub(super) fn handle_failed(
        &mut self,
        now: Instant,
        error: Arc<ConsumerError>,
    ) -> Vec<(R, Result<LogChunk, LogError>)> {
        let named = match &*error {
            ConsumerError::OffsetOutOfRange { partition, .. }
            | ConsumerError::Partition { partition, .. } => Some(partition.clone()),
            _ => None,
        };
        let mut out = Vec::new();
        match named.filter(|tp| self.parts.contains_key(tp)) {
            Some(tp) => {
                if let Some(w) = self.parts.get_mut(&tp).and_then(|p| p.want.take()) {
                    out.push((w.reply, Err(LogError::SharedFetch(error))));
                }
                self.close(&tp);
            }
            None => {
                for part in self.parts.values_mut() {
                    if let Some(w) = part.want.take() {
                        out.push((w.reply, Err(LogError::SharedFetch(error.clone()))));
                    }
                }
            }
        }
        out.extend(self.handle_timeout(now));
        out
    }

    /// Empty chunks for the reads whose deadline has passed with nothing to give them.
    fn handle_timeout(&mut self, now: Instant) -> Vec<(R, Result<LogChunk, LogError>)> {
        let mut out = Vec::new();
        for part in self.parts.values_mut() {
            if let Some(w) = part.want.take_if(|w| w.deadline <= now) {
                let chunk = LogChunk {
                    records: Vec::new(),
                    next_offset: w.offset,
                };
                out.push((w.reply, Ok(chunk)));
            }
        }
        out
    }
}
