//! The transactional producer: the public face of the transaction state machine.

use std::sync::Arc;

use tracing::Instrument;

use super::config::DEFAULT_TRANSACTION_TIMEOUT;
use super::driver::{deliver, send_txn, Delivery, Inner, Mode, Shared};
use super::txn::{BrokerCaps, Coordinator, Step, TxnMachine, TxnResponse, TxnVersion};
use super::{
    Completion, OffsetAndMetadata, PreparedTxn, ProducerError, ProducerIdEpoch, ProducerRecord,
    TopicPartition, TransactionState, TransactionalConfig,
};
use crate::net::{Client, CoordinatorKind};
use crate::GroupMetadata;

/// A transactional producer: records and consumer offsets committed or aborted together.
///
/// The consume-transform-produce loop (`examples/transform.rs` runs it in full): the input offsets ride in
/// the transaction with the output, fenced by the consumer group's generation, and after an abort the
/// consumer is rewound to the committed offsets, or the aborted batch would be skipped.
///
/// ```no_run
/// # use std::time::Duration;
/// # use snapfence::consumer::{GroupConsumer, StartAt};
/// # use snapfence::producer::*;
/// # async fn demo(client: snapfence::net::Client, mut consumer: GroupConsumer)
/// # -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// // One stable id per worker: initialising fences the worker's previous incarnation.
/// let mut producer =
///     TransactionalProducer::init(client, TransactionalConfig::new("enricher-0")).await?;
/// loop {
///     let batches = consumer.poll(Duration::from_millis(200)).await?;
///     if batches.is_empty() {
///         continue;
///     }
///     let group = consumer.group_metadata().require()?; // the generation of this poll
///     producer.begin()?;
///     let mut offsets = Vec::new();
///     for batch in &batches {
///         for r in &batch.records {
///             let _ = producer.send(ProducerRecord::new("enriched", r.value.clone())).await?;
///         }
///         offsets.push((batch.partition.clone(), batch.next_offset.into()));
///     }
///     producer.send_offsets(offsets, &group).await?; // CommitFenced: this member is stale
///     match producer.commit().await {
///         Ok(()) => {}
///         Err(e) if e.is_abortable() => {
///             producer.abort().await?;
///             for tp in consumer.assignment() {
///                 let committed = consumer.committed(std::slice::from_ref(&tp)).await?[&tp];
///                 consumer.seek(&tp, committed.map_or(StartAt::Earliest, StartAt::Offset));
///             }
///         }
///         // Fatal (fenced, unauthorized): stop. Outcome unknown: commit again or `reinit`, never abort.
///         Err(e) => return Err(e.into()),
///     }
/// }
/// # }
/// ```
///
/// Transaction-control calls take `&mut self`, so nothing else can send while a commit or abort is
/// under way; `send` takes `&self`.
///
/// Every transaction runs inside a `transaction` tracing span that records the transactional id, the
/// producer id and epoch, the partitions written, the duration and the outcome.
pub struct TransactionalProducer {
    inner: Arc<Inner>,
    config: TransactionalConfig,
}

impl std::fmt::Debug for TransactionalProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransactionalProducer")
            .field("transactional_id", &self.config.transactional_id)
            .field("state", &self.state())
            .field("ids", &self.producer_id_and_epoch())
            .finish()
    }
}

impl TransactionalProducer {
    /// Initialises a producer for `config.transactional_id`: InitProducerId to the transaction
    /// coordinator, retried while the coordinator is loading, moving or finishing an earlier
    /// transaction. Initialising fences every earlier producer with the same id and aborts what it left
    /// open.
    ///
    /// Cancel-safe: dropping the future leaves nothing behind but a coordinator that may have bumped the
    /// epoch (harmless: the next init bumps it again).
    ///
    /// With [`TransactionalConfig::two_phase_commit`] the init is a KIP-939 one (InitProducerId v6 with
    /// `Enable2Pc`): refused with [`ProducerError::TwoPhaseCommitRefused`] when the broker does not
    /// speak it, has it switched off or the principal lacks the TWO_PHASE_COMMIT ACL; a transaction the
    /// predecessor left open, prepared or not, is aborted (see
    /// [`init_keeping_prepared`](Self::init_keeping_prepared) to keep it).
    pub async fn init(client: Client, config: TransactionalConfig) -> Result<Self, ProducerError> {
        let (producer, _) = Self::start(client, config, false).await?;
        Ok(producer)
    }

    /// Two-phase commit only: initialises like [`init`](Self::init), but a transaction the predecessor
    /// left open is *kept* (`KeepPreparedTxn`) and returned by name, for the caller to finish with
    /// [`complete`](Self::complete) by what the other store committed. `None`: nothing was open, and
    /// the producer is ready.
    ///
    /// Kafka 4.4.0 refuses `KeepPreparedTxn` in every case:
    /// [`ProducerError::TwoPhaseCommitRefused`] with
    /// [`TwoPhaseCommitRefusal::KeepPreparedUnsupported`](super::TwoPhaseCommitRefusal::KeepPreparedUnsupported),
    /// after which nothing has changed and [`init`](Self::init) is the fallback (it aborts the open
    /// transaction).
    ///
    /// Cancel-safe as [`init`](Self::init).
    pub async fn init_keeping_prepared(
        client: Client,
        config: TransactionalConfig,
    ) -> Result<(Self, Option<PreparedTxn>), ProducerError> {
        if !config.two_phase_commit {
            return Err(ProducerError::IllegalState {
                op: "init_keeping_prepared",
                state: "not configured for two-phase commit",
            });
        }
        Self::start(client, config, true).await
    }

    async fn start(
        client: Client,
        config: TransactionalConfig,
        keep_prepared: bool,
    ) -> Result<(Self, Option<PreparedTxn>), ProducerError> {
        if config.two_phase_commit && config.transaction_timeout != DEFAULT_TRANSACTION_TIMEOUT {
            return Err(ProducerError::TwoPhaseCommitRefused {
                transactional_id: config.transactional_id.clone(),
                refusal: super::TwoPhaseCommitRefusal::TimeoutSet,
            });
        }
        let caps = broker_caps(&client, &config.transactional_id).await;
        let machine = TxnMachine::new(
            config.transactional_id.clone(),
            config.transaction_timeout,
            config.producer.backoff(),
            caps,
        )
        .with_two_phase(config.two_phase_commit);
        let inner = Inner::transactional(client, config.producer.clone(), machine);
        inner.spawn();
        let producer = TransactionalProducer { inner, config };
        let step = producer
            .with_txn(|t| t.start_init(crate::clock::now(), producer.op_timeout(), keep_prepared));
        producer.run(step).await?;
        // The coordinator is known for certain now; its versions decide TV1 or TV2.
        producer.refresh_caps().await;
        let kept = producer.prepared();
        Ok((producer, kept))
    }

    /// Re-initialises after a commit of unknown outcome (or to resume an interrupted init): completes or
    /// aborts whatever the coordinator still holds for this id, and starts afresh. The earlier
    /// transaction's outcome stays unknown to this producer; read the log to learn it.
    ///
    /// Cancel-safe: calling it again resumes.
    pub async fn reinit(&mut self) -> Result<(), ProducerError> {
        let step = self.with_txn(|t| t.start_init(crate::clock::now(), self.op_timeout(), false));
        self.run(step).await?;
        self.refresh_caps().await;
        Ok(())
    }

    /// Opens a transaction. Sends nothing.
    pub fn begin(&mut self) -> Result<(), ProducerError> {
        machine(&mut self.inner.lock().mode).begin(crate::clock::now())
    }

    /// Adds a record to the open transaction, waiting for buffer space (and the topic's metadata) up to
    /// `max_block`. Returns once the record is buffered; the [`Delivery`] resolves when the broker has
    /// it. An acknowledged record is still invisible to read_committed readers until the commit.
    ///
    /// Cancel-safe: if the future is dropped before it returns, the record was not added.
    pub async fn send(&self, record: ProducerRecord) -> Result<Delivery, ProducerError> {
        self.inner.append(record).await
    }

    /// As [`send`](Self::send) but fails at once with [`ProducerError::BufferFull`] (retriable) when the
    /// buffer is full, or [`ProducerError::UnknownPartition`] when the topic's metadata is not cached.
    pub fn try_send(&self, record: ProducerRecord) -> Result<Delivery, ProducerError> {
        self.inner.try_append(record).map_err(|(e, _)| e)
    }

    /// Ends the linger of every record buffered now: their batches go out as soon as their partitions'
    /// connections allow, without waiting for [`ProducerConfig::linger`](super::ProducerConfig). Waits
    /// for nothing. For a caller that has queued a whole transaction's records and will commit next: the
    /// last, partly filled batch would otherwise sit out its linger while the offsets are committed.
    pub fn send_buffered(&self) {
        self.inner.send_buffered();
    }

    /// Commits `offsets` for `group` inside the transaction, fenced by the group's generation (KIP-447):
    /// a stale generation, an unknown member or a fenced static instance fails with
    /// [`ProducerError::CommitFenced`] and leaves the transaction abortable.
    ///
    /// Not cancel-safe in effect: if the future is dropped, whether the fence ran is unknown, so the
    /// producer refuses to commit this transaction (abort it).
    pub async fn send_offsets(
        &mut self,
        offsets: impl IntoIterator<Item = (TopicPartition, OffsetAndMetadata)>,
        group: &GroupMetadata,
    ) -> Result<(), ProducerError> {
        let offsets: Vec<_> = offsets.into_iter().collect();
        let timeout = self.op_timeout();
        let step =
            self.with_txn(|t| t.start_send_offsets(group, offsets, crate::clock::now(), timeout));
        self.run(step).await
    }

    /// Commits the transaction: waits for every record of it to be acknowledged, then EndTxn(commit).
    /// Returns once the coordinator has logged the commit; the markers that make the records visible to
    /// read_committed readers follow asynchronously.
    ///
    /// On an abortable error, call [`abort`](Self::abort). On an outcome-unknown error, never abort:
    /// call `commit` again or [`reinit`](Self::reinit).
    ///
    /// Cancel-safe: dropping the future leaves the commit in progress; calling `commit` again resumes
    /// it (and treats its outcome as in doubt).
    pub async fn commit(&mut self) -> Result<(), ProducerError> {
        if self.state() == TransactionState::InTransaction {
            self.inner.flush().await;
            self.inner.quiesce().await;
        }
        let step = self.with_txn(|t| t.start_commit(crate::clock::now(), self.op_timeout()));
        self.run(step).await?;
        self.refresh_caps().await;
        Ok(())
    }

    /// Two-phase commit only: flushes the open transaction (every record acknowledged, as `commit` does
    /// before its EndTxn) and holds it prepared for an outside decision. Returns its name, which the
    /// other store records with its own commit. From here only [`commit`](Self::commit),
    /// [`abort`](Self::abort) or [`complete`](Self::complete) are accepted. No request is sent: the
    /// coordinator keeps a two-phase producer's transaction open, never timing it out, until EndTxn (or
    /// a new producer's init).
    ///
    /// Refused under transaction version 1
    /// ([`TwoPhaseCommitRefusal::NeedsTransactionVersion2`](super::TwoPhaseCommitRefusal::NeedsTransactionVersion2)),
    /// with a `send_offsets` interrupted, or after an error (abort first). A record that failed makes the
    /// transaction abortable and `prepare` fails with its error.
    ///
    /// Cancel-safe: dropping the future before it returns leaves the transaction open and unprepared.
    pub async fn prepare(&mut self) -> Result<PreparedTxn, ProducerError> {
        if self.state() == TransactionState::InTransaction {
            self.inner.flush().await;
            self.inner.quiesce().await;
        }
        let ids = self.with_txn(|t| t.prepare())?;
        Ok(ids.into())
    }

    /// The name of the transaction this producer holds prepared, if it holds one (after
    /// [`prepare`](Self::prepare), or an [`init_keeping_prepared`](Self::init_keeping_prepared) that
    /// kept one).
    pub fn prepared(&self) -> Option<PreparedTxn> {
        self.inner
            .lock()
            .mode
            .machine()
            .and_then(TxnMachine::prepared)
            .map(PreparedTxn::from)
    }

    /// Two-phase commit only: finishes the prepared transaction by what the other store committed.
    /// `committed` is the name the other store recorded with its last commit (`None` if it has none):
    /// equal to the prepared transaction's name, the transaction is committed; otherwise aborted.
    /// Refused unless a transaction is prepared.
    ///
    /// Cancel-safe as `commit` and `abort` are: call it again to resume (with the same `committed`).
    pub async fn complete(
        &mut self,
        committed: Option<PreparedTxn>,
    ) -> Result<Completion, ProducerError> {
        let Some(prepared) = self.prepared() else {
            return Err(ProducerError::IllegalState {
                op: "complete",
                state: "holding no prepared transaction",
            });
        };
        if committed == Some(prepared) {
            self.commit().await?;
            Ok(Completion::Committed)
        } else {
            self.abort().await?;
            Ok(Completion::Aborted)
        }
    }

    /// Aborts the transaction: records not yet sent fail with [`ProducerError::TransactionAborted`],
    /// the ones in flight are waited for, then EndTxn(abort) (under TV1 followed by an epoch bump after a
    /// sequence or epoch error). Refused while a commit may still land.
    ///
    /// Cancel-safe: calling `abort` again resumes.
    pub async fn abort(&mut self) -> Result<(), ProducerError> {
        if matches!(
            self.state(),
            TransactionState::InTransaction | TransactionState::AbortableError
        ) {
            let replies = {
                let mut s = self.inner.lock();
                let fx = s.core.fail_unsent(&ProducerError::TransactionAborted);
                self.inner.apply(&mut s, fx)
            };
            deliver(replies);
            self.inner.quiesce().await;
        }
        let step = self.with_txn(|t| t.start_abort(crate::clock::now(), self.op_timeout()));
        self.run(step).await?;
        self.refresh_caps().await;
        Ok(())
    }

    /// The state of the transaction machine.
    pub fn state(&self) -> TransactionState {
        self.inner
            .lock()
            .mode
            .machine()
            .map_or(TransactionState::FatalError, TxnMachine::state)
    }

    /// The transactional id this producer was initialised with.
    pub fn transactional_id(&self) -> &str {
        &self.config.transactional_id
    }

    /// The producer id and epoch in use (under TV2 it changes after every transaction).
    pub fn producer_id_and_epoch(&self) -> Option<ProducerIdEpoch> {
        self.inner.lock().mode.machine().and_then(TxnMachine::ids)
    }

    /// The transaction protocol the open (or next) transaction uses: 1 or 2.
    pub fn transaction_version(&self) -> u8 {
        match self
            .inner
            .lock()
            .mode
            .machine()
            .map(TxnMachine::txn_version)
        {
            Some(TxnVersion::V2) => 2,
            _ => 1,
        }
    }

    /// Stops the producer. Records not yet sent fail with [`ProducerError::Closed`]; an open
    /// transaction is left to the coordinator's timeout (or the next producer's init).
    ///
    /// Cancel-safe.
    pub async fn close(self) {
        self.inner.close();
    }

    /// The shared driver state, for tests that reach into the driver.
    #[cfg(test)]
    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    fn op_timeout(&self) -> std::time::Duration {
        self.config.operation_timeout
    }

    fn with_txn<R>(&self, f: impl FnOnce(&mut TxnMachine) -> R) -> R {
        let mut s = self.inner.lock();
        f(machine(&mut s.mode))
    }

    /// Drives an operation's steps to the end: sends, backs off, re-finds coordinators. New ids from
    /// the machine (init, a bump, a TV2 EndTxn) reach the produce path before the next record.
    async fn run(&self, mut step: Step) -> Result<(), ProducerError> {
        let span = {
            let s = self.inner.lock();
            s.mode
                .machine()
                .and_then(TxnMachine::span)
                .cloned()
                .unwrap_or_else(tracing::Span::current)
        };
        async {
            loop {
                match step {
                    Step::Send(req) => {
                        let deadline = self
                            .with_txn(|t| t.op_deadline())
                            .filter(|at| crate::clock::now() < *at);
                        let attempt = send_txn(&self.inner.client, &req);
                        let resp = match deadline {
                            // An attempt started before the operation's deadline ends there, not at
                            // its request timeout (a coordinator's node that never answers a connect
                            // would otherwise hold the operation a request timeout past its own).
                            // Unanswered, as far as the machine can tell: it may have reached the
                            // coordinator. The one attempt a backoff can start after the deadline
                            // runs as usual, and the machine ends the operation on its answer.
                            Some(at) => {
                                tokio::time::timeout_at(tokio::time::Instant::from_std(at), attempt)
                                    .await
                                    .unwrap_or_else(|_| {
                                        TxnResponse::NoAnswer(
                                            "still unanswered at the operation's deadline".into(),
                                        )
                                    })
                            }
                            None => attempt.await,
                        };
                        let mut s = self.inner.lock();
                        let Shared { mode, core, .. } = &mut *s;
                        let t = machine(mode);
                        step = t.handle_response(resp, crate::clock::now());
                        if let Some(ids) = t.ids() {
                            core.set_ids(ids);
                        }
                    }
                    Step::Backoff {
                        delay,
                        refresh,
                        request,
                    } => {
                        tokio::time::sleep(delay).await;
                        if refresh {
                            match request.coordinator() {
                                Coordinator::Transaction(id) => self
                                    .inner
                                    .client
                                    .invalidate_coordinator(CoordinatorKind::Transaction, &id),
                                Coordinator::Group(g) => self
                                    .inner
                                    .client
                                    .invalidate_coordinator(CoordinatorKind::Group, &g),
                            }
                        }
                        step = Step::Send(request);
                    }
                    Step::Done => {
                        self.inner.wake();
                        return Ok(());
                    }
                    Step::Failed(e) => {
                        self.inner.wake();
                        return Err(e);
                    }
                }
            }
        }
        .instrument(span)
        .await
    }

    /// Re-reads what the broker supports (a feature upgrade takes effect at the next `begin`).
    async fn refresh_caps(&self) {
        let caps = broker_caps(&self.inner.client, &self.config.transactional_id).await;
        if let Some(t) = self.inner.lock().mode.machine_mut() {
            t.set_caps(caps);
        }
    }
}

impl Drop for TransactionalProducer {
    fn drop(&mut self) {
        self.inner.close();
    }
}

/// What the transaction coordinator's broker supports. Before the coordinator can be reached, a view
/// with no versions at all: the first request then surfaces the real error, and TV1 is assumed.
async fn broker_caps(client: &Client, transactional_id: &str) -> BrokerCaps {
    use crate::wire::ApiRequest;
    use kafka_protocol::messages::{
        EndTxnRequest, InitProducerIdRequest, ProduceRequest, TxnOffsetCommitRequest,
    };
    let transaction_version = client.features().transaction_version;
    let versions = match client
        .coordinator(CoordinatorKind::Transaction, transactional_id)
        .await
    {
        Ok(node) => client.broker_versions(node).await.ok(),
        Err(e) => {
            tracing::debug!(error = %e, "transaction coordinator not found yet");
            None
        }
    };
    match versions {
        Some(v) => BrokerCaps {
            transaction_version,
            produce: v.usable(ProduceRequest::KEY),
            init_producer_id: v.usable(InitProducerIdRequest::KEY),
            txn_offset_commit: v.usable(TxnOffsetCommitRequest::KEY),
            end_txn: v.usable(EndTxnRequest::KEY),
        },
        None => BrokerCaps {
            transaction_version,
            ..BrokerCaps::default()
        },
    }
}

/// The transaction machine in a transactional producer's driver state. A `TransactionalProducer` gets
/// that state only from [`Inner::transactional`], and a producer's mode never changes, so the
/// idempotent arm is never reached: this is the one place that says so.
fn machine(mode: &mut Mode) -> &mut TxnMachine {
    match mode {
        Mode::Transactional { machine, .. } => machine,
        Mode::Idempotent { .. } => {
            unreachable!("a TransactionalProducer's state is built by Inner::transactional")
        }
    }
}
