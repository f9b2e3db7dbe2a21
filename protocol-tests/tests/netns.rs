//! Broker-to-broker network partitions: three Kafka 4.x nodes, each in a network namespace of its own
//! (`ClusterSpec::with_isolated_brokers`), clients in the root namespace reaching every broker through
//! the fixture's forwarders. The partition leader is cut off from the other two brokers (silently: its
//! packets to them are dropped both ways) while snapfence's idempotent producer writes; then the cut is
//! healed and everything is read back at read_committed.
//!
//! Needs root and `ip`; without them the tests print why and return (CI and the development machine
//! run them as root).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{MetadataRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use protocol_tests::{unique, ClusterSpec, FixtureError, KafkaCluster};
use snapfence::net::{CallOptions, Client, ClientConfig, Target, Verdict};
use snapfence::producer::{Producer, ProducerConfig, ProducerError, ProducerRecord};
use snapfence::records::{visible_in, IsolationLevel};
use snapfence::ErrorCode;

/// The tests of this binary each start a cluster; one at a time keeps their timing sane on two cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A cluster with isolated brokers, or None (with the reason printed) where namespaces cannot be made
/// or `SNAPFENCE_BOOTSTRAP` names an external cluster.
async fn isolated(spec: ClusterSpec) -> Option<KafkaCluster> {
    if std::env::var("SNAPFENCE_BOOTSTRAP").is_ok_and(|b| !b.trim().is_empty()) {
        eprintln!(
            "skipped: SNAPFENCE_BOOTSTRAP names an external cluster; these tests need their own"
        );
        return None;
    }
    let started = tokio::task::spawn_blocking(move || KafkaCluster::start(&spec))
        .await
        .expect("start thread");
    match started {
        Ok(k) => Some(k),
        Err(e @ FixtureError::NetnsUnavailable { .. }) => {
            eprintln!("skipped: {e}");
            None
        }
        Err(e) => panic!("cannot start an isolated cluster: {e}"),
    }
}

fn netns_exists(name: &str) -> bool {
    Path::new("/var/run/netns").join(name).exists()
}

/// Leader and ISR of partition 0 of `topic` as broker `node` sees it (None when it does not answer in
/// time or knows no such partition).
async fn view(client: &Client, node: i32, topic: &str) -> Option<(i32, Vec<i32>)> {
    let request =
        MetadataRequest::default().with_topics(Some(vec![MetadataRequestTopic::default()
            .with_name(Some(TopicName(StrBytes::from_string(topic.to_owned()))))]));
    let resp = tokio::time::timeout(
        Duration::from_secs(3),
        client.send_once(Target::Broker(node), |_| request.clone()),
    )
    .await
    .ok()?
    .ok()?;
    let p = resp.0.topics.first()?.partitions.first()?;
    (p.error_code == 0).then(|| (p.leader_id.0, p.isr_nodes.iter().map(|b| b.0).collect()))
}

/// Every record of partition 0 of `topic` as `(offset, value)`, read at read_committed from the
/// current leader up to the last stable offset, once the high watermark has not moved for a second.
async fn read_all(client: &Client, topic: &str) -> Vec<(i64, String)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last_end = -1;
    let mut still_since = Instant::now();
    loop {
        let (records, end) = read_once(client, topic).await;
        if end != last_end {
            last_end = end;
            still_since = Instant::now();
        } else if still_since.elapsed() >= Duration::from_secs(1) {
            return records;
        }
        assert!(
            Instant::now() < deadline,
            "{topic}: the log end kept moving"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn read_once(client: &Client, topic: &str) -> (Vec<(i64, String)>, i64) {
    let mut offset = 0i64;
    let mut records = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let options = CallOptions {
            max_version: Some(12),
            ..CallOptions::default()
        };
        let build = |_v: i16| {
            protocol_tests::fetch_by_name(topic, 0, offset, IsolationLevel::ReadCommitted)
        };
        let resp = client
            .call(Target::leader(topic, 0), &options, build, |r, _| {
                Verdict::Done(r)
            })
            .await
            .expect("fetch");
        let p = &resp.responses[0].partitions[0];
        assert_eq!(
            ErrorCode::from_code(p.error_code),
            ErrorCode::None,
            "fetch error"
        );
        let bytes = p.records.clone().unwrap_or_default();
        let v = visible_in(bytes, &[], IsolationLevel::ReadCommitted, offset)
            .expect("decodable batches");
        for r in v.iter() {
            let value = r
                .value()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default();
            records.push((r.offset(), value));
        }
        offset = v.next_offset.max(offset);
        if offset >= p.last_stable_offset {
            return (records, p.last_stable_offset);
        }
        assert!(
            Instant::now() < deadline,
            "read of {topic} stuck at {offset} < {}",
            p.last_stable_offset
        );
    }
}

/// What became of one record, as the producer reported it.
#[derive(Debug)]
enum Outcome {
    Acked(Option<i64>),
    /// Not written (an abortable or fatal error that is not outcome-unknown).
    Failed(String),
    /// Maybe written.
    Unknown(String),
}

fn outcome(result: Result<Option<i64>, ProducerError>) -> Outcome {
    match result {
        Ok(offset) => Outcome::Acked(offset),
        Err(e) if e.is_outcome_unknown() => Outcome::Unknown(e.to_string()),
        Err(e) => Outcome::Failed(e.to_string()),
    }
}

/// The partition leader is cut off from both other brokers while the idempotent producer writes one
/// record every 10 ms. Observed, not assumed: the other brokers elect a new leader without the old one
/// in the ISR. After the heal the old leader rejoins the ISR, and at read_committed every acknowledged
/// record is there once, at the offset it was acknowledged at, in the order it was sent; nothing was
/// written twice, nothing reported failed is there, and every record read was one that was sent.
/// Dropping the cluster deletes all of its namespaces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_cut_from_its_followers_loses_no_acknowledged_record() {
    let _serial = SERIAL.lock().await;
    let began = Instant::now();
    let Some(kafka) = isolated(ClusterSpec::three_nodes().with_isolated_brokers()).await else {
        return;
    };
    eprintln!(
        "three isolated nodes ready in {:?}, namespaces {:?}",
        kafka.started_in(),
        kafka.namespaces()
    );
    let namespaces = kafka.namespaces();
    assert_eq!(namespaces.len(), 4, "a hub and one per broker");
    assert!(namespaces.iter().all(|n| netns_exists(n)));

    let client = Client::connect(ClientConfig::new(kafka.bootstrap()))
        .await
        .expect("connect through the forwarders");
    let topic = unique("netns-cut");
    snapfence::admin::create_topic(&client, &topic, 1, 3, &[("min.insync.replicas", "2")])
        .await
        .expect("create topic");
    // Every broker agrees on one leader and a full ISR before the fault.
    let until = Instant::now() + Duration::from_secs(30);
    let leader = loop {
        let mut views = Vec::new();
        for node in kafka.node_ids() {
            views.push(view(&client, node, &topic).await);
        }
        if let Some(Some((l, isr))) = views.first() {
            if views.iter().all(|v| v.as_ref() == Some(&(*l, isr.clone()))) && isr.len() == 3 {
                break *l;
            }
        }
        assert!(
            Instant::now() < until,
            "no agreed leader with ISR 3: {views:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let others: Vec<i32> = kafka
        .node_ids()
        .into_iter()
        .filter(|&n| n != leader)
        .collect();

    let mut config = ProducerConfig::default();
    config.linger = Duration::from_millis(2);
    config.request_timeout = Duration::from_secs(5);
    // Shorter than the failover takes (about 8-10 s here), so records stuck on the cut-off leader expire
    // and are reported failed or outcome-unknown, and the producer must carry on after that.
    let delivery_timeout = Duration::from_secs(6);
    config.delivery_timeout = delivery_timeout;
    let producer = Producer::new(client.clone(), config)
        .await
        .expect("idempotent producer");

    // The writer: one record every 10 ms; each delivery is awaited on a task of its own, which also
    // measures how long the record took from `send` to its outcome.
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let next = Arc::new(AtomicU32::new(0));
    let writer = {
        let producer = producer.clone();
        let topic = topic.clone();
        let next = Arc::clone(&next);
        tokio::spawn(async move {
            let mut pending = Vec::new();
            let mut i = 0u32;
            while !*stop_rx.borrow_and_update() {
                let value = format!("{i:06}");
                let record = ProducerRecord::new(topic.as_str(), Some(Bytes::from(value.clone())))
                    .partition(0);
                let sent = Instant::now();
                match producer.send(record).await {
                    Ok(delivery) => pending.push((
                        i,
                        tokio::spawn(async move {
                            let r = delivery.await.map(|m| m.offset);
                            (r, sent.elapsed())
                        }),
                    )),
                    Err(e) => {
                        pending.push((i, tokio::spawn(async move { (Err(e), sent.elapsed()) })))
                    }
                }
                i += 1;
                next.store(i, Ordering::SeqCst);
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(10)) => {}
                    _ = stop_rx.changed() => {}
                }
            }
            let mut outcomes = BTreeMap::new();
            let mut slowest = Duration::ZERO;
            for (i, task) in pending {
                let (result, took) = task.await.expect("delivery task");
                slowest = slowest.max(took);
                outcomes.insert(i, outcome(result));
            }
            (outcomes, slowest)
        })
    };

    tokio::time::sleep(Duration::from_secs(3)).await;
    kafka.isolate_broker(leader).expect("cut the leader off");
    let cut_at = Instant::now();
    eprintln!("cut leader {leader} from {others:?}");
    // The effect, as the brokers on the majority side report it: a new leader, the old one out of the ISR.
    let mut new_leader = None;
    let mut old_leader_view = None;
    while cut_at.elapsed() < Duration::from_secs(40) {
        let mut majority = Vec::new();
        for &n in &others {
            majority.push(view(&client, n, &topic).await);
        }
        old_leader_view = view(&client, leader, &topic).await;
        if let [Some((l1, isr1)), Some((l2, _))] = majority.as_slice() {
            if l1 == l2 && *l1 != leader && *l1 >= 0 && !isr1.contains(&leader) {
                new_leader = Some((*l1, isr1.clone(), cut_at.elapsed()));
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!("majority view {new_leader:?}; the cut-off leader's own view: {old_leader_view:?}");
    // Keep the cut a few seconds after the failover, so writes meet the new leader and the stale one.
    tokio::time::sleep(Duration::from_secs(4)).await;
    kafka.heal_all().expect("heal");
    let healed_at = Instant::now();
    let first_after_heal = next.load(Ordering::SeqCst);
    assert!(kafka.cut_pairs().is_empty());
    // The old leader catches up and rejoins the ISR.
    let mut rejoined = None;
    while healed_at.elapsed() < Duration::from_secs(40) {
        let views = [
            view(&client, others[0], &topic).await,
            view(&client, leader, &topic).await,
        ];
        if views
            .iter()
            .all(|v| v.as_ref().is_some_and(|(_, isr)| isr.len() == 3))
        {
            rejoined = Some((views[0].clone(), healed_at.elapsed()));
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!("after the heal: {rejoined:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop_tx.send(true).expect("stop the writer");
    let (outcomes, slowest) = writer.await.expect("writer task");
    producer.close().await;

    let log = read_all(&client, &topic).await;
    let mut acked = 0;
    let mut failed = 0;
    let mut unknown = 0;
    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    for o in outcomes.values() {
        match o {
            Outcome::Acked(_) => acked += 1,
            Outcome::Failed(e) => {
                failed += 1;
                *errors.entry(e.clone()).or_default() += 1;
            }
            Outcome::Unknown(e) => {
                unknown += 1;
                *errors.entry(e.clone()).or_default() += 1;
            }
        }
    }
    eprintln!(
        "sent {}, acknowledged {acked}, failed {failed}, outcome unknown {unknown}, read {}; slowest \
         outcome {slowest:?}; errors {errors:?}",
        outcomes.len(),
        log.len()
    );
    drop(client);
    drop(kafka);
    let leaked: Vec<&String> = namespaces.iter().filter(|n| netns_exists(n)).collect();
    eprintln!("whole test {:?}", began.elapsed());

    // The cut had an effect.
    let (elected, isr, after) = new_leader.unwrap_or_else(|| {
        panic!("the majority never elected a leader other than {leader} (last view of the cut-off leader: {old_leader_view:?})")
    });
    eprintln!("leader {leader} -> {elected} after {after:?}, ISR {isr:?}");
    assert!(
        rejoined.is_some(),
        "node {leader} never rejoined the ISR after the heal"
    );
    // The writes felt it: records waited for the failover (or expired waiting).
    assert!(
        failed + unknown > 0 || slowest >= Duration::from_secs(2),
        "no record was delayed or lost by the cut (slowest {slowest:?})"
    );
    // The delivery timeout bounds when every outcome is reported, for a batch the cut-off leader holds
    // in flight too (the slack covers the linger and a loaded machine).
    assert!(
        slowest <= delivery_timeout + Duration::from_secs(3),
        "an outcome came {slowest:?} after its send, past the delivery timeout of {delivery_timeout:?}"
    );
    // The producer carried on after its expired batches: records sent after the heal were written.
    let acked_after_heal = outcomes
        .range(first_after_heal..)
        .filter(|(_, o)| matches!(o, Outcome::Acked(_)))
        .count();
    assert!(
        acked_after_heal > 0,
        "no record sent after the heal (from #{first_after_heal}) was acknowledged"
    );

    // Accounting.
    let mut seen: BTreeMap<u32, Vec<i64>> = BTreeMap::new();
    let mut order = Vec::new();
    for (offset, value) in &log {
        let i: u32 = value
            .parse()
            .unwrap_or_else(|_| panic!("foreign record {value:?} at {offset}"));
        assert!(
            outcomes.contains_key(&i),
            "record {i} at {offset} was never sent"
        );
        seen.entry(i).or_default().push(*offset);
        order.push(i);
    }
    let dupes: Vec<_> = seen.iter().filter(|(_, o)| o.len() > 1).collect();
    assert!(dupes.is_empty(), "written more than once: {dupes:?}");
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "the log is not in send order"
    );
    for (i, o) in &outcomes {
        match o {
            Outcome::Acked(offset) => {
                let at = seen.get(i).unwrap_or_else(|| {
                    panic!("record {i} was acknowledged (offset {offset:?}) but is not in the log")
                });
                if let Some(offset) = offset {
                    assert_eq!(
                        at,
                        &vec![*offset],
                        "record {i} acknowledged at another offset"
                    );
                }
            }
            Outcome::Failed(e) => {
                assert!(
                    !seen.contains_key(i),
                    "record {i} reported not written ({e}) is there"
                );
            }
            Outcome::Unknown(_) => {}
        }
    }
    assert!(
        acked > 100,
        "too few records acknowledged to mean anything: {acked}"
    );
    assert!(leaked.is_empty(), "namespaces left after drop: {leaked:?}");
}

/// A single isolated node answers through its forwarder; its namespaces exist while it runs and are
/// all gone once it is dropped; asking to cut a node from itself or from an unknown node is an error,
/// not a panic.
#[tokio::test]
async fn isolated_cluster_answers_and_leaves_no_namespace_behind() {
    let _serial = SERIAL.lock().await;
    let Some(kafka) = isolated(ClusterSpec::kafka4().with_isolated_brokers()).await else {
        return;
    };
    let names = kafka.namespaces();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names.iter().all(|n| netns_exists(n)), "{names:?}");
    let client = Client::connect(ClientConfig::new(kafka.bootstrap()))
        .await
        .expect("connect through the forwarder");
    let metadata = client.metadata(&[]).await.expect("metadata");
    let broker = &metadata.brokers[&1];
    assert_eq!(
        (broker.host.as_str(), broker.port),
        (
            "127.0.0.1",
            i32::from(
                kafka
                    .node_address(1)
                    .rsplit(':')
                    .next()
                    .unwrap()
                    .parse::<u16>()
                    .unwrap()
            )
        ),
        "the client listener is advertised as the forwarder"
    );
    assert!(matches!(
        kafka.partition_brokers(1, 1),
        Err(FixtureError::BadSpec(_))
    ));
    assert!(matches!(
        kafka.partition_brokers(1, 7),
        Err(FixtureError::BadSpec(_))
    ));
    drop(client);
    drop(kafka);
    let left: Vec<&String> = names.iter().filter(|n| netns_exists(n)).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
