//! `snapfence-bench scale`: how the fenced pipeline's cost grows with the number of snapshot partitions
//! one member holds and with the number of keys one partition recovers. snapfence only: no peer has a
//! flow runtime to take partitions over with.
//!
//! ```text
//! snapfence-bench scale [--nodes 1|3] [--partitions 1,8,64,1024] [--keys 10000,100000,1000000] [--out FILE] [--svg FILE]
//! ```
//!
//! Per partition count N, on one node: an input topic and a compacted snapshot topic of N partitions,
//! ten keys per partition of input. Member A (a [`Flow`]) starts, acquires all N partitions fresh,
//! folds the input and persists it in one wave (one transaction per partition); then it closes. Member
//! B starts in the same group and takes all N over: each partition's producer init fences A's id and the
//! partition's recovery read folds A's snapshots. Measured: A's time to hold all N, the persist wave, B's
//! time to hold all N (from `Flow::start`, the group join included) and B's sockets to the broker. At 64 partitions B also runs with one acquisition at a time (the
//! behaviour before acquisitions ran concurrently) and with a connection set per partition
//! (`partition_client_ids`), for comparison. Then member C (`snapfence-bench scale-hold`, a process
//! of its own, so that A's and B's freed memory cannot hide its growth) takes all N over from B and
//! reports its resident set before and after: the memory each held partition costs.
//!
//! Per key count K: one snapshot partition of K keys x 100 B, recovered by a child process
//! (`snapfence-bench peer recover`), which reports its time and peak resident set.
//!
//! With `--series R [--connections 1,2,4]` it measures takeovers only, as a statistic: per partition
//! count N, member A folds and persists once, then members take all N over again and again, R rounds
//! of every variant (each of the `connections_per_broker` settings, and a connection set per
//! partition), the variants in a rotating order within each round so that a slow spell of the machine
//! is shared out. Each variant's row is its median takeover with the range of all its runs.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol_tests::tally::Counter;
use protocol_tests::{dedicated, unique, ClusterSpec, KafkaCluster};
use snapfence::consumer::{
    list_offsets, GroupConfig, GroupConsumerConfig, OffsetReset, OffsetSpec,
};
use snapfence::net::{Client, ClientConfig};
use snapfence::producer::{Producer, ProducerConfig, ProducerRecord, TopicPartition};
use snapfence::records::IsolationLevel;
use snapfence::snapshot::{Flow, FlowConfig, SnapshotConfig};

use crate::workload::Outcome;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Input keys per partition.
const KEYS_PER_PARTITION: usize = 10;
/// Value size of the recovery rows' snapshots.
const RECOVERY_VALUE: usize = 100;
/// How long one member may take to hold every partition before the row fails.
const HOLD_DEADLINE: Duration = Duration::from_secs(600);

struct Options {
    partitions: Vec<usize>,
    keys: Vec<usize>,
    out: Option<PathBuf>,
    svg: Option<PathBuf>,
    /// 1, or 3 (replication factor 3, `min.insync.replicas` 2).
    nodes: usize,
    /// `--series`: takeovers only, this many rounds of every variant.
    series: Option<usize>,
    /// `--connections`: the `connections_per_broker` settings a series compares.
    connections: Vec<usize>,
}

fn options(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        partitions: vec![1, 8, 64, 1024],
        keys: vec![10_000, 100_000, 1_000_000],
        out: None,
        svg: None,
        nodes: 1,
        series: None,
        connections: vec![1, 2, 4],
    };
    let nums = |v: &str| -> Result<Vec<usize>, String> {
        v.split(',')
            .map(|n| {
                n.trim()
                    .parse::<usize>()
                    .map_err(|_| format!("not a number: {n}"))
            })
            .filter(|n| !matches!(n, Ok(0)))
            .collect()
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--partitions" => o.partitions = nums(value)?,
            "--keys" => o.keys = nums(value)?,
            "--out" => o.out = Some(PathBuf::from(value)),
            "--svg" => o.svg = Some(PathBuf::from(value)),
            "--series" => {
                o.series = Some(
                    value
                        .parse()
                        .ok()
                        .filter(|&r: &usize| r > 0)
                        .ok_or(format!("bad --series {value}"))?,
                )
            }
            "--connections" => o.connections = nums(value)?,
            "--nodes" => {
                o.nodes = match value.as_str() {
                    "1" => 1,
                    "3" => 3,
                    _ => return Err(format!("--nodes takes 1 or 3, not {value}")),
                }
            }
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    Ok(o)
}

/// One takeover row.
#[derive(Debug, Clone)]
struct Takeover {
    partitions: usize,
    /// How B was set up, when not the defaults.
    variant: &'static str,
    fresh_ms: Option<f64>,
    wave_ms: Option<f64>,
    takeover_ms: f64,
    sockets: usize,
    /// Member C, in a process of its own: resident set grown per partition it took over, KiB.
    rss_per_partition_kib: Option<f64>,
}

/// One recovery row.
#[derive(Debug, Clone)]
struct Recovery {
    keys: usize,
    data_kib: u64,
    outcome: Outcome,
}

/// Runs the scale rows; exit status 0 when every row ran.
pub fn main(args: &[String]) -> i32 {
    let options = match options(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return 2;
        }
    };
    crate::block_on_and_write(run(&options), options.out.as_deref(), "scale benchmark")
}

async fn run(options: &Options) -> Result<String, Error> {
    eprintln!("== starting {} node(s)", options.nodes);
    let spec = if options.nodes == 3 {
        ClusterSpec::three_nodes()
    } else {
        ClusterSpec::kafka4()
    };
    let kafka = dedicated(spec).await;
    let client = Client::connect(ClientConfig::new(kafka.bootstrap())).await?;
    if let Some(rounds) = options.series {
        let mut s = format!(
            "Kafka {}, {} node{}. `snapfence-bench scale --series {rounds}`: median takeover of {rounds} \
             interleaved runs per variant, [range].\n\n\
             | partitions | member B | takeover (join + all recovered) | sockets to the brokers |\n\
             |---:|---|---:|---:|\n",
            kafka.version(),
            options.nodes,
            if options.nodes == 1 { "" } else { "s" },
        );
        for &n in &options.partitions {
            eprintln!("== takeover series of {n} partition(s)");
            let rows = takeover_series(&kafka, &client, n, rounds, &options.connections).await?;
            for (variant, mut times, sockets) in rows {
                times.sort_by(f64::total_cmp);
                let _ = writeln!(
                    s,
                    "| {n} | {variant} | {:.0} ms [{:.0}-{:.0}] | {sockets} |",
                    times[times.len() / 2],
                    times[0],
                    times[times.len() - 1],
                );
            }
        }
        return Ok(s);
    }
    let mut takeovers = Vec::new();
    for &n in &options.partitions {
        eprintln!("== takeover of {n} partition(s)");
        takeovers.extend(takeover_rows(&kafka, &client, n).await?);
    }
    let mut recoveries = Vec::new();
    for &keys in &options.keys {
        eprintln!("== recovery of {keys} keys");
        recoveries.push(recovery_row(&kafka, &client, keys).await?);
    }
    if let Some(path) = &options.svg {
        std::fs::write(path, svg(&takeovers, &recoveries))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(markdown(
        kafka.version(),
        options.nodes,
        &takeovers,
        &recoveries,
    ))
}

fn flow_config(input: &str, snapshots: &str, group: &str, prefix: &str) -> FlowConfig {
    let mut g = GroupConfig::new(group);
    g.session_timeout = Duration::from_secs(30);
    g.max_poll_interval = Duration::from_secs(300);
    let mut consumer = GroupConsumerConfig::new(g);
    consumer.reader.reset = OffsetReset::Earliest;
    let mut s = SnapshotConfig::new(snapshots, prefix);
    s.recovery_stall_timeout = Some(Duration::from_secs(120));
    let mut c = FlowConfig::new(consumer, input, s);
    // The wave is run by hand; nothing periodic interferes with the timings.
    c.persist_every = Duration::from_secs(3600);
    c.commit_offsets_interval = Duration::from_secs(3600);
    c.partition_client_ids = false;
    c.max_concurrent_partitions = 64;
    c
}

/// Polls until the flow holds `n` partitions; returns the time since `began` and the events the polls
/// folded (the poll that completes an acquisition goes on to fetch).
async fn hold_all(
    flow: &mut Flow<Counter>,
    n: usize,
    began: Instant,
) -> Result<(f64, usize), Error> {
    let mut folded = 0;
    while flow.partitions().len() < n {
        if began.elapsed() > HOLD_DEADLINE {
            return Err(format!(
                "held {} of {n} partitions after {HOLD_DEADLINE:?}",
                flow.partitions().len()
            )
            .into());
        }
        folded += flow.poll_once(Duration::from_millis(50)).await?;
    }
    Ok((ms(began.elapsed()), folded))
}

async fn takeover_rows(
    kafka: &KafkaCluster,
    client: &Client,
    n: usize,
) -> Result<Vec<Takeover>, Error> {
    let partitions = i32::try_from(n)?;
    let input = unique("scale-input");
    snapfence::admin::create_topic(client, &input, partitions, -1, &[]).await?;
    ready(client, &input, partitions).await?;
    fill_input(client, &input, partitions).await?;
    let events = n * KEYS_PER_PARTITION;

    let mut rows = Vec::new();
    let variants: &[&'static str] = if n == 64 {
        &[
            "",
            "one acquisition at a time",
            "a connection set per partition",
        ]
    } else {
        &[""]
    };
    for (i, &variant) in variants.iter().enumerate() {
        // Each variant folds the same input from scratch into a snapshot topic of its own.
        let snapshots = snapshot_topic(client, partitions).await?;
        let group = unique("scale-group");
        let prefix = unique("scale-txn");
        let config = || flow_config(&input, &snapshots, &group, &prefix);

        // A: fresh acquisition, fold, one persist wave, close.
        let began = Instant::now();
        let a_client = Client::connect(ClientConfig::new(kafka.bootstrap())).await?;
        let mut a = Flow::start(a_client, config(), Counter).await?;
        let (fresh_ms, mut folded) = hold_all(&mut a, n, began).await?;
        let fold_began = Instant::now();
        while folded < events {
            if fold_began.elapsed() > HOLD_DEADLINE {
                return Err(format!("folded {folded} of {events} events").into());
            }
            folded += a.poll_once(Duration::from_millis(50)).await?;
        }
        let wave = Instant::now();
        a.persist().await?;
        let wave_ms = ms(wave.elapsed());
        a.close().await?;

        // B: the takeover.
        let mut config = config();
        match variant {
            "one acquisition at a time" => config.max_concurrent_partitions = 1,
            "a connection set per partition" => config.partition_client_ids = true,
            _ => {}
        }
        let began = Instant::now();
        let b_client = Client::connect(ClientConfig::new(kafka.bootstrap())).await?;
        let mut b = Flow::start(b_client, config, Counter).await?;
        let (takeover_ms, _) = hold_all(&mut b, n, began).await?;
        let sockets = broker_sockets(kafka);
        b.close().await?;
        // C: the same takeover in a process of its own, for what each held partition costs in memory
        // (in this process A's and B's freed memory is reused, and hides it).
        let rss_per_partition_kib = if i == 0 {
            Some(held_rss_per_partition(
                kafka, &input, &snapshots, &group, &prefix, n,
            )?)
        } else {
            None
        };
        eprintln!(
            "   {n} partitions{}: fresh {fresh_ms:.0} ms, wave {wave_ms:.0} ms, takeover {takeover_ms:.0} ms, {sockets} sockets",
            if variant.is_empty() { String::new() } else { format!(" ({variant})") }
        );
        rows.push(Takeover {
            partitions: n,
            variant,
            fresh_ms: (i == 0).then_some(fresh_ms),
            wave_ms: (i == 0).then_some(wave_ms),
            takeover_ms,
            sockets,
            rss_per_partition_kib,
        });
    }
    Ok(rows)
}

/// A fresh compacted snapshot topic of `partitions` partitions, every one online.
async fn snapshot_topic(client: &Client, partitions: i32) -> Result<String, Error> {
    let snapshots = unique("scale-snapshots");
    snapfence::admin::create_topic(
        client,
        &snapshots,
        partitions,
        -1,
        &[("cleanup.policy", "compact")],
    )
    .await?;
    ready(client, &snapshots, partitions).await?;
    Ok(snapshots)
}

/// Writes `KEYS_PER_PARTITION` events to each of `input`'s `partitions`.
async fn fill_input(client: &Client, input: &str, partitions: i32) -> Result<(), Error> {
    let producer = Producer::new(client.clone(), ProducerConfig::default()).await?;
    let mut deliveries = Vec::new();
    for p in 0..partitions {
        for k in 0..KEYS_PER_PARTITION {
            let key = Bytes::from(format!("p{p}-k{k}"));
            let value = Bytes::from(format!("p{p}-k{k}-event"));
            let record = ProducerRecord::new(input, Some(value))
                .key(key)
                .partition(p);
            deliveries.push(producer.send(record).await?);
        }
    }
    for d in deliveries {
        d.await?;
    }
    producer.close().await;
    Ok(())
}

/// The takeover series (see the module docs): one variant per `connections` setting and one with a
/// connection set per partition; per variant its takeover times and the sockets of its last run.
async fn takeover_series(
    kafka: &KafkaCluster,
    client: &Client,
    n: usize,
    rounds: usize,
    connections: &[usize],
) -> Result<Vec<(String, Vec<f64>, usize)>, Error> {
    let partitions = i32::try_from(n)?;
    let input = unique("scale-input");
    snapfence::admin::create_topic(client, &input, partitions, -1, &[]).await?;
    ready(client, &input, partitions).await?;
    fill_input(client, &input, partitions).await?;
    let snapshots = snapshot_topic(client, partitions).await?;
    let group = unique("scale-group");
    let prefix = unique("scale-txn");
    let config = || flow_config(&input, &snapshots, &group, &prefix);
    // A: fold everything and persist it once; every takeover after recovers the same snapshots.
    let began = Instant::now();
    let mut a = Flow::start(client.clone(), config(), Counter).await?;
    let (_, mut folded) = hold_all(&mut a, n, began).await?;
    while folded < n * KEYS_PER_PARTITION {
        if began.elapsed() > HOLD_DEADLINE {
            return Err(format!("folded {folded} events").into());
        }
        folded += a.poll_once(Duration::from_millis(50)).await?;
    }
    a.persist().await?;
    a.close().await?;

    // (label, connections per broker, a connection set per partition)
    let mut variants: Vec<(String, usize, bool)> = connections
        .iter()
        .map(|&c| {
            let label = format!("{c} connection{} per broker", if c == 1 { "" } else { "s" });
            (label, c, false)
        })
        .collect();
    variants.push(("a connection set per partition".into(), 1, true));
    let mut times = vec![Vec::new(); variants.len()];
    let mut sockets = vec![0; variants.len()];
    for round in 0..rounds {
        for k in 0..variants.len() {
            let i = (round + k) % variants.len();
            let (label, conns, per_partition) = &variants[i];
            let mut config = config();
            config.partition_client_ids = *per_partition;
            let began = Instant::now();
            let b_client = Client::connect(ClientConfig {
                connections_per_broker: *conns,
                ..ClientConfig::new(kafka.bootstrap())
            })
            .await?;
            let mut b = Flow::start(b_client, config, Counter).await?;
            let (took, _) = hold_all(&mut b, n, began).await?;
            sockets[i] = broker_sockets(kafka);
            b.close().await?;
            eprintln!(
                "   {n} partitions, {label}: takeover {took:.0} ms, {} sockets",
                sockets[i]
            );
            times[i].push(took);
        }
    }
    Ok(variants
        .into_iter()
        .zip(times)
        .zip(sockets)
        .map(|(((label, _, _), t), s)| (label, t, s))
        .collect())
}

/// Runs member C (`snapfence-bench scale-hold`) and returns its resident set's growth from connected
/// to holding all `n` partitions, per partition.
fn held_rss_per_partition(
    kafka: &KafkaCluster,
    input: &str,
    snapshots: &str,
    group: &str,
    prefix: &str,
    n: usize,
) -> Result<f64, Error> {
    let exe = std::env::current_exe()?;
    let output = Command::new(exe)
        .args([
            "scale-hold",
            &kafka.bootstrap(),
            input,
            snapshots,
            group,
            prefix,
        ])
        .arg(n.to_string())
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let field = |name: &str| -> Option<f64> {
        let line = stdout.lines().rev().find_map(|l| l.strip_prefix("HOLD "))?;
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))?
            .parse()
            .ok()
    };
    let (Some(before), Some(after), Some(took)) =
        (field("before_kib"), field("after_kib"), field("ms"))
    else {
        return Err(format!(
            "the scale-hold child printed no result: {}",
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    };
    let per = (after - before) / n as f64;
    eprintln!(
        "   {n} partitions in a process of its own: {took:.0} ms, RSS {before:.0} -> {after:.0} KiB, {per:.1} KiB per partition"
    );
    Ok(per)
}

/// `snapfence-bench scale-hold BOOTSTRAP INPUT SNAPSHOTS GROUP PREFIX N`: member C. Connects, reads its
/// resident set, takes all N partitions over, reads it again, and prints
/// `HOLD ms=.. before_kib=.. after_kib=..`.
pub fn hold_main(args: &[String]) -> i32 {
    let [bootstrap, input, snapshots, group, prefix, n] = args else {
        eprintln!("usage: snapfence-bench scale-hold BOOTSTRAP INPUT SNAPSHOTS GROUP PREFIX N");
        return 2;
    };
    let Ok(n) = n.parse::<usize>() else {
        eprintln!("N must be a number: {n}");
        return 2;
    };
    let work = async move {
        let client = Client::connect(ClientConfig::new(bootstrap)).await?;
        client
            .metadata(&[input.as_str(), snapshots.as_str()])
            .await?;
        let before = rss_kib().ok_or("no VmRSS in /proc/self/status")?;
        let began = Instant::now();
        let mut c = Flow::start(
            client,
            flow_config(input, snapshots, group, prefix),
            Counter,
        )
        .await?;
        let (took, _) = hold_all(&mut c, n, began).await?;
        let after = rss_kib().ok_or("no VmRSS in /proc/self/status")?;
        c.close().await?;
        Ok(format!(
            "HOLD ms={took:.3} before_kib={before} after_kib={after}\n"
        ))
    };
    crate::block_on_and_write(work, None, "scale-hold")
}

/// This process's current resident set (`VmRSS`), KiB.
fn rss_kib() -> Option<u64> {
    crate::workload::status_kib("VmRSS:")
}

async fn recovery_row(
    kafka: &KafkaCluster,
    client: &Client,
    keys: usize,
) -> Result<Recovery, Error> {
    let topic = unique("scale-recovery");
    snapfence::admin::create_topic(client, &topic, 1, -1, &[("cleanup.policy", "compact")]).await?;
    crate::ours::fill(client, &topic, keys, RECOVERY_VALUE).await?;
    let key_bytes: usize = (0..keys).map(|i| crate::workload::key(i).len()).sum();
    let data_kib = ((key_bytes + keys * RECOVERY_VALUE) / 1024) as u64;
    let exe = std::env::current_exe()?;
    let output = Command::new(exe)
        .args(["peer", "recover", &kafka.bootstrap(), &topic, "1"])
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let outcome = Outcome::find(&stdout).ok_or_else(|| {
        format!(
            "the recovery child printed no result: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    })?;
    if outcome.records != keys as u64 {
        return Err(format!("recovered {} keys, wrote {keys}", outcome.records).into());
    }
    eprintln!(
        "   {keys} keys: {:.0} ms, peak RSS {:?} KiB, data {data_kib} KiB",
        outcome.ms, outcome.peak_rss_kib
    );
    Ok(Recovery {
        keys,
        data_kib,
        outcome,
    })
}

/// Waits until every partition of `topic` answers ListOffsets at its leader: a topic of a thousand
/// partitions on one node takes a while to bring every log online after CreateTopics returns.
pub(crate) async fn ready(client: &Client, topic: &str, partitions: i32) -> Result<(), Error> {
    let tps: Vec<TopicPartition> = (0..partitions)
        .map(|p| TopicPartition::new(topic, p))
        .collect();
    let began = Instant::now();
    loop {
        match list_offsets(
            client,
            &tps,
            OffsetSpec::Latest,
            IsolationLevel::ReadUncommitted,
        )
        .await
        {
            Ok(_) => return Ok(()),
            Err(e) if began.elapsed() > HOLD_DEADLINE => return Err(e.into()),
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// This process's TCP sockets connected to any of the cluster's broker ports.
fn broker_sockets(kafka: &KafkaCluster) -> usize {
    let ports: HashSet<u16> = kafka
        .node_ids()
        .into_iter()
        .filter_map(|n| kafka.node_address(n).rsplit(':').next()?.parse().ok())
        .collect();
    let mut inodes = HashSet::new();
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                let t = target.to_string_lossy();
                if let Some(inode) = t.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']')) {
                    inodes.insert(inode.to_string());
                }
            }
        }
    }
    let mut count = 0;
    for table in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let (Some(remote), Some(inode)) = (cols.get(2), cols.get(9)) else {
                continue;
            };
            let port = remote
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if port.is_some_and(|p| ports.contains(&p)) && inodes.contains(*inode) {
                count += 1;
            }
        }
    }
    count
}

fn markdown(
    version: &str,
    nodes: usize,
    takeovers: &[Takeover],
    recoveries: &[Recovery],
) -> String {
    let mut s = String::new();
    let cluster = if nodes == 3 {
        "3 nodes, replication factor 3, min.insync.replicas 2"
    } else {
        "1 node"
    };
    let _ = writeln!(s, "Kafka {version}, {cluster}. `snapfence-bench scale`.\n");
    let _ = writeln!(
        s,
        "| partitions | member B | A: fresh acquisition | A: persist wave | B: takeover (join + all recovered) | B: sockets to the broker | C (own process): RSS per held partition |"
    );
    let _ = writeln!(s, "|---:|---|---:|---:|---:|---:|---:|");
    let opt = |v: Option<f64>, unit: &str| v.map_or("-".to_string(), |v| format!("{v:.0} {unit}"));
    for t in takeovers {
        let variant = if t.variant.is_empty() {
            "defaults, shared client"
        } else {
            t.variant
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.0} ms | {} | {} |",
            t.partitions,
            variant,
            opt(t.fresh_ms, "ms"),
            opt(t.wave_ms, "ms"),
            t.takeover_ms,
            t.sockets,
            t.rss_per_partition_kib
                .map_or("-".to_string(), |k| format!("{k:.1} KiB")),
        );
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "| keys (x {RECOVERY_VALUE} B) | recovery | peak RSS | data | RSS above data |"
    );
    let _ = writeln!(s, "|---:|---:|---:|---:|---:|");
    for r in recoveries {
        let rss = r.outcome.peak_rss_kib;
        let above = rss.map(|k| k as i64 - r.data_kib as i64);
        let _ = writeln!(
            s,
            "| {} | {:.0} ms | {} | {} KiB | {} |",
            r.keys,
            r.outcome.ms,
            rss.map_or("-".into(), |k| format!("{} KiB", k)),
            r.data_kib,
            above.map_or("-".into(), |k| format!("{:.1} MiB", k as f64 / 1024.0)),
        );
    }
    s
}

/// Two log-x line plots side by side: takeover time against partitions, recovery time against keys.
fn svg(takeovers: &[Takeover], recoveries: &[Recovery]) -> String {
    let t: Vec<(f64, f64)> = takeovers
        .iter()
        .filter(|t| t.variant.is_empty())
        .map(|t| (t.partitions as f64, t.takeover_ms))
        .collect();
    let r: Vec<(f64, f64)> = recoveries
        .iter()
        .map(|r| (r.keys as f64, r.outcome.ms))
        .collect();
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="880" height="340" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="880" height="340" fill="white"/>"#);
    plot(
        &mut s,
        40.0,
        "takeover: join + all partitions recovered",
        "partitions",
        &t,
    );
    plot(&mut s, 480.0, "recovery of one partition", "keys", &r);
    let _ = writeln!(s, "</svg>");
    s
}

fn plot(s: &mut String, left: f64, title: &str, x_label: &str, points: &[(f64, f64)]) {
    let (w, h, top) = (380.0, 240.0, 40.0);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="20" text-anchor="middle" font-weight="bold">{title}</text>"#,
        left + w / 2.0
    );
    let _ = writeln!(
        s,
        r##"<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#888"/>"##
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">{x_label} (log scale)</text>"#,
        left + w / 2.0,
        top + h + 36.0
    );
    if points.is_empty() {
        return;
    }
    let lx: Vec<f64> = points.iter().map(|p| p.0.max(1.0).log10()).collect();
    let (x0, x1) = (
        lx.iter().cloned().fold(f64::MAX, f64::min),
        lx.iter().cloned().fold(f64::MIN, f64::max),
    );
    let y1 = points.iter().map(|p| p.1).fold(0.0, f64::max) * 1.1;
    let span = if x1 > x0 { x1 - x0 } else { 1.0 };
    let xy = |i: usize| {
        let x = left + 10.0 + (lx[i] - x0) / span * (w - 20.0);
        let y = top + h - points[i].1 / y1.max(1.0) * h;
        (x, y)
    };
    let path: Vec<String> = (0..points.len())
        .map(|i| {
            let (x, y) = xy(i);
            format!("{x:.1},{y:.1}")
        })
        .collect();
    let _ = writeln!(
        s,
        r##"<polyline points="{}" fill="none" stroke="#1f6fb4" stroke-width="2"/>"##,
        path.join(" ")
    );
    for (i, (x_value, y_value)) in points.iter().enumerate() {
        let (x, y) = xy(i);
        let _ = writeln!(
            s,
            r##"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="#1f6fb4"/>"##
        );
        let _ = writeln!(
            s,
            r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{y_value:.0} ms</text>"#,
            y - 8.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{x_value}</text>"#,
            top + h + 16.0
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_lists_and_reject_unknown_flags() {
        let args: Vec<String> = ["--partitions", "1,8", "--keys", "100", "--svg", "x.svg"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let o = options(&args).unwrap();
        assert_eq!(o.partitions, vec![1, 8]);
        assert_eq!(o.keys, vec![100]);
        assert_eq!(o.svg, Some(PathBuf::from("x.svg")));
        assert!(options(&["--bogus".to_string(), "1".to_string()]).is_err());
        assert!(options(&["--keys".to_string(), "x".to_string()]).is_err());
    }

    #[test]
    fn the_plot_has_one_point_per_row() {
        let t = Takeover {
            partitions: 8,
            variant: "",
            fresh_ms: Some(1.0),
            wave_ms: Some(1.0),
            takeover_ms: 100.0,
            sockets: 1,
            rss_per_partition_kib: None,
        };
        let one = Takeover {
            partitions: 1,
            takeover_ms: 50.0,
            ..t.clone()
        };
        let svg = svg(&[one, t], &[]);
        assert_eq!(svg.matches("<circle").count(), 2);
        assert!(svg.contains("100 ms"));
    }
}
