//! Broker-free tests of one connection: framing over an in-memory pipe, several requests in flight,
//! cancellation, and every way the peer's bytes can go wrong.

use std::time::Duration;

use bytes::{BufMut, BytesMut};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    HeartbeatRequest, HeartbeatResponse, MetadataRequest, MetadataResponse, ResponseHeader,
    TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use proptest::prelude::*;

use super::conn::{ConnOptions, Connection};
use super::error::{ConnectionFailure, NetError};
use super::testing::{options, pair};
use crate::wire::WireError;

const LONG: Duration = Duration::from_secs(10);

fn topics_request(names: &[String]) -> MetadataRequest {
    MetadataRequest::default().with_topics(Some(
        names
            .iter()
            .map(|n| {
                MetadataRequestTopic::default()
                    .with_name(Some(TopicName(StrBytes::from_string(n.clone()))))
            })
            .collect(),
    ))
}

fn first_topic(request: &MetadataRequest) -> String {
    request.topics.as_ref().unwrap()[0]
        .name
        .as_ref()
        .unwrap()
        .0
        .to_string()
}

/// Polls `cond` until it holds, failing the test after a few seconds.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..500 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for: {what}");
}

fn spawn_request(
    conn: &Connection,
    request: MetadataRequest,
    timeout: Duration,
) -> tokio::task::JoinHandle<Result<MetadataResponse, NetError>> {
    let conn = conn.clone();
    tokio::spawn(async move { conn.request(&request, 12, timeout).await })
}

/// A request goes out as exactly one frame with its API key, version and client id, and its answer comes
/// back to the caller matched by correlation id, leaving nothing pending.
#[tokio::test]
async fn request_and_response_round_trip() {
    let (conn, mut peer) = pair(4096, options());
    let sent = topics_request(&["orders".into()]);
    let client = spawn_request(&conn, sent.clone(), LONG);

    let got = peer.next_request().await.unwrap();
    assert_eq!(got.header.request_api_key, 3);
    assert_eq!(got.header.request_api_version, 12);
    assert_eq!(got.header.client_id.as_deref(), Some("test-client"));
    let mut body = got.body;
    assert_eq!(MetadataRequest::decode(&mut body, 12).unwrap(), sent);
    assert!(
        body.is_empty(),
        "the request frame holds exactly one message"
    );

    let answer = MetadataResponse::default().with_cluster_id(Some("c-1".into()));
    peer.respond(got.header.correlation_id, &answer, 12).await;
    let response = client.await.unwrap().unwrap();
    assert_eq!(response.cluster_id.as_deref(), Some("c-1"));
    assert_eq!(conn.pending_len(), 0);
}

/// Responses are matched by correlation id, not by arrival order.
#[tokio::test]
async fn several_in_flight_answered_out_of_order() {
    let (conn, mut peer) = pair(4096, options());
    let names: Vec<String> = (0..4).map(|i| format!("topic-{i}")).collect();
    let clients: Vec<_> = names
        .iter()
        .map(|n| spawn_request(&conn, topics_request(std::slice::from_ref(n)), LONG))
        .collect();

    let mut received = Vec::new();
    for _ in 0..names.len() {
        let got = peer.next_request().await.unwrap();
        let mut body = got.body;
        let request = MetadataRequest::decode(&mut body, 12).unwrap();
        received.push((got.header.correlation_id, first_topic(&request)));
    }
    assert_eq!(conn.pending_len(), names.len());
    for (correlation_id, topic) in received.iter().rev() {
        let answer = MetadataResponse::default().with_cluster_id(Some(topic.clone().into()));
        peer.respond(*correlation_id, &answer, 12).await;
    }
    for (client, name) in clients.into_iter().zip(&names) {
        let response = client.await.unwrap().unwrap();
        assert_eq!(response.cluster_id.as_deref(), Some(name.as_str()));
    }
    assert_eq!(conn.pending_len(), 0);
}

/// A request future dropped while its frame is still being written leaves no partial frame on the wire:
/// the peer reads the whole frame, and the connection carries the next request normally.
#[tokio::test]
async fn request_dropped_mid_write_leaves_only_whole_frames() {
    // A 64-byte pipe and a ~6 KB request: the write cannot finish until the peer reads.
    let (conn, mut peer) = pair(64, options());
    let big: Vec<String> = (0..300)
        .map(|i| format!("a-long-topic-name-{i:05}"))
        .collect();
    let sent = topics_request(&big);
    let dropped =
        tokio::time::timeout(Duration::from_millis(100), conn.request(&sent, 12, LONG)).await;
    assert!(
        dropped.is_err(),
        "the request cannot complete while the pipe is full"
    );
    // The abandoned entry stays until its answer arrives, so a late answer is recognised.
    assert_eq!(conn.pending_len(), 1);

    let follow_up = spawn_request(&conn, topics_request(&["next".into()]), LONG);

    let first = peer.next_request().await.unwrap();
    let mut body = first.body;
    assert_eq!(MetadataRequest::decode(&mut body, 12).unwrap(), sent);
    assert!(body.is_empty());
    let second = peer.next_request().await.unwrap();
    let mut body = second.body;
    assert_eq!(
        first_topic(&MetadataRequest::decode(&mut body, 12).unwrap()),
        "next"
    );

    // The late answer to the dropped request is discarded, the live one is delivered.
    peer.respond(
        first.header.correlation_id,
        &MetadataResponse::default(),
        12,
    )
    .await;
    let answer = MetadataResponse::default().with_cluster_id(Some("ok".into()));
    peer.respond(second.header.correlation_id, &answer, 12)
        .await;
    let response = follow_up.await.unwrap().unwrap();
    assert_eq!(response.cluster_id.as_deref(), Some("ok"));
    assert!(conn.is_usable());
    eventually("no correlation entry left", || conn.pending_len() == 0).await;
}

/// A waiting request that is dropped does not leak its correlation entry: the entry goes when the
/// answer arrives, and the connection stays usable.
#[tokio::test]
async fn dropped_waiting_request_does_not_leak_its_entry() {
    let (conn, mut peer) = pair(4096, options());
    let client = spawn_request(&conn, topics_request(&["x".into()]), LONG);
    let got = peer.next_request().await.unwrap();
    client.abort();
    assert!(client.await.unwrap_err().is_cancelled());
    assert_eq!(conn.pending_len(), 1);

    peer.respond(got.header.correlation_id, &MetadataResponse::default(), 12)
        .await;
    eventually("entry removed once answered", || conn.pending_len() == 0).await;
    assert!(conn.is_usable());

    let again = spawn_request(&conn, topics_request(&["y".into()]), LONG);
    let got = peer.next_request().await.unwrap();
    peer.respond(got.header.correlation_id, &MetadataResponse::default(), 12)
        .await;
    again.await.unwrap().unwrap();
}

/// A dropped request whose answer never comes does not keep its entry forever: once its deadline has
/// passed the connection is reset and the entry is gone.
#[tokio::test]
async fn abandoned_request_never_answered_resets_the_connection() {
    let (conn, mut peer) = pair(4096, options());
    let client = spawn_request(
        &conn,
        topics_request(&["x".into()]),
        Duration::from_millis(150),
    );
    let _ = peer.next_request().await.unwrap();
    client.abort();
    let _ = client.await;
    assert_eq!(conn.pending_len(), 1);
    eventually("connection reset", || !conn.is_usable()).await;
    assert_eq!(conn.pending_len(), 0);
    assert!(matches!(
        conn.failure(),
        Some(ConnectionFailure::RequestTimedOut(_))
    ));
}

/// A request dropped while waiting for an in-flight slot leaves no entry at all.
#[tokio::test]
async fn request_dropped_while_waiting_for_a_slot_leaves_no_entry() {
    let (conn, mut peer) = pair(
        4096,
        ConnOptions {
            max_in_flight: 1,
            ..options()
        },
    );
    let first = spawn_request(&conn, topics_request(&["a".into()]), LONG);
    let got = peer.next_request().await.unwrap();
    // Only one request may be in flight, so this one waits for a slot and is dropped while waiting.
    let waiting = tokio::time::timeout(
        Duration::from_millis(50),
        conn.request(&topics_request(&["b".into()]), 12, LONG),
    )
    .await;
    assert!(waiting.is_err());
    assert_eq!(conn.pending_len(), 1);
    peer.respond(got.header.correlation_id, &MetadataResponse::default(), 12)
        .await;
    first.await.unwrap().unwrap();
    assert_eq!(conn.pending_len(), 0);
}

/// Waiting too long for an in-flight slot fails only that request (nothing was sent); the connection
/// and the requests holding the slots carry on.
#[tokio::test]
async fn timing_out_while_waiting_for_a_slot_keeps_the_connection() {
    let (conn, mut peer) = pair(
        4096,
        ConnOptions {
            max_in_flight: 1,
            ..options()
        },
    );
    let first = spawn_request(&conn, topics_request(&["a".into()]), LONG);
    let got = peer.next_request().await.unwrap();
    let err = conn
        .request(
            &topics_request(&["b".into()]),
            12,
            Duration::from_millis(50),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            NetError::Timeout {
                outcome_unknown: false,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(conn.is_usable());
    peer.respond(got.header.correlation_id, &MetadataResponse::default(), 12)
        .await;
    first.await.unwrap().unwrap();
}

/// A response for a correlation id nobody sent poisons the connection and fails every waiter with a
/// transport error whose outcome is unknown.
#[tokio::test]
async fn wrong_correlation_id_poisons_the_connection() {
    let (conn, mut peer) = pair(4096, options());
    let a = spawn_request(&conn, topics_request(&["a".into()]), LONG);
    let b = spawn_request(&conn, topics_request(&["b".into()]), LONG);
    let _ = peer.next_request().await.unwrap();
    let _ = peer.next_request().await.unwrap();
    peer.respond(999, &MetadataResponse::default(), 12).await;
    for client in [a, b] {
        match client.await.unwrap() {
            Err(NetError::Connection {
                failure: ConnectionFailure::UnexpectedCorrelationId(999),
                outcome_unknown: true,
                ..
            }) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(!conn.is_usable());
    assert_eq!(conn.pending_len(), 0);
    assert!(
        peer.next_frame().await.is_none(),
        "the client closed the socket"
    );
}

/// A length prefix above the maximum frame size is refused without waiting for (or allocating) the
/// announced bytes.
#[tokio::test]
async fn oversized_frame_length_is_refused() {
    let (conn, mut peer) = pair(4096, options());
    let client = spawn_request(&conn, topics_request(&["a".into()]), LONG);
    let _ = peer.next_request().await.unwrap();
    peer.send_raw(&i32::MAX.to_be_bytes()).await;
    match client.await.unwrap() {
        Err(NetError::Connection {
            failure: ConnectionFailure::Frame(WireError::FrameTooLarge { len, max }),
            ..
        }) => {
            assert_eq!(len, i32::MAX as usize);
            assert_eq!(max, 1 << 20);
        }
        other => panic!("unexpected {other:?}"),
    }
}

/// A negative frame length from the peer fails the waiting request with a typed framing error, never a
/// panic or an allocation.
#[tokio::test]
async fn negative_frame_length_poisons_the_connection() {
    let (conn, mut peer) = pair(4096, options());
    let client = spawn_request(&conn, topics_request(&["a".into()]), LONG);
    let _ = peer.next_request().await.unwrap();
    peer.send_raw(&(-1i32).to_be_bytes()).await;
    assert!(matches!(
        client.await.unwrap(),
        Err(NetError::Connection {
            failure: ConnectionFailure::Frame(WireError::NegativeFrameLength(-1)),
            ..
        })
    ));
    assert!(
        !conn.is_usable(),
        "a broken frame leaves the connection poisoned"
    );
}

/// A response body that does not decode is a typed protocol error; the framing is intact, so the
/// connection stays usable.
#[tokio::test]
async fn truncated_response_body_is_a_decode_error() {
    let (conn, mut peer) = pair(4096, options());
    let client = spawn_request(&conn, topics_request(&["a".into()]), LONG);
    let got = peer.next_request().await.unwrap();
    let mut frame = BytesMut::new();
    ResponseHeader::default()
        .with_correlation_id(got.header.correlation_id)
        .encode(&mut frame, 1)
        .unwrap();
    MetadataResponse::default()
        .with_cluster_id(Some("cluster".into()))
        .encode(&mut frame, 12)
        .unwrap();
    frame.truncate(frame.len() - 3);
    peer.send_frame(&frame).await;
    match client.await.unwrap() {
        Err(NetError::Protocol {
            source:
                WireError::Decode {
                    api_key: 3,
                    version: 12,
                    part: "body",
                    ..
                },
            ..
        }) => {}
        other => panic!("unexpected {other:?}"),
    }
    assert!(conn.is_usable());
}

/// A frame too short to carry a correlation id is refused as such.
#[tokio::test]
async fn frame_without_correlation_id_poisons_the_connection() {
    let (conn, mut peer) = pair(4096, options());
    let client = spawn_request(&conn, topics_request(&["a".into()]), LONG);
    let _ = peer.next_request().await.unwrap();
    peer.send_frame(&[1, 2]).await;
    assert!(matches!(
        client.await.unwrap(),
        Err(NetError::Connection {
            failure: ConnectionFailure::Frame(WireError::FrameTooShort { len: 2 }),
            ..
        })
    ));
    assert!(
        !conn.is_usable(),
        "a broken frame leaves the connection poisoned"
    );
}

/// The peer closing in the middle of a response fails the waiter with a transport error.
#[tokio::test]
async fn connection_closed_mid_response() {
    let (conn, mut peer) = pair(4096, options());
    let client = spawn_request(&conn, topics_request(&["a".into()]), LONG);
    let got = peer.next_request().await.unwrap();
    let mut frame = BytesMut::new();
    frame.put_i32(100);
    frame.put_i32(got.header.correlation_id);
    frame.put_slice(&[0; 10]);
    peer.send_raw(&frame).await;
    peer.close_write().await;
    match client.await.unwrap() {
        Err(
            e @ NetError::Connection {
                failure: ConnectionFailure::ClosedMidFrame,
                outcome_unknown: true,
                ..
            },
        ) => assert!(e.is_transport() && e.outcome_unknown()),
        other => panic!("unexpected {other:?}"),
    }
    assert!(!conn.is_usable());
}

/// The peer closing the connection between frames fails a request still waiting for its answer as
/// closed, rather than leaving it hanging.
#[tokio::test]
async fn connection_closed_between_frames() {
    let (conn, mut peer) = pair(4096, options());
    let client = spawn_request(&conn, topics_request(&["a".into()]), LONG);
    let _ = peer.next_request().await.unwrap();
    peer.close_write().await;
    assert!(matches!(
        client.await.unwrap(),
        Err(NetError::Connection {
            failure: ConnectionFailure::Closed,
            ..
        })
    ));
}

/// A request that times out resets the connection: the other waiters fail too (a late answer could
/// otherwise be paired with the wrong request), and the socket is closed.
#[tokio::test]
async fn request_timeout_resets_the_connection() {
    let (conn, mut peer) = pair(4096, options());
    let slow = spawn_request(
        &conn,
        topics_request(&["a".into()]),
        Duration::from_millis(100),
    );
    let other = spawn_request(&conn, topics_request(&["b".into()]), LONG);
    let _ = peer.next_request().await.unwrap();
    let _ = peer.next_request().await.unwrap();
    match slow.await.unwrap() {
        Err(
            e @ NetError::Timeout {
                outcome_unknown: true,
                ..
            },
        ) => assert!(e.is_transport()),
        other => panic!("unexpected {other:?}"),
    }
    assert!(matches!(
        other.await.unwrap(),
        Err(NetError::Connection {
            failure: ConnectionFailure::RequestTimedOut(_),
            ..
        })
    ));
    assert!(!conn.is_usable());
    assert!(
        peer.next_frame().await.is_none(),
        "the client closed the socket"
    );
    // A request on a poisoned connection fails at once and says it was never sent.
    let refused = conn
        .request(&topics_request(&["c".into()]), 12, LONG)
        .await
        .unwrap_err();
    assert!(!refused.outcome_unknown());
}

/// Dropping the last handle closes the socket.
#[tokio::test]
async fn dropping_the_connection_closes_the_socket() {
    let (conn, mut peer) = pair(4096, options());
    drop(conn);
    assert!(peer.next_frame().await.is_none());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever bytes the peer sends back, the request ends in a response or a typed error, never a
    /// panic. (Bodies of every response type are fuzzed by the `responses` target.)
    #[test]
    fn garbage_from_the_peer_never_panics(garbage in proptest::collection::vec(any::<u8>(), 0..40)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (conn, mut peer) = pair(4096, options());
            let c = conn.clone();
            let client = tokio::spawn(async move {
                c.request(&HeartbeatRequest::default(), 0, Duration::from_millis(300)).await
            });
            let _ = peer.next_request().await.unwrap();
            peer.send_raw(&garbage).await;
            peer.close_write().await;
            match client.await.unwrap() {
                Ok(HeartbeatResponse { .. }) => {}
                Err(e) => { let _ = e.to_string(); }
            }
        });
    }
}

/// A reader task that panics poisons the connection at once: the request waiting for the frame it was
/// handling fails with the reader's failure instead of waiting out its timeout, and the pool sees the
/// connection as unusable.
#[tokio::test]
async fn a_panicked_reader_poisons_the_connection() {
    let (conn, mut peer) = pair(4096, options());
    conn.faults().arm("reader", 1);
    let client = spawn_request(&conn, topics_request(&["a".into()]), LONG);
    let got = peer.next_request().await.unwrap();
    peer.respond(got.header.correlation_id, &MetadataResponse::default(), 12)
        .await;
    let result = tokio::time::timeout(LONG / 2, client)
        .await
        .expect("the waiter is failed before its own timeout")
        .unwrap();
    match result {
        Err(NetError::Connection {
            failure: ConnectionFailure::TaskFailed { task, failure },
            ..
        }) => {
            assert_eq!(task, "reader");
            assert!(failure.contains("injected fault at reader"), "{failure}");
        }
        other => panic!("expected the reader's failure, got {other:?}"),
    }
    assert!(!conn.is_usable());
}

/// A writer task that panics poisons the connection at once: the request whose frame it took off the
/// queue fails with the writer's failure instead of waiting out its timeout for an answer to a frame
/// that was never written.
#[tokio::test]
async fn a_panicked_writer_poisons_the_connection() {
    let (conn, _peer) = pair(4096, options());
    conn.faults().arm("writer", 1);
    let client = spawn_request(&conn, topics_request(&["a".into()]), LONG);
    let result = tokio::time::timeout(LONG / 2, client)
        .await
        .expect("the waiter is failed before its own timeout")
        .unwrap();
    match result {
        Err(NetError::Connection {
            failure: ConnectionFailure::TaskFailed { task, failure },
            ..
        }) => {
            assert_eq!(task, "writer");
            assert!(failure.contains("injected fault at writer"), "{failure}");
        }
        other => panic!("expected the writer's failure, got {other:?}"),
    }
    assert!(!conn.is_usable());
}

/// An exclusive hold waits for the requests in flight to be answered, sends its own while later
/// requests wait, and lets those go once dropped; the peer sees exactly that order. A hold that cannot
/// be had by its deadline holds nothing.
#[tokio::test]
async fn an_exclusive_hold_waits_for_requests_in_flight_and_holds_back_later_ones() {
    let (conn, mut peer) = pair(4096, options());
    let early = spawn_request(&conn, topics_request(&["early".into()]), LONG);
    let first = peer.next_request().await.unwrap();

    // Not while `early` is in flight.
    let soon = tokio::time::Instant::now() + Duration::from_millis(50);
    assert!(conn.exclusive(soon).await.is_none());
    let holder = {
        let conn = conn.clone();
        tokio::spawn(async move {
            conn.exclusive(tokio::time::Instant::now() + LONG)
                .await
                .expect("held once early is answered")
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    // Asked for after the hold: waits behind it.
    let late = spawn_request(&conn, topics_request(&["late".into()]), LONG);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!holder.is_finished(), "early is still in flight");
    peer.respond(
        first.header.correlation_id,
        &MetadataResponse::default(),
        12,
    )
    .await;
    early.await.unwrap().unwrap();
    let held = holder.await.unwrap();

    let own = {
        let request = topics_request(&["own".into()]);
        async move { held.request(&request, 12, LONG).await.map(|r| (r, held)) }
    };
    let own = tokio::spawn(own);
    let got = peer.next_request().await.unwrap();
    let mut body = got.body;
    assert_eq!(
        first_topic(&MetadataRequest::decode(&mut body, 12).unwrap()),
        "own",
        "the holder's request goes before the one that waits"
    );
    peer.respond(got.header.correlation_id, &MetadataResponse::default(), 12)
        .await;
    let (_, held) = own.await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!late.is_finished(), "held back while the hold lasts");
    drop(held);
    let got = peer.next_request().await.unwrap();
    let mut body = got.body;
    assert_eq!(
        first_topic(&MetadataRequest::decode(&mut body, 12).unwrap()),
        "late"
    );
    peer.respond(got.header.correlation_id, &MetadataResponse::default(), 12)
        .await;
    late.await.unwrap().unwrap();
    assert_eq!(conn.pending_len(), 0);
}
