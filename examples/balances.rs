//! A fenced per-key fold: account balances folded from deposits and withdrawals with `snapshot::Flow`.
//! Each account's balance is snapshotted to a compacted topic inside a transaction that also commits the
//! input offset, fenced by the consumer group's generation, so a stale owner can never overwrite it.
//!
//! Run: `cargo run --example balances -- --bootstrap host:port [--keep]`. It creates an input topic and a
//! snapshot topic with unique names, and deletes them at the end unless `--keep` is given (then it prints
//! the snapshot topic's name, for `cargo run --example recover -- --bootstrap host:port --topic NAME`).

use std::time::{Duration, Instant};

use bytes::Bytes;
use snapfence::consumer::{
    committed_offsets, list_offsets, GroupConfig, GroupConsumerConfig, OffsetReset, OffsetSpec,
};
use snapfence::producer::{Producer, ProducerConfig, ProducerRecord, TopicPartition};
use snapfence::records::{IsolationLevel, Record};
use snapfence::snapshot::{BoxError, Change, Flow, FlowConfig, Fold, Outputs, SnapshotConfig};
use snapfence::{admin, Client, ClientConfig};

/// The fold: a balance in cents per account; an event's value is a signed amount such as `+100`.
struct Balances;

impl Fold for Balances {
    type State = i64;
    fn fold(
        &self,
        _account: &Bytes,
        balance: &mut Option<i64>,
        event: &Record,
        _out: &mut Outputs,
    ) -> Change {
        let amount = event
            .value
            .as_deref()
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|a| a.parse::<i64>().ok());
        match amount {
            Some(amount) => {
                *balance.get_or_insert(0) += amount;
                Change::Update
            }
            None => Change::Keep, // a malformed event changes nothing
        }
    }
    fn encode(&self, balance: &i64) -> Bytes {
        balance.to_string().into()
    }
    fn decode(&self, bytes: &[u8]) -> Result<i64, BoxError> {
        Ok(std::str::from_utf8(bytes)?.parse()?)
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
    };
    let bootstrap = arg("--bootstrap").map_or("localhost:9092", String::as_str);
    let keep = args.iter().any(|a| a == "--keep");
    let suffix = unique_suffix();
    let (input, snapshots) = (format!("deposits-{suffix}"), format!("balances-{suffix}"));

    let client = Client::connect(ClientConfig::new(bootstrap)).await?;
    admin::create_topic(&client, &input, 2, -1, &[]).await?;
    admin::create_topic(&client, &snapshots, 2, -1, &[("cleanup.policy", "compact")]).await?;

    let producer = Producer::new(client.clone(), ProducerConfig::default()).await?;
    let events = [
        ("alice", "+100"),
        ("bob", "+50"),
        ("alice", "-30"),
        ("carol", "+20"),
        ("bob", "-10"),
        ("alice", "+5"),
    ];
    for (account, amount) in events {
        let record = ProducerRecord::new(input.as_str(), Some(amount.into())).key(account);
        producer.send(record).await?.await?;
    }
    let partitions = [0, 1].map(|p| TopicPartition::new(input.as_str(), p));
    let ends = list_offsets(
        &client,
        &partitions,
        OffsetSpec::Latest,
        IsolationLevel::ReadUncommitted,
    )
    .await?;

    // A fresh group has no committed offset: start from the earliest event.
    let group = format!("balances-{suffix}");
    let mut consumer = GroupConsumerConfig::new(GroupConfig::new(&group));
    consumer.reader.reset = OffsetReset::Earliest;
    let config = FlowConfig::new(consumer, &input, SnapshotConfig::new(&snapshots, &group));
    let mut flow = Flow::start(client.clone(), config, Balances).await?;

    // Poll until this member holds both partitions and has folded every event written above.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        flow.poll_once(Duration::from_millis(200)).await?;
        let mut caught_up = true;
        for tp in &partitions {
            caught_up &= flow.position(tp.partition) >= Some(ends[tp]);
        }
        if caught_up {
            break;
        }
        if Instant::now() > deadline {
            return Err("the flow did not catch up within 60 s".into());
        }
    }
    // Snapshot every dirty key, then commit the input offsets, each in a fenced transaction.
    flow.persist().await?;
    flow.commit().await?;

    let mut balances: Vec<(String, i64)> = Vec::new();
    for p in 0..2 {
        for (account, balance) in flow.state(p).unwrap_or_default() {
            balances.push((String::from_utf8_lossy(&account).into_owned(), balance));
        }
    }
    balances.sort();
    for (account, balance) in &balances {
        println!("balance {account} = {balance}");
    }
    let committed = committed_offsets(&client, &group, &partitions).await?;
    let committed: Vec<String> = committed
        .iter()
        .map(|(tp, o)| format!("{}={}", tp.partition, o.unwrap_or(-1)))
        .collect();
    println!("committed input offsets: {}", committed.join(" "));

    // Persist what is due, commit, and leave the group, so the next owner need not wait out our session.
    flow.close().await?;
    producer.close().await;
    if keep {
        println!("kept input topic {input} and snapshot topic {snapshots}");
    } else {
        admin::delete_topic(&client, &input).await?;
        admin::delete_topic(&client, &snapshots).await?;
        println!("deleted topics {input} and {snapshots}");
    }
    Ok(())
}

/// Topic, group and transactional-id names no earlier run used: `<pid>-<unix nanos>`.
fn unique_suffix() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    format!("{}-{}", std::process::id(), now.map_or(0, |d| d.as_nanos()))
}
