//! `snapfence-bench disk`: what a restart on a data directory costs (issue 36), against a full read,
//! in one run on one Kafka node.
//!
//! Per key count N: member A, with its state on disk, folds one event for each of N keys (one
//! partition), persists and closes (its close brings its image to the high watermark). Another member,
//! in memory, then changes `--changed` of the keys (one event each) and closes. Three members then take
//! the partition over in turn, each timed from `Flow::start` to holding it with every snapshot
//! recovered: on A's directory (resumes from the checkpoint, reads the changed keys' snapshots), on an
//! empty directory (reads the whole partition into a fresh image), and in memory (reads the whole
//! partition). Each is run `--repeat` times, interleaved; the median and range are printed, with the
//! records each read and its resident set (`VmRSS`) after the takeover.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol_tests::tally::Counter;
use protocol_tests::{dedicated, unique, ClusterSpec};
use snapfence::consumer::{GroupConfig, GroupConsumerConfig, OffsetReset};
use snapfence::net::{Client, ClientConfig};
use snapfence::producer::{Producer, ProducerConfig, ProducerRecord};
use snapfence::snapshot::{DiskState, Flow, FlowConfig, SnapshotConfig, StateConfig};

type Error = Box<dyn std::error::Error + Send + Sync>;

struct Options {
    keys: Vec<usize>,
    changed: f64,
    repeat: usize,
    out: Option<PathBuf>,
}

fn options(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        keys: vec![100_000, 1_000_000],
        changed: 0.01,
        repeat: 3,
        out: None,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().cloned().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--keys" => {
                o.keys = value()?
                    .split(',')
                    .map(|k| k.parse().map_err(|e| format!("--keys {k}: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--changed" => o.changed = value()?.parse().map_err(|e| format!("--changed: {e}"))?,
            "--repeat" => o.repeat = value()?.parse().map_err(|e| format!("--repeat: {e}"))?,
            "--out" => o.out = Some(value()?.into()),
            other => {
                return Err(format!(
                "unknown option {other}\nusage: snapfence-bench disk [--keys N,N] [--changed F] \
                     [--repeat R] [--out FILE]"
            ))
            }
        }
    }
    if !(0.0..=1.0).contains(&o.changed) || o.repeat == 0 || o.keys.is_empty() {
        return Err("--changed is a fraction, --repeat and --keys at least one".into());
    }
    Ok(o)
}

pub fn main(args: &[String]) -> i32 {
    let options = match options(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return 2;
        }
    };
    crate::block_on_and_write(run(&options), options.out.as_deref(), "disk benchmark")
}

struct World {
    client: Client,
    input: String,
    snapshots: String,
    group: String,
    prefix: String,
}

impl World {
    fn config(&self, state: StateConfig) -> FlowConfig {
        let mut g = GroupConfig::new(&self.group);
        g.session_timeout = Duration::from_secs(30);
        g.max_poll_interval = Duration::from_secs(300);
        let mut consumer = GroupConsumerConfig::new(g);
        consumer.reader.reset = OffsetReset::Earliest;
        let mut s = SnapshotConfig::new(&self.snapshots, &self.prefix);
        s.recovery_stall_timeout = Some(Duration::from_secs(300));
        let mut c = FlowConfig::new(consumer, &self.input, s);
        c.persist_every = Duration::from_secs(3600);
        c.commit_offsets_interval = Duration::from_secs(3600);
        c.state = state;
        c
    }

    async fn emit(&self, keys: std::ops::Range<usize>, tag: &str) -> Result<(), Error> {
        let producer = Producer::new(self.client.clone(), ProducerConfig::default()).await?;
        let mut pending = Vec::new();
        for k in keys {
            let r =
                ProducerRecord::new(self.input.as_str(), Some(Bytes::from(format!("{tag}-{k}"))))
                    .key(Bytes::from(format!("key-{k:09}")))
                    .partition(0);
            pending.push(producer.send(r).await?);
            if pending.len() >= 10_000 {
                for d in pending.drain(..) {
                    d.await?;
                }
            }
        }
        for d in pending {
            d.await?;
        }
        producer.close().await;
        Ok(())
    }

    /// A member on `state` that folds everything written, persists, commits and closes.
    async fn fold_all(&self, state: StateConfig, end: i64) -> Result<(), Error> {
        let mut flow = Flow::start(self.client.clone(), self.config(state), Counter).await?;
        let began = Instant::now();
        while flow.position(0).is_none_or(|p| p < end) {
            if began.elapsed() > Duration::from_secs(600) {
                return Err("a member never folded the input".into());
            }
            flow.poll_once(Duration::from_millis(50)).await?;
        }
        flow.persist().await?;
        flow.commit().await?;
        flow.close().await?;
        Ok(())
    }

    /// A takeover on `state`: milliseconds from start to holding the partition, the records its
    /// acquisition read, its VmRSS then.
    async fn takeover(&self, state: StateConfig) -> Result<(f64, u64, u64), Error> {
        let began = Instant::now();
        let mut flow = Flow::start(self.client.clone(), self.config(state), Counter).await?;
        while flow.partitions().is_empty() {
            if began.elapsed() > Duration::from_secs(600) {
                return Err("the takeover never completed".into());
            }
            flow.poll_once(Duration::from_millis(20)).await?;
        }
        let ms = began.elapsed().as_secs_f64() * 1000.0;
        let read = flow.disk_stats().records_read;
        let rss = crate::workload::status_kib("VmRSS:").unwrap_or(0);
        flow.close().await?;
        Ok((ms, read, rss))
    }
}

fn disk(dir: &Path) -> StateConfig {
    StateConfig::Disk(DiskState::new(dir, 1))
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

async fn run(options: &Options) -> Result<String, Error> {
    eprintln!("== starting one node");
    let kafka = dedicated(ClusterSpec::kafka4()).await;
    let client = Client::connect(ClientConfig::new(kafka.bootstrap())).await?;
    let scratch = std::env::temp_dir().join(unique("bench-disk"));
    let mut s = format!(
        "Kafka {}, one node. `snapfence-bench disk --changed {} --repeat {}`: one partition of N keys \
         (16-byte states), {:.1}% of them changed by another member; median of {} interleaved \
         takeovers [range], records the acquisition read, VmRSS after it.\n\n\
         | keys | changed | restart on its directory | full read into an empty directory | full read in memory | restart / full read in memory |\n\
         |---:|---:|---:|---:|---:|---:|\n",
        kafka.version(),
        options.changed,
        options.repeat,
        options.changed * 100.0,
        options.repeat
    );
    for &n in &options.keys {
        let w = World {
            client: client.clone(),
            input: unique("disk-input"),
            snapshots: unique("disk-snap"),
            group: unique("disk-group"),
            prefix: unique("disk-txn"),
        };
        snapfence::admin::create_topic(&client, &w.input, 1, -1, &[]).await?;
        snapfence::admin::create_topic(
            &client,
            &w.snapshots,
            1,
            -1,
            &[("cleanup.policy", "compact")],
        )
        .await?;
        let base = scratch.join(format!("n{n}"));
        let warm = base.join("warm");
        eprintln!(
            "== {n} keys: fold, image, change {:.1}%",
            options.changed * 100.0
        );
        w.emit(0..n, "a").await?;
        w.fold_all(disk(&warm), n as i64).await?;
        let changed = ((n as f64) * options.changed).round() as usize;
        w.emit(0..changed, "b").await?;
        w.fold_all(StateConfig::Memory, (n + changed) as i64)
            .await?;

        let mut rows: [Vec<(f64, u64, u64)>; 3] = Default::default();
        for r in 0..options.repeat {
            // Each restart on a copy of the image as A left it, so each reads the same tail.
            let copy = base.join(format!("restart{r}"));
            copy_dir(&warm, &copy)?;
            rows[0].push(w.takeover(disk(&copy)).await?);
            rows[1].push(w.takeover(disk(&base.join(format!("empty{r}")))).await?);
            rows[2].push(w.takeover(StateConfig::Memory).await?);
            eprintln!(
                "   round {r}: restart {:?}, empty {:?}, memory {:?}",
                rows[0][r], rows[1][r], rows[2][r]
            );
            let _ = std::fs::remove_dir_all(&copy);
            let _ = std::fs::remove_dir_all(base.join(format!("empty{r}")));
        }
        // The in-memory state counts no records into an image: it read them all.
        let cell = |v: &mut Vec<(f64, u64, u64)>, read: Option<usize>| {
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
            let mid = v[v.len() / 2];
            (
                format!(
                    "{:.0} ms [{:.0}-{:.0}], {} read, {} MiB",
                    mid.0,
                    v[0].0,
                    v[v.len() - 1].0,
                    read.map_or(mid.1.to_string(), |n| format!("all {n}")),
                    mid.2 / 1024
                ),
                mid.0,
            )
        };
        let (restart, r_ms) = cell(&mut rows[0], None);
        let (empty, _) = cell(&mut rows[1], None);
        let (memory, m_ms) = cell(&mut rows[2], Some(n + changed));
        let _ = writeln!(
            s,
            "| {n} | {changed} | {restart} | {empty} | {memory} | {:.2}x |",
            r_ms / m_ms
        );
        let _ = std::fs::remove_dir_all(&base);
        for t in [&w.input, &w.snapshots] {
            let _ = snapfence::admin::delete_topic(&client, t).await;
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(s)
}
