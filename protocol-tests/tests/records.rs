//! The records layer against what the Java client really writes: `java/RecordsFixture.java` (the Java
//! producer and consumer from the broker's own jars) writes committed, aborted and still-open
//! transactions with every codec and records what the Java consumer delivers at each isolation level;
//! we fetch the raw bytes and our decoder plus visibility engine must deliver exactly the same.
//!
//! With `SNAPFENCE_RECORD_FIXTURES=1` the fetched bytes and the Java consumer's output are also written to
//! `protocol-tests/fixtures/records/`, where the library's unit tests decode them without a broker.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::fetch_response::PartitionData;
use kafka_protocol::messages::{ApiKey, FetchRequest, FetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use protocol_tests::probe::Probe;
use protocol_tests::{cluster, unique, ClusterSpec};
use snapfence::records::{self, AbortedTransaction, IsolationLevel, LogState, Visible};

#[path = "../../src/records/tests/java_lines.rs"]
mod java_lines;
use java_lines::render;

const CODECS: [&str; 5] = ["none", "gzip", "snappy", "lz4", "zstd"];

/// What one Fetch at offset 0 returned for the topic's only partition.
struct Fetched {
    records: Bytes,
    aborted: Vec<AbortedTransaction>,
    high_watermark: i64,
    last_stable_offset: i64,
}

fn fetch(probe: &mut Probe, topic: &str, isolation: IsolationLevel) -> Fetched {
    // v12 is the last version that names topics rather than topic ids; every 3.9 and 4.x broker speaks it.
    let request = FetchRequest::default()
        .with_max_wait_ms(500)
        .with_min_bytes(1)
        .with_max_bytes(16 << 20)
        .with_isolation_level(isolation.as_i8())
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(StrBytes::from_string(topic.to_owned())))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(0)
                .with_fetch_offset(0)
                .with_partition_max_bytes(16 << 20)])]);
    let response: FetchResponse = probe.call(ApiKey::Fetch, 12, &request).expect("fetch");
    assert_eq!(response.error_code, 0);
    let p: &PartitionData = &response.responses[0].partitions[0];
    assert_eq!(p.error_code, 0, "fetch {topic} at {isolation:?}");
    Fetched {
        records: p.records.clone().unwrap_or_default(),
        aborted: p
            .aborted_transactions
            .iter()
            .flatten()
            .map(|t| AbortedTransaction {
                producer_id: t.producer_id.0,
                first_offset: t.first_offset,
            })
            .collect(),
        high_watermark: p.high_watermark,
        last_stable_offset: p.last_stable_offset,
    }
}

/// The Java consumer's end offset and delivered records.
fn java_output(path: &Path) -> (i64, Vec<String>) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut lines = text.lines();
    let end = lines
        .next()
        .and_then(|l| l.strip_prefix("# end "))
        .and_then(|n| n.parse().ok())
        .expect("first line is the end offset");
    (end, lines.map(str::to_owned).collect())
}

/// Transactions the Java producer wrote, with every codec, are delivered by our read path exactly as the
/// Java consumer delivers them at both isolation levels, and our LSO is the broker's.
#[tokio::test(flavor = "multi_thread")]
async fn java_written_transactions_decode_as_the_java_consumer_delivers_them() {
    let cluster = cluster(ClusterSpec::kafka4()).await;
    let prefix = unique("records");
    let out = std::env::temp_dir().join(&prefix);
    std::fs::create_dir_all(&out).unwrap();
    let java_src = Path::new(env!("CARGO_MANIFEST_DIR")).join("java/RecordsFixture.java");
    // The same `java` the fixture starts brokers with.
    let java = std::env::var_os("JAVA_HOME")
        .filter(|h| !h.is_empty())
        .map_or(PathBuf::from("java"), |h| PathBuf::from(h).join("bin/java"));
    let mut cmd = Command::new(java);
    cmd.arg("-cp")
        .arg(format!("{}/*", cluster.libs_dir().display()))
        .arg(&java_src)
        .arg(cluster.bootstrap())
        .arg(&prefix)
        .arg(&out);
    let output = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .expect("run the Java peer");
    assert!(
        output.status.success(),
        "Java peer failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );

    // One partition per topic on a one-node cluster: the bootstrap broker leads it.
    let bootstrap = cluster.bootstrap();
    let addr = bootstrap.split(',').next().unwrap().to_owned();
    let record = std::env::var("SNAPFENCE_RECORD_FIXTURES").is_ok_and(|v| v == "1");
    let version = cluster.version().to_owned();
    tokio::task::spawn_blocking(move || {
        for codec in CODECS {
            let topic = format!("{prefix}-{codec}");
            let mut probe = Probe::connect(&addr, Duration::from_secs(10)).expect("connect");
            let ru = fetch(&mut probe, &topic, IsolationLevel::ReadUncommitted);
            let rc = fetch(&mut probe, &topic, IsolationLevel::ReadCommitted);
            let (java_ru_end, java_ru) =
                java_output(&out.join(codec).join("java_read_uncommitted.txt"));
            let (java_rc_end, java_rc) =
                java_output(&out.join(codec).join("java_read_committed.txt"));

            let ours_ru =
                records::visible_in(ru.records.clone(), &[], IsolationLevel::ReadUncommitted, 0)
                    .unwrap();
            assert_eq!(render(&ours_ru), java_ru, "{codec}: read_uncommitted");
            assert_eq!(
                ours_ru.next_offset, java_ru_end,
                "{codec}: read_uncommitted end"
            );
            assert_eq!(ours_ru.next_offset, ru.high_watermark);

            let ours_rc = records::visible_in(
                rc.records.clone(),
                &rc.aborted,
                IsolationLevel::ReadCommitted,
                0,
            )
            .unwrap();
            assert_eq!(render(&ours_rc), java_rc, "{codec}: read_committed");
            assert_eq!(
                ours_rc.next_offset, java_rc_end,
                "{codec}: read_committed end"
            );
            assert!(
                !rc.aborted.is_empty(),
                "{codec}: t2's aborted transaction is listed"
            );

            // The LSO from our own scan of the read_uncommitted bytes is the broker's.
            let batches: Vec<_> = records::decode_batches(ru.records.clone())
                .collect::<Result<_, _>>()
                .unwrap();
            let state = LogState::scan(&batches).unwrap();
            assert_eq!(
                state.last_stable_offset(ru.high_watermark),
                rc.last_stable_offset
            );
            assert_eq!(state.open_transactions().len(), 1, "{codec}: t3 is open");
            assert!(rc.last_stable_offset < ru.high_watermark);

            if record {
                save(&version, codec, &ru, &rc, &out.join(codec));
            }
        }
    })
    .await
    .unwrap();
}

/// Writes one codec's captured fetches and the Java consumer's output under protocol-tests/fixtures.
fn save(version: &str, codec: &str, ru: &Fetched, rc: &Fetched, java: &Path) {
    let dir: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/records")
        .join(codec);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("read_uncommitted.bin"), &ru.records).unwrap();
    std::fs::write(dir.join("read_committed.bin"), &rc.records).unwrap();
    let aborted: String = rc
        .aborted
        .iter()
        .map(|t| format!("{} {}\n", t.producer_id, t.first_offset))
        .collect();
    std::fs::write(dir.join("read_committed.aborted"), aborted).unwrap();
    std::fs::write(
        dir.join("fetch.txt"),
        format!(
            "kafka {version}\nhigh_watermark {}\nlast_stable_offset {}\n",
            ru.high_watermark, rc.last_stable_offset
        ),
    )
    .unwrap();
    for f in ["java_read_committed.txt", "java_read_uncommitted.txt"] {
        std::fs::copy(java.join(f), dir.join(f)).unwrap();
    }
}
