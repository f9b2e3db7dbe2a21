//! The partition reader: Fetch from assigned partitions, at read_uncommitted or read_committed, with
//! positions tracked and memory bounded; ListOffsets for earliest and end offsets.
//!
//! Every fetched partition goes through the records layer's one visibility function, so
//! read_committed filtering (aborted transactions, control markers, the LSO bound) is decided in one
//! place for every reader in the crate.
//!
//! Each leader is fetched in a fetch session (KIP-227, the machine in `session_core.rs`): after the first,
//! full, request a Fetch carries only the partitions whose position changed and the broker answers
//! only for partitions with something new. Topics go by id (Fetch v13+, KIP-516) when the broker
//! speaks it and metadata gave every topic of the request an id; otherwise by name at v12.
//!
//! # References
//! - Fetch v4+ (isolation level, aborted transactions, leader epochs, diverging epoch), KIP-74
//!   (max_bytes bounds; the first batch is returned even if larger), KIP-227 (fetch sessions), KIP-516
//!   (v13+: topics by id, UNKNOWN_TOPIC_ID, INCONSISTENT_TOPIC_ID, FETCH_SESSION_TOPIC_ID_ERROR)
//! - ListOffsets v2+ (isolation level: the latest offset is the high watermark at read_uncommitted and
//!   the last stable offset at read_committed), v4+ current leader epoch

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use kafka_protocol::messages::fetch_request::{
    FetchPartition as KpFetchPartition, FetchTopic, ForgottenTopic,
};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{BrokerId, FetchRequest, ListOffsetsRequest, TopicName};
use kafka_protocol::protocol::{Encodable, StrBytes};

use super::fetch_core::{
    FetchPartition, Fetched, Fetcher, ListPartition, Outcome, EARLIEST_TIMESTAMP, LATEST_TIMESTAMP,
};
use super::session_core::{FetchSession, SessionRequest, SessionVerdict};
use super::{ConsumerError, OffsetReset, StartAt, TopicId, TopicPartition};
use crate::net::{connection_of_partition, CallOptions, Client, Target, Verdict};
use crate::records::{
    decode_batches, visible, AbortedTransaction, IsolationLevel, Record, RecordBatch,
};
use crate::wire::{
    ErrorCode, FETCH_MAX_BY_NAME, FETCH_MIN, FETCH_MIN_BY_ID, FETCH_MIN_SESSIONS, LIST_OFFSETS_MIN,
};

/// The Fetch API key.
const FETCH: i16 = 1;

/// The first Fetch version with `rack_id` and `preferred_read_replica` (KIP-392).
const FETCH_MIN_RACK: i16 = 11;

/// Partition reader settings.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReaderConfig {
    /// read_uncommitted (everything up to the high watermark) or read_committed (committed and
    /// non-transactional records up to the last stable offset). Default read_uncommitted.
    pub isolation: IsolationLevel,
    /// What to do when a position is out of range. Default [`OffsetReset::Fail`]: never silently skip
    /// or replay.
    pub reset: OffsetReset,
    /// Upper bound on the bytes one Fetch response may carry (all partitions together). The broker
    /// may exceed it only to return one batch larger than the bound. Default 50 MiB. With several
    /// [`connections_per_broker`](crate::net::ClientConfig::connections_per_broker), a round that
    /// fetches from one broker on several connections splits this bound between their requests.
    pub max_bytes: i32,
    /// Upper bound per partition per Fetch (same exception). Default 1 MiB.
    pub partition_max_bytes: i32,
    /// How long the broker may hold a Fetch waiting for `min_bytes`. Default 500 ms.
    pub max_wait: Duration,
    /// The broker answers as soon as this many bytes are available. Default 1.
    pub min_bytes: i32,
    /// Pause for a partition after a retriable error. Default 100 ms.
    pub retry_backoff: Duration,
    /// The rack (availability zone) this reader runs in, Kafka's `client.rack` (KIP-392), sent in every
    /// Fetch. A leader configured with `replica.selector.class=RackAwareReplicaSelector` then names an
    /// in-sync replica in the same rack, and the reader fetches from it: reads stay in the zone. The
    /// leader stays the judge (see the fetcher's rules in `consumer::fetch_core`). Default `None`:
    /// always the leader.
    pub client_rack: Option<String>,
}

impl Default for ReaderConfig {
    fn default() -> Self {
        ReaderConfig {
            isolation: IsolationLevel::ReadUncommitted,
            reset: OffsetReset::Fail,
            max_bytes: 50 * 1024 * 1024,
            partition_max_bytes: 1024 * 1024,
            max_wait: Duration::from_millis(500),
            min_bytes: 1,
            retry_backoff: Duration::from_millis(100),
            client_rack: None,
        }
    }
}

/// Records fetched from one partition, in offset order.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionRecords {
    /// The partition.
    pub partition: TopicPartition,
    /// The records this reader may deliver at its isolation level.
    pub records: Vec<Record>,
    /// The position after these records (where the next fetch starts).
    pub next_offset: i64,
    /// The partition's high watermark at the time of the fetch.
    pub high_watermark: i64,
    /// The partition's last stable offset at the time of the fetch (-1 if the broker did not say).
    pub last_stable_offset: i64,
}

/// What this reader's Fetch requests carried so far, to see what fetch sessions save.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FetchStats {
    /// Fetch requests answered.
    pub requests: u64,
    /// Of those, incremental requests in an established fetch session (KIP-227).
    pub incremental: u64,
    /// Of those, requests that addressed topics by id (Fetch v13+).
    pub by_topic_id: u64,
    /// The Fetch version of the last answered request.
    pub last_version: i16,
    /// Partitions listed in the requests (an incremental request lists only changed ones).
    pub partitions_sent: u64,
    /// Partitions dropped from a session (`forgotten_topics_data`).
    pub partitions_forgotten: u64,
    /// Partitions in the answers (an incremental answer omits those with nothing new).
    pub partitions_answered: u64,
    /// Times a broker did not recognise a session or its epoch, so the next request went full.
    pub session_resets: u64,
    /// Request body bytes as encoded (header and size prefix excluded).
    pub request_bytes: u64,
    /// Record bytes in the answers.
    pub record_bytes: u64,
}

impl FetchStats {
    /// Counts one answered Fetch: what its `request` carried and what came back.
    fn count(&mut self, request: &SessionRequest, answered: &Answered) {
        self.requests += 1;
        self.incremental += u64::from(!request.full);
        self.by_topic_id += u64::from(answered.version >= FETCH_MIN_BY_ID);
        self.last_version = answered.version;
        self.partitions_sent += request.send.len() as u64;
        self.partitions_forgotten += request.forget.len() as u64;
        self.partitions_answered += answered.partitions.len() as u64;
        self.request_bytes += answered.request_bytes;
        self.record_bytes += answered
            .partitions
            .values()
            .map(|p| p.records.len() as u64)
            .sum::<u64>();
    }
}

/// Which offset ListOffsets asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OffsetSpec {
    /// The log start offset.
    Earliest,
    /// The end of the log as the isolation level sees it: the high watermark at read_uncommitted, the
    /// last stable offset at read_committed.
    Latest,
}

/// Reads assigned partitions. Not a group member: positions are the caller's to choose.
///
/// Reading a partition from the start to the end it has now, at read_committed:
///
/// ```no_run
/// # async fn demo(client: snapfence::net::Client) -> Result<(), snapfence::consumer::ConsumerError> {
/// use snapfence::consumer::{
///     list_offsets, OffsetSpec, PartitionReader, ReaderConfig, StartAt, TopicPartition,
/// };
/// use snapfence::records::IsolationLevel;
///
/// let tp = TopicPartition::new("events", 0);
/// // The high watermark, not the LSO: an open transaction then makes the loop wait for its outcome
/// // instead of ending before records committed after it.
/// let latest = OffsetSpec::Latest;
/// let ends = list_offsets(&client, std::slice::from_ref(&tp), latest, IsolationLevel::ReadUncommitted);
/// let end = ends.await?[&tp];
/// let mut config = ReaderConfig::default();
/// config.isolation = IsolationLevel::ReadCommitted;
/// let mut reader = PartitionReader::new(client, config);
/// reader.assign(tp.clone(), StartAt::Earliest);
/// while reader.position(&tp).is_none_or(|p| p < end) {
///     for batch in reader.fetch().await? {
///         for record in &batch.records {
///             println!("{}: {:?} = {:?}", record.offset, record.key, record.value);
///         }
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct PartitionReader {
    client: Client,
    config: ReaderConfig,
    fetcher: Fetcher,
    /// One fetch session per connection a Fetch went on, by node id and lane (a partition's lane is
    /// [`connection_of_partition`], so a session and its partitions stay on one connection). Shared with the
    /// connection's fetch task, which
    /// builds the request once it knows the broker's versions; never locked across an await. A task
    /// that dies or is dropped after building leaves its session waiting for an outcome, and the next
    /// request to that leader starts over in full.
    sessions: BTreeMap<(i32, usize), Arc<Mutex<FetchSession>>>,
    /// Off for a reader of one partition that is read to an end (the recovery read): a session would
    /// save it nothing and would take one of the broker's session slots from readers it helps.
    use_sessions: bool,
    stats: FetchStats,
    /// Record bytes each broker's Fetch answers carried, by node id.
    bytes_by_node: BTreeMap<i32, u64>,
    lag: crate::telemetry::LagGauges,
    /// Points inside the per-leader tasks that a test can make panic (nothing outside tests).
    pub(crate) faults: TaskFaults,
}

impl PartitionReader {
    /// A reader with nothing assigned.
    pub fn new(client: Client, config: ReaderConfig) -> Self {
        let fetcher = Fetcher::new(config.reset, config.retry_backoff);
        PartitionReader {
            client,
            config,
            fetcher,
            sessions: BTreeMap::new(),
            use_sessions: true,
            stats: FetchStats::default(),
            bytes_by_node: BTreeMap::new(),
            lag: Default::default(),
            faults: Default::default(),
        }
    }

    unstable_pub! {
        /// A reader whose every Fetch is full and outside any fetch session (what every reader did
        /// before KIP-227): the recovery read's, and the baseline when measuring what sessions save.
        pub fn sessionless(client: Client, config: ReaderConfig) -> Self {
            PartitionReader {
                use_sessions: false,
                ..Self::new(client, config)
            }
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ReaderConfig {
        &self.config
    }

    /// What this reader's Fetch requests carried so far.
    pub fn fetch_stats(&self) -> FetchStats {
        self.stats
    }

    /// The record bytes each broker's Fetch answers carried so far, by node id: where this reader's
    /// reads went (with [`ReaderConfig::client_rack`], a same-rack follower's node instead of the
    /// leader's).
    pub fn fetched_bytes_by_node(&self) -> BTreeMap<i32, u64> {
        self.bytes_by_node.clone()
    }

    /// The follower `partition` is read from (KIP-392), while it is read from one.
    pub fn read_replica(&self, partition: &TopicPartition) -> Option<i32> {
        self.fetcher.read_replica(partition)
    }

    /// The fetch session established with each broker, by node id: the id the broker gave it. With
    /// several [`connections_per_broker`](crate::net::ClientConfig::connections_per_broker) this is
    /// the session of each broker's lowest connection that has one; see
    /// [`fetch_sessions_by_connection`](Self::fetch_sessions_by_connection) for all of them.
    pub fn fetch_sessions(&self) -> BTreeMap<i32, i32> {
        let mut by_node = BTreeMap::new();
        for ((node, _), id) in self.fetch_sessions_by_connection() {
            by_node.entry(node).or_insert(id);
        }
        by_node
    }

    /// Every fetch session established, by node id and connection (lane): the id the broker gave it.
    pub fn fetch_sessions_by_connection(&self) -> BTreeMap<(i32, usize), i32> {
        self.sessions
            .iter()
            .filter_map(|(conn, s)| lock(s).open().map(|(id, _)| (*conn, id)))
            .collect()
    }

    /// Closes the reader's fetch sessions (a Fetch at epoch -1 with no partitions to each broker that
    /// holds one), so the brokers free their slots now instead of when they evict them. The reader
    /// stays usable: its next fetch opens new sessions. Errors are logged, not returned: a session the
    /// close did not reach is evicted by its broker in time.
    ///
    /// Cancel-safe: a dropped call leaves sessions the brokers evict in time, and the next fetch opens
    /// new ones.
    pub async fn close(&mut self) {
        let closes: Vec<((i32, usize), i32, i32)> = self
            .sessions
            .iter_mut()
            .filter_map(|(conn, s)| lock(s).close().map(|(id, epoch)| (*conn, id, epoch)))
            .collect();
        for ((node, lane), id, epoch) in closes {
            let request = FetchRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_max_wait_ms(0)
                .with_min_bytes(0)
                .with_max_bytes(self.config.max_bytes)
                .with_isolation_level(self.config.isolation.as_i8())
                .with_session_id(id)
                .with_session_epoch(epoch);
            let closed = self
                .client
                .call(
                    Target::Broker(node),
                    &CallOptions {
                        min_version: Some(FETCH_MIN_SESSIONS),
                        max_retries: Some(0),
                        connection: Some(lane),
                        ..CallOptions::default()
                    },
                    |_| request.clone(),
                    |r, _| Verdict::Done(r.error_code),
                )
                .await;
            match closed.map(ErrorCode::from_code) {
                Ok(ErrorCode::None) => tracing::debug!(node, session = id, "fetch session closed"),
                Ok(code) => {
                    tracing::debug!(node, session = id, %code, "fetch session close refused")
                }
                Err(e) => {
                    tracing::debug!(node, session = id, error = %e, "fetch session close failed")
                }
            }
        }
    }

    /// Starts reading `partition` at `start` (replacing any previous position).
    pub fn assign(&mut self, partition: TopicPartition, start: StartAt) {
        self.fetcher.assign(partition, start);
    }

    /// Stops reading `partition`. Returns whether it was assigned.
    pub fn unassign(&mut self, partition: &TopicPartition) -> bool {
        self.lag.forget(partition);
        self.fetcher.unassign(partition)
    }

    /// The assigned partitions.
    pub fn assignment(&self) -> Vec<TopicPartition> {
        self.fetcher.assigned().cloned().collect()
    }

    /// Moves the position of an assigned partition. Returns whether it was assigned.
    pub fn seek(&mut self, partition: &TopicPartition, start: StartAt) -> bool {
        self.fetcher.seek(partition, start)
    }

    /// The next offset to be fetched, or `None` while the position is being reset (or unassigned).
    pub fn position(&self, partition: &TopicPartition) -> Option<i64> {
        self.fetcher.position(partition)
    }

    /// The high watermark and last stable offset seen in the latest fetch of `partition`.
    pub fn watermarks(&self, partition: &TopicPartition) -> (Option<i64>, Option<i64>) {
        (
            self.fetcher.high_watermark(partition),
            self.fetcher.last_stable_offset(partition),
        )
    }

    /// Stops fetching `partition` until [`resume`](Self::resume); its position is kept.
    pub fn pause(&mut self, partition: &TopicPartition) {
        self.fetcher.set_paused(partition, true);
    }

    /// Fetches `partition` again.
    pub fn resume(&mut self, partition: &TopicPartition) {
        self.fetcher.set_paused(partition, false);
    }

    /// One round of fetching: one Fetch per leader (sent concurrently) for every assigned partition
    /// that is not paused or backing off, and a ListOffsets for every partition whose position must be
    /// reset first. Returns the partitions that produced records (possibly none: a Fetch returns empty
    /// after `max_wait` when nothing new arrived).
    ///
    /// Memory is bounded by `max_bytes` per leader contacted.
    ///
    /// Cancel-safe: a dropped call loses no records and moves no position; the partitions in flight
    /// are fetched again from the same positions by the next call. A call whose per-leader task died
    /// fails with [`ConsumerError::TaskFailed`] in the same way: nothing applied, nothing moved.
    pub async fn fetch(&mut self) -> Result<Vec<PartitionRecords>, ConsumerError> {
        self.fetch_for(self.config.max_wait).await
    }

    pub(crate) async fn fetch_for(
        &mut self,
        max_wait: Duration,
    ) -> Result<Vec<PartitionRecords>, ConsumerError> {
        let metadata = self.client.cached_metadata();
        let plan = self.fetcher.poll_plan(super::rebalance::now(), |tp| {
            metadata
                .leader(&tp.topic, tp.partition)
                .map(|l| (l.node, l.epoch))
        });
        if plan.fetch.is_empty() && plan.list.is_empty() && plan.leaderless.is_empty() {
            // Everything is paused, stopped or backing off: wait for the first backoff to end (or the
            // fetch wait), rather than returning at once into a caller's busy loop.
            let now = super::rebalance::now();
            let until = self
                .fetcher
                .poll_timeout(now)
                .map_or(max_wait, |t| t.duration_since(now).min(max_wait));
            tokio::time::sleep(until).await;
            return Ok(Vec::new());
        }
        // A guard puts planned partitions back if this future is dropped mid-way.
        let guard = Unplan {
            fetcher: &mut self.fetcher,
            pending: plan
                .fetch
                .values()
                .flatten()
                .map(|p| p.tp.clone())
                .chain(plan.list.values().flatten().map(|p| p.tp.clone()))
                .collect(),
        };
        refresh_leaderless(&self.client, &plan.leaderless).await;
        let isolation = self.config.isolation;
        // One task per leader, so one slow leader does not serialize the others. Dropping this future
        // drops the sets, which aborts the tasks; the guard puts their partitions back.
        let mut lists = spawn_lists(&self.client, plan.list, isolation, &self.faults);
        let mut fetches = {
            let tasks = FetchTasks {
                client: &self.client,
                config: &self.config,
                sessions: &mut self.sessions,
                use_sessions: self.use_sessions,
                faults: &self.faults,
            };
            tasks.spawn(plan.fetch, &metadata, max_wait)
        };
        let (listed, list_failure) = collect(&mut lists).await;
        let (fetched, fetch_failure) = collect(&mut fetches).await;
        // A task that died is a bug, and it must surface, not be retried silently for ever. Nothing is
        // lost by failing here: no answer has been applied yet, so dropping them all lets the guard put
        // every planned partition back, and the next call fetches them from the same positions.
        if let Some((task, failure)) = list_failure
            .map(|f| ("list offsets", f))
            .or(fetch_failure.map(|f| ("fetch", f)))
        {
            return Err(ConsumerError::TaskFailed {
                task: task.into(),
                failure,
            });
        }
        let mut round = Round {
            guard,
            client: &self.client,
            now: super::rebalance::now(),
            isolation,
            first_error: None,
            out: Vec::new(),
        };
        for (parts, result) in listed {
            round.listed(&parts, result);
        }
        for ((node, lane), parts, request, result) in fetched {
            let Some(session) = self.sessions.get(&(node, lane)) else {
                continue;
            };
            let mut session = lock(session);
            let answered = match result {
                Ok(answered) => answered,
                Err(e) => {
                    tracing::debug!(error = %e, "Fetch failed");
                    session.handle_failure();
                    round.failed(&parts);
                    continue;
                }
            };
            let verdict = session.handle_response(answered.error, answered.session_id);
            self.stats.count(&request, &answered);
            *self.bytes_by_node.entry(node).or_default() += answered
                .partitions
                .values()
                .map(|p| p.records.len() as u64)
                .sum::<u64>();
            tracing::debug!(
                node,
                lane,
                version = answered.version,
                session = request.session_id,
                epoch = request.epoch,
                sent = request.send.len(),
                forgotten = request.forget.len(),
                answered = answered.partitions.len(),
                ?verdict,
                "fetch answered"
            );
            match verdict {
                SessionVerdict::Use { incremental } => {
                    round.fetched(&parts, answered.partitions, incremental, &mut self.lag);
                }
                SessionVerdict::Reset(code) => {
                    // Nothing applied, nothing moved: fetch the same positions again, in full, at once.
                    tracing::debug!(node, %code, "fetch session reset");
                    self.stats.session_resets += 1;
                    round.unplanned(&parts);
                }
                SessionVerdict::Failed(code) => {
                    tracing::debug!(node, %code, "Fetch failed as a whole");
                    round.failed(&parts);
                }
            }
        }
        round.finish()
    }
}

/// Asks for fresh metadata of the topics of partitions that have no known leader, so the next round
/// can fetch them. A failure is only logged: they stay leaderless and are asked about again.
async fn refresh_leaderless(client: &Client, leaderless: &[TopicPartition]) {
    if leaderless.is_empty() {
        return;
    }
    let mut topics: Vec<&str> = leaderless.iter().map(|tp| &*tp.topic).collect();
    topics.dedup();
    if let Err(e) = client.metadata(&topics).await {
        tracing::debug!(error = %e, "metadata refresh for leaderless partitions failed");
    }
}

/// The panic points a reader's tasks pass: armed by tests, nothing outside them.
#[cfg(test)]
pub(crate) type TaskFaults = Arc<crate::supervise::Faults>;
/// The panic points a reader's tasks pass: armed by tests, nothing outside them.
#[cfg(not(test))]
#[derive(Debug, Clone, Default)]
pub(crate) struct TaskFaults;

/// Passes the panic point `_point` (see [`TaskFaults`]).
fn fault(_faults: &TaskFaults, _point: &'static str) {
    #[cfg(test)]
    _faults.hit(_point);
}

/// One ListOffsets task per leader: each yields its partitions with what the leader answered.
fn spawn_lists(
    client: &Client,
    list: BTreeMap<i32, Vec<ListPartition>>,
    isolation: IsolationLevel,
    faults: &TaskFaults,
) -> tokio::task::JoinSet<ListedBy> {
    let mut lists = tokio::task::JoinSet::new();
    for (node, parts) in list {
        let client = client.clone();
        let faults = faults.clone();
        lists.spawn(async move {
            fault(&faults, "list offsets");
            let r = list_offsets_at(&client, node, &parts, isolation).await;
            (parts, r)
        });
    }
    lists
}

/// What a leader's ListOffsets task yields: its partitions, and the leader's answer for each.
type ListedBy = (
    Vec<ListPartition>,
    Result<Vec<(ErrorCode, i64, i32)>, crate::net::NetError>,
);

/// What a connection's Fetch task yields: the leader and lane, its partitions, the request sent, the
/// answer.
type FetchedBy = (
    (i32, usize),
    Vec<FetchPartition>,
    SessionRequest,
    Result<Answered, crate::net::NetError>,
);

/// What the Fetch tasks of a round borrow from the reader.
struct FetchTasks<'a> {
    client: &'a Client,
    config: &'a ReaderConfig,
    sessions: &'a mut BTreeMap<(i32, usize), Arc<Mutex<FetchSession>>>,
    use_sessions: bool,
    faults: &'a TaskFaults,
}

impl FetchTasks<'_> {
    /// One Fetch task per connection of a leader that carries a planned partition, in that
    /// connection's fetch session (made on first contact). A leader's partitions are split by their
    /// lane, and so is [`ReaderConfig::max_bytes`], so that the requests of one round together ask a
    /// broker for no more than one request did on one connection.
    fn spawn(
        self,
        fetch: BTreeMap<i32, Vec<FetchPartition>>,
        metadata: &crate::net::ClusterMetadata,
        max_wait: Duration,
    ) -> tokio::task::JoinSet<FetchedBy> {
        let mut fetches = tokio::task::JoinSet::new();
        let lanes = self.client.connections_per_broker();
        let mut by_lane: BTreeMap<(i32, usize), Vec<FetchPartition>> = BTreeMap::new();
        for (node, parts) in fetch {
            for mut p in parts {
                p.topic_id = metadata
                    .topics
                    .get(&*p.tp.topic)
                    .map(|t| t.id)
                    .unwrap_or_default();
                let lane = connection_of_partition(&p.tp.topic, p.tp.partition, lanes);
                by_lane.entry((node, lane)).or_default().push(p);
            }
        }
        let mut lanes_of: BTreeMap<i32, i32> = BTreeMap::new();
        for (node, _) in by_lane.keys() {
            *lanes_of.entry(*node).or_default() += 1;
        }
        for ((node, lane), parts) in by_lane {
            let max_bytes = (self.config.max_bytes / lanes_of[&node]).max(1);
            let use_sessions = self.use_sessions;
            let session = self
                .sessions
                .entry((node, lane))
                .or_insert_with(|| Arc::new(Mutex::new(FetchSession::new(use_sessions))))
                .clone();
            let client = self.client.clone();
            let config = self.config.clone();
            let faults = self.faults.clone();
            fetches.spawn(async move {
                fault(&faults, "fetch");
                // Topics by id only if the broker speaks v13+ and every topic has one; else by name.
                // Asked here, not before spawning, so a leader not reached yet delays only its own
                // fetch; a failure here fails the Fetch itself the same way, and is handled there.
                let speaks_ids = match client.broker_versions(node).await {
                    Ok(v) => v.usable_at_least(FETCH, FETCH_MIN_BY_ID).is_some(),
                    Err(_) => false,
                };
                let uses_ids = speaks_ids && parts.iter().all(|p| !p.topic_id.is_zero());
                let request = lock(&session).poll_request(&parts, uses_ids);
                let to = FetchTo {
                    node,
                    lane,
                    max_bytes,
                    max_wait,
                };
                let r = fetch_at(&client, to, &parts, &request, &config).await;
                ((node, lane), parts, request, r)
            });
        }
        fetches
    }
}

/// A fetch round's answers being applied to the fetcher: the partitions still owed an answer (put back
/// if the round is dropped), the first partition error, and the records to deliver.
struct Round<'a> {
    guard: Unplan<'a>,
    client: &'a Client,
    now: std::time::Instant,
    isolation: IsolationLevel,
    first_error: Option<ConsumerError>,
    out: Vec<PartitionRecords>,
}

impl Round<'_> {
    /// `parts` got no answer (the request failed, or failed as a whole): each backs off, and its leader
    /// is looked up again before the next attempt, since the leader may be gone.
    fn failed<P: Planned>(&mut self, parts: &[P]) {
        for p in parts {
            let tp = p.tp();
            self.guard.done(tp);
            self.guard.fetcher.handle_failed(self.now, tp);
            self.client.invalidate_leader(&tp.topic, tp.partition);
        }
    }

    /// `parts` go back to be fetched again at once, from the same positions.
    fn unplanned(&mut self, parts: &[FetchPartition]) {
        for p in parts {
            self.guard.done(&p.tp);
            self.guard.fetcher.handle_unplanned(&p.tp);
        }
    }

    /// A leader's ListOffsets answer (or its failure) for `parts`.
    fn listed(
        &mut self,
        parts: &[ListPartition],
        result: Result<Vec<(ErrorCode, i64, i32)>, crate::net::NetError>,
    ) {
        let answers = match result {
            Ok(answers) => answers,
            Err(e) => {
                tracing::debug!(error = %e, "ListOffsets failed");
                self.failed(parts);
                return;
            }
        };
        for (p, (error, offset, epoch)) in parts.iter().zip(answers) {
            self.guard.done(&p.tp);
            let outcome = self
                .guard
                .fetcher
                .handle_listed(self.now, &p.tp, error, offset, epoch);
            react(self.client, &p.tp, outcome, &mut self.first_error);
        }
    }

    /// A leader's Fetch answer for `parts`, in a session that kept (`incremental`) or started over.
    fn fetched(
        &mut self,
        parts: &[FetchPartition],
        mut answers: BTreeMap<TopicPartition, RawFetched>,
        incremental: bool,
        lag: &mut crate::telemetry::LagGauges,
    ) {
        for p in parts {
            self.guard.done(&p.tp);
            let Some(answer) = answers.remove(&p.tp) else {
                if incremental {
                    // The session omits a partition with nothing new: fetch it again next round.
                    self.guard.fetcher.handle_unplanned(&p.tp);
                } else {
                    self.guard.fetcher.handle_failed(self.now, &p.tp);
                }
                continue;
            };
            self.partition(p, answer, lag);
        }
    }

    /// One partition's part of a Fetch answer: decoded, handed to the fetcher, and delivered when the
    /// fetcher says so.
    fn partition(
        &mut self,
        p: &FetchPartition,
        answer: RawFetched,
        lag: &mut crate::telemetry::LagGauges,
    ) {
        let decoded = match decode(&p.tp, answer, p.fetch_offset, self.isolation) {
            Ok(d) => d,
            Err(e) => {
                self.guard.fetcher.handle_failed(self.now, &p.tp);
                self.first_error.get_or_insert(e);
                return;
            }
        };
        let outcome =
            self.guard
                .fetcher
                .handle_fetched(self.now, &p.tp, p.fetch_offset, &decoded.fetched);
        if outcome == Outcome::Deliver {
            if let Some(position) = self.guard.fetcher.position(&p.tp) {
                let end = lag_end(self.isolation, &decoded.fetched);
                lag.set(&p.tp, end - position);
            }
        }
        if outcome == Outcome::Deliver && !decoded.records.is_empty() {
            self.out.push(PartitionRecords {
                partition: p.tp.clone(),
                records: decoded.records,
                next_offset: decoded.fetched.next_offset,
                high_watermark: decoded.fetched.high_watermark,
                last_stable_offset: decoded.fetched.last_stable_offset,
            });
        } else {
            react(self.client, &p.tp, outcome, &mut self.first_error);
        }
    }

    /// What the round delivers: its records, or its first partition error when it has none (an error
    /// behind delivered records comes back on the next call, as its partition is stopped or backing
    /// off, so it recurs).
    fn finish(self) -> Result<Vec<PartitionRecords>, ConsumerError> {
        let Round {
            guard,
            first_error,
            out,
            ..
        } = self;
        drop(guard);
        match first_error {
            Some(e) if out.is_empty() => Err(e),
            Some(e) => {
                tracing::warn!(error = %e, "partition error deferred behind delivered records");
                Ok(out)
            }
            None => Ok(out),
        }
    }
}

/// A partition planned for a request: what [`Round::failed`] needs of it.
trait Planned {
    fn tp(&self) -> &TopicPartition;
}

impl Planned for FetchPartition {
    fn tp(&self) -> &TopicPartition {
        &self.tp
    }
}

impl Planned for ListPartition {
    fn tp(&self) -> &TopicPartition {
        &self.tp
    }
}

/// The end a reader at `isolation` may read to, as a fetch answer reports it: the last stable offset
/// at read_committed (when the broker sent one), the high watermark otherwise.
fn lag_end(isolation: IsolationLevel, f: &Fetched) -> i64 {
    match isolation {
        IsolationLevel::ReadCommitted if f.last_stable_offset >= 0 => f.last_stable_offset,
        _ => f.high_watermark,
    }
}

/// What the driver does about a partition's outcome beyond the fetcher's own bookkeeping.
fn react(
    client: &Client,
    tp: &TopicPartition,
    outcome: Outcome,
    first_error: &mut Option<ConsumerError>,
) {
    {
        match outcome {
            Outcome::RefreshLeader => client.invalidate_leader(&tp.topic, tp.partition),
            Outcome::OutOfRange { offset } => {
                first_error.get_or_insert(ConsumerError::OffsetOutOfRange {
                    partition: tp.clone(),
                    offset,
                });
            }
            Outcome::Fatal(code) => {
                first_error.get_or_insert(ConsumerError::Partition {
                    partition: tp.clone(),
                    code,
                });
            }
            Outcome::Deliver
            | Outcome::Stale
            | Outcome::Retry
            | Outcome::Reset
            | Outcome::Truncated { .. } => {}
        }
    }
}

impl PartitionReader {
    /// The offsets `spec` names for `partitions`, as this reader's isolation level sees them: latest
    /// is the high watermark at read_uncommitted and the last stable offset at read_committed.
    ///
    /// Cancel-safe: it only reads.
    pub async fn list_offsets(
        &self,
        partitions: &[TopicPartition],
        spec: OffsetSpec,
    ) -> Result<BTreeMap<TopicPartition, i64>, ConsumerError> {
        list_offsets(&self.client, partitions, spec, self.config.isolation).await
    }
}

/// ListOffsets for `partitions` at `isolation`, each sent to its leader, retried on leader changes.
///
/// Cancel-safe: it only reads.
pub async fn list_offsets(
    client: &Client,
    partitions: &[TopicPartition],
    spec: OffsetSpec,
    isolation: IsolationLevel,
) -> Result<BTreeMap<TopicPartition, i64>, ConsumerError> {
    let mut out = BTreeMap::new();
    for tp in partitions {
        let (offset, _) = offset_and_epoch(client, tp, spec, isolation).await?;
        out.insert(tp.clone(), offset);
    }
    Ok(out)
}

/// ListOffsets for one partition, with the leader epoch the answer carries (for the latest offset, the
/// leader's current epoch). Retried on leader changes.
///
/// Cancel-safe: it only reads.
pub(crate) async fn offset_and_epoch(
    client: &Client,
    tp: &TopicPartition,
    spec: OffsetSpec,
    isolation: IsolationLevel,
) -> Result<(i64, i32), ConsumerError> {
    let timestamp = match spec {
        OffsetSpec::Earliest => EARLIEST_TIMESTAMP,
        OffsetSpec::Latest => LATEST_TIMESTAMP,
    };
    client
        .call(
            Target::leader(tp.topic.clone(), tp.partition),
            &CallOptions {
                min_version: Some(LIST_OFFSETS_MIN),
                ..CallOptions::default()
            },
            |_| list_request(&[(tp, timestamp, -1)], isolation),
            |r, _| {
                let p = r
                    .topics
                    .iter()
                    .flat_map(|t| t.partitions.iter())
                    .find(|p| p.partition_index == tp.partition);
                match p {
                    Some(p) if p.error_code != 0 => {
                        Verdict::from_code(p.error_code, Err(p.error_code))
                    }
                    Some(p) => Verdict::Done(Ok((p.offset, p.leader_epoch))),
                    None => Verdict::Done(Err(ErrorCode::UnknownTopicOrPartition.code())),
                }
            },
        )
        .await?
        .map_err(|code| ConsumerError::Partition {
            partition: tp.clone(),
            code: ErrorCode::from_code(code),
        })
}

/// The end offset of leader epoch `epoch` in `partition`'s log as its leader has it (OffsetForLeaderEpoch,
/// KIP-320): `(epoch, end)` where `epoch` is the largest epoch at or below the one asked that the log
/// holds and `end` the offset where it ends (the next epoch's first offset, or the log end for the
/// current one). `(-1, -1)` when the leader knows no such epoch. A truncation below a position shows
/// here even after new writes bring the log end back above it: the epoch's end moves below it, or the
/// epoch is gone. Retried on leader changes.
///
/// Cancel-safe: it only reads.
pub async fn epoch_end_offset(
    client: &Client,
    partition: &TopicPartition,
    epoch: i32,
) -> Result<(i32, i64), ConsumerError> {
    use kafka_protocol::messages::offset_for_leader_epoch_request::{
        OffsetForLeaderPartition, OffsetForLeaderTopic,
    };
    use kafka_protocol::messages::OffsetForLeaderEpochRequest;
    let tp = partition;
    let request = || {
        OffsetForLeaderEpochRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_topics(vec![OffsetForLeaderTopic::default()
                .with_topic(TopicName(StrBytes::from_string(tp.topic.to_string())))
                .with_partitions(vec![OffsetForLeaderPartition::default()
                    .with_partition(tp.partition)
                    .with_current_leader_epoch(-1)
                    .with_leader_epoch(epoch)])])
    };
    client
        .call(
            Target::leader(tp.topic.clone(), tp.partition),
            &CallOptions {
                min_version: Some(crate::wire::OFFSET_FOR_LEADER_EPOCH_MIN),
                ..CallOptions::default()
            },
            |_| request(),
            |r, _| {
                let p = r
                    .topics
                    .iter()
                    .filter(|t| *t.topic.0 == *tp.topic)
                    .flat_map(|t| t.partitions.iter())
                    .find(|p| p.partition == tp.partition);
                match p {
                    Some(p) if p.error_code != 0 => {
                        Verdict::from_code(p.error_code, Err(p.error_code))
                    }
                    Some(p) => Verdict::Done(Ok((p.leader_epoch, p.end_offset))),
                    None => Verdict::Done(Err(ErrorCode::UnknownTopicOrPartition.code())),
                }
            },
        )
        .await?
        .map_err(|code| ConsumerError::Partition {
            partition: tp.clone(),
            code: ErrorCode::from_code(code),
        })
}

fn list_request(
    parts: &[(&TopicPartition, i64, i32)],
    isolation: IsolationLevel,
) -> ListOffsetsRequest {
    let mut topics: BTreeMap<&str, Vec<ListOffsetsPartition>> = BTreeMap::new();
    for (tp, timestamp, epoch) in parts {
        topics.entry(&tp.topic).or_default().push(
            ListOffsetsPartition::default()
                .with_partition_index(tp.partition)
                .with_timestamp(*timestamp)
                .with_current_leader_epoch(*epoch),
        );
    }
    ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_isolation_level(isolation.as_i8())
        .with_topics(
            topics
                .into_iter()
                .map(|(t, ps)| {
                    ListOffsetsTopic::default()
                        .with_name(TopicName(StrBytes::from_string(t.to_string())))
                        .with_partitions(ps)
                })
                .collect(),
        )
}

/// ListOffsets for planned resets at one leader; answers in the order of `parts`.
async fn list_offsets_at(
    client: &Client,
    node: i32,
    parts: &[ListPartition],
    isolation: IsolationLevel,
) -> Result<Vec<(ErrorCode, i64, i32)>, crate::net::NetError> {
    let req: Vec<(&TopicPartition, i64, i32)> = parts
        .iter()
        .map(|p| (&p.tp, p.timestamp, p.current_leader_epoch))
        .collect();
    let (r, _) = client
        .call(
            Target::Broker(node),
            &CallOptions {
                min_version: Some(LIST_OFFSETS_MIN),
                max_retries: Some(0),
                ..CallOptions::default()
            },
            |_| list_request(&req, isolation),
            |r, v| Verdict::Done((r, v)),
        )
        .await?;
    Ok(parts
        .iter()
        .map(|p| {
            r.topics
                .iter()
                .filter(|t| *t.name.0 == *p.tp.topic)
                .flat_map(|t| t.partitions.iter())
                .find(|x| x.partition_index == p.tp.partition)
                .map(|x| (ErrorCode::from_code(x.error_code), x.offset, x.leader_epoch))
                .unwrap_or((ErrorCode::UnknownTopicOrPartition, -1, -1))
        })
        .collect())
}

/// One partition's raw Fetch answer.
struct RawFetched {
    error: ErrorCode,
    /// KIP-392: the replica the leader names for this reader (-1: none).
    preferred_read_replica: i32,
    high_watermark: i64,
    last_stable_offset: i64,
    log_start_offset: i64,
    diverging: Option<(i32, i64)>,
    aborted: Vec<AbortedTransaction>,
    records: bytes::Bytes,
}

/// One Fetch answer: its top-level fields and each partition's part, by partition.
struct Answered {
    error: ErrorCode,
    session_id: i32,
    version: i16,
    request_bytes: u64,
    partitions: BTreeMap<TopicPartition, RawFetched>,
}

/// Where a Fetch goes and how much it asks for.
struct FetchTo {
    node: i32,
    /// The connection of `node` it goes on.
    lane: usize,
    /// The request's `max_bytes`: [`ReaderConfig::max_bytes`], split over the connections a round
    /// fetches from the broker on.
    max_bytes: i32,
    max_wait: Duration,
}

/// The Fetch `request` describes, to `to`. `parts` are every partition planned for it (an incremental
/// request sends fewer); their topic ids name the topics of an answer that goes by id.
async fn fetch_at(
    client: &Client,
    to: FetchTo,
    parts: &[FetchPartition],
    request: &SessionRequest,
    config: &ReaderConfig,
) -> Result<Answered, crate::net::NetError> {
    let FetchTo {
        node,
        lane,
        max_bytes,
        max_wait,
    } = to;
    let mut topics: BTreeMap<(&str, TopicId), Vec<KpFetchPartition>> = BTreeMap::new();
    for p in &request.send {
        topics.entry((&p.tp.topic, p.topic_id)).or_default().push(
            KpFetchPartition::default()
                .with_partition(p.tp.partition)
                .with_current_leader_epoch(p.current_leader_epoch)
                .with_fetch_offset(p.fetch_offset)
                .with_last_fetched_epoch(p.last_fetched_epoch)
                .with_log_start_offset(-1)
                .with_partition_max_bytes(config.partition_max_bytes),
        );
    }
    let mut forgotten: BTreeMap<(&str, TopicId), Vec<i32>> = BTreeMap::new();
    for (tp, id) in &request.forget {
        forgotten
            .entry((&tp.topic, *id))
            .or_default()
            .push(tp.partition);
    }
    let topic_name = |t: &str| TopicName(StrBytes::from_string(t.to_string()));
    let body = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(max_wait.as_millis().min(i32::MAX as u128) as i32)
        .with_min_bytes(config.min_bytes)
        .with_max_bytes(max_bytes)
        .with_isolation_level(config.isolation.as_i8())
        .with_session_id(request.session_id)
        .with_session_epoch(request.epoch)
        .with_topics(
            topics
                .into_iter()
                .map(|((t, id), ps)| {
                    FetchTopic::default()
                        .with_topic(topic_name(t))
                        .with_topic_id(uuid::Uuid::from_bytes(id.0))
                        .with_partitions(ps)
                })
                .collect(),
        )
        .with_forgotten_topics_data(
            forgotten
                .into_iter()
                .map(|((t, id), ps)| {
                    ForgottenTopic::default()
                        .with_topic(topic_name(t))
                        .with_topic_id(uuid::Uuid::from_bytes(id.0))
                        .with_partitions(ps)
                })
                .collect(),
        );
    // A session's partitions and the request's addressing must agree: by id at v13+ (every topic has
    // one: the caller checked), by name at v12 and below.
    let (min_version, max_version) = if request.uses_ids {
        (FETCH_MIN_BY_ID, None)
    } else {
        (FETCH_MIN, Some(FETCH_MAX_BY_NAME))
    };
    // The broker may hold the request for max_wait before answering.
    let timeout = client.config().request_timeout + max_wait;
    let mut request_bytes = 0;
    let (r, version) = client
        .call(
            Target::Broker(node),
            &CallOptions {
                timeout: Some(timeout),
                min_version: Some(min_version),
                max_version,
                max_retries: Some(0),
                connection: Some(lane),
            },
            |v| {
                let mut body = body.clone();
                if v >= FETCH_MIN_RACK {
                    if let Some(rack) = &config.client_rack {
                        body = body.with_rack_id(StrBytes::from_string(rack.clone()));
                    }
                }
                request_bytes = body.compute_size(v).unwrap_or(0) as u64;
                body
            },
            |r, v| Verdict::Done((r, v)),
        )
        .await?;
    let names: BTreeMap<TopicId, &std::sync::Arc<str>> =
        parts.iter().map(|p| (p.topic_id, &p.tp.topic)).collect();
    let mut out = BTreeMap::new();
    for t in r.responses {
        let topic: std::sync::Arc<str> = if version >= FETCH_MIN_BY_ID {
            match names.get(&TopicId(*t.topic_id.as_bytes())) {
                Some(name) => (*name).clone(),
                None => {
                    // Not a topic of the request: nothing of ours to apply it to.
                    tracing::warn!(node, topic_id = %t.topic_id, "fetch answer for a topic id not asked for");
                    continue;
                }
            }
        } else {
            std::sync::Arc::from(&*t.topic.0)
        };
        for p in t.partitions {
            let diverging = (p.diverging_epoch.epoch >= 0)
                .then_some((p.diverging_epoch.epoch, p.diverging_epoch.end_offset));
            out.insert(
                TopicPartition::new(topic.clone(), p.partition_index),
                RawFetched {
                    error: ErrorCode::from_code(p.error_code),
                    preferred_read_replica: p.preferred_read_replica.0,
                    high_watermark: p.high_watermark,
                    last_stable_offset: p.last_stable_offset,
                    log_start_offset: p.log_start_offset,
                    diverging,
                    aborted: p
                        .aborted_transactions
                        .unwrap_or_default()
                        .into_iter()
                        .map(|a| AbortedTransaction {
                            producer_id: a.producer_id.0,
                            first_offset: a.first_offset,
                        })
                        .collect(),
                    records: p.records.unwrap_or_default(),
                },
            );
        }
    }
    Ok(Answered {
        error: ErrorCode::from_code(r.error_code),
        session_id: r.session_id,
        version,
        request_bytes,
        partitions: out,
    })
}

struct Decoded {
    fetched: Fetched,
    records: Vec<Record>,
}

/// Runs a partition's answer through the visibility engine.
fn decode(
    tp: &TopicPartition,
    raw: RawFetched,
    fetch_offset: i64,
    isolation: IsolationLevel,
) -> Result<Decoded, ConsumerError> {
    let mut fetched = Fetched {
        error: raw.error,
        high_watermark: raw.high_watermark,
        last_stable_offset: raw.last_stable_offset,
        log_start_offset: raw.log_start_offset,
        next_offset: fetch_offset,
        last_batch_epoch: None,
        diverging: raw.diverging,
        preferred_read_replica: raw.preferred_read_replica,
    };
    if !raw.error.is_ok() || raw.diverging.is_some() {
        return Ok(Decoded {
            fetched,
            records: Vec::new(),
        });
    }
    let batches: Vec<RecordBatch> = decode_batches(raw.records)
        .collect::<Result<_, _>>()
        .map_err(|source| ConsumerError::Decode {
            partition: tp.clone(),
            source,
        })?;
    fetched.last_batch_epoch = batches.last().map(|b| b.partition_leader_epoch());
    let v = visible(&batches, &raw.aborted, isolation, fetch_offset).map_err(|source| {
        ConsumerError::Decode {
            partition: tp.clone(),
            source,
        }
    })?;
    fetched.next_offset = v.next_offset;
    Ok(Decoded {
        fetched,
        records: v.into_records(),
    })
}

/// A session's lock. Nothing panics while holding it (the machine does no I/O and trusts no input),
/// and a poisoned one would still hold a machine in a state every call accepts: at worst sessionless.
fn lock(session: &Mutex<FetchSession>) -> MutexGuard<'_, FetchSession> {
    session.lock().unwrap_or_else(|p| p.into_inner())
}

/// Puts planned-but-unanswered partitions back when a fetch round is dropped half-way.
struct Unplan<'a> {
    fetcher: &'a mut Fetcher,
    pending: Vec<TopicPartition>,
}

impl Unplan<'_> {
    fn done(&mut self, tp: &TopicPartition) {
        self.pending.retain(|p| p != tp);
    }
}

impl Drop for Unplan<'_> {
    fn drop(&mut self) {
        for tp in &self.pending {
            self.fetcher.handle_unplanned(tp);
        }
    }
}

/// Waits for every task of `set`; returns their outputs and how the first one that died (panicked or
/// was cancelled) ended. A dead task's partitions stay in the guard, so they are fetched again.
async fn collect<T: 'static>(set: &mut tokio::task::JoinSet<T>) -> (Vec<T>, Option<String>) {
    let mut out = Vec::with_capacity(set.len());
    let mut failure = None;
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok(v) => out.push(v),
            Err(e) => {
                tracing::error!(error = %e, "fetch task died");
                failure.get_or_insert_with(|| crate::supervise::Failure::of(e).to_string());
            }
        }
    }
    (out, failure)
}

#[cfg(test)]
mod lag_tests {
    //! The lag gauge against a loopback stub that answers every Fetch with no records and fixed
    //! watermarks: a fake peer for the reader's own bookkeeping, claiming nothing about a broker.

    use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
    use kafka_protocol::messages::FetchResponse;

    use super::*;
    use crate::net::testing::{api_versions, loopback, one_node_metadata, Peer};
    use crate::net::ClientConfig;
    use crate::telemetry::recording::Recording;
    use crate::telemetry::CONSUMER_LAG;

    const HW: i64 = 20;
    const LSO: i64 = 15;

    async fn stub() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
        loopback(|mut peer: Peer, addr| async move {
            while let Some(request) = peer.next_request().await {
                let id = request.header.correlation_id;
                let version = request.header.request_api_version;
                match request.header.request_api_key {
                    18 => {
                        let answer = api_versions(&[(1, 4, 12), (3, 1, 12), (18, 0, 3)]);
                        peer.respond(id, &answer, version.min(3)).await;
                    }
                    3 => {
                        let answer = one_node_metadata(addr, &[("t", 2)]);
                        peer.respond(id, &answer, version).await;
                    }
                    1 => {
                        let partitions = (0..2)
                            .map(|p| {
                                PartitionData::default()
                                    .with_partition_index(p)
                                    .with_high_watermark(HW)
                                    .with_last_stable_offset(LSO)
                                    .with_log_start_offset(0)
                                    .with_records(None)
                            })
                            .collect();
                        let answer = FetchResponse::default().with_responses(vec![
                            FetchableTopicResponse::default()
                                .with_topic(TopicName("t".into()))
                                .with_partitions(partitions),
                        ]);
                        peer.respond(id, &answer, version).await;
                    }
                    other => panic!("the stub does not serve api key {other}"),
                }
            }
        })
        .await
    }

    /// The lag of each fetched partition is its distance to the end its isolation level may read to:
    /// the LSO at read_committed, the high watermark at read_uncommitted.
    #[test]
    fn lag_is_measured_to_the_end_the_isolation_level_reads_to() {
        let rec = Recording::default();
        rec.run(async {
            let (addr, stub) = stub().await;
            let client = Client::connect(ClientConfig::new(addr.to_string()))
                .await
                .unwrap();
            client.metadata(&["t"]).await.unwrap();
            for (isolation, at) in [
                (IsolationLevel::ReadCommitted, 5),
                (IsolationLevel::ReadUncommitted, 8),
            ] {
                let config = ReaderConfig {
                    isolation,
                    max_wait: Duration::from_millis(1),
                    ..ReaderConfig::default()
                };
                let mut reader = PartitionReader::new(client.clone(), config);
                let p = if isolation == IsolationLevel::ReadCommitted {
                    0
                } else {
                    1
                };
                reader.assign(TopicPartition::new("t", p), StartAt::Offset(at));
                reader.fetch().await.unwrap();
            }
            stub.abort();
        });
        let lag = |p| rec.gauge_at(CONSUMER_LAG.name, &[("topic", "t"), ("partition", p)]);
        assert_eq!(lag("0"), (LSO - 5) as f64, "read_committed: to the LSO");
        assert_eq!(
            lag("1"),
            (HW - 8) as f64,
            "read_uncommitted: to the high watermark"
        );
    }
}

#[cfg(test)]
mod session_tests {
    //! The reader driving its fetch sessions against a loopback stub that plays a broker's session
    //! script: a fake peer for the reader's own bookkeeping (what it sends after each kind of answer),
    //! claiming nothing about a broker. `protocol-tests/tests/fetch.rs` runs the same against Kafka.

    use std::sync::{Arc, Mutex};

    use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
    use kafka_protocol::messages::FetchResponse;
    use kafka_protocol::protocol::Decodable;

    use super::*;
    use crate::net::testing::{api_versions, loopback, one_node_metadata, Peer};
    use crate::net::ClientConfig;

    const ID: [u8; 16] = [5; 16];

    /// One Fetch as the stub saw it: (version, session id, epoch, partitions sent, forgotten).
    type Seen = (i16, i32, i32, usize, usize);

    fn partitions(id: [u8; 16], n: i32) -> FetchableTopicResponse {
        FetchableTopicResponse::default()
            .with_topic_id(uuid::Uuid::from_bytes(id))
            .with_partitions(
                (0..n)
                    .map(|p| {
                        PartitionData::default()
                            .with_partition_index(p)
                            .with_high_watermark(0)
                            .with_last_stable_offset(0)
                            .with_log_start_offset(0)
                            .with_records(None)
                    })
                    .collect(),
            )
    }

    /// The n-th Fetch's answer: a full answer opening session 77; an incremental one with nothing new;
    /// FETCH_SESSION_ID_NOT_FOUND; a full answer opening 78; an answer about a topic id never asked for.
    fn script(n: usize) -> FetchResponse {
        match n {
            0 => FetchResponse::default()
                .with_session_id(77)
                .with_responses(vec![partitions(ID, 2)]),
            1 => FetchResponse::default().with_session_id(77),
            2 => FetchResponse::default().with_error_code(ErrorCode::FetchSessionIdNotFound.code()),
            3 => FetchResponse::default()
                .with_session_id(78)
                .with_responses(vec![partitions(ID, 2)]),
            _ => FetchResponse::default()
                .with_session_id(78)
                .with_responses(vec![partitions([9; 16], 1)]),
        }
    }

    async fn stub(
        seen: Arc<Mutex<Vec<Seen>>>,
    ) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
        loopback(move |mut peer: Peer, addr| {
            let seen = seen.clone();
            async move {
                while let Some(mut request) = peer.next_request().await {
                    let id = request.header.correlation_id;
                    let version = request.header.request_api_version;
                    match request.header.request_api_key {
                        18 => {
                            let answer = api_versions(&[(1, 4, 13), (3, 1, 12), (18, 0, 3)]);
                            peer.respond(id, &answer, version.min(3)).await;
                        }
                        3 => {
                            let mut answer = one_node_metadata(addr, &[("t", 2)]);
                            answer.topics[0].topic_id = uuid::Uuid::from_bytes(ID);
                            peer.respond(id, &answer, version).await;
                        }
                        1 => {
                            let r = FetchRequest::decode(&mut request.body, version).unwrap();
                            let sent = r.topics.iter().map(|t| t.partitions.len()).sum();
                            let forgotten = r
                                .forgotten_topics_data
                                .iter()
                                .map(|t| t.partitions.len())
                                .sum();
                            let n = {
                                let mut seen = seen.lock().unwrap();
                                seen.push((
                                    version,
                                    r.session_id,
                                    r.session_epoch,
                                    sent,
                                    forgotten,
                                ));
                                seen.len() - 1
                            };
                            peer.respond(id, &script(n), version).await;
                        }
                        other => panic!("the stub does not serve api key {other}"),
                    }
                }
            }
        })
        .await
    }

    /// v13 by id, a session opened by the full fetch, incremental fetches that list nothing unchanged,
    /// an omitted partition fetched again at once (not backed off), a lost session answered by a full
    /// fetch in a new one, and an answer about an unknown topic id ignored.
    #[tokio::test]
    async fn the_reader_follows_the_session_script() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (addr, stub) = stub(seen.clone()).await;
        let client = Client::connect(ClientConfig::new(addr.to_string()))
            .await
            .unwrap();
        client.metadata(&["t"]).await.unwrap();
        let config = ReaderConfig {
            max_wait: Duration::from_millis(1),
            ..ReaderConfig::default()
        };
        let mut reader = PartitionReader::new(client, config);
        for p in 0..2 {
            reader.assign(TopicPartition::new("t", p), StartAt::Offset(0));
        }
        for _ in 0..5 {
            assert!(reader.fetch().await.unwrap().is_empty());
        }
        stub.abort();
        assert_eq!(
            *seen.lock().unwrap(),
            vec![
                (13, 0, 0, 2, 0),
                (13, 77, 1, 0, 0),
                (13, 77, 2, 0, 0),
                (13, 0, 0, 2, 0),
                (13, 78, 1, 0, 0),
            ],
            "one Fetch per call: nothing backed off"
        );
        let stats = reader.fetch_stats();
        assert_eq!((stats.session_resets, stats.by_topic_id), (1, 5));
        assert_eq!(reader.fetch_sessions(), BTreeMap::from([(1, 78)]));
        assert_eq!(reader.position(&TopicPartition::new("t", 0)), Some(0));
    }
}
