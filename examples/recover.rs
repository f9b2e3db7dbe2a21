//! The recovery read of a snapshot topic: every partition read at read_committed from the log start up to
//! the high watermark captured when the read began, folded into a compact per-key map (a value puts the
//! key, a tombstone removes it). An open transaction makes the read wait instead of silently under-reading.
//!
//! Run: `cargo run --example recover -- --bootstrap host:port [--topic NAME]`. With `--topic` it reads
//! that topic and changes nothing (try the one `balances --keep` leaves). Without it, it creates a
//! compacted topic with a unique name, writes snapshots in three transactions (one of them aborted, as a
//! fenced stale owner's would be), recovers it, and deletes it.
//!
//! A `Flow`'s snapshots print with a 9-byte envelope in front of the fold's own bytes: a version byte and
//! the offset of the last input event folded into the state, which lets a replay skip events already in
//! it.

use std::time::Duration;

use snapfence::producer::{ProducerRecord, TransactionalConfig, TransactionalProducer};
use snapfence::snapshot::{recover, PartitionLog, RecoveryConfig};
use snapfence::{admin, Client, ClientConfig};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
    };
    let bootstrap = arg("--bootstrap").map_or("localhost:9092", String::as_str);
    let client = Client::connect(ClientConfig::new(bootstrap)).await?;
    let (topic, own) = match arg("--topic") {
        Some(topic) => (topic.clone(), false),
        None => (seed(&client).await?, true),
    };

    let metadata = client.metadata(&[topic.as_str()]).await?;
    let partitions = metadata
        .topics
        .get(&topic)
        .map_or(0, |t| t.partitions.len() as i32);
    let config = RecoveryConfig {
        stall_timeout: Some(Duration::from_secs(60)),
        ..RecoveryConfig::default()
    };
    for partition in 0..partitions {
        let mut log = PartitionLog::new(client.clone(), &topic, partition);
        let (state, stats) = recover(&mut log, partition, &config).await?;
        println!(
            "partition {partition}: {} keys ({} bytes of keys and values) from {} committed records, \
             read to offset {} in {:?}",
            state.len(),
            state.live_bytes(),
            stats.records,
            stats.target,
            stats.elapsed
        );
        let mut entries: Vec<_> = state.iter().collect();
        entries.sort();
        for (key, value) in entries.iter().take(5) {
            println!("  {} = {}", key.escape_ascii(), value.escape_ascii());
        }
    }
    if own {
        admin::delete_topic(&client, &topic).await?;
        println!("deleted topic {topic}");
    }
    Ok(())
}

/// Creates a one-partition compacted topic and writes: a committed transaction of five snapshots, an
/// aborted one that overwrites `user-1` (recovery must not see it), and a committed one that updates
/// `user-3` and deletes `user-2`. Recovery finds 4 keys.
async fn seed(client: &Client) -> Result<String, BoxError> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    let topic = format!("snapshots-{}-{}", std::process::id(), now.as_nanos());
    admin::create_topic(client, &topic, 1, -1, &[("cleanup.policy", "compact")]).await?;
    let txn = TransactionalConfig::new(format!("{topic}-writer"));
    let mut producer = TransactionalProducer::init(client.clone(), txn).await?;
    let v1 = Some("v1");
    let first = [
        ("user-1", v1),
        ("user-2", v1),
        ("user-3", v1),
        ("user-4", v1),
        ("user-5", v1),
    ];
    transaction(&mut producer, &topic, &first, true).await?;
    let stale = [("user-1", Some("stale")), ("user-6", Some("ghost"))];
    transaction(&mut producer, &topic, &stale, false).await?;
    let last = [("user-3", Some("v2")), ("user-2", None)]; // None: a tombstone
    transaction(&mut producer, &topic, &last, true).await?;
    producer.close().await;
    println!("wrote 9 snapshots to {topic} in 3 transactions, the second aborted");
    Ok(topic)
}

/// Writes `(key, value)` snapshots in one transaction, then commits or aborts it.
async fn transaction(
    producer: &mut TransactionalProducer,
    topic: &str,
    writes: &[(&'static str, Option<&'static str>)],
    commit: bool,
) -> Result<(), BoxError> {
    producer.begin()?;
    for (key, value) in writes {
        let record = ProducerRecord::new(topic, value.map(Into::into)).key(*key);
        producer.send(record).await?.await?;
    }
    if commit {
        producer.commit().await?;
    } else {
        producer.abort().await?;
    }
    Ok(())
}
