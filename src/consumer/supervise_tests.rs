//! The membership driver's supervision: its request tasks and the driver itself are made to panic at
//! test-only fault points, and the machine (for a request) or the application (for the driver) must
//! hear of it. The coordinator is the idle-member stub of `idle_tests`: it answers every request with
//! success and an empty assignment, so whatever goes wrong here is the injected panic.

use std::time::Duration;

use super::idle_tests::idle_coordinator;
use super::{ConsumerError, GroupConfig, GroupConsumer, GroupConsumerConfig, GroupProtocol};
use crate::net::{Client, ClientConfig};

/// Long enough for a join against a loopback stub many times over.
const PATIENCE: Duration = Duration::from_secs(10);

async fn member(addr: std::net::SocketAddr) -> GroupConsumer {
    let client = Client::connect(ClientConfig::new(&addr.to_string()))
        .await
        .unwrap();
    let mut group = GroupConfig::new("idle-group");
    group.protocol = GroupProtocol::Consumer {
        server_assignor: None,
    };
    GroupConsumer::subscribe(client, GroupConsumerConfig::new(group), ["t"], ())
        .await
        .unwrap()
}

/// A group request task that panics reaches the membership machine as a failed request, which it
/// retries: the member still joins, instead of waiting for ever for the dead request's answer.
// One thread: `subscribe` returns before the driver's first pass, so the fault armed next is in place
// for the first request.
#[tokio::test(flavor = "current_thread")]
async fn a_panicked_group_request_is_a_failed_request() {
    let (addr, stub) = idle_coordinator().await;
    let mut consumer = member(addr).await;
    consumer.shared().faults.arm("group request", 1);
    let began = tokio::time::Instant::now();
    while consumer.shared().lock().group_metadata().is_none() {
        assert!(
            began.elapsed() < PATIENCE,
            "the member never joined: the machine still waits for the dead request's answer"
        );
        consumer.poll(Duration::from_millis(100)).await.unwrap();
    }
    assert_eq!(
        consumer.shared().faults.pending("group request"),
        0,
        "the fault fired (else the test proved nothing)"
    );
    stub.abort();
}

/// When the membership task itself dies, the next poll fails with a typed error naming it and the
/// panic, at once rather than after its timeout, and so does every poll after it.
#[tokio::test(flavor = "current_thread")]
async fn a_dead_membership_task_fails_the_next_poll() {
    let (addr, stub) = idle_coordinator().await;
    let mut consumer = member(addr).await;
    consumer.shared().faults.arm("membership driver", 1);
    let began = tokio::time::Instant::now();
    let first = consumer.poll(PATIENCE).await;
    assert!(
        began.elapsed() < PATIENCE / 2,
        "the poll waited out its timeout on a dead driver"
    );
    for result in [first, consumer.poll(PATIENCE).await] {
        match result {
            Err(ConsumerError::TaskFailed { task, failure }) => {
                assert_eq!(task, "group membership");
                assert!(
                    failure.contains("injected fault at membership driver"),
                    "the panic's message is kept: {failure}"
                );
            }
            other => panic!("expected TaskFailed, got {other:?}"),
        }
    }
    stub.abort();
}
