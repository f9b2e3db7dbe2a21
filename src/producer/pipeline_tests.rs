//! The pipelined produce path against a scripted two-broker cluster: several requests in flight per
//! partition, one request per broker, answers out of order across connections, a lost answer retried
//! while later batches are out, a connection reset with several requests on it, a leader change
//! mid-burst.
//!
//! The brokers are loopback sockets over one shared in-memory log per partition that applies Kafka's
//! idempotence rule as a model (a batch is appended only at the next expected sequence, a resend of
//! one of the last five appended batches is acknowledged with its first offset, anything else is
//! OUT_OF_ORDER_SEQUENCE_NUMBER; and, as Kafka does, a partition with no state for the producer yet
//! takes its first batch at whatever sequence it carries). The model stands in for no broker behaviour these tests claim: they
//! test that the producer's sequencing and resending keep every record exactly once and in order when
//! the answers come late, out of order, wrong or not at all. The real broker's side of the same story
//! is `protocol-tests/tests/producer.rs` (a leader killed during a burst on three nodes).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{
    BrokerId, InitProducerIdResponse, MetadataResponse, ProduceRequest, ProduceResponse,
    ProducerId, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{
    decode_request_header_from_buffer, Decodable, Encodable, HeaderVersion, StrBytes,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::timeout;

use crate::net::testing::api_versions;
use crate::net::{Client, ClientConfig};
use crate::producer::{Producer, ProducerConfig, ProducerRecord, RecordMetadata};
use crate::records::decode_batches;
use crate::wire::ErrorCode;

const TOPIC: &str = "t";
const PATIENCE: Duration = Duration::from_secs(20);
const TOPIC_ID: uuid::Uuid = uuid::Uuid::from_u128(0x5eed_f00d_0000_4000_8000_0000_0000_0017);

/// What a broker does with one Produce request (decided when it is read, carried out in order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// Apply and answer, after `delay`.
    Answer { delay: Duration },
    /// Apply, but answer REQUEST_TIMED_OUT for every partition: the write happened, its answer says
    /// nothing of it (the lost acknowledgement).
    WriteAnswerTimedOut,
    /// Apply, then close the connection without answering it or anything queued behind it.
    WriteThenReset,
    /// Do not apply; answer this code for every partition (a passing refusal such as
    /// NOT_ENOUGH_REPLICAS).
    Refuse(ErrorCode),
}

/// A Produce request as the broker read it: which node, and the how-many-th on that node.
#[derive(Debug, Clone)]
struct Seen {
    node: i32,
    nth: usize,
}

type Script = Box<dyn FnMut(&Seen, &mut Model) -> Plan + Send>;

#[derive(Debug, Default)]
struct PartitionLog {
    epoch: i16,
    next_seq: i32,
    /// `(base sequence, record count, base offset)` of every appended batch.
    batches: Vec<(i32, i32, i64)>,
    values: Vec<String>,
}

/// The cluster's state: who leads what, the log of every partition (shared, as if replicated), and
/// what was seen.
#[derive(Default)]
struct Model {
    leaders: HashMap<i32, i32>,
    logs: HashMap<i32, PartitionLog>,
    produce_seen: HashMap<i32, usize>,
    /// Per node: Produce requests read but not yet answered, now and at most.
    outstanding: HashMap<i32, (usize, usize)>,
    /// Requests that carried more than one partition.
    multi_partition_requests: usize,
    /// Per node, the partitions of each Produce in the order read.
    partitions_per_request: HashMap<i32, Vec<usize>>,
    /// The newest Produce the brokers advertise (12 unless a test asks for 13).
    produce_max: i16,
    /// Produce topics addressed by id (v13) and by name.
    topics_by_id: usize,
    topics_by_name: usize,
    /// Resends acknowledged as already written.
    duplicates: usize,
    out_of_order: usize,
    /// Per partition, the highest base sequence read so far, and how often a read went below it.
    highest_read: HashMap<i32, i32>,
    read_below_highest: usize,
}

impl Model {
    fn apply(&mut self, node: i32, partition: i32, records: Bytes) -> (ErrorCode, i64) {
        if self.leaders.get(&partition) != Some(&node) {
            return (ErrorCode::NotLeaderOrFollower, -1);
        }
        let Some(Ok(batch)) = decode_batches(records).next() else {
            return (ErrorCode::CorruptMessage, -1);
        };
        let (epoch, base, count) = (
            batch.producer_epoch(),
            batch.base_sequence(),
            batch.record_count(),
        );
        let log = self.logs.entry(partition).or_default();
        if log.batches.is_empty() {
            // No state for the producer here: Kafka takes the first batch at any sequence (the
            // state may have gone with the log's segments).
            log.epoch = epoch;
            log.next_seq = base;
        } else if epoch > log.epoch {
            log.epoch = epoch;
            log.next_seq = 0;
        }
        if base == log.next_seq {
            let offset = log.values.len() as i64;
            for r in batch.records().expect("records decode") {
                let r = r.expect("record decodes");
                let v = r.value.expect("every test record has a value");
                log.values.push(String::from_utf8_lossy(&v).into_owned());
            }
            log.batches.push((base, count, offset));
            log.next_seq = base + count;
            return (ErrorCode::None, offset);
        }
        let recent = log.batches.iter().rev().take(5);
        if let Some(&(_, _, offset)) = recent.clone().find(|b| (b.0, b.1) == (base, count)) {
            self.duplicates += 1;
            return (ErrorCode::None, offset);
        }
        self.out_of_order += 1;
        (ErrorCode::OutOfOrderSequenceNumber, -1)
    }
}

struct Cluster {
    addrs: Vec<SocketAddr>,
    model: Arc<Mutex<Model>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Two brokers (nodes 1 and 2); `leaders` maps each partition of topic `t` to its leader.
async fn cluster(leaders: &[(i32, i32)], script: Script) -> Cluster {
    cluster_speaking(leaders, script, 12).await
}

/// As [`cluster`], the brokers advertising Produce up to `produce_max`.
async fn cluster_speaking(leaders: &[(i32, i32)], script: Script, produce_max: i16) -> Cluster {
    let model = Arc::new(Mutex::new(Model {
        leaders: leaders.iter().copied().collect(),
        produce_max,
        ..Model::default()
    }));
    let script = Arc::new(Mutex::new(script));
    let mut listeners = Vec::new();
    let mut addrs = Vec::new();
    for _ in 0..2 {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        addrs.push(l.local_addr().unwrap());
        listeners.push(l);
    }
    let mut tasks = Vec::new();
    for (i, listener) in listeners.into_iter().enumerate() {
        let node = i as i32 + 1;
        let (addrs, model, script) = (addrs.clone(), model.clone(), script.clone());
        tasks.push(tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let (socket, _) = listener.accept().await.unwrap();
                connections.spawn(serve(
                    node,
                    socket,
                    addrs.clone(),
                    model.clone(),
                    script.clone(),
                ));
            }
        }));
    }
    Cluster {
        addrs,
        model,
        tasks,
    }
}

fn frame<M: Encodable + HeaderVersion>(correlation_id: i32, body: &M, version: i16) -> Bytes {
    let mut payload = BytesMut::new();
    ResponseHeader::default()
        .with_correlation_id(correlation_id)
        .encode(&mut payload, M::header_version(version))
        .unwrap();
    body.encode(&mut payload, version).unwrap();
    let mut out = BytesMut::with_capacity(4 + payload.len());
    out.put_i32(payload.len() as i32);
    out.put_slice(&payload);
    out.freeze()
}

/// One connection: a reader that takes requests off the socket as fast as the client sends them (so
/// the client's pipelining is visible as requests read and not yet answered), and an answerer that
/// handles them one at a time in the order read, as a Kafka broker does per connection.
async fn serve(
    node: i32,
    socket: TcpStream,
    addrs: Vec<SocketAddr>,
    model: Arc<Mutex<Model>>,
    script: Arc<Mutex<Script>>,
) {
    let (mut read, mut write) = socket.into_split();
    let (tx, mut rx) = mpsc::unbounded_channel::<(Bytes, Option<Plan>)>();
    let reader_model = model.clone();
    let reader = tokio::spawn(async move {
        let mut buf = BytesMut::new();
        loop {
            while buf.len() >= 4 {
                let len = i32::from_be_bytes(buf[..4].try_into().unwrap()) as usize;
                if buf.len() < 4 + len {
                    break;
                }
                buf.advance(4);
                let frame = buf.split_to(len).freeze();
                let mut peek = frame.clone();
                let header = decode_request_header_from_buffer(&mut peek).unwrap();
                let plan = (header.request_api_key == 0).then(|| {
                    let request = ProduceRequest::decode(&mut peek, header.request_api_version)
                        .expect("a Produce the client sent decodes");
                    let mut m = reader_model.lock().unwrap();
                    let nth = {
                        let n = m.produce_seen.entry(node).or_insert(0);
                        *n += 1;
                        *n
                    };
                    let o = m.outstanding.entry(node).or_insert((0, 0));
                    o.0 += 1;
                    o.1 = o.1.max(o.0);
                    let partitions: Vec<(i32, i32)> = request
                        .topic_data
                        .iter()
                        .flat_map(|t| t.partition_data.iter())
                        .map(|p| {
                            let seq = p
                                .records
                                .clone()
                                .and_then(|r| decode_batches(r).next())
                                .and_then(Result::ok)
                                .map_or(-1, |b| b.base_sequence());
                            (p.index, seq)
                        })
                        .collect();
                    if partitions.len() > 1 {
                        m.multi_partition_requests += 1;
                    }
                    m.partitions_per_request
                        .entry(node)
                        .or_default()
                        .push(partitions.len());
                    for &(p, seq) in &partitions {
                        let highest = m.highest_read.entry(p).or_insert(-1);
                        let below = seq < *highest;
                        *highest = (*highest).max(seq);
                        if below {
                            m.read_below_highest += 1;
                        }
                    }
                    let seen = Seen { node, nth };
                    (script.lock().unwrap())(&seen, &mut m)
                });
                if tx.send((frame, plan)).is_err() {
                    return;
                }
            }
            if read.read_buf(&mut buf).await.unwrap_or(0) == 0 {
                return;
            }
        }
    });
    while let Some((mut request, plan)) = rx.recv().await {
        let header = decode_request_header_from_buffer(&mut request).unwrap();
        let (id, version) = (header.correlation_id, header.request_api_version);
        let answer = match header.request_api_key {
            18 => frame_api_versions(id, version, model.lock().unwrap().produce_max),
            3 => frame(id, &metadata(&addrs, &model.lock().unwrap()), version),
            22 => frame(
                id,
                &InitProducerIdResponse::default()
                    .with_producer_id(ProducerId(7))
                    .with_producer_epoch(0),
                version,
            ),
            0 => {
                let plan = plan.expect("a plan for every Produce");
                if let Plan::Answer { delay } = plan {
                    tokio::time::sleep(delay).await;
                }
                let produce_request = ProduceRequest::decode(&mut request, version).unwrap();
                let response = {
                    let mut m = model.lock().unwrap();
                    m.outstanding.entry(node).or_default().0 -= 1;
                    produce(node, &produce_request, plan, &mut m)
                };
                if plan == Plan::WriteThenReset {
                    // Everything read behind this request is dropped unanswered and unapplied.
                    reader.abort();
                    return;
                }
                frame(id, &response, version)
            }
            other => panic!("the scripted broker does not serve api key {other}"),
        };
        if write.write_all(&answer).await.is_err() {
            return;
        }
    }
}

fn frame_api_versions(id: i32, version: i16, produce_max: i16) -> Bytes {
    let answer = api_versions(&[(0, 3, produce_max), (3, 1, 12), (18, 0, 3), (22, 0, 4)]);
    frame(id, &answer, version.min(3))
}

fn metadata(addrs: &[SocketAddr], m: &Model) -> MetadataResponse {
    let mut partitions: Vec<_> = m.leaders.iter().map(|(&p, &l)| (p, l)).collect();
    partitions.sort();
    MetadataResponse::default()
        .with_brokers(
            addrs
                .iter()
                .enumerate()
                .map(|(i, a)| {
                    MetadataResponseBroker::default()
                        .with_node_id(BrokerId(i as i32 + 1))
                        .with_host("127.0.0.1".into())
                        .with_port(i32::from(a.port()))
                })
                .collect(),
        )
        .with_controller_id(BrokerId(1))
        .with_topics(vec![MetadataResponseTopic::default()
            .with_name(Some(TopicName(StrBytes::from_static_str(TOPIC))))
            .with_topic_id(TOPIC_ID)
            .with_partitions(
                partitions
                    .into_iter()
                    .map(|(p, leader)| {
                        MetadataResponsePartition::default()
                            .with_partition_index(p)
                            .with_leader_id(BrokerId(leader))
                            .with_replica_nodes(vec![BrokerId(1), BrokerId(2)])
                            .with_isr_nodes(vec![BrokerId(1), BrokerId(2)])
                    })
                    .collect(),
            )])
}

fn produce(node: i32, request: &ProduceRequest, plan: Plan, m: &mut Model) -> ProduceResponse {
    let responses = request
        .topic_data
        .iter()
        .map(|t| {
            if t.topic_id == TOPIC_ID && t.name.0.is_empty() {
                m.topics_by_id += 1;
            } else {
                assert_eq!(&*t.name.0, TOPIC, "a topic this cluster has");
                m.topics_by_name += 1;
            }
            let partitions = t
                .partition_data
                .iter()
                .map(|p| {
                    let records = p.records.clone().unwrap_or_default();
                    let (code, offset) = match plan {
                        Plan::Refuse(code) => (code, -1),
                        _ => m.apply(node, p.index, records),
                    };
                    let code = match plan {
                        Plan::WriteAnswerTimedOut => ErrorCode::RequestTimedOut,
                        _ => code,
                    };
                    PartitionProduceResponse::default()
                        .with_index(p.index)
                        .with_error_code(code.code())
                        .with_base_offset(if code.is_ok() { offset } else { -1 })
                })
                .collect();
            TopicProduceResponse::default()
                .with_name(t.name.clone())
                .with_topic_id(t.topic_id)
                .with_partition_responses(partitions)
        })
        .collect();
    ProduceResponse::default().with_responses(responses)
}

fn config() -> ProducerConfig {
    ProducerConfig {
        // One record per batch, so a burst is many batches per partition and the window fills.
        batch_size: 1,
        linger: Duration::ZERO,
        retry_backoff: Duration::from_millis(5),
        retry_backoff_max: Duration::from_millis(20),
        delivery_timeout: Duration::from_secs(30),
        ..ProducerConfig::default()
    }
}

/// A script that answers every Produce after `delay`.
fn answer_after(delay: Duration) -> Script {
    Box::new(move |_, _| Plan::Answer { delay })
}

/// A client bootstrapped from the first broker.
async fn client(c: &Cluster) -> Client {
    Client::connect(ClientConfig::new(c.addrs[0].to_string()))
        .await
        .unwrap()
}

async fn producer(c: &Cluster) -> Producer {
    let client = client(c).await;
    Producer::new(client, config()).await.unwrap()
}

/// Sends `per_partition` records to each of `partitions` (value `"{p}-{i}"`), interleaved, and waits
/// for every outcome.
async fn burst(p: &Producer, partitions: &[i32], per_partition: usize) -> Vec<RecordMetadata> {
    let mut deliveries = Vec::new();
    for i in 0..per_partition {
        for &part in partitions {
            let r = ProducerRecord::new(TOPIC, Some(Bytes::from(format!("{part}-{i}"))))
                .partition(part);
            deliveries.push(p.send(r).await.unwrap());
        }
    }
    let mut out = Vec::new();
    for d in deliveries {
        out.push(
            timeout(PATIENCE, d)
                .await
                .expect("every record gets its outcome")
                .expect("every record is written"),
        );
    }
    out
}

/// Every partition's log holds each record exactly once, in the order sent, and every record's reported
/// offset is where the log holds it.
fn assert_exactly_once_in_order(
    c: &Cluster,
    acks: &[RecordMetadata],
    partitions: &[i32],
    n: usize,
) {
    let m = c.model.lock().unwrap();
    for &p in partitions {
        let expected: Vec<String> = (0..n).map(|i| format!("{p}-{i}")).collect();
        let log = m.logs.get(&p).map(|l| l.values.clone()).unwrap_or_default();
        assert_eq!(log, expected, "partition {p}: once each, in order");
    }
    for (k, a) in acks.iter().enumerate() {
        let (i, p) = (k / partitions.len(), partitions[k % partitions.len()]);
        assert_eq!(a.topic_partition.partition, p);
        assert_eq!(a.offset, Some(i as i64), "record {p}-{i}'s offset");
    }
}

/// Several requests per partition are in flight at once, one request per broker carries every
/// partition that broker leads, and answers that come back out of order across the two connections
/// (one broker slow, the other quick) still leave every record once and in order.
#[tokio::test]
async fn pipelined_burst_over_two_brokers_lands_once_in_order() {
    let slow = Duration::from_millis(20);
    let c = cluster(
        &[(0, 1), (1, 2), (2, 1), (3, 2)],
        Box::new(move |seen, _| Plan::Answer {
            delay: if seen.node == 1 { slow } else { Duration::ZERO },
        }),
    )
    .await;
    let p = producer(&c).await;
    let parts = [0, 1, 2, 3];
    let acks = burst(&p, &parts, 60).await;
    assert_exactly_once_in_order(&c, &acks, &parts, 60);
    let m = c.model.lock().unwrap();
    let (_, most) = m.outstanding[&1];
    assert!(
        most >= 2,
        "the slow broker never had two requests in flight at once (most {most})"
    );
    assert!(
        m.multi_partition_requests > 0,
        "no request carried two partitions"
    );
    assert_eq!(m.out_of_order, 0, "in-order pipelining never skips ahead");
    assert_eq!(
        m.read_below_highest, 0,
        "every partition's batches reached its broker in sequence order"
    );
}

/// The broker keeps no state for a new producer on a partition and takes its first batch at any
/// sequence. Its first request refused for a passing reason (NOT_ENOUGH_REPLICAS, nothing written),
/// the partition's second batch must not reach it first: it would be written at offset 0 and the first
/// batch after it. The producer sends one batch alone until one is acknowledged, then pipelines.
#[tokio::test]
async fn a_refused_first_batch_is_not_overtaken_while_the_broker_knows_no_producer() {
    let c = cluster(
        &[(0, 1), (1, 1)],
        Box::new(|seen, _| match seen.nth {
            1 => Plan::Refuse(ErrorCode::NotEnoughReplicas),
            _ => Plan::Answer {
                delay: Duration::from_millis(5),
            },
        }),
    )
    .await;
    let p = producer(&c).await;
    let parts = [0, 1];
    let acks = burst(&p, &parts, 40).await;
    assert_exactly_once_in_order(&c, &acks, &parts, 40);
    let m = c.model.lock().unwrap();
    assert!(
        m.outstanding[&1].1 >= 2,
        "once the broker knew the producer, requests were pipelined"
    );
}

/// Brokers that speak Produce v13 get the topic by id (KIP-516), and the answers, which name it by
/// id too, still reach the right batches; brokers that stop at v12 get the name.
#[tokio::test]
async fn produce_addresses_the_topic_by_id_where_the_broker_speaks_v13() {
    for (produce_max, by_id) in [(13, true), (12, false)] {
        let c =
            cluster_speaking(&[(0, 1), (1, 2)], answer_after(Duration::ZERO), produce_max).await;
        let p = producer(&c).await;
        let parts = [0, 1];
        let acks = burst(&p, &parts, 20).await;
        assert_exactly_once_in_order(&c, &acks, &parts, 20);
        let m = c.model.lock().unwrap();
        let (ids, names) = (m.topics_by_id, m.topics_by_name);
        if by_id {
            assert!(
                ids > 0 && names == 0,
                "v13: by id ({ids}), not by name ({names})"
            );
        } else {
            assert!(
                ids == 0 && names > 0,
                "v12: by name ({names}), not by id ({ids})"
            );
        }
    }
}

/// A broker that holds every Produce far past the delivery timeout (as a leader waiting for replicas
/// it cannot reach does, up to the request's timeout): the outcome is reported when the delivery
/// timeout runs out, as of unknown outcome, not when the request's own timeout would end it.
#[tokio::test]
async fn the_delivery_timeout_bounds_a_request_the_broker_holds() {
    let c = cluster(&[(0, 1)], answer_after(Duration::from_secs(60))).await;
    let client = client(&c).await;
    let delivery_timeout = Duration::from_secs(1);
    let p = Producer::new(
        client,
        ProducerConfig {
            delivery_timeout,
            request_timeout: Duration::from_secs(30),
            ..config()
        },
    )
    .await
    .unwrap();
    let began = tokio::time::Instant::now();
    let d = p
        .send(ProducerRecord::new(TOPIC, Some(Bytes::from("held"))).partition(0))
        .await
        .unwrap();
    let err = timeout(PATIENCE, d)
        .await
        .expect("an outcome within patience")
        .expect_err("never answered");
    let waited = began.elapsed();
    assert!(
        waited >= delivery_timeout && waited < delivery_timeout + Duration::from_secs(2),
        "reported at the delivery timeout, not the request timeout: {waited:?}"
    );
    assert!(
        err.is_outcome_unknown(),
        "it may have been written: {err:?}"
    );
}

/// A batch whose acknowledgement is lost (written, answered REQUEST_TIMED_OUT) is resent while the
/// batches behind it are in flight and written; the resend is acknowledged as the batch already
/// written, with its first offset, and nothing is written twice.
#[tokio::test]
async fn a_lost_answer_is_retried_while_later_batches_are_in_flight() {
    let c = cluster(
        &[(0, 1)],
        Box::new(|seen, _| match seen.nth {
            3 => Plan::WriteAnswerTimedOut,
            _ => Plan::Answer {
                delay: Duration::from_millis(5),
            },
        }),
    )
    .await;
    let p = producer(&c).await;
    let acks = burst(&p, &[0], 30).await;
    assert_exactly_once_in_order(&c, &acks, &[0], 30);
    let m = c.model.lock().unwrap();
    assert!(
        m.duplicates >= 1,
        "the lost answer's batch was never resent"
    );
    assert!(m.outstanding[&1].1 >= 2, "nothing was in flight behind it");
}

/// A connection reset with several requests on it: the one being handled was written, the ones
/// queued behind it were not, and none is answered. Every outcome is unknown, so all are resent, in
/// sequence order, over a new connection; the written one is acknowledged as a duplicate and the rest
/// are written once.
#[tokio::test]
async fn a_connection_reset_with_several_in_flight_resends_in_order() {
    let c = cluster(
        &[(0, 1), (1, 1)],
        Box::new(|seen, _| match seen.nth {
            4 => Plan::WriteThenReset,
            _ => Plan::Answer {
                delay: Duration::from_millis(10),
            },
        }),
    )
    .await;
    let p = producer(&c).await;
    let parts = [0, 1];
    let acks = burst(&p, &parts, 40).await;
    assert_exactly_once_in_order(&c, &acks, &parts, 40);
    let m = c.model.lock().unwrap();
    assert!(m.duplicates >= 1, "the written request was never resent");
    assert!(m.produce_seen[&1] > 4, "nothing was sent after the reset");
}

/// The leader of a partition moves from node 1 to node 2 in the middle of a burst: node 1 refuses
/// what it still gets (NOT_LEADER_OR_FOLLOWER, not written), the producer looks the leader up again and
/// resends to node 2 in sequence order, behind what node 1 had written.
#[tokio::test]
async fn a_leader_change_mid_burst_moves_the_rest_in_order() {
    let c = cluster(
        &[(0, 1), (1, 2)],
        Box::new(|seen, m| {
            if seen.node == 1 && seen.nth == 5 {
                m.leaders.insert(0, 2);
            }
            Plan::Answer {
                delay: Duration::from_millis(5),
            }
        }),
    )
    .await;
    let p = producer(&c).await;
    let parts = [0, 1];
    let acks = burst(&p, &parts, 40).await;
    assert_exactly_once_in_order(&c, &acks, &parts, 40);
    let m = c.model.lock().unwrap();
    assert!(
        m.produce_seen.get(&2).copied().unwrap_or(0) > 0,
        "nothing went to the new leader"
    );
    assert!(
        m.logs[&0].values.len() == 40 && m.produce_seen[&1] >= 5,
        "the move happened mid-burst"
    );
}

/// A broker answering slowly never has more than `max_in_flight` requests of the producer waiting on
/// it, however many partitions it leads: the batches behind them stay in the accumulator, where they
/// fill up and later share one request, instead of queueing at the broker as many small requests that
/// it must take one at a time on the connection.
#[tokio::test]
async fn a_busy_broker_gets_at_most_max_in_flight_requests_at_once() {
    let c = cluster(
        &[(0, 1), (1, 1), (2, 1), (3, 1), (4, 1), (5, 1)],
        answer_after(Duration::from_millis(20)),
    )
    .await;
    let p = producer(&c).await;
    let parts = [0, 1, 2, 3, 4, 5];
    // One record at a time with a turn for the driver after each, so every pass has one new batch to
    // give out: without the cap each would be a request of its own, five per partition in flight.
    let mut deliveries = Vec::new();
    for i in 0..40 {
        for &part in &parts {
            let r = ProducerRecord::new(TOPIC, Some(Bytes::from(format!("{part}-{i}"))))
                .partition(part);
            deliveries.push(p.send(r).await.unwrap());
            tokio::task::yield_now().await;
        }
    }
    let mut acks = Vec::new();
    for d in deliveries {
        acks.push(timeout(PATIENCE, d).await.unwrap().unwrap());
    }
    assert_exactly_once_in_order(&c, &acks, &parts, 40);
    let m = c.model.lock().unwrap();
    let (_, most) = m.outstanding[&1];
    let cap = config().max_in_flight;
    assert!(
        most <= cap,
        "{most} requests waited on the broker at once, more than max_in_flight {cap}"
    );
    assert!(most >= 2, "the requests were not pipelined (most {most})");
    assert!(
        m.produce_seen[&1] < 6 * 40,
        "every batch went in a request of its own"
    );
}

/// A busy broker with room for one more request gets one full request, not one batch of every ready
/// partition split into a full request and a remainder: with six partitions ready and four batches to
/// a request, the remainder would be a third of the requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_broker_with_room_for_one_request_gets_one_full_request() {
    let parts = [0, 1, 2, 3, 4, 5];
    let c = cluster(
        &parts.map(|p| (p, 1)),
        answer_after(Duration::from_millis(10)),
    )
    .await;
    let client = client(&c).await;
    // A record takes about 1 015 bytes (a 1 000-byte key), so two close a batch of about 2 090 and
    // four batches fill a request.
    let key = Bytes::from(vec![b'k'; 1000]);
    let settings = ProducerConfig {
        batch_size: 2 * 1040 + 61,
        max_request_size: 4 * 2150,
        linger: Duration::from_millis(5),
        ..config()
    };
    let p = Producer::new(client, settings).await.unwrap();
    let per_partition = 64;
    let mut deliveries = Vec::new();
    for i in 0..per_partition {
        for &part in &parts {
            let r = ProducerRecord::new(TOPIC, Some(Bytes::from(format!("{part}-{i}"))))
                .key(key.clone())
                .partition(part);
            deliveries.push(p.send(r).await.unwrap());
        }
    }
    let mut acks = Vec::new();
    for d in deliveries {
        acks.push(timeout(PATIENCE, d).await.unwrap().unwrap());
    }
    assert_exactly_once_in_order(&c, &acks, &parts, per_partition);
    let m = c.model.lock().unwrap();
    let shapes = &m.partitions_per_request[&1];
    assert_eq!(
        shapes.iter().sum::<usize>(),
        parts.len() * per_partition / 2
    );
    // The first requests go while the burst is still being appended, and the last ones carry what is
    // left; in between, the broker has room for one request at a time.
    let cap = config().max_in_flight;
    let middle = &shapes[cap.min(shapes.len())..shapes.len().saturating_sub(cap)];
    let short = middle.iter().filter(|&&n| n < 4).count();
    assert!(
        short <= 2,
        "{short} of the {} requests in the middle of the burst were not full: {shapes:?}",
        middle.len()
    );
}
