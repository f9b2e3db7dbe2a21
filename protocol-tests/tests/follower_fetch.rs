//! Fetch from follower (KIP-392) on three Kafka 4.4 nodes in three racks (`broker.rack=rack-<node>`)
//! with `replica.selector.class=RackAwareReplicaSelector`: a reader in a follower's rack reads a
//! partition's bytes from that follower (an aborted and a committed transaction among them, so the
//! read_committed rules run on the follower's LSO and aborted list), and gets exactly what a leader read
//! gets; the recovery read does too; and a follower stopped in the middle of a read hands it back to the leader, which
//! finishes it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol_tests::{dedicated, unique, ClusterSpec, KafkaCluster};
use snapfence::consumer::{
    list_offsets, OffsetSpec, PartitionReader, ReaderConfig, StartAt, TopicPartition,
};
use snapfence::net::{Client, ClientConfig};
use snapfence::producer::{
    Producer, ProducerConfig, ProducerRecord, TransactionalConfig, TransactionalProducer,
};
use snapfence::records::IsolationLevel;
use snapfence::snapshot::{recover, PartitionLog, RecoveryConfig};

const RECORDS: usize = 3000;

fn racks() -> ClusterSpec {
    ClusterSpec::three_nodes()
        .with_prop("broker.rack", "rack-{node}")
        .with_prop(
            "replica.selector.class",
            "org.apache.kafka.common.replica.RackAwareReplicaSelector",
        )
}

fn reader_config(rack: Option<String>) -> ReaderConfig {
    let mut c = ReaderConfig::default();
    c.isolation = IsolationLevel::ReadCommitted;
    // Small fetches, so a read takes many round trips and a stop can land in the middle of it.
    c.partition_max_bytes = 64 * 1024;
    c.max_bytes = 64 * 1024;
    c.max_wait = Duration::from_millis(100);
    c.client_rack = rack;
    c
}

/// Reads `tp` to `end` from the start; returns every (key, value) in order.
async fn read_all(
    reader: &mut PartitionReader,
    tp: &TopicPartition,
    end: i64,
    mut between: impl FnMut(i64),
) -> Vec<(Bytes, Bytes)> {
    reader.assign(tp.clone(), StartAt::Earliest);
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while reader.position(tp).is_none_or(|p| p < end) {
        for part in reader.fetch().await.unwrap() {
            for r in part.records {
                out.push((r.key.unwrap(), r.value.unwrap()));
            }
        }
        between(reader.position(tp).unwrap_or(0));
        assert!(Instant::now() < deadline, "never read to {end}");
    }
    out
}

async fn setup(kafka: &KafkaCluster) -> (Client, TopicPartition, i32, i32, i64) {
    let client = Client::connect(ClientConfig::new(kafka.bootstrap()))
        .await
        .unwrap();
    let topic = unique("rack");
    snapfence::admin::create_topic(&client, &topic, 1, 3, &[])
        .await
        .unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default())
        .await
        .unwrap();
    let value = Bytes::from(vec![b'v'; 1000]);
    let mut deliveries = Vec::with_capacity(RECORDS);
    for i in 0..RECORDS {
        let r = ProducerRecord::new(topic.as_str(), Some(value.clone()))
            .key(format!("k{}", i % 500))
            .partition(0);
        deliveries.push(producer.send(r).await.unwrap());
    }
    for d in deliveries {
        d.await.unwrap();
    }
    producer.close().await;
    // An aborted transaction, then a committed one: a read_committed reader keeps only the second.
    let mut txn =
        TransactionalProducer::init(client.clone(), TransactionalConfig::new(unique("rack-txn")))
            .await
            .unwrap();
    for (outcome, tag) in [("abort", "aborted"), ("commit", "committed")] {
        txn.begin().unwrap();
        let mut deliveries = Vec::new();
        for i in 0..10 {
            let r = ProducerRecord::new(topic.as_str(), Some(Bytes::from(tag)))
                .key(format!("t{i}"))
                .partition(0);
            deliveries.push(txn.send(r).await.unwrap());
        }
        if outcome == "abort" {
            txn.abort().await.unwrap();
        } else {
            txn.commit().await.unwrap();
        }
        for d in deliveries {
            let _ = d.await;
        }
    }
    txn.close().await;
    let leader = client.leader(&topic, 0).await.unwrap().node;
    let follower = client
        .cached_metadata()
        .brokers
        .keys()
        .copied()
        .find(|n| *n != leader)
        .unwrap();
    let tp = TopicPartition::new(topic.as_str(), 0);
    // The end once the commit's marker is written (a commit returns before the markers are): the LSO
    // has caught up with the high watermark.
    let deadline = Instant::now() + Duration::from_secs(20);
    let end = loop {
        let at = |isolation| {
            list_offsets(
                &client,
                std::slice::from_ref(&tp),
                OffsetSpec::Latest,
                isolation,
            )
        };
        let lso = at(IsolationLevel::ReadCommitted).await.unwrap()[&tp];
        let hw = at(IsolationLevel::ReadUncommitted).await.unwrap()[&tp];
        if lso == hw {
            break hw;
        }
        assert!(Instant::now() < deadline, "the LSO never reached {hw}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    (client, tp, leader, follower, end)
}

/// A reader in a follower's rack reads from that follower: its bytes come from the follower's node,
/// the result equals a leader read, and so does the recovery read of the same partition. Then a read
/// whose follower is stopped half-way is finished by the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_in_a_followers_rack_reads_from_it_and_falls_back_to_the_leader() {
    // Its own cluster: the test stops a node.
    let kafka = dedicated(racks()).await;
    let (client, tp, leader, follower, end) = setup(&kafka).await;
    let rack = format!("rack-{follower}");

    let mut from_leader = PartitionReader::new(client.clone(), reader_config(None));
    let expected = read_all(&mut from_leader, &tp, end, |_| {}).await;
    assert_eq!(
        expected.len(),
        RECORDS + 10,
        "the aborted transaction is not read"
    );
    assert!(expected.iter().all(|(_, v)| v != "aborted"));
    assert_eq!(
        from_leader
            .fetched_bytes_by_node()
            .keys()
            .copied()
            .collect::<Vec<_>>(),
        [leader],
        "without a rack, the leader serves"
    );

    let mut in_rack = PartitionReader::new(client.clone(), reader_config(Some(rack.clone())));
    let got = read_all(&mut in_rack, &tp, end, |_| {}).await;
    assert_eq!(got, expected, "the same records as from the leader");
    let by_node: BTreeMap<i32, u64> = in_rack.fetched_bytes_by_node();
    let total: u64 = by_node.values().sum();
    let from_follower = by_node.get(&follower).copied().unwrap_or(0);
    eprintln!("bytes by node, leader {leader}, follower {follower}: {by_node:?}");
    assert!(
        from_follower * 10 >= total * 9,
        "at least 90% of the bytes from the same-rack follower: {by_node:?}"
    );
    assert_eq!(in_rack.read_replica(&tp), Some(follower));

    // The recovery read, through a log reader in the same rack.
    let mut log = PartitionLog::with_reader(
        client.clone(),
        &tp.topic,
        0,
        reader_config(Some(rack.clone())),
    );
    let (recovered, _) = recover(&mut log, 0, &RecoveryConfig::default())
        .await
        .unwrap();
    let mut last: BTreeMap<Bytes, Bytes> = BTreeMap::new();
    for (k, v) in &expected {
        last.insert(k.clone(), v.clone());
    }
    let recovered: BTreeMap<Bytes, Bytes> = recovered
        .iter()
        .map(|(k, v)| (Bytes::copy_from_slice(k), Bytes::copy_from_slice(v)))
        .collect();
    assert_eq!(recovered, last, "the recovery read from the follower");

    // The follower stops half-way through a read: the leader finishes it.
    let mut stopped = PartitionReader::new(client.clone(), reader_config(Some(rack)));
    let mut stopped_at = None;
    let got = read_all(&mut stopped, &tp, end, |position| {
        if stopped_at.is_none() && position >= end / 2 {
            assert!(kafka.stop(follower), "the follower stops");
            stopped_at = Some(position);
        }
    })
    .await;
    assert_eq!(got, expected, "finished by the leader");
    let by_node = stopped.fetched_bytes_by_node();
    eprintln!("stopped at {stopped_at:?}; bytes by node: {by_node:?}");
    assert!(by_node.get(&follower).copied().unwrap_or(0) > 0);
    assert!(
        by_node.get(&leader).copied().unwrap_or(0) > 0,
        "the leader served the rest"
    );
    assert_eq!(stopped.read_replica(&tp), None);
    drop(kafka);
}
