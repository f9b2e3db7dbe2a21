//! A broker bug behind issue 18's 3.9 flake, shown on the broker itself.
//!
//! Kafka 3.7-3.9 with the new (then preview) group coordinator switched on
//! (`group.coordinator.rebalance.protocols` containing `consumer`, or `group.coordinator.new.enable`)
//! can answer a WriteTxnMarkers request before every marker in it is done: a marker whose partitions are
//! all `__consumer_offsets` ones reports its result twice when the group coordinator finishes before the
//! (empty) log append beside it calls back, so the request's countdown reaches zero early and the answer
//! leaves without the markers still under way (KAFKA-17877, fixed in 4.0). The transaction coordinator
//! that sent the request then throws on the missing producer id and never resends or completes that
//! transaction's markers: the transaction stays in PrepareCommit (or PrepareAbort) with a pending
//! transition until the coordinator moves, and every InitProducerId for its transactional id answers
//! CONCURRENT_TRANSACTIONS. No client can undo that; see docs/reliability.md.
//!
//! The tests send WriteTxnMarkers themselves (the plain fixture has no authorizer, so the broker-only API
//! is open), each request with many markers for `__consumer_offsets` partitions only, which is what a
//! burst of offset-only transactions from several transactional ids makes the coordinator send.
//!
//! # References
//! - WriteTxnMarkers v0-1 (KIP-98); KAFKA-17877; KIP-848 (the new group coordinator)

use std::collections::BTreeSet;

use kafka_protocol::messages::write_txn_markers_request::{
    WritableTxnMarker, WritableTxnMarkerTopic,
};
use kafka_protocol::messages::{ProducerId, TopicName, WriteTxnMarkersRequest};
use kafka_protocol::protocol::StrBytes;
use protocol_tests::{cluster, ClusterSpec, KafkaCluster};
use snapfence::net::{Client, ClientConfig, Target};

/// Markers per request: as many transactional ids finishing at once as a busy coordinator batches.
const MARKERS: i64 = 64;

/// What a run of requests got back.
struct Outcome {
    /// Answers that lacked at least one producer id of their request.
    incomplete: usize,
    /// Requests sent.
    requests: usize,
    /// The producer ids missing from the first incomplete answer.
    first_missing: Vec<i64>,
}

/// The `__consumer_offsets` partitions of `client`'s cluster (the fixture's readiness check creates the
/// topic with a FindCoordinator for a group).
async fn offsets_partitions(client: &Client) -> Vec<i32> {
    let metadata = client.metadata(&["__consumer_offsets"]).await.unwrap();
    let partitions: Vec<i32> = metadata.topics["__consumer_offsets"]
        .partitions
        .keys()
        .copied()
        .collect();
    assert!(!partitions.is_empty(), "no __consumer_offsets partitions");
    partitions
}

/// Sends up to `requests` WriteTxnMarkers requests of [`MARKERS`] offset-only markers each, spread over
/// the `__consumer_offsets` partitions, and checks that each answer names every producer id it was asked
/// about. The producer ids start at `first_id` and are never reused, so no marker meets a real
/// transaction (the log and the group coordinator take an end marker for a producer they have not seen).
/// With `stop_at_first`, stops at the first incomplete answer.
async fn burst(kafka: &KafkaCluster, first_id: i64, requests: i64, stop_at_first: bool) -> Outcome {
    let client = Client::connect(ClientConfig::new(kafka.bootstrap()))
        .await
        .unwrap();
    let partitions = offsets_partitions(&client).await;
    let mut outcome = Outcome {
        incomplete: 0,
        requests: 0,
        first_missing: Vec::new(),
    };
    for r in 0..requests {
        let ids: Vec<i64> = (0..MARKERS).map(|m| first_id + r * MARKERS + m).collect();
        let markers: Vec<WritableTxnMarker> = ids
            .iter()
            .zip(0..)
            .map(|(&id, i): (&i64, usize)| {
                WritableTxnMarker::default()
                    .with_producer_id(ProducerId(id))
                    .with_producer_epoch(0)
                    .with_transaction_result(i % 2 == 0)
                    .with_coordinator_epoch(0)
                    .with_topics(vec![WritableTxnMarkerTopic::default()
                        .with_name(TopicName(StrBytes::from_static_str("__consumer_offsets")))
                        .with_partition_indexes(vec![partitions[i % partitions.len()]])])
            })
            .collect();
        let (response, _) = client
            .send_once(Target::Any, |_| {
                WriteTxnMarkersRequest::default().with_markers(markers.clone())
            })
            .await
            .unwrap();
        let answered: BTreeSet<i64> = response.markers.iter().map(|m| m.producer_id.0).collect();
        let missing: Vec<i64> = ids
            .iter()
            .copied()
            .filter(|id| !answered.contains(id))
            .collect();
        outcome.requests += 1;
        if !missing.is_empty() {
            outcome.incomplete += 1;
            if outcome.first_missing.is_empty() {
                outcome.first_missing = missing;
            }
            if stop_at_first {
                break;
            }
        }
    }
    outcome
}

/// 3.9 with the KIP-848 preview switched on, which runs the new group coordinator.
fn kafka39_preview_coordinator() -> ClusterSpec {
    ClusterSpec::kafka39_consumer_preview()
}

/// 3.9 as it ships (and as the fixture runs it by default): the classic group coordinator.
fn kafka39_classic_coordinator() -> ClusterSpec {
    ClusterSpec::kafka39()
}

/// The answer to WriteTxnMarkers covers every marker of the request: the transaction coordinator relies
/// on it (a missing producer id leaves that transaction's markers unsent for good). Holds on 4.x and on
/// 3.9 with the classic group coordinator, which is what the snapshot flow's 3.9 tests run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_txn_markers_answers_every_marker() {
    for spec in [ClusterSpec::kafka4(), kafka39_classic_coordinator()] {
        let kafka = cluster(spec).await;
        let o = burst(&kafka, 1_000_000, 100, false).await;
        eprintln!(
            "{}: {} of {} answers lacked a producer id",
            kafka.version(),
            o.incomplete,
            o.requests
        );
        assert_eq!(
            o.incomplete,
            0,
            "{}: answers lacked producer ids, first {:?}",
            kafka.version(),
            o.first_missing
        );
    }
}

/// KAFKA-17877 on the broker: 3.9 with the preview group coordinator answers some WriteTxnMarkers
/// requests of offset-only markers without every producer id (measured here: 16 to 39 of 100 requests
/// of 64 markers on a loaded two-core machine). This test fails once the 3.9 release under test
/// (`SNAPFENCE_KAFKA39_VERSION`) no longer does: then docs/reliability.md and the 3.9 leg of
/// `flow.rs::end_to_end_state_survives_rebalances_and_a_zombie` can be updated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka39_preview_group_coordinator_drops_marker_answers() {
    let kafka = cluster(kafka39_preview_coordinator()).await;
    // At the rates measured, 1 000 requests miss the bug with a probability far below 1e-9; stopping at the
    // first incomplete answer keeps the usual run to a few requests.
    let o = burst(&kafka, 2_000_000, 1_000, true).await;
    eprintln!(
        "{} with the preview group coordinator: the answer to request {} of {} markers lacked {:?}",
        kafka.version(),
        o.requests,
        MARKERS,
        o.first_missing
    );
    assert_eq!(
        o.incomplete,
        1,
        "{}: every one of {} answers covered its markers; is KAFKA-17877 fixed in this release?",
        kafka.version(),
        o.requests
    );
}
