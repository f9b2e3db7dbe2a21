//! rust-rdkafka (librdkafka, C) running the snapfence-bench workloads. Same settings as the Java peer:
//! acks=all, idempotent, linger.ms 5 (0 for plain-seq), batch.size 256 KiB.
//!
//! Two differences the C library forces, both outside the timed part or equal in cost:
//! - rust-rdkafka cannot build group metadata from parts, so the transactional workloads join their own
//!   classic group (`GROUP-rdkafka`, subscribed to INPUT) and commit with that member's real generation;
//!   the broker checks the fence the same way.
//! - librdkafka's consumer position does not count the trailing commit marker, so the recovery read ends at
//!   the partition-EOF event once the last stable offset (its own watermark query at read_committed) has
//!   reached the high watermark captured first.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{key, result, value, Args};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{Message, Offset, TopicPartitionList};

type Error = Box<dyn std::error::Error + Send + Sync>;

const T: Duration = Duration::from_secs(60);

fn producer(
    bootstrap: &str,
    linger_ms: &str,
    txn_id: Option<&str>,
) -> Result<FutureProducer, Error> {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("linger.ms", linger_ms)
        .set("batch.size", "262144");
    if let Some(id) = txn_id {
        c.set("transactional.id", id);
    }
    Ok(c.create()?)
}

fn record<'a>(topic: &'a str, k: &'a [u8], v: &'a [u8]) -> FutureRecord<'a, [u8], [u8]> {
    FutureRecord::to(topic).partition(0).key(k).payload(v)
}

async fn plain(a: &Args, burst: bool) -> Result<(), Error> {
    let (topic, n, size) = (a.s(2), a.n(3), a.n(4));
    let p = producer(a.s(1), a.s(5), None)?;
    let (k, v) = (key(n), value(size, n));
    p.send(record(topic, &k, &v), T).await.map_err(|(e, _)| e)?;
    let (keys, values): (Vec<_>, Vec<_>) = (0..n).map(|i| (key(i), value(size, i))).unzip();
    let began = Instant::now();
    if burst {
        // plain-burst's optional PARTITIONS: record i goes to partition i % PARTITIONS.
        let parts = a.n_or(6, 1).max(1);
        let mut pending = Vec::with_capacity(n);
        for i in 0..n {
            let r = record(topic, &keys[i], &values[i]).partition((i % parts) as i32);
            pending.push(p.send_result(r).map_err(|(e, _)| e)?);
        }
        for d in pending {
            d.await?.map_err(|(e, _)| e)?;
        }
    } else {
        for i in 0..n {
            p.send(record(topic, &keys[i], &values[i]), T)
                .await
                .map_err(|(e, _)| e)?;
        }
    }
    result(began, n, 0, "");
    Ok(())
}

async fn txn(a: &Args, cap: usize) -> Result<(), Error> {
    let (topic, n, size) = (a.s(2), a.n(8), a.n(9));
    // A member of our own group, for a real generation (see the module docs).
    let member: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", a.s(1))
        .set("group.id", format!("{}-rdkafka", a.s(5)))
        .set("enable.auto.commit", "false")
        .create()?;
    member.subscribe(&[a.s(4)])?;
    let deadline = Instant::now() + T;
    while member.assignment()?.count() == 0 {
        if Instant::now() > deadline {
            return Err("the rdkafka member never got its assignment".into());
        }
        let _ = member.poll(Duration::from_millis(100));
    }
    let group = member.group_metadata().ok_or("no group metadata")?;
    let input = a.s(4);
    let offsets = |o: i64| -> Result<TopicPartitionList, Error> {
        let mut l = TopicPartitionList::new();
        l.add_partition_offset(input, 0, Offset::Offset(o))?;
        Ok(l)
    };
    let p = producer(a.s(1), "5", Some(a.s(3)))?;
    p.init_transactions(T)?;
    let (k, v) = (key(n), value(size, n));
    p.begin_transaction()?;
    p.send_result(record(topic, &k, &v)).map_err(|(e, _)| e)?;
    p.send_offsets_to_transaction(&offsets(0)?, &group, T)?;
    p.commit_transaction(T)?;
    let (keys, values): (Vec<_>, Vec<_>) = (0..n).map(|i| (key(i), value(size, i))).unzip();
    let began = Instant::now();
    let mut txns = 0;
    let mut first = 0;
    while first < n {
        let last = n.min(first + cap);
        p.begin_transaction()?;
        let mut pending = Vec::with_capacity(last - first);
        for i in first..last {
            pending.push(
                p.send_result(record(topic, &keys[i], &values[i]))
                    .map_err(|(e, _)| e)?,
            );
        }
        p.send_offsets_to_transaction(&offsets(last as i64)?, &group, T)?;
        p.commit_transaction(T)?;
        for d in pending {
            d.await?.map_err(|(e, _)| e)?;
        }
        txns += 1;
        first = last;
    }
    result(began, n, 0, &format!(" txns={txns}"));
    Ok(())
}

/// Earliest to the end at read_committed (see the module docs for where the read stops).
fn recover(bootstrap: &str, topic: &str) -> Result<HashMap<Vec<u8>, Vec<u8>>, Error> {
    let probe: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("isolation.level", "read_uncommitted")
        .create()?;
    let (_, target) = probe.fetch_watermarks(topic, 0, T)?;
    drop(probe);
    // A group id only because librdkafka's consumer wants one; assign() never joins the group.
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "snapfence-bench-rdkafka-reader")
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)?;
    c.assign(&tpl)?;
    let mut state = HashMap::new();
    loop {
        match c.poll(Duration::from_millis(500)) {
            Some(Ok(m)) => {
                let Some(k) = m.key() else { continue };
                match m.payload() {
                    Some(v) => state.insert(k.to_vec(), v.to_vec()),
                    None => state.remove(k),
                };
            }
            // At EOF the fetch position is the last stable offset: done once that reached the target.
            Some(Err(KafkaError::PartitionEOF(_))) => {
                if c.fetch_watermarks(topic, 0, T)?.1 >= target {
                    break;
                }
            }
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
    }
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
                recover(a.s(1), a.s(2))?;
            }
            let began = Instant::now();
            let state = recover(a.s(1), a.s(2))?;
            result(began, state.len(), bytes(&state), "");
            Ok(())
        }
        "takeover" => {
            let began = Instant::now();
            let p = producer(a.s(1), "5", Some(&format!("{}-0", a.s(3))))?;
            p.init_transactions(T)?;
            let acquire = began.elapsed().as_secs_f64() * 1e3;
            let state = recover(a.s(1), a.s(2))?;
            result(
                began,
                state.len(),
                bytes(&state),
                &format!(" acquire_ms={acquire:.3}"),
            );
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
