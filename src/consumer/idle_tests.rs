//! An idle member (joined, nothing assigned) must cost next to nothing: a bounded number of driver
//! passes per second, however long the application polls. The coordinator is a loopback stub that
//! answers the consumer-protocol heartbeat with an empty assignment; it stands in for no broker
//! behaviour, it only keeps the member's machine in the idle state.
//!
//! The defect this guards: the poll path woke the membership driver on every poll, and the driver woke
//! the waiting poll on every pass, so the two tasks woke each other forever (44 000 wake-ups in 10 s,
//! a full core, measured against a real broker).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kafka_protocol::messages::consumer_group_heartbeat_response::Assignment;
use kafka_protocol::messages::ConsumerGroupHeartbeatResponse;

use super::{GroupConfig, GroupConsumer, GroupConsumerConfig, GroupProtocol};
use crate::net::testing::{api_versions, coordinator_is_self, loopback, one_node_metadata, Peer};
use crate::net::{Client, ClientConfig};

/// Serves ApiVersions, Metadata (one broker, node 1, itself), FindCoordinator (itself) and
/// ConsumerGroupHeartbeat (member epoch 1, nothing assigned, heartbeat every 500 ms).
pub(super) async fn idle_coordinator() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    loopback(serve).await
}

async fn serve(mut peer: Peer, addr: SocketAddr) {
    while let Some(request) = peer.next_request().await {
        let id = request.header.correlation_id;
        let version = request.header.request_api_version;
        match request.header.request_api_key {
            18 => {
                let answer = api_versions(&[(18, 0, 3), (3, 1, 12), (10, 0, 4), (68, 0, 1)]);
                peer.respond(id, &answer, version.min(3)).await;
            }
            3 => {
                peer.respond(id, &one_node_metadata(addr, &[]), version)
                    .await
            }
            10 => {
                let answer = coordinator_is_self(addr, "idle-group", version);
                peer.respond(id, &answer, version).await;
            }
            68 => {
                let answer = ConsumerGroupHeartbeatResponse::default()
                    .with_member_epoch(1)
                    .with_heartbeat_interval_ms(500)
                    .with_assignment(Some(Assignment::default()));
                peer.respond(id, &answer, version).await;
            }
            other => panic!("the idle coordinator stub does not serve api key {other}"),
        }
    }
}

/// A joined member with nothing assigned, polled for 1.5 s, makes a few driver passes per heartbeat,
/// not thousands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_member_does_a_bounded_amount_of_work() {
    let (addr, stub) = idle_coordinator().await;
    let client = Client::connect(ClientConfig::new(addr.to_string()))
        .await
        .unwrap();
    let mut group = GroupConfig::new("idle-group");
    group.protocol = GroupProtocol::Consumer {
        server_assignor: None,
    };
    let config = GroupConsumerConfig::new(group);
    let mut consumer = GroupConsumer::subscribe(client, config, ["t"], ())
        .await
        .unwrap();
    let began = tokio::time::Instant::now();
    let mut polls = 0u32;
    while began.elapsed() < Duration::from_millis(1500) {
        let records = consumer.poll(Duration::from_millis(200)).await.unwrap();
        assert!(records.is_empty());
        polls += 1;
    }
    let passes = consumer.shared().driver_passes.load(Ordering::Relaxed);
    assert!(
        consumer.shared().lock().group_metadata().is_some(),
        "the member joined (else the test measured a member that never got idle)"
    );
    // Three heartbeats (500 ms) in 1.5 s, each a send and an answer, plus the join: about a dozen
    // passes. The spin made thousands.
    assert!(
        passes < 60,
        "{passes} driver passes in 1.5 s of idle polling"
    );
    // Each poll waits out its timeout: about 1.5 s / 200 ms of them, not a busy loop.
    assert!(polls <= 12, "{polls} polls returned in 1.5 s");
    stub.abort();
}
