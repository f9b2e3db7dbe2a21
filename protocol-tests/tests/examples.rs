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
