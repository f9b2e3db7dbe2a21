//! Consume-transform-produce: read words from an input topic, write them upper-cased to an output topic,
//! and commit the input offsets in the same transaction (`send_offsets`, fenced by the consumer group's
//! live generation). The first attempt is aborted on purpose to show the step a correct loop must not
//! skip: after an abort the consumer's position has moved past the batch, so it rewinds to the group's
//! committed offsets and reads the batch again.
//!
//! Run: `cargo run --example transform -- --bootstrap host:port`. It creates two topics with unique names
//! and deletes them at the end.

use std::time::{Duration, Instant};

use snapfence::consumer::{
    list_offsets, GroupConfig, GroupConsumer, GroupConsumerConfig, OffsetReset, OffsetSpec,
    PartitionReader, PartitionRecords, ReaderConfig, StartAt,
};
use snapfence::producer::{
    Producer, ProducerConfig, ProducerError, ProducerRecord, TopicPartition, TransactionalConfig,
    TransactionalProducer,
};
use snapfence::records::IsolationLevel;
use snapfence::{admin, Client, ClientConfig, GroupMetadata};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    let at = args.iter().position(|a| a == "--bootstrap");
    let bootstrap = at
        .and_then(|i| args.get(i + 1))
        .map_or("localhost:9092", String::as_str);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    let suffix = format!("{}-{}", std::process::id(), now.as_nanos());
    let (input, output) = (format!("words-{suffix}"), format!("shouts-{suffix}"));
    let client = Client::connect(ClientConfig::new(bootstrap)).await?;
    admin::create_topic(&client, &input, 1, -1, &[]).await?;
    admin::create_topic(&client, &output, 1, -1, &[]).await?;
    let words = ["kafka", "fences", "stale", "owners"];
    let plain = Producer::new(client.clone(), ProducerConfig::default()).await?;
    for w in words {
        plain
            .send(ProducerRecord::new(input.as_str(), Some(w.into())))
            .await?
            .await?;
    }
    plain.close().await;

    let mut config = GroupConsumerConfig::new(GroupConfig::new(format!("shouter-{suffix}")));
    config.reader.reset = OffsetReset::Earliest; // where a partition with no committed offset starts
    config.reader.isolation = IsolationLevel::ReadCommitted; // never transform aborted input
    let mut consumer =
        GroupConsumer::subscribe(client.clone(), config, [input.as_str()], ()).await?;
    // A stable transactional id per worker: a restarted worker fences its predecessor.
    let txn = TransactionalConfig::new(format!("shouter-{suffix}-0"));
    let mut producer = TransactionalProducer::init(client.clone(), txn).await?;

    let (mut attempt, mut done, deadline) = (0, 0, Instant::now() + Duration::from_secs(60));
    while done < words.len() as i64 && Instant::now() < deadline {
        let batches = consumer.poll(Duration::from_millis(500)).await?;
        if batches.is_empty() {
            continue;
        }
        attempt += 1;
        // The token of this poll's generation: a member rebalanced out cannot commit with it.
        let group = consumer.group_metadata().require()?;
        let committed = match transact(&mut producer, &output, &batches, &group).await {
            // The first attempt stops short of its commit on purpose, as a failed step would.
            Ok(_) if attempt == 1 => None,
            Ok(end) => match producer.commit().await {
                Ok(()) => Some(end),
                Err(e) if e.is_abortable() => None,
                Err(e) => return Err(e.into()), // fatal: stop; outcome unknown: commit again
            },
            Err(e) if e.is_abortable() => None,
            Err(e) => return Err(e.into()),
        };
        if let Some(end) = committed {
            done = end;
            println!("attempt {attempt}: committed input up to offset {done}");
            continue;
        }
        // Nothing of the attempt is visible, but the consumer's position has moved past the batch:
        // without this rewind the aborted batch would be skipped for good.
        producer.abort().await?;
        for tp in consumer.assignment() {
            let committed = consumer.committed(std::slice::from_ref(&tp)).await?;
            let start = committed[&tp].map_or(StartAt::Earliest, StartAt::Offset);
            consumer.seek(&tp, start);
            println!("attempt {attempt}: aborted; rewound {tp} to {start:?}");
        }
    }

    if done < words.len() as i64 {
        return Err("not every word was committed within 60 s".into());
    }

    // What a read_committed reader of the output sees: the committed attempt only, never the aborted one.
    let out = TopicPartition::new(output.as_str(), 0);
    let hw = list_offsets(
        &client,
        std::slice::from_ref(&out),
        OffsetSpec::Latest,
        IsolationLevel::ReadUncommitted,
    )
    .await?[&out];
    let mut reader_config = ReaderConfig::default();
    reader_config.isolation = IsolationLevel::ReadCommitted;
    let mut reader = PartitionReader::new(client.clone(), reader_config);
    reader.assign(out.clone(), StartAt::Earliest);
    let mut seen = Vec::new();
    // The commit's markers land just after it returns: read until the position passes the high watermark.
    while reader.position(&out).is_none_or(|p| p < hw) && Instant::now() < deadline {
        for batch in reader.fetch().await? {
            seen.extend(batch.records.iter().map(|r| {
                String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned()
            }));
        }
    }
    println!("output (read_committed): {}", seen.join(" "));
    let input_tp = TopicPartition::new(input.as_str(), 0);
    let committed = consumer.committed(std::slice::from_ref(&input_tp)).await?[&input_tp];
    println!("committed input offset: {committed:?}");

    consumer.close(Duration::from_secs(5)).await?;
    producer.close().await;
    admin::delete_topic(&client, &input).await?;
    admin::delete_topic(&client, &output).await?;
    println!("deleted topics {input} and {output}");
    Ok(())
}

/// One transaction's body: the batches' words upper-cased to `output`, then the input offsets after them
/// (fenced by `group`). Returns the input offset it commits.
async fn transact(
    producer: &mut TransactionalProducer,
    output: &str,
    batches: &[PartitionRecords],
    group: &GroupMetadata,
) -> Result<i64, ProducerError> {
    producer.begin()?;
    let mut offsets = Vec::new();
    for batch in batches {
        for r in &batch.records {
            let shout = r.value.as_deref().unwrap_or_default().to_ascii_uppercase();
            // No need to await each delivery: the commit waits for every record, and fails if one did.
            let _delivery = producer
                .send(ProducerRecord::new(output, Some(shout.into())))
                .await?;
        }
        // The next offset to read (past any transaction marker the batch ended on).
        offsets.push((batch.partition.clone(), batch.next_offset.into()));
    }
    let end = batches.iter().map(|b| b.next_offset).max().unwrap_or(0);
    producer.send_offsets(offsets, group).await?;
    Ok(end)
}
