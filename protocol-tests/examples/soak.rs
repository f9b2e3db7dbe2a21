//! The soak, one command run by hand (not in CI):
//!
//! `cargo run --release -p protocol-tests --example soak -- [--minutes 130] [--sample-secs 60]
//! [--rebalance-every-mins 4] [--rate 2000] [--keys 1000] [--out DIR]`
//!
//! Three flow members fold a steady keyed input for `--minutes` on a three-node Kafka 4.4 cluster, while
//! - every `--rebalance-every-mins` a fourth member joins, and leaves cleanly half an interval later (two
//!   rebalances; the three long-lived members keep their processes, so a leak across rebalances shows
//!   in them);
//! - near 40% of the run (a quarter interval after a visitor's join) the node leading input partition 0
//!   is stopped and started again;
//! - the snapshot topic rolls a segment every 10 s and the log cleaner takes any dirty log.
//!
//! Every `--sample-secs` it samples each member process from `/proc` (resident memory, open descriptors,
//! threads, TCP connections per broker), the tasks alive on its runtime (its `tasks` line), its assignment
//! and the group's lag, and writes one CSV row per member (`samples.csv` in `--out`, default
//! `target/soak-<time>`). At the end the input stops, the members drain and stop, and the checker compares
//! the snapshot topic with a fold of everything the producer wrote. It prints (and writes to
//! `summary.txt`) the slope of each metric over the second half of the run with its bound and verdict,
//! the lag recovery after each rebalance, the cleaner's work and the checker's anomalies, draws
//! `soak.svg`, and exits 1 on any FAIL (64 for bad flags, 2 when the harness itself failed).
//!
//! Members are this same executable run as `soak member ...` (examples have no sibling binaries).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol_tests::campaign::{read_topic, removed_records, settled, tally_of_snapshot, Leg};
use protocol_tests::member::{member_main, MemberArgs, MemberProcess};
use protocol_tests::tally::{step, Tally};
use protocol_tests::{unique, KafkaCluster};
use snapfence::consumer::{committed_offsets, list_offsets, OffsetSpec, TopicPartition};
use snapfence::net::{Client, ClientConfig};
use snapfence::producer::{Producer, ProducerConfig, ProducerRecord};
use snapfence::records::IsolationLevel;

/// Input and snapshot partitions: six, so three members hold two each and a visitor takes some away.
const PARTITIONS: i32 = 6;
/// Memory bound: the fitted growth of resident memory at a fixed assignment, per hour.
const RSS_BOUND_MIB_PER_HOUR: f64 = 1.0;
/// Counts (descriptors, threads, tasks, connections): a slope this small per hour is below one extra
/// handle over a two-hour run, while a leak of one per rebalance (15 rebalances an hour at the
/// defaults) is fifteen times larger.
const COUNT_BOUND_PER_HOUR: f64 = 1.0;

#[derive(Debug, Clone)]
struct Opts {
    minutes: u64,
    sample_secs: u64,
    rebalance_every_mins: u64,
    rate: u64,
    keys: usize,
    out: PathBuf,
}

fn usage(msg: &str) -> ! {
    eprintln!(
        "soak: {msg}\nusage: soak [--minutes 130] [--sample-secs 60] [--rebalance-every-mins 4] \
         [--rate EVENTS_PER_SEC] [--keys N] [--out DIR]"
    );
    std::process::exit(64)
}

fn parse(argv: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        minutes: 130,
        sample_secs: 60,
        rebalance_every_mins: 4,
        rate: 2000,
        keys: 1000,
        out: PathBuf::new(),
    };
    let mut out = None;
    let mut it = argv.iter();
    while let Some(a) = it.next() {
        let v = it.next().ok_or_else(|| format!("{a} needs a value"))?;
        let n = || {
            v.parse::<u64>()
                .map_err(|_| format!("{a} {v}: want a whole number"))
        };
        match a.as_str() {
            "--minutes" => o.minutes = n()?,
            "--sample-secs" => o.sample_secs = n()?,
            "--rebalance-every-mins" => o.rebalance_every_mins = n()?,
            "--rate" => o.rate = n()?,
            "--keys" => o.keys = n()? as usize,
            "--out" => out = Some(PathBuf::from(v)),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if o.minutes < 2 {
        return Err("--minutes: at least 2".into());
    }
    if o.sample_secs == 0 || o.sample_secs > o.minutes * 30 {
        return Err("--sample-secs: at least 1, and small enough for two samples per half".into());
    }
    if o.rebalance_every_mins == 0 || o.rebalance_every_mins >= o.minutes {
        return Err("--rebalance-every-mins: at least 1 and less than --minutes".into());
    }
    if !(1..=50_000).contains(&o.rate) {
        return Err("--rate: 1 to 50000 events a second".into());
    }
    if !(1..=1_000_000).contains(&o.keys) {
        return Err("--keys: 1 to 1000000".into());
    }
    o.out = out.unwrap_or_else(|| {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        PathBuf::from(format!("target/soak-{secs}"))
    });
    Ok(o)
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.first().map(String::as_str) == Some("member") {
        member_main(&argv[1..]);
    }
    let opts = parse(&argv).unwrap_or_else(|e| usage(&e));
    if let Err(e) = std::fs::create_dir_all(&opts.out) {
        usage(&format!("--out {}: {e}", opts.out.display()));
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("soak: no runtime: {e}");
            std::process::exit(2);
        }
    };
    println!(
        "soak: {} min, a sample every {} s, a visitor every {} min, {} events/s over {} keys, out {}",
        opts.minutes,
        opts.sample_secs,
        opts.rebalance_every_mins,
        opts.rate,
        opts.keys,
        opts.out.display()
    );
    let kafka = match KafkaCluster::start(&Leg::Kafka44Tv2.spec()) {
        Ok(k) => Arc::new(k),
        Err(e) => {
            eprintln!("soak: cluster: {e}");
            std::process::exit(2);
        }
    };
    println!("three nodes at {}", kafka.bootstrap());
    let code = match runtime.block_on(soak(Arc::clone(&kafka), &opts)) {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) => {
            eprintln!("soak: {e}");
            2
        }
    };
    drop(runtime);
    drop(kafka);
    std::process::exit(code)
}

/// One sample of one member process.
#[derive(Debug, Clone)]
struct Sample {
    /// Seconds since the start of the run.
    t: f64,
    member: String,
    pid: u32,
    rss_kib: u64,
    fds: u64,
    threads: u64,
    tasks: Option<u64>,
    /// ESTABLISHED connections per broker node, in node order.
    conns: Vec<u64>,
    /// Lag of the partitions it holds.
    lag: i64,
    group_lag: i64,
    held: Vec<i32>,
}

/// Something the harness did to the cluster or the group.
#[derive(Debug, Clone)]
struct Event {
    t: f64,
    kind: &'static str,
    detail: String,
    /// When the group was whole again (every partition held) with its lag under the threshold.
    recovered: Option<f64>,
}

/// Everything the producer wrote, per key: the hash of the fold of its first n events at index n - 1.
type Oracle = Arc<Mutex<HashMap<Bytes, Vec<u64>>>>;

struct Soak {
    kafka: Arc<KafkaCluster>,
    client: Client,
    args: MemberArgs,
    program: PathBuf,
    input_tps: Vec<TopicPartition>,
    /// Node ids and their client ports, in node order.
    brokers: Vec<(i32, u16)>,
    members: Vec<(String, MemberProcess)>,
    visitor: Option<(String, MemberProcess)>,
    visitors: usize,
    began: Instant,
    samples: Vec<Sample>,
    events: Vec<Event>,
    csv: std::fs::File,
    oracle: Oracle,
    /// Reported committed snapshots the oracle could not judge yet (their events not acknowledged yet).
    pending: Vec<(Bytes, Tally)>,
    /// Per key the highest count any member reported committed.
    reported_max: HashMap<Bytes, u64>,
    reported: u64,
    anomalies: Vec<String>,
    notes: Vec<String>,
}

async fn soak(kafka: Arc<KafkaCluster>, o: &Opts) -> Result<bool, String> {
    let client = Client::connect(ClientConfig::new(kafka.bootstrap()))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let input = unique("soak-input");
    let snapshots = unique("soak-snap");
    snapfence::admin::create_topic(&client, &input, PARTITIONS, -1, &[])
        .await
        .map_err(|e| format!("create {input}: {e}"))?;
    // The cleaner must really run: a segment rolls every 10 s (or 1 MiB), any dirty share makes a log
    // cleanable, and tombstones and markers go 1 s after a pass saw them.
    snapfence::admin::create_topic(
        &client,
        &snapshots,
        PARTITIONS,
        -1,
        &[
            ("cleanup.policy", "compact"),
            ("segment.ms", "10000"),
            ("segment.bytes", "1048576"),
            ("min.cleanable.dirty.ratio", "0.01"),
            ("delete.retention.ms", "1000"),
            ("min.compaction.lag.ms", "0"),
        ],
    )
    .await
    .map_err(|e| format!("create {snapshots}: {e}"))?;
    let mut args = MemberArgs::new(
        &kafka.bootstrap(),
        &unique("soak-group"),
        &input,
        &snapshots,
        &unique("soak-txn"),
    );
    // The library's default policy: a commit refused across a rebalance is recovered in place (the
    // validation run under `Stop` lost a long-lived member to one within four minutes). A member that
    // still exits ends the soak.
    args.recover = true;
    let brokers = kafka
        .node_ids()
        .into_iter()
        .map(|n| {
            let addr = kafka.node_address(n);
            let port = addr
                .rsplit(':')
                .next()
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            (n, port)
        })
        .collect();
    let csv_path = o.out.join("samples.csv");
    let mut csv =
        std::fs::File::create(&csv_path).map_err(|e| format!("{}: {e}", csv_path.display()))?;
    writeln!(
        csv,
        "t_secs,member,pid,rss_kib,fds,threads,tasks,conns_total,conns_per_node,member_lag,group_lag,held"
    )
    .map_err(|e| e.to_string())?;
    let mut s = Soak {
        input_tps: (0..PARTITIONS)
            .map(|p| TopicPartition::new(input.as_str(), p))
            .collect(),
        kafka,
        client,
        args,
        // This very executable, by its inode (a rebuild during a long run replaces the path).
        program: PathBuf::from("/proc/self/exe"),
        brokers,
        members: Vec::new(),
        visitor: None,
        visitors: 0,
        began: Instant::now(),
        samples: Vec::new(),
        events: Vec::new(),
        csv,
        oracle: Arc::new(Mutex::new(HashMap::new())),
        pending: Vec::new(),
        reported_max: HashMap::new(),
        reported: 0,
        anomalies: Vec::new(),
        notes: Vec::new(),
    };
    for i in 0..3 {
        let m = s.spawn()?;
        s.members.push((format!("m{i}"), m));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let producer = tokio::spawn(produce(
        s.client.clone(),
        input.clone(),
        o.rate,
        o.keys,
        Arc::clone(&s.oracle),
        Arc::clone(&stop),
    ));
    let result = s.run(o).await;
    stop.store(true, Ordering::SeqCst);
    let produced = producer
        .await
        .map_err(|e| format!("the producer task died: {e}"))?;
    let result = result.and(produced.map(|n| {
        s.notes.push(format!("the producer wrote {n} events"));
    }));
    if let Err(e) = result {
        for (_, m) in s.members.drain(..) {
            drop(m);
        }
        return Err(e);
    }
    s.finish(o, &snapshots).await
}

impl Soak {
    fn now(&self) -> f64 {
        self.began.elapsed().as_secs_f64()
    }

    fn spawn(&self) -> Result<MemberProcess, String> {
        let mut argv = vec!["member".to_owned()];
        argv.extend(self.args.to_args());
        MemberProcess::spawn_command(&self.program, &argv).map_err(|e| format!("start member: {e}"))
    }

    fn event(&mut self, kind: &'static str, detail: String) {
        let t = self.now();
        println!("[{:7.1}s] {kind}: {detail}", t);
        self.events.push(Event {
            t,
            kind,
            detail,
            recovered: None,
        });
    }

    /// The ticks of the run: every second the group's lag (for the recovery times), every
    /// `sample_secs` a sample of each member, the visitor's joins and leaves, one leader restart.
    async fn run(&mut self, o: &Opts) -> Result<(), String> {
        let total = Duration::from_secs(o.minutes * 60);
        let every = Duration::from_secs(o.rebalance_every_mins * 60);
        // Off the visitors' grid (a join every `every`, its leave half an interval later): a quarter
        // interval after the join nearest 40% of the run, so no two events share an instant and each
        // recovery is judged on its own (at exactly 40%, a 120- or 130-minute run's restart fell on a
        // join, and the join's recovery was judged against an event at the same second).
        let grid = (total.mul_f64(0.4).as_secs_f64() / every.as_secs_f64())
            .round()
            .max(1.0);
        let restart_at = Some(every.mul_f64(grid) + every / 4)
            .filter(|at| *at < total.mul_f64(0.9))
            .unwrap_or(total.mul_f64(0.4));
        let threshold = o.rate as f64 * self.args.commit_every.as_secs_f64();
        let mut next_sample = Duration::ZERO;
        let mut next_join = every;
        let mut next_leave = None;
        let mut restart: Option<tokio::task::JoinHandle<Result<(), String>>> = None;
        let mut restarted = false;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            let elapsed = self.began.elapsed();
            if elapsed >= total {
                return Ok(());
            }
            for (name, m) in &mut self.members {
                if !m.is_running() {
                    return Err(format!(
                        "member {name} exited: {}",
                        m.log().failure.unwrap_or_default()
                    ));
                }
            }
            self.check_reported();
            let lags = match self.lags().await {
                Ok(l) => Some(l),
                Err(e) => {
                    self.notes.push(format!("lag at {:.0}s: {e}", self.now()));
                    None
                }
            };
            if let Some(lags) = &lags {
                self.track_recovery(lags, threshold, restart.is_some());
            }
            if elapsed >= next_sample {
                next_sample += Duration::from_secs(o.sample_secs);
                self.sample(lags.as_ref().map(|(_, per)| per))?;
            }
            if elapsed >= next_join && self.visitor.is_none() && elapsed + every / 2 < total {
                next_join += every;
                next_leave = Some(elapsed + every / 2);
                self.visitors += 1;
                let name = format!("v{}", self.visitors);
                let m = self.spawn()?;
                self.event("join", format!("visitor {name} (pid {}) joins", m.pid()));
                self.visitor = Some((name, m));
            }
            if next_leave.is_some_and(|at| elapsed >= at) {
                next_leave = None;
                if let Some((name, m)) = self.visitor.take() {
                    self.event("leave", format!("visitor {name} leaves (stdin closed)"));
                    let log = tokio::task::block_in_place(|| m.close(Duration::from_secs(15)));
                    self.take_committed(log.committed);
                    if !log.stopped {
                        self.anomalies.push(format!(
                            "visitor {name} did not stop cleanly: {:?}",
                            log.failure
                        ));
                    }
                }
            }
            if !restarted && elapsed >= restart_at {
                restarted = true;
                let topic = self.args.input.clone();
                self.client.invalidate_leader(&topic, 0);
                let node = self
                    .client
                    .leader(&topic, 0)
                    .await
                    .map_err(|e| format!("leader of {topic}/0: {e}"))?
                    .node;
                self.event(
                    "leader-restart",
                    format!("node {node}, leader of {topic}/0, stopped and started"),
                );
                let kafka = Arc::clone(&self.kafka);
                restart = Some(tokio::task::spawn_blocking(move || {
                    // The orderly stop hands its leaderships over first; then the same node again.
                    kafka.stop(node);
                    kafka.restart_blocking(node).map_err(|e| e.to_string())
                }));
            }
            if restart.as_ref().is_some_and(|r| r.is_finished()) {
                if let Some(r) = restart.take() {
                    r.await
                        .map_err(|e| format!("restart task: {e}"))?
                        .map_err(|e| format!("leader restart: {e}"))?;
                    println!("[{:7.1}s] the node is back", self.now());
                }
            }
        }
    }

    /// The group's lag (end offsets minus committed, summed) and per partition.
    async fn lags(&self) -> Result<(i64, BTreeMap<i32, i64>), String> {
        let ends = list_offsets(
            &self.client,
            &self.input_tps,
            OffsetSpec::Latest,
            IsolationLevel::ReadUncommitted,
        )
        .await
        .map_err(|e| format!("input ends: {e}"))?;
        let committed = committed_offsets(&self.client, &self.args.group, &self.input_tps)
            .await
            .map_err(|e| format!("committed offsets: {e}"))?;
        let per: BTreeMap<i32, i64> = self
            .input_tps
            .iter()
            .map(|tp| {
                let end = ends.get(tp).copied().unwrap_or(0);
                let at = committed.get(tp).copied().flatten().unwrap_or(0);
                (tp.partition, (end - at).max(0))
            })
            .collect();
        Ok((per.values().sum(), per))
    }

    /// Marks the open events recovered once every partition is held by exactly one live member and the
    /// lag is under `threshold` (and, for the leader restart, the node is back).
    fn track_recovery(
        &mut self,
        lags: &(i64, BTreeMap<i32, i64>),
        threshold: f64,
        restarting: bool,
    ) {
        let mut held: Vec<i32> = self
            .members
            .iter()
            .map(|(_, m)| m)
            .chain(self.visitor.as_ref().map(|(_, m)| m))
            .flat_map(|m| m.held())
            .collect();
        held.sort_unstable();
        let whole = held == (0..PARTITIONS).collect::<Vec<_>>();
        // A join has taken effect once the visitor holds something; until then the old assignment
        // still looks whole.
        let visitor_holds = self
            .visitor
            .as_ref()
            .is_some_and(|(_, m)| !m.held().is_empty());
        let now = self.now();
        if whole && (lags.0 as f64) < threshold {
            for e in &mut self.events {
                let waiting = (restarting && e.kind == "leader-restart")
                    || (e.kind == "join" && !visitor_holds);
                if e.recovered.is_none() && !waiting {
                    e.recovered = Some(now);
                }
            }
        }
    }

    fn sample(&mut self, lags: Option<&BTreeMap<i32, i64>>) -> Result<(), String> {
        let t = self.now();
        let group_lag = lags.map(|l| l.values().sum()).unwrap_or(-1);
        let mut rows = Vec::new();
        for (name, m) in self.members.iter().chain(self.visitor.iter()) {
            let pid = m.pid();
            let log = m.log();
            let Some(p) = read_proc(pid, &self.brokers) else {
                self.notes
                    .push(format!("{name}: /proc/{pid} unreadable at {t:.0}s"));
                continue;
            };
            let lag = lags
                .map(|l| log.held.iter().filter_map(|p| l.get(p)).sum())
                .unwrap_or(-1);
            rows.push(Sample {
                t,
                member: name.clone(),
                pid,
                rss_kib: p.rss_kib,
                fds: p.fds,
                threads: p.threads,
                tasks: log.tasks,
                conns: p.conns,
                lag,
                group_lag,
                held: log.held.clone(),
            });
        }
        for r in rows {
            writeln!(
                self.csv,
                "{:.1},{},{},{},{},{},{},{},{},{},{},{}",
                r.t,
                r.member,
                r.pid,
                r.rss_kib,
                r.fds,
                r.threads,
                r.tasks.map(|t| t.to_string()).unwrap_or_default(),
                r.conns.iter().sum::<u64>(),
                r.conns
                    .iter()
                    .zip(&self.brokers)
                    .map(|(c, (n, _))| format!("{n}:{c}"))
                    .collect::<Vec<_>>()
                    .join(" "),
                r.lag,
                r.group_lag,
                r.held
                    .iter()
                    .map(i32::to_string)
                    .collect::<Vec<_>>()
                    .join(" ")
            )
            .map_err(|e| format!("samples.csv: {e}"))?;
            self.samples.push(r);
        }
        let _ = self.csv.flush();
        Ok(())
    }

    /// Takes what the members reported committed since the last call and judges it against the oracle.
    fn check_reported(&mut self) {
        let taken: Vec<_> = self
            .members
            .iter()
            .chain(self.visitor.iter())
            .flat_map(|(_, m)| m.take_committed())
            .collect();
        self.take_committed(taken);
    }

    fn take_committed(&mut self, taken: Vec<(Bytes, Tally)>) {
        self.reported += taken.len() as u64;
        self.pending.extend(taken);
        let oracle = self.oracle.lock().unwrap_or_else(|p| p.into_inner());
        let mut later = Vec::new();
        for (k, t) in self.pending.drain(..) {
            let known = oracle.get(&k).map(Vec::len).unwrap_or(0) as u64;
            if t.count > known {
                // Folded before the producer saw the event acknowledged: judge it on a later tick.
                later.push((k, t));
                continue;
            }
            let max = self.reported_max.entry(k.clone()).or_default();
            *max = (*max).max(t.count);
            if t.count == 0 || oracle[&k][t.count as usize - 1] != t.hash {
                self.anomalies.push(format!(
                    "{}: a member reported committed {t:?}, which is no fold of its first {} events",
                    String::from_utf8_lossy(&k),
                    t.count
                ));
            }
        }
        self.pending = later;
    }

    /// Stops the input, lets the members drain and stop, then checks and reports.
    async fn finish(mut self, o: &Opts, snapshots: &str) -> Result<bool, String> {
        let end = self.now();
        println!("[{end:7.1}s] input stopped; draining");
        if let Some((name, m)) = self.visitor.take() {
            let log = tokio::task::block_in_place(|| m.close(Duration::from_secs(15)));
            self.take_committed(log.committed);
            self.notes
                .push(format!("visitor {name} stopped at the end"));
        }
        let until = Instant::now() + Duration::from_secs(120);
        loop {
            self.check_reported();
            match self.lags().await {
                Ok((0, _)) => break,
                Ok((lag, _)) if Instant::now() > until => {
                    self.anomalies
                        .push(format!("the group never drained: lag {lag} after 120 s"));
                    break;
                }
                Err(e) if Instant::now() > until => return Err(e),
                _ => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
        for (name, m) in std::mem::take(&mut self.members) {
            let log = tokio::task::block_in_place(|| m.close(Duration::from_secs(15)));
            let [fences, reacquired, rejoins, rebalances] = log.stats;
            self.notes.push(format!(
                "{name}: {rebalances} rebalance events, {fences} fences recovered in place, \
                 {reacquired} reacquisitions, {rejoins} rejoins"
            ));
            self.take_committed(log.committed);
            if !log.stopped {
                self.anomalies.push(format!(
                    "member {name} did not stop cleanly: {:?}",
                    log.failure
                ));
            }
        }
        // The cleaner's work on the snapshot topic, before the final read.
        let (mut removed, mut spanned) = (0i64, 0i64);
        for p in 0..PARTITIONS {
            match removed_records(&self.client, snapshots, p).await {
                Ok((r, s)) => {
                    removed += r;
                    spanned += s;
                }
                Err(e) => self
                    .notes
                    .push(format!("{snapshots}/{p} cleaner count: {e}")),
            }
        }
        settled(&self.client, snapshots, PARTITIONS).await?;
        // The campaign's first check, with the operator tool's KIP-664 finder: no transaction left open.
        for topic in [snapshots, "__consumer_offsets"] {
            match snapfence_cli::find_hanging(&self.kafka.bootstrap(), topic, 0).await {
                Ok(found) => self
                    .anomalies
                    .extend(found.into_iter().map(|h| format!("{topic}: hanging {h}"))),
                Err(e) => self.notes.push(format!("finder on {topic}: {e}")),
            }
        }
        let log = read_topic(
            &self.client,
            snapshots,
            PARTITIONS,
            IsolationLevel::ReadCommitted,
        )
        .await?;
        let snapshots_read = log.len();
        self.check_log(log);
        if !self.pending.is_empty() {
            let n = self.pending.len();
            self.anomalies.push(format!(
                "{n} reported committed snapshots fold more events than the producer wrote"
            ));
        }
        let report = self.report(o, end, removed, spanned, snapshots_read);
        print!("{}", report.0);
        let path = o.out.join("summary.txt");
        std::fs::write(&path, &report.0).map_err(|e| format!("{}: {e}", path.display()))?;
        self.write_events(&o.out)?;
        let svg = plot(&self.samples, &self.events, end);
        let path = o.out.join("soak.svg");
        std::fs::write(&path, svg).map_err(|e| format!("{}: {e}", path.display()))?;
        println!("samples, events, summary and plot in {}", o.out.display());
        Ok(report.1)
    }

    /// The checker: every snapshot in the log (read_committed, log order) must be the fold of its key's
    /// first N events, N never goes back per key, each key's last snapshot is the fold of all its events,
    /// and no key ends behind a snapshot a member reported committed.
    fn check_log(&mut self, log: Vec<(Option<Bytes>, Option<Bytes>, i64)>) {
        let oracle = self.oracle.lock().unwrap_or_else(|p| p.into_inner());
        let mut last: HashMap<Bytes, u64> = HashMap::new();
        let mut problems = Vec::new();
        for (key, value, offset) in log {
            let Some(key) = key else {
                problems.push(format!("a snapshot without a key at offset {offset}"));
                continue;
            };
            let name = String::from_utf8_lossy(&key).into_owned();
            let events = oracle.get(&key).map(Vec::as_slice).unwrap_or_default();
            let Some(t) = value.as_deref().and_then(tally_of_snapshot) else {
                problems.push(format!(
                    "{name}: a record that is no snapshot at offset {offset} (the input has no deletes)"
                ));
                continue;
            };
            let n = t.count as usize;
            if n == 0 || events.get(n - 1) != Some(&t.hash) {
                problems.push(format!(
                    "{name}: snapshot {t:?} at offset {offset} is not the fold of its first {n} of {} events",
                    events.len()
                ));
                continue;
            }
            let before = last.insert(key, t.count).unwrap_or(0);
            if t.count < before {
                problems.push(format!(
                    "{name}: snapshots went back from {before} to {} events (a stale write landed)",
                    t.count
                ));
            }
        }
        for (key, events) in oracle.iter() {
            let name = String::from_utf8_lossy(key);
            let at = last.get(key).copied().unwrap_or(0);
            if at != events.len() as u64 {
                problems.push(format!(
                    "{name}: the last snapshot folds {at} events, the input has {}",
                    events.len()
                ));
            }
            if let Some(r) = self.reported_max.get(key) {
                if *r > at {
                    problems.push(format!(
                        "{name}: a member reported {r} events committed, the log ends at {at} (lost)"
                    ));
                }
            }
        }
        drop(oracle);
        self.anomalies.extend(problems);
    }

    fn write_events(&self, out: &Path) -> Result<(), String> {
        let mut text = String::from("t_secs,kind,recovered_after_secs,detail\n");
        for e in &self.events {
            let _ = writeln!(
                text,
                "{:.1},{},{},\"{}\"",
                e.t,
                e.kind,
                e.recovered
                    .map(|r| format!("{:.1}", r - e.t))
                    .unwrap_or_default(),
                e.detail
            );
        }
        let path = out.join("events.csv");
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The summary text and whether everything passed.
    fn report(
        &self,
        o: &Opts,
        end: f64,
        removed: i64,
        spanned: i64,
        snapshots_read: usize,
    ) -> (String, bool) {
        let mut r = String::new();
        let mut ok = true;
        let mut verdict = |pass: bool| {
            ok &= pass;
            if pass {
                "PASS"
            } else {
                "FAIL"
            }
        };
        let half = end / 2.0;
        let _ = writeln!(
            r,
            "\n== soak summary: {:.1} min, {} samples, slopes over the second half (t >= {:.0} s) ==",
            end / 60.0,
            self.samples.len(),
            half
        );
        let _ = writeln!(
            r,
            "bounds: rss slope + 2 SE < {RSS_BOUND_MIB_PER_HOUR} MiB/h at the member's usual assignment; \
             counts |slope| < 2 SE or < {COUNT_BOUND_PER_HOUR}/h; lag |slope| < 2 SE or < {:.0} events/h",
            o.rate as f64 * self.args.commit_every.as_secs_f64()
        );
        for name in ["m0", "m1", "m2"] {
            let mine: Vec<&Sample> = self
                .samples
                .iter()
                .filter(|s| s.member == name && s.t >= half)
                .collect();
            // Memory at a fixed assignment: the samples where the member held what it held most often
            // in the second half (its assignment between visitors), or all of them if too few.
            let mut counts: HashMap<&Vec<i32>, usize> = HashMap::new();
            for s in &mine {
                *counts.entry(&s.held).or_default() += 1;
            }
            let usual = counts
                .into_iter()
                .max_by_key(|(_, n)| *n)
                .map(|(h, _)| h.clone());
            let fixed: Vec<&Sample> = mine
                .iter()
                .copied()
                .filter(|s| Some(&s.held) == usual.as_ref())
                .collect();
            let (rss_set, at) = if fixed.len() >= 3 {
                (fixed, format!("held {:?}", usual.unwrap_or_default()))
            } else {
                (
                    mine.clone(),
                    "all samples (too few at one assignment)".into(),
                )
            };
            let fit_of = |set: &[&Sample], f: &Metric| {
                let pts: Vec<(f64, f64)> = set
                    .iter()
                    .filter_map(|s| f(s).map(|y| (s.t / 3600.0, y)))
                    .collect();
                fit(&pts)
            };
            let rss = fit_of(&rss_set, &|s| Some(s.rss_kib as f64 / 1024.0));
            let line = |metric: &str, f: Option<Fit>, unit: &str, v: &str| match f {
                Some(f) => format!(
                    "{name} {metric:<8} slope {:>10.3} {unit}/h  SE {:>9.3}  n {:>3}  {v}\n",
                    f.slope, f.se, f.n
                ),
                None => format!("{name} {metric:<8} too few samples to fit  {v}\n"),
            };
            let pass = rss.is_some_and(|f| f.slope + 2.0 * f.se < RSS_BOUND_MIB_PER_HOUR);
            r += &line("rss", rss, "MiB", verdict(pass));
            let _ = writeln!(r, "{name}          (memory fitted at {at})");
            let counters: [(&str, &Metric); 4] = [
                ("fds", &|s| Some(s.fds as f64)),
                ("threads", &|s| Some(s.threads as f64)),
                ("tasks", &|s| s.tasks.map(|t| t as f64)),
                ("conns", &|s| Some(s.conns.iter().sum::<u64>() as f64)),
            ];
            for (metric, f) in counters {
                let fitted = fit_of(&mine, f);
                let pass = fitted.is_some_and(|f| {
                    f.slope.abs() < 2.0 * f.se || f.slope.abs() < COUNT_BOUND_PER_HOUR
                });
                r += &line(metric, fitted, "", verdict(pass));
            }
        }
        // The group's lag, once per sample time.
        let mut lag_pts: Vec<(f64, f64)> = self
            .samples
            .iter()
            .filter(|s| s.member == "m0" && s.t >= half && s.group_lag >= 0)
            .map(|s| (s.t / 3600.0, s.group_lag as f64))
            .collect();
        lag_pts.dedup_by(|a, b| a.0 == b.0);
        let threshold = o.rate as f64 * self.args.commit_every.as_secs_f64();
        let lag = fit(&lag_pts);
        let pass = lag.is_some_and(|f| f.slope.abs() < 2.0 * f.se || f.slope.abs() < threshold);
        match lag {
            Some(f) => {
                let _ = writeln!(
                    r,
                    "group lag    slope {:>10.1} events/h  SE {:>9.1}  n {:>3}  {}",
                    f.slope,
                    f.se,
                    f.n,
                    verdict(pass)
                );
            }
            None => {
                let _ = writeln!(r, "group lag    too few samples to fit  {}", verdict(pass));
            }
        }
        let _ = writeln!(
            r,
            "\nlag recovery (every partition held, lag < {threshold:.0} = rate x commit interval):"
        );
        for (i, e) in self.events.iter().enumerate() {
            // Recovered before the next event (or the end of the run).
            let next = self.events.get(i + 1).map(|n| n.t).unwrap_or(end);
            let pass = e.recovered.is_some_and(|at| at <= next);
            let _ = writeln!(
                r,
                "  {:7.1}s {:<15} {}  {}",
                e.t,
                e.kind,
                e.recovered
                    .map(|at| format!("recovered after {:5.1} s", at - e.t))
                    .unwrap_or_else(|| "never recovered    ".into()),
                verdict(pass)
            );
        }
        let pass = removed > 0;
        let _ = writeln!(
            r,
            "\ncompaction: the cleaner removed {removed} of {spanned} snapshot-topic offsets  {}",
            verdict(pass)
        );
        let _ = writeln!(
            r,
            "checker: {} events, {} snapshots read, {} reported committed, anomalies: {}  {}",
            self.oracle
                .lock()
                .map(|o| o.values().map(Vec::len).sum::<usize>())
                .unwrap_or(0),
            snapshots_read,
            self.reported,
            self.anomalies.len(),
            verdict(self.anomalies.is_empty())
        );
        for a in self.anomalies.iter().take(20) {
            let _ = writeln!(r, "  anomaly: {a}");
        }
        // Over hours a flaky lag read can note itself many times: the first ones and a count.
        for n in self.notes.iter().take(30) {
            let _ = writeln!(r, "  note: {n}");
        }
        if self.notes.len() > 30 {
            let _ = writeln!(r, "  ... and {} more notes", self.notes.len() - 30);
        }
        let _ = writeln!(r, "overall: {}", if ok { "PASS" } else { "FAIL" });
        (r, ok)
    }
}

/// One metric of a sample, where it has one (a member that has not said `tasks` yet has none).
type Metric = dyn Fn(&Sample) -> Option<f64>;
/// One plotted series of a sample.
type Series = dyn Fn(&Sample) -> f64;

/// A least-squares line: slope per hour, its standard error, the number of points.
#[derive(Debug, Clone, Copy)]
struct Fit {
    slope: f64,
    se: f64,
    n: usize,
}

/// Fits y = a + b x to `pts` (x in hours); `None` below three points or with no spread in x.
fn fit(pts: &[(f64, f64)]) -> Option<Fit> {
    let n = pts.len();
    if n < 3 {
        return None;
    }
    let nf = n as f64;
    let mx = pts.iter().map(|p| p.0).sum::<f64>() / nf;
    let my = pts.iter().map(|p| p.1).sum::<f64>() / nf;
    let sxx: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let slope = sxy / sxx;
    let ssr: f64 = pts
        .iter()
        .map(|p| (p.1 - my - slope * (p.0 - mx)).powi(2))
        .sum();
    let se = (ssr / (nf - 2.0) / sxx).sqrt();
    Some(Fit { slope, se, n })
}

/// What `/proc` says about one process.
struct Proc {
    rss_kib: u64,
    threads: u64,
    fds: u64,
    conns: Vec<u64>,
}

/// Reads a process's resident memory and threads (`status`), its open descriptors (`fd`) and, of the
/// sockets among them, the ESTABLISHED TCP connections to each broker port (`net/tcp`, `net/tcp6`: the
/// socket inode is the link between the two). `None` once the process is gone.
fn read_proc(pid: u32, brokers: &[(i32, u16)]) -> Option<Proc> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
    };
    let rss_kib = field("VmRSS:")?;
    let threads = field("Threads:")?;
    let mut fds = 0u64;
    let mut sockets = std::collections::HashSet::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.flatten() {
        fds += 1;
        if let Ok(target) = std::fs::read_link(entry.path()) {
            let t = target.to_string_lossy();
            if let Some(inode) = t.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']')) {
                sockets.insert(inode.to_owned());
            }
        }
    }
    let mut conns = vec![0u64; brokers.len()];
    for table in ["tcp", "tcp6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            if f.len() < 10 || f[3] != "01" || !sockets.contains(f[9]) {
                continue;
            }
            let port = f[2]
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if let Some(i) = brokers.iter().position(|(_, bp)| Some(*bp) == port) {
                conns[i] += 1;
            }
        }
    }
    Some(Proc {
        rss_kib,
        threads,
        fds,
        conns,
    })
}

/// The steady input: `rate` events a second to keys `k0000`.. below `keys` (a key always on partition
/// key mod partitions), values numbered in order, each acknowledged event folded into the oracle in
/// the order written. Returns how many it wrote; a failed delivery ends the soak (the oracle would not
/// know whether the event exists).
async fn produce(
    client: Client,
    input: String,
    rate: u64,
    keys: usize,
    oracle: Oracle,
    stop: Arc<AtomicBool>,
) -> Result<u64, String> {
    let producer = Producer::new(client, ProducerConfig::default())
        .await
        .map_err(|e| format!("producer: {e}"))?;
    let began = Instant::now();
    let mut sent = 0u64;
    let mut rng = protocol_tests::campaign::Rng::new(0x50a6);
    let mut tallies: HashMap<Bytes, Tally> = HashMap::new();
    while !stop.load(Ordering::SeqCst) {
        let due = (began.elapsed().as_secs_f64() * rate as f64) as u64;
        // At most a second's worth at once, so a stall does not turn into a burst.
        let n = due.saturating_sub(sent).min(rate);
        let mut burst = Vec::with_capacity(n as usize);
        for _ in 0..n {
            sent += 1;
            let k = rng.below(keys);
            let key = Bytes::from(format!("k{k:04}"));
            let value = Bytes::from(format!("e{sent}"));
            let record = ProducerRecord::new(input.as_str(), Some(value.clone()))
                .key(key.clone())
                .partition(k as i32 % PARTITIONS);
            let d = producer
                .send(record)
                .await
                .map_err(|e| format!("send: {e}"))?;
            burst.push((key, value, d));
        }
        let mut acked = Vec::with_capacity(burst.len());
        for (key, value, d) in burst {
            d.await.map_err(|e| format!("event {value:?}: {e}"))?;
            acked.push((key, value));
        }
        if !acked.is_empty() {
            let mut o = oracle.lock().unwrap_or_else(|p| p.into_inner());
            for (key, value) in acked {
                let t = step(tallies.get(&key).copied(), &value);
                tallies.insert(key.clone(), t);
                o.entry(key).or_default().push(t.hash);
            }
        }
        if due < sent + rate / 50 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    producer.close().await;
    Ok(sent)
}

/// A hand-written SVG: four panels over time (resident memory, descriptors, connections, group lag),
/// one line per member, rebalances as grey verticals and the leader restart in red.
fn plot(samples: &[Sample], events: &[Event], end: f64) -> String {
    const W: f64 = 900.0;
    const PH: f64 = 170.0;
    const LEFT: f64 = 70.0;
    const TOP: f64 = 30.0;
    let colours = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b"];
    let panels: [(&str, &Series); 4] = [
        ("resident memory (MiB)", &|s| s.rss_kib as f64 / 1024.0),
        ("open descriptors", &|s| s.fds as f64),
        ("broker connections", &|s| {
            s.conns.iter().sum::<u64>() as f64
        }),
        ("group lag (events)", &|s| s.group_lag.max(0) as f64),
    ];
    let height = TOP + panels.len() as f64 * (PH + 40.0) + 30.0;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{height}\" \
         font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{LEFT}\" y=\"18\" font-size=\"13\">snapfence soak: {:.0} min; grey: visitor joins/leaves, red: leader restart</text>\n",
        end / 60.0
    );
    let plot_w = W - LEFT - 120.0;
    let x_of = |t: f64| LEFT + t / end.max(1.0) * plot_w;
    // Members in first-seen order; visitors share one colour.
    let mut names: Vec<&str> = Vec::new();
    for s in samples {
        if !names.contains(&s.member.as_str()) {
            names.push(&s.member);
        }
    }
    for (i, (title, f)) in panels.iter().enumerate() {
        let y0 = TOP + i as f64 * (PH + 40.0) + 20.0;
        let max = samples.iter().map(f).fold(0.0f64, f64::max);
        let max = if max <= 0.0 { 1.0 } else { max * 1.1 };
        let y_of = |v: f64| y0 + PH - v / max * PH;
        let _ = writeln!(
            svg,
            "<text x=\"{LEFT}\" y=\"{}\">{title}</text>\n<rect x=\"{LEFT}\" y=\"{y0}\" width=\"{plot_w}\" \
             height=\"{PH}\" fill=\"none\" stroke=\"#888\"/>\n<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.0}</text>\n\
             <text x=\"{}\" y=\"{}\" text-anchor=\"end\">0</text>",
            y0 - 4.0,
            LEFT - 4.0,
            y0 + 10.0,
            max,
            LEFT - 4.0,
            y0 + PH
        );
        for e in events {
            let colour = if e.kind == "leader-restart" {
                "#d62728"
            } else {
                "#bbb"
            };
            let _ = writeln!(
                svg,
                "<line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{y0}\" y2=\"{}\" stroke=\"{colour}\" stroke-dasharray=\"3,3\"/>",
                y0 + PH,
                x = x_of(e.t)
            );
        }
        for (j, name) in names.iter().enumerate() {
            let colour = if name.starts_with('v') {
                colours[4]
            } else {
                colours[j.min(3)]
            };
            let pts: Vec<String> = samples
                .iter()
                .filter(|s| s.member == *name)
                .map(|s| format!("{:.1},{:.1}", x_of(s.t), y_of(f(s))))
                .collect();
            let _ = writeln!(
                svg,
                "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" points=\"{}\"/>",
                pts.join(" ")
            );
        }
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.0} min</text>",
            LEFT + plot_w,
            y0 + PH + 14.0,
            end / 60.0
        );
    }
    for (j, name) in names.iter().filter(|n| !n.starts_with('v')).enumerate() {
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\" fill=\"{}\">{name}</text>",
            W - 100.0,
            TOP + 40.0 + j as f64 * 16.0,
            colours[j.min(3)]
        );
    }
    let _ = writeln!(
        svg,
        "<text x=\"{}\" y=\"{}\" fill=\"{}\">visitors</text>\n</svg>",
        W - 100.0,
        TOP + 40.0 + 3.0 * 16.0,
        colours[4]
    );
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fit recovers a known slope and says a flat series is flat.
    #[test]
    fn the_fit_finds_a_known_slope() {
        let pts: Vec<(f64, f64)> = (0..10).map(|i| (i as f64, 3.0 + 2.0 * i as f64)).collect();
        let f = fit(&pts).unwrap();
        assert!((f.slope - 2.0).abs() < 1e-9 && f.se < 1e-9);
        assert!(fit(&pts[..2]).is_none());
    }

    /// Bad flags are refused with their name, not a panic.
    #[test]
    fn bad_flags_are_named() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert!(parse(&s(&["--minutes", "x"]))
            .unwrap_err()
            .contains("--minutes"));
        assert!(parse(&s(&["--rate"]))
            .unwrap_err()
            .contains("needs a value"));
        assert!(
            parse(&s(&["--minutes", "6", "--rebalance-every-mins", "6"]))
                .unwrap_err()
                .contains("--rebalance-every-mins")
        );
        assert!(parse(&s(&["--bogus", "1"]))
            .unwrap_err()
            .contains("unknown"));
        assert!(parse(&s(&["--minutes", "6", "--rebalance-every-mins", "2"])).is_ok());
    }
}
