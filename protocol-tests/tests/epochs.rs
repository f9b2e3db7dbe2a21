//! OffsetForLeaderEpoch (KIP-320) as a consumer asks it (`consumer::epoch_end_offset`), on three Kafka
//! 4.4 nodes: each leader epoch ends where the next leader's began, the current one at the log end, and
//! an epoch the log never had answers the largest one below it. This is what the on-disk state's
//! checkpoint check (issue 36) rests on: a checkpoint at offset `o` with the epoch of record `o - 1` is
//! on the log only while that epoch is answered as itself, ending at or after `o`.

use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol_tests::{dedicated, unique, ClusterSpec};
use snapfence::consumer::{epoch_end_offset, TopicPartition};
use snapfence::net::{Client, ClientConfig};
use snapfence::producer::{Producer, ProducerConfig, ProducerRecord};

async fn write(producer: &Producer, topic: &str, n: usize) {
    let mut deliveries = Vec::new();
    for i in 0..n {
        let r = ProducerRecord::new(topic, Some(Bytes::from(format!("v{i}")))).partition(0);
        deliveries.push(producer.send(r).await.unwrap());
    }
    for d in deliveries {
        d.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_epoch_ends_where_the_next_leader_began() {
    // Its own cluster: the test stops a node.
    let kafka = dedicated(ClusterSpec::three_nodes()).await;
    let client = Client::connect(ClientConfig::new(kafka.bootstrap()))
        .await
        .unwrap();
    let topic = unique("epochs");
    snapfence::admin::create_topic(&client, &topic, 1, 3, &[])
        .await
        .unwrap();
    let tp = TopicPartition::new(topic.as_str(), 0);
    let producer = Producer::new(client.clone(), ProducerConfig::default())
        .await
        .unwrap();
    write(&producer, &topic, 10).await;
    let first = client.leader(&topic, 0).await.unwrap();
    assert_eq!(
        epoch_end_offset(&client, &tp, first.epoch).await.unwrap(),
        (first.epoch, 10),
        "the current epoch ends at the log end"
    );

    // The leader stops; another takes over in a later epoch, and five more records go in it.
    assert!(tokio::task::block_in_place(|| kafka.stop(first.node)));
    let deadline = Instant::now() + Duration::from_secs(60);
    let second = loop {
        client.invalidate_leader(&topic, 0);
        if let Ok(l) = client.leader(&topic, 0).await {
            if l.node != first.node && l.epoch > first.epoch {
                break l;
            }
        }
        assert!(Instant::now() < deadline, "no new leader");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    write(&producer, &topic, 5).await;
    producer.close().await;
    assert_eq!(
        epoch_end_offset(&client, &tp, first.epoch).await.unwrap(),
        (first.epoch, 10),
        "the old epoch ends where the new leader began"
    );
    assert_eq!(
        epoch_end_offset(&client, &tp, second.epoch).await.unwrap(),
        (second.epoch, 15)
    );
    // Epochs the log never wrote in (between the two, if the controller skipped any) answer the
    // largest below them.
    for missing in first.epoch + 1..second.epoch {
        assert_eq!(
            epoch_end_offset(&client, &tp, missing).await.unwrap(),
            (first.epoch, 10),
            "epoch {missing}"
        );
    }
    // What the checkpoint check makes of it: a checkpoint at 10 in the first epoch is on the log; one
    // that claimed 12 in the first epoch (records the old leader had but never replicated) is not.
    let (epoch, end) = epoch_end_offset(&client, &tp, first.epoch).await.unwrap();
    assert!(epoch == first.epoch && end >= 10);
    assert!(end < 12);
}
