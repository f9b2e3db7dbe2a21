//! confluent-kafka 1.0 (the pure-Rust port of the Java client) running the snapfence-bench workloads.
//! Same settings as the Java peer: acks=all, idempotent, linger.ms 5 (0 for plain-seq), batch.size 256 KiB;
//! the consumer runs with group.protocol=consumer, the only one this release supports (no group is joined).

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{key, result, value, Args};
use confluent_kafka::common::serialization::{ByteArrayDeserializer, ByteArraySerializer};
use confluent_kafka::common::TopicPartition;
use confluent_kafka::consumer::{
    Consumer, ConsumerConfig, ConsumerGroupMetadata, KafkaConsumer, OffsetAndMetadata,
};
use confluent_kafka::producer::{KafkaProducer, Producer, ProducerConfig, ProducerRecord};

type Error = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug)]
struct Group {
    id: String,
    generation: i32,
    member: String,
}

impl ConsumerGroupMetadata for Group {
    fn group_id(&self) -> &str {
        &self.id
    }
    fn generation_id(&self) -> i32 {
        self.generation
    }
    fn member_id(&self) -> &str {
        &self.member
    }
    fn group_instance_id(&self) -> Option<&str> {
        None
    }
}

fn props(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn producer(
    bootstrap: &str,
    linger_ms: &str,
    txn_id: Option<&str>,
) -> Result<KafkaProducer<Vec<u8>, Vec<u8>>, Error> {
    let mut p = props(&[
        ("bootstrap.servers", bootstrap),
        ("acks", "all"),
        ("enable.idempotence", "true"),
        ("linger.ms", linger_ms),
        ("batch.size", "262144"),
    ]);
    if let Some(id) = txn_id {
        p.insert("transactional.id".into(), id.into());
    }
    Ok(KafkaProducer::new(
        ProducerConfig::new(&p)?,
        ByteArraySerializer::default(),
        ByteArraySerializer::default(),
    )?)
}

fn record(topic: &str, k: &[u8], v: &[u8]) -> Result<ProducerRecord<Vec<u8>, Vec<u8>>, Error> {
    record_to(topic, 0, k, v)
}

fn record_to(
    topic: &str,
    partition: i32,
    k: &[u8],
    v: &[u8],
) -> Result<ProducerRecord<Vec<u8>, Vec<u8>>, Error> {
    Ok(ProducerRecord::with_partition_key(
        topic.to_owned(),
        Some(partition),
        Some(k.to_vec()),
        Some(v.to_vec()),
    )?)
}

async fn plain(a: &Args, burst: bool) -> Result<(), Error> {
    let (topic, n, size) = (a.s(2), a.n(3), a.n(4));
    let p = producer(a.s(1), a.s(5), None)?;
    Producer::send(&p, record(topic, &key(n), &value(size, n))?)
        .await?
        .get()
        .await?;
    let began = Instant::now();
    if burst {
        // plain-burst's optional PARTITIONS: record i goes to partition i % PARTITIONS.
        let parts = a.n_or(6, 1).max(1);
        let mut pending = Vec::with_capacity(n);
        for i in 0..n {
            let r = record_to(topic, (i % parts) as i32, &key(i), &value(size, i))?;
            pending.push(Producer::send(&p, r).await?);
        }
        for f in pending {
            f.get().await?;
        }
    } else {
        for i in 0..n {
            Producer::send(&p, record(topic, &key(i), &value(size, i))?)
                .await?
                .get()
                .await?;
        }
    }
    result(began, n, 0, "");
    p.close().await?;
    Ok(())
}

async fn txn(a: &Args, cap: usize) -> Result<(), Error> {
    let (topic, n, size) = (a.s(2), a.n(8), a.n(9));
    let p = producer(a.s(1), "5", Some(a.s(3)))?;
    let input = TopicPartition::new(a.s(4), 0);
    let group = Group {
        id: a.s(5).into(),
        generation: a.s(6).parse()?,
        member: a.s(7).into(),
    };
    let offsets = |o: i64| -> Result<HashMap<TopicPartition, OffsetAndMetadata>, Error> {
        Ok(HashMap::from([(input.clone(), OffsetAndMetadata::new(o)?)]))
    };
    p.init_transactions().await?;
    p.begin_transaction()?;
    Producer::send(&p, record(topic, &key(n), &value(size, n))?).await?;
    p.send_offsets_to_transaction(offsets(0)?, &group).await?;
    p.commit_transaction().await?;
    let began = Instant::now();
    let mut txns = 0;
    let mut first = 0;
    while first < n {
        let last = n.min(first + cap);
        p.begin_transaction()?;
        let mut pending = Vec::with_capacity(last - first);
        for i in first..last {
            pending.push(Producer::send(&p, record(topic, &key(i), &value(size, i))?).await?);
        }
        p.send_offsets_to_transaction(offsets(last as i64)?, &group)
            .await?;
        p.commit_transaction().await?;
        for f in pending {
            f.get().await?;
        }
        txns += 1;
        first = last;
    }
    result(began, n, 0, &format!(" txns={txns}"));
    p.close().await?;
    Ok(())
}

/// Earliest to the high watermark (captured first by a read_uncommitted consumer) at read_committed.
async fn recover(bootstrap: &str, topic: &str) -> Result<HashMap<Vec<u8>, Vec<u8>>, Error> {
    let tp = TopicPartition::new(topic, 0);
    let consumer = |isolation: &str| -> Result<KafkaConsumer<Vec<u8>, Vec<u8>>, Error> {
        let p = props(&[
            ("bootstrap.servers", bootstrap),
            ("group.protocol", "consumer"),
            ("enable.auto.commit", "false"),
            ("isolation.level", isolation),
        ]);
        Ok(KafkaConsumer::new(
            ConsumerConfig::new(&p)?,
            ByteArrayDeserializer::default(),
            ByteArrayDeserializer::default(),
        )?)
    };
    let target = {
        let mut probe = consumer("read_uncommitted")?;
        let end = probe.end_offsets(std::slice::from_ref(&tp)).await?;
        probe.close().await?;
        end[&tp]
    };
    let mut c = consumer("read_committed")?;
    c.assign(vec![tp.clone()]).await?;
    c.seek_to_beginning(std::slice::from_ref(&tp)).await?;
    let mut state = HashMap::new();
    while c.position(&tp).await? < target {
        for r in c.poll(Duration::from_millis(500)).await? {
            let Some(k) = r.key() else { continue };
            match r.value() {
                Some(v) => state.insert(k.clone(), v.clone()),
                None => state.remove(k),
            };
        }
    }
    c.close().await?;
    Ok(state)
}

fn bytes(state: &HashMap<Vec<u8>, Vec<u8>>) -> usize {
    state.iter().map(|(k, v)| k.len() + v.len()).sum()
}

async fn run(a: Args) -> Result<(), Error> {
    match a.name() {
        "plain-seq" => plain(&a, false).await,
        "plain-burst" => plain(&a, true).await,
        "txn-seq" => txn(&a, 1).await,
        "txn-burst" => txn(&a, a.n(10)).await,
        "recover" => {
            for _ in 1..a.n(3) {
                recover(a.s(1), a.s(2)).await?;
            }
            let began = Instant::now();
            let state = recover(a.s(1), a.s(2)).await?;
            result(began, state.len(), bytes(&state), "");
            Ok(())
        }
        "takeover" => {
            let began = Instant::now();
            let p = producer(a.s(1), "5", Some(&format!("{}-0", a.s(3))))?;
            p.init_transactions().await?;
            let acquire = began.elapsed().as_secs_f64() * 1e3;
            let state = recover(a.s(1), a.s(2)).await?;
            result(
                began,
                state.len(),
                bytes(&state),
                &format!(" acquire_ms={acquire:.3}"),
            );
            p.close().await?;
            Ok(())
        }
        other => Err(format!("unknown workload {other}").into()),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if let Err(e) = run(Args::from_env()).await {
        eprintln!("ERROR {e}");
        std::process::exit(1);
    }
}
