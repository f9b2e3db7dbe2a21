//! A PostgreSQL-store owner as its own process, for the crash tests (tests/postgres_crash.rs): it takes
//! partition 0 over, runs one flush to the end, then stops the next flush at the named step, prints
//! `AT <step>` and waits to be killed.
//!
//! ```text
//! pg-owner BOOTSTRAP PG_URL INPUT PREFIX GROUP STEP
//! STEP: after-kafka-prepare | mid-postgres | after-postgres-commit | none
//! ```
//! First flush: `k1=v1`, `shared=a1`, offset 10. Second: `k2=v2`, `shared=a2`, offset 20.

use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use snapfence::net::{Client, ClientConfig};
use snapfence::producer::TopicPartition;
use snapfence::snapshot::postgres::{PgSnapshotStore, PgStoreConfig};
use snapfence::snapshot::{MetadataSource, SnapshotConfig};

fn kv(k: &str, v: &str) -> (Bytes, Option<Bytes>) {
    (
        Bytes::copy_from_slice(k.as_bytes()),
        Some(Bytes::copy_from_slice(v.as_bytes())),
    )
}

fn at(step: &str) {
    println!("AT {step}");
    let _ = std::io::stdout().flush();
    std::thread::sleep(Duration::from_secs(3600));
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [bootstrap, url, input, prefix, group, stop] = args.as_slice() else {
        eprintln!("usage: pg-owner BOOTSTRAP PG_URL INPUT PREFIX GROUP STEP");
        std::process::exit(2);
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let client = Client::connect(ClientConfig::new(bootstrap))
            .await
            .expect("connect");
        let member = protocol_tests::join_classic(&client, group, "", 60_000)
            .await
            .expect("join");
        let metadata: Arc<dyn MetadataSource> = Arc::new(move || Some(member.clone()));
        let store = PgSnapshotStore::acquire(
            client,
            &SnapshotConfig::new("unused", prefix.as_str()),
            &PgStoreConfig::new(url.as_str()),
            TopicPartition::new(input.as_str(), 0),
            metadata,
            async { Ok(0) },
        )
        .await
        .expect("acquire");
        store
            .write_all(vec![kv("k1", "v1"), kv("shared", "a1")])
            .await
            .expect("first flush");
        store.commit_offset(10).await.expect("first offset");
        let prepared = store
            .begin_flush(vec![kv("k2", "v2"), kv("shared", "a2")], 20)
            .await
            .expect("prepare");
        if stop == "after-kafka-prepare" {
            at(stop);
        }
        let written = prepared.write_rows().await.expect("write rows");
        if stop == "mid-postgres" {
            at(stop);
        }
        let committed = written.commit_rows().await.expect("commit rows");
        if stop == "after-postgres-commit" {
            at(stop);
        }
        committed.commit_kafka().await.expect("commit kafka");
        println!("DONE");
    });
}
