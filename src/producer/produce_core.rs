//! The produce path without I/O: batches in, requests out, answers in, record outcomes out.
//!
//! [`ProducerCore`] joins the accumulator (what waits), the sequencer (what may go out and with which
//! sequence) and the classification table (what an answer means). The driver asks it what to send, sends
//! it, and feeds every answer back; the core says which records are done and how, which leaders to look
//! up again, and whether the transaction or the producer is broken.
//!
//! # Method kinds and call order
//! - **commands**: `append` (buffer a record), `set_ids`, `flush`, `fail_unsent`, `abandon`,
//!   `set_fatal`;
//! - **`handle_*`**, input: `handle_answer` (a batch's part of a Produce answer, or its lack of one),
//!   `handle_timeout` (batches past their delivery timeout), `resume_after_new_id`;
//! - **`poll_*`**, output: `poll_send` (the batches to send now, each allowed by the caller's budget:
//!   [`SendBudget`](super::budget::SendBudget) in the driver), `poll_timeout` (when to look again).
//!
//! Each driver pass: `handle_timeout`, then `poll_send`; every answer goes to `handle_answer`. Every
//! call returns [`Effects`] (completions, leaders to refresh, a transaction or producer error), which
//! the driver applies.
//!
//! A batch is encoded once, when it first leaves the accumulator, and its bytes are kept: every retry
//! sends exactly those bytes, so the broker sees the same sequence and deduplicates. Only a batch known
//! not to be written is encoded again, after an epoch bump, with a new sequence.
//!
//! # References
//! - KIP-98 (idempotent produce), KIP-360 (epoch bumps), KIP-588, KIP-890
//! - Produce v3+: one record batch per partition per request for idempotent and transactional writes

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::accumulator::{Accumulator, AppendError, Batch};
use super::classify::{classify, Action, Api, Refresh};
use super::config::ProducerConfig;
use super::sequence_core::{BatchId, Outcome, Resolution, Sequencer};
use super::{
    ErrorClass, ProducerError, ProducerIdEpoch, ProducerRecord, RecordMetadata, TopicPartition,
};
use crate::net::Backoff;
use crate::wire::ErrorCode;

/// Turns records into one v2 record batch. Implemented over the records layer's batch builder; tests
/// use a recording fake.
pub(crate) trait BatchEncoder {
    fn encode(
        &mut self,
        records: &[&ProducerRecord],
        ids: ProducerIdEpoch,
        base_sequence: i32,
        transactional: bool,
    ) -> Result<Bytes, String>;
}

/// One partition's part of a Produce answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PartitionAnswer {
    pub(crate) code: ErrorCode,
    pub(crate) base_offset: i64,
    /// -1 unless the topic uses log-append time.
    pub(crate) log_append_time_ms: i64,
}

/// What came back for a batch's attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ProduceAnswer {
    Partition(PartitionAnswer),
    /// The request got no answer (timeout, dropped connection): the batch may have been written.
    NoAnswer(String),
    /// The request never left (no connection, no leader known): not written by this attempt.
    NotSent(String),
}

/// A batch to put into a Produce request (at most one per partition per request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ToSend {
    pub(crate) id: BatchId,
    pub(crate) partition: TopicPartition,
    pub(crate) records: Bytes,
    pub(crate) ids: ProducerIdEpoch,
    pub(crate) base_sequence: i32,
    /// 0 for the first attempt.
    pub(crate) attempt: u32,
    /// When the batch's delivery timeout runs out: the driver ends a request still unanswered then,
    /// so the timeout bounds when the outcome is reported, as it promises.
    pub(crate) deadline: Instant,
}

/// A record's final outcome, with whatever the driver attached to it.
#[derive(Debug)]
pub(crate) struct Completion<T> {
    pub(crate) completion: T,
    pub(crate) result: Result<RecordMetadata, ProducerError>,
}

/// What the driver must do after a call into the core.
#[derive(Debug)]
pub(crate) struct Effects<T> {
    pub(crate) completions: Vec<Completion<T>>,
    /// Leaders to look up again before the retries go out.
    pub(crate) refresh_leader: Vec<TopicPartition>,
    /// Transactional: the transaction cannot commit; `.1` says an epoch bump must follow the abort.
    pub(crate) txn_error: Option<(ProducerError, bool)>,
    /// The producer is unusable.
    pub(crate) fatal: Option<ProducerError>,
    /// Idempotent: the epoch is exhausted; fetch a new producer id, then call
    /// [`ProducerCore::set_ids`].
    pub(crate) need_new_id: bool,
    /// Memory was given back: waiting senders may try again.
    pub(crate) memory_freed: bool,
}

impl<T> Default for Effects<T> {
    fn default() -> Self {
        Effects {
            completions: Vec::new(),
            refresh_leader: Vec::new(),
            txn_error: None,
            fatal: None,
            need_new_id: false,
            memory_freed: false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FlightState {
    /// A request carrying it is out.
    Sending,
    /// Waiting to be resent, not before this instant.
    Waiting(Instant),
    /// Known not written; waiting for the epoch bump to be re-sequenced (idempotent only).
    Held,
}

#[derive(Debug)]
struct Flight<T> {
    batch: Batch<T>,
    bytes: Bytes,
    ids: ProducerIdEpoch,
    base_seq: i32,
    attempts: u32,
    deadline: Instant,
    state: FlightState,
}

pub(crate) struct ProducerCore<T> {
    transactional: bool,
    delivery_timeout: Duration,
    backoff: Backoff,
    max_in_flight: usize,
    acc: Accumulator<T>,
    seq: Option<Sequencer>,
    flights: HashMap<BatchId, Flight<T>>,
    fatal: Option<Arc<ProducerError>>,
    /// The last partition a pass took a new batch from: the next pass starts after it, so that when
    /// a busy broker can take only some of the ready partitions, the others go first next time.
    last_drained: Option<TopicPartition>,
}

impl<T> ProducerCore<T> {
    pub(crate) fn new(config: &ProducerConfig, transactional: bool) -> Self {
        ProducerCore {
            transactional,
            delivery_timeout: config.delivery_timeout,
            backoff: config.backoff(),
            max_in_flight: config.max_in_flight,
            acc: Accumulator::new(config.accumulator()),
            seq: None,
            flights: HashMap::new(),
            fatal: None,
            last_drained: None,
        }
    }

    /// The ids batches are sequenced under now.
    pub(crate) fn ids(&self) -> Option<ProducerIdEpoch> {
        self.seq.as_ref().map(Sequencer::ids)
    }

    /// New producer ids: from InitProducerId, a KIP-360 bump, or a TV2 EndTxn. A transactional producer
    /// starts every partition at 0 under new ids (between transactions nothing is in flight); under
    /// unchanged ids its sequences carry on, as the broker expects. The idempotent producer moves each
    /// partition over once its window drains.
    pub(crate) fn set_ids(&mut self, ids: ProducerIdEpoch) {
        match &mut self.seq {
            None => self.seq = Some(Sequencer::new(ids, self.max_in_flight)),
            Some(s) if s.ids() == ids => {}
            Some(s) if self.transactional => s.reset(ids),
            Some(s) => s.adopt(ids),
        }
    }

    /// Appends a record for `tp` (partition chosen, timestamp set). On failure the record and its
    /// completion come back with the error, so a waiting `send` can retry.
    #[allow(clippy::type_complexity, clippy::result_large_err)]
    pub(crate) fn append(
        &mut self,
        tp: &TopicPartition,
        record: ProducerRecord,
        completion: T,
        now: Instant,
    ) -> Result<BatchId, (ProducerError, ProducerRecord, T)> {
        if let Some(cause) = &self.fatal {
            return Err((
                ProducerError::Defunct {
                    cause: cause.clone(),
                },
                record,
                completion,
            ));
        }
        self.acc
            .append(tp, record, completion, now)
            .map_err(|(e, r, c)| {
                let err = match e {
                    AppendError::Full {
                        requested,
                        available,
                    } => ProducerError::BufferFull {
                        requested,
                        available,
                    },
                    AppendError::TooLarge { size, limit } => {
                        ProducerError::RecordTooLarge { size, limit }
                    }
                };
                (err, r, c)
            })
    }

    /// Batches to send now: retries first (same bytes, same sequence, in order), then new batches of
    /// ready partitions whose in-flight window has room, starting after the partition the last pass
    /// took one from. Only batches `allow` lets through go: it is asked with the partition and the
    /// batch's reserved bytes (0 for a partition's retries, which go together and before anything new),
    /// and says no for a TV1 transaction's partition not enrolled yet, a partition whose leader the
    /// driver does not know yet, or a broker with no room. The sequencer's window bounds what is out per
    /// partition (`max_in_flight`).
    pub(crate) fn poll_send(
        &mut self,
        now: Instant,
        allow: &mut dyn FnMut(&TopicPartition, usize) -> bool,
        encoder: &mut dyn BatchEncoder,
    ) -> (Vec<ToSend>, Effects<T>) {
        let mut out = Vec::new();
        let mut fx = Effects::default();
        if self.fatal.is_some() {
            return (out, fx);
        }
        let Some(seq) = self.seq.as_mut() else {
            return (out, fx);
        };
        // Retries. A partition resends only once all its waiting batches' backoffs have passed, so they
        // go out together and in sequence order.
        let mut waiting: HashMap<TopicPartition, Instant> = HashMap::new();
        for f in self.flights.values() {
            if let FlightState::Waiting(t) = f.state {
                let e = waiting.entry(f.batch.partition.clone()).or_insert(t);
                *e = (*e).max(t);
            }
        }
        let mut parts: Vec<_> = waiting.into_iter().filter(|(_, t)| *t <= now).collect();
        parts.sort();
        for (tp, _) in parts {
            if !allow(&tp, 0) {
                continue;
            }
            while let Some(id) = seq.poll_resend(&tp) {
                let Some(f) = self.flights.get_mut(&id) else {
                    continue;
                };
                f.state = FlightState::Sending;
                f.attempts += 1;
                out.push(ToSend {
                    id,
                    partition: tp.clone(),
                    records: f.bytes.clone(),
                    ids: f.ids,
                    base_sequence: f.base_seq,
                    attempt: f.attempts,
                    deadline: f.deadline,
                });
            }
        }
        // New batches.
        let mut ready = self.acc.ready(now);
        if let Some(last) = &self.last_drained {
            let after = ready.partition_point(|tp| tp <= last);
            ready.rotate_left(after);
        }
        for tp in ready {
            while self.acc.is_ready(&tp, now)
                && seq.can_send_new(&tp, now)
                && allow(&tp, self.acc.head_bytes(&tp).unwrap_or(0))
            {
                self.last_drained = Some(tp.clone());
                let batch = self.acc.drain(&tp).expect("ready implies a batch");
                let count = i32::try_from(batch.len()).unwrap_or(i32::MAX);
                let (ids, base_seq) = seq.assign(&tp, batch.id, count);
                let records: Vec<&ProducerRecord> = batch.records.iter().map(|(r, _)| r).collect();
                match encoder.encode(&records, ids, base_seq, self.transactional) {
                    Ok(bytes) => {
                        let deadline = batch.created + self.delivery_timeout;
                        out.push(ToSend {
                            id: batch.id,
                            partition: tp.clone(),
                            records: bytes.clone(),
                            ids,
                            base_sequence: base_seq,
                            attempt: 0,
                            deadline,
                        });
                        self.flights.insert(
                            batch.id,
                            Flight {
                                batch,
                                bytes,
                                ids,
                                base_seq,
                                attempts: 0,
                                deadline,
                                state: FlightState::Sending,
                            },
                        );
                    }
                    Err(reason) => {
                        // Never sent: the sequence is taken back as if the broker had rejected it.
                        seq.handle_outcome(&tp, batch.id, Outcome::Rejected, now);
                        let err = ProducerError::Broker {
                            api: "encode",
                            code: ErrorCode::InvalidRecord,
                            class: ErrorClass::Abortable,
                        };
                        tracing::warn!(partition = %tp, %reason, "record batch could not be encoded");
                        self.acc.release(batch.reserved);
                        fx.memory_freed = true;
                        Self::complete_err(&mut fx, batch, &err);
                        if self.transactional {
                            fx.txn_error.get_or_insert((err, false));
                        }
                    }
                }
            }
        }
        (out, fx)
    }

    fn complete_err(fx: &mut Effects<T>, batch: Batch<T>, err: &ProducerError) {
        for (_, c) in batch.records {
            fx.completions.push(Completion {
                completion: c,
                result: Err(err.clone()),
            });
        }
    }

    fn complete_ok(fx: &mut Effects<T>, batch: Batch<T>, answer: Option<PartitionAnswer>) {
        let tp = batch.partition.clone();
        for (i, (r, c)) in batch.records.into_iter().enumerate() {
            let offset = answer
                .filter(|a| a.base_offset >= 0)
                .map(|a| a.base_offset + i as i64);
            let timestamp = match answer {
                Some(a) if a.log_append_time_ms >= 0 => a.log_append_time_ms,
                _ => r.timestamp.unwrap_or(-1),
            };
            fx.completions.push(Completion {
                completion: c,
                result: Ok(RecordMetadata {
                    topic_partition: tp.clone(),
                    offset,
                    timestamp,
                }),
            });
        }
    }

    /// Feeds the answer for batch `id`'s latest attempt.
    pub(crate) fn handle_answer(
        &mut self,
        id: BatchId,
        answer: ProduceAnswer,
        now: Instant,
    ) -> Effects<T> {
        let mut fx = Effects::default();
        // The batch in flight and the sequencer that numbered it: a flight exists only once ids did,
        // so an answer finds both or is for a batch this core no longer has (given up on already).
        let (Some(flight), Some(seq)) = (self.flights.get(&id), self.seq.as_mut()) else {
            return fx;
        };
        let tp = flight.batch.partition.clone();
        let (outcome, action, code, reason) = match &answer {
            ProduceAnswer::NoAnswer(reason) => (
                Outcome::NoAnswer,
                Action::Retry(Refresh::Leader),
                ErrorCode::RequestTimedOut,
                reason.clone(),
            ),
            ProduceAnswer::NotSent(reason) => (
                Outcome::Retriable,
                Action::Retry(Refresh::Leader),
                ErrorCode::NetworkException,
                reason.clone(),
            ),
            ProduceAnswer::Partition(a) => {
                let action = classify(Api::Produce, a.code);
                let outcome = match action {
                    Action::Ok | Action::Duplicate => Outcome::Acked,
                    // The leader appended the batch and then gave up waiting for its replicas (the
                    // broker's own timeout, or fewer in-sync replicas than required after the append):
                    // the batch may be in the log, as if the answer had been lost.
                    Action::Retry(_)
                        if matches!(
                            a.code,
                            ErrorCode::RequestTimedOut | ErrorCode::NotEnoughReplicasAfterAppend
                        ) =>
                    {
                        Outcome::NoAnswer
                    }
                    Action::Retry(_) => Outcome::Retriable,
                    Action::SequenceBroken => Outcome::SequenceBroken,
                    Action::StaleEpoch => Outcome::StaleEpoch,
                    // Verification refused it, or it is invalid: not written.
                    Action::Abortable
                    | Action::Rejected
                    | Action::CommitFenced
                    | Action::Fenced
                    | Action::Fatal => Outcome::Rejected,
                };
                (outcome, action, a.code, a.code.to_string())
            }
        };
        if let Action::Retry(Refresh::Leader) = action {
            fx.refresh_leader.push(tp.clone());
        }
        let mut resolution = seq.handle_outcome(&tp, id, outcome, now);
        if resolution == Resolution::Resend && now >= self.flights[&id].deadline {
            resolution = seq.give_up(&tp, id);
        }
        match resolution {
            Resolution::Done => {
                let f = self.flights.remove(&id).expect("present");
                self.acc.release(f.batch.reserved);
                fx.memory_freed = true;
                let a = match answer {
                    ProduceAnswer::Partition(a) if action == Action::Ok => Some(a),
                    _ => None,
                };
                Self::complete_ok(&mut fx, f.batch, a);
            }
            Resolution::Resend => {
                let f = self.flights.get_mut(&id).expect("present");
                f.state = FlightState::Waiting(now + self.backoff.delay(f.attempts));
            }
            Resolution::Held if !self.transactional => {
                self.flights.get_mut(&id).expect("present").state = FlightState::Held;
            }
            Resolution::Held | Resolution::Failed | Resolution::Unknown | Resolution::OrderLost => {
                let f = self.flights.remove(&id).expect("present");
                self.acc.release(f.batch.reserved);
                fx.memory_freed = true;
                let err = match (resolution, action) {
                    (Resolution::OrderLost, _) => ProducerError::OrderLost {
                        topic_partition: tp.clone(),
                    },
                    (Resolution::Unknown, _) => ProducerError::DeliveryOutcomeUnknown {
                        topic_partition: tp.clone(),
                        reason,
                        transactional: self.transactional,
                    },
                    (_, Action::Fenced) => ProducerError::Fenced {
                        transactional_id: String::new(),
                        code,
                    },
                    (_, Action::Fatal) => ProducerError::Broker {
                        api: Api::Produce.name(),
                        code,
                        class: ErrorClass::Fatal,
                    },
                    _ => ProducerError::Broker {
                        api: Api::Produce.name(),
                        code,
                        class: ErrorClass::Abortable,
                    },
                };
                if err.is_fatal() {
                    fx.fatal.get_or_insert(err.clone());
                } else if self.transactional {
                    let needs_bump = self.seq.as_ref().is_some_and(|s| s.is_broken(&tp));
                    fx.txn_error.get_or_insert((err.clone(), needs_bump));
                }
                Self::complete_err(&mut fx, f.batch, &err);
            }
        }
        if !self.transactional {
            self.resolve_broken(&mut fx);
        }
        if let Some(err) = &fx.fatal {
            self.fatal.get_or_insert_with(|| Arc::new(err.clone()));
        }
        fx
    }

    /// Idempotent producer: once a broken partition has heard back about every batch, bump the epoch
    /// (once per break) and put its not-written batches back at the front of the queue.
    fn resolve_broken(&mut self, fx: &mut Effects<T>) {
        let Some(seq) = self.seq.as_mut() else {
            return;
        };
        for (tp, needs_bump) in seq.resolved_broken() {
            if needs_bump && !seq.bump_local_epoch() {
                fx.need_new_id = true;
                return;
            }
            let rq = seq.take_requeue(&tp);
            let batches: Vec<Batch<T>> = rq
                .batches
                .into_iter()
                .filter_map(|id| self.flights.remove(&id).map(|f| f.batch))
                .collect();
            tracing::info!(
                partition = %tp,
                batches = batches.len(),
                ids = %seq.ids(),
                "sequence gap: epoch bumped, unwritten batches re-sequenced"
            );
            self.acc.requeue_front(batches);
        }
    }

    /// After new ids arrive for an exhausted epoch: re-sequence what was held.
    pub(crate) fn resume_after_new_id(&mut self) -> Effects<T> {
        let mut fx = Effects::default();
        self.resolve_broken(&mut fx);
        fx
    }

    /// Fails what ran out of delivery time: batches never sent ("not written") and batches waiting for a
    /// retry (unknown if an attempt may have been written). Batches with a request out wait for its answer.
    pub(crate) fn handle_timeout(&mut self, now: Instant) -> Effects<T> {
        let mut fx = Effects::default();
        if let Some(cutoff) = now.checked_sub(self.delivery_timeout) {
            for batch in self.acc.take_created_before(cutoff) {
                self.acc.release(batch.reserved);
                fx.memory_freed = true;
                let err = ProducerError::Timeout {
                    op: "delivery (never sent)",
                    elapsed: now.saturating_duration_since(batch.created),
                    class: ErrorClass::Abortable,
                    last_error: None,
                };
                if self.transactional {
                    fx.txn_error.get_or_insert((err.clone(), false));
                }
                Self::complete_err(&mut fx, batch, &err);
            }
        }
        // Batches in flight exist only once ids do: with none yet, nothing has been sent to expire.
        let Some(seq) = self.seq.as_mut() else {
            return fx;
        };
        let expired: Vec<BatchId> = self
            .flights
            .iter()
            .filter(|(_, f)| matches!(f.state, FlightState::Waiting(_)) && now >= f.deadline)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            let Some(f) = self.flights.remove(&id) else {
                continue;
            };
            let tp = f.batch.partition.clone();
            let unknown = seq.give_up(&tp, id) == Resolution::Unknown;
            self.acc.release(f.batch.reserved);
            fx.memory_freed = true;
            let err = if unknown {
                ProducerError::DeliveryOutcomeUnknown {
                    topic_partition: tp.clone(),
                    reason: "delivery timeout while retrying".into(),
                    transactional: self.transactional,
                }
            } else {
                ProducerError::Timeout {
                    op: "delivery",
                    elapsed: now.saturating_duration_since(f.batch.created),
                    class: ErrorClass::Abortable,
                    last_error: None,
                }
            };
            if self.transactional {
                let needs_bump = seq.is_broken(&tp);
                fx.txn_error.get_or_insert((err.clone(), needs_bump));
            }
            Self::complete_err(&mut fx, f.batch, &err);
        }
        if !self.transactional {
            self.resolve_broken(&mut fx);
        }
        fx
    }

    /// When the driver should wake up next to send or expire something (absent answers).
    pub(crate) fn poll_timeout(&self, now: Instant) -> Option<Instant> {
        let linger = self.acc.next_ready_at(now);
        let expiry = self.acc.oldest_created().map(|c| c + self.delivery_timeout);
        let retries = self.flights.values().filter_map(|f| match f.state {
            FlightState::Waiting(t) => Some(t.min(f.deadline)),
            _ => None,
        });
        linger.into_iter().chain(expiry).chain(retries).min()
    }

    /// Makes every batch that exists now ready. Returns a marker for [`ProducerCore::flushed`].
    pub(crate) fn flush(&mut self) -> Option<BatchId> {
        self.acc.flush()
    }

    /// Whether every batch up to the flush marker has been completed.
    pub(crate) fn flushed(&self, marker: Option<BatchId>) -> bool {
        let Some(m) = marker else {
            return true;
        };
        !self.acc.holds_batch_up_to(m) && !self.flights.keys().any(|&id| id <= m)
    }

    /// Requests out whose answers have not come back.
    pub(crate) fn sending(&self) -> usize {
        self.flights
            .values()
            .filter(|f| f.state == FlightState::Sending)
            .count()
    }

    /// Nothing waits and nothing is in flight.
    #[cfg(test)]
    pub(crate) fn is_idle(&self) -> bool {
        self.acc.is_empty() && self.flights.is_empty()
    }

    /// Fails every batch that has no request out: on a transaction abort (nothing of it may be sent any
    /// more) or a fatal error. Batches with a request out are left for their answers, which the driver
    /// must wait for before ending the transaction.
    pub(crate) fn fail_unsent(&mut self, err: &ProducerError) -> Effects<T> {
        let mut fx = Effects::default();
        for batch in self.acc.take_all() {
            self.acc.release(batch.reserved);
            fx.memory_freed = true;
            Self::complete_err(&mut fx, batch, err);
        }
        let idle: Vec<BatchId> = self
            .flights
            .iter()
            .filter(|(_, f)| f.state != FlightState::Sending)
            .map(|(id, _)| *id)
            .collect();
        for id in idle {
            let f = self.flights.remove(&id).expect("present");
            if let Some(seq) = self.seq.as_mut() {
                seq.give_up(&f.batch.partition, id);
            }
            self.acc.release(f.batch.reserved);
            fx.memory_freed = true;
            Self::complete_err(&mut fx, f.batch, err);
        }
        // A retry given up may or may not be in the log: the next transaction cannot trust the
        // sequence, so the abort must bump the epoch.
        if self.transactional && self.seq.as_ref().is_some_and(Sequencer::any_broken) {
            fx.txn_error = Some((err.clone(), true));
        }
        fx
    }

    /// A task carrying batches died, so their answers will never come: fails every batch of
    /// `partition` (of every partition when `None`), whatever its state, then everything unsent, and
    /// makes the producer fatal with `err`. A batch with a request out may have been written; the error
    /// is fatal, so nobody will resend it under these sequences. An answer that still arrives for a batch
    /// failed here finds no flight and is ignored.
    pub(crate) fn abandon(
        &mut self,
        err: &ProducerError,
        partition: Option<&TopicPartition>,
    ) -> Effects<T> {
        let dead: Vec<BatchId> = self
            .flights
            .iter()
            .filter(|(_, f)| partition.is_none_or(|tp| f.batch.partition == *tp))
            .map(|(id, _)| *id)
            .collect();
        let mut fx = Effects::default();
        for id in dead {
            let f = self.flights.remove(&id).expect("present");
            if let Some(seq) = self.seq.as_mut() {
                seq.give_up(&f.batch.partition, id);
            }
            self.acc.release(f.batch.reserved);
            fx.memory_freed = true;
            Self::complete_err(&mut fx, f.batch, err);
        }
        let rest = self.fail_unsent(err);
        fx.completions.extend(rest.completions);
        fx.memory_freed |= rest.memory_freed;
        fx.fatal = Some(err.clone());
        self.set_fatal(err);
        fx
    }

    /// The producer is unusable: refuse appends from now on.
    pub(crate) fn set_fatal(&mut self, err: &ProducerError) {
        self.fatal.get_or_insert_with(|| Arc::new(err.clone()));
    }
}

#[cfg(test)]
#[path = "produce_core_tests.rs"]
mod tests;
