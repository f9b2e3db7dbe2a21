//! The `snapfence` tool against real Kafka brokers started by the protocol-tests fixture.
//!
//! Transactions are made by the Java client (`protocol-tests/java/TxnPeer.java`, steered line by line),
//! except the hanging ones, which no correct client makes: those are written here with raw requests, a
//! transactional batch produced under a producer id whose coordinator never heard of the partition.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{InitProducerIdRequest, ProduceRequest, TopicName, TransactionalId};
use kafka_protocol::protocol::StrBytes;
use serde_json::Value;
use snapfence::net::{CallOptions, Client, ClientConfig, Target, Verdict};
use snapfence::producer::{
    Producer, ProducerConfig, ProducerRecord, TransactionalConfig, TransactionalProducer,
};
use snapfence::records::{BatchBuilder, Compression, NewRecord, ProducerStamp};
use snapfence::ErrorCode;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

use kafka_fixture::{cluster, unique, ClusterSpec, KafkaCluster};

const PEER_TIMEOUT: Duration = Duration::from_secs(180);

// ---- running the tool ---------------------------------------------------------------------------

struct Run {
    code: i32,
    out: String,
    err: String,
}

impl Run {
    /// The output as one JSON document.
    fn json(&self) -> Value {
        serde_json::from_str(&self.out)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}\nstderr: {}", self.out, self.err))
    }

    /// The output as JSON lines.
    fn json_lines(&self) -> Vec<Value> {
        self.out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect()
    }

    fn ok(self) -> Run {
        assert_eq!(
            self.code, 0,
            "exit {}\nstdout:\n{}\nstderr:\n{}",
            self.code, self.out, self.err
        );
        self
    }
}

/// Runs the tool in-process with `input` as the answers to its prompts.
async fn snapfence_with_input(kafka: &KafkaCluster, args: &[&str], input: &str) -> Run {
    snapfence_at(&kafka.bootstrap(), args, input).await
}

/// Runs the tool in-process against `bootstrap`, `args` after the global options, `input` as the answers
/// to its prompts.
async fn snapfence_at(bootstrap: &str, args: &[&str], input: &str) -> Run {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let mut input = input.as_bytes();
    let mut io = snapfence_cli::Io {
        out: &mut out,
        err: &mut err,
        input: &mut input,
        progress: false,
    };
    let argv = ["snapfence", "--bootstrap", bootstrap]
        .into_iter()
        .chain(args.iter().copied());
    let code = snapfence_cli::run(argv, &mut io).await;
    Run {
        code,
        out: String::from_utf8(out).expect("utf8 stdout"),
        err: String::from_utf8(err).expect("utf8 stderr"),
    }
}

async fn snapfence(kafka: &KafkaCluster, args: &[&str]) -> Run {
    snapfence_with_input(kafka, args, "").await
}

// ---- the cluster --------------------------------------------------------------------------------

async fn client(kafka: &KafkaCluster) -> Client {
    Client::connect(ClientConfig::new(kafka.bootstrap()))
        .await
        .expect("connect")
}

async fn new_topic(kafka: &KafkaCluster, prefix: &str, partitions: i32) -> String {
    let topic = unique(prefix);
    snapfence::admin::create_topic(&client(kafka).await, &topic, partitions, -1, &[])
        .await
        .expect("create topic");
    topic
}

/// The TV1 path with the leaders' KIP-890 part 1 check switched off: the only configuration in which a
/// transactional batch can land in a partition its coordinator was never told about.
fn unverified_tv1() -> ClusterSpec {
    ClusterSpec::kafka4_tv1().with_prop("transaction.partition.verification.enable", "false")
}

// ---- the Java peer ------------------------------------------------------------------------------

struct JavaPeer {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl JavaPeer {
    async fn start(
        kafka: &KafkaCluster,
        transactional_id: &str,
        topic: &str,
        partition: i32,
    ) -> Self {
        let source =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../protocol-tests/java/TxnPeer.java");
        let classpath = format!("{}/*", kafka.libs_dir().display());
        let mut child = tokio::process::Command::new("java")
            .args([
                "-XX:TieredStopAtLevel=1",
                "-XX:+UseSerialGC",
                "-cp",
                &classpath,
            ])
            .arg(&source)
            .args([
                &kafka.bootstrap(),
                transactional_id,
                topic,
                &partition.to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("run java (is a JDK on PATH?)");
        let stdin = child.stdin.take().expect("stdin");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut peer = JavaPeer {
            child,
            stdin,
            lines,
        };
        peer.expect("READY").await;
        peer
    }

    /// Waits for `want` on the peer's stdout (log lines in between are skipped).
    async fn expect(&mut self, want: &str) {
        let read = async {
            while let Some(line) = self.lines.next_line().await.expect("read peer") {
                if line.trim() == want {
                    return;
                }
                assert!(!line.starts_with("ERROR"), "java peer: {line}");
            }
            panic!("java peer exited before {want}");
        };
        tokio::time::timeout(PEER_TIMEOUT, read)
            .await
            .unwrap_or_else(|_| panic!("java peer: no {want} within {PEER_TIMEOUT:?}"));
    }

    async fn send(&mut self, command: &str, want: &str) {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .expect("write peer");
        self.stdin.flush().await.expect("flush peer");
        self.expect(want).await;
    }

    async fn quit(mut self) {
        self.send("quit", "BYE").await;
        let _ = tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await;
    }
}

// ---- raw requests for hanging transactions ------------------------------------------------------

/// InitProducerId: with a transactional id at its coordinator, or an idempotent producer id from any
/// broker. Returns (producer id, epoch).
async fn init_producer_id(c: &Client, transactional_id: Option<&str>) -> (i64, i16) {
    let target = match transactional_id {
        Some(id) => Target::transaction(id),
        None => Target::Any,
    };
    c.call(
        target,
        &CallOptions::default(),
        |_| {
            InitProducerIdRequest::default()
                .with_transactional_id(
                    transactional_id.map(|t| TransactionalId(StrBytes::from_string(t.into()))),
                )
                .with_transaction_timeout_ms(60_000)
                .with_producer_id((-1).into())
                .with_producer_epoch(-1)
        },
        |r, _| {
            Verdict::from_code(
                r.error_code,
                (r.error_code, r.producer_id.0, r.producer_epoch),
            )
        },
    )
    .await
    .map(|(code, id, epoch)| {
        assert_eq!(code, 0, "InitProducerId: {:?}", ErrorCode::from_code(code));
        (id, epoch)
    })
    .expect("InitProducerId")
}

/// Produces one transactional batch of `n` records stamped `timestamp` under (`producer_id`, `epoch`),
/// naming `transactional_id` in the request (the broker insists on one for transactional records) but
/// never sending AddPartitionsToTxn. Returns the partition's error code.
///
/// `produce_version` matters: Kafka 4.4 treats Produce v12+ as a KIP-890 part 2 client and adds the
/// partition to the transaction itself (whatever `transaction.version` is finalized), so only v11 or
/// below can leave the coordinator unaware of the partition.
#[allow(clippy::too_many_arguments)]
async fn produce_without_add_partitions(
    c: &Client,
    produce_version: i16,
    topic: &str,
    partition: i32,
    transactional_id: &str,
    producer_id: i64,
    epoch: i16,
    timestamp: i64,
    n: usize,
) -> ErrorCode {
    let mut builder = BatchBuilder::new(Compression::None, 1 << 20);
    for i in 0..n {
        let key = format!("ghost-{i}");
        let appended = builder
            .try_append(&NewRecord {
                timestamp,
                key: Some(key.as_bytes()),
                value: Some(b"never committed"),
                headers: &[],
            })
            .expect("append");
        assert!(appended);
    }
    let batch = builder
        .seal(ProducerStamp {
            producer_id,
            producer_epoch: epoch,
            base_sequence: 0,
            transactional: true,
        })
        .expect("seal");
    let options = CallOptions {
        max_version: Some(produce_version),
        ..CallOptions::default()
    };
    // A topic created a moment ago can answer NOT_LEADER_OR_FOLLOWER until its leader has loaded the
    // partition (seen once in CI); that answer wrote nothing, so the same batch is sent again.
    let mut attempts = 0;
    loop {
        let code = produce_once(c, &options, topic, partition, transactional_id, &batch).await;
        attempts += 1;
        if code != ErrorCode::NotLeaderOrFollower || attempts == 50 {
            return code;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn produce_once(
    c: &Client,
    options: &CallOptions,
    topic: &str,
    partition: i32,
    transactional_id: &str,
    batch: &snapfence::records::SealedBatch,
) -> ErrorCode {
    let (response, _) = c
        .call(
            Target::leader(topic, partition),
            options,
            |_| {
                ProduceRequest::default()
                    .with_transactional_id(Some(TransactionalId(StrBytes::from_string(
                        transactional_id.into(),
                    ))))
                    .with_acks(-1)
                    .with_timeout_ms(10_000)
                    .with_topic_data(vec![TopicProduceData::default()
                        .with_name(TopicName(StrBytes::from_string(topic.into())))
                        .with_partition_data(vec![PartitionProduceData::default()
                            .with_index(partition)
                            .with_records(Some(batch.bytes().clone()))])])
            },
            |r, v| Verdict::Done((r, v)),
        )
        .await
        .expect("produce");
    let code = response.responses[0].partition_responses[0].error_code;
    ErrorCode::from_code(code)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn partition(inspect: &Value, p: i64) -> &Value {
    inspect["partitions"]
        .as_array()
        .expect("partitions")
        .iter()
        .find(|x| x["partition"] == p)
        .unwrap_or_else(|| panic!("no partition {p} in {inspect}"))
}

/// `inspect --group` once no transaction is open in `topic`. The Java producer's commit returns when the
/// coordinator has decided, but the coordinator writes the markers afterwards, so for a moment the
/// partitions still show the transaction open.
async fn settled(kafka: &KafkaCluster, topic: &str, group: &str) -> Value {
    let until = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let state = snapfence(
            kafka,
            &["--format", "json", "inspect", topic, "--group", group],
        )
        .await
        .ok()
        .json();
        let open = state["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| !p["open_transactions"].as_array().unwrap().is_empty());
        if !open {
            return state;
        }
        assert!(
            std::time::Instant::now() < until,
            "markers not written within 30 s: {state}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---- inspect and dump ---------------------------------------------------------------------------

/// inspect and dump must show an open transaction as the LSO gap it causes, and after it ends, its marker
/// with HW == LSO; at read_committed, dump must mark the aborted transaction's batch as skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_and_dump_follow_a_transaction_from_open_to_commit_and_abort() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let topic = new_topic(&kafka, "cli-txn", 1).await;
    let group = unique("cli-group");
    let txn_id = unique("cli-tx");
    let mut peer = JavaPeer::start(&kafka, &txn_id, &topic, 0).await;
    peer.send("begin 3", "OPEN").await;
    peer.send(&format!("offsets {group} 42"), "OFFSETS").await;

    // Open: offsets 0..2 written, nothing stable.
    let open = snapfence(
        &kafka,
        &["--format", "json", "inspect", &topic, "--group", &group],
    )
    .await
    .ok()
    .json();
    let p0 = partition(&open, 0);
    assert_eq!(p0["high_watermark"], 3, "{open}");
    assert_eq!(p0["last_stable_offset"], 0, "{open}");
    assert_eq!(p0["hw_minus_lso"], 3, "{open}");
    let txns = p0["open_transactions"].as_array().unwrap();
    assert_eq!(txns.len(), 1, "{open}");
    assert_eq!(txns[0]["start_offset"], 0);
    assert_eq!(txns[0]["transactional_id"], txn_id.as_str(), "{open}");
    assert_eq!(txns[0]["coordinator_state"], "Ongoing", "{open}");
    // The offset commit rides in the transaction: not visible, but pending.
    assert_eq!(p0["committed"]["offset"], -1, "{open}");
    assert_eq!(p0["committed"]["pending_transaction"], true, "{open}");

    let text = snapfence(&kafka, &["inspect", &topic]).await.ok().out;
    assert!(text.contains(&txn_id) && text.contains("Ongoing"), "{text}");

    let dump = snapfence(&kafka, &["--format", "json", "dump", &topic, "-p", "0"])
        .await
        .ok()
        .json_lines();
    // The Java producer may split the three records over several batches.
    let (batches, summary) = dump.split_at(dump.len() - 1);
    assert!(!batches.is_empty(), "{dump:?}");
    assert!(
        batches
            .iter()
            .all(|b| b["type"] == "batch" && b["transactional"] == true),
        "{dump:?}"
    );
    let records: i64 = batches
        .iter()
        .map(|b| b["record_count"].as_i64().unwrap())
        .sum();
    assert_eq!(records, 3, "{dump:?}");
    assert_eq!(batches[0]["records"][0]["key"]["data"], "k0");
    let producer_id = batches[0]["producer_id"].as_i64().unwrap();
    assert_eq!(
        summary[0]["open_in_dump"][0]["producer_id"], producer_id,
        "{dump:?}"
    );
    // read_committed stops at the LSO: nothing to show yet.
    let rc = snapfence(
        &kafka,
        &[
            "--format",
            "json",
            "dump",
            &topic,
            "-p",
            "0",
            "--isolation",
            "read_committed",
        ],
    )
    .await
    .ok()
    .json_lines();
    assert_eq!(rc.len(), 1, "{rc:?}");
    assert_eq!(rc[0]["batches"], 0);
    assert_eq!(rc[0]["last_stable_offset"], 0);

    // Commit, then a second transaction that aborts.
    peer.send("commit", "COMMITTED").await;
    let done = settled(&kafka, &topic, &group).await;
    let p0 = partition(&done, 0);
    assert_eq!(
        p0["high_watermark"], 4,
        "data 0..2 and the COMMIT at 3: {done}"
    );
    assert_eq!(p0["last_stable_offset"], p0["high_watermark"], "{done}");
    assert_eq!(p0["open_transactions"].as_array().unwrap().len(), 0);
    assert_eq!(p0["committed"]["offset"], 42, "{done}");
    assert_eq!(p0["committed"]["pending_transaction"], false, "{done}");

    peer.send("begin 2", "OPEN").await;
    peer.send("abort", "ABORTED").await;
    peer.quit().await;
    settled(&kafka, &topic, &group).await;

    let rc = snapfence(
        &kafka,
        &[
            "--format",
            "json",
            "dump",
            &topic,
            "-p",
            "0",
            "--isolation",
            "read_committed",
        ],
    )
    .await
    .ok()
    .json_lines();
    let shape: Vec<(String, String)> = rc
        .iter()
        .filter(|l| l["type"] != "summary")
        .map(|l| {
            let t = l["type"].as_str().unwrap().to_owned();
            let what = if t == "marker" {
                l["marker"].as_str().unwrap().to_owned()
            } else {
                l["read_committed"].as_str().unwrap().to_owned()
            };
            (t, what)
        })
        .collect();
    let mut shape = shape;
    // Several data batches of one transaction read as one step.
    shape.dedup();
    let expected = [
        ("batch", "delivered"),
        ("marker", "COMMIT"),
        ("batch", "aborted"),
        ("marker", "ABORT"),
    ];
    assert_eq!(
        shape,
        expected.map(|(a, b)| (a.to_owned(), b.to_owned())),
        "{rc:?}"
    );
    let summary = rc.last().unwrap();
    let aborted: Vec<&Value> = rc
        .iter()
        .filter(|l| l["read_committed"] == "aborted")
        .collect();
    assert_eq!(summary["aborted_batches"], aborted.len(), "{rc:?}");
    let aborted_records: i64 = aborted
        .iter()
        .map(|b| b["record_count"].as_i64().unwrap())
        .sum();
    assert_eq!(aborted_records, 2, "{rc:?}");
    assert_eq!(summary["high_watermark"], 7);
    assert_eq!(summary["last_stable_offset"], 7);

    let text = snapfence(
        &kafka,
        &["dump", &topic, "-p", "0", "--isolation", "read_committed"],
    )
    .await
    .ok()
    .out;
    assert!(text.contains("COMMIT marker  offset 3"), "{text}");
    assert!(text.contains("ABORT marker  offset 6"), "{text}");
    assert!(text.contains("ABORTED, skipped"), "{text}");
    assert!(text.contains("key \"k0\"  value \"v0\""), "{text}");

    // --count and --offset bound the dump.
    let two = snapfence(
        &kafka,
        &[
            "--format", "json", "dump", &topic, "-p", "0", "-o", "3", "-n", "2",
        ],
    )
    .await
    .ok()
    .json_lines();
    assert_eq!(two.len(), 3, "{two:?}");
    assert_eq!(two[0]["marker"], "COMMIT");
    assert_eq!(two[1]["base_offset"], 4);
    assert_eq!(two[2]["stopped_at"], "count");
}

/// A topic, partition or offset that does not exist exits with the not-found status, naming the valid
/// range for a partition or offset, rather than failing generically.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_topics_partitions_and_offsets_fail_with_their_own_status() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let missing = unique("cli-missing");
    let r = snapfence(&kafka, &["inspect", &missing]).await;
    assert_eq!(r.code, snapfence_cli::error::EXIT_NOT_FOUND, "{}", r.err);
    assert!(
        r.err.contains("does not exist") && r.err.contains("next step"),
        "{}",
        r.err
    );

    let topic = new_topic(&kafka, "cli-bounds", 2).await;
    let r = snapfence(&kafka, &["dump", &topic, "-p", "5"]).await;
    assert_eq!(r.code, snapfence_cli::error::EXIT_NOT_FOUND, "{}", r.err);
    assert!(r.err.contains("between 0 and 1"), "{}", r.err);
    let r = snapfence(&kafka, &["dump", &topic, "-p", "0", "-o", "10"]).await;
    assert_eq!(r.code, snapfence_cli::error::EXIT_NOT_FOUND, "{}", r.err);
    assert!(r.err.contains("spans 0..0"), "{}", r.err);
}

/// `dump TOPIC` without `-p` must read every partition, in partition order, each line naming the
/// partition it came from, an empty partition included; `-p N` must still read that partition alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dump_without_a_partition_reads_every_partition_in_order() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let topic = new_topic(&kafka, "cli-all", 3).await;
    let producer = Producer::new(client(&kafka).await, ProducerConfig::default())
        .await
        .expect("producer");
    // Written to partition 2 first, so partition order is not write order; partition 1 stays empty.
    for (p, key) in [(2, "late"), (0, "early")] {
        let record = ProducerRecord::new(topic.as_str(), Some(Bytes::from_static(b"v")))
            .key(Bytes::copy_from_slice(key.as_bytes()))
            .partition(p);
        producer
            .send(record)
            .await
            .expect("send")
            .await
            .expect("delivered");
    }
    producer.close().await;

    let text = snapfence(&kafka, &["dump", &topic]).await.ok().out;
    let early = text.find("p0           0  key \"early\"").expect(&text);
    let late = text.find("p2           0  key \"late\"").expect(&text);
    assert!(early < late, "partition order: {text}");
    assert!(text.contains("-- p1: 0 batch(es)"), "{text}");
    assert!(
        text.trim_end().ends_with(&format!(
            "-- {topic}: 3 partition(s), 2 batch(es), 2 record(s), 0 COMMIT and 0 ABORT marker(s)"
        )),
        "{text}"
    );

    let lines = snapfence(&kafka, &["--format", "json", "dump", &topic])
        .await
        .ok()
        .json_lines();
    let seen: Vec<(String, i64)> = lines
        .iter()
        .filter(|l| l["type"] != "topic_summary")
        .map(|l| {
            (
                l["type"].as_str().unwrap().to_owned(),
                l["partition"].as_i64().unwrap(),
            )
        })
        .collect();
    let want = [
        ("batch", 0),
        ("summary", 0),
        ("summary", 1),
        ("batch", 2),
        ("summary", 2),
    ];
    assert_eq!(seen, want.map(|(t, p)| (t.to_owned(), p)), "{lines:?}");
    assert_eq!(lines.last().unwrap()["records"], 2, "{lines:?}");

    // One partition, as before: no tags, one summary, nothing from the others.
    let one = snapfence(&kafka, &["dump", &topic, "-p", "2"])
        .await
        .ok()
        .out;
    assert!(one.contains("         0  key \"late\""), "{one}");
    assert!(!one.contains("early") && !one.contains("p2  "), "{one}");
}

// ---- find-hanging -------------------------------------------------------------------------------

/// Two transactions no coordinator will ever end, in partitions 0 and 1 of `topic`, last written an hour
/// ago: p0 under a transactional id its coordinator knows (state Empty, without p0), p1 under an
/// idempotent producer id no coordinator has seen. Returns their producer ids.
async fn make_two_hanging(kafka: &KafkaCluster, topic: &str) -> (i64, i64) {
    let c = client(kafka).await;
    let an_hour_ago = now_ms() - 3_600_000;
    let lost_id = unique("cli-lost");
    let (pid_a, epoch_a) = init_producer_id(&c, Some(&lost_id)).await;
    let code =
        produce_without_add_partitions(&c, 11, topic, 0, &lost_id, pid_a, epoch_a, an_hour_ago, 2)
            .await;
    assert_eq!(
        code,
        ErrorCode::None,
        "the unverified broker takes the batch"
    );
    let (pid_b, epoch_b) = init_producer_id(&c, None).await;
    let code =
        produce_without_add_partitions(&c, 11, topic, 1, &lost_id, pid_b, epoch_b, an_hour_ago, 1)
            .await;
    assert_eq!(code, ErrorCode::None);
    (pid_a, pid_b)
}

/// The hanging transactions found in `topic`, as sorted (partition, producer id, reason).
fn hanging_in(found: &Value, topic: &str) -> Vec<(i64, i64, String)> {
    let mut hung: Vec<(i64, i64, String)> = found["hanging"]
        .as_array()
        .expect("hanging")
        .iter()
        .filter(|h| h["topic"] == topic)
        .map(|h| {
            (
                h["partition"].as_i64().unwrap(),
                h["producer_id"].as_i64().unwrap(),
                h["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    hung.sort();
    hung
}

/// find-hanging must report exactly the transactions no coordinator will end (KIP-664), not a healthy
/// long-running one, and --abort must bring the LSO of those partitions back to the high watermark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn find_hanging_reports_lost_transactions_but_not_a_live_one_and_abort_clears_them() {
    let kafka = cluster(unverified_tv1()).await;
    let topic = new_topic(&kafka, "cli-hang", 3).await;
    let (pid_a, pid_b) = make_two_hanging(&kafka, &topic).await;
    // p2: a healthy Java transaction, open and coordinated.
    let live_id = unique("cli-live");
    let mut peer = JavaPeer::start(&kafka, &live_id, &topic, 2).await;
    peer.send("begin 2", "OPEN").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // With a 1 s limit all three are candidates; the coordinator check keeps the live one out.
    let found = snapfence(
        &kafka,
        &[
            "--format",
            "json",
            "find-hanging",
            "--topic",
            &topic,
            "--max-transaction-timeout-ms",
            "1000",
        ],
    )
    .await
    .ok()
    .json();
    assert_eq!(found["open_transactions"], 3, "{found}");
    assert_eq!(found["candidates"], 3, "{found}");
    let expected = vec![
        (0, pid_a, "partition-not-in-transaction".to_owned()),
        (1, pid_b, "no-transactional-id".to_owned()),
    ];
    assert_eq!(hanging_in(&found, &topic), expected, "{found}");
    // At the default 15 minute limit the live transaction is not even a candidate.
    let default = snapfence(
        &kafka,
        &["--format", "json", "find-hanging", "--topic", &topic],
    )
    .await
    .ok()
    .json();
    assert_eq!(default["candidates"], 2, "{default}");
    // Scoped by broker (all topics that broker holds), the same two.
    let broker = kafka.node_ids()[0].to_string();
    let by_broker = snapfence(
        &kafka,
        &["--format", "json", "find-hanging", "--broker", &broker],
    )
    .await
    .ok()
    .json();
    assert_eq!(hanging_in(&by_broker, &topic), expected, "{by_broker}");
    let text = snapfence(&kafka, &["find-hanging", "--topic", &topic])
        .await
        .ok()
        .out;
    assert!(text.contains("2 hanging transaction(s)"), "{text}");

    // Declining the prompt leaves the log alone.
    let declined = snapfence_with_input(
        &kafka,
        &[
            "find-hanging",
            "--topic",
            &topic,
            "--partition",
            "0",
            "--abort",
        ],
        "n\n",
    )
    .await
    .ok();
    assert!(declined.err.contains("[y/N]"), "{}", declined.err);
    assert!(declined.out.contains("not aborted"), "{}", declined.out);
    let before = snapfence(&kafka, &["--format", "json", "inspect", &topic])
        .await
        .ok()
        .json();
    assert_eq!(partition(&before, 0)["hw_minus_lso"], 2, "{before}");

    // Confirmed on stdin for p0, then --yes for the rest.
    let aborted = snapfence_with_input(
        &kafka,
        &[
            "find-hanging",
            "--topic",
            &topic,
            "--partition",
            "0",
            "--abort",
        ],
        "y\n",
    )
    .await
    .ok();
    assert!(aborted.out.contains("aborted:"), "{}", aborted.out);
    let rest = snapfence(
        &kafka,
        &[
            "--format",
            "json",
            "find-hanging",
            "--topic",
            &topic,
            "--abort",
            "--yes",
        ],
    )
    .await
    .ok()
    .json();
    assert_eq!(rest["hanging"][0]["abort"]["result"], "aborted", "{rest}");
    let after = snapfence(&kafka, &["--format", "json", "inspect", &topic])
        .await
        .ok()
        .json();
    for p in [0, 1] {
        let s = partition(&after, p);
        assert_eq!(
            s["last_stable_offset"], s["high_watermark"],
            "p{p}: {after}"
        );
        assert_eq!(
            s["open_transactions"].as_array().unwrap().len(),
            0,
            "{after}"
        );
    }
    // The live transaction was not touched.
    assert_eq!(partition(&after, 2)["hw_minus_lso"], 2, "{after}");
    let dump = snapfence(&kafka, &["dump", &topic, "-p", "0"])
        .await
        .ok()
        .out;
    assert!(
        dump.contains(&format!("ABORT marker  offset 2  producer {pid_a}")),
        "{dump}"
    );
    let again = snapfence(
        &kafka,
        &["--format", "json", "find-hanging", "--topic", &topic],
    )
    .await
    .ok()
    .json();
    assert_eq!(hanging_in(&again, &topic), vec![], "{again}");

    peer.send("commit", "COMMITTED").await;
    peer.quit().await;
}

/// The same search and repair on Kafka 3.9 (no KIP-890 part 2 at all), where hanging transactions were
/// last possible with verification off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn find_hanging_and_abort_work_on_kafka_39() {
    let kafka = cluster(
        ClusterSpec::kafka39().with_prop("transaction.partition.verification.enable", "false"),
    )
    .await;
    let topic = new_topic(&kafka, "cli-hang39", 2).await;
    let (pid_a, pid_b) = make_two_hanging(&kafka, &topic).await;
    let found = snapfence(
        &kafka,
        &["--format", "json", "find-hanging", "--topic", &topic],
    )
    .await
    .ok()
    .json();
    assert_eq!(
        hanging_in(&found, &topic),
        vec![
            (0, pid_a, "partition-not-in-transaction".to_owned()),
            (1, pid_b, "no-transactional-id".to_owned()),
        ],
        "{found}"
    );
    snapfence(
        &kafka,
        &["find-hanging", "--topic", &topic, "--abort", "--yes"],
    )
    .await
    .ok();
    let after = snapfence(&kafka, &["--format", "json", "inspect", &topic])
        .await
        .ok()
        .json();
    for p in [0, 1] {
        let s = partition(&after, p);
        assert_eq!(s["hw_minus_lso"], 0, "p{p}: {after}");
    }
}

/// What the default Kafka 4 broker (transaction.version 2, verification on) lets a raw client build: a
/// transactional batch for a partition its coordinator was not told about is refused (Produce v11:
/// KIP-890 part 1 verification) or adds the partition to the transaction (v12: part 2), so nothing hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verifying_broker_does_not_let_a_transaction_hang() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let topic = new_topic(&kafka, "cli-verified", 2).await;
    let c = client(&kafka).await;
    let old = now_ms() - 3_600_000;

    let id = unique("cli-verified-tx");
    let (pid, epoch) = init_producer_id(&c, Some(&id)).await;
    let v11 = produce_without_add_partitions(&c, 11, &topic, 0, &id, pid, epoch, old, 1).await;
    assert_eq!(
        v11,
        ErrorCode::TransactionAbortable,
        "verification refuses it"
    );
    let v12 = produce_without_add_partitions(&c, 12, &topic, 1, &id, pid, epoch, old, 1).await;
    assert_eq!(v12, ErrorCode::None, "the leader adds the partition itself");

    let state = snapfence(&kafka, &["--format", "json", "inspect", &topic])
        .await
        .ok()
        .json();
    assert_eq!(partition(&state, 0)["hw_minus_lso"], 0, "{state}");
    let open = &partition(&state, 1)["open_transactions"][0];
    assert_eq!(open["transactional_id"], id.as_str(), "{state}");
    assert_eq!(open["coordinator_state"], "Ongoing", "{state}");
    let found = snapfence(
        &kafka,
        &["--format", "json", "find-hanging", "--topic", &topic],
    )
    .await
    .ok()
    .json();
    assert_eq!(
        found["candidates"], 1,
        "the old batch is a candidate: {found}"
    );
    assert_eq!(hanging_in(&found, &topic), vec![], "{found}");
}

/// Kafka 4.4 reads Produce v12 as a KIP-890 part 2 client even on a TV1 cluster with verification off:
/// the leader adds the partition to the transaction, so a raw v12 batch never hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_v12_joins_the_transaction_even_on_an_unverified_tv1_broker() {
    let kafka = cluster(unverified_tv1()).await;
    let topic = new_topic(&kafka, "cli-v12", 1).await;
    let c = client(&kafka).await;
    let id = unique("cli-v12-tx");
    let (pid, epoch) = init_producer_id(&c, Some(&id)).await;
    let code =
        produce_without_add_partitions(&c, 12, &topic, 0, &id, pid, epoch, now_ms() - 3_600_000, 1)
            .await;
    assert_eq!(code, ErrorCode::None);
    let state = snapfence(&kafka, &["--format", "json", "inspect", &topic])
        .await
        .ok()
        .json();
    let open = &partition(&state, 0)["open_transactions"][0];
    assert_eq!(open["transactional_id"], id.as_str(), "{state}");
    assert_eq!(open["coordinator_state"], "Ongoing", "{state}");
    let found = snapfence(
        &kafka,
        &["--format", "json", "find-hanging", "--topic", &topic],
    )
    .await
    .ok()
    .json();
    assert_eq!(found["candidates"], 1, "{found}");
    assert_eq!(hanging_in(&found, &topic), vec![], "{found}");
}

// ---- the binary ---------------------------------------------------------------------------------

/// The built binary reads the bootstrap from the environment, prints no progress when stderr is piped,
/// and exits non-zero with the cause on stderr.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_uses_the_environment_and_stays_quiet_when_piped() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let topic = new_topic(&kafka, "cli-bin", 2).await;
    let bin = env!("CARGO_BIN_EXE_snapfence");
    let out = tokio::process::Command::new(bin)
        .args(["inspect", &topic])
        .env("SNAPFENCE_BOOTSTRAP", kafka.bootstrap())
        .output()
        .await
        .expect("run snapfence");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("PARTITION") && stdout.contains("no open transactions"),
        "{stdout}"
    );
    assert!(
        !stderr.contains('\r') && !stdout.contains('\r'),
        "progress drawn into a pipe"
    );

    let out = tokio::process::Command::new(bin)
        .args(["--bootstrap", "127.0.0.1:1", "dump", &topic, "-p", "0"])
        .env_remove("SNAPFENCE_BOOTSTRAP")
        .output()
        .await
        .expect("run snapfence");
    assert_eq!(
        out.status.code(),
        Some(snapfence_cli::error::EXIT_UNREACHABLE)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot reach") && stderr.contains("next step"),
        "{stderr}"
    );
}

/// The binary's output into a pipe must be plain text (clap's parse errors and help included), and an
/// unreachable cluster's error must say each fact once. No broker: nothing listens on port 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_writes_plain_text_into_a_pipe_and_says_each_fact_once() {
    let bin = env!("CARGO_BIN_EXE_snapfence");
    let run = |args: &'static [&'static str]| async move {
        tokio::process::Command::new(bin)
            .args(args)
            .env_remove("SNAPFENCE_BOOTSTRAP")
            .output()
            .await
            .expect("run snapfence")
    };
    for args in [
        &["dump"][..],
        &["dump", "--bogus", "t"],
        &["--help"],
        &["dump", "--help"],
    ] {
        let out = run(args).await;
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(
            !stdout.is_empty() || !stderr.is_empty(),
            "{args:?}: no output"
        );
        assert!(
            !stdout.contains('\x1b') && !stderr.contains('\x1b'),
            "{args:?}: escape codes into a pipe: {stdout:?} {stderr:?}"
        );
    }

    let out = run(&["--bootstrap", "127.0.0.1:1", "dump", "nosuch"]).await;
    assert_eq!(
        out.status.code(),
        Some(snapfence_cli::error::EXIT_UNREACHABLE)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let first = stderr.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("error: cannot reach the Kafka cluster at 127.0.0.1:1: "),
        "{stderr}"
    );
    assert_eq!(first.matches("127.0.0.1:1").count(), 1, "{stderr}");
    assert!(!stderr.contains('\x1b'), "{stderr:?}");
}

// ---- recover --------------------------------------------------------------------------------------

/// Writes `records` to `topic`/0 in one transaction of `producer` and commits (or aborts) it.
async fn snapshot_txn(
    producer: &mut TransactionalProducer,
    topic: &str,
    records: &[(&str, Option<&str>)],
    commit: bool,
) {
    producer.begin().expect("begin");
    let mut deliveries = Vec::new();
    for (k, v) in records {
        let record = ProducerRecord::new(topic, v.map(|v| Bytes::copy_from_slice(v.as_bytes())))
            .key(Bytes::copy_from_slice(k.as_bytes()))
            .partition(0);
        deliveries.push(producer.send(record).await.expect("send"));
    }
    if commit {
        producer.commit().await.expect("commit");
        for d in deliveries {
            d.await.expect("delivered");
        }
    } else {
        // The records reach the log first, so the abort has something to abort.
        for d in deliveries {
            d.await.expect("delivered");
        }
        producer.abort().await.expect("abort");
    }
}

/// Waits until no transaction holds `topic`/0 back. A commit returns once the coordinator has decided;
/// its marker reaches the partition a moment later.
async fn markers_written(kafka: &KafkaCluster, topic: &str) {
    let until = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let state = snapfence(kafka, &["--format", "json", "inspect", topic])
            .await
            .ok()
            .json();
        if partition(&state, 0)["hw_minus_lso"] == 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < until,
            "markers not written within 30 s: {state}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `recover` must report what the next owner would recover (live keys after tombstones, keyed records
/// read, bytes, the captured target), never count an aborted transaction; with a transaction held open it
/// must stall, diagnose an open transaction with its next step and exit 6; and once that transaction
/// commits it must drain past the LSO to the target and say it waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recover_counts_a_snapshot_partition_and_diagnoses_an_open_transaction() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let c = client(&kafka).await;
    let topic = unique("cli-snaps");
    snapfence::admin::create_topic(&c, &topic, 1, -1, &[("cleanup.policy", "compact")])
        .await
        .expect("create topic");
    let mut owner =
        TransactionalProducer::init(c.clone(), TransactionalConfig::new(unique("owner")))
            .await
            .expect("init");
    // Live afterwards: a=3, c=4. Records: 5 (the tombstone counts), 9 bytes of keys and values. (A keyless
    // record, which recovery skips, cannot be written here: a compacted topic refuses it.)
    snapshot_txn(
        &mut owner,
        &topic,
        &[
            ("a", Some("1")),
            ("b", Some("2")),
            ("a", Some("3")),
            ("c", Some("4")),
            ("b", None),
        ],
        true,
    )
    .await;
    snapshot_txn(&mut owner, &topic, &[("d", Some("aborted"))], false).await;
    markers_written(&kafka, &topic).await;

    // These values were written without a flow's envelope: --raw shows them as stored.
    let done = snapfence(
        &kafka,
        &[
            "--format", "json", "recover", &topic, "-p", "0", "--keys", "--values", "--raw",
        ],
    )
    .await
    .ok()
    .json();
    assert_eq!(done["outcome"], "recovered", "{done}");
    assert_eq!(done["keys"], 2, "{done}");
    assert_eq!(done["records"], 5, "{done}");
    assert_eq!(done["bytes"], 9, "{done}");
    assert_eq!(done["waited_for_open_transactions"], false, "{done}");
    let keys: Vec<&str> = done["key_list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["key"]["data"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["a", "c"], "{done}");
    // --values: each key's latest snapshot, the overwrite and not the first write.
    let values: Vec<&str> = done["key_list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["value"]["data"].as_str().unwrap())
        .collect();
    assert_eq!(values, ["3", "4"], "{done}");
    let target = done["target"].as_i64().unwrap();
    assert!(done["end"].as_i64().unwrap() >= target, "{done}");
    let text = snapfence(&kafka, &["recover", &topic, "-p", "0", "--raw"])
        .await
        .ok()
        .out;
    assert!(
        text.contains("2 key(s) with a snapshot")
            && text.contains("no open transaction held the read back"),
        "{text}"
    );
    assert!(
        !text.contains("bytes  value"),
        "no key list without --keys: {text}"
    );
    let text = snapfence(&kafka, &["recover", &topic, "-p", "0", "--values", "--raw"])
        .await
        .ok()
        .out;
    assert!(
        text.contains("  \"a\"  1 bytes  value \"3\"\n  \"c\"  1 bytes  value \"4\"\n"),
        "{text}"
    );
    // Opened (the default), they are no envelopes: said per key, the run still succeeds. Without -p the
    // one partition is read and the topic's totals follow.
    let text = snapfence(&kafka, &["recover", &topic, "--values"])
        .await
        .ok()
        .out;
    assert!(
        text.contains("0 live key(s), 0 grave(s), 2 value(s) that are not snapfence snapshots")
            && text.contains("  \"a\"  1 bytes  not a snapfence snapshot (")
            && text.contains(&format!("-- {topic}: 1 partition(s), ")),
        "{text}"
    );

    // A foreign transaction held open, and a committed snapshot above it that only a read past the LSO
    // reaches.
    let mut foreign =
        TransactionalProducer::init(c.clone(), TransactionalConfig::new(unique("foreign")))
            .await
            .expect("init");
    foreign.begin().expect("begin");
    foreign
        .send(
            ProducerRecord::new(topic.as_str(), Some(Bytes::from_static(b"pending")))
                .key(Bytes::from_static(b"e"))
                .partition(0),
        )
        .await
        .expect("send")
        .await
        .expect("delivered");
    snapshot_txn(&mut owner, &topic, &[("f", Some("6"))], true).await;

    let stalled = snapfence(
        &kafka,
        &[
            "--format",
            "json",
            "recover",
            &topic,
            "-p",
            "0",
            "--stall-timeout",
            "2",
        ],
    )
    .await;
    assert_eq!(
        stalled.code,
        snapfence_cli::error::EXIT_STALLED,
        "{}\n{}",
        stalled.out,
        stalled.err
    );
    let report = stalled.json();
    assert_eq!(report["outcome"], "stalled", "{report}");
    assert_eq!(report["diagnosis"]["kind"], "open_transaction", "{report}");
    assert!(
        report["position"].as_i64() < report["target"].as_i64(),
        "{report}"
    );
    assert!(
        stalled.err.contains("open transaction") && stalled.err.contains("find-hanging --topic"),
        "{}",
        stalled.err
    );

    let committer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(2)).await;
        foreign
            .commit()
            .await
            .expect("commit the foreign transaction");
        foreign
    });
    let waited = snapfence(
        &kafka,
        &[
            "--format",
            "json",
            "recover",
            &topic,
            "-p",
            "0",
            "--stall-timeout",
            "30",
            "--keys",
        ],
    )
    .await
    .ok()
    .json();
    committer.await.expect("committer");
    assert_eq!(waited["waited_for_open_transactions"], true, "{waited}");
    let keys: Vec<&str> = waited["key_list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["key"]["data"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["a", "c", "e", "f"], "{waited}");

    let missing = snapfence(&kafka, &["recover", &topic, "-p", "3"]).await;
    assert_eq!(
        missing.code,
        snapfence_cli::error::EXIT_NOT_FOUND,
        "{}",
        missing.err
    );
}

// ---- demo -----------------------------------------------------------------------------------------

/// The demo is the README's main job: on a real broker, with owner A a process of its own that is stopped
/// past its session timeout, its fenced run must refuse A's write after the eviction at the generation
/// check and A's late write after B's takeover, and recover a state equal to a fold of all input; its
/// unfenced run must let the late write land and recover a damaged state. Exit 0 with a PASS verdict as
/// the last line means both; no owner process outlives the demo, and the topics it made on a cluster it
/// did not start are deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_refuses_the_stale_write_fenced_and_shows_the_damage_unfenced() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let began = std::time::Instant::now();
    // The binary, not the library in-process: owner A is the binary started again.
    let demo = tokio::process::Command::new(env!("CARGO_BIN_EXE_snapfence"))
        .args(["--bootstrap", &kafka.bootstrap(), "demo"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start snapfence demo");
    // The demo's topic names carry its pid; other tests on this cluster may run demos of their own.
    let own = format!("-{}-", demo.id().expect("pid"));
    let output = demo.wait_with_output().await.expect("run snapfence demo");
    let took = began.elapsed();
    let run = Run {
        code: output.status.code().unwrap_or(-1),
        out: String::from_utf8_lossy(&output.stdout).into_owned(),
        err: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
    .ok();
    eprintln!("the demo took {took:?} on a running broker");
    let last = run.out.lines().last().unwrap_or_default();
    assert!(last.starts_with("verdict: PASS"), "{}", run.out);
    // Prose is wrapped to the screen: read it as one run of words.
    let text = run.out.split_whitespace().collect::<Vec<_>>().join(" ");
    let seconds = |at: &str| -> f64 {
        at.split(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no seconds at {at:?}"))
    };
    let session = seconds(
        text.split("Owner A's session timeout: ")
            .nth(1)
            .expect("the session timeout is stated"),
    );
    // Stopped twice in the fenced run, once in the unfenced one, each time past the session timeout.
    let pauses: Vec<(f64, f64)> = text
        .split("A has been stopped for ")
        .skip(1)
        .map(|at| {
            let (stopped, rest) = at.split_once(" s, past its ").expect("pause sentence");
            (seconds(stopped), seconds(rest))
        })
        .collect();
    assert_eq!(pauses.len(), 3, "{}", run.out);
    for (stopped, timeout) in pauses {
        assert_eq!(timeout, session, "{}", run.out);
        assert!(
            stopped > timeout,
            "stopped {stopped} s, session {timeout} s\n{}",
            run.out
        );
    }
    assert_eq!(
        text.matches("the group coordinator no longer lists A's member")
            .count(),
        3,
        "{}",
        run.out
    );
    assert!(
        text.contains("A's write is REFUSED by the generation fence (UNKNOWN_MEMBER_ID)")
            || text.contains("A's write is REFUSED by the generation fence (ILLEGAL_GENERATION)"),
        "{}",
        run.out
    );
    assert!(
        text.contains("A's late write is REFUSED by the producer-epoch fence ("),
        "{}",
        run.out
    );
    assert!(text.contains("A's late write LANDED"), "{}", run.out);
    // The closing summary reads snapfence's metrics, and they saw what the story told: owner A's two
    // refused writes in the fenced run, one per fence, and no transactions at all in the unfenced one.
    let owner_a = |run_title: &str| {
        run.out
            .lines()
            .skip_while(|l| l.trim() != run_title)
            .nth(1)
            .unwrap_or_default()
            .to_owned()
    };
    let fenced_a = owner_a("run 1, fenced:");
    assert!(
        fenced_a.contains("owner A:")
            && fenced_a.contains("2 failed")
            && fenced_a.contains("1 producer_epoch")
            && (fenced_a.contains("1 member") || fenced_a.contains("1 generation")),
        "{}",
        run.out
    );
    assert!(
        owner_a("run 2, unfenced:").contains("owner A:        no snapshot transactions"),
        "{}",
        run.out
    );
    assert!(
        run.out.contains("WRONG: lost 5 deposit(s): #16-#20"),
        "{}",
        run.out
    );
    // Every owner A the story started is gone once the demo has exited.
    for at in text.split("(pid ").skip(1) {
        let pid = at.split(')').next().unwrap_or_default();
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&cmdline).contains("__demo-owner"),
            "owner A (pid {pid}) outlived the demo"
        );
    }
    assert!(!run.out.contains("could not delete"), "{}", run.out);
    // DeleteTopics returns once the controller has decided; the broker's metadata follows a moment later.
    let c = client(&kafka).await;
    let until = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let metadata = c.metadata_all().await.expect("metadata");
        let left: Vec<&String> = metadata
            .topics
            .keys()
            .filter(|t| t.starts_with("snapfence-demo-") && t.contains(&own))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "demo topics left behind: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The outputs story (issue 33) on a real broker: fenced, A is killed holding its EndTxn with its
/// confirmations in the log (the LSO held back), B re-folds and re-confirms them, B's stale flush after
/// its freeze is refused, and a read_committed count sees every deposit confirmed exactly once;
/// unfenced, the zombie's flush lands and deposits #16-#20 are confirmed twice. Exit 0 with a PASS
/// verdict last; no owner process outlives the demo. Fails if any of it comes out otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outputs_story_confirms_each_deposit_once_fenced_and_twice_unfenced() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let began = std::time::Instant::now();
    let demo = tokio::process::Command::new(env!("CARGO_BIN_EXE_snapfence"))
        .args([
            "--bootstrap",
            &kafka.bootstrap(),
            "demo",
            "--story",
            "outputs",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start snapfence demo --story outputs");
    let output = tokio::time::timeout(Duration::from_secs(240), demo.wait_with_output())
        .await
        .expect("the outputs story ends within 240 s")
        .expect("run snapfence demo --story outputs");
    eprintln!(
        "the outputs story took {:?} on a running broker",
        began.elapsed()
    );
    let run = Run {
        code: output.status.code().unwrap_or(-1),
        out: String::from_utf8_lossy(&output.stdout).into_owned(),
        err: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
    .ok();
    let last = run.out.lines().last().unwrap_or_default();
    assert!(last.starts_with("verdict: PASS"), "{}", run.out);
    let text = run.out.split_whitespace().collect::<Vec<_>>().join(" ");
    let (fenced, unfenced) = text
        .split_once("== Run 2 of 2")
        .unwrap_or_else(|| panic!("no second run in {}", run.out));
    for needle in [
        "holds the EndTxn that would commit it",
        "inside A's open transaction, which holds the last stable offset back",
        "Its replay folds #11-#15 again",
        "REFUSED by the producer-epoch fence",
        "20 deposits, 20 confirmations: every deposit confirmed exactly once",
    ] {
        assert!(
            fenced.contains(needle),
            "fenced run lacks {needle:?}:\n{}",
            run.out
        );
    }
    for needle in [
        "holds the OffsetCommit",
        "B confirms nothing again",
        "They LANDED",
        "20 deposits, 25 confirmations: DUPLICATED, deposits #16-#20 twice",
    ] {
        assert!(
            unfenced.contains(needle),
            "unfenced run lacks {needle:?}:\n{}",
            run.out
        );
    }
    for at in text
        .split("(pid ")
        .skip(1)
        .chain(text.split(", pid ").skip(1))
    {
        let pid = at.split(')').next().unwrap_or_default();
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&cmdline).contains("__demo-owner"),
            "owner process {pid} outlived the demo"
        );
    }
}

/// Owner A must never outlive the demo: when the demo's process is killed outright while A is stopped
/// (no destructor of the demo runs, and a stopped A cannot read the end of its input), A still ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_demo_takes_its_stopped_owner_with_it() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let mut demo = tokio::process::Command::new(env!("CARGO_BIN_EXE_snapfence"))
        .args(["--bootstrap", &kafka.bootstrap(), "demo"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start snapfence demo");
    let mut lines = BufReader::new(demo.stdout.take().expect("stdout")).lines();
    let pid = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(line) = lines.next_line().await.expect("read the demo's output") {
            if let Some(rest) = line.split("with SIGSTOP (pid ").nth(1) {
                return rest.split(')').next().map(str::to_owned);
            }
        }
        None
    })
    .await
    .expect("the demo stops owner A within 120 s")
    .expect("the demo names owner A's pid");
    // (state) is the field after the parenthesised command name.
    let state = |pid: &str| -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit_once(") ")?.1.chars().next()
    };
    assert_eq!(state(&pid), Some('T'), "owner A (pid {pid}) is stopped");
    let own = format!("-{}-", demo.id().expect("pid"));
    demo.start_kill().expect("kill the demo");
    demo.wait().await.expect("reap the demo");
    // The killed demo could not delete its topics.
    let c = client(&kafka).await;
    for t in c.metadata_all().await.expect("metadata").topics.keys() {
        if t.starts_with("snapfence-demo-") && t.contains(&own) {
            snapfence::admin::delete_topic(&c, t)
                .await
                .expect("delete a killed demo's topic");
        }
    }
    let until = std::time::Instant::now() + Duration::from_secs(10);
    // Gone, or a zombie waiting for whoever adopted it to reap it.
    while !matches!(state(&pid), None | Some('Z')) {
        assert!(
            std::time::Instant::now() < until,
            "owner A (pid {pid}) outlived the killed demo in state {:?}",
            state(&pid)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The README's first command: the binary with no bootstrap starts its own broker, passes, and leaves no
/// broker behind (its port refuses connections once the binary has exited).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_binary_starts_and_stops_its_own_broker() {
    if std::env::var_os("SNAPFENCE_BOOTSTRAP").is_some() {
        eprintln!(
            "skipped: SNAPFENCE_BOOTSTRAP names an external cluster, so no local broker may start"
        );
        return;
    }
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_snapfence"))
        .arg("demo")
        .output()
        .await
        .expect("run snapfence demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout
            .lines()
            .last()
            .is_some_and(|l| l.starts_with("verdict: PASS")),
        "{stdout}"
    );
    let address = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("ready at "))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no broker address in {stdout}"));
    let refused = tokio::net::TcpStream::connect(address).await;
    assert!(
        refused.is_err(),
        "the demo's broker at {address} still accepts connections"
    );
}

// ---- SASL -----------------------------------------------------------------------------------------

/// On a SASL listener the tool logs in with the given mechanism (password from a file), a wrong password
/// fails with exit status 7 and an error naming the mechanism and the broker's refusal, and a principal
/// without ACLs gets the not-authorized status (5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sasl_options_log_in_and_failures_name_their_cause() {
    let security = kafka_fixture::SecuritySpec {
        users: vec![
            ("admin".into(), "admin-secret".into()),
            ("nobody".into(), "nobody-secret".into()),
        ],
        super_users: vec!["User:admin".into()],
        tls: None,
    };
    let kafka = cluster(ClusterSpec::kafka4().with_security(security)).await;
    let topic = new_topic(&kafka, "cli-sasl", 1).await;
    let sasl = kafka.listener_bootstrap(kafka_fixture::Listener::SaslPlaintext);
    let dir = std::env::temp_dir().join(unique("snapfence-cli-sasl"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let (good, bad, nobody) = (
        file("good", "admin-secret\n"),
        file("bad", "not-it\n"),
        file("nobody", "nobody-secret"),
    );
    let login = |mechanism: &'static str, user: &'static str, pw: &str| {
        vec![
            "--sasl-mechanism".to_owned(),
            mechanism.to_owned(),
            "--sasl-username".to_owned(),
            user.to_owned(),
            "--sasl-password-file".to_owned(),
            pw.to_owned(),
        ]
    };
    let run = |mut args: Vec<String>, tail: &[&str]| {
        args.extend(tail.iter().map(|s| s.to_string()));
        let sasl = sasl.clone();
        async move {
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            snapfence_at(&sasl, &refs, "").await
        }
    };
    for mechanism in ["plain", "scram-sha-256", "scram-sha-512"] {
        let r = run(login(mechanism, "admin", &good), &["inspect", &topic]).await;
        assert_eq!(r.code, 0, "{mechanism}: {}{}", r.out, r.err);
        assert!(r.out.contains(&topic), "{mechanism}: {}", r.out);
    }

    let r = run(login("scram-sha-512", "admin", &bad), &["inspect", &topic]).await;
    assert_eq!(
        r.code,
        snapfence_cli::error::EXIT_AUTHENTICATION,
        "{}",
        r.err
    );
    assert!(
        r.err.contains("SCRAM-SHA-512 authentication with")
            && r.err.contains("SASL_AUTHENTICATION_FAILED"),
        "{}",
        r.err
    );

    let r = run(
        login("scram-sha-256", "nobody", &nobody),
        &["inspect", &topic],
    )
    .await;
    assert_eq!(
        r.code,
        snapfence_cli::error::EXIT_NOT_AUTHORIZED,
        "{}{}",
        r.out,
        r.err
    );
    assert!(r.err.contains("not authorized"), "{}", r.err);

    // Without a login the SASL listener is not usable, and the tool does not hang.
    let r = run(
        vec!["--sasl-mechanism".into(), "plain".into()],
        &["inspect", &topic],
    )
    .await;
    assert_eq!(r.code, snapfence_cli::error::EXIT_USAGE, "{}", r.err);

    // The demo on a secured cluster: the demo and its owner-A process (which is handed the same options)
    // both log in, and the story still ends in a pass.
    let mut args = vec!["--bootstrap".to_owned(), sasl.clone()];
    args.extend(login("scram-sha-256", "admin", &good));
    args.push("demo".to_owned());
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_snapfence"))
        .args(&args)
        .env_remove(snapfence_cli::security::PASSWORD_ENV)
        .output()
        .await
        .expect("run snapfence demo over SASL");
    let out = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{out}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        out.lines()
            .last()
            .unwrap_or_default()
            .starts_with("verdict: PASS"),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

// ---- inspect --watch and --metrics-addr -----------------------------------------------------------

/// Sends SIGINT to `child`, as Ctrl-C at a terminal would, and returns its exit code.
async fn interrupt(child: &mut Child) -> Option<i32> {
    let pid = child.id().expect("the child is running").to_string();
    let sent = tokio::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .await
        .expect("run kill");
    assert!(sent.success(), "kill -INT {pid}");
    tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("the watch ends within 20 s of SIGINT")
        .expect("reap the watch")
        .code()
}

/// Reads `lines` until `blocks` timestamped blocks have been printed in full (a block is complete when
/// the next one starts), and returns everything read.
async fn read_blocks(lines: &mut Lines<BufReader<ChildStdout>>, blocks: usize) -> String {
    let mut seen = String::new();
    let mut headers = 0;
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.expect("read the watch's output") {
            if line.starts_with("--- ") && line.ends_with(" ---") {
                headers += 1;
                if headers > blocks {
                    break;
                }
            }
            seen.push_str(&line);
            seen.push('\n');
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{blocks} blocks within 60 s; got:\n{seen}"));
    seen
}

/// `inspect --watch` into a pipe appends one plain block per tick, each under a UTC timestamp, with no
/// escape codes (those are for a terminal only), and SIGINT ends it with status 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_watch_into_a_pipe_prints_plain_blocks_and_stops_on_sigint() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let topic = new_topic(&kafka, "cli-watch", 2).await;
    let mut watch = tokio::process::Command::new(env!("CARGO_BIN_EXE_snapfence"))
        .args([
            "--bootstrap",
            &kafka.bootstrap(),
            "inspect",
            &topic,
            "--watch",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start snapfence inspect --watch");
    let mut lines = BufReader::new(watch.stdout.take().expect("stdout")).lines();
    let seen = read_blocks(&mut lines, 2).await;
    assert_eq!(interrupt(&mut watch).await, Some(0), "{seen}");
    let mut rest = String::new();
    while let Ok(Some(line)) = lines.next_line().await {
        rest.push_str(&line);
        rest.push('\n');
    }
    let all = format!("{seen}{rest}");
    assert!(!all.contains('\x1b'), "escape codes into a pipe: {all:?}");
    let blocks: Vec<&str> = all.split("--- ").filter(|b| !b.is_empty()).collect();
    assert!(blocks.len() >= 2, "{all}");
    for block in &blocks[..2] {
        // `2026-12-01T20:50:01.123Z ---`, then the report.
        assert!(
            block.as_bytes().get(23) == Some(&b'Z'),
            "timestamp: {block}"
        );
        assert!(
            block.contains(&format!("topic {topic}: 2 partition(s)"))
                && block.contains("HW-LSO")
                && block.contains("no open transactions"),
            "{block}"
        );
    }
    let mut stderr = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut watch.stderr.take().expect("stderr"), &mut stderr)
        .await
        .expect("read stderr");
    assert!(
        !stderr.contains('\x1b') && !stderr.contains('\r'),
        "{stderr:?}"
    );
}

/// `--metrics-addr` with port 0 serves the Prometheus text format on the port it names on stderr, and
/// after a tick it holds the net layer's request metrics, described.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_watch_serves_prometheus_metrics_at_metrics_addr() {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let topic = new_topic(&kafka, "cli-watch-metrics", 1).await;
    let mut watch = tokio::process::Command::new(env!("CARGO_BIN_EXE_snapfence"))
        .args(["--bootstrap", &kafka.bootstrap(), "inspect", &topic])
        .args([
            "--watch",
            "--interval",
            "0.5",
            "--metrics-addr",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start snapfence inspect --watch --metrics-addr");
    let mut errors = BufReader::new(watch.stderr.take().expect("stderr")).lines();
    let announced = tokio::time::timeout(Duration::from_secs(30), errors.next_line())
        .await
        .expect("the address is announced at once")
        .expect("read stderr")
        .expect("a line on stderr");
    let addr = announced
        .strip_prefix("serving metrics at http://")
        .and_then(|a| a.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("{announced}"))
        .to_owned();
    assert!(!addr.ends_with(":0"), "the real port is named: {addr}");
    let mut lines = BufReader::new(watch.stdout.take().expect("stdout")).lines();
    read_blocks(&mut lines, 1).await;

    let mut http = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect to the exporter");
    http.write_all(b"GET /metrics HTTP/1.1\r\nHost: snapfence\r\n\r\n")
        .await
        .expect("send the scrape");
    let mut answer = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut http, &mut answer)
        .await
        .expect("read the scrape");
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(
        answer.contains("Content-Type: text/plain; version=0.0.4"),
        "{answer}"
    );
    for expected in [
        "# TYPE snapfence_request_duration_seconds histogram",
        "snapfence_request_duration_seconds_bucket{api=\"ListOffsets\",le=\"+Inf\"} ",
        "snapfence_request_duration_seconds_count{api=\"Metadata\"} ",
        "# HELP snapfence_network_sent_bytes_total ",
        "snapfence_network_received_bytes_total ",
        "snapfence_connections_opened_total ",
        "snapfence_requests_in_flight ",
    ] {
        assert!(answer.contains(expected), "no {expected:?} in:\n{answer}");
    }
    assert_eq!(interrupt(&mut watch).await, Some(0));
}
