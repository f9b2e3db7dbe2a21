//! The async driver shared by both producers: one background task that owns the timers and hands
//! Produce requests to one sender task per connection of a broker, over the sans-IO [`ProducerCore`]
//! and [`TxnMachine`].
//!
//! Locking: one `std::sync::Mutex` around the cores, never held across an await. Record outcomes are
//! delivered after the lock is released.
//!
//! Supervision: every task this driver spawns (itself, the per-connection senders, the leader lookup, an
//! enrolment, an id fetch) runs under [`crate::supervise`]. When one panics or is cancelled, [`Inner::task_failed`] releases what it held
//! (the sender slot, the in-flight flag), fails the records it carried and everything unsent with
//! [`ProducerError::TaskFailed`], and makes the producer fatal, so every waiter (a `Delivery`, a flush,
//! a commit, the next send) gets a typed error instead of waiting on a task that is gone.
//!
//! Requests: each pass of the background task takes every batch the core lets out (up to
//! `max_in_flight` per partition, retries first, starting after the partition the last pass took from;
//! for a connection that already has requests unanswered, no more than the room left under
//! `max_in_flight` per connection, counted in requests and in `max_request_size` bytes per request) and
//! groups them by the partition leader in the cached metadata and the partition's connection of it
//! ([`connection_of_partition`] of `ClientConfig::connections_per_broker`, 1 by default): one Produce
//! per connection carries one batch of every partition led there on it, across topics, up to
//! `max_request_size` bytes of batches (a partition with several batches
//! ready goes into that many requests, one batch each, in sequence order, as Produce v3+ allows one
//! batch per partition per request). A partition whose leader is not cached is held back while one metadata refresh looks it up.
//!
//! Ordering: Kafka answers the requests of one connection in the order it received them, and appends
//! a partition's batches in sequence order only. A partition always goes on the same connection of its
//! leader, and each connection has one *sender* task that puts its requests on that pooled connection
//! in the order the core handed them out: it keeps every
//! request it has started in one list and polls them in that order, so each request queues its frame
//! (the connection's slot lock, in-flight permit and writer queue are all first-come first-served)
//! before the next one starts, and keeps at most `max_in_flight` of them on the wire (the broker takes
//! one request of a connection at a time, so more would only queue there). Up to five requests of a
//! partition are then in flight on one connection, in sequence order, and the broker sees them in that
//! order. What a busy broker cannot take yet stays in the accumulator and fills up.
//!
//! What the ordering cannot cover, the sequencer does: after a leader change a partition's batches can
//! be out on two connections at once, and after a connection reset every request on it is unanswered
//! (each batch *may* have been written). The unanswered batches are resent with the same sequences and
//! bytes, oldest first and before anything new, so the broker deduplicates what it had already written;
//! a batch that reaches the broker ahead of a predecessor is refused OUT_OF_ORDER_SEQUENCE_NUMBER and
//! resent after it, and only an attempt that left as the partition's oldest unacknowledged batch can
//! prove a real gap (see `sequence_core.rs`).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kafka_protocol::messages::produce_request::{
    PartitionProduceData, ProduceRequest, TopicProduceData,
};
use kafka_protocol::messages::{TopicName, TransactionalId};
use kafka_protocol::protocol::StrBytes;
use tokio::sync::{oneshot, Notify};

use super::budget::SendBudget;
use super::classify::{classify, Action, Api};
use super::encoder::RecordsEncoder;
use super::produce_core::{Effects, PartitionAnswer, ProduceAnswer, ProducerCore, ToSend};
use super::record::partition_for_key;
use super::txn::{TxnMachine, TxnRequest, TxnResponse, TxnVersion};
use super::{
    messages, ErrorClass, ProducerConfig, ProducerError, ProducerIdEpoch, ProducerRecord,
    RecordMetadata, TopicPartition,
};
use crate::net::{
    connection_of_partition, CallOptions, Client, ClusterMetadata, NetError, Target, Verdict,
};
use crate::wire::{
    ErrorCode, PRODUCE_MAX, PRODUCE_MAX_BY_NAME, PRODUCE_MAX_TV1, PRODUCE_MIN_IDEMPOTENT,
    PRODUCE_MIN_TV2,
};

/// Where a record's outcome is delivered.
pub(crate) type Reply = oneshot::Sender<Result<RecordMetadata, ProducerError>>;

/// The outcome of one sent record: resolves once the broker acknowledged it (or it failed).
///
/// Dropping it does not cancel the record: it is still written, only its outcome goes unobserved.
#[derive(Debug)]
#[must_use = "a Delivery says whether the record was written"]
pub struct Delivery {
    rx: oneshot::Receiver<Result<RecordMetadata, ProducerError>>,
}

impl Future for Delivery {
    type Output = Result<RecordMetadata, ProducerError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.rx)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(ProducerError::Closed)))
    }
}

/// What one kind of producer has and the other has not, so the two cannot be mixed: the idempotent
/// producer fetches its own new producer id when its epoch runs out; the transactional producer has its
/// transaction machine (which owns its ids) and TV1's partition enrolment.
pub(crate) enum Mode {
    /// The idempotent producer, and where its fetch of a new producer id stands.
    Idempotent { new_id: IdFetch },
    /// The transactional producer.
    Transactional {
        /// Boxed: the machine is large, and the idempotent producer should not carry its size.
        machine: Box<TxnMachine>,
        /// TV1: an AddPartitionsToTxn is out.
        add_in_flight: bool,
    },
}

/// Where the idempotent producer's fetch of a new producer id stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IdFetch {
    /// No new id is wanted.
    Idle,
    /// The epoch ran out: the next pass of the background task starts a fetch.
    Wanted,
    /// A fetch is under way; its end (an id, or the producer turned fatal) makes this `Idle`.
    InFlight,
}

impl Mode {
    /// The transaction machine, if this is the transactional producer.
    pub(crate) fn machine(&self) -> Option<&TxnMachine> {
        match self {
            Mode::Transactional { machine, .. } => Some(machine),
            Mode::Idempotent { .. } => None,
        }
    }

    /// The transaction machine, if this is the transactional producer.
    pub(crate) fn machine_mut(&mut self) -> Option<&mut TxnMachine> {
        match self {
            Mode::Transactional { machine, .. } => Some(machine),
            Mode::Idempotent { .. } => None,
        }
    }

    /// Whether an AddPartitionsToTxn is out (never, for the idempotent producer).
    pub(crate) fn add_in_flight(&self) -> bool {
        matches!(
            self,
            Mode::Transactional {
                add_in_flight: true,
                ..
            }
        )
    }
}

pub(crate) struct Shared {
    pub(crate) core: ProducerCore<Reply>,
    pub(crate) mode: Mode,
    /// Connections with a sender task running, by node id and lane, with the requests it has yet to
    /// start.
    senders: HashMap<Lane, SenderSlot>,
    /// Topic names as the wire carries them, made once per topic rather than once per request.
    topic_names: HashMap<Arc<str>, TopicName>,
    /// A metadata refresh for partitions whose leader is not cached is under way.
    refresh_in_flight: bool,
    /// When the last refresh ended, so a leaderless partition does not refresh in a tight loop.
    last_refresh: Option<tokio::time::Instant>,
    round_robin: HashMap<String, u32>,
    closed: bool,
}

pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) config: ProducerConfig,
    /// The transactional id as Produce requests carry it (made once; `None` for the idempotent
    /// producer). The machine in [`Mode::Transactional`] holds the same id as a name.
    wire_transactional_id: Option<TransactionalId>,
    shared: Mutex<Shared>,
    /// Wakes the background task (new data, a request answered, an answer changed something).
    wake: Notify,
    /// Wakes callers waiting for memory, a flush or in-flight requests to drain.
    changed: Notify,
    /// Points inside the spawned tasks that a test can make panic.
    #[cfg(test)]
    pub(crate) faults: crate::supervise::Faults,
}

/// One of a broker's connections: its node id and lane (see
/// [`ClientConfig::connections_per_broker`](crate::net::ClientConfig::connections_per_broker)). A
/// partition's batches always take the lane [`connection_of_partition`] gives it.
type Lane = (i32, usize);

/// A connection's sender task: the requests it has yet to start, and how to tell it there are more.
struct SenderSlot {
    queue: VecDeque<ProduceJob>,
    wake: Arc<Notify>,
    /// Requests the sender has on the wire, as it last said; with `queue`, what the broker has to answer.
    on_wire: usize,
}

/// One Produce request: at most one batch per partition, every partition led by `node` and sent on
/// its connection `lane`.
struct ProduceJob {
    node: i32,
    lane: usize,
    batches: Vec<ToSend>,
    /// Each batch's topic name as the wire carries it (parallel to `batches`).
    names: Vec<TopicName>,
    /// Each batch's topic id (parallel to `batches`), which Produce v13+ sends instead of the name.
    topic_ids: Vec<uuid::Uuid>,
    /// `(min, max)` Produce version for this producer and transaction version, the max held to v12
    /// when a topic's id is not known.
    versions: (i16, i16),
}

/// What one pass of the background task decided, to carry out once the lock is let go.
struct Pass {
    /// Replies to deliver.
    replies: Vec<(Reply, Result<RecordMetadata, ProducerError>)>,
    /// Tasks to start.
    tasks: Tasks,
    /// When to look again, if nothing wakes the task first.
    next: Option<Instant>,
}

/// The tasks a pass starts: a sender per connection that has none yet, a leader refresh, the mode's side
/// request.
#[derive(Default)]
struct Tasks {
    senders: Vec<(Lane, Arc<Notify>)>,
    refresh: Option<Vec<String>>,
    add: Option<TxnRequest>,
    new_id: bool,
}

/// The driver's spawned tasks, named for the error their failure becomes.
#[derive(Debug, Clone)]
enum Task {
    /// The background task itself ([`Inner::run`]).
    Driver,
    /// The task that sends Produce requests on one connection of a broker.
    Sender(Lane),
    /// The metadata refresh for partitions whose leader is not cached.
    Leaders,
    /// A TV1 AddPartitionsToTxn.
    AddPartitions,
    /// An idempotent producer's new-id fetch.
    ProducerId,
}

impl std::fmt::Display for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Task::Driver => f.write_str("driver"),
            Task::Sender((node, 0)) => write!(f, "sender to broker {node}"),
            Task::Sender((node, lane)) => write!(f, "sender to broker {node} (connection {lane})"),
            Task::Leaders => f.write_str("leader lookup"),
            Task::AddPartitions => f.write_str("add partitions"),
            Task::ProducerId => f.write_str("producer id"),
        }
    }
}

impl Inner {
    /// The idempotent producer's driver state.
    pub(crate) fn idempotent(client: Client, config: ProducerConfig) -> Arc<Inner> {
        let mode = Mode::Idempotent {
            new_id: IdFetch::Idle,
        };
        Inner::new(client, config, mode)
    }

    /// The transactional producer's driver state, around its transaction machine.
    pub(crate) fn transactional(
        client: Client,
        config: ProducerConfig,
        machine: TxnMachine,
    ) -> Arc<Inner> {
        let mode = Mode::Transactional {
            machine: Box::new(machine),
            add_in_flight: false,
        };
        Inner::new(client, config, mode)
    }

    fn new(client: Client, config: ProducerConfig, mode: Mode) -> Arc<Inner> {
        let wire_transactional_id = mode
            .machine()
            .map(|m| TransactionalId(StrBytes::from_string(m.transactional_id().to_owned())));
        let core = ProducerCore::new(&config, wire_transactional_id.is_some());
        Arc::new(Inner {
            client,
            config,
            wire_transactional_id,
            shared: Mutex::new(Shared {
                core,
                mode,
                senders: HashMap::new(),
                topic_names: HashMap::new(),
                refresh_in_flight: false,
                last_refresh: None,
                round_robin: HashMap::new(),
                closed: false,
            }),
            wake: Notify::new(),
            changed: Notify::new(),
            #[cfg(test)]
            faults: crate::supervise::Faults::default(),
        })
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Shared> {
        // Nothing panics while holding the lock by design; if something did, the cores are still the
        // best record of what happened, so keep going rather than poison every later call.
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn wake(&self) {
        self.wake.notify_one();
    }

    /// Starts the background task. It stops once the producer is closed and nothing is in flight.
    pub(crate) fn spawn(self: &Arc<Self>) {
        let inner = self.clone();
        self.supervise(Task::Driver, async move { inner.run().await });
    }

    /// Spawns one of the driver's tasks so that its panic or cancellation reaches [`Self::task_failed`].
    fn supervise(self: &Arc<Self>, task: Task, future: impl Future<Output = ()> + Send + 'static) {
        // Weak: if the producer is gone when the failure is reported, nobody is left to tell.
        let weak = Arc::downgrade(self);
        crate::supervise::spawn(future, move |failure| {
            if let Some(inner) = weak.upgrade() {
                inner.task_failed(&task, &failure);
            }
        });
    }

    /// A spawned task died without finishing. Releases what it held, fails what it carried and what is
    /// unsent, and makes the producer fatal (see the module docs).
    ///
    /// Why fatal and not just a retry: the dead task's requests may have reached the broker, its
    /// partition's sequence is unknowable from here, and a panic is a bug whose other effects on the
    /// cores nobody can vouch for. The caller's remedy is the same as for any fatal error: a new producer.
    fn task_failed(&self, task: &Task, failure: &crate::supervise::Failure) {
        let err = ProducerError::TaskFailed {
            task: task.to_string(),
            failure: failure.to_string(),
        };
        tracing::error!(error = %err, "producer task died");
        let replies = {
            let mut s = self.lock();
            let mut fx = match task {
                Task::Driver => s.core.abandon(&err, None),
                Task::Sender(lane) => {
                    // Which of the requests out were this sender's no longer matters: the producer is
                    // fatal, so every batch with a request out fails now (an answer still arriving on
                    // another sender finds no batch and is ignored).
                    s.senders.remove(lane);
                    s.core.abandon(&err, None)
                }
                Task::Leaders => {
                    s.refresh_in_flight = false;
                    s.core.fail_unsent(&err)
                }
                Task::AddPartitions => {
                    if let Mode::Transactional { add_in_flight, .. } = &mut s.mode {
                        *add_in_flight = false;
                    }
                    s.core.fail_unsent(&err)
                }
                Task::ProducerId => {
                    // A fatal producer needs no id: without this the next pass would fetch again.
                    if let Mode::Idempotent { new_id } = &mut s.mode {
                        *new_id = IdFetch::Idle;
                    }
                    s.core.fail_unsent(&err)
                }
            };
            fx.fatal = Some(err);
            self.apply(&mut s, fx)
        };
        deliver(replies);
        self.changed.notify_waiters();
        self.wake();
    }

    /// Stops accepting records and fails the unsent ones with [`ProducerError::Closed`].
    pub(crate) fn close(&self) {
        let replies = {
            let mut s = self.lock();
            if s.closed {
                return;
            }
            s.closed = true;
            let fx = s.core.fail_unsent(&ProducerError::Closed);
            s.core.set_fatal(&ProducerError::Closed);
            self.apply(&mut s, fx)
        };
        deliver(replies);
        self.wake();
        self.changed.notify_waiters();
    }

    // ---------------------------------------------------------------------------------------------
    // sending records

    /// Picks the record's partition (its own, the key's hash, or round-robin) from the metadata cache.
    fn partition_of(&self, s: &mut Shared, record: &ProducerRecord) -> Result<i32, ProducerError> {
        let meta = self.client.cached_metadata();
        let unknown = || ProducerError::UnknownPartition {
            topic: record.topic.to_string(),
            partition: record.partition,
        };
        let topic = meta.topics.get(&*record.topic).ok_or_else(unknown)?;
        let count = i32::try_from(topic.partitions.len()).unwrap_or(i32::MAX);
        if count == 0 {
            return Err(unknown());
        }
        match (record.partition, &record.key) {
            (Some(p), _) if topic.partitions.contains_key(&p) => Ok(p),
            (Some(_), _) => Err(unknown()),
            (None, Some(key)) => Ok(partition_for_key(key, count)),
            (None, None) => {
                let n = s.round_robin.entry(record.topic.to_string()).or_insert(0);
                *n = n.wrapping_add(1);
                Ok((*n % count as u32) as i32)
            }
        }
    }

    /// One attempt to append: fails fast on a full buffer. On failure the record comes back when it is
    /// worth trying again.
    #[allow(clippy::result_large_err)]
    pub(crate) fn try_append(
        &self,
        mut record: ProducerRecord,
    ) -> Result<Delivery, (ProducerError, Option<ProducerRecord>)> {
        let (tx, rx) = oneshot::channel();
        let mut s = self.lock();
        if s.closed {
            return Err((ProducerError::Closed, None));
        }
        let partition = match self.partition_of(&mut s, &record) {
            Ok(p) => p,
            Err(e) => return Err((e, Some(record))),
        };
        let tp = TopicPartition::new(record.topic.clone(), partition);
        if let Some(txn) = s.mode.machine_mut() {
            txn.handle_append(&tp).map_err(|e| (e, None))?;
        }
        if record.timestamp.is_none() {
            record.timestamp = Some(wall_clock_ms());
        }
        match s.core.append(&tp, record, tx, crate::clock::now()) {
            Ok(_) => {
                drop(s);
                self.wake();
                Ok(Delivery { rx })
            }
            Err((e, record, _)) => Err((e, Some(record))),
        }
    }

    /// Appends, waiting for buffer space and for the topic's metadata up to `max_block`.
    ///
    /// Cancel-safe: until it returns, the record is not in the producer.
    pub(crate) async fn append(&self, record: ProducerRecord) -> Result<Delivery, ProducerError> {
        // An append wakes the driver, and tokio runs a task woken from a worker in that worker's next
        // slot, which no other worker may steal: a caller appending in a tight loop held the driver back
        // until the buffer filled (70 ms of 32 000 records before the first Produce left, in the B'
        // benchmark). Yielding once the task's cooperative budget is spent lets the driver send while the
        // caller goes on, maybe on another worker. Before the append, so a drop here leaves nothing in.
        tokio::task::coop::consume_budget().await;
        let deadline = tokio::time::Instant::now() + self.config.max_block;
        let mut record = record;
        let mut refreshed = false;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match self.try_append(record) {
                Ok(d) => return Ok(d),
                Err((ProducerError::UnknownPartition { .. }, Some(r))) if !refreshed => {
                    refreshed = true;
                    record = r;
                    let topic = record.topic.to_string();
                    let topics = [topic.as_str()];
                    // A failed refresh is not final: the next try reports the partition unknown.
                    let fetch = self.client.metadata(&topics);
                    if tokio::time::timeout_at(deadline, fetch).await.is_err() {
                        return Err(self.blocked_too_long());
                    }
                }
                Err((ProducerError::BufferFull { .. }, Some(r))) => {
                    record = r;
                    if tokio::time::timeout_at(deadline, changed).await.is_err() {
                        return Err(self.blocked_too_long());
                    }
                }
                Err((e, _)) => return Err(e),
            }
        }
    }

    fn blocked_too_long(&self) -> ProducerError {
        ProducerError::Timeout {
            op: "send (waiting for buffer space or metadata)",
            elapsed: self.config.max_block,
            class: ErrorClass::Retriable,
            last_error: None,
        }
    }

    /// Waits until every record appended before the call has its outcome (or, in a transaction that
    /// can no longer send, until nothing is in flight).
    ///
    /// Cancel-safe: dropping it stops the wait, not the records.
    pub(crate) async fn flush(&self) {
        let marker = self.send_buffered();
        self.wait_flushed(marker).await;
    }

    /// Ends the linger of every batch buffered now; waits for nothing.
    pub(crate) fn send_buffered(&self) -> Option<super::sequence_core::BatchId> {
        let marker = self.lock().core.flush();
        self.wake();
        marker
    }

    async fn wait_flushed(&self, marker: Option<super::sequence_core::BatchId>) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let s = self.lock();
                if s.core.flushed(marker) || s.closed {
                    return;
                }
                let stuck = s
                    .mode
                    .machine()
                    .is_some_and(|t| t.state() != super::TransactionState::InTransaction);
                if stuck && s.core.sending() == 0 {
                    return;
                }
            }
            changed.await;
        }
    }

    /// Waits until no Produce and no AddPartitionsToTxn is out. Cancel-safe.
    pub(crate) async fn quiesce(&self) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let s = self.lock();
                if s.core.sending() == 0 && !s.mode.add_in_flight() {
                    return;
                }
            }
            changed.await;
        }
    }

    // ---------------------------------------------------------------------------------------------
    // effects

    /// Applies the core's effects to the shared state; returns the replies to deliver once unlocked.
    pub(crate) fn apply(
        &self,
        s: &mut Shared,
        fx: Effects<Reply>,
    ) -> Vec<(Reply, Result<RecordMetadata, ProducerError>)> {
        for tp in &fx.refresh_leader {
            self.client.invalidate_leader(&tp.topic, tp.partition);
        }
        if let Some((err, bump)) = fx.txn_error {
            if let Some(t) = s.mode.machine_mut() {
                t.handle_produce_error(err, bump);
            }
        }
        if let Some(err) = &fx.fatal {
            let err = match (err, s.mode.machine()) {
                (ProducerError::Fenced { code, .. }, Some(m)) => ProducerError::Fenced {
                    transactional_id: m.transactional_id().to_owned(),
                    code: *code,
                },
                (e, _) => e.clone(),
            };
            tracing::error!(error = %err, "producer failed fatally");
            s.core.set_fatal(&err);
            if let Some(t) = s.mode.machine_mut() {
                t.handle_produce_error(err.clone(), false);
            }
        }
        if fx.need_new_id {
            if let Mode::Idempotent { new_id } = &mut s.mode {
                if *new_id == IdFetch::Idle {
                    *new_id = IdFetch::Wanted;
                }
            }
        }
        if fx.memory_freed || !fx.completions.is_empty() {
            self.changed.notify_waiters();
        }
        fx.completions
            .into_iter()
            .map(|c| (c.completion, c.result))
            .collect()
    }

    // ---------------------------------------------------------------------------------------------
    // the background task

    /// One pass of the background task, under the lock: expire what timed out, start the side
    /// requests due, let out what the budget allows, and say when to look again. `None` once the
    /// producer is closed and nothing of it is left running.
    fn pass(&self, now: Instant) -> Option<Pass> {
        let mut s = self.lock();
        if s.closed && s.senders.is_empty() && !s.mode.add_in_flight() && !s.refresh_in_flight {
            return None;
        }
        let fx = s.core.handle_timeout(now);
        let mut replies = self.apply(&mut s, fx);
        let mut tasks = Self::side_requests(&mut s, now);
        let (fx, look_again_soon) = self.let_out(&mut s, now, &mut tasks);
        replies.extend(self.apply(&mut s, fx));
        let mut next = [
            s.core.poll_timeout(now),
            s.mode.machine().and_then(TxnMachine::poll_timeout),
        ]
        .into_iter()
        .flatten()
        .min();
        if look_again_soon {
            // A held-back batch may be due already; the refresh's end or the busy broker's next
            // answer wakes this task, so only look again shortly rather than spin until then.
            next = next.map(|at| at.max(now + HELD_RECHECK));
        }
        Some(Pass {
            replies,
            tasks,
            next,
        })
    }

    /// The mode's side request that is due, if any: TV1's AddPartitionsToTxn, or the idempotent
    /// producer's fetch of a new id. Marked as under way here, started after the lock is let go.
    fn side_requests(s: &mut Shared, now: Instant) -> Tasks {
        let mut tasks = Tasks::default();
        match &mut s.mode {
            Mode::Transactional {
                machine,
                add_in_flight: in_flight @ false,
            } => {
                if let Some(req) = machine.poll_add_partitions(now) {
                    *in_flight = true;
                    tasks.add = Some(req);
                }
            }
            Mode::Idempotent { new_id } if *new_id == IdFetch::Wanted => {
                *new_id = IdFetch::InFlight;
                tasks.new_id = true;
            }
            _ => {}
        }
        tasks
    }

    /// Lets out what the core has ready and the [`SendBudget`] allows, as Produce requests queued on
    /// their leaders' senders (a broker without one gets one in `tasks`), and asks for a leader refresh
    /// for topics with a leaderless ready partition. Returns the core's effects and whether something
    /// was held back (for want of room or of a leader).
    fn let_out(&self, s: &mut Shared, now: Instant, tasks: &mut Tasks) -> (Effects<Reply>, bool) {
        let versions = self.produce_versions(s);
        let meta = self.client.cached_metadata();
        let mut leaderless: HashSet<Arc<str>> = HashSet::new();
        let mut budget = SendBudget::new(
            self.config.max_in_flight,
            self.config.max_request_size,
            s.senders
                .iter()
                .map(|(lane, slot)| (*lane, slot.queue.len() + slot.on_wire)),
        );
        let lanes = self.client.connections_per_broker();
        let Shared { core, mode, .. } = &mut *s;
        let mut allow = |tp: &TopicPartition, bytes: usize| {
            if !mode.machine().is_none_or(|t| t.can_produce(tp)) {
                return false;
            }
            match meta.leader(&tp.topic, tp.partition) {
                None => {
                    leaderless.insert(tp.topic.clone());
                    false
                }
                Some(leader) => budget.allow(
                    tp,
                    (
                        leader.node,
                        connection_of_partition(&tp.topic, tp.partition, lanes),
                    ),
                    bytes,
                ),
            }
        };
        let mut encoder = RecordsEncoder {
            compression: self.config.compression,
        };
        let (out, fx) = core.poll_send(now, &mut allow, &mut encoder);
        if let Some(t) = mode.machine_mut() {
            for b in &out {
                t.handle_produce_sent(&b.partition);
            }
        }
        for job in requests_by_leader(
            &meta,
            out,
            versions,
            self.config.max_request_size,
            lanes,
            &mut s.topic_names,
        ) {
            let slot = s.senders.entry((job.node, job.lane)).or_insert_with(|| {
                let wake = Arc::new(Notify::new());
                tasks.senders.push(((job.node, job.lane), wake.clone()));
                SenderSlot {
                    queue: VecDeque::new(),
                    wake,
                    on_wire: 0,
                }
            });
            slot.wake.notify_one();
            slot.queue.push_back(job);
        }
        if !leaderless.is_empty() && !s.refresh_in_flight {
            s.refresh_in_flight = true;
            let mut topics: Vec<String> = leaderless.iter().map(|t| t.to_string()).collect();
            topics.sort();
            tasks.refresh = Some(topics);
        }
        (fx, !leaderless.is_empty() || budget.held())
    }

    /// Starts, each under supervision, the tasks a pass decided on.
    fn start_tasks(self: &Arc<Self>, tasks: Tasks) {
        for (lane, wake) in tasks.senders {
            let inner = self.clone();
            self.supervise(
                Task::Sender(lane),
                async move { inner.sender(lane, wake).await },
            );
        }
        if let Some(topics) = tasks.refresh {
            let inner = self.clone();
            self.supervise(
                Task::Leaders,
                async move { inner.refresh_leaders(topics).await },
            );
        }
        if let Some(req) = tasks.add {
            let inner = self.clone();
            self.supervise(Task::AddPartitions, async move {
                inner.add_partitions(req).await
            });
        }
        if tasks.new_id {
            let inner = self.clone();
            self.supervise(Task::ProducerId, async move { inner.fetch_new_id().await });
        }
    }

    async fn run(self: Arc<Self>) {
        loop {
            #[cfg(test)]
            self.faults.hit("driver");
            let Some(pass) = self.pass(crate::clock::now()) else {
                return;
            };
            deliver(pass.replies);
            self.start_tasks(pass.tasks);
            let sleep = match pass.next {
                Some(at) => tokio::time::Instant::from_std(at),
                None => tokio::time::Instant::now() + Duration::from_secs(3600),
            };
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep_until(sleep) => {}
            }
        }
    }

    /// The Produce versions this producer may send now: idempotent from v3; in a transaction, those of
    /// its transaction version (the caps are `wire`'s one table).
    fn produce_versions(&self, s: &Shared) -> (i16, i16) {
        match s.mode.machine().map(TxnMachine::txn_version) {
            None => (PRODUCE_MIN_IDEMPOTENT, PRODUCE_MAX),
            Some(TxnVersion::V2) => (PRODUCE_MIN_TV2, PRODUCE_MAX),
            Some(_) => (PRODUCE_MIN_IDEMPOTENT, PRODUCE_MAX_TV1),
        }
    }

    /// One connection's sender: starts its requests in the order they were queued and feeds each answer
    /// to the core. Ends once it has nothing queued and nothing out.
    ///
    /// Every started request stays in `out`, and `out` is polled front to back, so a request is polled
    /// for the first time only after every request queued before it; each one queues its frame on the
    /// broker's connection at its first poll unless a first-come first-served wait (the connection slot,
    /// an in-flight permit, writer queue space) holds it, and then it waits behind the earlier ones. That
    /// is what keeps a partition's requests on the wire in sequence order.
    async fn sender(self: Arc<Self>, lane: Lane, wake: Arc<Notify>) {
        let mut out: Vec<Pin<Box<InFlightProduce>>> = Vec::new();
        loop {
            let jobs = {
                let mut s = self.lock();
                // At most `max_in_flight` requests on the wire; the rest wait here, in order.
                let room = self.config.max_in_flight.saturating_sub(out.len());
                let slot = s.senders.get_mut(&lane);
                if slot.as_ref().is_none_or(|slot| slot.queue.is_empty()) && out.is_empty() {
                    s.senders.remove(&lane);
                    break;
                }
                slot.map_or_else(Vec::new, |slot| {
                    let n = room.min(slot.queue.len());
                    slot.on_wire = out.len() + n;
                    slot.queue.drain(..n).collect()
                })
            };
            for job in jobs {
                #[cfg(test)]
                self.faults.hit("sender");
                let inner = self.clone();
                out.push(Box::pin(async move {
                    let answers = inner.produce(&job).await;
                    (job, answers)
                }));
            }
            let answered = tokio::select! {
                done = PollInOrder(&mut out) => done,
                _ = wake.notified() => Vec::new(),
            };
            if answered.is_empty() {
                continue;
            }
            let replies = {
                let mut s = self.lock();
                let now = crate::clock::now();
                let mut replies = Vec::new();
                if let Some(slot) = s.senders.get_mut(&lane) {
                    slot.on_wire = out.len();
                }
                for (job, answers) in answered {
                    for (b, answer) in job.batches.iter().zip(answers) {
                        let fx = s.core.handle_answer(b.id, answer, now);
                        replies.extend(self.apply(&mut s, fx));
                    }
                }
                replies
            };
            deliver(replies);
            self.changed.notify_waiters();
            self.wake();
        }
        self.changed.notify_waiters();
        self.wake();
    }

    /// Looks up the leaders of `topics` once, not sooner than a retry backoff after the last lookup.
    async fn refresh_leaders(self: Arc<Self>, topics: Vec<String>) {
        #[cfg(test)]
        self.faults.hit("leaders");
        let last = self.lock().last_refresh;
        if let Some(at) = last {
            tokio::time::sleep_until(at + self.config.retry_backoff).await;
        }
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        if let Err(e) = self.client.metadata(&names).await {
            // Not final: the batches wait (within their delivery timeout) and the next pass asks again.
            tracing::debug!(error = %e, ?topics, "looking up partition leaders failed");
        }
        {
            let mut s = self.lock();
            s.refresh_in_flight = false;
            s.last_refresh = Some(tokio::time::Instant::now());
        }
        self.wake();
    }

    /// One Produce carrying `job`'s batches, sent once (the core decides about retries). One answer per
    /// batch, in the job's order.
    async fn produce(&self, job: &ProduceJob) -> Vec<ProduceAnswer> {
        let (min_version, max_version) = job.versions;
        let options = CallOptions {
            timeout: Some(self.config.request_timeout + Duration::from_secs(5)),
            min_version: Some(min_version),
            max_version: Some(max_version),
            max_retries: Some(0),
            connection: Some(job.lane),
        };
        let timeout_ms = i32::try_from(self.config.request_timeout.as_millis()).unwrap_or(i32::MAX);
        let make = |version: i16| {
            let mut by_topic: BTreeMap<&Arc<str>, (usize, Vec<PartitionProduceData>)> =
                BTreeMap::new();
            for (i, b) in job.batches.iter().enumerate() {
                by_topic
                    .entry(&b.partition.topic)
                    .or_insert_with(|| (i, Vec::new()))
                    .1
                    .push(
                        PartitionProduceData::default()
                            .with_index(b.partition.partition)
                            .with_records(Some(b.records.clone())),
                    );
            }
            let topic_data = by_topic
                .into_values()
                .map(|(i, parts)| {
                    let topic = TopicProduceData::default().with_partition_data(parts);
                    if version >= 13 {
                        topic.with_topic_id(job.topic_ids[i])
                    } else {
                        topic.with_name(job.names[i].clone())
                    }
                })
                .collect();
            ProduceRequest::default()
                .with_transactional_id(self.wire_transactional_id.clone())
                .with_acks(-1)
                .with_timeout_ms(timeout_ms)
                .with_topic_data(topic_data)
        };
        let call = self
            .client
            .call(Target::Broker(job.node), &options, make, |r, v| {
                Verdict::Done((r, v))
            });
        // The request ends when the first of its batches' delivery timeouts runs out, so that timeout
        // bounds when an outcome is reported (the broker may hold a Produce for its whole timeout
        // waiting for replicas). Dropping the call leaves the connection as it is: a frame already
        // queued is still written and its answer thrown away, so every batch is unanswered, and the
        // core reports the expired ones as of unknown outcome and resends the rest.
        let expires = job.batches.iter().map(|b| b.deadline).min();
        let result = match expires.filter(|at| *at > crate::clock::now()) {
            Some(at) => {
                match tokio::time::timeout_at(tokio::time::Instant::from_std(at), call).await {
                    Ok(result) => result,
                    Err(_) => {
                        let answer = ProduceAnswer::NoAnswer(
                            "the delivery timeout ran out with the request unanswered".into(),
                        );
                        return vec![answer; job.batches.len()];
                    }
                }
            }
            None => call.await,
        };
        match result {
            Ok((response, version)) => {
                // Each batch's answer, found by topic (by id from v13 on, by name before) and
                // partition, in one pass over the answer.
                let by_id: HashMap<uuid::Uuid, &str> = job
                    .topic_ids
                    .iter()
                    .zip(&job.batches)
                    .map(|(id, b)| (*id, &*b.partition.topic))
                    .collect();
                let index: HashMap<(&str, i32), usize> = job
                    .batches
                    .iter()
                    .enumerate()
                    .map(|(i, b)| ((&*b.partition.topic, b.partition.partition), i))
                    .collect();
                let mut answers: HashMap<usize, PartitionAnswer> = HashMap::new();
                for t in &response.responses {
                    let topic = if version >= 13 {
                        by_id.get(&t.topic_id).copied()
                    } else {
                        Some(&*t.name.0)
                    };
                    let Some(topic) = topic else { continue };
                    for p in &t.partition_responses {
                        if let Some(&i) = index.get(&(topic, p.index)) {
                            answers.insert(
                                i,
                                PartitionAnswer {
                                    code: ErrorCode::from_code(p.error_code),
                                    base_offset: p.base_offset,
                                    log_append_time_ms: p.log_append_time_ms,
                                },
                            );
                        }
                    }
                }
                job.batches
                    .iter()
                    .enumerate()
                    .map(|(i, _)| {
                        answers.remove(&i).map_or_else(
                            || ProduceAnswer::NoAnswer("the answer omitted the partition".into()),
                            ProduceAnswer::Partition,
                        )
                    })
                    .collect()
            }
            Err(e) => {
                let answer = net_to_produce_answer(&e);
                vec![answer; job.batches.len()]
            }
        }
    }

    /// TV1 enrolment, sent once; the machine decides about retries.
    async fn add_partitions(self: Arc<Self>, req: TxnRequest) {
        #[cfg(test)]
        self.faults.hit("add partitions");
        let resp = send_txn(&self.client, &req).await;
        let outcome = {
            let mut s = self.lock();
            match &mut s.mode {
                Mode::Transactional {
                    machine,
                    add_in_flight,
                } => {
                    *add_in_flight = false;
                    Some(machine.handle_add_partitions(resp, crate::clock::now()))
                }
                Mode::Idempotent { .. } => None,
            }
        };
        if let (
            Some(o),
            TxnRequest::AddPartitions {
                transactional_id, ..
            },
        ) = (&outcome, &req)
        {
            if o.refresh_coordinator {
                self.client.invalidate_coordinator(
                    crate::net::CoordinatorKind::Transaction,
                    transactional_id,
                );
            }
            if let Some(e) = &o.error {
                tracing::warn!(error = %e, "enrolling partitions in the transaction failed");
            }
        }
        self.changed.notify_waiters();
        self.wake();
    }

    /// Idempotent producer whose epoch ran out: a fresh producer id, then re-sequence what was held.
    async fn fetch_new_id(self: Arc<Self>) {
        #[cfg(test)]
        self.faults.hit("producer id");
        let result = init_idempotent_id(&self.client, &self.config).await;
        let replies = {
            let mut s = self.lock();
            // Either end leaves no fetch wanted: a new id, or a fatal producer that needs none (else
            // every later pass would fetch again).
            if let Mode::Idempotent { new_id } = &mut s.mode {
                *new_id = IdFetch::Idle;
            }
            match result {
                Ok(ids) => {
                    s.core.set_ids(ids);
                    let fx = s.core.resume_after_new_id();
                    self.apply(&mut s, fx)
                }
                Err(e) => {
                    s.core.set_fatal(&e);
                    let fx = s.core.fail_unsent(&e);
                    self.apply(&mut s, fx)
                }
            }
        };
        deliver(replies);
        self.wake();
    }
}

/// How soon a pass that held partitions back (for want of a leader, or of room at a busy broker) looks
/// again, at the latest.
const HELD_RECHECK: Duration = Duration::from_millis(10);

/// Groups the batches the core let out into Produce requests: per leader and lane (each partition's
/// [`connection_of_partition`] of `lanes`), requests of at most one batch per partition and at most
/// `max_bytes` of record batches (a batch larger than that goes alone).
/// Each batch goes into the leader's first request after the one holding its partition's previous
/// batch that has room, so a partition's requests are queued in sequence order. Every batch's leader is
/// in `meta` (the driver lets out only partitions whose leader is cached).
///
/// The byte budget is `max_request_size` (1 MiB by default, as in the Java client), which the config
/// documents as the largest request the producer builds; without it a wide producer's request grew
/// with its partition count, towards the broker's `socket.request.max.bytes`. (Not a speed measure: on
/// a 16-partition burst it measured neutral, docs/benchmarks.md, B'.)
fn requests_by_leader(
    meta: &ClusterMetadata,
    batches: Vec<ToSend>,
    versions: (i16, i16),
    max_bytes: usize,
    lanes: usize,
    names: &mut HashMap<Arc<str>, TopicName>,
) -> Vec<ProduceJob> {
    // Per leader and lane, its requests in order with their record bytes; per partition, the first
    // request its next batch may join.
    let mut jobs: BTreeMap<Lane, Vec<(ProduceJob, usize)>> = BTreeMap::new();
    let mut next: HashMap<TopicPartition, usize> = HashMap::new();
    for b in batches {
        let node = meta
            .leader(&b.partition.topic, b.partition.partition)
            .map_or(-1, |l| l.node);
        let lane = connection_of_partition(&b.partition.topic, b.partition.partition, lanes);
        let from = next.entry(b.partition.clone()).or_insert(0);
        let requests = jobs.entry((node, lane)).or_default();
        let len = b.records.len();
        let room = requests
            .iter()
            .enumerate()
            .skip(*from)
            .find(|(_, (job, bytes))| job.batches.is_empty() || bytes + len <= max_bytes)
            .map(|(i, _)| i);
        let at = room.unwrap_or_else(|| {
            requests.push((
                ProduceJob {
                    node,
                    lane,
                    batches: Vec::new(),
                    names: Vec::new(),
                    topic_ids: Vec::new(),
                    versions,
                },
                0,
            ));
            requests.len() - 1
        });
        *from = at + 1;
        let (request, bytes) = &mut requests[at];
        *bytes += len;
        let name = names
            .entry(b.partition.topic.clone())
            .or_insert_with(|| TopicName(StrBytes::from_string(b.partition.topic.to_string())))
            .clone();
        let id = meta
            .topics
            .get(&*b.partition.topic)
            .map(|t| t.id)
            .filter(|id| !id.is_zero());
        match id {
            Some(id) => request.topic_ids.push(uuid::Uuid::from_bytes(id.0)),
            None => {
                request.topic_ids.push(uuid::Uuid::nil());
                request.versions.1 = request.versions.1.min(PRODUCE_MAX_BY_NAME);
            }
        }
        request.names.push(name);
        request.batches.push(b);
    }
    jobs.into_values().flatten().map(|(job, _)| job).collect()
}

/// A started Produce request of a sender, with its batches and their answers once it ends.
type InFlightProduce = dyn Future<Output = (ProduceJob, Vec<ProduceAnswer>)> + Send;

/// Polls every started request front to back, and resolves with those that ended (at least one), taken
/// out of the list in order. The front-to-back poll is what orders the requests' frames (see
/// [`Inner::sender`]).
struct PollInOrder<'a>(&'a mut Vec<Pin<Box<InFlightProduce>>>);

impl Future for PollInOrder<'_> {
    type Output = Vec<(ProduceJob, Vec<ProduceAnswer>)>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut done = Vec::new();
        let mut i = 0;
        while i < self.0.len() {
            match self.0[i].as_mut().poll(cx) {
                Poll::Ready(answered) => {
                    // The finished future is dropped here; its output is what it leaves behind.
                    drop(self.0.remove(i));
                    done.push(answered);
                }
                Poll::Pending => i += 1,
            }
        }
        if done.is_empty() {
            Poll::Pending
        } else {
            Poll::Ready(done)
        }
    }
}

pub(crate) fn deliver(replies: Vec<(Reply, Result<RecordMetadata, ProducerError>)>) {
    for (tx, r) in replies {
        // The caller may have dropped its Delivery; that is fine.
        let _ = tx.send(r);
    }
}

fn wall_clock_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn net_to_produce_answer(e: &NetError) -> ProduceAnswer {
    if e.outcome_unknown() {
        return ProduceAnswer::NoAnswer(e.to_string());
    }
    match e {
        NetError::UnsupportedVersion { .. } => ProduceAnswer::Partition(PartitionAnswer {
            code: ErrorCode::UnsupportedVersion,
            base_offset: -1,
            log_append_time_ms: -1,
        }),
        // Not written: no connection, or routing said no (no leader yet).
        _ if e.is_transport() || e.is_retriable() || e.error_code().is_some() => {
            ProduceAnswer::NotSent(e.to_string())
        }
        // A fault in the exchange itself (the answer did not decode): the broker may have acted.
        _ => ProduceAnswer::NoAnswer(e.to_string()),
    }
}

/// Sends one transaction request once and reduces the answer (or the failure to get one).
pub(crate) async fn send_txn(client: &Client, req: &TxnRequest) -> TxnResponse {
    let options = CallOptions {
        max_version: Some(req.max_version()),
        max_retries: Some(0),
        ..CallOptions::default()
    };
    let target = match req.coordinator() {
        super::txn::Coordinator::Transaction(id) => Target::transaction(id),
        super::txn::Coordinator::Group(g) => Target::group(g),
    };
    let result = match req {
        TxnRequest::InitProducerId {
            transactional_id,
            timeout_ms,
            current,
            enable_2pc,
            keep_prepared,
        } => {
            client
                .call(
                    target,
                    &CallOptions {
                        min_version: req.min_version(),
                        ..options.clone()
                    },
                    |v| {
                        messages::init_producer_id(Some(transactional_id), *timeout_ms, *current, v)
                            .with_enable_2_pc(*enable_2pc && v >= 6)
                            .with_keep_prepared_txn(*keep_prepared && v >= 6)
                    },
                    |r, v| Verdict::Done(messages::parse_init_producer_id(&r, v)),
                )
                .await
        }
        TxnRequest::AddPartitions {
            transactional_id,
            ids,
            partitions,
        } => {
            client
                .call(
                    target,
                    &options,
                    |_| messages::add_partitions(transactional_id, *ids, partitions),
                    |r, _| Verdict::Done(messages::parse_add_partitions(&r)),
                )
                .await
        }
        TxnRequest::AddOffsets {
            transactional_id,
            ids,
            group_id,
        } => {
            client
                .call(
                    target,
                    &options,
                    |_| messages::add_offsets(transactional_id, *ids, group_id),
                    |r, _| Verdict::Done(messages::parse_add_offsets(&r)),
                )
                .await
        }
        TxnRequest::TxnOffsetCommit {
            transactional_id,
            ids,
            group,
            offsets,
            ..
        } => {
            client
                .call(
                    target,
                    &CallOptions {
                        // Below v3 the generation fence cannot be expressed.
                        min_version: Some(crate::wire::TXN_OFFSET_COMMIT_MIN_FENCED),
                        ..options.clone()
                    },
                    |_| messages::txn_offset_commit(transactional_id, *ids, group, offsets),
                    |r, _| Verdict::Done(messages::parse_txn_offset_commit(&r)),
                )
                .await
        }
        TxnRequest::EndTxn {
            transactional_id,
            ids,
            commit,
            ..
        } => {
            client
                .call(
                    target,
                    &options,
                    |_| messages::end_txn(transactional_id, *ids, *commit),
                    |r, v| Verdict::Done(messages::parse_end_txn(&r, v)),
                )
                .await
        }
    };
    match result {
        Ok(r) => r,
        Err(e) if e.outcome_unknown() => TxnResponse::NoAnswer(e.to_string()),
        Err(NetError::UnsupportedVersion { .. }) => {
            req.answered_with(ErrorCode::UnsupportedVersion)
        }
        Err(e) => match e.error_code() {
            // FindCoordinator's own answer (e.g. COORDINATOR_NOT_AVAILABLE): the request never left.
            Some(code) => req.answered_with(code),
            // Not sent: the coordinator's node could not be reached. NETWORK_EXCEPTION says so in an
            // operation's `last_error`, where COORDINATOR_NOT_AVAILABLE would blame the broker.
            None if e.is_transport() => req.answered_with(ErrorCode::NetworkException),
            None if e.is_retriable() => req.answered_with(ErrorCode::CoordinatorNotAvailable),
            // A fault in the exchange (undecodable answer): the coordinator may have acted.
            None => TxnResponse::NoAnswer(e.to_string()),
        },
    }
}

/// InitProducerId without a transactional id, retried while the answer says "try again".
pub(crate) async fn init_idempotent_id(
    client: &Client,
    config: &ProducerConfig,
) -> Result<ProducerIdEpoch, ProducerError> {
    let backoff = config.backoff();
    let started = tokio::time::Instant::now();
    let mut attempt = 0;
    loop {
        let result = client
            .call(
                Target::Any,
                &CallOptions {
                    max_retries: Some(0),
                    ..CallOptions::default()
                },
                |v| messages::init_producer_id(None, i32::MAX, None, v),
                |r, v| Verdict::Done(messages::parse_init_producer_id(&r, v)),
            )
            .await;
        let code = match result {
            Ok(TxnResponse::InitProducerId(Ok(ids))) => return Ok(ids),
            // Only an init with KeepPreparedTxn is answered so.
            Ok(TxnResponse::InitKept { ids, .. }) => return Ok(ids),
            Ok(TxnResponse::InitProducerId(Err(code))) => code,
            Ok(_) => ErrorCode::UnknownServerError,
            Err(e) if e.is_retriable() => ErrorCode::NetworkException,
            Err(e) => {
                return Err(ProducerError::Net {
                    source: Arc::new(e),
                    class: ErrorClass::Fatal,
                })
            }
        };
        match classify(Api::InitProducerId, code) {
            Action::Retry(_) | Action::Abortable => {}
            _ => {
                return Err(ProducerError::Broker {
                    api: Api::InitProducerId.name(),
                    code,
                    class: ErrorClass::Fatal,
                })
            }
        }
        if started.elapsed() >= config.max_block {
            return Err(ProducerError::Timeout {
                op: "InitProducerId",
                elapsed: started.elapsed(),
                class: ErrorClass::Retriable,
                last_error: Some(code),
            });
        }
        tokio::time::sleep(backoff.delay(attempt)).await;
        attempt += 1;
    }
}

#[cfg(test)]
#[path = "pipeline_tests.rs"]
mod pipeline_tests;
#[cfg(test)]
#[path = "driver_tests.rs"]
mod tests;
