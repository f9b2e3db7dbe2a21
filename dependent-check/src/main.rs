//! Hostile counts against snapfence, from a crate outside its workspace.
//!
//! The invariant: in a program that merely depends on snapfence, a response whose body announces far
//! more elements or bytes than the frame holds is a typed error, never an abort (an allocation failure),
//! a panic, a hang or a success. Inside snapfence's workspace the unit tests prove it for the decoders;
//! this program proves that the bounded decoder is what a dependent actually links.
//!
//! It starts a stub broker on 127.0.0.1:0 in this process and, through snapfence's public API only,
//! makes the client send each request type whose response it decodes (the list in snapfence's
//! `src/wire/decoded.rs`). The stub answers the prerequisites sanely (ApiVersions, Metadata naming the
//! stub as broker 0) and the API under test with a correct response header followed by `k` filler bytes
//! (0x00 or 0x01, k = 0..=24), a huge count (`i32` 0x7fffffff, `i16` 0x7fff, compact varint 2^31) and a
//! little junk, once at classic versions and once at flexible ones (the stub advertises only those).
//!
//! ApiVersions is reached through `Client::connect`, Metadata through `connect` (which reads the broker
//! list) and `metadata_all`; every other type through `Client::send_once`, the public call the producer,
//! consumer and admin paths are built on, which decodes through the same function.
//!
//! Peak RSS (VmHWM) must stay under `DEPENDENT_CHECK_MAX_RSS_MIB` (default 256); the script also runs
//! this under `ulimit -v`. Prints one line per API and a final `N passed, N failed`.
//!
//! # References
//! - Kafka protocol guide: <https://kafka.apache.org/protocol.html> (frames, headers, API keys)
//! - KIP-482 (flexible versions, compact counts, tagged fields), KIP-511 (ApiVersions fallback to v0)

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{BufMut, BytesMut};
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::metadata_response::MetadataResponseBroker;
use kafka_protocol::messages::{ApiKey, ApiVersionsResponse, BrokerId, MetadataResponse};
use kafka_protocol::protocol::{Encodable, StrBytes};
use sf_kafka_protocol::messages as req;
use snapfence::net::{Client, ClientConfig, NetError, Target};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const API_VERSIONS: i16 = 18;
const METADATA: i16 = 3;
/// UNSUPPORTED_VERSION: the answer that makes the client retry ApiVersions at an older version.
const UNSUPPORTED_VERSION: i16 = 35;

/// Every response snapfence decodes (`DECODED_API_KEYS` in snapfence's `src/wire/decoded.rs`).
const DECODED: &[(i16, &str)] = &[
    (0, "Produce"),
    (1, "Fetch"),
    (2, "ListOffsets"),
    (3, "Metadata"),
    (8, "OffsetCommit"),
    (9, "OffsetFetch"),
    (10, "FindCoordinator"),
    (11, "JoinGroup"),
    (12, "Heartbeat"),
    (13, "LeaveGroup"),
    (14, "SyncGroup"),
    (15, "DescribeGroups"),
    (17, "SaslHandshake"),
    (18, "ApiVersions"),
    (19, "CreateTopics"),
    (20, "DeleteTopics"),
    (22, "InitProducerId"),
    (24, "AddPartitionsToTxn"),
    (25, "AddOffsetsToTxn"),
    (26, "EndTxn"),
    (27, "WriteTxnMarkers"),
    (28, "TxnOffsetCommit"),
    (32, "DescribeConfigs"),
    (36, "SaslAuthenticate"),
    (61, "DescribeProducers"),
    (65, "DescribeTransactions"),
    (66, "ListTransactions"),
    (68, "ConsumerGroupHeartbeat"),
];

/// How long one case may take before it counts as a hang.
const CASE_TIMEOUT: Duration = Duration::from_secs(5);

/// What the stub does right now. Cases run one at a time, so one shared value is enough.
#[derive(Default)]
struct Scenario {
    /// The API answered with `body`; every other request gets a sane answer.
    target: i16,
    /// The highest version of `target` the stub advertises (so the client sends exactly it).
    cap: i16,
    body: Vec<u8>,
    /// Hostile bodies written for the current case: a case whose request never reached the stub
    /// (an encode error, say) proves nothing and fails.
    served: u32,
}

type Shared = Arc<Mutex<Scenario>>;

fn lock(s: &Shared) -> std::sync::MutexGuard<'_, Scenario> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

/// The client's version range for `key`, as snapfence publishes it.
fn client_range(key: i16) -> (i16, i16) {
    let r = snapfence::wire::client_versions(key).expect("a decoded api key");
    (r.min, r.max)
}

/// The versions the client really sends `key` at: its Metadata request asks for no auto-creation, a
/// field that exists from v4 (below that it fails to encode, so a broker offering only v1-v3 is refused
/// before anything is sent).
fn sent_range(key: i16) -> (i16, i16) {
    let (min, max) = client_range(key);
    if key == METADATA {
        return (min.max(4), max);
    }
    (min, max)
}

/// Whether `key`'s response at `version` is flexible (compact counts, tagged fields).
fn flexible(key: i16, version: i16) -> bool {
    if key == API_VERSIONS {
        // Its response header stays v0 at every version (KIP-511) but the body is compact from v3.
        return version >= 3;
    }
    ApiKey::try_from(key)
        .expect("known key")
        .response_header_version(version)
        >= 1
}

fn response_header_version(key: i16, version: i16) -> i16 {
    ApiKey::try_from(key)
        .expect("known key")
        .response_header_version(version)
}

fn frame(correlation_id: i32, header_version: i16, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 9);
    let len = 4 + usize::from(header_version >= 1) + body.len();
    out.put_i32(len as i32);
    out.put_i32(correlation_id);
    if header_version >= 1 {
        out.put_u8(0); // no tagged fields
    }
    out.extend_from_slice(body);
    out
}

fn encode(message: &impl Encodable, version: i16) -> Vec<u8> {
    let mut b = BytesMut::new();
    message.encode(&mut b, version).expect("stub encodes");
    b.to_vec()
}

fn api_versions_body(s: &Scenario, version: i16, error_code: i16) -> Vec<u8> {
    let keys = DECODED
        .iter()
        .map(|&(key, _)| {
            let (min, mut max) = client_range(key);
            if key == s.target {
                max = s.cap;
            }
            ApiVersion::default()
                .with_api_key(key)
                .with_min_version(min)
                .with_max_version(max)
        })
        .collect();
    encode(
        &ApiVersionsResponse::default()
            .with_error_code(error_code)
            .with_api_keys(keys),
        version,
    )
}

fn metadata_body(port: u16, version: i16) -> Vec<u8> {
    let broker = MetadataResponseBroker::default()
        .with_node_id(BrokerId(0))
        .with_host(StrBytes::from_static_str("127.0.0.1"))
        .with_port(i32::from(port));
    encode(
        &MetadataResponse::default()
            .with_brokers(vec![broker])
            .with_cluster_id(Some(StrBytes::from_static_str("stub")))
            .with_controller_id(BrokerId(0)),
        version,
    )
}

/// The answer to one request, or `None` to close the connection.
fn answer(s: &Shared, port: u16, key: i16, version: i16, correlation_id: i32) -> Option<Vec<u8>> {
    let mut s = lock(s);
    if key == s.target {
        if key == API_VERSIONS && version > s.cap {
            // As a broker does (KIP-511): refuse in a v0 body naming the versions it has.
            let body = api_versions_body(&s, 0, UNSUPPORTED_VERSION);
            return Some(frame(correlation_id, 0, &body));
        }
        s.served += 1;
        return Some(frame(
            correlation_id,
            response_header_version(key, version),
            &s.body,
        ));
    }
    let body = match key {
        API_VERSIONS => api_versions_body(&s, version, 0),
        METADATA => metadata_body(port, version),
        _ => return None,
    };
    Some(frame(
        correlation_id,
        response_header_version(key, version),
        &body,
    ))
}

async fn serve(mut conn: TcpStream, s: Shared, port: u16) {
    loop {
        let mut len = [0u8; 4];
        if conn.read_exact(&mut len).await.is_err() {
            return;
        }
        let len = i32::from_be_bytes(len);
        if !(8..=1 << 20).contains(&len) {
            return;
        }
        let mut request = vec![0u8; len as usize];
        if conn.read_exact(&mut request).await.is_err() {
            return;
        }
        let key = i16::from_be_bytes([request[0], request[1]]);
        let version = i16::from_be_bytes([request[2], request[3]]);
        let correlation_id = i32::from_be_bytes([request[4], request[5], request[6], request[7]]);
        let Some(reply) = answer(&s, port, key, version, correlation_id) else {
            return;
        };
        if conn.write_all(&reply).await.is_err() {
            return;
        }
    }
}

#[derive(Clone, Copy)]
enum Count {
    I32,
    I16,
    Varint,
}

impl Count {
    fn bytes(self) -> &'static [u8] {
        match self {
            Count::I32 => &[0x7f, 0xff, 0xff, 0xff],
            Count::I16 => &[0x7f, 0xff],
            // 2^31 as an unsigned varint: a compact count of 2^31 - 1 elements.
            Count::Varint => &[0x80, 0x80, 0x80, 0x80, 0x08],
        }
    }
}

/// `k` filler bytes, the count, then junk. The junk is long enough that no body is a well-formed
/// fixed-size response (InitProducerId v0 is 16 bytes of plain integers; without it, a count that
/// lands in `throttle_time_ms` at the right `k` would simply decode), and its bytes read as counts or
/// lengths are again larger than what follows them.
fn hostile_body(filler: u8, k: usize, count: Count) -> Vec<u8> {
    let mut body = vec![filler; k];
    body.extend_from_slice(count.bytes());
    body.extend(1..=32u8);
    body
}

fn config(port: u16) -> ClientConfig {
    ClientConfig {
        request_timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(2),
        retry_backoff: Duration::from_millis(1),
        retry_backoff_max: Duration::from_millis(1),
        max_retries: 0,
        ..ClientConfig::new(format!("127.0.0.1:{port}"))
    }
}

type Outcome = Result<(), NetError>;
type CaseFuture = Pin<Box<dyn Future<Output = Outcome> + Send>>;

/// Sends one request of type `$req` (built by `$build`) once and drops the decoded answer.
macro_rules! send_once {
    ($client:expr, $build:expr) => {{
        let client = $client;
        Box::pin(async move { client.send_once(Target::Any, |_| $build).await.map(drop) })
            as CaseFuture
    }};
}

/// The public call that makes the client send `key` and decode its answer.
async fn drive(key: i16, port: u16) -> Outcome {
    let client = Client::connect(config(port)).await?;
    if key == METADATA {
        return client.metadata_all().await.map(drop);
    }
    let c = client.clone();
    let call: CaseFuture = match key {
        0 => send_once!(c, req::ProduceRequest::default().with_acks(-1)),
        1 => send_once!(c, req::FetchRequest::default()),
        2 => send_once!(c, req::ListOffsetsRequest::default()),
        8 => send_once!(c, req::OffsetCommitRequest::default()),
        9 => send_once!(c, req::OffsetFetchRequest::default()),
        10 => send_once!(c, req::FindCoordinatorRequest::default()),
        11 => send_once!(c, req::JoinGroupRequest::default()),
        12 => send_once!(c, req::HeartbeatRequest::default()),
        13 => send_once!(c, req::LeaveGroupRequest::default()),
        14 => send_once!(c, req::SyncGroupRequest::default()),
        15 => send_once!(c, req::DescribeGroupsRequest::default()),
        17 => send_once!(c, req::SaslHandshakeRequest::default()),
        19 => send_once!(c, req::CreateTopicsRequest::default()),
        20 => send_once!(c, req::DeleteTopicsRequest::default()),
        22 => send_once!(c, req::InitProducerIdRequest::default()),
        24 => send_once!(c, req::AddPartitionsToTxnRequest::default()),
        25 => send_once!(c, req::AddOffsetsToTxnRequest::default()),
        26 => send_once!(c, req::EndTxnRequest::default()),
        27 => send_once!(c, req::WriteTxnMarkersRequest::default()),
        28 => send_once!(c, req::TxnOffsetCommitRequest::default()),
        32 => send_once!(c, req::DescribeConfigsRequest::default()),
        36 => send_once!(c, req::SaslAuthenticateRequest::default()),
        61 => send_once!(c, req::DescribeProducersRequest::default()),
        65 => send_once!(c, req::DescribeTransactionsRequest::default()),
        66 => send_once!(c, req::ListTransactionsRequest::default()),
        68 => send_once!(c, req::ConsumerGroupHeartbeatRequest::default()),
        _ => unreachable!("api key {key} has no driver"),
    };
    call.await
}

/// Whether `err` is the answer a hostile body deserves: the client read the frame and rejected it.
/// A timeout would mean it never saw (or never finished reading) the answer: a hang, not a rejection.
fn is_rejection(err: &NetError) -> bool {
    match err {
        NetError::Protocol { .. } => true,
        NetError::RetriesExhausted { last, .. } => is_rejection(last),
        _ => false,
    }
}

fn vm_hwm_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let started = Instant::now();
    let max_rss_mib: u64 = std::env::var("DEPENDENT_CHECK_MAX_RSS_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("local addr").port();
    let shared: Shared = Arc::default();
    {
        let shared = shared.clone();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(serve(conn, shared.clone(), port));
            }
        });
    }

    let (mut passed, mut failed) = (0u32, 0u32);
    for &(key, name) in DECODED {
        let (min, max) = sent_range(key);
        let (mut cases, mut api_failed) = (0u32, 0u32);
        let mut first_error = None;
        let mut encodings = Vec::new();
        for flex in [false, true] {
            let versions: Vec<i16> = (min..=max).filter(|&v| flexible(key, v) == flex).collect();
            if versions.is_empty() {
                continue;
            }
            encodings.push(format!(
                "{} v{}..v{}",
                if flex { "flexible" } else { "classic" },
                versions[0],
                versions[versions.len() - 1]
            ));
            let mut i = 0usize;
            for filler in [0x00u8, 0x01] {
                for k in 0..=24usize {
                    for count in [Count::I32, Count::I16, Count::Varint] {
                        // Spread the cases over the versions rather than multiply them.
                        let version = versions[i % versions.len()];
                        i += 1;
                        {
                            let mut s = lock(&shared);
                            s.target = key;
                            s.cap = version;
                            s.body = hostile_body(filler, k, count);
                            s.served = 0;
                        }
                        cases += 1;
                        let case = tokio::spawn(drive(key, port));
                        let verdict = match tokio::time::timeout(CASE_TIMEOUT, case).await {
                            Err(_) => Err(format!("no answer within {CASE_TIMEOUT:?}")),
                            Ok(Err(join)) => Err(format!("panicked: {join}")),
                            Ok(Ok(Ok(()))) => Err("decoded Ok".to_owned()),
                            Ok(Ok(Err(err))) if lock(&shared).served == 0 => {
                                Err(format!("the hostile body was never served: {err}"))
                            }
                            Ok(Ok(Err(err))) if !is_rejection(&err) => {
                                Err(format!("not a decode rejection: {err}"))
                            }
                            Ok(Ok(Err(err))) => {
                                first_error
                                    .get_or_insert_with(|| err.to_string().trim_end().to_owned());
                                Ok(())
                            }
                        };
                        if let Err(why) = verdict {
                            api_failed += 1;
                            if api_failed <= 3 {
                                eprintln!(
                                    "FAIL api {key} {name} v{version} filler {filler:#04x} k={k} {:02x?}: {why}",
                                    count.bytes()
                                );
                            }
                        }
                    }
                }
            }
        }
        passed += cases - api_failed;
        failed += api_failed;
        println!(
            "api {key:>2} {name:<22} {cases:>3} cases ({}): {}{}",
            encodings.join(", "),
            if api_failed == 0 {
                "all typed errors".to_owned()
            } else {
                format!("{api_failed} FAILED")
            },
            first_error
                .map(|e| format!("; e.g. {e}"))
                .unwrap_or_default()
        );
    }

    let hwm = vm_hwm_kib();
    match hwm {
        Some(kib) if kib / 1024 < max_rss_mib => {
            println!("peak RSS {} MiB (bound {max_rss_mib} MiB)", kib / 1024)
        }
        Some(kib) => {
            println!(
                "peak RSS {} MiB exceeds the bound of {max_rss_mib} MiB",
                kib / 1024
            );
            failed += 1;
        }
        None => {
            println!("peak RSS unknown (no VmHWM in /proc/self/status)");
            failed += 1;
        }
    }
    println!("run time {:.1} s", started.elapsed().as_secs_f64());
    println!("{passed} passed, {failed} failed");
    std::process::exit(i32::from(failed > 0));
}
