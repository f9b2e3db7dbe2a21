//! snapfence's side of every workload, run as a child process of the runner (`snapfence-bench peer ...`)
//! with the same arguments every peer takes, so each client pays its own process and is measured alike.
//!
//! Every workload prints one `RESULT` line (see [`crate::workload::Outcome`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use snapfence::net::{Client, ClientConfig};
use snapfence::producer::{
    Producer, ProducerConfig, ProducerRecord, TopicPartition, TransactionalConfig,
    TransactionalProducer,
};
use snapfence::snapshot::{
    recover, Assignment, MetadataSource, PartitionLog, RecoveryConfig, SnapshotConfig,
    SnapshotStore,
};
use snapfence::GroupMetadata;

use crate::workload::{key, peak_rss_kib, value, Outcome, Work};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Runs one workload and returns what it measured.
pub async fn run(work: Work) -> Result<Outcome, Error> {
    match work {
        Work::PlainSeq {
            bootstrap,
            topic,
            n,
            size,
            linger_ms,
        } => plain(&bootstrap, &topic, n, size, linger_ms, false, 1).await,
        Work::PlainBurst {
            bootstrap,
            topic,
            n,
            size,
            linger_ms,
            partitions,
        } => plain(&bootstrap, &topic, n, size, linger_ms, true, partitions).await,
        Work::TxnSeq { txn, n, size } => group_commit(txn, n, size, 256, false).await,
        Work::TxnBurst { txn, n, size, cap } => group_commit(txn, n, size, cap, true).await,
        Work::TxnMarker { txn, n } => marker(txn, n).await,
        Work::Recover {
            bootstrap,
            topic,
            reads,
        } => {
            let mut began = Instant::now();
            let mut client = connect(&bootstrap).await?;
            for _ in 1..reads {
                recover_partition(&client, &topic).await?;
                began = Instant::now();
                client = connect(&bootstrap).await?;
            }
            let (records, bytes) = recover_partition(&client, &topic).await?;
            Ok(Outcome {
                ms: ms(began.elapsed()),
                records,
                bytes,
                peak_rss_kib: peak_rss_kib(),
                ..Outcome::default()
            })
        }
        Work::Takeover {
            bootstrap,
            topic,
            txn_prefix,
        } => {
            // From the new owner's acquire (its producer init fences the crashed owner and aborts its open
            // transaction) to the recovered state.
            let began = Instant::now();
            let client = connect(&bootstrap).await?;
            let mut config = SnapshotConfig::new(&topic, &txn_prefix);
            config.recovery_stall_timeout = Some(Duration::from_secs(120));
            let group = GroupMetadata::new("bench-takeover", 1, "m", None)?;
            let assignment = Assignment {
                input: TopicPartition::new(topic.as_str(), 0),
                assigned_offset: 0,
                metadata: Arc::new(move || Some(group.clone())),
            };
            let store = SnapshotStore::acquire(client.clone(), config, assignment).await?;
            let acquire_ms = ms(began.elapsed());
            let (records, bytes) = recover_partition(&client, &topic).await?;
            let total = began.elapsed();
            store.close().await;
            Ok(Outcome {
                ms: ms(total),
                acquire_ms: Some(acquire_ms),
                records,
                bytes,
                peak_rss_kib: peak_rss_kib(),
                ..Outcome::default()
            })
        }
        Work::Fill {
            bootstrap,
            topic,
            n,
            size,
        } => {
            let client = connect(&bootstrap).await?;
            snapfence::admin::create_topic(
                &client,
                &topic,
                1,
                -1,
                &[("cleanup.policy", "compact")],
            )
            .await?;
            let began = Instant::now();
            fill(&client, &topic, n, size).await?;
            Ok(Outcome {
                ms: ms(began.elapsed()),
                records: n as u64,
                ..Outcome::default()
            })
        }
        Work::CrashOwner {
            bootstrap,
            topic,
            txn_id,
            n,
            size,
        } => {
            // Opens a transaction, writes into it, says so, and waits to be killed with it open.
            let client = connect(&bootstrap).await?;
            let mut config = TransactionalConfig::new(txn_id);
            config.transaction_timeout = Duration::from_secs(600);
            let mut producer = TransactionalProducer::init(client, config).await?;
            producer.begin()?;
            let mut last = None;
            for i in 0..n {
                let r = ProducerRecord::new(topic.as_str(), Some(value(size, i)))
                    .key(key(i))
                    .partition(0);
                last = Some(producer.send(r).await?);
            }
            if let Some(delivery) = last {
                delivery.await?;
            }
            println!("OPEN");
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Err("the crashed owner was never killed".into())
        }
    }
}

/// The variable the runner sets to run snapfence with another `connections_per_broker` (its
/// `--connections` clients); unset, the default.
pub const CONNECTIONS_ENV: &str = "SNAPFENCE_BENCH_CONNECTIONS";

async fn connect(bootstrap: &str) -> Result<Client, Error> {
    let mut config = ClientConfig::new(bootstrap);
    if let Some(n) = std::env::var(CONNECTIONS_ENV)
        .ok()
        .and_then(|n| n.parse().ok())
    {
        config.connections_per_broker = n;
    }
    Ok(Client::connect(config).await?)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The recovery read: earliest to the captured high watermark at read_committed, into a map.
async fn recover_partition(client: &Client, topic: &str) -> Result<(u64, u64), Error> {
    let mut log = PartitionLog::new(client.clone(), topic, 0);
    let config = RecoveryConfig {
        stall_timeout: Some(Duration::from_secs(120)),
        ..RecoveryConfig::default()
    };
    let (state, _stats) = recover(&mut log, 0, &config).await?;
    // The state is what recovery produces: count it, so its size is what the peers report too.
    Ok((state.len() as u64, state.live_bytes() as u64))
}

/// Seed experiment A(a) (one at a time) and the baseline of B (all at once): the idempotent producer.
async fn plain(
    bootstrap: &str,
    topic: &str,
    n: usize,
    size: usize,
    linger_ms: u64,
    burst: bool,
    partitions: usize,
) -> Result<Outcome, Error> {
    let client = connect(bootstrap).await?;
    let lanes = client.connections_per_broker();
    let mut config = ProducerConfig::default();
    config.linger = Duration::from_millis(linger_ms);
    let producer = Producer::new(client, config).await?;
    let record = |i: usize| {
        ProducerRecord::new(topic, Some(value(size, i)))
            .key(key(i))
            .partition((i % partitions) as i32)
    };
    // Warm-up: metadata, the producer id and the connections, before the clock starts: one record on
    // each connection (consecutive partitions take consecutive connections).
    for i in 0..lanes.min(partitions).max(1) {
        producer.send(record(n + i)).await?.await?;
    }
    let began = Instant::now();
    if burst {
        let mut deliveries = Vec::with_capacity(n);
        for i in 0..n {
            deliveries.push(producer.send(record(i)).await?);
        }
        for d in deliveries {
            d.await?;
        }
    } else {
        for i in 0..n {
            producer.send(record(i)).await?.await?;
        }
    }
    let elapsed = began.elapsed();
    producer.close().await;
    Ok(Outcome {
        ms: ms(elapsed),
        records: n as u64,
        ..Outcome::default()
    })
}

/// Seed experiments A(b), A(c) and B: writes through the snapshot store's group commit, each transaction
/// fenced by a real classic group's generation. Transactions are the store's own count of those it began.
async fn group_commit(
    txn: crate::workload::TxnArgs,
    n: usize,
    size: usize,
    cap: usize,
    burst: bool,
) -> Result<Outcome, Error> {
    let client = connect(&txn.bootstrap).await?;
    let group = GroupMetadata::new(&txn.group, txn.generation, &txn.member, None)?;
    let metadata: Arc<dyn MetadataSource> = Arc::new(move || Some(group.clone()));
    let mut config = SnapshotConfig::new(&txn.topic, &txn.txn_id);
    config.max_writes_per_transaction = cap;
    let assignment = Assignment {
        input: TopicPartition::new(txn.input.as_str(), 0),
        assigned_offset: 0,
        metadata,
    };
    let store = SnapshotStore::acquire(client, config, assignment).await?;
    // Warm-up: coordinators found, partition and group added once, connections open.
    store.write(key(n), Some(value(size, n))).await?;
    let warm_up = store.transactions();
    let began = Instant::now();
    if burst {
        let mut pending = Vec::with_capacity(n);
        for i in 0..n {
            pending.push(
                store
                    .try_write(key(i), Some(value(size, i)))
                    .map_err(|e| format!("queue full: {e}"))?,
            );
        }
        for p in pending {
            p.await?;
        }
    } else {
        for i in 0..n {
            store.write(key(i), Some(value(size, i))).await?;
        }
    }
    let elapsed = began.elapsed();
    let transactions = store.transactions() - warm_up;
    store.close().await;
    Ok(Outcome {
        ms: ms(elapsed),
        txns: Some(transactions),
        records: n as u64,
        ..Outcome::default()
    })
}

/// The marker round: the broker's work per transaction after EndTxn is answered (the COMMIT markers to
/// the snapshot partition and to `__consumer_offsets`, then CompleteCommit in the transaction log), which
/// the next transaction of the same id must wait for whatever the client. `n` transactions of one 1-byte
/// record and a fenced offset commit each, one after the other; after each commit, DescribeTransactions
/// is asked back to back until the coordinator no longer says PrepareCommit. `ms` is the median time from
/// the commit's return to that answer (resolution: one DescribeTransactions round trip). One warm-up
/// transaction comes first.
async fn marker(txn: crate::workload::TxnArgs, n: usize) -> Result<Outcome, Error> {
    let client = connect(&txn.bootstrap).await?;
    let group = GroupMetadata::new(&txn.group, txn.generation, &txn.member, None)?;
    let input = TopicPartition::new(txn.input.as_str(), 0);
    let mut producer =
        TransactionalProducer::init(client.clone(), TransactionalConfig::new(&txn.txn_id)).await?;
    let mut rounds = Vec::with_capacity(n);
    for i in 0..=n {
        producer.begin()?;
        let record = ProducerRecord::new(txn.topic.as_str(), Some(value(1, i)))
            .key(key(i))
            .partition(0);
        let delivery = producer.send(record).await?;
        producer.send_buffered();
        producer
            .send_offsets([(input.clone(), (i as i64).into())], &group)
            .await?;
        producer.commit().await?;
        let answered = Instant::now();
        delivery.await?;
        loop {
            let state = snapfence::admin::describe_transaction(&client, &txn.txn_id)
                .await?
                .ok_or("the coordinator does not know the transactional id")?
                .state;
            if state != "PrepareCommit" {
                break;
            }
            if answered.elapsed() > Duration::from_secs(30) {
                return Err("a transaction stayed in PrepareCommit for 30 s".into());
            }
        }
        if i > 0 {
            rounds.push(ms(answered.elapsed()));
        }
    }
    producer.close().await;
    rounds.sort_by(f64::total_cmp);
    Ok(Outcome {
        ms: rounds
            .get(n / 2)
            .copied()
            .ok_or("no transactions were asked for")?,
        txns: Some(n as u64),
        records: n as u64,
        ..Outcome::default()
    })
}

/// Fills `topic` with `n` committed snapshots of `size` bytes, 5 000 to a transaction: the data set every
/// client then recovers.
pub async fn fill(client: &Client, topic: &str, n: usize, size: usize) -> Result<(), Error> {
    let mut config = TransactionalConfig::new(protocol_tests::unique("bench-fill"));
    config.producer.linger = Duration::from_millis(5);
    let mut producer = TransactionalProducer::init(client.clone(), config).await?;
    for chunk in (0..n).collect::<Vec<_>>().chunks(5_000) {
        producer.begin()?;
        let mut last = None;
        for &i in chunk {
            let r = ProducerRecord::new(topic, Some(value(size, i)))
                .key(key(i))
                .partition(0);
            last = Some(producer.send(r).await?);
        }
        producer.commit().await?;
        if let Some(d) = last {
            d.await?;
        }
    }
    producer.close().await;
    Ok(())
}
