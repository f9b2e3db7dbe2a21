//! The requests the tool sends, each wrapped so that it routes through `net::Client` (leaders,
//! coordinators, retries) and fails with a [`CliError`] that says what was being done.
//!
//! Errors inside a response body are read here: codes that mean "moved" or "busy" go back to the
//! client's routing loop as a [`Verdict`], everything else ends the call with the code.
//!
//! # References
//! - ListOffsets (key 2; -2 earliest, -1 latest; `isolation_level` 1 answers the LSO, KIP-98)
//! - Fetch (key 1; topic ids from v13, KIP-516), OffsetFetch (key 9; `require_stable` v7, KIP-447;
//!   batched groups v8)
//! - KIP-664's DescribeProducers, ListTransactions, DescribeTransactions and the WriteTxnMarkers abort,
//!   and DescribeConfigs: through `snapfence::admin`, in its types
//! - DescribeGroups (key 15; classic groups' members), ConsumerGroupDescribe (key 69; KIP-848 groups'
//!   members), OffsetCommit (key 8; generation -1 and no member id: an empty group's admin commit)

use std::collections::BTreeMap;

use bytes::Bytes;
use kafka_protocol::messages::{
    fetch_request, list_offsets_request, offset_commit_request, offset_fetch_request, BrokerId,
    ConsumerGroupDescribeRequest, DescribeGroupsRequest, FetchRequest, GroupId, ListOffsetsRequest,
    OffsetCommitRequest, OffsetFetchRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use snapfence::admin::{self, AbortMarker};
use snapfence::net::{
    retry_action, CallOptions, Client, ClientConfig, NetError, Target, TopicMetadata, Verdict,
};
use snapfence::records::{AbortedTransaction, IsolationLevel};
use snapfence::ErrorCode;

use crate::error::CliError;

/// A connected client plus the bootstrap string, which every "unreachable" error repeats.
pub(crate) struct Cluster {
    pub client: Client,
    pub bootstrap: String,
}

/// A partition's offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Offsets {
    pub log_start: i64,
    pub high_watermark: i64,
    pub last_stable: i64,
}

/// One producer in DescribeProducers' answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProducerInfo {
    pub producer_id: i64,
    pub producer_epoch: i32,
    pub last_sequence: i32,
    pub last_timestamp: i64,
    pub coordinator_epoch: i32,
    /// -1 when the producer has no open transaction in the partition.
    pub txn_start_offset: i64,
}

impl ProducerInfo {
    pub fn has_open_transaction(&self) -> bool {
        self.txn_start_offset >= 0
    }
}

/// One entry of ListTransactions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listing {
    pub transactional_id: String,
    pub state: String,
    pub coordinator: i32,
}

/// DescribeTransactions' answer for one transactional id the coordinator knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TxnDescription {
    pub state: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub timeout_ms: i32,
    /// -1 when no transaction is in progress.
    pub start_time_ms: i64,
    /// The partitions the coordinator will write markers to.
    pub partitions: Vec<(String, i32)>,
}

/// A group's committed offset for one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Committed {
    /// -1 when nothing is committed.
    pub offset: i64,
    pub metadata: Option<String>,
    /// A transactional offset commit for this partition is waiting for its transaction to end
    /// (OffsetFetch with `require_stable` answered UNSTABLE_OFFSET_COMMIT).
    pub pending_transaction: bool,
}

/// One Fetch answer for one partition.
#[derive(Debug, Clone)]
pub(crate) struct Fetched {
    pub high_watermark: i64,
    pub last_stable: i64,
    pub log_start: i64,
    pub aborted: Vec<AbortedTransaction>,
    pub records: Bytes,
}

/// What a handler decided: a value, or an error code to report.
type Answer<T> = Result<T, (ErrorCode, Option<String>)>;

/// Reads a per-partition (or per-entry) error code: success → `value()`, "moved"/"busy" → the client
/// retries, anything else → the code.
fn verdict<T>(
    code: i16,
    message: Option<&StrBytes>,
    value: impl FnOnce() -> T,
) -> Verdict<Answer<T>> {
    let parsed = ErrorCode::from_code(code);
    if parsed.is_ok() {
        return Verdict::Done(Ok(value()));
    }
    Verdict::from_code(code, Err((parsed, message.map(|m| m.to_string()))))
}

/// A non-zero error code: "moved"/"busy" → the client retries, anything else → the code.
fn failure<T>(code: i16) -> Verdict<Answer<T>> {
    Verdict::from_code(code, Err((ErrorCode::from_code(code), None)))
}

impl From<&admin::ProducerState> for ProducerInfo {
    fn from(s: &admin::ProducerState) -> Self {
        ProducerInfo {
            producer_id: s.producer_id,
            producer_epoch: s.producer_epoch,
            last_sequence: s.last_sequence,
            last_timestamp: s.last_timestamp,
            coordinator_epoch: s.coordinator_epoch,
            txn_start_offset: s.txn_start_offset,
        }
    }
}

fn missing<T>(what: &str) -> Verdict<Answer<T>> {
    Verdict::Done(Err((
        ErrorCode::UnknownServerError,
        Some(format!("the answer does not mention {what}")),
    )))
}

/// Partitions per batched request: what `kafka-transactions.sh` uses, small enough that no broker
/// minds one request.
const BATCH: usize = 500;

/// A (topic, partition) pair.
pub(crate) type Tp = (String, i32);

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_owned()))
}

impl Cluster {
    /// Connects to the first reachable bootstrap address, logging in and using TLS as `security` says.
    pub async fn connect(
        bootstrap: &str,
        security: &crate::security::SecurityArgs,
    ) -> Result<Cluster, CliError> {
        let config = security.client_config(ClientConfig {
            client_id: "snapfence-cli".into(),
            ..ClientConfig::new(bootstrap)
        })?;
        let client = Client::connect(config)
            .await
            .map_err(|e| CliError::from_net("connect", bootstrap, e))?;
        Ok(Cluster {
            client,
            bootstrap: bootstrap.to_owned(),
        })
    }

    fn net(&self, what: impl Into<String>, e: NetError) -> CliError {
        CliError::from_net(what, &self.bootstrap, e)
    }

    /// Runs `call`, turning both the transport error and the answer's error code into a [`CliError`].
    async fn finish<T>(
        &self,
        what: impl Into<String>,
        result: Result<Answer<T>, NetError>,
    ) -> Result<T, CliError> {
        let what = what.into();
        match result {
            Ok(Ok(v)) => Ok(v),
            Ok(Err((code, message))) => Err(CliError::from_code(what, code, message.as_deref())),
            Err(e) => Err(self.net(what, e)),
        }
    }

    /// The topic's metadata. An unknown topic fails at once (the routing loop would retry it).
    pub async fn topic(&self, topic: &str) -> Result<TopicMetadata, CliError> {
        let metadata = self
            .client
            .metadata(&[topic])
            .await
            .map_err(|e| self.net(format!("read the metadata of {topic}"), e))?;
        let t = metadata
            .topics
            .get(topic)
            .ok_or_else(|| CliError::UnknownTopic {
                topic: topic.to_owned(),
            })?;
        match t.error {
            ErrorCode::None => Ok(t.clone()),
            ErrorCode::UnknownTopicOrPartition | ErrorCode::InvalidTopicException => {
                Err(CliError::UnknownTopic {
                    topic: topic.to_owned(),
                })
            }
            code => Err(CliError::from_code(
                format!("read the metadata of {topic}"),
                code,
                None,
            )),
        }
    }

    /// The topic's metadata, failing with the partition count when `partition` is not one of its partitions.
    pub async fn topic_with_partition(
        &self,
        topic: &str,
        partition: i32,
    ) -> Result<TopicMetadata, CliError> {
        let t = self.topic(topic).await?;
        check_partition(&t, partition)?;
        Ok(t)
    }

    /// Every topic in the cluster, internal ones included.
    pub async fn all_topics(&self) -> Result<Vec<TopicMetadata>, CliError> {
        let metadata = self
            .client
            .metadata_all()
            .await
            .map_err(|e| self.net("list the topics", e))?;
        Ok(metadata
            .topics
            .values()
            .filter(|t| t.error.is_ok())
            .cloned()
            .collect())
    }

    /// The broker ids in the cluster.
    pub async fn brokers(&self) -> Result<Vec<i32>, CliError> {
        let metadata = self
            .client
            .metadata(&[])
            .await
            .map_err(|e| self.net("list the brokers", e))?;
        Ok(metadata.brokers.keys().copied().collect())
    }

    /// Log start, high watermark and last stable offset of one partition (three ListOffsets).
    /// The LSO is read before the high watermark: both only grow, so the pair always has HW >= LSO.
    pub async fn offsets(&self, topic: &str, partition: i32) -> Result<Offsets, CliError> {
        let last_stable = self
            .list_offset(topic, partition, -1, IsolationLevel::ReadCommitted)
            .await?;
        Ok(Offsets {
            log_start: self
                .list_offset(topic, partition, -2, IsolationLevel::ReadUncommitted)
                .await?,
            high_watermark: self
                .list_offset(topic, partition, -1, IsolationLevel::ReadUncommitted)
                .await?,
            last_stable,
        })
    }

    /// ListOffsets for one partition: `timestamp` -2 is the log start, -1 the end (the high watermark at
    /// read_uncommitted, the LSO at read_committed).
    pub async fn list_offset(
        &self,
        topic: &str,
        partition: i32,
        timestamp: i64,
        isolation: IsolationLevel,
    ) -> Result<i64, CliError> {
        let options = CallOptions {
            // v2 brought isolation_level.
            min_version: Some(2),
            ..CallOptions::default()
        };
        let timeout_ms = self.timeout_ms();
        let result = self
            .client
            .call(
                Target::leader(topic, partition),
                &options,
                |_| {
                    ListOffsetsRequest::default()
                        .with_replica_id(BrokerId(-1))
                        .with_isolation_level(isolation.as_i8())
                        .with_timeout_ms(timeout_ms)
                        .with_topics(vec![list_offsets_request::ListOffsetsTopic::default()
                            .with_name(name(topic))
                            .with_partitions(vec![
                                list_offsets_request::ListOffsetsPartition::default()
                                    .with_partition_index(partition)
                                    .with_timestamp(timestamp),
                            ])])
                },
                |r, _| {
                    let p = r
                        .topics
                        .iter()
                        .filter(|t| t.name.0.as_str() == topic)
                        .flat_map(|t| t.partitions.iter())
                        .find(|p| p.partition_index == partition);
                    match p {
                        Some(p) => verdict(p.error_code, None, || p.offset),
                        None => missing("the partition"),
                    }
                },
            )
            .await;
        self.finish(format!("list offsets of {topic}/{partition}"), result)
            .await
    }

    /// Partitions grouped by the broker to ask: `on` when given, else each partition's leader as the
    /// cached metadata has it. Partitions without a known leader come back apart, for the routed path.
    fn by_broker(&self, partitions: &[Tp], on: Option<i32>) -> (BTreeMap<i32, Vec<Tp>>, Vec<Tp>) {
        let metadata = self.client.cached_metadata();
        let mut groups: BTreeMap<i32, Vec<Tp>> = BTreeMap::new();
        let mut apart = Vec::new();
        for (t, p) in partitions {
            match on.or_else(|| metadata.leader(t, *p).map(|l| l.node)) {
                Some(node) => groups.entry(node).or_default().push((t.clone(), *p)),
                None => apart.push((t.clone(), *p)),
            }
        }
        (groups, apart)
    }

    /// [`offsets`](Self::offsets) for many partitions of one topic: three ListOffsets per leader rather
    /// than three per partition. Partitions a leader answers for with a "moved" or "busy" code (or not
    /// at all) are asked again one by one through the routing loop. `tick(n)` reports progress.
    pub async fn offsets_many(
        &self,
        topic: &str,
        partitions: &[i32],
        mut tick: impl FnMut(usize),
    ) -> Result<BTreeMap<i32, Offsets>, CliError> {
        let keys: Vec<Tp> = partitions.iter().map(|p| (topic.to_owned(), *p)).collect();
        let (groups, mut apart) = self.by_broker(&keys, None);
        let mut out = BTreeMap::new();
        for (node, parts) in groups {
            for chunk in parts.chunks(BATCH) {
                let ps: Vec<i32> = chunk.iter().map(|(_, p)| *p).collect();
                let log_start = self
                    .list_offsets_on(node, topic, &ps, -2, IsolationLevel::ReadUncommitted)
                    .await?;
                // LSO before HW: both only grow, so every pair has HW >= LSO.
                let stable = self
                    .list_offsets_on(node, topic, &ps, -1, IsolationLevel::ReadCommitted)
                    .await?;
                let high = self
                    .list_offsets_on(node, topic, &ps, -1, IsolationLevel::ReadUncommitted)
                    .await?;
                let before = out.len();
                for p in ps {
                    match (log_start.get(&p), high.get(&p), stable.get(&p)) {
                        (Some(&log_start), Some(&high_watermark), Some(&last_stable)) => {
                            out.insert(
                                p,
                                Offsets {
                                    log_start,
                                    high_watermark,
                                    last_stable,
                                },
                            );
                        }
                        _ => apart.push((topic.to_owned(), p)),
                    }
                }
                tick(out.len() - before);
            }
        }
        for (_, p) in apart {
            out.insert(p, self.offsets(topic, p).await?);
            tick(1);
        }
        Ok(out)
    }

    /// One batched ListOffsets to broker `node`: the offsets of the partitions it answered for. Codes
    /// that mean "moved" or "busy" leave the partition out (the caller retries it routed); any other
    /// code fails.
    async fn list_offsets_on(
        &self,
        node: i32,
        topic: &str,
        partitions: &[i32],
        timestamp: i64,
        isolation: IsolationLevel,
    ) -> Result<BTreeMap<i32, i64>, CliError> {
        let options = CallOptions {
            min_version: Some(2),
            ..CallOptions::default()
        };
        let timeout_ms = self.timeout_ms();
        let (response, _) = self
            .client
            .call(
                Target::Broker(node),
                &options,
                |_| {
                    ListOffsetsRequest::default()
                        .with_replica_id(BrokerId(-1))
                        .with_isolation_level(isolation.as_i8())
                        .with_timeout_ms(timeout_ms)
                        .with_topics(vec![list_offsets_request::ListOffsetsTopic::default()
                            .with_name(name(topic))
                            .with_partitions(
                                partitions
                                    .iter()
                                    .map(|p| {
                                        list_offsets_request::ListOffsetsPartition::default()
                                            .with_partition_index(*p)
                                            .with_timestamp(timestamp)
                                    })
                                    .collect(),
                            )])
                },
                |r, v| Verdict::Done((r, v)),
            )
            .await
            .map_err(|e| self.net(format!("list offsets of {topic} on broker {node}"), e))?;
        let mut out = BTreeMap::new();
        for p in response
            .topics
            .iter()
            .filter(|t| t.name.0.as_str() == topic)
            .flat_map(|t| t.partitions.iter())
            .filter(|p| partitions.contains(&p.partition_index))
        {
            let code = ErrorCode::from_code(p.error_code);
            if code.is_ok() {
                out.insert(p.partition_index, p.offset);
            } else if retry_action(code).is_none() {
                return Err(CliError::from_code(
                    format!("list offsets of {topic}/{}", p.partition_index),
                    code,
                    None,
                ));
            }
        }
        Ok(out)
    }

    /// DescribeProducers for many partitions: one request per leader (or to `on`, a broker holding a
    /// replica of each), with partitions answered by a "moved" or "busy" code (or not at all) asked
    /// again one by one through the routing loop. `tick(n)` reports progress.
    pub async fn describe_producers_many(
        &self,
        partitions: &[Tp],
        on: Option<i32>,
        mut tick: impl FnMut(usize),
    ) -> Result<BTreeMap<Tp, Vec<ProducerInfo>>, CliError> {
        let (groups, mut apart) = self.by_broker(partitions, on);
        let mut out = BTreeMap::new();
        for (node, parts) in groups {
            for chunk in parts.chunks(BATCH) {
                let answered = admin::describe_producers_on(&self.client, node, chunk)
                    .await
                    .map_err(|e| self.net(format!("describe producers on broker {node}"), e))?;
                let before = out.len();
                for (key, result) in answered {
                    match result {
                        Ok(producers) => {
                            out.insert(key, producers.iter().map(ProducerInfo::from).collect());
                        }
                        // Moved or busy: asked again below, routed.
                        Err(e) if e.error_code().is_some_and(|c| retry_action(c).is_some()) => {}
                        Err(e) => {
                            return Err(self
                                .net(format!("describe the producers of {}/{}", key.0, key.1), e))
                        }
                    }
                }
                apart.extend(chunk.iter().filter(|k| !out.contains_key(*k)).cloned());
                tick(out.len() - before);
            }
        }
        for (t, p) in apart {
            let producers = self.describe_producers(on, &t, p).await?;
            out.insert((t, p), producers);
            tick(1);
        }
        Ok(out)
    }

    /// DescribeProducers for one partition, sent to its leader or (`on`) to a given replica.
    pub async fn describe_producers(
        &self,
        on: Option<i32>,
        topic: &str,
        partition: i32,
    ) -> Result<Vec<ProducerInfo>, CliError> {
        let producers = admin::describe_producers(&self.client, topic, partition, on)
            .await
            .map_err(|e| self.net(format!("describe the producers of {topic}/{partition}"), e))?;
        Ok(producers.iter().map(ProducerInfo::from).collect())
    }

    /// ListTransactions on every broker (each answers for the transactional ids it coordinates),
    /// filtered to `producer_ids`: which transactional id each producer id belongs to.
    pub async fn list_transactions(
        &self,
        producer_ids: &[i64],
    ) -> Result<BTreeMap<i64, Listing>, CliError> {
        if producer_ids.is_empty() {
            return Ok(BTreeMap::new());
        }
        let listed = admin::list_transactions(&self.client, producer_ids)
            .await
            .map_err(|e| self.net("list the transactions", e))?;
        Ok(listed
            .into_iter()
            .map(|(id, l)| {
                (
                    id,
                    Listing {
                        transactional_id: l.transactional_id,
                        state: l.state,
                        coordinator: l.coordinator,
                    },
                )
            })
            .collect())
    }

    /// DescribeTransactions of one transactional id at its coordinator; `None` when the coordinator does
    /// not know the id (TRANSACTIONAL_ID_NOT_FOUND).
    pub async fn describe_transaction(
        &self,
        transactional_id: &str,
    ) -> Result<Option<TxnDescription>, CliError> {
        let described = admin::describe_transaction(&self.client, transactional_id)
            .await
            .map_err(|e| self.net(format!("describe transactional id {transactional_id:?}"), e))?;
        Ok(described.map(|d| TxnDescription {
            state: d.state,
            producer_id: d.producer_id,
            producer_epoch: d.producer_epoch,
            timeout_ms: d.timeout_ms,
            start_time_ms: d.start_time_ms,
            partitions: d.partitions,
        }))
    }

    /// Writes an ABORT marker for `producer`'s open transaction in `topic`/`partition`, as the
    /// coordinator would have: WriteTxnMarkers to the partition leader.
    pub async fn write_abort_marker(
        &self,
        topic: &str,
        partition: i32,
        producer: &ProducerInfo,
    ) -> Result<(), CliError> {
        if i16::try_from(producer.producer_epoch).is_err() {
            return Err(CliError::Protocol {
                what: "abort".into(),
                detail: format!(
                    "producer epoch {} does not fit 16 bits",
                    producer.producer_epoch
                ),
            });
        }
        let marker = AbortMarker {
            producer_id: producer.producer_id,
            producer_epoch: producer.producer_epoch,
            coordinator_epoch: producer.coordinator_epoch,
        };
        admin::write_abort_marker(&self.client, topic, partition, marker)
            .await
            .map_err(|e| {
                self.net(
                    format!(
                        "abort the transaction of producer {} on {topic}/{partition}",
                        producer.producer_id
                    ),
                    e,
                )
            })
    }

    /// The member ids of a classic group, as its coordinator lists them (DescribeGroups).
    pub async fn group_members(&self, group: &str) -> Result<Vec<String>, CliError> {
        let result = self
            .client
            .call(
                Target::group(group),
                &CallOptions::default(),
                |_| {
                    DescribeGroupsRequest::default()
                        .with_groups(vec![GroupId(StrBytes::from_string(group.to_owned()))])
                },
                |r, _| {
                    let Some(g) = r.groups.iter().find(|g| g.group_id.0.as_str() == group) else {
                        return missing("the group");
                    };
                    verdict(g.error_code, g.error_message.as_ref(), || {
                        g.members.iter().map(|m| m.member_id.to_string()).collect()
                    })
                },
            )
            .await;
        self.finish(format!("describe group {group:?}"), result)
            .await
    }

    /// Every member of `group` the coordinator lists, whichever protocol the group speaks: a KIP-848
    /// consumer group's through ConsumerGroupDescribe, a classic group's through DescribeGroups. Each
    /// API answers GROUP_ID_NOT_FOUND (or, before DescribeGroups v6, state `Dead`) for a group of the
    /// other kind or none at all, which counts as no members; a broker that does not speak
    /// ConsumerGroupDescribe (before 3.7, or with the new protocol off) has no consumer groups to ask.
    pub async fn active_members(&self, group: &str) -> Result<Vec<String>, CliError> {
        let group_id = || GroupId(StrBytes::from_string(group.to_owned()));
        let consumer = self
            .client
            .call(
                Target::group(group),
                &CallOptions::default(),
                |_| ConsumerGroupDescribeRequest::default().with_group_ids(vec![group_id()]),
                |r, _| {
                    let Some(g) = r.groups.iter().find(|g| g.group_id.0.as_str() == group) else {
                        return missing("the group");
                    };
                    if ErrorCode::from_code(g.error_code) == ErrorCode::GroupIdNotFound {
                        return Verdict::Done(Ok(Vec::new()));
                    }
                    verdict(g.error_code, g.error_message.as_ref(), || {
                        g.members.iter().map(|m| m.member_id.to_string()).collect()
                    })
                },
            )
            .await;
        let mut members: Vec<String> = match consumer {
            Err(NetError::UnsupportedVersion { .. }) => Vec::new(),
            other => {
                self.finish(format!("describe consumer group {group:?}"), other)
                    .await?
            }
        };
        let classic = self
            .client
            .call(
                Target::group(group),
                &CallOptions::default(),
                |_| DescribeGroupsRequest::default().with_groups(vec![group_id()]),
                |r, _| {
                    let Some(g) = r.groups.iter().find(|g| g.group_id.0.as_str() == group) else {
                        return missing("the group");
                    };
                    if ErrorCode::from_code(g.error_code) == ErrorCode::GroupIdNotFound {
                        return Verdict::Done(Ok(Vec::new()));
                    }
                    verdict(g.error_code, g.error_message.as_ref(), || {
                        g.members.iter().map(|m| m.member_id.to_string()).collect()
                    })
                },
            )
            .await;
        let classic: Vec<String> = self
            .finish(format!("describe group {group:?}"), classic)
            .await?;
        for m in classic {
            if !members.contains(&m) {
                members.push(m);
            }
        }
        Ok(members)
    }

    /// Commits `offsets` (per topic, its partitions' offsets) for `group` as no member, in one
    /// OffsetCommit with generation -1 and an empty member id, as `kafka-consumer-groups.sh
    /// --reset-offsets` does. The coordinator accepts that
    /// only while the group has no members, for a classic group and a KIP-848 consumer group alike; a
    /// member that joined since it was checked makes it answer UNKNOWN_MEMBER_ID (or
    /// ILLEGAL_GENERATION, or REBALANCE_IN_PROGRESS), which comes back as [`CliError::GroupActive`].
    ///
    /// `snapfence::GroupMetadata` refuses a negative generation on purpose (it is a fencing token, and a
    /// flow must never commit without one), so the request is built here, where the tool is the only
    /// writer.
    pub async fn commit_as_no_member(
        &self,
        group: &str,
        offsets: &[(String, Vec<(i32, i64)>)],
    ) -> Result<(), CliError> {
        let options = CallOptions {
            // v2 is the oldest a Kafka 4 broker takes; v10 names topics by id only.
            min_version: Some(2),
            max_version: Some(9),
            ..CallOptions::default()
        };
        let result = self
            .client
            .call(
                Target::group(group),
                &options,
                |_| {
                    OffsetCommitRequest::default()
                        .with_group_id(GroupId(StrBytes::from_string(group.to_owned())))
                        .with_generation_id_or_member_epoch(-1)
                        .with_member_id(StrBytes::from_static_str(""))
                        .with_retention_time_ms(-1)
                        .with_topics(
                            offsets
                                .iter()
                                .map(|(topic, each)| {
                                    offset_commit_request::OffsetCommitRequestTopic::default()
                                        .with_name(name(topic))
                                        .with_partitions(
                                            each.iter()
                                                .map(|(p, o)| {
                                                    offset_commit_request::OffsetCommitRequestPartition::default()
                                                        .with_partition_index(*p)
                                                        .with_committed_offset(*o)
                                                        .with_committed_leader_epoch(-1)
                                                })
                                                .collect(),
                                        )
                                })
                                .collect(),
                        )
                },
                |r, _| {
                    let worst = r
                        .topics
                        .iter()
                        .flat_map(|t| t.partitions.iter())
                        .map(|p| p.error_code)
                        .find(|c| *c != 0)
                        .unwrap_or(0);
                    verdict(worst, None, || ())
                },
            )
            .await;
        match self
            .finish(format!("commit the offsets of group {group:?}"), result)
            .await
        {
            Err(CliError::Broker { source, .. })
                if source.error_code().is_some_and(|c| {
                    matches!(
                        c,
                        ErrorCode::UnknownMemberId
                            | ErrorCode::IllegalGeneration
                            | ErrorCode::RebalanceInProgress
                            | ErrorCode::StaleMemberEpoch
                            | ErrorCode::FencedMemberEpoch
                    )
                }) =>
            {
                Err(CliError::GroupActive {
                    group: group.to_owned(),
                    members: Vec::new(),
                })
            }
            other => other,
        }
    }

    /// One setting of one broker (DescribeConfigs), `None` when the broker does not report it.
    pub async fn broker_config(&self, broker: i32, name: &str) -> Result<Option<String>, CliError> {
        let mut configs = admin::describe_configs(
            &self.client,
            &admin::ConfigResource::Broker(broker),
            &[name],
        )
        .await
        .map_err(|e| self.net(format!("read {name} of broker {broker}"), e))?;
        Ok(configs.remove(name).and_then(|e| e.value))
    }

    /// A group's committed offsets for `partitions` of `topic`, and which of them wait for a
    /// transaction (two OffsetFetch: one plain, one with `require_stable`).
    pub async fn committed(
        &self,
        group: &str,
        topic: &str,
        partitions: &[i32],
    ) -> Result<BTreeMap<i32, Committed>, CliError> {
        let plain = self.offset_fetch(group, topic, partitions, false).await?;
        let stable = self.offset_fetch(group, topic, partitions, true).await;
        let mut out = BTreeMap::new();
        for (partition, (offset, metadata, code)) in plain {
            if !code.is_ok() {
                return Err(CliError::from_code(
                    format!("read the offsets of group {group:?} for {topic}/{partition}"),
                    code,
                    None,
                ));
            }
            let pending = match &stable {
                Ok(s) => s
                    .get(&partition)
                    .is_some_and(|(_, _, c)| *c == ErrorCode::UnstableOffsetCommit),
                // Brokers before KIP-447 cannot say; the plain answer is still right.
                Err(_) => false,
            };
            out.insert(
                partition,
                Committed {
                    offset,
                    metadata,
                    pending_transaction: pending,
                },
            );
        }
        Ok(out)
    }

    /// One OffsetFetch; per partition the offset, metadata and error code. A group-level
    /// UNSTABLE_OFFSET_COMMIT is spread to every partition.
    async fn offset_fetch(
        &self,
        group: &str,
        topic: &str,
        partitions: &[i32],
        require_stable: bool,
    ) -> Result<BTreeMap<i32, (i64, Option<String>, ErrorCode)>, CliError> {
        type Row = (i64, Option<String>, ErrorCode);
        let options = CallOptions {
            min_version: require_stable.then_some(7),
            ..CallOptions::default()
        };
        let spread = |code: ErrorCode| -> BTreeMap<i32, Row> {
            partitions.iter().map(|p| (*p, (-1, None, code))).collect()
        };
        let result = self
            .client
            .call(
                Target::group(group),
                &options,
                |version| {
                    let request = OffsetFetchRequest::default().with_require_stable(require_stable);
                    if version >= 8 {
                        request.with_groups(vec![
                            offset_fetch_request::OffsetFetchRequestGroup::default()
                                .with_group_id(GroupId(StrBytes::from_string(group.to_owned())))
                                .with_topics(Some(vec![
                                    offset_fetch_request::OffsetFetchRequestTopics::default()
                                        .with_name(name(topic))
                                        .with_partition_indexes(partitions.to_vec()),
                                ])),
                        ])
                    } else {
                        request
                            .with_group_id(GroupId(StrBytes::from_string(group.to_owned())))
                            .with_topics(Some(vec![
                                offset_fetch_request::OffsetFetchRequestTopic::default()
                                    .with_name(name(topic))
                                    .with_partition_indexes(partitions.to_vec()),
                            ]))
                    }
                },
                |r, version| {
                    // v8+ nests topics under groups; older versions answer for one group. The two
                    // answers are different types with the same partition fields.
                    macro_rules! rows_of {
                        ($topics:expr) => {
                            $topics
                                .iter()
                                .filter(|t| t.name.0.as_str() == topic)
                                .flat_map(|t| t.partitions.iter())
                                .map(|p| {
                                    let row = (
                                        p.committed_offset,
                                        p.metadata.as_ref().map(|m| m.to_string()),
                                        ErrorCode::from_code(p.error_code),
                                    );
                                    (p.partition_index, row)
                                })
                                .collect()
                        };
                    }
                    let (code, rows): (i16, Vec<(i32, Row)>) = if version >= 8 {
                        let Some(g) = r.groups.iter().find(|g| g.group_id.0.as_str() == group)
                        else {
                            return missing("the group");
                        };
                        (g.error_code, rows_of!(g.topics))
                    } else {
                        (r.error_code, rows_of!(r.topics))
                    };
                    // UNSTABLE_OFFSET_COMMIT is retriable, but here it is the answer, not a reason to
                    // wait: the point is to see it.
                    if ErrorCode::from_code(code) == ErrorCode::UnstableOffsetCommit {
                        return Verdict::Done(Ok(spread(ErrorCode::UnstableOffsetCommit)));
                    }
                    verdict(code, None, || rows.into_iter().collect())
                },
            )
            .await;
        self.finish(
            format!("read the committed offsets of group {group:?}"),
            result,
        )
        .await
    }

    /// One Fetch of one partition from `offset`, at `isolation`, up to `max_bytes`.
    pub async fn fetch(
        &self,
        topic: &TopicMetadata,
        partition: i32,
        offset: i64,
        isolation: IsolationLevel,
        max_bytes: i32,
    ) -> Result<Fetched, CliError> {
        let topic_name = topic.name.as_str();
        let topic_id = uuid::Uuid::from_bytes(topic.id.0);
        let options = CallOptions {
            // Topic ids from v13 need a known id; fall back to names when the broker gave none.
            max_version: topic.id.is_zero().then_some(12),
            ..CallOptions::default()
        };
        let result = self
            .client
            .call(
                Target::leader(topic_name, partition),
                &options,
                |version| {
                    let fetch_topic = fetch_request::FetchTopic::default().with_partitions(vec![
                        fetch_request::FetchPartition::default()
                            .with_partition(partition)
                            .with_fetch_offset(offset)
                            .with_partition_max_bytes(max_bytes),
                    ]);
                    let fetch_topic = if version >= 13 {
                        fetch_topic.with_topic_id(topic_id)
                    } else {
                        fetch_topic.with_topic(name(topic_name))
                    };
                    FetchRequest::default()
                        .with_max_wait_ms(100)
                        .with_min_bytes(1)
                        .with_max_bytes(max_bytes)
                        .with_isolation_level(isolation.as_i8())
                        .with_topics(vec![fetch_topic])
                },
                |r, version| {
                    if !ErrorCode::from_code(r.error_code).is_ok() {
                        return failure(r.error_code);
                    }
                    let p = r
                        .responses
                        .iter()
                        .filter(|t| {
                            if version >= 13 {
                                t.topic_id == topic_id
                            } else {
                                t.topic.0.as_str() == topic_name
                            }
                        })
                        .flat_map(|t| t.partitions.iter())
                        .find(|p| p.partition_index == partition);
                    let Some(p) = p else {
                        return missing("the partition");
                    };
                    verdict(p.error_code, None, || Fetched {
                        high_watermark: p.high_watermark,
                        last_stable: p.last_stable_offset,
                        log_start: p.log_start_offset,
                        aborted: p
                            .aborted_transactions
                            .iter()
                            .flatten()
                            .map(|a| AbortedTransaction {
                                producer_id: a.producer_id.0,
                                first_offset: a.first_offset,
                            })
                            .collect(),
                        records: p.records.clone().unwrap_or_default(),
                    })
                },
            )
            .await;
        self.finish(
            format!("fetch {topic_name}/{partition} from offset {offset}"),
            result,
        )
        .await
    }

    fn timeout_ms(&self) -> i32 {
        let t = self.client.config().request_timeout.as_millis() / 2;
        t.min(i32::MAX as u128) as i32
    }
}

/// `Ok` when `partition` is one of `topic`'s partitions; otherwise the error that names how many it has.
pub(crate) fn check_partition(topic: &TopicMetadata, partition: i32) -> Result<(), CliError> {
    if topic.partitions.contains_key(&partition) {
        return Ok(());
    }
    Err(CliError::UnknownPartition {
        topic: topic.name.clone(),
        partition,
        count: topic.partitions.len(),
    })
}
