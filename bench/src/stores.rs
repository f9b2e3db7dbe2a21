//! `snapfence-bench stores`: a persist wave on the PostgreSQL store against the same wave on the topic
//! store, same keys, same run. snapfence only: no peer has either store.
//!
//! ```text
//! snapfence-bench stores [--keys 1,100,1000,10000] [--waves N] [--out FILE]
//! ```
//!
//! One Kafka 4.4 node with two-phase commit on (transaction version 2) and one PostgreSQL server with
//! its durability defaults (fsync, synchronous commit, full-page writes: the test fixture turns them
//! off), both started here. Per wave size K and store: partition 0 taken over by a classic group member, one
//! warm-up wave, then N waves (default 20) of the same K keys with 100-byte values (each wave a new
//! value per key), each awaited before the next. A wave is what a flow's persist hands its store: on
//! the topic store every write queued through the group commit (one transaction per
//! `max_writes_per_transaction` writes, each with the fenced offset commit); on the PostgreSQL store one
//! flush (a prepared Kafka transaction with the fenced offset commit, one PostgreSQL transaction with the
//! fencing row's compare-and-set and the rows, the Kafka commit). Reported: the median and p90 wave time
//! and keys per second at the median. The two stores' waves alternate, so a slow spell of the machine
//! lands on both.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol_tests::{dedicated, join_classic, unique, ClusterSpec, PostgresServer};
use snapfence::net::{Client, ClientConfig};
use snapfence::producer::TopicPartition;
use snapfence::snapshot::postgres::{PgSnapshotStore, PgStoreConfig};
use snapfence::snapshot::{Assignment, MetadataSource, SnapshotConfig, SnapshotStore};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// PostgreSQL's defaults for durability, which the test fixture relaxes.
const DURABLE: &[(&str, &str)] = &[
    ("fsync", "on"),
    ("synchronous_commit", "on"),
    ("full_page_writes", "on"),
];

struct Options {
    keys: Vec<usize>,
    waves: usize,
    out: Option<PathBuf>,
}

fn options(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        keys: vec![1, 100, 1000, 10_000],
        waves: 20,
        out: None,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--keys" => {
                o.keys = value
                    .split(',')
                    .map(|n| {
                        n.trim()
                            .parse::<usize>()
                            .map_err(|_| format!("not a number: {n}"))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                if o.keys.contains(&0) {
                    return Err("--keys: 0 keys is no wave".into());
                }
            }
            "--waves" => {
                o.waves = value
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("--waves {value}: want a positive number"))?
            }
            "--out" => o.out = Some(PathBuf::from(value)),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(o)
}

/// Runs the rows; exit status 0 when every row ran.
pub fn main(args: &[String]) -> i32 {
    let options = match options(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return 2;
        }
    };
    crate::block_on_and_write(run(&options), options.out.as_deref(), "stores benchmark")
}

/// One store under measurement.
enum Store {
    Topic(SnapshotStore),
    Postgres(PgSnapshotStore),
}

impl Store {
    async fn wave(&self, writes: Vec<(Bytes, Option<Bytes>)>) -> Result<(), Error> {
        match self {
            Store::Topic(s) => {
                let mut pending = Vec::with_capacity(writes.len());
                for (k, v) in writes {
                    pending.push(s.try_write(k, v).map_err(|e| format!("queue full: {e}"))?);
                }
                for p in pending {
                    p.await?;
                }
            }
            Store::Postgres(s) => s.write_all(writes).await?,
        }
        Ok(())
    }

    async fn close(self) {
        match self {
            Store::Topic(s) => s.close().await,
            Store::Postgres(s) => s.close().await,
        }
    }
}

fn wave_of(keys: usize, round: usize) -> Vec<(Bytes, Option<Bytes>)> {
    (0..keys)
        .map(|i| {
            let value = vec![b'a' + ((i + round) % 26) as u8; 100];
            (Bytes::from(format!("key-{i:06}")), Some(Bytes::from(value)))
        })
        .collect()
}

async fn run(options: &Options) -> Result<String, Error> {
    eprintln!("== starting Kafka (2PC on) and PostgreSQL");
    let kafka = dedicated(ClusterSpec::kafka4().with_two_phase_commit()).await;
    // Durable, as a production server runs (the test fixture turns fsync off for speed): every commit
    // waits for its WAL flush, as a Kafka commit waits for the transaction log's append.
    let pg = tokio::task::spawn_blocking(|| PostgresServer::start_with(DURABLE)).await??;
    let client = Client::connect(ClientConfig::new(kafka.bootstrap())).await?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Kafka {} (one node, transaction.version 2, two-phase commit on) and {} (fsync on), one partition, \
         {} waves per row after one warm-up, values of 100 B.\n",
        kafka.version(),
        pg_version(&pg.url()).await.unwrap_or_else(|e| format!("version unknown: {e}")),
        options.waves
    );
    let _ = writeln!(
        out,
        "| keys per wave | topic store: median wave [p90] | PostgreSQL store: median wave [p90] | topic keys/s | PostgreSQL keys/s | PostgreSQL / topic |\n|---:|---:|---:|---:|---:|---:|"
    );
    for &keys in &options.keys {
        eprintln!("== waves of {keys} keys");
        let input = unique("stores-in");
        let snapshots = unique("stores-snap");
        snapfence::admin::create_topic(&client, &input, 1, -1, &[]).await?;
        snapfence::admin::create_topic(
            &client,
            &snapshots,
            1,
            -1,
            &[("cleanup.policy", "compact")],
        )
        .await?;
        let group = join_classic(&client, &unique("stores-group"), "", 600_000).await?;
        let metadata: Arc<dyn MetadataSource> = Arc::new(move || Some(group.clone()));
        let input_tp = TopicPartition::new(input.as_str(), 0);
        let mut topic_cfg = SnapshotConfig::new(&snapshots, unique("stores-topic"));
        topic_cfg.max_queued_writes = topic_cfg.max_queued_writes.max(keys * 2);
        let topic = SnapshotStore::acquire(
            client.clone(),
            topic_cfg,
            Assignment {
                input: input_tp.clone(),
                assigned_offset: 0,
                metadata: metadata.clone(),
            },
        )
        .await?;
        let pg_store = PgSnapshotStore::acquire(
            client.clone(),
            &SnapshotConfig::new("unused", unique("stores-pg")),
            &PgStoreConfig::new(pg.url()),
            input_tp,
            metadata,
            async { Ok(0) },
        )
        .await?;
        let stores = [Store::Topic(topic), Store::Postgres(pg_store)];
        let mut times: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        for round in 0..=options.waves {
            for (i, store) in stores.iter().enumerate() {
                let writes = wave_of(keys, round);
                let began = Instant::now();
                store.wave(writes).await?;
                if round > 0 {
                    times[i].push(began.elapsed().as_secs_f64() * 1e3);
                }
            }
        }
        for s in stores {
            s.close().await;
        }
        let [topic_ms, pg_ms] = times.map(|mut t| {
            t.sort_by(f64::total_cmp);
            (t[t.len() / 2], t[(t.len() * 9 / 10).min(t.len() - 1)])
        });
        let rate = |ms: f64| keys as f64 / (ms / 1e3);
        let _ = writeln!(
            out,
            "| {keys} | {:.1} ms [{:.1}] | {:.1} ms [{:.1}] | {:.0} | {:.0} | {:.2}x |",
            topic_ms.0,
            topic_ms.1,
            pg_ms.0,
            pg_ms.1,
            rate(topic_ms.0),
            rate(pg_ms.0),
            pg_ms.0 / topic_ms.0
        );
        let _ = snapfence::admin::delete_topic(&client, &input).await;
        let _ = snapfence::admin::delete_topic(&client, &snapshots).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(out)
}

async fn pg_version(url: &str) -> Result<String, Error> {
    let (pg, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    let task = tokio::spawn(connection);
    let v: String = pg.query_one("SHOW server_version", &[]).await?.get(0);
    drop(pg);
    let _ = task.await;
    Ok(format!("PostgreSQL {v}"))
}
