//! The KIP-664 requests for finding and ending hanging transactions: which producers hold a
//! partition's transaction open, which transactional id each belongs to, what its coordinator says
//! about it, and the ABORT marker an operator writes when no coordinator ever will.
//!
//! These are the building blocks of `snapfence find-hanging` (and of `kafka-transactions.sh
//! find-hanging`); the search itself (which candidates count as hanging) is the caller's.
//!
//! # References
//! - KIP-664: DescribeProducers (key 61), DescribeTransactions (key 65), ListTransactions (key 66),
//!   and the abort through WriteTxnMarkers (key 27)
//! - KIP-98 (markers, the last stable offset)

use std::collections::BTreeMap;
use std::sync::Arc;

use kafka_protocol::messages::describe_producers_request::TopicRequest;
use kafka_protocol::messages::describe_producers_response::PartitionResponse;
use kafka_protocol::messages::write_txn_markers_request::{
    WritableTxnMarker, WritableTxnMarkerTopic,
};
use kafka_protocol::messages::{
    DescribeProducersRequest, DescribeTransactionsRequest, ListTransactionsRequest, ProducerId,
    TopicName, TransactionalId, WriteTxnMarkersRequest,
};
use kafka_protocol::protocol::StrBytes;

use crate::net::{CallOptions, Client, NetError, Target, Verdict};
use crate::ErrorCode;

/// One producer a partition leader (or replica) tracks, as DescribeProducers reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProducerState {
    /// The producer id.
    pub producer_id: i64,
    /// Its epoch.
    pub producer_epoch: i32,
    /// The last sequence number it wrote.
    pub last_sequence: i32,
    /// The timestamp (ms) of its last write.
    pub last_timestamp: i64,
    /// The coordinator epoch of the last marker written for it; -1 when none was.
    pub coordinator_epoch: i32,
    /// The first offset of its open transaction in the partition; -1 when none is open.
    pub txn_start_offset: i64,
}

impl ProducerState {
    /// Whether the producer has a transaction open in the partition.
    pub fn has_open_transaction(&self) -> bool {
        self.txn_start_offset >= 0
    }

    /// The marker that would abort this producer's open transaction.
    pub fn abort_marker(&self) -> AbortMarker {
        AbortMarker {
            producer_id: self.producer_id,
            producer_epoch: self.producer_epoch,
            coordinator_epoch: self.coordinator_epoch,
        }
    }
}

/// One transactional id a coordinator lists (ListTransactions).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TransactionListing {
    /// The transactional id.
    pub transactional_id: String,
    /// The producer id currently bound to it.
    pub producer_id: i64,
    /// The coordinator's state name (`Ongoing`, `PrepareCommit`, `CompleteAbort`, ...).
    pub state: String,
    /// The broker that listed it: its transaction coordinator.
    pub coordinator: i32,
}

/// A coordinator's description of one transactional id (DescribeTransactions).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TransactionDescription {
    /// The coordinator's state name.
    pub state: String,
    /// The producer id.
    pub producer_id: i64,
    /// The producer epoch.
    pub producer_epoch: i16,
    /// The transaction timeout (ms).
    pub timeout_ms: i32,
    /// When the current transaction started (ms); -1 when none is in progress.
    pub start_time_ms: i64,
    /// The partitions the coordinator will write markers to, as `(topic, partition)`.
    pub partitions: Vec<(String, i32)>,
}

/// Who wrote the transaction an ABORT marker ends: taken from the partition's [`ProducerState`]
/// (see [`ProducerState::abort_marker`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortMarker {
    /// The producer id.
    pub producer_id: i64,
    /// The producer epoch; must fit 16 bits.
    pub producer_epoch: i32,
    /// The coordinator epoch of the last marker for this producer (-1 when none was written).
    pub coordinator_epoch: i32,
}

/// The outcome for one partition of a batched DescribeProducers.
pub type PartitionProducers = Result<Vec<ProducerState>, NetError>;

fn topic_name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_owned()))
}

fn producers_of(p: &PartitionResponse) -> Vec<ProducerState> {
    p.active_producers
        .iter()
        .map(|s| ProducerState {
            producer_id: s.producer_id.0,
            producer_epoch: s.producer_epoch,
            last_sequence: s.last_sequence,
            last_timestamp: s.last_timestamp,
            coordinator_epoch: s.coordinator_epoch,
            txn_start_offset: s.current_txn_start_offset,
        })
        .collect()
}

fn missing<T>(what: &str, context: &str) -> Verdict<Result<T, NetError>> {
    Verdict::Done(Err(NetError::broker(
        ErrorCode::UnknownServerError,
        Some(&format!("the answer does not mention {what}")),
        context,
    )))
}

/// Reads an entry's error code: success → `value()`; "moved" or "busy" → the routing loop retries;
/// anything else ends the call with the code.
fn verdict<T>(
    code: i16,
    message: Option<&str>,
    context: &str,
    value: impl FnOnce() -> T,
) -> Verdict<Result<T, NetError>> {
    let parsed = ErrorCode::from_code(code);
    if parsed.is_ok() {
        return Verdict::Done(Ok(value()));
    }
    Verdict::from_code(code, Err(NetError::broker(parsed, message, context)))
}

/// The producers of `topic`/`partition`, asked of its leader (`broker` = `None`) or of the replica on
/// `broker` (followers answer too, which is how a replica's own view is checked).
///
/// Cancel-safe: a read only.
///
/// ```no_run
/// # async fn run(client: &snapfence::Client) -> Result<(), snapfence::NetError> {
/// let open: Vec<_> = snapfence::admin::describe_producers(client, "events", 0, None)
///     .await?
///     .into_iter()
///     .filter(|p| p.has_open_transaction())
///     .collect();
/// # let _ = open;
/// # Ok(())
/// # }
/// ```
pub async fn describe_producers(
    client: &Client,
    topic: &str,
    partition: i32,
    broker: Option<i32>,
) -> Result<Vec<ProducerState>, NetError> {
    let context = format!("describe the producers of {topic}/{partition}");
    let target = match broker {
        Some(b) => Target::Broker(b),
        None => Target::leader(topic, partition),
    };
    client
        .call(
            target,
            &CallOptions::default(),
            |_| {
                DescribeProducersRequest::default().with_topics(vec![TopicRequest::default()
                    .with_name(topic_name(topic))
                    .with_partition_indexes(vec![partition])])
            },
            |r, _| {
                let p = r
                    .topics
                    .iter()
                    .filter(|t| t.name.0.as_str() == topic)
                    .flat_map(|t| t.partitions.iter())
                    .find(|p| p.partition_index == partition);
                let Some(p) = p else {
                    return missing("the partition", &context);
                };
                verdict(p.error_code, p.error_message.as_deref(), &context, || {
                    producers_of(p)
                })
            },
        )
        .await?
}

/// One DescribeProducers to `broker` for many partitions (transport failures are retried; codes in the
/// answer are not): each partition the broker answered for maps to its producers or to the error code
/// it answered with.
/// Partitions the answer leaves out are missing from the map; a caller retries those, and those with
/// a retriable code, one by one with [`describe_producers`].
///
/// Cancel-safe: a read only.
pub async fn describe_producers_on(
    client: &Client,
    broker: i32,
    partitions: &[(String, i32)],
) -> Result<BTreeMap<(String, i32), PartitionProducers>, NetError> {
    let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for (t, p) in partitions {
        by_topic.entry(t.as_str()).or_default().push(*p);
    }
    let (response, _) = client
        .send(Target::Broker(broker), |_| {
            DescribeProducersRequest::default().with_topics(
                by_topic
                    .iter()
                    .map(|(t, ps)| {
                        TopicRequest::default()
                            .with_name(topic_name(t))
                            .with_partition_indexes(ps.clone())
                    })
                    .collect(),
            )
        })
        .await?;
    let mut out = BTreeMap::new();
    for t in &response.topics {
        for p in &t.partitions {
            let key = (t.name.0.to_string(), p.partition_index);
            if !partitions.contains(&key) {
                continue;
            }
            let code = ErrorCode::from_code(p.error_code);
            let value = if code.is_ok() {
                Ok(producers_of(p))
            } else {
                Err(NetError::broker(
                    code,
                    p.error_message.as_deref(),
                    format!(
                        "describe the producers of {}/{} on broker {broker}",
                        key.0, key.1
                    ),
                ))
            };
            out.insert(key, value);
        }
    }
    Ok(out)
}

/// ListTransactions on every broker (each lists the transactional ids it coordinates), filtered to
/// `producer_ids` (empty: every transaction), keyed by producer id.
///
/// Cancel-safe: a read only.
pub async fn list_transactions(
    client: &Client,
    producer_ids: &[i64],
) -> Result<BTreeMap<i64, TransactionListing>, NetError> {
    let brokers: Vec<i32> = client
        .metadata(&[])
        .await?
        .brokers
        .keys()
        .copied()
        .collect();
    let filter: Vec<ProducerId> = producer_ids.iter().map(|p| ProducerId(*p)).collect();
    let mut out = BTreeMap::new();
    for broker in brokers {
        let context = format!("list the transactions on broker {broker}");
        let listed = client
            .call(
                Target::Broker(broker),
                &CallOptions::default(),
                |_| {
                    ListTransactionsRequest::default()
                        .with_producer_id_filters(filter.clone())
                        .with_duration_filter(-1)
                },
                |r, _| {
                    verdict(r.error_code, None, &context, || {
                        r.transaction_states
                            .iter()
                            .map(|s| TransactionListing {
                                transactional_id: s.transactional_id.0.to_string(),
                                producer_id: s.producer_id.0,
                                state: s.transaction_state.to_string(),
                                coordinator: broker,
                            })
                            .collect::<Vec<_>>()
                    })
                },
            )
            .await??;
        for listing in listed {
            // A broker may answer with more than was asked for; only the filter counts.
            if producer_ids.is_empty() || producer_ids.contains(&listing.producer_id) {
                out.insert(listing.producer_id, listing);
            }
        }
    }
    Ok(out)
}

/// DescribeTransactions of `transactional_id` at its coordinator; `None` when the coordinator does not
/// know the id (TRANSACTIONAL_ID_NOT_FOUND).
///
/// Cancel-safe: a read only.
pub async fn describe_transaction(
    client: &Client,
    transactional_id: &str,
) -> Result<Option<TransactionDescription>, NetError> {
    let context = format!("describe transactional id {transactional_id:?}");
    let key: Arc<str> = Arc::from(transactional_id);
    client
        .call(
            Target::transaction(key),
            &CallOptions::default(),
            |_| {
                DescribeTransactionsRequest::default().with_transactional_ids(vec![
                    TransactionalId(StrBytes::from_string(transactional_id.to_owned())),
                ])
            },
            |r, _| {
                let Some(s) = r
                    .transaction_states
                    .iter()
                    .find(|s| s.transactional_id.0.as_str() == transactional_id)
                else {
                    return missing("the transactional id", &context);
                };
                if ErrorCode::from_code(s.error_code) == ErrorCode::TransactionalIdNotFound {
                    return Verdict::Done(Ok(None));
                }
                verdict(s.error_code, None, &context, || {
                    Some(TransactionDescription {
                        state: s.transaction_state.to_string(),
                        producer_id: s.producer_id.0,
                        producer_epoch: s.producer_epoch,
                        timeout_ms: s.transaction_timeout_ms,
                        start_time_ms: s.transaction_start_time_ms,
                        partitions: s
                            .topics
                            .iter()
                            .flat_map(|t| t.partitions.iter().map(|p| (t.topic.0.to_string(), *p)))
                            .collect(),
                    })
                })
            },
        )
        .await?
}

/// Writes an ABORT marker for `marker`'s open transaction in `topic`/`partition`, as its coordinator
/// would have: WriteTxnMarkers to the partition leader. Check first, at the leader, that the same
/// transaction is still open ([`describe_producers`]): a marker for a transaction that has moved on is
/// not harmless.
///
/// Not cancel-safe in effect: dropping the future may leave the marker written.
pub async fn write_abort_marker(
    client: &Client,
    topic: &str,
    partition: i32,
    marker: AbortMarker,
) -> Result<(), NetError> {
    let context = format!(
        "abort the transaction of producer {} on {topic}/{partition}",
        marker.producer_id
    );
    let epoch = i16::try_from(marker.producer_epoch).map_err(|_| {
        NetError::Config(format!(
            "{context}: producer epoch {} does not fit 16 bits",
            marker.producer_epoch
        ))
    })?;
    // A transaction that hung before its producer's first marker has coordinator epoch -1 in the
    // leader's producer state; any marker epoch >= -1 passes the leader's fencing check, and 0 is the
    // lowest a real coordinator could have written.
    let coordinator_epoch = marker.coordinator_epoch.max(0);
    client
        .call(
            Target::leader(topic, partition),
            &CallOptions::default(),
            |_| {
                WriteTxnMarkersRequest::default().with_markers(vec![WritableTxnMarker::default()
                    .with_producer_id(ProducerId(marker.producer_id))
                    .with_producer_epoch(epoch)
                    .with_transaction_result(false)
                    .with_coordinator_epoch(coordinator_epoch)
                    .with_topics(vec![WritableTxnMarkerTopic::default()
                        .with_name(topic_name(topic))
                        .with_partition_indexes(vec![partition])])])
            },
            |r, _| {
                let p = r
                    .markers
                    .iter()
                    .filter(|m| m.producer_id.0 == marker.producer_id)
                    .flat_map(|m| m.topics.iter())
                    .filter(|t| t.name.0.as_str() == topic)
                    .flat_map(|t| t.partitions.iter())
                    .find(|p| p.partition_index == partition);
                match p {
                    Some(p) => verdict(p.error_code, None, &context, || ()),
                    None => missing("the partition", &context),
                }
            },
        )
        .await?
}
