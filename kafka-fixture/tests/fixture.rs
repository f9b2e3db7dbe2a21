//! Real-broker tests of the fixture itself: that the clusters it hands out are the Kafka releases and
//! feature levels they claim to be, that they are ready when handed out, and that node faults do what their
//! names say. Start-up times are printed (run with `--nocapture` to see them).

use std::time::{Duration, Instant};

use kafka_fixture::probe::{finalized_feature, max_version, Probe};
use kafka_fixture::{cluster, dedicated, unique, ClusterSpec, KafkaCluster};
use kafka_protocol::messages::consumer_group_heartbeat_response::ConsumerGroupHeartbeatResponse;
use kafka_protocol::messages::init_producer_id_response::InitProducerIdResponse;
use kafka_protocol::messages::{
    ApiKey, ConsumerGroupHeartbeatRequest, GroupId, InitProducerIdRequest, TopicName,
    TransactionalId,
};
use kafka_protocol::protocol::{Message as _, StrBytes};

const TIMEOUT: Duration = Duration::from_secs(5);

fn probe(kafka: &KafkaCluster, node: i32) -> Probe {
    Probe::connect(&kafka.node_address(node), TIMEOUT).expect("connect to a ready node")
}

fn report(what: &str, kafka: &KafkaCluster) {
    eprintln!(
        "fixture: {what}: Kafka {} at {} ready in {:.1}s",
        kafka.version(),
        kafka.bootstrap(),
        kafka.started_in().unwrap_or_default().as_secs_f64()
    );
}

/// Polls `check` until it returns true or `limit` passes; the failure message names `what`.
fn eventually(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let until = Instant::now() + limit;
    while !check() {
        assert!(
            Instant::now() < until,
            "timed out after {limit:?} waiting until {what}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Joins a fresh group with the KIP-848 ConsumerGroupHeartbeat and returns the error code: 0 when the broker
/// runs the consumer protocol, UNSUPPORTED_VERSION (35) when it only advertises the API.
fn consumer_protocol_join_error(p: &mut Probe) -> i16 {
    let version = p
        .version_for(
            ApiKey::ConsumerGroupHeartbeat,
            ConsumerGroupHeartbeatRequest::VERSIONS,
        )
        .expect("ConsumerGroupHeartbeat advertised");
    // v1 (KIP-1082) wants a client-made member id; v0 lets the coordinator make one.
    let member_id = if version >= 1 {
        unique("member")
    } else {
        String::new()
    };
    let request = ConsumerGroupHeartbeatRequest::default()
        .with_group_id(GroupId(StrBytes::from_string(unique("g"))))
        .with_member_id(StrBytes::from_string(member_id))
        .with_member_epoch(0)
        .with_rebalance_timeout_ms(30_000)
        .with_subscribed_topic_names(Some(vec![TopicName(StrBytes::from_string(unique("t")))]))
        .with_topic_partitions(Some(Vec::new()));
    let response: ConsumerGroupHeartbeatResponse = p
        .call(ApiKey::ConsumerGroupHeartbeat, version, &request)
        .expect("heartbeat answered");
    response.error_code
}

fn broker_ids_seen_by(kafka: &KafkaCluster, node: i32) -> Option<Vec<i32>> {
    Probe::connect(&kafka.node_address(node), TIMEOUT)
        .ok()?
        .broker_ids()
        .ok()
}

#[tokio::test]
async fn kafka4_single_node_is_ready_with_tv2_and_consumer_groups() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    // Ready means ready, for a fixture cluster and an external one alike: the first test to use it needs
    // no warm-up retries.
    let first = kafka.bootstrap().split(',').next().unwrap().to_owned();
    let mut p = Probe::connect(&first, TIMEOUT).expect("connect to a ready cluster");
    assert_eq!(p.broker_ids().unwrap(), kafka.node_ids());
    assert_eq!(p.find_coordinator(0, &unique("g")).unwrap().0, 0);
    assert_eq!(p.find_coordinator(1, &unique("tx")).unwrap().0, 0);
    if kafka.is_external() {
        return eprintln!("version checks skipped: SNAPFENCE_BOOTSTRAP names an external cluster");
    }
    report("kafka4 single node", &kafka);
    assert_eq!(
        kafka.version(),
        kafka_fixture::KafkaVersion::kafka4().as_str()
    );
    assert_eq!(kafka.node_ids(), vec![1]);
    assert_eq!(p.find_coordinator(0, &unique("g")).unwrap(), (0, 1));
    let versions = p.api_versions().unwrap();
    // 4.x formats with KIP-890 part 2 and KIP-848 finalized unless told otherwise.
    assert_eq!(finalized_feature(&versions, "transaction.version"), Some(2));
    assert_eq!(finalized_feature(&versions, "group.version"), Some(1));
    assert_eq!(consumer_protocol_join_error(&mut p), 0);
    // A transactional init answers at once: the readiness check waited for the producer-id block as
    // well as for `__transaction_state` (without it the first inits answered 14 for a second or two).
    let version = p
        .version_for(ApiKey::InitProducerId, InitProducerIdRequest::VERSIONS)
        .unwrap();
    let init = InitProducerIdRequest::default()
        .with_transactional_id(Some(TransactionalId(StrBytes::from_string(unique("tx")))))
        .with_transaction_timeout_ms(60_000);
    let answer: InitProducerIdResponse = p.call(ApiKey::InitProducerId, version, &init).unwrap();
    assert_eq!(answer.error_code, 0);
}

#[tokio::test]
async fn kafka4_formatted_tv1_finalizes_transaction_version_1() {
    let kafka = cluster(ClusterSpec::kafka4_tv1()).await;
    if kafka.is_external() {
        return eprintln!("skipped: SNAPFENCE_BOOTSTRAP names an external cluster");
    }
    report("kafka4 TV1", &kafka);
    let versions = probe(&kafka, 1).api_versions().unwrap();
    assert_eq!(finalized_feature(&versions, "transaction.version"), Some(1));
    assert_eq!(finalized_feature(&versions, "group.version"), Some(1));
}

#[tokio::test]
async fn kafka4_formatted_group_version_0_has_no_finalized_consumer_protocol() {
    let spec = ClusterSpec::kafka4()
        .with_transaction_version(2)
        .with_group_version(0);
    let kafka = cluster(spec).await;
    if kafka.is_external() {
        return eprintln!("skipped: SNAPFENCE_BOOTSTRAP names an external cluster");
    }
    report("kafka4 TV2 GV0", &kafka);
    let mut p = probe(&kafka, 1);
    let versions = p.api_versions().unwrap();
    assert_eq!(finalized_feature(&versions, "transaction.version"), Some(2));
    // Level 0 of a feature is "off": the broker leaves it out of the finalized list.
    assert_eq!(finalized_feature(&versions, "group.version"), None);
    // The API stays advertised, but the coordinator refuses the protocol.
    assert!(max_version(&versions, ApiKey::ConsumerGroupHeartbeat).is_some());
    assert_eq!(consumer_protocol_join_error(&mut p), 35);
}

/// 3.9 as it ships (the fixture's default 3.9): no KIP-890 part 2, and the consumer protocol refused
/// although its API is advertised.
#[tokio::test]
async fn kafka39_starts_as_it_ships() {
    let kafka = cluster(ClusterSpec::kafka39()).await;
    if kafka.is_external() {
        return eprintln!("skipped: SNAPFENCE_BOOTSTRAP names an external cluster");
    }
    report("kafka 3.9 single node", &kafka);
    assert!(kafka.version().starts_with("3.9."));
    let mut p = probe(&kafka, 1);
    let versions = p.api_versions().unwrap();
    // 3.9 predates KIP-890 part 2: transaction.version is never 2 there.
    assert!(finalized_feature(&versions, "transaction.version").unwrap_or(0) < 2);
    // 3.9 advertises ConsumerGroupHeartbeat either way and finalizes no group.version; without the
    // preview switch a join answers 35 UNSUPPORTED_VERSION.
    assert!(finalized_feature(&versions, "group.version").is_none());
    assert!(max_version(&versions, ApiKey::ConsumerGroupHeartbeat).is_some());
    assert_eq!(consumer_protocol_join_error(&mut p), 35);
    assert_eq!(p.find_coordinator(1, &unique("tx")).unwrap(), (0, 1));
}

/// 3.9 with the KIP-848 preview switched on (`group.coordinator.rebalance.protocols=classic,consumer`):
/// a consumer-protocol join succeeds.
#[tokio::test]
async fn kafka39_preview_accepts_the_consumer_protocol() {
    let kafka = cluster(ClusterSpec::kafka39_consumer_preview()).await;
    if kafka.is_external() {
        return eprintln!("skipped: SNAPFENCE_BOOTSTRAP names an external cluster");
    }
    assert!(kafka.version().starts_with("3.9."));
    let mut p = probe(&kafka, 1);
    assert_eq!(consumer_protocol_join_error(&mut p), 0);
}

#[tokio::test]
async fn three_nodes_survive_a_crash_and_the_restarted_node_rejoins() {
    let kafka = dedicated(ClusterSpec::three_nodes()).await;
    if kafka.is_external() {
        return eprintln!("skipped: SNAPFENCE_BOOTSTRAP names an external cluster");
    }
    report("three nodes", &kafka);
    assert_eq!(kafka.node_ids(), vec![1, 2, 3]);
    for node in [1, 2, 3] {
        assert_eq!(
            broker_ids_seen_by(&kafka, node),
            Some(vec![1, 2, 3]),
            "as seen by node {node}"
        );
    }

    kafka.kill(2);
    assert!(
        Probe::connect(&kafka.node_address(2), TIMEOUT).is_err(),
        "a killed node must refuse connections"
    );
    // The survivors keep answering and fence the dead broker once its 3 s session expires.
    eventually(
        "nodes 1 and 3 list only themselves",
        Duration::from_secs(30),
        || {
            broker_ids_seen_by(&kafka, 1) == Some(vec![1, 3])
                && broker_ids_seen_by(&kafka, 3) == Some(vec![1, 3])
        },
    );

    let began = Instant::now();
    kafka.restart(2).await;
    eprintln!(
        "fixture: node 2 restarted and rejoined in {:.1}s",
        began.elapsed().as_secs_f64()
    );
    for node in [1, 2, 3] {
        assert_eq!(
            broker_ids_seen_by(&kafka, node),
            Some(vec![1, 2, 3]),
            "as seen by node {node}"
        );
    }
}

#[tokio::test]
async fn a_paused_node_stops_answering_until_resumed_and_a_stopped_one_restarts() {
    let kafka = dedicated(ClusterSpec::kafka4()).await;
    if kafka.is_external() {
        return eprintln!("skipped: SNAPFENCE_BOOTSTRAP names an external cluster");
    }
    report("dedicated single node", &kafka);
    let mut before = probe(&kafka, 1);
    assert_eq!(before.broker_ids().unwrap(), vec![1]);

    kafka.pause(1);
    // The kernel still completes the TCP handshake of a stopped process, so the symptom is silence.
    let mut paused = Probe::connect(&kafka.node_address(1), Duration::from_secs(2))
        .expect("a stopped JVM's listen socket still accepts");
    let err = paused
        .broker_ids()
        .expect_err("a paused broker must not answer");
    assert!(
        matches!(err, kafka_fixture::probe::ProbeError::Io { .. }),
        "{err}"
    );

    kafka.resume(1);
    // The same connection as before the pause works again: the process was frozen, not restarted.
    assert_eq!(before.broker_ids().unwrap(), vec![1]);

    // SIGTERM: a controlled shutdown that ends the JVM by itself, then the node comes back on its data.
    let first_pid = kafka.node_pid(1).unwrap();
    assert!(
        kafka.stop(1),
        "the broker did not exit within 60 s of SIGTERM"
    );
    assert!(!jvm_alive(first_pid));
    assert!(Probe::connect(&kafka.node_address(1), TIMEOUT).is_err());
    kafka.restart(1).await;
    assert_ne!(kafka.node_pid(1), Some(first_pid));
    assert_eq!(probe(&kafka, 1).broker_ids().unwrap(), vec![1]);

    // Dropping a dedicated cluster stops it at once.
    let (address, pid) = (kafka.node_address(1), kafka.node_pid(1).unwrap());
    drop(kafka);
    assert!(
        !jvm_alive(pid),
        "JVM {pid} survived the drop of its cluster"
    );
    assert!(
        Probe::connect(&address, TIMEOUT).is_err(),
        "{address} still accepts after the drop"
    );
}

/// A stand-in test process: the kafka-fixture binary holding one node, with a private cache folder (sharing
/// the jars), so no other test process's stale-pid sweep can kill its JVM and make a test pass for the
/// wrong reason. Returns the process, its JVM's pid and the private cache.
fn start_holder() -> (std::process::Child, u32, std::path::PathBuf) {
    use std::io::BufRead as _;
    kafka_fixture::libs_dir(&kafka_fixture::KafkaVersion::kafka4()).expect("jars");
    let private = std::env::temp_dir().join(unique("snapfence-cache"));
    std::fs::create_dir_all(&private).unwrap();
    std::os::unix::fs::symlink(
        kafka_fixture::cache_root().join("kafka"),
        private.join("kafka"),
    )
    .unwrap();
    // Starts a node, reports the JVM's pid, then waits to be killed.
    let mut holder = std::process::Command::new(env!("CARGO_BIN_EXE_kafka-fixture"))
        .args(["4", "hold=600"])
        .env("SNAPFENCE_CACHE", &private)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the kafka-fixture binary");
    let stdout = std::io::BufReader::new(holder.stdout.take().unwrap());
    let mut jvm = None;
    for line in stdout.lines() {
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix("node 1 pid ") {
            jvm = rest
                .split_whitespace()
                .next()
                .and_then(|p| p.parse::<u32>().ok());
            break;
        }
    }
    let jvm = jvm.expect("kafka-fixture printed its JVM pid");
    assert!(jvm_alive(jvm), "the JVM runs while its owner does");
    (holder, jvm, private)
}

/// Waits up to 15 s for `jvm` to die; SIGKILLs it if it did not, and returns whether it survived.
fn survives(jvm: u32) -> bool {
    let gone = Instant::now() + Duration::from_secs(15);
    while jvm_alive(jvm) && Instant::now() < gone {
        std::thread::sleep(Duration::from_millis(100));
    }
    let survived = jvm_alive(jvm);
    if survived {
        // Leave nothing behind even when failing.
        force_kill(jvm);
    }
    survived
}

#[test]
fn no_jvm_outlives_a_killed_test_process() {
    if std::env::var_os("SNAPFENCE_BOOTSTRAP").is_some() {
        return eprintln!("skipped: SNAPFENCE_BOOTSTRAP names an external cluster");
    }
    let (mut holder, jvm, private) = start_holder();

    // SIGKILL: no destructor, no atexit hook; only the parent-death signal can take the JVM down.
    holder.kill().unwrap();
    holder.wait().unwrap();
    let survived = survives(jvm);
    let _ = std::fs::remove_dir_all(&private);
    assert!(
        !survived,
        "JVM {jvm} outlived the SIGKILLed process that started it"
    );
}

/// SIGTERM (`timeout`, a CI cancel) runs the fixture's cleanup before the signal ends the process: the JVM
/// is killed and the run folder with the broker's data deleted, not left for a later run's sweep.
#[test]
fn a_sigtermed_test_process_takes_its_jvm_and_run_folder_along() {
    if std::env::var_os("SNAPFENCE_BOOTSTRAP").is_some() {
        return eprintln!("skipped: SNAPFENCE_BOOTSTRAP names an external cluster");
    }
    use std::os::unix::process::ExitStatusExt as _;
    let (mut holder, jvm, private) = start_holder();
    let run = private.join("run");
    let before: Vec<_> = std::fs::read_dir(&run).unwrap().flatten().collect();
    assert_eq!(before.len(), 1, "one run folder while the holder runs");

    // SAFETY: kill has no memory effects.
    unsafe {
        libc::kill(holder.id() as libc::pid_t, libc::SIGTERM);
    }
    let until = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = holder.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= until {
            let _ = holder.kill();
            break holder.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let survived = survives(jvm);
    let left: Vec<_> = std::fs::read_dir(&run)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    let _ = std::fs::remove_dir_all(&private);
    assert_eq!(
        status.signal(),
        Some(libc::SIGTERM),
        "the holder should end killed by SIGTERM, not {status}"
    );
    assert!(!survived, "JVM {jvm} outlived the SIGTERMed process");
    assert!(left.is_empty(), "SIGTERM left {left:?} behind");
}

fn force_kill(pid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status();
}

/// True while `pid` exists and is not a zombie (a dead JVM can linger as one if PID 1 does not reap).
fn jvm_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next());
            state != Some("Z")
        }
        Err(_) => false,
    }
}
