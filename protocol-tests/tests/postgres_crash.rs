//! An owner of the PostgreSQL store killed (SIGKILL, a process of its own: `pg-owner`) at each step of a
//! flush: after its Kafka prepare, with its PostgreSQL transaction open, after its PostgreSQL commit
//! and before its Kafka commit. The next owner resolves the in-doubt Kafka transaction and starts where
//! the committed rows say, every time: the rows are all of the flushes PostgreSQL committed and nothing
//! else, the start offset is theirs, and no Kafka transaction of the dead owner is left open.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use protocol_tests::{cluster, join_classic, unique, ClusterSpec, PostgresServer};
use snapfence::consumer::{committed_offsets, TopicPartition as ConsumerTp};
use snapfence::net::{Client, ClientConfig};
use snapfence::producer::TopicPartition;
use snapfence::snapshot::postgres::{PgSnapshotStore, PgStoreConfig};
use snapfence::snapshot::{MetadataSource, SnapshotConfig};

/// Runs `pg-owner` until it reports `step`, then kills it with SIGKILL.
fn crash_at(args: &[String], step: &str) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pg-owner"))
        .args(args)
        .arg(step)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start pg-owner");
    let stdout = child.stdout.take().unwrap();
    let reached = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|l| l == format!("AT {step}"));
    let _ = child.kill();
    let _ = child.wait();
    assert!(reached, "pg-owner never reached {step}");
}

/// Whichever step of a flush the owner is killed at, the next owner resolves the in-doubt Kafka
/// transaction and starts from exactly the rows and offset PostgreSQL committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_owner_resolves_a_flush_killed_at_each_step() {
    let kafka = cluster(ClusterSpec::kafka4().with_two_phase_commit()).await;
    let pg = tokio::task::spawn_blocking(PostgresServer::start)
        .await
        .unwrap()
        .expect("start PostgreSQL");
    let client = Client::connect(ClientConfig::new(kafka.bootstrap()))
        .await
        .unwrap();
    // (step, the rows PostgreSQL holds after it, the offset the next owner starts at)
    let cases = [
        ("after-kafka-prepare", vec!["k1=v1", "shared=a1"], 10),
        ("mid-postgres", vec!["k1=v1", "shared=a1"], 10),
        (
            "after-postgres-commit",
            vec!["k1=v1", "k2=v2", "shared=a2"],
            20,
        ),
    ];
    for (step, want_rows, want_offset) in cases {
        let input = unique("crash-in");
        snapfence::admin::create_topic(&client, &input, 1, -1, &[])
            .await
            .unwrap();
        let prefix = unique("crash");
        let group = unique("crash-group");
        let args = [
            kafka.bootstrap(),
            pg.url(),
            input.clone(),
            prefix.clone(),
            group.clone(),
        ];
        tokio::task::spawn_blocking(move || crash_at(&args, step))
            .await
            .unwrap();

        // The next owner: its own membership for later flushes, the dead owner's group's committed
        // offset as the assigned one (read after the takeover, as the flow does).
        let me = join_classic(&client, &unique("crash-next"), "", 60_000)
            .await
            .unwrap();
        let metadata: Arc<dyn MetadataSource> = Arc::new(move || Some(me.clone()));
        let tp = ConsumerTp::new(input.as_str(), 0);
        let kafka_offset = || {
            let (client, group, tp) = (client.clone(), group.clone(), tp.clone());
            async move {
                committed_offsets(&client, &group, std::slice::from_ref(&tp))
                    .await
                    .unwrap()[&tp]
            }
        };
        let assigned = kafka_offset();
        let b = PgSnapshotStore::acquire(
            client.clone(),
            &SnapshotConfig::new("unused", &prefix),
            &PgStoreConfig::new(pg.url()),
            TopicPartition::new(input.as_str(), 0),
            metadata,
            async { Ok(assigned.await.unwrap_or(0)) },
        )
        .await
        .unwrap_or_else(|e| panic!("{step}: takeover: {e}"));

        let state = b.read_state().await.unwrap();
        let mut rows: Vec<String> = state
            .iter()
            .map(|(k, v)| {
                format!(
                    "{}={}",
                    String::from_utf8_lossy(k),
                    String::from_utf8_lossy(v)
                )
            })
            .collect();
        rows.sort();
        assert_eq!(
            rows, want_rows,
            "{step}: the rows are the committed flushes'"
        );
        assert_eq!(
            b.committed_offset(),
            want_offset,
            "{step}: the start offset"
        );
        // Kafka 4.4.0 cannot keep the dead owner's prepared transaction: it was aborted, so the group's
        // offset in Kafka stays at the first flush's, and the store says it is behind when PostgreSQL
        // committed the second.
        assert_eq!(
            kafka_offset().await,
            Some(10),
            "{step}: the group's offset in Kafka"
        );
        assert_eq!(b.kafka_behind(), want_offset > 10, "{step}");
        let described = snapfence::admin::describe_transaction(&client, &format!("{prefix}-0"))
            .await
            .unwrap()
            .expect("the transactional id is known");
        assert_ne!(
            described.state, "Ongoing",
            "{step}: the in-doubt transaction was resolved"
        );
        // And the next owner goes on.
        b.commit_offset(want_offset + 1).await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        b.close().await;
    }
}
