//! The async driver shared by both producers: one background task that owns the timers and hands batches
//! to per-partition sending lanes, over the sans-IO [`ProducerCore`] and [`TxnMachine`].
//!
//! Locking: one `std::sync::Mutex` around the cores, never held across an await. Record outcomes are
//! delivered after the lock is released.
//!
//! Supervision: every task this driver spawns (itself, the lanes, an enrolment, an id fetch) runs under
//! [`crate::supervise`]. When one panics or is cancelled, [`Inner::task_failed`] releases what it held
//! (the lane slot, the in-flight flag), fails the records it carried and everything unsent with
//! [`ProducerError::TaskFailed`], and makes the producer fatal, so every waiter (a `Delivery`, a flush,
//! a commit, the next send) gets a typed error instead of waiting on a task that is gone.
//!
//! Ordering: each partition has at most one *lane* task at a time, which sends the partition's batches
//! one request after another in sequence order. A lane never races another lane of the same partition,
//! so the broker sees sequences in order and OUT_OF_ORDER_SEQUENCE_NUMBER only ever means a real gap or
//! a predecessor being retried.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kafka_protocol::messages::produce_request::{
    PartitionProduceData, ProduceRequest, TopicProduceData,
};
use kafka_protocol::messages::{TopicName, TransactionalId};
use kafka_protocol::protocol::StrBytes;
use tokio::sync::{oneshot, Notify};

use super::classify::{classify, Action, Api};
use super::core::{Effects, PartitionAnswer, ProduceAnswer, ProducerCore, ToSend};
use super::encoder::RecordsEncoder;
use super::record::partition_for_key;
use super::txn::{TxnMachine, TxnRequest, TxnResponse, TxnVersion};
use super::{
    messages, ErrorClass, ProducerConfig, ProducerError, ProducerIdEpoch, ProducerRecord,
    RecordMetadata, TopicPartition,
};
use crate::net::{CallOptions, Client, NetError, Target, Verdict};
use crate::wire::ErrorCode;

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

pub(crate) struct Shared {
    pub(crate) core: ProducerCore<Reply>,
    pub(crate) txn: Option<TxnMachine>,
    /// Partitions with a lane task sending.
    lanes: HashSet<TopicPartition>,
    /// TV1: an AddPartitionsToTxn is out.
    pub(crate) add_in_flight: bool,
    /// Idempotent: the epoch ran out and InitProducerId must fetch a new id.
    need_new_id: bool,
    new_id_in_flight: bool,
    round_robin: HashMap<String, u32>,
    closed: bool,
}

pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) config: ProducerConfig,
    pub(crate) transactional_id: Option<String>,
    shared: Mutex<Shared>,
    /// Wakes the background task (new data, a lane finished, an answer changed something).
    wake: Notify,
    /// Wakes callers waiting for memory, a flush or in-flight requests to drain.
    changed: Notify,
    /// Points inside the spawned tasks that a test can make panic.
    #[cfg(test)]
    pub(crate) faults: crate::supervise::Faults,
}

/// The driver's spawned tasks, named for the error their failure becomes.
#[derive(Debug, Clone)]
enum Task {
    /// The background task itself ([`Inner::run`]).
    Driver,
    /// A partition's sending lane.
    Lane(TopicPartition),
    /// A TV1 AddPartitionsToTxn.
    AddPartitions,
    /// An idempotent producer's new-id fetch.
    ProducerId,
}

impl std::fmt::Display for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Task::Driver => f.write_str("driver"),
            Task::Lane(tp) => write!(f, "lane {tp}"),
            Task::AddPartitions => f.write_str("add partitions"),
            Task::ProducerId => f.write_str("producer id"),
        }
    }
}

impl Inner {
    pub(crate) fn new(
        client: Client,
        config: ProducerConfig,
        transactional_id: Option<String>,
        txn: Option<TxnMachine>,
    ) -> Arc<Inner> {
        let core = ProducerCore::new(&config, transactional_id.is_some());
        Arc::new(Inner {
            client,
            config,
            transactional_id,
            shared: Mutex::new(Shared {
                core,
                txn,
                lanes: HashSet::new(),
                add_in_flight: false,
                need_new_id: false,
                new_id_in_flight: false,
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
                Task::Lane(tp) => {
                    s.lanes.remove(tp);
                    s.core.abandon(&err, Some(tp))
                }
                Task::AddPartitions => {
                    s.add_in_flight = false;
                    s.core.fail_unsent(&err)
                }
                Task::ProducerId => {
                    // A fatal producer needs no id: without this the next pass would fetch again.
                    s.need_new_id = false;
                    s.new_id_in_flight = false;
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
        if let Some(txn) = s.txn.as_mut() {
            txn.on_append(&tp).map_err(|e| (e, None))?;
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
    pub(crate) fn send_buffered(&self) -> Option<super::sequence::BatchId> {
        let marker = self.lock().core.flush();
        self.wake();
        marker
    }

    async fn wait_flushed(&self, marker: Option<super::sequence::BatchId>) {
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
                    .txn
                    .as_ref()
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
                if s.core.sending() == 0 && !s.add_in_flight {
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
            if let Some(t) = s.txn.as_mut() {
                t.on_produce_error(err, bump);
            }
        }
        if let Some(err) = &fx.fatal {
            let err = match (err, &self.transactional_id) {
                (ProducerError::Fenced { code, .. }, Some(id)) => ProducerError::Fenced {
                    transactional_id: id.clone(),
                    code: *code,
                },
                (e, _) => e.clone(),
            };
            tracing::error!(error = %err, "producer failed fatally");
            s.core.set_fatal(&err);
            if let Some(t) = s.txn.as_mut() {
                t.on_produce_error(err.clone(), false);
            }
        }
        if fx.need_new_id {
            s.need_new_id = true;
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

    async fn run(self: Arc<Self>) {
        loop {
            #[cfg(test)]
            self.faults.hit("driver");
            let now = crate::clock::now();
            let mut lanes: Vec<(TopicPartition, Vec<ToSend>)> = Vec::new();
            let mut add: Option<TxnRequest> = None;
            let mut new_id = false;
            let (replies, next) = {
                let mut s = self.lock();
                if s.closed && s.lanes.is_empty() && !s.add_in_flight {
                    return;
                }
                let fx = s.core.expire(now);
                let mut replies = self.apply(&mut s, fx);
                if !s.add_in_flight {
                    if let Some(req) = s.txn.as_mut().and_then(|t| t.poll_add_partitions(now)) {
                        s.add_in_flight = true;
                        add = Some(req);
                    }
                }
                if s.need_new_id && !s.new_id_in_flight {
                    s.new_id_in_flight = true;
                    new_id = true;
                }
                let Shared {
                    core,
                    txn,
                    lanes: busy,
                    ..
                } = &mut *s;
                let mut allow = |tp: &TopicPartition| {
                    !busy.contains(tp) && txn.as_ref().is_none_or(|t| t.can_produce(tp))
                };
                let mut encoder = RecordsEncoder {
                    compression: self.config.compression,
                };
                let (out, fx) = core.poll_send(now, &mut allow, &mut encoder);
                let mut by_part: HashMap<TopicPartition, Vec<ToSend>> = HashMap::new();
                for b in out {
                    if let Some(t) = txn.as_mut() {
                        t.on_produce_sent(&b.partition);
                    }
                    by_part.entry(b.partition.clone()).or_default().push(b);
                }
                for (tp, batches) in by_part {
                    busy.insert(tp.clone());
                    lanes.push((tp, batches));
                }
                replies.extend(self.apply(&mut s, fx));
                let next = [
                    s.core.next_wakeup(now),
                    s.txn
                        .as_ref()
                        .and_then(TxnMachine::add_partitions_not_before),
                ]
                .into_iter()
                .flatten()
                .min();
                (replies, next)
            };
            deliver(replies);
            for (tp, batches) in lanes {
                let inner = self.clone();
                let task = Task::Lane(tp.clone());
                self.supervise(task, async move { inner.lane(tp, batches).await });
            }
            if let Some(req) = add {
                let inner = self.clone();
                self.supervise(Task::AddPartitions, async move {
                    inner.add_partitions(req).await
                });
            }
            if new_id {
                let inner = self.clone();
                self.supervise(Task::ProducerId, async move { inner.fetch_new_id().await });
            }
            let sleep = match next {
                Some(at) => tokio::time::Instant::from_std(at),
                None => tokio::time::Instant::now() + Duration::from_secs(3600),
            };
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep_until(sleep) => {}
            }
        }
    }

    /// Sends one partition's batches one request after another, in sequence order.
    async fn lane(self: Arc<Self>, tp: TopicPartition, batches: Vec<ToSend>) {
        for b in batches {
            #[cfg(test)]
            self.faults.hit("lane");
            let answer = self.produce(&b).await;
            let replies = {
                let mut s = self.lock();
                let fx = s.core.on_answer(b.id, answer, crate::clock::now());
                self.apply(&mut s, fx)
            };
            deliver(replies);
        }
        self.lock().lanes.remove(&tp);
        self.changed.notify_waiters();
        self.wake();
    }

    /// One Produce carrying one batch, sent once (the core decides about retries).
    async fn produce(&self, b: &ToSend) -> ProduceAnswer {
        let (min_version, max_version) = match &self.transactional_id {
            None => (3, 12),
            Some(_) => match self.lock().txn.as_ref().map(TxnMachine::txn_version) {
                Some(TxnVersion::V2) => (12, 12),
                _ => (3, 11),
            },
        };
        let options = CallOptions {
            timeout: Some(self.config.request_timeout + Duration::from_secs(5)),
            min_version: Some(min_version),
            max_version: Some(max_version),
            max_retries: Some(0),
        };
        let timeout_ms = i32::try_from(self.config.request_timeout.as_millis()).unwrap_or(i32::MAX);
        let txn_id = self.transactional_id.clone();
        let build = |_version: i16| {
            ProduceRequest::default()
                .with_transactional_id(
                    txn_id
                        .as_ref()
                        .map(|id| TransactionalId(StrBytes::from_string(id.clone()))),
                )
                .with_acks(-1)
                .with_timeout_ms(timeout_ms)
                .with_topic_data(vec![TopicProduceData::default()
                    .with_name(TopicName(StrBytes::from_string(
                        b.partition.topic.to_string(),
                    )))
                    .with_partition_data(vec![PartitionProduceData::default()
                        .with_index(b.partition.partition)
                        .with_records(Some(b.records.clone()))])])
        };
        let target = Target::leader(b.partition.topic.clone(), b.partition.partition);
        let result = self
            .client
            .call(target, &options, build, |r, _| Verdict::Done(r))
            .await;
        match result {
            Ok(response) => response
                .responses
                .iter()
                .filter(|t| *t.name.0 == *b.partition.topic)
                .flat_map(|t| t.partition_responses.iter())
                .find(|p| p.index == b.partition.partition)
                .map_or_else(
                    || ProduceAnswer::NoAnswer("the answer omitted the partition".into()),
                    |p| {
                        ProduceAnswer::Partition(PartitionAnswer {
                            code: ErrorCode::from_code(p.error_code),
                            base_offset: p.base_offset,
                            log_append_time_ms: p.log_append_time_ms,
                        })
                    },
                ),
            Err(e) => net_to_produce_answer(&e),
        }
    }

    /// TV1 enrolment, sent once; the machine decides about retries.
    async fn add_partitions(self: Arc<Self>, req: TxnRequest) {
        #[cfg(test)]
        self.faults.hit("add partitions");
        let resp = send_txn(&self.client, &req).await;
        let outcome = {
            let mut s = self.lock();
            s.add_in_flight = false;
            s.txn
                .as_mut()
                .map(|t| t.on_add_partitions(resp, crate::clock::now()))
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
            s.new_id_in_flight = false;
            match result {
                Ok(ids) => {
                    s.need_new_id = false;
                    s.core.set_ids(ids);
                    let fx = s.core.resume_after_new_id();
                    self.apply(&mut s, fx)
                }
                Err(e) => {
                    // Fatal now, so no new id is wanted (else every later pass would fetch again).
                    s.need_new_id = false;
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
        } => {
            client
                .call(
                    target,
                    &options,
                    |v| {
                        messages::init_producer_id(Some(transactional_id), *timeout_ms, *current, v)
                    },
                    |r, _| Verdict::Done(messages::parse_init_producer_id(&r)),
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
                        min_version: Some(3),
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
            None if e.is_transport() || e.is_retriable() => {
                req.answered_with(ErrorCode::CoordinatorNotAvailable)
            }
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
                |r, _| Verdict::Done(messages::parse_init_producer_id(&r)),
            )
            .await;
        let code = match result {
            Ok(TxnResponse::InitProducerId(Ok(ids))) => return Ok(ids),
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
mod tests;
