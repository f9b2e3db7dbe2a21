//! Every program in the root package's `examples/` runs here against the fixture's broker, the way a user
//! runs it (`cargo run --example NAME -- --bootstrap ADDR`), and its output is checked against what the
//! example claims to do: the examples a user copies must keep working.
//!
//! The examples are built once per test process before any of them runs, so each example's own timeout
//! measures its run, not a compile (under `cargo test -p protocol-tests` nothing has built them yet; under
//! `cargo test --workspace` they are built, possibly with the workspace's unified features, and this build
//! may have to redo them once for the root package's own).

use std::process::Stdio;
use std::time::{Duration, Instant};

use protocol_tests::{cluster, ClusterSpec};
use snapfence::net::{Client, ClientConfig};
use tokio::process::Command;
use tokio::sync::OnceCell;

/// How long one example may run once built. Each takes well under 5 s on the fixture's broker.
const RUN_TIMEOUT: Duration = Duration::from_secs(90);
/// How long building the examples may take (a cold build on a busy two-core machine).
const BUILD_TIMEOUT: Duration = Duration::from_secs(900);

/// `cargo` with stdin closed and both outputs captured, killed if its future is dropped (a timeout).
fn cargo(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

async fn build_examples() {
    static BUILT: OnceCell<Result<(), String>> = OnceCell::const_new();
    let built = BUILT
        .get_or_init(|| async {
            let build = cargo(&["build", "-q", "-p", "snapfence", "--examples"]).output();
            match tokio::time::timeout(BUILD_TIMEOUT, build).await {
                Err(_) => Err(format!("building the examples took over {BUILD_TIMEOUT:?}")),
                Ok(Err(e)) => Err(format!("cannot run cargo: {e}")),
                Ok(Ok(out)) if !out.status.success() => Err(format!(
                    "building the examples failed ({}):\n{}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                )),
                Ok(Ok(_)) => Ok(()),
            }
        })
        .await;
    if let Err(e) = built {
        panic!("{e}");
    }
}

/// Runs example `name` against the shared Kafka 4.x broker with `args` after `--bootstrap ADDR`, and
/// returns its stdout. Panics (with both outputs) on a failed exit or past [`RUN_TIMEOUT`].
async fn run_example(name: &str, args: &[&str]) -> String {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    build_examples().await;
    let bootstrap = kafka.bootstrap();
    let mut argv = vec!["run", "-q", "-p", "snapfence", "--example", name, "--"];
    argv.extend(["--bootstrap", bootstrap.as_str()]);
    argv.extend(args);
    let began = Instant::now();
    let out = tokio::time::timeout(RUN_TIMEOUT, cargo(&argv).output())
        .await
        .unwrap_or_else(|_| panic!("example {name} ran over {RUN_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("cannot run cargo: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "example {name} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    eprintln!("example {name} {args:?}: {:?}\n{stdout}", began.elapsed());
    stdout
}

/// The lines of `out` that start with `prefix`.
fn lines<'a>(out: &'a str, prefix: &str) -> Vec<&'a str> {
    out.lines().filter(|l| l.starts_with(prefix)).collect()
}

/// The balances fold equals a fold of the deposits and withdrawals the example wrote, its input offsets
/// are committed past all six events, and the snapshots it persisted recover to the same three accounts.
#[tokio::test]
async fn balances_folds_persists_and_recovers() {
    let out = run_example("balances", &["--keep"]).await;
    assert_eq!(
        lines(&out, "balance "),
        [
            "balance alice = 75",
            "balance bob = 40",
            "balance carol = 20"
        ],
        "{out}"
    );
    let committed = lines(&out, "committed input offsets: ");
    assert_eq!(committed.len(), 1, "{out}");
    let total: i64 = committed[0]
        .trim_start_matches("committed input offsets: ")
        .split(' ')
        .map(|p| {
            p.split_once('=')
                .expect("partition=offset")
                .1
                .parse::<i64>()
                .unwrap()
        })
        .sum();
    assert_eq!(total, 6, "every event's offset is committed: {out}");

    let kept = lines(&out, "kept input topic ");
    let words: Vec<&str> = kept
        .first()
        .expect("--keep names the topics")
        .split(' ')
        .collect();
    let (input, snapshots) = (words[3], words[7]);
    let recovered = run_example("recover", &["--topic", snapshots]).await;
    let keys: usize = lines(&recovered, "partition ")
        .iter()
        .map(|l| l.split(' ').nth(2).unwrap().parse::<usize>().unwrap())
        .sum();
    assert_eq!(keys, 3, "{recovered}");
    // A flow's snapshot is an envelope (version, last folded offset) around the fold's own bytes.
    for (account, balance) in [("alice", "75"), ("bob", "40"), ("carol", "20")] {
        assert!(
            recovered
                .lines()
                .any(|l| l.starts_with(&format!("  {account} = ")) && l.ends_with(balance)),
            "{account}'s snapshot ends with {balance}:\n{recovered}"
        );
    }

    let kafka = cluster(ClusterSpec::kafka4()).await;
    let client = Client::connect(ClientConfig::new(kafka.bootstrap()))
        .await
        .unwrap();
    snapfence::admin::delete_topic(&client, input)
        .await
        .unwrap();
    snapfence::admin::delete_topic(&client, snapshots)
        .await
        .unwrap();
}

/// The first attempt is aborted and the consumer rewound; a read_committed reader of the output sees each
/// word transformed exactly once, and the group's committed offset is the end of the input.
#[tokio::test]
async fn transform_rewinds_after_the_abort_and_commits_each_word_once() {
    let out = run_example("transform", &[]).await;
    let aborted = lines(&out, "attempt 1: aborted; rewound ");
    assert_eq!(aborted.len(), 1, "{out}");
    assert!(aborted[0].ends_with(" to Earliest"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("attempt ") && l.ends_with(": committed input up to offset 4")),
        "{out}"
    );
    assert_eq!(
        lines(&out, "output (read_committed): "),
        ["output (read_committed): KAFKA FENCES STALE OWNERS"],
        "{out}"
    );
    assert_eq!(
        lines(&out, "committed input offset: "),
        ["committed input offset: Some(4)"],
        "{out}"
    );
    assert_eq!(lines(&out, "deleted topics ").len(), 1, "{out}");
}

/// The recovery read sees the two committed transactions and not the aborted one: four keys, `user-2`
/// deleted by its tombstone, `user-3` at its later value.
#[tokio::test]
async fn recover_reads_committed_snapshots_only() {
    let out = run_example("recover", &[]).await;
    let partitions = lines(&out, "partition ");
    assert_eq!(partitions.len(), 1, "{out}");
    // 7 records: five puts, then a put and a tombstone; the aborted transaction's two are not read.
    // The bound is the high watermark when the read began: 12 once the last commit marker is in the log,
    // 11 if the read began before it landed (EndTxn answers when the coordinator has logged its decision;
    // the marker is written after that). Either way the read waits for the LSO and sees the same records.
    let (head, bound) = partitions[0]
        .split_once(", read to offset ")
        .unwrap_or((partitions[0], ""));
    assert_eq!(
        head, "partition 0: 4 keys (32 bytes of keys and values) from 7 committed records",
        "{out}"
    );
    assert!(
        bound.starts_with("11 ") || bound.starts_with("12 "),
        "the bound is the high watermark at the start of the read: {out}"
    );
    assert_eq!(
        lines(&out, "  "),
        [
            "  user-1 = v1",
            "  user-3 = v2",
            "  user-4 = v1",
            "  user-5 = v1"
        ],
        "{out}"
    );
    assert_eq!(lines(&out, "deleted topic ").len(), 1, "{out}");
}

/// The codec example needs no broker (it ignores `--bootstrap`): from the same bytes read_uncommitted gets
/// every data record and read_committed drops producer 8's aborted transaction.
#[tokio::test]
async fn codec_shows_what_read_committed_sees() {
    let out = run_example("codec", &[]).await;
    assert_eq!(
        lines(&out, "read_"),
        [
            "read_uncommitted: alice=+100 bob=+50 alice=+999 mallory=+1 carol=+20 bob=-10 (next fetch at 8)",
            "read_committed: alice=+100 bob=+50 carol=+20 bob=-10 (next fetch at 8)",
        ],
        "{out}"
    );
    assert_eq!(lines(&out, "batch ").len(), 5, "{out}");
    assert!(
        out.contains("cut 10 bytes short: 4 complete batches, next fetch at 6,"),
        "{out}"
    );
}

/// One HTTP/1.1 GET of `path` on `addr`: the status code and the body.
async fn http_get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(addr).await?;
    conn.write_all(format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut text = String::new();
    conn.read_to_string(&mut text).await?;
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    Ok((status, body))
}

/// The service example as Kubernetes runs it: its readiness endpoint answers 503 until the member has
/// recovered and caught up, then 200; a lookup answers a key's count; SIGTERM makes it flush, commit
/// and leave, so the group is empty at once (no session timeout to wait out) and its committed offsets
/// are the input's end.
#[tokio::test]
async fn service_is_ready_answers_lookups_and_stops_cleanly_on_sigterm() {
    use snapfence::producer::{Producer, ProducerConfig, ProducerRecord, TopicPartition};
    use tokio::io::AsyncBufReadExt;
    let kafka = cluster(ClusterSpec::kafka4()).await;
    build_examples().await;
    let client = Client::connect(ClientConfig::new(kafka.bootstrap()))
        .await
        .unwrap();
    let (input, snapshots, group) = (
        protocol_tests::unique("svc-in"),
        protocol_tests::unique("svc-counts"),
        protocol_tests::unique("svc-group"),
    );
    snapfence::admin::create_topic(&client, &input, 2, -1, &[])
        .await
        .unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default())
        .await
        .unwrap();
    let mut deliveries = Vec::new();
    for i in 0..3000 {
        let record = ProducerRecord::new(input.as_str(), Some(bytes::Bytes::from("e")))
            .key(format!("k{}", i % 3));
        deliveries.push(producer.send(record).await.unwrap());
    }
    for d in deliveries {
        d.await.unwrap();
    }

    // The binary itself (not `cargo run`), so the signal goes to the service and nothing else.
    let binary = std::env::current_exe()
        .unwrap()
        .parent()
        .and_then(|deps| deps.parent())
        .unwrap()
        .join("examples/service");
    let bootstrap = kafka.bootstrap();
    let mut child = Command::new(&binary)
        .args(["--bootstrap", bootstrap.as_str(), "--input", &input])
        .args([
            "--snapshots",
            &snapshots,
            "--group",
            &group,
            "--http",
            "127.0.0.1:0",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("the service printed where it listens")
        .unwrap()
        .unwrap_or_default();
    let addr = first
        .strip_prefix("listening on http://")
        .unwrap_or_else(|| panic!("first line: {first}"))
        .to_owned();

    let deadline = Instant::now() + Duration::from_secs(60);
    let mut statuses = Vec::new();
    loop {
        let (status, body) = http_get(&addr, "/ready").await.unwrap();
        if statuses.last() != Some(&status) {
            statuses.push(status);
        }
        if status == 200 {
            break;
        }
        assert_eq!(status, 503, "{body}");
        assert!(Instant::now() < deadline, "never ready: {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("readiness answers in order: {statuses:?}");
    assert_eq!(
        http_get(&addr, "/count/k1").await.unwrap(),
        (200, "1000\n".to_owned())
    );
    assert_eq!(http_get(&addr, "/count/nobody").await.unwrap().0, 404);

    let pid = child.id().expect("running") as libc::pid_t;
    // SAFETY: kill has no memory effects; the pid is our own child, not yet reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("the service stopped within 30 s of SIGTERM")
        .unwrap();
    let mut rest = Vec::new();
    while let Ok(Some(line)) = lines.next_line().await {
        rest.push(line);
    }
    assert!(status.success(), "exit {status}: {rest:?}");
    assert_eq!(rest, ["stopped cleanly"]);

    let described = protocol_tests::describe_group(&client, &group)
        .await
        .unwrap();
    assert_eq!(described.state, "Empty", "it left the group: {described:?}");
    let tps: Vec<_> = (0..2)
        .map(|p| TopicPartition::new(input.as_str(), p))
        .collect();
    let committed = snapfence::consumer::committed_offsets(&client, &group, &tps)
        .await
        .unwrap();
    let ends = snapfence::consumer::list_offsets(
        &client,
        &tps,
        snapfence::consumer::OffsetSpec::Latest,
        snapfence::records::IsolationLevel::ReadUncommitted,
    )
    .await
    .unwrap();
    for tp in &tps {
        assert_eq!(
            committed[tp],
            Some(ends[tp]),
            "the final commit reached the end of {tp:?}"
        );
    }
    for topic in [&input, &snapshots] {
        snapfence::admin::delete_topic(&client, topic)
            .await
            .unwrap();
    }
}
